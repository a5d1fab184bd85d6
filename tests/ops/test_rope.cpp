// RoPE ops: hand-checked golden values, an fp64 reference (plain, Llama 3.1 with HF's
// wavelength rule, cos/sin cache) over dtypes, layouts, partial rotary dims and strided q/k,
// ragged vs pos_ids equivalence, in-place variants, every bad input, record/replay, and CUDA vs
// the CPU reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/rope_rules.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

const std::vector<DType> kDTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

// ---- fp64 reference --------------------------------------------------------------------------

using FreqFn = std::function<double(int64_t i, int64_t rotary_dim)>;

FreqFn plain_freq(double scale, double theta) {
  return [=](int64_t i, int64_t r) { return std::pow(theta, -2.0 * i / r) / scale; };
}

// HF transformers' Llama 3.1 rule, written over wavelengths (independently of the kernel's
// clamp formulation).
FreqFn llama31_freq(double scale, double theta, double lf, double hf, double old_len) {
  return [=](int64_t i, int64_t r) {
    const double f = std::pow(theta, -2.0 * i / r);
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen < old_len / hf) return f;
    if (wavelen > old_len / lf) return f / scale;
    const double smooth = (old_len / wavelen - lf) / (hf - lf);
    return (1 - smooth) * f / scale + smooth * f;
  };
}

// cos/sin of pair i at position pos.
using CosSinFn = std::function<std::pair<double, double>(int64_t pos, int64_t i)>;

CosSinFn from_freq(FreqFn f, int64_t rotary_dim) {
  return [=](int64_t pos, int64_t i) {
    const double a = pos * f(i, rotary_dim);
    return std::make_pair(std::cos(a), std::sin(a));
  };
}

// x [nnz, H, D] (any strides) rotated per token; logical row-major order.
std::vector<double> ref_rope(const Tensor& x, const std::vector<int64_t>& pos, int64_t rotary_dim,
                             bool interleave, const CosSinFn& cs) {
  std::vector<double> v = x.to_double_vector();
  const int64_t nnz = x.size(0), heads = x.size(1), d = x.size(2), half = rotary_dim / 2;
  for (int64_t t = 0; t < nnz; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      double* row = v.data() + (t * heads + h) * d;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = interleave ? 2 * i : i, b = interleave ? 2 * i + 1 : i + half;
        const auto [c, s] = cs(pos[t], i);
        const double xa = row[a], xb = row[b];
        row[a] = xa * c - xb * s;
        row[b] = xb * c + xa * s;
      }
    }
  }
  return v;
}

Tensor index_tensor(const std::vector<int64_t>& v, DType dtype) {
  std::vector<double> d(v.begin(), v.end());
  return Tensor::from_vector(d, {static_cast<int64_t>(v.size())}, dtype);
}

// q/k as views of one packed qkv buffer [nnz, (Hq + 2 Hk) * D], like an engine's fused QKV
// projection output: non-contiguous token stride.
struct QK {
  Tensor q, k;
};
QK packed_qk(int64_t nnz, int64_t hq, int64_t hk, int64_t d, DType dtype, uint64_t seed) {
  Tensor qkv = rand_tensor({nnz, (hq + 2 * hk) * d}, dtype, seed);
  return {qkv.slice(1, 0, hq * d).view({nnz, hq, d}),
          qkv.slice(1, hq * d, (hq + hk) * d).view({nnz, hk, d})};
}

Tolerance rope_tol(DType d) {
  return d == DType::kFloat32 ? Tolerance{2e-6, 2e-6} : default_tolerance(d);
}

// ---- golden ----------------------------------------------------------------------------------

// x = [1, 2, 3, 4] at position 1, head_dim 4, theta 1e4: pair frequencies 1 and 0.01.
// Expected values computed independently (Python math module, fp64).
TEST(Rope, GoldenNeoxAndInterleaved) {
  Tensor q = Tensor::from_vector({1, 2, 3, 4}, {1, 1, 4}, DType::kFloat32);
  Tensor k = Tensor::from_vector({0, 0, 0, 0}, {1, 1, 4}, DType::kFloat32);
  Tensor pos = index_tensor({1}, DType::kInt32);
  auto [qn, kn] = apply_rope_pos_ids(q, k, pos);
  EXPECT_TRUE(
      all_close(qn, {-1.9841106485555495, 1.959900667496664, 2.4623779024123156, 4.019799668334994},
                {1e-6, 1e-6}));
  EXPECT_TRUE(all_close(kn, {0, 0, 0, 0}, {0, 0}));
  auto [qi, ki] = apply_rope_pos_ids(q, k, pos, std::nullopt, true);
  EXPECT_TRUE(
      all_close(qi, {-1.1426396637476532, 1.922075596544176, 2.9598506679133294, 4.029799501669161},
                {1e-6, 1e-6}));
}

TEST(Rope, PositionZeroIsIdentityAndPassThroughIsExact) {
  for (DType d : kDTypes) {
    QK x = packed_qk(3, 2, 1, 16, d, 1);
    // Position 0 everywhere: cos = 1, sin = 0, so every element is unchanged bit for bit.
    auto [q0, k0] = apply_rope_pos_ids(x.q, x.k, index_tensor({0, 0, 0}, DType::kInt64));
    EXPECT_TRUE(all_close(q0, x.q, {0, 0}));
    EXPECT_TRUE(all_close(k0, x.k, {0, 0}));
    // rotary_dim 6 of 16: dims 6.. pass through unchanged.
    auto [q1, k1] = apply_rope_pos_ids(x.q, x.k, index_tensor({5, 6, 7}, DType::kInt32), 6);
    EXPECT_TRUE(all_close(q1.slice(2, 6, 16), x.q.slice(2, 6, 16), {0, 0}));
    EXPECT_TRUE(all_close(k1.slice(2, 6, 16), x.k.slice(2, 6, 16), {0, 0}));
    EXPECT_FALSE(all_close(q1.slice(2, 0, 6), x.q.slice(2, 0, 6), {0, 0}));
  }
}

