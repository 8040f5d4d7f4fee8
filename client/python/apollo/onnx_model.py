"""onnx_model.py -- what apollo.compile needs to know of an ONNX model
before the C importer sees it, read from the protocol-buffer wire format
here so that the package needs no `onnx`: the graph's inputs (name, element
type, dims with symbolic ones), its outputs' names, and its initializers'
external data, which is read into the model (the C import refuses a
tensor that keeps its data in an external file).

Fields used (onnx.proto): ModelProto.graph = 7; GraphProto.initializer = 5,
input = 11, output = 12; ValueInfoProto.name = 1, type = 2;
TypeProto.tensor_type = 1; TypeProto.Tensor.elem_type = 1, shape = 2;
TensorShapeProto.dim = 1; Dimension.dim_value = 1, dim_param = 2;
TensorProto.dims = 1, data_type = 2, name = 8, raw_data = 9,
external_data = 13 (StringStringEntryProto key = 1, value = 2),
data_location = 14 (1: EXTERNAL).
"""
import os

from .errors import EINVAL, EIO, EMESSAGE, ApolloError

# ONNX element types (TensorProto.DataType) -> bytes per element
ELEM_SIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2}
ELEM_NAME = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
             8: "string", 9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64",
             16: "bfloat16"}


def _bad(msg):
    return ApolloError(EMESSAGE, "not an ONNX model: %s" % msg)


def _varint(buf, i, end):
    v = shift = 0
    while True:
        if i >= end or shift > 63:
            raise _bad("truncated varint")
        c = buf[i]
        i += 1
        v |= (c & 0x7f) << shift
        shift += 7
        if c < 0x80:
            return v, i


def _enc_varint(v):
    out = bytearray()
    while True:
        c = v & 0x7f
        v >>= 7
        out.append(c | (0x80 if v else 0))
        if not v:
            return bytes(out)


def fields(buf, start=0, end=None):
    """(field number, wire type, value, field start, field end) of each field
    of the message in buf[start:end]; value is an int (varint, fixed) or a
    (start, end) pair into buf (length-delimited)."""
    end = len(buf) if end is None else end
    i = start
    while i < end:
        f0 = i
        key, i = _varint(buf, i, end)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i, end)
        elif wt == 1:
            v, i = int.from_bytes(buf[i:i + 8], "little"), i + 8
        elif wt == 2:
            n, i = _varint(buf, i, end)
            v, i = (i, i + n), i + n
        elif wt == 5:
            v, i = int.from_bytes(buf[i:i + 4], "little"), i + 4
        else:
            raise _bad("wire type %d" % wt)
        if i > end:
            raise _bad("a field runs past its message")
        yield num, wt, v, f0, i


def _str(buf, span):
    return bytes(buf[span[0]:span[1]]).decode("utf-8", errors="replace")


def _sub(buf, span, num):
    """The first length-delimited field `num` of the message at span."""
    for n, wt, v, _, _ in fields(buf, *span):
        if n == num and wt == 2:
            return v
    return None


def _value_info(buf, span):
    """(name, elem_type or 0, dims or None); a dim is an int, or the str of
    its symbol ("?" when unnamed)."""
    name, elem, dims = "", 0, None
    for n, wt, v, _, _ in fields(buf, *span):
        if n == 1 and wt == 2:
            name = _str(buf, v)
        elif n == 2 and wt == 2:
            tt = _sub(buf, v, 1)
            if tt is None:
                continue
            for n2, wt2, v2, _, _ in fields(buf, *tt):
                if n2 == 1 and wt2 == 0:
                    elem = v2
                elif n2 == 2 and wt2 == 2:
                    dims = []
                    for n3, wt3, v3, _, _ in fields(buf, *v2):
                        if n3 != 1 or wt3 != 2:
                            continue
                        d = "?"
                        for n4, wt4, v4, _, _ in fields(buf, *v3):
                            if n4 == 1 and wt4 == 0:
                                d = v4 - (1 << 64) if v4 >= 1 << 63 else v4
                            elif n4 == 2 and wt4 == 2:
                                d = _str(buf, v4) or "?"
                        dims.append(d)
    return name, elem, dims


