"""llama_ref.py - an independent Llama forward in numpy (float64), the
reference the llama suite holds topos's Llama to (tests/examples/test_llama.c).

It is Hugging Face's LlamaForCausalLM written out from its definition, not
from topos: h = embed_tokens[tokens]; per layer
h += o_proj(attn(input_layernorm(h))), h += down(silu(gate(m)) * up(m))
with m = post_attention_layernorm(h); logits = lm_head(norm(h)).  Linear
weights are [out, in] (y = x @ W.T), no biases.  RMSNorm is
x / sqrt(mean(x^2) + eps) * w.  RoPE is rotate-half: inv_freq =
1 / theta^(arange(0, Dh, 2) / Dh), emb = concat(freqs, freqs) with
freqs = pos * inv_freq, q' = q cos(emb) + rotate_half(q) sin(emb),
rotate_half(x) = concat(-x2, x1).  Grouped-query attention repeats each of
the KV key/value heads for H / KV consecutive query heads (repeat_kv);
softmax(q k^T / sqrt(Dh) + causal mask) v.

    python llama_ref.py OUTDIR VOCAB D H KV DH F LAYERS EPS THETA TIE SEED TOKENS...

writes OUTDIR/model.safetensors (random f32 weights with Hugging Face's
names; no lm_head.weight when TIE is 1) and OUTDIR/logits.f64 (the logits
[T, VOCAB] computed in float64 from those f32 weights, raw little-endian).
"""
import sys

import numpy as np
from safetensors.numpy import save_file


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope(x, theta):
    """x [heads, T, Dh] at positions 0..T-1."""
    dh = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, dh, 2, dtype=np.float64) / dh)
    freqs = np.outer(np.arange(x.shape[1], dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)  # [T, Dh]
    return x * np.cos(emb) + rotate_half(x) * np.sin(emb)


def attention(x, wq, wk, wv, wo, H, KV, dh, theta):
    T = x.shape[0]
    q = (x @ wq.T).reshape(T, H, dh).transpose(1, 0, 2)  # [H, T, Dh]
    k = (x @ wk.T).reshape(T, KV, dh).transpose(1, 0, 2)  # [KV, T, Dh]
    v = (x @ wv.T).reshape(T, KV, dh).transpose(1, 0, 2)
    q, k = rope(q, theta), rope(k, theta)
    k = np.repeat(k, H // KV, axis=0)  # repeat_kv: head h uses kv head h // R
    v = np.repeat(v, H // KV, axis=0)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    s = q @ k.transpose(0, 2, 1) / np.sqrt(dh) + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = (p @ v).transpose(1, 0, 2).reshape(T, H * dh)
    return o @ wo.T


def silu(x):
    return x / (1.0 + np.exp(-x))


def main():
    out = sys.argv[1]
    V, D, H, KV, DH, F, L = map(int, sys.argv[2:9])
    eps, theta = float(sys.argv[9]), float(sys.argv[10])
    tie, seed = int(sys.argv[11]), int(sys.argv[12])
    tokens = [int(t) for t in sys.argv[13:]]
    rng = np.random.default_rng(seed)

    def normal(*shape, sd=0.02):
        return (rng.standard_normal(shape) * sd).astype(np.float32)

    def gain(n):  # RMSNorm weights away from 1
        return (1 + rng.standard_normal(n) * 0.1).astype(np.float32)

    w = {"model.embed_tokens.weight": normal(V, D, sd=1.0)}
    for l in range(L):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = gain(D)
        w[p + "self_attn.q_proj.weight"] = normal(H * DH, D, sd=0.2)
        w[p + "self_attn.k_proj.weight"] = normal(KV * DH, D, sd=0.2)
        w[p + "self_attn.v_proj.weight"] = normal(KV * DH, D, sd=0.2)
        w[p + "self_attn.o_proj.weight"] = normal(D, H * DH, sd=0.1)
        w[p + "post_attention_layernorm.weight"] = gain(D)
        w[p + "mlp.gate_proj.weight"] = normal(F, D, sd=0.2)
        w[p + "mlp.up_proj.weight"] = normal(F, D, sd=0.2)
        w[p + "mlp.down_proj.weight"] = normal(D, F, sd=0.1)
    w["model.norm.weight"] = gain(D)
    if not tie:
        w["lm_head.weight"] = normal(V, D, sd=0.2)
    save_file(w, out + "/model.safetensors")

    f = {k: v.astype(np.float64) for k, v in w.items()}
    h = f["model.embed_tokens.weight"][tokens]
    for l in range(L):
        p = f"model.layers.{l}."
        a = rms_norm(h, f[p + "input_layernorm.weight"], eps)
        h = h + attention(a, f[p + "self_attn.q_proj.weight"],
                          f[p + "self_attn.k_proj.weight"],
                          f[p + "self_attn.v_proj.weight"],
                          f[p + "self_attn.o_proj.weight"], H, KV, DH, theta)
        m = rms_norm(h, f[p + "post_attention_layernorm.weight"], eps)
        m = silu(m @ f[p + "mlp.gate_proj.weight"].T) * (m @ f[p + "mlp.up_proj.weight"].T)
        h = h + m @ f[p + "mlp.down_proj.weight"].T
    h = rms_norm(h, f["model.norm.weight"], eps)
    head = f["model.embed_tokens.weight"] if tie else f["lm_head.weight"]
    logits = h @ head.T
    logits.astype("<f8").tofile(out + "/logits.f64")


if __name__ == "__main__":
    main()
