// pos_encoding_mode="ROPE_LLAMA" / "ALIBI" inside the decode and prefill ops: against an fp64
// formula (RoPE of q at kv_len - qo_len + i and of key j at j; ALiBi slope_h * (j - i) added to
// the scaled logit), over single and batch decode / prefill, GQA, fp32/fp16/bf16, causal and
// split-KV; upstream's slopes; bad input; record and replay; a torch-written upstream-format
// dump with one call per mode.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "api/attention_pos_encoding.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"

namespace flashinfer {
namespace {

enum class Mode { kRope, kAlibi };

const char* mode_name(Mode m) { return m == Mode::kRope ? "ROPE_LLAMA" : "ALIBI"; }

// 256 KiB: the plans here need at most 15600 bytes of partials (workspace_size()).
Tensor workspace() { return Tensor::empty({1 << 18}, DType::kUInt8); }

// Upstream's slopes written out independently: n = 2^floor(log2 H); 2^(-8k/n), k = 1..n, then
// 2^(-4k/n) for odd k < 2 (H - n).
std::vector<double> ref_slopes(int64_t heads) {
  const int64_t n = int64_t{1} << static_cast<int>(std::floor(std::log2(double(heads))));
  std::vector<double> m;
  for (int64_t k = 1; k <= n; ++k) m.push_back(std::pow(2.0, -8.0 * double(k) / double(n)));
  for (int64_t k = 1; k < 2 * (heads - n); k += 2) {
    m.push_back(std::pow(2.0, -4.0 * double(k) / double(n)));
  }
  return m;
}

// x [rows, heads, d] rotated in place, row r at position pos0 + r (llama: halves).
void ref_rope(std::vector<double>& x, int64_t rows, int64_t heads, int64_t d, int64_t pos0,
              double rope_scale, double rope_theta) {
  const int64_t half = d / 2;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      double* v = &x[static_cast<std::size_t>((r * heads + h) * d)];
      for (int64_t i = 0; i < half; ++i) {
        const double freq = std::pow(rope_theta, -2.0 * double(i) / double(d)) / rope_scale;
        const double a = double(pos0 + r) * freq;
        const double x0 = v[i], x1 = v[i + half];
        v[i] = x0 * std::cos(a) - x1 * std::sin(a);
        v[i + half] = x1 * std::cos(a) + x0 * std::sin(a);
      }
    }
  }
}

struct PosRef {
  Mode mode = Mode::kRope;
  double rope_scale = 1.0, rope_theta = 1e4;
  double sm_scale = 0.0;
  bool causal = false;
  // Soft cap c: c * tanh(x / c) of the scaled logit x; with ALiBi upstream's order,
  // c * tanh(sm_scale * (sm_scale * q.k + slope * (j - i)) / c).
  double soft_cap = 0.0;
  std::function<bool(int64_t, int64_t)> mask;  // keep(i, j), or empty
};

// One request: q [qo, Hq, D], k/v [kv, Hkv, D]. o [qo, Hq, D], lse base 2 [qo, Hq].
void ref_pos_attention(std::vector<double> q, std::vector<double> k, const std::vector<double>& v,
                       int64_t qo, int64_t kv, int64_t hq, int64_t hkv, int64_t d, const PosRef& r,
                       std::vector<double>& o, std::vector<double>& lse) {
  if (r.mode == Mode::kRope) {
    ref_rope(q, qo, hq, d, kv - qo, r.rope_scale, r.rope_theta);
    ref_rope(k, kv, hkv, d, 0, r.rope_scale, r.rope_theta);
  }
  const double scale = r.sm_scale > 0 ? r.sm_scale : 1.0 / std::sqrt(double(d));
  const std::vector<double> slopes = ref_slopes(hq);
  const int64_t group = hq / hkv;
  o.assign(static_cast<std::size_t>(qo * hq * d), 0.0);
  lse.assign(static_cast<std::size_t>(qo * hq), -std::numeric_limits<double>::infinity());
  std::vector<double> s(static_cast<std::size_t>(kv));
  for (int64_t i = 0; i < qo; ++i) {
    const int64_t pos = kv - qo + i;
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = h / group;
      const int64_t end = r.causal ? std::min(kv, pos + 1) : kv;
      if (end <= 0) continue;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < end; ++j) {
        if (r.mask && !r.mask(i, j)) {
          s[j] = -std::numeric_limits<double>::infinity();
          continue;
        }
        double dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += q[(i * hq + h) * d + e] * k[(j * hkv + g) * d + e];
        s[j] = dot * scale;
        if (r.mode == Mode::kAlibi) {
          s[j] += slopes[h] * double(j - i);
          if (r.soft_cap > 0) s[j] = r.soft_cap * std::tanh(scale * s[j] / r.soft_cap);
        } else if (r.soft_cap > 0) {
          s[j] = r.soft_cap * std::tanh(s[j] / r.soft_cap);
        }
        mx = std::max(mx, s[j]);
      }
      if (mx == -std::numeric_limits<double>::infinity()) continue;  // nothing visible
      double sum = 0;
      for (int64_t j = 0; j < end; ++j) sum += std::exp(s[j] - mx);
      for (int64_t j = 0; j < end; ++j) {
        const double p = std::exp(s[j] - mx) / sum;
        for (int64_t e = 0; e < d; ++e) o[(i * hq + h) * d + e] += p * v[(j * hkv + g) * d + e];
      }
      lse[i * hq + h] = (mx + std::log(sum)) / std::log(2.0);
    }
  }
}

// A rotated q/k in 16 bits (the prefill kernel's rounding) moves the LSE by more than fp32 noise.
testing::Tolerance lse_tolerance(DType d) {
  return d == DType::kFloat32 ? testing::Tolerance{1e-4, 1e-5} : testing::Tolerance{2e-2, 2e-2};
}

TEST(AttentionPosEncoding, AlibiSlopesAreUpstreams) {
  for (int64_t h : {1, 2, 4, 6, 8, 12, 32, 40}) {
    const std::vector<float> got = api::alibi_slopes(h);
    const std::vector<double> want = ref_slopes(h);
    ASSERT_EQ(got.size(), want.size()) << h;
    for (std::size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-7 * want[i]) << h << " heads, head " << i;
    }
  }
  // Hand-checked: 8 heads give 1/2, 1/4, ..., 1/256; 6 heads 1/4, 1/16, 1/64, 1/256 then
  // 2^-1, 2^-3 (the interleaved slopes of 8 heads).
  const std::vector<float> s8 = api::alibi_slopes(8);
  EXPECT_EQ(s8.front(), 0.5f);
  EXPECT_EQ(s8.back(), 1.0f / 256);
  EXPECT_EQ(api::alibi_slopes(6),
            (std::vector<float>{0.25f, 1.0f / 16, 1.0f / 64, 1.0f / 256, 0.5f, 0.125f}));
}

struct SingleCase {
  Mode mode;
  DType dtype;
  int64_t hq, hkv, qo, kv;  // qo 0: single decode
  bool causal;
  bool tensor_cores;
  double rope_scale, rope_theta;  // 0: default (not passed)
};

class SinglePos : public ::testing::TestWithParam<SingleCase> {};

TEST_P(SinglePos, MatchesFp64Formula) {
  const SingleCase c = GetParam();
  const int64_t d = 64;
  const bool decode = c.qo == 0;
  const int64_t qo = decode ? 1 : c.qo;
  Tensor q = testing::rand_tensor(decode ? Shape{c.hq, d} : Shape{qo, c.hq, d}, c.dtype, 1);
  Tensor k = testing::rand_tensor({c.kv, c.hkv, d}, c.dtype, 2);
  Tensor v = testing::rand_tensor({c.kv, c.hkv, d}, c.dtype, 3);
  std::optional<double> rs, rt;
  if (c.rope_scale > 0) rs = c.rope_scale;
  if (c.rope_theta > 0) rt = c.rope_theta;
  AttentionOutput r;
  if (decode) {
    r = single_decode_with_kv_cache(q, k, v, "NHD", mode_name(c.mode), c.tensor_cores, {}, {}, {},
                                    -1, {}, {}, rs, rt, /*return_lse=*/true);
  } else {
    r = single_prefill_with_kv_cache(q, k, v, {}, {}, {}, {}, {}, {}, c.causal, "NHD",
                                     mode_name(c.mode), false, {}, -1, {}, rs, rt, "auto",
                                     /*return_lse=*/true);
  }
  PosRef ref;
  ref.mode = c.mode;
  ref.rope_scale = rs.value_or(1.0);
  ref.rope_theta = rt.value_or(1e4);
  ref.causal = c.causal;
  std::vector<double> eo, el;
  ref_pos_attention(q.to_double_vector(), k.to_double_vector(), v.to_double_vector(), qo, c.kv,
                    c.hq, c.hkv, d, ref, eo, el);
  EXPECT_TRUE(testing::all_close(r.out, eo, testing::attention_tolerance(c.dtype)));
  EXPECT_TRUE(testing::all_close(r.lse, el, lse_tolerance(c.dtype)));
}

