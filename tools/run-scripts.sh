#!/bin/sh
# run-scripts.sh -- run every tests/*.sh (integration, conformance,
# differential, NVRTC) in name order; each prints its own lines and exits
# non-zero on failure.  Ends with "N passed, N failed" over the scripts.
cd "$(dirname "$0")/.."
pass=0; fail=0
for s in tests/*.sh; do
	[ -f "$s" ] || continue
	echo "== $s"
	if sh "$s"; then pass=$((pass+1)); else echo "FAILED: $s"; fail=$((fail+1)); fi
done
echo "scripts: $pass passed, $fail failed"
[ $fail -eq 0 ]
