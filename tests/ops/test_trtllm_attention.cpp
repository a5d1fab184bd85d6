// Block-table attention (trtllm_batch_decode_with_kv_cache, trtllm_batch_context_with_kv_cache)
// against an fp64 formula over a grid of dtypes, layouts, cache forms, sinks and scales; a
// hand-checked golden; NaN propagation; bad input; record and replay.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>

#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"
#include "util/upstream_dump_writer.h"
#if FLASHINFER_TEST_HAVE_CUDART
#include "util/cuda_graph_util.h"
#endif

namespace flashinfer {
namespace {

using testing::int_tensor;

constexpr const char* kDecode = "trtllm_batch_decode_with_kv_cache";
constexpr const char* kContext = "trtllm_batch_context_with_kv_cache";

Tensor workspace() { return Tensor::zeros({1 << 16}, DType::kUInt8); }

// A block-table cache: `pages` pages of K and V (HND or NHD, 5-D or pair), a table whose rows
// list each request's pages in a shuffled order, padded with -1 past the blocks a request needs
// (those entries must never be read).
struct BlockCache {
  Tensor k, v;    // [pages, Hkv, P, D] (HND) or [pages, P, Hkv, D] (NHD): the views passed
  Tensor cache5;  // the 5-D form when !pair
  bool pair = true;
  bool hnd = true;
  Tensor block_tables, seq_lens;
  std::vector<std::vector<int32_t>> table;
  int64_t page_size = 0;
  PagedKVCache cache() const { return pair ? PagedKVCache(k, v) : PagedKVCache(cache5); }
  // K or V of token t of request b, head g, as doubles.
  std::vector<double> row(bool is_v, int64_t b, int64_t t, int64_t g) const {
    const Tensor& c = is_v ? v : k;
    const int64_t page = table[b][t / page_size];
    const Tensor pg = c.select(0, page);
    return hnd ? pg.select(0, g).select(0, t % page_size).to_double_vector()
               : pg.select(0, t % page_size).select(0, g).to_double_vector();
  }
};

BlockCache make_cache(const std::vector<int32_t>& lens, int64_t page_size, int64_t hkv, int64_t d,
                      DType dtype, bool hnd, bool pair, uint64_t seed) {
  BlockCache c;
  c.page_size = page_size;
  c.hnd = hnd;
  c.pair = pair;
  int64_t need = 0, max_blocks = 1;
  for (int32_t len : lens) {
    const int64_t n = (len + page_size - 1) / page_size;
    need += n;
    max_blocks = std::max(max_blocks, n + 1);
  }
  const int64_t pages = need + 3;
  std::vector<int32_t> perm(static_cast<std::size_t>(pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> flat;
  std::size_t next = 0;
  for (int32_t len : lens) {
    const int64_t n = (len + page_size - 1) / page_size;
    std::vector<int32_t> r;
    for (int64_t i = 0; i < n; ++i) r.push_back(perm[next++]);
    c.table.push_back(r);
    for (int64_t i = 0; i < max_blocks; ++i) flat.push_back(i < n ? r[i] : -1);
  }
  c.block_tables = int_tensor(flat).view({static_cast<int64_t>(lens.size()), max_blocks});
  c.seq_lens = int_tensor(lens);
  const Shape inner = hnd ? Shape{hkv, page_size, d} : Shape{page_size, hkv, d};
  if (pair) {
    Shape s{pages};
    s.insert(s.end(), inner.begin(), inner.end());
    c.k = testing::rand_tensor(s, dtype, seed + 1, -1.0, 1.0);
    c.v = testing::rand_tensor(s, dtype, seed + 2, -1.0, 1.0);
  } else {
    Shape s{pages, 2};
    s.insert(s.end(), inner.begin(), inner.end());
    c.cache5 = testing::rand_tensor(s, dtype, seed + 3, -1.0, 1.0);
    c.k = c.cache5.select(1, 0);
    c.v = c.cache5.select(1, 1);
  }
  return c;
}

struct Ref {
  double bmm1 = 1.0, bmm2 = 1.0;
  bool causal = true;
  int64_t window_left = -1;
  std::vector<double> sinks;  // empty: none
  // A key mask on top (upstream 0.7.4's windows): whether request b's query i sees key j.
  std::function<bool(std::size_t b, int64_t i, int64_t j)> visible;
};

// fp64: o[row, h] = sum_j softmax_j(bmm1 * q.k_j) v_j * bmm2, the sink exp(sinks[h]) in the
// denominator; lse base 2 over the same denominator.
void reference(const Tensor& query, const BlockCache& c, const std::vector<int32_t>& qo_indptr,
               const Ref& r, std::vector<double>& o, std::vector<double>& lse) {
  const int64_t rows = query.size(0), hq = query.size(1), d = query.size(2);
  const int64_t hkv = c.hnd ? c.k.size(1) : c.k.size(2);
  const int64_t group = hq / hkv;
  const std::vector<double> q = query.to_double_vector();
  const std::vector<int32_t> lens = [&] {
    std::vector<int32_t> l;
    for (double x : c.seq_lens.to_double_vector()) l.push_back(static_cast<int32_t>(x));
    return l;
  }();
  o.assign(static_cast<std::size_t>(rows * hq * d), 0.0);
  lse.assign(static_cast<std::size_t>(rows * hq), -std::numeric_limits<double>::infinity());
  for (std::size_t b = 0; b + 1 < qo_indptr.size(); ++b) {
    const int64_t qo = qo_indptr[b + 1] - qo_indptr[b], kv = lens[b];
    for (int64_t i = 0; i < qo; ++i) {
      const int64_t row = qo_indptr[b] + i, pos = kv - qo + i;
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t g = h / group;
        std::vector<double> s, w;
        std::vector<std::vector<double>> vs;
        double mx = r.sinks.empty() ? -INFINITY : r.sinks[h];
        for (int64_t j = 0; j < kv; ++j) {
          if (r.causal && j > pos) continue;
          if (r.window_left >= 0 && j < pos - r.window_left) continue;
          if (r.visible && !r.visible(b, i, j)) continue;
          const std::vector<double> kr = c.row(false, b, j, g);
          double dot = 0;
          for (int64_t x = 0; x < d; ++x) dot += q[(row * hq + h) * d + x] * kr[x];
          s.push_back(dot * r.bmm1);
          vs.push_back(c.row(true, b, j, g));
          mx = std::max(mx, s.back());
        }
        if (mx == -INFINITY) continue;
        double sum = r.sinks.empty() ? 0.0 : std::exp(r.sinks[h] - mx);
        for (double x : s) sum += std::exp(x - mx);
        for (std::size_t j = 0; j < s.size(); ++j) {
          const double p = std::exp(s[j] - mx) / sum;
          for (int64_t x = 0; x < d; ++x) o[(row * hq + h) * d + x] += p * vs[j][x] * r.bmm2;
        }
        lse[row * hq + h] = (mx + std::log(sum)) / std::log(2.0);
      }
    }
  }
}

struct DecodeCase {
  DType q, kv;
  int64_t hq, hkv, d, page_size, q_len;
  bool hnd, pair, sinks;
  int64_t window;
};

class TrtllmDecode : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(TrtllmDecode, MatchesFp64) {
  const DecodeCase t = GetParam();
  const std::vector<int32_t> lens{7, 1 + static_cast<int32_t>(t.q_len) + 30, 16, 45};
  BlockCache c = make_cache(lens, t.page_size, t.hkv, t.d, t.kv, t.hnd, t.pair, 11);
  const int64_t batch = static_cast<int64_t>(lens.size());
  // q_len must not exceed any request's length (7).
  Tensor q = testing::rand_tensor({batch * t.q_len, t.hq, t.d}, t.q, 5, -1.0, 1.0);
  Ref r;
  r.bmm1 = (dtype_is_fp8(t.kv) ? 0.75 : 1.0) / std::sqrt(double(t.d));
  r.bmm2 = dtype_is_fp8(t.kv) ? 1.5 : 0.5;
  r.window_left = t.window;
  std::optional<Tensor> sinks;
  if (t.sinks) {
    Tensor st = testing::rand_tensor({t.hq}, DType::kFloat32, 9, -1.0, 3.0);
    r.sinks = st.to_double_vector();
    sinks = st;
  }
  std::vector<int32_t> qo{0};
  for (int64_t b = 0; b < batch; ++b) qo.push_back(static_cast<int32_t>((b + 1) * t.q_len));
  std::vector<double> eo, el;
  reference(q, c, qo, r, eo, el);
  AttentionOutput out = trtllm_batch_decode_with_kv_cache(
      q, c.cache(), workspace(), c.block_tables, c.seq_lens, 64, r.bmm1, r.bmm2, t.window,
      std::nullopt, std::nullopt, std::nullopt, std::nullopt, sinks, t.hnd ? "HND" : "NHD",
      std::nullopt, "auto", t.q_len, 1.0, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
      std::nullopt, true, std::nullopt, /*return_lse=*/true);
  ASSERT_EQ(out.out.shape(), q.shape());
  ASSERT_EQ(out.out.dtype(), t.q);
  EXPECT_TRUE(testing::all_close(out.out, eo, testing::attention_tolerance(t.q)));
  EXPECT_TRUE(testing::all_close(out.lse, el, {1e-4, 1e-5}));
}

INSTANTIATE_TEST_SUITE_P(
    Grid, TrtllmDecode,
    ::testing::Values(
        DecodeCase{DType::kFloat16, DType::kFloat16, 4, 2, 64, 16, 1, true, true, false, -1},
        DecodeCase{DType::kBFloat16, DType::kBFloat16, 8, 2, 128, 8, 1, false, false, true, -1},
        DecodeCase{DType::kBFloat16, DType::kFloat8E4M3FN, 4, 1, 64, 4, 1, true, false, true, 5},
        DecodeCase{DType::kFloat16, DType::kFloat8E4M3FN, 2, 2, 64, 16, 3, false, true, true, -1},
        DecodeCase{DType::kFloat16, DType::kFloat16, 4, 4, 256, 5, 3, true, true, true, 9},
        DecodeCase{DType::kBFloat16, DType::kBFloat16, 6, 3, 64, 1, 2, false, false, false, 3}));

struct ContextCase {
  DType q, kv;
  int64_t hq, hkv, d, page_size;
  bool hnd, pair, sinks, causal;
  int64_t window;
};

class TrtllmContext : public ::testing::TestWithParam<ContextCase> {};

TEST_P(TrtllmContext, MatchesFp64) {
  const ContextCase t = GetParam();
  const std::vector<int32_t> lens{9, 33, 1, 20};
  const std::vector<int32_t> qlens{9, 5, 1, 12};
  BlockCache c = make_cache(lens, t.page_size, t.hkv, t.d, t.kv, t.hnd, t.pair, 21);
  std::vector<int32_t> cq{0}, ck{0};
  for (std::size_t b = 0; b < lens.size(); ++b) {
    cq.push_back(cq.back() + qlens[b]);
    ck.push_back(ck.back() + lens[b]);
  }
  Tensor q = testing::rand_tensor({cq.back(), t.hq, t.d}, t.q, 6, -1.0, 1.0);
  Ref r;
  r.bmm1 = 0.9 / std::sqrt(double(t.d));
  r.bmm2 = 1.25;
  r.causal = t.causal;
  r.window_left = t.window;
  std::optional<Tensor> sinks;
  if (t.sinks) {
    Tensor st = testing::rand_tensor({t.hq}, DType::kFloat32, 10, -2.0, 2.0);
    r.sinks = st.to_double_vector();
    sinks = st;
  }
  std::vector<double> eo, el;
  reference(q, c, cq, r, eo, el);
  // bmm2_scale as a one-element tensor (upstream accepts a float or an fp32 tensor).
  Tensor bmm2 = Tensor::full({1}, r.bmm2, DType::kFloat32);
  AttentionOutput out = trtllm_batch_context_with_kv_cache(
      q, c.cache(), workspace(), c.block_tables, c.seq_lens, 12, 40, r.bmm1, bmm2, 4,
      int_tensor(cq), int_tensor(ck), t.window, std::nullopt, std::nullopt, std::nullopt,
      std::nullopt, t.hnd ? "HND" : "NHD", std::nullopt, sinks, std::nullopt, std::nullopt, true,
      t.causal, std::nullopt, /*return_lse=*/true);
  ASSERT_EQ(out.out.shape(), q.shape());
  EXPECT_TRUE(testing::all_close(out.out, eo, testing::attention_tolerance(t.q)));
  EXPECT_TRUE(testing::all_close(out.lse, el, {1e-4, 1e-5}));
}

INSTANTIATE_TEST_SUITE_P(Grid, TrtllmContext,
                         ::testing::Values(ContextCase{DType::kFloat16, DType::kFloat16, 4, 2, 64,
                                                       16, true, true, false, true, -1},
                                           ContextCase{DType::kBFloat16, DType::kBFloat16, 4, 1,
                                                       128, 8, false, false, true, true, 4},
                                           ContextCase{DType::kBFloat16, DType::kFloat8E4M3FN, 2, 2,
                                                       64, 4, true, false, true, false, -1},
                                           ContextCase{DType::kFloat16, DType::kFloat8E4M3FN, 8, 4,
                                                       64, 3, false, true, true, true, -1}));

// Upstream 0.7.4's windows of the trtllm context call (keys of query position p = kv_len -
// qo_len + i): window_right R with causal=False keeps [p - W, p + R]; variable windows keep
// [starts[t], ends[t]] of packed row t whatever `causal` says. Both against the fp64 formula,
// then upstream's refusals with its texts.
TEST(TrtllmContext, Upstream074WindowsMatchFp64) {
  const std::vector<int32_t> lens{9, 33, 1, 20}, qlens{9, 5, 1, 12};
  BlockCache c = make_cache(lens, 4, 2, 64, DType::kBFloat16, true, true, 23);
  std::vector<int32_t> cq{0}, ck{0};
  for (std::size_t b = 0; b < lens.size(); ++b) {
    cq.push_back(cq.back() + qlens[b]);
    ck.push_back(ck.back() + lens[b]);
  }
  Tensor q = testing::rand_tensor({cq.back(), 4, 64}, DType::kBFloat16, 24, -1.0, 1.0);
  const Tensor sinks = testing::rand_tensor({4}, DType::kFloat32, 25, -1.0, 1.0);
  auto run = [&](bool causal, int64_t wl, int64_t wr, std::optional<Tensor> st,
                 std::optional<Tensor> en, std::string_view backend = "trtllm-gen") {
    return trtllm_batch_context_with_kv_cache(
        q, c.cache(), workspace(), c.block_tables, c.seq_lens, 12, 40, 0.125, 1.0, 4,
        int_tensor(cq), int_tensor(ck), wl, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
        "HND", std::nullopt, sinks, std::nullopt, std::nullopt, true, causal, std::nullopt, true,
        std::nullopt, std::nullopt, std::nullopt, backend, wr, st, en);
  };
  Ref r;
  r.bmm1 = 0.125;
  r.causal = false;
  r.sinks = sinks.to_double_vector();
  // Two-sided: W = 3, R = 2.
  r.visible = [&](std::size_t b, int64_t i, int64_t j) {
    const int64_t p = lens[b] - qlens[b] + i;
    return j >= p - 3 && j <= p + 2;
  };
  std::vector<double> eo, el;
  reference(q, c, cq, r, eo, el);
  AttentionOutput two = run(false, 3, 2, std::nullopt, std::nullopt);
  EXPECT_TRUE(testing::all_close(two.out, eo, testing::attention_tolerance(DType::kBFloat16)));
  EXPECT_TRUE(testing::all_close(two.lse, el, {1e-4, 1e-5}));
  // Variable windows: row t keeps [starts[t], ends[t]] (absolute key positions of its request).
  // Nondecreasing within a request, as upstream's contract asks.
  std::vector<int32_t> st, en;
  for (std::size_t b = 0; b < lens.size(); ++b) {
    for (int64_t i = 0; i < qlens[b]; ++i) {
      st.push_back(std::min<int32_t>(lens[b] - 1, static_cast<int32_t>(i / 2)));
      en.push_back(std::min<int32_t>(lens[b] - 1, static_cast<int32_t>(i + 1)));
    }
  }
  r.visible = [&](std::size_t b, int64_t i, int64_t j) {
    const auto t = static_cast<std::size_t>(cq[b] + i);
    return j >= st[t] && j <= en[t];
  };
  reference(q, c, cq, r, eo, el);
  for (bool causal : {true, false}) {  // causal is ignored
    AttentionOutput var = run(causal, -1, -1, int_tensor(st), int_tensor(en));
    EXPECT_TRUE(testing::all_close(var.out, eo, testing::attention_tolerance(DType::kBFloat16)));
    EXPECT_TRUE(testing::all_close(var.lse, el, {1e-4, 1e-5}));
  }
  const char* op = "trtllm_batch_context_with_kv_cache";
  testing::expect_error_text([&] { (void)run(true, -1, -1, std::nullopt, std::nullopt, "xqa"); },
                             op, "backend", "backend must be 'trtllm-gen' or 'cake'");
  testing::expect_error_text([&] { (void)run(true, 3, 2, std::nullopt, std::nullopt); }, op,
                             "window_right",
                             "causal attention requires window_right to be -1 or 0");
  testing::expect_error_text([&] { (void)run(false, 3, -1, std::nullopt, std::nullopt); }, op,
                             "window_right",
                             "non-causal fixed-window attention requires window_right >= 0");
  testing::expect_error_text([&] { (void)run(false, -1, 2, std::nullopt, std::nullopt); }, op,
                             "window_right", "right-only non-causal windows are unsupported");
  testing::expect_error_text([&] { (void)run(true, -2, -1, std::nullopt, std::nullopt); }, op,
                             "window_left", "window_left and window_right must be at least -1");
  testing::expect_error_text([&] { (void)run(true, -1, -1, int_tensor(st), std::nullopt); }, op,
                             "variable_window_token_ends", "must be provided together");
  testing::expect_error_text([&] { (void)run(true, 4, -1, int_tensor(st), int_tensor(en)); }, op,
                             "window_left",
                             "variable windows cannot be combined with fixed window bounds");
  testing::expect_error_text(
      [&] {
        (void)run(true, -1, -1, int_tensor({0, 1}), int_tensor({0, 1}));
      },
      op, "variable_window_token_starts", "Invalid shape of variable_window_token_starts");
  // Causal with window_right 0 is the causal window; "cake" is refused here.
  AttentionOutput zero = run(true, 3, 0, std::nullopt, std::nullopt);
  AttentionOutput none = run(true, 3, -1, std::nullopt, std::nullopt);
  EXPECT_EQ(testing::bytes_of(zero.out), testing::bytes_of(none.out));
  EXPECT_FI_ERROR_CODE((void)run(true, -1, -1, std::nullopt, std::nullopt, "cake"), op, "backend",
                       ErrorCode::kUnsupported);
}

// Upstream 0.7.4's token-sparse decode (sparse_top_k = k): request b's one query attends K row
// block_tables[b, 0, j] and V row block_tables[b, 1, j] (one-token pages of the one KV head) for
// j < seq_lens[b], with no positional mask: against the fp64 softmax over those rows; then
// upstream's refusals.
TEST(TrtllmDecode, SparseTopKAttendsTheListedRows) {
  const int64_t B = 3, hq = 4, d = 64, pages = 40, k = 8;
  const Tensor kc = testing::rand_tensor({pages, 1, 1, d}, DType::kBFloat16, 31, -1.0, 1.0);
  const Tensor vc = testing::rand_tensor({pages, 1, 1, d}, DType::kBFloat16, 32, -1.0, 1.0);
  const Tensor q = testing::rand_tensor({B, hq, d}, DType::kBFloat16, 33, -1.0, 1.0);
  const std::vector<int32_t> lens{8, 3, 5};
  std::vector<int32_t> idx;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t kv = 0; kv < 2; ++kv) {
      for (int64_t j = 0; j < k; ++j)
        idx.push_back(static_cast<int32_t>((b * 7 + j * 5 + kv * 11) % pages));
    }
  }
  const Tensor table = int_tensor(idx).view({B, 2, k});
  const double bmm1 = 0.2;
  auto run = [&](int64_t top_k, const Tensor& bt, std::optional<int64_t> q_len, int64_t window,
                 bool shared, std::optional<PagedKVCache> cache = std::nullopt) {
    return trtllm_batch_decode_with_kv_cache(
        q, cache.value_or(PagedKVCache(kc, vc)), workspace(), bt, int_tensor(lens), 64, bmm1, 1.0,
        window, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, "HND",
        std::nullopt, "auto", q_len, 1.0, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
        std::nullopt, shared, std::nullopt, true, std::nullopt, std::nullopt, false, 1, 0,
        std::nullopt, std::nullopt, std::nullopt, std::nullopt, top_k);
  };
  AttentionOutput out = run(k, table, 1, -1, false);
  const auto qv = q.to_double_vector(), kv = kc.to_double_vector(), vv = vc.to_double_vector();
  std::vector<double> eo(static_cast<std::size_t>(B * hq * d), 0.0), el;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < hq; ++h) {
      std::vector<double> s;
      for (int64_t j = 0; j < lens[b]; ++j) {
        const int64_t row = idx[(b * 2) * k + j];
        double dot = 0;
        for (int64_t x = 0; x < d; ++x) dot += qv[(b * hq + h) * d + x] * kv[row * d + x];
        s.push_back(dot * bmm1);
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double x : s) sum += std::exp(x - mx);
      for (int64_t j = 0; j < lens[b]; ++j) {
        const int64_t row = idx[(b * 2 + 1) * k + j];
        for (int64_t x = 0; x < d; ++x) {
          eo[(b * hq + h) * d + x] += std::exp(s[j] - mx) / sum * vv[row * d + x];
        }
      }
      el.push_back((mx + std::log(sum)) / std::log(2.0));
    }
  }
  EXPECT_TRUE(testing::all_close(out.out, eo, testing::attention_tolerance(DType::kBFloat16)));
  EXPECT_TRUE(testing::all_close(out.lse, el, {1e-4, 1e-5}));
  const char* op = "trtllm_batch_decode_with_kv_cache";
  testing::expect_error_text([&] { (void)run(k, table, 2, -1, false); }, op, nullptr,
                             "sparse_top_k requires one query token per request");
  testing::expect_error_text([&] { (void)run(k, table, 1, 4, false); }, op, nullptr,
                             "sparse_top_k supports neither a sliding window nor attention sinks");
  testing::expect_error_text(
      [&] { (void)run(k, table, 1, -1, true); }, op, nullptr,
      "sparse_top_k requires uses_shared_paged_kv_idx=False, block_tables of shape "
      "[batch_size, 2, 8] and batch_size seq_lens, got (3, 2, 8) and (3,)");
  testing::expect_error_text([&] { (void)run(6, table.slice(2, 0, 6).contiguous(), 1, -1, false); },
                             op, nullptr, "sparse_top_k must be a multiple of 4");
  // An NVFP4 cache's block scales are not gathered with its rows: refused.
  const Tensor u8 = Tensor::zeros({pages, 1, 1, d / 2}, DType::kUInt8);
  EXPECT_FI_ERROR_CODE((void)run(k, table, 1, -1, false, PagedKVCache(u8, u8)), op, "kv_cache_sf",
                       ErrorCode::kUnsupported);
}

