#!/usr/bin/env python3
"""torch_checks.py -- checks of the torch.compile backend one at a time,
against eager PyTorch, in float64 (issue 24).

    torch_checks.py config|shapes|ops [OP...]|progress

config: configuration errors -- an unknown target ("sm90", and "sm_999",
which the daemon does not list), fusion level, option, an option value of
the wrong kind (strict="maybe", threads=-1) and a bad value in the
environment (APOLLO_FUSION) -- raise apollo.ConfigError (an ApolloError,
code EINVAL) before anything runs in eager PyTorch: a wrong target form,
fusion level or option name at torch.compile itself, a target the daemon
lacks at the first call; a good configuration runs.

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
relative to its largest value; no graph break, nothing eager.  sdpa_cuda:
the CUDA attention ops, which have no CPU kernel, against the CPU flash
op in float64 instead (its docstring).

progress (issue 26, item 4): the backend asks the daemon for its stage
events; a compile over backend.SLOW_COMPILE_S (set to 0 here, so that
every cold one is) is logged exactly once at INFO on the "apollo" logger,
naming the stage it waited for; a warm run under the usual second logs
nothing.

Prints one line per check; exits 1 on the first failure.
"""
import contextlib
import copy
import io
import math
import os
import re
import shutil
import sys
import time

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
    """Bad configurations raise ConfigError at torch.compile or by the first call."""
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
                  "%s: ConfigError by the first call, nothing run: %s"
                  % (opts or "APOLLO_FUSION=fastest", e.message.splitlines()[0][:110]))
        finally:
            os.environ.pop("APOLLO_FUSION", None)
    # issue 27: torch.compile itself raises, before any call (the backend's
    # _dynamo_backend_init hook checks the options it is given)
    for opts, words in [({"target": "sm90"}, "did you mean sm_90"), ({"fusion": "max"}, "unknown fusion level"),
                        ({"tagret": "cpu"}, "did you mean target")]:
        torch._dynamo.reset()
        backend.reset_stats()
        try:
            torch.compile(m, backend="apollo", options=opts)
            check(False, "torch.compile(options=%s) raises" % opts)
        except apollo.ConfigError as e:
            check(words in e.message and backend.stats()["graphs"] == 0,
                  "torch.compile(options=%s) raises ConfigError at once: %s" % (opts, e.message[:100]))
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
    for b, t in [(4, 32), (2, 16), (3, 8), (2, 16), (3, 8)]:
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
    return torch.rand(tuple(shape), generator=g, dtype=torch.float64) * (hi - lo) + lo


OPS = {}


def op(name):
    """Registers an ops check under `name` (torch_checks.py ops NAME)."""
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


@op("max_pool2d")
def _max_pool2d():
    """values and indices (compared exactly), and the backward (a scatter
    of the gradient to the indices): ResNet's 3x3 stride 2 pad 1, ceil
    mode with dilation 2, 2x2 stride 2."""
    g = torch.Generator().manual_seed(1)
    x = _rand(2, 3, 9, 10, g=g)
    run_op("max_pool2d 3x3/2 pad 1 (values, indices, backward)",
           lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), [x])
    run_op("max_pool2d 3x3/2 pad 1 dilation 2 ceil_mode",
           lambda x: F.max_pool2d(x, 3, 2, 1, dilation=2, ceil_mode=True, return_indices=True), [x])
    run_op("max_pool2d 2x2/2", lambda x: F.max_pool2d(x, 2) * 3.0, [x])


@op("slice_scatter")
def _slice_scatter():
    """slice_scatter (step 1 and 2, negative bounds) and select_scatter,
    called directly and as the backward of slicing and selecting."""
    g = torch.Generator().manual_seed(2)
    x, s1, s2, s3 = _rand(3, 8, 4, g=g), _rand(3, 3, 4, g=g), _rand(3, 8, 2, g=g), _rand(3, 4, g=g)
    run_op("slice_scatter dim 1, 2:5 and dim 2 step 2, select_scatter",
           lambda x, a, b, c: (torch.slice_scatter(x, a, 1, 2, 5),
                               torch.slice_scatter(x, b, 2, 0, None, 2),
                               torch.select_scatter(x, c, 1, -2)), [x, s1, s2, s3])
    run_op("the backward of slicing (1:7:3, -3:) and selecting",
           lambda x: (x[:, 1:7:3] * x[:, -3:].sum(1, keepdim=True)).sum((1, 2)) + x[:, :, 1].sum(1), [x])


@op("convolution_backward")
def _conv_backward():
    """Grouped and depthwise convolutions, forward and backward (input,
    weight and bias gradients), with stride, padding and dilation."""
    g = torch.Generator().manual_seed(3)
    x = _rand(2, 4, 9, 8, g=g)
    run_op("convolution groups=2, stride 2, padding 1, bias",
           lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=2),
           [x, _rand(6, 2, 3, 3, g=g), _rand(6, g=g)])
    run_op("depthwise convolution (groups=4, multiplier 2), dilation 2",
           lambda x, w: F.conv2d(x, w, padding=2, dilation=2, groups=4), [x, _rand(8, 1, 3, 3, g=g)])
    run_op("depthwise convolution (groups=4), stride 2, 5x5",
           lambda x, w: F.conv2d(x, w, stride=2, padding=2, groups=4), [x, _rand(4, 1, 5, 5, g=g)])


