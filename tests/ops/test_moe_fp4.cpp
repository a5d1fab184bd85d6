// FP4 / MxInt4 MoE ops (trtllm_fp4_block_scale_moe / _routed_, trtllm_mxint4_block_scale_moe /
// _routed_, cute_dsl_fused_moe_nvfp4): weights prepared as upstream's tests prepare them
// (written out independently here), fp64 formulas, routing from logits against the routed form,
// bad input naming the argument, record/replay, and engine-style dumps in upstream's format.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "ops/moe_fp4_test_util.h"
#include "ops/moe_shared_test_util.h"
#include "ops/op_test_util.h"
#include "util/moe_weight_prep.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"

namespace flashinfer::testing {
namespace {

// ---- data ------------------------------------------------------------------------------------

using moe_fp4::bytes_tensor;
using moe_fp4::e4m3_codes;
using moe_fp4::random_bytes;
using moe_fp4::Rng;
using moe_prep::bf16;
using moe_prep::embed;
using moe_prep::gated_rows;
using moe_prep::identity_rows;
using moe_prep::max_abs;
using moe_prep::prepare_rows;
using moe_prep::prepared_rows;
using moe_prep::silu;
using moe_prep::ue8m0;

// bf16 bits of values in [lo, hi).
std::vector<uint16_t> bf16_bits(size_t n, uint64_t seed, double lo, double hi) {
  Rng r{seed};
  std::vector<uint16_t> v(n);
  for (auto& b : v) b = float_to_bfloat16_bits(static_cast<float>(r.uniform(lo, hi)));
  return v;
}

double e2m1(const std::vector<uint8_t>& packed, size_t i) {
  const uint8_t b = packed[i / 2];
  return e2m1_bits_to_float(i % 2 == 0 ? (b & 0xF) : (b >> 4));
}
double int4(const std::vector<uint8_t>& packed, size_t i) {
  const uint8_t b = packed[i / 2];
  const int v = i % 2 == 0 ? (b & 0xF) : (b >> 4);
  return v < 8 ? v : v - 16;
}
// The e2m1 value nearest to v, ties to the even code, saturating at 6: the grid written out.
float e2m1_grid(float v) {
  static const float kGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float a = std::min(std::fabs(v), 6.0f);
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const float d = std::fabs(a - kGrid[c]), db = std::fabs(a - kGrid[best]);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return std::signbit(v) ? -kGrid[best] : kGrid[best];
}

// ---- upstream's weight preparation (tests/moe FP4Moe / MxInt4BlockScaleMoe), transcribed ----

// Scales [E, m, cols] of `es`-byte elements: rows permuted like the weights', then
// block_scale_interleave (upstream's preparation calls it; so does this).
Tensor prepare_scales(const std::vector<uint8_t>& plain, int64_t E, int64_t m, int64_t cols,
                      bool interleave, DType dtype) {
  const int64_t es = dtype == DType::kBFloat16 ? 2 : 1;
  const std::vector<uint8_t> permuted = prepare_rows(plain, E, m, cols * es, interleave);
  return block_scale_interleave(
      bytes_tensor(permuted, {E, m, cols}, dtype == DType::kBFloat16 ? dtype : DType::kUInt8));
}

std::vector<double> prepare_bias(const std::vector<double>& plain, int64_t E, int64_t m,
                                 bool interleave) {
  const auto rows = prepared_rows(m, interleave);
  std::vector<double> out(plain.size());
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = 0; i < m; ++i) {
      out[static_cast<size_t>(e * m + i)] = plain[static_cast<size_t>(e * m + rows[i])];
    }
  }
  return out;
}

// (ids, weights) for every token: distinct experts (t + 3k) mod E, weights 0.7 / 0.3.
MoeTopkIds pair_routing(int64_t T, int64_t E, int64_t K) {
  std::vector<double> ids, w;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      ids.push_back(static_cast<double>((t + 3 * k) % E));
      w.push_back(k == 0 ? 0.7 : 0.3);
    }
  }
  return MoeTopkIds(Tensor::from_vector(ids, {T, K}, DType::kInt32),
                    Tensor::from_vector(w, {T, K}, DType::kFloat32));
}

// ---- an FP4 case: plain data, its prepared form, and the fp64 reference ---------------------

enum class Mode { kNvfp4, kMxfp4Bf16, kMxfp4Mxfp8 };

struct Fp4Case {
  Mode mode = Mode::kNvfp4;
  int64_t T = 5, E = 8, K = 2, H = 128, I = 64, act = 3, offset = 0, local = 8;
  bool bias = false, swiglu_params = false;
  int64_t vec() const { return mode == Mode::kNvfp4 ? 16 : 32; }
  bool gated() const { return act == 3 || act == 7; }  // Swiglu, SwigluStep
  int64_t n1() const { return gated() ? 2 * I : I; }
  // plain data
  std::vector<uint8_t> x, xs, w1, s1, w2, s2;
  std::vector<double> b1, b2, o1, o1g, o2, alpha, beta, limit;

  void make(uint64_t seed) {
    const int64_t El = local, N1 = n1(), v = vec();
    if (mode == Mode::kNvfp4) {
      x = random_bytes(static_cast<size_t>(T * H / 2), seed);
      xs = e4m3_codes(static_cast<size_t>(T * H / 16), seed + 1, 0.5, 1.0);
    } else if (mode == Mode::kMxfp4Mxfp8) {
      x.resize(static_cast<size_t>(T * H));
      Rng r{seed};
      for (auto& b : x) b = float_to_e4m3fn_bits(static_cast<float>(r.uniform(-3, 3)), true);
      xs.resize(static_cast<size_t>(T * H / 32));
      for (auto& b : xs) b = static_cast<uint8_t>(125 + r.next() % 3);
    } else {
      const auto bits = bf16_bits(static_cast<size_t>(T * H), seed, -2, 2);
      x.resize(bits.size() * 2);
      std::memcpy(x.data(), bits.data(), x.size());
    }
    w1 = random_bytes(static_cast<size_t>(El * N1 * H / 2), seed + 2);
    w2 = random_bytes(static_cast<size_t>(El * H * I / 2), seed + 3);
    if (mode == Mode::kNvfp4) {
      s1 = e4m3_codes(static_cast<size_t>(El * N1 * H / v), seed + 4, 0.02, 0.06);
      s2 = e4m3_codes(static_cast<size_t>(El * H * I / v), seed + 5, 0.02, 0.06);
    } else {
      Rng r{seed + 4};
      s1.resize(static_cast<size_t>(El * N1 * H / v));
      s2.resize(static_cast<size_t>(El * H * I / v));
      for (auto& b : s1) b = static_cast<uint8_t>(120 + r.next() % 3);
      for (auto& b : s2) b = static_cast<uint8_t>(120 + r.next() % 3);
    }
    Rng r{seed + 6};
    auto vecd = [&](int64_t n, double lo, double hi) {
      std::vector<double> out(static_cast<size_t>(n));
      for (auto& d : out) d = static_cast<float>(r.uniform(lo, hi));
      return out;
    };
    o1 = vecd(El, 0.5, 1.5);
    o1g = vecd(El, 0.5, 1.5);
    o2 = vecd(El, 0.5, 1.5);
    if (bias) {
      b1 = vecd(El * N1, -0.5, 0.5);
      b2 = vecd(El * H, -0.5, 0.5);
    }
    if (swiglu_params) {
      alpha = vecd(El, 1.5, 2.0);
      beta = vecd(El, 0.5, 1.0);
      limit = vecd(El, 1.0, 3.0);
    }
  }

  Tensor hidden() const {
    if (mode == Mode::kNvfp4) return bytes_tensor(x, {T, H / 2}, DType::kUInt8);
    if (mode == Mode::kMxfp4Mxfp8) return bytes_tensor(x, {T, H}, DType::kFloat8E4M3FN);
    return bytes_tensor(x, {T, H}, DType::kBFloat16);
  }
  std::optional<Tensor> hidden_scale() const {
    if (mode == Mode::kMxfp4Bf16) return std::nullopt;
    return bytes_tensor(xs, {T, H / (mode == Mode::kNvfp4 ? 16 : 32)}, DType::kFloat8E4M3FN);
  }
  Tensor gemm1() const {
    return bytes_tensor(prepare_rows(w1, local, n1(), H / 2, gated()), {local, n1(), H / 2},
                        DType::kUInt8);
  }
  Tensor gemm2() const {
    return bytes_tensor(prepare_rows(w2, local, H, I / 2, false), {local, H, I / 2}, DType::kUInt8);
  }
  // The 1-D 128x4 buffers reshaped to the docstring's [E, rows, cols] (as upstream's test does).
  Tensor scale1() const {
    return prepare_scales(s1, local, n1(), H / vec(), gated(), DType::kUInt8)
        .view({local, n1(), H / vec()});
  }
  Tensor scale2() const {
    return prepare_scales(s2, local, H, I / vec(), false, DType::kUInt8)
        .view({local, H, I / vec()});
  }
  std::optional<Tensor> f32(const std::vector<double>& v, Shape shape) const {
    if (v.empty()) return std::nullopt;
    return Tensor::from_vector(v, shape, DType::kFloat32);
  }
  std::optional<Tensor> bias1() const {
    if (b1.empty()) return std::nullopt;
    return f32(prepare_bias(b1, local, n1(), gated()), {local, n1()});
  }
  std::optional<Tensor> bias2() const {
    if (b2.empty()) return std::nullopt;
    return f32(prepare_bias(b2, local, H, false), {local, H});
  }

  std::vector<Tensor> run_routed(const MoeTopkIds& routing,
                                 std::optional<Tensor> output = std::nullopt) const {
    return trtllm_fp4_block_scale_routed_moe(
        routing, std::nullopt, hidden(), hidden_scale(), gemm1(), scale1(), bias1(),
        f32(alpha, {local}), f32(beta, {local}), f32(limit, {local}), gemm2(), scale2(), bias2(),
        f32(o1, {local}), f32(o1g, {local}), f32(o2, {local}), E, K, std::nullopt, std::nullopt, I,
        offset, local, std::nullopt, 0, true, std::nullopt, act, std::nullopt, output);
  }

  // fp64 formula, with upstream's reference's quantization of the activation (through the
  // library's fp4_quantize / mxfp8_quantize, the functions that reference calls).
  std::vector<double> expected(const MoeTopkIds& routing) const {
    const auto idv = routing.ids.to_double_vector(), wv = routing.weights->to_double_vector();
    // The combine takes the weights as given: bf16 ones are the routing's, fp32 pairs are not
    // rounded (upstream's launchers take their dtype; session 82).
    const int64_t N1 = n1(), v = vec();
    auto xval = [&](int64_t t, int64_t d) -> double {
      if (mode == Mode::kNvfp4) {
        return e2m1(x, static_cast<size_t>(t * H + d)) *
               e4m3fn_bits_to_float(xs[static_cast<size_t>(t * (H / 16) + d / 16)]);
      }
      if (mode == Mode::kMxfp4Mxfp8) {
        return e4m3fn_bits_to_float(x[static_cast<size_t>(t * H + d)]) *
               ue8m0(xs[static_cast<size_t>(t * (H / 32) + d / 32)]);
      }
      uint16_t b;
      std::memcpy(&b, &x[static_cast<size_t>(2 * (t * H + d))], 2);
      return bfloat16_bits_to_float(b);
    };
    auto wval = [&](const std::vector<uint8_t>& w, const std::vector<uint8_t>& s, int64_t e,
                    int64_t rows, int64_t cols, int64_t r, int64_t c) {
      const size_t i = static_cast<size_t>((e * rows + r) * cols + c);
      const uint8_t sc = s[static_cast<size_t>((e * rows + r) * (cols / v) + c / v)];
      return e2m1(w, i) * (mode == Mode::kNvfp4 ? e4m3fn_bits_to_float(sc) : ue8m0(sc));
    };
    std::vector<double> out(static_cast<size_t>(T * H), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = static_cast<int64_t>(idv[static_cast<size_t>(t * K + k)]) - offset;
        if (e < 0 || e >= local) continue;
        std::vector<double> g(static_cast<size_t>(N1), 0.0);
        for (int64_t j = 0; j < N1; ++j) {
          for (int64_t d = 0; d < H; ++d) g[j] += xval(t, d) * wval(w1, s1, e, N1, H, j, d);
        }
        std::vector<double> h(static_cast<size_t>(I));
        for (int64_t j = 0; j < I; ++j) {
          if (act == 7) {
            // SwigluStep on the raw accumulators (bias included), then the output scales:
            // upstream 0.7.4's trace reference (moe.py), the limit in raw units (default 7 /
            // output1_scale_gate_scalar, a physical 7).
            const double L =
                limit.empty() ? static_cast<float>(7.0f / static_cast<float>(o1g[e])) : limit[e];
            const double ru = g[j] + (b1.empty() ? 0.0 : b1[e * N1 + j]);
            const double rg = g[I + j] + (b1.empty() ? 0.0 : b1[e * N1 + I + j]);
            h[j] = std::clamp(ru, -L, L) * o1[e] * std::min(silu(rg * o1g[e]), L * o1g[e]);
          } else if (act == 3) {
            const double up = g[j] * o1[e] + (b1.empty() ? 0.0 : b1[e * N1 + j]);
            const double gate = g[I + j] * o1g[e] + (b1.empty() ? 0.0 : b1[e * N1 + I + j]);
            if (alpha.empty()) {
              h[j] = silu(gate) * up;
            } else {
              const double gl = std::min(gate, limit[e]);
              const double ul = std::clamp(up, -limit[e], limit[e]) + beta[e];
              h[j] = gl / (1.0 + std::exp(-alpha[e] * gl)) * ul;
            }
          } else {  // Relu2
            const double a = std::max(g[j] * o1g[e] + (b1.empty() ? 0.0 : b1[e * N1 + j]), 0.0);
            h[j] = a * a * o1[e];
          }
        }
        // The activation as GEMM2 reads it.
        std::vector<double> hb(h.size());
        for (size_t j = 0; j < h.size(); ++j) hb[j] = bf16(h[j]);
        std::vector<double> hq = hb;
        const Tensor ht = Tensor::from_vector(hb, {1, I}, DType::kBFloat16);
        if (mode == Mode::kNvfp4) {
          auto [q, sf] = fp4_quantize(ht, std::nullopt, 16, false, false);
          hq = e2m1_and_ufp8sf_scale_to_float(q, sf, Tensor::full({1}, 1.0, DType::kFloat32), 16, 1,
                                              false)
                   .to_double_vector();
        } else if (mode == Mode::kMxfp4Mxfp8) {
          auto [q, sf] = mxfp8_quantize(ht, false);
          hq = mxfp8_dequantize_host(q, sf, false).to_double_vector();
        }
        for (int64_t d = 0; d < H; ++d) {
          double y = 0.0;
          for (int64_t j = 0; j < I; ++j) y += hq[j] * wval(w2, s2, e, H, I, d, j);
          y = bf16(y * o2[e] + (b2.empty() ? 0.0 : b2[e * H + d]));
          out[static_cast<size_t>(t * H + d)] += wv[static_cast<size_t>(t * K + k)] * y;
        }
      }
    }
    return out;
  }
};

