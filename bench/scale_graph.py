#!/usr/bin/env python3
"""bench/scale_graph.py LAYERS OUT.onnx [--initializers] -- a
transformer-encoder ONNX model of LAYERS layers, for bench/scale.sh (compile
time against graph size) and bench/compile.sh (distinct kernels against
layers).

Each layer has the shape of ../shared/testdata/models/bert_like_2l (PyTorch's
nn.TransformerEncoderLayer as exported, sequence first, post-norm):

  Transpose -> MatMul(W_in) + bias (fused QKV) -> 3 x Slice -> Reshape into
  heads -> Transpose (K: to [heads, d, seq]) -> Div(Q, sqrt(d_head)) ->
  MatMul(Q, K^T) -> Softmax -> MatMul(., V) -> Transpose -> Reshape ->
  Gemm(W_out, transB) -> Reshape -> Transpose -> residual Add ->
  LayerNorm opened (ReduceMean, Sub, Pow, ReduceMean, Add eps, Sqrt, Div,
  Mul, Add) -> MatMul(W1) + bias -> Gelu in its Erf form -> MatMul(W2) +
  bias -> residual Add -> LayerNorm.

Sizes are small (batch 2, seq 16, d_model 64, 2 heads, FFN 256) so that
code generation stays cheap; every layer has the same shapes, so the
kernels of all layers are the same and shared by content.  The weights of
each layer are graph inputs (no data in the file), the small constants
Constant nodes, as PyTorch exports them; with --initializers they are
initializers holding random values of their own per layer (seeded by
name), as a model exported with its weights is: the biases and LayerNorm
weights (at most 4 KiB) then import as constants of the graph.
"""
import zlib
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

B, S, D, H, F = 2, 16, 64, 2, 256
HD = D // H


class Builder:
    def __init__(self, initializers=False):
        self.nodes = []
        self.inputs = []
        self.inits = []
        self.initializers = initializers
        self.n = 0

    def name(self, base):
        self.n += 1
        return f"{base}_{self.n}"

    def node(self, op, inputs, prefix, **attrs):
        out = self.name(f"{prefix}/{op}_output")
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{prefix}/{op}_{self.n}",
                                           **attrs))
        return out

    def const(self, prefix, value, dtype=np.float32):
        arr = np.array(value, dtype=dtype)
        out = self.name(f"{prefix}/Constant_output")
        self.nodes.append(helper.make_node("Constant", [], [out], name=f"{prefix}/Constant_{self.n}",
                                           value=numpy_helper.from_array(arr)))
        return out

    def weight(self, name, shape):
        if self.initializers:
            rng = np.random.default_rng(zlib.crc32(name.encode()))
            arr = (rng.standard_normal(shape) * 0.05).astype(np.float32)
            self.inits.append(numpy_helper.from_array(arr, name))
        else:
            self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
        return name


def layer_norm(b, x, p, gamma, beta):
    mean = b.node("ReduceMean", [x], p, axes=[-1])
    sub = b.node("Sub", [x, mean], p)
    pw = b.node("Pow", [sub, b.const(p, 2.0)], p)
    var = b.node("ReduceMean", [pw], p, axes=[-1])
    eps = b.node("Add", [var, b.const(p, 1e-5)], p)
    sd = b.node("Sqrt", [eps], p)
    nrm = b.node("Div", [sub, sd], p)
    return b.node("Add", [b.node("Mul", [nrm, gamma], p), beta], p)


