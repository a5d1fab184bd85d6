// NVFP4 paged KV caches (kv_cache_sf) in the attention run paths: the paged prefill and decode
// wrappers, trtllm_batch_decode/context_with_kv_cache and xqa_batch_decode_with_kv_cache, against
// an fp64 formula over caches built here from random codes (K scales linear, V scales
// 4-token interleaved by a reshape/permute as upstream's quantizer does, the reference reading the
// linear ones); the ragged wrapper and single_prefill_with_kv_cache over packed K/V with linear
// scales; bad input; o_scale on the ragged wrapper; record and replay; an upstream-format dump
// written by Python.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "flashinfer/float_formats.h"
#include "flashinfer/ops/attention.h"
#include "flashinfer/ops/batch_attention.h"
#include "flashinfer/ops/page.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"

namespace flashinfer {
namespace {

namespace fs = std::filesystem;
using testing::int_tensor;

Tensor workspace() { return Tensor::zeros({1 << 16}, DType::kUInt8); }

constexpr double kE2m1[16] = {0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6};

// Element x of an NVFP4 row in fp64 (no global scale): nibble x % 2 of its code byte times the
// e4m3 scale of its 16-element block.
double nvfp4_value(uint8_t code_byte, uint8_t sf_byte, int64_t x) {
  return kE2m1[x % 2 == 0 ? (code_byte & 0xF) : (code_byte >> 4)] * e4m3fn_bits_to_float(sf_byte);
}

// Bytes uniform in [lo, hi], in storage order.
Tensor random_bytes(std::mt19937& rng, const Shape& s, int lo, int hi) {
  Tensor t = Tensor::empty(s, DType::kUInt8);
  std::uniform_int_distribution<int> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>(u(rng));
  return t;
}

// An NVFP4 paged cache of `pages` pages: packed codes [pages, (Hkv, P) or (P, Hkv), D / 2] and
// e4m3 scales [.., D / 16]; `v_lin` keeps V's linear scales for the reference.
struct Nvfp4Cache {
  int64_t pages = 0, ps = 0, hkv = 0, d = 0;
  bool hnd = true;
  Tensor k, v, k_sf, v_sf, v_lin;  // k_sf linear, v_sf interleaved, v_lin linear
  // Element x of token slot (page, entry) head g, in fp64 (no global scale).
  double value(bool is_v, int64_t page, int64_t entry, int64_t g, int64_t x) const {
    const Tensor& c = is_v ? v : k;
    const Tensor& s = is_v ? v_lin : k_sf;
    auto at = [&](const Tensor& t, int64_t last) {
      const int64_t i1 = hnd ? g : entry, i2 = hnd ? entry : g;
      const int64_t off = page * t.stride(0) + i1 * t.stride(1) + i2 * t.stride(2) + last;
      return static_cast<const uint8_t*>(t.data_ptr())[off];
    };
    return nvfp4_value(at(c, x / 2), at(s, x / 16), x);
  }
};

Tensor as_e4m3(const Tensor& u8) {
  Tensor t = Tensor::empty(u8.shape(), DType::kFloat8E4M3FN);
  std::memcpy(t.data_ptr(), u8.contiguous().data_ptr(), static_cast<size_t>(u8.numel()));
  return t;
}

Nvfp4Cache make_nvfp4(int64_t pages, int64_t ps, int64_t hkv, int64_t d, bool hnd, uint64_t seed) {
  Nvfp4Cache c;
  c.pages = pages;
  c.ps = ps;
  c.hkv = hkv;
  c.d = d;
  c.hnd = hnd;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  auto bytes = [&](const Shape& s, int lo, int hi) { return random_bytes(rng, s, lo, hi); };
  const Shape data = hnd ? Shape{pages, hkv, ps, d / 2} : Shape{pages, ps, hkv, d / 2};
  const Shape sf = hnd ? Shape{pages, hkv, ps, d / 16} : Shape{pages, ps, hkv, d / 16};
  c.k = bytes(data, 0, 255);
  c.v = bytes(data, 0, 255);
  // e4m3 codes 0x28..0x40: 0.25 .. 2 (finite, positive).
  c.k_sf = as_e4m3(bytes(sf, 0x28, 0x40));
  c.v_lin = as_e4m3(bytes(sf, 0x28, 0x40));
  const int64_t s4 = d / 16 / 4;
  // Upstream's nvfp4_quantize_paged_kv_cache V-scale swizzle, by reshape and permute.
  c.v_sf = hnd ? c.v_lin.view({pages, hkv, ps / 4, 4, 4, s4})
                     .permute({0, 1, 2, 4, 5, 3})
                     .contiguous()
                     .view(sf)
               : c.v_lin.view({pages, ps / 4, 4, hkv, 4, s4})
                     .permute({0, 1, 4, 3, 5, 2})
                     .contiguous()
                     .view(sf);
  return c;
}

struct Req {
  std::vector<int32_t> pages;  // the request's pages in order
  int32_t kv_len = 0, qo_len = 1;
};

// fp64 attention of the requests b: queries qo[b] .. qo[b + 1] (query i at position kv_len -
// qo_len + i) against keys j < kv_len[b], o = sum_j softmax(scale * q.k_j) v_j * vscale (causal:
// right-aligned), element x of key j, head g of K / V read as kval / vval(b, j, g, x).
template <class KVal, class VVal>
std::vector<double> fp64_attention(const Tensor& q, const std::vector<int32_t>& qo,
                                   const std::vector<int32_t>& kv_len, int64_t hkv, int64_t dq,
                                   int64_t dv, double scale, double vscale, bool causal,
                                   const KVal& kval, const VVal& vval) {
  const int64_t hq = q.size(1), group = hq / hkv;
  const std::vector<double> qd = q.to_double_vector();
  std::vector<double> o(static_cast<std::size_t>(q.size(0) * hq * dv), 0.0);
  for (std::size_t b = 0; b + 1 < qo.size(); ++b) {
    const int64_t qo_len = qo[b + 1] - qo[b];
    for (int64_t i = 0; i < qo_len; ++i) {
      const int64_t row = qo[b] + i, n = causal ? kv_len[b] - qo_len + i + 1 : kv_len[b];
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t g = h / group;
        std::vector<double> sc;
        double mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0;
          for (int64_t x = 0; x < dq; ++x) dot += qd[(row * hq + h) * dq + x] * kval(b, j, g, x);
          sc.push_back(dot * scale);
          mx = std::max(mx, sc.back());
        }
        double sum = 0;
        for (double x : sc) sum += std::exp(x - mx);
        for (int64_t j = 0; j < n; ++j) {
          const double p = std::exp(sc[j] - mx) / sum;
          for (int64_t x = 0; x < dv; ++x) {
            o[(row * hq + h) * dv + x] += p * vval(b, j, g, x) * vscale;
          }
        }
      }
    }
  }
  return o;
}

// fp64_attention over a paged cache (K/V dequantized; kg / vg folded into scale / vscale by the
// caller).
std::vector<double> reference(const Tensor& q, const Nvfp4Cache& c, const std::vector<Req>& reqs,
                              double scale, double vscale, bool causal) {
  std::vector<int32_t> qo{0}, kv_len;
  for (const Req& r : reqs) {
    qo.push_back(qo.back() + r.qo_len);
    kv_len.push_back(r.kv_len);
  }
  auto at = [&](bool is_v) {
    return [&c, &reqs, is_v](std::size_t b, int64_t j, int64_t g, int64_t x) {
      return c.value(is_v, reqs[b].pages[static_cast<std::size_t>(j / c.ps)], j % c.ps, g, x);
    };
  };
  return fp64_attention(q, qo, kv_len, c.hkv, c.d, c.d, scale, vscale, causal, at(false), at(true));
}

// The page-table tensors of `reqs`.
struct Table {
  Tensor indptr, indices, last, block_tables, seq_lens, qo_indptr;
};
Table table_of(const std::vector<Req>& reqs, int64_t ps) {
  std::vector<int32_t> indptr{0}, indices, last, qo{0}, lens, flat;
  std::size_t cols = 1;
  for (const Req& r : reqs) cols = std::max(cols, r.pages.size() + 1);
  for (const Req& r : reqs) {
    indices.insert(indices.end(), r.pages.begin(), r.pages.end());
    indptr.push_back(static_cast<int32_t>(indices.size()));
    last.push_back(static_cast<int32_t>(r.kv_len - (r.pages.size() - 1) * ps));
    qo.push_back(qo.back() + r.qo_len);
    lens.push_back(r.kv_len);
    for (std::size_t i = 0; i < cols; ++i) flat.push_back(i < r.pages.size() ? r.pages[i] : -1);
  }
  return {int_tensor(indptr),
          int_tensor(indices),
          int_tensor(last),
          int_tensor(flat).view({static_cast<int64_t>(reqs.size()), static_cast<int64_t>(cols)}),
          int_tensor(lens),
          int_tensor(qo)};
}

