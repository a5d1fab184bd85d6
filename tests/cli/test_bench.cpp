// `flashinfer bench`: routines from the op declarations, [PERF] lines, refcheck, CSV columns,
// upstream's FLOP and byte formulas on hand-computed shapes, and clear errors for bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "api/bench_backend.h"
#include "flashinfer/flashinfer.h"
#include "kernel_switches.h"
#include "util/run_command.h"
#include "util/test_util.h"

namespace {

using CliResult = flashinfer::testing::CommandResult;
using flashinfer::testing::run_flashinfer;

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> cols;
  std::stringstream ss(line);
  std::string c;
  while (std::getline(ss, c, ',')) cols.push_back(c);
  return cols;
}

std::vector<std::map<std::string, std::string>> read_csv(const std::string& path,
                                                         std::vector<std::string>* header) {
  std::ifstream in(path);
  std::string line;
  std::vector<std::map<std::string, std::string>> rows;
  if (!std::getline(in, line)) return rows;
  *header = split(line);
  while (std::getline(in, line)) {
    const auto cols = split(line);
    std::map<std::string, std::string> row;
    for (std::size_t i = 0; i < cols.size() && i < header->size(); ++i) row[(*header)[i]] = cols[i];
    rows.push_back(row);
  }
  return rows;
}

// One `flashinfer bench` command line (`cmd`: an environment prefix allowed, then the binary and
// its arguments) with its CSV written to a fresh file `name` in the test's temporary directory:
// the command's result and the rows read back (the file removed after).
struct CsvRun {
  CliResult cli;
  std::vector<std::map<std::string, std::string>> rows;
};
CsvRun bench_csv(const std::string& cmd, const std::string& name) {
  const std::string csv = testing::TempDir() + name;
  std::remove(csv.c_str());
  CsvRun r;
  r.cli = flashinfer::testing::run_command(cmd + " --output_path " + csv);
  std::vector<std::string> header;
  r.rows = read_csv(csv, &header);
  std::remove(csv.c_str());
  return r;
}
// The bench command line with `args`.
std::string bench_cmd(const std::string& args) {
  return std::string(FLASHINFER_TEST_BIN_DIR) + "/flashinfer bench " + args;
}

const std::regex kPerf(
    R"(\[PERF\] cpu +:: median time ([0-9.]+) ms; std ([0-9.]+) ms; achieved tflops ([0-9.]+) )"
    R"(TFLOPs/sec; achieved tb_per_sec ([0-9.]+) TB/sec)");

// Tiny shapes shared by the cases below.
const std::string kTiny =
    " --batch_size 2 --s_qo 16 --s_kv 64 --num_qo_heads 4 --num_kv_heads 2 --head_dim_qk 64"
    " --head_dim_vo 64 --page_size 16 --num_iters 3 --dry_run_iters 1";

struct Expected {
  std::string routine;
  std::string flags;
  double flops;
  double bytes;
};

TEST(Bench, ListShowsEveryFamilyFromTheDeclarations) {
  CliResult r = run_flashinfer("bench --list");
  ASSERT_EQ(r.status, 0) << r.out;
  int with_hook = 0;
  for (const std::string& name : flashinfer::bench_routines()) {
    ++with_hook;
    EXPECT_NE(r.out.find(name + " "), std::string::npos) << name;
  }
  EXPECT_NE(r.out.find(std::to_string(with_hook) + " op routines"), std::string::npos) << r.out;
  for (const char* name :
       {"BatchDecodeWithPagedKVCacheWrapper.run", "BatchPrefillWithPagedKVCacheWrapper.run",
        "BatchPrefillWithRaggedKVCacheWrapper.run", "single_decode_with_kv_cache",
        "single_prefill_with_kv_cache", "rmsnorm", "fused_add_rmsnorm", "layernorm", "silu_and_mul",
        "apply_rope_pos_ids", "top_k_top_p_sampling_from_logits", "softmax", "mm_bf16", "bmm_bf16",
        "bmm_fp8", "mm_fp4", "fp4_quantize", "mxfp8_quantize"}) {
    const flashinfer::OpDecl* d = flashinfer::OpRegistry::global().find(name);
    ASSERT_NE(d, nullptr) << name;
    EXPECT_NE(flashinfer::find_bench_hook(name), nullptr) << name;
  }
  EXPECT_EQ(flashinfer::find_bench_hook("get_seq_lens"), nullptr);
}

TEST(Bench, OneRoutinePerFamilyRefcheckPerfLineCsvAndFormulas) {
  const std::string csv =
      (std::filesystem::temp_directory_path() / ("fi_bench_" + std::to_string(getpid()) + ".csv"))
          .string();
  std::filesystem::remove(csv);
  // FLOPs and bytes computed by hand from upstream's formulas (see docs/PERFORMANCE.md).
  const std::vector<Expected> cases = {
      // decode: 2 * 1 * 64 * 4 * (64 + 64) per request, x2; q 1024 B, k 32768, v 32768, o 1024
      {"BatchDecodeWithPagedKVCacheWrapper.run", "", 131072, 67584},
      // causal prefill: (2*64 - 16) * 16 * 4 * 128 per request, x2; q 16384, k, v 32768, o 16384
      {"BatchPrefillWithPagedKVCacheWrapper.run", " --causal", 1835008, 98304},
      // rmsnorm [4, 128] bf16: 4 FLOPs per element; in + out + weight = (2*512 + 128) * 2
      {"rmsnorm", " --batch_size 4 --hidden_size 128", 2048, 2304},
      // silu_and_mul [4, 256] -> [4, 128]: one FLOP per output; 4096 B in + 1024 B out
      {"silu_and_mul", " --batch_size 4 --hidden_size 128", 512, 3072},
      // rope: 32 tokens x (4 + 2) heads x 64 dims x 3; q, k read+written, int32 positions
      {"apply_rope_pos_ids", "", 36864, 49280},
      // softmax [2, 1000] fp32: 3 FLOPs per element; read + write
      {"softmax", " --vocab_size 1000", 6000, 16000},
      // sampling [2, 1000]: no FLOPs; logits read + int32 ids written
      {"top_k_top_p_sampling_from_logits", " --vocab_size 1000 --top_k 10 --top_p 0.8", 0, 8008},
      // mm_bf16 32x48x64: 2*m*n*k; (m*k + n*k + m*n) * 2 B
      {"mm_bf16", " --m 32 --n 48 --k 64", 196608, 13312},
      // fp4_quantize [32, 64] bf16: 4096 B in, 1024 B packed, 128 scales (one per 16)
      {"fp4_quantize", " --m 32 --k 64", 0, 5248},
      // merge_state: 32 rows x 4 heads; v 64 bf16 (16384 B) and s fp32 (512 B), two in, one out
      {"merge_state", "", 0, 50688},
      // append 32 tokens of K and V [32, 2, 64] bf16: read + written; int32 batch and position
      {"append_paged_kv_cache", "", 0, 33024},
      // sampling from probs [2, 1000] fp32: read once, int32 ids written
      {"sampling_from_probs", " --vocab_size 1000", 0, 8008},
      // cos/sin cache: q, k read + written, int32 positions, fp32 cache of 16 x 64
      {"apply_rope_with_cos_sin_cache", "", 36864, 53376},
      // mxfp8 dequantize [32, 64]: 2048 B codes, 64 scales, 8192 B fp32 out
      {"mxfp8_dequantize_host", " --m 32 --k 64", 0, 10304},
      // baseline copy 16 x 16 fp32: read + write
      {"stream_copy", " --m 16 --n 16", 0, 2048},
      // NoPE MLA (latent 512, no rope part): 2 * 1 * 64 * 4 * (512 + 512) per request, x2;
      // q and o [2, 4, 512] bf16 (8192 B each), the latent rows [128, 512] bf16 (131072 B)
      {"BatchMLAPagedAttentionWrapper.run", " --s_qo 1 --head_dim_kpe 0", 1048576, 147456},
  };
  for (const Expected& e : cases) {
    CliResult r = run_flashinfer("bench --routine " + e.routine + kTiny + e.flags +
                                 " --refcheck --backends cpu --output_path " + csv);
    ASSERT_EQ(r.status, 0) << e.routine << "\n" << r.out;
    EXPECT_NE(r.out.find("[REFCHECK] cpu :: "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("outputs match the CPU reference"), std::string::npos) << r.out;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.out, m, kPerf)) << e.routine << "\n" << r.out;
    const double med = std::stod(m[1]);
    EXPECT_GT(med, 0.0) << e.routine;
    EXPECT_GE(std::stod(m[2]), 0.0);
  }
  std::vector<std::string> header;
  const auto rows = read_csv(csv, &header);
  std::filesystem::remove(csv);
  const std::vector<std::string> first = {"routine",    "median_time", "std_time",        "tflops",
                                          "tb_per_sec", "backend",     "resolved_backend"};
  ASSERT_GE(header.size(), first.size());
  for (std::size_t i = 0; i < first.size(); ++i) EXPECT_EQ(header[i], first[i]);
  EXPECT_EQ(header.back(), "repro_command");
  ASSERT_EQ(rows.size(), cases.size());  // header once, one row per run
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& row = rows[i];
    const Expected& e = cases[i];
    EXPECT_EQ(row.at("routine"), e.routine);
    EXPECT_EQ(row.at("backend"), "cpu");
    EXPECT_EQ(row.at("refcheck"), "pass");
    EXPECT_EQ(std::stod(row.at("flops")), e.flops) << e.routine;
    EXPECT_EQ(std::stod(row.at("bytes")), e.bytes) << e.routine;
    // The rates are the counts over the median time (printed with 6 decimals).
    const double med_s = std::stod(row.at("median_time")) * 1e-3;
    EXPECT_NEAR(std::stod(row.at("tflops")), e.flops / med_s / 1e12,
                1e-6 + 0.01 * e.flops / med_s / 1e12)
        << e.routine;
    EXPECT_NEAR(std::stod(row.at("tb_per_sec")), e.bytes / med_s / 1e12,
                1e-6 + 0.01 * e.bytes / med_s / 1e12)
        << e.routine;
    EXPECT_NE(row.at("repro_command").find("flashinfer bench --routine " + e.routine),
              std::string::npos);
    // The MLA widths are spelled out where they are not DeepSeek's.
    EXPECT_EQ(row.at("repro_command").find("--head_dim_kpe 0") != std::string::npos,
              e.flags.find("--head_dim_kpe 0") != std::string::npos)
        << row.at("repro_command");
  }
}

// Every routine builds its case, runs it and hands back its outputs on small shapes, in process
// (flashinfer bench does the same per routine).
TEST(Bench, EveryRoutineRunsOnSmallShapes) {
  flashinfer::BenchShape s;
  s.batch_size = 2;
  s.s_qo = 4;
  s.s_kv = 40;
  s.num_qo_heads = 4;
  s.num_kv_heads = 2;
  s.head_dim_qk = s.head_dim_vo = 64;
  s.page_size = 16;
  s.m = 32;
  s.n = 48;
  s.k = 64;
  s.hidden_size = 128;
  s.vocab_size = 500;
  s.top_k = 10;
  int ran = 0;
  for (const std::string& name : flashinfer::bench_routines()) {
    SCOPED_TRACE(name);
    flashinfer::BenchCase c = (*flashinfer::find_bench_hook(name))(s, flashinfer::Device::cpu());
    ASSERT_TRUE(static_cast<bool>(c.run));
    c.run();
    EXPECT_GT(c.bytes, 0.0);
    if (c.outputs) {
      for (const auto& [key, t] : c.outputs()) EXPECT_TRUE(t.defined()) << key;
    }
    ++ran;
  }
  EXPECT_GE(ran, 41);
}

TEST(Bench, VerbosePrintsCountsAndPerOutputRefcheck) {
  CliResult r = run_flashinfer(
      "bench --routine fused_add_rmsnorm --batch_size 3 --hidden_size 64 -v"
      " --refcheck --num_iters 2 --dry_run_iters 0");
  ASSERT_EQ(r.status, 0) << r.out;
  // 3 x 64: 5 FLOPs per element; input, residual read and written, weight read: (4*192+64)*2
  EXPECT_NE(r.out.find("960 FLOPs, 1664 bytes per iteration"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[REFCHECK] cpu input: 192 elements match"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[REFCHECK] cpu residual: 192 elements match"), std::string::npos) << r.out;
}

TEST(Bench, CudaWithoutAGpuIsASkipNotACrash) {
  if (flashinfer::cuda_compiled() && flashinfer::cuda_device_count() > 0) {
    GTEST_SKIP() << "a GPU is present";
  }
  CliResult r =
      run_flashinfer("bench --routine rmsnorm --backends cuda --hidden_size 64 --num_iters 1");
  EXPECT_EQ(r.status, 4) << r.out;
  EXPECT_NE(r.out.find("[SKIP] cuda :: "), std::string::npos) << r.out;
  CliResult both =
      run_flashinfer("bench --routine rmsnorm --backends cpu cuda --hidden_size 64 --num_iters 1");
  EXPECT_EQ(both.status, 0) << both.out;
  EXPECT_NE(both.out.find("[SKIP] cuda :: "), std::string::npos) << both.out;
  EXPECT_NE(both.out.find("[PERF] cpu "), std::string::npos) << both.out;
}

TEST(Bench, BadRoutineAndFlagsAreClearErrors) {
  struct Bad {
    std::string args, message;
  };
  const std::vector<Bad> bad = {
      {"bench --routine no_such_op", "no op named 'no_such_op'"},
      {"bench --routine get_batch_indices_positions", "has no bench routine"},
      {"bench", "routine"},
      {"bench --routine rmsnorm --input_dtype float7", "unknown dtype 'float7'"},
      {"bench --routine rmsnorm --num_iters 0", "num_iters"},
      {"bench --routine rmsnorm --dry_run_iters -1", "dry_run_iters"},
      {"bench --routine rmsnorm --batch_size -2", "batch_size"},
      {"bench --routine BatchMLAPagedAttentionWrapper.run --head_dim_kpe -1", "head_dim_kpe"},
      {"bench --routine BatchMLAPagedAttentionWrapper.run --head_dim_ckv 0", "head_dim_ckv"},
      {"bench --routine rmsnorm --backends tpu", "unknown backend 'tpu'"},
      {"bench --routine top_k_top_p_sampling_from_logits --top_p 1.5", "top_p"},
      {"bench --routine rmsnorm --frobnicate 3", "frobnicate"},
      {"bench --routine rmsnorm --batch_size two", "batch_size"},
      // the op's own argument checks reach the user through the hook
      {"bench --routine rmsnorm --input_dtype int32 --num_iters 1", "rmsnorm"},
  };
  for (const Bad& b : bad) {
    CliResult r = run_flashinfer(b.args);
    EXPECT_NE(r.status, 0) << b.args << "\n" << r.out;
    EXPECT_NE(r.out.find(b.message), std::string::npos) << b.args << "\n" << r.out;
  }
  CliResult unwritable = run_flashinfer(
      "bench --routine rmsnorm --hidden_size 64 --num_iters 1 "
      "--output_path /nonexistent_dir/x.csv");
  EXPECT_NE(unwritable.status, 0);
  EXPECT_NE(unwritable.out.find("output_path"), std::string::npos) << unwritable.out;
}

// --backends names an op backend of the GEMM routines (upstream's spelling; cpu:NAME calls the
// CPU reference with it): one CSV row per name, the same FLOPs, each matching the reference.
TEST(Bench, BackendsNameTheOpBackendsOfGemmRoutines) {
  const CsvRun run = bench_csv(
      bench_cmd("--routine mm_bf16 --m 8 --n 32 --k 64 --backends cpu cpu:cudnn cpu:auto --refcheck"
                " --num_iters 2 --dry_run_iters 0"),
      "bench_op_backends.csv");
  const CliResult& r = run.cli;
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("[REFCHECK] cpu:cudnn :: 2 outputs match"), std::string::npos) << r.out;
  const auto& rows = run.rows;
  ASSERT_EQ(rows.size(), 3u);
  const std::vector<std::string> want = {"cpu", "cpu:cudnn", "cpu:auto"};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].at("backend"), want[i]);
    EXPECT_EQ(rows[i].at("flops"), "32768");  // 2 * 8 * 32 * 64
    EXPECT_EQ(rows[i].at("refcheck"), "pass");
    EXPECT_NE(rows[i].at("repro_command").find("--backends " + want[i] + " "), std::string::npos);
  }
  // Each GEMM routine takes its op's names: bmm_fp8 cublas/cudnn, the grouped GEMMs cudnn.
  for (const std::string& args :
       {std::string("--routine bmm_fp8 --batch_size 2 --m 4 --n 32 --k 64 --backends cpu:cublas "
                    "cpu:cudnn"),
        std::string("--routine bmm_bf16 --batch_size 2 --m 4 --n 32 --k 64 --backends cpu:cudnn"),
        std::string("--routine grouped_mm_bf16 --batch_size 4 --m 4 --n 32 --k 64 --backends "
                    "cpu:cudnn"),
        std::string("--routine grouped_mm_fp8 --batch_size 4 --m 4 --n 32 --k 64 --backends "
                    "cpu:cudnn")}) {
    CliResult g = run_flashinfer("bench " + args + " --refcheck --num_iters 1 --dry_run_iters 0");
    EXPECT_EQ(g.status, 0) << args << "\n" << g.out;
    EXPECT_EQ(g.out.find("mismatch"), std::string::npos) << args << "\n" << g.out;
  }
  struct Bad {
    std::string args, message;
  };
  for (const Bad& b : std::vector<Bad>{
           {"--routine rmsnorm --backends cudnn", "rmsnorm takes cpu or cuda"},
           {"--routine mm_bf16 --backends fa2", "unknown backend 'fa2' for mm_bf16"},
           {"--routine mm_bf16 --backends cpu:fa2",
            "cudnn, cublaslt, cutlass, tgv, cute-dsl, cutile"},
           {"--routine mm_bf16 --backends gpu:cudnn", "unknown device 'gpu'"},
           {"--routine mm_bf16 --backends cpu:", "empty backend name"},
           {"--routine stream_copy --backends cpu:auto", "stream_copy takes cpu or cuda"},
           // mm_fp4's op has a backend table, but its bench case passes none: refused, not
           // timed under a name it ignores
           {"--routine mm_fp4 --m 8 --n 32 --k 64 --backends cpu:auto --num_iters 1",
            "takes no op backend"}}) {
    CliResult e = run_flashinfer("bench " + b.args);
    EXPECT_NE(e.status, 0) << b.args << "\n" << e.out;
    EXPECT_NE(e.out.find(b.message), std::string::npos) << b.args << "\n" << e.out;
  }
  if (!(flashinfer::cuda_compiled() && flashinfer::cuda_device_count() > 0)) {
    CliResult skip = run_flashinfer("bench --routine mm_bf16 --backends cudnn --num_iters 1");
    EXPECT_EQ(skip.status, 4) << skip.out;
    EXPECT_NE(skip.out.find("[SKIP] cudnn :: "), std::string::npos) << skip.out;
  }
}

// The decode wrapper takes upstream's benchmark names for its own option: fa2
// (use_tensor_cores=False) and fa2_tc (use_tensor_cores=True); both match the reference, one CSV
// row each; other names are refused with the list.
TEST(Bench, DecodeWrapperTakesFa2AndFa2Tc) {
  const CsvRun run = bench_csv(
      bench_cmd(
          "--routine BatchDecodeWithPagedKVCacheWrapper.run --batch_size 2 --s_kv 64 "
          "--num_qo_heads 8 --num_kv_heads 2 --head_dim_qk 64 --head_dim_vo 64 --page_size 16 "
          "--backends cpu:fa2 cpu:fa2_tc --refcheck --num_iters 1 --dry_run_iters 0"),
      "bench_decode_tc.csv");
  ASSERT_EQ(run.cli.status, 0) << run.cli.out;
  const auto& rows = run.rows;
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].at("backend"), "cpu:fa2");
  EXPECT_EQ(rows[1].at("backend"), "cpu:fa2_tc");
  for (const auto& row : rows) EXPECT_EQ(row.at("refcheck"), "pass");
  CliResult bad = run_flashinfer(
      "bench --routine BatchDecodeWithPagedKVCacheWrapper.run --backends cpu:cudnn --num_iters 1");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("unknown backend 'cudnn' for BatchDecodeWithPagedKVCacheWrapper.run"),
            std::string::npos)
      << bad.out;
  EXPECT_NE(bad.out.find("fa2, fa2_tc"), std::string::npos) << bad.out;
}

// --use_deepseek_fp8_block_scale: cutlass_fused_moe's DeepSeek FP8 block-scale path (bf16 input,
// e4m3 weights with 128 x 128 block scales) matches the reference, and the row's repro command
// names the flag (without it the same shape is the unquantized bf16 path).
TEST(Bench, CutlassFusedMoeTakesTheDeepSeekBlockScalePath) {
  const CsvRun run =
      bench_csv(bench_cmd("--routine cutlass_fused_moe --m 8 --hidden_size 256 --n 128 "
                          "--use_deepseek_fp8_block_scale --backends cpu --refcheck --num_iters 1 "
                          "--dry_run_iters 0"),
                "bench_moe_block.csv");
  ASSERT_EQ(run.cli.status, 0) << run.cli.out;
  const auto& rows = run.rows;
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].at("refcheck"), "pass");
  EXPECT_NE(rows[0].at("repro_command").find(" --use_deepseek_fp8_block_scale"), std::string::npos)
      << rows[0].at("repro_command");
  // Its weights are e4m3 with block scales: a different call from the bf16 one (FLOPs alike).
  const CsvRun plain =
      bench_csv(bench_cmd("--routine cutlass_fused_moe --m 8 --hidden_size 256 --n 128 "
                          "--backends cpu --num_iters 1 --dry_run_iters 0"),
                "bench_moe_plain.csv");
  ASSERT_EQ(plain.cli.status, 0);
  const auto& prow = plain.rows;
  ASSERT_EQ(prow.size(), 1u);
  EXPECT_EQ(prow[0].at("repro_command").find("use_deepseek_fp8_block_scale"), std::string::npos);
  EXPECT_NE(prow[0].at("bytes"), rows[0].at("bytes"));
}

// The prefill wrappers take their `backend` under upstream's benchmark names: fa2 (the FA2
// kernel), fa3 (on sm_90 the Hopper kernel) and auto; on the CPU each runs the reference.
TEST(Bench, PrefillWrappersTakeFa2Fa3AndAuto) {
  for (const char* routine :
       {"BatchPrefillWithPagedKVCacheWrapper.run", "BatchPrefillWithRaggedKVCacheWrapper.run"}) {
    const CsvRun run = bench_csv(
        bench_cmd(std::string("--routine ") + routine +
                  " --batch_size 2 --s_qo 16 --s_kv 64 --num_qo_heads 8 --num_kv_heads 2 "
                  "--head_dim_qk 64 --head_dim_vo 64 --page_size 16 --causal --backends cpu:fa2 "
                  "cpu:fa3 cpu:auto --refcheck --num_iters 1 --dry_run_iters 0"),
        "bench_prefill_backends.csv");
    ASSERT_EQ(run.cli.status, 0) << run.cli.out;
    const auto& rows = run.rows;
    ASSERT_EQ(rows.size(), 3u) << routine;
    EXPECT_EQ(rows[0].at("backend"), "cpu:fa2");
    EXPECT_EQ(rows[1].at("backend"), "cpu:fa3");
    EXPECT_EQ(rows[2].at("backend"), "cpu:auto");
    for (const auto& row : rows) EXPECT_EQ(row.at("refcheck"), "pass") << routine;
    CliResult bad = run_flashinfer(std::string("bench --routine ") + routine +
                                   " --backends cpu:cutlass --num_iters 1");
    EXPECT_NE(bad.status, 0);
    EXPECT_NE(bad.out.find("fa2, fa3, auto"), std::string::npos) << bad.out;
  }
}

// Multi-item scoring prompts (--prefix_len / --item_len; SGLang's scoring API, the prefill
// wrappers' prefix_len_ptr, token_pos_in_items_ptr and max_item_len_ptr): both batch prefill
// wrappers plan them and match the reference, the row records both flags and its repro command
// repeats them, and the FLOPs count the pairs the mask leaves visible. Hand count: requests of 23
// tokens, a prefix of 6 (21 pairs), then 17 tokens (positions 0 1 2 3 0 1 2 3 0 1 2 3 0 1 2 3 0)
// that each see the prefix (102) and their own item up to themselves (24): 147 pairs a request, x
// 2 requests x 4 heads x 2 (64 + 64). Misuse is an error naming the flag.
TEST(Bench, PrefillWrappersTimeMultiItemScoringPrompts) {
  const std::string shape =
      " --batch_size 2 --s_qo 23 --s_kv 23 --num_qo_heads 4 --num_kv_heads 2 --head_dim_qk 64 "
      "--head_dim_vo 64 --page_size 4 --num_iters 1 --dry_run_iters 0 --backends cpu --refcheck";
  for (const char* routine :
       {"BatchPrefillWithPagedKVCacheWrapper.run", "BatchPrefillWithRaggedKVCacheWrapper.run"}) {
    const CsvRun run = bench_csv(bench_cmd(std::string("--routine ") + routine + shape +
                                           " --causal --prefix_len 6 --item_len 3"),
                                 "bench_multi_item.csv");
    ASSERT_EQ(run.cli.status, 0) << run.cli.out;
    ASSERT_EQ(run.rows.size(), 1u) << routine;
    const auto& row = run.rows[0];
    EXPECT_EQ(row.at("refcheck"), "pass") << routine;
    EXPECT_EQ(row.at("prefix_len"), "6");
    EXPECT_EQ(row.at("item_len"), "3");
    EXPECT_EQ(std::stod(row.at("flops")), 2.0 * 147 * 2 * 4 * 128) << routine;
    EXPECT_NE(row.at("repro_command").find(" --causal --prefix_len 6 --item_len 3 "),
              std::string::npos)
        << row.at("repro_command");
    // The same shape without the flags: a plain causal row.
    const CsvRun plain =
        bench_csv(bench_cmd(std::string("--routine ") + routine + shape + " --causal"),
                  "bench_multi_item_plain.csv");
    ASSERT_EQ(plain.cli.status, 0) << plain.cli.out;
    ASSERT_EQ(plain.rows.size(), 1u);
    EXPECT_EQ(plain.rows[0].at("prefix_len"), "-1");
    EXPECT_EQ(plain.rows[0].at("repro_command").find("prefix_len"), std::string::npos);
  }
  const std::string paged = "--routine BatchPrefillWithPagedKVCacheWrapper.run" + shape;
  for (const std::string& args :
       {paged + " --prefix_len 6 --item_len 3",            // not causal
        paged + " --causal --prefix_len 23 --item_len 3",  // no items
        paged + " --causal --prefix_len -2 --item_len 3",  // not -1 or >= 0
        std::string("--routine single_prefill_with_kv_cache --causal --prefix_len 6 "
                    "--item_len 3 --backends cpu")}) {
    const CliResult bad = run_flashinfer("bench " + args);
    EXPECT_NE(bad.status, 0) << args;
    EXPECT_NE(bad.out.find("'prefix_len'"), std::string::npos) << args << "\n" << bad.out;
  }
  const CliResult bad_item =
      run_flashinfer("bench " + paged + " --causal --prefix_len 6 --item_len 0");
  EXPECT_NE(bad_item.status, 0);
  EXPECT_NE(bad_item.out.find("'item_len'"), std::string::npos) << bad_item.out;
}

// The hooks' view of --backends: the innermost scope's name, marked used when read.
TEST(Bench, ScopedOpBackendNestsAndRecordsUse) {
  using flashinfer::api::bench::op_backend;
  using flashinfer::api::bench::ScopedOpBackend;
  EXPECT_EQ(op_backend("auto"), "auto");
  {
    ScopedOpBackend outer("cudnn");
    EXPECT_FALSE(outer.used());
    {
      ScopedOpBackend inner("cublas");
      EXPECT_EQ(op_backend("auto"), "cublas");
      EXPECT_TRUE(inner.used());
      EXPECT_FALSE(outer.used());
    }
    EXPECT_EQ(op_backend("auto"), "cudnn");
    EXPECT_TRUE(outer.used());
  }
  EXPECT_EQ(op_backend("cublas"), "cublas");
}

// % of the dense peak: the fp8 routines at 8 bits whatever --input_dtype, the other GEMMs at
// their input dtype, attention at q's; fp8 at twice the 16-bit rate from sm89 on.
TEST(Bench, OperandWidthAndDensePeakRate) {
  using flashinfer::api::bench::bench_operand_bits;
  using flashinfer::api::bench::dense_tensor_rate_vs_16bit;
  EXPECT_EQ(bench_operand_bits("bmm_fp8", 16, 16), 8);
  EXPECT_EQ(bench_operand_bits("grouped_mm_fp8", 16, 16), 8);
  EXPECT_EQ(bench_operand_bits("mm_bf16", 16, 8), 16);
  EXPECT_EQ(bench_operand_bits("grouped_mm_bf16", 16, 0), 16);
  EXPECT_EQ(bench_operand_bits("mm_fp4", 16, 16), 0);
  EXPECT_EQ(bench_operand_bits("BatchPrefillWithPagedKVCacheWrapper.run", 0, 16), 16);
  EXPECT_EQ(bench_operand_bits("BatchPrefillWithPagedKVCacheWrapper.run", 16, 8), 8);
  EXPECT_EQ(dense_tensor_rate_vs_16bit(90, 16), 1.0);
  EXPECT_EQ(dense_tensor_rate_vs_16bit(90, 8), 2.0);
  EXPECT_EQ(dense_tensor_rate_vs_16bit(89, 8), 2.0);
  EXPECT_EQ(dense_tensor_rate_vs_16bit(80, 8), 0.0);  // A100: no fp8 tensor cores
  EXPECT_EQ(dense_tensor_rate_vs_16bit(90, 0), 0.0);
}

// A row's repro_command starts with the kernel switches the bench ran with, so that it reruns the
// same kernels (a value that is not a plain word single-quoted for the shell); none set, none
// named.
TEST(Bench, ReproCommandCarriesTheKernelSwitchesSet) {
  const std::string bench = bench_cmd(
      "--routine rmsnorm --batch_size 4 --hidden_size 64 --backends cpu --num_iters 1 "
      "--dry_run_iters 0");
  std::string unset = "env";
  for (const auto& k : flashinfer::cli::kKernelSwitches) unset += std::string(" -u ") + k.name;
  CsvRun run = bench_csv(unset + " " + bench, "bench_switches.csv");
  ASSERT_EQ(run.cli.status, 0);
  const auto& rows = run.rows;
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].at("repro_command").rfind("flashinfer bench --routine rmsnorm ", 0), 0u)
      << rows[0].at("repro_command");
  run = bench_csv(
      unset + " FLASHINFER_DECODE_TENSOR_CORES=0 \"FLASHINFER_CPU_ONEDNN=it's off\" " + bench,
      "bench_switches.csv");
  ASSERT_EQ(run.cli.status, 0) << run.cli.out;
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]
                .at("repro_command")
                .rfind("FLASHINFER_DECODE_TENSOR_CORES=0 "
                       "FLASHINFER_CPU_ONEDNN='it'\\''s off' "
                       "flashinfer bench --routine rmsnorm ",
                       0),
            0u)
      << rows[0].at("repro_command");
}

// upstream's general flags: --case_tag and --generate_repro_command reach the CSV and the log,
// --no_cuda_graph and --use_cupti are taken and recorded (the CPU's steady clock either way, and
// no CUPTI warning without a CUDA backend); the printed command reruns the case; a testlist line
// of upstream's form carries them; a CSV written under other columns is refused, not appended to.
TEST(Bench, UpstreamsGeneralFlagsAreTakenAndRecorded) {
  const std::string args =
      "--routine rmsnorm --batch_size 4 --hidden_size 64 --backends cpu --num_iters 2 "
      "--dry_run_iters 0";
  CsvRun run = bench_csv(bench_cmd(args + " --no_cuda_graph --use_cupti --case_tag 'llama 8b' "
                                          "--generate_repro_command"),
                         "bench_general.csv");
  ASSERT_EQ(run.cli.status, 0) << run.cli.out;
  ASSERT_EQ(run.rows.size(), 1u);
  const auto row = run.rows[0];
  EXPECT_EQ(row.at("case_tag"), "llama 8b");
  EXPECT_EQ(row.at("no_cuda_graph"), "True");
  EXPECT_EQ(row.at("use_cupti"), "True");
  EXPECT_EQ(row.at("timing"), "steady_clock");
  const std::string repro = row.at("repro_command");
  EXPECT_NE(repro.find(" --no_cuda_graph --use_cupti --case_tag 'llama 8b'"), std::string::npos)
      << repro;
  EXPECT_NE(run.cli.out.find(
                "[INFO] To reproduce this test case, run the following command: " + repro + "\n"),
            std::string::npos)
      << run.cli.out;
  EXPECT_EQ(run.cli.out.find("CUPTI"), std::string::npos) << run.cli.out;
  ASSERT_EQ(repro.rfind("flashinfer bench ", 0), 0u);
  const CsvRun again =
      bench_csv(std::string(FLASHINFER_TEST_BIN_DIR) + "/" + repro, "bench_general_again.csv");
  ASSERT_EQ(again.cli.status, 0) << again.cli.out;
  ASSERT_EQ(again.rows.size(), 1u);
  EXPECT_EQ(again.rows[0].at("case_tag"), "llama 8b");
  EXPECT_EQ(again.rows[0].at("repro_command"), repro);

  // Defaults: no tag, graphs on (the CPU ignores them), no CUPTI.
  run = bench_csv(bench_cmd(args), "bench_general.csv");
  ASSERT_EQ(run.rows.size(), 1u);
  EXPECT_EQ(run.rows[0].at("case_tag"), "");
  EXPECT_EQ(run.rows[0].at("no_cuda_graph"), "False");
  EXPECT_EQ(run.rows[0].at("use_cupti"), "False");
  EXPECT_EQ(run.cli.out.find("To reproduce"), std::string::npos);

  const std::string list = testing::TempDir() + "bench_general.testlist";
  std::ofstream(list) << "--routine rmsnorm --batch_size 4 --hidden_size 64 --no_cuda_graph "
                         "--case_tag tagged_line\n";
  run = bench_csv(bench_cmd("--testlist " + list + " --backends cpu --num_iters 1"),
                  "bench_general.csv");
  ASSERT_EQ(run.cli.status, 0) << run.cli.out;
  ASSERT_EQ(run.rows.size(), 1u);
  EXPECT_EQ(run.rows[0].at("case_tag"), "tagged_line");
  std::filesystem::remove(list);

  const std::string old = testing::TempDir() + "bench_general_old.csv";
  std::ofstream(old) << "routine,median_time,std_time\nrmsnorm,1.0,0.0\n";
  const CliResult refused =
      flashinfer::testing::run_command(bench_cmd(args + " --output_path " + old));
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.out.find("output_path"), std::string::npos) << refused.out;
  EXPECT_NE(refused.out.find("other columns"), std::string::npos) << refused.out;
  std::ifstream in(old);
  const std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(kept, "routine,median_time,std_time\nrmsnorm,1.0,0.0\n");  // nothing appended
  std::filesystem::remove(old);
}

// upstream's calculate_rotation_count: no copies once a call's bytes are 5 L2s, else enough that
// 5 L2s of other data pass between two uses of one copy, and at least 2.
TEST(Bench, RotationCountIsUpstreamsFormula) {
  const int64_t l2 = 50 << 20;  // an H100's
  EXPECT_EQ(flashinfer::bench_rotation_count(0.0, l2), 1);
  EXPECT_EQ(flashinfer::bench_rotation_count(5.0 * l2, l2), 1);
  EXPECT_EQ(flashinfer::bench_rotation_count(6.0 * l2, l2), 1);
  EXPECT_EQ(flashinfer::bench_rotation_count(4.0 * l2, l2), 3);  // ceil(1.25) + 1
  EXPECT_EQ(flashinfer::bench_rotation_count(2.5 * l2, l2), 3);  // ceil(2) + 1
  EXPECT_EQ(flashinfer::bench_rotation_count(1 << 20, l2), 251);
  EXPECT_EQ(flashinfer::bench_rotation_count(5.0 * l2 - 1, l2), 3);
  EXPECT_EQ(flashinfer::bench_rotation_count(1e12, 0), 1);
}

// On a GPU: CUDA-graph timing (the default) captures 10 calls, rotating through input copies
// for a cold L2, and gives positive per-call times; rmsnorm's calls (a fresh result tensor each,
// kept by the allocator's capture hold) capture, and so do the block-table decode calls (MHA and
// MLA), which plan on the device. For the other routines the graph may be refused (a call that
// synchronizes): then the times are events' and the note says why, which this prints for the
// record.
TEST(BenchCuda, CudaGraphTimingCapturesTheCallsAndRotatesInputCopies) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  using flashinfer::BenchCase;
  using flashinfer::BenchShape;
  using flashinfer::BenchTimes;
  using flashinfer::BenchTiming;
  const flashinfer::Device gpu = flashinfer::Device::cuda(0);
  for (const char* routine :
       {"rmsnorm", "silu_and_mul", "BatchDecodeWithPagedKVCacheWrapper.run", "mm_bf16",
        "top_k_top_p_sampling_from_probs", "trtllm_batch_decode_with_kv_cache",
        "trtllm_batch_decode_with_kv_cache_mla"}) {
    SCOPED_TRACE(routine);
    const flashinfer::BenchHook* hook = flashinfer::find_bench_hook(routine);
    ASSERT_NE(hook, nullptr);
    BenchShape shape;
    shape.batch_size = 4;
    shape.hidden_size = 256;
    shape.m = shape.n = shape.k = 128;
    shape.vocab_size = 1024;
    const BenchCase first = (*hook)(shape, gpu);
    int made = 0;
    auto make = [&] {
      ++made;
      return (*hook)(shape, gpu);
    };
    BenchTiming timing;
    const BenchTimes t = flashinfer::bench_time(first, make, gpu, 2, 5, timing);
    std::printf("  %s: %s, %lld input copies%s%s\n", routine, t.method.c_str(),
                static_cast<long long>(t.input_copies), t.note.empty() ? "" : "; ", t.note.c_str());
    ASSERT_EQ(t.ms.size(), 5u);
    for (double ms : t.ms) EXPECT_GT(ms, 0.0);
    if (t.method == "cuda_graph") {
      EXPECT_TRUE(t.note.empty());
      EXPECT_EQ(t.input_copies, made + 1);  // the first case and the copies made
      EXPECT_LE(t.input_copies, 10);        // no more copies than calls in the graph
    } else {
      EXPECT_EQ(t.method, "cuda_events");
      EXPECT_FALSE(t.note.empty());
    }
    if (std::string(routine) == "rmsnorm") {
      EXPECT_EQ(t.method, "cuda_graph") << t.note;
      EXPECT_GE(t.input_copies, 2);  // a few KB a call: far below 5 L2s
    }
    // The block-table decode calls plan on the device since session 62 (nothing read back):
    // after the timing's warm-up call on its stream they capture.
    if (std::string(routine).rfind("trtllm_batch_decode", 0) == 0) {
      EXPECT_EQ(t.method, "cuda_graph") << t.note;
    }
    timing.cuda_graph = false;  // --no_cuda_graph
    const BenchTimes e = flashinfer::bench_time(first, make, gpu, 1, 3, timing);
    EXPECT_EQ(e.method, "cuda_events");
    EXPECT_EQ(e.ms.size(), 3u);
  }
}

}  // namespace
