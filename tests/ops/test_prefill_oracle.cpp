// The CUDA FA2 prefill kernel (src/kernels/cuda/prefill_kernel.cuh) against three oracles on the
// same inputs: the CPU reference, the first-draft CUDA-core kernel and the first-draft
// tensor-core kernel (prefill_mma_kernel), both of which ran correctly on an H100 (tests/oracle/,
// installed in place of the library's kernels for one run). Covers the built head-dim pairs
// (64, 128, 256, 192/128), fp16 and bf16, MHA and GQA (64- and 128-row blocks), paged (page
// sizes 1, 5, 16) and ragged KV, causal right-aligned rows, the soft cap, a sliding window, a
// custom mask, ALiBi, attention sinks, split-KV with the merge pass, and tensor-core decode
// (use_tensor_cores=True; 16-row blocks whose warps split the keys); fp8 K/V (e4m3, e5m2) paged,
// ragged (with a custom mask or ALiBi too) and in tensor-core decode against the CPU reference.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "ops/attention_test_util.h"
#include "util/test_util.h"
#if FLASHINFER_TEST_HAVE_ORACLES
#include <cuda_runtime.h>

#include "oracle/attention_oracle.h"
#include "util/cuda_graph_util.h"
#endif
#include "api/device_props.h"
#if FLASHINFER_TEST_HAVE_CUTLASS
#include "kernels/cuda/prefill_sm90.h"
#endif

namespace flashinfer {
namespace {

using testing::int_tensor;

struct PrefillCase {
  DType dt = DType::kBFloat16;
  int64_t dqk = 128, dvo = 128, hq = 32, hkv = 8;
  int64_t page = 16;  // 0: ragged KV
  std::vector<int32_t> qo_lens{1, 33, 200}, kv_lens{40, 33, 300};
  bool causal = true;
  double soft_cap = 0.0;
  int64_t window = -1;
  bool custom_mask = false;
  bool alibi = false;  // pos_encoding_mode="ALIBI"
  bool sinks = false;  // one sink logit per qo head
  std::optional<int64_t> split;
  // Ragged only: q, and v, as strided views, DeepSeek's way: v the second half of each head's row
  // of a fused [tokens, heads, 2 dvo] tensor (k_nope | v of the kv_b projection), q the first dqk
  // of each head's row of a wider tensor (head strides 2 dvo and dqk + 64).
  bool views = false;
  bool oracles = true;  // also run the H100 run's kernels (ahead-of-time head dims only)
  // The wrappers' backend: "fa2" keeps these cases on the FA2 kernel they were written for, on
  // sm_90 too (whose default is the Hopper kernel: the Hopper tests below name "fa3").
  std::string backend = "fa2";
  // The float workspace (MiB): a split plan whose partials do not fit it runs unsplit, so a case
  // meant to split must leave room (32 x (dvo + 1) x 4 bytes a partial row at 32 heads).
  int64_t workspace_mib = 32;

  std::string str() const {
    std::string q, k;
    for (int32_t x : qo_lens) q += std::to_string(x) + ",";
    for (int32_t x : kv_lens) k += std::to_string(x) + ",";
    return std::string(dtype_torch_name(dt)) + " d=" + std::to_string(dqk) + "/" +
           std::to_string(dvo) + " heads=" + std::to_string(hq) + ":" + std::to_string(hkv) +
           " page=" + std::to_string(page) + " qo=" + q + " kv=" + k +
           " causal=" + std::to_string(causal) + " cap=" + std::to_string(soft_cap) +
           " window=" + std::to_string(window) + " mask=" + std::to_string(custom_mask) +
           " alibi=" + std::to_string(alibi) + " sinks=" + std::to_string(sinks) +
           " split=" + std::to_string(split.value_or(0)) + " views=" + std::to_string(views) +
           " backend=" + backend;
  }
};

bool mask_bit(int64_t i, int64_t j) { return i != 1 && ((i * 7 + j * 3) % 5) != 0; }

struct Runs {
  AttentionOutput cpu, gpu, core_oracle, mma_oracle;
  bool gpu_split = false;  // the GPU plan split the keys (partials and the merge pass)
};

Runs run_case(const PrefillCase& c) {
  const Device g = Device::cuda();
  const auto batch = c.qo_lens.size();
  std::vector<int32_t> qo{0}, kv{0};
  for (std::size_t b = 0; b < batch; ++b) {
    qo.push_back(qo.back() + c.qo_lens[b]);
    kv.push_back(kv.back() + c.kv_lens[b]);
  }
  Tensor q = c.views
                 ? Tensor::empty({qo.back(), c.hq, c.dqk + 64}, c.dt).uniform_(5).slice(2, 0, c.dqk)
                 : Tensor::empty({qo.back(), c.hq, c.dqk}, c.dt).uniform_(5);
  auto to_dev = [&](const Tensor& t, Device d) {
    return c.views ? testing::to_keep_layout(t, d) : t.to(d);
  };
  PrefillPlanOptions po;
  po.q_data_type = c.dt;
  po.head_dim_vo = c.dvo;
  po.causal = c.causal;
  po.logits_soft_cap = c.soft_cap;
  po.window_left = c.window;
  po.fixed_split_size = c.split;
  if (c.alibi) po.pos_encoding_mode = "ALIBI";
  if (c.custom_mask) {
    std::vector<double> bits;
    for (std::size_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i < c.qo_lens[b]; ++i) {
        for (int64_t j = 0; j < c.kv_lens[b]; ++j) bits.push_back(mask_bit(i, j));
      }
    }
    po.custom_mask = Tensor::from_vector(bits, {static_cast<int64_t>(bits.size())}, DType::kBool);
  }
  AttentionRunOptions ro;
  ro.return_lse = true;
  std::vector<double> sink_logits;
  for (int64_t h = 0; h < c.hq; ++h) sink_logits.push_back(0.25 * static_cast<double>(h % 7) - 0.5);
  const Tensor sinks_cpu = Tensor::from_vector(sink_logits, {c.hq}, DType::kFloat32);
  std::function<AttentionOutput(Device)> run;
  bool gpu_split = false;
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f;
  Tensor k, v;
  if (c.page > 0) {
    f = testing::make_paged(c.kv_lens, c.page, c.hkv, c.dqk, c.dt, false, true, 11, kd, vd);
    run = [&](Device d) {
      BatchPrefillWithPagedKVCacheWrapper w(
          Tensor::zeros({c.workspace_mib << 20}, DType::kUInt8, d), "NHD", false, {}, {}, {}, {},
          {}, {}, c.backend);
      w.plan(int_tensor(qo), f.indptr, f.indices, f.last_page_len, c.hq, c.hkv, c.dqk, c.page, po);
      if (d.is_cuda()) gpu_split = w.split_kv();
      AttentionRunOptions rd = ro;
      if (c.sinks) rd.sinks = sinks_cpu.to(d);
      return w.run(to_dev(q, d),
                   PagedKVCache(testing::to_keep_layout(f.k_cache, d),
                                testing::to_keep_layout(f.v_cache, d)),
                   rd);
    };
  } else {
    k = Tensor::empty({kv.back(), c.hkv, c.dqk}, c.dt).uniform_(6);
    v = c.views ? Tensor::empty({kv.back(), c.hkv, 2 * c.dvo}, c.dt)
                      .uniform_(7)
                      .slice(2, c.dvo, 2 * c.dvo)
                : Tensor::empty({kv.back(), c.hkv, c.dvo}, c.dt).uniform_(7);
    run = [&](Device d) {
      BatchPrefillWithRaggedKVCacheWrapper w(
          Tensor::zeros({c.workspace_mib << 20}, DType::kUInt8, d), "NHD", false, {}, {}, {}, {},
          c.backend);
      w.plan(int_tensor(qo), int_tensor(kv), c.hq, c.hkv, c.dqk, po);
      if (d.is_cuda()) gpu_split = w.split_kv();
      AttentionRunOptions rd = ro;
      if (c.sinks) rd.sinks = sinks_cpu.to(d);
      return w.run(to_dev(q, d), k.to(d), to_dev(v, d), rd);
    };
  }
  Runs r;
  r.cpu = run(Device::cpu());
  r.gpu = run(g);
  r.gpu_split = gpu_split;
#if FLASHINFER_TEST_HAVE_ORACLES
  // The oracles are the kernels of the H100 run, which took neither ALiBi nor sinks (nor ran
  // strided views).
  if (c.alibi || c.sinks || c.views || !c.oracles) return r;
  {
    testing::ScopedAttentionOracle oracle;
    r.core_oracle = run(g);
  }
  if (c.dqk == c.dvo) {
    testing::ScopedPrefillMmaOracle oracle;
    r.mma_oracle = run(g);
  }
#endif
  return r;
}

void expect_matches(const PrefillCase& c) {
  SCOPED_TRACE(c.str());
  const Runs r = run_case(c);
  // A fixed split whose partials do not fit the workspace runs unsplit, silently: each case that
  // asks for one leaves room (workspace_mib) and checks that the keys were split.
  if (c.split) {
    EXPECT_TRUE(r.gpu_split) << "the plan ran unsplit";
  }
  const auto tol = testing::default_tolerance(c.dt);
  EXPECT_TRUE(testing::all_close(r.gpu.out, r.cpu.out, tol)) << "vs CPU";
  EXPECT_TRUE(testing::all_close(r.gpu.lse, r.cpu.lse, {2e-3, 1e-3})) << "lse vs CPU";
  for (const AttentionOutput* o : {&r.core_oracle, &r.mma_oracle}) {
    if (!o->out.defined()) continue;
    EXPECT_TRUE(testing::all_close(r.gpu.out, o->out, tol)) << "vs an oracle kernel";
    EXPECT_TRUE(testing::all_close(r.gpu.lse, o->lse, {1e-3, 1e-4})) << "lse vs an oracle";
    EXPECT_TRUE(testing::all_close(o->out, r.cpu.out, tol)) << "oracle vs CPU";
  }
}

TEST(PrefillKernelCuda, DimsDtypesAndBlockShapesMatchCpuAndOracles) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (auto [dqk, dvo] :
         {std::pair<int64_t, int64_t>{64, 64}, {128, 128}, {256, 256}, {192, 128}}) {
      // MHA and GQA 4 (the 200-query request fills 128-row blocks where they are built), and a
      // batch of short requests (64-row blocks, most rows padding).
      for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{8, 8}, {32, 8}}) {
        for (bool short_rows : {false, true}) {
          PrefillCase c;
          c.dt = dt;
          c.dqk = dqk;
          c.dvo = dvo;
          c.hq = hq;
          c.hkv = hkv;
          c.page = dqk == dvo ? 16 : 0;  // paged caches share one head dim
          if (short_rows) {
            c.qo_lens = {3, 1, 5};
            c.kv_lens = {70, 1, 129};
          }
          expect_matches(c);
        }
      }
    }
  }
}

