// Prefill attention: single_prefill_with_kv_cache and the paged / ragged batch prefill wrappers
// against a naive fp64 materialized softmax (causal right-aligned, window, soft cap, custom mask,
// fp8 KV, per-head scales), plus bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/attention_test_util.h"
#include "util/test_util.h"
#if FLASHINFER_TEST_HAVE_CUTLASS
#include "api/device_props.h"
#include "kernels/cuda/prefill_sm90.h"
#endif

namespace flashinfer {
namespace {

using testing::int_tensor;
using testing::RefOptions;

// 256 KiB: the plans here need at most 70720 bytes of partials (workspace_size()), so none falls
// back to an unsplit plan for want of space.
Tensor workspace() { return Tensor::zeros({1 << 18}, DType::kUInt8); }

// Deterministic pseudo-random mask with every ~3rd key dropped (row 1 fully masked).
bool mask_bit(int64_t i, int64_t j) { return i != 1 && ((i * 7 + j * 3) % 5) != 0; }

struct SingleCase {
  DType q, kv;
  int64_t qo, kv_len, hq, hkv, d;
  bool causal, hnd;
  double soft_cap;
  int64_t window;
  bool custom_mask;
};

class SinglePrefill : public ::testing::TestWithParam<SingleCase> {};

TEST_P(SinglePrefill, MatchesReference) {
  const SingleCase c = GetParam();
  Tensor q = Tensor::empty({c.qo, c.hq, c.d}, c.q).uniform_(1);
  Tensor k = Tensor::empty({c.kv_len, c.hkv, c.d}, c.kv).uniform_(2);
  Tensor v = Tensor::empty({c.kv_len, c.hkv, c.d}, c.kv).uniform_(3);
  const bool fp8 = dtype_is_fp8(c.kv);
  std::optional<Tensor> mask;
  if (c.custom_mask) {
    std::vector<double> bits;
    for (int64_t i = 0; i < c.qo; ++i)
      for (int64_t j = 0; j < c.kv_len; ++j) bits.push_back(mask_bit(i, j));
    mask = Tensor::from_vector(bits, {c.qo, c.kv_len}, DType::kBool);
  }
  std::optional<double> cap;
  if (c.soft_cap > 0) cap = c.soft_cap;
  // fp8: per-head scale_k and scalar v_scale.
  std::optional<Tensor> scale_k;
  std::vector<double> sk(static_cast<std::size_t>(c.hkv), 1.0);
  if (fp8) {
    for (int64_t g = 0; g < c.hkv; ++g) sk[g] = 0.5 + 0.25 * g;
    scale_k = Tensor::from_vector(sk, {c.hkv}, DType::kFloat32);
  }
  AttentionOutput r = single_prefill_with_kv_cache(
      q, c.hnd ? k.transpose(0, 1).contiguous() : k, c.hnd ? v.transpose(0, 1).contiguous() : v,
      std::nullopt, scale_k, std::nullopt, std::nullopt, mask, std::nullopt, c.causal,
      c.hnd ? "HND" : "NHD", "NONE", false, std::nullopt, c.window, cap, std::nullopt, std::nullopt,
      "auto", /*return_lse=*/true, std::nullopt, std::nullopt,
      fp8 ? std::optional<double>(1.5) : std::nullopt);
  ASSERT_EQ(r.out.shape(), (Shape{c.qo, c.hq, c.d}));
  ASSERT_EQ(r.lse.shape(), (Shape{c.qo, c.hq}));
  const auto qd = q.to_double_vector(), kd0 = k.to_double_vector(), vd = v.to_double_vector();
  // Per-kv-head k scale folds into k itself for the reference.
  std::vector<double> kd = kd0;
  for (int64_t j = 0; j < c.kv_len; ++j)
    for (int64_t g = 0; g < c.hkv; ++g)
      for (int64_t x = 0; x < c.d; ++x) kd[(j * c.hkv + g) * c.d + x] *= sk[g];
  RefOptions opt;
  opt.causal = c.causal;
  opt.soft_cap = c.soft_cap;
  opt.window_left = c.window;
  opt.v_scale = fp8 ? 1.5 : 1.0;
  if (c.custom_mask) opt.mask = mask_bit;
  std::vector<double> eo, el;
  testing::ref_attention(qd, kd, vd, c.qo, c.kv_len, c.hq, c.hkv, c.d, c.d, opt, eo, el);
  EXPECT_TRUE(testing::all_close(r.out, eo, testing::attention_tolerance(c.q)));
  EXPECT_TRUE(testing::all_close(r.lse, el, {1e-4, 1e-5}));
}

INSTANTIATE_TEST_SUITE_P(
    Grid, SinglePrefill,
    ::testing::Values(
        // Causal with kv_len > qo_len (right-aligned), GQA 4.
        SingleCase{DType::kFloat32, DType::kFloat32, 9, 40, 8, 2, 64, true, false, 0, -1, false},
        // Non-causal, HND, fp16, D 128.
        SingleCase{DType::kFloat16, DType::kFloat16, 5, 17, 4, 4, 128, false, true, 0, -1, false},
        // Causal + sliding window + soft cap, bf16, D 256, MQA.
        SingleCase{DType::kBFloat16, DType::kBFloat16, 12, 30, 4, 1, 256, true, false, 20.0, 4,
                   false},
        // Custom mask (one row fully masked: zeros, LSE -inf).
        SingleCase{DType::kFloat32, DType::kFloat32, 6, 23, 2, 1, 64, false, false, 0, -1, true},
        // fp8 e4m3 KV with per-head k scale and v_scale, causal, qo == kv.
        SingleCase{DType::kFloat16, DType::kFloat8E4M3FN, 16, 16, 4, 2, 64, true, false, 0, -1,
                   false},
        // Head dims outside CUDA's AOT set (JIT-compiled there, docs/JIT.md): 96 and 80.
        SingleCase{DType::kBFloat16, DType::kBFloat16, 7, 25, 4, 2, 96, true, false, 0, -1, false},
        SingleCase{DType::kFloat16, DType::kFloat16, 5, 19, 2, 2, 80, false, true, 0, 6, false}));

// The ragged run's scales as upstream 0.7.4 applies them: with 16-bit K/V, q_scale, k_scale and
// v_scale have no effect; with fp8 K/V under a 16-bit q, k_scale and v_scale do (as the plain
// run with the K/V values scaled would) and q_scale still not.
TEST(BatchPrefillWrappers, RaggedRunScalesAsUpstream) {
  const std::vector<int32_t> qo{0, 3, 7}, kv{0, 5, 12};
  const int64_t hq = 2, hkv = 1, d = 64;
  Tensor q = Tensor::empty({7, hq, d}, DType::kFloat16).uniform_(21);
  Tensor k = Tensor::empty({12, hkv, d}, DType::kFloat16).uniform_(22);
  Tensor v = Tensor::empty({12, hkv, d}, DType::kFloat16).uniform_(23);
  for (DType kvt : {DType::kFloat16, DType::kFloat8E4M3FN}) {
    PrefillPlanOptions po;
    po.q_data_type = DType::kFloat16;
    po.kv_data_type = kvt;
    BatchPrefillWithRaggedKVCacheWrapper w(workspace());
    w.plan(int_tensor(qo), int_tensor(kv), hq, hkv, d, po);
    const Tensor kk = k.to(kvt), vv = v.to(kvt);
    const Tensor plain = w.run(q, kk, vv).out;
    AttentionRunOptions ro;
    ro.q_scale = 2.0;
    ro.k_scale = 0.5;
    ro.v_scale = 4.0;
    const Tensor scaled = w.run(q, kk, vv, ro).out;
    if (kvt == DType::kFloat16) {
      EXPECT_TRUE(testing::all_close(scaled, plain.to_double_vector(), {0.0, 0.0}));
    } else {
      AttentionRunOptions kv_only;
      kv_only.k_scale = 0.5;
      kv_only.v_scale = 4.0;
      EXPECT_TRUE(
          testing::all_close(scaled, w.run(q, kk, vv, kv_only).out.to_double_vector(), {0.0, 0.0}));
      EXPECT_FALSE(testing::all_close(scaled, plain.to_double_vector(), {1e-3, 1e-3}));
    }
  }
}

// Upstream 0.7.4's run(lse_base=, lse_layout=): "ln" is each base-2 value times fp32 ln 2 in one
// rounding (0x3F317218, as upstream's lse.mul_(ln2) after the kernel), "HN" the same values in a
// contiguous [heads, rows] tensor (the caller's, which must be that, or a new one); the output
// is unchanged. Both checked even without an LSE.
void expect_lse_base_and_layout(Device dev) {
  const std::vector<int32_t> qo{0, 3, 7}, kv{0, 5, 12};
  const int64_t hq = 4, hkv = 2, d = 64, n = 7;
  const Tensor q = Tensor::empty({n, hq, d}, DType::kFloat16).uniform_(31).to(dev);
  const Tensor k = Tensor::empty({12, hkv, d}, DType::kFloat16).uniform_(32).to(dev);
  const Tensor v = Tensor::empty({12, hkv, d}, DType::kFloat16).uniform_(33).to(dev);
  PrefillPlanOptions po;
  po.causal = true;
  const Tensor ws = dev.is_cuda() ? Tensor::zeros({8 << 20}, DType::kUInt8, dev) : workspace();
  BatchPrefillWithRaggedKVCacheWrapper w(ws);
  w.plan(int_tensor(qo), int_tensor(kv), hq, hkv, d, po);
  AttentionRunOptions ro;
  ro.return_lse = true;
  const AttentionOutput base2 = w.run(q, k, v, ro);
  const std::vector<double> l2 = base2.lse.to(Device::cpu()).to_double_vector();
  std::vector<float> ln_want(l2.size());
  for (std::size_t i = 0; i < l2.size(); ++i) {
    ln_want[i] = static_cast<float>(l2[i]) * 0.693147182464599609375f;
  }
  ro.lse_base = "ln";
  const AttentionOutput ln = w.run(q, k, v, ro);
  ASSERT_EQ(ln.lse.shape(), (Shape{n, hq}));
  const std::vector<double> got_ln = ln.lse.to(Device::cpu()).to_double_vector();
  for (std::size_t i = 0; i < l2.size(); ++i) {
    EXPECT_EQ(static_cast<float>(got_ln[i]), ln_want[i]) << i;
  }
  EXPECT_TRUE(
      testing::all_close(ln.out, base2.out.to(Device::cpu()).to_double_vector(), {0.0, 0.0}));
  // HN: a new [heads, rows] tensor, or the caller's, filled in place.
  ro.lse_layout = "HN";
  const AttentionOutput hn = w.run(q, k, v, ro);
  ASSERT_EQ(hn.lse.shape(), (Shape{hq, n}));
  EXPECT_TRUE(hn.lse.is_contiguous());
  Tensor mine = Tensor::full({hq, n}, 7.0, DType::kFloat32, dev);
  ro.lse = mine;
  const AttentionOutput into = w.run(q, k, v, ro);
  EXPECT_EQ(into.lse.data_ptr(), mine.data_ptr());
  for (const Tensor* t : std::vector<const Tensor*>{&hn.lse, &mine}) {
    const std::vector<double> h = t->to(Device::cpu()).to_double_vector();
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t x = 0; x < hq; ++x) {
        EXPECT_EQ(static_cast<float>(h[x * n + r]), ln_want[r * hq + x]) << r << " " << x;
      }
    }
  }
  // A caller's lse in the other layout, or strided, is refused; so are unknown names.
  ro.lse = Tensor::empty({n, hq}, DType::kFloat32, dev);
  EXPECT_FI_ERROR(w.run(q, k, v, ro), "BatchPrefillWithRaggedKVCacheWrapper.run", "lse");
  ro.lse = Tensor::empty({n, hq}, DType::kFloat32, dev).transpose(0, 1);
  EXPECT_FI_ERROR(w.run(q, k, v, ro), "BatchPrefillWithRaggedKVCacheWrapper.run", "lse");
  AttentionRunOptions bad;
  bad.lse_base = "e";
  EXPECT_FI_ERROR(w.run(q, k, v, bad), "BatchPrefillWithRaggedKVCacheWrapper.run", "lse_base");
  bad.lse_base = "log2";
  bad.lse_layout = "HND";
  EXPECT_FI_ERROR(w.run(q, k, v, bad), "BatchPrefillWithRaggedKVCacheWrapper.run", "lse_layout");
}

