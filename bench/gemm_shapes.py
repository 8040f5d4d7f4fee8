#!/usr/bin/env python3
"""gemm_shapes.py -- the shapes and the table of bench/gemm.sh.

    gemm_shapes.py make OUT [--host-max-gflop G] [--all-data]
    gemm_shapes.py report OUT [--threads T] [--repeat N] [--gpu NAME]

The shapes are the GEMMs, convolutions and attention of the models under
../shared/testdata (models/ and training/; SHAPES below names the node each
comes from), square 2048^3, 4096^3 and 8192^3 MatMuls and attention at 2048 keys
(head dims 64 and 128: issue 25's rows).  `make` writes each as a
one-node ONNX model (the attention ONNX's Attention, ATTENTION_ATTRS) in
float32 and in
float16 (every tensor in that type), weights as initializers where the
model has them so and activations as graph inputs, as OUT/<name>__<dtype>/
model.onnx, with OUT/shapes.json describing them.  A shape whose modelled
FLOPs are at most G GFLOP (default 2) runs on the host; it (and every
shape with --all-data, for a GPU) gets test_data_set_0: random inputs
(uniform in [-1, 1], the same values in both types) and the outputs
onnxruntime (CPU) computes from them in float32 -- for float16, from the
float16 values, rounded to float16 at the end -- so `apollo-client check`
can run it.  OUT/host.list and OUT/data.list name those folders.

Modelled FLOPs: 2*M*N*K per product (times the batch); a convolution
2*N*O*OH*OW*(C/groups)*KH*KW; a transposed convolution 2*N*C*H*W*(O/groups)*
KH*KW over its input positions; attention the two products, 4*B*Nq*Nk*D
(the softmax not counted).  Minimum bytes: every input, weight and output
once.

`report` reads what bench/gemm.sh left in each folder -- ptxas_V.txt and
list_V.txt for V = tf32 and simt (float32 with and without --allow-tf32) or
f16: `apollo-kernels --target sm_90 --ptxas`, and the kernel list without
--ptxas (dynamic shared memory, schedules); host.out: `apollo-client check
--target cpu --repeat N`; gpu_V.out (`check --target sm_90`) when a GPU was
there -- times onnxruntime on the host-sized folders itself (bench/host.py:
same inputs, T threads, median of N after one untimed run) and prints one
row per shape and dtype.  Prints numbers, asserts nothing.
"""
import argparse
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The attention shapes' node: ONNX's Attention (opset 23) in its 3-D form, a
# shape's [B, N, D] as B sequences of one head (scale 1/sqrt(D), the
# default), with softmax_precision FLOAT: the scores and the softmax in
# float32, as F.scaled_dot_product_attention's fused kernels compute them
# (Apollo: Attention's fp32_scores).
ATTENTION_ATTRS = dict(q_num_heads=1, kv_num_heads=1, softmax_precision=1)

