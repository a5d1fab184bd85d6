// Tests for the sampling ops (flashinfer.sampling) and the Philox-4x32-10 generator under them.
//
// Philox is checked against Random123's published known-answer vectors. Filters and softmax are
// checked against naive fp64 formulas and hand-checked goldens (some from upstream's docstring
// examples). Samplers are checked by exact answers where the answer is forced, by replaying the
// documented random stream in the test, by "no sample ever violates the filter" over many draws,
// and by chi-square tests of the sampled distribution against the filtered, renormalized probs.
// Every bad-input case must raise a flashinfer::Error naming the op and the argument. CUDA cases
// compare the CUDA backend with the CPU one and skip without a GPU.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cuda_runtime.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "kernels/philox.h"
#include "kernels/sampling_params.h"
#include "kernels/sampling_rules.h"
#include "util/test_util.h"
#if FLASHINFER_TEST_HAVE_CUDART
#include <cuda_runtime.h>
#endif

namespace flashinfer {
namespace {

using testing::all_close;
using testing::default_tolerance;
using Rows = std::vector<std::vector<double>>;

// ------------------------------------------------------------------------------------------
// Helpers

Tensor make_rows(const Rows& rows, DType dtype = DType::kFloat32) {
  std::vector<double> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return Tensor::from_vector(
      flat, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())}, dtype);
}

Tensor int_tensor(const std::vector<int64_t>& v, DType dtype = DType::kInt32) {
  std::vector<double> d(v.begin(), v.end());
  return Tensor::from_vector(d, {static_cast<int64_t>(v.size())}, dtype);
}

std::vector<int64_t> ints(const Tensor& t) {
  std::vector<int64_t> out;
  for (double d : t.to_double_vector()) out.push_back(static_cast<int64_t>(d));
  return out;
}

// Values after rounding to fp32, as the kernels see them.
std::vector<double> as_f32(const std::vector<double>& v) {
  std::vector<double> out;
  for (double d : v) out.push_back(static_cast<float>(d));
  return out;
}

// Tokens a filter keeps, by the definitions (fp64): top-k keeps fewer than k strictly larger,
// top-p keeps a strictly-larger mass below top_p, min-p keeps p >= min_p * max.
std::vector<bool> top_k_keep(const std::vector<double>& p, int64_t k) {
  std::vector<bool> keep(p.size());
  for (std::size_t j = 0; j < p.size(); ++j) {
    int64_t larger = 0;
    for (double q : p) larger += q > p[j];
    keep[j] = !std::isnan(p[j]) && larger < k;
  }
  return keep;
}
std::vector<bool> top_p_keep(const std::vector<double>& p, double top_p) {
  std::vector<bool> keep(p.size());
  for (std::size_t j = 0; j < p.size(); ++j) {
    double mass = 0.0;
    for (double q : p) mass += q > p[j] ? q : 0.0;
    keep[j] = mass < top_p;
  }
  return keep;
}
std::vector<bool> min_p_keep(const std::vector<double>& p, double min_p) {
  const double mx = *std::max_element(p.begin(), p.end());
  std::vector<bool> keep(p.size());
  for (std::size_t j = 0; j < p.size(); ++j) keep[j] = p[j] >= min_p * mx && p[j] > 0.0;
  return keep;
}
std::vector<bool> both(const std::vector<bool>& a, const std::vector<bool>& b) {
  std::vector<bool> out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) out[i] = a[i] && b[i];
  return out;
}
std::vector<double> renorm(const std::vector<double>& p, const std::vector<bool>& keep) {
  double s = 0.0;
  for (std::size_t i = 0; i < p.size(); ++i) s += keep[i] ? p[i] : 0.0;
  std::vector<double> out(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) out[i] = keep[i] ? p[i] / s : 0.0;
  return out;
}
std::vector<double> softmax64(const std::vector<double>& x, double t = 1.0) {
  double m = -INFINITY;
  for (double v : x) m = std::max(m, v / t);
  std::vector<double> e(x.size());
  double s = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) s += e[i] = std::exp(x[i] / t - m);
  for (double& v : e) v /= s;
  return e;
}

// Wilson-Hilferty approximation of the chi-square quantile with `df` degrees of freedom at
// one-sided normal quantile z; z = 4.753 is the 1 - 1e-6 quantile (accurate to a few percent for
// df >= 1, far below the gap between a correct and a wrong distribution here).
double chi2_critical(int df, double z = 4.753) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// Chi-square test of `samples` against `expected` probabilities. Tokens with expected
// probability 0 must never be drawn (that is the filter); the rest are tested with a fixed seed,
// so the test is deterministic, against the 1 - 1e-6 quantile: a correct sampler fails for a given
// seed with probability ~1e-6, while a wrong one (unfiltered, not renormalized, off by one
// token) moves expected counts of 20000 draws by hundreds and the statistic into the thousands.
::testing::AssertionResult chi_square_ok(const std::vector<int64_t>& samples,
                                         const std::vector<double>& expected) {
  std::vector<int64_t> counts(expected.size(), 0);
  for (int64_t s : samples) {
    if (s < 0 || s >= static_cast<int64_t>(expected.size())) {
      return ::testing::AssertionFailure() << "sample " << s << " out of range";
    }
    ++counts[s];
  }
  const double n = static_cast<double>(samples.size());
  double stat = 0.0;
  int cells = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] == 0.0) {
      if (counts[i] != 0) {
        return ::testing::AssertionFailure()
               << "token " << i << " has expected probability 0 but was drawn " << counts[i]
               << " times";
      }
      continue;
    }
    const double e = expected[i] * n;
    stat += (counts[i] - e) * (counts[i] - e) / e;
    ++cells;
  }
  if (cells <= 1) return ::testing::AssertionSuccess();
  const double crit = chi2_critical(cells - 1);
  if (stat <= crit) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "chi-square " << stat << " > critical " << crit << " (df " << cells - 1 << ")";
}

// The distribution of the chi-square tests: masses chosen so every filter boundary has a wide
// margin, scattered over positions so index order is not the value order.
// Sorted values: .25 .2 .15 .12 .1 .08 .05 .03 .015 .005 (sum 1).
const std::vector<double> kDist = {0.12, 0.015, 0.25, 0.05, 0.1, 0.005, 0.2, 0.08, 0.03, 0.15};

constexpr int64_t kDraws = 20000;

// kDraws output rows all reading row 0 (indices), so one call gives kDraws independent draws.
Tensor draw_indices() { return int_tensor(std::vector<int64_t>(kDraws, 0)); }

// ------------------------------------------------------------------------------------------
// Philox

// Random123 tests/kat_vectors, the "philox4x32 7" and "philox4x32 10" lines: counter (4 words),
// key (2 words), expected output (4 words).
struct Kat {
  uint32_t ctr[4], key[2], out[4];
};
const Kat kKat10[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};
const Kat kKat7[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a}},
};

template <int R>
void check_kat(const Kat& k) {
  const kernels::Philox4x32 c = {{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]}};
  const kernels::Philox4x32 r = kernels::philox4x32<R>(c, k.key[0], k.key[1]);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(r.v[i], k.out[i]) << "word " << i;
}

TEST(Philox, Random123KnownAnswers) {
  for (const Kat& k : kKat10) check_kat<10>(k);
  for (const Kat& k : kKat7) check_kat<7>(k);
}

TEST(Philox, StreamLayoutIsCurandInit) {
  // curand_init(seed, subsequence, offset): key = seed halves, counter = subsequence in the high
  // 64 bits + position / 4 in the low 64 bits; word position % 4 of that block.
  const uint64_t seed = 0x0123456789abcdefull, sub = 0x1122334455667788ull;
  for (uint64_t offset : {0ull, 1ull, 3ull, 4ull, 5ull, 1000003ull}) {
    kernels::PhiloxStream s(seed, sub, offset);
    for (uint64_t n = 0; n < 11; ++n) {
      const uint64_t pos = offset + n;
      const kernels::Philox4x32 c = {{static_cast<uint32_t>(pos >> 2),
                                      static_cast<uint32_t>(pos >> 34), 0x55667788u, 0x11223344u}};
      const kernels::Philox4x32 blk = kernels::philox4x32<10>(c, 0x89abcdefu, 0x01234567u);
      EXPECT_EQ(s.next_u32(), blk.v[pos & 3]) << "offset " << offset << " draw " << n;
    }
  }
}

TEST(Philox, UniformMapIsCurandUniform) {
  // x * 2^-32 + 2^-33 in fp32: (0, 1], both ends reachable.
  EXPECT_EQ(kernels::philox_word_to_uniform(0), 0x1p-33f);
  EXPECT_EQ(kernels::philox_word_to_uniform(1), 0x1.8p-32f);
  EXPECT_EQ(kernels::philox_word_to_uniform(0xffffffffu), 1.0f);
  EXPECT_EQ(kernels::philox_word_to_uniform(0x80000000u), 0.5f);
  kernels::PhiloxStream s(7, 3, 0);
  for (int i = 0; i < 4096; ++i) {
    const float u = s.next_uniform();
    EXPECT_GT(u, 0.0f);
    EXPECT_LE(u, 1.0f);
  }
}

TEST(Philox, OrderedKeyFollowsFloatOrder) {
  const std::vector<float> v = {-INFINITY, -3.5f, -1e-30f, -0.0f,   0.0f,
                                1e-30f,    0.25f, 7.0f,    INFINITY};
  for (std::size_t i = 0; i + 1 < v.size(); ++i) {
    if (v[i] == v[i + 1]) {
      EXPECT_EQ(kernels::ordered_key(v[i]), kernels::ordered_key(v[i + 1]));
    } else {
      EXPECT_LT(kernels::ordered_key(v[i]), kernels::ordered_key(v[i + 1])) << v[i];
    }
  }
  EXPECT_EQ(kernels::ordered_key(NAN), 0u);
  EXPECT_EQ(kernels::ordered_key(-NAN), 0u);
  EXPECT_GT(kernels::ordered_key(-INFINITY), 0u);
}

// ------------------------------------------------------------------------------------------
// Declarations

TEST(SamplingDecl, SignaturesMatchUpstream) {
  const std::pair<const char*, const char*> expected[] = {
      {"softmax", "(logits, temperature=None, enable_pdl=None)"},
      {"sampling_from_probs",
       "(probs, indices=None, deterministic=True, generator=None, check_nan=False, seed=None, "
       "offset=None, return_valid=False)"},
      {"sampling_from_logits",
       "(logits, indices=None, deterministic=True, generator=None, check_nan=False, seed=None, "
       "offset=None)"},
      {"top_p_sampling_from_probs",
       "(probs, top_p, indices=None, deterministic=True, generator=None, check_nan=False, "
       "seed=None, offset=None, return_valid=False)"},
      {"top_k_sampling_from_probs",
       "(probs, top_k, indices=None, deterministic=True, generator=None, check_nan=False, "
       "seed=None, offset=None, return_valid=False)"},
      {"min_p_sampling_from_probs",
       "(probs, min_p, indices=None, deterministic=True, generator=None, check_nan=False, "
       "seed=None, offset=None, return_valid=False)"},
      {"top_k_top_p_sampling_from_probs",
       "(probs, top_k, top_p, indices=None, filter_apply_order='top_k_first', "
       "deterministic=True, generator=None, check_nan=False, seed=None, offset=None, "
       "return_valid=False, top_k_max=None)"},
      {"top_k_top_p_sampling_from_logits",
       "(logits, top_k, top_p, indices=None, filter_apply_order='top_k_first', "
       "deterministic=True, generator=None, check_nan=False, seed=None, offset=None, "
       "top_k_max=None)"},
      {"top_k_mask_logits", "(logits, top_k)"},
      {"top_k_renorm_probs", "(probs, top_k, is_deterministic=False)"},
      {"top_p_renorm_probs", "(probs, top_p, is_deterministic=False)"},
  };
  for (const auto& [name, sig] : expected) {
    const OpDecl* d = OpRegistry::global().find(name);
    ASSERT_NE(d, nullptr) << name;
    EXPECT_EQ(d->module, "flashinfer.sampling") << name;
    EXPECT_EQ(d->signature(), sig) << name;
    EXPECT_TRUE(static_cast<bool>(d->invoke)) << name;
  }
}

TEST(SamplingDecl, RenormProbsTakeUpstreamsArguments) {
  // Upstream 0.7.4: top_k_renorm_probs(probs, top_k, is_deterministic=False) (the pinned commit's
  // has two parameters, so its records carry two arguments: they bind too) and
  // top_p_renorm_probs(probs, top_p, is_deterministic=False). The flag changes nothing here.
  const Tensor probs = make_rows({{0.1, 0.4, 0.2, 0.3}, {0.25, 0.15, 0.5, 0.1}});
  const std::vector<double> expect = {0, 4.0 / 7, 0, 3.0 / 7, 1.0 / 3, 0, 2.0 / 3, 0};
  const OpDecl* k = OpRegistry::global().find("top_k_renorm_probs");
  ASSERT_NE(k, nullptr);
  ASSERT_EQ(k->params.size(), 3u);
  const Value rk =
      k->invoke(CallArgs(*k, bind_arguments(*k, {Value(probs), Value(int64_t{2})}, {})));
  EXPECT_TRUE(all_close(rk.as_tensor(), expect, {1e-7, 1e-6}));
  for (const bool det : {false, true}) {
    const Value r = k->invoke(CallArgs(*k, bind_arguments(*k, {Value(probs), Value(int64_t{2})},
                                                          {{"is_deterministic", Value(det)}})));
    EXPECT_EQ(r.as_tensor().to_double_vector(), rk.as_tensor().to_double_vector()) << det;
  }
  EXPECT_FI_ERROR(
      bind_arguments(*k, {Value(probs), Value(int64_t{2}), Value(true), Value(true)}, {}),
      "top_k_renorm_probs", "");

  const OpDecl* p = OpRegistry::global().find("top_p_renorm_probs");
  ASSERT_NE(p, nullptr);
  for (const bool det : {false, true}) {
    const Value rp = p->invoke(CallArgs(
        *p, bind_arguments(*p, {Value(probs), Value(0.6)}, {{"is_deterministic", Value(det)}})));
    EXPECT_TRUE(all_close(rp.as_tensor(), expect, {1e-7, 1e-6})) << det;
  }
}