TEST(BatchPrefillWrappers, LseBaseAndLayoutAsUpstream) {
  expect_lse_base_and_layout(Device::cpu());
}

// Upstream 0.7.4's plan and __init__ additions: the ragged plan reads its host mirrors of the
// indptrs (checked as upstream checks them); uniform_q_len changes nothing; max_total_num_rows is
// the graph capacity of query rows (use_cuda_graph only, checked at each plan);
// variant_owns_mask and use_token_head_sf are refused.
TEST(BatchPrefillWrappers, ReleaseAdditionsToPlanAndInit) {
  const std::vector<int32_t> qo{0, 3, 7}, kv{0, 5, 12};
  const int64_t hq = 2, hkv = 1, d = 64;
  const Tensor q = Tensor::empty({7, hq, d}, DType::kFloat16).uniform_(41);
  const Tensor k = Tensor::empty({12, hkv, d}, DType::kFloat16).uniform_(42);
  const Tensor v = Tensor::empty({12, hkv, d}, DType::kFloat16).uniform_(43);
  const char* plan_op = "BatchPrefillWithRaggedKVCacheWrapper.plan";
  BatchPrefillWithRaggedKVCacheWrapper w(workspace());
  PrefillPlanOptions po;
  po.causal = true;
  w.plan(int_tensor(qo), int_tensor(kv), hq, hkv, d, po);
  const Tensor want = w.run(q, k, v).out;
  // The plan follows the mirrors: here the device-side indptrs are stale copies.
  PrefillPlanOptions mirrored = po;
  mirrored.qo_indptr_cpu = int_tensor(qo);
  mirrored.kv_indptr_cpu = int_tensor(kv);
  mirrored.uniform_q_len = 4;
  w.plan(int_tensor({0, 1, 7}), int_tensor({0, 6, 12}), hq, hkv, d, mirrored);
  EXPECT_TRUE(testing::all_close(w.run(q, k, v).out, want.to_double_vector(), {0.0, 0.0}));
  PrefillPlanOptions bad = mirrored;
  bad.qo_indptr_cpu = int_tensor({0, 3});
  EXPECT_FI_ERROR(w.plan(int_tensor(qo), int_tensor(kv), hq, hkv, d, bad), plan_op,
                  "qo_indptr_cpu");
  bad = mirrored;
  bad.kv_indptr_cpu = int_tensor(kv).to(DType::kInt64);
  EXPECT_FI_ERROR(w.plan(int_tensor(qo), int_tensor(kv), hq, hkv, d, bad), plan_op,
                  "kv_indptr_cpu");
  bad = po;
  bad.use_token_head_sf = true;
  EXPECT_FI_ERROR(w.plan(int_tensor(qo), int_tensor(kv), hq, hkv, d, bad), plan_op,
                  "use_token_head_sf");

  const char* init_op = "BatchPrefillWithPagedKVCacheWrapper.__init__";
  EXPECT_FI_ERROR(
      BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD", false, std::nullopt, std::nullopt,
                                          std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                          "auto", std::nullopt, std::nullopt, false, 64),
      init_op, "max_total_num_rows");
  EXPECT_FI_ERROR(
      BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD", true, std::nullopt, std::nullopt,
                                          std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                          "auto", std::nullopt, std::nullopt, false, -1),
      init_op, "max_total_num_rows");
  EXPECT_FI_ERROR(
      BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD", false, std::nullopt, std::nullopt,
                                          std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                          "auto", std::nullopt, std::nullopt, true),
      init_op, "variant_owns_mask");
  EXPECT_FI_ERROR(BatchPrefillWithRaggedKVCacheWrapper(workspace(), "NHD", false, std::nullopt,
                                                       std::nullopt, std::nullopt, std::nullopt,
                                                       "auto", std::nullopt, std::nullopt, true),
                  "BatchPrefillWithRaggedKVCacheWrapper.__init__", "variant_owns_mask");
  // A capacity of 6 rows: a plan of 7 is refused, one of 6 runs.
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged({5, 9}, 4, hkv, d, DType::kFloat16, false, false, 1, kd, vd);
  BatchPrefillWithPagedKVCacheWrapper g(workspace(), "NHD", true, std::nullopt, std::nullopt,
                                        std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                        "auto", std::nullopt, std::nullopt, false, 6);
  EXPECT_FI_ERROR(
      g.plan(int_tensor({0, 3, 7}), f.indptr, f.indices, f.last_page_len, hq, hkv, d, 4, po),
      "BatchPrefillWithPagedKVCacheWrapper.plan", "qo_indptr");
  g.plan(int_tensor({0, 3, 6}), f.indptr, f.indices, f.last_page_len, hq, hkv, d, 4, po);
  EXPECT_EQ(g.run(q.slice(0, 0, 6), f.cache()).out.size(0), 6);
}

// Ragged prefill with different qk and vo head dims (DeepSeek's 192/128) against the fp64
// formula, request by request.
TEST(BatchPrefillWrappers, RaggedQk192Vo128MatchesReference) {
  const std::vector<int32_t> qo{0, 3, 10}, kv{0, 9, 21};
  const int64_t hq = 4, hkv = 2, dqk = 192, dvo = 128;
  Tensor q = Tensor::empty({10, hq, dqk}, DType::kBFloat16).uniform_(11);
  Tensor k = Tensor::empty({21, hkv, dqk}, DType::kBFloat16).uniform_(12);
  Tensor v = Tensor::empty({21, hkv, dvo}, DType::kBFloat16).uniform_(13);
  PrefillPlanOptions po;
  po.q_data_type = DType::kBFloat16;
  po.head_dim_vo = dvo;
  po.causal = true;
  BatchPrefillWithRaggedKVCacheWrapper w(workspace());
  w.plan(int_tensor(qo), int_tensor(kv), hq, hkv, dqk, po);
  AttentionRunOptions ro;
  ro.return_lse = true;
  AttentionOutput r = w.run(q, k, v, ro);
  ASSERT_EQ(r.out.shape(), (Shape{10, hq, dvo}));
  for (int b = 0; b < 2; ++b) {
    const int64_t nq = qo[b + 1] - qo[b], nk = kv[b + 1] - kv[b];
    const auto qd = q.slice(0, qo[b], qo[b + 1]).to_double_vector();
    const auto kd = k.slice(0, kv[b], kv[b + 1]).to_double_vector();
    const auto vd = v.slice(0, kv[b], kv[b + 1]).to_double_vector();
    RefOptions opt;
    opt.causal = true;
    std::vector<double> eo, el;
    testing::ref_attention(qd, kd, vd, nq, nk, hq, hkv, dqk, dvo, opt, eo, el);
    EXPECT_TRUE(testing::all_close(r.out.slice(0, qo[b], qo[b + 1]), eo,
                                   testing::attention_tolerance(DType::kBFloat16)));
    EXPECT_TRUE(testing::all_close(r.lse.slice(0, qo[b], qo[b + 1]), el, {1e-4, 1e-5}));
  }
}

