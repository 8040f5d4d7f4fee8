#!/usr/bin/env python3
"""fusion.py FUSION.jsonl -- the table bench/fusion.sh prints.

Each line of FUSION.jsonl is {"dir", "level", "result"}, result being what
`apollo-client submit --json` wrote for DIR/model.onnx at that fusion level.
Per model and level: launches (kernels), eager kernels, launches/eager,
global, eager and min bytes, global/min, and the share of eager's avoidable
traffic the plan still moves, (global - min) / (eager - min).  Beside them,
per model: the ONNX graph's node count and that of onnxruntime's own
optimized graph (GraphOptimizationLevel ORT_ENABLE_EXTENDED on the CPU
provider, saved with optimized_model_filepath and read back), both without
views (Reshape, Identity, Squeeze, Unsqueeze, Flatten) and Constant nodes;
an If counts as the nodes of its larger branch, a Loop or Scan as its body
once.  onnxruntime
is optional: without it (or when it cannot load a model) those columns say
"-".  Prints numbers, asserts nothing.
"""
import json
import os
import sys
import tempfile

NOT_COUNTED = {"Reshape", "Identity", "Squeeze", "Unsqueeze", "Flatten", "Constant"}


def count_nodes(graph):
    """Nodes that compute, views and Constant aside; an If counts as its
    larger branch (one of them runs), a Loop or Scan as its body once."""
    total = 0
    for n in graph.node:
        bodies = [a.g for a in n.attribute if a.HasField("g")]
        if bodies:
            total += max(count_nodes(b) for b in bodies)
        elif n.op_type not in NOT_COUNTED:
            total += 1
    return total


def ort_counts(model_path):
    """(ONNX nodes, onnxruntime-optimized nodes, note), views not counted."""
    try:
        import onnx
        import onnxruntime as ort
    except ImportError as e:
        return None, None, "no onnxruntime: %s" % e
    fd, opt_path = tempfile.mkstemp(suffix=".onnx")
    os.close(fd)
    try:
        orig = count_nodes(onnx.load(model_path, load_external_data=False).graph)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = opt_path
        so.log_severity_level = 3
        ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
        opt = count_nodes(onnx.load(opt_path, load_external_data=False).graph)
        return orig, opt, None
    except Exception as e:  # report and go on
        return None, None, "onnxruntime: %s" % str(e).splitlines()[0]
    finally:
        for p in (opt_path, opt_path + ".data"):
            if os.path.exists(p):
                os.remove(p)


def ratio(a, b):
    return "%.3f" % (a / b) if b else "-"


def main():
    rows = []
    with open(sys.argv[1]) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    ort_version = "-"
    try:
        import onnxruntime
        ort_version = onnxruntime.__version__
    except ImportError:
        pass
    counts = {}
    notes = []
    for r in rows:
        d = r["dir"]
        if d not in counts:
            counts[d] = ort_counts(os.path.join(d, "model.onnx"))
            if counts[d][2]:
                notes.append("%s: %s" % (os.path.basename(d), counts[d][2]))
    fmt = "%-24s %-6s %7s %6s %8s %12s %12s %12s %10s %7s %7s %6s %6s %8s"
    print(fmt % ("model", "level", "kernels", "eager", "k/eager", "global B", "eager B", "min B",
                 "global/min", "avoid.", "II/III", "onnx", "ort", "ort/onnx"))
    for r in rows:
        x = r["result"]
        g, e, m = x.get("global_bytes", 0), x.get("eager_bytes", 0), x.get("min_bytes", 0)
        k, ek = x.get("kernels", 0), x.get("eager_kernels", 0)
        onnx_n, ort_n, _ = counts[r["dir"]]
        ly = x.get("layers", {})
        print(fmt % (os.path.basename(r["dir"]), r["level"], k, ek, ratio(k, ek), g, e, m,
                     ratio(g, m), ratio(g - m, e - m) if e > m else "-",
                     "%d/%d" % (ly.get("II", 0), ly.get("III", 0)),
                     "-" if onnx_n is None else onnx_n, "-" if ort_n is None else ort_n,
                     ratio(ort_n, onnx_n) if onnx_n and ort_n is not None else "-"))
    print("kernels: launches in the plan; eager: one kernel per imported node (views free);")
    print("global/eager/min B: modelled global-memory traffic of the plan, of eager, and the floor;")
    print("avoid.: (global - min) / (eager - min), the share of eager's avoidable traffic left;")
    print("II/III: micro-graphs stitched by Layer II (stitched kernels made) / launched together by Layer III;")
    print("onnx / ort: nodes of the ONNX graph / of onnxruntime %s's ORT_ENABLE_EXTENDED graph "
          "(views and Constant not counted;" % ort_version)
    print("  an If counts as its larger branch, a Loop/Scan as its body once).")
    for n in notes:
        print("note: " + n)


if __name__ == "__main__":
    main()
