"""client.py -- apollo.Client: one blocking connection to apollod (Unix
socket by default, TCP with a token when asked) through libapollo-client,
and apollo.Bundle, the compiled answer.

    c = apollo.Client()                         # $APOLLO_SOCKET or the default socket
    c = apollo.Client("host:7070", token="s3cret")
    b = c.submit(graph, target="cpu", fusion="apollo", namespace="")
    b.stats["cache_hit"], b.stats["kernels"]
    b.peak_bytes, b.workspace_bytes, b.output_bytes   # device memory of one run
    b.explain_html("graph.html")                # a picture of what was fused

Errors raise ApolloError carrying the daemon's code, message, node and
tensor; a daemon that cannot be reached raises DaemonUnavailable.  A client
is not thread-safe: use one per thread.
"""
import ctypes
import os

from ._lib import (PROGRESS_FN, ap_bundle_buffer, ap_bundle_stats, ap_device_info, ap_server_stats,
                   ap_submit_options, free,
                   lib)
from .errors import ApolloError, DaemonUnavailable, EINVAL, ENOMEM, EIO, new_error, raise_error

FUSION_LEVELS = {None: 0, "": 0, "default": 0, "none": 1, "rules": 2, "apollo": 3}
BUFFER_KINDS = ("input", "output", "param", "intermediate", "const")


class Bundle:
    """A compiled graph: kernels, launch plan, buffers and stats (apollo.Bundle)."""

    def __init__(self, handle):
        self._b = handle

    def __del__(self):
        if getattr(self, "_b", None):
            lib.ap_bundle_free(self._b)
            self._b = None

    @property
    def handle(self):
        return self._b

    def explain_html(self, path, title=None):
        """Writes the fused graph as one self-contained HTML page to `path`
        (what `apollo-client submit --explain-html` writes: every launch a
        box of its nodes, every boundary an arrow with its reason); `title`
        names the model on the page.  Raises ApolloError (EIO: the file
        could not be written)."""
        err = new_error()
        if lib.ap_report_html_file(os.fsencode(path), self._b,
                                   title.encode() if title else None, ctypes.byref(err)) < 0:
            raise_error(err)

    @classmethod
    def unpack(cls, data):
        err = new_error()
        h = lib.ap_bundle_unpack(bytes(data), len(data), ctypes.byref(err))
        if not h:
            raise_error(err)
        return cls(h)

    def pack(self):
        out = ctypes.c_void_p()
        n = ctypes.c_size_t()
        if lib.ap_bundle_pack(self._b, ctypes.byref(out), ctypes.byref(n)) < 0:
            raise ApolloError(ENOMEM, "out of memory")
        try:
            return ctypes.string_at(out, n.value)
        finally:
            free(out)

    @property
    def target(self):
        return lib.ap_bundle_target(self._b).decode()

    @property
    def n_kernels(self):
        return lib.ap_bundle_n_kernels(self._b)

    @property
    def n_launches(self):
        return lib.ap_bundle_n_launches(self._b)

    @property
    def workspace_bytes(self):
        """Bytes of the workspace holding the intermediates, laid out by
        liveness (256-byte aligned ranges reused once their last reader
        has run); the runtime allocates it whole."""
        return int(lib.ap_bundle_workspace_bytes(self._b))

    @property
    def peak_bytes(self):
        """The most device bytes held at once while the plan runs:
        input_bytes + output_bytes + const_bytes + workspace_bytes (the
        workspace is held whole for the run).  Parameters (weights) are not
        counted: they are bound where they already are."""
        return int(lib.ap_bundle_peak_bytes(self._b))

    @property
    def input_bytes(self):
        """Bytes of the graph inputs' buffers."""
        return int(lib.ap_bundle_input_bytes(self._b))

    @property
    def output_bytes(self):
        """Bytes of the graph outputs' buffers (an output that is also an
        input counted with the inputs): for a training forward, what it
        hands on, the tensors saved for the backward included."""
        return int(lib.ap_bundle_output_bytes(self._b))

    @property
    def const_bytes(self):
        """Bytes of the constants the bundle carries (the runtime allocates
        them)."""
        return int(lib.ap_bundle_const_bytes(self._b))

    @property
    def memory(self):
        """The memory figures of one run of the plan, in bytes, as a dict:
        peak_bytes, workspace_bytes, input_bytes, output_bytes, const_bytes."""
        return {"peak_bytes": self.peak_bytes, "workspace_bytes": self.workspace_bytes,
                "input_bytes": self.input_bytes, "output_bytes": self.output_bytes,
                "const_bytes": self.const_bytes}

    @property
    def stats(self):
        s = ap_bundle_stats()
        lib.ap_bundle_stats_get(self._b, ctypes.byref(s))
        return {name: getattr(s, name) for name, _ in s._fields_}

    @property
    def buffers(self):
        """One dict per buffer, in bundle order: name, kind ("input",
        "output", "param", "intermediate", or "const": bound by the runtime
        from the bundle), dtype, shape, bytes, index."""
        out = []
        for i in range(lib.ap_bundle_n_buffers(self._b)):
            b = ap_bundle_buffer()
            if lib.ap_bundle_buffer_get(self._b, i, ctypes.byref(b)) < 0:
                raise ApolloError(EINVAL, "bundle buffer %d" % i)
            out.append({"name": b.name.decode(), "kind": BUFFER_KINDS[b.kind] if b.kind < len(BUFFER_KINDS) else "?",
                        "dtype": b.dtype, "shape": tuple(b.dims[d] for d in range(max(b.rank, 0))),
                        "bytes": int(b.bytes), "index": b.index})
        return out


