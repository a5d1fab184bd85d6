// Decode attention: single_decode_with_kv_cache and BatchDecodeWithPagedKVCacheWrapper against a
// naive fp64 materialized softmax, plan/run semantics, invokers, and bad input.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "flashinfer/tensor_io.h"
#include "ops/attention_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"

namespace flashinfer {
namespace {

using testing::int_tensor;
using testing::RefOptions;

// 256 KiB: the plans here need at most 57568 bytes of partials (workspace_size()), so none falls
// back to an unsplit plan for want of space.
Tensor workspace() { return Tensor::zeros({1 << 18}, DType::kUInt8); }

struct SingleCase {
  DType q, kv;
  int64_t hq, hkv, d, kv_len;
  bool hnd;
  double soft_cap;
  int64_t window;
};

class SingleDecode : public ::testing::TestWithParam<SingleCase> {};

TEST_P(SingleDecode, MatchesReference) {
  const SingleCase c = GetParam();
  Tensor q = Tensor::empty({c.hq, c.d}, c.q).uniform_(1);
  Tensor k = Tensor::empty({c.kv_len, c.hkv, c.d}, c.kv).uniform_(2);
  Tensor v = Tensor::empty({c.kv_len, c.hkv, c.d}, c.kv).uniform_(3);
  const bool fp8 = dtype_is_fp8(c.kv);
  const double k_scale = fp8 ? 0.5 : 1.0, v_scale = fp8 ? 2.0 : 1.0;
  Tensor kk = c.hnd ? k.transpose(0, 1).contiguous() : k;
  Tensor vv = c.hnd ? v.transpose(0, 1).contiguous() : v;
  std::optional<double> cap;
  if (c.soft_cap > 0) cap = c.soft_cap;
  AttentionOutput r = single_decode_with_kv_cache(
      q, kk, vv, c.hnd ? "HND" : "NHD", "NONE", false, std::nullopt,
      fp8 ? std::optional<double>(k_scale) : std::nullopt,
      fp8 ? std::optional<double>(v_scale) : std::nullopt, c.window, cap, std::nullopt,
      std::nullopt, std::nullopt, /*return_lse=*/true);
  ASSERT_EQ(r.out.shape(), (Shape{c.hq, c.d}));
  ASSERT_EQ(r.lse.shape(), (Shape{c.hq}));
  RefOptions opt;
  opt.sm_scale = k_scale / std::sqrt(double(c.d));
  opt.soft_cap = c.soft_cap;
  opt.window_left = c.window;
  opt.v_scale = v_scale;
  std::vector<double> eo, el;
  testing::ref_attention(q.to_double_vector(), k.to_double_vector(), v.to_double_vector(), 1,
                         c.kv_len, c.hq, c.hkv, c.d, c.d, opt, eo, el);
  EXPECT_TRUE(testing::all_close(r.out, eo, testing::attention_tolerance(c.q)));
  EXPECT_TRUE(testing::all_close(r.lse, el, {1e-4, 1e-5}));
}

INSTANTIATE_TEST_SUITE_P(
    Grid, SingleDecode,
    ::testing::Values(SingleCase{DType::kFloat32, DType::kFloat32, 4, 4, 64, 1, false, 0, -1},
                      SingleCase{DType::kFloat16, DType::kFloat16, 8, 2, 128, 37, false, 0, -1},
                      SingleCase{DType::kBFloat16, DType::kBFloat16, 8, 1, 256, 130, true, 0, -1},
                      SingleCase{DType::kFloat32, DType::kFloat32, 4, 1, 64, 70, false, 5.0, 9},
                      SingleCase{DType::kFloat16, DType::kFloat8E4M3FN, 4, 1, 128, 33, false, 0,
                                 -1},
                      SingleCase{DType::kBFloat16, DType::kFloat8E5M2, 2, 2, 64, 20, true, 0, -1}));

struct BatchCase {
  DType dtype;
  int64_t hq, hkv, d, page_size;
  std::vector<int32_t> lens;
  bool hnd, pair;
  std::optional<int64_t> fixed_split;  // pages
  double soft_cap;
  int64_t window;
  int64_t q_len_per_req;
};

void check_batch_decode(const BatchCase& c) {
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged(c.lens, c.page_size, c.hkv, c.d, c.dtype, c.hnd, c.pair, 42, kd, vd);
  const auto batch = static_cast<int64_t>(c.lens.size());
  BatchDecodeWithPagedKVCacheWrapper w(workspace(), c.hnd ? "HND" : "NHD");
  BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
  po.q_data_type = c.dtype;
  po.fixed_split_size = c.fixed_split;
  if (c.soft_cap > 0) po.logits_soft_cap = c.soft_cap;
  po.window_left = c.window;
  po.q_len_per_req = c.q_len_per_req;
  w.plan(f.indptr, f.indices, f.last_page_len, c.hq, c.hkv, c.d, c.page_size, po);
  if (c.fixed_split) {
    bool any_long = false;
    for (int32_t len : c.lens) any_long |= len > *c.fixed_split * c.page_size;
    EXPECT_EQ(w.split_kv(), any_long);
  }
  const int64_t rows = batch * c.q_len_per_req;
  Tensor q = Tensor::empty({rows, c.hq, c.d}, c.dtype).uniform_(9);
  AttentionRunOptions ro;
  ro.return_lse = true;
  AttentionOutput r = w.run(q, f.cache(), ro);
  ASSERT_EQ(r.out.shape(), (Shape{rows, c.hq, c.d}));
  ASSERT_EQ(r.lse.shape(), (Shape{rows, c.hq}));
  RefOptions opt;
  opt.soft_cap = c.soft_cap;
  opt.window_left = c.window;
  opt.causal = true;  // decode queries are the last tokens (no effect for one query)
  const auto qd = q.to_double_vector();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t r0 = b * c.q_len_per_req, r1 = r0 + c.q_len_per_req;
    std::vector<double> eo, el;
    testing::ref_attention(testing::rows_of(qd, r0, r1, c.hq * c.d), kd[b], vd[b], c.q_len_per_req,
                           c.lens[b], c.hq, c.hkv, c.d, c.d, opt, eo, el);
    EXPECT_TRUE(
        testing::all_close(r.out.slice(0, r0, r1), eo, testing::attention_tolerance(c.dtype)))
        << "request " << b;
    EXPECT_TRUE(testing::all_close(r.lse.slice(0, r0, r1), el, {1e-4, 1e-5})) << "request " << b;
  }
}

class BatchDecode : public ::testing::TestWithParam<BatchCase> {};
TEST_P(BatchDecode, MatchesReference) { check_batch_decode(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Grid, BatchDecode,
    ::testing::Values(
        // Unequal lengths incl. kv_len 1, last page 1 and full; GQA 1; auto split.
        BatchCase{DType::kFloat32, 4, 4, 64, 4, {1, 17, 16, 300}, false, false, {}, 0, -1, 1},
        // GQA 4, HND, pair form, forced split of 2 pages.
        BatchCase{DType::kFloat16, 8, 2, 128, 16, {33, 1, 64}, true, true, 2, 0, -1, 1},
        // GQA 8, D 256, bf16, split every page, soft cap, sliding window.
        BatchCase{DType::kBFloat16, 8, 1, 256, 8, {40, 9}, false, true, 1, 30.0, 12, 1},
        // Two queries per request (causal among themselves), empty-free lengths.
        BatchCase{DType::kFloat32, 2, 1, 64, 4, {5, 12}, true, false, 1, 0, -1, 2}));

TEST(BatchDecodeWrapper, OnePlanServesManyRunsAndBuffers) {
  const int64_t hq = 4, hkv = 2, d = 64, ps = 4;
  std::vector<std::vector<double>> k1, v1, k2, v2;
  testing::PagedFixture f1 =
      testing::make_paged({10, 3}, ps, hkv, d, DType::kFloat32, false, false, 1, k1, v1);
  testing::PagedFixture f2 = testing::make_paged({10, 3}, ps, hkv, d, DType::kFloat32, false, false,
                                                 1, k2, v2);  // same table, other layer
  f2.cache5.uniform_(77);
  BatchDecodeWithPagedKVCacheWrapper w(workspace());
  BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
  po.q_data_type = DType::kFloat32;
  po.sm_scale = 0.3;
  w.plan(f1.indptr, f1.indices, f1.last_page_len, hq, hkv, d, ps, po);
  Tensor q = Tensor::empty({2, hq, d}, DType::kFloat32).uniform_(3);
  Tensor out = Tensor::empty({2, hq, d}, DType::kFloat32);
  Tensor lse = Tensor::empty({2, hq}, DType::kFloat32);
  AttentionRunOptions ro;
  ro.out = out;
  ro.lse = lse;
  ro.return_lse = true;
  ro.q_scale = 2.0;  // folds into sm_scale
  for (const testing::PagedFixture* f : {&f1, &f2}) {
    AttentionOutput r = w.run(q, f->cache(), ro);
    EXPECT_EQ(r.out.data_ptr(), out.data_ptr());
    EXPECT_EQ(r.lse.data_ptr(), lse.data_ptr());
    // Read the K/V this layer's cache holds (f2 was refilled after make_paged).
    Tensor kc = f->cache5.select(1, 0), vc = f->cache5.select(1, 1);
    const auto idx = f->indices.to_double_vector();
    const std::vector<int32_t> lens{10, 3};
    int64_t page_base = 0;
    for (int64_t b = 0; b < 2; ++b) {
      std::vector<double> kk, vv;
      for (int64_t t = 0; t < lens[b]; ++t) {
        const auto page = static_cast<int64_t>(idx[page_base + t / ps]);
        const auto kr = kc.select(0, page).select(0, t % ps).to_double_vector();
        const auto vr = vc.select(0, page).select(0, t % ps).to_double_vector();
        kk.insert(kk.end(), kr.begin(), kr.end());
        vv.insert(vv.end(), vr.begin(), vr.end());
      }
      page_base += (lens[b] + ps - 1) / ps;
      RefOptions opt;
      opt.sm_scale = 0.6;
      std::vector<double> eo, el;
      testing::ref_attention(q.select(0, b).to_double_vector(), kk, vv, 1, lens[b], hq, hkv, d, d,
                             opt, eo, el);
      EXPECT_TRUE(testing::all_close(out.select(0, b), eo, {2e-5, 2e-5}));
      EXPECT_TRUE(testing::all_close(lse.select(0, b), el, {1e-4, 1e-5}));
    }
  }
}

// Page size 1 without the page axis, as upstream's _unpack_paged_kv_cache takes it: a pair of 3-D
// [tokens, H, D] tensors (SGLang's K/V pools) or a 4-D [tokens, 2, H, D] tensor, NHD and HND
// (then [tokens, H, D] too: the page axis goes in after H). Bit for bit the 5-D cache's output.
TEST(BatchDecodeWrapper, PageSizeOneCachesWithoutThePageAxis) {
  const int64_t hq = 4, hkv = 2, d = 64;
  for (bool hnd : {false, true}) {
    SCOPED_TRACE(hnd ? "HND" : "NHD");
    std::vector<std::vector<double>> kd, vd;
    testing::PagedFixture f =
        testing::make_paged({5, 3, 7}, 1, hkv, d, DType::kFloat32, hnd, false, 5, kd, vd);
    BatchDecodeWithPagedKVCacheWrapper w(workspace(), hnd ? "HND" : "NHD");
    BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
    po.q_data_type = DType::kFloat32;
    w.plan(f.indptr, f.indices, f.last_page_len, hq, hkv, d, 1, po);
    const Tensor q = Tensor::empty({3, hq, d}, DType::kFloat32).uniform_(6);
    const std::vector<double> want = w.run(q, f.cache()).out.to_double_vector();
    const int64_t page_axis = hnd ? 3 : 2;  // of the 5-D cache
    const Tensor k3 = f.cache5.select(1, 0).squeeze(page_axis - 1);
    const Tensor v3 = f.cache5.select(1, 1).squeeze(page_axis - 1);
    ASSERT_EQ(k3.dim(), 3);
    EXPECT_EQ(w.run(q, PagedKVCache(k3, v3)).out.to_double_vector(), want);
    const Tensor kv4 = f.cache5.squeeze(page_axis);
    ASSERT_EQ(kv4.dim(), 4);
    EXPECT_EQ(w.run(q, PagedKVCache(kv4)).out.to_double_vector(), want);
    const char* run = "BatchDecodeWithPagedKVCacheWrapper.run";
    EXPECT_FI_ERROR(w.run(q, PagedKVCache(k3, f.cache5.select(1, 1))), run, "paged_kv_cache");
    EXPECT_FI_ERROR(w.run(q, PagedKVCache(k3.select(0, 0), v3.select(0, 0))), run,
                    "paged_kv_cache");
  }
  // A plan of page size 4 does not take them.
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged({5, 3}, 4, hkv, d, DType::kFloat32, false, false, 5, kd, vd);
  BatchDecodeWithPagedKVCacheWrapper w(workspace());
  BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
  po.q_data_type = DType::kFloat32;
  w.plan(f.indptr, f.indices, f.last_page_len, hq, hkv, d, 4, po);
  const Tensor q = Tensor::empty({2, hq, d}, DType::kFloat32).uniform_(6);
  const Tensor k3 = Tensor::zeros({8, hkv, d}, DType::kFloat32);
  EXPECT_FI_ERROR(w.run(q, PagedKVCache(k3, k3)), "BatchDecodeWithPagedKVCacheWrapper.run",
                  "paged_kv_cache");
}

TEST(BatchDecodeWrapper, EmptyRequestGivesZerosAndMinusInf) {
  // Request 1 owns no pages (last_page_len 0): its output is 0 and its LSE -inf.
  Tensor cache = Tensor::empty({3, 2, 4, 1, 64}, DType::kFloat32).uniform_(1);
  BatchDecodeWithPagedKVCacheWrapper w(workspace());
  BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
  po.q_data_type = DType::kFloat32;
  w.plan(int_tensor({0, 1, 1}), int_tensor({2}), int_tensor({3, 0}), 2, 1, 64, 4, po);
  Tensor q = Tensor::empty({2, 2, 64}, DType::kFloat32).uniform_(2);
  AttentionRunOptions ro;
  ro.return_lse = true;
  AttentionOutput r = w.run(q, cache, ro);
  EXPECT_EQ(r.out.select(0, 1).to_double_vector(), std::vector<double>(128, 0.0));
  EXPECT_EQ(r.lse.select(0, 1).to_double_vector(),
            std::vector<double>(2, -std::numeric_limits<double>::infinity()));
  EXPECT_TRUE(std::isfinite(r.lse.select(0, 0).to_double_vector()[0]));
  // vLLM's CUDA-graph padding: requests with no pages and last_page_len 1 (any value) have no
  // key either, as upstream's get_length says; the real request's answer is unchanged.
  BatchDecodeWithPagedKVCacheWrapper w2(workspace());
  w2.plan(int_tensor({0, 1, 1, 1}), int_tensor({2}), int_tensor({3, 1, 1}), 2, 1, 64, 4, po);
  Tensor q3 = Tensor::zeros({3, 2, 64}, DType::kFloat32);
  q3.slice(0, 0, 2).copy_(q);
  AttentionOutput r2 = w2.run(q3, cache, ro);
  EXPECT_EQ(r2.out.slice(0, 0, 1).to_double_vector(), r.out.slice(0, 0, 1).to_double_vector());
  for (int64_t b : {1, 2}) {
    EXPECT_EQ(r2.out.select(0, b).to_double_vector(), std::vector<double>(128, 0.0));
    EXPECT_EQ(r2.lse.select(0, b).to_double_vector(),
              std::vector<double>(2, -std::numeric_limits<double>::infinity()));
  }
}

TEST(BatchDecodeWrapper, InvokersRunInitPlanRun) {
  // The declarations' invokers rebuild the object and replay plan/run from Values.
  const OpDecl* init = OpRegistry::global().find("BatchDecodeWithPagedKVCacheWrapper.__init__");
  const OpDecl* plan = OpRegistry::global().find("BatchDecodeWithPagedKVCacheWrapper.plan");
  const OpDecl* run = OpRegistry::global().find("BatchDecodeWithPagedKVCacheWrapper.run");
  ASSERT_TRUE(init && plan && run);
  EXPECT_EQ(init->module, "flashinfer.decode");
  EXPECT_EQ(plan->params[0].name, "self");
  EXPECT_EQ(plan->params[1].name, "indptr");
  EXPECT_TRUE(plan->params[plan->param_index("q_data_type")].keyword_only);
  EXPECT_FALSE(plan->params[plan->param_index("page_size")].keyword_only);
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged({7, 20}, 4, 2, 64, DType::kFloat16, false, false, 5, kd, vd);
  Value self = init->invoke(CallArgs(*init, bind_arguments(*init, {Value(), Value(workspace())})));
  ASSERT_EQ(self.kind(), Value::Kind::kObject);
  plan->invoke(CallArgs(
      *plan, bind_arguments(*plan, {self, Value(f.indptr), Value(f.indices), Value(f.last_page_len),
                                    Value(4), Value(2), Value(64), Value(4)})));
  Tensor q = Tensor::empty({2, 4, 64}, DType::kFloat16).uniform_(8);
  Value out = run->invoke(CallArgs(*run, bind_arguments(*run, {self, Value(q), to_value(f.cache())},
                                                        {{"return_lse", Value(true)}})));
  ASSERT_TRUE(out.is_sequence());
  BatchDecodeWithPagedKVCacheWrapper w(workspace());
  w.plan(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 4);
  Tensor direct = w.run(q, f.cache());
  EXPECT_TRUE(testing::all_close(out.items()[0].as_tensor(), direct, {0, 0}));
}

TEST(BatchDecodeWrapper, BadInput) {
  const char* init = "BatchDecodeWithPagedKVCacheWrapper.__init__";
  const char* plan = "BatchDecodeWithPagedKVCacheWrapper.plan";
  const char* run = "BatchDecodeWithPagedKVCacheWrapper.run";
  EXPECT_FI_ERROR(BatchDecodeWithPagedKVCacheWrapper(workspace(), "NDH"), init, "kv_layout");
  EXPECT_FI_ERROR(
      BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD", false, false, {}, {}, {}, "fa3"), init,
      "backend");
  EXPECT_FI_ERROR(BatchDecodeWithPagedKVCacheWrapper{Tensor{}}, init, "float_workspace_buffer");
  // A workspace view at an odd byte offset: the fp32 partials in it would be misaligned.
  EXPECT_FI_ERROR(BatchDecodeWithPagedKVCacheWrapper{workspace().slice(0, 1, 1 << 12)}, init,
                  "float_workspace_buffer");

  BatchDecodeWithPagedKVCacheWrapper w(workspace());
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged({5, 8}, 4, 2, 64, DType::kFloat16, false, false, 5, kd, vd);
  Tensor q = Tensor::zeros({2, 4, 64}, DType::kFloat16);
  EXPECT_FI_ERROR(w.run(q, f.cache()), run, "self");  // run before plan
  auto P = [&](const Tensor& indptr, const Tensor& indices, const Tensor& last, int64_t hq,
               int64_t hkv, int64_t d, int64_t ps,
               BatchDecodeWithPagedKVCacheWrapper::PlanOptions o = {}) {
    w.plan(indptr, indices, last, hq, hkv, d, ps, o);
  };
  EXPECT_FI_ERROR(P(int_tensor({0, 3, 2}), f.indices, f.last_page_len, 4, 2, 64, 4), plan,
                  "indptr");
  EXPECT_FI_ERROR(P(int_tensor({-1, 2, 4}), f.indices, f.last_page_len, 4, 2, 64, 4), plan,
                  "indptr");
  EXPECT_FI_ERROR(P(int_tensor({1, 0, 4}), f.indices, f.last_page_len, 4, 2, 64, 4), plan,
                  "indptr");
  EXPECT_FI_ERROR(P(f.indptr, f.indices, int_tensor({1, 4, 4}), 4, 2, 64, 4), plan,
                  "last_page_len");
  EXPECT_FI_ERROR(P(f.indptr, int_tensor({0, 1}), f.last_page_len, 4, 2, 64, 4), plan, "indices");
  EXPECT_FI_ERROR(P(f.indptr, int_tensor({0, -1, 2}), f.last_page_len, 4, 2, 64, 4), plan,
                  "indices");
  EXPECT_FI_ERROR(P(f.indptr, f.indices, int_tensor({0, 4}), 4, 2, 64, 4), plan, "last_page_len");
  EXPECT_FI_ERROR(P(f.indptr, f.indices, int_tensor({1, 5}), 4, 2, 64, 4), plan, "last_page_len");
  EXPECT_FI_ERROR(P(f.indptr, f.indices, f.last_page_len, 4, 3, 64, 4), plan, "num_kv_heads");
  EXPECT_FI_ERROR(P(f.indptr, f.indices, f.last_page_len, 4, 2, 72, 4), plan, "head_dim_qk");
  EXPECT_FI_ERROR(P(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 0), plan, "page_size");
  EXPECT_FI_ERROR(P(Tensor::zeros({3}, DType::kInt64), f.indices, f.last_page_len, 4, 2, 64, 4),
                  plan, "indptr");
  {
    BatchDecodeWithPagedKVCacheWrapper::PlanOptions o;
    o.pos_encoding_mode = "ROPE";  // not a mode
    EXPECT_FI_ERROR(P(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 4, o), plan,
                    "pos_encoding_mode");
    // Several queries per request are its last tokens: a request needs at least that many keys
    // (request 0 has 5).
    o = {};
    o.q_len_per_req = 6;
    EXPECT_FI_ERROR(P(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 4, o), plan, "last_page_len");
    o.q_len_per_req = 5;
    EXPECT_NO_THROW(P(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 4, o));
    o = {};
    o.q_data_type = DType::kInt32;
    EXPECT_FI_ERROR(P(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 4, o), plan, "q_data_type");
    o = {};
    o.logits_soft_cap = -1.0;
    EXPECT_FI_ERROR(P(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 4, o), plan,
                    "logits_soft_cap");
    o = {};
    o.window_left = -2;
    EXPECT_FI_ERROR(P(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 4, o), plan, "window_left");
  }
  // A failed plan leaves the wrapper unplanned.
  EXPECT_FI_ERROR(w.run(q, f.cache()), run, "self");
  P(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 4);
  EXPECT_NO_THROW(w.run(q, f.cache()));
  EXPECT_FI_ERROR(w.run(Tensor::zeros({3, 4, 64}, DType::kFloat16), f.cache()), run, "q");
  EXPECT_FI_ERROR(w.run(Tensor::zeros({2, 8, 64}, DType::kFloat16), f.cache()), run, "q");
  EXPECT_FI_ERROR(w.run(Tensor::zeros({2, 4, 64}, DType::kBFloat16), f.cache()), run, "q");
  EXPECT_FI_ERROR(w.run(q, PagedKVCache(f.cache5.to(DType::kBFloat16))), run, "paged_kv_cache");
  // A cache with fewer pages than the table refers to: an error, not a stray read.
  EXPECT_FI_ERROR(w.run(q, PagedKVCache(f.cache5.slice(0, 0, 2))), run, "paged_kv_cache");
  EXPECT_FI_ERROR(w.run(q, PagedKVCache(Tensor::zeros({6, 2, 8, 2, 64}, DType::kFloat16))), run,
                  "paged_kv_cache");
  AttentionRunOptions ro;
  ro.out = Tensor::zeros({2, 4, 32}, DType::kFloat16);
  EXPECT_FI_ERROR(w.run(q, f.cache(), ro), run, "out");
  ro = {};
  ro.lse = Tensor::zeros({2, 4}, DType::kFloat16);
  EXPECT_FI_ERROR(w.run(q, f.cache(), ro), run, "lse");
  ro = {};
  ro.sinks = Tensor::zeros({3}, DType::kFloat32);  // one per qo head (4) is needed
  EXPECT_FI_ERROR(w.run(q, f.cache(), ro), run, "sinks");
  ro = {};
  ro.q_len_per_req = 2;
  EXPECT_FI_ERROR(w.run(q, f.cache(), ro), run, "q_len_per_req");
}

// What vLLM's FlashInfer backend passes to plan(): a slice of the whole batch's indptr (first
// entry not 0), seq_lens= next to the page table, and fixed_split_size=-1 for "none".
TEST(BatchDecodeWrapper, VllmPlanArguments) {
  const char* plan = "BatchDecodeWithPagedKVCacheWrapper.plan";
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged({5, 8}, 4, 2, 64, DType::kFloat32, false, false, 9, kd, vd);
  Tensor q = Tensor::empty({2, 4, 64}, DType::kFloat32);
  q.normal_(3);
  BatchDecodeWithPagedKVCacheWrapper::PlanOptions o;
  o.q_data_type = DType::kFloat32;
  BatchDecodeWithPagedKVCacheWrapper ref(workspace());
  ref.plan(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 4, o);
  const Tensor expected = ref.run(q, f.cache()).out;

  // The same requests behind three pages of other requests: indptr shifted by 3, indices
  // prefixed with 3 unrelated (out-of-range, so any use would be an error) page ids.
  const int32_t* ip = f.indptr.data<int32_t>();
  const int32_t* ix = f.indices.data<int32_t>();
  std::vector<int32_t> shifted_indptr, shifted_indices = {9999, 9999, 9999};
  for (int64_t i = 0; i < f.indptr.numel(); ++i) shifted_indptr.push_back(ip[i] + 3);
  for (int64_t i = 0; i < f.indices.numel(); ++i) shifted_indices.push_back(ix[i]);
  BatchDecodeWithPagedKVCacheWrapper w(workspace());
  o.seq_lens = int_tensor({5, 8});
  o.fixed_split_size = -1;
  w.plan(int_tensor(shifted_indptr), int_tensor(shifted_indices), f.last_page_len, 4, 2, 64, 4, o);
  EXPECT_TRUE(testing::all_close(w.run(q, f.cache()).out, expected, {0.0, 0.0}));

  // seq_lens that disagree with the page table name seq_lens.
  o.seq_lens = int_tensor({5, 7});
  EXPECT_FI_ERROR(w.plan(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 4, o), plan, "seq_lens");
  o.seq_lens = int_tensor({5});
  EXPECT_FI_ERROR(w.plan(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 4, o), plan, "seq_lens");
  o.seq_lens.reset();
  o.fixed_split_size = 0;
  EXPECT_FI_ERROR(w.plan(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 4, o), plan,
                  "fixed_split_size");

  // Recorded as upstream does: keywords through **kwargs, so seq_lens= binds by keyword and the
  // signature text is upstream's.
  const OpDecl* d = OpRegistry::global().find(plan);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->signature(),
            "(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, "
            "page_size, *deprecated_positional_args, **kwargs)");
  const OpDecl* run = OpRegistry::global().find("BatchDecodeWithPagedKVCacheWrapper.run");
  EXPECT_EQ(run->signature(),
            "(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, "
            "lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None, "
            "q_len_per_req=None, skip_softmax_threshold_scale_factor=None, kv_cache_sf=None)");
  auto obj = std::make_shared<BatchDecodeWithPagedKVCacheWrapper>(workspace());
  ObjectRef self;
  self.type = std::string(obj->class_name());
  self.id = obj->object_id();
  self.object = obj;
  d->invoke(
      CallArgs(*d, bind_arguments(*d,
                                  {Value(self), Value(f.indptr), Value(f.indices),
                                   Value(f.last_page_len), Value(4), Value(2), Value(64), Value(4)},
                                  {{"seq_lens", Value(int_tensor({5, 8}))},
                                   {"q_data_type", Value(DType::kFloat32)},
                                   {"fixed_split_size", Value(-1)}})));
  EXPECT_TRUE(testing::all_close(obj->run(q, f.cache()).out, expected, {0.0, 0.0}));
  // A deprecated positional argument after page_size is refused, naming the *args parameter.
  EXPECT_FI_ERROR(
      bind_arguments(*d, {Value(self), Value(f.indptr), Value(f.indices), Value(f.last_page_len),
                          Value(4), Value(2), Value(64), Value(4), Value("NONE")}),
      plan, "deprecated_positional_args");
}

TEST(SingleDecode, BadInput) {
  const char* op = "single_decode_with_kv_cache";
  Tensor q = Tensor::zeros({4, 64}, DType::kFloat16);
  Tensor k = Tensor::zeros({10, 2, 64}, DType::kFloat16);
  EXPECT_FI_ERROR(single_decode_with_kv_cache(q, k, Tensor::zeros({9, 2, 64}, DType::kFloat16)), op,
                  "v");
  EXPECT_FI_ERROR(single_decode_with_kv_cache(q, Tensor::zeros({10, 3, 64}, DType::kFloat16),
                                              Tensor::zeros({10, 3, 64}, DType::kFloat16)),
                  op, "k");
  EXPECT_FI_ERROR(single_decode_with_kv_cache(q, k.to(DType::kBFloat16), k.to(DType::kBFloat16)),
                  op, "k");
  // head_dim 40: not a multiple of 16 (any multiple of 16 up to 256 runs, docs/JIT.md).
  EXPECT_FI_ERROR(single_decode_with_kv_cache(Tensor::zeros({4, 40}, DType::kFloat16),
                                              Tensor::zeros({10, 2, 40}, DType::kFloat16),
                                              Tensor::zeros({10, 2, 40}, DType::kFloat16)),
                  op, "q");
  EXPECT_FI_ERROR(single_decode_with_kv_cache(q, k, k, "XYZ"), op, "kv_layout");
  EXPECT_FI_ERROR(single_decode_with_kv_cache(q.unsqueeze(0), k, k), op, "q");
  EXPECT_FI_ERROR(single_decode_with_kv_cache(q.to(DType::kInt32), k, k), op, "q");
}

}  // namespace
}  // namespace flashinfer