TEST(SinglePrefill, PackedMaskEqualsBoolMask) {
  const int64_t qo = 5, kv = 13;
  Tensor q = Tensor::empty({qo, 2, 64}, DType::kFloat32).uniform_(1);
  Tensor k = Tensor::empty({kv, 1, 64}, DType::kFloat32).uniform_(2);
  std::vector<double> bits;
  std::vector<double> packed((qo * kv + 7) / 8, 0.0);
  for (int64_t i = 0; i < qo; ++i) {
    for (int64_t j = 0; j < kv; ++j) {
      const bool b = mask_bit(i, j);
      bits.push_back(b);
      const int64_t n = i * kv + j;
      if (b) packed[n / 8] += double(1 << (n % 8));  // little-endian bit order
    }
  }
  Tensor m = Tensor::from_vector(bits, {qo, kv}, DType::kBool);
  Tensor pm = Tensor::from_vector(packed, {static_cast<int64_t>(packed.size())}, DType::kUInt8);
  Tensor a = single_prefill_with_kv_cache(q, k, k, {}, {}, {}, {}, m);
  Tensor b = single_prefill_with_kv_cache(q, k, k, {}, {}, {}, {}, {}, pm);
  EXPECT_TRUE(testing::all_close(a, b, {0, 0}));
}

struct BatchCase {
  DType dtype;
  int64_t hq, hkv, d, page_size;
  std::vector<int32_t> qo_lens, kv_lens;
  bool causal, hnd, pair;
  std::optional<int64_t> fixed_split;
  double soft_cap;
  int64_t window;
  bool custom_mask;
};

// Reference per request; q rows at qo_indptr.
void expect_batch(const BatchCase& c, const Tensor& q, const AttentionOutput& r,
                  const std::vector<std::vector<double>>& kd,
                  const std::vector<std::vector<double>>& vd) {
  const auto qd = q.to_double_vector();
  int64_t r0 = 0;
  for (std::size_t b = 0; b < c.qo_lens.size(); ++b) {
    const int64_t r1 = r0 + c.qo_lens[b];
    RefOptions opt;
    opt.causal = c.causal;
    opt.soft_cap = c.soft_cap;
    opt.window_left = c.window;
    if (c.custom_mask) opt.mask = mask_bit;
    std::vector<double> eo, el;
    testing::ref_attention(testing::rows_of(qd, r0, r1, c.hq * c.d), kd[b], vd[b], c.qo_lens[b],
                           c.kv_lens[b], c.hq, c.hkv, c.d, c.d, opt, eo, el);
    EXPECT_TRUE(
        testing::all_close(r.out.slice(0, r0, r1), eo, testing::attention_tolerance(c.dtype)))
        << "request " << b;
    EXPECT_TRUE(testing::all_close(r.lse.slice(0, r0, r1), el, {1e-4, 1e-5})) << "request " << b;
    r0 = r1;
  }
}

PrefillPlanOptions plan_options(const BatchCase& c, std::optional<Tensor> mask) {
  PrefillPlanOptions o;
  o.causal = c.causal;
  o.q_data_type = c.dtype;
  o.fixed_split_size = c.fixed_split;
  if (c.soft_cap > 0) o.logits_soft_cap = c.soft_cap;
  o.window_left = c.window;
  o.custom_mask = std::move(mask);
  return o;
}

std::optional<Tensor> batch_mask(const BatchCase& c) {
  if (!c.custom_mask) return std::nullopt;
  std::vector<double> bits;
  for (std::size_t b = 0; b < c.qo_lens.size(); ++b)
    for (int64_t i = 0; i < c.qo_lens[b]; ++i)
      for (int64_t j = 0; j < c.kv_lens[b]; ++j) bits.push_back(mask_bit(i, j));
  return Tensor::from_vector(bits, {static_cast<int64_t>(bits.size())}, DType::kBool);
}

std::vector<int32_t> indptr_of(const std::vector<int32_t>& lens) {
  std::vector<int32_t> p{0};
  for (int32_t x : lens) p.push_back(p.back() + x);
  return p;
}

class BatchPrefillPaged : public ::testing::TestWithParam<BatchCase> {};

TEST_P(BatchPrefillPaged, MatchesReference) {
  const BatchCase c = GetParam();
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged(c.kv_lens, c.page_size, c.hkv, c.d, c.dtype, c.hnd, c.pair, 21, kd, vd);
  const std::vector<int32_t> qo_indptr = indptr_of(c.qo_lens);
  BatchPrefillWithPagedKVCacheWrapper w(workspace(), c.hnd ? "HND" : "NHD");
  w.plan(int_tensor(qo_indptr), f.indptr, f.indices, f.last_page_len, c.hq, c.hkv, c.d, c.page_size,
         plan_options(c, batch_mask(c)));
  if (c.fixed_split) {
    EXPECT_TRUE(w.split_kv());
  }
  Tensor q = Tensor::empty({qo_indptr.back(), c.hq, c.d}, c.dtype).uniform_(4);
  AttentionRunOptions ro;
  ro.return_lse = true;
  expect_batch(c, q, w.run(q, f.cache(), ro), kd, vd);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, BatchPrefillPaged,
    ::testing::Values(
        // Causal append (kv_len > qo_len), unequal lengths, GQA 4, forced split of 2 pages.
        BatchCase{DType::kFloat32,
                  8,
                  2,
                  64,
                  4,
                  {3, 1, 7},
                  {9, 1, 30},
                  true,
                  false,
                  false,
                  2,
                  0,
                  -1,
                  false},
        // HND pair cache, fp16, D 128, GQA 8, window + soft cap, no split.
        BatchCase{DType::kFloat16,
                  8,
                  1,
                  128,
                  16,
                  {5, 16},
                  {21, 16},
                  true,
                  true,
                  true,
                  {},
                  10.0,
                  6,
                  false},
        // Custom masks per request, bf16, split every page.
        BatchCase{
            DType::kBFloat16, 2, 2, 64, 8, {4, 3}, {11, 17}, false, false, false, 1, 0, -1, true}));

// Page size 1 without the page axis (upstream's _unpack_paged_kv_cache: SGLang's extend calls pass
// its 3-D K/V pools), NHD and HND: bit for bit the 5-D cache's output.
TEST(BatchPrefillWrappers, PageSizeOneCachesWithoutThePageAxis) {
  const int64_t hq = 4, hkv = 2, d = 64;
  for (bool hnd : {false, true}) {
    SCOPED_TRACE(hnd ? "HND" : "NHD");
    std::vector<std::vector<double>> kd, vd;
    testing::PagedFixture f =
        testing::make_paged({9, 4}, 1, hkv, d, DType::kFloat32, hnd, false, 8, kd, vd);
    const std::vector<int32_t> qo_indptr{0, 3, 7};
    BatchPrefillWithPagedKVCacheWrapper w(workspace(), hnd ? "HND" : "NHD");
    PrefillPlanOptions po;
    po.causal = true;
    po.q_data_type = DType::kFloat32;
    w.plan(int_tensor(qo_indptr), f.indptr, f.indices, f.last_page_len, hq, hkv, d, 1, po);
    const Tensor q = Tensor::empty({7, hq, d}, DType::kFloat32).uniform_(9);
    const std::vector<double> want = w.run(q, f.cache()).out.to_double_vector();
    const int64_t page_axis = hnd ? 3 : 2;  // of the 5-D cache
    const Tensor k3 = f.cache5.select(1, 0).squeeze(page_axis - 1);
    const Tensor v3 = f.cache5.select(1, 1).squeeze(page_axis - 1);
    EXPECT_EQ(w.run(q, PagedKVCache(k3, v3)).out.to_double_vector(), want);
    EXPECT_EQ(w.run(q, PagedKVCache(f.cache5.squeeze(page_axis))).out.to_double_vector(), want);
  }
}

class BatchPrefillRagged : public ::testing::TestWithParam<BatchCase> {};

TEST_P(BatchPrefillRagged, MatchesReference) {
  const BatchCase c = GetParam();
  const std::vector<int32_t> qo_indptr = indptr_of(c.qo_lens), kv_indptr = indptr_of(c.kv_lens);
  const int64_t nkv = kv_indptr.back();
  // HND ragged K/V: [Hkv, tokens, D]; strided (every other token of a bigger tensor).
  Tensor kbig = Tensor::empty({2 * nkv, c.hkv, c.d}, c.dtype).uniform_(5);
  Tensor k = kbig.slice(0, 0, 2 * nkv, 2);
  Tensor v = Tensor::empty({nkv, c.hkv, c.d}, c.dtype).uniform_(6);
  std::vector<std::vector<double>> kd, vd;
  const auto ka = k.to_double_vector(), va = v.to_double_vector();
  for (std::size_t b = 0; b < c.kv_lens.size(); ++b) {
    kd.push_back(testing::rows_of(ka, kv_indptr[b], kv_indptr[b + 1], c.hkv * c.d));
    vd.push_back(testing::rows_of(va, kv_indptr[b], kv_indptr[b + 1], c.hkv * c.d));
  }
  BatchPrefillWithRaggedKVCacheWrapper w(workspace(), c.hnd ? "HND" : "NHD");
  w.plan(int_tensor(qo_indptr), int_tensor(kv_indptr), c.hq, c.hkv, c.d,
         plan_options(c, batch_mask(c)));
  if (c.fixed_split) {
    EXPECT_TRUE(w.split_kv());
  }
  Tensor q = Tensor::empty({qo_indptr.back(), c.hq, c.d}, c.dtype).uniform_(7);
  AttentionRunOptions ro;
  ro.return_lse = true;
  const Tensor kk = c.hnd ? k.transpose(0, 1) : k, vv = c.hnd ? v.transpose(0, 1) : v;
  expect_batch(c, q, w.run(q, kk, vv, ro), kd, vd);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, BatchPrefillRagged,
    ::testing::Values(
        // Causal first-chunk prefill (qo == kv) and an append, split in 5-token chunks.
        BatchCase{
            DType::kFloat32, 4, 1, 64, 1, {12, 3}, {12, 20}, true, false, false, 5, 0, -1, false},
        // HND, fp16, D 256, window, GQA 1, auto split.
        BatchCase{
            DType::kFloat16, 2, 2, 256, 1, {6, 1}, {6, 40}, true, true, false, {}, 0, 3, false},
        // Custom mask, bf16.
        BatchCase{
            DType::kBFloat16, 4, 2, 128, 1, {2, 5}, {7, 5}, false, false, false, {}, 0, -1, true}));

