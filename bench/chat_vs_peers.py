#!/usr/bin/env python3
"""Prefill and decode tokens/s of examples/chat (ours) against PyTorch eager bf16 with the same
weights and against llama.cpp (PyPI's llama-cpp-python) on the same .gguf, in one run, with the
same thread count. Not part of CI. Prints a Markdown table (docs/PERFORMANCE.md).

  bench/chat_vs_peers.py [--chat build/bin/chat] [--model PATH] [--threads 1,2]
                         [--prompt_len 128] [--new_tokens 32] [--batches 1,8]
                         [--llama_cpp_site DIR]

llama-cpp-python is built from source by pip (`pip install --no-binary llama-cpp-python
--target DIR llama-cpp-python`) and imported from DIR (or DIR holds its sdist's `llama_cpp`
package, and LLAMA_CPP_LIB_PATH names a CMake build of its vendored llama.cpp: see
docs/PERFORMANCE.md); its high-level Llama class runs one
sequence, so its batch-8 rows are not measured. Run on a quiet machine: every figure is
wall-clock time.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np


def default_model():
    if os.environ.get("FLASHINFER_MODEL_PATH"):
        return os.environ["FLASHINFER_MODEL_PATH"]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "flashinfer-cpp", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def random_prompts(batch, length, vocab, seed=7):
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, size=(batch, length)).tolist()


# ---- ours ----------------------------------------------------------------------------------
def bench_ours(args, batch, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), FLASHINFER_LOGLEVEL="0")
    best = None
    for _ in range(args.repeats):
        out = subprocess.run(
            [args.chat, "--model", args.model, "--bench", "%d,%d" % (args.prompt_len, batch),
             "--max_new_tokens", str(args.new_tokens)],
            env=env, check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        if best is None:
            best = r
        best["prefill_tok_s"] = max(best["prefill_tok_s"], r["prefill_tok_s"])
        best["decode_tok_s"] = max(best["decode_tok_s"], r["decode_tok_s"])
    return best["prefill_tok_s"], best["decode_tok_s"]


# ---- PyTorch eager bf16 ----------------------------------------------------------------------
class TorchModel:
    def __init__(self, path):
        import torch
        from gguf import GGUFReader
        from gguf.quants import dequantize
        self.torch = torch
        r = GGUFReader(path)
        meta = {k: v.contents() for k, v in r.fields.items()
                if k.startswith("llama.")}
        t = {x.name: x for x in r.tensors}

        def w(name):
            x = t[name]
            return torch.from_numpy(np.array(
                dequantize(x.data, x.tensor_type), dtype=np.float32)).to(torch.bfloat16)

        self.L = int(meta["llama.block_count"])
        self.H = int(meta["llama.embedding_length"])
        self.Hq = int(meta["llama.attention.head_count"])
        self.Hkv = int(meta["llama.attention.head_count_kv"])
        self.D = self.H // self.Hq
        self.eps = float(meta["llama.attention.layer_norm_rms_epsilon"])
        theta = float(meta["llama.rope.freq_base"])
        self.E = w("token_embd.weight")
        self.vocab = self.E.shape[0]
        self.layers = []
        for l in range(self.L):
            p = "blk.%d." % l
            self.layers.append({
                "an": w(p + "attn_norm.weight"), "fn": w(p + "ffn_norm.weight"),
                "qkv": torch.cat([w(p + "attn_q.weight"), w(p + "attn_k.weight"),
                                  w(p + "attn_v.weight")]),
                "o": w(p + "attn_output.weight"),
                "gu": torch.cat([w(p + "ffn_gate.weight"), w(p + "ffn_up.weight")]),
                "d": w(p + "ffn_down.weight")})
        self.norm = w("output_norm.weight")
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.D, 2, dtype=torch.float32) / self.D))

    def rms(self, x, w):
        xf = x.float()
        return (xf * self.torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * w

    def rope(self, x, pos):  # x [B, n, h, D]; adjacent pairs
        ang = pos.float()[:, :, None] * self.inv_freq[None, None, :]
        c, s = ang.cos()[:, :, None, :], ang.sin()[:, :, None, :]
        a, b = x[..., 0::2].float(), x[..., 1::2].float()
        return self.torch.stack([a * c - b * s, b * c + a * s], -1).flatten(-2).to(x.dtype)

    def forward(self, toks, cache, start):
        torch = self.torch
        B, n = toks.shape
        pos = torch.arange(start, start + n)[None, :].expand(B, n)
        x = self.E[toks]
        qd, kd = self.Hq * self.D, self.Hkv * self.D
        for l, W in enumerate(self.layers):
            h = self.rms(x, W["an"])
            qkv = h @ W["qkv"].T
            q = self.rope(qkv[..., :qd].view(B, n, self.Hq, self.D), pos)
            k = self.rope(qkv[..., qd:qd + kd].view(B, n, self.Hkv, self.D), pos)
            v = qkv[..., qd + kd:].view(B, n, self.Hkv, self.D)
            if cache[l] is None:
                cache[l] = (k, v)
            else:
                cache[l] = (torch.cat([cache[l][0], k], 1), torch.cat([cache[l][1], v], 1))
            K, V = cache[l]
            rep = self.Hq // self.Hkv
            K = K.repeat_interleave(rep, 2).transpose(1, 2)  # [B, h, T, D]
            V = V.repeat_interleave(rep, 2).transpose(1, 2)
            sc = (q.transpose(1, 2) @ K.transpose(-1, -2)).float() / (self.D ** 0.5)
            T = K.shape[2]
            if n > 1:
                mask = torch.arange(T)[None, :] > (torch.arange(n)[:, None] + start)
                sc = sc.masked_fill(mask, float("-inf"))
            o = (sc.softmax(-1).to(V.dtype) @ V).transpose(1, 2).reshape(B, n, qd)
            x = x + o @ W["o"].T
            h = self.rms(x, W["fn"])
            gu = h @ W["gu"].T
            g, u = gu.chunk(2, -1)
            x = x + (torch.nn.functional.silu(g) * u) @ W["d"].T
        return self.rms(x[:, -1], self.norm) @ self.E.T

    def bench(self, prompts, new_tokens, threads):
        torch = self.torch
        torch.set_num_threads(threads)
        with torch.no_grad():
            toks = torch.tensor(prompts)
            B, P = toks.shape
            cache = [None] * self.L
            t0 = time.perf_counter()
            logits = self.forward(toks, cache, 0)
            t1 = time.perf_counter()
            nxt = logits.argmax(-1)[:, None]
            t2 = time.perf_counter()
            for s in range(new_tokens - 1):
                logits = self.forward(nxt, cache, P + s)
                nxt = logits.argmax(-1)[:, None]
            t3 = time.perf_counter()
        return B * P / (t1 - t0), B * (new_tokens - 1) / (t3 - t2)


# ---- llama.cpp -------------------------------------------------------------------------------
def bench_llama_cpp(args, prompt, threads):
    if args.llama_cpp_site:
        sys.path.insert(0, args.llama_cpp_site)
    try:
        import llama_cpp
    except Exception as e:  # not built / not importable: say why in the table
        return None, "llama_cpp not importable: %s" % e
    def last_argmax(llm):
        # Newer llama-cpp-python (0.3.x) keeps llm.scores only with logits_all; the context
        # holds the last token's logits either way.
        ptr = llm._ctx.get_logits_ith(-1)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))))

    llm = llama_cpp.Llama(model_path=args.model, n_threads=threads,
                          n_threads_batch=threads, n_ctx=len(prompt) + args.new_tokens + 8,
                          n_batch=max(len(prompt), 8), verbose=False)
    best_p, best_d = 0.0, 0.0
    for _ in range(args.repeats):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        tok = last_argmax(llm)
        t2 = time.perf_counter()
        for _ in range(args.new_tokens - 1):
            llm.eval([tok])
            tok = last_argmax(llm)
        t3 = time.perf_counter()
        best_p = max(best_p, len(prompt) / (t1 - t0))
        best_d = max(best_d, (args.new_tokens - 1) / (t3 - t2))
    return (best_p, best_d), "llama-cpp-python %s" % getattr(llama_cpp, "__version__", "?")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chat", default="build/bin/chat")
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--prompt_len", type=int, default=128)
    ap.add_argument("--new_tokens", type=int, default=32)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--llama_cpp_site", default="")
    ap.add_argument("--skip_torch", action="store_true")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    vocab = 49152

    rows = []  # (threads, what, batch, ours, torch, llama)
    tm = None if args.skip_torch else TorchModel(args.model)
    llama_note = ""
    for threads in [int(t) for t in args.threads.split(",")]:
        for b in batches:
            prompts = random_prompts(b, args.prompt_len, vocab)
            ours = bench_ours(args, b, threads)
            torch_r = tm.bench(prompts, args.new_tokens, threads) if tm else None
            llama_r = None
            if b == 1:
                llama_r, llama_note = bench_llama_cpp(args, prompts[0], threads)
            for i, what in enumerate(("prefill", "decode")):
                rows.append((threads, what, b, ours[i], torch_r[i] if torch_r else None,
                             llama_r[i] if llama_r else None))

    def fmt(v):
        return "n/a" if v is None else "%.1f" % v

    def ratio(a, b):
        return "n/a" if a is None or b is None else "%.2fx" % (a / b)

    print("prompt %d tokens, %d new tokens; tokens/s (batch x tokens / wall time)"
          % (args.prompt_len, args.new_tokens))
    print("llama.cpp: %s" % (llama_note or "not run"))
    print()
    print("| threads | phase | batch | ours | PyTorch bf16 | llama.cpp | ours / PyTorch "
          "| ours / llama.cpp |")
    print("|---|---|---|---|---|---|---|---|")
    for threads, what, b, o, t, l in rows:
        print("| %d | %s | %d | %s | %s | %s | %s | %s |" % (
            threads, what, b, fmt(o), fmt(t), fmt(l), ratio(o, t), ratio(o, l)))

if __name__ == "__main__":
    main()