INSTANTIATE_TEST_SUITE_P(
    Grid, SinglePos,
    ::testing::Values(
        // Decode: fp32 exact, GQA 4, a long key range (angles up to 70 rad at theta 1e4).
        SingleCase{Mode::kRope, DType::kFloat32, 8, 2, 0, 70, false, false, 0, 0},
        SingleCase{Mode::kRope, DType::kFloat16, 4, 4, 0, 37, false, true, 2.0, 5e5},
        SingleCase{Mode::kRope, DType::kBFloat16, 8, 1, 0, 9, false, false, 0, 0},
        SingleCase{Mode::kAlibi, DType::kFloat32, 6, 2, 0, 40, false, false, 0, 0},
        SingleCase{Mode::kAlibi, DType::kFloat16, 8, 2, 0, 33, false, true, 0, 0},
        // Prefill: causal and not, GQA, rounding of the rotated q/k in 16 bits.
        SingleCase{Mode::kRope, DType::kFloat32, 4, 2, 5, 23, true, false, 0, 0},
        SingleCase{Mode::kRope, DType::kFloat16, 4, 2, 5, 23, false, false, 0, 0},
        SingleCase{Mode::kRope, DType::kBFloat16, 8, 2, 7, 7, true, false, 4.0, 1e6},
        SingleCase{Mode::kAlibi, DType::kFloat32, 4, 1, 6, 19, true, false, 0, 0},
        SingleCase{Mode::kAlibi, DType::kBFloat16, 6, 3, 4, 11, false, false, 0, 0},
        SingleCase{Mode::kAlibi, DType::kFloat16, 12, 4, 3, 30, true, false, 0, 0}));

struct BatchCase {
  Mode mode;
  DType dtype;
  int64_t hq, hkv;
  std::vector<int32_t> qo_lens;  // empty: batch decode (one query per request)
  std::vector<int32_t> kv_lens;
  std::optional<int64_t> fixed_split;
  bool ragged;
  double soft_cap = 0.0;
};

void check_batch(const BatchCase& c) {
  const int64_t d = 64, ps = 4;
  const bool decode = c.qo_lens.empty();
  const auto batch = static_cast<int64_t>(c.kv_lens.size());
  std::vector<int32_t> qo_lens = decode ? std::vector<int32_t>(batch, 1) : c.qo_lens;
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0};
  for (int64_t b = 0; b < batch; ++b) {
    qo_indptr.push_back(qo_indptr.back() + qo_lens[b]);
    kv_indptr.push_back(kv_indptr.back() + c.kv_lens[b]);
  }
  const int64_t rows = qo_indptr.back();
  Tensor q = testing::rand_tensor({rows, c.hq, d}, c.dtype, 11);
  std::vector<std::vector<double>> kd, vd;
  AttentionRunOptions ro;
  ro.return_lse = true;
  AttentionOutput r;
  if (c.ragged) {
    Tensor k = testing::rand_tensor({kv_indptr.back(), c.hkv, d}, c.dtype, 12);
    Tensor v = testing::rand_tensor({kv_indptr.back(), c.hkv, d}, c.dtype, 13);
    for (int64_t b = 0; b < batch; ++b) {
      kd.push_back(k.slice(0, kv_indptr[b], kv_indptr[b + 1]).to_double_vector());
      vd.push_back(v.slice(0, kv_indptr[b], kv_indptr[b + 1]).to_double_vector());
    }
    BatchPrefillWithRaggedKVCacheWrapper w(workspace());
    PrefillPlanOptions po;
    po.causal = true;
    po.pos_encoding_mode = mode_name(c.mode);
    po.q_data_type = c.dtype;
    po.fixed_split_size = c.fixed_split;
    if (c.soft_cap > 0) po.logits_soft_cap = c.soft_cap;
    w.plan(testing::int_tensor(qo_indptr), testing::int_tensor(kv_indptr), c.hq, c.hkv, d, po);
    r = w.run(q, k, v, ro);
  } else {
    testing::PagedFixture f =
        testing::make_paged(c.kv_lens, ps, c.hkv, d, c.dtype, false, false, 21, kd, vd);
    if (decode) {
      BatchDecodeWithPagedKVCacheWrapper w(workspace());
      BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
      po.pos_encoding_mode = mode_name(c.mode);
      po.q_data_type = c.dtype;
      po.fixed_split_size = c.fixed_split;
      if (c.soft_cap > 0) po.logits_soft_cap = c.soft_cap;
      w.plan(f.indptr, f.indices, f.last_page_len, c.hq, c.hkv, d, ps, po);
      if (c.fixed_split) {
        EXPECT_TRUE(w.split_kv());
      }
      r = w.run(q, f.cache(), ro);
    } else {
      BatchPrefillWithPagedKVCacheWrapper w(workspace());
      PrefillPlanOptions po;
      po.causal = true;
      po.pos_encoding_mode = mode_name(c.mode);
      po.q_data_type = c.dtype;
      po.fixed_split_size = c.fixed_split;
      if (c.soft_cap > 0) po.logits_soft_cap = c.soft_cap;
      w.plan(testing::int_tensor(qo_indptr), f.indptr, f.indices, f.last_page_len, c.hq, c.hkv, d,
             ps, po);
      if (c.fixed_split) {
        EXPECT_TRUE(w.split_kv());
      }
      r = w.run(q, f.cache(), ro);
    }
  }
  const auto qd = q.to_double_vector();
  PosRef ref;
  ref.mode = c.mode;
  ref.causal = true;
  ref.soft_cap = c.soft_cap;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<double> eo, el;
    ref_pos_attention(testing::rows_of(qd, qo_indptr[b], qo_indptr[b + 1], c.hq * d), kd[b], vd[b],
                      qo_lens[b], c.kv_lens[b], c.hq, c.hkv, d, ref, eo, el);
    EXPECT_TRUE(testing::all_close(r.out.slice(0, qo_indptr[b], qo_indptr[b + 1]), eo,
                                   testing::attention_tolerance(c.dtype)))
        << "request " << b;
    EXPECT_TRUE(testing::all_close(r.lse.slice(0, qo_indptr[b], qo_indptr[b + 1]), el,
                                   lse_tolerance(c.dtype)))
        << "request " << b;
  }
}

