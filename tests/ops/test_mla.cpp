// DeepSeek MLA: concat_mla_k and append_paged_mla_kv_cache (bit-exact copies, untouched
// elsewhere), BatchMLAPagedAttentionWrapper and the trtllm/xqa block-table entry points against
// an fp64 formula over a grid of dtypes (fp8 KV included), page sizes, causal and query counts;
// hand-checked goldens; bad input; record and replay; the deprecated
// BatchDecodeMlaWithPagedKVCacheWrapper (one query per request) likewise; the CUDA kernel against
// the CPU reference (skipped without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include <unistd.h>
#include <filesystem>

#include "api/device_props.h"
#include "flashinfer/float_formats.h"
#include "flashinfer/ops/mla.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "kernels/mla_page_guard.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"
#if FLASHINFER_TEST_HAVE_CUDART
#include <cuda_runtime.h>

#include "kernels/cuda/mla_cuda.h"
#include "kernels/cuda/mla_sm90.h"
#include "util/cuda_graph_util.h"
#endif

namespace flashinfer {
namespace {

using testing::int_tensor;

using testing::bytes_of;

Tensor workspace() { return Tensor::zeros({1 << 12}, DType::kUInt8); }

std::vector<int32_t> ints_of(const Tensor& t) {
  std::vector<int32_t> v;
  for (double x : t.to(Device::cpu()).to_double_vector()) v.push_back(static_cast<int32_t>(x));
  return v;
}

// ---- concat_mla_k -------------------------------------------------------------------------

TEST(ConcatMlaK, CopiesBitExactlyForEveryDtype) {
  for (DType d : {DType::kBFloat16, DType::kFloat16, DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
    SCOPED_TRACE(dtype_torch_name(d));
    const int64_t T = 3, H = 4, N = 8, R = 4;
    Tensor k_nope = testing::rand_tensor({T, H, N}, d, 1);
    Tensor k_rope = testing::rand_tensor({T, 1, R}, d, 2);
    Tensor k = Tensor::full({T, H, N + R}, 7.0, d);
    concat_mla_k(k, k_nope, k_rope);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const Tensor row = k.select(0, t).select(0, h);
        EXPECT_EQ(bytes_of(row.slice(0, 0, N)), bytes_of(k_nope.select(0, t).select(0, h)));
        EXPECT_EQ(bytes_of(row.slice(0, N, N + R)), bytes_of(k_rope.select(0, t).select(0, 0)));
      }
    }
  }
}

TEST(ConcatMlaK, HandCheckedGoldenAndStridedViews) {
  // k_nope[t, h] = (10t + h, -(10t + h)), k_rope[t] = (100 + t): k[1, 2] = (12, -12, 101).
  Tensor k_nope = Tensor::empty({2, 3, 2}, DType::kBFloat16);
  Tensor k_rope = Tensor::empty({2, 1, 1}, DType::kBFloat16);
  std::vector<double> nope, rope{100, 101};
  for (int t = 0; t < 2; ++t)
    for (int h = 0; h < 3; ++h) {
      nope.push_back(10 * t + h);
      nope.push_back(-(10 * t + h));
    }
  k_nope.copy_(Tensor::from_vector(nope, {2, 3, 2}, DType::kBFloat16));
  k_rope.copy_(Tensor::from_vector(rope, {2, 1, 1}, DType::kBFloat16));
  // k as a strided view (every head row padded by 2 elements).
  Tensor big = Tensor::zeros({2, 3, 5}, DType::kBFloat16);
  Tensor k = big.slice(2, 0, 3);
  concat_mla_k(k, k_nope, k_rope);
  EXPECT_EQ(k.select(0, 1).select(0, 2).to_double_vector(), (std::vector<double>{12, -12, 101}));
  EXPECT_EQ(k.select(0, 0).select(0, 0).to_double_vector(), (std::vector<double>{0, 0, 100}));
  // The padding is untouched.
  for (double x : big.slice(2, 3, 5).to_double_vector()) EXPECT_EQ(x, 0.0);
}

TEST(ConcatMlaK, BadInput) {
  const char* op = "concat_mla_k";
  Tensor kn = Tensor::zeros({2, 3, 4}, DType::kBFloat16);
  Tensor kr = Tensor::zeros({2, 1, 2}, DType::kBFloat16);
  Tensor k = Tensor::zeros({2, 3, 6}, DType::kBFloat16);
  EXPECT_FI_ERROR(concat_mla_k(Tensor::zeros({2, 3, 7}, DType::kBFloat16), kn, kr), op, "k");
  // Upstream 0.7.4's backends: "default" and "cake" make the same copy; others are refused.
  Tensor k2 = Tensor::zeros({2, 3, 6}, DType::kBFloat16);
  Tensor kn2 = Tensor::empty({2, 3, 4}, DType::kBFloat16).uniform_(3);
  Tensor kr2 = Tensor::empty({2, 1, 2}, DType::kBFloat16).uniform_(4);
  concat_mla_k(k, kn2, kr2);
  concat_mla_k(k2, kn2, kr2, "cake");
  EXPECT_EQ(k2.to_double_vector(), k.to_double_vector());
  EXPECT_FI_ERROR(concat_mla_k(k, kn, kr, "triton"), op, "backend");
  EXPECT_FI_ERROR(concat_mla_k(k, kn, Tensor::zeros({2, 2, 2}, DType::kBFloat16)), op, "k_rope");
  EXPECT_FI_ERROR(concat_mla_k(k, Tensor::zeros({2, 2, 4}, DType::kBFloat16), kr), op, "k_nope");
  EXPECT_FI_ERROR(concat_mla_k(k, kn.to(DType::kFloat16), kr), op, "k_nope");
  EXPECT_FI_ERROR(concat_mla_k(Tensor::zeros({2, 3, 6}, DType::kFloat32), kn.to(DType::kFloat32),
                               kr.to(DType::kFloat32)),
                  op, "k");
  EXPECT_FI_ERROR(concat_mla_k(k, kn, Tensor::zeros({2, 1, 2, 1}, DType::kBFloat16)), op, "k_rope");
}

// ---- append_paged_mla_kv_cache --------------------------------------------------------------

TEST(AppendPagedMlaKvCache, WritesEachRowAtItsSlotOnly) {
  for (DType d : {DType::kBFloat16, DType::kFloat8E4M3FN}) {
    SCOPED_TRACE(dtype_torch_name(d));
    // Two requests of 5 and 3 tokens, page_size 2: pages (4, 1, 6) and (0, 3).
    const int64_t P = 2, C = 8, K = 4;
    Tensor ckv = Tensor::zeros({7, P, C}, d);
    Tensor kpe = Tensor::zeros({7, P, K}, d);
    Tensor indptr = int_tensor({0, 3, 5}), indices = int_tensor({4, 1, 6, 0, 3}),
           last = int_tensor({1, 1});
    // Append tokens 3, 4 of request 0 and token 2 of request 1.
    Tensor bi = int_tensor({0, 0, 1}), pos = int_tensor({3, 4, 2});
    Tensor ac = testing::rand_tensor({3, C}, d, 5, 0.5, 1.5);
    Tensor ak = testing::rand_tensor({3, K}, d, 6, 0.5, 1.5);
    append_paged_mla_kv_cache(ac, ak, bi, pos, ckv, kpe, indices, indptr, last);
    // (page, slot) of each appended row: request 0 token 3 -> page 1 slot 1; token 4 -> page 6
    // slot 0; request 1 token 2 -> page 3 slot 0.
    const int64_t where[3][2] = {{1, 1}, {6, 0}, {3, 0}};
    int64_t nonzero = 0;
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(bytes_of(ckv.select(0, where[i][0]).select(0, where[i][1])),
                bytes_of(ac.select(0, i)));
      EXPECT_EQ(bytes_of(kpe.select(0, where[i][0]).select(0, where[i][1])),
                bytes_of(ak.select(0, i)));
    }
    for (double x : ckv.to_double_vector()) nonzero += x != 0.0;
    for (double x : kpe.to_double_vector()) nonzero += x != 0.0;
    EXPECT_EQ(nonzero, 3 * (C + K));  // nothing else written (appended values are >= 0.5)
  }
}

TEST(AppendPagedMlaKvCache, BadInput) {
  const char* op = "append_paged_mla_kv_cache";
  Tensor ckv = Tensor::zeros({4, 2, 8}, DType::kBFloat16);
  Tensor kpe = Tensor::zeros({4, 2, 4}, DType::kBFloat16);
  Tensor indptr = int_tensor({0, 2}), indices = int_tensor({1, 3}), last = int_tensor({1});
  Tensor ac = Tensor::zeros({1, 8}, DType::kBFloat16), ak = Tensor::zeros({1, 4}, DType::kBFloat16);
  Tensor bi = int_tensor({0});
  auto call = [&](const Tensor& a_c, const Tensor& a_k, const Tensor& b, const Tensor& p,
                  const Tensor& c, const Tensor& k, const Tensor& idx) {
    append_paged_mla_kv_cache(a_c, a_k, b, p, c, k, idx, indptr, last);
  };
  call(ac, ak, bi, int_tensor({2}), ckv, kpe, indices);  // valid: length 3
  EXPECT_FI_ERROR(call(ac, ak, bi, int_tensor({3}), ckv, kpe, indices), op, "positions");
  EXPECT_FI_ERROR(call(ac, ak, int_tensor({1}), int_tensor({0}), ckv, kpe, indices), op,
                  "batch_indices");
  EXPECT_FI_ERROR(call(ac, ak, bi, int_tensor({0}), ckv, kpe, int_tensor({1, 4})), op,
                  "kv_indices");
  EXPECT_FI_ERROR(
      call(Tensor::zeros({1, 6}, DType::kBFloat16), ak, bi, int_tensor({0}), ckv, kpe, indices), op,
      "append_ckv");
  EXPECT_FI_ERROR(
      call(ac, Tensor::zeros({2, 4}, DType::kBFloat16), bi, int_tensor({0}), ckv, kpe, indices), op,
      "append_kpe");
  EXPECT_FI_ERROR(call(ac.to(DType::kFloat16), ak, bi, int_tensor({0}), ckv, kpe, indices), op,
                  "append_ckv");
  EXPECT_FI_ERROR(call(ac, ak, bi, int_tensor({0}), Tensor(), kpe, indices), op, "ckv_cache");
  EXPECT_FI_ERROR(call(ac, ak, bi, int_tensor({0}), ckv, Tensor(), indices), op, "kpe_cache");
  EXPECT_FI_ERROR(
      call(ac, ak, bi, int_tensor({0}), ckv, Tensor::zeros({3, 2, 4}, DType::kBFloat16), indices),
      op, "kpe_cache");
  EXPECT_FI_ERROR(append_paged_mla_kv_cache(ac, ak, bi, int_tensor({0}), ckv, kpe, indices, indptr,
                                            int_tensor({3})),
                  op, "kv_last_page_len");
}

// ---- attention ----------------------------------------------------------------------------

// A latent cache with shuffled pages: per request its dense ckv/kpe rows (as doubles) and the
// page table in both forms (indptr/indices and a block table padded with -1).
struct Latent {
  Tensor ckv, kpe;  // [pages, page_size, *]
  Tensor kv;        // [pages, page_size, dc + dk]: the concatenated form (same values)
  Tensor kv_indptr, kv_indices, kv_lens, block_tables;
  std::vector<std::vector<int32_t>> pages;
  int64_t page_size = 1, dc = 0, dk = 0;
  // Row t of request b: ckv then kpe, as doubles.
  std::vector<double> row(int64_t b, int64_t t) const {
    const int64_t pg = pages[b][t / page_size];
    return kv.select(0, pg).select(0, t % page_size).to_double_vector();
  }
};

Latent make_latent(const std::vector<int32_t>& lens, int64_t page_size, int64_t dc, int64_t dk,
                   DType dtype, uint64_t seed) {
  Latent l;
  l.page_size = page_size;
  l.dc = dc;
  l.dk = dk;
  int64_t need = 0, max_blocks = 1;
  for (int32_t n : lens) {
    need += (n + page_size - 1) / page_size;
    max_blocks = std::max<int64_t>(max_blocks, (n + page_size - 1) / page_size + 1);
  }
  const int64_t total = need + 2;
  std::vector<int32_t> perm(static_cast<std::size_t>(total));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> indptr{0}, indices, flat;
  std::size_t next = 0;
  for (int32_t n : lens) {
    std::vector<int32_t> r;
    for (int64_t i = 0; i < (n + page_size - 1) / page_size; ++i) r.push_back(perm[next++]);
    indices.insert(indices.end(), r.begin(), r.end());
    indptr.push_back(static_cast<int32_t>(indices.size()));
    for (int64_t i = 0; i < max_blocks; ++i) {
      flat.push_back(i < static_cast<int64_t>(r.size()) ? r[i] : -1);
    }
    l.pages.push_back(r);
  }
  l.kv_indptr = int_tensor(indptr);
  l.kv_indices = int_tensor(indices);
  l.kv_lens = int_tensor(lens);
  l.block_tables = int_tensor(flat).view({static_cast<int64_t>(lens.size()), max_blocks});
  l.kv = testing::rand_tensor({total, page_size, dc + dk}, dtype, seed + 1, -1.0, 1.0);
  l.ckv = l.kv.slice(2, 0, dc);
  l.kpe = l.kv.slice(2, dc, dc + dk);
  return l;
}

// fp64 reference of one request: q [qo, H, dc + dk] (q_nope then q_pe) as doubles.
void ref_request(const Latent& l, int64_t b, int64_t kv_len, const std::vector<double>& q,
                 int64_t qo, int64_t H, double sm_scale, bool causal, double ckv_scale,
                 double kpe_scale, double out_scale, std::vector<double>& o,
                 std::vector<double>& lse) {
  const int64_t D = l.dc + l.dk;
  std::vector<double> k, v;
  for (int64_t t = 0; t < kv_len; ++t) {
    std::vector<double> r = l.row(b, t);
    for (int64_t d = 0; d < D; ++d) k.push_back(r[d] * (d < l.dc ? ckv_scale : kpe_scale));
    for (int64_t d = 0; d < l.dc; ++d) v.push_back(r[d] * ckv_scale);
  }
  testing::RefOptions opt;
  opt.sm_scale = sm_scale;
  opt.causal = causal;
  opt.v_scale = out_scale;
  testing::ref_attention(q, k, v, qo, kv_len, H, 1, D, l.dc, opt, o, lse);
}

struct GridCase {
  DType q, kv;
  int64_t dc, dk, page_size;
  bool causal;
  std::vector<int32_t> qo_lens, kv_lens;
};

TEST(BatchMLAPagedAttention, MatchesFp64FormulaOverGrid) {
  const std::vector<GridCase> cases = {
      {DType::kBFloat16, DType::kBFloat16, 512, 64, 1, false, {1, 1, 1}, {7, 1, 12}},
      {DType::kBFloat16, DType::kBFloat16, 512, 64, 4, true, {3, 1, 5}, {9, 4, 5}},
      {DType::kFloat16, DType::kFloat16, 512, 64, 3, true, {2, 0, 4}, {2, 6, 10}},
      {DType::kBFloat16, DType::kFloat8E4M3FN, 512, 64, 2, false, {2, 1}, {5, 8}},
      {DType::kFloat16, DType::kFloat16, 32, 16, 5, false, {4, 2, 1, 3}, {11, 0, 3, 13}},
      {DType::kFloat32, DType::kFloat32, 24, 8, 2, true, {3, 3}, {3, 7}},
      // NoPE models' MLA (head_dim_kpe 0) at page size 1, as vLLM's SM90 sparse backend plans
      // it: a row per query token, one with no query and no key.
      {DType::kBFloat16, DType::kBFloat16, 64, 0, 1, false, {1, 1, 0, 1}, {5, 9, 0, 3}},
      {DType::kBFloat16, DType::kFloat8E4M3FN, 64, 0, 1, false, {1, 1}, {4, 6}},
  };
  int idx = 0;
  for (const GridCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << idx);
    const int64_t H = 3;
    Latent l = make_latent(c.kv_lens, c.page_size, c.dc, c.dk, c.kv, 100 + idx);
    std::vector<int32_t> qo_indptr{0};
    for (int32_t n : c.qo_lens) qo_indptr.push_back(qo_indptr.back() + n);
    const int64_t rows = qo_indptr.back();
    Tensor q = testing::rand_tensor({rows, H, c.dc + c.dk}, c.q, 200 + idx, -1.0, 1.0);
    const bool fp8 = dtype_is_fp8(c.kv);
    const double ckv_scale = fp8 ? 0.75 : 1.0, kpe_scale = fp8 ? 1.5 : 1.0;
    const double sm_scale = 1.0 / std::sqrt(static_cast<double>(c.dc / 4 + c.dk));
    BatchMLAPagedAttentionWrapper w(workspace());
    w.plan(int_tensor(qo_indptr), l.kv_indptr, l.kv_indices, l.kv_lens, H, c.dc, c.dk, c.page_size,
           c.causal, sm_scale, c.q, c.kv);
    for (bool base_e : {false, true}) {
      AttentionOutput r =
          w.run(q.slice(2, 0, c.dc), q.slice(2, c.dc, c.dc + c.dk), l.ckv, l.kpe, std::nullopt,
                std::nullopt, true, std::nullopt, std::nullopt, std::nullopt, base_e, std::nullopt,
                MlaRunOptions{.ckv_scale = fp8 ? std::optional<double>(ckv_scale) : std::nullopt,
                              .kpe_scale = fp8 ? std::optional<double>(kpe_scale) : std::nullopt});
      ASSERT_EQ(r.out.shape(), (Shape{rows, H, c.dc}));
      ASSERT_EQ(r.out.dtype(), c.q);
      ASSERT_EQ(r.lse.shape(), (Shape{rows, H}));
      std::vector<double> want_o, want_lse;
      for (std::size_t b = 0; b < c.qo_lens.size(); ++b) {
        const int64_t qo = c.qo_lens[b];
        std::vector<double> qd = q.slice(0, qo_indptr[b], qo_indptr[b] + qo).to_double_vector();
        std::vector<double> o, lse;
        ref_request(l, static_cast<int64_t>(b), c.kv_lens[b], qd, qo, H, sm_scale, c.causal,
                    ckv_scale, kpe_scale, 1.0, o, lse);
        // Rows that see no token: zeros (the formula leaves them 0) and -inf.
        for (double& x : lse) x *= base_e ? std::log(2.0) : 1.0;
        want_o.insert(want_o.end(), o.begin(), o.end());
        want_lse.insert(want_lse.end(), lse.begin(), lse.end());
      }
      EXPECT_TRUE(testing::all_close(r.out, want_o, testing::attention_tolerance(c.q)));
      EXPECT_TRUE(testing::all_close(r.lse, want_lse, {2e-4, 2e-4}));
    }
    ++idx;
  }
}

// Hand-checked: one head, ckv rows (1, 0) and (0, 1), kpe rows (0) and (1), q_nope (1, 0),
// q_pe (1), sm_scale 1: both scores are 1, so o = (0.5, 0.5) and lse = log2(2e) = 1 +
// 1/ln 2 = 2.442695. With causal and two queries, the first (position 0) sees token 0 only:
// o = (1, 0), lse = log2(e) = 1.442695.
TEST(BatchMLAPagedAttention, HandCheckedGolden) {
  Tensor ckv = Tensor::from_vector({1, 0, 0, 1}, {1, 2, 2}, DType::kFloat32);
  Tensor kpe = Tensor::from_vector({0, 1}, {1, 2, 1}, DType::kFloat32);
  BatchMLAPagedAttentionWrapper w(workspace());
  w.plan(int_tensor({0, 1}), int_tensor({0, 1}), int_tensor({0}), int_tensor({2}), 1, 2, 1, 2,
         false, 1.0, DType::kFloat32, DType::kFloat32);
  AttentionOutput r = w.run(Tensor::from_vector({1, 0}, {1, 1, 2}, DType::kFloat32),
                            Tensor::from_vector({1}, {1, 1, 1}, DType::kFloat32), ckv, kpe,
                            std::nullopt, std::nullopt, true);
  EXPECT_TRUE(testing::all_close(r.out, std::vector<double>{0.5, 0.5}, {1e-7, 1e-7}));
  EXPECT_TRUE(testing::all_close(r.lse, std::vector<double>{2.4426950408889634}, {1e-6, 1e-6}));
  w.plan(int_tensor({0, 2}), int_tensor({0, 1}), int_tensor({0}), int_tensor({2}), 1, 2, 1, 2, true,
         1.0, DType::kFloat32, DType::kFloat32);
  r = w.run(Tensor::from_vector({1, 0, 1, 0}, {2, 1, 2}, DType::kFloat32),
            Tensor::from_vector({1, 1}, {2, 1, 1}, DType::kFloat32), ckv, kpe, std::nullopt,
            std::nullopt, true);
  EXPECT_TRUE(testing::all_close(r.out, std::vector<double>{1, 0, 0.5, 0.5}, {1e-7, 1e-7}));
  EXPECT_TRUE(testing::all_close(r.lse, std::vector<double>{1.4426950408889634, 2.4426950408889634},
                                 {1e-6, 1e-6}));
}

TEST(BatchMLAPagedAttention, OutAndLseBuffersAreWritten) {
  Latent l = make_latent({6, 3}, 4, 64, 16, DType::kBFloat16, 9);
  BatchMLAPagedAttentionWrapper w(workspace());
  w.plan(int_tensor({0, 2, 3}), l.kv_indptr, l.kv_indices, l.kv_lens, 2, 64, 16, 4, true, 0.2,
         DType::kBFloat16, DType::kBFloat16);
  Tensor qn = testing::rand_tensor({3, 2, 64}, DType::kBFloat16, 1);
  Tensor qp = testing::rand_tensor({3, 2, 16}, DType::kBFloat16, 2);
  AttentionOutput ref = w.run(qn, qp, l.ckv, l.kpe, std::nullopt, std::nullopt, true);
  Tensor out = Tensor::zeros({3, 2, 64}, DType::kBFloat16);
  Tensor lse = Tensor::zeros({3, 2}, DType::kFloat32);
  AttentionOutput r = w.run(qn, qp, l.ckv, l.kpe, out, lse, false);
  EXPECT_FALSE(r.lse.defined());
  EXPECT_EQ(r.out.data_ptr(), out.data_ptr());
  EXPECT_TRUE(testing::all_close(out, ref.out, {0.0, 0.0}));
  EXPECT_TRUE(testing::all_close(lse, ref.lse, {0.0, 0.0}));
}

