#!/bin/sh
# demo.sh -- `make demo`: Apollo end to end on a real model, from a fresh
# clone.  In four stages, one line each (V=1 prints the build's commands):
#   1. the test data is there (../shared/testdata, or $APOLLO_TESTDATA),
#      else it says where it comes from and stops before installing anything;
#   2. tools/deps.sh demo: the Debian packages the build needs and onnx,
#      onnxruntime, numpy in .venv (no PyTorch: `make check` installs that);
#   3. builds apollod and apollo-client only (not the test suites);
#   4. starts apollod on a private socket and cache, submits
#      models/bert_like_2l (a 2-layer transformer encoder) cold, then again
#      (a cache hit), runs the host bundle against the model's reference
#      output (`apollo-client check`) and on random inputs against
#      onnxruntime (`apollo-client run --compare onnxruntime`), stops the
#      daemon.
# Ends with what happened and three commands to try next.
#   env: APOLLO_BUILD, APOLLO_TESTDATA, APOLLO_DEMO_MODEL (another folder
#        under models/), JOBS, V
cd "$(dirname "$0")/.." || exit 1
TESTDATA=${APOLLO_TESTDATA:-../shared/testdata}
name=${APOLLO_DEMO_MODEL:-bert_like_2l}
model=$TESTDATA/models/$name
APOLLO_BUILD=${APOLLO_BUILD:-$(pwd)/build}
t_start=$(date +%s)

echo "demo 1/4: test data $model"
if [ ! -f "$model/model.onnx" ] || [ ! -d "$model/test_data_set_0" ]; then
	cat >&2 <<EOF
demo: no model at $model (model.onnx and test_data_set_0/).
  The demo and the tests read the project's shared test data, a folder
  'shared/testdata' placed beside this repository (../shared/testdata): the
  ONNX project's backend tests (onnx/onnx v1.22.0, Apache-2.0) and real
  models exported from PyTorch with onnxruntime's outputs (its MANIFEST.md
  says where each comes from).  Put it there, or point APOLLO_TESTDATA at it.
EOF
	exit 1
fi

echo "demo 2/4: dependencies (tools/deps.sh demo: Debian build packages; onnx, onnxruntime, numpy in .venv)"
sh tools/deps.sh demo || exit 1

echo "demo 3/4: build apollod and apollo-client into $APOLLO_BUILD (make V=1 demo prints every command)"
make --no-print-directory -j"${JOBS:-$(nproc 2>/dev/null || echo 2)}" BUILD="$APOLLO_BUILD" \
	"$APOLLO_BUILD/apollod" "$APOLLO_BUILD/apollo-client" || exit 1

echo "demo 4/4: apollod on a private socket; $name submitted twice, then run and checked"
export APOLLO_BUILD
. tests/daemon.inc
log=$AP_TMP/demo.log
ap_start >"$log" 2>&1 || { cat "$log"; exit 1; }
target=cpu
case $("$CLIENT" ping) in
*"NVRTC none"*) ;;
*) target=sm_90 ;;
esac

echo
echo "== first submit ($target): compiled by the daemon"
"$CLIENT" submit "$model/model.onnx" --data "$model" --target "$target" >"$AP_TMP/cold" || exit 1
cut -c1-150 "$AP_TMP/cold"
echo
echo "== second submit: answered from the cache"
"$CLIENT" submit "$model/model.onnx" --data "$model" --target "$target" >"$AP_TMP/warm" || exit 1
grep -E '^cache ' "$AP_TMP/warm"
echo
echo "== check: the cpu bundle run on this machine against the reference output"
"$CLIENT" check --atol 1e-5 "$model" >"$AP_TMP/check" || { cat "$AP_TMP/check"; exit 1; }
cat "$AP_TMP/check"
echo
echo "== run: random inputs, the cpu bundle against onnxruntime on the same inputs"
"$CLIENT" run "$model/model.onnx" --compare onnxruntime >"$AP_TMP/run" 2>&1 || { cat "$AP_TMP/run"; exit 1; }
cut -c1-150 "$AP_TMP/run"
ap_stop

# What happened, from the lines above; commands shown relative to here.
bin=${APOLLO_BUILD#"$(pwd)"/}
head=$(sed -n 1p "$AP_TMP/cold")
launches=$(echo "$head" | sed -n 's/.*: \([0-9]*\) kernel launches.*/\1/p')
distinct=$(echo "$head" | sed -n 's/.*(\([0-9]*\) distinct kernels).*/\1/p')
eager=$(echo "$head" | sed -n 's/.*eager: \([0-9]*\) kernels.*/\1/p')
cold_ms=$(sed -n 's/^cache miss; compile \([0-9.]*\) ms.*/\1/p' "$AP_TMP/cold")
warm_ms=$(sed -n 's/^cache hit; compile \([0-9.]*\) ms.*/\1/p' "$AP_TMP/warm")
err=$(sed -n 's/.*max abs err \([^ ]*\).*/\1/p' "$AP_TMP/check")
cat <<EOF

== what happened ($(($(date +%s) - t_start)) s in all)
  $name: $eager kernels when run op by op became $launches launches of $distinct fused kernels for $target,
  compiled cold in $cold_ms ms; the same request again was a cache hit answered in $warm_ms ms;
  the host (cpu) bundle of the same fusion matched onnxruntime's reference output (max abs error $err)
  and onnxruntime itself on random inputs.

== try next
  A daemon of your own:   $bin/apollod --socket /tmp/apollod.sock &  export APOLLO_SOCKET=/tmp/apollod.sock
  Why each kernel boundary is where it is, and a picture of the fusion:
      $bin/apollo-client submit $model/model.onnx --explain --explain-html fused.html
  Your own ONNX model (weights in a .onnx.data file are fine; bind symbolic dims with --shape):
      $bin/apollo-client run your_model.onnx --shape input=1x3x224x224 --compare onnxruntime
  Every test (installs PyTorch and the test tools into .venv first):
      make check
EOF
