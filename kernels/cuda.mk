# kernels/cuda.mk: the CUDA kernels (extract.cu, apply.cu, attn_core.cu, rows_copy.cu; API in
# mapflow_kernels_cuda.h)
# as build/lib/libmfkernels_cuda.a and a self-contained build/lib/libmfkernels_cuda.so
# (for ctypes from PyTorch scripts), and the GPU checker build/bin/tests/gpu_check.
# Everything is guarded by USE_CUDA (set by the top Makefile from CUDA=auto|0|1); CI has
# nvcc but no GPU, so it compiles all of this warning-free and runs none of it.
ifeq ($(USE_CUDA),1)

CUDA_SRCS := kernels/extract.cu kernels/apply.cu kernels/attn_core.cu kernels/rows_copy.cu
CUDA_OBJS := $(CUDA_SRCS:%.cu=$(OBJ)/%.cu.o)
KERNELS_CUDA_A  := $(LIB)/libmfkernels_cuda.a
KERNELS_CUDA_SO := $(LIB)/libmfkernels_cuda.so
CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -lcudart -Wl,-rpath,$(CUDA_HOME)/lib64
# -Werror=all-warnings: nvcc's own diagnostics fail the build, like -Werror for C.
MF_NVCC_COMMON = -Werror all-warnings -Xcompiler -Wextra \
                 -Xcompiler -Wno-missing-field-initializers -Iproto -Ikernels -I$(GEN)
MF_NVCCFLAGS = $(NVCCFLAGS) $(MF_NVCC_COMMON)
# The attention core uses wgmma / setmaxnreg, which exist only on the sm_90a target (plain
# sm_90 rejects them); this one object is built for it alone, every other for CUDA_ARCH.
$(OBJ)/kernels/attn_core.cu.o: MF_NVCCFLAGS = $(filter-out -arch=%,$(NVCCFLAGS)) \
               -gencode=arch=compute_90a,code=sm_90a $(MF_NVCC_COMMON)
# The C reference pieces the CUDA launchers call (mf_qkv_check) and the checker compares
# with; listed as objects so this does not wait for the whole reference archive.
KERNELS_REF_OBJS := $(addprefix $(OBJ)/kernels/,attention_ref.o extract_ref.o apply_ref.o)

LIBS += $(KERNELS_CUDA_A) $(KERNELS_CUDA_SO)
BINS += $(BIN)/tests/gpu_check

$(OBJ)/kernels/%.cu.o: kernels/%.cu kernels/mf_cuda_common.cuh kernels/apply_internal.cuh kernels/attn_core.cuh \
		kernels/attn_prob.cuh kernels/attn_ptx.cuh kernels/attn_persist.cuh \
		kernels/xxh3.cuh kernels/dev_cache.cuh \
		kernels/mapflow_kernels_cuda.h \
		kernels/mapflow_kernels.h proto/mf_row.h
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  NVCC  $<"
	$(Q)$(NVCC) $(MF_NVCCFLAGS) -c $< -o $@

$(KERNELS_CUDA_A): $(CUDA_OBJS)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  AR    $@"
	$(Q)rm -f $@ && ar rcs $@ $^

# The whole proto archive goes in, so ctypes users also get mf_row_decode and friends;
# mf_kernels_abi.o is the layout table client/python/mapflow/kernels.py checks.
# extract_ref.o: mf_extract_options, the option checks both extracts share.
KERNELS_SO_REF_OBJS := $(addprefix $(OBJ)/kernels/,attention_ref.o extract_ref.o mf_kernels_abi.o)
$(KERNELS_CUDA_SO): $(CUDA_OBJS) $(KERNELS_SO_REF_OBJS) $(PROTO_A)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) -shared -o $@ $(CUDA_OBJS) $(KERNELS_SO_REF_OBJS) \
		-Wl,--whole-archive $(PROTO_A) -Wl,--no-whole-archive $(CUDA_LDLIBS) $(LDLIBS_BASE) -lstdc++

$(OBJ)/tests/gpu/%.o: CPPFLAGS += -I$(CUDA_HOME)/include

$(BIN)/tests/gpu_check: $(OBJ)/tests/gpu/gpu_check.o $(KERNELS_CUDA_A) $(KERNELS_REF_OBJS) \
		$(OBJ)/kernels/synth.o $(PROTO_A)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) $^ -o $@ $(CUDA_LDLIBS) $(LDLIBS_BASE) -lstdc++

endif