// A head dim outside the ahead-of-time set runs the JIT's tensor-core kernel; at 192 / 192 and
// 240 / 240 it needs more than the 48 KiB of shared memory a launch gets without opting in, which
// the loaded kernel is given (cudaFuncSetAttribute on a JIT kernel: no GPU run had reached it).
TEST(PrefillKernelCuda, JitHeadDimsPastDefaultSharedMemoryMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (int64_t d : {192, 240}) {
    PrefillCase c;
    c.dqk = c.dvo = d;
    c.hq = 8;
    c.hkv = 2;
    c.qo_lens = {40, 7};
    c.kv_lens = {200, 33};
    c.oracles = false;
    expect_matches(c);
  }
}

TEST(PrefillKernelCuda, PageSizesLengthsAndSplitsMatchCpuAndOracles) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (int64_t page : {1, 5, 16, 0}) {
    for (std::optional<int64_t> split : {std::optional<int64_t>{}, {1}, {3}}) {
      for (bool causal : {true, false}) {
        PrefillCase c;
        c.page = page;
        c.split = split;
        c.causal = causal;
        // A one-key request, tile tails (31, 65), a query tile of exactly 128 packed rows.
        c.qo_lens = {1, 31, 32, 65, 7};
        c.kv_lens = {1, 31, 100, 65, 1000};
        c.workspace_mib = 256;  // one-key chunks: 15386 partial rows x 16.5 KB
        expect_matches(c);
      }
    }
  }
}

TEST(PrefillKernelCuda, VariantsMatchCpuAndOracles) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (int64_t d : {64, 128}) {
    {
      PrefillCase c;  // kPrefillSoftCap
      c.dqk = c.dvo = d;
      c.soft_cap = 30.0;
      expect_matches(c);
    }
    {
      PrefillCase c;  // a window crossing tiles: masked tiles at both ends of the range
      c.dqk = c.dvo = d;
      c.window = 45;
      expect_matches(c);
      c.causal = false;
      expect_matches(c);
    }
    for (bool cap : {false, true}) {
      PrefillCase c;  // kPrefillCustomMask (ragged and paged), with and without the soft cap
      c.dqk = c.dvo = d;
      c.custom_mask = true;
      c.causal = false;
      c.soft_cap = cap ? 20.0 : 0.0;
      c.qo_lens = {5, 70, 9};
      c.kv_lens = {13, 90, 9};
      expect_matches(c);
      c.page = 0;
      expect_matches(c);
      // A speculative-decoding verify: a few draft tokens a request and their tree mask, GQA 4,
      // 16 packed rows at most: the 16-row blocks (head dims up to 192; 64 rows at 256), whose
      // warps split the keys; split at 4 pages (the 1000-key request in chunks).
      PrefillCase v = c;
      v.hq = 16;
      v.hkv = 4;
      v.qo_lens = {4, 1, 3, 4};
      v.kv_lens = {300, 17, 129, 1000};
      v.page = 16;
      expect_matches(v);
      v.split = 4;
      expect_matches(v);
      v.page = 0;
      v.split = 64;
      expect_matches(v);
      if (d == 128) {  // DeepSeek's 192 / 128 (ragged), whose 16-row blocks take the mask too
        v.dqk = 192;
        v.split.reset();
        expect_matches(v);
        v.dt = DType::kFloat16;
        v.split = 64;
        expect_matches(v);
      }
    }
  }
}

// DeepSeek's qk 192 / vo 128 over ragged K/V (paged caches share one head dim), GQA 4: a
// one-query request beside longer ones, key tails inside a tile, long keys.
[[maybe_unused]] PrefillCase deepseek_ragged_case(DType dt, bool causal) {
  PrefillCase ds;
  ds.dt = dt;
  ds.dqk = 192;
  ds.dvo = 128;
  ds.page = 0;
  ds.causal = causal;
  ds.qo_lens = {200, 33, 1, 129};
  ds.kv_lens = {300, 33, 129, 1000};
  return ds;
}

// The Hopper schedule tests' shapes (ping-pong, warp-specialized) at head dim d: a one-query
// request beside longer ones, key tails inside a tile, long keys; then the same in 256-token chunks
// (with_chunks; ragged, or pages of 1), where request 0's last chunk [256, 300) is beyond its first
// 32 queries (causal) and a window of 150 hides whole chunks from late rows: blocks with no tile.
[[maybe_unused]] PrefillCase with_chunks(PrefillCase c, bool causal) {
  c.split = 256;
  c.soft_cap = causal ? 30.0 : 0.0;
  c.sinks = !causal;
  return c;
}
[[maybe_unused]] std::vector<PrefillCase> hopper_schedule_cases(DType dt, int64_t d, bool causal) {
  PrefillCase c;
  c.dt = dt;
  c.dqk = c.dvo = d;
  c.causal = causal;
  c.qo_lens = {200, 33, 1, 129};
  c.kv_lens = {300, 33, 129, 1000};
  PrefillCase chunks = with_chunks(c, causal);
  chunks.page = causal ? 0 : 1;
  chunks.window = causal ? -1 : 150;
  return {c, chunks};
}

// The Hopper kernel (prefill_sm90_kernel.cuh: wgmma, sm_90; backend "auto" and "fa3") against
// the FA2 kernel (backend "fa2") and the CPU reference on the same inputs: fp16 and bf16, GQA 4 and
// MHA (128-row blocks from requests of 33+ queries), head dims 128, 64, 256 and 192 / 128, paged
// (page sizes 1, 5, 16) and ragged K/V,
// causal right-aligned rows and not, key tails inside a 128-key tile, a window crossing tiles,
// split-KV with the merge pass, sinks, the soft cap, a one-query request beside long ones (its
// blocks stay 128 rows: the plan's largest work item sets the height). The launch counter says the
// Hopper kernel ran for "fa3" and did not for "fa2".
TEST(PrefillKernelCuda, HopperKernelMatchesFa2KernelAndCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
#if !FLASHINFER_TEST_HAVE_CUTLASS
  GTEST_SKIP() << "built without CUTLASS's headers: no Hopper kernel";
#else
  if (api::compute_capability(Device::cuda(0)) != 90) {
    GTEST_SKIP() << "the Hopper kernel is sm_90a code";
  }
  // small: the one-warpgroup blocks must be the ones that ran (they did not, or did, else).
  auto check = [](PrefillCase c, bool small = false) {
    SCOPED_TRACE(c.str());
    const auto tol = testing::default_tolerance(c.dt);
    c.backend = "fa3";
    c.workspace_mib = 256;  // room for every split case's partials: they must split (below)
    const uint64_t before = kernels::cuda::prefill_sm90_launches();
    const uint64_t small_before = kernels::cuda::prefill_sm90_small_launches();
    const Runs hopper = run_case(c);
    EXPECT_GT(kernels::cuda::prefill_sm90_launches(), before) << "the Hopper kernel did not run";
    if (c.split) {
      EXPECT_TRUE(hopper.gpu_split) << "the plan ran unsplit";
    }
    EXPECT_EQ(kernels::cuda::prefill_sm90_small_launches() > small_before, small)
        << "one-warpgroup blocks ran: " << !small;
    c.backend = "fa2";
    const uint64_t before_fa2 = kernels::cuda::prefill_sm90_launches();
    const Runs fa2 = run_case(c);
    EXPECT_EQ(kernels::cuda::prefill_sm90_launches(), before_fa2) << "fa2 ran the Hopper kernel";
    EXPECT_TRUE(testing::all_close(hopper.gpu.out, hopper.cpu.out, tol)) << "vs CPU";
    EXPECT_TRUE(testing::all_close(hopper.gpu.lse, hopper.cpu.lse, {2e-3, 1e-3})) << "lse vs CPU";
    EXPECT_TRUE(testing::all_close(hopper.gpu.out, fa2.gpu.out, tol)) << "vs the FA2 kernel";
    EXPECT_TRUE(testing::all_close(hopper.gpu.lse, fa2.gpu.lse, {1e-3, 1e-4})) << "lse vs FA2";
  };
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t page : {16, 1, 5, 0}) {
      for (bool causal : {true, false}) {
        // Split: chunks of about 64 keys (fixed_split_size counts pages, or tokens when ragged).
        const int64_t chunk = page > 0 ? std::max<int64_t>(1, 64 / page) : 64;
        for (std::optional<int64_t> split : {std::optional<int64_t>{}, {chunk}}) {
          PrefillCase c;
          c.dt = dt;
          // Head dim 64 (64-key tiles) on a subset: its tiles' tails differ from 128's.
          if (page == 5 || page == 0) c.dqk = c.dvo = 64;
          c.page = page;
          c.causal = causal;
          c.split = split;
          c.qo_lens = {200, 33, 1, 129};
          c.kv_lens = {300, 33, 129, 1000};
          check(c);
        }
      }
    }
    {
      // SmolLM2-135M's prefill, the GPU demo's (docs/CHAT.md): 9 query heads over 3 KV heads
      // (group 3), head dim 64, page 16, causal, one prompt of 37 tokens: 111 packed rows.
      PrefillCase smol;
      smol.dt = dt;
      smol.dqk = smol.dvo = 64;
      smol.hq = 9;
      smol.hkv = 3;
      smol.page = 16;
      smol.causal = true;
      smol.qo_lens = {37};
      smol.kv_lens = {37};
      check(smol);
    }
    for (int64_t d : {128, 64, 256}) {
      PrefillCase mha;  // 8:8, 300 queries: 300 packed rows, three 128-row blocks
      mha.dt = dt;
      mha.dqk = mha.dvo = d;
      mha.hq = mha.hkv = 8;
      mha.qo_lens = {300, 40};
      mha.kv_lens = {300, 555};
      check(mha);
    }
    // One-warpgroup blocks: plans of 64-row tiles (17-64 packed rows a work item), GQA 4 and MHA.
    for (int64_t d : {128, 64}) {
      for (bool causal : {true, false}) {
        PrefillCase small;
        small.dt = dt;
        small.dqk = small.dvo = d;
        small.causal = causal;
        small.qo_lens = {5, 16, 3, 9};
        small.kv_lens = {700, 16, 90, 1000};
        check(small, true);
        small.page = 1;
        small.split = 2;
        small.soft_cap = causal ? 0.0 : 30.0;
        small.window = causal ? 60 : -1;
        small.sinks = !causal;
        check(small, true);
        small.hq = small.hkv = 8;
        small.qo_lens = {40, 20, 64};
        small.kv_lens = {40, 333, 64};
        small.page = 0;
        check(small, true);
      }
    }
    PrefillCase d256;  // head dim 256 (the planner's 128-row tiles for it), GQA 4, paged
    d256.dt = dt;
    d256.dqk = d256.dvo = 256;
    check(d256);
    d256.page = 0;
    d256.causal = false;
    d256.split = 32;  // tokens (ragged)
    check(d256);
    PrefillCase window;  // the window's first tiles and the causal edge both masked
    window.dt = dt;
    window.window = 200;
    window.qo_lens = {300, 70};
    window.kv_lens = {700, 70};
    check(window);
    window.causal = false;
    check(window);
    PrefillCase sinks;
    sinks.dt = dt;
    sinks.sinks = true;
    check(sinks);
    sinks.split = 2;
    check(sinks);
    for (int64_t d : {128, 64, 256}) {  // the soft-capped instances, with a window and split
      PrefillCase cap;
      cap.dt = dt;
      cap.dqk = cap.dvo = d;
      cap.soft_cap = 30.0;
      check(cap);
      cap.window = 100;
      cap.split = 3;
      check(cap);
    }
    // DeepSeek's qk 192 / vo 128 (tall blocks: K rows of 24 units, three a thread; V and O of
    // 128), ragged K/V (paged caches share one head dim): GQA 4 and MHA, causal and not, split,
    // the soft cap with a window, sinks.
    for (bool causal : {true, false}) {
      for (std::optional<int64_t> split : {std::optional<int64_t>{}, {64}}) {
        PrefillCase ds = deepseek_ragged_case(dt, causal);
        ds.split = split;
        check(ds);
      }
    }
    PrefillCase ds;
    ds.dt = dt;
    ds.dqk = 192;
    ds.dvo = 128;
    ds.page = 0;
    ds.hq = ds.hkv = 8;  // MHA, as DeepSeek's prefill
    ds.qo_lens = {300, 40};
    ds.kv_lens = {300, 555};
    check(ds);
    ds.hq = 32;
    ds.soft_cap = 30.0;
    ds.window = 100;
    ds.split = 48;
    check(ds);
    ds.soft_cap = 0.0;
    ds.window = -1;
    ds.sinks = true;
    check(ds);
    // q and v as DeepSeek's strided views (head strides dqk + 64 and 256), unsplit and split at
    // 48 tokens (chunk ends inside the 128-key tiles).
    for (std::optional<int64_t> split : {std::optional<int64_t>{}, {48}}) {
      PrefillCase views = deepseek_ragged_case(dt, true);
      views.views = true;
      views.split = split;
      check(views);
    }
  }
