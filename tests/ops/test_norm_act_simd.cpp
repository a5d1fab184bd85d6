// The vector tiers of the CPU norm and activation kernels (scalar, AVX2, AVX-512), each forced
// in turn through the ISA cap and checked against fp64 formulas on every row width 1..300 (all
// tail lengths, both sides of each vector width), odd row strides, 3-D inputs, outputs large
// enough for the non-temporal store path with aligned and unaligned rows, and extreme inputs;
// the tiers must also agree with each other. The AVX-512 conversions are checked bit for bit
// against Half/BFloat16 and the vector exp against std::exp.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "kernels/cpu/cpu_avx512.h"
#include "kernels/cpu/cpu_isa.h"
#include "ops/norm_act_reference.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

using kernels::cpu::CpuIsa;

const std::vector<DType> kDTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
const std::vector<CpuIsa> kTiers = {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512};

const char* tier_name(CpuIsa t) {
  return t == CpuIsa::kScalar ? "scalar" : t == CpuIsa::kAvx2 ? "avx2" : "avx512";
}

// Sets the cap for one scope and restores the default (all tiers) afterwards, also on failure.
struct TierScope {
  explicit TierScope(CpuIsa t) { kernels::cpu::set_cpu_isa_cap(t); }
  ~TierScope() { kernels::cpu::set_cpu_isa_cap(CpuIsa::kAvx512); }
};

// fp64 references and the activation table: ops/norm_act_reference.h.

// fp32 normalized outputs carry one more rounding of the fp32 sum of squares than the fp64
// reference (test_norm.cpp uses the same bound).
Tolerance norm_tol(DType d) {
  return d == DType::kFloat32 ? Tolerance{2e-5, 2e-5} : default_tolerance(d);
}

// A [rows, n] view whose rows are `pad` elements further apart than n (unit element stride), so
// row starts take every alignment.
Tensor padded_rows(int64_t rows, int64_t n, int64_t pad, DType d, uint64_t seed, double lo = -2,
                   double hi = 2) {
  return rand_tensor({rows, n + pad}, d, seed, lo, hi).slice(1, 0, n);
}

// ---- norms: every width, every tier ---------------------------------------------------------

TEST(NormSimd, AllWidthsAllTiersMatchFormula) {
  for (CpuIsa tier : kTiers) {
    TierScope scope(tier);
    for (DType d : kDTypes) {
      for (int64_t n = 1; n <= 300; ++n) {
        SCOPED_TRACE(std::string(tier_name(tier)) + " " + dtype_label(d) +
                     " n=" + std::to_string(n));
        const int64_t rows = 3;
        const uint64_t seed = static_cast<uint64_t>(n) * 7;
        Tensor x = padded_rows(rows, n, n % 5, d, seed);
        Tensor w = rand_tensor({n}, d, seed + 1, -1.0, 1.0);
        const auto xv = x.to_double_vector(), wv = w.to_double_vector();

        ASSERT_TRUE(all_close(rmsnorm(x, w), ref_rmsnorm(xv, n, wv, 1e-6), norm_tol(d)));
        ASSERT_TRUE(all_close(gemma_rmsnorm(x, w), ref_rmsnorm(xv, n, with_bias(wv, 1.0), 1e-6),
                              norm_tol(d)));

        // In place (out == input) and fused add, on rows with padding.
        for (bool gemma : {false, true}) {
          Tensor xi = x.clone();
          Tensor res = padded_rows(rows, n, (n + 1) % 3, d, seed + 2);
          const auto rv = res.to_double_vector();
          std::vector<double> sum(xv.size());
          for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = xv[i] + rv[i];
          if (gemma) {
            gemma_fused_add_rmsnorm(xi, res, w, 1e-5);
          } else {
            fused_add_rmsnorm(xi, res, w, 1e-5);
          }
          ASSERT_TRUE(all_close(res, sum, default_tolerance(d)));
          ASSERT_TRUE(all_close(xi, ref_rmsnorm(sum, n, with_bias(wv, gemma ? 1.0 : 0.0), 1e-5),
                                norm_tol(d)));
        }
        Tensor xi = x.clone();
        rmsnorm(xi, w, 1e-6, xi);
        ASSERT_TRUE(all_close(xi, ref_rmsnorm(xv, n, wv, 1e-6), norm_tol(d)));

        Tensor g = rand_tensor({n}, DType::kFloat32, seed + 3, 0.5, 1.5);
        Tensor b = rand_tensor({n}, DType::kFloat32, seed + 4);
        ASSERT_TRUE(all_close(
            layernorm(x, g, b),
            ref_layernorm(xv, n, g.to_double_vector(), b.to_double_vector(), 1e-6), norm_tol(d)));
      }
    }
  }
}

