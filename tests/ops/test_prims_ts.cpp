// Task-scheduled attention (flashinfer.attention.prims_ts): every entry point against an fp64
// softmax written here from upstream's test oracles (gathered pages, bottom-right causal
// windows, bmm1 / bmm2 scales, MLA's 576 / 512 split, block rows and validity bits), wrappers
// equal to their one-shot forms bit for bit, upstream's refusals by name, record / replay.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

#include "api/device_props.h"
#include "flashinfer/flashinfer.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

using namespace flashinfer::prims_ts;  // NOLINT: the module under test

constexpr DType kBf = DType::kBFloat16;
constexpr DType kF16 = DType::kFloat16;
constexpr DType kE4 = DType::kFloat8E4M3FN;
constexpr DType kI32 = DType::kInt32;

Tensor i32(const std::vector<double>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, kI32);
}

// One query's fp64 attention: keys t in `keys`, rows k(t) / v(t), logits q.k * s1, out * s2.
std::vector<double> attend(const std::vector<double>& q, const std::vector<int64_t>& keys,
                           const std::function<std::vector<double>(int64_t)>& k,
                           const std::function<std::vector<double>(int64_t)>& v, int64_t dv,
                           double s1, double s2) {
  std::vector<double> o(static_cast<size_t>(dv), 0.0);
  if (keys.empty()) return o;
  std::vector<double> s;
  double m = -1e300;
  for (int64_t t : keys) {
    const auto kr = k(t);
    double a = 0;
    for (size_t d = 0; d < q.size(); ++d) a += q[d] * kr[d];
    s.push_back(a * s1);
    m = std::max(m, s.back());
  }
  double l = 0;
  for (size_t j = 0; j < keys.size(); ++j) {
    const double e = std::exp(s[j] - m);
    l += e;
    const auto vr = v(keys[j]);
    for (int64_t d = 0; d < dv; ++d) o[d] += e * vr[d];
  }
  for (auto& x : o) x = x / l * s2;
  return o;
}

