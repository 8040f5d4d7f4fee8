"""fx.py -- PyTorch FX graphs in ATen's core op set (after PyTorch's
standard decompositions, as AOTAutograd hands them to a compiler) into
apollo.Graph.

Shapes and dtypes come from each node's example value (node.meta["val"],
the fake tensors AOTAutograd traced with).  Placeholders become INPUT
tensors, bound by position, or -- those named in `params` -- PARAM tensors
(weights: shape and dtype only on the wire, bound by name at run time).
Constants the graph makes (full, arange, scalar_tensor) travel by value
when small (apollo.CONST_MAX_BYTES) and otherwise become PARAMs whose data
the converter keeps for the runner.  Each ATen op is rewritten into
Apollo's op set (common/ops.def); a Python number operand becomes a scalar
CONST of the computation's dtype; operands of another dtype are Cast first
(ATen's type promotion, read off the node's result dtype).

`unsupported(node)` says, without converting anything, why a node cannot
be converted (None when it can): an op with no rewrite, a dtype Apollo
graphs do not carry (ap_dtype_in_graphs), a
symbolic (dynamic) shape, an argument form the rewrite does not cover.
The backend splits the graph there.  `convert()` raises Unsupported with
the node's name and the reason for anything it still cannot do.
"""
import ctypes
import math
import operator
import struct

import torch

from . import graph as G

aten = torch.ops.aten
prims = torch.ops.prims

TORCH_DTYPES = {torch.float32: G.FLOAT32, torch.float64: G.FLOAT64, torch.int64: G.INT64,
                torch.int32: G.INT32, torch.bool: G.BOOL, torch.uint8: G.UINT8, torch.int8: G.INT8,
                torch.float16: G.FLOAT16, torch.bfloat16: G.BFLOAT16}
FROM_APOLLO = {v: k for k, v in TORCH_DTYPES.items()}
_STRUCT = {G.FLOAT32: "f", G.FLOAT64: "d", G.INT64: "q", G.INT32: "i", G.BOOL: "?", G.UINT8: "B",
           G.INT8: "b", G.FLOAT16: "e", G.BFLOAT16: "f"}


def _bfloat16_bytes(values):
    """bfloat16 little-endian: float32's upper half, rounded to nearest
    even (NaN kept quiet)."""
    out = bytearray()
    for v in values:
        u = struct.unpack("<I", struct.pack("<f", v))[0]
        if (u & 0x7fffffff) > 0x7f800000:
            h = (u >> 16) | 0x40
        else:
            h = (u + 0x7fff + ((u >> 16) & 1)) >> 16
        out += struct.pack("<H", h & 0xffff)
    return bytes(out)


class Unsupported(Exception):
    def __init__(self, node, reason):
        self.node = node
        self.reason = reason
        super().__init__("%s (%s): %s" % (op_name(node), getattr(node, "name", "?"), reason))


def op_name(node):
    t = getattr(node, "target", None)
    return str(t) if t is not None else "?"


def apollo_dtype(dt):
    """The Apollo dtype of torch dtype `dt`, or None when graphs cannot carry it."""
    a = TORCH_DTYPES.get(dt)
    return a if a is not None and G.dtype_supported(a) else None


def _val(x):
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else None


def _static_shape(v):
    try:
        return tuple(int(d) for d in v.shape)
    except (TypeError, ValueError):
        return None


def _vals(node):
    v = _val(node)
    if isinstance(v, (list, tuple)):
        return [x for x in v if isinstance(x, torch.Tensor)]
    return [v] if isinstance(v, torch.Tensor) else []


def _tensor_args(node):
    out = []
    for a in list(node.args) + list(node.kwargs.values()):
        if isinstance(a, torch.fx.Node):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.fx.Node))
    return out


# ---- the rewrites -----------------------------------------------------------

class _Ctx:
    """One conversion: the graph under construction and the FX values it holds."""

    def __init__(self, name):
        self.g = G.Graph(name)
        self.env = {}
        self.folded = {}          # FX node -> its real value, computed here (_fold)
        self.consts = {}          # PARAM name -> torch tensor (constants too large for CONST)
        self.n_const = 0
        self.rng_key = None       # the INPUT holding this call's generator key (_random_words)
        self.rng_used = 0         # counters taken so far by this graph's random ops

    # values
    def t(self, a, dtype=None):
        """The Apollo tensor of FX argument `a` (a Node, or a Python number
        made a scalar CONST of `dtype`), Cast to `dtype` when given."""
        if isinstance(a, torch.fx.Node):
            t = self.value(a)
            if isinstance(t, tuple):
                raise TypeError("a tuple value used as a tensor")
            if isinstance(t, _Unread):
                raise TypeError("a result of a fused attention op that Apollo does not compute")
            return self.cast(t, dtype) if dtype is not None else t
        if isinstance(a, (bool, int, float)):
            return self.scalar(a, dtype if dtype is not None else
                               (G.BOOL if isinstance(a, bool) else G.INT64 if isinstance(a, int) else G.FLOAT32))
        raise TypeError("argument %r is not a tensor or a number" % (a,))

    def value(self, a):
        """The Apollo value (a tensor, or a tuple of them) of FX node `a`;
        a node folded to a constant (_fold) is made one at its first use."""
        t = self.env.get(a)
        if t is None and a in self.folded:
            t = self.env[a] = _materialize(self, a)
        if t is None:
            raise KeyError("no value for %s" % a)
        return t

    def scalar(self, v, dtype):
        return self.const_values([v], dtype, ())

    def const_values(self, values, dtype, shape):
        """A constant of Apollo dtype `dtype` and `shape` holding `values`
        (row-major): CONST when small, else a PARAM whose bytes the
        converter keeps (no torch tensor is made: the compiler may run
        under fake tensors)."""
        fmt = _STRUCT[dtype]
        if fmt in "qibB":
            values = [int(v) for v in values]
        elif fmt == "?":
            values = [bool(v) for v in values]
        else:
            values = [float(v) for v in values]
        if dtype == G.BFLOAT16:
            data = _bfloat16_bytes(values)
        else:
            data = struct.pack("<%d%s" % (len(values), fmt), *values)
        return self.const_bytes(data, dtype, shape)

    def const_bytes(self, data, dtype, shape):
        """A constant of `shape` whose row-major little-endian bytes are
        `data`: CONST when small, else a PARAM whose bytes the converter
        keeps."""
        self.n_const += 1
        name = "const%d" % self.n_const
        if len(data) <= G.CONST_MAX_BYTES:
            return self.g.const(name, dtype, shape, data)
        t = self.g.param(name, dtype, shape)
        self.consts[self.g.tensor(t)[0]] = (data, dtype, tuple(shape))
        return t

    def cast(self, t, dtype):
        if dtype is None or self.g.dtype(t) == dtype:
            return t
        return self.g.node1("Cast", [t], {"to": dtype})

    def shape(self, t):
        return self.g.shape(t)

    def op(self, op, ins, attrs=None, shape=None):
        return self.g.node1(op, ins, attrs, shape=shape)

    def reshape(self, t, shape):
        shape = tuple(int(d) for d in shape)
        if self.shape(t) == shape:
            return t
        return self.op("Reshape", [t], shape=shape)

    def expand(self, t, shape):
        shape = tuple(int(d) for d in shape)
        if self.shape(t) == shape:
            return t
        return self.op("Expand", [t], shape=shape)


def _meta(node):
    v = _val(node)
    return _static_shape(v), apollo_dtype(v.dtype)


def _axes(dims, rank):
    if dims is None:
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % rank if rank else 0 for d in dims})


def _unary(op):
    def f(c, n):
        shape, dt = _meta(n)
        return c.op(op, [c.t(n.args[0], dt)])
    return f


def _binary(op, alpha=False, rsub=False):
    def f(c, n):
        shape, dt = _meta(n)
        a, b = c.t(n.args[0], dt), c.t(n.args[1], dt)
        al = n.kwargs.get("alpha", n.args[2] if len(n.args) > 2 else 1) if alpha else 1
        if al != 1:
            b = c.op("Mul", [b, c.scalar(al, dt)])
        if rsub:
            a, b = b, a
        return c.op(op, [a, b])
    return f


def _promoted(n):
    """The dtype both operands of a comparison are computed in."""
    a, b = n.args[0], n.args[1]
    va, vb = _val(a), _val(b)
    ta = va if isinstance(va, torch.Tensor) else a
    tb = vb if isinstance(vb, torch.Tensor) else b
    return apollo_dtype(torch.result_type(ta, tb))


def _compare(op, negate=False):
    def f(c, n):
        dt = _promoted(n)
        y = c.op(op, [c.t(n.args[0], dt), c.t(n.args[1], dt)])
        return c.op("Not", [y]) if negate else y
    return f


def _compare_swapped(op):
    def f(c, n):
        dt = _promoted(n)
        return c.op(op, [c.t(n.args[1], dt), c.t(n.args[0], dt)])
    return f


def _logic(op):
    def f(c, n):
        return c.op(op, [c.t(n.args[0], G.BOOL), c.t(n.args[1], G.BOOL)])
    return f


def _identity(c, n):
    shape, dt = _meta(n)
    x = c.t(n.args[0], dt)
    return c.op("Identity", [x])


def _to_copy(c, n):
    shape, dt = _meta(n)
    return c.op("Identity", [c.t(n.args[0], dt)])


def _rsqrt(c, n):
    shape, dt = _meta(n)
    return c.op("Reciprocal", [c.op("Sqrt", [c.t(n.args[0], dt)])])


def _expm1(c, n):
    shape, dt = _meta(n)
    return c.op("Sub", [c.op("Exp", [c.t(n.args[0], dt)]), c.scalar(1.0, dt)])


def _log1p(c, n):
    shape, dt = _meta(n)
    return c.op("Log", [c.op("Add", [c.t(n.args[0], dt), c.scalar(1.0, dt)])])


def _gelu(c, n):
    shape, dt = _meta(n)
    return c.op("Gelu", [c.t(n.args[0], dt)], {"approximate": n.kwargs.get("approximate", "none")})


def _silu(c, n):
    shape, dt = _meta(n)
    x = c.t(n.args[0], dt)
    return c.op("Mul", [x, c.op("Sigmoid", [x])])


def _leaky_relu(c, n):
    shape, dt = _meta(n)
    slope = n.args[1] if len(n.args) > 1 else 0.01
    return c.op("LeakyRelu", [c.t(n.args[0], dt)], {"alpha": float(slope)})


def _clamp(c, n):
    shape, dt = _meta(n)
    lo = n.args[1] if len(n.args) > 1 else n.kwargs.get("min")
    hi = n.args[2] if len(n.args) > 2 else n.kwargs.get("max")
    if n.target == aten.clamp_min.default:
        lo, hi = n.args[1], None
    if n.target == aten.clamp_max.default:
        lo, hi = None, n.args[1]
    x = c.t(n.args[0], dt)
    if isinstance(lo, torch.fx.Node) or isinstance(hi, torch.fx.Node):
        if lo is not None:
            x = c.op("Max", [x, c.t(lo, dt)])
        if hi is not None:
            x = c.op("Min", [x, c.t(hi, dt)])
        return x
    return c.op("Clip", [x], {"min": float(lo) if lo is not None else -math.inf,
                              "max": float(hi) if hi is not None else math.inf})


