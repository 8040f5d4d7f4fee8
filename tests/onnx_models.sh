#!/bin/sh
# onnx_models.sh -- ONNX exports of everyday architectures (ResNet-50,
# MobileNet-V3, EfficientNet-B0, ConvNeXt-T, ViT-B/16, Swin-T, DenseNet-121,
# GPT-2, BERT, LLaMA-style, T5 encoder), made with random weights by
# tests/export_models.py (torch.onnx.export, opset 17; small inputs and
# configurations where the host target would be too slow), checked by
# `apollo-client check` on target cpu against onnxruntime (rtol 1e-3, atol
# 1e-4) and compiled for sm_90 (cubin, NVRTC; skipped, saying so, without
# NVRTC).  Needs torch, torchvision, transformers and onnxscript in .venv
# (make deps).
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc

PY=$REPO/.venv/bin/python
if ! "$PY" -c 'import torch, torchvision, transformers, onnx, onnxruntime' 2>/dev/null; then
	echo "onnx_models: needs torch, torchvision, transformers, onnx, onnxruntime in $REPO/.venv (make deps)"
	exit 1
fi
t0=$(date +%s)
# (the exporters' own chatter, a TorchScript graph dump where that exporter
# gives up, goes to a log shown only on failure)
"$PY" tests/export_models.py --out "$AP_TMP/models" >"$AP_TMP/export.log" 2>&1 || { cat "$AP_TMP/export.log"; exit 1; }
grep '^export_models:' "$AP_TMP/export.log"
t1=$(date +%s)
echo "onnx_models: exported in $((t1 - t0)) s"
ap_start
# shellcheck disable=SC2046
"$CLIENT" check --jobs "${APOLLO_JOBS:-2}" --atol 1e-4 $(ls -d "$AP_TMP"/models/*/) >"$AP_TMP/check.log" 2>&1
rc=$?
cat "$AP_TMP/check.log"
# The data path is compiled, not folded away: weights are PARAMs bound at
# launch, never constants, so a model whose token ids are given still has
# its layers as kernels (eager kernels > 0).
if grep '^PASS' "$AP_TMP/check.log" | grep -q ' / 0 eager'; then
	echo "onnx_models: FAILED: folded whole at import: $(grep '^PASS' "$AP_TMP/check.log" | grep ' / 0 eager' | cut -d' ' -f2 | xargs -n1 basename | tr '\n' ' ')"
	rc=1
fi
t2=$(date +%s)
echo "onnx_models: checked on cpu in $((t2 - t1)) s"
case $("$CLIENT" ping) in
*"NVRTC none"*) ap_skip nvrtc "onnx_models: sm_90: SKIPPED: the daemon reports no NVRTC" || rc=1 ;;
*)
	for d in "$AP_TMP"/models/*/; do
		if out=$("$CLIENT" submit "$d/model.onnx" --data "$d" --target sm_90 --json 2>&1); then
			k=$(printf "%s\n" "$out" | sed -n 's/.*"kernels":\([0-9]*\).*/\1/p')
			echo "OK   sm_90 $(basename "$d") ($k launches)"
		else
			echo "FAIL sm_90 $(basename "$d"): $(printf "%s" "$out" | tr '\n' ' ')"; rc=1
		fi
	done
	echo "onnx_models: compiled for sm_90 in $(( $(date +%s) - t2 )) s" ;;
esac
exit $rc
