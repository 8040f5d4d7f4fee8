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
PKGS    := libuv libprotobuf-c sqlite3 isl libcrypto hiredis
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

# Quiet by default: compiles print nothing, each archive, library or
# executable one line ("  LD  build/apollod"); `make V=1 ...` prints every
# command in full.
Q   = $(if $(filter 1,$(V)),,@)
say = @$(if $(filter 1,$(V)),:,echo "  $(1)  $@")

LIBS := $(BUILD)/libapserver.a $(BUILD)/libapollo-client.a $(BUILD)/libapcommon.a

.PHONY: all deps check check-fast check-full check-unit check-scripts check-ub check-asan san-all fuzz fuzz-build \
	demo bench clean help
# Keep generated headers and test objects: they are not throw-away intermediates.
.SECONDARY:
STANDIN := $(BUILD)/tests/libcuda-standin.so $(BUILD)/tests/libcublaslt-standin.so
all: $(BUILD)/apollod $(BUILD)/apollo-client $(BUILD)/apollo-kernels $(BUILD)/libapollo-client.so \
	$(TESTS) $(STANDIN)

help:
	@echo "make deps    install what is missing (apt-get, .venv with onnx/onnxruntime/numpy)"
	@echo "make all     build apollod, apollo-client and the test suites into $(BUILD)/"
	@echo "make check-fast  build + the unit suites, sweeps sampled thinly (the edit loop, a few minutes)"
	@echo "make check   deps + build + every test (unit suites, integration, conformance); what CI runs"
	@echo "make check-full  make check with every configuration of every sweep (APOLLO_SWEEP=full), before a release"
	@echo "make check-asan  build into $(SAN_BUILD)/ with AddressSanitizer + UBSan, run the suites and conformance"
	@echo "make fuzz    build the libFuzzer harnesses (clang) into $(FUZZ_BUILD)/, run each $(FUZZ_SECONDS) s"
	@echo "make demo    the light path: build deps, apollod + apollo-client, a real model compiled twice and checked"
	@echo "make bench   compile time (cold/warm), the warm path (bench/warm.sh), fusion, scale,"
	@echo "             GEMM (ptxas, host), host-vs-onnxruntime and PyTorch training (eager, Inductor,"
	@echo "             Apollo: bench/torch_train.sh) benchmarks, into docs/benchmarks.md"
	@echo "make clean   remove $(BUILD)/, $(SAN_BUILD)/ and $(FUZZ_BUILD)/"

deps:
	@sh tools/deps.sh

# --- generated protobuf-c -------------------------------------------------
$(BUILD)/proto/proto/%.pb-c.c $(BUILD)/proto/proto/%.pb-c.h: proto/%.proto
	@mkdir -p $(BUILD)/proto
	$(call say,GEN)
	$(Q)protoc-c --c_out=$(BUILD)/proto $<

$(BUILD)/proto/proto/%.pb-c.o: $(BUILD)/proto/proto/%.pb-c.c
	$(Q)$(CC) $(CSTD) $(OPT) -fPIC -I$(BUILD)/proto -c $< -o $@

# --- objects ----------------------------------------------------------------
$(BUILD)/obj/%.o: %.c $(PROTO_H)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS_ALL) -fPIC -MMD -MP -c $< -o $@