TEST(SamplingDecl, RecordsCarryUpstreamsArgumentsAndReplay) {
  // A dump of top_k_renorm_probs holds its arguments by position (upstream's replay calls
  // top_k_renorm_probs(*args)); a sampler's record keeps the generator slot at upstream's index
  // (arg_3, None). Both replay here.
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("fi_sampling_rec_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  recorder::Config c;
  c.dump_dir = dir.string();
  recorder::start(c);
  const Tensor probs = make_rows({{0.1, 0.4, 0.2, 0.3}, {0.25, 0.15, 0.5, 0.1}});
  (void)top_k_renorm_probs(probs, 2);
  (void)sampling_from_probs(probs, std::nullopt, true, false, int64_t{5}, int64_t{8});
  recorder::stop();
  std::vector<fs::path> calls;  // top_k_renorm_probs first (names sort by time, then op)
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory()) calls.push_back(e.path());
  }
  std::sort(calls.begin(), calls.end(), [](const fs::path& a, const fs::path& b) {
    return a.string().ends_with("top_k_renorm_probs_call0001") >
           b.string().ends_with("top_k_renorm_probs_call0001");
  });
  ASSERT_EQ(calls.size(), 2u);
  const auto meta = [](const fs::path& call) {
    return nlohmann::json::parse(replay::read_metadata((call / "metadata.jsonl").string()).json);
  };
  const nlohmann::json k = meta(calls[0]), s = meta(calls[1]);
  EXPECT_EQ(k["function_name"], "top_k_renorm_probs");
  EXPECT_EQ(k["function_signature"], "(probs, top_k, is_deterministic=False)");
  EXPECT_EQ(k["input_metadata"], nlohmann::json({{"arg_1", 2}, {"arg_2", false}}));
  EXPECT_EQ(k["tensor_info"]["input_tensor_keys"], nlohmann::json({"arg_0"}));
  EXPECT_EQ(s["function_name"], "sampling_from_probs");
  EXPECT_EQ(s["input_metadata"], nlohmann::json({{"arg_1", nullptr},
                                                 {"arg_2", true},
                                                 {"arg_3", nullptr},
                                                 {"arg_4", false},
                                                 {"arg_5", 5},
                                                 {"arg_6", 8},
                                                 {"arg_7", false}}));
  for (const fs::path& call : calls) {
    const replay::Result r = replay::replay_from_dump(call.string());
    EXPECT_EQ(r.status, replay::Status::kPassed) << call << ": " << r.error;
  }
  fs::remove_all(dir);
}

TEST(SamplingDecl, InvokerReplaysTheCall) {
  const Tensor probs = make_rows({kDist, kDist});
  const OpDecl* d = OpRegistry::global().find("top_p_sampling_from_probs");
  ASSERT_NE(d, nullptr);
  const Tensor idx = draw_indices();
  std::vector<Value> args = bind_arguments(
      *d, {Value(probs), Value(0.5), Value(idx)},
      {{"seed", Value(int64_t{11})}, {"offset", Value(int64_t{4})}, {"return_valid", Value(true)}});
  const Value v = d->invoke(CallArgs(*d, std::move(args)));
  ASSERT_EQ(v.kind(), Value::Kind::kTuple);
  const SamplingResult direct =
      top_p_sampling_from_probs(probs, 0.5, idx, true, false, int64_t{11}, int64_t{4}, true);
  EXPECT_EQ(ints(v.items()[0].as_tensor()), ints(direct.samples));
  EXPECT_EQ(ints(v.items()[1].as_tensor()), ints(direct.valid));
}

TEST(SamplingDecl, EveryInvokerMatchesTheDirectCall) {
  // Every op run from Values (as replay does), all parameters passed by keyword, against the
  // direct C++ call with the same arguments.
  const Tensor probs = make_rows({kDist, kDist});
  std::vector<double> lg;
  for (double v : kDist) lg.push_back(std::log(v));
  const Tensor logits = make_rows({lg, lg});
  const Tensor idx = int_tensor({1, 0, 1, 1, 0}, DType::kInt64);
  const Value seed(int64_t{3}), off(int64_t{8});
  auto invoke = [](const char* name, std::vector<Value> pos,
                   std::vector<std::pair<std::string, Value>> kw) {
    const OpDecl* d = OpRegistry::global().find(name);
    EXPECT_NE(d, nullptr) << name;
    return d->invoke(CallArgs(*d, bind_arguments(*d, std::move(pos), std::move(kw))));
  };
  auto tensor_of = [](const Value& v) { return ints(v.as_tensor()); };
  auto pair_of = [](const Value& v) {
    return std::make_pair(ints(v.items()[0].as_tensor()), ints(v.items()[1].as_tensor()));
  };
  auto pair_direct = [](const SamplingResult& r) {
    return std::make_pair(ints(r.samples), ints(r.valid));
  };
  const std::vector<std::pair<std::string, Value>> tail = {
      {"indices", Value(idx)}, {"check_nan", Value(true)}, {"seed", seed}, {"offset", off}};
  auto with = [&](std::vector<std::pair<std::string, Value>> kw, bool rv) {
    kw.insert(kw.end(), tail.begin(), tail.end());
    if (rv) kw.emplace_back("return_valid", Value(true));
    return kw;
  };
  EXPECT_EQ(pair_of(invoke("sampling_from_probs", {Value(probs)}, with({}, true))),
            pair_direct(sampling_from_probs(probs, idx, true, true, 3, 8, true)));
  EXPECT_EQ(tensor_of(invoke("sampling_from_logits", {Value(logits)}, with({}, false))),
            ints(sampling_from_logits(logits, idx, true, true, 3, 8)));
  EXPECT_EQ(pair_of(invoke("top_p_sampling_from_probs", {Value(probs)},
                           with({{"top_p", Value(0.5)}}, true))),
            pair_direct(top_p_sampling_from_probs(probs, 0.5, idx, true, true, 3, 8, true)));
  EXPECT_EQ(pair_of(invoke("top_k_sampling_from_probs", {Value(probs)},
                           with({{"top_k", Value(int64_t{3})}}, true))),
            pair_direct(top_k_sampling_from_probs(probs, 3, idx, true, true, 3, 8, true)));
  EXPECT_EQ(pair_of(invoke("min_p_sampling_from_probs", {Value(probs)},
                           with({{"min_p", Value(0.3)}}, true))),
            pair_direct(min_p_sampling_from_probs(probs, 0.3, idx, true, true, 3, 8, true)));
  for (const char* order : {"top_k_first", "joint"}) {
    const auto kw = with({{"top_k", Value(int64_t{4})},
                          {"top_p", Value(0.55)},
                          {"filter_apply_order", Value(order)}},
                         false);
    auto kw_rv = kw;
    kw_rv.emplace_back("return_valid", Value(true));
    EXPECT_EQ(pair_of(invoke("top_k_top_p_sampling_from_probs", {Value(probs)}, kw_rv)),
              pair_direct(top_k_top_p_sampling_from_probs(probs, 4, 0.55, idx, order, true, true, 3,
                                                          8, true)))
        << order;
    EXPECT_EQ(tensor_of(invoke("top_k_top_p_sampling_from_logits", {Value(logits)}, kw)),
              ints(top_k_top_p_sampling_from_logits(logits, 4, 0.55, idx, order, true, true, 3, 8)))
        << order;
  }
  const Tensor t = Tensor::from_vector({0.5, 2.0}, {2}, DType::kFloat32);
  EXPECT_TRUE(all_close(invoke("softmax", {Value(logits)}, {{"temperature", Value(t)}}).as_tensor(),
                        softmax(logits, t), {0, 0}));
  EXPECT_TRUE(
      all_close(invoke("top_k_mask_logits", {Value(logits), Value(int64_t{2})}, {}).as_tensor(),
                top_k_mask_logits(logits, 2), {0, 0}));
  EXPECT_TRUE(
      all_close(invoke("top_k_renorm_probs", {Value(probs), Value(int64_t{2})}, {}).as_tensor(),
                top_k_renorm_probs(probs, 2), {0, 0}));
  EXPECT_TRUE(all_close(invoke("top_p_renorm_probs", {Value(probs), Value(0.4)}, {}).as_tensor(),
                        top_p_renorm_probs(probs, 0.4), {0, 0}));
}

// ------------------------------------------------------------------------------------------
// softmax

TEST(Softmax, GoldenAndFormula) {
  // softmax([0, ln 3]) = [1/4, 3/4]; with temperature 2: [1/(1+sqrt3), sqrt3/(1+sqrt3)].
  const Tensor x = make_rows({{0.0, std::log(3.0)}});
  EXPECT_TRUE(all_close(softmax(x), {0.25, 0.75}, {1e-7, 1e-6}));
  const double r3 = std::sqrt(3.0);
  EXPECT_TRUE(all_close(softmax(x, 2.0), {1 / (1 + r3), r3 / (1 + r3)}, {1e-7, 1e-6}));
  // Upstream 0.7.4 scales by 1 / T (each product rounded): temperature 0 gives a uniform row.
  EXPECT_TRUE(all_close(softmax(x, 0.0), {0.5, 0.5}, {0.0, 0.0}));
  // x = 5, T = 0.7: 5 * fp32(1 / 0.7) = 7.1428576, where 5 / 0.7 rounds to 7.1428571.
  EXPECT_EQ(kernels::sampling_scaled_logit(5.0f, kernels::sampling_inv_temperature(0.7f)),
            5.0f * (1.0f / 0.7f));
  EXPECT_NE(5.0f * (1.0f / 0.7f), 5.0f / 0.7f);

  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    Tensor logits = Tensor::empty({5, 300}, dt);
    logits.normal_(3, 0.0, 4.0);
    const std::vector<double> temps = {0.5, 1.0, 1.7, 3.0, 0.25};
    Tensor t = Tensor::from_vector(temps, {5}, DType::kFloat32);
    const std::vector<double> xv = logits.to_double_vector();
    for (int mode = 0; mode < 3; ++mode) {
      std::vector<double> expect;
      for (int b = 0; b < 5; ++b) {
        std::vector<double> row(xv.begin() + b * 300, xv.begin() + (b + 1) * 300);
        const double temp = mode == 0 ? 1.0 : mode == 1 ? 0.8 : temps[b];
        const auto s = softmax64(row, temp);
        expect.insert(expect.end(), s.begin(), s.end());
      }
      const Tensor out = mode == 0   ? softmax(logits)
                         : mode == 1 ? softmax(logits, 0.8)
                                     : softmax(logits, t);
      EXPECT_EQ(out.dtype(), DType::kFloat32);
      // fp32 math on exactly representable inputs: a few ulp of the largest probability.
      EXPECT_TRUE(all_close(out, expect, {1e-7, 2e-5})) << dtype_torch_name(dt) << " mode " << mode;
    }
  }
}

TEST(Softmax, StridedInput) {
  Tensor big = Tensor::empty({64, 6}, DType::kFloat32);
  big.uniform_(5, -3.0, 3.0);
  const Tensor view = big.transpose(0, 1).slice(1, 0, 64, 2);  // [6, 32], strides (1, 12)
  const std::vector<double> xv = view.to_double_vector();
  std::vector<double> expect;
  for (int b = 0; b < 6; ++b) {
    const auto s = softmax64({xv.begin() + b * 32, xv.begin() + (b + 1) * 32}, 1.5);
    expect.insert(expect.end(), s.begin(), s.end());
  }
  EXPECT_TRUE(all_close(softmax(view, 1.5), expect, {1e-7, 2e-5}));
}

// ------------------------------------------------------------------------------------------
// Filters

TEST(Filters, UpstreamDocGoldens) {
  // flashinfer.sampling docstring examples (rounded values as printed there).
  const Tensor prob = make_rows({{0.2499, 0.2592, 0.1085, 0.2718, 0.1106},
                                 {0.2205, 0.0942, 0.2912, 0.3452, 0.0489},
                                 {0.2522, 0.1602, 0.2346, 0.1532, 0.2000},
                                 {0.1543, 0.3182, 0.2062, 0.0958, 0.2255}});
  EXPECT_TRUE(all_close(
      top_p_renorm_probs(prob, 0.3),
      {0, 0.4882, 0, 0.5118, 0, 0, 0, 0, 1, 0, 0.5181, 0, 0.4819, 0, 0, 0, 1, 0, 0, 0}, {1e-4, 0}));
  EXPECT_TRUE(all_close(top_k_renorm_probs(prob, 3),
                        {0.3201, 0.3319, 0, 0.3480, 0, 0.2573, 0,      0.3398, 0.4028, 0, 0.3672,
                         0,      0.3416, 0, 0.2912, 0, 0.4243, 0.2750, 0,      0.3007},
                        {1e-4, 0}));
  const Tensor logits = make_rows({{1.9269, 1.4873, 0.9007, -2.1055, -0.7581},
                                   {1.0783, 0.8008, 1.6806, 0.3559, -0.6866},
                                   {-0.4934, 0.2415, -0.2316, 0.0418, -0.2516},
                                   {0.8599, -0.3097, -0.3957, 0.8034, -0.6216}});
  const double ninf = -INFINITY;
  EXPECT_TRUE(
      all_close(top_k_mask_logits(logits, 3),
                {1.9269, 1.4873, 0.9007,  ninf,   ninf, 1.0783, 0.8008,  1.6806, ninf,   ninf,
                 ninf,   0.2415, -0.2316, 0.0418, ninf, 0.8599, -0.3097, ninf,   0.8034, ninf},
                {1e-6, 1e-6}));
}

TEST(Filters, TiesAtTheBoundaryAreKept) {
  // Fewer than k strictly larger: with k = 2 both 3s are kept and the 2 is not; with k = 3 the
  // 2 (two larger) is kept too. NaN is never kept.
  const Tensor x = make_rows({{1, 3, 2, 3, 0}, {NAN, 1, 2, -INFINITY, 5}});
  const double ninf = -INFINITY;
  EXPECT_TRUE(
      all_close(top_k_mask_logits(x, 2), {ninf, 3, ninf, 3, ninf, ninf, ninf, 2, ninf, 5}, {0, 0}));
  const Tensor k = int_tensor({3, 4}, DType::kInt64);
  EXPECT_TRUE(
      all_close(top_k_mask_logits(x, k), {ninf, 3, 2, 3, ninf, ninf, 1, 2, ninf, 5}, {0, 0}));
  const Tensor p = make_rows({{0.1, 0.3, 0.2, 0.3, 0.1}});
  EXPECT_TRUE(all_close(top_k_renorm_probs(p, 2), {0, 0.5, 0, 0.5, 0}, {1e-7, 1e-6}));
  // top-p compares the strictly larger mass: none above either 0.3, so both stay; the 0.2 has
  // 0.6 above it (kept only once top_p exceeds 0.6, and it is the crossing token then).
  EXPECT_TRUE(all_close(top_p_renorm_probs(p, 0.31), {0, 0.5, 0, 0.5, 0}, {1e-7, 1e-6}));
  EXPECT_TRUE(all_close(top_p_renorm_probs(p, 0.61), {0, 0.375, 0.25, 0.375, 0}, {1e-7, 1e-6}));
}

