# bench/kernels/: CPU benchmark of the reference kernels (never run by `make test`).
#   make build/bin/mapflow-bench-kernels && build/bin/mapflow-bench-kernels
BINS += $(BIN)/mapflow-bench-kernels

$(BIN)/mapflow-bench-kernels: $(OBJ)/bench/kernels/bench_kernels.o $(KERNELS_A) $(PROTO_A)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) $^ -o $@ $(LDLIBS_BASE)
