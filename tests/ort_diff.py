#!/usr/bin/env python3
"""ort_diff.py -- fresh random inputs for ONNX test folders, with reference
outputs from onnxruntime, written as new backend-test folders.

    ort_diff.py --seed S --out DIR TESTDIR...

For each TESTDIR (model.onnx + test_data_set_0/input_K.pb): draws new inputs
with the shapes and dtypes of test_data_set_0 (float inputs from a normal
distribution with the original data's mean and spread; integer and bool
inputs kept as they are, since they are shapes, axes, indices or flags),
runs onnxruntime (CPU, graph optimisations off, like the shipped reference
outputs) and writes DIR/<name>/model.onnx (a symlink to the original) and
DIR/<name>/test_data_set_0/{input_K.pb,output_K.pb}.  Prints one line per
folder.  Used by tests/differential.sh; never at build time.
"""
import argparse
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper


def non_initializer_inputs(model):
    inits = {t.name for t in model.graph.initializer}
    inits |= {t.values.name for t in model.graph.sparse_initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def fresh_like(arr, rng):
    if arr.dtype.kind != "f" or arr.size == 0:
        return arr.copy()
    mean = float(np.mean(arr))
    std = float(np.std(arr))
    if not np.isfinite(std) or std == 0.0:
        std = 1.0
    if not np.isfinite(mean):
        mean = 0.0
    return (mean + std * rng.standard_normal(arr.shape)).astype(arr.dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("dirs", nargs="+")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    failed = 0
    for d in a.dirs:
        d = d.rstrip("/")
        name = os.path.basename(os.path.dirname(d)) + "__" + os.path.basename(d)
        try:
            model_path = os.path.abspath(os.path.join(d, "model.onnx"))
            model = onnx.load(model_path, load_external_data=False)
            names = non_initializer_inputs(model)
            inputs = []
            k = 0
            while os.path.exists(os.path.join(d, "test_data_set_0", "input_%d.pb" % k)):
                t = onnx.TensorProto()
                with open(os.path.join(d, "test_data_set_0", "input_%d.pb" % k), "rb") as f:
                    t.ParseFromString(f.read())
                inputs.append(numpy_helper.to_array(t))
                k += 1
            if len(inputs) != len(names):
                raise RuntimeError("%d input files for %d graph inputs" % (len(inputs), len(names)))
            feeds = {n: fresh_like(x, rng) for n, x in zip(names, inputs)}
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            so.log_severity_level = 3
            sess = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
            outs = sess.run(None, feeds)
            out_names = [o.name for o in sess.get_outputs()]
            target = os.path.join(a.out, name)
            ds = os.path.join(target, "test_data_set_0")
            os.makedirs(ds, exist_ok=True)
            link = os.path.join(target, "model.onnx")
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(model_path, link)
            for i, n in enumerate(names):
                with open(os.path.join(ds, "input_%d.pb" % i), "wb") as f:
                    f.write(numpy_helper.from_array(feeds[n], n).SerializeToString())
            for i, (n, o) in enumerate(zip(out_names, outs)):
                with open(os.path.join(ds, "output_%d.pb" % i), "wb") as f:
                    f.write(numpy_helper.from_array(np.asarray(o), n).SerializeToString())
            shapes = ", ".join("%s%s" % (n, list(feeds[n].shape)) for n in names)
            print("ort_diff: %s: %s -> %d outputs" % (name, shapes, len(outs)))
        except Exception as e:  # report and go on with the next folder
            print("ort_diff: %s: FAILED: %s" % (name, e))
            failed += 1
    sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
