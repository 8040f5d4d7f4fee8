"""runtime.py -- apollo.Runtime: runs a bundle with the C runtime
(client/runtime.h): target "cpu" by loading its host shared objects,
"sm_XX"/"compute_XX" through the CUDA driver API (cuModuleLoadData,
cuLaunchKernel) on the caller's stream.

Every input, param and output buffer is bound to the caller's memory by
address (`bind(buffer, ptr, nbytes)`: a host address for cpu, a device
address for CUDA targets) -- no copies; the runtime owns only the workspace
of intermediates.  Buffers are numbered as Bundle.buffers lists them; a
framework binds its tensors' data pointers (see torch_backend.py).
"""
import ctypes

from ._lib import ap_runtime_options, lib
from .errors import new_error, raise_error


class Runtime:
    def __init__(self, bundle, threads=0, device=0):
        o = ap_runtime_options(threads, device, True)
        err = new_error()
        self._bundle = bundle       # the runtime borrows it
        self._rt = lib.ap_runtime_new(bundle.handle, ctypes.byref(o), ctypes.byref(err))
        if not self._rt:
            raise_error(err)
        self._err = new_error()

    def __del__(self):
        if getattr(self, "_rt", None):
            lib.ap_runtime_free(self._rt)
            self._rt = None

    def bind(self, buffer, ptr, nbytes):
        """Binds buffer `buffer` (index into Bundle.buffers) to memory at
        `ptr` (int address), `nbytes` long, 16-byte aligned."""
        if lib.ap_runtime_bind_ptr(self._rt, buffer, ptr, nbytes, ctypes.byref(self._err)) < 0:
            raise_error(self._err)

    def run(self, stream=0):
        """Runs the plan: on the host it returns when done; on a GPU the
        launches are queued on `stream` (a CUstream handle as an int; 0 =
        the default stream, then waited for)."""
        if lib.ap_runtime_run_stream(self._rt, stream or None, ctypes.byref(self._err)) < 0:
            raise_error(self._err)


def cuda_available():
    """(True, "") when a CUDA driver with a device can be used, else (False, why)."""
    why = ctypes.create_string_buffer(256)
    ok = bool(lib.ap_runtime_cuda_available(why, 256))
    return ok, why.value.decode()
