#!/usr/bin/env python3
"""python_api.py -- the apollo Python package against a running apollod
($APOLLO_SOCKET): client calls, graphs built through the C graph IR,
submits, the bundle runner on the host (numpy arrays bound by address, no
copies), errors carrying the daemon's code, message and node, TCP with a
token (a second apollod started here), and the CUDA path of the runner
against the stand-in driver ($APOLLO_BUILD/tests/libcuda-standin.so): a
PTX bundle's launches go to the caller's stream with the caller's device
addresses.  Prints one line per check; exits 1 on the first failure.

    python_api.py APOLLOD
"""
import ctypes
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

import apollo
from apollo import errors

NP = {apollo.FLOAT32: np.float32, apollo.FLOAT16: np.float16, apollo.INT64: np.int64, apollo.BOOL: np.bool_,
      apollo.FLOAT64: np.float64}


def check(cond, what):
    print("python_api: %s: %s" % ("ok" if cond else "FAILED", what), flush=True)
    if not cond:
        sys.exit(1)


def run_host(bundle, arrays):
    """Runs `bundle` with arrays bound by kind and index / name; returns
    the outputs (numpy), allocated here and written in place."""
    rt = apollo.Runtime(bundle)
    outs = {}
    keep = []
    for i, b in enumerate(bundle.buffers):
        if b["kind"] == "input":
            a = np.ascontiguousarray(arrays["in"][b["index"]])
        elif b["kind"] == "param":
            a = np.ascontiguousarray(arrays["param"][b["name"]])
        elif b["kind"] == "output":
            a = np.empty(b["shape"], dtype=NP[b["dtype"]])
            outs[b["index"]] = a
        else:
            continue
        keep.append(a)
        rt.bind(i, a.ctypes.data, a.nbytes)
    rt.run()
    return [outs[k] for k in sorted(outs)]


def _varint(buf, i):
    v = shift = 0
    while True:
        c = buf[i]
        i += 1
        v |= (c & 0x7f) << shift
        shift += 7
        if c < 0x80:
            return v, i


