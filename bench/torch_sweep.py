#!/usr/bin/env python3
"""torch_sweep.py -- real training steps through torch.compile(backend="apollo").

    torch_sweep.py [MODEL...] [--steps 2] [--dtype float32|float64]
                   [--no-dropout] [--rtol R] [--json OUT] [--target cpu]

MODEL (default: all eleven), random weights, each as its library makes it
(dropout and stochastic depth included), in these configurations:
  torchvision, 10 classes, 4 images of 3x64x64 (vit_b_16: 3x32x32):
    resnet18, mobilenet_v3_small, efficientnet_b0, convnext_tiny, swin_t
                 the library's constructors (torchvision.models.NAME(
                 num_classes=10)): their own depths and widths
    vit_b_16     torchvision.models.vit_b_16(image_size=32, num_classes=10):
                 ViT-B/16's 12 layers, width 768, 12 heads, MLP 3072, on
                 2x2 patches of 16x16 and the class token
  Hugging Face, 2 sequences of 16 tokens, vocabulary 128:
    gpt2, bert, llama
                 2 layers, width 64, 4 heads (bert: a masked LM whose labels
                 ignore three positions of four (-100); llama: 2 key/value
                 heads, MLP 128)
    t5           T5ForConditionalGeneration: 2 encoder and 2 decoder
                 layers, d_model 64, 4 heads of 16, d_ff 128, 8 relative-
                 position buckets (max distance 16); the decoder reads the
                 labels (16 random tokens) shifted right
    whisper      WhisperForAudioClassification: Whisper's encoder (2
                 layers, d_model 64, 4 heads, FFN 128, 16 mel bins, 32
                 positions, so 64 frames in), its projector (32), mean
                 pooling and a 10-class classifier; 2 clips of 16x64
                 features
  the smallest, which the trimmed check in tests/torch.sh trains:
    resnet_tiny  torchvision's ResNet with one BasicBlock per stage
    bert_tiny    one layer, width 32, 2 heads
Each model is trained for --steps steps (forward, backward, AdamW lr 1e-3)
through the backend on the host target beside a copy in eager PyTorch that
takes the same batches; printed per model: the graphs submitted, the graph
breaks with their reasons, the graphs and parts of graphs that ran in
eager PyTorch, and -- only where no dropout is active: the compiled model
draws its masks from the graph's own generator, so --no-dropout (every
dropout, stochastic-depth and attention-dropout probability 0) is the run
that compares -- the worst loss difference relative to eager over the
steps, the first step's largest gradient difference relative to the
model's largest gradient, and the largest parameter difference relative
to the parameter's largest value (or to lr, one AdamW step, where that is
smaller) with the parameter's name.  AdamW divides each gradient by its
root mean square plus eps (1e-8), so a gradient that is 0 in exact
arithmetic (a key bias under softmax, a bias before a BatchNorm) moves by
its rounding noise times lr / eps: parameters differ by up to about 1e5
times the gradients' difference.  The language models' loss is taken from
the logits (their own casts the logits to float32).  Graph breaks are
Dynamo's (torch._dynamo's counters, with their reasons) and the backend's
(ops it left to eager PyTorch).

Prints a table; exits 1 when --rtol is given and a model is further than
that from eager (loss or parameters), or when a model fails to run.  Not
part of make check (several minutes of daemon compile time on 2 cores):
tests/torch.sh runs resnet_tiny and bert_tiny in float64.
"""
import argparse
import copy
import json
import sys
import time
import traceback

import torch
import torch.nn.functional as F

MODELS = ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "vit_b_16", "swin_t",
          "gpt2", "bert", "llama", "t5", "whisper"]
SMALL = ["resnet_tiny", "bert_tiny"]
VISION = ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "vit_b_16", "swin_t", "resnet_tiny"]


def _hf_quiet():
    import transformers
    transformers.logging.set_verbosity_error()
    return transformers