def _hardtanh(c, n):
    shape, dt = _meta(n)
    lo = n.args[1] if len(n.args) > 1 else -1.0
    hi = n.args[2] if len(n.args) > 2 else 1.0
    return c.op("Clip", [c.t(n.args[0], dt)], {"min": float(lo), "max": float(hi)})


def _pow(c, n):
    shape, dt = _meta(n)
    base, e = n.args[0], n.args[1]
    if isinstance(e, (int, float)) and not isinstance(base, (int, float)):
        x = c.t(base, dt)
        if e == 2:
            return c.op("Mul", [x, x])
        if e == 1:
            return c.op("Identity", [x])
        if e == 0.5:
            return c.op("Sqrt", [x])
        if e == -1:
            return c.op("Reciprocal", [x])
        if e == -0.5:
            return c.op("Reciprocal", [c.op("Sqrt", [x])])
    return c.op("Pow", [c.t(base, dt), c.t(e, dt)])


def _div_mode(c, n):
    shape, dt = _meta(n)
    mode = n.kwargs.get("rounding_mode")
    q = c.op("Div", [c.t(n.args[0], dt), c.t(n.args[1], dt)])
    if mode == "floor" and dt in (G.FLOAT32, G.FLOAT64):
        return c.op("Floor", [q])
    if mode is None:
        return q
    raise Unsupported(n, "div with rounding_mode=%r on %s" % (mode, G.DTYPE_NAMES.get(dt)))


def _fmod(fmod):
    def f(c, n):
        shape, dt = _meta(n)
        return c.op("Mod", [c.t(n.args[0], dt), c.t(n.args[1], dt)], {"fmod": fmod})
    return f


def _where(c, n):
    shape, dt = _meta(n)
    return c.op("Where", [c.t(n.args[0], G.BOOL), c.t(n.args[1], dt), c.t(n.args[2], dt)])


def _reduce(op):
    def f(c, n):
        shape, dt = _meta(n)
        x = n.args[0]
        xs = c.shape(c.t(x))
        dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
        keep = n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False)
        if n.target in (aten.sum.default, aten.mean.default, aten.prod.default, aten.amax.default,
                        aten.amin.default) and len(n.args) < 2:
            dims, keep = None, False
        axes = _axes(dims if dims not in ([], ()) else None, len(xs))
        xt = c.t(x, dt)
        if not xs or not axes:
            return c.reshape(c.op("Identity", [xt]), shape)
        return c.reshape(c.op(op, [xt], {"axes": axes, "keepdims": 1 if keep else 0}), shape)
    return f


def _var_mean(c, n):
    """var_mean(x, dims, correction, keepdim): the mean, and the sum of
    squared deviations over (count - correction)."""
    vals = _val(n)
    dt = apollo_dtype(vals[0].dtype)
    x = c.t(n.args[0], dt)
    xs = c.shape(x)
    dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    corr = n.kwargs.get("correction", 1)
    corr = 1 if corr is None else corr
    keep = n.kwargs.get("keepdim", False)
    axes = _axes(dims if dims not in ([], ()) else None, len(xs))
    cnt = 1
    for a in axes:
        cnt *= xs[a]
    mean = c.op("ReduceMean", [x], {"axes": axes, "keepdims": 1})
    d = c.op("Sub", [x, mean])
    ss = c.op("ReduceSum", [c.op("Mul", [d, d])], {"axes": axes, "keepdims": 1})
    var = c.op("Div", [ss, c.scalar(max(cnt - corr, 0), dt)])
    return (c.reshape(var, vals[0].shape), c.reshape(mean, vals[1].shape))


def _any_all(op):
    """any / all over dims (all of them when none are given): the elements
    made BOOL (x != 0), Cast to INT32, ReduceMax (any) or ReduceMin (all),
    Cast back to BOOL."""
    def f(c, n):
        shape, dt = _meta(n)
        x = c.t(n.args[0])
        xs = c.shape(x)
        dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
        keep = n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False)
        if c.g.dtype(x) != G.BOOL:
            x = c.op("Not", [c.op("Equal", [x, c.scalar(0, c.g.dtype(x))])])
        axes = _axes(dims if dims not in ([], ()) else None, len(xs))
        if not xs or not axes:
            return c.reshape(c.op("Identity", [x]), shape)
        y = c.op(op, [c.cast(x, G.INT32)], {"axes": axes, "keepdims": 1 if keep else 0})
        return c.reshape(c.cast(y, G.BOOL), shape)
    return f


def _argext(op):
    def f(c, n):
        shape, dt = _meta(n)
        x = c.t(n.args[0])
        dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
        keep = n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False)
        if dim is None:
            x = c.reshape(x, (int(torch.Size(c.shape(x)).numel()),))
            dim = 0
        r = len(c.shape(x))
        return c.reshape(c.op(op, [x], {"axis": dim % r, "keepdims": 1 if keep else 0}), shape)
    return f


def _max_dim(op, arg):
    def f(c, n):
        vals = _val(n)
        x = c.t(n.args[0])
        r = len(c.shape(x))
        dim = n.args[1] % r
        keep = n.args[2] if len(n.args) > 2 else False
        v = c.op(op, [x], {"axes": [dim], "keepdims": 1 if keep else 0})
        i = c.op(arg, [x], {"axis": dim, "keepdims": 1 if keep else 0})
        return (c.reshape(v, vals[0].shape), c.reshape(i, vals[1].shape))
    return f


def _softmax(op):
    def f(c, n):
        shape, dt = _meta(n)
        x = c.t(n.args[0], dt)
        r = len(c.shape(x))
        if r == 0:
            return c.op("Identity", [c.scalar(0.0 if op == "LogSoftmax" else 1.0, dt)])
        return c.op(op, [x], {"axes": [n.args[1] % r]})
    return f


def _layer_norm(c, n):
    x, nshape, w, b, eps = n.args[:5]
    vals = _val(n)
    dt = apollo_dtype(vals[0].dtype)
    xt = c.t(x, dt)
    r = len(c.shape(xt))
    axis = r - len(nshape)
    scale = c.t(w, dt) if w is not None else c.expand(c.scalar(1.0, dt), nshape)
    ins = [xt, scale] + ([c.t(b, dt)] if b is not None else [])
    outs = c.g.node("LayerNormalization", ins, {"axis": axis, "epsilon": float(eps)}, n_outputs=3)
    return (outs[0], c.cast(outs[1], apollo_dtype(vals[1].dtype)), c.cast(outs[2], apollo_dtype(vals[2].dtype)))


def _mm(c, n):
    shape, dt = _meta(n)
    return c.op("MatMul", [c.t(n.args[0], dt), c.t(n.args[1], dt)])


def _addmm(c, n):
    shape, dt = _meta(n)
    bias, a, b = n.args[:3]
    beta = n.kwargs.get("beta", 1)
    alpha = n.kwargs.get("alpha", 1)
    y = c.op("MatMul", [c.t(a, dt), c.t(b, dt)])
    if alpha != 1:
        y = c.op("Mul", [y, c.scalar(alpha, dt)])
    bt = c.t(bias, dt)
    if beta != 1:
        bt = c.op("Mul", [bt, c.scalar(beta, dt)])
    return c.op("Add", [y, bt]) if beta != 0 else y


def _conv_attrs(n, k, first=3):
    """stride, padding, dilation (args first..first+2), k values each."""
    stride, padding, dilation = [list(n.args[i]) for i in (first, first + 1, first + 2)]
    stride = stride * k if len(stride) == 1 else stride
    padding = padding * k if len(padding) == 1 else padding
    dilation = dilation * k if len(dilation) == 1 else dilation
    return stride, padding, dilation


def _convolution(c, n):
    shape, dt = _meta(n)
    x, w, b = n.args[:3]
    transposed, out_pad, groups = n.args[6], list(n.args[7]), n.args[8]
    xt = c.t(x, dt)
    k = len(c.shape(xt)) - 2
    stride, padding, dilation = _conv_attrs(n, k)
    attrs = {"strides": stride, "pads": padding + padding, "dilations": dilation, "group": int(groups)}
    ins = [xt, c.t(w, dt)] + ([c.t(b, dt)] if b is not None else [])
    if transposed:
        attrs["output_padding"] = (out_pad * k if len(out_pad) == 1 else out_pad) or [0] * k
        return c.op("ConvTranspose", ins, attrs)
    return c.op("Conv", ins, attrs)


def _convolution_backward(c, n):
    """grad_input = ConvTranspose(grad_out, W) sized back to the input;
    grad_weight[m, ch, k] = sum over n, o of grad_out[n, m, o] * x[n, ch,
    o*s - p + k*d]: a Conv of x with channels and batch swapped and grad_out
    as the weight, strides and dilations exchanged, cut to the kernel
    size; grad_bias = ReduceSum of grad_out over all but the channels.
    Grouped (depthwise included): ConvTranspose of as many groups, and x
    as [C/groups, groups * N] so that the Conv's groups pair each group's
    input channels with its output channels."""
    gout, x, w, bias_sizes = n.args[:4]
    groups = int(n.args[9])
    mask = n.args[10]
    vals = _val(n)
    dt = apollo_dtype(_val(x).dtype)
    go, xt, wt = c.t(gout, dt), c.t(x, dt), c.t(w, dt)
    xs, ws, gs = c.shape(xt), c.shape(wt), c.shape(go)
    k = len(xs) - 2
    stride, padding, dilation = _conv_attrs(n, k, 4)
    res = [None, None, None]
    if mask[0]:
        opad = [xs[2 + i] - ((gs[2 + i] - 1) * stride[i] + (ws[2 + i] - 1) * dilation[i] + 1 - 2 * padding[i])
                for i in range(k)]
        res[0] = c.op("ConvTranspose", [go, wt], {"strides": stride, "pads": padding + padding,
                                                  "dilations": dilation, "group": groups,
                                                  "output_padding": opad})
    if mask[1]:
        perm = [1, 0] + list(range(2, 2 + k))
        if groups == 1:
            xsw = c.op("Transpose", [xt], {"perm": perm})
        else:
            # x[n, g*Cg + c'] as [c', (g, n)]: a Conv of `groups` groups
            # then pairs group g's input channels with its grad_out channels
            cg = xs[1] // groups
            xr = c.reshape(xt, (xs[0], groups, cg) + tuple(xs[2:]))
            xr = c.op("Transpose", [xr], {"perm": [2, 1, 0] + list(range(3, 3 + k))})
            xsw = c.reshape(xr, (cg, groups * xs[0]) + tuple(xs[2:]))
        gsw = c.op("Transpose", [go], {"perm": perm})
        ends = []
        for i in range(k):
            span = xs[2 + i] + 2 * padding[i] - ((gs[2 + i] - 1) * stride[i] + 1)
            full = span // dilation[i] + 1
            ends.append(padding[i] - (full - ws[2 + i]) * dilation[i] if full > ws[2 + i] else padding[i])
        gw = c.op("Conv", [xsw, gsw], {"strides": dilation, "pads": padding + ends, "dilations": stride,
                                       "group": groups})
        kshape = c.shape(gw)
        if tuple(kshape[2:]) != tuple(ws[2:]):
            gw = c.op("Slice", [gw], {"starts": [0] * (k + 2), "steps": [1] * (k + 2)},
                      shape=tuple(kshape[:2]) + tuple(ws[2:]))
        res[1] = c.op("Transpose", [gw], {"perm": perm})
    if mask[2]:
        res[2] = c.op("ReduceSum", [go], {"axes": [0] + list(range(2, 2 + k)), "keepdims": 0})
    for i in range(3):
        if res[i] is not None and tuple(c.shape(res[i])) != tuple(vals[i].shape):
            res[i] = c.reshape(res[i], vals[i].shape)
    return tuple(res)


