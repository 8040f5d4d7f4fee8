#!/bin/sh
# bench/fusion.sh [TARGET] -- the fusion table: for every model under
# ../shared/testdata/models and training/, at each fusion level (none,
# rules, apollo), what the compiler reports -- kernel launches, eager
# kernels, modelled global-memory bytes of the plan, of one kernel per
# imported node (eager) and the floor (min: inputs, parameters, outputs
# once) -- with the ratios launches/eager and global/min; beside them, from
# the same run, the node count of onnxruntime's own optimized graph
# (bench/fusion.py).  Prints numbers, asserts nothing (the value checks are
# tests/fusion_levels.sh).
#   TARGET: default cpu (the figures come from the partition, not the backend)
#   env: APOLLO_BUILD
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc

target=${1:-cpu}
PY=python3
[ -x "$REPO/.venv/bin/python" ] && PY=$REPO/.venv/bin/python
out=$AP_TMP/fusion.jsonl
: >"$out"
ap_start >/dev/null
echo "bench/fusion: target $target"
for d in $(ap_test_dirs models training); do
	for lv in none rules apollo; do
		if ! j=$("$CLIENT" submit "$d/model.onnx" --data "$d" --target "$target" --fusion "$lv" --json 2>"$AP_TMP/err"); then
			echo "bench/fusion: $(basename "$d") --fusion $lv: $(cat "$AP_TMP/err")"
			continue
		fi
		printf '{"dir":"%s","level":"%s","result":%s}\n' "$d" "$lv" "$j" >>"$out"
	done
done
ap_stop
"$PY" bench/fusion.py "$out"
