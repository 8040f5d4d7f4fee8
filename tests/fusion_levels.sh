#!/bin/sh
# fusion_levels.sh -- the fusion levels end to end, over every model under
# ../shared/testdata/models and training/, through a real apollod (target
# cpu):
#   1. `apollo-client check` at --fusion none, rules and apollo against the
#      reference data (rtol 1e-3, atol 1e-5, as conformance.sh for models);
#      then every other backend-test folder conformance.sh runs (known gaps
#      aside, its tolerances) at none and rules -- conformance.sh itself is
#      the apollo run; APOLLO_FUSION_CORPUS=0 skips this part;
#   2. a differential between levels on fresh random inputs (a new seed each
#      run, printed; APOLLO_SEED replays one): tests/ort_diff.py draws the
#      inputs (its onnxruntime outputs check the `none` run, rtol 1e-3,
#      atol 1e-4 as in differential.sh), `check --fusion none
#      --save-outputs` keeps what `none` computed, and rules and apollo
#      must agree with it (rtol 1e-3, atol 1e-5);
#   3. tests/fusion_check.py: --explain at each level (a reason, not
#      "unknown", for every boundary; a boundary for every edge between
#      launches), the figures (apollo no worse than rules in launches and
#      global bytes; the issue's targets on bert_like_2l and mlp_gelu_ln),
#      and that --fusion-barrier and --keep-whole reach the partitioner.
# Value checks on the compiler's output, no timings.  Exits non-zero on any
# failure.
#   env: APOLLO_BUILD, APOLLO_JOBS (parallel checks, default 2),
#        APOLLO_SEED, APOLLO_FUSION_CORPUS
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc

PY=$REPO/.venv/bin/python
if ! "$PY" -c 'import onnx, onnxruntime, numpy' 2>/dev/null; then
	echo "fusion_levels: needs onnx, onnxruntime and numpy in $REPO/.venv (make deps)"
	exit 1
fi
JOBS=${APOLLO_JOBS:-2}
seed=${APOLLO_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
dirs=$(ap_test_dirs models training)
if [ -z "$dirs" ]; then
	echo "fusion_levels: no models under $TESTDATA/models or training"
	exit 1
fi
ap_start
status=0

# check LABEL ARGS...: one `apollo-client check`, its lines prefixed
# (with QUIET=1 only what did not pass, and the count).
check() {
	label=$1; shift
	if "$CLIENT" check --jobs "$JOBS" "$@" >"$AP_TMP/check.log" 2>&1; then
		rc=0
	else
		rc=1
	fi
	if [ "${QUIET:-0}" = 1 ]; then
		grep -v '^PASS ' "$AP_TMP/check.log" | sed "s/^/$label: /"
	else
		sed "s/^/$label: /" "$AP_TMP/check.log"
	fi
	return $rc
}

# 1. Every level passes against the reference data.
for lv in none rules apollo; do
	# shellcheck disable=SC2086
	check "reference --fusion $lv" --rtol 1e-3 --atol 1e-5 --fusion "$lv" $dirs || status=1
done

if [ "${APOLLO_FUSION_CORPUS:-1}" != 0 ]; then
	ap_known_gaps | sort -u >"$AP_TMP/gaps"
	: >"$AP_TMP/corpus"; : >"$AP_TMP/densenet"
	for d in $(ap_test_dirs onnx-node onnx-simple onnx-pytorch-converted onnx-pytorch-operator onnx-light); do
		rel=${d#"$TESTDATA"/}
		grep -qxF "$rel" "$AP_TMP/gaps" && continue
		case $rel in
		*/test_densenet121) echo "$d" >>"$AP_TMP/densenet" ;;
		*) echo "$d" >>"$AP_TMP/corpus" ;;
		esac
	done
	for lv in none rules; do
		# shellcheck disable=SC2046
		[ -s "$AP_TMP/corpus" ] && { QUIET=1 check "corpus --fusion $lv" --fusion "$lv" \
			$(cat "$AP_TMP/corpus") || status=1; }
		# shellcheck disable=SC2046
		[ -s "$AP_TMP/densenet" ] && { QUIET=1 check "corpus --fusion $lv" --rtol 2e-3 \
			--fusion "$lv" $(cat "$AP_TMP/densenet") || status=1; }
	done
fi

# 2. none vs rules and apollo on fresh inputs.
echo "fusion_levels: differential seed $seed (APOLLO_SEED=$seed replays this run)"
# shellcheck disable=SC2086
if ! "$PY" tests/ort_diff.py --seed "$seed" --out "$AP_TMP/fresh" $dirs >"$AP_TMP/ort.log" 2>&1; then
	cat "$AP_TMP/ort.log"
	echo "fusion_levels: onnxruntime could not produce inputs for every model"
	status=1
fi
if [ -d "$AP_TMP/fresh" ]; then
	# shellcheck disable=SC2046
	check "fresh --fusion none vs onnxruntime" --rtol 1e-3 --atol 1e-4 --fusion none \
		--save-outputs "$AP_TMP/none" $(ls -d "$AP_TMP"/fresh/*/) || status=1
	# Only the folders `none` completed hold its outputs.
	saved=$(sed -n 's/^PASS \([^ ]*\) .*/\1/p' "$AP_TMP/check.log" | sed "s|^$AP_TMP/fresh/|$AP_TMP/none/|")
	for lv in rules apollo; do
		# shellcheck disable=SC2086
		[ -n "$saved" ] && { check "fresh --fusion $lv vs none" --rtol 1e-3 --atol 1e-5 \
			--fusion "$lv" $saved || status=1; }
	done
fi

# 3. Explain, figures, hints.
# shellcheck disable=SC2086
"$PY" tests/fusion_check.py --client "$CLIENT" --out "$AP_TMP/explain.jsonl" $dirs || status=1

[ $status -eq 0 ] || echo "fusion_levels: FAILED (differential seed $seed)"
exit $status