// |got - want| <= tol * (1 + |want|) everywhere.
::testing::AssertionResult near(const Tensor& got, const std::vector<double>& want, double tol) {
  const auto g = got.to_double_vector();
  if (g.size() != want.size()) return ::testing::AssertionFailure() << "size " << g.size();
  for (size_t i = 0; i < g.size(); ++i) {
    if (!(std::fabs(g[i] - want[i]) <= tol * (1.0 + std::fabs(want[i])))) {
      return ::testing::AssertionFailure() << "element " << i << ": " << g[i] << " vs " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Visible keys of query i (q_len queries, kv keys): bottom-right causal, window_left + 1 keys.
std::vector<int64_t> visible(int64_t i, int64_t q_len, int64_t kv, bool causal, int64_t window) {
  const int64_t end = causal ? kv - q_len + i + 1 : kv;
  const int64_t begin = window >= 0 ? std::max<int64_t>(0, end - window - 1) : 0;
  std::vector<int64_t> r;
  for (int64_t t = begin; t < end; ++t) r.push_back(t);
  return r;
}

// A paged HND decode problem: B requests of kv_len[b] keys in pages of P (ids shuffled), q rows
// q_len[b] each.
struct PagedCase {
  int64_t Hq, Hkv, D, P;
  std::vector<int64_t> kv_len, q_len;
  DType dtype;
};
struct PagedData {
  Tensor cache;  // [pages, 2, Hkv, P, D]
  std::vector<double> indptr, indices, last, seq;
  std::vector<int64_t> q0;
  int64_t total_q = 0, pages = 0;
};
PagedData paged_data(const PagedCase& c, uint64_t seed) {
  PagedData d;
  const auto B = static_cast<int64_t>(c.kv_len.size());
  d.indptr.push_back(0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = (c.kv_len[b] + c.P - 1) / c.P;
    d.pages += n;
    d.indptr.push_back(d.indptr.back() + static_cast<double>(n));
    d.last.push_back(static_cast<double>(c.kv_len[b] - (n - 1) * c.P));
    d.seq.push_back(static_cast<double>(c.kv_len[b]));
    d.q0.push_back(d.total_q);
    d.total_q += c.q_len[b];
  }
  for (int64_t j = 0; j < d.pages; ++j)
    d.indices.push_back(static_cast<double>((j * 5 + 3) % d.pages));
  d.pages += 1;  // one spare page nobody uses
  d.cache = rand_tensor({d.pages, 2, c.Hkv, c.P, c.D}, c.dtype, seed, -1.0, 1.0);
  return d;
}
// Expected [total_q, Hq, D] of a paged decode / context problem.
std::vector<double> paged_expected(const PagedCase& c, const PagedData& d, const Tensor& q,
                                   bool causal, int64_t window, double s1, double s2) {
  const auto qv = q.to_double_vector();
  const auto cv = d.cache.to_double_vector();
  const int64_t Hq = c.Hq, D = c.D, P = c.P, Hkv = c.Hkv;
  std::vector<double> out;
  for (size_t b = 0; b < c.kv_len.size(); ++b) {
    for (int64_t i = 0; i < c.q_len[b]; ++i) {
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t g = h / (Hq / Hkv);
        std::vector<double> qr(qv.begin() + ((d.q0[b] + i) * Hq + h) * D,
                               qv.begin() + ((d.q0[b] + i) * Hq + h + 1) * D);
        auto row = [&](int64_t t, int kv) {
          const auto page =
              static_cast<int64_t>(d.indices[static_cast<size_t>(d.indptr[b]) + t / P]);
          const int64_t at = (((page * 2 + kv) * Hkv + g) * P + t % P) * D;
          return std::vector<double>(cv.begin() + at, cv.begin() + at + D);
        };
        const auto o = attend(
            qr, visible(i, c.q_len[b], c.kv_len[b], causal, window),
            [&](int64_t t) { return row(t, 0); }, [&](int64_t t) { return row(t, 1); }, D, s1, s2);
        out.insert(out.end(), o.begin(), o.end());
      }
    }
  }
  return out;
}

// ---- decode -------------------------------------------------------------------------------------

TEST(PrimsTsDecode, MatchesFp64AcrossLayoutsMasksAndScales) {
  struct Run {
    PagedCase c;
    int64_t seq_len_q;
    bool packed, causal;
    int64_t window;
    double bmm1, bmm2;
    DType out;
  };
  const std::vector<Run> runs = {
      // One query a request (3-D q), GQA 4, tuple-free combined cache, default scales.
      {{8, 2, 64, 16, {37, 16, 70}, {1, 1, 1}, kBf}, 1, false, false, -1, 0.0, 1.0, kBf},
      // Four queries a request (4-D q), causal with a window of 5 (6 keys), fp16, both scales.
      {{4, 4, 128, 32, {40, 65}, {4, 4}, kF16}, 4, false, true, 5, 0.07, 0.625, kF16},
      // Packed queries of 1, 3 and 2 rows, causal, window 0 (the query's own key).
      {{2, 1, 64, 16, {17, 33, 2}, {1, 3, 2}, kBf}, 1, true, true, 0, 0.2, 1.0, kBf},
      // fp8 e4m3 in, fp16 out.
      {{4, 2, 64, 16, {50, 9}, {1, 1}, kE4}, 1, false, false, -1, 0.05, 2.0, kF16},
  };
  for (const Run& r : runs) {
    const PagedData d = paged_data(r.c, 17 + r.c.D);
    const int64_t B = static_cast<int64_t>(r.c.kv_len.size());
    const Shape qs = r.packed           ? Shape{d.total_q, r.c.Hq, r.c.D}
                     : r.seq_len_q == 1 ? Shape{B, r.c.Hq, r.c.D}
                                        : Shape{B, r.seq_len_q, r.c.Hq, r.c.D};
    const Tensor q = rand_tensor(qs, r.c.dtype, 5 + r.c.Hq, -1.0, 1.0);
    const std::optional<Tensor> qo = r.packed ? std::optional<Tensor>(i32([&] {
      std::vector<double> v{0};
      for (int64_t l : r.c.q_len) v.push_back(v.back() + static_cast<double>(l));
      return v;
    }()))
                                              : std::nullopt;
    const std::string mask = r.causal ? "causal" : "dense";
    const std::optional<double> s1 = r.bmm1 > 0 ? std::optional<double>(r.bmm1) : std::nullopt;
    const double want_s1 = r.bmm1 > 0 ? r.bmm1 : 1.0 / std::sqrt(static_cast<double>(r.c.D));
    const auto want = paged_expected(r.c, d, q, r.causal, r.window, want_s1, r.bmm2);
    const Tensor one = batch_decode_with_paged_kv_cache(
        q, d.cache, i32(d.indptr), i32(d.indices), i32(d.last), r.seq_len_q, qo,
        r.packed ? std::optional<int64_t>(3) : std::nullopt, mask, r.window, "HND", s1, r.bmm2,
        std::nullopt, r.out);
    EXPECT_EQ(one.shape(), qs);
    EXPECT_EQ(one.dtype(), r.out);
    EXPECT_TRUE(near(one, want, r.out == kBf ? 1e-2 : 2e-3)) << r.c.D << " " << mask;
    // The wrapper (a (K, V) pair this time) and the standalone form give the same bits.
    BatchDecodePagedTSWrapper w;
    w.plan(i32(d.indptr), i32(d.indices), i32(d.last), r.c.Hq, r.c.Hkv, r.c.D, r.c.P, r.seq_len_q,
           qo, r.packed ? std::optional<int64_t>(3) : std::nullopt, r.c.dtype, std::nullopt, r.out,
           mask, r.window);
    const Tensor k = d.cache.select(1, 0), v = d.cache.select(1, 1);
    const Tensor viaw = w.run(q, PagedKVCache(k, v), s1, r.bmm2);
    EXPECT_TRUE(all_close(viaw, one, {0.0, 0.0}));
    const Tensor ws = Tensor::zeros({1024}, DType::kUInt8);
    const Tensor sa = prims_ts_batch_decode_with_kv_cache(
        q, d.cache, ws, i32(d.indptr), i32(d.indices), i32(d.seq), 80, r.seq_len_q, qo,
        r.packed ? std::optional<int64_t>(3) : std::nullopt, s1, r.bmm2, std::nullopt, r.out, mask,
        r.window);
    EXPECT_TRUE(all_close(sa, one, {0.0, 0.0}));
  }
}

TEST(PrimsTsDecode, RefusesWhatUpstreamRefuses) {
  const PagedCase c{4, 2, 64, 16, {20}, {1}, kBf};
  const PagedData d = paged_data(c, 3);
  const Tensor q = rand_tensor({1, 4, 64}, kBf, 4);
  const char* op = "batch_decode_with_paged_kv_cache";
  auto call = [&](const Tensor& qq, const PagedKVCache& cache, std::string mask, int64_t window,
                  std::string layout) {
    return batch_decode_with_paged_kv_cache(qq, cache, i32(d.indptr), i32(d.indices), i32(d.last),
                                            1, std::nullopt, std::nullopt, mask, window, layout);
  };
  try {
    (void)call(q, d.cache, "dense", -1, "NHD");
    ADD_FAILURE() << "NHD accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("supports kv_layout='HND' only"), std::string::npos);
  }
  EXPECT_FI_ERROR((void)call(q, d.cache, "dense", -1, "hnd"), op, "kv_layout");
  EXPECT_FI_ERROR((void)call(q, d.cache, "Causal", -1, "HND"), op, "mask_type");
  EXPECT_FI_ERROR((void)call(q, d.cache, "dense", 3, "HND"), op, "window_left");  // needs causal
  const Tensor c96 = rand_tensor({3, 2, 2, 16, 96}, kBf, 5);
  EXPECT_FI_ERROR((void)call(rand_tensor({1, 4, 96}, kBf, 6), c96, "dense", -1, "HND"), op,
                  "paged_kv_cache");
  const Tensor c8 = rand_tensor({3, 2, 2, 8, 64}, kBf, 5);
  EXPECT_FI_ERROR((void)call(q, c8, "dense", -1, "HND"), op, "paged_kv_cache");
  // q and the cache in different dtypes (the one-shot plans K/V in q's dtype, as upstream's);
  // an NHD-strided view passed as HND.
  EXPECT_FI_ERROR((void)call(q.to(kF16), d.cache, "dense", -1, "HND"), op, "paged_kv_cache");
  const Tensor nhd = rand_tensor({3, 2, 16, 2, 64}, kBf, 7).permute({0, 1, 3, 2, 4});
  EXPECT_FI_ERROR((void)call(q, nhd, "dense", -1, "HND"), op, "paged_kv_cache");
  // Causal with more queries than keys; run before plan; a page id outside the cache.
  BatchDecodePagedTSWrapper w;
  EXPECT_FI_ERROR((void)w.run(q, d.cache), "BatchDecodePagedTSWrapper.run", "self");
  EXPECT_FI_ERROR(w.plan(i32({0, 1}), i32({0}), i32({2}), 4, 2, 64, 16, 4, std::nullopt,
                         std::nullopt, kBf, std::nullopt, std::nullopt, "causal"),
                  "BatchDecodePagedTSWrapper.plan", "mask_type");
  EXPECT_FI_ERROR(w.plan(i32({0, 1}), i32({0}), i32({17}), 4, 2, 64, 16),
                  "BatchDecodePagedTSWrapper.plan", "paged_kv_last_page_len");
  EXPECT_FI_ERROR(w.plan(i32({0, 1}), i32({0}), i32({5}), 4, 2, 96, 16),
                  "BatchDecodePagedTSWrapper.plan", "head_dim");
  EXPECT_FI_ERROR(w.plan(i32({0, 1}), i32({0}), i32({5}), 4, 2, 64, 16, 1, std::nullopt,
                         std::nullopt, kF16, DType::kFloat32),
                  "BatchDecodePagedTSWrapper.plan", "kv_data_type");
  w.plan(i32({0, 2}), i32({0, 9}), i32({4}), 4, 2, 64, 16, 1, std::nullopt, std::nullopt, kBf);
  EXPECT_FI_ERROR((void)w.run(q, d.cache), "BatchDecodePagedTSWrapper.run", "paged_kv_indices");
  try {
    BatchDecodePagedTSWrapper nhd_wrapper("NHD");
    ADD_FAILURE() << "NHD wrapper made";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
}

// ---- MLA decode ---------------------------------------------------------------------------------

TEST(PrimsTsMla, MatchesFp64WithTheLatentAsValues) {
  // Three requests through a block table of 4 columns, page 16, 8 heads; fixed SQ 2 causal and
  // packed (1, 3, 2) dense.
  const int64_t H = 8, P = 16, pages = 11;
  const std::vector<int64_t> kv = {40, 16, 33};
  const Tensor cache = rand_tensor({pages, P, 576}, kBf, 21, -1.0, 1.0);
  const std::vector<double> table = {3, 7, 1, 0, 9, 0, 0, 0, 2, 10, 4, 0};
  const Tensor bt = Tensor::from_vector(table, {3, 4}, kI32);
  const Tensor sl = i32({40, 16, 33});
  const auto cv = cache.to_double_vector();
  auto expected = [&](const Tensor& q, const std::vector<int64_t>& q0,
                      const std::vector<int64_t>& ql, bool causal, double s1, double s2) {
    const auto qv = q.to_double_vector();
    std::vector<double> out;
    for (int64_t b = 0; b < 3; ++b) {
      for (int64_t i = 0; i < ql[b]; ++i) {
        for (int64_t h = 0; h < H; ++h) {
          const auto at = ((q0[b] + i) * H + h) * 576;
          std::vector<double> qr(qv.begin() + at, qv.begin() + at + 576);
          auto row = [&](int64_t t, int64_t n) {
            const auto page = static_cast<int64_t>(table[static_cast<size_t>(b * 4 + t / P)]);
            const int64_t r0 = (page * P + t % P) * 576;
            return std::vector<double>(cv.begin() + r0, cv.begin() + r0 + n);
          };
          const auto o = attend(
              qr, visible(i, ql[b], kv[b], causal, -1), [&](int64_t t) { return row(t, 576); },
              [&](int64_t t) { return row(t, 512); }, 512, s1, s2);
          out.insert(out.end(), o.begin(), o.end());
        }
      }
    }
    return out;
  };
  const double s1 = 1.0 / std::sqrt(192.0);
  {
    const Tensor q = rand_tensor({3, 2, H, 576}, kBf, 22, -1.0, 1.0);
    const Tensor o = batch_decode_mla_with_paged_kv_cache(
        q, cache, bt, sl, std::nullopt, std::nullopt, 512, 64, "causal", std::nullopt, s1, 0.5);
    EXPECT_EQ(o.shape(), (Shape{3, 2, H, 512}));
    EXPECT_EQ(o.dtype(), kBf);
    EXPECT_TRUE(near(o, expected(q, {0, 2, 4}, {2, 2, 2}, true, s1, 0.5), 1e-2));
    // A rank-4 cache [pages, 1, P, 576] and the wrapper give the same bits.
    BatchMLADecodePagedTSWrapper w;
    w.plan(bt, sl, H, 512, 64, P, int64_t{2});
    EXPECT_TRUE(all_close(w.run(q, cache.unsqueeze(1), s1, 0.5), o, {0.0, 0.0}));
    const Tensor ws = Tensor::zeros({64}, DType::kInt8);
    const Tensor sa = prims_ts_batch_decode_with_kv_cache_mla(
        q, cache, ws, 512, 64, bt, sl, 40, std::nullopt, std::nullopt, std::nullopt, s1, 0.5);
    EXPECT_TRUE(all_close(sa, o, {0.0, 0.0}));
  }
  {
    const Tensor q = rand_tensor({6, H, 576}, kBf, 23, -1.0, 1.0);
    const Tensor o = batch_decode_mla_with_paged_kv_cache(q, cache, bt, sl, i32({0, 1, 4, 6}),
                                                          int64_t{3}, 512, 64, "dense");
    EXPECT_EQ(o.shape(), (Shape{6, H, 512}));
    EXPECT_TRUE(near(o, expected(q, {0, 1, 4}, {1, 3, 2}, false, 1.0, 1.0), 1e-2));
  }
  const char* op = "batch_decode_mla_with_paged_kv_cache";
  const Tensor q1 = rand_tensor({3, 1, H, 576}, kBf, 24);
  EXPECT_FI_ERROR((void)batch_decode_mla_with_paged_kv_cache(q1, cache, bt, sl, std::nullopt,
                                                             std::nullopt, 256),
                  op, "kv_lora_rank");
  EXPECT_FI_ERROR((void)batch_decode_mla_with_paged_kv_cache(q1.to(kF16), cache.to(kF16), bt, sl),
                  op, "query");
  EXPECT_FI_ERROR((void)batch_decode_mla_with_paged_kv_cache(
                      q1, cache, bt, sl, std::nullopt, std::nullopt, 512, 64, "causal",
                      std::nullopt, 1.0, 1.0, std::nullopt, kF16),
                  op, "out_dtype");
  // Fewer table columns than the longest request needs.
  EXPECT_FI_ERROR((void)batch_decode_mla_with_paged_kv_cache(q1, cache, bt.slice(1, 0, 2), sl), op,
                  "block_tables");
}

// ---- context ------------------------------------------------------------------------------------

TEST(PrimsTsContext, FixedPackedAndPagedMatchFp64) {
  const int64_t Hq = 4, Hkv = 2, D = 128;
  // Fixed [B, S, H, D]: causal with a window of 7 (GQA 2), output_scale 0.75.
  {
    const Tensor q = rand_tensor({2, 5, Hq, D}, kBf, 31, -1.0, 1.0);
    const Tensor k = rand_tensor({2, 9, Hkv, D}, kBf, 32, -1.0, 1.0);
    const Tensor v = rand_tensor({2, 9, Hkv, D}, kBf, 33, -1.0, 1.0);
    const Tensor o =
        batch_prefill(q, k, v, std::nullopt, std::nullopt, "causal", 7, std::nullopt, 0.75);
    const auto qv = q.to_double_vector(), kv = k.to_double_vector(), vv = v.to_double_vector();
    std::vector<double> want;
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t i = 0; i < 5; ++i) {
        for (int64_t h = 0; h < Hq; ++h) {
          const int64_t g = h / 2, at = ((b * 5 + i) * Hq + h) * D;
          auto row = [&](const std::vector<double>& x, int64_t t) {
            const int64_t r0 = ((b * 9 + t) * Hkv + g) * D;
            return std::vector<double>(x.begin() + r0, x.begin() + r0 + D);
          };
          const auto r = attend(
              std::vector<double>(qv.begin() + at, qv.begin() + at + D), visible(i, 5, 9, true, 7),
              [&](int64_t t) { return row(kv, t); }, [&](int64_t t) { return row(vv, t); }, D,
              1.0 / std::sqrt(128.0), 0.75);
          want.insert(want.end(), r.begin(), r.end());
        }
      }
    }
    EXPECT_TRUE(near(o, want, 1e-2));
    BatchPrefillTSWrapper w;
    w.plan(q, k, v, std::nullopt, std::nullopt, "causal", 7, std::nullopt, 0.75);
    EXPECT_TRUE(all_close(w.run(q, k, v), o, {0.0, 0.0}));
  }
  // Packed: requests of (2 q, 6 k) and (3 q, 3 k), dense, fp16.
  {
    const Tensor q = rand_tensor({5, Hq, D}, kF16, 34, -1.0, 1.0);
    const Tensor k = rand_tensor({9, Hkv, D}, kF16, 35, -1.0, 1.0);
    const Tensor v = rand_tensor({9, Hkv, D}, kF16, 36, -1.0, 1.0);
    const Tensor o = batch_prefill(q, k, v, i32({0, 2, 5}), i32({0, 6, 9}));
    const auto qv = q.to_double_vector(), kv = k.to_double_vector(), vv = v.to_double_vector();
    std::vector<double> want;
    const int64_t q0[] = {0, 2, 5}, k0[] = {0, 6, 9};
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t i = 0; i < q0[b + 1] - q0[b]; ++i) {
        for (int64_t h = 0; h < Hq; ++h) {
          const int64_t g = h / 2, at = ((q0[b] + i) * Hq + h) * D;
          auto row = [&](const std::vector<double>& x, int64_t t) {
            const int64_t r0 = ((k0[b] + t) * Hkv + g) * D;
            return std::vector<double>(x.begin() + r0, x.begin() + r0 + D);
          };
          const auto r = attend(
              std::vector<double>(qv.begin() + at, qv.begin() + at + D),
              visible(i, 0, k0[b + 1] - k0[b], false, -1), [&](int64_t t) { return row(kv, t); },
              [&](int64_t t) { return row(vv, t); }, D, 1.0 / std::sqrt(128.0), 1.0);
          want.insert(want.end(), r.begin(), r.end());
        }
      }
    }
    EXPECT_TRUE(near(o, want, 2e-3));
  }
  // Paged: HND caches, page 16, causal; equal to the decode reference's arithmetic.
  {
    const PagedCase c{Hq, Hkv, D, 16, {20, 40}, {3, 2}, kBf};
    const PagedData d = paged_data(c, 37);
    const Tensor q = rand_tensor({5, Hq, D}, kBf, 38, -1.0, 1.0);
    const Tensor kc = d.cache.select(1, 0).contiguous(), vc = d.cache.select(1, 1).contiguous();
    const Tensor o = batch_prefill_with_paged_kv_cache(
        q, kc, vc, i32({0, 3, 5}), i32(d.indptr), i32(d.indices), i32(d.last), 16, "HND", "causal");
    EXPECT_TRUE(near(o, paged_expected(c, d, q, true, -1, 1.0 / std::sqrt(128.0), 1.0), 1e-2));
    BatchPrefillPagedTSWrapper w;
    w.plan(q, kc, vc, i32({0, 3, 5}), i32(d.indptr), i32(d.indices), i32(d.last), 16, "causal");
    EXPECT_TRUE(all_close(w.run(q, kc, vc), o, {0.0, 0.0}));
  }
}

