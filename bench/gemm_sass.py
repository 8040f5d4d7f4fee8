#!/usr/bin/env python3
"""gemm_sass.py -- what a GEMM's main loop costs, read from its SASS.

    gemm_sass.py [--target sm_90] [--dtype float16] [--size 4096]
                 [--allow-tf32] [--tma] [--unvalidated] [--attention D [--heads H] [--causal]]
                 [--nvdisasm PATH]

Compiles a SIZE^3 MatMul for --target through the daemon at
$APOLLO_SOCKET (cubin), disassembles each kernel with nvdisasm (Triton's
copy in the project's .venv by default, or PyPI's nvidia-cuda-nvdisasm)
and finds its K loop: the backward branch whose body holds the most
matrix-multiply instructions (HMMA for tensor cores, FFMA for SIMT).
Prints, per pass of that loop (one K tile), the instructions issued, the
multiply instructions among them and their share, the block barriers,
the integer address arithmetic (IMAD, IADD3, LEA, SHF, LOP3, ISETP, SEL,
MOV) and the shared-memory loads (LDSM / LDS) and asynchronous copies
(LDGSTS: cp.async; UTMALDG: TMA tile loads, --tma on sm_90a); and the epilogue's global stores by width.  The issue's
reading (float16 4096^3, sm_90, 3 stages): about 125 instructions a
K tile, 16 of them HMMA.  A static count, not a timing: no GPU needed.

--attention D reads the attention forward instead: H heads (default 8) of
SIZE queries and SIZE keys at head dim D, Apollo's Attention with
fp32_scores (the scores and the softmax in float32, as bench/gemm_shapes.py's
ONNX Attention and F.scaled_dot_product_attention; --causal: is_causal),
its key loop per key tile (scores, softmax, O += P V, the next tile's
copies).
"""
import argparse
import glob
import math
import os
import re
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))
import apollo  # noqa: E402
from apollo import graph as G  # noqa: E402

DT = {"float16": G.FLOAT16, "bfloat16": G.BFLOAT16, "float32": G.FLOAT32}
INT = ("IMAD", "IADD3", "LEA", "SHF", "LOP3", "ISETP", "SEL", "MOV", "IABS", "I2F", "F2I", "IMNMX", "PRMT")


def cubins(data):
    """The ELF images (cubins) inside a packed bundle: each from its
    magic to the furthest of its section header table, program header
    table and sections' bytes (ELF64: e_phoff 0x20, e_shoff 0x28,
    e_phentsize/e_phnum 0x36, e_shentsize/e_shnum 0x3A; a section header's
    offset and size at 0x18 and 0x20)."""
    out, at = [], 0
    while True:
        at = data.find(b"\x7fELF", at)
        if at < 0:
            return out
        phoff, shoff = struct.unpack_from("<QQ", data, at + 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, at + 0x36)
        end = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
        for i in range(shnum):
            sh = at + shoff + i * shentsize
            stype, = struct.unpack_from("<I", data, sh + 4)
            off, size = struct.unpack_from("<QQ", data, sh + 0x18)
            if stype != 8:          # SHT_NOBITS takes no bytes in the file
                end = max(end, off + size)
        out.append(data[at:at + end])
        at += end