class BatchPos : public ::testing::TestWithParam<BatchCase> {};
TEST_P(BatchPos, MatchesFp64Formula) { check_batch(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Grid, BatchPos,
    ::testing::Values(
        // Batch decode: a 1-token request, a forced split of 2 pages (partials merged).
        BatchCase{Mode::kRope, DType::kFloat32, 4, 2, {}, {1, 9, 30}, 2, false},
        BatchCase{Mode::kRope, DType::kBFloat16, 8, 2, {}, {17, 5}, {}, false},
        BatchCase{Mode::kAlibi, DType::kFloat16, 4, 1, {}, {1, 9, 30}, 2, false},
        // Paged prefill, causal, split.
        BatchCase{Mode::kRope, DType::kFloat16, 4, 2, {2, 3, 1}, {5, 9, 30}, 2, false},
        BatchCase{Mode::kAlibi, DType::kFloat32, 6, 2, {2, 3, 1}, {5, 9, 30}, 2, false},
        // Ragged prefill (split in tokens).
        BatchCase{Mode::kRope, DType::kBFloat16, 4, 2, {3, 4}, {3, 21}, 8, true},
        BatchCase{Mode::kAlibi, DType::kFloat16, 8, 4, {3, 4}, {3, 21}, {}, true},
        // ALiBi with a soft cap (upstream's order: sm_scale twice), decode split, paged and
        // ragged prefill; RoPE with one.
        BatchCase{Mode::kAlibi, DType::kFloat32, 4, 2, {}, {1, 9, 30}, 2, false, 2.0},
        BatchCase{Mode::kAlibi, DType::kFloat16, 6, 2, {2, 3, 1}, {5, 9, 30}, 2, false, 3.0},
        BatchCase{Mode::kAlibi, DType::kBFloat16, 8, 4, {3, 4}, {3, 21}, {}, true, 1.5},
        BatchCase{Mode::kRope, DType::kFloat32, 4, 2, {3, 4}, {3, 21}, {}, true, 2.5}));

TEST(AttentionPosEncoding, NoneIsUnchangedAndModesDiffer) {
  // The modes change the answer (a test that could not fail otherwise), NONE is the plain op.
  Tensor q = testing::rand_tensor({4, 64}, DType::kFloat32, 31);
  Tensor k = testing::rand_tensor({20, 2, 64}, DType::kFloat32, 32);
  Tensor v = testing::rand_tensor({20, 2, 64}, DType::kFloat32, 33);
  const Tensor none = single_decode_with_kv_cache(q, k, v).out;
  const Tensor rope = single_decode_with_kv_cache(q, k, v, "NHD", "ROPE_LLAMA").out;
  const Tensor alibi = single_decode_with_kv_cache(q, k, v, "NHD", "ALIBI").out;
  EXPECT_FALSE(testing::same_values(Value(none), Value(rope)));
  EXPECT_FALSE(testing::same_values(Value(none), Value(alibi)));
  // rope_scale / rope_theta matter only for ROPE_LLAMA.
  const Tensor none2 =
      single_decode_with_kv_cache(q, k, v, "NHD", "NONE", false, {}, {}, {}, -1, {}, {}, 3.0, 7.0)
          .out;
  EXPECT_TRUE(testing::same_values(Value(none), Value(none2)));
}

TEST(AttentionPosEncoding, BadInput) {
  const char* dec = "single_decode_with_kv_cache";
  const char* pre = "single_prefill_with_kv_cache";
  Tensor q = Tensor::zeros({4, 64}, DType::kFloat16);
  Tensor k = Tensor::zeros({6, 2, 64}, DType::kFloat16);
  Tensor q3 = Tensor::zeros({3, 4, 64}, DType::kFloat16);
  // Unknown mode: invalid argument.
  try {
    single_decode_with_kv_cache(q, k, k, "NHD", "ROPE");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(e.arg(), "pos_encoding_mode");
  }
  EXPECT_FI_ERROR(
      single_prefill_with_kv_cache(q3, k, k, {}, {}, {}, {}, {}, {}, false, "NHD", "rope_llama"),
      pre, "pos_encoding_mode");
  // rope_scale / rope_theta must be positive and finite with ROPE_LLAMA.
  EXPECT_FI_ERROR(
      single_decode_with_kv_cache(q, k, k, "NHD", "ROPE_LLAMA", false, {}, {}, {}, -1, {}, {}, 0.0),
      dec, "rope_scale");
  EXPECT_FI_ERROR(single_decode_with_kv_cache(q, k, k, "NHD", "ROPE_LLAMA", false, {}, {}, {}, -1,
                                              {}, {}, {}, -1.0),
                  dec, "rope_theta");
  // RoPE with an fp8 cache: the decode kernel takes it, the prefill kernel (upstream: 16-bit K
  // only) does not.
  Tensor k8 = testing::rand_tensor({6, 2, 64}, DType::kFloat8E4M3FN, 5);
  EXPECT_NO_THROW(single_decode_with_kv_cache(q, k8, k8, "NHD", "ROPE_LLAMA"));
  try {
    single_decode_with_kv_cache(q, k8, k8, "NHD", "ROPE_LLAMA", /*use_tensor_cores=*/true);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_EQ(e.arg(), "pos_encoding_mode");
  }
  EXPECT_FI_ERROR(
      single_prefill_with_kv_cache(q3, k8, k8, {}, {}, {}, {}, {}, {}, false, "NHD", "ROPE_LLAMA"),
      pre, "pos_encoding_mode");
  // The cascade levels are prefill wrappers: RoPE with an fp8 cache is refused there too
  // (kUnsupported).
  MultiLevelCascadeAttentionWrapper cw(1, workspace());
  try {
    cw.plan({testing::int_tensor({0, 1})}, {testing::int_tensor({0, 1})},
            {testing::int_tensor({0})}, {testing::int_tensor({1})}, 4, 2, 64, 4, false,
            "ROPE_LLAMA", false, {}, -1, {}, {}, {}, DType::kFloat16, DType::kFloat8E4M3FN);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_EQ(e.arg(), "pos_encoding_mode");
  }
  EXPECT_FI_ERROR(
      cw.plan({testing::int_tensor({0, 1})}, {testing::int_tensor({0, 1})},
              {testing::int_tensor({0})}, {testing::int_tensor({1})}, 4, 2, 64, 4, false, "ROPE"),
      "MultiLevelCascadeAttentionWrapper.plan", "pos_encoding_mode");
  PODWithPagedKVCacheWrapper pw(workspace());
  EXPECT_FI_ERROR(
      pw.plan(testing::int_tensor({0, 1}), testing::int_tensor({0}), testing::int_tensor({1}), 4, 2,
              64, 4, "ROPE_LLAMA", -1, DType::kFloat16, {}, {}, {}, -2.0),
      "PODWithPagedKVCacheWrapper.plan", "rope_scale");
}

// ---- MultiLevelCascadeAttentionWrapper and the POD wrappers with a positional encoding.

// A paged fp16 NHD cache [pages, ps, Hkv, D] and its values in fp64.
struct PosCache {
  int64_t ps = 0, hkv = 0, d = 0;
  Tensor k, v;
  std::vector<double> kd, vd;
  // Tokens [0, len) of the pages `pages`, as [len, Hkv, D].
  std::vector<double> gather(const std::vector<double>& x, const std::vector<int32_t>& pages,
                             int64_t len) const {
    std::vector<double> out;
    const int64_t row = hkv * d;
    for (int64_t t = 0; t < len; ++t) {
      const int64_t at = (pages[t / ps] * ps + t % ps) * row;
      out.insert(out.end(), x.begin() + at, x.begin() + at + row);
    }
    return out;
  }
};
PosCache pos_cache(int64_t pages, int64_t ps, int64_t hkv, int64_t d, uint64_t seed) {
  PosCache c;
  c.ps = ps;
  c.hkv = hkv;
  c.d = d;
  c.k = testing::rand_tensor({pages, ps, hkv, d}, DType::kFloat16, seed, -1.0, 1.0);
  c.v = testing::rand_tensor({pages, ps, hkv, d}, DType::kFloat16, seed + 1, -1.0, 1.0);
  c.kd = c.k.to_double_vector();
  c.vd = c.v.to_double_vector();
  return c;
}

struct PagedReq {
  std::vector<int32_t> pages;
  int64_t qo = 1, kv = 1;
};

// The fp64 (o, lse) of a batch of requests over `c`, q rows in request order.
void ref_paged(const std::vector<double>& q, const PosCache& c, const std::vector<PagedReq>& reqs,
               int64_t hq, const PosRef& r, std::vector<double>& o, std::vector<double>& lse) {
  o.clear();
  lse.clear();
  int64_t row = 0;
  for (const PagedReq& b : reqs) {
    std::vector<double> ob, lb;
    ref_pos_attention(testing::rows_of(q, row, row + b.qo, hq * c.d), c.gather(c.kd, b.pages, b.kv),
                      c.gather(c.vd, b.pages, b.kv), b.qo, b.kv, hq, c.hkv, c.d, r, ob, lb);
    o.insert(o.end(), ob.begin(), ob.end());
    lse.insert(lse.end(), lb.begin(), lb.end());
    row += b.qo;
  }
}

struct Table3 {
  Tensor qo, indptr, indices, last;
};
Table3 table3(const std::vector<PagedReq>& reqs, int64_t ps) {
  std::vector<int32_t> qo{0}, indptr{0}, indices, last;
  for (const PagedReq& b : reqs) {
    qo.push_back(qo.back() + static_cast<int32_t>(b.qo));
    indices.insert(indices.end(), b.pages.begin(), b.pages.end());
    indptr.push_back(static_cast<int32_t>(indices.size()));
    last.push_back(static_cast<int32_t>(b.kv - (static_cast<int64_t>(b.pages.size()) - 1) * ps));
  }
  return {testing::int_tensor(qo), testing::int_tensor(indptr), testing::int_tensor(indices),
          testing::int_tensor(last)};
}

class CascadePos : public ::testing::TestWithParam<Mode> {};

// Upstream plans every level's BatchPrefillWithPagedKVCacheWrapper with the same
// pos_encoding_mode (cascade.py): each level attends at its own positions (query i of a
// level's request at kv_len - qo_len + i), causal on the last level only, soft cap 4 on every
// level; the levels' states merge as (o_a 2^lse_a + o_b 2^lse_b) / (2^lse_a + 2^lse_b).
TEST_P(CascadePos, MatchesFp64PerLevelThenMerged) {
  const Mode m = GetParam();
  const int64_t hq = 4, hkv = 2, d = 64, ps = 4;
  const PosCache c = pos_cache(8, ps, hkv, d, 61);
  const std::vector<PagedReq> shared = {{{5, 1}, 5, 8}};               // all 5 rows, 8 tokens
  const std::vector<PagedReq> unique = {{{2}, 2, 3}, {{0, 7}, 3, 6}};  // per request
  const Tensor q = testing::rand_tensor({5, hq, d}, DType::kFloat16, 62, -1.0, 1.0);
  const Table3 t0 = table3(shared, ps), t1 = table3(unique, ps);
  MultiLevelCascadeAttentionWrapper w(2, workspace());
  w.plan({t0.qo, t1.qo}, {t0.indptr, t1.indptr}, {t0.indices, t1.indices}, {t0.last, t1.last}, hq,
         hkv, d, ps, /*causal=*/true, mode_name(m), false, {}, -1, /*logits_soft_cap=*/4.0, 2.0,
         5e5);
  const Tensor out = w.run(q, PagedKVCache(c.k, c.v));
  PosRef r;
  r.mode = m;
  r.rope_scale = 2.0;
  r.rope_theta = 5e5;
  r.soft_cap = 4.0;
  std::vector<double> oa, la, ob, lb;
  const std::vector<double> qd = q.to_double_vector();
  ref_paged(qd, c, shared, hq, r, oa, la);
  r.causal = true;
  ref_paged(qd, c, unique, hq, r, ob, lb);
  std::vector<double> want(oa.size());
  for (std::size_t i = 0; i < la.size(); ++i) {
    const double mx = std::max(la[i], lb[i]);
    const double wa = std::exp2(la[i] - mx), wb = std::exp2(lb[i] - mx);
    for (int64_t e = 0; e < d; ++e) {
      want[i * d + e] = (oa[i * d + e] * wa + ob[i * d + e] * wb) / (wa + wb);
    }
  }
  EXPECT_TRUE(testing::all_close(out, want, lse_tolerance(DType::kFloat16)));
}

INSTANTIATE_TEST_SUITE_P(Modes, CascadePos, ::testing::Values(Mode::kRope, Mode::kAlibi),
                         [](const auto& i) { return std::string(mode_name(i.param)); });

class PodPos : public ::testing::TestWithParam<Mode> {};

// POD's decode part takes plan's pos_encoding_mode / rope_scale / rope_theta (upstream pod.py:
// pos_encoding_mode_d = self._pos_encoding_mode), each query at position kv_len - 1; the prefill
// part its own run(pos_encoding_mode_p=). BatchPOD plans both parts with plan's mode.
TEST_P(PodPos, DecodeAndBatchPartsMatchFp64) {
  const Mode m = GetParam();
  const int64_t hq = 4, hkv = 2, d = 64, ps = 4;
  const PosCache c = pos_cache(8, ps, hkv, d, 71);
  const std::vector<PagedReq> dec = {{{3, 6}, 1, 7}, {{1}, 1, 2}};
  const std::vector<PagedReq> pre = {{{0, 4}, 3, 5}, {{7, 2, 5}, 2, 10}};
  const Table3 td = table3(dec, ps), tp = table3(pre, ps);
  const Tensor qd = testing::rand_tensor({2, hq, d}, DType::kFloat16, 72, -1.0, 1.0);
  const Tensor qp = testing::rand_tensor({5, hq, d}, DType::kFloat16, 73, -1.0, 1.0);
  const Tensor kp = testing::rand_tensor({6, hkv, d}, DType::kFloat16, 74, -1.0, 1.0);
  PosRef r;
  r.mode = m;
  r.rope_theta = 3e4;
  r.sm_scale = 0.1;
  std::vector<double> want_d, want_p, lse;
  ref_paged(qd.to_double_vector(), c, dec, hq, r, want_d, lse);
  const testing::Tolerance tol = lse_tolerance(DType::kFloat16);

  PODWithPagedKVCacheWrapper w(workspace());
  w.plan(td.indptr, td.indices, td.last, hq, hkv, d, ps, mode_name(m), -1, DType::kFloat16, {}, {},
         0.1, {}, 3e4);
  const PodOutput o = w.run(qp.slice(0, 0, 3), kp, kp, qd, PagedKVCache(c.k, c.v));
  EXPECT_TRUE(testing::all_close(o.out_d, want_d, tol));

  BatchPODWithPagedKVCacheWrapper b(workspace());
  b.plan(tp.qo, tp.indptr, tp.indices, tp.last, td.qo, td.indptr, td.indices, td.last, hq, hkv, d,
         ps, mode_name(m), -1, DType::kFloat16, {}, {}, 0.1, {}, 3e4);
  const PodOutput bo = b.run(qp, PagedKVCache(c.k, c.v), qd, PagedKVCache(c.k, c.v), {}, {}, true);
  r.causal = true;
  ref_paged(qp.to_double_vector(), c, pre, hq, r, want_p, lse);
  EXPECT_TRUE(testing::all_close(bo.out_d, want_d, tol));
  EXPECT_TRUE(testing::all_close(bo.out_p, want_p, tol));
}

INSTANTIATE_TEST_SUITE_P(Modes, PodPos, ::testing::Values(Mode::kRope, Mode::kAlibi),
                         [](const auto& i) { return std::string(mode_name(i.param)); });

TEST(AttentionPosEncoding, RecordAndReplay) {
  std::vector<testing::RecordingObserver::Call> calls;
  {
    testing::RecordingScope scope;
    Tensor q = testing::rand_tensor({4, 64}, DType::kFloat16, 41);
    Tensor k = testing::rand_tensor({10, 2, 64}, DType::kFloat16, 42);
    single_decode_with_kv_cache(q, k, k, "NHD", "ALIBI");
    Tensor q3 = testing::rand_tensor({3, 4, 64}, DType::kBFloat16, 43);
    Tensor kb = testing::rand_tensor({10, 2, 64}, DType::kBFloat16, 44);
    single_prefill_with_kv_cache(q3, kb, kb, {}, {}, {}, {}, {}, {}, true, "NHD", "ROPE_LLAMA",
                                 false, {}, -1, {}, 2.0, 5e5);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 2u);
  // The mode is recorded as upstream records it: the string argument (single_prefill's 12th
  // parameter), rope_scale / rope_theta as floats.
  ASSERT_EQ(calls[1].name, "single_prefill_with_kv_cache");
  ASSERT_GT(calls[1].inputs.size(), 17u);
  EXPECT_EQ(calls[1].inputs[11].as_string(), "ROPE_LLAMA");
  EXPECT_EQ(calls[1].inputs[16].as_float(), 2.0);
  EXPECT_EQ(calls[1].inputs[17].as_float(), 5e5);
  for (const auto& call : calls) EXPECT_TRUE(testing::replays_identically(call));
}

// Cascade and POD plans with a mode, through the Flight Recorder and replay_sequence (objects
// rebuilt from __init__, the mode recorded as the string argument).
TEST(AttentionPosEncoding, CascadeAndPodRecordAndReplay) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("fi_attn_pos_rec_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    recorder::Config cfg;
    cfg.dump_dir = dir.string();
    recorder::start(cfg, [](const std::string&) {});
    const PosCache c = pos_cache(8, 4, 2, 64, 81);
    const Table3 t0 = table3({{{5, 1}, 5, 8}}, 4), t1 = table3({{{2}, 2, 3}, {{0, 7}, 3, 6}}, 4);
    MultiLevelCascadeAttentionWrapper w(2, workspace());
    w.plan({t0.qo, t1.qo}, {t0.indptr, t1.indptr}, {t0.indices, t1.indices}, {t0.last, t1.last}, 4,
           2, 64, 4, true, "ROPE_LLAMA", false, {}, -1, {}, {}, 2e4);
    w.run(testing::rand_tensor({5, 4, 64}, DType::kFloat16, 82, -1.0, 1.0), PagedKVCache(c.k, c.v));
    PODWithPagedKVCacheWrapper p(workspace());
    p.plan(t1.indptr, t1.indices, t1.last, 4, 2, 64, 4, "ALIBI");
    const Tensor kp = testing::rand_tensor({4, 2, 64}, DType::kFloat16, 83, -1.0, 1.0);
    p.run(testing::rand_tensor({3, 4, 64}, DType::kFloat16, 84, -1.0, 1.0), kp, kp,
          testing::rand_tensor({2, 4, 64}, DType::kFloat16, 85, -1.0, 1.0), PagedKVCache(c.k, c.v));
    recorder::stop();
  }
  testing::replay_expecting_every_call_to_pass(dir, 6u);
  fs::remove_all(dir);
}

