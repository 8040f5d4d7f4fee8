#!/bin/sh
# run_model.sh -- `apollo-client run MODEL.onnx` and `check MODEL.onnx`
# (issue 27, item 2: the user's own model in one command), on models
# exported by today's torch.onnx.export (weights in MODEL.onnx.data):
#   1. a small conv net with a symbolic batch: random inputs (--shape)
#      compared with onnxruntime ("match", exit 0); a numpy-written .npy
#      given with --input: Apollo's outputs (kept by --save) equal
#      onnxruntime's on that array, computed here in Python; a .pb input
#      too; a .npy of the wrong shape, a truncated one, one in Fortran
#      order and one of an unsupported dtype refused naming the file;
#   2. --save DIR, then `check DIR` passes; a second --save into it is
#      refused; `check model.onnx --compare onnxruntime` passes;
#   3. the comparison can fail: onnxruntime's output perturbed by a
#      wrapper of the reference script ($APOLLO_ORT_REFERENCE) makes run
#      and check exit 1 naming the worst element; an interpreter without
#      onnxruntime makes them exit 3 saying how to install it;
#   4. a token model (Embedding, two inputs sharing the symbolic batch and
#      sequence dims): random token ids stay within the vocabulary, the
#      mask's shape comes from the ids', and it matches onnxruntime;
#   5. torchvision's resnet18 (random weights) at 1x3x224x224 against
#      onnxruntime;
#   5b. ONNX Attention (opset 23): 4-D causal grouped-query, 3-D with a
#      boolean mask, an additive mask, one launch each, against
#      onnxruntime; a KV cache output refused;
#   6. the GPU path through the stand-in driver (tests/cuda_standin.c): a
#      run at sm_90 loads, binds and launches the bundle (the stand-in does
#      not compute, so values are not compared).
# Skipped without torch/onnx/onnxruntime in .venv (failed instead where
# $APOLLO_REQUIRE names torch); part 5 without torchvision, part 6 without
# NVRTC or the stand-in.   env: APOLLO_BUILD
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc
n=0

