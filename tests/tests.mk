# tests/: cmocka unit tests (tests/unit/test_*.c, one binary each), fuzz targets
# (tests/fuzz/fuzz_*.c; their corpora replayed by a gcc-built driver in `make test`),
# and script tests (tests/integration/*.sh, tests/python/test_*.py) against a real daemon.
#
# Every fragment may append to TEST_LINK_A (archives tests link, most dependent first),
# EXTRA_LDLIBS (libraries those archives need) and TEST_SCRIPTS.

UNIT_SRCS  := $(wildcard tests/unit/test_*.c)
UNIT_BINS  := $(UNIT_SRCS:tests/unit/%.c=$(BIN)/tests/%)
FUZZ_SRCS  := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_NAMES := $(FUZZ_SRCS:tests/fuzz/%.c=%)
REPLAY_BINS := $(FUZZ_NAMES:%=$(BIN)/tests/replay_%)
TEST_SCRIPTS += $(sort $(wildcard tests/integration/test_*.sh) $(wildcard tests/python/test_*.py))

TEST_LINK_A += $(PROTO_A)
TEST_LDLIBS = $(TEST_LINK_A) $(EXTRA_LDLIBS) $(LDLIBS_BASE) -lcmocka

$(BIN)/tests/%: $(OBJ)/tests/unit/%.o $(TEST_LINK_A)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) $< -o $@ $(TEST_LDLIBS)

$(BIN)/tests/replay_%: $(OBJ)/tests/fuzz/%.o $(OBJ)/tests/fuzz/replay_main.o $(TEST_LINK_A)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) $< $(OBJ)/tests/fuzz/replay_main.o -o $@ $(TEST_LDLIBS)

TESTS += $(UNIT_BINS) $(REPLAY_BINS)

test-build: build-all $(TESTS)

test-run: test-build
	@MF_BUILD=$(BUILD) MF_BIN=$(abspath $(BIN)) PYTHON=$(PYTHON) \
	  tests/run.sh $(UNIT_BINS) $(foreach f,$(FUZZ_NAMES),replay:$(f)) $(TEST_SCRIPTS)

# AddressSanitizer + UndefinedBehaviorSanitizer in a separate build directory: the unit
# tests and corpus replays (test_client_daemon drives the ASan daemon from there too).
ASAN_MAKE = $(MAKE) --no-print-directory BUILD=build-asan SANITIZER=address,undefined CUDA=0 OPT="-O1 -g"
asan: deps
	@$(ASAN_MAKE) asan-units

asan-units: test-build
	@echo "=== unit tests again under AddressSanitizer + UBSan ($(BUILD))"
	@MF_BUILD=$(BUILD) MF_BIN=$(abspath $(BIN)) PYTHON=$(PYTHON) \
	  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  tests/run.sh $(UNIT_BINS) $(foreach f,$(FUZZ_NAMES),replay:$(f))

# libFuzzer: clang, instrumented, each target for FUZZ_SECONDS on a copy of its corpus.
FUZZ_CFLAGS := -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
               -std=c11 -D_GNU_SOURCE -I$(GEN) -Iproto -Ikernels -Iclient -Idaemon
fuzz: deps
	@$(MAKE) --no-print-directory fuzz-run

fuzz-run: $(GEN)/mapflow.pb-c.h
	@mkdir -p build-fuzz
	@set -e; for t in $(FUZZ_NAMES); do \
	  echo "  FUZZ  $$t"; \
	  clang $(FUZZ_CFLAGS) -fsanitize=fuzzer tests/fuzz/$$t.c $(FUZZ_EXTRA_SRCS) \
	    $(PROTO_SRCS) $(GEN)/mapflow.pb-c.c -o build-fuzz/$$t \
	    $(EXTRA_LDLIBS) $(LDLIBS_BASE); \
	  mkdir -p build-fuzz/corpus-$$t; cp -n tests/fuzz/corpus/$$t/* build-fuzz/corpus-$$t/ 2>/dev/null || true; \
	  ./build-fuzz/$$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	    build-fuzz/corpus-$$t tests/fuzz/corpus/$$t >build-fuzz/$$t.log 2>&1 || true; \
	  grep -E 'stat::number_of_executed_units|cov:|ERROR|SUMMARY' build-fuzz/$$t.log | tail -4; \
	  if grep -q 'ERROR: \|SUMMARY: ' build-fuzz/$$t.log; then echo "FUZZ  $$t: crash (build-fuzz/$$t.log)"; exit 1; fi; \
	done
	@$(PYTHON) tests/reliability/record.py tests/RELIABILITY.md --fuzz $(FUZZ_SECONDS) \
	  $(FUZZ_NAMES:%=build-fuzz/%.log)

$(BIN)/tests/make_seeds: $(OBJ)/tests/fuzz/make_seeds.o $(PROTO_A)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) $^ -o $@ $(LDLIBS_BASE)
