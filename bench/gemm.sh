#!/bin/sh
# bench/gemm.sh -- the GEMM table: the GEMM, convolution and attention
# shapes of the models under ../shared/testdata (and a square 4096^3
# MatMul), each as a one-node ONNX model in float32 and float16
# (bench/gemm_shapes.py make).  Per shape and dtype: modelled FLOPs and
# minimum bytes; for sm_90, what ptxas reports through NVRTC (-Xptxas -v,
# build/apollo-kernels --ptxas) for the GEMM / attention kernel --
# registers, spills, shared memory -- and its schedule, float32 with
# --allow-tf32 (tensor cores) and without (SIMT), float16 as is; on target
# cpu, Apollo's run time (apollo-client check --repeat) beside
# onnxruntime's on the same inputs in the same run, for shapes up to
# HOST_MAX_GFLOP.  Where nvidia-smi works, Apollo's time on sm_90 through
# the runtime and PyTorch's (best effort); elsewhere the table says that
# achieved TFLOP/s were not measured.  Without NVRTC the ptxas columns say
# "no NVRTC".  Prints numbers, asserts nothing (the PTX checks are
# tests/check_gemm.c).
#   env: APOLLO_BUILD, REPEAT (default 5), BENCH_THREADS (default 1: Apollo's
#   host runtime and onnxruntime alike), HOST_MAX_GFLOP (default 2)
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc

REPEAT=${REPEAT:-5}
THREADS=${BENCH_THREADS:-1}
HOST_MAX_GFLOP=${HOST_MAX_GFLOP:-2}
KERNELS=$APOLLO_BUILD/apollo-kernels
PY=$REPO/.venv/bin/python
if ! "$PY" -c 'import onnx, onnxruntime, numpy' 2>/dev/null; then
	echo "bench/gemm: needs onnx, onnxruntime and numpy in $REPO/.venv (make deps)"
	exit 1
fi
gpu=
all_data=
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >"$AP_TMP/gpu" 2>&1; then
	gpu=$(head -1 "$AP_TMP/gpu")
	all_data=--all-data
fi
out=$AP_TMP/gemm
if ! "$PY" bench/gemm_shapes.py make "$out" --host-max-gflop "$HOST_MAX_GFLOP" $all_data \
	2>"$AP_TMP/make.err"; then
	echo "bench/gemm: writing the shapes failed:"
	cat "$AP_TMP/make.err"
	exit 1
fi

# static: ptxas's report for sm_90 (one NVRTC compile per distinct kernel)
for d in "$out"/*__*; do
	case $d in
	*__float32) set -- tf32 --allow-tf32 simt "" ;;
	*) set -- f16 "" ;;
	esac
	while [ $# -gt 0 ]; do
		# shellcheck disable=SC2086
		"$KERNELS" "$d/model.onnx" --target sm_90 $2 --ptxas >"$d/ptxas_$1.txt" 2>&1
		# the kernel list: launch shapes, dynamic shared memory, schedule
		# shellcheck disable=SC2086
		"$KERNELS" "$d/model.onnx" --target sm_90 $2 2>&1 |
			grep -E '^/\* ====|emitter |^apollo-kernels' >"$d/list_$1.txt"
		shift 2
	done
done

# tolerances: float32 atol 1e-4 (sums of up to 1024 products of values in
# [-1, 1], added in another order than onnxruntime's), float16 those of
# tests/precision.sh, TF32 (10 bits of mantissa) atol 5e-2
tol32="--rtol 1e-3 --atol 1e-4"
tol16="--rtol 1e-2 --atol 1e-2 --mismatch 0.01"
tol_tf32="--rtol 1e-2 --atol 5e-2 --mismatch 0.01"
ap_start >/dev/null
# host: one folder at a time, each check's line kept in its folder
while read -r d; do
	tol=$tol32
	case $d in *__float16) tol=$tol16 ;; esac
	# shellcheck disable=SC2086
	"$CLIENT" check "$d" --target cpu --threads "$THREADS" --repeat "$REPEAT" $tol \
		>"$d/host.out" 2>&1 </dev/null
done <"$out/host.list"
if [ -n "$gpu" ]; then
	# every shape, through the runtime on the GPU
	# shellcheck disable=SC2086
	while read -r d; do
		case $d in
		*__float32)
			"$CLIENT" check "$d" --target sm_90 --allow-tf32 --repeat "$REPEAT" \
				$tol_tf32 >"$d/gpu_tf32.out" 2>&1 </dev/null
			"$CLIENT" check "$d" --target sm_90 --repeat "$REPEAT" $tol32 \
				>"$d/gpu_simt.out" 2>&1 </dev/null ;;
		*)
			"$CLIENT" check "$d" --target sm_90 --repeat "$REPEAT" $tol16 \
				>"$d/gpu_f16.out" 2>&1 </dev/null ;;
		esac
	done <"$out/data.list"
fi
# the K loop's instruction mix read from SASS (bench/gemm_sass.py, needs
# NVRTC and nvdisasm): HMMA (FFMA) per issued instruction of the 4096^3
# products the daemon builds for sm_90, and the 16-bit and TF32 ones for
# sm_90a (HGMMA: wgmma), float16 also in the TMA form, and the key loop of
# issue 25's attention rows (2048 queries and keys, head dims 128 and 64), also with
# --unvalidated (FlashAttention-3's structure: warp specialised, the overlap and
# ping-pong; the query warpgroups' key loop read here -- no barrier, no LDGSTS;
# the producer's loop holds the UTMALDG) (--tma: warp specialised GEMM, likewise)
export APOLLO_LIB="$APOLLO_BUILD/libapollo-client.so"
for args in "--size 4096" "--size 4096 --dtype bfloat16" "--size 4096 --dtype float32 --allow-tf32" \
	"--size 4096 --dtype float32" "--size 4096 --target sm_90a" "--size 4096 --dtype bfloat16 --target sm_90a" \
	"--size 4096 --dtype float32 --allow-tf32 --target sm_90a" "--size 4096 --target sm_90a --tma" \
	"--size 2048 --attention 128 --target sm_90a" "--size 2048 --attention 64 --heads 16 --target sm_90a" \
	"--size 2048 --attention 128 --target sm_90a --unvalidated" \
	"--size 2048 --attention 64 --heads 16 --target sm_90a --unvalidated" \
	"--size 2048 --attention 128 --target sm_90"; do
	# shellcheck disable=SC2086
	"$PY" bench/gemm_sass.py $args >>"$out/sass.txt" 2>&1 ||
		echo "bench/gemm_sass.py $args: failed (see above)" >>"$out/sass.txt"
done
ap_stop
"$PY" bench/gemm_shapes.py report "$out" --threads "$THREADS" --repeat "$REPEAT" --gpu "$gpu"
echo
echo "K loop of the 4096^3 products and key loop of the attention on sm_90 and sm_90a, from SASS (tensor-core share: HMMA / HGMMA per issued instruction)"
cat "$out/sass.txt"