fail() {
	echo "run_model: FAIL $*"
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

PY=$REPO/.venv/bin/python
if ! [ -x "$PY" ] || ! "$PY" -c "import torch, onnx, onnxruntime" 2>/dev/null; then
	ap_skip torch "run_model: SKIPPED: no torch/onnx/onnxruntime in .venv"
	exit $?
fi
M=$AP_TMP/net
T=$AP_TMP/tok
D=$AP_TMP/data
mkdir -p "$D"
"$PY" - "$M" "$T" "$D" >"$AP_TMP/export.log" 2>&1 <<'PYEOF' || { cat "$AP_TMP/export.log"; fail export; }
# model.onnx + model.onnx.data for a conv net (batch symbolic) and a token
# model (batch and seq symbolic, shared by its two inputs); the .npy and
# .pb inputs, good and bad, and onnxruntime's output on x.npy.
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

class Tok(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(1000, 32)
        self.fc = torch.nn.Linear(32, 8)

    def forward(self, ids, mask):
        return self.fc(torch.tanh(self.emb(ids)) * mask.unsqueeze(-1)).sum(dim=1)

torch.manual_seed(0)
net, tok, data = sys.argv[1:4]
for d in (net, tok):
    os.makedirs(d)
batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
torch.onnx.export(Net().eval(), (torch.randn(2, 3, 16, 16),), os.path.join(net, "model.onnx"),
                  input_names=["input"], output_names=["logits"], external_data=True,
                  dynamic_shapes={"x": {0: batch}})
torch.onnx.export(Tok().eval(), (torch.zeros(2, 5, dtype=torch.int64), torch.ones(2, 5)),
                  os.path.join(tok, "model.onnx"), input_names=["ids", "mask"],
                  output_names=["y"], external_data=True,
                  dynamic_shapes={"ids": {0: batch, 1: seq}, "mask": {0: batch, 1: seq}})
for d in (net, tok):
    m = onnx.load(os.path.join(d, "model.onnx"), load_external_data=False)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in m.graph.initializer), d
x = np.random.RandomState(1).randn(3, 3, 16, 16).astype(np.float32)
np.save(os.path.join(data, "x.npy"), x)
with open(os.path.join(data, "x.pb"), "wb") as f:
    f.write(numpy_helper.from_array(x, "input").SerializeToString())
y = ort.InferenceSession(os.path.join(net, "model.onnx")).run(None, {"input": x})[0]
np.save(os.path.join(data, "want.npy"), y)
np.save(os.path.join(data, "wrong_shape.npy"), np.zeros((3, 4, 16, 16), np.float32))
np.save(os.path.join(data, "fortran.npy"), np.asfortranarray(x))
np.save(os.path.join(data, "int16.npy"), np.zeros((3, 3, 16, 16), np.int16))
raw = open(os.path.join(data, "x.npy"), "rb").read()
open(os.path.join(data, "truncated.npy"), "wb").write(raw[:len(raw) - 100])
print("exported")
PYEOF
ap_start >/dev/null

# 1. random inputs, given inputs, bad inputs
expect 0 "^onnxruntime: all 1 outputs match$" "$CLIENT" run "$M/model.onnx" \
	--shape input=2x3x16x16 --compare onnxruntime
grep -q "^onnxruntime: output 0 'logits': match (max abs err" "$AP_TMP/out" ||
	fail "no per-output comparison line"
grep -q "^input 0 'input' float32 \[2,3,16,16\] random (seed 0)" "$AP_TMP/out" ||
	fail "random input line missing"
grep -Eq "^bundle: [0-9]+ launches" "$AP_TMP/out" || fail "no launch count"
grep -Eq "^output 0 'logits' float32 \[2,10\]: min .* max .* mean .*; first:" "$AP_TMP/out" ||
	fail "no output summary"
cp "$AP_TMP/out" "$AP_TMP/seed0"
expect 0 "random \(seed 7\)" "$CLIENT" run "$M/model.onnx" --shape input=2x3x16x16 --seed 7
cmp -s "$AP_TMP/out" "$AP_TMP/seed0" && fail "--seed 7 gave the inputs of seed 0"
expect 0 "all 1 outputs match" "$CLIENT" run "$M/model.onnx" --input "input=$D/x.npy" \
	--compare onnxruntime
grep -q "^input 0 'input' float32 \[3,3,16,16\] given" "$AP_TMP/out" || fail "x.npy not used"
expect 0 "saved: $AP_TMP/npy_run" "$CLIENT" run "$M/model.onnx" --input "input=$D/x.npy" \
	--save "$AP_TMP/npy_run"
# Apollo's output on x.npy (kept by --save) against onnxruntime's, computed in Python
"$PY" - "$AP_TMP/npy_run/test_data_set_0/output_0.pb" "$D/want.npy" <<'PYEOF' ||
import sys
import numpy as np, onnx
from onnx import numpy_helper
got = numpy_helper.to_array(onnx.load_tensor(sys.argv[1]))
want = np.load(sys.argv[2])
assert got.shape == want.shape == (3, 10), (got.shape, want.shape)
np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
PYEOF
	fail "Apollo's output on x.npy differs from onnxruntime's"
n=$((n + 1))
expect 0 "all 1 outputs match" "$CLIENT" run "$M/model.onnx" --input "input=$D/x.pb" \
	--compare onnxruntime
expect 1 "wrong_shape.npy: input 'input': dimension 1 is 3 in the model, 4 here" \
	"$CLIENT" run "$M/model.onnx" --input "input=$D/wrong_shape.npy"
expect 1 "truncated.npy: .* need 9216 data bytes, the file has 9116 \(the file is truncated\?\)" \
	"$CLIENT" run "$M/model.onnx" --input "input=$D/truncated.npy"
expect 1 "fortran.npy: the .npy array is in Fortran order" \
	"$CLIENT" run "$M/model.onnx" --input "input=$D/fortran.npy"
expect 1 "int16.npy: the .npy dtype '<i2' is not one Apollo takes" \
	"$CLIENT" run "$M/model.onnx" --input "input=$D/int16.npy"
expect 1 "give its shape with --shape input=DIMS" "$CLIENT" run "$M/model.onnx"
expect 1 "--input nope: the model has no input 'nope' \(its inputs: 'input'\)" \
	"$CLIENT" run "$M/model.onnx" --input "nope=$D/x.npy"
expect 2 "--compare takes onnxruntime" "$CLIENT" run "$M/model.onnx" --compare tvm
echo "run_model: $n run checks passed"

# 2. --save, then check; check MODEL.onnx
expect 0 "saved: $AP_TMP/saved .*onnxruntime's outputs" "$CLIENT" run "$M/model.onnx" \
	--shape input=2x3x16x16 --compare onnxruntime --save "$AP_TMP/saved"
[ -f "$AP_TMP/saved/model.onnx.data" ] && [ -f "$AP_TMP/saved/test_data_set_0/input_0.pb" ] &&
	[ -f "$AP_TMP/saved/test_data_set_0/output_0.pb" ] || fail "--save wrote $(ls -R "$AP_TMP/saved")"
expect 0 "^PASS $AP_TMP/saved +\(" "$CLIENT" check "$AP_TMP/saved" --atol 1e-4
expect 0 "PASS $AP_TMP/npy_run .*max abs err 0 " "$CLIENT" check "$AP_TMP/npy_run"
expect 1 "--save: $AP_TMP/saved is not empty" "$CLIENT" run "$M/model.onnx" \
	--shape input=2x3x16x16 --save "$AP_TMP/saved"
expect 0 "^PASS $M/model.onnx +\(1 output against onnxruntime" \
	"$CLIENT" check "$M/model.onnx" --compare onnxruntime --shape input=4x3x16x16
grep -q "^1 passed, 0 failed$" "$AP_TMP/out" || fail "check's summary line"
expect 0 "^PASS $M/model.onnx +\(" "$CLIENT" check "$M/model.onnx" --input "input=$D/x.npy"
grep -q "^input 0 'input' float32 \[3,3,16,16\] given" "$AP_TMP/out" || fail "check --input not used"
echo "run_model: $n checks passed after --save and check"

# 3. the comparison can fail, and says why
cat >"$AP_TMP/perturbed.py" <<PYEOF
# the real reference, then one element of onnxruntime's first output moved
import runpy, sys
import numpy as np
sys.argv[0] = "$REPO/tools/ort_reference.py"
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as e:
    if e.code:
        raise
path = sys.argv[2] + "/output_0.npy"
y = np.load(path)
y.flat[3] += 0.5
np.save(path, y)
PYEOF
expect 1 "onnxruntime: output 0 'logits': MISMATCH: 1 of 20 elements outside rtol 0.001, atol 0.0001; worst at \[0,3\]" \
	env APOLLO_ORT_REFERENCE="$AP_TMP/perturbed.py" "$CLIENT" run "$M/model.onnx" \
	--shape input=2x3x16x16 --compare onnxruntime
grep -q "1 of 1 outputs do not match" "$AP_TMP/out" || fail "no mismatch summary"
expect 1 "^FAIL $M/model.onnx +\(" env APOLLO_ORT_REFERENCE="$AP_TMP/perturbed.py" \
	"$CLIENT" check "$M/model.onnx" --shape input=2x3x16x16
grep -q "^0 passed, 1 failed$" "$AP_TMP/out" || fail "check's summary line after a mismatch"
# an interpreter whose onnxruntime cannot be imported
mkdir -p "$AP_TMP/noort"
echo 'raise ImportError("onnxruntime hidden by run_model.sh", name="onnxruntime")' \
	>"$AP_TMP/noort/onnxruntime.py"
printf '#!/bin/sh\nPYTHONPATH=%s exec %s "$@"\n' "$AP_TMP/noort" "$PY" >"$AP_TMP/python"
chmod +x "$AP_TMP/python"
expect 3 "onnxruntime cannot be imported by .*: install it there" \
	env APOLLO_PYTHON="$AP_TMP/python" "$CLIENT" run "$M/model.onnx" --shape input=1x3x16x16 \
	--compare onnxruntime
expect 3 "onnxruntime cannot be imported" env APOLLO_PYTHON="$AP_TMP/python" \
	"$CLIENT" check "$M/model.onnx" --shape input=1x3x16x16
echo "run_model: $n checks passed after failing comparisons"

# 4. token ids within the vocabulary; the mask's shape from the ids'
expect 0 "all 1 outputs match" "$CLIENT" run "$T/model.onnx" --shape ids=2x7 \
	--compare onnxruntime --seed 3
grep -q "^input 1 'mask' float32 \[2,7\] random" "$AP_TMP/out" || fail "mask's shape not bound"
max=$(sed -n "s/^input 0 'ids' int64 \[2,7\] random (seed 3): min [0-9]* max \([0-9]*\) .*/\1/p" "$AP_TMP/out")
[ -n "$max" ] && [ "$max" -lt 1000 ] && [ "$max" -ge 100 ] ||
	fail "token ids not drawn over the vocabulary of 1000 (max '$max')"
n=$((n + 1))
echo "run_model: $n checks passed after the token model"

# 5. a real torchvision model
if "$PY" -c "import torchvision" 2>/dev/null; then
	mkdir -p "$AP_TMP/r18"
	"$PY" - "$AP_TMP/r18/resnet18.onnx" >"$AP_TMP/r18.log" 2>&1 <<'PYEOF' ||
import sys
import torch, torchvision
torch.manual_seed(0)
m = torchvision.models.resnet18(weights=None).eval()
torch.onnx.export(m, (torch.randn(1, 3, 224, 224),), sys.argv[1], input_names=["input"],
                  output_names=["logits"])
PYEOF
		{ cat "$AP_TMP/r18.log"; fail "resnet18 export"; }
	[ -f "$AP_TMP/r18/resnet18.onnx.data" ] || fail "resnet18 has no external data"
	expect 0 "^onnxruntime: all 1 outputs match$" "$CLIENT" run \
		"$AP_TMP/r18/resnet18.onnx" --shape input=1x3x224x224 --compare onnxruntime
	grep -q "^output 0 'logits' float32 \[1,1000\]" "$AP_TMP/out" || fail "resnet18's output"
	echo "run_model: resnet18 matches onnxruntime"
else
	ap_skip torch "run_model: no torchvision in .venv: resnet18 skipped" || exit 1
fi

# 5b. ONNX Attention (opset 23) as Apollo's Attention op: the 4-D form
# causal with grouped-query heads, the 3-D form with q_num_heads and a
# boolean mask, an additive mask, float16 with softmax_precision FLOAT
# (Attention's fp32_scores: the float16 mask added in float32); each one
# launch, against onnxruntime; a
# KV cache (present_key) is refused naming it
mkdir -p "$AP_TMP/att"
"$PY" - "$AP_TMP/att" >"$AP_TMP/att.log" 2>&1 <<'PYEOF' || { cat "$AP_TMP/att.log"; fail "Attention models"; }
import sys
import onnx
from onnx import TensorProto as T, helper as h
vi = h.make_tensor_value_info
def save(name, inputs, node, shape, outs=("Y",), et=T.FLOAT):
    g = h.make_graph([node], name, inputs, [vi(o, et, shape) for o in outs])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 23)]), "%s/%s.onnx" % (sys.argv[1], name))