// Every finite fp16 value goes through the fp16 load and store paths unchanged at position 0
// (the CPU kernels may use hardware conversions: they must be exact).
TEST(Rope, EveryFiniteHalfRoundTrips) {
  std::vector<double> v;
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = half_bits_to_float(static_cast<uint16_t>(b));
    if (std::isfinite(f)) v.push_back(f);
  }
  const int64_t nnz = static_cast<int64_t>(v.size()) / 64;
  v.resize(static_cast<std::size_t>(nnz * 64));
  Tensor q = Tensor::from_vector(v, {nnz, 1, 64}, DType::kFloat16);
  Tensor k = Tensor::zeros({nnz, 1, 64}, DType::kFloat16);
  std::vector<int64_t> zeros(static_cast<std::size_t>(nnz), 0);
  auto [qr, kr] = apply_rope_pos_ids(q, k, index_tensor(zeros, DType::kInt32));
  EXPECT_TRUE(all_close(qr, v, {0, 0}));
}

// ---- formulas -------------------------------------------------------------------------------

struct Geometry {
  int64_t nnz, hq, hk, d, rotary;  // rotary 0: default (None)
};
const std::vector<Geometry> kGeoms = {
    {1, 1, 1, 2, 0}, {5, 4, 2, 64, 0}, {9, 3, 1, 128, 64}, {4, 2, 2, 80, 32}, {3, 1, 3, 8, 6},
};

std::vector<int64_t> some_positions(int64_t nnz) {
  std::vector<int64_t> p;
  for (int64_t t = 0; t < nnz; ++t) p.push_back((t * 7919) % 9000);  // up to ~9k
  return p;
}

TEST(Rope, PosIdsMatchesFormula) {
  for (DType d : kDTypes) {
    for (const auto& g : kGeoms) {
      for (bool interleave : {false, true}) {
        for (bool llama : {false, true}) {
          for (int layout = 0; layout < 2; ++layout) {
            SCOPED_TRACE(std::string(dtype_label(d)) + " D=" + std::to_string(g.d) +
                         " R=" + std::to_string(g.rotary) + (interleave ? " interleave" : " neox") +
                         (llama ? " llama31" : "") + (layout ? " strided" : " packed"));
            QK x = layout ? QK{strided_rand({g.nnz, g.hq, g.d}, d, 2),
                               strided_rand({g.nnz, g.hk, g.d}, d, 3)}
                          : packed_qk(g.nnz, g.hq, g.hk, g.d, d, 4);
            const auto pos = some_positions(g.nnz);
            const std::optional<int64_t> rd =
                g.rotary ? std::optional<int64_t>(g.rotary) : std::nullopt;
            const int64_t r = g.rotary ? g.rotary : g.d;
            const FreqFn f = llama ? llama31_freq(8, 5e5, 1, 4, 8192) : plain_freq(2.0, 1e4);
            Tensor pos_ids = index_tensor(pos, DType::kInt32);
            auto [qr, kr] = llama ? apply_llama31_rope_pos_ids(x.q, x.k, pos_ids, rd, interleave)
                                  : apply_rope_pos_ids(x.q, x.k, pos_ids, rd, interleave, 2.0);
            EXPECT_TRUE(qr.is_contiguous());
            EXPECT_TRUE(
                all_close(qr, ref_rope(x.q, pos, r, interleave, from_freq(f, r)), rope_tol(d)));
            EXPECT_TRUE(
                all_close(kr, ref_rope(x.k, pos, r, interleave, from_freq(f, r)), rope_tol(d)));
            // In place gives the same numbers in q and k themselves.
            Tensor q2 = x.q.clone(), k2 = x.k.clone();
            if (llama) {
              apply_llama31_rope_pos_ids_inplace(q2, k2, pos_ids, rd, interleave);
            } else {
              apply_rope_pos_ids_inplace(q2, k2, pos_ids, rd, interleave, 2.0);
            }
            EXPECT_TRUE(all_close(q2, qr, {0, 0}));
            EXPECT_TRUE(all_close(k2, kr, {0, 0}));
          }
        }
      }
    }
  }
}

// Non-default Llama 3.1 parameters, and the three frequency regimes at head_dim 128.
TEST(Rope, Llama31Parameters) {
  QK x = packed_qk(6, 2, 1, 128, DType::kFloat32, 5);
  const std::vector<int64_t> pos = {0, 1, 100, 4095, 20000, 131071};
  Tensor pos_ids = index_tensor(pos, DType::kInt64);
  auto [qr, kr] = apply_llama31_rope_pos_ids(x.q, x.k, pos_ids, std::nullopt, false, 32.0, 1e6, 2.0,
                                             16.0, 4096);
  const FreqFn f = llama31_freq(32.0, 1e6, 2.0, 16.0, 4096);
  EXPECT_TRUE(all_close(qr, ref_rope(x.q, pos, 128, false, from_freq(f, 128)), {1e-5, 1e-5}));
  EXPECT_TRUE(all_close(kr, ref_rope(x.k, pos, 128, false, from_freq(f, 128)), {1e-5, 1e-5}));
  // Different from plain RoPE with the same scale (the blend matters), and from no scaling.
  auto [qp, kp] = apply_rope_pos_ids(x.q, x.k, pos_ids, std::nullopt, false, 32.0, 1e6);
  EXPECT_FALSE(all_close(qr, qp, {1e-3, 1e-3}));
}

// apply_rope on a ragged batch equals apply_rope_pos_ids with the positions it implies.
TEST(Rope, RaggedEqualsPosIds) {
  // Segments of 3, 0, 5 and 1 tokens with offsets 10, 99, 0, 7000.
  const std::vector<int64_t> indptr = {0, 3, 3, 8, 9}, offsets = {10, 99, 0, 7000};
  const std::vector<int64_t> pos = {10, 11, 12, 0, 1, 2, 3, 4, 7000};
  for (DType d : kDTypes) {
    for (DType idx : {DType::kInt32, DType::kInt64}) {
      for (bool llama : {false, true}) {
        SCOPED_TRACE(std::string(dtype_label(d)) + (llama ? " llama31" : ""));
        QK x = packed_qk(9, 4, 2, 32, d, 6);
        Tensor ip = index_tensor(indptr, idx), of = index_tensor(offsets, DType::kInt32);
        Tensor pi = index_tensor(pos, DType::kInt64);
        auto [qa, ka] = llama ? apply_llama31_rope(x.q, x.k, ip, of, 16, true)
                              : apply_rope(x.q, x.k, ip, of, 16, true, 1.0, 5e4);
        auto [qb, kb] = llama ? apply_llama31_rope_pos_ids(x.q, x.k, pi, 16, true)
                              : apply_rope_pos_ids(x.q, x.k, pi, 16, true, 1.0, 5e4);
        EXPECT_TRUE(all_close(qa, qb, {0, 0}));
        EXPECT_TRUE(all_close(ka, kb, {0, 0}));
        Tensor q2 = x.q.clone(), k2 = x.k.clone();
        if (llama) {
          apply_llama31_rope_inplace(q2, k2, ip, of, 16, true);
        } else {
          apply_rope_inplace(q2, k2, ip, of, 16, true, 1.0, 5e4);
        }
        EXPECT_TRUE(all_close(q2, qa, {0, 0}));
        EXPECT_TRUE(all_close(k2, ka, {0, 0}));
      }
    }
  }
}

