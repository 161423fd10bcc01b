#!/usr/bin/python3
"""train_torch.py - PyTorch's side of bench/train.c (docs/bench.md).

The same three models as bench/models.h, f32, with the same batch sizes:

  makemore  embedding 27x10, context 3 -> linear 30x100 -> tanh
            -> linear 100x27, batch 64
  lenet     [64,1,28,28] -> conv 6@5x5 pad 2 -> relu -> max_pool 2
            -> conv 16@5x5 -> relu -> max_pool 2 -> [64,400] -> linear 120
            -> relu -> linear 84 -> relu -> linear 10, batch 64
  mlp784    784 -> 256 -> relu -> 256 -> relu -> 10, batch 128

each with F.cross_entropy against integer targets and torch.optim.SGD
(lr 0.01).  A training step is zero_grad(set_to_none=True), forward,
backward and optimizer.step().  The data is random and seeded; a fixed
set of batches is cycled.  After a warm-up the steps are timed in blocks
(time.perf_counter, CLOCK_MONOTONIC on Linux) and the figure is the
median block time divided by the block's steps.  Prints one line:

  ms_per_step=0.1412 steps=12345 threads=1 minflt_per_step=0.00 loss=3.2958

Run it with /usr/bin/python3 (Debian's python3-torch).  bench/train.c
chooses the environment: it removes OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE
and tries two malloc settings.
"""
import argparse
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
    else:
        net, n = Mlp784(), 128
        xs = [torch.rand((n, 784), generator=gen) for _ in range(NBATCHES)]
        classes = 10
    ys = [torch.randint(0, classes, (n,), generator=gen) for _ in range(NBATCHES)]
    return net, list(zip(xs, ys))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, choices=["makemore", "lenet", "mlp784"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # only allowed before any inter-op work has started
    torch.manual_seed(20240601)
    gen = torch.Generator().manual_seed(20240601)
    net, batches = make(args.model, gen)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    steps = 0
    loss = None

    def step():
        nonlocal steps, loss
        x, y = batches[steps % NBATCHES]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
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
    print("ms_per_step=%.4f steps=%d threads=%d minflt_per_step=%.2f loss=%.6f"
          % (med * 1e3 / block, timed, torch.get_num_threads(),
             (f1 - f0) / timed, float(loss)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
