#!/usr/bin/env python3
"""gemm_device.py -- bench/gemm.sh's GEMM and attention shapes on a GPU
machine that has no onnx package (the device kit, tools/device-kit.sh).

    gemm_device.py make OUT [--shapes NAME,...]
    gemm_device.py report OUT [--repeat N] [--rehearsal]

`make` writes, for every shape of bench/gemm_shapes.py's SHAPES (or those
named) in float32, float16 and bfloat16, OUT/<name>__<dtype>/model.onnx --
the same model gemm_shapes.py builds (bfloat16 too here), serialized by a few lines of protobuf
encoding (byte for byte what onnx's helpers write) -- and test_data_set_0:
inputs uniform in [-1, 1] (gemm_shapes.py's generator and seed) and the
output computed by PyTorch in float64 (on the GPU when there is one) from
the values in the model's type, rounded to that type.  Without PyTorch the
MatMul / Gemm / attention references come from numpy; the convolutions get
zeros, marked "ref": false in OUT/shapes.json (only a rehearsal against the
stand-in driver, which checks no numbers, has no PyTorch).  Needs numpy.

`report` reads what device-check.sh left in each folder -- apollo_V.out
for V = tf32, simt (float32 with and without --allow-tf32), f16 and, on a
Hopper GPU, wg (the 16-bit shapes built for sm_90a: wgmma), wg_tf32 (the
float32 ones with --allow-tf32 for sm_90a) and new (the 16-bit ones with
--unvalidated), bf16 for the bfloat16 folders, each run with
APOLLO_LIBCUBLASLT=off so that the times are Apollo's kernels', and lib,
lib_tf32, lib_simt, lib_bf16 where the plan gives the product to cuBLASLt (the plan
as a user runs it): the
output of `apollo-client check --repeat N --profile` (the kernels' time
per run from the runtime's events, and the run's wall-clock median) --
times PyTorch's op on the same shape (bench/gemm_shapes.py torch_timer:
torch.matmul / addmm / conv2d / conv_transpose2d /
F.scaled_dot_product_attention, CUDA events, median) and prints one row
per shape and variant: Apollo's TFLOP/s beside PyTorch's, and their ratio
(Apollo / PyTorch: above 1, Apollo is faster).  --rehearsal: the times come
from the stand-in driver's made-up clock and are not reported.
"""
import argparse
import json
import math
import os
import re
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemm_shapes  # noqa: E402  (SHAPES, flops, describe, torch_timer: no onnx at import)

FLOAT, FLOAT16, BFLOAT16 = 1, 10, 16   # TensorProto.DataType
ELEM = {"float32": FLOAT, "float16": FLOAT16, "bfloat16": BFLOAT16}
ATTR_INT, ATTR_INTS = 2, 7      # AttributeProto.AttributeType


# ---- protobuf, the few ONNX messages needed ------------------------------------------

def _varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _int(field, n):
    return _varint(field << 3) + _varint(n)


def _bytes(field, payload):
    if isinstance(payload, str):
        payload = payload.encode()
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def tensor_proto(name, a, elem):
    """TensorProto: dims (1), data_type (2), name (8), raw_data (9)."""
    return b"".join(_int(1, d) for d in a.shape) + _int(2, elem) + _bytes(8, name) + \
        _bytes(9, a.tobytes())


def value_info(name, elem, shape):
    """ValueInfoProto: name (1), type (2) = TypeProto.tensor_type (1):
    elem_type (1), shape (2) of dim (1) with dim_value (1)."""
    t = _int(1, elem)
    if shape is not None:
        t += _bytes(2, b"".join(_bytes(1, _int(1, d)) for d in shape))
    return _bytes(1, name) + _bytes(2, _bytes(1, t))


def node_proto(op, ins, outs, attrs):
    """NodeProto: input (1), output (2), op_type (4), attribute (5), the
    attributes sorted by name as onnx.helper.make_node does."""
    b = b"".join(_bytes(1, i) for i in ins) + b"".join(_bytes(2, o) for o in outs) + _bytes(4, op)
    for k in sorted(attrs):
        v = attrs[k]
        if isinstance(v, (list, tuple)):
            a = _bytes(1, k) + b"".join(_int(8, x) for x in v) + _int(20, ATTR_INTS)
        else:
            a = _bytes(1, k) + _int(3, v) + _int(20, ATTR_INT)
        b += _bytes(5, a)
    return b


