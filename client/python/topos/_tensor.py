"""Tensors between numpy and topos.v1.Tensor.

The wire form (docs/protocol.md, Tensor) is a dtype, an int64 shape and
row-major little-endian bytes, or one element and `splat`, or a blob
reference.  numpy arrays map to it as follows:

  float32 -> F32, float64 -> F64, int32 -> I32,
  bfloat16 (ml_dtypes, when installed) or uint16 bit patterns -> BF16,
  any other integer dtype -> I32 when every value fits,
  Python floats and lists of them -> F64 (numpy's default).

Replies come back as float32 / float64 / int32 arrays, and BF16 as
ml_dtypes.bfloat16 when ml_dtypes is importable, else as the raw uint16
bit patterns (`bf16_to_f32` widens them).
"""
from typing import NamedTuple

import numpy as np

from ._proto import topos_pb2 as pb

try:  # optional: a real bfloat16 dtype for numpy
    import ml_dtypes as _ml_dtypes

    BFLOAT16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _ml_dtypes = None
    BFLOAT16 = None

# The wire's dtypes and their little-endian numpy forms.
_WIRE = {
    pb.F32: np.dtype("<f4"),
    pb.F64: np.dtype("<f8"),
    pb.BF16: np.dtype("<u2"),
    pb.I32: np.dtype("<i4"),
}

_NAMES = {"f32": pb.F32, "float32": pb.F32, "f64": pb.F64,
          "float64": pb.F64, "bf16": pb.BF16, "bfloat16": pb.BF16,
          "i32": pb.I32, "int32": pb.I32}


class BlobRef(NamedTuple):
    """One tensor of a blob stored with Client.put_blob: usable wherever a
    parameter, feed or optimizer moment goes."""

    id: str
    index: int = 0


def dtype_of(d):
    """The wire dtype (a topos_pb2.DType value) named by `d`: "f32",
    "f64", "bf16", "i32", a numpy dtype, or a DType value itself."""
    if isinstance(d, str):
        try:
            return _NAMES[d.lower()]
        except KeyError:
            raise ValueError("unknown dtype %r (f32, f64, bf16, i32)" %
                             (d,)) from None
    if isinstance(d, (int, np.integer)) and not isinstance(d, bool):
        if int(d) not in _WIRE:
            raise ValueError("unknown wire dtype %d" % d)
        return int(d)
    nd = np.dtype(d).newbyteorder("=")
    if _is_bf16(nd):
        return pb.BF16
    if nd == np.float32:
        return pb.F32
    if nd == np.float64:
        return pb.F64
    if nd == np.int32:
        return pb.I32
    if nd == np.uint16:
        return pb.BF16
    raise ValueError("no wire dtype for numpy %s (f32, f64, bf16, i32)" % nd)


def _f32_round_to_odd(a):
    """float64 values as float32 rounded to odd: truncated, with the last
    bit set when inexact, so one more rounding (to bf16) is correct."""
    x = np.asarray(a, dtype=np.float64)
    with np.errstate(over="ignore"):
        r = x.astype(np.float32)
    back = r.astype(np.float64)
    inexact = (back != x) & ~np.isnan(x)
    toward0 = np.where(np.abs(back) > np.abs(x),
                       np.nextafter(r, np.float32(0)), r).astype(np.float32)
    bits = toward0.view(np.uint32) | inexact.astype(np.uint32)
    return bits.view(np.float32)


def to_bf16(a):
    """Rounds values to bfloat16 (to nearest, ties to even, correctly from
    float64 too; NaN stays NaN) and returns the bit patterns as uint16."""
    a = np.asarray(a)
    if a.dtype != np.float32:
        a = _f32_round_to_odd(a)
    u = a.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        quiet = ((u >> 16) | 0x40).astype(np.uint16)
        rounded = np.where(nan, quiet, rounded)
    return rounded.astype(np.uint16)


def bf16_to_f32(a):
    """Widens bfloat16 bit patterns (uint16, or ml_dtypes.bfloat16) to
    float32, exactly."""
    a = np.asarray(a)
    if _is_bf16(a.dtype):
        a = a.view(np.uint16)
    if a.dtype != np.uint16:
        raise TypeError("bf16_to_f32 takes uint16 bit patterns, not %s" %
                        a.dtype)
    return (a.astype(np.uint32) << 16).view(np.float32)


