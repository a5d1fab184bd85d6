#!/usr/bin/python3
"""Side-by-side timings of flashinfer-cpp's CPU ops and PyTorch's equivalents, in one run, with
the same number of threads (docs/PERFORMANCE.md, "Versus PyTorch").

Our side runs the Google Benchmark binaries of a build (bench/bench_*.cpp) with OMP_NUM_THREADS
set; torch's side runs in this process with torch.set_num_threads() equal to it. Each case is
measured in --rounds rounds, ours then torch's in every round (interleaved, so both see the same
machine load); a row prints the median over the rounds of each side's wall time per call and
ratio = torch / ours of those medians: >= 1.0 means we are no slower; rows under 1.0 are marked
"not met". The load average (os.getloadavg) is printed before and after each group.

  /usr/bin/python3 bench/compare_torch.py --build build --threads 1
  /usr/bin/python3 bench/compare_torch.py --build build --threads 2 --rounds 7 gemm

Needs Debian's python3-torch (run with /usr/bin/python3)."""

import argparse
import json
import os
import subprocess
import sys
import time

import torch


def torch_time(fn, min_time):
    """Median wall time of fn() in ms over calls that run at least min_time seconds."""
    fn()  # warm up (allocations, thread pool)
    samples = []
    t_end = time.perf_counter() + min_time
    while time.perf_counter() < t_end or len(samples) < 3:
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return samples[len(samples) // 2]


def ours_time(build, binary, name, threads, min_time):
    """Wall time in ms per call of the benchmark `name` (exact Google Benchmark run name), one
    process run of at least min_time seconds."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    # Anchor the filter: run names contain '/' and ':' which are literal in the regex.
    cmd = [os.path.join(build, "bin", binary), "--benchmark_format=json",
           "--benchmark_filter=^" + name + "$", "--benchmark_min_time=%g" % min_time]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    for b in json.loads(out)["benchmarks"]:
        if b.get("run_type", "iteration") == "iteration":
            scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
            return b["real_time"] * scale
    raise RuntimeError("no result for " + name)


def median(v):
    v = sorted(v)
    h = len(v) // 2
    return v[h] if len(v) % 2 else 0.5 * (v[h - 1] + v[h])


def top_k_cases():
    """(label, binary, benchmark name, torch callable)."""
    cases = []
    for k, srt in ((50, 1), (50, 0), (1024, 1), (1024, 0)):
        x = torch.randn(16, 128256)
        label = "top_k 16x128256 fp32 k=%d %s" % (k, "sorted" if srt else "unsorted")
        name = "BM_top_k/rows:16/cols:128256/k:%d/sorted:%d/bf16:0" % (k, srt)
        cases.append((label, "bench_topk", name,
                      lambda x=x, k=k, srt=srt: torch.topk(x, k, sorted=bool(srt))))
    return cases


def sampling_cases():
    """vLLM's sampler step; torch's side is the issue's baseline: softmax, topk, multinomial."""
    x = torch.randn(16, 128256)

    def torch_sample(x=x):
        p = torch.softmax(x, dim=-1)
        v, i = torch.topk(p, 50)
        return i.gather(1, torch.multinomial(v, 1))

    return [("top_k_top_p_sampling_from_logits 16x128256 fp32 (k=50, p=0.9)", "bench_topk",
             "BM_top_k_top_p_sampling_from_logits/rows:16/cols:128256", torch_sample)]


def gemm_cases():
    """Prefill-sized GEMMs (m > 128): mm_bf16 and mm_fp8 (e4m3, prepared weight) against
    torch's bf16 matmul of the same shape (oneDNN in Debian's torch)."""
    cases = []
    for m, n, k in ((256, 4096, 4096), (1024, 1024, 1024), (512, 2048, 2048)):
        a = torch.randn(m, k).bfloat16()
        w = torch.randn(n, k).bfloat16()
        fn = lambda a=a, w=w: torch.matmul(a, w.t())
        shape = "m:%d/n:%d/k:%d" % (m, n, k)
        for op, bm in (("mm_bf16", "BM_MmBf16Large"), ("mm_fp8", "BM_MmFp8Large")):
            cases.append(("%s m=%d n=%d k=%d vs torch bf16 matmul" % (op, m, n, k),
                          "bench_gemm_large", "%s/%s/real_time" % (bm, shape), fn))
    return cases


GROUPS = {"top_k": top_k_cases, "sampling": sampling_cases, "gemm": gemm_cases}


def load():
    return "%.1f" % os.getloadavg()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="build directory (with bin/bench_*)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--min-time", type=float, default=0.3,
                    help="seconds per measurement (each side, each round)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per case")
    ap.add_argument("groups", nargs="*", default=sorted(GROUPS), help="case groups to run")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print("threads: %d, torch %s, %s, %d rounds of %g s per side" %
          (args.threads, torch.__version__, os.uname().machine, args.rounds, args.min_time))
    print()
    print("| case | ours (ms) | torch (ms) | ratio torch/ours | | load |")
    print("|---|---:|---:|---:|---|---|")
    for g in args.groups:
        for label, binary, name, fn in GROUPS[g]():
            l0 = load()
            ours, ref = [], []
            for _ in range(args.rounds):
                ours.append(ours_time(args.build, binary, name, args.threads, args.min_time))
                ref.append(torch_time(fn, args.min_time))
            o, r = median(ours), median(ref)
            ratio = r / o
            print("| %s | %.3f | %.3f | %.2f | %s | %s-%s |" %
                  (label, o, r, ratio, "met" if ratio >= 1.0 else "**not met**", l0, load()))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
