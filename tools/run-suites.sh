#!/bin/sh
# run-suites.sh SUITE... -- run each check suite, print its summary, and end
# with one line "N passed, N failed" over all of them.  Exits 1 on any failure.
pass=0; fail=0
# Suites that start apollod or run apollo-client find them here.
[ $# -gt 0 ] && export APOLLO_BUILD="${APOLLO_BUILD:-$(cd "$(dirname "$1")/.." && pwd)}"
for t in "$@"; do
	out=$("$t" 2>&1); rc=$?
	echo "$out" | grep -E '^[0-9]+%: Checks' | sed "s|^|$(basename "$t"): |"
	[ $rc -ne 0 ] && echo "$out" | grep -vE '^(Running suite|[0-9]+%: Checks)' | head -40
	c=$(echo "$out" | sed -nE 's/.*Checks: ([0-9]+), Failures: ([0-9]+), Errors: ([0-9]+).*/\1 \2 \3/p' | tail -1)
	if [ -z "$c" ]; then
		echo "$(basename "$t"): no summary (exit $rc)"; fail=$((fail+1)); continue
	fi
	n=${c%% *}; rest=${c#* }; f=${rest%% *}; e=${rest#* }
	pass=$((pass + n - f - e)); fail=$((fail + f + e))
	[ $rc -ne 0 ] && [ $((f+e)) -eq 0 ] && fail=$((fail+1))
done
echo "suites: $pass passed, $fail failed"
[ $fail -eq 0 ]