// 3-D [batch, heads, hidden] rmsnorm with padded head and batch strides, into a strided `out`,
// and inputs whose element stride is not 1 (the vector paths must step aside).
TEST(NormSimd, StridedLayoutsAllTiers) {
  for (CpuIsa tier : kTiers) {
    TierScope scope(tier);
    for (DType d : kDTypes) {
      SCOPED_TRACE(std::string(tier_name(tier)) + " " + dtype_label(d));
      const int64_t n = 72;
      Tensor x = rand_tensor({5, 4, n + 9}, d, 1).slice(2, 3, 3 + n);  // [5, 4, 72]
      Tensor w = rand_tensor({n}, d, 2, -1, 1);
      const auto want = ref_rmsnorm(x.to_double_vector(), n, w.to_double_vector(), 1e-6);
      EXPECT_TRUE(all_close(rmsnorm(x, w), want, norm_tol(d)));
      Tensor out =
          rand_tensor({6, 5, n + 1}, d, 3).slice(0, 1, 6).slice(1, 0, 4).slice(2, 1, 1 + n);
      rmsnorm(x, w, 1e-6, out);
      EXPECT_TRUE(all_close(out, want, norm_tol(d)));

      Tensor xs = strided_rand({7, 33}, d, 4);  // element stride 2
      Tensor ws = strided_rand({33}, d, 5, -1, 1);
      const auto xsv = xs.to_double_vector(), wsv = ws.to_double_vector();
      EXPECT_TRUE(all_close(gemma_rmsnorm(xs, ws), ref_rmsnorm(xsv, 33, with_bias(wsv, 1.0), 1e-6),
                            norm_tol(d)));
      Tensor rs = strided_rand({7, 33}, d, 6);
      const auto rsv = rs.to_double_vector();
      std::vector<double> sum(xsv.size());
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = xsv[i] + rsv[i];
      fused_add_rmsnorm(xs, rs, ws, 1e-6);
      EXPECT_TRUE(all_close(rs, sum, default_tolerance(d)));
      EXPECT_TRUE(all_close(xs, ref_rmsnorm(sum, 33, wsv, 1e-6), norm_tol(d)));
    }
  }
}

// Outputs over the non-temporal threshold (16 MiB): rmsnorm/layernorm rows of 4100 fp32 are
// 16400 bytes apart, so one row in four starts 64-byte aligned (streamed) and the others use
// normal stores; 4100 % 16 = 4 leaves a masked tail on every row. Many rows also spread the
// work over the thread team.
TEST(NormSimd, LargeOutputsStreamedAndNot) {
  const int64_t rows = 1030, n = 4100;  // 16.9 MB of fp32 output
  Tensor x = rand_tensor({rows, n}, DType::kFloat32, 41);
  Tensor w = rand_tensor({n}, DType::kFloat32, 42, -1, 1);
  Tensor g = rand_tensor({n}, DType::kFloat32, 43, 0.5, 1.5);
  Tensor b = rand_tensor({n}, DType::kFloat32, 44);
  const auto xv = x.to_double_vector();
  const auto want_rms = ref_rmsnorm(xv, n, w.to_double_vector(), 1e-6);
  const auto want_ln = ref_layernorm(xv, n, g.to_double_vector(), b.to_double_vector(), 1e-6);
  EXPECT_TRUE(all_close(rmsnorm(x, w), want_rms, norm_tol(DType::kFloat32)));
  EXPECT_TRUE(all_close(layernorm(x, g, b), want_ln, norm_tol(DType::kFloat32)));
}

