"""Conversions, the spec builder and the canonical decoder: no daemon."""
import struct

import numpy as np
import pytest

import topos
from topos import pb


def raw(a):
    return np.asarray(a).tobytes()


@pytest.mark.parametrize("dtype,wire", [
    (np.float32, pb.F32), (np.float64, pb.F64), (np.int32, pb.I32),
    (np.uint16, pb.BF16)])
def test_round_trip_each_dtype(dtype, wire):
    a = (np.arange(12) * 3 - 7).astype(dtype).reshape(3, 4)
    t = topos.to_tensor(a)
    assert t.dtype == wire and list(t.shape) == [3, 4]
    assert len(t.data) == 12 * a.itemsize and not t.splat
    b = topos.from_tensor(t)
    if topos.BFLOAT16 is not None and wire == pb.BF16:
        b = b.view(np.uint16)
    assert b.dtype == a.dtype and b.shape == a.shape and raw(b) == raw(a)
    b[0, 0] = 1  # fresh and writable


def test_shapes_and_layouts():
    assert list(topos.to_tensor(1.5).shape) == []
    assert topos.to_tensor(1.5).data == struct.pack("<d", 1.5)
    assert topos.from_tensor(topos.to_tensor(1.5)).shape == ()
    e = topos.to_tensor(np.zeros((0, 3), np.float32))
    assert list(e.shape) == [0, 3] and e.data == b""
    assert topos.from_tensor(e).shape == (0, 3)
    a = np.arange(6.0).reshape(2, 3)
    t = topos.to_tensor(a.T)  # not contiguous: sent row-major
    assert list(t.shape) == [3, 2]
    assert raw(topos.from_tensor(t)) == raw(np.ascontiguousarray(a.T))
    big = np.arange(4, dtype=">f8")  # big-endian in, little-endian wire
    assert topos.to_tensor(big).data == np.arange(4, dtype="<f8").tobytes()


def test_dtype_inference_and_conversion():
    assert topos.to_tensor([1.0, 2.0]).dtype == pb.F64
    assert topos.to_tensor(np.array([1, 2], np.int64)).dtype == pb.I32
    assert topos.to_tensor(3).dtype == pb.I32
    with pytest.raises(ValueError):
        topos.to_tensor(np.array([2**31], np.int64))
    for bad in (np.array([True]), np.zeros(2, np.float16), ["a"]):
        with pytest.raises(TypeError):
            topos.to_tensor(bad)
    t = topos.to_tensor([0.1, 0.2], dtype="f32")
    assert raw(topos.from_tensor(t)) == raw(np.float32([0.1, 0.2]))
    assert topos.to_tensor([1.0, -2.0], dtype="i32").data == struct.pack(
        "<2i", 1, -2)
    with pytest.raises(ValueError):
        topos.to_tensor([1.5], dtype="i32")
    with pytest.raises(ValueError):
        topos.to_tensor([1.0], dtype="f16")


def test_splat():
    t = topos.to_tensor(np.zeros((3, 4)), splat=True)
    assert t.splat and t.data == bytes(8) and list(t.shape) == [3, 4]
    back = topos.from_tensor(t)
    assert back.shape == (3, 4) and not back.any()
    # Scalars and single elements are never splats; -0 is not 0.
    assert not topos.to_tensor(0.0, splat=True).splat
    assert not topos.to_tensor(np.zeros(1), splat=True).splat
    assert not topos.to_tensor([0.0, -0.0], splat=True).splat
    assert not topos.to_tensor(np.zeros((3, 4))).splat
    bad = pb.Tensor(dtype=pb.F64, shape=[2], data=bytes(16), splat=True)
    with pytest.raises(ValueError):
        topos.from_tensor(bad)
    with pytest.raises(ValueError):
        topos.from_tensor(pb.Tensor(dtype=pb.F64, shape=[2], data=bytes(8)))
    with pytest.raises(ValueError):
        topos.from_tensor(topos.to_tensor(topos.BlobRef("a" * 64, 1)))


def test_bf16_rounding():
    def b(x):
        return int(topos.to_bf16(np.array([x]))[0])

    assert b(1.0) == 0x3F80
    assert b(np.float32(1 + 2**-8)) == 0x3F80  # a tie: to even
    assert b(np.float32(1 + 3 * 2**-8)) == 0x3F82  # a tie: to even
    assert b(np.float32(1 + 2**-8 + 2**-20)) == 0x3F81
    # From float64 with no double rounding: just above the tie rounds up
    # (through float32 it would land on the tie and go to even).
    assert b(1 + 2**-8 + 2**-40) == 0x3F81
    assert b(1 + 2**-8 - 2**-40) == 0x3F80
    assert b(float("inf")) == 0x7F80 and b(-float("inf")) == 0xFF80
    assert b(3.4e38) == 0x7F80  # past bf16's largest: infinity
    assert b(1e300) == 0x7F80
    nan = b(float("nan"))
    assert nan & 0x7F80 == 0x7F80 and nan & 0x40  # quiet NaN
    assert b(-0.0) == 0x8000
    assert b(2.0**-133) == 0x0001  # bf16's smallest subnormal
    bits = np.array([0x3F80, 0xC000, 0x0001], np.uint16)
    assert raw(topos.bf16_to_f32(bits)) == raw(
        np.float32([1.0, -2.0, 2.0**-133]))
    assert (topos.to_bf16(topos.bf16_to_f32(bits)) == bits).all()
    # uint16 is bf16 on the wire; as values into f32 it widens.
    t = topos.to_tensor(bits, dtype="f32")
    assert raw(topos.from_tensor(t)) == raw(topos.bf16_to_f32(bits))