// Written by Python as upstream's recorder writes the calls: single_decode_with_kv_cache with
// pos_encoding_mode="ALIBI", single_prefill_with_kv_cache with "ROPE_LLAMA" (rope_theta given),
// a ragged prefill wrapper planned with "ROPE_LLAMA" (one self_id), a POD wrapper planned
// with "ALIBI" (its decode part), and a BlockSparseAttentionWrapper planned with "ROPE_LLAMA";
// expected outputs from torch in fp64 with upstream's slopes and positions.
TEST(AttentionPosEncoding, UpstreamWrittenDumpReplays) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_attn_pos_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string py = R"PY(
import json, math, os, sys
try:
    import torch
except ImportError:
    sys.exit(77)
root = sys.argv[1]
torch.manual_seed(7)
SELF = 140234567890777
def ser(v):
    if isinstance(v, torch.dtype):
        return {"type": "torch.dtype", "value": str(v)}
    return v
def write(seq, name, module, inputs, meta, outputs, self_obj=False):
    d = os.path.join(root, "20261122_233000_%03d_pid4242_%s_call%04d" % (seq, name, seq))
    os.makedirs(d)
    torch.save(inputs, d + "/inputs.pt")
    tensors = {k: x for k, x in outputs.items() if x is not None}
    torch.save(tensors, d + "/outputs.pt")
    rec = {"function_name": name, "module": module, "call_sequence": seq,
           "timestamp": "20261122_233000_%03d" % seq, "process_id": 4242,
           "input_metadata": meta,
           "output_metadata": {k: None for k, x in outputs.items() if x is None},
           "tensor_info": {"input_tensor_keys": list(inputs), "output_tensor_keys": list(tensors)},
           "tensor_format": "torch", "execution_status": "completed"}
    if self_obj:
        rec["self_id"] = SELF
        rec["input_metadata"] = dict(meta, arg_0={
            "type": "BatchPrefillWithRaggedKVCacheWrapper",
            "repr": "<flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper object at 0x%x>" % SELF})
    with open(d + "/metadata.jsonl", "w") as f:
        f.write(json.dumps(rec) + "\n")

