#!/bin/sh
# tune.sh -- the client measurement path of the tuner (apollo-client tune),
# run through the stand-in CUDA driver (tests/cuda_standin.c): its events
# read a made-up device clock that each launch advances by a time fixed by
# the launch's shape, so the timings are deterministic and differ between
# candidates.  Checks, on bert_like_2l at sm_90 (PTX, which the stand-in
# loads):
#   1. `tune` times every tuned kernel's candidates and stars the fastest
#      of each kernel; one client's report stores no measured record (it
#      waits for agreement), a second client's (over TCP: another reporter)
#      that agrees stores one per kernel;
#   2. the next compile of the model for that device (submit names the
#      stand-in's device, read from the driver) takes its configurations
#      from those measured records (submit --json: tuning.measured > 0),
#      one naming no device does not, and `stats` counts both reports;
#   3. without a CUDA driver, and for the host target, `tune` refuses with
#      a clear message (exit 1 and 2), and so do --no-tune and --host-check
#      (exit 2);
#   4. compile options travel with the measurement: a build with
#      --allow-tf32 (TF32 kernels, their own tuning signatures) has no
#      measured record after the plain tune, and one per tuned kernel
#      after two clients tune with --allow-tf32.
# Skipped, saying so, when the daemon has no NVRTC or the stand-in was not
# built (failed instead where $APOLLO_REQUIRE names nvrtc or standin).
#   env: APOLLO_BUILD
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc

STANDIN=$APOLLO_BUILD/tests/libcuda-standin.so
MODEL=$TESTDATA/models/bert_like_2l/model.onnx
if [ ! -f "$STANDIN" ]; then
	ap_skip standin "tune: SKIPPED: no stand-in driver at $STANDIN (make all)"
	exit $?
fi
PORT=$((20000 + $$ % 20000))
printf 'tune-test-token\n' >"$AP_TMP/token"
chmod 600 "$AP_TMP/token"
ap_start --tcp "127.0.0.1:$PORT" --tcp-token-file "$AP_TMP/token"
case $("$CLIENT" ping) in
*"NVRTC none"*)
	ap_skip nvrtc "tune: SKIPPED: the daemon reports no NVRTC"
	exit $? ;;
esac
status=0
fail() { echo "tune: FAIL: $*"; status=1; }

# 1. measure and report
if ! APOLLO_LIBCUDA=$STANDIN "$CLIENT" tune "$MODEL" --target sm_90 --format ptx --runs 5 \
	--warmup 1 >"$AP_TMP/tune.out" 2>&1; then
	fail "apollo-client tune exited with $?"
	cat "$AP_TMP/tune.out"
fi
grep -q "^device: Apollo stand-in GPU (132 SMs)$" "$AP_TMP/tune.out" ||
	fail "the device line is missing"
# every kernel's starred row is its fastest, and exactly one row per kernel is starred
awk '
/^[* ] [0-9a-f]+ / {
	star = ($1 == "*"); k = star ? $2 : $1; t = star ? $4 : $3
	if (!(k in best) || t + 0 < best[k]) best[k] = t + 0
	if (star) { if (k in starred) dup = 1; starred[k] = t + 0 }
	rows++
}
END {
	n = 0
	for (k in best) {
		n++
		if (!(k in starred)) { print "kernel " k " has no starred row"; bad = 1 }
		else if (starred[k] != best[k]) { print "kernel " k ": starred " starred[k] " us, fastest " best[k]; bad = 1 }
	}
	if (dup) { print "a kernel has two starred rows"; bad = 1 }
	if (rows < 2 * n) { print rows " rows for " n " kernels: candidates were not timed"; bad = 1 }
	print "kernels " n " rows " rows
	exit bad
}' "$AP_TMP/tune.out" >"$AP_TMP/check.out" || fail "$(cat "$AP_TMP/check.out")"
kernels=$(sed -n 's/^kernels \([0-9]*\) rows.*/\1/p' "$AP_TMP/check.out")
stored() {
	sed -n 's/.* \([0-9]*\) measured records stored for sm_90 on Apollo stand-in GPU .*/\1/p' "$1"
}
stored=$(stored "$AP_TMP/tune.out")
[ "$stored" = 0 ] || fail "one client's report stored '$stored' records (want 0: no agreement yet)"
# the same measurement from a second client: agreement, one record per kernel
if ! APOLLO_LIBCUDA=$STANDIN APOLLO_TOKEN=tune-test-token "$CLIENT" --socket "127.0.0.1:$PORT" \
	tune "$MODEL" --target sm_90 --format ptx --runs 5 --warmup 1 >"$AP_TMP/tune2.out" 2>&1; then
	fail "apollo-client tune over TCP exited with $?"
	cat "$AP_TMP/tune2.out"
fi
stored=$(stored "$AP_TMP/tune2.out")
[ -n "$stored" ] && [ "$stored" = "$kernels" ] ||
	fail "records stored after agreement: '$stored', kernels timed: '$kernels'"
echo "tune: $(tail -1 "$AP_TMP/tune2.out") ($kernels kernels, $(grep -c '^[* ] [0-9a-f]' "$AP_TMP/tune.out") candidates timed)"

