#!/bin/sh
# bench/warm.sh [--models "MODEL..."|ladder] [TARGET] -- the warm path
# through a real apollod with an empty cache.  Without --models: the
# largest model under ../shared/testdata/models (by the size of its
# model.onnx).  Per model, all in one run:
#
#   1. its cold submit as a whole apollo-client process (the daemon
#      compiles every kernel), then WARM_RUNS warm submits the same way
#      (answered from the cache; median): the cold/warm ratio is what a
#      training job sees at start-up (issue 10 asks >= 20x);
#   2. the daemon's CPU time per warm submit through one kept connection
#      (bench_warm: the sum of its threads' schedstat over CPU_SUBMITS
#      submits; issue 10 asks <= 0.3 ms);
#   3. warm submits answered per second with 1, 4 and 16 clients, each
#      with its own kept connection, RPS_SECONDS each.
# Between 1's cold submit and its warm ones the script waits for the
# daemon to be idle: the background tuner's work after a cold compile is
# not the warm path's.
#
# --models (or $WARM_MODELS) names several models, measured one after the
# other by one daemon, then a table of the daemon's CPU per warm submit
# against the kernels each bundle holds (issue 26, item 2: flat in the
# number of kernels).  A model is a folder holding model.onnx, the name of
# a folder under $TESTDATA/*/ (models, training, onnx-light ...), or a
# name tests/export_models.py exports (resnet18, mobilenet_v2: exported
# into the temporary folder, which needs torch and torchvision in .venv).
# `ladder` is issue 26's ladder: mlp_gelu_ln, resnet18, mobilenet_v2 and
# ppocr_mobile_v2_cls (5, 14, 31 and 51 distinct kernels at sm_90; the
# issue's 51-kernel model, ppocrv4_rec, is not in the test data).
#
# Times of whole processes are from fork to exit (bench_warm process), so
# they include exec, dynamic linking, reading --data and the local import
# of the model's structure.  The kept-connection submits send the graph
# `apollo-client convert` made from the model (the same graph, so the
# same cache key).  Prints numbers, asserts nothing: the machine's other
# load moves them.
#   TARGET: default sm_90 when the daemon has NVRTC, else cpu.
#   env: APOLLO_BUILD, WARM_RUNS (20), CPU_SUBMITS (2000), RPS_SECONDS (2),
#        WARM_MODELS
cd "$(dirname "$0")/.." || exit 1
models=${WARM_MODELS:-}
if [ "$1" = "--models" ]; then
	models=$2
	shift 2
fi
[ "$models" = ladder ] && models="mlp_gelu_ln resnet18 mobilenet_v2 ppocr_mobile_v2_cls"
. tests/daemon.inc

WARM_RUNS=${WARM_RUNS:-20}
CPU_SUBMITS=${CPU_SUBMITS:-2000}
RPS_SECONDS=${RPS_SECONDS:-2}
BENCH=$APOLLO_BUILD/bench_warm
PY=python3
[ -x "$REPO/.venv/bin/python" ] && PY=$REPO/.venv/bin/python
if [ ! -x "$BENCH" ]; then
	echo "missing $BENCH: make $APOLLO_BUILD/bench_warm"
	exit 1
fi

# The folder of model $1 (see above) on stdout; a message and 1 when none.
model_dir() {
	if [ -f "$1/model.onnx" ]; then
		echo "$1"
		return 0
	fi
	for d in "$TESTDATA"/*/"$1"; do
		if [ -f "$d/model.onnx" ]; then
			echo "$d"
			return 0
		fi
	done
	if "$PY" tests/export_models.py --out "$AP_TMP/export" "$1" >"$AP_TMP/export.log" 2>&1 &&
	   [ -f "$AP_TMP/export/$1/model.onnx" ]; then
		echo "$AP_TMP/export/$1"
		return 0
	fi
	echo "bench/warm.sh: no model '$1' (not a folder, not under $TESTDATA, not exported:" \
		"$(tail -1 "$AP_TMP/export.log"))" >&2
	return 1
}

if [ -z "$models" ]; then
	best=-1
	for d in $(ap_test_dirs models); do
		n=$(wc -c <"$d/model.onnx")
		if [ "$n" -gt "$best" ]; then
			best=$n
			models=$d
		fi
	done
	if [ -z "$models" ]; then
		echo "bench/warm.sh: no model under $TESTDATA/models"
		exit 1
	fi
fi

ap_start >/dev/null
t=$1
if [ -z "$t" ]; then
	case $("$CLIENT" ping) in
	*"NVRTC none"*) t=cpu ;;
	*) t=sm_90 ;;
	esac
fi

# The daemon's CPU time so far (clock ticks: user + system).
daemon_ticks() {
	awk '{ print $14 + $15 }' "/proc/$AP_PID/stat" 2>/dev/null || echo 0
}

# Waits (at most 300 s) until the daemon is idle: the background tuner
# refines a cold compile's kernels after the answer (ptxas, seconds of
# CPU), which must not be counted as the warm path's.
wait_idle() {
	i=0 a=$(daemon_ticks)
	while [ $i -lt 600 ]; do
		sleep 0.5
		b=$(daemon_ticks)
		[ $((b - a)) -le 1 ] && return 0
		a=$b i=$((i + 1))
	done
	echo "bench/warm.sh: the daemon is still busy after 300 s; measuring anyway" >&2
}

# Measures model folder $1 and prints its block; a line to $AP_TMP/summary.jsonl.
measure() {
	model=$1
	out=$AP_TMP/warm.jsonl
	: >"$out"
	rm -f "$AP_TMP/cold.json" "$AP_TMP/warm.json"
	set -- "$CLIENT" submit "$model/model.onnx" --data "$model" --target "$t" --json
	# after the cold submit and the tuner, one submit to warm up again (a
	# record the tuner moved retires the bundle: compiled once more)
	if ! "$BENCH" process 1 "$AP_TMP/cold.json" "$@" >>"$out" || ! wait_idle ||
	   ! "$@" >/dev/null ||
	   ! "$BENCH" process "$WARM_RUNS" "$AP_TMP/warm.json" "$@" >>"$out"; then
		echo "bench/warm.sh: a submit of $model failed"
		return 1
	fi
	if ! "$CLIENT" convert "$model/model.onnx" "$AP_TMP/graph.pb" --data "$model" >/dev/null ||
	   ! "$BENCH" "$APOLLO_SOCKET" "$AP_TMP/graph.pb" "$AP_PID" --target "$t" -n "$CPU_SUBMITS" \
		--clients 1 4 16 --seconds "$RPS_SECONDS" >>"$out"; then
		echo "bench/warm.sh: the kept-connection submits failed"
		return 1
	fi
	"$PY" bench/warm.py "$out" "$AP_TMP/cold.json" "$AP_TMP/warm.json" "$(basename "$model")" \
		"$(wc -c <"$model/model.onnx")" "$t" "$AP_TMP/summary.jsonl"
}

rc=0 n=0
for m in $models; do
	d=$(model_dir "$m") || { rc=1; continue; }
	measure "$d" || rc=1
	n=$((n + 1))
done
[ "$n" -gt 1 ] && "$PY" bench/warm.py --table "$AP_TMP/summary.jsonl"
exit $rc