namespace flashinfer {
namespace {

// The library's choice of decode kernel (group 4: tensor cores, api::decode_tensor_cores_auto)
// and the CUDA-core kernel (FLASHINFER_DECODE_TENSOR_CORES=0), each in turn.
constexpr const char* kDecodeKernels[] = {nullptr, "0"};
std::string decode_kernel_name(const char* tc) {
  return tc ? "FLASHINFER_DECODE_TENSOR_CORES=0" : "default";
}

// CUDA vs the CPU reference on the same inputs (skipped without a GPU), on both decode kernels.
TEST(BatchDecodeCuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (const char* tc : kDecodeKernels) {
    SCOPED_TRACE(decode_kernel_name(tc));
    const testing::ScopedEnv env("FLASHINFER_DECODE_TENSOR_CORES", tc);
    for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
      for (int64_t d : {64, 128, 256, 96, 80}) {  // 96, 80: JIT-compiled (docs/JIT.md)
        std::vector<std::vector<double>> kd, vd;
        testing::PagedFixture f =
            testing::make_paged({1, 17, 300, 64}, 16, 2, d, dt, false, false, 3, kd, vd);
        Tensor q = Tensor::empty({4, 8, d}, dt).uniform_(4);
        BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
        po.q_data_type = dt;
        po.fixed_split_size = 4;  // exercise the merge pass
        AttentionRunOptions ro;
        ro.return_lse = true;
        BatchDecodeWithPagedKVCacheWrapper cpu(workspace());
        cpu.plan(f.indptr, f.indices, f.last_page_len, 8, 2, d, 16, po);
        AttentionOutput ref = cpu.run(q, f.cache(), ro);
        BatchDecodeWithPagedKVCacheWrapper gpu(
            Tensor::zeros({8 << 20}, DType::kUInt8, Device::cuda()));
        gpu.plan(f.indptr, f.indices, f.last_page_len, 8, 2, d, 16, po);
        EXPECT_TRUE(gpu.split_kv()) << "the plan ran unsplit";
        AttentionOutput got =
            gpu.run(q.to(Device::cuda()),
                    PagedKVCache(testing::to_keep_layout(f.cache5, Device::cuda())), ro);
        EXPECT_TRUE(testing::all_close(got.out, ref.out, testing::default_tolerance(dt)));
        EXPECT_TRUE(testing::all_close(got.lse, ref.lse, {1e-3, 1e-4}));
      }
    }
  }
}

// SGLang's decode call on CUDA: page size 1, its K/V pools as a pair of 3-D [tokens, H, D]
// tensors (a bf16 and an fp8 e4m3 cache with scales), on both decode kernels: the 5-D cache's
// bits, and the CPU reference's values.
TEST(BatchDecodeCuda, PageSizeOnePoolsWithoutThePageAxisMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  for (const char* tc : kDecodeKernels) {
    SCOPED_TRACE(decode_kernel_name(tc));
    const testing::ScopedEnv env("FLASHINFER_DECODE_TENSOR_CORES", tc);
    for (DType kv_dt : {DType::kBFloat16, DType::kFloat8E4M3FN}) {
      std::vector<std::vector<double>> kd, vd;
      testing::PagedFixture f = testing::make_paged({1, 40, 300, 7}, 1, 8, 128, DType::kBFloat16,
                                                    false, false, 3, kd, vd);
      const Tensor cache5 = f.cache5.to(kv_dt);
      const Tensor q = Tensor::empty({4, 32, 128}, DType::kBFloat16).uniform_(4);
      BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
      po.q_data_type = DType::kBFloat16;
      po.kv_data_type = kv_dt;
      AttentionRunOptions ro;
      ro.k_scale = 0.5;
      ro.v_scale = 2.0;
      BatchDecodeWithPagedKVCacheWrapper cpu(workspace());
      cpu.plan(f.indptr, f.indices, f.last_page_len, 32, 8, 128, 1, po);
      const Tensor ref = cpu.run(q, PagedKVCache(cache5), ro).out;
      BatchDecodeWithPagedKVCacheWrapper gpu(Tensor::zeros({8 << 20}, DType::kUInt8, g));
      gpu.plan(f.indptr, f.indices, f.last_page_len, 32, 8, 128, 1, po);
      const Tensor c5 = testing::to_keep_layout(cache5, g);
      const Tensor qg = q.to(g);
      const std::vector<double> five = gpu.run(qg, PagedKVCache(c5), ro).out.to_double_vector();
      const Tensor got =
          gpu.run(qg, PagedKVCache(c5.select(1, 0).squeeze(1), c5.select(1, 1).squeeze(1)), ro).out;
      EXPECT_EQ(got.to_double_vector(), five) << dtype_torch_name(kv_dt);
      EXPECT_TRUE(testing::all_close(got, ref, testing::default_tolerance(DType::kBFloat16)))
          << dtype_torch_name(kv_dt);
    }
  }
}

// Decode through both CUDA kernels, with several causal queries per request, a window, a soft
// cap and forced split-KV, against the CPU reference: the CUDA-core kernel (backend "fa2" keeps
// it), the tensor-core prefill kernel with use_tensor_cores, and the library's own choice for
// use_tensor_cores=False at group 4 (backend "auto": tensor cores, api::decode_tensor_cores_auto).
TEST(BatchDecodeCuda, TensorCoresAndMultiQueryMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  for (auto [tensor_cores, backend] :
       {std::pair<bool, const char*>{false, "fa2"}, {false, "auto"}, {true, "auto"}}) {
    for (int64_t q_len : {1, 3}) {
      std::vector<std::vector<double>> kd, vd;
      testing::PagedFixture f =
          testing::make_paged({5, 40, 333}, 16, 2, 128, DType::kBFloat16, true, true, 7, kd, vd);
      Tensor q = Tensor::empty({3 * q_len, 8, 128}, DType::kBFloat16).uniform_(9);
      BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
      po.q_data_type = DType::kBFloat16;
      po.q_len_per_req = q_len;
      po.window_left = 100;
      po.logits_soft_cap = 20.0;
      po.fixed_split_size = 2;
      AttentionRunOptions ro;
      ro.return_lse = true;
      BatchDecodeWithPagedKVCacheWrapper cpu(workspace(), "HND", false, tensor_cores);
      cpu.plan(f.indptr, f.indices, f.last_page_len, 8, 2, 128, 16, po);
      AttentionOutput ref = cpu.run(q, f.cache(), ro);
      BatchDecodeWithPagedKVCacheWrapper gpu(Tensor::zeros({8 << 20}, DType::kUInt8, g), "HND",
                                             false, tensor_cores, {}, {}, {}, backend);
      gpu.plan(f.indptr, f.indices, f.last_page_len, 8, 2, 128, 16, po);
      EXPECT_TRUE(gpu.split_kv()) << "the plan ran unsplit";
      AttentionOutput got = gpu.run(q.to(g),
                                    PagedKVCache(testing::to_keep_layout(f.k_cache, g),
                                                 testing::to_keep_layout(f.v_cache, g)),
                                    ro);
      EXPECT_TRUE(
          testing::all_close(got.out, ref.out, testing::default_tolerance(DType::kBFloat16)))
          << "tensor_cores " << tensor_cores << " backend " << backend << " q_len " << q_len;
      EXPECT_TRUE(testing::all_close(got.lse, ref.lse, {2e-3, 1e-3}))
          << "tensor_cores " << tensor_cores << " backend " << backend << " q_len " << q_len;
    }
  }
}

// fp8 K/V with k_scale / v_scale, a window and a soft cap, on both decode kernels.
TEST(SingleDecodeCuda, Fp8KvMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  Tensor q = Tensor::empty({8, 128}, DType::kFloat16).uniform_(1);
  Tensor k = Tensor::empty({77, 2, 128}, DType::kFloat8E4M3FN).uniform_(2);
  Tensor v = Tensor::empty({77, 2, 128}, DType::kFloat8E4M3FN).uniform_(3);
  Tensor ref = single_decode_with_kv_cache(q, k, v, "NHD", "NONE", false, {}, 0.5, 2.0, 20, 10.0);
  for (const char* tc : kDecodeKernels) {
    SCOPED_TRACE(decode_kernel_name(tc));
    const testing::ScopedEnv env("FLASHINFER_DECODE_TENSOR_CORES", tc);
    Tensor got = single_decode_with_kv_cache(q.to(Device::cuda()), k.to(Device::cuda()),
                                             v.to(Device::cuda()), "NHD", "NONE", false, {}, 0.5,
                                             2.0, 20, 10.0);
    EXPECT_TRUE(testing::all_close(got, ref, testing::default_tolerance(DType::kFloat16)));
  }
}

}  // namespace
}  // namespace flashinfer