def gd_builder():
    s = topos.Spec("f64")
    w, x, y = s.param(0.0, "w"), s.input(0.0, "x"), s.input(0.0, "y")
    r = w * x - y
    s.name(r * r, "loss")
    return s


def test_builder_nodes():
    s = gd_builder()
    p = s.proto()
    assert p.dtype == pb.F64 and len(p.nodes) == 6
    assert [n.op for n in p.nodes] == [pb.PARAMETER, pb.INPUT, pb.INPUT,
                                       pb.MUL, pb.SUB, pb.MUL]
    assert [list(n.operands) for n in p.nodes] == [[], [], [], [0, 1],
                                                   [3, 2], [4, 4]]
    assert [n.name for n in p.nodes] == ["w", "x", "y", "", "", "loss"]
    assert p.nodes[0].tensor == pb.Tensor(dtype=pb.F64,
                                          data=struct.pack("<d", 0))
    # The attribute ops set what they read and nothing else.
    t = topos.Spec("f32")
    a = t.param(np.zeros((4, 6)), "a")
    n = t.narrow(a, 1, 2, 3)
    u = t.unfold(a, axis=0, size=2, step=1)
    c = t.concat([a, a], axis=0)
    q = a ** 2.5
    m = a @ t.transpose(a)
    nodes = t.proto().nodes
    assert (nodes[n.index].axis, nodes[n.index].start,
            nodes[n.index].length) == (1, 2, 3)
    assert (nodes[u.index].size, nodes[u.index].step,
            nodes[u.index].dilation) == (2, 1, 1)
    assert list(nodes[c.index].operands) == [0, 0]
    assert nodes[q.index].op == pb.POW and nodes[q.index].p == 2.5
    assert nodes[m.index].op == pb.MATMUL
    assert t.reshape(a, [24]).spec is t
    assert list(nodes[0].shape) == [] and nodes[0].tensor.splat
    # Integers make i32 leaves (indices).
    assert t.input([1, 2], "idx").spec.nodes[-1].tensor.dtype == pb.I32


def test_builder_refuses():
    s = gd_builder()
    other = topos.Spec("f64")
    o = other.param(1.0)
    with pytest.raises(ValueError):
        s.add(0, o)
    with pytest.raises(TypeError):
        s.add(0)
    with pytest.raises(TypeError):
        s.add(0, 1.5)  # constants are recorded with constant()
    with pytest.raises(TypeError):
        s.op("narrow", 0, axis=0, start=0)  # no length
    with pytest.raises(TypeError):
        s.op("add", 0, 1, axis=0)  # add reads no attribute
    with pytest.raises(ValueError):
        s.op("frobnicate", 0)
    with pytest.raises(IndexError):
        s.neg(99)
    with pytest.raises(ValueError):
        topos.Spec("i32")


def test_canonical_decoder():
    v1 = bytes.fromhex(
        "54504f53 0100 01 06000000"
        "0101 00 00000000 00000000 0100 0000000000000000 01 77"
        "0201 00 00000000 00000000 0100 0000000000000000 01 78"
        "0201 00 00000000 01000000 0100 0000000000000000 01 79"
        "0501 00 02000000 00000000 01000000 00"
        "0401 00 02000000 03000000 02000000 00"
        "0501 00 02000000 04000000 04000000 04 6c6f7373".replace(" ", ""))
    assert len(v1) == 132  # docs/encoding.md's example, byte for byte
    assert topos.decode(v1) == gd_builder().proto()
    assert topos.as_spec(v1) == gd_builder().proto()
    with pytest.raises(ValueError, match="truncated"):
        topos.decode(v1[:-1])
    with pytest.raises(ValueError, match="trailing"):
        topos.decode(v1 + b"\0")
    with pytest.raises(ValueError, match="magic"):
        topos.decode(b"TPOX" + v1[4:])
    with pytest.raises(ValueError, match="version"):
        topos.decode(v1[:4] + b"\x03\x00" + v1[6:])
    serialised = gd_builder().SerializeToString()
    assert topos.as_spec(serialised) == gd_builder().proto()
    with pytest.raises(TypeError):
        topos.as_spec(42)


def test_error_text():
    e = topos.Error("NOT_FOUND", "no spec with id 00", topos_status=7)
    assert str(e) == "NOT_FOUND: no spec with id 00"
    assert e.code == "NOT_FOUND" and e.topos_status == 7


def test_optimizers_give_only_what_is_set():
    o = topos.SGD(0.1)
    assert o.HasField("lr") and not o.HasField("momentum")
    assert not o.HasField("weight_decay")
    o = topos.Adam(1e-3, beta2=0.99)
    assert o.kind == pb.ADAM and o.beta2 == 0.99 and not o.HasField("beta1")
    o = topos.AdamW(1e-3, decay_slots=[0, 2])
    assert o.decay == pb.LISTED_SLOTS and list(o.decay_slots) == [0, 2]
    assert topos.AdamW(1e-3, decay="all").decay == pb.ALL_SLOTS
    with pytest.raises(ValueError):
        topos.SGD(None)