#endif
}

#if FLASHINFER_TEST_HAVE_CUTLASS
// A case on the Hopper kernel (backend "fa3", room for every split case's partials) with the
// kernel switches `env` set for the run (a null value unsets one).
Runs run_hopper(PrefillCase c, std::initializer_list<std::pair<const char*, const char*>> env) {
  c.backend = "fa3";
  c.workspace_mib = 256;
  std::vector<std::unique_ptr<testing::ScopedEnv>> scoped;
  for (const auto& [name, value] : env) {
    scoped.push_back(std::make_unique<testing::ScopedEnv>(name, value));
  }
  return run_case(c);
}

// A case on one form of the Hopper kernel's tall blocks: `form` the switch that selects it
// (FLASHINFER_PREFILL_SM90_WS or FLASHINFER_PREFILL_SM90_OVERLAP; null: the plain form), with the
// ping-pong turns where `ping_pong` is "1", the other form's switch unset.
Runs run_hopper_form(const PrefillCase& c, const char* form, const char* ping_pong) {
  auto set = [&](const char* name) -> const char* {
    return form != nullptr && std::string_view(form) == name ? "1" : nullptr;
  };
  return run_hopper(c, {{"FLASHINFER_PREFILL_SM90_WS", set("FLASHINFER_PREFILL_SM90_WS")},
                        {"FLASHINFER_PREFILL_SM90_OVERLAP", set("FLASHINFER_PREFILL_SM90_OVERLAP")},
                        {"FLASHINFER_PREFILL_SM90_PINGPONG", ping_pong}});
}

// Another schedule or form of the Hopper kernel against the plain one on the same case: the same
// bits (out and LSE), and close to the CPU; split where the case asks for it.
void expect_same_bits_as_plain(const PrefillCase& c, const Runs& got, const Runs& plain) {
  if (c.split) {
    EXPECT_TRUE(got.gpu_split) << "the plan ran unsplit";
  }
  EXPECT_TRUE(got.gpu.out.to_double_vector() == plain.gpu.out.to_double_vector())
      << "out differs from the plain schedule's";
  EXPECT_TRUE(got.gpu.lse.to_double_vector() == plain.gpu.lse.to_double_vector())
      << "lse differs from the plain schedule's";
  EXPECT_TRUE(testing::all_close(got.gpu.out, got.cpu.out, testing::default_tolerance(c.dt)))
      << "vs CPU";
}
#endif

// The ping-pong schedule (FLASHINFER_PREFILL_SM90_PINGPONG=1: the two warpgroups of a tall block
// take turns at the tensor cores through named barriers) does the plain schedule's arithmetic in
// another order of issue: the same bits, on every shape its instances take (head dims 128, 256
// and 192 / 128,
// bf16 / fp16, plain / soft cap, causal / not, a window, split-KV, sinks, ragged K/V), and no hang
// (each warpgroup waits for the other's turn). The launch counter says which schedule ran; head
// dim 64 keeps the plain one (fp8 K/V: HopperKernelFp8KvMatchesFa2KernelAndCpu).
TEST(PrefillKernelCuda, HopperPingPongScheduleMatchesThePlainOneBitForBit) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
#if !FLASHINFER_TEST_HAVE_CUTLASS
  GTEST_SKIP() << "built without CUTLASS's headers: no Hopper kernel";
#else
  if (api::compute_capability(Device::cuda(0)) != 90) {
    GTEST_SKIP() << "the Hopper kernel is sm_90a code";
  }
  auto check = [](const PrefillCase& c, bool ping_pong_built) {
    SCOPED_TRACE(c.str());
    const Runs plain = run_hopper_form(c, nullptr, nullptr);
    const uint64_t before = kernels::cuda::prefill_sm90_ping_pong_launches();
    const Runs ping_pong = run_hopper_form(c, nullptr, "1");
    EXPECT_EQ(kernels::cuda::prefill_sm90_ping_pong_launches() > before, ping_pong_built)
        << "the ping-pong schedule ran: " << !ping_pong_built;
    expect_same_bits_as_plain(c, ping_pong, plain);
  };
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t d : {128, 256}) {
      for (bool causal : {true, false}) {
        // (In the chunked case's blocks with no tile, the warpgroups still pass their turns
        // before and after the loop.)
        for (const PrefillCase& c : hopper_schedule_cases(dt, d, causal)) check(c, true);
      }
    }
    // DeepSeek's 192 / 128 (ragged: paged caches share one head dim): GQA 4 and MHA, causal and
    // not, split with the soft cap, sinks.
    for (bool causal : {true, false}) {
      PrefillCase ds = deepseek_ragged_case(dt, causal);
      check(ds, true);
      ds.hq = ds.hkv = 8;
      check(with_chunks(ds, causal), true);
    }
  }
  PrefillCase d64;  // no ping-pong instance: two blocks an SM overlap each other already
  d64.dqk = d64.dvo = 64;
  const uint64_t hopper_before = kernels::cuda::prefill_sm90_launches();
  check(d64, false);
  EXPECT_GT(kernels::cuda::prefill_sm90_launches(), hopper_before) << "not on the Hopper kernel";
#endif
}

// The warp-specialized form (FLASHINFER_PREFILL_SM90_WS=1: a producer warpgroup copies Q and the
// K/V tiles and hands each stage to the two math warpgroups through mbarriers) does the plain
// schedule's arithmetic with other synchronization: the same bits, alone and with the ping-pong
// turns, on every shape its instances take (head dims 128 and 192 / 128, 16-bit K/V: bf16 /
// fp16, plain / soft cap, causal / not, a window, split-KV with blocks of no tile, sinks, paged
// by 16 and 1 and ragged K/V), and no hang (a wrong barrier parity waits forever: gpu-run-packed's
// per-binary limit names it). The launch counter says which form ran; head dims 256 and fp8 K/V
// keep the plain one.
TEST(PrefillKernelCuda, HopperWarpSpecializedFormMatchesThePlainOneBitForBit) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
#if !FLASHINFER_TEST_HAVE_CUTLASS
  GTEST_SKIP() << "built without CUTLASS's headers: no Hopper kernel";
#else
  if (api::compute_capability(Device::cuda(0)) != 90) {
    GTEST_SKIP() << "the Hopper kernel is sm_90a code";
  }
  auto check = [](const PrefillCase& c, bool ws_built) {
    SCOPED_TRACE(c.str());
    const Runs plain = run_hopper_form(c, nullptr, nullptr);
    for (const char* ping_pong : {static_cast<const char*>(nullptr), "1"}) {
      SCOPED_TRACE(ping_pong ? "with the ping-pong turns" : "without the ping-pong turns");
      const uint64_t before = kernels::cuda::prefill_sm90_ws_launches();
      const Runs ws = run_hopper_form(c, "FLASHINFER_PREFILL_SM90_WS", ping_pong);
      EXPECT_EQ(kernels::cuda::prefill_sm90_ws_launches() > before, ws_built)
          << "the warp-specialized form ran: " << !ws_built;
      expect_same_bits_as_plain(c, ws, plain);
    }
  };
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (bool causal : {true, false}) {
      for (const PrefillCase& c : hopper_schedule_cases(dt, 128, causal)) check(c, true);
      // DeepSeek's 192 / 128 (ragged): the producer copies three unit columns of each K row.
      const PrefillCase ds = deepseek_ragged_case(dt, causal);
      check(ds, true);
      check(with_chunks(ds, causal), true);
    }
  }
  PrefillCase d256;  // no warp-specialized instance (4 keys a pass for the producer's threads)
  d256.dqk = d256.dvo = 256;
  check(d256, false);
#endif
}

