"""The topos client against a real toposd ($TOPOS_SERVER; skipped without).

Numbers are checked bit for bit against numpy wherever the daemon's
arithmetic is exactly specified (docs/numerics.md: IEEE operations in the
written order, no fma, f32 ops in f32, bf16 ops in f32 rounded once):
the SGD and Adam steps of the gradient-descent spec in f64, elementwise
f32 and bf16 forwards, and tensors that only travel.
"""
import hashlib
import json
import re
import struct
from fractions import Fraction
from pathlib import Path

import grpc
import numpy as np
import pytest

import topos
from conftest import gd_spec

SAMPLES = [(1.0, 2.0), (2.0, 4.0), (3.0, 6.0)]


def bits(a):
    """The bytes of an array or number, to compare bit patterns."""
    a = np.asarray(a)
    if a.dtype.kind == "f" and a.dtype.itemsize == 8:
        return a.astype("<f8").tobytes()
    return a.tobytes()


def f64(v):
    return np.float64(v)


def sgd_reference(steps, lr=0.02):
    """(w after each step, loss before each step) of plain SGD on
    (w*x - y)^2 from w = 0, in numpy float64, as the engine computes it:
    r = w*x - y, loss = r*r, the adjoint of r*r is r + r (one product per
    operand, accumulated), times x for w; w' = w - lr*g."""
    w, lr = f64(0.0), f64(lr)
    ws, losses = [], []
    for k in range(steps):
        x, y = (f64(v) for v in SAMPLES[k % 3])
        r = w * x - y
        losses.append(r * r)
        g = (r + r) * x
        w = w - lr * g
        ws.append(w)
    return ws, losses


def canonical_gd(version=2):
    """The gradient-descent network's canonical encoding, written from
    docs/encoding.md (version 1 is the document's 132-byte example)."""

    def tensor():
        form = b"\x00" if version == 2 else b""
        return b"\x01\x00" + form + struct.pack("<d", 0.0)

    def leaf(op, slot, name):
        return (bytes([op, 1, 0]) + struct.pack("<II", 0, slot) + tensor() +
                bytes([len(name)]) + name)

    def binary(op, a, b, name=b""):
        return (bytes([op, 1, 0]) + struct.pack("<III", 2, a, b) +
                bytes([len(name)]) + name)

    return (b"TPOS" + struct.pack("<HBI", version, 1, 6) +
            leaf(1, 0, b"w") + leaf(2, 0, b"x") + leaf(2, 1, b"y") +
            binary(5, 0, 1) + binary(4, 3, 2) + binary(5, 4, 4, b"loss"))


# ------------------------------------------------------------ the daemon

def test_health(client):
    h = client.health()
    assert h.status == "serving"
    assert h.version
    assert client.check() == "SERVING"
    assert client.check("topos.v1.Topos") == "SERVING"
    with pytest.raises(topos.Error) as e:
        client.check("no.such.Service")
    assert e.value.code == "NOT_FOUND"


def test_unreachable_daemon_is_unavailable():
    with topos.Client("127.0.0.1:1", timeout=10) as c:
        with pytest.raises(topos.Error) as e:
            c.health()
    assert e.value.code == "UNAVAILABLE"
    assert e.value.status == grpc.StatusCode.UNAVAILABLE


# ----------------------------------------------------------------- specs

def test_record_counts_and_id(client, gd):
    assert re.fullmatch(r"[0-9a-f]{64}", gd.id)
    assert (gd.nodes, gd.parameters, gd.inputs) == (6, 1, 2)
    assert "loss" in gd.summary
    assert str(gd) == gd.id
    # The id is the SHA-256 of the canonical encoding.
    assert gd.id == hashlib.sha256(canonical_gd()).hexdigest()


def test_record_every_form(client, gd):
    spec = gd_spec()
    assert client.record(spec.proto()).id == gd.id
    assert client.record(spec.SerializeToString()).id == gd.id
    assert client.record(canonical_gd(2)).id == gd.id
    # Version 1 still decodes; it re-encodes as version 2 (the same id).
    assert len(canonical_gd(1)) == 132
    assert client.record(canonical_gd(1)).id == gd.id
    assert topos.decode(canonical_gd(2)) == spec.proto()
    # Recording again is a no-op; the spec is listed.
    assert client.record(spec).id == gd.id
    assert gd.id in [s.id for s in client.list_specs()]


