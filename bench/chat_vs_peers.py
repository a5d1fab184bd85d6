#!/usr/bin/env python3
"""Prefill and decode tokens/s of examples/chat (ours) against PyTorch eager bf16 with the same
weights and against llama.cpp (PyPI's llama-cpp-python) on the same .gguf, in one run, with the
same thread count and the same prompts. Not part of CI. Prints a Markdown table with the ratios
(docs/PERFORMANCE.md, "chat on SmolLM2-135M", has the invocation and the results).

  /usr/bin/python3 bench/chat_vs_peers.py [--threads 1,2] [--batches 1,8] [--prompt_len 512]
      [--new_tokens 32] [--repeats 3] [--chat build/bin/chat] [--model PATH]
      [--llama_cpp_site DIR] [--llama_cpp_lib DIR] [--skip_torch] [--skip_llama_cpp]

- ours: `chat --bench P,B` (a subprocess per measurement, OMP_NUM_THREADS = threads); it times
  its own prefill (prompt forward + first sampling) and decode steps.
- PyTorch eager bf16: tests/examples/chat_reference.py's `Reference` (the test's independent
  implementation) with dtype bfloat16: the gguf weights dequantized, then bf16; the same Llama
  math with a KV cache; torch.set_num_threads(threads).
- llama.cpp: llama-cpp-python's low-level API (llama_batch / llama_decode), so batch 8 runs as
  8 sequences of one llama_batch (seq ids 0..7), n_threads = n_threads_batch = threads, its
  default context options otherwise. Imported from --llama_cpp_site (the sdist's `llama_cpp`
  package, or a pip --target directory), with the shared library from --llama_cpp_lib
  (LLAMA_CPP_LIB_PATH).

Every prompt is the same B x P token ids for all three (std::mt19937_64 seeded 7, ids modulo the
vocabulary, as `chat --bench` draws them); greedy decoding, no stop token, new_tokens per
sequence (the first sampled after the prefill, new_tokens - 1 decode steps). Prefill tok/s =
B * P / prefill wall time; decode tok/s = B * (new_tokens - 1) / decode wall time.

Decode runs after the P-token prompt, i.e. at a context of P..P + new_tokens, not from an empty
cache as `llama-bench`'s tg128 does: at P = 512 llama.cpp decodes this model about half as fast
as at depth 0 on this machine (ours loses ~30%), so compare its decode with llama-bench's
`-d 512`, not its default (docs/PERFORMANCE.md, session 10). The llama.cpp loop is otherwise
llama-bench's (one llama_decode per step, logits only for the rows sampled); the per-token
Python (a numpy argmax over the vocabulary) is ~0.1% of a step.

PyTorch and llama.cpp each run in a worker process of their own that loads the model once, so
neither runs the other's thread pool and a spinning OpenMP team of one does not take a core from
the next; measurements are interleaved (each repetition runs every configuration of all three,
the peers' order rotated), with a second's pause between them, and the table gives medians.
`uptime` is printed before and after: every figure is wall-clock time.
"""
import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CACHE = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
LLAMA_DIR = os.path.join(CACHE, "flashinfer-cpp", "llamacpp")


def default_model():
    if os.environ.get("FLASHINFER_MODEL_PATH"):
        return os.environ["FLASHINFER_MODEL_PATH"]
    return os.path.join(CACHE, "flashinfer-cpp", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


class MT19937_64:
    """std::mt19937_64 (the C++ standard's parameters), so the prompts equal `chat --bench`'s."""
    N, M, MASK = 312, 156, (1 << 64) - 1

    def __init__(self, seed):
        self.mt = [seed & self.MASK]
        for i in range(1, self.N):
            prev = self.mt[-1]
            self.mt.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & self.MASK)
        self.i = self.N

    def __call__(self):
        if self.i >= self.N:
            mt, n, m = self.mt, self.N, self.M
            for k in range(n):
                x = (mt[k] & ~((1 << 31) - 1) & self.MASK) | (mt[(k + 1) % n] & ((1 << 31) - 1))
                mt[k] = mt[(k + m) % n] ^ (x >> 1) ^ (0xB5026F5AA96619E9 if x & 1 else 0)
            self.i = 0
        y = self.mt[self.i]
        self.i += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & self.MASK


