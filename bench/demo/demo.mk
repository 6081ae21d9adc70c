# bench/demo: the synthetic-pair workers of `make demo` (its kernel-level part) and the script
# that runs the hand-off (its first part uses client/worker/mapflow-worker on bench/models).
DEMO_BINS := $(BIN)/mapflow-demo-source $(BIN)/mapflow-demo-target
BINS += $(DEMO_BINS)
DEMO_LINK = $(OBJ)/bench/demo/demo_model.o $(MAPFLOW_A) $(KERNELS_A) $(PROTO_A)

$(BIN)/mapflow-demo-%: $(OBJ)/bench/demo/demo_%.o $(OBJ)/bench/demo/demo_model.o $(MAPFLOW_A) $(KERNELS_A) $(PROTO_A)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) $< $(DEMO_LINK) -o $@ $(LDLIBS_BASE)

demo-run: build-all
	@MF_BIN=$(abspath $(BIN)) bench/demo/demo.sh