# name, the node of a model it is taken from, op, operands (name, shape,
# initializer?), attributes.
SHAPES = [
    dict(name="bert_qkv", src="bert_like_2l self_attn/MatMul (QKV)", op="MatMul",
         ins=[("x", [2, 64, 256], False), ("w", [256, 768], True)]),
    dict(name="bert_out_proj", src="bert_like_2l self_attn/Gemm (transB, bias)", op="Gemm",
         ins=[("x", [128, 256], False), ("w", [256, 256], True), ("b", [256], True)],
         attrs=dict(transB=1)),
    dict(name="bert_ffn1", src="bert_like_2l linear1/MatMul", op="MatMul",
         ins=[("x", [2, 64, 256], False), ("w", [256, 1024], True)]),
    dict(name="bert_ffn2", src="bert_like_2l linear2/MatMul", op="MatMul",
         ins=[("x", [2, 64, 1024], False), ("w", [1024, 256], True)]),
    dict(name="bert_attention", src="bert_like_2l self_attn MatMul_1 .. Softmax .. MatMul_2",
         op="Attention", ins=[("q", [8, 64, 64], False), ("k", [8, 64, 64], False),
                              ("v", [8, 64, 64], False)]),
    dict(name="mlp_l2", src="mlp_gelu_ln l2/Gemm (transB, bias)", op="Gemm",
         ins=[("x", [8, 1024], False), ("w", [1024, 1024], True), ("b", [1024], True)],
         attrs=dict(transB=1)),
    dict(name="prenorm_dW", src="prenorm_layer_train mm_8 (weight gradient, A^T)", op="Gemm",
         ins=[("a", [32, 64], False), ("b", [32, 256], False)], attrs=dict(transA=1)),
    dict(name="sq_conv1", src="squeezenet1_1 features.0 (3x3 stride 2)", op="Conv",
         ins=[("x", [1, 3, 224, 224], False), ("w", [64, 3, 3, 3], True), ("b", [64], True)],
         attrs=dict(strides=[2, 2])),
    dict(name="sq_fire2_squeeze", src="squeezenet1_1 features.3 squeeze (1x1)", op="Conv",
         ins=[("x", [1, 64, 55, 55], False), ("w", [16, 64, 1, 1], True), ("b", [16], True)]),
    dict(name="sq_fire2_expand3x3", src="squeezenet1_1 features.3 expand3x3", op="Conv",
         ins=[("x", [1, 16, 55, 55], False), ("w", [64, 16, 3, 3], True), ("b", [64], True)],
         attrs=dict(pads=[1, 1, 1, 1])),
    dict(name="sq_fire9_expand3x3", src="squeezenet1_1 features.11 expand3x3", op="Conv",
         ins=[("x", [1, 64, 13, 13], False), ("w", [256, 64, 3, 3], True), ("b", [256], True)],
         attrs=dict(pads=[1, 1, 1, 1])),
    dict(name="sq_classifier", src="squeezenet1_1 classifier.1 (1x1)", op="Conv",
         ins=[("x", [1, 512, 13, 13], False), ("w", [1000, 512, 1, 1], True),
              ("b", [1000], True)]),
    dict(name="ppocr_dw5x5", src="ppocr_mobile_v2_cls Conv.18 (depthwise 5x5)", op="Conv",
         ins=[("x", [1, 88, 3, 96], False), ("w", [88, 1, 5, 5], True)],
         attrs=dict(group=88, pads=[2, 2, 2, 2])),
    dict(name="convnet_fwd", src="small_convnet_train convolution_1 (forward)", op="Conv",
         ins=[("x", [4, 8, 16, 16], False), ("w", [16, 8, 3, 3], False), ("b", [16], False)],
         attrs=dict(pads=[1, 1, 1, 1])),
    dict(name="convnet_dX", src="small_convnet_train getitem (input gradient, ConvTranspose)",
         op="ConvTranspose",
         ins=[("dy", [4, 16, 16, 16], False), ("w", [16, 8, 3, 3], False)],
         attrs=dict(pads=[1, 1, 1, 1])),
    dict(name="convnet_dW", src="small_convnet_train convolution_backward__t4 (weight gradient)",
         op="Conv", ins=[("x", [8, 4, 16, 16], False), ("dy", [16, 4, 16, 16], False)],
         attrs=dict(pads=[1, 1, 1, 1])),
    dict(name="proj_dW_8k", src="a 256-wide projection's weight gradient at 8192 tokens (A^T)",
         op="Gemm", ins=[("a", [8192, 256], False), ("b", [8192, 256], False)],
         attrs=dict(transA=1)),
    dict(name="square_2048", src="square MatMul 2048 x 2048 x 2048", op="MatMul",
         ins=[("a", [2048, 2048], False), ("b", [2048, 2048], False)]),
    dict(name="square_4096", src="square MatMul 4096 x 4096 x 4096", op="MatMul",
         ins=[("a", [4096, 4096], False), ("b", [4096, 4096], False)]),
    dict(name="square_8192", src="square MatMul 8192 x 8192 x 8192", op="MatMul",
         ins=[("a", [8192, 8192], False), ("b", [8192, 8192], False)]),
    # issue 25's attention rows: S >= 2048 at head dims 64 and 128 (16 and 8
    # heads of a batch), beside F.scaled_dot_product_attention
    dict(name="attn_s2048_d64", src="attention, 16 heads x 2048 queries x 2048 keys, head dim 64",
         op="Attention", ins=[("q", [16, 2048, 64], False), ("k", [16, 2048, 64], False),
                              ("v", [16, 2048, 64], False)]),
    dict(name="attn_s2048_d128", src="attention, 8 heads x 2048 queries x 2048 keys, head dim 128",
         op="Attention", ins=[("q", [8, 2048, 128], False), ("k", [8, 2048, 128], False),
                              ("v", [8, 2048, 128], False)]),
]