// Upstream 0.7.4's context-parallel speculative decode (causal_seqlens_kv_global S, cp_world W,
// cp_rank r): the cache holds this rank's keys (global position l W + r); query row j of a
// request sees local keys l < max(0, floor((S + j - r) / W) + 1); seq_lens masks nothing. The
// rank-local output and base-2 LSE against the fp64 formula; then upstream's refusals.
TEST(TrtllmDecode, ContextParallelRowsSeeTheirRanksKeys) {
  const std::vector<int32_t> lens{12, 20, 9};  // local keys held
  const int64_t B = 3, q_len = 3, W = 2, r = 1;
  BlockCache c = make_cache(lens, 4, 2, 64, DType::kBFloat16, true, true, 41);
  const Tensor q = testing::rand_tensor({B * q_len, 4, 64}, DType::kBFloat16, 42, -1.0, 1.0);
  const std::vector<int32_t> S{17, 30, 0};
  auto n = [&](std::size_t b, int64_t j) {
    const int64_t delta = S[b] + j - r;
    return delta >= 0 ? delta / W + 1 : int64_t{0};
  };
  Ref ref;
  ref.bmm1 = 0.125;
  ref.causal = false;
  ref.visible = [&](std::size_t b, int64_t i, int64_t j) { return j < n(b, i); };
  std::vector<int32_t> qo{0, 3, 6, 9};
  std::vector<double> eo, el;
  reference(q, c, qo, ref, eo, el);
  auto run = [&](int64_t world, int64_t rank, std::optional<Tensor> global, bool ret,
                 std::string_view layout = "HND") {
    return trtllm_batch_decode_with_kv_cache(
        q, c.cache(), workspace(), c.block_tables, c.seq_lens, 32, 0.125, 1.0, -1, std::nullopt,
        std::nullopt, std::nullopt, std::nullopt, std::nullopt, layout, std::nullopt, "auto", q_len,
        1.0, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, true,
        std::nullopt, ret, std::nullopt, std::nullopt, false, world, rank, global);
  };
  AttentionOutput out = run(W, r, int_tensor(S), true);
  EXPECT_TRUE(testing::all_close(out.out, eo, testing::attention_tolerance(DType::kBFloat16)));
  EXPECT_TRUE(testing::all_close(out.lse, el, {1e-4, 1e-5}));
  // Request 2 (S = 0) at rank 1: its first row sees no key (output 0, LSE -inf).
  EXPECT_EQ(out.lse.to_double_vector()[6 * 4], -std::numeric_limits<double>::infinity());
  const char* op = "trtllm_batch_decode_with_kv_cache";
  testing::expect_error_text([&] { (void)run(W, 0, std::nullopt, true); }, op, nullptr,
                             "cp_world/cp_rank require causal_seqlens_kv_global");
  testing::expect_error_text(
      [&] { (void)run(W, r, int_tensor(S), false); }, op, nullptr,
      "DCP speculative decode requires return_lse=True or a caller-owned lse buffer");
  testing::expect_error_text([&] { (void)run(W, r, int_tensor(S), true, "NHD"); }, op, nullptr,
                             "DCP speculative decode currently requires kv_layout='HND'");
  testing::expect_error_text([&] { (void)run(3, 1, int_tensor(S), true); }, op, nullptr,
                             "cp_world must be one of (1, 2, 4, 8)");
  testing::expect_error_text([&] { (void)run(W, 2, int_tensor(S), true); }, op, nullptr,
                             "cp_rank must be in [0, 2), got 2");
}

// An fp8 query, as SGLang's trtllm backend passes it with an fp8 KV cache (q.to(float8_e4m3fn),
// out_dtype the model's dtype): the same numbers, bit for bit, as the query widened to that
// dtype (which holds every e4m3 value), for decode (uniform and speculative counts) and context;
// without a 16-bit out_dtype or out the output would be fp8: refused by name.
TEST(TrtllmFp8Query, SameBitsAsTheWidenedQuery) {
  const std::vector<int32_t> lens{9, 33, 2, 20};
  BlockCache c = make_cache(lens, 16, 2, 64, DType::kFloat8E4M3FN, true, true, 31);
  const Tensor q8 =
      testing::rand_tensor({8, 8, 64}, DType::kBFloat16, 32, -2.0, 2.0).to(DType::kFloat8E4M3FN);
  for (DType od : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(dtype_torch_name(od));
    const Tensor qw = q8.to(od);
    for (int64_t qlen : {1, 2}) {
      const Tensor q8s = q8.slice(0, 0, 4 * qlen), qws = qw.slice(0, 0, 4 * qlen);
      auto decode = [&](const Tensor& q) {
        return trtllm_batch_decode_with_kv_cache(
            q, c.cache(), workspace(), c.block_tables, c.seq_lens, 64, 0.125, 0.5, -1, std::nullopt,
            od, std::nullopt, std::nullopt, std::nullopt, "HND", std::nullopt, "auto", qlen,
            std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
            true, std::nullopt, true);
      };
      const AttentionOutput a = decode(q8s), b = decode(qws);
      ASSERT_EQ(a.out.dtype(), od);
      EXPECT_TRUE(testing::all_close(a.out, b.out.to_double_vector(), {0.0, 0.0}));
      EXPECT_TRUE(testing::all_close(a.lse, b.lse.to_double_vector(), {0.0, 0.0}));
    }
    const std::vector<int32_t> cq{0, 3, 5, 6, 8}, ck{0, 9, 42, 44, 64};
    auto context = [&](const Tensor& q) {
      return trtllm_batch_context_with_kv_cache(q, c.cache(), workspace(), c.block_tables,
                                                c.seq_lens, 3, 40, 0.125, 0.5, 4, int_tensor(cq),
                                                int_tensor(ck), -1, std::nullopt, od);
    };
    EXPECT_TRUE(
        testing::all_close(context(q8).out, context(qw).out.to_double_vector(), {0.0, 0.0}));
  }
  // Without a 16-bit out_dtype the output is fp8 too, as upstream's (the query's dtype): the
  // fp32 result rounded once with saturation, so within e4m3's step of the bf16 output, and a
  // large bmm2_scale saturates at +-448 rather than overflowing to NaN. An fp8 `out` the same.
  auto fp8_decode = [&](double bmm2, std::optional<DType> od, std::optional<Tensor> out) {
    return trtllm_batch_decode_with_kv_cache(q8.slice(0, 0, 4), c.cache(), workspace(),
                                             c.block_tables, c.seq_lens, 64, 0.125, bmm2, -1, out,
                                             od)
        .out;
  };
  const Tensor o8 = fp8_decode(0.5, std::nullopt, std::nullopt);
  ASSERT_EQ(o8.dtype(), DType::kFloat8E4M3FN);
  EXPECT_TRUE(testing::all_close(
      o8, fp8_decode(0.5, DType::kBFloat16, std::nullopt).to_double_vector(), {1e-2, 0.07}));
  Tensor given = Tensor::zeros(o8.shape(), DType::kFloat8E4M3FN);
  EXPECT_EQ(fp8_decode(0.5, std::nullopt, given).data_ptr(), given.data_ptr());
  EXPECT_TRUE(testing::all_close(given, o8.to_double_vector(), {0.0, 0.0}));
  const std::vector<double> big = fp8_decode(4000.0, std::nullopt, std::nullopt).to_double_vector();
  const std::vector<double> ref =
      fp8_decode(4000.0, DType::kBFloat16, std::nullopt).to_double_vector();
  int saturated = 0;
  for (std::size_t i = 0; i < big.size(); ++i) {
    ASSERT_FALSE(std::isnan(big[i]));
    if (std::fabs(ref[i]) > 464.0) {
      EXPECT_EQ(std::fabs(big[i]), 448.0) << i;
      ++saturated;
    }
  }
  EXPECT_GT(saturated, 10);
}

// The same on CUDA (the device plan, the query widened on the device): the CPU's answer.
TEST(TrtllmFp8QueryCuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const std::vector<int32_t> lens{90, 330, 1, 200};
  BlockCache c = make_cache(lens, 16, 2, 128, DType::kFloat8E4M3FN, true, true, 33);
  const Tensor q8 =
      testing::rand_tensor({8, 16, 128}, DType::kBFloat16, 34, -2.0, 2.0).to(DType::kFloat8E4M3FN);
  const PagedKVCache gc(c.k.to(g), c.v.to(g));
  for (int64_t qlen : {1, 2}) {
    SCOPED_TRACE(qlen);
    const Tensor qs = q8.slice(0, 0, 4 * qlen);
    const AttentionOutput want = trtllm_batch_decode_with_kv_cache(
        qs, c.cache(), workspace(), c.block_tables, c.seq_lens, 512, 0.09, 1.0, -1, std::nullopt,
        DType::kBFloat16, std::nullopt, std::nullopt, std::nullopt, "HND", std::nullopt, "auto",
        qlen);
    const AttentionOutput got = trtllm_batch_decode_with_kv_cache(
        qs.to(g), gc, workspace().to(g), c.block_tables.to(g), c.seq_lens.to(g), 512, 0.09, 1.0, -1,
        std::nullopt, DType::kBFloat16, std::nullopt, std::nullopt, std::nullopt, "HND",
        std::nullopt, "auto", qlen);
    EXPECT_TRUE(testing::all_close(got.out.to(Device::cpu()), want.out,
                                   testing::attention_tolerance(DType::kBFloat16)));
  }
}