def _is_bf16(d):
    return BFLOAT16 is not None and d == BFLOAT16


def _int_range(arr):
    if arr.size and (arr.min() < -2**31 or arr.max() >= 2**31):
        raise ValueError("values out of the int32 range")


def _as_wire(arr, dtype):
    """arr as a little-endian numpy array of wire dtype `dtype`."""
    if _is_bf16(arr.dtype) or arr.dtype == np.uint16:
        bits = arr.view(np.uint16)
        if dtype == pb.BF16:
            return bits.astype("<u2")
        arr = bf16_to_f32(bits)  # bf16 values, to be converted
    kind = arr.dtype.kind
    if kind not in "fiu":
        raise TypeError("cannot send a %s array (f32, f64, bf16, i32)" %
                        arr.dtype)
    if dtype == pb.BF16:
        return to_bf16(arr).astype("<u2")
    if dtype == pb.I32:
        if kind == "f" and not np.array_equal(arr, np.trunc(arr)):
            raise ValueError("an i32 tensor of non-integral values")
        _int_range(arr)
        return arr.astype("<i4")
    return arr.astype(_WIRE[dtype])


def _infer(arr):
    """The wire dtype an array goes as when none is asked for."""
    if _is_bf16(arr.dtype) or arr.dtype == np.uint16:
        return pb.BF16
    if arr.dtype == np.float32:
        return pb.F32
    if arr.dtype == np.float64:
        return pb.F64
    if arr.dtype.kind in "iu":
        return pb.I32
    raise TypeError("no wire dtype for numpy %s: the wire has f32, f64, "
                    "bf16 and i32 (cast it first)" % arr.dtype)


def to_tensor(value, dtype=None, splat=False):
    """A topos_pb2.Tensor of `value`: a numpy array or anything
    np.asarray takes, a BlobRef, or a topos_pb2.Tensor (returned as is).
    `dtype` converts to that wire dtype; without it the dtype is the
    array's (see the module's table).  `splat`: write two or more
    all-equal elements as one (as specs should; the daemon reads either)."""
    if isinstance(value, pb.Tensor):
        return value
    if isinstance(value, BlobRef):
        return pb.Tensor(blob=pb.BlobRef(id=value.id, index=value.index))
    arr = np.asarray(value)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    d = _infer(arr) if dtype is None else dtype_of(dtype)
    wire = _as_wire(arr, d)
    shape = [int(s) for s in arr.shape]
    if splat and wire.size >= 2:
        flat = wire.reshape(-1)
        raw = flat.view(np.dtype("V%d" % flat.itemsize))
        if (raw == raw[0]).all():
            return pb.Tensor(dtype=d, shape=shape, data=flat[:1].tobytes(),
                             splat=True)
    return pb.Tensor(dtype=d, shape=shape, data=wire.tobytes(order="C"))


def from_tensor(t):
    """The numpy array a topos_pb2.Tensor holds (a fresh, writable one)."""
    if t.HasField("blob"):
        raise ValueError("a blob reference (%s, %d) holds no data here" %
                         (t.blob.id, t.blob.index))
    if t.dtype not in _WIRE:
        raise ValueError("unknown wire dtype %d" % t.dtype)
    wd = _WIRE[t.dtype]
    shape = tuple(int(s) for s in t.shape)
    if any(s < 0 for s in shape):
        raise ValueError("negative extent in shape %s" % (shape,))
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    data = t.data
    if t.splat:
        if len(data) != wd.itemsize:
            raise ValueError("a splat holds one %d-byte element, not %d "
                             "bytes" % (wd.itemsize, len(data)))
        arr = np.full(shape, np.frombuffer(data, dtype=wd)[0], dtype=wd)
    else:
        if len(data) != count * wd.itemsize:
            raise ValueError("tensor of shape %s holds %d bytes, not %d" %
                             (shape, len(data), count * wd.itemsize))
        arr = np.frombuffer(data, dtype=wd).reshape(shape).copy()
    native = arr.astype(wd.newbyteorder("="), copy=False)
    if t.dtype == pb.BF16 and BFLOAT16 is not None:
        return native.view(BFLOAT16)
    return native
