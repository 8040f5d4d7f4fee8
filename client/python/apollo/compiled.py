"""compiled.py -- apollo.compile: an ONNX model as a Python callable.

    import numpy as np, apollo
    model = apollo.compile("model.onnx", target="cpu")
    y = model(np.random.rand(8, 3, 224, 224).astype(np.float32))   # an ndarray
    y = model(input=x)                     # by the graph input's name
    y = model(torch.randn(8, 3, 224, 224)) # torch tensors in, torch tensors out

The model (a path, its bytes, or an onnx.ModelProto) is imported here, on
the client, by the C importer (ap_onnx_import_dir: the daemon's own import,
with the weights kept in a parameter store); the graph's structure goes to
apollod as any submit does, and the weights never leave the process: each
runtime gets them by copy from the store (ap_runtime_bind_params).
Tensors that keep their data in an external file (`torch.onnx.export`
writes `model.onnx.data` beside the model) are read by that importer from
the model file's folder, as `apollo-client` reads them (the location
confined to the folder, offset and length checked against the file and
the tensor: common/onnx_external.c); a model given as bytes or as a
ModelProto has no folder, so one with external data must be given by
its path.

Shapes come from the arrays of each call: the graph inputs' symbolic
dimensions are bound to the given sizes (one symbol, one size across the
inputs), and each new signature -- the inputs' shapes -- is compiled once
and kept (the last `cache_size`, default 8, bundles with their runtimes);
the daemon's cache answers a signature seen in another process.  An
integer input that the model needs as a compile-time constant (a Reshape's
shape, given as an input) is baked into the graph, and its values then
become part of the signature.

Every call checks its inputs against the model's: names, count, dtype,
rank and the declared sizes; a mismatch is an ApolloError naming the
input, what the model expects and what was given.  Configuration errors --
an unknown option, target or fusion level, a target the daemon lacks --
raise apollo.ConfigError from apollo.compile itself.

Host targets (cpu, host:sm_XX) take numpy arrays and CPU torch tensors and
bind them by address, no copies (a non-contiguous or misaligned one is
copied once).  GPU targets (sm_XX, compute_XX) run through the runtime's
CUDA path on the caller's current torch stream: CUDA torch tensors are
bound by device address; numpy arrays go through torch to the device and
back (torch with CUDA is needed for a GPU target).
"""
import collections
import ctypes
import os
import threading

from . import config
from ._lib import ap_error, ap_host_tensor, lib
from .client import Client
from .errors import EINVAL, ESHAPE, EUNSUPPORTED, ApolloError, ConfigError, new_error, raise_error
from .onnx_model import ELEM_NAME, ModelInfo
from .runtime import Runtime, cuda_available

# ONNX element type -> numpy dtype name (those a graph input may have)
_NP_NAME = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
            10: "float16", 11: "float64"}
_INT_ELEMS = (2, 3, 5, 6, 7)

OPTIONS = ("fusion", "namespace", "no_cache", "allow_tf32", "threads", "device", "socket", "token",
           "cache_size", "host_check", "timeout_ms")


def _np():
    try:
        import numpy
    except ImportError:
        raise ApolloError(EUNSUPPORTED, "apollo.compile needs numpy (pip install numpy)") from None
    return numpy


def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "data_ptr")


def _torch_dtype(torch, elem):
    return {1: torch.float32, 2: torch.uint8, 3: torch.int8, 5: torch.int16, 6: torch.int32,
            7: torch.int64, 9: torch.bool, 10: torch.float16, 11: torch.float64,
            16: torch.bfloat16}.get(elem)


def _elem_of_torch(torch, dt):
    for e in (1, 2, 3, 5, 6, 7, 9, 10, 11, 16):
        if _torch_dtype(torch, e) == dt:
            return e
    return 0


def _elem_of_numpy(dt):
    for e, n in _NP_NAME.items():
        if dt.name == n:
            return e
    return 0


def _shape_text(dims):
    return "[%s]" % ", ".join(str(d) for d in dims)


def _yesno(name, v):
    if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
        return bool(v)
    raise ConfigError(EINVAL, "option %s=%r: expected True or False" % (name, v))


def _count(name, v, least=0):
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise ConfigError(EINVAL, "option %s=%r: expected a whole number >= %d" % (name, v, least))
    return v