TEST(Filters, FormulaGrid) {
  // Random rows; top_p values at midpoints between consecutive cumulative masses so the fp32
  // sums cannot land on the other side of a boundary.
  const int64_t B = 6, V = 257;
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    Tensor raw = Tensor::empty({B, V}, DType::kFloat32);
    raw.uniform_(17, 0.0, 1.0);
    std::vector<double> rv = raw.to_double_vector();
    for (double& v : rv) v = v * v * v;
    Rows rows(B);
    for (int64_t b = 0; b < B; ++b) {
      double s = 0;
      for (int64_t i = 0; i < V; ++i) s += rv[b * V + i];
      for (int64_t i = 0; i < V; ++i) rows[b].push_back(rv[b * V + i] / s);
    }
    const Tensor probs = make_rows(rows, dt);
    const std::vector<double> pv = probs.to_double_vector();
    std::vector<int64_t> ks = {1, 2, 17, 100, 256, 1000};
    std::vector<double> tps;
    std::vector<double> exp_k, exp_p, exp_mask;
    for (int64_t b = 0; b < B; ++b) {
      std::vector<double> p(pv.begin() + b * V, pv.begin() + (b + 1) * V);
      std::vector<double> sorted = p;
      std::sort(sorted.rbegin(), sorted.rend());
      double c = 0;
      std::vector<double> cum;
      for (double v : sorted) cum.push_back(c += v);
      const std::size_t at = static_cast<std::size_t>(b * 37 % (V - 2));
      tps.push_back(at == 0 ? cum[0] * 0.5 : (cum[at - 1] + cum[at]) * 0.5);
      const auto kk = top_k_keep(p, ks[b]);
      const auto rk = renorm(p, kk);
      exp_k.insert(exp_k.end(), rk.begin(), rk.end());
      const auto rp = renorm(p, top_p_keep(p, tps.back()));
      exp_p.insert(exp_p.end(), rp.begin(), rp.end());
      for (int64_t i = 0; i < V; ++i) exp_mask.push_back(kk[i] ? p[i] : -INFINITY);
    }
    const Tensor kt = int_tensor(ks);
    const Tensor pt = Tensor::from_vector(tps, {B}, DType::kFloat32);
    const Tensor rk = top_k_renorm_probs(probs, kt);
    EXPECT_EQ(rk.dtype(), dt);
    EXPECT_TRUE(all_close(rk, exp_k, default_tolerance(dt))) << dtype_torch_name(dt);
    const Tensor rp = top_p_renorm_probs(probs, pt);
    EXPECT_EQ(rp.dtype(), DType::kFloat32);
    EXPECT_TRUE(all_close(rp, exp_p, {1e-7, 1e-5})) << dtype_torch_name(dt);
    EXPECT_TRUE(all_close(top_k_mask_logits(probs, kt), exp_mask, {0, 0})) << dtype_torch_name(dt);
  }
}