// Cache row p = [cos(p f_0 .. p f_{R/2-1}) | sin(...)], fp32, from the plain frequencies.
Tensor make_cache(int64_t max_pos, int64_t rotary_dim, double theta) {
  std::vector<double> v;
  for (int64_t p = 0; p < max_pos; ++p) {
    for (int part = 0; part < 2; ++part) {
      for (int64_t i = 0; i < rotary_dim / 2; ++i) {
        const double a = p * std::pow(theta, -2.0 * i / rotary_dim);
        v.push_back(part == 0 ? std::cos(a) : std::sin(a));
      }
    }
  }
  return Tensor::from_vector(v, {max_pos, rotary_dim}, DType::kFloat32);
}

TEST(Rope, CosSinCacheMatchesFormula) {
  const int64_t max_pos = 64;
  for (DType d : kDTypes) {
    for (int64_t rotary : {int64_t{64}, int64_t{32}}) {
      for (bool neox : {true, false}) {
        SCOPED_TRACE(std::string(dtype_label(d)) + " R=" + std::to_string(rotary) +
                     (neox ? " neox" : " interleaved"));
        const int64_t nnz = 7, hq = 4, hk = 2, hs = 64;
        Tensor cache = make_cache(max_pos, rotary, 1e4);
        Tensor query = rand_tensor({nnz, hq * hs}, d, 7);
        Tensor key = rand_tensor({nnz, hk * hs + 8}, d, 8).slice(1, 0, hk * hs);  // padded rows
        const std::vector<int64_t> pos = {0, 63, 5, 5, 17, 1, 40};
        Tensor positions = index_tensor(pos, DType::kInt64);
        // The cache is fp32, so the reference takes its (rounded) cos/sin values.
        const std::vector<double> cv = cache.to_double_vector();
        CosSinFn cs = [&](int64_t p, int64_t i) {
          return std::make_pair(cv[p * rotary + i], cv[p * rotary + rotary / 2 + i]);
        };
        auto [qo, ko] = apply_rope_with_cos_sin_cache(positions, query, key, hs, cache, neox);
        EXPECT_EQ(qo.shape(), query.shape());
        EXPECT_EQ(ko.shape(), key.shape());
        EXPECT_TRUE(all_close(qo, ref_rope(query.view({nnz, hq, hs}), pos, rotary, !neox, cs),
                              rope_tol(d)));
        EXPECT_TRUE(
            all_close(ko, ref_rope(key.contiguous().view({nnz, hk, hs}), pos, rotary, !neox, cs),
                      rope_tol(d)));
        // Same as computing the angles on the fly (up to the cache's fp32 rounding).
        auto [qp, kp] =
            apply_rope_pos_ids(query.view({nnz, hq, hs}), key.contiguous().view({nnz, hk, hs}),
                               positions, rotary, !neox);
        EXPECT_TRUE(all_close(qo.view({nnz, hq, hs}), qp, rope_tol(d)));
        // In place.
        Tensor q2 = query.clone(), k2 = key.clone();
        apply_rope_with_cos_sin_cache_inplace(positions.to(DType::kInt32), q2, k2, hs, cache, neox);
        EXPECT_TRUE(all_close(q2, qo, {0, 0}));
        EXPECT_TRUE(all_close(k2, ko, {0, 0}));
      }
    }
  }
}

// The cos/sin-cache forms give upstream's bits: each rotated value is fma(x, c, -rn(y s)) (or
// + rn(x s)) with fast math's flushing (kernels::rope_rotate), rounded once to the dtype; on the
// scalar tier (libm's fmaf, explicit flushes) and the AVX2 / AVX-512 tiers (vectorized FMA under
// MXCSR's DAZ / FTZ) alike. A bf16 subnormal at position 0 (cos 1, sin 0) rotates to zero.
TEST(Rope, CosSinCacheIsUpstreamsFmaWithFlushOnEveryTier) {
  const int64_t nnz = 5, hq = 3, hk = 1, hs = 64, rotary = 48, max_pos = 32;
  Tensor cache = make_cache(max_pos, rotary, 1e4);
  const std::vector<int64_t> pos = {0, 31, 7, 1, 19};
  Tensor positions = index_tensor(pos, DType::kInt64);
  for (bool neox : {true, false}) {
    Tensor query = rand_tensor({nnz, hq * hs}, DType::kBFloat16, 21, -4.0, 4.0);
    Tensor key = rand_tensor({nnz, hk * hs}, DType::kBFloat16, 22, -4.0, 4.0);
    // Token 0, head 0: dim 0 a subnormal, its partner zero.
    auto* qb = static_cast<uint16_t*>(query.data_ptr());
    qb[0] = 0x0001;
    qb[neox ? rotary / 2 : 1] = 0;
    const auto cv = cache.to_double_vector();
    auto expected = [&](const Tensor& x, int64_t heads) {
      const auto* in = static_cast<const uint16_t*>(x.data_ptr());
      std::vector<uint16_t> out(in, in + x.numel());
      for (int64_t t = 0; t < nnz; ++t) {
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t base = (t * heads + h) * hs;
          for (int64_t i = 0; i < rotary / 2; ++i) {
            const int64_t ia = neox ? i : 2 * i, ib = neox ? i + rotary / 2 : 2 * i + 1;
            const float c = static_cast<float>(cv[pos[t] * rotary + i]);
            const float sn = static_cast<float>(cv[pos[t] * rotary + rotary / 2 + i]);
            float ao, bo;
            kernels::rope_rotate(bfloat16_bits_to_float(in[base + ia]),
                                 bfloat16_bits_to_float(in[base + ib]), c, sn, &ao, &bo);
            out[base + ia] = float_to_bfloat16_bits(ao);
            out[base + ib] = float_to_bfloat16_bits(bo);
          }
        }
      }
      return out;
    };
    const auto want_q = expected(query, hq), want_k = expected(key, hk);
    EXPECT_EQ(want_q[0], 0u) << "the subnormal is flushed";
    for (auto tier : {kernels::cpu::CpuIsa::kScalar, kernels::cpu::CpuIsa::kAvx2,
                      kernels::cpu::CpuIsa::kAvx512}) {
      SCOPED_TRACE(::testing::Message()
                   << (neox ? "neox" : "interleaved") << " tier " << static_cast<int>(tier));
      kernels::cpu::set_cpu_isa_cap(tier);
      auto [qo, ko] = apply_rope_with_cos_sin_cache(positions, query, key, hs, cache, neox);
      kernels::cpu::set_cpu_isa_cap(kernels::cpu::CpuIsa::kAvx512);
      const auto* gq = static_cast<const uint16_t*>(qo.data_ptr());
      const auto* gk = static_cast<const uint16_t*>(ko.data_ptr());
      EXPECT_EQ(std::vector<uint16_t>(gq, gq + qo.numel()), want_q);
      EXPECT_EQ(std::vector<uint16_t>(gk, gk + ko.numel()), want_k);
    }
  }
}

