# bench/quality/quality.mk: the C reference kernels (mf_extract_ref, mf_apply_ref), the
# row codec and the calibration library (calibrate.h, mf_profile.h) as one shared library,
# so bench/quality/mfk.py can run the whole quality pipeline through ctypes on a machine
# without a GPU (the CPU smoke test, --backend ref) and evaluate.py can calibrate in one
# pass over the maps with several rule settings (on the GPU machine too).
QUALITY_REF_SO := $(LIB)/libmfkernels_ref.so
QUALITY_REF_OBJS := $(addprefix $(OBJ)/kernels/,attention_ref.o extract_ref.o apply_ref.o \
                      calibrate.o calibrate_out.o mf_profile.o mf_kernels_abi.o)

LIBS += $(QUALITY_REF_SO)

$(QUALITY_REF_SO): $(QUALITY_REF_OBJS) $(PROTO_A)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) -shared -o $@ $(QUALITY_REF_OBJS) -Wl,--whole-archive $(PROTO_A) \
		-Wl,--no-whole-archive $(LDLIBS_BASE)