TEST(PrimsTsContext, RefusesWhatUpstreamRefuses) {
  const char* op = "batch_prefill";
  const Tensor q = rand_tensor({1, 4, 4, 128}, kBf, 41);
  const Tensor k = rand_tensor({1, 6, 2, 128}, kBf, 42);
  EXPECT_FI_ERROR((void)batch_prefill(q, k, k, std::nullopt, std::nullopt, "causal", 0), op,
                  "window_left");
  EXPECT_FI_ERROR((void)batch_prefill(q, k, k, std::nullopt, std::nullopt, "dense", 3), op,
                  "window_left");
  // A positive window needs an even GQA ratio above 1: MHA is refused as unsupported.
  const Tensor k4 = rand_tensor({1, 6, 4, 128}, kBf, 43);
  try {
    (void)batch_prefill(q, k4, k4, std::nullopt, std::nullopt, "causal", 3);
    ADD_FAILURE() << "MHA window accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_EQ(e.arg(), "window_left");
  }
  const Tensor q64 = rand_tensor({1, 4, 4, 64}, kBf, 44), k64 = rand_tensor({1, 6, 2, 64}, kBf, 45);
  EXPECT_FI_ERROR((void)batch_prefill(q64, k64, k64), op, "q");
  // More queries than keys under causal; only one of the two offsets.
  const Tensor k2 = rand_tensor({1, 2, 2, 128}, kBf, 46);
  EXPECT_FI_ERROR((void)batch_prefill(q, k2, k2, std::nullopt, std::nullopt, "causal"), op,
                  "mask_type");
  EXPECT_FI_ERROR((void)batch_prefill(q.view({4, 4, 128}), k.view({6, 2, 128}), k.view({6, 2, 128}),
                                      i32({0, 4})),
                  op, "kv_indptr");
  EXPECT_FI_ERROR((void)batch_prefill(q, k, k, std::nullopt, std::nullopt, "band"), op,
                  "mask_type");
  BatchPrefillTSWrapper w;
  EXPECT_FI_ERROR((void)w.run(q, k, k), "BatchPrefillTSWrapper.run", "self");
  w.plan(q, k, k);
  EXPECT_FI_ERROR((void)w.run(q.slice(1, 0, 3).contiguous(), k, k), "BatchPrefillTSWrapper.run",
                  "q");
}

