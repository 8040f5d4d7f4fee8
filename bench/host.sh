#!/bin/sh
# bench/host.sh -- the host table: every model under ../shared/testdata/models
# and training/ run on target cpu by Apollo (apollo-client check --repeat
# REPEAT: the median of REPEAT timed runs after the checked one, kernels
# compiled by the daemon's host compiler) and, in the same run on the same
# inputs, by onnxruntime (CPUExecutionProvider, the same thread count,
# default graph optimisations; bench/host.py), with the ratio Apollo /
# onnxruntime.  The folders run one at a time (--jobs 1) so the two never
# share the cores.  Prints numbers, asserts nothing (correctness is
# tests/conformance.sh; a folder that fails its check is shown as FAIL).
#   env: APOLLO_BUILD, REPEAT (default 10), BENCH_THREADS (default 1: the
#   threads of Apollo's host runtime and of onnxruntime alike)
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc

REPEAT=${REPEAT:-10}
THREADS=${BENCH_THREADS:-1}
PY=$REPO/.venv/bin/python
if ! "$PY" -c 'import onnx, onnxruntime, numpy' 2>/dev/null; then
	echo "bench/host: needs onnx, onnxruntime and numpy in $REPO/.venv (make deps)"
	exit 1
fi
ap_start >/dev/null
echo "bench/host: target cpu, $THREADS thread(s), median of $REPEAT runs"
# shellcheck disable=SC2046
"$CLIENT" check --target cpu --jobs 1 --threads "$THREADS" --repeat "$REPEAT" \
	$(ap_test_dirs models training) >"$AP_TMP/host.out" 2>&1
ap_stop
"$PY" bench/host.py "$AP_TMP/host.out" "$THREADS" "$REPEAT"
