#!/bin/sh
# bench/layer1.sh [TARGET] -- what Layer I (polyhedral loop fusion of
# pooling windows, server/fuse/layer1.c) changes, per model and training
# step of ../shared/testdata: launches and modelled global-memory bytes at
# --fusion apollo with Layer I off (--no-layer1: this issue's starting
# point, pooling windows as kernels of their own) and on, side by side, the
# micro-graphs Layer I scheduled and their modelled recomputation, and
# Layer I's time (isl scheduling and its kernels' emission) beside the
# backend's (NVRTC, or cc for cpu) in the same compile.  Every submit is
# --no-cache, so each is a cold compile.  Prints numbers, asserts nothing.
#   TARGET: default sm_90 when the daemon has NVRTC, else cpu.
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc

PY=python3
[ -x "$REPO/.venv/bin/python" ] && PY=$REPO/.venv/bin/python
out=$AP_TMP/layer1.jsonl
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
	for mode in off on; do
		flag=
		[ $mode = off ] && flag=--no-layer1
		# shellcheck disable=SC2086
		if ! j=$("$CLIENT" submit "$d/model.onnx" --data "$d" --target "$t" --no-cache --json $flag \
			2>"$AP_TMP/err"); then
			echo "layer1: $name: $(sed -n 1p "$AP_TMP/err")"
			continue
		fi
		printf '{"model":"%s","mode":"%s","r":%s}\n' "$name" "$mode" "$j" >>"$out"
	done
done
ap_stop
"$PY" - "$out" "$t" <<'PYEOF'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    e = json.loads(line)
    rows.setdefault(e["model"], {})[e["mode"]] = e["r"]
print("Layer I (target %s): launches and modelled global bytes with Layer I off -> on; "
      "Layer I time beside the backend's" % sys.argv[2])
print("%-26s %9s %14s %14s %7s %4s %8s %10s %10s %7s" % (
    "model", "launches", "bytes off", "bytes on", "on/off", "I", "recomp", "layer1 ms",
    "backend ms", "I/back"))
worst = 0.0
for m in sorted(rows):
    r = rows[m]
    if "off" not in r or "on" not in r:
        continue
    a, b = r["off"], r["on"]
    share = b["layer1_ms"] / b["backend_ms"] if b["backend_ms"] > 0 else 0.0
    worst = max(worst, share)
    print("%-26s %4d->%-4d %14d %14d %7.3f %4d %8.3f %10.1f %10.1f %6.1f%%" % (
        m, a["kernels"], b["kernels"], a["global_bytes"], b["global_bytes"],
        b["global_bytes"] / a["global_bytes"] if a["global_bytes"] else 1.0,
        b["layers"]["I"], b["recompute_ratio"], b["layer1_ms"], b["backend_ms"], 100 * share))
print("largest Layer I share of the backend time: %.1f%%" % (100 * worst))
PYEOF
