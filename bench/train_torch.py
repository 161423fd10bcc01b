#!/usr/bin/python3
"""train_torch.py - PyTorch's side of bench/train.c (docs/bench.md).

The same models as bench/models.h and examples/common/gpt.c, f32, with
the same batch sizes:

  makemore  embedding 27x10, context 3 -> linear 30x100 -> tanh
            -> linear 100x27, batch 64
  lenet     [64,1,28,28] -> conv 6@5x5 pad 2 -> relu -> max_pool 2
            -> conv 16@5x5 -> relu -> max_pool 2 -> [64,400] -> linear 120
            -> relu -> linear 84 -> relu -> linear 10, batch 64
  mlp784    784 -> 256 -> relu -> 256 -> relu -> 10, batch 128
  transformer  makemore's GPT (examples/common/gpt.h): 4 pre-LayerNorm
            blocks, 4 heads, width 64, context 16, vocab 27, GELU (tanh)
            MLP 4x, learned positions, lm_head without bias, GPT-2's
            initialisation, batch 32 sequences

each with F.cross_entropy against integer targets and torch.optim.SGD
(lr 0.01), but the transformer: cross entropy with ignore_index=-1 and
AdamW (lr 1e-3, betas 0.9/0.99, eps 1e-8, weight decay 0.01 on the
parameters of rank >= 2, topos_adamw's default).  A training step is
zero_grad(set_to_none=True), forward, backward and optimizer.step().
The data is random and seeded; a fixed set of batches is cycled.  After a warm-up the steps are timed in blocks
(time.perf_counter, CLOCK_MONOTONIC on Linux) and the figure is the
median block time divided by the block's steps.  Prints one line:

  ms_per_step=0.1412 steps=12345 threads=1 minflt_per_step=0.00 loss=3.2958 torch=1.13.0a0

(torch: torch.__version__, the build that ran; --version prints only
that field.)

With --epoch N it instead trains LeNet for the first N batches (0: all
937) of one Fashion-MNIST epoch (bench/train's fmnist-epoch row): the
train set's IDX files read with gzip (or plain), pixels scaled to [0,1] and
normalised by (0.2860, 0.3530), batches of 64 in the same seeded order
as bench/train (a splitmix64 Fisher-Yates shuffle), SGD with momentum
0.9 and lr 0.01, He-normal / Glorot-uniform initial weights as topos's.
Prints one line:

  epoch_s=5.123 steps=937 threads=2 loss=0.512345 first=2.301234 torch=1.13.0a0

(loss: the mean over the last 100 steps; first: the first step's).

bench/train.c runs it with each PyTorch build it finds: /usr/bin/python3
(Debian's python3-torch 1.13) and the python of $TORCH_VENV (torch from
PyPI, `make bench-deps`); it runs under both.  bench/train.c chooses the
environment: it removes OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE and tries
two malloc settings (and, for Debian's build, OpenBLAS pinned to
SkylakeX).
"""
import argparse
import gzip
import math
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

NBATCHES = 8


class Makemore(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(27, 10)
        self.fc1 = nn.Linear(3 * 10, 100)
        self.fc2 = nn.Linear(100, 27)

    def forward(self, x):
        h = self.emb(x).view(x.shape[0], 3 * 10)
        return self.fc2(torch.tanh(self.fc1(h)))


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.conv1(x)), 2, 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2, 2)
        h = h.reshape(x.shape[0], 400)
        h = F.relu(self.fc1(h))
        h = F.relu(self.fc2(h))
        return self.fc3(h)


