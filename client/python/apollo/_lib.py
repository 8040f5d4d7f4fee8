"""_lib.py -- the one place that talks to libapollo-client.so (ctypes).

Apollo's wire format has one definition, proto/apollo.proto, compiled into
the C library (protobuf-c); this package never encodes a message itself.
It loads build/libapollo-client.so -- framing, handshake, submit, bundles,
the graph IR with shape inference and validation, the runtime that runs a
bundle on the host or through the CUDA driver API -- and declares the
prototypes and structs it uses, mirrored from client/apollo.h,
client/runtime.h, common/graph.h and common/base.h.

Where the library is found, first hit wins: $APOLLO_LIB; the copy installed
inside this package; ../../build/ of a source checkout (client/python/apollo
-> the repository root).
"""
import ctypes
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
MAX_RANK = 8

c_int64_p = ctypes.POINTER(ctypes.c_int64)
c_int_p = ctypes.POINTER(ctypes.c_int)


class ap_error(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("msg", ctypes.c_char * 512),
                ("node", ctypes.c_char * 128), ("tensor", ctypes.c_char * 128)]


class ap_tensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int),
                ("dims", ctypes.c_int64 * MAX_RANK), ("kind", ctypes.c_int),
                ("data", ctypes.c_void_p), ("nbytes", ctypes.c_size_t),
                ("producer", ctypes.c_int), ("is_output", ctypes.c_bool)]


class ap_graph(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("n_tensors", ctypes.c_int), ("cap_tensors", ctypes.c_int),
                ("tensors", ctypes.POINTER(ap_tensor)), ("n_nodes", ctypes.c_int),
                ("cap_nodes", ctypes.c_int), ("nodes", ctypes.c_void_p),
                ("n_inputs", ctypes.c_int), ("inputs", c_int_p),
                ("n_outputs", ctypes.c_int), ("outputs", c_int_p),
                ("eager_kernels", ctypes.c_uint)]


class ap_host_tensor(ctypes.Structure):
    """common/graph.h's ap_host_tensor: a binding of ap_onnx_import (a
    graph input's shape, with data NULL, or an integer input's value)."""
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int),
                ("dims", ctypes.c_int64 * MAX_RANK), ("data", ctypes.c_void_p), ("nbytes", ctypes.c_size_t)]


class ap_device_info(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 128), ("sm_count", ctypes.c_uint), ("cc_major", ctypes.c_uint),
                ("cc_minor", ctypes.c_uint), ("driver_version", ctypes.c_uint)]


class ap_submit_options(ctypes.Structure):
    _fields_ = [("target", ctypes.c_char_p), ("output", ctypes.c_int), ("no_cache", ctypes.c_bool),
                ("cache_namespace", ctypes.c_char_p), ("max_block_threads", ctypes.c_uint),
                ("fusion", ctypes.c_int), ("n_fusion_barriers", ctypes.c_int),
                ("fusion_barriers", ctypes.POINTER(ctypes.c_char_p)), ("n_keep_whole", ctypes.c_int),
                ("keep_whole", ctypes.POINTER(ctypes.c_char_p)), ("allow_tf32", ctypes.c_bool),
                ("no_layer1", ctypes.c_bool), ("no_tune", ctypes.c_bool), ("tma", ctypes.c_bool),
                ("tune_variant", ctypes.c_uint),
                ("device", ctypes.POINTER(ap_device_info)), ("host_check", ctypes.c_bool),
                ("unvalidated", ctypes.c_bool)]


class ap_server_stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("requests", "errors", "cache_hits", "cache_misses",
                                               "kernels_compiled", "cache_entries", "cache_blob_bytes")] + \
               [("clients", ctypes.c_uint), ("in_flight", ctypes.c_uint), ("uptime_s", ctypes.c_double)]


class ap_bundle_stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint) for n in ("kernels", "eager_kernels", "nodes", "kernels_compiled",
                                             "distinct_kernels", "layer1", "layer2", "layer3")] + \
               [(n, ctypes.c_uint64) for n in ("global_bytes", "eager_bytes", "min_bytes")] + \
               [(n, ctypes.c_double) for n in ("import_ms", "partition_ms", "codegen_ms", "backend_ms",
                                               "cache_ms", "compile_ms")] + \
               [("cache_hit", ctypes.c_bool), ("cache_tier", ctypes.c_int), ("kernels_remote", ctypes.c_uint),
                ("kernels_shared", ctypes.c_uint), ("layer1_ms", ctypes.c_double)] + \
               [(n, ctypes.c_uint) for n in ("tune_hits", "tune_measured", "tune_searched", "tune_tried")] + \
               [("tune_ms", ctypes.c_double), ("tune_capped", ctypes.c_uint)] + \
               [(n, ctypes.c_uint64) for n in ("peak_bytes", "input_bytes", "output_bytes", "const_bytes")]


