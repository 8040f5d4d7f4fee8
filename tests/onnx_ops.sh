#!/bin/sh
# onnx_ops.sh -- the ONNX ops of issue 12 (IsNaN, IsInf, Sin, Cos,
# GatherElements, ScatterND, ScatterElements, Trilu, CumSum, Einsum, Tile,
# Range, Where, Shrink, Resize/Upsample, DepthToSpace/SpaceToDepth, Softsign,
# ArgMax/ArgMin): every node test case of the onnx package's operator
# specification for them, and random-input cases against onnxruntime
# (tests/onnx_node_gen.py; a new seed each run, printed, APOLLO_SEED replays
# it), checked by `apollo-client check` on target cpu.  The specification's
# cases Apollo refuses by design (cubic, antialias, tf_crop_and_resize,
# diagonals) must each be refused with an error, never
# answered wrongly; hostile models (a Range of 2e12 elements, a Tile of
# 2^61, a Resize to 2e9 rows, out-of-range constant indices, a malformed
# Einsum, CumSum or Trilu) must be refused with the error that names the
# problem, before anything large is allocated.  Models whose mask and table subgraphs (rotary
# tables, a shifted-window mask, gathers of constants) use constants only
# must keep only their data path after import (constant folding), and
# still match onnxruntime; node tests of ../shared/testdata (convolutions,
# pools, normalisations, Gemm, ...) with their inputs made initializers
# are folded whole and must give the official outputs.  The same cases also compile for sm_90 with NVRTC
# (skipped, saying so, where the daemon has no NVRTC).
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc

PY=$REPO/.venv/bin/python
if ! "$PY" -c 'import onnx, onnxruntime, numpy' 2>/dev/null; then
	echo "onnx_ops: needs onnx, onnxruntime and numpy in $REPO/.venv (make deps)"
	exit 1
fi
seed=${APOLLO_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
echo "onnx_ops: seed $seed (APOLLO_SEED=$seed replays this run)"
"$PY" tests/onnx_node_gen.py --seed "$seed" --out "$AP_TMP/ops" | grep -v 'refused by design' || exit 1
ap_start
# shellcheck disable=SC2046
"$CLIENT" check --jobs "${APOLLO_JOBS:-2}" $(ls -d "$AP_TMP"/ops/spec/*/ "$AP_TMP"/ops/random/*/ "$AP_TMP"/ops/fold/*/ "$AP_TMP"/ops/consts/*/ 2>/dev/null) >"$AP_TMP/check.log" 2>&1
rc=$?
grep -v '^PASS' "$AP_TMP/check.log"
bad=0
# Constant folding: the mask and table subgraphs are gone after import,
# and the node tests with constant inputs leave one Identity per output
# (no kernel of an imported node) -- except those with a weight among
# their inputs (float data over 4 KiB), which must not fold at all.
nconst=0; nweights=0
for d in "$AP_TMP"/ops/fold/*/ "$AP_TMP"/ops/consts/*/; do
	json=$("$CLIENT" submit "$d/model.onnx" --data "$d" --json 2>&1)
	nodes=$(printf "%s" "$json" | sed -n 's/.*"eager_kernels":[0-9]*,"nodes":\([0-9]*\).*/\1/p' | head -1)
	eager=$(printf "%s" "$json" | sed -n 's/.*"eager_kernels":\([0-9]*\).*/\1/p' | head -1)
	case $d in
	*/fold/*)
		want=$(cat "$d/expect_nodes")
		if [ "$nodes" = "$want" ]; then
			echo "onnx_ops: $(basename "$d"): $nodes nodes left after folding"
		else
			echo "onnx_ops: $(basename "$d"): ${nodes:-?} nodes after import, $want expected: $json"; bad=1
		fi ;;
	*)
		case $(cat "$d/expect_fold") in
		"fold $nodes")
			if [ "$eager" = 0 ]; then nconst=$((nconst + 1))
			else echo "onnx_ops: $(basename "$d"): $eager kernels of imported nodes left"; bad=1; fi ;;
		weights)
			if [ -n "$eager" ] && [ "$eager" -gt 0 ]; then nweights=$((nweights + 1))
			else echo "onnx_ops: $(basename "$d"): folded although a weight is an input: $json"; bad=1; fi ;;
		*) echo "onnx_ops: $(basename "$d"): ${nodes:-?} nodes after import, $(cat "$d/expect_fold") expected: $json"
		   bad=1 ;;
		esac ;;
	esac
done
echo "onnx_ops: $nconst node tests with constant inputs folded whole at import," \
	"$nweights with a weight among them compiled"
hostile=0
for d in "$AP_TMP"/ops/refused/*/; do
	out=$("$CLIENT" check "$d" 2>&1)
	case $out in
	*"import: "*|*"unsupported data type"*) ;;
	*) echo "onnx_ops: $(basename "$d") should be refused at import, got: $out"; bad=1 ;;
	esac
	# hostile models: refused with the error that names what is wrong
	if [ -f "$d/expect_error" ]; then
		hostile=$((hostile + 1))
		want=$(cat "$d/expect_error")
		case $out in
		*"import: "*"$want"*) ;;
		*) echo "onnx_ops: $(basename "$d"): the error should say '$want', got: $out"; bad=1 ;;
		esac
	fi
done
echo "onnx_ops: $(ls -d "$AP_TMP"/ops/refused/*/ | wc -l) cases refused by design, each with an error" \
	"($hostile hostile models, each with the expected message)"
case $("$CLIENT" ping) in
*"NVRTC none"*) ap_skip nvrtc "onnx_ops: sm_90: SKIPPED: the daemon reports no NVRTC" || bad=1 ;;
*)
	export CLIENT
	ls -d "$AP_TMP"/ops/spec/*/ "$AP_TMP"/ops/random/*/ | xargs -P "${APOLLO_JOBS:-2}" -L 1 sh -c '
		if out=$("$CLIENT" submit "$1/model.onnx" --data "$1" --target sm_90 2>&1); then echo OK
		else echo "FAIL sm_90 $1: $(printf "%s" "$out" | tr "\n" " ")"; fi' sh >"$AP_TMP/sm90.log"
	grep '^FAIL' "$AP_TMP/sm90.log" && bad=1
	echo "onnx_ops: sm_90: $(grep -c '^OK' "$AP_TMP/sm90.log") compiled, $(grep -c '^FAIL' "$AP_TMP/sm90.log") failed" ;;
esac
[ $rc -eq 0 ] && [ $bad -eq 0 ]
