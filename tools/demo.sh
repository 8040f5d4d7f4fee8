#!/bin/sh
# demo.sh -- Apollo end to end on a real model: start apollod on a temporary
# socket and cache, submit ../shared/testdata/models/bert_like_2l (a
# 2-layer transformer encoder) and print its fused kernels, submit it again
# to show the cache hit, run the bundle on the host and compare it with the
# model's reference output (`apollo-client check`), then stop the daemon.
#   env: APOLLO_BUILD, APOLLO_DEMO_MODEL (another folder under models/)
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc

model=$TESTDATA/models/${APOLLO_DEMO_MODEL:-bert_like_2l}
target=cpu
ap_start
info=$("$CLIENT" ping)
echo "$info"
case $info in
*"NVRTC none"*) ;;
*) target=sm_90 ;;
esac

echo
echo "== first submit ($target): compiled by the daemon"
"$CLIENT" submit "$model/model.onnx" --data "$model" --target "$target" || exit 1
echo
echo "== second submit: answered from the cache"
"$CLIENT" submit "$model/model.onnx" --data "$model" --target "$target" | grep -E '^cache |kernels for' || exit 1
echo
echo "== check: the cpu bundle run on this machine against the reference output"
"$CLIENT" check --atol 1e-5 "$model" || exit 1
echo
echo "== daemon stats"
"$CLIENT" stats
ap_stop
echo "apollod stopped"