// The overlapped form (FLASHINFER_PREFILL_SM90_OVERLAP=1: the warp-specialized form whose math
// warpgroups run a tile's softmax while the tensor cores compute the next tile's S and the
// previous tile's P V) on every shape its instances take (head dims 128 and 192 / 128, 16-bit
// K/V, bf16 / fp16, causal / not, a window, split-KV with blocks of no tile, sinks, paged by 16 and
// 1 and ragged K/V; blocks of one tile, of odd and even tile counts: each has its own stages),
// alone and with the ping-pong turns. Its 64-key tiles round the online softmax otherwise than the
// plain form's 128, so it is compared with the CPU and with the plain form within q's dtype's
// tolerance, and its two schedules with each other bit for bit (the same arithmetic). Soft-capped
// calls, head dim 256 and one-warpgroup blocks have no instance: they keep the plain form's bits
// (the launch counter says which form ran). A wrong barrier parity or a stage released twice would
// hang (gpu-run-packed's per-binary limit names it).
TEST(PrefillKernelCuda, HopperOverlappedFormMatchesCpuAndThePlainForm) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
#if !FLASHINFER_TEST_HAVE_CUTLASS
  GTEST_SKIP() << "built without CUTLASS's headers: no Hopper kernel";
#else
  if (api::compute_capability(Device::cuda(0)) != 90) {
    GTEST_SKIP() << "the Hopper kernel is sm_90a code";
  }
  auto check = [](const PrefillCase& c) {
    SCOPED_TRACE(c.str());
    // (tall blocks: a request of more than 64 packed rows; 16-bit K/V in every case here)
    const bool tall = *std::max_element(c.qo_lens.begin(), c.qo_lens.end()) * (c.hq / c.hkv) > 64;
    const bool built =
        tall && (c.dqk == 128 || c.dqk == 192) && c.dvo == 128 && !(c.soft_cap > 0.0);
    const auto tol = testing::default_tolerance(c.dt);
    const Runs plain = run_hopper_form(c, nullptr, nullptr);
    std::optional<Runs> alone;
    for (const char* ping_pong : {static_cast<const char*>(nullptr), "1"}) {
      SCOPED_TRACE(ping_pong ? "with the ping-pong turns" : "without the ping-pong turns");
      const uint64_t before = kernels::cuda::prefill_sm90_overlap_launches();
      const Runs got = run_hopper_form(c, "FLASHINFER_PREFILL_SM90_OVERLAP", ping_pong);
      EXPECT_EQ(kernels::cuda::prefill_sm90_overlap_launches() > before, built)
          << "the overlapped form ran: " << !built;
      if (!built) {
        if (ping_pong == nullptr) expect_same_bits_as_plain(c, got, plain);
        continue;
      }
      if (c.split) {
        EXPECT_TRUE(got.gpu_split) << "the plan ran unsplit";
      }
      EXPECT_TRUE(testing::all_close(got.gpu.out, got.cpu.out, tol)) << "vs CPU";
      EXPECT_TRUE(testing::all_close(got.gpu.lse, got.cpu.lse, {2e-3, 1e-3})) << "lse vs CPU";
      EXPECT_TRUE(testing::all_close(got.gpu.out, plain.gpu.out, tol)) << "vs the plain form";
      EXPECT_TRUE(testing::all_close(got.gpu.lse, plain.gpu.lse, {1e-3, 1e-4}))
          << "lse vs the plain form";
      if (alone) {
        EXPECT_TRUE(got.gpu.out.to_double_vector() == alone->gpu.out.to_double_vector())
            << "out differs with the ping-pong turns";
        EXPECT_TRUE(got.gpu.lse.to_double_vector() == alone->gpu.lse.to_double_vector())
            << "lse differs with the ping-pong turns";
      } else {
        alone = got;
      }
    }
  };
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (bool causal : {true, false}) {
      for (const PrefillCase& c : hopper_schedule_cases(dt, 128, causal)) check(c);
      // DeepSeek's 192 / 128 (ragged); the split case is soft-capped when causal (no instance).
      const PrefillCase ds = deepseek_ragged_case(dt, causal);
      check(ds);
      check(with_chunks(ds, causal));
    }
  }
  PrefillCase d256;  // no overlapped instance
  d256.dqk = d256.dvo = 256;
  check(d256);
  PrefillCase small;  // one-warpgroup blocks (at most 64 packed rows): no overlapped form
  small.qo_lens = {16, 3};
  small.kv_lens = {300, 40};
  check(small);
#endif
}

#if FLASHINFER_TEST_HAVE_ORACLES
// use_cuda_graph: a prefill graph captured after one plan and replayed after re-plans with other
// lengths (the same token count: the captured q) computes each new plan. Under graphs every plan
// keeps the first one's tile, chosen for the worst case of its token count, and the captured
// launch is sized for that tile, so a later request holding all the tokens still gets every row
// computed. Head dim 128, 32:8 heads: the Hopper kernel on sm_90, the FA2 kernel elsewhere.
TEST(PrefillKernelCuda, CudaGraphReplayedAfterReplanMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int64_t page = 16, hq = 32, hkv = 8, d = 128;
  const std::vector<int32_t> kv{300, 700, 90};
  const std::vector<std::vector<int32_t>> qo_lens{{1, 1, 62}, {62, 1, 1}, {21, 21, 22}};
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged(kv, page, hkv, d, DType::kBFloat16, false, true, 17, kd, vd);
  Tensor q = Tensor::empty({64, hq, d}, DType::kBFloat16).uniform_(8);
  PrefillPlanOptions po;
  po.q_data_type = DType::kBFloat16;
  po.causal = true;
  auto indptr_of = [](const std::vector<int32_t>& l) {
    std::vector<int32_t> p{0};
    for (int32_t x : l) p.push_back(p.back() + x);
    return int_tensor(p);
  };
  std::vector<AttentionOutput> ref;
  for (const auto& l : qo_lens) {
    BatchPrefillWithPagedKVCacheWrapper cpu(Tensor::zeros({32 << 20}, DType::kUInt8));
    cpu.plan(indptr_of(l), f.indptr, f.indices, f.last_page_len, hq, hkv, d, page, po);
    AttentionRunOptions ro;
    ro.return_lse = true;
    ref.push_back(cpu.run(q, f.cache(), ro));
  }
  BatchPrefillWithPagedKVCacheWrapper w(Tensor::zeros({64 << 20}, DType::kUInt8, g), "NHD",
                                        /*use_cuda_graph=*/true);
  const Tensor qd = q.to(g);
  const PagedKVCache cache(testing::to_keep_layout(f.k_cache, g),
                           testing::to_keep_layout(f.v_cache, g));
  AttentionRunOptions ro;
  ro.return_lse = true;
  ro.out = Tensor::zeros({64, hq, d}, DType::kBFloat16, g);
  ro.lse = Tensor::zeros({64, hq}, DType::kFloat32, g);
  w.plan(indptr_of(qo_lens[0]), f.indptr, f.indices, f.last_page_len, hq, hkv, d, page, po);
  testing::ReplayableGraph graph;
#if FLASHINFER_TEST_HAVE_CUTLASS
  const uint64_t hopper_before = kernels::cuda::prefill_sm90_launches();
#endif
  ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, [&] { w.run(qd, cache, ro); }));
#if FLASHINFER_TEST_HAVE_CUTLASS
  if (api::compute_capability(g) == 90) {
    EXPECT_GT(kernels::cuda::prefill_sm90_launches(), hopper_before) << "not the Hopper kernel";
  }
#endif
  for (std::size_t round = 0; round < 4; ++round) {
    const std::size_t i = (round + 1) % qo_lens.size();
    w.plan(indptr_of(qo_lens[i]), f.indptr, f.indices, f.last_page_len, hq, hkv, d, page, po);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
    EXPECT_TRUE(
        testing::all_close(*ro.out, ref[i].out, testing::default_tolerance(DType::kBFloat16)))
        << "round " << round;
    EXPECT_TRUE(testing::all_close(*ro.lse, ref[i].lse, {2e-3, 1e-3})) << "round " << round;
  }
  ASSERT_EQ(cudaGraphExecDestroy(graph.exec), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph.graph), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(graph.stream), cudaSuccess);
}

// BatchAttention, upstream's plan-once wrapper: plan(), then its first run captured into a CUDA
// graph, as engines do. plan() builds on the constructor's device ("cuda"), so the captured run
// copies nothing (it copied the plan to q's device at its first run, which a capture refuses: a
// review found it in session 79). The replay matches the eager run. Compiled, not run.
TEST(PrefillKernelCuda, BatchAttentionPlanThenCapturedRunReplays) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged({300, 90}, 16, 2, 128, DType::kBFloat16, false, true, 41, kd, vd);
  BatchAttention w("NHD", "cuda");
  w.plan(int_tensor({0, 40, 41}).to(g), f.indptr.to(g), f.indices.to(g),
         int_tensor({300, 90}).to(g), 8, 2, 128, 128, 16, true, std::nullopt, std::nullopt,
         DType::kBFloat16, DType::kBFloat16);
  const Tensor q = Tensor::empty({41, 8, 128}, DType::kBFloat16).uniform_(42).to(g);
  const PagedKVCache cache(testing::to_keep_layout(f.k_cache, g),
                           testing::to_keep_layout(f.v_cache, g));
  const Tensor out = Tensor::zeros({41, 8, 128}, DType::kBFloat16, g);
  const Tensor lse = Tensor::zeros({41, 8}, DType::kFloat32, g);
  testing::ReplayableGraph graph;
  ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, [&] { w.run(q, cache, out, lse); }));
  ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
  const AttentionOutput eager = w.run(q, cache);
  EXPECT_TRUE(testing::all_close(out.to(Device::cpu()), eager.out.to(Device::cpu()), {0.0, 0.0}));
  EXPECT_TRUE(testing::all_close(lse.to(Device::cpu()), eager.lse.to(Device::cpu()), {0.0, 0.0}));
  ASSERT_EQ(cudaGraphExecDestroy(graph.exec), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph.graph), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(graph.stream), cudaSuccess);
}