class Client:
    def __init__(self, address=None, token=None, timeout_ms=0):
        """`address`: None (the default socket: $APOLLO_SOCKET, else
        /tmp/apollod-<uid>.sock), a Unix socket path, "unix:PATH",
        "HOST:PORT" or "tcp:HOST:PORT"; `token` (else $APOLLO_TOKEN) for a
        daemon listening on TCP."""
        err = new_error()
        token = token if token is not None else os.environ.get("APOLLO_TOKEN")
        self._c = lib.ap_client_connect_token(address.encode() if address else None,
                                              token.encode() if token else None, ctypes.byref(err))
        if not self._c:
            raise_error(err, cls=DaemonUnavailable if err.code == EIO else ApolloError)
        if timeout_ms:
            lib.ap_client_set_timeout_ms(self._c, timeout_ms)

    def __del__(self):
        self.close()

    def close(self):
        if getattr(self, "_c", None):
            lib.ap_client_free(self._c)
            self._c = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def server(self):
        return lib.ap_client_server(self._c).decode()

    @property
    def nvrtc_version(self):
        return lib.ap_client_nvrtc_version(self._c).decode()

    @property
    def targets(self):
        return [lib.ap_client_target(self._c, i).decode() for i in range(lib.ap_client_n_targets(self._c))]

    def ping(self):
        buf = ctypes.create_string_buffer(256)
        err = new_error()
        if lib.ap_client_ping(self._c, buf, 256, ctypes.byref(err)) < 0:
            raise_error(err)
        return buf.value.decode()

    def stats(self):
        s = ap_server_stats()
        err = new_error()
        if lib.ap_client_stats(self._c, ctypes.byref(s), ctypes.byref(err)) < 0:
            raise_error(err)
        return {name: getattr(s, name) for name, _ in s._fields_}

    def submit(self, graph, target="cpu", fusion=None, namespace="", no_cache=False,
               fusion_barriers=(), keep_whole=(), max_block_threads=0, allow_tf32=False,
               device=0, driver_version=None, host_check=False, progress=None, tma=False,
               unvalidated=False):
        """Sends `graph` (an apollo.Graph; PARAMs travel as shape and dtype
        only) and waits for the bundle.  `fusion`: None (the daemon's
        default), "none", "rules" or "apollo"; `allow_tf32`: float32
        products may run on TF32 tensor cores (part of the cache key).
        GPU targets name the GPU the bundle will run on -- CUDA device
        `device` as the driver reports it (name, SM count, compute
        capability, cuDriverGetVersion), so that the daemon answers with
        output that driver loads and applies that device's measured tuning
        records; `driver_version` ("12.4") states the driver's CUDA version
        where no driver can be asked.  `host_check`: host targets (cpu,
        host:sm_XX) run in the checking mode.  `tma`: on sm_90a, GEMM tiles
        filled by TMA where the operands allow (CompileOptions.tma; not yet
        run on a GPU; part of the cache key).  `unvalidated`: every form not
        yet run on a GPU wherever it fits (on sm_90a the GEMMs' TMA form and
        the attention forward's overlap; CompileOptions.unvalidated), for
        validating them on a device.  `progress`: a callable
        progress(stage, done, total, elapsed_ms) the daemon's stage events
        are given to while it compiles ("import", "partition", ...,
        "backend" with done of total kernels, "cache"), on this thread,
        before submit returns; a warm answer usually has none.  An
        exception it raises is printed and ignored (it cannot cross C)."""
        if fusion not in FUSION_LEVELS:
            raise ApolloError(EINVAL, "fusion level %r (none, rules, apollo)" % (fusion,))
        o = ap_submit_options()
        o.target = target.encode()
        o.host_check = bool(host_check)
        dev = ap_device_info()
        if target != "cpu" and not target.startswith("host:"):
            if lib.ap_device_probe(int(device), ctypes.byref(dev), ctypes.byref(new_error())) < 0:
                dev = ap_device_info()
            if driver_version is not None:
                major, _, minor = str(driver_version).partition(".")
                dev.driver_version = int(major) * 1000 + int(minor or 0) * 10
            if dev.name or dev.driver_version:
                o.device = ctypes.pointer(dev)
        o.no_cache = bool(no_cache)
        o.cache_namespace = (namespace or "").encode()
        o.max_block_threads = max_block_threads
        o.fusion = FUSION_LEVELS[fusion]
        o.allow_tf32 = bool(allow_tf32)
        o.tma = bool(tma)
        o.unvalidated = bool(unvalidated)
        keep = [ctypes.c_char_p(s.encode()) for s in fusion_barriers]
        whole = [ctypes.c_char_p(s.encode()) for s in keep_whole]
        if keep:
            o.n_fusion_barriers = len(keep)
            o.fusion_barriers = (ctypes.c_char_p * len(keep))(*keep)
        if whole:
            o.n_keep_whole = len(whole)
            o.keep_whole = (ctypes.c_char_p * len(whole))(*whole)
        err = new_error()
        cb = None
        if progress is not None:
            def relay(_user, stage, done, total, elapsed_ms):
                progress(stage.decode(errors="replace"), done, total, elapsed_ms)
            cb = PROGRESS_FN(relay)
            lib.ap_client_set_progress(self._c, cb, None)
        try:
            h = lib.ap_client_submit_graph(self._c, graph.handle, ctypes.byref(o), ctypes.byref(err))
        finally:
            if cb is not None:
                lib.ap_client_set_progress(self._c, PROGRESS_FN(), None)
        if not h:
            raise_error(err)
        return Bundle(h)