def _enc_varint(v):
    out = bytearray()
    while True:
        c = v & 0x7f
        v >>= 7
        out.append(c | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _fields(buf):
    """Protocol-buffer wire format (the encoding's specification): a
    message's (field, wire type, raw value) in order."""
    i, out = 0, []
    while i < len(buf):
        key, i = _varint(buf, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i)
        elif wt == 2:
            n, i = _varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        else:
            v, i = buf[i:i + 4], i + 4
        out.append((f, wt, v))
    return out


def _encode(fields):
    out = bytearray()
    for f, wt, v in fields:
        out += _enc_varint(f << 3 | wt)
        if wt == 0:
            out += _enc_varint(v)
        elif wt == 2:
            out += _enc_varint(len(v)) + v
        else:
            out += v
    return bytes(out)


def shrink_output(packed):
    """A bundle (packed) with its output buffer halved -- shape and bytes
    agreeing, kernels and digests untouched: Bundle.buffers is field 5;
    Buffer.kind 2 (1 = output), dims 4 (packed), bytes 5."""
    top = []
    for f, wt, v in _fields(packed):
        if f == 5 and wt == 2:
            sub = _fields(v)
            if any(g == 2 and x == 1 for g, _, x in sub):
                new = []
                for g, w, x in sub:
                    if g == 4 and w == 2:
                        dims, j = [], 0
                        while j < len(x):
                            d, j = _varint(x, j)
                            dims.append(d)
                        dims[-1] //= 2
                        x = b"".join(_enc_varint(d) for d in dims)
                    elif g == 4 and w == 0:
                        x //= 2
                    elif g == 5:
                        x //= 2
                    new.append((g, w, x))
                v = _encode(new)
        top.append((f, wt, v))
    return _encode(top)


def attention_ops(c):
    """Attention and AttentionGrad (issue 24) on the host against numpy in
    float64: 4 query heads on 2 key/value heads, L != S, a boolean mask,
    causal; Y, the log-sum-exp and dQ, dK, dV within 1e-12 relative, one
    launch each."""
    B, H, Hk, L, S, E, Ev, sc = 2, 4, 2, 11, 13, 8, 5, 0.3
    rng = np.random.default_rng(5)
    Q, K, V = rng.standard_normal((B, H, L, E)), rng.standard_normal((B, Hk, S, E)), rng.standard_normal((B, Hk, S, Ev))
    M = rng.random((L, S)) > 0.3
    M[:, 0] = True
    dY = rng.standard_normal((B, H, L, Ev))
    Kr, Vr = np.repeat(K, H // Hk, axis=1), np.repeat(V, H // Hk, axis=1)
    s = np.where(M & (np.tril(np.ones((L, S))) > 0), sc * Q @ Kr.transpose(0, 1, 3, 2), -np.inf)
    mx = s.max(-1, keepdims=True)
    P = np.exp(s - mx) / np.exp(s - mx).sum(-1, keepdims=True)
    Y, lse = P @ Vr, (mx + np.log(np.exp(s - mx).sum(-1, keepdims=True)))[..., 0]
    dS = P * (dY @ Vr.transpose(0, 1, 3, 2) - (dY * Y).sum(-1, keepdims=True))
    want = [sc * dS @ Kr, (sc * dS.transpose(0, 1, 3, 2) @ Q).reshape(B, Hk, H // Hk, S, E).sum(2),
            (P.transpose(0, 1, 3, 2) @ dY).reshape(B, Hk, H // Hk, S, Ev).sum(2)]
    f = apollo.Graph("attention")
    ins = [f.input(n, apollo.FLOAT64, a.shape) for n, a in (("q", Q), ("k", K), ("v", V))]
    ins.append(f.input("m", apollo.BOOL, M.shape))
    for o in f.node("Attention", ins, {"scale": sc, "is_causal": 1}, n_outputs=2):
        f.output(o)
    bf = c.submit(f, target="cpu")
    got = run_host(bf, {"in": [Q, K, V, M]})
    err = max(np.abs(a - e).max() / np.abs(e).max() for a, e in zip(got, [Y, lse]))
    check(err < 1e-12 and bf.n_launches == 1, "Attention: Y and the log-sum-exp within %.1e, %d launch"
          % (err, bf.n_launches))
    b = apollo.Graph("attention_grad")
    ins = [b.input(n, apollo.FLOAT64, a.shape) for n, a in (("dy", dY), ("q", Q), ("k", K), ("v", V), ("y", Y),
                                                             ("lse", lse))]
    ins.append(b.input("m", apollo.BOOL, M.shape))
    for o in b.node("AttentionGrad", ins, {"scale": sc, "is_causal": 1}, n_outputs=3):
        b.output(o)
    bb = c.submit(b, target="cpu")
    got = run_host(bb, {"in": [dY, Q, K, V, Y, lse, M]})
    err = max(np.abs(a - e).max() / np.abs(e).max() for a, e in zip(got, want))
    check(err < 1e-12 and bb.n_launches == 1, "AttentionGrad: dQ, dK, dV within %.1e, %d launch"
          % (err, bb.n_launches))


def abi_mismatch():
    """A package whose ap_submit_options lacks a field the library has
    (tma: a bool that fits in padding, so the sizes agree) does not
    import: the error names the struct and the field."""
    d = tempfile.mkdtemp(prefix="apollo-abi-")
    shutil.copytree(os.path.dirname(apollo.__file__), os.path.join(d, "apollo"))
    lib_py = os.path.join(d, "apollo", "_lib.py")
    text = open(lib_py).read()
    check('("tma", ctypes.c_bool),' in text, "the binding mirrors ap_submit_options.tma")
    open(lib_py, "w").write(text.replace('("tma", ctypes.c_bool),', ""))
    r = subprocess.run([sys.executable, "-c", "import apollo"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=d))
    shutil.rmtree(d)
    last = (r.stderr.strip().splitlines() or [""])[-1]
    check(r.returncode != 0 and "ap_submit_options's field 13 is tma" in last,
          "a binding without a field in padding is refused at import: %s" % last[:140])


def main():
    apollod = sys.argv[1]
    c = apollo.Client()
    check(c.ping().startswith("apollod"), "ping answers '%s'" % c.server)
    check("cpu" in c.targets, "the daemon lists target cpu")
    attention_ops(c)
    abi_mismatch()
    s0 = c.stats()
    check(s0["requests"] >= 1 and "uptime_s" in s0, "stats: %d requests" % s0["requests"])

    # A graph with issue 12's ops, run on the host against numpy.
    rng = np.random.default_rng(3)
    g = apollo.Graph("api")
    x = g.input("x", apollo.FLOAT32, [4, 6])
    idx = g.input("idx", apollo.INT64, [4, 2])
    w = g.param("w", apollo.FLOAT32, [6, 6])
    h = g.node1("MatMul", [x, w])
    sel = g.node1("GatherElements", [h, idx], {"axis": 1})
    cs = g.node1("CumSum", [h], {"axis": 1, "exclusive": 0, "reverse": 0})
    up = g.node1("Trilu", [cs], {"upper": 1, "k": 0})
    am = g.node1("ArgMax", [h], {"axis": 1, "keepdims": 0, "select_last_index": 0})
    g.output(sel)
    g.output(up)
    g.output(am)
    g.validate()
    check(g.shape(sel) == (4, 2) and g.dtype(am) == apollo.INT64, "shapes inferred by the C library")
    b = c.submit(g, target="cpu")
    check(b.stats["kernels"] >= 1 and b.target == "cpu", "submitted: %d launches" % b.stats["kernels"])
    X = rng.standard_normal((4, 6)).astype(np.float32)
    W = rng.standard_normal((6, 6)).astype(np.float32)
    I = rng.integers(-6, 6, size=(4, 2)).astype(np.int64)
    got = run_host(b, {"in": [X, I], "param": {"w": W}})
    H = X @ W
    want = [np.take_along_axis(H, np.where(I < 0, I + 6, I), axis=1), np.triu(np.cumsum(H, axis=1)),
            np.argmax(H, axis=1)]
    check(all(np.allclose(a, e, rtol=1e-4, atol=1e-5) for a, e in zip(got, want)),
          "host run matches numpy (GatherElements, CumSum, Trilu, ArgMax)")
    b2 = c.submit(g, target="cpu")
    check(b2.stats["cache_hit"] and b2.stats["cache_tier"] == 1 and b.stats["cache_tier"] == 0,
          "the same graph again is answered from the cache (tier l1; the first compiled)")
    # issue 24, item 2: the memory of one run -- inputs x (4x6 float32) and
    # idx (4x2 int64) 160 B, outputs 32 + 96 + 32 B, the workspace
    # (intermediates, 256-byte aligned), no weights; the same from the cache
    kinds = {}
    for buf in b.buffers:
        kinds[buf["kind"]] = kinds.get(buf["kind"], 0) + buf["bytes"]
    check(b.input_bytes == 160 == kinds["input"] and b.output_bytes == 160 == kinds["output"] and
          b.const_bytes == kinds.get("const", 0) and b.workspace_bytes % 256 == 0 and
          b.peak_bytes == b.input_bytes + b.output_bytes + b.const_bytes + b.workspace_bytes and
          b.peak_bytes >= b.workspace_bytes and b.stats["peak_bytes"] == b.peak_bytes and
          b.stats["output_bytes"] == b.output_bytes and b2.memory == b.memory and
          set(b.memory) == {"peak_bytes", "workspace_bytes", "input_bytes", "output_bytes", "const_bytes"},
          "memory: peak %d B = inputs %d + outputs %d + constants %d + workspace %d (a hit says the same)" % (
              b.peak_bytes, b.input_bytes, b.output_bytes, b.const_bytes, b.workspace_bytes))
    b3 = c.submit(g, target="cpu", allow_tf32=True)
    check(not b3.stats["cache_hit"], "allow_tf32 is another cache key")
    # issue 26, item 4: a cold submit asking for progress sees the daemon's
    # stages in order, the backend's kernels counted up to their total
    events = []
    bp = c.submit(g, target="cpu", namespace="progress",
                  progress=lambda *e: events.append(e))
    stages = [e[0] for e in events]
    backend = [e for e in events if e[0] == "backend"]
    check(not bp.stats["cache_hit"] and stages[:2] == ["import", "partition"] and "cache" in stages and
          backend and backend[-1][1] == backend[-1][2] > 0 and
          stages.index("codegen") < stages.index("backend") < stages.index("cache"),
          "progress: %s" % " ".join(stages))
    events.clear()
    c.submit(g, target="cpu")
    check(not events, "no progress asked for, none given")
    check(apollo.Bundle.unpack(b.pack()).n_launches == b.n_launches, "bundle pack / unpack")
    # issue 29, item 4: a bundle whose output buffer was shrunk (its kernels
    # and digests intact) is refused by the runtime before anything runs
    try:
        apollo.Runtime(apollo.Bundle.unpack(shrink_output(b.pack())))
        refused = ""
    except apollo.ApolloError as e:
        refused = str(e)
    check("may touch" in refused, "a shrunk output buffer is refused: %s" % refused[:120])

    # The cache key holds names (params are bound by name): the same graph
    # with its weights renamed is the same computation but another bundle.
    def named(wname):
        gg = apollo.Graph("named")
        xx = gg.input("x", apollo.FLOAT32, [2, 3])
        ww = gg.param(wname, apollo.FLOAT32, [3, 3])
        bb = gg.param(wname + "_bias", apollo.FLOAT32, [3])
        gg.output(gg.node1("Add", [gg.node1("MatMul", [xx, ww]), bb]))
        gg.validate()
        return gg
    g1, g2 = named("first"), named("second")
    check(g1.hash() == g2.hash() and g1.hash(named=True) != g2.hash(named=True),
          "renamed weights: the same structural hash, another named hash")
    c.submit(g1, namespace="names")
    again = c.submit(named("first"), namespace="names")
    other = c.submit(g2, namespace="names")
    names = sorted(bf["name"] for bf in other.buffers if bf["kind"] == "param")
    check(again.stats["cache_hit"] and not other.stats["cache_hit"] and names == ["second", "second_bias"],
          "renamed weights are compiled for their own names, not answered with another's: %s" % names)

    # Errors: local (shape inference) and the daemon's (constant indices).
    g3 = apollo.Graph("bad")
    a = g3.input("a", apollo.FLOAT32, [3])
    try:
        g3.node1("Add", [a, g3.input("b", apollo.FLOAT32, [4])], name="misfit")
        check(False, "mismatched shapes refused locally")
    except apollo.ApolloError as e:
        check(e.code == errors.ESHAPE and e.node == "misfit", "mismatched shapes: %s" % e)
    g4 = apollo.Graph("oob")
    d = g4.input("d", apollo.FLOAT32, [5, 4])
    ii = g4.const("ii", apollo.INT64, [2, 1], np.array([[1], [7]], dtype=np.int64).tobytes())
    u = g4.input("u", apollo.FLOAT32, [2, 4])
    try:
        g4.node1("ScatterND", [d, ii, u], {"reduction": "add"}, name="scatter_rows")
        check(False, "an out-of-range constant index is refused")
    except apollo.ApolloError as e:
        check(e.code == errors.EINVAL and e.node == "scatter_rows" and e.tensor == "ii" and
              "out of range" in e.message, "out-of-range constant index: %s" % e)
    # float16 graphs (issue 8): computed in float32, each result rounded.
    g5 = apollo.Graph("half")
    hv = g5.input("h", apollo.FLOAT16, [8])
    g5.output(g5.node1("Mul", [hv, hv], name="square_h"))
    H = rng.standard_normal(8).astype(np.float16)
    got = run_host(c.submit(g5, target="cpu"), {"in": [H]})[0]
    check(got.dtype == np.float16 and np.array_equal(got, (H.astype(np.float32) ** 2).astype(np.float16)),
          "a float16 graph runs on the host, rounded as numpy rounds it")
    # What only the daemon judges comes back as its error reply.
    e0 = c.stats()["errors"]
    try:
        c.submit(g5, target="sm_1")
        check(False, "the daemon refuses target sm_1")
    except apollo.ApolloError as e:
        check(e.code == errors.EUNSUPPORTED and "sm_1" in e.message and c.stats()["errors"] == e0 + 1,
              "the daemon's error: code %d (%s): %s" % (e.code, e.name, e.message))
    check(c.ping().startswith("apollod"), "the daemon serves on after the bad request")
    try:
        apollo.Client("/nonexistent/apollod.sock")
        check(False, "no daemon: DaemonUnavailable")
    except apollo.DaemonUnavailable as e:
        check(e.code == errors.EIO, "no daemon: DaemonUnavailable (%s)" % e.message)

    # TCP with a token, on a daemon of our own.
    with tempfile.TemporaryDirectory() as tmp:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        p = subprocess.Popen([apollod, "--socket", os.path.join(tmp, "d.sock"), "--cache", "off",
                              "--tcp", "127.0.0.1:%d" % port, "--tcp-token", "s3cret"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            tc = None
            for _ in range(100):
                try:
                    tc = apollo.Client("127.0.0.1:%d" % port, token="s3cret")
                    break
                except apollo.ApolloError:
                    time.sleep(0.1)
            check(tc is not None and tc.ping().startswith("apollod"), "TCP with the token")
            try:
                apollo.Client("127.0.0.1:%d" % port, token="wrong").ping()
                check(False, "TCP with a wrong token is refused")
            except apollo.ApolloError as e:
                check(True, "TCP with a wrong token is refused (%s)" % e.name)
        finally:
            p.terminate()
            p.wait()

    # The CUDA path against the stand-in driver: a PTX bundle.
    standin = os.path.join(os.environ.get("APOLLO_BUILD", "build"), "tests", "libcuda-standin.so")
    if "NVRTC none" in c.ping() or not os.path.exists(standin):
        print("python_api: SKIPPED: the CUDA path (no NVRTC in the daemon or no stand-in driver)")
        # APOLLO_REQUIRE (tests/lib/require.sh) turns this skip into a failure
        required = set(os.environ.get("APOLLO_REQUIRE", "").replace(" ", ",").split(","))
        check(not required & {"nvrtc", "standin"}, "APOLLO_REQUIRE names nvrtc or standin")
        return 0
    bp = c.submit(g, target="compute_90")
    os.environ["APOLLO_LIBCUDA"] = standin
    drv = ctypes.CDLL(standin)
    ok, why = apollo.cuda_available()
    check(ok, "the stand-in driver answers as a CUDA driver")
    rt = apollo.Runtime(bp)
    allocs = ctypes.c_int.in_dll(drv, "fake_allocs")
    check(allocs.value == 1, "only the workspace is allocated on the device (%d)" % allocs.value)
    bound = {}
    keep = []
    for i, bf in enumerate(bp.buffers):
        if bf["kind"] == "intermediate":
            continue
        arr = np.zeros(bf["shape"], dtype=NP[bf["dtype"]])
        keep.append(arr)
        rt.bind(i, arr.ctypes.data, arr.nbytes)
        bound[arr.ctypes.data] = bf["name"]
    n0 = ctypes.c_int.in_dll(drv, "fake_log_n").value
    rt.run(stream=0x5EED)

    class Launch(ctypes.Structure):
        _fields_ = [("kernel", ctypes.c_char * 128), ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                    ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p), ("n_params", ctypes.c_int),
                    ("params", ctypes.c_ulonglong * 64)]
    log = (Launch * 4096).in_dll(drv, "fake_log")
    n1 = ctypes.c_int.in_dll(drv, "fake_log_n").value
    launches = [log[k] for k in range(n0, n1)]
    check(len(launches) == bp.n_launches, "%d launches of a %d-launch plan" % (len(launches), bp.n_launches))
    check(all(l.stream == 0x5EED for l in launches), "every launch on the caller's stream")
    seen = {l.params[j] for l in launches for j in range(l.n_params)}
    check(all(addr in seen for addr in bound),
          "the caller's addresses reach the kernels (%s)" % ", ".join(sorted(bound.values())))
    del rt
    check(allocs.value == 0, "the runtime frees what it allocated, never the caller's memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