// The same in bf16 (rows of 8200 bytes: one in eight streamed), whose AVX-512 layernorm reads
// and writes rows as even/odd pairs with gamma and beta reordered to match.
TEST(NormSimd, LargeBf16LayernormStreamedAndNot) {
  const int64_t rows = 2100, n = 4100;  // 17.2 MB of bf16 output
  Tensor x = rand_tensor({rows, n}, DType::kBFloat16, 45);
  Tensor g = rand_tensor({n}, DType::kFloat32, 46, 0.5, 1.5);
  Tensor b = rand_tensor({n}, DType::kFloat32, 47);
  const auto want =
      ref_layernorm(x.to_double_vector(), n, g.to_double_vector(), b.to_double_vector(), 1e-6);
  EXPECT_TRUE(all_close(layernorm(x, g, b), want, norm_tol(DType::kBFloat16)));
}

// ---- activations ----------------------------------------------------------------------------

TEST(ActivationSimd, AllWidthsAllTiersMatchFormula) {
  for (CpuIsa tier : kTiers) {
    TierScope scope(tier);
    for (const auto& a : kActs) {
      for (DType d : kDTypes) {
        for (int64_t dd = 1; dd <= 300; ++dd) {
          SCOPED_TRACE(std::string(tier_name(tier)) + " " + a.name + " " + dtype_label(d) +
                       " d=" + std::to_string(dd));
          const uint64_t seed = static_cast<uint64_t>(dd) * 11;
          Tensor x = padded_rows(2, 2 * dd, dd % 3, d, seed, -8, 8);
          const auto want = ref_act(x.to_double_vector(), 2 * dd, a.ref);
          ASSERT_TRUE(all_close(a.op(x, std::nullopt, std::nullopt), want, default_tolerance(d)));
          // Into a row-padded out.
          Tensor out = padded_rows(2, dd, 1, d, seed + 1);
          a.op(x, out, std::nullopt);
          ASSERT_TRUE(all_close(out, want, default_tolerance(d)));
        }
      }
    }
  }
}

// Extremes at every lane position of a vector and of a masked tail: saturation (e^-x overflows,
// erfc underflows), NaN, infinities where the formula has a limit, and bf16's huge range.
TEST(ActivationSimd, ExtremeInputsAtEveryLane) {
  const double nan = std::nan("");
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> specials = {-100, 100, 0,  nan, -1e30, 1e30, -88.5,
                                        88.5, -30, 30, inf, -inf,  3e38, -3e38};
  for (CpuIsa tier : kTiers) {
    TierScope scope(tier);
    for (const auto& a : kActs) {
      for (DType d : {DType::kFloat32, DType::kBFloat16}) {
        SCOPED_TRACE(std::string(tier_name(tier)) + " " + a.name + " " + dtype_label(d));
        const int64_t dd = 37;  // two full vectors and a 5-lane tail
        std::vector<double> v;
        for (int64_t r = 0; r < dd; ++r) {
          for (int64_t i = 0; i < dd; ++i) v.push_back(specials[(r + i) % specials.size()]);
          for (int64_t i = 0; i < dd; ++i) v.push_back(i % 2 ? 1.0 : -0.5);
        }
        Tensor x = Tensor::from_vector(v, {dd, 2 * dd}, d);
        // fp64 has the limits right: e^100 is finite, and for 1e30 it overflows to inf (or
        // erfc saturates) exactly where the fp32 kernels saturate.
        const std::vector<double> want = ref_act(x.to_double_vector(), 2 * dd, a.ref);
        const Tolerance tol = {1e-30, d == DType::kFloat32 ? 1e-5 : 1.6e-2};  // tiny atol: -0
        EXPECT_TRUE(all_close(a.op(x, std::nullopt, std::nullopt), want, tol));
      }
    }
  }
}

// Relative accuracy in the negative tails on every lane (where 1 + erf and 1 + tanh would
// cancel), the same bound as test_activation's scalar-width check.
TEST(ActivationSimd, NegativeTailAllTiers) {
  std::vector<double> row;
  for (int i = 0; i < 40; ++i) row.push_back(-1.0 - 0.29 * i);  // -1 .. -12.3
  row.resize(80, 1.0);
  Tensor x = Tensor::from_vector(row, {1, 80}, DType::kFloat32);
  for (CpuIsa tier : kTiers) {
    TierScope scope(tier);
    for (const auto& a : kActs) {
      SCOPED_TRACE(std::string(tier_name(tier)) + " " + a.name);
      EXPECT_TRUE(
          all_close(a.op(x, std::nullopt, std::nullopt), ref_act(row, 80, a.ref), {1e-37, 8e-6}));
    }
  }
}

