#!/bin/sh
# device-check.sh OUTDIR -- the device kit's one command (tools/device-kit.sh
# copies this file into the kit).  On a bare GPU machine, from the kit alone
# (its bin/, lib/, data/ and bench/; nothing installed, nothing downloaded):
#   1. starts bin/apollod (LD_LIBRARY_PATH = the kit's lib/ first, a cache in
#      a temporary folder, no background tuning) and reads the device's
#      target: $APOLLO_DEVICE_TARGET, else nvidia-smi's compute_cap (9.0 ->
#      sm_90);
#   2. check_runtime's gpu tests (a PTX bundle through the driver API; on
#      Hopper a hand-built TMA + mbarrier kernel whose boxes must equal the
#      host's emulation: swizzle, zero fill, complete-tx of a filled box);
#   3. tests/gpu.sh's checks at that target with apollo-client check: every
#      model and training step of data/ at --fusion none, rules and apollo
#      (rtol 1e-3, atol 1e-5), float32 with --allow-tf32 (rtol 1e-2, atol
#      5e-2, 1% outside), and their float16 (rtol/atol 1e-2) and bfloat16
#      (5e-2) variants (made by tools/convert_precision.py when the kit was
#      built), 1% of an output's elements allowed outside for the 16-bit ones;
#      on sm_90 (Hopper) the 16-bit and TF32 variants again for sm_90a, whose
#      GEMM and convolution kernels run on wgmma (columns f16_90a, bf16_90a,
#      tf32_90a);
#   4. bench/gemm.sh's GEMM and attention shapes in float32, float16 and
#      bfloat16 (bench/gemm_device.py makes them here with numpy, references
#      from PyTorch in float64): checked, then timed one at a time (check
#      --repeat N --profile) beside PyTorch's torch.matmul / conv2d /
#      F.scaled_dot_product_attention (on sm_90 the 16-bit shapes also for
#      sm_90a: variant wg, and with --unvalidated: variant new; the float32
#      ones with --allow-tf32 for sm_90a: variant wg_tf32; issue 25's
#      rows -- square 2048^3 to 8192^3, attention at 2048 keys -- also
#      variant tuned: built by a second apollod whose background tuner
#      measures every kernel's candidates on the device first);
#   5. every model's bundle (float32, --fusion apollo) under compute-sanitizer
#      memcheck, racecheck and synccheck, the models of a tool in parallel,
#      each run under a time limit; with too little time left, one model per
#      tool (named in the summary).
# Writes OUTDIR/summary.txt (pass/fail per model x fusion level x dtype,
# sanitizer findings, GEMM/attention TFLOP/s beside PyTorch's, each step's
# time) and OUTDIR/logs.tar.gz, prints the summary, and exits 0 only when
# everything passed.  Every step runs under `timeout`; the whole stays within
# $DEVICE_CHECK_BUDGET_S seconds (default 420), later steps shortened or
# skipped (said so) when earlier ones ran long.
#
# Rehearsal (no GPU): with APOLLO_LIBCUDA naming the kit's stand-in driver
# (bin/tests/libcuda-standin.so), which launches nothing, every bundle is
# compiled, loaded and launched through the runtime but numerics are not
# checked (the summary says so: LOAD instead of PASS); the target must come
# from APOLLO_DEVICE_TARGET; compute-sanitizer and PyTorch's timing are
# reported 'not available' when absent.
#   env: APOLLO_DEVICE_TARGET (sm_90, ...), DEVICE_CHECK_MODE (device |
#        rehearsal; default: rehearsal when APOLLO_LIBCUDA names a stand-in),
#        DEVICE_CHECK_BUDGET_S, DEVICE_CHECK_JOBS (parallel checks, default
#        half the CPUs, 2 to 8), DEVICE_CHECK_PYTHON (default python3: numpy,
#        and torch for the references and timing), DEVICE_CHECK_MODELS (names
#        of data/ folders, default all), DEVICE_CHECK_GEMM_SHAPES (comma-
#        separated names from bench/gemm_shapes.py, default all), DEVICE_CHECK_REPEAT
#        (timed runs per GEMM shape, default 20), DEVICE_CHECK_TUNED_SHAPES
#        (the shapes of variant tuned, default issue 25's rows; empty for
#        none), DEVICE_CHECK_SANITIZE_S
#        (time limit of one sanitizer run, default 90)
KIT=$(cd "$(dirname "$0")" && pwd) || exit 1
if [ $# -ne 1 ]; then
	echo "usage: device-check.sh OUTDIR   (writes OUTDIR/summary.txt and OUTDIR/logs.tar.gz)" >&2
	exit 2
fi
mkdir -p "$1" && OUTDIR=$(cd "$1" && pwd) || { echo "device-check: cannot use $1" >&2; exit 2; }
T0=$(date +%s)
BUDGET=${DEVICE_CHECK_BUDGET_S:-420}
W=$(mktemp -d "${TMPDIR:-/tmp}/device-check.XXXXXX") || exit 1
LOGS=$W/logs
mkdir -p "$LOGS"
SUM=$W/summary.txt
RES=$W/results          # "row column status" per check
STEPS=$W/steps
: >"$SUM"; : >"$RES"; : >"$STEPS"
FAILS=0
AP_PID=

ORIG_LD=${LD_LIBRARY_PATH-}
export LD_LIBRARY_PATH="$KIT/lib${ORIG_LD:+:$ORIG_LD}"
export APOLLO_SOCKET="$W/apollod.sock"
APOLLOD=$KIT/bin/apollod
CLIENT=$KIT/bin/apollo-client
PY=${DEVICE_CHECK_PYTHON:-python3}
REPEAT=${DEVICE_CHECK_REPEAT:-20}
ncpu=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
JOBS=${DEVICE_CHECK_JOBS:-$((ncpu / 2))}
[ "$JOBS" -ge 2 ] 2>/dev/null || JOBS=2
[ "$JOBS" -le 8 ] || JOBS=8

say() { echo "$*" | tee -a "$SUM"; }
now() { date +%s; }
left() { echo $((BUDGET - ($(now) - T0))); }
# host tools (nvidia-smi, python) see the machine's own library path, not
# the kit's: `host CMD`, or `tmo N env "$HOSTLD" CMD`
HOSTLD="LD_LIBRARY_PATH=$ORIG_LD"
host() { env "$HOSTLD" "$@"; }
# tmo SECONDS CMD...: CMD under timeout, shortened to the budget left
# (less a reserve for the summary); 124 at once when none is left
tmo() {
	_tmo_t=$1; shift
	_tmo_l=$(($(left) - 15))
	[ "$_tmo_l" -lt "$_tmo_t" ] && _tmo_t=$_tmo_l
	if [ "$_tmo_t" -lt 5 ]; then
		echo "device-check: not run, time budget spent: $*" >&2
		return 124
	fi
	timeout -k 5 "$_tmo_t" "$@"
}
step() { STEP=$1; STEP_T=$(now); echo "== $1" >&2; }
step_end() { echo "$STEP $1 $(($(now) - STEP_T))s" >>"$STEPS"; }

stop_daemon() {
	[ -n "$AP_PID" ] || return 0
	kill -TERM "$AP_PID" 2>/dev/null
	i=0
	while kill -0 "$AP_PID" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
	kill -KILL "$AP_PID" 2>/dev/null
	wait "$AP_PID" 2>/dev/null
	AP_PID=
}
finish() {
	stop_daemon
	cp "$SUM" "$LOGS/summary.txt" 2>/dev/null
	cp "$SUM" "$OUTDIR/summary.txt"
	tar -czf "$OUTDIR/logs.tar.gz" -C "$W" logs 2>/dev/null ||
		echo "device-check: could not write $OUTDIR/logs.tar.gz" >&2
	rm -rf "$W"
}
trap finish EXIT
trap 'exit 130' INT TERM
fatal() {
	say "device-check: FATAL: $*"
	say "RESULT: FAIL (stopped early)"
	exit 1
}

# ---- mode, device, target -----------------------------------------------------------------
MODE=${DEVICE_CHECK_MODE:-}
if [ -z "$MODE" ]; then
	case ${APOLLO_LIBCUDA-} in *standin*) MODE=rehearsal ;; *) MODE=device ;; esac
