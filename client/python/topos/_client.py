"""topos.Client: one method per toposd RPC, numpy arrays in and out."""
import os
from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional

import grpc
import numpy as np

from ._proto import topos_pb2 as pb
from ._proto import topos_pb2_grpc as pb_grpc
from ._spec import Ref, as_spec
from ._tensor import BlobRef, from_tensor, to_tensor

DEFAULT_ADDRESS = "127.0.0.1:50051"
_UNSET = object()


class Error(Exception):
    """A failed call: `code` is the gRPC status name ("NOT_FOUND",
    "INVALID_ARGUMENT", ...), `message` the daemon's text, `status` the
    grpc.StatusCode, `topos_status` the engine's code from the trailing
    `topos-status` metadata (None when the daemon sent none) and `method`
    the RPC.  str(e) is "CODE: message", as the C client says it."""

    def __init__(self, code, message, status=None, topos_status=None,
                 method=None):
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message
        self.status = status
        self.topos_status = topos_status
        self.method = method

    @classmethod
    def from_rpc(cls, e, method=None):
        status = e.code() if hasattr(e, "code") else None
        code = status.name if status is not None else "UNKNOWN"
        message = (e.details() if hasattr(e, "details") else None) or str(e)
        topos_status = None
        try:
            for key, value in e.trailing_metadata() or ():
                if key == "topos-status":
                    topos_status = int(value)
        except (AttributeError, TypeError, ValueError):
            pass
        return cls(code, message, status, topos_status, method)


# ------------------------------------------------------------ results

class Recorded(NamedTuple):
    """Record's reply; str(r) and every method taking a spec id take it
    as its id."""

    id: str
    nodes: int
    parameters: int
    inputs: int
    summary: str

    def __str__(self):
        return self.id


class Forwarded(NamedTuple):
    roots: List[np.ndarray]
    observes: List[np.ndarray]
    backends: List[str]


class Gradients(NamedTuple):
    loss: float
    gradients: List[np.ndarray]
    backends: List[str]


class Stepped(NamedTuple):
    params: List[np.ndarray]
    state: "OptimizerState"
    loss: float
    observes: List[np.ndarray]
    backends: List[str]


class Lowered(NamedTuple):
    text: str
    peak_bytes: int
    groups: int


class Blob(NamedTuple):
    """A stored blob: its id, size and number of tensors."""

    id: str
    bytes: int
    count: int

    def ref(self, index=0):
        return BlobRef(self.id, index)

    def refs(self):
        """One BlobRef per tensor: pass as `params` to run on them."""
        return [BlobRef(self.id, i) for i in range(self.count)]


class BlobStat(NamedTuple):
    present: bool
    bytes: int


class Health(NamedTuple):
    status: str  # "serving" or "draining"
    version: str


@dataclass
class OptimizerState:
    """The optimizer's state as Step returns it and takes it back: the
    step count and the moments (m, v; empty when the optimizer keeps
    none), one array per parameter slot."""

    step: int = 0
    m: List[np.ndarray] = field(default_factory=list)
    v: List[np.ndarray] = field(default_factory=list)

    @classmethod
    def from_proto(cls, s):
        return cls(int(s.step), [from_tensor(t) for t in s.m],
                   [from_tensor(t) for t in s.v])

    def proto(self):
        return pb.OptimizerState(step=self.step,
                                 m=[to_tensor(a) for a in self.m],
                                 v=[to_tensor(a) for a in self.v])


# ---------------------------------------------------------- optimizers

def _optimizer(kind, lr, **given):
    if lr is None:
        raise ValueError("lr is required")
    o = pb.Optimizer(kind=kind, lr=float(lr))
    for k, v in given.items():
        if v is None:
            continue
        if k == "decay":
            o.decay = {"rank_at_least_2": pb.RANK_AT_LEAST_2,
                       "all": pb.ALL_SLOTS, "all_slots": pb.ALL_SLOTS,
                       "listed": pb.LISTED_SLOTS,
                       "listed_slots": pb.LISTED_SLOTS}[v.lower()] \
                if isinstance(v, str) else int(v)
        elif k == "decay_slots":
            o.decay_slots.extend(int(s) for s in v)
            if "decay" not in given or given["decay"] is None:
                o.decay = pb.LISTED_SLOTS
        else:
            setattr(o, k, float(v))
    return o