def slopes(n_heads):
    n = 2 ** math.floor(math.log2(n_heads))
    m = [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]
    m += [2.0 ** (-4.0 * k / n) for k in range(1, 2 * (n_heads - n), 2)]
    return torch.tensor(m, dtype=torch.float64)
def rope(x, pos, theta=1e4, scale=1.0):
    d = x.shape[-1]
    freq = theta ** (-torch.arange(0, d // 2, dtype=torch.float64) * 2 / d) / scale
    a = pos.double()[:, None] * freq[None, :]
    c, s = torch.cos(a)[:, None, :], torch.sin(a)[:, None, :]
    x0, x1 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x0 * c - x1 * s, x1 * c + x0 * s], -1)
def attend(q, k, v, causal, bias=None):
    # q [qo, H, D], k/v [kv, HKV, D] in fp64; bias [H, qo, kv] or None.
    qo, H, D = q.shape
    kv, HKV = k.shape[0], k.shape[1]
    k = k.repeat_interleave(H // HKV, 1)
    v = v.repeat_interleave(H // HKV, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(D)
    if bias is not None:
        s = s + bias
    if causal:
        keep = torch.ones(qo, kv, dtype=torch.bool).tril(kv - qo)
        s = s.masked_fill(~keep, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v)

# single_decode_with_kv_cache(q, k, v, pos_encoding_mode="ALIBI"), GQA 8/2.
H, HKV, D, KV = 8, 2, 64, 21
q = torch.randn(H, D).half()
k = torch.randn(KV, HKV, D).half()
v = torch.randn(KV, HKV, D).half()
bias = slopes(H)[:, None, None] * torch.arange(KV, dtype=torch.float64)[None, None, :]
out = attend(q[None].double(), k.double(), v.double(), False, bias)[0]
write(1, "single_decode_with_kv_cache", "flashinfer.decode",
      {"arg_0": q, "arg_1": k, "arg_2": v}, {"kwarg_pos_encoding_mode": "ALIBI"},
      {"result": out.half()})

# single_prefill_with_kv_cache(q, k, v, causal=True, pos_encoding_mode="ROPE_LLAMA",
# rope_theta=5e5): q at kv_len - qo_len + i, key j at j.
QO, KV = 5, 13
q = torch.randn(QO, H, D).half()
k = torch.randn(KV, HKV, D).half()
v = torch.randn(KV, HKV, D).half()
qr = rope(q.double(), torch.arange(KV - QO, KV), theta=5e5)
kr = rope(k.double(), torch.arange(KV), theta=5e5)
out = attend(qr, kr, v.double(), True)
write(2, "single_prefill_with_kv_cache", "flashinfer.prefill",
      {"arg_0": q, "arg_1": k, "arg_2": v},
      {"kwarg_causal": True, "kwarg_pos_encoding_mode": "ROPE_LLAMA", "kwarg_rope_theta": 5e5},
      {"result": out.half()})

# BatchPrefillWithRaggedKVCacheWrapper: plan(..., causal=True, pos_encoding_mode="ROPE_LLAMA"),
# run(q, k, v).
write(3, "BatchPrefillWithRaggedKVCacheWrapper.__init__", "flashinfer.prefill",
      {"arg_1": torch.zeros(1 << 16, dtype=torch.uint8)}, {"arg_2": "NHD"}, {"result": None},
      self_obj=True)
qlens, kvlens = [2, 3], [4, 9]
qo_indptr = torch.tensor([0, 2, 5], dtype=torch.int32)
kv_indptr = torch.tensor([0, 4, 13], dtype=torch.int32)
write(4, "BatchPrefillWithRaggedKVCacheWrapper.plan", "flashinfer.prefill",
      {"arg_1": qo_indptr, "arg_2": kv_indptr},
      {"arg_3": H, "arg_4": HKV, "arg_5": D, "kwarg_causal": True,
       "kwarg_pos_encoding_mode": "ROPE_LLAMA", "kwarg_q_data_type": ser(torch.float16)},
      {"result": None}, self_obj=True)
q = torch.randn(5, H, D).half()
k = torch.randn(13, HKV, D).half()
v = torch.randn(13, HKV, D).half()
outs = []
for b in range(2):
    qb = q[qo_indptr[b]:qo_indptr[b + 1]].double()
    kb = k[kv_indptr[b]:kv_indptr[b + 1]].double()
    vb = v[kv_indptr[b]:kv_indptr[b + 1]].double()
    qb = rope(qb, torch.arange(kvlens[b] - qlens[b], kvlens[b]))
    kb = rope(kb, torch.arange(kvlens[b]))
    outs.append(attend(qb, kb, vb, True))
write(5, "BatchPrefillWithRaggedKVCacheWrapper.run", "flashinfer.prefill",
      {"arg_1": q, "arg_2": k, "arg_3": v}, {}, {"result": torch.cat(outs).half()}, self_obj=True)

# PODWithPagedKVCacheWrapper planned with pos_encoding_mode="ALIBI" (its decode part: upstream's
# run takes pos_encoding_mode_d from plan), run(q_p, k_p, v_p, q_d, (k_cache, v_cache)) with the
# prefill part's defaults (NONE, not causal); returns (out_p, out_d).
POD = 140234567890888
def write_pod(seq, name, inputs, meta, outputs):
    d = os.path.join(root, "20261122_233000_%03d_pid4242_%s_call%04d" % (seq, name, seq))
    os.makedirs(d)
    torch.save(inputs, d + "/inputs.pt")
    tensors = {k: x for k, x in outputs.items() if x is not None}
    torch.save(tensors, d + "/outputs.pt")
    rec = {"function_name": name, "module": "flashinfer.pod", "call_sequence": seq,
           "timestamp": "20261122_233000_%03d" % seq, "process_id": 4242,
           "input_metadata": dict(meta, arg_0={"type": "PODWithPagedKVCacheWrapper",
               "repr": "<flashinfer.pod.PODWithPagedKVCacheWrapper object at 0x%x>" % POD}),
           "output_metadata": {k: None for k, x in outputs.items() if x is None},
           "tensor_info": {"input_tensor_keys": list(inputs), "output_tensor_keys": list(tensors)},
           "tensor_format": "torch", "execution_status": "completed", "self_id": POD}
    with open(d + "/metadata.jsonl", "w") as f:
        f.write(json.dumps(rec) + "\n")
PS = 4
kc = torch.randn(4, PS, HKV, D).half()
vc = torch.randn(4, PS, HKV, D).half()
pages, lens = [[3, 0], [2]], [7, 2]
write_pod(6, "PODWithPagedKVCacheWrapper.__init__", {"arg_1": torch.zeros(4096, dtype=torch.uint8)},
          {"arg_2": "NHD"}, {"result": None})
write_pod(7, "PODWithPagedKVCacheWrapper.plan",
          {"arg_1": torch.tensor([0, 2, 3], dtype=torch.int32),
           "arg_2": torch.tensor([3, 0, 2], dtype=torch.int32),
           "arg_3": torch.tensor([3, 2], dtype=torch.int32)},
          {"arg_4": H, "arg_5": HKV, "arg_6": D, "arg_7": PS, "kwarg_pos_encoding_mode": "ALIBI"},
          {"result": None})
qd = torch.randn(2, H, D).half()
qp = torch.randn(3, H, D).half()
kp = torch.randn(5, HKV, D).half()
vp = torch.randn(5, HKV, D).half()
out_d = []
for b in range(2):
    kb = torch.cat([kc[p] for p in pages[b]])[: lens[b]].double()
    vb = torch.cat([vc[p] for p in pages[b]])[: lens[b]].double()
    bias = slopes(H)[:, None, None] * torch.arange(lens[b], dtype=torch.float64)[None, None, :]
    out_d.append(attend(qd[b : b + 1].double(), kb, vb, False, bias))
out_p = attend(qp.double(), kp.double(), vp.double(), False)
write_pod(8, "PODWithPagedKVCacheWrapper.run",
          {"arg_1": qp, "arg_2": kp, "arg_3": vp, "arg_4": qd, "arg_5__0": kc, "arg_5__1": vc},
          {"arg_5": {"type": "tuple", "length": 2, "truncated": False,
                     "items": [{"type": "torch.Tensor", "tensor_key": "arg_5__0"},
                               {"type": "torch.Tensor", "tensor_key": "arg_5__1"}]}},
          {"result_0": out_p.half(), "result_1": torch.cat(out_d).half()})

# BlockSparseAttentionWrapper planned with pos_encoding_mode="ROPE_LLAMA", rope_theta=2e4 (the
# prefill kernel: R * group = 8): block row i is a request over its blocks' keys gathered in
# indices order, query r at kv - rows + r, gathered key j at j (upstream's sparse.py plan).
BSR = 140234567890999
def write_bsr(seq, name, inputs, meta, outputs):
    d = os.path.join(root, "20261122_233000_%03d_pid4242_%s_call%04d" % (seq, name, seq))
    os.makedirs(d)
    torch.save(inputs, d + "/inputs.pt")
    torch.save({k: x for k, x in outputs.items() if x is not None}, d + "/outputs.pt")
    rec = {"function_name": name, "module": "flashinfer.sparse", "call_sequence": seq,
           "timestamp": "20261122_233000_%03d" % seq, "process_id": 4242,
           "input_metadata": dict(meta, arg_0={"type": "BlockSparseAttentionWrapper",
               "repr": "<flashinfer.sparse.BlockSparseAttentionWrapper object at 0x%x>" % BSR}),
           "output_metadata": {k: None for k, x in outputs.items() if x is None},
           "tensor_info": {"input_tensor_keys": list(inputs),
                           "output_tensor_keys": [k for k, x in outputs.items() if x is not None]},
           "tensor_format": "torch", "execution_status": "completed", "self_id": BSR}
    with open(d + "/metadata.jsonl", "w") as f:
        f.write(json.dumps(rec) + "\n")
R, C, M, N = 2, 3, 5, 9
indptr = [0, 2, 3, 5]
indices = [2, 0, 1, 0, 2]
write_bsr(9, "BlockSparseAttentionWrapper.__init__",
          {"arg_1": torch.zeros(4096, dtype=torch.uint8)}, {}, {"result": None})
write_bsr(10, "BlockSparseAttentionWrapper.plan",
          {"arg_1": torch.tensor(indptr, dtype=torch.int32),
           "arg_2": torch.tensor(indices, dtype=torch.int32)},
          {"arg_3": M, "arg_4": N, "arg_5": R, "arg_6": C, "arg_7": H, "arg_8": HKV, "arg_9": D,
           "kwarg_pos_encoding_mode": "ROPE_LLAMA", "kwarg_rope_theta": 2e4}, {"result": None})
q = torch.randn(M, H, D).half()
k = torch.randn(N, HKV, D).half()
v = torch.randn(N, HKV, D).half()
outs = []
for i in range(3):
    r0, r1 = i * R, min((i + 1) * R, M)
    cols = indices[indptr[i]:indptr[i + 1]]
    kb = torch.cat([k[c * C:(c + 1) * C] for c in cols]).double()
    vb = torch.cat([v[c * C:(c + 1) * C] for c in cols]).double()
    kv = kb.shape[0]
    qb = rope(q[r0:r1].double(), torch.arange(kv - (r1 - r0), kv), theta=2e4)
    outs.append(attend(qb, rope(kb, torch.arange(kv), theta=2e4), vb, False))
write_bsr(11, "BlockSparseAttentionWrapper.run", {"arg_1": q, "arg_2": k, "arg_3": v}, {},
          {"result": torch.cat(outs).half()})
)PY";
  if (!testing::run_dump_script(dir, py, dir / "dump", 11u)) {
    GTEST_SKIP() << "python3-torch not installed";
  }
}