// fp16/bf16 gates take act() from a table (fp64, rounded once to fp32; fp16's holds act(-|x|)
// and positive gates add themselves): with up = 1 every output is the 16-bit rounding of the
// exact activation (up to the roundings through fp32: within 0.5 + 2^-12 units of the 16-bit
// format), zeros carry the exact value's sign, and every tier and a strided layout give the
// same bits. The reference is the same fp64 formula the table is built
// from, so this checks the indexing and the roundings; the formula itself is checked against
// golden values in test_activation.
double units_off(double got, double exact, DType d) {
  // Distance in units of the 16-bit format's spacing at |got| (its next value away from 0).
  const uint16_t b = d == DType::kFloat16
                         ? Half::from_float(static_cast<float>(std::fabs(got))).bits
                         : BFloat16::from_float(static_cast<float>(std::fabs(got))).bits;
  const uint16_t nb = static_cast<uint16_t>(b + 1);
  const double next = d == DType::kFloat16 ? Half{nb}.to_float() : BFloat16{nb}.to_float();
  return std::fabs(got - exact) / (next - std::fabs(got));
}

// The op's output on x with each tier of kTiers forced in turn.
std::vector<Tensor> on_every_tier(const ActCase& a, const Tensor& x) {
  std::vector<Tensor> outs;
  for (CpuIsa tier : kTiers) {
    TierScope scope(tier);
    outs.push_back(a.op(x, std::nullopt, std::nullopt));
  }
  return outs;
}

TEST(ActivationTable16, EveryGateEncodingRoundedOnceAndTiersBitIdentical) {
  const int64_t n = 65536;
  for (DType d : {DType::kFloat16, DType::kBFloat16}) {
    Tensor x = Tensor::empty({1, 2 * n}, d);
    auto* bits = x.data<uint16_t>();
    const uint16_t one =
        d == DType::kFloat16 ? Half::from_float(1.0f).bits : BFloat16::from_float(1.0f).bits;
    for (int64_t i = 0; i < n; ++i) {
      bits[i] = static_cast<uint16_t>(i);
      bits[n + i] = one;
    }
    // The same values as a strided [1, 2n] view (element stride 3) of a larger tensor.
    Tensor wide = Tensor::empty({1, 6 * n}, d);
    auto* wb = wide.data<uint16_t>();
    for (int64_t i = 0; i < 2 * n; ++i) wb[3 * i] = bits[i];
    Tensor strided = wide.slice(1, 0, 6 * n, 3);
    ASSERT_EQ(strided.stride(1), 3);
    const std::vector<double> xv = x.to_double_vector();
    for (const auto& a : kActs) {
      SCOPED_TRACE(std::string(a.name) + " " + dtype_label(d));
      std::vector<Tensor> outs = on_every_tier(a, x);
      outs.push_back(a.op(strided, std::nullopt, std::nullopt));
      for (std::size_t t = 1; t < outs.size(); ++t) {
        const auto* p0 = outs[0].data<uint16_t>();
        const auto* pt = outs[t].data<uint16_t>();
        int64_t first = -1;
        for (int64_t i = 0; i < n && first < 0; ++i) first = p0[i] != pt[i] ? i : -1;
        EXPECT_EQ(first, -1) << "layout/tier " << t << ": gate bits " << std::hex << first << ": "
                             << p0[std::max<int64_t>(first, 0)] << " vs "
                             << pt[std::max<int64_t>(first, 0)];
      }
      const std::vector<double> got = outs[0].to_double_vector();
      const double max_finite = d == DType::kFloat16 ? 65504.0 : 3.3895313892515355e38;
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double exact = a.ref(xv[i]);
        bool ok;
        if (std::isnan(exact)) {
          ok = std::isnan(got[i]);
        } else if (std::isinf(got[i])) {
          ok = std::fabs(exact) > max_finite && std::signbit(exact) == std::signbit(got[i]);
        } else {
          // Zeros keep the sign of the exact value (act(-0) = -0, tiny negative gates give -0).
          ok = units_off(got[i], exact, d) <= 0.5 + 1.0 / 4096 &&
               (got[i] != 0 || std::signbit(got[i]) == std::signbit(exact));
        }
        if (!ok && bad++ == 0)
          ADD_FAILURE() << "gate " << xv[i] << ": got " << got[i] << ", exact " << exact;
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

// The same bits on every tier with a real `up` (random, so the multiply and its rounding
// matter) and a row width with a masked AVX-512 tail; gates cover every finite encoding.
TEST(ActivationTable16, TiersBitIdenticalWithRandomUpAndTails) {
  const int64_t rows = 67, d = 1001;
  std::mt19937 rng(7);
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    Tensor x = rand_tensor({rows, 2 * d}, dt, 91, -4, 4);
    auto* bits = x.data<uint16_t>();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < d; ++i) {
        uint16_t b;
        do {  // any finite gate encoding
          b = static_cast<uint16_t>(rng());
        } while ((dt == DType::kFloat16 ? (b & 0x7C00) == 0x7C00 : (b & 0x7F80) == 0x7F80));
        bits[r * 2 * d + i] = b;
      }
    }
    for (const auto& a : kActs) {
      SCOPED_TRACE(std::string(a.name) + " " + dtype_label(dt));
      const std::vector<Tensor> outs = on_every_tier(a, x);
      for (std::size_t t = 1; t < outs.size(); ++t) {
        EXPECT_EQ(std::memcmp(outs[t].data_ptr(), outs[0].data_ptr(), outs[0].nbytes()), 0)
            << tier_name(kTiers[t]) << " differs from scalar";
      }
    }
  }
}

