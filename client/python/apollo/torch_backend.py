"""torch_backend.py -- torch.compile(model, backend="apollo").

    model = torch.compile(model, backend="apollo", options={"target": "cpu"})

Dynamo captures the model's graph; AOTAutograd (with PyTorch's core ATen
decompositions) splits it into a forward and a backward graph in ATen's
core op set; each of them is converted (fx.py) and submitted to apollod
when the compiled model first runs, so a training job's start-up is a set
of submits that the daemon's cache answers on the next run.  The bundles
run through apollo.Runtime: target "cpu" runs the host kernels on the
CPU tensors themselves, CUDA targets launch on the current stream of the
tensors' device; inputs, weights and outputs are bound by their data
pointers, without copies.

scaled_dot_product_attention stays one op with its backward: the fused
kernel PyTorch picks for the tensors' device, the CPU flash kernel's op on
CPU, the flash, memory-efficient or cuDNN kernel's op on CUDA.  The
converter makes each of them Apollo's Attention and AttentionGrad, one
kernel each that saves the log-sum-exp, not the L x S probabilities.  A
forward graph whose fused attention the converter refuses -- dropout_p >
0, which CUDA's fused kernels take -- is traced again through PyTorch's
math kernel (_RetraceMath), whose dropout the converter has.

A graph Dynamo made with symbolic sizes (dynamic shapes: after a second
input shape) is compiled for each concrete shape it is called with
(_PerShape: traced again with the call's sizes, then submitted as any
graph, one submit per shape).

Random ops (dropout, bernoulli, rand) draw from fx.py's counter-based
generator; its key is an extra input drawn from PyTorch's default
generator at every call (_rng_key), so torch.manual_seed reproduces a run.
Each compiled part returns its values in the dtypes of the traced graph
(autocast's casts are ops of it), so eager PyTorch between parts of a
split graph gets what eager would give it.

Ops the converter cannot take split the graph: the parts Apollo can take
are compiled, the rest runs in eager PyTorch between them, and one line per
op says why ("apollo: graph break at aten.atan2.default (atan2): no Apollo
rewrite for this op").  With no daemon reachable the model runs eagerly
after a warning.  In strict mode both are errors instead.

Options (torch.compile(..., options={...}), else the environment, else the
default):
    socket     APOLLO_SOCKET     the daemon's address ("HOST:PORT" for TCP)
    token      APOLLO_TOKEN      TCP token
    target     APOLLO_TARGET     "cpu", "sm_90", ...; default: cpu for CPU
                                 tensors, sm_<capability> for CUDA tensors
    fusion     APOLLO_FUSION     none | rules | apollo (the daemon's default)
    namespace  APOLLO_NAMESPACE  cache namespace (part of the cache key)
    strict     APOLLO_STRICT     1: unsupported ops and no daemon raise
    no_cache   APOLLO_NO_CACHE   1: compile even when the cache has it
    allow_tf32 APOLLO_ALLOW_TF32 1: float32 products may use TF32 tensor cores
    unvalidated APOLLO_UNVALIDATED 1: the kernel forms not yet run on a GPU
                                 wherever they fit (sm_90a: TMA, the attention
                                 overlap; CompileOptions.unvalidated)
    threads    APOLLO_THREADS    host threads per launch (0: the runtime's)
    quiet      APOLLO_QUIET      1: no graph-break lines
    explain_html APOLLO_EXPLAIN_HTML  a folder (made when missing): each
                                 compiled graph's fused graph written there
                                 as NNN_<graph>.html, the page of
                                 `apollo-client submit --explain-html`
                                 (a page that cannot be written warns;
                                 in strict mode it raises)

A wrong configuration -- an unknown option, target (by its form, or one
the daemon does not list) or fusion level, a value of the wrong kind, in
options or in the environment -- raises apollo.ConfigError (an
ApolloError, code EINVAL); it never falls back to eager PyTorch.  What
needs no daemon raises from torch.compile itself (_options_at_compile); a
target the daemon does not list, at the compiled model's first call.

stats() counts, for the process: graphs submitted, answered from the cache,
kernels, daemon compile time, graph breaks, graphs run eagerly and parts of
split graphs run eagerly.
"""
import contextlib
import itertools
import logging
import operator
import os
import re
import sys
import threading
import warnings