# 2. the measured records are used
APOLLO_LIBCUDA=$STANDIN "$CLIENT" submit "$MODEL" --target sm_90 --format ptx --json \
	>"$AP_TMP/submit.json" 2>&1 || fail "submit after tune failed: $(cat "$AP_TMP/submit.json")"
measured=$(sed -n 's/.*"tuning":{[^}]*"measured":\([0-9]*\).*/\1/p' "$AP_TMP/submit.json")
[ -n "$measured" ] && [ "$measured" -ge "$kernels" ] ||
	fail "the compile after tune used $measured measured records (want >= $kernels)"
# naming no device (no driver here): the cost model's records only
APOLLO_LIBCUDA=$AP_TMP/no-such-driver.so "$CLIENT" submit "$MODEL" --target sm_90 --format ptx \
	--json >"$AP_TMP/nodev.json" 2>&1 || fail "submit without a device failed"
nodev=$(sed -n 's/.*"tuning":{[^}]*"measured":\([0-9]*\).*/\1/p' "$AP_TMP/nodev.json")
[ "$nodev" = 0 ] || fail "a compile naming no device used $nodev measured records (want 0)"
"$CLIENT" stats | grep -q "reports 2 " || fail "stats does not count the reports: $("$CLIENT" stats | grep tuning)"

# 3. refusals
if APOLLO_LIBCUDA=$AP_TMP/no-such-driver.so "$CLIENT" tune "$MODEL" --target sm_90 --format ptx \
	>"$AP_TMP/nodrv.out" 2>&1; then
	fail "tune without a CUDA driver succeeded"
fi
grep -q "no CUDA driver" "$AP_TMP/nodrv.out" || fail "no driver: $(cat "$AP_TMP/nodrv.out")"
"$CLIENT" tune "$MODEL" --target cpu >"$AP_TMP/cpu.out" 2>&1
[ $? -eq 2 ] || fail "tune --target cpu did not exit 2"

for o in --no-tune --host-check; do
	"$CLIENT" tune "$MODEL" --target sm_90 "$o" >"$AP_TMP/opt.out" 2>&1
	[ $? -eq 2 ] || fail "tune $o did not exit 2: $(cat "$AP_TMP/opt.out")"
done

# 4. the compile options: TF32's records are measured under --allow-tf32
tf32_measured() {
	APOLLO_LIBCUDA=$STANDIN "$CLIENT" submit "$MODEL" --target sm_90 --format ptx --allow-tf32 --json \
		>"$AP_TMP/tf32.json" 2>&1 || fail "submit --allow-tf32 failed: $(cat "$AP_TMP/tf32.json")"
	sed -n 's/.*"tuning":{[^}]*"measured":\([0-9]*\).*/\1/p' "$AP_TMP/tf32.json"
}
before=$(tf32_measured)
[ "$before" = 0 ] || fail "a TF32 build used $before records measured without --allow-tf32 (want 0)"
APOLLO_LIBCUDA=$STANDIN "$CLIENT" tune "$MODEL" --target sm_90 --format ptx --runs 5 --warmup 1 \
	--allow-tf32 >"$AP_TMP/tf32a.out" 2>&1 || fail "tune --allow-tf32 exited with $?: $(cat "$AP_TMP/tf32a.out")"
APOLLO_LIBCUDA=$STANDIN APOLLO_TOKEN=tune-test-token "$CLIENT" --socket "127.0.0.1:$PORT" tune "$MODEL" \
	--target sm_90 --format ptx --runs 5 --warmup 1 --allow-tf32 >"$AP_TMP/tf32b.out" 2>&1 ||
	fail "tune --allow-tf32 over TCP exited with $?: $(cat "$AP_TMP/tf32b.out")"
tf32_kernels=$(grep -c '^\* [0-9a-f]' "$AP_TMP/tf32a.out")
tf32_stored=$(stored "$AP_TMP/tf32b.out")
[ "$tf32_kernels" -gt 0 ] && [ "$tf32_stored" = "$tf32_kernels" ] ||
	fail "tune --allow-tf32: $tf32_stored records stored for $tf32_kernels kernels"
# the TF32 kernels' signatures are not the float32 ones'
grep '^\* [0-9a-f]' "$AP_TMP/tune.out" | awk '{ print $2 }' | sort >"$AP_TMP/sig32"
grep '^\* [0-9a-f]' "$AP_TMP/tf32a.out" | awk '{ print $2 }' | sort >"$AP_TMP/sigtf32"
[ -z "$(comm -12 "$AP_TMP/sig32" "$AP_TMP/sigtf32")" ] || fail "TF32 and float32 kernels share signatures"
after=$(tf32_measured)
[ -n "$after" ] && [ "$after" -ge "$tf32_kernels" ] ||
	fail "the TF32 build after tune --allow-tf32 used '$after' measured records (want >= $tf32_kernels)"

[ $status -eq 0 ] && echo "tune: PASS (measured on the stand-in, $measured kernels compiled from measured records; TF32: $after)"
exit $status
