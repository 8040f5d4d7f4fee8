#!/usr/bin/env python3
"""ort_reference.py -- onnxruntime's outputs for a model and its inputs: the
reference of `apollo-client run --compare onnxruntime` and `apollo-client
check MODEL.onnx` (client/run_ort.c runs it; people need not).

    ort_reference.py MODEL.onnx OUTDIR [NAME INPUT.npy]...

Runs MODEL (its external data beside it) on onnxruntime's CPU execution
provider with graph optimisations off (as the reference outputs of ONNX's
backend tests are made), each graph input NAME fed from its .npy file, and
writes output K (in the model's output order) to OUTDIR/output_K.npy.

Exit status: 0; 3 when numpy or onnxruntime cannot be imported (the message
says how to install them); 1 when onnxruntime fails on the model or an
output is not a tensor; 2 for a usage error.
"""
import os
import sys

UNAVAILABLE = 3


def main(argv):
    if len(argv) < 3 or len(argv) % 2 == 0:
        sys.stderr.write("usage: ort_reference.py MODEL.onnx OUTDIR [NAME INPUT.npy]...\n")
        return 2
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError as e:
        sys.stderr.write("ort_reference: %s cannot import %s (%s): install it with `%s -m pip "
                         "install onnxruntime numpy`\n" % (sys.executable, e.name or "onnxruntime", e,
                                                          sys.executable))
        return UNAVAILABLE
    model, outdir = argv[1], argv[2]
    feeds = {name: np.load(path, allow_pickle=False) for name, path in zip(argv[3::2], argv[4::2])}
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        outs = sess.run(None, feeds)
    except Exception as e:  # onnxruntime raises its own exception types
        sys.stderr.write("ort_reference: onnxruntime failed on %s: %s\n" % (model, e))
        return 1
    for k, v in enumerate(outs):
        if not isinstance(v, np.ndarray):
            sys.stderr.write("ort_reference: output %d of %s is a %s, not a tensor\n"
                             % (k, model, type(v).__name__))
            return 1
        np.save(os.path.join(outdir, "output_%d.npy" % k), np.ascontiguousarray(v), allow_pickle=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