// use_cuda_graph, eager runs across re-plans (a review's findings, session 79): a mask that fills
// the constructor's custom_mask_buf is taken (its device copy's word padding was refused once a
// smaller mask had sized the array); a plan without a mask after one with it computes without it
// (the mask stayed on the device for the graphs that captured it, and every later run applied
// it); a re-plan of many more queries runs (split or not) within the first plan's grid. With a
// page-index buffer, so the ids are read at run. Against the CPU. Compiled, not run.
TEST(PrefillKernelCuda, CudaGraphWrapperReplansWithAndWithoutAMask) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int64_t page = 16, hq = 8, hkv = 2, d = 128;
  const std::vector<int32_t> kv{300, 700};
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged(kv, page, hkv, d, DType::kBFloat16, false, true, 23, kd, vd);
  auto indptr_of = [](const std::vector<int32_t>& l) {
    std::vector<int32_t> p{0};
    for (int32_t x : l) p.push_back(p.back() + x);
    return int_tensor(p);
  };
  // A mask of every request's qo x kv bits, and the bytes it packs to (each request's bits
  // byte-aligned, as upstream's segment_packbits).
  auto mask_of = [&](const std::vector<int32_t>& qo) {
    std::vector<double> bits;
    int64_t bytes = 0;
    for (std::size_t b = 0; b < qo.size(); ++b) {
      for (int32_t i = 0; i < qo[b]; ++i)
        for (int32_t j = 0; j < kv[b]; ++j) bits.push_back((i * 7 + j * 3) % 5 != 0);
      bytes += (int64_t{qo[b]} * kv[b] + 7) / 8;
    }
    return std::pair{Tensor::from_vector(bits, {static_cast<int64_t>(bits.size())}, DType::kBool),
                     bytes};
  };
  const std::vector<int32_t> small{2, 3}, big{5, 7}, many{100, 100};
  const int64_t buf_bytes = mask_of(big).second;
  BatchPrefillWithPagedKVCacheWrapper w(
      Tensor::zeros({64 << 20}, DType::kUInt8, g), "NHD", /*use_cuda_graph=*/true,
      Tensor::zeros({3}, DType::kInt32, g), Tensor::zeros({3}, DType::kInt32, g),
      Tensor::zeros({f.indices.numel()}, DType::kInt32, g), Tensor::zeros({2}, DType::kInt32, g),
      Tensor::zeros({buf_bytes}, DType::kUInt8, g), Tensor::zeros({3}, DType::kInt32, g));
  const PagedKVCache cache(testing::to_keep_layout(f.k_cache, g),
                           testing::to_keep_layout(f.v_cache, g));
  int step = 0;
  auto check = [&](const std::vector<int32_t>& qo, bool masked) {
    SCOPED_TRACE(::testing::Message() << "step " << step++);
    PrefillPlanOptions po;
    po.q_data_type = DType::kBFloat16;
    po.causal = !masked;
    if (masked) po.custom_mask = mask_of(qo).first;
    const int64_t rows = std::accumulate(qo.begin(), qo.end(), int64_t{0});
    const Tensor q = Tensor::empty({rows, hq, d}, DType::kBFloat16).uniform_(30 + step);
    BatchPrefillWithPagedKVCacheWrapper cpu(Tensor::zeros({32 << 20}, DType::kUInt8));
    cpu.plan(indptr_of(qo), f.indptr, f.indices, f.last_page_len, hq, hkv, d, page, po);
    AttentionRunOptions ro;
    ro.return_lse = true;
    const AttentionOutput want = cpu.run(q, f.cache(), ro);
    ASSERT_NO_THROW(w.plan(indptr_of(qo).to(g), f.indptr.to(g), f.indices.to(g),
                           f.last_page_len.to(g), hq, hkv, d, page, po));
    const AttentionOutput got = w.run(q.to(g), cache, ro);
    EXPECT_TRUE(testing::all_close(got.out.to(Device::cpu()), want.out,
                                   testing::default_tolerance(DType::kBFloat16)));
    EXPECT_TRUE(testing::all_close(got.lse.to(Device::cpu()), want.lse, {2e-3, 1e-3}));
  };
  check(small, true);
  check(big, true);    // fills custom_mask_buf
  check(big, false);   // the mask gone
  check(small, true);  // and back
  check(many, false);  // 200 queries after a first plan of 5
}

// SGLang's speculative (EAGLE) target-verify prefill as it captures it (the engine-call audit of
// session 80): BatchPrefillWithPagedKVCacheWrapper(use_cuda_graph=True, backend="fa2") with every
// buffer (qo / kv indptr, page ids, last page lengths, custom_mask_buf, mask_indptr_buf) on the
// device, page size 1 over its 3-D K/V pools (bf16 and fp8 e4m3), 4 draft tokens a request. Each
// step re-plans new KV lengths and a new tree mask (the prefix visible, the drafts by the tree)
// into the buffers and replays the one graph; against the CPU reference.
TEST(PrefillKernelCuda, CudaGraphOfASpeculativeVerifyReplaysNewTreeMasks) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int64_t hq = 16, hkv = 2, d = 128, drafts = 4, batch = 3;
  const std::vector<std::vector<int32_t>> steps{{40, 301, 9}, {44, 305, 13}, {47, 306, 17}};
  const std::vector<int32_t> cap{47, 306, 17};
  for (DType kv_dt : {DType::kBFloat16, DType::kFloat8E4M3FN}) {
    SCOPED_TRACE(dtype_torch_name(kv_dt));
    std::vector<std::vector<double>> kd, vd;
    testing::PagedFixture f =
        testing::make_paged(cap, 1, hkv, d, DType::kBFloat16, false, false, 29, kd, vd);
    const Tensor cache5 = f.cache5.to(kv_dt);
    auto table = [&](const std::vector<int32_t>& l) { return testing::first_pages_table(f, 1, l); };
    // Each request's drafts x kv bits: the prefix seen by every draft, draft i sees draft j <= i
    // on its tree path (a pattern that changes with the step).
    auto mask_of = [&](const std::vector<int32_t>& l, int s) {
      std::vector<double> bits;
      for (std::size_t b = 0; b < l.size(); ++b) {
        const int32_t prefix = l[b] - static_cast<int32_t>(drafts);
        for (int64_t i = 0; i < drafts; ++i) {
          for (int32_t j = 0; j < l[b]; ++j) {
            const int64_t t = j - prefix;
            bits.push_back(j < prefix || (t <= i && (t == i || (i * 3 + t + s) % 4 != 1)));
          }
        }
      }
      return Tensor::from_vector(bits, {static_cast<int64_t>(bits.size())}, DType::kBool);
    };
    const Tensor qo_indptr = int_tensor({0, 4, 8, 12});
    const Tensor q = Tensor::empty({batch * drafts, hq, d}, DType::kBFloat16).uniform_(33);
    auto options = [&](std::size_t s) {
      PrefillPlanOptions po;
      po.q_data_type = DType::kBFloat16;
      po.kv_data_type = kv_dt;
      po.custom_mask = mask_of(steps[s], static_cast<int>(s));
      return po;
    };
    AttentionRunOptions ro;
    ro.k_scale = 0.5;
    ro.v_scale = 2.0;
    std::vector<Tensor> ref;
    for (std::size_t s = 0; s < steps.size(); ++s) {
      BatchPrefillWithPagedKVCacheWrapper cpu(Tensor::zeros({32 << 20}, DType::kUInt8));
      auto [indptr, indices, last] = table(steps[s]);
      cpu.plan(qo_indptr, indptr, indices, last, hq, hkv, d, 1, options(s));
      ref.push_back(cpu.run(q, PagedKVCache(cache5), ro).out);
    }
    int64_t mask_bytes = 0;
    for (int32_t l : cap) mask_bytes += (drafts * l + 7) / 8;
    BatchPrefillWithPagedKVCacheWrapper w(
        Tensor::zeros({64 << 20}, DType::kUInt8, g), "NHD", /*use_cuda_graph=*/true,
        Tensor::zeros({batch + 1}, DType::kInt32, g), Tensor::zeros({batch + 1}, DType::kInt32, g),
        Tensor::zeros({f.indices.numel()}, DType::kInt32, g),
        Tensor::zeros({batch}, DType::kInt32, g), Tensor::zeros({mask_bytes}, DType::kUInt8, g),
        Tensor::zeros({batch + 1}, DType::kInt32, g), "fa2");
    const Tensor c5 = testing::to_keep_layout(cache5, g);
    const PagedKVCache pools(c5.select(1, 0).squeeze(1), c5.select(1, 1).squeeze(1));
    const Tensor qd = q.to(g);
    ro.out = Tensor::zeros({batch * drafts, hq, d}, DType::kBFloat16, g);
    {
      auto [indptr, indices, last] = table(steps[0]);
      w.plan(qo_indptr, indptr, indices, last, hq, hkv, d, 1, options(0));
    }
    testing::ReplayableGraph graph;
    ASSERT_NO_FATAL_FAILURE(testing::warm_up_for_replay(graph, [&] { w.run(qd, pools, ro); }));
    EXPECT_TRUE(testing::all_close(*ro.out, ref[0], testing::default_tolerance(DType::kBFloat16)));
    ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, [&] { w.run(qd, pools, ro); }));
    for (std::size_t s : {std::size_t{1}, std::size_t{2}, std::size_t{0}}) {
      SCOPED_TRACE(::testing::Message() << "step " << s);
      auto [indptr, indices, last] = table(steps[s]);
      w.plan(qo_indptr, indptr, indices, last, hq, hkv, d, 1, options(s));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
      EXPECT_TRUE(
          testing::all_close(*ro.out, ref[s], testing::default_tolerance(DType::kBFloat16)));
    }
    cudaGraphExecDestroy(graph.exec);
    cudaGraphDestroy(graph.graph);
    cudaStreamDestroy(graph.stream);
  }
}

