#!/usr/bin/env python3
"""Helpers of scripts/gpu-check: turn gtest XML, `flashinfer bench` output and replay output into
CSV rows and markdown, and assemble gpu-report.md. Standard library only (runs on any python3).

  gpu_check_report.py gtest OUT.csv PHASE.md TITLE XML...    per-test rows; exit 1 on a failure or
                                                             a skip not allowed on a GPU machine
  gpu_check_report.py bench LOG BENCH.csv OUT.csv PHASE.md DEVICE_NAME
  gpu_check_report.py kernels OUTDIR DEVICE DATE             kernels.csv from tests.csv/bench.csv
  gpu_check_report.py assemble OUTDIR                        gpu-report.md from the phase*.md
  gpu_check_report.py ctest LOG JUNIT.xml OUT.csv PHASE.md   the whole ctest suite (phase 2): one
                      row per case, a failure's first line; exit 1 on a failure or a CUDA case's
                      skip not allowed on a GPU machine (JUNIT may be absent: the log alone)
  gpu_check_report.py subset IN.csv OUT.csv PHASE.md TITLE REGEX    the rows of IN.csv whose test
                      matches REGEX (phase 3 from phase 2's whole suite); exit 1 on a failure
  gpu_check_report.py summary OUTDIR                         summary.md: one page in the shape of
                      shared/gpu/README.md (counts, each failure's first line, the bench table
                      with ratios to the peers) from what the phases left in OUTDIR
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
  Prefill grid (phases 5c and 6c), the same steps:
  gpu_check_report.py prefill-plan MODE MEM_BYTES PLAN.csv TESTLIST
  gpu_check_report.py prefill-grid PLAN.csv BENCH.csv LOG OUT.csv PHASE.md
  gpu_check_report.py fake-upstream-prefill OURS.csv OUT.csv   (one row per upstream backend)
  gpu_check_report.py compare-prefill PLAN.csv OURS.csv UPSTREAM.csv OUT.md OUT.csv
                      upstream_ms / ours_ms per row for upstream's fa2 and default (auto)
                      backends, the goals (>= 1.0x fa2 everywhere; >= 300 TFLOP/s headline)
  Op grids (KIND sampling: phases 5d/6d; rowops: 5e/6e; gemm: 5f/6f, the peer torch), the same steps:
  gpu_check_report.py op-plan KIND MODE MEM_BYTES PLAN.csv TESTLIST
  gpu_check_report.py op-grid KIND PLAN.csv BENCH.csv LOG OUT.csv PHASE.md
  gpu_check_report.py fake-upstream-op KIND OURS.csv OUT.csv
  gpu_check_report.py compare-op KIND PLAN.csv OURS.csv PEER.csv OUT.md OUT.csv
                      peer_ms / ours_ms per row, TB/s or TFLOP/s and % of the H100's peak; for
                      the GEMMs (one row per shape and op backend, torch timed once per shape)
                      also the shapes with our backends side by side and issue 46's goals
                      (GEMM_GOALS: pass / FAIL / no data), which `kernels` adds to kernels.csv
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
    ("moe_cuda.cu", r"^(MoeCuda\.|MoeCudaGrouped\.|TrtllmFp8BlockScaleMoeCuda\.|TrtllmBf16MoeCuda\.|TrtllmBf16RoutedMoeCuda\.|BackendOpsCuda\.MatchesCpu/.*(cutlass_fused_moe|fused_topk_deepseek|trtllm_fp8_block_scale|trtllm_bf16))"),
    ("norm_quant_cuda.cu", r"^BackendOpsCuda\.MatchesCpu/.*(rmsnorm_quant|layernorm_quant|fused_rmsnorm_silu)"),
    ("quant8_cuda.cu", r"^BackendOpsCuda\.MatchesCpu/.*per_token_group_quant_8bit"),
    ("topk_cuda.cu", r"^BackendOpsCuda\.MatchesCpu/.*top_k($|_page_table|_ragged|_varlen)"),
    ("gemm_fp8_cuda.cu", r"^(GemmFp8Cuda\.|BackendOpsCuda\.MatchesCpu/.*(gemm_fp8|mm_fp8|mxfp8|tgv_gemm|mm_M1_16|tinygemm))"),
    ("mla_cuda.cu", r"^(MlaCuda\.|BackendOpsCuda\.MatchesCpu/.*(MLA|_mla|concat_mla_k))"),
    ("ragged_attention_cuda.cu", r"^(TrtllmRaggedDeepseekCuda\.|FmhaV2PrefillCuda\.|BackendOpsCuda\.MatchesCpu/.*(ragged_attention_deepseek|fmha_v2))"),
    ("rope_quantize_cuda.cu", r"^(RopeQuantizeFp8Cuda\.|BackendOpsCuda\.MatchesCpu/.*rope_quantize)"),
    ("attention_jit_launch.cu", r"^(BackendOpsCudaJit\.|BatchPrefillCuda\.RaggedQk192Vo128)"),
    ("grouped_gemm_cuda.cu", r"^(GroupedMm(Bf16|Fp8)Cuda\.|SegmentGemmCuda\.|BackendOpsCuda\.MatchesCpu/.*(grouped_mm_(bf16|fp8)|SegmentGEMMWrapper))"),
    ("grouped_gemm_cutlass.cu", r"^GroupedMmBf16Cuda\.CutlassPath"),
    ("apilog_stats_cuda.cu", r"^ApiLog\.StatisticsCuda"),
    ("bench_timing_cuda.cu", None),  # from the bench phase: a CUDA [PERF] row was timed
    ("gguf_cuda.cu", r"^(MmGgufCuda\.|ChatCuda\.|BackendOpsCuda\.MatchesCpu/mm_gguf)"),
    ("attention_cudnn.cpp", r"^CudnnAttentionCuda\."),  # with attention_cudnn_lse.cu
]

# The host's lead in the peers' timers (as flashinfer bench's kBenchHostLeadCycles,
# src/kernels/cuda/bench_timing_cuda.h): device clock cycles held before each start event, and
# about 20 us more for each launch past the first of a Python loop, so every launch is queued
# before the timed range begins.
HOST_LEAD_CYCLES = 500000


def host_lead_cycles(launches=1):
    return HOST_LEAD_CYCLES + 40000 * max(0, launches - 1)


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
    # gpu-check writes each CSV row's call number to a side file (one per line, in row order),
    # followed by the row's environment where it set one (VAR=VALUE: shown after the routine).
    ids, envs = [], []
    side = bench_csv + ".rows"
    if os.path.exists(side):
        for x in open(side):
            if x.strip():
                ids.append(int(x.split()[0]))
                envs.append(" ".join(x.split()[1:]))
    table = []
    for i, r in enumerate(out):
        row_id = ids[i] if i < len(ids) else -1
        env = envs[i] if i < len(envs) else ""
        be = r.get("backend", "")
        bw = frac.get((row_id, be))
        kind = "fp8" if "fp8" in r.get("routine", "") else "bf16"
        tf = float(r.get("tflops") or 0)
        flop_frac = ""
        if r["routine"] in ("mm_bf16", "bmm_bf16", "bmm_fp8", "mm_fp4") and be == "cuda" and peaks.get(kind):
            flop_frac = "%.3f" % (tf / peaks[kind])
        table.append([r["routine"] + (" [%s]" % env if env else ""), be, r.get("median_time", ""),
                      r.get("tflops", ""),
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
            # one row per case: phase 3's rows repeat phase 2's when taken from its whole suite
            tests = list({r["test"]: r for r in csv.DictReader(f)}.values())
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
        # Issue 46's GEMM goals against torch in the same run (phase 5f's join), one row each.
        joined = gemm_compare_rows(outdir)
        fake = any(r.get("torch_status", "").startswith("fake") for r in joined)
        for g in gemm_goals(joined) if joined else []:
            w.writerow(["perf: " + g["goal"], device, date, "%s: %s%s" % (
                g["status"], "DRY RUN, made-up torch timings: " if fake else "",
                gemm_goal_detail(g))])
    return 0


def gemm_compare_rows(outdir):
    """gemm_compare.csv's rows as gemm_goals takes them (none when the join did not run)."""
    rows = []
    for r in read_csv(os.path.join(outdir, "gemm_compare.csv")):
        if "backend" not in r:
            continue  # a join written before the GEMM grid had backends
        r = dict(r)
        r["ratio"] = _num(r.get("ratio_torch_over_ours"))
        rows.append(r)
    return rows


# ---- the whole ctest suite (phase 2) ----------------------------------------------------------

# "  12/1808 Test  #847: Op/BackendOpsCuda.MatchesCpu/x ......***Failed    0.30 sec"
CTEST_RESULT = re.compile(r"^\s*\d+/\d+\s+Test\s+#(\d+):\s+(\S+)\s+\.*\s*(\*{3})?(.+?)\s+([0-9.]+)\s+sec\s*$")
# gtest and ctest lines that say nothing about why a case failed.
BOILERPLATE = re.compile(
    r"^(\[[ =A-Z-]+\]|\[==========\]|Note: |Running main\(\)|Google Test trace:|\S+:\d+: Failure$|"
    r"unknown file: Failure$|Test project |"
    r"\S+:\d+: Skipped$|\d+% tests passed|Label Time Summary|Total Test time|The following tests|"
    r"Errors while running CTest|cpu\s+=|\s*\d+ FAILED TESTS?$|Test command:|Working Directory:|"
    r"Environment variables:|Test timeout computed|\s*Start\s+\d+:)")


def _ctest_status(text):
    t = text.strip().lstrip("*")
    if t == "Passed":
        return "passed"
    if t.startswith("Skipped"):
        return "skipped"
    if t.startswith("Not Run (Disabled)"):
        return "disabled"
    return "failed"