// ---- ALiBi with a logits soft cap.

// Hand-checked: one head (slope 2^-8), D 16, q = e0, keys 0 and 2 e0, values 0 and 1, sm_scale
// 0.5, cap 1, decode (query index 0). Upstream's order gives logit_1 = tanh(0.5 * (0.5 * 2 +
// 1/256)) = tanh(0.501953125) = 0.4636518..., logit_0 = 0: o = sigmoid(logit_1) = 0.61388013 in
// every column and lse = log2(1 + e^logit_1) = 1.37287928. (The pre-2025 kernels' order,
// tanh(sm_scale q.k / cap + log2e slope j), would give 0.6822.)
TEST(AttentionPosEncoding, AlibiWithSoftCapHandChecked) {
  Tensor q = Tensor::zeros({1, 16}, DType::kFloat32);
  Tensor k = Tensor::zeros({2, 1, 16}, DType::kFloat32);
  Tensor v = Tensor::zeros({2, 1, 16}, DType::kFloat32);
  q.data<float>()[0] = 1.0f;
  k.data<float>()[16] = 2.0f;
  for (int i = 16; i < 32; ++i) v.data<float>()[i] = 1.0f;
  const AttentionOutput r = single_decode_with_kv_cache(q, k, v, "NHD", "ALIBI", false, {}, {}, {},
                                                        -1, 1.0, 0.5, {}, {}, true);
  EXPECT_TRUE(testing::all_close(r.out, std::vector<double>(16, 0.6138801264759628), {1e-6, 0}));
  EXPECT_TRUE(testing::all_close(r.lse, std::vector<double>{1.372879283428871}, {1e-6, 0}));
}

struct CapCase {
  DType dtype;
  int64_t hq, hkv, qo, kv;  // qo 0: single decode
  bool causal, tensor_cores;
  double cap, sm_scale;
};

class AlibiSoftCap : public ::testing::TestWithParam<CapCase> {};

