#!/bin/sh
# make-seeds.sh OUTDIR -- the fuzzers' seed corpora, from ../shared/testdata
# ($APOLLO_TESTDATA): fuzz-seeds writes onnx/, tensor/, envelope/ and
# compile/ (tests/fuzz/seeds.c); then a real apollod compiles a handful of
# small models for target cpu and the bundles (apollo-client submit -o)
# become bundle/.  Needs the normal build ($APOLLO_BUILD, default build/).
#   env: APOLLO_BUILD, APOLLO_TESTDATA
set -e
cd "$(dirname "$0")/../.."
OUT=$1
[ -n "$OUT" ] || { echo "usage: $0 OUTDIR"; exit 2; }
. tests/daemon.inc
rm -rf "$OUT"
"$APOLLO_BUILD/fuzz-seeds" "$TESTDATA" "$OUT"
mkdir -p "$OUT/bundle"
ap_start --cache off >/dev/null
n=0
for t in test_add test_relu test_softmax_axis_1 test_matmul_2d test_reduce_sum_keepdims_example \
	 test_gather_0 test_transpose_default test_layer_normalization_2d_axis0 test_conv_with_strides_padding; do
	d=$TESTDATA/onnx-node/$t
	[ -f "$d/model.onnx" ] || continue
	if "$CLIENT" submit "$d/model.onnx" --data "$d/test_data_set_0" -o "$OUT/bundle/$t" >/dev/null 2>&1; then
		n=$((n + 1))
	fi
	mkdir -p "$OUT/checked-bundle"
	"$CLIENT" submit "$d/model.onnx" --data "$d/test_data_set_0" --host-check \
		-o "$OUT/checked-bundle/$t" >/dev/null 2>&1 || true
done
ap_stop
# fuzz_runtime edits those real bundles: its inputs are edit lists (an
# empty one runs a bundle as it is)
mkdir -p "$OUT/runtime"
printf '\000' >"$OUT/runtime/as-is"
printf '\001\001\000\000\000\000\000\000\004\000\000\000\000' >"$OUT/runtime/small-bytes"
for k in onnx tensor envelope compile bundle runtime; do
	echo "make-seeds: $k: $(ls "$OUT/$k" | wc -l) seeds"
done
[ "$n" -gt 0 ] || { echo "make-seeds: no bundle compiled"; exit 1; }
