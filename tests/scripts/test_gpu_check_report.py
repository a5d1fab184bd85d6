#!/usr/bin/env python3
"""scripts/gpu_check_report.py's whole-suite parser (`ctest`) and one-page summary (`summary`) on
canned input: a ctest log in the form ctest 3.25 writes (a pass, a gtest failure, a crash with the
test binaries' stack printer, a CUDA case's skip, an allowed skip, a disabled case, a timeout), its
JUnit file, and the CSVs the other phases leave. Standard library only; run by ctest."""
import csv
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "gpu_check_report.py")

CTEST_LOG = """Test project /x/build
    Start 1: Norm.Passes
    Start 2: Op/BackendOpsCuda.MatchesCpu/mm_gguf
1/8 Test #1: Norm.Passes .........................   Passed    0.01 sec
    Start 3: Op/BackendOpsCuda.MatchesCpu/mxfp8_grouped_quantize
2/8 Test #2: Op/BackendOpsCuda.MatchesCpu/mm_gguf ..........***Failed    0.41 sec
Running main() from ./googletest/src/gtest_main.cc
Note: Google Test filter = Op/BackendOpsCuda.MatchesCpu/mm_gguf
[==========] Running 1 test from 1 test suite.
[ RUN      ] Op/BackendOpsCuda.MatchesCpu/mm_gguf
/x/tests/ops/test_backend_ops.cpp:835: Failure
Value of: diff.empty()
cuda:0 vs cpu-scalar: out[0,0] = 4272.35 vs fp64 36.43
[  FAILED  ] Op/BackendOpsCuda.MatchesCpu/mm_gguf (410 ms)

    Start 4: GemmCuda.SkipsHere
3/8 Test #3: Op/BackendOpsCuda.MatchesCpu/mxfp8_grouped_quantize ...***Exception: SegFault  0.30 sec
Running main() from ./googletest/src/gtest_main.cc
[ RUN      ] Op/BackendOpsCuda.MatchesCpu/mxfp8_grouped_quantize

*** fatal signal SIGSEGV (segmentation fault: invalid memory reference) at address 0x10, pid 7 ***
stack (innermost first; the first frames are the handler's own and the signal frame):
  #0 0x55d0c2a3b4c5 flashinfer::test::(anonymous namespace)::print_stack(unsigned long) at /x/tests/util/crash_handler.cpp:239 (the test binary+0x1b4c4)
  #1 0x55d0c2a3b5c5 flashinfer::test::(anonymous namespace)::on_fatal_signal(int, siginfo_t*, void*) (the test binary+0x1b5c4)
  #2 0x7f37fc05a050 __GI___sigaction (libc.so.6+0x3c04f)
  #3 0x7f37fd000000 flashinfer::api::mxfp8_grouped_quantize_impl(flashinfer::Tensor const&) (libflashinfer.so+0x123456)
  #4 0x7f37fd000100 flashinfer::mxfp8_grouped_quantize(flashinfer::Tensor const&) (libflashinfer.so+0x123556)
*** end of stack; re-raising the signal
    Start 5: Chat.NeedsAModel
4/8 Test #4: GemmCuda.SkipsHere ......................***Skipped   0.01 sec
    Start 6: Bench.CudaWithoutAGpu
5/8 Test #5: Chat.NeedsAModel ......................***Skipped   0.01 sec
    Start 7: X.DISABLED_Off
6/8 Test #6: Bench.CudaWithoutAGpu ......................***Skipped   0.01 sec
7/8 Test #7: X.Off ............................***Not Run (Disabled)   0.00 sec
    Start 8: Slow.Case
8/8 Test #8: Slow.Case ..........................***Timeout 300.02 sec

63% tests passed, 3 tests failed out of 8
"""

JUNIT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="(empty)" tests="8" failures="3" disabled="1" skipped="3">
  <testcase name="Norm.Passes" classname="Norm.Passes" status="run"><system-out>ok</system-out></testcase>
  <testcase name="GemmCuda.SkipsHere" classname="GemmCuda.SkipsHere" status="notrun">
    <skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>
    <system-out>[ RUN      ] GemmCuda.SkipsHere
/x/tests/ops/test_gemm.cpp:10: Skipped
no CUDA device visible
[  SKIPPED ] GemmCuda.SkipsHere (0 ms)
</system-out>
  </testcase>
  <testcase name="Chat.NeedsAModel" classname="Chat.NeedsAModel" status="notrun">
    <skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>
    <system-out>/x/tests/examples/test_chat.cpp:5: Skipped
no model at /x/models/smollm2.gguf (scripts/bootstrap fetches it)
</system-out>
  </testcase>
  <testcase name="Bench.CudaWithoutAGpu" classname="Bench.CudaWithoutAGpu" status="notrun">
    <skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>
    <system-out>/x/tests/cli/test_bench.cpp:5: Skipped
a GPU is present: this checks the no-GPU path
</system-out>
  </testcase>
</testsuite>
"""

HEADER = """# gpu-check report