// ---- multi-item scoring (SGLang's scoring API; upstream's MULTIITEMSCORING mask mode) ----

// Each request: a prefix (the query), then items each after a delimiter, and a last delimiter;
// token_pos_in_items gives each token past the prefix its position in its item (1, 2, ...; 0 for a
// delimiter), as upstream's plan docstring draws it: items of 3, 2, 4 tokens are
// [0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 0].
std::vector<int> item_positions(const std::vector<int>& item_lens) {
  std::vector<int> pos{0};
  for (int n : item_lens) {
    for (int t = 1; t <= n; ++t) pos.push_back(t);
    pos.push_back(0);
  }
  return pos;
}

// Whether the query at position q (of the request's kv tokens) sees key j: written from
// upstream's description of the mask (FA2's logits_mask_multi_item_scoring) apart from the
// library's mask builder. Causal (and a sliding window); past the prefix, only the prefix and the
// query's own item up to itself: the t keys (q - t, q] (none for a delimiter).
bool multi_item_sees(int64_t q, int64_t j, int64_t prefix, const std::vector<int>& pos,
                     int64_t window) {
  if (j > q || (window >= 0 && j < q - window)) return false;
  if (q < prefix || j < prefix) return true;
  return j > q - pos[static_cast<std::size_t>(q - prefix)];
}

struct MultiItemBatch {
  std::vector<int32_t> qo_lens, kv_lens, prefix;
  std::vector<std::vector<int>> pos;  // each padded to len with zeros
  int64_t len = 0;
  // The plan's four arguments as upstream's dtypes arrive here: uint32 prefix lengths as int32
  // bits, uint16 positions and maxima as int16 bits.
  void set(PrefillPlanOptions& o) const {
    std::vector<double> flat, mx;
    for (const auto& p : pos) {
      for (int64_t i = 0; i < len; ++i)
        flat.push_back(i < static_cast<int64_t>(p.size()) ? p[i] : 0);
      mx.push_back(*std::max_element(p.begin(), p.end()));
    }
    std::vector<double> pf(prefix.begin(), prefix.end());
    o.prefix_len_ptr = Tensor::from_vector(pf, {static_cast<int64_t>(pf.size())}, DType::kInt32);
    o.token_pos_in_items_ptr =
        Tensor::from_vector(flat, {static_cast<int64_t>(flat.size())}, DType::kInt16);
    o.token_pos_in_items_len = len;
    o.max_item_len_ptr = Tensor::from_vector(mx, {static_cast<int64_t>(mx.size())}, DType::kInt16);
  }
  // The same mask as an explicit custom_mask (bool, request by request).
  Tensor custom_mask(int64_t window) const {
    std::vector<double> bits;
    for (std::size_t b = 0; b < qo_lens.size(); ++b)
      for (int64_t i = 0; i < qo_lens[b]; ++i)
        for (int64_t j = 0; j < kv_lens[b]; ++j)
          bits.push_back(
              multi_item_sees(kv_lens[b] - qo_lens[b] + i, j, prefix[b], pos[b], window));
    return Tensor::from_vector(bits, {static_cast<int64_t>(bits.size())}, DType::kBool);
  }
};

// Hand-checked: prefix 2, items of 2 and 1 tokens (positions [0, 1, 2, 0, 1, 0]); row q lists the
// keys query q sees.
TEST(BatchPrefillMultiItem, HandCheckedMaskRows) {
  const std::vector<int> pos = item_positions({2, 1});
  ASSERT_EQ(pos, (std::vector<int>{0, 1, 2, 0, 1, 0}));
  const std::vector<std::vector<int>> sees = {{0},          {0, 1},  // the prefix: causal
                                              {0, 1},        // the first delimiter: the prefix only
                                              {0, 1, 3},     // item 1, token 1
                                              {0, 1, 3, 4},  // item 1, token 2
                                              {0, 1},        // a delimiter
                                              {0, 1, 6},     // item 2, token 1
                                              {0, 1}};       // the last delimiter
  for (int64_t q = 0; q < 8; ++q) {
    std::vector<int> got;
    for (int64_t j = 0; j < 8; ++j)
      if (multi_item_sees(q, j, 2, pos, -1)) got.push_back(static_cast<int>(j));
    EXPECT_EQ(got, sees[static_cast<std::size_t>(q)]) << "query " << q;
  }
}

// The wrappers with the multi-item arguments: the output of the same plan with the mask spelled
// out as custom_mask, bit for bit, and the fp64 formula: a whole scoring prompt (qo == kv), a
// chunk of one (its last 7 tokens), a prompt whose prefix is empty (its first delimiter sees
// nothing: zeros and LSE -inf); the paged wrapper (GQA 2, pages of 4, causal) and the ragged one
// with a sliding window (and causal=False, which the mode overrides as upstream's does).
TEST(BatchPrefillMultiItem, WrappersMatchTheMaskSpelledOutAndTheFormula) {
  MultiItemBatch m;
  m.prefix = {5, 4, 0};
  m.pos = {item_positions({3, 4, 2}), item_positions({2, 6, 3, 1}), item_positions({1, 2})};
  m.len = 24;
  for (std::size_t b = 0; b < 3; ++b)
    m.kv_lens.push_back(m.prefix[b] + static_cast<int32_t>(m.pos[b].size()));
  m.qo_lens = {m.kv_lens[0], 7, m.kv_lens[2]};
  const int64_t hq = 4, hkv = 2, d = 64;
  const std::vector<int32_t> qo_indptr = indptr_of(m.qo_lens), kv_indptr = indptr_of(m.kv_lens);
  Tensor q = Tensor::empty({qo_indptr.back(), hq, d}, DType::kBFloat16).uniform_(31);
  for (int64_t window : {int64_t{-1}, int64_t{3}}) {
    SCOPED_TRACE(::testing::Message() << "window " << window);
    PrefillPlanOptions mi, cm;
    mi.causal = window < 0;
    mi.q_data_type = cm.q_data_type = DType::kBFloat16;
    mi.window_left = cm.window_left = window;
    // KV chunks whose edges fall inside the items (pages of 4 / tokens), merged after.
    mi.fixed_split_size = cm.fixed_split_size = window < 0 ? 2 : 5;
    m.set(mi);
    cm.custom_mask = m.custom_mask(window);
    AttentionRunOptions ro;
    ro.return_lse = true;
    AttentionOutput got, spelled;
    std::vector<std::vector<double>> kd, vd;
    if (window < 0) {
      testing::PagedFixture f =
          testing::make_paged(m.kv_lens, 4, hkv, d, DType::kBFloat16, false, false, 32, kd, vd);
      BatchPrefillWithPagedKVCacheWrapper w(workspace());
      w.plan(int_tensor(qo_indptr), f.indptr, f.indices, f.last_page_len, hq, hkv, d, 4, mi);
      got = w.run(q, f.cache(), ro);
      w.plan(int_tensor(qo_indptr), f.indptr, f.indices, f.last_page_len, hq, hkv, d, 4, cm);
      spelled = w.run(q, f.cache(), ro);
    } else {
      Tensor k = Tensor::empty({kv_indptr.back(), hkv, d}, DType::kBFloat16).uniform_(33);
      Tensor v = Tensor::empty({kv_indptr.back(), hkv, d}, DType::kBFloat16).uniform_(34);
      const auto ka = k.to_double_vector(), va = v.to_double_vector();
      for (std::size_t b = 0; b < 3; ++b) {
        kd.push_back(testing::rows_of(ka, kv_indptr[b], kv_indptr[b + 1], hkv * d));
        vd.push_back(testing::rows_of(va, kv_indptr[b], kv_indptr[b + 1], hkv * d));
      }
      BatchPrefillWithRaggedKVCacheWrapper w(workspace());
      w.plan(int_tensor(qo_indptr), int_tensor(kv_indptr), hq, hkv, d, mi);
      got = w.run(q, k, v, ro);
      w.plan(int_tensor(qo_indptr), int_tensor(kv_indptr), hq, hkv, d, cm);
      spelled = w.run(q, k, v, ro);
    }
    EXPECT_EQ(testing::bytes_of(got.out), testing::bytes_of(spelled.out));
    EXPECT_EQ(testing::bytes_of(got.lse), testing::bytes_of(spelled.lse));
    const auto qd = q.to_double_vector();
    for (std::size_t b = 0; b < 3; ++b) {
      RefOptions opt;
      const int64_t shift = m.kv_lens[b] - m.qo_lens[b];
      opt.mask = [&, b, shift](int64_t i, int64_t j) {
        return multi_item_sees(shift + i, j, m.prefix[b], m.pos[b], window);
      };
      std::vector<double> eo, el;
      testing::ref_attention(testing::rows_of(qd, qo_indptr[b], qo_indptr[b + 1], hq * d), kd[b],
                             vd[b], m.qo_lens[b], m.kv_lens[b], hq, hkv, d, d, opt, eo, el);
      EXPECT_TRUE(testing::all_close(got.out.slice(0, qo_indptr[b], qo_indptr[b + 1]), eo,
                                     testing::attention_tolerance(DType::kBFloat16)))
          << "request " << b;
      EXPECT_TRUE(
          testing::all_close(got.lse.slice(0, qo_indptr[b], qo_indptr[b + 1]), el, {1e-4, 1e-5}))
          << "request " << b;
    }
  }
}

