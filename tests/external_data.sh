#!/bin/sh
# external_data.sh -- the user's own model in one command (issue 27, item
# 2): ONNX external data and --shape NAME=DIMS.
#   - --shape binds a symbolic batch without data (apollo-kernels and
#     `apollo-client convert`, no daemon): ppocr_mobile_v2_cls's x;
#     a shape that contradicts a fixed dim, an unknown input, a zero dim
#     are refused with what is wrong;
#   - a model exported by today's torch.onnx.export (weights in
#     model.onnx.data beside it; skipped without torch in .venv): `submit`
#     compiles its structure with --shape and `check` passes against
#     onnxruntime's outputs; a missing data file and one linked from
#     outside the folder are refused naming the tensor and the file.
# Exits non-zero on the first failure.   env: APOLLO_BUILD, APOLLO_TESTDATA
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc
K=$APOLLO_BUILD/apollo-kernels
PPOCR=$TESTDATA/models/ppocr_mobile_v2_cls/model.onnx
n=0

fail() {
	echo "external_data: FAIL $*"
	cat "$AP_TMP/out" "$AP_TMP/err" 2>/dev/null | tail -20
	exit 1
}
# expect RC PATTERN CMD...: exit status RC, output matching grep -E PATTERN
expect() {
	want=$1 pat=$2
	shift 2
	"$@" >"$AP_TMP/out" 2>"$AP_TMP/err"
	rc=$?
	if [ "$rc" != "$want" ] || ! cat "$AP_TMP/out" "$AP_TMP/err" | grep -Eq -- "$pat"; then
		fail "$* (rc $rc, want $want, pattern $pat)"
	fi
	n=$((n + 1))
}

# --shape, no daemon
expect 0 "launches" "$K" "$PPOCR" --shape x=2x3x48x192
expect 1 "symbolic dimension" "$K" "$PPOCR"
expect 1 "dimension 1 is 3 in the model, 4 in the binding" "$K" "$PPOCR" --shape x=2x4x48x192
expect 1 "the model gives it 4 dimensions, the binding 3" "$K" "$PPOCR" --shape x=2x3x48
expect 1 "'y', which is not an input of the model \(its inputs: 'x'\)" \
	"$K" "$PPOCR" --shape y=2x3x48x192
expect 1 "a dimension is 0" "$K" "$PPOCR" --shape x=0x3x48x192
expect 1 "positive integers" "$K" "$PPOCR" --shape x=-1x3x48x192
expect 1 "over 68719476736" "$K" "$PPOCR" --shape x=99999999999999x3x48x192
expect 0 "" "$CLIENT" convert "$PPOCR" "$AP_TMP/g.pb" --shape x=1x3x48x192
expect 1 "give its shape with --shape x=DIMS" "$CLIENT" convert "$PPOCR" "$AP_TMP/g.pb"
expect 1 "--shape x is given twice" "$CLIENT" convert "$PPOCR" "$AP_TMP/g.pb" \
	--shape x=1x3x48x192 --shape x=2x3x48x192
echo "external_data: $n --shape checks passed"

PY=.venv/bin/python
if ! [ -x "$PY" ] || ! "$PY" -c "import torch, onnx, onnxruntime" 2>/dev/null; then
	ap_skip torch "external_data: no torch/onnx/onnxruntime in .venv: the export part skipped"
	exit 0
fi
M=$AP_TMP/net
"$PY" - "$M" >"$AP_TMP/export.log" 2>&1 <<'PYEOF' || { cat "$AP_TMP/export.log"; fail export; }
# A tiny conv net exported with torch.onnx.export's external data (its
# default for the dynamo exporter): model.onnx + model.onnx.data; a
# backend-test set of onnxruntime's outputs for a batch of 3.
import os, sys
import numpy as np, onnx, onnxruntime as ort, torch
from onnx import numpy_helper

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv1(x)))
        y = torch.relu(self.conv2(y))
        return self.fc(y.mean(dim=(2, 3)))

torch.manual_seed(0)
out = sys.argv[1]
os.makedirs(os.path.join(out, "test_data_set_0"))
path = os.path.join(out, "model.onnx")
torch.onnx.export(Net().eval(), (torch.randn(2, 3, 16, 16),), path, input_names=["input"],
                  output_names=["logits"], external_data=True,
                  dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
m = onnx.load(path, load_external_data=False)
ext = [t.name for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
assert ext and os.path.exists(path + ".data"), "no external data written"
x = np.random.RandomState(1).randn(3, 3, 16, 16).astype(np.float32)
y = ort.InferenceSession(path).run(None, {"input": x})[0]
for kind, name, v in (("input", "input", x), ("output", "logits", y)):
    with open(os.path.join(out, "test_data_set_0", kind + "_0.pb"), "wb") as f:
        f.write(numpy_helper.from_array(v, name).SerializeToString())
print("external:", ", ".join(ext))
PYEOF
cat "$AP_TMP/export.log" | grep "^external:"
ap_start
expect 0 "launches|kernels" "$CLIENT" submit "$M/model.onnx" --shape input=1x3x16x16
expect 0 "PASS" "$CLIENT" check "$M"
expect 0 "PASS" "$CLIENT" check "$M" --shape input=3x3x16x16
expect 1 "disagrees" "$CLIENT" check "$M" --shape input=1x3x16x16
# the data file gone: refused naming the tensor and the file (its tensors
# are small, at most AP_CONST_MAX_BYTES: even the structure reads them, as
# it reads them inside a model; check_import shows a weight never read)
mv "$M/model.onnx.data" "$AP_TMP/model.onnx.data"
expect 1 "tensor 'conv1.weight': cannot open external data file .*model.onnx.data" \
	"$CLIENT" submit "$M/model.onnx" --shape input=1x3x16x16
expect 1 "tensor '.*': cannot open external data file .*model.onnx.data" "$CLIENT" check "$M"
# a link out of the folder is refused
ln -s "$AP_TMP/model.onnx.data" "$M/model.onnx.data"
expect 1 "leads outside the model's folder" "$CLIENT" check "$M"
echo "external_data: $n checks passed"