@op("embedding_dense_backward")
def _embedding_backward():
    """embedding's backward (indices repeated: accumulated), with
    padding_idx, and scaled by frequency."""
    g = torch.Generator().manual_seed(4)
    w = _rand(10, 6, g=g)
    i = torch.tensor([[1, 2, 2, 7], [3, 1, 9, 2]])
    run_op("embedding backward, padding_idx=1", lambda w, i: F.embedding(i, w, padding_idx=1), [w, i])
    run_op("embedding backward, scale_grad_by_freq", lambda w, i: F.embedding(i, w, scale_grad_by_freq=True),
           [w, i])


@op("nll_loss")
def _nll_loss():
    """cross_entropy with label_smoothing and ignore_index, nll_loss with
    class weights, each reduction."""
    g = torch.Generator().manual_seed(5)
    x = _rand(6, 5, g=g, lo=-3, hi=3)
    t = torch.tensor([0, 1, 2, 3, 4, 2])
    wt = _rand(5, g=g, lo=0.5, hi=2.0)
    run_op("cross_entropy label_smoothing=0.1 ignore_index=2",
           lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1, ignore_index=2), [x, t])
    run_op("cross_entropy label_smoothing=0.2, reduction sum, ignore_index=-100 present",
           lambda x, t: F.cross_entropy(x, torch.where(t == 4, -100, t), label_smoothing=0.2, reduction="sum"),
           [x, t])
    run_op("nll_loss weight, ignore_index=2, reduction none and mean",
           lambda x, t: (F.nll_loss(F.log_softmax(x, 1), t, wt, ignore_index=2, reduction="none"),
                         F.nll_loss(F.log_softmax(x, 1), t, wt, ignore_index=2)), [x, t])
    x3 = _rand(2, 5, 3, 4, g=g, lo=-3, hi=3)
    t3 = torch.randint(0, 5, (2, 3, 4), generator=g)
    run_op("cross_entropy over [N, C, H, W] (nll_loss2d), label_smoothing=0.1",
           lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1, ignore_index=0), [x3, t3])


@op("upsample")
def _upsample():
    """nearest and bilinear upsampling (align_corners both ways, a scale
    factor and an output size), forward and backward."""
    g = torch.Generator().manual_seed(6)
    x = _rand(2, 3, 4, 5, g=g)
    run_op("upsample nearest, scale 2", lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), [x])
    run_op("upsample nearest, size 7x9", lambda x: F.interpolate(x, size=(7, 9), mode="nearest"), [x])
    run_op("upsample bilinear, size 7x9", lambda x: F.interpolate(x, size=(7, 9), mode="bilinear"), [x])
    run_op("upsample bilinear, scale 2, align_corners",
           lambda x: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True), [x])


@op("index")
def _index_ops():
    """indexing with several index tensors (adjacent dims, dims apart,
    negative indices, broadcast) and index_put with accumulation."""
    g = torch.Generator().manual_seed(8)
    x = _rand(4, 5, 6, g=g)
    i = torch.tensor([[0, 3], [-1, 2]])
    j = torch.tensor([1, -2])
    run_op("x[:, i, j] (adjacent), x[i, :, j] (apart)", lambda x, i, j: (x[:, i, j] * 2, x[i, :, j] + 1),
           [x, i, j])
    run_op("index_put accumulate, two index tensors (a pair repeated)",
           lambda x, v, i, j: torch.index_put(x, (i, j), v, accumulate=True),
           [x, _rand(2, 2, 6, g=g), torch.tensor([[0, 3], [0, 2]]), torch.tensor([1, 1])])

    def assign(x, v, i):
        y = x * 1.0
        y[:, i] = v            # index_put after a whole dim
        return y
    run_op("index_put after a whole dim (y[:, i] = v)", assign, [x, _rand(4, 2, 6, g=g), torch.tensor([4, 1])])


@op("tensor_constant")
def _tensor_constant():
    """Tensors a function makes with torch.tensor: AOTAutograd lifts them
    onto the graph module (get_attr nodes), the converter copies their
    bytes into the graph."""
    g = torch.Generator().manual_seed(9)
    run_op("torch.tensor constants (float64, bool) in the graph",
           lambda x: x * torch.tensor([1.5, -2.0, 3.25], dtype=torch.float64)
           + torch.tensor([[True, False, True]]), [_rand(2, 3, g=g)])