save("causal_gqa", [vi("Q", T.FLOAT, [2, 4, 9, 8]), vi("K", T.FLOAT, [2, 2, 11, 8]), vi("V", T.FLOAT, [2, 2, 11, 6])],
     h.make_node("Attention", ["Q", "K", "V"], ["Y"], is_causal=1), [2, 4, 9, 6])
save("heads3d_bool", [vi("Q", T.FLOAT, [2, 9, 32]), vi("K", T.FLOAT, [2, 11, 32]), vi("V", T.FLOAT, [2, 11, 24]),
                      vi("M", T.BOOL, [9, 11])],
     h.make_node("Attention", ["Q", "K", "V", "M"], ["Y"], q_num_heads=4, kv_num_heads=4, scale=0.2), [2, 9, 24])
save("additive", [vi("Q", T.FLOAT, [1, 2, 5, 4]), vi("K", T.FLOAT, [1, 2, 7, 4]), vi("V", T.FLOAT, [1, 2, 7, 4]),
                  vi("M", T.FLOAT, [1, 1, 5, 7])],
     h.make_node("Attention", ["Q", "K", "V", "M"], ["Y"]), [1, 2, 5, 4])
save("f16_fp32_softmax", [vi("Q", T.FLOAT16, [1, 2, 37, 16]), vi("K", T.FLOAT16, [1, 2, 45, 16]),
                          vi("V", T.FLOAT16, [1, 2, 45, 8]), vi("M", T.FLOAT16, [1, 1, 37, 45])],
     h.make_node("Attention", ["Q", "K", "V", "M"], ["Y"], softmax_precision=1, scale=2.0), [1, 2, 37, 8],
     et=T.FLOAT16)