import torch
import torch.fx
from torch._decomp import core_aten_decompositions, get_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupport

from . import config
from . import fx as afx
from .client import Client
from .errors import EINVAL, EIO, EUNSUPPORTED, ApolloError, ConfigError
from .runtime import Runtime

aten = torch.ops.aten


def _flag(v):
    """A yes/no option: a bool, 0/1, or one of 1 true yes on / 0 false no
    off "" (any case); anything else is a configuration error."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(v, str) and v.strip().lower() in ("", "0", "false", "no", "off"):
        return False
    raise ValueError("expected yes or no (true, false, 1, 0, on, off)")


def _count(v):
    """A count >= 0 (an int, or its decimal string)."""
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ValueError("expected a whole number >= 0")
    n = int(v)
    if n < 0:
        raise ValueError("expected a whole number >= 0")
    return n


def _text(v):
    if not isinstance(v, str):
        raise ValueError("expected a string, not %s" % type(v).__name__)
    return v


def _target(v):
    """cpu, sm_XX[a], compute_XX or host:sm_XX (the daemon's spelling);
    which of them the daemon has is checked once it is reached."""
    return config.parse_target(v)


def _fusion(v):
    return config.parse_fusion(_text(v))


_OPTIONS = {  # name: (environment variable, default, parser)
    "socket": ("APOLLO_SOCKET", None, _text),
    "token": ("APOLLO_TOKEN", None, _text),
    "target": ("APOLLO_TARGET", None, _target),
    "fusion": ("APOLLO_FUSION", None, _fusion),
    "namespace": ("APOLLO_NAMESPACE", "", _text),
    "strict": ("APOLLO_STRICT", False, _flag),
    "no_cache": ("APOLLO_NO_CACHE", False, _flag),
    "allow_tf32": ("APOLLO_ALLOW_TF32", False, _flag),
    "unvalidated": ("APOLLO_UNVALIDATED", False, _flag),
    "threads": ("APOLLO_THREADS", 0, _count),
    "quiet": ("APOLLO_QUIET", False, _flag),
    "explain_html": ("APOLLO_EXPLAIN_HTML", None, _text),
}

try:
    from torch._dynamo.exc import ShortenTraceback as _DynamoPassThrough
except ImportError:       # an older torch: Dynamo wraps the error in its own
    _DynamoPassThrough = None

if _DynamoPassThrough is not None:
    class _ConfigError(ConfigError, _DynamoPassThrough):
        """ConfigError as the backend raises it: Dynamo wraps what a backend
        raises into BackendCompilerFailed, except its own ShortenTraceback
        family, which reaches the caller as it is -- so a configuration
        error is an apollo.ConfigError (an ApolloError) at the call."""
        first_useful_frame = None
    _ConfigError.__module__ = "apollo.errors"
    _ConfigError.__name__ = _ConfigError.__qualname__ = "ConfigError"
else:
    _ConfigError = ConfigError


def config_error(message):
    """The error a bad configuration raises (a ConfigError, code EINVAL)."""
    return _ConfigError(EINVAL, message)


class Options:
    """The backend's options: torch.compile's options={...}, else the
    environment, else the default (the table in the module comment).
    Every value is checked here; a wrong one raises ConfigError, so that a
    misspelt target or fusion level fails the call instead of running the
    model in eager PyTorch."""

    def __init__(self, given=None):
        given = dict(given or {})
        unknown = config.unknown_options(given, _OPTIONS)
        if unknown:
            raise config_error(unknown)
        for name, (env, default, parse) in _OPTIONS.items():
            if name in given and given[name] is not None:
                val, where = given[name], "option %s=%r" % (name, given[name])
            elif os.environ.get(env) not in (None, ""):
                val, where = os.environ[env], "%s=%r in the environment" % (env, os.environ[env])
            else:
                setattr(self, name, default)
                continue
            try:
                setattr(self, name, parse(val))
            except ValueError as e:
                raise config_error("%s: %s" % (where, e)) from None

    def check_target(self, client):
        """The target, when one is set, against the targets the daemon
        at `client` lists (host:sm_XX: sm_XX emulated on the host)."""
        if not self.target:
            return
        why = config.target_listed(self.target, client.targets)
        if why:
            raise config_error(why)


# ---- process-wide counters ---------------------------------------------------------

_lock = threading.Lock()
_stats = {}


def reset_stats():
    with _lock:
        _stats.clear()
        _stats.update(graphs=0, cache_hits=0, cache_misses=0, kernels=0, compile_ms=0.0,
                      graph_breaks=[], eager_graphs=0, eager_parts=0, submit_s=0.0, shapes=0)


def stats():
    """Counters since the last reset_stats(): graphs (submitted), cache_hits,
    cache_misses, kernels (launches), compile_ms (daemon time), submit_s
    (wall time of submits), graph_breaks (one "op (node): reason" per op
    that ran eagerly), eager_graphs (graphs run wholly in PyTorch),
    eager_parts (parts of split graphs that Apollo refused, run in
    PyTorch), shapes (graphs with symbolic sizes compiled for one more
    concrete shape)."""
    with _lock:
        out = dict(_stats)
        out["graph_breaks"] = list(_stats["graph_breaks"])
        return out


reset_stats()


def _say(opts, line):
    if not opts.quiet:
        print(line, file=sys.stderr, flush=True)


# ---- daemon connections -----------------------------------------------------------

_clients = {}


def _client(opts):
    """A connected client for opts' address (one per address and thread)."""
    key = (opts.socket, opts.token, threading.get_ident())
    c = _clients.get(key)
    if c is not None:
        try:
            c.ping()
            return c
        except ApolloError:
            c.close()
    c = Client(opts.socket, opts.token)
    _clients[key] = c
    return c


# ---- one compiled graph -----------------------------------------------------------------

def _target_for(device, opts):
    if opts.target:
        return opts.target
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return "sm_%d%d" % (major, minor)
    return "cpu"


def _ready(t, dtype):
    """t as a contiguous, 16-byte aligned tensor of `dtype` (a copy only
    when t is not one already)."""
    if t.dtype != dtype:
        t = t.to(dtype)
    if not t.is_contiguous():
        t = t.contiguous()
    if t.numel() and t.data_ptr() % 16:
        t = t.clone(memory_format=torch.contiguous_format)
    return t


class _Compiled:
    """A converted graph's bundle, bound to the tensors of each call."""

    def __init__(self, conv, bundle, device, opts):
        self.conv = conv
        self.bundle = bundle
        self.device = device
        self.rt = Runtime(bundle, threads=opts.threads,
                          device=device.index or 0 if device.type == "cuda" else 0)
        self.in_binds = []      # (buffer, placeholder position, torch dtype)
        self.out_binds = []     # (buffer, shape, torch dtype)
        self._const_keep = []
        by_out = {}
        inputs = conv.inputs
        for i, b in enumerate(bundle.buffers):
            if b["kind"] == "input":
                pos = inputs[b["index"]]
                self.in_binds.append((i, pos, afx.FROM_APOLLO[b["dtype"]]))
            elif b["kind"] == "param":
                if b["name"] in conv.params:
                    self.in_binds.append((i, conv.params[b["name"]], afx.FROM_APOLLO[b["dtype"]]))
                elif b["name"] in conv.consts:
                    data, dt, shape = conv.consts[b["name"]]
                    with unset_fake_temporarily():
                        t = torch.frombuffer(bytearray(data), dtype=afx.FROM_APOLLO[dt]).reshape(shape)
                        t = _ready(t.to(device), afx.FROM_APOLLO[b["dtype"]])
                    self._const_keep.append(t)
                    self.rt.bind(i, t.data_ptr(), t.numel() * t.element_size())
                else:
                    raise ApolloError(-3, "bundle param '%s' is neither a weight nor a constant" % b["name"])
            elif b["kind"] == "output":
                by_out[b["index"]] = i
        for k, (shape, dt) in enumerate(conv.out_meta):
            self.out_binds.append((by_out[k], shape, dt))

    def __call__(self, *args):
        keep = []
        rt = self.rt
        for buf, pos, dt in self.in_binds:
            t = _ready(_rng_key(self.device) if pos == "rng" else args[pos], dt)
            keep.append(t)
            rt.bind(buf, t.data_ptr(), t.numel() * t.element_size())
        outs = []
        for buf, shape, dt in self.out_binds:
            o = torch.empty(shape, dtype=dt, device=self.device)
            outs.append(o)
            rt.bind(buf, o.data_ptr(), o.numel() * o.element_size())
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0
        rt.run(stream)
        res = []
        for spec in self.conv.outputs:
            if spec[0] == "out":
                res.append(outs[spec[1]])
            elif spec[0] in ("arg", "value"):
                res.append(args[spec[1]] if spec[0] == "arg" else spec[1])
            elif spec[0] == "empty":
                res.append(torch.empty(spec[1], dtype=spec[2], device=self.device))
            else:
                res.append(None)
        return res


def _rng_key(device):
    """A key for the graph's random ops (fx._random_words): two 31-bit
    limbs from PyTorch's default generator, the low one odd."""
    k = torch.randint(0, 1 << 31, afx.RNG_KEY_SHAPE, dtype=torch.int64)
    k[1] |= 1
    return k.to(device)


def _device_of(gm, example_inputs):
    devs = {t.device for t in example_inputs if isinstance(t, torch.Tensor)}
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor):
            devs.add(v.device)
    devs = {d for d in devs if d.type != "meta"}
    if len(devs) > 1:
        return None
    return devs.pop() if devs else torch.device("cpu")