def _read_model(model):
    """(serialized ModelProto, the folder its external data lives in or None)."""
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        try:
            with open(path, "rb") as f:
                return f.read(), os.path.dirname(os.path.abspath(path))
        except OSError as e:
            raise ApolloError(-12, "cannot read the model %s: %s" % (path, e.strerror)) from None
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model), None
    if hasattr(model, "SerializeToString") and hasattr(model, "graph"):
        return model.SerializeToString(), None      # an onnx.ModelProto
    raise ConfigError(EINVAL, "model: expected an ONNX file path, its bytes or an onnx.ModelProto, "
                      "not %s" % type(model).__name__)


class _Imported:
    """An ap_onnx_import_dir result (graph and parameter store), freed with it."""

    def __init__(self, g, params):
        self.handle = g
        self.params = params

    def close(self):
        if getattr(self, "handle", None):
            lib.ap_graph_free(self.handle)
            self.handle = None
        if getattr(self, "params", None):
            lib.ap_params_free(self.params)
            self.params = None

    __del__ = close


class _Entry:
    """One compiled signature: bundle, runtime with the weights bound, and
    where each input and output goes."""

    def __init__(self, bundle, rt, inputs, outputs, baked):
        self.bundle = bundle
        self.rt = rt
        self.inputs = inputs      # [(buffer, model input position)]
        self.outputs = outputs    # [(buffer, shape, elem)] in output order
        self.baked = baked        # {input position: bytes} of inputs baked as constants