// ---- bad input ------------------------------------------------------------------------------

TEST(Rope, BadInputPosIds) {
  QK x = packed_qk(4, 2, 1, 16, DType::kFloat16, 1);
  Tensor pos = index_tensor({0, 1, 2, 3}, DType::kInt32);
  const char* op = "apply_rope_pos_ids";
  EXPECT_FI_ERROR(apply_rope_pos_ids(x.q, x.k, pos, 7), op, "rotary_dim");   // odd
  EXPECT_FI_ERROR(apply_rope_pos_ids(x.q, x.k, pos, 18), op, "rotary_dim");  // > head_dim
  EXPECT_FI_ERROR(apply_rope_pos_ids(x.q, x.k, pos, 0), op, "rotary_dim");
  EXPECT_FI_ERROR(apply_rope_pos_ids(x.q.slice(2, 0, 15), x.k.slice(2, 0, 15), pos), op,
                  "rotary_dim");  // default = odd head_dim
  EXPECT_FI_ERROR(apply_rope_pos_ids(Tensor(), x.k, pos), op, "q");
  EXPECT_FI_ERROR(apply_rope_pos_ids(x.q.select(1, 0), x.k, pos), op, "q");  // 2-D
  EXPECT_FI_ERROR(apply_rope_pos_ids(x.q.to(DType::kInt32), x.k, pos), op, "q");
  EXPECT_FI_ERROR(apply_rope_pos_ids(x.q, x.k.to(DType::kBFloat16), pos), op, "k");
  EXPECT_FI_ERROR(apply_rope_pos_ids(x.q, x.k.slice(0, 0, 3), pos), op, "k");  // nnz
  EXPECT_FI_ERROR(apply_rope_pos_ids(x.q, x.k.slice(2, 0, 8), pos), op, "k");  // head_dim
  EXPECT_FI_ERROR(apply_rope_pos_ids(x.q, x.k, index_tensor({0, 1, 2}, DType::kInt32)), op,
                  "pos_ids");
  EXPECT_FI_ERROR(apply_rope_pos_ids(x.q, x.k, pos.to(DType::kFloat32)), op, "pos_ids");
  EXPECT_FI_ERROR(apply_rope_pos_ids(x.q, x.k, pos.view({2, 2})), op, "pos_ids");
  EXPECT_FI_ERROR(apply_rope_pos_ids(x.q, x.k, pos, std::nullopt, false, 0.0), op, "rope_scale");
  EXPECT_FI_ERROR(apply_rope_pos_ids(x.q, x.k, pos, std::nullopt, false, -1.0), op, "rope_scale");
  EXPECT_FI_ERROR(apply_rope_pos_ids(x.q, x.k, pos, std::nullopt, false, 1.0, 0.0), op,
                  "rope_theta");
  EXPECT_FI_ERROR(apply_rope_pos_ids(x.q, x.k, pos, std::nullopt, false, 1.0, INFINITY), op,
                  "rope_theta");
  EXPECT_FI_ERROR(apply_rope_pos_ids_inplace(x.q, x.q, pos), "apply_rope_pos_ids_inplace", "k");
  EXPECT_FI_ERROR(apply_rope_pos_ids_inplace(x.q.as_strided({4, 2, 16}, {0, 16, 1}, 0), x.k, pos),
                  "apply_rope_pos_ids_inplace", "q");  // broadcast over tokens
  {
    // k shifted half a head into q's slot of a packed buffer: overlaps; the next slot does not.
    Tensor qkv = rand_tensor({4, 4 * 16}, DType::kFloat16, 3);
    Tensor q = qkv.slice(1, 0, 32).view({4, 2, 16});
    EXPECT_FI_ERROR(apply_rope_pos_ids_inplace(q, qkv.slice(1, 24, 40).view({4, 1, 16}), pos),
                    "apply_rope_pos_ids_inplace", "k");
    EXPECT_NO_THROW(apply_rope_pos_ids_inplace(q, qkv.slice(1, 32, 48).view({4, 1, 16}), pos));
  }
  const char* lop = "apply_llama31_rope_pos_ids";
  EXPECT_FI_ERROR(apply_llama31_rope_pos_ids(x.q, x.k, pos, std::nullopt, false, 8, 5e5, 4, 4), lop,
                  "high_freq_factor");
  EXPECT_FI_ERROR(apply_llama31_rope_pos_ids(x.q, x.k, pos, std::nullopt, false, 8, 5e5, 0, 4), lop,
                  "low_freq_factor");
  EXPECT_FI_ERROR(apply_llama31_rope_pos_ids(x.q, x.k, pos, std::nullopt, false, 8, 5e5, 1, 4, 0),
                  lop, "old_context_len");
}

