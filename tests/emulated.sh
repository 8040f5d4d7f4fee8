#!/bin/sh
# emulated.sh -- the GPU's kernels run on the host in the checking mode
# (target host:sm_XX, --host-check): every model and training step under
# ../shared/testdata is lowered for sm_80, sm_90 and sm_90a -- tensor cores,
# ldmatrix, cp.async pipelines, pair and compute staging, split-K clusters,
# tensor-core attention, and on sm_90a wgmma from shared tiles laid out in
# core matrices -- printed as host C with every shared and global access,
# cp.async and barrier going through the checker (client/hostcheck.c),
# run, and compared with the reference outputs.  A data race, a read of
# bytes a cp.async has not delivered, a cluster peer read without a
# cluster barrier, an out-of-bounds or misaligned access fails the run
# like a wrong answer.  Per architecture:
#   float32 (SIMT kernels):           rtol 1e-3, atol 1e-5;
#   float32 --allow-tf32 (TF32 mma):  rtol 1e-2, atol 5e-2, 1% of the
#                                     elements may lie outside;
#   float16 / bfloat16 (tools/convert_precision.py, against onnxruntime's
#   float32 outputs): rtol 1e-2 / 5e-2, atol the same, 1% outside.
# sm_90a differs from sm_90 only in its tensor-core GEMM kernels (wgmma:
# 16-bit and TF32), so it runs float16, bfloat16 and tf32, float16 also
# with --unvalidated (the forms not
# yet run on a GPU: TMA-filled GEMM tiles on mbarriers where the operands
# allow, the warp-specialised kernels -- run with their coroutines in a
# random order, APOLLO_HOSTCHECK_SCHEDULE=random:1 --, the attention
# forward's softmax beside O += P V).  With APOLLO_SWEEP other than "full" (make
# check) each kernel family runs once: sm_80 float16 (mma.sync, cp.async,
# split-K without clusters), sm_90 float32 and tf32 (the SIMT kernels,
# clusters, mma.sync on 32-bit tiles), sm_90a float16 and tf32 (wgmma;
# bfloat16's wgmma runs in check_lower's attention_wg_bf16_stats); make check-full
# runs every type on every architecture.
#   env: APOLLO_BUILD, APOLLO_JOBS (parallel checks, default 2),
#        APOLLO_EMU_ARCHS (default "sm_80 sm_90 sm_90a"), APOLLO_SWEEP,
#        APOLLO_HOSTCHECK_SCHEDULE (the unvalidated run's order)
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
# whether type $2 runs on architecture $1 (the header's table)
runs() {
	[ "$APOLLO_SWEEP" = full ] && { [ "$1" != sm_90a ] || [ "$2" != float32 ]; } && return 0
	case "$1 $2" in
	"sm_80 float16" | "sm_90 float32" | "sm_90 tf32" | "sm_90a float16" | "sm_90a tf32") return 0 ;;
	esac
	return 1
}
for arch in ${APOLLO_EMU_ARCHS:-sm_80 sm_90 sm_90a}; do
	t=host:$arch
	if runs "$arch" float32; then
		# shellcheck disable=SC2086
		run "$arch float32" --target "$t" --atol 1e-5 $dirs
	fi
	if runs "$arch" float16; then
		# shellcheck disable=SC2046
		run "$arch float16" --target "$t" --rtol 1e-2 --atol 1e-2 --mismatch 0.01 \
			$(ls -d "$AP_TMP"/prec/float16__*/)
		if [ "$arch" = sm_90a ]; then
			# the forms not yet run on a GPU (--unvalidated): the GEMMs
			# whose operands can be tensor maps on TMA (mbarrier stages,
			# persistent blocks), the warp-specialised GEMMs,
			# convolutions and attention (producer warpgroups), the
			# attention overlap -- their coroutines in a random order a
			# pass (APOLLO_HOSTCHECK_SCHEDULE, unless set: the unit tests
			# take the listed and reverse orders)
			sched_saved=${APOLLO_HOSTCHECK_SCHEDULE-}
			export APOLLO_HOSTCHECK_SCHEDULE="${APOLLO_HOSTCHECK_SCHEDULE:-random:1}"
			# shellcheck disable=SC2046
			run "$arch float16 unvalidated ($APOLLO_HOSTCHECK_SCHEDULE order)" --target "$t" --unvalidated \
				--rtol 1e-2 --atol 1e-2 --mismatch 0.01 $(ls -d "$AP_TMP"/prec/float16__*/)
			if [ -n "$sched_saved" ]; then APOLLO_HOSTCHECK_SCHEDULE=$sched_saved; else unset APOLLO_HOSTCHECK_SCHEDULE; fi
		fi
	fi
	if runs "$arch" tf32; then
		# shellcheck disable=SC2086
		run "$arch tf32" --target "$t" --allow-tf32 --rtol 1e-2 --atol 5e-2 --mismatch 0.01 $dirs
	fi
	if runs "$arch" bfloat16; then
		# shellcheck disable=SC2046
		run "$arch bfloat16" --target "$t" --rtol 5e-2 --atol 5e-2 --mismatch 0.01 \
			$(ls -d "$AP_TMP"/prec/bfloat16__*/)
	fi
done
[ $status -eq 0 ] && echo "emulated: PASS" || echo "emulated: FAILED"
exit $status