class CompiledModel:
    """An ONNX model compiled by apollod, callable with numpy arrays or
    torch tensors (see the module comment; made by apollo.compile)."""

    def __init__(self, model, target="cpu", client=None, **options):
        bad = config.unknown_options(options, OPTIONS + ("target", "client"), "apollo.compile option")
        if bad:
            raise ConfigError(EINVAL, bad)
        try:
            self.target = config.parse_target(target)
            self.fusion = config.parse_fusion(options.get("fusion"))
        except ValueError as e:
            raise ConfigError(EINVAL, str(e)) from None
        self.namespace = options.get("namespace") or ""
        if not isinstance(self.namespace, str):
            raise ConfigError(EINVAL, "option namespace=%r: expected a string" % (self.namespace,))
        self.no_cache = _yesno("no_cache", options.get("no_cache", False))
        self.allow_tf32 = _yesno("allow_tf32", options.get("allow_tf32", False))
        self.host_check = _yesno("host_check", options.get("host_check", False))
        self.threads = _count("threads", options.get("threads", 0))
        self.device = _count("device", options.get("device", 0))
        self.cache_size = _count("cache_size", options.get("cache_size", 8), 1)
        if client is not None and not isinstance(client, Client):
            raise ConfigError(EINVAL, "client: expected an apollo.Client, not %s" % type(client).__name__)
        if client is not None and (options.get("socket") or options.get("token")):
            raise ConfigError(EINVAL, "give either client= or socket=/token=, not both")
        self.on_host = self.target == "cpu" or self.target.startswith("host:")

        self._buf, base_dir = _read_model(model)
        info = ModelInfo(self._buf)
        if info.external and base_dir is None:
            raise ApolloError(EINVAL, "tensor '%s' keeps its data in an external file, but the model was "
                              "given as bytes: pass the model's path so that the file can be found "
                              "beside it" % info.external[0], tensor=info.external[0])
        self._dir = base_dir.encode() if base_dir is not None else None
        self.inputs = [{"name": n, "dtype": ELEM_NAME.get(e, "type %d" % e), "shape": d, "elem": e}
                       for n, e, d in info.inputs]
        self.input_names = [i["name"] for i in self.inputs]
        self.output_names = list(info.outputs)
        for i in self.inputs:
            if i["shape"] is None:
                raise ApolloError(EUNSUPPORTED, "graph input '%s' has no shape in the model" % i["name"],
                                  tensor=i["name"])

        self._client = client if client is not None else Client(options.get("socket"), options.get("token"),
                                                                options.get("timeout_ms", 0))
        why = config.target_listed(self.target, self._client.targets)
        if why:
            raise ConfigError(EINVAL, why)
        if not self.on_host:
            ok, why = cuda_available()
            if not ok:
                raise ApolloError(EUNSUPPORTED, "target %s runs on a CUDA GPU, and none can be used "
                                  "here (%s); target cpu runs on the host" % (self.target, why))
        self._lock = threading.Lock()
        self._cache = collections.OrderedDict()    # shape signature -> [_Entry]
        self.compiles = 0
        self.last_bundle = None
        # a model with static shapes and no integer input compiles now, so
        # that what Apollo cannot take is an error of apollo.compile
        if all(isinstance(d, int) for i in self.inputs for d in i["shape"]) and \
                not any(i["elem"] in _INT_ELEMS for i in self.inputs):
            self._entry(tuple(tuple(i["shape"]) for i in self.inputs), None)

    def __repr__(self):
        return "<apollo.CompiledModel %s -> %s, target %s, %d signatures>" % (
            ", ".join("%s %s%s" % (i["name"], i["dtype"], _shape_text(i["shape"])) for i in self.inputs),
            ", ".join(self.output_names), self.target, len(self._cache))

    # ---- the inputs of a call ------------------------------------------------------
    def _gather(self, args, kwargs):
        if len(args) > len(self.inputs):
            raise ApolloError(EINVAL, "%d inputs given, the model has %d (%s)"
                              % (len(args), len(self.inputs), ", ".join(self.input_names)))
        vals = list(args) + [None] * (len(self.inputs) - len(args))
        for k, v in kwargs.items():
            if k not in self.input_names:
                raise ApolloError(EINVAL, "unknown input '%s'%s (the model's inputs: %s)"
                                  % (k, config.suggest(k, self.input_names), ", ".join(self.input_names)),
                                  tensor=k)
            p = self.input_names.index(k)
            if p < len(args):
                raise ApolloError(EINVAL, "input '%s' given twice (by position and by name)" % k, tensor=k)
            vals[p] = v
        missing = [n for n, v in zip(self.input_names, vals) if v is None]
        if missing:
            raise ApolloError(EINVAL, "input(s) %s not given (the model's inputs: %s)"
                              % (", ".join(missing), ", ".join(self.input_names)))
        return vals

    def _check(self, vals, torch):
        """(host or device objects to bind, shapes), after checking each
        value's dtype, rank and sizes against the model's input."""
        np = _np()
        out, shapes, symbols = [], [], {}
        for p, (spec, v) in enumerate(zip(self.inputs, vals)):
            name = spec["name"]
            if _is_torch(v):
                elem = _elem_of_torch(torch, v.dtype)
                given = "%s %s" % (str(v.dtype).replace("torch.", ""), _shape_text(tuple(v.shape)))
                if self.on_host and v.device.type != "cpu":
                    raise ApolloError(EINVAL, "input '%s' is on %s, and target %s runs on the host: "
                                      "move it with .cpu(), or compile for the GPU (target sm_XX)"
                                      % (name, v.device, self.target), tensor=name)
            else:
                if not isinstance(v, np.ndarray):
                    v = np.asarray(v)
                elem = _elem_of_numpy(v.dtype)
                given = "%s %s" % (v.dtype.name, _shape_text(v.shape))
            shape = tuple(int(d) for d in v.shape)
            want = "%s %s" % (spec["dtype"], _shape_text(spec["shape"]))
            if elem != spec["elem"]:
                raise ApolloError(EINVAL, "input '%s': expected %s, given %s (dtype differs)"
                                  % (name, want, given), tensor=name)
            if len(shape) != len(spec["shape"]):
                raise ApolloError(ESHAPE, "input '%s': expected %s, given %s (rank %d, not %d)"
                                  % (name, want, given, len(shape), len(spec["shape"])), tensor=name)
            for d, (w, g) in enumerate(zip(spec["shape"], shape)):
                if isinstance(w, int):
                    if w >= 0 and w != g:
                        raise ApolloError(ESHAPE, "input '%s': expected %s, given %s (dim %d is %d, not %d)"
                                          % (name, want, given, d, g, w), tensor=name)
                elif w != "?":
                    seen = symbols.setdefault(w, (g, name))
                    if seen[0] != g:
                        raise ApolloError(ESHAPE, "input '%s': dimension '%s' is %d here but %d in input '%s'"
                                          % (name, w, g, seen[0], seen[1]), tensor=name)
            out.append(v)
            shapes.append(shape)
        return out, tuple(shapes)

    # ---- compiling one signature -----------------------------------------------------
    def _import(self, shapes, values):
        """ap_onnx_import_dir with every input bound to its shape, and the
        integer inputs in `values` ({position: ndarray}) to their values."""
        keep, ptrs = [], []
        for p, (spec, shape) in enumerate(zip(self.inputs, shapes)):
            t = ap_host_tensor()
            t.name = spec["name"].encode()
            t.dtype = spec["elem"]
            t.rank = len(shape)
            for d, n in enumerate(shape):
                t.dims[d] = n
            if values is not None and p in values:
                a = values[p]
                t.data = a.ctypes.data
                t.nbytes = a.nbytes
                keep.append(a)
            keep.append(t)
            ptrs.append(ctypes.pointer(t))
        arr = (ctypes.POINTER(ap_host_tensor) * max(1, len(ptrs)))(*ptrs)
        params = ctypes.c_void_p()
        err = new_error()
        g = lib.ap_onnx_import_dir(self._buf, len(self._buf), self._dir, arr, len(ptrs),
                                   ctypes.byref(params), ctypes.byref(err))
        if not g:
            return None, err
        return _Imported(g, params.value), None

    def _entry(self, shapes, vals):
        np = _np()
        ints = [p for p, i in enumerate(self.inputs) if i["elem"] in _INT_ELEMS]
        for e in self._cache.get(shapes, ()):
            if all(np.asarray(vals[p].cpu() if _is_torch(vals[p]) else vals[p]).tobytes() == b
                   for p, b in e.baked.items()):
                self._cache.move_to_end(shapes)
                return e
        imp, err = self._import(shapes, None)
        values = None
        if imp is None and ints and vals is not None:
            # the model may need an integer input's values at compile time
            values = {p: np.ascontiguousarray(vals[p].cpu().numpy() if _is_torch(vals[p]) else vals[p])
                      for p in ints}
            imp, err2 = self._import(shapes, values)
        if imp is None:
            raise_error(err)
        try:
            bundle = self._client.submit(imp, target=self.target, fusion=self.fusion, namespace=self.namespace,
                                         no_cache=self.no_cache, allow_tf32=self.allow_tf32,
                                         device=self.device, host_check=self.host_check)
            rt = Runtime(bundle, threads=self.threads, device=self.device)
            e = ap_error()
            if lib.ap_runtime_bind_consts(rt._rt, imp.handle, ctypes.byref(e)) < 0:
                raise_error(e)
            if imp.params and lib.ap_runtime_bind_params(rt._rt, imp.params, ctypes.byref(e)) < 0:
                raise_error(e)
        finally:
            imp.close()     # the runtime holds copies of the weights and constants
        ins, outs = [], []
        for i, b in enumerate(bundle.buffers):
            if b["kind"] == "input":
                p = self.input_names.index(b["name"]) if b["name"] in self.input_names else b["index"]
                ins.append((i, p))
            elif b["kind"] == "output":
                outs.append((b["index"], i, b["shape"], b["dtype"]))
        outs = [(i, shape, dt) for _, i, shape, dt in sorted(outs)]
        baked = {p: values[p].tobytes() for p in values
                 if p not in [q for _, q in ins]} if values else {}
        entry = _Entry(bundle, rt, ins, outs, baked)
        self._cache.setdefault(shapes, []).append(entry)
        self._cache.move_to_end(shapes)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        self.compiles += 1
        self.last_bundle = bundle
        return entry

    # ---- a call ---------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        vals = self._gather(args, kwargs)
        use_torch = any(_is_torch(v) for v in vals)
        torch = None
        if use_torch or not self.on_host:
            try:
                import torch
            except ImportError:
                if not self.on_host:
                    raise ApolloError(EUNSUPPORTED, "target %s: running on a GPU takes CUDA tensors, "
                                      "which needs torch" % self.target) from None
        vals, shapes = self._check(vals, torch)
        with self._lock:
            entry = self._entry(shapes, vals)
            self.last_bundle = entry.bundle
            if self.on_host:
                outs = self._run_host(entry, vals, use_torch, torch)
            else:
                outs = self._run_gpu(entry, vals, use_torch, torch)
        return outs[0] if len(outs) == 1 else outs

    def _run_host(self, entry, vals, use_torch, torch):
        np = _np()
        keep = []
        for buf, p in entry.inputs:
            v = vals[p]
            if _is_torch(v):
                v = v.detach().contiguous()
                if v.numel() and v.data_ptr() % 16:
                    v = v.clone()
                ptr, n = v.data_ptr(), v.numel() * v.element_size()
            else:
                v = np.ascontiguousarray(v)
                if v.size and v.ctypes.data % 16:
                    v = _aligned(np, v.shape, v.dtype)
                    v[...] = vals[p]
                ptr, n = v.ctypes.data, v.nbytes
            keep.append(v)
            entry.rt.bind(buf, ptr, n)
        outs = []
        for buf, shape, elem in entry.outputs:
            if use_torch:
                o = torch.empty(shape, dtype=_torch_dtype(torch, elem))
                ptr, n = o.data_ptr(), o.numel() * o.element_size()
            else:
                if elem not in _NP_NAME:
                    raise ApolloError(EUNSUPPORTED, "output of dtype %s: numpy has none; call with "
                                      "torch tensors" % ELEM_NAME.get(elem, elem))
                o = _aligned(np, shape, np.dtype(_NP_NAME[elem]))
                ptr, n = o.ctypes.data, o.nbytes
            entry.rt.bind(buf, ptr, n)
            outs.append(o)
        entry.rt.run()
        return outs

    def _run_gpu(self, entry, vals, use_torch, torch):
        if not torch.cuda.is_available():
            raise ApolloError(EUNSUPPORTED, "target %s: torch sees no CUDA device" % self.target)
        dev = torch.device("cuda", self.device)
        keep = []
        for buf, p in entry.inputs:
            v = vals[p]
            v = v.detach() if _is_torch(v) else torch.from_numpy(_np().ascontiguousarray(v))
            if v.device != dev:
                v = v.to(dev)
            v = v.contiguous()
            if v.numel() and v.data_ptr() % 16:
                v = v.clone()
            keep.append(v)
            entry.rt.bind(buf, v.data_ptr(), v.numel() * v.element_size())
        outs = []
        for buf, shape, elem in entry.outputs:
            o = torch.empty(shape, dtype=_torch_dtype(torch, elem), device=dev)
            entry.rt.bind(buf, o.data_ptr(), o.numel() * o.element_size())
            outs.append(o)
        stream = torch.cuda.current_stream(dev)
        entry.rt.run(stream.cuda_stream)
        if not use_torch:
            return [o.cpu().numpy() for o in outs]     # .cpu() waits for the stream
        # temporaries (copies to the device) were allocated on this stream,
        # so torch's allocator reuses them only after the launches queued here
        return outs

    @property
    def signatures(self):
        """The input-shape signatures compiled and kept, oldest first."""
        return list(self._cache)