def bench_prompts(batch, length, vocab):
    rng = MT19937_64(7)
    return [[rng() % vocab for _ in range(length)] for _ in range(batch)]


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


# ---- workers (a process per peer; JSON lines on stdin/stdout) --------------------------------
class TorchPeer:
    def __init__(self, model):
        import torch
        sys.path.insert(0, os.path.join(REPO, "tests", "examples"))
        from chat_reference import Reference
        torch.set_grad_enabled(False)
        self.torch = torch
        self.ref = Reference(model, dtype=torch.bfloat16)
        self.version = "torch %s, tests/examples/chat_reference.py in bfloat16" % torch.__version__

    def run(self, prompts, new_tokens, threads):
        torch = self.torch
        torch.set_num_threads(threads)
        toks = torch.tensor(prompts)
        B, P = toks.shape
        cache = self.ref.new_cache()
        t0 = time.perf_counter()
        nxt = self.ref.forward(toks, 0, cache).argmax(-1)
        t1 = time.perf_counter()
        first = nxt.tolist()
        for s in range(new_tokens - 1):
            nxt = self.ref.forward(nxt[:, None], P + s, cache).argmax(-1)
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1, first


class LlamaCppPeer:
    def __init__(self, model):
        import ctypes
        import numpy as np
        import llama_cpp as L
        self.L, self.np, self.ctypes = L, np, ctypes
        L.llama_backend_init()
        self._quiet = L.llama_log_callback(lambda level, text, user: None)
        L.llama_log_set(self._quiet, None)
        self.model = L.llama_model_load_from_file(model.encode(), L.llama_model_default_params())
        if not self.model:
            raise RuntimeError("llama.cpp could not load %s" % model)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.version = "llama-cpp-python %s (%s)" % (getattr(L, "__version__", "?"),
                                                     os.environ.get("LLAMA_CPP_LIB_PATH", ""))
        self.contexts = {}

    def context(self, threads, batch, n_tokens, ctx_len):
        L = self.L
        key = (threads, batch, n_tokens, ctx_len)
        if key not in self.contexts:
            for c in self.contexts.values():  # one context at a time: its KV cache is memory
                L.llama_free(c)
            self.contexts.clear()
            p = L.llama_context_default_params()
            p.n_ctx = batch * ctx_len
            p.n_batch = n_tokens
            p.n_seq_max = batch
            p.n_threads = p.n_threads_batch = threads
            p.no_perf = True
            ctx = L.llama_init_from_model(self.model, p)
            if not ctx:
                raise RuntimeError("llama_init_from_model failed")
            self.contexts[key] = ctx
        ctx = self.contexts[key]
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        return ctx

    def run(self, prompts, new_tokens, threads):
        L, np = self.L, self.np
        B, P = len(prompts), len(prompts[0])
        ctx = self.context(threads, B, B * P, P + new_tokens + 16)
        batch = L.llama_batch_init(B * P, 0, 1)
        try:
            def argmax(i):
                row = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(self.n_vocab,))
                return int(row.argmax())

            def submit(tokens, positions, want_logits):
                for i, (t, p) in enumerate(zip(tokens, positions)):
                    batch.token[i] = t
                    batch.pos[i] = p
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = i * B // len(tokens)
                    batch.logits[i] = want_logits(i)
                batch.n_tokens = len(tokens)
                rc = L.llama_decode(ctx, batch)
                if rc != 0:
                    raise RuntimeError("llama_decode returned %d" % rc)

            flat = [t for p in prompts for t in p]
            pos = list(range(P)) * B
            t0 = time.perf_counter()
            submit(flat, pos, lambda i: i % P == P - 1)
            nxt = [argmax(b * P + P - 1) for b in range(B)]
            t1 = time.perf_counter()
            first = list(nxt)
            for s in range(new_tokens - 1):
                submit(nxt, [P + s] * B, lambda i: True)
                nxt = [argmax(b) for b in range(B)]
            t2 = time.perf_counter()
        finally:
            L.llama_batch_free(batch)
        return t1 - t0, t2 - t1, first


