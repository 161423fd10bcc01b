"""gpt2_torch.py - GPT-2 in PyTorch, the reference the gpt2 suite holds
topos's GPT-2 to (tests/examples/test_gpt2.c).  Run it with
/usr/bin/python3 (Debian's python3-torch, `make deps`).

A short GPT2LMHeadModel written as torch.nn.Modules the way Hugging Face
defines it, not from topos: token + position embeddings; per block
x += attn(ln_1(x)), x += mlp(ln_2(x)); Conv1D weights [in, out]
(y = x @ W + b) for c_attn, c_proj, c_fc and mlp.c_proj; causal softmax
attention scaled by 1/sqrt(head size); gelu_new (the tanh approximation);
LayerNorm eps 1e-5; ln_f; lm_head tied to wte.

    python3 gpt2_torch.py OUTDIR VOCAB CONTEXT WIDTH HEADS LAYERS SEED TOKENS...

writes OUTDIR/model.safetensors (the module's random f32 weights, drawn
from SEED, under Hugging Face's names: GPT2LMHeadModel's "transformer."
prefix, the tied lm_head.weight beside them), OUTDIR/logits.f32 (the
logits [T, VOCAB] of the module as a user runs it, in float32) and
OUTDIR/logits.f64 (the same module after .double(): float64 arithmetic on
those f32 weights), both raw little-endian.
"""
import math
import sys

import torch
from torch import nn

import st_write


class Conv1D(nn.Module):
    """Hugging Face's Conv1D: a linear layer with its weight [in, out]."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        shape = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shape)


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.heads, self.dh = heads, width // heads
        self.c_attn = Conv1D(3 * width, width)
        self.c_proj = Conv1D(width, width)
        mask = torch.tril(torch.ones(context, context, dtype=torch.bool))
        self.register_buffer("bias", mask.view(1, 1, context, context), persistent=False)

    def split(self, x):  # [B, T, D] -> [B, H, T, Dh]
        return x.view(x.shape[:-1] + (self.heads, self.dh)).permute(0, 2, 1, 3)

    def forward(self, x):
        q, k, v = self.c_attn(x).split(x.shape[-1], dim=2)
        q, k, v = self.split(q), self.split(k), self.split(v)
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.dh)
        t = q.shape[-2]
        w = torch.where(self.bias[:, :, :t, :t], w, torch.finfo(w.dtype).min)
        w = nn.functional.softmax(w, dim=-1)
        a = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous()
        return self.c_proj(a.view(a.shape[:-2] + (-1,)))


class GPT2MLP(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.c_fc = Conv1D(4 * width, width)
        self.c_proj = Conv1D(width, 4 * width)

    def forward(self, x):
        return self.c_proj(gelu_new(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width, eps=1e-5)
        self.attn = GPT2Attention(width, heads, context)
        self.ln_2 = nn.LayerNorm(width, eps=1e-5)
        self.mlp = GPT2MLP(width)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, vocab, context, width, heads, layers):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.h = nn.ModuleList(GPT2Block(width, heads, context) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width, eps=1e-5)

    def forward(self, ids):
        pos = torch.arange(ids.shape[-1]).unsqueeze(0)
        x = self.wte(ids) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, vocab, context, width, heads, layers):
        super().__init__()
        self.transformer = GPT2Model(vocab, context, width, heads, layers)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied

    def forward(self, ids):
        return self.lm_head(self.transformer(ids))


def main():
    out = sys.argv[1]
    V, T_ctx, D, H, L, seed = map(int, sys.argv[2:8])
    tokens = [int(t) for t in sys.argv[8:]]
    model = GPT2LMHeadModel(V, T_ctx, D, H, L).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # the tied head once
            r = torch.randn(p.shape, generator=g)
            if ".ln_" in name or name.startswith("transformer.ln_f"):
                # LayerNorm gains and biases away from 1 and 0
                p.copy_(r * 0.1 + (1.0 if name.endswith("weight") else 0.0))
            elif name.endswith("bias"):
                p.copy_(r * 0.1)
            else:
                p.copy_(r * 0.02)
    st_write.save(model.state_dict(), out + "/model.safetensors")

    ids = torch.tensor([tokens])
    with torch.no_grad():
        model(ids)[0].numpy().astype("<f4").tofile(out + "/logits.f32")
        model.double()(ids)[0].numpy().astype("<f8").tofile(out + "/logits.f64")


if __name__ == "__main__":
    main()
