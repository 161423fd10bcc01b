"""Building a topos_pb2.Spec node by node, and reading the canonical
encoding (docs/encoding.md) into one.

A Spec is the tape dtype and the nodes in order: op, operands (indices of
earlier nodes), name, the attributes the op reads and, for leaves, a
tensor.  The daemon replays every node through the engine (so shapes and
dtypes are checked there, with the engine's messages) and names the spec
by the SHA-256 of its canonical encoding.

    s = topos.Spec("f64")
    w, x, y = s.param(0.0, "w"), s.input(0.0, "x"), s.input(0.0, "y")
    r = w * x - y
    s.name(r * r, "loss")
"""
import struct

import numpy as np

from ._proto import topos_pb2 as pb
from ._tensor import dtype_of, to_tensor

# op name -> (code, arity, attributes it reads, in the canonical order).
# The numbering is the engine's frozen op list (engine/ops.h), which the
# proto's Op enum repeats; arity None: one or more (concat).
OPS = {
    "constant": (0, 0, ("tensor",)),
    "parameter": (1, 0, ("slot", "tensor")),
    "input": (2, 0, ("slot", "tensor")),
    "add": (3, 2, ()),
    "sub": (4, 2, ()),
    "mul": (5, 2, ()),
    "div": (6, 2, ()),
    "neg": (7, 1, ()),
    "exp": (8, 1, ()),
    "log": (9, 1, ()),
    "sqrt": (10, 1, ()),
    "tanh": (11, 1, ()),
    "pow": (12, 1, ("p",)),
    "maximum": (13, 2, ()),
    "step": (14, 2, ()),
    "relu": (15, 1, ()),
    "matmul": (16, 2, ()),
    "transpose": (17, 1, ()),
    "permute": (18, 1, ("perm",)),
    "reshape": (19, 1, ("shape",)),
    "narrow": (20, 1, ("axis", "start", "length")),
    "pad": (21, 1, ("axis", "before", "after")),
    "unfold": (22, 1, ("axis", "size", "step", "dilation")),
    "fold": (23, 1, ("axis", "extent", "size", "step", "dilation")),
    "concat": (24, None, ("axis",)),
    "broadcast": (25, 1, ("shape",)),
    "broadcast_along": (26, 1, ("axis", "extent")),
    "sum": (27, 1, ()),
    "sum_along": (28, 1, ("axis",)),
    "max_along": (29, 1, ("axis",)),
    "log_softmax": (30, 1, ("axis",)),
    "logsumexp": (31, 1, ("axis",)),
    "gather": (32, 2, ()),
    "scatter": (33, 2, ("extent",)),
    "erf": (34, 1, ()),
}
_BY_CODE = {code: (name, arity, attrs)
            for name, (code, arity, attrs) in OPS.items()}
_INT_ATTRS = ("axis", "start", "length", "before", "after", "size", "step",
              "dilation", "extent")


class Ref:
    """A node of a Spec being built: its index, with arithmetic that
    records nodes (+ - * / unary -, @ for matmul, ** for pow)."""

    __slots__ = ("spec", "index")

    def __init__(self, spec, index):
        self.spec = spec
        self.index = index

    def __repr__(self):
        n = self.spec.nodes[self.index]
        return "<topos.Ref %%%d %s%s>" % (
            self.index, pb.Op.Name(n.op).lower(),
            " %r" % n.name if n.name else "")

    def name(self, name):
        """Names the node (a value reachable by name); returns it."""
        return self.spec.name(self, name)

    def __add__(self, o):
        return self.spec.add(self, o)

    def __sub__(self, o):
        return self.spec.sub(self, o)

    def __mul__(self, o):
        return self.spec.mul(self, o)

    def __truediv__(self, o):
        return self.spec.div(self, o)

    def __matmul__(self, o):
        return self.spec.matmul(self, o)

    def __neg__(self):
        return self.spec.neg(self)

    def __pow__(self, p):
        return self.spec.pow(self, p)