- date: 2026-11-25 10:00 UTC
- device: NVIDIA H100 80GB HBM3; driver, compute capability, memory: 580.1, 9.0, 81559 MiB
- nvcc: release 13.0
- commit: abc1234
- build dir: /x/build; mode: GPU
"""

BENCH_ROWS = [
    ["routine", "backend", "median_ms", "tflops", "tb_per_sec", "frac_peak_bandwidth",
     "frac_peak_flops", "refcheck", "repro_command"],
    ["mm_bf16", "cuda", "0.3100", "44.4", "0.1", "", "0.045", "pass",
     "flashinfer bench --routine mm_bf16 --m 128 --n 4096 --k 4096 --backends cuda"],
    ["rmsnorm", "cuda", "0.0147", "0.0", "0.143", "0.043", "", "pass",
     "flashinfer bench --routine rmsnorm --batch_size 128 --hidden_size 4096 --backends cuda"],
    ["mxfp8_quantize", "cuda", "0.0200", "0.0", "0.8", "0.24", "", "mismatch",
     "flashinfer bench --routine mxfp8_quantize --m 1024 --k 4096 --backends cuda"],
    ["BatchMLAPagedAttentionWrapper.run", "cuda", "0.5000", "300.0", "1.1", "", "0.3", "pass",
     "flashinfer bench --routine BatchMLAPagedAttentionWrapper.run --backends cuda --batch_size 512"
     " --s_qo 1 --s_kv 2048 --num_qo_heads 64 --num_kv_heads 8 --head_dim_qk 64 --head_dim_vo 64"
     " --page_size 1 --head_dim_ckv 512 --head_dim_kpe 0 --q_dtype bfloat16 --kv_dtype bfloat16"],
]
GEMM_TORCH = [
    ["op", "torch_call", "m", "n", "k", "batch", "device", "median_ms", "tflops", "note"],
    ["mm_bf16", "torch.matmul", "128", "4096", "4096", "1", "cuda", "0.1330", "103.6", ""],
]
UPSTREAM = [
    ["case", "shape", "median_ms", "tflops", "tb_per_sec", "status"],
    ["rmsnorm", "rows128 hidden4096", "0.0186", "", "0.11", "ok"],
]
SANITIZER = [
    ["tool", "binary", "result", "errors"],
    ["memcheck", "test_decode", "pass", "0"],
    ["memcheck", "test_float_formats", "no CUDA call: nothing to check", "0"],
    ["initcheck", "test_backend_ops", "errors", "74"],
]


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)


def read(path):
    with open(path) as f:
        return f.read()


def run(*args):
    return subprocess.run([sys.executable, SCRIPT] + list(args), capture_output=True, text=True)


class GpuCheckReport(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name
        self.log = os.path.join(self.d, "ctest.log")
        self.junit = os.path.join(self.d, "ctest.xml")
        with open(self.log, "w") as f:
            f.write(CTEST_LOG)
        with open(self.junit, "w") as f:
            f.write(JUNIT)

    def tearDown(self):
        self.tmp.cleanup()

    def rows(self):
        with open(os.path.join(self.d, "tests_phase2.csv"), newline="") as f:
            return {r["test"]: r for r in csv.DictReader(f)}

    def test_ctest_rows_and_first_lines(self):
        md = os.path.join(self.d, "phase2.md")
        r = run("ctest", self.log, self.junit, os.path.join(self.d, "tests_phase2.csv"), md)
        self.assertEqual(r.returncode, 1, r.stderr)  # failures and a CUDA case's skip
        rows = self.rows()
        self.assertEqual(len(rows), 8)
        self.assertEqual(rows["Norm.Passes"]["status"], "passed")
        gguf = rows["Op/BackendOpsCuda.MatchesCpu/mm_gguf"]
        self.assertEqual(gguf["status"], "failed")
        self.assertEqual(gguf["message"],
                         "Value of: diff.empty() / cuda:0 vs cpu-scalar: out[0,0] = 4272.35 vs fp64 36.43")
        crash = rows["Op/BackendOpsCuda.MatchesCpu/mxfp8_grouped_quantize"]
        self.assertEqual(crash["status"], "failed")
        # The crashing frame, past the handler's own frames and the signal frame.
        self.assertEqual(crash["message"], "Exception: SegFault: SIGSEGV in "
                         "flashinfer::api::mxfp8_grouped_quantize_impl(flashinfer::Tensor const&)")
        self.assertEqual(rows["GemmCuda.SkipsHere"]["status"], "skipped")
        self.assertEqual(rows["GemmCuda.SkipsHere"]["message"], "no CUDA device visible")
        self.assertEqual(rows["Chat.NeedsAModel"]["status"], "skipped-ok")
        self.assertEqual(rows["Bench.CudaWithoutAGpu"]["status"], "skipped-ok")
        self.assertEqual(rows["X.Off"]["status"], "disabled")
        self.assertEqual(rows["Slow.Case"]["status"], "failed")
        self.assertEqual(rows["Slow.Case"]["message"], "Timeout")
        text = read(md)
        self.assertIn("8 cases: 1 disabled, 3 failed, 1 passed, 1 skipped, 2 skipped-ok", text)
        self.assertIn("| `GemmCuda.SkipsHere` | **skipped** | no CUDA device visible |", text)
        self.assertNotIn("Chat.NeedsAModel", text)

    def test_subset_for_phase_3(self):
        run("ctest", self.log, self.junit, os.path.join(self.d, "tests_phase2.csv"),
            os.path.join(self.d, "phase2.md"))
        out = os.path.join(self.d, "tests_phase3.csv")
        md = os.path.join(self.d, "phase3.md")
        r = run("subset", os.path.join(self.d, "tests_phase2.csv"), out, md, "BackendOpsCuda",
                r"BackendOpsCuda(Jit)?\.")
        self.assertEqual(r.returncode, 1, r.stderr)
        with open(out, newline="") as f:
            names = [row["test"] for row in csv.DictReader(f)]
        self.assertEqual(names, ["Op/BackendOpsCuda.MatchesCpu/mm_gguf",
                                 "Op/BackendOpsCuda.MatchesCpu/mxfp8_grouped_quantize"])
        self.assertIn("BackendOpsCuda (from `tests_phase2.csv`): 2 test cases: 2 failed.", read(md))

    def test_ctest_without_junit_uses_the_log(self):
        r = run("ctest", self.log, os.path.join(self.d, "absent.xml"),
                os.path.join(self.d, "tests_phase2.csv"), os.path.join(self.d, "phase2.md"))
        self.assertEqual(r.returncode, 1, r.stderr)
        rows = self.rows()
        self.assertEqual(len(rows), 8)
        self.assertIn("4272.35 vs fp64 36.43", rows["Op/BackendOpsCuda.MatchesCpu/mm_gguf"]["message"])

    def test_clean_suite_passes(self):
        with open(self.log, "w") as f:
            f.write("1/1 Test #1: Norm.Passes .........   Passed    0.01 sec\n")
        r = run("ctest", self.log, "", os.path.join(self.d, "tests_phase2.csv"),
                os.path.join(self.d, "phase2.md"))
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_summary_page(self):
        run("ctest", self.log, self.junit, os.path.join(self.d, "tests_phase2.csv"),
            os.path.join(self.d, "phase2.md"))
        with open(os.path.join(self.d, "phase2.md"), "a") as f:
            f.write("\nPhase 2 FAILED in 301 s.\n")
        with open(os.path.join(self.d, "phase1.md"), "w") as f:
            f.write("## Phase 1: build\n\nPhase 1 passed in 194 s.\n")
        with open(os.path.join(self.d, "header.md"), "w") as f:
            f.write(HEADER)
        write_csv(os.path.join(self.d, "bench_rows.csv"), BENCH_ROWS)
        write_csv(os.path.join(self.d, "gemm_torch.csv"), GEMM_TORCH)
        write_csv(os.path.join(self.d, "upstream.csv"), UPSTREAM)
        write_csv(os.path.join(self.d, "sanitizer.csv"), SANITIZER)
        r = run("summary", self.d)
        self.assertEqual(r.returncode, 0, r.stderr)
        page = read(os.path.join(self.d, "summary.md"))
        self.assertIn("# What the GPU showed: 2026-11-25, project at abc1234", page)
        self.assertIn("NVIDIA H100 80GB HBM3", page)
        self.assertIn("Phases: 1 passed in 194 s; 2 FAILED in 301 s (495 s in all).", page)
        self.assertIn("8 cases: 1 passed, 3 skipped, 1 disabled, 3 failed", page)
        self.assertIn("`BackendOpsCuda`: **2 op cases, 0 pass, 2 fail**", page)
        self.assertIn("1 other: `GemmCuda.SkipsHere`", page)
        self.assertIn("- `Op/BackendOpsCuda.MatchesCpu/mm_gguf`: Value of: diff.empty() / cuda:0 vs "
                      "cpu-scalar: out[0,0] = 4272.35 vs fp64 36.43", page)
        self.assertIn("SIGSEGV in flashinfer::api::mxfp8_grouped_quantize_impl", page)
        self.assertIn("memcheck: 1 binaries clean, 1 without a CUDA call (nothing to check: "
                      "test_float_formats)", page)
        self.assertIn("initcheck: 0 binaries clean, **test_backend_ops errors (74 errors)**", page)
        # The bench table: ours, the peer on the same shape, the ratio peer ms / ours ms.
        self.assertIn("| mm_bf16 | m 128, n 4096, k 4096 | 0.3100 ms, 44.4 TFLOP/s, 0.1 TB/s "
                      "(4.5 % of peak FLOP/s) | torch.matmul: 0.1330 ms, 103.6 TFLOP/s | 0.43x "
                      "(peer 2.3x faster) |", page)
        self.assertIn("| rmsnorm | batch 128, hidden 4096 | 0.0147 ms, 0.143 TB/s (4.3 % of peak "
                      "bandwidth) | upstream (rows128 hidden4096): 0.0186 ms | 1.27x (ours faster) |",
                      page)
        self.assertIn("refcheck **mismatch**", page)
        # MLA rows name their widths where they are not DeepSeek's (a NoPE model's: kpe 0).
        self.assertIn("| BatchMLAPagedAttentionWrapper.run | batch 512, qo 1, kv 2048, heads 64, "
                      "page 1, kpe 0, KV bfloat16 | 0.5000 ms, 300.0 TFLOP/s", page)
        self.assertLess(len(page.splitlines()), 80)  # one page

    def test_prefill_grid_and_join_with_both_upstream_backends(self):
        d = self.d
        plan, tl = os.path.join(d, "prefill_grid_plan.csv"), os.path.join(d, "prefill.testlist")
        # A made-up 768 KiB device: the two largest tiny rows are skipped.
        r = run("prefill-plan", "dry", "786432", plan, tl)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("34 rows, 32 to run, 2 skipped", r.stdout)
        with open(plan, newline="") as f:
            rows = list(csv.DictReader(f))
        self.assertEqual([rows[0]["role"], rows[1]["role"], rows[2]["role"]],
                         ["headline", "chunked", "multi_item"])
        self.assertEqual([rows[0][k] for k in ("batch", "qo_len", "kv_len", "head_dim", "causal",
                                               "items")],
                         ["1", "48", "48", "64", "True", ""])
        # Multi-item scoring: 6 prefix tokens, 4 items of 3 after a delimiter each, a last one.
        self.assertEqual([rows[2][k] for k in ("batch", "qo_len", "kv_len", "causal", "items")],
                         ["2", "23", "23", "True", "6/3"])
        lines = read(tl).splitlines()
        self.assertEqual(len(lines), 32)
        self.assertIn("--batch_size 3 --s_qo 8 --s_kv 64 ", lines[1])
        self.assertTrue(lines[1].endswith("--causal"))
        self.assertIn("--batch_size 2 --s_qo 23 --s_kv 23 ", lines[2])
        self.assertTrue(lines[2].endswith("--causal --prefix_len 6 --item_len 3"))
        # The refcheck rows (batch 1 x qo = kv 16), and only they, carry --refcheck.
        self.assertEqual(sum("--refcheck" in l for l in lines), 8)
        self.assertTrue(all("--s_qo 16 --s_kv 16" in l for l in lines if "--refcheck" in l))
        # The bench run: the headline timed on CUDA with its [INFO] tensor-peak line, the chunked
        # row failing, the multi-item row timed (its CSV row told from a plain one of the same
        # shape by --prefix_len / --item_len), the rest not reached.
        head = [r for r in rows if r["role"] == "headline"][0]
        mi = rows[2]
        flags = lines[0]
        log = os.path.join(d, "prefill.log")
        with open(log, "w") as f:
            f.write("[TESTLIST] line 1: %s\n[PERF] cuda    :: median time 2.0000 ms\n"
                    "[INFO] cuda    :: 0.305 of the device's dense 16-bit tensor peak (30.5 %% of "
                    "989.4 TFLOPs/sec at the driver's peak clock)\n[TESTLIST] line 2: %s\n"
                    "[ERROR] testlist line 2: BatchPrefillWithPagedKVCacheWrapper.run: boom\n"
                    "[TESTLIST] line 3: %s\n[PERF] cuda    :: median time 0.5000 ms\n"
                    "[INFO] cuda    :: 0.012 of the device's dense 16-bit tensor peak (1.2 %% of "
                    "989.4 TFLOPs/sec at the driver's peak clock)\n"
                    % (flags, lines[1], lines[2]))
        bench = os.path.join(d, "prefill_raw.csv")
        cols = ["routine", "median_time", "tflops", "batch_size", "s_qo", "s_kv", "num_qo_heads",
                "num_kv_heads", "head_dim_qk", "causal", "prefix_len", "item_len", "refcheck"]
        write_csv(bench, [cols,
                          ["BatchPrefillWithPagedKVCacheWrapper.run", "2.000000", "301.500000",
                           head["batch"], head["qo_len"], head["kv_len"], head["qo_heads"],
                           head["kv_heads"], head["head_dim"], "True", "-1", "0", ""],
                          ["BatchPrefillWithPagedKVCacheWrapper.run", "0.500000", "12.000000",
                           mi["batch"], mi["qo_len"], mi["kv_len"], mi["qo_heads"],
                           mi["kv_heads"], mi["head_dim"], "True", "6", "3", ""]])
        ours = os.path.join(d, "prefill_grid.csv")
        r = run("prefill-grid", plan, bench, log, ours, os.path.join(d, "phase5c.md"))
        self.assertEqual(r.returncode, 1, r.stderr)  # a failed row and rows not run
        with open(ours, newline="") as f:
            got = list(csv.DictReader(f))
        self.assertEqual([got[0][k] for k in ("median_ms", "tflops", "pct_peak", "status")],
                         ["2.000000", "301.5", "30.5", "ok"])
        self.assertEqual(got[1]["status"], "error: BatchPrefillWithPagedKVCacheWrapper.run: boom")
        self.assertEqual([got[2][k] for k in ("items", "median_ms", "pct_peak", "status")],
                         ["6/3", "0.500000", "1.2", "ok"])
        self.assertEqual(got[3]["status"], "not run (phase budget spent)")
        self.assertIn("| 2 | 23 | 23 | 4:2 | 64 | True, multi-item 6/3 | 0.500000 |",
                      read(os.path.join(d, "phase5c.md")))
        self.assertTrue(got[-1]["status"].startswith("skipped: q+K+V+o"))
        # Upstream: fa2 slower on the headline (3 ms), auto faster (1 ms); auto's chunked row
        # failed to JIT.
        up = os.path.join(d, "upstream_prefill_grid.csv")
        key = [head[k] for k in ("batch", "qo_len", "kv_len", "qo_heads", "kv_heads", "head_dim",
                                 "causal")]
        ck = [rows[1][k] for k in ("batch", "qo_len", "kv_len", "qo_heads", "kv_heads", "head_dim",
                                   "causal")]
        mk = [mi[k] for k in ("batch", "qo_len", "kv_len", "qo_heads", "kv_heads", "head_dim",
                              "causal")]
        # (An upstream CSV without the items column reads as plain rows; the multi-item row's
        # timing is told apart by it.)
        write_csv(up, [["batch", "qo_len", "kv_len", "qo_heads", "kv_heads", "head_dim", "causal",
                        "items", "backend", "median_ms", "tflops", "pct_peak", "status"],
                       key + ["", "fa2", "3.000000", "201", "20.3", "ok"],
                       key + ["", "auto", "1.000000", "603", "60.9", "ok"],
                       ck + ["", "fa2", "0.500000", "1", "", "ok"],
                       ck + ["", "auto", "", "", "", "error: no sm90 JIT"],
                       mk + ["6/3", "fa2", "0.400000", "15", "", "ok"],
                       mk + ["6/3", "auto", "0.600000", "10", "", "ok"]])
        md, out = os.path.join(d, "prefill_compare.md"), os.path.join(d, "prefill_compare.csv")
        r = run("compare-prefill", plan, ours, up, md, out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out, newline="") as f:
            joined = list(csv.DictReader(f))
        self.assertEqual(len(joined), 34)
        h = joined[0]
        self.assertEqual([h["role"], h["ratio_fa2_over_ours"], h["ratio_auto_over_ours"]],
                         ["headline", "1.5000", "0.5000"])
        self.assertEqual([joined[1]["ratio_fa2_over_ours"], joined[1]["upstream_auto_status"]],
                         ["", "error: no sm90 JIT"])  # ours failed there: no ratio
        self.assertEqual([joined[2][k] for k in ("items", "role", "ratio_fa2_over_ours",
                                                 "ratio_auto_over_ours")],
                         ["6/3", "multi_item", "0.8000", "1.2000"])
        text = read(md)
        self.assertIn("- headline (batch 1 qo 48 kv 48 heads 4:2 D 64 causal): ours 301.5 TFLOP/s "
                      "(goal >= 300: met); upstream fa2: 1.500x; upstream auto: 0.500x", text)
        self.assertIn("- against upstream fa2: minimum ratio 0.800x (batch 2 qo 23 kv 23 heads 4:2 D "
                      "64 causal, multi-item 6/3); 1 of 2 rows compared below 1.0x (goal: >= 1.0x "
                      "on every shape: NOT met)", text)
        self.assertIn("- against upstream auto: minimum ratio 0.500x", text)
        self.assertIn("| **0.500** |", text)
        self.assertNotIn("DRY RUN", text)
        # The summary page carries the goal lines.
        self.assertEqual(run("summary", d).returncode, 0)
        self.assertIn("Prefill grid against upstream (phases 5c, 6c; `prefill_compare.csv`): "
                      "headline (batch 1 qo 48", read(os.path.join(d, "summary.md")))
        # The dry run's made-up timings: one row per grid row and backend, marked in the join.
        fake = os.path.join(d, "fake.csv")
        self.assertEqual(run("fake-upstream-prefill", ours, fake).returncode, 0)
        with open(fake, newline="") as f:
            frows = list(csv.DictReader(f))
        self.assertEqual([(r["backend"], r["median_ms"]) for r in frows[:2]],
                         [("fa2", "1.600000"), ("auto", "2.000000")])
        run("compare-prefill", plan, ours, fake, md, out)
        self.assertIn("DRY RUN: the upstream timings are made up", read(md))

    def test_op_grids_plan_ours_and_the_join(self):
        d = self.d
        # The plans: the rows the brief of phases 5d-5f asks for, the headline first.
        counts = {}
        for kind in ("sampling", "rowops", "gemm"):
            plan, tl = os.path.join(d, kind + "_plan.csv"), os.path.join(d, kind + ".testlist")
            r = run("op-plan", kind, "full", "0", plan, tl)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(plan, newline="") as f:
                counts[kind] = list(csv.DictReader(f))
            lines = read(tl).splitlines()
            self.assertEqual(len(lines), len(counts[kind]))
        self.assertEqual([len(counts[k]) for k in ("sampling", "rowops", "gemm")], [27, 33, 44])
        self.assertEqual(counts["rowops"][0]["role"], "headline")
        self.assertIn("--routine apply_rope_pos_ids --batch_size 1 --s_qo 16384 --num_qo_heads 64 "
                      "--num_kv_heads 8 --head_dim_qk 128", read(os.path.join(d, "rowops.testlist")))
        self.assertIn("--routine silu_and_mul --batch_size 8192 --hidden_size 14336",
                      read(os.path.join(d, "rowops.testlist")))
        gemm_tl = read(os.path.join(d, "gemm.testlist"))
        self.assertIn("--routine bmm_fp8 --backends cudnn --batch_size 1 --m 1024 --n 4096 "
                      "--k 4096\n", gemm_tl)
        self.assertIn("--routine grouped_mm_fp8 --backends cudnn --batch_size 64 --m 128 --n 4096 "
                      "--k 7168\n", gemm_tl)
        self.assertIn("--routine mm_bf16 --backends cudnn --m 8192 --n 8192 --k 8192\n", gemm_tl)
        # Ours on the GEMM grid: the headline timed, one row failed, the rest not run.
        plan = os.path.join(d, "gemm_plan.csv")
        rows = counts["gemm"]
        head = rows[0]
        self.assertEqual([head[c] for c in ("routine", "backend", "batch", "m", "n", "k")],
                         ["mm_bf16", "auto", "1", "4096", "4096", "4096"])
        bench = os.path.join(d, "gemm_raw.csv")
        write_csv(bench, [["routine", "median_time", "tflops", "tb_per_sec", "backend",
                           "batch_size", "m", "n", "k", "refcheck"],
                          ["mm_bf16", "0.2", "687.2", "0.5", "auto", "4", "4096", "4096", "4096",
                           ""]])
        log = os.path.join(d, "gemm.log")
        with open(log, "w") as f:
            f.write("[TESTLIST] line 2: %s\n[ERROR] testlist line 2: mm_bf16: boom\n" % rows[1]["flags"])
        ours = os.path.join(d, "gemm_grid.csv")
        r = run("op-grid", "gemm", plan, bench, log, ours, os.path.join(d, "phase5f.md"))
        self.assertEqual(r.returncode, 1, r.stderr)
        with open(ours, newline="") as f:
            got = list(csv.DictReader(f))
        self.assertEqual([got[0][k] for k in ("median_ms", "metric", "pct_peak", "status")],
                         ["0.200000", "687.2", "69.5", "ok"])
        self.assertEqual(got[1]["status"], "error: mm_bf16: boom")
        self.assertEqual(got[2]["status"], "not run (phase budget spent)")
        # torch slower on the headline: ratio 1.5.
        peer = os.path.join(d, "torch_gemm_grid.csv")
        write_csv(peer, [["routine", "backend", "batch", "m", "n", "k", "median_ms", "metric",
                          "pct_peak", "status"],
                         ["mm_bf16", "auto", "1", "4096", "4096", "4096", "0.3", "458.1", "46.3",
                          "ok: torch.matmul"]])
        md, out = os.path.join(d, "gemm_compare.md"), os.path.join(d, "gemm_compare.csv")
        self.assertEqual(run("compare-op", "gemm", plan, ours, peer, md, out).returncode, 0)
        text = read(md)
        self.assertIn("- headline (mm_bf16 backend auto, batch 1, m 4096, n 4096, k 4096): torch "
                      "0.3 ms / ours 0.200000 ms = 1.500x; ours 687.2 TFLOP/s (69.5 % of peak)",
                      text)
        self.assertIn("- bmm_fp8 backend cublas: no row has both timings", text)
        # One row of six timed: the goal is not met (every shape must be), the rest no data.
        self.assertIn("- goal: mm_bf16 (backend auto, cuBLASLt) >= 0.97x torch.matmul on every "
                      "shape: **FAIL**, 1 of 6 rows timed, 0 below; lowest 1.500x (m 4096, n "
                      "4096, k 4096)", text)
        self.assertIn("- goal: grouped_mm_fp8 (backend cudnn, CUTLASS sm90 grouped GEMM (e4m3 x "
                      "e4m3 -> bf16) on sm_90, else the grouped tensor-core kernel) >= 0.90x a "
                      "loop of torch._scaled_mm at 64 groups: **no data**", text)
        self.assertIn("| mm_bf16 | m 4096, n 4096, k 4096 | 0.3 | 458.1 | auto (cuBLASLt): "
                      "0.200000 ms, 687.2, 1.500x **pass (>= 0.97x)**; cudnn (cuDNN): not run (phase "
                      "budget spent) |", text)
        self.assertIn("| mm_bf16 | m 16, n 4096, k 4096 | not run | - | auto (cuBLASLt): error: "
                      "mm_bf16: boom; cudnn", text)
        with open(out, newline="") as f:
            first = next(csv.DictReader(f))
        self.assertEqual((first["ratio_torch_over_ours"], first["goal"]), ("1.5000", "pass (>= 0.97x)"))
        # kernels.csv: a row per goal from the join
        self.assertEqual(run("kernels", d, "H100", "2026-01-01").returncode, 0)
        with open(os.path.join(d, "kernels.csv"), newline="") as f:
            perf = {r["kernel"]: r["result"] for r in csv.DictReader(f) if r["kernel"].startswith("perf")}
        self.assertEqual(len(perf), 4)
        self.assertEqual(perf["perf: bmm_fp8 (backend cublas, cuBLASLt) >= 0.95x torch._scaled_mm on "
                              "every shape"], "no data: no row has both timings")
        self.assertEqual(run("summary", d).returncode, 0)
        self.assertIn("GEMM grid against torch (phases 5f, 6f; `gemm_compare.csv`): headline",
                      read(os.path.join(d, "summary.md")))

    def test_multi_item_rows_count_as_flashinfer_bench(self):
        sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
        import gpu_check_upstream as u
        # The prompt of tests/cli/test_bench.cpp's hand count: 23 tokens, prefix 6, items of 3.
        self.assertEqual(u.item_positions(23, 6, 3), [0, 1, 2, 3] * 4 + [0])
        self.assertEqual(u.prefill_flops(2, 23, 23, 4, 64, True, "6/3"), 4.0 * 2 * 4 * 64 * 147)
        # Without items: the causal count.
        self.assertEqual(u.prefill_flops(1, 8, 8, 1, 1, True), 4.0 * (2 * 8 - 8) * 8 / 2)

    def test_gemm_grid_counts_goals_and_keys(self):
        sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
        import gpu_check_report as g
        # The grouped bench hook's groups: m + 3 * (e % 4), the last empty past two groups.
        self.assertEqual(g.grouped_sizes(8, 16), [16, 19, 22, 25, 16, 19, 22, 0])
        self.assertEqual(g.grouped_sizes(2, 4), [4, 7])
        self.assertEqual(sum(g.grouped_sizes(64, 128)), 63 * 128 + 3 * (16 * 6 - 3))
        # (bytes, FLOPs) as the hooks count them (tests/cli/test_bench.cpp checks the hooks')
        self.assertEqual(g.gemm_counts("mm_bf16", 1, 8, 32, 64), (2 * (8 * 64 + 32 * 64) + 2 * 8 * 32, 32768))
        self.assertEqual(g.gemm_counts("bmm_fp8", 2, 4, 32, 64), (2 * (4 * 64 + 32 * 64 + 2 * 4 * 32), 2 * 2 * 4 * 32 * 64))
        self.assertEqual(g.gemm_counts("grouped_mm_fp8", 4, 4, 64, 64), (20416, 172032))
        self.assertEqual(g.gemm_counts("grouped_mm_bf16", 4, 4, 64, 64), (2 * (21 * 64 + 4 * 64 * 64) + 2 * 21 * 64, 2 * 21 * 64 * 64))
        # The % of peak: fp8 routines against the 8-bit peak
        self.assertEqual(g.op_peak("grouped_mm_fp8"), (1978.9, "TFLOP/s"))
        self.assertEqual(g.op_peak("bmm_bf16"), (989.4, "TFLOP/s"))
        # Keys: a testlist line's --backends and a CSV row's backend, the device prefix dropped;
        # mm's batch is 1 whatever batch_size says.
        self.assertEqual(g.op_key_from_flags("gemm", g.flag_dict(
            "--routine bmm_fp8 --backends cpu:cudnn --batch_size 1 --m 8 --n 64 --k 64")),
            ("bmm_fp8", "cudnn", "1", "8", "64", "64"))
        self.assertEqual(g.op_key_from_flags("gemm", dict(
            routine="mm_bf16", backend="auto", batch_size="4", m="16", n="4096", k="4096")),
            ("mm_bf16", "auto", "1", "16", "4096", "4096"))
        # Goals: which rows each covers, and pass / FAIL / no data.
        self.assertEqual(g.gemm_goal("mm_bf16", "auto", "1"), (0.97, "torch.matmul"))
        self.assertIsNone(g.gemm_goal("mm_bf16", "cudnn", "1"))  # reported beside, no goal
        self.assertIsNone(g.gemm_goal("grouped_mm_bf16", "cudnn", "8"))  # 64 groups only
        self.assertEqual(g.gemm_goal("grouped_mm_bf16", "cudnn", "64")[0], 0.90)

        def row(rt, be, batch, m, ratio):
            return dict(routine=rt, backend=be, batch=str(batch), m=str(m), n="4096", k="4096",
                        ratio=ratio)
        rows = [row("mm_bf16", "auto", 1, 1, 0.98), row("mm_bf16", "auto", 1, 16, 0.97),
                row("mm_bf16", "cudnn", 1, 1, 0.5), row("bmm_fp8", "cublas", 1, 1, 0.949),
                row("bmm_fp8", "cublas", 1, 16, 1.2), row("grouped_mm_bf16", "cudnn", 8, 16, 0.1),
                row("grouped_mm_bf16", "cudnn", 64, 16, 0.95),
                row("grouped_mm_bf16", "cudnn", 64, 128, None)]
        got = {x["goal"].split(" ")[0]: x for x in g.gemm_goals(rows)}
        self.assertEqual(got["mm_bf16"]["status"], "pass")  # 0.97 is enough; cudnn not counted
        self.assertEqual(got["bmm_fp8"]["status"], "FAIL")
        self.assertEqual(got["bmm_fp8"]["below"], 1)
        self.assertEqual(got["grouped_mm_bf16"]["status"], "FAIL")  # a 64-group row untimed
        self.assertEqual((got["grouped_mm_bf16"]["rows"], got["grouped_mm_bf16"]["planned"]), (1, 2))
        self.assertEqual(got["grouped_mm_fp8"]["status"], "no data")
        self.assertEqual(g.gemm_goal_text(got["bmm_fp8"]),
                         "bmm_fp8 (backend cublas, cuBLASLt) >= 0.95x torch._scaled_mm on every "
                         "shape: **FAIL**, 2 of 2 rows timed, 1 below; lowest 0.949x (m 1, n 4096, "
                         "k 4096)")

    def test_gemm_dry_plan_runs_each_backend_on_the_cpu_reference(self):
        plan, tl = os.path.join(self.d, "plan.csv"), os.path.join(self.d, "tl")
        self.assertEqual(run("op-plan", "gemm", "dry", "0", plan, tl).returncode, 0)
        lines = read(tl).splitlines()
        self.assertEqual(len(lines), 26)
        self.assertTrue(all(" --backends cpu:" in l for l in lines), lines)
        with open(plan, newline="") as f:
            rows = list(csv.DictReader(f))
        # every goal has rows in the dry plan (64 groups included), so the dry run reaches them
        sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
        import gpu_check_report as g
        for rt, be, _, only, _ in g.GEMM_GOALS:
            self.assertTrue(any(r["routine"] == rt and r["backend"] == be and
                                (only is None or r["batch"] == str(only)) for r in rows), rt)

    def test_upstream_error_names_the_jit_failure(self):
        """A failed upstream JIT reports the compiler's first error, not only Ninja's header line
        (session 39: the header alone hid a missing CUTLASS include); other errors keep their
        first line."""
        sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
        import gpu_check_upstream as up
        jit = RuntimeError("Ninja build failed. Ninja output:\n[1/3] nvcc -c a.cu\n"
                           "FAILED: [code=1] a.cuda.o\n"
                           "u.cuh:36:10: fatal error: cutlass/util/command_line.h: No such file\n"
                           "compilation terminated.")
        self.assertEqual(up.first_line(jit), "Ninja build failed. Ninja output: u.cuh:36:10: "
                         "fatal error: cutlass/util/command_line.h: No such file")
        self.assertEqual(up.first_line(ValueError("bad head_dim\nsome error later")),
                         "bad head_dim")
        self.assertEqual(up.first_line(ValueError("")), "ValueError")

    def test_torch_gemm_calls_do_the_planned_flops(self):
        """gpu_check_upstream.gemm_call on a shape-only stand-in for torch: every call's operand
        shapes agree and the calls' FLOPs sum to the plan's (the bench hook's) count."""
        sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
        import gpu_check_report as g
        import gpu_check_upstream as up
        calls = []

        class T:
            def __init__(self, shape):
                self.shape = tuple(shape)

            def __getitem__(self, i):
                if isinstance(i, slice):
                    return T((len(range(*i.indices(self.shape[0]))),) + self.shape[1:])
                return T(self.shape[1:])

            def t(self):
                return T(self.shape[::-1])

            def transpose(self, a, b):
                s = list(self.shape)
                s[a], s[b] = s[b], s[a]
                return T(s)

            def to(self, _):
                return self

        def mm(x, w, out=None, **_):
            assert x.shape[-1] == w.shape[-2], (x.shape, w.shape)
            o = x.shape[:-1] + w.shape[-1:]
            assert out is None or out.shape == o, (out.shape, o)
            batch = x.shape[0] if len(x.shape) == 3 else 1
            calls.append(2 * batch * x.shape[-2] * x.shape[-1] * w.shape[-1])
            return T(o)

        class FakeTorch:
            bfloat16 = float32 = float8_e4m3fn = object()
            matmul = bmm = _scaled_mm = staticmethod(mm)

            @staticmethod
            def ones(shape, **_):
                return T(shape)

            full = empty = staticmethod(lambda shape, *a, **k: T(shape))

        uniform = lambda shape, lo, hi, dtype=None: T(shape)
        rows = g.op_plan_rows("gemm", "full")
        for p in rows:
            for pad in (False, True):
                del calls[:]
                call = up.gemm_call(FakeTorch, None, uniform, {k: str(v) for k, v in p.items()}, pad)
                call()
                if pad and "fp8" in p["routine"]:
                    self.assertIn("padded to 16", call.what)
                    self.assertGreaterEqual(sum(calls), p["flops"])
                else:
                    self.assertEqual(sum(calls), p["flops"], (p, call.what))
        self.assertEqual(up.gemm_call(FakeTorch, None, uniform, dict(
            routine="grouped_mm_bf16", batch="64", m="16", n="8", k="8"), False).what,
            "a loop of 63 torch.matmul")

    def test_gemm_grid_row_of_a_backend_this_build_lacks_is_a_skip(self):
        plan, tl = os.path.join(self.d, "plan.csv"), os.path.join(self.d, "tl")
        run("op-plan", "gemm", "dry", "0", plan, tl)
        lines = read(tl).splitlines()
        with open(plan, newline="") as f:
            rows = list(csv.DictReader(f))
        bench = os.path.join(self.d, "raw.csv")
        header = ["routine", "median_time", "tflops", "tb_per_sec", "backend", "batch_size", "m",
                  "n", "k", "refcheck"]
        timed = [[r["routine"], "0.01", "1", "0.1", "cpu:" + r["backend"], r["batch"], r["m"],
                  r["n"], r["k"], ""] for r in rows[1:]]
        write_csv(bench, [header] + timed)
        log = os.path.join(self.d, "log")
        with open(log, "w") as f:
            f.write("[TESTLIST] line 1: %s\n[SKIP] cudnn :: mm_bf16's backend 'auto' does not run "
                    "on this build and device\n[SKIP] testlist line 1: mm_bf16's backend 'auto' "
                    "does not run on this build and device (compute capability 75; it runs: "
                    "none)\n" % lines[0])
        ours = os.path.join(self.d, "ours.csv")
        r = run("op-grid", "gemm", plan, bench, log, ours, os.path.join(self.d, "p.md"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)  # a skip is not a failure
        with open(ours, newline="") as f:
            got = list(csv.DictReader(f))
        self.assertEqual(got[0]["status"], "skipped: mm_bf16's backend 'auto' does not run on this "
                                           "build and device (compute capability 75; it runs: none)")
        self.assertTrue(all(g["status"].startswith("ok") for g in got[1:]))

    def test_summary_of_an_empty_directory(self):
        r = run("summary", self.d)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("project at unknown", read(os.path.join(self.d, "summary.md")))


if __name__ == "__main__":
    unittest.main()
