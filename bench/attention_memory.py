#!/usr/bin/env python3
"""attention_memory.py -- the memory of attention in a training step,
Apollo's bundles beside eager PyTorch's tensors.

    attention_memory.py [--target sm_90] [--dtype float16] [--heads 12]
                        [--head-dim 64] [--batch 1] [--seqs 512,1024,...]

For a GPT-2-small-shaped attention (12 heads of 64, batch 1, float16 by
default) at each sequence length S: Apollo's forward bundle (Attention:
Q, K, V -> Y and the log-sum-exp) and backward bundle (AttentionGrad:
dY, Q, K, V, Y, log-sum-exp -> dQ, dK, dV) are compiled for --target by
the daemon at $APOLLO_SOCKET, and each one's peak_bytes (inputs, outputs,
constants and workspace: libapollo-client's ap_bundle_peak_bytes) is
printed beside what eager PyTorch holds for the same step, summed from
the tensors' sizes (the host has no device allocator to ask): with the
flash kernel (Q, K, V, Y, the float32 log-sum-exp saved; the backward's
gradients) and with the math kernel (which also saves the B x H x S x S
probabilities).  Also printed: the forward's and the backward's launch
counts, the growth of Apollo's training-step peak from one length to
the next (2.0 = linear in S; the quadratic math kernel gives 4.0), and
for an sm_XX target whether the forward's and the backward's PTX
(compute_XX) use the tensor cores (mma.sync).
Needs apollod; not part of make check (seconds per length on 2 cores).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))
import apollo  # noqa: E402
from apollo import graph as G  # noqa: E402

DT = {"float16": (G.FLOAT16, 2), "bfloat16": (G.BFLOAT16, 2), "float32": (G.FLOAT32, 4)}


def graphs(B, H, S, E, dt):
    acc = G.FLOAT32 if dt in (G.FLOAT16, G.BFLOAT16) else dt
    f = apollo.Graph("attention_fwd_%d" % S)
    q, k, v = (f.input(n, dt, [B, H, S, E]) for n in "qkv")
    y, lse = f.node("Attention", [q, k, v], {"scale": E ** -0.5, "is_causal": 1}, n_outputs=2)
    f.output(y)
    f.output(lse)
    b = apollo.Graph("attention_bwd_%d" % S)
    ins = [b.input(n, dt, [B, H, S, E]) for n in ("dy", "q", "k", "v", "y")]
    ins.append(b.input("lse", acc, [B, H, S]))
    for o in b.node("AttentionGrad", ins, {"scale": E ** -0.5, "is_causal": 1}, n_outputs=3):
        b.output(o)
    return f, b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="sm_90")
    ap.add_argument("--dtype", default="float16", choices=sorted(DT))
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seqs", default="512,1024,2048,4096,8192")
    a = ap.parse_args()
    dt, es = DT[a.dtype]
    B, H, E = a.batch, a.heads, a.head_dim
    c = apollo.Client(os.environ.get("APOLLO_SOCKET"))
    print("attention memory: batch %d, %d heads of %d, %s, causal, target %s (daemon %s)"
          % (B, H, E, a.dtype, a.target, c.server))
    print("%6s %9s %9s %13s %13s %13s %13s %7s" % ("S", "fwd", "bwd", "apollo fwd", "apollo bwd",
                                                   "eager flash", "eager math", "growth"))
    last = None
    for S in [int(s) for s in a.seqs.split(",")]:
        f, b = graphs(B, H, S, E, dt)
        bf = c.submit(f, target=a.target, driver_version="12.4" if a.target != "cpu" else None)
        bb = c.submit(b, target=a.target, driver_version="12.4" if a.target != "cpu" else None)
        x = B * H * S * E * es                   # one of Q, K, V, Y, dY, dQ, dK, dV
        lse = B * H * S * 4
        probs = B * H * S * S * es
        flash = 8 * x + lse                      # saved Q, K, V, Y, lse; dY in; dQ, dK, dV out
        math_ = flash - lse + probs              # the probabilities saved instead of the lse
        step = max(bf.peak_bytes, bb.peak_bytes)
        growth = "" if last is None else "%.2f" % (step / last)
        last = step
        print("%6d %9d %9d %13d %13d %13d %13d %7s" % (S, bf.n_launches, bb.n_launches, bf.peak_bytes,
                                                        bb.peak_bytes, flash, math_, growth))
    print("bytes; fwd/bwd: launches; growth: Apollo's step peak (the larger bundle) over the previous length's")
    if a.target.startswith("sm_"):
        # the same two graphs as PTX (target compute_XX), at the first length: is each on tensor cores?
        S = int(a.seqs.split(",")[0])
        ptx = "compute_" + a.target[3:]
        f, b = graphs(B, H, S, E, dt)
        has = ["mma.sync" if b"mma.sync.aligned" in c.submit(g, target=ptx).pack() else "no mma.sync"
               for g in (f, b)]
        print("PTX (%s, S = %d): forward %s, backward %s" % (ptx, S, has[0], has[1]))


if __name__ == "__main__":
    main()
