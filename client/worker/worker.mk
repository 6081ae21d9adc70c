# client/worker: mapflow-worker, a small GPT that hands its attention maps over through
# mapflowd (source / target roles), on the CPU or (built wherever nvcc exists) on a CUDA GPU.
# libmfworker.a (model, tokenizer, safetensors, hand-off hooks) is shared with the
# tests/unit/test_worker_*.c programs; the CUDA pieces (gpt_cuda.cu, handoff_cuda.c) and
# the device choice (backend.c) go into the worker binary only, so tests need no CUDA.
#
# CUDA at run time: the runtime is linked statically (libcudart_static.a) and opens the
# driver (libcuda.so) itself when asked, so the same binary starts and runs its CPU path
# on a machine with no GPU and no driver (cudaGetDeviceCount fails → --device auto = cpu).
# Matmuls are our own tensor-core kernel: no cuBLAS to find either.

WORKER_SRCS := client/worker/safetensors.c client/worker/tokenizer.c client/worker/gpt.c \
               client/worker/handoff.c
WORKER_OBJS := $(WORKER_SRCS:%.c=$(OBJ)/%.o)
WORKER_A    := $(LIB)/libmfworker.a
WORKER_BIN_OBJS := $(OBJ)/client/worker/worker.o $(OBJ)/client/worker/backend.o
WORKER_CUDA_OBJS :=
WORKER_CUDA_LIBS :=
LIBS        += $(WORKER_A)
BINS        += $(BIN)/mapflow-worker
TEST_LINK_A := $(WORKER_A) $(TEST_LINK_A)

ifeq ($(USE_CUDA),1)
WORKER_CUDA_OBJS := $(OBJ)/client/worker/gpt_cuda.cu.o $(OBJ)/client/worker/handoff_cuda.o
WORKER_CUDA_LIBS := $(KERNELS_CUDA_A)
WORKER_CUDA_LDLIBS := $(CUDA_HOME)/lib64/libcudart_static.a -ldl -lrt -lpthread -lstdc++

$(OBJ)/client/worker/backend.o: CPPFLAGS += -DMFW_HAVE_CUDA
$(OBJ)/client/worker/handoff_cuda.o: CPPFLAGS += -I$(CUDA_HOME)/include

$(OBJ)/client/worker/%.cu.o: client/worker/%.cu client/worker/gpt_cuda.h client/worker/gpt.h \
		kernels/mapflow_kernels_cuda.h kernels/mapflow_kernels.h
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  NVCC  $<"
	$(Q)$(NVCC) $(MF_NVCCFLAGS) -Iclient/worker -c $< -o $@
endif

$(WORKER_OBJS) $(WORKER_BIN_OBJS) $(WORKER_CUDA_OBJS) $(OBJ)/tests/unit/test_worker_%.o: CPPFLAGS += -Iclient/worker

$(WORKER_A): $(WORKER_OBJS)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  AR    $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(BIN)/mapflow-worker: $(WORKER_BIN_OBJS) $(WORKER_CUDA_OBJS) $(WORKER_A) $(MAPFLOW_A) \
		$(WORKER_CUDA_LIBS) $(KERNELS_A) $(PROTO_A)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) $^ -o $@ $(WORKER_CUDA_LDLIBS) $(LDLIBS_BASE)