_pages = itertools.count()


def _explain_html(bundle, opts, name):
    """The explain_html option: bundle's page as DIR/NNN_<name>.html."""
    path = os.path.join(opts.explain_html, "%03d_%s.html" % (next(_pages), re.sub(r"[^\w.-]", "_", name)))
    try:
        os.makedirs(opts.explain_html, exist_ok=True)
        bundle.explain_html(path, title=name)
    except (OSError, ApolloError) as e:
        if opts.strict:
            raise ApolloError(EIO, "apollo: explain_html: %s: %s" % (path, e)) from None
        warnings.warn("apollo: explain_html: %s: %s" % (path, e), RuntimeWarning, stacklevel=2)


_log = logging.getLogger("apollo")

# A compile that takes longer than this (seconds) is logged once, at INFO,
# with the stage the daemon was at.
SLOW_COMPILE_S = 1.0


class _Waiting:
    """The daemon's progress events of one submit (Client.submit's
    `progress`): remembers the last stage, and logs once, at INFO, what the
    submit is waiting for when it has taken over SLOW_COMPILE_S -- from the
    first event past that time, or at the end (done()) when none came."""

    def __init__(self, name, t0):
        self.name, self.t0 = name, t0
        self.stage, self.logged = None, False

    def _describe(self):
        stage, done, total = self.stage
        return "%s %d/%d kernels" % (stage, done, total) if total else stage

    def __call__(self, stage, done, total, elapsed_ms):
        import time
        self.stage = (stage, done, total)
        if not self.logged and time.perf_counter() - self.t0 > SLOW_COMPILE_S:
            self.logged = True
            _log.info("apollo: compiling %s for %.1f s: waiting for the daemon's %s",
                      self.name, time.perf_counter() - self.t0, self._describe())

    def done(self, dt):
        if self.logged or dt <= SLOW_COMPILE_S:
            return
        self.logged = True
        _log.info("apollo: compiling %s took %.1f s; the daemon's last stage: %s", self.name, dt,
                  self._describe() if self.stage else "none reported")