// fp32 gelu on a dense grid over [-16, 16], every interval edge of the AVX-512 piecewise erfcx
// (k/2) and its neighbours included: relative error against fp64 below 1e-6 on every tier
// (measured: 4.6e-7 scalar and AVX2, 2.7e-7 AVX-512) down to results of 1e-36; below that the
// scalar exp flushes to 0 and fp32 is near its subnormal range anyway. The scalar and AVX2
// tiers were at 1.1e-5 in the far tail until their exponent came from x rather than x/sqrt 2.
TEST(ActivationSimd, GeluFp32DenseRelativeAccuracy) {
  std::vector<double> xs;
  for (int i = -400000; i <= 400000; ++i) xs.push_back(i * 4e-5);  // [-16, 16]
  for (int k = -34; k <= 34; ++k) {
    const float e = 0.5f * static_cast<float>(k);
    xs.push_back(e);
    xs.push_back(std::nextafter(e, -100.0f));
    xs.push_back(std::nextafter(e, 100.0f));
  }
  const int64_t n = static_cast<int64_t>(xs.size());
  std::vector<double> v(xs);
  v.resize(2 * n, 1.0);
  Tensor x = Tensor::from_vector(v, {1, 2 * n}, DType::kFloat32);
  for (CpuIsa tier : kTiers) {
    TierScope scope(tier);
    SCOPED_TRACE(tier_name(tier));
    const std::vector<double> got = gelu_and_mul(x).to_double_vector();
    double worst = 0, at = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double want = gelu_ref(static_cast<float>(xs[i]));
      if (std::fabs(want) < 1e-36) continue;
      const double rel = std::fabs(got[i] / want - 1);
      if (rel > worst) worst = rel, at = xs[i];
    }
    EXPECT_LT(worst, 1e-6) << "at x = " << at;
  }
}

// The non-temporal path (output >= 16 MiB), rows alternating between aligned and unaligned
// starts (d = 4100 fp32: 16400-byte rows), with the default (highest) tier.
TEST(ActivationSimd, LargeOutputsStreamedAndNot) {
  const int64_t rows = 1030, dd = 4100;
  Tensor x = rand_tensor({rows, 2 * dd}, DType::kFloat32, 51, -6, 6);
  const auto xv = x.to_double_vector();
  for (const auto& a : kActs) {
    SCOPED_TRACE(a.name);
    EXPECT_TRUE(all_close(a.op(x, std::nullopt, std::nullopt), ref_act(xv, 2 * dd, a.ref),
                          default_tolerance(DType::kFloat32)));
  }
}