def sass(nvdisasm, blob):
    """nvdisasm's listing of one cubin as (address, opcode, text) rows."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(blob)
        f.flush()
        text = subprocess.run([nvdisasm, "-c", f.name], check=True, capture_output=True, text=True).stdout
    rows, labels, pending = [], {}, []
    for line in text.splitlines():
        lab = re.match(r"\s*(\.L_x_\d+):", line)
        if lab:
            pending.append(lab.group(1))
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*);", line)
        if m:
            addr = int(m.group(1), 16)
            for name in pending:
                labels[name] = addr
            pending = []
            rows.append((addr, m.group(3), m.group(3) + m.group(4)))
    # branch targets by address
    return [(a, op, re.sub(r"`\((\.L_x_\d+)\)", lambda m: "0x%x" % labels.get(m.group(1), 1 << 62), t))
            for a, op, t in rows]


def mma_equiv(op):
    """An instruction's tensor-core work in m16n8k16 products: HMMA.16816
    one (HMMA.1688 a half), HGMMA.64xNx16 (wgmma, sm_90a) 4 N / 8; others 0."""
    m = re.match(r"HGMMA\.64x(\d+)x(\d+)", op)
    if m:
        return 4 * int(m.group(1)) // 8 * int(m.group(2)) // 16
    if op.startswith("HMMA.16816"):
        return 1
    if op.startswith("HMMA.1688"):
        return 0.5
    return 0


def k_loop(rows, mul):
    """The body of the K (or key) loop: of the backward branches whose
    body holds `mul` instructions and no EXIT (a retry of a wait placed
    after the kernel's end branches back into the middle of it), those
    holding no other such loop -- a persistent kernel's tile loop holds its
    K or key loop and more products after it -- the one with the most
    `mul`, the smallest on a tie."""
    loops = []
    for i, (addr, op, text) in enumerate(rows):
        m = re.search(r"BRA\s+0x([0-9a-f]+)", text) if op.startswith("BRA") else None
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= addr:
            continue
        body = [r for r in rows if target <= r[0] <= addr]
        n = sum(r[1].startswith(mul) for r in body)
        if n and not any(r[1] == "EXIT" for r in body):
            loops.append((target, addr, n, body))
    inner = [lp for lp in loops
             if not any(o is not lp and lp[0] <= o[0] and o[1] <= lp[1] for o in loops)]
    best = max(inner, key=lambda lp: (lp[2], -len(lp[3])), default=None)
    return best[3] if best else []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="sm_90")
    ap.add_argument("--dtype", default="float16", choices=sorted(DT))
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--allow-tf32", action="store_true")
    ap.add_argument("--tma", action="store_true", help="sm_90a: the GEMM's TMA form (CompileOptions.tma)")
    ap.add_argument("--unvalidated", action="store_true",
                    help="sm_90a: every form not yet run on a GPU (CompileOptions.unvalidated): the "
                         "attention's warp specialisation, overlap and ping-pong")
    ap.add_argument("--attention", type=int, default=0, metavar="D",
                    help="the attention forward at head dim D instead of a MatMul")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--causal", action="store_true", help="--attention with is_causal")
    ap.add_argument("--nvdisasm", default=None)
    a = ap.parse_args()
    tool = a.nvdisasm or next(iter(glob.glob(os.path.join(os.path.dirname(__file__), "..", ".venv", "lib", "python3*",
                                                        "site-packages", "*", "backends", "nvidia", "bin", "nvdisasm"))
                                   + glob.glob(os.path.join(os.path.dirname(__file__), "..", ".venv", "lib",
                                                            "python3*", "site-packages", "nvidia", "*", "bin",
                                                            "nvdisasm"))), None)
    if not tool:
        print("gemm_sass: no nvdisasm (pip install nvidia-cuda-nvdisasm into .venv, or --nvdisasm)")
        return 1
    n = a.size
    g = apollo.Graph("gemm_sass_%d" % n)
    if a.attention:
        d = a.attention
        q, k, v = (g.input(nm, DT[a.dtype], [1, a.heads, n, d]) for nm in "qkv")
        (y,) = g.node("Attention", [q, k, v], {"scale": 1 / math.sqrt(d), "fp32_scores": 1,
                                               "is_causal": int(a.causal)})
    else:
        x, w = g.input("a", DT[a.dtype], [n, n]), g.input("b", DT[a.dtype], [n, n])
        (y,) = g.node("MatMul", [x, w])
    g.output(y)
    c = apollo.Client(os.environ.get("APOLLO_SOCKET"))
    try:
        b = c.submit(g, target=a.target, driver_version="12.4", allow_tf32=a.allow_tf32, tma=a.tma,
                     unvalidated=a.unvalidated)
    except apollo.ApolloError as e:
        print("gemm_sass: %s is not compiled here (%s)" % (a.target, e))
        return 1
    page = os.path.join(tempfile.mkdtemp(prefix="gemm-sass-"), "p.html")
    b.explain_html(page)
    sched = sorted(set(re.findall(r"(?:bm|warps)=[^<\"\n]*", open(page).read())))
    what = ("%sattention %d x %d x %d, head dim %d," % ("causal " if a.causal else "", a.heads, n, n, a.attention)
            if a.attention else "%d^3" % n)
    print("gemm_sass: %s %s%s%s on %s, schedule %s" % (what, a.dtype, " (TF32)" if a.allow_tf32 else "",
                                                       " (TMA)" if a.tma else "" if not a.unvalidated
                                                       else " (--unvalidated)", a.target, "; ".join(sched)))
    print("%-11s %7s %7s %6s %7s %6s %9s %6s %6s %7s %14s" % ("kernel", "instrs", "mul", "share", "m16n8k16", "bar",
                                                                "int addr", "lds", "ldgsts", "utmaldg", "stores"))
    for i, blob in enumerate(cubins(b.pack())):
        rows = sass(tool, blob)
        mul = next((m for m in ("HGMMA", "HMMA") if any(r[1].startswith(m) for r in rows)), "FFMA")
        body = k_loop(rows, mul)
        count = lambda *ops: sum(any(r[1].startswith(o) for o in ops) for r in body)  # noqa: E731
        nm = count(mul)
        eq = sum(mma_equiv(r[2]) for r in body)
        stores = {}
        for r in rows:
            if r[1].startswith("STG"):
                stores[r[1]] = stores.get(r[1], 0) + 1
        print("%-11s %7d %7d %5.0f%% %7d %6d %9d %6d %6d %7d %14s" % (
            "#%d %s" % (i, mul), len(body), nm, 100.0 * nm / max(1, len(body)), eq, count("BAR"), count(*INT),
            count("LDSM", "LDS"), count("LDGSTS"), count("UTMALDG"),
            " ".join("%s:%d" % kv for kv in sorted(stores.items()))))
    print("per pass of the %s loop (one %s tile); m16n8k16: the tensor-core work in m16n8k16 products "
          "(an HGMMA.64xNx16 is 4 N / 8 of them); stores: the whole kernel's global stores by width"
          % (("key",) * 2 if a.attention else ("K",) * 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