// Hand-checked: q = 0 gives every key the score 0; with keys of value 1 and 2 and a sink of
// logit 0 the softmax weights are 1/3 each (the sink's value is zero), so o = (1 + 2) / 3 = 1,
// times bmm2_scale 2 = 2 exactly; lse = log2(3).
TEST(TrtllmDecode, HandCheckedSink) {
  Tensor k = Tensor::zeros({2, 1, 1, 64}, DType::kFloat16);  // HND pair, page_size 1
  Tensor v = Tensor::zeros({2, 1, 1, 64}, DType::kFloat16);
  v.select(0, 0).fill_(1.0);
  v.select(0, 1).fill_(2.0);
  Tensor q = Tensor::zeros({1, 1, 64}, DType::kFloat16);
  Tensor table = int_tensor({1, 0}).view({1, 2});  // token 0 in page 1, token 1 in page 0
  Tensor sinks = Tensor::zeros({1}, DType::kFloat32);
  AttentionOutput r = trtllm_batch_decode_with_kv_cache(
      q, PagedKVCache(k, v), workspace(), table, int_tensor({2}), 2, 0.125, 2.0, -1, std::nullopt,
      std::nullopt, std::nullopt, std::nullopt, sinks, "HND", std::nullopt, "auto", 1, 1.0,
      std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, true, std::nullopt,
      true);
  for (double x : r.out.to_double_vector()) EXPECT_DOUBLE_EQ(x, 2.0);
  EXPECT_NEAR(r.lse.to_double_vector()[0], std::log2(3.0), 1e-6);
  // Without the sink: weights 1/2, o = 1.5 * 2 = 3, lse = 1.
  r = trtllm_batch_decode_with_kv_cache(q, PagedKVCache(k, v), workspace(), table, int_tensor({2}),
                                        2, 0.125, 2.0, -1, std::nullopt, std::nullopt, std::nullopt,
                                        std::nullopt, std::nullopt, "HND", std::nullopt, "auto", 1,
                                        1.0, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                        std::nullopt, true, std::nullopt, true);
  for (double x : r.out.to_double_vector()) EXPECT_DOUBLE_EQ(x, 3.0);
  EXPECT_NEAR(r.lse.to_double_vector()[0], 1.0, 1e-6);
  // o_scale follows xqa: a 16-bit output is multiplied by it; backend="trtllm-gen" ignores it.
  r = trtllm_batch_decode_with_kv_cache(
      q, PagedKVCache(k, v), workspace(), table, int_tensor({2}), 2, 0.125, 2.0, -1, std::nullopt,
      std::nullopt, std::nullopt, std::nullopt, std::nullopt, "HND", std::nullopt, "auto", 1, 0.5);
  for (double x : r.out.to_double_vector()) EXPECT_DOUBLE_EQ(x, 1.5);
  r = trtllm_batch_decode_with_kv_cache(q, PagedKVCache(k, v), workspace(), table, int_tensor({2}),
                                        2, 0.125, 2.0, -1, std::nullopt, std::nullopt, std::nullopt,
                                        std::nullopt, std::nullopt, "HND", std::nullopt,
                                        "trtllm-gen", 1, 0.5);
  for (double x : r.out.to_double_vector()) EXPECT_DOUBLE_EQ(x, 3.0);
  // A 5-D cache whose second axis has size 1: K and V are the same tensor (keys 1 and 2 now).
  Tensor kv1 = v.unsqueeze(1);
  r = trtllm_batch_decode_with_kv_cache(Tensor::zeros({1, 1, 64}, DType::kFloat16),
                                        PagedKVCache(kv1), workspace(), table, int_tensor({2}), 2);
  for (double x : r.out.to_double_vector()) EXPECT_DOUBLE_EQ(x, 1.5);
}

// A NaN score makes its row NaN (upstream's kernels do the same); NaN in a key that the window
// masks changes nothing; other heads stay finite.
TEST(TrtllmDecode, NanPropagatesMaskedDoesNot) {
  BlockCache c = make_cache({12}, 4, 1, 64, DType::kFloat16, true, true, 3);
  Tensor q = testing::rand_tensor({1, 2, 64}, DType::kFloat16, 4, -1.0, 1.0);
  auto run = [&](const Tensor& qq, int64_t window) {
    return trtllm_batch_decode_with_kv_cache(
        qq, c.cache(), workspace(), c.block_tables, c.seq_lens, 12, 0.125, 1.0, window,
        std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, "HND", std::nullopt,
        "auto", 1, 1.0, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, true,
        std::nullopt, true);
  };
  const AttentionOutput clean = run(q, 3);
  // Key 0 lies outside window 3 (keys 8..11 are visible): a NaN there is masked.
  const int32_t page0 = c.table[0][0];
  c.k.select(0, page0).select(0, 0).select(0, 0).select(0, 0).fill_(std::nan(""));
  const AttentionOutput masked = run(q, 3);
  EXPECT_TRUE(testing::all_close(masked.out, clean.out, {0, 0}));
  // With the full window key 0 is visible: both heads read it, both rows are NaN.
  const AttentionOutput all = run(q, -1);
  for (double x : all.out.to_double_vector()) EXPECT_TRUE(std::isnan(x));
  for (double x : all.lse.to_double_vector()) EXPECT_TRUE(std::isnan(x));
  // NaN in one head of q: that head is NaN, the other is not.
  c.k.select(0, page0).select(0, 0).select(0, 0).select(0, 0).fill_(0.0);
  Tensor qn = q.clone();
  qn.select(0, 0).select(0, 1).select(0, 5).fill_(std::nan(""));
  const AttentionOutput one = run(qn, -1);
  const std::vector<double> o = one.out.to_double_vector();
  for (int64_t i = 0; i < 64; ++i) EXPECT_FALSE(std::isnan(o[i]));
  for (int64_t i = 64; i < 128; ++i) EXPECT_TRUE(std::isnan(o[i]));
}

TEST(TrtllmDecode, BadInput) {
  BlockCache c = make_cache({5, 9}, 4, 2, 64, DType::kFloat16, true, true, 7);
  Tensor q = testing::rand_tensor({2, 4, 64}, DType::kFloat16, 1);
  const Tensor ws = workspace();
  auto call = [&](const Tensor& qq, const Tensor& table, const Tensor& lens, int64_t max_len,
                  std::optional<Tensor> sinks = std::nullopt, std::string_view layout = "HND") {
    return trtllm_batch_decode_with_kv_cache(qq, c.cache(), ws, table, lens, max_len, 1.0, 1.0, -1,
                                             std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                             sinks, layout);
  };
  EXPECT_NO_THROW(call(q, c.block_tables, c.seq_lens, 9));
  EXPECT_FI_ERROR(call(q, c.block_tables, c.seq_lens, 8), kDecode, "max_seq_len");
  EXPECT_FI_ERROR(call(q, c.block_tables, int_tensor({5}), 9), kDecode, "seq_lens");
  EXPECT_FI_ERROR(call(q, c.block_tables.slice(0, 0, 1), c.seq_lens, 9), kDecode, "block_tables");
  Tensor bad = c.block_tables.clone();
  bad.select(0, 1).select(0, 0).fill_(100);
  EXPECT_FI_ERROR(call(q, bad, c.seq_lens, 9), kDecode, "block_tables");
  bad.select(0, 1).select(0, 0).fill_(-1);
  EXPECT_FI_ERROR(call(q, bad, c.seq_lens, 9), kDecode, "block_tables");
  // 9 tokens need 3 blocks of 4; a 2-column table cannot hold them.
  EXPECT_FI_ERROR(call(q, c.block_tables.slice(1, 0, 2), c.seq_lens, 9), kDecode, "block_tables");
  EXPECT_FI_ERROR(call(q, c.block_tables.to(DType::kInt64), c.seq_lens, 9), kDecode,
                  "block_tables");
  EXPECT_FI_ERROR(
      call(testing::rand_tensor({2, 4, 128}, DType::kFloat16, 1), c.block_tables, c.seq_lens, 9),
      kDecode, "query");
  EXPECT_FI_ERROR(
      call(testing::rand_tensor({2, 3, 64}, DType::kFloat16, 1), c.block_tables, c.seq_lens, 9),
      kDecode, "kv_cache");
  EXPECT_FI_ERROR(call(q, c.block_tables, c.seq_lens, 9, Tensor::zeros({3}, DType::kFloat32)),
                  kDecode, "sinks");
  EXPECT_FI_ERROR(call(q, c.block_tables, c.seq_lens, 9, std::nullopt, "NDH"), kDecode,
                  "kv_layout");
  auto with = [&](auto&&... fix) {
    return trtllm_batch_decode_with_kv_cache(q, c.cache(), ws, c.block_tables, c.seq_lens, 9,
                                             fix...);
  };
  // out's dtype stands for out_dtype: bf16 is allowed with fp16 q, fp32 is not.
  EXPECT_NO_THROW(with(1.0, 1.0, -1, Tensor::zeros({2, 4, 64}, DType::kBFloat16)));
  EXPECT_FI_ERROR(with(1.0, 1.0, -1, Tensor::zeros({2, 4, 64}, DType::kFloat32)), kDecode,
                  "out_dtype");
  EXPECT_FI_ERROR(with(1.0, 1.0, -1, Tensor::zeros({2, 4, 64}, DType::kBFloat16), DType::kFloat16),
                  kDecode, "out");
  EXPECT_FI_ERROR(with(1.0, 1.0, -1, Tensor::zeros({2, 4, 32}, DType::kFloat16)), kDecode, "out");
  // An fp8 out_dtype: computed in fp32 and quantized once (CPU; TrtllmFp8Query below).
  EXPECT_EQ(with(1.0, 1.0, -1, std::nullopt, DType::kFloat8E4M3FN).out.dtype(),
            DType::kFloat8E4M3FN);
  EXPECT_FI_ERROR(with(1.0, 1.0, -1, std::nullopt, std::nullopt, 1.0), kDecode, "o_sf_scale");
  EXPECT_FI_ERROR(with(std::nan(""), 1.0), kDecode, "bmm1_scale");
  EXPECT_FI_ERROR(with(Tensor::zeros({2}, DType::kFloat32), 1.0), kDecode, "bmm1_scale");
  EXPECT_FI_ERROR(with(1.0, 1.0, -2), kDecode, "window_left");
  EXPECT_FI_ERROR(with(1.0, 1.0, -1, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                       std::nullopt, "HND", std::nullopt, "fa2"),
                  kDecode, "backend");
  // q_len_per_req 3 does not divide 2 rows; 2 queries need >= 2 keys (request 0 has 5: fine).
  EXPECT_FI_ERROR(with(1.0, 1.0, -1, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                       std::nullopt, "HND", std::nullopt, "auto", 3),
                  kDecode, "query");
  EXPECT_FI_ERROR(
      with(1.0, 1.0, -1, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
           "HND", std::nullopt, "auto", 1, 1.0, Tensor::zeros({1}, DType::kInt32)),
      kDecode, "mask");
  EXPECT_FI_ERROR(with(1.0, 1.0, -1, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                       std::nullopt, "HND", std::nullopt, "auto", std::nullopt),
                  kDecode, "cum_seq_lens_q");
  EXPECT_FI_ERROR(with(1.0, 1.0, -1, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                       std::nullopt, "HND", std::nullopt, "auto", 1, 1.0, std::nullopt,
                       std::nullopt, std::nullopt, std::nullopt, std::nullopt, false),
                  kDecode, "uses_shared_paged_kv_idx");
  // workspace_buffer is only read: an undefined one is an error.
  EXPECT_FI_ERROR(
      trtllm_batch_decode_with_kv_cache(q, c.cache(), Tensor(), c.block_tables, c.seq_lens, 9),
      kDecode, "workspace_buffer");
}

// ---- CUDA: the plan on the device (kernels/block_table_plan.h) ----------------------------

// A decode call of q_len queries a request on `cache` (a pair, HND) with fp64-checked scales,
// workspace `ws` on the device; out and lse may be given (the graph test's fixed outputs), lse is
// returned.
AttentionOutput device_decode(const Tensor& q, const PagedKVCache& cache, const Tensor& table,
                              const Tensor& lens, int64_t max_seq_len, int64_t q_len, const Ref& r,
                              const std::optional<Tensor>& sinks, const std::optional<Tensor>& out,
                              const std::optional<Tensor>& lse, const Tensor& ws) {
  return trtllm_batch_decode_with_kv_cache(
      q, cache, ws, table, lens, max_seq_len, r.bmm1, r.bmm2, r.window_left, out, std::nullopt,
      std::nullopt, std::nullopt, sinks, "HND", std::nullopt, "auto", q_len, 1.0, std::nullopt,
      std::nullopt, std::nullopt, std::nullopt, std::nullopt, true, lse, /*return_lse=*/true);
}

struct DeviceDecodeCase {
  int64_t hq, hkv, d, page_size, q_len;
  std::vector<int32_t> lens;
  int64_t max_seq_len;
  bool sinks;
};

// On CUDA the call reads seq_lens and block_tables on the device and plans there (no host copy):
// against the fp64 formula over MHA and GQA groups (the CUDA-core and tensor-core kernels),
// several queries a request (causal), sinks, and lengths from one key to several split-KV chunks
// of a grid sized for max_seq_len (compiled, not run: no GPU in the sessions that wrote it).
TEST(TrtllmDecodeCuda, DevicePlanMatchesFp64) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const std::vector<DeviceDecodeCase> cases{
      {32, 8, 128, 16, 1, {1, 700, 2048, 33}, 2048, false},
      {4, 4, 64, 4, 3, {3, 100, 517}, 600, true},
      {8, 2, 128, 16, 1, {5000}, 8192, false},
      {8, 2, 128, 16, 2, {2, 64, 4000, 2, 1500}, 4096, true},
      {16, 16, 256, 8, 1, {9, 1200}, 1200, false},
  };
  for (const DeviceDecodeCase& t : cases) {
    SCOPED_TRACE(::testing::Message() << "hq " << t.hq << " hkv " << t.hkv << " d " << t.d
                                      << " q_len " << t.q_len << " batch " << t.lens.size());
    const BlockCache c =
        make_cache(t.lens, t.page_size, t.hkv, t.d, DType::kBFloat16, true, true, 31);
    const auto batch = static_cast<int64_t>(t.lens.size());
    const Tensor q = testing::rand_tensor({batch * t.q_len, t.hq, t.d}, DType::kBFloat16, 6);
    Ref r;
    r.bmm1 = 1.0 / std::sqrt(double(t.d));
    r.bmm2 = 0.75;
    std::optional<Tensor> sinks;
    if (t.sinks) {
      const Tensor st = testing::rand_tensor({t.hq}, DType::kFloat32, 8, -1.0, 3.0);
      r.sinks = st.to_double_vector();
      sinks = st.to(g);
    }
    std::vector<int32_t> qo{0};
    for (int64_t b = 0; b < batch; ++b) qo.push_back(static_cast<int32_t>((b + 1) * t.q_len));
    std::vector<double> eo, el;
    reference(q, c, qo, r, eo, el);
    const AttentionOutput res = device_decode(
        q.to(g), PagedKVCache(c.k.to(g), c.v.to(g)), c.block_tables.to(g), c.seq_lens.to(g),
        t.max_seq_len, t.q_len, r, sinks, std::nullopt, std::nullopt, workspace().to(g));
    EXPECT_TRUE(testing::all_close(res.out.to(Device::cpu()), eo,
                                   testing::attention_tolerance(DType::kBFloat16)));
    EXPECT_TRUE(testing::all_close(res.lse.to(Device::cpu()), el, {1e-3, 1e-4}));
  }
}

