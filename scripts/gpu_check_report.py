#!/usr/bin/env python3
"""Helpers of scripts/gpu-check: turn gtest XML, `flashinfer bench` output and replay output into
CSV rows and markdown, and assemble gpu-report.md. Standard library only (runs on any python3).

  gpu_check_report.py gtest OUT.csv PHASE.md TITLE XML...    per-test rows; exit 1 on a failure or
                                                             a skip not allowed on a GPU machine
  gpu_check_report.py bench LOG BENCH.csv OUT.csv PHASE.md DEVICE_NAME
  gpu_check_report.py kernels OUTDIR DEVICE DATE             kernels.csv from tests.csv/bench.csv
  gpu_check_report.py assemble OUTDIR                        gpu-report.md from the phase*.md
  Decode grid (phases 5b and 6a):
  gpu_check_report.py decode-plan MODE MEM_BYTES PLAN.csv TESTLIST
                      MODE full, quick or dry: the grid's rows, the headline first, those whose
                      K+V exceed 60 % of MEM_BYTES skipped; TESTLIST: `flashinfer bench` lines
  gpu_check_report.py decode-grid PLAN.csv BENCH.csv LOG OUT.csv PHASE.md
                      decode_grid.csv from the --testlist run's CSV and log; exit 1 on a row that
                      failed, mismatched the CPU or did not run
  gpu_check_report.py fake-upstream OURS.csv OUT.csv         dry run: made-up upstream timings
  gpu_check_report.py compare PLAN.csv OURS.csv UPSTREAM.csv OUT.md OUT.csv
                      the two grids joined: upstream_ms / ours_ms per row, the goals
"""
import csv
import glob
import os
import re
import shlex
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


# ---- decode grid (phases 5b and 6a) -------------------------------------------------------------