def SGD(lr, momentum=None, weight_decay=None):
    """SGD settings (a topos_pb2.Optimizer); None leaves a number to the
    daemon's default (momentum 0, weight_decay 0)."""
    return _optimizer(pb.SGD, lr, momentum=momentum,
                      weight_decay=weight_decay)


def Adam(lr, beta1=None, beta2=None, eps=None, weight_decay=None):
    """Adam settings; None: the defaults 0.9, 0.999, 1e-8, 0."""
    return _optimizer(pb.ADAM, lr, beta1=beta1, beta2=beta2, eps=eps,
                      weight_decay=weight_decay)


def AdamW(lr, beta1=None, beta2=None, eps=None, weight_decay=None,
          decay=None, decay_slots=None):
    """AdamW settings; decay: "rank_at_least_2" (the default), "all" or
    "listed" with decay_slots (given alone, decay_slots implies it)."""
    return _optimizer(pb.ADAMW, lr, beta1=beta1, beta2=beta2, eps=eps,
                      weight_decay=weight_decay, decay=decay,
                      decay_slots=decay_slots)


# ------------------------------------------------------------ requests

def _spec_id(spec_id):
    if isinstance(spec_id, Recorded):
        return spec_id.id
    if not isinstance(spec_id, str):
        raise TypeError("a spec id is a str (or Record's reply), not %s" %
                        type(spec_id).__name__)
    return spec_id


def _value(v):
    if isinstance(v, pb.Value):
        return v
    if isinstance(v, Ref):
        return pb.Value(index=v.index)
    if isinstance(v, str):
        return pb.Value(name=v)
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return pb.Value(index=int(v))
    raise TypeError("a value is a node name, a node index or a Ref, not %r" %
                    (v,))


def _values(vs):
    if vs is None:
        return []
    if isinstance(vs, (str, int, np.integer, Ref, pb.Value)):
        return [_value(vs)]
    return [_value(v) for v in vs]


def _feeds(feeds):
    if feeds is None:
        return []
    items = feeds.items() if hasattr(feeds, "items") else feeds
    return [pb.Feed(input=_value(k), tensor=to_tensor(v)) for k, v in items]


def _params(params):
    if params is None:
        return []  # the spec's initial values
    if isinstance(params, Blob):
        params = params.refs()
    return [to_tensor(p) for p in params]


def _state(state):
    if state is None or isinstance(state, pb.OptimizerState):
        return state
    if isinstance(state, OptimizerState):
        return state.proto()
    raise TypeError("state is an OptimizerState, not %s" %
                    type(state).__name__)


_NUMERICS = {"exact": pb.EXACT, "fast": pb.FAST}


def _numerics(n):
    if isinstance(n, str):
        try:
            return _NUMERICS[n.lower()]
        except KeyError:
            raise ValueError("numerics is 'exact' or 'fast', not %r" %
                             n) from None
    return int(n)


def _exec(numerics, backend, threads):
    if numerics is None and backend is None and threads is None:
        return None
    e = pb.ExecOptions()
    if numerics is not None:
        e.numerics = _numerics(numerics)
    if backend is not None:
        e.backend = backend
    if threads is not None:
        e.threads = int(threads)
    return e


def _entry(roots, observes, training, numerics, backend, threads):
    roots = _values(roots)
    if not roots:
        raise ValueError("an entry needs at least one root")
    e = pb.Entry(roots=roots, observes=_values(observes),
                 posture=pb.TRAINING if training else pb.FORWARD)
    if numerics is not None:
        e.numerics = _numerics(numerics)
    if backend is not None:
        e.backend = backend
    if threads is not None:
        e.threads = int(threads)
    return e