// The rows of requests the host checks would refuse are NaN (out and lse), their pages unread;
// the other requests' rows are right: a page id past the cache (request 1), a length past
// max_seq_len (request 2), more blocks than the table has columns (request 4).
TEST(TrtllmDecodeCuda, RefusedRequestsGiveNanRowsOnly) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const std::vector<int32_t> lens{40, 50, 60, 30, 20};
  const int64_t hq = 8, hkv = 2, d = 64, page = 4, max_seq_len = 100;
  const BlockCache c = make_cache(lens, page, hkv, d, DType::kFloat16, true, true, 41);
  const auto batch = static_cast<int64_t>(lens.size());
  const Tensor q = testing::rand_tensor({batch, hq, d}, DType::kFloat16, 4);
  Ref r;
  r.bmm1 = 0.125;
  std::vector<double> eo, el;
  reference(q, c, {0, 1, 2, 3, 4, 5}, r, eo, el);
  std::vector<double> table = c.block_tables.to_double_vector();
  const int64_t cols = c.block_tables.size(1);
  table[1 * cols + 3] = static_cast<double>(c.k.size(0));  // request 1: a page past the cache
  std::vector<int32_t> bad_lens = lens;
  bad_lens[2] = static_cast<int32_t>(max_seq_len + 1);  // request 2: past max_seq_len
  bad_lens[4] = static_cast<int32_t>(cols * page + 1);  // request 4: past its table row
  ASSERT_LE(bad_lens[4], max_seq_len);                  // refused for its table row only
  std::vector<int32_t> table_i(table.begin(), table.end());
  const Tensor tg = int_tensor(table_i).view({batch, cols}).to(g);
  const AttentionOutput res =
      device_decode(q.to(g), PagedKVCache(c.k.to(g), c.v.to(g)), tg, int_tensor(bad_lens).to(g),
                    max_seq_len, 1, r, std::nullopt, std::nullopt, std::nullopt, workspace().to(g));
  const std::vector<double> o = res.out.to(Device::cpu()).to_double_vector();
  const std::vector<double> l = res.lse.to(Device::cpu()).to_double_vector();
  const testing::Tolerance tol = testing::attention_tolerance(DType::kFloat16);
  for (int64_t b = 0; b < batch; ++b) {
    const bool refused = b == 1 || b == 2 || b == 4;
    for (int64_t x = b * hq * d; x < (b + 1) * hq * d; ++x) {
      if (refused) {
        ASSERT_TRUE(std::isnan(o[x])) << "request " << b << " element " << x;
      } else {
        ASSERT_NEAR(o[x], eo[x], tol.atol + tol.rtol * std::abs(eo[x])) << "request " << b;
      }
    }
    for (int64_t x = b * hq; x < (b + 1) * hq; ++x) {
      if (refused) {
        ASSERT_TRUE(std::isnan(l[x])) << "request " << b;
      } else {
        ASSERT_NEAR(l[x], el[x], 1e-3) << "request " << b;
      }
    }
  }
}

// trtllm_batch_context_with_kv_cache on CUDA plans on the device too (cum_seq_lens_q, seq_lens and
// block_tables read there; the grid for max_q_len x max_kv_len): variable query counts (none,
// one, a chunk of a longer request, the whole request), causal and not, a grid much larger than
// the batch, sinks and a window, against the fp64 formula; a request the host checks would
// refuse (more queries than keys, causal) gives NaN rows only; a cum_seq_lens_q that decreases
// refuses every request. Compiled, not run.
TEST(TrtllmContextCuda, DevicePlanMatchesFp64) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  struct Case {
    int64_t hq, hkv, d, page;
    std::vector<int32_t> qn, lens;
    int64_t max_q, max_kv;
    bool causal, sinks;
    int64_t window;
  };
  const std::vector<Case> cases{
      {32, 8, 128, 16, {300, 0, 1, 77}, {700, 40, 2048, 77}, 512, 4096, true, false, -1},
      {8, 2, 64, 4, {5, 130, 9}, {5, 600, 31}, 130, 600, false, true, -1},
      {16, 16, 128, 16, {64, 33}, {1000, 33}, 200, 2000, true, true, 100},
      {4, 1, 256, 8, {17}, {17}, 17, 17, true, false, -1},
  };
  for (const Case& t : cases) {
    SCOPED_TRACE(::testing::Message() << "hq " << t.hq << " d " << t.d << " batch " << t.qn.size());
    const BlockCache c = make_cache(t.lens, t.page, t.hkv, t.d, DType::kBFloat16, true, true, 91);
    std::vector<int32_t> cq{0};
    for (int32_t n : t.qn) cq.push_back(cq.back() + n);
    const Tensor q = testing::rand_tensor({cq.back(), t.hq, t.d}, DType::kBFloat16, 92);
    Ref r;
    r.bmm1 = 1.0 / std::sqrt(double(t.d));
    r.bmm2 = 0.5;
    r.causal = t.causal;
    r.window_left = t.window;
    std::optional<Tensor> sinks;
    if (t.sinks) {
      const Tensor st = testing::rand_tensor({t.hq}, DType::kFloat32, 93, -1.0, 2.0);
      r.sinks = st.to_double_vector();
      sinks = st.to(g);
    }
    std::vector<double> eo, el;
    reference(q, c, cq, r, eo, el);
    const auto batch = static_cast<int64_t>(t.qn.size());
    const Tensor ws = workspace().to(g);
    auto run = [&](const std::vector<int32_t>& cum, const std::vector<int32_t>& lens,
                   std::optional<Tensor> out = std::nullopt) {
      return trtllm_batch_context_with_kv_cache(
          q.to(g), PagedKVCache(c.k.to(g), c.v.to(g)), ws, c.block_tables.to(g),
          int_tensor(lens).to(g), t.max_q, t.max_kv, r.bmm1, r.bmm2, batch, int_tensor(cum).to(g),
          int_tensor(cum).to(g), t.window, out, std::nullopt, std::nullopt, std::nullopt, "HND",
          std::nullopt, sinks, std::nullopt, std::nullopt, true, t.causal, std::nullopt,
          /*return_lse=*/true);
    };
    const AttentionOutput res = run(cq, t.lens);
    EXPECT_TRUE(testing::all_close(res.out.to(Device::cpu()), eo,
                                   testing::attention_tolerance(DType::kBFloat16)));
    EXPECT_TRUE(testing::all_close(res.lse.to(Device::cpu()), el, {1e-3, 1e-4}));
    // The last request with fewer keys than queries: refused when causal, its rows NaN only.
    if (t.causal && t.qn.back() > 1) {
      std::vector<int32_t> short_lens = t.lens;
      short_lens.back() = t.qn.back() - 1;
      const std::vector<double> o = run(cq, short_lens).out.to(Device::cpu()).to_double_vector();
      const int64_t per_row = t.hq * t.d, first_bad = cq[batch - 1] * per_row;
      const testing::Tolerance tol = testing::attention_tolerance(DType::kBFloat16);
      for (int64_t x = 0; x < static_cast<int64_t>(o.size()); ++x) {
        if (x >= first_bad) {
          ASSERT_TRUE(std::isnan(o[x])) << "element " << x;
        } else {
          ASSERT_NEAR(o[x], eo[x], tol.atol + tol.rtol * std::abs(eo[x])) << "element " << x;
        }
      }
    }
    if (batch > 1) {  // a decreasing cum_seq_lens_q: every request refused
      // Request 0 one query longer, inside the query rows and the bound: its own entries are
      // sane, so its rows get NaN; request 1's run backwards (no rows known: untouched).
      std::vector<int32_t> bad = cq;
      bad[1] = cq[1] + 1;
      bad[2] = cq[1];
      // Every row NaN (a request whose own entries are sane) or untouched (the sentinel).
      Tensor o_dev = Tensor::full({cq.back(), t.hq, t.d}, -100.0, DType::kBFloat16, g);
      run(bad, t.lens, o_dev);
      const std::vector<double> o = o_dev.to(Device::cpu()).to_double_vector();
      int64_t nan_rows = 0;
      for (int64_t x = 0; x < static_cast<int64_t>(o.size()); ++x) {
        ASSERT_TRUE(std::isnan(o[x]) || o[x] == -100.0) << "element " << x;
        nan_rows += std::isnan(o[x]) && x % (t.hq * t.d) == 0;
      }
      EXPECT_GT(nan_rows, 0);
    }
  }
}

// The decode entry points with variable query counts on CUDA (trtllm's cum_seq_lens_q with
// max_q_len, xqa's q_cu_seq_lens with q_len_per_req as the bound) plan on the device as the
// context call does: against the fp64 formula (requests of 0 to max_q_len queries, causal among
// themselves), and a request of more queries than the bound gives NaN rows only.
TEST(TrtllmDecodeCuda, VariableQueryCountsPlanOnTheDevice) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int64_t hq = 16, hkv = 4, d = 128, page = 16, max_seq_len = 2048, max_q = 4;
  const std::vector<int32_t> lens{40, 2048, 7, 900};
  const std::vector<int32_t> cq{0, 4, 5, 5, 8};
  const BlockCache c = make_cache(lens, page, hkv, d, DType::kBFloat16, true, true, 97);
  const Tensor q = testing::rand_tensor({cq.back(), hq, d}, DType::kBFloat16, 98);
  Ref r;
  r.bmm1 = 0.07;
  std::vector<double> eo, el;
  reference(q, c, cq, r, eo, el);
  const PagedKVCache cache(c.k.to(g), c.v.to(g));
  const Tensor qg = q.to(g), tg = c.block_tables.to(g), lg = c.seq_lens.to(g);
  const Tensor ws = workspace().to(g);
  auto trtllm = [&](const std::vector<int32_t>& cum, int64_t bound) {
    return trtllm_batch_decode_with_kv_cache(
               qg, cache, ws, tg, lg, max_seq_len, r.bmm1, 1.0, -1, std::nullopt, std::nullopt,
               std::nullopt, std::nullopt, std::nullopt, "HND", std::nullopt, "auto", std::nullopt,
               1.0, std::nullopt, bound, int_tensor(cum).to(g))
        .out.to(Device::cpu());
  };
  auto xqa = [&](const std::vector<int32_t>& cum, int64_t bound) {
    return xqa_batch_decode_with_kv_cache(qg, cache, ws, tg, lg, max_seq_len, r.bmm1, 1.0, -1,
                                          std::nullopt, std::nullopt, "HND", std::nullopt, bound,
                                          1.0, std::nullopt, std::nullopt, int_tensor(cum).to(g))
        .to(Device::cpu());
  };
  const testing::Tolerance tol = testing::attention_tolerance(DType::kBFloat16);
  EXPECT_TRUE(testing::all_close(trtllm(cq, max_q), eo, tol));
  EXPECT_TRUE(testing::all_close(xqa(cq, max_q), eo, tol));
  // A bound of 3: request 0 (4 queries) is refused, the others computed.
  for (const Tensor& o : {trtllm(cq, 3), xqa(cq, 3)}) {
    const std::vector<double> v = o.to_double_vector();
    for (int64_t x = 0; x < static_cast<int64_t>(v.size()); ++x) {
      if (x < cq[1] * hq * d) {
        ASSERT_TRUE(std::isnan(v[x])) << "element " << x;
      } else {
        ASSERT_NEAR(v[x], eo[x], tol.atol + tol.rtol * std::abs(eo[x])) << "element " << x;
      }
    }
  }
  // A bound of no queries (max_q_len 0, no request with one) takes the host plan: an empty output,
  // for the context call too (the device plan laid out a grid of no rows and divided by zero: a
  // review found it in session 79).
  const Tensor q0 = Tensor::empty({0, hq, d}, DType::kBFloat16, g);
  const Tensor none = int_tensor({0, 0, 0, 0, 0}).to(g);
  EXPECT_EQ(trtllm_batch_decode_with_kv_cache(q0, cache, ws, tg, lg, max_seq_len, r.bmm1, 1.0, -1,
                                              std::nullopt, std::nullopt, std::nullopt,
                                              std::nullopt, std::nullopt, "HND", std::nullopt,
                                              "auto", std::nullopt, 1.0, std::nullopt, 0, none)
                .out.size(0),
            0);
  EXPECT_EQ(trtllm_batch_context_with_kv_cache(q0, cache, ws, tg, lg, 0, max_seq_len, r.bmm1, 1.0,
                                               4, none, none, -1, std::nullopt, std::nullopt,
                                               std::nullopt, std::nullopt, "HND", std::nullopt,
                                               std::nullopt, std::nullopt, std::nullopt, true, true)
                .out.size(0),
            0);
}

#if FLASHINFER_TEST_HAVE_CUDART
// The context call captured into a CUDA graph after a warm-up, then replayed with other query
// counts and lengths written into the same tensors (engines' chunked prefill steps).
TEST(TrtllmContextCuda, CapturedCallReplaysNewQueryCounts) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int64_t hq = 8, hkv = 2, d = 128, page = 16, max_q = 96, max_kv = 1024;
  const std::vector<int32_t> lens{500, 96, 1024};
  const BlockCache c = make_cache(lens, page, hkv, d, DType::kBFloat16, true, true, 95);
  const int64_t rows = 3 * max_q;
  const Tensor q = testing::rand_tensor({rows, hq, d}, DType::kBFloat16, 96);
  Ref r;
  r.bmm1 = 1.0 / std::sqrt(double(d));
  r.causal = true;
  const Tensor qg = q.to(g), tg = c.block_tables.to(g), ws = workspace().to(g);
  Tensor lens_g = int_tensor(lens).to(g);
  Tensor cum_g = int_tensor({0, 10, 20, 30}).to(g);
  Tensor out = Tensor::zeros({rows, hq, d}, DType::kBFloat16, g);
  const PagedKVCache cache(c.k.to(g), c.v.to(g));
  auto call = [&] {
    trtllm_batch_context_with_kv_cache(qg, cache, ws, tg, lens_g, max_q, max_kv, r.bmm1, 1.0, 3,
                                       cum_g, cum_g, -1, out);
  };
  testing::ReplayableGraph graph;
  ASSERT_NO_FATAL_FAILURE(testing::warm_up_for_replay(graph, call));
  ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, call));
  for (const std::vector<int32_t>& cq :
       {std::vector<int32_t>{0, 96, 96, 150}, std::vector<int32_t>{0, 1, 97, 193}}) {
    cum_g.copy_(int_tensor(cq));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
    std::vector<double> eo, el;
    const Tensor qs = q.slice(0, 0, cq.back()).contiguous();
    reference(qs, c, cq, r, eo, el);
    EXPECT_TRUE(testing::all_close(out.slice(0, 0, cq.back()).to(Device::cpu()), eo,
                                   testing::attention_tolerance(DType::kBFloat16)))
        << "cum_seq_lens_q ending " << cq.back();
  }
  cudaGraphExecDestroy(graph.exec);
  cudaGraphDestroy(graph.graph);
  cudaStreamDestroy(graph.stream);
}
#endif