def worker(kind, model):
    peer = TorchPeer(model) if kind == "torch" else LlamaCppPeer(model)
    print(json.dumps({"ready": peer.version}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if "warmup" in req:  # a short run first, so one-time setup is not timed
            peer.run([p[:64] for p in req["prompts"]], 4, req["threads"])
        pre, dec, first = peer.run(req["prompts"], req["new_tokens"], req["threads"])
        print(json.dumps({"prefill_s": pre, "decode_s": dec, "first": first}), flush=True)


class Timeout(Exception):
    pass


class Worker:
    """A peer's process. A measurement that runs past the timeout kills it (the next one
    starts it again), so one starved configuration cannot hold up the whole run."""

    def __init__(self, kind, args):
        self.kind, self.args = kind, args
        self.p = None
        self.note = self._start()

    def _start(self):
        env = dict(os.environ)
        if self.kind == "llama_cpp":
            env["PYTHONPATH"] = self.args.llama_cpp_site + os.pathsep + env.get("PYTHONPATH", "")
            env["LLAMA_CPP_LIB_PATH"] = self.args.llama_cpp_lib
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker",
                                   self.kind, "--model", self.args.model],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                  text=True)
        self.warm = set()
        return json.loads(self._line(600))["ready"]

    def _line(self, timeout):
        if not select.select([self.p.stdout], [], [], timeout)[0]:
            self.p.kill()
            self.p.wait()
            self.p = None
            raise Timeout()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("%s worker exited (status %s)" % (self.kind, self.p.wait()))
        return line

    def run(self, prompts, new_tokens, threads):
        if self.p is None:
            self._start()
        req = {"prompts": prompts, "new_tokens": new_tokens, "threads": threads}
        if (threads, len(prompts)) not in self.warm:
            self.warm.add((threads, len(prompts)))
            req["warmup"] = True
        self.p.stdin.write(json.dumps(req) + "\n")
        self.p.stdin.flush()
        r = json.loads(self._line(self.args.timeout))
        return r["prefill_s"], r["decode_s"], r["first"]

    def close(self):
        if self.p is not None:
            self.p.stdin.close()
            self.p.wait()


