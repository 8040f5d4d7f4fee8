#!/bin/sh
# bench/tune.sh [TARGET] -- what tuning costs and what it buys.
#
# 1. Per model and training step of ../shared/testdata: the daemon's cold
#    compile for TARGET with tuning at its default budget (tune_budget_evals)
#    and without (--no-tune), both --no-cache (no record read: every tuned
#    kernel searched), the median of REPEAT each, with the ratio, the kernels
#    searched, the configurations evaluated and the search time.
# 2. On the host target, bert_like_2l and squeezenet1_1 run tuned and
#    untuned (apollo-client check --repeat REPEAT_RUN, one thread; the
#    median of the timed runs), alternating, twice each, with the ratio
#    tuned / untuned.
# Prints numbers, asserts nothing.
#   TARGET: default sm_90 when the daemon has NVRTC, else cpu.
#   env: APOLLO_BUILD, REPEAT (default 3), REPEAT_RUN (default 10)
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc
PY=python3
[ -x "$REPO/.venv/bin/python" ] && PY=$REPO/.venv/bin/python
REPEAT=${REPEAT:-3}
REPEAT_RUN=${REPEAT_RUN:-10}
ap_start >/dev/null
t=$1
if [ -z "$t" ]; then
	case $("$CLIENT" ping) in
	*"NVRTC none"*) t=cpu ;;
	*) t=sm_90 ;;
	esac
fi
out=$AP_TMP/tune.jsonl
: >"$out"
for d in $(ap_test_dirs models training); do
	name=$(basename "$d")
	for mode in tuned untuned; do
		flag=
		[ $mode = untuned ] && flag=--no-tune
		i=0
		while [ $i -lt "$REPEAT" ]; do
			if j=$("$CLIENT" submit "$d/model.onnx" --data "$d" --target "$t" --no-cache $flag \
				--json 2>"$AP_TMP/err"); then
				printf '{"model":"%s","mode":"%s","r":%s}\n' "$name" "$mode" "$j" >>"$out"
			else
				echo "tune: $name: $(sed -n 1p "$AP_TMP/err")"
			fi
			i=$((i + 1))
		done
	done
done
for m in bert_like_2l squeezenet1_1; do
	d=$TESTDATA/models/$m
	[ -d "$d" ] || continue
	for round in 1 2; do
		for mode in tuned untuned; do
			flag=
			[ $mode = untuned ] && flag=--no-tune
			ms=$("$CLIENT" check "$d" --target cpu --threads 1 --repeat "$REPEAT_RUN" $flag 2>&1 |
				sed -n 's/.*run \([0-9.]*\) ms median.*/\1/p')
			printf '{"run":"%s","mode":"%s","ms":%s}\n' "$m" "$mode" "${ms:-null}" >>"$out"
		done
	done
done
ap_stop
"$PY" - "$out" "$t" "$REPEAT" "$REPEAT_RUN" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
target, rep, rep_run = sys.argv[2], sys.argv[3], sys.argv[4]
print(f"bench/tune: target {target}; cold compile (--no-cache, median of {rep}) with tuning at its "
      f"default budget and with --no-tune")
print(f"{'model':28} {'tuned ms':>9} {'untuned':>9} {'ratio':>6} {'searched':>8} {'configs':>8} {'search ms':>9}")
names = []
for r in rows:
    if "model" in r and r["model"] not in names:
        names.append(r["model"])
for n in names:
    tu = [r["r"] for r in rows if r.get("model") == n and r["mode"] == "tuned"]
    un = [r["r"] for r in rows if r.get("model") == n and r["mode"] == "untuned"]
    if not tu or not un:
        continue
    a = statistics.median(x["compile_ms"] for x in tu)
    b = statistics.median(x["compile_ms"] for x in un)
    t0 = tu[0]["tuning"]
    print(f"{n:28} {a:9.0f} {b:9.0f} {a / b:6.2f} {t0['searched']:8d} {t0['candidates']:8d} "
          f"{statistics.median(x['tuning']['ms'] for x in tu):9.1f}")
print()
print(f"host run time (target cpu, 1 thread, median of {rep_run} runs; two rounds, alternating)")
print(f"{'model':16} {'tuned ms':>9} {'untuned':>9} {'ratio':>6}")
for m in ("bert_like_2l", "squeezenet1_1"):
    tu = [r["ms"] for r in rows if r.get("run") == m and r["mode"] == "tuned" and r["ms"] is not None]
    un = [r["ms"] for r in rows if r.get("run") == m and r["mode"] == "untuned" and r["ms"] is not None]
    if tu and un:
        a, b = min(tu), min(un)
        print(f"{m:16} {a:9.2f} {b:9.2f} {a / b:6.3f}")
EOF
