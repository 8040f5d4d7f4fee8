#!/bin/sh
# differential.sh -- every model under ../shared/testdata/models and
# training/ on fresh random inputs (a new seed each run, printed; set
# APOLLO_SEED to replay one), with reference outputs from onnxruntime
# (tests/ort_diff.py, in $REPO/.venv), checked by `apollo-client check` on
# target cpu with rtol 1e-3, atol 1e-4.  Fixed test data alone can hide
# indexing bugs that random data exposes.
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc

PY=$REPO/.venv/bin/python
if ! "$PY" -c 'import onnx, onnxruntime, numpy' 2>/dev/null; then
	echo "differential: needs onnx, onnxruntime and numpy in $REPO/.venv (make deps)"
	exit 1
fi
seed=${APOLLO_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
echo "differential: seed $seed (APOLLO_SEED=$seed replays this run)"
dirs=$(ap_test_dirs models training)
# shellcheck disable=SC2086
if ! "$PY" tests/ort_diff.py --seed "$seed" --out "$AP_TMP/diff" $dirs; then
	echo "differential: onnxruntime could not produce references"
	exit 1
fi
ap_start
# shellcheck disable=SC2046
"$CLIENT" check --jobs "${APOLLO_JOBS:-2}" --rtol 1e-3 --atol 1e-4 $(ls -d "$AP_TMP"/diff/*/)
rc=$?
[ $rc -eq 0 ] || echo "differential: FAILED with seed $seed"
exit $rc