def _avg_pool(c, n):
    shape, dt = _meta(n)
    x = c.t(n.args[0], dt)
    k = len(c.shape(x)) - 2
    ks = list(n.args[1])
    ks = ks * k if len(ks) == 1 else ks
    st = list(n.args[2]) if len(n.args) > 2 and n.args[2] else ks
    st = st * k if len(st) == 1 else st
    pad = list(n.args[3]) if len(n.args) > 3 else [0]
    pad = pad * k if len(pad) == 1 else pad
    ceil = n.args[4] if len(n.args) > 4 else False
    incl = n.args[5] if len(n.args) > 5 else True
    return c.op("AveragePool", [x], {"kernel_shape": ks, "strides": st, "pads": pad + pad,
                                     "dilations": [1] * k, "ceil_mode": int(bool(ceil)),
                                     "count_include_pad": int(bool(incl))})


def _pool_attrs(n, k, first=1):
    """kernel, stride, padding, dilation, ceil_mode of a max_pool*
    (args first..first+4), k values each."""
    def spread(v, default):
        v = list(v) if v else default
        return v * k if len(v) == 1 else v
    args = list(n.args) + [None] * 6
    ks = spread(args[first], None)
    st = spread(args[first + 1], ks)
    pad = spread(args[first + 2], [0])
    dil = spread(args[first + 3], [1])
    return ks, st, pad, dil, bool(args[first + 4])


# ---- attention ------------------------------------------------------------------
#
# F.scaled_dot_product_attention reaches AOTAutograd's graphs as the fused
# op PyTorch's dispatcher picked for the device, with its backward: on CPU
# _scaled_dot_product_flash_attention_for_cpu; on CUDA the flash,
# memory-efficient or cuDNN kernel's op (PyTorch's sdp_utils choose by
# dtype, head size, mask and GPU).  A pre-dispatch graph
# (make_fx(pre_dispatch=True), torch.export's training IR) keeps
# scaled_dot_product_attention itself.  Each forward becomes Apollo's
# Attention and each backward AttentionGrad; their arguments are read by
# name off the op's schema (_sdpa_named), so the forms differ only in
# where the log-sum-exp lives and what else they return.  That else -- the
# Philox seed and offset of the kernel's dropout (uint64 on CUDA's flash),
# cum_seq_q / cum_seq_k (None for dense inputs), max_q / max_k (numbers),
# the empty debug mask -- is no value of the Apollo graph: nothing reads it
# without dropout, which is refused (_Unread).

_SDPA_FORWARD = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: "cpu",
    aten._scaled_dot_product_flash_attention.default: "flash",
    aten._scaled_dot_product_efficient_attention.default: "efficient",
    aten._scaled_dot_product_cudnn_attention.default: "cudnn",
    aten.scaled_dot_product_attention.default: "sdpa",
}
_SDPA_BACKWARD = {
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: "cpu",
    aten._scaled_dot_product_flash_attention_backward.default: "flash",
    aten._scaled_dot_product_efficient_attention_backward.default: "efficient",
    aten._scaled_dot_product_cudnn_attention_backward.default: "cudnn",
}
# the arguments the rewrites read (by schema name); the others -- philox_seed,
# philox_offset, cum_seq_q, cum_seq_k, max_q, max_k, the flags -- are not
# inputs of the Apollo graph
_SDPA_READ = ("grad_out", "grad_out_", "query", "key", "value", "out", "logsumexp", "attn_mask", "attn_bias")


class _Unread:
    """A result of a fused attention op that the Apollo graph does not
    compute: the Philox seed and offset (rng_state, unused), an empty
    debug mask, the [B, H, 0] log-sum-exp of a memory-efficient forward
    asked for none.  Eager's kernels allocate these without writing them
    when there is no dropout; a graph that returns one returns an empty
    tensor of `shape` and `dtype` made at the call (Converted.outputs'
    ("empty", shape, dtype)), and an op that reads one is refused."""

    def __init__(self, v):
        self.shape = tuple(int(d) for d in v.shape)
        self.dtype = v.dtype


def _sdpa_named(n):
    """{argument name: value} of attention op n by its schema, defaults
    filled in (a tensor argument left out or passed as None is None)."""
    out = {}
    for i, a in enumerate(n.target._schema.arguments):
        if i < len(n.args) and not a.kwarg_only:
            out[a.name] = n.args[i]
        elif a.name in n.kwargs:
            out[a.name] = n.kwargs[a.name]
        else:
            out[a.name] = a.default_value if a.has_default_value() else None
    return out


def _sdpa_read(n):
    """The FX nodes attention op n's rewrite reads (_SDPA_READ)."""
    a = _sdpa_named(n)
    return [a[k] for k in _SDPA_READ if isinstance(a.get(k), torch.fx.Node)]


def _sdpa_values(n):
    """The example values of attention op n that its rewrite reads or
    makes, which unsupported() checks: the arguments it reads, a
    forward's output and log-sum-exp, a backward's gradients."""
    v = _val(n)
    outs = list(v) if isinstance(v, (list, tuple)) else [v]
    if n.target in _SDPA_FORWARD:
        outs = outs[:2]
    return [x for x in outs if isinstance(x, torch.Tensor)] + [_val(a) for a in _sdpa_read(n)]


def _sdpa_why(n):
    """Why attention op n (forward or backward) cannot be converted, or None."""
    a = _sdpa_named(n)
    p = a.get("dropout_p") or 0.0
    if not isinstance(p, (int, float)) or p:
        return ("scaled_dot_product_attention with dropout_p=%s (no dropout inside the attention kernel)"
                % ("%g" % p if isinstance(p, (int, float)) else p))
    if a.get("return_debug_mask"):
        return "%s with return_debug_mask (the attention probabilities are not kept)" % op_name(n)
    if any(isinstance(a.get(k), torch.fx.Node) for k in ("cum_seq_q", "cum_seq_k")):
        return "variable-length (nested tensor) attention"
    q, k = _static_shape(_val(a["query"])), _static_shape(_val(a["key"]))
    if q is None or k is None:
        return None       # unsupported() names the dynamic shape
    if len(q) < 3:
        return "attention of rank-%d tensors (Attention takes rank 3 and more)" % len(q)
    form = _SDPA_FORWARD.get(n.target) or _SDPA_BACKWARD.get(n.target)
    if form == "flash" and a.get("is_causal") and q[-2] != k[-2]:
        return ("flash attention with is_causal and L %d != S %d (the flash kernel aligns the causal mask "
                "bottom-right, Apollo's Attention top-left)" % (q[-2], k[-2]))
    return None


def refused_attention(gm):
    """Why a forward attention op of GraphModule `gm` cannot be converted
    ("op (node): reason", _sdpa_why: dropout_p > 0 ...), or None."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in _SDPA_FORWARD:
            why = _sdpa_why(n)
            if why:
                return "%s (%s): %s" % (op_name(n), n.name, why)
    return None


def _sdpa_attrs(c, a, dt):
    """scale, is_causal and the mask of the attention arguments `a`
    (_sdpa_named): the mask None, BOOL (true = attend) or additive in the
    computation's dtype `dt`; the scale 1/sqrt(E) unless given."""
    scale = a.get("scale")
    if scale is None:
        scale = 1.0 / math.sqrt(_static_shape(_val(a["query"]))[-1])
    mask = a.get("attn_mask", a.get("attn_bias"))
    if mask is not None:
        mask = c.t(mask, G.BOOL if _val(mask).dtype == torch.bool else dt)
    return float(scale), int(bool(a.get("is_causal"))), mask


def _sdpa_lse_out(c, lse, v):
    """Attention's log-sum-exp [b..., H, L] as the forward op returns it
    (example value v): in v's dtype; [B, H, L, 1] for cuDNN; [B, H, L
    rounded up to 32] for memory-efficient attention on CUDA, the rows
    past L +inf as its kernel writes them; an _Unread when v is empty (a
    memory-efficient forward with compute_log_sumexp=False)."""
    shape = _static_shape(v)
    if not math.prod(shape):
        return _Unread(v)
    lse = c.cast(lse, apollo_dtype(v.dtype))
    have = c.shape(lse)
    if len(shape) == len(have) and shape[-1] > have[-1]:
        r = len(shape)
        return c.op("Pad", [lse], {"pads": [0] * r + [0] * (r - 1) + [shape[-1] - have[-1]],
                                   "mode": "constant", "value": math.inf})
    return c.reshape(lse, shape)


def _sdpa_lse_in(c, a, dt):
    """The log-sum-exp a backward op is handed (arguments `a`) as
    AttentionGrad reads it: [b..., H, L] in the accumulation type `dt`,
    memory-efficient attention's padded rows cut off, cuDNN's trailing 1
    dropped."""
    t = c.t(a["logsumexp"], dt)
    want = _static_shape(_val(a["query"]))[:-1]
    s = tuple(c.shape(t))
    if s[:len(want)] == want and all(d == 1 for d in s[len(want):]):
        return c.reshape(t, want)
    if len(s) == len(want) and s[:-1] == want[:-1] and s[-1] > want[-1]:
        return c.op("Slice", [t], {"starts": [0] * len(s), "steps": [1] * len(s)}, shape=want)
    raise ValueError("a log-sum-exp of shape %s for queries of %s" % (list(s), list(want)))


def _sdpa(c, n):
    """The forward attention ops (_SDPA_FORWARD: q [b..., H, L, E], k [b...,
    Hk, S, E], v [b..., Hk, S, Ev], Hk dividing H; a mask or attn_bias
    broadcast to [b..., H, L, S]) -> Apollo's Attention: the output, and
    for the fused ops the log-sum-exp (the backward's saved state, O(L),
    no L x S probabilities) as the op lays it out (_sdpa_lse_out), their
    other tensors _Unread and their numbers as they are."""
    a = _sdpa_named(n)
    v = _val(n)
    outs = list(v) if isinstance(v, (list, tuple)) else [v]
    dt = apollo_dtype(outs[0].dtype)
    scale, causal, mask = _sdpa_attrs(c, a, dt)
    ins = [c.t(a[k], dt) for k in ("query", "key", "value")] + ([mask] if mask is not None else [])
    # (Attention's safe_softmax default: a row whose scores are all masked
    # gives 0, as PyTorch's attention does -- its _safe_softmax; and
    # fp32_scores: the scores and the softmax in float32 for 16-bit
    # tensors, P rounded for P V, as PyTorch's fused kernels compute)
    made = c.g.node("Attention", ins, {"scale": scale, "is_causal": causal, "fp32_scores": 1},
                    n_outputs=len(outs[:2]))
    if len(outs) == 1:
        return made[0]
    rest = [_Unread(x) if isinstance(x, torch.Tensor) else x for x in outs[2:]]
    return (made[0], _sdpa_lse_out(c, made[1], outs[1])) + tuple(rest)


