# bench/daemon: mapflow-bench-daemon (mapflowd against memcpy, Redis and direct RocksDB on
# the same map rows) and `make bench-daemon` (bench/daemon/run.sh: starts its own daemon
# and redis-server, writes bench/results/daemon.md). Not part of `make test`: it is timed.
# Redis needs libhiredis-dev (and redis-server to run); without it the Redis rows are skipped.

BENCH_DAEMON_SRCS := bench/daemon/bench_daemon.c bench/daemon/bench_util.c \
                     bench/daemon/bench_rows.c bench/daemon/bench_mapflow.c \
                     bench/daemon/bench_baselines.c
BENCH_DAEMON_OBJS := $(BENCH_DAEMON_SRCS:%.c=$(OBJ)/%.o)
BENCH_DAEMON_HIREDIS := $(call pkg_libs,hiredis)
BENCH_DAEMON_LIBS := $(call pkg_libs,rocksdb) $(BENCH_DAEMON_HIREDIS)

ifneq ($(BENCH_DAEMON_HIREDIS),)
$(OBJ)/bench/daemon/bench_baselines.o: CPPFLAGS += -DMFB_HAVE_HIREDIS $(call pkg_cflags,hiredis)
endif

BINS += $(BIN)/mapflow-bench-daemon

$(BIN)/mapflow-bench-daemon: $(BENCH_DAEMON_OBJS) $(MAPFLOW_A)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) $(BENCH_DAEMON_OBJS) -o $@ $(MAPFLOW_A) \
	  $(BENCH_DAEMON_LIBS) $(LDLIBS_BASE)

.PHONY: bench-daemon bench-daemon-quick
bench-daemon:
	bench/daemon/run.sh

bench-daemon-quick:
	bench/daemon/run.sh --quick
