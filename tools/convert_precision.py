#!/usr/bin/env python3
"""convert_precision.py -- a float16 or bfloat16 copy of an ONNX test folder,
with reference outputs from onnxruntime.

    convert_precision.py --dtype float16|bfloat16 --out DIR TESTDIR...

For each TESTDIR (model.onnx + test_data_set_0/input_K.pb), writes
DIR/<dtype>__<name>/model.onnx: the same graph computing in the 16-bit type
-- every float32 initializer, Constant and ConstantOfShape value converted
(round to nearest even), every Cast to float32 inside the graph made a Cast
to the 16-bit type, every float32 graph input followed by a Cast to it and
every float32 graph output preceded by a Cast back -- so the folder's inputs
and outputs stay float32 ("mixed precision" as a training job feeds it).
Its test_data_set_0 holds the original inputs and, as outputs, what
onnxruntime (CPU, graph optimisations off) computes from the original
float32 model on them: the reference the 16-bit model is checked against,
with tolerances for its precision (docs/testing.md).  Used by
tests/precision.sh; never at build time.
"""
import argparse
import os
import shutil
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT


def bf16_bits(a):
    """float32 array -> uint16 bfloat16 patterns, round to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    r = np.where(nan, ((u >> 16) | 0x40) & 0xFFFF, r)
    return r.astype(np.uint16)


def to_16(t, dtype):
    """A float32 TensorProto as the 16-bit type (other types unchanged)."""
    if t.data_type != F32:
        return t
    a = numpy_helper.to_array(t)
    if dtype == TensorProto.FLOAT16:
        n = numpy_helper.from_array(a.astype(np.float16), t.name)
    else:
        n = TensorProto()
        n.name = t.name
        n.data_type = TensorProto.BFLOAT16
        n.dims.extend(a.shape)
        n.raw_data = bf16_bits(a).tobytes()
    return n


def convert_body(g, dtype):
    """Initializers, Constant / ConstantOfShape values and Casts to float32
    of graph g and of every subgraph (If / Loop / Scan bodies) in it."""
    for i, t in enumerate(list(g.initializer)):
        g.initializer[i].CopyFrom(to_16(t, dtype))
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.name == "value":
                a.t.CopyFrom(to_16(a.t, dtype))
            if n.op_type == "Cast" and a.name == "to" and a.i == F32:
                a.i = dtype
            if a.type == onnx.AttributeProto.GRAPH:
                convert_body(a.g, dtype)
            for sub in a.graphs:
                convert_body(sub, dtype)
    del g.value_info[:]


def convert_subgraph_io(g, dtype):
    """Subgraph inputs and outputs typed float32 become the 16-bit type."""
    for n in g.node:
        for a in n.attribute:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for sub in subs:
                for vi in list(sub.input) + list(sub.output):
                    if vi.type.tensor_type.elem_type == F32:
                        vi.type.tensor_type.elem_type = dtype
                convert_subgraph_io(sub, dtype)


def convert(model, dtype):
    g = model.graph
    convert_body(g, dtype)
    convert_subgraph_io(g, dtype)
    inits = {t.name for t in g.initializer}
    new_nodes = []
    # float32 inputs: Cast to the 16-bit type, readers renamed
    rename = {}
    for i in g.input:
        if i.name in inits or i.type.tensor_type.elem_type != F32:
            continue
        n16 = i.name + "__16"
        rename[i.name] = n16
        new_nodes.append(helper.make_node("Cast", [i.name], [n16], to=dtype, name=i.name + "__cast16"))
    # float32 outputs: made under a new name, read under it, Cast back
    made = {y for n in g.node for y in n.output}
    outs = {o.name: o.name + "__16" for o in g.output
            if o.type.tensor_type.elem_type == F32 and o.name in made}
    def retarget(nodes, top):
        """Readers of renamed tensors, in g and in the subgraphs that see
        them from the outer scope."""
        for n in nodes:
            n.input[:] = [rename.get(x, outs.get(x, x)) for x in n.input]
            if top:
                n.output[:] = [outs.get(x, x) for x in n.output]
            for a in n.attribute:
                for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    retarget(sub.node, False)
                    for o in sub.output:
                        o.name = rename.get(o.name, outs.get(o.name, o.name))

    retarget(g.node, True)
    new_nodes.extend(g.node)
    for o, o16 in outs.items():
        new_nodes.append(helper.make_node("Cast", [o16], [o], to=F32, name=o + "__cast32"))
    del g.node[:]
    g.node.extend(new_nodes)
    del g.value_info[:]
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", choices=["float16", "bfloat16"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("dirs", nargs="+")
    a = ap.parse_args()
    dtype = TensorProto.FLOAT16 if a.dtype == "float16" else TensorProto.BFLOAT16
    failed = 0
    for d in a.dirs:
        d = d.rstrip("/")
        name = a.dtype + "__" + os.path.basename(d)
        try:
            model = onnx.load(os.path.join(d, "model.onnx"))
            src_set = os.path.join(d, "test_data_set_0")
            inputs = []
            k = 0
            while os.path.exists(os.path.join(src_set, "input_%d.pb" % k)):
                t = TensorProto()
                with open(os.path.join(src_set, "input_%d.pb" % k), "rb") as f:
                    t.ParseFromString(f.read())
                inputs.append(t)
                k += 1
            inits = {t.name for t in model.graph.initializer}
            names = [i.name for i in model.graph.input if i.name not in inits]
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            feeds = {}
            for nm, t in zip(names, inputs):
                feeds[nm] = numpy_helper.to_array(t)
            # inputs the session wants that the data names differently: by position
            want = [i.name for i in sess.get_inputs()]
            feeds = {w: feeds.get(w, numpy_helper.to_array(inputs[j])) for j, w in enumerate(want)}
            outs = sess.run(None, feeds)
            out_dir = os.path.join(a.out, name)
            set_dir = os.path.join(out_dir, "test_data_set_0")
            os.makedirs(set_dir, exist_ok=True)
            conv = convert(model, dtype)
            onnx.save(conv, os.path.join(out_dir, "model.onnx"))
            for j in range(len(inputs)):
                shutil.copy(os.path.join(src_set, "input_%d.pb" % j), os.path.join(set_dir, "input_%d.pb" % j))
            for j, (o, arr) in enumerate(zip(sess.get_outputs(), outs)):
                t = numpy_helper.from_array(np.asarray(arr), o.name)
                with open(os.path.join(set_dir, "output_%d.pb" % j), "wb") as f:
                    f.write(t.SerializeToString())
            print("%s: %d inputs, %d outputs" % (name, len(inputs), len(outs)))
        except Exception as e:  # noqa: BLE001 -- report and go on
            failed += 1
            print("%s: FAILED: %s" % (name, e), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