constexpr testing::Tolerance kTol{2e-2, 2e-2};  // bf16 output rounding of O(1) values
constexpr int64_t kHq = 4, kHkv = 2, kD = 64, kPs = 4;
constexpr double kKg = 0.75, kVg = 1.25;  // global scales (upstream: k_scale / v_scale)

std::vector<Req> decode_reqs() { return {{{5, 1}, 7, 1}, {{0, 6, 3}, 10, 1}}; }
std::vector<Req> prefill_reqs() { return {{{5, 1}, 7, 3}, {{0, 6, 3}, 10, 4}}; }

// Each case below runs once per KV layout (the parameter: true for HND).
class Nvfp4Layout : public ::testing::TestWithParam<bool> {
 protected:
  static const char* layout() { return GetParam() ? "HND" : "NHD"; }
};

TEST_P(Nvfp4Layout, PagedPrefillWrapperMatchesFp64) {
  const bool hnd = GetParam();
  const Nvfp4Cache c = make_nvfp4(8, kPs, kHkv, kD, hnd, 11);
  const std::vector<Req> reqs = prefill_reqs();
  const Table t = table_of(reqs, kPs);
  const Tensor q = testing::rand_tensor({7, kHq, kD}, DType::kBFloat16, 3, -1.0, 1.0);
  BatchPrefillWithPagedKVCacheWrapper w(workspace(), layout());
  PrefillPlanOptions po;
  po.causal = true;
  po.q_data_type = DType::kBFloat16;
  po.kv_data_type = DType::kUInt8;
  po.sm_scale = 0.2;
  w.plan(t.qo_indptr, t.indptr, t.indices, t.last, kHq, kHkv, kD, kPs, po);
  AttentionRunOptions ro;
  ro.k_scale = kKg;
  ro.v_scale = kVg;
  ro.kv_cache_sf = PagedKVCache(c.k_sf, c.v_sf);
  const AttentionOutput r = w.run(q, PagedKVCache(c.k, c.v), ro);
  EXPECT_TRUE(testing::all_close(r.out, reference(q, c, reqs, 0.2 * kKg, kVg, true), kTol));
}

TEST_P(Nvfp4Layout, DecodeWrapperMatchesFp64) {
  const bool hnd = GetParam();
  const Nvfp4Cache c = make_nvfp4(8, kPs, kHkv, kD, hnd, 12);
  const std::vector<Req> reqs = decode_reqs();
  const Table t = table_of(reqs, kPs);
  const Tensor q = testing::rand_tensor({2, kHq, kD}, DType::kFloat16, 4, -1.0, 1.0);
  BatchDecodeWithPagedKVCacheWrapper w(workspace(), layout());
  BatchDecodePlanOptions po;
  po.kv_data_type = DType::kUInt8;
  w.plan(t.indptr, t.indices, t.last, kHq, kHkv, kD, kPs, po);
  // One stacked [pages, 2, ...] tensor for the codes and one for the scales.
  AttentionRunOptions ro;
  ro.k_scale = kKg;
  ro.v_scale = kVg;
  auto stack = [](const Tensor& a, const Tensor& b) {
    Shape s = a.shape();
    s.insert(s.begin() + 1, 2);
    Tensor out = Tensor::empty(s, a.dtype());
    out.select(1, 0).copy_(a);
    out.select(1, 1).copy_(b);
    return out;
  };
  ro.kv_cache_sf = PagedKVCache(stack(c.k_sf, c.v_sf));
  const AttentionOutput r = w.run(q, PagedKVCache(stack(c.k, c.v)), ro);
  const std::vector<double> ref = reference(q, c, reqs, kKg / std::sqrt(double(kD)), kVg, false);
  EXPECT_TRUE(testing::all_close(r.out, ref, kTol));
}

TEST_P(Nvfp4Layout, TrtllmAndXqaMatchFp64) {
  const bool hnd = GetParam();
  const Nvfp4Cache c = make_nvfp4(8, kPs, kHkv, kD, hnd, 13);
  // trtllm-gen (and "auto") read V's scales interleaved, the xqa kernels linearly.
  const Value sf = to_value(PagedKVCache(c.k_sf, c.v_sf));
  const Value sf_lin = to_value(PagedKVCache(c.k_sf, c.v_lin));
  const PagedKVCache cache(c.k, c.v);
  {  // decode: bmm1 fuses sm_scale and the K global scale, bmm2 the V one
    const std::vector<Req> reqs = decode_reqs();
    const Table t = table_of(reqs, kPs);
    const Tensor q = testing::rand_tensor({2, kHq, kD}, DType::kBFloat16, 5, -1.0, 1.0);
    const std::vector<double> ref = reference(q, c, reqs, 0.15, kVg, false);
    for (const char* backend : {"auto", "trtllm-gen", "xqa"}) {
      const bool xqa = std::string(backend) == "xqa";
      const AttentionOutput r = trtllm_batch_decode_with_kv_cache(
          q, cache, workspace(), t.block_tables, t.seq_lens, 10, 0.15, kVg, -1, std::nullopt,
          std::nullopt, std::nullopt, std::nullopt, std::nullopt, layout(), std::nullopt, backend,
          1, 1.0, std::nullopt, std::nullopt, std::nullopt, std::nullopt, xqa ? sf_lin : sf);
      EXPECT_TRUE(testing::all_close(r.out, ref, kTol)) << backend;
    }
    const Tensor x = xqa_batch_decode_with_kv_cache(
        q, cache, workspace(), t.block_tables, t.seq_lens, 10, 0.15, kVg, -1, std::nullopt,
        std::nullopt, layout(), std::nullopt, 1, 1.0, std::nullopt, sf_lin);
    EXPECT_TRUE(testing::all_close(x, ref, kTol));
    // flashinfer.xqa.xqa: q [B, 1, H, D], seq_lens [B, 1]; bmm1 = q_scale * kv_scale / sqrt(D).
    const Tensor out = Tensor::zeros({2, 1, kHq, kD}, DType::kBFloat16);
    xqa(q.unsqueeze(1), c.k, c.v, t.block_tables, t.seq_lens.reshape({2, 1}), out, workspace(),
        workspace(), kHkv, kPs, std::nullopt, 0.15 * std::sqrt(double(kD)) / kVg, kVg, 0, layout(),
        std::nullopt, std::nullopt, 1.0, 1, std::nullopt, std::nullopt, c.k_sf, c.v_lin);
    EXPECT_TRUE(testing::all_close(out.select(1, 0), x, {1e-2, 1e-2}));
  }
  {  // context: causal prefill rows
    const std::vector<Req> reqs = prefill_reqs();
    const Table t = table_of(reqs, kPs);
    const Tensor q = testing::rand_tensor({7, kHq, kD}, DType::kFloat16, 6, -1.0, 1.0);
    const AttentionOutput r = trtllm_batch_context_with_kv_cache(
        q, cache, workspace(), t.block_tables, t.seq_lens, 4, 10, 0.1, kVg, 2, t.qo_indptr,
        int_tensor({0, 7, 17}), -1, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
        layout(), std::nullopt, std::nullopt, sf);
    EXPECT_TRUE(testing::all_close(r.out, reference(q, c, reqs, 0.1, kVg, true), kTol));
  }
}

// BatchAttention.run(kv_cache_sf=): upstream unpacks the scales like kv_cache (one tensor or a
// (k_sf, v_sf) pair); k_scale folds into the score scale, v_scale into the output.
TEST_P(Nvfp4Layout, BatchAttentionMatchesFp64) {
  const bool hnd = GetParam();
  const Nvfp4Cache c = make_nvfp4(8, kPs, kHkv, kD, hnd, 19);
  const std::vector<Req> reqs = prefill_reqs();
  const Table t = table_of(reqs, kPs);
  const Tensor q = testing::rand_tensor({7, kHq, kD}, DType::kBFloat16, 10, -1.0, 1.0);
  BatchAttention w(layout(), "cpu");
  w.plan(t.qo_indptr, t.indptr, t.indices, t.seq_lens, kHq, kHkv, kD, kD, kPs, true, 0.2,
         std::nullopt, DType::kBFloat16, DType::kUInt8);
  const AttentionOutput r = w.run(q, PagedKVCache(c.k, c.v), std::nullopt, std::nullopt, kKg, kVg,
                                  0.0, std::nullopt, PagedKVCache(c.k_sf, c.v_sf));
  EXPECT_TRUE(testing::all_close(r.out, reference(q, c, reqs, 0.2 * kKg, kVg, true), kTol));
}

