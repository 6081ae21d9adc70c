# tests/reliability: the reliability driver (rel_tool), the libFuzzer targets' extra
# sources, and `make soak` (long crash / load / fault runs, the TSan daemon).
#
#   make soak            crash 100 kills, load 256 clients × 60 s (+ ASan, TSan daemons),
#                        every fault, security, fuzz 120 s per target. Bounded: < 10 min.
#   make tsan-daemon     build-tsan/bin/mapflowd (SANITIZER=thread)
#
# rel_tool links only proto (no client/, no daemon archive): it speaks the wire protocol.

REL_SRCS := tests/reliability/rel_tool.c tests/reliability/rel_wire.c \
            tests/reliability/rel_crash.c tests/reliability/rel_load.c \
            tests/reliability/rel_faults.c tests/reliability/rel_security.c \
            tests/reliability/rel_storage.c tests/reliability/rel_admin.c
REL_OBJS := $(REL_SRCS:%.c=$(OBJ)/%.o)
REL_TOOL := $(BIN)/tests/rel_tool

$(REL_TOOL): $(REL_OBJS) $(PROTO_A)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) $(REL_OBJS) -o $@ $(PROTO_A) $(LDLIBS_BASE)

# The wire helpers also serve the stateful fuzz target (fuzz_daemon) and its replay.
REL_A := $(LIB)/librelwire.a
$(REL_A): $(OBJ)/tests/reliability/rel_wire.o
	@mkdir -p $(dir $@)
	$(Q)rm -f $@ && ar rcs $@ $^
TEST_LINK_A := $(REL_A) $(TEST_LINK_A)
$(UNIT_BINS) $(REPLAY_BINS): $(REL_A)
$(OBJ)/tests/fuzz/fuzz_daemon.o: CPPFLAGS += -Itests/reliability
$(OBJ)/tests/unit/test_daemon_lookup.o: CPPFLAGS += -Itests/reliability

TESTS += $(REL_TOOL)
test-build: $(REL_TOOL) $(BIN)/mapflowd

# Fuzz targets that reach the daemon (config, stateful request handler) and profiles.
FUZZ_EXTRA_SRCS += $(DAEMON_SRCS) kernels/mf_profile.c tests/reliability/rel_wire.c
FUZZ_CFLAGS += -DMFD_VERSION='"fuzz"' -Ikernels -Itests/reliability

TSAN_DAEMON := build-tsan/bin/mapflowd
.PHONY: soak tsan-daemon
tsan-daemon:
	@$(MAKE) --no-print-directory BUILD=build-tsan SANITIZER=thread CUDA=0 OPT="-O1 -g" \
	  build-tsan/bin/mapflowd

SOAK_SCRIPTS := tests/integration/test_rel_crash.sh tests/integration/test_rel_load.sh \
                tests/integration/test_rel_faults.sh tests/integration/test_rel_security.sh \
                tests/integration/test_rel_storage.sh
soak: deps
	@$(MAKE) --no-print-directory $(REL_TOOL) $(BIN)/mapflowd asan-daemon tsan-daemon
	@MF_SOAK=1 MF_BUILD=$(BUILD) MF_BIN=$(abspath $(BIN)) PYTHON=$(PYTHON) \
	  MF_TSAN_DAEMON=$(abspath $(TSAN_DAEMON)) MF_TEST_TIMEOUT=600 \
	  tests/run.sh $(SOAK_SCRIPTS)
	@$(MAKE) --no-print-directory fuzz-run FUZZ_SECONDS=$${SOAK_FUZZ_SECONDS:-60}
