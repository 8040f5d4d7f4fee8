#!/bin/sh
# conformance.sh -- `apollo-client check` on target cpu over every ONNX
# backend-test folder under ../shared/testdata, except those listed in
# tests/known_gaps.txt (path and reason, one a line).  Tolerances: ONNX's
# rtol 1e-3 / atol 1e-7; models/ and training/ atol 1e-5; test_densenet121
# rtol 2e-3.  Fails on any failure outside the known gaps, and when fewer
# than 95% of all tests (known gaps included) pass.
#   env: APOLLO_BUILD (build dir), APOLLO_JOBS (parallel checks, default 2),
#        APOLLO_TARGET (default cpu; tests/gpu.sh runs it on a device)
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc

JOBS=${APOLLO_JOBS:-2}
TARGET=${APOLLO_TARGET:-cpu}
ap_start
gaps=$AP_TMP/gaps
ap_known_gaps | sort -u >"$gaps"

# Split the folders into the three tolerance groups, without the gaps.
: >"$AP_TMP/default"; : >"$AP_TMP/loose"; : >"$AP_TMP/densenet"; : >"$AP_TMP/gapdirs"
total=0; n_gaps=0
for d in $(ap_test_dirs onnx-node onnx-simple onnx-pytorch-converted onnx-pytorch-operator onnx-light models training); do
	rel=${d#"$TESTDATA"/}
	total=$((total + 1))
	if grep -qxF "$rel" "$gaps"; then
		n_gaps=$((n_gaps + 1))
		echo "$d" >>"$AP_TMP/gapdirs"
		continue
	fi
	case $rel in
	models/*|training/*) echo "$d" >>"$AP_TMP/loose" ;;
	*/test_densenet121) echo "$d" >>"$AP_TMP/densenet" ;;
	*) echo "$d" >>"$AP_TMP/default" ;;
	esac
done
echo "conformance: target $TARGET, $total test folders, $n_gaps known gaps (tests/known_gaps.txt)"

log=$AP_TMP/check.log
: >"$log"
run_group() {
	list=$1; shift
	[ -s "$list" ] || return 0
	# shellcheck disable=SC2046
	"$CLIENT" check --target "$TARGET" --jobs "$JOBS" "$@" $(cat "$list") 2>&1 | tee -a "$log" | grep -v '^[0-9]* passed, [0-9]* failed$'
}
t0=$(date +%s)
run_group "$AP_TMP/default"
run_group "$AP_TMP/densenet" --rtol 2e-3
run_group "$AP_TMP/loose" --atol 1e-5
t1=$(date +%s)
# Known gaps run too, apart: one that passes now should leave the list.
if [ -s "$AP_TMP/gapdirs" ]; then
	# shellcheck disable=SC2046
	"$CLIENT" check --target "$TARGET" --jobs "$JOBS" $(cat "$AP_TMP/gapdirs") >"$AP_TMP/gaps.log" 2>&1
	grep '^PASS ' "$AP_TMP/gaps.log" | while read -r _ d _; do
		echo "conformance: known gap ${d#"$TESTDATA"/} passes now: remove it from tests/known_gaps.txt"
	done
fi

pass=$(grep -c '^PASS ' "$log")
fail=$(grep -c '^FAIL ' "$log")
ran=$((pass + fail))
expected=$((total - n_gaps))
echo "conformance: $pass passed, $fail failed, $n_gaps known gaps, of $total tests ($((t1 - t0)) s)"
status=0
if [ "$ran" -ne "$expected" ]; then
	echo "conformance: only $ran of $expected folders reported a result"
	status=1
fi
if [ "$fail" -gt 0 ]; then
	echo "conformance: failures outside tests/known_gaps.txt:"
	grep '^FAIL ' "$log" | sed 's/^/  /'
	status=1
fi
# The 95% bar counts known gaps as not passing.
if [ $((pass * 100)) -lt $((total * 95)) ]; then
	echo "conformance: pass rate $((pass * 100 / (total > 0 ? total : 1)))% is under 95%"
	status=1
else
	echo "conformance: pass rate $((pass * 1000 / (total > 0 ? total : 1) / 10)).$((pass * 1000 / (total > 0 ? total : 1) % 10))% (bar: 95%)"
fi
# Models must all pass: a gap there is a failure.
if grep -q '^models/' "$gaps"; then
	echo "conformance: tests/known_gaps.txt lists models/ folders; every model must pass"
	status=1
fi
exit $status