TEST(Filters, StridedInputAndAllZeroRow) {
  Tensor big = Tensor::zeros({8, 2}, DType::kFloat32);
  const Tensor view = big.transpose(0, 1);  // [2, 8], strides (1, 2)
  view.select(0, 0).copy_(
      Tensor::from_vector({0.1, 0.2, 0.05, 0.3, 0.1, 0.1, 0.1, 0.05}, {8}, DType::kFloat32));
  EXPECT_TRUE(all_close(top_k_renorm_probs(view, 2),
                        {0, 0.4, 0, 0.6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {1e-7, 1e-6}));
  EXPECT_TRUE(all_close(top_p_renorm_probs(view, 0.4),
                        {0, 0.4, 0, 0.6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {1e-7, 1e-6}));
}

// ------------------------------------------------------------------------------------------
// Samplers: forced answers

TEST(Samplers, OneHotIsForced) {
  Rows rows(5, std::vector<double>(50, 0.0));
  const int64_t hot[] = {0, 49, 7, 23, 31};
  for (int b = 0; b < 5; ++b) rows[b][hot[b]] = 1.0;
  const std::vector<int64_t> want(hot, hot + 5);
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const Tensor p = make_rows(rows, dt);
    for (int64_t seed = 0; seed < 20; ++seed) {
      const int64_t off = seed * 13;
      EXPECT_EQ(ints(sampling_from_probs(p, std::nullopt, true, false, seed, off).samples), want);
      EXPECT_EQ(ints(top_k_sampling_from_probs(p, 3, std::nullopt, true, false, seed, off).samples),
                want);
      EXPECT_EQ(
          ints(top_p_sampling_from_probs(p, 0.9, std::nullopt, true, false, seed, off).samples),
          want);
      EXPECT_EQ(
          ints(min_p_sampling_from_probs(p, 0.1, std::nullopt, true, false, seed, off).samples),
          want);
      for (const char* order : {"top_k_first", "joint"}) {
        EXPECT_EQ(ints(top_k_top_p_sampling_from_probs(p, 2, 0.5, std::nullopt, order, true, false,
                                                       seed, off)
                           .samples),
                  want);
      }
    }
  }
}

TEST(Samplers, TopKOneTopPTinyMinPOneGiveTheArgmax) {
  Tensor raw = Tensor::empty({16, 300}, DType::kFloat32);
  raw.uniform_(23, 0.0, 1.0);
  Rows rows(16);
  std::vector<int64_t> argmax;
  const std::vector<double> rv = raw.to_double_vector();
  for (int b = 0; b < 16; ++b) {
    rows[b].assign(rv.begin() + b * 300, rv.begin() + (b + 1) * 300);
    const double s = std::accumulate(rows[b].begin(), rows[b].end(), 0.0);
    for (double& v : rows[b]) v /= s;
    argmax.push_back(std::max_element(rows[b].begin(), rows[b].end()) - rows[b].begin());
  }
  const Tensor p = make_rows(rows);
  for (int64_t seed = 0; seed < 10; ++seed) {
    EXPECT_EQ(ints(top_k_sampling_from_probs(p, 1, std::nullopt, true, false, seed, 0).samples),
              argmax);
    EXPECT_EQ(ints(top_p_sampling_from_probs(p, 1e-6, std::nullopt, true, false, seed, 0).samples),
              argmax);
    EXPECT_EQ(ints(min_p_sampling_from_probs(p, 1.0, std::nullopt, true, false, seed, 0).samples),
              argmax);
    EXPECT_EQ(
        ints(top_k_top_p_sampling_from_probs(p, 1, 1.0, std::nullopt, "joint", true, false, seed, 0)
                 .samples),
        argmax);
    EXPECT_EQ(ints(top_k_top_p_sampling_from_probs(p, 50, 1e-6, std::nullopt, "top_k_first", true,
                                                   false, seed, 0)
                       .samples),
              argmax);
    // Logits: a lead of 100 beats any Gumbel noise (bounded in [-3.2, 16.7]).
    std::vector<double> lg(16 * 300, 0.0);
    for (int b = 0; b < 16; ++b) lg[b * 300 + argmax[b]] = 100.0;
    const Tensor logits = Tensor::from_vector(lg, {16, 300}, DType::kFloat32);
    EXPECT_EQ(ints(sampling_from_logits(logits, std::nullopt, true, false, seed, 5)), argmax);
    EXPECT_EQ(ints(top_k_top_p_sampling_from_logits(logits, 5, 0.9, std::nullopt, "top_k_first",
                                                    true, false, seed, 5)),
              argmax);
  }
}

TEST(Samplers, ValidFlagAndIndicesDtype) {
  const Tensor p = make_rows({{0, 0, 0, 0}, {0, 0.5, 0.5, 0}, {NAN, NAN, NAN, NAN}});
  for (int which = 0; which < 4; ++which) {
    SamplingResult r;
    switch (which) {
      case 0:
        r = sampling_from_probs(p, std::nullopt, true, false, 1, 0, true);
        break;
      case 1:
        r = top_k_sampling_from_probs(p, 2, std::nullopt, true, false, 1, 0, true);
        break;
      case 2:
        r = top_p_sampling_from_probs(p, 0.9, std::nullopt, true, false, 1, 0, true);
        break;
      default:
        r = min_p_sampling_from_probs(p, 0.5, std::nullopt, true, false, 1, 0, true);
        break;
    }
    ASSERT_TRUE(r.valid.defined());
    EXPECT_EQ(r.valid.dtype(), DType::kBool);
    EXPECT_EQ(ints(r.valid), (std::vector<int64_t>{0, 1, 0})) << which;
    const auto s = ints(r.samples);
    EXPECT_EQ(s[0], 0);
    EXPECT_TRUE(s[1] == 1 || s[1] == 2);
    EXPECT_EQ(s[2], 0);
  }
  EXPECT_FALSE(sampling_from_probs(p, std::nullopt, true, false, 1, 0).valid.defined());
  const Tensor idx64 = int_tensor({1, 1, 0}, DType::kInt64);
  const SamplingResult r = sampling_from_probs(p, idx64, true, false, 3, 0, true);
  EXPECT_EQ(r.samples.dtype(), DType::kInt64);
  EXPECT_EQ(r.samples.shape(), (Shape{3}));
  EXPECT_EQ(ints(r.valid), (std::vector<int64_t>{1, 1, 0}));
  EXPECT_EQ(sampling_from_probs(p).samples.dtype(), DType::kInt32);
}

// ------------------------------------------------------------------------------------------
// Samplers: the documented stream, replayed in the test

TEST(Samplers, ProbsFollowTheDocumentedStream) {
  // Row b draws u = curand_uniform after curand_init(seed, b, offset) and returns the first token
  // whose inclusive prefix sum exceeds u. Rows whose u lies within 1e-5 of a prefix sum are
  // skipped (fp32 vs fp64 summation); with these sizes that is rarely more than one row.
  const int64_t B = 64, V = 40;
  Tensor raw = Tensor::empty({B, V}, DType::kFloat32);
  raw.uniform_(29, 0.0, 1.0);
  Rows rows(B);
  const std::vector<double> rv = raw.to_double_vector();
  for (int64_t b = 0; b < B; ++b) {
    rows[b].assign(rv.begin() + b * V, rv.begin() + (b + 1) * V);
    const double s = std::accumulate(rows[b].begin(), rows[b].end(), 0.0);
    for (double& v : rows[b]) v /= s;
    rows[b] = as_f32(rows[b]);
  }
  const Tensor p = make_rows(rows);
  const uint64_t seed = 0xfeedbeefcafe1234ull, offset = 6;
  const auto got =
      ints(sampling_from_probs(p, std::nullopt, true, false, static_cast<int64_t>(seed), int64_t{6})
               .samples);
  int checked = 0;
  for (int64_t b = 0; b < B; ++b) {
    kernels::PhiloxStream s(seed, static_cast<uint64_t>(b), offset);
    const double u = s.next_uniform();
    double c = 0.0, margin = 1.0;
    int64_t want = -1;
    for (int64_t i = 0; i < V; ++i) {
      c += rows[b][i];
      margin = std::min(margin, std::fabs(c - u));
      if (want < 0 && c > u) want = i;
    }
    if (margin < 1e-5) continue;
    ++checked;
    EXPECT_EQ(got[b], want) << "row " << b;
  }
  EXPECT_GE(checked, B - 3);
}

TEST(Samplers, LogitsFollowUpstreamsGumbelLayout) {
  // Upstream 0.6.18 (SamplingFromLogitsKernel / GenerateGumbelNoise, fp32 logits): the row is read
  // in vectors of w = gcd(4, V) elements; the vector starting at element f of output row b draws
  // from cuRAND stream (seed, subsequence b * V + f) at position `offset`, its element f + k taking
  // word offset + k; the score is logit - ln2 * log2(-log2(u * (1 - 2^-23))), the largest wins.
  // Checked in fp64 here, rows with a near tie skipped.
  const int64_t B = 6, seed = 123456789, offset = 4099;  // offset unaligned to a Philox block
  for (int64_t V : {int64_t{97}, int64_t{98}, int64_t{100}}) {  // w = 1, 2, 4
    const int64_t w = V % 4 == 0 ? 4 : V % 2 == 0 ? 2 : 1;
    Tensor logits = Tensor::empty({B, V}, DType::kFloat32);
    logits.normal_(31, 0.0, 2.0);
    const std::vector<double> lv = logits.to_double_vector();
    const auto got = ints(sampling_from_logits(logits, std::nullopt, true, false, seed, offset));
    int checked = 0;
    for (int64_t b = 0; b < B; ++b) {
      double best = -INFINITY, second = -INFINITY;
      int64_t want = -1;
      for (int64_t t = 0; t < V; ++t) {
        const int64_t f = t - t % w;
        const uint64_t sub = static_cast<uint64_t>(b * V + f);
        kernels::PhiloxStream st(seed, sub, static_cast<uint64_t>(offset + t % w));
        const double u = static_cast<double>(st.next_uniform()) * (1.0 - 0x1p-23);
        const double score = lv[b * V + t] - std::log(2.0) * std::log2(-std::log2(u));
        if (score > best) {
          second = best;
          best = score;
          want = t;
        } else {
          second = std::max(second, score);
        }
      }
      if (best - second < 1e-4) continue;  // a near tie fp32 may resolve either way
      ++checked;
      EXPECT_EQ(got[b], want) << "V " << V << " row " << b;
    }
    EXPECT_GE(checked, B - 1);
  }
  // The subsequence is computed in 32-bit arithmetic upstream (b * V wraps past 2^32).
  EXPECT_EQ(kernels::gumbel_subsequence(1, 6, 2), 8u);
  EXPECT_EQ(kernels::gumbel_subsequence(40000, 131072, 4), 947912708u);
  EXPECT_EQ(kernels::gumbel_vec_width(128256), 4);
  EXPECT_EQ(kernels::gumbel_vec_width(151938), 2);
  EXPECT_EQ(kernels::gumbel_vec_width(32001), 1);
}

// ------------------------------------------------------------------------------------------
// Samplers: filters never violated

TEST(Samplers, FiltersNeverViolated) {
  const int64_t V = 200, U = 3, B = 3000;
  Tensor raw = Tensor::empty({U, V}, DType::kFloat32);
  raw.uniform_(41, 0.0, 1.0);
  const std::vector<double> rv = raw.to_double_vector();
  Rows rows(U);
  for (int64_t u = 0; u < U; ++u) {
    for (int64_t i = 0; i < V; ++i) rows[u].push_back(std::pow(rv[u * V + i], 4.0));
    const double s = std::accumulate(rows[u].begin(), rows[u].end(), 0.0);
    for (double& v : rows[u]) v /= s;
    rows[u] = as_f32(rows[u]);
  }
  const Tensor probs = make_rows(rows);
  // Thresholds per input row (upstream 0.7.4 reads them at indices[b], one entry per probs row).
  std::vector<int64_t> idx(B), ks(U);
  std::vector<double> tps(U), mps(U);
  for (int64_t b = 0; b < B; ++b) idx[b] = (b * 7) % U;
  for (int64_t u = 0; u < U; ++u) {
    ks[u] = 1 + (u * 13 + 5) % 40;
    // midpoints between sorted cumulative masses / between sorted ratios: wide margins.
    std::vector<double> s = rows[u];
    std::sort(s.rbegin(), s.rend());
    const std::size_t at = 1 + static_cast<std::size_t>((u * 11 + 7) % 60);
    double c = 0;
    for (std::size_t i = 0; i < at; ++i) c += s[i];
    tps[u] = c + s[at] * 0.5;
    mps[u] = (s[at] + s[at + 1]) * 0.5 / s[0];
  }
  const Tensor it = int_tensor(idx), kt = int_tensor(ks, DType::kInt64);
  const Tensor pt = Tensor::from_vector(tps, {U}, DType::kFloat32);
  const Tensor mt = Tensor::from_vector(mps, {U}, DType::kFloat32);
  const int64_t seed = 99, off = 1000;
  const auto sk = ints(top_k_sampling_from_probs(probs, kt, it, true, false, seed, off).samples);
  const auto sp = ints(top_p_sampling_from_probs(probs, pt, it, true, false, seed, off).samples);
  const auto sm = ints(min_p_sampling_from_probs(probs, mt, it, true, false, seed, off).samples);
  const auto sj = ints(
      top_k_top_p_sampling_from_probs(probs, kt, pt, it, "joint", true, false, seed, off).samples);
  const auto sf =
      ints(top_k_top_p_sampling_from_probs(probs, kt, pt, it, "top_k_first", true, false, seed, off)
               .samples);
  int64_t bad = 0;
  for (int64_t b = 0; b < B; ++b) {
    // Upstream 0.7.4's reading of per-row thresholds through indices: top_k, top_p and min_p
    // all at the input row r = idx[b] (0.6.18 read the top-k sampler's top_k and min_p at the
    // output row).
    const int64_t r = idx[b];
    const auto& p = rows[r];
    const auto kp = top_p_keep(p, tps[r]);
    const auto kr = top_k_keep(p, ks[r]);
    bad += !kr[sk[b]];
    bad += !kp[sp[b]];
    bad += !min_p_keep(p, mps[r])[sm[b]];
    bad += !(kr[sj[b]] && kp[sj[b]]);
    // top_k_first applies top_p to the renormalized top-k, where tps has no chosen margin:
    // allow 1e-5 of fp32 summation slack there.
    bad += !(kr[sf[b]] && top_p_keep(renorm(p, kr), tps[r] + 1e-5)[sf[b]]);
  }
  EXPECT_EQ(bad, 0);
}

// ------------------------------------------------------------------------------------------
// Samplers: chi-square against the filtered, renormalized distribution

TEST(Samplers, ChiSquareProbs) {
  const Tensor probs = make_rows({kDist});
  const Tensor idx = draw_indices();
  const auto p = as_f32(kDist);
  const int64_t seed = 2024;
  const std::vector<bool> all(p.size(), true);
  EXPECT_TRUE(chi_square_ok(ints(sampling_from_probs(probs, idx, true, false, seed, 0).samples),
                            renorm(p, all)));
  EXPECT_TRUE(
      chi_square_ok(ints(top_k_sampling_from_probs(probs, 4, idx, true, false, seed, 0).samples),
                    renorm(p, top_k_keep(p, 4))));
  EXPECT_TRUE(
      chi_square_ok(ints(top_p_sampling_from_probs(probs, 0.5, idx, true, false, seed, 0).samples),
                    renorm(p, top_p_keep(p, 0.5))));
  EXPECT_TRUE(
      chi_square_ok(ints(min_p_sampling_from_probs(probs, 0.3, idx, true, false, seed, 0).samples),
                    renorm(p, min_p_keep(p, 0.3))));
  // joint k=4, p=0.55 keeps 3 tokens (masses above them 0, .25, .45; the 4th has .6 above it);
  // top_k_first with p=0.6 renormalizes the top 4 first (.347 .278 .208 .167) and keeps 2.
  EXPECT_TRUE(chi_square_ok(
      ints(top_k_top_p_sampling_from_probs(probs, 4, 0.55, idx, "joint", true, false, seed, 0)
               .samples),
      renorm(p, both(top_k_keep(p, 4), top_p_keep(p, 0.55)))));
  const auto k4 = renorm(p, top_k_keep(p, 4));
  EXPECT_TRUE(chi_square_ok(
      ints(top_k_top_p_sampling_from_probs(probs, 4, 0.6, idx, "top_k_first", true, false, seed, 0)
               .samples),
      renorm(k4, top_p_keep(k4, 0.6))));
  // A per-row top-k of 2 in joint mode: top-k is the binding filter.
  EXPECT_TRUE(chi_square_ok(
      ints(top_k_top_p_sampling_from_probs(probs, int_tensor(std::vector<int64_t>(1, 2)), 0.7, idx,
                                           "joint", true, false, seed, 0)
               .samples),
      renorm(p, top_k_keep(p, 2))));
}

TEST(Samplers, ChiSquareLogits) {
  std::vector<double> lg;
  for (double v : kDist) lg.push_back(std::log(v) + 3.0);  // softmax(lg) == kDist
  const Tensor logits = make_rows({lg});
  const Tensor idx = draw_indices();
  const auto p = softmax64(as_f32(lg));
  const int64_t seed = 77;
  EXPECT_TRUE(chi_square_ok(ints(sampling_from_logits(logits, idx, true, false, seed, 0)), p));
  const auto k4 = renorm(p, top_k_keep(p, 4));
  EXPECT_TRUE(chi_square_ok(ints(top_k_top_p_sampling_from_logits(
                                logits, 4, 0.6, idx, "top_k_first", true, false, seed, 0)),
                            renorm(k4, top_p_keep(k4, 0.6))));
  EXPECT_TRUE(chi_square_ok(
      ints(top_k_top_p_sampling_from_logits(logits, 4, 0.55, idx, "joint", true, false, seed, 0)),
      renorm(p, both(top_k_keep(p, 4), top_p_keep(p, 0.55)))));
}

// ------------------------------------------------------------------------------------------
// Determinism and the default stream

TEST(Samplers, DeterministicForFixedSeedAndOffset) {
  const Tensor probs = make_rows({kDist, kDist, kDist});
  const Tensor idx = draw_indices();
  auto run = [&](int64_t seed, int64_t off) {
    return ints(top_k_top_p_sampling_from_probs(probs, 6, 0.8, idx, "joint", true, false, seed, off)
                    .samples);
  };
  EXPECT_EQ(run(5, 8), run(5, 8));
  EXPECT_NE(run(5, 8), run(5, 40));
  EXPECT_NE(run(5, 8), run(6, 8));
  // Length-1 tensors equal scalars; a per-row tensor of equal values equals the scalar too.
  const Tensor s1 = int_tensor({5}, DType::kInt64), o1 = int_tensor({8}, DType::kInt64);
  EXPECT_EQ(ints(top_k_top_p_sampling_from_probs(probs, 6, 0.8, idx, "joint", true, false, s1, o1)
                     .samples),
            run(5, 8));
  const Tensor sb = int_tensor(std::vector<int64_t>(kDraws, 5), DType::kInt64);
  EXPECT_EQ(ints(top_k_top_p_sampling_from_probs(probs, 6, 0.8, idx, "joint", true, false, sb, o1)
                     .samples),
            run(5, 8));
  // A seed tensor with one entry a row: row b draws with seed[b] and offset[b], as upstream
  // 0.7.4's kernels read them (0.6.18 read element 0 for every row); each row's Philox
  // subsequence is still its output row, so row b equals row b of a scalar call with its pair.
  const Tensor two = make_rows({kDist});
  const Tensor i2 = int_tensor({0, 0});
  const auto a = ints(sampling_from_logits(two, i2, true, false, int_tensor({1, 2}, DType::kInt64),
                                           int_tensor({0, 9}, DType::kInt64)));
  EXPECT_EQ(a[0], ints(sampling_from_logits(two, i2, true, false, 1, 0))[0]);
  EXPECT_EQ(a[1], ints(sampling_from_logits(two, i2, true, false, 2, 9))[1]);
  std::vector<int64_t> seeds(kDraws), offsets(kDraws);
  for (int64_t i = 0; i < kDraws; ++i) seeds[i] = 5 + i, offsets[i] = 8 + 4 * i;
  const auto per_row =
      ints(top_p_sampling_from_probs(probs, 0.8, idx, true, false, int_tensor(seeds, DType::kInt64),
                                     int_tensor(offsets, DType::kInt64))
               .samples);
  for (int64_t i : {int64_t{0}, int64_t{7}, kDraws - 1}) {
    EXPECT_EQ(per_row[i],
              ints(top_p_sampling_from_probs(probs, 0.8, idx, true, false, seeds[i], offsets[i])
                       .samples)[i])
        << i;
  }
}

TEST(Samplers, DefaultStreamAdvancesLikeUpstream) {
  const Tensor probs = make_rows({kDist});
  const Tensor idx = Tensor::from_vector(std::vector<double>(10, 0.0), {10}, DType::kInt32);
  sampling_manual_seed(4242);
  const auto first = ints(top_p_sampling_from_probs(probs, 0.9, idx).samples);
  const auto second = ints(top_p_sampling_from_probs(probs, 0.9, idx).samples);
  // The default stream draws at its offset, then advances it by 32 words per row (rounded to 4),
  // as upstream 0.7.4's get_seed_and_offset (0.6.18 drew at the advanced offset).
  EXPECT_EQ(first, ints(top_p_sampling_from_probs(probs, 0.9, idx, true, false, 4242, 0).samples));
  EXPECT_EQ(second,
            ints(top_p_sampling_from_probs(probs, 0.9, idx, true, false, 4242, 320).samples));
  sampling_manual_seed(4242);
  EXPECT_EQ(ints(top_p_sampling_from_probs(probs, 0.9, idx).samples), first);
  // Probs sampling reserves B words: 10 rows -> the next call draws at offset 12.
  sampling_manual_seed(9);
  const auto s0 = ints(sampling_from_probs(probs, idx).samples);
  const auto s = ints(sampling_from_probs(probs, idx).samples);
  EXPECT_EQ(s0, ints(sampling_from_probs(probs, idx, true, false, 9, 0).samples));
  EXPECT_EQ(s, ints(sampling_from_probs(probs, idx, true, false, 9, 12).samples));
}

// ------------------------------------------------------------------------------------------
// Recording: the result Value is upstream's (samples) or (samples, valid)

class CaptureObserver : public CallObserver {
 public:
  void on_call_begin(const OpDecl&, std::span<const Value>) override {}
  void on_call_end(const OpDecl& decl, std::span<const Value> args, const Value& r) override {
    name = decl.name;
    nargs = args.size();
    result = r;
  }
  void on_call_error(const OpDecl&, std::span<const Value>, std::string_view) override {}
  std::string name;
  std::size_t nargs = 0;
  Value result;
};

TEST(SamplingDecl, ObservedResultShape) {
  auto obs = std::make_shared<CaptureObserver>();
  add_call_observer(obs);
  const Tensor probs = make_rows({kDist});
  top_k_sampling_from_probs(probs, 3, std::nullopt, true, false, 1, 2, true);
  EXPECT_EQ(obs->name, "top_k_sampling_from_probs");
  EXPECT_EQ(obs->nargs, 9u);  // generator's slot included
  EXPECT_EQ(obs->result.kind(), Value::Kind::kTuple);
  top_k_sampling_from_probs(probs, 3, std::nullopt, true, false, 1, 2, false);
  EXPECT_EQ(obs->result.kind(), Value::Kind::kTensor);
  remove_call_observer(obs);
}

// ------------------------------------------------------------------------------------------
// Bad input

TEST(SamplingErrors, BadInput) {
  const Tensor p = make_rows({{0.5, 0.5, 0.0}, {0.2, 0.3, 0.5}});
  const char* tk = "top_k_sampling_from_probs";
  const char* tp = "top_p_sampling_from_probs";
  EXPECT_FI_ERROR(top_k_sampling_from_probs(p, 0), tk, "top_k");
  EXPECT_FI_ERROR(top_k_sampling_from_probs(p, -3), tk, "top_k");
  EXPECT_FI_ERROR(top_k_sampling_from_probs(p, int_tensor({2, 0})), tk, "top_k");
  EXPECT_FI_ERROR(top_k_sampling_from_probs(p, int_tensor({2, 2, 2})), tk, "top_k");
  EXPECT_FI_ERROR(top_k_sampling_from_probs(p, Tensor::from_vector({1, 2}, {2}, DType::kFloat32)),
                  tk, "top_k");
  EXPECT_FI_ERROR(top_k_renorm_probs(p, 0), "top_k_renorm_probs", "top_k");
  EXPECT_FI_ERROR(top_k_mask_logits(p, 0), "top_k_mask_logits", "top_k");
  for (double bad : {0.0, -0.1, 1.5, std::nan("")}) {
    EXPECT_FI_ERROR(top_p_sampling_from_probs(p, bad), tp, "top_p");
    EXPECT_FI_ERROR(top_p_renorm_probs(p, bad), "top_p_renorm_probs", "top_p");
    EXPECT_FI_ERROR(top_k_top_p_sampling_from_probs(p, 2, bad), "top_k_top_p_sampling_from_probs",
                    "top_p");
    EXPECT_FI_ERROR(top_k_top_p_sampling_from_logits(p, 2, bad), "top_k_top_p_sampling_from_logits",
                    "top_p");
  }
  EXPECT_FI_ERROR(
      top_p_sampling_from_probs(p, Tensor::from_vector({0.5, 0.0}, {2}, DType::kFloat32)), tp,
      "top_p");
  EXPECT_FI_ERROR(min_p_sampling_from_probs(p, 1.5), "min_p_sampling_from_probs", "min_p");
  EXPECT_FI_ERROR(min_p_sampling_from_probs(p, -0.5), "min_p_sampling_from_probs", "min_p");
  EXPECT_FI_ERROR(softmax(p, -1.0), "softmax", "temperature");
  EXPECT_FI_ERROR(softmax(p, Tensor::from_vector({1.0, -1.0}, {2}, DType::kFloat32)), "softmax",
                  "temperature");
  // Rank and dtype.
  const Tensor p1 = Tensor::from_vector({0.5, 0.5}, {2}, DType::kFloat32);
  const Tensor p3 = Tensor::zeros({2, 2, 2}, DType::kFloat32);
  EXPECT_FI_ERROR(sampling_from_probs(p1), "sampling_from_probs", "probs");
  EXPECT_FI_ERROR(sampling_from_probs(p3), "sampling_from_probs", "probs");
  EXPECT_FI_ERROR(top_p_sampling_from_probs(p3, 0.5), tp, "probs");
  EXPECT_FI_ERROR(sampling_from_logits(p1), "sampling_from_logits", "logits");
  EXPECT_FI_ERROR(softmax(p3), "softmax", "logits");
  EXPECT_FI_ERROR(top_k_mask_logits(p1, 1), "top_k_mask_logits", "logits");
  EXPECT_FI_ERROR(sampling_from_probs(Tensor::zeros({2, 3}, DType::kInt32)), "sampling_from_probs",
                  "probs");
  EXPECT_FI_ERROR(sampling_from_probs(Tensor::zeros({2, 0}, DType::kFloat32)),
                  "sampling_from_probs", "probs");
  // Indices.
  EXPECT_FI_ERROR(sampling_from_probs(p, int_tensor({0, 2})), "sampling_from_probs", "indices");
  EXPECT_FI_ERROR(sampling_from_probs(p, int_tensor({-1})), "sampling_from_probs", "indices");
  EXPECT_FI_ERROR(top_k_top_p_sampling_from_logits(p, 1, 0.5, int_tensor({5})),
                  "top_k_top_p_sampling_from_logits", "indices");
  EXPECT_FI_ERROR(sampling_from_probs(p, Tensor::from_vector({0, 1}, {2}, DType::kFloat32)),
                  "sampling_from_probs", "indices");
  EXPECT_FI_ERROR(sampling_from_probs(p, Tensor::zeros({1, 1}, DType::kInt32)),
                  "sampling_from_probs", "indices");
  // With indices a per-row threshold is read at the input rows: one entry per probs row.
  EXPECT_FI_ERROR(top_k_sampling_from_probs(p, int_tensor({1, 1, 1}), int_tensor({0, 1, 1})), tk,
                  "top_k");
  // NaN with check_nan; without it the row simply has no NaN token to pick.
  const Tensor pn = make_rows({{0.5, NAN, 0.5}, {0.2, 0.3, 0.5}});
  EXPECT_FI_ERROR(sampling_from_probs(pn, std::nullopt, true, true), "sampling_from_probs",
                  "probs");
  EXPECT_FI_ERROR(top_k_sampling_from_probs(pn, 2, std::nullopt, true, true), tk, "probs");
  EXPECT_FI_ERROR(
      top_k_top_p_sampling_from_probs(pn, 2, 0.5, std::nullopt, "top_k_first", true, true),
      "top_k_top_p_sampling_from_probs", "probs");
  EXPECT_FI_ERROR(sampling_from_logits(pn, std::nullopt, true, true), "sampling_from_logits",
                  "logits");
  const auto ok = ints(sampling_from_probs(pn, std::nullopt, true, false, 1, 0).samples);
  EXPECT_NE(ok[0], 1);
  // The logits compositions check the softmax they sample from, as upstream's do: a +inf logit
  // (inf - inf in the softmax) raises though the logits hold no NaN, in both orders; a NaN logit
  // raises in "joint" but not in "top_k_first", whose mask (upstream's `x >= pivot ? x : -inf`)
  // drops it when it is not the pivot; finite logits pass.
  const char* tktp = "top_k_top_p_sampling_from_logits";
  const Tensor li = make_rows({{0.5, INFINITY, 0.5}, {0.2, 0.3, 0.5}});
  EXPECT_FI_ERROR(top_k_top_p_sampling_from_logits(pn, 2, 0.9, std::nullopt, "joint", true, true),
                  tktp, "logits");
  EXPECT_NE(ints(top_k_top_p_sampling_from_logits(pn, 2, 0.9, std::nullopt, "top_k_first", true,
                                                  true, 1, 0))[0],
            1);
  for (const char* order : {"top_k_first", "joint"}) {
    SCOPED_TRACE(order);
    EXPECT_FI_ERROR(top_k_top_p_sampling_from_logits(li, 2, 0.9, std::nullopt, order, true, true),
                    tktp, "logits");
    EXPECT_EQ(
        top_k_top_p_sampling_from_logits(p, 2, 0.9, std::nullopt, order, true, true, 1, 0).numel(),
        p.size(0));
  }
  // Seed/offset.
  EXPECT_FI_ERROR(sampling_from_probs(p, std::nullopt, true, false, 1, std::nullopt),
                  "sampling_from_probs", "offset");
  EXPECT_FI_ERROR(sampling_from_probs(p, std::nullopt, true, false, std::nullopt, 1),
                  "sampling_from_probs", "seed");
  EXPECT_FI_ERROR(
      sampling_from_probs(p, std::nullopt, true, false, int_tensor({1}, DType::kInt64), 1),
      "sampling_from_probs", "offset");
  EXPECT_FI_ERROR(sampling_from_probs(p, std::nullopt, true, false, int_tensor({1}, DType::kInt32),
                                      int_tensor({1}, DType::kInt32)),
                  "sampling_from_probs", "seed");
  EXPECT_FI_ERROR(
      sampling_from_probs(p, std::nullopt, true, false, int_tensor({1, 2, 3}, DType::kInt64),
                          int_tensor({1}, DType::kInt64)),
      "sampling_from_probs", "seed");
  // filter_apply_order.
  EXPECT_FI_ERROR(top_k_top_p_sampling_from_probs(p, 2, 0.5, std::nullopt, "top_p_first"),
                  "top_k_top_p_sampling_from_probs", "filter_apply_order");
  EXPECT_FI_ERROR(top_k_top_p_sampling_from_logits(p, 2, 0.5, std::nullopt, "both"),
                  "top_k_top_p_sampling_from_logits", "filter_apply_order");
}

TEST(SamplingErrors, FailedCallDoesNotAdvanceTheDefaultStream) {
  const Tensor p = make_rows({kDist});
  sampling_manual_seed(31);
  EXPECT_THROW(top_p_sampling_from_probs(p, 2.0), Error);
  const auto a = ints(sampling_from_probs(p).samples);
  EXPECT_EQ(a, ints(sampling_from_probs(p, std::nullopt, true, false, 31, 0).samples));
}

// ------------------------------------------------------------------------------------------
// CUDA vs CPU (skipped without a GPU)

Tensor random_probs(int64_t B, int64_t V, uint64_t seed, DType dt = DType::kFloat32) {
  Tensor raw = Tensor::empty({B, V}, DType::kFloat32);
  raw.uniform_(seed, 0.0, 1.0);
  std::vector<double> rv = raw.to_double_vector();
  for (int64_t b = 0; b < B; ++b) {
    double s = 0;
    for (int64_t i = 0; i < V; ++i) s += rv[b * V + i] = std::pow(rv[b * V + i], 3.0);
    for (int64_t i = 0; i < V; ++i) rv[b * V + i] /= s;
  }
  return Tensor::from_vector(rv, {B, V}, dt);
}

TEST(SamplingCuda, FiltersAndSoftmaxMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int64_t V : {5, 1000, 32000}) {
      const Tensor p = random_probs(7, V, 51, dt);
      const Tensor pg = p.to(gpu);
      const Tensor kt = int_tensor({1, 2, 3, 10, 100, 1000, 50000});
      const Tensor tt =
          Tensor::from_vector({0.1, 0.3, 0.5, 0.7, 0.9, 0.93, 0.95}, {7}, DType::kFloat32);
      EXPECT_TRUE(all_close(top_k_renorm_probs(pg, kt.to(gpu)), top_k_renorm_probs(p, kt),
                            default_tolerance(dt)));
      EXPECT_TRUE(all_close(top_k_mask_logits(pg, kt.to(gpu)), top_k_mask_logits(p, kt), {0, 0}));
      EXPECT_TRUE(all_close(softmax(pg, tt.to(gpu)), softmax(p, tt), {1e-7, 1e-5}));
      // The nucleus boundary depends on fp32 summation order; with 32000 tokens a cumulative
      // mass can sit within summation error of top_p, so compare top-p on smaller rows only.
      if (V <= 1000) {
        EXPECT_TRUE(
            all_close(top_p_renorm_probs(pg, tt.to(gpu)), top_p_renorm_probs(p, tt), {1e-6, 1e-4}));
      }
    }
  }
}