class ap_bundle_buffer(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("kind", ctypes.c_int), ("dtype", ctypes.c_int),
                ("rank", ctypes.c_int), ("dims", ctypes.c_int64 * MAX_RANK), ("bytes", ctypes.c_uint64),
                ("offset", ctypes.c_uint64), ("index", ctypes.c_int)]


class ap_runtime_options(ctypes.Structure):
    _fields_ = [("threads", ctypes.c_int), ("device", ctypes.c_int), ("external", ctypes.c_bool),
                ("profile", ctypes.c_bool)]


_P = ctypes.c_void_p
_E = ctypes.POINTER(ap_error)
# ap_progress_fn: (user, stage, done, total, elapsed_ms), apollo.h
PROGRESS_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint,
                               ctypes.c_double)
# name: (restype, argtypes)
_PROTOS = {
    "ap_abi_sizeof": (ctypes.c_size_t, [ctypes.c_char_p]),
    "ap_abi_field": (ctypes.c_char_p, [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_size_t)]),
    "ap_error_name": (ctypes.c_char_p, [ctypes.c_int]),
    "ap_dtype_in_graphs": (ctypes.c_bool, [ctypes.c_int]),
    "ap_dtype_size": (ctypes.c_size_t, [ctypes.c_int]),
    "ap_op_lookup": (ctypes.c_int, [ctypes.c_char_p]),
    "ap_graph_new": (ctypes.POINTER(ap_graph), [ctypes.c_char_p]),
    "ap_graph_free": (_P, [_P]),
    "ap_graph_add_tensor": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_int, ctypes.c_int, c_int64_p,
                                           ctypes.c_int, _P, ctypes.c_size_t]),
    "ap_graph_add_node": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_int, ctypes.c_int, c_int_p,
                                         ctypes.c_int, c_int_p]),
    "ap_graph_add_input": (ctypes.c_int, [_P, ctypes.c_int]),
    "ap_graph_add_output": (ctypes.c_int, [_P, ctypes.c_int]),
    "ap_graph_infer_node": (ctypes.c_int, [_P, ctypes.c_int, _E]),
    "ap_graph_validate": (ctypes.c_int, [_P, _E]),
    "ap_graph_hash": (ctypes.c_int, [_P, ctypes.c_char_p]),
    "ap_graph_hash_named": (ctypes.c_int, [_P, ctypes.c_char_p]),
    "ap_node_set_int": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_char_p, ctypes.c_int64]),
    "ap_node_set_float": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_char_p, ctypes.c_double]),
    "ap_node_set_string": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p]),
    "ap_node_set_ints": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_char_p, c_int64_p, ctypes.c_int]),
    "ap_node_set_floats": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_char_p,
                                          ctypes.POINTER(ctypes.c_double), ctypes.c_int]),
    "ap_onnx_import": (ctypes.POINTER(ap_graph), [ctypes.c_char_p, ctypes.c_size_t,
                                                  ctypes.POINTER(ctypes.POINTER(ap_host_tensor)), ctypes.c_int,
                                                  ctypes.POINTER(ctypes.c_void_p), _E]),
    "ap_onnx_import_dir": (ctypes.POINTER(ap_graph), [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                                                      ctypes.POINTER(ctypes.POINTER(ap_host_tensor)),
                                                      ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), _E]),
    "ap_params_free": (_P, [_P]),
    "ap_client_connect_token": (_P, [ctypes.c_char_p, ctypes.c_char_p, _E]),
    "ap_client_free": (_P, [_P]),
    "ap_client_set_timeout_ms": (ctypes.c_int, [_P, ctypes.c_uint]),
    "ap_client_set_progress": (None, [_P, PROGRESS_FN, _P]),
    "ap_client_server": (ctypes.c_char_p, [_P]),
    "ap_client_nvrtc_version": (ctypes.c_char_p, [_P]),
    "ap_client_n_targets": (ctypes.c_int, [_P]),
    "ap_client_target": (ctypes.c_char_p, [_P, ctypes.c_int]),
    "ap_client_ping": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_size_t, _E]),
    "ap_client_stats": (ctypes.c_int, [_P, ctypes.POINTER(ap_server_stats), _E]),
    "ap_client_submit_graph": (_P, [_P, _P, ctypes.POINTER(ap_submit_options), _E]),
    "ap_device_probe": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ap_device_info), _E]),
    "ap_bundle_free": (_P, [_P]),
    "ap_bundle_unpack": (_P, [ctypes.c_char_p, ctypes.c_size_t, _E]),
    "ap_bundle_pack": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]),
    "ap_bundle_target": (ctypes.c_char_p, [_P]),
    "ap_bundle_workspace_bytes": (ctypes.c_uint64, [_P]),
    "ap_bundle_peak_bytes": (ctypes.c_uint64, [_P]),
    "ap_bundle_input_bytes": (ctypes.c_uint64, [_P]),
    "ap_bundle_output_bytes": (ctypes.c_uint64, [_P]),
    "ap_bundle_const_bytes": (ctypes.c_uint64, [_P]),
    "ap_bundle_n_kernels": (ctypes.c_int, [_P]),
    "ap_bundle_n_launches": (ctypes.c_int, [_P]),
    "ap_bundle_n_buffers": (ctypes.c_int, [_P]),
    "ap_bundle_buffer_get": (ctypes.c_int, [_P, ctypes.c_int, ctypes.POINTER(ap_bundle_buffer)]),
    "ap_bundle_stats_get": (None, [_P, ctypes.POINTER(ap_bundle_stats)]),
    "ap_report_html_file": (ctypes.c_int, [ctypes.c_char_p, _P, ctypes.c_char_p, _E]),
    "ap_runtime_new": (_P, [_P, ctypes.POINTER(ap_runtime_options), _E]),
    "ap_runtime_free": (_P, [_P]),
    "ap_runtime_bind_ptr": (ctypes.c_int, [_P, ctypes.c_int, _P, ctypes.c_uint64, _E]),
    "ap_runtime_bind_params": (ctypes.c_int, [_P, _P, _E]),
    "ap_runtime_bind_consts": (ctypes.c_int, [_P, _P, _E]),
    "ap_runtime_run_stream": (ctypes.c_int, [_P, _P, _E]),
    "ap_runtime_cuda_available": (ctypes.c_bool, [ctypes.c_char_p, ctypes.c_size_t]),
}