// Upstream accepts an `output` narrower than the hidden size (core.py: output.shape[1] <=
// hidden_size) and its finalize writes only those columns: a hidden size padded to 128s written
// back unpadded (gpt-oss's MXFP4 layers). The columns are the full output's, bit for bit; the
// call returns the given tensor; wider or other-row outputs are refused.
TEST(TrtllmFp4BlockScaleMoe, NarrowerOutputGetsTheFirstColumns) {
  Fp4Case c;
  c.make(17);
  const MoeTopkIds routing = pair_routing(c.T, c.E, c.K);
  const Tensor full = c.run_routed(routing)[0];
  const int64_t W = c.H - 40;
  Tensor narrow = Tensor::full({c.T, W}, 7.0, DType::kBFloat16);
  const auto got = c.run_routed(routing, narrow);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].data_ptr(), narrow.data_ptr());
  EXPECT_EQ(testing::bytes_of(narrow), testing::bytes_of(full.slice(1, 0, W)));
  const char* op = "trtllm_fp4_block_scale_routed_moe";
  EXPECT_FI_ERROR((void)c.run_routed(routing, Tensor::zeros({c.T, c.H + 1}, DType::kBFloat16)), op,
                  "output");
  EXPECT_FI_ERROR((void)c.run_routed(routing, Tensor::zeros({c.T + 1, W}, DType::kBFloat16)), op,
                  "output");
}

TEST(TrtllmFp4BlockScaleMoe, Nvfp4MatchesFormula) {
  for (int64_t offset : {int64_t{0}, int64_t{4}}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    Fp4Case c;
    c.offset = offset;
    c.local = offset == 0 ? 8 : 4;
    c.make(11);
    const MoeTopkIds routing = pair_routing(c.T, c.E, c.K);
    const auto out = c.run_routed(routing);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].dtype(), DType::kBFloat16);
    EXPECT_EQ(out[0].shape(), Shape({c.T, c.H}));
    const auto expect = c.expected(routing);
    EXPECT_GT(max_abs(expect), 0.5);
    EXPECT_TRUE(all_close(out[0], expect, default_tolerance(DType::kBFloat16)));
  }
}

// SwigluStep (upstream 0.7.4's StepFun epilogue; NVFP4 activations and weights only): the clamps
// act on GEMM1's raw accumulators with the bias, in raw units (gemm1_clamp_limit, or 7 /
// output1_scale_gate_scalar), then the output scales; alpha / beta and MXFP4 are refused.
TEST(TrtllmFp4BlockScaleMoe, Nvfp4SwigluStepOnRawAccumulators) {
  for (const bool given_limit : {false, true}) {
    SCOPED_TRACE(given_limit ? "gemm1_clamp_limit" : "default limit");
    Fp4Case c;
    c.act = 7;
    c.bias = true;
    c.make(41);
    if (given_limit) c.limit = {0.4, 0.6, 0.8, 1.0, 0.5, 0.7, 0.9, 0.3};  // raw units: they bite
    const MoeTopkIds routing = pair_routing(c.T, c.E, c.K);
    const auto expect = c.expected(routing);
    EXPECT_GT(max_abs(expect), 0.5);
    EXPECT_TRUE(all_close(c.run_routed(routing)[0], expect, default_tolerance(DType::kBFloat16)));
  }
  Fp4Case c;
  c.act = 7;
  c.make(42);
  c.alpha = std::vector<double>(8, 1.0);
  const MoeTopkIds routing = pair_routing(c.T, c.E, c.K);
  EXPECT_FI_ERROR(c.run_routed(routing), "trtllm_fp4_block_scale_routed_moe", "gemm1_alpha");
  Fp4Case m;
  m.mode = Mode::kMxfp4Bf16;
  m.act = 7;
  m.I = 128;
  m.make(43);
  EXPECT_FI_ERROR(m.run_routed(pair_routing(m.T, m.E, m.K)), "trtllm_fp4_block_scale_routed_moe",
                  "activation_type");
}

TEST(TrtllmFp4BlockScaleMoe, Nvfp4Relu2NonGated) {
  Fp4Case c;
  c.act = 6;
  c.I = 128;
  c.bias = true;
  c.make(21);
  const MoeTopkIds routing = pair_routing(c.T, c.E, c.K);
  const auto expect = c.expected(routing);
  EXPECT_GT(max_abs(expect), 0.5);
  EXPECT_TRUE(all_close(c.run_routed(routing)[0], expect, default_tolerance(DType::kBFloat16)));
}

// gpt-oss style: MXFP4 weights, bf16 hidden states, biases, SwiGLU alpha / beta / clamp limit.
TEST(TrtllmFp4BlockScaleMoe, Mxfp4Bf16WithBiasAndSwigluParams) {
  Fp4Case c;
  c.mode = Mode::kMxfp4Bf16;
  c.I = 128;  // the 128x4 scale layout: I / 32 a multiple of 4
  c.bias = true;
  c.swiglu_params = true;
  c.make(31);
  const MoeTopkIds routing = pair_routing(c.T, c.E, c.K);
  const auto expect = c.expected(routing);
  EXPECT_GT(max_abs(expect), 0.5);
  EXPECT_TRUE(all_close(c.run_routed(routing)[0], expect, default_tolerance(DType::kBFloat16)));
}

TEST(TrtllmFp4BlockScaleMoe, Mxfp4Mxfp8MatchesFormula) {
  Fp4Case c;
  c.mode = Mode::kMxfp4Mxfp8;
  c.I = 128;
  c.make(41);
  const MoeTopkIds routing = pair_routing(c.T, c.E, c.K);
  const auto expect = c.expected(routing);
  EXPECT_GT(max_abs(expect), 0.5);
  EXPECT_TRUE(all_close(c.run_routed(routing)[0], expect, default_tolerance(DType::kBFloat16)));
}

// Routing from logits (Renormalize: top-k logits, softmax over the k) equals the routed op fed
// that routing; routing_replay_out receives the ids.
TEST(TrtllmFp4BlockScaleMoe, RoutingFromLogitsMatchesRouted) {
  Fp4Case c;
  c.make(51);
  Rng r{52};
  std::vector<double> logits(static_cast<size_t>(c.T * c.E)), ids, w;
  for (auto& l : logits) l = static_cast<float>(r.uniform(-3, 3));
  for (int64_t t = 0; t < c.T; ++t) {
    std::vector<int64_t> order(static_cast<size_t>(c.E));
    for (int64_t e = 0; e < c.E; ++e) order[e] = e;
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return logits[t * c.E + a] > logits[t * c.E + b]; });
    const double l0 = logits[t * c.E + order[0]], l1 = logits[t * c.E + order[1]];
    const double s = std::exp(l0 - l0) + std::exp(l1 - l0);
    ids.push_back(static_cast<double>(order[0]));
    ids.push_back(static_cast<double>(order[1]));
    w.push_back(1.0 / s);
    w.push_back(std::exp(l1 - l0) / s);
  }
  const MoeTopkIds routing(Tensor::from_vector(ids, {c.T, c.K}, DType::kInt32),
                           Tensor::from_vector(w, {c.T, c.K}, DType::kFloat32));
  Tensor replay = Tensor::zeros({c.T, c.K}, DType::kInt16);
  const auto out = trtllm_fp4_block_scale_moe(
      Tensor::from_vector(logits, {c.T, c.E}, DType::kFloat32), std::nullopt, c.hidden(),
      c.hidden_scale(), c.gemm1(), c.scale1(), std::nullopt, std::nullopt, std::nullopt,
      std::nullopt, c.gemm2(), c.scale2(), std::nullopt, c.f32(c.o1, {8}), c.f32(c.o1g, {8}),
      c.f32(c.o2, {8}), c.E, c.K, std::nullopt, std::nullopt, c.I, 0, c.E, std::nullopt, 1, true,
      std::nullopt, 3, std::nullopt, std::nullopt, 8192, true, replay);
  EXPECT_TRUE(all_close(out[0], c.run_routed(routing)[0], default_tolerance(DType::kBFloat16)));
  EXPECT_TRUE(all_close(out[0], c.expected(routing), default_tolerance(DType::kBFloat16)));
  EXPECT_TRUE(all_close(replay.to(DType::kInt32), ids, {0, 0}));
}