DECODE_ROUTINE = "BatchDecodeWithPagedKVCacheWrapper.run"
DECODE_GRIDS = {
    # batch x kv (the longest kv for batch 1 only) x heads (qo:kv) x page x KV dtype; q bf16.
    "full": dict(batches=[1, 16, 64, 256], kv=[512, 2048, 8192], kv_batch1=[32768],
                 heads=[(32, 8), (32, 32), (64, 8)], pages=[1, 16],
                 kv_dtypes=["bfloat16", "float8_e4m3fn"], head_dim=128,
                 headline=(64, 2048, 32, 8, 16, "bfloat16"), refcheck=(16, 512)),
    # --quick: batch 1 and 64, page 16.
    "quick": dict(batches=[1, 64], kv=[512, 2048, 8192], kv_batch1=[32768],
                  heads=[(32, 8), (32, 32), (64, 8)], pages=[16],
                  kv_dtypes=["bfloat16", "float8_e4m3fn"], head_dim=128,
                  headline=(64, 2048, 32, 8, 16, "bfloat16"), refcheck=(64, 512)),
    # --dry-run: the same axes, tiny, on the CPU (with a made-up memory size that skips a row).
    "dry": dict(batches=[1, 3], kv=[32, 96], kv_batch1=[160], heads=[(4, 2), (4, 4)],
                pages=[1, 16], kv_dtypes=["bfloat16", "float8_e4m3fn"], head_dim=64,
                headline=(3, 96, 4, 2, 16, "bfloat16"), refcheck=(3, 32)),
}
GRID_KEYS = ["batch", "kv_len", "qo_heads", "kv_heads", "page", "kv_dtype"]
GRID_COLUMNS = GRID_KEYS + ["median_ms", "tb_per_s", "pct_peak", "status"]
KV_BYTES = {"bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
MEM_FRACTION = 0.6  # a row whose K+V exceed this share of the device memory is skipped


def human_bytes(n):
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= f:
            return "%.3g %s" % (n / f, unit)
    return "%d B" % n


def grid_key(r):
    dt = str(r["kv_dtype"]).replace("torch.", "")
    return tuple(str(int(r[k])) for k in GRID_KEYS[:-1]) + (dt,)


def read_csv(path):
    if not path or not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def decode_plan(mode, mem_bytes, plan_csv, testlist):
    g = DECODE_GRIDS[mode]
    mem = float(mem_bytes)
    rows = []
    for dt in g["kv_dtypes"]:
        for b in g["batches"]:
            for kv in g["kv"] + (g["kv_batch1"] if b == 1 else []):
                for h, hk in g["heads"]:
                    for p in g["pages"]:
                        rows.append(dict(batch=b, kv_len=kv, qo_heads=h, kv_heads=hk, page=p,
                                         kv_dtype=dt, head_dim=g["head_dim"]))
    longest = max(g["kv_batch1"])
    for r in rows:
        # K+V actually read: kv_len tokens per request (page-aligned here), K and V.
        r["kv_bytes"] = r["batch"] * r["kv_len"] * r["kv_heads"] * r["head_dim"] * 2 * KV_BYTES[r["kv_dtype"]]
        key = (r["batch"], r["kv_len"], r["qo_heads"], r["kv_heads"], r["page"], r["kv_dtype"])
        r["role"] = ("headline" if key == g["headline"] else
                     "long" if r["batch"] == 1 and r["kv_len"] == longest else
                     "refcheck" if (r["batch"], r["kv_len"]) == g["refcheck"] else "")
        r["status"] = ""
        if mem > 0 and r["kv_bytes"] > MEM_FRACTION * mem:
            r["status"] = "skipped: K+V %s > %d %% of the device's %s" % (
                human_bytes(r["kv_bytes"]), 100 * MEM_FRACTION, human_bytes(mem))
    order = {"headline": 0, "long": 1, "refcheck": 2, "": 3}
    rows.sort(key=lambda r: order[r["role"]])  # stable: grid order within a role
    cols = ["batch", "kv_len", "qo_heads", "kv_heads", "head_dim", "page", "kv_dtype", "kv_bytes",
            "role", "status"]
    with open(plan_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({c: r[c] for c in cols})
    n = 0
    with open(testlist, "w") as f:
        for r in rows:
            if r["status"]:
                continue
            n += 1
            f.write("--routine %s --batch_size %d --s_kv %d --num_qo_heads %d --num_kv_heads %d "
                    "--head_dim_qk %d --head_dim_vo %d --page_size %d --q_dtype bfloat16 "
                    "--kv_dtype %s%s\n" % (DECODE_ROUTINE, r["batch"], r["kv_len"], r["qo_heads"],
                                          r["kv_heads"], r["head_dim"], r["head_dim"], r["page"],
                                          r["kv_dtype"],
                                          " --refcheck --allow_output_mismatch"
                                          if r["role"] == "refcheck" else ""))
    print("decode grid (%s): %d rows, %d to run, %d skipped (%s)"
          % (mode, len(rows), n, len(rows) - n,
             "K+V over %d %% of %s" % (100 * MEM_FRACTION, human_bytes(mem)) if mem > 0
             else "device memory unknown: none skipped"))
    return 0


def flags_key(text):
    """The grid key of a testlist line (its `flashinfer bench` flags)."""
    toks = shlex.split(text)
    val = {}
    for i, t in enumerate(toks[:-1]):
        if t.startswith("--"):
            val[t[2:]] = toks[i + 1]
    try:
        return (str(int(val["batch_size"])), str(int(val["s_kv"])), str(int(val["num_qo_heads"])),
                str(int(val["num_kv_heads"])), str(int(val["page_size"])),
                val.get("kv_dtype", "bfloat16").replace("torch.", ""))
    except (KeyError, ValueError):
        return None


def parse_testlist_log(log):
    """Per grid key: the fraction of peak bandwidth ([INFO]) and the error ([ERROR]) of its line."""
    frac, err, cur = {}, {}, None
    if not os.path.exists(log):
        return frac, err
    with open(log, errors="replace") as f:
        for line in f:
            m = re.match(r"\[TESTLIST\] line \d+: (.*)", line)
            if m:
                cur = flags_key(m.group(1))
                continue
            m = re.match(r"\[INFO\] \S+\s*:: ([0-9.]+) of the device's peak memory bandwidth", line)
            if m and cur:
                frac[cur] = float(m.group(1))
            m = re.match(r"\[ERROR\] testlist line \d+: (.*)", line)
            if m and cur:
                err[cur] = m.group(1).strip()[:200]
    return frac, err


def decode_grid(plan_csv, bench_csv, log, out_csv, phase_md):
    plan = read_csv(plan_csv)
    timed = {}
    for r in read_csv(bench_csv):
        if r.get("routine") == DECODE_ROUTINE:
            timed[flags_key("--batch_size %s --s_kv %s --num_qo_heads %s --num_kv_heads %s "
                            "--page_size %s --kv_dtype %s" % (r["batch_size"], r["s_kv"],
                                                             r["num_qo_heads"], r["num_kv_heads"],
                                                             r["page_size"], r["kv_dtype"]))] = r
    frac, err = parse_testlist_log(log)
    out, count, bad = [], {}, []
    for p in plan:
        k = grid_key(p)
        row = {c: p[c] for c in GRID_KEYS}
        row.update(median_ms="", tb_per_s="", pct_peak="")
        t = timed.get(k)
        if p["status"]:
            row["status"] = p["status"]
        elif t is not None:
            row["median_ms"] = "%.6f" % float(t["median_time"])
            row["tb_per_s"] = "%.4f" % float(t["tb_per_sec"])
            if k in frac:
                row["pct_peak"] = "%.1f" % (100 * frac[k])
            ref = t.get("refcheck", "")
            row["status"] = {"": "ok", "pass": "ok, refcheck pass"}.get(ref, "refcheck " + ref)
        elif k in err:
            row["status"] = "error: " + err[k]
        else:
            row["status"] = "not run (phase budget spent)"
        word = row["status"].split(":")[0].split(",")[0]
        count[word] = count.get(word, 0) + 1
        if not row["status"].startswith(("ok", "skipped")):
            bad.append(row)
        out.append(row)
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=GRID_COLUMNS)
        w.writeheader()
        w.writerows(out)
    with open(phase_md, "a") as f:
        f.write("\nDecode grid: %d rows: %s. `decode_grid.csv`; K+V read + q + o over the median "
                "for TB/s, the device's peak from its memory clock and bus width.\n\n"
                % (len(out), ", ".join("%d %s" % (v, k) for k, v in sorted(count.items())) or "none"))
        f.write("| batch | kv | heads | page | KV | median ms | TB/s | % of peak | status |\n"
                "|---|---|---|---|---|---|---|---|---|\n")
        for r in out:
            f.write("| %s | %s | %s:%s | %s | %s | %s | %s | %s | %s |\n" % (
                r["batch"], r["kv_len"], r["qo_heads"], r["kv_heads"], r["page"], r["kv_dtype"],
                r["median_ms"] or "-", r["tb_per_s"] or "-", r["pct_peak"] or "-",
                r["status"].replace("|", "/")))
        f.write("\n")
    print("decode grid: %d rows: %s" % (len(out), ", ".join("%d %s" % (v, k) for k, v in sorted(count.items()))))
    return 1 if (bad or not any(r["status"].startswith("ok") for r in out)) else 0


def fake_upstream(ours_csv, out_csv):
    """Dry run: upstream timings made up from ours (x0.8 to x1.2), to exercise the join."""
    rows = []
    for i, r in enumerate(read_csv(ours_csv)):
        row = {c: r[c] for c in GRID_KEYS}
        row.update(median_ms="", tb_per_s="", pct_peak="", status=r["status"])
        if r["median_ms"]:
            f = 0.8 + 0.1 * (i % 5)
            row["median_ms"] = "%.6f" % (float(r["median_ms"]) * f)
            row["tb_per_s"] = "%.4f" % (float(r["tb_per_s"]) / f)
            row["status"] = "fake (dry run: ours x %.1f)" % f
        rows.append(row)
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=GRID_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return 0


def compare(plan_csv, ours_csv, up_csv, out_md, out_csv):
    plan = read_csv(plan_csv)
    ours = {grid_key(r): r for r in read_csv(ours_csv)}
    up = {grid_key(r): r for r in read_csv(up_csv)}
    fake = any(r["status"].startswith("fake") for r in up.values())
    table = []
    for p in plan:
        k = grid_key(p)
        o, u = ours.get(k, {}), up.get(k, {})
        om, um = o.get("median_ms", ""), u.get("median_ms", "")
        ratio = float(um) / float(om) if om and um and float(om) > 0 else None
        table.append(dict(key=k, role=p["role"], ours_ms=om, upstream_ms=um, ratio=ratio,
                          ours_pct=o.get("pct_peak", ""), upstream_pct=u.get("pct_peak", ""),
                          ours_status=o.get("status", "not run"),
                          upstream_status=u.get("status", "not run")))
    ratios = [t for t in table if t["ratio"] is not None]
    head = next((t for t in table if t["role"] == "headline"), None)
    lines = []

    def fmt_key(k):
        return "batch %s kv %s heads %s:%s page %s %s" % k

    if head is None:
        lines.append("headline: not in the plan")
    elif head["ratio"] is None:
        lines.append("headline (%s): no ratio (ours: %s; upstream: %s)"
                     % (fmt_key(head["key"]), head["ours_status"], head["upstream_status"]))
    else:
        lines.append("headline (%s): upstream %s ms / ours %s ms = %.3fx (goal >= 1.0x: %s)"
                     % (fmt_key(head["key"]), head["upstream_ms"], head["ours_ms"], head["ratio"],
                        "met" if head["ratio"] >= 1.0 else "NOT met"))
    if ratios:
        worst = min(ratios, key=lambda t: t["ratio"])
        below = [t for t in ratios if t["ratio"] < 0.9]
        lines.append("minimum ratio over the grid: %.3fx (%s); %d of %d rows compared below 0.9x "
                     "(goal: none: %s)" % (worst["ratio"], fmt_key(worst["key"]), len(below),
                                           len(ratios), "met" if not below else "NOT met"))
    else:
        lines.append("minimum ratio over the grid: no row has both timings")
    longs = [t for t in table if t["role"] == "long" and t["ours_pct"]]
    if longs:
        low = min(longs, key=lambda t: float(t["ours_pct"]))
        lines.append("batch 1 x the longest kv: lowest %s %% of peak (%s; goal >= 70 %% on every "
                     "such row: %s)" % (low["ours_pct"], fmt_key(low["key"]),
                                         "met" if float(low["ours_pct"]) >= 70 else "NOT met"))
    else:
        lines.append("batch 1 x the longest kv: no % of peak measured (no CUDA rows)")
    if fake:
        lines.insert(0, "DRY RUN: the upstream timings are made up (ours x 0.8 to 1.2)")
    with open(out_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(GRID_KEYS + ["role", "ours_ms", "upstream_ms", "ratio_upstream_over_ours",
                                "ours_pct_peak", "upstream_pct_peak", "ours_status",
                                "upstream_status"])
        for t in table:
            w.writerow(list(t["key"]) + [t["role"], t["ours_ms"], t["upstream_ms"],
                                         "" if t["ratio"] is None else "%.4f" % t["ratio"],
                                         t["ours_pct"], t["upstream_pct"], t["ours_status"],
                                         t["upstream_status"]])
    with open(out_md, "w") as f:
        f.write("## Decode grid: flashinfer-cpp against upstream flashinfer-python\n\n")
        for l in lines:
            f.write("- %s\n" % l)
        f.write("\nRatio = upstream ms / ours ms (above 1: ours is faster); the headline row first; "
                "`decode_compare.csv`.\n\n| batch | kv | heads | page | KV | ours ms | upstream ms "
                "| ratio | ours % of peak | upstream % of peak | ours | upstream |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
        for t in table:
            k = t["key"]
            f.write("| %s | %s | %s:%s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n" % (
                k[0], k[1], k[2], k[3], k[4], k[5], t["ours_ms"] or "-", t["upstream_ms"] or "-",
                "-" if t["ratio"] is None else "**%.3f**" % t["ratio"] if t["ratio"] < 0.9
                else "%.3f" % t["ratio"], t["ours_pct"] or "-", t["upstream_pct"] or "-",
                t["ours_status"].replace("|", "/")[:80], t["upstream_status"].replace("|", "/")[:80]))
        f.write("\n")
    for l in lines:
        print("decode vs upstream: " + l)
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
        c = os.path.join(outdir, "decode_compare.md")
        if os.path.exists(c):
            f.write(open(c).read())
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
    if cmd == "decode-plan" and len(argv) == 6 and argv[2] in DECODE_GRIDS:
        return decode_plan(*argv[2:6])
    if cmd == "decode-grid" and len(argv) == 7:
        return decode_grid(*argv[2:7])
    if cmd == "fake-upstream" and len(argv) == 4:
        return fake_upstream(*argv[2:4])
    if cmd == "compare" and len(argv) == 7:
        return compare(*argv[2:7])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
