// Cascade wrappers (flashinfer.cascade): MultiLevelCascadeAttentionWrapper and the shared-prefix
// decode/prefill wrappers against an fp64 formula over a grid (dtypes, fp8 KV, layouts, page
// sizes, level counts, causal), a hand-checked golden, bad input, record and replay (observer and
// a Flight Recorder dump through replay_sequence).
//
// The formula: merging the levels' states is attention over the union of their keys (cascade.h),
// and with upstream's causal-on-the-last-level rule a query of a request with qo_len queries and
// U unique keys sees every shared key and unique keys j <= U - qo_len + i, which is the
// right-aligned causal mask over the concatenated keys (shared first) when U >= qo_len.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "flashinfer/ops/cascade_wrappers.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"

namespace flashinfer {
namespace {

using testing::int_tensor;

Tensor workspace() { return Tensor::zeros({1 << 16}, DType::kUInt8); }

// A paged cache of "segments" (make_paged's requests), and one page table per level built from a
// list of segment ids per request of that level.
struct Segments {
  testing::PagedFixture f;
  std::vector<std::vector<double>> k, v;  // per segment [len, hkv, d]
  std::vector<int32_t> indptr, indices;
  std::vector<int32_t> lens;
  int64_t page_size = 1;
};

Segments make_segments(const std::vector<int32_t>& lens, int64_t page_size, int64_t hkv, int64_t d,
                       DType dtype, bool hnd, bool pair, uint64_t seed) {
  Segments s;
  s.f = testing::make_paged(lens, page_size, hkv, d, dtype, hnd, pair, seed, s.k, s.v);
  s.indptr = std::vector<int32_t>(s.f.indptr.data<int32_t>(),
                                  s.f.indptr.data<int32_t>() + s.f.indptr.numel());
  s.indices = std::vector<int32_t>(s.f.indices.data<int32_t>(),
                                   s.f.indices.data<int32_t>() + s.f.indices.numel());
  s.lens = lens;
  s.page_size = page_size;
  return s;
}

struct Table {
  Tensor indptr, indices, last;
};

// The page table whose request r is segment seg[r].
Table table_of(const Segments& s, const std::vector<int>& seg) {
  std::vector<int32_t> indptr{0}, indices, last;
  for (int g : seg) {
    for (int32_t p = s.indptr[g]; p < s.indptr[g + 1]; ++p) indices.push_back(s.indices[p]);
    indptr.push_back(static_cast<int32_t>(indices.size()));
    const int32_t n = s.indptr[g + 1] - s.indptr[g];
    last.push_back(n == 0 ? 0 : static_cast<int32_t>(s.lens[g] - (n - 1) * s.page_size));
  }
  return {int_tensor(indptr), int_tensor(indices), int_tensor(last)};
}

std::vector<double> concat(const std::vector<std::vector<double>>& parts) {
  std::vector<double> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// ---- MultiLevelCascadeAttentionWrapper ------------------------------------------------------

struct MultiCase {
  DType q, kv;
  int levels;
  int64_t page_size, hq, hkv, d;
  bool hnd, pair, causal;
  double soft_cap;
};

void run_multi_case(const MultiCase& c, uint64_t seed) {
  // 4 requests: level 0 one shared segment (0); level 1 two groups (1: requests 0-1, 2: 2-3);
  // the last level each request's unique segment (3..6). Fewer levels drop the middle one(s).
  const std::vector<int32_t> lens{7, 5, 0, 6, 9, 3, 4};
  const std::vector<int32_t> qo{2, 1, 3, 4};
  Segments sg = make_segments(lens, c.page_size, c.hkv, c.d, c.kv, c.hnd, c.pair, seed);
  std::vector<std::vector<int>> req_segs(4);  // the segments each request sees, in level order
  std::vector<Table> tables;
  std::vector<Tensor> qo_arr;
  int32_t total = 0;
  std::vector<int32_t> qo_indptr{0};
  for (int32_t n : qo) qo_indptr.push_back(total += n);
  if (c.levels >= 2) {
    tables.push_back(table_of(sg, {0}));
    qo_arr.push_back(int_tensor({0, total}));
    for (auto& r : req_segs) r.push_back(0);
  }
  if (c.levels >= 3) {
    tables.push_back(table_of(sg, {1, 2}));
    qo_arr.push_back(int_tensor({0, qo_indptr[2], total}));
    req_segs[0].push_back(1);
    req_segs[1].push_back(1);
    req_segs[2].push_back(2);
    req_segs[3].push_back(2);
  }
  tables.push_back(table_of(sg, {3, 4, 5, 6}));
  qo_arr.push_back(int_tensor(qo_indptr));
  for (int r = 0; r < 4; ++r) req_segs[r].push_back(3 + r);

  std::vector<Tensor> indptrs, indices, lasts;
  for (const Table& t : tables) {
    indptrs.push_back(t.indptr);
    indices.push_back(t.indices);
    lasts.push_back(t.last);
  }
  MultiLevelCascadeAttentionWrapper w(c.levels, workspace(), c.hnd ? "HND" : "NHD");
  EXPECT_EQ(w.num_levels(), c.levels);
  const double sm_scale = 0.7 / std::sqrt(static_cast<double>(c.d));
  w.plan(qo_arr, indptrs, indices, lasts, c.hq, c.hkv, c.d, c.page_size, c.causal, "NONE", false,
         sm_scale, -1, c.soft_cap > 0 ? std::optional<double>(c.soft_cap) : std::nullopt,
         std::nullopt, std::nullopt, c.q, c.kv);
  Tensor q = testing::rand_tensor({total, c.hq, c.d}, c.q, seed + 7);
  Tensor o = w.run(q, sg.f.cache());
  ASSERT_EQ(o.shape(), (Shape{total, c.hq, c.d}));
  ASSERT_EQ(o.dtype(), c.q);

  const auto qd = q.to_double_vector();
  std::vector<double> expect;
  for (int r = 0; r < 4; ++r) {
    std::vector<std::vector<double>> ks, vs;
    int64_t kv = 0;
    for (int g : req_segs[r]) {
      ks.push_back(sg.k[g]);
      vs.push_back(sg.v[g]);
      kv += lens[g];
    }
    testing::RefOptions opt;
    opt.sm_scale = sm_scale;
    opt.soft_cap = c.soft_cap;
    opt.causal = c.causal;
    std::vector<double> oref, lref;
    testing::ref_attention(testing::rows_of(qd, qo_indptr[r], qo_indptr[r + 1], c.hq * c.d),
                           concat(ks), concat(vs), qo[r], kv, c.hq, c.hkv, c.d, c.d, opt, oref,
                           lref);
    expect.insert(expect.end(), oref.begin(), oref.end());
  }
  // Each level's output is rounded to q's dtype before the merge (as upstream): allow twice the
  // attention tolerance.
  testing::Tolerance tol = testing::attention_tolerance(c.q);
  tol.atol *= 2;
  tol.rtol *= 2;
  EXPECT_TRUE(testing::all_close(o, expect, tol));
}

TEST(MultiLevelCascade, MatchesFp64FormulaOverGrid) {
  const MultiCase cases[] = {
      {DType::kFloat32, DType::kFloat32, 2, 4, 4, 2, 64, false, false, false, 0.0},
      {DType::kFloat32, DType::kFloat32, 3, 3, 4, 1, 64, true, false, true, 0.0},
      {DType::kFloat32, DType::kFloat32, 1, 16, 2, 2, 64, false, true, true, 0.0},
      {DType::kFloat16, DType::kFloat16, 3, 1, 8, 2, 128, false, true, false, 5.0},
      {DType::kBFloat16, DType::kBFloat16, 2, 5, 4, 4, 64, true, false, true, 0.0},
      {DType::kBFloat16, DType::kFloat8E4M3FN, 3, 4, 4, 2, 64, false, false, true, 0.0},
      {DType::kFloat16, DType::kFloat8E5M2, 2, 2, 2, 1, 256, true, true, false, 0.0},
  };
  uint64_t seed = 100;
  for (const MultiCase& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << dtype_torch_name(c.q) << "/" << dtype_torch_name(c.kv) << " levels " << c.levels
                 << " page " << c.page_size << " hq " << c.hq << " hkv " << c.hkv << " d " << c.d
                 << (c.hnd ? " HND" : " NHD") << (c.pair ? " pair" : "")
                 << (c.causal ? " causal" : "") << " cap " << c.soft_cap);
    run_multi_case(c, seed += 10);
  }
}

// q = 0 makes every visible key weigh the same: the output is the mean of the values the query
// sees across levels. Two shared keys (values 1, 2) then two unique keys (3, 4): 2.5.
TEST(MultiLevelCascade, HandCheckedGolden) {
  const int64_t d = 64;
  Tensor cache = Tensor::zeros({2, 2, 2, 1, d}, DType::kFloat32);  // 2 pages of 2 tokens
  for (int64_t p = 0; p < 2; ++p) {
    for (int64_t t = 0; t < 2; ++t)
      cache.select(0, p).select(0, 1).select(0, t).fill_(2 * p + t + 1);
  }
  MultiLevelCascadeAttentionWrapper w(2, workspace());
  w.plan({int_tensor({0, 1}), int_tensor({0, 1})}, {int_tensor({0, 1}), int_tensor({0, 1})},
         {int_tensor({0}), int_tensor({1})}, {int_tensor({2}), int_tensor({2})}, 1, 1, d, 2, false,
         "NONE", false, std::nullopt, -1, std::nullopt, std::nullopt, std::nullopt,
         DType::kFloat32);
  Tensor o = w.run(Tensor::zeros({1, 1, d}, DType::kFloat32), PagedKVCache(cache));
  EXPECT_TRUE(testing::all_close(o, std::vector<double>(d, 2.5), {1e-6, 1e-6}));
  // Causal on the last level: the query (qo_len 1) sits at the last unique key, sees both.
  w.plan({int_tensor({0, 1}), int_tensor({0, 1})}, {int_tensor({0, 1}), int_tensor({0, 1})},
         {int_tensor({0}), int_tensor({1})}, {int_tensor({2}), int_tensor({1})}, 1, 1, d, 2, true,
         "NONE", false, std::nullopt, -1, std::nullopt, std::nullopt, std::nullopt,
         DType::kFloat32);
  o = w.run(Tensor::zeros({1, 1, d}, DType::kFloat32), PagedKVCache(cache));
  EXPECT_TRUE(testing::all_close(o, std::vector<double>(d, 2.0), {1e-6, 1e-6}));  // (1+2+3)/3
}

TEST(MultiLevelCascade, BadInput) {
  const char* init = "MultiLevelCascadeAttentionWrapper.__init__";
  const char* plan = "MultiLevelCascadeAttentionWrapper.plan";
  const char* run = "MultiLevelCascadeAttentionWrapper.run";
  EXPECT_FI_ERROR(MultiLevelCascadeAttentionWrapper(0, workspace()), init, "num_levels");
  EXPECT_FI_ERROR(MultiLevelCascadeAttentionWrapper(2, workspace(), "XYZ"), init, "kv_layout");
  EXPECT_FI_ERROR(
      MultiLevelCascadeAttentionWrapper(2, workspace(), "NHD", true, std::vector<Tensor>{}), init,
      "qo_indptr_buf_arr");
  Tensor cache = Tensor::zeros({4, 2, 2, 1, 64}, DType::kFloat16);
  MultiLevelCascadeAttentionWrapper w(2, workspace());
  EXPECT_FI_ERROR(w.run(Tensor::zeros({3, 1, 64}, DType::kFloat16), PagedKVCache(cache)), run,
                  "self");
  const std::vector<Tensor> qo{int_tensor({0, 3}), int_tensor({0, 1, 3})};
  const std::vector<Tensor> ip{int_tensor({0, 1}), int_tensor({0, 1, 2})};
  const std::vector<Tensor> ix{int_tensor({0}), int_tensor({1, 2})};
  const std::vector<Tensor> ls{int_tensor({2}), int_tensor({1, 2})};
  auto call = [&](const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                  const std::vector<Tensor>& c, const std::vector<Tensor>& d, bool causal = false,
                  std::string_view pe = "NONE") { w.plan(a, b, c, d, 1, 1, 64, 2, causal, pe); };
  call(qo, ip, ix, ls);  // valid
  EXPECT_FI_ERROR(call({qo[0]}, ip, ix, ls), plan, "qo_indptr_arr");
  EXPECT_FI_ERROR(call(qo, {ip[0]}, ix, ls), plan, "paged_kv_indptr_arr");
  EXPECT_FI_ERROR(call(qo, ip, {ix[0], ix[1], ix[1]}, ls), plan, "paged_kv_indices_arr");
  EXPECT_FI_ERROR(call(qo, ip, ix, {ls[0]}), plan, "paged_kv_last_page_len");
  EXPECT_FI_ERROR(call({qo[0], int_tensor({0, 1, 2})}, ip, ix, ls), plan, "qo_indptr_arr");
  EXPECT_FI_ERROR(call(qo, ip, ix, {ls[0], int_tensor({1, 3})}), plan, "paged_kv_last_page_len");
  EXPECT_FI_ERROR(call(qo, ip, {ix[0], int_tensor({1, -1})}, ls), plan, "paged_kv_indices_arr");
  // Causal on the last level: request 0 has 1 query against 1 key, request 1 has 2 against 2.
  call(qo, ip, ix, ls, true);
  EXPECT_FI_ERROR(call({qo[0], int_tensor({0, 2, 3})}, ip, ix, ls, true), plan, "causal");
  EXPECT_FI_ERROR(call(qo, ip, ix, ls, false, "rope_llama"), plan, "pos_encoding_mode");
  EXPECT_FI_ERROR(w.plan(qo, ip, ix, ls, 1, 1, 64, 2, false, "NONE", false, std::nullopt, -1,
                         std::nullopt, std::nullopt, std::nullopt, DType::kInt32),
                  plan, "q_data_type");
  call(qo, ip, ix, ls);
  EXPECT_FI_ERROR(w.run(Tensor::zeros({2, 1, 64}, DType::kFloat16), PagedKVCache(cache)), run, "q");
  EXPECT_FI_ERROR(w.run(Tensor::zeros({3, 1, 64}, DType::kBFloat16), PagedKVCache(cache)), run,
                  "q");
  EXPECT_FI_ERROR(w.run(Tensor::zeros({3, 1, 64}, DType::kFloat16),
                        PagedKVCache(Tensor::zeros({2, 2, 2, 1, 64}, DType::kFloat16))),
                  run, "paged_kv_cache");
}

// ---- shared-prefix wrappers ------------------------------------------------------------------

struct SharedCase {
  DType q, kv;
  int64_t page_size, hq, hkv, d;
  bool hnd, pair;
};

// Shared prefix k/v [len, hkv, d] as doubles, and the tensors in the wrapper's layout.
struct Shared {
  Tensor k, v;
  std::vector<double> kd, vd;
};

Shared make_shared_kv(int64_t len, int64_t hkv, int64_t d, DType dtype, bool hnd, uint64_t seed) {
  Shared s;
  Tensor k = testing::rand_tensor({len, hkv, d}, dtype, seed);
  Tensor v = testing::rand_tensor({len, hkv, d}, dtype, seed + 1);
  s.kd = k.to_double_vector();
  s.vd = v.to_double_vector();
  s.k = hnd ? k.transpose(0, 1).contiguous() : k;
  s.v = hnd ? v.transpose(0, 1).contiguous() : v;
  return s;
}

TEST(SharedPrefixDecode, MatchesFp64FormulaOverGrid) {
  const SharedCase cases[] = {
      {DType::kFloat32, DType::kFloat32, 4, 4, 2, 64, false, false},
      {DType::kFloat16, DType::kFloat16, 1, 8, 8, 128, true, false},
      {DType::kBFloat16, DType::kBFloat16, 16, 4, 1, 64, false, true},
      {DType::kBFloat16, DType::kFloat8E4M3FN, 3, 4, 2, 64, true, true},
  };
  uint64_t seed = 300;
  for (const SharedCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << dtype_torch_name(c.q) << "/" << dtype_torch_name(c.kv)
                                      << " page " << c.page_size << (c.hnd ? " HND" : " NHD"));
    seed += 10;
    const std::vector<int32_t> lens{5, 0, 17, 1};
    std::vector<std::vector<double>> ku, vu;
    testing::PagedFixture f =
        testing::make_paged(lens, c.page_size, c.hkv, c.d, c.kv, c.hnd, c.pair, seed, ku, vu);
    Shared sh = make_shared_kv(11, c.hkv, c.d, c.kv, c.hnd, seed + 5);
    BatchDecodeWithSharedPrefixPagedKVCacheWrapper w(workspace(), c.hnd ? "HND" : "NHD");
    w.begin_forward(f.indptr, f.indices, f.last_page_len, c.hq, c.hkv, c.d, c.page_size, c.kv);
    Tensor q = testing::rand_tensor({4, c.hq, c.d}, c.q, seed + 9);
    Tensor o = w.forward(q, sh.k, sh.v, f.cache());
    w.end_forward();
    ASSERT_EQ(o.shape(), (Shape{4, c.hq, c.d}));
    const auto qd = q.to_double_vector();
    std::vector<double> expect;
    for (int b = 0; b < 4; ++b) {
      std::vector<double> oref, lref;
      testing::ref_attention(testing::rows_of(qd, b, b + 1, c.hq * c.d), concat({sh.kd, ku[b]}),
                             concat({sh.vd, vu[b]}), 1, 11 + lens[b], c.hq, c.hkv, c.d, c.d, {},
                             oref, lref);
      expect.insert(expect.end(), oref.begin(), oref.end());
    }
    testing::Tolerance tol = testing::attention_tolerance(c.q);
    tol.atol *= 2;
    tol.rtol *= 2;
    EXPECT_TRUE(testing::all_close(o, expect, tol));
  }
}

TEST(SharedPrefixPrefill, MatchesFp64FormulaOverGrid) {
  const SharedCase cases[] = {
      {DType::kFloat32, DType::kFloat32, 4, 4, 2, 64, false, false},
      {DType::kFloat16, DType::kFloat16, 1, 2, 2, 128, true, false},
      {DType::kBFloat16, DType::kBFloat16, 16, 4, 1, 64, false, true},
      {DType::kFloat16, DType::kFloat8E4M3FN, 3, 4, 2, 64, true, true},
  };
  uint64_t seed = 500;
  for (const SharedCase& c : cases) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << dtype_torch_name(c.q) << "/" << dtype_torch_name(c.kv) << " page "
                   << c.page_size << (c.hnd ? " HND" : " NHD") << (causal ? " causal" : ""));
      seed += 10;
      const std::vector<int32_t> lens{5, 2, 17, 3};
      const std::vector<int32_t> qo{3, 0, 6, 3};
      std::vector<int32_t> qo_indptr{0};
      for (int32_t n : qo) qo_indptr.push_back(qo_indptr.back() + n);
      std::vector<std::vector<double>> ku, vu;
      testing::PagedFixture f =
          testing::make_paged(lens, c.page_size, c.hkv, c.d, c.kv, c.hnd, c.pair, seed, ku, vu);
      Shared sh = make_shared_kv(9, c.hkv, c.d, c.kv, c.hnd, seed + 5);
      BatchPrefillWithSharedPrefixPagedKVCacheWrapper w(workspace(), c.hnd ? "HND" : "NHD");
      w.begin_forward(int_tensor(qo_indptr), f.indptr, f.indices, f.last_page_len, c.hq, c.hkv, c.d,
                      c.page_size);
      const int32_t total = qo_indptr.back();
      Tensor q = testing::rand_tensor({total, c.hq, c.d}, c.q, seed + 9);
      const double sm = 0.09;
      Tensor o = w.forward(q, sh.k, sh.v, f.cache(), causal, false, sm);
      w.end_forward();
      ASSERT_EQ(o.shape(), (Shape{total, c.hq, c.d}));
      const auto qd = q.to_double_vector();
      std::vector<double> expect;
      for (int b = 0; b < 4; ++b) {
        testing::RefOptions opt;
        opt.sm_scale = sm;
        opt.causal = causal;
        std::vector<double> oref, lref;
        testing::ref_attention(testing::rows_of(qd, qo_indptr[b], qo_indptr[b + 1], c.hq * c.d),
                               concat({sh.kd, ku[b]}), concat({sh.vd, vu[b]}), qo[b], 9 + lens[b],
                               c.hq, c.hkv, c.d, c.d, opt, oref, lref);
        expect.insert(expect.end(), oref.begin(), oref.end());
      }
      testing::Tolerance tol = testing::attention_tolerance(c.q);
      tol.atol *= 2;
      tol.rtol *= 2;
      EXPECT_TRUE(testing::all_close(o, expect, tol));
    }
  }
}

