// POD attention (flashinfer.pod): PODWithPagedKVCacheWrapper and BatchPODWithPagedKVCacheWrapper
// against an fp64 formula over a grid (dtypes, fp8 KV, layouts, page sizes, causal, custom mask,
// window, scales), upstream's rules (decode non-causal with plan's sm_scale times q_scale *
// k_scale and output times v_scale; the prefill part unscaled), bad input, record and replay.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "flashinfer/ops/pod.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer {
namespace {

using testing::int_tensor;

Tensor workspace() { return Tensor::zeros({1 << 16}, DType::kUInt8); }

struct Case {
  DType q, kv;
  int64_t page_size, hq, hkv, d;
  bool hnd, causal;
  int64_t window;
};

testing::Tolerance tol_of(DType q) { return testing::attention_tolerance(q); }

// Decode rows: request b's q_len queries (non-causal) against its keys.
std::vector<double> ref_rows(const std::vector<double>& q, const std::vector<int32_t>& qo_indptr,
                             const std::vector<std::vector<double>>& k,
                             const std::vector<std::vector<double>>& v,
                             const std::vector<int32_t>& lens, int64_t hq, int64_t hkv, int64_t d,
                             const testing::RefOptions& opt) {
  std::vector<double> out;
  for (std::size_t b = 0; b < lens.size(); ++b) {
    std::vector<double> o, l;
    testing::ref_attention(testing::rows_of(q, qo_indptr[b], qo_indptr[b + 1], hq * d), k[b], v[b],
                           qo_indptr[b + 1] - qo_indptr[b], lens[b], hq, hkv, d, d, opt, o, l);
    out.insert(out.end(), o.begin(), o.end());
  }
  return out;
}

TEST(PODWithPagedKVCache, MatchesFp64FormulaOverGrid) {
  const Case cases[] = {
      {DType::kFloat32, DType::kFloat32, 4, 4, 2, 64, false, true, -1},
      {DType::kFloat16, DType::kFloat16, 1, 8, 2, 128, true, false, 3},
      {DType::kBFloat16, DType::kBFloat16, 16, 4, 4, 64, false, true, 5},
      {DType::kBFloat16, DType::kFloat8E4M3FN, 3, 4, 1, 64, true, false, -1},
  };
  uint64_t seed = 60;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << dtype_torch_name(c.q) << "/" << dtype_torch_name(c.kv)
                                      << " page " << c.page_size << (c.hnd ? " HND" : " NHD")
                                      << (c.causal ? " causal" : "") << " window " << c.window);
    seed += 10;
    const std::vector<int32_t> lens{7, 1, 12};
    std::vector<std::vector<double>> kd, vd;
    testing::PagedFixture f =
        testing::make_paged(lens, c.page_size, c.hkv, c.d, c.kv, c.hnd, false, seed, kd, vd);
    const double sm = 0.8 / std::sqrt(static_cast<double>(c.d));
    PODWithPagedKVCacheWrapper w(workspace(), c.hnd ? "HND" : "NHD");
    w.plan(f.indptr, f.indices, f.last_page_len, c.hq, c.hkv, c.d, c.page_size, "NONE", c.window,
           c.q, c.kv, std::nullopt, sm);
    // Prefill request: 5 queries against 9 keys, NHD or HND as kv_layout_p says.
    Tensor q_p = testing::rand_tensor({5, c.hq, c.d}, c.q, seed + 1);
    Tensor k_p = testing::rand_tensor({9, c.hkv, c.d}, c.kv, seed + 2);
    Tensor v_p = testing::rand_tensor({9, c.hkv, c.d}, c.kv, seed + 3);
    Tensor q_d = testing::rand_tensor({3, c.hq, c.d}, c.q, seed + 4);
    const double qs = 0.9, ks = 1.1, vs = 0.75, sm_p = 0.11;
    PodOutput r = w.run(q_p, c.hnd ? k_p.transpose(0, 1) : k_p, c.hnd ? v_p.transpose(0, 1) : v_p,
                        q_d, f.cache(), std::nullopt, std::nullopt, c.causal, c.hnd ? "HND" : "NHD",
                        "NONE", sm_p, c.window, std::nullopt, std::nullopt, false, std::nullopt,
                        std::nullopt, /*causal_d=*/true, "NHD", "NONE",
                        /*sm_scale_d (not read)=*/7.0, -1, std::nullopt, std::nullopt, qs, ks, vs);
    EXPECT_FALSE(r.lse_p.defined());
    testing::RefOptions po;
    po.sm_scale = sm_p;
    po.causal = c.causal;
    po.window_left = c.window;
    std::vector<double> ep, el;
    testing::ref_attention(q_p.to_double_vector(), k_p.to_double_vector(), v_p.to_double_vector(),
                           5, 9, c.hq, c.hkv, c.d, c.d, po, ep, el);
    EXPECT_TRUE(testing::all_close(r.out_p, ep, tol_of(c.q)));
    testing::RefOptions dopt;
    dopt.sm_scale = sm * qs * ks;
    dopt.v_scale = vs;
    dopt.window_left = c.window;
    EXPECT_TRUE(testing::all_close(
        r.out_d,
        ref_rows(q_d.to_double_vector(), {0, 1, 2, 3}, kd, vd, lens, c.hq, c.hkv, c.d, dopt),
        tol_of(c.q)));
  }
}