// Upstream's run reads the page ids from the caller's tensor when it runs (plan keeps it, or
// under use_cuda_graph copies into the constructor's buffer): vLLM's SM90 sparse MLA backend plans
// with its buffer, then writes the step's ids into it inside the captured forward. Here run()
// reads them then too; each result is, bit for bit, a fresh plan's over the ids run saw.
TEST(BatchMLAPagedAttention, RunReadsThePageIdsWrittenAfterPlan) {
  const char* run_op = "BatchMLAPagedAttentionWrapper.run";
  const int64_t H = 2, dc = 64, dk = 16, P = 4;
  Latent l = make_latent({9, 5, 12}, P, dc, dk, DType::kBFloat16, 31);  // 8 pages of 10
  const std::vector<int32_t> ids_a = ints_of(l.kv_indices);
  std::vector<int32_t> ids_b = ids_a;
  std::reverse(ids_b.begin(), ids_b.end());
  const auto n = static_cast<int64_t>(ids_a.size());
  const Tensor qo = int_tensor({0, 1, 3, 4});
  const Tensor qn = testing::rand_tensor({4, H, dc}, DType::kBFloat16, 32, -1.0, 1.0);
  const Tensor qp = testing::rand_tensor({4, H, dk}, DType::kBFloat16, 33, -1.0, 1.0);
  auto plan = [&](BatchMLAPagedAttentionWrapper& w, const Tensor& indptr, const Tensor& ids) {
    w.plan(qo, indptr, ids, l.kv_lens, H, dc, dk, P, true, 0.2, DType::kBFloat16, DType::kBFloat16);
  };
  auto run = [&](BatchMLAPagedAttentionWrapper& w) {
    return bytes_of(w.run(qn, qp, l.ckv, l.kpe).out);
  };
  auto fresh = [&](const std::vector<int32_t>& ids) {
    BatchMLAPagedAttentionWrapper w(workspace());
    plan(w, l.kv_indptr, int_tensor(ids));
    return run(w);
  };
  const std::vector<uint8_t> out_a = fresh(ids_a), out_b = fresh(ids_b);
  ASSERT_NE(out_a, out_b);  // the two tables give different results
  {
    SCOPED_TRACE("plan's kv_indices rewritten in place after plan");
    BatchMLAPagedAttentionWrapper w(workspace());
    Tensor ids = int_tensor(ids_a);
    plan(w, l.kv_indptr, ids);
    ids.copy_(int_tensor(ids_b));
    EXPECT_EQ(run(w), out_b);
  }
  {
    SCOPED_TRACE("use_cuda_graph: plan with the constructor's buffer (stale), then the ids");
    Tensor buf = Tensor::zeros({n + 3}, DType::kInt32);
    Tensor qo_buf = Tensor::zeros({4}, DType::kInt32), ip_buf = Tensor::zeros({4}, DType::kInt32);
    Tensor len_buf = Tensor::zeros({3}, DType::kInt32);
    BatchMLAPagedAttentionWrapper w(workspace(), true, qo_buf, ip_buf, buf, len_buf);
    plan(w, l.kv_indptr, buf);
    // Plan's arrays land in the constructor's buffers, as upstream's plan copies them (vLLM's
    // SM90 sparse backend places each step's ids from its kv_indptr buffer).
    EXPECT_EQ(ints_of(qo_buf), ints_of(qo));
    EXPECT_EQ(ints_of(ip_buf), ints_of(l.kv_indptr));
    EXPECT_EQ(ints_of(len_buf), ints_of(l.kv_lens));
    BatchMLAPagedAttentionWrapper w5(workspace(), true, std::nullopt,
                                     Tensor::zeros({5}, DType::kInt32), std::nullopt, std::nullopt);
    EXPECT_FI_ERROR(plan(w5, l.kv_indptr, int_tensor(ids_a)), "BatchMLAPagedAttentionWrapper.plan",
                    "kv_indptr");
    buf.slice(0, 0, n).copy_(int_tensor(ids_b));
    EXPECT_EQ(run(w), out_b);
    buf.slice(0, 0, n).copy_(int_tensor(ids_a));  // the next step's ids, no new plan
    EXPECT_EQ(run(w), out_a);
    // Another tensor: plan copies its ids into the buffer, as upstream's plan does.
    plan(w, l.kv_indptr, int_tensor(ids_b));
    EXPECT_EQ(ints_of(buf.slice(0, 0, n)), ids_b);
    EXPECT_EQ(run(w), out_b);
    // Bad ids are found when the call reads them.
    buf.fill_(-1.0);
    EXPECT_FI_ERROR(run(w), run_op, "kv_indices");
    buf.slice(0, 0, n).copy_(int_tensor(ids_b));
    buf.slice(0, 2, 3).fill_(10.0);  // the cache has pages 0..9
    EXPECT_FI_ERROR(run(w), run_op, "ckv_cache");
    buf.slice(0, 0, n).copy_(int_tensor(ids_b));
    EXPECT_EQ(run(w), out_b);
    EXPECT_FI_ERROR(plan(w, l.kv_indptr, int_tensor(std::vector<int32_t>(n + 4, 0))),
                    "BatchMLAPagedAttentionWrapper.plan", "kv_indices");
  }
  {
    SCOPED_TRACE("ids past a request's length are never read (vLLM's -1 tails)");
    std::vector<int32_t> indptr{0}, ids;
    for (int b = 0; b < 3; ++b) {
      const auto& pg = l.pages[static_cast<std::size_t>(b)];
      ids.insert(ids.end(), pg.begin(), pg.end());
      ids.push_back(-1);
      indptr.push_back(static_cast<int32_t>(ids.size()));
    }
    BatchMLAPagedAttentionWrapper w(workspace());
    plan(w, int_tensor(indptr), int_tensor(ids));
    EXPECT_EQ(run(w), out_a);
  }
}

// The CUDA page guard's body (kernels/mla_page_guard.h), run thread by thread as its block runs it
// (a block-wide OR of the threads' verdicts, then every thread's writes): a request whose read ids
// leave the cache is refused with NaN rows and row_req -1; ids past a request's length and
// requests without rows are never read, so never refused; every other row gets its request back.
TEST(MlaPageGuard, RefusesExactlyTheRequestsWhoseReadIdsLeaveTheCache) {
  const int64_t pages = 6, H = 2, dc = 3;
  // Request 1 has no rows; request 2's third id is past its 5 tokens at page size 4.
  const std::vector<int32_t> qo{0, 2, 2, 3, 5}, kv_indptr{0, 3, 5, 8, 10}, kv_lens{9, 6, 5, 4};
  struct Case {
    std::vector<int32_t> ids;
    std::vector<int32_t> row_req;
  };
  const std::vector<Case> cases = {
      {{0, 1, 5, -1, 99, 3, 4, -7, 2, 9}, {0, 0, 2, 3, 3}},          // all read ids good
      {{0, 1, 6, -1, 99, 3, 4, -7, 2, 9}, {-1, -1, 2, 3, 3}},        // 6 == pages: bad
      {{0, 1, 5, -1, 99, -1, 4, -7, 2, 9}, {0, 0, -1, 3, 3}},        // a negative read id
      {{0, 1, 5, -1, 99, 3, 4, -7, pages, 0}, {0, 0, 2, -1, -1}},    // the first of one page
      {{0, 1, 5, -1, 99, 3, 4, 2147483647, 2, 9}, {0, 0, 2, 3, 3}},  // past the length: unread
  };
  // out_rows 4: a graph captured with 4 rows replayed after a plan of 5: row 4 has no out row.
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    for (const auto& [nthreads, out_rows] :
         {std::pair{1, 5}, std::pair{3, 5}, std::pair{128, 5}, std::pair{3, 4}}) {
      SCOPED_TRACE(::testing::Message()
                   << "case " << ci << ", " << nthreads << " threads, " << out_rows << " out rows");
      const Case& c = cases[ci];
      std::vector<int32_t> row_req(5, 77);  // a previous call's verdicts: all rewritten
      std::vector<uint16_t> o(5 * H * dc, 0);
      std::vector<float> lse(5 * H, 0.0f);
      kernels::MlaAttentionParams p;
      p.qo_indptr = qo.data();
      p.kv_indptr = kv_indptr.data();
      p.kv_lens = kv_lens.data();
      p.kv_indices = c.ids.data();
      p.page_size = 4;
      p.batch = 4;
      p.rows = out_rows;
      p.num_heads = H;
      p.dim_ckv = dc;
      p.o = o.data();
      p.o_dtype = DType::kBFloat16;
      p.o_stride_n = H * dc;
      p.o_stride_h = dc;
      p.lse = lse.data();
      p.lse_stride_n = H;
      p.lse_stride_h = 1;
      for (int32_t b = 0; b < 4; ++b) {
        bool bad = false;
        for (int t = 0; t < nthreads; ++t)
          bad |= kernels::mla_guard_pages_bad(p, pages, b, t, nthreads);
        for (int t = 0; t < nthreads; ++t) {
          kernels::mla_guard_write_request(p, row_req.data(), b, !bad, t, nthreads);
        }
      }
      EXPECT_EQ(row_req, c.row_req);
      for (int64_t r = 0; r < 5; ++r) {
        const bool refused = c.row_req[static_cast<std::size_t>(r)] < 0 && r < out_rows;
        for (int64_t x = 0; x < H * dc; ++x) {
          EXPECT_EQ(o[static_cast<std::size_t>(r * H * dc + x)], refused ? 0x7fc0 : 0) << r;
        }
        for (int64_t h = 0; h < H; ++h) {
          EXPECT_EQ(std::isnan(lse[static_cast<std::size_t>(r * H + h)]), refused) << r;
        }
      }
    }
  }
}

TEST(BatchMLAPagedAttention, BadInput) {
  const char* plan = "BatchMLAPagedAttentionWrapper.plan";
  const char* run = "BatchMLAPagedAttentionWrapper.run";
  Latent l = make_latent({5, 3}, 2, 32, 8, DType::kBFloat16, 3);
  BatchMLAPagedAttentionWrapper w(workspace());
  Tensor qo = int_tensor({0, 1, 2});
  Tensor qn = Tensor::zeros({2, 2, 32}, DType::kBFloat16);
  Tensor qp = Tensor::zeros({2, 2, 8}, DType::kBFloat16);
  EXPECT_FI_ERROR(w.run(qn, qp, l.ckv, l.kpe), run, "self");
  auto do_plan = [&](const Tensor& q_indptr, const Tensor& lens, int64_t heads, DType kvd) {
    w.plan(q_indptr, l.kv_indptr, l.kv_indices, lens, heads, 32, 8, 2, true, 0.1, DType::kBFloat16,
           kvd);
  };
  EXPECT_FI_ERROR(do_plan(qo, int_tensor({5, 7}), 2, DType::kBFloat16), plan, "kv_len_arr");
  EXPECT_FI_ERROR(do_plan(qo, int_tensor({5}), 2, DType::kBFloat16), plan, "kv_len_arr");
  EXPECT_FI_ERROR(do_plan(int_tensor({0, 6, 7}), l.kv_lens, 2, DType::kBFloat16), plan,
                  "kv_len_arr");
  EXPECT_FI_ERROR(do_plan(int_tensor({1, 1, 2}), l.kv_lens, 2, DType::kBFloat16), plan,
                  "qo_indptr");
  EXPECT_FI_ERROR(do_plan(qo, l.kv_lens, 0, DType::kBFloat16), plan, "num_heads");
  EXPECT_FI_ERROR(do_plan(qo, l.kv_lens, 2, DType::kFloat16), plan, "kv_data_type");
  EXPECT_FI_ERROR(w.plan(qo, l.kv_indptr, l.kv_indices, l.kv_lens, 2, 32, 8, 2, true, 0.1,
                         DType::kBFloat16, DType::kBFloat16, true),
                  plan, "use_profiler");
  do_plan(qo, l.kv_lens, 2, DType::kBFloat16);
  w.run(qn, qp, l.ckv, l.kpe);  // valid
  EXPECT_FI_ERROR(w.run(Tensor::zeros({3, 2, 32}, DType::kBFloat16), qp, l.ckv, l.kpe), run,
                  "q_nope");
  EXPECT_FI_ERROR(w.run(qn, Tensor::zeros({2, 2, 9}, DType::kBFloat16), l.ckv, l.kpe), run, "q_pe");
  EXPECT_FI_ERROR(w.run(qn.to(DType::kFloat16), qp.to(DType::kFloat16), l.ckv, l.kpe), run,
                  "q_nope");
  EXPECT_FI_ERROR(w.run(qn, qp, l.ckv.slice(2, 0, 16), l.kpe), run, "ckv_cache");
  EXPECT_FI_ERROR(w.run(qn, qp, l.ckv, l.kpe.slice(0, 0, 2)), run, "kpe_cache");
  EXPECT_FI_ERROR(w.run(qn, qp, l.ckv.slice(0, 0, 2), l.kpe.slice(0, 0, 2)), run, "ckv_cache");
  EXPECT_FI_ERROR(w.run(qn, qp, l.ckv, l.kpe, Tensor::zeros({2, 2, 32}, DType::kFloat16)), run,
                  "out");
  EXPECT_FI_ERROR(w.run(qn, qp, l.ckv, l.kpe, std::nullopt, Tensor::zeros({2, 3}, DType::kFloat32)),
                  run, "lse");
  EXPECT_FI_ERROR(w.run(qn, qp, l.ckv, l.kpe, qn), run, "out");  // overlaps q_nope
  try {
    w.run(qn, qp, l.ckv, l.kpe, std::nullopt, std::nullopt, false, std::nullopt, std::nullopt,
          std::nullopt, false, 2.0);
    ADD_FAILURE() << "o_scale accepted";
  } catch (const Error& e) {
    // Upstream 0.7.4: a run argument the plan did not declare (its ValueError).
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(e.arg(), "o_scale");
  }
  EXPECT_FI_ERROR(BatchMLAPagedAttentionWrapper(workspace(), false, std::nullopt, std::nullopt,
                                                std::nullopt, std::nullopt, "flashmla"),
                  "BatchMLAPagedAttentionWrapper.__init__", "backend");
}

// ckv_scale_arr: per-token, per-128-channel scales of an fp8 e4m3 latent cache ([pages,
// page_size, head_dim_ckv / 128] fp32; SGLang's DSA fp8 backend). Element d of token t's latent
// row is fp8 * scale[slot(t)][d / 128] rounded to q's dtype (upstream's fa kernels dequantize so
// into their 16-bit tiles), for the score and the output; kpe keeps kpe_scale. Against an fp64
// formula over those values: rope and NoPE, bf16 and fp16 queries, page sizes 1 and 3, causal.
struct ScaledLatent {
  Latent l;
  Tensor arr;  // [pages, page_size, dc / 128] fp32
};

ScaledLatent make_scaled_latent(const std::vector<int32_t>& lens, int64_t page_size, int64_t dc,
                                int64_t dk, uint64_t seed) {
  ScaledLatent s{make_latent(lens, page_size, dc, dk, DType::kFloat8E4M3FN, seed), Tensor()};
  s.arr = testing::rand_tensor({s.l.kv.size(0), page_size, dc / 128}, DType::kFloat32, seed + 7,
                               0.05, 3.0);
  return s;
}

// Request b's keys (ckv dequantized by the array, rounded to q's dtype, then kpe * kpe_scale)
// and values, as doubles, for testing::ref_attention.
void scaled_kv(const ScaledLatent& s, int64_t b, int64_t kv_len, DType q, double kpe_scale,
               std::vector<double>& k, std::vector<double>& v) {
  const Latent& l = s.l;
  const std::vector<double> arr = s.arr.to_double_vector();
  const int64_t groups = l.dc / 128;
  for (int64_t t = 0; t < kv_len; ++t) {
    const std::vector<double> r = l.row(b, t);
    const int64_t slot = l.pages[b][t / l.page_size] * l.page_size + t % l.page_size;
    for (int64_t d = 0; d < l.dc; ++d) {
      const float x = static_cast<float>(r[d]) * static_cast<float>(arr[slot * groups + d / 128]);
      const double rounded = q == DType::kBFloat16
                                 ? bfloat16_bits_to_float(float_to_bfloat16_bits(x))
                                 : half_bits_to_float(float_to_half_bits(x));
      k.push_back(rounded);
      v.push_back(rounded);
    }
    for (int64_t d = l.dc; d < l.dc + l.dk; ++d) k.push_back(r[d] * kpe_scale);
  }
}

TEST(BatchMLAPagedAttention, CkvScaleArrDequantizesEachGroupOfEachToken) {
  struct Case {
    DType q;
    int64_t dc, dk, page_size;
    bool causal;
    std::vector<int32_t> qo_lens, kv_lens;
  };
  const std::vector<Case> cases = {
      {DType::kBFloat16, 256, 64, 3, true, {2, 1, 3}, {7, 1, 9}},
      {DType::kFloat16, 512, 64, 1, false, {1, 1}, {6, 11}},
      {DType::kBFloat16, 512, 0, 1, false, {1, 0, 1}, {13, 0, 4}},  // NoPE, SGLang's DSA layout
  };
  int idx = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << idx);
    const int64_t H = 3;
    ScaledLatent s = make_scaled_latent(c.kv_lens, c.page_size, c.dc, c.dk, 700 + idx);
    std::vector<int32_t> qo_indptr{0};
    for (int32_t n : c.qo_lens) qo_indptr.push_back(qo_indptr.back() + n);
    const int64_t rows = qo_indptr.back();
    Tensor q = testing::rand_tensor({rows, H, c.dc + c.dk}, c.q, 800 + idx, -1.0, 1.0);
    const double sm_scale = 1.0 / std::sqrt(static_cast<double>(c.dc / 4 + c.dk)), kpe_scale = 1.5;
    BatchMLAPagedAttentionWrapper w(workspace());
    w.plan(int_tensor(qo_indptr), s.l.kv_indptr, s.l.kv_indices, s.l.kv_lens, H, c.dc, c.dk,
           c.page_size, c.causal, sm_scale, c.q, DType::kFloat8E4M3FN);
    // ckv_scale None, or 1.0 beside the array as SGLang passes it: the same call.
    for (std::optional<double> ckv_scale : {std::optional<double>(), std::optional<double>(1.0)}) {
      AttentionOutput r = w.run(
          q.slice(2, 0, c.dc), q.slice(2, c.dc, c.dc + c.dk), s.l.ckv, s.l.kpe, std::nullopt,
          std::nullopt, true, std::nullopt, std::nullopt, std::nullopt, false, std::nullopt,
          MlaRunOptions{.ckv_scale = ckv_scale, .ckv_scale_arr = s.arr, .kpe_scale = kpe_scale});
      std::vector<double> want_o, want_lse;
      for (std::size_t b = 0; b < c.qo_lens.size(); ++b) {
        const int64_t qo = c.qo_lens[b];
        std::vector<double> k, v, o, lse;
        scaled_kv(s, static_cast<int64_t>(b), c.kv_lens[b], c.q, kpe_scale, k, v);
        testing::RefOptions opt;
        opt.sm_scale = sm_scale;
        opt.causal = c.causal;
        testing::ref_attention(q.slice(0, qo_indptr[b], qo_indptr[b] + qo).to_double_vector(), k, v,
                               qo, c.kv_lens[b], H, 1, c.dc + c.dk, c.dc, opt, o, lse);
        want_o.insert(want_o.end(), o.begin(), o.end());
        want_lse.insert(want_lse.end(), lse.begin(), lse.end());
      }
      EXPECT_TRUE(testing::all_close(r.out, want_o, testing::attention_tolerance(c.q)));
      EXPECT_TRUE(testing::all_close(r.lse, want_lse, {2e-4, 2e-4}));
    }
    ++idx;
  }
}

// One key a request: its softmax weight is exactly 1, so each head's output is the token's
// dequantized latent row bit for bit (each value fp8 * its group's scale rounded to q's dtype): the
// groups, the slot and the rounding checked exactly. Also run on CUDA (MlaCuda below).
Tensor one_key_rows_expected(const ScaledLatent& s, int64_t H, DType q) {
  const int64_t batch = s.l.kv_lens.numel(), dc = s.l.dc;
  std::vector<double> rows;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<double> k, v;
    scaled_kv(s, b, 1, q, 1.0, k, v);
    // A -0 comes out +0: the weighted sum starts at +0 (so do upstream's accumulators).
    for (double& x : v) x += 0.0;
    for (int64_t h = 0; h < H; ++h) rows.insert(rows.end(), v.begin(), v.begin() + dc);
  }
  return Tensor::from_vector(rows, {batch, H, dc}, DType::kFloat64).to(q);
}

AttentionOutput run_one_key_rows(const ScaledLatent& s, int64_t H, DType q, int64_t dk, Device d) {
  const int64_t batch = s.l.kv_lens.numel(), dc = s.l.dc;
  std::vector<int32_t> qo(static_cast<std::size_t>(batch + 1));
  std::iota(qo.begin(), qo.end(), 0);
  BatchMLAPagedAttentionWrapper w(workspace().to(d));
  w.plan(int_tensor(qo), s.l.kv_indptr, s.l.kv_indices.to(d), s.l.kv_lens, H, dc, dk, s.l.page_size,
         false, 0.3, q, DType::kFloat8E4M3FN);
  const Tensor qt = testing::rand_tensor({batch, H, dc + dk}, q, 77, -1.0, 1.0).to(d);
  const Tensor kv = s.l.kv.to(d);
  return w.run(qt.slice(2, 0, dc), qt.slice(2, dc, dc + dk), kv.slice(2, 0, dc),
               kv.slice(2, dc, dc + dk), std::nullopt, std::nullopt, false, std::nullopt,
               std::nullopt, std::nullopt, false, std::nullopt,
               MlaRunOptions{.ckv_scale_arr = s.arr.to(d), .kpe_scale = 1.0});
}

TEST(BatchMLAPagedAttention, CkvScaleArrOneKeyGivesTheDequantizedRowExactly) {
  for (DType q : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t dk : {int64_t{64}, int64_t{0}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(q) << ", kpe " << dk);
      ScaledLatent s = make_scaled_latent({1, 1, 1, 1}, 2, 512, dk, 60 + dk);
      const AttentionOutput got = run_one_key_rows(s, 3, q, dk, Device::cpu());
      EXPECT_EQ(bytes_of(got.out), bytes_of(one_key_rows_expected(s, 3, q)));
    }
  }
}

// ckv_scale_arr's checks (upstream's: an fp8 e4m3 cache, fp32, ckv_cache.shape[:-1] +
// (head_dim_ckv // 128,), contiguous, on ckv_cache's device), and ckv_scale beside it 1.0 or None.
TEST(BatchMLAPagedAttention, CkvScaleArrBadInput) {
  const char* run = "BatchMLAPagedAttentionWrapper.run";
  ScaledLatent s = make_scaled_latent({5, 3}, 2, 256, 64, 31);
  Tensor qo = int_tensor({0, 1, 2});
  Tensor qn = Tensor::zeros({2, 2, 256}, DType::kBFloat16);
  Tensor qp = Tensor::zeros({2, 2, 64}, DType::kBFloat16);
  auto call = [&](BatchMLAPagedAttentionWrapper& w, const Tensor& ckv, const Tensor& kpe,
                  const Tensor& arr, std::optional<double> ckv_scale = std::nullopt) {
    return w.run(qn, qp, ckv, kpe, std::nullopt, std::nullopt, false, std::nullopt, std::nullopt,
                 std::nullopt, false, std::nullopt,
                 MlaRunOptions{.ckv_scale = ckv_scale, .ckv_scale_arr = arr, .kpe_scale = 1.0});
  };
  BatchMLAPagedAttentionWrapper w(workspace());
  w.plan(qo, s.l.kv_indptr, s.l.kv_indices, s.l.kv_lens, 2, 256, 64, 2, false, 0.1,
         DType::kBFloat16, DType::kFloat8E4M3FN);
  call(w, s.l.ckv, s.l.kpe, s.arr);  // valid
  EXPECT_FI_ERROR(call(w, s.l.ckv, s.l.kpe, s.arr.to(DType::kFloat16)), run, "ckv_scale_arr");
  EXPECT_FI_ERROR(call(w, s.l.ckv, s.l.kpe, s.arr.slice(2, 0, 1)), run, "ckv_scale_arr");
  EXPECT_FI_ERROR(call(w, s.l.ckv, s.l.kpe, s.arr.slice(0, 0, 2)), run, "ckv_scale_arr");
  EXPECT_FI_ERROR(call(w, s.l.ckv, s.l.kpe, s.arr.transpose(0, 1).contiguous().transpose(0, 1)),
                  run, "ckv_scale_arr");  // the right shape, not contiguous
  EXPECT_FI_ERROR(call(w, s.l.ckv, s.l.kpe, s.arr, 2.0), run, "ckv_scale");
  EXPECT_FI_ERROR(call(w, s.l.ckv, s.l.kpe, Tensor()), run, "ckv_scale_arr");
  // Another cache dtype: a bf16 cache, an e5m2 one.
  Latent bf = make_latent({5, 3}, 2, 256, 64, DType::kBFloat16, 32);
  BatchMLAPagedAttentionWrapper wb(workspace());
  wb.plan(qo, bf.kv_indptr, bf.kv_indices, bf.kv_lens, 2, 256, 64, 2, false, 0.1, DType::kBFloat16,
          DType::kBFloat16);
  EXPECT_FI_ERROR(call(wb, bf.ckv, bf.kpe, s.arr), run, "ckv_scale_arr");
  Latent e5 = make_latent({5, 3}, 2, 256, 64, DType::kFloat8E5M2, 33);
  BatchMLAPagedAttentionWrapper we(workspace());
  we.plan(qo, e5.kv_indptr, e5.kv_indices, e5.kv_lens, 2, 256, 64, 2, false, 0.1, DType::kBFloat16,
          DType::kFloat8E5M2);
  EXPECT_FI_ERROR(call(we, e5.ckv, e5.kpe, s.arr), run, "ckv_scale_arr");
  // head_dim_ckv not a multiple of 128.
  ScaledLatent odd = make_scaled_latent({5, 3}, 2, 192, 64, 34);
  BatchMLAPagedAttentionWrapper wo(workspace());
  wo.plan(qo, odd.l.kv_indptr, odd.l.kv_indices, odd.l.kv_lens, 2, 192, 64, 2, false, 0.1,
          DType::kBFloat16, DType::kFloat8E4M3FN);
  EXPECT_FI_ERROR(
      wo.run(
          Tensor::zeros({2, 2, 192}, DType::kBFloat16), qp, odd.l.ckv, odd.l.kpe, std::nullopt,
          std::nullopt, false, std::nullopt, std::nullopt, std::nullopt, false, std::nullopt,
          MlaRunOptions{.ckv_scale_arr = Tensor::zeros({odd.l.kv.size(0), 2, 1}, DType::kFloat32),
                        .kpe_scale = 1.0}),
      run, "ckv_scale_arr");
}