def _repeat_heads(c, t, g):
    """t [b..., Hk, S, E] with each head repeated g times: [b..., Hk*g, S,
    E], whose head h is t's head h // g (grouped-query attention)."""
    s = tuple(c.shape(t))
    t = c.expand(c.reshape(t, s[:-2] + (1,) + s[-2:]), s[:-2] + (g,) + s[-2:])
    return c.reshape(t, s[:-3] + (s[-3] * g,) + s[-2:])


def _sdpa_bias_grad(c, ins, scale, causal, want):
    """The gradient of memory-efficient attention's attn_bias, which
    AttentionGrad does not make.  `ins`: dY, Q, K, V, Y, LSE, bias as
    AttentionGrad takes them; `want`: the example value of the gradient.
    dBias = P * (dY V^T - rowsum(dY * Y)), P = exp(scale Q K^T + bias -
    LSE), zero above the diagonal when causal: [b..., H, L, S], no larger
    than the bias PyTorch hands the op (expanded to that shape), summed
    over the axes the bias broadcasts along; computed in the log-sum-exp's
    type (the accumulation type), then want's dtype."""
    acc = c.g.dtype(ins[5])
    dy, q, k, v, y, lse, bias = [c.cast(t, acc) for t in ins]
    r = len(c.shape(q))
    g = c.shape(q)[-3] // c.shape(k)[-3]
    if g > 1:
        k, v = _repeat_heads(c, k, g), _repeat_heads(c, v, g)
    perm = list(range(r - 2)) + [r - 1, r - 2]
    s = c.op("Mul", [c.op("MatMul", [q, c.op("Transpose", [k], {"perm": perm})]), c.scalar(scale, acc)])
    s = c.op("Sub", [c.op("Add", [s, bias]), c.reshape(lse, tuple(c.shape(lse)) + (1,))])
    p = c.op("Exp", [s])
    if causal:
        p = c.op("Trilu", [p], {"upper": 0, "k": 0})
    dp = c.op("MatMul", [dy, c.op("Transpose", [v], {"perm": perm})])
    rows = c.op("ReduceSum", [c.op("Mul", [dy, y])], {"axes": [r - 1], "keepdims": 1})
    ds = c.op("Mul", [p, c.op("Sub", [dp, rows])])
    shape = _static_shape(want)
    full = c.shape(ds)
    padded = (1,) * (len(full) - len(shape)) + tuple(shape)
    axes = [i for i in range(len(full)) if padded[i] == 1 and full[i] != 1]
    if axes:
        ds = c.op("ReduceSum", [ds], {"axes": axes, "keepdims": 1})
    return c.cast(c.reshape(ds, shape), apollo_dtype(want.dtype))


def _sdpa_backward(c, n):
    """The backward attention ops (_SDPA_BACKWARD: grad_out, q, k, v, out,
    logsumexp in the forward's layout, the mask or attn_bias) -> Apollo's
    AttentionGrad (one kernel recomputing P from Q, K and the log-sum-exp):
    dq, dk, dv; memory-efficient attention's fourth result, the gradient
    of attn_bias, when it is asked for (_sdpa_bias_grad), else None."""
    a = _sdpa_named(n)
    v = _val(n)
    dt = apollo_dtype(v[0].dtype)
    acc = G.FLOAT32 if dt in (G.FLOAT16, G.BFLOAT16) else dt
    scale, causal, mask = _sdpa_attrs(c, a, dt)
    ins = [c.t(a[k], dt) for k in ("grad_out" if "grad_out" in a else "grad_out_", "query", "key", "value", "out")]
    ins.append(_sdpa_lse_in(c, a, acc))
    if mask is not None:
        ins.append(mask)
    outs = tuple(c.g.node("AttentionGrad", ins, {"scale": scale, "is_causal": causal}, n_outputs=3))
    if len(v) < 4:
        return outs
    if not isinstance(v[3], torch.Tensor):
        return outs + (None,)
    return outs + (_sdpa_bias_grad(c, ins, scale, causal, v[3]),)


def _indices_used(n):
    return any(u.target == operator.getitem and u.args[1] == 1 and u.users for u in n.users)


def _max_pool(c, n):
    """max_pool2d_with_indices: the values by MaxPool; the indices (when
    used: by the backward) as PyTorch numbers them, each window's first
    largest element as an offset into its (n, c) plane of the input:
    the input padded with -inf, one strided Slice per kernel offset,
    stacked on a new axis, ArgMax over it (the first of equal values, as
    ATen's CPU kernel takes), and the chosen offset's position in the
    plane added to the window's origin."""
    vals = _val(n)
    dt = apollo_dtype(vals[0].dtype)
    x = c.t(n.args[0], dt)
    xs = c.shape(x)
    k = len(xs) - 2
    ks, st, pad, dil, ceil = _pool_attrs(n, k)
    y = c.op("MaxPool", [x], {"kernel_shape": ks, "strides": st, "pads": pad + pad, "dilations": dil,
                              "ceil_mode": int(ceil)})
    if not _indices_used(n):
        return (y, None)
    lead = len(xs) - k
    os_ = [int(d) for d in vals[0].shape[lead:]]
    ends = [max(0, (os_[i] - 1) * st[i] + (ks[i] - 1) * dil[i] + 1 - pad[i] - xs[lead + i]) for i in range(k)]
    xp = c.op("Pad", [x], {"pads": [0] * lead + pad + [0] * lead + ends, "mode": "constant",
                           "value": -math.inf})
    plane = [int(d) for d in xs[lead:]]
    strides = [int(math.prod(plane[i + 1:])) for i in range(k)]
    taps, offsets = [], []
    for kk in range(int(math.prod(ks))):
        pos, rest = [], kk
        for i in reversed(range(k)):
            pos.insert(0, rest % ks[i])
            rest //= ks[i]
        part = c.op("Slice", [xp], {"starts": [0] * lead + [pos[i] * dil[i] for i in range(k)],
                                    "steps": [1] * lead + st}, shape=tuple(xs[:lead]) + tuple(os_))
        taps.append(c.reshape(part, tuple(xs[:lead]) + (1,) + tuple(os_)))
        offsets.append(sum(pos[i] * dil[i] * strides[i] for i in range(k)))
    stack = c.op("Concat", taps, {"axis": lead}) if len(taps) > 1 else taps[0]
    arg = c.op("ArgMax", [stack], {"axis": lead, "keepdims": 0, "select_last_index": 0})
    idx = c.op("Gather", [c.const_values(offsets, G.INT64, (len(offsets),)), arg], {"axis": 0})
    for i in range(k):
        origin = [(o * st[i] - pad[i]) * strides[i] for o in range(os_[i])]
        shape = tuple(os_[i] if j == i else 1 for j in range(k))
        idx = c.op("Add", [idx, c.const_values(origin, G.INT64, shape)])
    return (y, c.cast(idx, apollo_dtype(vals[1].dtype)))


def _max_pool_backward(c, n):
    """max_pool2d_with_indices_backward(grad_out, x, ..., indices): each
    gradient added at the input element its window took (ScatterElements
    with reduction add over the flattened planes)."""
    shape, dt = _meta(n)
    go = c.t(n.args[0], dt)
    idx = c.cast(c.t(n.args[7]), G.INT64)
    gs = c.shape(go)
    k = len(shape) - 2
    lead = len(shape) - k
    flat_out = tuple(gs[:lead]) + (int(math.prod(gs[lead:])),)
    flat_in = tuple(shape[:lead]) + (int(math.prod(shape[lead:])),)
    zero = c.expand(c.scalar(0.0, dt), flat_in)
    y = c.op("ScatterElements", [zero, c.reshape(idx, flat_out), c.reshape(go, flat_out)],
             {"axis": lead, "reduction": "add"})
    return c.reshape(y, shape)


def _view(c, n):
    shape, dt = _meta(n)
    return c.reshape(c.t(n.args[0]), shape)


def _permute(c, n):
    x = c.t(n.args[0])
    r = len(c.shape(x))
    perm = [p % r for p in n.args[1]]
    if perm == list(range(r)):
        return c.op("Identity", [x])
    return c.op("Transpose", [x], {"perm": perm})


def _t(c, n):
    x = c.t(n.args[0])
    if len(c.shape(x)) < 2:
        return c.op("Identity", [x])
    return c.op("Transpose", [x], {"perm": [1, 0]})


def _transpose(c, n):
    x = c.t(n.args[0])
    r = len(c.shape(x))
    a, b = n.args[1] % r, n.args[2] % r
    perm = list(range(r))
    perm[a], perm[b] = perm[b], perm[a]
    return c.op("Transpose", [x], {"perm": perm}) if a != b else c.op("Identity", [x])


def _expand(c, n):
    shape, dt = _meta(n)
    x = c.t(n.args[0])
    return c.expand(x, shape) if tuple(c.shape(x)) != shape else c.op("Identity", [x])


def _slice(c, n):
    shape, dt = _meta(n)
    x = c.t(n.args[0])
    xs = c.shape(x)
    r = len(xs)
    dim = (n.args[1] if len(n.args) > 1 else 0) % r
    start = n.args[2] if len(n.args) > 2 else None
    step = n.args[4] if len(n.args) > 4 else 1
    start = 0 if start is None else start
    if start < 0:
        start += xs[dim]
    start = min(max(start, 0), xs[dim])
    starts = [0] * r
    steps = [1] * r
    starts[dim] = start if shape[dim] else 0
    steps[dim] = step
    if tuple(shape) == tuple(xs):
        return c.op("Identity", [x])
    return c.op("Slice", [x], {"starts": starts, "steps": steps}, shape=shape)


def _select(c, n):
    shape, dt = _meta(n)
    x = c.t(n.args[0])
    xs = c.shape(x)
    dim = n.args[1] % len(xs)
    idx = n.args[2] % xs[dim]
    starts = [0] * len(xs)
    starts[dim] = idx
    part = list(xs)
    part[dim] = 1
    y = c.op("Slice", [x], {"starts": starts, "steps": [1] * len(xs)}, shape=tuple(part))
    return c.reshape(y, shape)


def _cat(c, n):
    shape, dt = _meta(n)
    ts = [c.t(a, dt) for a in n.args[0] if int(torch.Size(_static_shape(_val(a))).numel()) > 0
          or len(_static_shape(_val(a))) == len(shape)]
    dim = (n.args[1] if len(n.args) > 1 else 0) % len(shape)
    ts = [t for t in ts if len(c.shape(t)) == len(shape)]
    if len(ts) == 1:
        return c.op("Identity", ts)
    return c.op("Concat", ts, {"axis": dim})


def _split(c, n):
    vals = _val(n)
    x = c.t(n.args[0])
    xs = c.shape(x)
    dim = (n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)) % len(xs)
    shapes = [tuple(int(d) for d in v.shape) for v in vals]
    if len(shapes) == 1:
        return (c.op("Identity", [x]),)
    return tuple(c.g.node("Split", [x], {"axis": dim}, n_outputs=len(shapes), shapes=shapes))


def _embedding(c, n):
    w, idx = n.args[0], n.args[1]
    return c.op("Gather", [c.t(w), c.t(idx)], {"axis": 0})


def _index_select(c, n):
    x = c.t(n.args[0])
    dim = n.args[1] % len(c.shape(x))
    return c.op("Gather", [x, c.t(n.args[2])], {"axis": dim})