#if FLASHINFER_TEST_HAVE_CUDART
// cudnn_batch_prefill_with_kv_cache's ragged call with its lengths and offsets on the GPU plans
// there (kernels/cudnn_ragged_plan.h, then the block-table plan kernel): vLLM's vision-encoder
// call (V a view into the interleaved QKV buffer, element offsets, a batch padded with empty
// requests, a bucketed max) matches the CPU; captured into a CUDA graph (no host read: the host
// plan's reads would be refused under capture) it replays new lengths and offsets, and a call
// the host refuses (V's offsets in q's units) gives NaN in every row. A causal GQA call with
// byte offsets of int64, K's requests apart (batch_offsets_k with gaps) and the lse matches too.
TEST(CudnnPrefillCuda, RaggedCallPlansOnTheDeviceAndCaptures) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int64_t t = 300, h = 16, d = 64, hd = h * d;
  const DType bf16 = DType::kBFloat16;
  const Tensor qkv = testing::rand_tensor({t, 3, h, d}, bf16, 201, -1.0, 1.0);
  const Tensor qkv_g = qkv.to(g);
  const Tensor q = qkv.select(1, 0).contiguous(), k = qkv.select(1, 1).contiguous();
  const Tensor v = qkv.select(1, 2);
  const Tensor qg = q.to(g), kg = k.to(g), vg = qkv_g.select(1, 2);
  const Tensor ws = Tensor::zeros({int64_t{64} << 20}, DType::kUInt8, g);
  // Request lengths padded to a batch of 8 (empty requests at the total).
  auto offsets = [&](const std::vector<int32_t>& lens, int64_t per_row) {
    std::vector<int32_t> o{0};
    for (int32_t n : lens) o.push_back(static_cast<int32_t>(o.back() + n * per_row));
    return o;
  };
  auto lens4 = [](const std::vector<int32_t>& x) {
    return int_tensor(x).view({static_cast<int64_t>(x.size()), 1, 1, 1});
  };
  auto cpu_call = [&](const std::vector<int32_t>& lens, const Tensor& vv) {
    const Tensor oq = int_tensor(offsets(lens, hd)), ov = int_tensor(offsets(lens, 3 * hd));
    return cudnn_batch_prefill_with_kv_cache(q, k, vv, 0.125, workspace(), 256, 256, lens4(lens),
                                             lens4(lens), std::nullopt, false, false, std::nullopt,
                                             std::nullopt, std::nullopt, oq, oq, oq, ov)
        .out;
  };
  const std::vector<int32_t> first{100, 64, 136, 0, 0, 0, 0, 0};
  Tensor lens_g = lens4(first).to(g);
  Tensor oq_g = int_tensor(offsets(first, hd)).to(g),
         ov_g = int_tensor(offsets(first, 3 * hd)).to(g);
  Tensor out = Tensor::zeros({t, h, d}, bf16, g);
  auto call = [&] {
    cudnn_batch_prefill_with_kv_cache(qg, kg, vg, 0.125, ws, 256, 256, lens_g, lens_g, std::nullopt,
                                      false, false, std::nullopt, std::nullopt, std::nullopt, oq_g,
                                      oq_g, oq_g, ov_g, std::nullopt, "elements", out);
  };
  call();  // eager
  EXPECT_TRUE(testing::all_close(out.to(Device::cpu()), cpu_call(first, v).to_double_vector(),
                                 testing::attention_tolerance(bf16)));
  testing::ReplayableGraph graph;
  ASSERT_NO_FATAL_FAILURE(testing::warm_up_for_replay(graph, call));
  ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, call));
  struct Step {
    std::vector<int32_t> lens;
    bool good;
  };
  for (const Step& st :
       {Step{{7, 1, 256, 36, 0, 0, 0, 0}, true}, Step{{256, 44, 0, 0, 0, 0, 0, 0}, true},
        Step{{50, 50, 50, 50, 50, 50, 0, 0}, false}}) {
    SCOPED_TRACE(st.lens[0]);
    lens_g.copy_(lens4(st.lens));
    oq_g.copy_(int_tensor(offsets(st.lens, hd)));
    // The refused step: V's offsets in q's units address other rows of V.
    ov_g.copy_(int_tensor(offsets(st.lens, st.good ? 3 * hd : hd)));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
    if (st.good) {
      EXPECT_TRUE(testing::all_close(out.to(Device::cpu()), cpu_call(st.lens, v).to_double_vector(),
                                     testing::attention_tolerance(bf16)));
    } else {
      testing::expect_nan_rows(out, 0, t);
    }
  }
  cudaGraphExecDestroy(graph.exec);
  cudaGraphDestroy(graph.graph);
  cudaStreamDestroy(graph.stream);

  // Causal, GQA 4:1 at D 128, int64 byte offsets, K's requests apart, the lse.
  const std::vector<int32_t> lq{5, 40, 1}, lk{9, 70, 33};
  const std::vector<int64_t> kstart{3, 20, 95};
  const Tensor q2 = testing::rand_tensor({46, 8, 128}, bf16, 202, -1.0, 1.0);
  const Tensor k2 = testing::rand_tensor({130, 2, 128}, bf16, 203, -1.0, 1.0);
  const Tensor v2 = testing::rand_tensor({130, 2, 128}, bf16, 204, -1.0, 1.0);
  auto i64 = [](const std::vector<int64_t>& x) {
    Tensor r = Tensor::empty({static_cast<int64_t>(x.size())}, DType::kInt64);
    std::copy(x.begin(), x.end(), r.data<int64_t>());
    return r;
  };
  const Tensor oq2 = i64({0, 5 * 8 * 128 * 2, 45 * 8 * 128 * 2});
  const Tensor ok2 = i64({kstart[0] * 512, kstart[1] * 512, kstart[2] * 512});  // 2 x 128 x 2 B
  const CudnnPrefillResult want = cudnn_batch_prefill_with_kv_cache(
      q2, k2, v2, 0.09, workspace(), 64, 80, lens4(lq), lens4(lk), std::nullopt, true, true,
      std::nullopt, std::nullopt, std::nullopt, oq2, std::nullopt, ok2, ok2, std::nullopt, "bytes");
  // Captured, so the device plan is what ran (the host plan's reads are refused under capture).
  const Tensor q2g = q2.to(g), k2g = k2.to(g), v2g = v2.to(g), lq_g = lens4(lq).to(g),
               lk_g = lens4(lk).to(g), oq2g = oq2.to(g), ok2g = ok2.to(g);
  Tensor out2 = Tensor::zeros({46, 8, 128}, bf16, g),
         lse2 = Tensor::zeros({46, 8}, DType::kFloat32, g);
  auto call2 = [&] {
    cudnn_batch_prefill_with_kv_cache(q2g, k2g, v2g, 0.09, ws, 64, 80, lq_g, lk_g, std::nullopt,
                                      true, true, std::nullopt, std::nullopt, std::nullopt, oq2g,
                                      std::nullopt, ok2g, ok2g, std::nullopt, "bytes", out2, lse2);
  };
  testing::ReplayableGraph graph2;
  ASSERT_NO_FATAL_FAILURE(testing::warm_up_for_replay(graph2, call2));
  ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph2, call2));
  out2.fill_(0.0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(graph2.exec, graph2.stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(graph2.stream), cudaSuccess);
  EXPECT_TRUE(testing::all_close(out2, want.out, testing::attention_tolerance(bf16)));
  EXPECT_TRUE(testing::all_close(lse2, want.lse, {2e-3, 1e-3}));
  cudaGraphExecDestroy(graph2.exec);
  cudaGraphDestroy(graph2.graph);
  cudaStreamDestroy(graph2.stream);
}
#endif

// bmm1_scale / bmm2_scale given as one-element fp32 tensors on the device (upstream's
// "Union[float, torch.Tensor]"): the kernels read them there, nothing is read back. Against the
// fp64 formula, on both block-table entry points, a [1] and a 0-dim tensor; and a bf16 scale
// tensor, cast on the device.
TEST(TrtllmDecodeCuda, DeviceTensorScalesMatchFp64) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int64_t hq = 32, hkv = 8, d = 128, page = 16, max_seq_len = 1024;
  const std::vector<int32_t> lens{17, 300, 1024, 1};
  const BlockCache c = make_cache(lens, page, hkv, d, DType::kBFloat16, true, true, 61);
  const auto batch = static_cast<int64_t>(lens.size());
  const Tensor q = testing::rand_tensor({batch, hq, d}, DType::kBFloat16, 3);
  Ref r;
  r.bmm1 = 0.0625;
  r.bmm2 = 0.75;
  std::vector<double> eo, el;
  reference(q, c, {0, 1, 2, 3, 4}, r, eo, el);
  const PagedKVCache cache(c.k.to(g), c.v.to(g));
  const Tensor qg = q.to(g), tg = c.block_tables.to(g), lg = c.seq_lens.to(g);
  const Tensor ws = workspace().to(g);
  const Tensor bmm1 = Tensor::full({1}, r.bmm1, DType::kFloat32, g);
  const Tensor bmm2 = Tensor::full({}, r.bmm2, DType::kFloat32, g);
  const testing::Tolerance tol = testing::attention_tolerance(DType::kBFloat16);
  const AttentionOutput a = trtllm_batch_decode_with_kv_cache(
      qg, cache, ws, tg, lg, max_seq_len, bmm1, bmm2, -1, std::nullopt, std::nullopt, std::nullopt,
      std::nullopt, std::nullopt, "HND", std::nullopt, "auto", 1, 1.0, std::nullopt, std::nullopt,
      std::nullopt, std::nullopt, std::nullopt, true, std::nullopt,
      /*return_lse=*/true);
  EXPECT_TRUE(testing::all_close(a.out.to(Device::cpu()), eo, tol));
  EXPECT_TRUE(testing::all_close(a.lse.to(Device::cpu()), el, {1e-3, 1e-4}));
  const Tensor x =
      xqa_batch_decode_with_kv_cache(qg, cache, ws, tg, lg, max_seq_len, bmm1.to(DType::kBFloat16),
                                     bmm2, -1, std::nullopt, std::nullopt, "HND");
  EXPECT_TRUE(testing::all_close(x.to(Device::cpu()), eo, tol));  // 0.0625 is exact in bf16
}

#if FLASHINFER_TEST_HAVE_CUDART
// A captured call with tensor scales reads them at each replay: new values written into the same
// tensors reach the next launch, as upstream's kernels read their scale pointers.
TEST(TrtllmDecodeCuda, CapturedCallReadsNewTensorScales) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int64_t hq = 16, hkv = 4, d = 64, page = 16, max_seq_len = 512;
  const std::vector<int32_t> lens{100, 512, 3};
  const BlockCache c = make_cache(lens, page, hkv, d, DType::kFloat16, true, true, 71);
  const auto batch = static_cast<int64_t>(lens.size());
  const Tensor q = testing::rand_tensor({batch, hq, d}, DType::kFloat16, 5);
  const PagedKVCache cache(c.k.to(g), c.v.to(g));
  const Tensor qg = q.to(g), tg = c.block_tables.to(g), lg = c.seq_lens.to(g);
  const Tensor ws = workspace().to(g);
  Tensor bmm1 = Tensor::full({1}, 0.125, DType::kFloat32, g);
  Tensor bmm2 = Tensor::full({1}, 1.0, DType::kFloat32, g);
  Tensor out = Tensor::empty({batch, hq, d}, DType::kFloat16, g);
  auto call = [&] {
    trtllm_batch_decode_with_kv_cache(qg, cache, ws, tg, lg, max_seq_len, bmm1, bmm2, -1, out,
                                      std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                      "HND");
  };
  testing::ReplayableGraph graph;
  ASSERT_NO_FATAL_FAILURE(testing::warm_up_for_replay(graph, call));
  ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, call));
  for (const auto& [s1, s2] : {std::pair{0.125, 1.0}, std::pair{0.03, 2.5}}) {
    bmm1.fill_(s1);
    bmm2.fill_(s2);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    out.fill_(0.0);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
    Ref r;
    r.bmm1 = static_cast<double>(static_cast<float>(s1));
    r.bmm2 = static_cast<double>(static_cast<float>(s2));
    std::vector<double> eo, el;
    reference(q, c, {0, 1, 2, 3}, r, eo, el);
    EXPECT_TRUE(testing::all_close(out.to(Device::cpu()), eo,
                                   testing::attention_tolerance(DType::kFloat16)))
        << "bmm1 " << s1 << " bmm2 " << s2;
  }
  cudaGraphExecDestroy(graph.exec);
  cudaGraphDestroy(graph.graph);
  cudaStreamDestroy(graph.stream);
}
#endif

#if FLASHINFER_TEST_HAVE_CUDART
// As an engine runs it: run once on a stream (the warm-up that makes the stream's plan scratch),
// captured on it into a CUDA graph (nothing read back, synchronized or allocated), then replayed
// after seq_lens and block_tables were rewritten in place with longer and shorter requests, other
// pages and other query values: the replay computes the new batch.
TEST(TrtllmDecodeCuda, CapturedCallReplaysNewLengthsAndPages) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int64_t hq = 32, hkv = 8, d = 128, page = 16, max_seq_len = 1024;
  const std::vector<int32_t> first{17, 300, 1024, 1}, second{1000, 5, 64, 777};
  // One cache holds both batches' pages: the second batch's table points at other pages.
  std::vector<int32_t> both = first;
  both.insert(both.end(), second.begin(), second.end());
  const BlockCache c = make_cache(both, page, hkv, d, DType::kBFloat16, true, true, 51);
  const int64_t batch = 4;
  const Tensor all_tables = c.block_tables;  // rows 0-3: the first batch, 4-7: the second
  const Tensor q1 = testing::rand_tensor({batch, hq, d}, DType::kBFloat16, 1);
  const Tensor q2 = testing::rand_tensor({batch, hq, d}, DType::kBFloat16, 2);
  Ref r;
  r.bmm1 = 1.0 / std::sqrt(double(d));
  // fp64 expectations of each batch: a cache view whose table and lengths are that batch's.
  auto expect = [&](const Tensor& q, int64_t row0, std::vector<double>& eo,
                    std::vector<double>& el) {
    BlockCache part = c;
    part.table.assign(c.table.begin() + row0, c.table.begin() + row0 + batch);
    part.seq_lens = c.seq_lens.slice(0, row0, row0 + batch).contiguous();
    reference(q, part, {0, 1, 2, 3, 4}, r, eo, el);
  };
  std::vector<double> eo2, el2;
  expect(q2, batch, eo2, el2);

  const PagedKVCache cache(c.k.to(g), c.v.to(g));
  Tensor qg = q1.to(g);
  Tensor table_g = all_tables.slice(0, 0, batch).contiguous().to(g);
  Tensor lens_g = int_tensor(first).to(g);
  Tensor out = Tensor::empty({batch, hq, d}, DType::kBFloat16, g);
  Tensor lse = Tensor::empty({batch, hq}, DType::kFloat32, g);
  const Tensor ws = workspace().to(g);
  auto call = [&] {
    device_decode(qg, cache, table_g, lens_g, max_seq_len, 1, r, std::nullopt, out, lse, ws);
  };
  testing::ReplayableGraph graph;
  ASSERT_NO_FATAL_FAILURE(testing::warm_up_for_replay(graph, call));  // the stream's scratch
  out.copy_(Tensor::zeros({batch, hq, d}, DType::kBFloat16));  // nothing left from the warm-up
  ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, call));
  // The capture ran nothing; the graph's first launch computes the first batch.
  ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
  std::vector<double> eo1, el1;
  expect(q1, 0, eo1, el1);
  EXPECT_TRUE(testing::all_close(out.to(Device::cpu()), eo1,
                                 testing::attention_tolerance(DType::kBFloat16)));
  // The second batch, written into the same tensors.
  qg.copy_(q2);
  table_g.copy_(all_tables.slice(0, batch, 2 * batch).contiguous());
  lens_g.copy_(int_tensor(second));
  ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
  EXPECT_TRUE(testing::all_close(out.to(Device::cpu()), eo2,
                                 testing::attention_tolerance(DType::kBFloat16)));
  EXPECT_TRUE(testing::all_close(lse.to(Device::cpu()), el2, {1e-3, 1e-4}));
  cudaGraphExecDestroy(graph.exec);
  cudaGraphDestroy(graph.graph);
  cudaStreamDestroy(graph.stream);
}
#endif

// Variable query lengths (q_len_per_req=None with cum_seq_lens_q and max_q_len).
TEST(TrtllmDecode, VariableQueryLengths) {
  BlockCache c = make_cache({6, 10, 3}, 4, 1, 64, DType::kBFloat16, false, false, 13);
  const std::vector<int32_t> cq{0, 2, 5, 6};
  Tensor q = testing::rand_tensor({6, 2, 64}, DType::kBFloat16, 8, -1.0, 1.0);
  Ref r;
  r.bmm1 = 0.2;
  std::vector<double> eo, el;
  reference(q, c, cq, r, eo, el);
  AttentionOutput out = trtllm_batch_decode_with_kv_cache(
      q, c.cache(), workspace(), c.block_tables, c.seq_lens, 10, 0.2, 1.0, -1, std::nullopt,
      DType::kFloat16, std::nullopt, std::nullopt, std::nullopt, "NHD", std::nullopt, "auto",
      std::nullopt, 1.0, std::nullopt, 3, int_tensor(cq));
  ASSERT_EQ(out.out.dtype(), DType::kFloat16);  // out_dtype may differ from q's 16-bit dtype
  EXPECT_TRUE(testing::all_close(out.out, eo, testing::attention_tolerance(DType::kFloat16)));
  EXPECT_FI_ERROR(trtllm_batch_decode_with_kv_cache(
                      q, c.cache(), workspace(), c.block_tables, c.seq_lens, 10, 0.2, 1.0, -1,
                      std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, "NHD",
                      std::nullopt, "auto", std::nullopt, 1.0, std::nullopt, 2, int_tensor(cq)),
                  kDecode, "max_q_len");
}

