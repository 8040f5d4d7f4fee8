#!/bin/sh
# demo.sh -- `make demo`'s script (tools/demo.sh) end to end on the built
# tree: it must find the test data, need nothing installed or built, run
# its four stages, the cold compile and the cache hit, pass the check and
# the comparison with onnxruntime, and end with what happened and the
# commands to try next; and with the test data missing it must stop at
# once, saying where the data comes from.
cd "$(dirname "$0")/.." || exit 1
APOLLO_BUILD=${APOLLO_BUILD:-$(pwd)/build}
export APOLLO_BUILD
# as a user runs it: host kernels with their x86-64-v3 clones (the test
# runners leave them out, tools/run-scripts.sh)
unset APOLLO_HOST_CLONES
out=$(mktemp -d "${TMPDIR:-/tmp}/apollo-demo.XXXXXX")
trap 'rm -rf "$out"' EXIT
fail=0
expect() { # what, pattern
	if grep -qE "$2" "$out/log"; then
		echo "demo: $1"
	else
		echo "demo: FAILED: $1 (no line matching '$2')"
		fail=1
	fi
}
if ! sh tools/demo.sh >"$out/log" 2>&1; then
	echo "demo: FAILED: tools/demo.sh exited non-zero:"
	tail -20 "$out/log"
	exit 1
fi
expect "four stages" '^demo 4/4: '
if grep -q '^deps: installing' "$out/log"; then
	echo "demo: FAILED: installed something on a tree with its dependencies"
	fail=1
fi
expect "a cold compile" '^cache miss; compile [0-9.]+ ms'
expect "then a cache hit" '^cache hit; compile [0-9.]+ ms'
expect "the check passes" '^1 passed, 0 failed'
expect "onnxruntime agrees" '^onnxruntime: all [0-9]+ outputs match'
expect "what happened" '^  bert_like_2l: [0-9]+ kernels when run op by op became [0-9]+ launches'
expect "three commands to try" 'run your_model.onnx --shape'
if APOLLO_TESTDATA=$out/none sh tools/demo.sh >"$out/log2" 2>&1; then
	echo "demo: FAILED: ran without test data"
	fail=1
elif grep -q 'shared/testdata' "$out/log2" && ! grep -q '^demo 2/4' "$out/log2"; then
	echo "demo: without test data it stops first and says where the data comes from"
else
	echo "demo: FAILED: without test data:"; cat "$out/log2"; fail=1
fi
[ $fail -eq 0 ] && echo "demo: PASS"
exit $fail
