"""graph.py -- apollo.Graph: Apollo's graph IR (common/graph.h) built from
Python through the C library, so that shape inference, validation and the
canonical hash are the very code the daemon runs.

A graph holds tensors (VALUE made by a node; INPUT bound at launch by
position; PARAM: a weight, shape and dtype only, bound at launch by name;
CONST: a small constant carried by value, at most CONST_MAX_BYTES) and
nodes of Apollo's op set (common/ops.def: ONNX names, normalised
attributes).  `node()` appends a node and infers its outputs' dtypes and
shapes (ops whose output shape is not a function of the inputs -- Reshape,
Expand, Tile, Slice, Split -- take `shapes=`).  Tensors are referred to by
index.
"""
import ctypes

from ._lib import MAX_RANK, c_int64_p, lib
from .errors import ApolloError, EINVAL, ENOMEM, new_error, raise_error

# dtypes, numbered as ONNX's TensorProto.DataType and apollo.DataType
FLOAT32, UINT8, INT8, INT32, INT64, BOOL, FLOAT16, FLOAT64, BFLOAT16 = 1, 2, 3, 6, 7, 9, 10, 11, 16
DTYPE_NAMES = {FLOAT32: "float32", UINT8: "uint8", INT8: "int8", INT32: "int32", INT64: "int64",
               BOOL: "bool", FLOAT16: "float16", FLOAT64: "float64", BFLOAT16: "bfloat16"}
VALUE, INPUT, PARAM, CONST = 0, 1, 2, 3
CONST_MAX_BYTES = 4096
SHAPE_GIVEN = ("Reshape", "Expand", "Tile", "Slice", "Split")


def dtype_supported(dt):
    """True when graphs may carry dtype `dt` (the wire format, validation)."""
    return bool(lib.ap_dtype_in_graphs(dt))


def dtype_size(dt):
    return int(lib.ap_dtype_size(dt))


def _dims(shape):
    shape = [int(d) for d in shape]
    if len(shape) > MAX_RANK:
        raise ApolloError(EINVAL, "rank %d is more than %d" % (len(shape), MAX_RANK))
    return len(shape), (ctypes.c_int64 * max(1, len(shape)))(*shape)