TEST(TrtllmContext, BadInput) {
  BlockCache c = make_cache({5, 9}, 4, 2, 64, DType::kFloat16, true, true, 7);
  Tensor q = testing::rand_tensor({7, 4, 64}, DType::kFloat16, 1);
  auto call = [&](const Tensor& cq, const Tensor& ck, int64_t max_q, int64_t max_kv,
                  int64_t batch = 2) {
    return trtllm_batch_context_with_kv_cache(q, c.cache(), workspace(), c.block_tables, c.seq_lens,
                                              max_q, max_kv, 0.1, 1.0, batch, cq, ck);
  };
  const Tensor cq = int_tensor({0, 3, 7}), ck = int_tensor({0, 5, 14});
  EXPECT_NO_THROW(call(cq, ck, 4, 9));
  EXPECT_FI_ERROR(call(cq, ck, 3, 9), kContext, "max_q_len");
  EXPECT_FI_ERROR(call(cq, ck, 4, 8), kContext, "max_kv_len");
  // cum_seq_lens_kv is not read for KV positions (seq_lens is): the cumulative page counts
  // vLLM and upstream's tests pass (5 and 9 keys in pages of 4: 2 and 3 pages) are accepted,
  // as are token counts; only its form is checked.
  EXPECT_NO_THROW(call(cq, int_tensor({0, 2, 5}), 4, 9));
  EXPECT_FI_ERROR(call(cq, int_tensor({0, 2}), 4, 9), kContext, "cum_seq_lens_kv");
  EXPECT_FI_ERROR(call(cq, ck.to(DType::kInt64), 4, 9), kContext, "cum_seq_lens_kv");
  EXPECT_FI_ERROR(call(cq, Tensor(), 4, 9), kContext, "cum_seq_lens_kv");
  EXPECT_FI_ERROR(call(int_tensor({0, 3, 6}), ck, 4, 9), kContext, "query");
  EXPECT_FI_ERROR(call(int_tensor({0, 4, 3}), ck, 4, 9), kContext, "cum_seq_lens_q");
  EXPECT_FI_ERROR(call(cq, ck, 4, 9, 3), kContext, "cum_seq_lens_q");
  // Causal needs kv_len >= qo_len: 6 queries against 5 keys.
  EXPECT_FI_ERROR(call(int_tensor({0, 6, 7}), ck, 6, 9), kContext, "seq_lens");
  EXPECT_FI_ERROR(
      trtllm_batch_context_with_kv_cache(
          q, c.cache(), workspace(), c.block_tables, c.seq_lens, 4, 9, 0.1, 1.0, 2, cq, ck, -1,
          std::nullopt, std::nullopt, std::nullopt, std::nullopt, "HND", std::nullopt, std::nullopt,
          std::nullopt, std::nullopt, true, true, std::nullopt, false, std::nullopt, true),
      kContext, "use_fp16_softmax");
}

// Both entry points, called as the engines call them, record and replay identically; the
// block table's unread -1 entries and the workspace are replayed as recorded.
TEST(TrtllmAttention, RecordAndReplay) {
  BlockCache c = make_cache({5, 9}, 4, 2, 64, DType::kBFloat16, true, true, 17);
  Tensor sinks = testing::rand_tensor({4}, DType::kFloat32, 3);
  std::vector<testing::RecordingObserver::Call> calls;
  {
    testing::RecordingScope scope;
    Tensor q = testing::rand_tensor({2, 4, 64}, DType::kBFloat16, 1);
    Tensor out = Tensor::empty({2, 4, 64}, DType::kBFloat16);
    trtllm_batch_decode_with_kv_cache(q, c.cache(), workspace(), c.block_tables, c.seq_lens, 9,
                                      0.125, 1.0, -1, out, std::nullopt, std::nullopt, std::nullopt,
                                      sinks);
    Tensor qc = testing::rand_tensor({7, 4, 64}, DType::kBFloat16, 2);
    trtllm_batch_context_with_kv_cache(qc, c.cache(), workspace(), c.block_tables, c.seq_lens, 4, 9,
                                       0.125, 1.0, 2, int_tensor({0, 3, 7}), int_tensor({0, 5, 14}),
                                       -1, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                       "HND", std::nullopt, sinks, std::nullopt, std::nullopt, true,
                                       true, std::nullopt, true);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 2u);
  for (const auto& call : calls) {
    SCOPED_TRACE(call.name);
    EXPECT_TRUE(testing::replays_identically(call));
  }
  EXPECT_TRUE(calls[1].result.is_sequence());  // (out, lse) with return_lse
}

TEST(TrtllmAttention, Declarations) {
  const OpDecl* d = OpRegistry::global().find(kDecode);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->module, "flashinfer.decode");
  const OpDecl* p = OpRegistry::global().find(kContext);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->module, "flashinfer.prefill");
  EXPECT_TRUE(op_has_backend(kDecode, DeviceType::kCPU));
  EXPECT_TRUE(op_has_backend(kContext, DeviceType::kCPU));
}

// ---- NaN propagation and sinks in the other attention ops (the shared kernel) ----

// Every attention op: NaN in q's head 0 of row 0 makes exactly that (row, head) NaN (its LSE
// too); every other value stays finite.
TEST(AttentionNan, EveryOpPropagatesNanScores) {
  const int64_t d = 64;
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged({6, 9}, 4, 1, d, DType::kFloat16, false, true, 5, kd, vd);
  auto nan_q = [&](int64_t rows, int64_t heads) {
    Tensor q = testing::rand_tensor({rows, heads, d}, DType::kFloat16, 2, -1.0, 1.0);
    q.select(0, 0).select(0, 0).select(0, 3).fill_(std::nan(""));
    return q;
  };
  // Output [rows, heads, d] and lse [rows, heads]: NaN exactly at row 0, head 0.
  auto check = [&](const AttentionOutput& r, const char* what) {
    SCOPED_TRACE(what);
    const int64_t heads = r.out.size(1);
    const std::vector<double> o = r.out.to_double_vector(), l = r.lse.to_double_vector();
    for (std::size_t i = 0; i < o.size(); ++i) {
      EXPECT_EQ(std::isnan(o[i]), i < static_cast<std::size_t>(d)) << i;
    }
    for (std::size_t i = 0; i < l.size(); ++i) EXPECT_EQ(std::isnan(l[i]), i == 0) << i;
    (void)heads;
  };
  {
    Tensor q = nan_q(1, 2).select(0, 0);
    Tensor k = testing::rand_tensor({7, 1, d}, DType::kFloat16, 3);
    AttentionOutput r = single_decode_with_kv_cache(q, k, k, "NHD", "NONE", false, std::nullopt,
                                                    std::nullopt, std::nullopt, -1, std::nullopt,
                                                    std::nullopt, std::nullopt, std::nullopt, true);
    check({r.out.unsqueeze(0), r.lse.unsqueeze(0)}, "single_decode_with_kv_cache");
  }
  {
    Tensor q = nan_q(3, 2);
    Tensor k = testing::rand_tensor({7, 1, d}, DType::kFloat16, 3);
    AttentionOutput r = single_prefill_with_kv_cache(
        q, k, k, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
        true, "NHD", "NONE", false, std::nullopt, -1, std::nullopt, std::nullopt, std::nullopt,
        "auto", true);
    check(r, "single_prefill_with_kv_cache");
  }
  {
    BatchDecodeWithPagedKVCacheWrapper w(workspace());
    w.plan(f.indptr, f.indices, f.last_page_len, 2, 1, d, 4);
    AttentionRunOptions ro;
    ro.return_lse = true;
    check(w.run(nan_q(2, 2), f.cache(), ro), "BatchDecodeWithPagedKVCacheWrapper.run");
  }
  {
    BatchPrefillWithPagedKVCacheWrapper w(workspace());
    PrefillPlanOptions po;
    po.causal = true;
    w.plan(int_tensor({0, 3, 5}), f.indptr, f.indices, f.last_page_len, 2, 1, d, 4, po);
    AttentionRunOptions ro;
    ro.return_lse = true;
    check(w.run(nan_q(5, 2), f.cache(), ro), "BatchPrefillWithPagedKVCacheWrapper.run");
  }
  {
    BatchPrefillWithRaggedKVCacheWrapper w(workspace());
    w.plan(int_tensor({0, 3, 5}), int_tensor({0, 6, 15}), 2, 1, d);
    Tensor k = testing::rand_tensor({15, 1, d}, DType::kFloat16, 4);
    AttentionRunOptions ro;
    ro.return_lse = true;
    check(w.run(nan_q(5, 2), k, k, ro), "BatchPrefillWithRaggedKVCacheWrapper.run");
  }
  {
    BlockCache c = make_cache({6, 9}, 4, 1, d, DType::kFloat16, true, true, 8);
    check(trtllm_batch_decode_with_kv_cache(
              nan_q(2, 2), c.cache(), workspace(), c.block_tables, c.seq_lens, 9, 0.1, 1.0, -1,
              std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, "HND",
              std::nullopt, "auto", 1, 1.0, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
              std::nullopt, true, std::nullopt, true),
          kDecode);
    check(trtllm_batch_context_with_kv_cache(
              nan_q(5, 2), c.cache(), workspace(), c.block_tables, c.seq_lens, 3, 9, 0.1, 1.0, 2,
              int_tensor({0, 3, 5}), int_tensor({0, 6, 15}), -1, std::nullopt, std::nullopt,
              std::nullopt, std::nullopt, "HND", std::nullopt, std::nullopt, std::nullopt,
              std::nullopt, true, true, std::nullopt, true),
          kContext);
  }
}

// Causal prefill: a NaN key at position 3 reaches only the queries that see it.
TEST(AttentionNan, CausallyMaskedNanKeyIsNotRead) {
  Tensor q = testing::rand_tensor({6, 1, 64}, DType::kBFloat16, 1, -1.0, 1.0);
  Tensor k = testing::rand_tensor({6, 1, 64}, DType::kBFloat16, 2, -1.0, 1.0);
  k.select(0, 3).select(0, 0).select(0, 0).fill_(std::nan(""));
  AttentionOutput r = single_prefill_with_kv_cache(
      q, k, k, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
      true, "NHD", "NONE", false, std::nullopt, -1, std::nullopt, std::nullopt, std::nullopt,
      "auto", true);
  const std::vector<double> l = r.lse.to_double_vector();
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(std::isnan(l[i]), i >= 3) << i;
}

// The wrappers' run() takes sinks: the fp64 formula folds exp(sink) into the denominator.
TEST(AttentionSinks, BatchDecodeWrapperMatchesFp64) {
  const int64_t hq = 4, hkv = 2, d = 64;
  const std::vector<int32_t> lens{5, 40, 17};
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged(lens, 16, hkv, d, DType::kBFloat16, true, false, 9, kd, vd);
  BatchDecodeWithPagedKVCacheWrapper w(workspace(), "HND");
  BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
  po.q_data_type = DType::kBFloat16;
  po.fixed_split_size = 1;  // split KV: the sink must join once, in the merge
  w.plan(f.indptr, f.indices, f.last_page_len, hq, hkv, d, 16, po);
  ASSERT_TRUE(w.split_kv());
  Tensor q = testing::rand_tensor({3, hq, d}, DType::kBFloat16, 4, -1.0, 1.0);
  Tensor sinks = testing::rand_tensor({hq}, DType::kFloat32, 5, -1.0, 4.0);
  AttentionRunOptions ro;
  ro.sinks = sinks;
  ro.return_lse = true;
  AttentionOutput r = w.run(q, f.cache(), ro);
  const std::vector<double> sk = sinks.to_double_vector();
  std::vector<double> eo, el;
  for (std::size_t b = 0; b < lens.size(); ++b) {
    std::vector<double> o, l;
    testing::ref_attention(testing::rows_of(q.to_double_vector(), b, b + 1, hq * d), kd[b], vd[b],
                           1, lens[b], hq, hkv, d, d, {}, o, l);
    for (int64_t h = 0; h < hq; ++h) {
      // lse' = log2(2^lse + e^sink); o' = o * 2^(lse - lse').
      const double total = std::log2(std::exp2(l[h]) + std::exp(sk[h]));
      for (int64_t x = 0; x < d; ++x) eo.push_back(o[h * d + x] * std::exp2(l[h] - total));
      el.push_back(total);
    }
  }
  EXPECT_TRUE(testing::all_close(r.out, eo, testing::attention_tolerance(DType::kBFloat16)));
  EXPECT_TRUE(testing::all_close(r.lse, el, {1e-4, 1e-5}));
}

// xqa_batch_decode_with_kv_cache: NHD by default, variable query counts through q_cu_seq_lens.
// A 16-bit cache takes upstream's xqa scales: its kernel applies kv_scale = bmm2_scale * o_scale
// only to a quantized cache, after its Python divided q_scale by it, so the scores are scaled by
// bmm1 / (bmm2 * o_scale) and the output by nothing.
TEST(XqaDecode, MatchesFp64) {
  BlockCache c = make_cache({8, 21, 3}, 4, 2, 64, DType::kBFloat16, false, true, 31);
  const std::vector<int32_t> cq{0, 2, 4, 5};
  Tensor q = testing::rand_tensor({5, 4, 64}, DType::kBFloat16, 8, -1.0, 1.0);
  Tensor sinks = testing::rand_tensor({4}, DType::kFloat32, 9);
  Ref r;
  r.bmm1 = 0.15 / (0.5 * 3.0);
  r.bmm2 = 1.0;
  r.sinks = sinks.to_double_vector();
  std::vector<double> eo, el;
  reference(q, c, cq, r, eo, el);
  Tensor o = xqa_batch_decode_with_kv_cache(
      q, c.cache(), workspace(), c.block_tables, c.seq_lens, 21, 0.15, 0.5, -1, std::nullopt, sinks,
      "NHD", std::nullopt, 2, 3.0, std::nullopt, std::nullopt, int_tensor(cq));
  EXPECT_TRUE(testing::all_close(o, eo, testing::attention_tolerance(DType::kBFloat16)));
  const char* op = "xqa_batch_decode_with_kv_cache";
  EXPECT_FI_ERROR(
      xqa_batch_decode_with_kv_cache(q, c.cache(), workspace(), c.block_tables, c.seq_lens, 21,
                                     0.15, 0.5, -1, std::nullopt, sinks, "NHD", std::nullopt, 1,
                                     3.0, std::nullopt, std::nullopt, int_tensor(cq)),
      op, "q_cu_seq_lens");
  EXPECT_FI_ERROR(
      xqa_batch_decode_with_kv_cache(q, c.cache(), workspace(), c.block_tables, c.seq_lens, 21,
                                     0.15, 0.5, -1, std::nullopt, sinks, "NHD", std::nullopt, 2,
                                     0.0, std::nullopt, std::nullopt, int_tensor(cq)),
      op, "o_scale");
  EXPECT_FI_ERROR(xqa_batch_decode_with_kv_cache(q.slice(0, 0, 4), c.cache(), workspace(),
                                                 c.block_tables, c.seq_lens, 21),
                  op, "seq_lens");
}

// workspace_size(): plan's arguments, (float, int) bytes; with enough workspace the plan it
// describes is the plan that runs, and its float figure is what that plan's partials take.
TEST(WorkspaceSize, MatchesThePlanItDescribes) {
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged({300, 5, 70}, 16, 2, 64, DType::kFloat16, false, true, 3, kd, vd);
  BatchDecodeWithPagedKVCacheWrapper w(workspace());  // 64 KiB: the split plan takes 13520 B
  BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
  po.fixed_split_size = 2;  // split: partials of 32 tokens
  const WorkspaceSizes ws =
      w.workspace_size(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 16, po);
  // 300, 5 and 70 tokens are 19, 1 and 5 pages: in chunks of 2 pages, 10 and 3 partial rows (a
  // one-chunk request is not split): 13 rows x 4 heads x (64 + 1) fp32.
  EXPECT_EQ(ws.float_workspace_size, 13 * 4 * 65 * 4);
  EXPECT_GT(ws.int_workspace_size, 0);
  w.plan(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 16, po);
  EXPECT_TRUE(w.split_kv());
  po.disable_split_kv = true;
  EXPECT_EQ(
      w.workspace_size(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 16, po).float_workspace_size,
      0);
  EXPECT_FI_ERROR(w.workspace_size(f.indptr, f.indices, f.last_page_len, 4, 3, 64, 16),
                  "BatchDecodeWithPagedKVCacheWrapper.workspace_size", "num_kv_heads");

  BatchPrefillWithPagedKVCacheWrapper p(workspace());
  PrefillPlanOptions pp;
  pp.causal = true;
  pp.disable_split_kv = true;
  const WorkspaceSizes pw = p.workspace_size(int_tensor({0, 3, 4, 6}), f.indptr, f.indices,
                                             f.last_page_len, 4, 2, 64, 16, pp);
  EXPECT_EQ(pw.float_workspace_size, 0);
  EXPECT_GT(pw.int_workspace_size, 0);
  // Recorded as upstream returns it: a (float, int) tuple of ints; replays identically.
  std::vector<testing::RecordingObserver::Call> calls;
  {
    testing::RecordingScope scope;
    w.workspace_size(f.indptr, f.indices, f.last_page_len, 4, 2, 64, 16);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 1u);
  ASSERT_TRUE(calls[0].result.is_sequence());
  EXPECT_EQ(calls[0].result.items().size(), 2u);
}