def _submit(gm, params, device, opts, name):
    """Converts and submits one FX graph; returns a _Compiled.  A compile
    over SLOW_COMPILE_S is logged once (logger "apollo", INFO) with the
    stage the daemon was at."""
    conv = afx.convert(gm, params, name)
    target = _target_for(device, opts)
    import time
    t0 = time.perf_counter()
    waiting = _Waiting(name, t0)
    bundle = _client(opts).submit(conv.graph, target=target, fusion=opts.fusion or None,
                                  namespace=opts.namespace or "", no_cache=opts.no_cache,
                                  allow_tf32=opts.allow_tf32, unvalidated=opts.unvalidated,
                                  progress=waiting)
    dt = time.perf_counter() - t0
    waiting.done(dt)
    if opts.explain_html:
        _explain_html(bundle, opts, name)
    st = bundle.stats
    with _lock:
        _stats["graphs"] += 1
        _stats["cache_hits" if st["cache_hit"] else "cache_misses"] += 1
        _stats["kernels"] += st["kernels"]
        _stats["compile_ms"] += st["compile_ms"]
        _stats["submit_s"] += dt
    return _Compiled(conv, bundle, device, opts)


class _Support(OperatorSupport):
    def is_node_supported(self, submodules, node):
        return node.op == "call_function" and afx.unsupported(node) is None