TEST(SamplingCuda, SamplersMatchCpuOnTieFreeInputs) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  // Small vocabularies with random masses: no two prefix sums or pivots within fp32 summation
  // error of each other or of the draws, so both backends must pick the same tokens.
  const Device gpu = Device::cuda(0);
  const int64_t B = 64, V = 100;
  const Tensor p = random_probs(B, V, 61);
  const Tensor pg = p.to(gpu);
  const int64_t seed = 8, off = 16;
  auto same = [](const Tensor& a, const Tensor& b) { return ints(a) == ints(b); };
  EXPECT_TRUE(same(sampling_from_probs(pg, std::nullopt, true, false, seed, off).samples,
                   sampling_from_probs(p, std::nullopt, true, false, seed, off).samples));
  EXPECT_TRUE(same(top_k_sampling_from_probs(pg, 10, std::nullopt, true, false, seed, off).samples,
                   top_k_sampling_from_probs(p, 10, std::nullopt, true, false, seed, off).samples));
  EXPECT_TRUE(
      same(top_p_sampling_from_probs(pg, 0.5, std::nullopt, true, false, seed, off).samples,
           top_p_sampling_from_probs(p, 0.5, std::nullopt, true, false, seed, off).samples));
  EXPECT_TRUE(
      same(min_p_sampling_from_probs(pg, 0.2, std::nullopt, true, false, seed, off).samples,
           min_p_sampling_from_probs(p, 0.2, std::nullopt, true, false, seed, off).samples));
  for (const char* order : {"top_k_first", "joint"}) {
    EXPECT_TRUE(same(
        top_k_top_p_sampling_from_probs(pg, 20, 0.6, std::nullopt, order, true, false, seed, off)
            .samples,
        top_k_top_p_sampling_from_probs(p, 20, 0.6, std::nullopt, order, true, false, seed, off)
            .samples))
        << order;
  }
  Tensor logits = Tensor::empty({B, V}, DType::kFloat32);
  logits.normal_(71, 0.0, 3.0);
  EXPECT_TRUE(same(sampling_from_logits(logits.to(gpu), std::nullopt, true, false, seed, off),
                   sampling_from_logits(logits, std::nullopt, true, false, seed, off)));
  // Valid flags and indices on the device.
  const Tensor idx = int_tensor({3, 3, 0, 63}, DType::kInt64);
  const SamplingResult g = sampling_from_probs(pg, idx.to(gpu), true, false, seed, off, true);
  const SamplingResult c = sampling_from_probs(p, idx, true, false, seed, off, true);
  EXPECT_EQ(g.samples.dtype(), DType::kInt64);
  EXPECT_TRUE(same(g.samples, c.samples));
  EXPECT_TRUE(same(g.valid, c.valid));
}

/// Rows of probabilities whose every partial sum is exact in fp32, in any order: 20 tokens at
/// random places hold m x 2^-12 each (16 <= m <= 255, the m summing to 2048: mass 1/2), the rest
/// k x unit (k <= 255, summing to exactly 1/2; unit 2^-24, or 2^-22 for short rows). Every value
/// is exact in bf16, every sum a multiple of the unit below 1. So the CPU's sequential sums and
/// any block tree on the GPU agree to the bit, and both backends must pick the same tokens and
/// write the same filtered rows whatever order they add in; the top 20 keep mass 1/2, so top-k
/// renorm with k = 20 doubles them exactly and "top_k_first" stays exact too.
Tensor dyadic_probs(int64_t B, int64_t V, uint64_t seed, DType dt) {
  std::mt19937_64 rng(seed);
  const double unit = V >= 100000 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -22);
  const int64_t small_total = static_cast<int64_t>(std::llround(0.5 / unit));
  std::vector<double> rv(static_cast<std::size_t>(B * V));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n_small = V - 20;
    std::vector<int64_t> k(static_cast<std::size_t>(n_small));
    const int64_t avg = small_total / n_small;
    int64_t sum = 0;
    for (auto& x : k) sum += x = static_cast<int64_t>(rng() % static_cast<uint64_t>(2 * avg));
    // Move the total to exactly small_total, one unit at a time, within [0, 255].
    while (sum != small_total) {
      int64_t& x = k[rng() % static_cast<uint64_t>(n_small)];
      if (sum < small_total && x < 255) ++x, ++sum;
      if (sum > small_total && x > 0) --x, --sum;
    }
    std::vector<int64_t> m(20, 102);  // 20 x 102 + 8 = 2048
    for (int i = 0; i < 8; ++i) ++m[static_cast<std::size_t>(i)];
    for (int i = 0; i < 200; ++i) {  // shuffle mass between pairs, keeping 16 <= m <= 255
      const std::size_t a = rng() % 20, c = rng() % 20;
      const int64_t d = static_cast<int64_t>(rng() % 40);
      if (a != c && m[a] - d >= 16 && m[c] + d <= 255) m[a] -= d, m[c] += d;
    }
    std::vector<int64_t> where(static_cast<std::size_t>(V));
    std::iota(where.begin(), where.end(), 0);
    std::shuffle(where.begin(), where.end(), rng);
    // Big tokens at where[0..19]; the small masses fill the rest in index order.
    std::vector<bool> big(static_cast<std::size_t>(V), false);
    for (std::size_t i = 0; i < 20; ++i) {
      big[static_cast<std::size_t>(where[i])] = true;
      rv[static_cast<std::size_t>(b * V + where[i])] = std::ldexp(static_cast<double>(m[i]), -12);
    }
    std::size_t next = 0;
    for (int64_t i = 0; i < V; ++i) {
      if (big[static_cast<std::size_t>(i)]) continue;
      rv[static_cast<std::size_t>(b * V + i)] = static_cast<double>(k[next++]) * unit;
    }
  }
  return Tensor::from_vector(rv, {B, V}, dt);
}