// A custom mask given as well is replaced by the mode (upstream's run picks MULTIITEMSCORING over
// CUSTOM); prefix lengths are unsigned: uint32 2^31 (int32 bits -2^31 here) keeps every query in
// the prefix, which is then the causal mask.
TEST(BatchPrefillMultiItem, ModeReplacesACustomMaskAndReadsUnsignedLengths) {
  MultiItemBatch m;
  m.prefix = {3};
  m.pos = {item_positions({4, 2})};
  m.len = 10;
  m.kv_lens = {3 + static_cast<int32_t>(m.pos[0].size())};
  m.qo_lens = m.kv_lens;
  const int32_t n = m.kv_lens[0];
  Tensor q = Tensor::empty({n, 2, 64}, DType::kFloat32).uniform_(51);
  Tensor k = Tensor::empty({n, 2, 64}, DType::kFloat32).uniform_(52);
  Tensor v = Tensor::empty({n, 2, 64}, DType::kFloat32).uniform_(53);
  BatchPrefillWithRaggedKVCacheWrapper w(workspace());
  auto run = [&](const PrefillPlanOptions& o) {
    w.plan(int_tensor({0, n}), int_tensor({0, n}), 2, 2, 64, o);
    return w.run(q, k, v).out;
  };
  PrefillPlanOptions mi;
  mi.causal = true;
  mi.q_data_type = DType::kFloat32;
  m.set(mi);
  const Tensor alone = run(mi);
  PrefillPlanOptions both = mi;
  std::vector<double> junk(static_cast<std::size_t>(n) * n);
  for (std::size_t i = 0; i < junk.size(); ++i) junk[i] = (i * 7) % 3 == 0;
  both.custom_mask = Tensor::from_vector(junk, {n * n}, DType::kBool);
  EXPECT_EQ(testing::bytes_of(run(both)), testing::bytes_of(alone));
  // prefix_len 2^31 (read unsigned): every query in the prefix.
  PrefillPlanOptions big = mi;
  big.prefix_len_ptr = int_tensor({std::numeric_limits<int32_t>::min()});
  PrefillPlanOptions causal;
  causal.q_data_type = DType::kFloat32;
  std::vector<double> tri;
  for (int32_t i = 0; i < n; ++i)
    for (int32_t j = 0; j < n; ++j) tri.push_back(j <= i);
  causal.custom_mask = Tensor::from_vector(tri, {n * n}, DType::kBool);
  EXPECT_EQ(testing::bytes_of(run(big)), testing::bytes_of(run(causal)));
}

TEST(BatchPrefillMultiItem, BadInput) {
  const char* op = "BatchPrefillWithRaggedKVCacheWrapper.plan";
  MultiItemBatch m;
  m.prefix = {2};
  m.pos = {item_positions({2, 1})};
  m.len = 6;
  m.kv_lens = {8};
  m.qo_lens = {8};
  BatchPrefillWithRaggedKVCacheWrapper w(workspace());
  auto plan = [&](const PrefillPlanOptions& o) {
    w.plan(int_tensor({0, 8}), int_tensor({0, 8}), 2, 2, 64, o);
  };
  PrefillPlanOptions good;
  good.causal = true;
  m.set(good);
  plan(good);  // valid
  PrefillPlanOptions o = good;
  o.token_pos_in_items_ptr.reset();
  EXPECT_FI_ERROR(plan(o), op, "token_pos_in_items_ptr");
  o = good;
  o.max_item_len_ptr.reset();
  EXPECT_FI_ERROR(plan(o), op, "max_item_len_ptr");
  o = good;
  o.prefix_len_ptr.reset();
  EXPECT_FI_ERROR(plan(o), op, "prefix_len_ptr");
  o = good;
  o.token_pos_in_items_len = 0;  // the items' tokens have no entries
  EXPECT_FI_ERROR(plan(o), op, "token_pos_in_items_len");
  o = good;
  o.token_pos_in_items_len = -1;
  EXPECT_FI_ERROR(plan(o), op, "token_pos_in_items_len");
  o = good;
  o.token_pos_in_items_len = 5;  // the last token's entry is past the row
  o.token_pos_in_items_ptr = good.token_pos_in_items_ptr->slice(0, 0, 5);
  EXPECT_FI_ERROR(plan(o), op, "token_pos_in_items_len");
  o = good;
  o.token_pos_in_items_ptr = good.token_pos_in_items_ptr->slice(0, 0, 4);
  EXPECT_FI_ERROR(plan(o), op, "token_pos_in_items_ptr");
  o = good;
  o.prefix_len_ptr = Tensor::zeros({0}, DType::kInt32);
  EXPECT_FI_ERROR(plan(o), op, "prefix_len_ptr");
  o = good;
  o.max_item_len_ptr = Tensor::from_vector({0}, {1}, DType::kInt16);  // 2 > 0 + 1: keys skipped
  EXPECT_FI_ERROR(plan(o), op, "max_item_len_ptr");
  o = good;
  o.max_item_len_ptr = Tensor::from_vector({1}, {1}, DType::kInt16);  // 2 <= 1 + 1: no key skipped
  plan(o);
  o = good;
  o.prefix_len_ptr = Tensor::from_vector({2}, {1}, DType::kFloat32);
  EXPECT_FI_ERROR(plan(o), op, "prefix_len_ptr");
}

TEST(BatchPrefillWrappers, InvokersRunInitPlanRun) {
  const OpDecl* init = OpRegistry::global().find("BatchPrefillWithRaggedKVCacheWrapper.__init__");
  const OpDecl* plan = OpRegistry::global().find("BatchPrefillWithRaggedKVCacheWrapper.plan");
  const OpDecl* run = OpRegistry::global().find("BatchPrefillWithRaggedKVCacheWrapper.run");
  ASSERT_TRUE(init && plan && run);
  EXPECT_EQ(plan->module, "flashinfer.prefill");
  EXPECT_EQ(plan->params[plan->param_index("causal")].keyword_only, false);
  EXPECT_TRUE(run->params[run->param_index("return_lse")].keyword_only);
  Tensor q = Tensor::empty({5, 2, 64}, DType::kFloat16).uniform_(1);
  Tensor k = Tensor::empty({9, 1, 64}, DType::kFloat16).uniform_(2);
  Value self = init->invoke(CallArgs(*init, bind_arguments(*init, {Value(), Value(workspace())})));
  plan->invoke(
      CallArgs(*plan, bind_arguments(*plan,
                                     {self, Value(int_tensor({0, 2, 5})),
                                      Value(int_tensor({0, 4, 9})), Value(2), Value(1), Value(64)},
                                     {{"causal", Value(true)}})));
  Value out =
      run->invoke(CallArgs(*run, bind_arguments(*run, {self, Value(q), Value(k), Value(k)})));
  ASSERT_TRUE(out.is_tensor());
  BatchPrefillWithRaggedKVCacheWrapper w(workspace());
  PrefillPlanOptions o;
  o.causal = true;
  w.plan(int_tensor({0, 2, 5}), int_tensor({0, 4, 9}), 2, 1, 64, o);
  EXPECT_TRUE(testing::all_close(out.as_tensor(), w.run(q, k, k), {0, 0}));
}

