#!/bin/sh
# progress.sh -- `apollo-client submit --progress` (issue 26, item 4) on a
# private daemon with a fresh cache: a cold compile prints, on stderr and
# not a terminal, one plain line per stage event -- import, partition, the
# fusion layers, codegen, backend DONE/TOTAL kernels up to TOTAL/TOTAL, the
# cache write -- in that order; stdout is the report as without it; a
# submit without --progress prints no progress line; a warm one succeeds
# (events optional); on a terminal (script(1), when installed) the events
# redraw one line; /metrics has the stage latency histograms and the hit
# ratio per cache tier.  env: APOLLO_BUILD, APOLLO_TESTDATA
cd "$(dirname "$0")/.." || exit 1
unset APOLLO_TEST_CACHE   # cold: a cache of its own
. tests/daemon.inc
ap_start --metrics 0 --log-level info >/dev/null
M=$TESTDATA/models/mlp_gelu_ln/model.onnx
[ -f "$M" ] || { echo "progress: no $M"; exit 1; }
fail() { echo "progress: FAIL $*"; cat "$AP_TMP/err"; exit 1; }

"$CLIENT" submit "$M" --progress >"$AP_TMP/out" 2>"$AP_TMP/err" || fail "cold submit --progress"
grep -q "kernels" "$AP_TMP/out" || fail "no report on stdout"
grep -q "^progress:" "$AP_TMP/out" && fail "progress lines on stdout"
# the stages, in order: each one's first line number
last=0
for st in import partition "layer I" codegen backend cache; do
	n=$(grep -n "^progress: ${st}[ (]" "$AP_TMP/err" | head -1 | cut -d: -f1)
	[ -n "$n" ] || fail "no '$st' line"
	[ "$n" -gt "$last" ] || fail "'$st' out of order"
	last=$n
done
grep -Eq "^progress: backend ([0-9]+)/\1 kernels" "$AP_TMP/err" || fail "backend never reached n/n"
cr=$(printf '\r')
grep -q "$cr" "$AP_TMP/err" && fail "a carriage return when stderr is not a terminal"
cold=$(grep -c "^progress:" "$AP_TMP/err")

"$CLIENT" submit "$M" --progress >"$AP_TMP/out" 2>"$AP_TMP/err" || fail "warm submit --progress"
"$CLIENT" submit "$M" --no-cache --namespace p2 >"$AP_TMP/out" 2>"$AP_TMP/err" ||
	fail "cold submit without --progress"
grep -q "progress" "$AP_TMP/err" && fail "progress lines without --progress"

# metrics: a latency histogram per stage (two compiled requests so far)
# and the hit ratio per tier (one of three answers from l1)
port=$(sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$AP_TMP/apollod.log" | head -1)
[ -n "$port" ] || fail "no metrics port in the daemon's log"
if command -v curl >/dev/null 2>&1; then
	curl -sf "http://127.0.0.1:$port/metrics" >"$AP_TMP/metrics.txt" || fail "curl /metrics"
	python3 tests/prom_check.py "$AP_TMP/metrics.txt" \
		--expect 'apollo_stage_duration_seconds_count{stage="import"}=2' \
		--expect 'apollo_stage_duration_seconds_count{stage="backend"}=2' \
		--expect 'apollo_stage_duration_seconds_bucket{stage="cache",le="+Inf"}=2' \
		--expect 'apollo_cache_hit_ratio{of="requests",tier="l1"}=0.333333333' \
		--expect 'apollo_cache_hit_ratio{of="requests",tier="any"}=0.333333333' \
		>"$AP_TMP/err" 2>&1 || fail "metrics"
fi
# on a terminal (script(1) gives one): a line redrawn in place, ended once
tty=no
if command -v script >/dev/null 2>&1; then
	script -qec "'$CLIENT' submit '$M' --progress --namespace tty >/dev/null" /dev/null \
		>"$AP_TMP/err" 2>&1 </dev/null || fail "submit --progress on a terminal"
	grep -q "$cr.*apollo-client: backend" "$AP_TMP/err" || fail "no live line on a terminal"
	grep -q "^progress:" "$AP_TMP/err" && fail "plain lines on a terminal"
	tty=yes
fi
echo "progress: ok ($cold events on a cold compile; terminal checked: $tty)"