TEST_P(AlibiSoftCap, SingleOpsMatchFp64Formula) {
  const CapCase c = GetParam();
  const int64_t d = 64;
  const bool decode = c.qo == 0;
  const int64_t qo = decode ? 1 : c.qo;
  Tensor q = testing::rand_tensor(decode ? Shape{c.hq, d} : Shape{qo, c.hq, d}, c.dtype, 91);
  Tensor k = testing::rand_tensor({c.kv, c.hkv, d}, c.dtype, 92);
  Tensor v = testing::rand_tensor({c.kv, c.hkv, d}, c.dtype, 93);
  AttentionOutput r;
  if (decode) {
    r = single_decode_with_kv_cache(q, k, v, "NHD", "ALIBI", c.tensor_cores, {}, {}, {}, -1, c.cap,
                                    c.sm_scale, {}, {}, true);
  } else {
    r = single_prefill_with_kv_cache(q, k, v, {}, {}, {}, {}, {}, {}, c.causal, "NHD", "ALIBI",
                                     false, c.sm_scale, -1, c.cap, {}, {}, "auto", true);
  }
  PosRef ref;
  ref.mode = Mode::kAlibi;
  ref.causal = c.causal;
  ref.soft_cap = c.cap;
  ref.sm_scale = c.sm_scale;
  std::vector<double> eo, el;
  ref_pos_attention(q.to_double_vector(), k.to_double_vector(), v.to_double_vector(), qo, c.kv,
                    c.hq, c.hkv, d, ref, eo, el);
  EXPECT_TRUE(testing::all_close(r.out, eo, testing::attention_tolerance(c.dtype)));
  EXPECT_TRUE(testing::all_close(r.lse, el, lse_tolerance(c.dtype)));
}

INSTANTIATE_TEST_SUITE_P(
    Grid, AlibiSoftCap,
    ::testing::Values(CapCase{DType::kFloat32, 6, 2, 0, 23, false, false, 5.0, 0.3},
                      CapCase{DType::kFloat16, 4, 4, 0, 17, false, true, 2.0, 0.125},
                      CapCase{DType::kBFloat16, 8, 2, 5, 17, true, false, 3.0, 0.2},
                      CapCase{DType::kFloat32, 3, 1, 4, 9, false, false, 0.5, 1.0}));

// ---- Block-sparse wrappers with a positional encoding.

// Upstream's fa2 plan (flashinfer/sparse.py) makes block row i a request of its rows over the
// C-key pages of its blocks (in indices order), so query r of a block row sits at kv - rows + r
// and gathered key j at j, kv = nnz_row * C; ALiBi's slopes come from num_qo_heads.
struct BsrPosCase {
  Mode mode;
  DType q, kv;
  int64_t M, N, R, C, hq, hkv;
  bool causal, with_mask;
  double soft_cap;
  std::optional<double> rope_scale, rope_theta;
};

void check_bsr_pos(const BsrPosCase& c, uint64_t seed) {
  const int64_t d = 64, mb = (c.M + c.R - 1) / c.R, nb = c.N / c.C;
  std::vector<int32_t> ip{0}, ix;
  for (int64_t i = 0; i < mb; ++i) {
    if (i % 3 == 1) {
      ix.insert(ix.end(), {static_cast<int32_t>(nb - 1), 0});  // unordered
    } else if (i % 3 == 2) {
      ix.push_back(static_cast<int32_t>(i % nb));
    } else {
      for (int32_t j = 0; j < nb; ++j) ix.push_back(j);
    }
    ip.push_back(static_cast<int32_t>(ix.size()));
  }
  const auto nnz = static_cast<int64_t>(ix.size());
  auto keep = [](int64_t blk, int64_t r, int64_t col) { return (blk + 2 * r + 3 * col) % 5 != 0; };
  std::optional<Tensor> mask;
  if (c.with_mask) {
    Tensor m = Tensor::empty({nnz, c.R, c.C}, DType::kBool);
    for (int64_t b = 0; b < nnz; ++b) {
      for (int64_t r = 0; r < c.R; ++r) {
        for (int64_t col = 0; col < c.C; ++col)
          m.data<bool>()[(b * c.R + r) * c.C + col] = keep(b, r, col);
      }
    }
    mask = m;
  }
  BlockSparseAttentionWrapper w(workspace());
  w.plan(testing::int_tensor(ip), testing::int_tensor(ix), c.M, c.N, c.R, c.C, c.hq, c.hkv, d, mask,
         std::nullopt, c.causal, mode_name(c.mode), false,
         c.soft_cap > 0 ? std::optional<double>(c.soft_cap) : std::nullopt, std::nullopt,
         c.rope_scale, c.rope_theta, c.q, c.kv, c.q);
  const Tensor q = testing::rand_tensor({c.M, c.hq, d}, c.q, seed);
  const Tensor k = testing::rand_tensor({c.N, c.hkv, d}, c.kv, seed + 1);
  const Tensor v = testing::rand_tensor({c.N, c.hkv, d}, c.kv, seed + 2);
  const AttentionOutput r =
      w.run(q, k, v, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, true);
  const auto qd = q.to_double_vector(), kd = k.to_double_vector(), vd = v.to_double_vector();
  const int64_t row = c.hkv * d;
  PosRef ref;
  ref.mode = c.mode;
  ref.causal = c.causal;
  ref.soft_cap = c.soft_cap;
  ref.rope_scale = c.rope_scale.value_or(1.0);
  ref.rope_theta = c.rope_theta.value_or(1e4);
  for (int64_t i = 0; i < mb; ++i) {
    const int64_t r0 = i * c.R, rows = std::min<int64_t>(r0 + c.R, c.M) - r0;
    std::vector<double> kg, vg;
    for (int32_t b = ip[i]; b < ip[i + 1]; ++b) {
      const int64_t k0 = static_cast<int64_t>(ix[b]) * c.C;
      kg.insert(kg.end(), kd.begin() + k0 * row, kd.begin() + (k0 + c.C) * row);
      vg.insert(vg.end(), vd.begin() + k0 * row, vd.begin() + (k0 + c.C) * row);
    }
    if (c.with_mask) {
      ref.mask = [&, i](int64_t qi, int64_t j) { return keep(ip[i] + j / c.C, qi, j % c.C); };
    }
    std::vector<double> eo, el;
    ref_pos_attention(testing::rows_of(qd, r0, r0 + rows, c.hq * d), kg, vg, rows,
                      (ip[i + 1] - ip[i]) * c.C, c.hq, c.hkv, d, ref, eo, el);
    EXPECT_TRUE(
        testing::all_close(r.out.slice(0, r0, r0 + rows), eo, testing::attention_tolerance(c.q)))
        << "block row " << i;
    EXPECT_TRUE(testing::all_close(r.lse.slice(0, r0, r0 + rows), el, lse_tolerance(c.q)))
        << "block row " << i;
  }
}

TEST(AttentionPosEncoding, BlockSparseMatchesFp64Formula) {
  const BsrPosCase cases[] = {
      // Tensor-core path (R * group >= 4): causal, rope_scale / rope_theta, M not a multiple of R.
      {Mode::kRope, DType::kFloat16, DType::kFloat16, 10, 16, 4, 4, 4, 2, true, false, 0.0, 2.0,
       5e5},
      // Upstream's decode-kernel path (R * group < 4, no mask): fp8 K takes RoPE there.
      {Mode::kRope, DType::kBFloat16, DType::kFloat8E4M3FN, 5, 12, 1, 3, 2, 1, false, false, 0.0,
       std::nullopt, std::nullopt},
      {Mode::kRope, DType::kFloat32, DType::kFloat32, 6, 8, 2, 4, 2, 2, false, true, 0.0,
       std::nullopt, 3e4},
      {Mode::kAlibi, DType::kBFloat16, DType::kBFloat16, 9, 8, 3, 2, 6, 3, false, true, 0.0,
       std::nullopt, std::nullopt},
      {Mode::kAlibi, DType::kFloat32, DType::kFloat32, 8, 16, 4, 4, 4, 1, true, false, 4.0,
       std::nullopt, std::nullopt},
      {Mode::kAlibi, DType::kFloat16, DType::kFloat16, 3, 6, 1, 2, 3, 3, false, false, 0.0,
       std::nullopt, std::nullopt},
  };
  uint64_t seed = 200;
  for (const BsrPosCase& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << mode_name(c.mode) << " " << dtype_torch_name(c.q) << "/"
                 << dtype_torch_name(c.kv) << " M " << c.M << " R " << c.R << " C " << c.C
                 << (c.with_mask ? " mask" : "") << " cap " << c.soft_cap);
    check_bsr_pos(c, seed += 10);
  }
}