_FORMATS = {"text": pb.TEXT, "json": pb.JSON, "dot": pb.DOT, "svg": pb.SVG}


# -------------------------------------------------------------- client

class Client:
    """A connection to toposd.

    address: "HOST:PORT"; None takes $TOPOS_SERVER, else 127.0.0.1:50051.
    token: the bearer token a daemon with tenants requires; None takes
    $TOPOS_TOKEN ("" sends none).  timeout: each call's deadline in
    seconds (None: no deadline); every method also takes `timeout=`.
    credentials: grpc.ChannelCredentials for a TLS daemon (default:
    plaintext).  Messages of any size are accepted both ways (the daemon
    has its own limit).  A client is safe to share between threads; use
    it as a context manager or call close().
    """

    def __init__(self, address=None, token=None, timeout=60.0,
                 credentials=None, options=None):
        self.address = address or os.environ.get("TOPOS_SERVER") or \
            DEFAULT_ADDRESS
        if token is None:
            token = os.environ.get("TOPOS_TOKEN")
        self._metadata = (("authorization", "Bearer " + token),) \
            if token else None
        self.timeout = timeout
        opts = [("grpc.max_receive_message_length", -1),
                ("grpc.max_send_message_length", -1)]
        opts.extend(options or ())
        if credentials is None:
            self._channel = grpc.insecure_channel(self.address, options=opts)
        else:
            self._channel = grpc.secure_channel(self.address, credentials,
                                                options=opts)
        self._stub = pb_grpc.ToposStub(self._channel)
        self._health_stub = None

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "topos.Client(%r)" % self.address

    def call(self, method, request, timeout=_UNSET):
        """Calls RPC `method` ("Forward", ...) with a request message and
        returns the reply message; a failure raises Error."""
        t = self.timeout if timeout is _UNSET else timeout
        try:
            return getattr(self._stub, method)(request, timeout=t,
                                               metadata=self._metadata)
        except grpc.RpcError as e:
            raise Error.from_rpc(e, method) from None

    # -- specs

    def record(self, spec, timeout=_UNSET):
        """Records a spec: a topos.Spec builder, a topos_pb2.Spec, or
        bytes (a canonical encoding, b"TPOS...", or a serialised Spec).
        Returns Recorded(id, nodes, parameters, inputs, summary); the id is
        the SHA-256 of the network's canonical encoding."""
        r = self.call("Record", as_spec(spec), timeout)
        return Recorded(r.id, r.nodes, r.parameters, r.inputs, r.summary)

    def describe(self, spec_id, format="text", timeout=_UNSET):
        """The spec's listing as text: format "text", "json", "dot" or
        "svg" (json: parse it with json.loads)."""
        try:
            f = _FORMATS[format.lower()]
        except (KeyError, AttributeError):
            raise ValueError("format is one of %s, not %r" %
                             (", ".join(_FORMATS), format)) from None
        return self.call("Describe", pb.DescribeRequest(
            id=_spec_id(spec_id), format=f), timeout).text

    def lower(self, spec_id, roots, observes=None, training=False,
              numerics=None, backend=None, threads=None, timeout=_UNSET):
        """The plan of an entry: Lowered(text, peak_bytes, groups)."""
        r = self.call("Lower", pb.LowerRequest(
            id=_spec_id(spec_id),
            entry=_entry(roots, observes, training, numerics, backend,
                         threads)), timeout)
        return Lowered(r.text, r.peak_bytes, r.groups)

    def emit(self, spec_id, roots, observes=None, training=False,
             generic=False, numerics=None, backend=None, threads=None,
             timeout=_UNSET):
        """The entry as a StableHLO module (MLIR text; `generic` for the
        generic form)."""
        return self.call("Emit", pb.EmitRequest(
            id=_spec_id(spec_id),
            entry=_entry(roots, observes, training, numerics, backend,
                         threads),
            form=pb.GENERIC if generic else pb.PRETTY), timeout).text

    def list_specs(self, page_size=0, timeout=_UNSET):
        """Yields the stored specs (topos_pb2.SpecInfo), newest first."""
        token = ""
        while True:
            r = self.call("ListSpecs", pb.ListSpecsRequest(
                page_size=page_size, page_token=token), timeout)
            yield from r.specs
            token = r.next_page_token
            if not token:
                return

    # -- execution

    def forward(self, spec_id, feeds=None, roots="loss", observes=None,
                params=None, numerics=None, backend=None, threads=None,
                timeout=_UNSET):
        """Runs the spec forward.  feeds: {input: array} (an input by
        name, node index or Ref) or (input, array) pairs; roots and
        observes: one value or a list; params: the parameters in slot
        order (arrays, BlobRefs, or a Blob), None for the spec's initial
        values.  numerics ("exact", "fast"), backend and threads are the
        run's.  Returns Forwarded(roots, observes, backends), arrays."""
        r = self.call("Forward", pb.ForwardRequest(
            id=_spec_id(spec_id),
            entry=_entry(roots, observes, False, numerics, backend, threads),
            parameters=_params(params), feeds=_feeds(feeds)), timeout)
        return Forwarded([from_tensor(t) for t in r.roots],
                         [from_tensor(t) for t in r.observes],
                         list(r.backends))

    def backward(self, spec_id, feeds=None, loss="loss", params=None,
                 numerics=None, backend=None, threads=None,
                 timeout=_UNSET):
        """The loss and its gradient for every parameter slot:
        Gradients(loss, gradients, backends)."""
        r = self.call("Backward", pb.BackwardRequest(
            id=_spec_id(spec_id), loss=_value(loss),
            parameters=_params(params), feeds=_feeds(feeds),
            exec=_exec(numerics, backend, threads)), timeout)
        return Gradients(r.loss, [from_tensor(t) for t in r.gradients],
                         list(r.backends))

    def step(self, spec_id, feeds=None, loss="loss", params=None,
             state=None, optimizer=None, observes=None, numerics=None,
             backend=None, threads=None, timeout=_UNSET):
        """One training step on the daemon: the parameters (None: the
        spec's initial values) and optimizer state (None: a fresh one) go
        in, the updated ones come back with the loss before the update:
        Stepped(params, state, loss, observes, backends).  optimizer:
        topos.SGD(...), topos.Adam(...), topos.AdamW(...) or a
        topos_pb2.Optimizer.  The daemon keeps nothing between steps."""
        if optimizer is None:
            raise ValueError("step needs an optimizer (topos.SGD(lr), ...)")
        req = pb.StepRequest(
            id=_spec_id(spec_id), loss=_value(loss),
            parameters=_params(params), feeds=_feeds(feeds),
            optimizer=optimizer, observes=_values(observes),
            exec=_exec(numerics, backend, threads))
        s = _state(state)
        if s is not None:
            req.state.CopyFrom(s)
        r = self.call("Step", req, timeout)
        return Stepped([from_tensor(t) for t in r.parameters],
                       OptimizerState.from_proto(r.state), r.loss,
                       [from_tensor(t) for t in r.observes],
                       list(r.backends))

    def trainer(self, spec_id, loss="loss", optimizer=None, params=None,
                state=None, observes=None, numerics=None, backend=None,
                threads=None):
        """A Trainer: Step calls that carry the parameters and optimizer
        state from one to the next."""
        return Trainer(self, spec_id, loss, optimizer, params, state,
                       observes, _exec(numerics, backend, threads))

    # -- blobs

    def put_blob(self, tensors, timeout=_UNSET):
        """Stores a list of arrays on the daemon once; returns Blob(id,
        bytes, count), whose refs() go anywhere parameters, feeds or
        moments go.  The id is content-addressed: the same tensors give
        the same id.  (The protocol has no call that reads a blob back.)"""
        tensors = list(tensors)
        r = self.call("PutBlob", pb.PutBlobRequest(
            tensors=[to_tensor(t) for t in tensors]), timeout)
        return Blob(r.id, r.bytes, len(tensors))

    def stat_blob(self, blob_id, timeout=_UNSET):
        """BlobStat(present, bytes) of a blob id."""
        if isinstance(blob_id, (Blob, BlobRef)):
            blob_id = blob_id.id
        r = self.call("StatBlob", pb.StatBlobRequest(id=blob_id), timeout)
        return BlobStat(r.present, r.bytes)

    # -- the daemon

    def health(self, timeout=_UNSET):
        """Health(status, version): status "serving" or "draining"."""
        r = self.call("Health", pb.HealthRequest(), timeout)
        return Health(r.status, r.version)

    def check(self, service="", timeout=_UNSET):
        """The standard grpc.health.v1 Check: "SERVING", "NOT_SERVING",
        ... for `service` ("" the whole server, or "topos.v1.Topos")."""
        from ._proto import health_pb2, health_pb2_grpc

        if self._health_stub is None:
            self._health_stub = health_pb2_grpc.HealthStub(self._channel)
        t = self.timeout if timeout is _UNSET else timeout
        try:
            r = self._health_stub.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=t,
                metadata=self._metadata)
        except grpc.RpcError as e:
            raise Error.from_rpc(e, "grpc.health.v1.Health/Check") from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)

    def stats(self, timeout=_UNSET):
        """The daemon's counters (topos_pb2.StatsReply)."""
        return self.call("Stats", pb.StatsRequest(), timeout)

    def backends(self, timeout=_UNSET):
        """The backend registry and devices (topos_pb2.BackendsReply)."""
        return self.call("Backends", pb.BackendsRequest(), timeout)


