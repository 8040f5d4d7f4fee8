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
# Every submit of 1. and 2. but the warm one is --no-cache.  Prints numbers,
# asserts nothing.
#   TARGET: default sm_90 when the daemon has NVRTC (the floor needs it),
#   else cpu (then without the floor).
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc
PY=python3
[ -x "$REPO/.venv/bin/python" ] && PY=$REPO/.venv/bin/python
KERNELS=$APOLLO_BUILD/apollo-kernels
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
	if ! cold=$("$CLIENT" submit "$d/model.onnx" --data "$d" --target "$t" --no-cache --json \
		2>"$AP_TMP/err"); then
		echo "compile: $name: $(sed -n 1p "$AP_TMP/err")"
		continue
	fi
	"$CLIENT" submit "$d/model.onnx" --data "$d" --target "$t" >/dev/null 2>&1   # fills the cache
	warm=$("$CLIENT" submit "$d/model.onnx" --data "$d" --target "$t" --json 2>/dev/null)
	floor='""'
	if [ "$t" != cpu ]; then
		f=$("$KERNELS" "$d/model.onnx" --data "$d/test_data_set_0" --target "$t" --floor 2>&1 | tail -1)
		floor="\"$f\""
	fi
	printf '{"model":"%s","cold":%s,"warm":%s,"floor":%s}\n' "$name" "$cold" "${warm:-null}" \
		"$floor" >>"$out"
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
import json, re, sys
models, layers = [], []
for line in open(sys.argv[1]):
    e = json.loads(line)
    (layers if "layers" in e else models).append(e)
print("compile time (target %s): the daemon's cold compile beside the NVRTC floor of the same "
      "kernels, same run" % sys.argv[2])
print("%-26s %8s %10s %10s %12s %12s %9s %9s" % (
    "model", "kernels", "cold ms", "warm ms", "floor 1/kern", "floor 1/wkr", "cold/fl1", "cold/flw"))
for e in models:
    c, w = e["cold"], e["warm"] or {}
    m = re.search(r"per kernel ([0-9.]+) ms, one program per worker ([0-9.]+) ms", e["floor"] or "")
    f1, fw = (float(m.group(1)), float(m.group(2))) if m else (0.0, 0.0)
    print("%-26s %8d %10.1f %10.1f %12s %12s %9s %9s" % (
        e["model"], c["distinct_kernels"], c["compile_ms"], w.get("round_trip_ms", 0.0),
        "%.1f" % f1 if f1 else "-", "%.1f" % fw if fw else "-",
        "%.2f" % (c["compile_ms"] / f1) if f1 else "-",
        "%.2f" % (c["compile_ms"] / fw) if fw else "-"))
print()
print("transformer encoders with initializer weights: distinct kernels against layers (cold)")
print("%7s %9s %9s %10s %10s" % ("layers", "launches", "distinct", "cold ms", "backend ms"))
for e in layers:
    r = e["r"]
    print("%7d %9d %9d %10.1f %10.1f" % (e["layers"], r["kernels"], r["distinct_kernels"],
                                         r["compile_ms"], r["backend_ms"]))
PYEOF