DTYPES = ("float32", "float16")


def prod(xs):
    p = 1
    for x in xs:
        p *= x
    return p


def build_model(s, dtype):
    """The one-node (or attention) ONNX model of shape s, all in dtype."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    et = TensorProto.FLOAT if dtype == "float32" else TensorProto.FLOAT16
    npt = np.float32 if dtype == "float32" else np.float16
    rng = np.random.default_rng(sum(map(ord, s["name"])))
    inputs, inits, data = [], [], {}
    for name, shape, const in s["ins"]:
        a = rng.uniform(-1, 1, size=shape).astype(np.float32).astype(npt)
        if const:
            inits.append(numpy_helper.from_array(a, name))
        else:
            inputs.append(helper.make_tensor_value_info(name, et, shape))
            data[name] = a
    names = [n for n, _, _ in s["ins"]]
    if s["op"] == "Attention":
        nodes = [helper.make_node("Attention", ["q", "k", "v"], ["y"], **ATTENTION_ATTRS)]
    else:
        nodes = [helper.make_node(s["op"], names, ["y"], **s.get("attrs", {}))]
    g = helper.make_graph(nodes, s["name"], inputs, [helper.make_tensor_value_info("y", et, None)],
                          initializer=inits)
    att = s["op"] == "Attention"
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23 if att else 17)])
    m.ir_version = 10 if att else 8
    return m, data


def output_shape(m):
    from onnx import shape_inference

    m2 = shape_inference.infer_shapes(m, strict_mode=True)
    return [d.dim_value for d in m2.graph.output[0].type.tensor_type.shape.dim]


def flops(s, out):
    """Modelled FLOPs of shape s with output shape out (file comment)."""
    op, at = s["op"], s.get("attrs", {})
    a, b = s["ins"][0][1], s["ins"][1][1]
    if op == "MatMul":
        return 2 * prod(out) * a[-1]
    if op == "Gemm":
        return 2 * prod(out) * (a[0] if at.get("transA") else a[1])
    if op == "Conv":                # out [N, O, OH, OW], W [O, C/g, KH, KW]
        return 2 * prod(out) * prod(b[1:])
    if op == "ConvTranspose":       # X [N, C, H, W], W [C, O/g, KH, KW]
        return 2 * prod(a) * prod(b[1:])
    if op == "Attention":           # Q [B, Nq, D], K [B, Nk, D], V [B, Nk, Dv]
        v = s["ins"][2][1]
        return 2 * a[0] * a[1] * b[1] * (a[2] + v[2])
    raise ValueError(op)


def describe(s, out):
    """A short shape: MxNxK (batch), or the convolution's dims."""
    op, at = s["op"], s.get("attrs", {})
    if op in ("MatMul", "Gemm"):
        a = s["ins"][0][1]
        k = a[0] if at.get("transA") else a[-1]
        m = prod(out[:-1])
        t = "".join(x for x, f in (("A^T", at.get("transA")), ("B^T", at.get("transB"))) if f)
        return "%dx%dx%d%s" % (m, out[-1], k, " " + t if t else "")
    if op == "Attention":
        q, k = s["ins"][0][1], s["ins"][1][1]
        return "b%d q%d k%d d%d" % (q[0], q[1], k[1], q[2])
    x, w = s["ins"][0][1], s["ins"][1][1]
    desc = "%s*%s" % ("x".join(map(str, x)), "x".join(map(str, w)))
    if at.get("strides", [1])[0] != 1:
        desc += " s%d" % at["strides"][0]
    if at.get("group", 1) != 1:
        desc += " g%d" % at["group"]
    return desc


