#!/bin/sh
# device_kit.sh -- the device kit rehearsed without a GPU.  Builds the kit
# with tools/device-kit.sh (into a temporary folder), copies it into an
# empty folder as a bare machine would receive it, checks its contents
# (every model and training step in float32, float16 and bfloat16) and that
# every library of its binaries beyond glibc resolves from the kit's lib/
# (ldd with LD_LIBRARY_PATH = kit/lib alone), then runs kit/device-check.sh
# from that folder in a clean environment (no repository, no nvidia-smi)
# against the kit's stand-in driver (APOLLO_LIBCUDA, APOLLO_DEVICE_TARGET=
# sm_90): the summary must show every check compiled, loaded and launched
# through the runtime, numerics reported as not checked, compute-sanitizer
# and PyTorch's timing reported as not available, and RESULT: PASS, with
# logs.tar.gz beside it.  To keep it short the checks run on two folders
# (bert_like_2l, small_convnet_train) and three GEMM / attention shapes;
# DEVICE_KIT_FULL=1 rehearses all of them (minutes more).  Last, without a
# target and without nvidia-smi, device-check.sh must stop at once and say
# why.
#   env: APOLLO_BUILD, APOLLO_TESTDATA, DEVICE_KIT_FULL
cd "$(dirname "$0")/.." || exit 1
REPO=$(pwd)
TESTDATA=${APOLLO_TESTDATA:-../shared/testdata}
PY=$REPO/.venv/bin/python
if ! "$PY" -c 'import onnx, onnxruntime, numpy' 2>/dev/null; then
	echo "device_kit: needs onnx, onnxruntime and numpy in $REPO/.venv (make deps)"
	exit 1
