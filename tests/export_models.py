#!/usr/bin/env python3
"""export_models.py -- ONNX exports of everyday architectures with random
weights, as a new user would make them (torch.onnx.export, opset 17), each
written as a backend-test folder whose reference outputs come from
onnxruntime:

    export_models.py --out DIR [--seed S] [NAME...]

DIR/<name>/model.onnx and DIR/<name>/test_data_set_0/{input,output}_K.pb.
Models (torchvision and Hugging Face transformers architectures; small
inputs, and small configurations where the full one is too slow for the
host target's simple kernels -- each line says which):
"""
import argparse
import os
import sys
import warnings

import numpy as np
import onnx
from onnx import numpy_helper


def _randomize(m):
    """Random weights that keep activations in a useful range: BatchNorm
    scales and statistics drawn around 1 and 0 (not the freshly built
    1/0/0/1, which make some networks' outputs vanish), and parameters a
    constructor zeroed (classifier heads) drawn small."""
    import torch
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
                mod.weight.copy_(0.5 + torch.rand(mod.weight.shape, generator=g))
                mod.bias.copy_(0.1 * torch.randn(mod.bias.shape, generator=g))
                mod.running_mean.copy_(0.1 * torch.randn(mod.running_mean.shape, generator=g))
                mod.running_var.copy_(0.5 + torch.rand(mod.running_var.shape, generator=g))
        for p in m.parameters():
            if not p.any():
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
    return m


def _vision(ctor, size, **kw):
    def make():
        import torch
        m = _randomize(ctor(weights=None, **kw)).eval()
        return m, (torch.randn(1, 3, size, size),), ["image"]
    return make


def _vit():
    import torch
    torch.backends.mha.set_fastpath_enabled(False)   # the exportable attention, not the fused kernel
    from torchvision.models.vision_transformer import VisionTransformer
    m = _randomize(VisionTransformer(image_size=64, patch_size=16, num_layers=2, num_heads=4, hidden_dim=64,
                                     mlp_dim=128, num_classes=10)).eval()
    return m, (torch.randn(1, 3, 64, 64),), ["image"]


def _swin():
    import torch
    from torchvision.models.swin_transformer import SwinTransformer
    m = _randomize(SwinTransformer(patch_size=[4, 4], embed_dim=24, depths=[2, 2, 2, 2], num_heads=[2, 2, 2, 4],
                                   window_size=[7, 7], num_classes=10)).eval()
    return m, (torch.randn(1, 3, 112, 112),), ["image"]


def _hf(kind):
    def make():
        import torch
        import transformers as T

        class Wrap(torch.nn.Module):
            """The model's main output as one tensor (logits or hidden states)."""
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, *a):
                names = ["input_ids", "attention_mask"][:len(a)]
                out = self.m(**dict(zip(names, a)), use_cache=False) if kind != "t5" and kind != "bert" \
                    else self.m(**dict(zip(names, a)))
                return out[0]

        torch.manual_seed(0)
        ids = torch.randint(0, 500, (1, 16))
        if kind == "gpt2":
            m = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=500, n_positions=64, n_embd=64, n_layer=2, n_head=4))
        elif kind == "bert":
            m = T.BertModel(T.BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=128,
                                         max_position_embeddings=64))
            mask = torch.ones(1, 16, dtype=torch.int64)
            mask[0, 12:] = 0
            return _randomize(Wrap(m)).eval(), (ids, mask), ["input_ids", "attention_mask"]
        elif kind == "llama":
            m = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=500, hidden_size=64, intermediate_size=128,
                                                 num_hidden_layers=2, num_attention_heads=4,
                                                 num_key_value_heads=2, max_position_embeddings=64))
        else:
            m = T.T5EncoderModel(T.T5Config(vocab_size=500, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                            num_heads=4))
        return _randomize(Wrap(m)).eval(), (ids,), ["input_ids"]
    return make


def _tv(name):
    import torchvision.models as M
    return getattr(M, name)