class Spec:
    """A spec under construction: `Spec(dtype)` with dtype "f32", "f64"
    or "bf16" (the tape's floating dtype), then one method per op, each
    appending a node and returning its Ref.  Leaves (param, input,
    constant) take a value that numpy can read: floating values are
    converted to the tape's dtype, integers become i32 (indices for
    gather and cross-entropy targets); `dtype=` overrides.  Every method
    takes `name=`.  Record it with Client.record(spec); `proto()` is the
    topos_pb2.Spec."""

    def __init__(self, dtype="f64"):
        self.dtype = dtype_of(dtype)
        if self.dtype == pb.I32:
            raise ValueError("a tape's dtype is floating: f32, f64 or bf16")
        self.nodes = []

    def __len__(self):
        return len(self.nodes)

    def proto(self):
        """The topos_pb2.Spec (a copy)."""
        return pb.Spec(dtype=self.dtype, nodes=self.nodes)

    def SerializeToString(self):
        return self.proto().SerializeToString()

    def _index(self, v):
        if isinstance(v, Ref):
            if v.spec is not self:
                raise ValueError("%r is a node of another Spec" % (v,))
            return v.index
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            if not 0 <= int(v) < len(self.nodes):
                raise IndexError("no node %d (the spec has %d)" %
                                 (v, len(self.nodes)))
            return int(v)
        if isinstance(v, str):
            for i, n in enumerate(self.nodes):
                if n.name == v:
                    return i
            raise KeyError("no node named %r" % v)
        raise TypeError("an operand is a Ref, a node index or a name, "
                        "not %r (record constants with constant())" % (v,))

    def _append(self, node):
        self.nodes.append(node)
        return Ref(self, len(self.nodes) - 1)

    def name(self, ref, name):
        """Names node `ref` (a Ref or an index); returns its Ref."""
        i = self._index(ref)
        self.nodes[i].name = name
        return Ref(self, i)

    def _leaf(self, op, value, name, dtype):
        arr = np.asarray(value)
        if dtype is None:
            is_int = arr.dtype.kind in "iu" and arr.dtype != np.uint16
            dtype = pb.I32 if is_int else self.dtype
        node = pb.Node(op=op, tensor=to_tensor(arr, dtype, splat=True))
        if name:
            node.name = name
        return self._append(node)

    def param(self, value, name=None, dtype=None):
        """A parameter with initial value `value` (its slot is its
        position among the parameters)."""
        return self._leaf(pb.PARAMETER, value, name, dtype)

    parameter = param

    def input(self, value, name=None, dtype=None):
        """An input with default `value` (the feeds' shape and dtype)."""
        return self._leaf(pb.INPUT, value, name, dtype)

    def constant(self, value, name=None, dtype=None):
        return self._leaf(pb.CONSTANT, value, name, dtype)

    def op(self, op, *operands, name=None, **attrs):
        """Any op by its name (OPS) with its attributes: axis, start,
        length, before, after, size, step, dilation, extent, p, perm,
        shape.  Each op reads only the attributes it names."""
        try:
            code, arity, reads = OPS[op]
        except KeyError:
            raise ValueError("unknown op %r" % (op,)) from None
        if arity == 0:
            raise ValueError("record leaves with param, input or constant")
        if arity is None and len(operands) == 1 and isinstance(
                operands[0], (list, tuple)):
            operands = tuple(operands[0])
        if (arity is None and not operands) or (
                arity is not None and len(operands) != arity):
            raise TypeError("%s takes %s operand%s, not %d" % (
                op, "one or more" if arity is None else arity,
                "" if arity == 1 else "s", len(operands)))
        unread = set(attrs) - set(reads)
        if unread:
            raise TypeError("%s does not read %s (it reads: %s)" % (
                op, ", ".join(sorted(unread)), ", ".join(reads) or "none"))
        missing = [a for a in reads if a not in attrs and a not in (
            "dilation",)]
        if missing:
            raise TypeError("%s needs %s" % (op, ", ".join(missing)))
        node = pb.Node(op=code, operands=[self._index(o) for o in operands])
        for a in reads:
            if a == "dilation":
                node.dilation = int(attrs.get("dilation", 1))
            elif a == "p":
                node.p = float(attrs["p"])
            elif a == "perm":
                node.perm.extend(int(x) for x in attrs["perm"])
            elif a == "shape":
                node.shape.extend(int(x) for x in attrs["shape"])
            else:
                setattr(node, a, int(attrs[a]))
        if name:
            node.name = name
        return self._append(node)

    # One method per op; the attribute ops take their attributes in the
    # canonical order as positional arguments too.
    def add(self, a, b, name=None):
        return self.op("add", a, b, name=name)

    def sub(self, a, b, name=None):
        return self.op("sub", a, b, name=name)

    def mul(self, a, b, name=None):
        return self.op("mul", a, b, name=name)

    def div(self, a, b, name=None):
        return self.op("div", a, b, name=name)

    def maximum(self, a, b, name=None):
        return self.op("maximum", a, b, name=name)

    def step(self, a, b, name=None):
        """1 where a >= b, else 0 (the engine's step)."""
        return self.op("step", a, b, name=name)

    def matmul(self, a, b, name=None):
        return self.op("matmul", a, b, name=name)

    def gather(self, a, index, name=None):
        return self.op("gather", a, index, name=name)

    def scatter(self, a, index, extent, name=None):
        return self.op("scatter", a, index, extent=extent, name=name)

    def neg(self, a, name=None):
        return self.op("neg", a, name=name)

    def exp(self, a, name=None):
        return self.op("exp", a, name=name)

    def log(self, a, name=None):
        return self.op("log", a, name=name)

    def sqrt(self, a, name=None):
        return self.op("sqrt", a, name=name)

    def tanh(self, a, name=None):
        return self.op("tanh", a, name=name)

    def erf(self, a, name=None):
        return self.op("erf", a, name=name)

    def relu(self, a, name=None):
        return self.op("relu", a, name=name)

    def transpose(self, a, name=None):
        return self.op("transpose", a, name=name)

    def sum(self, a, name=None):
        return self.op("sum", a, name=name)

    def pow(self, a, p, name=None):
        return self.op("pow", a, p=p, name=name)

    def permute(self, a, perm, name=None):
        return self.op("permute", a, perm=perm, name=name)

    def reshape(self, a, shape, name=None):
        return self.op("reshape", a, shape=shape, name=name)

    def broadcast(self, a, shape, name=None):
        return self.op("broadcast", a, shape=shape, name=name)

    def narrow(self, a, axis, start, length, name=None):
        return self.op("narrow", a, axis=axis, start=start, length=length,
                       name=name)

    def pad(self, a, axis, before, after, name=None):
        return self.op("pad", a, axis=axis, before=before, after=after,
                       name=name)

    def unfold(self, a, axis, size, step, dilation=1, name=None):
        return self.op("unfold", a, axis=axis, size=size, step=step,
                       dilation=dilation, name=name)

    def fold(self, a, axis, extent, size, step, dilation=1, name=None):
        return self.op("fold", a, axis=axis, extent=extent, size=size,
                       step=step, dilation=dilation, name=name)

    def concat(self, values, axis, name=None):
        return self.op("concat", *values, axis=axis, name=name)

    def broadcast_along(self, a, axis, extent, name=None):
        return self.op("broadcast_along", a, axis=axis, extent=extent,
                       name=name)

    def sum_along(self, a, axis, name=None):
        return self.op("sum_along", a, axis=axis, name=name)

    def max_along(self, a, axis, name=None):
        return self.op("max_along", a, axis=axis, name=name)

    def log_softmax(self, a, axis, name=None):
        return self.op("log_softmax", a, axis=axis, name=name)

    def logsumexp(self, a, axis, name=None):
        return self.op("logsumexp", a, axis=axis, name=name)