// single_prefill_with_kv_cache plans its one request on each call and uploads that plan: inside a
// capture the upload goes by value (Tensor.copy_), so the call, and the run() of
// PODWithPagedKVCacheWrapper(use_cuda_graph=True) whose prefill half it is, capture in global
// mode (nothing synchronizes) into a graph whose launch writes what the eager calls wrote, bit
// for bit (the same kernels on the same inputs, no split-KV). Each result is copied into a tensor
// made before the capture: the ones the calls make live on the capture's stream.
TEST(PrefillKernelCuda, SinglePrefillAndPodRunCaptureIntoAGraph) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int64_t hq = 32, hkv = 8, d = 128, page = 16;
  const DType bf16 = DType::kBFloat16;
  const Tensor q_p = Tensor::empty({77, hq, d}, bf16).uniform_(31).to(g);
  const Tensor k_p = Tensor::empty({300, hkv, d}, bf16).uniform_(32).to(g);
  const Tensor v_p = Tensor::empty({300, hkv, d}, bf16).uniform_(33).to(g);
  const Tensor q_d = Tensor::empty({3, hq, d}, bf16).uniform_(34).to(g);
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged({40, 7, 130}, page, hkv, d, bf16, false, true, 35, kd, vd);
  const PagedKVCache cache(testing::to_keep_layout(f.k_cache, g),
                           testing::to_keep_layout(f.v_cache, g));
  PODWithPagedKVCacheWrapper w(Tensor::zeros({64 << 20}, DType::kUInt8, g), "NHD",
                               /*use_cuda_graph=*/true, int_tensor({0, 0, 0, 0}).to(g),
                               Tensor::zeros({1024}, DType::kInt32, g),
                               int_tensor({0, 0, 0}).to(g));
  w.plan(f.indptr, f.indices, f.last_page_len, hq, hkv, d, page, "NONE", -1, bf16);
  const auto single = [&] {
    return single_prefill_with_kv_cache(q_p, k_p, v_p, std::nullopt, std::nullopt, std::nullopt,
                                        std::nullopt, std::nullopt, std::nullopt, /*causal=*/true)
        .out;
  };
  const auto pod = [&] {
    return w.run(q_p, k_p, v_p, q_d, cache, std::nullopt, std::nullopt, true);
  };
  const Tensor eager_single = single();
  const PodOutput eager_pod = pod();
  Tensor got_single = Tensor::zeros(eager_single.shape(), bf16, g);
  Tensor got_p = Tensor::zeros(eager_pod.out_p.shape(), bf16, g);
  Tensor got_d = Tensor::zeros(eager_pod.out_d.shape(), bf16, g);
  {
    const CudaGraphMemoryScope hold(0);
    ASSERT_NO_FATAL_FAILURE(testing::capture_on_own_stream([&] {
      got_single.copy_(single());
      const PodOutput r = pod();
      got_p.copy_(r.out_p);
      got_d.copy_(r.out_d);
    }));
  }
  EXPECT_EQ(got_single.to_double_vector(), eager_single.to_double_vector());
  EXPECT_EQ(got_p.to_double_vector(), eager_pod.out_p.to_double_vector());
  EXPECT_EQ(got_d.to_double_vector(), eager_pod.out_d.to_double_vector());
  EXPECT_EQ(eager_pod.out_p.to_double_vector(), eager_single.to_double_vector());
}
#endif

// backend="fa3" on a GPU: sm90 runs it; any other GPU refuses it by name, as upstream's
// sm90a-only build cannot run there.
TEST(PrefillKernelCuda, Fa3BackendIsRefusedOffHopper) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda(0);
  if (api::compute_capability(g) / 10 == 9) GTEST_SKIP() << "an sm_90 device runs fa3";
  const Tensor ws = Tensor::zeros({1 << 20}, DType::kUInt8, g);
  EXPECT_FI_ERROR(
      BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", false, {}, {}, {}, {}, {}, {}, "fa3"),
      "BatchPrefillWithPagedKVCacheWrapper.__init__", "backend");
  EXPECT_FI_ERROR(BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", false, {}, {}, {}, {}, "fa3"),
                  "BatchPrefillWithRaggedKVCacheWrapper.__init__", "backend");
}

// ALiBi (the FA2 kernel's ALiBi instance) and attention sinks (folded into each final row, or by
// the merge pass of a split row) against the CPU reference: the oracle kernels of the H100 run
// took neither.
TEST(PrefillKernelCuda, AlibiAndSinksMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (int64_t d : {64, 128}) {
    for (std::optional<int64_t> split : {std::optional<int64_t>{}, {2}}) {
      PrefillCase c;
      c.dqk = c.dvo = d;
      c.split = split;
      c.workspace_mib = 64;  // 2068 partial rows x 16.5 KB at head dim 128
      c.alibi = true;
      expect_matches(c);
      c.alibi = false;
      c.sinks = true;
      expect_matches(c);
      c.qo_lens = {2, 1, 3};  // 16-row blocks (8 packed rows of GQA 4 at most)
      c.hq = 16;
      c.hkv = 4;
      expect_matches(c);
    }
  }
}

// use_tensor_cores=True: decode through the FA2 kernel, GQA group packed into the query rows.
TEST(PrefillKernelCuda, TensorCoreDecodeMatchesCpuAndOracle) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    // 32:8 and 8:8 pack 4 and 1 rows a request (16-row blocks, the warps split the keys), 32:1
    // packs 32 (64-row blocks); head dim 64 takes 32 keys a warp, 128 takes 16. Backend "fa2":
    // on sm_90 "auto" gives 32:1 (17-64 packed rows) to the Hopper kernel's one-warpgroup blocks,
    // which HopperKernelMatchesFa2KernelAndCpu covers; here the FA2 kernel's must run.
    for (auto heads : {std::pair<int64_t, int64_t>{32, 8}, {8, 8}, {32, 1}}) {
      const int64_t hq = heads.first, hkv = heads.second;  // the lambda below captures them
      for (int64_t hd : {128, 64})
        for (double cap : {0.0, 30.0})
          for (std::optional<int64_t> split : {std::optional<int64_t>{}, {2}}) {
            if (hd == 64 && cap > 0.0) continue;
            SCOPED_TRACE(std::string(dtype_torch_name(dt)) + " heads " + std::to_string(hq) + ":" +
                         std::to_string(hkv) + " head_dim " + std::to_string(hd) + " cap " +
                         std::to_string(cap) + " split " + std::to_string(split.value_or(0)));
            bool gpu_split = false;
            const std::vector<int32_t> lens{1, 17, 300, 64, 0};
            std::vector<std::vector<double>> kd, vd;
            testing::PagedFixture f =
                testing::make_paged(lens, 16, hkv, hd, dt, false, true, 3, kd, vd);
            Tensor q = Tensor::empty({static_cast<int64_t>(lens.size()), hq, hd}, dt).uniform_(4);
            BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
            po.q_data_type = dt;
            po.fixed_split_size = split;
            if (cap > 0.0) po.logits_soft_cap = cap;
            AttentionRunOptions ro;
            ro.return_lse = true;
            auto run = [&](Device d) {
              BatchDecodeWithPagedKVCacheWrapper w(Tensor::zeros({32 << 20}, DType::kUInt8, d),
                                                   "NHD", false, true, {}, {}, {}, "fa2");
              w.plan(f.indptr, f.indices, f.last_page_len, hq, hkv, hd, 16, po);
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
            EXPECT_TRUE(testing::all_close(got.out, ref.out, testing::default_tolerance(dt)));
            EXPECT_TRUE(testing::all_close(got.lse, ref.lse, {2e-3, 1e-3}));
#if FLASHINFER_TEST_HAVE_ORACLES
            testing::ScopedAttentionOracle oracle;
            const AttentionOutput o = run(Device::cuda());
            EXPECT_TRUE(testing::all_close(got.out, o.out, testing::default_tolerance(dt)));
#endif
          }
    }
  }
}

// More work items than gridDim.y holds (65535): the launcher runs the FA2 kernel in slices of the
// plan, the last slice first (prefill_grid_slice). 70000 one-query requests in tensor-core decode
// (one work item each), every one against the CPU.
TEST(PrefillKernelCuda, PlansOfMoreThan65535WorkItemsRunInSlices) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const int64_t hq = 4, hkv = 1, hd = 64, batch = 70000;
  std::vector<int32_t> lens(static_cast<std::size_t>(batch));
  for (int64_t b = 0; b < batch; ++b)
    lens[static_cast<std::size_t>(b)] = 1 + static_cast<int32_t>(b % 3);
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged(lens, 16, hkv, hd, DType::kBFloat16, false, true, 5, kd, vd);
  Tensor q = Tensor::empty({batch, hq, hd}, DType::kBFloat16).uniform_(6);
  BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
  po.q_data_type = DType::kBFloat16;
  AttentionRunOptions ro;
  ro.return_lse = true;
  auto run = [&](Device d) {
    BatchDecodeWithPagedKVCacheWrapper w(Tensor::zeros({32 << 20}, DType::kUInt8, d), "NHD", false,
                                         true);
    w.plan(f.indptr, f.indices, f.last_page_len, hq, hkv, hd, 16, po);
    return w.run(
        q.to(d),
        PagedKVCache(testing::to_keep_layout(f.k_cache, d), testing::to_keep_layout(f.v_cache, d)),
        ro);
  };
  const AttentionOutput ref = run(Device::cpu()), got = run(Device::cuda());
  EXPECT_TRUE(testing::all_close(got.out, ref.out, testing::default_tolerance(DType::kBFloat16)));
  EXPECT_TRUE(testing::all_close(got.lse, ref.lse, {2e-3, 1e-3}));
}

// Calls the FA2 kernel does not take (it scales inside the exponent: prefill_scale_folds) run on
// the CUDA-core kernel and still match the CPU: per-head scale_q / scale_k, a negative sm_scale.
TEST(PrefillKernelCuda, ScalesTheFa2KernelRefusesRunOnTheCudaCoreKernel) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const int64_t hq = 8, hkv = 2, d = 128, qo = 37, kv = 90;
  Tensor q = Tensor::empty({qo, hq, d}, DType::kBFloat16).uniform_(8);
  Tensor k = Tensor::empty({kv, hkv, d}, DType::kBFloat16).uniform_(9);
  Tensor v = Tensor::empty({kv, hkv, d}, DType::kBFloat16).uniform_(10);
  std::vector<double> sq, sk;
  for (int64_t h = 0; h < hq; ++h) sq.push_back(0.5 + 0.125 * static_cast<double>(h));
  for (int64_t h = 0; h < hkv; ++h) sk.push_back(1.5 - 0.25 * static_cast<double>(h));
  const Tensor scale_q = Tensor::from_vector(sq, {hq}, DType::kFloat32);
  const Tensor scale_k = Tensor::from_vector(sk, {hkv}, DType::kFloat32);
  for (int which = 0; which < 2; ++which) {
    SCOPED_TRACE(which == 0 ? "per-head scales" : "negative sm_scale");
    auto run = [&](Device dev) {
      std::optional<Tensor> sq_d, sk_d;
      std::optional<double> sm;
      if (which == 0) {
        sq_d = scale_q.to(dev);
        sk_d = scale_k.to(dev);
      } else {
        sm = -0.0625;
      }
      return single_prefill_with_kv_cache(q.to(dev), k.to(dev), v.to(dev), sq_d, sk_d, std::nullopt,
                                          std::nullopt, std::nullopt, std::nullopt,
                                          /*causal=*/true, "NHD", "NONE", false, sm, -1,
                                          std::nullopt, std::nullopt, std::nullopt, "auto",
                                          /*return_lse=*/true);
    };
    const AttentionOutput ref = run(Device::cpu()), got = run(Device::cuda());
    EXPECT_TRUE(testing::all_close(got.out, ref.out, testing::default_tolerance(DType::kBFloat16)));
    EXPECT_TRUE(testing::all_close(got.lse, ref.lse, {2e-3, 1e-3}));
  }
}

