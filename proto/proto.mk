# proto/: the contract — generated protobuf-c code, status table, hash, rows, frames.
$(GEN)/mapflow.pb-c.c $(GEN)/mapflow.pb-c.h: proto/mapflow.proto
	@mkdir -p $(GEN)
	@[ "$(V)" != 0 ] || echo "  PROTOC $<"
	$(Q)protoc-c --proto_path=proto --c_out=$(GEN) proto/mapflow.proto

PROTO_SRCS := proto/mf_status.c proto/mf_hash.c proto/mf_codec.c proto/mf_row.c proto/mf_frame.c \
              proto/mf_addr.c proto/mf_cudrv.c proto/mf_parse.c
PROTO_SRCS += proto/mf_session.c
# UCX's headers only (libmapflow loads UCX with dlopen, the daemon links it).
PROTO_SRCS += proto/mf_ucx_setup.c
PROTO_OBJS := $(PROTO_SRCS:%.c=$(OBJ)/%.o) $(OBJ)/mapflow.pb-c.o
PROTO_A    := $(LIB)/libmfproto.a
LIBS       += $(PROTO_A)

$(PROTO_A): $(PROTO_OBJS)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  AR    $@"
	$(Q)rm -f $@ && ar rcs $@ $^
