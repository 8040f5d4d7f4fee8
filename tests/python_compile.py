#!/usr/bin/env python3
"""python_compile.py -- apollo.compile (issue 27, item 5) against a running
apollod ($APOLLO_SOCKET), compared with onnxruntime on random inputs
(float32 models: within rtol 1e-4, atol 1e-5, computed in float64):

  * mlp_gelu_ln (static shapes): positional and keyword calls, numpy and
    torch tensors in and out, the model given as a path, as bytes and as an
    onnx.ModelProto, a client passed in;
  * silero_vad_op18_ifless (symbolic batch): batch sizes 1 and 3, each
    compiled once and kept (a repeated shape compiles nothing);
  * external data: mlp_gelu_ln saved with its weights in model.onnx.data
    compiles and matches; a location outside the model's folder and a
    truncated data file are refused, naming the tensor;
  * errors: target "sm90" (ConfigError naming the forms, "did you mean
    sm_90"), an unknown fusion level and option key, at apollo.compile;
    a wrong dtype, a wrong rank, an unknown input name and a missing input
    at the call, each naming the input, what the model expects and what
    was given.

Prints one line per check; exits 1 on the first failure.

    python_compile.py
"""
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import torch

import apollo

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "testdata", "models")
MLP = os.path.join(MODELS, "mlp_gelu_ln", "model.onnx")
SILERO = os.path.join(MODELS, "silero_vad_op18_ifless", "model.onnx")
RTOL, ATOL = 1e-4, 1e-5


def check(cond, what):
    print("python_compile: %s: %s" % ("ok" if cond else "FAILED", what), flush=True)
    if not cond:
        sys.exit(1)


def close(got, want):
    """(within tolerance, largest absolute error), in float64."""
    g = np.asarray(got, np.float64)
    w = np.asarray(want, np.float64)
    if g.shape != w.shape:
        return False, float("inf")
    err = np.abs(g - w)
    return bool(np.all(err <= ATOL + RTOL * np.abs(w))), float(err.max()) if err.size else 0.0


def ort_run(path, feeds):
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def raises(fn, cls=apollo.ApolloError):
    try:
        fn()
    except cls as e:
        return e
    except Exception as e:      # the wrong kind of error
        print("python_compile: unexpected %s: %s" % (type(e).__name__, e))
        return None
    return None


def mlp(rng):
    m = apollo.compile(MLP, target="cpu")
    (name, dtype, shape), = [(i["name"], i["dtype"], i["shape"]) for i in m.inputs]
    check(dtype == "float32" and shape == [8, 512] and m.compiles == 1,
          "mlp_gelu_ln: input %s %s%s, compiled at apollo.compile" % (name, dtype, shape))
    x = rng.standard_normal((8, 512)).astype(np.float32)
    want = ort_run(MLP, {name: x})[0]
    y = m(x)
    ok, err = close(y, want)
    check(isinstance(y, np.ndarray) and y.dtype == np.float32 and ok and np.abs(want).max() > 0,
          "mlp_gelu_ln positional numpy: one output %s %s, max |err| %.2e vs onnxruntime" % (y.dtype, y.shape, err))
    y2 = m(**{name: x})
    check(np.array_equal(y, y2) and m.compiles == 1, "mlp_gelu_ln by keyword: the same values, no new compile")
    t = m(torch.from_numpy(x))
    ok, err = close(t.numpy(), want)
    check(isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.device.type == "cpu" and ok,
          "mlp_gelu_ln torch in, torch out: %s %s, max |err| %.2e" % (t.dtype, tuple(t.shape), err))
    xs = torch.from_numpy(x.copy()).T.contiguous().T          # a non-contiguous tensor
    ok, err = close(m(xs).numpy(), want)
    check(ok and not xs.is_contiguous(), "mlp_gelu_ln non-contiguous torch input: max |err| %.2e" % err)
    with open(MLP, "rb") as f:
        data = f.read()
    with apollo.Client() as c:
        yb = apollo.compile(data, client=c)(x)
        yp = apollo.compile(onnx.load(MLP), client=c, fusion="rules")(x)
    ok1, e1 = close(yb, want)
    ok2, e2 = close(yp, want)
    check(ok1 and ok2, "mlp_gelu_ln from bytes (%.2e) and from an onnx.ModelProto with fusion rules (%.2e), "
          "client= given" % (e1, e2))
    return m


def silero(rng):
    m = apollo.compile(SILERO)
    names = [i["name"] for i in m.inputs]
    check(names == ["input", "sr", "state"] and m.inputs[0]["shape"][0] == "batch" and m.compiles == 0,
          "silero: inputs %s, symbolic batch, nothing compiled before a call" % names)
    sr = np.array(16000, np.int64)
    for batch in (1, 3):
        x = rng.standard_normal((batch, 512)).astype(np.float32)
        st = (0.5 * rng.standard_normal((2, batch, 128))).astype(np.float32)
        want = ort_run(SILERO, {"input": x, "sr": sr, "state": st})
        got = m(x, sr, st)
        res = [close(g, w) for g, w in zip(got, want)]
        check(isinstance(got, list) and len(got) == 2 and all(ok for ok, _ in res)
              and [g.shape for g in got] == [w.shape for w in want],
              "silero batch %d positional: outputs %s, max |err| %s" % (
                  batch, [g.shape for g in got], ", ".join("%.2e" % e for _, e in res)))
        kw = m(state=st, input=x, sr=sr)
        check(all(np.array_equal(a, b) for a, b in zip(got, kw)), "silero batch %d by keyword: the same values" % batch)
        tt = m(torch.from_numpy(x), torch.from_numpy(sr), torch.from_numpy(st))
        check(all(isinstance(t, torch.Tensor) and np.array_equal(t.numpy(), g) for t, g in zip(tt, got)),
              "silero batch %d torch in, torch out: the same values" % batch)
    n = m.compiles
    m(rng.standard_normal((1, 512)).astype(np.float32), sr, np.zeros((2, 1, 128), np.float32))
    check(n == 2 and m.compiles == 2 and len(m.signatures) == 2,
          "silero: one compile per batch size (%d), none for a shape seen before" % m.compiles)
    return m