// Ragged / single NVFP4 K or V (upstream's fa2 path): packed codes [rows, Hkv, D / 2] (NHD) or
// [Hkv, rows, D / 2] (HND) and e4m3 scales laid out alike, both linear (upstream's
// single_prefill docstring: "Both k_scales and v_scales use a linear (row-major) layout").
struct Nvfp4Rows {
  int64_t rows = 0, hkv = 0, d = 0;
  bool hnd = false;
  Tensor codes, sf;
  // Element x of row r, head g, in fp64 (no global scale).
  double value(int64_t r, int64_t g, int64_t x) const {
    auto at = [&](const Tensor& t, int64_t last) {
      const int64_t i0 = hnd ? g : r, i1 = hnd ? r : g;
      return static_cast<const uint8_t*>(
          t.data_ptr())[i0 * t.stride(0) + i1 * t.stride(1) + last * t.stride(2)];
    };
    return nvfp4_value(at(codes, x / 2), at(sf, x / 16), x);
  }
};

Nvfp4Rows make_rows(int64_t rows, int64_t hkv, int64_t d, bool hnd, uint32_t seed) {
  Nvfp4Rows r{rows, hkv, d, hnd, {}, {}};
  std::mt19937 rng(seed);
  auto bytes = [&](const Shape& s, int lo, int hi) { return random_bytes(rng, s, lo, hi); };
  r.codes = bytes(hnd ? Shape{hkv, rows, d / 2} : Shape{rows, hkv, d / 2}, 0, 255);
  r.sf = as_e4m3(bytes(hnd ? Shape{hkv, rows, d / 16} : Shape{rows, hkv, d / 16}, 0x28, 0x40));
  return r;
}

// Stacks two same-shaped 3-D tensors on a new dim 1 (upstream's kv_cache_sf.unbind(dim=1) input).
Tensor stack1(const Tensor& a, const Tensor& b) {
  Tensor t = Tensor::empty({a.size(0), 2, a.size(1), a.size(2)}, a.dtype());
  t.select(1, 0).copy_(a);
  t.select(1, 1).copy_(b);
  return t;
}

// fp64_attention of ragged rows: request b's queries qo[b]..qo[b+1] against K/V rows
// kv[b]..kv[b+1].
std::vector<double> ragged_reference(const Tensor& q, const Nvfp4Rows& k, const Nvfp4Rows& v,
                                     const std::vector<int32_t>& qo, const std::vector<int32_t>& kv,
                                     double scale, double vscale, bool causal) {
  std::vector<int32_t> kv_len;
  for (std::size_t b = 0; b + 1 < kv.size(); ++b) kv_len.push_back(kv[b + 1] - kv[b]);
  auto at = [&kv](const Nvfp4Rows& t) {
    return [&kv, &t](std::size_t b, int64_t j, int64_t g, int64_t x) {
      return t.value(kv[b] + j, g, x);
    };
  };
  return fp64_attention(q, qo, kv_len, k.hkv, k.d, v.d, scale, vscale, causal, at(k), at(v));
}

// BatchPrefillWithRaggedKVCacheWrapper.run(kv_cache_sf=(k_sf, v_sf)): head_dim_qk 64, head_dim_vo
// 32 (upstream's plan takes head_dim_vo; the output is [.., head_dim_vo]), q_scale and k_scale
// folded into the score scale, v_scale on the output (upstream's ragged run for NVFP4).
TEST_P(Nvfp4Layout, RaggedWrapperMatchesFp64) {
  const bool hnd = GetParam();
  const std::vector<int32_t> qo{0, 3, 7}, kv{0, 5, 11};
  const Nvfp4Rows k = make_rows(12, kHkv, kD, hnd, 21), v = make_rows(12, kHkv, 32, hnd, 22);
  const Tensor q = testing::rand_tensor({7, kHq, kD}, DType::kBFloat16, 23, -1.0, 1.0);
  BatchPrefillWithRaggedKVCacheWrapper w(workspace(), layout());
  PrefillPlanOptions po;
  po.causal = true;
  po.q_data_type = DType::kBFloat16;
  po.kv_data_type = DType::kUInt8;
  po.head_dim_vo = 32;
  w.plan(int_tensor(qo), int_tensor(kv), kHq, kHkv, kD, po);
  AttentionRunOptions ro;
  ro.q_scale = 0.5;
  ro.k_scale = kKg;
  ro.v_scale = kVg;
  ro.kv_cache_sf = PagedKVCache(k.sf, v.sf);
  ro.return_lse = true;
  const AttentionOutput r = w.run(q, k.codes, v.codes, ro);
  ASSERT_EQ(r.out.shape(), (Shape{7, kHq, 32}));
  const double scale = 0.5 * kKg / std::sqrt(static_cast<double>(kD));
  EXPECT_TRUE(testing::all_close(r.out, ragged_reference(q, k, v, qo, kv, scale, kVg, true), kTol));
}

// One stacked scale tensor (upstream: kv_cache_sf.unbind(dim=1)) reads like the pair, bit for bit.
TEST_P(Nvfp4Layout, RaggedStackedScalesMatchPair) {
  const bool hnd = GetParam();
  const Nvfp4Rows k = make_rows(9, kHkv, kD, hnd, 24), v = make_rows(9, kHkv, kD, hnd, 25);
  const Tensor q = testing::rand_tensor({5, kHq, kD}, DType::kFloat16, 26, -1.0, 1.0);
  BatchPrefillWithRaggedKVCacheWrapper w(workspace(), layout());
  PrefillPlanOptions po;
  po.kv_data_type = DType::kUInt8;
  w.plan(int_tensor({0, 2, 5}), int_tensor({0, 4, 9}), kHq, kHkv, kD, po);
  AttentionRunOptions pair, stacked;
  pair.kv_cache_sf = PagedKVCache(k.sf, v.sf);
  stacked.kv_cache_sf = PagedKVCache(stack1(k.sf, v.sf));
  const AttentionOutput a = w.run(q, k.codes, v.codes, pair);
  const AttentionOutput b = w.run(q, k.codes, v.codes, stacked);
  EXPECT_TRUE(testing::all_close(b.out, a.out, {0.0, 0.0}));
  EXPECT_TRUE(testing::all_close(
      a.out,
      ragged_reference(q, k, v, {0, 2, 5}, {0, 4, 9}, 1.0 / std::sqrt(double{kD}), 1.0, false),
      {2e-3, 2e-3}));
}