class Vision(torch.nn.Module):
    """A torchvision classifier and its cross-entropy loss."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


class LM(torch.nn.Module):
    """A Hugging Face language model and its cross-entropy, -100 ignored
    (shifted by one for causal models), taken here from the logits: the
    models' own loss casts the logits to float32 first, which would leave
    float32 rounding in a float64 run."""

    def __init__(self, net, causal):
        super().__init__()
        self.net = net
        self.causal = causal

    def forward(self, idx, labels):
        if self.causal:
            logits = self.net(input_ids=idx, use_cache=False).logits[:, :-1]
            labels = labels[:, 1:]
        else:
            logits = self.net(input_ids=idx).logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100)


class Seq2Seq(torch.nn.Module):
    """A Hugging Face encoder-decoder (T5) and its cross-entropy: the
    decoder reads the labels shifted right (the model's own
    _shift_right), the loss taken from the logits."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, idx, labels):
        logits = self.net(input_ids=idx, decoder_input_ids=self.net._shift_right(labels), use_cache=False).logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))


class Audio(torch.nn.Module):
    """A Hugging Face audio classifier (Whisper's encoder, its projector,
    mean pooling and classifier) and the cross-entropy of its logits."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, features, y):
        return F.cross_entropy(self.net(input_features=features).logits, y)


def _no_dropout(net):
    """Every nn.Dropout, StochasticDepth and attention-dropout probability
    of a torchvision model set to 0."""
    for m in net.modules():
        if isinstance(m, torch.nn.Dropout) or type(m).__name__ == "StochasticDepth":
            m.p = 0.0
        for k in ("dropout", "attention_dropout"):
            if isinstance(getattr(m, k, None), float):
                setattr(m, k, 0.0)


def build(name, dropout=True):
    """(model, batch maker(generator) -> args) for `name`; dropout=False
    sets every dropout probability of the model to 0."""
    if name in VISION:
        import torchvision
        size = 64
        if name == "resnet_tiny":
            from torchvision.models.resnet import BasicBlock, ResNet
            net = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10)
        elif name == "vit_b_16":
            size = 32           # 2x2 patches of 16x16 and the class token
            net = torchvision.models.vit_b_16(image_size=32, num_classes=10)
        else:
            net = getattr(torchvision.models, name)(num_classes=10)
        if not dropout:
            _no_dropout(net)

        def batch(g):
            return torch.randn(4, 3, size, size, generator=g), torch.randint(0, 10, (4,), generator=g)
        return Vision(net), batch
    tf = _hf_quiet()
    common = dict(vocab_size=128, attn_implementation="sdpa")
    if not dropout:
        common.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, attention_dropout=0.0)
    if name == "gpt2":
        net = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                               bos_token_id=0, eos_token_id=0, **common))
    elif name in ("bert", "bert_tiny"):
        small = name == "bert_tiny"
        net = tf.BertForMaskedLM(tf.BertConfig(hidden_size=32 if small else 64, num_hidden_layers=1 if small else 2,
                                               num_attention_heads=2 if small else 4,
                                               intermediate_size=64 if small else 128,
                                               max_position_embeddings=64, pad_token_id=0, **common))
    elif name == "llama":
        net = tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                 num_attention_heads=4, num_key_value_heads=2,
                                                 max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
                                                 pad_token_id=0, **common))
    elif name == "t5":
        net = tf.T5ForConditionalGeneration(tf.T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                                        num_heads=4, relative_attention_num_buckets=8,
                                                        relative_attention_max_distance=16,
                                                        dropout_rate=0.1 if dropout else 0.0,
                                                        pad_token_id=0, eos_token_id=1,
                                                        decoder_start_token_id=0))

        def batch(g):
            return torch.randint(2, 128, (2, 16), generator=g), torch.randint(2, 128, (2, 16), generator=g)
        return Seq2Seq(net), batch
    elif name == "whisper":
        cfg = tf.WhisperConfig(vocab_size=128, num_mel_bins=16, d_model=64, encoder_layers=2,
                               encoder_attention_heads=4, encoder_ffn_dim=128, decoder_layers=2,
                               decoder_attention_heads=4, decoder_ffn_dim=128, max_source_positions=32,
                               max_target_positions=32, num_labels=10, classifier_proj_size=32,
                               pad_token_id=0, bos_token_id=0, eos_token_id=0, decoder_start_token_id=0,
                               attn_implementation="sdpa")
        net = tf.WhisperForAudioClassification(cfg)

        def batch(g):
            return torch.randn(2, 16, 64, generator=g), torch.randint(0, 10, (2,), generator=g)
        return Audio(net), batch
    else:
        raise ValueError("unknown model %r" % name)
    masked = name.startswith("bert")

    def batch(g):
        idx = torch.randint(1, 128, (2, 16), generator=g)
        labels = idx.clone()
        if masked:
            labels[torch.rand(idx.shape, generator=g) < 0.75] = -100
        return idx, labels
    return LM(net, not masked), batch


def has_dropout(model):
    """Whether any dropout of the model is active (p > 0)."""
    for m in model.modules():
        if (isinstance(m, torch.nn.Dropout) or type(m).__name__ == "StochasticDepth") and m.p > 0:
            return True
        for k in ("dropout", "attention_dropout"):
            if isinstance(getattr(m, k, None), float) and getattr(m, k) > 0:
                return True
        cfg = getattr(m, "config", None)
        for k in ("attn_pdrop", "attention_probs_dropout_prob", "attention_dropout", "dropout_rate", "dropout",
                  "activation_dropout"):
            if cfg is not None and getattr(cfg, k, 0) > 0:
                return True
    return False


def _grad_rel(model, ref):
    """The first step's gradients: the largest difference from eager's,
    relative to the largest gradient of the whole model (a parameter
    whose gradient is 0 in exact arithmetic gets rounding noise, which
    AdamW, dividing by its root mean square, makes a step of up to lr)."""
    top = max((q.grad.detach().double().abs().max().item() for q in ref.parameters() if q.grad is not None),
              default=0.0)
    d = 0.0
    for p, q in zip(model.parameters(), ref.parameters()):
        if p.grad is None or q.grad is None:
            d = float("inf") if (p.grad is None) != (q.grad is None) else d
            continue
        e = (p.grad.detach().double() - q.grad.detach().double()).abs().max().item()
        d = max(d, e if e == e else float("inf"))
    return d / max(top, 1e-300)


def run(name, steps, dtype, target, dropout=True, verbose=False):
    """Trains `name` through the backend beside eager; returns a dict of
    what the sweep prints."""
    import apollo.torch_backend as backend
    from torch._dynamo.utils import counters
    torch.manual_seed(0)
    model, batch = build(name, dropout)
    model = model.to(dtype).train()
    ref = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    data = [batch(g) for _ in range(steps)]
    data = [tuple(t.to(dtype) if t.is_floating_point() else t for t in b) for b in data]
    compiled = torch.compile(model, backend="apollo", options={"target": target, "quiet": not verbose})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    backend.reset_stats()
    torch._dynamo.reset()
    counters.clear()
    worst, grel = 0.0, 0.0
    t0 = time.perf_counter()
    for step, b in enumerate(data):
        torch.manual_seed(100 + step)      # the same draws in both copies (eager dropout is not the graph's)
        loss = compiled(*b)
        loss.backward()
        torch.manual_seed(100 + step)
        loss_ref = ref(*b)
        loss_ref.backward()
        if step == 0:
            grel = _grad_rel(model, ref)
        opt.step()
        opt.zero_grad()
        opt_ref.step()
        opt_ref.zero_grad()
        rel = abs(loss.item() - loss_ref.item()) / max(abs(loss_ref.item()), 1e-30)
        worst = max(worst, rel if rel == rel else float("inf"))
    wall = time.perf_counter() - t0
    prel, pworst = 0.0, ""
    for (pname, p), q in zip(model.named_parameters(), ref.parameters()):
        d = (p.detach().double() - q.detach().double()).abs().max().item()
        # relative to the parameter's largest value, or to one AdamW step
        # (lr) for a parameter that started at 0 and moves by noise
        r = d / max(q.detach().double().abs().max().item(), 1e-3)
        r = r if r == r else float("inf")
        if r > prel:
            prel, pworst = r, pname
    st = backend.stats()
    dynamo_breaks = []
    for reason, count in counters["graph_break"].items():
        dynamo_breaks += ["dynamo: " + reason.splitlines()[0][:200]] * count
    return {"model": name, "params": sum(p.numel() for p in model.parameters()), "steps": steps,
            "dropout": has_dropout(model), "dynamo_breaks": dynamo_breaks,
            "dtype": str(dtype).replace("torch.", ""), "worst_loss_rel": worst, "grad_rel": grel,
            "param_rel": prel, "param_worst": pworst,
            "graphs": st["graphs"], "graph_breaks": st["graph_breaks"], "eager_graphs": st["eager_graphs"],
            "eager_parts": st["eager_parts"], "compile_ms": st["compile_ms"], "wall_s": wall}


def _op_reason(line):
    """A break line without its node's name: "op: reason"."""
    if line.startswith("dynamo: "):
        return line
    op, _, rest = line.partition(" (")
    return "%s: %s" % (op, rest.partition("): ")[2])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--rtol", type=float, help="fail when a loss or parameter is further than this, relative")
    ap.add_argument("--json", help="one JSON object per model, one a line")
    ap.add_argument("--no-dropout", action="store_true", help="every dropout probability 0 (to compare with eager)")
    ap.add_argument("-v", "--verbose", action="store_true", help="the backend's graph-break lines too")
    a = ap.parse_args()
    names = a.models or MODELS
    for n in names:
        if n not in MODELS + SMALL:
            ap.error("unknown model %r (%s)" % (n, ", ".join(MODELS + SMALL)))
    rows, ok = [], True
    for n in names:
        try:
            r = run(n, a.steps, getattr(torch, a.dtype), a.target, not a.no_dropout, a.verbose)
        except Exception as e:  # report it and go on with the next model
            traceback.print_exc()
            r = {"model": n, "error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")}
            ok = False
        rows.append(r)
        if "error" in r:
            print("%-20s FAILED: %s" % (n, r["error"]), flush=True)
            continue
        # with dropout the masks are the graph's generator's, not eager's:
        # the losses are not compared then
        cmp = not r["dropout"]
        bad = cmp and a.rtol is not None and not (r["worst_loss_rel"] <= a.rtol and r["param_rel"] <= a.rtol)
        ok &= not bad
        breaks = r["dynamo_breaks"] + r["graph_breaks"]
        print("%-20s %9d params %s: %d graphs, %d graph breaks, %d eager graphs, %d eager parts; %s; "
              "%.0f s (daemon %.0f s)%s"
              % (n, r["params"], r["dtype"], r["graphs"], len(breaks), r["eager_graphs"], r["eager_parts"],
                 "loss within %.1e, first gradients within %.1e, parameters within %.1e relative of eager "
                 "(worst: %s)" % (r["worst_loss_rel"], r["grad_rel"], r["param_rel"],
                                  r["param_worst"].replace("net.", "", 1) or "-")
                 if cmp else "dropout on: masks not eager's, not compared",
                 r["wall_s"], r["compile_ms"] / 1e3, "  FAIL" if bad else ""), flush=True)
        for line in sorted(set(_op_reason(b) for b in breaks)):
            print("    break: %s (x%d)" % (line, sum(_op_reason(b) == line for b in breaks)), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