def test_describe_text_and_json(client, gd):
    text = client.describe(gd)
    assert "loss" in text and "mul(%4, %4)" in text
    assert [ln.split()[0] for ln in text.strip().splitlines()] == [
        "0", "1", "2", "3", "4", "5"]
    doc = json.loads(client.describe(gd.id, format="json"))
    assert doc["dtype"] == "f64"
    assert (doc["parameters"], doc["inputs"]) == (1, 2)
    names = [n["name"] for n in doc["nodes"]]
    assert names == ["w", "x", "y", None, None, "loss"]
    assert [n["op"] for n in doc["nodes"]] == [
        "parameter", "input", "input", "mul", "sub", "mul"]
    assert doc["nodes"][5]["operands"] == [4, 4]
    assert "digraph" in client.describe(gd, "dot")
    with pytest.raises(ValueError):
        client.describe(gd, "yaml")


def test_emit_and_lower(client, gd):
    mlir = client.emit(gd, roots="loss")
    assert "func.func" in mlir
    assert "stablehlo.multiply" in mlir and "stablehlo.subtract" in mlir
    assert "func.func" in client.emit(gd, roots=["loss"], generic=True)
    plan = client.lower(gd, roots="loss")
    assert plan.text.startswith("plan:")
    assert plan.peak_bytes > 0


# ------------------------------------------------------------- execution

def test_forward(client, gd):
    out = client.forward(gd, {"x": 2.0, "y": 1.0}, roots="loss",
                         observes=["w"], params=[1.5])
    assert out.roots[0].dtype == np.float64 and out.roots[0].shape == ()
    w, x, y = f64(1.5), f64(2.0), f64(1.0)
    assert bits(out.roots[0]) == bits((w * x - y) * (w * x - y))
    assert bits(out.observes[0]) == bits(w)
    assert out.backends
    # No parameters: the spec's initial w = 0; inputs by index and Ref.
    s = gd_spec()
    x_ref = s._index("x")
    out = client.forward(gd.id, [(x_ref, 3.0), (2, 5.0)], roots=[5, "loss"])
    assert [float(v) for v in out.roots] == [25.0, 25.0]


def test_steps_match_numpy_bit_for_bit(client, gd):
    want_w, want_loss = sgd_reference(9)
    params, state = None, None
    for k in range(9):
        x, y = SAMPLES[k % 3]
        r = client.step(gd, {"x": x, "y": y}, loss="loss", params=params,
                        state=state, optimizer=topos.SGD(lr=0.02))
        assert bits(r.params[0]) == bits(want_w[k]), (k, r.params[0])
        assert bits(r.loss) == bits(want_loss[k]), (k, r.loss)
        assert r.state.step == k + 1
        assert r.state.m == [] and r.state.v == []
        params, state = r.params, r.state
    assert 1.5 < float(params[0]) < 2.0  # on its way to w = 2


def test_backward(client, gd):
    g = client.backward(gd, {"x": 3.0, "y": 6.0}, loss="loss", params=[0.5])
    w, x, y = f64(0.5), f64(3.0), f64(6.0)
    r = w * x - y
    assert bits(g.loss) == bits(r * r)
    assert bits(g.gradients[0]) == bits((r + r) * x)


def _exact_pow(b, t):
    """b**t correctly rounded, as the engine's exact_pow."""
    return float(Fraction(b) ** t)


def test_adam_state_round_trips(client, gd):
    """Adam with its moments carried in the client between calls: each
    step's parameter, m and v are the engine's formula (engine/optim.c)
    evaluated in numpy float64."""
    lr, b1, b2, eps = 0.1, 0.9, 0.999, 1e-8
    w, m, v = f64(0.0), f64(0.0), f64(0.0)
    params, state = None, None
    for k in range(6):
        x, y = (f64(a) for a in SAMPLES[k % 3])
        r = client.step(gd, {"x": x, "y": y}, params=params, state=state,
                        optimizer=topos.Adam(lr=lr))
        res = w * x - y
        g = (res + res) * x
        m = f64(b1) * m + (f64(1) - f64(b1)) * g
        v = f64(b2) * v + (f64(1) - f64(b2)) * g * g
        bc1 = f64(1) - f64(_exact_pow(b1, k + 1))
        bc2 = f64(1) - f64(_exact_pow(b2, k + 1))
        w = w - f64(lr) * (m / bc1) / (np.sqrt(v / bc2) + f64(eps))
        assert r.state.step == k + 1
        assert bits(r.params[0]) == bits(w), (k, r.params[0], w)
        assert bits(r.state.m[0]) == bits(m), k
        assert bits(r.state.v[0]) == bits(v), k
        assert bits(r.loss) == bits(res * res)
        # The state goes back as the client's own object.
        params, state = r.params, topos.OptimizerState(
            r.state.step, [a.copy() for a in r.state.m],
            [a.copy() for a in r.state.v])