class Trainer:
    """Remote training: each step() is one Step call with the current
    parameters and optimizer state, which the reply replaces.

        t = client.trainer(spec_id, loss="loss", optimizer=topos.SGD(0.02))
        for x, y in data:
            loss = t.step(x=x, y=y)
        t.params  # the trained parameters, numpy arrays in slot order
    """

    def __init__(self, client, spec_id, loss, optimizer, params, state,
                 observes, exec_options):
        if optimizer is None:
            raise ValueError("a trainer needs an optimizer (topos.SGD(lr))")
        self.client = client
        self.spec_id = _spec_id(spec_id)
        self.loss = loss
        self.optimizer = optimizer
        self.params: Optional[list] = None if params is None else list(
            params)
        self.state = state
        self.observes = observes
        self.exec = exec_options
        self.last: Optional[Stepped] = None
        self.steps = 0

    def step(self, feeds=None, timeout=_UNSET, **named_feeds):
        """Runs one step with `feeds` (a dict or pairs) and/or inputs
        by name as keywords; returns the loss before the update."""
        pairs = list(_feeds(feeds)) + _feeds(named_feeds)
        req = pb.StepRequest(
            id=self.spec_id, loss=_value(self.loss),
            parameters=_params(self.params), feeds=pairs,
            optimizer=self.optimizer, observes=_values(self.observes),
            exec=self.exec)
        s = _state(self.state)
        if s is not None:
            req.state.CopyFrom(s)
        r = self.client.call("Step", req, timeout)
        self.last = Stepped([from_tensor(t) for t in r.parameters],
                            OptimizerState.from_proto(r.state), r.loss,
                            [from_tensor(t) for t in r.observes],
                            list(r.backends))
        self.params, self.state = self.last.params, self.last.state
        self.steps += 1
        return r.loss

    def forward(self, feeds=None, roots="loss", observes=None, **kw):
        """Client.forward with the trainer's current parameters."""
        return self.client.forward(self.spec_id, feeds, roots, observes,
                                   params=self.params, **kw)