fi
case $MODE in device|rehearsal) ;; *) fatal "DEVICE_CHECK_MODE=$MODE: device or rehearsal" ;; esac
say "device-check: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), kit $(cat "$KIT/KIT_INFO" 2>/dev/null | head -1), mode $MODE, budget ${BUDGET}s, $ncpu CPUs, $JOBS parallel checks"
for f in "$APOLLOD" "$CLIENT"; do
	[ -x "$f" ] || fatal "missing $f: is this a kit made by tools/device-kit.sh?"
done
if [ "$MODE" = device ] && [ -n "${APOLLO_LIBCUDA-}" ]; then
	say "driver: APOLLO_LIBCUDA=$APOLLO_LIBCUDA"
fi
have_smi=
if command -v nvidia-smi >/dev/null 2>&1 && host timeout 30 nvidia-smi -L >"$LOGS/nvidia-smi-L.txt" 2>&1; then
	have_smi=1
	host timeout 30 nvidia-smi >"$LOGS/nvidia-smi.txt" 2>&1
	say "device: $(host timeout 30 nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
else
	say "device: no nvidia-smi answering here"
	[ "$MODE" = device ] &&
		fatal "no GPU: nvidia-smi -L fails or is missing (for a rehearsal without a GPU, set APOLLO_LIBCUDA to the kit's bin/tests/libcuda-standin.so and APOLLO_DEVICE_TARGET)"