TEST(SharedPrefixWrappers, BadInput) {
  const char* dbegin = "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.begin_forward";
  const char* dfwd = "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.forward";
  const char* pbegin = "BatchPrefillWithSharedPrefixPagedKVCacheWrapper.begin_forward";
  const char* pfwd = "BatchPrefillWithSharedPrefixPagedKVCacheWrapper.forward";
  EXPECT_FI_ERROR(BatchDecodeWithSharedPrefixPagedKVCacheWrapper(workspace(), "ABC"),
                  "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.__init__", "kv_layout");
  EXPECT_FI_ERROR(BatchPrefillWithSharedPrefixPagedKVCacheWrapper(Tensor(), "NHD"),
                  "BatchPrefillWithSharedPrefixPagedKVCacheWrapper.__init__",
                  "float_workspace_buffer");
  Tensor cache = Tensor::zeros({3, 2, 2, 2, 64}, DType::kFloat16);
  Tensor ks = Tensor::zeros({5, 2, 64}, DType::kFloat16), vs = ks.clone();
  Tensor ip = int_tensor({0, 1, 3}), ix = int_tensor({0, 1, 2}), last = int_tensor({2, 1});

  BatchDecodeWithSharedPrefixPagedKVCacheWrapper d(workspace());
  Tensor qd = Tensor::zeros({2, 4, 64}, DType::kFloat16);
  EXPECT_FI_ERROR(d.forward(qd, ks, vs, PagedKVCache(cache)), dfwd, "self");
  EXPECT_FI_ERROR(d.begin_forward(ip, ix, int_tensor({2, 3}), 4, 2, 64, 2), dbegin,
                  "unique_kv_last_page_len");
  EXPECT_FI_ERROR(d.begin_forward(int_tensor({0, 2, 1}), ix, last, 4, 2, 64, 2), dbegin,
                  "unique_kv_indptr");
  EXPECT_FI_ERROR(d.begin_forward(ip, ix, last, 4, 3, 64, 2), dbegin, "num_kv_heads");
  EXPECT_FI_ERROR(d.begin_forward(ip, ix, last, 4, 2, 64, 2, DType::kInt8), dbegin, "data_type");
  d.begin_forward(ip, ix, last, 4, 2, 64, 2);
  d.forward(qd, ks, vs, PagedKVCache(cache));  // valid
  EXPECT_FI_ERROR(
      d.forward(qd, Tensor::zeros({5, 1, 64}, DType::kFloat16), vs, PagedKVCache(cache)), dfwd,
      "k_shared");
  EXPECT_FI_ERROR(
      d.forward(qd, ks, Tensor::zeros({4, 2, 64}, DType::kFloat16), PagedKVCache(cache)), dfwd,
      "v_shared");
  EXPECT_FI_ERROR(d.forward(qd, ks.to(DType::kBFloat16), vs, PagedKVCache(cache)), dfwd,
                  "k_shared");
  EXPECT_FI_ERROR(d.forward(qd, ks, vs, PagedKVCache(cache.to(DType::kBFloat16))), dfwd,
                  "unique_kv_cache");
  EXPECT_FI_ERROR(
      d.forward(Tensor::zeros({3, 4, 64}, DType::kFloat16), ks, vs, PagedKVCache(cache)), dfwd,
      "q");
  EXPECT_FI_ERROR(d.forward(qd.to(DType::kInt32), ks, vs, PagedKVCache(cache)), dfwd, "q");

  BatchPrefillWithSharedPrefixPagedKVCacheWrapper p(workspace());
  Tensor qp = Tensor::zeros({4, 4, 64}, DType::kFloat16);
  EXPECT_FI_ERROR(p.forward(qp, ks, vs, PagedKVCache(cache)), pfwd, "self");
  EXPECT_FI_ERROR(p.begin_forward(int_tensor({0, 2}), ip, ix, last, 4, 2, 64, 2), pbegin,
                  "qo_indptr");
  EXPECT_FI_ERROR(p.begin_forward(int_tensor({0, 2, 4}), ip, ix, last, 4, 2, 100, 2), pbegin,
                  "head_dim");
  EXPECT_FI_ERROR(p.begin_forward(int_tensor({0, 2, 4}), ip, int_tensor({0, 1}), last, 4, 2, 64, 2),
                  pbegin, "paged_kv_indices");
  p.begin_forward(int_tensor({0, 2, 4}), ip, ix, last, 4, 2, 64, 2);
  p.forward(qp, ks, vs, PagedKVCache(cache));  // valid
  // Request 1 has 2 queries but 3 unique keys, request 0 has 2 queries and 2 keys: causal ok.
  p.forward(qp, ks, vs, PagedKVCache(cache), true);
  p.begin_forward(int_tensor({0, 3, 4}), ip, ix, last, 4, 2, 64, 2);
  EXPECT_FI_ERROR(p.forward(qp, ks, vs, PagedKVCache(cache), true), pfwd, "causal");
  EXPECT_FI_ERROR(p.forward(qp, ks, vs, PagedKVCache(cache), false, false, NAN), pfwd, "sm_scale");
  EXPECT_FI_ERROR(
      p.forward(qp, Tensor::zeros({5, 2, 32}, DType::kFloat16), vs, PagedKVCache(cache)), pfwd,
      "k_shared");
}