// The premise of the test below, checked without a GPU: the rows sum to exactly 1 in fp32 in
// any order (forward, backward, pairwise), bf16 holds every value exactly, and the top 20 tokens
// hold exactly 1/2.
TEST(SamplingRows, DyadicRowsSumExactlyInAnyOrder) {
  for (int64_t V : {32000, 151936}) {
    const Tensor p = dyadic_probs(2, V, 11, DType::kFloat32);
    const std::vector<double> v = p.to_double_vector();
    EXPECT_EQ(v, dyadic_probs(2, V, 11, DType::kBFloat16).to_double_vector());
    for (int64_t b = 0; b < 2; ++b) {
      std::vector<float> row(v.begin() + b * V, v.begin() + (b + 1) * V);
      float fwd = 0.0f, bwd = 0.0f;
      for (float x : row) fwd += x;
      for (auto it = row.rbegin(); it != row.rend(); ++it) bwd += *it;
      std::vector<float> tree = row;
      while (tree.size() > 1) {
        std::vector<float> next((tree.size() + 1) / 2, 0.0f);
        for (std::size_t i = 0; i < tree.size(); ++i) next[i / 2] += tree[i];
        tree.swap(next);
      }
      EXPECT_EQ(fwd, 1.0f);
      EXPECT_EQ(bwd, 1.0f);
      EXPECT_EQ(tree[0], 1.0f);
      std::sort(row.rbegin(), row.rend());
      float top = 0.0f;
      for (int i = 0; i < 20; ++i) top += row[static_cast<std::size_t>(i)];
      EXPECT_EQ(top, 0.5f);
      EXPECT_GT(row[19], row[20]);  // the top 20 stand apart from the rest
    }
  }
}

// The CUDA passes load several chunks a thread at once and find the inverse CDF's chunk by a
// block reduction before scanning it (sampling_cuda.cu): on rows of 32000-151936 tokens, whose
// sums are exact in any order, every sampler and filter gives the CPU's tokens and values.
TEST(SamplingCuda, LongRowsWithExactSumsMatchCpuExactly) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  const int64_t B = 6;
  auto same = [](const Tensor& a, const Tensor& b) { return ints(a) == ints(b); };
  // Layouts: contiguous rows (a vocab of 128257 has an odd row stride, so the one-element
  // strided kernels take it); `padded` rows of V in rows of V + 7 (128264, a multiple of the
  // vector width: the 128-bit kernels with a one-element last vector); `offset` rows one element
  // into device rows one wider (the base is not 16-byte aligned: the strided kernels; for 151935
  // the row stride is a multiple of 8, so by the base's alignment alone). The elements outside
  // the rows hold 0.25, which would change every sum a kernel that read them makes.
  enum class Layout { kDense, kPadded, kOffset };
  struct Shape {
    int64_t V;
    Layout layout;
  };
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    for (Shape sh : {Shape{32000, Layout::kDense}, Shape{128256, Layout::kDense},
                     Shape{128257, Layout::kDense}, Shape{151936, Layout::kDense},
                     Shape{128257, Layout::kPadded}, Shape{32000, Layout::kOffset},
                     Shape{151935, Layout::kOffset}}) {
      const int64_t V = sh.V;
      SCOPED_TRACE(std::string(dtype_name(dt)) + " vocab " + std::to_string(V) +
                   (sh.layout == Layout::kPadded   ? " padded rows"
                    : sh.layout == Layout::kOffset ? " offset by one"
                                                   : ""));
      Tensor p = dyadic_probs(B, V, static_cast<uint64_t>(V) + 7, dt);
      Tensor pg;
      if (sh.layout == Layout::kDense) {
        pg = p.to(gpu);
      } else {
        // Rows of W: one element in front (offset), or V values then 7 (padded).
        const int64_t W = sh.layout == Layout::kPadded ? V + 7 : V + 1;
        const int64_t lead = sh.layout == Layout::kOffset ? 1 : 0;
        const std::vector<double> v = p.to_double_vector();
        std::vector<double> wide(static_cast<std::size_t>(B * W), 0.25);
        for (int64_t b = 0; b < B; ++b) {
          std::copy(v.begin() + b * V, v.begin() + (b + 1) * V, wide.begin() + b * W + lead);
        }
        const Tensor whole = Tensor::from_vector(wide, {B, W}, dt);
        p = whole.slice(1, lead, lead + V);
        pg = whole.to(gpu).slice(1, lead, lead + V);  // sliced on the device: the base moves
      }
      for (int64_t seed : {3, 1234567}) {
        const int64_t off = 40;
        EXPECT_TRUE(same(sampling_from_probs(pg, std::nullopt, true, false, seed, off).samples,
                         sampling_from_probs(p, std::nullopt, true, false, seed, off).samples));
        for (int64_t k : {1, 5, 20, 1000}) {
          EXPECT_TRUE(
              same(top_k_sampling_from_probs(pg, k, std::nullopt, true, false, seed, off).samples,
                   top_k_sampling_from_probs(p, k, std::nullopt, true, false, seed, off).samples))
              << "top_k " << k;
        }
        for (double tp : {0.1, 0.45, 0.6, 0.95}) {
          EXPECT_TRUE(
              same(top_p_sampling_from_probs(pg, tp, std::nullopt, true, false, seed, off).samples,
                   top_p_sampling_from_probs(p, tp, std::nullopt, true, false, seed, off).samples))
              << "top_p " << tp;
        }
        for (double mp : {0.0, 0.05, 0.5}) {
          EXPECT_TRUE(
              same(min_p_sampling_from_probs(pg, mp, std::nullopt, true, false, seed, off).samples,
                   min_p_sampling_from_probs(p, mp, std::nullopt, true, false, seed, off).samples))
              << "min_p " << mp;
        }
        for (const char* order : {"top_k_first", "joint"}) {
          EXPECT_TRUE(same(top_k_top_p_sampling_from_probs(pg, 20, 0.6, std::nullopt, order, true,
                                                           false, seed, off)
                               .samples,
                           top_k_top_p_sampling_from_probs(p, 20, 0.6, std::nullopt, order, true,
                                                           false, seed, off)
                               .samples))
              << order;
        }
      }
      for (int64_t k : {20, 100, 5000}) {
        EXPECT_TRUE(all_close(top_k_renorm_probs(pg, k), top_k_renorm_probs(p, k), {0, 0}))
            << "top_k_renorm " << k;
        EXPECT_TRUE(all_close(top_k_mask_logits(pg, k), top_k_mask_logits(p, k), {0, 0}))
            << "top_k_mask " << k;
      }
      for (double tp : {0.3, 0.5, 0.9}) {
        EXPECT_TRUE(all_close(top_p_renorm_probs(pg, tp), top_p_renorm_probs(p, tp), {0, 0}))
            << "top_p_renorm " << tp;
      }
    }
  }
}

// A CUDA call never copies a per-row tensor's values to the host: check_nan (a device flag, read
// back as upstream does) is the only value check on the device; out-of-range device indices are
// clamped and top_k < 1 read as upstream's kernels read it (sampling_rules.h), never an
// out-of-bounds read. Scalars, shapes, dtypes and devices are still checked on the host.
TEST(SamplingCuda, BadInputOnDevice) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  const Tensor pg = make_rows({{0.5, NAN}, {0.5, 0.5}}).to(gpu);
  EXPECT_FI_ERROR(sampling_from_probs(pg, std::nullopt, true, true), "sampling_from_probs",
                  "probs");
  EXPECT_FI_ERROR(sampling_from_probs(pg, int_tensor({0})), "sampling_from_probs", "indices");
  EXPECT_FI_ERROR(top_k_sampling_from_probs(pg, 0), "top_k_sampling_from_probs", "top_k");
}

TEST(SamplingCuda, DeviceValuesOutOfRangeAreClamped) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  const int64_t B = 4, V = 100;
  const Tensor p = random_probs(B, V, 81);
  const Tensor pg = p.to(gpu);
  const int64_t seed = 3, off = 12;
  // indices -5 and 9 read rows 0 and 3.
  EXPECT_EQ(
      ints(sampling_from_probs(pg, int_tensor({-5, 9, 1}).to(gpu), true, false, seed, off).samples),
      ints(sampling_from_probs(p, int_tensor({0, 3, 1}), true, false, seed, off).samples));
  // top_k -1: no limit (upstream reads k as uint32); 0: no token passes.
  const SamplingResult r = top_k_sampling_from_probs(pg, int_tensor({-1, 0, 5, -7}).to(gpu),
                                                     std::nullopt, true, false, seed, off, true);
  const SamplingResult all =
      top_k_sampling_from_probs(p, V, std::nullopt, true, false, seed, off, true);
  const SamplingResult five =
      top_k_sampling_from_probs(p, 5, std::nullopt, true, false, seed, off, true);
  const std::vector<int64_t> tok = ints(r.samples), valid = ints(r.valid);
  EXPECT_EQ(tok[0], ints(all.samples)[0]);
  EXPECT_EQ(valid[0], 1);
  EXPECT_EQ(tok[1], 0);
  EXPECT_EQ(valid[1], 0);
  EXPECT_EQ(tok[2], ints(five.samples)[2]);
  EXPECT_EQ(tok[3], ints(all.samples)[3]);
  const std::vector<double> renorm =
      top_k_renorm_probs(pg, int_tensor({0, -1, 0, 0}).to(gpu)).to_double_vector();
  const std::vector<double> masked =
      top_k_mask_logits(pg, int_tensor({0, -1, 0, 0}).to(gpu)).to_double_vector();
  const std::vector<double> ref = p.to_double_vector();
  for (int64_t i = 0; i < V; ++i) {
    EXPECT_EQ(renorm[i], 0.0) << i;
    EXPECT_EQ(masked[i], -std::numeric_limits<double>::infinity()) << i;
    EXPECT_EQ(masked[V + i], ref[V + i]) << i;  // -1: the row unchanged
  }
}

// Per-row arguments as device tensors of every accepted dtype, with strides and one-entry
// seed/offset tensors, give the CPU's tokens (read from the same tensors on the host).
TEST(SamplingCuda, DeviceRowTensorsMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  // 40 output rows over 35 input rows: a per-row tensor of 40 entries serves the arguments read
  // at the output row (top_k of the top-k sampler, min_p) and those read at the input row (top_p;
  // top_k of "joint" and "top_k_first"), which need at least 35.
  const int64_t B = 40, R = 35, V = 100;
  const Tensor p = random_probs(R, V, 91);
  const Tensor pg = p.to(gpu);
  std::vector<int64_t> idx_v, k_v, seed_v, off_v;
  std::vector<double> p_v, m_v;
  for (int64_t b = 0; b < B; ++b) {
    idx_v.push_back((b * 7) % R);
    k_v.push_back(1 + (b * 5) % 40);
    p_v.push_back(0.25 + 0.025 * static_cast<double>(b % 30));
    m_v.push_back(0.02 * static_cast<double>(b % 11));
    seed_v.push_back(100 + b);
    off_v.push_back(4 * (b % 5) + b % 3);
  }
  // Every other element of a twice-as-long tensor on `d`: a stride-2 view.
  auto strided = [](const Tensor& t, Device d) {
    const int64_t n = t.size(0);
    Tensor w = Tensor::zeros({2 * n}, t.dtype());
    w.slice(0, 0, 2 * n, 2).copy_(t);
    return w.to(d).slice(0, 0, 2 * n, 2);
  };
  const int64_t seed = 5, off = 8;
  for (DType fdt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (DType idt : {DType::kInt32, DType::kInt64}) {
      const Tensor idx = int_tensor(idx_v, idt);
      const Tensor k = strided(int_tensor(k_v, idt), Device::cpu());
      const Tensor kg = strided(int_tensor(k_v, idt), gpu);
      const Tensor tp = Tensor::from_vector(p_v, {B}, fdt);
      const Tensor mp = strided(Tensor::from_vector(m_v, {B}, fdt), Device::cpu());
      const Tensor mg = strided(Tensor::from_vector(m_v, {B}, fdt), gpu);
      EXPECT_EQ(kg.stride(0), 2);
      const std::string what =
          std::string(dtype_torch_name(fdt)) + " " + std::string(dtype_torch_name(idt));
      auto both = [&](auto call) {
        const SamplingResult c = call(p, idx, k, tp, mp, Device::cpu());
        const SamplingResult g = call(pg, idx.to(gpu), kg, tp.to(gpu), mg, gpu);
        EXPECT_EQ(ints(g.samples), ints(c.samples)) << what;
        EXPECT_EQ(ints(g.valid), ints(c.valid)) << what;
      };
      both([&](const Tensor& x, const Tensor& i, const Tensor& kk, const Tensor&, const Tensor&,
               Device) {
        return top_k_sampling_from_probs(x, kk, i, true, false, seed, off, true);
      });
      both([&](const Tensor& x, const Tensor& i, const Tensor&, const Tensor& pp, const Tensor&,
               Device) {
        return top_p_sampling_from_probs(x, pp, i, true, false, seed, off, true);
      });
      both([&](const Tensor& x, const Tensor& i, const Tensor&, const Tensor&, const Tensor& mm,
               Device) {
        return min_p_sampling_from_probs(x, mm, i, true, false, seed, off, true);
      });
      for (const char* order : {"top_k_first", "joint"}) {
        both([&](const Tensor& x, const Tensor& i, const Tensor& kk, const Tensor& pp,
                 const Tensor&, Device d) {
          // Per-row seeds and offsets, and one-entry ones.
          const Tensor st = int_tensor(seed_v, DType::kInt64).to(d);
          const Tensor ot = int_tensor(off_v, DType::kInt64).to(d);
          const SamplingResult a =
              top_k_top_p_sampling_from_probs(x, kk, pp, i, order, true, false, st, ot, true);
          const SamplingResult one = top_k_top_p_sampling_from_probs(
              x, kk, pp, i, order, true, false, int_tensor({11}, DType::kInt64).to(d),
              int_tensor({4}, DType::kInt64).to(d), true);
          SamplingResult r;
          r.samples = Tensor::empty({2 * B}, a.samples.dtype());
          r.valid = Tensor::empty({2 * B}, DType::kBool);
          r.samples.slice(0, 0, B).copy_(a.samples.to(Device::cpu()));
          r.samples.slice(0, B, 2 * B).copy_(one.samples.to(Device::cpu()));
          r.valid.slice(0, 0, B).copy_(a.valid.to(Device::cpu()));
          r.valid.slice(0, B, 2 * B).copy_(one.valid.to(Device::cpu()));
          return r;
        });
      }
    }
  }
  // softmax with a per-row temperature tensor of each dtype.
  for (DType fdt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    std::vector<double> t_v;
    for (int64_t b = 0; b < R; ++b) t_v.push_back(0.5 + 0.125 * static_cast<double>(b % 9));
    const Tensor t = Tensor::from_vector(t_v, {R}, fdt);
    EXPECT_TRUE(all_close(softmax(pg, t.to(gpu)), softmax(p, t), {1e-7, 1e-5}))
        << dtype_torch_name(fdt);
  }
}