def test_five_line_loop_from_the_readme(address, monkeypatch):
    """The README's training loop, run as it is written there."""
    readme = Path(__file__).resolve().parents[1] / "README.md"
    if not readme.exists():
        pytest.skip("README.md is not beside the tests (%s)" % readme)
    text = readme.read_text(encoding="utf-8")
    m = re.search(r"<!-- five-line-loop[^>]*-->\s*```python\n(.*?)```",
                  text, re.S)
    assert m, "README.md lost its five-line-loop block"
    monkeypatch.setenv("TOPOS_SERVER", address)
    ns = {}
    exec(compile(m.group(1), str(readme), "exec"), ns)
    want_w, want_loss = sgd_reference(30)
    t = ns["t"]
    assert t.steps == 30
    assert bits(t.params[0]) == bits(want_w[-1])
    assert bits(ns["loss"]) == bits(want_loss[-1])
    assert abs(float(t.params[0]) - 2.0) < 0.01
    ns["c"].close()


def test_trainer_and_step_agree(client, gd):
    t = client.trainer(gd, loss="loss", optimizer=topos.SGD(0.02, momentum=0.5))
    p, s = None, None
    for k in range(5):
        x, y = SAMPLES[k % 3]
        loss = t.step({"x": x}, y=y)
        r = client.step(gd, {"x": x, "y": y}, params=p, state=s,
                        optimizer=topos.SGD(0.02, momentum=0.5))
        p, s = r.params, r.state
        assert bits(loss) == bits(r.loss)
        assert bits(t.params[0]) == bits(p[0])
        assert bits(t.state.m[0]) == bits(s.m[0])  # momentum is state
    out = t.forward({"x": 1.0, "y": 2.0}, observes="w")
    assert bits(out.observes[0]) == bits(t.params[0])


def test_f32_elementwise_bits(client):
    rng = np.random.default_rng(7)
    a0, b0, c0 = (rng.standard_normal((2, 3)).astype(np.float32)
                  for _ in range(3))
    s = topos.Spec("f32")
    a = s.param(np.zeros((2, 3)), "a")
    b, c = s.input(np.zeros((2, 3)), "b"), s.input(np.zeros((2, 3)), "c")
    out = s.add(a * b, c, name="out")
    s.sum(out, name="loss")
    # Zero leaves travel as splats; the daemon reads them.
    assert s.nodes[0].tensor.splat
    sid = client.record(s)
    r = client.forward(sid, {"b": b0, "c": c0}, roots="out", params=[a0])
    assert r.roots[0].dtype == np.float32 and r.roots[0].shape == (2, 3)
    assert bits(r.roots[0]) == bits(a0 * b0 + c0)
    g = client.backward(sid, {"b": b0, "c": c0}, loss="loss", params=[a0])
    assert bits(g.gradients[0]) == bits(b0)  # 1 * b, exactly
    assert np.isclose(g.loss, float(np.sum((a0 * b0 + c0).astype(np.float64))),
                      rtol=1e-5)


def _bf16_ties(n):
    """n pairs of bf16 values in [1, 2) whose f32 product lies exactly
    halfway between two bf16 values with the lower one even: ties to even
    round them down, where rounding half up would not."""
    m = np.arange(0x3F80, 0x4000, dtype=np.uint16)
    f = topos.bf16_to_f32(m)
    u = (f[:, None] * f[None, :]).view(np.uint32)
    i, j = np.nonzero(((u & 0xFFFF) == 0x8000) & ((u >> 16) & 1 == 0))
    assert len(i) >= n
    return m[i[:n]], m[j[:n]]


def test_bf16_elementwise_bits(client):
    rng = np.random.default_rng(11)
    ta, tb = _bf16_ties(4)
    a0 = np.concatenate([topos.to_bf16(rng.standard_normal(8)), ta])
    b0 = np.concatenate([topos.to_bf16(rng.standard_normal(8)), tb])
    s = topos.Spec("bf16")
    a = s.param(np.zeros(12), "a")
    b = s.input(np.zeros(12), "b")
    s.add(s.mul(a, b, name="prod"), b, name="out")
    sid = client.record(s)
    r = client.forward(sid, {"b": b0}, roots=["prod", "out"], params=[a0])
    got = [np.asarray(v) for v in r.roots]
    if topos.BFLOAT16 is not None:
        got = [v.view(np.uint16) for v in got]
    assert got[0].dtype == np.uint16 and got[0].shape == (12,)
    # Each op computed in f32 and rounded once to bf16, ties to even.
    fa, fb = topos.bf16_to_f32(a0), topos.bf16_to_f32(b0)
    prod = topos.to_bf16(fa * fb)
    assert bits(got[0]) == bits(prod)
    assert bits(got[1]) == bits(topos.to_bf16(topos.bf16_to_f32(prod) + fb))


