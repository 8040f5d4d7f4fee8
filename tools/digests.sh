#!/bin/sh
# digests.sh -- one line per compiler output that a refactoring must leave
# unchanged (issue 28: "goldens and the models' bundle digests unchanged"),
# to diff before and after:
#   import  every .onnx under ../shared/testdata: SHA-256 of the graph that
#           `apollo-client convert` writes (the ONNX importer's output), or
#           of its error message when the model is refused;
#   kernels every model under models/, training/ and onnx-light/ at targets
#           cpu, sm_80, sm_90 and fusion none, rules, apollo: SHA-256 of
#           what `apollo-kernels` prints (partition, launch shapes, every
#           kernel's source; no daemon, no tuning, deterministic).
#           The rest of the corpus at sm_90, fusion apollo.
# Usage: tools/digests.sh > before.txt; (change); tools/digests.sh | diff before.txt -
#   env: APOLLO_BUILD (default build), TESTDATA (default ../shared/testdata)
cd "$(dirname "$0")/.." || exit 1
B=${APOLLO_BUILD:-build}
T=${TESTDATA:-../shared/testdata}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
find "$T" -name '*.onnx' | LC_ALL=C sort | while read -r m; do
	d=$(dirname "$m")/test_data_set_0
	[ -d "$d" ] || d=$(dirname "$m")
	if "$B/apollo-client" convert "$m" "$tmp/g.pb" --data "$d" >"$tmp/err" 2>&1; then
		h=$(sha256sum <"$tmp/g.pb")
	else
		h="refused $(sha256sum <"$tmp/err")"
	fi
	echo "import ${m#"$T"/} ${h%% *}"
	rm -f "$tmp/g.pb"
done
find "$T/models" "$T/training" "$T/onnx-light" -name '*.onnx' 2>/dev/null | LC_ALL=C sort |
while read -r m; do
	d=$(dirname "$m")/test_data_set_0
	[ -d "$d" ] || d=$(dirname "$m")
	for t in cpu sm_80 sm_90; do
		for f in none rules apollo; do
			h=$("$B/apollo-kernels" "$m" --target $t --fusion $f --data "$d" 2>&1 |
			    sed "s|$T/||g" | sha256sum)
			echo "kernels ${m#"$T"/} $t $f ${h%% *}"
		done
	done
done
# the backend-test corpus (every other .onnx): target sm_90, fusion apollo
find "$T" -name '*.onnx' | grep -v -e "^$T/models/" -e "^$T/training/" -e "^$T/onnx-light/" |
LC_ALL=C sort | while read -r m; do
	d=$(dirname "$m")/test_data_set_0
	[ -d "$d" ] || d=$(dirname "$m")
	h=$("$B/apollo-kernels" "$m" --target sm_90 --data "$d" 2>&1 | sed "s|$T/||g" | sha256sum)
	echo "kernels ${m#"$T"/} sm_90 apollo ${h%% *}"
done
