#!/bin/sh
# bench/compile.sh [TARGET] -- compile time against the NVRTC floor, and
# distinct kernels against depth.
#
# 1. Per model and training step of ../shared/testdata: the daemon's cold
#    compile (a submit with --no-cache: partition, codegen, NVRTC, the
#    daemon's own wall time, compile_ms) and warm answer (the same submit
#    from the cache, the client's round trip), beside the NVRTC floor
#    measured in the same run on the same machine: the same distinct
#    kernels' CUDA C compiled by NVRTC directly (apollo-kernels --floor),
#    as one program per kernel and as one program per worker (as many
#    workers as online CPUs, the daemon's default).
# 2. Transformer encoders of N = 1 ... 32 layers whose weights are ONNX
#    initializers (bench/scale_graph.py --initializers: every layer's
#    biases and LayerNorm weights, constants of the graph, differ): launches,
#    distinct kernels and cold compile time.  Constants of more than 16
#    elements are read from buffers (BUF_CONST), so identical layers share
#    kernels.
# Every submit of 1. and 2. but the warm one is --no-cache; the cold compiles
# of 1. are --no-tune, so that they build the kernels the floor compiles
# (apollo-kernels builds on the default rules; bench/tune.sh compares the
# cold compile with tuning and without); cold compiles
# and floors are the median of REPEAT runs.  Prints numbers, asserts
# nothing.
#   TARGET: default sm_90 when the daemon has NVRTC (the floor needs it),
#   else cpu (then without the floor).
#   env: APOLLO_BUILD, REPEAT (default 3)
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc
PY=python3
[ -x "$REPO/.venv/bin/python" ] && PY=$REPO/.venv/bin/python
KERNELS=$APOLLO_BUILD/apollo-kernels
REPEAT=${REPEAT:-3}
out=$AP_TMP/compile.jsonl
: >"$out"
ap_start >/dev/null
t=$1
if [ -z "$t" ]; then
	case $("$CLIENT" ping) in
	*"NVRTC none"*) t=cpu ;;
	*) t=sm_90 ;;
	esac
fi
for d in $(ap_test_dirs models training); do
	name=$(basename "$d")
	i=0
	while [ $i -lt "$REPEAT" ]; do
		if ! cold=$("$CLIENT" submit "$d/model.onnx" --data "$d" --target "$t" --no-cache --no-tune --json \
			2>"$AP_TMP/err"); then
			echo "compile: $name: $(sed -n 1p "$AP_TMP/err")"
			break
		fi
		floor='""'
		if [ "$t" != cpu ]; then
			f=$("$KERNELS" "$d/model.onnx" --data "$d/test_data_set_0" --target "$t" --floor 2>&1 |
				tail -1)
			floor="\"$f\""
		fi
		printf '{"model":"%s","cold":%s,"floor":%s}\n' "$name" "$cold" "$floor" >>"$out"
		i=$((i + 1))
	done
	"$CLIENT" submit "$d/model.onnx" --data "$d" --target "$t" >/dev/null 2>&1   # fills the cache
	warm=$("$CLIENT" submit "$d/model.onnx" --data "$d" --target "$t" --json 2>/dev/null)
	printf '{"model":"%s","warm":%s}\n' "$name" "${warm:-null}" >>"$out"
done
for n in 1 2 4 8 16 32; do
	"$PY" bench/scale_graph.py $n "$AP_TMP/enc$n.onnx" --initializers || exit 1
	if ! j=$("$CLIENT" submit "$AP_TMP/enc$n.onnx" --target "$t" --no-cache --json 2>"$AP_TMP/err"); then
		echo "compile: encoder $n: $(sed -n 1p "$AP_TMP/err")"
		continue
	fi
	printf '{"layers":%d,"r":%s}\n' "$n" "$j" >>"$out"
done
ap_stop
"$PY" - "$out" "$t" <<'PYEOF'
import json, re, statistics, sys
layers, runs, warm, order = [], {}, {}, []
for line in open(sys.argv[1]):
    e = json.loads(line)
    if "layers" in e:
        layers.append(e)
    elif "warm" in e:
        warm[e["model"]] = e["warm"] or {}
    else:
        if e["model"] not in runs:
            order.append(e["model"])
        runs.setdefault(e["model"], []).append(e)
print("compile time (target %s): the daemon's cold compile beside the NVRTC floor of the same "
      "kernels, same run" % sys.argv[2])
print("(medians of %d runs each)" % max(len(r) for r in runs.values()) if runs else "")
print("%-26s %8s %10s %10s %12s %12s %9s %9s" % (
    "model", "kernels", "cold ms", "warm ms", "floor 1/kern", "floor 1/wkr", "cold/fl1", "cold/flw"))
worst = 0.0
for name in order:
    rs = runs[name]
    cold = statistics.median(r["cold"]["compile_ms"] for r in rs)
    f1s, fws = [], []
    for r in rs:
        m = re.search(r"per kernel ([0-9.]+) ms, one program per worker ([0-9.]+) ms", r["floor"] or "")
        if m:
            f1s.append(float(m.group(1)))
            fws.append(float(m.group(2)))
    f1 = statistics.median(f1s) if f1s else 0.0
    fw = statistics.median(fws) if fws else 0.0
    if fw:
        worst = max(worst, cold / fw)
    print("%-26s %8d %10.1f %10.1f %12s %12s %9s %9s" % (
        name, rs[0]["cold"]["distinct_kernels"], cold, warm.get(name, {}).get("round_trip_ms", 0.0),
        "%.1f" % f1 if f1 else "-", "%.1f" % fw if fw else "-",
        "%.2f" % (cold / f1) if f1 else "-", "%.2f" % (cold / fw) if fw else "-"))
if worst:
    print("largest cold / floor (one program per worker): %.2f" % worst)
print()
print("transformer encoders with initializer weights: distinct kernels against layers (cold)")
print("%7s %9s %9s %10s %10s" % ("layers", "launches", "distinct", "cold ms", "backend ms"))
for e in layers:
    r = e["r"]
    print("%7d %9d %9d %10.1f %10.1f" % (e["layers"], r["kernels"], r["distinct_kernels"],
                                         r["compile_ms"], r["backend_ms"]))
PYEOF
