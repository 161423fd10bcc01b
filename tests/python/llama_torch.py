"""llama_torch.py - Llama in PyTorch, the reference the llama suite holds
topos's Llama to (tests/examples/test_llama.c).  Run it with
/usr/bin/python3 (Debian's python3-torch, `make deps`).

A short LlamaForCausalLM written as torch.nn.Modules the way Hugging Face
defines it, not from topos: h = embed_tokens(ids); per layer
h += o_proj(attn(input_layernorm(h))), h += down(silu(gate(m)) * up(m))
with m = post_attention_layernorm(h); logits = lm_head(norm(h)).  Linear
layers without biases, weights [out, in].  RMSNorm is
w * x / sqrt(mean(x^2) + eps).  Rotary embeddings are rotate-half:
inv_freq = 1 / theta^(arange(0, Dh, 2) / Dh), emb = cat(freqs, freqs)
with freqs = pos * inv_freq, q' = q cos(emb) + rotate_half(q) sin(emb),
rotate_half(x) = cat(-x2, x1).  Grouped-query attention: repeat_kv repeats
each of the KV key/value heads for H / KV consecutive query heads;
softmax(q k^T / sqrt(Dh) + causal mask) v.  head_dim may differ from
D / H (o_proj is [D, H * Dh]).

One departure from Hugging Face: its RMSNorm, softmax and rotary angles
upcast to float32 and come back, which in float32 is the identity and in
float64 would round; here they stay in the input's dtype, so the float64
run is float64 throughout.

    python3 llama_torch.py OUTDIR VOCAB D H KV DH F LAYERS EPS THETA TIE SEED TOKENS...

writes OUTDIR/model.safetensors (the module's random f32 weights, drawn
from SEED, under Hugging Face's names; lm_head tied to embed_tokens and
no lm_head.weight in the file when TIE is 1, as save_pretrained writes
it), OUTDIR/logits.f32 (the logits [T, VOCAB] of the module as a user
runs it, in float32) and OUTDIR/logits.f64 (the same module after
.double(): float64 arithmetic on those f32 weights), both raw
little-endian.
"""
import math
import sys

import torch
from torch import nn

import st_write


class LlamaRMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(dh, theta, t, dtype):
    """cos, sin [T, Dh] at positions 0..T-1."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dh, 2, dtype=dtype) / dh))
    freqs = torch.outer(torch.arange(t, dtype=dtype), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def repeat_kv(x, n_rep):  # [B, KV, T, Dh] -> [B, KV * n_rep, T, Dh]
    b, kv, t, dh = x.shape
    return x[:, :, None].expand(b, kv, n_rep, t, dh).reshape(b, kv * n_rep, t, dh)


class LlamaAttention(nn.Module):
    def __init__(self, d, heads, kv_heads, dh, theta):
        super().__init__()
        self.heads, self.kv_heads, self.dh, self.theta = heads, kv_heads, dh, theta
        self.q_proj = nn.Linear(d, heads * dh, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * dh, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * dh, bias=False)
        self.o_proj = nn.Linear(heads * dh, d, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.dh).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.dh).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.dh).transpose(1, 2)
        cos, sin = rotary(self.dh, self.theta, t, x.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = repeat_kv(k, self.heads // self.kv_heads)
        v = repeat_kv(v, self.heads // self.kv_heads)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.dh)
        mask = torch.full((t, t), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)
        w = nn.functional.softmax(w + mask, dim=-1)
        a = torch.matmul(w, v).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(a)


class LlamaMLP(nn.Module):
    def __init__(self, d, ffn):
        super().__init__()
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, d, heads, kv_heads, dh, ffn, eps, theta):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(d, eps)
        self.self_attn = LlamaAttention(d, heads, kv_heads, dh, theta)
        self.post_attention_layernorm = LlamaRMSNorm(d, eps)
        self.mlp = LlamaMLP(d, ffn)

    def forward(self, h):
        h = h + self.self_attn(self.input_layernorm(h))
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, vocab, d, heads, kv_heads, dh, ffn, layers, eps, theta):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(d, heads, kv_heads, dh, ffn, eps, theta) for _ in range(layers))
        self.norm = LlamaRMSNorm(d, eps)

    def forward(self, ids):
        h = self.embed_tokens(ids)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)


class LlamaForCausalLM(nn.Module):
    def __init__(self, vocab, d, heads, kv_heads, dh, ffn, layers, eps, theta, tie):
        super().__init__()
        self.model = LlamaModel(vocab, d, heads, kv_heads, dh, ffn, layers, eps, theta)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        if tie:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, ids):
        return self.lm_head(self.model(ids))


# Standard deviations of the random weights: large enough that attention
# and the MLP move the residual stream; RMSNorm gains are 1 + 0.1 N(0, 1).
SD = {"embed_tokens": 1.0, "q_proj": 0.2, "k_proj": 0.2, "v_proj": 0.2,
      "o_proj": 0.1, "gate_proj": 0.2, "up_proj": 0.2, "down_proj": 0.1,
      "lm_head": 0.2}


def main():
    out = sys.argv[1]
    V, D, H, KV, DH, F, L = map(int, sys.argv[2:9])
    eps, theta = float(sys.argv[9]), float(sys.argv[10])
    tie, seed = int(sys.argv[11]), int(sys.argv[12])
    tokens = [int(t) for t in sys.argv[13:]]
    model = LlamaForCausalLM(V, D, H, KV, DH, F, L, eps, theta, tie).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied head once
            r = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(1 + r * 0.1)
            else:
                p.copy_(r * SD[name.split(".")[-2]])
    w = model.state_dict()
    if tie:
        del w["lm_head.weight"]
    st_write.save(w, out + "/model.safetensors")

    ids = torch.tensor([tokens])
    with torch.no_grad():
        model(ids)[0].numpy().astype("<f4").tofile(out + "/logits.f32")
        model.double()(ids)[0].numpy().astype("<f8").tofile(out + "/logits.f64")


if __name__ == "__main__":
    main()