// A custom prefill mask (bool [qo, kv], true = keep) overrides causal_p.
TEST(PODWithPagedKVCache, CustomMaskOnThePrefillPart) {
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged({4}, 2, 1, 64, DType::kFloat32, false, false, 3, kd, vd);
  PODWithPagedKVCacheWrapper w(workspace());
  w.plan(f.indptr, f.indices, f.last_page_len, 2, 1, 64, 2, "NONE", -1, DType::kFloat32);
  Tensor q_p = testing::rand_tensor({3, 2, 64}, DType::kFloat32, 4);
  Tensor k_p = testing::rand_tensor({5, 1, 64}, DType::kFloat32, 5);
  Tensor v_p = testing::rand_tensor({5, 1, 64}, DType::kFloat32, 6);
  Tensor mask = Tensor::empty({3, 5}, DType::kBool);
  auto keep = [](int64_t i, int64_t j) { return (i + 2 * j) % 3 != 1; };
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 5; ++j) mask.data<bool>()[i * 5 + j] = keep(i, j);
  }
  PodOutput r = w.run(q_p, k_p, v_p, testing::rand_tensor({1, 2, 64}, DType::kFloat32, 7),
                      f.cache(), mask, std::nullopt, true);
  testing::RefOptions opt;
  opt.mask = keep;
  std::vector<double> o, l;
  testing::ref_attention(q_p.to_double_vector(), k_p.to_double_vector(), v_p.to_double_vector(), 3,
                         5, 2, 1, 64, 64, opt, o, l);
  EXPECT_TRUE(testing::all_close(r.out_p, o, {2e-5, 2e-5}));
}