// The same for fp16/bf16 (8200-byte rows: one in eight starts 64-byte aligned), bit for bit
// against the scalar tier, which shares the tables but neither the streaming stores nor the
// AVX-512 line-at-a-time loops (bf16's even/odd split).
TEST(ActivationSimd, LargeOutputs16BitStreamedMatchScalar) {
  const int64_t rows = 2100, dd = 4100;  // 17.2 MB out
  for (DType d : {DType::kFloat16, DType::kBFloat16}) {
    Tensor x = rand_tensor({rows, 2 * dd}, d, 52, -6, 6);
    for (const auto& a : kActs) {
      SCOPED_TRACE(std::string(a.name) + " " + dtype_label(d));
      const std::vector<Tensor> outs = on_every_tier(a, x);
      EXPECT_EQ(std::memcmp(outs.back().data_ptr(), outs[0].data_ptr(), outs[0].nbytes()), 0);
    }
  }
}

// The tiers agree with each other more closely than each with the formula: fp32 results within
// a few ulp (2e-6 absolute + 4e-6 relative), 16-bit results within one unit of rounding.
TEST(NormActSimd, TiersAgree) {
  for (DType d : kDTypes) {
    SCOPED_TRACE(dtype_label(d));
    Tensor x = rand_tensor({37, 2 * 1000}, d, 61, -6, 6);
    Tensor h = rand_tensor({37, 1000}, d, 62);
    Tensor w = rand_tensor({1000}, d, 63, -1, 1);
    Tensor g = rand_tensor({1000}, DType::kFloat32, 64, 0.5, 1.5);
    Tensor b = rand_tensor({1000}, DType::kFloat32, 65);
    std::vector<std::vector<Tensor>> outs;
    for (CpuIsa tier : kTiers) {
      TierScope scope(tier);
      std::vector<Tensor> o;
      for (const auto& a : kActs) o.push_back(a.op(x, std::nullopt, std::nullopt));
      o.push_back(rmsnorm(h, w));
      o.push_back(gemma_rmsnorm(h, w));
      o.push_back(layernorm(h, g, b));
      Tensor xi = h.clone(), res = x.slice(1, 0, 1000).clone();
      fused_add_rmsnorm(xi, res, w);
      o.push_back(xi);
      o.push_back(res);
      outs.push_back(std::move(o));
    }
    const Tolerance tol = d == DType::kFloat32   ? Tolerance{2e-6, 4e-6}
                          : d == DType::kFloat16 ? Tolerance{1e-3, 1e-3}
                                                 : Tolerance{8e-3, 8e-3};
    for (std::size_t t = 1; t < outs.size(); ++t) {
      for (std::size_t k = 0; k < outs[0].size(); ++k) {
        SCOPED_TRACE(std::string(tier_name(kTiers[t])) + " output " + std::to_string(k));
        EXPECT_TRUE(all_close(outs[t][k], outs[0][k], tol));
      }
    }
  }
}

#if FLASHINFER_CPU_AVX512
// ---- AVX-512 building blocks ----------------------------------------------------------------

namespace v5 = kernels::cpu::simd512;

FI_AVX512 void convert_block(const float* in, Half* h, BFloat16* b, __mmask16 m) {
  v5::store(h, v5::load(in, m), m);
  v5::store(b, v5::load(in, m), m);
}
FI_AVX512 void widen_block(const Half* h, const BFloat16* b, float* hf, float* bf) {
  _mm512_storeu_ps(hf, v5::load(h));
  _mm512_storeu_ps(bf, v5::load(b));
}
FI_AVX512 void exp_block(const float* in, float* out) {
  _mm512_storeu_ps(out, v5::exp(_mm512_loadu_ps(in)));
}

