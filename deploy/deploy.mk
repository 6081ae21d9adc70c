# deploy/: the systemd unit, its sysusers.d entry and the sample mapflowd.conf that
# `make install` installs; the container image (deploy/docker) and the Kubernetes
# manifests (deploy/k8s) are used as files. The top-level `install` runs install-deploy
# (INSTALL_TARGETS).
#
#   make install [PREFIX=/usr/local] [DESTDIR=] [SYSCONFDIR=]   unit, sysusers entry, config
#
# Nothing is written outside PREFIX except for PREFIX=/usr, the distribution's own
# prefix, whose configuration lives in /etc: SYSCONFDIR is /etc there and PREFIX/etc
# otherwise (/usr/local/etc/mapflowd.conf by default). The unit's ExecStart names both
# the binary and that config file.
#
# The sample config is `mapflowd --print-config` with the socket and data_dir lines set to
# the directories the unit creates (RuntimeDirectory=, StateDirectory=). DESTDIR is only
# a path prefix at install time, never written into a file.

DEPLOY_CONF    := $(BUILD)/deploy/mapflowd.conf
DEPLOY_SOCKET  := /run/mapflowd/mapflowd.sock
DEPLOY_DATADIR := /var/lib/mapflowd
BINS += $(DEPLOY_CONF)

# systemd's own directories live under /lib (merged /usr) for PREFIX=/usr, else PREFIX/lib.
ifeq ($(PREFIX),/usr)
DEPLOY_SYSTEMD_ROOT := /lib
else
DEPLOY_SYSTEMD_ROOT := $(PREFIX)/lib
endif
UNITDIR     ?= $(DEPLOY_SYSTEMD_ROOT)/systemd/system
SYSUSERSDIR ?= $(DEPLOY_SYSTEMD_ROOT)/sysusers.d
ifeq ($(PREFIX),/usr)
SYSCONFDIR  ?= /etc
else
SYSCONFDIR  ?= $(PREFIX)/etc
endif

$(DEPLOY_CONF): $(BIN)/mapflowd deploy/deploy.mk
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  GEN   $@"
	$(Q)$(BIN)/mapflowd --print-config > $@.tmp && \
	  sed -i -e 's|^#\{0,1\}socket .*|socket $(DEPLOY_SOCKET)|' \
	         -e 's|^#\{0,1\}data_dir .*|data_dir $(DEPLOY_DATADIR)|' $@.tmp && \
	  grep -qx 'socket $(DEPLOY_SOCKET)' $@.tmp && grep -qx 'data_dir $(DEPLOY_DATADIR)' $@.tmp && \
	  mv $@.tmp $@ || { rm -f $@.tmp; echo "$@: mapflowd --print-config gave no socket/data_dir line" >&2; exit 1; }

.PHONY: install-deploy
INSTALL_TARGETS += install-deploy

# An existing SYSCONFDIR/mapflowd.conf is the admin's: never overwritten.
install-deploy: $(DEPLOY_CONF)
	install -d $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR)
	sed -e 's|/usr/local/bin/mapflowd|$(PREFIX)/bin/mapflowd|' \
	    -e 's|-c /etc/mapflowd.conf|-c $(SYSCONFDIR)/mapflowd.conf|' deploy/systemd/mapflowd.service \
	  > $(DESTDIR)$(UNITDIR)/mapflowd.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/mapflowd.service
	install -m 0644 deploy/systemd/mapflowd.sysusers $(DESTDIR)$(SYSUSERSDIR)/mapflowd.conf
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/mapflowd.conf ]; then \
	  echo "install-deploy: keeping existing $(DESTDIR)$(SYSCONFDIR)/mapflowd.conf"; \
	else \
	  echo "install -D -m 0644 $(DEPLOY_CONF) $(DESTDIR)$(SYSCONFDIR)/mapflowd.conf"; \
	  install -D -m 0644 $(DEPLOY_CONF) $(DESTDIR)$(SYSCONFDIR)/mapflowd.conf; \
	fi
