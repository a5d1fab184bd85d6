#!/usr/bin/env python3
"""Helpers of scripts/gpu-check: turn gtest XML, `flashinfer bench` output and replay output into
CSV rows and markdown, and assemble gpu-report.md. Standard library only (runs on any python3).

  gpu_check_report.py gtest OUT.csv PHASE.md TITLE XML...    per-test rows; exit 1 on a failure or
                                                             a skip not allowed on a GPU machine
  gpu_check_report.py bench LOG BENCH.csv OUT.csv PHASE.md DEVICE_NAME
  gpu_check_report.py kernels OUTDIR DEVICE DATE             kernels.csv from tests.csv/bench.csv
  gpu_check_report.py assemble OUTDIR                        gpu-report.md from the phase*.md
"""
import csv
import glob
import os
import re
import sys
import xml.etree.ElementTree as ET

# A skip that is the expected outcome on a machine with a GPU (the test checks the no-GPU path),
# or a ChatCuda case that needs the real SmolLM2 file (98 MB: more than the 64 MiB a device call
# can carry; ChatCuda.TinyRandomModelMatchesTheCpu runs the same CUDA path on a generated file).
ALLOWED_SKIP = re.compile(r"a GPU is present|no model at .*scripts/bootstrap fetches it", re.I)

# Which CUDA source each CUDA test exercises (docs/STATUS.md's table has one row per source).
KERNEL_TESTS = [
    ("norm_cuda.cu", r"^(NormCuda\.|RmsNorm\.Cuda|BackendOpsCuda\.MatchesCpu/.*(rmsnorm|layernorm)(?!_quant))"),
    ("activation_cuda.cu", r"^(ActivationCuda\.|BackendOpsCuda\.MatchesCpu/.*_and_mul)"),
    ("rope_cuda.cu", r"^(RopeCuda\.|BackendOpsCuda\.MatchesCpu/.*rope)"),
    ("sampling_cuda.cu", r"^(SamplingCuda\.|BackendOpsCuda\.MatchesCpu/.*(sampling|softmax|renorm|mask_logits))"),
    ("gemm_cuda.cu", r"^(GemmCuda\.|BackendOpsCuda\.MatchesCpu/.*(mm_bf16|bmm_|mm_fp4))"),
    ("quantization_cuda.cu", r"^(QuantizationCuda\.|FloatFormatsCuda\.|BackendOpsCuda\.MatchesCpu/.*(quantize|interleave))"),
    ("decode_cuda.cu", r"^(BatchDecodeCuda\.|SingleDecodeCuda\.|BackendOpsCuda\.MatchesCpu/.*[Dd]ecode)"),
    ("prefill_cuda.cu", r"^(BatchPrefillCuda\.|SinglePrefillCuda\.|BackendOpsCuda\.MatchesCpu/.*([Pp]refill|context_with_kv_cache))"),
    ("cascade_cuda.cu", r"^(MergeStatesCuda\.|AppendPagedKvCacheCuda\.|BackendOpsCuda\.MatchesCpu/.*(merge_state|append_paged))"),
    ("moe_cuda.cu", r"^(MoeCuda\.|TrtllmFp8BlockScaleMoeCuda\.|TrtllmBf16MoeCuda\.|TrtllmBf16RoutedMoeCuda\.|BackendOpsCuda\.MatchesCpu/.*(cutlass_fused_moe|fused_topk_deepseek|trtllm_fp8_block_scale|trtllm_bf16))"),
    ("norm_quant_cuda.cu", r"^BackendOpsCuda\.MatchesCpu/.*(rmsnorm_quant|layernorm_quant|fused_rmsnorm_silu)"),
    ("quant8_cuda.cu", r"^BackendOpsCuda\.MatchesCpu/.*per_token_group_quant_8bit"),
    ("topk_cuda.cu", r"^BackendOpsCuda\.MatchesCpu/.*top_k($|_page_table|_ragged|_varlen)"),
    ("gemm_fp8_cuda.cu", r"^(GemmFp8Cuda\.|BackendOpsCuda\.MatchesCpu/.*(gemm_fp8|mm_fp8|mxfp8|tgv_gemm|mm_M1_16|tinygemm))"),
    ("mla_cuda.cu", r"^(MlaCuda\.|BackendOpsCuda\.MatchesCpu/.*(MLA|_mla|concat_mla_k))"),
    ("ragged_attention_cuda.cu", r"^(TrtllmRaggedDeepseekCuda\.|FmhaV2PrefillCuda\.|BackendOpsCuda\.MatchesCpu/.*(ragged_attention_deepseek|fmha_v2))"),
    ("rope_quantize_cuda.cu", r"^(RopeQuantizeFp8Cuda\.|BackendOpsCuda\.MatchesCpu/.*rope_quantize)"),
    ("attention_jit_launch.cu", r"^(BackendOpsCudaJit\.|BatchPrefillCuda\.RaggedQk192Vo128)"),
    ("grouped_gemm_cuda.cu", r"^(GroupedMmBf16Cuda\.|BackendOpsCuda\.MatchesCpu/.*grouped_mm_bf16)"),
    ("apilog_stats_cuda.cu", r"^ApiLog\.StatisticsCuda"),
    ("bench_timing_cuda.cu", None),  # from the bench phase: a CUDA [PERF] row was timed
    ("gguf_cuda.cu", r"^(MmGgufCuda\.|ChatCuda\.|BackendOpsCuda\.MatchesCpu/mm_gguf)"),
]