TEST(Rope, BadInputRagged) {
  QK x = packed_qk(5, 2, 1, 16, DType::kBFloat16, 1);
  Tensor off = index_tensor({0, 0}, DType::kInt32);
  auto ip = [](std::vector<int64_t> v) { return index_tensor(v, DType::kInt32); };
  for (const char* op : {"apply_rope", "apply_llama31_rope_inplace"}) {
    auto call = [&](const Tensor& indptr, const Tensor& offsets) {
      if (std::string(op) == "apply_rope") {
        apply_rope(x.q, x.k, indptr, offsets);
      } else {
        apply_llama31_rope_inplace(x.q, x.k, indptr, offsets);
      }
    };
    EXPECT_FI_ERROR(call(ip({0, 2}), off), op, "indptr");     // size != batch + 1
    EXPECT_FI_ERROR(call(ip({1, 2, 5}), off), op, "indptr");  // indptr[0] != 0
    EXPECT_FI_ERROR(call(ip({0, 2, 4}), off), op, "indptr");  // last != nnz
    EXPECT_FI_ERROR(call(ip({0, 4, 3, 5}), index_tensor({0, 0, 0}, DType::kInt32)), op,
                    "indptr");  // decreasing
    EXPECT_FI_ERROR(call(ip({0, 2, 5}).to(DType::kFloat32), off), op, "indptr");
    EXPECT_FI_ERROR(call(ip({0, 2, 5}), off.view({1, 2})), op, "offsets");
    EXPECT_FI_ERROR(call(ip({0, 2, 5}), off.to(DType::kInt16)), op, "offsets");
    EXPECT_FI_ERROR(call(Tensor(), off), op, "indptr");
  }
}

TEST(Rope, BadInputCosSinCache) {
  const char* op = "apply_rope_with_cos_sin_cache";
  Tensor cache = make_cache(16, 8, 1e4);
  Tensor q = rand_tensor({3, 2 * 8}, DType::kFloat16, 1),
         k = rand_tensor({3, 8}, DType::kFloat16, 2);
  Tensor pos = index_tensor({0, 15, 3}, DType::kInt64);
  EXPECT_FI_ERROR(
      apply_rope_with_cos_sin_cache(index_tensor({0, 16, 3}, DType::kInt64), q, k, 8, cache), op,
      "positions");  // past the cache
  EXPECT_FI_ERROR(
      apply_rope_with_cos_sin_cache(index_tensor({0, -1, 3}, DType::kInt32), q, k, 8, cache), op,
      "positions");  // negative
  EXPECT_FI_ERROR(apply_rope_with_cos_sin_cache(pos, q, k, 8, cache.to(DType::kFloat16)), op,
                  "cos_sin_cache");  // upstream requires fp32
  EXPECT_FI_ERROR(apply_rope_with_cos_sin_cache(pos, q, k, 8, make_cache(16, 10, 1e4)), op,
                  "cos_sin_cache");  // wider than head_size
  EXPECT_FI_ERROR(apply_rope_with_cos_sin_cache(pos, q, k, 8, cache.slice(1, 0, 7).contiguous()),
                  op,
                  "cos_sin_cache");  // odd rotary dim
  EXPECT_FI_ERROR(apply_rope_with_cos_sin_cache(pos, q, k, 8, cache.select(0, 0)), op,
                  "cos_sin_cache");
  EXPECT_FI_ERROR(apply_rope_with_cos_sin_cache(pos, q, k, 0, cache), op, "head_size");
  EXPECT_FI_ERROR(apply_rope_with_cos_sin_cache(pos, q, k, 6, make_cache(16, 6, 1e4)), op,
                  "query");  // 16 not a multiple of 6
  EXPECT_FI_ERROR(apply_rope_with_cos_sin_cache(pos, q.slice(0, 0, 2), k, 8, cache), op, "query");
  EXPECT_FI_ERROR(apply_rope_with_cos_sin_cache(pos, q, k.slice(0, 0, 2), 8, cache), op, "key");
  EXPECT_FI_ERROR(apply_rope_with_cos_sin_cache(pos, q, k.to(DType::kFloat32), 8, cache), op,
                  "key");
  EXPECT_FI_ERROR(apply_rope_with_cos_sin_cache(pos.to(DType::kFloat32), q, k, 8, cache), op,
                  "positions");
  EXPECT_FI_ERROR(apply_rope_with_cos_sin_cache(pos.view({3, 1}), q, k, 8, cache), op, "positions");
  EXPECT_FI_ERROR(apply_rope_with_cos_sin_cache_inplace(pos, q, q.slice(1, 0, 8), 8, cache),
                  "apply_rope_with_cos_sin_cache_inplace", "key");  // overlaps query
}

// ---- declarations, record and replay --------------------------------------------------------

TEST(RopeDecls, SignaturesMatchUpstream) {
  auto sig = [](const char* n) { return OpRegistry::global().find(n)->signature(); };
  const std::string plain = "rotary_dim=None, interleave=False, rope_scale=1, rope_theta=10000.0)";
  const std::string llama =
      "rotary_dim=None, interleave=False, rope_scale=8, rope_theta=500000.0, low_freq_factor=1, "
      "high_freq_factor=4, old_context_len=8192)";
  EXPECT_EQ(sig("apply_rope"), "(q, k, indptr, offsets, " + plain);
  EXPECT_EQ(sig("apply_rope_inplace"), "(q, k, indptr, offsets, " + plain);
  EXPECT_EQ(sig("apply_rope_pos_ids"), "(q, k, pos_ids, " + plain);
  EXPECT_EQ(sig("apply_rope_pos_ids_inplace"), "(q, k, pos_ids, " + plain);
  EXPECT_EQ(sig("apply_llama31_rope"), "(q, k, indptr, offsets, " + llama);
  EXPECT_EQ(sig("apply_llama31_rope_inplace"), "(q, k, indptr, offsets, " + llama);
  EXPECT_EQ(sig("apply_llama31_rope_pos_ids"), "(q, k, pos_ids, " + llama);
  EXPECT_EQ(sig("apply_llama31_rope_pos_ids_inplace"), "(q, k, pos_ids, " + llama);
  EXPECT_EQ(sig("apply_rope_with_cos_sin_cache"),
            "(positions, query, key, head_size, cos_sin_cache, is_neox=True)");
  EXPECT_EQ(sig("apply_rope_with_cos_sin_cache_inplace"),
            "(positions, query, key, head_size, cos_sin_cache, is_neox=True)");
  for (const auto* d : OpRegistry::global().ops()) {
    // fused_qk_rmsnorm_rope is upstream's flashinfer.norm op.
    if (d->name.find("rope") != std::string::npos && d->name != "fused_qk_rmsnorm_rope") {
      EXPECT_EQ(d->module, "flashinfer.rope");
    }
  }
}

