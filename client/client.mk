# client/: libmapflow (build/lib/libmapflow.so.MAJOR.MINOR.PATCH + libmapflow.a, header
# client/mapflow.h) and mapflowctl. The library carries the proto/ objects inside it, so
# users link with -lmapflow only. MF_MAJOR / MF_MINOR / MF_PATCH: the top Makefile (from
# client/mapflow.h).

CLIENT_LIB_SRCS := client/channel.c client/cq.c client/calls.c client/admin.c client/gpu.c \
                   client/arena_ops.c \
                   client/transport_ucx.c client/abi.c
CLIENT_LIB_SRCS += client/channel_conn.c client/channel_call.c
CLIENT_LIB_SRCS += client/calls_put.c client/calls_get.c
CLIENT_LIB_OBJS := $(CLIENT_LIB_SRCS:%.c=$(OBJ)/%.o)
MAPFLOW_A       := $(LIB)/libmapflow.a
MAPFLOW_SO_REAL := $(LIB)/libmapflow.so.$(MF_MAJOR).$(MF_MINOR).$(MF_PATCH)
MAPFLOW_SO      := $(LIB)/libmapflow.so
MAPFLOW_LDLIBS  := -lxxhash -lprotobuf-c -lm -lpthread
MAPFLOW_HEADERS := client/mapflow.h proto/mf_status.h proto/mf_hash.h proto/mf_row.h
MAPFLOW_MAP     := $(OBJ)/client/libmapflow.map

# Only what mapflow.h marks MF_EXPORT (and the proto/ API it re-exports) is visible.
$(CLIENT_LIB_OBJS): CFLAGS += -fvisibility=hidden -DMF_BUILDING_LIBRARY

# The linker version script: the functions the installed headers declare, nothing else
# (proto/ is linked in whole and built with default visibility for the daemon, so without
# it the generated protobuf code and the frame/codec internals would be exported too).
# Made from the headers so that declaring a function is what exports it;
# tests/python/test_abi_symbols.py checks the result against `nm -D` independently.
$(MAPFLOW_MAP): $(MAPFLOW_HEADERS) client/client.mk
	@mkdir -p $(dir $@)
	$(Q){ echo 'MAPFLOW_0 {'; echo '  global:'; \
	  sed -n -E -e '/^(static|typedef|extern)[ (]/d' \
	    -e 's/^(MF_EXPORT )?([A-Za-z_][A-Za-z0-9_]* )+[*]*(mf_[a-z0-9_]+)[(].*/    \3;/p' \
	    $(MAPFLOW_HEADERS) | sort -u; \
	  echo '  local: *;'; echo '};'; } >$@.tmp && mv $@.tmp $@

$(MAPFLOW_A): $(CLIENT_LIB_OBJS) $(PROTO_OBJS)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  AR    $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(MAPFLOW_SO_REAL): $(CLIENT_LIB_OBJS) $(PROTO_A) $(MAPFLOW_MAP)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) -shared $(ALL_CFLAGS) $(LDFLAGS) -Wl,-soname,libmapflow.so.$(MF_MAJOR) \
	  -Wl,--no-undefined -Wl,--version-script=$(MAPFLOW_MAP) -o $@ $(CLIENT_LIB_OBJS) \
	  -Wl,--whole-archive $(PROTO_A) -Wl,--no-whole-archive $(MAPFLOW_LDLIBS)

# The links are remade every time (make judges a link by its target's age, so a version
# bump would otherwise leave them pointing at the old library).
.PHONY: mf-client-links
mf-client-links:
$(MAPFLOW_SO): $(MAPFLOW_SO_REAL) mf-client-links
	$(Q)ln -sfn $(notdir $<) $(LIB)/libmapflow.so.$(MF_MAJOR)
	$(Q)ln -sfn libmapflow.so.$(MF_MAJOR) $@

CTL_OBJS := $(OBJ)/client/mapflowctl.o $(OBJ)/client/ctl_io.o $(OBJ)/client/ctl_print.o \
            $(OBJ)/client/ctl_profile.o
$(BIN)/mapflowctl: $(CTL_OBJS) $(MAPFLOW_A)
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  LD    $@"
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) $(CTL_OBJS) -o $@ $(MAPFLOW_A) $(LDLIBS_BASE)

LIBS += $(MAPFLOW_A) $(MAPFLOW_SO_REAL) $(MAPFLOW_SO)
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

# ---- install: headers (self-contained: mapflow.h and the proto/ headers it includes),
# the shared library with its SONAME links, the static one, mapflow.pc, mapflowctl and
# the Python binding (with mapflow/_config.py naming LIBDIR, so it loads the installed
# library without LD_LIBRARY_PATH). DESTDIR only prefixes paths here; no installed file
# contains it.
BINDIR         ?= $(PREFIX)/bin
LIBDIR         ?= $(PREFIX)/lib
INCLUDEDIR     ?= $(PREFIX)/include
PYTHON_SITEDIR ?= $(PREFIX)/lib/python3/dist-packages
MAPFLOW_PY      := $(wildcard client/python/mapflow/*.py)

.PHONY: install-client
INSTALL_TARGETS += install-client
install-client: $(MAPFLOW_SO) $(MAPFLOW_A) $(BIN)/mapflowctl
	install -d $(DESTDIR)$(INCLUDEDIR)/mapflow $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(BINDIR)
	install -m 0644 $(MAPFLOW_HEADERS) $(DESTDIR)$(INCLUDEDIR)/mapflow/
	install -m 0755 $(MAPFLOW_SO_REAL) $(DESTDIR)$(LIBDIR)/
	ln -sf $(notdir $(MAPFLOW_SO_REAL)) $(DESTDIR)$(LIBDIR)/libmapflow.so.$(MF_MAJOR)
	ln -sf libmapflow.so.$(MF_MAJOR) $(DESTDIR)$(LIBDIR)/libmapflow.so
	install -m 0644 $(MAPFLOW_A) $(DESTDIR)$(LIBDIR)/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' -e 's|@LIBDIR@|$(LIBDIR)|' \
	  -e 's|@VERSION@|$(MF_MAJOR).$(MF_MINOR).$(MF_PATCH)|' client/mapflow.pc.in \
	  > $(DESTDIR)$(LIBDIR)/pkgconfig/mapflow.pc
	chmod 0644 $(DESTDIR)$(LIBDIR)/pkgconfig/mapflow.pc
	install -m 0755 $(BIN)/mapflowctl $(DESTDIR)$(BINDIR)/
	install -d $(DESTDIR)$(PYTHON_SITEDIR)/mapflow
	install -m 0644 $(MAPFLOW_PY) client/python/mapflow/py.typed $(DESTDIR)$(PYTHON_SITEDIR)/mapflow/
	printf '# Written by make install: where libmapflow was installed.\nLIBDIRS = ["%s"]\n' \
	  '$(LIBDIR)' >$(DESTDIR)$(PYTHON_SITEDIR)/mapflow/_config.py
	chmod 0644 $(DESTDIR)$(PYTHON_SITEDIR)/mapflow/_config.py