// cudnn_batch_prefill_with_kv_cache as the vision encoders call it (ragged K/V, element offsets,
// lengths shaped [batch, 1, 1, 1]) and with a block table, against the fp64 formula.
TEST(CudnnPrefill, MatchesFp64) {
  const char* op = "cudnn_batch_prefill_with_kv_cache";
  const std::vector<int32_t> lq{4, 7, 1}, lk{6, 7, 9};
  const int64_t hq = 4, hkv = 2, d = 64;
  Tensor q = testing::rand_tensor({12, hq, d}, DType::kFloat16, 1, -1.0, 1.0);
  Tensor k = testing::rand_tensor({22, hkv, d}, DType::kFloat16, 2, -1.0, 1.0);
  Tensor v = testing::rand_tensor({22, hkv, d}, DType::kFloat16, 3, -1.0, 1.0);
  const Tensor lens_q = int_tensor(lq).view({3, 1, 1, 1});
  const Tensor lens_k = int_tensor(lk).view({3, 1, 1, 1});
  const Tensor off_q = int_tensor({0, 4 * hq * d, 11 * hq * d});
  const Tensor off_k = int_tensor({0, 6 * hkv * d, 13 * hkv * d});
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal);
    CudnnPrefillResult r = cudnn_batch_prefill_with_kv_cache(
        q, k, v, 0.1, workspace(), 7, 9, lens_q, lens_k, std::nullopt, causal, true, std::nullopt,
        std::nullopt, 2.0, off_q, off_q, off_k, off_k);
    std::vector<double> eo, el;
    int64_t q0 = 0, k0 = 0;
    for (std::size_t b = 0; b < lq.size(); ++b) {
      testing::RefOptions ro;
      ro.sm_scale = 0.1;
      ro.causal = causal;
      ro.v_scale = 2.0;
      std::vector<double> o, l;
      testing::ref_attention(testing::rows_of(q.to_double_vector(), q0, q0 + lq[b], hq * d),
                             testing::rows_of(k.to_double_vector(), k0, k0 + lk[b], hkv * d),
                             testing::rows_of(v.to_double_vector(), k0, k0 + lk[b], hkv * d), lq[b],
                             lk[b], hq, hkv, d, d, ro, o, l);
      eo.insert(eo.end(), o.begin(), o.end());
      el.insert(el.end(), l.begin(), l.end());
      q0 += lq[b];
      k0 += lk[b];
    }
    EXPECT_TRUE(testing::all_close(r.out, eo, testing::attention_tolerance(DType::kFloat16)));
    EXPECT_TRUE(testing::all_close(r.lse, el, {1e-4, 1e-5}));
  }
  // Without return_lse upstream's tuple still has two items, the second None.
  std::vector<testing::RecordingObserver::Call> calls;
  {
    testing::RecordingScope scope;
    cudnn_batch_prefill_with_kv_cache(q, k, v, 0.1, workspace(), 7, 9, lens_q, lens_k, std::nullopt,
                                      false, false);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 1u);
  ASSERT_TRUE(calls[0].result.is_sequence());
  EXPECT_TRUE(calls[0].result.items()[1].is_none());
  EXPECT_TRUE(testing::replays_identically(calls[0]));

  // Paged: the same keys through a block table of 4-token HND pages.
  BlockCache c = make_cache(lk, 4, hkv, d, DType::kFloat16, true, true, 5);
  Ref ref;
  ref.bmm1 = 0.1;
  ref.causal = true;
  std::vector<double> eo, el;
  reference(q, c, {0, 4, 11, 12}, ref, eo, el);
  CudnnPrefillResult r = cudnn_batch_prefill_with_kv_cache(
      q, c.k, c.v, 0.1, workspace(), 7, 9, lens_q, c.seq_lens, c.block_tables, true, false);
  EXPECT_TRUE(testing::all_close(r.out, eo, testing::attention_tolerance(DType::kFloat16)));
  EXPECT_FALSE(r.lse.defined());

  // Bad input names the argument.
  EXPECT_FI_ERROR(cudnn_batch_prefill_with_kv_cache(q, k, v, 0.1, workspace(), 6, 9, lens_q, lens_k,
                                                    std::nullopt, false, false),
                  op, "max_token_per_sequence");
  EXPECT_FI_ERROR(cudnn_batch_prefill_with_kv_cache(q, k, v, 0.1, workspace(), 7, 8, lens_q, lens_k,
                                                    std::nullopt, false, false),
                  op, "max_sequence_kv");
  EXPECT_FI_ERROR(cudnn_batch_prefill_with_kv_cache(q, k, v, 0.1, workspace(), 7, 9, std::nullopt,
                                                    lens_k, std::nullopt, false, false),
                  op, "actual_seq_lens_q");
  EXPECT_FI_ERROR(cudnn_batch_prefill_with_kv_cache(
                      q, k, v, 0.1, workspace(), 7, 9, lens_q, lens_k, std::nullopt, false, false,
                      std::nullopt, std::nullopt, std::nullopt, int_tensor({0, 5, 1}), off_q),
                  op, "batch_offsets_q");
  EXPECT_FI_ERROR(cudnn_batch_prefill_with_kv_cache(
                      q, k, v, 0.1, workspace(), 7, 9, lens_q, lens_k, std::nullopt, false, false,
                      std::nullopt, std::nullopt, std::nullopt, off_q, off_q,
                      int_tensor({0, 6 * hkv * d, 100 * hkv * d}), std::nullopt),
                  op, "k_cache");
  EXPECT_FI_ERROR(cudnn_batch_prefill_with_kv_cache(
                      q, k, v, 0.1, workspace(), 7, 9, lens_q, lens_k, std::nullopt, false, false,
                      std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                      std::nullopt, std::nullopt, std::nullopt, "words"),
                  op, "batch_offsets_units");
}

// Upstream 0.7.4's cudnn_batch_prefill_with_kv_cache(lse_base, window_left, sinks) on a paged
// cache: window_left W keeps keys [p - W, ...] of query position p, sinks add exp(sinks[h]) to
// the denominator and the LSE (against the fp64 formula, causal and not); lse_base "ln" returns
// the base-2 LSE times fp32 ln 2; upstream's refusals with its texts.
TEST(CudnnPrefill, Upstream074WindowSinksAndLseBase) {
  const char* op = "cudnn_batch_prefill_with_kv_cache";
  const std::vector<int32_t> lens{9, 20, 5}, qlens{9, 6, 2};
  BlockCache c = make_cache(lens, 4, 2, 64, DType::kFloat16, true, true, 51);
  std::vector<int32_t> cq{0};
  for (int32_t l : qlens) cq.push_back(cq.back() + l);
  Tensor q = testing::rand_tensor({cq.back(), 4, 64}, DType::kFloat16, 52, -1.0, 1.0);
  const Tensor sinks = testing::rand_tensor({4}, DType::kFloat32, 53, -1.0, 1.0);
  auto run = [&](bool causal, std::optional<int64_t> window, std::optional<Tensor> sk,
                 std::string_view base, std::optional<std::string> backend = std::nullopt) {
    return cudnn_batch_prefill_with_kv_cache(
        q, c.k, c.v, 0.125, workspace(), 9, 20, int_tensor(qlens), int_tensor(lens), c.block_tables,
        causal, true, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
        std::nullopt, std::nullopt, std::nullopt, "elements", std::nullopt, std::nullopt, false,
        backend, std::nullopt, base, window, sk);
  };
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal);
    Ref r;
    r.bmm1 = 0.125;
    r.causal = causal;
    r.window_left = 3;
    r.sinks = sinks.to_double_vector();
    std::vector<double> eo, el;
    reference(q, c, cq, r, eo, el);
    CudnnPrefillResult got = run(causal, 3, sinks, "log2");
    EXPECT_TRUE(testing::all_close(got.out, eo, testing::attention_tolerance(DType::kFloat16)));
    EXPECT_TRUE(testing::all_close(got.lse, el, {1e-4, 1e-5}));
    CudnnPrefillResult ln = run(causal, 3, sinks, "ln");
    EXPECT_EQ(testing::bytes_of(ln.out), testing::bytes_of(got.out));
    const auto l2 = got.lse.to_double_vector(), le = ln.lse.to_double_vector();
    for (std::size_t i = 0; i < l2.size(); ++i) {
      ASSERT_EQ(static_cast<float>(le[i]), static_cast<float>(l2[i]) * 0.693147182464599609375f)
          << i;
    }
  }
  testing::expect_error_text([&] { (void)run(true, std::nullopt, std::nullopt, "log10"); }, op,
                             "lse_base", "lse_base must be one of ('log2', 'ln'), got 'log10'");
  testing::expect_error_text(
      [&] { (void)run(true, std::nullopt, Tensor::zeros({3}, DType::kFloat32), "log2"); }, op,
      "sinks", "sinks must be a contiguous float32 tensor of shape (num_heads_qo,) = (4,)");
  testing::expect_error_text(
      [&] { (void)run(true, std::nullopt, std::nullopt, "ln", std::string("cubin")); }, op,
      "lse_base", "the cubin cuDNN prefill path only returns base-2 LSE");
  testing::expect_error_text(
      [&] { (void)run(true, 3, std::nullopt, "log2", std::string("cubin")); }, op, "window_left",
      "sliding windows and attention sinks require the cuDNN graph backend");
}

// vLLM's FlashInfer vision-encoder path (vit_attn_wrappers.flashinfer_wrapper) as it calls this
// op: q and k contiguous copies out of an interleaved [T, 3, H, D] QKV buffer, V a view into it
// (row stride 3 * H * D), element offsets per tensor (V's three times q's), the batch padded
// with empty requests (length 0, offset the total) and max_token_per_sequence a bucket above the
// longest request. The same call with "tokens" offsets and no lengths (newer upstream's form)
// and with "bytes" gives the same numbers.
TEST(CudnnPrefill, VisionEncoderCallWithAStridedVAndPaddedBatch) {
  const char* op = "cudnn_batch_prefill_with_kv_cache";
  const std::vector<int32_t> lens{5, 9, 3};
  const int64_t t = 17, h = 2, d = 64, hd = h * d;
  Tensor qkv = testing::rand_tensor({t, 3, h, d}, DType::kBFloat16, 11, -1.0, 1.0);
  const Tensor q = qkv.select(1, 0).contiguous();
  const Tensor k = qkv.select(1, 1).contiguous();
  const Tensor v = qkv.select(1, 2);  // strided: 3 * h * d elements a row
  ASSERT_EQ(v.stride(0), 3 * hd);
  // Padded to a bucket of 5 requests: two empty ones at the end.
  const std::vector<int32_t> padded{5, 9, 3, 0, 0};
  const std::vector<int32_t> cu{0, 5, 14, 17, 17, 17};
  std::vector<int32_t> qko, vo;
  for (int32_t c : cu) {
    qko.push_back(static_cast<int32_t>(c * hd));
    vo.push_back(static_cast<int32_t>(c * 3 * hd));
  }
  const Tensor seq = int_tensor(padded).view({5, 1, 1, 1});
  std::vector<double> eo;
  int64_t r0 = 0;
  const std::vector<double> qd = q.to_double_vector(), kd = k.to_double_vector(),
                            vd = v.contiguous().to_double_vector();
  for (int32_t n : lens) {
    testing::RefOptions ro;
    ro.sm_scale = 0.125;
    std::vector<double> o, l;
    testing::ref_attention(testing::rows_of(qd, r0, r0 + n, hd),
                           testing::rows_of(kd, r0, r0 + n, hd),
                           testing::rows_of(vd, r0, r0 + n, hd), n, n, h, h, d, d, ro, o, l);
    eo.insert(eo.end(), o.begin(), o.end());
    r0 += n;
  }
  CudnnPrefillResult r = cudnn_batch_prefill_with_kv_cache(
      q, k, v, 0.125, workspace(), 16, 16, seq, seq, std::nullopt, false, false, std::nullopt,
      std::nullopt, std::nullopt, int_tensor(qko), int_tensor(qko), int_tensor(qko),
      int_tensor(vo));
  EXPECT_TRUE(testing::all_close(r.out, eo, testing::attention_tolerance(DType::kBFloat16)));
  EXPECT_FALSE(r.lse.defined());

  // "tokens": the indptr itself for every tensor, lengths omitted.
  const Tensor cu_t = int_tensor(cu);
  CudnnPrefillResult rt = cudnn_batch_prefill_with_kv_cache(
      q, k, v, 0.125, workspace(), 16, 16, std::nullopt, std::nullopt, std::nullopt, false, false,
      std::nullopt, std::nullopt, std::nullopt, cu_t, cu_t, cu_t, cu_t, std::nullopt, "tokens");
  EXPECT_TRUE(testing::all_close(rt.out, r.out.to_double_vector(), {0.0, 0.0}));
  // "bytes": two bytes an element.
  std::vector<int32_t> qb, vb;
  for (std::size_t i = 0; i < cu.size(); ++i) {
    qb.push_back(qko[i] * 2);
    vb.push_back(vo[i] * 2);
  }
  CudnnPrefillResult rb = cudnn_batch_prefill_with_kv_cache(
      q, k, v, 0.125, workspace(), 16, 16, seq, seq, std::nullopt, false, false, std::nullopt,
      std::nullopt, std::nullopt, int_tensor(qb), int_tensor(qb), int_tensor(qb), int_tensor(vb),
      std::nullopt, "bytes");
  EXPECT_TRUE(testing::all_close(rb.out, r.out.to_double_vector(), {0.0, 0.0}));

  // V's offsets in q's units address other rows of V: refused, naming batch_offsets_v.
  EXPECT_FI_ERROR(cudnn_batch_prefill_with_kv_cache(
                      q, k, v, 0.125, workspace(), 16, 16, seq, seq, std::nullopt, false, false,
                      std::nullopt, std::nullopt, std::nullopt, int_tensor(qko), int_tensor(qko),
                      int_tensor(qko), int_tensor(qko)),
                  op, "batch_offsets_v");
  // Without lengths the offsets must be a "tokens" indptr.
  EXPECT_FI_ERROR(cudnn_batch_prefill_with_kv_cache(
                      q, k, v, 0.125, workspace(), 16, 16, std::nullopt, seq, std::nullopt, false,
                      false, std::nullopt, std::nullopt, std::nullopt, int_tensor(qko)),
                  op, "actual_seq_lens_q");
  // A decreasing "tokens" indptr names itself.
  EXPECT_FI_ERROR(
      cudnn_batch_prefill_with_kv_cache(q, k, v, 0.125, workspace(), 16, 16, std::nullopt,
                                        std::nullopt, std::nullopt, false, false, std::nullopt,
                                        std::nullopt, std::nullopt, int_tensor({0, 5, 3, 17}),
                                        std::nullopt, cu_t, std::nullopt, std::nullopt, "tokens"),
      op, "batch_offsets_q");
}

TEST(CudnnDecode, MatchesFp64) {
  const char* op = "cudnn_batch_decode_with_kv_cache";
  BlockCache c = make_cache({9, 30, 2}, 8, 2, 128, DType::kBFloat16, true, true, 41);
  Tensor q = testing::rand_tensor({3, 4, 128}, DType::kBFloat16, 2, -1.0, 1.0);
  Ref ref;
  ref.bmm1 = 0.09;
  std::vector<double> eo, el;
  reference(q, c, {0, 1, 2, 3}, ref, eo, el);
  Tensor o = cudnn_batch_decode_with_kv_cache(q, c.k, c.v, 0.09, workspace(), 30,
                                              c.seq_lens.view({3, 1, 1, 1}), c.block_tables);
  EXPECT_TRUE(testing::all_close(o, eo, testing::attention_tolerance(DType::kBFloat16)));
  // Without a block table request b's cache is page b: [batch, Hkv, max_seq, D].
  Tensor k = testing::rand_tensor({2, 1, 16, 64}, DType::kFloat16, 3, -1.0, 1.0);
  Tensor v = testing::rand_tensor({2, 1, 16, 64}, DType::kFloat16, 4, -1.0, 1.0);
  Tensor q2 = testing::rand_tensor({2, 2, 64}, DType::kFloat16, 5, -1.0, 1.0);
  Tensor o2 =
      cudnn_batch_decode_with_kv_cache(q2, k, v, 0.125, workspace(), 16, int_tensor({16, 5}));
  for (int64_t b = 0; b < 2; ++b) {
    const int64_t len = b == 0 ? 16 : 5;
    testing::RefOptions ro;
    ro.sm_scale = 0.125;
    std::vector<double> eo2, el2;
    testing::ref_attention(q2.select(0, b).to_double_vector(),
                           k.select(0, b).slice(1, 0, len).permute({1, 0, 2}).to_double_vector(),
                           v.select(0, b).slice(1, 0, len).permute({1, 0, 2}).to_double_vector(), 1,
                           len, 2, 1, 64, 64, ro, eo2, el2);
    EXPECT_TRUE(
        testing::all_close(o2.select(0, b), eo2, testing::attention_tolerance(DType::kFloat16)));
  }
  EXPECT_FI_ERROR(
      cudnn_batch_decode_with_kv_cache(q2, k, v, 0.125, workspace(), 15, int_tensor({16, 5})), op,
      "max_sequence_kv");
  EXPECT_FI_ERROR(
      cudnn_batch_decode_with_kv_cache(q2, k, v, 0.125, workspace(), 16, int_tensor({16})), op,
      "actual_seq_lens_kv");
  EXPECT_FI_ERROR(
      cudnn_batch_decode_with_kv_cache(q2, k, v, 0.125, workspace(), 16, int_tensor({16, 5}),
                                       std::nullopt, false, int_tensor({0, 1})),
      op, "batch_offsets_q");
}