// ---- record and replay -------------------------------------------------------------------------

TEST(CascadeWrappers, RecordAndReplay) {
  std::vector<std::vector<double>> k, v;
  testing::PagedFixture f =
      testing::make_paged({4, 6, 3}, 2, 2, 64, DType::kBFloat16, false, false, 77, k, v);
  Shared sh = make_shared_kv(5, 2, 64, DType::kBFloat16, false, 78);
  std::vector<testing::RecordingObserver::Call> calls;
  // The wrappers outlive the recording: replaying their methods addresses the live objects.
  std::unique_ptr<MultiLevelCascadeAttentionWrapper> m;
  std::unique_ptr<BatchDecodeWithSharedPrefixPagedKVCacheWrapper> d;
  std::unique_ptr<BatchPrefillWithSharedPrefixPagedKVCacheWrapper> p;
  {
    testing::RecordingScope scope;
    m = std::make_unique<MultiLevelCascadeAttentionWrapper>(2, workspace());
    m->plan({int_tensor({0, 4}), int_tensor({0, 2, 4})},
            {int_tensor({0, 2}), int_tensor({0, 3, 5})},
            {f.indices.slice(0, 0, 2), f.indices.slice(0, 2, 7)},
            {int_tensor({2}), int_tensor({2, 1})}, 4, 2, 64, 2, true, "NONE", false, 0.1, -1,
            std::nullopt, std::nullopt, std::nullopt, DType::kBFloat16);
    m->run(testing::rand_tensor({4, 4, 64}, DType::kBFloat16, 1), f.cache());
    d = std::make_unique<BatchDecodeWithSharedPrefixPagedKVCacheWrapper>(workspace());
    d->begin_forward(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 2, DType::kBFloat16);
    d->forward(testing::rand_tensor({3, 4, 64}, DType::kBFloat16, 2), sh.k, sh.v, f.cache());
    d->end_forward();
    p = std::make_unique<BatchPrefillWithSharedPrefixPagedKVCacheWrapper>(workspace());
    p->begin_forward(int_tensor({0, 2, 3, 6}), f.indptr, f.indices, f.last_page_len, 4, 2, 64, 2);
    p->forward(testing::rand_tensor({6, 4, 64}, DType::kBFloat16, 3), sh.k, sh.v, f.cache(), true,
               false, 0.12);
    p->end_forward();
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 11u);
  EXPECT_EQ(calls[0].name, "MultiLevelCascadeAttentionWrapper.__init__");
  EXPECT_EQ(calls[6].name, "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.end_forward");
  for (const auto& call : calls) {
    SCOPED_TRACE(call.name);
    if (call.name.ends_with("__init__")) continue;  // constructors: replayed by the dump test
    EXPECT_TRUE(testing::replays_identically(call));
  }
}

