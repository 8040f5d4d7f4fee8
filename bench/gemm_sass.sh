#!/bin/sh
# gemm_sass.sh -- bench/gemm_sass.py against a private apollod (build/ by
# default, APOLLO_BUILD to override): the K loop of 4096^3 and 1024^3
# MatMuls on sm_90 read from their SASS (float16; float32 with TF32 and
# without), instructions a K tile and the share of them that multiply.
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc
ap_start
export APOLLO_LIB=$APOLLO_BUILD/libapollo-client.so
status=0
for args in "--size 4096" "--size 4096 --dtype float32 --allow-tf32" "--size 4096 --dtype float32" \
	"--size 1024" "--size 1024 --dtype bfloat16"; do
	# shellcheck disable=SC2086
	"$REPO/.venv/bin/python" bench/gemm_sass.py $args || status=1
done
exit $status