def _candidates():
    env = os.environ.get("APOLLO_LIB")
    if env:
        yield env
    yield os.path.join(_HERE, "libapollo-client.so")
    yield os.path.normpath(os.path.join(_HERE, "..", "..", "..", "build", "libapollo-client.so"))


def _check_abi(lib, path):
    """Each struct mirrored here has the size the library was built with,
    and the same fields at the same offsets (ap_abi_field): a field added
    on one side only would have C read or write past the end of a buffer
    allocated here, or leave a value in padding the other side reads."""
    for st in (ap_error, ap_tensor, ap_graph, ap_submit_options, ap_device_info, ap_server_stats,
               ap_bundle_stats, ap_bundle_buffer, ap_runtime_options, ap_host_tensor):
        want = lib.ap_abi_sizeof(st.__name__.encode())
        if want != ctypes.sizeof(st):
            raise ImportError("apollo: %s is %d bytes in %s but %d in this package: the library and "
                              "the package come from different versions" % (st.__name__, want, path,
                                                                            ctypes.sizeof(st)))
        theirs, off = [], ctypes.c_size_t()
        while True:
            name = lib.ap_abi_field(st.__name__.encode(), len(theirs), ctypes.byref(off))
            if name is None:
                break
            theirs.append((name.decode(), off.value))
        ours = [(f[0], getattr(st, f[0]).offset) for f in st._fields_]
        if theirs != ours:
            diff = next((i for i in range(max(len(ours), len(theirs)))
                         if i >= len(ours) or i >= len(theirs) or ours[i] != theirs[i]), 0)
            raise ImportError("apollo: %s's field %d is %s in %s but %s in this package: the library and "
                              "the package come from different versions" % (
                                  st.__name__, diff, "%s at byte %d" % theirs[diff] if diff < len(theirs) else "absent",
                                  path, "%s at byte %d" % ours[diff] if diff < len(ours) else "absent"))


def _load():
    tried = []
    for path in _candidates():
        if not os.path.exists(path):
            tried.append(path)
            continue
        lib = ctypes.CDLL(path)
        for name, (res, args) in _PROTOS.items():
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args
        lib.path = path
        _check_abi(lib, path)
        return lib
    raise ImportError("apollo: libapollo-client.so not found (tried %s); build it with `make` "
                      "in the Apollo repository or set APOLLO_LIB" % ", ".join(tried))


lib = _load()
free = ctypes.CDLL(None).free
free.argtypes = [ctypes.c_void_p]
free.restype = None