# ----------------------------------------------------------------- blobs

def test_blobs_round_trip(client, gd):
    """Tensors go up once as a blob and come back, bit for bit, through
    a spec whose roots are the leaves they feed (the protocol has no call
    that reads a blob itself)."""
    rng = np.random.default_rng(3)
    a0 = rng.standard_normal((2, 3)).astype(np.float32)
    k0 = np.array([7, -1, 2**31 - 1, -2**31], dtype=np.int32)
    blob = client.put_blob([a0, k0])
    assert re.fullmatch(r"[0-9a-f]{64}", blob.id) and blob.count == 2
    assert client.put_blob([a0, k0]).id == blob.id  # content-addressed
    assert client.put_blob([k0, a0]).id != blob.id
    st = client.stat_blob(blob.id)
    assert st.present and st.bytes == blob.bytes > 0
    assert not client.stat_blob("f" * 64).present

    s = topos.Spec("f32")
    p = s.param(np.zeros((2, 3)), "p")
    k = s.input(np.zeros(4, dtype=np.int32), "k")
    sid = client.record(s)
    out = client.forward(sid, {"k": blob.ref(1)}, roots=[p, k],
                         params=[blob.ref(0)])
    assert out.roots[0].dtype == np.float32 and bits(out.roots[0]) == bits(a0)
    assert out.roots[1].dtype == np.int32 and bits(out.roots[1]) == bits(k0)

    # Parameters by blob give what they give inline.
    wb = client.put_blob([np.float64(0.75)])
    feeds = {"x": 2.0, "y": 3.0}
    by_blob = client.step(gd, feeds, params=wb, optimizer=topos.SGD(0.02))
    inline = client.step(gd, feeds, params=[0.75], optimizer=topos.SGD(0.02))
    assert bits(by_blob.params[0]) == bits(inline.params[0])
    assert bits(by_blob.loss) == bits(inline.loss)


# ---------------------------------------------------------------- errors

def test_unknown_id_is_not_found(client, gd):
    with pytest.raises(topos.Error) as e:
        client.describe("0" * 64)
    err = e.value
    assert err.code == "NOT_FOUND"
    assert err.status == grpc.StatusCode.NOT_FOUND
    assert "no spec with id" in err.message
    assert str(err).startswith("NOT_FOUND: ")
    assert err.method == "Describe"
    with pytest.raises(topos.Error) as e:
        client.forward("0" * 64, {"x": 1.0, "y": 2.0})
    assert e.value.code == "NOT_FOUND"
    with pytest.raises(topos.Error) as e:
        client.forward(gd, {"x": 1.0, "y": 2.0},
                       params=[topos.BlobRef("e" * 64, 0)])
    assert e.value.code == "NOT_FOUND"


def test_malformed_spec_is_invalid_argument(client):
    bad = topos.pb.Spec(dtype=topos.pb.F64, nodes=[
        topos.pb.Node(op=topos.pb.MUL, operands=[0, 0])])
    with pytest.raises(topos.Error) as e:
        client.record(bad)
    assert e.value.code == "INVALID_ARGUMENT"
    assert e.value.status == grpc.StatusCode.INVALID_ARGUMENT
    # A shape error is the engine's, with its code in topos-status.
    s = topos.Spec("f64")
    s.add(s.param(np.zeros(2)), s.param(np.zeros(3)))
    with pytest.raises(topos.Error) as e:
        client.record(s)
    assert e.value.code == "INVALID_ARGUMENT"
    assert isinstance(e.value.topos_status, int) and e.value.topos_status


def test_bad_requests_are_invalid_argument(client, gd):
    cases = [
        # an f32 feed into an f64 input
        lambda: client.forward(gd, {"x": np.float32(1), "y": 2.0}),
        # a feed into a node that is not an input
        lambda: client.forward(gd, {"w": 1.0, "y": 2.0}),
        lambda: client.forward(gd, {"x": 1.0}, roots="nope"),
        # no lr
        lambda: client.step(gd, {"x": 1.0, "y": 2.0},
                            optimizer=topos.pb.Optimizer(kind=topos.pb.SGD)),
        # momentum is SGD's
        lambda: client.step(gd, {"x": 1.0, "y": 2.0},
                            optimizer=topos.pb.Optimizer(
                                kind=topos.pb.ADAM, lr=0.1, momentum=0.5)),
        lambda: client.forward(gd, {"x": 1.0, "y": 2.0}, backend="nope"),
    ]
    for i, call in enumerate(cases):
        with pytest.raises(topos.Error) as e:
            call()
        assert e.value.code == "INVALID_ARGUMENT", (i, str(e.value))