def model_proto(name, nodes, inits, inputs, outputs, opset=17):
    """ModelProto (ir_version 8, opset 17; 10 with a later opset) holding
    GraphProto: node (1), name (2), initializer (5), input (11), output
    (12)."""
    g = b"".join(_bytes(1, n) for n in nodes) + _bytes(2, name) + \
        b"".join(_bytes(5, t) for t in inits) + b"".join(_bytes(11, i) for i in inputs) + \
        b"".join(_bytes(12, o) for o in outputs)
    return _int(1, 8 if opset <= 17 else 10) + _bytes(7, g) + _bytes(8, _bytes(1, "") + _int(2, opset))


# ---- make -------------------------------------------------------------------------------

def as_type(a, dtype):
    """float32 array a in dtype: (the values the model holds, as float32 or
    float16; the array whose bytes the TensorProto carries).  numpy has no
    bfloat16: its values are float32 rounded to bfloat16's 7 fraction bits
    (to nearest, ties to even), its bytes their upper halves."""
    import numpy as np

    if dtype == "float32":
        a = a.astype(np.float32)
        return a, a
    if dtype == "float16":
        a = a.astype(np.float16)
        return a, a
    u = np.array(a, dtype=np.float32).view(np.uint32).astype(np.uint64)   # (0-d stays 0-d)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return (u.astype(np.uint32) << 16).view(np.float32), u

def out_shape(s):
    """The output shape of shape s (stride-1 transposed convolutions,
    dilation 1, symmetric pads, as in SHAPES)."""
    at = s.get("attrs", {})
    a, b = s["ins"][0][1], s["ins"][1][1]
    op = s["op"]
    if op == "MatMul":
        return a[:-1] + [b[-1]]
    if op == "Gemm":
        m = a[1] if at.get("transA") else a[0]
        n = b[0] if at.get("transB") else b[1]
        return [m, n]
    if op == "Conv":
        st = at.get("strides", [1, 1])
        p = at.get("pads", [0, 0, 0, 0])
        return [a[0], b[0]] + [(a[2 + i] + p[i] + p[i + 2] - b[2 + i]) // st[i] + 1
                               for i in range(2)]
    if op == "ConvTranspose":
        p = at.get("pads", [0, 0, 0, 0])
        return [a[0], b[1] * at.get("group", 1)] + [a[2 + i] - 1 - p[i] - p[i + 2] + b[2 + i]
                                                    for i in range(2)]
    if op == "Attention":
        q, v = s["ins"][0][1], s["ins"][2][1]
        return [q[0], q[1], v[2]]
    raise ValueError(op)


def build(s, dtype):
    """(model bytes, {input name: array}, [all operands in order], scale):
    gemm_shapes.build_model's model, serialized without onnx."""
    import numpy as np

    elem = ELEM[dtype]
    rng = np.random.default_rng(sum(map(ord, s["name"])))
    inputs, inits, data, ops = [], [], {}, []
    for name, shape, const in s["ins"]:
        a, raw = as_type(rng.uniform(-1, 1, size=shape).astype(np.float32), dtype)
        ops.append(a)
        if const:
            inits.append(tensor_proto(name, raw, elem))
        else:
            inputs.append(value_info(name, elem, shape))
            data[name] = raw
    scale = None
    if s["op"] == "Attention":     # gemm_shapes.build_model's: ONNX Attention, float32 scores
        scale = 1 / math.sqrt(s["ins"][0][1][-1])
        nodes = [node_proto("Attention", ["q", "k", "v"], ["y"], gemm_shapes.ATTENTION_ATTRS)]
    else:
        nodes = [node_proto(s["op"], [n for n, _, _ in s["ins"]], ["y"], s.get("attrs", {}))]
    m = model_proto(s["name"], nodes, inits, inputs, [value_info("y", elem, None)],
                    23 if s["op"] == "Attention" else 17)
    return m, data, ops, scale