fi
if [ -n "${APOLLO_DEVICE_TARGET-}" ]; then
	TARGET=$APOLLO_DEVICE_TARGET
	tsrc="APOLLO_DEVICE_TARGET"
elif [ -n "$have_smi" ]; then
	cc=$(host timeout 30 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
	case $cc in
	[0-9]*.[0-9]*) TARGET=sm_${cc%%.*}${cc#*.}; tsrc="nvidia-smi compute_cap $cc" ;;
	*) fatal "nvidia-smi gave no compute capability ('$cc'); set APOLLO_DEVICE_TARGET (e.g. sm_90)" ;;
	esac
else
	fatal "cannot tell the device's target: no nvidia-smi; set APOLLO_DEVICE_TARGET (e.g. sm_90)"
fi
case $TARGET in sm_[0-9]*) ;; *) fatal "target '$TARGET' is not sm_XX" ;; esac
say "target: $TARGET (from $tsrc)"
if [ "$MODE" = rehearsal ]; then
	say "numerics: NOT checked -- rehearsal against the stand-in driver ($APOLLO_LIBCUDA), which runs no kernel: every bundle is compiled, loaded and launched through the runtime (LOAD = that much passed)"
	TOL32="--atol 1e30"; TOL_TF32=$TOL32; TOL16=$TOL32; TOLBF=$TOL32; OK=LOAD
else
	say "numerics: checked on the device against the reference data"
	TOL32="--atol 1e-5"
	TOL_TF32="--rtol 1e-2 --atol 5e-2 --mismatch 0.01"
	TOL16="--rtol 1e-2 --atol 1e-2 --mismatch 0.01"
	TOLBF="--rtol 5e-2 --atol 5e-2 --mismatch 0.01"
	OK=PASS
fi
say "libraries: $(ldd "$APOLLOD" 2>&1 | awk -v k="$KIT/lib/" 'index($3, k) == 1 { n++ } /not found/ { m++ } END { printf "%d of apollod'"'"'s from the kit'"'"'s lib/, %d not found", n, m }')"
ldd "$APOLLOD" "$CLIENT" >"$LOGS/ldd.txt" 2>&1

# NVRTC: CUDA's own when apollod finds it ($CUDA_HOME or /usr/local/cuda),
# else the first libnvrtc.so.N on this machine
if [ -z "${APOLLO_NVRTC-}" ] && ! ls "${CUDA_HOME:-/usr/local/cuda}"/lib64/libnvrtc.so.1[0-9] >/dev/null 2>&1; then
	f=$(timeout 30 find /usr/local /opt /usr/lib -name 'libnvrtc.so.1[0-9]' 2>/dev/null | head -1)
	[ -n "$f" ] && export APOLLO_NVRTC="$f" && say "NVRTC: $f (APOLLO_NVRTC)"
fi

# wait_daemon PID SOCKET: until apollod PID answers a ping on SOCKET (0),
# or it exits or 30 s pass (1).
wait_daemon() {
	i=0
	while ! APOLLO_SOCKET=$2 timeout 5 "$CLIENT" ping >"$W/ping" 2>&1; do
		i=$((i + 1))
		{ [ $i -gt 150 ] || ! kill -0 "$1" 2>/dev/null; } && return 1
		sleep 0.2
	done
	return 0
}

