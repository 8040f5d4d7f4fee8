#!/bin/sh
# emulated.sh -- the GPU's kernels run on the host in the checking mode
# (target host:sm_XX, --host-check): every model and training step under
# ../shared/testdata is lowered for sm_80 and for sm_90 -- tensor cores,
# ldmatrix, cp.async pipelines, pair and compute staging, split-K clusters,
# tensor-core attention -- printed as host C with every shared and global
# access, cp.async and barrier going through the checker
# (client/hostcheck.c), run, and compared with the reference outputs.  A
# data race, a read of bytes a cp.async has not delivered, a cluster peer
# read without a cluster barrier, an out-of-bounds or misaligned access
# fails the run like a wrong answer.  Per architecture:
#   float32 (SIMT kernels):           rtol 1e-3, atol 1e-5;
#   float32 --allow-tf32 (TF32 mma):  rtol 1e-2, atol 5e-2, 1% of the
#                                     elements may lie outside;
#   float16 / bfloat16 (tools/convert_precision.py, against onnxruntime's
#   float32 outputs): rtol 1e-2 / 5e-2, atol the same, 1% outside.
# With APOLLO_SWEEP other than "full" (make check), sm_80 runs float32 and
# float16 only: its TF32 and bfloat16 kernels are sm_90's mma.sync code
# without clusters, which its float32 (split-K without clusters) and
# float16 (mma.sync, cp.async) runs already take; make check-full runs all
# eight.
#   env: APOLLO_BUILD, APOLLO_JOBS (parallel checks, default 2),
#        APOLLO_EMU_ARCHS (default "sm_80 sm_90"), APOLLO_SWEEP
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc

PY=$REPO/.venv/bin/python
if ! "$PY" -c 'import onnx, onnxruntime, numpy' 2>/dev/null; then
	echo "emulated: needs onnx, onnxruntime and numpy in $REPO/.venv (make deps)"
	exit 1
fi
JOBS=${APOLLO_JOBS:-2}
dirs=$(ap_test_dirs models training)
[ -n "$dirs" ] || { echo "emulated: no models under $TESTDATA"; exit 1; }
for dt in float16 bfloat16; do
	# shellcheck disable=SC2086
	if ! "$PY" tools/convert_precision.py --dtype $dt --out "$AP_TMP/prec" $dirs \
		2>"$AP_TMP/convert.log"; then
		grep -v "W:onnxruntime" "$AP_TMP/convert.log"
		echo "emulated: converting to $dt failed"
		exit 1
	fi
done
ap_start >/dev/null
status=0
# one check run: label, then apollo-client check's arguments
run() {
	label=$1
	shift
	if "$CLIENT" check --host-check --jobs "$JOBS" "$@" >"$AP_TMP/run.out" 2>&1; then
		echo "emulated $label: $(tail -1 "$AP_TMP/run.out")"
	else
		status=1
		grep -v "^PASS" "$AP_TMP/run.out" | sed "s/^/emulated $label: /" | head -40
	fi
}
for arch in ${APOLLO_EMU_ARCHS:-sm_80 sm_90}; do
	t=host:$arch
	# shellcheck disable=SC2086
	run "$arch float32" --target "$t" --atol 1e-5 $dirs
	# shellcheck disable=SC2046
	run "$arch float16" --target "$t" --rtol 1e-2 --atol 1e-2 --mismatch 0.01 \
		$(ls -d "$AP_TMP"/prec/float16__*/)
	if [ "$arch" = sm_80 ] && [ "$APOLLO_SWEEP" != full ]; then
		echo "emulated sm_80 tf32, bfloat16: in make check-full (APOLLO_SWEEP=full)"
		continue
	fi
	# shellcheck disable=SC2086
	run "$arch tf32" --target "$t" --allow-tf32 --rtol 1e-2 --atol 5e-2 --mismatch 0.01 $dirs
	# shellcheck disable=SC2046
	run "$arch bfloat16" --target "$t" --rtol 5e-2 --atol 5e-2 --mismatch 0.01 \
		$(ls -d "$AP_TMP"/prec/bfloat16__*/)
done
[ $status -eq 0 ] && echo "emulated: PASS" || echo "emulated: FAILED"
exit $status