// ---- fp8 K/V on the FA2 kernel ------------------------------------------------------------------
// K/V tiles of e4m3 / e5m2 codes widened to q's dtype in shared memory. K and V hold random codes
// drawn from every finite one (subnormals up to 448 / 57344), and k_scale / v_scale bring the
// logits and outputs to the 16-bit cases' magnitudes (about 1 / the codes' rms); the CPU reference
// decodes the same codes and applies the scales as the kernel does (k_scale in the logit scale,
// v_scale on the output), so the tolerance is q's dtype's.

// A contiguous CPU tensor of random finite fp8 codes (no NaN, no infinity).
Tensor random_fp8_codes(const Shape& shape, DType kv, uint32_t seed) {
  Tensor t = Tensor::empty(shape, kv);
  std::mt19937 rng(seed);
  auto* bytes = t.data<uint8_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint8_t c = 0;
    do {
      c = static_cast<uint8_t>(rng());
    } while (kv == DType::kFloat8E4M3FN ? (c & 0x7f) == 0x7f : (c & 0x7c) == 0x7c);
    bytes[i] = c;
  }
  return t;
}

AttentionRunOptions fp8_run_options(DType kv) {
  AttentionRunOptions ro;
  ro.return_lse = true;
  const double s = kv == DType::kFloat8E4M3FN ? 1e-2 : 1e-4;  // rms of the codes: 100, 9535
  ro.k_scale = s;
  ro.v_scale = 0.5 * s;
  return ro;
}

// A paged NHD cache [pages + 1, page, hkv, d] of random codes behind a shuffled page table.
struct Fp8Paged {
  Tensor k, v, indptr, indices, last_page_len;
};
Fp8Paged make_fp8_paged(const std::vector<int32_t>& kv_lens, int64_t page, int64_t hkv, int64_t d,
                        DType kv, uint32_t seed) {
  std::vector<int32_t> indptr{0}, last;
  for (int32_t len : kv_lens) {
    const auto n = static_cast<int32_t>((len + page - 1) / page);
    indptr.push_back(indptr.back() + n);
    last.push_back(n == 0 ? 0 : static_cast<int32_t>(len - (n - 1) * page));
  }
  std::vector<int32_t> indices(static_cast<std::size_t>(indptr.back()));
  std::iota(indices.begin(), indices.end(), 1);
  std::shuffle(indices.begin(), indices.end(), std::mt19937(seed));
  Fp8Paged f;
  f.k = random_fp8_codes({indptr.back() + 1, page, hkv, d}, kv, seed + 1);
  f.v = random_fp8_codes({indptr.back() + 1, page, hkv, d}, kv, seed + 2);
  f.indptr = int_tensor(indptr);
  f.indices = int_tensor(indices);
  f.last_page_len = int_tensor(last);
  return f;
}

std::string fp8_trace(DType dt, DType kv, int64_t d, const std::string& what) {
  return std::string(dtype_torch_name(dt)) + " q, " + std::string(dtype_torch_name(kv)) +
         " K/V, d=" + std::to_string(d) + ", " + what;
}

void expect_fp8_close(const AttentionOutput& got, const AttentionOutput& ref, DType dt) {
  EXPECT_TRUE(testing::all_close(got.out, ref.out, testing::default_tolerance(dt))) << "vs CPU";
  EXPECT_TRUE(testing::all_close(got.lse, ref.lse, {2e-3, 1e-3})) << "lse vs CPU";
}

// Batch prefill, paged and ragged: GQA 4 with a 200-query request (work items of 128 packed rows,
// which fp8 K/V runs in 64-row blocks, two a work item), short requests (64-row blocks, most rows
// padding), a soft cap with split KV, and MHA.
TEST(PrefillKernelCuda, Fp8KvPagedAndRaggedMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (DType kv : {DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
      for (int64_t d : {64, 128, 256}) {
        struct Shape3 {
          std::vector<int32_t> qo, kv;
          int64_t hq, hkv;
          double cap;
          std::optional<int64_t> split;
        };
        const Shape3 shapes[] = {{{1, 33, 200}, {40, 33, 300}, 32, 8, 0.0, std::nullopt},
                                 {{3, 1, 5}, {70, 1, 129}, 32, 8, 0.0, std::nullopt},
                                 {{1, 31, 65}, {31, 100, 1000}, 8, 8, 30.0, 3}};
        for (const Shape3& sh : shapes) {
          std::vector<int32_t> qo{0}, kvp{0};
          for (std::size_t b = 0; b < sh.qo.size(); ++b) {
            qo.push_back(qo.back() + sh.qo[b]);
            kvp.push_back(kvp.back() + sh.kv[b]);
          }
          Tensor q = Tensor::empty({qo.back(), sh.hq, d}, dt).uniform_(5);
          PrefillPlanOptions po;
          po.q_data_type = dt;
          po.kv_data_type = kv;
          po.causal = true;
          po.logits_soft_cap = sh.cap;
          po.fixed_split_size = sh.split;
          const AttentionRunOptions ro = fp8_run_options(kv);
          {
            SCOPED_TRACE(fp8_trace(dt, kv, d, "paged, " + std::to_string(sh.qo.back()) + " q"));
            const Fp8Paged f = make_fp8_paged(sh.kv, 16, sh.hkv, d, kv, 17);
            bool split = false;
            auto run = [&](Device dev) {
              BatchPrefillWithPagedKVCacheWrapper w(Tensor::zeros({32 << 20}, DType::kUInt8, dev),
                                                    "NHD", false, {}, {}, {}, {}, {}, {}, "fa2");
              w.plan(int_tensor(qo), f.indptr, f.indices, f.last_page_len, sh.hq, sh.hkv, d, 16,
                     po);
              if (dev.is_cuda()) split = w.split_kv();
              return w.run(q.to(dev), PagedKVCache(f.k.to(dev), f.v.to(dev)), ro);
            };
            expect_fp8_close(run(g), run(Device::cpu()), dt);
            if (sh.split) {
              EXPECT_TRUE(split) << "the plan ran unsplit";
            }
          }
          {
            SCOPED_TRACE(fp8_trace(dt, kv, d, "ragged, " + std::to_string(sh.qo.back()) + " q"));
            const Tensor k = random_fp8_codes({kvp.back(), sh.hkv, d}, kv, 23);
            const Tensor v = random_fp8_codes({kvp.back(), sh.hkv, d}, kv, 29);
            // fixed_split_size counts tokens here: the paged case's 3 pages of 16 (3 tokens a
            // chunk would need 22775 partial rows, over the workspace: the plan would run unsplit).
            PrefillPlanOptions pr = po;
            if (pr.fixed_split_size) pr.fixed_split_size = *pr.fixed_split_size * 16;
            bool split = false;
            auto run = [&](Device dev) {
              BatchPrefillWithRaggedKVCacheWrapper w(Tensor::zeros({32 << 20}, DType::kUInt8, dev),
                                                     "NHD", false, {}, {}, {}, {}, "fa2");
              w.plan(int_tensor(qo), int_tensor(kvp), sh.hq, sh.hkv, d, pr);
              if (dev.is_cuda()) split = w.split_kv();
              return w.run(q.to(dev), k.to(dev), v.to(dev), ro);
            };
            expect_fp8_close(run(g), run(Device::cpu()), dt);
            if (sh.split) {
              EXPECT_TRUE(split) << "the plan ran unsplit";
            }
          }
        }
      }
    }
  }
}

// fp8 K/V with a custom mask (SGLang's speculative-decoding verify over an fp8 cache), with a mask
// and a soft cap, and with ALiBi: the FA2 kernel (no call of the CUDA-core kernel,
// which took these before session 68), paged and ragged, against the CPU reference: a batch of
// a few draft tokens a request beside a 200-query request (64-row blocks, two a work item), and
// a verify batch alone (16 packed rows at most: the mask's 16-row blocks, fp8 widened in
// registers, up to head dim 128), each with a split plan.
TEST(PrefillKernelCuda, Fp8KvWithCustomMaskOrAlibiRunsOnTheFa2Kernel) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  struct Variant {
    const char* name;
    bool mask, alibi;
    double cap;
  };
  // The GPU run against the CPU's, with no launch of the CUDA-core kernel.
  auto expect_on_tensor_cores = [&](const auto& run, DType dt) {
    const AttentionOutput cpu = run(Device::cpu());
    const uint64_t core_before = testing::cuda_core_decode_launches();
    const AttentionOutput gpu = run(g);
    EXPECT_EQ(testing::cuda_core_decode_launches(), core_before) << "ran on the CUDA-core kernel";
    expect_fp8_close(gpu, cpu, dt);
  };
  const Variant variants[] = {
      {"mask", true, false, 0.0}, {"mask + cap", true, false, 30.0}, {"alibi", false, true, 0.0}};
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (DType kv : {DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
      for (int64_t d : {64, 128, 256}) {
        for (const Variant& var : variants) {
          for (bool verify : {false, true}) {
            // verify: every request a few draft tokens (16 packed rows at most): a mask's 16-row
            // blocks at head dims 64 / 128 (fp8 widened in registers), ALiBi's 64-row ones.
            const std::vector<int32_t> qo_lens =
                verify ? std::vector<int32_t>{4, 1, 3, 4} : std::vector<int32_t>{4, 1, 200, 7};
            const std::vector<int32_t> kv_lens{300, 17, 260, 1000};
            std::vector<int32_t> qo{0}, kvp{0};
            for (std::size_t b = 0; b < qo_lens.size(); ++b) {
              qo.push_back(qo.back() + qo_lens[b]);
              kvp.push_back(kvp.back() + kv_lens[b]);
            }
            const int64_t hq = 16, hkv = 4;
            Tensor q = Tensor::empty({qo.back(), hq, d}, dt).uniform_(5);
            PrefillPlanOptions po;
            po.q_data_type = dt;
            po.kv_data_type = kv;
            po.causal = !var.mask;  // a custom mask replaces causality (upstream ignores causal)
            po.logits_soft_cap = var.cap;
            po.fixed_split_size = 4;  // pages: the 1000-key request in chunks
            if (var.alibi) po.pos_encoding_mode = "ALIBI";
            if (var.mask) {
              std::vector<double> bits;
              for (std::size_t b = 0; b < qo_lens.size(); ++b) {
                for (int64_t i = 0; i < qo_lens[b]; ++i) {
                  for (int64_t j = 0; j < kv_lens[b]; ++j) bits.push_back(mask_bit(i, j));
                }
              }
              po.custom_mask =
                  Tensor::from_vector(bits, {static_cast<int64_t>(bits.size())}, DType::kBool);
            }
            const AttentionRunOptions ro = fp8_run_options(kv);
            {
              SCOPED_TRACE(fp8_trace(
                  dt, kv, d, std::string("paged, ") + var.name + (verify ? ", verify" : "")));
              const Fp8Paged f = make_fp8_paged(kv_lens, 16, hkv, d, kv, 31);
              bool split = false;
              auto run = [&](Device dev) {
                BatchPrefillWithPagedKVCacheWrapper w(Tensor::zeros({32 << 20}, DType::kUInt8, dev),
                                                      "NHD", false, {}, {}, {}, {}, {}, {}, "fa2");
                w.plan(int_tensor(qo), f.indptr, f.indices, f.last_page_len, hq, hkv, d, 16, po);
                if (dev.is_cuda()) split = w.split_kv();
                return w.run(q.to(dev), PagedKVCache(f.k.to(dev), f.v.to(dev)), ro);
              };
              expect_on_tensor_cores(run, dt);
              EXPECT_TRUE(split) << "the plan ran unsplit";
            }
            {
              SCOPED_TRACE(fp8_trace(
                  dt, kv, d, std::string("ragged, ") + var.name + (verify ? ", verify" : "")));
              const Tensor k = random_fp8_codes({kvp.back(), hkv, d}, kv, 37);
              const Tensor v = random_fp8_codes({kvp.back(), hkv, d}, kv, 41);
              PrefillPlanOptions pr = po;
              pr.fixed_split_size = 64;  // tokens here
              auto run = [&](Device dev) {
                BatchPrefillWithRaggedKVCacheWrapper w(
                    Tensor::zeros({32 << 20}, DType::kUInt8, dev), "NHD", false, {}, {}, {}, {},
                    "fa2");
                w.plan(int_tensor(qo), int_tensor(kvp), hq, hkv, d, pr);
                return w.run(q.to(dev), k.to(dev), v.to(dev), ro);
              };
              expect_on_tensor_cores(run, dt);
            }
          }
        }
      }
    }
  }
}