// single_prefill_with_kv_cache(k, v packed, kv_cache_sf=(k_sf, v_sf), k_scale, v_scale): upstream's
// NVFP4 test call (k_scale / v_scale the global scales); head_dim_vo 2 * v.shape[-1].
TEST_P(Nvfp4Layout, SinglePrefillMatchesFp64) {
  const bool hnd = GetParam();
  const Nvfp4Rows k = make_rows(10, kHkv, kD, hnd, 27), v = make_rows(10, kHkv, 32, hnd, 28);
  const Tensor q = testing::rand_tensor({4, kHq, kD}, DType::kFloat16, 29, -1.0, 1.0);
  for (const bool causal : {false, true}) {
    const AttentionOutput r = single_prefill_with_kv_cache(
        q, k.codes, v.codes, {}, {}, {}, {}, {}, {}, causal, layout(), "NONE", false, 0.2, -1,
        std::nullopt, std::nullopt, std::nullopt, "fa2", false, PagedKVCache(k.sf, v.sf), kKg, kVg);
    ASSERT_EQ(r.out.shape(), (Shape{4, kHq, 32}));
    EXPECT_TRUE(testing::all_close(
        r.out, ragged_reference(q, k, v, {0, 4}, {0, 10}, 0.2 * kKg, kVg, causal), {2e-3, 2e-3}))
        << "causal " << causal;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, Nvfp4Layout, ::testing::Bool(),
                         [](const auto& i) { return std::string(i.param ? "HND" : "NHD"); });

// One token, one head, hand-computed: a single key gets softmax weight 1, so the output is V's
// dequantized row times v_scale: codes 0x62 (low nibble 2 = 1.0, high 6 = 4.0) times the e4m3
// scale 0x30 = 0.5, times 3.
TEST(Nvfp4Attention, HandCheckedSingleToken) {
  Tensor k = Tensor::full({1, 4, 1, 16}, 0x21, DType::kUInt8);
  Tensor v = Tensor::full({1, 4, 1, 16}, 0x62, DType::kUInt8);           // low 1.0, high 4.0
  Tensor ks = as_e4m3(Tensor::full({1, 4, 1, 2}, 0x40, DType::kUInt8));  // 2.0
  Tensor vs = as_e4m3(Tensor::full({1, 4, 1, 2}, 0x30, DType::kUInt8));  // 0.5
  BatchDecodeWithPagedKVCacheWrapper w(workspace());
  BatchDecodePlanOptions po;
  po.q_data_type = DType::kFloat32;
  po.kv_data_type = DType::kUInt8;
  w.plan(int_tensor({0, 1}), int_tensor({0}), int_tensor({1}), 1, 1, 32, 4, po);
  AttentionRunOptions ro;
  ro.v_scale = 3.0;
  ro.kv_cache_sf = PagedKVCache(ks, vs);
  const Tensor q = Tensor::full({1, 1, 32}, 1.0, DType::kFloat32);
  const AttentionOutput r = w.run(q, PagedKVCache(k, v), ro);
  // One key: softmax weight 1; V elements 1.0 * 0.5 and 4.0 * 0.5, times v_scale 3.
  std::vector<double> want;
  for (int i = 0; i < 32; ++i) want.push_back(i % 2 == 0 ? 1.5 : 6.0);
  EXPECT_TRUE(testing::all_close(r.out, want, {0.0, 0.0}));
}

TEST(Nvfp4Attention, BadInput) {
  const Nvfp4Cache c = make_nvfp4(8, kPs, kHkv, kD, true, 14);
  const Table t = table_of(decode_reqs(), kPs);
  const Tensor q = testing::rand_tensor({2, kHq, kD}, DType::kFloat16, 4, -1.0, 1.0);
  auto planned = [&](DType kv) {
    auto w = std::make_unique<BatchDecodeWithPagedKVCacheWrapper>(workspace(), "HND");
    BatchDecodePlanOptions po;
    po.kv_data_type = kv;
    w->plan(t.indptr, t.indices, t.last, kHq, kHkv, kD, kPs, po);
    return w;
  };
  auto sf = [](const Tensor& k, const Tensor& v) {
    AttentionRunOptions o;
    o.kv_cache_sf = PagedKVCache(k, v);
    return o;
  };
  const char* op = "BatchDecodeWithPagedKVCacheWrapper.run";
  const PagedKVCache cache(c.k, c.v);
  // A uint8 (NVFP4) plan run without scales.
  EXPECT_FI_ERROR(planned(DType::kUInt8)->run(q, cache, AttentionRunOptions()), op, "kv_cache_sf");
  // Scales given to a 16-bit plan.
  const Tensor z = Tensor::zeros({8, kHkv, kPs, kD}, DType::kFloat16);
  EXPECT_FI_ERROR(planned(DType::kFloat16)->run(q, PagedKVCache(z, z), sf(c.k_sf, c.v_sf)), op,
                  "kv_cache_sf");
  // Scales of the wrong width, or of a 16-bit dtype.
  EXPECT_FI_ERROR(
      planned(DType::kUInt8)->run(q, cache, sf(c.k_sf.slice(3, 0, 2), c.v_sf.slice(3, 0, 2))), op,
      "kv_cache_sf");
  EXPECT_FI_ERROR(planned(DType::kUInt8)
                      ->run(q, cache,
                            sf(c.k_sf.to(DType::kFloat16).contiguous(),
                               c.v_sf.to(DType::kFloat16).contiguous())),
                  op, "kv_cache_sf");
  // Packed codes of the wrong width name the cache.
  EXPECT_FI_ERROR(
      planned(DType::kUInt8)
          ->run(q, PagedKVCache(c.k.slice(3, 0, 16), c.v.slice(3, 0, 16)), sf(c.k_sf, c.v_sf)),
      op, "paged_kv_cache");
  // page_size 3: the V scales' 4-token interleave is undefined.
  {
    const Nvfp4Cache c3 = make_nvfp4(4, 4, kHkv, kD, true, 15);
    BatchDecodeWithPagedKVCacheWrapper w(workspace(), "HND");
    BatchDecodePlanOptions po;
    po.kv_data_type = DType::kUInt8;
    w.plan(int_tensor({0, 1}), int_tensor({0}), int_tensor({3}), kHq, kHkv, kD, 3, po);
    EXPECT_FI_ERROR(w.run(q.slice(0, 0, 1), PagedKVCache(c3.k.slice(2, 0, 3), c3.v.slice(2, 0, 3)),
                          sf(c3.k_sf.slice(2, 0, 3), c3.v_sf.slice(2, 0, 3))),
                    op, "kv_cache_sf");
  }
  // trtllm: a uint8 cache without scales; scales that are neither a tensor nor a pair.
  const char* tr = "trtllm_batch_decode_with_kv_cache";
  EXPECT_FI_ERROR(trtllm_batch_decode_with_kv_cache(q, cache, workspace(), t.block_tables,
                                                    t.seq_lens, 10, 0.1, 1.0),
                  tr, "kv_cache_sf");
  EXPECT_FI_ERROR(
      trtllm_batch_decode_with_kv_cache(
          q, cache, workspace(), t.block_tables, t.seq_lens, 10, 0.1, 1.0, -1, std::nullopt,
          std::nullopt, std::nullopt, std::nullopt, std::nullopt, "HND", std::nullopt, "auto", 1,
          1.0, std::nullopt, std::nullopt, std::nullopt, std::nullopt, Value(int64_t{3})),
      tr, "kv_cache_sf");
  // xqa: a uint8 cache needs both scale caches; scales with a 16-bit cache are refused.
  const Tensor qx = q.unsqueeze(1), ox = Tensor::zeros({2, 1, kHq, kD}, DType::kFloat16);
  const Tensor nk = c.k.permute({0, 2, 1, 3}).contiguous(), nv = c.v.permute({0, 2, 1, 3});
  EXPECT_FI_ERROR(xqa(qx, nk, nv, t.block_tables, t.seq_lens.reshape({2, 1}), ox, workspace(),
                      workspace(), kHkv, kPs),
                  "xqa", "k_sf_cache");
  const Tensor hk = Tensor::zeros({8, kPs, kHkv, kD}, DType::kFloat16);
  EXPECT_FI_ERROR(xqa(qx, hk, hk, t.block_tables, t.seq_lens.reshape({2, 1}), ox, workspace(),
                      workspace(), kHkv, kPs, std::nullopt, 1.0, 1.0, 0, "NHD", std::nullopt,
                      std::nullopt, 1.0, 1, std::nullopt, std::nullopt, c.k_sf),
                  "xqa", "k_sf_cache");
  // BatchAttention: a uint8 plan run without scales; scales given to a 16-bit plan.
  {
    const char* ba = "BatchAttention.run";
    BatchAttention b("HND", "cpu");
    b.plan(t.qo_indptr, t.indptr, t.indices, t.seq_lens, kHq, kHkv, kD, kD, kPs, false,
           std::nullopt, std::nullopt, DType::kFloat16, DType::kUInt8);
    EXPECT_FI_ERROR(b.run(q, cache), ba, "kv_cache_sf");
    EXPECT_FI_ERROR(b.run(q, cache, std::nullopt, std::nullopt, std::nullopt, std::nullopt, 0.0,
                          std::nullopt, PagedKVCache(c.k_sf.slice(3, 0, 2), c.v_sf.slice(3, 0, 2))),
                    ba, "kv_cache_sf");
    BatchAttention h("HND", "cpu");
    h.plan(t.qo_indptr, t.indptr, t.indices, t.seq_lens, kHq, kHkv, kD, kD, kPs, false,
           std::nullopt, std::nullopt, DType::kFloat16, DType::kFloat16);
    EXPECT_FI_ERROR(h.run(q, PagedKVCache(z, z), std::nullopt, std::nullopt, std::nullopt,
                          std::nullopt, 0.0, std::nullopt, PagedKVCache(c.k_sf, c.v_sf)),
                    ba, "kv_cache_sf");
  }
}

// Ragged and single NVFP4: bad scales or codes name the argument.
TEST(Nvfp4Attention, RaggedAndSingleBadInput) {
  const Nvfp4Rows k = make_rows(4, kHkv, kD, false, 31), v = make_rows(4, kHkv, kD, false, 32);
  const Tensor q = testing::rand_tensor({2, kHq, kD}, DType::kFloat16, 33, -1.0, 1.0);
  const char* op = "BatchPrefillWithRaggedKVCacheWrapper.run";
  auto planned = [&](DType kv) {
    auto w = std::make_unique<BatchPrefillWithRaggedKVCacheWrapper>(workspace());
    PrefillPlanOptions po;
    po.kv_data_type = kv;
    w->plan(int_tensor({0, 2}), int_tensor({0, 4}), kHq, kHkv, kD, po);
    return w;
  };
  auto sf = [](PagedKVCache c) {
    AttentionRunOptions o;
    o.kv_cache_sf = std::move(c);
    return o;
  };
  const auto w8 = planned(DType::kUInt8);
  // A uint8 plan run without scales; scales given to a 16-bit plan.
  EXPECT_FI_ERROR(w8->run(q, k.codes, v.codes, AttentionRunOptions()), op, "kv_cache_sf");
  const Tensor z = Tensor::zeros({4, kHkv, kD}, DType::kFloat16);
  EXPECT_FI_ERROR(planned(DType::kFloat16)->run(q, z, z, sf({k.sf, v.sf})), op, "kv_cache_sf");
  // Scales of the wrong width, too few rows, a 16-bit dtype, a 2-D tensor, a bad stacked tensor.
  EXPECT_FI_ERROR(w8->run(q, k.codes, v.codes, sf({k.sf.slice(2, 0, 2), v.sf})), op, "kv_cache_sf");
  EXPECT_FI_ERROR(w8->run(q, k.codes, v.codes, sf({k.sf, v.sf.slice(0, 0, 3)})), op, "kv_cache_sf");
  EXPECT_FI_ERROR(w8->run(q, k.codes, v.codes, sf({k.sf.to(DType::kFloat16).contiguous(), v.sf})),
                  op, "kv_cache_sf");
  EXPECT_FI_ERROR(w8->run(q, k.codes, v.codes, sf({k.sf.select(1, 0), v.sf})), op, "kv_cache_sf");
  EXPECT_FI_ERROR(
      w8->run(q, k.codes, v.codes, sf(PagedKVCache(stack1(k.sf, v.sf).transpose(0, 1)))), op,
      "kv_cache_sf");
  // Packed codes of the wrong width name k / v.
  EXPECT_FI_ERROR(w8->run(q, k.codes.slice(2, 0, 16), v.codes, sf({k.sf, v.sf})), op, "k");
  EXPECT_FI_ERROR(w8->run(q, k.codes, v.codes.slice(2, 0, 16), sf({k.sf, v.sf})), op, "v");

  const char* sp = "single_prefill_with_kv_cache";
  auto single = [&](const Tensor& kk, const Tensor& vv, std::optional<PagedKVCache> s) {
    return single_prefill_with_kv_cache(q, kk, vv, {}, {}, {}, {}, {}, {}, false, "NHD", "NONE",
                                        false, std::nullopt, -1, std::nullopt, std::nullopt,
                                        std::nullopt, "auto", false, std::move(s));
  };
  // One tensor instead of upstream's (k_scales, v_scales) tuple; no scales for uint8 k / v;
  // 16-bit k / v with scales; scales of the wrong width; packed head_dim that is not q's.
  EXPECT_FI_ERROR(single(k.codes, v.codes, PagedKVCache(k.sf)), sp, "kv_cache_sf");
  EXPECT_FI_ERROR(single(k.codes, v.codes, PagedKVCache(Tensor(), v.sf)), sp, "kv_cache_sf");
  EXPECT_FI_ERROR(single(k.codes, v.codes, std::nullopt), sp, "kv_cache_sf");
  EXPECT_FI_ERROR(single(z, z, PagedKVCache(k.sf, v.sf)), sp, "k");
  EXPECT_FI_ERROR(single(k.codes, v.codes, PagedKVCache(k.sf, v.sf.slice(2, 0, 2))), sp,
                  "kv_cache_sf");
  EXPECT_FI_ERROR(single(k.codes.slice(2, 0, 16), v.codes, PagedKVCache(k.sf, v.sf)), sp, "k");
}

// Upstream's fa2/fa3 ragged run passes o_scale to no kernel (only its cutlass backend reads it):
// the output is the same with or without it.
TEST(RaggedOScale, HasNoEffectOnFa2) {
  const Tensor q = testing::rand_tensor({5, 2, 64}, DType::kFloat16, 1, -1.0, 1.0);
  const Tensor k = testing::rand_tensor({9, 1, 64}, DType::kFloat16, 2, -1.0, 1.0);
  const Tensor v = testing::rand_tensor({9, 1, 64}, DType::kFloat16, 3, -1.0, 1.0);
  BatchPrefillWithRaggedKVCacheWrapper w(workspace());
  PrefillPlanOptions po;
  po.causal = true;
  w.plan(int_tensor({0, 2, 5}), int_tensor({0, 4, 9}), 2, 1, 64, po);
  AttentionRunOptions plain, scaled;
  scaled.o_scale = 0.25;
  const AttentionOutput a = w.run(q, k, v, plain);
  const AttentionOutput b = w.run(q, k, v, scaled);
  EXPECT_TRUE(testing::all_close(b.out, a.out, {0.0, 0.0}));
  // Sanity: the output is not trivially zero (so a scaled result would differ).
  EXPECT_GT(std::abs(a.out.to_double_vector()[0]) + std::abs(a.out.to_double_vector()[1]), 0.0);
}

// BatchDecodeWithPagedKVCacheWrapper(backend="trtllm-gen") reads request b's pages from plan's
// block_tables (lengths from indptr / last_page_len), as upstream's trtllm-gen decode does; fa2
// stores the table and never reads it. Here `indices` names other pages (page 7, never the
// right one), so only a run that reads block_tables matches the fp64 formula.
TEST(DecodeBlockTables, TrtllmGenBackendReadsThem) {
  const Nvfp4Cache c = make_nvfp4(8, kPs, kHkv, kD, true, 17);
  const std::vector<Req> reqs = decode_reqs();
  const Table t = table_of(reqs, kPs);
  const Tensor wrong = int_tensor({7, 7, 7, 7, 7});
  const Tensor q = testing::rand_tensor({2, kHq, kD}, DType::kFloat16, 8, -1.0, 1.0);
  BatchDecodePlanOptions po;
  po.kv_data_type = DType::kUInt8;
  po.block_tables = t.block_tables;
  AttentionRunOptions ro;
  ro.kv_cache_sf = PagedKVCache(c.k_sf, c.v_sf);
  const std::vector<double> ref = reference(q, c, reqs, 1.0 / std::sqrt(double(kD)), 1.0, false);
  BatchDecodeWithPagedKVCacheWrapper w(workspace(), "HND", false, false, std::nullopt, std::nullopt,
                                       std::nullopt, "trtllm-gen");
  w.plan(t.indptr, wrong, t.last, kHq, kHkv, kD, kPs, po);
  const AttentionOutput r = w.run(q, PagedKVCache(c.k, c.v), ro);
  EXPECT_TRUE(testing::all_close(r.out, ref, kTol));
  // fa2 ignores block_tables: the same as a plan without them, reading `wrong`'s page 7.
  BatchDecodeWithPagedKVCacheWrapper f(workspace(), "HND");
  f.plan(t.indptr, wrong, t.last, kHq, kHkv, kD, kPs, po);
  BatchDecodePlanOptions plain = po;
  plain.block_tables.reset();
  BatchDecodeWithPagedKVCacheWrapper g(workspace(), "HND");
  g.plan(t.indptr, wrong, t.last, kHq, kHkv, kD, kPs, plain);
  EXPECT_TRUE(testing::all_close(f.run(q, PagedKVCache(c.k, c.v), ro).out,
                                 g.run(q, PagedKVCache(c.k, c.v), ro).out, {0.0, 0.0}));
  EXPECT_FALSE(testing::all_close(f.run(q, PagedKVCache(c.k, c.v), ro).out, ref, kTol));
  // Bad tables: too few columns, a negative needed entry, not int32.
  const char* op = "BatchDecodeWithPagedKVCacheWrapper.plan";
  BatchDecodePlanOptions narrow = po;
  narrow.block_tables = t.block_tables.slice(1, 0, 2);
  EXPECT_FI_ERROR(w.plan(t.indptr, wrong, t.last, kHq, kHkv, kD, kPs, narrow), op, "block_tables");
  BatchDecodePlanOptions neg = po;
  neg.block_tables = int_tensor({4, -1, 0, 0, 5, 3, 0, 0}).view({2, 4});
  EXPECT_FI_ERROR(w.plan(t.indptr, wrong, t.last, kHq, kHkv, kD, kPs, neg), op, "block_tables");
  BatchDecodePlanOptions i64 = po;
  i64.block_tables = t.block_tables.to(DType::kInt64);
  EXPECT_FI_ERROR(w.plan(t.indptr, wrong, t.last, kHq, kHkv, kD, kPs, i64), op, "block_tables");
}

// xqa with an fp8 output: upstream's xqa kernels scale KV by bmm2_scale * o_scale and multiply
// an fp8 output by rcp_out_scale = 1 / o_scale (xqa_batch_decode_with_kv_cache: fp8(bmm2 * o);
// flashinfer.xqa.xqa: fp8(kv_scale * o * rcp_out_scale)); conversion saturates at +-448.
TEST(XqaFp8Output, MatchesFp64AndSaturates) {
  const Nvfp4Cache c = make_nvfp4(8, kPs, kHkv, kD, false, 18);
  const std::vector<Req> reqs = decode_reqs();
  const Table t = table_of(reqs, kPs);
  const Tensor q = testing::rand_tensor({2, kHq, kD}, DType::kBFloat16, 9, -1.0, 1.0);
  const Value sf = to_value(PagedKVCache(c.k_sf, c.v_lin));
  const PagedKVCache cache(c.k, c.v);
  auto run = [&](const Tensor& out, double bmm2, double o_scale) {
    return xqa_batch_decode_with_kv_cache(q, cache, workspace(), t.block_tables, t.seq_lens, 10,
                                          0.15, bmm2, -1, out, std::nullopt, "NHD", std::nullopt, 1,
                                          o_scale, std::nullopt, sf);
  };
  const std::vector<double> ref = reference(q, c, reqs, 0.15, kVg, false);
  // fp8 e4m3 keeps 3 mantissa bits: relative error up to 2^-4.
  const Tensor o8 = run(Tensor::zeros({2, kHq, kD}, DType::kFloat8E4M3FN), kVg, 0.5);
  EXPECT_TRUE(testing::all_close(o8, ref, {1e-2, 0.07}));
  // A 16-bit output keeps the o_scale factor.
  std::vector<double> half = ref;
  for (double& x : half) x *= 0.5;
  EXPECT_TRUE(
      testing::all_close(run(Tensor::zeros({2, kHq, kD}, DType::kBFloat16), kVg, 0.5), half, kTol));
  // Saturation: 1000x the result is beyond e4m3's 448 for most elements; none is NaN.
  const Tensor big = run(Tensor::zeros({2, kHq, kD}, DType::kFloat8E4M3FN), 1000.0 * kVg, 1.0);
  int saturated = 0;
  const std::vector<double> bv = big.to_double_vector();
  for (std::size_t i = 0; i < bv.size(); ++i) {
    ASSERT_FALSE(std::isnan(bv[i])) << i;
    if (std::abs(ref[i] * 1000.0) > 464.0) {
      EXPECT_EQ(std::abs(bv[i]), 448.0) << i;
      ++saturated;
    }
  }
  EXPECT_GT(saturated, 0);
  // flashinfer.xqa.xqa: fp8(kv_scale * o * rcp_out_scale).
  const Tensor out = Tensor::zeros({2, 1, kHq, kD}, DType::kFloat8E4M3FN);
  xqa(q.unsqueeze(1), c.k, c.v, t.block_tables, t.seq_lens.reshape({2, 1}), out, workspace(),
      workspace(), kHkv, kPs, std::nullopt, 0.15 * std::sqrt(double(kD)) / kVg, kVg, 0, "NHD",
      std::nullopt, std::nullopt, 2.0, 1, std::nullopt, std::nullopt, c.k_sf, c.v_lin);
  std::vector<double> twice = ref;
  for (double& x : twice) x *= 2.0;
  EXPECT_TRUE(testing::all_close(out.select(1, 0), twice, {2e-2, 0.07}));
  EXPECT_FI_ERROR(
      xqa(q.unsqueeze(1), c.k, c.v, t.block_tables, t.seq_lens.reshape({2, 1}), out, workspace(),
          workspace(), kHkv, kPs, std::nullopt, 1.0, 1.0, 0, "NHD", std::nullopt, std::nullopt, 0.0,
          1, std::nullopt, std::nullopt, c.k_sf, c.v_lin),
      "xqa", "rcp_out_scale");
}

fs::path temp_dir(const char* name) {
  fs::path d = fs::temp_directory_path() / ("fi_nvfp4_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  return d;
}

TEST(Nvfp4Attention, RecordAndReplay) {
  const fs::path dir = temp_dir("rec");
  const Nvfp4Cache c = make_nvfp4(8, kPs, kHkv, kD, true, 16);
  const std::vector<Req> reqs = prefill_reqs();
  const Table t = table_of(reqs, kPs);
  {
    recorder::Config cfg;
    cfg.dump_dir = dir.string();
    recorder::start(cfg, [](const std::string&) {});
    const Tensor q = testing::rand_tensor({7, kHq, kD}, DType::kBFloat16, 7, -1.0, 1.0);
    BatchPrefillWithPagedKVCacheWrapper w(workspace(), "HND");
    PrefillPlanOptions po;
    po.causal = true;
    po.q_data_type = DType::kBFloat16;
    po.kv_data_type = DType::kUInt8;
    w.plan(t.qo_indptr, t.indptr, t.indices, t.last, kHq, kHkv, kD, kPs, po);
    AttentionRunOptions ro;
    ro.k_scale = kKg;
    ro.v_scale = kVg;
    ro.kv_cache_sf = PagedKVCache(c.k_sf, c.v_sf);
    w.run(q, PagedKVCache(c.k, c.v), ro);
    trtllm_batch_context_with_kv_cache(
        q, PagedKVCache(c.k, c.v), workspace(), t.block_tables, t.seq_lens, 4, 10, 0.1, kVg, 2,
        t.qo_indptr, int_tensor({0, 7, 17}), -1, std::nullopt, std::nullopt, std::nullopt,
        std::nullopt, "HND", std::nullopt, std::nullopt, to_value(PagedKVCache(c.k_sf, c.v_sf)));
    BatchDecodeWithPagedKVCacheWrapper d(workspace(), "HND", false, false, std::nullopt,
                                         std::nullopt, std::nullopt, "trtllm-gen");
    const Table td = table_of(decode_reqs(), kPs);
    BatchDecodePlanOptions dpo;
    dpo.q_data_type = DType::kBFloat16;
    dpo.kv_data_type = DType::kUInt8;
    dpo.block_tables = td.block_tables;
    d.plan(td.indptr, int_tensor({7, 7, 7, 7, 7}), td.last, kHq, kHkv, kD, kPs, dpo);
    d.run(q.slice(0, 0, 2), PagedKVCache(c.k, c.v), ro);
    BatchAttention b("HND", "cpu");
    b.plan(t.qo_indptr, t.indptr, t.indices, t.seq_lens, kHq, kHkv, kD, kD, kPs, true, std::nullopt,
           std::nullopt, DType::kBFloat16, DType::kUInt8);
    b.run(q, PagedKVCache(c.k, c.v), std::nullopt, std::nullopt, kKg, kVg, 0.0, std::nullopt,
          PagedKVCache(c.k_sf, c.v_sf));
    recorder::stop();
  }
  // prefill __init__, plan, run; trtllm context; decode x3; BatchAttention x3
  testing::replay_expecting_every_call_to_pass(dir, 10u);
  fs::remove_all(dir);
}

// Ragged wrapper __init__ / plan / run and single_prefill with NVFP4 K/V, recorded and replayed.
TEST(Nvfp4Attention, RaggedAndSingleRecordAndReplay) {
  const fs::path dir = temp_dir("rec_ragged");
  const Nvfp4Rows k = make_rows(9, kHkv, kD, true, 41), v = make_rows(9, kHkv, kD, true, 42);
  {
    recorder::Config cfg;
    cfg.dump_dir = dir.string();
    recorder::start(cfg, [](const std::string&) {});
    const Tensor q = testing::rand_tensor({5, kHq, kD}, DType::kBFloat16, 43, -1.0, 1.0);
    BatchPrefillWithRaggedKVCacheWrapper w(workspace(), "HND");
    PrefillPlanOptions po;
    po.causal = true;
    po.q_data_type = DType::kBFloat16;
    po.kv_data_type = DType::kUInt8;
    w.plan(int_tensor({0, 2, 5}), int_tensor({0, 4, 9}), kHq, kHkv, kD, po);
    AttentionRunOptions ro;
    ro.k_scale = kKg;
    ro.v_scale = kVg;
    ro.kv_cache_sf = PagedKVCache(k.sf, v.sf);
    w.run(q, k.codes, v.codes, ro);
    single_prefill_with_kv_cache(q, k.codes, v.codes, {}, {}, {}, {}, {}, {}, true, "HND", "NONE",
                                 false, std::nullopt, -1, std::nullopt, std::nullopt, std::nullopt,
                                 "fa2", true, PagedKVCache(k.sf, v.sf), kKg, kVg);
    recorder::stop();
  }
  testing::replay_expecting_every_call_to_pass(dir,
                                               4u);  // ragged __init__, plan, run; single prefill
  fs::remove_all(dir);
}

// Calls written by Python in upstream's recorder layout the way vLLM passes them: the paged
// prefill wrapper planned with kv_data_type=torch.uint8 and run with kv_cache_sf=(k_sf, v_sf),
// k_scale / v_scale the global scales; trtllm decode with the scales as a stacked tensor. Scales
// are float8_e4m3fn codes; V's are interleaved with upstream's reshape/permute; the expected
// outputs are a float64 formula over the linear scales. Then the ragged wrapper and
// single_prefill_with_kv_cache with packed K/V and (k_sf, v_sf), both linear.
TEST(Nvfp4Attention, UpstreamWrittenDumpReplaysHere) {
  const std::string body = R"PY(
import math
torch.manual_seed(1)
P, S, H, HQ, D = 6, 4, 2, 4, 64
SF = D // 16
kq, vq = rbytes((P, H, S, D // 2)), rbytes((P, H, S, D // 2))        # HND codes
ksc, vsc = rbytes((P, H, S, SF), 0x28, 0x41), rbytes((P, H, S, SF), 0x28, 0x41)
vsw = vsc.view(P, H, S // 4, 4, 4, SF // 4).permute(0, 1, 2, 4, 5, 3).contiguous().view(P, H, S, SF)
def deq(codes, sc):  # [P, H, S, D] float64
    lo, hi = E2M1[(codes & 0xF).long()], E2M1[(codes >> 4).long()]
    vals = torch.stack([lo, hi], -1).reshape(P, H, S, D).double()
    return vals * E4M3[sc.long()].double().repeat_interleave(16, -1)
K, V = deq(kq, ksc), deq(vq, vsc)
def attend(q, pages, kv_len, qo_len, scale, vscale, causal):
    k = torch.cat([K[p] for p in pages], 1)[:, :kv_len]  # [H, kv, D]
    v = torch.cat([V[p] for p in pages], 1)[:, :kv_len]
    o = torch.zeros(qo_len, HQ, D, dtype=torch.float64)
    for i in range(qo_len):
        n = kv_len - qo_len + i + 1 if causal else kv_len
        for h in range(HQ):
            g = h // (HQ // H)
            s = (k[g, :n] @ q[i, h].double()) * scale
            p = torch.softmax(s, 0)
            o[i, h] = (p[:, None] * v[g, :n]).sum(0) * vscale
    return o
def tmeta(t, key):
    return {"type": "torch.Tensor", "shape": list(t.shape), "dtype": str(t.dtype),
            "stride": list(t.stride()), "device": "cuda:0", "requires_grad": False,
            "is_contiguous": t.is_contiguous(), "tensor_key": key}
def fp8meta(t, key):
    m = tmeta(t, key); m["dtype"] = "torch.float8_e4m3fn"; return m
SELF_ID = 140001
SELF = {"type": "BatchPrefillWithPagedKVCacheWrapper",
        "repr": "<flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper object at 0x%x>" % SELF_ID}
def rec_self(name, tensors, meta, outs):
    record(name, "flashinfer.prefill", tensors, dict(meta, arg_0=SELF), outs)
    call = "%s/20261122_180000_%03d_pid4242_%s_call%04d" % (d, seq[0], name, seq[0])
    j = json.loads(open(call + "/metadata.jsonl").read())
    j["self_id"] = SELF_ID
    open(call + "/metadata.jsonl", "w").write(json.dumps(j) + "\n")
def dt(x):
    return {"type": "torch.dtype", "value": x}
ws = torch.zeros(4096, dtype=torch.uint8)
rec_self("BatchPrefillWithPagedKVCacheWrapper.__init__",
         {"arg_1": ws}, {"arg_1": tmeta(ws, "arg_1"), "arg_2": "HND"}, None)
qo, kvp, kvi, last = [0, 3, 7], [0, 2, 5], [4, 1, 0, 5, 3], [3, 2]
ti = lambda x: torch.tensor(x, dtype=torch.int32)
rec_self("BatchPrefillWithPagedKVCacheWrapper.plan",
       {"arg_1": ti(qo), "arg_2": ti(kvp), "arg_3": ti(kvi), "arg_4": ti(last)},
       {"arg_1": tmeta(ti(qo), "arg_1"), "arg_2": tmeta(ti(kvp), "arg_2"),
        "arg_3": tmeta(ti(kvi), "arg_3"), "arg_4": tmeta(ti(last), "arg_4"), "arg_5": HQ,
        "arg_6": H, "arg_7": D, "arg_8": S, "kwarg_causal": True,
        "kwarg_q_data_type": dt("torch.bfloat16"), "kwarg_kv_data_type": dt("torch.uint8")}, None)
q = torch.randn(7, HQ, D).to(torch.bfloat16)
kg, vg = 0.5, 1.5
out = torch.cat([attend(q[0:3], [4, 1], 7, 3, kg / math.sqrt(D), vg, True),
                 attend(q[3:7], [0, 5, 3], 10, 4, kg / math.sqrt(D), vg, True)])
rec_self("BatchPrefillWithPagedKVCacheWrapper.run",
       {"arg_1": q, "arg_2__0": kq, "arg_2__1": vq,
        "kwarg_kv_cache_sf__0": ("fp8", ksc), "kwarg_kv_cache_sf__1": ("fp8", vsw)},
       {"arg_1": tmeta(q, "arg_1"),
        "arg_2": {"type": "tuple", "length": 2, "truncated": False,
                  "items": [tmeta(kq, "arg_2__0"), tmeta(vq, "arg_2__1")]},
        "kwarg_k_scale": kg, "kwarg_v_scale": vg,
        "kwarg_kv_cache_sf": {"type": "tuple", "length": 2, "truncated": False,
                              "items": [fp8meta(ksc, "kwarg_kv_cache_sf__0"),
                                        fp8meta(vsw, "kwarg_kv_cache_sf__1")]}},
       out.to(torch.bfloat16))
# trtllm decode, one stacked [P, 2, H, S, ...] cache and scale tensor, q_len_per_req 1.
kv5 = torch.stack([kq, vq], 1)
sf5 = torch.stack([ksc, vsw], 1)
qd = torch.randn(2, HQ, D).to(torch.float16)
table = ti([[4, 1, -1], [0, 5, 3]])
lens = ti([7, 10])
outd = torch.cat([attend(qd[0:1], [4, 1], 7, 1, 0.2, vg, False),
                  attend(qd[1:2], [0, 5, 3], 10, 1, 0.2, vg, False)])
record("trtllm_batch_decode_with_kv_cache", "flashinfer.decode",
       {"kwarg_query": qd, "kwarg_kv_cache": kv5, "kwarg_workspace_buffer": ws,
        "kwarg_block_tables": table, "kwarg_seq_lens": lens, "kwarg_kv_cache_sf": ("fp8", sf5)},
       {"kwarg_query": tmeta(qd, "kwarg_query"), "kwarg_kv_cache": tmeta(kv5, "kwarg_kv_cache"),
        "kwarg_workspace_buffer": tmeta(ws, "kwarg_workspace_buffer"),
        "kwarg_block_tables": tmeta(table, "kwarg_block_tables"),
        "kwarg_seq_lens": tmeta(lens, "kwarg_seq_lens"), "kwarg_max_seq_len": 10,
        "kwarg_bmm1_scale": 0.2, "kwarg_bmm2_scale": vg, "kwarg_kv_layout": "HND",
        "kwarg_kv_cache_sf": fp8meta(sf5, "kwarg_kv_cache_sf")},
       outd.to(torch.float16))
# BatchAttention (flashinfer.attention._core): kv_cache and kv_cache_sf as (k, v) pairs, the
# global scales as k_scale / v_scale floats; run returns (out, lse).
BA_ID = 140002
BA = {"type": "BatchAttention",
      "repr": "<flashinfer.attention._core.BatchAttention object at 0x%x>" % BA_ID}
def rec_ba(name, tensors, meta, outs):
    record(name, "flashinfer.attention._core", tensors, dict(meta, arg_0=BA), outs)
    call = "%s/20261122_180000_%03d_pid4242_%s_call%04d" % (d, seq[0], name, seq[0])
    j = json.loads(open(call + "/metadata.jsonl").read())
    j["self_id"] = BA_ID
    open(call + "/metadata.jsonl", "w").write(json.dumps(j) + "\n")
rec_ba("BatchAttention.__init__", {}, {"kwarg_kv_layout": "HND", "kwarg_device": "cuda"}, None)
lens = ti([7, 10])
rec_ba("BatchAttention.plan",
       {"arg_1": ti(qo), "arg_2": ti(kvp), "arg_3": ti(kvi), "arg_4": lens},
       {"arg_1": tmeta(ti(qo), "arg_1"), "arg_2": tmeta(ti(kvp), "arg_2"),
        "arg_3": tmeta(ti(kvi), "arg_3"), "arg_4": tmeta(lens, "arg_4"), "arg_5": HQ,
        "arg_6": H, "arg_7": D, "arg_8": D, "arg_9": S, "kwarg_causal": True,
        "kwarg_sm_scale": 0.125, "kwarg_q_data_type": dt("torch.bfloat16"),
        "kwarg_kv_data_type": dt("torch.uint8")}, None)
outb = torch.cat([attend(q[0:3], [4, 1], 7, 3, 0.125 * kg, vg, True),
                  attend(q[3:7], [0, 5, 3], 10, 4, 0.125 * kg, vg, True)]).to(torch.bfloat16)
ob, lb = torch.zeros(7, HQ, D, dtype=torch.bfloat16), torch.zeros(7, HQ)
# The LSE is checked by replay too: base 2 of the scaled logits, from the same float64 formula.
def lse2(q, pages, kv_len, qo_len, scale):
    k = torch.cat([K[p] for p in pages], 1)[:, :kv_len]
    r = torch.zeros(qo_len, HQ, dtype=torch.float64)
    for i in range(qo_len):
        n = kv_len - qo_len + i + 1
        for h in range(HQ):
            s = (k[h // (HQ // H), :n] @ q[i, h].double()) * scale
            r[i, h] = torch.logsumexp(s, 0) / math.log(2)
    return r
lseb = torch.cat([lse2(q[0:3], [4, 1], 7, 3, 0.125 * kg), lse2(q[3:7], [0, 5, 3], 10, 4, 0.125 * kg)])
rec_ba("BatchAttention.run",
       {"arg_1": q, "arg_2__0": kq, "arg_2__1": vq, "kwarg_out": ob, "kwarg_lse": lb,
        "kwarg_kv_cache_sf__0": ("fp8", ksc), "kwarg_kv_cache_sf__1": ("fp8", vsw)},
       {"arg_1": tmeta(q, "arg_1"),
        "arg_2": {"type": "tuple", "length": 2, "truncated": False,
                  "items": [tmeta(kq, "arg_2__0"), tmeta(vq, "arg_2__1")]},
        "kwarg_out": tmeta(ob, "kwarg_out"), "kwarg_lse": tmeta(lb, "kwarg_lse"),
        "kwarg_k_scale": kg, "kwarg_v_scale": vg,
        "kwarg_kv_cache_sf": {"type": "tuple", "length": 2, "truncated": False,
                              "items": [fp8meta(ksc, "kwarg_kv_cache_sf__0"),
                                        fp8meta(vsw, "kwarg_kv_cache_sf__1")]}},
       [outb, lseb.float()])
# Ragged wrapper and single_prefill_with_kv_cache (upstream's NVFP4 test calls): packed HND K/V
# [H, N, D / 2] with linear scales [H, N, D / 16] for both, k_scale / v_scale the global scales.
N = 9
rk, rv = rbytes((H, N, D // 2)), rbytes((H, N, D // 2))
rks, rvs = rbytes((H, N, SF), 0x28, 0x41), rbytes((H, N, SF), 0x28, 0x41)
def deq_rows(codes, sc):  # [H, N, D] float64
    lo, hi = E2M1[(codes & 0xF).long()], E2M1[(codes >> 4).long()]
    vals = torch.stack([lo, hi], -1).reshape(H, N, D).double()
    return vals * E4M3[sc.long()].double().repeat_interleave(16, -1)
RK, RV = deq_rows(rk, rks), deq_rows(rv, rvs)
def attend_rows(q, lo, kv_len, qo_len, scale, vscale, causal):
    o = torch.zeros(qo_len, HQ, D, dtype=torch.float64)
    for i in range(qo_len):
        n = kv_len - qo_len + i + 1 if causal else kv_len
        for h in range(HQ):
            g = h // (HQ // H)
            s = (RK[g, lo:lo + n] @ q[i, h].double()) * scale
            p = torch.softmax(s, 0)
            o[i, h] = (p[:, None] * RV[g, lo:lo + n]).sum(0) * vscale
    return o
RG_ID = 140003
RG = {"type": "BatchPrefillWithRaggedKVCacheWrapper",
      "repr": "<flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper object at 0x%x>" % RG_ID}
def rec_rg(name, tensors, meta, outs):
    record(name, "flashinfer.prefill", tensors, dict(meta, arg_0=RG), outs)
    call = "%s/20261122_180000_%03d_pid4242_%s_call%04d" % (d, seq[0], name, seq[0])
    j = json.loads(open(call + "/metadata.jsonl").read())
    j["self_id"] = RG_ID
    open(call + "/metadata.jsonl", "w").write(json.dumps(j) + "\n")
rec_rg("BatchPrefillWithRaggedKVCacheWrapper.__init__",
       {"arg_1": ws}, {"arg_1": tmeta(ws, "arg_1"), "arg_2": "HND", "kwarg_backend": "fa2"}, None)
rqo, rkv = ti([0, 2, 5]), ti([0, 4, 9])
rec_rg("BatchPrefillWithRaggedKVCacheWrapper.plan",
       {"arg_1": rqo, "arg_2": rkv},
       {"arg_1": tmeta(rqo, "arg_1"), "arg_2": tmeta(rkv, "arg_2"), "arg_3": HQ, "arg_4": H,
        "arg_5": D, "kwarg_causal": True, "kwarg_q_data_type": dt("torch.bfloat16"),
        "kwarg_kv_data_type": dt("torch.uint8")}, None)
rq = torch.randn(5, HQ, D).to(torch.bfloat16)
outr = torch.cat([attend_rows(rq[0:2], 0, 4, 2, kg / math.sqrt(D), vg, True),
                  attend_rows(rq[2:5], 4, 5, 3, kg / math.sqrt(D), vg, True)])
rec_rg("BatchPrefillWithRaggedKVCacheWrapper.run",
       {"arg_1": rq, "arg_2": rk, "arg_3": rv,
        "kwarg_kv_cache_sf__0": ("fp8", rks), "kwarg_kv_cache_sf__1": ("fp8", rvs)},
       {"arg_1": tmeta(rq, "arg_1"), "arg_2": tmeta(rk, "arg_2"), "arg_3": tmeta(rv, "arg_3"),
        "kwarg_k_scale": kg, "kwarg_v_scale": vg,
        "kwarg_kv_cache_sf": {"type": "tuple", "length": 2, "truncated": False,
                              "items": [fp8meta(rks, "kwarg_kv_cache_sf__0"),
                                        fp8meta(rvs, "kwarg_kv_cache_sf__1")]}},
       outr.to(torch.bfloat16))
sq = torch.randn(3, HQ, D).to(torch.float16)
outs = attend_rows(sq, 0, N, 3, kg / math.sqrt(D), vg, False).to(torch.float16)
record("single_prefill_with_kv_cache", "flashinfer.prefill",
       {"arg_0": sq, "arg_1": rk, "arg_2": rv,
        "kwarg_kv_cache_sf__0": ("fp8", rks), "kwarg_kv_cache_sf__1": ("fp8", rvs)},
       {"arg_0": tmeta(sq, "arg_0"), "arg_1": tmeta(rk, "arg_1"), "arg_2": tmeta(rv, "arg_2"),
        "kwarg_causal": False, "kwarg_kv_layout": "HND", "kwarg_backend": "fa2",
        "kwarg_k_scale": kg, "kwarg_v_scale": vg,
        "kwarg_kv_cache_sf": {"type": "tuple", "length": 2, "truncated": False,
                              "items": [fp8meta(rks, "kwarg_kv_cache_sf__0"),
                                        fp8meta(rvs, "kwarg_kv_cache_sf__1")]}},
       outs)
)PY";
  if (!testing::run_upstream_dump_script("fi_nvfp4_attn_dump", body, 11)) {
    GTEST_SKIP() << "python3-torch not installed";
  }
}

}  // namespace
}  // namespace flashinfer