def cmd_make(a):
    import numpy as np
    from onnx import numpy_helper, save

    os.makedirs(a.out, exist_ok=True)
    rows = []
    for s in SHAPES:
        m32, d32 = build_model(s, "float32")
        out = output_shape(m32)
        fl = flops(s, out)
        on_host = fl <= a.host_max_gflop * 1e9
        with_data = a.all_data or on_host
        for dt in DTYPES:
            m, data = (m32, d32) if dt == "float32" else build_model(s, dt)
            d = os.path.join(a.out, "%s__%s" % (s["name"], dt))
            os.makedirs(d, exist_ok=True)
            save(m, os.path.join(d, "model.onnx"))
            if with_data:
                ref_m = m32
                feeds = {k: v.astype(np.float32) for k, v in data.items()}
                if dt == "float16":
                    # float32 model on the float16 values (its initializers too)
                    ref_m, _ = build_model(s, "float32")
                    for init, init16 in zip(ref_m.graph.initializer, m.graph.initializer):
                        init.CopyFrom(numpy_helper.from_array(
                            numpy_helper.to_array(init16).astype(np.float32), init.name))
                y = run_ort(ref_m, feeds)
                if dt == "float16":
                    y = y.astype(np.float16)
                ts = os.path.join(d, "test_data_set_0")
                os.makedirs(ts, exist_ok=True)
                for i, v in enumerate(m.graph.input):
                    write_pb(os.path.join(ts, "input_%d.pb" % i), data[v.name], v.name)
                write_pb(os.path.join(ts, "output_0.pb"), y, "y")
            esize = 4 if dt == "float32" else 2
            rows.append(dict(dir=d, name=s["name"], src=s["src"], dtype=dt, op=s["op"],
                             shape=describe(s, out), flops=fl,
                             bytes=esize * (sum(prod(sh) for _, sh, _ in s["ins"]) + prod(out)),
                             data=with_data, host=on_host))
    with open(os.path.join(a.out, "shapes.json"), "w") as f:
        json.dump(rows, f, indent=1)
    # for bench/gemm.sh: the folders to run on the host, and on a GPU
    for name, pick in (("host.list", "host"), ("data.list", "data")):
        with open(os.path.join(a.out, name), "w") as f:
            f.writelines(r["dir"] + "\n" for r in rows if r[pick])
    return 0


def run_ort(m, feeds):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def write_pb(path, a, name):
    from onnx import numpy_helper

    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(a, name).SerializeToString())


# ---- report ---------------------------------------------------------------------------

PTXAS_RE = re.compile(r"^(\S+): (\d+) registers, spills (\d+) / (\d+) bytes, shared (\d+) bytes; (.*)$")


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def sched_short(sched):
    """'emitter gemm: bm=16 bn=32 bk=16 wm=1 wn=2 stages=3' -> 'gemm 16x32x16 w1x2 s3'."""
    m = re.match(r"emitter (\w+):?(.*)$", sched)
    if not m:
        return sched
    kv = dict(re.findall(r"(\w+)=(\d+)", m.group(2)))
    em = m.group(1)
    if all(k in kv for k in ("bm", "bn", "bk")):
        t = "%sx%sx%s" % (kv["bm"], kv["bn"], kv["bk"])
        if "wm" in kv:
            t += " w%sx%s" % (kv["wm"], kv.get("wn", "?"))
        if "tm" in kv:
            t += " t%sx%s" % (kv["tm"], kv.get("tn", "?"))
        if "stages" in kv:
            t += " s%s" % kv["stages"]
        return "%s %s" % (em, t)
    return "%s %s" % (em, " ".join("%s=%s" % x for x in kv.items()))


def kernel_list(text):
    """{kernel: (dynamic shared bytes, schedule)} from the kernel list
    (apollo-kernels without --ptxas: its '==== NAME: ... dynamic shared B
    bytes' headers and 'emitter ...' comments)."""
    ks, cur = {}, None
    for line in (text or "").splitlines():
        m = re.match(r"^/\* ==== (\S+): .*dynamic shared (\d+) bytes", line)
        if m:
            cur = m.group(1)
            ks[cur] = (int(m.group(2)), "")
            continue
        m = re.match(r"^\s*/\* (emitter .*?) ?\*/", line)
        if m and cur and not ks[cur][1]:
            ks[cur] = (ks[cur][0], m.group(1))
    return ks