@op("as_strided")
def _as_strided():
    """as_strided and as_strided_scatter, as AOTAutograd writes them for
    a pooled channels-last tensor (Swin's and ConvNeXt's heads: permute,
    adaptive_avg_pool2d, flatten) and its backward, and called directly:
    strided positions that are not consecutive (a Gather), a strided
    in-place update (as_strided_scatter at those positions)."""
    g = torch.Generator().manual_seed(10)
    run_op("adaptive_avg_pool2d of a permuted tensor, flattened (as_strided, as_strided_scatter)",
           lambda x: F.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), 1).flatten(1) * 2.0, [_rand(2, 4, 5, 3, g=g)])
    run_op("torch.as_strided (3, 4) strides (1, 3) offset 2, of x and of x.t()",
           lambda x: (torch.as_strided(x, (3, 4), (1, 3), 2) * 3.0,
                      torch.as_strided(x.t() * 1.0, (2, 5), (1, 4))), [_rand(4, 5, g=g)])

    def update(x):
        y = x * 1.0
        y.as_strided((2, 3), (1, 4), 1).mul_(2.0)      # an in-place update through a strided view
        return y
    run_op("an in-place update through a strided view (as_strided_scatter)", update, [_rand(4, 5, g=g)])

    def of_view(x):
        h = x * 3.0
        return torch.as_strided(h[:, ::2], (2, 2), (1, 4)).exp() + h.sum()
    torch._dynamo.reset()
    backend.reset_stats()
    x = _rand(4, 6, g=g)
    y = torch.compile(of_view, backend="apollo", options={"quiet": True})(x)
    st = backend.stats()
    check(torch.equal(y, of_view(x)) and st["eager_graphs"] == 1 and len(st["graph_breaks"]) == 1
          and "not dense" in st["graph_breaks"][0],
          "as_strided of a strided view (it reads memory outside the view): a break, the graph run "
          "eagerly, equal to eager")


@op("constant_fold")
def _constant_fold():
    """A mask made of constants (zeros, then slice assignments: Swin's
    shifted-window mask) and torch.roll's indices, computed when the graph
    is converted and added as constants; forward and backward."""
    g = torch.Generator().manual_seed(11)

    def masked(x):
        m = x.new_zeros((8, 8))
        cnt = 0
        for h in (slice(0, -4), slice(-4, -2), slice(-2, None)):
            for w in (slice(0, -4), slice(-4, -2), slice(-2, None)):
                m[h, w] = cnt
                cnt += 1
        m = m.view(2, 4, 2, 4).permute(0, 2, 1, 3).reshape(4, 16)
        m = m.unsqueeze(1) - m.unsqueeze(2)
        m = m.masked_fill(m != 0, -100.0).masked_fill(m == 0, 0.0)
        return torch.softmax(torch.roll(x, (-2, 1), (1, 2)).reshape(4, 16, 16) + m, -1)
    x = _rand(4, 16, 16, g=g)
    run_op("a shifted-window mask of slice assignments, torch.roll", masked, [x])
    from torch.fx.experimental.proxy_tensor import make_fx
    import apollo.fx as afx
    gm = make_fx(torch.func.functionalize(masked, remove="mutations"),
                 decomposition_table=backend._decompositions(), tracing_mode="fake")(x)
    folded = afx.convert(gm, name="folded").graph.n_nodes
    keep, afx.FOLD_MAX_NUMEL = afx.FOLD_MAX_NUMEL, 0
    try:
        whole = afx.convert(gm, name="unfolded").graph.n_nodes
    finally:
        afx.FOLD_MAX_NUMEL = keep
    check(folded < whole / 2, "the mask and the roll's indices folded: %d Apollo nodes (%d unfolded)"
          % (folded, whole))


def _agree(a, b):
    return (a == b).double().mean().item()


