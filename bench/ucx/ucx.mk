# bench/ucx: mapflow-ucx-tool (puts, peer gets, lookups and a standalone UCX fetch client
# built on daemon/peer.c — used by tests/integration/test_ucx_*.sh) and `make bench-ucx`
# (bench/ucx/run.sh: remote get throughput and latency, 64 KiB … 64 MiB rows, beside
# ucx_perftest on the same transport; writes bench/results/ucx.md). Not in `make test`.

BENCH_UCX_OBJS := $(OBJ)/bench/ucx/ucx_tool.o

BINS += $(BIN)/mapflow-ucx-tool

$(BIN)/mapflow-ucx-tool: $(BENCH_UCX_OBJS) $(DAEMON_A) $(PROTO_A)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) $(BENCH_UCX_OBJS) -o $@ $(DAEMON_A) $(PROTO_A) \
	  $(DAEMON_LIBS) $(LDLIBS_BASE)

.PHONY: bench-ucx
bench-ucx: $(BIN)/mapflowd $(BIN)/mapflow-ucx-tool
	bench/ucx/run.sh