def ptxas_cell(text, listing):
    """The main kernel (the GEMM or attention one, else the one with the
    most registers) of one apollo-kernels --ptxas output: 'R regs, spills,
    shared (static + dynamic), schedule (+ other kernels)'; or why there
    is none."""
    if text is None:
        return "-"
    lst = kernel_list(listing)
    if "needs a CUDA target and NVRTC" in text or "NVRTC not found" in text:
        sched = [s for _, s in lst.values() if re.match(r"emitter (gemm|attention)", s)]
        return "no NVRTC" + ("; " + sched_short(sched[0]) if sched else "") + \
            (" +%dk" % (len(lst) - 1) if len(lst) > 1 else "")
    ks = []
    for line in text.splitlines():
        m = PTXAS_RE.match(line)
        if m:
            ks.append((m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)),
                       int(m.group(5)), m.group(6)))
        elif re.match(r"^\S+: (NVRTC failed|no ptxas report)", line):
            return line.split(": ", 1)[1][:60]
    if not ks:
        first = next((l for l in text.splitlines() if l.strip() and not l.startswith("/*")), "?")
        return "error: " + first.replace("apollo-kernels: ", "")[:60]
    main = [k for k in ks if re.match(r"emitter (gemm|attention)", k[5])]
    k = main[0] if main else max(ks, key=lambda k: k[1])
    spill = "0" if k[2] == 0 and k[3] == 0 else "%d/%d" % (k[2], k[3])
    shared = k[4] + lst.get(k[0], (0, ""))[0]
    cell = "%3dr sp%s %5.1fK %s" % (k[1], spill, shared / 1024, sched_short(k[5]))
    if len(ks) > 1:
        cell += " +%dk" % (len(ks) - 1)
    return cell


def check_ms(text, d):
    """(ms, note) for folder d from apollo-client check's output."""
    if text is None:
        return None, None
    d = os.path.normpath(d)
    for line in text.splitlines():
        m = re.match(r"^(PASS|FAIL) (\S+)\s+(.*)$", line)
        if not m or os.path.normpath(m.group(2)) != d:
            continue
        r = re.search(r"run ([0-9.]+) ms median", line)
        if m.group(1) == "PASS" and r:
            return float(r.group(1)), None
        return None, ("FAIL " + m.group(3))[:70]
    return None, "no result"


def gflops(fl, ms):
    return fl / (ms * 1e-3) / 1e9


def cmd_report(a):
    import host

    with open(os.path.join(a.out, "shapes.json")) as f:
        rows = json.load(f)
    print("bench/gemm: sm_90 kernels from apollo-kernels --ptxas (NVRTC, -Xptxas -v); "
          "host on target cpu, %d thread%s, median of %d runs" %
          (a.threads, "" if a.threads == 1 else "s", a.repeat))
    print("  ptxas cell: registers/thread, spills (store/load bytes), shared KiB (static + dynamic), "
          "emitter and tile bm x bn x bk, warps wm x wn (tensor cores) or thread tile "
          "tm x tn (SIMT), stages; +Nk: other kernels of the model")
    print("  host: Apollo's and onnxruntime's ms on the same inputs, GFLOP/s, ratio "
          "Apollo / onnxruntime (whose CPU provider runs float16 nodes in float32 between "
          "Casts it inserts)")
    hdr = "%-19s %-24s %-7s %8s %8s  %-40s %-40s  %s" % (
        "shape", "", "dtype", "MFLOP", "min KB", "sm_90 tf32 / float16 mma", "sm_90 SIMT",
        "host (cpu)")
    print(hdr)
    for r in rows:
        d = r["dir"]
        cell = lambda v: ptxas_cell(read(os.path.join(d, "ptxas_%s.txt" % v)),
                                    read(os.path.join(d, "list_%s.txt" % v)))
        if r["dtype"] == "float32":
            tc, simt = cell("tf32"), cell("simt")
        else:
            tc, simt = cell("f16"), ""
        if not r["host"]:
            hc = "skipped (host): %.1f GFLOP" % (r["flops"] / 1e9)
        else:
            ap, note = check_ms(read(os.path.join(d, "host.out")), d)
            ort = host.ort_ms(os.path.join(d, "model.onnx"), host.load_inputs(d), a.threads,
                              a.repeat)
            parts = []
            parts.append("apollo %.3f ms %.1f GF/s" % (ap, gflops(r["flops"], ap)) if ap
                         else "apollo %s" % (note or "-"))
            parts.append("ort %.3f ms %.1f GF/s" % (ort, gflops(r["flops"], ort))
                         if isinstance(ort, float) else "ort: %s" % ort)
            if ap and isinstance(ort, float):
                parts.append("%.1fx" % (ap / ort))
            hc = ", ".join(parts)
        print("%-19s %-24s %-7s %8.1f %8.0f  %-40s %-40s  %s" % (
            r["name"], r["shape"][:24], r["dtype"], r["flops"] / 1e6, r["bytes"] / 1024, tc,
            simt, hc))
    if a.gpu:
        gpu_report(a, rows)
    else:
        print("GPU: no GPU (nvidia-smi absent or failing): achieved TFLOP/s not measured")
    return 0


