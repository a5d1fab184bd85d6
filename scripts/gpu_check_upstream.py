#!/usr/bin/env python3
"""Upstream FlashInfer (the flashinfer-python package, JIT-compiled on the GPU machine) timed on
the headline shapes of scripts/gpu-check's bench phase: paged decode, paged prefill, rmsnorm and
top_k_top_p_sampling_from_logits. Each case that cannot run says why (one line) and the others go on.

  gpu_check_upstream.py --out upstream.csv [--iters N] [--quick]

Timing: CUDA events around each iteration, an L2-sized buffer overwritten before each (as
`flashinfer bench` does), median. bf16 everywhere, seed 42, inputs uniform in [-0.5, 0.5).
"""
import argparse
import csv
import statistics
import sys
import traceback


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    rows = []

    def write():
        with open(a.out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["case", "shape", "median_ms", "tflops", "tb_per_sec", "status"])
            w.writerows(rows)

    try:
        import torch
        import flashinfer
    except Exception as e:  # the wheel or one of its dependencies is missing
        rows.append(["(import)", "", "", "", "", "skipped: %s" % str(e).splitlines()[0]])
        print("[SKIP] upstream :: %s" % rows[-1][-1])
        write()
        return 0
    if not torch.cuda.is_available():
        rows.append(["(device)", "", "", "", "", "skipped: torch sees no CUDA device"])
        write()
        return 0
    print("[INFO] upstream flashinfer %s, torch %s" % (getattr(flashinfer, "__version__", "?"),
                                                       torch.__version__))
    dev = torch.device("cuda")
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 64 << 20) or (64 << 20)
    flush = torch.empty(2 * l2, dtype=torch.uint8, device=dev)
    torch.manual_seed(42)
    bf16 = torch.bfloat16

    def rnd(*shape):
        return (torch.rand(shape, device=dev) - 0.5).to(bf16)

    def timeit(fn):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(a.iters):
            flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e))
        return statistics.median(ts)

    def case(name, shape, build, flops, nbytes):
        try:
            fn = build()
            ms = timeit(fn)
            tf, tb = flops / (ms * 1e-3) / 1e12, nbytes / (ms * 1e-3) / 1e12
            rows.append([name, shape, "%.6f" % ms, "%.6f" % tf, "%.6f" % tb, "ok"])
            print("[PERF] upstream %s (%s) :: median time %.4f ms; %.4f TFLOPs/sec; %.4f TB/sec"
                  % (name, shape, ms, tf, tb))
        except Exception as e:
            msg = (str(e).splitlines() or [type(e).__name__])[0][:300]
            rows.append([name, shape, "", "", "", "error: %s" % msg])
            print("[SKIP] upstream %s :: %s" % (name, msg))
            traceback.print_exc(limit=3)

    ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    H, HK, D, P = 32, 8, 128, 16

    def paged(batch, kv_len):
        pages_per = (kv_len + P - 1) // P
        indptr = torch.arange(batch + 1, dtype=torch.int32, device=dev) * pages_per
        indices = torch.arange(batch * pages_per, dtype=torch.int32, device=dev)
        last = torch.full((batch,), (kv_len - 1) % P + 1, dtype=torch.int32, device=dev)
        cache = rnd(batch * pages_per, 2, P, HK, D)
        return indptr, indices, last, cache

    # Decode: batch 64, kv 2048, GQA 32:8, D 128, page 16 (the bench phase's headline row).
    B, KV = 64, 2048

    def decode():
        indptr, indices, last, cache = paged(B, KV)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(indptr, indices, last, H, HK, D, P, q_data_type=bf16, kv_data_type=bf16)
        q = rnd(B, H, D)
        return lambda: w.run(q, cache)

    case("BatchDecodeWithPagedKVCacheWrapper.run", "b%d kv%d h%d:%d d%d p%d" % (B, KV, H, HK, D, P),
         decode, 4.0 * B * H * KV * D, 2.0 * B * KV * HK * D * 2 + 2.0 * B * H * D * 2)

    # Prefill: batch 4, qo 512, kv 2048, causal (same as the bench phase's prefill row).
    PB, QO, PKV = (2, 256, 1024) if a.quick else (4, 512, 2048)

    def prefill():
        indptr, indices, last, cache = paged(PB, PKV)
        qo_indptr = torch.arange(PB + 1, dtype=torch.int32, device=dev) * QO
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(qo_indptr, indptr, indices, last, H, HK, D, P, causal=True,
               q_data_type=bf16, kv_data_type=bf16)
        q = rnd(PB * QO, H, D)
        return lambda: w.run(q, cache)

    # Causal FLOPs as upstream's benchmark counts them (the visible half of the score matrix).
    vis = sum(min(PKV, PKV - QO + i + 1) for i in range(QO))
    case("BatchPrefillWithPagedKVCacheWrapper.run", "b%d qo%d kv%d causal" % (PB, QO, PKV), prefill,
         4.0 * PB * H * vis * D, 2.0 * PB * PKV * HK * D * 2 + 4.0 * PB * QO * H * D)

    R, HS = 128, 4096

    def rms():
        x, wt = rnd(R, HS), rnd(HS)
        return lambda: flashinfer.rmsnorm(x, wt, 1e-6)

    case("rmsnorm", "rows%d hidden%d" % (R, HS), rms, 4.0 * R * HS, 2.0 * (2 * R * HS + HS))

    SB, V = 64, 128256

    def sampling():
        logits = (torch.rand(SB, V, device=dev) * 10).float()
        return lambda: flashinfer.sampling.top_k_top_p_sampling_from_logits(logits, 50, 0.9)

    case("top_k_top_p_sampling_from_logits", "b%d vocab%d k50 p0.9" % (SB, V), sampling,
         0.0, 4.0 * SB * V)
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