TEST(BatchPrefillWrappers, BadInput) {
  const char* plan = "BatchPrefillWithPagedKVCacheWrapper.plan";
  const char* run = "BatchPrefillWithPagedKVCacheWrapper.run";
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged({5, 8}, 4, 2, 64, DType::kFloat16, false, false, 5, kd, vd);
  BatchPrefillWithPagedKVCacheWrapper w(workspace());
  Tensor q = Tensor::zeros({4, 4, 64}, DType::kFloat16);
  EXPECT_FI_ERROR(w.run(q, f.cache()), run, "self");
  auto P = [&](const Tensor& qo, PrefillPlanOptions o = {}) {
    w.plan(qo, f.indptr, f.indices, f.last_page_len, 4, 2, 64, 4, o);
  };
  EXPECT_FI_ERROR(P(int_tensor({0, 3})), plan, "qo_indptr");
  EXPECT_FI_ERROR(P(int_tensor({0, 3, 2})), plan, "qo_indptr");
  {
    PrefillPlanOptions o;
    o.causal = true;
    EXPECT_FI_ERROR(P(int_tensor({0, 6, 7}), o), plan, "causal");  // qo_len 6 > kv_len 5
    o = {};
    o.custom_mask = Tensor::zeros({7}, DType::kBool);
    EXPECT_FI_ERROR(P(int_tensor({0, 1, 2}), o), plan, "custom_mask");
    o = {};
    o.packed_custom_mask = Tensor::zeros({1}, DType::kUInt8);
    EXPECT_FI_ERROR(P(int_tensor({0, 1, 2}), o), plan, "packed_custom_mask");
    o = {};
    o.head_dim_vo = 72;  // not a multiple of 16
    EXPECT_FI_ERROR(P(int_tensor({0, 1, 2}), o), plan, "head_dim_vo");
    o = {};
    o.seq_lens = Tensor::zeros({2}, DType::kInt32);
    EXPECT_FI_ERROR(P(int_tensor({0, 1, 2}), o), plan, "seq_lens");
    o = {};
    o.kv_data_type = DType::kBFloat16;
    EXPECT_FI_ERROR(P(int_tensor({0, 1, 2}), o), plan, "kv_data_type");
  }
  // vLLM passes seq_lens= (checked against the page table) and fixed_split_size=-1 ("none").
  {
    PrefillPlanOptions o;
    o.seq_lens = int_tensor({5, 8});
    o.fixed_split_size = -1;
    EXPECT_NO_THROW(P(int_tensor({0, 1, 4}), o));
    o.seq_lens = int_tensor({5, 9});
    EXPECT_FI_ERROR(P(int_tensor({0, 1, 4}), o), plan, "seq_lens");
  }
  P(int_tensor({0, 1, 4}));
  EXPECT_NO_THROW(w.run(q, f.cache()));
  EXPECT_FI_ERROR(w.run(Tensor::zeros({5, 4, 64}, DType::kFloat16), f.cache()), run, "q");
  EXPECT_FI_ERROR(w.run(q, PagedKVCache(f.cache5.slice(0, 0, 3))), run, "paged_kv_cache");

  const char* rplan = "BatchPrefillWithRaggedKVCacheWrapper.plan";
  const char* rrun = "BatchPrefillWithRaggedKVCacheWrapper.run";
  BatchPrefillWithRaggedKVCacheWrapper r(workspace());
  EXPECT_FI_ERROR(r.plan(int_tensor({0, 2}), int_tensor({0, 2, 4}), 2, 1, 64), rplan, "qo_indptr");
  EXPECT_FI_ERROR(r.plan(int_tensor({0, 2}), int_tensor({0, -1}), 2, 1, 64), rplan, "kv_indptr");
  r.plan(int_tensor({0, 2}), int_tensor({0, 6}), 2, 1, 64);
  Tensor rq = Tensor::zeros({2, 2, 64}, DType::kFloat16);
  EXPECT_FI_ERROR(r.run(rq, Tensor::zeros({5, 1, 64}, DType::kFloat16),
                        Tensor::zeros({6, 1, 64}, DType::kFloat16)),
                  rrun, "k");
  EXPECT_FI_ERROR(r.run(rq, Tensor::zeros({6, 1, 64}, DType::kFloat16),
                        Tensor::zeros({6, 2, 64}, DType::kFloat16)),
                  rrun, "v");
  // o_scale is accepted (upstream's fa2 ragged run ignores it): test_attention_nvfp4.cpp.
  AttentionRunOptions ro;
  ro.kv_cache_sf = PagedKVCache(Tensor::zeros({6, 1, 4}, DType::kUInt8),
                                Tensor::zeros({6, 1, 4}, DType::kUInt8));
  EXPECT_FI_ERROR(r.run(rq, Tensor::zeros({6, 1, 64}, DType::kFloat16),
                        Tensor::zeros({6, 1, 64}, DType::kFloat16), ro),
                  rrun, "kv_cache_sf");
}

TEST(SinglePrefill, BadInput) {
  const char* op = "single_prefill_with_kv_cache";
  Tensor q = Tensor::zeros({4, 2, 64}, DType::kFloat16);
  Tensor k = Tensor::zeros({3, 1, 64}, DType::kFloat16);
  EXPECT_FI_ERROR(single_prefill_with_kv_cache(q, k, k, {}, {}, {}, {}, {}, {}, true), op,
                  "causal");
  EXPECT_FI_ERROR(
      single_prefill_with_kv_cache(q, k, k, {}, {}, {}, {}, {}, {}, false, "NHD", "alibi"), op,
      "pos_encoding_mode");
  EXPECT_FI_ERROR(
      single_prefill_with_kv_cache(q, k, k, {}, {}, {}, {}, Tensor::zeros({4, 4}, DType::kBool)),
      op, "custom_mask");
  EXPECT_FI_ERROR(single_prefill_with_kv_cache(q, k, k, {}, Tensor::zeros({2}, DType::kFloat32)),
                  op, "scale_k");
  EXPECT_FI_ERROR(single_prefill_with_kv_cache(q, k, k, {}, {}, {}, DType::kInt8), op, "o_dtype");
  EXPECT_FI_ERROR(single_prefill_with_kv_cache(q, k, k, {}, {}, {}, {}, {}, {}, false, "NHD",
                                               "NONE", false, {}, -1, {}, {}, {}, "cudnn"),
                  op, "backend");
}

// backend="fa3" (upstream's Hopper kernel, what its "auto" picks on sm90) is the same attention:
// on the CPU every backend runs the reference, byte for byte; other names are refused.
TEST(BatchPrefillWrappers, Fa3BackendRunsTheSameAttention) {
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged({40, 7, 200}, 16, 2, 64, DType::kBFloat16, false, true, 3, kd, vd);
  const std::vector<int32_t> qo{0, 33, 40, 140};
  Tensor q = Tensor::empty({140, 8, 64}, DType::kBFloat16).uniform_(4);
  PrefillPlanOptions po;
  po.q_data_type = DType::kBFloat16;
  po.causal = true;
  auto run_with = [&](const std::string& backend) {
    BatchPrefillWithPagedKVCacheWrapper w(workspace(), "NHD", false, {}, {}, {}, {}, {}, {},
                                          backend);
    w.plan(int_tensor(qo), f.indptr, f.indices, f.last_page_len, 8, 2, 64, 16, po);
    return w.run(q, f.cache());
  };
  const Tensor fa3 = run_with("fa3").out, fa2 = run_with("fa2").out,
               automatic = run_with("auto").out;
  EXPECT_TRUE(testing::all_close(fa3, fa2, {0, 0}));
  EXPECT_TRUE(testing::all_close(fa3, automatic, {0, 0}));
  Tensor k = Tensor::empty({50, 2, 64}, DType::kBFloat16).uniform_(5);
  Tensor qs = Tensor::empty({20, 8, 64}, DType::kBFloat16).uniform_(6);
  auto single = [&](const std::string& backend) {
    return single_prefill_with_kv_cache(qs, k, k, {}, {}, {}, {}, {}, {}, true, "NHD", "NONE",
                                        false, {}, -1, {}, {}, {}, backend)
        .out;
  };
  EXPECT_TRUE(testing::all_close(single("fa3"), single("fa2"), {0, 0}));
  EXPECT_FI_ERROR(
      BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD", false, {}, {}, {}, {}, {}, {}, "fa4"),
      "BatchPrefillWithPagedKVCacheWrapper.__init__", "backend");
  // "cutlass" (upstream's Blackwell FMHA; vLLM's MLA prefill on Blackwell builds the ragged
  // wrapper with it): the same attention, on the CPU here (head dims 192 / 128, causal, lse); on a
  // GPU other than sm100 / sm103 it is refused by name (replay then falls back to the CPU). The
  // one-shot single prefill has no such backend.
  Tensor q2 = Tensor::empty({30, 4, 192}, DType::kBFloat16).uniform_(7);
  Tensor k2 = Tensor::empty({45, 4, 192}, DType::kBFloat16).uniform_(8);
  Tensor v2 = Tensor::empty({45, 4, 128}, DType::kBFloat16).uniform_(9);
  auto ragged = [&](const std::string& backend) {
    BatchPrefillWithRaggedKVCacheWrapper w(workspace(), "NHD", false, {}, {}, {}, {}, backend);
    PrefillPlanOptions rp;
    rp.q_data_type = DType::kBFloat16;
    rp.causal = true;
    rp.head_dim_vo = 128;
    w.plan(int_tensor({0, 10, 30}), int_tensor({0, 15, 45}), 4, 4, 192, rp);
    AttentionRunOptions ro;
    ro.return_lse = true;
    return w.run(q2, k2, v2, ro);
  };
  const AttentionOutput cut = ragged("cutlass"), ref = ragged("fa2");
  EXPECT_TRUE(testing::all_close(cut.out, ref.out, {0, 0}));
  EXPECT_TRUE(testing::all_close(cut.lse, ref.lse, {0, 0}));
  EXPECT_FI_ERROR(single("cutlass"), "single_prefill_with_kv_cache", "backend");
  EXPECT_FI_ERROR(
      BatchPrefillWithRaggedKVCacheWrapper(workspace(), "NHD", false, {}, {}, {}, {}, "cutlas"),
      "BatchPrefillWithRaggedKVCacheWrapper.__init__", "backend");
}

}  // namespace
}  // namespace flashinfer

namespace flashinfer {
namespace {

// CUDA (tensor-core prefill kernel) vs the CPU reference on the same inputs (skipped without a
// GPU). P is rounded to the input dtype before the PV product on tensor cores, so the tolerance
// is the dtype's.
TEST(BatchPrefillCuda, PagedMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    for (int64_t d : {64, 128, 256, 96, 80}) {  // 96, 80: JIT-compiled (docs/JIT.md)
      std::vector<std::vector<double>> kd, vd;
      testing::PagedFixture f =
          testing::make_paged({40, 7, 200}, 16, 2, d, dt, true, true, 3, kd, vd);
      const std::vector<int32_t> qo{0, 33, 40, 140};
      Tensor q = Tensor::empty({140, 8, d}, dt).uniform_(4);
      PrefillPlanOptions po;
      po.q_data_type = dt;
      po.causal = true;
      po.logits_soft_cap = 30.0;
      po.window_left = 90;
      AttentionRunOptions ro;
      ro.return_lse = true;
      BatchPrefillWithPagedKVCacheWrapper cpu(workspace(), "HND");
      cpu.plan(int_tensor(qo), f.indptr, f.indices, f.last_page_len, 8, 2, d, 16, po);
      AttentionOutput ref = cpu.run(q, f.cache(), ro);
      BatchPrefillWithPagedKVCacheWrapper gpu(
          Tensor::zeros({8 << 20}, DType::kUInt8, Device::cuda()), "HND");
      gpu.plan(int_tensor(qo), f.indptr, f.indices, f.last_page_len, 8, 2, d, 16, po);
      AttentionOutput got =
          gpu.run(q.to(Device::cuda()),
                  PagedKVCache(testing::to_keep_layout(f.k_cache, Device::cuda()),
                               testing::to_keep_layout(f.v_cache, Device::cuda())),
                  ro);
      EXPECT_TRUE(testing::all_close(got.out, ref.out, testing::default_tolerance(dt)));
      EXPECT_TRUE(testing::all_close(got.lse, ref.lse, {2e-3, 1e-3}));
    }
  }
}

// SGLang's extend call on CUDA: page size 1, its K/V pools as a pair of 3-D [tokens, H, D] tensors,
// causal, 32:8 heads at head dim 128, bf16: the 5-D cache's bits (the Hopper kernel on sm_90,
// the FA2 kernel elsewhere) and the CPU reference's values.
TEST(BatchPrefillCuda, LseBaseAndLayoutAsUpstream) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  expect_lse_base_and_layout(Device::cuda());
}

