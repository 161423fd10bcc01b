#!/usr/bin/python3
"""gpt2_torch.py - PyTorch's side of bench/gpt2.c (docs/bench.md).

GPT-2 124M, f32, as Hugging Face's GPT2LMHeadModel computes it: token and
position embeddings, 12 pre-LayerNorm blocks (eps 1e-5) of 12-head causal
self-attention (c_attn holding q, k, v as column blocks) and a GELU-tanh
MLP 4x wide, a final LayerNorm, the head tied to the token embedding.
The linear layers are HF's Conv1D: weight [in, out], y = b + x @ W
(torch.addmm).  Attention is the explicit product: q k^T / sqrt(64), the
upper triangle masked to -inf, softmax, times v (Debian's torch 1.13 has
no F.scaled_dot_product_attention).  Decoding uses a KV cache as HF does:
per layer the past keys and values [1, heads, past, 64], the new
position's concatenated to them at each step.

The weights come from the safetensors FILE that bench/gpt2 wrote (HF's
names, no "transformer." prefix), parsed by hand (8-byte little-endian
header length, a JSON header, the raw data): each tensor is allocated
once and read straight into (no second copy), so the weights occupy their
size in memory.

Measurements, under torch.inference_mode(), the same as bench/gpt2's:

  forward  the 256 tokens (splitmix64 from SEED, each mod 50257, the
           sequence bench/gpt2 draws) in one call, full logits
           [256, 50257]; one untimed warm-up, then the median of REPS
           timed calls (time.perf_counter);
  decode   prefill the first 128 tokens (one call, the cache built), then
           STEPS consecutive single-token steps at positions 128,
           129, ..., feeding tokens 128, 129, ... of the same sequence
           (teacher forcing: both sides see the same tokens whatever
           their logits); each of PASSES passes starts again from the
           prefilled cache, after an untimed warm-up pass of 2 steps; the
           figure is the median step time.

Both run at each thread count of --threads in turn (2,1: two threads,
then one), set with torch.set_num_threads and OpenBLAS's own
openblas_set_num_threads (torch does not pass its count on to OpenBLAS).
Writes the forward's last logits row (position 255) to OUTDIR/torch.fwd.f32
and the last decode step's row to OUTDIR/torch.dec.f32 (raw f32, little
endian) for bench/gpt2 to compare with topos's, and prints one line per
thread count and one of memory (VmHWM after loading, VmRSS then, VmHWM
after the first forward and at the end; 10^6 bytes) and OpenBLAS's
kernels:

  result threads=2 fwd_ms=640.1 dec_ms=41.2 prefill_ms=320.4
  rss load_s=0.41 hwm_load_mb=742.0 rss_load_mb=741.0 hwm_fwd_mb=919.0
      hwm_mb=926.0 corename=Cooperlake

Run it with /usr/bin/python3 (Debian's python3-torch); bench/gpt2.c sets
the environment (OpenBLAS variables, OPENBLAS_NUM_THREADS, malloc).
"""
import argparse
import ctypes
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CONTEXT, WIDTH, HEADS, LAYERS = 50257, 1024, 768, 12, 12
FWD_T, DEC_POS = 256, 128
MASK64 = (1 << 64) - 1


def splitmix64(state):
    """bench/models.h's splitmix64: (new state, output)."""
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def tokens(seed, n):
    """bench/gpt2.c's tokens: splitmix64 outputs mod the vocabulary."""
    out, state = [], seed
    for _ in range(n):
        state, r = splitmix64(state)
        out.append(r % VOCAB)
    return out


DTYPES = {"F32": torch.float32}
META = torch.device("meta")


def load_safetensors(path):
    """{name: tensor}, each read from the file into its own storage."""
    out = {}
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
        base = 8 + hlen
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info["dtype"] not in DTYPES:
                raise ValueError("%s: dtype %s, not F32" % (name, info["dtype"]))
            t = torch.empty(info["shape"], dtype=DTYPES[info["dtype"]])
            start, end = info["data_offsets"]
            buf = memoryview(t.numpy()).cast("B")
            if len(buf) != end - start:
                raise ValueError("%s: %d bytes for shape %s"
                                 % (name, end - start, info["shape"]))
            f.seek(base + start)
            if f.readinto(buf) != len(buf):
                raise ValueError("%s: truncated" % name)
            out[name] = t
    return out