// VariableBlockSparseAttentionWrapper (ROPE_LLAMA): request (kv head h, block row r) holds
// block_row_sz[h][r] queries of each of h's query heads over the tokens of the kept columns
// (upstream's plan: page size 1, gathered in column order), at positions within that request.
TEST(AttentionPosEncoding, VariableBlockSparseRopeMatchesFp64Formula) {
  for (const DType dt : {DType::kFloat32, DType::kFloat16}) {
    const bool causal = dt == DType::kFloat16;
    SCOPED_TRACE(dtype_torch_name(dt));
    const int64_t hq = 4, hkv = 2, g = 2, d = 64, mb = 2, nb = 3, qo_len = 5, kv_len = 9;
    const std::vector<int32_t> rows = {2, 3, 4, 1}, cols = {3, 2, 4, 5, 1, 3};
    const std::vector<uint8_t> keep = {1, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0, 1};
    Tensor mask = Tensor::empty({hkv, mb, nb}, DType::kBool);
    for (std::size_t i = 0; i < keep.size(); ++i) mask.data<bool>()[i] = keep[i] != 0;
    VariableBlockSparseAttentionWrapper w(workspace());
    w.plan(mask, testing::int_tensor(rows).view({hkv, mb}),
           testing::int_tensor(cols).view({hkv, nb}), hq, hkv, d, causal, "ROPE_LLAMA", false,
           std::nullopt, std::nullopt, 1.5, 2e4, true, dt);
    const Tensor q = testing::rand_tensor({hq, qo_len, d}, dt, 301);
    const Tensor k = testing::rand_tensor({hkv, kv_len, d}, dt, 302);
    const Tensor v = testing::rand_tensor({hkv, kv_len, d}, dt, 303);
    const AttentionOutput r = w.run(q, k, v, std::nullopt, std::nullopt, true);
    const auto qd = q.to_double_vector(), kd = k.to_double_vector(), vd = v.to_double_vector();
    std::vector<double> eo(static_cast<std::size_t>(hq * qo_len * d)),
        el(static_cast<std::size_t>(hq * qo_len));
    PosRef ref;
    ref.causal = causal;
    ref.rope_scale = 1.5;
    ref.rope_theta = 2e4;
    for (int64_t h = 0; h < hkv; ++h) {
      int64_t r0 = 0;
      for (int64_t i = 0; i < mb; ++i) {
        const int64_t n = rows[h * mb + i];
        std::vector<double> kg, vg, qg;
        int64_t start = 0;
        for (int64_t j = 0; j < nb; ++j) {
          if (keep[(h * mb + i) * nb + j]) {
            const auto b = (h * kv_len + start) * d, e = b + cols[h * nb + j] * d;
            kg.insert(kg.end(), kd.begin() + b, kd.begin() + e);
            vg.insert(vg.end(), vd.begin() + b, vd.begin() + e);
          }
          start += cols[h * nb + j];
        }
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t gi = 0; gi < g; ++gi) {
            const auto off = ((h * g + gi) * qo_len + r0 + t) * d;
            qg.insert(qg.end(), qd.begin() + off, qd.begin() + off + d);
          }
        }
        std::vector<double> o, l;
        ref_pos_attention(qg, kg, vg, n, static_cast<int64_t>(kg.size()) / d, g, 1, d, ref, o, l);
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t gi = 0; gi < g; ++gi) {
            const int64_t head = h * g + gi;
            for (int64_t x = 0; x < d; ++x) {
              eo[(head * qo_len + r0 + t) * d + x] = o[(t * g + gi) * d + x];
            }
            el[head * qo_len + r0 + t] = l[t * g + gi];
          }
        }
        r0 += n;
      }
    }
    EXPECT_TRUE(testing::all_close(r.out, eo, testing::attention_tolerance(dt)));
    EXPECT_TRUE(testing::all_close(r.lse, el, lse_tolerance(dt)));
  }
}

TEST(AttentionPosEncoding, BlockSparseBadInput) {
  const char* plan = "BlockSparseAttentionWrapper.plan";
  BlockSparseAttentionWrapper w(workspace());
  const Tensor ip = testing::int_tensor({0, 2, 3}), ix = testing::int_tensor({0, 2, 1});
  auto bsr = [&](int64_t R, std::string_view mode, DType kv, std::optional<double> rs = {}) {
    w.plan(ip, ix, 2 * R, 6, R, 2, 2, 1, 64, std::nullopt, std::nullopt, false, mode, false,
           std::nullopt, std::nullopt, rs, std::nullopt, DType::kFloat16, kv, DType::kFloat16);
  };
  bsr(2, "ROPE_LLAMA", DType::kFloat16);  // valid
  EXPECT_FI_ERROR(bsr(2, "rope", DType::kFloat16), plan, "pos_encoding_mode");
  EXPECT_FI_ERROR(bsr(2, "ROPE_LLAMA", DType::kFloat16, -1.0), plan, "rope_scale");
  // fp8 K with RoPE: the decode-kernel path (R 1, group 2) takes it, the prefill kernel's
  // (R 2: R * group = 4) does not (upstream builds it for 16-bit K only).
  bsr(1, "ROPE_LLAMA", DType::kFloat8E4M3FN);
  try {
    bsr(2, "ROPE_LLAMA", DType::kFloat8E4M3FN);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_EQ(e.arg(), "pos_encoding_mode");
  }
  // The variable wrapper: upstream passes no ALiBi slopes to its kernel.
  VariableBlockSparseAttentionWrapper vw(workspace());
  Tensor mask = Tensor::zeros({1, 1, 1}, DType::kBool);
  mask.fill_(1);
  const Tensor one = testing::int_tensor({4}).view({1, 1});
  vw.plan(mask, one, one, 2, 1, 64, false, "ROPE_LLAMA");  // valid
  try {
    vw.plan(mask, one, one, 2, 1, 64, false, "ALIBI");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_EQ(e.op(), "VariableBlockSparseAttentionWrapper.plan");
    EXPECT_EQ(e.arg(), "pos_encoding_mode");
  }
  EXPECT_FI_ERROR(vw.plan(mask, one, one, 2, 1, 64, false, "ROPE"),
                  "VariableBlockSparseAttentionWrapper.plan", "pos_encoding_mode");
}

// The block-sparse wrappers planned with a mode, through an observer (each call replays
// identically) and a Flight Recorder dump replayed with replay_sequence.
TEST(AttentionPosEncoding, BlockSparseRecordAndReplay) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("fi_attn_pos_bsr_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::vector<testing::RecordingObserver::Call> calls;
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg, [](const std::string&) {});
  {
    testing::RecordingScope scope;
    BlockSparseAttentionWrapper a(workspace());
    a.plan(testing::int_tensor({0, 2, 3}), testing::int_tensor({0, 2, 1}), 4, 6, 2, 2, 4, 2, 64,
           std::nullopt, std::nullopt, true, "ROPE_LLAMA", false, std::nullopt, std::nullopt,
           std::nullopt, 5e5);
    a.run(testing::rand_tensor({4, 4, 64}, DType::kFloat16, 401),
          testing::rand_tensor({6, 2, 64}, DType::kFloat16, 402),
          testing::rand_tensor({6, 2, 64}, DType::kFloat16, 403));
    BlockSparseAttentionWrapper b(workspace());
    b.plan(testing::int_tensor({0, 1, 3, 5}), testing::int_tensor({2, 0, 2, 1, 2}), 3, 3, 1, 1, 4,
           2, 64, std::nullopt, std::nullopt, false, "ALIBI", false, 3.0);
    b.run(testing::rand_tensor({3, 4, 64}, DType::kFloat16, 404),
          testing::rand_tensor({3, 2, 64}, DType::kFloat16, 405),
          testing::rand_tensor({3, 2, 64}, DType::kFloat16, 406), std::nullopt, std::nullopt,
          std::nullopt, std::nullopt, std::nullopt, true);
    VariableBlockSparseAttentionWrapper c(workspace());
    Tensor mask = Tensor::zeros({2, 2, 2}, DType::kBool);
    mask.data<bool>()[0] = mask.data<bool>()[3] = mask.data<bool>()[5] = mask.data<bool>()[6] =
        true;
    c.plan(mask, testing::int_tensor({2, 2, 1, 3}).view({2, 2}),
           testing::int_tensor({3, 1, 2, 2}).view({2, 2}), 4, 2, 64, false, "ROPE_LLAMA");
    c.run(testing::rand_tensor({4, 4, 64}, DType::kFloat16, 407),
          testing::rand_tensor({2, 4, 64}, DType::kFloat16, 408),
          testing::rand_tensor({2, 4, 64}, DType::kFloat16, 409));
    calls = scope.observer().calls;
  }
  recorder::stop();
  ASSERT_EQ(calls.size(), 9u);
  EXPECT_EQ(calls[1].inputs[13].as_string(), "ROPE_LLAMA");  // self, then plan's 13th
  for (const auto& call : calls) {
    if (call.name.find("__init__") != std::string::npos) continue;
    SCOPED_TRACE(call.name);
    EXPECT_TRUE(testing::replays_identically(call));
  }
  testing::replay_expecting_every_call_to_pass(dir, 9u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flashinfer