def run_ours(args, prompts, threads):
    B, P = len(prompts), len(prompts[0])
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), FLASHINFER_LOGLEVEL="0")
    try:
        out = subprocess.run([args.chat, "--model", args.model, "--bench", "%d,%d" % (P, B),
                              "--max_new_tokens", str(args.new_tokens)], env=env, check=True,
                             capture_output=True, text=True, timeout=args.timeout).stdout
    except subprocess.TimeoutExpired:
        raise Timeout()
    r = json.loads(out.strip().splitlines()[-1])
    return (B * P / r["prefill_tok_s"], B * (args.new_tokens - 1) / r["decode_tok_s"],
            r.get("first"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chat", default=os.path.join(REPO, "build", "bin", "chat"))
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    ap.add_argument("--prompt_len", type=int, default=512)
    ap.add_argument("--new_tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--llama_cpp_site", default=os.path.join(LLAMA_DIR, "site"))
    ap.add_argument("--llama_cpp_lib", default=os.path.join(LLAMA_DIR, "build", "bin"))
    ap.add_argument("--timeout", type=float, default=300,
                    help="seconds one measurement (prefill + decode) may take; a configuration "
                    "that runs past it is reported as such and not repeated")
    ap.add_argument("--skip_torch", action="store_true")
    ap.add_argument("--skip_llama_cpp", action="store_true")
    ap.add_argument("--worker", choices=["torch", "llama_cpp"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.model)
    if args.new_tokens < 2:
        ap.error("--new_tokens must be >= 2 (decode is new_tokens - 1 steps)")

    threads = [int(t) for t in args.threads.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    vocab = 49152
    up_before = uptime()
    t_start = time.time()

    peers = {"ours": lambda p, n, t: run_ours(args, p, t)}
    notes = {"ours": args.chat}
    workers = []
    for kind, skip in (("torch", args.skip_torch), ("llama_cpp", args.skip_llama_cpp)):
        if skip:
            notes[kind] = "skipped (--skip_%s)" % kind
            continue
        try:
            w = Worker(kind, args)
        except Exception as e:  # not importable / not built: the table says why
            notes[kind] = "not run: %s" % e
            continue
        workers.append(w)
        peers[kind] = w.run
        notes[kind] = w.note

    prompts = {b: bench_prompts(b, args.prompt_len, vocab) for b in batches}
    times = {}  # (threads, batch, peer) -> [(prefill_s, decode_s)]
    firsts = {}
    timed_out = set()
    names = list(peers)
    for rep in range(args.repeats):
        for t in threads:
            for b in batches:
                order = names[rep % len(names):] + names[:rep % len(names)]
                for name in order:
                    if (t, b, name) in timed_out:
                        continue
                    time.sleep(1.0)  # let the previous peer's threads go idle
                    what = "repetition %d, %d thread(s), batch %d, %s" % (rep + 1, t, b, name)
                    try:
                        pre, dec, first = peers[name](prompts[b], args.new_tokens, t)
                    except Timeout:
                        timed_out.add((t, b, name))
                        print("[%.0f s] %s: over %.0f s, not repeated" % (
                            time.time() - t_start, what, args.timeout), file=sys.stderr)
                        continue
                    times.setdefault((t, b, name), []).append((pre, dec))
                    print("[%.0f s] %s: prefill %.2f s, decode %.2f s" % (
                        time.time() - t_start, what, pre, dec), file=sys.stderr, flush=True)
                    if first is not None:
                        firsts[(t, b, name)] = first
    for w in workers:
        w.close()
    up_after = uptime()

    def rate(t, b, name, phase):
        runs = times.get((t, b, name))
        if not runs:
            return None
        tokens = b * (args.prompt_len if phase == 0 else args.new_tokens - 1)
        return tokens / statistics.median(r[phase] for r in runs)

    def fmt(v):
        return "n/a" if v is None else "%.1f" % v

    def cell(t, b, name, phase):
        if (t, b, name) in timed_out and (t, b, name) not in times:
            return "over %.0f s" % args.timeout
        return fmt(rate(t, b, name, phase))

    def ratio(a, b):
        if a is None or b is None:
            return "n/a"
        return "%.2fx %s" % (a / b, "met" if a >= b else "**not met**")

    print("uptime before: %s" % up_before)
    print("uptime after:  %s" % up_after)
    print("wall time: %.0f s; prompt %d tokens (same ids for all), %d new tokens per sequence, "
          "greedy; tokens/s, median of %d interleaved runs" % (
              time.time() - t_start, args.prompt_len, args.new_tokens, args.repeats))
    for k in ("ours", "torch", "llama_cpp"):
        print("%s: %s" % (k, notes.get(k, "")))
    # The first greedy token of every prompt: the same prompts went in (bf16 and llama.cpp's
    # 8-bit activations may flip a close call; ours is the fp32 reference's, test_chat).
    for peer in ("torch", "llama_cpp"):
        pairs = [(x, y) for k in firsts if k[2] == "ours" and (k[0], k[1], peer) in firsts
                 for x, y in zip(firsts[k], firsts[(k[0], k[1], peer)])]
        if pairs:
            print("first greedy token, ours vs %s: %d of %d equal" % (
                peer, sum(x == y for x, y in pairs), len(pairs)))
    print()
    print("| threads | phase | batch | ours | PyTorch bf16 | llama.cpp | ours / PyTorch "
          "| ours / llama.cpp |")
    print("|---|---|---|---|---|---|---|---|")
    for t in threads:
        for phase, what in ((0, "prefill"), (1, "decode")):
            for b in batches:
                o, p, l = (rate(t, b, n, phase) for n in ("ours", "torch", "llama_cpp"))
                print("| %d | %s | %d | %s | %s | %s | %s | %s |" % (
                    t, what, b, *(cell(t, b, n, phase) for n in ("ours", "torch", "llama_cpp")),
                    ratio(o, p), ratio(o, l)))


if __name__ == "__main__":
    sys.exit(main())