def first_line(output):
    """The line that says why a case failed: gtest's message after "file:line: Failure", the
    crash handler's signal line and the crashing frame, or the first line that is not gtest's
    frame text."""
    lines = [l.rstrip() for l in output.splitlines()]
    # A case's own lines are sometimes prefixed "[test name] " (ctest -j output gathered later).
    lines = [re.sub(r"^\[[A-Za-z_][^\]\s]*[./][^\]\s]*\] ", "", l) for l in lines]
    for i, l in enumerate(lines):
        if l.startswith("*** fatal signal"):
            sig = l.split(" at address")[0].split(", pid")[0].replace("*** fatal signal ", "")
            sig = sig.split(" (")[0]
            for f in lines[i + 1:]:
                m = re.match(r"^\s+#\d+ 0x[0-9a-f]+ (.+?)(?: \((?:the test binary|[^()]+)\+0x[0-9a-f]+\))?$", f)
                if not m:
                    continue
                name = m.group(1)
                if re.search(r"crash_handler|flashinfer::test::\(anonymous|sigaction|__restore_rt|"
                             r"raise|abort|pthread_kill|^\?\?$", name):
                    continue
                return "%s in %s" % (sig, name)
            return sig
    for i, l in enumerate(lines):
        if re.search(r"(\S:\d+|^unknown file): Failure$", l):
            rest = []
            for x in lines[i + 1:i + 8]:
                if BOILERPLATE.match(x.strip()) or re.search(r"(\S:\d+|^unknown file): Failure$", x):
                    break
                if x.strip():
                    rest.append(x.strip())
            if rest:
                return " / ".join(rest)
    for l in lines:
        s = l.strip()
        if s and not BOILERPLATE.match(s) and not re.match(r"^\S+:\d+: ", s):
            return s
    return ""


def _junit_cases(path):
    """name -> (status or None, output) from ctest's --output-junit file (CMake >= 3.21)."""
    out = {}
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError):
        return out
    for tc in root.iter("testcase"):
        name = tc.get("name") or ""
        so = tc.find("system-out")
        text = so.text if so is not None and so.text else ""
        st = None
        if tc.find("failure") is not None or tc.find("error") is not None or tc.get("status") == "fail":
            st = "failed"
        elif tc.find("skipped") is not None or tc.get("status") in ("skipped", "notrun"):
            st = "skipped"
        elif tc.get("status") == "disabled":
            st = "disabled"
        elif tc.get("status") == "run":
            st = "passed"
        out[name] = (st, text)
    return out


def ctest(log, junit, out_csv, phase_md):
    results = []  # [name, status, kind]
    blocks, cur = {}, None
    with open(log, errors="replace") as f:
        for line in f:
            m = CTEST_RESULT.match(line)
            if m:
                cur = m.group(2)
                results.append([cur, _ctest_status(m.group(4)), m.group(4).strip().lstrip("*")])
                blocks[cur] = []
                continue
            if cur is not None and not re.match(r"^\s*Start\s+\d+:", line):
                blocks[cur].append(line)
    junit_cases = _junit_cases(junit) if junit and os.path.exists(junit) else {}
    if not results:  # no progress lines (an old ctest?): the JUnit file alone
        results = [[n, st or "passed", st or ""] for n, (st, _) in junit_cases.items()]
    rows, bad = [], []
    for name, status, kind in results:
        text = junit_cases.get(name, (None, ""))[1] or "".join(blocks.get(name, []))
        msg = ""
        if status == "failed":
            msg = first_line(text) or kind
            if kind not in ("Failed", "") and not msg.startswith(kind):
                msg = "%s: %s" % (kind, msg)
        elif status == "skipped":
            skips = [l.strip() for l in text.splitlines() if l.strip() and not BOILERPLATE.match(l.strip())]
            msg = skips[-1] if skips else ""
            if ALLOWED_SKIP.search(text):
                status = "skipped-ok"
        rows.append(["ctest", name, status, msg[:300]])
        # A CUDA case must run on a GPU machine; other skips (no model, no python package) are
        # listed but do not fail the phase.
        if status == "failed" or (status == "skipped" and "Cuda" in name):
            bad.append(rows[-1])
    with open(out_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["binary", "test", "status", "message"])
        w.writerows(rows)
    count = {}
    for r in rows:
        count[r[2]] = count.get(r[2], 0) + 1
    with open(phase_md, "a") as f:
        f.write("Whole suite (ctest, GPU visible, FLASHINFER_TEST_REQUIRE_CUDA=1): %d cases: %s.\n\n" % (
            len(rows), ", ".join("%d %s" % (v, k) for k, v in sorted(count.items())) or "none"))
        if not rows:
            f.write("**No test case ran** (see the ctest log).\n\n")
        if bad:
            f.write("| test | status | first line |\n|---|---|---|\n")
            for r in bad[:300]:
                f.write("| `%s` | **%s** | %s |\n" % (r[1], r[2], r[3].replace("|", "/")))
            f.write("\n")
    return 1 if (bad or not rows) else 0


def subset(in_csv, out_csv, phase_md, title, pattern):
    """The rows of an earlier phase's CSV whose test matches `pattern` (phase 3 from phase 2's
    whole-suite run); exit 1 on a failure or a skip among them, or when there is none."""
    rows = [r for r in read_csv(in_csv) if re.search(pattern, r["test"])]
    with open(out_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["binary", "test", "status", "message"])
        w.writerows([[r["binary"], r["test"], r["status"], r["message"]] for r in rows])
    bad = [r for r in rows if r["status"] in ("failed", "error", "skipped")]
    count = {}
    for r in rows:
        count[r["status"]] = count.get(r["status"], 0) + 1
    with open(phase_md, "a") as f:
        f.write("%s (from `%s`): %d test cases: %s.\n\n" % (
            title, os.path.basename(in_csv), len(rows),
            ", ".join("%d %s" % (v, k) for k, v in sorted(count.items())) or "none"))
        if bad:
            f.write("| test | status | first line |\n|---|---|---|\n")
            for r in bad[:300]:
                f.write("| `%s` | **%s** | %s |\n" % (r["test"], r["status"], r["message"].replace("|", "/")))
            f.write("\n")
    return 1 if (bad or not rows) else 0


# ---- summary.md: one page in the shape of shared/gpu/README.md ---------------------------------

# flashinfer bench rows and the peer that ran the same shape in the same run.
UPSTREAM_PEER = {"BatchPrefillWithPagedKVCacheWrapper.run": "BatchPrefillWithPagedKVCacheWrapper.run",
                 "rmsnorm": "rmsnorm",
                 "top_k_top_p_sampling_from_logits": "top_k_top_p_sampling_from_logits"}


def _num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _flag(cmd, name):
    m = re.search(r"--%s[ =](\S+)" % name, cmd or "")
    return m.group(1) if m else None


# The flags that make a routine's shape (bench's repro command lists every flag, defaults too).
SHAPE_FLAGS = [
    (r"Decode", [("batch_size", "batch"), ("s_kv", "kv"), ("num_qo_heads", "q heads"),
                 ("num_kv_heads", "kv heads"), ("head_dim_qk", "D"), ("page_size", "page"),
                 ("kv_dtype", "KV")]),
    (r"Prefill", [("batch_size", "batch"), ("s_qo", "qo"), ("s_kv", "kv"), ("num_qo_heads", "q heads"),
                  ("num_kv_heads", "kv heads"), ("head_dim_qk", "D")]),
    # MLA: the latent widths appear in the command only where they are not 512 / 64 (kpe 0: NoPE).
    (r"MLA", [("batch_size", "batch"), ("s_qo", "qo"), ("s_kv", "kv"), ("num_qo_heads", "heads"),
              ("page_size", "page"), ("head_dim_kpe", "kpe"), ("kv_dtype", "KV")]),
    (r"rope", [("batch_size", "batch"), ("s_qo", "tokens"), ("num_qo_heads", "q heads"),
               ("num_kv_heads", "kv heads"), ("head_dim_qk", "D")]),
    (r"^bmm_", [("batch_size", "batch"), ("m", "m"), ("n", "n"), ("k", "k")]),
    (r"^(mm_|gemm|tinygemm)", [("m", "m"), ("n", "n"), ("k", "k")]),
    (r"quantize", [("m", "m"), ("k", "k")]),
    (r"^stream_copy", [("m", "m"), ("n", "n")]),
    (r"sampling|softmax|top_k|top_p|renorm", [("batch_size", "batch"), ("vocab_size", "vocab"),
                                               ("top_k", "k"), ("top_p", "p")]),
    (r"norm|_and_mul", [("batch_size", "batch"), ("hidden_size", "hidden")]),
]


def bench_shape(r):
    """A short shape text from a bench row's repro command: the flags of its routine's family."""
    cmd = r.get("repro_command", "")
    keys = next((k for pat, k in SHAPE_FLAGS if re.search(pat, r.get("routine", ""))), [])
    if not re.search(r"sampling|top_k_mask|renorm", r.get("routine", "")):
        keys = [k for k in keys if k[0] not in ("top_k", "top_p")]
    parts = ["%s %s" % (label, _flag(cmd, k)) for k, label in keys if _flag(cmd, k)]
    if "--causal" in cmd:
        parts.append("causal")
    return ", ".join(parts)


def _ratio_text(peer_ms, ours_ms):
    if not peer_ms or not ours_ms or ours_ms <= 0 or peer_ms <= 0:
        return ""
    q = peer_ms / ours_ms
    return "%.2fx (%s)" % (q, "ours faster" if q >= 1 else "peer %.1fx faster" % (1 / q))