_TRIVIAL = {operator.getitem, aten.view.default, aten._unsafe_view.default, aten.alias.default,
            aten.reshape.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
            aten.t.default, aten.permute.default, aten.expand.default, aten.detach.default}


# Ops that read their input's memory through strides rather than its
# values: a graph that leaves one to PyTorch is not split (_compile_graph).
_MEMORY_OPS = {aten.as_strided.default, aten.as_strided_scatter.default}


class _Part(torch.nn.Module):
    """A fused partition compiled by Apollo, called from the eager graph."""

    def __init__(self, compiled, tuple_out):
        super().__init__()
        self.compiled = compiled
        self.tuple_out = tuple_out

    def forward(self, *args):
        outs = self.compiled(*args)
        return tuple(outs) if self.tuple_out else outs[0]


def _eager(gm):
    from functorch.compile import make_boxed_func
    with _lock:
        _stats["eager_graphs"] += 1
    return make_boxed_func(gm.forward)


def _symbolic(gm, example_inputs):
    """Whether Dynamo made `gm` with symbolic sizes (dynamic shapes): a
    SymInt among the inputs, or a value whose shape is not static."""
    if any(isinstance(x, torch.SymInt) for x in example_inputs):
        return True
    for n in gm.graph.nodes:
        for v in afx._vals(n):
            if afx._static_shape(v) is None:
                return True
    return False


