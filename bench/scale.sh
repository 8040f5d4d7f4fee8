#!/bin/sh
# bench/scale.sh [LAYERS...] -- compile time against graph size: transformer
# encoders of 8 ... 512 layers (bench/scale_graph.py, each layer shaped like
# bert_like_2l), each submitted once per repetition to one apollod with
# --no-cache.  Prints, per size, the imported nodes, the launches, the
# daemon's own partition_ms (expand + partition) and codegen_ms (lowering,
# printing, launch plan; the backend compiler excluded) -- the fastest of
# the repetitions, the one least disturbed by other load -- their sum per
# node, and the ratio
# time(512) / time(64) of partition + codegen (8x the nodes: near 8 when
# the time grows linearly).  Prints numbers, asserts nothing.
#   LAYERS: default 8 16 32 64 128 256 512
#   env: APOLLO_BUILD, SCALE_REPS (default 7), SCALE_TARGET (default cpu:
#   identical layers share their kernels, so the host compiler builds a
#   dozen whatever the size)
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc

REPS=${SCALE_REPS:-7}
TARGET=${SCALE_TARGET:-cpu}
PY=$REPO/.venv/bin/python
if [ ! -x "$PY" ]; then
	echo "bench/scale: needs .venv (make deps) for onnx"
	exit 1
fi
sizes=${*:-8 16 32 64 128 256 512}
out=$AP_TMP/scale.jsonl
: >"$out"
for n in $sizes; do
	if ! "$PY" bench/scale_graph.py "$n" "$AP_TMP/encoder_$n.onnx"; then
		echo "bench/scale: generating $n layers failed"
		exit 1
	fi
done
# the 512-layer encoder's compile is estimated at about 1.1 GiB, over the
# default max_compile_memory (1 GiB): a limit that holds the largest size
ap_start --max-compile-memory 4G >/dev/null
echo "bench/scale: target $TARGET, fastest of $REPS repetitions"
# the sizes in turn, REPS times over, so that other load on the machine
# falls on every size alike
i=0
while [ $i -lt "$REPS" ]; do
	for n in $sizes; do
		if ! j=$("$CLIENT" submit "$AP_TMP/encoder_$n.onnx" --target "$TARGET" --json --no-cache \
			2>"$AP_TMP/err"); then
			echo "bench/scale: $n layers: $(cat "$AP_TMP/err")"
			continue
		fi
		printf '{"layers":%d,"result":%s}\n' "$n" "$j" >>"$out"
	done
	i=$((i + 1))
done
ap_stop
"$PY" bench/scale.py "$out"