// Upstream's "top_k_first" fast path (0.7.4: indices absent or 1-D int32 / int64, an int top_k
// in (0, 256] or a top_k tensor with top_k_max in (0, 256], a vocabulary of 65536 or more): each
// row's top k, sorted (flashinfer.top_k), as fp32 probabilities (softmax of the logits;
// top_k_renorm_probs of the probs), top-p sampled over those k columns with the call's indices,
// seed and offset, the sampled column's token reported. Both forms equal that composition draw
// for draw; outside the gate (k = 257, a vocabulary of 65535, a top_k tensor without top_k_max)
// they equal the masked composition; and at this size the two compositions draw differently, so
// the test tells which one ran.
void expect_top_k_first_routes(Device d) {
  const int64_t B = 32;
  for (int64_t V : {int64_t{65536}, int64_t{65535}}) {
    const Tensor logits = Tensor::empty({B, V}, DType::kFloat32).normal_(17, 0.0, 3.0).to(d);
    const Tensor probs = softmax(logits);
    const Tensor p_rows = Tensor::from_vector(std::vector<double>(B, 0.7), {B}, DType::kFloat32);
    for (int64_t k : {int64_t{1}, int64_t{50}, int64_t{256}, int64_t{257}}) {
      for (bool per_row_p : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "V " << V << " k " << k << " per-row p " << per_row_p);
        const ScalarOrTensor<double> p =
            per_row_p ? ScalarOrTensor<double>(p_rows.to(d)) : ScalarOrTensor<double>(0.7);
        const int64_t seed = 21, off = 4;
        const bool fast = V >= 65536 && k <= 256;
        // The fast composition.
        auto [values, tokens] = top_k(logits, k, true, true);
        const Tensor from_k = top_p_sampling_from_probs(softmax(values.to(DType::kFloat32)), p,
                                                        std::nullopt, true, false, seed, off)
                                  .samples;
        const std::vector<int64_t> cols = ints(from_k), tok = ints(tokens);
        std::vector<int64_t> want_fast(B);
        for (int64_t b = 0; b < B; ++b) want_fast[b] = tok[b * k + cols[b]];
        auto [pv, ptok] = top_k(probs, k, true, true);
        const std::vector<int64_t> pcols =
            ints(top_p_sampling_from_probs(top_k_renorm_probs(pv.to(DType::kFloat32), k), p,
                                           std::nullopt, true, false, seed, off)
                     .samples);
        const std::vector<int64_t> ptk = ints(ptok);
        std::vector<int64_t> want_fast_probs(B);
        for (int64_t b = 0; b < B; ++b) want_fast_probs[b] = ptk[b * k + pcols[b]];
        // The masked composition.
        const std::vector<int64_t> want_masked =
            ints(top_p_sampling_from_probs(softmax(top_k_mask_logits(logits, k)), p, std::nullopt,
                                           true, false, seed, off)
                     .samples);
        const std::vector<int64_t> want_masked_probs =
            ints(top_p_sampling_from_probs(top_k_renorm_probs(probs, k), p, std::nullopt, true,
                                           false, seed, off)
                     .samples);
        if (fast && k > 1) {
          EXPECT_NE(want_fast, want_masked);
        }
        EXPECT_EQ(ints(top_k_top_p_sampling_from_logits(logits, k, p, std::nullopt, "top_k_first",
                                                        true, false, seed, off)),
                  fast ? want_fast : want_masked);
        EXPECT_EQ(ints(top_k_top_p_sampling_from_probs(probs, k, p, std::nullopt, "top_k_first",
                                                       true, false, seed, off)
                           .samples),
                  fast ? want_fast_probs : want_masked_probs);
        if (!fast || per_row_p) continue;
        // A top_k tensor leaves the gate without top_k_max and takes it with one.
        const Tensor kt = int_tensor(std::vector<int64_t>(B, k)).to(d);
        EXPECT_EQ(ints(top_k_top_p_sampling_from_logits(logits, kt, p, std::nullopt, "top_k_first",
                                                        true, false, seed, off)),
                  want_masked);
        EXPECT_EQ(ints(top_k_top_p_sampling_from_logits(logits, kt, p, std::nullopt, "top_k_first",
                                                        true, false, seed, off, k)),
                  want_fast);
        // Indices take it too (0.7.4): output row b samples input row indices[b] over its k
        // columns, the token reported in the indices' dtype.
        std::vector<int64_t> iv(B);
        for (int64_t b = 0; b < B; ++b) iv[b] = (b * 5 + 3) % B;
        for (DType idt : {DType::kInt32, DType::kInt64}) {
          const Tensor idx = int_tensor(iv).to(idt).to(d);
          const std::vector<int64_t> c =
              ints(top_p_sampling_from_probs(softmax(values.to(DType::kFloat32)), p, idx, true,
                                             false, seed, off)
                       .samples);
          std::vector<int64_t> want(B);
          for (int64_t b = 0; b < B; ++b) want[b] = tok[iv[b] * k + c[b]];
          const Tensor got = top_k_top_p_sampling_from_logits(logits, k, p, idx, "top_k_first",
                                                              true, false, seed, off);
          EXPECT_EQ(got.dtype(), idt);
          EXPECT_EQ(ints(got), want);
        }
        // Fewer output rows than input rows, with a top_p tensor of one entry per input row
        // (read at indices[b], as upstream's top_p_sampling_from_probs reads it).
        {
          const std::vector<int64_t> half(iv.begin(), iv.begin() + B / 2);
          const Tensor idx = int_tensor(half).to(d);
          std::vector<double> pv(B);
          for (int64_t b = 0; b < B; ++b) pv[b] = 0.5 + 0.01 * static_cast<double>(b);
          const Tensor pt = Tensor::from_vector(pv, {B}, DType::kFloat32).to(d);
          const std::vector<int64_t> c =
              ints(top_p_sampling_from_probs(softmax(values.to(DType::kFloat32)), pt, idx, true,
                                             false, seed, off)
                       .samples);
          std::vector<int64_t> want(B / 2);
          for (int64_t b = 0; b < B / 2; ++b) want[b] = tok[half[b] * k + c[b]];
          EXPECT_EQ(ints(top_k_top_p_sampling_from_logits(logits, k, pt, idx, "top_k_first", true,
                                                          false, seed, off)),
                    want);
        }
      }
    }
  }
}

// A top_k tensor under top_k_max: each row keeps its first max(k, 1) of the top_k_max sorted
// columns (all for k < 0; a k above top_k_max is cut to it; k = 0 is greedy), the rest -inf
// (logits) or 0 (probs), then softmax or the sum's share, then top-p over the top_k_max columns.
void expect_top_k_max_rows(Device d) {
  const int64_t B = 6, V = 65536, kmax = 40;
  const Tensor logits = Tensor::empty({B, V}, DType::kFloat32).normal_(29, 0.0, 2.0).to(d);
  const Tensor probs = softmax(logits);
  const std::vector<int64_t> row_k = {1, 0, -1, 7, 40, 300};
  const Tensor kt = int_tensor(row_k).to(d);
  const int64_t seed = 5, off = 12;
  for (bool from_logits : {true, false}) {
    SCOPED_TRACE(from_logits ? "logits" : "probs");
    const Tensor& x = from_logits ? logits : probs;
    auto [values, tokens] = top_k(x, kmax, true, true);
    std::vector<double> v = values.to(Device::cpu()).to(DType::kFloat32).to_double_vector();
    for (int64_t b = 0; b < B; ++b) {
      const int64_t keep = row_k[b] < 0 ? kmax : std::max<int64_t>(row_k[b], 1);
      double sum = 0.0;
      for (int64_t c = 0; c < kmax; ++c) {
        double& e = v[b * kmax + c];
        if (c >= keep) e = from_logits ? -std::numeric_limits<double>::infinity() : 0.0;
        sum += e;
      }
      if (!from_logits) {
        for (int64_t c = 0; c < kmax; ++c) v[b * kmax + c] /= sum;
      }
    }
    Tensor pk = Tensor::from_vector(v, {B, kmax}, DType::kFloat32).to(d);
    if (from_logits) pk = softmax(pk);
    const std::vector<int64_t> c =
        ints(top_p_sampling_from_probs(pk, 0.8, std::nullopt, true, false, seed, off).samples);
    const std::vector<int64_t> tok = ints(tokens);
    std::vector<int64_t> want(B);
    for (int64_t b = 0; b < B; ++b) {
      want[b] = tok[b * kmax + c[b]];
      if (row_k[b] == 0 || row_k[b] == 1) {
        EXPECT_EQ(c[b], 0) << b;  // greedy
      }
    }
    const Tensor got =
        from_logits ? top_k_top_p_sampling_from_logits(x, kt, 0.8, std::nullopt, "top_k_first",
                                                       true, false, seed, off, kmax)
                    : top_k_top_p_sampling_from_probs(x, kt, 0.8, std::nullopt, "top_k_first", true,
                                                      false, seed, off, false, kmax)
                          .samples;
    EXPECT_EQ(ints(got), want);
  }
}

TEST(Sampling, TopKFirstFastPathIsUpstreamsComposition) {
  expect_top_k_first_routes(Device::cpu());
  expect_top_k_max_rows(Device::cpu());
  // A top_k tensor of a float dtype is not read as k: the masked path's check names it.
  {
    const Tensor logits = Tensor::empty({2, 65536}, DType::kFloat32).normal_(8, 0.0, 1.0);
    const Tensor kf = Tensor::from_vector({3.0, 4.0}, {2}, DType::kFloat32);
    EXPECT_FI_ERROR(top_k_top_p_sampling_from_logits(logits, kf, 0.9, std::nullopt, "top_k_first",
                                                     true, false, int64_t{1}, int64_t{0}, 40),
                    "top_k_top_p_sampling_from_logits", "top_k");
  }
  // Upstream divides the k probabilities by their sum: a NaN among them makes the row NaN, and
  // check_nan raises (our renorm step would have zeroed it).
  Tensor probs = softmax(Tensor::empty({2, 65536}, DType::kFloat32).normal_(5, 0.0, 1.0));
  probs.data<float>()[65536 + 7] = std::nanf("");
  EXPECT_FI_ERROR(top_k_top_p_sampling_from_probs(probs, 50, 0.9, std::nullopt, "top_k_first", true,
                                                  true, int64_t{1}, int64_t{0}),
                  "top_k_top_p_sampling_from_probs", "probs");
}

// vLLM's call (v1/sample/ops/topk_topp_sampler.py): top_k_top_p_sampling_from_logits over a
// model's whole vocabulary with per-row k and p tensors. The two rows hold kDist's masses at ten
// tokens scattered over the vocabulary (the rest 30 nats below: together ~1e-10, and outside
// every top-k), and kDraws output rows read each through `indices`, with the row's k and p. The
// drawn tokens are tested against the filtered distribution (chi-square; a token outside it must
// never be drawn), which holds on either backend although softmax's bits differ between them; and a
// second call with the same seed and offset draws the same tokens.
void expect_vocab_draws_follow_the_filters(Device d, int64_t V, DType dtype) {
  const int64_t n = static_cast<int64_t>(kDist.size());
  std::vector<int64_t> pos(kDist.size());  // where kDist's entries sit in each row
  for (int64_t i = 0; i < n; ++i) pos[i] = (i * 7 + 3) % n * (V / n) + 37 * i % (V / n);
  std::vector<double> rows(static_cast<std::size_t>(2 * V));
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t j = 0; j < V; ++j) rows[r * V + j] = std::log(0.005) - 30.0 + 0.25 * (j % 3);
    // Row 1 holds kDist rotated by three tokens: another order of values over positions.
    for (int64_t i = 0; i < n; ++i) rows[r * V + pos[i]] = std::log(kDist[(i + 3 * r) % n]);
  }
  const Tensor logits = Tensor::from_vector(rows, {2, V}, dtype).to(d);
  // Output row i reads row i % 2, with that row's k and p: the thresholds are read at the input
  // row (upstream 0.7.4, one entry per logits row). Every filter boundary has a margin of at
  // least 0.05.
  const int64_t row_k[2] = {4, 5};
  const double row_p[2] = {0.55, 0.5};
  std::vector<int64_t> idx_v(2 * kDraws);
  for (int64_t i = 0; i < 2 * kDraws; ++i) idx_v[i] = i % 2;
  const Tensor idx = int_tensor(idx_v).to(d), k = int_tensor({row_k[0], row_k[1]}).to(d);
  const Tensor p = Tensor::from_vector({row_p[0], row_p[1]}, {2}, DType::kFloat32).to(d);
  // The expected distributions over kDist's ten tokens (the logits as `dtype` holds them, then
  // fp64 softmax).
  std::vector<double> lg;
  for (double v : kDist) lg.push_back(std::log(v));
  const std::vector<double> dist =
      softmax64(Tensor::from_vector(lg, {n}, dtype).to_double_vector());
  for (const char* order : {"top_k_first", "joint"}) {
    SCOPED_TRACE(::testing::Message() << "V " << V << " " << dtype_torch_name(dtype) << " " << order
                                      << (d.is_cuda() ? " on cuda" : " on cpu"));
    const auto draw = [&] {
      return ints(top_k_top_p_sampling_from_logits(logits, k, p, idx, order, true, false,
                                                   int64_t{1234}, int64_t{8}));
    };
    const std::vector<int64_t> got = draw();
    EXPECT_EQ(draw(), got);
    for (int64_t r = 0; r < 2; ++r) {
      std::vector<double> mine(kDist.size());  // row r's masses at pos[]
      for (int64_t i = 0; i < n; ++i) mine[i] = dist[(i + 3 * r) % n];
      const int64_t kk = row_k[r];
      const double pp = row_p[r];
      std::vector<double> keep;
      if (std::string(order) == "joint") {
        keep = renorm(mine, both(top_k_keep(mine, kk), top_p_keep(mine, pp)));
      } else {
        const std::vector<double> topk = renorm(mine, top_k_keep(mine, kk));
        keep = renorm(topk, top_p_keep(topk, pp));
      }
      std::vector<double> expected(static_cast<std::size_t>(V), 0.0);
      for (int64_t i = 0; i < n; ++i) expected[pos[i]] = keep[i];
      std::vector<int64_t> half;
      for (int64_t i = r; i < 2 * kDraws; i += 2) half.push_back(got[i]);
      EXPECT_TRUE(chi_square_ok(half, expected)) << "row " << r;
    }
  }
}