TEST(BatchPODWithPagedKVCache, MatchesFp64FormulaOverGrid) {
  const Case cases[] = {
      {DType::kFloat32, DType::kFloat32, 4, 4, 2, 64, false, true, -1},
      {DType::kFloat16, DType::kFloat16, 1, 8, 2, 128, true, false, 4},
      {DType::kBFloat16, DType::kBFloat16, 16, 4, 4, 64, true, true, -1},
      {DType::kFloat16, DType::kFloat8E5M2, 3, 4, 1, 64, false, true, 6},
  };
  uint64_t seed = 80;
  for (const Case& c : cases) {
    for (bool with_lse : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << dtype_torch_name(c.q) << "/" << dtype_torch_name(c.kv) << " page "
                   << c.page_size << (c.hnd ? " HND" : " NHD") << (c.causal ? " causal" : "")
                   << " window " << c.window << (with_lse ? " lse" : ""));
      seed += 10;
      const std::vector<int32_t> lens_p{6, 10}, qo_p{0, 4, 9};
      const std::vector<int32_t> lens_d{3, 8, 1}, qo_d{0, 1, 3, 4};  // request 1: two queries
      std::vector<std::vector<double>> kp, vp, kd, vd;
      testing::PagedFixture fp =
          testing::make_paged(lens_p, c.page_size, c.hkv, c.d, c.kv, c.hnd, true, seed, kp, vp);
      testing::PagedFixture fd = testing::make_paged(lens_d, c.page_size, c.hkv, c.d, c.kv, c.hnd,
                                                     false, seed + 1, kd, vd);
      BatchPODWithPagedKVCacheWrapper w(workspace(), c.hnd ? "HND" : "NHD");
      w.plan(int_tensor(qo_p), fp.indptr, fp.indices, fp.last_page_len, int_tensor(qo_d), fd.indptr,
             fd.indices, fd.last_page_len, c.hq, c.hkv, c.d, c.page_size, "NONE", c.window, c.q,
             c.kv);
      Tensor q_p = testing::rand_tensor({9, c.hq, c.d}, c.q, seed + 2);
      Tensor q_d = testing::rand_tensor({4, c.hq, c.d}, c.q, seed + 3);
      const double qs = 1.2, ks = 0.8, vs = 1.5;
      PodOutput r = w.run(q_p, fp.cache(), q_d, fd.cache(), std::nullopt, std::nullopt, c.causal,
                          qs, ks, vs, with_lse);
      EXPECT_EQ(r.lse_p.defined(), with_lse);
      EXPECT_EQ(to_value(r).items().size(), 2u);
      testing::RefOptions po;
      po.causal = c.causal;
      po.window_left = c.window;
      EXPECT_TRUE(testing::all_close(
          r.out_p, ref_rows(q_p.to_double_vector(), qo_p, kp, vp, lens_p, c.hq, c.hkv, c.d, po),
          tol_of(c.q)));
      testing::RefOptions dopt;
      dopt.sm_scale = qs * ks / std::sqrt(static_cast<double>(c.d));
      dopt.v_scale = vs;
      dopt.window_left = c.window;
      EXPECT_TRUE(testing::all_close(
          r.out_d, ref_rows(q_d.to_double_vector(), qo_d, kd, vd, lens_d, c.hq, c.hkv, c.d, dopt),
          tol_of(c.q)));
      if (with_lse) {
        EXPECT_EQ(r.lse_d.shape(), (Shape{4, c.hq}));
        EXPECT_TRUE(to_value(r).items()[1].is_sequence());
      }
    }
  }
}

