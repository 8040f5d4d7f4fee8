#!/bin/sh
# run-suites.sh [-P JOBS] SUITE... -- run the check suites, JOBS at a time
# ($JOBS, default nproc), each in its own process with its output kept in
# a file; as each ends its lines are printed together (never interleaved
# with another suite's): its Check summary with its wall time (and CPU
# time where /usr/bin/time exists), and on failure the failing checks.
# Ends with one line "suites: N passed, N failed" over all of them (CI's
# log reader takes "N passed, N failed").  Exits 1 on any failure.
#
# The suites are independent: each starts its daemons on private sockets
# under its own temporary directory.  The longest start first, by the
# times the last run wrote to $APOLLO_BUILD/suite-times, else (a fresh
# build: CI) by tests/expected-times, measured on a 2-core machine (then
# as given).
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
if [ "$1" = -P ]; then
	jobs=$2
	shift 2
fi
[ $# -gt 0 ] || { echo "suites: 0 passed, 0 failed"; exit 0; }
# Host kernels without their x86-64-v3 clone (hostcc.c): half the cc time,
# the same values; check_lower's host_isa_clones builds both and compares.
export APOLLO_HOST_CLONES="${APOLLO_HOST_CLONES:-0}"
# Suites that start apollod or run apollo-client find them here.
export APOLLO_BUILD="${APOLLO_BUILD:-$(cd "$(dirname "$1")/.." && pwd)}"
RS_DIR=$(mktemp -d "${TMPDIR:-/tmp}/apollo-suites.XXXXXX")
trap 'rm -rf "$RS_DIR"' EXIT
export RS_DIR
times=$APOLLO_BUILD/suite-times
RS_EXPECTED=$(cd "$(dirname "$0")/.." && pwd)/tests/expected-times
RS_TIME=
[ -x /usr/bin/time ] && RS_TIME=/usr/bin/time
export RS_TIME

# The suites, longest last run first (a suite not timed yet goes first:
# it may be long).
for t in "$@"; do
	s=$(cat "$times" "$RS_EXPECTED" 2>/dev/null | awk -v n="$(basename "$t")" '$1 == n { print $2 }' | head -1)
	echo "${s:-1000000} $t"
done | sort -s -k1,1nr | cut -d' ' -f2- >"$RS_DIR/order"

# One suite: run it, then print its report under the lock.
# shellcheck disable=SC2016
xargs -P "$jobs" -I{} sh -c '
	t=$1; n=$(basename "$t"); o=$RS_DIR/$n
	s0=$(date +%s.%N)
	if [ -n "$RS_TIME" ]; then
		"$RS_TIME" -f "%U %S" -o "$o.cpu" "$t" >"$o.out" 2>&1
	else
		"$t" >"$o.out" 2>&1
	fi
	rc=$?
	s1=$(date +%s.%N)
	wall=$(echo "$s0 $s1" | awk "{ printf \"%.1f\", \$2 - \$1 }")
	cpu=
	[ -s "$o.cpu" ] && cpu=$(tail -1 "$o.cpu" | awk "NF == 2 { printf \", %.1f s CPU\", \$1 + \$2 }")
	c=$(sed -nE "s/.*Checks: ([0-9]+), Failures: ([0-9]+), Errors: ([0-9]+).*/\1 \2 \3/p" "$o.out" | tail -1)
	{
		grep -E "^[0-9]+%: Checks" "$o.out" | sed "s|^|$n: |; s|\$| ($wall s$cpu)|"
		[ -z "$c" ] && echo "$n: no summary (exit $rc, $wall s)"
		[ $rc -ne 0 ] && grep -vE "^(Running suite|[0-9]+%: Checks)" "$o.out" | head -40
	} >"$o.report"
	echo "${c:-1 0 1} $rc" >"$o.result"
	echo "$n $wall" >"$o.time"
	flock "$RS_DIR/lock" cat "$o.report"
' sh {} <"$RS_DIR/order"

pass=0; fail=0
for r in "$RS_DIR"/*.result; do
	[ -f "$r" ] || continue
	read -r n f e rc <"$r"
	pass=$((pass + n - f - e)); fail=$((fail + f + e))
	[ "$rc" -ne 0 ] && [ $((f + e)) -eq 0 ] && fail=$((fail + 1))
done
# a suite that left no result (killed before its end) fails the run
ran=$(ls "$RS_DIR"/*.result 2>/dev/null | wc -l)
[ "$ran" -lt $# ] && { echo "suites: $(($# - ran)) suites left no result"; fail=$((fail + $# - ran)); }
# keep the times of this run for the next one's order (other suites'
# times stay)
{
	cat "$RS_DIR"/*.time 2>/dev/null
	[ -f "$times" ] && cat "$times"
} | awk '!seen[$1]++' >"$RS_DIR/times.new" && cp "$RS_DIR/times.new" "$times" 2>/dev/null
echo "suites: $pass passed, $fail failed"
[ $fail -eq 0 ]
