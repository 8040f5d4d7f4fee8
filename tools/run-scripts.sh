#!/bin/sh
# run-scripts.sh [-P JOBS] [SCRIPT...] -- run the script tests (default:
# every tests/*.sh: integration, conformance, differential, NVRTC), JOBS
# at a time ($JOBS, default nproc); each script's lines are printed
# together when it ends, with its wall time (and CPU time where
# /usr/bin/time exists), and it fails by exiting non-zero.  Ends with
# "scripts: N passed, N failed".
#
# The scripts are independent: each starts its own apollod (and cluster.sh
# and cluster_lease.sh their Redis) on sockets and caches under its own
# mktemp directory; the ports they listen on (metrics, python_api.py's
# TCP) are ones the kernel picks.  Only torch.sh writes into the source
# tree (client/python/build, which it removes), and no other script reads
# it.
#
# The value-checking scripts (SHARED below; explain_html, which only
# draws what it is answered, too) share one daemon cache,
# $APOLLO_TEST_CACHE (default $APOLLO_BUILD/test-cache/cache.db, emptied
# here first): its keys are content-addressed and name the daemon's
# executable (server/compile/compile.c, build_identity), so a bundle
# from it is the bundle a cold compile makes, and sharing changes nothing
# but time.  The scripts that count compiles or hits (cluster.sh,
# cluster_lease.sh, tune.sh, torch.sh) keep a fresh cache each.  Longest
# scripts start first, by the times the last run wrote to
# $APOLLO_BUILD/script-times.
cd "$(dirname "$0")/.." || exit 1
# Host kernels without their x86-64-v3 clone (hostcc.c): half the cc time,
# the same values; demo.sh runs the README's job with them, as users do.
export APOLLO_HOST_CLONES="${APOLLO_HOST_CLONES:-0}"
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
if [ "$1" = -P ]; then
	jobs=$2
	shift 2
fi
[ $# -gt 0 ] || set -- tests/*.sh
APOLLO_BUILD=${APOLLO_BUILD:-$(pwd)/build}
export APOLLO_BUILD
SHARED="conformance differential fusion_levels onnx_ops explain_html run_model"
if [ -z "$APOLLO_TEST_CACHE" ]; then
	rm -rf "$APOLLO_BUILD/test-cache"
	mkdir -p "$APOLLO_BUILD/test-cache" && chmod 700 "$APOLLO_BUILD/test-cache"
	RS_CACHE=$APOLLO_BUILD/test-cache/cache.db
else
	RS_CACHE=$APOLLO_TEST_CACHE
fi
unset APOLLO_TEST_CACHE
RS_DIR=$(mktemp -d "${TMPDIR:-/tmp}/apollo-scripts.XXXXXX")
trap 'rm -rf "$RS_DIR"' EXIT
RS_TIME=
[ -x /usr/bin/time ] && RS_TIME=/usr/bin/time
export RS_DIR RS_TIME RS_CACHE SHARED
times=$APOLLO_BUILD/script-times

for s in "$@"; do
	[ -f "$s" ] || continue
	t=$(cat "$times" tests/expected-times 2>/dev/null | awk -v n="$(basename "$s" .sh)" '$1 == n { print $2 }' | head -1)
	echo "${t:-1000000} $s"
done | sort -s -k1,1nr | cut -d' ' -f2- >"$RS_DIR/order"

# shellcheck disable=SC2016
xargs -P "$jobs" -I{} sh -c '
	s=$1; n=$(basename "$s" .sh); o=$RS_DIR/$n
	case " $SHARED " in
	*" $n "*) export APOLLO_TEST_CACHE=$RS_CACHE ;;
	esac
	s0=$(date +%s.%N)
	if [ -n "$RS_TIME" ]; then
		"$RS_TIME" -f "%U %S" -o "$o.cpu" sh "$s" >"$o.out" 2>&1
	else
		sh "$s" >"$o.out" 2>&1
	fi
	rc=$?
	s1=$(date +%s.%N)
	wall=$(echo "$s0 $s1" | awk "{ printf \"%.1f\", \$2 - \$1 }")
	cpu=
	[ -s "$o.cpu" ] && cpu=$(tail -1 "$o.cpu" | awk "NF == 2 { printf \", %.1f s CPU\", \$1 + \$2 }")
	{
		echo "== $s"
		cat "$o.out"
		if [ $rc -eq 0 ]; then
			echo "== $s: passed ($wall s$cpu)"
		else
			echo "FAILED: $s (exit $rc, $wall s$cpu)"
		fi
	} >"$o.report"
	echo "$rc" >"$o.result"
	echo "$n $wall" >"$o.time"
	flock "$RS_DIR/lock" cat "$o.report"
' sh {} <"$RS_DIR/order"

pass=0; fail=0
while read -r s; do
	r=$RS_DIR/$(basename "$s" .sh).result
	if [ -f "$r" ] && [ "$(cat "$r")" -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
done <"$RS_DIR/order"
{
	cat "$RS_DIR"/*.time 2>/dev/null
	[ -f "$times" ] && cat "$times"
} | awk '!seen[$1]++' >"$RS_DIR/times.new" && cp "$RS_DIR/times.new" "$times" 2>/dev/null
echo "scripts: $pass passed, $fail failed"
[ $fail -eq 0 ]
