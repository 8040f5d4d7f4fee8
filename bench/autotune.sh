#!/bin/sh
# bench/autotune.sh [TARGET] -- what the daemon's background tuner does
# after a cold compile (server/compile/autotune.c).
#
# Per model and training step of ../shared/testdata, a daemon with a fresh
# cache compiles the graph for TARGET once (its kernels searched), then the
# background tuner runs: the candidates of every searched kernel compiled
# with ptxas -v and re-priced (tune_refine), and, where this host has a
# GPU (a CUDA driver and device), timed there (tune_measure).  Printed per
# graph: kernels searched by the compile, the background tuner's wall time
# (until its job is done, polled every 0.1 s), candidates compiled, records
# refined and of those whose choice moved, candidates timed and measured
# records stored, and how the next compile of the graph took its kernels.
# Prints numbers, asserts nothing.
#   TARGET: default sm_90 (the tuner works for GPU targets only).
#   env: APOLLO_BUILD
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc
PY=python3
[ -x "$REPO/.venv/bin/python" ] && PY=$REPO/.venv/bin/python
t=${1:-sm_90}
out=$AP_TMP/autotune.jsonl
: >"$out"

bg() {   # bg EVENT: the background tuner's counter from stats --json
	"$CLIENT" stats --json | "$PY" -c "
import json, sys
for f in json.load(sys.stdin)['metrics'].values():
    for s in f['samples']:
        if s['name'] == 'apollo_tuning_background_total' and s['labels'] == {'event': '$1'}:
            print('%d' % s['value'])"
}

n=0
for d in $(ap_test_dirs models training); do
	name=$(basename "$d")
	n=$((n + 1))
	APOLLO_TEST_CACHE=$AP_TMP/cache-$n.db
	export APOLLO_TEST_CACHE
	ap_start >/dev/null
	if ! first=$("$CLIENT" submit "$d/model.onnx" --data "$d" --target "$t" --json 2>"$AP_TMP/err"); then
		echo "autotune: $name: $(sed -n 1p "$AP_TMP/err")"
		ap_stop
		continue
	fi
	t0=$(date +%s.%N)
	i=0
	while [ "$(bg job)" -lt 1 ] && [ "$(bg dropped)" -lt 1 ] && [ $i -lt 6000 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	t1=$(date +%s.%N)
	second=$("$CLIENT" submit "$d/model.onnx" --data "$d" --target "$t" --json 2>/dev/null || echo null)
	printf '{"model":"%s","first":%s,"second":%s,"s":%s,"compiled":%s,"refined":%s,"moved":%s,"timed":%s,"measured":%s,"failed":%s}\n' \
		"$name" "$first" "$second" "$(awk "BEGIN { printf \"%.2f\", $t1 - $t0 }")" "$(bg compiled)" "$(bg refined)" \
		"$(bg moved)" "$(bg timed)" "$(bg measured)" "$(bg failed)" >>"$out"
	ap_stop
done
"$PY" - "$out" "$t" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"bench/autotune: target {sys.argv[2]}; the background tuner after one cold compile")
print(f"{'graph':28} {'searched':>8} {'bg s':>6} {'compiled':>8} {'refined':>7} {'moved':>5} "
      f"{'timed':>5} {'measured':>8}  next compile")
for r in rows:
    f, s = r["first"]["tuning"], r["second"]
    if not s:
        nxt = "-"
    elif s["cache"] == "hit":
        nxt = "cache hit (no record moved, no measurement: the bundle stands)"
    else:
        nxt = (f"recompiled: {s['tuning']['hits']} kernels from records "
               f"({s['tuning']['measured']} measured), {s['tuning']['searched']} searched")
    print(f"{r['model']:28} {f['searched']:8d} {r['s']:6.1f} {r['compiled']:8d} {r['refined']:7d} "
          f"{r['moved']:5d} {r['timed']:5d} {r['measured']:8d}  {nxt}"
          + (f"  ({r['failed']} failed)" if r["failed"] else ""))
EOF
