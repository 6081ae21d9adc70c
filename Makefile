# MapFlow — one GNU Makefile; each folder adds its rules through a fragment
# (`<folder>/<name>.mk`) included below, never through recursive make into folders.
#
#   make            build everything (CPU; CUDA kernels too where nvcc exists)
#   make test       install missing Debian packages, build, run every test
#   make demo       install missing Debian packages, build, run a real hand-off
#   make asan       tests again under AddressSanitizer + UBSan (build-asan/)
#   make fuzz       libFuzzer targets with clang, FUZZ_SECONDS each
#   make install    PREFIX=/usr/local DESTDIR=
#   make version    print the version (from client/mapflow.h)

PREFIX     ?= /usr/local
DESTDIR    ?=
BUILD      ?= build
CC         ?= cc
PYTHON     ?= /usr/bin/python3
OPT        ?= -O2 -g
SANITIZER  ?=
CUDA       ?= auto
CUDA_HOME  ?= /usr/local/cuda
CUDA_ARCH  ?= 90
FUZZ_SECONDS ?= 60
V          ?= 0

ifeq ($(V),0)
Q := @
else
Q :=
endif

# --- the version: one place, client/mapflow.h's MF_VERSION_* (the public header must carry
# it for C users). mapflowd, mapflowctl (through mf_version()), libmapflow's file name and
# SONAME, mapflow.pc, mapflowd_build_info and the image tag all take it from here;
# tests/integration/test_version.sh checks that they agree.
MF_VER_OF = $(shell sed -n 's/^\#define MF_VERSION_$(1) \([0-9]*\)$$/\1/p' client/mapflow.h)
MF_MAJOR   := $(call MF_VER_OF,MAJOR)
MF_MINOR   := $(call MF_VER_OF,MINOR)
MF_PATCH   := $(call MF_VER_OF,PATCH)
MF_VERSION := $(MF_MAJOR).$(MF_MINOR).$(MF_PATCH)
ifneq ($(shell sed -n 's/^\#define MF_VERSION_STRING "\(.*\)"$$/\1/p' client/mapflow.h),$(MF_VERSION))
$(error client/mapflow.h: MF_VERSION_STRING is not MAJOR.MINOR.PATCH ($(MF_VERSION)))
endif

# `make` alone builds (the version rule below would otherwise be the first goal).
.DEFAULT_GOAL := all

.PHONY: version
version:
	@echo $(MF_VERSION)

# --- Debian packages -------------------------------------------------------------
DEB_PKGS := libucx-dev libevent-dev libprotobuf-c-dev protobuf-c-compiler \
            librocksdb-dev libxxhash-dev libcmocka-dev libsystemd-dev pkg-config \
            clang python3 python3-numpy python3-xxhash python3-yaml python3-venv python3-pip \
            python3-setuptools python3-wheel procps libhiredis-dev redis-server ucx-utils iproute2 \
            prometheus
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# --- toolchain flags ---------------------------------------------------------------
PKGS := libevent libevent_pthreads libprotobuf-c libxxhash ucx rocksdb libsystemd cmocka
pkg_cflags = $(shell pkg-config --cflags $(1) 2>/dev/null)
pkg_libs   = $(shell pkg-config --libs $(1) 2>/dev/null)

WARN     := -Wall -Wextra -Werror -Wno-missing-field-initializers
CFLAGS   ?=
CPPFLAGS += -I$(BUILD)/gen -Iproto -Ikernels -Iclient -Idaemon -D_GNU_SOURCE
# popcnt is in every x86-64 CPU since 2008 (x86-64-v2); row walks count head bits a lot.
ARCH_CFLAGS := $(if $(filter x86_64,$(shell uname -m)),-mpopcnt)
BASE_CFLAGS := -std=c11 $(WARN) $(OPT) $(ARCH_CFLAGS) -fPIC -MMD -MP -pthread
LDLIBS_BASE := -lxxhash -lprotobuf-c -lm -lpthread

ifneq ($(SANITIZER),)
BASE_CFLAGS += -fsanitize=$(SANITIZER) -fno-sanitize-recover=all -fno-omit-frame-pointer
LDFLAGS     += -fsanitize=$(SANITIZER)
endif

ALL_CFLAGS = $(BASE_CFLAGS) $(CFLAGS)

HAVE_NVCC := $(shell [ -x $(CUDA_HOME)/bin/nvcc ] && echo 1)
ifeq ($(CUDA),auto)
USE_CUDA := $(HAVE_NVCC)
else ifeq ($(CUDA),1)
USE_CUDA := 1
else
USE_CUDA :=
endif
NVCC := $(CUDA_HOME)/bin/nvcc
NVCCFLAGS ?= -O3 -std=c++17 -arch=sm_$(CUDA_ARCH) -Xcompiler -fPIC -Xcompiler -Wall

OBJ := $(BUILD)/obj
BIN := $(BUILD)/bin
LIB := $(BUILD)/lib
GEN := $(BUILD)/gen

# Every fragment appends to these.
BINS :=
LIBS :=
TESTS :=
TEST_SCRIPTS :=
FUZZERS :=
INSTALL_TARGETS :=

.PHONY: all build-all deps test test-run test-build demo demo-run asan fuzz fuzz-run install clean
all: build-all

$(OBJ)/%.o: %.c | $(GEN)/mapflow.pb-c.h
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  CC    $<"
	$(Q)$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -c $< -o $@

$(OBJ)/%.o: $(GEN)/%.c
	@mkdir -p $(dir $@)
	@[ "$(V)" != 0 ] || echo "  CC    $<"
	$(Q)$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -Wno-unused-parameter -c $< -o $@

# Fragments, in dependency order.
include proto/proto.mk
-include kernels/kernels.mk
-include kernels/cuda.mk
-include daemon/daemon.mk
-include client/client.mk
-include $(wildcard client/*/*.mk)
-include tests/tests.mk
-include $(wildcard bench/*.mk bench/*/*.mk)
-include deploy/deploy.mk
-include $(wildcard tests/*/*.mk)

build-all: $(LIBS) $(BINS)

# --- deps: only what is missing; apt-get update once -----------------------------
deps:
	@missing=""; for p in $(DEB_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	else echo "make deps: all Debian packages present"; fi

# test and demo first install packages, then run a second pass of this same Makefile,
# because pkg-config answers are read when the Makefile is parsed.
test: deps
	@$(MAKE) --no-print-directory test-run
	@$(ASAN_MAKE) asan-units

demo: deps
	@$(MAKE) --no-print-directory demo-run

# Each fragment appends its install-* rule to INSTALL_TARGETS; DESTDIR is used only here,
# never written into installed files.
install: build-all $(INSTALL_TARGETS)

clean:
	rm -rf $(BUILD) build-asan build-fuzz

-include $(shell find $(OBJ) -name '*.d' 2>/dev/null)
.SECONDARY:
