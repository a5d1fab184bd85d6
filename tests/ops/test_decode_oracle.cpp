// The CUDA decode kernel (src/kernels/cuda/attention_decode_kernel.cuh) against two oracles on
// the same inputs: the CPU reference, and the first-draft CUDA-core kernel that ran correctly on
// an H100 (tests/oracle/, installed in place of the library's kernels for one run). Covers the
// block shapes the kernel picks (MHA, GQA 4 and 8, MQA 32 with two row chunks), bf16/fp16/fp8
// K/V, page sizes 1 and 16, empty and one-token requests, split-KV with the merge pass, and the
// variants (soft cap, sliding window, several queries per request, sinks). Skipped without a
// GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "ops/attention_test_util.h"
#include "util/test_util.h"
#if FLASHINFER_TEST_HAVE_ORACLES
#include <cuda_runtime.h>

#include <unistd.h>

#include <filesystem>

#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "oracle/attention_oracle.h"
#include "util/cuda_graph_util.h"
#include "util/upstream_dump_py.h"
#endif

namespace flashinfer {
namespace {

struct DecodeCase {
  DType q = DType::kBFloat16, kv = DType::kBFloat16;
  int64_t d = 128, hq = 32, hkv = 8, page = 16;
  std::vector<int32_t> lens{1, 17, 300, 64};
  int64_t q_len = 1;
  double soft_cap = 0.0;
  int64_t window = -1;
  std::optional<int64_t> split;  // fixed_split_size: forces the merge pass
  bool sinks = false;

  std::string str() const {
    return std::string(dtype_torch_name(q)) + "/" + std::string(dtype_torch_name(kv)) +
           " d=" + std::to_string(d) + " heads=" + std::to_string(hq) + ":" + std::to_string(hkv) +
           " page=" + std::to_string(page) + " q_len=" + std::to_string(q_len) +
           " cap=" + std::to_string(soft_cap) + " window=" + std::to_string(window) +
           " split=" + std::to_string(split.value_or(0)) + " sinks=" + std::to_string(sinks);
  }
};

struct Runs {
  // gpu: the library's choice of kernel; gpu_core: FLASHINFER_DECODE_TENSOR_CORES=0, the
  // CUDA-core kernel whatever the group.
  AttentionOutput cpu, gpu, gpu_core, oracle;
  bool gpu_split = false;  // the GPU plan split the keys (partials and the merge pass)
  // CUDA-core kernel launches (kernels::cuda::batch_decode_launches) of each GPU run.
  uint64_t core_launches = 0, core_launches_forced = 0;
};

// The packed rows of a request (queries x group) from which the library runs a plain decode on
// tensor cores (api::kDecodeTensorCoreMinRows) where the FA2 kernel takes the call (16-bit q,
// built head dims, fp8 K/V plain or soft-capped only): up to 16 packed rows in its 16-row blocks
// (head dims up to 192), more at any built dim.
bool expect_tensor_cores(const DecodeCase& c) {
  const int64_t packed = c.hq / c.hkv * c.q_len;
  const bool dims = c.d == 64 || c.d == 128 || (c.d == 256 && packed > 16);
  return packed >= 4 && dims;
}

Runs run_case(const DecodeCase& c) {
  const Device g = Device::cuda();
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged(c.lens, c.page, c.hkv, c.d, c.kv, false, true, 11, kd, vd);
  const int64_t batch = static_cast<int64_t>(c.lens.size());
  Tensor q = Tensor::empty({batch * c.q_len, c.hq, c.d}, c.q).uniform_(5);
  BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
  po.q_data_type = c.q;
  po.kv_data_type = c.kv;
  po.q_len_per_req = c.q_len;
  po.logits_soft_cap = c.soft_cap;
  po.window_left = c.window;
  po.fixed_split_size = c.split;
  AttentionRunOptions ro;
  ro.return_lse = true;
  if (c.sinks) ro.sinks = Tensor::empty({c.hq}, DType::kFloat32).uniform_(6);
  bool gpu_split = false;
  auto run = [&](Device d) {
    // 128 MiB: one-page chunks at page size 1 over 4100 keys are 5238 partial rows x 16.5 KB,
    // more than 32 MiB, where the plan would run unsplit.
    BatchDecodeWithPagedKVCacheWrapper w(Tensor::zeros({128 << 20}, DType::kUInt8, d));
    w.plan(f.indptr, f.indices, f.last_page_len, c.hq, c.hkv, c.d, c.page, po);
    if (d.is_cuda()) gpu_split = w.split_kv();
    AttentionRunOptions r = ro;
    if (r.sinks) r.sinks = r.sinks->to(d);
    return w.run(
        q.to(d),
        PagedKVCache(testing::to_keep_layout(f.k_cache, d), testing::to_keep_layout(f.v_cache, d)),
        r);
  };
  Runs r;
  r.cpu = run(Device::cpu());
  {
    const testing::ScopedEnv automatic("FLASHINFER_DECODE_TENSOR_CORES", nullptr);
    const uint64_t before = testing::cuda_core_decode_launches();
    r.gpu = run(g);
    r.core_launches = testing::cuda_core_decode_launches() - before;
    r.gpu_split = gpu_split;
  }
  {
    const testing::ScopedEnv core("FLASHINFER_DECODE_TENSOR_CORES", "0");
    const uint64_t before = testing::cuda_core_decode_launches();
    r.gpu_core = run(g);
    r.core_launches_forced = testing::cuda_core_decode_launches() - before;
    if (c.split) {
      EXPECT_TRUE(gpu_split) << "the CUDA-core plan ran unsplit";
    }
  }
#if FLASHINFER_TEST_HAVE_ORACLES
  {
    testing::ScopedAttentionOracle oracle;
    r.oracle = run(g);
  }
#endif
  return r;
}

void expect_matches(const DecodeCase& c) {
  SCOPED_TRACE(c.str());
  const Runs r = run_case(c);
  // A fixed split whose partials do not fit the workspace runs unsplit, silently.
  if (c.split) {
    EXPECT_TRUE(r.gpu_split) << "the plan ran unsplit";
  }
  // Which kernel ran: the CUDA-core kernel when forced, and by default below
  // kDecodeTensorCoreMinRows packed rows; the tensor-core kernel by default from there on where
  // it takes the call (everything here but the JIT head dims; sinks too).
  EXPECT_GT(r.core_launches_forced, 0u)
      << "FLASHINFER_DECODE_TENSOR_CORES=0 ran no CUDA-core kernel";
  if (expect_tensor_cores(c)) {
    EXPECT_EQ(r.core_launches, 0u) << "a GQA decode stayed on the CUDA-core kernel";
  } else {
    EXPECT_GT(r.core_launches, 0u) << "the CUDA-core kernel did not run";
  }
  const auto tol = testing::default_tolerance(c.q);
  for (const auto& [name, got] : {std::pair<const char*, const AttentionOutput*>{"default", &r.gpu},
                                  {"CUDA-core", &r.gpu_core}}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(testing::all_close(got->out, r.cpu.out, tol)) << "vs CPU";
    EXPECT_TRUE(testing::all_close(got->lse, r.cpu.lse, {2e-3, 1e-3})) << "lse vs CPU";
    if (r.oracle.out.defined()) {
      EXPECT_TRUE(testing::all_close(got->out, r.oracle.out, tol)) << "vs the oracle kernel";
      EXPECT_TRUE(testing::all_close(got->lse, r.oracle.lse, {1e-3, 1e-4})) << "lse vs oracle";
    }
  }
  if (r.oracle.out.defined()) {
    EXPECT_TRUE(testing::all_close(r.oracle.out, r.cpu.out, tol)) << "oracle vs CPU";
  }
}

TEST(DecodeKernelCuda, BlockShapesAndDtypesMatchCpuAndOracle) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (DType q : {DType::kBFloat16, DType::kFloat16}) {
    for (DType kv : {q, DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
      for (int64_t d : {64, 128, 256}) {
        // MHA (8 token groups), GQA 4, GQA 8, MQA 32 (two row chunks of 16)
        for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{8, 8}, {32, 8}, {16, 2}, {32, 1}}) {
          DecodeCase c;
          c.q = q;
          c.kv = kv;
          c.d = d;
          c.hq = hq;
          c.hkv = hkv;
          expect_matches(c);
        }
      }
    }
  }
}

// SmolLM2-135M's decode, the GPU demo's shape (docs/CHAT.md): fp16, 9 query heads over 3 KV
// heads (group 3: the CUDA-core kernel), head dim 64, page 16.
TEST(DecodeKernelCuda, TheDemoModelsShapeMatchesCpuAndOracle) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  DecodeCase c;
  c.q = c.kv = DType::kFloat16;
  c.d = 64;
  c.hq = 9;
  c.hkv = 3;
  c.page = 16;
  expect_matches(c);
}

TEST(DecodeKernelCuda, PageSizesLengthsAndSplitsMatchCpuAndOracle) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (int64_t page : {1, 16, 5}) {
    for (std::optional<int64_t> split : {std::optional<int64_t>{}, {1}, {3}}) {
      DecodeCase c;
      c.page = page;
      c.lens = {0, 1, 2, 7, 129, 1000, 4100};  // empty, single-token, stage tails, several fills
      c.split = split;
      expect_matches(c);
    }
  }
}

TEST(DecodeKernelCuda, VariantsMatchCpuAndOracle) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (DType kv : {DType::kBFloat16, DType::kFloat8E4M3FN}) {
    DecodeCase c;
    c.kv = kv;
    c.soft_cap = 30.0;  // kDecodeSoftCap
    expect_matches(c);
    c.soft_cap = 0.0;
    c.window = 50;  // the block's key range alone (one query per block)
    expect_matches(c);
    // kDecodeMask: rows of three queries share a block. The queries are each request's last
    // tokens, so every request holds at least three keys (plan refuses fewer); the shortest
    // holds exactly three, its first query seeing one key.
    c.q_len = 3;
    c.lens = {3, 17, 300, 64};
    expect_matches(c);
    c.soft_cap = 20.0;
    c.split = 2;
    expect_matches(c);  // both bits, split
    c = DecodeCase{};
    c.kv = kv;
    c.sinks = true;
    expect_matches(c);
    c.split = 4;
    expect_matches(c);  // sinks join in the merge pass
  }
}

// pos_encoding_mode="ALIBI": the decode kernel's ALiBi variant (built by the JIT on first use),
// with and without a soft cap and split-KV, against the CPU reference (the oracle kernel has no
// ALiBi term).
TEST(DecodeKernelCuda, AlibiMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged({1, 40, 700}, 16, 2, 128, DType::kFloat16, false, true, 9, kd, vd);
  Tensor q = Tensor::empty({3, 8, 128}, DType::kFloat16).uniform_(10);
  for (double cap : {0.0, 30.0}) {
    for (std::optional<int64_t> split : {std::optional<int64_t>{}, {2}}) {
      BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
      po.q_data_type = DType::kFloat16;
      po.pos_encoding_mode = "ALIBI";
      po.logits_soft_cap = cap;
      po.fixed_split_size = split;
      AttentionRunOptions ro;
      ro.return_lse = true;
      bool gpu_split = false;
      auto run = [&](Device d) {
        BatchDecodeWithPagedKVCacheWrapper w(Tensor::zeros({8 << 20}, DType::kUInt8, d));
        w.plan(f.indptr, f.indices, f.last_page_len, 8, 2, 128, 16, po);
        if (d.is_cuda()) gpu_split = w.split_kv();
        return w.run(q.to(d),
                     PagedKVCache(testing::to_keep_layout(f.k_cache, d),
                                  testing::to_keep_layout(f.v_cache, d)),
                     ro);
      };
      const AttentionOutput ref = run(Device::cpu()), got = run(Device::cuda());
      if (split) {
        EXPECT_TRUE(gpu_split) << "the plan ran unsplit";
      }
      EXPECT_TRUE(testing::all_close(got.out, ref.out, testing::default_tolerance(DType::kFloat16)))
          << "cap " << cap << " split " << split.value_or(0);
      EXPECT_TRUE(testing::all_close(got.lse, ref.lse, {2e-3, 1e-3}))
          << "cap " << cap << " split " << split.value_or(0);
    }
  }
}

// Non-AOT head dims go through NVRTC (the same kernel): 96, and 80 whose lane slice (10 bf16) is
// not whole 16-byte units, so the block-wide copy loop runs.
TEST(DecodeKernelCuda, JitHeadDimsMatchCpuAndOracle) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  // 32: two rows a thread on the CUDA-core kernel (group 4), the one 16-bit JIT dim that takes
  // them. Each dim needs its oracle instance (tests/oracle/attention_oracle.cu's dispatch_dims).
  for (int64_t d : {96, 80, 48, 32}) {
    DecodeCase c;
    c.d = d;
    c.split = 2;
    expect_matches(c);
  }
}

// A q view whose rows are not on 16-byte boundaries is copied to an aligned buffer first; the
// result is the same as with an aligned q.
TEST(DecodeKernelCuda, MisalignedQueryViewMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged({20, 33}, 16, 2, 64, DType::kFloat16, false, true, 3, kd, vd);
  Tensor big = Tensor::empty({2, 8 * 64 + 1}, DType::kFloat16).uniform_(4);
  Tensor q = big.slice(1, 1, 8 * 64 + 1).reshape({2, 8, 64});  // offset by one element
  BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
  po.q_data_type = DType::kFloat16;
  auto run = [&](Device d) {
    BatchDecodeWithPagedKVCacheWrapper w(Tensor::zeros({8 << 20}, DType::kUInt8, d));
    w.plan(f.indptr, f.indices, f.last_page_len, 8, 2, 64, 16, po);
    return w
        .run(testing::to_keep_layout(q, d), PagedKVCache(testing::to_keep_layout(f.k_cache, d),
                                                         testing::to_keep_layout(f.v_cache, d)))
        .out;
  };
  const Tensor ref = run(Device::cpu());
  for (const char* tc : {static_cast<const char*>(nullptr), "0"}) {  // both decode kernels
    const testing::ScopedEnv env("FLASHINFER_DECODE_TENSOR_CORES", tc);
    EXPECT_TRUE(testing::all_close(run(g), ref, testing::default_tolerance(DType::kFloat16)))
        << (tc ? "FLASHINFER_DECODE_TENSOR_CORES=0" : "default");
  }
}

#if FLASHINFER_TEST_HAVE_ORACLES
// use_cuda_graph: a graph captured after one plan, replayed after a re-plan with other lengths
// (split one way, unsplit the other: fixed 8-page chunks, then disable_split_kv, since on a
// 132-SM device the planner's own rule splits both), computes the new plan. The padded grid, the
// padding blocks' valid test and the fixed plan-array layout are what make this hold.
// `later_env`: FLASHINFER_DECODE_TENSOR_CORES for the re-plans after the capture (nullptr:
// unchanged): the first plan's route must hold (api::decode_route_held), so the replays still
// match and no plain-decode kernel launch is asked for on a route the graph does not hold.
// `alibi`: the plans with pos_encoding_mode "ALIBI" (the slopes' device copy is refilled in
// place by a re-plan: the graph holds its address).
void check_graph_replay_after_replan(const char* later_env = nullptr, bool alibi = false) {
  const Device g = Device::cuda();
  const int64_t page = 16, hq = 32, hkv = 8, d = 128;
  const std::vector<int32_t> cap{4000, 5000, 900, 64};  // the cache holds the longest of both
  const std::vector<std::vector<int32_t>> lens{{300, 5000, 17, 64}, {4000, 1, 900, 2}};
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged(cap, page, hkv, d, DType::kBFloat16, false, true, 13, kd, vd);
  // Plan i uses the first pages of each request's page list.
  auto table = [&](const std::vector<int32_t>& l) {
    return testing::first_pages_table(f, page, l);
  };
  Tensor q = Tensor::empty({4, hq, d}, DType::kBFloat16).uniform_(3);
  BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
  po.q_data_type = DType::kBFloat16;
  if (alibi) po.pos_encoding_mode = "ALIBI";
  std::vector<AttentionOutput> ref;
  for (const auto& l : lens) {
    BatchDecodeWithPagedKVCacheWrapper cpu(Tensor::zeros({32 << 20}, DType::kUInt8));
    auto [indptr, indices, last] = table(l);
    cpu.plan(indptr, indices, last, hq, hkv, d, page, po);
    AttentionRunOptions ro;
    ro.return_lse = true;
    ref.push_back(cpu.run(q, f.cache(), ro));
  }

  BatchDecodeWithPagedKVCacheWrapper w(Tensor::zeros({64 << 20}, DType::kUInt8, g), "NHD",
                                       /*use_cuda_graph=*/true);
  const Tensor qd = q.to(g);
  const PagedKVCache cache(testing::to_keep_layout(f.k_cache, g),
                           testing::to_keep_layout(f.v_cache, g));
  AttentionRunOptions ro;
  ro.return_lse = true;
  ro.out = Tensor::zeros({4, hq, d}, DType::kBFloat16, g);
  ro.lse = Tensor::zeros({4, hq}, DType::kFloat32, g);
  // Plan 0 splits (8-page chunks), plan 1 does not.
  auto plan_options = [&](std::size_t i) {
    BatchDecodeWithPagedKVCacheWrapper::PlanOptions o = po;
    if (i == 0) {
      o.fixed_split_size = 8;
    } else {
      o.disable_split_kv = true;
    }
    return o;
  };
  {
    auto [indptr, indices, last] = table(lens[0]);
    w.plan(indptr, indices, last, hq, hkv, d, page, plan_options(0));
    EXPECT_TRUE(w.split_kv()) << "plan 0 ran unsplit";
  }
  testing::ReplayableGraph graph;
  if (alibi) {
    // As engines warm up before capturing: ALiBi's kernel comes from the JIT, compiled and
    // loaded at its first run.
    w.run(qd, cache, ro);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, [&] { w.run(qd, cache, ro); }));
  std::optional<testing::ScopedEnv> switched;
  if (later_env) switched.emplace("FLASHINFER_DECODE_TENSOR_CORES", later_env);
  for (int round = 0; round < 3; ++round) {
    const std::size_t i = static_cast<std::size_t>(round % 2 == 0 ? 1 : 0);
    auto [indptr, indices, last] = table(lens[i]);
    w.plan(indptr, indices, last, hq, hkv, d, page, plan_options(i));
    EXPECT_EQ(w.split_kv(), i == 0) << "round " << round;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
    EXPECT_TRUE(
        testing::all_close(*ro.out, ref[i].out, testing::default_tolerance(DType::kBFloat16)))
        << "round " << round;
    EXPECT_TRUE(testing::all_close(*ro.lse, ref[i].lse, {2e-3, 1e-3})) << "round " << round;
  }
  if (later_env) {
    // An eager run of the last plan: the first plan's route (tensor cores at group 4 by
    // default) still, so no CUDA-core launch, and the CPU's numbers.
    const uint64_t before = testing::cuda_core_decode_launches();
    w.run(qd, cache, ro);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(testing::cuda_core_decode_launches(), before)
        << "a re-plan changed the captured wrapper's kernel";
    EXPECT_TRUE(
        testing::all_close(*ro.out, ref[1].out, testing::default_tolerance(DType::kBFloat16)));
  }
  // A batch larger than the first plan's does not fit the captured grid.
  {
    EXPECT_FI_ERROR(
        w.plan(testing::int_tensor({0, 1, 2, 3, 4, 5}), testing::int_tensor({0, 1, 2, 3, 4}),
               testing::int_tensor({16, 16, 16, 16, 16}), hq, hkv, d, page, po),
        "BatchDecodeWithPagedKVCacheWrapper.plan", "indptr");
  }
  cudaGraphExecDestroy(graph.exec);
  cudaGraphDestroy(graph.graph);
  cudaStreamDestroy(graph.stream);
}

// Group 4: by default on tensor cores (the FA2 kernel's padded grid), and forced onto the
// CUDA-core kernel.
TEST(DecodeKernelCuda, CudaGraphReplayedAfterReplanMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (const char* tc : {static_cast<const char*>(nullptr), "0"}) {
    SCOPED_TRACE(tc ? "FLASHINFER_DECODE_TENSOR_CORES=0" : "default");
    const testing::ScopedEnv env("FLASHINFER_DECODE_TENSOR_CORES", tc);
    check_graph_replay_after_replan();
  }
  // Captured on tensor cores (the default at group 4), re-planned with the switch off.
  const testing::ScopedEnv automatic("FLASHINFER_DECODE_TENSOR_CORES", nullptr);
  check_graph_replay_after_replan("0");
  // ALiBi (the CUDA-core kernel's variant): the re-plans keep the slopes' address.
  {
    SCOPED_TRACE("ALiBi");
    check_graph_replay_after_replan(nullptr, true);
  }
}

// use_cuda_graph as the engines build their decode graphs (the engine-call audit of session 80):
// device buffers for the page table given to the constructor, use_tensor_cores=True, a batch
// padded with requests of no pages and last_page_len 1 (vLLM's graph padding), float k_scale /
// v_scale at run; vLLM's form at page 16 with a 5-D cache, SGLang's at page 1 with its 3-D K/V
// pools; bf16 and fp8 e4m3 caches. One capture, then steps with one more token a request
// (re-planned into the buffers) and back, each replay against the CPU reference.
struct EngineGraphCase {
  const char* label;
  int64_t page, hq, hkv;
  bool pools;  // SGLang's 3-D (k, v) pair (page 1)
  DType kv;
};

void check_engine_graph_decode(const EngineGraphCase& c) {
  SCOPED_TRACE(::testing::Message() << c.label << " " << dtype_torch_name(c.kv));
  const Device g = Device::cuda();
  const int64_t d = 128, batch = 6;  // 4 requests and 2 of padding
  const std::vector<std::vector<int32_t>> steps{{300, 1, 77, 2048}, {301, 2, 78, 2049}};
  const std::vector<int32_t> cap{301, 2, 78, 2049};
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged(cap, c.page, c.hkv, d, DType::kBFloat16, false, false, 17, kd, vd);
  const Tensor cache5 = f.cache5.to(c.kv);
  auto table = [&](const std::vector<int32_t>& l) {  // padded as the engines pad their graphs
    return testing::first_pages_table(f, c.page, l, static_cast<std::size_t>(batch));
  };
  const Tensor q = Tensor::empty({batch, c.hq, d}, DType::kBFloat16).uniform_(3);
  BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
  po.q_data_type = DType::kBFloat16;
  po.kv_data_type = c.kv;
  AttentionRunOptions ro;
  ro.k_scale = 0.75;
  ro.v_scale = 1.5;
  std::vector<Tensor> ref;
  for (const auto& l : steps) {
    BatchDecodeWithPagedKVCacheWrapper cpu(Tensor::zeros({32 << 20}, DType::kUInt8), "NHD", false,
                                           true);
    auto [indptr, indices, last] = table(l);
    cpu.plan(indptr, indices, last, c.hq, c.hkv, d, c.page, po);
    ref.push_back(cpu.run(q, PagedKVCache(cache5), ro).out);
  }
  const Tensor c5 = testing::to_keep_layout(cache5, g);
  const PagedKVCache cache =
      c.pools ? PagedKVCache(c5.select(1, 0).squeeze(1), c5.select(1, 1).squeeze(1))
              : PagedKVCache(c5);
  const int64_t max_pages = f.indices.size(0);
  BatchDecodeWithPagedKVCacheWrapper w(Tensor::zeros({64 << 20}, DType::kUInt8, g), "NHD",
                                       /*use_cuda_graph=*/true, /*use_tensor_cores=*/true,
                                       Tensor::zeros({batch + 1}, DType::kInt32, g),
                                       Tensor::zeros({max_pages}, DType::kInt32, g),
                                       Tensor::zeros({batch}, DType::kInt32, g));
  const Tensor qd = q.to(g);
  ro.out = Tensor::zeros({batch, c.hq, d}, DType::kBFloat16, g);
  {
    auto [indptr, indices, last] = table(steps[0]);
    w.plan(indptr, indices, last, c.hq, c.hkv, d, c.page, po);
  }
  // The engines' warm-up (an eager step on the capture stream), then the capture.
  testing::ReplayableGraph graph;
  ASSERT_NO_FATAL_FAILURE(testing::warm_up_for_replay(graph, [&] { w.run(qd, cache, ro); }));
  EXPECT_TRUE(testing::all_close(*ro.out, ref[0], testing::default_tolerance(DType::kBFloat16)));
  ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, [&] { w.run(qd, cache, ro); }));
  for (int round = 0; round < 3; ++round) {
    const std::size_t i = static_cast<std::size_t>(round % 2 == 0 ? 1 : 0);
    auto [indptr, indices, last] = table(steps[i]);
    w.plan(indptr, indices, last, c.hq, c.hkv, d, c.page, po);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
    EXPECT_TRUE(testing::all_close(*ro.out, ref[i], testing::default_tolerance(DType::kBFloat16)))
        << "round " << round;
  }
  cudaGraphExecDestroy(graph.exec);
  cudaGraphDestroy(graph.graph);
  cudaStreamDestroy(graph.stream);
}

TEST(DecodeKernelCuda, CudaGraphAsTheEnginesCaptureDecode) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (DType kv : {DType::kBFloat16, DType::kFloat8E4M3FN}) {
    check_engine_graph_decode({"vLLM: page 16, 5-D cache, 32:8", 16, 32, 8, false, kv});
    check_engine_graph_decode({"SGLang: page 1, 3-D K/V pools, 16:2", 1, 16, 2, true, kv});
  }
}

// use_cuda_graph: the plan arrays a captured graph reads keep their addresses. With a
// paged_kv_indices_buffer of 70000 ids a re-plan of 69000 page ids (past the 65536-element floor
// of the device arrays) still replays as the eager run computes; one of 72000 is refused naming
// the page ids, as upstream refuses more than the buffer holds, and run() then refuses too. A
// wrapper without the buffer refuses a re-plan past the floor. (Before, such a re-plan moved the
// arrays and the graph read freed memory.) Page ids repeat over a small cache.
TEST(DecodeKernelCuda, CudaGraphReplanPastThePageBufferIsRefused) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int64_t page = 16, hq = 32, hkv = 8, d = 128, cache_pages = 64;
  const char* op = "BatchDecodeWithPagedKVCacheWrapper.plan";
  const Tensor k_cache =
      Tensor::empty({cache_pages, page, hkv, d}, DType::kFloat32).uniform_(5).to(DType::kBFloat16);
  const Tensor v_cache =
      Tensor::empty({cache_pages, page, hkv, d}, DType::kFloat32).uniform_(6).to(DType::kBFloat16);
  const PagedKVCache cache(k_cache.to(g), v_cache.to(g));
  // Two requests of `pages` pages each, the ids cycling over the cache.
  auto table = [&](int32_t pages) {
    std::vector<int32_t> indices(static_cast<std::size_t>(2 * pages));
    for (std::size_t i = 0; i < indices.size(); ++i) {
      indices[i] = static_cast<int32_t>((i * 7) % cache_pages);
    }
    return std::tuple{testing::int_tensor({0, pages, 2 * pages}), testing::int_tensor(indices),
                      testing::int_tensor({static_cast<int32_t>(page), 5})};
  };
  const Tensor q =
      Tensor::empty({2, hq, d}, DType::kFloat32).uniform_(7).to(DType::kBFloat16).to(g);
  BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
  po.q_data_type = DType::kBFloat16;
  AttentionRunOptions ro;
  ro.out = Tensor::zeros({2, hq, d}, DType::kBFloat16, g);
  {
    BatchDecodeWithPagedKVCacheWrapper w(Tensor::zeros({64 << 20}, DType::kUInt8, g), "NHD",
                                         /*use_cuda_graph=*/true, false, std::nullopt,
                                         Tensor::zeros({70000}, DType::kInt32, g));
    auto [p0, i0, l0] = table(4);
    w.plan(p0, i0, l0, hq, hkv, d, page, po);
    testing::ReplayableGraph graph;
    ASSERT_NO_FATAL_FAILURE(testing::warm_up_for_replay(graph, [&] { w.run(q, cache, ro); }));
    ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, [&] { w.run(q, cache, ro); }));
    auto [p1, i1, l1] = table(34500);
    w.plan(p1, i1, l1, hq, hkv, d, page, po);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
    const Tensor replayed = ro.out->to(Device::cpu());
    const Tensor eager = w.run(q, cache).out.to(Device::cpu());
    EXPECT_TRUE(testing::all_close(replayed, eager, {0.0, 0.0}))
        << "the replay after a re-plan within the buffer differs from the eager run";
    auto [p2, i2, l2] = table(36000);
    EXPECT_FI_ERROR(w.plan(p2, i2, l2, hq, hkv, d, page, po), op, "indices");
    EXPECT_FI_ERROR(w.run(q, cache), "BatchDecodeWithPagedKVCacheWrapper.run", "self");
    cudaGraphExecDestroy(graph.exec);
    cudaGraphDestroy(graph.graph);
    cudaStreamDestroy(graph.stream);
  }
  {
    BatchDecodeWithPagedKVCacheWrapper w(Tensor::zeros({64 << 20}, DType::kUInt8, g), "NHD",
                                         /*use_cuda_graph=*/true);
    auto [p0, i0, l0] = table(4);
    w.plan(p0, i0, l0, hq, hkv, d, page, po);
    auto [p1, i1, l1] = table(35000);
    EXPECT_FI_ERROR(w.plan(p1, i1, l1, hq, hkv, d, page, po), op, "indices");
  }
}

// A bf16 paged cache of `pages` pages (NHD, uniform random) on `g`: the graph re-plan tests'.
PagedKVCache bf16_cache_on(Device g, int64_t pages, int64_t page, int64_t hkv, int64_t d) {
  auto part = [&](uint64_t seed) {
    return Tensor::empty({pages, page, hkv, d}, DType::kFloat32)
        .uniform_(seed)
        .to(DType::kBFloat16)
        .to(g);
  };
  return PagedKVCache(part(5), part(6));
}

// use_cuda_graph without a page-index buffer: plan copies the ids, and a captured graph replays
// them against the cache it captured with no run() to check them. A re-plan whose ids stay in
// that cache replays; one with an id past it is refused naming the ids (before, the replay read
// past the cache: a review found it in session 79); before any capture a plan is not held to a
// cache (run() checks). Compiled, not run.
TEST(DecodeKernelCuda, CudaGraphReplanPastTheCapturedCacheIsRefused) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int64_t page = 16, hq = 32, hkv = 8, d = 128, cache_pages = 64;
  const char* op = "BatchDecodeWithPagedKVCacheWrapper.plan";
  const PagedKVCache cache = bf16_cache_on(g, cache_pages, page, hkv, d);
  // Two requests of three pages each; `top` is the second request's last id.
  auto plan = [&](BatchDecodeWithPagedKVCacheWrapper& w, int32_t top) {
    BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
    po.q_data_type = DType::kBFloat16;
    w.plan(testing::int_tensor({0, 3, 6}), testing::int_tensor({0, 1, 2, 3, 4, top}),
           testing::int_tensor({16, 5}), hq, hkv, d, page, po);
  };
  const Tensor q =
      Tensor::empty({2, hq, d}, DType::kFloat32).uniform_(7).to(DType::kBFloat16).to(g);
  AttentionRunOptions ro;
  ro.out = Tensor::zeros({2, hq, d}, DType::kBFloat16, g);
  BatchDecodeWithPagedKVCacheWrapper w(Tensor::zeros({64 << 20}, DType::kUInt8, g), "NHD",
                                       /*use_cuda_graph=*/true);
  plan(w, 5);
  testing::ReplayableGraph graph;
  ASSERT_NO_FATAL_FAILURE(testing::warm_up_for_replay(graph, [&] { w.run(q, cache, ro); }));
  ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, [&] { w.run(q, cache, ro); }));
  plan(w, static_cast<int32_t>(cache_pages - 1));  // the cache's last page: replays
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
  const Tensor replayed = ro.out->to(Device::cpu());
  EXPECT_TRUE(testing::all_close(replayed, w.run(q, cache).out.to(Device::cpu()), {0.0, 0.0}));
  EXPECT_FI_ERROR(plan(w, static_cast<int32_t>(cache_pages)), op, "indices");
  cudaGraphExecDestroy(graph.exec);
  cudaGraphDestroy(graph.graph);
  cudaStreamDestroy(graph.stream);
  // No capture yet: nothing to hold the plan to.
  BatchDecodeWithPagedKVCacheWrapper fresh(Tensor::zeros({64 << 20}, DType::kUInt8, g), "NHD",
                                           /*use_cuda_graph=*/true);
  plan(fresh, static_cast<int32_t>(cache_pages));
  EXPECT_FI_ERROR(fresh.run(q, cache), "BatchDecodeWithPagedKVCacheWrapper.run", "paged_kv_cache");
}

// The same rule for backend "trtllm-gen", whose kernels read request b's pages from
// block_tables[b]: a re-plan whose table names a page past the captured cache is refused naming
// block_tables (it was checked against the indices, which that backend never reads: a table past
// the cache replayed out of bounds, stale indices refused a good plan). Compiled, not run.
TEST(DecodeKernelCuda, CudaGraphReplanOfATablePastTheCapturedCacheIsRefused) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int64_t page = 16, hq = 32, hkv = 8, d = 128, cache_pages = 64;
  const PagedKVCache cache = bf16_cache_on(g, cache_pages, page, hkv, d);
  // Two requests of three pages; the indices are stale (past the cache) and never read.
  auto plan = [&](BatchDecodeWithPagedKVCacheWrapper& w, int32_t top) {
    BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
    po.q_data_type = DType::kBFloat16;
    po.block_tables = testing::int_tensor({0, 1, 2, 3, 4, top}).reshape({2, 3});
    w.plan(testing::int_tensor({0, 3, 6}), testing::int_tensor({900, 901, 902, 903, 904, 905}),
           testing::int_tensor({16, 5}), hq, hkv, d, page, po);
  };
  const Tensor q =
      Tensor::empty({2, hq, d}, DType::kFloat32).uniform_(7).to(DType::kBFloat16).to(g);
  AttentionRunOptions ro;
  ro.out = Tensor::zeros({2, hq, d}, DType::kBFloat16, g);
  BatchDecodeWithPagedKVCacheWrapper w(Tensor::zeros({64 << 20}, DType::kUInt8, g), "NHD",
                                       /*use_cuda_graph=*/true, false, std::nullopt, std::nullopt,
                                       std::nullopt, "trtllm-gen");
  plan(w, 5);
  testing::ReplayableGraph graph;
  ASSERT_NO_FATAL_FAILURE(testing::warm_up_for_replay(graph, [&] { w.run(q, cache, ro); }));
  ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, [&] { w.run(q, cache, ro); }));
  plan(w, static_cast<int32_t>(cache_pages - 1));  // stale indices, a good table: taken
  EXPECT_FI_ERROR(plan(w, static_cast<int32_t>(cache_pages)),
                  "BatchDecodeWithPagedKVCacheWrapper.plan", "block_tables");
  cudaGraphExecDestroy(graph.exec);
  cudaGraphDestroy(graph.graph);
  cudaStreamDestroy(graph.stream);
}

// Upstream's kernels read the page ids when they run (kernels/page_guard.h): under use_cuda_graph
// plan copies them into the constructor's buffer, and a replay reads that buffer, so ids written
// into it after plan (no new plan) are the ones attended over; an id outside the cache makes its
// request's rows NaN, the other request still matches, and good ids again give both back. Eager
// calls read plan's device tensor at run with FLASHINFER_PAGE_IDS_AT_RUN=1 and copy it at plan
// without. Each result against the CPU over the ids the call saw.
TEST(DecodeKernelCuda, PageIdsAreReadWhenTheCallRuns) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int64_t page = 16, hq = 32, hkv = 8, d = 128, cache_pages = 64;
  const Tensor k_cache =
      Tensor::empty({cache_pages, page, hkv, d}, DType::kFloat32).uniform_(15).to(DType::kBFloat16);
  const Tensor v_cache =
      Tensor::empty({cache_pages, page, hkv, d}, DType::kFloat32).uniform_(16).to(DType::kBFloat16);
  const PagedKVCache cache_cpu(k_cache, v_cache);
  const PagedKVCache cache(k_cache.to(g), v_cache.to(g));
  const Tensor indptr = testing::int_tensor({0, 4, 9}), last = testing::int_tensor({16, 5});
  auto ids = [&](int32_t mul, int32_t add) {
    std::vector<int32_t> v(9);
    for (std::size_t i = 0; i < v.size(); ++i) {
      v[i] = static_cast<int32_t>((static_cast<int32_t>(i) * mul + add) % cache_pages);
    }
    return v;
  };
  const std::vector<int32_t> ids_a = ids(7, 0), ids_b = ids(5, 3);
  const Tensor q_cpu = Tensor::empty({2, hq, d}, DType::kFloat32).uniform_(17).to(DType::kBFloat16);
  const Tensor q = q_cpu.to(g);
  BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
  po.q_data_type = DType::kBFloat16;
  auto cpu_ref = [&](const std::vector<int32_t>& v) {
    BatchDecodeWithPagedKVCacheWrapper w(Tensor::zeros({8 << 20}, DType::kUInt8));
    w.plan(indptr, testing::int_tensor(v), last, hq, hkv, d, page, po);
    AttentionRunOptions ro;
    ro.return_lse = true;
    return w.run(q_cpu, cache_cpu, ro);
  };
  const AttentionOutput ref_a = cpu_ref(ids_a), ref_b = cpu_ref(ids_b);
  const auto tol = testing::default_tolerance(DType::kBFloat16);
  auto write = [&](Tensor& buf, const std::vector<int32_t>& v) {
    buf.slice(0, 0, static_cast<int64_t>(v.size())).copy_(testing::int_tensor(v));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  };
  AttentionRunOptions ro;
  ro.out = Tensor::zeros({2, hq, d}, DType::kBFloat16, g);
  ro.lse = Tensor::zeros({2, hq}, DType::kFloat32, g);
  auto matches = [&](const AttentionOutput& ref) {
    EXPECT_TRUE(testing::all_close(ro.out->to(Device::cpu()), ref.out, tol));
    EXPECT_TRUE(testing::all_close(ro.lse->to(Device::cpu()), ref.lse, {2e-3, 1e-3}));
  };
  {
    SCOPED_TRACE("use_cuda_graph: plan with the buffer (stale ids), then the ids, then replays");
    Tensor buf = Tensor::zeros({16}, DType::kInt32, g);
    BatchDecodeWithPagedKVCacheWrapper w(Tensor::zeros({64 << 20}, DType::kUInt8, g), "NHD",
                                         /*use_cuda_graph=*/true, false, std::nullopt, buf);
    w.plan(indptr, buf, last, hq, hkv, d, page, po);
    write(buf, ids_a);
    testing::ReplayableGraph graph;
    ASSERT_NO_FATAL_FAILURE(testing::warm_up_for_replay(graph, [&] { w.run(q, cache, ro); }));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    matches(ref_a);
    ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, [&] { w.run(q, cache, ro); }));
    auto replay = [&] {
      ro.out->fill_(0.0);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
    };
    write(buf, ids_b);
    replay();
    matches(ref_b);
    std::vector<int32_t> bad = ids_b;
    bad[6] = static_cast<int32_t>(cache_pages);  // request 1's third page: past the cache
    write(buf, bad);
    replay();
    const Tensor out = ro.out->to(Device::cpu()), lse = ro.lse->to(Device::cpu());
    EXPECT_TRUE(testing::all_close(out.select(0, 0), ref_b.out.select(0, 0), tol));
    for (double x : out.select(0, 1).to_double_vector()) ASSERT_TRUE(std::isnan(x));
    for (double x : lse.select(0, 1).to_double_vector()) ASSERT_TRUE(std::isnan(x));
    write(buf, ids_b);
    replay();
    matches(ref_b);
    // Another tensor: plan copies its ids into the buffer, as upstream's plan does.
    w.plan(indptr, testing::int_tensor(ids_a), last, hq, hkv, d, page, po);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    replay();
    matches(ref_a);
    cudaGraphExecDestroy(graph.exec);
    cudaGraphDestroy(graph.graph);
    cudaStreamDestroy(graph.stream);
  }
  {
    SCOPED_TRACE("eager: read at run with FLASHINFER_PAGE_IDS_AT_RUN=1, else copied at plan");
    BatchDecodeWithPagedKVCacheWrapper w(Tensor::zeros({64 << 20}, DType::kUInt8, g));
    Tensor dev = testing::int_tensor(ids_a).to(g);
    {
      const testing::ScopedEnv at_run("FLASHINFER_PAGE_IDS_AT_RUN", "1");
      w.plan(indptr, dev, last, hq, hkv, d, page, po);
    }
    write(dev, ids_b);
    w.run(q, cache, ro);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    matches(ref_b);
    w.plan(indptr, dev, last, hq, hkv, d, page, po);
    write(dev, ids_a);
    w.run(q, cache, ro);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    matches(ref_b);
  }
}
// The recorder's extension of the paged decode wrapper's run (api/attention_ids_at_run.cpp): a
// wrapper reading its page ids at run (FLASHINFER_PAGE_IDS_AT_RUN=1) whose ids were rewritten
// after plan records them as fi_ext__kv_indices_at_run, and the dump replays on the CPU, every
// call passing (over plan's ids, the run's output would not match). Compiled, not run.
TEST(DecodeKernelCuda, DumpOfIdsWrittenAfterPlanReplaysWithTheIdsRunRead) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  namespace fs = std::filesystem;
  const Device g = Device::cuda();
  const int64_t page = 16, hq = 8, hkv = 2, d = 128, cache_pages = 16;
  const Tensor k_cache =
      Tensor::empty({cache_pages, page, hkv, d}, DType::kFloat32).uniform_(25).to(DType::kBFloat16);
  const Tensor v_cache =
      Tensor::empty({cache_pages, page, hkv, d}, DType::kFloat32).uniform_(26).to(DType::kBFloat16);
  const PagedKVCache cache(k_cache.to(g), v_cache.to(g));
  const Tensor q =
      Tensor::empty({2, hq, d}, DType::kFloat32).uniform_(27).to(DType::kBFloat16).to(g);
  const std::vector<int32_t> ids_a{0, 1, 2, 3, 4}, ids_b{9, 4, 12, 1, 15};
  BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
  po.q_data_type = DType::kBFloat16;
  const fs::path dir =
      fs::temp_directory_path() / ("fi_decode_ids_dump_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg, [](const std::string&) {});
  {
    const testing::ScopedEnv at_run("FLASHINFER_PAGE_IDS_AT_RUN", "1");
    BatchDecodeWithPagedKVCacheWrapper w(Tensor::zeros({64 << 20}, DType::kUInt8, g));
    Tensor dev = testing::int_tensor(ids_a).to(g);
    w.plan(testing::int_tensor({0, 3, 5}), dev, testing::int_tensor({7, 16}), hq, hkv, d, page, po);
    dev.copy_(testing::int_tensor(ids_b));
    w.run(q, cache);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  recorder::stop();
  testing::replay_expecting_every_call_to_pass(dir, 3u);  // __init__, plan, run: on the CPU
  fs::remove_all(dir);
}
#endif

}  // namespace
}  // namespace flashinfer