// Through the Flight Recorder's dump (upstream's format: metadata.jsonl, inputs.pt/outputs.pt,
// self_id for each wrapper) and replay_sequence: every call passes, the constructors rebuilding
// the objects the later calls address. The calls are written as upstream's tests make them.
TEST(CascadeWrappers, DumpReplaysWithEveryCallPassing) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("fi_cascade_wrap_dump_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg, [](const std::string&) {});
  {
    std::vector<std::vector<double>> k, v;
    testing::PagedFixture f =
        testing::make_paged({4, 6, 3}, 2, 2, 64, DType::kFloat16, true, false, 91, k, v);
    Shared sh = make_shared_kv(5, 2, 64, DType::kFloat16, true, 92);
    MultiLevelCascadeAttentionWrapper m(2, workspace(), "HND");
    m.plan({int_tensor({0, 4}), int_tensor({0, 2, 4})}, {int_tensor({0, 2}), int_tensor({0, 3, 5})},
           {f.indices.slice(0, 0, 2), f.indices.slice(0, 2, 7)},
           {int_tensor({2}), int_tensor({2, 1})}, 4, 2, 64, 2, true);
    m.run(testing::rand_tensor({4, 4, 64}, DType::kFloat16, 1), f.cache());
    BatchDecodeWithSharedPrefixPagedKVCacheWrapper d(workspace(), "HND");
    d.begin_forward(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 2);
    d.forward(testing::rand_tensor({3, 4, 64}, DType::kFloat16, 2), sh.k, sh.v, f.cache());
    d.end_forward();
    BatchPrefillWithSharedPrefixPagedKVCacheWrapper p(workspace(), "HND");
    p.begin_forward(int_tensor({0, 2, 3, 6}), f.indptr, f.indices, f.last_page_len, 4, 2, 64, 2);
    p.forward(testing::rand_tensor({6, 4, 64}, DType::kFloat16, 3), sh.k, sh.v, f.cache(), true);
    p.end_forward();
  }
  recorder::stop();
  testing::replay_expecting_every_call_to_pass(dir, 11u);
  fs::remove_all(dir);
}