namespace flashinfer {
namespace {

TEST(BatchDecodeWrapper, RecordedInitPlanRunReplays) {
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged({9, 30, 1}, 8, 2, 64, DType::kBFloat16, true, true, 5, kd, vd);
  Tensor q = Tensor::empty({3, 8, 64}, DType::kBFloat16).uniform_(8);
  auto capture = std::make_shared<testing::CallCapture>();
  add_call_observer(capture);
  AttentionOutput direct;
  {
    BatchDecodeWithPagedKVCacheWrapper w(workspace(), "HND");
    BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
    po.q_data_type = DType::kBFloat16;
    po.logits_soft_cap = 8.0;
    po.fixed_split_size = 1;
    w.plan(f.indptr, f.indices, f.last_page_len, 8, 2, 64, 8, po);
    AttentionRunOptions ro;
    ro.return_lse = true;
    direct = w.run(q, f.cache(), ro);
  }
  remove_call_observer(capture);
  ASSERT_EQ(capture->calls.size(), 3u);
  EXPECT_EQ(capture->calls[0].decl->name, "BatchDecodeWithPagedKVCacheWrapper.__init__");
  EXPECT_EQ(capture->calls[1].decl->name, "BatchDecodeWithPagedKVCacheWrapper.plan");
  EXPECT_EQ(capture->calls[2].decl->name, "BatchDecodeWithPagedKVCacheWrapper.run");
  // The same object id in every call, as the recorder's self_id.
  EXPECT_EQ(capture->calls[0].args[0].as_object().id, capture->calls[2].args[0].as_object().id);
  const std::vector<Value> replayed = capture->replay();
  ASSERT_TRUE(replayed[2].is_sequence());
  EXPECT_TRUE(testing::all_close(replayed[2].items()[0].as_tensor(), direct.out, {0, 0}));
  EXPECT_TRUE(testing::all_close(replayed[2].items()[1].as_tensor(), direct.lse, {0, 0}));
  EXPECT_TRUE(
      testing::all_close(capture->calls[2].result.items()[0].as_tensor(), direct.out, {0, 0}));
}

// ---- the paged wrappers' recorder extension (api/attention_ids_at_run.cpp) ----

// A recorded run's fi_ext__kv_indices_at_run holds the page ids the call read when it ran (a
// device wrapper reading them at run: the engine may have written others after plan); the replay
// writes them where the replayed wrapper reads them. A CPU recording (plan copies its ids: the
// key is not added) gets the key by hand: holding other ids than plan's, the recorded output no
// longer matches (the replay ran over them); with those ids' output as the recorded one, every
// call passes. Both paged wrappers.
TEST(PagedIdsAtRun, ReplayRunsOverTheRecordedIds) {
  namespace fs = std::filesystem;
  const int64_t page = 4, hq = 4, hkv = 2, d = 64, pages = 12;
  const Tensor k =
      Tensor::empty({pages, page, hkv, d}, DType::kFloat32).uniform_(31).to(DType::kFloat16);
  const Tensor v =
      Tensor::empty({pages, page, hkv, d}, DType::kFloat32).uniform_(32).to(DType::kFloat16);
  const PagedKVCache cache(k, v);
  const Tensor indptr = int_tensor({0, 3, 5}), last = int_tensor({2, 4});
  const std::vector<int32_t> ids_a{0, 1, 2, 3, 4}, ids_b{7, 2, 9, 11, 5};
  for (bool prefill : {false, true}) {
    SCOPED_TRACE(prefill ? "BatchPrefillWithPagedKVCacheWrapper"
                         : "BatchDecodeWithPagedKVCacheWrapper");
    const Tensor q = Tensor::empty({prefill ? 5 : 2, hq, d}, DType::kFloat32)
                         .uniform_(prefill ? 34 : 33)
                         .to(DType::kFloat16);
    auto run_with = [&](const std::vector<int32_t>& ids) -> Tensor {
      if (prefill) {
        BatchPrefillWithPagedKVCacheWrapper w(workspace());
        PrefillPlanOptions po;
        po.causal = true;
        w.plan(int_tensor({0, 3, 5}), indptr, int_tensor(ids), last, hq, hkv, d, page, po);
        return w.run(q, cache).out;
      }
      BatchDecodeWithPagedKVCacheWrapper w(workspace());
      w.plan(indptr, int_tensor(ids), last, hq, hkv, d, page);
      return w.run(q, cache).out;
    };
    const fs::path dir = fs::temp_directory_path() /
                         ("fi_paged_ids_" + std::to_string(::getpid()) + (prefill ? "_p" : "_d"));
    fs::remove_all(dir);
    recorder::Config cfg;
    cfg.dump_dir = dir.string();
    recorder::start(cfg, [](const std::string&) {});
    run_with(ids_a);
    recorder::stop();
    const Tensor out_b = run_with(ids_b);
    fs::path run_dir;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().filename().string().find(".run_call") != std::string::npos) run_dir = e.path();
    }
    ASSERT_FALSE(run_dir.empty());
    const std::string inputs = (run_dir / "inputs.pt").string();
    NamedTensors in = load_torch(inputs);
    for (const auto& kv : in) ASSERT_NE(kv.first, "fi_ext__kv_indices_at_run");
    in.emplace_back("fi_ext__kv_indices_at_run", int_tensor(ids_b));
    save_torch(inputs, in);
    std::vector<replay::Result> r = replay::replay_sequence(dir.string());
    ASSERT_EQ(r.size(), 3u);  // __init__, plan, run
    EXPECT_EQ(r[2].status, replay::Status::kMismatch) << r[2].error;
    const std::string outputs = (run_dir / "outputs.pt").string();
    NamedTensors out = load_torch(outputs);
    ASSERT_FALSE(out.empty());
    out.front().second = out_b;
    save_torch(outputs, out);
    testing::replay_expecting_every_call_to_pass(dir, 3u);
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace flashinfer