TEST(TrtllmFp4BlockScaleMoe, BadInput) {
  Fp4Case c;
  c.make(61);
  const char* op = "trtllm_fp4_block_scale_routed_moe";
  const MoeTopkIds routing = pair_routing(c.T, c.E, c.K);
  const Tensor x = c.hidden(), w1 = c.gemm1(), s1 = c.scale1(), w2 = c.gemm2(), s2 = c.scale2();
  const std::optional<Tensor> xs = c.hidden_scale();
  auto call = [&](const Tensor& h, const std::optional<Tensor>& hs, const Tensor& a,
                  const Tensor& as, const Tensor& b, const Tensor& bs, int64_t inter = 64,
                  int64_t act = 3, bool fin = true,
                  std::optional<Tensor> per_token = std::nullopt) {
    (void)trtllm_fp4_block_scale_routed_moe(
        routing, std::nullopt, h, hs, a, as, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
        b, bs, std::nullopt, std::nullopt, std::nullopt, std::nullopt, c.E, c.K, std::nullopt,
        std::nullopt, inter, 0, c.E, std::nullopt, 0, fin, std::nullopt, act, per_token);
  };
  EXPECT_FI_ERROR(call(Tensor::zeros({c.T, c.H}, DType::kFloat16), std::nullopt, w1, s1, w2, s2),
                  op, "hidden_states");
  // bf16 hidden states need MXFP4 weights.
  EXPECT_FI_ERROR(call(Tensor::zeros({c.T, c.H}, DType::kBFloat16), std::nullopt, w1, s1, w2, s2),
                  op, "hidden_states");
  EXPECT_FI_ERROR(call(x, std::nullopt, w1, s1, w2, s2), op, "hidden_states_scale");
  EXPECT_FI_ERROR(call(x, Tensor::zeros({c.T, 3}, DType::kUInt8), w1, s1, w2, s2), op,
                  "hidden_states_scale");
  EXPECT_FI_ERROR(call(x, xs, w1.to(DType::kFloat32), s1, w2, s2), op, "gemm1_weights");
  EXPECT_FI_ERROR(call(x, xs, w1, Tensor::zeros({8, 128, 5}, DType::kUInt8), w2, s2), op,
                  "gemm1_weights_scale");
  EXPECT_FI_ERROR(call(x, xs, w1, s1, Tensor::zeros({8, 128, 16}, DType::kUInt8), s2), op,
                  "gemm2_weights");
  EXPECT_FI_ERROR(call(x, xs, w1, s1, w2, Tensor::zeros({8, 128, 2}, DType::kUInt8)), op,
                  "gemm2_weights_scale");
  EXPECT_FI_ERROR(call(x, xs, w1, s1, w2, s2, 64, 8), op, "activation_type");
  // do_finalize=False runs (test_moe_unfinalized.cpp) and checks the other arguments the same.
  EXPECT_FI_ERROR(call(x, xs, w1, s1, w2, s2, 64, 8, false), op, "activation_type");
  EXPECT_FI_ERROR(call(x, xs, w1, s1, w2, s2, 64, 3, true, Tensor::zeros({c.T}, DType::kFloat32)),
                  op, "per_token_scale");
  // 2 * intermediate_size = 64 rows: not a multiple of 128 (the prepared scales' row tile).
  EXPECT_FI_ERROR(
      call(x, xs, Tensor::zeros({8, 64, 64}, DType::kUInt8),
           Tensor::zeros({8, 64, 8}, DType::kUInt8), Tensor::zeros({8, 128, 16}, DType::kUInt8),
           Tensor::zeros({8, 128, 2}, DType::kUInt8), 32),
      op, "intermediate_size");
  EXPECT_FI_ERROR(
      (void)trtllm_fp4_block_scale_routed_moe(
          routing, std::nullopt, x, xs, w1, s1, std::nullopt, std::nullopt, std::nullopt,
          std::nullopt, w2, s2, std::nullopt, std::nullopt, std::nullopt, std::nullopt, c.E, c.K,
          std::nullopt, std::nullopt, 64, 0, c.E, std::nullopt, 0, true, std::nullopt, 3,
          std::nullopt, std::nullopt, 8192, Tensor::zeros({c.T * c.K, 64}, DType::kBFloat16)),
      op, "gemm1_lora_delta");
  EXPECT_FI_ERROR((void)trtllm_fp4_block_scale_routed_moe(
                      routing, std::nullopt, x, xs, w1, s1, Tensor::zeros({8, 7}, DType::kFloat32),
                      std::nullopt, std::nullopt, std::nullopt, w2, s2, std::nullopt, std::nullopt,
                      std::nullopt, std::nullopt, c.E, c.K, std::nullopt, std::nullopt, 64, 0, c.E,
                      std::nullopt),
                  op, "gemm1_bias");
  EXPECT_FI_ERROR((void)trtllm_fp4_block_scale_moe(
                      Tensor::zeros({c.T, 4}, DType::kFloat32), std::nullopt, x, xs, w1, s1,
                      std::nullopt, std::nullopt, std::nullopt, std::nullopt, w2, s2, std::nullopt,
                      std::nullopt, std::nullopt, std::nullopt, c.E, c.K, std::nullopt,
                      std::nullopt, 64, 0, c.E, std::nullopt),
                  "trtllm_fp4_block_scale_moe", "routing_logits");
  EXPECT_FI_ERROR((void)trtllm_fp4_block_scale_moe(
                      Tensor::zeros({c.T, c.E}, DType::kFloat32), std::nullopt, x, xs, w1, s1,
                      std::nullopt, std::nullopt, std::nullopt, std::nullopt, w2, s2, std::nullopt,
                      std::nullopt, std::nullopt, std::nullopt, c.E, c.K, std::nullopt,
                      std::nullopt, 64, 0, c.E, std::nullopt, 0, true, std::nullopt, 3,
                      std::nullopt, std::nullopt, 8192, true, std::nullopt, 1),
                  "trtllm_fp4_block_scale_moe", "routing_method_type");  // DeepSeekV3 only
}

// ---- upstream 0.7.4's padded dimensions ----------------------------------------------------

std::vector<double> embed_doubles(const std::vector<double>& src, int64_t E, int64_t n, int64_t pn,
                                  const std::vector<int64_t>& to, Rng& r) {
  std::vector<double> out(static_cast<size_t>(E * pn));
  for (auto& d : out) d = static_cast<float>(r.uniform(-9, 9));
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = 0; i < n; ++i) {
      out[static_cast<size_t>(e * pn + to[static_cast<size_t>(i)])] =
          src[static_cast<size_t>(e * n + i)];
    }
  }
  return out;
}

// valid_hidden_size / valid_intermediate_size (upstream 0.7.4; docs/MOE.md, "Padded
// dimensions"): a layer padded to H 256 and I 256 with random bytes in every padding (weights,
// scales, biases, the hidden states' extra columns) computes exactly the unpadded layer's output,
// as upstream's tests check it (random padding, the sliced sub-problem as reference); gemm2 has
// roundUp(valid_hidden_size, 128) rows and the output is valid_hidden_size wide (120: the
// unpadded output's first 120 columns).
TEST(TrtllmFp4BlockScaleMoe, ValidDimsComputeTheUnpaddedLayer) {
  for (Mode mode : {Mode::kNvfp4, Mode::kMxfp4Bf16}) {
    SCOPED_TRACE(mode == Mode::kNvfp4 ? "NVFP4" : "MXFP4 x bf16");
    Fp4Case c;
    c.mode = mode;
    c.H = 128;
    c.I = 128;
    c.bias = mode == Mode::kMxfp4Bf16;
    c.swiglu_params = mode == Mode::kMxfp4Bf16;
    c.make(91);
    const MoeTopkIds routing = pair_routing(c.T, c.E, c.K);
    const Tensor small = c.run_routed(routing)[0];
    const int64_t Hp = 256, Ip = 256, El = c.local, v = c.vec(), H = c.H, I = c.I;
    Rng r{92};
    auto any_byte = [&](uint8_t* p) { *p = static_cast<uint8_t>(r.next()); };
    auto finite_scale = [&](uint8_t* p) {
      *p = mode == Mode::kNvfp4 ? float_to_e4m3fn_bits(static_cast<float>(r.uniform(0.5, 1)), true)
                                : static_cast<uint8_t>(120 + r.next() % 3);
    };
    auto finite_bf16 = [&](uint8_t* p) {
      const uint16_t b = float_to_bfloat16_bits(static_cast<float>(r.uniform(-2, 2)));
      std::memcpy(p, &b, 2);
    };
    const bool nv = mode == Mode::kNvfp4;
    const int64_t xb = nv ? H / 2 : 2 * H, xpb = nv ? Hp / 2 : 2 * Hp;
    const auto x = embed(c.x, 1, c.T, xb, c.T, xpb, identity_rows(c.T), nv ? 1 : 2,
                         nv ? std::function<void(uint8_t*)>(any_byte) : finite_bf16);
    const Tensor hidden = nv ? bytes_tensor(x, {c.T, Hp / 2}, DType::kUInt8)
                             : bytes_tensor(x, {c.T, Hp}, DType::kBFloat16);
    std::optional<Tensor> hs;
    if (nv) {
      hs = bytes_tensor(
          embed(c.xs, 1, c.T, H / 16, c.T, Hp / 16, identity_rows(c.T), 1, finite_scale),
          {c.T, Hp / 16}, DType::kFloat8E4M3FN);
    }
    const auto g1rows = gated_rows(I, Ip);
    const auto w1 = embed(c.w1, El, 2 * I, H / 2, 2 * Ip, Hp / 2, g1rows, 1, any_byte);
    const auto s1 = embed(c.s1, El, 2 * I, H / v, 2 * Ip, Hp / v, g1rows, 1, any_byte);
    // GEMM2 has roundUp(valid_hidden_size, 128) = 128 rows: only its columns are padded.
    const auto w2 = embed(c.w2, El, H, I / 2, H, Ip / 2, identity_rows(H), 1, any_byte);
    const auto s2 = embed(c.s2, El, H, I / v, H, Ip / v, identity_rows(H), 1, any_byte);
    const Tensor w1t = bytes_tensor(prepare_rows(w1, El, 2 * Ip, Hp / 2, true),
                                    {El, 2 * Ip, Hp / 2}, DType::kUInt8);
    const Tensor s1t =
        prepare_scales(s1, El, 2 * Ip, Hp / v, true, DType::kUInt8).view({El, 2 * Ip, Hp / v});
    const Tensor w2t =
        bytes_tensor(prepare_rows(w2, El, H, Ip / 2, false), {El, H, Ip / 2}, DType::kUInt8);
    const Tensor s2t =
        prepare_scales(s2, El, H, Ip / v, false, DType::kUInt8).view({El, H, Ip / v});
    std::optional<Tensor> b1, b2;
    if (c.bias) {
      b1 = c.f32(prepare_bias(embed_doubles(c.b1, El, 2 * I, 2 * Ip, g1rows, r), El, 2 * Ip, true),
                 {El, 2 * Ip});
      b2 = c.bias2();  // GEMM2's rows: roundUp(valid_hidden_size, 128) = 128
    }
    auto run = [&](int64_t vh, int64_t vi, std::optional<Tensor> output = std::nullopt) {
      return trtllm_fp4_block_scale_routed_moe(
          routing, std::nullopt, hidden, hs, w1t, s1t, b1, c.f32(c.alpha, {El}),
          c.f32(c.beta, {El}), c.f32(c.limit, {El}), w2t, s2t, b2, c.f32(c.o1, {El}),
          c.f32(c.o1g, {El}), c.f32(c.o2, {El}), c.E, c.K, std::nullopt, std::nullopt, Ip, c.offset,
          El, std::nullopt, 0, true, std::nullopt, c.act, std::nullopt, output, 8192, std::nullopt,
          vh, vi);
    };
    const auto got = run(128, 128);
    ASSERT_EQ(got.size(), 1u);
    ASSERT_EQ(got[0].shape(), Shape({c.T, H}));
    EXPECT_EQ(testing::bytes_of(got[0]), testing::bytes_of(small));
    // roundUp(100, 128) = 128 rows of each half; a 120-wide output, written into the caller's.
    Tensor out120 = Tensor::full({c.T, 120}, 3.0, DType::kBFloat16);
    const auto narrow = run(120, 100, out120);
    EXPECT_EQ(narrow[0].data_ptr(), out120.data_ptr());
    EXPECT_EQ(testing::bytes_of(out120), testing::bytes_of(small.slice(1, 0, 120)));
    EXPECT_EQ(testing::bytes_of(run(120, 100)[0]), testing::bytes_of(small.slice(1, 0, 120)));
  }
}

#define EXPECT_FI_ERROR_TEXT(stmt, op_name, arg_name, text)                                   \
  FLASHINFER_EXPECT_ERROR_IMPL(stmt, op_name, arg_name,                                       \
                               EXPECT_NE(std::string(e.what()).find(text), std::string::npos) \
                                   << e.what())