def reference(s, ops, scale):
    """float64 output of shape s on operands ops: PyTorch (GPU if any),
    else numpy for products and attention, else None."""
    at = s.get("attrs", {})
    op = s["op"]
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        torch = None
    if torch is not None:
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        t = [torch.from_numpy(a.astype("float64")).to(dev) for a in ops]
        if op == "MatMul":
            y = torch.matmul(t[0], t[1])
        elif op == "Gemm":
            A = t[0].t() if at.get("transA") else t[0]
            B = t[1].t() if at.get("transB") else t[1]
            y = A @ B + (t[2] if len(t) > 2 else 0)
        elif op == "Conv":
            y = F.conv2d(t[0], t[1], t[2] if len(t) > 2 else None,
                         stride=at.get("strides", [1, 1]), padding=at.get("pads", [0, 0, 0, 0])[:2],
                         groups=at.get("group", 1))
        elif op == "ConvTranspose":
            y = F.conv_transpose2d(t[0], t[1], padding=at.get("pads", [0, 0, 0, 0])[:2])
        else:
            y = torch.softmax(t[0] @ t[1].transpose(1, 2) * float(scale), -1) @ t[2]
        return y.cpu().numpy()
    import numpy as np

    a = [x.astype(np.float64) for x in ops]
    if op == "MatMul":
        return a[0] @ a[1]
    if op == "Gemm":
        A = a[0].T if at.get("transA") else a[0]
        B = a[1].T if at.get("transB") else a[1]
        return A @ B + (a[2] if len(a) > 2 else 0)
    if op == "Attention":
        sc = a[0] @ a[1].transpose(0, 2, 1) * float(scale)
        e = np.exp(sc - sc.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ a[2]
    return None


def cmd_make(a):
    import numpy as np

    want = set(a.shapes.split(",")) if a.shapes else None
    shapes = [s for s in gemm_shapes.SHAPES if want is None or s["name"] in want]
    if want and len(shapes) != len(want):
        print("gemm_device: unknown shapes: %s" %
              ", ".join(sorted(want - {s["name"] for s in shapes})), file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for s in shapes:
        out = out_shape(s)
        fl = gemm_shapes.flops(s, out)
        for dt in ("float32", "float16", "bfloat16"):
            m, data, ops, scale = build(s, dt)
            y = reference(s, ops, scale)
            ref = y is not None
            y = as_type(np.zeros(out, np.float32) if y is None else y.astype(np.float32), dt)[1]
            if list(y.shape) != out:
                raise SystemExit("gemm_device: %s: reference shape %s, expected %s" %
                                 (s["name"], list(y.shape), out))
            d = os.path.join(a.out, "%s__%s" % (s["name"], dt))
            ts = os.path.join(d, "test_data_set_0")
            os.makedirs(ts, exist_ok=True)
            with open(os.path.join(d, "model.onnx"), "wb") as f:
                f.write(m)
            elem = ELEM[dt]
            for i, (name, _, const) in enumerate(n for n in s["ins"] if not n[2]):
                with open(os.path.join(ts, "input_%d.pb" % i), "wb") as f:
                    f.write(tensor_proto(name, data[name], elem))
            with open(os.path.join(ts, "output_0.pb"), "wb") as f:
                f.write(tensor_proto("y", y, elem))
            esize = 4 if dt == "float32" else 2   # float16, bfloat16
            rows.append(dict(dir=d, name=s["name"], dtype=dt, op=s["op"],
                             shape=gemm_shapes.describe(s, out), flops=fl,
                             bytes=esize * (sum(gemm_shapes.prod(sh) for _, sh, _ in s["ins"]) +
                                            gemm_shapes.prod(out)), ref=ref))
    with open(os.path.join(a.out, "shapes.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("gemm_device: %d folders in %s (references: %s)" %
          (len(rows), a.out, "all" if all(r["ref"] for r in rows) else
           "none for %d convolution folders (no PyTorch)" % sum(not r["ref"] for r in rows)))
    return 0


# ---- report -----------------------------------------------------------------------------

def parse_out(path):
    """(status, kernel ms per run, run wall ms, note, library) from one
    `apollo-client check --repeat N --profile` output; library: how many of
    the plan's library launches ran on cuBLASLt ("" without any)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return "-", None, None, "not run", ""
    kern = wall = None
    status, note, lib = "FAIL", "no result", ""
    for line in text.splitlines():
        m = re.match(r"^profile: (\d+) launches, ([0-9.]+) ms per run", line)
        if m:
            kern = float(m.group(2))
        m = re.match(r"^library: (\d+) of (\d+) launches on cuBLASLt", line)
        if m:
            lib = "%s/%s launches on cuBLASLt" % (m.group(1), m.group(2))
        m = re.match(r"^(PASS|FAIL) (\S+)\s+(.*)$", line)
        if m:
            status, note = m.group(1), m.group(3)
            r = re.search(r"run ([0-9.]+) ms median", line)
            if r:
                wall = float(r.group(1))
    return status, kern, wall, note, lib


def tflops(fl, ms):
    return fl / (ms * 1e-3) / 1e12 if ms else None


def cmd_report(a):
    with open(os.path.join(a.out, "shapes.json")) as f:
        rows = json.load(f)
    tr = gemm_shapes.torch_timer()
    if isinstance(tr, str):
        print("PyTorch: not available (%s): its times are not measured" % tr)
    if a.rehearsal:
        print("Apollo: times not measured (stand-in driver: kernels are launched, not run); "
              "check = the bundle compiled, loaded and launched through the runtime")
    else:
        print("Apollo: kernel time per timed run from the runtime's CUDA events (check --repeat %d "
              "--profile; the checked first run, which loads the kernels and the library, left "
              "out), wall = median run (launches and synchronisation); variants tf32, simt, f16, "
              "wg, new (sm_90a; new: --unvalidated, the TMA GEMM and the attention overlap), tuned (new "
              "built from measured tuning records): Apollo's kernels (APOLLO_LIBCUBLASLT=off), lib*: the plan as run by default, "
              "its library launches on cuBLASLt; PyTorch: CUDA "
              "events around the op, median; ratio = Apollo TFLOP/s / PyTorch TFLOP/s "
              "(above 1: Apollo faster)" % a.repeat)
    print("%-19s %-24s %-8s %9s  %-5s %9s %8s %9s  %9s %8s  %6s" % (
        "shape", "", "variant", "MFLOP", "check", "apollo ms", "TFLOP/s", "wall ms",
        "torch ms", "TFLOP/s", "ratio"))
    worst = []
    n_ok = n_bad = 0
    for r in rows:
        variants = ((("tf32", True), ("simt", False)) if r["dtype"] == "float32" else
                    (("bf16", False),) if r["dtype"] == "bfloat16" else (("f16", False),))
        # wg: the sm_90a kernel (wgmma), where the device is Hopper; new:
        # the forms not yet run on a GPU (--unvalidated: the GEMM's TMA form,
        # TMA + mbarrier stages and persistent blocks, and the attention
        # forward's softmax / O += P V overlap); lib,
        # lib_tf32: the plan as users run it, where it gives the product to
        # cuBLASLt (the others run Apollo's kernels: APOLLO_LIBCUBLASLT=off)
        # tuned: --unvalidated built from measured records (the device
        # kit's second apollod timed every candidate on the device first)
        variants += tuple((v, v in ("lib_tf32", "wg_tf32"))
                          for v in ("wg", "wg_tf32", "new", "tuned", "lib", "lib_tf32", "lib_simt", "lib_bf16")
                          if os.path.exists(os.path.join(r["dir"], "apollo_%s.out" % v)))
        for v, tf32 in variants:
            st, kern, wall, note, lib = parse_out(os.path.join(r["dir"], "apollo_%s.out" % v))
            n_ok += st == "PASS"
            n_bad += st != "PASS"
            if a.rehearsal and st == "PASS":
                st = "LOAD"
            if a.rehearsal:
                kern = wall = None
            t = None
            if not isinstance(tr, str):
                t = tr(r["name"], r["dtype"], tf32, max(a.repeat, 3))
            at, tt = tflops(r["flops"], kern), tflops(r["flops"], t if isinstance(t, float) else None)
            ratio = at / tt if at and tt else None
            if ratio and not v.startswith("lib"):
                worst.append((ratio, r["name"], v))
            fmt = lambda x, f: (f % x) if isinstance(x, float) else "-"
            line = "%-19s %-24s %-8s %9.1f  %-5s %9s %8s %9s  %9s %8s  %6s" % (
                r["name"], r["shape"][:24], v, r["flops"] / 1e6, st, fmt(kern, "%.4f"),
                fmt(at, "%.2f"), fmt(wall, "%.4f"), fmt(t, "%.4f"), fmt(tt, "%.2f"),
                fmt(ratio, "%.2f"))
            if st == "FAIL":
                line += "  " + note[:100]
            elif v.startswith("lib") and lib:
                line += "  " + lib
            elif isinstance(t, str):
                line += "  torch: " + t
            print(line)
    if worst:
        worst.sort()
        print("ratio Apollo's kernels/PyTorch: median %.2f, lowest %.2f (%s %s), highest %.2f (%s %s)" % (
            worst[len(worst) // 2][0], worst[0][0], worst[0][1], worst[0][2],
            worst[-1][0], worst[-1][1], worst[-1][2]))
    print("gemm checks: %d ok, %d failed, of %d%s" % (
        n_ok, n_bad, n_ok + n_bad, " (compiled, loaded and launched; numerics not checked)"
        if a.rehearsal else ""))
    return 0


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("out")
    m.add_argument("--shapes", default="")
    r = sub.add_parser("report")
    r.add_argument("out")
    r.add_argument("--repeat", type=int, default=20)
    r.add_argument("--rehearsal", action="store_true")
    a = p.parse_args(argv[1:])
    return cmd_make(a) if a.cmd == "make" else cmd_report(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