TEST(RopeDecls, RecordAndReplayEveryOp) {
  QK x = packed_qk(6, 2, 2, 16, DType::kFloat16, 9);
  Tensor ip = index_tensor({0, 2, 6}, DType::kInt32), of = index_tensor({3, 100}, DType::kInt32);
  Tensor pos = index_tensor({0, 5, 9, 2, 7, 1}, DType::kInt64);
  Tensor cache = make_cache(16, 8, 1e4);
  Tensor query = rand_tensor({6, 32}, DType::kFloat16, 10),
         key = rand_tensor({6, 16}, DType::kFloat16, 11);
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    apply_rope(x.q, x.k, ip, of, 8, true, 2.0, 1e3);
    apply_rope_pos_ids(x.q, x.k, pos);
    apply_llama31_rope(x.q, x.k, ip, of);
    apply_llama31_rope_pos_ids(x.q, x.k, pos, 12, false, 4.0, 1e5, 1.0, 8.0, 1024);
    apply_rope_with_cos_sin_cache(pos, query, key, 16, cache, false);
    apply_rope_inplace(x.q, x.k, ip, of);
    apply_rope_pos_ids_inplace(x.q, x.k, pos, 4);
    apply_llama31_rope_inplace(x.q, x.k, ip, of, std::nullopt, true);
    apply_llama31_rope_pos_ids_inplace(x.q, x.k, pos);
    apply_rope_with_cos_sin_cache_inplace(pos, query, key, 16, cache);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 10u);
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const auto& c = calls[i];
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(c.error.empty()) << c.error;
    auto [result, after] = replay(c);
    EXPECT_TRUE(same_values(result, c.result));
    if (i < 5) {
      ASSERT_EQ(result.kind(), Value::Kind::kTuple);
      EXPECT_EQ(result.items().size(), 2u);
    } else {
      EXPECT_TRUE(result.is_none());
      // The replayed in-place call leaves its arguments exactly like the live call did.
      for (std::size_t a = 0; a < after.size(); ++a) EXPECT_TRUE(same_values(after[a], c.after[a]));
    }
  }
}

// ---- the arithmetic both backends share (kernels/rope_rules.h) -------------------------------

