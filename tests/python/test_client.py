#!/usr/bin/python3
"""A Python client of toposd, generated from proto/topos.proto at test time.

Run by tests/daemon/test_client.c (make test) with /usr/bin/python3, whose
Debian modules (python3-grpcio, python3-protobuf, python3-grpc-tools) it
needs:

  test_client.py --server HOST:PORT --proto proto/topos.proto
                 --id ID --w W1,W2,... --loss L1,L2,...

It generates topos_pb2 / topos_pb2_grpc into a temporary directory with
grpc_tools.protoc, records the gradient-descent spec built node by node in
Python (w a parameter, x and y inputs, loss = (w*x - y)^2, f64), checks
the daemon's id equals ID (the C client's), then runs len(W) SGD steps
(lr 0.02, samples (1,2), (2,4), (3,6) in turn) with Step, carrying the
parameters and the optimizer state itself, and checks w and the loss after
each step against the C client's numbers bit for bit (given as C "%a" hex
floats).  It also checks Forward by name, Describe, Health, and that an
unknown id is NOT_FOUND and a bad spec INVALID_ARGUMENT.

Exit status: 0 when everything matches (prints "python client: ok"), 1 on
a mismatch, 2 when the client cannot be generated or imported.
"""
import argparse
import importlib
import os
import struct
import sys
import tempfile


def fail(msg, code=1):
    print("python client: FAIL: " + msg, file=sys.stderr)
    sys.exit(code)


def generate(proto, outdir):
    try:
        from grpc_tools import protoc
    except ImportError as e:
        fail("grpc_tools is not installed (python3-grpc-tools): %s" % e, 2)
    include = os.path.dirname(os.path.abspath(proto))
    args = [
        "grpc_tools.protoc",
        "-I" + include,
        "--python_out=" + outdir,
        "--grpc_python_out=" + outdir,
        os.path.abspath(proto),
    ]
    if protoc.main(args) != 0:
        fail("grpc_tools.protoc failed on " + proto, 2)
    sys.path.insert(0, outdir)
    try:
        importlib.import_module("grpc")  # python3-grpcio
        import topos_pb2
        import topos_pb2_grpc
    except ImportError as e:
        fail("cannot import the generated client: %s" % e, 2)
    return topos_pb2, topos_pb2_grpc


def f64(pb, value):
    return pb.Tensor(dtype=pb.F64, shape=[], data=struct.pack("<d", value))


def scalar(t):
    if t.dtype != 1 or list(t.shape) != [] or len(t.data) != 8:
        fail("not an f64 scalar: dtype %d shape %s, %d bytes" %
             (t.dtype, list(t.shape), len(t.data)))
    return struct.unpack("<d", t.data)[0]


def bits(x):
    return struct.pack("<d", x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--proto", default="proto/topos.proto")
    ap.add_argument("--id", required=True)
    ap.add_argument("--w", required=True)
    ap.add_argument("--loss", required=True)
    a = ap.parse_args()
    want_w = [float.fromhex(v) for v in a.w.split(",")]
    want_loss = [float.fromhex(v) for v in a.loss.split(",")]
    if len(want_w) != len(want_loss) or not want_w:
        fail("--w and --loss must list the same number of values", 2)

    with tempfile.TemporaryDirectory(prefix="topos-py-") as outdir:
        pb, rpc = generate(a.proto, outdir)
        import grpc

        channel = grpc.insecure_channel(a.server)
        stub = rpc.ToposStub(channel)

        health = stub.Health(pb.HealthRequest(), timeout=30)
        if health.status != "serving":
            fail("health says %r" % health.status)

        # The gradient-descent spec, node by node.
        zero = f64(pb, 0.0)
        spec = pb.Spec(dtype=pb.F64, nodes=[
            pb.Node(op=pb.PARAMETER, name="w", tensor=zero),
            pb.Node(op=pb.INPUT, name="x", tensor=zero),
            pb.Node(op=pb.INPUT, name="y", tensor=zero),
            pb.Node(op=pb.MUL, operands=[0, 1]),
            pb.Node(op=pb.SUB, operands=[3, 2]),
            pb.Node(op=pb.MUL, operands=[4, 4], name="loss"),
        ])
        rec = stub.Record(spec, timeout=30)
        if rec.id != a.id:
            fail("recorded id %s, the C client's is %s" % (rec.id, a.id))
        if (rec.nodes, rec.parameters, rec.inputs) != (6, 1, 2):
            fail("record counts %d/%d/%d" %
                 (rec.nodes, rec.parameters, rec.inputs))

        text = stub.Describe(pb.DescribeRequest(id=rec.id, format=pb.TEXT),
                             timeout=30).text
        if "loss" not in text:
            fail("describe lacks the loss node:\n" + text)

        # Steps: the state travels with each request.
        samples = [(1.0, 2.0), (2.0, 4.0), (3.0, 6.0)]
        params = [f64(pb, 0.0)]
        state = None
        opt = pb.Optimizer(kind=pb.SGD, lr=0.02)
        for k in range(len(want_w)):
            x, y = samples[k % 3]
            req = pb.StepRequest(
                id=rec.id, loss=pb.Value(name="loss"), parameters=params,
                feeds=[pb.Feed(input=pb.Value(name="x"), tensor=f64(pb, x)),
                       pb.Feed(input=pb.Value(index=2), tensor=f64(pb, y))],
                optimizer=opt)
            if state is not None:
                req.state.CopyFrom(state)
            reply = stub.Step(req, timeout=30)
            w = scalar(reply.parameters[0])
            if bits(w) != bits(want_w[k]):
                fail("step %d: w = %r, the C client's %r" % (k, w, want_w[k]))
            if bits(reply.loss) != bits(want_loss[k]):
                fail("step %d: loss = %r, the C client's %r" %
                     (k, reply.loss, want_loss[k]))
            params = list(reply.parameters)
            state = reply.state
            if state.step != k + 1:
                fail("step %d: the state's step is %d" % (k, state.step))

        # Forward by name with the trained parameters and a feed.
        fwd = stub.Forward(pb.ForwardRequest(
            id=rec.id,
            entry=pb.Entry(roots=[pb.Value(name="loss")],
                           observes=[pb.Value(name="w")]),
            parameters=params,
            feeds=[pb.Feed(input=pb.Value(name="x"), tensor=f64(pb, 1.0)),
                   pb.Feed(input=pb.Value(name="y"), tensor=f64(pb, 2.0))]),
            timeout=30)
        w = scalar(fwd.observes[0])
        expect = (w * 1.0 - 2.0) * (w * 1.0 - 2.0)
        if bits(w) != bits(want_w[-1]) or bits(scalar(fwd.roots[0])) != bits(
                expect):
            fail("forward: w %r, loss %r (want %r)" %
                 (w, scalar(fwd.roots[0]), expect))

        # Errors carry gRPC status codes.
        try:
            stub.Describe(pb.DescribeRequest(id="0" * 64), timeout=30)
            fail("an unknown id was accepted")
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                fail("unknown id: %s %s" % (e.code(), e.details()))
        bad = pb.Spec(dtype=pb.F64, nodes=[pb.Node(op=pb.MUL, operands=[0, 0])])
        try:
            stub.Record(bad, timeout=30)
            fail("a spec with a forward operand was accepted")
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
                fail("bad spec: %s %s" % (e.code(), e.details()))
        channel.close()
    print("python client: ok (%d steps, w = %r)" % (len(want_w), want_w[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
