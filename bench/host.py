#!/usr/bin/env python3
"""host.py CHECK.out THREADS REPEAT -- the table bench/host.sh prints.

CHECK.out holds what `apollo-client check DIR... --target cpu --repeat
REPEAT --threads THREADS` printed: a "PASS DIR (..., run X ms median of N)"
or "FAIL DIR ..." line per test folder.  For every folder named there, this
script times onnxruntime on the same model and the same inputs
(DIR/test_data_set_0/input_*.pb, bound in order to the graph inputs that are
not initializers): CPUExecutionProvider, intra_op_num_threads = THREADS,
inter_op_num_threads = 1, sequential execution, the default graph
optimisations (ORT_ENABLE_ALL); one untimed run, then the median of REPEAT
timed runs -- as Apollo's check runs the model once (checked) and then
REPEAT timed times.  Prints, per folder, Apollo's and onnxruntime's
milliseconds and their ratio (Apollo / onnxruntime: how many times slower
Apollo is).  Prints numbers, asserts nothing.

Also imported by bench/gemm_shapes.py for load_inputs() and ort_ms().
"""
import glob
import os
import re
import statistics
import sys
import time

PASS_RE = re.compile(r"^PASS (\S+)\s.*run ([0-9.]+) ms median of (\d+)")
FAIL_RE = re.compile(r"^FAIL (\S+)\s+(.*)$")


def parse_check(path):
    """{dir: (ms or None, note)} from apollo-client check's output."""
    res = {}
    with open(path) as f:
        for line in f:
            m = PASS_RE.match(line)
            if m:
                res[os.path.normpath(m.group(1))] = (float(m.group(2)), "")
                continue
            m = FAIL_RE.match(line)
            if m:
                res[os.path.normpath(m.group(1))] = (None, "FAIL " + m.group(2).strip())
    return res


def load_inputs(d, model_path=None):
    """The feeds of test folder d: input_K.pb bound by position to the
    graph inputs that are not initializers (as the backend tests do)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(model_path or os.path.join(d, "model.onnx"), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    files = sorted(glob.glob(os.path.join(d, "test_data_set_0", "input_*.pb")),
                   key=lambda p: int(re.findall(r"(\d+)\.pb$", p)[0]))
    feeds = {}
    for name, p in zip(names, files):
        t = onnx.TensorProto()
        with open(p, "rb") as f:
            t.ParseFromString(f.read())
        feeds[name] = numpy_helper.to_array(t)
    return feeds


def ort_ms(model_path, feeds, threads, repeat):
    """Median milliseconds of `repeat` onnxruntime runs after one untimed
    run, or a string saying why there is none."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        return "no onnxruntime: %s" % e
    try:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.log_severity_level = 3
        s = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
        s.run(None, feeds)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            s.run(None, feeds)
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    except Exception as e:  # report and go on
        return "onnxruntime: %s" % str(e).strip().splitlines()[0][:100]


def main(argv):
    if len(argv) != 4:
        sys.stderr.write("usage: host.py CHECK.out THREADS REPEAT\n")
        return 2
    res = parse_check(argv[1])
    threads, repeat = int(argv[2]), int(argv[3])
    print("%-34s %12s %12s %8s" % ("model (target cpu)", "apollo ms", "ort ms", "ratio"))
    for d in sorted(res, key=lambda p: (os.path.basename(os.path.dirname(p)), os.path.basename(p))):
        ap, note = res[d]
        name = "%s/%s" % (os.path.basename(os.path.dirname(d)), os.path.basename(d))
        ort = ort_ms(os.path.join(d, "model.onnx"), load_inputs(d), threads, repeat)
        ap_s = "%.2f" % ap if ap is not None else "-"
        ort_s = "%.2f" % ort if isinstance(ort, float) else "-"
        ratio = "%.1fx" % (ap / ort) if ap is not None and isinstance(ort, float) and ort > 0 else "-"
        extra = [x for x in (note, ort if isinstance(ort, str) else "") if x]
        print("%-34s %12s %12s %8s%s" % (name, ap_s, ort_s, ratio,
                                          ("  " + "; ".join(extra)[:160]) if extra else ""))
    print("ratio = Apollo / onnxruntime (medians of %d runs each, %d thread%s each, the same inputs)"
          % (repeat, threads, "" if threads == 1 else "s"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