def bench_table(outdir):
    """Rows [routine, shape, ours, peer, ratio] for the summary's bench table."""
    rows = read_csv(os.path.join(outdir, "bench_rows.csv"))
    torch_rows = read_csv(os.path.join(outdir, "gemm_torch.csv"))
    up_rows = {r["case"]: r for r in read_csv(os.path.join(outdir, "upstream.csv"))}
    dc = [r for r in read_csv(os.path.join(outdir, "decode_compare.csv")) if r.get("role") == "headline"]
    table = []
    for r in rows:
        if r.get("backend") not in ("cuda", "cpu"):
            continue
        ms = _num(r.get("median_ms"))
        ours = "%s ms" % r["median_ms"] if r.get("median_ms") else "no time"
        tf, tb = _num(r.get("tflops")), _num(r.get("tb_per_sec"))
        if tf and tf > 0.05:
            ours += ", %.1f TFLOP/s" % tf
        if tb:
            ours += ", %.3g TB/s" % tb
        fb, ff = _num(r.get("frac_peak_bandwidth")), _num(r.get("frac_peak_flops"))
        if ff:
            ours += " (%.1f %% of peak FLOP/s)" % (100 * ff)
        elif fb:
            ours += " (%.1f %% of peak bandwidth)" % (100 * fb)
        if r.get("refcheck") not in ("", "pass", None):
            ours += "; refcheck **%s**" % r["refcheck"]
        peer, ratio = "", ""
        cmd = r.get("repro_command", "")
        if r["routine"] in ("mm_bf16", "bmm_fp8"):
            want = {"m": _flag(cmd, "m"), "n": _flag(cmd, "n"), "k": _flag(cmd, "k"),
                    "batch": (_flag(cmd, "batch_size") or "1") if r["routine"].startswith("bmm") else "1"}
            for t in torch_rows:
                if t.get("op") == r["routine"] and all(str(t.get(k)) == v for k, v in want.items() if v):
                    if t.get("median_ms"):
                        peer = "%s: %s ms, %.1f TFLOP/s" % (t.get("torch_call", "torch"), t["median_ms"],
                                                          _num(t.get("tflops")) or 0.0)
                        ratio = _ratio_text(_num(t["median_ms"]), ms)
                    else:
                        peer = "torch: %s" % (t.get("note") or "no time")
                    break
        elif r["routine"] in UPSTREAM_PEER and UPSTREAM_PEER[r["routine"]] in up_rows:
            u = up_rows[UPSTREAM_PEER[r["routine"]]]
            if u.get("median_ms"):
                peer = "upstream (%s): %s ms" % (u.get("shape", ""), u["median_ms"])
                ratio = _ratio_text(_num(u["median_ms"]), ms)
            else:
                peer = "upstream: %s" % u.get("status", "")
        elif r["routine"] == DECODE_ROUTINE and dc and dc[0].get("upstream_ms") and all(
                str(dc[0].get(key)) == str(_flag(cmd, flag)) for key, flag in (
                    ("batch", "batch_size"), ("kv_len", "s_kv"), ("qo_heads", "num_qo_heads"),
                    ("kv_heads", "num_kv_heads"), ("page", "page_size"))):
            h = dc[0]  # the grid's headline row is this row's shape
            peer = "upstream on the decode grid's headline row: %s ms" % h["upstream_ms"]
            ratio = _ratio_text(_num(h["upstream_ms"]), _num(h.get("ours_ms")) or ms)
        table.append([r["routine"], bench_shape(r), ours, peer, ratio])
    return table


def _md_header(outdir):
    info = {}
    p = os.path.join(outdir, "header.md")
    if os.path.exists(p):
        for line in open(p, errors="replace"):
            m = re.match(r"^- (date|device|nvcc|commit|build dir): (.*)$", line.strip())
            if m:
                info[m.group(1)] = m.group(2)
    return info


def _phase_times(outdir):
    out = []
    for p in sorted(glob.glob(os.path.join(outdir, "phase*.md"))):
        text = open(p, errors="replace").read()
        m = re.search(r"^Phase (\S+) (passed|FAILED) in (\d+) s\.", text, re.M)
        if m:
            out.append((m.group(1), m.group(2), int(m.group(3))))
    return out


def summary(outdir):
    info = _md_header(outdir)
    L = []
    date = (info.get("date") or "").split(" ")[0] or "(no date)"
    L.append("# What the GPU showed: %s, project at %s" % (date, info.get("commit", "unknown")))
    L.append("")
    L.append("Device: %s; nvcc %s. Written by `scripts/gpu-check` (`gpu_check_report.py summary`); the "
             "full report is `gpu-report.md`, every row in the CSVs beside it." % (
                 info.get("device", "unknown"), info.get("nvcc", "unknown")))
    L.append("")
    pt = _phase_times(outdir)
    if pt:
        L.append("Phases: " + "; ".join("%s %s in %d s" % (p, st, t) for p, st, t in pt)
                 + " (%d s in all)." % sum(t for _, _, t in pt))
        L.append("")
    # Tests: phase 2 (whole suite or the CUDA cases), then phase 3.
    for csv_name, title in (("tests_phase2.csv", "Tests (phase 2)"),
                            ("tests_phase3.csv", "test_backend_ops on CUDA (phase 3)")):
        rows = read_csv(os.path.join(outdir, csv_name))
        if not rows:
            continue
        count = {}
        for r in rows:
            count[r["status"]] = count.get(r["status"], 0) + 1
        whole = any(r["binary"] == "ctest" for r in rows)
        what = "whole ctest suite, GPU visible, FLASHINFER_TEST_REQUIRE_CUDA=1" if whole else "CUDA test cases"
        failed = [r for r in rows if r["status"] in ("failed", "error")]
        skipped = [r for r in rows if r["status"].startswith("skipped")]
        L.append("- **%s, %s: %d cases: %d passed, %d skipped, %d disabled, %d failed** (`%s`)." % (
            title, what, len(rows), count.get("passed", 0), len(skipped), count.get("disabled", 0),
            len(failed), csv_name))
        ops = [r for r in rows if "BackendOpsCuda.MatchesCpu/" in r["test"]]
        if ops:
            L.append("  - `BackendOpsCuda`: **%d op cases, %d pass, %d fail**." % (
                len(ops), sum(r["status"] == "passed" for r in ops),
                sum(r["status"] in ("failed", "error") for r in ops)))
        if skipped:
            bad_skips = [r for r in skipped if r["status"] == "skipped"]
            L.append("  - Skips: %d expected on a GPU machine (\"a GPU is present\", no model file), %d "
                     "other%s" % (len(skipped) - len(bad_skips), len(bad_skips),
                                  (": " + ", ".join("`%s`" % r["test"] for r in bad_skips[:12])
                                   + (" ..." if len(bad_skips) > 12 else "")) if bad_skips else "") + ".")
        if failed:
            L.append("  - Failures, first line each:")
            for r in failed[:80]:
                L.append("    - `%s`: %s" % (r["test"], r["message"].replace("\n", " ")[:220] or "(no message)"))
            if len(failed) > 80:
                L.append("    - ... and %d more (`%s`)" % (len(failed) - 80, csv_name))
    san = read_csv(os.path.join(outdir, "sanitizer.csv"))
    if san:
        tools = {}
        for r in san:
            tools.setdefault(r["tool"], []).append(r)
        parts = []
        for tool, rs in tools.items():
            clean = [r for r in rs if r["result"] == "pass"]
            nocuda = [r for r in rs if r["result"].startswith("no CUDA")]
            other = [r for r in rs if r not in clean and r not in nocuda]
            txt = "%s: %d binaries clean" % (tool, len(clean))
            if nocuda:
                txt += ", %d without a CUDA call (nothing to check: %s)" % (
                    len(nocuda), ", ".join(r["binary"] for r in nocuda))
            if other:
                txt += ", **%s**" % "; ".join("%s %s%s" % (r["binary"], r["result"],
                                                           " (%s errors)" % r["errors"] if r.get("errors") else "")
                                               for r in other)
            parts.append(txt)
        L.append("- compute-sanitizer (phase 4, `sanitizer.csv`): " + "; ".join(parts) + ".")
    rp = os.path.join(outdir, "replay.txt")
    if os.path.exists(rp):
        sums = [l.strip() for l in open(rp, errors="replace") if l.startswith("Summary")]
        if sums:
            L.append("- Cross-backend replay (phase 7): " + "; ".join(sums) + ".")
    dm = os.path.join(outdir, "decode_compare.md")
    if os.path.exists(dm):
        goals = [l.strip()[2:] for l in open(dm, errors="replace") if l.startswith("- ")]
        if goals:
            L.append("- Decode grid against upstream (phases 5b, 6a; `decode_compare.csv`): " + "; ".join(goals) + ".")
    pm = os.path.join(outdir, "prefill_compare.md")
    if os.path.exists(pm):
        goals = [l.strip()[2:] for l in open(pm, errors="replace") if l.startswith("- ")]
        if goals:
            L.append("- Prefill grid against upstream (phases 5c, 6c; `prefill_compare.csv`): " + "; ".join(goals) + ".")
    for kind, spec in OP_GRIDS.items():
        cm = os.path.join(outdir, "%s_compare.md" % kind)
        if os.path.exists(cm):
            goals = [l.strip()[2:] for l in open(cm, errors="replace") if l.startswith("- ")]
            if goals:
                L.append("- %s against %s (phases %s; `%s_compare.csv`): %s." % (
                    spec["title"], "torch" if spec["peer"] == "torch" else "upstream",
                    spec["phases"], kind, "; ".join(goals)))
    table = bench_table(outdir)
    if table:
        L.append("")
        L.append("| routine | shape | this library | same machine, same run | ratio (peer ms / ours ms) |")
        L.append("|---|---|---|---|---|")
        for t in table:
            L.append("| %s | %s | %s | %s | %s |" % tuple(c.replace("|", "/") or "" for c in t))
    L.append("")
    with open(os.path.join(outdir, "summary.md"), "w") as f:
        f.write("\n".join(L))
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



