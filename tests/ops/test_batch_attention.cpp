// BatchAttention (flashinfer.attention._core) against an fp64 formula over a grid (dtypes, fp8
// KV, layouts, page sizes, head_dim_qk != head_dim_vo, causal, soft cap, kv_len_arr leaving
// trailing pages unread), a hand-checked golden, bad input, record and replay (observer and a
// Flight Recorder dump through replay_sequence).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "flashinfer/ops/batch_attention.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"

namespace flashinfer {
namespace {

using testing::int_tensor;

struct Case {
  DType q, kv;
  int64_t page_size, hq, hkv, dqk, dvo;
  bool hnd, causal;
  double soft_cap;
};

std::vector<int32_t> host(const Tensor& t) {
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

// The table of `f` with one extra (unused, never read) page appended to every request, as
// upstream's kv_len_arr allows.
void padded_table(const testing::PagedFixture& f, int64_t num_pages, Tensor& indptr,
                  Tensor& indices) {
  const auto ip = host(f.indptr), ix = host(f.indices);
  std::set<int32_t> used(ix.begin(), ix.end());
  int32_t spare = 0;
  while (used.count(spare)) ++spare;
  ASSERT_LT(spare, num_pages);
  std::vector<int32_t> nip{0}, nix;
  for (std::size_t b = 0; b + 1 < ip.size(); ++b) {
    for (int32_t p = ip[b]; p < ip[b + 1]; ++p) nix.push_back(ix[p]);
    nix.push_back(spare);
    nip.push_back(static_cast<int32_t>(nix.size()));
  }
  indptr = int_tensor(nip);
  indices = int_tensor(nix);
}

void run_case(const Case& c, uint64_t seed) {
  const std::vector<int32_t> lens{9, 1, 0, 16, 5};
  const std::vector<int32_t> qo{3, 1, 0, 7, 1};
  std::vector<int32_t> qo_indptr{0};
  for (int32_t n : qo) qo_indptr.push_back(qo_indptr.back() + n);
  // K and V from two fixtures with the same seed: the same page shuffle, their own head dims.
  std::vector<std::vector<double>> kd, vd, unused;
  testing::PagedFixture fk =
      testing::make_paged(lens, c.page_size, c.hkv, c.dqk, c.kv, c.hnd, true, seed, kd, unused);
  testing::PagedFixture fv =
      testing::make_paged(lens, c.page_size, c.hkv, c.dvo, c.kv, c.hnd, true, seed, unused, vd);
  Tensor indptr, indices;
  padded_table(fk, fk.k_cache.size(0), indptr, indices);
  BatchAttention w(c.hnd ? "HND" : "NHD", "cpu");
  w.plan(int_tensor(qo_indptr), indptr, indices, int_tensor(lens), c.hq, c.hkv, c.dqk, c.dvo,
         c.page_size, c.causal, std::nullopt,
         c.soft_cap > 0 ? std::optional<double>(c.soft_cap) : std::nullopt, c.q, c.kv);
  const int32_t total = qo_indptr.back();
  Tensor q = testing::rand_tensor({total, c.hq, c.dqk}, c.q, seed + 3);
  const double ks = dtype_is_fp8(c.kv) ? 0.5 : 1.0, vs = dtype_is_fp8(c.kv) ? 1.5 : 1.0;
  AttentionOutput r =
      w.run(q, PagedKVCache(fk.k_cache, fv.v_cache), std::nullopt, std::nullopt, ks, vs);
  ASSERT_EQ(r.out.shape(), (Shape{total, c.hq, c.dvo}));
  ASSERT_EQ(r.out.dtype(), c.q);
  ASSERT_EQ(r.lse.shape(), (Shape{total, c.hq}));
  const auto qd = q.to_double_vector();
  std::vector<double> eo, el;
  for (std::size_t b = 0; b < lens.size(); ++b) {
    testing::RefOptions opt;
    opt.sm_scale = ks / std::sqrt(static_cast<double>(c.dqk));
    opt.soft_cap = c.soft_cap;
    opt.causal = c.causal;
    opt.v_scale = vs;
    std::vector<double> o, l;
    testing::ref_attention(testing::rows_of(qd, qo_indptr[b], qo_indptr[b + 1], c.hq * c.dqk),
                           kd[b], vd[b], qo[b], lens[b], c.hq, c.hkv, c.dqk, c.dvo, opt, o, l);
    eo.insert(eo.end(), o.begin(), o.end());
    el.insert(el.end(), l.begin(), l.end());
  }
  EXPECT_TRUE(testing::all_close(r.out, eo, testing::attention_tolerance(c.q)));
  EXPECT_TRUE(testing::all_close(r.lse, el, {1e-4, 1e-4}));
}

TEST(BatchAttention, MatchesFp64FormulaOverGrid) {
  const Case cases[] = {
      {DType::kFloat32, DType::kFloat32, 4, 4, 2, 64, 64, false, false, 0.0},
      {DType::kFloat32, DType::kFloat32, 3, 4, 1, 128, 64, true, true, 0.0},
      {DType::kFloat16, DType::kFloat16, 1, 8, 2, 64, 64, false, true, 4.0},
      {DType::kBFloat16, DType::kBFloat16, 16, 2, 2, 128, 128, true, false, 0.0},
      {DType::kBFloat16, DType::kFloat8E4M3FN, 5, 4, 2, 64, 64, false, true, 0.0},
      {DType::kFloat16, DType::kFloat8E5M2, 2, 4, 4, 256, 256, true, false, 0.0},
  };
  uint64_t seed = 40;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << dtype_torch_name(c.q) << "/" << dtype_torch_name(c.kv) << " page "
                 << c.page_size << " hq " << c.hq << " hkv " << c.hkv << " d " << c.dqk << "/"
                 << c.dvo << (c.hnd ? " HND" : " NHD") << (c.causal ? " causal" : "") << " cap "
                 << c.soft_cap);
    run_case(c, seed += 10);
  }
}

// Values 1..4 at zero scores: the output is their mean; LSE log2(4) = 2. Causal with two
// queries on four keys: the first sees three keys (mean 2, LSE log2 3).
TEST(BatchAttention, HandCheckedGolden) {
  const int64_t d = 64;
  Tensor cache = Tensor::zeros({2, 2, 2, 1, d}, DType::kFloat32);  // 2 pages of 2 tokens
  for (int64_t p = 0; p < 2; ++p) {
    for (int64_t t = 0; t < 2; ++t) {
      cache.select(0, p).select(0, 1).select(0, t).fill_(2 * p + t + 1);
    }
  }
  BatchAttention w("NHD", "cpu");
  w.plan(int_tensor({0, 2}), int_tensor({0, 2}), int_tensor({0, 1}), int_tensor({4}), 1, 1, d, d, 2,
         true, std::nullopt, std::nullopt, DType::kFloat32, DType::kFloat32);
  AttentionOutput r = w.run(Tensor::zeros({2, 1, d}, DType::kFloat32), PagedKVCache(cache));
  std::vector<double> eo(d, 2.0);
  eo.insert(eo.end(), d, 2.5);
  EXPECT_TRUE(testing::all_close(r.out, eo, {1e-6, 1e-6}));
  EXPECT_TRUE(testing::all_close(r.lse, {std::log2(3.0), 2.0}, {1e-6, 1e-6}));
}

TEST(BatchAttention, OutAndLseBuffersAreWritten) {
  std::vector<std::vector<double>> k, v;
  testing::PagedFixture f =
      testing::make_paged({3, 5}, 2, 2, 64, DType::kBFloat16, false, false, 5, k, v);
  BatchAttention w;
  w.plan(int_tensor({0, 1, 3}), f.indptr, f.indices, int_tensor({3, 5}), 4, 2, 64, 64, 2);
  Tensor q = testing::rand_tensor({3, 4, 64}, DType::kBFloat16, 6);
  Tensor out = Tensor::zeros({3, 4, 64}, DType::kBFloat16);
  Tensor lse = Tensor::zeros({3, 4}, DType::kFloat32);
  AttentionOutput a = w.run(q, f.cache(), out, lse);
  AttentionOutput b = w.run(q, f.cache());
  EXPECT_EQ(a.out.data_ptr(), out.data_ptr());
  EXPECT_EQ(a.lse.data_ptr(), lse.data_ptr());
  EXPECT_TRUE(testing::all_close(out, b.out, {0.0, 0.0}));
  EXPECT_TRUE(testing::all_close(lse, b.lse, {0.0, 0.0}));
}

TEST(BatchAttention, BadInput) {
  EXPECT_FI_ERROR(BatchAttention("XYZ"), "BatchAttention.__init__", "kv_layout");
  EXPECT_FI_ERROR(BatchAttention("NHD", "tpu"), "BatchAttention.__init__", "device");
  const char* plan = "BatchAttention.plan";
  const char* run = "BatchAttention.run";
  Tensor cache = Tensor::zeros({3, 2, 2, 2, 64}, DType::kBFloat16);
  Tensor q = Tensor::zeros({3, 4, 64}, DType::kBFloat16);
  BatchAttention w;
  EXPECT_FI_ERROR(w.run(q, PagedKVCache(cache)), run, "self");
  Tensor qo = int_tensor({0, 1, 3}), ip = int_tensor({0, 1, 3}), ix = int_tensor({0, 1, 2}),
         lens = int_tensor({2, 3});
  auto call = [&](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d,
                  int64_t hkv = 2, int64_t dqk = 64,
                  bool causal = false) { w.plan(a, b, c, d, 4, hkv, dqk, 64, 2, causal); };
  call(qo, ip, ix, lens);  // valid
  EXPECT_FI_ERROR(call(int_tensor({0, 1}), ip, ix, lens), plan, "qo_indptr");
  EXPECT_FI_ERROR(call(int_tensor({0, 2, 1}), ip, ix, lens), plan, "qo_indptr");
  EXPECT_FI_ERROR(call(qo, int_tensor({0, 2, 1}), ix, lens), plan, "kv_indptr");
  EXPECT_FI_ERROR(call(qo, ip, int_tensor({0, 1}), lens), plan, "kv_indices");
  EXPECT_FI_ERROR(call(qo, ip, int_tensor({0, -1, 2}), lens), plan, "kv_indices");
  EXPECT_FI_ERROR(call(qo, ip, ix, int_tensor({3, 3})), plan, "kv_len_arr");
  EXPECT_FI_ERROR(call(qo, ip, ix, int_tensor({2})), plan, "kv_len_arr");
  EXPECT_FI_ERROR(call(qo, ip, ix, lens, 3), plan, "num_kv_heads");
  EXPECT_FI_ERROR(call(qo, ip, ix, lens, 2, 40), plan, "head_dim_qk");
  EXPECT_FI_ERROR(call(int_tensor({0, 3, 3}), ip, ix, lens, 2, 64, true), plan, "causal");
  EXPECT_FI_ERROR(w.plan(qo, ip, ix, lens, 4, 2, 64, 64, 2, false, std::nullopt, std::nullopt,
                         DType::kBFloat16, DType::kBFloat16, true),
                  plan, "use_profiler");
  EXPECT_FI_ERROR(w.plan(qo, ip, ix, lens, 4, 2, 64, 64, 2, false, std::nullopt, -1.0), plan,
                  "logits_soft_cap");
  call(qo, ip, ix, lens);
  w.run(q, PagedKVCache(cache));  // valid
  EXPECT_FI_ERROR(w.run(Tensor::zeros({2, 4, 64}, DType::kBFloat16), PagedKVCache(cache)), run,
                  "q");
  EXPECT_FI_ERROR(w.run(q.to(DType::kFloat16), PagedKVCache(cache)), run, "q");
  EXPECT_FI_ERROR(w.run(q, PagedKVCache(Tensor::zeros({2, 2, 2, 2, 64}, DType::kBFloat16))), run,
                  "kv_cache");
  EXPECT_FI_ERROR(w.run(q, PagedKVCache(cache), Tensor::zeros({3, 4, 32}, DType::kBFloat16)), run,
                  "out");
  EXPECT_FI_ERROR(
      w.run(q, PagedKVCache(cache), std::nullopt, Tensor::zeros({3, 4}, DType::kBFloat16)), run,
      "lse");
  EXPECT_FI_ERROR(w.run(q, PagedKVCache(cache), std::nullopt, std::nullopt,
                        Tensor::zeros({2}, DType::kFloat32)),
                  run, "k_scale");
  EXPECT_FI_ERROR(w.run(q, PagedKVCache(cache), std::nullopt, std::nullopt, std::nullopt, NAN), run,
                  "v_scale");
  EXPECT_FI_ERROR(
      w.run(q, PagedKVCache(cache), std::nullopt, std::nullopt, std::nullopt, std::nullopt, -2.0),
      run, "logits_soft_cap");
  EXPECT_FI_ERROR(w.run(q, PagedKVCache(cache), std::nullopt, std::nullopt, std::nullopt,
                        std::nullopt, 0.0, Tensor::zeros({4}, DType::kFloat32)),
                  run, "profiler_buffer");
  EXPECT_FI_ERROR(w.run(q, PagedKVCache(cache), std::nullopt, std::nullopt, std::nullopt,
                        std::nullopt, 0.0, std::nullopt, Tensor::zeros({4}, DType::kFloat32)),
                  run, "kv_cache_sf");
}

// run()'s logits_soft_cap > 0 overrides plan's (this library's reading of upstream's two
// parameters); 0 keeps plan's.
TEST(BatchAttention, RunSoftCapOverridesPlans) {
  std::vector<std::vector<double>> k, v;
  testing::PagedFixture f =
      testing::make_paged({6}, 4, 1, 64, DType::kFloat32, false, false, 9, k, v);
  Tensor q = testing::rand_tensor({2, 1, 64}, DType::kFloat32, 10, -6.0, 6.0);
  auto expect = [&](double cap) {
    testing::RefOptions opt;
    opt.soft_cap = cap;
    std::vector<double> o, l;
    testing::ref_attention(q.to_double_vector(), k[0], v[0], 2, 6, 1, 1, 64, 64, opt, o, l);
    return o;
  };
  BatchAttention w("NHD", "cpu");
  w.plan(int_tensor({0, 2}), f.indptr, f.indices, int_tensor({6}), 1, 1, 64, 64, 4, false,
         std::nullopt, 1.5, DType::kFloat32, DType::kFloat32);
  EXPECT_TRUE(testing::all_close(w.run(q, f.cache()).out, expect(1.5), {2e-5, 2e-5}));
  EXPECT_TRUE(testing::all_close(
      w.run(q, f.cache(), std::nullopt, std::nullopt, std::nullopt, std::nullopt, 0.5).out,
      expect(0.5), {2e-5, 2e-5}));
  EXPECT_TRUE(testing::all_close(w.run(q, f.cache()).out, expect(1.5), {2e-5, 2e-5}));
}

TEST(BatchAttention, RecordAndReplay) {
  std::vector<std::vector<double>> k, v;
  testing::PagedFixture f =
      testing::make_paged({3, 5}, 2, 2, 64, DType::kBFloat16, true, true, 15, k, v);
  std::vector<testing::RecordingObserver::Call> calls;
  std::unique_ptr<BatchAttention> w;
  {
    testing::RecordingScope scope;
    w = std::make_unique<BatchAttention>("HND", "cuda");
    w->plan(int_tensor({0, 1, 3}), f.indptr, f.indices, int_tensor({3, 5}), 4, 2, 64, 64, 2, true);
    w->run(testing::rand_tensor({3, 4, 64}, DType::kBFloat16, 16), f.cache(),
           Tensor::zeros({3, 4, 64}, DType::kBFloat16), std::nullopt, 0.5,
           Tensor::full({1}, 2.0, DType::kFloat32));
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_TRUE(calls[2].result.is_sequence());  // upstream's (out, lse)
  for (std::size_t i = 1; i < calls.size(); ++i) {
    SCOPED_TRACE(calls[i].name);
    EXPECT_TRUE(testing::replays_identically(calls[i]));
  }
}

// Through the Flight Recorder's dump and replay_sequence, the way upstream's tests call it
// (out/lse preallocated, scales as floats).
TEST(BatchAttention, DumpReplaysWithEveryCallPassing) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("fi_batch_attention_dump_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg, [](const std::string&) {});
  {
    std::vector<std::vector<double>> k, v;
    testing::PagedFixture f =
        testing::make_paged({3, 5}, 2, 2, 64, DType::kFloat16, false, false, 25, k, v);
    BatchAttention w("NHD", "cuda");
    w.plan(int_tensor({0, 1, 3}), f.indptr, f.indices, int_tensor({3, 5}), 4, 2, 64, 64, 2, true,
           0.1, std::nullopt, DType::kFloat16, DType::kFloat16);
    w.run(testing::rand_tensor({3, 4, 64}, DType::kFloat16, 26), f.cache(),
          Tensor::zeros({3, 4, 64}, DType::kFloat16), Tensor::zeros({3, 4}, DType::kFloat32));
  }
  recorder::stop();
  testing::replay_expecting_every_call_to_pass(dir, 3u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flashinfer