# tuned_step SHAPES: the variant `tuned` of bench/gemm_device.py (see its
# caller in the GEMM step): a second apollod (its own socket and cache,
# background tuner measuring on the device), per folder a build, the wait
# for its tuner job, a timed check built from the measured records, and a
# summary line with the schedule the records chose.
tuned_step() {
	TS=$W/tuned.sock
	APOLLO_LIBCUBLASLT=off "$APOLLOD" --socket "$TS" --cache "$W/tuned.db" --tune-measure --no-tune-refine \
		>"$LOGS/apollod_tuned.log" 2>&1 &
	TPID=$!
	if ! wait_daemon "$TPID" "$TS"; then
		say "tuned: FAIL: the tuning apollod did not start (logs/apollod_tuned.log)"
		FAILS=$((FAILS + 1))
		return
	fi
	n=0
	for s in $(echo "$1" | tr ',' ' '); do
		for d in "$G/${s}__float16" "$G/${s}__bfloat16"; do
			[ -d "$d" ] || continue
			case $d in *__bfloat16) tol=$TOLBF ;; *) tol=$TOL16 ;; esac
			n=$((n + 1))
			# shellcheck disable=SC2086
			APOLLO_SOCKET=$TS APOLLO_LIBCUBLASLT=off tmo 90 "$CLIENT" check "$d" --target "$WG" --unvalidated $tol \
				>"$d/tuned_build.out" 2>&1 </dev/null
			# its tuner job: finished (or dropped, or failed) once the
			# background tuner's counts reach n
			t_end=$(($(now) + 120))
			while [ "$(now)" -lt "$t_end" ] && [ "$(left)" -gt 60 ]; do
				APOLLO_SOCKET=$TS timeout 10 "$CLIENT" stats >"$W/tstats" 2>&1
				done_n=$(sed -n 's/^background tuner: \([0-9]*\) requests.*; \([0-9]*\) dropped, \([0-9]*\) failed$/\1 \2 \3/p' "$W/tstats" |
					awk '{ print $1 + $2 + $3 }')
				[ -n "$done_n" ] && [ "$done_n" -ge "$n" ] && break
				sleep 1
			done
			# shellcheck disable=SC2086
			APOLLO_SOCKET=$TS APOLLO_LIBCUBLASLT=off tmo 90 "$CLIENT" check "$d" --target "$WG" --unvalidated \
				--repeat "$REPEAT" --profile $tol >"$d/apollo_tuned.out" 2>&1 </dev/null
			APOLLO_SOCKET=$TS APOLLO_LIBCUBLASLT=off tmo 60 "$CLIENT" submit "$d/model.onnx" --target "$WG" \
				--unvalidated --explain -o "$W/tuned.pb" >"$d/tuned_explain.out" 2>&1 </dev/null
			say "tuned ${d##*/}: $(sed -n 's/^ *emitter //p' "$d/tuned_explain.out" | head -1); $(sed -n 's/^tuning: //p' "$d/tuned_explain.out" | head -1)"
		done
	done
	APOLLO_SOCKET=$TS timeout 10 "$CLIENT" stats 2>&1 | grep '^background tuner' | sed 's/^/tuned: /' | tee -a "$SUM"
	kill "$TPID" 2>/dev/null
	wait "$TPID" 2>/dev/null
}

# ---- apollod ------------------------------------------------------------------------------
step daemon
"$APOLLOD" --socket "$APOLLO_SOCKET" --cache "$W/cache.db" --no-tune-measure --no-tune-refine \
	>"$LOGS/apollod.log" 2>&1 &
AP_PID=$!
if ! wait_daemon "$AP_PID" "$APOLLO_SOCKET"; then
	AP_PID=
	tail -20 "$LOGS/apollod.log" | sed 's/^/  apollod: /' >>"$SUM"
	fatal "apollod did not start (its log above; ldd in logs/ldd.txt)"
fi
say "apollod: $(head -1 "$W/ping" | cut -c1-160)"
grep -q "NVRTC none" "$W/ping" && say "apollod: WARNING: no NVRTC (no CUDA toolkit found; set APOLLO_NVRTC to a libnvrtc.so): GPU targets will fail"
step_end ok

# result lines "ROW COLUMN STATUS" from `apollo-client check` output
record() {   # record FILE COLUMN PREFIX-TO-STRIP
	awk -v col="$2" -v pre="$3" -v ok="$OK" '
		$1 == "PASS" || $1 == "FAIL" {
			n = split($2, p, "/"); row = p[n]
			if (pre != "") sub("^" pre, "", row)
			print row, col, ($1 == "PASS" ? ok : "FAIL")
		}' "$1" >>"$RES"
	grep '^FAIL ' "$1" | sed "s|^|  $2: |; s|$KIT/||" >>"$W/faildetail"
}
# check COLUMN PREFIX OUTFILE SECONDS FLAGS... -- DIRS: one apollo-client
# check; folders without a result line are recorded as TIMEOUT
check() {
	col=$1 pre=$2 out=$3 secs=$4; shift 4
	tmo "$secs" "$CLIENT" check --target "${CHECK_TARGET:-$TARGET}" --jobs "$JOBS" --timeout 240 "$@" >"$out" 2>&1
	rc=$?
	record "$out" "$col" "$pre"
	for d in $DIRS_NOW; do
		b=${d##*/}
		awk -v d="$d" '($1 == "PASS" || $1 == "FAIL") && $2 == d { f = 1 } END { exit !f }' "$out" || { echo "${b#"$pre"} $col TIMEOUT" >>"$RES"; echo "  $col: $b: no result (rc $rc: timed out or skipped)" >>"$W/faildetail"; }
	done
	return $rc
}

# ---- check_runtime ------------------------------------------------------------------------
step check_runtime
if [ -x "$KIT/bin/tests/check_runtime" ]; then
	if [ "$MODE" = rehearsal ]; then
		# the stand-in runs no PTX: the gpu tests without a driver (skip / absent-is-an-error)
		tmo 60 env -u APOLLO_LIBCUDA APOLLO_BUILD="$KIT/bin" CK_INCLUDE_TAGS=gpu \
			"$KIT/bin/tests/check_runtime" >"$LOGS/check_runtime.txt" 2>&1
	else
		tmo 60 env APOLLO_BUILD="$KIT/bin" CK_INCLUDE_TAGS=gpu \
			"$KIT/bin/tests/check_runtime" >"$LOGS/check_runtime.txt" 2>&1
	fi
	rc=$?
	st=$(grep -E "^[0-9]+%: Checks" "$LOGS/check_runtime.txt" | head -1)
	sk=$(grep -c SKIPPED "$LOGS/check_runtime.txt")
	if [ $rc -eq 0 ]; then r=PASS; else r=FAIL; FAILS=$((FAILS + 1)); fi
	say "check_runtime [gpu]: $r ($st; $sk skipped$(grep SKIPPED "$LOGS/check_runtime.txt" | head -1 | sed 's/^/: /'))"
	step_end $r
else
	say "check_runtime: not in the kit"
	step_end skipped
fi

# ---- models x fusion level x dtype ----------------------------------------------------------
sel() {   # the kit's folders of data/$1 (filtered by DEVICE_CHECK_MODELS)
	for d in "$KIT/data/$1"/*/; do
		d=${d%/}
		[ -f "$d/model.onnx" ] || continue
		b=${d##*/}; b=${b#float16__}; b=${b#bfloat16__}
		if [ -n "${DEVICE_CHECK_MODELS-}" ]; then
			case " $DEVICE_CHECK_MODELS " in *" $b "*) ;; *) continue ;; esac
		fi
		echo "$d"
	done
}
DIRS32="$(sel models) $(sel training)"
DIRS16=$(sel prec | grep '/float16__')
DIRSBF=$(sel prec | grep '/bfloat16__')
n32=$(echo $DIRS32 | wc -w)
[ "$n32" -gt 0 ] || fatal "no model folders in $KIT/data (DEVICE_CHECK_MODELS=${DEVICE_CHECK_MODELS-})"
: >"$W/faildetail"
for level in none rules apollo; do
	step "fusion $level"
	DIRS_NOW=$DIRS32
	# shellcheck disable=SC2086
	check "$level" "" "$LOGS/check_$level.txt" 150 --fusion "$level" $TOL32 $DIRS32
	step_end rc$?