def write_csv(path, cols, rows):
    """rows as a CSV file with the columns cols (other keys of a row are left out)."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def missing_status(key, err):
    """The status of a grid row the run gave no timing for: its error (a skip when the op backend
    it asked for does not run in this build, e.g. bmm_fp8's cudnn without cuDNN), else the budget
    ran out."""
    if key in err:
        return err[key] if err[key].startswith("skipped: ") else "error: " + err[key]
    return "not run (phase budget spent)"


def tally(row, count, bad):
    """Counts a grid row by its status's first word; a row neither ok nor skipped goes to bad."""
    word = row["status"].split(":")[0].split(",")[0]
    count[word] = count.get(word, 0) + 1
    if not row["status"].startswith(("ok", "skipped")):
        bad.append(row)

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
    write_csv(plan_csv, cols, rows)
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


BANDWIDTH_INFO = re.compile(r"\[INFO\] \S+\s*:: ([0-9.]+) of the device's peak memory bandwidth")


def parse_testlist_log(log, key_fn=flags_key, info=BANDWIDTH_INFO):
    """Per grid key (key_fn of the line's flags): the fraction of the peak its [INFO] line gives
    (`info`: bandwidth for decode, tensor FLOP/s for prefill) and the error ([ERROR]) of its line."""
    frac, err, cur = {}, {}, None
    if not os.path.exists(log):
        return frac, err
    with open(log, errors="replace") as f:
        for line in f:
            m = re.match(r"\[TESTLIST\] line \d+: (.*)", line)
            if m:
                cur = key_fn(m.group(1))
                continue
            m = info.match(line)
            if m and cur:
                frac[cur] = float(m.group(1))
            m = re.match(r"\[ERROR\] testlist line \d+: (.*)", line)
            if m and cur:
                err[cur] = m.group(1).strip()[:200]
            # a line whose op backend this build or device does not run (flashinfer bench)
            m = re.match(r"\[SKIP\] testlist line \d+: (.*)", line)
            if m and cur:
                err[cur] = "skipped: " + m.group(1).strip()[:200]
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
        else:
            row["status"] = missing_status(k, err)
        tally(row, count, bad)
        out.append(row)
    write_csv(out_csv, GRID_COLUMNS, out)
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
    write_csv(out_csv, GRID_COLUMNS, rows)
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


# ---- prefill grid (phases 5c and 6c) ------------------------------------------------------------

PREFILL_ROUTINE = "BatchPrefillWithPagedKVCacheWrapper.run"
PREFILL_GRIDS = {
    # head dim x causal x batch x qo = kv x heads (qo:kv), plus the chunked-prefill shapes
    # (batch, qo, kv, causal, heads, D) and multi-item scoring's prompts (SGLang's scoring API:
    # batch, prefix tokens, items, tokens an item, heads, D; causal, qo = kv = prefix + items x
    # (item + 1) + 1: a delimiter before each item and one at the end); q, K, V and o bf16, page 16.
    "full": dict(head_dims=[128, 64], causal=[True, False], batches=[1, 8], qo_kv=[512, 2048, 8192],
                 heads=[(32, 8), (32, 32)], chunked=[(8, 256, 4096, True, 32, 8, 128)], page=16,
                 multi_item=[(1, 256, 64, 32, 32, 8, 128), (8, 256, 64, 32, 32, 8, 128),
                             (1, 1024, 32, 64, 32, 8, 128), (4, 500, 100, 20, 32, 8, 128)],
                 headline=(1, 8192, 8192, 32, 8, 128, True), refcheck=(1, 512)),
    # --quick: batch 1 and 8, qo = kv 2048 and 8192, GQA only.
    "quick": dict(head_dims=[128, 64], causal=[True, False], batches=[1, 8], qo_kv=[2048, 8192],
                  heads=[(32, 8)], chunked=[(8, 256, 4096, True, 32, 8, 128)], page=16,
                  multi_item=[(1, 256, 64, 32, 32, 8, 128), (8, 256, 64, 32, 32, 8, 128)],
                  headline=(1, 8192, 8192, 32, 8, 128, True), refcheck=None),
    # --dry-run: the same axes, tiny, on the CPU (a made-up memory size skips the largest rows).
    "dry": dict(head_dims=[64, 128], causal=[True, False], batches=[1, 3], qo_kv=[16, 48],
                heads=[(4, 2), (4, 4)], chunked=[(3, 8, 64, True, 4, 2, 64)], page=16,
                multi_item=[(2, 6, 4, 3, 4, 2, 64)],
                headline=(1, 48, 48, 4, 2, 64, True), refcheck=(1, 16)),
}
# `items`: multi-item scoring's "prefix/item" token counts (flashinfer bench's --prefix_len and
# --item_len), empty for the other rows.
PREFILL_KEYS = ["batch", "qo_len", "kv_len", "qo_heads", "kv_heads", "head_dim", "causal", "items"]
PREFILL_COLUMNS = PREFILL_KEYS + ["median_ms", "tflops", "pct_peak", "status"]
UPSTREAM_PREFILL_COLUMNS = PREFILL_KEYS + ["backend", "median_ms", "tflops", "pct_peak", "status"]
UPSTREAM_PREFILL_BACKENDS = ["fa2", "auto"]


def prefill_key(r):
    c = str(r["causal"]).strip().lower() in ("true", "1", "yes")
    return (tuple(str(int(r[k])) for k in PREFILL_KEYS[:6]) + ("True" if c else "False",)
            + (str(r.get("items") or ""),))


def prefill_items(prefix_len, item_len):
    """The `items` key of a row from flashinfer bench's --prefix_len / --item_len (-1: none)."""
    try:
        p = int(prefix_len)
    except (TypeError, ValueError):
        return ""
    return "%d/%d" % (p, int(item_len)) if p >= 0 else ""


def prefill_plan(mode, mem_bytes, plan_csv, testlist):
    g = PREFILL_GRIDS[mode]
    mem = float(mem_bytes)
    rows = []
    for d in g["head_dims"]:  # one head dim's rows together: upstream JIT-compiles per head dim
        for c in g["causal"]:
            for b in g["batches"]:
                for n in g["qo_kv"]:
                    for h, hk in g["heads"]:
                        rows.append(dict(batch=b, qo_len=n, kv_len=n, qo_heads=h, kv_heads=hk,
                                         head_dim=d, causal=c, chunked=False))
    for b, q, kv, c, h, hk, d in g["chunked"]:
        rows.append(dict(batch=b, qo_len=q, kv_len=kv, qo_heads=h, kv_heads=hk, head_dim=d,
                         causal=c, chunked=True))
    for b, prefix, n, item, h, hk, d in g["multi_item"]:
        kv = prefix + n * (item + 1) + 1
        rows.append(dict(batch=b, qo_len=kv, kv_len=kv, qo_heads=h, kv_heads=hk, head_dim=d,
                         causal=True, chunked=False, items="%d/%d" % (prefix, item)))
    for r in rows:
        r.setdefault("items", "")
        r["page"] = g["page"]
        # q, K, V and o in bf16 (K and V page-aligned per request).
        pages = (r["kv_len"] + g["page"] - 1) // g["page"]
        r["bytes"] = 2 * (2 * r["batch"] * r["qo_len"] * r["qo_heads"] * r["head_dim"]
                          + 2 * r["batch"] * pages * g["page"] * r["kv_heads"] * r["head_dim"])
        key = (r["batch"], r["qo_len"], r["kv_len"], r["qo_heads"], r["kv_heads"], r["head_dim"],
               r["causal"])
        r["role"] = ("headline" if key == g["headline"] and not r["items"] else
                     "chunked" if r["chunked"] else
                     "multi_item" if r["items"] else
                     "refcheck" if g["refcheck"] and (r["batch"], r["qo_len"]) == g["refcheck"]
                     and r["qo_len"] == r["kv_len"] else "")
        r["status"] = ""
        if mem > 0 and r["bytes"] > MEM_FRACTION * mem:
            r["status"] = "skipped: q+K+V+o %s > %d %% of the device's %s" % (
                human_bytes(r["bytes"]), 100 * MEM_FRACTION, human_bytes(mem))
    order = {"headline": 0, "chunked": 1, "multi_item": 2, "refcheck": 3, "": 4}
    rows.sort(key=lambda r: order[r["role"]])  # stable: grid order within a role
    cols = PREFILL_KEYS + ["page", "bytes", "role", "status"]
    write_csv(plan_csv, cols, rows)
    n = 0
    with open(testlist, "w") as f:
        for r in rows:
            if r["status"]:
                continue
            n += 1
            items = ""
            if r["items"]:
                items = " --prefix_len %s --item_len %s" % tuple(r["items"].split("/"))
            f.write("--routine %s --batch_size %d --s_qo %d --s_kv %d --num_qo_heads %d "
                    "--num_kv_heads %d --head_dim_qk %d --head_dim_vo %d --page_size %d "
                    "--q_dtype bfloat16 --kv_dtype bfloat16%s%s%s\n"
                    % (PREFILL_ROUTINE, r["batch"], r["qo_len"], r["kv_len"], r["qo_heads"],
                       r["kv_heads"], r["head_dim"], r["head_dim"], r["page"],
                       " --causal" if r["causal"] else "", items,
                       " --refcheck --allow_output_mismatch" if r["role"] == "refcheck" else ""))
    print("prefill grid (%s): %d rows, %d to run, %d skipped (%s)"
          % (mode, len(rows), n, len(rows) - n,
             "q+K+V+o over %d %% of %s" % (100 * MEM_FRACTION, human_bytes(mem)) if mem > 0
             else "device memory unknown: none skipped"))
    return 0


def prefill_flags_key(text):
    """The prefill grid key of a testlist line (its `flashinfer bench` flags)."""
    toks = shlex.split(text)
    val = {}
    for i, t in enumerate(toks):
        if t.startswith("--"):
            val[t[2:]] = toks[i + 1] if i + 1 < len(toks) and not toks[i + 1].startswith("--") else ""
    try:
        return prefill_key(dict(batch=val["batch_size"], qo_len=val["s_qo"], kv_len=val["s_kv"],
                                qo_heads=val["num_qo_heads"], kv_heads=val["num_kv_heads"],
                                head_dim=val["head_dim_qk"], causal="causal" in val,
                                items=prefill_items(val.get("prefix_len"), val.get("item_len"))))
    except (KeyError, ValueError):
        return None


TENSOR_PEAK_INFO = re.compile(r"\[INFO\] \S+\s*:: ([0-9.]+) of the device's dense 16-bit tensor peak")


def prefill_grid(plan_csv, bench_csv, log, out_csv, phase_md):
    plan = read_csv(plan_csv)
    timed = {}
    for r in read_csv(bench_csv):
        if r.get("routine") == PREFILL_ROUTINE:
            timed[prefill_key(dict(batch=r["batch_size"], qo_len=r["s_qo"], kv_len=r["s_kv"],
                                   qo_heads=r["num_qo_heads"], kv_heads=r["num_kv_heads"],
                                   head_dim=r["head_dim_qk"], causal=r["causal"],
                                   items=prefill_items(r.get("prefix_len"),
                                                       r.get("item_len"))))] = r
    frac, err = parse_testlist_log(log, prefill_flags_key, TENSOR_PEAK_INFO)
    out, count, bad = [], {}, []
    for p in plan:
        k = prefill_key(p)
        row = dict(zip(PREFILL_KEYS, k))
        row.update(median_ms="", tflops="", pct_peak="")
        t = timed.get(k)
        if p["status"]:
            row["status"] = p["status"]
        elif t is not None:
            row["median_ms"] = "%.6f" % float(t["median_time"])
            row["tflops"] = "%.4g" % float(t["tflops"])
            if k in frac:
                row["pct_peak"] = "%.1f" % (100 * frac[k])
            ref = t.get("refcheck", "")
            row["status"] = {"": "ok", "pass": "ok, refcheck pass"}.get(ref, "refcheck " + ref)
        else:
            row["status"] = missing_status(k, err)
        tally(row, count, bad)
        out.append(row)
    write_csv(out_csv, PREFILL_COLUMNS, out)
    with open(phase_md, "a") as f:
        f.write("\nPrefill grid: %d rows: %s. `prefill_grid.csv`; FLOPs as flashinfer bench counts "
                "them (causal and multi-item scoring: the visible pairs), %% of the device's dense "
                "16-bit tensor peak.\n\n"
                % (len(out), ", ".join("%d %s" % (v, k) for k, v in sorted(count.items())) or "none"))
        f.write("| batch | qo | kv | heads | D | causal | median ms | TFLOP/s | % of peak | status |\n"
                "|---|---|---|---|---|---|---|---|---|---|\n")
        for r in out:
            f.write("| %s | %s | %s | %s:%s | %s | %s | %s | %s | %s | %s |\n" % (
                r["batch"], r["qo_len"], r["kv_len"], r["qo_heads"], r["kv_heads"], r["head_dim"],
                causal_cell(r["causal"], r["items"]), r["median_ms"] or "-", r["tflops"] or "-", r["pct_peak"] or "-",
                r["status"].replace("|", "/")))
        f.write("\n")
    print("prefill grid: %d rows: %s" % (len(out), ", ".join("%d %s" % (v, k) for k, v in sorted(count.items()))))
    return 1 if (bad or not any(r["status"].startswith("ok") for r in out)) else 0


def causal_cell(causal, items):
    """A prefill row's mask in a table: causal, and multi-item scoring's prefix / item tokens."""
    return "%s, multi-item %s" % (causal, items) if items else causal


def fake_upstream_prefill(ours_csv, out_csv):
    """Dry run: upstream timings per backend made up from ours (x0.8 to x1.2), for the join."""
    rows = []
    for i, r in enumerate(read_csv(ours_csv)):
        for j, be in enumerate(UPSTREAM_PREFILL_BACKENDS):
            row = {c: r[c] for c in PREFILL_KEYS}
            row.update(backend=be, median_ms="", tflops="", pct_peak="", status=r["status"])
            if r["median_ms"]:
                f = 0.8 + 0.1 * ((i + 2 * j) % 5)
                row["median_ms"] = "%.6f" % (float(r["median_ms"]) * f)
                row["tflops"] = "%.4g" % (float(r["tflops"]) / f)
                row["status"] = "fake (dry run: ours x %.1f)" % f
            rows.append(row)
    write_csv(out_csv, UPSTREAM_PREFILL_COLUMNS, rows)
    return 0


def compare_prefill(plan_csv, ours_csv, up_csv, out_md, out_csv):
    plan = read_csv(plan_csv)
    ours = {prefill_key(r): r for r in read_csv(ours_csv)}
    up = {}
    for r in read_csv(up_csv):
        up[(prefill_key(r), r.get("backend", ""))] = r
    fake = any(r["status"].startswith("fake") for r in up.values())
    bes = UPSTREAM_PREFILL_BACKENDS
    table = []
    for p in plan:
        k = prefill_key(p)
        o = ours.get(k, {})
        om = o.get("median_ms", "")
        t = dict(key=k, role=p["role"], ours_ms=om, ours_tflops=o.get("tflops", ""),
                 ours_pct=o.get("pct_peak", ""), ours_status=o.get("status", "not run"))
        for be in bes:
            u = up.get((k, be), {})
            um = u.get("median_ms", "")
            t[be + "_ms"] = um
            t[be + "_ratio"] = float(um) / float(om) if om and um and float(om) > 0 else None
            t[be + "_status"] = u.get("status", "not run")
        table.append(t)

    def fmt_key(k):
        return "batch %s qo %s kv %s heads %s:%s D %s %s%s" % (
            k[:6] + ("causal" if k[6] == "True" else "not causal",
                     ", multi-item %s" % k[7] if k[7] else ""))

    lines = []
    head = next((t for t in table if t["role"] == "headline"), None)
    if head is None:
        lines.append("headline: not in the plan")
    else:
        tf = _num(head["ours_tflops"])
        parts = ["ours %s" % ("%.4g TFLOP/s (goal >= 300: %s)" % (tf, "met" if tf >= 300 else "NOT met")
                              if tf is not None else head["ours_status"])]
        for be in bes:
            parts.append("upstream %s: %s" % (be, "%.3fx" % head[be + "_ratio"]
                                              if head[be + "_ratio"] is not None
                                              else head[be + "_status"]))
        lines.append("headline (%s): %s" % (fmt_key(head["key"]), "; ".join(parts)))
    for be in bes:
        rs = [t for t in table if t[be + "_ratio"] is not None]
        if not rs:
            lines.append("against upstream %s: no row has both timings" % be)
            continue
        worst = min(rs, key=lambda t: t[be + "_ratio"])
        below = [t for t in rs if t[be + "_ratio"] < 1.0]
        goal = (" (goal: >= 1.0x on every shape: %s)" % ("met" if not below else "NOT met")
                if be == "fa2" else " (upstream's default: FA3 on Hopper; reported, the next step)")
        lines.append("against upstream %s: minimum ratio %.3fx (%s); %d of %d rows compared below "
                     "1.0x%s" % (be, worst[be + "_ratio"], fmt_key(worst["key"]), len(below),
                                 len(rs), goal))
    if fake:
        lines.insert(0, "DRY RUN: the upstream timings are made up (ours x 0.8 to 1.2)")
    with open(out_csv, "w", newline="") as f:
        w = csv.writer(f)
        hdr = PREFILL_KEYS + ["role", "ours_ms", "ours_tflops", "ours_pct_peak"]
        for be in bes:
            hdr += ["upstream_%s_ms" % be, "ratio_%s_over_ours" % be]
        hdr += ["ours_status"] + ["upstream_%s_status" % be for be in bes]
        w.writerow(hdr)
        for t in table:
            row = list(t["key"]) + [t["role"], t["ours_ms"], t["ours_tflops"], t["ours_pct"]]
            for be in bes:
                row += [t[be + "_ms"], "" if t[be + "_ratio"] is None else "%.4f" % t[be + "_ratio"]]
            row += [t["ours_status"]] + [t[be + "_status"] for be in bes]
            w.writerow(row)

    def cell(r):
        return "-" if r is None else "**%.3f**" % r if r < 1.0 else "%.3f" % r

    with open(out_md, "w") as f:
        f.write("## Prefill grid: flashinfer-cpp against upstream flashinfer-python (fa2, auto)\n\n")
        for l in lines:
            f.write("- %s\n" % l)
        f.write("\nRatio = upstream ms / ours ms (above 1: ours is faster; below 1.0 in bold); the "
                "headline row first; `prefill_compare.csv`.\n\n| batch | qo | kv | heads | D | causal "
                "| ours ms | ours TFLOP/s | ours % of peak | fa2 ms | fa2 ratio | auto ms | auto ratio "
                "| ours | fa2 | auto |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
        for t in table:
            k = t["key"]
            f.write("| %s | %s | %s | %s:%s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n" % (
                k[0], k[1], k[2], k[3], k[4], k[5], causal_cell(k[6], k[7]), t["ours_ms"] or "-",
                t["ours_tflops"] or "-",
                t["ours_pct"] or "-", t["fa2_ms"] or "-", cell(t["fa2_ratio"]), t["auto_ms"] or "-",
                cell(t["auto_ratio"]), t["ours_status"].replace("|", "/")[:60],
                t["fa2_status"].replace("|", "/")[:60], t["auto_status"].replace("|", "/")[:60]))
        f.write("\n")
    for l in lines:
        print("prefill vs upstream: " + l)
    return 0

# ---- the op grids: sampling, row ops, GEMM (phases 5d/6d, 5e/6e, 5f/6f) -------------------------
# One code path for the three: a plan (rows, each with its `flashinfer bench` flags), our
# --testlist run read back, the peer's timings (upstream flashinfer-python; torch.matmul /
# torch._scaled_mm for the GEMMs) and their join. Each row's key is (routine, the grid's key
# columns); bytes and FLOPs are counted as the bench hooks count them, so that the peer's TB/s or
# TFLOP/s is the same count over its own time. % of peak is against the H100 SXM datasheet
# (3.35 TB/s HBM3; dense 989.4 bf16 / 1978.9 fp8 TFLOP/s), whatever the device, as the brief of
# these grids asks; the device name is in the report's header.
H100_TBPS = 3.35
H100_TFLOPS = {"bf16": 989.4, "fp8": 1978.9}
SAMPLING_ROUTINES = ["top_k_top_p_sampling_from_probs", "top_p_sampling_from_probs",
                     "top_k_sampling_from_probs"]
ROWOP_ROUTINES = ["rmsnorm", "fused_add_rmsnorm", "silu_and_mul", "apply_rope_pos_ids"]
OP_GRIDS = {
    "sampling": dict(
        title="Sampling grid", phases="5d, 6d", keys=["batch", "vocab"], metric="tb_per_s",
        peer="upstream", peer_csv="upstream_sampling_grid.csv",
        modes={
            # routine x batch x vocab; probabilities: softmax of logits uniform in [-8, 8], fp32
            "full": dict(routines=SAMPLING_ROUTINES, batches=[1, 64, 256],
                         vocabs=[32000, 128256, 151936], top_k=50, top_p=0.9,
                         headline=("top_k_top_p_sampling_from_probs", 64, 128256),
                         refcheck=(1, 32000)),
            "quick": dict(routines=SAMPLING_ROUTINES[:1], batches=[1, 64, 256],
                          vocabs=[32000, 128256, 151936], top_k=50, top_p=0.9,
                          headline=("top_k_top_p_sampling_from_probs", 64, 128256),
                          refcheck=None),
            "dry": dict(routines=SAMPLING_ROUTINES, batches=[1, 3], vocabs=[64, 1000], top_k=8,
                        top_p=0.9, headline=("top_k_top_p_sampling_from_probs", 3, 1000),
                        refcheck=(1, 64)),
        }),
    "rowops": dict(
        title="Row-op grid", phases="5e, 6e", keys=["tokens", "hidden"], metric="tb_per_s",
        peer="upstream", peer_csv="upstream_rowops_grid.csv",
        modes={
            # routine x hidden x tokens (bf16), plus silu_and_mul at Llama-3-8B's MLP width;
            # silu_and_mul's hidden is its output width (input 2 x hidden); RoPE's hidden is
            # q heads x head dim (kv heads apart), batch 1 x tokens positions 0..tokens-1.
            "full": dict(routines=ROWOP_ROUTINES, hiddens=[4096, 8192],
                         tokens=[1, 64, 4096, 16384], extra=[("silu_and_mul", 8192, 14336)],
                         head_dim=128, kv_heads=8, headline=("rmsnorm", 4096, 4096),
                         refcheck=(64, 4096)),
            "quick": dict(routines=["rmsnorm", "silu_and_mul"], hiddens=[4096, 8192],
                          tokens=[1, 4096, 16384], extra=[("silu_and_mul", 8192, 14336)],
                          head_dim=128, kv_heads=8, headline=("rmsnorm", 4096, 4096),
                          refcheck=None),
            "dry": dict(routines=ROWOP_ROUTINES, hiddens=[256, 512], tokens=[1, 8],
                        extra=[("silu_and_mul", 16, 384)], head_dim=64, kv_heads=2,
                        headline=("rmsnorm", 8, 256), refcheck=(1, 256)),
        }),
    "gemm": dict(
        # Issue 46's grid: each shape on each of our op backends (`flashinfer bench --backends`)
        # and torch in the same phase (5f; 6f alone re-times torch). batch: bmm's batch, the
        # grouped GEMMs' groups (E experts), 1 for mm; m: rows, or a grouped GEMM's tokens per
        # group (group e gets m + 3 * (e % 4), the last empty: grouped_sizes, as the bench hook).
        title="GEMM grid", phases="5f, 6f", keys=["backend", "batch", "m", "n", "k"],
        metric="tflops", peer="torch", peer_csv="torch_gemm_grid.csv",
        modes={
            # mm_bf16 / bmm_bf16 (batch 4) / bmm_fp8 (batch 1: one torch._scaled_mm) x m {1, 16,
            # 128, 1024, 4096} x n = k = 4096, and m = n = k = 8192; B an [n, k] weight used
            # transposed, bf16 out, fp8 e4m3 with unit per-tensor scales. The grouped GEMMs: 8
            # and 64 experts x 16 and 128 tokens per expert, n 4096 x k 7168 (DeepSeek-V3's MoE
            # up-projection: hidden 7168, 2 x 2048 gate/up columns).
            "full": dict(dense=[("mm_bf16", ["auto", "cudnn"], 1),
                                ("bmm_bf16", ["auto", "cudnn"], 4),
                                ("bmm_fp8", ["cublas", "cudnn"], 1)],
                         ms=[1, 16, 128, 1024, 4096], nk=4096, cube=8192,
                         grouped=[("grouped_mm_bf16", ["cudnn"]), ("grouped_mm_fp8", ["cudnn"])],
                         groups=[8, 64], tokens=[16, 128], grouped_nk=(4096, 7168),
                         headline=("mm_bf16", "auto", 1, 4096, 4096, 4096), refcheck_m=16,
                         refcheck_groups=8),
            "quick": dict(dense=[("mm_bf16", ["auto", "cudnn"], 1), ("bmm_fp8", ["cublas"], 1)],
                          ms=[1, 128, 4096], nk=4096, cube=8192,
                          grouped=[("grouped_mm_bf16", ["cudnn"])], groups=[64], tokens=[16, 128],
                          grouped_nk=(4096, 7168),
                          headline=("mm_bf16", "auto", 1, 4096, 4096, 4096), refcheck_m=None,
                          refcheck_groups=None),
            # --dry-run: the same routines and backends, tiny, on the CPU reference (cpu:NAME)
            "dry": dict(dense=[("mm_bf16", ["auto", "cudnn"], 1),
                               ("bmm_bf16", ["auto", "cudnn"], 2),
                               ("bmm_fp8", ["cublas", "cudnn"], 1)],
                        ms=[1, 8], nk=64, cube=128,
                        grouped=[("grouped_mm_bf16", ["cudnn"]), ("grouped_mm_fp8", ["cudnn"])],
                        groups=[2, 64], tokens=[4, 8], grouped_nk=(64, 128),
                        headline=("mm_bf16", "auto", 1, 8, 64, 64), refcheck_m=8,
                        refcheck_groups=2),
        }),
}
GEMM_ROUTINES = ["mm_bf16", "bmm_bf16", "bmm_fp8", "grouped_mm_bf16", "grouped_mm_fp8"]
# Issue 46's goals against torch in the same run: (routine, our backend, minimum ratio torch ms /
# ours ms, the batch (groups) the goal is about or None for every row, the torch yardstick).
GEMM_GOALS = [
    ("mm_bf16", "auto", 0.97, None, "torch.matmul"),
    ("bmm_fp8", "cublas", 0.95, None, "torch._scaled_mm"),
    ("grouped_mm_bf16", "cudnn", 0.90, 64, "a loop of torch.matmul"),
    ("grouped_mm_fp8", "cudnn", 0.90, 64, "a loop of torch._scaled_mm"),
]
# What each backend name runs here, for the report (docs/GEMM_AND_QUANTIZATION.md).
GEMM_BACKEND_TEXT = {("mm_bf16", "auto"): "cuBLASLt", ("bmm_bf16", "auto"): "cuBLASLt",
                     ("bmm_fp8", "cublas"): "cuBLASLt", ("mm_bf16", "cudnn"): "cuDNN",
                     ("bmm_bf16", "cudnn"): "cuDNN", ("bmm_fp8", "cudnn"): "cuDNN",
                     ("grouped_mm_bf16", "cudnn"):
                         "CUTLASS sm90 grouped GEMM on sm_90, else the grouped tensor-core kernel",
                     ("grouped_mm_fp8", "cudnn"):
                         "CUTLASS sm90 grouped GEMM (e4m3 x e4m3 -> bf16) on sm_90, else the "
                         "grouped tensor-core kernel"}


def grouped_sizes(groups, m):
    """Rows of each group of the grouped GEMMs' bench case (src/api/grouped_gemm.cpp
    bench_indptr): m + 3 * (e % 4), the last group empty when there are more than two."""
    return [0 if (groups > 2 and e == groups - 1) else m + 3 * (e % 4) for e in range(groups)]


def gemm_counts(routine, batch, m, n, k):
    """(bytes, FLOPs) of one GEMM grid row as the bench hooks count them: A, B and the bf16
    output once each; 2 * rows * n * k."""
    esz = 1 if "fp8" in routine else 2
    if routine.startswith("grouped_"):
        rows = sum(grouped_sizes(batch, m))
        return esz * (rows * k + batch * n * k) + 2 * rows * n, 2 * rows * n * k
    return batch * (esz * (m * k + n * k) + 2 * m * n), 2 * batch * m * n * k


def gemm_goal(routine, backend, batch):
    """The goal that covers a row: (minimum ratio, yardstick), or None."""
    for rt, be, need, only, what in GEMM_GOALS:
        if rt == routine and be == backend and (only is None or int(batch) == only):
            return need, what
    return None


def gemm_goals(rows):
    """Each goal of GEMM_GOALS over joined rows (dicts with routine, backend, batch, m, n, k and
    ratio: torch ms / ours ms or None): dicts goal (text), status ("pass", "FAIL", "no data"),
    rows (with a ratio), below (rows under the goal), worst (the lowest row or None)."""
    out = []
    for rt, be, need, only, what in GEMM_GOALS:
        mine = [r for r in rows if r["routine"] == rt and r["backend"] == be and
                (only is None or int(r["batch"]) == only)]
        timed = [r for r in mine if r["ratio"] is not None]
        below = [r for r in timed if r["ratio"] < need]
        text = "%s (backend %s, %s) >= %.2fx %s%s" % (
            rt, be, GEMM_BACKEND_TEXT.get((rt, be), be), need, what,
            " at %d groups" % only if only else " on every shape")
        status = ("no data" if not timed else "FAIL" if below or len(timed) < len(mine)
                  else "pass")
        out.append(dict(goal=text, status=status, rows=len(timed), planned=len(mine),
                        below=len(below),
                        worst=min(timed, key=lambda r: r["ratio"]) if timed else None))
    return out


def gemm_shape_text(r):
    if r["routine"].startswith("grouped_"):
        return "%s groups x %s tokens, n %s, k %s" % (r["batch"], r["m"], r["n"], r["k"])
    return "%sm %s, n %s, k %s" % ("batch %s, " % r["batch"] if r["routine"].startswith("bmm_")
                                   and str(r["batch"]) != "1" else "", r["m"], r["n"], r["k"])


def gemm_goal_detail(g):
    """A goal's outcome in words, after its status."""
    if g["worst"] is None:
        return "no row has both timings"
    w = g["worst"]
    return "%d of %d rows timed, %d below; lowest %.3fx (%s)" % (
        g["rows"], g["planned"], g["below"], w["ratio"], gemm_shape_text(w))


def gemm_goal_text(g):
    """One line for a goal's outcome (compare md, summary)."""
    return "%s: **%s**, %s" % (g["goal"], g["status"], gemm_goal_detail(g))
OP_COLUMNS = ["median_ms", "metric", "pct_peak", "status"]


def op_peak(routine):
    """(peak, unit) for % of peak: H100 HBM bandwidth, or its dense tensor peak of the GEMM's
    operand width."""
    if routine in GEMM_ROUTINES:
        return H100_TFLOPS["fp8" if "fp8" in routine else "bf16"], "TFLOP/s"
    return H100_TBPS, "TB/s"


def flag_dict(text):
    """`--name value` pairs of a flag string (a lone `--flag` maps to "")."""
    toks = shlex.split(text)
    val = {}
    for i, t in enumerate(toks):
        if t.startswith("--"):
            val[t[2:]] = toks[i + 1] if i + 1 < len(toks) and not toks[i + 1].startswith("--") else ""
    return val


def op_key_from_flags(kind, d):
    """The grid key of bench flags (a testlist line or a bench CSV row: the same names)."""
    try:
        r = d["routine"]
        if kind == "sampling":
            return (r, str(int(d["batch_size"])), str(int(d["vocab_size"])))
        if kind == "rowops":
            if "rope" in r:
                return (r, str(int(d["batch_size"]) * int(d["s_qo"])),
                        str(int(d["num_qo_heads"]) * int(d["head_dim_qk"])))
            return (r, str(int(d["batch_size"])), str(int(d["hidden_size"])))
        # GEMM: the op backend of --backends (a testlist line) or the CSV's backend column,
        # without a device prefix (cpu:cudnn in the dry run); mm's batch is 1.
        be = d.get("backends", d.get("backend", "")).split(":")[-1]
        batch = "1" if r.startswith("mm_") else str(int(d["batch_size"]))
        return (r, be, batch, str(int(d["m"])), str(int(d["n"])), str(int(d["k"])))
    except (KeyError, ValueError):
        return None


def _key_text(v):
    """A key column's text: integers normalized ("0016" and "16.0" are 16), names as they are."""
    try:
        return str(int(float(v)))
    except (TypeError, ValueError):
        return str(v)


def op_key(kind, r):
    return (r["routine"],) + tuple(_key_text(r[c]) for c in OP_GRIDS[kind]["keys"])


def op_shape_text(kind, r):
    return ", ".join("%s %s" % (c, r[c]) for c in OP_GRIDS[kind]["keys"])


def op_plan_rows(kind, mode):
    g = OP_GRIDS[kind]["modes"][mode]
    rows = []
    if kind == "sampling":
        for rt in g["routines"]:
            for b in g["batches"]:
                for v in g["vocabs"]:
                    extra = {"top_k_top_p_sampling_from_probs": " --top_k %d --top_p %g",
                             "top_p_sampling_from_probs": " --top_p %g",
                             "top_k_sampling_from_probs": " --top_k %d"}[rt]
                    args = {"top_k_top_p_sampling_from_probs": (g["top_k"], g["top_p"]),
                            "top_p_sampling_from_probs": (g["top_p"],),
                            "top_k_sampling_from_probs": (g["top_k"],)}[rt]
                    rows.append(dict(routine=rt, batch=b, vocab=v,
                                     flags="--routine %s --batch_size %d --vocab_size %d" % (rt, b, v)
                                     + extra % args,
                                     bytes=4 * b * v + 4 * b, flops=0,
                                     ref=(b, v) == g["refcheck"]))
    elif kind == "rowops":
        shapes = [(rt, t, h) for rt in g["routines"] for h in g["hiddens"] for t in g["tokens"]]
        for rt, t, h in shapes + list(g["extra"]):
            n = t * h
            if rt == "rmsnorm":
                flags = "--batch_size %d --hidden_size %d --input_dtype bfloat16" % (t, h)
                nbytes, flops = 2 * (2 * n) + 2 * h, 4 * n
            elif rt == "fused_add_rmsnorm":
                flags = "--batch_size %d --hidden_size %d --input_dtype bfloat16" % (t, h)
                nbytes, flops = 4 * (2 * n) + 2 * h, 5 * n
            elif rt == "silu_and_mul":
                flags = "--batch_size %d --hidden_size %d --input_dtype bfloat16" % (t, h)
                nbytes, flops = 1.5 * (2 * 2 * n), n
            else:  # apply_rope_pos_ids: q [t, h/D, D], k [t, kv_heads, D]
                hq, hk, d = h // g["head_dim"], g["kv_heads"], g["head_dim"]
                flags = ("--batch_size 1 --s_qo %d --num_qo_heads %d --num_kv_heads %d "
                         "--head_dim_qk %d --head_dim_vo %d --q_dtype bfloat16" % (t, hq, hk, d, d))
                elems = t * (hq + hk) * d
                nbytes, flops = 2 * (2 * elems) + 4 * t, 3 * elems
            rows.append(dict(routine=rt, tokens=t, hidden=h, flags="--routine %s %s" % (rt, flags),
                             bytes=int(nbytes), flops=flops, ref=(t, h) == g["refcheck"]))
    else:
        dev = "cpu:" if mode == "dry" else ""  # the dry run: the CPU reference under each name
        shapes = [(m, g["nk"], g["nk"]) for m in g["ms"]] + [(g["cube"],) * 3]
        for rt, backends, batch in g["dense"]:
            for m, n, k in shapes:
                for be in backends:
                    nbytes, flops = gemm_counts(rt, batch, m, n, k)
                    flags = "--routine %s --backends %s%s %s--m %d --n %d --k %d" % (
                        rt, dev, be, "" if rt.startswith("mm_") else "--batch_size %d " % batch,
                        m, n, k)
                    rows.append(dict(routine=rt, backend=be, batch=batch, m=m, n=n, k=k,
                                     flags=flags, bytes=nbytes, flops=flops,
                                     ref=m == g["refcheck_m"] and n == g["nk"]))
        n, k = g["grouped_nk"]
        for rt, backends in g["grouped"]:
            for groups in g["groups"]:
                for m in g["tokens"]:
                    for be in backends:
                        nbytes, flops = gemm_counts(rt, groups, m, n, k)
                        rows.append(dict(
                            routine=rt, backend=be, batch=groups, m=m, n=n, k=k,
                            flags="--routine %s --backends %s%s --batch_size %d --m %d --n %d "
                                  "--k %d" % (rt, dev, be, groups, m, n, k),
                            bytes=nbytes, flops=flops,
                            ref=groups == g["refcheck_groups"] and m == min(g["tokens"])))
    head = tuple(str(x) for x in g["headline"])
    for r in rows:
        r["role"] = ("headline" if (r["routine"],) + tuple(str(r[c]) for c in OP_GRIDS[kind]["keys"])
                     == head else "refcheck" if r.pop("ref") else "")
        r.pop("ref", None)
    return rows


def op_plan(kind, mode, mem_bytes, plan_csv, testlist):
    rows = op_plan_rows(kind, mode)
    mem = float(mem_bytes)
    for r in rows:
        r["status"] = ""
        if mem > 0 and r["bytes"] > MEM_FRACTION * mem:
            r["status"] = "skipped: inputs+outputs %s > %d %% of the device's %s" % (
                human_bytes(r["bytes"]), 100 * MEM_FRACTION, human_bytes(mem))
    order = {"headline": 0, "refcheck": 1, "": 2}
    rows.sort(key=lambda r: order[r["role"]])  # stable: grid order within a role
    cols = ["routine"] + OP_GRIDS[kind]["keys"] + ["flags", "bytes", "flops", "role", "status"]
    write_csv(plan_csv, cols, rows)
    n = 0
    with open(testlist, "w") as f:
        for r in rows:
            if r["status"]:
                continue
            n += 1
            f.write(r["flags"] + (" --refcheck --allow_output_mismatch" if r["role"] == "refcheck"
                                  else "") + "\n")
    routines = sorted({r["routine"] for r in rows}, key=[r["routine"] for r in rows].index)
    print("%s (%s): %d rows (%s), %d to run, %d skipped" % (
        OP_GRIDS[kind]["title"].lower(), mode, len(rows), ", ".join(routines), n, len(rows) - n))
    return 0


def _metric_text(kind):
    return "TFLOP/s" if OP_GRIDS[kind]["metric"] == "tflops" else "TB/s"


def op_grid(kind, plan_csv, bench_csv, log, out_csv, phase_md):
    spec = OP_GRIDS[kind]
    plan = read_csv(plan_csv)
    timed = {}
    for r in read_csv(bench_csv):
        k = op_key_from_flags(kind, r)
        if k is not None:
            timed[k] = r
    _, err = parse_testlist_log(log, lambda text: op_key_from_flags(kind, flag_dict(text)))
    cols = ["routine"] + spec["keys"] + OP_COLUMNS
    out, count, bad = [], {}, []
    for p in plan:
        k = op_key(kind, p)
        row = {c: p[c] for c in ["routine"] + spec["keys"]}
        row.update(median_ms="", metric="", pct_peak="")
        t = timed.get(k)
        if p["status"]:
            row["status"] = p["status"]
        elif t is not None:
            ms = float(t["median_time"])
            val = float(t["tflops"] if spec["metric"] == "tflops" else t["tb_per_sec"])
            peak, _ = op_peak(p["routine"])
            row["median_ms"], row["metric"] = "%.6f" % ms, "%.4g" % val
            row["pct_peak"] = "%.1f" % (100.0 * val / peak)
            ref = t.get("refcheck", "")
            row["status"] = {"": "ok", "pass": "ok, refcheck pass"}.get(ref, "refcheck " + ref)
            # The peer's TB/s and TFLOP/s use the plan's counts: they must be bench's.
            for c in ("bytes", "flops"):
                mine, theirs = _num(p.get(c)), _num(t.get(c))
                if mine is not None and theirs is not None and abs(mine - theirs) > 1e-3 * max(mine, 1):
                    row["status"] = "count mismatch: bench %s %s, the plan %s" % (c, t[c], p[c])
        else:
            row["status"] = missing_status(k, err)
        tally(row, count, bad)
        out.append(row)
    write_csv(out_csv, cols, out)
    unit = _metric_text(kind)
    counts = ", ".join("%d %s" % (v, k) for k, v in sorted(count.items())) or "none"
    with open(phase_md, "a") as f:
        f.write("\n%s: %d rows: %s. `%s`; %s from bench's bytes/FLOPs over the median, %% of the "
                "H100 SXM's %s.\n\n" % (spec["title"], len(out), counts, os.path.basename(out_csv),
                                        unit, "3.35 TB/s" if unit == "TB/s"
                                        else "dense 989.4 (bf16) / 1978.9 (fp8) TFLOP/s"))
        f.write("| routine | %s | median ms | %s | %% of peak | status |\n|---|%s---|---|---|---|\n"
                % (" | ".join(spec["keys"]), unit, "---|" * len(spec["keys"])))
        for r in out:
            f.write("| %s | %s | %s | %s | %s | %s |\n" % (
                r["routine"], " | ".join(r[c] for c in spec["keys"]), r["median_ms"] or "-",
                r["metric"] or "-", r["pct_peak"] or "-", r["status"].replace("|", "/")))
        f.write("\n")
    print("%s: %d rows: %s" % (spec["title"].lower(), len(out), counts))
    return 1 if (bad or not any(r["status"].startswith("ok") for r in out)) else 0


def fake_upstream_op(kind, ours_csv, out_csv):
    """Dry run: the peer's timings made up from ours (x0.8 to x1.2), for the join."""
    spec = OP_GRIDS[kind]
    cols = ["routine"] + spec["keys"] + OP_COLUMNS
    rows, shape_of = [], {}  # the GEMM peer (torch) has no backends: one time per shape
    for i, r in enumerate(read_csv(ours_csv)):
        row = {c: r[c] for c in ["routine"] + spec["keys"]}
        row.update(median_ms="", metric="", pct_peak="", status=r["status"])
        if r["median_ms"]:
            shape = tuple(v for c, v in row.items() if c != "backend")
            f = 0.8 + 0.1 * (i % 5)
            ms, metric, pct = (float(r["median_ms"]) * f, float(r["metric"]) / f,
                               float(r["pct_peak"]) / f)
            if "backend" in spec["keys"]:
                f, ms, metric, pct = shape_of.setdefault(shape, (f, ms, metric, pct))
            row["median_ms"], row["metric"], row["pct_peak"] = "%.6f" % ms, "%.4g" % metric, "%.1f" % pct
            row["status"] = "fake (dry run: ours x %.1f)" % f
        rows.append(row)
    write_csv(out_csv, cols, rows)
    return 0


def compare_op(kind, plan_csv, ours_csv, up_csv, out_md, out_csv):
    spec = OP_GRIDS[kind]
    peer = "torch" if spec["peer"] == "torch" else "upstream"
    plan = read_csv(plan_csv)
    ours = {op_key(kind, r): r for r in read_csv(ours_csv)}
    up = {op_key(kind, r): r for r in read_csv(up_csv)}
    fake = any(r["status"].startswith("fake") for r in up.values())
    table = []
    for p in plan:
        k = op_key(kind, p)
        o, u = ours.get(k, {}), up.get(k, {})
        om, um = o.get("median_ms", ""), u.get("median_ms", "")
        table.append(dict(key=k, role=p["role"], ours_ms=om, ours_metric=o.get("metric", ""),
                          ours_pct=o.get("pct_peak", ""), peer_ms=um,
                          peer_metric=u.get("metric", ""), peer_pct=u.get("pct_peak", ""),
                          ratio=float(um) / float(om) if om and um and float(om) > 0 else None,
                          ours_status=o.get("status", "not run"),
                          peer_status=u.get("status", "not run")))

    def fmt_key(k):
        return "%s %s" % (k[0], ", ".join("%s %s" % kv for kv in zip(spec["keys"], k[1:])))

    unit = _metric_text(kind)
    lines = []
    head = next((t for t in table if t["role"] == "headline"), None)
    if head is None:
        lines.append("headline: not in the plan")
    elif head["ratio"] is None:
        lines.append("headline (%s): no ratio (ours: %s; %s: %s)" % (
            fmt_key(head["key"]), head["ours_status"], peer, head["peer_status"]))
    else:
        lines.append("headline (%s): %s %s ms / ours %s ms = %.3fx; ours %s %s (%s %% of peak)"
                     % (fmt_key(head["key"]), peer, head["peer_ms"], head["ours_ms"],
                        head["ratio"], head["ours_metric"], unit, head["ours_pct"]))
    # One line per routine (per routine and backend for the GEMMs: the key's second column).
    nsplit = 2 if "backend" in spec["keys"] else 1
    for grp in dict.fromkeys(t["key"][:nsplit] for t in table):
        rt = " ".join(grp) if nsplit == 1 else "%s backend %s" % grp
        rs = [t for t in table if t["key"][:nsplit] == grp and t["ratio"] is not None]
        if not rs:
            lines.append("%s: no row has both timings" % rt)
            continue
        worst = min(rs, key=lambda t: t["ratio"])
        below = [t for t in rs if t["ratio"] < 1.0]
        pcts = [_num(t["ours_pct"]) for t in rs if _num(t["ours_pct"]) is not None]
        lines.append("%s: minimum ratio %.3fx (%s); %d of %d rows below 1.0x; ours up to %s %% of "
                     "peak" % (rt, worst["ratio"], fmt_key(worst["key"])[len(grp[0]) + 1:],
                               len(below), len(rs), "%.1f" % max(pcts) if pcts else "-"))
    goals = []
    if kind == "gemm":
        for t in table:
            t.update(zip(["routine"] + spec["keys"], t["key"]))
            g = gemm_goal(t["routine"], t["backend"], t["batch"])
            t["goal"] = "" if g is None or t["ratio"] is None else (
                "pass (>= %.2fx)" % g[0] if t["ratio"] >= g[0] else "FAIL (< %.2fx)" % g[0])
        goals = gemm_goals(table)
        lines.extend("goal: " + gemm_goal_text(g) for g in goals)
    if fake:
        lines.insert(0, "DRY RUN: the %s timings are made up (ours x 0.8 to 1.2)" % peer)
    with open(out_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["routine"] + spec["keys"] + [
            "role", "ours_ms", "ours_" + spec["metric"], "ours_pct_peak", peer + "_ms",
            peer + "_" + spec["metric"], peer + "_pct_peak", "ratio_%s_over_ours" % peer,
            "ours_status", peer + "_status"] + (["goal"] if kind == "gemm" else []))
        for t in table:
            w.writerow(list(t["key"]) + [t["role"], t["ours_ms"], t["ours_metric"], t["ours_pct"],
                                         t["peer_ms"], t["peer_metric"], t["peer_pct"],
                                         "" if t["ratio"] is None else "%.4f" % t["ratio"],
                                         t["ours_status"], t["peer_status"]]
                       + ([t["goal"]] if kind == "gemm" else []))
    name = os.path.basename(out_csv)
    with open(out_md, "w") as f:
        f.write("## %s: flashinfer-cpp against %s\n\n" % (
            spec["title"], "torch.matmul / torch._scaled_mm (cuBLAS)" if peer == "torch"
            else "upstream flashinfer-python"))
        for l in lines:
            f.write("- %s\n" % l)
        f.write("\nRatio = %s ms / ours ms (above 1: ours is faster; below 1.0 in bold); %% of "
                "peak against the H100 SXM datasheet; the headline row first; `%s`.\n\n"
                "| routine | %s | ours ms | ours %s | ours %% | %s ms | %s %s | %s %% | ratio "
                "| ours | %s |\n|---|%s---|---|---|---|---|---|---|---|---|\n" % (
                    peer, name, " | ".join(spec["keys"]), unit, peer, peer, unit, peer, peer,
                    "---|" * len(spec["keys"])))
        for t in table:
            f.write("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n" % (
                t["key"][0], " | ".join(t["key"][1:]), t["ours_ms"] or "-", t["ours_metric"] or "-",
                t["ours_pct"] or "-", t["peer_ms"] or "-", t["peer_metric"] or "-",
                t["peer_pct"] or "-", "-" if t["ratio"] is None else
                "**%.3f**" % t["ratio"] if t["ratio"] < 1.0 else "%.3f" % t["ratio"],
                t["ours_status"].replace("|", "/")[:60], t["peer_status"].replace("|", "/")[:60]))
        f.write("\n")
        if kind == "gemm":
            f.write(gemm_side_by_side(table))
    for l in lines:
        print("%s vs %s: %s" % (kind, peer, l))
    return 0


def gemm_side_by_side(table):
    """The GEMM join as one line per shape: torch, then each of our backends beside it."""
    shapes = {}
    for t in table:
        shapes.setdefault((t["routine"], t["batch"], t["m"], t["n"], t["k"]), []).append(t)
    out = ["Per shape, our backends beside torch (ratio = torch ms / ours ms; a goal's rows "
           "marked pass or FAIL):\n",
           "| routine | shape | torch ms | torch TFLOP/s | ours by backend: ms, TFLOP/s, ratio |",
           "|---|---|---|---|---|"]
    for (rt, batch, m, n, k), ts in shapes.items():
        peer = next((t for t in ts if t["peer_ms"]), ts[0])
        cells = []
        for t in ts:
            name = "%s (%s)" % (t["backend"], GEMM_BACKEND_TEXT.get((rt, t["backend"]), "?"))
            if t["ratio"] is None:
                cells.append("%s: %s" % (name, t["ours_status"].replace("|", "/")[:40]))
            else:
                cells.append("%s: %s ms, %s, %.3fx%s" % (
                    name, t["ours_ms"], t["ours_metric"], t["ratio"],
                    " **%s**" % t["goal"] if t.get("goal") else ""))
        out.append("| %s | %s | %s | %s | %s |" % (
            rt, gemm_shape_text(dict(routine=rt, batch=batch, m=m, n=n, k=k)),
            peer["peer_ms"] or peer["peer_status"].replace("|", "/")[:40],
            peer["peer_metric"] or "-", "; ".join(cells)))
    return "\n".join(out) + "\n\n"


def assemble(outdir):
    parts = sorted(glob.glob(os.path.join(outdir, "phase*.md")))
    with open(os.path.join(outdir, "gpu-report.md"), "w") as f:
        head = os.path.join(outdir, "header.md")
        if os.path.exists(head):
            f.write(open(head).read())
        for p in parts:
            f.write(open(p).read())
            f.write("\n")
        for name in ("decode_compare.md", "prefill_compare.md", "sampling_compare.md",
                     "rowops_compare.md", "gemm_compare.md"):
            c = os.path.join(outdir, name)
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
    if cmd == "ctest" and len(argv) == 6:
        return ctest(*argv[2:6])
    if cmd == "subset" and len(argv) == 7:
        return subset(*argv[2:7])
    if cmd == "summary" and len(argv) == 3:
        return summary(argv[2])
    if cmd == "decode-plan" and len(argv) == 6 and argv[2] in DECODE_GRIDS:
        return decode_plan(*argv[2:6])
    if cmd == "decode-grid" and len(argv) == 7:
        return decode_grid(*argv[2:7])
    if cmd == "fake-upstream" and len(argv) == 4:
        return fake_upstream(*argv[2:4])
    if cmd == "compare" and len(argv) == 7:
        return compare(*argv[2:7])
    if cmd == "prefill-plan" and len(argv) == 6 and argv[2] in PREFILL_GRIDS:
        return prefill_plan(*argv[2:6])
    if cmd == "prefill-grid" and len(argv) == 7:
        return prefill_grid(*argv[2:7])
    if cmd == "fake-upstream-prefill" and len(argv) == 4:
        return fake_upstream_prefill(*argv[2:4])
    if cmd == "compare-prefill" and len(argv) == 7:
        return compare_prefill(*argv[2:7])
    if cmd == "op-plan" and len(argv) == 7 and argv[2] in OP_GRIDS and argv[3] in ("full", "quick", "dry"):
        return op_plan(*argv[2:7])
    if cmd == "op-grid" and len(argv) == 8 and argv[2] in OP_GRIDS:
        return op_grid(*argv[2:8])
    if cmd == "fake-upstream-op" and len(argv) == 5 and argv[2] in OP_GRIDS:
        return fake_upstream_op(*argv[2:5])
    if cmd == "compare-op" and len(argv) == 8 and argv[2] in OP_GRIDS:
        return compare_op(*argv[2:8])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