// backend="fa3" (upstream's Hopper kernel; what "auto" picks on sm90) computes the same attention:
// here the same kernels, so the same bits as "fa2"; a recording made with it replays.
TEST(Mla, Fa3BackendRunsTheSameAttention) {
  Latent l = make_latent({5, 3}, 2, 32, 8, DType::kBFloat16, 21);
  const Tensor qn = testing::rand_tensor({3, 2, 32}, DType::kBFloat16, 22);
  const Tensor qp = testing::rand_tensor({3, 2, 8}, DType::kBFloat16, 23);
  auto run_with = [&](const std::string& backend) {
    BatchMLAPagedAttentionWrapper w(workspace(), false, std::nullopt, std::nullopt, std::nullopt,
                                    std::nullopt, backend);
    w.plan(int_tensor({0, 2, 3}), l.kv_indptr, l.kv_indices, l.kv_lens, 2, 32, 8, 2, true, 0.15,
           DType::kBFloat16, DType::kBFloat16);
    return w.run(qn, qp, l.ckv, l.kpe, std::nullopt, std::nullopt, true);
  };
  const AttentionOutput fa3 = run_with("fa3"), fa2 = run_with("fa2");
  EXPECT_EQ(bytes_of(fa3.out), bytes_of(fa2.out));
  EXPECT_EQ(bytes_of(fa3.lse), bytes_of(fa2.lse));
}

// ---- BatchDecodeMlaWithPagedKVCacheWrapper (flashinfer.decode, deprecated SM80 path) -------

// The last-page lengths of requests of `lens` tokens.
Tensor last_page_lens(const std::vector<int32_t>& lens, int64_t page_size) {
  std::vector<int32_t> last;
  for (int32_t n : lens) {
    last.push_back(n == 0 ? 0 : static_cast<int32_t>(n - (n - 1) / page_size * page_size));
  }
  return int_tensor(last);
}

TEST(BatchDecodeMla, MatchesFp64FormulaOverGrid) {
  struct Case {
    DType q, kv;
    int64_t dc, dk, page_size;
    std::vector<int32_t> lens;
    std::optional<double> q_scale, k_scale, v_scale;
  };
  const std::vector<Case> cases = {
      {DType::kFloat16,
       DType::kFloat16,
       512,
       64,
       1,
       {7, 1, 12},
       std::nullopt,
       std::nullopt,
       std::nullopt},
      {DType::kBFloat16, DType::kBFloat16, 512, 64, 4, {9, 4, 5}, 1.25, std::nullopt, 0.5},
      {DType::kBFloat16, DType::kFloat8E4M3FN, 64, 16, 3, {5, 8}, 0.75, 1.5, 2.0},
      {DType::kFloat16,
       DType::kFloat16,
       32,
       16,
       5,
       {11, 0, 3, 13},
       std::nullopt,
       0.5,
       std::nullopt},
  };
  int idx = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << idx);
    const int64_t H = 3, B = static_cast<int64_t>(c.lens.size());
    Latent l = make_latent(c.lens, c.page_size, c.dc, c.dk, c.kv, 300 + idx);
    Tensor q = testing::rand_tensor({B, H, c.dc + c.dk}, c.q, 400 + idx, -1.0, 1.0);
    const double sm_scale = 1.0 / std::sqrt(static_cast<double>(c.dc / 4 + c.dk));
    BatchDecodeMlaWithPagedKVCacheWrapper w(workspace());
    w.plan(l.kv_indptr, l.kv_indices, last_page_lens(c.lens, c.page_size), H, c.dc, c.page_size,
           sm_scale, -1, std::nullopt, c.kv, c.q);
    AttentionOutput r = w.run(q.slice(2, 0, c.dc), q.slice(2, c.dc, c.dc + c.dk), l.ckv, l.kpe,
                              c.q_scale, c.k_scale, c.v_scale, std::nullopt, std::nullopt, true);
    ASSERT_EQ(r.out.shape(), (Shape{B, H, c.dc}));
    ASSERT_EQ(r.out.dtype(), c.q);
    ASSERT_EQ(r.lse.shape(), (Shape{B, H}));
    const double eff = sm_scale * c.q_scale.value_or(1.0) * c.k_scale.value_or(1.0);
    std::vector<double> want_o, want_lse;
    for (int64_t b = 0; b < B; ++b) {
      std::vector<double> o, lse;
      ref_request(l, b, c.lens[b], q.slice(0, b, b + 1).to_double_vector(), 1, H, eff, false, 1.0,
                  1.0, c.v_scale.value_or(1.0), o, lse);
      want_o.insert(want_o.end(), o.begin(), o.end());
      want_lse.insert(want_lse.end(), lse.begin(), lse.end());  // base 2, -inf when empty
    }
    EXPECT_TRUE(testing::all_close(r.out, want_o, testing::attention_tolerance(c.q)));
    EXPECT_TRUE(testing::all_close(r.lse, want_lse, {2e-4, 2e-4}));
    // Upstream's kernels take window_left, logits_soft_cap and the RoPE parameters and apply
    // none of them: the same plan with them set gives the same bits.
    w.plan(l.kv_indptr, l.kv_indices, last_page_lens(c.lens, c.page_size), H, c.dc, c.page_size,
           sm_scale, 2, 5.0, c.kv, c.q, 2.0, 500.0);
    AttentionOutput r2 = w.run(q.slice(2, 0, c.dc), q.slice(2, c.dc, c.dc + c.dk), l.ckv, l.kpe,
                               c.q_scale, c.k_scale, c.v_scale, std::nullopt, std::nullopt, true);
    EXPECT_TRUE(testing::all_close(r2.out, r.out, {0.0, 0.0}));
    EXPECT_TRUE(testing::all_close(r2.lse, r.lse, {0.0, 0.0}));
    ++idx;
  }
}

// Hand-checked: one head, ckv rows (1, 0) and (0, 1), kpe rows (0) and (1), q_nope (1, 0),
// q_pe (1), sm_scale 0.5 with q_scale 2: both scores are 1, so o = (0.5, 0.5) times v_scale 3
// = (1.5, 1.5), and lse = log2(2e) = 2.442695 (base 2, as upstream's state keeps it).
TEST(BatchDecodeMla, HandCheckedGolden) {
  Tensor ckv = Tensor::from_vector({1, 0, 0, 1}, {1, 2, 2}, DType::kFloat32);
  Tensor kpe = Tensor::from_vector({0, 1}, {1, 2, 1}, DType::kFloat32);
  BatchDecodeMlaWithPagedKVCacheWrapper w(workspace());
  w.plan(int_tensor({0, 1}), int_tensor({0}), int_tensor({2}), 1, 2, 2, 0.5, -1, std::nullopt,
         DType::kFloat32);
  Tensor lse = Tensor::zeros({1, 1}, DType::kFloat32);
  AttentionOutput r = w.run(Tensor::from_vector({1, 0}, {1, 1, 2}, DType::kFloat32),
                            Tensor::from_vector({1}, {1, 1, 1}, DType::kFloat32), ckv, kpe, 2.0,
                            std::nullopt, 3.0, std::nullopt, lse);
  EXPECT_TRUE(testing::all_close(r.out, std::vector<double>{1.5, 1.5}, {1e-6, 1e-6}));
  EXPECT_FALSE(r.lse.defined());  // a given lse is filled without return_lse, not returned
  EXPECT_TRUE(testing::all_close(lse, std::vector<double>{2.4426950408889634}, {1e-6, 1e-6}));
}

TEST(BatchDecodeMla, BadInput) {
  const char* init = "BatchDecodeMlaWithPagedKVCacheWrapper.__init__";
  const char* plan = "BatchDecodeMlaWithPagedKVCacheWrapper.plan";
  const char* run = "BatchDecodeMlaWithPagedKVCacheWrapper.run";
  Latent l = make_latent({5, 3}, 2, 32, 8, DType::kBFloat16, 3);
  const Tensor last = last_page_lens({5, 3}, 2);
  BatchDecodeMlaWithPagedKVCacheWrapper w(workspace());
  Tensor qn = Tensor::zeros({2, 2, 32}, DType::kBFloat16);
  Tensor qp = Tensor::zeros({2, 2, 8}, DType::kBFloat16);
  EXPECT_FI_ERROR(w.run(qn, qp, l.ckv, l.kpe), run, "self");
  auto do_plan = [&](const Tensor& last_len, int64_t heads, DType kvd, std::optional<double> cap) {
    w.plan(l.kv_indptr, l.kv_indices, last_len, heads, 32, 2, 0.1, -1, cap, kvd, DType::kBFloat16);
  };
  EXPECT_FI_ERROR(do_plan(int_tensor({1, 3}), 2, DType::kBFloat16, std::nullopt), plan,
                  "last_page_len");
  EXPECT_FI_ERROR(do_plan(int_tensor({1}), 2, DType::kBFloat16, std::nullopt), plan,
                  "last_page_len");
  EXPECT_FI_ERROR(do_plan(last, 0, DType::kBFloat16, std::nullopt), plan, "num_qo_heads");
  EXPECT_FI_ERROR(do_plan(last, 2, DType::kFloat16, std::nullopt), plan, "data_type");
  EXPECT_FI_ERROR(do_plan(last, 2, DType::kBFloat16, -1.0), plan, "logits_soft_cap");
  do_plan(last, 2, DType::kBFloat16, std::nullopt);
  w.run(qn, qp, l.ckv, l.kpe);  // valid
  EXPECT_FI_ERROR(w.run(Tensor::zeros({3, 2, 32}, DType::kBFloat16), qp, l.ckv, l.kpe), run,
                  "q_nope");
  EXPECT_FI_ERROR(w.run(qn, Tensor::zeros({2, 2, 9}, DType::kBFloat16), l.ckv, l.kpe), run,
                  "paged_kpe_cache");
  EXPECT_FI_ERROR(w.run(qn, qp, l.ckv.slice(2, 0, 16), l.kpe), run, "paged_ckv_cache");
  EXPECT_FI_ERROR(w.run(qn, qp, l.ckv, l.kpe, std::nullopt, std::nullopt, std::nullopt,
                        Tensor::zeros({2, 2, 32}, DType::kFloat16)),
                  run, "out");
  EXPECT_FI_ERROR(w.run(qn, qp, l.ckv, l.kpe, std::numeric_limits<double>::infinity()), run,
                  "q_scale");
  // CUDA-graph mode: the three buffers are required and fix the batch size (upstream's checks).
  EXPECT_FI_ERROR(BatchDecodeMlaWithPagedKVCacheWrapper(workspace(), true), init,
                  "paged_kv_indptr_buffer");
  EXPECT_FI_ERROR(
      BatchDecodeMlaWithPagedKVCacheWrapper(workspace(), true, false, int_tensor({0, 0}),
                                            int_tensor({0}), int_tensor({0, 0})),
      init, "paged_kv_indptr_buffer");
  BatchDecodeMlaWithPagedKVCacheWrapper g(workspace(), true, false, int_tensor({0, 0}),
                                          int_tensor({0, 0}), int_tensor({0}));
  EXPECT_FI_ERROR(g.plan(l.kv_indptr, l.kv_indices, last, 2, 32, 2, 0.1), plan, "last_page_len");
}

TEST(BatchDecodeMla, RecordAndReplayAndDump) {
  Latent l = make_latent({5, 3}, 2, 32, 8, DType::kBFloat16, 11);
  const Tensor last = last_page_lens({5, 3}, 2);
  std::vector<testing::RecordingObserver::Call> calls;
  {
    testing::RecordingScope scope;
    BatchDecodeMlaWithPagedKVCacheWrapper w(workspace());
    w.plan(l.kv_indptr, l.kv_indices, last, 2, 32, 2, 0.15, -1, std::nullopt, DType::kBFloat16,
           DType::kBFloat16);
    w.run(testing::rand_tensor({2, 2, 32}, DType::kBFloat16, 5),
          testing::rand_tensor({2, 2, 8}, DType::kBFloat16, 6), l.ckv, l.kpe, 1.5, std::nullopt,
          0.5, std::nullopt, std::nullopt, true);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].name, "BatchDecodeMlaWithPagedKVCacheWrapper.__init__");
  EXPECT_TRUE(calls[2].result.is_sequence());  // (out, lse) with return_lse
  for (std::size_t i = 1; i < calls.size(); ++i) {
    SCOPED_TRACE(calls[i].name);
    EXPECT_TRUE(testing::replays_identically(calls[i]));
  }
  // Upstream's dump layout (self_id ties plan and run to the recorded __init__), replayed.
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("fi_mla_decode_dump_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg, [](const std::string&) {});
  {
    BatchDecodeMlaWithPagedKVCacheWrapper w(workspace());
    w.plan(l.kv_indptr, l.kv_indices, last, 2, 32, 2, 0.15, -1, std::nullopt, DType::kBFloat16);
    Tensor out = Tensor::zeros({2, 2, 32}, DType::kBFloat16);
    w.run(testing::rand_tensor({2, 2, 32}, DType::kBFloat16, 7),
          testing::rand_tensor({2, 2, 8}, DType::kBFloat16, 8), l.ckv, l.kpe, std::nullopt,
          std::nullopt, std::nullopt, out);
  }
  recorder::stop();
  testing::replay_expecting_every_call_to_pass(dir, 3u);
  fs::remove_all(dir);
}

// ---- trtllm / xqa block-table entry points ------------------------------------------------

TEST(TrtllmMlaDecode, MatchesFp64FormulaAndTheWrapper) {
  struct Case {
    DType q, kv;
    int64_t page_size, q_len;
    bool four_d;
  };
  const std::vector<Case> cases = {{DType::kBFloat16, DType::kBFloat16, 4, 1, false},
                                   {DType::kFloat16, DType::kFloat16, 3, 2, true},
                                   {DType::kBFloat16, DType::kFloat8E4M3FN, 2, 1, false},
                                   {DType::kFloat8E4M3FN, DType::kFloat8E4M3FN, 5, 3, true}};
  const std::vector<int32_t> lens{9, 3, 14};
  const int64_t H = 4, dc = 512, dk = 64, B = 3;
  int idx = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << idx);
    Latent l = make_latent(lens, c.page_size, dc, dk, c.kv, 50 + idx);
    Tensor q = testing::rand_tensor({B, c.q_len, H, dc + dk}, c.q, 60 + idx, -1.0, 1.0);
    const double bmm1 = 0.07, bmm2 = 1.25;
    Tensor kv = c.four_d ? l.kv.unsqueeze(1) : l.kv;
    Tensor o =
        trtllm_batch_decode_with_kv_cache_mla(q, kv, workspace(), 128, dc, dk, l.block_tables,
                                              l.kv_lens, 16, 0, std::nullopt, bmm1, bmm2);
    const DType od = c.q == DType::kFloat8E4M3FN ? DType::kBFloat16 : c.q;
    ASSERT_EQ(o.shape(), (Shape{B, c.q_len, H, dc}));
    ASSERT_EQ(o.dtype(), od);
    std::vector<double> want;
    for (int64_t b = 0; b < B; ++b) {
      std::vector<double> out, lse;
      ref_request(l, b, lens[b], q.select(0, b).to_double_vector(), c.q_len, H, bmm1, c.q_len > 1,
                  1.0, 1.0, bmm2, out, lse);
      want.insert(want.end(), out.begin(), out.end());
    }
    EXPECT_TRUE(testing::all_close(o, want, testing::attention_tolerance(od)));
    // xqa computes the same thing, bit for bit.
    Tensor ox = xqa_batch_decode_with_kv_cache_mla(q, kv, workspace(), 128, dc, dk, l.block_tables,
                                                   l.kv_lens, 16, std::nullopt, bmm1, bmm2);
    EXPECT_TRUE(testing::all_close(ox, o, {0.0, 0.0}));
    ++idx;
  }
}

TEST(TrtllmMlaDecode, OutBufferAndTensorScales) {
  Latent l = make_latent({4, 7}, 4, 64, 16, DType::kBFloat16, 1);
  Tensor q = testing::rand_tensor({2, 1, 2, 80}, DType::kBFloat16, 2);
  Tensor ref = trtllm_batch_decode_with_kv_cache_mla(
      q, l.kv, workspace(), 128, 64, 16, l.block_tables, l.kv_lens, 8, 0, std::nullopt, 0.3, 0.5);
  Tensor out = Tensor::zeros({2, 1, 2, 64}, DType::kBFloat16);
  Tensor got = trtllm_batch_decode_with_kv_cache_mla(
      q, l.kv, workspace(), 128, 64, 16, l.block_tables, l.kv_lens, 8, 0, out,
      Tensor::full({1}, 0.3, DType::kFloat32), Tensor::full({1}, 0.5, DType::kFloat32));
  EXPECT_EQ(got.data_ptr(), out.data_ptr());
  EXPECT_TRUE(testing::all_close(out, ref, {0.0, 0.0}));
}

TEST(TrtllmMlaDecode, BadInput) {
  const char* op = "trtllm_batch_decode_with_kv_cache_mla";
  Latent l = make_latent({4, 7}, 4, 64, 16, DType::kBFloat16, 1);
  Tensor q = Tensor::zeros({2, 1, 2, 80}, DType::kBFloat16);
  auto call = [&](const Tensor& qq, const Tensor& kv, const Tensor& bt, const Tensor& lens,
                  int64_t max_len, int64_t rank) {
    trtllm_batch_decode_with_kv_cache_mla(qq, kv, workspace(), 128, rank, 16, bt, lens, max_len);
  };
  call(q, l.kv, l.block_tables, l.kv_lens, 7, 64);  // valid
  EXPECT_FI_ERROR(call(q, l.kv, l.block_tables, l.kv_lens, 6, 64), op, "seq_lens");
  EXPECT_FI_ERROR(call(q, l.kv, l.block_tables, l.kv_lens, 7, 60), op, "query");
  EXPECT_FI_ERROR(call(q, l.kv.slice(2, 0, 70), l.block_tables, l.kv_lens, 7, 64), op, "kv_cache");
  EXPECT_FI_ERROR(call(q, l.kv, int_tensor({0, 1, 2, 99}).view({2, 2}), l.kv_lens, 7, 64), op,
                  "block_tables");
  EXPECT_FI_ERROR(call(q, l.kv, int_tensor({0, 1}).view({2, 1}), l.kv_lens, 7, 64), op,
                  "block_tables");
  EXPECT_FI_ERROR(call(q, Tensor::zeros({l.kv.size(0), 2, 4, 80}, DType::kBFloat16), l.block_tables,
                       l.kv_lens, 7, 64),
                  op, "kv_cache");
  EXPECT_FI_ERROR(call(q.to(DType::kFloat32), l.kv, l.block_tables, l.kv_lens, 7, 64), op, "query");
  EXPECT_FI_ERROR(call(Tensor::zeros({2, 3, 2, 80}, DType::kBFloat16), l.kv, l.block_tables,
                       int_tensor({2, 7}), 7, 64),
                  op, "seq_lens");
  // Sparse MLA takes a table of token slots [batch, q_len, top_k], not pages.
  EXPECT_FI_ERROR(trtllm_batch_decode_with_kv_cache_mla(q, l.kv, workspace(), 128, 64, 16,
                                                        l.block_tables, l.kv_lens, 7, 8),
                  op, "block_tables");
  EXPECT_FI_ERROR(xqa_batch_decode_with_kv_cache_mla(q, l.kv, workspace(), 128, 64, 16,
                                                     l.block_tables, l.kv_lens, 7, std::nullopt,
                                                     1.0, 1.0, Tensor::zeros({2}, DType::kFloat32)),
                  "xqa_batch_decode_with_kv_cache_mla", "sinks");
}

// Every optional part of trtllm_batch_decode_with_kv_cache_mla through one call.
struct TrtllmMlaArgs {
  int64_t dk = 16, top_k = 0;
  double bmm1 = 0.1, bmm2 = 1.25;
  std::optional<Tensor> out, lse, cu_q, top_k_lens, global;
  std::optional<int64_t> max_q_len;
  bool return_lse = false, dcp = false;
  int64_t cp_world = 1, cp_rank = 0;
  std::string backend = "auto";
  std::optional<std::string> lse_base;  // upstream 0.7.4's return_lse_base
};
AttentionOutput trtllm_mla(const Tensor& q, const Tensor& kv, const Tensor& bt, const Tensor& lens,
                           int64_t max_len, const TrtllmMlaArgs& a) {
  return trtllm_batch_decode_with_kv_cache_mla(
      q, kv, workspace(), 128, q.size(-1) - a.dk, a.dk, bt, lens, max_len, a.top_k, a.out, a.bmm1,
      a.bmm2, std::nullopt, std::nullopt, std::nullopt, a.backend, true, true, a.lse, a.return_lse,
      "auto", "auto", a.cu_q, a.max_q_len, std::nullopt, a.top_k_lens, a.dcp, a.cp_world, a.cp_rank,
      a.global, std::nullopt, a.lse_base);
}

// The LSE is log2 sum_j exp(bmm1_scale * q.k_j) (trtllm-gen's: bmm2_scale not in it), the
// natural log on cute-dsl; written into the caller's [rows, H] or [batch, q_len, H] buffer and
// returned in its shape; a request with no key gives out 0 and -inf.
TEST(TrtllmMlaDecode, LseIsBase2OfTheScaledScoresAndNaturalOnCuteDsl) {
  const std::vector<int32_t> lens{9, 0, 14};
  const int64_t B = 3, H = 4, dc = 64, dk = 16;
  Latent l = make_latent(lens, 4, dc, dk, DType::kBFloat16, 70);
  Tensor q = testing::rand_tensor({B, 1, H, dc + dk}, DType::kBFloat16, 71, -1.0, 1.0);
  TrtllmMlaArgs a;
  a.return_lse = true;
  AttentionOutput r = trtllm_mla(q, l.kv, l.block_tables, l.kv_lens, 16, a);
  ASSERT_EQ(r.lse.shape(), (Shape{B, H}));
  std::vector<double> want_o, want_lse;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> o, lse;
    ref_request(l, b, lens[b], q.select(0, b).to_double_vector(), 1, H, a.bmm1, false, 1.0, 1.0,
                a.bmm2, o, lse);
    want_o.insert(want_o.end(), o.begin(), o.end());
    want_lse.insert(want_lse.end(), lse.begin(), lse.end());
  }
  EXPECT_TRUE(testing::all_close(r.out, want_o, testing::attention_tolerance(DType::kBFloat16)));
  EXPECT_TRUE(testing::all_close(r.lse, want_lse, {2e-4, 2e-4}));
  for (int64_t h = 0; h < H; ++h) {
    EXPECT_EQ(r.lse.select(0, 1).to_double_vector()[h], -std::numeric_limits<double>::infinity());
  }
  for (double v : r.out.select(0, 1).to_double_vector()) ASSERT_EQ(v, 0.0);
  // Without return_lse the result is the output alone, the same bits.
  AttentionOutput plain = trtllm_mla(q, l.kv, l.block_tables, l.kv_lens, 16, TrtllmMlaArgs{});
  EXPECT_FALSE(plain.lse.defined());
  EXPECT_EQ(bytes_of(plain.out), bytes_of(r.out));
  // The caller's 3-D buffer, written and returned; lse passed without return_lse is left as it
  // was (upstream 0.7.4 drops it: `lse = None` unless return_lse).
  for (bool ret : {true, false}) {
    TrtllmMlaArgs b3 = a;
    b3.return_lse = ret;
    b3.lse = Tensor::zeros({B, 1, H}, DType::kFloat32);
    AttentionOutput r3 = trtllm_mla(q, l.kv, l.block_tables, l.kv_lens, 16, b3);
    EXPECT_EQ(r3.lse.defined(), ret);
    if (ret) {
      EXPECT_EQ(r3.lse.data_ptr(), b3.lse->data_ptr());
      EXPECT_EQ(bytes_of(*b3.lse), bytes_of(r.lse));
    } else {
      for (double v : b3.lse->to_double_vector()) EXPECT_EQ(v, 0.0);
    }
  }
  // cute-dsl's LSE is the natural log.
  TrtllmMlaArgs e = a;
  e.backend = "cute-dsl";
  AttentionOutput re = trtllm_mla(q, l.kv, l.block_tables, l.kv_lens, 16, e);
  std::vector<double> want_ln = want_lse;
  for (double& v : want_ln) v *= std::log(2.0);
  EXPECT_TRUE(testing::all_close(re.lse, want_ln, {2e-4, 2e-4}));
  // return_lse_base (upstream 0.7.4) picks the base whatever the backend's default: "basee"
  // the natural log on trtllm-gen's path, "base2" base 2 on cute-dsl; any other value refused.
  TrtllmMlaArgs be = a;
  be.lse_base = "basee";
  EXPECT_TRUE(testing::all_close(trtllm_mla(q, l.kv, l.block_tables, l.kv_lens, 16, be).lse,
                                 want_ln, {2e-4, 2e-4}));
  TrtllmMlaArgs b2 = e;
  b2.lse_base = "base2";
  EXPECT_TRUE(testing::all_close(trtllm_mla(q, l.kv, l.block_tables, l.kv_lens, 16, b2).lse,
                                 want_lse, {2e-4, 2e-4}));
  TrtllmMlaArgs bad = a;
  bad.lse_base = "base10";
  try {
    (void)trtllm_mla(q, l.kv, l.block_tables, l.kv_lens, 16, bad);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& err) {
    EXPECT_EQ(err.arg(), "return_lse_base");
    EXPECT_NE(std::string(err.what())
                  .find("return_lse_base must be 'basee', 'base2', or None; got 'base10'"),
              std::string::npos)
        << err.what();
  }
}