TEST(PODWrappers, BadInput) {
  const char* plan = "PODWithPagedKVCacheWrapper.plan";
  const char* run = "PODWithPagedKVCacheWrapper.run";
  EXPECT_FI_ERROR(PODWithPagedKVCacheWrapper(workspace(), "XYZ"),
                  "PODWithPagedKVCacheWrapper.__init__", "kv_layout");
  Tensor cache = Tensor::zeros({3, 2, 2, 2, 64}, DType::kFloat16);
  Tensor ip = int_tensor({0, 1, 3}), ix = int_tensor({0, 1, 2}), last = int_tensor({2, 1});
  Tensor qp = Tensor::zeros({2, 4, 64}, DType::kFloat16);
  Tensor kp = Tensor::zeros({3, 2, 64}, DType::kFloat16), vp = kp.clone();
  Tensor qd = Tensor::zeros({2, 4, 64}, DType::kFloat16);
  PODWithPagedKVCacheWrapper w(workspace());
  EXPECT_FI_ERROR(w.run(qp, kp, vp, qd, PagedKVCache(cache)), run, "self");
  EXPECT_FI_ERROR(w.plan(ip, ix, int_tensor({2, 3}), 4, 2, 64, 2), plan, "last_page_len");
  EXPECT_FI_ERROR(w.plan(int_tensor({0, 3, 1}), ix, last, 4, 2, 64, 2), plan, "indptr");
  EXPECT_FI_ERROR(w.plan(ip, ix, last, 4, 2, 40, 2), plan, "head_dim");
  EXPECT_FI_ERROR(w.plan(ip, ix, last, 4, 2, 64, 2, "alibi"), plan, "pos_encoding_mode");
  EXPECT_FI_ERROR(w.plan(ip, ix, last, 4, 2, 64, 2, "NONE", -1, std::nullopt), plan, "q_data_type");
  w.plan(ip, ix, last, 4, 2, 64, 2);
  w.run(qp, kp, vp, qd, PagedKVCache(cache));  // valid
  EXPECT_FI_ERROR(
      w.run(qp, kp, vp, Tensor::zeros({3, 4, 64}, DType::kFloat16), PagedKVCache(cache)), run,
      "q_d");
  EXPECT_FI_ERROR(w.run(qp, kp, vp, qd, PagedKVCache(cache.to(DType::kBFloat16))), run,
                  "paged_kv_cache_d");
  EXPECT_FI_ERROR(
      w.run(qp, Tensor::zeros({3, 3, 64}, DType::kFloat16), vp, qd, PagedKVCache(cache)), run,
      "v_p");
  EXPECT_FI_ERROR(w.run(Tensor::zeros({4, 64}, DType::kFloat16), kp, vp, qd, PagedKVCache(cache)),
                  run, "q_p");
  EXPECT_FI_ERROR(w.run(Tensor::zeros({4, 4, 64}, DType::kFloat16), kp, vp, qd, PagedKVCache(cache),
                        std::nullopt, std::nullopt, true),
                  run, "causal_p");
  EXPECT_FI_ERROR(w.run(qp, kp, vp, qd, PagedKVCache(cache), std::nullopt, std::nullopt, false,
                        "NHD", "ROPE"),  // not a mode
                  run, "pos_encoding_mode_p");

  const char* bplan = "BatchPODWithPagedKVCacheWrapper.plan";
  const char* brun = "BatchPODWithPagedKVCacheWrapper.run";
  BatchPODWithPagedKVCacheWrapper b(workspace());
  EXPECT_FI_ERROR(b.run(qp, PagedKVCache(cache), qd, PagedKVCache(cache)), brun, "self");
  Tensor qo = int_tensor({0, 1, 2});
  EXPECT_FI_ERROR(b.plan(int_tensor({0, 1}), ip, ix, last, qo, ip, ix, last, 4, 2, 64, 2), bplan,
                  "qo_indptr_p");
  EXPECT_FI_ERROR(b.plan(qo, ip, ix, last, qo, ip, int_tensor({0, -9, 1}), last, 4, 2, 64, 2),
                  bplan, "kv_indices_d");
  EXPECT_FI_ERROR(b.plan(qo, ip, ix, last, qo, ip, ix, int_tensor({0, 1}), 4, 2, 64, 2), bplan,
                  "last_page_len_d");
  b.plan(qo, ip, ix, last, qo, ip, ix, last, 4, 2, 64, 2);
  b.run(qp, PagedKVCache(cache), qd, PagedKVCache(cache), std::nullopt, std::nullopt, true);
  EXPECT_FI_ERROR(b.run(Tensor::zeros({3, 4, 64}, DType::kFloat16), PagedKVCache(cache), qd,
                        PagedKVCache(cache)),
                  brun, "q_p");
  EXPECT_FI_ERROR(b.run(qp, PagedKVCache(cache), qd.to(DType::kBFloat16), PagedKVCache(cache)),
                  brun, "q_d");
  EXPECT_FI_ERROR(b.run(qp, PagedKVCache(Tensor::zeros({2, 2, 2, 2, 64}, DType::kFloat16)), qd,
                        PagedKVCache(cache)),
                  brun, "paged_kv_cache_p");
  EXPECT_FI_ERROR(
      b.run(qp, PagedKVCache(cache), qd, PagedKVCache(cache), Tensor::zeros({4}, DType::kBool)),
      brun, "custom_mask_p");
  b.plan(int_tensor({0, 3, 4}), ip, ix, last, qo, ip, ix, last, 4, 2, 64, 2);
  EXPECT_FI_ERROR(b.run(Tensor::zeros({4, 4, 64}, DType::kFloat16), PagedKVCache(cache), qd,
                        PagedKVCache(cache), std::nullopt, std::nullopt, true),
                  brun, "causal_p");
}

