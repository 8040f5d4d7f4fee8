#!/bin/sh
# run-fuzz.sh FUZZ_BUILD SECONDS NAME... -- runs each libFuzzer harness
# FUZZ_BUILD/fuzz_NAME for SECONDS on FUZZ_BUILD/corpus/NAME (kept between
# runs: what it found) and the seeds in FUZZ_BUILD/seeds/NAME, $JOBS
# harnesses at a time (default nproc; each is one process, so the cores
# share them), and prints one line per harness as it ends.  A crash, leak,
# timeout or out-of-memory leaves its input as FUZZ_BUILD/artifacts/NAME-*
# and fails the run; reproduce with `FUZZ_BUILD/fuzz_NAME FILE`.  Ends with
# "fuzz: N passed, N failed".
B=$1; S=$2; shift 2
mkdir -p "$B/artifacts"
R=$(mktemp -d "${TMPDIR:-/tmp}/apollo-fuzz.XXXXXX")
trap 'rm -rf "$R"' EXIT
export B S R
# One harness; its verdict line goes to $R/NAME.ok or $R/NAME.fail.
# shellcheck disable=SC2016
printf '%s\n' "$@" | xargs -P "${JOBS:-$(nproc 2>/dev/null || echo 2)}" -I{} sh -c '
	n=$1
	mkdir -p "$B/corpus/$n"
	log=$B/fuzz_$n.log
	if ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
	   UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	   "$B/fuzz_$n" -max_total_time="$S" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
		-artifact_prefix="$B/artifacts/$n-" "$B/corpus/$n" "$B/seeds/$n" >"$log" 2>&1; then
		runs=$(sed -n "s/^stat::number_of_executed_units: *//p" "$log")
		cov=$(grep -o "cov: [0-9]*" "$log" | tail -1)
		echo "fuzz_$n: ok, $runs inputs in ${S} s, $cov, corpus $(ls "$B/corpus/$n" | wc -l)" >"$R/$n.ok"
		cat "$R/$n.ok"
	else
		{ echo "fuzz_$n: FAILED (log $log):"
		  grep -E "ERROR|runtime error|SUMMARY|Test unit written" "$log" | head -20; } >"$R/$n.fail"
		cat "$R/$n.fail"
	fi' sh {}
pass=$(find "$R" -name '*.ok' | wc -l)
fail=$(($# - pass))
echo "fuzz: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