// Queries of variable counts (cum_seq_lens_q, [total_q, H, D]): each request's rows are those of
// a uniform call of that request alone, bit for bit, causal among its queries.
TEST(TrtllmMlaDecode, RaggedQueriesAreEachRequestsUniformCall) {
  const std::vector<int32_t> lens{9, 3, 14}, qo{1, 3, 2};
  const int64_t H = 2, dc = 64, dk = 16, rows = 6;
  Latent l = make_latent(lens, 4, dc, dk, DType::kFloat16, 80);
  Tensor q = testing::rand_tensor({rows, H, dc + dk}, DType::kFloat16, 81, -1.0, 1.0);
  TrtllmMlaArgs a;
  a.cu_q = int_tensor({0, 1, 4, 6});
  a.max_q_len = 3;
  a.return_lse = true;
  a.backend = "cute-dsl";
  a.out = Tensor::zeros({rows, H, dc}, DType::kFloat16);
  AttentionOutput r = trtllm_mla(q, l.kv, l.block_tables, l.kv_lens, 16, a);
  EXPECT_EQ(r.out.data_ptr(), a.out->data_ptr());
  ASSERT_EQ(r.lse.shape(), (Shape{rows, H}));
  int64_t first = 0;
  for (int64_t b = 0; b < 3; ++b) {
    SCOPED_TRACE(::testing::Message() << "request " << b);
    TrtllmMlaArgs u;
    u.return_lse = true;
    u.backend = "cute-dsl";
    const Tensor qb = q.slice(0, first, first + qo[b]).unsqueeze(0).contiguous();
    AttentionOutput one = trtllm_mla(qb, l.kv, l.block_tables.slice(0, b, b + 1),
                                     l.kv_lens.slice(0, b, b + 1), 16, u);
    EXPECT_EQ(bytes_of(one.out), bytes_of(r.out.slice(0, first, first + qo[b]).contiguous()));
    EXPECT_EQ(bytes_of(one.lse), bytes_of(r.lse.slice(0, first, first + qo[b]).contiguous()));
    first += qo[b];
  }
  // Upstream's "auto" sends ragged queries with an LSE to cute-dsl: the natural log too.
  TrtllmMlaArgs au = a;
  au.backend = "auto";
  au.out = std::nullopt;
  EXPECT_EQ(bytes_of(trtllm_mla(q, l.kv, l.block_tables, l.kv_lens, 16, au).lse), bytes_of(r.lse));
}

// Sparse MLA: each query attends the token slots of its row of block_tables, the first
// min(top_k, seq_lens - (L - 1 - t)) of them; -1 entries none. The slots of a request's positions
// in order give the dense causal call, bit for bit; any slots, in any order, the formula over
// those keys; a row of none out 0 and LSE -inf.
TEST(TrtllmMlaDecode, SparseTopKSlotsMatchTheDenseCallAndTheFormula) {
  const std::vector<int32_t> lens{9, 3, 14};
  const int64_t B = 3, L = 2, H = 4, dc = 64, dk = 16, ps = 4, top_k = 16;
  Latent l = make_latent(lens, ps, dc, dk, DType::kBFloat16, 90);
  Tensor q = testing::rand_tensor({B, L, H, dc + dk}, DType::kBFloat16, 91, -1.0, 1.0);
  auto slot = [&](int64_t b, int64_t p) { return l.pages[b][p / ps] * ps + p % ps; };
  std::vector<int32_t> in_order;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < L; ++t) {
      for (int64_t j = 0; j < top_k; ++j) {
        in_order.push_back(j < lens[b] ? static_cast<int32_t>(slot(b, j)) : -1);
      }
    }
  }
  TrtllmMlaArgs sp;
  sp.top_k = top_k;
  sp.return_lse = true;
  AttentionOutput s =
      trtllm_mla(q, l.kv, int_tensor(in_order).view({B, L, top_k}), l.kv_lens, top_k, sp);
  TrtllmMlaArgs dn;
  dn.return_lse = true;
  AttentionOutput d = trtllm_mla(q, l.kv, l.block_tables, l.kv_lens, 16, dn);
  EXPECT_EQ(bytes_of(s.out), bytes_of(d.out));
  EXPECT_EQ(bytes_of(s.lse), bytes_of(d.lse));

  // Random positions in a random order, -1 between them (inside the counted prefix too), one row
  // of none; seq_lens past top_k counts top_k entries. Against the fp64 formula per query.
  std::mt19937 rng(92);
  std::vector<int32_t> table;
  std::vector<std::vector<int64_t>> seen;  // each row's positions
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < L; ++t) {
      std::vector<int64_t> pos(static_cast<std::size_t>(lens[b]));
      std::iota(pos.begin(), pos.end(), 0);
      std::shuffle(pos.begin(), pos.end(), rng);
      std::vector<int64_t> keep;
      std::size_t next = 0;
      for (int64_t j = 0; j < top_k; ++j) {
        if ((b == 1 && t == 0) || j % 3 == 2 || next == pos.size()) {
          table.push_back(-1);
        } else {
          keep.push_back(pos[next]);
          table.push_back(static_cast<int32_t>(slot(b, pos[next++])));
        }
      }
      seen.push_back(keep);
    }
  }
  // seq_lens 40 > top_k: every entry counts (the last query: 40 - 0; the first: 39).
  Tensor many = int_tensor({40, 40, 40});
  AttentionOutput r = trtllm_mla(q, l.kv, int_tensor(table).view({B, L, top_k}), many, top_k, sp);
  std::vector<double> want_o, want_lse;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < L; ++t) {
      const std::vector<int64_t>& keys = seen[static_cast<std::size_t>(b * L + t)];
      std::vector<double> k, v;
      for (int64_t p : keys) {
        const std::vector<double> row = l.row(b, p);
        k.insert(k.end(), row.begin(), row.end());
        v.insert(v.end(), row.begin(), row.begin() + dc);
      }
      testing::RefOptions opt;
      opt.sm_scale = sp.bmm1;
      opt.v_scale = sp.bmm2;
      std::vector<double> o, lse;
      testing::ref_attention(q.select(0, b).select(0, t).to_double_vector(), k, v, 1,
                             static_cast<int64_t>(keys.size()), H, 1, dc + dk, dc, opt, o, lse);
      want_o.insert(want_o.end(), o.begin(), o.end());
      want_lse.insert(want_lse.end(), lse.begin(), lse.end());
    }
  }
  EXPECT_TRUE(testing::all_close(r.out, want_o, testing::attention_tolerance(DType::kBFloat16)));
  EXPECT_TRUE(testing::all_close(r.lse, want_lse, {2e-4, 2e-4}));
  for (double v : r.out.select(0, 1).select(0, 0).to_double_vector()) ASSERT_EQ(v, 0.0);
  EXPECT_EQ(r.lse.to_double_vector()[static_cast<std::size_t>(2 * H)],
            -std::numeric_limits<double>::infinity());

  // Ragged queries take a [total_q, top_k] table; the rope-less layout counts
  // sparse_mla_top_k_lens entries (here those of a causal call: the formula over them).
  Latent l0 = make_latent(lens, ps, dc, 0, DType::kBFloat16, 93);
  Tensor q0 = testing::rand_tensor({B * L, H, dc}, DType::kBFloat16, 94, -1.0, 1.0);
  std::vector<int32_t> t0, active;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < L; ++t) {
      for (int64_t j = 0; j < top_k; ++j) {
        t0.push_back(j < lens[b] ? l0.pages[b][j / ps] * static_cast<int32_t>(ps) +
                                       static_cast<int32_t>(j % ps)
                                 : -1);
      }
      active.push_back(lens[b] - static_cast<int32_t>(L - 1 - t));
    }
  }
  TrtllmMlaArgs s0;
  s0.dk = 0;
  s0.top_k = top_k;
  s0.cu_q = int_tensor({0, 2, 4, 6});
  s0.top_k_lens = int_tensor(active);
  AttentionOutput rs =
      trtllm_mla(q0, l0.kv, int_tensor(t0).view({B * L, top_k}), int_tensor({0, 0, 0}), top_k, s0);
  std::vector<double> want0;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> o, lse;
    ref_request(l0, b, lens[b], q0.slice(0, b * L, (b + 1) * L).to_double_vector(), L, H, sp.bmm1,
                true, 1.0, 1.0, sp.bmm2, o, lse);
    want0.insert(want0.end(), o.begin(), o.end());
  }
  EXPECT_TRUE(testing::all_close(rs.out, want0, testing::attention_tolerance(DType::kBFloat16)));
}

// Decode context parallelism: each rank holds global positions cp_world * k + cp_rank of every
// request and returns its partial output with the natural-log LSE over the keys it sees; merged
// by those LSEs, the ranks give the whole cache's causal call (an empty rank's rows: out 0,
// LSE -inf).
TEST(TrtllmMlaDecode, ContextParallelRanksMergeToTheWholeCall) {
  struct Case {
    std::vector<int32_t> lens;
    int64_t L, world;
  };
  for (const Case& c : {Case{{13, 6}, 2, 3}, Case{{1, 9}, 1, 2}}) {
    SCOPED_TRACE(::testing::Message() << "L " << c.L << " world " << c.world);
    const int64_t B = 2, H = 3, dc = 64, dk = 16, ps = 4, D = dc + dk;
    Latent full = make_latent(c.lens, ps, dc, dk, DType::kBFloat16, 100 + c.L);
    Tensor q = testing::rand_tensor({B, c.L, H, D}, DType::kBFloat16, 101, -1.0, 1.0);
    TrtllmMlaArgs whole;
    whole.return_lse = true;
    whole.backend = "cute-dsl";
    AttentionOutput want = trtllm_mla(q, full.kv, full.block_tables, full.kv_lens, 16, whole);
    const int64_t rows = B * c.L;
    std::vector<double> num(static_cast<std::size_t>(rows * H * dc), 0.0),
        den(static_cast<std::size_t>(rows * H), 0.0);
    std::vector<std::vector<double>> outs, lses;
    for (int64_t rank = 0; rank < c.world; ++rank) {
      // The rank's local cache: request b's positions rank, rank + world, ... in fresh pages.
      std::vector<int32_t> local;
      for (int32_t n : c.lens) {
        local.push_back(static_cast<int32_t>(n > rank ? (n - rank + c.world - 1) / c.world : 0));
      }
      Latent loc = make_latent(local, ps, dc, dk, DType::kBFloat16, 200 + rank);
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t k = 0; k < local[b]; ++k) {
          const int64_t p = c.world * k + rank;
          loc.kv.select(0, loc.pages[b][k / ps])
              .select(0, k % ps)
              .copy_(full.kv.select(0, full.pages[b][p / ps]).select(0, p % ps));
        }
      }
      TrtllmMlaArgs a;
      a.return_lse = true;
      a.dcp = true;
      a.cp_world = c.world;
      a.cp_rank = rank;
      a.global = int_tensor(c.lens);
      AttentionOutput r = trtllm_mla(q, loc.kv, loc.block_tables, loc.kv_lens, 16, a);
      outs.push_back(r.out.to_double_vector());
      lses.push_back(r.lse.to_double_vector());
    }
    for (int64_t i = 0; i < rows * H; ++i) {
      double m = -std::numeric_limits<double>::infinity();
      for (const auto& lse : lses) m = std::max(m, lse[i]);
      for (std::size_t rk = 0; rk < lses.size(); ++rk) {
        const double w = lses[rk][i] == -std::numeric_limits<double>::infinity()
                             ? 0.0
                             : std::exp(lses[rk][i] - m);
        if (w == 0.0) {
          for (int64_t d = 0; d < dc; ++d) ASSERT_EQ(outs[rk][i * dc + d], 0.0);
        }
        den[i] += w;
        for (int64_t d = 0; d < dc; ++d) num[i * dc + d] += w * outs[rk][i * dc + d];
      }
      for (int64_t d = 0; d < dc; ++d) num[i * dc + d] /= den[i];
      den[i] = m + std::log(den[i]);
    }
    EXPECT_TRUE(testing::all_close(want.out, num, {2e-2, 2e-2}));
    EXPECT_TRUE(testing::all_close(want.lse, den, {1e-4, 1e-4}));
  }
}

// The optional parts' rules, each refusal naming its argument (upstream's where it has one).
TEST(TrtllmMlaDecode, OptionalPartsBadInput) {
  const char* op = "trtllm_batch_decode_with_kv_cache_mla";
  Latent l = make_latent({4, 7}, 4, 64, 16, DType::kBFloat16, 1);
  Tensor q = Tensor::zeros({2, 1, 2, 80}, DType::kBFloat16);
  auto run = [&](const TrtllmMlaArgs& a, const Tensor& bt) {
    trtllm_mla(q, l.kv, bt, l.kv_lens, 8, a);
  };
  const Tensor slots = int_tensor({0, 1, -1, -1, 5, 6, 7, -1}).view({2, 1, 4});
  TrtllmMlaArgs sp;
  sp.top_k = 4;
  run(sp, slots);                                                // valid
  EXPECT_FI_ERROR(run(sp, l.block_tables), op, "block_tables");  // a page table, not slots
  EXPECT_FI_ERROR(run(sp, int_tensor({0, 1, 99, -1, 5, 6, 7, -1}).view({2, 1, 4})), op,
                  "block_tables");
  EXPECT_FI_ERROR(run(sp, int_tensor({0, 1, -2, -1, 5, 6, 7, -1}).view({2, 1, 4})), op,
                  "block_tables");
  TrtllmMlaArgs bad = sp;
  bad.top_k = -1;
  EXPECT_FI_ERROR(run(bad, slots), op, "sparse_mla_top_k");
  bad = sp;
  bad.backend = "cute-dsl";
  EXPECT_FI_ERROR_CODE(run(bad, slots), op, "backend", ErrorCode::kUnsupported);
  bad = sp;
  bad.top_k_lens = int_tensor({1, 1});  // the DeepSeek layout (rope 16) refuses them
  EXPECT_FI_ERROR(run(bad, slots), op, "sparse_mla_top_k_lens");
  TrtllmMlaArgs r;
  r.max_q_len = 1;  // only with cum_seq_lens_q
  EXPECT_FI_ERROR(run(r, l.block_tables), op, "max_q_len");
  Tensor q3 = Tensor::zeros({3, 2, 80}, DType::kBFloat16);
  TrtllmMlaArgs rg;
  rg.cu_q = int_tensor({0, 1, 2});  // ends at 2, the query has 3 rows
  EXPECT_FI_ERROR(trtllm_mla(q3, l.kv, l.block_tables, l.kv_lens, 8, rg), op, "cum_seq_lens_q");
  rg.cu_q = int_tensor({0, 2, 3});
  rg.max_q_len = 1;  // request 0 has 2 queries
  EXPECT_FI_ERROR(trtllm_mla(q3, l.kv, l.block_tables, l.kv_lens, 8, rg), op, "max_q_len");
  rg.max_q_len = std::nullopt;
  trtllm_mla(q3, l.kv, l.block_tables, l.kv_lens, 8, rg);  // valid
  rg.return_lse = true;
  rg.backend = "trtllm-gen";
  EXPECT_FI_ERROR_CODE(trtllm_mla(q3, l.kv, l.block_tables, l.kv_lens, 8, rg), op, "return_lse",
                       ErrorCode::kUnsupported);
  TrtllmMlaArgs x;
  x.return_lse = true;
  x.backend = "xqa";
  EXPECT_FI_ERROR_CODE(run(x, l.block_tables), op, "return_lse", ErrorCode::kUnsupported);
  TrtllmMlaArgs xr;
  xr.backend = "xqa";
  xr.cu_q = int_tensor({0, 2, 3});
  EXPECT_FI_ERROR_CODE(trtllm_mla(q3, l.kv, l.block_tables, l.kv_lens, 8, xr), op, "cum_seq_lens_q",
                       ErrorCode::kUnsupported);
  for (int64_t bad : {0, 4}) {  // outside [1, total_q = 3]
    TrtllmMlaArgs mq;
    mq.cu_q = int_tensor({0, 2, 3});
    mq.max_q_len = bad;
    EXPECT_FI_ERROR(trtllm_mla(q3, l.kv, l.block_tables, l.kv_lens, 8, mq), op, "max_q_len");
  }
  // Sparse ragged queries with an LSE: no upstream backend computes them.
  TrtllmMlaArgs sr;
  sr.top_k = 4;
  sr.cu_q = int_tensor({0, 2, 3});
  sr.return_lse = true;
  EXPECT_FI_ERROR_CODE(trtllm_mla(q3, l.kv, Tensor::zeros({3, 4}, DType::kInt32), l.kv_lens, 8, sr),
                       op, "return_lse", ErrorCode::kUnsupported);
  // A [batch, q_len, H] LSE buffer is written as [rows, H]: a strided one is refused.
  TrtllmMlaArgs ls;
  ls.return_lse = true;
  ls.lse = Tensor::zeros({2, 2, 1}, DType::kFloat32).transpose(0, 2);
  EXPECT_FI_ERROR(run(ls, l.block_tables), op, "lse");
  // Context parallelism.
  TrtllmMlaArgs d;
  d.dcp = true;
  d.return_lse = true;
  d.cp_world = 2;
  d.cp_rank = 1;
  d.global = int_tensor({8, 14});
  run(d, l.block_tables);  // valid
  TrtllmMlaArgs e = d;
  e.return_lse = false;
  EXPECT_FI_ERROR(run(e, l.block_tables), op, "return_lse");
  e = d;
  e.cp_rank = 2;
  EXPECT_FI_ERROR(run(e, l.block_tables), op, "cp_rank");
  e = d;
  e.global = std::nullopt;
  EXPECT_FI_ERROR(run(e, l.block_tables), op, "causal_seqlens_kv_global");
  e = d;
  e.global = int_tensor({8});
  EXPECT_FI_ERROR(run(e, l.block_tables), op, "causal_seqlens_kv_global");
  e = d;
  e.backend = "trtllm-gen";
  EXPECT_FI_ERROR_CODE(run(e, l.block_tables), op, "backend", ErrorCode::kUnsupported);
  e = d;
  e.dcp = false;  // DCP arguments without enable_dcp
  EXPECT_FI_ERROR(run(e, l.block_tables), op, "enable_dcp");
}

// ---- CUDA against the CPU reference (skipped without a GPU) --------------------------------

// The CUDA kernel splits the KV axis when the grid is small (long caches, few rows and heads) and
// merges the partial states; these cases cover both paths, partial head groups (heads not a
// multiple of 8), widths under one warp, empty requests (out 0, lse -inf), fp8 caches with
// scales and both LSE bases.
struct CudaCase {
  DType q, kv;
  int64_t H, dc, dk, page_size;
  bool causal;
  std::vector<int32_t> qo_lens, kv_lens;
};

// The CUDA append copies 16 bytes at a time when every row start is 16-byte aligned and both
// dims fill whole chunks (append_mla_kernel, a warp per row, grid-stride), else element by
// element (append_mla_strided_kernel): each against the CPU, bit for bit. 9000 rows outrun one
// pass of the grid (SMs x resident blocks x 8 rows) on an H100 or H200.
TEST(MlaCuda, AppendVectorAndElementCopiesMatchCpu) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device g = Device::cuda(0);
  struct Case {
    DType d;
    int64_t dc, dk, nnz;
    int64_t offset;  // first column of the append rows inside rows 16 wider: 0 keeps them aligned
    const char* what;
  };
  for (const Case& c : {Case{DType::kBFloat16, 512, 64, 9000, 0, "bf16 aligned: vector"},
                        Case{DType::kBFloat16, 512, 64, 300, 1, "bf16 misaligned: element"},
                        Case{DType::kFloat8E4M3FN, 512, 64, 300, 0, "fp8 aligned: vector"},
                        Case{DType::kFloat8E4M3FN, 512, 64, 300, 3, "fp8 misaligned: element"},
                        Case{DType::kBFloat16, 24, 12, 300, 0, "partial chunks: element"}}) {
    SCOPED_TRACE(c.what);
    const int64_t P = 16;
    // Two requests, the rows split between them; every page distinct, in a shuffled order.
    const int64_t half = c.nnz / 2, pages0 = (half + P - 1) / P;
    const int64_t pages = pages0 + (c.nnz - half + P - 1) / P;
    std::vector<int32_t> indices(static_cast<std::size_t>(pages));
    std::iota(indices.begin(), indices.end(), 0);
    std::shuffle(indices.begin(), indices.end(), std::mt19937(7));
    std::vector<int32_t> bi, pos;
    for (int64_t i = 0; i < c.nnz; ++i) {
      bi.push_back(i < half ? 0 : 1);
      pos.push_back(static_cast<int32_t>(i < half ? i : i - half));
    }
    Tensor indptr = int_tensor({0, static_cast<int32_t>(pages0), static_cast<int32_t>(pages)});
    Tensor last = int_tensor({static_cast<int32_t>((half - 1) % P + 1),
                              static_cast<int32_t>((c.nnz - half - 1) % P + 1)});
    Tensor idx = int_tensor(indices), b = int_tensor(bi), ps = int_tensor(pos);
    // Sliced on each device: a copy of the view alone would start at an aligned address.
    Tensor acw = testing::rand_tensor({c.nnz, c.dc + 16}, c.d, 11, 0.5, 1.5);
    Tensor akw = testing::rand_tensor({c.nnz, c.dk + 16}, c.d, 12, 0.5, 1.5);
    Tensor ac = acw.slice(1, c.offset, c.offset + c.dc);
    Tensor ak = akw.slice(1, c.offset, c.offset + c.dk);
    Tensor ac_g = acw.to(g).slice(1, c.offset, c.offset + c.dc);
    Tensor ak_g = akw.to(g).slice(1, c.offset, c.offset + c.dk);
    Tensor ckv = Tensor::zeros({pages, P, c.dc}, c.d), kpe = Tensor::zeros({pages, P, c.dk}, c.d);
    Tensor ckv_g = ckv.to(g), kpe_g = kpe.to(g);
    append_paged_mla_kv_cache(ac_g, ak_g, b.to(g), ps.to(g), ckv_g, kpe_g, idx.to(g), indptr.to(g),
                              last.to(g));
    append_paged_mla_kv_cache(ac, ak, b, ps, ckv, kpe, idx, indptr, last);
    EXPECT_EQ(bytes_of(ckv_g.to(Device::cpu())), bytes_of(ckv));
    EXPECT_EQ(bytes_of(kpe_g.to(Device::cpu())), bytes_of(kpe));
  }
}