def _wrapped(c, it, size):
    """Index tensor `it` as INT64 with negative indices wrapped (+ size)."""
    it = c.cast(it, G.INT64)
    neg = c.op("Less", [it, c.scalar(0, G.INT64)])
    return c.op("Where", [neg, c.op("Add", [it, c.scalar(int(size), G.INT64)]), it])


def _advanced(c, n, x):
    """Advanced indexing's layout: the index tensors of n.args[1] (None:
    a whole dim), x transposed so that the indexed dims are adjacent (to
    the front when they are not adjacent already, as ATen puts their
    result dims), and the row-major linear index over the indexed dims,
    broadcast to the index tensors' common shape.  Returns (x, perm or
    None, first indexed dim, indexed dims' sizes, linear index,
    broadcast shape)."""
    idxs = list(n.args[1])
    pos = [i for i, a in enumerate(idxs) if a is not None]
    its = [c.t(idxs[i]) for i in pos]
    if any(c.g.dtype(t) == G.BOOL for t in its):
        raise Unsupported(n, "indexing with a boolean mask (a data-dependent shape)")
    xs = list(c.shape(x))
    perm = None
    if pos != list(range(pos[0], pos[0] + len(pos))):
        perm = pos + [d for d in range(len(xs)) if d not in pos]
        x = c.op("Transpose", [x], {"perm": perm})
        xs = [xs[p] for p in perm]
        pos = list(range(len(pos)))
    sizes = [xs[p] for p in pos]
    bshape = tuple(torch.broadcast_shapes(*[tuple(c.shape(t)) for t in its]))
    lin, stride = None, 1
    for j in reversed(range(len(pos))):
        term = _wrapped(c, its[j], sizes[j])
        if stride != 1:
            term = c.op("Mul", [term, c.scalar(stride, G.INT64)])
        lin = term if lin is None else c.op("Add", [lin, term])
        stride *= sizes[j]
    return x, perm, pos[0], sizes, c.expand(lin, bshape), bshape


def _index(c, n):
    """x[..., idx, ...]: one index tensor is a Gather on its dim; several
    (broadcast together) a Gather of their row-major linear index over
    the indexed dims made one."""
    shape, dt = _meta(n)
    x = c.t(n.args[0])
    idxs = n.args[1]
    pos = [i for i, a in enumerate(idxs) if a is not None]
    if len(pos) == 1:
        it = c.t(idxs[pos[0]])
        if c.g.dtype(it) == G.BOOL:
            raise Unsupported(n, "indexing with a boolean mask (a data-dependent shape)")
        return c.op("Gather", [x, it], {"axis": pos[0]})
    x, _, p0, sizes, lin, _ = _advanced(c, n, x)
    xs = c.shape(x)
    k = len(sizes)
    flat = c.reshape(x, tuple(xs[:p0]) + (int(math.prod(sizes)),) + tuple(xs[p0 + k:]))
    return c.reshape(c.op("Gather", [flat, lin], {"axis": p0}), shape)


def _gather(c, n):
    x = c.t(n.args[0])
    return c.op("GatherElements", [x, c.t(n.args[2])], {"axis": n.args[1] % len(c.shape(x))})


def _scatter(reduction):
    def f(c, n):
        shape, dt = _meta(n)
        x = c.t(n.args[0], dt)
        dim = n.args[1] % len(c.shape(x))
        idx = c.t(n.args[2])
        src = n.args[3]
        ishape = c.shape(idx)
        if isinstance(src, torch.fx.Node):
            u = c.t(src, dt)
            if tuple(c.shape(u)) != tuple(ishape):
                u = c.op("Slice", [u], {"starts": [0] * len(ishape), "steps": [1] * len(ishape)},
                         shape=ishape)
        else:
            u = c.expand(c.scalar(src, dt), ishape)
        red = n.kwargs.get("reduce", reduction)
        red = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min", "multiply": "mul"}.get(red, red)
        return c.op("ScatterElements", [x, idx, u], {"axis": dim, "reduction": red})
    return f


def _index_put(c, n):
    """x[indices] = values (accumulate: +=).  One index tensor on dim 0: a
    ScatterND; any other: ScatterElements over the indexed dims made one
    (the linear index as for _index), values broadcast to x[indices]'s
    shape, x transposed back when the indexed dims were brought together."""
    shape, dt = _meta(n)
    x = c.t(n.args[0], dt)
    idxs = n.args[1]
    acc = n.args[3] if len(n.args) > 3 else n.kwargs.get("accumulate", False)
    red = "add" if acc else "none"
    pos = [i for i, a in enumerate(idxs) if a is not None]
    if pos == [0]:
        it = c.t(idxs[0])
        if c.g.dtype(it) == G.BOOL:
            raise Unsupported(n, "index_put with a boolean mask")
        ishape = tuple(c.shape(it))
        xs = c.shape(x)
        it = c.reshape(c.cast(it, G.INT64), ishape + (1,))
        u = c.expand(c.t(n.args[2], dt), ishape + tuple(xs[1:]))
        return c.op("ScatterND", [x, it, u], {"reduction": red})
    xt, perm, p0, sizes, lin, bshape = _advanced(c, n, x)
    xs = tuple(c.shape(xt))
    k = len(sizes)
    before, after = xs[:p0], xs[p0 + k:]
    nb = int(math.prod(bshape))
    u = c.expand(c.t(n.args[2], dt), before + bshape + after)
    u = c.reshape(u, before + (nb,) + after)
    lin = c.reshape(lin, (1,) * len(before) + (nb,) + (1,) * len(after))
    lin = c.expand(lin, before + (nb,) + after)
    flat = c.reshape(xt, before + (int(math.prod(sizes)),) + after)
    y = c.reshape(c.op("ScatterElements", [flat, lin, u], {"axis": p0, "reduction": red}), xs)
    if perm is not None:
        inv = [perm.index(d) for d in range(len(perm))]
        y = c.op("Transpose", [y], {"perm": inv})
    return y


def _slice_bounds(n, size, start_i, end_i, step_i):
    args = list(n.args) + [None] * 6
    start = args[start_i] if args[start_i] is not None else 0
    end = args[end_i] if args[end_i] is not None else size
    step = args[step_i] if args[step_i] is not None else 1
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    return min(max(start, 0), size), min(max(end, 0), size), step


def _slice_scatter(c, n):
    """slice_scatter(x, src, dim, start, end, step): x with x[start:end:step]
    on dim replaced by src -- a Concat of x's part before, src and x's part
    after when step is 1, else a ScatterElements of src at constant
    indices.  select_scatter(x, src, dim, index) is the slice index:index+1
    of src made that one index wide."""
    shape, dt = _meta(n)
    x = c.t(n.args[0], dt)
    src = c.t(n.args[1], dt)
    r = len(shape)
    dim = (n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)) % r
    if n.target == aten.select_scatter.default:
        i = n.args[3] % shape[dim]
        start, end, step = i, i + 1, 1
        src = c.reshape(src, tuple(shape[:dim]) + (1,) + tuple(shape[dim + 1:]))
    else:
        start, end, step = _slice_bounds(n, shape[dim], 3, 4, 5)
    ss = tuple(c.shape(src))
    cnt = ss[dim]
    if cnt == 0:
        return c.op("Identity", [x])
    if step == 1:
        parts = []

        def piece(lo, hi):
            starts = [0] * r
            starts[dim] = lo
            part = list(shape)
            part[dim] = hi - lo
            return c.op("Slice", [x], {"starts": starts, "steps": [1] * r}, shape=tuple(part))
        if start > 0:
            parts.append(piece(0, start))
        parts.append(src)
        if start + cnt < shape[dim]:
            parts.append(piece(start + cnt, shape[dim]))
        return c.op("Concat", parts, {"axis": dim}) if len(parts) > 1 else c.op("Identity", parts)
    at = c.const_values([start + i * step for i in range(cnt)], G.INT64,
                        tuple(cnt if d == dim else 1 for d in range(r)))
    return c.op("ScatterElements", [x, c.expand(at, ss), src], {"axis": dim, "reduction": "none"})


