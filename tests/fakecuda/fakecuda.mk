# tests/fakecuda: the fake CUDA driver (libfakecuda.so) that CPU tests load through
# MF_CUDA_DRIVER, so the daemon's and libmapflow's GPU paths run without a GPU.
# Tests find it at $(LIB)/tests/libfakecuda.so ($MF_BUILD/lib/tests, or ../../lib/tests
# from a test binary in $(BIN)/tests).

FAKECUDA_SO := $(LIB)/tests/libfakecuda.so

$(FAKECUDA_SO): $(OBJ)/tests/fakecuda/fakecuda.o
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) -shared -Wl,-soname,libfakecuda.so $< -o $@ -lpthread

TESTS += $(FAKECUDA_SO)
# GPU-tier tests load it at run time: build it before them.
$(filter $(BIN)/tests/test_daemon_gpu% $(BIN)/tests/test_client_gpu%,$(UNIT_BINS)): | $(FAKECUDA_SO)