// The index arrays stay on the device (kernels/page_append_params.h): rows outside the page
// table (a request out of range, a position past its request's length, a request with no pages)
// are not written, the others land where the CPU puts them, bit for bit, on both copy kernels;
// the call synchronizes nothing, so a CUDA graph captures it in global mode.
TEST(MlaCuda, AppendReadsTheIndexArraysOnTheDevice) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device g = Device::cuda(0);
  // Page size 4, 10 pages; indptr starts at 2; request 1 has no pages; lengths 7, 0, 10.
  const std::vector<int32_t> indptr{2, 4, 4, 7}, indices{99, 99, 3, 5, 0, 8, 1, 99}, last{3, 0, 2};
  const std::vector<int32_t> bi{0, 2, -1, 0, 1, 2, 3, 0, 2};
  const std::vector<int32_t> pos{0, 9, 0, 7, 0, 3, 0, 6, 10};
  const std::vector<int64_t> kept{0, 1, 5, 7};
  const auto nnz = static_cast<int64_t>(bi.size());
  for (const int64_t dc : {512, 24}) {  // 16-byte copies (a warp a row), element copies
    SCOPED_TRACE(dc);
    const int64_t dk = dc / 8;
    const Tensor ac = testing::rand_tensor({nnz, dc}, DType::kBFloat16, 31, 0.5, 1.5);
    const Tensor ak = testing::rand_tensor({nnz, dk}, DType::kBFloat16, 32, 0.5, 1.5);
    Tensor ac_kept = Tensor::empty({4, dc}, DType::kBFloat16);
    Tensor ak_kept = Tensor::empty({4, dk}, DType::kBFloat16);
    std::vector<int32_t> kept_bi, kept_pos;
    for (std::size_t j = 0; j < kept.size(); ++j) {
      ac_kept.select(0, static_cast<int64_t>(j)).copy_(ac.select(0, kept[j]));
      ak_kept.select(0, static_cast<int64_t>(j)).copy_(ak.select(0, kept[j]));
      kept_bi.push_back(bi[kept[j]]);
      kept_pos.push_back(pos[kept[j]]);
    }
    Tensor ckv = testing::rand_tensor({10, 4, dc}, DType::kBFloat16, 33, -1.0, 1.0);
    Tensor kpe = testing::rand_tensor({10, 4, dk}, DType::kBFloat16, 34, -1.0, 1.0);
    const Tensor ckv0 = ckv.clone(), kpe0 = kpe.clone();
    append_paged_mla_kv_cache(ac_kept, ak_kept, int_tensor(kept_bi), int_tensor(kept_pos), ckv, kpe,
                              int_tensor(indices), int_tensor(indptr), int_tensor(last));
    const Tensor ac_g = ac.to(g), ak_g = ak.to(g), bi_g = int_tensor(bi).to(g),
                 pos_g = int_tensor(pos).to(g), idx_g = int_tensor(indices).to(g),
                 ip_g = int_tensor(indptr).to(g), last_g = int_tensor(last).to(g);
    Tensor ckv_g = ckv0.to(g), kpe_g = kpe0.to(g);
    append_paged_mla_kv_cache(ac_g, ak_g, bi_g, pos_g, ckv_g, kpe_g, idx_g, ip_g, last_g);
    EXPECT_EQ(bytes_of(ckv_g.to(Device::cpu())), bytes_of(ckv));
    EXPECT_EQ(bytes_of(kpe_g.to(Device::cpu())), bytes_of(kpe));
#if FLASHINFER_TEST_HAVE_CUDART
    Tensor ckv_c = ckv0.to(g), kpe_c = kpe0.to(g);
    ASSERT_NO_FATAL_FAILURE(testing::capture_on_own_stream([&] {
      append_paged_mla_kv_cache(ac_g, ak_g, bi_g, pos_g, ckv_c, kpe_c, idx_g, ip_g, last_g);
    }));
    EXPECT_EQ(bytes_of(ckv_c.to(Device::cpu())), bytes_of(ckv));
    EXPECT_EQ(bytes_of(kpe_c.to(Device::cpu())), bytes_of(kpe));
#endif
  }
}

TEST(MlaCuda, WrapperMatchesCpu) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const std::vector<CudaCase> cases = {
      // Decode over long caches: split-KV with the merge pass.
      {DType::kBFloat16, DType::kBFloat16, 16, 512, 64, 64, false, {1, 1}, {5000, 3000}},
      // Chunked prefill, causal, 128 heads: one split.
      {DType::kFloat16, DType::kFloat16, 128, 512, 64, 16, true, {37, 1, 20}, {100, 50, 20}},
      // fp8 cache with scales, 12 heads (a half-empty head group), an empty request.
      {DType::kBFloat16, DType::kFloat8E4M3FN, 12, 512, 64, 32, false, {2, 1, 3}, {700, 0, 33}},
      // Widths under one warp, fp32.
      {DType::kFloat32, DType::kFloat32, 3, 24, 8, 2, true, {3, 3}, {3, 7}},
      // e5m2 cache, causal with qo_len == kv_len, split-KV with causal ends.
      {DType::kFloat16, DType::kFloat8E5M2, 4, 512, 64, 8, true, {40, 1}, {40, 900}},
  };
  int idx = 0;
  for (const CudaCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << idx);
    Latent l = make_latent(c.kv_lens, c.page_size, c.dc, c.dk, c.kv, 300 + idx);
    std::vector<int32_t> qo_indptr{0};
    for (int32_t n : c.qo_lens) qo_indptr.push_back(qo_indptr.back() + n);
    const int64_t rows = qo_indptr.back();
    Tensor q = testing::rand_tensor({rows, c.H, c.dc + c.dk}, c.q, 400 + idx, -1.0, 1.0);
    const bool fp8 = dtype_is_fp8(c.kv);
    const std::optional<double> ckv_scale = fp8 ? std::optional<double>(0.75) : std::nullopt;
    const std::optional<double> kpe_scale = fp8 ? std::optional<double>(1.5) : std::nullopt;
    const double sm_scale = 1.0 / std::sqrt(static_cast<double>(c.dc / 4 + c.dk));
    BatchMLAPagedAttentionWrapper cpu(workspace());
    BatchMLAPagedAttentionWrapper dev(workspace().to(gpu));
    cpu.plan(int_tensor(qo_indptr), l.kv_indptr, l.kv_indices, l.kv_lens, c.H, c.dc, c.dk,
             c.page_size, c.causal, sm_scale, c.q, c.kv);
    dev.plan(int_tensor(qo_indptr).to(gpu), l.kv_indptr.to(gpu), l.kv_indices.to(gpu),
             l.kv_lens.to(gpu), c.H, c.dc, c.dk, c.page_size, c.causal, sm_scale, c.q, c.kv);
    const Tensor qn = q.slice(2, 0, c.dc), qp = q.slice(2, c.dc, c.dc + c.dk);
    const Tensor qn_d = testing::to_keep_layout(qn, gpu), qp_d = testing::to_keep_layout(qp, gpu);
    const Tensor ckv_d = testing::to_keep_layout(l.ckv, gpu);
    const Tensor kpe_d = testing::to_keep_layout(l.kpe, gpu);
    for (bool base_e : {false, true}) {
      SCOPED_TRACE(base_e ? "lse base e" : "lse base 2");
      AttentionOutput want = cpu.run(qn, qp, l.ckv, l.kpe, std::nullopt, std::nullopt, true,
                                     std::nullopt, std::nullopt, std::nullopt, base_e, std::nullopt,
                                     MlaRunOptions{.ckv_scale = ckv_scale, .kpe_scale = kpe_scale});
      // Twice: the second run reuses the uploaded page table.
      for (int rep = 0; rep < 2; ++rep) {
        AttentionOutput got =
            dev.run(qn_d, qp_d, ckv_d, kpe_d, std::nullopt, std::nullopt, true, std::nullopt,
                    std::nullopt, std::nullopt, base_e, std::nullopt,
                    MlaRunOptions{.ckv_scale = ckv_scale, .kpe_scale = kpe_scale});
        ASSERT_TRUE(got.out.device().is_cuda());
        EXPECT_TRUE(testing::all_close(got.out.to(Device::cpu()), want.out,
                                       testing::attention_tolerance(c.q)));
        EXPECT_TRUE(testing::all_close(got.lse.to(Device::cpu()), want.lse, {1e-4, 1e-4}));
      }
    }
    ++idx;
  }
}

// The deprecated decode wrapper on the device: the same kernel with one query per request and
// the q/k/v scales (v_scale through the kernel's output scale).
TEST(MlaCuda, DecodeWrapperMatchesCpu) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const std::vector<int32_t> lens = {3000, 1, 0, 77};
  Latent l = make_latent(lens, 64, 512, 64, DType::kFloat16, 31);
  const Tensor last = last_page_lens(lens, 64);
  Tensor q = testing::rand_tensor({4, 16, 576}, DType::kFloat16, 32, -1.0, 1.0);
  BatchDecodeMlaWithPagedKVCacheWrapper cpu(workspace());
  BatchDecodeMlaWithPagedKVCacheWrapper dev(workspace().to(gpu));
  cpu.plan(l.kv_indptr, l.kv_indices, last, 16, 512, 64, 0.07);
  dev.plan(l.kv_indptr.to(gpu), l.kv_indices.to(gpu), last.to(gpu), 16, 512, 64, 0.07);
  const Tensor qn = q.slice(2, 0, 512), qp = q.slice(2, 512, 576);
  AttentionOutput want =
      cpu.run(qn, qp, l.ckv, l.kpe, 1.5, 0.5, 2.0, std::nullopt, std::nullopt, true);
  AttentionOutput got =
      dev.run(testing::to_keep_layout(qn, gpu), testing::to_keep_layout(qp, gpu),
              testing::to_keep_layout(l.ckv, gpu), testing::to_keep_layout(l.kpe, gpu), 1.5, 0.5,
              2.0, std::nullopt, std::nullopt, true);
  ASSERT_TRUE(got.out.device().is_cuda());
  EXPECT_TRUE(testing::all_close(got.out.to(Device::cpu()), want.out,
                                 testing::attention_tolerance(DType::kFloat16)));
  EXPECT_TRUE(testing::all_close(got.lse.to(Device::cpu()), want.lse, {1e-4, 1e-4}));
}

#if FLASHINFER_TEST_HAVE_CUDART
// SGLang's MLA speculative verify under a CUDA graph (the engine-call audit of session 80):
// BatchMLAPagedAttentionWrapper(use_cuda_graph=True) with its qo / kv indptr, page-id and
// kv_len buffers on the device, 3 draft tokens a request, causal, page size 1, 16 heads; each
// step re-plans new KV lengths into the buffers and replays the one graph. Against the CPU.
TEST(MlaCuda, CudaGraphOfASpeculativeVerifyReplaysNewLengths) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device g = Device::cuda(0);
  const int64_t P = 1, H = 16, dc = 512, dk = 64, drafts = 3;
  const std::vector<int32_t> cap{90, 700, 12};
  const Latent l = make_latent(cap, P, dc, dk, DType::kBFloat16, 73);
  const std::vector<std::vector<int32_t>> steps{{80, 650, 3}, {84, 652, 7}, {90, 700, 12}};
  struct Table {
    Tensor indptr, indices, kv_lens;
  };
  auto table = [&](const std::vector<int32_t>& n) {
    std::vector<int32_t> indptr{0}, indices;
    for (std::size_t b = 0; b < n.size(); ++b) {
      for (int32_t i = 0; i < n[b]; ++i) indices.push_back(l.pages[b][static_cast<std::size_t>(i)]);
      indptr.push_back(static_cast<int32_t>(indices.size()));
    }
    return Table{int_tensor(indptr), int_tensor(indices), int_tensor(n)};
  };
  int64_t room = 0;
  for (int32_t n : cap) room += n;
  const int64_t rows = drafts * static_cast<int64_t>(cap.size());
  const Tensor q = testing::rand_tensor({rows, H, dc + dk}, DType::kBFloat16, 74, -1.0, 1.0);
  const Tensor qn = q.slice(2, 0, dc), qp = q.slice(2, dc, dc + dk);
  const Tensor qo = int_tensor({0, 3, 6, 9});
  const double sm_scale = 0.05;
  std::vector<Tensor> ref;
  for (const auto& n : steps) {
    const Table t = table(n);
    BatchMLAPagedAttentionWrapper cpu(workspace());
    cpu.plan(qo, t.indptr, t.indices, t.kv_lens, H, dc, dk, P, true, sm_scale, DType::kBFloat16,
             DType::kBFloat16);
    ref.push_back(cpu.run(qn, qp, l.ckv, l.kpe).out);
  }
  const Tensor qn_d = testing::to_keep_layout(qn, g), qp_d = testing::to_keep_layout(qp, g);
  const Tensor ckv_d = testing::to_keep_layout(l.ckv, g), kpe_d = testing::to_keep_layout(l.kpe, g);
  BatchMLAPagedAttentionWrapper w(workspace().to(g), true, Tensor::zeros({4}, DType::kInt32, g),
                                  Tensor::zeros({4}, DType::kInt32, g),
                                  Tensor::zeros({room}, DType::kInt32, g),
                                  Tensor::zeros({3}, DType::kInt32, g));
  Tensor out = Tensor::zeros({rows, H, dc}, DType::kBFloat16, g);
  auto plan = [&](std::size_t i) {
    const Table t = table(steps[i]);
    w.plan(qo.to(g), t.indptr.to(g), t.indices.to(g), t.kv_lens.to(g), H, dc, dk, P, true, sm_scale,
           DType::kBFloat16, DType::kBFloat16);
  };
  auto run = [&] { w.run(qn_d, qp_d, ckv_d, kpe_d, out); };
  plan(0);
  run();  // as engines warm up before capturing
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(testing::all_close(out.to(Device::cpu()), ref[0],
                                 testing::attention_tolerance(DType::kBFloat16)));
  testing::ReplayableGraph graph;
  ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, run));
  for (const std::size_t i : {std::size_t{1}, std::size_t{2}, std::size_t{0}}) {
    SCOPED_TRACE(::testing::Message() << "step " << i);
    out.fill_(0.0);
    plan(i);
    ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
    EXPECT_TRUE(testing::all_close(out.to(Device::cpu()), ref[i],
                                   testing::attention_tolerance(DType::kBFloat16)));
  }
  cudaGraphExecDestroy(graph.exec);
  cudaGraphDestroy(graph.graph);
  cudaStreamDestroy(graph.stream);
}

// Both MLA wrappers with use_cuda_graph=True, as engines decode DeepSeek: plan, capture run() in
// a graph, then re-plan with other lengths (longer than at capture, an empty request) and only
// replay the graph. Each replay must compute the latest plan: the plan uploads its arrays in place
// and the kernels take their KV chunk from the plan's longest request on the device (before,
// run() uploaded the arrays, so a replay read the captured plan's, and its splits covered only
// the captured lengths). A plan of another batch size, or with more pages than the page-index
// buffer holds, is refused by name.
TEST(MlaCuda, CudaGraphReplayedAfterReplanMatchesCpu) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device g = Device::cuda(0);
  const int64_t P = 64, H = 16, dc = 512, dk = 64;
  const std::vector<int32_t> cap{3000, 200, 64, 1500};
  const Latent l = make_latent(cap, P, dc, dk, DType::kBFloat16, 71);
  const std::vector<std::vector<int32_t>> lens{
      {40, 200, 1, 64}, {3000, 3, 50, 1500}, {0, 200, 64, 1}};
  struct Table {
    Tensor indptr, indices, kv_lens, last;
  };
  auto table = [&](const std::vector<int32_t>& n) {
    std::vector<int32_t> indptr{0}, indices, last;
    for (std::size_t b = 0; b < n.size(); ++b) {
      const auto pages = static_cast<int32_t>((n[b] + P - 1) / P);
      for (int32_t i = 0; i < pages; ++i)
        indices.push_back(l.pages[b][static_cast<std::size_t>(i)]);
      indptr.push_back(static_cast<int32_t>(indices.size()));
      last.push_back(pages == 0 ? 0 : n[b] - (pages - 1) * static_cast<int32_t>(P));
    }
    return Table{int_tensor(indptr), int_tensor(indices), int_tensor(n), int_tensor(last)};
  };
  int64_t room = 0;
  for (int32_t n : cap) room += (n + P - 1) / P;
  const Tensor q = testing::rand_tensor({4, H, dc + dk}, DType::kBFloat16, 72, -1.0, 1.0);
  const Tensor qn = q.slice(2, 0, dc), qp = q.slice(2, dc, dc + dk);
  const Tensor qn_d = testing::to_keep_layout(qn, g), qp_d = testing::to_keep_layout(qp, g);
  const Tensor ckv_d = testing::to_keep_layout(l.ckv, g), kpe_d = testing::to_keep_layout(l.kpe, g);
  const Tensor qo = int_tensor({0, 1, 2, 3, 4});
  const double sm_scale = 0.05;
  Tensor out = Tensor::zeros({4, H, dc}, DType::kBFloat16, g);
  Tensor lse = Tensor::zeros({4, H}, DType::kFloat32, g);
  for (const bool paged_wrapper : {true, false}) {
    SCOPED_TRACE(paged_wrapper ? "BatchMLAPagedAttentionWrapper"
                               : "BatchDecodeMlaWithPagedKVCacheWrapper");
    std::vector<AttentionOutput> ref;
    for (const auto& n : lens) {
      const Table t = table(n);
      if (paged_wrapper) {
        BatchMLAPagedAttentionWrapper cpu(workspace());
        cpu.plan(qo, t.indptr, t.indices, t.kv_lens, H, dc, dk, P, false, sm_scale,
                 DType::kBFloat16, DType::kBFloat16);
        ref.push_back(cpu.run(qn, qp, l.ckv, l.kpe, std::nullopt, std::nullopt, true));
      } else {
        BatchDecodeMlaWithPagedKVCacheWrapper cpu(workspace());
        // bf16 planned: the wrapper's default data_type is upstream's float16.
        cpu.plan(t.indptr, t.indices, t.last, H, dc, P, sm_scale, -1, std::nullopt,
                 DType::kBFloat16, DType::kBFloat16);
        ref.push_back(cpu.run(qn, qp, l.ckv, l.kpe, std::nullopt, std::nullopt, std::nullopt,
                              std::nullopt, std::nullopt, true));
      }
    }
    std::unique_ptr<BatchMLAPagedAttentionWrapper> pw;
    std::unique_ptr<BatchDecodeMlaWithPagedKVCacheWrapper> dw;
    if (paged_wrapper) {
      pw = std::make_unique<BatchMLAPagedAttentionWrapper>(
          workspace().to(g), true, Tensor::zeros({5}, DType::kInt32, g),
          Tensor::zeros({5}, DType::kInt32, g), Tensor::zeros({room}, DType::kInt32, g),
          Tensor::zeros({4}, DType::kInt32, g));
    } else {
      dw = std::make_unique<BatchDecodeMlaWithPagedKVCacheWrapper>(
          workspace().to(g), true, false, Tensor::zeros({5}, DType::kInt32, g),
          Tensor::zeros({room}, DType::kInt32, g), Tensor::zeros({4}, DType::kInt32, g));
    }
    auto plan = [&](const Table& t) {
      if (pw) {
        pw->plan(qo.to(g), t.indptr.to(g), t.indices.to(g), t.kv_lens.to(g), H, dc, dk, P, false,
                 sm_scale, DType::kBFloat16, DType::kBFloat16);
      } else {
        dw->plan(t.indptr.to(g), t.indices.to(g), t.last.to(g), H, dc, P, sm_scale, -1,
                 std::nullopt, DType::kBFloat16, DType::kBFloat16);
      }
    };
    auto run = [&] {
      if (pw) {
        pw->run(qn_d, qp_d, ckv_d, kpe_d, out, lse, true);
      } else {
        dw->run(qn_d, qp_d, ckv_d, kpe_d, std::nullopt, std::nullopt, std::nullopt, out, lse, true);
      }
    };
    plan(table(lens[0]));
    run();  // as engines warm up before capturing
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    testing::ReplayableGraph graph;
    ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, run));
    for (const std::size_t i : {std::size_t{1}, std::size_t{2}, std::size_t{0}, std::size_t{1}}) {
      SCOPED_TRACE(::testing::Message() << "plan " << i);
      out.fill_(0.0);
      plan(table(lens[i]));
      ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
      EXPECT_TRUE(testing::all_close(out.to(Device::cpu()), ref[i].out,
                                     testing::attention_tolerance(DType::kBFloat16)));
      EXPECT_TRUE(testing::all_close(lse.to(Device::cpu()), ref[i].lse, {1e-4, 1e-4}));
    }
    cudaGraphExecDestroy(graph.exec);
    cudaGraphDestroy(graph.graph);
    cudaStreamDestroy(graph.stream);
    // Another batch size; more pages than the page-index buffer holds; another page size (the
    // captured kernels would read the page lists with the first one's) or sm_scale.
    const Table three = table({40, 200, 1});
    const Table wide = table({3000, 200, 64, 1500});
    const Table small = table({16, 30, 1, 20});  // one page each: valid at page size 32 too
    if (pw) {
      const char* op = "BatchMLAPagedAttentionWrapper.plan";
      EXPECT_FI_ERROR(pw->plan(int_tensor({0, 1, 2, 3}).to(g), three.indptr.to(g),
                               three.indices.to(g), three.kv_lens.to(g), H, dc, dk, P, false,
                               sm_scale, DType::kBFloat16, DType::kBFloat16),
                      op, "qo_indptr");
      Tensor more = Tensor::zeros({room + 1}, DType::kInt32);
      more.slice(0, 0, room).copy_(wide.indices);
      Tensor more_ptr = int_tensor({0, 47, 51, 52, static_cast<int32_t>(room + 1)});
      EXPECT_FI_ERROR(
          pw->plan(qo.to(g), more_ptr.to(g), more.to(g), int_tensor({3000, 200, 64, 1500}).to(g), H,
                   dc, dk, P, false, sm_scale, DType::kBFloat16, DType::kBFloat16),
          op, "kv_indices");
      EXPECT_FI_ERROR(
          pw->plan(qo.to(g), small.indptr.to(g), small.indices.to(g), small.kv_lens.to(g), H, dc,
                   dk, P / 2, false, sm_scale, DType::kBFloat16, DType::kBFloat16),
          op, "page_size");
      EXPECT_FI_ERROR(
          pw->plan(qo.to(g), small.indptr.to(g), small.indices.to(g), small.kv_lens.to(g), H, dc,
                   dk, P, false, 2 * sm_scale, DType::kBFloat16, DType::kBFloat16),
          op, "self");
    } else {
      const char* op = "BatchDecodeMlaWithPagedKVCacheWrapper.plan";
      EXPECT_FI_ERROR(
          dw->plan(three.indptr.to(g), three.indices.to(g), three.last.to(g), H, dc, P, sm_scale),
          op, "last_page_len");
      EXPECT_FI_ERROR(dw->plan(small.indptr.to(g), small.indices.to(g), small.last.to(g), H, dc,
                               P / 2, sm_scale),
                      op, "page_size");
    }
  }
}

