"""onnx_model.py -- what apollo.compile needs to know of an ONNX model
before the C importer sees it, read from the protocol-buffer wire format
here so that the package needs no `onnx`: the graph's inputs (name, element
type, dims with symbolic ones), its outputs' names, and which initializers
keep their data in an external file (the C importer, ap_onnx_import_dir,
reads that data from the model's folder; a model given as bytes has none).

Fields used (onnx.proto): ModelProto.graph = 7; GraphProto.initializer = 5,
input = 11, output = 12; ValueInfoProto.name = 1, type = 2;
TypeProto.tensor_type = 1; TypeProto.Tensor.elem_type = 1, shape = 2;
TensorShapeProto.dim = 1; Dimension.dim_value = 1, dim_param = 2;
TensorProto.name = 8, data_location = 14 (1: EXTERNAL).
"""
from .errors import EMESSAGE, ApolloError

# ONNX element types (TensorProto.DataType) -> names
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
