# client/: libmapflow (build/lib/libmapflow.so.MAJOR.MINOR.PATCH + libmapflow.a, header
# client/mapflow.h) and mapflowctl. The library carries the proto/ objects inside it, so
# users link with -lmapflow only. Version numbers come from client/mapflow.h.

MF_VER_OF = $(shell sed -n 's/^\#define MF_VERSION_$(1) \([0-9]*\)$$/\1/p' client/mapflow.h)
MF_MAJOR := $(call MF_VER_OF,MAJOR)
MF_MINOR := $(call MF_VER_OF,MINOR)
MF_PATCH := $(call MF_VER_OF,PATCH)

CLIENT_LIB_SRCS := client/channel.c client/cq.c client/calls.c client/admin.c
CLIENT_LIB_OBJS := $(CLIENT_LIB_SRCS:%.c=$(OBJ)/%.o)
MAPFLOW_A       := $(LIB)/libmapflow.a
MAPFLOW_SO_REAL := $(LIB)/libmapflow.so.$(MF_MAJOR).$(MF_MINOR).$(MF_PATCH)
MAPFLOW_SO      := $(LIB)/libmapflow.so
MAPFLOW_LDLIBS  := -lxxhash -lprotobuf-c -lm -lpthread

# Only what mapflow.h marks MF_EXPORT (and the proto/ API it re-exports) is visible.
$(CLIENT_LIB_OBJS): CFLAGS += -fvisibility=hidden -DMF_BUILDING_LIBRARY

$(MAPFLOW_A): $(CLIENT_LIB_OBJS) $(PROTO_OBJS)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  AR    $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(MAPFLOW_SO_REAL): $(CLIENT_LIB_OBJS) $(PROTO_A)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) -shared $(ALL_CFLAGS) $(LDFLAGS) -Wl,-soname,libmapflow.so.$(MF_MAJOR) \
	  -Wl,--no-undefined -o $@ $(CLIENT_LIB_OBJS) \
	  -Wl,--whole-archive $(PROTO_A) -Wl,--no-whole-archive $(MAPFLOW_LDLIBS)

$(MAPFLOW_SO): $(MAPFLOW_SO_REAL)
	$(Q)ln -sf $(notdir $<) $(LIB)/libmapflow.so.$(MF_MAJOR)
	$(Q)ln -sf libmapflow.so.$(MF_MAJOR) $@

$(BIN)/mapflowctl: $(OBJ)/client/mapflowctl.o $(MAPFLOW_A)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) $< -o $@ $(MAPFLOW_A) $(LDLIBS_BASE)

LIBS += $(MAPFLOW_A) $(MAPFLOW_SO)
BINS += $(BIN)/mapflowctl
TEST_LINK_A := $(MAPFLOW_A) $(TEST_LINK_A)

# A daemon built with AddressSanitizer for the integration tests' leak check
# (tests/integration/test_asan_daemon.sh). Not nested inside an already sanitized build.
ifeq ($(SANITIZER)$(if $(wildcard daemon/daemon.mk),,none),)
ASAN_DAEMON := $(BUILD)/asan-daemon/bin/mapflowd
.PHONY: asan-daemon
asan-daemon: $(ASAN_DAEMON)
$(ASAN_DAEMON): $(wildcard daemon/*.c daemon/*.h proto/*.c proto/*.h) daemon/daemon.mk
	@[ "$(V)" != 0 ] || echo "  MAKE  $@ (AddressSanitizer)"
	$(Q)$(MAKE) --no-print-directory BUILD=$(BUILD)/asan-daemon SANITIZER=address CUDA=0 \
	  OPT="-O1 -g" $@ >/dev/null
TESTS += $(ASAN_DAEMON)
endif