// Upstream's kernels read the page ids when they run: vLLM's SM90 sparse MLA backend plans with
// its device buffer, then writes each step's ids into it inside the captured forward. Here the
// MLA kernels read the caller's tensor too, after the page guard kernel: a graph replayed after
// new ids (no new plan) matches the CPU over those ids; a request with an id outside the cache
// gets NaN rows, the others still match; good ids again, every request is taken again. Without
// use_cuda_graph a device kv_indices rewritten after plan is read likewise; a host one is copied
// at plan (upstream's .to(device)).
TEST(MlaCuda, WrapperReadsThePageIdsWrittenAfterPlanAndGuardsThem) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device g = Device::cuda(0);
  const int64_t P = 16, H = 16, dc = 512, dk = 64;
  const Latent l = make_latent({300, 40, 1000}, P, dc, dk, DType::kBFloat16, 81);
  const std::vector<int32_t> ids_a = ints_of(l.kv_indices);
  std::vector<int32_t> ids_b = ids_a;
  std::reverse(ids_b.begin(), ids_b.end());
  const auto n = static_cast<int64_t>(ids_a.size());
  const Tensor qo = int_tensor({0, 1, 3, 4});
  const Tensor q = testing::rand_tensor({4, H, dc + dk}, DType::kBFloat16, 82, -1.0, 1.0);
  const Tensor qn = q.slice(2, 0, dc), qp = q.slice(2, dc, dc + dk);
  const Tensor qn_d = testing::to_keep_layout(qn, g), qp_d = testing::to_keep_layout(qp, g);
  const Tensor ckv_d = testing::to_keep_layout(l.ckv, g), kpe_d = testing::to_keep_layout(l.kpe, g);
  const double sm_scale = 0.06;
  auto plan = [&](BatchMLAPagedAttentionWrapper& w, const Tensor& ids, bool dev) {
    const Tensor ip = dev ? l.kv_indptr.to(g) : l.kv_indptr;
    const Tensor lens = dev ? l.kv_lens.to(g) : l.kv_lens;
    w.plan(dev ? qo.to(g) : qo, ip, ids, lens, H, dc, dk, P, true, sm_scale, DType::kBFloat16,
           DType::kBFloat16);
  };
  auto cpu_ref = [&](const std::vector<int32_t>& ids) {
    BatchMLAPagedAttentionWrapper w(workspace());
    plan(w, int_tensor(ids), false);
    return w.run(qn, qp, l.ckv, l.kpe, std::nullopt, std::nullopt, true);
  };
  const AttentionOutput ref_a = cpu_ref(ids_a), ref_b = cpu_ref(ids_b);
  const auto tol = testing::attention_tolerance(DType::kBFloat16);
  auto matches = [&](const Tensor& out, const Tensor& lse, const AttentionOutput& ref) {
    EXPECT_TRUE(testing::all_close(out.to(Device::cpu()), ref.out, tol));
    EXPECT_TRUE(testing::all_close(lse.to(Device::cpu()), ref.lse, {1e-4, 1e-4}));
  };
  auto write = [&](Tensor& buf, const std::vector<int32_t>& ids) {
    buf.slice(0, 0, n).copy_(int_tensor(ids));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  };
  {
    SCOPED_TRACE("use_cuda_graph, vLLM's pattern");
    Tensor buf = Tensor::zeros({n + 5}, DType::kInt32, g);
    BatchMLAPagedAttentionWrapper w(workspace().to(g), true, Tensor::zeros({4}, DType::kInt32, g),
                                    Tensor::zeros({4}, DType::kInt32, g), buf,
                                    Tensor::zeros({3}, DType::kInt32, g));
    plan(w, buf, false);  // host indptrs and lengths, the device buffer of (stale) ids
    Tensor out = Tensor::zeros({4, H, dc}, DType::kBFloat16, g);
    Tensor lse = Tensor::zeros({4, H}, DType::kFloat32, g);
    auto run = [&] { w.run(qn_d, qp_d, ckv_d, kpe_d, out, lse, true); };
    write(buf, ids_a);
    run();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    matches(out, lse, ref_a);
    testing::ReplayableGraph graph;
    ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, run));
    auto replay = [&] {
      out.fill_(0.0);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
    };
    write(buf, ids_b);
    replay();
    matches(out, lse, ref_b);
    // Request 1's second page id past the cache: its rows (1 and 2) NaN, the others still match.
    std::vector<int32_t> bad = ids_b;
    bad[static_cast<std::size_t>(ints_of(l.kv_indptr)[1] + 1)] =
        static_cast<int32_t>(l.ckv.size(0));
    write(buf, bad);
    replay();
    const Tensor out_h = out.to(Device::cpu()), lse_h = lse.to(Device::cpu());
    for (const int64_t r : {0, 3}) {
      EXPECT_TRUE(testing::all_close(out_h.select(0, r), ref_b.out.select(0, r), tol)) << r;
      EXPECT_TRUE(testing::all_close(lse_h.select(0, r), ref_b.lse.select(0, r), {1e-4, 1e-4}));
    }
    for (const int64_t r : {1, 2}) {
      for (double x : out_h.select(0, r).to_double_vector()) ASSERT_TRUE(std::isnan(x)) << r;
      for (double x : lse_h.select(0, r).to_double_vector()) ASSERT_TRUE(std::isnan(x)) << r;
    }
    write(buf, ids_a);
    replay();
    matches(out, lse, ref_a);
    // Fewer query rows (vLLM re-plans one wrapper with each step's rows): the captured grid's
    // rows past them are skipped. One query a request, each its request's last token.
    {
      const Tensor qo3 = int_tensor({0, 1, 2, 3});
      BatchMLAPagedAttentionWrapper cpu(workspace());
      cpu.plan(qo3, l.kv_indptr, int_tensor(ids_a), l.kv_lens, H, dc, dk, P, true, sm_scale,
               DType::kBFloat16, DType::kBFloat16);
      const AttentionOutput ref3 = cpu.run(qn.slice(0, 0, 3), qp.slice(0, 0, 3), l.ckv, l.kpe,
                                           std::nullopt, std::nullopt, true);
      w.plan(qo3, l.kv_indptr, buf, l.kv_lens, H, dc, dk, P, true, sm_scale, DType::kBFloat16,
             DType::kBFloat16);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      replay();
      EXPECT_TRUE(testing::all_close(out.slice(0, 0, 3).to(Device::cpu()), ref3.out, tol));
      EXPECT_TRUE(testing::all_close(lse.slice(0, 0, 3).to(Device::cpu()), ref3.lse, {1e-4, 1e-4}));
      for (double x : out.select(0, 3).to(Device::cpu()).to_double_vector()) {
        ASSERT_EQ(x, 0.0) << "the skipped row was written";
      }
      plan(w, buf, false);  // four rows again
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      replay();
      matches(out, lse, ref_a);
      EXPECT_FI_ERROR(w.plan(int_tensor({0, 2, 4, 5}), l.kv_indptr, buf, l.kv_lens, H, dc, dk, P,
                             true, sm_scale, DType::kBFloat16, DType::kBFloat16),
                      "BatchMLAPagedAttentionWrapper.plan", "qo_indptr");
    }
    cudaGraphExecDestroy(graph.exec);
    cudaGraphDestroy(graph.graph);
    cudaStreamDestroy(graph.stream);
  }
  {
    SCOPED_TRACE("a device kv_indices rewritten after plan; a host one copied at plan");
    BatchMLAPagedAttentionWrapper w(workspace().to(g));
    Tensor ids = int_tensor(ids_a).to(g);
    plan(w, ids, true);
    write(ids, ids_b);
    AttentionOutput r = w.run(qn_d, qp_d, ckv_d, kpe_d, std::nullopt, std::nullopt, true);
    matches(r.out, r.lse, ref_b);
    Tensor host = int_tensor(ids_a);
    plan(w, host, true);
    host.copy_(int_tensor(ids_b));
    r = w.run(qn_d, qp_d, ckv_d, kpe_d, std::nullopt, std::nullopt, true);
    matches(r.out, r.lse, ref_a);
  }
}
#endif

TEST(MlaCuda, TrtllmAndXqaMatchCpu) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  struct Case {
    DType q, kv;
    int64_t page_size, q_len, H;
    std::vector<int32_t> lens;
  };
  const std::vector<Case> cases = {
      {DType::kBFloat16, DType::kBFloat16, 32, 1, 16, {9, 300, 1200}},
      {DType::kFloat16, DType::kFloat16, 64, 2, 128, {70, 2, 513}},  // MTP: causal among queries
      {DType::kFloat8E4M3FN, DType::kFloat8E4M3FN, 16, 3, 16, {3, 2000, 40}},
      {DType::kBFloat16, DType::kFloat8E4M3FN, 1, 1, 8, {0, 17, 5}},
  };
  const int64_t dc = 512, dk = 64;
  int idx = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << idx);
    const auto B = static_cast<int64_t>(c.lens.size());
    Latent l = make_latent(c.lens, c.page_size, dc, dk, c.kv, 500 + idx);
    Tensor q = testing::rand_tensor({B, c.q_len, c.H, dc + dk}, c.q, 600 + idx, -1.0, 1.0);
    const int64_t max_len = *std::max_element(c.lens.begin(), c.lens.end());
    const Tensor kv4 = l.kv.unsqueeze(1);
    Tensor want =
        trtllm_batch_decode_with_kv_cache_mla(q, kv4, workspace(), 128, dc, dk, l.block_tables,
                                              l.kv_lens, max_len, 0, std::nullopt, 0.05, 1.25);
    const Tensor ws = workspace().to(gpu);
    Tensor got = trtllm_batch_decode_with_kv_cache_mla(q.to(gpu), kv4.to(gpu), ws, 128, dc, dk,
                                                       l.block_tables.to(gpu), l.kv_lens.to(gpu),
                                                       max_len, 0, std::nullopt, 0.05, 1.25);
    ASSERT_TRUE(got.device().is_cuda());
    const testing::Tolerance tol = testing::attention_tolerance(want.dtype());
    EXPECT_TRUE(testing::all_close(got.to(Device::cpu()), want, tol));
    Tensor gx = xqa_batch_decode_with_kv_cache_mla(q.to(gpu), l.kv.to(gpu), ws, 128, dc, dk,
                                                   l.block_tables.to(gpu), l.kv_lens.to(gpu),
                                                   max_len, std::nullopt, 0.05, 1.25);
    EXPECT_TRUE(testing::all_close(gx.to(Device::cpu()), want, tol));
    ++idx;
  }
}

// The trtllm name's optional parts on CUDA: the LSE of a device-planned call (an empty request's
// -inf included) and ragged queries (planned on the host) match the CPU; sparse and
// context-parallel calls are refused by name, so a replay falls back to the CPU. Compiled, not
// run.
TEST(MlaCuda, TrtllmDecodeLseAndRaggedQueriesMatchCpu) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const std::vector<int32_t> lens{9, 0, 1200, 70};
  const int64_t B = 4, H = 16, dc = 512, dk = 64;
  Latent l = make_latent(lens, 32, dc, dk, DType::kBFloat16, 700);
  Tensor q = testing::rand_tensor({B, 1, H, dc + dk}, DType::kBFloat16, 701, -1.0, 1.0);
  auto to_gpu = [&](TrtllmMlaArgs a) {
    for (std::optional<Tensor>* t : {&a.out, &a.lse, &a.cu_q, &a.top_k_lens, &a.global}) {
      if (*t) **t = (*t)->to(gpu);
    }
    return a;
  };
  auto both = [&](const Tensor& qq, const Latent& lat, const TrtllmMlaArgs& a) {
    AttentionOutput want = trtllm_mla(qq, lat.kv, lat.block_tables, lat.kv_lens, 1200, a);
    AttentionOutput got = trtllm_mla(qq.to(gpu), lat.kv.to(gpu), lat.block_tables.to(gpu),
                                     lat.kv_lens.to(gpu), 1200, to_gpu(a));
    ASSERT_TRUE(got.out.device().is_cuda());
    EXPECT_TRUE(testing::all_close(got.out.to(Device::cpu()), want.out,
                                   testing::attention_tolerance(DType::kBFloat16)));
    EXPECT_TRUE(testing::all_close(got.lse.to(Device::cpu()), want.lse, {1e-3, 1e-3}));
  };
  TrtllmMlaArgs dense;
  dense.dk = dk;
  dense.return_lse = true;
  both(q, l, dense);
  // Ragged: 1, 3, 2 and 2 queries, causal among each request's; natural-log LSE ("auto").
  const std::vector<int32_t> ragged_lens{9, 3, 1200, 70};
  Latent lr = make_latent(ragged_lens, 32, dc, dk, DType::kBFloat16, 702);
  Tensor qr = testing::rand_tensor({8, H, dc + dk}, DType::kBFloat16, 703, -1.0, 1.0);
  TrtllmMlaArgs rg = dense;
  rg.cu_q = int_tensor({0, 1, 4, 6, 8});
  rg.max_q_len = 3;
  both(qr, lr, rg);
  // Refused on the GPU by name.
  const char* op = "trtllm_batch_decode_with_kv_cache_mla";
  TrtllmMlaArgs sp;
  sp.dk = dk;
  sp.top_k = 4;
  EXPECT_FI_ERROR_CODE(
      trtllm_mla(q.to(gpu), l.kv.to(gpu), Tensor::zeros({B, 1, 4}, DType::kInt32).to(gpu),
                 l.kv_lens.to(gpu), 1200, sp),
      op, "sparse_mla_top_k", ErrorCode::kUnsupported);
  TrtllmMlaArgs dcp;
  dcp.dk = dk;
  dcp.dcp = true;
  dcp.return_lse = true;
  dcp.cp_world = 2;
  dcp.global = int_tensor({18, 6, 2400, 140}).to(gpu);
  EXPECT_FI_ERROR_CODE(
      trtllm_mla(q.to(gpu), l.kv.to(gpu), l.block_tables.to(gpu), l.kv_lens.to(gpu), 1200, dcp), op,
      "enable_dcp", ErrorCode::kUnsupported);
}

#if FLASHINFER_TEST_HAVE_CUDART
// The tensor-core MLA kernel's stages on device 0 (mla_mma_stages of its opt-in shared memory).
int mla_mma_device_stages(bool fp8_cache) {
  int optin = 0;
  EXPECT_EQ(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0),
            cudaSuccess);
  return kernels::cuda::mla::mla_mma_stages(static_cast<std::size_t>(optin), fp8_cache);
}

// A call's results on the tensor-core kernel and (FLASHINFER_MLA_TENSOR_CORES=0) the CUDA-core
// kernels, against the CPU's.
void expect_both_kernels_match_cpu(const AttentionOutput& want, const AttentionOutput& tc,
                                   const AttentionOutput& cores, DType q) {
  const testing::Tolerance tol = testing::attention_tolerance(q);
  for (const AttentionOutput* r : {&tc, &cores}) {
    SCOPED_TRACE(r == &tc ? "tensor cores" : "CUDA cores");
    EXPECT_TRUE(testing::all_close(r->out.to(Device::cpu()), want.out, tol));
    EXPECT_TRUE(testing::all_close(r->lse.to(Device::cpu()), want.lse, {1e-4, 1e-4}));
  }
}

// A NoPE model's MLA (head_dim_kpe 0) as vLLM's SM90 sparse backend calls it: page size 1 (each
// query token a request whose ids are its top-k slots), padded requests with no query and no key,
// not causal, ckv and the empty kpe as views of one [slots, 1, 512] cache, q_pe [rows, H, 0];
// bf16 and e4m3 caches (ckv_scale 0.5, kpe_scale 1, as vLLM passes), fp16 with e5m2 and fp16. On
// the tensor-core kernel's NoPE instances (where the device gives it 3 stages: sm_90; the launch
// counter says it ran) and with FLASHINFER_MLA_TENSOR_CORES=0 on the CUDA-core fallback kernel,
// against the CPU; heads 16 (query rows packed), 64 and 128 (two head groups); keys up to 2048
// (split). Compiled, not run.
TEST(MlaCuda, NoPeMatchesCpuOnBothKernels) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  testing::ScopedEnv no_sm90("FLASHINFER_MLA_SM90", nullptr);
  struct Case {
    DType q, kv;
    int64_t H;
    std::vector<int32_t> kv_lens;  // a request a query token; 0: a padded row
  };
  const std::vector<Case> cases = {
      {DType::kBFloat16, DType::kBFloat16, 16, {2048, 37, 0, 513, 1, 0}},
      {DType::kBFloat16, DType::kFloat8E4M3FN, 64, {300, 2048, 5, 0}},
      {DType::kBFloat16, DType::kBFloat16, 128, {64, 1000, 33}},
      {DType::kBFloat16, DType::kFloat8E4M3FN, 16, {1, 2, 3, 2048}},
      {DType::kFloat16, DType::kFloat8E5M2, 32, {700, 0, 65}},
      {DType::kFloat16, DType::kFloat16, 8, {31, 32, 33}},
  };
  int idx = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << idx);
    const bool fp8 = dtype_is_fp8(c.kv);
    const bool tc = kernels::cuda::mla::mla_mma_instance(0, mla_mma_device_stages(fp8), false);
    Latent l = make_latent(c.kv_lens, 1, 512, 0, c.kv, 500 + idx);
    std::vector<int32_t> qo_indptr{0};
    for (int32_t n : c.kv_lens) qo_indptr.push_back(qo_indptr.back() + (n > 0 ? 1 : 0));
    const int64_t rows = qo_indptr.back();
    Tensor q = testing::rand_tensor({rows, c.H, 512}, c.q, 600 + idx, -1.0, 1.0);
    const std::optional<double> ckv_scale = fp8 ? std::optional<double>(0.5) : std::nullopt;
    const std::optional<double> kpe_scale = fp8 ? std::optional<double>(1.0) : std::nullopt;
    const double sm_scale = 1.0 / std::sqrt(576.0);
    auto run_on = [&](Device d) {
      BatchMLAPagedAttentionWrapper w(workspace().to(d));
      w.plan(int_tensor(qo_indptr), l.kv_indptr, l.kv_indices.to(d), l.kv_lens, c.H, 512, 0, 1,
             false, sm_scale, c.q, c.kv);
      const Tensor qd = q.to(d), kv = l.kv.to(d);
      return w.run(qd, qd.slice(2, 512, 512), kv.slice(2, 0, 512), kv.slice(2, 512, 512),
                   std::nullopt, std::nullopt, true, std::nullopt, std::nullopt, std::nullopt,
                   false, std::nullopt,
                   MlaRunOptions{.ckv_scale = ckv_scale, .kpe_scale = kpe_scale});
    };
    const AttentionOutput want = run_on(Device::cpu());
    const long long before = kernels::cuda::mla_mma_nope_launches();
    AttentionOutput got;
    {
      testing::ScopedEnv on("FLASHINFER_MLA_TENSOR_CORES", nullptr);
      got = run_on(gpu);
    }
    EXPECT_EQ(kernels::cuda::mla_mma_nope_launches() > before, tc)
        << "the tensor-core kernel's NoPE instance ran: " << !tc;
    AttentionOutput cores;
    {
      testing::ScopedEnv off("FLASHINFER_MLA_TENSOR_CORES", "0");
      const long long at = kernels::cuda::mla_mma_nope_launches();
      cores = run_on(gpu);
      EXPECT_EQ(kernels::cuda::mla_mma_nope_launches(), at) << "the switch keeps the CUDA cores";
    }
    expect_both_kernels_match_cpu(want, got, cores, c.q);
    ++idx;
  }
}
#endif

#if FLASHINFER_TEST_HAVE_CUDART
// ckv_scale_arr on CUDA: SGLang's DSA fp8 call (NoPE, page size 1, ckv_scale 1.0 beside the
// array) and a rope call with pages of 16, on the tensor-core kernel (the array's rows copied with
// each fp8 tile, each value scaled and rounded as it is widened) and, with
// FLASHINFER_MLA_TENSOR_CORES=0, on the CUDA-core fallback kernel, against the CPU; 16 heads (rows
// packed) and 128 (two head groups), split-KV at 2048 keys; the launch counter says the
// tensor-core kernel ran where it has an instance; one key a request bit for bit. Compiled, not
// run.
TEST(MlaCuda, CkvScaleArrMatchesCpuOnBothKernels) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  testing::ScopedEnv no_sm90("FLASHINFER_MLA_SM90", nullptr);
  const int stages = mla_mma_device_stages(true);
  struct Case {
    DType q;
    int64_t H, dk, page_size;
    bool causal;
    std::vector<int32_t> qo_lens, kv_lens;
  };
  const std::vector<Case> cases = {
      {DType::kBFloat16, 16, 0, 1, false, {1, 1, 0, 1}, {2048, 300, 0, 17}},
      {DType::kBFloat16, 128, 64, 16, true, {3, 1}, {700, 2048}},
      {DType::kFloat16, 32, 64, 1, false, {1, 1}, {65, 1000}},
      // 16 heads, 4 causal queries of one request: the MMA rows packed, each row its own end.
      {DType::kBFloat16, 16, 64, 16, true, {4, 2}, {300, 40}},
  };
  int idx = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << idx);
    ScaledLatent s = make_scaled_latent(c.kv_lens, c.page_size, 512, c.dk, 900 + idx);
    std::vector<int32_t> qo_indptr{0};
    for (int32_t n : c.qo_lens) qo_indptr.push_back(qo_indptr.back() + n);
    const int64_t rows = qo_indptr.back();
    Tensor q = testing::rand_tensor({rows, c.H, 512 + c.dk}, c.q, 950 + idx, -1.0, 1.0);
    const double sm_scale = 1.0 / std::sqrt(192.0);
    auto run_on = [&](Device d) {
      BatchMLAPagedAttentionWrapper w(workspace().to(d));
      w.plan(int_tensor(qo_indptr), s.l.kv_indptr, s.l.kv_indices.to(d), s.l.kv_lens, c.H, 512,
             c.dk, c.page_size, c.causal, sm_scale, c.q, DType::kFloat8E4M3FN);
      const Tensor qd = q.to(d), kv = s.l.kv.to(d);
      return w.run(qd.slice(2, 0, 512), qd.slice(2, 512, 512 + c.dk), kv.slice(2, 0, 512),
                   kv.slice(2, 512, 512 + c.dk), std::nullopt, std::nullopt, true, std::nullopt,
                   std::nullopt, std::nullopt, false, std::nullopt,
                   MlaRunOptions{.ckv_scale = 1.0, .ckv_scale_arr = s.arr.to(d), .kpe_scale = 1.0});
    };
    const AttentionOutput want = run_on(Device::cpu());
    AttentionOutput tc, cores;
    const long long before = kernels::cuda::mla_mma_scale_arr_launches();
    {
      testing::ScopedEnv on("FLASHINFER_MLA_TENSOR_CORES", nullptr);
      tc = run_on(gpu);
    }
    EXPECT_EQ(kernels::cuda::mla_mma_scale_arr_launches() > before,
              kernels::cuda::mla::mla_mma_instance(c.dk, stages, false))
        << "the tensor-core kernel ran with the array";
    const long long before_cores = kernels::cuda::mla_mma_scale_arr_launches();
    {
      testing::ScopedEnv off("FLASHINFER_MLA_TENSOR_CORES", "0");
      cores = run_on(gpu);
    }
    // (Else "both kernels" would be the tensor-core kernel twice.)
    EXPECT_EQ(kernels::cuda::mla_mma_scale_arr_launches(), before_cores)
        << "FLASHINFER_MLA_TENSOR_CORES=0 ran the tensor-core kernel";
    expect_both_kernels_match_cpu(want, tc, cores, c.q);
    ++idx;
  }
  // One key a request: both kernels give each token's dequantized row bit for bit.
  for (int64_t dk : {int64_t{64}, int64_t{0}}) {
    ScaledLatent s = make_scaled_latent({1, 1, 1, 1}, 2, 512, dk, 60 + dk);
    const Tensor want = one_key_rows_expected(s, 16, DType::kBFloat16);
    for (const char* tensor_cores : {static_cast<const char*>(nullptr), "0"}) {
      SCOPED_TRACE(::testing::Message() << "kpe " << dk << (tensor_cores ? ", CUDA cores" : ""));
      testing::ScopedEnv env("FLASHINFER_MLA_TENSOR_CORES", tensor_cores);
      const long long before = kernels::cuda::mla_mma_scale_arr_launches();
      const AttentionOutput got = run_one_key_rows(s, 16, DType::kBFloat16, dk, gpu);
      EXPECT_EQ(bytes_of(got.out.to(Device::cpu())), bytes_of(want));
      EXPECT_EQ(kernels::cuda::mla_mma_scale_arr_launches() > before,
                tensor_cores == nullptr && kernels::cuda::mla::mla_mma_instance(dk, stages, false))
          << "the kernel that ran";
    }
  }
}
#endif