// ---- block-sparse -------------------------------------------------------------------------------

TEST(PrimsTsBlockSparse, RowsBitsAndCausalMatchFp64) {
  // B 2, Sq 6 (q blocks of 4: two), Skv 20 (kv blocks of 8: three), 4 q heads over 2 kv heads.
  const int64_t B = 2, Sq = 6, Skv = 20, Hq = 4, Hkv = 2, D = 128;
  const Tensor q = rand_tensor({B, Sq, Hq, D}, kBf, 51, -1.0, 1.0);
  const Tensor k = rand_tensor({B, Skv, Hkv, D}, kBf, 52, -1.0, 1.0);
  const Tensor v = rand_tensor({B, Skv, Hkv, D}, kBf, 53, -1.0, 1.0);
  // Rows (b, g, qb): offsets [B, Hkv, 3]; ids strictly increasing.
  const std::vector<std::vector<int64_t>> rows = {{0, 2}, {1},    {2},    {0, 1, 2},
                                                  {},     {0, 1}, {1, 2}, {0}};
  std::vector<double> ip, ids;
  for (int64_t r = 0; r < 8; ++r) {
    if (r % 2 == 0) ip.push_back(static_cast<double>(ids.size()));
    for (int64_t x : rows[r]) ids.push_back(static_cast<double>(x));
    ip.push_back(static_cast<double>(ids.size()));
  }
  const Tensor indptr = Tensor::from_vector(ip, {B, Hkv, 3}, kI32);
  // Tokens with (t + b) % 7 in {0, 3} invalid (upstream's test pattern).
  std::vector<double> words;
  for (int64_t b = 0; b < B; ++b) {
    uint32_t w = 0;
    for (int64_t t = 0; t < Skv; ++t) {
      if ((t + b) % 7 != 0 && (t + b) % 7 != 3) w |= 1u << t;
    }
    words.push_back(static_cast<double>(static_cast<int32_t>(w)));
  }
  const Tensor bits = Tensor::from_vector(words, {B, 1}, kI32);
  for (bool causal : {false, true}) {
    const Tensor o =
        block_sparse_attention(q, k, v, indptr, i32(ids), 4, 8, bits, causal ? "causal" : "dense");
    const auto qv = q.to_double_vector(), kv = k.to_double_vector(), vv = v.to_double_vector();
    std::vector<double> want;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < Sq; ++i) {
        for (int64_t h = 0; h < Hq; ++h) {
          const int64_t g = h / 2;
          const auto& row = rows[static_cast<size_t>((b * Hkv + g) * 2 + i / 4)];
          std::vector<int64_t> keys;
          for (int64_t t : visible(i, Sq, Skv, causal, -1)) {
            const bool listed = std::find(row.begin(), row.end(), t / 8) != row.end();
            if (listed && (t + b) % 7 != 0 && (t + b) % 7 != 3) keys.push_back(t);
          }
          auto kr = [&](const std::vector<double>& x, int64_t t) {
            const int64_t r0 = ((b * Skv + t) * Hkv + g) * D;
            return std::vector<double>(x.begin() + r0, x.begin() + r0 + D);
          };
          const int64_t at = ((b * Sq + i) * Hq + h) * D;
          const auto r = attend(
              std::vector<double>(qv.begin() + at, qv.begin() + at + D), keys,
              [&](int64_t t) { return kr(kv, t); }, [&](int64_t t) { return kr(vv, t); }, D,
              1.0 / std::sqrt(128.0), 1.0);
          want.insert(want.end(), r.begin(), r.end());
        }
      }
    }
    EXPECT_TRUE(near(o, want, 1e-2)) << causal;
  }
  // Row (b 1, g 0, qb 0) is empty: its queries are exact zeros.
  const Tensor o = block_sparse_attention(q, k, v, indptr, i32(ids), 4, 8);
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t h = 0; h < 2; ++h) {
      const auto x = o.select(0, 1).select(0, i).select(0, h).to_double_vector();
      EXPECT_TRUE(std::all_of(x.begin(), x.end(), [](double y) { return y == 0.0; }));
    }
  }
  // The wrapper: an invalid row (ids not increasing) becomes zeros instead of an error, which
  // the one-shot raises; all-zero bits give exact zeros.
  std::vector<double> bad = ids;
  std::swap(bad[0], bad[1]);  // row (0, 0, 0): {2, 0}
  EXPECT_FI_ERROR((void)block_sparse_attention(q, k, v, indptr, i32(bad), 4, 8),
                  "block_sparse_attention", "block_indices");
  BlockSparseTSWrapper w;
  w.plan(B, Sq, Skv, Hq, Hkv, D, 4, 8, "cpu", 3, false, "dense", kBf);
  const Tensor ow = w.run(q, k, v, indptr, i32(bad));
  const Tensor ok = w.run(q, k, v, indptr, i32(ids));
  EXPECT_TRUE(all_close(ok, o, {0.0, 0.0}));
  for (int64_t i = 0; i < 4; ++i) {
    const auto x = ow.select(0, 0).select(0, i).select(0, 0).to_double_vector();
    EXPECT_TRUE(std::all_of(x.begin(), x.end(), [](double y) { return y == 0.0; }));
    EXPECT_TRUE(all_close(ow.select(0, 1), o.select(0, 1), {0.0, 0.0}));
  }
  BlockSparseTSWrapper wb;
  wb.plan(B, Sq, Skv, Hq, Hkv, D, 4, 8, "cpu", 3, true, "dense", kBf);
  const Tensor z = wb.run(q, k, v, indptr, i32(ids), Tensor::zeros({B, 1}, kI32));
  const auto zv = z.to_double_vector();
  EXPECT_TRUE(std::all_of(zv.begin(), zv.end(), [](double y) { return y == 0.0; }));
  EXPECT_FI_ERROR((void)wb.run(q, k, v, indptr, i32(ids)), "BlockSparseTSWrapper.run",
                  "kv_valid_bits");
}

