#!/usr/bin/env python3
"""An independent PyTorch implementation of the Llama model in a GGUF file, for
tests/examples/test_chat.cpp: weights dequantized as the `gguf` package does, math in fp32 with a
round to fp16 where examples/chat keeps fp16 (q, k, v after their projection and after RoPE,
the attention output), so the two agree to accumulation order:

  x = embed[tok]; per layer: h = rmsnorm(x + residual); q, k, v = fp16(h @ W^T); RoPE on
  adjacent pairs (llama.cpp permuted the q/k rows for that), fp16; o = fp16(softmax(q k^T / 8) v)
  over the causal cache; x = o @ Wo^T; h = rmsnorm(x + residual); x = (silu(g) * u) @ Wd^T;
  logits = rmsnorm(x + residual) @ E^T.

The same code with dtype=torch.bfloat16 is the "PyTorch eager bf16" peer of
bench/chat_vs_peers.py: weights and activations bf16 (rmsnorm, RoPE and softmax computed in fp32
and rounded back, as Hugging Face's Llama does), no fp16 rounding points. `Reference` runs a
batch of equal-length prompts ([B, n] token ids) over a per-layer KV cache.

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


def fast_dequantize(t):
    # The GGML block formulas in torch (the gguf package's numpy dequantize is the authority; it
    # is slower, so Reference checks the first rows of one tensor of each type, bit for bit).
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


class Reference:
    """The model of a GGUF file in eager PyTorch. dtype float32: the test's reference (fp16
    rounding where the chat rounds); bfloat16: the benchmark's peer."""

    def __init__(self, path, dtype=torch.float32):
        self.dtype = dtype
        r = GGUFReader(path)
        f = {k: v for k, v in r.fields.items()}

        def meta(key):
            return f[key].contents()

        tensors = {t.name: t for t in r.tensors}
        checked = set()

        def w(name):
            t = tensors[name]
            out = fast_dequantize(t)
            if t.tensor_type not in checked and t.tensor_type != GGMLQuantizationType.F32:
                checked.add(t.tensor_type)
                rows = min(64, t.data.shape[0])  # the first rows: enough to pin the layout
                ref = torch.from_numpy(
                    np.ascontiguousarray(dequantize(t.data[:rows], t.tensor_type)))
                if not torch.equal(out[:rows].reshape(ref.shape), ref):
                    raise SystemExit("dequantization of %s differs from the gguf package's" % name)
            return out.to(dtype)

        self.L = int(meta("llama.block_count"))
        H = int(meta("llama.embedding_length"))
        self.Hq = int(meta("llama.attention.head_count"))
        self.Hkv = int(meta("llama.attention.head_count_kv"))
        self.eps = float(meta("llama.attention.layer_norm_rms_epsilon"))
        theta = float(meta("llama.rope.freq_base"))
        self.D = H // self.Hq
        self.E = w("token_embd.weight")  # [vocab, H]
        self.vocab = self.E.shape[0]
        self.layers = []
        for l in range(self.L):
            p = "blk.%d." % l
            self.layers.append({
                "an": w(p + "attn_norm.weight"), "fn": w(p + "ffn_norm.weight"),
                "q": w(p + "attn_q.weight"), "k": w(p + "attn_k.weight"),
                "v": w(p + "attn_v.weight"), "o": w(p + "attn_output.weight"),
                "g": w(p + "ffn_gate.weight"), "u": w(p + "ffn_up.weight"),
                "d": w(p + "ffn_down.weight"),
            })
        self.out_norm = w("output_norm.weight")
        self.freqs = torch.tensor([theta ** (-2.0 * i / self.D) for i in range(self.D // 2)],
                                  dtype=torch.float64)

    def round(self, t):
        # Where the chat rounds to fp16 (fp32 reference); bf16 everywhere otherwise.
        return fp16(t) if self.dtype == torch.float32 else t.to(self.dtype)

    def norm(self, s, wt):
        sf = s.float()
        return (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + self.eps)).to(s.dtype) * wt

    def rope(self, x, pos):  # x [B, n, heads, D]; adjacent pairs rotated
        ang = torch.tensor(pos, dtype=torch.float64)[:, None] * self.freqs[None, :]
        c = torch.cos(ang).float()[:, None, :]
        s = torch.sin(ang).float()[:, None, :]
        a, b = x[..., 0::2].float(), x[..., 1::2].float()
        out = torch.empty(x.shape, dtype=torch.float32)
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = b * c + a * s
        return self.round(out)

    def new_cache(self):
        return [None] * self.L

    def forward(self, toks, start, cache):
        """toks [B, n] ids at positions start..start+n-1 of every sequence; returns the last
        position's logits [B, vocab] (fp32)."""
        B, n = toks.shape
        Hq, Hkv, D = self.Hq, self.Hkv, self.D
        pos = list(range(start, start + n))
        x = self.E[toks]
        residual = None
        for l, Lw in enumerate(self.layers):
            if l == 0:
                residual = x
                h = self.norm(x, Lw["an"])
            else:
                s = x + residual
                residual = s
                h = self.norm(s, Lw["an"])
            q = self.round(h @ Lw["q"].T).view(B, n, Hq, D)
            k = self.round(h @ Lw["k"].T).view(B, n, Hkv, D)
            v = self.round(h @ Lw["v"].T).view(B, n, Hkv, D)
            q, k = self.rope(q, pos), self.rope(k, pos)
            if cache[l] is not None:
                k = torch.cat([cache[l][0], k], 1)
                v = torch.cat([cache[l][1], v], 1)
            cache[l] = (k, v)
            K = k.repeat_interleave(Hq // Hkv, dim=2)  # [B, T, Hq, D]
            V = v.repeat_interleave(Hq // Hkv, dim=2)
            T = K.shape[1]
            sc = torch.einsum("bnhd,bthd->bhnt", q, K) / (D ** 0.5)
            if n > 1:  # causal; a single new token sees the whole cache
                mask = torch.arange(T)[None, :] > torch.tensor(pos)[:, None]
                sc = sc.masked_fill(mask, float("-inf"))
            p = torch.softmax(sc.float(), -1).to(self.dtype)
            o = self.round(torch.einsum("bhnt,bthd->bnhd", p, V)).reshape(B, n, Hq * D)
            a = o @ Lw["o"].T
            s = a + residual
            residual = s
            h = self.norm(s, Lw["fn"])
            g, u = h @ Lw["g"].T, h @ Lw["u"].T
            act = torch.nn.functional.silu(g) * u
            x = act @ Lw["d"].T
        s = x[:, -1] + residual[:, -1]
        h = self.norm(s, self.out_norm)
        return (h @ self.E.T).float()

    def greedy(self, prompts, steps):
        """prompts [B, n] ids; the prefill's logits [B, vocab] and the steps greedy tokens
        [B, steps]."""
        toks = torch.as_tensor(prompts)
        cache = self.new_cache()
        first = self.forward(toks, 0, cache)
        out = [first.argmax(-1)]
        length = toks.shape[1]
        while len(out) < steps:
            out.append(self.forward(out[-1][:, None], length, cache).argmax(-1))
            length += 1
        return first, torch.stack(out, 1)


def main():
    path, tokens, steps, logits_out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    prompt = [int(t) for t in tokens.split(",")]
    torch.set_grad_enabled(False)
    torch.set_num_threads(1)  # ctest runs tests side by side (see test_chat.cpp)
    logits, out = Reference(path).greedy([prompt], steps)
    logits[0].numpy().astype("<f4").tofile(logits_out)
    print(json.dumps([int(t) for t in out[0]]))


if __name__ == "__main__":
    main()