def encoder_layer(b, x, l):
    p = f"/layers.{l}"
    w_in = b.weight(f"layers.{l}.in_proj_weight", [D, 3 * D])
    b_in = b.weight(f"layers.{l}.in_proj_bias", [3 * D])
    w_out = b.weight(f"layers.{l}.out_proj.weight", [D, D])
    b_out = b.weight(f"layers.{l}.out_proj.bias", [D])
    w1 = b.weight(f"layers.{l}.linear1.weight", [D, F])
    b1 = b.weight(f"layers.{l}.linear1.bias", [F])
    w2 = b.weight(f"layers.{l}.linear2.weight", [F, D])
    b2 = b.weight(f"layers.{l}.linear2.bias", [D])
    g1 = b.weight(f"layers.{l}.norm1.weight", [D])
    be1 = b.weight(f"layers.{l}.norm1.bias", [D])
    g2 = b.weight(f"layers.{l}.norm2.weight", [D])
    be2 = b.weight(f"layers.{l}.norm2.bias", [D])

    a = p + "/self_attn"
    xt = b.node("Transpose", [x], a, perm=[1, 0, 2])                 # [S, B, D]
    qkv = b.node("Add", [b_in, b.node("MatMul", [xt, w_in], a)], a)  # [S, B, 3D]
    axis = b.const(a, [-1], np.int64)
    heads = b.const(a, [S, B * H, HD], np.int64)
    parts = []
    for i in range(3):
        sl = b.node("Slice", [qkv, b.const(a, [i * D], np.int64), b.const(a, [(i + 1) * D], np.int64),
                              axis], a)
        parts.append(b.node("Reshape", [sl, heads], a))              # [S, B*H, HD]
    q = b.node("Transpose", [parts[0]], a, perm=[1, 0, 2])           # [B*H, S, HD]
    v = b.node("Transpose", [parts[2]], a, perm=[1, 0, 2])
    q = b.node("Div", [q, b.const(a, float(np.sqrt(HD)))], a)
    kt = b.node("Transpose", [parts[1]], a, perm=[1, 2, 0])          # [B*H, HD, S]
    att = b.node("Softmax", [b.node("MatMul", [q, kt], a)], a, axis=-1)
    ctx = b.node("MatMul", [att, v], a)                              # [B*H, S, HD]
    ctx = b.node("Transpose", [ctx], a, perm=[1, 0, 2])              # [S, B*H, HD]
    ctx = b.node("Reshape", [ctx, b.const(a, [S * B, D], np.int64)], a)
    o = b.node("Gemm", [ctx, w_out, b_out], a, alpha=1.0, beta=1.0, transB=1)
    o = b.node("Reshape", [o, b.const(a, [S, B, D], np.int64)], a)
    o = b.node("Transpose", [o], a, perm=[1, 0, 2])                  # [B, S, D]
    h = layer_norm(b, b.node("Add", [x, o], p), p + "/norm1", g1, be1)

    f = b.node("Add", [b1, b.node("MatMul", [h, w1], p + "/linear1")], p + "/linear1")
    gelu = b.node("Erf", [b.node("Div", [f, b.const(p, float(np.sqrt(2.0)))], p)], p)
    gelu = b.node("Mul", [b.node("Mul", [f, b.node("Add", [gelu, b.const(p, 1.0)], p)], p),
                          b.const(p, 0.5)], p)
    f2 = b.node("Add", [b2, b.node("MatMul", [gelu, w2], p + "/linear2")], p + "/linear2")
    return layer_norm(b, b.node("Add", [h, f2], p), p + "/norm2", g2, be2)


def model(layers, initializers=False):
    b = Builder(initializers)
    x = "input_0"
    xin = helper.make_tensor_value_info(x, TensorProto.FLOAT, [B, S, D])
    for l in range(layers):
        x = encoder_layer(b, x, l)
    out = helper.make_tensor_value_info(x, TensorProto.FLOAT, [B, S, D])
    g = helper.make_graph(b.nodes, f"encoder_{layers}l", [xin] + b.inputs, [out],
                          initializer=b.inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)], producer_name="apollo-bench")
    m.ir_version = 7
    return m


def main():
    args = [a for a in sys.argv[1:] if a != "--initializers"]
    if len(args) != 2:
        sys.exit("usage: scale_graph.py LAYERS OUT.onnx [--initializers]")
    m = model(int(args[0]), "--initializers" in sys.argv[1:])
    onnx.checker.check_model(m)
    onnx.save(m, sys.argv[2])


if __name__ == "__main__":
    main()