TEST(Samplers, VocabSizedLogitsWithRowTensorsFollowTheFilters) {
  expect_vocab_draws_follow_the_filters(Device::cpu(), 1000, DType::kFloat32);
}

TEST(SamplingCuda, TopKFirstFastPathIsUpstreamsComposition) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  expect_top_k_first_routes(Device::cuda(0));
  expect_top_k_max_rows(Device::cuda(0));
}

TEST(SamplingCuda, VocabSizedLogitsWithRowTensorsFollowTheFilters) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (int64_t V : {int64_t{128256}, int64_t{151936}}) {
    expect_vocab_draws_follow_the_filters(Device::cuda(0), V, DType::kFloat32);
  }
  expect_vocab_draws_follow_the_filters(Device::cuda(0), 128256, DType::kBFloat16);
}

// The sampling ops on the device allocate only their outputs: a second call of the top-k-first
// path (renorm into the stream's scratch, then top-p) with device per-row tensors makes one
// device allocation (the samples) and no host copy of the per-row values.
TEST(SamplingCuda, RepeatedCallAllocatesOnlyItsOutput) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  const int64_t B = 8, V = 1000;
  const Tensor pg = random_probs(B, V, 93).to(gpu);
  const Tensor k = int_tensor({1, 2, 3, 4, 5, 6, 7, 8}).to(gpu);
  const Tensor tp = Tensor::full({B}, 0.7, DType::kFloat32, gpu);
  const Tensor st = int_tensor({1}, DType::kInt64).to(gpu);
  const Tensor ot = int_tensor({0}, DType::kInt64).to(gpu);
  auto call = [&] {
    return top_k_top_p_sampling_from_probs(pg, k, tp, std::nullopt, "top_k_first", true, false, st,
                                           ot);
  };
  const std::vector<int64_t> first = ints(call().samples);
  const uint64_t mallocs0 = detail::cuda_device_malloc_count();
  const SamplingResult again = call();
  EXPECT_EQ(detail::cuda_device_malloc_count(), mallocs0 + 1);
  EXPECT_EQ(ints(again.samples), first);
  // bf16 logits: both compositions round the softmax to bf16 (torch.softmax's dtype) inside the
  // sampling scratch, so they too allocate only the samples.
  Tensor logits = Tensor::empty({B, V}, DType::kFloat32);
  logits.normal_(94, 0.0, 3.0);
  const Tensor lg = logits.to(DType::kBFloat16).to(gpu);
  for (const char* order : {"top_k_first", "joint"}) {
    SCOPED_TRACE(order);
    auto from_logits = [&] {
      return top_k_top_p_sampling_from_logits(lg, k, tp, std::nullopt, order, true, false, st, ot);
    };
    const std::vector<int64_t> ref = ints(from_logits());
    const uint64_t m0 = detail::cuda_device_malloc_count();
    const Tensor t = from_logits();
    EXPECT_EQ(detail::cuda_device_malloc_count(), m0 + 1);
    EXPECT_EQ(ints(t), ref);
  }
}

#if FLASHINFER_TEST_HAVE_CUDART
// Sampling calls with device per-row tensors captured into a CUDA graph (relaxed capture mode:
// the ops allocate their outputs with cudaMalloc, which global mode refuses; nothing in them
// synchronizes or copies to the host) replay to the eager tokens, and a replay reads the per-row
// tensors' values at replay time, as upstream's kernels do.
TEST(SamplingCuda, CapturesIntoAGraph) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  const int64_t B = 16, V = 4096;
  const Tensor pg = random_probs(B, V, 95).to(gpu);
  Tensor logits = Tensor::empty({B, V}, DType::kFloat32);
  logits.normal_(97, 0.0, 3.0);
  const Tensor lg = logits.to(DType::kBFloat16).to(gpu);
  std::vector<int64_t> k_v, s_v, o_v;
  std::vector<double> p_v;
  for (int64_t b = 0; b < B; ++b) {
    k_v.push_back(1 + 3 * b);
    p_v.push_back(0.3 + 0.04 * static_cast<double>(b));
    s_v.push_back(7 + b);
    o_v.push_back(4 * b);
  }
  const Tensor k = int_tensor(k_v, DType::kInt64).to(gpu);
  const Tensor tp = Tensor::from_vector(p_v, {B}, DType::kFloat16).to(gpu);
  const Tensor st = int_tensor(s_v, DType::kInt64).to(gpu);
  const Tensor ot = int_tensor(o_v, DType::kInt64).to(gpu);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  void* const prev = current_cuda_stream();
  set_current_cuda_stream(stream);
  auto run = [&] {
    return std::vector<Tensor>{
        top_k_top_p_sampling_from_probs(pg, k, tp, std::nullopt, "top_k_first", true, false, st, ot)
            .samples,
        top_k_top_p_sampling_from_probs(pg, k, tp, std::nullopt, "joint", true, false, st, ot)
            .samples,
        top_k_top_p_sampling_from_logits(lg, k, tp, std::nullopt, "top_k_first", true, false, st,
                                         ot),
        top_k_top_p_sampling_from_logits(lg, k, tp, std::nullopt, "joint", true, false, st, ot),
        sampling_from_logits(lg, std::nullopt, true, false, st, ot)};
  };
  auto host = [](const std::vector<Tensor>& ts) {
    std::vector<std::vector<int64_t>> out;
    for (const Tensor& t : ts) out.push_back(ints(t));
    return out;
  };
  const auto eager = host(run());  // also sizes the stream's scratch
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
  const std::vector<Tensor> outs = run();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(host(outs), eager);
  // New seeds in the same device tensor: the replay draws what an eager call with them draws.
  for (int64_t& s : s_v) s += 1000;
  const Tensor st2 = int_tensor(s_v, DType::kInt64);
  ASSERT_EQ(cudaMemcpyAsync(st.data_ptr(), st2.data_ptr(), static_cast<size_t>(B) * 8,
                            cudaMemcpyHostToDevice, stream),
            cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const auto replayed = host(outs);
  const auto reseeded = host(run());
  EXPECT_EQ(replayed, reseeded);
  EXPECT_NE(replayed, eager);
  set_current_cuda_stream(prev);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}
#endif  // FLASHINFER_TEST_HAVE_CUDART

// The CPU's fused top_k_first path of top_k_top_p_sampling_from_logits gives, token for token,
// the samples of the three steps it fuses (top_k_mask_logits -> softmax -> top-p rejection with
// the same seed and offset): fp32 and bf16 logits, ties, -inf and +inf logits, k above the
// vocabulary, per-row k and p, indices.
// vocab 20000 takes the sampled-threshold select (rows of 8192 or more, small k); 1000 and
// k = 2000 (more than the row's finite logits in row 2) the histogram select.
class TopKFirstVocab : public ::testing::TestWithParam<int64_t> {};
INSTANTIATE_TEST_SUITE_P(Sampling, TopKFirstVocab, ::testing::Values(1000, 20000));

TEST_P(TopKFirstVocab, FromLogitsEqualsMaskSoftmaxTopP) {
  const int64_t rows = 6, vocab = GetParam();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> v(static_cast<std::size_t>(rows * vocab));
  Tensor g = Tensor::empty({rows, vocab}, DType::kFloat32).normal_(91, 0.0, 3.0);
  const std::vector<double> n = g.to_double_vector();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < vocab; ++i) {
      double x = n[static_cast<std::size_t>(r * vocab + i)];
      if (r == 1) x = std::round(x);       // many ties at the threshold
      if (r == 2 && i % 7 != 0) x = -inf;  // a seventh of the logits finite
      if (r == 3 && i == 500) x = inf;     // degenerate row: NaN probabilities
      // Every 9th logit (the sampled ones at vocab 20000) far above the rest and nearly equal
      // (distinct in fp32, increasing with i): too few pass the sampled threshold for k = 50, the
      // histogram select takes over, and a wrong kept set would change the (near uniform) draw.
      if (r == 5 && i % 9 == 0) x = 20.0 + static_cast<double>(i) * 1e-6;
      if (r == 4) x *= 40.0;  // kept logits far apart: some probabilities underflow to 0
      v[static_cast<std::size_t>(r * vocab + i)] = x;
    }
  }
  const std::vector<std::pair<int64_t, double>> kp = {
      {1, 0.9}, {5, 0.3}, {50, 0.9}, {200, 1.0}, {2000, 0.5}};
  // Upstream's steps take torch.softmax, which keeps the logits' dtype (bf16 probabilities here);
  // flashinfer.sampling.softmax returns fp32, so its output is rounded back to the logits' dtype.
  const auto torch_softmax = [](const Tensor& t) { return softmax(t).to(t.dtype()); };
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    Tensor x = Tensor::from_vector(v, {rows, vocab}, DType::kFloat32).to(dt);
    for (const auto& [k, p] : kp) {
      for (int64_t seed : vocab > 5000 ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 77}) {
        for (int64_t off : {0, 4096}) {
          const auto fused = ints(top_k_top_p_sampling_from_logits(
              x, k, p, std::nullopt, "top_k_first", true, false, seed, off));
          const Tensor probs = torch_softmax(top_k_mask_logits(x, k));
          const auto steps = ints(
              top_p_sampling_from_probs(probs, p, std::nullopt, true, false, seed, off).samples);
          EXPECT_EQ(fused, steps) << dtype_torch_name(dt) << " k=" << k << " p=" << p
                                  << " seed=" << seed << " offset=" << off;
        }
      }
    }
    // Per-row k and p, and indices (output row b reads logits row idx[b], Philox subsequence b).
    Tensor kt = int_tensor({3, 1, 200, 7, 50, 1000});
    Tensor pt = Tensor::from_vector({0.5, 1.0, 0.2, 0.9, 0.95, 0.7}, {rows}, DType::kFloat32);
    EXPECT_EQ(ints(top_k_top_p_sampling_from_logits(x, kt, pt, std::nullopt, "top_k_first", true,
                                                    false, int64_t{5}, int64_t{8})),
              ints(top_p_sampling_from_probs(torch_softmax(top_k_mask_logits(x, kt)), pt,
                                             std::nullopt, true, false, int64_t{5}, int64_t{8})
                       .samples));
    Tensor idx = int_tensor({5, 0, 0, 2, 4, 1, 3, 5});
    const Tensor probs = torch_softmax(top_k_mask_logits(x, 20));
    EXPECT_EQ(ints(top_k_top_p_sampling_from_logits(x, 20, 0.8, idx, "top_k_first", true, false,
                                                    int64_t{9}, int64_t{0})),
              ints(top_p_sampling_from_probs(probs, 0.8, idx, true, false, int64_t{9}, int64_t{0})
                       .samples));
    // Upstream's composition with indices and a per-row top_k: top_k_mask_logits reads top_k at
    // the input's rows, then top-p through indices, which reads top_p at the input row too; so
    // output row b has top_k[idx[b]] and top_p[idx[b]] (one entry per input row, upstream 0.7.4's
    // check). The same for the probs form (top_k_renorm_probs).
    Tensor k8 = int_tensor({3, 1, 200, 7, 50, 1000});
    Tensor p8 = Tensor::from_vector({0.5, 1.0, 0.2, 0.9, 0.95, 0.7}, {6}, DType::kFloat32);
    const Tensor k_rows = k8;
    EXPECT_EQ(ints(top_k_top_p_sampling_from_logits(x, k8, p8, idx, "top_k_first", true, false,
                                                    int64_t{9}, int64_t{0})),
              ints(top_p_sampling_from_probs(torch_softmax(top_k_mask_logits(x, k_rows)), p8, idx,
                                             true, false, int64_t{9}, int64_t{0})
                       .samples));
    const Tensor px = softmax(x);
    EXPECT_EQ(ints(top_k_top_p_sampling_from_probs(px, k8, p8, idx, "top_k_first", true, false,
                                                   int64_t{9}, int64_t{0})
                       .samples),
              ints(top_p_sampling_from_probs(top_k_renorm_probs(px, k_rows), p8, idx, true, false,
                                             int64_t{9}, int64_t{0})
                       .samples));
    // Three entries for six input rows: refused (upstream checks one per probs row).
    const Tensor idx3 = int_tensor({5, 0, 2});
    EXPECT_FI_ERROR(top_k_top_p_sampling_from_logits(x, k8.slice(0, 0, 3), p8.slice(0, 0, 3), idx3),
                    "top_k_top_p_sampling_from_logits", "top_k");
    EXPECT_FI_ERROR(top_k_top_p_sampling_from_probs(px, k8.slice(0, 0, 3), p8.slice(0, 0, 3), idx3),
                    "top_k_top_p_sampling_from_probs", "top_k");
    // "joint" reads both at the input row too (upstream's joint kernel), so the same is refused.
    EXPECT_FI_ERROR(
        top_k_top_p_sampling_from_logits(x, k8.slice(0, 0, 3), p8.slice(0, 0, 3), idx3, "joint"),
        "top_k_top_p_sampling_from_logits", "top_k");
    // Every sampler reads its thresholds at the input row (upstream 0.7.4; 0.6.18's top-k
    // sampler read top_k at the output row), so three entries are refused everywhere.
    EXPECT_FI_ERROR(top_p_sampling_from_probs(px, p8.slice(0, 0, 3), idx3),
                    "top_p_sampling_from_probs", "top_p");
    EXPECT_FI_ERROR(top_k_sampling_from_probs(px, k8.slice(0, 0, 3), idx3),
                    "top_k_sampling_from_probs", "top_k");
    EXPECT_NO_THROW(top_k_sampling_from_probs(px, k8, idx3));
  }
}

}  // namespace
}  // namespace flashinfer
