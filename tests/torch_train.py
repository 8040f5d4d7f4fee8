#!/usr/bin/env python3
"""torch_train.py -- trains a small model with torch.compile(backend="apollo")
on the cpu target beside the same model in eager PyTorch, and checks that
they agree.

    torch_train.py MODEL [--steps 20] [--json OUT] [--strict]
                   [--dtype float16|bfloat16|float64 --rtol R --atol A --prtol P]
                   [--autocast bfloat16|float16]

MODEL: gpt (2 layers, 250k parameters, no biases in the linear layers),
sdpa (the gpt with F.scaled_dot_product_attention(is_causal=True) in
place of its written-out attention), gpt2 (Hugging Face's GPT2LMHeadModel,
2 layers, width 64, 4 heads, vocabulary 128, its default SDPA attention,
no dropout; needs transformers), cnn (convolutions + BatchNorm in training
mode + ReLU + mean pooling + linear), break (the cnn with torch.atan2,
which Apollo does not have, in the middle: the graph splits around it).
Both copies start from the same weights and take the same batches; AdamW
(lr 1e-3) steps both.  Checked: the loss at every step within 1e-4
relative, every parameter (and BatchNorm's running statistics) within
1e-4 at the end (--rtol, --atol; --prtol P also bounds each parameter's
largest difference relative to its largest value; --dtype bfloat16 trains
both copies in bfloat16, where one rounding step is 4e-3 relative;
--dtype float64 leaves only rounding noise, 1e-12 and below; --autocast
keeps float32 weights and runs both forwards under torch.autocast("cpu",
dtype), float16 with a torch.amp.GradScaler each).  Prints one line
per step, then "startup: S s" (from the first compiled call to the end of
the first step: tracing, submits, loading kernels) and the backend's
counters (graphs, cache hits); --json writes them for the caller.

Parameters that only ever get rounding noise as gradient (a bias before a
BatchNorm, the key bias of attention) are left out of the models: AdamW
scales any gradient to a step of about lr, so noise there is amplified into
differences no compiler can avoid.
"""
import argparse
import contextlib
import copy
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H, sdpa=False):
        super().__init__()
        self.H = H
        self.sdpa = sdpa
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C, bias=False)
        self.proj = nn.Linear(C, C, bias=False)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C, bias=False)
        self.out = nn.Linear(4 * C, C, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.H, C // self.H).transpose(1, 2)
        k = k.view(B, T, self.H, C // self.H).transpose(1, 2)
        v = v.view(B, T, self.H, C // self.H).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.H))
            mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
            att = att.masked_fill(~mask, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=128, T=32, C=96, layers=2, heads=4, sdpa=False):
        super().__init__()
        self.tok = nn.Embedding(vocab, C)
        self.pos = nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block(C, heads, sdpa) for _ in range(layers)])
        self.lnf = nn.LayerNorm(C)
        self.head = nn.Linear(C, vocab, bias=False)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.lnf(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class GPT2(nn.Module):
    """Hugging Face's GPT-2 with its default (SDPA) attention.  The loss is
    taken from the logits here: the model's own loss casts the logits to
    float32 first, which would leave float32 rounding in a float64 run.
    Its key bias gets only rounding noise as gradient; in float64 that is
    far below AdamW's eps, so it moves by 1e-12 at most."""

    def __init__(self, vocab=128, T=32, C=64, layers=2, heads=4):
        super().__init__()
        import transformers
        cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=T, n_embd=C, n_layer=layers, n_head=heads,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                      bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
        self.m = transformers.GPT2LMHeadModel(cfg)

    def forward(self, idx, targets):
        logits = self.m(input_ids=idx, use_cache=False).logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class CNN(nn.Module):
    def __init__(self, odd=False):
        super().__init__()
        self.odd = odd
        self.c1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(32)
        self.c3 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.b3 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32, 10)

    def forward(self, x, y):
        x = F.relu(self.b1(self.c1(x)))
        x = F.relu(self.b2(self.c2(x)))
        if self.odd:
            x = torch.atan2(x, x + 1.0)        # not an Apollo op: a graph break
        x = F.relu(self.b3(self.c3(x)) + x)
        return F.cross_entropy(self.fc(x.mean((2, 3))), y)


def batches(model, steps, gen, dtype):
    out = []
    for _ in range(steps):
        if model in ("gpt", "sdpa", "gpt2"):
            idx = torch.randint(0, 128, (4, 32), generator=gen)
            out.append((idx, torch.roll(idx, -1, dims=1)))
        else:
            out.append((torch.randn(8, 3, 16, 16, generator=gen).to(dtype),
                        torch.randint(0, 10, (8,), generator=gen)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=["gpt", "sdpa", "gpt2", "cnn", "break"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--dtype", choices=["float32", "float16", "bfloat16", "float64"], default="float32")
    ap.add_argument("--rtol", type=float, default=1e-4, help="loss, relative, at every step")
    ap.add_argument("--atol", type=float, default=1e-4, help="parameters, at the end")
    ap.add_argument("--prtol", type=float, help="parameters, at the end, relative to each one's largest value")
    ap.add_argument("--autocast", choices=["bfloat16", "float16"],
                    help="float32 weights, the forward under torch.autocast('cpu', dtype); float16 with a GradScaler")
    a = ap.parse_args()
    torch.manual_seed(0)
    if a.model in ("gpt", "sdpa"):
        model = GPT(layers=1, sdpa=True) if a.model == "sdpa" else GPT()
    elif a.model == "gpt2":
        model = GPT2()
    else:
        model = CNN(odd=a.model == "break")
    dtype = getattr(torch, a.dtype)
    model = model.to(dtype)
    ref = copy.deepcopy(model)
    n_params = sum(p.numel() for p in model.parameters())
    options = {"strict": True} if a.strict else {}
    compiled = torch.compile(model, backend="apollo", options=options)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    data = batches(a.model, a.steps, torch.Generator().manual_seed(1), dtype)
    amp = (lambda: torch.autocast("cpu", dtype=getattr(torch, a.autocast))) if a.autocast else contextlib.nullcontext
    scaled = a.autocast == "float16"
    scaler = torch.amp.GradScaler("cpu", enabled=scaled)
    scaler_ref = torch.amp.GradScaler("cpu", enabled=scaled)
    print("%s: %d parameters (%s), %d steps of AdamW" % (a.model, n_params, a.dtype, a.steps))
    worst = 0.0
    startup = None
    ok = True
    for step, batch in enumerate(data):
        t0 = time.perf_counter()
        with amp():
            loss = compiled(*batch)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        if startup is None:
            startup = time.perf_counter() - t0
        with amp():
            loss_ref = ref(*batch)
        scaler_ref.scale(loss_ref).backward()
        scaler_ref.step(opt_ref)
        scaler_ref.update()
        opt_ref.zero_grad()
        rel = abs(loss.item() - loss_ref.item()) / max(abs(loss_ref.item()), 1e-30)
        worst = max(worst, rel)
        bad = not rel <= a.rtol
        ok &= not bad
        print("step %2d: loss %.6f eager %.6f rel %.1e%s" % (step, loss.item(), loss_ref.item(), rel,
                                                            "  FAIL" if bad else ""))
    pdiff, pname, prel, prname = 0.0, "", 0.0, ""
    for (name, p), q in zip(list(model.named_parameters()) + list(model.named_buffers()),
                            list(ref.parameters()) + list(ref.buffers())):
        if not p.dtype.is_floating_point:
            continue
        d = (p.detach().double() - q.detach().double()).abs().max().item()
        if not d <= pdiff:   # NaN counts as the largest
            pdiff, pname = d if d == d else float("inf"), name
        r = d / max(q.detach().double().abs().max().item(), 1e-30)
        if not r <= prel:
            prel, prname = r if r == r else float("inf"), name
    ok &= pdiff <= a.atol
    ok &= a.prtol is None or prel <= a.prtol
    import apollo.torch_backend as backend
    st = backend.stats()
    print("params: largest difference %.2e (%s)%s" % (pdiff, pname, "  FAIL" if pdiff > a.atol else ""))
    print("params: largest relative difference %.2e (%s)%s"
          % (prel, prname, "  FAIL" if a.prtol is not None and prel > a.prtol else ""))
    print("startup: %.2f s (first step: trace, submit, load kernels)" % startup)
    print("apollo: %d graphs submitted, %d from the cache, %d launches, daemon compile %.0f ms, %d graph breaks"
          % (st["graphs"], st["cache_hits"], st["kernels"], st["compile_ms"], len(st["graph_breaks"])))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "params": n_params, "steps": a.steps, "worst_loss_rel": worst,
                       "param_diff": pdiff, "param_rel": prel,
                       "startup_s": startup, "ok": ok, **st}, f)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
