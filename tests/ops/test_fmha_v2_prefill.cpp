// trtllm_fmha_v2_prefill: every input layout against an fp64 formula (bf16, fp16, fp8 e4m3 with a
// 16-bit or e4m3 out; GQA; causal, sliding window, chunked and padding masks; soft cap; sinks;
// ALiBi), ALiBi slopes and e4m3 rounding / saturation against hand-checked values, the
// softmax statistics, hand-checked golden values, bad input, record and replay, and a
// Python-written upstream-format dump in the keyword style engines use.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>

#include "api/attention_common.h"
#include "flashinfer/ops/backends.h"
#include "flashinfer/ops/fmha_v2_prefill.h"
#include "flashinfer/replay.h"
#include "kernels/cuda/prefill_shape.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"
#if FLASHINFER_TEST_HAVE_CUDART
#include "util/cuda_graph_util.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kOp = "trtllm_fmha_v2_prefill";
constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor i32(const std::vector<int32_t>& v, Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(v.size())};
  Tensor t = Tensor::empty(shape, DType::kInt32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

std::vector<int32_t> prefix(const std::vector<int32_t>& lens) {
  std::vector<int32_t> c{0};
  for (int32_t l : lens) c.push_back(c.back() + l);
  return c;
}

// One call's inputs and the logical per-request K/V the formula reads.
struct Case {
  std::string layout;
  FmhaV2Qkv qkv;
  Tensor q;  // [rows, H, D]
  std::vector<int32_t> q_lens, kv_lens;
  std::optional<Tensor> block_tables;
  std::vector<double> qd;  // q as doubles
  // key(b, j, g) / value(b, j, g): the D / Dv doubles of key j of request b, KV head g.
  std::vector<std::vector<double>> kr, vr;  // per request: [kv_len, Hkv, D]
  int64_t H = 0, hkv = 0, D = 0, dv = 0;
};

// Dense per-request doubles of a [tokens, Hkv, D] tensor by cumulative lengths.
std::vector<std::vector<double>> split(const Tensor& t, const std::vector<int32_t>& lens) {
  const std::vector<double> all = t.contiguous().to_double_vector();
  const int64_t row = t.size(1) * t.size(2);
  std::vector<std::vector<double>> r;
  int64_t at = 0;
  for (int32_t l : lens) {
    r.emplace_back(all.begin() + at * row, all.begin() + (at + l) * row);
    at += l;
  }
  return r;
}

Case make_case(const std::string& layout, DType d, std::vector<int32_t> q_lens,
               std::vector<int32_t> kv_lens, int64_t H, int64_t hkv, int64_t D, int64_t dv,
               uint64_t seed, int64_t page_size = 4) {
  Case c;
  c.layout = layout;
  c.q_lens = q_lens;
  c.kv_lens = kv_lens;
  c.H = H;
  c.hkv = hkv;
  c.D = D;
  c.dv = dv;
  const double r = dtype_is_fp8(d) ? 3.0 : 1.0;
  int64_t rows = 0, kv_rows = 0;
  for (int32_t l : q_lens) rows += l;
  for (int32_t l : kv_lens) kv_rows += l;
  if (layout == "PACKED_QKV") {
    Tensor p = testing::rand_tensor({rows, 3, H, D}, d, seed, -r, r);
    c.qkv = FmhaV2Qkv(p);
    c.q = p.select(1, 0);
    c.kr = split(p.select(1, 1), kv_lens);
    c.vr = split(p.select(1, 2), kv_lens);
  } else if (layout == "CONTIGUOUS_Q_KV") {
    c.q = testing::rand_tensor({rows, H, D}, d, seed, -r, r);
    Tensor kv = testing::rand_tensor({kv_rows, 2, hkv, D}, d, seed + 1, -r, r);
    c.qkv = FmhaV2Qkv(c.q, kv);
    c.kr = split(kv.select(1, 0), kv_lens);
    c.vr = split(kv.select(1, 1), kv_lens);
  } else if (layout == "SEPARATE_Q_K_V") {
    c.q = testing::rand_tensor({rows, H, D}, d, seed, -r, r);
    Tensor k = testing::rand_tensor({kv_rows, hkv, D}, d, seed + 1, -r, r);
    Tensor v = testing::rand_tensor({kv_rows, hkv, dv}, d, seed + 2, -r, r);
    c.qkv = FmhaV2Qkv(c.q, k, v);
    c.kr = split(k, kv_lens);
    c.vr = split(v, kv_lens);
  } else {
    const bool hnd = layout == "Q_PAGED_KV_HND";
    c.q = testing::rand_tensor({rows, H, D}, d, seed, -r, r);
    int64_t max_pages = 0, pages = 0;
    for (int32_t l : kv_lens) {
      max_pages = std::max<int64_t>(max_pages, (l + page_size - 1) / page_size);
      pages += (l + page_size - 1) / page_size;
    }
    pages += 2;  // pages no request uses
    Tensor cache = hnd ? testing::rand_tensor({pages, 2, hkv, page_size, D}, d, seed + 1, -r, r)
                       : testing::rand_tensor({pages, 2, page_size, hkv, D}, d, seed + 1, -r, r);
    // Pages handed out in reverse, padding entries -1 (never read).
    std::vector<int32_t> table(kv_lens.size() * std::max<int64_t>(max_pages, 1), -1);
    int32_t next = static_cast<int32_t>(pages) - 1;
    const std::vector<double> cd = cache.contiguous().to_double_vector();
    for (std::size_t b = 0; b < kv_lens.size(); ++b) {
      std::vector<double> kb, vb;
      for (int64_t j = 0; j < kv_lens[b]; ++j) {
        if (j % page_size == 0) table[b * std::max<int64_t>(max_pages, 1) + j / page_size] = next--;
        const int64_t page = table[b * std::max<int64_t>(max_pages, 1) + j / page_size];
        for (int which = 0; which < 2; ++which) {
          for (int64_t g = 0; g < hkv; ++g) {
            for (int64_t e = 0; e < D; ++e) {
              const int64_t t = j % page_size;
              const int64_t idx = hnd ? (((page * 2 + which) * hkv + g) * page_size + t) * D + e
                                      : (((page * 2 + which) * page_size + t) * hkv + g) * D + e;
              (which == 0 ? kb : vb).push_back(cd[idx]);
            }
          }
        }
      }
      c.kr.push_back(kb);
      c.vr.push_back(vb);
    }
    c.qkv = FmhaV2Qkv(c.q, cache);
    c.block_tables =
        i32(table, {static_cast<int64_t>(kv_lens.size()), std::max<int64_t>(max_pages, 1)});
  }
  c.qd = c.q.contiguous().to_double_vector();
  return c;
}

struct Opts {
  double bmm1 = 0.2, bmm2 = 1.0, cap = 0.0;
  std::string mask = "causal";
  int64_t window_left = -1, chunk = 0;
  std::vector<double> sinks;
  bool alibi = false;
};

// ALiBi slopes as the ALiBi paper defines them, in fp64: n = the largest power of two <= H,
// heads 0..n-1 get (2^(-8/n))^(h+1), the rest the odd powers (2^(-4/n))^(1, 3, 5, ...).
std::vector<double> alibi_slopes(int64_t H) {
  int64_t n = 1;
  while (n * 2 <= H) n *= 2;
  std::vector<double> r;
  for (int64_t h = 0; h < H; ++h) {
    r.push_back(h < n ? std::pow(std::pow(2.0, -8.0 / n), h + 1)
                      : std::pow(std::pow(2.0, -4.0 / n), 2 * (h - n) + 1));
  }
  return r;
}

// fp64 formula: o [rows, H, dv], stats (max, sum) [rows, H, 2].
void reference(const Case& c, const Opts& o, std::vector<double>& out, std::vector<double>& stats) {
  out.clear();
  stats.clear();
  const int64_t group = c.H / c.hkv;
  const std::vector<double> slopes = alibi_slopes(c.H);
  for (std::size_t b = 0; b < c.q_lens.size(); ++b) {
    const int64_t qo = c.q_lens[b], kv = c.kv_lens[b];
    int64_t row0 = 0;
    for (std::size_t x = 0; x < b; ++x) row0 += c.q_lens[x];
    for (int64_t i = 0; i < qo; ++i) {
      const int64_t pos = kv - qo + i;
      for (int64_t h = 0; h < c.H; ++h) {
        const int64_t g = h / group;
        std::vector<double> s;
        std::vector<int64_t> js;
        for (int64_t j = 0; j < kv; ++j) {
          const bool causal = o.mask != "padding";
          if (causal && j > pos) continue;
          if (o.window_left >= 0 && j < pos - o.window_left) continue;
          if (o.chunk > 0 && j < (pos / o.chunk) * o.chunk) continue;
          double dot = 0;
          for (int64_t e = 0; e < c.D; ++e) {
            dot += c.qd[((row0 + i) * c.H + h) * c.D + e] * c.kr[b][(j * c.hkv + g) * c.D + e];
          }
          double x = o.bmm1 * dot;
          if (o.cap > 0) x = o.cap * std::tanh(x / o.cap);
          if (o.alibi) x += slopes[h] * static_cast<double>(j - pos);
          s.push_back(x);
          js.push_back(j);
        }
        double m = -kInf, l = 0;
        for (double x : s) m = std::max(m, x);
        for (double x : s) l += std::exp(x - m);
        const double den = l + (o.sinks.empty() || s.empty() ? 0.0 : std::exp(o.sinks[h] - m));
        for (int64_t e = 0; e < c.dv; ++e) {
          double acc = 0;
          for (std::size_t n = 0; n < s.size(); ++n) {
            acc += std::exp(s[n] - m) * c.vr[b][(js[n] * c.hkv + g) * c.dv + e];
          }
          out.push_back(s.empty() ? 0.0 : o.bmm2 * acc / den);
        }
        stats.push_back(s.empty() ? -kInf : m);
        stats.push_back(l);
      }
    }
  }
}

// The call of `c` with options `o`. Its lengths (and sinks) go where its tensors are, as engines
// pass them (on CUDA: planned on the device), unless `host_lengths` keeps them on the host (the
// host plan).
AttentionOutput run(const Case& c, const Opts& o, std::optional<Tensor> out = std::nullopt,
                    std::optional<DType> out_dtype = std::nullopt, bool stats = false,
                    bool host_lengths = false) {
  const Device d = c.qkv.tensors().at(0).device();
  const Device ld = host_lengths ? Device::cpu() : d;
  std::optional<Tensor> sinks;
  if (!o.sinks.empty()) {
    Tensor t = Tensor::empty({c.H}, DType::kFloat32);
    for (int64_t h = 0; h < c.H; ++h) t.data<float>()[h] = static_cast<float>(o.sinks[h]);
    sinks = t.to(ld);
  }
  int32_t mq = 0, mkv = 0;
  for (int32_t l : c.q_lens) mq = std::max(mq, l);
  for (int32_t l : c.kv_lens) mkv = std::max(mkv, l);
  // On CUDA the split-KV partials live in the workspace: 64 MiB there (upstream's tests pass 128).
  const Tensor ws = Tensor::zeros({d.is_cuda() ? int64_t{64} << 20 : 256}, DType::kUInt8, d);
  return trtllm_fmha_v2_prefill(c.qkv, c.layout, ws, i32(c.kv_lens).to(ld), mq, mkv, o.bmm1, o.bmm2,
                                static_cast<int64_t>(c.q_lens.size()), i32(prefix(c.q_lens)).to(ld),
                                i32(prefix(c.kv_lens)).to(ld), c.block_tables, out, out_dtype,
                                sinks, o.alibi ? std::optional<std::string>("ALIBI") : std::nullopt,
                                o.cap > 0 ? std::optional<double>(o.cap) : std::nullopt, o.mask,
                                o.window_left, o.chunk, stats);
}

TEST(TrtllmFmhaV2Prefill, MatchesFp64FormulaOverLayoutsMasksAndDtypes) {
  struct Row {
    const char* layout;
    DType d, o;
    Opts opt;
  };
  Opts sw;
  sw.mask = "SLIDING_WINDOW";  // upstream's test passes upper case; the mode is lower-cased
  sw.window_left = 2;
  Opts ch;
  ch.mask = "chunked";
  ch.chunk = 4;
  Opts pad;
  pad.mask = "padding";
  Opts padcap = pad;
  padcap.cap = 0.5;
  Opts sink;
  sink.sinks = {0.5, -1.0, 2.0, 0.0};
  sink.bmm2 = 0.75;
  Opts cap;
  cap.cap = 0.3;
  cap.window_left = 3;  // a window under "causal" narrows it too
  Opts ali;
  ali.alibi = true;
  Opts alicap = cap;  // ALiBi after the soft cap, under a window
  alicap.alibi = true;
  Opts alipad = pad;
  alipad.alibi = true;
  const std::vector<Row> rows = {
      {"PACKED_QKV", DType::kBFloat16, DType::kBFloat16, Opts{}},
      {"PACKED_QKV", DType::kFloat16, DType::kFloat16, sw},
      {"CONTIGUOUS_Q_KV", DType::kBFloat16, DType::kBFloat16, ch},
      {"CONTIGUOUS_Q_KV", DType::kFloat8E4M3FN, DType::kBFloat16, sink},
      {"SEPARATE_Q_K_V", DType::kFloat16, DType::kFloat16, pad},
      {"SEPARATE_Q_K_V", DType::kBFloat16, DType::kBFloat16, sink},
      {"Q_PAGED_KV_NHD", DType::kBFloat16, DType::kBFloat16, cap},
      {"Q_PAGED_KV_NHD", DType::kFloat8E4M3FN, DType::kFloat16, sw},
      {"Q_PAGED_KV_HND", DType::kFloat16, DType::kFloat16, ch},
      {"Q_PAGED_KV_HND", DType::kBFloat16, DType::kBFloat16, sink},
      {"Q_PAGED_KV_HND", DType::kFloat8E4M3FN, DType::kBFloat16, padcap},
      {"PACKED_QKV", DType::kBFloat16, DType::kBFloat16, ali},
      {"Q_PAGED_KV_NHD", DType::kFloat16, DType::kFloat16, alicap},
      {"SEPARATE_Q_K_V", DType::kBFloat16, DType::kBFloat16, alipad},
      // fp8 e4m3 output (e4m3 inputs only), saturating.
      {"CONTIGUOUS_Q_KV", DType::kFloat8E4M3FN, DType::kFloat8E4M3FN, Opts{}},
      {"Q_PAGED_KV_HND", DType::kFloat8E4M3FN, DType::kFloat8E4M3FN, ali},
  };
  int idx = 0;
  for (const Row& r : rows) {
    SCOPED_TRACE(::testing::Message() << "row " << idx << " " << r.layout << " "
                                      << dtype_torch_name(r.d) << " mask " << r.opt.mask);
    const bool packed = std::string(r.layout) == "PACKED_QKV";
    const bool sep = std::string(r.layout) == "SEPARATE_Q_K_V";
    // Packed: keys are the query tokens (MHA). Others: GQA, more keys than queries, an empty
    // request.
    const std::vector<int32_t> ql =
        packed ? std::vector<int32_t>{5, 3} : std::vector<int32_t>{3, 5, 0};
    const std::vector<int32_t> kl = packed ? ql : std::vector<int32_t>{6, 9, 4};
    const int64_t H = packed ? 2 : 4, hkv = packed ? 2 : 2;
    Case c = make_case(r.layout, r.d, ql, kl, H, hkv, 32, sep ? 16 : 32, 100 + idx);
    Opts o = r.opt;
    if (!o.sinks.empty()) o.sinks.resize(H);
    const bool stats = o.sinks.empty() && !dtype_is_fp8(r.d) && !o.alibi;
    AttentionOutput got =
        run(c, o, std::nullopt, r.o == r.d ? std::nullopt : std::optional<DType>(r.o), stats);
    ASSERT_EQ(got.out.dtype(), r.o);
    std::vector<double> want, st;
    reference(c, o, want, st);
    testing::Tolerance tol = testing::attention_tolerance(r.o);
    if (dtype_is_fp8(r.d)) tol.atol *= 4;
    // e4m3 keeps 3 mantissa bits: half a step is 1/16 relative.
    if (dtype_is_fp8(r.o)) tol = {0.07, 0.03};
    EXPECT_TRUE(testing::all_close(got.out, want, tol));
    if (stats) {
      ASSERT_TRUE(got.lse.defined());
      EXPECT_TRUE(testing::all_close(got.lse, st, {1e-4, 1e-4}));
    } else {
      EXPECT_FALSE(got.lse.defined());
    }
    ++idx;
  }
}

// Hand-checked: two equal scores (s = 0) with values 1 and 3, a sink logit ln 2:
// out = bmm2 * (1 + 3) / (1 + 1 + 2) = bmm2; without the sink (1 + 3) / 2 = 2, stats (0, 2).
TEST(TrtllmFmhaV2Prefill, GoldenSinkAndStatistics) {
  Tensor q = Tensor::zeros({1, 1, 16}, DType::kBFloat16);
  Tensor kv = Tensor::zeros({2, 2, 1, 16}, DType::kBFloat16);
  kv.select(1, 1).select(0, 0).fill_(1.0);
  kv.select(1, 1).select(0, 1).fill_(3.0);
  Tensor sinks = Tensor::full({1}, std::log(2.0), DType::kFloat32);
  auto call = [&](std::optional<Tensor> s, bool stats) {
    return trtllm_fmha_v2_prefill(
        FmhaV2Qkv(q, kv), "CONTIGUOUS_Q_KV", Tensor::zeros({8}, DType::kUInt8), i32({2}), 1, 2, 1.0,
        2.0, 1, i32({0, 1}), i32({0, 2}), std::nullopt, std::nullopt, std::nullopt, s, std::nullopt,
        std::nullopt, "causal", -1, 0, stats);
  };
  EXPECT_TRUE(testing::all_close(call(sinks, false).out, std::vector<double>(16, 2.0), {0, 0}));
  AttentionOutput r = call(std::nullopt, true);
  EXPECT_TRUE(testing::all_close(r.out, std::vector<double>(16, 4.0), {0, 0}));
  EXPECT_TRUE(testing::all_close(r.lse, std::vector<double>{0.0, 2.0}, {0, 0}));
}

// Hand-checked ALiBi slopes for 3 heads (largest power of two 2): 2^-4, 2^-8, then the odd power
// 2^-2. With q = 0 every score is the bias slope * (j - pos); one query at pos 1 over values
// 0 and 1 gives out = 1 / (1 + exp(-slope)).
TEST(TrtllmFmhaV2Prefill, GoldenAlibiSlopes) {
  Tensor q = Tensor::zeros({1, 3, 16}, DType::kBFloat16);
  Tensor kv = Tensor::zeros({2, 2, 3, 16}, DType::kBFloat16);
  kv.select(1, 1).select(0, 1).fill_(1.0);
  const AttentionOutput r =
      trtllm_fmha_v2_prefill(FmhaV2Qkv(q, kv), "CONTIGUOUS_Q_KV", Tensor::zeros({8}, DType::kUInt8),
                             i32({2}), 1, 2, 1.0, 1.0, 1, i32({0, 1}), i32({0, 2}), std::nullopt,
                             std::nullopt, DType::kBFloat16, std::nullopt, std::string("alibi"));
  std::vector<double> want;
  for (double slope : {0.0625, 0.00390625, 0.25}) {
    for (int e = 0; e < 16; ++e) want.push_back(1.0 / (1.0 + std::exp(-slope)));
  }
  EXPECT_TRUE(testing::all_close(r.out, want, testing::attention_tolerance(DType::kBFloat16)));
  // Any other mode string means no positional encoding (0.5 everywhere).
  const AttentionOutput none =
      trtllm_fmha_v2_prefill(FmhaV2Qkv(q, kv), "CONTIGUOUS_Q_KV", Tensor::zeros({8}, DType::kUInt8),
                             i32({2}), 1, 2, 1.0, 1.0, 1, i32({0, 1}), i32({0, 2}), std::nullopt,
                             std::nullopt, DType::kBFloat16, std::nullopt, std::string("NONE"));
  EXPECT_TRUE(testing::all_close(none.out, std::vector<double>(48, 0.5), {0, 0}));
}

// e4m3 output: one key, value 1, so out = bmm2_scale exactly before the conversion. Ties round to
// even (1.0625 -> 1.0, 1.1875 -> 1.25), beyond 448 saturates (not NaN), both signs.
TEST(TrtllmFmhaV2Prefill, GoldenFp8OutputRoundingAndSaturation) {
  Tensor q = Tensor::zeros({1, 1, 16}, DType::kFloat8E4M3FN);
  Tensor kv = Tensor::zeros({1, 2, 1, 16}, DType::kFloat8E4M3FN);
  kv.select(1, 1).fill_(1.0);
  for (const auto& [bmm2, want] : std::vector<std::pair<double, double>>{
           {1.0625, 1.0}, {1.1875, 1.25}, {300.0, 288.0}, {1000.0, 448.0}, {-1000.0, -448.0}}) {
    SCOPED_TRACE(bmm2);
    const AttentionOutput r = trtllm_fmha_v2_prefill(
        FmhaV2Qkv(q, kv), "CONTIGUOUS_Q_KV", Tensor::zeros({8}, DType::kUInt8), i32({1}), 1, 1, 1.0,
        bmm2, 1, i32({0, 1}), i32({0, 1}), std::nullopt, std::nullopt, DType::kFloat8E4M3FN);
    ASSERT_EQ(r.out.dtype(), DType::kFloat8E4M3FN);
    EXPECT_TRUE(testing::all_close(r.out, std::vector<double>(16, want), {0, 0}));
  }
}

TEST(TrtllmFmhaV2Prefill, GivenOutAndEmptyRows) {
  Case c = make_case("Q_PAGED_KV_NHD", DType::kBFloat16, {2, 3}, {1, 3}, 2, 1, 32, 32, 7);
  // Query 0 of request 0 sits at position -1: it sees no key (zeros, stats (-inf, 0)).
  Tensor big = Tensor::full({5, 2, 40}, 9.0, DType::kBFloat16);
  Tensor out = big.slice(2, 0, 32);
  AttentionOutput r = run(c, Opts{}, out, std::nullopt, true);
  EXPECT_EQ(r.out.data_ptr(), out.data_ptr());
  std::vector<double> want, st;
  reference(c, Opts{}, want, st);
  EXPECT_TRUE(testing::all_close(out, want, testing::attention_tolerance(DType::kBFloat16)));
  EXPECT_TRUE(
      testing::all_close(big.slice(2, 32, 40), std::vector<double>(5 * 2 * 8, 9.0), {0, 0}));
  const std::vector<double> got = r.lse.contiguous().to_double_vector();
  EXPECT_EQ(got[0], -kInf);
  EXPECT_EQ(got[1], 0.0);
}

TEST(TrtllmFmhaV2Prefill, BadInput) {
  Case c = make_case("Q_PAGED_KV_HND", DType::kBFloat16, {2, 3}, {4, 5}, 4, 2, 32, 32, 9);
  const Tensor ws = Tensor::zeros({8}, DType::kUInt8);
  const Tensor lens = i32({4, 5}), cq = i32({0, 2, 5}), ckv = i32({0, 4, 9});
  auto call = [&](const FmhaV2Qkv& qkv, std::string_view layout, const Tensor& sl,
                  const Tensor& cuq, std::optional<Tensor> bt, std::string_view mask = "causal",
                  int64_t window = -1, int64_t chunk = 0, std::optional<Tensor> out = std::nullopt,
                  std::optional<DType> od = std::nullopt,
                  std::optional<Tensor> sinks = std::nullopt,
                  std::optional<std::string> pos = std::nullopt, bool stats = false,
                  double skip = 0.0, int64_t max_q = 3) {
    trtllm_fmha_v2_prefill(qkv, layout, ws, sl, max_q, 5, 0.1, 1.0, 2, cuq, ckv, bt, out, od, sinks,
                           pos, std::nullopt, mask, window, chunk, stats, skip);
  };
  const auto& t = c.qkv.tensors();
  call(c.qkv, "Q_PAGED_KV_HND", lens, cq, c.block_tables);  // valid
  EXPECT_FI_ERROR(call(c.qkv, "Q_PAGED_KV", lens, cq, c.block_tables), kOp, "input_layout");
  EXPECT_FI_ERROR(call(FmhaV2Qkv(t[0]), "Q_PAGED_KV_HND", lens, cq, c.block_tables), kOp, "qkv");
  EXPECT_FI_ERROR(call(c.qkv, "CONTIGUOUS_Q_KV", lens, cq, c.block_tables), kOp, "qkv");
  EXPECT_FI_ERROR(call(c.qkv, "Q_PAGED_KV_HND", lens, cq, std::nullopt), kOp, "block_tables");
  EXPECT_FI_ERROR(call(c.qkv, "Q_PAGED_KV_HND", lens, cq, i32({0, 1}, {2, 1})), kOp,
                  "block_tables");
  EXPECT_FI_ERROR(call(c.qkv, "Q_PAGED_KV_HND", lens, cq, i32({0, 1, 2, 99}, {2, 2})), kOp,
                  "block_tables");
  EXPECT_FI_ERROR(call(c.qkv, "Q_PAGED_KV_HND", i32({4, 6}), cq, c.block_tables), kOp, "seq_lens");
  EXPECT_FI_ERROR(call(c.qkv, "Q_PAGED_KV_HND", i32({4}), cq, c.block_tables), kOp, "seq_lens");
  EXPECT_FI_ERROR(call(c.qkv, "Q_PAGED_KV_HND", lens, i32({0, 2, 4}), c.block_tables), kOp,
                  "cum_seq_lens_q");
  EXPECT_FI_ERROR(call(c.qkv, "Q_PAGED_KV_HND", lens, cq, c.block_tables, "causal", -1, 0,
                       std::nullopt, std::nullopt, std::nullopt, std::nullopt, false, 0.0, 2),
                  kOp, "max_q_len");
  EXPECT_FI_ERROR(call(c.qkv, "Q_PAGED_KV_HND", lens, cq, c.block_tables, "custom"), kOp,
                  "mask_mode");
  EXPECT_FI_ERROR(call(c.qkv, "Q_PAGED_KV_HND", lens, cq, c.block_tables, "padding", 4), kOp,
                  "mask_mode");
  EXPECT_FI_ERROR(call(c.qkv, "Q_PAGED_KV_HND", lens, cq, c.block_tables, "chunked", -1, 0), kOp,
                  "chunked_attention_size");
  EXPECT_FI_ERROR(call(c.qkv, "Q_PAGED_KV_HND", lens, cq, c.block_tables, "chunked", -1, 6), kOp,
                  "chunked_attention_size");
  EXPECT_FI_ERROR(call(c.qkv, "Q_PAGED_KV_HND", lens, cq, c.block_tables, "causal", -1, 0,
                       Tensor::zeros({5, 4, 16}, DType::kBFloat16)),
                  kOp, "out");
  EXPECT_FI_ERROR(call(c.qkv, "Q_PAGED_KV_HND", lens, cq, c.block_tables, "causal", -1, 0,
                       std::nullopt, DType::kFloat16),
                  kOp, "out_dtype");
  EXPECT_FI_ERROR(call(c.qkv, "Q_PAGED_KV_HND", lens, cq, c.block_tables, "causal", -1, 0, t[0]),
                  kOp, "out");
  EXPECT_FI_ERROR(call(c.qkv, "Q_PAGED_KV_HND", lens, cq, c.block_tables, "causal", -1, 0,
                       std::nullopt, std::nullopt, Tensor::zeros({3}, DType::kFloat32)),
                  kOp, "sinks");
  call(c.qkv, "Q_PAGED_KV_HND", lens, cq, c.block_tables, "causal", -1, 0, std::nullopt,
       std::nullopt, std::nullopt, std::string("alibi"));  // valid
  EXPECT_FI_ERROR(
      call(c.qkv, "Q_PAGED_KV_HND", lens, cq, c.block_tables, "causal", -1, 0, std::nullopt,
           std::nullopt, Tensor::zeros({4}, DType::kFloat32), std::string("alibi")),
      kOp, "sinks");
  EXPECT_FI_ERROR(call(c.qkv, "Q_PAGED_KV_HND", lens, cq, c.block_tables, "causal", -1, 0,
                       std::nullopt, std::nullopt, std::nullopt, std::string("alibi"), true),
                  kOp, "save_softmax_stats");
  EXPECT_FI_ERROR(call(c.qkv, "Q_PAGED_KV_HND", lens, cq, c.block_tables, "causal", -1, 0,
                       std::nullopt, std::nullopt, std::nullopt, std::nullopt, false, -1.0),
                  kOp, "skip_softmax_threshold_scale_factor");
  EXPECT_FI_ERROR(call(c.qkv, "Q_PAGED_KV_HND", lens, cq, c.block_tables, "causal", -1, 0,
                       std::nullopt, std::nullopt, std::nullopt, std::nullopt, false, 500.0),
                  kOp, "skip_softmax_threshold_scale_factor");
  EXPECT_FI_ERROR(
      call(c.qkv, "Q_PAGED_KV_HND", lens, cq, c.block_tables, "causal", -1, 0, std::nullopt,
           std::nullopt, Tensor::zeros({4}, DType::kFloat32), std::nullopt, true),
      kOp, "save_softmax_stats");
  // Dtypes: fp32 is not an FMHAv2 input; fp8 SEPARATE_Q_K_V is refused; an fp8 output needs
  // fp8 inputs (upstream builds the e4m3-output kernel for e4m3 inputs only).
  Case f = make_case("SEPARATE_Q_K_V", DType::kFloat32, {2, 3}, {4, 5}, 4, 2, 32, 32, 10);
  EXPECT_FI_ERROR(call(f.qkv, "SEPARATE_Q_K_V", lens, cq, std::nullopt), kOp, "qkv");
  Case e = make_case("SEPARATE_Q_K_V", DType::kFloat8E4M3FN, {2, 3}, {4, 5}, 4, 2, 32, 32, 11);
  EXPECT_FI_ERROR(call(e.qkv, "SEPARATE_Q_K_V", lens, cq, std::nullopt), kOp, "qkv");
  Case p = make_case("CONTIGUOUS_Q_KV", DType::kFloat8E4M3FN, {2, 3}, {4, 5}, 4, 2, 32, 32, 12);
  call(p.qkv, "CONTIGUOUS_Q_KV", lens, cq, std::nullopt, "causal", -1, 0, std::nullopt,
       DType::kFloat8E4M3FN);  // valid
  EXPECT_FI_ERROR(call(p.qkv, "CONTIGUOUS_Q_KV", lens, cq, std::nullopt, "causal", -1, 0,
                       std::nullopt, DType::kFloat8E5M2),
                  kOp, "out_dtype");
  Case p16 = make_case("CONTIGUOUS_Q_KV", DType::kBFloat16, {2, 3}, {4, 5}, 4, 2, 32, 32, 14);
  EXPECT_FI_ERROR(call(p16.qkv, "CONTIGUOUS_Q_KV", lens, cq, std::nullopt, "causal", -1, 0,
                       std::nullopt, DType::kFloat8E4M3FN),
                  kOp, "out_dtype");
  // Ragged KV segments must equal seq_lens.
  Case g = make_case("CONTIGUOUS_Q_KV", DType::kBFloat16, {2, 3}, {4, 5}, 4, 2, 32, 32, 13);
  EXPECT_FI_ERROR(trtllm_fmha_v2_prefill(g.qkv, "CONTIGUOUS_Q_KV", ws, lens, 3, 5, 0.1, 1.0, 2, cq,
                                         i32({0, 3, 9})),
                  kOp, "cum_seq_lens_kv");
}

// The CPU reference always; the CUDA backend in every build that compiles CUDA.
TEST(TrtllmFmhaV2Prefill, Backends) {
  EXPECT_TRUE(op_has_backend(kOp, DeviceType::kCPU));
  EXPECT_EQ(op_has_backend(kOp, DeviceType::kCUDA), cuda_compiled());
}

TEST(TrtllmFmhaV2Prefill, RecordAndReplay) {
  Case paged = make_case("Q_PAGED_KV_NHD", DType::kBFloat16, {2, 3}, {4, 6}, 4, 2, 32, 32, 20);
  Case packed = make_case("PACKED_QKV", DType::kFloat16, {3, 2}, {3, 2}, 2, 2, 32, 32, 21);
  std::vector<testing::RecordingObserver::Call> calls;
  {
    testing::RecordingScope scope;
    Opts o;
    o.cap = 0.5;
    run(paged, o);
    run(packed, Opts{}, std::nullopt, std::nullopt, true);
    Opts a;
    a.alibi = true;
    run(paged, a);
    Case f8 = make_case("CONTIGUOUS_Q_KV", DType::kFloat8E4M3FN, {2, 1}, {3, 2}, 4, 2, 32, 32, 22);
    run(f8, Opts{}, std::nullopt, DType::kFloat8E4M3FN);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 4u);
  EXPECT_TRUE(calls[1].result.is_sequence());
  for (const auto& call : calls) EXPECT_TRUE(testing::replays_identically(call));
}

// Written by Python as upstream's recorder writes it, in the keyword style of upstream's tests
// and the serving stacks (qkv=(q, paged kv) tuple, input_layout=..., every argument by keyword,
// out_dtype and mask_mode given): SGLang's Q_PAGED_KV_HND call, a PACKED_QKV call with
// save_softmax_stats=True (result_0 / result_1), a CONTIGUOUS_Q_KV call with
// pos_encoding_mode="alibi" and an e4m3-in / e4m3-out one, expected values from torch in fp64.
TEST(TrtllmFmhaV2Prefill, UpstreamWrittenDumpReplays) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("fi_fmha_v2_prefill_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string py = R"PY(
import json, math, os, sys
try:
    import torch
except ImportError:
    sys.exit(77)
root = sys.argv[1]
torch.manual_seed(3)
H, HKV, D, PS = 4, 2, 64, 4

def attend(q, k, v, qo, kv, scale):
    o = torch.zeros(qo, q.shape[1], v.shape[2], dtype=torch.float64)
    st = torch.zeros(qo, q.shape[1], 2, dtype=torch.float64)
    g = q.shape[1] // k.shape[1]
    for i in range(qo):
        n = kv - qo + i + 1
        for h in range(q.shape[1]):
            s = (k[:n, h // g, :].double() @ q[i, h].double()) * scale
            m = s.max()
            e = torch.exp(s - m)
            o[i, h] = (e[:, None] * v[:n, h // g, :].double()).sum(0) / e.sum()
            st[i, h, 0], st[i, h, 1] = m, e.sum()
    return o, st

def tensor_meta(t, key):
    return {"type": "torch.Tensor", "shape": list(t.shape), "dtype": str(t.dtype),
            "stride": list(t.stride()), "device": "cuda:0", "requires_grad": False,
            "is_contiguous": t.is_contiguous(), "tensor_key": key}

def write(seq, inputs, meta, outputs):
    d = os.path.join(root, "20261122_203000_%03d_pid4242_trtllm_fmha_v2_prefill_call%04d" % (seq, seq))
    os.makedirs(d)
    torch.save(inputs, d + "/inputs.pt")
    torch.save(outputs, d + "/outputs.pt")
    rec = {"function_name": "trtllm_fmha_v2_prefill", "module": "flashinfer.prefill",
           "call_sequence": seq, "timestamp": "20261122_203000_%03d" % seq, "process_id": 4242,
           "input_metadata": meta, "output_metadata": {},
           "tensor_info": {"input_tensor_keys": list(inputs), "output_tensor_keys": list(outputs)},
           "tensor_format": "torch", "execution_status": "completed"}
    with open(d + "/metadata.jsonl", "w") as f:
        f.write(json.dumps(rec) + "\n")

# 1. Q_PAGED_KV_HND (SGLang / rtp-llm style), two requests with a cached prefix.
qlens, kvlens = [3, 2], [7, 5]
pages = 8
cache = torch.randn(pages, 2, HKV, PS, D).to(torch.bfloat16)
table = torch.tensor([[5, 1], [0, 6]], dtype=torch.int32)
q = torch.randn(sum(qlens), H, D).to(torch.bfloat16)
scale = 1.0 / math.sqrt(D)
outs, q0 = [], 0
for b in range(2):
    rows_k = [cache[int(table[b, t // PS]), 0, :, t % PS, :] for t in range(kvlens[b])]
    rows_v = [cache[int(table[b, t // PS]), 1, :, t % PS, :] for t in range(kvlens[b])]
    o, _ = attend(q[q0:q0 + qlens[b]], torch.stack(rows_k), torch.stack(rows_v), qlens[b], kvlens[b], scale)
    outs.append(o)
    q0 += qlens[b]
write(1, {"kwarg_qkv__0": q, "kwarg_qkv__1": cache,
          "kwarg_workspace_buffer": torch.zeros(1024, dtype=torch.uint8),
          "kwarg_seq_lens": torch.tensor(kvlens, dtype=torch.int32),
          "kwarg_cum_seq_lens_q": torch.tensor([0, 3, 5], dtype=torch.int32),
          "kwarg_cum_seq_lens_kv": torch.tensor([0, 7, 12], dtype=torch.int32),
          "kwarg_block_tables": table},
      {"kwarg_qkv": {"type": "tuple", "length": 2, "truncated": False,
                     "items": [tensor_meta(q, "kwarg_qkv__0"), tensor_meta(cache, "kwarg_qkv__1")]},
       "kwarg_input_layout": "Q_PAGED_KV_HND", "kwarg_max_q_len": 3, "kwarg_max_kv_len": 7,
       "kwarg_bmm1_scale": scale, "kwarg_bmm2_scale": 1.0, "kwarg_batch_size": 2,
       "kwarg_out_dtype": "torch.bfloat16", "kwarg_mask_mode": "causal"},
      {"result": torch.cat(outs).to(torch.bfloat16)})

# 2. PACKED_QKV (upstream's own test style: qkv and input_layout positional) with statistics.
lens = [4, 3]
packed = torch.randn(sum(lens), 3, H, D).to(torch.float16)
cum = torch.tensor([0, 4, 7], dtype=torch.int32)
outs, sts, q0 = [], [], 0
for l in lens:
    p = packed[q0:q0 + l]
    o, st = attend(p[:, 0], p[:, 1], p[:, 2], l, l, scale)
    outs.append(o)
    sts.append(st)
    q0 += l
write(2, {"arg_0": packed, "kwarg_workspace_buffer": torch.zeros(1024, dtype=torch.uint8),
          "kwarg_seq_lens": torch.tensor(lens, dtype=torch.int32),
          "kwarg_cum_seq_lens_q": cum, "kwarg_cum_seq_lens_kv": cum},
      {"arg_1": "PACKED_QKV", "kwarg_max_q_len": 4, "kwarg_max_kv_len": 4,
       "kwarg_bmm1_scale": scale, "kwarg_bmm2_scale": 1.0, "kwarg_batch_size": 2,
       "kwarg_mask_mode": "CAUSAL", "kwarg_window_left": -1,
       "kwarg_logits_soft_cap_scale": None, "kwarg_skip_softmax_threshold_scale_factor": 0.0,
       "kwarg_pos_encoding_mode": None, "kwarg_save_softmax_stats": True},
      {"result_0": torch.cat(outs).to(torch.float16), "result_1": torch.cat(sts).float()})

# 3. CONTIGUOUS_Q_KV with pos_encoding_mode="alibi" by keyword: slopes 2^(-8 (h + 1) / 4).
qlens, kvlens = [2, 3], [5, 3]
q = torch.randn(sum(qlens), H, D).to(torch.bfloat16)
kv = torch.randn(sum(kvlens), 2, HKV, D).to(torch.bfloat16)
slopes = [2.0 ** (-8.0 * (h + 1) / H) for h in range(H)]
outs, q0, k0 = [], 0, 0
for b in range(2):
    qo, n = qlens[b], kvlens[b]
    o = torch.zeros(qo, H, D, dtype=torch.float64)
    for i in range(qo):
        pos = n - qo + i
        for h in range(H):
            g = h // (H // HKV)
            kk = kv[k0:k0 + pos + 1, 0, g].double()
            vv = kv[k0:k0 + pos + 1, 1, g].double()
            s = (kk @ q[q0 + i, h].double()) * scale
            s = s + slopes[h] * (torch.arange(pos + 1, dtype=torch.float64) - pos)
            o[i, h] = torch.softmax(s, 0) @ vv
    outs.append(o)
    q0 += qo
    k0 += n
write(3, {"kwarg_qkv__0": q, "kwarg_qkv__1": kv,
          "kwarg_workspace_buffer": torch.zeros(1024, dtype=torch.uint8),
          "kwarg_seq_lens": torch.tensor(kvlens, dtype=torch.int32),
          "kwarg_cum_seq_lens_q": torch.tensor([0, 2, 5], dtype=torch.int32),
          "kwarg_cum_seq_lens_kv": torch.tensor([0, 5, 8], dtype=torch.int32)},
      {"kwarg_qkv": {"type": "tuple", "length": 2, "truncated": False,
                     "items": [tensor_meta(q, "kwarg_qkv__0"), tensor_meta(kv, "kwarg_qkv__1")]},
       "kwarg_input_layout": "CONTIGUOUS_Q_KV", "kwarg_max_q_len": 3, "kwarg_max_kv_len": 5,
       "kwarg_bmm1_scale": scale, "kwarg_bmm2_scale": 1.0, "kwarg_batch_size": 2,
       "kwarg_pos_encoding_mode": "alibi", "kwarg_mask_mode": "causal"},
      {"result": torch.cat(outs).to(torch.bfloat16)})

# 4. e4m3 inputs and an e4m3 output (out_dtype by keyword), pickled by hand (save(): torch 1.13
# here has no float8); the output scale folded into bmm2_scale.
def e4m3_value(c):
    sg = -1.0 if c & 0x80 else 1.0
    e, m = (c >> 3) & 0xF, c & 7
    if e == 0xF and m == 7: return float("nan")
    return sg * (m / 8.0 * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7))
E4M3 = torch.tensor([e4m3_value(c) for c in range(256)], dtype=torch.float64)
FIN = [c for c in range(256) if E4M3[c] == E4M3[c]]
E4V = E4M3.tolist()  # python floats: indexing the tensor per code made this search most of the run
def e4m3_code(x):  # round to nearest, ties to an even code, saturating at +-448
    x = max(-448.0, min(448.0, x))
    best = min(FIN, key=lambda c: (abs(E4V[c] - x), c & 1))
    return best
def codes(shape):
    c = torch.randint(0x20, 0x41, shape, dtype=torch.int64)
    return (c | (torch.randint(0, 2, shape) * 0x80)).to(torch.uint8)
qlens = [3, 2]
q8 = codes((5, H, D))
kv8 = codes((5, 2, HKV, D))
qv, kvv = E4M3[q8.long()], E4M3[kv8.long()]
bmm1, bmm2 = 0.05, 0.75
ref, q0 = [], 0
for l in qlens:
    for i in range(l):
        for h in range(H):
            g = h // (H // HKV)
            s = (kvv[q0:q0 + i + 1, 0, g] @ qv[q0 + i, h]) * bmm1
            ref.append(bmm2 * (torch.softmax(s, 0) @ kvv[q0:q0 + i + 1, 1, g]))
    q0 += l
out8 = torch.tensor([e4m3_code(float(x)) for x in torch.stack(ref).flatten()],
                    dtype=torch.uint8).reshape(5, H, D)
d4 = os.path.join(root, "20261122_203000_004_pid4242_trtllm_fmha_v2_prefill_call0004")
os.makedirs(d4)
save({"kwarg_qkv__0": ("fp8", q8), "kwarg_qkv__1": ("fp8", kv8),
      "kwarg_workspace_buffer": torch.zeros(1024, dtype=torch.uint8),
      "kwarg_seq_lens": torch.tensor(qlens, dtype=torch.int32),
      "kwarg_cum_seq_lens_q": torch.tensor([0, 3, 5], dtype=torch.int32),
      "kwarg_cum_seq_lens_kv": torch.tensor([0, 3, 5], dtype=torch.int32)}, d4 + "/inputs.pt")
save({"result": ("fp8", out8)}, d4 + "/outputs.pt")
fp8meta = lambda t, key: {**tensor_meta(t, key), "dtype": "torch.float8_e4m3fn"}
rec = {"function_name": "trtllm_fmha_v2_prefill", "module": "flashinfer.prefill",
       "call_sequence": 4, "timestamp": "20261122_203000_004", "process_id": 4242,
       "input_metadata": {
           "kwarg_qkv": {"type": "tuple", "length": 2, "truncated": False,
                         "items": [fp8meta(q8, "kwarg_qkv__0"), fp8meta(kv8, "kwarg_qkv__1")]},
           "kwarg_input_layout": "CONTIGUOUS_Q_KV", "kwarg_max_q_len": 3, "kwarg_max_kv_len": 3,
           "kwarg_bmm1_scale": bmm1, "kwarg_bmm2_scale": bmm2, "kwarg_batch_size": 2,
           "kwarg_out_dtype": "torch.float8_e4m3fn", "kwarg_mask_mode": "causal"},
       "output_metadata": {},
       "tensor_info": {"input_tensor_keys": ["kwarg_qkv__0", "kwarg_qkv__1",
                                             "kwarg_workspace_buffer", "kwarg_seq_lens",
                                             "kwarg_cum_seq_lens_q", "kwarg_cum_seq_lens_kv"],
                       "output_tensor_keys": ["result"]},
       "tensor_format": "torch", "execution_status": "completed"}
with open(d4 + "/metadata.jsonl", "w") as f:
    f.write(json.dumps(rec) + "\n")
)PY";
  std::vector<replay::Result> results;
  if (!testing::run_dump_script(dir, testing::kTorchSavePy + py, dir / "dump", 4u, &results)) {
    GTEST_SKIP() << "python3-torch not installed";
  }
  for (const auto& r : results) EXPECT_FALSE(r.comparisons.empty()) << r.function_name;
}

// The same call with its tensors on `d` (the index tensors too, as engines pass them).
Case on_device(Case c, Device d) {
  std::vector<Tensor> t;
  for (const Tensor& x : c.qkv.tensors()) t.push_back(x.to(d));
  c.qkv = t.size() == 1   ? FmhaV2Qkv(t[0])
          : t.size() == 2 ? FmhaV2Qkv(t[0], t[1])
                          : FmhaV2Qkv(t[0], t[1], t[2]);
  if (c.block_tables) c.block_tables = c.block_tables->to(d);
  return c;
}

// CUDA: the batch-attention kernels against the CPU reference over the layouts and the features
// they take: the FA2 kernel's 128-, 64- and 16-row blocks, GQA, paged NHD / HND caches with
// padding entries, a window, padding (non-causal), soft cap, sinks, ALiBi, DeepSeek's 192 / 128.
TEST(TrtllmFmhaV2PrefillCuda, MatchesCpu) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const DType bf16 = DType::kBFloat16, f16 = DType::kFloat16;
  Opts sw;
  sw.mask = "sliding_window";
  sw.window_left = 7;
  Opts pad;
  pad.mask = "padding";
  Opts cap;
  cap.cap = 0.3;
  Opts sink;
  sink.sinks = {0.5, -1.0, 2.0, 0.0, 1.5, -0.5, 0.25, 3.0};
  sink.bmm2 = 0.75;
  Opts ali;
  ali.alibi = true;
  struct Row {
    const char* layout;
    DType d;
    std::vector<int32_t> ql, kl;
    int64_t H, hkv, D, dv;
    Opts opt;
  };
  const std::vector<Row> rows = {
      {"PACKED_QKV", bf16, {300, 129}, {300, 129}, 4, 4, 128, 128, Opts{}},
      {"CONTIGUOUS_Q_KV", f16, {3, 5, 0}, {60, 9, 4}, 8, 2, 64, 64, sw},
      {"SEPARATE_Q_K_V", bf16, {40, 1}, {100, 64}, 16, 1, 192, 128, pad},
      {"Q_PAGED_KV_NHD", bf16, {2, 17}, {200, 17}, 8, 2, 128, 128, cap},
      {"Q_PAGED_KV_HND", f16, {1, 1, 1}, {33, 1, 70}, 32, 8, 128, 128, sink},
      {"Q_PAGED_KV_HND", bf16, {70}, {90}, 4, 2, 256, 256, ali},
  };
  int idx = 0;
  for (const Row& r : rows) {
    SCOPED_TRACE(::testing::Message() << "row " << idx << " " << r.layout);
    const Case c = make_case(r.layout, r.d, r.ql, r.kl, r.H, r.hkv, r.D, r.dv, 300 + idx, 16);
    Opts o = r.opt;
    if (!o.sinks.empty()) o.sinks.resize(r.H, 0.5);
    const AttentionOutput want = run(c, o);
    // Each row on the default kernel and on the FA2 kernel (FLASHINFER_PREFILL_SM90=0): on sm_90
    // the Hopper kernel takes the rows it fits (row 0's 128-row blocks, row 4's 64), which
    // would otherwise leave the FA2 kernel's block heights untested there.
    // Both plans: the lengths on the device (planned there) and on the host.
    for (const char* sm90 : {static_cast<const char*>(nullptr), "0"}) {
      for (bool host_lengths : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << (sm90 ? "FLASHINFER_PREFILL_SM90=0" : "default kernel")
                     << (host_lengths ? ", host lengths" : ", device lengths"));
        const testing::ScopedEnv env("FLASHINFER_PREFILL_SM90", sm90);
        const AttentionOutput got =
            run(on_device(c, gpu), o, std::nullopt, std::nullopt, false, host_lengths);
        ASSERT_TRUE(got.out.device().is_cuda());
        EXPECT_TRUE(testing::all_close(got.out.to(Device::cpu()), want.out,
                                       testing::attention_tolerance(r.d)));
      }
    }
    ++idx;
  }
}

// What the CUDA kernels cannot express is refused by name (replay then runs it on the CPU).
TEST(TrtllmFmhaV2PrefillCuda, RefusesWhatTheKernelsCannotExpress) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const Case c = on_device(
      make_case("CONTIGUOUS_Q_KV", DType::kBFloat16, {3, 5}, {6, 9}, 4, 2, 64, 64, 41), gpu);
  Opts ch;
  ch.mask = "chunked";
  ch.chunk = 4;
  EXPECT_FI_ERROR(run(c, ch), kOp, "chunked_attention_size");
  EXPECT_FI_ERROR(run(c, Opts{}, std::nullopt, std::nullopt, true), kOp, "save_softmax_stats");
  Opts alicap;
  alicap.alibi = true;
  alicap.cap = 0.5;
  EXPECT_FI_ERROR(run(c, alicap), kOp, "pos_encoding_mode");
  const Case f8 = on_device(
      make_case("CONTIGUOUS_Q_KV", DType::kFloat8E4M3FN, {3}, {6}, 4, 2, 64, 64, 42), gpu);
  EXPECT_FI_ERROR(run(f8, Opts{}, std::nullopt, DType::kBFloat16), kOp, "qkv");
  // The kernels' own cases run: the same call without the refused feature.
  EXPECT_TRUE(run(c, Opts{}).out.device().is_cuda());
}

// Long-KV batches of few queries split their keys across blocks (the wrappers' rule; partials
// in the workspace, merged after): against the CPU reference over layouts, causal and padding,
// a window, soft cap, sinks (folded in by the merge pass), DeepSeek's 192 / 128, and head dims
// the other kernels take.
TEST(TrtllmFmhaV2PrefillCuda, SplitKvMatchesCpu) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const DType bf16 = DType::kBFloat16, f16 = DType::kFloat16;
  Opts sw;
  sw.mask = "sliding_window";
  sw.window_left = 700;
  Opts pad;
  pad.mask = "padding";
  Opts cap;
  cap.cap = 0.3;
  Opts sink;
  sink.sinks = {0.5, -1.0, 2.0, 0.0, 1.5, -0.5, 0.25, 3.0};
  sink.bmm2 = 0.75;
  struct Row {
    const char* layout;
    DType d;
    std::vector<int32_t> ql, kl;
    int64_t H, hkv, D, dv;
    Opts opt;
  };
  const std::vector<Row> rows = {
      {"SEPARATE_Q_K_V", bf16, {128}, {8192}, 8, 8, 128, 128, Opts{}},
      {"SEPARATE_Q_K_V", bf16, {128}, {8192}, 8, 8, 128, 128, pad},
      {"CONTIGUOUS_Q_KV", f16, {3, 5}, {5000, 3000}, 8, 2, 64, 64, sw},
      {"SEPARATE_Q_K_V", bf16, {40}, {6000}, 16, 1, 192, 128, pad},
      {"Q_PAGED_KV_NHD", bf16, {2, 17}, {4000, 2500}, 8, 2, 128, 128, cap},
      {"Q_PAGED_KV_HND", f16, {1, 1}, {3333, 70}, 8, 8, 128, 128, sink},
      // Head dims without an FA2 instance: the first-draft tensor-core kernel (NVRTC), and with
      // sinks the CUDA-core kernel, write the partials.
      {"SEPARATE_Q_K_V", f16, {64}, {4000}, 4, 4, 80, 80, Opts{}},
      {"CONTIGUOUS_Q_KV", bf16, {2}, {3000}, 8, 8, 96, 96, sink},
  };
  int idx = 0;
  for (const Row& r : rows) {
    SCOPED_TRACE(::testing::Message() << "row " << idx << " " << r.layout);
    const Case c = make_case(r.layout, r.d, r.ql, r.kl, r.H, r.hkv, r.D, r.dv, 500 + idx, 16);
    std::vector<int32_t> cq = {0};
    for (int32_t l : r.ql) cq.push_back(cq.back() + l);
    int32_t max_rows = 0;
    const int variant = r.opt.cap > 0 ? kernels::cuda::prefill::kPrefillSoftCap : 0;
    // The call's fields the Hopper kernel's dispatch reads: its budget where its tall blocks run
    // the items, as the API plans.
    kernels::AttentionParams fields;
    fields.q_dtype = fields.o_dtype = fields.kv.dtype = r.d;
    fields.num_qo_heads = static_cast<int32_t>(r.H);
    fields.num_kv_heads = static_cast<int32_t>(r.hkv);
    fields.head_dim_qk = static_cast<int32_t>(r.D);
    fields.head_dim_vo = static_cast<int32_t>(r.dv);
    fields.logits_soft_cap = static_cast<float>(r.opt.cap);
    fields.sm_scale = 0.05f;
    // The shape exercises the split on both plans: the host's of the real lengths, and the
    // device plan's grid from the rows and the bounds.
    ASSERT_TRUE(api::one_shot_plan(cq.data(), r.kl.data(), static_cast<int32_t>(r.ql.size()),
                                   static_cast<int32_t>(r.H / r.hkv), static_cast<int32_t>(r.hkv),
                                   static_cast<int32_t>(r.D), static_cast<int32_t>(r.dv), variant,
                                   api::tensor_core_max_grid(gpu), max_rows,
                                   api::hopper_tall_max_grid(fields, gpu))
                    .split_kv);
    kernels::BlockTablePlan bp;
    bp.batch = static_cast<int32_t>(r.ql.size());
    bp.total_rows = cq.back();
    bp.q_len = *std::max_element(r.ql.begin(), r.ql.end());
    bp.max_seq_len = *std::max_element(r.kl.begin(), r.kl.end());
    ASSERT_GT(api::ragged_device_grid(bp, static_cast<int32_t>(r.H / r.hkv),
                                      static_cast<int32_t>(r.hkv), static_cast<int32_t>(r.D),
                                      static_cast<int32_t>(r.dv), api::tensor_core_max_grid(gpu),
                                      api::hopper_tall_max_grid(fields, gpu), kOp, variant)
                  .partial_rows,
              0);
    const AttentionOutput want = run(c, r.opt);
    for (bool host_lengths : {false, true}) {
      SCOPED_TRACE(host_lengths ? "host lengths" : "device lengths");
      const AttentionOutput got =
          run(on_device(c, gpu), r.opt, std::nullopt, std::nullopt, false, host_lengths);
      ASSERT_TRUE(got.out.device().is_cuda());
      EXPECT_TRUE(testing::all_close(got.out.to(Device::cpu()), want.out,
                                     testing::attention_tolerance(r.d)));
    }
    ++idx;
  }
}

// The split's partials need the workspace: with the lengths on the host too small a one is
// refused by name (the host plan splits by the real lengths).
TEST(TrtllmFmhaV2PrefillCuda, SplitKvRefusesTooSmallAWorkspace) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const Case c = on_device(
      make_case("SEPARATE_Q_K_V", DType::kBFloat16, {128}, {8192}, 8, 8, 128, 128, 77, 16), gpu);
  EXPECT_FI_ERROR(trtllm_fmha_v2_prefill(
                      c.qkv, c.layout, Tensor::zeros({1 << 12}, DType::kUInt8, gpu), i32(c.kv_lens),
                      128, 8192, 0.1, 1.0, 1, i32(prefix(c.q_lens)), i32(prefix(c.kv_lens))),
                  kOp, "workspace_buffer");
  // The lengths on the device: the device plan splits by the bounds, which the real lengths may
  // not need, so without room for the partials it keeps the keys in one chunk (the same result).
  const Tensor got = trtllm_fmha_v2_prefill(
      c.qkv, c.layout, Tensor::zeros({1 << 12}, DType::kUInt8, gpu), i32(c.kv_lens).to(gpu), 128,
      8192, 0.1, 1.0, 1, i32(prefix(c.q_lens)).to(gpu), i32(prefix(c.kv_lens)).to(gpu));
  const Case h =
      make_case("SEPARATE_Q_K_V", DType::kBFloat16, {128}, {8192}, 8, 8, 128, 128, 77, 16);
  const Tensor want =
      trtllm_fmha_v2_prefill(h.qkv, h.layout, Tensor::zeros({256}, DType::kUInt8), i32(h.kv_lens),
                             128, 8192, 0.1, 1.0, 1, i32(prefix(h.q_lens)), i32(prefix(h.kv_lens)));
  EXPECT_TRUE(testing::all_close(got.to(Device::cpu()), want,
                                 testing::attention_tolerance(DType::kBFloat16)));
}

// With the lengths on the device, what the host checks refuse (and the CPU refuses by name) the
// plan kernel refuses without reading anything back: a request past max_kv_len, with a page id
// outside the cache, or (ragged) whose seq_lens disagrees with its key rows gets NaN rows while
// the others are computed; cum_seq_lens_q not ending at the query's rows makes every row NaN.
TEST(TrtllmFmhaV2PrefillCuda, BadLengthsGiveNanRowsOnTheDevice) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  for (const char* layout : {"Q_PAGED_KV_HND", "CONTIGUOUS_Q_KV"}) {
    SCOPED_TRACE(layout);
    const bool paged = std::string(layout) == "Q_PAGED_KV_HND";
    const Case c =
        make_case(layout, DType::kBFloat16, {4, 6, 3}, {20, 30, 10}, 8, 2, 128, 128, 610, 16);
    const AttentionOutput want = run(c, Opts{});
    const Case g = on_device(c, gpu);
    const Tensor ws = Tensor::zeros({int64_t{64} << 20}, DType::kUInt8, gpu);
    auto call = [&](const Case& x, Device d, const std::vector<int32_t>& lens,
                    const std::vector<int32_t>& cq, const std::optional<Tensor>& table) {
      return trtllm_fmha_v2_prefill(
          x.qkv, x.layout, d.is_cuda() ? ws : Tensor::zeros({256}, DType::kUInt8), i32(lens).to(d),
          6, 30, 0.2, 1.0, 3, i32(cq).to(d), i32(prefix(c.kv_lens)).to(d), table);
    };
    const std::vector<int32_t> cq{0, 4, 10, 13};
    auto expect_rows = [&](const AttentionOutput& got, int64_t lo, int64_t hi) {
      EXPECT_TRUE(testing::all_close(got.out.to(Device::cpu()).slice(0, lo, hi),
                                     want.out.slice(0, lo, hi),
                                     testing::attention_tolerance(DType::kBFloat16)));
    };
    {
      SCOPED_TRACE("the lengths as given");
      expect_rows(call(g, gpu, c.kv_lens, cq, g.block_tables), 0, 13);
    }
    {
      SCOPED_TRACE(paged ? "seq_lens[1] past max_kv_len" : "seq_lens[1] not its key rows");
      const std::vector<int32_t> bad{20, paged ? 31 : 29, 10};
      EXPECT_FI_ERROR(call(c, Device::cpu(), bad, cq, c.block_tables), kOp,
                      paged ? "seq_lens" : "cum_seq_lens_kv");
      const AttentionOutput got = call(g, gpu, bad, cq, g.block_tables);
      expect_rows(got, 0, 4);
      testing::expect_nan_rows(got.out, 4, 10);
      expect_rows(got, 10, 13);
    }
    if (paged) {
      SCOPED_TRACE("a page id of request 1 outside the cache");
      Tensor t = c.block_tables->clone();
      const int64_t pages = c.qkv.tensors().at(1).size(0);
      t.data<int32_t>()[1 * t.size(1) + 1] = static_cast<int32_t>(pages);
      EXPECT_FI_ERROR(call(c, Device::cpu(), c.kv_lens, cq, t), kOp, "block_tables");
      const AttentionOutput got = call(g, gpu, c.kv_lens, cq, t.to(gpu));
      expect_rows(got, 0, 4);
      testing::expect_nan_rows(got.out, 4, 10);
      expect_rows(got, 10, 13);
    }
    {
      SCOPED_TRACE("cum_seq_lens_q ends before the query's last row");
      const std::vector<int32_t> short_cq{0, 4, 10, 12};
      EXPECT_FI_ERROR(call(c, Device::cpu(), c.kv_lens, short_cq, c.block_tables), kOp,
                      "cum_seq_lens_q");
      testing::expect_nan_rows(call(g, gpu, c.kv_lens, short_cq, g.block_tables).out, 0, 13);
    }
  }
}

#if FLASHINFER_TEST_HAVE_CUDART
// SGLang's layout (Q_PAGED_KV_HND) with its lengths on the device captured into a CUDA graph after
// a warm-up, then replayed with other query counts and lengths written into the same tensors,
// each replay matching the CPU reference of its lengths.
TEST(TrtllmFmhaV2PrefillCuda, CapturedCallReplaysNewLengths) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  // The cache and table of the longest lengths each request takes below; the query's 40 rows.
  const std::vector<int32_t> room{300, 300, 300};
  const Case c0 =
      make_case("Q_PAGED_KV_HND", DType::kBFloat16, {10, 20, 10}, room, 8, 2, 128, 128, 620, 16);
  const Case g = on_device(c0, gpu);
  const Tensor ws = Tensor::zeros({int64_t{64} << 20}, DType::kUInt8, gpu);
  Tensor lens_g = i32(room).to(gpu), cq_g = i32({0, 10, 30, 40}).to(gpu);
  const Tensor ckv_g = i32(prefix(room)).to(gpu);
  Tensor out = Tensor::zeros({40, 8, 128}, DType::kBFloat16, gpu);
  auto call = [&] {
    trtllm_fmha_v2_prefill(g.qkv, g.layout, ws, lens_g, 32, 300, 0.2, 1.0, 3, cq_g, ckv_g,
                           g.block_tables, out);
  };
  testing::ReplayableGraph graph;
  ASSERT_NO_FATAL_FAILURE(testing::warm_up_for_replay(graph, call));
  ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, call));
  struct Step {
    std::vector<int32_t> ql, kl;
  };
  for (const Step& st : {Step{{10, 20, 10}, {300, 300, 300}}, Step{{32, 0, 8}, {40, 0, 250}},
                         Step{{1, 31, 8}, {1, 299, 8}}}) {
    SCOPED_TRACE(::testing::Message()
                 << "queries " << st.ql[0] << ", " << st.ql[1] << ", " << st.ql[2]);
    lens_g.copy_(i32(st.kl));
    cq_g.copy_(i32(prefix(st.ql)));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
    // The CPU reference of these lengths over the same query, cache and table.
    const Tensor want = trtllm_fmha_v2_prefill(
        c0.qkv, c0.layout, Tensor::zeros({256}, DType::kUInt8), i32(st.kl), 32, 300, 0.2, 1.0, 3,
        i32(prefix(st.ql)), i32(prefix(st.kl)), c0.block_tables);
    EXPECT_TRUE(testing::all_close(out.to(Device::cpu()), want,
                                   testing::attention_tolerance(DType::kBFloat16)));
  }
  cudaGraphExecDestroy(graph.exec);
  cudaGraphDestroy(graph.graph);
  cudaStreamDestroy(graph.stream);
}
#endif

}  // namespace
}  // namespace flashinfer
