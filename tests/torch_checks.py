#!/usr/bin/env python3
"""torch_checks.py -- checks of the torch.compile backend one at a time,
against eager PyTorch, in float64 (issue 24).

    torch_checks.py config|shapes|ops [OP...]

config: configuration errors -- an unknown target ("sm90", and "sm_999",
which the daemon does not list), fusion level, option, an option value of
the wrong kind (strict="maybe", threads=-1) and a bad value in the
environment (APOLLO_FUSION) -- raise apollo.ConfigError (an ApolloError,
code EINVAL) at the compiled model's first call, before anything runs in
eager PyTorch; a good configuration runs.

shapes: a one-layer GPT with F.scaled_dot_product_attention trained with
AdamW while the batch size and the sequence length change between steps:
Dynamo makes the graph dynamic (symbolic sizes) at the second shape, and
the backend compiles it for each concrete shape it meets -- two submits
(forward, backward) per new shape, none for a shape seen before, nothing
run eagerly, no graph break, the loss within 1e-9 of eager float64 at
every step.

ops: each op the converter took for issue 24 (the list: python3
torch_checks.py ops --list) in a small function compiled with
torch.compile(backend="apollo"), forward and (where it has one) backward,
against eager float64: every output and every input gradient within 1e-9
relative to its largest value; no graph break, nothing eager.

Prints one line per check; exits 1 on the first failure.
"""
import copy
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import apollo
import apollo.torch_backend as backend

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def check(cond, what):
    print("torch_checks: %s: %s" % ("ok" if cond else "FAILED", what), flush=True)
    if not cond:
        sys.exit(1)


# ---- config --------------------------------------------------------------------------

def config():
    """Bad configurations raise ConfigError at the first call."""
    m = nn.Linear(4, 3)
    x = torch.randn(2, 4)
    bad = [({"target": "sm90"}, "unknown target"), ({"target": "sm_999"}, "no such target"),
           ({"fusion": "max"}, "unknown fusion level"), ({"strict": "maybe"}, "expected yes or no"),
           ({"threads": -1}, "whole number"), ({"tagret": "cpu"}, "unknown apollo option"),
           ({}, "APOLLO_FUSION")]
    for opts, words in bad:
        torch._dynamo.reset()
        backend.reset_stats()
        if not opts:
            os.environ["APOLLO_FUSION"] = "fastest"
        try:
            torch.compile(m, backend="apollo", options=opts)(x)
            check(False, "%s raises" % (opts or "APOLLO_FUSION=fastest"))
        except apollo.ConfigError as e:
            st = backend.stats()
            check(isinstance(e, apollo.ApolloError) and e.code == apollo.errors.EINVAL and words in e.message
                  and st["eager_graphs"] == 0 and st["graphs"] == 0,
                  "%s: ConfigError at the first call, nothing run: %s"
                  % (opts or "APOLLO_FUSION=fastest", e.message.splitlines()[0][:110]))
        finally:
            os.environ.pop("APOLLO_FUSION", None)
    torch._dynamo.reset()
    backend.reset_stats()
    y = torch.compile(m, backend="apollo", options={"target": "cpu", "fusion": "rules", "strict": "yes"})(x)
    check(torch.allclose(y, m(x), rtol=1e-5, atol=1e-6) and backend.stats()["graphs"] == 1,
          "target cpu, fusion rules, strict 'yes': compiled and run")


# ---- shapes -------------------------------------------------------------------------

def shapes():
    """Batch size and sequence length change between AdamW steps."""
    import torch_train
    torch.manual_seed(0)
    model = torch_train.GPT(layers=1, sdpa=True).double()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="apollo")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    torch._dynamo.reset()
    backend.reset_stats()
    g = torch.Generator().manual_seed(1)
    seen = set()
    for b, t in [(4, 32), (2, 16), (3, 8), (2, 16), (3, 8), (5, 24)]:
        idx = torch.randint(0, 128, (b, t), generator=g)
        tgt = torch.roll(idx, -1, dims=1)
        before = backend.stats()["graphs"]
        loss = compiled(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss_ref = ref(idx, tgt)
        loss_ref.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        st = backend.stats()
        subs = st["graphs"] - before
        rel = abs(loss.item() - loss_ref.item()) / abs(loss_ref.item())
        want = 0 if (b, t) in seen else 2
        seen.add((b, t))
        check(subs == want and rel <= 1e-9 and st["eager_graphs"] == 0 and st["eager_parts"] == 0
              and not st["graph_breaks"],
              "batch %d, length %2d: %d submits (%s shape), loss %.1e relative of eager, nothing eager"
              % (b, t, subs, "a new" if want else "a known", rel))
    st = backend.stats()
    check(st["shapes"] == 2 * (len(seen) - 1),
          "%d shapes: the first static, %d compiled from the graphs with symbolic sizes"
          % (len(seen), st["shapes"] // 2))


# ---- ops ---------------------------------------------------------------------------------

def _rand(*shape, g, lo=-1.0, hi=1.0):
    return (torch.rand(*shape, generator=g, dtype=torch.float64) * (hi - lo) + lo)


OPS = {}


def op(name):
    def deco(f):
        OPS[name] = f
        return f
    return deco


def run_op(name, fn, args, grads=True):
    """fn(*args) compiled and eager (float64): outputs and the gradients of
    every floating input within 1e-9 relative to each one's largest value;
    no graph break, nothing eager."""
    torch._dynamo.reset()
    backend.reset_stats()
    ea = [a.clone().requires_grad_(grads and a.is_floating_point()) if isinstance(a, torch.Tensor) else a
          for a in args]
    ca = [a.clone().requires_grad_(grads and a.is_floating_point()) if isinstance(a, torch.Tensor) else a
          for a in args]
    want = fn(*ea)
    got = torch.compile(fn, backend="apollo", options={"strict": True})(*ca)
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    worst = 0.0
    for w, o in zip(want, got):
        if w.dtype == torch.bool or not w.is_floating_point():
            worst = max(worst, 0.0 if torch.equal(w, o) else float("inf"))
        else:
            worst = max(worst, ((w - o).abs().max() / w.abs().max().clamp_min(1e-300)).item())
    gw = 0.0
    n_grads = 0
    if grads:
        seed = torch.Generator().manual_seed(7)
        outs = [w for w in want if w.is_floating_point() and w.requires_grad]
        cots = [_rand(*w.shape, g=seed) for w in outs]
        torch.autograd.backward(outs, cots)
        torch.autograd.backward([o for o in got if o.is_floating_point() and o.requires_grad], cots)
        for a, b in zip(ea, ca):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                n_grads += 1
                d = (a.grad - b.grad).abs().max() / a.grad.abs().max().clamp_min(1e-300)
                gw = max(gw, d.item())
    st = backend.stats()
    check(worst <= 1e-9 and gw <= 1e-9 and not st["graph_breaks"] and st["eager_graphs"] == 0
          and st["eager_parts"] == 0,
          "%s: forward within %.1e, %d gradients within %.1e relative; %d graphs, no break, nothing eager"
          % (name, worst, n_grads, gw, st["graphs"]))


def ops(names):
    for n in names or list(OPS):
        OPS[n]()


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "config":
        config()
    elif what == "shapes":
        shapes()
    elif what == "ops" and sys.argv[2:3] == ["--list"]:
        print(" ".join(OPS))
    elif what == "ops":
        ops(sys.argv[2:])
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
