#!/usr/bin/env python3
"""The GEMM rows of scripts/gpu-check's bench phase timed with PyTorch on the same shapes, the
yardstick for flashinfer-cpp's cuBLASLt path: torch.matmul for mm_bf16 / bmm_bf16,
torch._scaled_mm (one call per batch entry) for bmm_fp8.

  gpu_check_torch_gemm.py --device cuda|cpu --out gemm_torch.csv [--iters N] SPEC...
  SPEC: op:m:n:k[:batch], op in mm_bf16, bmm_bf16, bmm_fp8

Timing on CUDA: CUDA events around each iteration, an L2-sized buffer overwritten before each one
(as `flashinfer bench` does), median reported. On the CPU: wall clock, median.
"""
import argparse
import csv
import statistics
import sys
import time

from gpu_check_report import host_lead_cycles  # this script's folder is on sys.path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("specs", nargs="+")
    a = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print("[SKIP] torch gemm :: torch is not importable: %s" % e)
        return 0
    dev = torch.device(a.device)
    print("[INFO] torch %s on %s" % (torch.__version__, dev))
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        print("[SKIP] torch gemm :: torch sees no CUDA device")
        return 0
    flush = None
    if cuda:
        l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 64 << 20) or (64 << 20)
        flush = torch.empty(2 * l2, dtype=torch.uint8, device=dev)
    rows = []
    for spec in a.specs:
        parts = spec.split(":")
        op, m, n, k = parts[0], int(parts[1]), int(parts[2]), int(parts[3])
        batch = int(parts[4]) if len(parts) > 4 else 1
        g = torch.Generator(device="cpu").manual_seed(42)
        x = torch.rand((batch, m, k), generator=g).sub_(0.5).to(dev)
        w = torch.rand((batch, n, k), generator=g).sub_(0.5).to(dev)
        note = ""
        if op in ("mm_bf16", "bmm_bf16"):
            xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
            if op == "mm_bf16":
                xb, wb = xb[0], wb[0]
                fn = lambda: torch.matmul(xb, wb.t())
            else:
                fn = lambda: torch.matmul(xb, wb.transpose(1, 2))
            what = "torch.matmul"
        elif op == "bmm_fp8":
            f8 = getattr(torch, "float8_e4m3fn", None)
            if f8 is None or not cuda:
                print("[SKIP] torch %s :: needs torch.float8_e4m3fn and CUDA (torch %s, device %s)"
                      % (op, torch.__version__, dev))
                continue
            xq, wq = x.to(f8), w.to(f8)
            one = torch.ones((), device=dev)

            def fn():
                for b in range(batch):
                    torch._scaled_mm(xq[b], wq[b].t(), scale_a=one, scale_b=one,
                                     out_dtype=torch.bfloat16)
            what = "torch._scaled_mm x %d" % batch
        else:
            print("[SKIP] torch %s :: unknown op" % op)
            continue
        times = []
        try:
            for _ in range(3):
                fn()
            if cuda:
                torch.cuda.synchronize()
            for _ in range(a.iters):
                if cuda:
                    flush.zero_()
                    # The host's lead (as flashinfer bench) for the loop's launches.
                    if hasattr(torch.cuda, "_sleep"):
                        torch.cuda._sleep(host_lead_cycles(batch))
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    fn()
                    e.record()
                    e.synchronize()
                    times.append(s.elapsed_time(e))
                else:
                    t0 = time.perf_counter()
                    fn()
                    times.append((time.perf_counter() - t0) * 1e3)
        except Exception as e:  # report, go on with the other shapes
            print("[SKIP] torch %s :: %s" % (op, str(e).splitlines()[0] if str(e) else type(e).__name__))
            continue
        med = statistics.median(times)
        tflops = 2.0 * batch * m * n * k / (med * 1e-3) / 1e12
        print("[PERF] torch %-8s %s m=%d n=%d k=%d batch=%d :: median time %.4f ms; %.4f TFLOPs/sec"
              % (op, what, m, n, k, batch, med, tflops))
        rows.append([op, what, m, n, k, batch, str(dev), "%.6f" % med, "%.6f" % tflops, note])
    with open(a.out, "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["op", "torch_call", "m", "n", "k", "batch", "device", "median_ms", "tflops", "note"])
        wr.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