done
step tf32
DIRS_NOW=$DIRS32
# shellcheck disable=SC2086
check tf32 "" "$LOGS/check_tf32.txt" 120 --allow-tf32 $TOL_TF32 $DIRS32
step_end rc$?
step float16
DIRS_NOW=$DIRS16
# shellcheck disable=SC2086
check float16 float16__ "$LOGS/check_float16.txt" 120 $TOL16 $DIRS16
step_end rc$?
step bfloat16
DIRS_NOW=$DIRSBF
# shellcheck disable=SC2086
check bfloat16 bfloat16__ "$LOGS/check_bfloat16.txt" 120 $TOLBF $DIRSBF
step_end rc$?
# Hopper: the 16-bit graphs again for sm_90a, whose GEMM and convolution
# kernels run on wgmma (the host emulates it from the PTX ISA: this is
# where the emulation meets the hardware)
WG=
[ "$TARGET" = sm_90 ] && WG=sm_90a
if [ -n "$WG" ]; then
	step float16_sm90a
	DIRS_NOW=$DIRS16
	# shellcheck disable=SC2086
	CHECK_TARGET=$WG check f16_90a float16__ "$LOGS/check_float16_sm90a.txt" 120 $TOL16 $DIRS16
	step_end rc$?
	step bfloat16_sm90a
	DIRS_NOW=$DIRSBF
	# shellcheck disable=SC2086
	CHECK_TARGET=$WG check bf16_90a bfloat16__ "$LOGS/check_bfloat16_sm90a.txt" 120 $TOLBF $DIRSBF
	step_end rc$?
	# TF32 on wgmma (m64nNk8 .tf32, both tiles K-major)
	step tf32_sm90a
	DIRS_NOW=$DIRS32
	# shellcheck disable=SC2086
	CHECK_TARGET=$WG check tf32_90a "" "$LOGS/check_tf32_sm90a.txt" 120 --allow-tf32 $TOL_TF32 $DIRS32
	step_end rc$?
	# the float16 graphs once more with --unvalidated: the forms not yet
	# run on a GPU wherever they fit -- the GEMMs whose operands are tensor
	# maps fill their tiles by TMA on mbarriers, the attention forward
	# overlaps its softmax with O += P V (not yet the default: this is the
	# run that validates them)
	step float16_sm90a_new
	DIRS_NOW=$DIRS16
	# shellcheck disable=SC2086
	CHECK_TARGET=$WG check f16_new float16__ "$LOGS/check_float16_sm90a_new.txt" 120 --unvalidated $TOL16 $DIRS16
	step_end rc$?
fi