def _constant_pad(c, n):
    shape, dt = _meta(n)
    x = c.t(n.args[0], dt)
    r = len(c.shape(x))
    pad = list(n.args[1])
    value = n.args[2] if len(n.args) > 2 else 0
    begins, ends = [0] * r, [0] * r
    for i in range(len(pad) // 2):
        d = r - 1 - i
        begins[d], ends[d] = pad[2 * i], pad[2 * i + 1]
    return c.op("Pad", [x], {"pads": begins + ends, "mode": "constant", "value": float(value)})


def _trilu(upper):
    def f(c, n):
        k = n.args[1] if len(n.args) > 1 else n.kwargs.get("diagonal", 0)
        return c.op("Trilu", [c.t(n.args[0])], {"upper": int(upper), "k": int(k)})
    return f


def _cumsum(c, n):
    shape, dt = _meta(n)
    x = c.t(n.args[0], dt)
    return c.op("CumSum", [x], {"axis": n.args[1] % max(1, len(c.shape(x))), "exclusive": 0, "reverse": 0})


def _repeat(c, n):
    shape, dt = _meta(n)
    x = c.t(n.args[0])
    reps = list(n.args[1])
    xs = c.shape(x)
    x = c.reshape(x, (1,) * (len(reps) - len(xs)) + tuple(xs))
    return c.op("Tile", [x], shape=shape)


def _flip(c, n):
    shape, dt = _meta(n)
    x = c.t(n.args[0])
    r = len(shape)
    starts, steps = [0] * r, [1] * r
    for d in n.args[1]:
        d %= r
        starts[d], steps[d] = shape[d] - 1, -1
    return c.op("Slice", [x], {"starts": starts, "steps": steps}, shape=shape)


def _full(c, n):
    shape, dt = _meta(n)
    value = n.args[1] if n.target in (aten.full.default, aten.full_like.default) else \
        (1 if n.target in (aten.ones.default, aten.ones_like.default) else 0)
    return c.expand(c.scalar(value, dt), shape) if shape else c.op("Identity", [c.scalar(value, dt)])


def _scalar_tensor(c, n):
    shape, dt = _meta(n)
    return c.op("Identity", [c.scalar(n.args[0], dt)])


def _arange(c, n):
    shape, dt = _meta(n)
    args = list(n.args)
    if n.target == aten.arange.default:
        start, end, step = 0, args[0], 1
    elif n.target == aten.arange.start:
        start, end, step = args[0], args[1], 1
    else:
        start, end, step = args[0], args[1], args[2] if len(args) > 2 else 1
    vals = [start + i * step for i in range(shape[0])]
    return c.op("Identity", [c.const_values(vals, dt, shape)])


def _copy(c, n):
    shape, dt = _meta(n)
    return c.expand(c.t(n.args[1], dt), shape) if tuple(c.shape(c.t(n.args[1]))) != shape else \
        c.op("Identity", [c.t(n.args[1], dt)])


def _fill(c, n):
    shape, dt = _meta(n)
    v = n.args[1]
    return c.expand(c.t(v, dt), shape) if shape else c.op("Identity", [c.t(v, dt)])


def _masked_fill(c, n):
    shape, dt = _meta(n)
    return c.op("Where", [c.t(n.args[1], G.BOOL), c.t(n.args[2], dt), c.t(n.args[0], dt)])


def _memory_order(v):
    """The permutation that puts the dims of example value `v` in its
    memory order (largest stride first; where a size-1 dim goes does not
    matter), or None when `v` is not dense (its elements do not fill
    [storage_offset, storage_offset + numel) once each)."""
    shape, strides = [int(d) for d in v.shape], [int(s) for s in v.stride()]
    perm = sorted(range(len(shape)), key=lambda d: (-strides[d], d))
    want = 1
    for d in reversed(perm):
        if shape[d] > 1 and strides[d] != want:
            return None
        want *= shape[d]
    return perm


def _in_order(perm, shape):
    return [d for d in perm if shape[d] > 1] == [d for d in range(len(perm)) if shape[d] > 1]


def _to_memory(c, x, v):
    """Apollo tensor `x` (example value `v`, dense) flattened in v's memory
    order: a Transpose when v's dims are permuted in memory, a Reshape."""
    perm = _memory_order(v)
    if not _in_order(perm, v.shape):
        x = c.op("Transpose", [x], {"perm": perm})
    return c.reshape(x, (int(v.numel()),))


def _from_memory(c, flat, v):
    """The inverse of _to_memory: a flat tensor in v's memory order as a
    tensor of v's shape."""
    perm = _memory_order(v)
    shape = [int(d) for d in v.shape]
    if _in_order(perm, shape):
        return c.reshape(flat, shape)
    y = c.reshape(flat, tuple(shape[p] for p in perm))
    return c.op("Transpose", [y], {"perm": [perm.index(d) for d in range(len(perm))]})


def _strided_args(n):
    """(input's example value, size, stride, offset) of an as_strided or
    as_strided_scatter node."""
    first = 1 if n.target == aten.as_strided.default else 2
    args = list(n.args) + [None] * 4
    offset = args[first + 2] if args[first + 2] is not None else n.kwargs.get("storage_offset")
    return _val(n.args[0]), [int(d) for d in args[first]], [int(d) for d in args[first + 1]], offset


def _strided_positions(v, size, stride, offset, flat=False):
    """The memory positions of as_strided(v, size, stride, offset) as an
    INT64 tensor of shape `size` (flat: one dim), relative to v's first
    element."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():
        base = int(v.storage_offset())
        pos = torch.full(size, (base if offset is None else int(offset)) - base, dtype=torch.int64)
        for d, (sz, st) in enumerate(zip(size, stride)):
            pos = pos + (torch.arange(sz, dtype=torch.int64) * st).reshape([sz if j == d else 1
                                                                              for j in range(len(size))])
        return pos.reshape(-1) if flat else pos


def _strided_why(n):
    """Why an as_strided / as_strided_scatter node cannot be converted:
    an input that is not dense in memory, or positions outside its
    elements; None when it can."""
    v, size, stride, offset = _strided_args(n)
    if _memory_order(v) is None:
        return "%s of a tensor that is not dense in memory (strides %s)" % (n.target, list(v.stride()))
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    pos = _strided_positions(v, size, stride, offset)
    with unset_fake_temporarily():
        if pos.numel() and (int(pos.min()) < 0 or int(pos.max()) >= int(v.numel())):
            return "%s reaching outside its input's elements" % n.target
    return None


def _consecutive(pos):
    """The first position when `pos` (row-major) is consecutive, else None."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():
        f = pos.reshape(-1)
        first = int(f[0])
        return first if bool((f == torch.arange(first, first + f.numel())).all()) else None


def _as_strided(c, n):
    """as_strided(x, size, stride, offset) -- AOTAutograd's view of a
    tensor through its memory (e.g. a pooled channels-last result seen
    as [N, C, 1, 1]): x flattened in its memory order (its example value's
    strides; x must be dense), then the elements at the positions the
    strides give -- a Reshape (or a Slice) when they are consecutive, else
    a Gather at constant indices."""
    shape, dt = _meta(n)
    x = c.t(n.args[0])
    v, size, stride, offset = _strided_args(n)
    pos = _strided_positions(v, size, stride, offset)
    if pos.numel() == 0:
        return c.expand(c.scalar(0, c.g.dtype(x)), shape)
    flat = _to_memory(c, x, v)
    first = _consecutive(pos)
    if first is None:
        return c.op("Gather", [flat, _tensor_constant(c, n, pos)], {"axis": 0})
    if pos.numel() != int(v.numel()):
        flat = c.op("Slice", [flat], {"starts": [first], "steps": [1]}, shape=(int(pos.numel()),))
    return c.reshape(flat, shape)


def _as_strided_scatter(c, n):
    """as_strided_scatter(x, src, size, stride, offset): x (its memory
    order: the result keeps x's strides) with the elements at the strided
    positions replaced by src -- src itself when they are all of x in
    order, else a ScatterElements at constant indices."""
    shape, dt = _meta(n)
    x = c.t(n.args[0], dt)
    src = c.t(n.args[1], dt)
    v, size, stride, offset = _strided_args(n)
    pos = _strided_positions(v, size, stride, offset, flat=True)
    cnt = int(pos.numel())
    if cnt == 0:
        return c.op("Identity", [x])
    src_flat = c.reshape(src, (cnt,))
    if cnt == int(v.numel()) and _consecutive(pos) == 0:
        flat = src_flat
    else:
        flat = c.op("ScatterElements", [_to_memory(c, x, v), _tensor_constant(c, n, pos), src_flat],
                    {"axis": 0, "reduction": "none"})
    return _from_memory(c, flat, _val(n))


# ---- random numbers ------------------------------------------------------------
#
# A counter-based generator made of the graph's own integer ops, so that
# dropout compiles with the rest of the graph: Widynski's "Squares" (2020,
# arXiv:2004.06278; 4 rounds of x = x*x + y or z, then the halves swapped)
# over 62-bit words held as two 31-bit limbs in INT64, which keeps every
# product below 2^63 (Apollo has no bitwise integer ops; a swap of 31-bit
# limbs is the rotation).  The counter is the element's row-major index
# (plus what the graph's earlier random ops took, so that two dropouts
# differ); the key, two 31-bit limbs, is an INPUT the backend draws from
# PyTorch's generator at every call (torch.manual_seed reproduces a run).
# Out come 31 random bits per element, compared with round(p * 2^31) for a
# Bernoulli draw.  The masks are not eager PyTorch's (another generator);
# their statistics are checked in tests/torch_checks.py ops dropout.

_LIMB = 1 << 31
RNG_KEY_SHAPE = (2,)


def _rng_key(c):
    """The key INPUT (INT64 [2]: hi and lo limb), made at the first use."""
    if c.rng_key is None:
        c.rng_key = c.g.input("apollo_rng_key", G.INT64, RNG_KEY_SHAPE)
    return c.rng_key


def _random_words(c, n, shape):
    """INT64 random integers in [0, 2^31), one per element of `shape`."""
    shape = tuple(int(d) for d in shape)
    numel = int(math.prod(shape))
    if c.rng_used + numel >= _LIMB:
        raise Unsupported(n, "more than 2^31 random numbers in one graph")
    key = _rng_key(c)
    ka = c.op("Gather", [key, c.scalar(0, G.INT64)], {"axis": 0})
    kb = c.op("Gather", [key, c.scalar(1, G.INT64)], {"axis": 0})
    B = c.scalar(_LIMB, G.INT64)
    ctr = None
    for d, size in enumerate(shape):
        if size == 1:
            continue
        stride = int(math.prod(shape[d + 1:]))
        part = c.const_values([i * stride for i in range(size)], G.INT64,
                              tuple(size if j == d else 1 for j in range(len(shape))))
        ctr = part if ctr is None else c.op("Add", [ctr, part])
    base = c.scalar(c.rng_used, G.INT64)
    ctr = c.op("Add", [ctr, base]) if ctr is not None else c.op("Identity", [base])
    ctr = c.expand(ctr, shape)
    c.rng_used += numel

    def limbs_mod(hi_sum, lo_sum):
        return (c.op("Mod", [c.op("Add", [hi_sum, c.op("Div", [lo_sum, B])]), B], {"fmod": 0}),
                c.op("Mod", [lo_sum, B], {"fmod": 0}))

    def add(x, y):
        return limbs_mod(c.op("Add", [x[0], y[0]]), c.op("Add", [x[1], y[1]]))

    def square(x):
        a, b = x
        two_ab = c.op("Mul", [c.op("Mul", [a, b]), c.scalar(2, G.INT64)])
        return limbs_mod(two_ab, c.op("Mul", [b, b]))

    y = limbs_mod(c.op("Mul", [ctr, ka]), c.op("Mul", [ctr, kb]))
    z = add(y, (ka, kb))
    x = y
    for r in range(3):
        x = add(square(x), y if r % 2 == 0 else z)
        x = (x[1], x[0])
    return add(square(x), z)[0]


def _threshold(p):
    """round(p * 2^31), p clamped to [0, 1]: a word below it has
    probability p."""
    return int(round(min(max(float(p), 0.0), 1.0) * _LIMB))


def _dropout(c, n):
    """native_dropout(x, p, train): (x * mask / (1 - p), mask), mask kept
    with probability 1 - p from _random_words; p = 0 or not training: x
    and a mask of ones; p = 1: zeros."""
    vals = _val(n)
    dt = apollo_dtype(vals[0].dtype)
    p, train = float(n.args[1]), n.args[2]
    x = c.t(n.args[0], dt)
    xs = c.shape(x)
    if train is False or p <= 0:
        return (c.op("Identity", [x]), c.expand(c.scalar(True, G.BOOL), xs))
    if p >= 1:
        return (c.expand(c.scalar(0.0, dt), xs), c.expand(c.scalar(False, G.BOOL), xs))
    keep = c.op("GreaterOrEqual", [_random_words(c, n, xs), c.scalar(_threshold(p), G.INT64)])
    y = c.op("Mul", [c.op("Mul", [x, c.cast(keep, dt)]), c.scalar(1.0 / (1.0 - p), dt)])
    return (y, keep)


def _uniform(c, n, shape, dt):
    """Uniform [0, 1) of Apollo dtype dt (computed in float64 for float64,
    else float32)."""
    wide = G.FLOAT64 if dt == G.FLOAT64 else G.FLOAT32
    u = c.op("Mul", [c.cast(_random_words(c, n, shape), wide), c.scalar(1.0 / _LIMB, wide)])
    return c.cast(u, dt)


def _bernoulli(c, n):
    """bernoulli(x, p) (x's shape and dtype, 1 with probability p) and
    bernoulli(probs) (1 where a uniform draw is below probs)."""
    shape, dt = _meta(n)
    if n.target == aten.bernoulli.p:
        p = n.args[1] if len(n.args) > 1 else n.kwargs.get("p", 0.5)
        hit = c.op("Less", [_random_words(c, n, shape), c.scalar(_threshold(p), G.INT64)])
    else:
        probs = c.t(n.args[0])
        pd = c.g.dtype(probs)
        hit = c.op("Less", [_uniform(c, n, shape, pd), probs])
    return c.cast(hit, dt)


def _rand(c, n):
    shape, dt = _meta(n)
    return _uniform(c, n, shape, dt)


def _empty(c, n):
    """empty*: any values will do; zeros."""
    shape, dt = _meta(n)
    return c.expand(c.scalar(0, dt), shape) if shape else c.op("Identity", [c.scalar(0, dt)])


HANDLERS = {
    aten.abs.default: _unary("Abs"), aten.neg.default: _unary("Neg"), aten.exp.default: _unary("Exp"),
    aten.log.default: _unary("Log"), aten.sqrt.default: _unary("Sqrt"), aten.rsqrt.default: _rsqrt,
    aten.reciprocal.default: _unary("Reciprocal"), aten.tanh.default: _unary("Tanh"),
    aten.sigmoid.default: _unary("Sigmoid"), aten.relu.default: _unary("Relu"),
    aten.erf.default: _unary("Erf"), aten.sign.default: _unary("Sign"), aten.floor.default: _unary("Floor"),
    aten.ceil.default: _unary("Ceil"), aten.sin.default: _unary("Sin"), aten.cos.default: _unary("Cos"),
    aten.isnan.default: lambda c, n: c.op("IsNaN", [c.t(n.args[0])]),
    aten.isinf.default: lambda c, n: c.op("IsInf", [c.t(n.args[0])]),
    aten.logical_not.default: lambda c, n: c.op("Not", [c.t(n.args[0], G.BOOL)]),
    aten.bitwise_not.default: lambda c, n: c.op("Not", [c.t(n.args[0], G.BOOL)]),
    aten.expm1.default: _expm1, aten.log1p.default: _log1p, aten.gelu.default: _gelu,
    aten.silu.default: _silu, aten.leaky_relu.default: _leaky_relu, aten.hardtanh.default: _hardtanh,
    aten.mish.default: _unary("Mish"), aten.softplus.default: _unary("Softplus"),
    aten.hardswish.default: _unary("HardSwish"),
    aten.clamp.default: _clamp, aten.clamp.Tensor: _clamp, aten.clamp_min.default: _clamp,
    aten.clamp_max.default: _clamp,
    aten.clone.default: _identity, aten.alias.default: _identity, aten.lift_fresh_copy.default: _identity,
    aten.detach.default: _identity, aten._to_copy.default: _to_copy,
    aten.add.Tensor: _binary("Add", alpha=True), aten.add.Scalar: _binary("Add", alpha=True),
    aten.sub.Tensor: _binary("Sub", alpha=True), aten.sub.Scalar: _binary("Sub", alpha=True),
    aten.rsub.Scalar: _binary("Sub", alpha=True, rsub=True), aten.rsub.Tensor: _binary("Sub", alpha=True, rsub=True),
    aten.mul.Tensor: _binary("Mul"), aten.mul.Scalar: _binary("Mul"),
    aten.div.Tensor: _binary("Div"), aten.div.Scalar: _binary("Div"), aten.div.Tensor_mode: _div_mode,
    aten.pow.Tensor_Scalar: _pow, aten.pow.Tensor_Tensor: _pow, aten.pow.Scalar: _pow,
    aten.maximum.default: _binary("Max"), aten.minimum.default: _binary("Min"),
    aten.fmod.Tensor: _fmod(1), aten.fmod.Scalar: _fmod(1),
    aten.remainder.Tensor: _fmod(0), aten.remainder.Scalar: _fmod(0),
    aten.eq.Tensor: _compare("Equal"), aten.eq.Scalar: _compare("Equal"),
    aten.ne.Tensor: _compare("Equal", True), aten.ne.Scalar: _compare("Equal", True),
    aten.lt.Tensor: _compare("Less"), aten.lt.Scalar: _compare("Less"),
    aten.gt.Tensor: _compare("Greater"), aten.gt.Scalar: _compare("Greater"),
    aten.le.Tensor: _compare("LessOrEqual"), aten.le.Scalar: _compare("LessOrEqual"),
    aten.ge.Tensor: _compare("GreaterOrEqual"), aten.ge.Scalar: _compare("GreaterOrEqual"),
    aten.logical_and.default: _logic("And"), aten.logical_or.default: _logic("Or"),
    aten.logical_xor.default: _logic("Xor"), aten.bitwise_and.Tensor: _logic("And"),
    aten.bitwise_or.Tensor: _logic("Or"), aten.bitwise_xor.Tensor: _logic("Xor"),
    aten.where.self: _where, aten.masked_fill.Scalar: _masked_fill, aten.masked_fill.Tensor: _masked_fill,
    aten.sum.dim_IntList: _reduce("ReduceSum"), aten.sum.default: _reduce("ReduceSum"),
    aten.mean.dim: _reduce("ReduceMean"), aten.mean.default: _reduce("ReduceMean"),
    aten.amax.default: _reduce("ReduceMax"), aten.amin.default: _reduce("ReduceMin"),
    aten.prod.dim_int: _reduce("ReduceProd"), aten.prod.default: _reduce("ReduceProd"),
    aten.var_mean.correction: _var_mean,
    aten.any.dim: _any_all("ReduceMax"), aten.any.dims: _any_all("ReduceMax"),
    aten.any.default: _any_all("ReduceMax"), aten.all.dim: _any_all("ReduceMin"),
    aten.all.dims: _any_all("ReduceMin"), aten.all.default: _any_all("ReduceMin"),
    aten.argmax.default: _argext("ArgMax"), aten.argmin.default: _argext("ArgMin"),
    aten.max.dim: _max_dim("ReduceMax", "ArgMax"), aten.min.dim: _max_dim("ReduceMin", "ArgMin"),
    aten._softmax.default: _softmax("Softmax"), aten._log_softmax.default: _softmax("LogSoftmax"),
    aten.native_layer_norm.default: _layer_norm,
    aten.mm.default: _mm, aten.bmm.default: _mm, aten.matmul.default: _mm, aten.addmm.default: _addmm,
    aten.convolution.default: _convolution, aten.convolution_backward.default: _convolution_backward,
    aten.avg_pool2d.default: _avg_pool, aten.max_pool2d_with_indices.default: _max_pool,
    aten.max_pool2d_with_indices_backward.default: _max_pool_backward,
    aten.slice_scatter.default: _slice_scatter, aten.select_scatter.default: _slice_scatter,
    aten.view.default: _view, aten._unsafe_view.default: _view, aten.reshape.default: _view,
    aten.squeeze.dim: _view, aten.squeeze.dims: _view, aten.squeeze.default: _view,
    aten.unsqueeze.default: _view, aten.flatten.using_ints: _view,
    aten.permute.default: _permute, aten.t.default: _t, aten.transpose.int: _transpose,
    aten.expand.default: _expand, aten.slice.Tensor: _slice, aten.select.int: _select,
    aten.cat.default: _cat, aten.split_with_sizes.default: _split, aten.split.Tensor: _split,
    aten.embedding.default: _embedding, aten.index_select.default: _index_select,
    aten.index.Tensor: _index, aten.gather.default: _gather,
    aten.scatter.value: _scatter("none"), aten.scatter.src: _scatter("none"),
    aten.scatter_add.default: _scatter("add"), aten.scatter_reduce.two: _scatter("none"),
    aten.index_put.default: _index_put, aten.constant_pad_nd.default: _constant_pad,
    aten.tril.default: _trilu(False), aten.triu.default: _trilu(True), aten.cumsum.default: _cumsum,
    aten.repeat.default: _repeat, aten.flip.default: _flip,
    aten.full.default: _full, aten.full_like.default: _full, aten.zeros.default: _full,
    aten.zeros_like.default: _full, aten.ones.default: _full, aten.ones_like.default: _full,
    aten.new_zeros.default: _full, aten.new_ones.default: _full,
    aten.scalar_tensor.default: _scalar_tensor,
    aten.arange.start_step: _arange, aten.arange.default: _arange, aten.arange.start: _arange,
    aten.copy.default: _copy, aten.fill.Scalar: _fill, aten.fill.Tensor: _fill,
    aten.native_dropout.default: _dropout, aten.bernoulli.p: _bernoulli, aten.bernoulli.default: _bernoulli,
    aten.rand.default: _rand, aten.rand_like.default: _rand,
    aten.empty.memory_format: _empty, aten.empty_like.default: _empty, aten.empty_permuted.default: _empty,
    aten.new_empty.default: _empty, aten.empty_strided.default: _empty, aten.new_empty_strided.default: _empty,
    aten.as_strided.default: _as_strided, aten.as_strided_scatter.default: _as_strided_scatter,
}
HANDLERS.update({op: _sdpa for op in _SDPA_FORWARD})
HANDLERS.update({op: _sdpa_backward for op in _SDPA_BACKWARD})


# ---- what can be converted ----------------------------------------------------

def _precheck(node):
    """Argument forms a rewrite does not cover, seen before converting."""
    t = node.target
    if t == aten.convolution_backward.default and node.args[7]:
        return "convolution_backward of a transposed convolution"
    if t in (aten.index.Tensor, aten.index_put.default):
        for a in node.args[1]:
            v = _val(a)
            if isinstance(v, torch.Tensor) and v.dtype in (torch.bool, torch.uint8):
                return "indexing with a boolean mask (a data-dependent shape)"
    if t == aten.div.Tensor_mode and node.kwargs.get("rounding_mode") not in (None, "floor"):
        return "div with rounding_mode=%r" % node.kwargs.get("rounding_mode")
    if t in _SDPA_FORWARD or t in _SDPA_BACKWARD:
        return _sdpa_why(node)
    for a in _tensor_args(node):
        if a.op == "call_function" and a.target == operator.getitem and a.args[0].target in _SDPA_FORWARD \
                and a.args[1] >= 2:
            return "reads a result of %s that Apollo does not compute (its Philox state)" % op_name(a.args[0])
    if t == aten.avg_pool2d.default and len(node.args) > 6 and node.args[6] is not None:
        return "avg_pool2d with divisor_override"
    if t in (aten.scatter_reduce.two,) and node.kwargs.get("include_self", True) is False:
        return "scatter_reduce with include_self=False"
    if t == aten.scatter_reduce.two and node.args[4] == "mean":
        return "scatter_reduce with reduce='mean'"
    if t in (aten.as_strided.default, aten.as_strided_scatter.default):
        return _strided_why(node)
    return None


def unsupported(node):
    """Why FX node `node` (call_function) cannot be converted, or None."""
    if node.op != "call_function":
        return None
    if node.target == operator.getitem:
        return None
    if node.target not in HANDLERS:
        return "no Apollo rewrite for this op"
    if node.target in _SDPA_FORWARD or node.target in _SDPA_BACKWARD:
        checked = _sdpa_values(node)
    else:
        checked = _vals(node) + [_val(a) for a in _tensor_args(node)]
    for v in checked:
        if not isinstance(v, torch.Tensor):
            continue
        if _static_shape(v) is None:
            return "a dynamic (symbolic) shape"
        if apollo_dtype(v.dtype) is None:
            return "dtype %s is not carried by Apollo graphs" % str(v.dtype).replace("torch.", "")
        if v.dim() > 8:
            return "rank %d (at most 8)" % v.dim()
        if v.device.type not in ("cpu", "cuda"):
            return "device %s" % v.device
    return _precheck(node)


# ---- a whole graph ------------------------------------------------------------------

def _attr_tensor(gm, node):
    """The real tensor of get_attr node `node`, or None."""
    from torch._subclasses.fake_tensor import FakeTensor
    t = gm
    for part in node.target.split("."):
        t = getattr(t, part, None)
    return t if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor) else None