TEST(RopeRules, SincosHandValues) {
  double s, c;
  bool ok;
  kernels::rope_sincos(0.0, &s, &c, &ok);
  EXPECT_TRUE(ok);
  EXPECT_EQ(s, 0.0);
  EXPECT_EQ(c, 1.0);
  // The double nearest pi/2 lies 6.123233995736766e-17 below it: cos is that, sin rounds to 1.
  kernels::rope_sincos(std::numbers::pi / 2, &s, &c, &ok);
  EXPECT_EQ(s, 1.0);
  EXPECT_NEAR(c, 6.123233995736766e-17, 1e-31);
  kernels::rope_sincos(-std::numbers::pi, &s, &c, &ok);
  EXPECT_NEAR(s, -1.2246467991473532e-16, 1e-31);
  EXPECT_EQ(c, -1.0);
  // Every quadrant, both signs: sin/cos of k pi/2 + 0.3 are (+-sin 0.3, +-cos 0.3) swapped (up to
  // the rounding of the argument, an ulp of 12.9 is 1.8e-15).
  const double s3 = std::sin(0.3), c3 = std::cos(0.3);
  const double want_s[4] = {s3, c3, -s3, -c3}, want_c[4] = {c3, -s3, -c3, s3};
  for (int k = -8; k <= 8; ++k) {
    kernels::rope_sincos(k * (std::numbers::pi / 2) + 0.3, &s, &c, &ok);
    const int q = ((k % 4) + 4) % 4;
    EXPECT_NEAR(s, want_s[q], 4e-15) << "k " << k;
    EXPECT_NEAR(c, want_c[q], 4e-15) << "k " << k;
  }
  // Past the range (and not finite): refused, both NaN.
  for (double x :
       {kernels::kRopeMaxAngle, -kernels::kRopeMaxAngle, 1e300,
        std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    kernels::rope_sincos(x, &s, &c, &ok);
    EXPECT_FALSE(ok) << x;
    EXPECT_TRUE(std::isnan(s) && std::isnan(c)) << x;
  }
  kernels::rope_sincos(std::nextafter(kernels::kRopeMaxAngle, 0.0), &s, &c, &ok);
  EXPECT_TRUE(ok);
  EXPECT_NEAR(s, std::sin(std::nextafter(kernels::kRopeMaxAngle, 0.0)), 2.3e-16);
}

// Against the C library over the angles RoPE makes (integer positions times the pair
// frequencies), small and huge arguments and near multiples of pi/2: within 2^-52 absolute
// (about one fp64 ulp of a value near 1), and rounding to the same float, as the kernels use it.
TEST(RopeRules, SincosMatchesLibm) {
  std::mt19937_64 g(2024);
  std::vector<double> xs;
  for (int k = 0; k < 60000; ++k) {
    const int64_t pos = static_cast<int64_t>(g() % 3000000);
    const double f = std::pow(1e4, -2.0 * static_cast<double>(g() % 64) / 128.0);
    xs.push_back(static_cast<double>(pos) * f);
    xs.push_back(std::uniform_real_distribution<double>(-2.9e9, 2.9e9)(g));
    xs.push_back(std::uniform_real_distribution<double>(-8.0, 8.0)(g));
    const double n = static_cast<double>(g() % (int64_t{1} << 30));
    xs.push_back(std::nextafter(n * (std::numbers::pi / 2), 0.0));  // r close to 0
  }
  double max_err = 0.0;
  int float_diffs = 0;
  for (double x : xs) {
    double s, c;
    bool ok;
    kernels::rope_sincos(x, &s, &c, &ok);
    ASSERT_TRUE(ok) << x;
    max_err = std::max({max_err, std::fabs(s - std::sin(x)), std::fabs(c - std::cos(x))});
    if (static_cast<float>(s) != static_cast<float>(std::sin(x)) ||
        static_cast<float>(c) != static_cast<float>(std::cos(x))) {
      ++float_diffs;
    }
  }
  EXPECT_LE(max_err, std::ldexp(1.0, -52));
  EXPECT_LE(float_diffs, 1) << "of " << xs.size();
}

TEST(RopeRules, FrequencyAndRotation) {
  kernels::RopeParams p;
  p.rotary_dim = 128;
  p.rope_theta = 1e4;
  p.rope_rcp_scale = 0.25;
  EXPECT_EQ(kernels::rope_pair_frequency(p, 0), 0.25);
  EXPECT_DOUBLE_EQ(kernels::rope_pair_frequency(p, 32), 0.25 * std::pow(1e4, -0.5));
  // Llama 3.1's smoothing: s = clamp(f a + b, 0, 1) blends f / scale and f; s = 1 keeps f.
  p.smooth_a = 1.0, p.smooth_b = 0.0;
  EXPECT_EQ(kernels::rope_pair_frequency(p, 0), 1.0);
  // a' = a c - b s, b' = b c + a s in upstream's arithmetic: fma(a, c, -rn(b s)).
  float ao, bo;
  kernels::rope_rotate(1.0f, 2.0f, 0.5f, 0.25f, &ao, &bo);
  EXPECT_EQ(ao, 0.0f);
  EXPECT_EQ(bo, 1.25f);
  // u = 1 + 2^-12: u * u = 1 + 2^-11 + 2^-24 rounds to 1 + 2^-11 (a tie, to even). The first
  // product is fused: u u - 1 keeps its 2^-24; the second is rounded: 1 - u u loses it.
  const float u = 1.0f + std::ldexp(1.0f, -12);
  kernels::rope_rotate(u, 1.0f, u, 1.0f, &ao, &bo);
  EXPECT_EQ(ao, std::ldexp(1.0f, -11) + std::ldexp(1.0f, -24));
  kernels::rope_rotate(1.0f, u, 1.0f, u, &ao, &bo);
  EXPECT_EQ(ao, -std::ldexp(1.0f, -11));
  // Subnormals are flushed (fast math's .ftz): +-2^-130 rotated by angle 0 are zeros.
  kernels::rope_rotate(std::ldexp(1.0f, -130), -std::ldexp(1.0f, -130), 1.0f, 0.0f, &ao, &bo);
  EXPECT_EQ(ao, 0.0f);
  EXPECT_EQ(bo, 0.0f);
}

// Computed angles past rope_sincos's range: the CPU reference refuses (the CUDA kernel would
// write NaN); just inside, it computes.
TEST(Rope, RefusesAnglesPastTheRange) {
  QK x = packed_qk(2, 1, 1, 8, DType::kFloat32, 3);
  Tensor far = index_tensor({0, 3000000000}, DType::kInt64);
  EXPECT_FI_ERROR(apply_rope_pos_ids(x.q, x.k, far), "apply_rope_pos_ids", "pos_ids");
  // The ragged form names its offsets.
  EXPECT_FI_ERROR(apply_rope(x.q, x.k, index_tensor({0, 2}, DType::kInt32),
                             index_tensor({2999999999}, DType::kInt64)),
                  "apply_rope", "offsets");
  Tensor near = index_tensor({0, 2999999999}, DType::kInt64);
  auto [q, k] = apply_rope_pos_ids(x.q, x.k, near);
  for (double v : q.to_double_vector()) EXPECT_TRUE(std::isfinite(v));
  // A rope_scale shrinks the frequencies, and so the angles: 3e9 at rope_scale 2 is in range.
  auto [q2, k2] = apply_rope_pos_ids(x.q, x.k, far, std::nullopt, false, 2.0);
  for (double v : q2.to_double_vector()) EXPECT_TRUE(std::isfinite(v));
}

// ---- CUDA vs the CPU reference --------------------------------------------------------------

// Bit for bit: both backends take the host's frequencies, rope_sincos and rope_rotate
// (kernels/rope_rules.h), and round the same conversions.
const Tolerance kExact = {0, 0};

TEST(RopeCuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  auto cpu = [](const Tensor& t) { return t.to(Device::cpu()); };
  for (DType d : kDTypes) {
    for (const auto& g : kGeoms) {
      for (bool interleave : {false, true}) {
        SCOPED_TRACE(std::string(dtype_label(d)) + " D=" + std::to_string(g.d) +
                     (interleave ? " interleave" : " neox"));
        QK x = packed_qk(g.nnz, g.hq, g.hk, g.d, d, 12);
        QK xs = {strided_rand({g.nnz, g.hq, g.d}, d, 13), strided_rand({g.nnz, g.hk, g.d}, d, 14)};
        const std::optional<int64_t> rd =
            g.rotary ? std::optional<int64_t>(g.rotary) : std::nullopt;
        Tensor pos = index_tensor(some_positions(g.nnz), DType::kInt32);
        for (const QK& in : {x, xs}) {
          auto [qc, kc] = apply_llama31_rope_pos_ids(in.q, in.k, pos, rd, interleave);
          auto [qg, kg] = apply_llama31_rope_pos_ids(
              to_keep_layout(in.q, gpu), to_keep_layout(in.k, gpu), pos.to(gpu), rd, interleave);
          EXPECT_TRUE(all_close(cpu(qg), qc, kExact));
          EXPECT_TRUE(all_close(cpu(kg), kc, kExact));
          Tensor qi = to_keep_layout(in.q, gpu), ki = to_keep_layout(in.k, gpu);
          apply_llama31_rope_pos_ids_inplace(qi, ki, pos.to(gpu), rd, interleave);
          EXPECT_TRUE(all_close(cpu(qi), qc, kExact));
        }
        // Ragged on the device: the kernel searches indptr itself.
        std::vector<int64_t> indptr = {0}, offsets;
        for (int64_t t = 0; t < g.nnz; t += 2) {
          indptr.push_back(std::min(t + 2, g.nnz));
          offsets.push_back(100 * t);
        }
        Tensor ip = index_tensor(indptr, DType::kInt64), of = index_tensor(offsets, DType::kInt32);
        auto [qc, kc] = apply_rope(x.q, x.k, ip, of, rd, interleave, 4.0);
        auto [qg, kg] = apply_rope(to_keep_layout(x.q, gpu), to_keep_layout(x.k, gpu), ip.to(gpu),
                                   of.to(gpu), rd, interleave, 4.0);
        EXPECT_TRUE(all_close(cpu(qg), qc, kExact));
        EXPECT_TRUE(all_close(cpu(kg), kc, kExact));
      }
    }
    // cos/sin cache, including an out-of-range position, which the device marks with NaN.
    Tensor cache = make_cache(32, 16, 1e4);
    Tensor query = rand_tensor({4, 3 * 32}, d, 15), key = rand_tensor({4, 32}, d, 16);
    Tensor pos = index_tensor({0, 31, 7, 7}, DType::kInt64);
    for (bool neox : {true, false}) {
      auto [qc, kc] = apply_rope_with_cos_sin_cache(pos, query, key, 32, cache, neox);
      auto [qg, kg] = apply_rope_with_cos_sin_cache(pos.to(gpu), query.to(gpu), key.to(gpu), 32,
                                                    cache.to(gpu), neox);
      EXPECT_TRUE(all_close(cpu(qg), qc, kExact));
      EXPECT_TRUE(all_close(cpu(kg), kc, kExact));
    }
    auto [qbad, kbad] =
        apply_rope_with_cos_sin_cache(index_tensor({0, 32, 0, 0}, DType::kInt64).to(gpu),
                                      query.to(gpu), key.to(gpu), 32, cache.to(gpu));
    const auto v = cpu(qbad).to_double_vector();
    EXPECT_TRUE(std::isnan(v[96]));        // token 1, first rotated dim
    EXPECT_FALSE(std::isnan(v[0]));        // token 0 is fine
    EXPECT_FALSE(std::isnan(v[96 + 20]));  // pass-through dims of token 1 are copied
  }
}

// Long positions (up to 2^31 - 1, int64), a bandwidth-sized call on the 16-byte path (32 + 8
// heads, D 128, more tokens than one wave of blocks, each thread's first chunk loaded before its
// table), Llama 3.1 angles: the same bits as the CPU. Past the angle range the device writes NaN
// where the CPU refuses.
TEST(RopeCuda, LongPositionsAndWideCallsMatchCpuBitExact) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  auto cpu = [](const Tensor& t) { return t.to(Device::cpu()); };
  for (DType d : kDTypes) {
    SCOPED_TRACE(dtype_label(d));
    const int64_t nnz = 3000;
    QK x = packed_qk(nnz, 32, 8, 128, d, 21);
    std::vector<int64_t> p;
    for (int64_t t = 0; t < nnz; ++t) p.push_back((t * 2654435761LL) % 2147483647LL);
    Tensor pos = index_tensor(p, DType::kInt64);
    for (bool interleave : {false, true}) {
      auto [qc, kc] = apply_llama31_rope_pos_ids(x.q, x.k, pos, std::nullopt, interleave);
      auto [qg, kg] = apply_llama31_rope_pos_ids(x.q.to(gpu), x.k.to(gpu), pos.to(gpu),
                                                 std::nullopt, interleave);
      EXPECT_TRUE(all_close(cpu(qg), qc, kExact));
      EXPECT_TRUE(all_close(cpu(kg), kc, kExact));
    }
  }
  QK x = packed_qk(2, 1, 1, 8, DType::kFloat32, 3);
  auto [qf, kf] = apply_rope_pos_ids(x.q.to(gpu), x.k.to(gpu),
                                     index_tensor({0, 3000000000}, DType::kInt64).to(gpu));
  const auto v = cpu(qf).to_double_vector();
  EXPECT_FALSE(std::isnan(v[0]));  // token 0
  EXPECT_TRUE(std::isnan(v[8]));   // token 1's first rotated dim
  // Computed angles past 256 pairs are refused on CUDA (the host's frequencies travel in the
  // kernel's parameters); a cos/sin cache of that width runs.
  QK w = packed_qk(2, 1, 1, 1024, DType::kFloat32, 5);
  EXPECT_FI_ERROR(
      apply_rope_pos_ids(w.q.to(gpu), w.k.to(gpu), index_tensor({1, 2}, DType::kInt64).to(gpu)),
      "apply_rope_pos_ids", "rotary_dim");
  const Tensor cache = make_cache(4, 1024, 1e4);
  auto [qc, kc] = apply_rope_with_cos_sin_cache(
      index_tensor({1, 2}, DType::kInt64), w.q.view({2, 1024}), w.k.view({2, 1024}), 1024, cache);
  auto [qg, kg] = apply_rope_with_cos_sin_cache(index_tensor({1, 2}, DType::kInt64).to(gpu),
                                                w.q.view({2, 1024}).to(gpu),
                                                w.k.view({2, 1024}).to(gpu), 1024, cache.to(gpu));
  EXPECT_TRUE(all_close(cpu(qg), qc, kExact));
}