// A dump written by Python as upstream's recorder writes it, for the calls upstream's cascade test
// makes (the level lists positional, causal by keyword, a 5-D NHD cache), the expected output
// computed by torch as upstream composes it (each level in fp32, rounded to fp16, merged), once
// more with pos_encoding_mode="ALIBI" (each level biased within its own requests): it replays
// here with every call passing.
TEST(CascadeWrappers, UpstreamWrittenMultiLevelDumpReplays) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("fi_cascade_upstream_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string py = R"PY(
import json, os, sys
try:
    import torch
except ImportError:
    sys.exit(77)
root = sys.argv[1]
torch.manual_seed(0)
HQ, HKV, D, PS = 4, 2, 64, 4
# Pages 0-1: the 6-token shared prefix; request 0's unique tokens in pages 2-3 (5 tokens),
# request 1's in page 4 (3 tokens). Queries: 2 for request 0, 1 for request 1.
cache = torch.randn(5, 2, PS, HKV, D).to(torch.float16)
q = torch.randn(3, HQ, D).to(torch.float16)
ws = torch.zeros(1 << 16, dtype=torch.uint8)
i32 = lambda v: torch.tensor(v, dtype=torch.int32)
levels = [
    (i32([0, 3]), i32([0, 2]), i32([0, 1]), i32([2])),
    (i32([0, 2, 3]), i32([0, 2, 3]), i32([2, 3, 4]), i32([1, 3])),
]
# Upstream's ALiBi slopes (get_alibi_slopes) for 4 heads: 2^-2, 2^-4, 2^-6, 2^-8.
SLOPES = torch.tensor([2.0 ** (-2 * (h + 1)) for h in range(HQ)])
def keys(pages, last):
    rows = [cache[p] for p in pages]
    kv = torch.cat(rows, 1)  # [2, tokens, HKV, D]
    n = (len(pages) - 1) * PS + last
    return kv[0, :n].float(), kv[1, :n].float()
def attend(qr, k, v, causal, alibi):
    g = HQ // HKV
    k = k.repeat_interleave(g, 1)
    v = v.repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", qr.float(), k) / D ** 0.5
    qo, kv = qr.shape[0], k.shape[0]
    if alibi:  # slope * (key index - query index within the level's request)
        s = s + SLOPES[:, None, None] * (torch.arange(kv)[None, :] - torch.arange(qo)[:, None])
    if causal:
        pos = torch.arange(qo)[:, None] + kv - qo
        s = s.masked_fill(torch.arange(kv)[None, :] > pos, float("-inf"))
    lse = torch.logsumexp(s, -1).T / torch.log(torch.tensor(2.0))  # base 2, [q, h]
    o = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v)
    return o.to(torch.float16), lse
def expected(alibi):
    outs = []
    for li, (qo, kvp, idx, last) in enumerate(levels):
        o = torch.empty(3, HQ, D, dtype=torch.float16)
        l = torch.empty(3, HQ)
        for b in range(len(qo) - 1):
            pages = idx[kvp[b]:kvp[b + 1]].tolist()
            k, v = keys(pages, int(last[b]))
            ob, lb = attend(q[qo[b]:qo[b + 1]], k, v, li == len(levels) - 1, alibi)
            o[qo[b]:qo[b + 1]] = ob
            l[qo[b]:qo[b + 1]] = lb
        outs.append((o, l))
    (o1, l1), (o0, l0) = outs[1], outs[0]
    m = torch.maximum(l0, l1)
    w0, w1 = torch.exp2(l0 - m), torch.exp2(l1 - m)
    return ((o0.float() * w0[..., None] + o1.float() * w1[..., None]) / (w0 + w1)[..., None]).to(torch.float16)
def tensor_meta(t, key):
    return {"type": "torch.Tensor", "shape": list(t.shape), "dtype": str(t.dtype),
            "stride": list(t.stride()), "device": "cpu", "requires_grad": False,
            "is_contiguous": True, "tensor_key": key}
def write(seq, sid, name, inputs, meta, outputs):
    d = os.path.join(root, "20261122_170000_%03d_pid777_%s_call%04d" % (seq, name, 1))
    os.makedirs(d)
    torch.save(inputs, d + "/inputs.pt")
    if outputs:
        torch.save(outputs, d + "/outputs.pt")
    rec = {"function_name": name, "module": "flashinfer.cascade", "call_sequence": 1,
           "timestamp": "20261122_170000_%03d" % seq, "process_id": 777,
           "input_metadata": meta, "output_metadata": {} if outputs else {"result": None},
           "tensor_info": {"input_tensor_keys": list(inputs), "output_tensor_keys": list(outputs)},
           "tensor_format": "torch", "execution_status": "completed", "self_id": sid}
    with open(d + "/metadata.jsonl", "w") as f:
        f.write(json.dumps(rec) + "\n")
# Two wrappers: pos_encoding_mode NONE (the default), then ALIBI by keyword (upstream plans
# every level with it).
for n, alibi in enumerate((False, True)):
    sid = 140000000000000 + n
    obj = {"type": "MultiLevelCascadeAttentionWrapper",
           "repr": "<flashinfer.cascade.MultiLevelCascadeAttentionWrapper object at 0x%x>" % sid}
    write(3 * n + 1, sid, "MultiLevelCascadeAttentionWrapper.__init__", {"arg_2": ws},
          {"arg_0": obj, "arg_1": 2, "arg_3": "NHD"}, {})
    inputs, meta = {}, {"arg_0": obj}
    for a, arr in enumerate(zip(*levels)):
        items = []
        for i, t in enumerate(arr):
            key = "arg_%d__%d" % (a + 1, i)
            inputs[key] = t
            items.append(tensor_meta(t, key))
        meta["arg_%d" % (a + 1)] = {"type": "list", "length": len(items), "items": items,
                                    "truncated": False}
    meta.update({"arg_5": HQ, "arg_6": HKV, "arg_7": D, "arg_8": PS, "kwarg_causal": True})
    if alibi:
        meta["kwarg_pos_encoding_mode"] = "ALIBI"
    write(3 * n + 2, sid, "MultiLevelCascadeAttentionWrapper.plan", inputs, meta, {})
    write(3 * n + 3, sid, "MultiLevelCascadeAttentionWrapper.run", {"arg_1": q, "arg_2": cache},
          {"arg_0": obj}, {"result": expected(alibi)})
)PY";
  const fs::path calls = dir / "calls";
  fs::create_directories(calls);
  std::vector<replay::Result> results;
  if (!testing::run_dump_script(dir, py, calls, 6u, &results)) {
    GTEST_SKIP() << "python3-torch not installed";
  }
  ASSERT_EQ(results.size(), 6u);
  for (const auto& r : results) {
    for (const auto& c : r.comparisons) {
      EXPECT_TRUE(c.match) << c.key << " " << c.problem << " " << c.mismatches << "/" << c.numel
                           << " max abs " << c.max_abs_error;
    }
  }
  EXPECT_EQ(results[2].comparisons.size(), 1u);
}

}  // namespace
}  // namespace flashinfer
