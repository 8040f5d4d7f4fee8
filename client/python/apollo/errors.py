"""errors.py -- ApolloError: what a failed call of the C library, or the
daemon, said.  `code` is the library's negative AP_E* code (common/base.h),
`name` its short name ("invalid graph"), `message`, and the graph `node`
and `tensor` the error concerns ("" when none).  The daemon's own error
replies arrive through the same record (its apollo.ErrorCode mapped to the
AP_E* code)."""
from ._lib import ap_error, lib

# Negative codes, as common/base.h numbers them.
EFRAME, EMESSAGE, EINVAL, EUNSUPPORTED, ESHAPE, ETOOLARGE = -1, -2, -3, -4, -5, -6
ECOMPILE, EINTERNAL, EBUSY, EVERSION, ENOMEM, EIO = -7, -8, -9, -10, -11, -12


class ApolloError(Exception):
    def __init__(self, code, message, node="", tensor=""):
        self.code = code
        self.name = lib.ap_error_name(code).decode()
        self.message = message
        self.node = node
        self.tensor = tensor
        where = ""
        if node:
            where += " (node %s)" % node
        if tensor:
            where += " (tensor %s)" % tensor
        # Exception's own __init__, not super(): the torch backend mixes a
        # class of Dynamo's into ConfigError (see torch_backend.py)
        Exception.__init__(self, "%s: %s%s" % (self.name, message, where))


class DaemonUnavailable(ApolloError):
    """No apollod answered at the address (code EIO)."""


class ConfigError(ApolloError):
    """A configuration the caller gave is wrong (code EINVAL): an unknown
    option, target or fusion level, an option value of the wrong kind;
    name "invalid configuration"."""

    def __init__(self, code, message, node="", tensor=""):
        ApolloError.__init__(self, code, message, node, tensor)
        self.name = "invalid configuration"
        Exception.__init__(self, "%s: %s" % (self.name, message))


def new_error():
    return ap_error()


def raise_error(err, code=None, cls=ApolloError):
    code = err.code if err.code else (code if code is not None else EINTERNAL)
    raise cls(code, err.msg.decode(errors="replace"), err.node.decode(errors="replace"),
              err.tensor.decode(errors="replace"))