$(BUILD)/obj/tests/%.o: tests/%.c $(PROTO_H)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS_ALL) $(CHECK_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libapcommon.a: $(COMMON_OBJ)
	$(call say,AR)
	$(Q)rm -f $@; ar rcs $@ $^
$(BUILD)/libapserver.a: $(SERVER_OBJ)
	$(call say,AR)
	$(Q)rm -f $@; ar rcs $@ $^ $(if $(SERVER_OBJ),,)
$(BUILD)/libapollo-client.a: $(CLIENT_OBJ)
	$(call say,AR)
	$(Q)rm -f $@; ar rcs $@ $^

# The client library and what it needs from common/, as one shared object:
# client/python (ctypes) loads it.  Only protobuf-c and libcrypto outside.
$(BUILD)/libapollo-client.so: $(CLIENT_OBJ) $(COMMON_OBJ)
	$(call say,LD)
	$(Q)$(CC) -shared -o $@ $^ $(shell pkg-config --libs libprotobuf-c libcrypto 2>/dev/null) -ldl -lm -pthread

$(BUILD)/apollod: $(call obj,server/main.c) $(LIBS)
	$(call say,LD)
	$(Q)$(CC) $(CFLAGS_ALL) -o $@ $< $(LIBS) $(LDLIBS_ALL)
$(BUILD)/apollo-client: $(call obj,client/apollo-client.c) $(LIBS)
	$(call say,LD)
	$(Q)$(CC) $(CFLAGS_ALL) -o $@ $< $(LIBS) $(LDLIBS_ALL)

$(BUILD)/apollo-kernels: $(call obj,tools/apollo-kernels.c) $(LIBS)
	$(call say,LD)
	$(Q)$(CC) $(CFLAGS_ALL) -o $@ $< $(LIBS) $(LDLIBS_ALL)

# bench/warm.sh's measuring client (kept connections, the daemon's CPU time,
# whole apollo-client processes timed).
$(BUILD)/bench_warm: $(call obj,bench/warm.c) $(LIBS)
	$(call say,LD)
	$(Q)$(CC) $(CFLAGS_ALL) -o $@ $< $(LIBS) $(LDLIBS_ALL)

# check_faults fails allocations on purpose: Apollo's own calls go through
# its __wrap_* functions (tests/check_faults.c).
$(BUILD)/tests/check_faults: TEST_LDFLAGS = -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup
$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(LIBS)
	@mkdir -p $(dir $@)
	$(call say,LD)
	$(Q)$(CC) $(CFLAGS_ALL) $(TEST_LDFLAGS) -o $@ $< $(LIBS) $(CHECK_LIBS) $(LDLIBS_ALL)

# A stand-in CUDA driver for the GPU path's tests where no GPU exists.
# Its cuTensorMapEncodeTiled enforces the driver's rules with common/tmap.c.
$(BUILD)/tests/libcuda-standin.so: tests/cuda_standin.c common/tmap.c common/tmap.h
	@mkdir -p $(dir $@)
	$(call say,LD)
	$(Q)$(CC) -std=c11 -D_GNU_SOURCE -O1 -Wall -Werror -shared -fPIC -I. -o $@ tests/cuda_standin.c common/tmap.c
# ... and a stand-in cuBLASLt beside it (library launches, issue 25).
$(BUILD)/tests/libcublaslt-standin.so: tests/cublaslt_standin.c
	@mkdir -p $(dir $@)
	$(call say,LD)
	$(Q)$(CC) -std=c11 -D_GNU_SOURCE -O1 -Wall -Werror -shared -fPIC -o $@ $< -lm

# --- tests ------------------------------------------------------------------
# Three tiers (docs/testing.md, "Tiers"):
#   check-fast  build + the unit suites but FAST_SKIP, without the tcases
#               tagged slow, the parameter sweeps sampled thinly
#               (APOLLO_SWEEP=$(FAST_SWEEP)): the edit loop;
#   check       deps + build + the unit and integration suites, check-ub,
#               then the script tests under tests/ (conformance over
#               ../shared/testdata, onnxruntime differential, NVRTC), the
#               sweeps sampled (APOLLO_SWEEP=sample): what CI runs;
#   check-full  check with every configuration of every sweep
#               (APOLLO_SWEEP=full), before a release.
# APOLLO_SWEEP (tests/lib/sweep.h) decides how many configurations of an
# emitter's space tests/check_lower.c compiles and runs; every one is
# still lowered.  Suites and scripts run $(JOBS) at a time, each printed
# whole with its time when it ends (tools/run-suites.sh, run-scripts.sh).
APOLLO_SWEEP ?= sample
FAST_SWEEP   ?= sample:20
# Left out of check-fast: whole-suite sweeps of minutes (every allocation
# and cache I/O failed in turn; NVRTC over every model), and the tcases
# tagged slow (check_program's whole models at each fusion level).
FAST_SKIP    := check_faults check_gemm
RUN_SUITES   = JOBS=$(JOBS) APOLLO_BUILD=$(abspath $(BUILD)) sh tools/run-suites.sh

check: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@$(MAKE) --no-print-directory check-unit
	@$(MAKE) --no-print-directory check-ub
	@$(MAKE) --no-print-directory check-scripts

check-full:
	@$(MAKE) --no-print-directory check APOLLO_SWEEP=full

check-fast:
	@$(MAKE) --no-print-directory -j$(JOBS) $(TESTS) $(STANDIN) $(BUILD)/apollod $(BUILD)/apollo-client
	@CK_EXCLUDE_TAGS="slow full" APOLLO_SWEEP=$(FAST_SWEEP) $(RUN_SUITES) \
		$(filter-out $(patsubst %,$(BUILD)/tests/%,$(FAST_SKIP)),$(TESTS))

# The tcases tagged full repeat, in process, what a script test checks
# through the daemon (check_program's fusion_levels: tests/fusion_levels.sh);
# only make check-full runs them.
# UNIT_SKIP: suites left out here because the caller runs them elsewhere
# (.ci/run: check_faults, whose sanitized run in check-asan makes the same
# assertions and LeakSanitizer's besides).
UNIT_EXCLUDE = $(if $(filter full,$(APOLLO_SWEEP)),,full)
UNIT_SKIP ?=
check-unit: $(TESTS)
	@CK_EXCLUDE_TAGS="$(UNIT_EXCLUDE)" APOLLO_SWEEP=$(APOLLO_SWEEP) $(RUN_SUITES) \
		$(filter-out $(patsubst %,$(BUILD)/tests/%,$(UNIT_SKIP)),$(TESTS))

check-scripts: all
	@APOLLO_SWEEP=$(APOLLO_SWEEP) JOBS=$(JOBS) APOLLO_BUILD=$(abspath $(BUILD)) sh tools/run-scripts.sh

# --- sanitizers ------------------------------------------------------------------
# The same sources built into $(SAN_BUILD) with AddressSanitizer (and
# LeakSanitizer) plus UndefinedBehaviorSanitizer, every report fatal.
# GCC leaves float-cast-overflow out of -fsanitize=undefined: named here.
SAN_BUILD ?= build-asan
SAN_OPT   := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined,float-cast-overflow \
	     -fno-sanitize-recover=all
SAN_WARN  := $(WARN) -Wno-format-truncation
SAN_MAKE  := $(MAKE) --no-print-directory -j$(JOBS) BUILD=$(SAN_BUILD) OPT="$(SAN_OPT)" WARN="$(SAN_WARN)"
# intercept_tls_get_addr=0: LeakSanitizer (GCC 12) crashes scanning the
# dynamic TLS records of the libraries NVRTC dlopens ("Tracer caught
# signal 11", a bogus DTLS range) once enough of them are loaded
# (check_gemm); Apollo's own thread-locals are static TLS, still scanned.
SAN_ENV   := ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=0:strict_string_checks=1:intercept_tls_get_addr=0 \
	     LSAN_OPTIONS=suppressions=$(abspath tools/lsan.supp) \
	     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	     APOLLO_BUILD=$(abspath $(SAN_BUILD))

san-all:
	@$(SAN_MAKE) all

# Undefined behaviour has no visible effect in an optimised build: the
# regression suite for it (tests/check_undefined.c) runs sanitized.
check-ub:
	@$(SAN_MAKE) $(SAN_BUILD)/tests/check_undefined
	@$(SAN_ENV) sh tools/run-suites.sh $(SAN_BUILD)/tests/check_undefined

# Every unit / integration suite and the conformance script, sanitized,
# without the tcases tagged full or slow (check_program's fusion_levels
# and training steps built whole: the sanitized conformance run builds
# every model and training step through the same pipeline).
# The sweeps take a longer stride here (ASAN_SWEEP; tests/lib/sweep.h):
# every configuration is still lowered by the sanitized emitters, and the
# host kernels it leaves out are compiled by the unsanitised cc anyway.
ASAN_SWEEP ?= sample:40
check-asan: deps
	@$(MAKE) --no-print-directory san-all
	@$(SAN_ENV) CK_EXCLUDE_TAGS="full slow" APOLLO_SWEEP=$(ASAN_SWEEP) JOBS=$(JOBS) sh tools/run-suites.sh \
		$(patsubst $(BUILD)/%,$(SAN_BUILD)/%,$(TESTS))
	@$(SAN_ENV) sh tests/conformance.sh

# --- fuzzing ------------------------------------------------------------------------
# libFuzzer harnesses (tests/fuzz/fuzz_*.c) over the same sources, built by
# clang into $(FUZZ_BUILD) with AddressSanitizer + UBSan; seeds from
# ../shared/testdata (tests/fuzz/make-seeds.sh); each runs FUZZ_SECONDS,
# $(JOBS) harnesses at a time.
FUZZ_BUILD ?= build-fuzz
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_OPT := -O1 -g -fno-omit-frame-pointer \
	    -fsanitize=fuzzer-no-link,address,undefined,float-cast-overflow -fno-sanitize-recover=all
FUZZERS := envelope onnx tensor bundle compile runtime

$(BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(LIBS)
	$(call say,LD)
	$(Q)$(CC) $(CFLAGS_ALL) -fsanitize=fuzzer -o $@ $< $(LIBS) $(LDLIBS_ALL)
$(BUILD)/fuzz-seeds: tests/fuzz/seeds.c $(LIBS)
	$(call say,LD)
	$(Q)$(CC) $(CFLAGS_ALL) -o $@ $< $(LIBS) $(LDLIBS_ALL)

fuzz-build:
	@$(MAKE) --no-print-directory -j$(JOBS) BUILD=$(FUZZ_BUILD) CC=$(FUZZ_CC) OPT="$(FUZZ_OPT)" \
		$(patsubst %,$(FUZZ_BUILD)/fuzz_%,$(FUZZERS))

fuzz: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all $(BUILD)/fuzz-seeds
	@$(MAKE) --no-print-directory fuzz-build
	@APOLLO_BUILD=$(abspath $(BUILD)) sh tests/fuzz/make-seeds.sh $(FUZZ_BUILD)/seeds
	@JOBS=$(JOBS) sh tools/run-fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZERS)

# The light path (tools/demo.sh): test data checked first, only the build's
# packages and onnx/onnxruntime/numpy installed, apollod and apollo-client
# built (not the suites), then a real model compiled, cached and checked.
demo:
	@JOBS=$(JOBS) APOLLO_BUILD=$(abspath $(BUILD)) sh tools/demo.sh

# Every benchmark of bench/run.sh, their tables written into
# docs/benchmarks.md with the date, the machine and the commit
# (bench/report.sh; BENCH_ARGS="--quick scale" for a short partial run).
bench: all $(BUILD)/bench_warm
	@APOLLO_BUILD=$(abspath $(BUILD)) sh bench/report.sh $(BENCH_ARGS)

clean:
	rm -rf $(BUILD) $(SAN_BUILD) $(FUZZ_BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