# Dense peak FLOP/s by device name (vendor datasheets; bf16 and fp8 tensor cores, no sparsity).
PEAK_TFLOPS = [
    (r"H100.*PCIe", {"bf16": 756.0, "fp8": 1513.0}),
    (r"H100|H200|GH200", {"bf16": 989.4, "fp8": 1978.9}),
    (r"A100", {"bf16": 312.0, "fp8": 0.0}),
]


def gtest(out_csv, phase_md, title, xmls):
    rows, bad = [], []
    for x in xmls:
        binary = os.path.basename(x).replace(".xml", "")
        try:
            root = ET.parse(x).getroot()
        except (ET.ParseError, OSError) as e:
            rows.append([binary, "(whole binary)", "error", "no XML: %s" % e])
            bad.append(rows[-1])
            continue
        for tc in root.iter("testcase"):
            name = "%s.%s" % (tc.get("classname"), tc.get("name"))
            fail = tc.find("failure")
            skip = tc.find("skipped")
            if fail is not None:
                lines = [l for l in (fail.get("message") or "").splitlines()
                         if l.strip() and not re.match(r"^\S+:\d+$", l.strip())]
                if len(lines) > 1 and lines[0].strip() == "Failed":
                    lines = lines[1:]
                status, msg = "failed", [" / ".join(l.strip() for l in lines[:3])]
            elif skip is not None or tc.get("result") == "skipped":
                m = (skip.get("message") if skip is not None else "") or ""
                status = "skipped-ok" if ALLOWED_SKIP.search(m) else "skipped"
                msg = [m.strip().splitlines()[-1] if m.strip() else ""]
            elif tc.get("status") == "notrun":
                status, msg = "disabled", [""]
            else:
                status, msg = "passed", [""]
            row = [binary, name, status, (msg[0] if msg else "")[:200]]
            rows.append(row)
            if status in ("failed", "skipped", "error"):
                bad.append(row)
    new = not os.path.exists(out_csv)
    with open(out_csv, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(["binary", "test", "status", "message"])
        w.writerows(rows)
    count = {}
    for r in rows:
        count[r[2]] = count.get(r[2], 0) + 1
    with open(phase_md, "a") as f:
        f.write("%s: %d test cases: %s.\n\n" % (
            title, len(rows), ", ".join("%d %s" % (v, k) for k, v in sorted(count.items())) or "none"))
        if not rows:
            f.write("**No test case ran.**\n\n")
        if bad:
            f.write("| binary | test | status | message |\n|---|---|---|---|\n")
            for r in bad[:200]:
                f.write("| %s | `%s` | **%s** | %s |\n" % (r[0], r[1], r[2], r[3].replace("|", "/")))
            f.write("\n")
    return 1 if (bad or not rows) else 0


def peak_for(device):
    for pat, peaks in PEAK_TFLOPS:
        if re.search(pat, device or ""):
            return peaks
    return {}


def bench(log, bench_csv, out_csv, phase_md, device):
    # [INFO] lines carry the bandwidth fraction; they follow their [PERF] line in the log. The log
    # marks each row with "== ROUTINE ..." (written by gpu-check before each call).
    frac = {}
    routine = None
    with open(log, errors="replace") as f:
        for line in f:
            m = re.match(r"== row (\d+): (\S+)", line)
            if m:
                routine = (int(m.group(1)), m.group(2))
                continue
            m = re.match(r"\[INFO\] (\S+)\s*:: ([0-9.]+) of the device's peak memory bandwidth", line)
            if m and routine:
                frac[(routine[0], m.group(1))] = float(m.group(2))
    peaks = peak_for(device)
    out = []
    if os.path.exists(bench_csv):
        with open(bench_csv, newline="") as f:
            out = list(csv.DictReader(f))
    # gpu-check writes each CSV row's call number to a side file (one per line, in row order).
    ids = []
    side = bench_csv + ".rows"
    if os.path.exists(side):
        ids = [int(x.split()[0]) for x in open(side) if x.strip()]
    table = []
    for i, r in enumerate(out):
        row_id = ids[i] if i < len(ids) else -1
        be = r.get("backend", "")
        bw = frac.get((row_id, be))
        kind = "fp8" if "fp8" in r.get("routine", "") else "bf16"
        tf = float(r.get("tflops") or 0)
        flop_frac = ""
        if r["routine"] in ("mm_bf16", "bmm_bf16", "bmm_fp8", "mm_fp4") and be == "cuda" and peaks.get(kind):
            flop_frac = "%.3f" % (tf / peaks[kind])
        table.append([r["routine"], be, r.get("median_time", ""), r.get("tflops", ""),
                      r.get("tb_per_sec", ""), "" if bw is None else "%.3f" % bw, flop_frac,
                      r.get("refcheck", ""), r.get("repro_command", "")])
    with open(out_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["routine", "backend", "median_ms", "tflops", "tb_per_sec",
                    "frac_peak_bandwidth", "frac_peak_flops", "refcheck", "repro_command"])
        w.writerows(table)
    with open(phase_md, "a") as f:
        f.write("\n| routine | backend | median ms | TFLOP/s | TB/s | of peak BW | of peak FLOP/s | refcheck |\n")
        f.write("|---|---|---|---|---|---|---|---|\n")
        for t in table:
            f.write("| %s | %s |\n" % (" | ".join(t[:7]), t[7] or "-"))
        f.write("\nPeak FLOP/s used: %s (device `%s`). Full rows and repro commands: `bench_rows.csv`.\n\n"
                % (peaks or "unknown for this device", device))
    return 0


def kernels(outdir, device, date):
    tests = []
    p = os.path.join(outdir, "tests.csv")
    if os.path.exists(p):
        with open(p, newline="") as f:
            tests = list(csv.DictReader(f))
    bench_cuda = []
    b = os.path.join(outdir, "bench_rows.csv")
    if os.path.exists(b):
        with open(b, newline="") as f:
            bench_cuda = [r for r in csv.DictReader(f) if r["backend"] == "cuda"]
    with open(os.path.join(outdir, "kernels.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kernel", "device", "date", "result"])
        for src, pat in KERNEL_TESTS:
            if pat is None:
                n = len(bench_cuda)
                res = "%d CUDA bench rows timed" % n if n else "pending: not run"
            else:
                # a parameterized suite's instance prefix ("Op/") is not part of the pattern
                mine = [t for t in tests if re.search(pat, re.sub(r"^[^./]+/", "", t["test"]))]
                ok = sum(t["status"] in ("passed", "skipped-ok") for t in mine)
                failed = [t for t in mine if t["status"] not in ("passed", "skipped-ok")]
                if not mine:
                    res = "pending: not run"
                elif failed:
                    res = "FAIL: %d of %d test cases (%s)" % (
                        len(failed), len(mine), ", ".join(t["test"] for t in failed[:3]))
                else:
                    res = "pass: %d test cases" % ok
            w.writerow(["src/kernels/cuda/" + src, device, date, res])
    return 0


def assemble(outdir):
    parts = sorted(glob.glob(os.path.join(outdir, "phase*.md")))
    with open(os.path.join(outdir, "gpu-report.md"), "w") as f:
        head = os.path.join(outdir, "header.md")
        if os.path.exists(head):
            f.write(open(head).read())
        for p in parts:
            f.write(open(p).read())
            f.write("\n")
        k = os.path.join(outdir, "kernels.csv")
        if os.path.exists(k):
            f.write("## Kernels (for docs/STATUS.md)\n\n| kernel | device | date | result |\n|---|---|---|---|\n")
            with open(k, newline="") as kf:
                for r in csv.DictReader(kf):
                    f.write("| `%s` | %s | %s | %s |\n" % (r["kernel"], r["device"], r["date"], r["result"]))
    return 0


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "gtest" and len(argv) >= 5:
        return gtest(argv[2], argv[3], argv[4], argv[5:])
    if cmd == "bench" and len(argv) == 7:
        return bench(*argv[2:7])
    if cmd == "kernels" and len(argv) == 5:
        return kernels(*argv[2:5])
    if cmd == "assemble" and len(argv) == 3:
        return assemble(argv[2])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