// Upstream 0.7.4's checks of the new arguments, with its texts: the padded dimensions, the
// output width, hidden_states_scale_layout (validation only: linear or None), workspace_buffer
// (checked, never read), nvfp4_4over6 (an explicit config needs per_token_scale) and
// routing_metadata (accepted alone: the same routing; refused with workspace_buffer).
TEST(TrtllmFp4BlockScaleMoe, Upstream074ArgumentsChecked) {
  Fp4Case c;
  c.make(61);
  const char* op = "trtllm_fp4_block_scale_routed_moe";
  const MoeTopkIds routing = pair_routing(c.T, c.E, c.K);
  const Tensor x = c.hidden(), w1 = c.gemm1(), s1 = c.scale1(), w2 = c.gemm2(), s2 = c.scale2();
  const std::optional<Tensor> xs = c.hidden_scale();
  struct Extra {
    std::optional<int64_t> vh, vi;
    Value layout;
    std::optional<Tensor> ws;
    Value four_over_six = nvfp4_4over6_unset();
    Value metadata;
    bool finalize = true;
    std::optional<Tensor> output;
  };
  auto call = [&](const Extra& a) {
    return trtllm_fp4_block_scale_routed_moe(
        routing, std::nullopt, x, xs, w1, s1, std::nullopt, std::nullopt, std::nullopt,
        std::nullopt, w2, s2, std::nullopt, std::nullopt, std::nullopt, std::nullopt, c.E, c.K,
        std::nullopt, std::nullopt, c.I, 0, c.E, std::nullopt, 0, a.finalize, std::nullopt, 3,
        std::nullopt, a.output, 8192, std::nullopt, a.vh, a.vi, std::nullopt, a.layout, a.ws,
        a.four_over_six, a.metadata);
  };
  const Tensor plain = call({})[0];
  auto with = [](auto f) {
    Extra a;
    f(a);
    return a;
  };
  EXPECT_FI_ERROR_TEXT(call(with([](Extra& a) { a.vh = 0; })), op, "valid_hidden_size",
                       "valid_hidden_size must be positive, got 0");
  EXPECT_FI_ERROR_TEXT(call(with([](Extra& a) { a.vh = 129; })), op, "valid_hidden_size",
                       "roundUp(valid_hidden_size, 128) must be <= padded hidden_size, got 256 > "
                       "128");
  EXPECT_FI_ERROR_TEXT(call(with([](Extra& a) { a.vh = 100; })), op, "valid_hidden_size",
                       "must be a multiple of 8");
  EXPECT_FI_ERROR_TEXT(call(with([](Extra& a) { a.vi = 65; })), op, "valid_intermediate_size",
                       "valid_intermediate_size=65 must be <= padded dimension 64");
  EXPECT_FI_ERROR_TEXT(call(with([&](Extra& a) {
                         a.vh = 120;
                         a.output = Tensor::zeros({c.T, 128}, DType::kBFloat16);
                       })),
                       op, "output", "output.shape[1] must equal valid_hidden_size=120");
  // Unfinalized: only when roundUp(valid_hidden_size, 128) is the hidden size (it is here).
  EXPECT_EQ(call(with([](Extra& a) {
              a.vh = 120;
              a.finalize = false;
            })).size(),
            3u);
  EXPECT_FI_ERROR_CODE(call(with([](Extra& a) { a.layout = to_value(SfLayout::layout_128x4); })),
                       op, "hidden_states_scale_layout", ErrorCode::kUnsupported);
  EXPECT_FI_ERROR_TEXT(call(with([](Extra& a) { a.layout = Value(int64_t{5}); })), op,
                       "hidden_states_scale_layout",
                       "hidden_states_scale_layout=5 is not supported by the trtllm-gen MoE path");
  EXPECT_EQ(testing::bytes_of(
                call(with([](Extra& a) { a.layout = to_value(SfLayout::layout_linear); }))[0]),
            testing::bytes_of(plain));
  const Tensor ws = Tensor::zeros({1 << 16}, DType::kUInt8);
  EXPECT_EQ(testing::bytes_of(call(with([&](Extra& a) { a.ws = ws; }))[0]),
            testing::bytes_of(plain));
  EXPECT_FI_ERROR_TEXT(call(with([](Extra& a) { a.ws = Tensor::zeros({64}, DType::kFloat32); })),
                       op, "workspace_buffer", "workspace_buffer dtype must be uint8 or int8");
  EXPECT_FI_ERROR_TEXT(call(with([](Extra& a) {
                         a.ws = Tensor::zeros({8, 8}, DType::kUInt8);
                       })),
                       op, "workspace_buffer", "workspace_buffer must be 1-D, got ndim=2");
  EXPECT_FI_ERROR_TEXT(call(with([&](Extra& a) {
                         a.ws = ws;
                         a.finalize = false;
                       })),
                       op, "workspace_buffer", "workspace_buffer requires do_finalize=True");
  // An NVFP44Over6Config (any value but None) without per_token_scale: upstream's ValueError.
  EXPECT_FI_ERROR_TEXT(call(with([](Extra& a) { a.four_over_six = Value(true); })), op,
                       "nvfp4_4over6", "nvfp4_4over6 requires per_token_scale with NVFP4");
  EXPECT_EQ(testing::bytes_of(call(with([](Extra& a) { a.four_over_six = Value(); }))[0]),
            testing::bytes_of(plain));
  const Value slot = Value(std::string("TrtllmMoERoutingMetadataSlot"));
  EXPECT_EQ(testing::bytes_of(call(with([&](Extra& a) { a.metadata = slot; }))[0]),
            testing::bytes_of(plain));
  EXPECT_FI_ERROR_TEXT(call(with([&](Extra& a) {
                         a.metadata = slot;
                         a.ws = ws;
                       })),
                       op, "routing_metadata", "routing_metadata supports neither");
}

// ---- MxInt4 -----------------------------------------------------------------------------------

struct MxInt4Case {
  int64_t T = 5, E = 8, K = 2, H = 256, I = 64;
  std::vector<uint8_t> w1, w2, s1, s2;  // s*: bf16 bytes
  std::vector<uint16_t> xb;
  void make(uint64_t seed) {
    xb = bf16_bits(static_cast<size_t>(T * H), seed, -2, 2);
    w1 = random_bytes(static_cast<size_t>(E * 2 * I * H / 2), seed + 1);
    w2 = random_bytes(static_cast<size_t>(E * H * I / 2), seed + 2);
    auto sc = [&](int64_t n, uint64_t sd) {
      const auto b = bf16_bits(static_cast<size_t>(n), sd, 0.005, 0.02);
      std::vector<uint8_t> out(b.size() * 2);
      std::memcpy(out.data(), b.data(), out.size());
      return out;
    };
    s1 = sc(E * 2 * I * H / 32, seed + 3);
    s2 = sc(E * H * I / 32, seed + 4);
  }
  Tensor hidden() const {
    std::vector<uint8_t> b(xb.size() * 2);
    std::memcpy(b.data(), xb.data(), b.size());
    return bytes_tensor(b, {T, H}, DType::kBFloat16);
  }
  // block_bytes 0: MajorK, else BlockMajorK with that many bytes per block.
  Tensor gemm1(int64_t block_bytes) const {
    const auto p = prepare_rows(w1, E, 2 * I, H / 2, true, block_bytes);
    if (block_bytes == 0) return bytes_tensor(p, {E, 2 * I, H / 2}, DType::kUInt8);
    return bytes_tensor(p, {E, H / 2 / block_bytes, 2 * I, block_bytes}, DType::kUInt8);
  }
  Tensor gemm2(int64_t block_bytes) const {
    const auto p = prepare_rows(w2, E, H, I / 2, false, block_bytes);
    if (block_bytes == 0) return bytes_tensor(p, {E, H, I / 2}, DType::kUInt8);
    return bytes_tensor(p, {E, I / 2 / block_bytes, H, block_bytes}, DType::kUInt8);
  }
  // Per expert 1-D buffers stacked, as upstream's test stacks them: [E, padded].
  Tensor scale1() const {
    const Tensor t = prepare_scales(s1, E, 2 * I, H / 32, true, DType::kBFloat16);
    return t.view({E, t.numel() / E});
  }
  Tensor scale2() const {
    const Tensor t = prepare_scales(s2, E, H, I / 32, false, DType::kBFloat16);
    return t.view({E, t.numel() / E});
  }
  double scale(const std::vector<uint8_t>& s, size_t i) const {
    uint16_t b;
    std::memcpy(&b, &s[2 * i], 2);
    return bfloat16_bits_to_float(b);
  }
  std::vector<double> expected(const MoeTopkIds& routing, const std::vector<double>& alpha = {},
                               const std::vector<double>& beta = {},
                               const std::vector<double>& limit = {}) const {
    const auto idv = routing.ids.to_double_vector(), wv = routing.weights->to_double_vector();
    // The combine takes the weights as given: bf16 ones are the routing's, fp32 pairs are not
    // rounded (upstream's launchers take their dtype; session 82).
    std::vector<double> out(static_cast<size_t>(T * H), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = static_cast<int64_t>(idv[static_cast<size_t>(t * K + k)]);
        std::vector<double> g(static_cast<size_t>(2 * I), 0.0);
        for (int64_t j = 0; j < 2 * I; ++j) {
          for (int64_t d = 0; d < H; ++d) {
            const size_t wi = static_cast<size_t>((e * 2 * I + j) * H + d);
            g[j] += bfloat16_bits_to_float(xb[t * H + d]) * int4(w1, wi) * scale(s1, wi / 32);
          }
        }
        std::vector<double> h(static_cast<size_t>(I));
        for (int64_t j = 0; j < I; ++j) {
          if (alpha.empty()) {
            h[j] = bf16(silu(g[I + j]) * g[j]);
          } else {
            const double gl = std::min(g[I + j], limit[e]);
            const double ul = std::clamp(g[j], -limit[e], limit[e]) + beta[e];
            h[j] = bf16(gl / (1.0 + std::exp(-alpha[e] * gl)) * ul);
          }
        }
        for (int64_t d = 0; d < H; ++d) {
          double y = 0.0;
          for (int64_t j = 0; j < I; ++j) {
            const size_t wi = static_cast<size_t>((e * H + d) * I + j);
            y += h[j] * int4(w2, wi) * scale(s2, wi / 32);
          }
          out[static_cast<size_t>(t * H + d)] += wv[static_cast<size_t>(t * K + k)] * bf16(y);
        }
      }
    }
    return out;
  }
};

TEST(TrtllmMxInt4BlockScaleMoe, MatchesFormulaInBothLayouts) {
  MxInt4Case c;
  c.make(71);
  const MoeTopkIds routing = pair_routing(c.T, c.E, c.K);
  const auto expect = c.expected(routing);
  EXPECT_GT(max_abs(expect), 0.5);
  std::vector<Tensor> outs;
  for (int64_t block : {int64_t{128}, int64_t{0}}) {
    SCOPED_TRACE("block bytes " + std::to_string(block));
    const int64_t b2 = block == 0 ? 0 : 32;  // gemm2 rows are I / 2 = 32 bytes
    const auto out = trtllm_mxint4_block_scale_routed_moe(
        routing, c.hidden(), c.gemm1(block), c.scale1(), std::nullopt, std::nullopt, std::nullopt,
        c.gemm2(b2), c.scale2(), c.E, c.K, std::nullopt, std::nullopt, c.I, 0, c.E, std::nullopt);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_TRUE(all_close(out[0], expect, default_tolerance(DType::kBFloat16)));
    outs.push_back(out[0]);
  }
  EXPECT_TRUE(all_close(outs[0], outs[1], {0, 0}));
  // SwiGLU parameters.
  const std::vector<double> alpha(8, 1.702), beta(8, 1.0), limit(8, 0.5);
  auto t8 = [](const std::vector<double>& v) {
    return Tensor::from_vector(v, {8}, DType::kFloat32);
  };
  const auto out = trtllm_mxint4_block_scale_routed_moe(
      routing, c.hidden(), c.gemm1(0), c.scale1(), t8(alpha), t8(beta), t8(limit), c.gemm2(0),
      c.scale2(), c.E, c.K, std::nullopt, std::nullopt, c.I, 0, c.E, std::nullopt);
  const auto expect2 = c.expected(routing, alpha, beta, limit);
  EXPECT_GT(max_abs(expect2), 0.1);
  EXPECT_TRUE(all_close(out[0], expect2, default_tolerance(DType::kBFloat16)));
}

