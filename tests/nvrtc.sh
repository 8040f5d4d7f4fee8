#!/bin/sh
# nvrtc.sh -- every model and node test under ../shared/testdata compiled by
# the daemon with NVRTC for sm_80 cubin, sm_90 cubin and compute_80 PTX
# (`apollo-client submit --data DIR`, so shapes and constant inputs come
# from test_data_set_0).  All must succeed.  With APOLLO_SWEEP other than
# "full" (make check), the single-op node tests (onnx-node, onnx-simple,
# onnx-pytorch-*) take one cubin each, sm_90 and sm_80 in turn (in folder
# order, so each op's variants meet both), and no compute_80 PTX (their
# CUDA C is the sm_80 cubin's, which NVRTC turns into the same PTX on the
# way to ptxas); the models, training steps and onnx-light networks take
# all three, and make check-full gives every test all three.  Skipped, saying so, only when
# the daemon reports no NVRTC (failed instead where $APOLLO_REQUIRE names
# nvrtc).  Folders in tests/known_gaps.txt are left out.
#   env: APOLLO_BUILD, APOLLO_JOBS (parallel submits, default 2),
#        APOLLO_SWEEP (full: compute_80 PTX for every test)
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc

ap_start
info=$("$CLIENT" ping)
echo "nvrtc: $info"
case $info in
*"NVRTC none"*)
	ap_skip nvrtc "nvrtc: SKIPPED: the daemon reports no NVRTC (no CUDA toolkit and no nvidia-cuda-nvrtc wheel; make deps)"
	exit $? ;;
esac
gaps=$AP_TMP/gaps
ap_known_gaps | sort -u >"$gaps"
list=$AP_TMP/jobs
: >"$list"
for d in $(ap_test_dirs onnx-node onnx-simple onnx-pytorch-converted onnx-pytorch-operator onnx-light models training); do
	grep -qxF "${d#"$TESTDATA"/}" "$gaps" && continue
	tfs="sm_80:cubin sm_90:cubin compute_80:ptx"
	case ${d#"$TESTDATA"/}/$APOLLO_SWEEP in
	*/full) ;;
	onnx-node/* | onnx-simple/* | onnx-pytorch-*)
		n_node=$((${n_node:-0} + 1))
		tfs="sm_90:cubin"
		[ $((n_node % 2)) -eq 0 ] && tfs="sm_80:cubin" ;;
	esac
	for tf in $tfs; do
		echo "$d $tf" >>"$list"
	done
done
echo "nvrtc: $(wc -l <"$list") compiles"
# One line per compile: OK/FAIL, target, format, folder (and the error).
export CLIENT TESTDATA
t0=$(date +%s)
xargs -P "${APOLLO_JOBS:-2}" -L 1 sh -c '
	d=$1; t=${2%%:*}; f=${2#*:}
	if out=$("$CLIENT" submit "$d/model.onnx" --data "$d" --target "$t" --format "$f" --json 2>&1); then
		k=$(printf "%s\n" "$out" | sed -n "s/.*\"kernels\":\([0-9]*\).*/\1/p")
		echo "OK   $t $f ${d#"$TESTDATA"/} ($k kernels)"
	else
		echo "FAIL $t $f ${d#"$TESTDATA"/}: $(printf "%s" "$out" | tr "\n" " ")"
	fi' sh <"$list" >"$AP_TMP/nvrtc.log"
t1=$(date +%s)
ok=$(grep -c '^OK ' "$AP_TMP/nvrtc.log")
bad=$(grep -c '^FAIL ' "$AP_TMP/nvrtc.log")
grep '^FAIL ' "$AP_TMP/nvrtc.log"
for tf in sm_80:cubin sm_90:cubin compute_80:ptx; do
	t=${tf%%:*}
	echo "nvrtc: $t ${tf#*:}: $(grep -c "^OK   $t " "$AP_TMP/nvrtc.log") ok, $(grep -c "^FAIL $t " "$AP_TMP/nvrtc.log") failed"
done
echo "nvrtc: $ok passed, $bad failed ($((t1 - t0)) s)"
[ "$bad" -eq 0 ] && [ "$ok" -eq "$(wc -l <"$list")" ]