class Mlp784(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc3 = nn.Linear(256, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class Block(nn.Module):
    """GPT-2's block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width, eps=1e-5)
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width, eps=1e-5)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def attention(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.c_attn(x).split(d, dim=2)
        q = q.view(b, t, h, d // h).transpose(1, 2)
        k = k.view(b, t, h, d // h).transpose(1, 2)
        v = v.view(b, t, h, d // h).transpose(1, 2)
        if SDPA is not None:
            y = SDPA(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
            att = att.masked_fill(self.mask[:t, :t], float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(
            F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


# F.scaled_dot_product_attention where this torch has it (2.0 and later).
SDPA = getattr(F, "scaled_dot_product_attention", None)


class Gpt(nn.Module):
    """examples/common/gpt.c's network, GPT-2's initialisation: weights
    normal(0, 0.02), the two residual projections normal(0, 0.02 /
    sqrt(2 * layers)), biases zero, LayerNorm gains one."""

    def __init__(self, vocab=27, context=16, width=64, heads=4, layers=4):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width, eps=1e-5)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        mask = torch.ones(context, context, dtype=torch.bool).triu(1)
        for blk in self.h:
            blk.register_buffer("mask", mask, persistent=False)
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue  # LayerNorm's defaults and Linear's zeroed below
            std = 0.02
            if name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight"):
                std = 0.02 / math.sqrt(2 * layers)
            nn.init.normal_(p, 0.0, std)
        for m in self.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        self.register_buffer("pos", torch.arange(context), persistent=False)

    def forward(self, x):
        b, t = x.shape
        h = self.wte(x) + self.wpe(self.pos[:t])
        for blk in self.h:
            h = blk(h)
        return self.lm_head(self.ln_f(h)).view(b * t, -1)


def padded_names(n, context, gen):
    """Sequences like makemore's padded names: x = [0, c1..cL, 0...],
    y = [c1..cL, 0, -1...] with L uniform in [2, context - 1]."""
    x = torch.zeros((n, context), dtype=torch.long)
    y = torch.full((n, context), -1, dtype=torch.long)
    for i in range(n):
        length = int(torch.randint(2, context, (1,), generator=gen))
        chars = torch.randint(1, 27, (length,), generator=gen)
        x[i, 1:length + 1] = chars
        y[i, :length] = chars
        y[i, length] = 0
    return x, y.view(n * context)


def make(model, gen):
    """The module and NBATCHES fixed (x, y) batches."""
    if model == "makemore":
        net, n = Makemore(), 64
        xs = [torch.randint(0, 27, (n, 3), generator=gen) for _ in range(NBATCHES)]
        classes = 27
    elif model == "lenet":
        net, n = LeNet(), 64
        xs = [torch.rand((n, 1, 28, 28), generator=gen) for _ in range(NBATCHES)]
        classes = 10
    elif model == "transformer":
        net = Gpt()
        return net, [padded_names(32, 16, gen) for _ in range(NBATCHES)]
    else:
        net, n = Mlp784(), 128
        xs = [torch.rand((n, 784), generator=gen) for _ in range(NBATCHES)]
        classes = 10
    ys = [torch.randint(0, classes, (n,), generator=gen) for _ in range(NBATCHES)]
    return net, list(zip(xs, ys))


def optimizer(model, net):
    if model != "transformer":
        return torch.optim.SGD(net.parameters(), lr=0.01)
    params = list(net.parameters())
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.01},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.99), eps=1e-8)


# ------------------------------------------------------ the Fashion-MNIST epoch

MASK64 = (1 << 64) - 1


def splitmix64(state):
    """bench/models.h's splitmix64: (new state, output)."""
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def epoch_order(n, seed):
    """bench/train.c's epoch_order: Fisher-Yates from the top."""
    perm = list(range(n))
    state = seed
    for i in range(n - 1, 0, -1):
        state, r = splitmix64(state)
        j = r % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def read_idx(path, rank):
    """An IDX ubyte file as a uint8 tensor: path.gz (gzip) first, as
    ex_mnist_load tries it, else path."""
    if os.path.exists(path + ".gz"):
        with gzip.open(path + ".gz", "rb") as f:
            data = f.read()
    else:
        with open(path, "rb") as f:
            data = f.read()
    if data[0:3] != b"\0\0\x08" or data[3] != rank:
        raise ValueError("%s: not a rank-%d ubyte IDX file" % (path, rank))
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    body = bytearray(data[4 + 4 * rank:])
    return torch.frombuffer(body, dtype=torch.uint8).view(*dims)


def init_like_topos(net):
    """bench/models.h's scheme: He normal on hidden layers, Glorot uniform
    on the last, zero biases."""
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                fan_in = m.weight[0].numel()
                if m is net.fc3:
                    nn.init.xavier_uniform_(m.weight)
                else:
                    nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_in))
                nn.init.zeros_(m.bias)


def run_epoch(args):
    images = read_idx(os.path.join(args.data, "train-images-idx3-ubyte"), 3)
    labels = read_idx(os.path.join(args.data, "train-labels-idx1-ubyte"), 1)
    n, batch = images.shape[0], 64
    perm = torch.tensor(epoch_order(n, 20240601), dtype=torch.long)
    steps = n // batch
    if args.epoch > 0:
        steps = min(steps, args.epoch)
    images = images.view(n, 1, 28, 28)
    labels = labels.long()
    torch.manual_seed(20240601)
    net = LeNet()
    init_like_topos(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    losses = []
    t0 = time.perf_counter()
    for s in range(steps):
        idx = perm[s * batch:(s + 1) * batch]
        x = images[idx].float().div_(255.0).sub_(0.2860).div_(0.3530)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), labels[idx])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    seconds = time.perf_counter() - t0
    tail = losses[-100:]
    print("epoch_s=%.4f steps=%d threads=%d loss=%.6f first=%.6f torch=%s"
          % (seconds, steps, torch.get_num_threads(), sum(tail) / len(tail),
             losses[0], torch.__version__))
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["makemore", "lenet", "mlp784", "transformer"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--epoch", type=int, default=None,
                    help="time one Fashion-MNIST epoch's first N batches (0: all)")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--version", action="store_true",
                    help="print torch=VERSION (this build's) and exit")
    args = ap.parse_args()
    if args.version:
        print("torch=%s" % torch.__version__)
        return 0
    if args.model is None and args.epoch is None:
        ap.error("--model or --epoch is required")

    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # only allowed before any inter-op work has started
    if args.epoch is not None:
        return run_epoch(args)
    torch.manual_seed(20240601)
    gen = torch.Generator().manual_seed(20240601)
    net, batches = make(args.model, gen)
    opt = optimizer(args.model, net)
    steps = 0
    loss = None

    def step():
        nonlocal steps, loss
        x, y = batches[steps % NBATCHES]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y, ignore_index=-1)
        loss.backward()
        opt.step()
        steps += 1

    # Warm-up: a fifth of the budget, at least two steps; it also gives
    # the step time that sizes the blocks.
    clock = time.perf_counter
    t0 = clock()
    warm = 0
    while warm < 2 or clock() - t0 < 0.2 * args.seconds:
        step()
        warm += 1
    per_step = (clock() - t0) / warm
    block = max(1, int(0.8 * args.seconds / 15 / per_step))
    times = []
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    timed = 0
    start = clock()
    while len(times) < 5 or (clock() - start < 0.8 * args.seconds and len(times) < 200):
        b0 = clock()
        for _ in range(block):
            step()
        times.append(clock() - b0)
        timed += block
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times.sort()
    k = len(times)
    med = times[k // 2] if k % 2 else 0.5 * (times[k // 2 - 1] + times[k // 2])
    print("ms_per_step=%.4f steps=%d threads=%d minflt_per_step=%.2f "
          "loss=%.6f torch=%s"
          % (med * 1e3 / block, timed, torch.get_num_threads(),
             (f1 - f0) / timed, float(loss.detach()), torch.__version__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
