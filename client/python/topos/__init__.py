"""topos: a Python client of toposd, the topos daemon (gRPC service
topos.v1.Topos, proto/topos.proto; docs/protocol.md).

    import topos

    s = topos.Spec("f64")
    w, x, y = s.param(0.0, "w"), s.input(0.0, "x"), s.input(0.0, "y")
    r = w * x - y
    s.name(r * r, "loss")

    c = topos.Client("127.0.0.1:50051")
    t = c.trainer(c.record(s), loss="loss", optimizer=topos.SGD(lr=0.02))
    for k in range(30):
        loss = t.step(x=[1.0, 2.0, 3.0][k % 3], y=[2.0, 4.0, 6.0][k % 3])

`topos.pb` and `topos.pb_grpc` are the generated message and stub
modules, for anything the client does not wrap (Train streams,
Conformance, the Admin* calls: Client.call("Method", request)).
"""
from ._client import (DEFAULT_ADDRESS, SGD, Adam, AdamW, Blob, BlobStat,
                      Client, Error, Forwarded, Gradients, Health, Lowered,
                      OptimizerState, Recorded, Stepped, Trainer)
from ._proto import topos_pb2 as pb
from ._proto import topos_pb2_grpc as pb_grpc
from ._spec import OPS, Ref, Spec, as_spec, decode
from ._tensor import (BFLOAT16, BlobRef, bf16_to_f32, dtype_of, from_tensor,
                      to_bf16, to_tensor)

__version__ = "0.1.0"

__all__ = [
    "Adam", "AdamW", "BFLOAT16", "Blob", "BlobRef", "BlobStat", "Client",
    "DEFAULT_ADDRESS", "Error", "Forwarded", "Gradients", "Health",
    "Lowered", "OPS", "OptimizerState", "Recorded", "Ref", "SGD", "Spec",
    "Stepped", "Trainer", "as_spec", "bf16_to_f32", "decode", "dtype_of",
    "from_tensor", "pb", "pb_grpc", "to_bf16", "to_tensor",
]
