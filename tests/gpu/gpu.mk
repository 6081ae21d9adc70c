# tests/gpu/gpu.mk: ipc_check (tests/gpu/ipc_check.c), the GPU tier end to end through
# CUDA IPC between two processes on a real GPU, run by tests/gpu/run.sh against a
# mapflowd it starts. Built where nvcc exists (USE_CUDA, like gpu_check in
# kernels/cuda.mk, which also gives tests/gpu objects the CUDA include path); never run by
# `make test` (CI has no GPU).
ifeq ($(USE_CUDA),1)

BINS += $(BIN)/tests/ipc_check

$(BIN)/tests/ipc_check: $(OBJ)/tests/gpu/ipc_check.o $(MAPFLOW_A) $(KERNELS_CUDA_A) \
		$(KERNELS_REF_OBJS) $(OBJ)/kernels/synth.o $(PROTO_A)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) $^ -o $@ $(CUDA_LDLIBS) $(LDLIBS_BASE) -lstdc++

endif