// fp32 -> fp16/bf16 in registers gives exactly Half/BFloat16::from_float's bits (NaN: any NaN),
// over specials, every rounding boundary region and a million random bit patterns; the masked
// store leaves lanes past the mask untouched.
TEST(Avx512Blocks, NarrowingMatchesFromFloat) {
  if (!kernels::cpu::use_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          65504.0f,
                          65520.0f,
                          65519.99f,
                          6e-8f,
                          3e-8f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max()};
  // Ties and near-ties for both formats: low mantissa bits around the rounding points.
  for (uint32_t hi : {0x3F800000u, 0x477FE000u, 0x33800000u, 0x00800000u, 0x7F7F0000u}) {
    for (uint32_t lo = 0; lo < 0x20000u; lo += 0x7FF) v.push_back(std::bit_cast<float>(hi | lo));
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  while (v.size() % 16 != 0) v.push_back(0.5f);
  int64_t bad = 0;
  for (std::size_t i = 0; i < v.size(); i += 16) {
    const int lanes = static_cast<int>(i / 16 % 17);  // 0..16 lanes, all mask widths
    Half h[16];
    BFloat16 b[16];
    for (int j = 0; j < 16; ++j) {
      h[j].bits = 0x1234;
      b[j].bits = 0x5678;
    }
    convert_block(v.data() + i, h, b, v5::tail_mask(lanes));
    for (int j = 0; j < 16; ++j) {
      const float f = v[i + j];
      if (j >= lanes) {
        bad += h[j].bits != 0x1234 || b[j].bits != 0x5678;
      } else if (std::isnan(f)) {
        bad += !std::isnan(h[j].to_float()) || !std::isnan(b[j].to_float());
      } else {
        bad += h[j].bits != Half::from_float(f).bits || b[j].bits != BFloat16::from_float(f).bits;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

// fp16/bf16 -> fp32: all 65536 bit patterns of each, exact (NaN stays NaN).
TEST(Avx512Blocks, WideningIsExact) {
  if (!kernels::cpu::use_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  int64_t bad = 0;
  for (uint32_t base = 0; base < 65536; base += 16) {
    Half h[16];
    BFloat16 b[16];
    float hf[16], bf[16];
    for (uint32_t j = 0; j < 16; ++j) {
      h[j].bits = static_cast<uint16_t>(base + j);
      b[j].bits = static_cast<uint16_t>(base + j);
    }
    widen_block(h, b, hf, bf);
    for (int j = 0; j < 16; ++j) {
      const float eh = h[j].to_float(), eb = b[j].to_float();
      bad += std::isnan(eh) ? !std::isnan(hf[j])
                            : std::bit_cast<uint32_t>(hf[j]) != std::bit_cast<uint32_t>(eh);
      bad += std::isnan(eb) ? !std::isnan(bf[j])
                            : std::bit_cast<uint32_t>(bf[j]) != std::bit_cast<uint32_t>(eb);
    }
  }
  EXPECT_EQ(bad, 0);
}

// e^x within 2 ulp (relative 2.4e-7) of the fp64 value wherever the result is a normal fp32,
// within the denormal spacing below that, +inf above the overflow point, NaN for NaN.
TEST(Avx512Blocks, ExpAccuracy) {
  if (!kernels::cpu::use_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::vector<float> x;
  for (double t = -110.0; t <= 90.0; t += 0.0013) x.push_back(static_cast<float>(t));
  for (float s : {0.0f, -0.0f, 88.72f, 88.73f, -87.33f, -103.9f, -200.0f, 1e30f, -1e30f})
    x.push_back(s);
  x.push_back(std::numeric_limits<float>::infinity());
  x.push_back(-std::numeric_limits<float>::infinity());
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  while (x.size() % 16 != 0) x.push_back(1.0f);
  std::vector<float> y(x.size());
  for (std::size_t i = 0; i < x.size(); i += 16) exp_block(x.data() + i, y.data() + i);
  int64_t bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(static_cast<double>(x[i]));
    const double got = y[i];
    bool ok;
    if (std::isnan(x[i])) {
      ok = std::isnan(got);
    } else if (want > std::numeric_limits<float>::max()) {
      ok = std::isinf(got) && got > 0;
    } else if (want >= std::numeric_limits<float>::min()) {
      ok = std::fabs(got - want) <= 2.4e-7 * want;
    } else {
      ok = std::fabs(got - want) <= std::numeric_limits<float>::denorm_min();
    }
    if (!ok && bad++ < 5) ADD_FAILURE() << "exp(" << x[i] << ") = " << got << ", want " << want;
  }
  EXPECT_EQ(bad, 0);
}
#endif

}  // namespace
}  // namespace flashinfer::testing