TEST(BatchPrefillCuda, PageSizeOnePoolsWithoutThePageAxisMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const DType dt = DType::kBFloat16;
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged({300, 41, 130}, 1, 8, 128, dt, false, false, 5, kd, vd);
  const std::vector<int32_t> qo{0, 200, 201, 331};
  const Tensor q = Tensor::empty({331, 32, 128}, dt).uniform_(4);
  PrefillPlanOptions po;
  po.q_data_type = dt;
  po.causal = true;
  BatchPrefillWithPagedKVCacheWrapper cpu(workspace());
  cpu.plan(int_tensor(qo), f.indptr, f.indices, f.last_page_len, 32, 8, 128, 1, po);
  const Tensor ref = cpu.run(q, f.cache()).out;
  BatchPrefillWithPagedKVCacheWrapper gpu(Tensor::zeros({8 << 20}, DType::kUInt8, g));
  gpu.plan(int_tensor(qo), f.indptr, f.indices, f.last_page_len, 32, 8, 128, 1, po);
  const Tensor c5 = testing::to_keep_layout(f.cache5, g);
  const Tensor qg = q.to(g);
  const std::vector<double> five = gpu.run(qg, PagedKVCache(c5)).out.to_double_vector();
  const Tensor got =
      gpu.run(qg, PagedKVCache(c5.select(1, 0).squeeze(1), c5.select(1, 1).squeeze(1))).out;
  EXPECT_EQ(got.to_double_vector(), five);
  EXPECT_TRUE(testing::all_close(got, ref, testing::default_tolerance(dt)));
}

// Single prefill with per-head scales, causal right-aligned (kv_len > qo_len), a window and a
// soft cap, fp16 KV and fp8 e4m3 KV: per-head q / k scales do not fold into the tensor-core
// kernels' exponent (prefill_scale_folds), so both run on the CUDA-core kernel, whose path for
// them this checks.
TEST(SinglePrefillCuda, HeadScalesAndFp8KvMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  Tensor q = Tensor::empty({37, 8, 64}, DType::kFloat16).uniform_(21);
  Tensor sq =
      Tensor::from_vector({0.5, 1.0, 1.5, 2.0, 0.25, 0.75, 1.25, 1.75}, {8}, DType::kFloat32);
  Tensor sk = Tensor::from_vector({0.5, 1.5}, {2}, DType::kFloat32);
  Tensor sv = Tensor::from_vector({2.0, 0.75}, {2}, DType::kFloat32);
  for (DType kv_dtype : {DType::kFloat16, DType::kFloat8E4M3FN}) {
    Tensor k = Tensor::empty({100, 2, 64}, kv_dtype).uniform_(22);
    Tensor v = Tensor::empty({100, 2, 64}, kv_dtype).uniform_(23);
    auto run = [&](Device d) {
      return single_prefill_with_kv_cache(q.to(d), k.to(d), v.to(d), sq.to(d), sk.to(d), sv.to(d),
                                          std::nullopt, std::nullopt, std::nullopt, true, "NHD",
                                          "NONE", false, std::nullopt, 50, 15.0, std::nullopt,
                                          std::nullopt, "auto", true);
    };
    AttentionOutput ref = run(Device::cpu());
    AttentionOutput got = run(g);
    EXPECT_TRUE(testing::all_close(got.out, ref.out, testing::default_tolerance(DType::kFloat16)))
        << dtype_torch_name(kv_dtype);
    EXPECT_TRUE(testing::all_close(got.lse, ref.lse, {2e-3, 1e-3})) << dtype_torch_name(kv_dtype);
  }
}

TEST(BatchPrefillCuda, RaggedCustomMaskMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const std::vector<int32_t> qo{0, 5, 9}, kv{0, 13, 20};
  Tensor q = Tensor::empty({9, 4, 128}, DType::kFloat16).uniform_(1);
  Tensor k = Tensor::empty({20, 1, 128}, DType::kFloat16).uniform_(2);
  Tensor v = Tensor::empty({20, 1, 128}, DType::kFloat16).uniform_(3);
  std::vector<double> bits;
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < qo[b + 1] - qo[b]; ++i)
      for (int j = 0; j < kv[b + 1] - kv[b]; ++j) bits.push_back(mask_bit(i, j));
  PrefillPlanOptions po;
  po.custom_mask = Tensor::from_vector(bits, {static_cast<int64_t>(bits.size())}, DType::kBool);
  BatchPrefillWithRaggedKVCacheWrapper cpu(workspace());
  cpu.plan(int_tensor(qo), int_tensor(kv), 4, 1, 128, po);
  Tensor ref = cpu.run(q, k, v);
  BatchPrefillWithRaggedKVCacheWrapper gpu(Tensor::zeros({8 << 20}, DType::kUInt8, Device::cuda()));
  gpu.plan(int_tensor(qo), int_tensor(kv), 4, 1, 128, po);
  Tensor got = gpu.run(q.to(Device::cuda()), k.to(Device::cuda()), v.to(Device::cuda()));
  EXPECT_TRUE(testing::all_close(got, ref, testing::default_tolerance(DType::kFloat16)));
}

// Multi-item scoring's calls the Hopper kernel has run so far (its kMultiItem instances), and
// whether it runs them here: a build with it (CUTLASS's headers), an sm_90 device. Elsewhere the
// FA2 kernel runs them as a custom mask.
uint64_t hopper_multi_item_launches() {
#if FLASHINFER_TEST_HAVE_CUTLASS
  return kernels::cuda::prefill_sm90_multi_item_launches();
#else
  return 0;
#endif
}
bool hopper_runs_multi_item() {
#if FLASHINFER_TEST_HAVE_CUTLASS
  return api::compute_capability(Device::cuda()) == 90;
#else
  return false;
#endif
}

// Multi-item scoring on CUDA: the plan's rows against the CPU, on the Hopper kernel where it runs
// them (head dim 128, 16-bit K/V; the launch counter says it did) and on the FA2 kernel
// (FLASHINFER_PREFILL_SM90=0), whose result is the same plan's with the mask spelled out as
// custom_mask, bit for bit. Compiled, not run.
TEST(BatchPrefillCuda, MultiItemScoringMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  MultiItemBatch m;
  m.prefix = {37, 3};
  m.pos = {item_positions({5, 20, 9, 1}), item_positions({64, 2})};
  m.len = 80;
  for (std::size_t b = 0; b < 2; ++b)
    m.kv_lens.push_back(m.prefix[b] + static_cast<int32_t>(m.pos[b].size()));
  m.qo_lens = {m.kv_lens[0], 40};
  const std::vector<int32_t> qo_indptr = indptr_of(m.qo_lens), kv_indptr = indptr_of(m.kv_lens);
  Tensor q = Tensor::empty({qo_indptr.back(), 8, 128}, DType::kFloat16).uniform_(41);
  Tensor k = Tensor::empty({kv_indptr.back(), 2, 128}, DType::kFloat16).uniform_(42);
  Tensor v = Tensor::empty({kv_indptr.back(), 2, 128}, DType::kFloat16).uniform_(43);
  PrefillPlanOptions mi, cm;
  mi.causal = true;
  mi.q_data_type = cm.q_data_type = DType::kFloat16;
  m.set(mi);
  cm.custom_mask = m.custom_mask(-1);
  BatchPrefillWithRaggedKVCacheWrapper cpu(workspace());
  cpu.plan(int_tensor(qo_indptr), int_tensor(kv_indptr), 8, 2, 128, mi);
  const Tensor want = cpu.run(q, k, v).out;
  const Device gpu = Device::cuda();
  BatchPrefillWithRaggedKVCacheWrapper w(Tensor::zeros({8 << 20}, DType::kUInt8, gpu));
  const Tensor qg = q.to(gpu), kg = k.to(gpu), vg = v.to(gpu);
  const uint64_t launches = hopper_multi_item_launches();
  w.plan(int_tensor(qo_indptr).to(gpu), int_tensor(kv_indptr).to(gpu), 8, 2, 128, mi);
  const Tensor got = w.run(qg, kg, vg).out.to(Device::cpu());
  EXPECT_EQ(hopper_multi_item_launches() > launches, hopper_runs_multi_item());
  Tensor fa2, spelled;
  {
    const testing::ScopedEnv fa2_only("FLASHINFER_PREFILL_SM90", "0");
    w.plan(int_tensor(qo_indptr).to(gpu), int_tensor(kv_indptr).to(gpu), 8, 2, 128, mi);
    fa2 = w.run(qg, kg, vg).out.to(Device::cpu());
    w.plan(int_tensor(qo_indptr).to(gpu), int_tensor(kv_indptr).to(gpu), 8, 2, 128, cm);
    spelled = w.run(qg, kg, vg).out.to(Device::cpu());
  }
  const auto tol = testing::attention_tolerance(DType::kFloat16);
  EXPECT_TRUE(testing::all_close(got, want, tol));
  EXPECT_TRUE(testing::all_close(fa2, want, tol));
  EXPECT_TRUE(testing::all_close(got, fa2, tol));
  EXPECT_EQ(testing::bytes_of(fa2), testing::bytes_of(spelled));
  // Under use_cuda_graph the mask would need the constructor's buffer: refused by name.
  BatchPrefillWithPagedKVCacheWrapper graph(
      Tensor::zeros({8 << 20}, DType::kUInt8, gpu), "NHD", true, int_tensor({0, 0, 0}).to(gpu),
      int_tensor({0, 0, 0}).to(gpu), Tensor::zeros({64}, DType::kInt32, gpu),
      int_tensor({1, 1}).to(gpu));
  PrefillPlanOptions g = mi;
  EXPECT_FI_ERROR_CODE(
      graph.plan(int_tensor({0, 1, 2}).to(gpu), int_tensor({0, 1, 2}).to(gpu),
                 int_tensor({0, 1}).to(gpu), int_tensor({1, 1}).to(gpu), 8, 2, 128, 16, g),
      "BatchPrefillWithPagedKVCacheWrapper.plan", "prefix_len_ptr", ErrorCode::kUnsupported);
}

