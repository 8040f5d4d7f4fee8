# Apollo -- top-level build.  `make help` lists the targets.
#
# Sources are found by wildcard so a new file needs no edit here:
#   common/*.c + generated proto  -> build/libapcommon.a
#   server/*/*.c, server/*.c (not main.c) -> build/libapserver.a
#   client/*.c (not apollo-client.c) -> build/libapollo-client.a
#   the same + common -> build/libapollo-client.so (for the Python package)
#   tests/check_*.c -> build/tests/check_*  (one check suite each)
# Generated protobuf-c sources go to build/proto, never into git.

CC      ?= cc
BUILD   ?= build
CUDA_HOME ?= /usr/local/cuda
PKGS    := libuv libprotobuf-c sqlite3 isl libcrypto
CSTD    := -std=c11 -D_GNU_SOURCE
WARN    := -Wall -Wextra -Werror -Wno-unused-parameter
OPT     ?= -O2 -g
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)
CFLAGS_ALL = $(CSTD) $(WARN) $(OPT) -pthread -I$(BUILD)/proto -I. $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS_ALL = $(shell pkg-config --libs $(PKGS) 2>/dev/null) -ldl -lm -pthread
CHECK_CFLAGS = $(shell pkg-config --cflags check 2>/dev/null)
CHECK_LIBS   = $(shell pkg-config --libs check 2>/dev/null)

PROTOS      := $(wildcard proto/*.proto)
PROTO_C     := $(patsubst proto/%.proto,$(BUILD)/proto/proto/%.pb-c.c,$(PROTOS))
PROTO_H     := $(PROTO_C:.c=.h)
COMMON_SRC  := $(wildcard common/*.c)
SERVER_SRC  := $(filter-out server/main.c,$(wildcard server/*.c server/*/*.c))
CLIENT_SRC  := $(filter-out client/apollo-client.c,$(wildcard client/*.c))
TEST_SRC    := $(wildcard tests/check_*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
COMMON_OBJ  := $(call obj,$(COMMON_SRC)) $(PROTO_C:.c=.o)
SERVER_OBJ  := $(call obj,$(SERVER_SRC))
CLIENT_OBJ  := $(call obj,$(CLIENT_SRC))
TESTS       := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))

LIBS := $(BUILD)/libapserver.a $(BUILD)/libapollo-client.a $(BUILD)/libapcommon.a

.PHONY: all deps check check-unit check-scripts demo bench clean help
# Keep generated headers and test objects: they are not throw-away intermediates.
.SECONDARY:
STANDIN := $(BUILD)/tests/libcuda-standin.so
all: $(BUILD)/apollod $(BUILD)/apollo-client $(BUILD)/libapollo-client.so $(TESTS) $(STANDIN)

help:
	@echo "make deps    install what is missing (apt-get, .venv with onnx/onnxruntime/numpy)"
	@echo "make all     build apollod, apollo-client and the test suites into $(BUILD)/"
	@echo "make check   deps + build + every test (unit suites, integration, conformance)"
	@echo "make demo    deps + build + start apollod + submit a real model twice"
	@echo "make bench   cold/warm compile benchmark over ../shared/testdata/models"
	@echo "make clean   remove $(BUILD)/"

deps:
	@sh tools/deps.sh

# --- generated protobuf-c -------------------------------------------------
$(BUILD)/proto/proto/%.pb-c.c $(BUILD)/proto/proto/%.pb-c.h: proto/%.proto
	@mkdir -p $(BUILD)/proto
	protoc-c --c_out=$(BUILD)/proto $<

$(BUILD)/proto/proto/%.pb-c.o: $(BUILD)/proto/proto/%.pb-c.c
	$(CC) $(CSTD) $(OPT) -fPIC -I$(BUILD)/proto -c $< -o $@

# --- objects ----------------------------------------------------------------
$(BUILD)/obj/%.o: %.c $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -fPIC -MMD -MP -c $< -o $@

$(BUILD)/obj/tests/%.o: tests/%.c $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(CHECK_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libapcommon.a: $(COMMON_OBJ)
	@rm -f $@; ar rcs $@ $^
$(BUILD)/libapserver.a: $(SERVER_OBJ)
	@rm -f $@; ar rcs $@ $^ $(if $(SERVER_OBJ),,)
$(BUILD)/libapollo-client.a: $(CLIENT_OBJ)
	@rm -f $@; ar rcs $@ $^

# The client library and what it needs from common/, as one shared object:
# client/python (ctypes) loads it.  Only protobuf-c and libcrypto outside.
$(BUILD)/libapollo-client.so: $(CLIENT_OBJ) $(COMMON_OBJ)
	$(CC) -shared -o $@ $^ $(shell pkg-config --libs libprotobuf-c libcrypto 2>/dev/null) -ldl -lm -pthread

$(BUILD)/apollod: $(call obj,server/main.c) $(LIBS)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(LIBS) $(LDLIBS_ALL)
$(BUILD)/apollo-client: $(call obj,client/apollo-client.c) $(LIBS)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(LIBS) $(LDLIBS_ALL)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(LIBS) $(CHECK_LIBS) $(LDLIBS_ALL)

# A stand-in CUDA driver for the GPU path's tests where no GPU exists.
$(STANDIN): tests/cuda_standin.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -O1 -Wall -Werror -shared -fPIC -o $@ $<

# --- tests ------------------------------------------------------------------
# Unit and integration suites (check), then the script tests under tests/
# (conformance over ../shared/testdata, onnxruntime differential, NVRTC).
check: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@$(MAKE) --no-print-directory check-unit
	@$(MAKE) --no-print-directory check-scripts

check-unit: $(TESTS)
	@APOLLO_BUILD=$(abspath $(BUILD)) sh tools/run-suites.sh $(TESTS)

check-scripts: all
	@APOLLO_BUILD=$(abspath $(BUILD)) sh tools/run-scripts.sh

demo: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@APOLLO_BUILD=$(abspath $(BUILD)) sh tools/demo.sh

bench: all
	@APOLLO_BUILD=$(abspath $(BUILD)) sh bench/run.sh

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
