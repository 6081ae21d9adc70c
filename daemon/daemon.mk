# daemon/: mapflowd — config, event loop, index, host arena, SSD tier, admin, metrics.
# Everything except main.c goes into libmfdaemon.a so unit tests link the real modules.

DAEMON_SRCS := daemon/log.c daemon/config.c daemon/oalloc.c daemon/arena.c daemon/index.c \
               daemon/tier_ssd.c daemon/ticket.c daemon/store.c daemon/metrics.c \
               daemon/http.c daemon/notify.c daemon/conn.c daemon/listen.c daemon/lease.c \
               daemon/keys.c daemon/rows.c daemon/dispatch.c daemon/daemon.c daemon/admin.c \
               daemon/ucx.c daemon/peer.c daemon/peer_link.c daemon/tier_gpu.c daemon/gpu_verify_ptx.c
DAEMON_SRCS += daemon/store_ssd.c daemon/store_evict.c daemon/profiles.c
DAEMON_OBJS := $(DAEMON_SRCS:%.c=$(OBJ)/%.o)
DAEMON_A    := $(LIB)/libmfdaemon.a
DAEMON_LIBS := $(call pkg_libs,libevent libevent_pthreads rocksdb libsystemd ucx)

LIBS         += $(DAEMON_A)
BINS         += $(BIN)/mapflowd
TEST_LINK_A  := $(DAEMON_A) $(TEST_LINK_A)
EXTRA_LDLIBS += $(DAEMON_LIBS)

# libsystemd is installed here; build sd_notify support whenever pkg-config finds it.
ifneq ($(DAEMON_LIBS),)
ifneq ($(findstring -lsystemd,$(DAEMON_LIBS)),)
$(DAEMON_OBJS) $(OBJ)/daemon/main.o: CPPFLAGS += -DMF_HAVE_SYSTEMD
endif
endif
$(DAEMON_OBJS) $(OBJ)/daemon/main.o: CPPFLAGS += -DMFD_VERSION='"$(MF_VERSION)"'
# The -D above is not a file make can see: rebuild the users of MFD_VERSION on a bump.
$(OBJ)/daemon/main.o $(OBJ)/daemon/conn.o $(OBJ)/daemon/dispatch.o $(OBJ)/daemon/daemon.o: \
    client/mapflow.h

# The GPU tier's row-checksum kernels (gpu_verify.cu): PTX by nvcc where it exists, embedded
# into mapflowd by gpu_verify_ptx.c (.incbin); without nvcc rows are validated on the host.
ifeq ($(USE_CUDA),1)
VERIFY_PTX := $(OBJ)/daemon/gpu_verify.ptx
$(VERIFY_PTX): daemon/gpu_verify.cu kernels/xxh3.cuh
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  PTX   $<"
	$(Q)$(NVCC) -ptx -O3 -arch=sm_$(CUDA_ARCH) -Werror all-warnings $< -o $@
$(OBJ)/daemon/gpu_verify_ptx.o: $(VERIFY_PTX)
$(OBJ)/daemon/gpu_verify_ptx.o: CPPFLAGS += -DMFD_VERIFY_PTX='"$(abspath $(VERIFY_PTX))"'
$(OBJ)/tests/unit/test_daemon_gpu_ptx.o: CPPFLAGS += -DMFD_EXPECT_PTX
endif

$(DAEMON_A): $(DAEMON_OBJS)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  AR    $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(BIN)/mapflowd: $(OBJ)/daemon/main.o $(DAEMON_A) $(PROTO_A)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) $< -o $@ $(DAEMON_A) $(PROTO_A) $(DAEMON_LIBS) $(LDLIBS_BASE)

# make install: the daemon binary (the unit and sample config come from deploy/).
install-daemon: $(BIN)/mapflowd
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(BIN)/mapflowd $(DESTDIR)$(PREFIX)/bin/mapflowd
INSTALL_TARGETS += install-daemon
.PHONY: install-daemon