// MxInt4 with upstream 0.7.4's padded dimensions: the layer padded to H 256 and I 256 (random
// bytes in every padding) computes the unpadded layer's output bit for bit, valid_hidden_size
// wide; the LoRA delta's activation is intermediate_size wide, so a smaller valid size with it
// is refused.
TEST(TrtllmMxInt4BlockScaleMoe, ValidDimsComputeTheUnpaddedLayer) {
  MxInt4Case c;
  c.H = 128;
  c.I = 128;
  c.make(93);
  const MoeTopkIds routing = pair_routing(c.T, c.E, c.K);
  auto run_small = [&] {
    return trtllm_mxint4_block_scale_routed_moe(
        routing, c.hidden(), c.gemm1(0), c.scale1(), std::nullopt, std::nullopt, std::nullopt,
        c.gemm2(0), c.scale2(), c.E, c.K, std::nullopt, std::nullopt, c.I, 0, c.E, std::nullopt)[0];
  };
  const Tensor small = run_small();
  const int64_t Hp = 256, Ip = 256, E = c.E, H = c.H, I = c.I;
  Rng r{94};
  auto any_byte = [&](uint8_t* p) { *p = static_cast<uint8_t>(r.next()); };
  auto finite_bf16 = [&](uint8_t* p) {
    const uint16_t b = float_to_bfloat16_bits(static_cast<float>(r.uniform(-2, 2)));
    std::memcpy(p, &b, 2);
  };
  std::vector<uint8_t> xbytes(c.xb.size() * 2);
  std::memcpy(xbytes.data(), c.xb.data(), xbytes.size());
  const auto x = embed(xbytes, 1, c.T, 2 * H, c.T, 2 * Hp, identity_rows(c.T), 2, finite_bf16);
  const auto g1rows = gated_rows(I, Ip);
  const auto w1 = embed(c.w1, E, 2 * I, H / 2, 2 * Ip, Hp / 2, g1rows, 1, any_byte);
  const auto s1 = embed(c.s1, E, 2 * I, 2 * (H / 32), 2 * Ip, 2 * (Hp / 32), g1rows, 2, any_byte);
  const auto w2 = embed(c.w2, E, H, I / 2, H, Ip / 2, identity_rows(H), 1, any_byte);
  const auto s2 = embed(c.s2, E, H, 2 * (I / 32), H, 2 * (Ip / 32), identity_rows(H), 2, any_byte);
  const Tensor w1t =
      bytes_tensor(prepare_rows(w1, E, 2 * Ip, Hp / 2, true), {E, 2 * Ip, Hp / 2}, DType::kUInt8);
  const Tensor s1t = prepare_scales(s1, E, 2 * Ip, Hp / 32, true, DType::kBFloat16);
  const Tensor w2t =
      bytes_tensor(prepare_rows(w2, E, H, Ip / 2, false), {E, H, Ip / 2}, DType::kUInt8);
  const Tensor s2t = prepare_scales(s2, E, H, Ip / 32, false, DType::kBFloat16);
  auto run = [&](int64_t vh, int64_t vi, std::optional<Tensor> lora = std::nullopt) {
    return trtllm_mxint4_block_scale_routed_moe(
        routing, bytes_tensor(x, {c.T, Hp}, DType::kBFloat16), w1t, s1t.view({E, s1t.numel() / E}),
        std::nullopt, std::nullopt, std::nullopt, w2t, s2t.view({E, s2t.numel() / E}), c.E, c.K,
        std::nullopt, std::nullopt, Ip, 0, c.E, std::nullopt, 0, true, std::nullopt, lora,
        std::nullopt, 8192, vh, vi)[0];
  };
  const Tensor got = run(128, 128);
  ASSERT_EQ(got.shape(), Shape({c.T, H}));
  EXPECT_EQ(testing::bytes_of(got), testing::bytes_of(small));
  EXPECT_EQ(testing::bytes_of(run(64, 72)), testing::bytes_of(small.slice(1, 0, 64)));
  EXPECT_FI_ERROR_CODE((void)run(128, 128, Tensor::zeros({c.T, c.K, 2 * Ip}, DType::kBFloat16)),
                       "trtllm_mxint4_block_scale_routed_moe", "valid_intermediate_size",
                       ErrorCode::kUnsupported);
}

TEST(TrtllmMxInt4BlockScaleMoe, RoutingFromLogitsAndBadInput) {
  MxInt4Case c;
  c.make(81);
  // TopK routing (method 5): top-k of the logits, the logits as weights.
  std::vector<double> logits(static_cast<size_t>(c.T * c.E), 0.0), ids, w;
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t k = 0; k < c.K; ++k) {
      const int64_t e = (2 * t + 5 * k) % c.E;
      logits[t * c.E + e] = k == 0 ? 0.75 : 0.5;
      ids.push_back(static_cast<double>(e));
      w.push_back(k == 0 ? 0.75 : 0.5);
    }
  }
  const MoeTopkIds routing(Tensor::from_vector(ids, {c.T, c.K}, DType::kInt32),
                           Tensor::from_vector(w, {c.T, c.K}, DType::kFloat32));
  const Tensor lg = Tensor::from_vector(logits, {c.T, c.E}, DType::kBFloat16);
  const auto out = trtllm_mxint4_block_scale_moe(
      lg, std::nullopt, c.hidden(), c.gemm1(128), c.scale1(), std::nullopt, std::nullopt,
      std::nullopt, c.gemm2(32), c.scale2(), c.E, c.K, std::nullopt, std::nullopt, c.I, 0, c.E,
      std::nullopt, 5);
  EXPECT_TRUE(all_close(out[0], c.expected(routing), default_tolerance(DType::kBFloat16)));

  const char* op = "trtllm_mxint4_block_scale_routed_moe";
  auto call = [&](const Tensor& h, const Tensor& a, const Tensor& as, const Tensor& b,
                  const Tensor& bs, int64_t inter = 64) {
    (void)trtllm_mxint4_block_scale_routed_moe(routing, h, a, as, std::nullopt, std::nullopt,
                                               std::nullopt, b, bs, c.E, c.K, std::nullopt,
                                               std::nullopt, inter, 0, c.E, std::nullopt);
  };
  const Tensor x = c.hidden(), w1 = c.gemm1(0), s1 = c.scale1(), w2 = c.gemm2(0), s2 = c.scale2();
  EXPECT_FI_ERROR(call(x.to(DType::kFloat16), w1, s1, w2, s2), op, "hidden_states");
  EXPECT_FI_ERROR(call(x, w1.slice(1, 0, 64), s1, w2, s2), op, "gemm1_weights");
  EXPECT_FI_ERROR(call(x, w1, s1.to(DType::kFloat32), w2, s2), op, "gemm1_weights_scale");
  EXPECT_FI_ERROR(call(x, w1, s1, w2, s2.slice(1, 0, 100)), op, "gemm2_weights_scale");
  EXPECT_FI_ERROR(call(x, w1, s1, w2.to(DType::kBFloat16), s2), op, "gemm2_weights");
  EXPECT_FI_ERROR(call(x, w1, s1, w2, s2, 48), op, "intermediate_size");
  EXPECT_FI_ERROR((void)trtllm_mxint4_block_scale_routed_moe(
                      routing, x, w1, s1, std::nullopt, std::nullopt, std::nullopt, w2, s2, c.E,
                      c.K, std::nullopt, std::nullopt, 48, 0, c.E, std::nullopt, 0, false),
                  op, "intermediate_size");
  EXPECT_FI_ERROR((void)trtllm_mxint4_block_scale_moe(
                      lg, std::nullopt, x, w1, s1, std::nullopt, std::nullopt, std::nullopt, w2, s2,
                      c.E, c.K, std::nullopt, std::nullopt, c.I, 0, c.E, std::nullopt, 10),
                  "trtllm_mxint4_block_scale_moe", "routing_method_type");
}

// ---- declarations, backends, record/replay --------------------------------------------------

TEST(MoeFp4Decls, SignaturesBackendsAndRecordReplay) {
  for (const char* name :
       {"trtllm_fp4_block_scale_moe", "trtllm_fp4_block_scale_routed_moe",
        "trtllm_mxint4_block_scale_moe", "trtllm_mxint4_block_scale_routed_moe"}) {
    const OpDecl* d = OpRegistry::global().find(name);
    ASSERT_NE(d, nullptr) << name;
    EXPECT_EQ(d->module, "flashinfer.fused_moe.core");
    // CPU only: replay --device cuda falls back to the CPU.
    EXPECT_EQ(op_backends(name), std::vector<std::string>{"cpu"}) << name;
  }
  Fp4Case c;
  c.make(91);
  MxInt4Case m;
  m.make(92);
  // Inputs first: preparing them calls library ops, which the recorder would also record.
  Fp4Case one = c;
  one.T = 1;
  one.x.resize(static_cast<size_t>(one.H / 2));
  one.xs.resize(static_cast<size_t>(one.H / 16));
  const Tensor packed =
      Tensor::from_vector({static_cast<double>((1 << 16) | float_to_bfloat16_bits(0.75f)),
                           static_cast<double>((6 << 16) | float_to_bfloat16_bits(0.25f))},
                          {1, 2}, DType::kInt32);
  const Tensor x = c.hidden(), w1 = c.gemm1(), s1 = c.scale1(), w2 = c.gemm2(), s2 = c.scale2();
  const std::optional<Tensor> xs = c.hidden_scale(), ox = one.hidden_scale();
  const Tensor x1 = one.hidden(), lg = rand_tensor({c.T, c.E}, DType::kBFloat16, 3);
  const std::optional<Tensor> o1 = c.f32(c.o1, {8}), o1g = c.f32(c.o1g, {8}), o2 = c.f32(c.o2, {8});
  const Tensor mx = m.hidden(), mw1 = m.gemm1(128), mw1m = m.gemm1(0), ms1 = m.scale1(),
               mw2 = m.gemm2(32), mw2m = m.gemm2(0), ms2 = m.scale2(),
               mlg = rand_tensor({m.T, m.E}, DType::kFloat32, 4);
  const MoeTopkIds rc = pair_routing(c.T, c.E, c.K), rm = pair_routing(m.T, m.E, m.K);
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    auto routed = [&](const MoeTopkIds& r, const Tensor& h, const std::optional<Tensor>& hs) {
      (void)trtllm_fp4_block_scale_routed_moe(r, std::nullopt, h, hs, w1, s1, std::nullopt,
                                              std::nullopt, std::nullopt, std::nullopt, w2, s2,
                                              std::nullopt, o1, o1g, o2, c.E, c.K, std::nullopt,
                                              std::nullopt, c.I, 0, c.E, std::nullopt);
    };
    routed(rc, x, xs);
    routed(MoeTopkIds(packed), x1, ox);
    (void)trtllm_fp4_block_scale_moe(lg, std::nullopt, x, xs, w1, s1, std::nullopt, std::nullopt,
                                     std::nullopt, std::nullopt, w2, s2, std::nullopt, o1, o1g, o2,
                                     c.E, c.K, std::nullopt, std::nullopt, c.I, 0, c.E,
                                     std::nullopt, 1);
    (void)trtllm_mxint4_block_scale_moe(mlg, std::nullopt, mx, mw1, ms1, std::nullopt, std::nullopt,
                                        std::nullopt, mw2, ms2, m.E, m.K, std::nullopt,
                                        std::nullopt, m.I, 0, m.E, std::nullopt, 4);
    (void)trtllm_mxint4_block_scale_routed_moe(rm, mx, mw1m, ms1, std::nullopt, std::nullopt,
                                               std::nullopt, mw2m, ms2, m.E, m.K, std::nullopt,
                                               std::nullopt, m.I, 0, m.E, std::nullopt);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 5u);
  for (const auto& call : calls) {
    SCOPED_TRACE(call.name);
    EXPECT_TRUE(replays_identically(call));
  }
}

// ---- cute_dsl_fused_moe_nvfp4 ------------------------------------------------------------------

// Upstream's CuTe-DSL test preparation (create_moe_tensors): gated GEMM1 rows interleaved
// linear / gate in groups of 64 (interleave_linear_and_gate), scales 128x4-swizzled per expert.
std::vector<int64_t> cute_stored_rows(int64_t n1, bool gated) {
  std::vector<int64_t> src(static_cast<size_t>(n1));  // stored row s holds plain row src[s]
  const int64_t I = n1 / 2;
  for (int64_t s = 0; s < n1; ++s) {
    // interleave_linear_and_gate: view (2, n1 / 128, 64) -> transpose -> (n1 / 128, 2, 64)
    src[static_cast<size_t>(s)] = gated ? ((s % 128) / 64) * I + (s / 128) * 64 + s % 64 : s;
  }
  return src;
}

