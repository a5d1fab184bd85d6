// CuTe-DSL attention wrappers (flashinfer.cute_dsl.attention.wrappers): decode (equal-length and
// paged), prefill (ragged and paged) and MLA decode against an fp64 softmax written from
// upstream's test oracles (bottom-right windows, sinks in the denominator, base-2 LSE, the latent
// as V), the split / reduction rules, upstream's refusals by name, record / replay.
#include <gtest/gtest.h>

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

constexpr DType kBf = DType::kBFloat16;
constexpr DType kF16 = DType::kFloat16;
constexpr DType kI32 = DType::kInt32;
constexpr DType kF32 = DType::kFloat32;

Tensor i32(const std::vector<double>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, kI32);
}

struct Ref {
  std::vector<double> o;
  double lse2 = 0;  // base 2
};
// One query: keys [lo, hi) (clamped to [0, kv)), rows k(t) / v(t), scale, optional sink.
Ref attend(const std::vector<double>& q, int64_t lo, int64_t hi,
           const std::function<std::vector<double>(int64_t)>& k,
           const std::function<std::vector<double>(int64_t)>& v, int64_t dv, double scale,
           const double* sink = nullptr, double oscale = 1.0) {
  Ref r;
  r.o.assign(static_cast<size_t>(dv), 0.0);
  std::vector<double> s;
  double m = sink ? *sink : -1e300;
  for (int64_t t = lo; t < hi; ++t) {
    const auto kr = k(t);
    double a = 0;
    for (size_t d = 0; d < q.size(); ++d) a += q[d] * kr[d];
    s.push_back(a * scale);
    m = std::max(m, s.back());
  }
  double l = sink ? std::exp(*sink - m) : 0.0;
  for (int64_t t = lo; t < hi; ++t) {
    const double e = std::exp(s[static_cast<size_t>(t - lo)] - m);
    l += e;
    const auto vr = v(t);
    for (int64_t d = 0; d < dv; ++d) r.o[d] += e * vr[d];
  }
  for (auto& x : r.o) x = x / l * oscale;
  r.lse2 = (m + std::log(l)) / std::log(2.0);
  return r;
}