fi
T=$(mktemp -d "${TMPDIR:-/tmp}/device-kit-test.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
trap 'exit 130' INT TERM
fail() { echo "device_kit: FAIL: $*"; exit 1; }
t0=$(date +%s)

# 1. the kit
sh tools/device-kit.sh "$T/built" >"$T/kit.log" 2>&1 || { cat "$T/kit.log"; fail "tools/device-kit.sh failed"; }
grep -E "^device-kit: .*MiB|^  " "$T/kit.log" | sed 's/^/device_kit: /'
t1=$(date +%s)

# 2. onto a "bare machine": an empty folder, nothing of the repository
mkdir -p "$T/machine/kit" "$T/machine/out"
(cd "$T/built" && tar -cf - .) | (cd "$T/machine/kit" && tar -xf -) || fail "copying the kit"
K=$T/machine/kit
for f in device-check.sh KIT_INFO bin/apollod bin/apollo-client bin/tests/check_runtime \
	bin/tests/libcuda-standin.so bench/gemm_device.py bench/gemm_shapes.py; do
	[ -f "$K/$f" ] || fail "the kit has no $f"
done
n=0
for d in "$TESTDATA"/models/*/ "$TESTDATA"/training/*/; do
	[ -f "$d/model.onnx" ] || continue
	b=$(basename "$d"); c=$(basename "$(dirname "$d")")
	for k in "data/$c/$b" "data/prec/float16__$b" "data/prec/bfloat16__$b"; do
		[ -f "$K/$k/model.onnx" ] && [ -d "$K/$k/test_data_set_0" ] || fail "the kit has no $k"
	done
	n=$((n + 1))
done
[ "$n" -ge 8 ] || fail "only $n model folders in $TESTDATA"
echo "device_kit: $n models and training steps, each in float32, float16 and bfloat16"

# 3. libraries: only the kit's lib/ on the path; nothing beyond glibc from elsewhere
for f in apollod apollo-client tests/check_runtime; do
	LD_LIBRARY_PATH=$K/lib ldd "$K/bin/$f" >"$T/ldd" 2>&1 || fail "ldd $f: $(cat "$T/ldd")"
	bad=$(awk -v k="$K/lib/" '$2 == "=>" {
		if ($3 == "not") { print $1 " not found"; next }
		if (index($3, k) == 1) next
		if ($1 ~ /^(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s)\.so/) next
		print $1 " from " $3 }' "$T/ldd")
	[ -z "$bad" ] || fail "$f: not from the kit: $bad"
	echo "device_kit: ldd $f: $(awk -v k="$K/lib/" '$2 == "=>" && index($3, k) == 1' "$T/ldd" | wc -l) libraries from kit/lib, the rest glibc"
done

# 4. the rehearsal: a clean environment in the empty folder.  NVRTC as
# apollod finds it here: the CUDA toolkit's, else the .venv wheel's, which
# apollod looks for beside its executable's grandparent (the machine folder)
cuda=${CUDA_HOME:-/usr/local/cuda}
if ! ls "$cuda"/lib64/libnvrtc.so.* >/dev/null 2>&1; then
	if ls "$REPO"/.venv/lib/python3*/site-packages/nvidia/*/lib/libnvrtc.so.* >/dev/null 2>&1; then
		ln -s "$REPO/.venv" "$T/machine/.venv"
	else
		echo "device_kit: SKIPPED the rehearsal: no NVRTC here (no CUDA toolkit at $cuda, no nvidia-cuda-nvrtc wheel in .venv; make deps)"
		exit 0
	fi
fi
models="bert_like_2l small_convnet_train"
shapes=bert_qkv,bert_attention,convnet_fwd
tuned=bert_qkv,bert_attention   # variant tuned: the background tuner timing on the stand-in
[ -n "${DEVICE_KIT_FULL-}" ] && { models=; shapes=; }
cd "$T/machine" || exit 1
env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME="$T/machine" CUDA_HOME="$cuda" \
	TMPDIR="$T/machine" LD_LIBRARY_PATH="$K/lib" APOLLO_LIBCUDA="$K/bin/tests/libcuda-standin.so" \
	APOLLO_DEVICE_TARGET=sm_90 DEVICE_CHECK_PYTHON="$PY" DEVICE_CHECK_MODELS="$models" \
	DEVICE_CHECK_GEMM_SHAPES="$shapes" DEVICE_CHECK_TUNED_SHAPES="$tuned" DEVICE_CHECK_REPEAT=3 \
	timeout -k 10 900 sh kit/device-check.sh out >"$T/check.log" 2>&1
rc=$?
cd "$REPO" || exit 1
S=$T/machine/out/summary.txt
[ -f "$S" ] || { cat "$T/check.log"; fail "no summary.txt (device-check.sh exited $rc)"; }
sed 's/^/device_kit: | /' "$S"
[ $rc -eq 0 ] || fail "device-check.sh exited $rc"
[ -s "$T/machine/out/logs.tar.gz" ] || fail "no logs.tar.gz"
tar -tzf "$T/machine/out/logs.tar.gz" >"$T/logs" || fail "logs.tar.gz does not list"
for f in logs/apollod.log logs/check_none.txt logs/check_bfloat16.txt logs/summary.txt logs/ldd.txt; do
	grep -qx "$f" "$T/logs" || fail "logs.tar.gz has no $f"
done
[ "$(ls "$T/machine/out" | wc -l)" -eq 2 ] || fail "out/ holds more than summary.txt and logs.tar.gz: $(ls "$T/machine/out")"
expect() { grep -Eq -- "$1" "$S" || fail "summary lacks: $1"; }
expect "mode rehearsal"
expect "target: sm_90 \(from APOLLO_DEVICE_TARGET\)"
expect "numerics: NOT checked"
expect "libraries: 7 of apollod's from the kit's lib/, 0 not found"
expect "check_runtime \[gpu\]: PASS"
expect "compute-sanitizer: not (available|run in a rehearsal)"
expect "PyTorch: not available"
expect "gemm checks: 31 ok, 0 failed, of 31"
# variant tuned: two shapes x float16 / bfloat16 built from measured records
for t in bert_qkv__float16 bert_qkv__bfloat16 bert_attention__float16 bert_attention__bfloat16; do
	expect "^tuned $t: .*kernels from records \([1-9][0-9]* measured\)"
done
expect "^tuned: background tuner: 4 requests, .* [1-9][0-9]* measured records; 0 dropped, 0 failed"
expect "RESULT: PASS \(rehearsal mode, numerics not checked\)"
nm=$(echo "$models" | wc -w); [ "$nm" -gt 0 ] || nm=$n
expect "models: $((nm * 10)) LOAD, 0 failed or not run, of $((nm * 10))"
for m in ${models:-bert_like_2l}; do
	grep -Eq "^$m( +LOAD){10} *\$" "$S" || fail "the table's row for $m is not all LOAD (10 columns)"
done
t2=$(date +%s)

# 5. no target and no nvidia-smi: a clear refusal, at once
env -i PATH=/usr/bin:/bin TMPDIR="$T" timeout 60 sh "$K/device-check.sh" "$T/out2" >"$T/refuse.log" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "device-check.sh without a GPU or target exited $rc"
grep -q "no GPU: nvidia-smi -L fails or is missing" "$T/out2/summary.txt" ||
	fail "the refusal does not say why: $(cat "$T/refuse.log")"
echo "device_kit: without a GPU or stand-in: refused ($(grep FATAL "$T/out2/summary.txt" | cut -c1-90)...)"
echo "device_kit: PASS (kit built in $((t1 - t0)) s, rehearsal $((t2 - t1)) s)"