# ------------------------------------------------- the canonical encoding

class _Reader:
    def __init__(self, data):
        self.data = memoryview(bytes(data))
        self.at = 0

    def take(self, n, what):
        if self.at + n > len(self.data):
            raise ValueError("canonical encoding: truncated in %s at byte "
                             "%d" % (what, self.at))
        b = self.data[self.at:self.at + n]
        self.at += n
        return b

    def unpack(self, fmt, what):
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt),
                                                  what))

    def shape(self, what):
        (rank,) = self.unpack("B", what)
        if rank > 8:
            raise ValueError("canonical encoding: rank %d > 8 in %s" %
                             (rank, what))
        return list(self.unpack("%dq" % rank, what))


_SIZES = {pb.F32: 4, pb.F64: 8, pb.BF16: 2, pb.I32: 4}


def decode(data):
    """The topos_pb2.Spec of a network's canonical encoding (format
    version 2, or 1; docs/encoding.md), such as topos_network_encode and
    `topos record FILE` write.  Recording it answers the SHA-256 of the
    bytes as the id.  Only the layout is checked here; the daemon checks
    the rest when it replays the nodes."""
    r = _Reader(data)
    magic = bytes(r.take(4, "the header"))
    if magic != b"TPOS":
        raise ValueError("canonical encoding: magic %r is not b'TPOS'" %
                         magic)
    version, tape, count = r.unpack("HBI", "the header")
    if version not in (1, 2):
        raise ValueError("canonical encoding: version %d (1 and 2 are "
                         "read)" % version)
    spec = pb.Spec(dtype=tape)
    for i in range(count):
        what = "node %d" % i
        code, _dtype = r.unpack("BB", what)
        if code not in _BY_CODE:
            raise ValueError("canonical encoding: node %d has op code %d" %
                             (i, code))
        reads = _BY_CODE[code][2]
        shape = r.shape(what)
        (nin,) = r.unpack("I", what)
        if nin > i:
            raise ValueError("canonical encoding: node %d has %d operands" %
                             (i, nin))
        node = spec.nodes.add(op=code,
                              operands=r.unpack("%dI" % nin, what))
        for a in reads:
            if a == "slot":
                r.unpack("I", what)
            elif a == "tensor":
                (dt,) = r.unpack("B", what)
                if dt not in _SIZES:
                    raise ValueError("canonical encoding: node %d tensor "
                                     "dtype %d" % (i, dt))
                tshape = r.shape(what)
                form = r.unpack("B", what)[0] if version >= 2 else 0
                if form not in (0, 1):
                    raise ValueError("canonical encoding: node %d tensor "
                                     "form %d" % (i, form))
                n = 1
                for e in tshape:
                    n *= e
                n = 1 if form == 1 else n
                node.tensor.dtype = dt
                node.tensor.shape.extend(tshape)
                node.tensor.data = bytes(r.take(n * _SIZES[dt], what))
                node.tensor.splat = form == 1
            elif a == "p":
                node.p = r.unpack("d", what)[0]
            elif a == "perm":
                node.perm.extend(r.unpack("%dB" % len(shape), what))
            elif a == "shape":
                node.shape.extend(r.shape(what))
            elif a == "axis":
                node.axis = r.unpack("B", what)[0]
            else:
                setattr(node, a, r.unpack("q", what)[0])
        (nlen,) = r.unpack("B", what)
        if nlen:
            node.name = bytes(r.take(nlen, what)).decode("utf-8")
    if r.at != len(r.data):
        raise ValueError("canonical encoding: %d trailing bytes" %
                         (len(r.data) - r.at))
    return spec


def as_spec(spec):
    """A topos_pb2.Spec from a Spec builder, a topos_pb2.Spec, or bytes:
    a canonical encoding (b"TPOS...") or a serialised Spec message."""
    if isinstance(spec, Spec):
        return spec.proto()
    if isinstance(spec, pb.Spec):
        return spec
    if isinstance(spec, (bytes, bytearray, memoryview)):
        data = bytes(spec)
        if data[:4] == b"TPOS":
            return decode(data)
        m = pb.Spec()
        m.ParseFromString(data)
        return m
    raise TypeError("a spec is a topos.Spec, a topos_pb2.Spec or bytes, "
                    "not %s" % type(spec).__name__)