TEST(PODWrappers, RecordAndReplay) {
  std::vector<std::vector<double>> k, v;
  testing::PagedFixture f =
      testing::make_paged({3, 5}, 2, 2, 64, DType::kBFloat16, false, false, 31, k, v);
  std::vector<testing::RecordingObserver::Call> calls;
  std::unique_ptr<PODWithPagedKVCacheWrapper> w;
  std::unique_ptr<BatchPODWithPagedKVCacheWrapper> b;
  {
    testing::RecordingScope scope;
    w = std::make_unique<PODWithPagedKVCacheWrapper>(workspace());
    w->plan(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 2, "NONE", -1, DType::kBFloat16);
    w->run(testing::rand_tensor({3, 4, 64}, DType::kBFloat16, 1),
           testing::rand_tensor({4, 2, 64}, DType::kBFloat16, 2),
           testing::rand_tensor({4, 2, 64}, DType::kBFloat16, 3),
           testing::rand_tensor({2, 4, 64}, DType::kBFloat16, 4), f.cache(), std::nullopt,
           std::nullopt, true);
    b = std::make_unique<BatchPODWithPagedKVCacheWrapper>(workspace());
    b->plan(int_tensor({0, 2, 4}), f.indptr, f.indices, f.last_page_len, int_tensor({0, 1, 2}),
            f.indptr, f.indices, f.last_page_len, 4, 2, 64, 2, "NONE", -1, DType::kBFloat16);
    b->run(testing::rand_tensor({4, 4, 64}, DType::kBFloat16, 5), f.cache(),
           testing::rand_tensor({2, 4, 64}, DType::kBFloat16, 6), f.cache(), std::nullopt,
           std::nullopt, true, 0.5, 2.0, 1.5, true);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 6u);
  for (const auto& call : calls) {
    SCOPED_TRACE(call.name);
    if (call.name.ends_with("__init__")) continue;
    EXPECT_TRUE(testing::replays_identically(call));
  }
}

TEST(PODWrappers, DumpReplaysWithEveryCallPassing) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_pod_dump_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg, [](const std::string&) {});
  {
    std::vector<std::vector<double>> k, v;
    testing::PagedFixture f =
        testing::make_paged({3, 5}, 2, 2, 64, DType::kFloat16, true, true, 41, k, v);
    PODWithPagedKVCacheWrapper w(workspace(), "HND");
    w.plan(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 2);
    w.run(testing::rand_tensor({3, 4, 64}, DType::kFloat16, 1),
          testing::rand_tensor({4, 2, 64}, DType::kFloat16, 2),
          testing::rand_tensor({4, 2, 64}, DType::kFloat16, 3),
          testing::rand_tensor({2, 4, 64}, DType::kFloat16, 4), f.cache(), std::nullopt,
          std::nullopt, true);
    BatchPODWithPagedKVCacheWrapper b(workspace(), "HND");
    b.plan(int_tensor({0, 2, 4}), f.indptr, f.indices, f.last_page_len, int_tensor({0, 1, 2}),
           f.indptr, f.indices, f.last_page_len, 4, 2, 64, 2);
    b.run(testing::rand_tensor({4, 4, 64}, DType::kFloat16, 5), f.cache(),
          testing::rand_tensor({2, 4, 64}, DType::kFloat16, 6), f.cache(), std::nullopt,
          std::nullopt, true);
    b.run(testing::rand_tensor({4, 4, 64}, DType::kFloat16, 7), f.cache(),
          testing::rand_tensor({2, 4, 64}, DType::kFloat16, 8), f.cache(), std::nullopt,
          std::nullopt, false, std::nullopt, std::nullopt, 2.0, true);
  }
  recorder::stop();
  const auto results = replay::replay_sequence(dir.string());
  ASSERT_EQ(results.size(), 7u);
  for (const auto& r : results) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
    for (const auto& c : r.comparisons) {
      EXPECT_TRUE(c.match) << r.function_name << " " << c.key << " " << c.problem << " "
                           << c.mismatches << "/" << c.numel;
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flashinfer