class ModelInfo:
    """The inputs (not initializers), outputs and external-data tensors of
    the serialized ModelProto `buf`."""

    def __init__(self, buf):
        graph = None
        for n, wt, v, _, _ in fields(buf):
            if n == 7 and wt == 2:
                graph = v
        if graph is None:
            raise _bad("no graph (ModelProto field 7)")
        self.graph_span = graph
        inits, inputs, self.outputs, self.external = set(), [], [], []
        for n, wt, v, f0, f1 in fields(buf, *graph):
            if n == 5 and wt == 2:
                name, ext = "", False
                for n2, wt2, v2, _, _ in fields(buf, *v):
                    if n2 == 8 and wt2 == 2:
                        name = _str(buf, v2)
                    elif n2 == 14 and wt2 == 0 and v2 == 1:
                        ext = True
                inits.add(name)
                if ext:
                    self.external.append(name)
            elif n == 11 and wt == 2:
                inputs.append(_value_info(buf, v))
            elif n == 12 and wt == 2:
                self.outputs.append(_value_info(buf, v)[0])
        # IR < 4 lists initializers among the inputs: they are weights
        self.inputs = [i for i in inputs if i[0] not in inits]


def _tensor_external(buf, span, base_dir, name_hint):
    """The TensorProto at span with its external data read into raw_data
    (fields 13 and 14 dropped): the new message's bytes."""
    dims, dtype, name, ext = [], 0, name_hint, {}
    keep = []
    for n, wt, v, f0, f1 in fields(buf, *span):
        if n == 1 and wt == 0:
            dims.append(v)
        elif n == 1 and wt == 2:
            i = v[0]
            while i < v[1]:
                d, i = _varint(buf, i, v[1])
                dims.append(d)
        elif n == 2 and wt == 0:
            dtype = v
        elif n == 8 and wt == 2:
            name = _str(buf, v)
        if n == 13 and wt == 2:
            k = _sub(buf, v, 1)
            val = _sub(buf, v, 2)
            if k is not None:
                ext[_str(buf, k)] = _str(buf, val) if val is not None else ""
            continue
        if n == 14:
            continue
        keep.append(bytes(buf[f0:f1]))
    where = "tensor '%s' keeps its data in an external file" % name
    loc = ext.get("location", "")
    if not loc:
        raise ApolloError(EINVAL, "%s with no location" % where, tensor=name)
    if base_dir is None:
        raise ApolloError(EINVAL, "%s ('%s'), but the model was given as bytes: pass the model's "
                          "path so that the file can be found beside it" % (where, loc), tensor=name)
    root = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(root, loc))
    if os.path.isabs(loc) or os.path.commonpath([root, path]) != root:
        raise ApolloError(EINVAL, "%s ('%s') outside the model's folder %s: refused"
                          % (where, loc, root), tensor=name)
    try:
        offset = int(ext.get("offset", "0") or 0)
        length = int(ext["length"]) if ext.get("length") else None
    except ValueError:
        raise ApolloError(EINVAL, "%s: offset/length are not numbers" % where, tensor=name) from None
    numel = 1
    for d in dims:
        numel *= d
    want = numel * ELEM_SIZE.get(dtype, 0) if dtype in ELEM_SIZE else None
    if length is None:
        length = want
    if want is not None and length != want:
        raise ApolloError(EINVAL, "%s of %d bytes, but its dims and dtype make %d"
                          % (where, length, want), tensor=name)
    try:
        size = os.path.getsize(path)
        if offset < 0 or length is None or offset + length > size:
            raise ApolloError(EIO, "%s: '%s' is %d bytes, too short for %s bytes at offset %d"
                              % (where, loc, size, length, offset), tensor=name)
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(length)
    except OSError as e:
        raise ApolloError(EIO, "%s: cannot read '%s': %s" % (where, path, e.strerror), tensor=name) from None
    if len(data) != length:
        raise ApolloError(EIO, "%s: '%s' ended early" % (where, loc), tensor=name)
    return b"".join(keep) + b"\x4a" + _enc_varint(len(data)) + data


def inline_external(buf, info, base_dir):
    """`buf` with the data of every initializer that keeps it in an external
    file (info.external) read in as raw_data: the location relative to
    `base_dir` (the model's folder), confined to it; offset and length
    checked against the file and against the tensor's dims."""
    g0, g1 = info.graph_span
    graph = []
    for n, wt, v, f0, f1 in fields(buf, g0, g1):
        if n == 5 and wt == 2 and any(n2 == 14 and wt2 == 0 and v2 == 1
                                      for n2, wt2, v2, _, _ in fields(buf, *v)):
            t = _tensor_external(buf, v, base_dir, "?")
            graph.append(b"\x2a" + _enc_varint(len(t)) + t)
        else:
            graph.append(bytes(buf[f0:f1]))
    graph = b"".join(graph)
    model = []
    for n, wt, v, f0, f1 in fields(buf):
        if n == 7 and wt == 2 and v == (g0, g1):
            model.append(b"\x3a" + _enc_varint(len(graph)) + graph)
        else:
            model.append(bytes(buf[f0:f1]))
    return b"".join(model)