struct CuteCase {
  int64_t T = 5, E = 8, K = 2, H = 128, I = 64, act = 3, offset = 0, local = 8;
  bool six_d = false;
  double gs = 0.5, sw_alpha = 1.0, sw_beta = 0.0, sw_limit = 3.4028234663852886e38;
  std::vector<uint8_t> x, xs, w1, s1, w2, s2;  // plain rows; linear scales
  std::vector<double> a1, a2;
  Tensor s1_base, s2_base;  // the swizzled buffers the 6-D views look into
  int64_t n1() const { return act == 3 ? 2 * I : I; }
  void make(uint64_t seed) {
    x = random_bytes(static_cast<size_t>(T * H / 2), seed);
    xs = e4m3_codes(static_cast<size_t>(T * H / 16), seed + 1, 0.5, 1.0);
    w1 = random_bytes(static_cast<size_t>(local * n1() * H / 2), seed + 2);
    w2 = random_bytes(static_cast<size_t>(local * H * I / 2), seed + 3);
    s1 = e4m3_codes(static_cast<size_t>(local * n1() * H / 16), seed + 4, 0.02, 0.06);
    s2 = e4m3_codes(static_cast<size_t>(local * H * I / 16), seed + 5, 0.02, 0.06);
    Rng r{seed + 6};
    for (int64_t e = 0; e < local; ++e) {
      a1.push_back(static_cast<float>(r.uniform(0.75, 1.25)));
      a2.push_back(static_cast<float>(r.uniform(0.75, 1.25)));
    }
  }
  Tensor stored_w1() const {
    const auto src = cute_stored_rows(n1(), act == 3);
    std::vector<uint8_t> out(w1.size());
    const int64_t rb = H / 2;
    for (int64_t e = 0; e < local; ++e) {
      for (int64_t s = 0; s < n1(); ++s) {
        std::memcpy(&out[static_cast<size_t>((e * n1() + s) * rb)],
                    &w1[static_cast<size_t>((e * n1() + src[s]) * rb)], static_cast<size_t>(rb));
      }
    }
    return bytes_tensor(out, {local, n1(), H / 2}, DType::kUInt8);
  }
  // Swizzled scales of `plain` [local, m, cols] with rows in stored order: 1-D, or the 6-D view
  // of convert_sf_to_mma_layout over `base`.
  Tensor scales(const std::vector<uint8_t>& plain, int64_t m, int64_t cols, bool gated,
                Tensor& base) const {
    const auto src = cute_stored_rows(m, gated);
    std::vector<uint8_t> rows(plain.size());
    for (int64_t e = 0; e < local; ++e) {
      for (int64_t s = 0; s < m; ++s) {
        std::memcpy(&rows[static_cast<size_t>((e * m + s) * cols)],
                    &plain[static_cast<size_t>((e * m + src[s]) * cols)],
                    static_cast<size_t>(cols));
      }
    }
    base = block_scale_interleave(bytes_tensor(rows, {local, m, cols}, DType::kUInt8));
    if (!six_d) return base;
    const int64_t mt = (m + 127) / 128, kt = (cols + 3) / 4;
    return Tensor::from_blob(base.data_ptr(), {32, 4, mt, 4, kt, local},
                             {16, 4, kt * 512, 1, 512, mt * kt * 512}, DType::kUInt8,
                             Device::cpu());
  }
  std::vector<Tensor> inputs() {
    return {bytes_tensor(x, {T, H / 2}, DType::kUInt8),
            bytes_tensor(xs, {T, H / 16, 1}, DType::kUInt8),
            stored_w1(),
            scales(s1, n1(), H / 16, act == 3, s1_base),
            Tensor::from_vector(a1, {local}, DType::kFloat32),
            Tensor::from_vector({gs}, {1}, DType::kFloat32),
            bytes_tensor(w2, {local, H, I / 2}, DType::kUInt8),
            scales(s2, H, I / 16, false, s2_base),
            Tensor::from_vector(a2, {local}, DType::kFloat32)};
  }
  Tensor run(const MoeTopkIds& r, DType out_dtype = DType::kBFloat16) {
    const auto in = inputs();
    return cute_dsl_fused_moe_nvfp4(in[0], in[1], r.ids, *r.weights, in[2], in[3], in[4], in[5],
                                    in[6], in[7], in[8], E, K, local, offset, out_dtype, true,
                                    std::nullopt, std::nullopt, true, act, sw_alpha, sw_beta,
                                    sw_limit);
  }
  std::vector<double> expected(const MoeTopkIds& r) const {
    const auto idv = r.ids.to_double_vector(), wv = r.weights->to_double_vector();
    const int64_t N1 = n1();
    std::vector<double> out(static_cast<size_t>(T * H), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = static_cast<int64_t>(idv[static_cast<size_t>(t * K + k)]) - offset;
        if (e < 0 || e >= local) continue;
        std::vector<double> g(static_cast<size_t>(N1), 0.0);
        for (int64_t j = 0; j < N1; ++j) {
          for (int64_t d = 0; d < H; ++d) {
            const size_t wi = static_cast<size_t>((e * N1 + j) * H + d);
            g[j] += e2m1(x, static_cast<size_t>(t * H + d)) *
                    e4m3fn_bits_to_float(xs[static_cast<size_t>(t * (H / 16) + d / 16)]) *
                    e2m1(w1, wi) * e4m3fn_bits_to_float(s1[wi / 16]);
          }
          g[j] *= a1[e];
        }
        std::vector<double> h(static_cast<size_t>(I));
        for (int64_t j = 0; j < I; ++j) {
          if (act == 3) {
            const double gate = std::min(g[I + j], sw_limit);
            const double lin = std::clamp(g[j], -sw_limit, sw_limit);
            h[j] = gate / (1.0 + std::exp(-sw_alpha * gate)) * (lin + sw_beta);
          } else {
            h[j] = std::max(g[j], 0.0) * std::max(g[j], 0.0);
          }
        }
        // The GEMM1 epilogue (blockscaled_contiguous_gather_grouped_gemm_act_fusion upstream)
        // quantizes the fp32 activation: sf = e4m3(amax * gs / 6), q = e2m1(v * gs / sf); GEMM2
        // reads q * sf, the global scale left in the values, and applies w2_alpha as given.
        const float gsf = static_cast<float>(gs);
        for (int64_t b = 0; b < I; b += 16) {
          float amax = 0.0f;
          for (int64_t j = b; j < b + 16; ++j) amax = std::max(amax, std::fabs(float(h[j])));
          const float sf =
              e4m3fn_bits_to_float(float_to_e4m3fn_bits(std::min(amax * gsf / 6.0f, 448.0f)));
          const float d = std::max(sf / gsf, 1e-30f);
          for (int64_t j = b; j < b + 16; ++j) h[j] = e2m1_grid(float(h[j]) / d) * sf;
        }
        for (int64_t d = 0; d < H; ++d) {
          double y = 0.0;
          for (int64_t j = 0; j < I; ++j) {
            const size_t wi = static_cast<size_t>((e * H + d) * I + j);
            y += h[j] * e2m1(w2, wi) * e4m3fn_bits_to_float(s2[wi / 16]);
          }
          out[static_cast<size_t>(t * H + d)] += wv[static_cast<size_t>(t * K + k)] * a2[e] * y;
        }
      }
    }
    return out;
  }
};

TEST(CuteDslFusedMoeNvfp4, MatchesFormula) {
  struct Variant {
    const char* name;
    int64_t act, offset, local;
    bool quant, six;
    double alpha, beta, limit;
  };
  for (const Variant& v :
       {Variant{"swiglu", 3, 0, 8, true, false, 1.0, 0.0, 3.4e38},
        Variant{"swiglu 6-D scales, EP", 3, 4, 4, true, true, 1.0, 0.0, 3.4e38},
        Variant{"swiglu params, fc2 scale 2", 3, 0, 8, false, false, 1.702, 1.0, 2.0},
        Variant{"relu2", 6, 0, 8, true, true, 1.0, 0.0, 3.4e38}}) {
    SCOPED_TRACE(v.name);
    CuteCase c;
    c.act = v.act;
    c.offset = v.offset;
    c.local = v.local;
    if (!v.quant) c.gs = 2.0;
    c.six_d = v.six;
    c.sw_alpha = v.alpha;
    c.sw_beta = v.beta;
    c.sw_limit = v.limit;
    c.make(101);
    const MoeTopkIds r = pair_routing(c.T, c.E, c.K);
    const auto expect = c.expected(r);
    EXPECT_GT(max_abs(expect), 0.5);
    const Tensor out = c.run(r);
    EXPECT_EQ(out.dtype(), DType::kBFloat16);
    EXPECT_TRUE(all_close(out, expect, default_tolerance(DType::kBFloat16)));
  }
  CuteCase c;
  c.I = 128;  // two 128-row interleave groups
  c.make(102);
  const MoeTopkIds r = pair_routing(c.T, c.E, c.K);
  EXPECT_TRUE(all_close(c.run(r, DType::kFloat32), c.expected(r), {1e-4, 1e-4}));
}

TEST(CuteDslFusedMoeNvfp4, BadInputAndRecordReplay) {
  const char* op = "cute_dsl_fused_moe_nvfp4";
  CuteCase c;
  c.make(111);
  const MoeTopkIds r = pair_routing(c.T, c.E, c.K);
  const auto in = c.inputs();
  auto call = [&](int idx, const Tensor& bad, int64_t act = 3, std::string_view quant_mode = "w4a4",
                  std::optional<double> situ = std::nullopt) {
    auto a = in;
    if (idx >= 0) a[static_cast<size_t>(idx)] = bad;
    (void)cute_dsl_fused_moe_nvfp4(a[0], a[1], r.ids, *r.weights, a[2], a[3], a[4], a[5], a[6],
                                   a[7], a[8], c.E, c.K, std::nullopt, 0, DType::kBFloat16, true,
                                   std::nullopt, std::nullopt, true, act, 1.0, 0.0, 3.4e38, situ,
                                   std::nullopt, quant_mode);
  };
  EXPECT_FI_ERROR(call(0, Tensor::zeros({c.T, c.H}, DType::kBFloat16)), op, "x");
  EXPECT_FI_ERROR(call(1, Tensor::zeros({c.T, 3}, DType::kUInt8)), op, "x_sf");
  EXPECT_FI_ERROR(call(2, Tensor::zeros({8, 100, 64}, DType::kUInt8)), op, "w1_weight");
  EXPECT_FI_ERROR(call(3, Tensor::zeros({100}, DType::kUInt8)), op, "w1_weight_sf");
  EXPECT_FI_ERROR(call(4, Tensor::zeros({3}, DType::kFloat32)), op, "w1_alpha");
  EXPECT_FI_ERROR(call(5, Tensor::zeros({3}, DType::kFloat32)), op, "fc2_input_scale");
  // w4a4's GEMM1 quantizes its output to NVFP4: upstream requires the global scale.
  EXPECT_FI_ERROR(
      (void)cute_dsl_fused_moe_nvfp4(in[0], in[1], r.ids, *r.weights, in[2], in[3], in[4],
                                     std::nullopt, in[6], in[7], in[8], c.E, c.K),
      op, "fc2_input_scale");
  EXPECT_FI_ERROR(call(6, Tensor::zeros({8, 128, 16}, DType::kUInt8)), op, "w2_weight");
  EXPECT_FI_ERROR(call(7, Tensor::zeros({100}, DType::kUInt8)), op, "w2_weight_sf");
  EXPECT_FI_ERROR(call(8, Tensor::zeros({8}, DType::kBFloat16)), op, "w2_alpha");
  EXPECT_FI_ERROR(call(-1, Tensor(), 4), op, "activation_type");
  // w4a8 runs on MXFP8 x (tests/ops/test_moe_cute_w4a8.cpp): packed NVFP4 bytes are the wrong x.
  EXPECT_FI_ERROR(call(-1, Tensor(), 3, "w4a8"), op, "x");
  EXPECT_FI_ERROR(call(-1, Tensor(), 3, "w4a9"), op, "quant_mode");
  // SiTU runs with and without the linear beta (CuteDslMoEWrapper.SituMatchesFormula,
  // .SituWithoutLinearBetaMatchesFormula); situ_beta needs Swiglu.
  EXPECT_FI_ERROR(call(-1, Tensor(), 6, "w4a4", 4.0), op, "situ_beta");
  EXPECT_FI_ERROR(
      (void)cute_dsl_fused_moe_nvfp4(in[0], in[1], r.ids.to(DType::kInt64), *r.weights, in[2],
                                     in[3], in[4], in[5], in[6], in[7], in[8], c.E, c.K),
      op, "token_selected_experts");
  EXPECT_EQ(op_backends(op), std::vector<std::string>{"cpu"});
  const OpDecl* d = OpRegistry::global().find(op);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->module, "flashinfer.fused_moe.cute_dsl.fused_moe");
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    (void)cute_dsl_fused_moe_nvfp4(in[0], in[1], r.ids, *r.weights, in[2], in[3], in[4], in[5],
                                   in[6], in[7], in[8], c.E, c.K);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 1u);
  ASSERT_TRUE(calls[0].error.empty()) << calls[0].error;
  EXPECT_TRUE(replays_identically(calls[0]));
}

// ---- dumps in upstream's format -----------------------------------------------------------

// Dumps written by Python (torch 1.13) as upstream's recorder writes them: torch .pt files, fp8
// tensors as torch >= 2.1 pickles float8_e4m3fn (written by hand, as in test_moe_quant.cpp),
// packed fp4 as uint8, every argument by keyword as the engines pass it, the list result as
// result__0. Weights, scales and biases prepared by upstream's procedure (FP4Moe /
// MxInt4BlockScaleMoe in tests/moe, vLLM's gpt-oss preparation for the biases); expected
// outputs computed by torch in fp32 as upstream's reference does. Calls: NVFP4 with DeepSeekV3
// routing; MXFP4 x bf16 with biases and SwiGLU alpha/beta/limit (gpt-oss); the NVFP4 routed
// form with packed ids; MxInt4 with Kimi-style DeepSeekV3 routing (BlockMajorK weights) and its
// routed form (MajorK); cute_dsl_fused_moe_nvfp4 on upstream's CuTe-DSL layouts. Every call
// replays here and passes.
TEST(MoeFp4UpstreamDumps, EngineStyleDumpsReplay) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_moe_fp4_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // save(): the shared torch.save writer (tests/util/upstream_dump_py.h).
  const std::string py = std::string(flashinfer::testing::kTorchSavePy) + R"PY(
import json, os, sys, zipfile, struct
try:
    import torch
except ImportError:
    sys.exit(77)
import torch.nn.functional as F


