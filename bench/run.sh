#!/bin/sh
# bench/run.sh [TARGET...] -- cold and warm compile time of every model under
# ../shared/testdata/models, through a real apollod.
#
# For each model and target: a daemon with a fresh, empty cache answers the
# first submit (cold: partition, codegen, NVRTC or cc, cache store) and then
# the same submit WARM_RUNS times (warm: answered from the cache).  Prints,
# per model, cold ms, warm ms (median), their ratio, kernels against
# eager_kernels, and where the cold time went (import, partition, codegen,
# backend, cache, as the daemon measured them).  Times are the client's
# round trip for the submit (the local ONNX import is shown apart: it is
# the same cold or warm).  Then the warm path of the largest model
# (bench/warm.sh: cold and warm submits as whole apollo-client processes,
# the daemon's CPU per warm submit through a kept connection, warm submits
# per second with 1, 4 and 16 clients), the fusion table (bench/fusion.sh: launches
# and modelled bytes at each fusion level, beside onnxruntime's optimized
# graph), the Layer I table (bench/layer1.sh: launches, modelled bytes
# with Layer I off and on, Layer I's time beside NVRTC's), the compile
# table (bench/compile.sh: cold compile beside the NVRTC floor, distinct
# kernels of 1 ... 32-layer encoders), the tuning table (bench/tune.sh: cold
# compile with and without tuning, host run time of tuned and untuned kernels), the
# background tuner's table (bench/autotune.sh: what it compiles, refines and
# times after one cold compile), the scale table (bench/scale.sh: partition and codegen time of
# transformer encoders of 8 ... 512 layers), the GEMM table (bench/gemm.sh:
# the models' GEMM, convolution and attention shapes -- FLOPs, bytes,
# ptxas's registers, spills and shared memory for sm_90, host time beside
# onnxruntime's), the host table (bench/host.sh: every model on target
# cpu beside onnxruntime) and the PyTorch training table
# (bench/torch_train.sh: real models' training steps in eager PyTorch,
# with Inductor and with Apollo, first steps cold and warm, graph breaks).
# Prints numbers, asserts nothing.
# `make bench` runs these through bench/report.sh, which writes their
# tables into docs/benchmarks.md (keep its list in step with this one).
#   TARGET: default sm_90 when the daemon has NVRTC, else cpu.
#   env: APOLLO_BUILD, WARM_RUNS (default 5), BENCH_ONLY_COLD_WARM (1: only
#   the cold and warm table, as bench/report.sh runs it)
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc

WARM_RUNS=${WARM_RUNS:-5}
PY=python3
[ -x "$REPO/.venv/bin/python" ] && PY=$REPO/.venv/bin/python
targets="$*"
out=$AP_TMP/bench.jsonl
: >"$out"
n=0
for d in $(ap_test_dirs models); do
	name=$(basename "$d")
	n=$((n + 1))
	APOLLO_TEST_CACHE=$AP_TMP/cache-$n.db
	export APOLLO_TEST_CACHE
	ap_start >/dev/null
	if [ -z "$targets" ]; then
		case $("$CLIENT" ping) in
		*"NVRTC none"*) targets=cpu ;;
		*) targets=sm_90 ;;
		esac
		echo "bench: target $targets"
	fi
	for t in $targets; do
		i=0
		while [ $i -le "$WARM_RUNS" ]; do
			phase=warm
			[ $i -eq 0 ] && phase=cold
			if ! j=$("$CLIENT" submit "$d/model.onnx" --data "$d" --target "$t" --json 2>"$AP_TMP/err"); then
				echo "bench: $name $t: $(cat "$AP_TMP/err")"
				break
			fi
			printf '{"bench_model":"%s","bench_target":"%s","phase":"%s","result":%s}\n' \
				"$name" "$t" "$phase" "$j" >>"$out"
			i=$((i + 1))
		done
	done
	ap_stop
done
"$PY" bench/summary.py "$out"
[ "${BENCH_ONLY_COLD_WARM:-0}" = 1 ] && exit 0
echo
sh bench/warm.sh ${targets%% *}
echo
sh bench/fusion.sh
echo
sh bench/layer1.sh ${targets%% *}
echo
sh bench/compile.sh ${targets%% *}
echo
sh bench/tune.sh ${targets%% *}
echo
sh bench/autotune.sh
echo
sh bench/scale.sh
echo
sh bench/gemm.sh
echo
sh bench/host.sh
echo
sh bench/torch_train.sh