class _PerShape:
    """A graph with symbolic sizes, compiled for each concrete shape it is
    called with: the graph is traced again (make_fx, fake tensors of the
    call's shapes, its size arguments as the call's numbers), which leaves
    a graph of static shapes, and that is compiled as any other (one submit
    per graph, answered from the daemon's cache when it has it).  Kept per
    (shapes, dtypes, devices, sizes) of the arguments.  A boxed function,
    as AOTAutograd calls its compilers' results (one list of arguments);
    unboxed arguments are taken too."""

    def __init__(self, gm, opts, kind, params):
        self._boxed_call = True   # on the instance: wrappers copy its __dict__
        self.gm = gm
        self.opts = opts
        self.kind = kind
        self.params = params
        self.by_shape = {}

    def __call__(self, *args):
        args = list(args[0]) if len(args) == 1 and isinstance(args[0], list) else list(args)
        key = tuple((tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else
                    (type(a).__name__, a) for a in args)
        fn = self.by_shape.get(key)
        if fn is None:
            from torch.fx.experimental.proxy_tensor import make_fx
            concrete = make_fx(self.gm, tracing_mode="fake")(*args)
            example = [n.meta.get("val") for n in concrete.graph.nodes if n.op == "placeholder"]
            with _lock:
                _stats["shapes"] += 1
            fn = _compile_graph(concrete, example, self.opts, self.kind, self.params)
            self.by_shape[key] = fn
        return fn(args)


def _compile_graph(gm, example_inputs, opts, kind, params):
    """AOTAutograd's forward / backward compiler."""
    from functorch.compile import make_boxed_func
    if _symbolic(gm, example_inputs):
        return _PerShape(gm, opts, kind, params)
    device = _device_of(gm, example_inputs)
    breaks = []
    for n in gm.graph.nodes:
        why = afx.unsupported(n)
        if why:
            breaks.append((n, why))
    if device is None:
        why = "tensors on several devices"
        if opts.strict:
            raise ApolloError(EUNSUPPORTED, "apollo: %s graph: %s" % (kind, why))
        _say(opts, "apollo: %s graph runs in eager PyTorch: %s" % (kind, why))
        return _eager(gm)
    for n, why in breaks:
        line = "%s (%s): %s" % (afx.op_name(n), n.name, why)
        with _lock:
            _stats["graph_breaks"].append(line)
        if opts.strict:
            raise ApolloError(EUNSUPPORTED, "apollo: unsupported op in the %s graph: %s" % (kind, line))
        _say(opts, "apollo: graph break at %s" % line)
    if any(n.target in _MEMORY_OPS for n, _ in breaks):
        # a compiled part returns fresh contiguous tensors, not the views of
        # the traced graph, so an as_strided left to PyTorch would read
        # other memory than eager's: the whole graph runs eagerly
        _say(opts, "apollo: %s graph runs in eager PyTorch: as_strided of a view, whose memory a split "
                   "graph does not keep" % kind)
        return _eager(gm)
    name = "%s_%d" % (kind, stats()["graphs"])
    if not breaks:
        try:
            return make_boxed_func(_submit(gm, params, device, opts, name))
        except (afx.Unsupported, ApolloError) as e:
            if opts.strict:
                raise
            _say(opts, "apollo: %s graph runs in eager PyTorch: %s" % (kind, e))
            return _eager(gm)
    # Split: the supported parts compiled, eager PyTorch between them.
    part = CapabilityBasedPartitioner(gm, _Support(), allows_single_node_partition=True)
    parts = [p for p in part.propose_partitions()
             if any(n.target not in _TRIVIAL for n in p.nodes)]
    fused = part.fuse_partitions(parts)
    for node in list(fused.graph.nodes):
        if node.op != "call_module" or not node.target.startswith("fused_"):
            continue
        sub = getattr(fused, node.target)
        # the submodule's placeholders take the meta of the values fed in
        for ph, arg in zip([n for n in sub.graph.nodes if n.op == "placeholder"], node.args):
            if isinstance(arg, torch.fx.Node) and "val" in arg.meta:
                ph.meta["val"] = arg.meta["val"]
        out = [n for n in sub.graph.nodes if n.op == "output"][0]
        tuple_out = isinstance(out.args[0], (list, tuple))
        try:
            compiled = _submit(sub, {}, device, opts, "%s_%s" % (name, node.target))
        except (afx.Unsupported, ApolloError) as e:
            if opts.strict:
                raise
            _say(opts, "apollo: part %s of the %s graph runs in eager PyTorch: %s" % (node.target, kind, e))
            with _lock:
                _stats["eager_parts"] += 1
            continue
        setattr(fused, node.target, _Part(compiled, tuple_out))
    fused.recompile()
    return make_boxed_func(fused.forward)


# ---- the dynamo backend ----------------------------------------------------------------

def _decompositions():
    table = dict(core_aten_decompositions())
    table.update(get_decompositions([
        aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit,
        aten._native_batch_norm_legit_no_training, aten.native_batch_norm,
        aten.native_batch_norm_backward, aten.native_layer_norm_backward,
        aten._softmax_backward_data, aten._log_softmax_backward_data, aten.embedding_dense_backward,
        aten.nll_loss_forward, aten.nll_loss_backward, aten.gelu_backward, aten.silu,
        aten.hardswish, aten.addmm, aten.linear]))
    for op in (aten.native_layer_norm.default, aten.addmm.default):
        table.pop(op, None)      # converted whole: LayerNormalization, MatMul + Add
    # PyTorch's decomposition of the CPU flash attention is for export and
    # inference only: its second result is the attention weights [N, H, L,
    # S] where the op's is the logsumexp [N, H, L], which the op's backward
    # (run eagerly) reads, so gradients came out wrong.  The op is
    # converted whole (fx.py's Attention and AttentionGrad).
    table.pop(aten._scaled_dot_product_flash_attention_for_cpu.default, None)
    return table


def _math_attention():
    """A context in which scaled_dot_product_attention takes PyTorch's math
    kernel (matmul, softmax, dropout, matmul and their masks), so that
    AOTAutograd traces it, and its backward, into ops the converter has:
    used for a graph whose fused attention the converter refuses
    (_RetraceMath).  A no-op where torch lacks torch.nn.attention."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.MATH])


def _param_positions(gm, example_inputs):
    """{position: name} of the inputs that are the module's parameters and
    buffers (dynamo lifts them into graph inputs)."""
    out = {}
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, (ph, x) in enumerate(zip(phs, example_inputs)):
        if isinstance(x, torch.nn.Parameter) or "_parameters_" in ph.name or "_buffers_" in ph.name:
            nm = ph.name
            for pre in ("L_self_modules_", "L_self_", "L_"):
                if nm.startswith(pre):
                    nm = nm[len(pre):]
            out[i] = nm.replace("_modules_", ".").replace("_parameters_", ".").replace("_buffers_", ".").strip("_")
    return out


class _RetraceMath(Exception):
    """Raised by the forward compiler when AOTAutograd's forward graph holds
    a fused attention op the converter refuses (fx.refused_attention: its
    dropout_p > 0, say -- PyTorch picks the flash or memory-efficient
    kernel for it on CUDA): apollo_backend traces the graph again with the
    math kernel, whose dropout is the converter's random ops, instead of
    splitting the graph at the attention."""


def apollo_backend(gm, example_inputs, options=None, **_ignored):
    """The "apollo" backend of torch.compile (see the module comment)."""
    opts = Options(options)
    try:
        opts.check_target(_client(opts))
    except ConfigError:
        raise
    except ApolloError as e:
        if opts.strict:
            raise
        warnings.warn("apollo: no apollod reachable (%s): running the model in eager PyTorch" % e.message,
                      RuntimeWarning, stacklevel=2)
        with _lock:
            _stats["eager_graphs"] += 1
        return gm.forward
    params = _param_positions(gm, example_inputs)

    def trace(math_attention):
        def fw(g, ex):
            why = None if math_attention else afx.refused_attention(g)
            if why:
                _say(opts, "apollo: tracing attention again through PyTorch's math kernel: %s" % why)
                raise _RetraceMath(why)
            return _compile_graph(g, ex, opts, "forward", params)

        def bw(g, ex):
            return _compile_graph(g, ex, opts, "backward", {})

        # AOTAutograd traces the forward and backward graphs here, in this call
        return aot_autograd(fw_compiler=fw, bw_compiler=bw, inference_compiler=fw,
                            decompositions=_decompositions())(gm, example_inputs)

    try:
        return trace(False)
    except _RetraceMath:
        with _math_attention():
            return trace(True)


def _options_at_compile():
    """Checks the options when torch.compile(model, backend="apollo",
    options=...) is called, not at the compiled model's first call.

    torch.compile hands its options to a backend only when Dynamo first
    compiles a frame; what it calls at torch.compile() itself is the
    backend's `_dynamo_backend_init` hook (no arguments), from
    torch._dynamo.eval_frame.get_compiler_fn, whose caller holds the
    _TorchCompileWrapper carrying `options`.  The hook looks for that
    wrapper among its callers' locals (a few frames up) and checks its
    options and the environment with Options(): a wrong option, target
    form or fusion level raises ConfigError out of torch.compile.  Where
    no wrapper is found (torch._dynamo.optimize("apollo"), another torch)
    the environment alone is checked now and the options at the first
    call, as before.  The daemon's list of targets is checked at the first
    call (no connection is made here)."""
    options = None
    try:
        from torch import _TorchCompileWrapper as wrapper_type
    except ImportError:
        wrapper_type = None
    f = sys._getframe(1)
    for _ in range(6):
        if f is None or wrapper_type is None:
            break
        for v in f.f_locals.values():
            if isinstance(v, wrapper_type) and getattr(v, "compiler_fn", None) is apollo_backend:
                options = v.kwargs.get("options")
                break
        else:
            f = f.f_back
            continue
        break
    Options(options)


def _register():
    try:
        from torch._dynamo.backends import registry
    except ImportError:
        return
    if "apollo" in registry._COMPILER_FNS or registry._BACKENDS.get("apollo") is not None:
        return   # registered, or about to be through the package's entry point
    registry.register_backend(apollo_backend, name="apollo")


apollo_backend._dynamo_backend_init = _options_at_compile
_register()
