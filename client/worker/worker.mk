# client/worker: mapflow-worker, a small GPT on the CPU that hands its attention maps over
# through mapflowd (source / target roles). libmfworker.a (model, tokenizer, safetensors,
# hand-off hooks) is shared with the tests/unit/test_worker_*.c programs.

WORKER_SRCS := client/worker/safetensors.c client/worker/tokenizer.c client/worker/gpt.c \
               client/worker/handoff.c
WORKER_OBJS := $(WORKER_SRCS:%.c=$(OBJ)/%.o)
WORKER_A    := $(LIB)/libmfworker.a
LIBS        += $(WORKER_A)
BINS        += $(BIN)/mapflow-worker
TEST_LINK_A := $(WORKER_A) $(TEST_LINK_A)

$(WORKER_OBJS) $(OBJ)/client/worker/worker.o $(OBJ)/tests/unit/test_worker_%.o: CPPFLAGS += -Iclient/worker

$(WORKER_A): $(WORKER_OBJS)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  AR    $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(BIN)/mapflow-worker: $(OBJ)/client/worker/worker.o $(WORKER_A) $(MAPFLOW_A) $(KERNELS_A) $(PROTO_A)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) $^ -o $@ $(LDLIBS_BASE)