def _tensor_constant(c, node, t):
    """Real tensor `t` (the value of `node`) as a constant of the Apollo
    graph: one value repeated is a scalar Expanded, anything else its
    bytes (CONST when small, else a PARAM the converter keeps)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    dt = apollo_dtype(t.dtype)
    if dt is None:
        raise Unsupported(node, "dtype %s is not carried by Apollo graphs" % str(t.dtype).replace("torch.", ""))
    shape = tuple(int(d) for d in t.shape)
    with unset_fake_temporarily():
        h = t.detach().to("cpu").contiguous()
        if h.numel() > 1 and bool((h.reshape(-1) == h.reshape(-1)[0]).all()):
            v = h.reshape(-1)[0].item()
            return c.expand(c.scalar(v, dt), shape)
        if h.dtype in (torch.bfloat16, torch.float16):
            h = h.view(torch.int16)
        elif h.dtype == torch.bool:
            h = h.to(torch.uint8)
        data = ctypes.string_at(h.data_ptr(), h.numel() * h.element_size()) if h.numel() else b""
    return c.const_bytes(data, dt, shape)


def _attr_constant(c, gm, node):
    """A get_attr node (a tensor constant AOTAutograd lifted onto the
    module, e.g. a mask a model builds with torch.tensor) as a constant
    of the Apollo graph, its bytes copied from the real tensor."""
    t = _attr_tensor(gm, node)
    if t is None:
        raise Unsupported(node, "a module attribute that is not a tensor with data")
    return _tensor_constant(c, node, t)


# ---- constant folding ------------------------------------------------------------
#
# A node whose inputs are all constants -- made in the graph (full, arange,
# zeros) or lifted onto the module (get_attr) -- is computed here, with
# PyTorch on the host, and reaches the Apollo graph as a constant when a
# node that is not constant uses it.  Swin's shifted-window attention mask
# (zeros, then nine slice assignments: a chain of slice_scatter) and
# torch.roll's indices (arange, add, fmod) become constants instead of
# nested Concats and integer arithmetic in the kernels.  Random ops and
# empty* are never folded (the graph draws its own numbers; empty's values
# are the converter's zeros); nor is anything over FOLD_MAX_NUMEL elements.

FOLD_MAX_NUMEL = 1 << 20
FOLD_CONST_MAX_BYTES = 1 << 16
_NO_FOLD = {aten.native_dropout.default, aten.bernoulli.p, aten.bernoulli.default, aten.rand.default,
            aten.rand_like.default, aten.empty.memory_format, aten.empty_like.default,
            aten.empty_permuted.default, aten.new_empty.default, aten.empty_strided.default,
            aten.new_empty_strided.default}


def _fold(c, node):
    """node's real value when every input of it is folded (and it may be
    folded), else None."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    if node.target in _NO_FOLD or node.target not in HANDLERS:
        return None
    if any(a not in c.folded for a in _tensor_args(node)):
        return None
    vals = _vals(node)
    if not vals or sum(int(v.numel()) for v in vals) > FOLD_MAX_NUMEL or unsupported(node) is not None:
        return None

    def real(a):
        if isinstance(a, torch.fx.Node):
            return c.folded[a]
        if isinstance(a, (list, tuple)):
            return type(a)(real(x) for x in a)
        if isinstance(a, torch.device):
            return torch.device("cpu")
        return a
    try:
        with unset_fake_temporarily(), torch.no_grad():
            out = node.target(*real(node.args), **{k: real(v) for k, v in node.kwargs.items()})
    except Exception:      # anything PyTorch refuses here is converted as usual
        return None
    outs = out if isinstance(out, (list, tuple)) else [out]
    if len(outs) != len(vals) or any(not isinstance(o, torch.Tensor) or tuple(o.shape) != tuple(v.shape)
                                     or o.dtype != v.dtype for o, v in zip(outs, vals)):
        return None
    return tuple(outs) if isinstance(out, (list, tuple)) else out