save("kv_cache", [vi("Q", T.FLOAT, [1, 2, 5, 4]), vi("K", T.FLOAT, [1, 2, 7, 4]), vi("V", T.FLOAT, [1, 2, 7, 4])],
     h.make_node("Attention", ["Q", "K", "V"], ["Y", "PK"]), [1, 2, 5, 4], outs=("Y", "PK"))
PYEOF
for a in causal_gqa heads3d_bool additive f16_fp32_softmax; do
	expect 0 "^onnxruntime: all 1 outputs match$" "$CLIENT" run "$AP_TMP/att/$a.onnx" --compare onnxruntime
	grep -q "^bundle: 1 launches" "$AP_TMP/out" "$AP_TMP/err" || fail "Attention $a: not one launch"
done
expect 1 "Attention: output 1 .*present_key" "$CLIENT" run "$AP_TMP/att/kv_cache.onnx"
echo "run_model: ONNX Attention (opset 23) matches onnxruntime, one launch each"

# 6. the GPU path, through the stand-in driver
STANDIN=$APOLLO_BUILD/tests/libcuda-standin.so
if [ ! -f "$STANDIN" ]; then
	ap_skip standin "run_model: no stand-in driver at $STANDIN: the GPU path skipped" || exit 1
elif "$CLIENT" ping | grep -q "NVRTC none"; then
	ap_skip nvrtc "run_model: the daemon has no NVRTC: the GPU path skipped" || exit 1
else
	expect 0 "^bundle: [0-9]+ launches .*target sm_90" env APOLLO_LIBCUDA="$STANDIN" \
		"$CLIENT" run "$M/model.onnx" --shape input=1x3x16x16 --target sm_90 --format ptx
	grep -Eq "^output 0 'logits' float32 \[1,10\]" "$AP_TMP/out" || fail "no GPU output read back"
	expect 1 "load: .*(driver|CUDA)" env APOLLO_LIBCUDA="$AP_TMP/no-such-driver.so" \
		"$CLIENT" run "$M/model.onnx" --shape input=1x3x16x16 --target sm_90 --format ptx
fi
echo "run_model: $n checks passed"
