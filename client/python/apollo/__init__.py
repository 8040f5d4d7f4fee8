"""apollo -- Python client of the Apollo kernel-fusion daemon.

    import apollo
    g = apollo.Graph("mlp")
    x = g.input("x", apollo.FLOAT32, [4, 8])
    w = g.param("w", apollo.FLOAT32, [8, 16])
    y = g.node1("Relu", [g.node1("MatMul", [x, w])])
    g.output(y)
    bundle = apollo.Client().submit(g, target="cpu")
    rt = apollo.Runtime(bundle)        # bind data pointers, run

    model = apollo.compile("model.onnx", target="cpu")   # an ONNX model as a callable
    y = model(x)                       # numpy arrays (or torch tensors) in and out

The wire format lives in the C library (libapollo-client.so, built from
proto/apollo.proto); this package reaches it through ctypes.  The PyTorch
backend, `torch.compile(model, backend="apollo")`, is apollo.torch_backend
(imported only when torch is asked for).
"""
from .client import Bundle, Client
from .compiled import CompiledModel, compile
from .errors import ApolloError, ConfigError, DaemonUnavailable
from .graph import (BFLOAT16, BOOL, CONST, CONST_MAX_BYTES, DTYPE_NAMES, FLOAT16, FLOAT32, FLOAT64,
                    INPUT, INT8, INT32, INT64, PARAM, UINT8, VALUE, Graph, dtype_size, dtype_supported)
from .runtime import Runtime, cuda_available

__version__ = "0.1.0"
__all__ = ["compile", "CompiledModel", "Bundle", "Client", "ApolloError", "ConfigError", "DaemonUnavailable", "Graph", "Runtime",
           "cuda_available", "dtype_supported", "dtype_size", "FLOAT32", "FLOAT16", "BFLOAT16",
           "FLOAT64", "INT8", "UINT8", "INT32", "INT64", "BOOL", "VALUE", "INPUT", "PARAM", "CONST",
           "CONST_MAX_BYTES", "DTYPE_NAMES"]