@op("dropout")
def _dropout():
    """Dropout and bernoulli from the graph's counter-based generator
    (not eager's masks): the kept share within 4 sigma of 1 - p, the
    backward's mask the forward's (gradient == output for x = 1),
    neighbours and the two halves of the mask uncorrelated, another call
    and another dropout of the same graph another mask, torch.manual_seed
    the same masks again, rand_like uniform (chi-square over 64 bins),
    bernoulli(p) of an in-place dropout.  Seeded: the same numbers every
    run."""
    torch._dynamo.reset()
    backend.reset_stats()
    p, shape = 0.3, (64, 1024)
    n = shape[0] * shape[1]
    sigma = math.sqrt(p * (1 - p) / n)
    f = torch.compile(lambda x: F.dropout(x, p), backend="apollo", options={"strict": True})
    torch.manual_seed(11)
    x = torch.ones(shape, dtype=torch.float64, requires_grad=True)
    y = f(x)
    y.sum().backward()
    keep = y != 0
    scale = 1 / (1 - p)
    share = keep.double().mean().item()
    check(abs(share - (1 - p)) <= 4 * sigma and torch.equal(y[keep], torch.full_like(y[keep], scale)),
          "dropout p=%.1f of %d: %.4f kept (1 - p = %.1f, sigma %.4f), the kept scaled by 1/(1 - p)"
          % (p, n, share, 1 - p, sigma))
    check(torch.equal(x.grad, y.detach()), "the backward multiplies by the forward's mask")
    k = keep.double().flatten() - (1 - p)
    c1 = (k[1:] * k[:-1]).mean().item() / (p * (1 - p))
    ch = (k[: n // 2] * k[n // 2:]).mean().item() / (p * (1 - p))
    check(abs(c1) <= 4 / math.sqrt(n) and abs(ch) <= 4 / math.sqrt(n / 2),
          "mask correlation of neighbours %.1e, of the two halves %.1e (4 sigma: %.1e)"
          % (c1, ch, 4 / math.sqrt(n / 2)))
    y2 = f(x)
    a = _agree(keep, y2 != 0)
    want = p * p + (1 - p) * (1 - p)
    check(abs(a - want) <= 4 * math.sqrt(want * (1 - want) / n),
          "a second call draws another mask: %.4f agree (independent: %.2f)" % (a, want))
    torch.manual_seed(11)
    check(torch.equal(f(x) != 0, keep), "torch.manual_seed(11) again: the same mask")
    two = torch.compile(lambda x: (F.dropout(x, 0.5), F.dropout(x, 0.5)), backend="apollo",
                        options={"strict": True})(x)
    a2 = _agree(two[0] != 0, two[1] != 0)
    check(abs(a2 - 0.5) <= 4 * math.sqrt(0.25 / n), "two dropouts of one graph: %.4f agree (0.5)" % a2)
    u = torch.compile(lambda x: torch.rand_like(x), backend="apollo", options={"strict": True})(x.detach())
    hist = torch.histc(u, 64, 0, 1)
    chi = ((hist - n / 64) ** 2 / (n / 64)).sum().item()
    check(u.min().item() >= 0 and u.max().item() < 1 and chi <= 63 + 4 * math.sqrt(2 * 63),
          "rand_like: in [0, 1), mean %.4f, chi-square over 64 bins %.1f (63 +- %.0f)"
          % (u.mean().item(), chi, math.sqrt(2 * 63)))

    def inplace(x):
        h = x * 2.0
        return F.dropout(h, 0.25, inplace=True)     # bernoulli_(1 - p) on an empty tensor
    z = torch.compile(inplace, backend="apollo", options={"strict": True})(x.detach())
    s2 = (z != 0).double().mean().item()
    kept = z[z != 0]
    check(abs(s2 - 0.75) <= 4 * math.sqrt(0.75 * 0.25 / n) and torch.equal(kept, torch.full_like(kept, 2 / 0.75)),
          "in-place dropout (bernoulli.p): %.4f kept (0.75)" % s2)
    st = backend.stats()
    check(not st["graph_breaks"] and st["eager_graphs"] == 0 and st["eager_parts"] == 0,
          "dropout: %d graphs, no break, nothing eager" % st["graphs"])


def _is_float(x):
    return torch.is_tensor(x) and x.is_floating_point()


def _masked_rows(L, S, rows, g):
    """A boolean attention mask [L, S]: random, each row attending to at
    least one key, except `rows`, which attend to none."""
    m = (_rand(L, S, g=g) > -0.4) | torch.eye(L, S, dtype=torch.bool)
    m[list(rows)] = False
    return m


@op("sdpa")
def _sdpa():
    """F.scaled_dot_product_attention forward and backward as Apollo's
    Attention and AttentionGrad (one kernel each, the log-sum-exp saved,
    no L x S tensor): causal (L = S and top-left aligned L != S), boolean
    and additive masks, a scale, grouped-query heads, cross-attention
    lengths, rows masked entirely (0 and 0 gradients, as eager: PyTorch's
    safe softmax, Attention's safe_softmax); each against eager float64,
    and the fused graphs' pages show
    one attention launch forward and one attention_grad launch backward."""
    import glob
    import tempfile
    g = torch.Generator().manual_seed(11)
    B, H, E = 2, 4, 8
    cases = [
        ("causal", dict(is_causal=True), 12, 12, H),
        ("causal L<S", dict(is_causal=True), 5, 9, H),
        ("bool mask", dict(attn_mask=(_rand(12, 12, g=g) > -0.4) | torch.eye(12, dtype=torch.bool)), 12, 12, H),
        ("additive mask, scale 0.2", dict(attn_mask=_rand(B, 1, 7, 11, g=g), scale=0.2), 7, 11, H),
        ("grouped-query", dict(is_causal=True, enable_gqa=True), 10, 10, 2),
        # rows that attend to nothing: 0 out and 0 gradients, as eager
        # (PyTorch's safe softmax), not NaN
        ("fully masked rows", dict(attn_mask=_masked_rows(9, 11, (2, 6), g)), 9, 11, H),
        ("-inf rows of an additive mask", dict(attn_mask=torch.where(
            _masked_rows(9, 11, (0, 8), g), 0.0, -math.inf).double()), 9, 11, H),
    ]
    for name, kw, L, S, Hk in cases:
        def fn(q, k, v, kw=kw):
            return F.scaled_dot_product_attention(q, k, v, **kw)
        pages = tempfile.mkdtemp(prefix="apollo-sdpa-")
        os.environ["APOLLO_EXPLAIN_HTML"] = pages
        try:
            run_op("sdpa %s" % name, fn, [_rand(B, H, L, E, g=g), _rand(B, Hk, S, E, g=g), _rand(B, Hk, S, E, g=g)])
        finally:
            del os.environ["APOLLO_EXPLAIN_HTML"]
        files = sorted(glob.glob(os.path.join(pages, "*.html")))
        kinds = [re.findall(r'data-emitter="([a-z_]+)"', open(f).read()) for f in files]
        shutil.rmtree(pages)
        # a boolean mask reaches the op as an additive one (PyTorch's where:
        # one pointwise kernel of the mask's size, as in eager)
        fwd = [x for x in kinds[0] if not ("attn_mask" in kw and x == "pointwise")] if kinds else []
        check(len(kinds) == 2 and fwd == ["attention"] and kinds[1] == ["attention_grad"],
              "sdpa %s: the attention one launch forward and one backward (%s)" % (name, kinds))


@op("sdpa_tc")
def _sdpa_tc():
    """The tensor-core attention kernels through torch.compile: float16 and
    bfloat16 F.scaled_dot_product_attention (causal with grouped-query
    heads; an additive mask with L != S; a boolean mask with rows masked
    entirely; bfloat16 the first only but in make check-full) compiled for
    host:sm_90, sm_90's kernels run on the host with mma.sync, ldmatrix and
    cp.async emulated
    from the PTX ISA's definitions; forward and gradients against eager
    float64 on the same 16-bit inputs, within a few of the type's epsilons
    (P and dS are rounded to it: 4e-3 float16, 3e-2 bfloat16), and the
    pages show the tensor-core schedules (warps=.. keys=.., warps=.. tile=..);
    then the float16 grouped-query case for host:sm_90a with the unvalidated
    option: wgmma, Q, K and V by TMA, the softmax beside O += P V."""
    import glob
    import tempfile
    g = torch.Generator().manual_seed(5)
    B, H, E = 2, 4, 32
    cases = [("causal grouped-query", dict(is_causal=True, enable_gqa=True), 37, 37, 2),
             ("additive mask L<S", dict(attn_mask=_rand(B, 1, 21, 45, g=g)), 21, 45, 4),
             ("fully masked rows", dict(attn_mask=_masked_rows(19, 23, (0, 9, 18), g)), 19, 23, 4)]
    # the same kernels in another type: bfloat16 takes the first case but
    # under APOLLO_SWEEP=full (make check-full)
    full = os.environ.get("APOLLO_SWEEP") == "full"
    for dt, tol in ((torch.float16, 4e-3), (torch.bfloat16, 3e-2)):
        for name, kw, L, S, Hk in (cases if dt == torch.float16 or full else cases[:1]):
            def fn(q, k, v, kw=kw):
                return F.scaled_dot_product_attention(q, k, v, **{a: (b.to(dt) if _is_float(b) else b)
                                                                 for a, b in kw.items()})
            q, k, v = (_rand(*shape, g=g).to(dt).requires_grad_() for shape in
                       ((B, H, L, E), (B, Hk, S, E), (B, Hk, S, E)))
            dy = _rand(B, H, L, E, g=g).to(dt)
            pages = tempfile.mkdtemp(prefix="apollo-sdpa-tc-")
            torch._dynamo.reset()
            y = torch.compile(fn, backend="apollo",
                              options={"target": "host:sm_90", "explain_html": pages})(q, k, v)
            y.backward(dy)
            r = [x.detach().double().requires_grad_() for x in (q, k, v)]
            y64 = F.scaled_dot_product_attention(
                *r, **{a: (b.double() if _is_float(b) else b) for a, b in kw.items()})
            y64.backward(dy.double())
            errs = [_rel(y.detach().double(), y64.detach())] + [_rel(x.grad.double(), x64.grad)
                                                               for x, x64 in zip((q, k, v), r)]
            text = " ".join(open(f).read() for f in glob.glob(os.path.join(pages, "*.html")))
            shutil.rmtree(pages)
            tc = "warps=" in text and "keys=" in text and "tile=" in text
            check(max(errs) <= tol and tc,
                  "sdpa_tc %s %s on host:sm_90: y, dq, dk, dv within %s of float64 (%.1e), tensor-core "
                  "schedules %s" % (str(dt)[6:], name, ", ".join("%.1e" % e for e in errs), tol, tc))
    # the Hopper forward in the forms not yet run on a GPU (unvalidated:
    # Q, K and V by TMA -- K and V grouped-query, expanded views -- warp
    # specialised, or the softmax beside O += P V on wgmma), sm_90a's
    # kernels on the host
    name, kw, L, S, Hk = cases[0]
    q, k, v = (_rand(*shape, g=g).half().requires_grad_() for shape in ((B, H, L, E), (B, Hk, S, E), (B, Hk, S, E)))
    dy = _rand(B, H, L, E, g=g).half()
    pages = tempfile.mkdtemp(prefix="apollo-sdpa-tc-")
    torch._dynamo.reset()
    y = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw), backend="apollo",
                      options={"target": "host:sm_90a", "unvalidated": True, "explain_html": pages})(q, k, v)
    y.backward(dy)
    r = [x.detach().double().requires_grad_() for x in (q, k, v)]
    y64 = F.scaled_dot_product_attention(*r, **kw)
    y64.backward(dy.double())
    errs = [_rel(y.detach().double(), y64.detach())] + [_rel(x.grad.double(), x64.grad) for x, x64 in zip((q, k, v), r)]
    text = " ".join(open(f).read() for f in glob.glob(os.path.join(pages, "*.html")))
    shutil.rmtree(pages)
    # the warp-specialised forward (tma=2: a producer warpgroup) where its
    # threads fit, else the phase form with the overlap
    forms = "tma=2" in text or ("overlap=1" in text and "tma=1" in text)
    check(max(errs) <= 4e-3 and forms,
          "sdpa_tc float16 %s on host:sm_90a, unvalidated: y, dq, dk, dv within 4e-3 of float64 (%s), "
          "tma=2 (or overlap=1 tma=1) in the schedules %s" % (name, ", ".join("%.1e" % e for e in errs), forms))