// apply_rope_with_cos_sin_cache_inplace as vLLM calls it (the engine-call audit of session 80):
// int64 positions, query and key as 2-D views into the fused qkv projection's rows (row stride
// (Hq + 2 Hkv) x D), head size 128, an fp32 cache of rotary_dim 128 (and 64: a partial rotary
// width), NeoX and GPT-J pairs, 2048 tokens. The CUDA kernel writes the views in place with the
// CPU's bits and leaves the rest of each row (the V part) as it was.
TEST(RopeCuda, InPlaceOnFusedQkvViewsMatchesCpuBitExact) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  const int64_t nnz = 2048, hq = 32, hkv = 8, d = 128, width = (hq + 2 * hkv) * d;
  std::vector<int64_t> p;
  for (int64_t t = 0; t < nnz; ++t) p.push_back((t * 7919) % 8192);
  const Tensor pos = index_tensor(p, DType::kInt64);
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t rotary : {int64_t{128}, int64_t{64}}) {
      for (bool neox : {true, false}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_label(dt) << " rotary " << rotary << (neox ? " neox" : " gptj"));
        const Tensor cache = make_cache(8192, rotary, 1e4);
        const Tensor qkv = Tensor::empty({nnz, width}, DType::kFloat32).uniform_(7).to(dt);
        Tensor host = qkv.clone();
        apply_rope_with_cos_sin_cache_inplace(
            pos, host.slice(1, 0, hq * d), host.slice(1, hq * d, (hq + hkv) * d), d, cache, neox);
        Tensor dev = qkv.to(gpu);
        apply_rope_with_cos_sin_cache_inplace(pos.to(gpu), dev.slice(1, 0, hq * d),
                                              dev.slice(1, hq * d, (hq + hkv) * d), d,
                                              cache.to(gpu), neox);
        EXPECT_TRUE(all_close(dev.to(Device::cpu()), host, kExact));
      }
    }
  }
}

}  // namespace
}  // namespace flashinfer::testing
