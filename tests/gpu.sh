#!/bin/sh
# gpu.sh -- the checks that run kernels on a CUDA device.  Where no device
# answers (`nvidia-smi -L` fails or is missing) it prints SKIPPED and exits
# 0, so `make check` stays green on machines without a GPU (unless
# $APOLLO_REQUIRE names gpu: tests/lib/require.sh).  On a device,
# at target $APOLLO_GPU_TARGET (default sm_90), every kernel runs through
# the runtime (client/runtime.c, the driver API) and is compared with the
# reference data:
#   1. check_runtime's `gpu` tag (a PTX bundle through the driver API);
#   2. every model and training step at --fusion none, rules and apollo
#      (rtol 1e-3, atol 1e-5, as on the host), then float32 with
#      --allow-tf32 (tensor cores; TF32's 10-bit mantissa: rtol 1e-2,
#      atol 5e-2, 1% of the elements may lie outside);
#   3. tests/conformance.sh at that target: every backend-test folder;
#   4. tests/precision.sh at that target: the float16 / bfloat16 models and
#      training steps against onnxruntime's float32 run.
# Exits non-zero on any failure.  It needs the build (make) and .venv; a
# bare lent GPU machine has neither: there, run the device kit
# (tools/device-kit.sh; docs/testing.md, "The device kit").
#   env: APOLLO_BUILD, APOLLO_JOBS (parallel checks, default 2),
#        APOLLO_GPU_TARGET, APOLLO_GPU_PARTS (default "1 2 3 4")
cd "$(dirname "$0")/.." || exit 1
. tests/lib/require.sh
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
	ap_skip gpu "gpu: SKIPPED: no CUDA device here (nvidia-smi -L)"
	exit $?
fi
. tests/daemon.inc

TARGET=${APOLLO_GPU_TARGET:-sm_90}
JOBS=${APOLLO_JOBS:-2}
PARTS=${APOLLO_GPU_PARTS:-1 2 3 4}
echo "gpu: $(nvidia-smi -L | head -1), target $TARGET"
status=0
part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

if part 1; then
	APOLLO_BUILD=$APOLLO_BUILD CK_INCLUDE_TAGS=gpu "$APOLLO_BUILD/tests/check_runtime" >"$AP_TMP/rt.out" 2>&1 || status=1
	sed 's/^/gpu runtime: /' "$AP_TMP/rt.out" | grep -E "SKIPPED|Checks|:F:|:E:"
fi
if part 2; then
	ap_start >/dev/null
	echo "gpu: $("$CLIENT" ping)"
	dirs=$(ap_test_dirs models training)
	for level in none rules apollo; do
		# shellcheck disable=SC2086
		"$CLIENT" check --target "$TARGET" --fusion $level --jobs "$JOBS" --atol 1e-5 \
			$dirs >"$AP_TMP/levels.out" 2>&1 || status=1
		sed "s/^/gpu $level: /" "$AP_TMP/levels.out"
	done
	# shellcheck disable=SC2086
	"$CLIENT" check --target "$TARGET" --allow-tf32 --jobs "$JOBS" --rtol 1e-2 --atol 5e-2 \
		--mismatch 0.01 $dirs >"$AP_TMP/tf32.out" 2>&1 || status=1
	sed "s/^/gpu tf32: /" "$AP_TMP/tf32.out"
	ap_stop
fi
if part 3; then
	APOLLO_TARGET=$TARGET sh tests/conformance.sh >"$AP_TMP/conf.out" 2>&1 || status=1
	grep -E "^conformance:|^FAIL|^  FAIL" "$AP_TMP/conf.out" | sed 's/^/gpu /'
fi
if part 4; then
	APOLLO_TARGET=$TARGET sh tests/precision.sh >"$AP_TMP/prec.out" 2>&1 || status=1
	grep -vE "^(float16|bfloat16) PASS" "$AP_TMP/prec.out" | sed 's/^/gpu /'
fi
[ $status -eq 0 ] || echo "gpu: FAILED"
exit $status
