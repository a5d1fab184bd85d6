// The cuDNN backend of cudnn_batch_prefill_with_kv_cache and cudnn_batch_decode_with_kv_cache
// (kernels/cuda/attention_cudnn.cpp): the SDPA graph's tensors, the index arrays handed to it and
// the graph cache's key (pure functions, on the CPU), and the ops on a GPU against the CPU
// reference (skipped without a GPU, without cuDNN in the build, or below sm80).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "api/device_props.h"
#include "flashinfer/flashinfer.h"
#include "kernels/cudnn_attention_plan.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

#if FLASHINFER_TEST_HAVE_CUDNN
#include "kernels/cuda/attention_cudnn.h"
#endif

namespace flashinfer {
namespace {

namespace dnn = kernels::dnn;
using testing::int_tensor;

// ---- the graph's tensors, index arrays and cache key (kernels/cudnn_attention_plan.h) ---------

// A prefill: 3 requests, q [rows, 8, 128] and out dense, HND pages [20, 2, 16, 128] of a
// [20, 2, 2, 16, 128] K/V pool (k and v interleaved per page), lse [rows, 8].
dnn::SdpaProblem prefill_problem() {
  dnn::SdpaProblem p;
  p.batch = 3;
  p.hq = 8;
  p.hkv = 2;
  p.d = 128;
  p.max_s_q = 32;
  p.max_s_kv = 70;
  p.num_pages = 20;
  p.page_size = 16;
  p.q_stride_n = 8 * 128;
  p.q_stride_h = 128;
  p.o_stride_n = 8 * 128;
  p.o_stride_h = 128;
  p.k_stride_page = 2 * 2 * 16 * 128;
  p.k_stride_h = 16 * 128;
  p.k_stride_row = 128;
  p.v_stride_page = 2 * 2 * 16 * 128;
  p.v_stride_h = 16 * 128;
  p.v_stride_row = 128;
  p.lse_stride_n = 8;
  p.lse_stride_h = 1;
  p.ragged = true;
  p.causal = true;
  p.stats = true;
  p.dtype = DType::kBFloat16;
  p.scale = 0.125f;
  return p;
}

TEST(CudnnSdpaPlan, PrefillTensors) {
  const dnn::SdpaProblem p = prefill_problem();
  EXPECT_EQ(dnn::sdpa_table_cols(p), 5);  // ceil(70 / 16)
  const dnn::SdpaTensors t = dnn::sdpa_tensors(p);
  // [b, h, s, d] views of [rows, H, D]: the batch stride is the dense one (ragged offsets find
  // each request), heads step 128, tokens step a row.
  EXPECT_EQ(t.q.dims, (std::array<int64_t, 4>{3, 8, 32, 128}));
  EXPECT_EQ(t.q.strides, (std::array<int64_t, 4>{32 * 1024, 128, 1024, 1}));
  EXPECT_EQ(t.o, t.q);
  EXPECT_EQ(t.stats.dims, (std::array<int64_t, 4>{3, 8, 32, 1}));
  EXPECT_EQ(t.stats.strides, (std::array<int64_t, 4>{32 * 8, 1, 8, 1}));
  // The page containers with the pool's strides.
  EXPECT_EQ(t.k.dims, (std::array<int64_t, 4>{20, 2, 16, 128}));
  EXPECT_EQ(t.k.strides, (std::array<int64_t, 4>{8192, 2048, 128, 1}));
  EXPECT_EQ(t.v, t.k);
  EXPECT_EQ(t.table.dims, (std::array<int64_t, 4>{3, 1, 5, 1}));
  EXPECT_EQ(t.table.strides, (std::array<int64_t, 4>{5, 5, 1, 1}));
  EXPECT_EQ(t.lens.dims, (std::array<int64_t, 4>{3, 1, 1, 1}));
  EXPECT_EQ(t.lens.strides, (std::array<int64_t, 4>{1, 1, 1, 1}));
  EXPECT_EQ(t.offsets.dims, (std::array<int64_t, 4>{4, 1, 1, 1}));
  EXPECT_EQ(t.offsets.strides, (std::array<int64_t, 4>{1, 1, 1, 1}));
}

TEST(CudnnSdpaPlan, DecodeTensors) {
  // One query per request: row b, through the batch stride; no ragged offsets, no stats. A q
  // view with padded rows keeps its strides.
  dnn::SdpaProblem p = prefill_problem();
  p.max_s_q = 1;
  p.ragged = false;
  p.causal = false;
  p.stats = false;
  p.q_stride_n = 8 * 128 + 64;
  const dnn::SdpaTensors t = dnn::sdpa_tensors(p);
  EXPECT_EQ(t.q.dims, (std::array<int64_t, 4>{3, 8, 1, 128}));
  EXPECT_EQ(t.q.strides, (std::array<int64_t, 4>{1088, 128, 1088, 1}));
  EXPECT_EQ(t.o.strides, (std::array<int64_t, 4>{1024, 128, 1024, 1}));
  EXPECT_EQ(t.stats, dnn::Tensor4d{});
  EXPECT_EQ(t.offsets, dnn::Tensor4d{});
}

TEST(CudnnSdpaPlan, IndexLayoutAndValues) {
  const dnn::SdpaProblem p = prefill_problem();
  const dnn::SdpaIndexLayout l = dnn::sdpa_index_layout(p);
  // Each array starts 16-byte aligned: lens 3 -> 4 ints, table 15 -> 16, offsets 4.
  EXPECT_EQ(l.seq_len_q, 0);
  EXPECT_EQ(l.seq_len_kv, 4);
  EXPECT_EQ(l.table, 8);
  EXPECT_EQ(l.offset_q, 24);
  EXPECT_EQ(l.offset_o, 28);
  EXPECT_EQ(l.offset_stats, 32);
  EXPECT_EQ(l.ints, 36);
  EXPECT_EQ(l.bytes, 256);

  // The caller's table has 6 columns, -1 past each request's blocks; lengths need 2, 1 and 5
  // blocks of 16.
  const std::vector<int32_t> lq{5, 1, 26}, lk{17, 16, 70}, indptr{0, 5, 6, 32};
  const std::vector<int32_t> table{3, 9,  -1, -1, -1, -1,  //
                                   0, -1, -1, -1, -1, -1,  //
                                   4, 5,  6,  7,  8,  -1};
  std::vector<int32_t> v;
  ASSERT_TRUE(dnn::sdpa_index_values(p, l, lq, lk, indptr, table.data(), 6, v));
  ASSERT_EQ(v.size(), 36u);
  const std::vector<int32_t> expect{
      5,  1,        26,       0,  // seq_len_q
      17, 16,       70,       0,  // seq_len_kv
      3,  9,        0,        0,         0, 0, 0, 0,
      0,  0,        4,        5,         6, 7, 8, 0,  // table [3, 5]: -1 never copied
      0,  5 * 1024, 6 * 1024, 32 * 1024,              // q offsets (elements)
      0,  5 * 1024, 6 * 1024, 32 * 1024,              // out offsets
      0,  5 * 8,    6 * 8,    32 * 8};                // lse offsets
  EXPECT_EQ(v, expect);

  // Decode: no offsets; the lengths and table only.
  dnn::SdpaProblem d = p;
  d.max_s_q = 1;
  d.ragged = false;
  d.stats = false;
  const dnn::SdpaIndexLayout dl = dnn::sdpa_index_layout(d);
  EXPECT_EQ(dl.ints, 24);
  EXPECT_EQ(dl.bytes, 256);
  ASSERT_TRUE(dnn::sdpa_index_values(d, dl, {1, 1, 1}, lk, {}, table.data(), 6, v));
  EXPECT_EQ(std::vector<int32_t>(v.begin(), v.begin() + 8),
            (std::vector<int32_t>{1, 1, 1, 0, 17, 16, 70, 0}));

  // An element offset past int32 does not fit the graph.
  dnn::SdpaProblem big = p;
  big.q_stride_n = int64_t{1} << 27;  // row 32 starts at 2^32
  EXPECT_FALSE(
      dnn::sdpa_index_values(big, dnn::sdpa_index_layout(big), lq, lk, indptr, table.data(), 6, v));
}

TEST(CudnnSdpaPlan, KeyCoversWhatTheGraphDependsOn) {
  const dnn::SdpaProblem p = prefill_problem();
  const dnn::SdpaGraphKey k0 = dnn::make_sdpa_key(0, p);
  const dnn::SdpaGraphKeyHash hash;
  EXPECT_EQ(k0, dnn::make_sdpa_key(0, p));
  EXPECT_EQ(hash(k0), hash(dnn::make_sdpa_key(0, p)));
  std::vector<dnn::SdpaGraphKey> others;
  others.push_back(dnn::make_sdpa_key(1, p));  // another device
  const auto changed = [&](auto edit) {
    dnn::SdpaProblem q = p;
    edit(q);
    others.push_back(dnn::make_sdpa_key(0, q));
  };
  changed([](dnn::SdpaProblem& q) { q.causal = false; });
  changed([](dnn::SdpaProblem& q) { q.stats = false; });
  changed([](dnn::SdpaProblem& q) { q.scale = 0.25f; });
  changed([](dnn::SdpaProblem& q) { q.dtype = DType::kFloat16; });
  changed([](dnn::SdpaProblem& q) { q.max_s_kv = 71; });  // same 5 blocks, another extent
  changed([](dnn::SdpaProblem& q) { q.max_s_q = 33; });
  changed([](dnn::SdpaProblem& q) { q.batch = 4; });
  changed([](dnn::SdpaProblem& q) { q.hq = 16; });
  changed([](dnn::SdpaProblem& q) { q.num_pages = 21; });
  changed([](dnn::SdpaProblem& q) { q.page_size = 32; });
  changed([](dnn::SdpaProblem& q) { q.k_stride_page = 2 * 8192; });
  changed([](dnn::SdpaProblem& q) { q.v_stride_row = 256; });
  changed([](dnn::SdpaProblem& q) { q.o_stride_n = 2048; });
  changed([](dnn::SdpaProblem& q) { q.lse_stride_n = 16; });
  for (std::size_t i = 0; i < others.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_FALSE(others[i] == k0);
    EXPECT_NE(hash(others[i]), hash(k0));
  }
}

TEST(CudnnSdpaPlan, RetriesWithCompositeOnce) {
  using Impl = dnn::SdpaImplementation;
  // The frontend's choice failed to build: the composite implementation next, then nothing.
  EXPECT_EQ(dnn::sdpa_retry_implementation(Impl::kAuto, true), Impl::kComposite);
  EXPECT_EQ(dnn::sdpa_retry_implementation(Impl::kComposite, true), std::nullopt);
  // No implementation described the graph (the composite one checked too): no retry.
  EXPECT_EQ(dnn::sdpa_retry_implementation(Impl::kAuto, false), std::nullopt);
  EXPECT_EQ(dnn::sdpa_retry_implementation(Impl::kComposite, false), std::nullopt);
}

#if FLASHINFER_TEST_HAVE_CUDNN
// The graphs the ops build validate in the cuDNN frontend against this machine's libcudnn, for an
// sm_80 and an sm_90 GPU, with the frontend's choice of implementation and with the composite one
// the backend retries with (no GPU needed: the support surface, shapes, strides and dtypes; which
// engine runs them needs a GPU, CudnnAttentionCuda below).
TEST(CudnnSdpaPlan, GraphsValidate) {
  struct Case {
    const char* name;
    dnn::SdpaProblem p;
  };
  std::vector<Case> cases;
  cases.push_back({"prefill, causal, lse, bf16", prefill_problem()});
  dnn::SdpaProblem p = prefill_problem();
  p.causal = false;
  p.stats = false;
  p.dtype = DType::kFloat16;
  cases.push_back({"prefill, fp16", p});
  p = prefill_problem();
  p.hkv = 8;  // MHA, d 64
  p.d = 64;
  p.q_stride_n = p.o_stride_n = 8 * 64;
  p.q_stride_h = p.o_stride_h = 64;
  p.k_stride_page = p.v_stride_page = 8 * 16 * 64;
  p.k_stride_h = p.v_stride_h = 16 * 64;
  p.k_stride_row = p.v_stride_row = 64;
  cases.push_back({"prefill, d 64", p});
  p = prefill_problem();
  p.max_s_q = 1;
  p.ragged = false;
  p.causal = false;
  p.stats = false;
  cases.push_back({"decode", p});
  for (int sm : {80, 90}) {
    for (const Case& c : cases) {
      EXPECT_EQ(kernels::cuda::cudnn_validate_sdpa(c.p, sm), "") << c.name << ", sm " << sm;
      EXPECT_EQ(kernels::cuda::cudnn_validate_sdpa(c.p, sm, dnn::SdpaImplementation::kComposite),
                "")
          << c.name << ", composite, sm " << sm;
    }
  }
  // What validation refuses (the ops then run the kernels): heads not a multiple of the KV
  // heads, a GPU older than sm_80.
  p = prefill_problem();
  p.hkv = 3;
  EXPECT_NE(kernels::cuda::cudnn_validate_sdpa(p, 90), "");
  EXPECT_NE(kernels::cuda::cudnn_validate_sdpa(prefill_problem(), 75), "");
  EXPECT_NE(kernels::cuda::cudnn_validate_sdpa(p, 90, dnn::SdpaImplementation::kComposite), "");
}
#endif

// ---- the ops on a GPU against the CPU reference -----------------------------------------------

#if FLASHINFER_TEST_HAVE_CUDNN
// A paged HND cache [pages, Hkv, P, D] of `dtype` (K and V), pages handed out shuffled, and a
// block table [batch, blocks + 1] padded with -1 (never to be read).
struct Paged {
  Tensor k, v, table;
};

Paged make_paged_hnd(const std::vector<int32_t>& lens, int64_t page, int64_t hkv, int64_t d,
                     DType dtype, uint64_t seed) {
  int64_t pages = 2, cols = 1;
  for (int32_t len : lens) {
    pages += (len + page - 1) / page;
    cols = std::max<int64_t>(cols, (len + page - 1) / page + 1);
  }
  std::vector<int32_t> perm(static_cast<std::size_t>(pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(static_cast<uint32_t>(seed)));
  std::vector<int32_t> flat;
  std::size_t next = 0;
  for (int32_t len : lens) {
    const int64_t n = (len + page - 1) / page;
    for (int64_t i = 0; i < cols; ++i) flat.push_back(i < n ? perm[next++] : -1);
  }
  Paged c;
  c.k = testing::rand_tensor({pages, hkv, page, d}, dtype, seed + 1, -1.0, 1.0);
  c.v = testing::rand_tensor({pages, hkv, page, d}, dtype, seed + 2, -1.0, 1.0);
  c.table = int_tensor(flat).view({static_cast<int64_t>(lens.size()), cols});
  return c;
}

Tensor lens_tensor(const std::vector<int32_t>& v) {
  return int_tensor(v).view({static_cast<int64_t>(v.size()), 1, 1, 1});
}

bool skip_cudnn_cuda() {
  return !testing::cuda_available() || !build_info().cudnn ||
         api::compute_capability(Device::cuda()) < 80;
}
#define FLASHINFER_SKIP_WITHOUT_CUDNN_GPU()                            \
  do {                                                                 \
    if (skip_cudnn_cuda()) GTEST_SKIP() << "no GPU of sm80+ or cuDNN"; \
  } while (0)

struct PrefillCase {
  std::vector<int32_t> lq, lk;
  int64_t hq, hkv, d, page;
  bool causal, lse;
  DType dtype;
};

TEST(CudnnAttentionCuda, PrefillMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDNN_GPU();
  const Device g = Device::cuda();
  const std::vector<PrefillCase> cases = {
      // GQA 4:1, ragged lengths, a request with one query and one whose queries equal its keys.
      {{5, 17, 1, 32}, {40, 17, 77, 32}, 8, 2, 128, 16, true, true, DType::kBFloat16},
      {{5, 17, 1, 32}, {40, 17, 77, 32}, 8, 2, 128, 16, false, true, DType::kBFloat16},
      {{5, 17, 1, 32}, {40, 17, 77, 32}, 8, 2, 128, 16, true, false, DType::kBFloat16},
      {{3, 9}, {70, 9}, 4, 4, 64, 32, true, true, DType::kFloat16},
      {{64, 7, 20}, {64, 100, 21}, 16, 2, 128, 64, false, true, DType::kBFloat16},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const PrefillCase& c = cases[i];
    SCOPED_TRACE(i);
    const int64_t rows = std::accumulate(c.lq.begin(), c.lq.end(), int64_t{0});
    const int64_t max_q = *std::max_element(c.lq.begin(), c.lq.end());
    const int64_t max_kv = *std::max_element(c.lk.begin(), c.lk.end()) + 3;
    Tensor q = testing::rand_tensor({rows, c.hq, c.d}, c.dtype, 10 + i, -1.0, 1.0);
    Paged pc = make_paged_hnd(c.lk, c.page, c.hkv, c.d, c.dtype, 20 + i);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
    const auto run = [&](Device dev) {
      return cudnn_batch_prefill_with_kv_cache(q.to(dev), pc.k.to(dev), pc.v.to(dev), scale,
                                               Tensor::zeros({1 << 16}, DType::kUInt8, dev), max_q,
                                               max_kv, lens_tensor(c.lq), lens_tensor(c.lk),
                                               pc.table.to(dev), c.causal, c.lse);
    };
    const CudnnPrefillResult ref = run(Device::cpu());
    const uint64_t runs0 = kernels::cuda::cudnn_attention_stats().runs;
    const CudnnPrefillResult got = run(g);
    EXPECT_EQ(kernels::cuda::cudnn_attention_stats().runs, runs0 + 1) << "cuDNN did not run";
    EXPECT_TRUE(testing::all_close(got.out, ref.out, testing::attention_tolerance(c.dtype)));
    ASSERT_EQ(got.lse.defined(), c.lse);
    if (c.lse) {
      EXPECT_TRUE(testing::all_close(got.lse, ref.lse, {2e-3, 1e-3}));  // base 2, as the CPU's
    }
  }
}

TEST(CudnnAttentionCuda, DecodeMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDNN_GPU();
  const Device g = Device::cuda();
  const std::vector<int32_t> lens{9, 100, 33, 1};
  Paged pc = make_paged_hnd(lens, 16, 8, 128, DType::kBFloat16, 3);
  Tensor q = testing::rand_tensor({4, 32, 128}, DType::kBFloat16, 4, -1.0, 1.0);
  const auto run = [&](Device dev) {
    return cudnn_batch_decode_with_kv_cache(q.to(dev), pc.k.to(dev), pc.v.to(dev), 0.088,
                                            Tensor::zeros({1 << 16}, DType::kUInt8, dev), 112,
                                            lens_tensor(lens), pc.table.to(dev));
  };
  const Tensor ref = run(Device::cpu());
  const uint64_t runs0 = kernels::cuda::cudnn_attention_stats().runs;
  EXPECT_TRUE(testing::all_close(run(g), ref, testing::attention_tolerance(DType::kBFloat16)));
  EXPECT_EQ(kernels::cuda::cudnn_attention_stats().runs, runs0 + 1) << "cuDNN did not run";

  // Without a block table request b's cache is page b: [batch, Hkv, max_seq, D]; a page of 64
  // keys (cuDNN's paged engines take power-of-two pages only).
  Tensor k = testing::rand_tensor({2, 2, 64, 64}, DType::kFloat16, 5, -1.0, 1.0);
  Tensor v = testing::rand_tensor({2, 2, 64, 64}, DType::kFloat16, 6, -1.0, 1.0);
  Tensor q2 = testing::rand_tensor({2, 8, 64}, DType::kFloat16, 7, -1.0, 1.0);
  const auto run2 = [&](Device dev, int64_t max_seq) {
    return cudnn_batch_decode_with_kv_cache(
        q2.to(dev), k.slice(2, 0, max_seq).to(dev), v.slice(2, 0, max_seq).to(dev), 0.125,
        Tensor::zeros({1 << 16}, DType::kUInt8, dev), max_seq, int_tensor({48, 5}));
  };
  EXPECT_TRUE(testing::all_close(run2(g, 64), run2(Device::cpu(), 64),
                                 testing::attention_tolerance(DType::kFloat16)));
  EXPECT_EQ(kernels::cuda::cudnn_attention_stats().runs, runs0 + 2) << "cuDNN did not run";
  // A page of 48 keys: declined before any graph is built, this library's kernels answer.
  EXPECT_TRUE(testing::all_close(run2(g, 48), run2(Device::cpu(), 48),
                                 testing::attention_tolerance(DType::kFloat16)));
  EXPECT_EQ(kernels::cuda::cudnn_attention_stats().runs, runs0 + 2) << "48-key pages ran cuDNN";
}

// A second call of one shape finds its graph and allocates nothing on the device (with the
// caller's large workspace or the stream's own); new data, same graph, right answer.
TEST(CudnnAttentionCuda, CachedSecondCall) {
  FLASHINFER_SKIP_WITHOUT_CUDNN_GPU();
  const Device g = Device::cuda();
  const std::vector<int32_t> lq{7, 12}, lk{30, 12};
  Paged pc = make_paged_hnd(lk, 16, 2, 128, DType::kBFloat16, 8);
  for (int64_t ws_bytes : {int64_t{1} << 16, int64_t{128} << 20}) {
    SCOPED_TRACE(ws_bytes);
    const Tensor ws = Tensor::zeros({ws_bytes}, DType::kUInt8, g);
    const auto run = [&](const Tensor& q, Device dev, const Tensor& w) {
      return cudnn_batch_prefill_with_kv_cache(q.to(dev), pc.k.to(dev), pc.v.to(dev), 0.09, w, 16,
                                               32, lens_tensor(lq), lens_tensor(lk),
                                               pc.table.to(dev), true, true);
    };
    const Tensor cpu_ws = Tensor::zeros({16}, DType::kUInt8);
    Tensor q1 = testing::rand_tensor({19, 4, 128}, DType::kBFloat16, 30, -1.0, 1.0);
    Tensor q2 = testing::rand_tensor({19, 4, 128}, DType::kBFloat16, 31, -1.0, 1.0);
    run(q1, g, ws);  // builds (or finds) the graph, grows the stream's workspace if need be
    const kernels::cuda::CudnnAttentionStats s0 = kernels::cuda::cudnn_attention_stats();
    const CudnnPrefillResult r = run(q2, g, ws);
    const kernels::cuda::CudnnAttentionStats s1 = kernels::cuda::cudnn_attention_stats();
    EXPECT_EQ(s1.runs, s0.runs + 1);
    EXPECT_EQ(s1.graph_hits, s0.graph_hits + 1);
    EXPECT_EQ(s1.graph_builds, s0.graph_builds);
    EXPECT_EQ(s1.composite_graphs, s0.composite_graphs);
    EXPECT_EQ(s1.device_allocs, s0.device_allocs);
    const CudnnPrefillResult ref = run(q2, Device::cpu(), cpu_ws);
    EXPECT_TRUE(testing::all_close(r.out, ref.out, testing::attention_tolerance(DType::kBFloat16)));
    EXPECT_TRUE(testing::all_close(r.lse, ref.lse, {2e-3, 1e-3}));
  }
}

// A call the graph does not express (v_scale multiplies the output) runs this library's kernels,
// with the same result as the CPU.
TEST(CudnnAttentionCuda, CallsThatDoNotFitRunTheKernels) {
  FLASHINFER_SKIP_WITHOUT_CUDNN_GPU();
  const Device g = Device::cuda();
  const std::vector<int32_t> lq{3, 4}, lk{20, 4};
  Paged pc = make_paged_hnd(lk, 8, 2, 64, DType::kBFloat16, 9);
  Tensor q = testing::rand_tensor({7, 4, 64}, DType::kBFloat16, 40, -1.0, 1.0);
  const auto run = [&](Device dev) {
    return cudnn_batch_prefill_with_kv_cache(q.to(dev), pc.k.to(dev), pc.v.to(dev), 0.125,
                                             Tensor::zeros({16}, DType::kUInt8, dev), 4, 20,
                                             lens_tensor(lq), lens_tensor(lk), pc.table.to(dev),
                                             true, false, std::nullopt, std::nullopt, 2.0);
  };
  const uint64_t runs0 = kernels::cuda::cudnn_attention_stats().runs;
  EXPECT_TRUE(testing::all_close(run(g).out, run(Device::cpu()).out,
                                 testing::attention_tolerance(DType::kBFloat16)));
  EXPECT_EQ(kernels::cuda::cudnn_attention_stats().runs, runs0);
}
#endif  // FLASHINFER_TEST_HAVE_CUDNN

}  // namespace
}  // namespace flashinfer