// ---- Dumps: through this library's recorder, and written by Python as upstream writes them ----

namespace fs = std::filesystem;

fs::path temp_dump_dir(const char* name) {
  fs::path d = fs::temp_directory_path() / ("fi_trtllm_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  return d;
}

TEST(TrtllmDump, RecorderRoundTripReplays) {
  const fs::path dir = temp_dump_dir("rec");
  BlockCache c = make_cache({5, 9}, 4, 2, 64, DType::kFloat16, false, false, 23);
  {
    recorder::Config cfg;
    cfg.dump_dir = dir.string();
    recorder::start(cfg, [](const std::string&) {});
    Tensor q = testing::rand_tensor({2, 4, 64}, DType::kFloat16, 1);
    trtllm_batch_decode_with_kv_cache(q, c.cache(), workspace(), c.block_tables, c.seq_lens, 9,
                                      0.125, 0.5, 4, std::nullopt, std::nullopt, std::nullopt,
                                      std::nullopt, testing::rand_tensor({4}, DType::kFloat32, 2),
                                      "NHD");
    Tensor qc = testing::rand_tensor({7, 4, 64}, DType::kFloat16, 3);
    trtllm_batch_context_with_kv_cache(qc, c.cache(), workspace(), c.block_tables, c.seq_lens, 4, 9,
                                       0.125, 1.0, 2, int_tensor({0, 3, 7}), int_tensor({0, 5, 14}),
                                       -1, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                       "NHD");
    recorder::stop();
  }
  testing::replay_expecting_every_call_to_pass(dir, 2u);
  fs::remove_all(dir);
}

// ---- the calls upstream's tests make (issue 50) ------------------------------------------------

// One batch as tests/attention/test_trtllm_gen_attention.py builds it: q_lens in [1, max_q_len]
// (the last one max_q_len), in_kv_lens in [0, max_in_kv_len] (the last one the maximum),
// seq_lens = q_lens + in_kv_lens (a request's KV length, its queries its last tokens), unique
// random pages per request, cum_seq_lens_q the query prefix sums and cum_seq_lens_kv the
// per-request block-table offsets: the prefix sums of the page counts, not of the lengths.
struct UpstreamBatch {
  std::vector<int32_t> q_lens, seq_lens, q_indptr{0}, kv_indptr{0};
  int32_t max_q = 0, max_seq = 0;
  BlockCache cache;
};

UpstreamBatch upstream_batch(int64_t batch, int32_t max_q_len, int32_t max_in_kv_len,
                             int64_t page_size, int64_t hkv, int64_t d, uint32_t seed) {
  UpstreamBatch u;
  std::mt19937 rng(seed);
  for (int64_t b = 0; b < batch; ++b) {
    const bool last = b + 1 == batch;
    const int32_t q = last ? max_q_len : std::uniform_int_distribution<int32_t>(1, max_q_len)(rng);
    const int32_t in_kv =
        last ? max_in_kv_len : std::uniform_int_distribution<int32_t>(0, max_in_kv_len)(rng);
    u.q_lens.push_back(q);
    u.seq_lens.push_back(q + in_kv);
    u.q_indptr.push_back(u.q_indptr.back() + q);
    const auto pages = static_cast<int32_t>((q + in_kv + page_size - 1) / page_size);
    u.kv_indptr.push_back(u.kv_indptr.back() + pages);
    u.max_q = std::max(u.max_q, q);
    u.max_seq = std::max(u.max_seq, q + in_kv);
  }
  // The 5-D HND cache [pages, 2, Hkv, page_size, D] of the tests, bf16.
  u.cache = make_cache(u.seq_lens, page_size, hkv, d, DType::kBFloat16, true, false, seed);
  return u;
}

// The context call exactly as upstream's _test_trtllm_batch_prefill makes it (positional up to
// window_left, kv_layout and the rest by default): runs, matches the fp64 formula, and records and
// replays identically, in memory and through a dump directory. Before issue 50 it was refused
// ("request 0 spans 2 keys but seq_lens says 20").
TEST(TrtllmAttention, UpstreamTestCallsRecordAndReplay) {
  const int64_t hkv = 2, group = 4, d = 64, page_size = 16;
  UpstreamBatch u = upstream_batch(4, 11, 37, page_size, hkv, d, 5);
  const double sm_scale = 1.0 / std::sqrt(static_cast<double>(d));
  Tensor q =
      testing::rand_tensor({u.q_indptr.back(), hkv * group, d}, DType::kBFloat16, 7, -1.0, 1.0);
  Ref r;
  r.bmm1 = sm_scale;
  std::vector<double> eo, el;
  reference(q, u.cache, u.q_indptr, r, eo, el);
  auto context = [&] {
    return trtllm_batch_context_with_kv_cache(
        q, u.cache.cache(), workspace(), u.cache.block_tables, u.cache.seq_lens, u.max_q, u.max_seq,
        sm_scale, 1.0, 4, int_tensor(u.q_indptr), int_tensor(u.kv_indptr), -1);
  };
  // Decode with variable query lengths (q_len_per_req=None, max_q_len and cum_seq_lens_q), as
  // its generate_seq_lens_decode builds them.
  UpstreamBatch v = upstream_batch(3, 3, 29, page_size, hkv, d, 6);
  Tensor qd =
      testing::rand_tensor({v.q_indptr.back(), hkv * group, d}, DType::kBFloat16, 8, -1.0, 1.0);
  std::vector<double> edo, edl;
  reference(qd, v.cache, v.q_indptr, r, edo, edl);
  auto decode = [&] {
    return trtllm_batch_decode_with_kv_cache(
        qd, v.cache.cache(), workspace(), v.cache.block_tables, v.cache.seq_lens, v.max_seq,
        sm_scale, 1.0, -1, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
        "HND", std::nullopt, "auto", std::nullopt, 1.0, std::nullopt, v.max_q,
        int_tensor(v.q_indptr));
  };
  std::vector<testing::RecordingObserver::Call> calls;
  {
    testing::RecordingScope scope;
    const AttentionOutput oc = context();
    EXPECT_TRUE(testing::all_close(oc.out, eo, testing::attention_tolerance(DType::kBFloat16)));
    const AttentionOutput od = decode();
    EXPECT_TRUE(testing::all_close(od.out, edo, testing::attention_tolerance(DType::kBFloat16)));
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 2u);
  for (const auto& call : calls) {
    SCOPED_TRACE(call.name);
    EXPECT_TRUE(testing::replays_identically(call));
  }
  const fs::path dir = temp_dump_dir("upstream_calls");
  {
    recorder::Config cfg;
    cfg.dump_dir = dir.string();
    recorder::start(cfg, [](const std::string&) {});
    (void)context();
    (void)decode();
    recorder::stop();
  }
  testing::replay_expecting_every_call_to_pass(dir, 2u);
  fs::remove_all(dir);
}

// The same context call as upstream's recorder writes it (every argument by keyword, as vLLM
// passes them, with cum_seq_lens_kv the block-table offsets), written with the library's
// torch-format writer; the expected output is the fp64 formula in bf16. Replays and passes; a
// changed expected value is a mismatch.
TEST(TrtllmDump, UpstreamFormatContextWithPageOffsetsReplays) {
  const int64_t hkv = 2, group = 2, d = 64, page_size = 16;
  UpstreamBatch u = upstream_batch(2, 7, 20, page_size, hkv, d, 9);
  Tensor q =
      testing::rand_tensor({u.q_indptr.back(), hkv * group, d}, DType::kBFloat16, 3, -1.0, 1.0);
  Ref r;
  r.bmm1 = 0.125;
  std::vector<double> eo, el;
  reference(q, u.cache, u.q_indptr, r, eo, el);
  // The page counts differ from the key counts, so the old check would have refused this.
  ASSERT_NE(u.kv_indptr[1], u.seq_lens[0]);
  testing::UpstreamCall call;
  call.function_name = "trtllm_batch_context_with_kv_cache";
  call.module = "flashinfer.prefill";
  call.inputs = {{"kwarg_query", q},
                 {"kwarg_kv_cache", u.cache.cache5},
                 {"kwarg_workspace_buffer", Tensor::zeros({4096}, DType::kUInt8)},
                 {"kwarg_block_tables", u.cache.block_tables},
                 {"kwarg_seq_lens", u.cache.seq_lens},
                 {"kwarg_cum_seq_lens_q", int_tensor(u.q_indptr)},
                 {"kwarg_cum_seq_lens_kv", int_tensor(u.kv_indptr)}};
  call.input_metadata = {{"kwarg_max_q_len", u.max_q}, {"kwarg_max_kv_len", u.max_seq},
                         {"kwarg_bmm1_scale", 0.125},  {"kwarg_bmm2_scale", 1.0},
                         {"kwarg_batch_size", 2},      {"kwarg_window_left", -1},
                         {"kwarg_sinks", nullptr},     {"kwarg_out_dtype", nullptr},
                         {"kwarg_kv_layout", "HND"},   {"kwarg_enable_pdl", nullptr}};
  const Shape shape = q.shape();
  call.outputs = {{"result", Tensor::from_vector(eo, shape, DType::kFloat32).to(DType::kBFloat16)}};
  const fs::path root = temp_dump_dir("upstream_fmt");
  const fs::path good = testing::write_upstream_call(root, 1, call);
  const replay::Result ok = replay::replay_from_dump(good.string());
  EXPECT_EQ(ok.status, replay::Status::kPassed) << ok.error << ok.note;
  for (double& x : eo) x += 0.25;
  call.outputs[0].second = Tensor::from_vector(eo, shape, DType::kFloat32).to(DType::kBFloat16);
  const fs::path bad = testing::write_upstream_call(root, 2, call);
  EXPECT_EQ(replay::replay_from_dump(bad.string()).status, replay::Status::kMismatch);
  fs::remove_all(root);
}

// Two calls written by Python the way upstream's recorder writes them (the shared writer,
// tests/util/upstream_dump_py.h), with the keyword arguments vLLM and SGLang pass: decode with
// vLLM's HND view of a 5-D cache (a permuted, non-contiguous tensor) and sinks; context with
// SGLang's (k_cache, v_cache) tuple. The expected outputs are an fp64 formula computed in Python.
TEST(TrtllmDump, UpstreamWrittenDumpReplaysHere) {
  const std::string body = R"PY(
import math
torch.manual_seed(0)
P, S, H, HQ, D = 8, 4, 2, 4, 64

def attend(q, k, v, kv_len, qo_len, scale, bmm2, sinks, causal):
    o = torch.zeros(qo_len, HQ, D, dtype=torch.float64)
    for i in range(qo_len):
        pos = kv_len - qo_len + i
        for h in range(HQ):
            g = h // (HQ // H)
            n = pos + 1 if causal else kv_len
            s = (k[:n, g, :] @ q[i, h].double()) * scale
            m = s.max().item()
            if sinks is not None:
                m = max(m, sinks[h].item())
            e = torch.exp(s - m)
            den = e.sum().item() + (math.exp(sinks[h].item() - m) if sinks is not None else 0.0)
            o[i, h] = (e[:, None] * v[:n, g, :]).sum(0) / den * bmm2
    return o

def gather(cache, table, b, kv_len, hnd):
    rows = []
    for t in range(kv_len):
        page = cache[int(table[b, t // S])]
        rows.append(page[:, t % S, :] if hnd else page[t % S, :, :])
    return torch.stack(rows).double()

def tensor_meta(t, key):
    return {"type": "torch.Tensor", "shape": list(t.shape), "dtype": str(t.dtype),
            "stride": list(t.stride()), "device": "cuda:0", "requires_grad": False,
            "is_contiguous": t.is_contiguous(), "tensor_key": key}

# vLLM decode: kv_cache [P, 2, S, H, D] storage permuted to the HND view [P, 2, H, S, D].
storage = torch.randn(P, 2, S, H, D).to(torch.bfloat16)
kv = storage.permute(0, 1, 3, 2, 4)
q = torch.randn(2, HQ, D).to(torch.bfloat16)
table = torch.tensor([[3, 1, -1], [0, 5, 2]], dtype=torch.int32)
lens = torch.tensor([7, 9], dtype=torch.int32)
sinks = torch.randn(HQ, dtype=torch.float32)
scale, bmm2 = 1.0 / math.sqrt(D), 0.75
out = torch.stack([attend(q[b:b + 1], gather(kv[:, 0], table, b, int(lens[b]), True),
                          gather(kv[:, 1], table, b, int(lens[b]), True), int(lens[b]), 1,
                          scale, bmm2, sinks, False)[0] for b in range(2)])
record("trtllm_batch_decode_with_kv_cache", "flashinfer.decode",
      {"kwarg_query": q, "kwarg_kv_cache": kv, "kwarg_workspace_buffer": torch.zeros(4096, dtype=torch.uint8),
       "kwarg_block_tables": table, "kwarg_seq_lens": lens, "kwarg_sinks": sinks},
      {"kwarg_max_seq_len": 9, "kwarg_bmm1_scale": scale,
       "kwarg_bmm2_scale": bmm2, "kwarg_window_left": -1, "kwarg_o_sf_scale": None,
       "kwarg_kv_layout": "HND"},
      out.to(torch.bfloat16))

# SGLang context: (k_cache, v_cache) tuple of NHD pages, causal, two requests.
kc = torch.randn(P, S, H, D).to(torch.float16)
vc = torch.randn(P, S, H, D).to(torch.float16)
qlens, kvlens = [3, 5], [6, 9]
table = torch.tensor([[7, 2, -1], [4, 6, 1]], dtype=torch.int32)
qs = torch.randn(sum(qlens), HQ, D).to(torch.float16)
outs, q0 = [], 0
for b in range(2):
    outs.append(attend(qs[q0:q0 + qlens[b]], gather(kc, table, b, kvlens[b], False),
                       gather(vc, table, b, kvlens[b], False), kvlens[b], qlens[b], 0.1, 1.0,
                       None, True))
    q0 += qlens[b]
record("trtllm_batch_context_with_kv_cache", "flashinfer.prefill",
      {"kwarg_query": qs, "kwarg_kv_cache__0": kc, "kwarg_kv_cache__1": vc,
       "kwarg_workspace_buffer": torch.zeros(4096, dtype=torch.uint8), "kwarg_block_tables": table,
       "kwarg_seq_lens": torch.tensor(kvlens, dtype=torch.int32),
       "kwarg_cum_seq_lens_q": torch.tensor([0, 3, 8], dtype=torch.int32),
       "kwarg_cum_seq_lens_kv": torch.tensor([0, 6, 15], dtype=torch.int32)},
      {"kwarg_kv_cache": {"type": "tuple", "length": 2, "truncated": False,
                          "items": [tensor_meta(kc, "kwarg_kv_cache__0"),
                                    tensor_meta(vc, "kwarg_kv_cache__1")]},
       "kwarg_max_q_len": 5, "kwarg_max_kv_len": 9, "kwarg_bmm1_scale": 0.1,
       "kwarg_bmm2_scale": 1.0, "kwarg_batch_size": 2, "kwarg_window_left": -1,
       "kwarg_kv_layout": "NHD"},
      torch.cat(outs).to(torch.float16))
)PY";
  if (!testing::run_upstream_dump_script("fi_trtllm_upstream", body, 2)) {
    GTEST_SKIP() << "python3-torch not installed";
  }
}

}  // namespace
}  // namespace flashinfer