TEST(PrimsTsBlockSparse, PagedEqualsContiguous) {
  // The same problem as a paged HND cache (page 8, pages shuffled): the same bits.
  const int64_t B = 2, Sq = 4, Skv = 16, Hq = 2, Hkv = 1, D = 128, P = 8;
  const Tensor q = rand_tensor({B, Sq, Hq, D}, kF16, 61, -1.0, 1.0);
  const Tensor cache = rand_tensor({5, 2, Hkv, P, D}, kF16, 62, -1.0, 1.0);
  const std::vector<int64_t> ids = {3, 0, 4, 1};  // request 0: pages 3, 0; request 1: 4, 1
  Tensor k = Tensor::empty({B, Skv, Hkv, D}, kF16), v = Tensor::empty({B, Skv, Hkv, D}, kF16);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Skv; ++t) {
      const Tensor page = cache.select(0, ids[static_cast<size_t>(b * 2 + t / P)]);
      k.select(0, b).select(0, t).copy_(page.select(0, 0).select(1, t % P));
      v.select(0, b).select(0, t).copy_(page.select(0, 1).select(1, t % P));
    }
  }
  // One q block a request (Sq 4): request 0 sees kv blocks {0, 1}, request 1 only {1}.
  const Tensor ip2 = Tensor::from_vector({0, 2, 2, 3}, {B, Hkv, 2}, kI32);
  const Tensor blocks = i32({0, 1, 1});
  const Tensor flat = block_sparse_attention(q, k, v, ip2, blocks, 4, 8, std::nullopt, "causal");
  const Tensor paged = block_sparse_attention_with_paged_kv_cache(
      q, cache, i32({0, 2, 4}), i32({3, 0, 4, 1}), ip2, blocks, 4, 8, Skv, std::nullopt,
      std::nullopt, "causal");
  EXPECT_TRUE(all_close(paged, flat, {0.0, 0.0}));
  BlockSparsePagedTSWrapper w;
  w.plan(i32({0, 2, 4}), Sq, Skv, Hq, Hkv, D, 4, 8, P, 2, false, std::nullopt, "causal", kF16);
  EXPECT_TRUE(all_close(w.run(q, cache, i32({3, 0, 4, 1}), ip2, blocks), flat, {0.0, 0.0}));
  // A page id outside the cache: the wrapper zeros that request, the one-shot refuses.
  const Tensor zw = w.run(q, cache, i32({3, 0, 4, 9}), ip2, blocks);
  EXPECT_TRUE(all_close(zw.select(0, 0), flat.select(0, 0), {0.0, 0.0}));
  const auto z1 = zw.select(0, 1).to_double_vector();
  EXPECT_TRUE(std::all_of(z1.begin(), z1.end(), [](double y) { return y == 0.0; }));
  EXPECT_FI_ERROR((void)block_sparse_attention_with_paged_kv_cache(
                      q, cache, i32({0, 2, 4}), i32({3, 0, 4, 9}), ip2, blocks, 4, 8, Skv),
                  "block_sparse_attention_with_paged_kv_cache", "paged_kv_indices");
}