class Conv1D(nn.Module):
    """Hugging Face's Conv1D: weight [in, out], y = b + x @ W."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out, device=META))
        self.bias = nn.Parameter(torch.empty(n_out, device=META))

    def forward(self, x):
        shape = x.shape[:-1] + (self.weight.shape[1],)
        y = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return y.view(shape)


class Attention(nn.Module):
    def __init__(self, mask):
        super().__init__()
        self.c_attn = Conv1D(WIDTH, 3 * WIDTH)
        self.c_proj = Conv1D(WIDTH, WIDTH)
        self.mask = mask  # [context, context], True above the diagonal

    def forward(self, x, past):
        b, t, d = x.shape
        hd = d // HEADS
        q, k, v = self.c_attn(x).split(d, dim=2)
        q = q.view(b, t, HEADS, hd).transpose(1, 2)
        k = k.view(b, t, HEADS, hd).transpose(1, 2)
        v = v.view(b, t, HEADS, hd).transpose(1, 2)
        if past is not None:
            k = torch.cat((past[0], k), dim=2)
            v = torch.cat((past[1], v), dim=2)
        s = k.shape[2]  # past + t positions
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        if t > 1:  # row i (position s - t + i) sees positions 0 .. s - t + i
            att = att.masked_fill(self.mask[s - t:s, :s], float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d)), (k, v)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = Conv1D(WIDTH, 4 * WIDTH)
        self.c_proj = Conv1D(4 * WIDTH, WIDTH)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, mask):
        super().__init__()
        self.ln_1 = nn.LayerNorm(WIDTH, eps=1e-5, device=META)
        self.attn = Attention(mask)
        self.ln_2 = nn.LayerNorm(WIDTH, eps=1e-5, device=META)
        self.mlp = Mlp()

    def forward(self, x, past):
        a, present = self.attn(self.ln_1(x), past)
        x = x + a
        return x + self.mlp(self.ln_2(x)), present


class Gpt2(nn.Module):
    """GPT2LMHeadModel's arithmetic; the head is wte (tied).  Built on
    the meta device (no memory), every parameter then replaced by the
    loaded weight."""

    def __init__(self):
        super().__init__()
        mask = torch.ones(CONTEXT, CONTEXT, dtype=torch.bool).triu(1)
        self.wte = nn.Embedding(VOCAB, WIDTH, device=META)
        self.wpe = nn.Embedding(CONTEXT, WIDTH, device=META)
        self.h = nn.ModuleList(Block(mask) for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH, eps=1e-5, device=META)

    def forward(self, ids, past=None):
        """ids [1, T] after len(past) cached positions: logits [T, vocab]
        and the new cache (a list of per-layer (k, v))."""
        t = ids.shape[1]
        start = 0 if past is None else past[0][0].shape[2]
        pos = torch.arange(start, start + t, dtype=torch.long)
        h = self.wte(ids) + self.wpe(pos)
        present = []
        for i, blk in enumerate(self.h):
            h, kv = blk(h, None if past is None else past[i])
            present.append(kv)
        h = self.ln_f(h)
        return (h.view(t, WIDTH) @ self.wte.weight.t()), present


def build(path):
    """The module with the file's weights, no extra copy of them."""
    net = Gpt2()
    weights = load_safetensors(path)
    want = dict(net.named_parameters())
    missing = [n for n in want if n not in weights]
    if missing:
        raise ValueError("%s: no weight %s" % (path, missing[0]))
    for name, p in want.items():
        w = weights[name]
        if tuple(w.shape) != tuple(p.shape):
            raise ValueError("%s: shape %s, expected %s"
                             % (name, tuple(w.shape), tuple(p.shape)))
        owner, _, attr = name.rpartition(".")
        setattr(net.get_submodule(owner) if owner else net, attr,
                nn.Parameter(w, requires_grad=False))
    net.eval()
    return net