// The Hopper kernel over fp8 K/V (e4m3, e5m2: copied as stored, widened each tile into the 16-bit
// tiles the wgmma read) against the FA2 kernel's fp8 path (backend "fa2") and the CPU reference:
// head dims 64, 128 and 256, paged and ragged, causal and not, a soft cap with split KV; at 128
// and 256 its ping-pong schedule too, bit for bit against the plain one.
TEST(PrefillKernelCuda, HopperKernelFp8KvMatchesFa2KernelAndCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
#if !FLASHINFER_TEST_HAVE_CUTLASS
  GTEST_SKIP() << "built without CUTLASS's headers: no Hopper kernel";
#else
  const Device g = Device::cuda();
  if (api::compute_capability(g) != 90) GTEST_SKIP() << "the Hopper kernel is sm_90a code";
  const std::vector<int32_t> kv_lens{300, 40, 1000};
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (DType kv : {DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
      for (int64_t d : {64, 128, 256}) {
        // variant 0: causal; 1: not; 2: soft cap + split; 3: causal, 64-row tiles (one-warpgroup
        // blocks; not built at head dim 256, where the FA2 kernel runs it and the counter is
        // not checked)
        for (int variant = 0; variant < 4; ++variant) {
          const std::vector<int32_t> qo_lens =
              variant == 3 ? std::vector<int32_t>{9, 1, 16} : std::vector<int32_t>{200, 1, 70};
          std::vector<int32_t> qo{0}, kvp{0};
          for (std::size_t b = 0; b < qo_lens.size(); ++b) {
            qo.push_back(qo.back() + qo_lens[b]);
            kvp.push_back(kvp.back() + kv_lens[b]);
          }
          Tensor q = Tensor::empty({qo.back(), 32, d}, dt).uniform_(5);
          PrefillPlanOptions po;
          po.q_data_type = dt;
          po.kv_data_type = kv;
          po.causal = variant != 1;
          if (variant == 2) {
            po.logits_soft_cap = 30.0;
            po.fixed_split_size = 3;
          }
          const AttentionRunOptions ro = fp8_run_options(kv);
          const Fp8Paged f = make_fp8_paged(kv_lens, 16, 8, d, kv, 17);
          const Tensor k = random_fp8_codes({kvp.back(), 8, d}, kv, 23);
          const Tensor v = random_fp8_codes({kvp.back(), 8, d}, kv, 29);
          for (bool paged : {true, false}) {
            SCOPED_TRACE(fp8_trace(
                dt, kv, d,
                std::string(paged ? "paged" : "ragged") + ", variant " + std::to_string(variant)));
            // Variant 2 splits: 3 pages of 16, or 48 tokens when ragged; 2870 partial rows, up to
            // 94 MB at head dim 256, so a 128 MiB workspace (in 32 MiB the plan ran unsplit).
            PrefillPlanOptions pk = po;
            if (!paged && pk.fixed_split_size) pk.fixed_split_size = *pk.fixed_split_size * 16;
            bool split = false;
            auto run = [&](Device dev, const std::string& backend) {
              if (paged) {
                BatchPrefillWithPagedKVCacheWrapper w(
                    Tensor::zeros({128 << 20}, DType::kUInt8, dev), "NHD", false, {}, {}, {}, {},
                    {}, {}, backend);
                w.plan(int_tensor(qo), f.indptr, f.indices, f.last_page_len, 32, 8, d, 16, pk);
                if (dev.is_cuda()) split = w.split_kv();
                return w.run(q.to(dev), PagedKVCache(f.k.to(dev), f.v.to(dev)), ro);
              }
              BatchPrefillWithRaggedKVCacheWrapper w(Tensor::zeros({128 << 20}, DType::kUInt8, dev),
                                                     "NHD", false, {}, {}, {}, {}, backend);
              w.plan(int_tensor(qo), int_tensor(kvp), 32, 8, d, pk);
              if (dev.is_cuda()) split = w.split_kv();
              return w.run(q.to(dev), k.to(dev), v.to(dev), ro);
            };
            const uint64_t before = kernels::cuda::prefill_sm90_launches();
            const uint64_t small_before = kernels::cuda::prefill_sm90_small_launches();
            AttentionOutput hopper;  // the plain schedule, whatever the run exported
            {
              const testing::ScopedEnv off("FLASHINFER_PREFILL_SM90_PINGPONG", nullptr);
              hopper = run(g, "fa3");
            }
            if (variant == 2) {
              EXPECT_TRUE(split) << "the plan ran unsplit";
            }
            if (variant != 3 || d != 256) {
              EXPECT_GT(kernels::cuda::prefill_sm90_launches(), before)
                  << "the Hopper kernel did not run";
              EXPECT_EQ(kernels::cuda::prefill_sm90_small_launches() > small_before, variant == 3)
                  << "one-warpgroup blocks";
            }
            // The ping-pong schedule (tall blocks at head dims 128 and 256): the same bits.
            if (variant != 3 && d != 64) {
              const uint64_t pp_before = kernels::cuda::prefill_sm90_ping_pong_launches();
              AttentionOutput ping_pong;
              {
                const testing::ScopedEnv on("FLASHINFER_PREFILL_SM90_PINGPONG", "1");
                ping_pong = run(g, "fa3");
              }
              EXPECT_GT(kernels::cuda::prefill_sm90_ping_pong_launches(), pp_before)
                  << "the ping-pong schedule did not run";
              EXPECT_TRUE(ping_pong.out.to_double_vector() == hopper.out.to_double_vector())
                  << "ping-pong out differs from the plain schedule's";
              EXPECT_TRUE(ping_pong.lse.to_double_vector() == hopper.lse.to_double_vector())
                  << "ping-pong lse differs from the plain schedule's";
            }
            const AttentionOutput fa2 = run(g, "fa2");
            expect_fp8_close(hopper, run(Device::cpu(), "auto"), dt);
            EXPECT_TRUE(testing::all_close(hopper.out, fa2.out, testing::default_tolerance(dt)))
                << "vs the FA2 kernel";
            EXPECT_TRUE(testing::all_close(hopper.lse, fa2.lse, {1e-3, 1e-4})) << "lse vs FA2";
          }
        }
      }
    }
  }
#endif
}

// use_tensor_cores=True decode over an fp8 cache: 16-row blocks whose warps split the keys (GQA
// 4; their fp8 fragments widened in registers), 64-row blocks (GQA 32; widened in shared memory),
// a soft cap and split KV, all on the FA2 kernel (never the CUDA-core one).
TEST(PrefillKernelCuda, Fp8KvTensorCoreDecodeMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (DType kv : {DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
      for (int64_t d : {64, 128, 256}) {
        for (auto heads : {std::pair<int64_t, int64_t>{32, 8}, {32, 1}}) {
          for (double cap : {0.0, 30.0}) {
            const int64_t hq = heads.first, hkv = heads.second;
            const std::optional<int64_t> split =
                cap > 0.0 ? std::optional<int64_t>(2) : std::nullopt;
            SCOPED_TRACE(fp8_trace(dt, kv, d,
                                   "decode heads " + std::to_string(hq) + ":" +
                                       std::to_string(hkv) + " cap " + std::to_string(cap)));
            const std::vector<int32_t> lens{1, 17, 300, 64, 0};
            const Fp8Paged f = make_fp8_paged(lens, 16, hkv, d, kv, 31);
            Tensor q = Tensor::empty({static_cast<int64_t>(lens.size()), hq, d}, dt).uniform_(4);
            BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
            po.q_data_type = dt;
            po.kv_data_type = kv;
            po.fixed_split_size = split;
            if (cap > 0.0) po.logits_soft_cap = cap;
            const AttentionRunOptions ro = fp8_run_options(kv);
            // "fa2": the FA2 kernel's fp8 blocks (on sm_90 "auto" hands 32:1 to the Hopper kernel).
            bool gpu_split = false;
            auto run = [&](Device dev) {
              BatchDecodeWithPagedKVCacheWrapper w(Tensor::zeros({32 << 20}, DType::kUInt8, dev),
                                                   "NHD", false, true, {}, {}, {}, "fa2");
              w.plan(f.indptr, f.indices, f.last_page_len, hq, hkv, d, 16, po);
              if (dev.is_cuda()) gpu_split = w.split_kv();
              return w.run(q.to(dev), PagedKVCache(f.k.to(dev), f.v.to(dev)), ro);
            };
            // A call that launched the CUDA-core kernel did not run the kernel under test.
            const uint64_t core_before = testing::cuda_core_decode_launches();
            const AttentionOutput gpu = run(Device::cuda());
            EXPECT_EQ(testing::cuda_core_decode_launches(), core_before)
                << "ran on the CUDA-core kernel";
            expect_fp8_close(gpu, run(Device::cpu()), dt);
            if (split) {
              EXPECT_TRUE(gpu_split) << "the plan ran unsplit";
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace flashinfer
