# kernels/: C reference kernels (extract, apply, dense attention, Top-P), the .npy reader,
# mapping profiles and calibration (libmfkernels.a), and the tools mapflow-calibrate and
# mapflow-synth. CUDA kernels (kernels/*.cu) join this archive where nvcc exists.

KERNELS_SRCS := kernels/attention_ref.c kernels/extract_ref.c kernels/apply_ref.c \
                kernels/synth.c kernels/npy.c kernels/mf_profile.c kernels/calibrate.c \
                kernels/calibrate_out.c \
                kernels/mf_kernels_abi.c
KERNELS_OBJS := $(KERNELS_SRCS:%.c=$(OBJ)/%.o)
KERNELS_A    := $(LIB)/libmfkernels.a
LIBS         += $(KERNELS_A)
TEST_LINK_A  := $(KERNELS_A) $(TEST_LINK_A)

$(KERNELS_A): $(KERNELS_OBJS)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  AR    $@"
	$(Q)rm -f $@ && ar rcs $@ $^

KERNELS_TOOLS := $(BIN)/mapflow-calibrate $(BIN)/mapflow-synth
BINS += $(KERNELS_TOOLS)

$(BIN)/mapflow-calibrate: $(OBJ)/kernels/calibrate_main.o $(KERNELS_A) $(PROTO_A)
$(BIN)/mapflow-synth: $(OBJ)/kernels/synth_main.o $(KERNELS_A) $(PROTO_A)

$(KERNELS_TOOLS):
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) $^ -o $@ $(LDLIBS_BASE)

# The tool tests run the real binaries (found through MF_BIN, or build/bin).
$(BIN)/tests/test_calibrate_tool: $(BIN)/mapflow-calibrate
$(BIN)/tests/test_kernels_synth: $(BIN)/mapflow-synth

# make install: the calibration and synthetic-row tools.
install-kernels-tools: $(KERNELS_TOOLS)
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(KERNELS_TOOLS) $(DESTDIR)$(PREFIX)/bin/
INSTALL_TARGETS += install-kernels-tools
.PHONY: install-kernels-tools

# make install: the kernel libraries (the C reference; the CUDA one where nvcc built it) and
# their headers, so mapflow.kernels (client/python: it searches the install libdirs) and C
# callers find them after an install as they find libmapflow.
KERNELS_INSTALL_SO := $(LIB)/libmfkernels_ref.so $(if $(filter 1,$(USE_CUDA)),$(LIB)/libmfkernels_cuda.so)
KERNELS_INSTALL_H  := kernels/mapflow_kernels.h $(if $(filter 1,$(USE_CUDA)),kernels/mapflow_kernels_cuda.h)
install-kernels-libs: $(KERNELS_INSTALL_SO)
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR)/mapflow
	install -m 0755 $(KERNELS_INSTALL_SO) $(DESTDIR)$(LIBDIR)/
	install -m 0644 $(KERNELS_INSTALL_H) $(DESTDIR)$(INCLUDEDIR)/mapflow/
INSTALL_TARGETS += install-kernels-libs
.PHONY: install-kernels-libs