// On CUDA the trtllm / xqa MLA decode plans on the device (kernels/block_table_plan.h): a grid
// sized for max_seq_len 2048 (a table of 160 columns of 16 tokens leaves it that bound) and a
// KV chunk from the longest accepted request (700 tokens). The rows of the requests the host
// checks would refuse are NaN and the others match the CPU: a page id past the cache (request
// 1), a length past max_seq_len (request 3), fewer keys than causal queries (request 4, MTP's 2
// queries). On the tensor-core kernel (16 heads: query rows packed; 128: two head groups) and,
// with FLASHINFER_MLA_TENSOR_CORES=0, the CUDA-core kernels; then a batch whose every request is
// refused. Compiled, not run.
TEST(MlaCuda, TrtllmDecodeRefusesRequestsOnTheDevice) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const std::vector<int32_t> lens{90, 40, 700, 33, 20};
  const int64_t dc = 512, dk = 64, q_len = 2, max_seq_len = 2048, cols = 160;
  const auto B = static_cast<int64_t>(lens.size());
  Latent l = make_latent(lens, 16, dc, dk, DType::kBFloat16, 71);
  // The table padded with -1 to `cols` columns (never read past a request's pages).
  std::vector<int32_t> wide(static_cast<std::size_t>(B * cols), -1);
  for (int64_t b = 0; b < B; ++b) {
    for (std::size_t i = 0; i < l.pages[b].size(); ++i) wide[b * cols + i] = l.pages[b][i];
  }
  const Tensor table = int_tensor(wide).view({B, cols});
  std::vector<int32_t> bad_table = wide;
  bad_table[1 * cols + 1] = static_cast<int32_t>(l.kv.size(0));  // request 1: past the cache
  std::vector<int32_t> bad_lens = lens;
  bad_lens[3] = static_cast<int32_t>(max_seq_len + 1);  // request 3: past max_seq_len
  bad_lens[4] = 1;                                      // request 4: 1 key for 2 causal queries
  const Tensor ws = workspace().to(gpu);
  const testing::Tolerance tol = testing::attention_tolerance(DType::kBFloat16);
  for (const bool tensor_cores : {true, false}) {
    std::optional<testing::ScopedEnv> env;
    if (!tensor_cores) env.emplace("FLASHINFER_MLA_TENSOR_CORES", "0");
    for (const int64_t H : {16, 128}) {
      SCOPED_TRACE(::testing::Message() << "tensor cores " << tensor_cores << ", heads " << H);
      const Tensor q =
          testing::rand_tensor({B, q_len, H, dc + dk}, DType::kBFloat16, 72, -1.0, 1.0);
      const Tensor want =
          trtllm_batch_decode_with_kv_cache_mla(q, l.kv, workspace(), 128, dc, dk, table, l.kv_lens,
                                                max_seq_len, 0, std::nullopt, 0.05, 1.25);
      const Tensor got = trtllm_batch_decode_with_kv_cache_mla(
          q.to(gpu), l.kv.to(gpu), ws, 128, dc, dk, int_tensor(bad_table).view({B, cols}).to(gpu),
          int_tensor(bad_lens).to(gpu), max_seq_len, 0, std::nullopt, 0.05, 1.25);
      const std::vector<double> o = got.to(Device::cpu()).to_double_vector();
      const std::vector<double> w = want.to_double_vector();
      const int64_t per_req = q_len * H * dc;
      for (int64_t b = 0; b < B; ++b) {
        const bool refused = b == 1 || b == 3 || b == 4;
        for (int64_t x = b * per_req; x < (b + 1) * per_req; ++x) {
          if (refused) {
            ASSERT_TRUE(std::isnan(o[x])) << "request " << b;
          } else {
            ASSERT_NEAR(o[x], w[x], tol.atol + tol.rtol * std::abs(w[x])) << "request " << b;
          }
        }
      }
      // Every request refused (empty ones too: 2 causal queries need 2 keys), so the longest
      // accepted length is 0 and every split of the grid is empty: all rows NaN, none read.
      const std::vector<int32_t> none{0, 0, static_cast<int32_t>(max_seq_len + 5), 0, 1};
      const Tensor got0 = trtllm_batch_decode_with_kv_cache_mla(
          q.to(gpu), l.kv.to(gpu), ws, 128, dc, dk, table.to(gpu), int_tensor(none).to(gpu),
          max_seq_len, 0, std::nullopt, 0.05, 1.25);
      for (double v : got0.to(Device::cpu()).to_double_vector()) ASSERT_TRUE(std::isnan(v));
    }
  }
}

// bmm1_scale / bmm2_scale as one-element tensors on the device stay there (the kernels read them,
// nothing is read back): the same bits as the numbers (sm_scale * 1 and out_scale * 1 are exact),
// on each MLA kernel; a bf16 0-dim scale is cast on the device.
TEST(MlaCuda, TrtllmDecodeTensorScalesMatchNumbersBitForBit) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const std::vector<int32_t> lens{90, 700, 33};
  const int64_t dc = 512, dk = 64, q_len = 1, max_seq_len = 1024;
  const auto B = static_cast<int64_t>(lens.size());
  Latent l = make_latent(lens, 16, dc, dk, DType::kBFloat16, 81);
  const Tensor table = l.block_tables.to(gpu);
  const Tensor lens_g = l.kv_lens.to(gpu), kv = l.kv.to(gpu), ws = workspace().to(gpu);
  const Tensor s1 = Tensor::full({1}, 0.0625, DType::kFloat32, gpu);
  const Tensor s2 = Tensor::full({}, 1.25, DType::kBFloat16, gpu);
  for (const bool tensor_cores : {true, false}) {
    std::optional<testing::ScopedEnv> env;
    if (!tensor_cores) env.emplace("FLASHINFER_MLA_TENSOR_CORES", "0");
    for (const int64_t H : {16, 128}) {
      SCOPED_TRACE(::testing::Message() << "tensor cores " << tensor_cores << ", heads " << H);
      const Tensor q =
          testing::rand_tensor({B, q_len, H, dc + dk}, DType::kBFloat16, 82, -1.0, 1.0).to(gpu);
      const Tensor want = trtllm_batch_decode_with_kv_cache_mla(
          q, kv, ws, 128, dc, dk, table, lens_g, max_seq_len, 0, std::nullopt, 0.0625, 1.25);
      const Tensor got = trtllm_batch_decode_with_kv_cache_mla(
          q, kv, ws, 128, dc, dk, table, lens_g, max_seq_len, 0, std::nullopt, s1, s2);
      EXPECT_EQ(got.to(Device::cpu()).to_double_vector(),
                want.to(Device::cpu()).to_double_vector());
    }
  }
}

#if FLASHINFER_TEST_HAVE_CUDART
// As engines run it: the trtllm MLA decode run once on a stream (the warm-up that makes its plan
// scratch), captured on it into a CUDA graph, then replayed after seq_lens and block_tables were
// rewritten in place (longer and shorter requests, other pages): the replay computes the new
// batch (what the captured grid does with lengths it has not seen, the chunk taken on the
// device).
TEST(MlaCuda, TrtllmDecodeCapturedReplaysNewLengths) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const int64_t dc = 512, dk = 64, H = 128, B = 3, max_seq_len = 4096;
  const std::vector<int32_t> first{100, 4000, 1}, second{3000, 7, 640};
  std::vector<int32_t> both = first;
  both.insert(both.end(), second.begin(), second.end());
  Latent l = make_latent(both, 64, dc, dk, DType::kBFloat16, 81);
  const Tensor q1 = testing::rand_tensor({B, 1, H, dc + dk}, DType::kBFloat16, 82, -1.0, 1.0);
  const Tensor q2 = testing::rand_tensor({B, 1, H, dc + dk}, DType::kBFloat16, 83, -1.0, 1.0);
  auto cpu = [&](const Tensor& q, int64_t row0, const std::vector<int32_t>& lens) {
    return trtllm_batch_decode_with_kv_cache_mla(
        q, l.kv, workspace(), 128, dc, dk, l.block_tables.slice(0, row0, row0 + B).contiguous(),
        int_tensor(lens), max_seq_len, 0, std::nullopt, 0.05, 1.0);
  };
  const Tensor want1 = cpu(q1, 0, first), want2 = cpu(q2, B, second);
  const Tensor kv = l.kv.to(gpu), ws = workspace().to(gpu);
  Tensor qg = q1.to(gpu);
  Tensor table_g = l.block_tables.slice(0, 0, B).contiguous().to(gpu);
  Tensor lens_g = int_tensor(first).to(gpu);
  Tensor out = Tensor::empty({B, 1, H, dc}, DType::kBFloat16, gpu);
  auto call = [&] {
    trtllm_batch_decode_with_kv_cache_mla(qg, kv, ws, 128, dc, dk, table_g, lens_g, max_seq_len, 0,
                                          out, 0.05, 1.0);
  };
  testing::ReplayableGraph graph;
  ASSERT_NO_FATAL_FAILURE(testing::warm_up_for_replay(graph, call));  // the stream's scratch
  out.copy_(Tensor::zeros({B, 1, H, dc}, DType::kBFloat16));  // nothing left from the warm-up
  ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, call));
  const testing::Tolerance tol = testing::attention_tolerance(DType::kBFloat16);
  ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
  EXPECT_TRUE(testing::all_close(out.to(Device::cpu()), want1, tol));
  qg.copy_(q2);
  table_g.copy_(l.block_tables.slice(0, B, 2 * B).contiguous());
  lens_g.copy_(int_tensor(second));
  ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
  EXPECT_TRUE(testing::all_close(out.to(Device::cpu()), want2, tol));
  cudaGraphExecDestroy(graph.exec);
  cudaGraphDestroy(graph.graph);
  cudaStreamDestroy(graph.stream);
}
#endif

// The cases of the tensor-core kernels' tests (fp16 / bf16 query, cache and output, DeepSeek's
// dims): 128 heads (two head groups), 80 (the second group a quarter full), 16 and 12 (idle row
// groups, a half-empty one), long caches (split-KV and the merge), tails of a tile, an empty
// request, causal chunks, ckv / kpe scales that differ (the two sums of q.k taken apart), and
// query rows packed into a block (32 heads or fewer: causal chunks of 4 rows of 16 heads, 2 of
// 32, 64 of one head, each row its own end).
struct MlaKernelCase {
  DType d;
  int64_t H, page_size;
  bool causal;
  std::vector<int32_t> qo_lens, kv_lens;
  double ckv_scale, kpe_scale;
  std::optional<DType> kv = std::nullopt;  // the cache's dtype: d unless given
};
std::vector<MlaKernelCase> mla_kernel_cases(bool fp8_caches) {
  std::vector<MlaKernelCase> cases = {
      {DType::kBFloat16, 128, 64, false, {1, 1, 1}, {4000, 33, 1}, 1.0, 1.0},
      {DType::kFloat16, 128, 16, true, {37, 1, 20}, {100, 50, 20}, 1.0, 1.0},
      {DType::kBFloat16, 80, 32, false, {1, 1, 1}, {700, 0, 95}, 0.75, 1.5},
      {DType::kBFloat16, 16, 1, false, {1, 2}, {5000, 3000}, 1.0, 1.0},
      {DType::kFloat16, 12, 8, true, {3, 1}, {31, 2047}, 1.25, 0.5},
      {DType::kBFloat16, 16, 16, true, {37, 1}, {100, 20}, 1.0, 1.0},
      {DType::kFloat16, 32, 8, true, {3, 3}, {700, 3}, 1.0, 1.0},
      {DType::kBFloat16, 1, 4, true, {70}, {300}, 0.5, 2.0},
  };
  if (fp8_caches) {  // e4m3 / e5m2 caches, widened to the query's type in shared memory
    cases.push_back(
        {DType::kBFloat16, 128, 64, false, {1, 1}, {3000, 100}, 0.75, 1.5, DType::kFloat8E4M3FN});
    cases.push_back(
        {DType::kFloat16, 64, 16, true, {5, 1}, {40, 900}, 1.0, 1.0, DType::kFloat8E5M2});
  }
  return cases;
}

// trtllm's fp8 calls (e4m3 query and cache, bf16 output): q_len 1 and 2 (MTP) at 128 heads, 4 at
// 16 heads (one block for the 4 draft rows), on `device` under the environment the caller set.
constexpr int64_t kTrtllmFp8Cases[][2] = {{1, 128}, {2, 128}, {4, 16}};  // q_len, heads
Tensor run_trtllm_fp8_case(int64_t q_len, int64_t heads, const Device& device) {
  const std::vector<int32_t> lens = {2000, 70, 4};  // a request holds at least its queries
  Latent l = make_latent(lens, 32, 512, 64, DType::kFloat8E4M3FN, 900 + q_len);
  Tensor q =
      testing::rand_tensor({3, q_len, heads, 576}, DType::kFloat8E4M3FN, 910 + q_len, -1.0, 1.0);
  return trtllm_batch_decode_with_kv_cache_mla(
             q.to(device), l.kv.to(device), workspace().to(device), 128, 512, 64,
             l.block_tables.to(device), l.kv_lens.to(device), 2000, 0, std::nullopt, 0.05, 1.25)
      .out.to(Device::cpu());
}

// BatchMLAPagedAttentionWrapper.run of case `c` (inputs seeded by `idx`) on `device`, under the
// environment the caller set (which kernel runs).
AttentionOutput run_mla_kernel_case(const MlaKernelCase& c, int idx, const Device& device) {
  const DType kv = c.kv.value_or(c.d);
  Latent l = make_latent(c.kv_lens, c.page_size, 512, 64, kv, 700 + idx);
  std::vector<int32_t> qo_indptr{0};
  for (int32_t n : c.qo_lens) qo_indptr.push_back(qo_indptr.back() + n);
  const int64_t rows = qo_indptr.back();
  Tensor q = testing::rand_tensor({rows, c.H, 576}, c.d, 800 + idx, -1.0, 1.0);
  const double sm_scale = 1.0 / std::sqrt(192.0);
  // The same layouts on both sides (a device copy of a strided view keeps its strides).
  const auto keep = [&](const Tensor& t) {
    return device.is_cpu() ? t : testing::to_keep_layout(t, device);
  };
  BatchMLAPagedAttentionWrapper w(workspace().to(device));
  w.plan(int_tensor(qo_indptr).to(device), l.kv_indptr.to(device), l.kv_indices.to(device),
         l.kv_lens.to(device), c.H, 512, 64, c.page_size, c.causal, sm_scale, c.d, kv);
  return w.run(keep(q.slice(2, 0, 512)), keep(q.slice(2, 512, 576)), keep(l.ckv), keep(l.kpe),
               std::nullopt, std::nullopt, true, std::nullopt, std::nullopt, std::nullopt, false,
               std::nullopt, MlaRunOptions{.ckv_scale = c.ckv_scale, .kpe_scale = c.kpe_scale});
}

// The tensor-core decode kernel (mla_decode_mma_kernel) against the CPU and against the CUDA-core
// kernels it replaced for these calls (FLASHINFER_MLA_TENSOR_CORES=0), which passed on the H200
// in session 31: mla_kernel_cases, e4m3 / e5m2 caches, and trtllm's fp8 queries.
TEST(MlaCuda, TensorCoreKernelMatchesCudaCoreKernelAndCpu) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  // The mma.sync kernel, whatever the run exported (the Hopper one has its own test below).
  testing::ScopedEnv no_sm90("FLASHINFER_MLA_SM90", nullptr);
  const std::vector<MlaKernelCase> cases = mla_kernel_cases(true);
  // The CUDA-core kernels for the calls made while it lives (what the run exported comes back).
  struct EnvGuard : testing::ScopedEnv {
    EnvGuard() : testing::ScopedEnv("FLASHINFER_MLA_TENSOR_CORES", "0") {}
  };
  int idx = 0;
  for (const MlaKernelCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << idx);
    const AttentionOutput want = run_mla_kernel_case(c, idx, Device::cpu());
    const AttentionOutput got = run_mla_kernel_case(c, idx, gpu);
    AttentionOutput old;
    {
      EnvGuard cuda_cores;
      old = run_mla_kernel_case(c, idx, gpu);
    }
    const testing::Tolerance tol = testing::attention_tolerance(c.d);
    Tensor got_out = got.out.to(Device::cpu()), old_out = old.out.to(Device::cpu());
    EXPECT_TRUE(testing::all_close(got_out, want.out, tol)) << "tensor cores against the CPU";
    EXPECT_TRUE(testing::all_close(got_out, old_out, tol)) << "against the CUDA-core kernel";
    EXPECT_TRUE(testing::all_close(got.lse.to(Device::cpu()), want.lse, {1e-4, 1e-4}));
    EXPECT_TRUE(
        testing::all_close(got.lse.to(Device::cpu()), old.lse.to(Device::cpu()), {1e-4, 1e-4}));
    ++idx;
  }
  // trtllm's fp8 calls: the query widened to bf16 as the kernel reads it.
  for (const auto& fc : kTrtllmFp8Cases) {
    SCOPED_TRACE(::testing::Message() << "fp8 query, q_len " << fc[0] << ", " << fc[1] << " heads");
    const Tensor want = run_trtllm_fp8_case(fc[0], fc[1], Device::cpu());
    const Tensor got = run_trtllm_fp8_case(fc[0], fc[1], gpu);
    Tensor old;
    {
      EnvGuard cuda_cores;
      old = run_trtllm_fp8_case(fc[0], fc[1], gpu);
    }
    const testing::Tolerance tol = testing::attention_tolerance(DType::kBFloat16);
    EXPECT_TRUE(testing::all_close(got, want, tol)) << "tensor cores against the CPU";
    EXPECT_TRUE(testing::all_close(got, old, tol)) << "against the CUDA-core kernel";
  }
}

#if FLASHINFER_TEST_HAVE_CUDART
// The Hopper kernel (FLASHINFER_MLA_SM90=1: mla_sm90_kernel, the tensor-core kernel's blocks on
// wgmma) against the CPU and against the tensor-core kernel, which passed on the H200 in session
// 64: mla_kernel_cases with the fp8 caches, and trtllm's fp8 calls. The launch counter says which
// kernel ran: the Hopper one on sm_90 in a build with CUTLASS's headers, the tensor-core one
// elsewhere.
TEST(MlaCuda, HopperKernelMatchesTensorCoreKernelAndCpu) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  // Tensor cores on, whatever the run exported (the Hopper kernel takes only their calls).
  testing::ScopedEnv tensor_cores("FLASHINFER_MLA_TENSOR_CORES", nullptr);
  const bool hopper = kernels::cuda::mla::mla_sm90_built() && api::compute_capability(gpu) == 90;
  int idx = 0;
  for (const MlaKernelCase& c : mla_kernel_cases(true)) {
    SCOPED_TRACE(::testing::Message() << "case " << idx);
    const AttentionOutput want = run_mla_kernel_case(c, idx, Device::cpu());
    AttentionOutput mma;
    {
      testing::ScopedEnv off("FLASHINFER_MLA_SM90", "0");  // whatever the run exported
      mma = run_mla_kernel_case(c, idx, gpu);
    }
    const long long before = kernels::cuda::mla::mla_sm90_launches();
    AttentionOutput got;
    {
      testing::ScopedEnv sm90("FLASHINFER_MLA_SM90", "1");
      got = run_mla_kernel_case(c, idx, gpu);
    }
    EXPECT_EQ(kernels::cuda::mla::mla_sm90_launches() > before, hopper)
        << "the Hopper kernel ran: " << !hopper;
    const testing::Tolerance tol = testing::attention_tolerance(c.d);
    const Tensor got_out = got.out.to(Device::cpu());
    EXPECT_TRUE(testing::all_close(got_out, want.out, tol)) << "Hopper kernel against the CPU";
    EXPECT_TRUE(testing::all_close(got_out, mma.out.to(Device::cpu()), tol))
        << "against the tensor-core kernel";
    EXPECT_TRUE(testing::all_close(got.lse.to(Device::cpu()), want.lse, {1e-4, 1e-4}));
    ++idx;
  }
  for (const auto& fc : kTrtllmFp8Cases) {
    SCOPED_TRACE(::testing::Message() << "fp8 query, q_len " << fc[0] << ", " << fc[1] << " heads");
    const Tensor want = run_trtllm_fp8_case(fc[0], fc[1], Device::cpu());
    Tensor mma;
    {
      testing::ScopedEnv off("FLASHINFER_MLA_SM90", "0");
      mma = run_trtllm_fp8_case(fc[0], fc[1], gpu);
    }
    const long long before = kernels::cuda::mla::mla_sm90_launches();
    Tensor got;
    {
      testing::ScopedEnv sm90("FLASHINFER_MLA_SM90", "1");
      got = run_trtllm_fp8_case(fc[0], fc[1], gpu);
    }
    EXPECT_EQ(kernels::cuda::mla::mla_sm90_launches() > before, hopper);
    const testing::Tolerance tol = testing::attention_tolerance(DType::kBFloat16);
    EXPECT_TRUE(testing::all_close(got, want, tol)) << "Hopper kernel against the CPU";
    EXPECT_TRUE(testing::all_close(got, mma, tol)) << "against the tensor-core kernel";
  }
  // Elsewhere the cases checked only that the switch leaves the tensor-core kernel in place.
  if (!hopper) GTEST_SKIP() << "no Hopper kernel here (an sm_90 device and a build with CUTLASS)";
}
#endif

// backend="fa3" on a GPU: sm90 runs it (the same attention as "fa2", on the same kernels); any
// other GPU refuses it by name, as upstream's sm90a-only build cannot run there.
TEST(MlaCuda, Fa3BackendRunsOnHopperOnly) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const Tensor ws = workspace().to(gpu);
  const auto make = [&](const std::string& backend) {
    return std::make_unique<BatchMLAPagedAttentionWrapper>(ws, false, std::nullopt, std::nullopt,
                                                           std::nullopt, std::nullopt, backend);
  };
  if (api::compute_capability(gpu) / 10 != 9) {
    EXPECT_FI_ERROR(make("fa3"), "BatchMLAPagedAttentionWrapper.__init__", "backend");
    return;
  }
  Latent l = make_latent({700, 40}, 16, 512, 64, DType::kBFloat16, 31);
  const Tensor q = testing::rand_tensor({2, 128, 576}, DType::kBFloat16, 32, -1.0, 1.0);
  const Tensor qn = testing::to_keep_layout(q.slice(2, 0, 512), gpu);
  const Tensor qp = testing::to_keep_layout(q.slice(2, 512, 576), gpu);
  const Tensor ckv = testing::to_keep_layout(l.ckv, gpu), kpe = testing::to_keep_layout(l.kpe, gpu);
  auto run_with = [&](const std::string& backend) {
    auto w = make(backend);
    w->plan(int_tensor({0, 1, 2}).to(gpu), l.kv_indptr.to(gpu), l.kv_indices.to(gpu),
            l.kv_lens.to(gpu), 128, 512, 64, 16, false, 0.07, DType::kBFloat16, DType::kBFloat16);
    return w->run(qn, qp, ckv, kpe).out.to(Device::cpu());
  };
  EXPECT_EQ(bytes_of(run_with("fa3")), bytes_of(run_with("fa2")));
}

// ---- upstream 0.7.4's plan and run forms --------------------------------------------------

