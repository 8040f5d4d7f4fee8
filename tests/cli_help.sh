#!/bin/sh
# cli_help.sh -- apollo-client's help and usage errors (issue 27, "help that
# helps"), no daemon needed:
#   - SUBCOMMAND --help prints that subcommand's synopsis and exits 0;
#   - a usage error is three lines (the error, the synopsis's first line,
#     where help is) and exits 2;
#   - a mistyped option or subcommand names the nearest one ("did you
#     mean"), an option missing its value says so, and a word far from any
#     is not guessed at.
# Exits non-zero on the first failure.   env: APOLLO_BUILD
cd "$(dirname "$0")/.." || exit 1
C=${APOLLO_BUILD:-build}/apollo-client
[ -x "$C" ] || { echo "cli_help: no $C (make all)"; exit 1; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
n=0

# expect RC PATTERN ARGS...: exit status RC, stderr (stdout for rc 0)
# matching the grep -E PATTERN
expect() {
	want=$1 pat=$2
	shift 2
	"$C" "$@" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	[ "$want" = 0 ] && f=$tmp/out || f=$tmp/err
	if [ "$rc" != "$want" ] || ! grep -Eq -- "$pat" "$f"; then
		echo "cli_help: FAIL apollo-client $*: rc $rc (want $want), output:"
		cat "$tmp/out" "$tmp/err"
		exit 1
	fi
	n=$((n + 1))
}
# lines ARGS...: the usage error of ARGS is three lines
lines() {
	"$C" "$@" >/dev/null 2>"$tmp/err"
	l=$(wc -l <"$tmp/err")
	if [ "$l" != 3 ]; then
		echo "cli_help: FAIL apollo-client $*: $l lines of usage error, want 3:"
		cat "$tmp/err"
		exit 1
	fi
	n=$((n + 1))
}

for s in submit run check convert tune ping stats; do
	expect 0 "^usage: apollo-client $s" $s --help
done
expect 0 "^usage: apollo-client check" check -h
expect 0 "SUBCOMMAND --help" --help
expect 2 "unknown option '--tagret' \(did you mean --target\?\)" submit --tagret sm_90 m.onnx
expect 2 "did you mean --dump-schedules\?" submit --dump-schedule d m.onnx
expect 0 "\[--progress\]" submit --help
expect 2 "unknown option '--progres' \(did you mean --progress\?\)" submit --progres m.onnx
expect 2 "did you mean --json\?" stats --jsn
expect 2 "did you mean --socket\?" ping --sockte x
expect 2 "check: --rtol wants a value" check d --rtol
expect 2 "unknown subcommand 'submti' \(did you mean submit\?\)" submti
expect 2 "unknown subcommand 'rnu' \(did you mean run\?\)" rnu
expect 2 "unknown option '--compar' \(did you mean --compare\?\)" run --compar onnxruntime m.onnx
expect 2 "run: --seed wants a value" run m.onnx --seed
expect 2 "run: --seed wants a non-negative integer, not 'x'" run m.onnx --seed x
expect 2 "run: --compare takes onnxruntime" run m.onnx --compare tvm
expect 2 "run: which model\?" run
expect 0 "--compare onnxruntime" check --help
expect 2 "unknown subcommand 'frobnicate' \(submit, run, check" frobnicate
expect 2 "unknown option '--zzzzzzzzzz'$" submit --zzzzzzzzzz m.onnx
expect 2 "submit: which model\?" submit
expect 2 "^more: apollo-client submit --help" submit --fusion fast m.onnx
lines submit --tagret sm_90 m.onnx
lines check --no-such-option
lines submit
lines run --compar onnxruntime m.onnx
lines run
echo "cli_help: $n checks passed"