TEST(PrimsTsBlockSparse, StaticProfileRefusals) {
  const char* op = "BlockSparseTSWrapper.plan";
  BlockSparseTSWrapper w;
  EXPECT_FI_ERROR(w.plan(1, 8, 64, 4, 2, 64, 4, 64, "cpu", 1, false), op, "head_dim");
  EXPECT_FI_ERROR(w.plan(1, 8, 64, 6, 2, 128, 4, 64, "cpu", 1, false), op, "num_qo_heads");
  EXPECT_FI_ERROR(w.plan(1, 8, 64, 4, 2, 128, 4, 24, "cpu", 1, false), op, "kv_block_size");
  // Ratio 1, q block 3: no tile of 8..128 rows holds whole q blocks.
  EXPECT_FI_ERROR(w.plan(1, 8, 64, 2, 2, 128, 3, 64, "cpu", 1, false), op, "q_block_size");
  EXPECT_FI_ERROR(w.plan(1, 8, 64, 2, 2, 128, 8, 64, "cpu", 2, false), op, "max_blocks_per_row");
  EXPECT_FI_ERROR(w.plan(1, 80, 64, 2, 2, 128, 8, 64, "cpu", 1, false, "causal"), op, "mask_type");
  try {
    w.plan(1, 8, 64, 2, 2, 128, 8, 64, "cpu", 1, false, "dense", kE4);
    ADD_FAILURE() << "fp8 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
}

// ---- replay and the GPU ------------------------------------------------------------------------

TEST(PrimsTsReplay, DumpsReplay) {
  const auto dir = record_dump("prims_ts", [] {
    const PagedCase c{4, 2, 64, 16, {20, 9}, {1, 1}, kBf};
    const PagedData d = paged_data(c, 71);
    const Tensor q = rand_tensor({2, 4, 64}, kBf, 72);
    (void)batch_decode_with_paged_kv_cache(q, d.cache, i32(d.indptr), i32(d.indices), i32(d.last));
    BatchDecodePagedTSWrapper w;
    w.plan(i32(d.indptr), i32(d.indices), i32(d.last), 4, 2, 64, 16, 1, std::nullopt, std::nullopt,
           kBf);
    (void)w.run(q, d.cache, 0.1, 2.0);
    const Tensor qp = rand_tensor({1, 3, 4, 128}, kBf, 73);
    const Tensor kp = rand_tensor({1, 5, 2, 128}, kBf, 74);
    (void)batch_prefill(qp, kp, kp, std::nullopt, std::nullopt, "causal", 2);
    BlockSparseTSWrapper bs;
    bs.plan(1, 3, 5, 4, 2, 128, 4, 8, "cpu", 1, false, "dense", kBf);
    (void)bs.run(qp, kp, kp, Tensor::from_vector({0, 1, 0, 1}, {1, 2, 2}, kI32), i32({0}));
  });
  // Wrapper calls replay in order, on the objects their __init__ made (two __init__, two
  // plans, the two runs and the two one-shot calls).
  const auto results = replay::replay_sequence(dir.string());
  EXPECT_EQ(results.size(), 8u);
  for (const auto& r : results) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
  }
  std::filesystem::remove_all(dir);
}

// Upstream runs these on SM100 / SM103 (decode: also SM107) and refuses other GPUs by name.
TEST(PrimsTsCuda, RefusedByName) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda(0);
  const int cc = api::compute_capability(g);
  const Tensor q = rand_tensor({1, 3, 4, 128}, kBf, 81).to(g);
  const Tensor k = rand_tensor({1, 5, 2, 128}, kBf, 82).to(g);
  try {
    (void)batch_prefill(q, k, k);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.op(), "batch_prefill");
    if (cc != 100 && cc != 103) {
      EXPECT_NE(std::string(e.what()).find("requires an SM100a/B200"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace flashinfer::testing
