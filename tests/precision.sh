#!/bin/sh
# precision.sh -- every model under ../shared/testdata/models and training/
# in float16 and in bfloat16 (tools/convert_precision.py: weights and every
# value of the graph in the 16-bit type, inputs and outputs float32),
# checked on target cpu against onnxruntime running the original float32
# model on the same inputs; then their kernels for sm_90 and sm_90a through
# build/tests/check_gemm (tensor-core PTX, wgmma on sm_90a, no spills), and
# the sm_90a SASS of some (HGMMA, tests/sass_check.py; by the default rule
# and with --unvalidated, the warp-specialised forms).  Tolerances
# (docs/testing.md): float16 rtol 1e-2, atol 1e-2; bfloat16 (8 bits of
# mantissa) rtol 5e-2, atol 5e-2; and
# at most 1% of an output's elements outside them, since a ReLU whose
# input is within rounding of 0 takes the other side in 16 bits, which
# moves the gradients of that unit in a training step (onnxruntime's own
# float16 run of the same graphs shows it too).
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc

PY=$REPO/.venv/bin/python
if ! "$PY" -c 'import onnx, onnxruntime, numpy' 2>/dev/null; then
	echo "precision: needs onnx, onnxruntime and numpy in $REPO/.venv (make deps)"
	exit 1
fi
dirs=$(ap_test_dirs models training)
status=0
for dt in float16 bfloat16; do
	# shellcheck disable=SC2086
	if ! "$PY" tools/convert_precision.py --dtype $dt --out "$AP_TMP/prec" $dirs 2>"$AP_TMP/convert.log"; then
		grep -v "W:onnxruntime" "$AP_TMP/convert.log"
		echo "precision: converting to $dt failed"
		exit 1
	fi
done
ap_start
TARGET=${APOLLO_TARGET:-cpu}
# shellcheck disable=SC2046
"$CLIENT" check --target "$TARGET" --jobs "${APOLLO_JOBS:-2}" --rtol 1e-2 --atol 1e-2 --mismatch 0.01 \
	$(ls -d "$AP_TMP"/prec/float16__*/) >"$AP_TMP/f16.out" || status=1
sed 's/^/float16 /' "$AP_TMP/f16.out"
# shellcheck disable=SC2046
"$CLIENT" check --target "$TARGET" --jobs "${APOLLO_JOBS:-2}" --rtol 5e-2 --atol 5e-2 --mismatch 0.01 \
	$(ls -d "$AP_TMP"/prec/bfloat16__*/) >"$AP_TMP/bf16.out" || status=1
sed 's/^/bfloat16 /' "$AP_TMP/bf16.out"
# the same 16-bit graphs for sm_90: every GEMM kernel holds mma.sync and
# ldmatrix (and cp.async where an operand is copied so), no spills
# shellcheck disable=SC2046
"$APOLLO_BUILD/tests/check_gemm" $(ls -d "$AP_TMP"/prec/*__*/) >"$AP_TMP/gemm.out" 2>&1 || status=1
grep -E "check_gemm:|Checks:|:F:|:E:" "$AP_TMP/gemm.out" | sed 's/^/16-bit sm_90 /'
# sm_90a from the daemon (tuned, cubin): every GEMM and attention kernel
# holds HGMMA (wgmma) in its SASS (tests/sass_check.py, nvdisasm); make
# check takes a product, a convolution and an attention model, make
# check-full every float16 model
if ls "$REPO"/.venv/lib/python3*/site-packages/nvidia/*/bin/nvdisasm >/dev/null 2>&1; then
	sel="float16__bert_like_2l float16__small_convnet_train float16__mlp_residual_train"
	[ "$APOLLO_SWEEP" = full ] && sel=$(cd "$AP_TMP/prec" && ls -d float16__*)
	for m in $sel; do
		d=$AP_TMP/prec/$m
		if ! "$CLIENT" submit "$d/model.onnx" --data "$d/test_data_set_0" --target sm_90a --format cubin \
			-o "$AP_TMP/sm90a.pb" --explain >"$AP_TMP/sm90a.txt" 2>&1; then
			status=1
			echo "16-bit sm_90a SASS $m: submit failed: $(tail -2 "$AP_TMP/sm90a.txt")"
			continue
		fi
		"$PY" tests/sass_check.py "$AP_TMP/sm90a.pb" "$AP_TMP/sm90a.txt" --need HGMMA >"$AP_TMP/sass.out" 2>&1 ||
			{ status=1; grep MISSING "$AP_TMP/sass.out" | sed "s/^/16-bit sm_90a SASS $m: /"; }
		echo "16-bit sm_90a SASS $m: $(tail -1 "$AP_TMP/sass.out")"
	done
	# TF32 (float32 with --allow-tf32) on sm_90a: every GEMM and
	# convolution kernel on wgmma's m64nNk8 .tf32 (HGMMA), a product model
	# and a convolution one (float32 attention stays on the SIMT form)
	for m in mlp_residual_train small_convnet_train; do
		d=$TESTDATA/training/$m
		if ! "$CLIENT" submit "$d/model.onnx" --data "$d/test_data_set_0" --target sm_90a --allow-tf32 \
			--format cubin -o "$AP_TMP/sm90a.pb" --explain >"$AP_TMP/sm90a.txt" 2>&1; then
			status=1
			echo "TF32 sm_90a SASS $m: submit failed: $(tail -2 "$AP_TMP/sm90a.txt")"
			continue
		fi
		"$PY" tests/sass_check.py "$AP_TMP/sm90a.pb" "$AP_TMP/sm90a.txt" --need HGMMA --emitters gemm \
			>"$AP_TMP/sass.out" 2>&1 ||
			{ status=1; grep MISSING "$AP_TMP/sass.out" | sed "s/^/TF32 sm_90a SASS $m: /"; }
		echo "TF32 sm_90a SASS $m: $(tail -1 "$AP_TMP/sass.out")"
	done
	# the warp-specialised forms (--unvalidated): the convolutions' and
	# the fused-QKV attention's copying producer (tma=3), the products'
	# TMA producer (tma=2) -- HGMMA in every GEMM and attention kernel,
	for m in float16__bert_like_2l float16__small_convnet_train; do
		d=$AP_TMP/prec/$m
		if ! "$CLIENT" submit "$d/model.onnx" --data "$d/test_data_set_0" --target sm_90a --unvalidated \
			--format cubin -o "$AP_TMP/sm90a.pb" --explain >"$AP_TMP/sm90a.txt" 2>&1; then
			status=1
			echo "16-bit sm_90a --unvalidated SASS $m: submit failed: $(tail -2 "$AP_TMP/sm90a.txt")"
			continue
		fi
		grep -q "tma=3" "$AP_TMP/sm90a.txt" ||
			{ status=1; echo "16-bit sm_90a --unvalidated $m: no tma=3 (copying producer) schedule"; }
		# and the mbarrier waits and arrivals (SYNCS.*) of their pipelines
		for op in HGMMA SYNCS; do
			"$PY" tests/sass_check.py "$AP_TMP/sm90a.pb" "$AP_TMP/sm90a.txt" --need $op >"$AP_TMP/sass.out" 2>&1 ||
				{ status=1; grep MISSING "$AP_TMP/sass.out" | sed "s/^/16-bit sm_90a --unvalidated SASS $m: /"; }
			echo "16-bit sm_90a --unvalidated SASS $m: $(tail -1 "$AP_TMP/sass.out")"
		done
	done
else
	ap_skip nvdisasm "precision: no nvdisasm in .venv (make deps): the sm_90a SASS not read" || status=1
fi
[ $status -eq 0 ] || echo "precision: FAILED"
exit $status