def _aligned(np, shape, dtype):
    """An uninitialised C-contiguous array whose data is 64-byte aligned."""
    dtype = np.dtype(dtype)
    n = 1
    for d in shape:
        n *= int(d)
    raw = np.empty(n * dtype.itemsize + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off:off + n * dtype.itemsize].view(dtype).reshape(shape)


def compile(model, target="cpu", client=None, **options):
    """Compiles ONNX `model` (a path, its bytes, or an onnx.ModelProto) for
    `target` ("cpu", "sm_90", "sm_90a", "compute_80", "host:sm_90") through
    apollod and returns a CompiledModel: call it with numpy arrays or torch
    tensors, by position in the graph's input order or by input name; it
    returns the outputs (one array, or a list), of the kind it was given.

    `client`: an apollo.Client to use (else one is connected to `socket`,
    `$APOLLO_SOCKET` or the default socket, with `token` or `$APOLLO_TOKEN`).
    Options: fusion ("none", "rules", "apollo"), namespace (cache namespace),
    no_cache, allow_tf32, threads (host threads per launch), device (CUDA
    ordinal), cache_size (signatures kept, default 8), host_check,
    timeout_ms.  A wrong option, target or fusion level raises
    apollo.ConfigError here."""
    return CompiledModel(model, target, client, **options)