class _Recorded:
    """While active, records the (op, attributes) of every node the
    converter adds to an Apollo graph."""

    def __enter__(self):
        self.ops = []
        self._node = apollo.graph.Graph.node
        rec = self

        def node(g, op, inputs, attrs=None, *rest, **kw):
            rec.ops.append((op, dict(attrs or {})))
            return rec._node(g, op, inputs, attrs, *rest, **kw)
        apollo.graph.Graph.node = node
        return self

    def __exit__(self, *exc):
        apollo.graph.Graph.node = self._node


def _rel(a, b):
    """max |a - b| relative to max |b| (float64)."""
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-300)).item()


def _cuda_attention(form, q, k, v, bias, causal, scale):
    """The CUDA op of `form` called by name: (output, log-sum-exp)."""
    if form == "flash":
        r = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, scale=scale)
    elif form == "efficient":
        r = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0, causal, scale=scale)
    else:
        r = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, bias, True, 0.0, causal, scale=scale)
    return r[0], r[1]


def _math_attention(q, k, v, bias, causal, scale):
    """softmax(scale q k^T + bias, causal top-left) v in float64 autograd,
    key/value heads repeated for grouped-query attention."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = scale * q @ k.transpose(-1, -2)
    if bias is not None:
        s = s + bias
    if causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
        s = s.masked_fill(~keep, -math.inf)
    return torch.softmax(s, -1) @ v


@op("sdpa_cuda")
def _sdpa_cuda():
    """The CUDA forms of scaled_dot_product_attention -- the flash,
    memory-efficient and cuDNN kernels' ops and their backwards, which
    AOTAutograd traces for CUDA tensors -- as Attention and AttentionGrad,
    run on the host.  There is no GPU here, and these ops have no CPU
    kernel: each is called by name on CPU float64 tensors, so that Dynamo
    and AOTAutograd trace it through its meta kernel -- the graphs of a
    CUDA trace: the log-sum-exp float32 whatever the dtype, [B, H, L
    rounded up to 32] for the memory-efficient kernel, [B, H, L, 1] for
    cuDNN, the Philox state returned and saved -- and only Apollo's
    kernels run.  Against aten._scaled_dot_product_flash_attention_for_cpu
    in float64: the output within 1e-12, the log-sum-exp within float32
    rounding (its padding +inf, as the CUDA kernel writes it); the
    gradients within 1e-12 of the CPU op's backward handed the same float32
    log-sum-exp, and within 1e-5 of float64 autograd through math
    attention (the float32 log-sum-exp's rounding); the memory-efficient
    kernel's attn_bias gradient within 1e-12 of P * (dY V^T - rowsum(dY *
    Y)).  Each call converted to one Attention (its scale, is_causal and
    fp32_scores) and one AttentionGrad (scale, is_causal).  Also: a memory-efficient forward without the
    log-sum-exp (inference), the pre-dispatch scaled_dot_product_attention
    (make_fx(pre_dispatch=True): a boolean mask, grouped-query heads), and
    dropout_p > 0 and flash's bottom-right causal refused with their
    reasons (strict)."""
    aten = torch.ops.aten
    B, H, E = 2, 4, 8
    cases = [  # name, form, L, S, key/value heads, is_causal, scale, attn_bias shape
        ("flash causal, grouped-query, scale 0.3", "flash", 9, 9, 2, True, 0.3, None),
        ("flash L 5, S 11", "flash", 5, 11, H, False, None, None),
        ("efficient causal L 5 < S 11, attn_bias and its gradient, scale 0.3", "efficient", 5, 11, H, True, 0.3,
         (B, H, 5, 11)),
        # the kernel itself takes no grouped heads; its meta kernel does, and so does the rewrite
        ("efficient L 37 (log-sum-exp [.., 64]), attn_bias [B, 1, L, S] and its gradient, grouped-query",
         "efficient", 37, 6, 2, False, None, (B, 1, 37, 6)),
        ("cudnn causal L 6 < S 10, grouped-query, attn_bias, scale 0.25", "cudnn", 6, 10, 2, True, 0.25,
         (B, H, 6, 10)),
    ]
    g = torch.Generator().manual_seed(5)
    for name, form, L, S, Hk, causal, scale, bshape in cases:
        q = _rand(B, H, L, E, g=g).requires_grad_()
        k = _rand(B, Hk, S, E, g=g).requires_grad_()
        v = _rand(B, Hk, S, E, g=g).requires_grad_()
        bias = _rand(*bshape, g=g).requires_grad_(form == "efficient") if bshape else None
        torch._dynamo.reset()
        backend.reset_stats()
        with _Recorded() as rec:
            fn = torch.compile(lambda q, k, v, b: _cuda_attention(form, q, k, v, b, causal, scale),
                               backend="apollo", options={"strict": True})
            y, lse = fn(q, k, v, bias)
            dy = _rand(*y.shape, g=g)
            y.backward(dy)
        st = backend.stats()
        sc = scale if scale is not None else 1.0 / math.sqrt(E)
        att = [(o, a) for o, a in rec.ops if o in ("Attention", "AttentionGrad")]
        check([o for o, _ in att] == ["Attention", "AttentionGrad"]
              and all(a == dict({"scale": sc, "is_causal": int(causal)}, **({"fp32_scores": 1} if o == "Attention" else {}))
                      for o, a in att)
              and st["graphs"] == 2 and not st["graph_breaks"] and st["eager_graphs"] == 0
              and st["eager_parts"] == 0,
              "sdpa_cuda %s: %s, 2 graphs, no break, nothing eager" % (name, att))
        qd, kd, vd, yd = q.detach(), k.detach(), v.detach(), y.detach()
        bd = bias.detach() if bias is not None else None
        ry, rlse = aten._scaled_dot_product_flash_attention_for_cpu(qd, kd, vd, 0.0, causal, attn_mask=bd, scale=sc)
        rows = {"flash": L, "efficient": (L + 31) // 32 * 32, "cudnn": L}[form]
        l32 = lse.reshape(B, H, -1)[..., :L]
        lse_ok = (lse.dtype == torch.float32 and lse.shape[:3] == (B, H, rows)
                  and lse.dim() == (4 if form == "cudnn" else 3)
                  and bool(((l32.double() - rlse).abs() <= 2.0 ** -24 * rlse.abs() + 1e-15).all())
                  and bool((lse.reshape(B, H, -1)[..., L:] == math.inf).all()))
        check(_rel(y, ry) <= 1e-12 and lse_ok,
              "sdpa_cuda %s: output within %.1e; log-sum-exp %s float32, within float32 rounding, %d rows +inf"
              % (name, _rel(y, ry), list(lse.shape), rows - L))
        # the CPU op's backward, handed the float32 log-sum-exp the backward graph read
        used = torch.empty_strided(rlse.shape, rlse.stride(), dtype=torch.float64).copy_(l32)
        ref = aten._scaled_dot_product_flash_attention_for_cpu_backward(dy, qd, kd, vd, yd, used, 0.0, causal,
                                                                        attn_mask=bd, scale=sc)
        got = [q.grad, k.grad, v.grad]
        if bias is not None and bias.requires_grad:
            kr, vr = kd.repeat_interleave(H // Hk, 1), vd.repeat_interleave(H // Hk, 1)
            p = torch.exp(sc * qd @ kr.transpose(-1, -2) + bd - used.unsqueeze(-1))
            p = p.tril() if causal else p
            ds = p * (dy @ vr.transpose(-1, -2) - (dy * yd).sum(-1, keepdim=True))
            ref = list(ref) + [ds.sum_to_size(bias.shape)]
            got.append(bias.grad)
        worst = max(_rel(a, b) for a, b in zip(got, ref))
        ins = [x.detach().requires_grad_() for x in (q, k, v)]
        b64 = bd.clone().requires_grad_() if len(got) == 4 else bd
        ins += [b64] if len(got) == 4 else []
        exact = torch.autograd.grad(_math_attention(*ins[:3], b64, causal, sc), ins, dy)
        off = max(_rel(a, b) for a, b in zip(got, exact))
        check(worst <= 1e-12 and off <= 1e-5,
              "sdpa_cuda %s: %d gradients within %.1e of the CPU op's backward on the same log-sum-exp, "
              "%.1e of float64 autograd" % (name, len(got), worst, off))

    # inference: the memory-efficient forward asked for no log-sum-exp
    torch._dynamo.reset()
    backend.reset_stats()
    q, k, v = _rand(B, H, 7, E, g=g), _rand(B, H, 9, E, g=g), _rand(B, H, 9, E, g=g)
    y, lse = torch.compile(lambda q, k, v: aten._scaled_dot_product_efficient_attention(q, k, v, None, False)[:2],
                           backend="apollo", options={"strict": True})(q, k, v)
    ry = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[0]
    check(_rel(y, ry) <= 1e-12 and lse.shape == (B, H, 0) and backend.stats()["graphs"] == 1,
          "sdpa_cuda efficient, compute_log_sumexp=False: output within %.1e, log-sum-exp %s"
          % (_rel(y, ry), list(lse.shape)))

    # pre-dispatch graphs keep scaled_dot_product_attention itself
    from torch.fx.experimental.proxy_tensor import make_fx
    q, k, v = _rand(B, H, 6, E, g=g), _rand(B, 2, 10, E, g=g), _rand(B, 2, 10, E, g=g)
    m = (_rand(6, 10, g=g) > -0.5) | torch.eye(6, 10, dtype=torch.bool)

    def sdpa(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.4, enable_gqa=True)
    gm = make_fx(sdpa, pre_dispatch=True)(q, k, v, m)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    with _Recorded() as rec:
        compiled = backend._submit(gm, {}, torch.device("cpu"), backend.Options({"strict": True}), "predispatch")
    y = compiled(q, k, v, m)[0]
    ry = sdpa(q, k, v, m)
    att = [(o, a) for o, a in rec.ops if o == "Attention"]
    check(targets == [aten.scaled_dot_product_attention.default] and _rel(y, ry) <= 1e-12
          and att == [("Attention", {"scale": 0.4, "is_causal": 0, "fp32_scores": 1})],
          "sdpa_cuda pre-dispatch scaled_dot_product_attention, boolean mask, grouped-query: %s, "
          "within %.1e of eager" % (att, _rel(y, ry)))

    # refused, naming the reason
    q, k, v = _rand(B, H, 5, E, g=g), _rand(B, H, 7, E, g=g), _rand(B, H, 7, E, g=g)
    refused = [
        ("dropout_p=0.1", lambda q, k, v: aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.1)[0]),
        ("bottom-right", lambda q, k, v: aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0]),
    ]
    for words, f in refused:
        torch._dynamo.reset()
        backend.reset_stats()
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                torch.compile(f, backend="apollo", options={"strict": True})(q, k, v)
            check(False, "sdpa_cuda %s is refused" % words)
        except Exception as e:      # Dynamo may wrap the backend's ApolloError
            text = re.sub(r"\s+", " ", str(e))
            why = (text[text.rfind("): ") + 3:] if "): " in text else text).split(" Set TORCHDYNAMO")[0]
            # the backend traced it again through the math kernel first, to
            # no avail: the op is called by name
            check(words in why and "unsupported op in the forward graph" in text
                  and "tracing attention again through PyTorch's math kernel" in said.getvalue(),
                  "sdpa_cuda refused (strict), after a second trace: %s" % why[:120])


def ops(names):
    """Runs the ops checks named (all when none is), each timed."""
    for n in names or list(OPS):
        t0 = time.monotonic()
        OPS[n]()
        print("torch_checks: ops %s: %.1f s" % (n, time.monotonic() - t0))


# ---- progress ------------------------------------------------------------------------

def progress():
    """A slow compile is logged once with the daemon's stage."""
    import logging
    import uuid

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__(logging.INFO)
            self.records = []

        def emit(self, record):
            self.records.append(record.getMessage())

    keep = Keep()
    log = logging.getLogger("apollo")
    log.addHandler(keep)
    log.setLevel(logging.INFO)
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).double()
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    opts = {"target": "cpu", "namespace": "progress-%s" % uuid.uuid4().hex}
    slow = backend.SLOW_COMPILE_S
    try:
        backend.SLOW_COMPILE_S = 0.0          # every compile is "slow"
        torch._dynamo.reset()
        backend.reset_stats()
        torch.compile(m, backend="apollo", options=opts)(x).sum().backward()
        graphs = backend.stats()["graphs"]
        check(graphs >= 2 and len(keep.records) == graphs and
              all("compiling" in r and ("waiting for the daemon's" in r or "last stage" in r)
                  for r in keep.records),
              "%d cold compiles, each logged once: %s" % (graphs, keep.records[0][:110] if keep.records else "none"))
        check(any(w in keep.records[0] for w in ("import", "partition", "layer", "tuning", "codegen",
                                                 "plan", "backend", "cache")),
              "the log names a stage")
        backend.SLOW_COMPILE_S = slow
        keep.records.clear()
        torch._dynamo.reset()
        backend.reset_stats()
        torch.compile(m, backend="apollo", options=opts)(x).sum().backward()
        check(backend.stats()["cache_hits"] == backend.stats()["graphs"] and not keep.records,
              "warm: answered from the cache, nothing logged")
    finally:
        backend.SLOW_COMPILE_S = slow
        log.removeHandler(keep)


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "config":
        config()
    elif what == "progress":
        progress()
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