say ""
say "== models x fusion level x dtype (float32 at none / rules / apollo, float32 TF32, float16, bfloat16 at apollo${WG:+; f16_90a, bf16_90a, tf32_90a: the 16-bit and TF32 graphs for $WG (wgmma); f16_new: float16 for $WG with --unvalidated (TMA + mbarrier GEMMs, the attention overlap)}; $OK = passed)"
cols="none rules apollo tf32 float16 bfloat16${WG:+ f16_90a bf16_90a tf32_90a f16_new}"
line=$(printf "%-28s" model); for c in $cols; do line="$line$(printf " %-8s" "$c")"; done; say "$line"
for d in $DIRS32; do
	m=${d##*/}
	line=$(printf "%-28s" "$m")
	for c in $cols; do
		s=$(awk -v m="$m" -v c="$c" '$1 == m && $2 == c { s = $3 } END { print s ? s : "-" }' "$RES")
		line="$line$(printf " %-8s" "$s")"
	done
	say "$line"
done
npass=$(awk -v ok="$OK" '$3 == ok' "$RES" | wc -l)
nbad=$(awk -v ok="$OK" '$3 != ok' "$RES" | wc -l)
say "models: $npass $OK, $nbad failed or not run, of $((npass + nbad))"
[ -s "$W/faildetail" ] && cat "$W/faildetail" | cut -c1-300 | tee -a "$SUM"
[ "$nbad" -eq 0 ] || FAILS=$((FAILS + nbad))

# ---- GEMM / attention timing --------------------------------------------------------------------
say ""
say "== GEMM and attention shapes of bench/gemm.sh (sm target $TARGET)"
step gemm
G=$W/gemm
shapes_arg=
[ -n "${DEVICE_CHECK_GEMM_SHAPES-}" ] && shapes_arg="--shapes $DEVICE_CHECK_GEMM_SHAPES"
# shellcheck disable=SC2086
if ! host "$PY" -c 'import numpy' >/dev/null 2>&1; then
	say "GEMM timing: not available ($PY with numpy not found; set DEVICE_CHECK_PYTHON)"
	step_end skipped
elif ! tmo 150 env "$HOSTLD" "$PY" "$KIT/bench/gemm_device.py" make "$G" $shapes_arg >"$LOGS/gemm_make.txt" 2>&1; then
	say "GEMM timing: FAIL: making the shapes failed:"
	tail -5 "$LOGS/gemm_make.txt" | tee -a "$SUM"
	FAILS=$((FAILS + 1))
	step_end FAIL
else
	tail -1 "$LOGS/gemm_make.txt" | tee -a "$SUM"
	tol32="--rtol 1e-3 --atol 1e-3 --mismatch 0.001"
	[ "$MODE" = rehearsal ] && { tol32=$TOL32; TOL_TF32=$TOL32; TOL16=$TOL32; TOLBF=$TOL32; }
	f32=$(ls -d "$G"/*__float32) f16=$(ls -d "$G"/*__float16) bf16=$(ls -d "$G"/*__bfloat16 2>/dev/null)
	# compile and check every folder, in parallel (not timed) ...
	# shellcheck disable=SC2086
	tmo 150 "$CLIENT" check --target "$TARGET" --jobs "$JOBS" --allow-tf32 $TOL_TF32 $f32 >"$LOGS/gemm_check_tf32.txt" 2>&1
	# shellcheck disable=SC2086
	tmo 150 "$CLIENT" check --target "$TARGET" --jobs "$JOBS" $tol32 $f32 >"$LOGS/gemm_check_simt.txt" 2>&1
	# shellcheck disable=SC2086
	tmo 150 "$CLIENT" check --target "$TARGET" --jobs "$JOBS" $TOL16 $f16 >"$LOGS/gemm_check_f16.txt" 2>&1
	# shellcheck disable=SC2086
	[ -n "$bf16" ] && tmo 150 "$CLIENT" check --target "$TARGET" --jobs "$JOBS" $TOLBF $bf16 >"$LOGS/gemm_check_bf16.txt" 2>&1
	# shellcheck disable=SC2086
	[ -n "$WG" ] && tmo 150 "$CLIENT" check --target "$WG" --jobs "$JOBS" $TOL16 $f16 >"$LOGS/gemm_check_f16_sm90a.txt" 2>&1
	# shellcheck disable=SC2086
	[ -n "$WG" ] && tmo 150 "$CLIENT" check --target "$WG" --jobs "$JOBS" --allow-tf32 $TOL_TF32 $f32 \
		>"$LOGS/gemm_check_tf32_sm90a.txt" 2>&1
	# shellcheck disable=SC2086
	[ -n "$WG" ] && [ -n "$bf16" ] && tmo 150 "$CLIENT" check --target "$WG" --jobs "$JOBS" $TOLBF $bf16 \
		>"$LOGS/gemm_check_bf16_sm90a.txt" 2>&1
	# ... then time them one at a time (cache hits): Apollo's kernels with
	# the library off (APOLLO_LIBCUBLASLT=off: a product the plan gives to
	# cuBLASLt runs Apollo's kernel), then, where the plan has library
	# launches, the plan as a user runs it (variants lib, lib_tf32)
	for d in $f32 $f16 $bf16; do
		case $d in
		*__float32) set -- tf32 "--allow-tf32 $TOL_TF32" simt "$tol32" ;;
		*__bfloat16) set -- bf16 "$TOLBF" ;;
		*) set -- f16 "$TOL16" ;;
		esac
		tol=$2   # the 16-bit type's, for the sm_90a variants below
		while [ $# -gt 0 ]; do
			# shellcheck disable=SC2086
			APOLLO_LIBCUBLASLT=off tmo 60 "$CLIENT" check "$d" --target "$TARGET" --repeat "$REPEAT" \
				--profile $2 >"$d/apollo_$1.out" 2>&1 </dev/null
			lv=lib; [ "$1" = f16 ] || lv=lib_$1
			# shellcheck disable=SC2086
			grep -q '^library:' "$d/apollo_$1.out" &&
				tmo 60 "$CLIENT" check "$d" --target "$TARGET" --repeat "$REPEAT" --profile $2 \
					>"$d/apollo_$lv.out" 2>&1 </dev/null
			shift 2
		done
		# the sm_90a kernel (wgmma) of the same product (float32: TF32)
		case $d in
		*__float32)
			# shellcheck disable=SC2086
			[ -n "$WG" ] && APOLLO_LIBCUBLASLT=off tmo 60 "$CLIENT" check "$d" --target "$WG" --allow-tf32 \
				--repeat "$REPEAT" --profile $TOL_TF32 >"$d/apollo_wg_tf32.out" 2>&1 </dev/null ;;
		*)
			# shellcheck disable=SC2086
			[ -n "$WG" ] && APOLLO_LIBCUBLASLT=off tmo 60 "$CLIENT" check "$d" --target "$WG" \
				--repeat "$REPEAT" --profile $tol >"$d/apollo_wg.out" 2>&1 </dev/null
			# ... and in the forms not yet run on a GPU (--unvalidated:
			# the GEMM's TMA form where the operands are maps, the
			# attention forward's overlap)
			# shellcheck disable=SC2086
			[ -n "$WG" ] && APOLLO_LIBCUBLASLT=off tmo 60 "$CLIENT" check "$d" --target "$WG" --unvalidated \
				--repeat "$REPEAT" --profile $tol >"$d/apollo_new.out" 2>&1 </dev/null ;;
		esac
	done
	# ... and tuned by measurement (variant tuned): issue 25's rows in
	# float16 and bfloat16, built for sm_90a with --unvalidated by a second
	# apollod whose background tuner times each kernel's candidates on this
	# GPU (Apollo's kernels: APOLLO_LIBCUBLASLT=off) and keeps the fastest
	# as a measured record; then checked and timed as built from them
	TUNED=${DEVICE_CHECK_TUNED_SHAPES-square_2048,square_4096,square_8192,attn_s2048_d64,attn_s2048_d128}
	if [ -n "$WG" ] && [ -n "$TUNED" ] && [ "$(left)" -gt 150 ]; then
		tuned_step "$TUNED"
	elif [ -n "$WG" ] && [ -n "$TUNED" ]; then
		say "tuned: not run ($(left) s left of the budget)"
	fi
	rh=
	[ "$MODE" = rehearsal ] && rh=--rehearsal
	# shellcheck disable=SC2086
	tmo 180 env "$HOSTLD" "$PY" "$KIT/bench/gemm_device.py" report "$G" --repeat "$REPEAT" $rh >"$W/gemm_table" 2>"$LOGS/gemm_report.err"
	rc=$?
	tee -a "$SUM" <"$W/gemm_table"
	[ $rc -eq 0 ] || { say "GEMM report: FAIL (rc $rc; logs/gemm_report.err)"; tail -3 "$LOGS/gemm_report.err" | tee -a "$SUM"; FAILS=$((FAILS + 1)); }
	gf=$(sed -n 's/^gemm checks: [0-9]* ok, \([0-9]*\) failed.*/\1/p' "$W/gemm_table")
	[ -n "$gf" ] || gf=1
	[ "$gf" -eq 0 ] || FAILS=$((FAILS + gf))
	mkdir -p "$LOGS/gemm"
	for d in $f32 $f16 $bf16; do
		for o in "$d"/apollo_*.out "$d"/tuned_*.out; do
			[ -f "$o" ] && cp "$o" "$LOGS/gemm/${d##*/}_${o##*/}"
		done
	done
	step_end rc$rc
fi

# ---- compute-sanitizer ------------------------------------------------------------------------------
say ""
say "== compute-sanitizer (float32 bundles at --fusion apollo, from the cache)"
step sanitizer
SAN=$(command -v compute-sanitizer 2>/dev/null)
[ -z "$SAN" ] && [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" ] && SAN=${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer
if [ -z "$SAN" ]; then
	say "compute-sanitizer: not available (not on PATH nor in ${CUDA_HOME:-/usr/local/cuda}/bin): memcheck, racecheck, synccheck not run"
	step_end skipped
elif [ "$MODE" = rehearsal ]; then
	say "compute-sanitizer: not run in a rehearsal ($SAN needs a GPU; the stand-in runs no kernel)"
	step_end skipped
else
	ST=${DEVICE_CHECK_SANITIZE_S:-90}
	l=$(($(left) - 20))
	tools="memcheck racecheck synccheck"
	if [ "$l" -lt $((3 * ST)) ]; then
		# too little time for every model under every tool: one each
		ST=$((l / 3)); [ "$ST" -gt 90 ] && ST=90
		pick() { for d in $DIRS32; do case $d in */"$1") echo "$d"; return ;; esac; done; echo "$DIRS32" | awk '{ print $1 }'; }
		plan="memcheck:$(pick squeezenet1_1) racecheck:$(pick bert_like_2l) synccheck:$(pick prenorm_layer_train)"
		if [ "$ST" -lt 10 ]; then
			plan=
			say "compute-sanitizer: not run: the time budget is spent ($l s left)"
		else
			say "compute-sanitizer: $l s left, too little for every model: one model per tool, ${ST} s each: $(for p in $plan; do printf '%s ' "${p%%:*} ${p##*/}"; done)"
		fi
	else
		plan=
		for t in $tools; do for d in $DIRS32; do plan="$plan $t:$d"; done; done
	fi
	for t in $tools; do
		pids=
		for p in $plan; do
			[ "${p%%:*}" = "$t" ] || continue
			d=${p#*:}; m=${d##*/}
			# shellcheck disable=SC2086
			( tmo "$ST" "$SAN" --tool "$t" --error-exitcode 86 --print-limit 20 \
				"$CLIENT" check --no-fork --target "$TARGET" $TOL32 "$d" \
				>"$LOGS/sanitizer_${t}_$m.txt" 2>&1 </dev/null
			  echo $? >"$W/san_${t}_$m.rc" ) &
			pids="$pids $!"
		done
		# (not a bare wait: apollod is a child too)
		# shellcheck disable=SC2086
		[ -z "$pids" ] || wait $pids
	done
	line=$(printf "%-28s" model); for t in $tools; do line="$line$(printf " %-22s" "$t")"; done; say "$line"
	for d in $DIRS32; do
		m=${d##*/}
		line=$(printf "%-28s" "$m")
		for t in $tools; do
			f=$LOGS/sanitizer_${t}_$m.txt
			if [ ! -f "$W/san_${t}_$m.rc" ]; then c="not run"
			else
				rc=$(cat "$W/san_${t}_$m.rc")
				n=$(grep -Eo "ERROR SUMMARY: [0-9]+" "$f" | awk '{ s += $3 } END { print s + 0 }')
				h=$(grep -Eo "RACECHECK SUMMARY: [0-9]+ hazard" "$f" | awk '{ s += $3 } END { print s + 0 }')
				case $rc in
				*) grep -q "Device not supported" "$f" && rc=unsupported ;;
				esac
				case $rc in
				unsupported) c="device unsupported" ;;
				0) c="clean"; [ "$h" -gt 0 ] && c="clean, $h hazard warnings" ;;
				86) c="$n errors"; [ "$h" -gt 0 ] && c="$c $h hazards"; FAILS=$((FAILS + 1)) ;;
				124|137) c="timeout ${ST}s"; [ "$n" -gt 0 ] && { c="$c, $n errors"; FAILS=$((FAILS + 1)); } ;;
				1) if [ "$n" -gt 0 ]; then c="$n errors"; FAILS=$((FAILS + 1)); else c="clean (check FAIL)"; fi ;;
				*) c="rc $rc"; FAILS=$((FAILS + 1)) ;;
				esac
			fi
			line="$line$(printf " %-22s" "$c")"
		done
		say "$line"
	done
	grep -l "Device not supported" "$LOGS"/sanitizer_*.txt >/dev/null 2>&1 &&
		say "compute-sanitizer: 'Device not supported' on this machine (seen under gVisor): no findings possible here"
	grep -h "========= [A-Z][a-z]" "$LOGS"/sanitizer_*.txt 2>/dev/null | sort | uniq -c | sort -rn | head -10 | sed 's/^/  /' | tee -a "$SUM"
	step_end ran
fi

# ---- end ----------------------------------------------------------------------------------------------
stop_daemon
say ""
say "== steps (seconds)"
sed 's/^/  /' "$STEPS" | tee -a "$SUM" >/dev/null
sed 's/^/  /' "$STEPS"
say "total: $(($(now) - T0)) s of a ${BUDGET} s budget"
if [ "$FAILS" -eq 0 ]; then
	say "RESULT: PASS ($MODE mode$([ "$MODE" = rehearsal ] && echo ', numerics not checked'))"
	exit 0
fi
say "RESULT: FAIL ($FAILS failures; details in logs.tar.gz)"
exit 1