::testing::AssertionResult near(const std::vector<double>& g, const std::vector<double>& want,
                                double tol) {
  if (g.size() != want.size()) return ::testing::AssertionFailure() << "size " << g.size();
  for (size_t i = 0; i < g.size(); ++i) {
    if (!(std::fabs(g[i] - want[i]) <= tol * (1.0 + std::fabs(want[i])))) {
      return ::testing::AssertionFailure() << "element " << i << ": " << g[i] << " vs " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// ---- decode -------------------------------------------------------------------------------------

TEST(CuteDslDecode, WindowsSinksLseAndScalesMatchFp64) {
  const int64_t b = 2, ql = 3, Hq = 4, Hkv = 2, D = 64, skv = 37;
  const Tensor q = rand_tensor({b, ql, Hq, D}, kBf, 1, -1.0, 1.0);
  // K as an HND tensor viewed NHD (outer strides free, D contiguous); V plain.
  const Tensor k = rand_tensor({b, Hkv, skv, D}, kBf, 2, -1.0, 1.0).permute({0, 2, 1, 3});
  const Tensor v = rand_tensor({b, skv, Hkv, D}, kBf, 3, -1.0, 1.0);
  const Tensor sinks = Tensor::from_vector({0.5, -1.0, 2.0, 0.0}, {Hq}, kF32);
  struct Win {
    std::optional<int64_t> wl, wr;
  };
  for (const Win& w : {Win{std::nullopt, 0}, Win{std::nullopt, std::nullopt}, Win{5, 1}}) {
    for (bool with_sinks : {false, true}) {
      BatchDecodeCuteDSLWrapper wr(Tensor::zeros({1 << 20}, DType::kUInt8));
      CuteDslDecodePlanOptions po;
      po.q_len_per_req = ql;
      po.window_left = w.wl;
      po.window_right = w.wr;
      wr.plan(b, skv, Hq, Hkv, D, po);
      CuteDslDecodeRunOptions ro;
      ro.o_scale = 0.5;
      ro.lse = Tensor::zeros({b, ql, Hq}, kF32);
      if (with_sinks) ro.sinks = sinks;
      const Tensor o = wr.run(q, k, v, ro);
      EXPECT_EQ(o.shape(), q.shape());
      const auto qv = q.to_double_vector(), kv = k.contiguous().to_double_vector(),
                 vv = v.to_double_vector(), sv = sinks.to_double_vector();
      std::vector<double> want, want_lse;
      for (int64_t bi = 0; bi < b; ++bi) {
        for (int64_t i = 0; i < ql; ++i) {
          for (int64_t h = 0; h < Hq; ++h) {
            const int64_t g = h / 2, cur = skv - ql + i;
            const int64_t lo = w.wl ? std::max<int64_t>(0, cur - *w.wl) : 0;
            const int64_t hi = w.wr ? std::min(skv, cur + *w.wr + 1) : skv;
            auto row = [&](const std::vector<double>& x, int64_t t) {
              const int64_t r0 = ((bi * skv + t) * Hkv + g) * D;
              return std::vector<double>(x.begin() + r0, x.begin() + r0 + D);
            };
            const int64_t at = ((bi * ql + i) * Hq + h) * D;
            const Ref r = attend(
                std::vector<double>(qv.begin() + at, qv.begin() + at + D), lo, hi,
                [&](int64_t t) { return row(kv, t); }, [&](int64_t t) { return row(vv, t); }, D,
                1.0 / 8.0, with_sinks ? &sv[static_cast<size_t>(h)] : nullptr, 0.5);
            want.insert(want.end(), r.o.begin(), r.o.end());
            want_lse.push_back(r.lse2);
          }
        }
      }
      EXPECT_TRUE(near(o.to_double_vector(), want, 1e-2)) << with_sinks;
      EXPECT_TRUE(near(ro.lse->to_double_vector(), want_lse, 1e-5)) << with_sinks;
    }
  }
}

TEST(CuteDslDecode, SplitAndReductionFollowUpstream) {
  // 148 SMs (the CPU's count, as upstream's for an unknown one): batch 1, Hkv 2, GQA 4 -> grid
  // 2, 74 splits, capped by ceil(max_kv / 256).
  BatchDecodeCuteDSLWrapper w(Tensor::zeros({1 << 20}, DType::kUInt8));
  w.plan(1, 2048, 8, 2, 64);
  EXPECT_EQ(w.kv_splits(), 8);
  EXPECT_EQ(w.reduction(), "atomic");
  w.plan(1, 200, 8, 2, 64);
  EXPECT_EQ(w.kv_splits(), 1);
  EXPECT_EQ(w.reduction(), "none");
  w.plan(1, 4096, 8, 2, 64);  // 16 splits: the kernel reduction, 33824 bytes of partials
  EXPECT_EQ(w.kv_splits(), 16);
  EXPECT_EQ(w.reduction(), "kernel");
  const char* op = "BatchDecodeCuteDSLWrapper.plan";
  BatchDecodeCuteDSLWrapper small(Tensor::zeros({1024}, DType::kUInt8));
  EXPECT_FI_ERROR(small.plan(1, 4096, 8, 2, 64), op, "float_workspace_buffer");
  CuteDslDecodePlanOptions none;
  none.reduction = "none";
  none.kv_splits = 4;
  EXPECT_FI_ERROR(small.plan(1, 4096, 8, 2, 64, none), op, "kv_splits");
  CuteDslDecodePlanOptions atomic;
  atomic.reduction = "atomic";
  atomic.kv_splits = 3;
  EXPECT_FI_ERROR(small.plan(1, 4096, 8, 2, 64, atomic), op, "kv_splits");
  EXPECT_FI_ERROR(small.plan(1, 512, 8, 2, 96), op, "head_dim");
  EXPECT_FI_ERROR(small.plan(1, 512, 6, 4, 64), op, "num_qo_heads");
  CuteDslDecodePlanOptions both;
  both.is_causal = true;
  both.window_left = 4;
  EXPECT_FI_ERROR(small.plan(1, 512, 8, 2, 64, both), op, "is_causal");
  CuteDslDecodePlanOptions mixed;
  mixed.kv_data_type = kF16;
  try {
    small.plan(1, 512, 8, 2, 64, mixed);
    ADD_FAILURE() << "mixed dtypes accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
  EXPECT_FI_ERROR((void)BatchDecodeCuteDSLWrapper(Tensor::zeros({8}, DType::kUInt8))
                      .run(Tensor(), Tensor(), Tensor()),
                  "BatchDecodeCuteDSLWrapper.run", "self");
}

TEST(CuteDslDecode, PagedMatchesFp64) {
  // Requests of 20, 33 and 8 tokens in pages of 16 (shuffled ids), 2 queries each, causal.
  const int64_t Hq = 4, Hkv = 1, D = 128, P = 16, ql = 2;
  const std::vector<int64_t> lens = {20, 33, 8};
  const std::vector<double> indptr = {0, 2, 5}, indices = {4, 0, 2, 5, 1, 3};
  const Tensor kc = rand_tensor({6, P, Hkv, D}, kF16, 11, -1.0, 1.0);
  const Tensor vc = rand_tensor({6, P, Hkv, D}, kF16, 12, -1.0, 1.0);
  const Tensor q = rand_tensor({3 * ql, Hq, D}, kF16, 13, -1.0, 1.0);
  BatchDecodePagedCuteDSLWrapper w(Tensor::zeros({1 << 22}, DType::kUInt8));
  CuteDslPagedDecodePlanOptions po;
  po.q_data_type = kF16;
  po.q_len_per_req = ql;
  w.plan(i32(indptr), i32(indices), i32({20, 33, 8}), Hq, Hkv, D, P, po);
  CuteDslPagedDecodeRunOptions ro;
  ro.lse = Tensor::zeros({3 * ql, Hq}, kF32);
  const Tensor o = w.run(q, kc, vc, ro);
  EXPECT_EQ(o.shape(), q.shape());
  const auto qv = q.to_double_vector(), kv = kc.to_double_vector(), vv = vc.to_double_vector();
  std::vector<double> want, want_lse;
  for (int64_t b = 0; b < 3; ++b) {
    for (int64_t i = 0; i < ql; ++i) {
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t cur = lens[b] - ql + i;
        auto row = [&](const std::vector<double>& x, int64_t t) {
          const auto page = static_cast<int64_t>(indices[static_cast<size_t>(indptr[b]) + t / P]);
          const int64_t r0 = (page * P + t % P) * D;
          return std::vector<double>(x.begin() + r0, x.begin() + r0 + D);
        };
        const int64_t at = ((b * ql + i) * Hq + h) * D;
        const Ref r = attend(
            std::vector<double>(qv.begin() + at, qv.begin() + at + D), 0, cur + 1,
            [&](int64_t t) { return row(kv, t); }, [&](int64_t t) { return row(vv, t); }, D,
            1.0 / std::sqrt(128.0));
        want.insert(want.end(), r.o.begin(), r.o.end());
        want_lse.push_back(r.lse2);
      }
    }
  }
  EXPECT_TRUE(near(o.to_double_vector(), want, 2e-3));
  EXPECT_TRUE(near(ro.lse->to_double_vector(), want_lse, 1e-5));
  const char* op = "BatchDecodePagedCuteDSLWrapper.plan";
  EXPECT_FI_ERROR(w.plan(i32(indptr), i32(indices), i32({20, 33, 8}), Hq, Hkv, D, 128, po), op,
                  "page_size");
  EXPECT_FI_ERROR(w.plan(i32({0}), i32(indices), i32({20, 33, 8}), Hq, Hkv, D, P, po), op,
                  "indptr");
  CuteDslPagedDecodeRunOptions bad;
  bad.skip_softmax_threshold_scale_factor = 0.0;
  EXPECT_FI_ERROR((void)w.run(q, kc, vc, bad), "BatchDecodePagedCuteDSLWrapper.run",
                  "skip_softmax_threshold_scale_factor");
}

// ---- prefill ------------------------------------------------------------------------------------

TEST(CuteDslPrefill, RaggedAndPagedMatchFp64) {
  const int64_t Hq = 4, Hkv = 2, D = 64;
  // Ragged: requests of (3 q, 7 k) and (2 q, 2 k), causal (bottom-right), window_left 4; LSE.
  const Tensor q = rand_tensor({5, Hq, D}, kBf, 21, -1.0, 1.0);
  const Tensor k = rand_tensor({9, Hkv, D}, kBf, 22, -1.0, 1.0);
  const Tensor v = rand_tensor({9, Hkv, D}, kBf, 23, -1.0, 1.0);
  BatchPrefillCuteDSLWrapper w(Tensor::zeros({64}, DType::kUInt8));
  w.plan(i32({0, 3, 5}), i32({0, 7, 9}), Hq, Hkv, D, std::nullopt, true, std::nullopt, kBf, kBf, 4);
  const AttentionOutput r = w.run(q, k, v, std::nullopt, true);
  ASSERT_TRUE(r.lse.defined());
  const auto qv = q.to_double_vector(), kv = k.to_double_vector(), vv = v.to_double_vector();
  std::vector<double> want, want_lse;
  const int64_t q0[] = {0, 3, 5}, k0[] = {0, 7, 9};
  for (int64_t b = 0; b < 2; ++b) {
    const int64_t nq = q0[b + 1] - q0[b], nk = k0[b + 1] - k0[b];
    for (int64_t i = 0; i < nq; ++i) {
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t cur = nk - nq + i, g = h / 2;
        auto row = [&](const std::vector<double>& x, int64_t t) {
          const int64_t r0 = ((k0[b] + t) * Hkv + g) * D;
          return std::vector<double>(x.begin() + r0, x.begin() + r0 + D);
        };
        const int64_t at = ((q0[b] + i) * Hq + h) * D;
        const Ref ref = attend(
            std::vector<double>(qv.begin() + at, qv.begin() + at + D),
            std::max<int64_t>(0, cur - 4), cur + 1, [&](int64_t t) { return row(kv, t); },
            [&](int64_t t) { return row(vv, t); }, D, 1.0 / 8.0);
        want.insert(want.end(), ref.o.begin(), ref.o.end());
        want_lse.push_back(ref.lse2);
      }
    }
  }
  EXPECT_TRUE(near(r.out.to_double_vector(), want, 1e-2));
  EXPECT_TRUE(near(r.lse.to_double_vector(), want_lse, 1e-5));
  // The same keys in an HND paged cache (page 8) through run_paged: the same bits.
  const int64_t P = 8;
  Tensor kc = Tensor::zeros({3, Hkv, P, D}, kBf), vc = Tensor::zeros({3, Hkv, P, D}, kBf);
  // Request 0's 7 keys in page 2, request 1's 2 keys in page 0.
  for (int64_t t = 0; t < 9; ++t) {
    const int64_t page = t < 7 ? 2 : 0, slot = t < 7 ? t : t - 7;
    for (int64_t g = 0; g < Hkv; ++g) {
      kc.select(0, page).select(0, g).select(0, slot).copy_(k.select(0, t).select(0, g));
      vc.select(0, page).select(0, g).select(0, slot).copy_(v.select(0, t).select(0, g));
    }
  }
  BatchPrefillCuteDSLWrapper wp(Tensor::zeros({64}, DType::kUInt8));
  wp.plan(i32({0, 3, 5}), std::nullopt, Hq, Hkv, D, std::nullopt, true, std::nullopt, kBf, kBf, 4,
          std::nullopt, -1, P, i32({0, 1, 2}), i32({2, 0}), i32({7, 2}), "HND");
  const AttentionOutput rp = wp.run_paged(q, PagedKVCache(kc, vc), std::nullopt, true);
  EXPECT_TRUE(all_close(rp.out, r.out, {0.0, 0.0}));
  EXPECT_TRUE(all_close(rp.lse, r.lse, {0.0, 0.0}));
  EXPECT_FI_ERROR((void)wp.run(q, k, v), "BatchPrefillCuteDSLWrapper.run", "self");
  EXPECT_FI_ERROR((void)w.run_paged(q, PagedKVCache(kc, vc)),
                  "BatchPrefillCuteDSLWrapper.run_paged", "self");
  const char* op = "BatchPrefillCuteDSLWrapper.plan";
  EXPECT_FI_ERROR(w.plan(i32({0, 3}), i32({0, 7}), Hq, Hkv, D, std::nullopt, true, std::nullopt,
                         kBf, kBf, -1, std::nullopt, 2),
                  op, "window_right");
  EXPECT_FI_ERROR(w.plan(i32({0, 3, 5}), i32({0, 7, 7}), Hq, Hkv, D), op, "kv_indptr");
  EXPECT_FI_ERROR(w.plan(i32({0, 3}), i32({0, 7}), Hq, Hkv, 40), op, "head_dim_qk");
  EXPECT_FI_ERROR(w.plan(i32({0, 3}), i32({0, 7}), std::nullopt, Hkv, D), op, "num_qo_heads");
  try {
    w.plan(i32({0, 3}), i32({0, 7}), Hq, Hkv, D, std::nullopt, true, std::nullopt, kBf, kBf, -1,
           std::nullopt, -1, std::nullopt, std::nullopt, std::nullopt, std::nullopt, "HND");
    ADD_FAILURE() << "ragged HND accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
}

// ---- MLA ----------------------------------------------------------------------------------------

TEST(CuteDslMla, MatchesFp64WithTheLatentAsValues) {
  // 148 SMs: batch 2 x 2 queries splits KV 18 ways, so 128 heads and an 18.9 MB workspace.
  const int64_t B = 2, ql = 2, H = 128, P = 32;
  const std::vector<int64_t> lens = {45, 70};
  const Tensor cache = rand_tensor({5, P, 576}, kBf, 31, -1.0, 1.0);
  const std::vector<double> table = {3, 1, 0, 4, 2, 0};
  const Tensor bt = Tensor::from_vector(table, {B, 3}, kI32);
  const Tensor q = rand_tensor({B, ql, H, 576}, kBf, 32, -1.0, 1.0);
  BatchMLADecodeCuteDSLWrapper w(Tensor::zeros({20 << 20}, DType::kInt8));
  w.plan(512, 64, H, P);
  const double scale = 1.0 / std::sqrt(192.0);
  const Tensor o = w.run(q, cache, bt, i32({45, 70}), 70, scale, 0.5);
  EXPECT_EQ(o.shape(), (Shape{B, ql, H, 512}));
  const auto qv = q.to_double_vector(), cv = cache.to_double_vector();
  std::vector<double> want;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < ql; ++i) {
      for (int64_t h = 0; h < H; ++h) {
        auto row = [&](int64_t t, int64_t n) {
          const auto page = static_cast<int64_t>(table[static_cast<size_t>(b * 3 + t / P)]);
          const int64_t r0 = (page * P + t % P) * 576;
          return std::vector<double>(cv.begin() + r0, cv.begin() + r0 + n);
        };
        const int64_t at = ((b * ql + i) * H + h) * 576;
        const Ref r = attend(
            std::vector<double>(qv.begin() + at, qv.begin() + at + 576), 0, lens[b],
            [&](int64_t t) { return row(t, 576); }, [&](int64_t t) { return row(t, 512); }, 512,
            scale, nullptr, 0.5);
        want.insert(want.end(), r.o.begin(), r.o.end());
      }
    }
  }
  EXPECT_TRUE(near(o.to_double_vector(), want, 1e-2));
  const char* op = "BatchMLADecodeCuteDSLWrapper.plan";
  EXPECT_FI_ERROR(w.plan(512, 64, H, 1), op, "page_size");  // upstream's default page_size 1
  EXPECT_FI_ERROR(w.plan(256, 64, H, P), op, "kv_lora_rank");
  EXPECT_FI_ERROR(w.plan(512, 64, 256, P), op, "num_heads");
  // Fewer than 128 heads need an unsplit KV (split 18 here).
  w.plan(512, 64, 16, P);
  EXPECT_FI_ERROR(
      (void)w.run(rand_tensor({B, ql, 16, 576}, kBf, 33), cache, bt, i32({45, 70}), 70, scale),
      "BatchMLADecodeCuteDSLWrapper.run", "q");
  BatchMLADecodeCuteDSLWrapper tiny(Tensor::zeros({64}, DType::kInt8));
  tiny.plan(512, 64, H, P);
  EXPECT_FI_ERROR((void)tiny.run(q, cache, bt, i32({45, 70}), 70, scale),
                  "BatchMLADecodeCuteDSLWrapper.run", "workspace_buffer");
  EXPECT_FI_ERROR((void)BatchMLADecodeCuteDSLWrapper(Tensor::zeros({64}, DType::kUInt8)),
                  "BatchMLADecodeCuteDSLWrapper.__init__", "workspace_buffer");
}

// ---- replay and the GPU ------------------------------------------------------------------------

TEST(CuteDslReplay, DumpsReplay) {
  const auto dir = record_dump("cute_dsl_attn", [] {
    BatchDecodeCuteDSLWrapper w(Tensor::zeros({1 << 16}, DType::kUInt8));
    CuteDslDecodePlanOptions po;
    po.window_right = std::nullopt;  // dense
    w.plan(2, 20, 4, 2, 64, po);
    CuteDslDecodeRunOptions ro;
    ro.lse = Tensor::zeros({2, 1, 4}, kF32);
    ro.sinks = Tensor::from_vector({0.5, 0.0, -1.0, 1.0}, {4}, kF32);
    (void)w.run(rand_tensor({2, 1, 4, 64}, kBf, 41), rand_tensor({2, 20, 2, 64}, kBf, 42),
                rand_tensor({2, 20, 2, 64}, kBf, 43), ro);
  });
  const auto results = replay::replay_sequence(dir.string());  // __init__, plan, run
  EXPECT_EQ(results.size(), 3u);
  for (const auto& r : results) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
  }
  std::filesystem::remove_all(dir);
}

TEST(CuteDslAttentionCuda, RefusedByName) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda(0);
  const int cc = api::compute_capability(g);
  BatchDecodeCuteDSLWrapper w(Tensor::zeros({1 << 16}, DType::kUInt8, g));
  try {
    w.plan(1, 64, 4, 2, 64);
    if (cc != 100 && cc != 103 && cc != 110) ADD_FAILURE() << "no error on sm" << cc;
  } catch (const Error& e) {
    EXPECT_EQ(e.op(), "BatchDecodeCuteDSLWrapper.plan");
    EXPECT_NE(std::string(e.what()).find("tcgen05"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace flashinfer::testing