d = sys.argv[1]
seq = [0]
def record(name, inputs, meta, out, key="result__0", module="flashinfer.fused_moe.core"):
    seq[0] += 1
    call = "%s/20261122_200000_%03d_pid4242_%s_call%04d" % (d, seq[0], name, seq[0])
    os.makedirs(call)
    save(inputs, call + "/inputs.pt")
    save({key: out}, call + "/outputs.pt")
    rec = {"function_name": name, "module": module,
           "call_sequence": seq[0], "timestamp": "20261122_200000_%03d" % seq[0],
           "process_id": 4242, "input_metadata": meta, "output_metadata": {},
           "tensor_info": {"input_tensor_keys": list(inputs), "output_tensor_keys": [key]},
           "tensor_format": "torch", "execution_status": "completed"}
    with open(call + "/metadata.jsonl", "w") as f:
        f.write(json.dumps(rec) + "\n")

def e4m3_value(c):
    s = -1.0 if c & 0x80 else 1.0
    e, m = (c >> 3) & 0xF, c & 7
    if e == 0xF and m == 7: return float("nan")
    return s * (m / 8.0 * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7))
E4M3 = torch.tensor([e4m3_value(c) for c in range(256)])
POS = torch.tensor([c for c in range(127)])  # finite non-negative codes 0..126
def e4m3_codes(x):  # nearest non-negative code (x >= 0), ties to even, saturating at 448
    dist = (x.double().reshape(-1, 1) - E4M3[POS].double().reshape(1, -1)).abs()
    idx = (dist + (POS % 2).double().reshape(1, -1) * 1e-12).argmin(1)
    return POS[idx].reshape(x.shape)
E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
def e2m1_codes(x):  # round to nearest, ties to the even code, saturating at 6
    a = x.abs().clamp(max=6).double().reshape(-1, 1)
    dist = (a - E2M1[:8].double().reshape(1, -1)).abs() + (torch.arange(8) % 2).double() * 1e-12
    c = dist.argmin(1).reshape(x.shape)
    return c + 8 * (x < 0).long()
def pack(codes):  # element 2j in the low nibble
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)

MAP32 = [0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27,
         4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31]