class Graph:
    def __init__(self, name="graph"):
        self._g = lib.ap_graph_new(name.encode())
        if not self._g:
            raise ApolloError(ENOMEM, "out of memory")
        self._names = set()
        self._n = 0

    def __del__(self):
        self.close()

    def close(self):
        if getattr(self, "_g", None):
            lib.ap_graph_free(self._g)
            self._g = None

    @property
    def handle(self):
        return self._g

    # ---- tensors ---------------------------------------------------------
    def _uniq(self, base):
        base = base or "t"
        name, k = base, 1
        while name in self._names:
            name = "%s_%d" % (base, k)
            k += 1
        self._names.add(name)
        return name

    def add_tensor(self, name, dtype, shape, kind=VALUE, data=None):
        """Appends a tensor; returns its index.  `data` (CONST only): bytes,
        row-major little-endian."""
        rank, dims = _dims(shape)
        buf = bytes(data) if data is not None else None
        t = lib.ap_graph_add_tensor(self._g, self._uniq(name).encode(), dtype, rank, dims, kind,
                                    buf, len(buf) if buf else 0)
        if t < 0:
            raise ApolloError(t, "cannot add tensor '%s'" % name)
        return t

    def input(self, name, dtype, shape):
        t = self.add_tensor(name, dtype, shape, INPUT)
        self._check(lib.ap_graph_add_input(self._g, t), "add_input")
        return t

    def param(self, name, dtype, shape):
        return self.add_tensor(name, dtype, shape, PARAM)

    def const(self, name, dtype, shape, data):
        return self.add_tensor(name, dtype, shape, CONST, data)

    def output(self, t):
        self._check(lib.ap_graph_add_output(self._g, t), "add_output")

    def _check(self, rc, what):
        if rc < 0:
            raise ApolloError(rc, what)

    def tensor(self, t):
        """(name, dtype, shape, kind) of tensor t."""
        g = self._g.contents
        if t < 0 or t >= g.n_tensors:
            raise IndexError(t)
        x = g.tensors[t]
        return x.name.decode(), x.dtype, tuple(x.dims[i] for i in range(x.rank)), x.kind

    def shape(self, t):
        return self.tensor(t)[2]

    def is_output(self, t):
        return bool(self._g.contents.tensors[t].is_output)

    def dtype(self, t):
        return self.tensor(t)[1]

    @property
    def n_tensors(self):
        return self._g.contents.n_tensors

    @property
    def n_nodes(self):
        return self._g.contents.n_nodes

    # ---- nodes -------------------------------------------------------------
    def node(self, op, inputs, attrs=None, n_outputs=1, shapes=None, name=None, out_names=None):
        """Appends a node of op `op` reading tensors `inputs` (None: an
        optional input left out) with attributes `attrs` (int, float, str,
        list of ints, list of floats); returns its output tensor indices.
        Output dtypes and shapes are inferred; `shapes` gives them for the
        shape-given ops (one shape per output)."""
        if lib.ap_op_lookup(op.encode()) < 0:
            raise ApolloError(-4, "Apollo has no op '%s'" % op)
        name = self._uniq(name or "%s_%d" % (op, self._n))
        self._n += 1
        outs = []
        for k in range(n_outputs):
            oname = out_names[k] if out_names else "%s_out%d" % (name, k) if n_outputs > 1 else name + "_out"
            shape = shapes[k] if shapes else ()
            outs.append(self.add_tensor(oname, 0, shape, VALUE))
        ins = [-1 if i is None else int(i) for i in inputs]
        cin = (ctypes.c_int * max(1, len(ins)))(*ins)
        cout = (ctypes.c_int * max(1, len(outs)))(*outs)
        n = lib.ap_graph_add_node(self._g, name.encode(), lib.ap_op_lookup(op.encode()), len(ins), cin,
                                  len(outs), cout)
        if n < 0:
            raise ApolloError(n, "cannot add node '%s'" % name)
        for key, val in (attrs or {}).items():
            self._set_attr(n, key, val)
        err = new_error()
        if lib.ap_graph_infer_node(self._g, n, ctypes.byref(err)) < 0:
            raise_error(err)
        return outs

    def node1(self, op, inputs, attrs=None, shape=None, name=None):
        return self.node(op, inputs, attrs, 1, [shape] if shape is not None else None, name)[0]

    def _set_attr(self, n, key, val):
        k = key.encode()
        if isinstance(val, bool) or isinstance(val, int):
            rc = lib.ap_node_set_int(self._g, n, k, int(val))
        elif isinstance(val, float):
            rc = lib.ap_node_set_float(self._g, n, k, val)
        elif isinstance(val, str):
            rc = lib.ap_node_set_string(self._g, n, k, val.encode())
        elif isinstance(val, (list, tuple)) and all(isinstance(x, int) for x in val):
            arr = (ctypes.c_int64 * max(1, len(val)))(*val)
            rc = lib.ap_node_set_ints(self._g, n, k, ctypes.cast(arr, c_int64_p), len(val))
        elif isinstance(val, (list, tuple)):
            arr = (ctypes.c_double * max(1, len(val)))(*[float(x) for x in val])
            rc = lib.ap_node_set_floats(self._g, n, k, arr, len(val))
        else:
            raise ApolloError(EINVAL, "attribute '%s': unsupported value %r" % (key, val))
        if rc < 0:
            raise ApolloError(rc, "cannot set attribute '%s'" % key)

    # ---- whole graph ---------------------------------------------------------
    def validate(self):
        """Checks the graph as the daemon will (indices, dtypes, shapes,
        cycles, sizes) and sorts its nodes; raises ApolloError."""
        err = new_error()
        if lib.ap_graph_validate(self._g, ctypes.byref(err)) < 0:
            raise_error(err)

    def hash(self, named=False):
        """Canonical SHA-256 (hex) of a validated graph, independent of node
        order; of names too unless `named` (the cache key is built from the
        named hash: a bundle binds params and inputs by name)."""
        out = ctypes.create_string_buffer(32)
        fn = lib.ap_graph_hash_named if named else lib.ap_graph_hash
        if fn(self._g, out) < 0:
            raise ApolloError(ENOMEM, "out of memory hashing the graph")
        return out.raw.hex()