// The flat dense plan, query= / kv_cache= as one tensor, a tuple or the dual value, and the
// bmm scale family: each the legacy call's result bit for bit.
TEST(BatchMLAPagedAttention, Upstream074FormsAreTheLegacyCallBitForBit) {
  const DType bf = DType::kBFloat16;
  Latent l = make_latent({6, 3, 9}, 4, 64, 16, bf, 21);
  const Tensor qo = int_tensor({0, 2, 3, 5});
  const Tensor q = testing::rand_tensor({5, 2, 80}, bf, 22, -1.0, 1.0);
  const Tensor qn = q.slice(2, 0, 64), qp = q.slice(2, 64, 80);
  BatchMLAPagedAttentionWrapper legacy(workspace());
  legacy.plan(qo, l.kv_indptr, l.kv_indices, l.kv_lens, 2, 64, 16, 4, true, 0.2, bf, bf);
  const AttentionOutput ref = legacy.run(qn, qp, l.ckv, l.kpe, std::nullopt, std::nullopt, true);
  // The dense form (block_tables padded with -1 past each request's pages).
  BatchMLAPagedAttentionWrapper w(workspace());
  w.plan(std::nullopt, std::nullopt, std::nullopt, std::nullopt, 2, 64, 16, 4, true, 0.2, bf, bf,
         false,
         MlaPlanOptions{.cum_seq_lens_q = qo,
                        .block_tables = l.block_tables,
                        .seq_lens = l.kv_lens,
                        .max_q_len = 2,
                        .lse_mode = "base2"});
  const auto with = [&](Value query, Value kv) {
    return w.run(std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                 true, std::nullopt, std::nullopt, std::nullopt, false, std::nullopt,
                 MlaRunOptions{.query = std::move(query), .kv_cache = std::move(kv)});
  };
  for (const auto& [query, kv] :
       {std::pair{Value(q), Value(l.kv)},
        {Value::tuple({Value(qn), Value(qp)}), Value::tuple({Value(l.ckv), Value(l.kpe)})},
        {Value::tuple({Value(q), Value::tuple({Value(qn), Value(qp)})}),
         Value::tuple({Value::tuple({Value(l.ckv), Value(l.kpe)}), Value(l.kv)})}}) {
    const AttentionOutput r = with(query, kv);
    EXPECT_EQ(bytes_of(r.out), bytes_of(ref.out));
    EXPECT_EQ(bytes_of(r.lse), bytes_of(ref.lse));
  }
  // The dense plan copied its page ids (upstream's fa2 / fa3 plan): ids written after plan are
  // not read.
  Tensor table = l.block_tables.clone();
  BatchMLAPagedAttentionWrapper wc(workspace());
  wc.plan(std::nullopt, std::nullopt, std::nullopt, std::nullopt, 2, 64, 16, 4, true, 0.2, bf, bf,
          false,
          MlaPlanOptions{.cum_seq_lens_q = qo, .block_tables = table, .seq_lens = l.kv_lens});
  table.fill_(0.0);
  EXPECT_EQ(bytes_of(wc.run(qn, qp, l.ckv, l.kpe).out), bytes_of(ref.out));
  testing::expect_error_text(
      [&] { wc.run(qn, qp, l.ckv, l.kpe, std::nullopt, std::nullopt, true); },
      "BatchMLAPagedAttentionWrapper.run", "return_lse",
      "MLA planned run argument LSE mode mismatch: planned 'none', got 'base2'");
  testing::expect_error_text(
      [&] {
        wc.run(qn, qp, l.ckv, l.kpe, Tensor::zeros({5, 2, 64}, DType::kFloat16));
      },
      "BatchMLAPagedAttentionWrapper.run", "out",
      "MLA planned run argument output dtype mismatch: planned torch.bfloat16, got "
      "torch.float16");
  // The legacy pairs on the dense plan; planned "base2", so the LSE must be asked for.
  EXPECT_EQ(bytes_of(w.run(qn, qp, l.ckv, l.kpe, std::nullopt, std::nullopt, true).out),
            bytes_of(ref.out));
  testing::expect_error_text(
      [&] { w.run(qn, qp, l.ckv, l.kpe); }, "BatchMLAPagedAttentionWrapper.run", "return_lse",
      "MLA planned run argument LSE mode mismatch: planned 'base2', got 'none'; re-plan with the "
      "needed arguments.");
  // bmm1_scale replaces sm_scale; bmm2_scale multiplies the output.
  BatchMLAPagedAttentionWrapper wb(workspace());
  wb.plan(qo, l.kv_indptr, l.kv_indices, l.kv_lens, 2, 64, 16, 4, true, 9.0, bf, bf, false,
          MlaPlanOptions{.scale_mode = "bmm-scalar"});
  const auto bmm = [&](double b1, double b2) {
    return wb.run(qn, qp, l.ckv, l.kpe, std::nullopt, std::nullopt, false, std::nullopt,
                  std::nullopt, std::nullopt, false, std::nullopt,
                  MlaRunOptions{.bmm1_scale = b1, .bmm2_scale = b2});
  };
  EXPECT_EQ(bytes_of(bmm(0.2, 1.0).out), bytes_of(ref.out));
  // bmm-tensor: one-element fp32 tensors, the same result.
  BatchMLAPagedAttentionWrapper wt(workspace());
  wt.plan(qo, l.kv_indptr, l.kv_indices, l.kv_lens, 2, 64, 16, 4, true, 9.0, bf, bf, false,
          MlaPlanOptions{.scale_mode = "bmm-tensor"});
  const auto f32 = [](double v) { return Tensor::full({1}, v, DType::kFloat32); };
  EXPECT_EQ(bytes_of(wt.run(qn, qp, l.ckv, l.kpe, std::nullopt, std::nullopt, false, std::nullopt,
                            std::nullopt, std::nullopt, false, std::nullopt,
                            MlaRunOptions{.bmm1_scale = f32(0.2), .bmm2_scale = f32(1.0)})
                         .out),
            bytes_of(ref.out));
  std::vector<double> half = ref.out.to_double_vector();
  for (double& x : half) x *= 0.5;
  EXPECT_TRUE(testing::all_close(bmm(0.2, 0.5).out, half, {1e-2, 1e-2}));
}

TEST(BatchMLAPagedAttention, Upstream074RefusalsWithItsTexts) {
  const DType bf = DType::kBFloat16;
  const char* plan_op = "BatchMLAPagedAttentionWrapper.plan";
  const char* run_op = "BatchMLAPagedAttentionWrapper.run";
  Latent l = make_latent({6, 3}, 4, 64, 16, bf, 23);
  const Tensor qo = int_tensor({0, 1, 2});
  testing::expect_error_text(
      [&] { BatchMLAPagedAttentionWrapper(workspace(), false, {}, {}, {}, {}, "flashmla"); },
      "BatchMLAPagedAttentionWrapper.__init__", "backend",
      "backend must be one of 'auto', 'autotune', 'cute-dsl', 'cute-dsl-modular', "
      "'cute-dsl-monolithic', 'cute-dsl-rubin-mtp', 'cutile', 'cutlass', 'fa2', 'fa3', "
      "'trtllm-gen', 'xqa', got 'flashmla'.");
  BatchMLAPagedAttentionWrapper w(workspace(), false, {}, {}, {}, {}, "trtllm-gen");
  const auto plan = [&](std::optional<Tensor> qo_arg, const MlaPlanOptions& o,
                        std::optional<int64_t> heads = 2) {
    w.plan(qo_arg, qo_arg ? std::optional<Tensor>(l.kv_indptr) : std::nullopt,
           qo_arg ? std::optional<Tensor>(l.kv_indices) : std::nullopt,
           qo_arg ? std::optional<Tensor>(l.kv_lens) : std::nullopt, heads, 64, 16, 4, false, 0.2,
           bf, bf, false, o);
  };
  testing::expect_error_text([&] { plan(qo, MlaPlanOptions{.metadata = Value("m")}); }, plan_op,
                             "metadata",
                             "Both metadata object and flat metadata arguments were provided");
  try {
    plan(std::nullopt, MlaPlanOptions{.metadata = Value("m")});
    ADD_FAILURE() << "a metadata object accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
  testing::expect_error_text([&] { plan(qo, MlaPlanOptions{.seq_lens = l.kv_lens}); }, plan_op,
                             "cum_seq_lens_q",
                             "flat CSR and dense metadata forms cannot be mixed.");
  testing::expect_error_text([&] { plan(std::nullopt, {}); }, plan_op, "qo_indptr",
                             "plan() requires metadata or flat metadata arguments.");
  testing::expect_error_text([&] { plan(qo, {}, std::nullopt); }, plan_op, "num_heads",
                             "plan() missing required arguments: num_heads");
  testing::expect_error_text([&] { plan(std::nullopt, MlaPlanOptions{.seq_lens = l.kv_lens}); },
                             plan_op, "cum_seq_lens_q",
                             "dense metadata form is partial; missing required fields: "
                             "cum_seq_lens_q, block_tables.");
  testing::expect_error_text([&] { plan(qo, MlaPlanOptions{.max_q_len = 1}); }, plan_op,
                             "cum_seq_lens_q",
                             "flat CSR and dense metadata forms cannot be mixed.");
  testing::expect_error_text([&] { plan(std::nullopt, MlaPlanOptions{.max_q_len = 1}); }, plan_op,
                             "max_q_len", "max_q_len metadata requires the complete dense");
  testing::expect_error_text([&] { plan(qo, MlaPlanOptions{.lse_mode = "base10"}); }, plan_op,
                             "lse_mode", "unsupported lse_mode 'base10'.");
  testing::expect_error_text(
      [&] {
        plan(std::nullopt,
             MlaPlanOptions{.cum_seq_lens_q = qo,
                            .block_tables = l.block_tables.slice(1, 0, 1).contiguous(),
                            .seq_lens = l.kv_lens});
      },
      plan_op, "block_tables",
      "block_tables metadata width is smaller than the live page count implied by seq_lens and "
      "page_size.");
  testing::expect_error_text(
      [&] {
        plan(std::nullopt, MlaPlanOptions{.cum_seq_lens_q = qo,
                                          .block_tables = l.block_tables,
                                          .seq_lens = l.kv_lens,
                                          .max_q_len = 0});
      },
      plan_op, "max_q_len", "max_q_len metadata must be at least 1, got 0.");
  for (const MlaPlanOptions& o :
       {MlaPlanOptions{.output_scale = "per-tensor"}, MlaPlanOptions{.skip_softmax = true},
        MlaPlanOptions{.use_sinks = true}}) {
    try {
      plan(qo, o);
      ADD_FAILURE() << "an unimplemented contract accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    }
  }
  // run: the inputs' forms and the planned contract.
  plan(qo, {});
  const Tensor qn = testing::rand_tensor({2, 2, 64}, bf, 24),
               qp = testing::rand_tensor({2, 2, 16}, bf, 25);
  const auto run = [&](std::optional<Tensor> a, std::optional<Tensor> b, const MlaRunOptions& o,
                       std::optional<double> o_scale = std::nullopt) {
    w.run(a, b, l.ckv, l.kpe, std::nullopt, std::nullopt, false, std::nullopt, std::nullopt,
          std::nullopt, false, o_scale, o);
  };
  testing::expect_error_text([&] { run(qn, std::nullopt, {}); }, run_op, "q_pe",
                             "q_nope and q_pe must both be provided.");
  testing::expect_error_text([&] { run(qn, qp, MlaRunOptions{.query = Value(qn)}); }, run_op,
                             "query", "pass either query= or q_nope/q_pe, not both.");
  testing::expect_error_text(
      [&] {
        run(std::nullopt, std::nullopt,
            MlaRunOptions{.query = Value::list({Value(qn), Value(qp)})});
      },
      run_op, "query", "query structural MLA input must be a tensor or exact 2-tuple.");
  testing::expect_error_text(
      [&] { run(std::nullopt, std::nullopt, MlaRunOptions{.query = Value(qn)}); }, run_op, "query",
      "packed query last dimension does not match planned split widths.");
  testing::expect_error_text([&] { run(qn, qp, {}, 2.0); }, run_op, "o_scale",
                             "MLA planned run argument o_scale mismatch: planned 'none', got "
                             "'per-tensor'");
  testing::expect_error_text([&] { run(qn, qp, MlaRunOptions{.bmm1_scale = 0.2}); }, run_op,
                             "bmm2_scale", "bmm1_scale and bmm2_scale must be provided together.");
  testing::expect_error_text(
      [&] { run(qn, qp, MlaRunOptions{.bmm1_scale = 0.2, .bmm2_scale = 1.0}); }, run_op,
      "bmm1_scale",
      "MLA planned run argument scale mode mismatch: planned 'default', "
      "got 'bmm-scalar'");
  // KV scales with a 16-bit cache: a dense plan refuses them (0.7.4's text); a flat CSR plan
  // takes them, as this wrapper always has.
  EXPECT_NO_THROW(run(qn, qp, MlaRunOptions{.kpe_scale = 1.0}));
  BatchMLAPagedAttentionWrapper wd(workspace());
  wd.plan(
      std::nullopt, std::nullopt, std::nullopt, std::nullopt, 2, 64, 16, 4, false, 0.2, bf, bf,
      false,
      MlaPlanOptions{.cum_seq_lens_q = qo, .block_tables = l.block_tables, .seq_lens = l.kv_lens});
  testing::expect_error_text(
      [&] {
        wd.run(qn, qp, l.ckv, l.kpe, std::nullopt, std::nullopt, false, std::nullopt, std::nullopt,
               std::nullopt, false, std::nullopt, MlaRunOptions{.kpe_scale = 1.0});
      },
      run_op, "kpe_scale",
      "ckv_scale / ckv_scale_arr / kpe_scale are only valid when kv_data_type is FP8.");
  testing::expect_error_text([&] { run(qn.slice(0, 0, 1), qp.slice(0, 0, 1), {}); }, run_op,
                             "q_nope", "q_nope rows and heads must match the planned query shape.");
  // A flat CSR plan of "none" takes an LSE request (upstream's compatibility path).
  EXPECT_TRUE(w.run(qn, qp, l.ckv, l.kpe, std::nullopt, std::nullopt, true).lse.defined());
}

TEST(BatchMLAPagedAttention, Upstream074FormsRecordAndReplay) {
  const DType bf = DType::kBFloat16;
  Latent l = make_latent({5, 3}, 2, 32, 8, bf, 26);
  std::vector<testing::RecordingObserver::Call> calls;
  std::unique_ptr<BatchMLAPagedAttentionWrapper> w;
  {
    testing::RecordingScope scope;
    w = std::make_unique<BatchMLAPagedAttentionWrapper>(workspace());
    w->plan(std::nullopt, std::nullopt, std::nullopt, std::nullopt, 2, 32, 8, 2, true, 0.15, bf, bf,
            false,
            MlaPlanOptions{.cum_seq_lens_q = int_tensor({0, 2, 3}),
                           .block_tables = l.block_tables,
                           .seq_lens = l.kv_lens});
    const Tensor q = testing::rand_tensor({3, 2, 40}, bf, 27);
    w->run(
        std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, false,
        std::nullopt, std::nullopt, std::nullopt, false, std::nullopt,
        MlaRunOptions{.query = Value::tuple({Value(q.slice(2, 0, 32)), Value(q.slice(2, 32, 40))}),
                      .kv_cache = Value(l.kv)});
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 3u);
  for (std::size_t i = 1; i < calls.size(); ++i) {
    SCOPED_TRACE(calls[i].name);
    EXPECT_TRUE(testing::replays_identically(calls[i]));
  }
}

// ---- record and replay --------------------------------------------------------------------

TEST(Mla, RecordAndReplay) {
  Latent l = make_latent({5, 3}, 2, 32, 8, DType::kBFloat16, 4);
  std::vector<testing::RecordingObserver::Call> calls;
  // The wrapper outlives the recording: replaying plan and run addresses the live object.
  std::unique_ptr<BatchMLAPagedAttentionWrapper> w;
  {
    testing::RecordingScope scope;
    Tensor k = Tensor::zeros({2, 3, 12}, DType::kBFloat16);
    concat_mla_k(k, testing::rand_tensor({2, 3, 8}, DType::kBFloat16, 1),
                 testing::rand_tensor({2, 1, 4}, DType::kBFloat16, 2));
    Tensor ckv = l.ckv.clone(), kpe = l.kpe.clone();
    append_paged_mla_kv_cache(testing::rand_tensor({2, 32}, DType::kBFloat16, 3),
                              testing::rand_tensor({2, 8}, DType::kBFloat16, 4), int_tensor({0, 1}),
                              int_tensor({4, 2}), ckv, kpe, l.kv_indices, l.kv_indptr,
                              int_tensor({1, 1}));
    w = std::make_unique<BatchMLAPagedAttentionWrapper>(workspace());
    w->plan(int_tensor({0, 2, 3}), l.kv_indptr, l.kv_indices, l.kv_lens, 2, 32, 8, 2, true, 0.15,
            DType::kBFloat16, DType::kBFloat16);
    Tensor out = Tensor::empty({3, 2, 32}, DType::kBFloat16);
    w->run(testing::rand_tensor({3, 2, 32}, DType::kBFloat16, 5),
           testing::rand_tensor({3, 2, 8}, DType::kBFloat16, 6), ckv, kpe, out, std::nullopt, true);
    Tensor q = testing::rand_tensor({2, 1, 2, 40}, DType::kBFloat16, 7);
    trtllm_batch_decode_with_kv_cache_mla(q, l.kv, workspace(), 128, 32, 8, l.block_tables,
                                          l.kv_lens, 6, 0, std::nullopt, 0.2);
    xqa_batch_decode_with_kv_cache_mla(q, l.kv, workspace(), 128, 32, 8, l.block_tables, l.kv_lens,
                                       6);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 7u);
  for (const auto& call : calls) {
    SCOPED_TRACE(call.name);
    if (call.name.ends_with("__init__")) continue;  // replay of the constructor: covered below
    EXPECT_TRUE(testing::replays_identically(call));
  }
  EXPECT_EQ(calls[2].name, "BatchMLAPagedAttentionWrapper.__init__");
  EXPECT_TRUE(calls[4].result.is_sequence());  // (out, lse) with return_lse
}

// Through the Flight Recorder's dump (upstream's format: metadata.jsonl, inputs.pt/outputs.pt,
// self_id for the wrapper) and replay_sequence, with the engines' keyword arguments (vLLM passes
// every trtllm MLA argument by keyword; SGLang passes run's out= by keyword).
TEST(Mla, DumpReplaysWithEveryCallPassing) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_mla_dump_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg, [](const std::string&) {});
  Latent l = make_latent({5, 3}, 2, 32, 8, DType::kBFloat16, 8);
  {
    Tensor k = Tensor::zeros({2, 3, 12}, DType::kBFloat16);
    concat_mla_k(k, testing::rand_tensor({2, 3, 8}, DType::kBFloat16, 1),
                 testing::rand_tensor({2, 1, 4}, DType::kBFloat16, 2));
    Tensor ckv = l.ckv.clone(), kpe = l.kpe.clone();
    append_paged_mla_kv_cache(testing::rand_tensor({1, 32}, DType::kBFloat16, 3),
                              testing::rand_tensor({1, 8}, DType::kBFloat16, 4), int_tensor({1}),
                              int_tensor({2}), ckv, kpe, l.kv_indices, l.kv_indptr,
                              int_tensor({1, 1}));
    BatchMLAPagedAttentionWrapper w(workspace());
    w.plan(int_tensor({0, 1, 2}), l.kv_indptr, l.kv_indices, l.kv_lens, 2, 32, 8, 2, false, 0.15,
           DType::kBFloat16, DType::kBFloat16);
    Tensor out =
        Tensor::zeros({2, 2, 32}, DType::kBFloat16);  // recorded as an input: defined bytes
    w.run(testing::rand_tensor({2, 2, 32}, DType::kBFloat16, 5),
          testing::rand_tensor({2, 2, 8}, DType::kBFloat16, 6), ckv, kpe, out);
    Tensor q = testing::rand_tensor({2, 1, 2, 40}, DType::kBFloat16, 7);
    trtllm_batch_decode_with_kv_cache_mla(q, l.kv.unsqueeze(1), workspace(), 128, 32, 8,
                                          l.block_tables, l.kv_lens, 6, 0, std::nullopt, 0.2, 1.0);
    xqa_batch_decode_with_kv_cache_mla(q, l.kv, workspace(), 128, 32, 8, l.block_tables, l.kv_lens,
                                       6);
    // An fp8 cache with ckv_scale_arr (SGLang's DSA call, NoPE): the array is a keyword input.
    ScaledLatent sl = make_scaled_latent({4, 2}, 1, 128, 0, 9);
    BatchMLAPagedAttentionWrapper w8(workspace());
    w8.plan(int_tensor({0, 1, 2}), sl.l.kv_indptr, sl.l.kv_indices, sl.l.kv_lens, 2, 128, 0, 1,
            false, 0.15, DType::kBFloat16, DType::kFloat8E4M3FN);
    const Tensor q8 = testing::rand_tensor({2, 2, 128}, DType::kBFloat16, 10);
    w8.run(q8, q8.slice(2, 128, 128), sl.l.ckv, sl.l.kpe, std::nullopt, std::nullopt, false,
           std::nullopt, std::nullopt, std::nullopt, false, std::nullopt,
           MlaRunOptions{.ckv_scale = 1.0, .ckv_scale_arr = sl.arr, .kpe_scale = 1.0});
  }
  recorder::stop();
  testing::replay_expecting_every_call_to_pass(dir, 10u);  // w8: __init__, plan, run
  fs::remove_all(dir);
}

// vLLM's SM90 sparse pattern recorded (use_cuda_graph with the constructor's buffers, plan with
// the buffer's stale ids, each step's ids written before run, one step without a new plan): the
// recorder adds the ids each run read (fi_ext__kv_indices_at_run), and the replay writes them
// where its wrapper reads them, so every call passes; without them the runs would recompute over
// plan's stale ids.
TEST(Mla, DumpOfIdsWrittenAfterPlanReplaysWithTheIdsRunRead) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("fi_mla_ids_dump_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Latent l = make_latent({5, 3}, 2, 32, 8, DType::kBFloat16, 9);
  const std::vector<int32_t> ids_a = ints_of(l.kv_indices);
  std::vector<int32_t> ids_b = ids_a;
  std::reverse(ids_b.begin(), ids_b.end());
  const auto n = static_cast<int64_t>(ids_a.size());
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg, [](const std::string&) {});
  {
    Tensor buf = Tensor::zeros({n + 2}, DType::kInt32);
    BatchMLAPagedAttentionWrapper w(workspace(), true, Tensor::zeros({3}, DType::kInt32),
                                    Tensor::zeros({3}, DType::kInt32), buf,
                                    Tensor::zeros({2}, DType::kInt32));
    w.plan(int_tensor({0, 1, 2}), l.kv_indptr, buf, l.kv_lens, 2, 32, 8, 2, false, 0.15,
           DType::kBFloat16, DType::kBFloat16);
    const Tensor qn = testing::rand_tensor({2, 2, 32}, DType::kBFloat16, 5);
    const Tensor qp = testing::rand_tensor({2, 2, 8}, DType::kBFloat16, 6);
    buf.slice(0, 0, n).copy_(int_tensor(ids_a));
    w.run(qn, qp, l.ckv, l.kpe);
    buf.slice(0, 0, n).copy_(int_tensor(ids_b));
    w.run(qn, qp, l.ckv, l.kpe);
  }
  recorder::stop();
  testing::replay_expecting_every_call_to_pass(dir, 4u);
  fs::remove_all(dir);
}

// A dump written by Python as upstream's recorder writes it, for the call vLLM makes (every
// argument by keyword, a 4-D cache, the fused bmm1 scale), the expected output computed by torch
// in fp32: it replays here and passes.
TEST(Mla, UpstreamWrittenTrtllmMlaDumpReplays) {
  // save() and record(): the shared writer (tests/util/upstream_dump_py.h).
  const std::string body = R"PY(
torch.manual_seed(0)
B, H, R, P, PS = 2, 4, 32, 8, 4
D = R + P
lens = [6, 3]
q = torch.randn(B, 1, H, D).to(torch.bfloat16)
kv = torch.randn(5, 1, PS, D).to(torch.bfloat16)
bt = torch.tensor([[3, 0], [4, -1]], dtype=torch.int32)
seq_lens = torch.tensor(lens, dtype=torch.int32)
ws = torch.zeros(256, dtype=torch.uint8)
scale = 0.125
out = torch.empty(B, 1, H, R)
for b in range(B):
    rows = torch.cat([kv[bt[b, j], 0].float() for j in range((lens[b] + PS - 1) // PS)])[: lens[b]]
    s = (q[b, 0].float() @ rows.T) * scale
    out[b, 0] = torch.softmax(s, -1) @ rows[:, :R]
record("trtllm_batch_decode_with_kv_cache_mla", "flashinfer.mla._core",
       {"kwarg_query": q, "kwarg_kv_cache": kv, "kwarg_workspace_buffer": ws,
        "kwarg_block_tables": bt, "kwarg_seq_lens": seq_lens},
       {"kwarg_qk_nope_head_dim": 128, "kwarg_kv_lora_rank": R, "kwarg_qk_rope_head_dim": P,
        "kwarg_max_seq_len": 8, "kwarg_bmm1_scale": scale, "kwarg_bmm2_scale": 1.0},
       out.to(torch.bfloat16))
)PY";
  if (!testing::run_upstream_dump_script("fi_mla_upstream", body, 1)) {
    GTEST_SKIP() << "python3-torch not installed";
  }
}

}  // namespace
}  // namespace flashinfer