def shuffle_idx(m):  # get_shuffle_matrix_a_row_indices, epilogue_tile_m 128
    idx = torch.empty(m, dtype=torch.long)
    for old in range(m):
        idx[old // 32 * 32 + MAP32[old % 32]] = old
    return idx
def interleave_idx(m):  # get_reorder_rows_for_gated_act_gemm_row_indices
    r = torch.arange(m)
    p = torch.empty_like(r)
    p[0::2] = r[: (m + 1) // 2]
    p[1::2] = r[(m + 1) // 2:]
    return p
def interleave_128x4(s):  # block_scale_interleave of one [M, C] matrix: 1-D, zero padding
    M, C = s.shape
    Mp, Cp = (M + 127) // 128 * 128, (C + 3) // 4 * 4
    p = torch.zeros(Mp, Cp, dtype=s.dtype)
    p[:M, :C] = s
    return p.view(Mp // 128, 4, 32, Cp // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)
def block_layout(u8):  # convert_to_block_layout(x, 128) on bytes
    m, k = u8.shape
    return u8.view(m, k // 128, 128).permute(1, 0, 2).contiguous()
def bf(x): return x.bfloat16().float()

torch.manual_seed(0)
# 1. trtllm_fp4_block_scale_moe, NVFP4 (SGLang / vLLM ModelOpt NVFP4): DeepSeekV3 routing.
T, E, H, I, K = 4, 8, 128, 64, 2
p1, p2 = interleave_idx(2 * I)[shuffle_idx(2 * I)], shuffle_idx(H)
xq = torch.randint(0, 16, (T, H))
xs = e4m3_codes(torch.rand(T, H // 16) * 0.5 + 0.5)
w1q = torch.randint(0, 16, (E, 2 * I, H))
w2q = torch.randint(0, 16, (E, H, I))
s1 = e4m3_codes(torch.rand(E, 2 * I, H // 16) * 0.04 + 0.02)
s2 = e4m3_codes(torch.rand(E, H, I // 16) * 0.04 + 0.02)
o1, og, o2 = torch.rand(E) + 0.5, torch.rand(E) + 0.5, torch.rand(E) + 0.5
w1k = torch.stack([pack(w1q[e])[p1] for e in range(E)])
w2k = torch.stack([pack(w2q[e])[p2] for e in range(E)])
s1k = torch.stack([interleave_128x4(s1[e][p1].to(torch.uint8)) for e in range(E)]).view(E, 2 * I, H // 16)
s2k = torch.stack([interleave_128x4(s2[e][p2].to(torch.uint8)) for e in range(E)]).view(E, H, I // 16)
xd = E2M1[xq] * E4M3[xs].repeat_interleave(16, 1)
w1d = E2M1[w1q] * E4M3[s1].repeat_interleave(16, 2)
w2d = E2M1[w2q] * E4M3[s2].repeat_interleave(16, 2)
def nvfp4_ffn(t, e):
    g = xd[t] @ w1d[e].T
    h = bf(F.silu(g[I:] * og[e]) * (g[:I] * o1[e]))
    blocks = h.view(-1, 16)
    sf = E4M3[e4m3_codes(blocks.abs().amax(1) / 6)]
    q = torch.where(sf[:, None] > 0, E2M1[e2m1_codes(blocks / sf[:, None])] * sf[:, None],
                    torch.zeros_like(blocks)).view(-1)
    return bf(q @ w2d[e].T * o2[e])
logits = torch.randn(T, E)
rbias = (torch.randn(E) * 0.1).to(torch.bfloat16)
s = torch.sigmoid(logits)
sb = s + rbias.float()
gs = sb.view(T, 4, 2).topk(2, dim=-1)[0].sum(-1)
gmask = torch.zeros(T, 4).scatter_(1, gs.topk(2, dim=-1)[1], 1)
ti = (sb * gmask.repeat_interleave(2, dim=1)).topk(K, dim=-1)[1]
sel = s.gather(1, ti)
wts = bf(sel / (sel.sum(-1, keepdim=True) + 1e-20) * 2.5)
out = torch.zeros(T, H)
for t in range(T):
    for k in range(K):
        out[t] += wts[t, k] * nvfp4_ffn(t, int(ti[t, k]))
nv_inputs = {"kwarg_hidden_states": pack(xq), "kwarg_hidden_states_scale": ("fp8", xs.to(torch.uint8)),
             "kwarg_gemm1_weights": w1k, "kwarg_gemm1_weights_scale": ("fp8", s1k),
             "kwarg_gemm2_weights": w2k, "kwarg_gemm2_weights_scale": ("fp8", s2k),
             "kwarg_output1_scale_scalar": o1, "kwarg_output1_scale_gate_scalar": og,
             "kwarg_output2_scale_scalar": o2}
nv_meta = {"kwarg_gemm1_bias": None, "kwarg_gemm1_alpha": None, "kwarg_gemm1_beta": None,
           "kwarg_gemm1_clamp_limit": None, "kwarg_gemm2_bias": None, "kwarg_num_experts": E,
           "kwarg_top_k": K, "kwarg_intermediate_size": I, "kwarg_local_expert_offset": 0,
           "kwarg_local_num_experts": E, "kwarg_do_finalize": True, "kwarg_enable_pdl": None,
           "kwarg_activation_type": 3, "kwarg_tune_max_num_tokens": 8192}
record("trtllm_fp4_block_scale_moe",
       dict(nv_inputs, kwarg_routing_logits=logits, kwarg_routing_bias=rbias),
       dict(nv_meta, kwarg_n_group=4, kwarg_topk_group=2, kwarg_routed_scaling_factor=2.5,
            kwarg_routing_method_type=2, kwarg_output=None),
       out.bfloat16())

# 2. trtllm_fp4_block_scale_routed_moe, the same NVFP4 layer, packed (id << 16 | bf16 weight).
ids = torch.tensor([[1, 6], [0, 3], [7, 2], [5, 4]], dtype=torch.int32)
rw = torch.tensor([[0.75, 0.25], [0.5, 0.5], [0.625, 0.375], [0.875, 0.125]])
packed = (ids << 16) | rw.bfloat16().view(torch.int16).to(torch.int32)
out = torch.zeros(T, H)
for t in range(T):
    for k in range(K):
        out[t] += rw[t, k] * nvfp4_ffn(t, int(ids[t, k]))
record("trtllm_fp4_block_scale_routed_moe", dict(nv_inputs, kwarg_topk_ids=packed),
       dict(nv_meta, kwarg_routing_bias=None, kwarg_n_group=None, kwarg_topk_group=None,
            kwarg_routed_scaling_factor=None, kwarg_routing_method_type=1),
       out.bfloat16())

# 3. trtllm_fp4_block_scale_moe, MXFP4 weights x bf16 hidden states (gpt-oss): biases stored in
# their rows' prepared order, SwiGLU alpha / beta / clamp limit, Renormalize of bf16 logits.
T, E, H, I, K = 4, 8, 128, 128, 2
p1, p2 = interleave_idx(2 * I)[shuffle_idx(2 * I)], shuffle_idx(H)
x = torch.randn(T, H).bfloat16()
w1q = torch.randint(0, 16, (E, 2 * I, H))
w2q = torch.randint(0, 16, (E, H, I))
s1 = torch.randint(122, 126, (E, 2 * I, H // 32))
s2 = torch.randint(122, 126, (E, H, I // 32))
b1, b2 = torch.randn(E, 2 * I) * 0.1, torch.randn(E, H) * 0.1
alpha, beta, lim = torch.full((E,), 1.702), torch.full((E,), 1.0), torch.full((E,), 7.0)
w1d = E2M1[w1q] * torch.pow(2.0, s1.float() - 127).repeat_interleave(32, 2)
w2d = E2M1[w2q] * torch.pow(2.0, s2.float() - 127).repeat_interleave(32, 2)
logits = torch.randn(T, E).bfloat16()
tv, ti = torch.topk(logits.float(), K, dim=-1)
wts = bf(torch.softmax(tv, -1))
out = torch.zeros(T, H)
for t in range(T):
    for k in range(K):
        e = int(ti[t, k])
        g = x[t].float() @ w1d[e].T
        up, gate = g[:I] + b1[e, :I], g[I:] + b1[e, I:]
        gl = gate.clamp(max=lim[e])
        ul = up.clamp(-lim[e], lim[e]) + beta[e]
        h = bf(gl * torch.sigmoid(alpha[e] * gl) * ul)
        out[t] += wts[t, k] * bf(h @ w2d[e].T + b2[e])
record("trtllm_fp4_block_scale_moe",
       {"kwarg_routing_logits": logits, "kwarg_hidden_states": x,
        "kwarg_gemm1_weights": torch.stack([pack(w1q[e])[p1] for e in range(E)]),
        "kwarg_gemm1_weights_scale": ("fp8", torch.stack([interleave_128x4(s1[e][p1].to(torch.uint8)) for e in range(E)]).view(E, 2 * I, H // 32)),
        "kwarg_gemm1_bias": torch.stack([b1[e][p1] for e in range(E)]),
        "kwarg_gemm1_alpha": alpha, "kwarg_gemm1_beta": beta, "kwarg_gemm1_clamp_limit": lim,
        "kwarg_gemm2_weights": torch.stack([pack(w2q[e])[p2] for e in range(E)]),
        "kwarg_gemm2_weights_scale": ("fp8", torch.stack([interleave_128x4(s2[e][p2].to(torch.uint8)) for e in range(E)]).view(E, H, I // 32)),
        "kwarg_gemm2_bias": torch.stack([b2[e][p2] for e in range(E)])},
       {"kwarg_routing_bias": None, "kwarg_hidden_states_scale": None,
        "kwarg_output1_scale_scalar": None, "kwarg_output1_scale_gate_scalar": None,
        "kwarg_output2_scale_scalar": None, "kwarg_num_experts": E, "kwarg_top_k": K,
        "kwarg_n_group": None, "kwarg_topk_group": None, "kwarg_intermediate_size": I,
        "kwarg_local_expert_offset": 0, "kwarg_local_num_experts": E,
        "kwarg_routed_scaling_factor": None, "kwarg_routing_method_type": 1,
        "kwarg_do_finalize": True, "kwarg_tune_max_num_tokens": 8192},
       out.bfloat16())

# 4. trtllm_mxint4_block_scale_moe (Kimi-style DeepSeekV3 routing, one group), weights
# prepared as MxInt4BlockScaleMoe does (interleave + shuffle, BlockMajorK of 128 bytes), bf16
# scales shuffled, 128x4-interleaved and stacked [E, padded].
T, E, H, I, K = 4, 8, 256, 256, 2
p1, p2 = interleave_idx(2 * I)[shuffle_idx(2 * I)], shuffle_idx(H)
x = torch.randn(T, H).bfloat16()
w1q = torch.randint(0, 16, (E, 2 * I, H))
w2q = torch.randint(0, 16, (E, H, I))
s1 = (torch.rand(E, 2 * I, H // 32) * 0.01 + 0.005).bfloat16()
s2 = (torch.rand(E, H, I // 32) * 0.01 + 0.005).bfloat16()
INT4 = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1]).float()
w1d = INT4[w1q] * s1.float().repeat_interleave(32, 2)
w2d = INT4[w2q] * s2.float().repeat_interleave(32, 2)
w1k = torch.stack([block_layout(pack(w1q[e])[p1]) for e in range(E)])
w2k = torch.stack([block_layout(pack(w2q[e])[p2]) for e in range(E)])
s1k = torch.stack([interleave_128x4(s1[e][p1]) for e in range(E)])
s2k = torch.stack([interleave_128x4(s2[e][p2]) for e in range(E)])
def int4_ffn(t, e):
    g = x[t].float() @ w1d[e].T
    h = bf(F.silu(g[I:]) * g[:I])
    return bf(h @ w2d[e].T)
logits = torch.randn(T, E)
rbias = (torch.randn(E) * 0.1).bfloat16()
s = torch.sigmoid(logits)
ti = (s + rbias.float()).topk(K, dim=-1)[1]
sel = s.gather(1, ti)
wts = bf(sel / (sel.sum(-1, keepdim=True) + 1e-20) * 2.5)
out = torch.zeros(T, H)
for t in range(T):
    for k in range(K):
        out[t] += wts[t, k] * int4_ffn(t, int(ti[t, k]))
record("trtllm_mxint4_block_scale_moe",
       {"kwarg_routing_logits": logits, "kwarg_routing_bias": rbias, "kwarg_hidden_states": x,
        "kwarg_gemm1_weights": w1k, "kwarg_gemm1_weights_scale": s1k,
        "kwarg_gemm2_weights": w2k, "kwarg_gemm2_weights_scale": s2k},
       {"kwarg_gemm1_alpha": None, "kwarg_gemm1_beta": None, "kwarg_gemm1_clamp_limit": None,
        "kwarg_num_experts": E, "kwarg_top_k": K, "kwarg_n_group": 1, "kwarg_topk_group": 1,
        "kwarg_intermediate_size": I, "kwarg_local_expert_offset": 0,
        "kwarg_local_num_experts": E, "kwarg_routed_scaling_factor": 2.5,
        "kwarg_routing_method_type": 2, "kwarg_enable_pdl": None, "kwarg_output": None,
        "kwarg_tune_max_num_tokens": 8192},
       out.bfloat16())

# 5. trtllm_mxint4_block_scale_routed_moe, MajorK weights, packed ids.
ids = torch.tensor([[2, 5], [7, 0], [1, 3], [6, 4]], dtype=torch.int32)
rw = torch.tensor([[0.75, 0.25], [0.5, 0.5], [0.625, 0.375], [0.875, 0.125]])
packed = (ids << 16) | rw.bfloat16().view(torch.int16).to(torch.int32)
out = torch.zeros(T, H)
for t in range(T):
    for k in range(K):
        out[t] += rw[t, k] * int4_ffn(t, int(ids[t, k]))
record("trtllm_mxint4_block_scale_routed_moe",
       {"kwarg_topk_ids": packed, "kwarg_hidden_states": x,
        "kwarg_gemm1_weights": torch.stack([pack(w1q[e])[p1] for e in range(E)]),
        "kwarg_gemm1_weights_scale": s1k,
        "kwarg_gemm2_weights": torch.stack([pack(w2q[e])[p2] for e in range(E)]),
        "kwarg_gemm2_weights_scale": s2k},
       {"kwarg_gemm1_alpha": None, "kwarg_gemm1_beta": None, "kwarg_gemm1_clamp_limit": None,
        "kwarg_num_experts": E, "kwarg_top_k": K, "kwarg_n_group": None,
        "kwarg_topk_group": None, "kwarg_intermediate_size": I, "kwarg_local_expert_offset": 0,
        "kwarg_local_num_experts": E, "kwarg_routed_scaling_factor": None},
       out.bfloat16())
# 6. cute_dsl_fused_moe_nvfp4 (vLLM's CuTe-DSL NVFP4 path): precomputed routing, weights as
# upstream's create_moe_tensors prepares them (linear / gate rows interleaved in groups of 64,
# 128x4-swizzled scales through convert_sf_to_mma_layout's 6-D view), per-expert alphas,
# fc2_input_scale 0.5; returns a tensor ("result").
T, E, H, I, K = 4, 8, 128, 128, 2
lg = torch.arange(2 * I).view(2, 2 * I // 128, 64).transpose(0, 1).reshape(-1)
xq = torch.randint(0, 16, (T, H))
xs = e4m3_codes(torch.rand(T, H // 16) * 0.5 + 0.5)
w1q = torch.randint(0, 16, (E, 2 * I, H))
w2q = torch.randint(0, 16, (E, H, I))
s1 = e4m3_codes(torch.rand(E, 2 * I, H // 16) * 0.04 + 0.02)
s2 = e4m3_codes(torch.rand(E, H, I // 16) * 0.04 + 0.02)
a1, a2 = torch.linspace(0.75, 1.25, E), torch.linspace(1.25, 0.75, E)
gs = torch.tensor([0.5])
def mma_view(flat, m, cols):  # convert_sf_to_mma_layout
    return flat.view(E, (m + 127) // 128, (cols + 3) // 4, 32, 4, 4).permute(3, 4, 1, 5, 2, 0)
s1k = mma_view(torch.stack([interleave_128x4(s1[e][lg].to(torch.uint8)) for e in range(E)]), 2 * I, H // 16)
s2k = mma_view(torch.stack([interleave_128x4(s2[e].to(torch.uint8)) for e in range(E)]), H, I // 16)
xd = E2M1[xq] * E4M3[xs].repeat_interleave(16, 1)
w1d = E2M1[w1q] * E4M3[s1].repeat_interleave(16, 2)
w2d = E2M1[w2q] * E4M3[s2].repeat_interleave(16, 2)
ids = torch.tensor([[3, 0], [6, 1], [2, 7], [5, 4]], dtype=torch.int32)
rw = torch.tensor([[0.6, 0.4], [0.7, 0.3], [0.55, 0.45], [0.8, 0.2]])
out = torch.zeros(T, H)
for t in range(T):
    for k in range(K):
        e = int(ids[t, k])
        g = a1[e] * (xd[t] @ w1d[e].T)
        # The GEMM1 epilogue quantizes the fp32 activation; GEMM2 reads e2m1 * sf.
        h = (g[I:] * torch.sigmoid(g[I:]) * g[:I]).view(-1, 16)
        sf = E4M3[e4m3_codes((gs * h.abs().amax(1) / 6).clamp(max=448.0))]
        q = (E2M1[e2m1_codes(h / (sf / gs).clamp(min=1e-30)[:, None])] * sf[:, None]).view(-1)
        out[t] += rw[t, k] * a2[e] * (q @ w2d[e].T)
record("cute_dsl_fused_moe_nvfp4",
       {"kwarg_x": pack(xq), "kwarg_x_sf": xs.to(torch.uint8).unsqueeze(-1),
        "kwarg_token_selected_experts": ids, "kwarg_token_final_scales": rw,
        "kwarg_w1_weight": torch.stack([pack(w1q[e])[lg] for e in range(E)]),
        "kwarg_w1_weight_sf": s1k, "kwarg_w1_alpha": a1, "kwarg_fc2_input_scale": gs,
        "kwarg_w2_weight": torch.stack([pack(w2q[e]) for e in range(E)]),
        "kwarg_w2_weight_sf": s2k, "kwarg_w2_alpha": a2},
       {"kwarg_num_experts": E, "kwarg_top_k": K, "kwarg_num_local_experts": E,
        "kwarg_local_expert_offset": 0, "kwarg_use_fused_finalize": True,
        "kwarg_moe_output": None, "kwarg_aux_stream": None, "kwarg_enable_pdl": True,
        "kwarg_activation_type": 3},
       out.bfloat16(), key="result",
       module="flashinfer.fused_moe.cute_dsl.fused_moe")
)PY";
  std::vector<replay::Result> results;
  if (!run_dump_script(dir, py, dir, 6u, &results)) GTEST_SKIP() << "python3-torch not installed";
  for (const auto& r : results) {
    ASSERT_FALSE(r.comparisons.empty()) << r.function_name;
    EXPECT_EQ(r.comparisons[0].key,
              r.function_name == "cute_dsl_fused_moe_nvfp4" ? "result" : "result__0")
        << r.function_name;
  }
}

// num_fused_shared_experts (docs/MOE.md, "Fused shared experts"): NVFP4 with DeepSeekV3
// routing and one shared expert (weight rows 8, per-expert tensors of 9) against the fp64
// formula and the routed op fed fused_topk_deepseek's routing with slot (8, 1.0) appended.
TEST(TrtllmFp4BlockScaleMoe, FusedSharedExpertMatchesFormula) {
  Fp4Case c;
  c.local = 9;  // 8 routed experts, then the shared one
  c.make(91);
  const int64_t T = c.T, E = 8, K = 2;
  Tensor logits = rand_tensor({T, E}, DType::kFloat32, 92, -3.0, 3.0);
  Tensor bias = rand_tensor({E}, DType::kFloat32, 93, -0.3, 0.3);
  Tensor vals = Tensor::zeros({T, K}, DType::kFloat32), idx = Tensor::zeros({T, K}, DType::kInt32);
  fused_topk_deepseek(logits, bias, 4, 2, K, 2.5, vals, idx);
  // bf16 weights, as routing from logits keeps them (fp32 pairs would be taken as given).
  const MoeTopkIds routing = append_shared_slots(idx, vals.to(DType::kBFloat16), E, 1);
  Tensor replay = Tensor::zeros({T, K}, DType::kInt16);
  const auto out = trtllm_fp4_block_scale_moe(
      logits, bias, c.hidden(), c.hidden_scale(), c.gemm1(), c.scale1(), std::nullopt, std::nullopt,
      std::nullopt, std::nullopt, c.gemm2(), c.scale2(), std::nullopt, c.f32(c.o1, {9}),
      c.f32(c.o1g, {9}), c.f32(c.o2, {9}), E, K, 4, 2, c.I, 0, E, 2.5, 2, true, std::nullopt, 3,
      std::nullopt, std::nullopt, 8192, true, replay, 1);
  c.E = 9;
  c.K = 3;
  EXPECT_TRUE(all_close(out[0], c.expected(routing), default_tolerance(DType::kBFloat16)));
  EXPECT_TRUE(all_close(out[0], c.run_routed(routing)[0], {0, 0}));
  EXPECT_TRUE(all_close(replay.to(DType::kInt32), idx, {0, 0}));
  // Per-expert tensors need local_num_experts + 1 rows.
  EXPECT_FI_ERROR((void)trtllm_fp4_block_scale_moe(
                      logits, bias, c.hidden(), c.hidden_scale(), c.gemm1(), c.scale1(),
                      std::nullopt, std::nullopt, std::nullopt, std::nullopt, c.gemm2(), c.scale2(),
                      std::nullopt, c.f32(c.o1, {9}).value().slice(0, 0, 8), c.f32(c.o1g, {9}),
                      c.f32(c.o2, {9}), E, K, 4, 2, c.I, 0, E, 2.5, 2, true, std::nullopt, 3,
                      std::nullopt, std::nullopt, 8192, true, std::nullopt, 1),
                  "trtllm_fp4_block_scale_moe", "output1_scale_scalar");
  // do_finalize=False: the list spans every slot, shared included (upstream's FP4 op allocates
  // bf16 topk_weights [T, top_k + S], whatever the logits' dtype, and the launcher sizes the
  // permutation by top_k + S [wheel 0.7.2.post1: flashinfer/fused_moe/core.py:3510, :3534]).
  const auto u = trtllm_fp4_block_scale_moe(
      logits, bias, c.hidden(), c.hidden_scale(), c.gemm1(), c.scale1(), std::nullopt, std::nullopt,
      std::nullopt, std::nullopt, c.gemm2(), c.scale2(), std::nullopt, c.f32(c.o1, {9}),
      c.f32(c.o1g, {9}), c.f32(c.o2, {9}), E, K, 4, 2, c.I, 0, E, 2.5, 2, false, std::nullopt, 3,
      std::nullopt, std::nullopt, 8192, true, std::nullopt, 1);
  expect_unfinalized_list(u, routing, out[0], T, K + 1, c.H);
}

}  // namespace
}  // namespace flashinfer::testing