def external(rng, tmp):
    model = onnx.load(MLP)
    path = os.path.join(tmp, "ext", "model.onnx")
    os.makedirs(os.path.dirname(path))
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.onnx.data", size_threshold=0)
    n_ext = sum(1 for t in onnx.load(path, load_external_data=False).graph.initializer
                if t.data_location == onnx.TensorProto.EXTERNAL)
    x = rng.standard_normal((8, 512)).astype(np.float32)
    want = ort_run(MLP, {model.graph.input[0].name: x})[0]
    ok, err = close(apollo.compile(path)(x), want)
    check(n_ext > 0 and ok, "external data: %d tensors in model.onnx.data, output max |err| %.2e" % (n_ext, err))

    # a location outside the model's folder
    bad = onnx.load(path, load_external_data=False)
    t = next(t for t in bad.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL)
    for e in t.external_data:
        if e.key == "location":
            e.value = "../outside.data"
    with open(os.path.join(tmp, "outside.data"), "wb") as f:
        f.write(b"\0" * (1 << 20))
    p2 = os.path.join(tmp, "ext", "escape.onnx")
    onnx.save(bad, p2)
    e = raises(lambda: apollo.compile(p2))
    check(e is not None and "the model's folder" in e.message and e.tensor == t.name,
          "external data: a location outside the folder refused: %s" % (e.message[:120] if e else None))

    # a truncated data file
    with open(os.path.join(tmp, "ext", "model.onnx.data"), "r+b") as f:
        f.truncate(os.path.getsize(f.name) // 2)
    e = raises(lambda: apollo.compile(path))
    check(e is not None and "the file is truncated?" in e.message and e.tensor,
          "external data: a truncated file refused, tensor %s named: %s" % (e.tensor if e else None,
                                                                            e.message[:120] if e else None))
    e = raises(lambda: apollo.compile(onnx.load(path, load_external_data=False).SerializeToString()))
    check(e is not None and "pass the model's path" in e.message,
          "external data in bytes without a folder: %s" % (e.message[:100] if e else None))


def errors(m_mlp, m_silero):
    e = raises(lambda: apollo.compile(MLP, target="sm90"), apollo.ConfigError)
    check(e is not None and e.code == apollo.errors.EINVAL and "did you mean sm_90" in e.message
          and "compute_XX" in e.message, "target sm90: ConfigError: %s" % (e.message if e else None))
    e = raises(lambda: apollo.compile(MLP, target="sm_999"), apollo.ConfigError)
    check(e is not None and "no such target" in e.message, "target sm_999: %s" % (e.message if e else None))
    e = raises(lambda: apollo.compile(MLP, fusion="max"), apollo.ConfigError)
    check(e is not None and "unknown fusion level" in e.message, "fusion max: %s" % (e.message if e else None))
    e = raises(lambda: apollo.compile(MLP, tagret="cpu"), apollo.ConfigError)
    check(e is not None and "did you mean target" in e.message, "option tagret: %s" % (e.message if e else None))

    x64 = np.zeros((8, 512), np.float64)
    e = raises(lambda: m_mlp(x64))
    check(e is not None and "input_0" in e.message and "float32 [8, 512]" in e.message and "float64" in e.message,
          "wrong dtype: %s" % (e.message if e else None))
    e = raises(lambda: m_mlp(np.zeros((8, 512, 1), np.float32)))
    check(e is not None and e.code == apollo.errors.ESHAPE and "rank 3, not 2" in e.message,
          "wrong rank: %s" % (e.message if e else None))
    e = raises(lambda: m_mlp(np.zeros((4, 512), np.float32)))
    check(e is not None and "dim 0 is 4, not 8" in e.message, "wrong size: %s" % (e.message if e else None))
    e = raises(lambda: m_silero(inptu=np.zeros((1, 512), np.float32)))
    check(e is not None and "unknown input 'inptu'" in e.message and "did you mean input" in e.message,
          "unknown input name: %s" % (e.message if e else None))
    e = raises(lambda: m_silero(np.zeros((1, 512), np.float32)))
    check(e is not None and "sr, state not given" in e.message, "missing inputs: %s" % (e.message if e else None))
    e = raises(lambda: m_silero(np.zeros((2, 512), np.float32), np.array(16000, np.int64),
                                np.zeros((2, 3, 128), np.float32)))
    check(e is not None and "'batch' is 3 here but 2" in e.message,
          "symbol bound to two sizes: %s" % (e.message if e else None))


def main():
    rng = np.random.default_rng(27)
    m_mlp = mlp(rng)
    m_silero = silero(rng)
    with tempfile.TemporaryDirectory() as tmp:
        external(rng, tmp)
    errors(m_mlp, m_silero)
    print("python_compile: all passed")


if __name__ == "__main__":
    main()