// Multi-item scoring's tile skipping on CUDA: long scoring prompts (a whole one, and a chunk of
// one) whose items are short, so most key tiles of a block lie past its last query or between the
// prefix and its first query less max_item_len, which the tensor-core kernel skips
// (prefill_multi_item_tiles); in KV chunks (split-KV) and whole, 16-bit and fp8 K/V. Against the
// CPU, and on the FA2 kernel bit for bit against the same plan with the mask spelled out as
// custom_mask (no skipping): a skipped tile that a row sees would change the bits. On an sm_90
// device the Hopper kernel runs the 16-bit K/V calls (its 128-key tiles skipped by the same rule):
// against the CPU and the FA2 kernel. Compiled, not run.
TEST(BatchPrefillCuda, MultiItemScoringSkipsTheTilesNoRowSees) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  MultiItemBatch m;
  m.prefix = {150, 20};
  std::vector<int> lens0, lens1;
  for (int i = 0; i < 70; ++i) lens0.push_back(3 + (i * 7) % 15);
  for (int i = 0; i < 30; ++i) lens1.push_back(5 + (i * 11) % 36);
  m.pos = {item_positions(lens0), item_positions(lens1)};
  m.len = static_cast<int64_t>(std::max(m.pos[0].size(), m.pos[1].size()));
  for (std::size_t b = 0; b < 2; ++b)
    m.kv_lens.push_back(m.prefix[b] + static_cast<int32_t>(m.pos[b].size()));
  m.qo_lens = {m.kv_lens[0], 300};
  const std::vector<int32_t> qo_indptr = indptr_of(m.qo_lens), kv_indptr = indptr_of(m.kv_lens);
  const Device gpu = Device::cuda();
  Tensor q = Tensor::empty({qo_indptr.back(), 8, 128}, DType::kFloat16).uniform_(51);
  Tensor k = Tensor::empty({kv_indptr.back(), 2, 128}, DType::kFloat16).uniform_(52);
  Tensor v = Tensor::empty({kv_indptr.back(), 2, 128}, DType::kFloat16).uniform_(53);
  for (DType kv_dt : {DType::kFloat16, DType::kFloat8E4M3FN}) {
    const Tensor kc = kv_dt == DType::kFloat16 ? k : k.to(kv_dt);
    const Tensor vc = kv_dt == DType::kFloat16 ? v : v.to(kv_dt);
    for (int64_t split : {int64_t{-1}, int64_t{128}}) {
      SCOPED_TRACE(std::string(dtype_torch_name(kv_dt)) + " split " + std::to_string(split));
      PrefillPlanOptions mi, cm;
      mi.causal = true;
      mi.q_data_type = cm.q_data_type = DType::kFloat16;
      mi.kv_data_type = cm.kv_data_type = kv_dt;
      if (split > 0) mi.fixed_split_size = cm.fixed_split_size = split;  // tokens (ragged)
      m.set(mi);
      cm.custom_mask = m.custom_mask(-1);
      AttentionRunOptions ro;
      ro.return_lse = true;
      BatchPrefillWithRaggedKVCacheWrapper cpu(workspace());
      cpu.plan(int_tensor(qo_indptr), int_tensor(kv_indptr), 8, 2, 128, mi);
      const AttentionOutput want = cpu.run(q, kc, vc, ro);
      BatchPrefillWithRaggedKVCacheWrapper w(Tensor::zeros({64 << 20}, DType::kUInt8, gpu));
      const Tensor qg = q.to(gpu), kg = kc.to(gpu), vg = vc.to(gpu);
      const auto tol = testing::attention_tolerance(DType::kFloat16);
      const uint64_t launches = hopper_multi_item_launches();
      w.plan(int_tensor(qo_indptr).to(gpu), int_tensor(kv_indptr).to(gpu), 8, 2, 128, mi);
      const AttentionOutput got = w.run(qg, kg, vg, ro);
      EXPECT_EQ(hopper_multi_item_launches() > launches,
                hopper_runs_multi_item() && kv_dt == DType::kFloat16);
      AttentionOutput fa2, spelled;
      {
        const testing::ScopedEnv fa2_only("FLASHINFER_PREFILL_SM90", "0");
        w.plan(int_tensor(qo_indptr).to(gpu), int_tensor(kv_indptr).to(gpu), 8, 2, 128, mi);
        fa2 = w.run(qg, kg, vg, ro);
        w.plan(int_tensor(qo_indptr).to(gpu), int_tensor(kv_indptr).to(gpu), 8, 2, 128, cm);
        spelled = w.run(qg, kg, vg, ro);
      }
      const Tensor out = got.out.to(Device::cpu()), lse = got.lse.to(Device::cpu());
      const Tensor fa2_out = fa2.out.to(Device::cpu()), fa2_lse = fa2.lse.to(Device::cpu());
      EXPECT_TRUE(testing::all_close(out, want.out, tol));
      EXPECT_TRUE(testing::all_close(lse, want.lse, {2e-3, 1e-3}));
      EXPECT_TRUE(testing::all_close(fa2_out, want.out, tol));
      EXPECT_TRUE(testing::all_close(out, fa2_out, tol));
      EXPECT_TRUE(testing::all_close(lse, fa2_lse, {1e-3, 1e-4}));
      EXPECT_EQ(testing::bytes_of(fa2_out), testing::bytes_of(spelled.out.to(Device::cpu())));
      EXPECT_EQ(testing::bytes_of(fa2_lse), testing::bytes_of(spelled.lse.to(Device::cpu())));
    }
  }
}

// qk 192 / vo 128 (DeepSeek) on CUDA: the FA2 kernel's 192 / 128 instance (ahead of time).
TEST(BatchPrefillCuda, RaggedQk192Vo128MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const std::vector<int32_t> qo{0, 3, 40}, kv{0, 9, 90};
  Tensor q = Tensor::empty({40, 8, 192}, DType::kBFloat16).uniform_(1);
  Tensor k = Tensor::empty({90, 2, 192}, DType::kBFloat16).uniform_(2);
  Tensor v = Tensor::empty({90, 2, 128}, DType::kBFloat16).uniform_(3);
  PrefillPlanOptions po;
  po.q_data_type = DType::kBFloat16;
  po.head_dim_vo = 128;
  po.causal = true;
  AttentionRunOptions ro;
  ro.return_lse = true;
  BatchPrefillWithRaggedKVCacheWrapper cpu(workspace());
  cpu.plan(int_tensor(qo), int_tensor(kv), 8, 2, 192, po);
  AttentionOutput ref = cpu.run(q, k, v, ro);
  BatchPrefillWithRaggedKVCacheWrapper gpu(Tensor::zeros({8 << 20}, DType::kUInt8, Device::cuda()));
  gpu.plan(int_tensor(qo), int_tensor(kv), 8, 2, 192, po);
  AttentionOutput got =
      gpu.run(q.to(Device::cuda()), k.to(Device::cuda()), v.to(Device::cuda()), ro);
  EXPECT_TRUE(testing::all_close(got.out, ref.out, testing::default_tolerance(DType::kBFloat16)));
  EXPECT_TRUE(testing::all_close(got.lse, ref.lse, {2e-3, 1e-3}));
}

}  // namespace
}  // namespace flashinfer

namespace flashinfer {
namespace {

TEST(BatchPrefillWrappers, RecordedInitPlanRunReplays) {
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged({12, 5}, 4, 1, 64, DType::kFloat16, false, false, 5, kd, vd);
  Tensor q = Tensor::empty({9, 4, 64}, DType::kFloat16).uniform_(8);
  auto capture = std::make_shared<testing::CallCapture>();
  add_call_observer(capture);
  Tensor direct;
  {
    BatchPrefillWithPagedKVCacheWrapper w(workspace());
    PrefillPlanOptions po;
    po.causal = true;
    po.window_left = 3;
    w.plan(int_tensor({0, 6, 9}), f.indptr, f.indices, f.last_page_len, 4, 1, 64, 4, po);
    direct = w.run(q, f.cache());
  }
  remove_call_observer(capture);
  ASSERT_EQ(capture->calls.size(), 3u);
  const std::vector<Value> replayed = capture->replay();
  ASSERT_TRUE(replayed[2].is_tensor());
  EXPECT_TRUE(testing::all_close(replayed[2].as_tensor(), direct, {0, 0}));
}

}  // namespace
}  // namespace flashinfer