def _materialize(c, node):
    """The Apollo value of folded node `node`, made at its first use by a
    node that is not folded: small values and values of one repeated
    number as constants; a node with no inputs (full, arange) and a large
    value through its own rewrite (an Expand, a constant it makes), its
    inputs made in turn."""
    v = c.folded[node]
    if node.op == "get_attr":
        return _tensor_constant(c, node, v)
    if node.target == operator.getitem:
        if v.numel() * v.element_size() <= FOLD_CONST_MAX_BYTES or _one_value(v):
            return _tensor_constant(c, node, v)
        return c.value(node.args[0])[node.args[1]]
    if isinstance(v, tuple):
        if all(e.numel() * e.element_size() <= FOLD_CONST_MAX_BYTES for e in v):
            return tuple(_tensor_constant(c, node, e) for e in v)
        return HANDLERS[node.target](c, node)
    if _tensor_args(node) and (v.numel() * v.element_size() <= FOLD_CONST_MAX_BYTES or _one_value(v)):
        return _tensor_constant(c, node, v)
    return HANDLERS[node.target](c, node)


def _one_value(t):
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():
        f = t.reshape(-1)
        return f.numel() > 0 and bool((f == f[0]).all())


class Converted:
    """The result of converting one FX graph.

    graph      the apollo.Graph (validated)
    inputs     for each INPUT, in binding order: the placeholder position,
               or "rng" for the key of the random ops (RNG_KEY_SHAPE
               INT64: two limbs in [0, 2^31), drawn per call)
    params     {PARAM name: placeholder position} (weights bound by name)
    consts     {PARAM name: (bytes, Apollo dtype, shape)} (constants kept by
               the converter, bound by the runner)
    outputs    per FX output: ("out", k) the graph's output k, ("arg", i)
               placeholder i returned as it is, ("none",) None, ("value",
               v) the number v (a size of a graph specialized to its
               shapes), ("empty", shape, torch dtype) a tensor made
               empty at the call (a fused attention's Philox state,
               which nothing reads: _Unread)
    out_meta   per graph output: (shape, torch dtype)
    """

    def __init__(self):
        self.graph = None
        self.inputs = []
        self.params = {}
        self.consts = {}
        self.outputs = []
        self.out_meta = []


def _param_name(name):
    out = "".join(ch if ch.isalnum() or ch in "._" else "_" for ch in name)
    return out or "param"


def _unread_input(node):
    """Whether placeholder `node` is read by nothing that is converted:
    used only as an argument an attention backward's rewrite does not read
    (its Philox seed and offset, saved by the forward)."""
    return bool(node.users) and all(u.op == "call_function" and u.target in _SDPA_BACKWARD
                                    and node not in _sdpa_read(u) for u in node.users)


def convert(gm, params=None, name="fx"):
    """Converts GraphModule `gm` (every call_function node supported, see
    unsupported()); `params` maps placeholder positions to parameter names
    (those become PARAM tensors).  Returns a Converted; raises Unsupported
    or apollo.ApolloError."""
    params = params or {}
    c = _Ctx(name)
    res = Converted()
    pos = 0
    seen_param = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            v = _val(node)
            if isinstance(v, (int, float, bool)) and not any(u.op != "output" for u in node.users):
                pos += 1      # a size the graph was specialized to: not an input of the Apollo graph
                continue
            if _unread_input(node):
                pos += 1      # the Philox state an attention backward is handed and does not read
                continue
            if not isinstance(v, torch.Tensor):
                raise Unsupported(node, "a placeholder that is not a tensor (%s)" % type(v).__name__)
            shape, dt = _static_shape(v), apollo_dtype(v.dtype)
            if shape is None:
                raise Unsupported(node, "a dynamic (symbolic) shape")
            if dt is None:
                raise Unsupported(node, "dtype %s is not carried by Apollo graphs" % v.dtype)
            if pos in params:
                pname = _param_name(params[pos])
                while pname in seen_param:
                    pname += "_"
                seen_param.add(pname)
                t = c.g.param(pname, dt, shape)
                res.params[c.g.tensor(t)[0]] = pos
            else:
                t = c.g.input(node.name, dt, shape)
                res.inputs.append(pos)
            c.env[node] = t
            pos += 1
        elif node.op == "call_function":
            if node.target == operator.getitem:
                if node.args[0] in c.folded:
                    base = c.folded[node.args[0]]
                    if isinstance(base, tuple):
                        c.folded[node] = base[node.args[1]]
                    continue
                base = c.value(node.args[0])
                c.env[node] = base[node.args[1]] if isinstance(base, tuple) else None
                continue
            why = unsupported(node)
            if why:
                raise Unsupported(node, why)
            v = _fold(c, node)
            if v is not None:
                c.folded[node] = v      # made a constant at its first use (c.value)
                continue
            try:
                c.env[node] = HANDLERS[node.target](c, node)
            except Unsupported:
                raise
            except (TypeError, ValueError, KeyError, IndexError) as e:
                raise Unsupported(node, "cannot convert: %s" % e)
        elif node.op == "output":
            outs = node.args[0]
            outs = outs if isinstance(outs, (list, tuple)) else [outs]
            placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
            made = {}
            for o in outs:
                if o is None:
                    res.outputs.append(("none",))
                    continue
                if isinstance(o, (int, float, bool)):
                    res.outputs.append(("value", o))      # a size, returned as it is
                    continue
                if not isinstance(o, torch.fx.Node):
                    raise Unsupported(node, "a graph output that is not a tensor (%r)" % (o,))
                if o.op == "placeholder":
                    res.outputs.append(("arg", placeholders.index(o)))
                    continue
                t = c.env.get(o)
                if isinstance(t, _Unread):
                    res.outputs.append(("empty", t.shape, t.dtype))
                    continue
                if t is None and o in c.folded:
                    try:
                        t = c.value(o)
                    except (TypeError, ValueError, KeyError, IndexError) as e:
                        raise Unsupported(o, "cannot convert: %s" % e)
                if t is None:
                    raise Unsupported(o, "an output with no value")
                if t in made:
                    res.outputs.append(("out", made[t]))
                    continue
                _, _, _, kind = c.g.tensor(t)
                if kind != G.VALUE or c.g.is_output(t):
                    t = c.g.node1("Identity", [t])
                v = _val(o)
                shape = tuple(int(d) for d in v.shape)
                if tuple(c.g.shape(t)) != shape:
                    t = c.reshape(t, shape)
                dt = apollo_dtype(v.dtype)
                if c.g.dtype(t) != dt:
                    t = c.cast(t, dt)
                c.g.output(t)
                made[t] = len(res.out_meta)
                res.outputs.append(("out", made[t]))
                res.out_meta.append((shape, v.dtype))
        elif node.op == "get_attr":
            t = _attr_tensor(gm, node)
            if t is None:
                raise Unsupported(node, "a module attribute that is not a tensor with data")
            from torch._subclasses.fake_tensor import unset_fake_temporarily
            with unset_fake_temporarily():
                c.folded[node] = t.detach().to("cpu")   # made a constant at its first use (c.value)
        elif node.op in ("call_module", "call_method"):
            raise Unsupported(node, "%s nodes are not converted" % node.op)
    if c.rng_key is not None:
        res.inputs.append("rng")     # the last INPUT: the generator's key, drawn at each call
    c.g.validate()
    res.graph = c.g
    res.consts = c.consts
    return res
