"""gpt2_ref.py - an independent GPT-2 forward in numpy (float64), the
reference the gpt2 suite holds topos's GPT-2 to (tests/examples/test_gpt2.c).

It is Hugging Face's GPT2LMHeadModel written out from its definition, not
from topos: token + position embeddings; per block x += attn(ln_1(x)),
x += mlp(ln_2(x)) with Conv1D weights [in, out], causal softmax attention
scaled by 1/sqrt(head size), gelu_new (the tanh approximation), LayerNorm
eps 1e-5; ln_f; logits = x @ wte.T (the tied head).

    python gpt2_ref.py OUTDIR VOCAB CONTEXT WIDTH HEADS LAYERS SEED TOKENS...

writes OUTDIR/model.safetensors (random f32 weights with Hugging Face's
names, under GPT2LMHeadModel's "transformer." prefix, with the tied
lm_head.weight beside them) and OUTDIR/logits.f64 (the logits [T, VOCAB]
computed in float64 from those f32 weights, raw little-endian).
"""
import sys

import numpy as np
from safetensors.numpy import save_file


def layer_norm(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def attention(x, w, b, wo, bo, heads):
    T, D = x.shape
    qkv = x @ w + b
    q, k, v = qkv[:, :D], qkv[:, D:2 * D], qkv[:, 2 * D:]
    dh = D // heads
    out = np.zeros((T, D))
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for h in range(heads):
        s = slice(h * dh, (h + 1) * dh)
        a = q[:, s] @ k[:, s].T / np.sqrt(dh) + mask
        a = np.exp(a - a.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        out[:, s] = a @ v[:, s]
    return out @ wo + bo


def main():
    out = sys.argv[1]
    V, T_ctx, D, H, L, seed = map(int, sys.argv[2:8])
    tokens = [int(t) for t in sys.argv[8:]]
    rng = np.random.default_rng(seed)

    def normal(*shape, sd=0.02):
        return (rng.standard_normal(shape) * sd).astype(np.float32)

    def small(*shape):  # biases and LayerNorm parameters away from 0 and 1
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    w = {"wte.weight": normal(V, D), "wpe.weight": normal(T_ctx, D)}
    for l in range(L):
        p = f"h.{l}."
        w[p + "ln_1.weight"] = 1 + small(D)
        w[p + "ln_1.bias"] = small(D)
        w[p + "attn.c_attn.weight"] = normal(D, 3 * D)
        w[p + "attn.c_attn.bias"] = small(3 * D)
        w[p + "attn.c_proj.weight"] = normal(D, D)
        w[p + "attn.c_proj.bias"] = small(D)
        w[p + "ln_2.weight"] = 1 + small(D)
        w[p + "ln_2.bias"] = small(D)
        w[p + "mlp.c_fc.weight"] = normal(D, 4 * D)
        w[p + "mlp.c_fc.bias"] = small(4 * D)
        w[p + "mlp.c_proj.weight"] = normal(4 * D, D)
        w[p + "mlp.c_proj.bias"] = small(D)
    w["ln_f.weight"] = 1 + small(D)
    w["ln_f.bias"] = small(D)
    files = {"transformer." + k: v for k, v in w.items()}
    files["lm_head.weight"] = w["wte.weight"].copy()
    save_file(files, out + "/model.safetensors")

    f = {k: v.astype(np.float64) for k, v in w.items()}
    T = len(tokens)
    x = f["wte.weight"][tokens] + f["wpe.weight"][:T]
    for l in range(L):
        p = f"h.{l}."
        a = layer_norm(x, f[p + "ln_1.weight"], f[p + "ln_1.bias"])
        x = x + attention(a, f[p + "attn.c_attn.weight"], f[p + "attn.c_attn.bias"],
                          f[p + "attn.c_proj.weight"], f[p + "attn.c_proj.bias"], H)
        m = layer_norm(x, f[p + "ln_2.weight"], f[p + "ln_2.bias"])
        m = gelu_new(m @ f[p + "mlp.c_fc.weight"] + f[p + "mlp.c_fc.bias"])
        x = x + m @ f[p + "mlp.c_proj.weight"] + f[p + "mlp.c_proj.bias"]
    x = layer_norm(x, f["ln_f.weight"], f["ln_f.bias"])
    logits = x @ f["wte.weight"].T
    logits.astype("<f8").tofile(out + "/logits.f64")


if __name__ == "__main__":
    main()