def gpu_report(a, rows):
    """Best effort, where nvidia-smi works: Apollo's run time on sm_90
    through the runtime (gpu_tf32.out / gpu_simt.out / gpu_f16.out from
    apollo-client check --target sm_90) and PyTorch's for the same op."""
    tr = torch_timer()
    print("GPU: %s -- Apollo through the runtime (apollo-client check --target sm_90: "
          "wall clock of a run, launches and synchronisation, median of %d) beside PyTorch "
          "(cuBLAS/cuDNN, CUDA events)%s" %
          (a.gpu, a.repeat, ": " + tr if isinstance(tr, str) else ""))
    for r in rows:
        d = r["dir"]
        cells = []
        variants = (("tf32", "gpu_tf32.out", True), ("simt", "gpu_simt.out", False)) \
            if r["dtype"] == "float32" else (("mma", "gpu_f16.out", False),)
        for label, fname, tf32 in variants:
            ms, note = check_ms(read(os.path.join(d, fname)), d)
            c = "%s apollo %s" % (label, "%.3f ms %.2f TF/s" % (ms, r["flops"] / ms / 1e9)
                                  if ms else (note or "-"))
            if not isinstance(tr, str):
                t = tr(r["name"], r["dtype"], tf32, a.repeat)
                c += (", torch %.3f ms %.2f TF/s" % (t, r["flops"] / t / 1e9)
                      if isinstance(t, float) else ", torch: " + t)
            cells.append(c)
        print("%-19s %-7s  %s" % (r["name"], r["dtype"], " | ".join(cells)))


def torch_timer():
    """A function (name, dtype, tf32, repeat) -> ms of PyTorch's op on the
    GPU, or a string saying why there is none."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return "PyTorch not installed"
    if not torch.cuda.is_available():
        return "torch.cuda not available"
    by_name = {s["name"]: s for s in SHAPES}

    def run(name, dtype, tf32, repeat):
        s = by_name[name]
        dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(dtype, torch.float16)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        t = [torch.rand(sh, device="cuda", dtype=dt) * 2 - 1 for _, sh, _ in s["ins"]]
        at = s.get("attrs", {})
        op = s["op"]
        if op == "MatMul":
            f = lambda: torch.matmul(t[0], t[1])
        elif op == "Gemm":
            A = t[0].t() if at.get("transA") else t[0]
            B = t[1].t() if at.get("transB") else t[1]
            f = (lambda: torch.addmm(t[2], A, B)) if len(t) > 2 else (lambda: A @ B)
        elif op == "Conv":
            f = lambda: F.conv2d(t[0], t[1], t[2] if len(t) > 2 else None,
                                 stride=at.get("strides", [1, 1]),
                                 padding=at.get("pads", [0, 0, 0, 0])[:2], groups=at.get("group", 1))
        elif op == "ConvTranspose":
            f = lambda: F.conv_transpose2d(t[0], t[1], padding=at.get("pads", [0, 0, 0, 0])[:2])
        elif op == "Attention":
            if hasattr(F, "scaled_dot_product_attention"):   # FlashAttention where it applies
                f = lambda: F.scaled_dot_product_attention(t[0], t[1], t[2])
            else:
                sc = 1 / math.sqrt(t[0].shape[-1])
                f = lambda: torch.softmax((t[0] @ t[1].transpose(1, 2)) * sc, -1) @ t[2]
        else:
            return "no PyTorch form"
        try:
            f()
            torch.cuda.synchronize()
            ms = []
            for _ in range(max(repeat, 3)):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                f()
                e1.record()
                torch.cuda.synchronize()
                ms.append(e0.elapsed_time(e1))
            ms.sort()
            return ms[len(ms) // 2]
        except Exception as e:  # report and go on
            return str(e).splitlines()[0][:60]

    return run


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("out")
    m.add_argument("--host-max-gflop", type=float, default=2.0)
    m.add_argument("--all-data", action="store_true")
    r = sub.add_parser("report")
    r.add_argument("out")
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--repeat", type=int, default=5)
    r.add_argument("--gpu", default="")
    a = p.parse_args(argv[1:])
    return cmd_make(a) if a.cmd == "make" else cmd_report(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