MODELS = {
    "resnet50": ("torchvision resnet50, 1x3x64x64", lambda: _vision(_tv("resnet50"), 64)()),
    "mobilenet_v3": ("torchvision mobilenet_v3_small, 1x3x96x96", lambda: _vision(_tv("mobilenet_v3_small"), 96)()),
    "efficientnet_b0": ("torchvision efficientnet_b0, 1x3x96x96", lambda: _vision(_tv("efficientnet_b0"), 96)()),
    "convnext_t": ("torchvision convnext_tiny, 1x3x64x64", lambda: _vision(_tv("convnext_tiny"), 64)()),
    "densenet121": ("torchvision densenet121, 1x3x64x64", lambda: _vision(_tv("densenet121"), 64)()),
    "vit_b16": ("torchvision VisionTransformer, patch 16 (ViT-B/16's), 2 layers, width 64, 1x3x64x64", _vit),
    "swin_t": ("torchvision SwinTransformer (Swin-T's shape: 4 stages, window 7, shifted), width 24, 1x3x112x112", _swin),
    "gpt2": ("transformers GPT2LMHeadModel, 2 layers, width 64, 16 tokens", _hf("gpt2")),
    "bert": ("transformers BertModel, 2 layers, width 64, 16 tokens with a padding mask", _hf("bert")),
    "llama": ("transformers LlamaForCausalLM (rotary, RMSNorm, SwiGLU, grouped KV), 2 layers, width 64, 16 tokens", _hf("llama")),
    "t5_encoder": ("transformers T5EncoderModel (relative position buckets), 2 layers, width 64, 16 tokens", _hf("t5")),
}
# Exported only when named (bench/warm.sh's kernel-count ladder), not by
# default: tests/onnx_models.sh checks MODELS.
NAMED_ONLY = {
    "resnet18": ("torchvision resnet18, 1x3x64x64 (named only)", lambda: _vision(_tv("resnet18"), 64)()),
    "mobilenet_v2": ("torchvision mobilenet_v2, 1x3x96x96 (named only)",
                     lambda: _vision(_tv("mobilenet_v2"), 96)()),
}
__doc__ = __doc__ + "\n".join("    %-16s %s" % (k, v[0]) for k, v in {**MODELS, **NAMED_ONLY}.items()) + "\n"


def export(name, out, rng):
    import torch
    torch.manual_seed(0)
    model, args, in_names = {**MODELS, **NAMED_ONLY}[name][1]()
    d = os.path.join(out, name)
    ds = os.path.join(d, "test_data_set_0")
    os.makedirs(ds, exist_ok=True)
    path = os.path.join(d, "model.onnx")
    how = "TorchScript exporter"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(model, args, path, opset_version=17, input_names=in_names, dynamo=False)
        except Exception as e:   # ops the old exporter lacks (aten::diff ...): the torch.export one
            how = "torch.export exporter (the TorchScript one failed: %s)" % str(e).splitlines()[0][:80]
            torch.onnx.export(model, args, path, opset_version=18, input_names=in_names, dynamo=True,
                              external_data=False)
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feeds = {}
    for i, a in zip(sess.get_inputs(), args):
        feeds[i.name] = a.numpy()
    outs = sess.run(None, feeds)
    for k, i in enumerate(sess.get_inputs()):
        with open(os.path.join(ds, "input_%d.pb" % k), "wb") as f:
            f.write(numpy_helper.from_array(feeds[i.name], i.name).SerializeToString())
    for k, (o, v) in enumerate(zip(sess.get_outputs(), outs)):
        with open(os.path.join(ds, "output_%d.pb" % k), "wb") as f:
            f.write(numpy_helper.from_array(np.asarray(v), o.name).SerializeToString())
    ops = sorted({n.op_type for n in onnx.load(path, load_external_data=False).graph.node})
    print("export_models: %s: %s, %d nodes, ops %s" % (name, how, len(onnx.load(path).graph.node),
                                                      " ".join(ops)), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    bad = 0
    for name in a.names or list(MODELS):
        try:
            export(name, a.out, rng)
        except Exception as e:  # report and go on
            print("export_models: %s: FAILED: %s: %s" % (name, type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
