#!/usr/bin/env python3
"""An independent PyTorch implementation of the Llama model in a GGUF file, for
tests/examples/test_chat.cpp: weights dequantized as the `gguf` package does, math in fp32 with a
round to fp16 where examples/chat keeps fp16 (q, k, v after their projection and after RoPE,
the attention output), so the two agree to accumulation order:

  x = embed[tok]; per layer: h = rmsnorm(x + residual); q, k, v = fp16(h @ W^T); RoPE on
  adjacent pairs (llama.cpp permuted the q/k rows for that), fp16; o = fp16(softmax(q k^T / 8) v)
  over the causal cache; x = o @ Wo^T; h = rmsnorm(x + residual); x = (silu(g) * u) @ Wd^T;
  logits = rmsnorm(x + residual) @ E^T.

Usage: chat_reference.py MODEL TOKENS STEPS LOGITS_OUT
  TOKENS comma-separated prompt ids; prints the STEPS greedy tokens as a JSON list and writes the
  prefill's last-position logits (float32, little-endian) to LOGITS_OUT.
"""
import json
import sys

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize


def fp16(t):
    return t.to(torch.float16).to(torch.float32)


def main():
    path, tokens, steps, logits_out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    prompt = [int(t) for t in tokens.split(",")]
    torch.set_grad_enabled(False)
    torch.set_num_threads(1)  # ctest runs tests side by side (see test_chat.cpp)
    r = GGUFReader(path)
    f = {k: v for k, v in r.fields.items()}

    def meta(key):
        return f[key].contents()

    tensors = {t.name: t for t in r.tensors}

    def fast_dequantize(t):
        # The GGML block formulas in torch (the gguf package's numpy dequantize is the
        # authority; it is slower, so it checks one tensor of each type below, bit for bit).
        raw = torch.from_numpy(np.array(t.data, copy=True))
        if t.tensor_type == GGMLQuantizationType.F32:
            return raw.float()
        rows = raw.shape[0]
        if t.tensor_type == GGMLQuantizationType.Q4_1:
            b = raw.reshape(rows, -1, 20)
            d = b[:, :, 0:2].contiguous().view(torch.float16).float()
            m = b[:, :, 2:4].contiguous().view(torch.float16).float()
            q = torch.cat([b[:, :, 4:] & 15, b[:, :, 4:] >> 4], dim=2).float()
            return (d * q + m).reshape(rows, -1)
        if t.tensor_type == GGMLQuantizationType.Q8_0:
            b = raw.reshape(rows, -1, 34)
            d = b[:, :, 0:2].contiguous().view(torch.float16).float()
            q = b[:, :, 2:].contiguous().view(torch.int8).float()
            return (d * q).reshape(rows, -1)
        raise SystemExit("unsupported tensor type %s in %s" % (t.tensor_type, t.name))

    checked = set()

    def w(name):
        t = tensors[name]
        out = fast_dequantize(t)
        if t.tensor_type not in checked and t.tensor_type != GGMLQuantizationType.F32:
            checked.add(t.tensor_type)
            rows = min(64, t.data.shape[0])  # the first rows: enough to pin the layout
            ref = torch.from_numpy(np.ascontiguousarray(dequantize(t.data[:rows], t.tensor_type)))
            if not torch.equal(out[:rows].reshape(ref.shape), ref):
                raise SystemExit("dequantization of %s differs from the gguf package's" % name)
        return out

    L = int(meta("llama.block_count"))
    H = int(meta("llama.embedding_length"))
    Hq = int(meta("llama.attention.head_count"))
    Hkv = int(meta("llama.attention.head_count_kv"))
    eps = float(meta("llama.attention.layer_norm_rms_epsilon"))
    theta = float(meta("llama.rope.freq_base"))
    D = H // Hq
    E = w("token_embd.weight")  # [vocab, H] fp32
    layers = []
    for l in range(L):
        p = "blk.%d." % l
        layers.append({
            "an": w(p + "attn_norm.weight"), "fn": w(p + "ffn_norm.weight"),
            "q": w(p + "attn_q.weight"), "k": w(p + "attn_k.weight"),
            "v": w(p + "attn_v.weight"), "o": w(p + "attn_output.weight"),
            "g": w(p + "ffn_gate.weight"), "u": w(p + "ffn_up.weight"),
            "d": w(p + "ffn_down.weight"),
        })
    out_norm = w("output_norm.weight")
    freqs = torch.tensor([theta ** (-2.0 * i / D) for i in range(D // 2)], dtype=torch.float64)
    cache = [([], []) for _ in range(L)]

    def norm(s, wt):
        return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * wt

    def rope(x, pos):  # x [n, heads, D] fp16 values; adjacent pairs rotated
        ang = torch.tensor(pos, dtype=torch.float64)[:, None] * freqs[None, :]
        c = torch.cos(ang).float()[:, None, :]
        s = torch.sin(ang).float()[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = b * c + a * s
        return fp16(out)

    def forward(toks, start):
        n = len(toks)
        pos = list(range(start, start + n))
        x = E[toks]
        residual = None
        for l, Lw in enumerate(layers):
            if l == 0:
                residual = x
                h = norm(x, Lw["an"])
            else:
                s = x + residual
                residual = s
                h = norm(s, Lw["an"])
            q = fp16(h @ Lw["q"].T).view(n, Hq, D)
            k = fp16(h @ Lw["k"].T).view(n, Hkv, D)
            v = fp16(h @ Lw["v"].T).view(n, Hkv, D)
            q, k = rope(q, pos), rope(k, pos)
            cache[l][0].append(k)
            cache[l][1].append(v)
            K = torch.cat(cache[l][0]).repeat_interleave(Hq // Hkv, dim=1)  # [T, Hq, D]
            V = torch.cat(cache[l][1]).repeat_interleave(Hq // Hkv, dim=1)
            T = K.shape[0]
            sc = torch.einsum("nhd,thd->hnt", q, K) / (D ** 0.5)
            mask = torch.arange(T)[None, :] > torch.tensor(pos)[:, None]
            sc = sc.masked_fill(mask[None], float("-inf"))
            o = fp16(torch.einsum("hnt,thd->nhd", torch.softmax(sc, -1), V)).reshape(n, Hq * D)
            a = o @ Lw["o"].T
            s = a + residual
            residual = s
            h = norm(s, Lw["fn"])
            g, u = h @ Lw["g"].T, h @ Lw["u"].T
            act = torch.nn.functional.silu(g) * u
            x = act @ Lw["d"].T
        s = x + residual
        h = norm(s, out_norm)
        return h[-1:] @ E.T  # fp32 logits of the last position

    logits = forward(prompt, 0)[0]
    logits.numpy().astype("<f4").tofile(logits_out)
    out = [int(torch.argmax(logits))]
    length = len(prompt)
    while len(out) < steps:
        logits = forward([out[-1]], length)[0]
        length += 1
        out.append(int(torch.argmax(logits)))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