def median(v):
    v = sorted(v)
    k = len(v)
    return v[k // 2] if k % 2 else 0.5 * (v[k // 2 - 1] + v[k // 2])


def write_row(path, row):
    row.contiguous().numpy().astype("<f4").tofile(path)


def openblas():
    """The OpenBLAS torch is linked with (Debian: libblas.so.3 is
    OpenBLAS), or None."""
    try:
        lib = ctypes.CDLL("libblas.so.3")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        lib.openblas_set_num_threads.argtypes = [ctypes.c_int]
        return lib
    except (OSError, AttributeError):
        return None


def status_mb(key):
    """A kB field of /proc/self/status in 10^6 bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024 / 1e6
    return float("nan")


def hwm_mb():
    """This process's peak resident set so far."""
    return status_mb("VmHWM")


def rss_now_mb():
    """This process's resident set now."""
    return status_mb("VmRSS")


def time_forward(net, ids, reps, outdir):
    """The median of reps forwards of the 256 tokens after a warm-up."""
    clock = time.perf_counter
    times = []
    for i in range(reps + 1):
        a = clock()
        logits, _ = net(ids)
        b = clock()
        if tuple(logits.shape) != (FWD_T, VOCAB):
            raise ValueError("logits %s" % (tuple(logits.shape),))
        if i > 0:
            times.append(b - a)
    write_row(os.path.join(outdir, "torch.fwd.f32"), logits[-1])
    return median(times) * 1e3


def time_decode(net, ids, passes, steps, outdir):
    """The prefill of 128 tokens, then passes of consecutive steps from
    position 128 after a 2-step warm-up pass: (median step, prefill)."""
    clock = time.perf_counter
    a = clock()
    _, base = net(ids[:, :DEC_POS])
    prefill_ms = (clock() - a) * 1e3
    times = []
    last = None
    for p in range(-1, passes):
        cache = base
        for s in range(2 if p < 0 else steps):
            pos = DEC_POS + s
            a = clock()
            last, cache = net(ids[:, pos:pos + 1], cache)
            b = clock()
            if p >= 0:
                times.append(b - a)
    write_row(os.path.join(outdir, "torch.dec.f32"), last[-1])
    return median(times) * 1e3, prefill_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file", help="the safetensors bench/gpt2 wrote")
    ap.add_argument("outdir", help="where the compared logits rows go")
    ap.add_argument("--threads", default="2",
                    help="thread counts, measured in turn: 2 or 2,1")
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16)
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]

    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # only allowed before any inter-op work has started
    blas = openblas()
    corename = blas.openblas_get_corename().decode() if blas else "unknown"
    t0 = time.perf_counter()
    net = build(args.file)
    load_s = time.perf_counter() - t0
    hwm_load, rss_load, hwm_fwd = hwm_mb(), rss_now_mb(), None
    ids = torch.tensor([tokens(args.seed, FWD_T)], dtype=torch.long)

    with torch.inference_mode():
        for t in threads:
            torch.set_num_threads(t)
            if blas:
                blas.openblas_set_num_threads(t)
            fwd_ms = time_forward(net, ids, args.reps, args.outdir)
            if hwm_fwd is None:
                hwm_fwd = hwm_mb()
            dec_ms, prefill_ms = time_decode(net, ids, args.passes,
                                             args.steps, args.outdir)
            print("result threads=%d fwd_ms=%.3f dec_ms=%.3f prefill_ms=%.3f"
                  % (torch.get_num_threads(), fwd_ms, dec_ms, prefill_ms),
                  flush=True)
    print("rss load_s=%.3f hwm_load_mb=%.1f rss_load_mb=%.1f hwm_fwd_mb=%.1f "
          "hwm_mb=%.1f corename=%s"
          % (load_s, hwm_load, rss_load, hwm_fwd, hwm_mb(), corename))
    return 0


if __name__ == "__main__":
    sys.exit(main())
