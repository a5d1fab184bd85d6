// Block-scaled, MX and low-latency FP8 GEMMs (gemm_fp8_nt_groupwise, gemm_fp8_nt_blockscaled,
// mm_fp8, prepare_low_latency_gemm_weights, fp8_blockscale_gemm_sm90, mm_mxfp8, bmm_mxfp8): an fp64
// formula over a grid of shapes, scale layouts, granularities and dtypes; hand-checked values; the
// weight layout bit-exact against its definition; every bad input; record/replay (live and through
// a dump); CUDA against the CPU reference.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "api/device_props.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/ops/upstream_arch.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm_bf16_cpu.h"
#include "kernels/cpu/gemm_fp8_dpbf16_cpu.h"
#include "kernels/cublaslt_plan.h"
#include "ops/gemm_reference.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

#if FLASHINFER_TEST_HAVE_CUDART
#include <cuda_runtime.h>

#include "core/cuda_runtime.h"
#include "kernels/cuda/gemm_cuda.h"
#include "kernels/cuda/gemm_fp8_cuda.h"
#include "util/cuda_graph_util.h"
#endif

namespace flashinfer::testing {
namespace {

using Gran = std::tuple<int64_t, int64_t, int64_t>;
constexpr DType kE4 = DType::kFloat8E4M3FN;
constexpr DType kE5 = DType::kFloat8E5M2;
constexpr DType kBf = DType::kBFloat16;

// fp8 data written with the library's own bit-exact conversions (fp32 -> fp8).
Tensor fp8(Shape shape, DType dt, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  return rand_tensor(std::move(shape), DType::kFloat32, seed, lo, hi).to(dt);
}
Tensor scales(Shape shape, uint64_t seed) {
  return rand_tensor(std::move(shape), DType::kFloat32, seed, 0.01, 0.05);
}
std::vector<double> dbl(const Tensor& t) { return t.to_double_vector(); }
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The fp64 formula: out[i, j] = sum_kb sa(i / gm, kb) * sb(j / gn, kb) * sum_{k in kb} a b,
// with sa/sb read through the given accessors (row-major values of the scale tensors).
template <class SA, class SB>
std::vector<double> ref_blockscaled(const Tensor& a, const Tensor& b, int64_t gm, int64_t gn,
                                    int64_t gk, SA sa, SB sb, double alpha = 1.0) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  const auto av = dbl(a), bv = dbl(b);
  std::vector<double> out(static_cast<std::size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t kb = 0; kb * gk < k; ++kb) {
        double part = 0.0;
        for (int64_t kk = kb * gk; kk < std::min(k, (kb + 1) * gk); ++kk) {
          part += av[i * k + kk] * bv[j * k + kk];
        }
        acc += sa(i / gm, kb) * sb(j / gn, kb) * part;
      }
      out[i * n + j] = alpha * acc;
    }
  }
  return out;
}

// Tolerance for a block-scaled fp32 accumulation rounded to `dt` (|out| ~ scale * sqrt(k)).
Tolerance tol(DType dt, int64_t k) { return gemm_tol(dt, k); }

// Whether the CPU has AMX-BF16 ("amx_bf16" among /proc/cpuinfo's flags).
bool cpu_has_amx_bf16() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("flags", 0) == 0) return line.find(" amx_bf16") != std::string::npos;
  }
  return false;
}

// ---- gemm_fp8_nt_groupwise ------------------------------------------------------------------

TEST(GemmFp8NtGroupwise, MatchesFp64FormulaOverGrid) {
  struct Case {
    int64_t m, n, k;
    Gran g;
  };
  const std::vector<Case> cases = {{1, 1, 128, {1, 128, 128}},    {5, 130, 256, {1, 128, 128}},
                                   {33, 64, 384, {1, 128, 128}},  {130, 257, 128, {1, 128, 128}},
                                   {7, 48, 96, {1, 16, 32}},      {9, 20, 64, {4, 8, 16}},
                                   {12, 30, 256, {128, 128, 128}}};
  for (const Case& c : cases) {
    for (const char* mode : {"K", "MN"}) {
      for (auto [adt, bdt] : {std::pair{kE4, kE4}, std::pair{kE4, kE5}, std::pair{kE5, kE4}}) {
        const auto [gm, gn, gk] = c.g;
        SCOPED_TRACE(::testing::Message() << c.m << "x" << c.n << "x" << c.k << " g=(" << gm << ","
                                          << gn << "," << gk << ") " << mode << " "
                                          << dtype_torch_name(adt) << "," << dtype_torch_name(bdt));
        const bool k_major = std::string(mode) == "K";
        Tensor a = fp8({c.m, c.k}, adt, c.m + c.k);
        Tensor b = fp8({c.n, c.k}, bdt, c.n * 7 + c.k);
        const int64_t mb = cdiv(c.m, gm), nb = cdiv(c.n, gn), kb = c.k / gk;
        Tensor sa = k_major ? scales({mb, kb}, 1) : scales({kb, mb}, 1);
        Tensor sb = k_major ? scales({nb, kb}, 2) : scales({kb, nb}, 2);
        const auto sav = dbl(sa), sbv = dbl(sb);
        auto at_a = [&](int64_t r, int64_t q) {
          return k_major ? sav[r * kb + q] : sav[q * mb + r];
        };
        auto at_b = [&](int64_t r, int64_t q) {
          return k_major ? sbv[r * kb + q] : sbv[q * nb + r];
        };
        const auto ref = ref_blockscaled(a, b, gm, gn, gk, at_a, at_b);
        for (DType out_dt : {kBf, DType::kFloat16}) {
          Tensor out = gemm_fp8_nt_groupwise(a, b, sa, sb, mode, 1, c.g, std::nullopt, out_dt);
          ASSERT_EQ(out.shape(), (Shape{c.m, c.n}));
          ASSERT_EQ(out.dtype(), out_dt);
          EXPECT_TRUE(all_close(out, ref, tol(out_dt, c.k)));
        }
      }
    }
  }
}

// Hand-checked: k = 256 (two K blocks), one row, one column; the second block's scale differs.
TEST(GemmFp8NtGroupwise, HandCheckedPerBlockScales) {
  Tensor a = Tensor::full({1, 256}, 1.0, kE4);
  Tensor b = Tensor::full({1, 256}, 2.0, kE4);
  // 'K': a_scale [1, 2], b_scale [1, 2].
  Tensor sa = Tensor::from_vector({0.5, 0.25}, {1, 2}, DType::kFloat32);
  Tensor sb = Tensor::from_vector({1.0, 4.0}, {1, 2}, DType::kFloat32);
  // 128 * 2 * (0.5 * 1) + 128 * 2 * (0.25 * 4) = 128 + 256 = 384.
  Tensor out = gemm_fp8_nt_groupwise(a, b, sa, sb, "K");
  EXPECT_EQ(dbl(out), (std::vector<double>{384.0}));
  // The same scales in 'MN' layout ([k/128, m]): a transposed view is read through its strides.
  out = gemm_fp8_nt_groupwise(a, b, sa.transpose(0, 1), sb.transpose(0, 1), "MN");
  EXPECT_EQ(dbl(out), (std::vector<double>{384.0}));
}

// Strided operands, scales and out; an out dtype given by out (out_dtype then ignored, as
// upstream); the trtllm layout (a_scale [k/128, m], b_scale [n/128, k/128]).
TEST(GemmFp8NtGroupwise, StridedViewsOutAndTrtllmLayout) {
  const int64_t m = 6, n = 200, k = 256;
  Tensor a = fp8({m, k + 32}, kE4, 3).slice(1, 16, 16 + k);
  Tensor b = fp8({n, 2 * k}, kE4, 4).slice(1, 0, 2 * k, 2);
  Tensor sa = scales({k / 128, m}, 5);                  // 'MN'
  Tensor sb = scales({2, k / 128}, 6).transpose(0, 1);  // 'MN' [k/128, n/128], transposed view
  const auto sav = dbl(sa), sbm = dbl(sb.contiguous());
  auto at_a = [&](int64_t r, int64_t q) { return sav[q * m + r]; };
  auto at_b = [&](int64_t r, int64_t q) { return sbm[q * 2 + r]; };
  const auto ref = ref_blockscaled(a.contiguous(), b.contiguous(), 1, 128, 128, at_a, at_b);
  Tensor out = Tensor::zeros({m, 2 * n}, DType::kFloat16).slice(1, 0, 2 * n, 2);
  Tensor r = gemm_fp8_nt_groupwise(a, b, sa, sb, "MN", 2, {1, 128, 128}, out, kBf);
  EXPECT_EQ(r.data_ptr(), out.data_ptr());
  EXPECT_EQ(r.dtype(), DType::kFloat16);
  EXPECT_TRUE(all_close(out, ref, tol(DType::kFloat16, k)));
  // trtllm: b_scale is [n/128, k/128] (upstream's test passes the 'MN' one transposed).
  Tensor t = gemm_fp8_nt_groupwise(a, b, sa, sb.transpose(0, 1).contiguous(), std::nullopt, 1,
                                   {1, 128, 128}, std::nullopt, std::nullopt, "trtllm");
  EXPECT_TRUE(all_close(t, ref, tol(kBf, k)));
  // Upstream's documented trtllm forms, (m, k/128) and (k/128, n/128) contiguous on their first
  // dimension: SGLang's column-major per-token-group scales are the [k/128, m] tensor seen
  // transposed. The same numbers.
  Tensor t2 = gemm_fp8_nt_groupwise(a, b, sa.transpose(0, 1), sb, std::nullopt, 1, {1, 128, 128},
                                    std::nullopt, std::nullopt, "trtllm");
  EXPECT_TRUE(all_close(t2, t.to_double_vector(), {0.0, 0.0}));
  // A square a_scale (m = k/128 = 2): the column-major view is not read transposed.
  Tensor a2 = a.slice(0, 0, 2);
  Tensor sa2 = scales({k / 128, 2}, 7);
  const auto sa2v = dbl(sa2);
  auto at_a2 = [&](int64_t r, int64_t q) { return sa2v[q * 2 + r]; };
  const auto ref2 = ref_blockscaled(a2.contiguous(), b.contiguous(), 1, 128, 128, at_a2, at_b);
  for (const Tensor& s2 : {sa2, sa2.transpose(0, 1)}) {
    Tensor t3 = gemm_fp8_nt_groupwise(a2, b, s2, sb, std::nullopt, 1, {1, 128, 128}, std::nullopt,
                                      std::nullopt, "trtllm");
    EXPECT_TRUE(all_close(t3, ref2, tol(kBf, k)));
  }
}

// ---- gemm_fp8_nt_blockscaled ----------------------------------------------------------------

TEST(GemmFp8NtBlockscaled, EqualsGroupwiseAt128x128AndFormula) {
  for (auto [m, n, k] : {Gran{128, 128, 128}, Gran{200, 72, 384}, Gran{3, 300, 256}}) {
    for (const char* mode : {"MN", "K"}) {
      SCOPED_TRACE(::testing::Message() << m << "x" << n << "x" << k << " " << mode);
      const bool k_major = std::string(mode) == "K";
      Tensor a = fp8({m, k}, kE4, m + 1), b = fp8({n, k}, kE4, n + 2);
      const int64_t mb = cdiv(m, 128), nb = cdiv(n, 128), kb = k / 128;
      Tensor sa = k_major ? scales({mb, kb}, 3) : scales({kb, mb}, 3);
      Tensor sb = k_major ? scales({nb, kb}, 4) : scales({kb, nb}, 4);
      const auto sav = dbl(sa), sbv = dbl(sb);
      auto at_a = [&](int64_t r, int64_t q) { return k_major ? sav[r * kb + q] : sav[q * mb + r]; };
      auto at_b = [&](int64_t r, int64_t q) { return k_major ? sbv[r * kb + q] : sbv[q * nb + r]; };
      Tensor out = gemm_fp8_nt_blockscaled(a, b, sa, sb, mode);
      EXPECT_TRUE(all_close(out, ref_blockscaled(a, b, 128, 128, 128, at_a, at_b), tol(kBf, k)));
      Tensor g = gemm_fp8_nt_groupwise(a, b, sa, sb, mode, 1, {128, 128, 128});
      EXPECT_TRUE(all_close(out, g, {0.0, 0.0}));
    }
  }
  // The default mode is 'MN'.
  Tensor a = fp8({4, 128}, kE4, 1), b = fp8({8, 128}, kE4, 2);
  Tensor s1 = scales({1, 1}, 3), s2 = scales({1, 1}, 4);
  EXPECT_TRUE(all_close(gemm_fp8_nt_blockscaled(a, b, s1, s2),
                        gemm_fp8_nt_blockscaled(a, b, s1, s2, "MN"), {0.0, 0.0}));
}

// ---- prepare_low_latency_gemm_weights and mm_fp8 --------------------------------------------

TEST(PrepareLowLatencyGemmWeights, LayoutIsTheShuffledBlockLayout) {
  const int64_t n = 64, k = 256;
  // Each byte of w encodes (row, k) distinctly enough to check placement: fp8 codes 0..255.
  Tensor w = Tensor::empty({n, k}, kE4);
  auto* wb = static_cast<uint8_t*>(w.data_ptr());
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t kk = 0; kk < k; ++kk) wb[j * k + kk] = static_cast<uint8_t>((j * 31 + kk) & 0x7E);
  }
  Tensor p = prepare_low_latency_gemm_weights(w, Value());
  ASSERT_EQ(p.shape(), (Shape{k / 128, n, 128}));
  ASSERT_EQ(p.dtype(), kE4);
  const auto* pb = static_cast<const uint8_t*>(p.data_ptr());
  // Upstream: row_indices[new] = old with new = (old / 32) * 32 + map[old % 32],
  // map = [0, 8, 16, 24, 1, 9, 17, 25, ...]; then out[kb, new, c] = w[old, kb * 128 + c].
  const int map[32] = {0, 8,  16, 24, 1, 9,  17, 25, 2, 10, 18, 26, 3, 11, 19, 27,
                       4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31};
  for (int64_t old = 0; old < n; ++old) {
    const int64_t nw = (old / 32) * 32 + map[old % 32];
    for (int64_t kk = 0; kk < k; ++kk) {
      ASSERT_EQ(pb[(kk / 128) * n * 128 + nw * 128 + kk % 128], wb[old * k + kk])
          << old << "," << kk;
    }
  }
}

TEST(MmFp8, MatchesFp64FormulaOfTheUnpreparedWeight) {
  for (auto [m, n, k] : {Gran{1, 32, 128}, Gran{16, 96, 384}, Gran{5, 64, 256}}) {
    SCOPED_TRACE(::testing::Message() << m << "x" << n << "x" << k);
    Tensor a = fp8({m, k}, kE4, m + 10);
    Tensor w = fp8({n, k}, kE4, n + 11);
    Tensor prepared = prepare_low_latency_gemm_weights(w, Value());
    const double alpha = static_cast<float>(0.0123);
    auto one = [](int64_t, int64_t) { return 1.0; };
    const auto ref = ref_blockscaled(a, w, 1, 1, k, one, one, alpha);
    Tensor out = mm_fp8(a, prepared, Tensor::full({1}, 0.0123, DType::kFloat32));
    ASSERT_EQ(out.shape(), (Shape{m, n}));
    ASSERT_EQ(out.dtype(), kBf);
    EXPECT_TRUE(all_close(out, ref, tol(kBf, k)));
    // alpha None means 1; a given out is written.
    Tensor o = Tensor::zeros({m, n}, kBf);
    mm_fp8(a, prepared, std::nullopt, kBf, o);
    EXPECT_TRUE(all_close(o, ref_blockscaled(a, w, 1, 1, k, one, one), tol(kBf, k)));
  }
}

// The CPU fast path (kernels/cpu/gemm_fp8_dpbf16_cpu.cpp, AVX-512 BF16 CPUs) against its
// specification, bit for bit: oneDNN's avx512_core_bf16 sums (vdpbf16ps per k pair: element
// 2p + 1, then 2p, each an fp32 FMA; k summed in chunks of min(k, 512), or 1024 for k > 1024,
// each from +0, chunks added in order), then bf16(alpha * sum + 0.0f). Every sum holds +-448^2
// at k = 0 (even) and its negation at an odd k of the last chunk, so the order of the roundings
// shows in the bf16 result. With NaN codes only in the weight (one chunk takes the vdpbf16ps
// path), in the activation (all of it does) or none. Also the same bytes as the oneDNN path it
// replaced (the AVX-512 tier capped off), where the build has oneDNN.
TEST(MmFp8, LargeMFastPathIsTheOneDnnSumsBitForBit) {
  namespace kc = kernels::cpu;
  for (auto [m, n, k] : {Gran{20, 64, 1152}, Gran{15, 96, 640}, Gran{3, 32, 256}}) {
    for (int nan : {0, 1, 2}) {
      SCOPED_TRACE(::testing::Message() << m << "x" << n << "x" << k << " nan " << nan);
      Tensor a = fp8({m, k}, kE4, m + 20);
      Tensor w = fp8({n, k}, kE4, n + 21);
      auto* ab = static_cast<uint8_t*>(a.data_ptr());
      auto* wb = static_cast<uint8_t*>(w.data_ptr());
      for (int64_t x = 3; x < m * k; x += 37) ab[x] = static_cast<uint8_t>(x % 8);  // subnormals
      for (int64_t i = 0; i < m; ++i) ab[i * k] = 0x7E, ab[i * k + k - 5] = 0xFE;   // 448, -448
      for (int64_t j = 0; j < n; ++j) wb[j * k] = wb[j * k + k - 5] = 0x7E;
      for (int64_t x = 0; x < k; ++x) ab[k + x] = 0x80;  // a row of -0: zero sums
      if (nan == 1) wb[5 * k + 17] = 0xFF, wb[(n - 1) * k + 3] = 0x7F;
      if (nan == 2) ab[k / 2] = 0x7F;
      Tensor prepared = prepare_low_latency_gemm_weights(w, Value());
      const float alpha = -0.0123f;
      Tensor out = mm_fp8(a, prepared, Tensor::full({1}, alpha, DType::kFloat32));
      const auto* got = static_cast<const uint16_t*>(out.data_ptr());
      if (kc::fp8_dpbf16_gemm_available()) {
        const int64_t kch = k <= 512 ? k : k <= 1024 ? 512 : 1024;
        const auto av = dbl(a), wv = dbl(w);
        int bad = 0;
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            float total = 0.0f;
            for (int64_t k0 = 0; k0 < k; k0 += kch) {
              float acc = 0.0f;
              for (int64_t kk = k0; kk < std::min(k, k0 + kch); kk += 2) {
                for (int64_t e : {kk + 1, kk}) {
                  acc = std::fma(static_cast<float>(av[i * k + e]),
                                 static_cast<float>(wv[j * k + e]), acc);
                }
              }
              total = k0 == 0 ? acc : total + acc;
            }
            const uint16_t want = float_to_bfloat16_bits(alpha * total + 0.0f);
            const bool both_nan = (want & 0x7FFF) > 0x7F80 && (got[i * n + j] & 0x7FFF) > 0x7F80;
            bad += want != got[i * n + j] && !both_nan;
          }
        }
        EXPECT_EQ(bad, 0);
      }
      const kc::CpuIsa cap = kc::cpu_isa_cap();
      kc::set_cpu_isa_cap(kc::CpuIsa::kAvx2);
      Tensor old = mm_fp8(a, prepared, Tensor::full({1}, alpha, DType::kFloat32));
      kc::set_cpu_isa_cap(cap);
      // On a CPU with AMX-BF16 oneDNN runs its AMX kernels, which sum in tiles of their own
      // order: the same bytes hold only against its avx512_core_bf16 kernels.
      if (kc::onednn_gemm_available() && !cpu_has_amx_bf16()) {
        EXPECT_EQ(std::memcmp(old.data_ptr(), out.data_ptr(), static_cast<std::size_t>(m * n * 2)),
                  0);
      } else if (nan == 0) {
        EXPECT_TRUE(all_close(out, dbl(old), tol(kBf, k)));
      }
    }
  }
}

// ---- fp8_blockscale_gemm_sm90 ----------------------------------------------------------------

TEST(Fp8BlockscaleGemmSm90, Fp8InputsPerTokenAndPerBlockWeightScales) {
  const int64_t m = 7, n = 192, k = 384, kb = k / 128;
  Tensor x = fp8({m, k}, kE4, 1), w = fp8({n, k}, kE4, 2);
  Tensor sx = scales({m, kb}, 3);
  const auto sxv = dbl(sx);
  auto at_x = [&](int64_t r, int64_t q) { return sxv[r * kb + q]; };
  for (bool per_block : {true, false}) {
    Tensor sw = per_block ? scales({2, kb}, 4) : scales({n, kb}, 4);
    const auto swv = dbl(sw);
    auto at_w = [&](int64_t r, int64_t q) { return swv[r * kb + q]; };
    const auto ref = ref_blockscaled(x, w, 1, per_block ? 128 : 1, 128, at_x, at_w);
    for (DType out_dt : {kBf, DType::kFloat16}) {
      Tensor out = fp8_blockscale_gemm_sm90(x, w, sx, sw, std::nullopt, out_dt);
      EXPECT_EQ(out.dtype(), out_dt);
      EXPECT_TRUE(all_close(out, ref, tol(out_dt, k))) << per_block;
    }
  }
}

// TRT-LLM's 1x128 quantization of a bf16 [m, k] written independently in fp32: per block of 128,
// amax, quant 448 / amax (1 for 0), codes e4m3(x * quant) saturating, scales 1 / quant. Returns
// (codes as e4m3 [m, k], scales fp32 [m, k / 128]), on the CPU.
std::pair<Tensor, Tensor> quantize_1x128_reference(const Tensor& x) {
  const int64_t m = x.size(0), k = x.size(1), kb = k / 128;
  const auto xv = dbl(x.contiguous());
  std::vector<double> q(static_cast<std::size_t>(m * k)), sq(static_cast<std::size_t>(m * kb));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t b = 0; b < kb; ++b) {
      float amax = 0.0f;
      for (int64_t kk = b * 128; kk < b * 128 + 128; ++kk) {
        amax = std::max(amax, static_cast<float>(std::fabs(xv[i * k + kk])));
      }
      const float qs = amax != 0.0f ? 448.0f / amax : 1.0f;
      sq[i * kb + b] = 1.0f / qs;
      for (int64_t kk = b * 128; kk < b * 128 + 128; ++kk) {
        q[i * k + kk] = std::clamp(static_cast<float>(xv[i * k + kk]) * qs, -448.0f, 448.0f);
      }
    }
  }
  // RNE to e4m3 (values already in range).
  return {Tensor::from_vector(q, {m, k}, kE4), Tensor::from_vector(sq, {m, kb}, DType::kFloat32)};
}

// A bf16 input is quantized per 1x128 block first (TRT-LLM's scale_1x128_kernel): the result
// equals the fp8 path on the input quantized by that formula, exactly; a row-strided input (a
// view of wider rows) gives the same bits.
TEST(Fp8BlockscaleGemmSm90, Bf16InputQuantizedPer1x128) {
  const int64_t m = 5, n = 64, k = 256, kb = 2;
  std::vector<double> xs = dbl(rand_tensor({m, k}, DType::kFloat32, 9, -3.0, 3.0));
  xs[130] = 0.0;                                            // a zero and
  for (int64_t kk = 0; kk < 128; ++kk) xs[4 * k + kk] = 0;  // an all-zero block (scale 1)
  Tensor x = Tensor::from_vector(xs, {m, k}, kBf);
  Tensor w = fp8({n, k}, kE4, 10);
  Tensor sw = scales({1, kb}, 11);
  const auto [xq, sx] = quantize_1x128_reference(x);
  Tensor via_fp8 = fp8_blockscale_gemm_sm90(xq, w, sx, sw);
  Tensor out = fp8_blockscale_gemm_sm90(x, w, std::nullopt, sw);
  EXPECT_TRUE(all_close(out, via_fp8, {0.0, 0.0}));
  Tensor wide = Tensor::zeros({m, k + 24}, kBf);
  wide.slice(1, 0, k).copy_(x);
  EXPECT_TRUE(all_close(fp8_blockscale_gemm_sm90(wide.slice(1, 0, k), w, std::nullopt, sw), via_fp8,
                        {0.0, 0.0}));
  // And close to the unquantized product (e4m3 keeps ~2 significant digits).
  const auto swv = dbl(sw);
  auto one = [](int64_t, int64_t) { return 1.0; };
  auto at_w = [&](int64_t, int64_t q2) { return swv[q2]; };
  EXPECT_TRUE(all_close(out, ref_blockscaled(x, w, 1, 128, 128, one, at_w), {0.5, 0.1}));
}

// ---- mm_mxfp8 / bmm_mxfp8 -------------------------------------------------------------------

// Upstream's swizzled scale layouts (docs/GEMM_AND_QUANTIZATION.md), written out independently.
int64_t off128x4(int64_t r, int64_t c, int64_t cols) {
  return (r / 128) * cdiv(cols, 4) * 512 + (c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 +
         c % 4;
}
int64_t off8x4(int64_t r, int64_t c, int64_t cols) {
  return (r / 8) * cdiv(cols, 4) * 32 + (c / 4) * 32 + (r % 8) * 4 + c % 4;
}
Tensor ue8m0_bytes(int64_t n, uint64_t seed) {
  const auto v = dbl(rand_tensor({n}, DType::kFloat32, seed, 120.0, 131.0));
  Tensor t = Tensor::empty({n}, DType::kUInt8);
  for (int64_t i = 0; i < n; ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>(v[i]);
  return t;
}
double ue8m0(uint8_t e) { return std::ldexp(1.0, static_cast<int>(e) - 127); }

// sum_k a[i, k] 2^(ea(i, k/32) - 127) * w[j, k] 2^(eb(j, k/32) - 127) in fp64.
template <class EA, class EB>
std::vector<double> ref_mx(const Tensor& a, const Tensor& w, EA ea, EB eb) {
  const int64_t m = a.size(0), k = a.size(1), n = w.size(0);
  const auto av = dbl(a), wv = dbl(w);
  std::vector<double> out(static_cast<std::size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) {
        acc += av[i * k + kk] * ue8m0(ea(i, kk / 32)) * wv[j * k + kk] * ue8m0(eb(j, kk / 32));
      }
      out[i * n + j] = acc;
    }
  }
  return out;
}

// Scales up to 2^3 on each side: the absolute bound grows with them.
Tolerance mx_tol(DType dt, int64_t k) {
  Tolerance t = gemm_tol(dt, k);
  t.atol *= 64;
  return t;
}

TEST(MmMxfp8, MatchesFp64FormulaOverLayouts) {
  for (auto [m, n, k] : {Gran{1, 128, 128}, Gran{37, 200, 288}, Gran{130, 128, 256}}) {
    const int64_t kc = k / 32;
    Tensor a = fp8({m, k}, kE4, m + 3), w = fp8({n, k}, kE4, n + 4);
    for (const std::string la : {"128x4", "8x4", "linear"}) {
      for (const std::string lb : {"128x4", "linear"}) {
        SCOPED_TRACE(::testing::Message()
                     << m << "x" << n << "x" << k << " a:" << la << " b:" << lb);
        const int64_t a_len =
            la == "8x4" ? cdiv(m, 8) * 8 * cdiv(kc, 4) * 4 : cdiv(m, 128) * 128 * cdiv(kc, 4) * 4;
        Tensor sa = la == "linear" ? ue8m0_bytes(m * kc, 5).view({m, kc}) : ue8m0_bytes(a_len, 5);
        // b's linear scales are [k/32, n] (upstream passes the weight's [n, k/32] transposed).
        Tensor sb = lb == "linear" ? ue8m0_bytes(n * kc, 6).view({n, kc}).transpose(0, 1)
                                   : ue8m0_bytes(cdiv(n, 128) * 128 * cdiv(kc, 4) * 4, 6);
        const uint8_t* pa = static_cast<const uint8_t*>(sa.data_ptr());
        const uint8_t* pb = static_cast<const uint8_t*>(sb.data_ptr());
        auto ea = [&](int64_t r, int64_t c) {
          return la == "linear" ? pa[r * kc + c]
                 : la == "8x4"  ? pa[off8x4(r, c, kc)]
                                : pa[off128x4(r, c, kc)];
        };
        auto eb = [&](int64_t r, int64_t c) {
          return lb == "linear" ? pb[r * kc + c] : pb[off128x4(r, c, kc)];
        };
        const auto ref = ref_mx(a, w, ea, eb);
        for (DType out_dt : {kBf, DType::kFloat16}) {
          Tensor out = mm_mxfp8(a, w.transpose(0, 1), sa, sb, std::nullopt, out_dt, la == "8x4");
          ASSERT_EQ(out.shape(), (Shape{m, n}));
          EXPECT_TRUE(all_close(out, ref, mx_tol(out_dt, k)));
        }
      }
    }
  }
}

// Hand-checked: ones times ones, a's four K blocks scaled 1, 2, 1, 1 and b's by 0.5:
// 32 * (0.5 + 1 + 0.5 + 0.5) = 80.
TEST(MmMxfp8, HandChecked) {
  Tensor a = Tensor::full({1, 128}, 1.0, kE4), w = Tensor::full({128, 128}, 1.0, kE4);
  Tensor sa = Tensor::from_vector({127, 128, 127, 127}, {1, 4}, DType::kUInt8);
  Tensor sb = Tensor::full({4, 128}, 126, DType::kUInt8);
  Tensor out = mm_mxfp8(a, w.transpose(0, 1), sa, sb);
  for (double x : dbl(out)) ASSERT_EQ(x, 80.0);
}

// backend="trtllm" takes trtllm-gen's weight, prepared as upstream's test and vLLM's
// FlashInferTrtllmMxfp8LinearKernel do: shuffle_matrix_a(w, 128) and shuffle_matrix_sf_a of its
// linear scales (num_elts_per_sf=32) flattened, the activation's scales 8x4 or 128x4 (SGLang's).
// The same bits as the plain weight with another backend; the plain weight read as shuffled is
// not; upstream's rules for the backend by name.
TEST(MmMxfp8, TrtllmBackendTakesTheShuffledWeight) {
  const int64_t m = 5, k = 256;
  for (int64_t n : {128, 256}) {
    for (bool a8x4 : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << (a8x4 ? " 8x4" : " 128x4"));
      // The activation's scales as random bytes in its layout (the host quantizer has no 8x4).
      const Tensor qa = fp8({m, k}, kE4, 7);
      const Tensor sfa = ue8m0_bytes((a8x4 ? 8 : 128) * (k / 32), 8);
      Tensor w = Tensor::empty({n, k}, DType::kFloat32).normal_(6).to(kBf);
      auto [qw, sfw] = mxfp8_quantize(w);
      auto [qw_lin, sfw_lin] = mxfp8_quantize(w, false);
      const Tensor plain =
          mm_mxfp8(qa, qw.transpose(0, 1), sfa, sfw, std::nullopt, kBf, a8x4, "cutlass");
      const Tensor w_shuf = shuffle_matrix_a(qw_lin, 128);
      const Tensor sf_shuf = shuffle_matrix_sf_a(sfw_lin.view({n, k / 32}), 128, 32).reshape({-1});
      const Tensor t =
          mm_mxfp8(qa, w_shuf.transpose(0, 1), sfa, sf_shuf, std::nullopt, kBf, a8x4, "trtllm");
      EXPECT_EQ(dbl(t), dbl(plain));
      const Tensor wrong =
          mm_mxfp8(qa, qw.transpose(0, 1), sfa, sfw, std::nullopt, kBf, a8x4, "trtllm");
      EXPECT_NE(dbl(wrong), dbl(plain));
    }
  }
  const int64_t n = 128;
  Tensor qa = fp8({m, k}, kE4, 1), qw = fp8({n, k}, kE4, 2);
  const Tensor sa = ue8m0_bytes(128 * (k / 32), 3), sb = ue8m0_bytes(128 * (k / 32), 4);
  const char* op = "mm_mxfp8";
  EXPECT_FI_ERROR(
      mm_mxfp8(qa, qw.transpose(0, 1), sa, sb, std::nullopt, DType::kFloat16, false, "trtllm"), op,
      "out_dtype");
  EXPECT_FI_ERROR(mm_mxfp8(qa, qw.transpose(0, 1), sa.view({128, k / 32}).slice(0, 0, m), sb,
                           std::nullopt, kBf, false, "trtllm"),
                  op, "a_descale");
  EXPECT_FI_ERROR(mm_mxfp8(qa, qw.transpose(0, 1), sa, sb.view({n, k / 32}).transpose(0, 1),
                           std::nullopt, kBf, false, "trtllm"),
                  op, "b_descale");
  Tensor qa_k = fp8({m, 160}, kE4, 1), qw_k = fp8({n, 160}, kE4, 2);
  EXPECT_FI_ERROR(mm_mxfp8(qa_k, qw_k.transpose(0, 1), ue8m0_bytes(128 * 8, 3),
                           ue8m0_bytes(128 * 8, 4), std::nullopt, kBf, false, "trtllm"),
                  op, "a");
  Tensor qw_n = fp8({144, k}, kE4, 2);
  EXPECT_FI_ERROR(mm_mxfp8(qa, qw_n.transpose(0, 1), sa, ue8m0_bytes(256 * (k / 32), 4),
                           std::nullopt, kBf, false, "trtllm"),
                  op, "b");
}

TEST(BmmMxfp8, MatchesFp64FormulaAndMmMxfp8PerItem) {
  const int64_t nb = 2, m = 3, n = 130, k = 160, kc = k / 32;
  const int64_t ia = cdiv(m, 128) * 128 * cdiv(kc, 4) * 4;
  const int64_t ib = cdiv(n, 128) * 128 * cdiv(kc, 4) * 4;
  for (auto [adt, bdt] : {std::pair{kE4, kE4}, std::pair{kE5, kE4}}) {
    Tensor A = fp8({nb, m, k}, adt, 1), W = fp8({nb, n, k}, bdt, 2);
    Tensor sa = ue8m0_bytes(nb * ia, 3), sb = ue8m0_bytes(nb * ib, 4);
    Tensor out = bmm_mxfp8(A, W.transpose(1, 2), sa, sb, DType::kFloat16);
    ASSERT_EQ(out.shape(), (Shape{nb, m, n}));
    for (int64_t b = 0; b < nb; ++b) {
      SCOPED_TRACE(b);
      const uint8_t* pa = static_cast<const uint8_t*>(sa.data_ptr()) + b * ia;
      const uint8_t* pb = static_cast<const uint8_t*>(sb.data_ptr()) + b * ib;
      auto ea = [&](int64_t r, int64_t c) { return pa[off128x4(r, c, kc)]; };
      auto eb = [&](int64_t r, int64_t c) { return pb[off128x4(r, c, kc)]; };
      EXPECT_TRUE(all_close(out.select(0, b), ref_mx(A.select(0, b), W.select(0, b), ea, eb),
                            mx_tol(DType::kFloat16, k)));
      if (adt == kE4) {
        Tensor one = mm_mxfp8(A.select(0, b), W.select(0, b).transpose(0, 1),
                              sa.slice(0, b * ia, (b + 1) * ia), sb.slice(0, b * ib, (b + 1) * ib),
                              std::nullopt, DType::kFloat16);
        EXPECT_TRUE(all_close(out.select(0, b), one, {0.0, 0.0}));
      }
    }
  }
}

// ---- routergemm ----------------------------------------------------------------------------

// out = mat_a @ mat_b (fp64 formula), mat_b a column-major [K, N] (the transpose of [N, K]).
std::vector<double> ref_mm(const Tensor& a, const Tensor& w_nk, const Tensor* bias = nullptr) {
  const int64_t m = a.size(0), k = a.size(1), n = w_nk.size(0);
  const auto av = dbl(a), wv = dbl(w_nk);
  std::vector<double> bv = bias ? dbl(*bias) : std::vector<double>(static_cast<std::size_t>(n));
  std::vector<double> out(static_cast<std::size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) acc += av[i * k + kk] * wv[j * k + kk];
      out[i * n + j] = acc + bv[j];
    }
  }
  return out;
}

TEST(RouterGemm, ThreeShapesMatchFp64Formula) {
  struct R {
    void (*fn)(const Tensor&, const Tensor&, const Tensor&, bool);
    int64_t k, n;
    DType out_dt;
  };
  for (const R& r :
       {R{mm_M1_16_K7168_N128, 7168, 128, kBf}, R{mm_M1_16_K7168_N256, 7168, 256, DType::kFloat32},
        R{mm_M1_16_K6144_N256, 6144, 256, DType::kFloat32}}) {
    for (int64_t m : {1, 5, 16}) {
      SCOPED_TRACE(::testing::Message() << m << "x" << r.n << "x" << r.k);
      Tensor a = rand_tensor({m, r.k}, kBf, m + 1);
      Tensor w = rand_tensor({r.n, r.k}, kBf, r.n + r.k, -0.05, 0.05);
      Tensor out = Tensor::zeros({m, r.n}, r.out_dt);
      r.fn(a, w.transpose(0, 1), out, true);
      EXPECT_TRUE(all_close(out, ref_mm(a, w), gemm_tol(r.out_dt, r.k)));
    }
  }
}

TEST(TinygemmBf16, MatchesFp64FormulaWithAndWithoutBias) {
  for (auto [m, n, k] : {Gran{1, 16, 64}, Gran{8, 48, 128}, Gran{13, 32, 200}}) {
    Tensor x = rand_tensor({m, k}, kBf, 1), w = rand_tensor({n, k}, kBf, 2);
    Tensor bias = rand_tensor({n}, kBf, 3);
    Tensor out = Tensor::zeros({m, n}, kBf);
    tinygemm_bf16(x, w, out, bias);
    EXPECT_TRUE(all_close(out, ref_mm(x, w, &bias), gemm_tol(kBf, k)));
    tinygemm_bf16(x, w, out);
    EXPECT_TRUE(all_close(out, ref_mm(x, w), gemm_tol(kBf, k)));
  }
  // Hand-checked: [1, 2] . [3, 4] + 0.5 = 11.5 (exact in bf16).
  Tensor out = Tensor::zeros({1, 16}, kBf);
  tinygemm_bf16(Tensor::from_vector({1, 2}, {1, 2}, kBf), Tensor::full({16, 2}, 3.0, kBf), out,
                Tensor::full({16}, 0.5, kBf));
  EXPECT_EQ(dbl(out), std::vector<double>(16, 9.5));
}

TEST(TgvGemmSm100, MatchesFp64FormulaInBf16AndFp16) {
  for (DType dt : {kBf, DType::kFloat16}) {
    for (auto [m, n, k] : {Gran{1, 8, 16}, Gran{7, 33, 70}, Gran{20, 64, 256}}) {
      Tensor a = rand_tensor({m, k}, dt, m + 1), w = rand_tensor({n, k}, dt, n + 2);
      Tensor bias = rand_tensor({n}, dt, 3);
      Tensor out = tgv_gemm_sm100(a, w.transpose(0, 1), bias);
      ASSERT_EQ(out.dtype(), dt);
      EXPECT_TRUE(all_close(out, ref_mm(a, w, &bias), gemm_tol(dt, k)));
    }
  }
  // Hand-checked: [1, 2] . [3, 3] + 0.5 = 9.5.
  Tensor o = Tensor::zeros({1, 4}, kBf);
  tgv_gemm_sm100(Tensor::from_vector({1, 2}, {1, 2}, kBf),
                 Tensor::full({4, 2}, 3.0, kBf).transpose(0, 1), Tensor::full({4}, 0.5, kBf), false,
                 o);
  EXPECT_EQ(dbl(o), std::vector<double>(4, 9.5));
  // No bias (upstream passes None on to its optional bias): [1, 2] . [3, 3] = 9.
  Tensor o2 = tgv_gemm_sm100(Tensor::from_vector({1, 2}, {1, 2}, kBf),
                             Tensor::full({4, 2}, 3.0, kBf).transpose(0, 1), std::nullopt);
  EXPECT_EQ(dbl(o2), std::vector<double>(4, 9.0));
}

// ---- bad input ------------------------------------------------------------------------------

TEST(GemmFp8BadInput, ErrorsNameOpAndArgument) {
  const char* g = "gemm_fp8_nt_groupwise";
  Tensor a = fp8({4, 256}, kE4, 1), b = fp8({8, 256}, kE4, 2);
  Tensor sa = scales({4, 2}, 3), sb = scales({1, 2}, 4);
  EXPECT_FI_ERROR(gemm_fp8_nt_groupwise(a.to(kBf), b, sa, sb, "K"), g, "a");
  EXPECT_FI_ERROR(gemm_fp8_nt_groupwise(a, b.to(kBf), sa, sb, "K"), g, "b");
  EXPECT_FI_ERROR(gemm_fp8_nt_groupwise(a, fp8({8, 128}, kE4, 2), sa, sb, "K"), g, "b");
  EXPECT_FI_ERROR(gemm_fp8_nt_groupwise(a.unsqueeze(0), b, sa, sb, "K"), g, "a");
  EXPECT_FI_ERROR(gemm_fp8_nt_groupwise(a, b, sa, sb), g, "scale_major_mode");  // cutlass
  EXPECT_FI_ERROR(gemm_fp8_nt_groupwise(a, b, sa, sb, "N"), g, "scale_major_mode");
  EXPECT_FI_ERROR(gemm_fp8_nt_groupwise(a, b, sa, sb, "K", 3), g, "mma_sm");
  EXPECT_FI_ERROR(gemm_fp8_nt_groupwise(a, b, sa, sb, "K", 1, {1, 128, 0}), g,
                  "scale_granularity_mnk");
  EXPECT_FI_ERROR(gemm_fp8_nt_groupwise(a, b, sa, sb, "K", 1, {1, 128, 96}), g,
                  "scale_granularity_mnk");
  EXPECT_FI_ERROR(gemm_fp8_nt_groupwise(a, b, sa.transpose(0, 1), sb, "K"), g, "a_scale");
  EXPECT_FI_ERROR(gemm_fp8_nt_groupwise(a, b, sa, sb.to(DType::kFloat16), "K"), g, "b_scale");
  EXPECT_FI_ERROR(gemm_fp8_nt_groupwise(a, b, sa, sb.transpose(0, 1).contiguous(), "K"), g,
                  "b_scale");
  EXPECT_FI_ERROR(
      gemm_fp8_nt_groupwise(a, b, sa, sb, "K", 1, {1, 128, 128}, std::nullopt, DType::kFloat32), g,
      "out_dtype");
  EXPECT_FI_ERROR(
      gemm_fp8_nt_groupwise(a, b, sa, sb, "K", 1, {1, 128, 128}, Tensor::zeros({4, 7}, kBf)), g,
      "out");
  EXPECT_FI_ERROR(gemm_fp8_nt_groupwise(a, b, sa, sb, "K", 1, {1, 128, 128},
                                        Tensor::zeros({4, 8}, DType::kFloat32)),
                  g, "out");
  EXPECT_FI_ERROR(gemm_fp8_nt_groupwise(a, b, sa, sb, "K", 1, {1, 128, 128}, std::nullopt,
                                        std::nullopt, "cublas"),
                  g, "backend");
  // trtllm: granularity, k >= 256, mode.
  Tensor ta = scales({2, 4}, 5);
  EXPECT_FI_ERROR(gemm_fp8_nt_groupwise(a, b, ta, sb, std::nullopt, 1, {1, 64, 128}, std::nullopt,
                                        std::nullopt, "trtllm"),
                  g, "scale_granularity_mnk");
  EXPECT_FI_ERROR(gemm_fp8_nt_groupwise(fp8({4, 128}, kE4, 1), fp8({8, 128}, kE4, 2),
                                        scales({1, 4}, 5), scales({1, 1}, 6), std::nullopt, 1,
                                        {1, 128, 128}, std::nullopt, std::nullopt, "trtllm"),
                  g, "a");
  // trtllm: e4m3 operands of one dtype, bf16 output only (upstream's kernel stores bf16 bits
  // into any output dtype); scale_major_mode is not read ('K' runs like None).
  Tensor a256 = fp8({4, 256}, kE4, 1), b256 = fp8({8, 256}, kE4, 2);
  Tensor ta2 = scales({2, 4}, 5), tb2 = scales({1, 2}, 6);
  EXPECT_TRUE(all_close(gemm_fp8_nt_groupwise(a256, b256, ta2, tb2, "K", 1, {1, 128, 128},
                                              std::nullopt, std::nullopt, "trtllm"),
                        gemm_fp8_nt_groupwise(a256, b256, ta2, tb2, std::nullopt, 1, {1, 128, 128},
                                              std::nullopt, std::nullopt, "trtllm")
                            .to_double_vector(),
                        {0.0, 0.0}));
  EXPECT_FI_ERROR(gemm_fp8_nt_groupwise(a256, b256, ta2, tb2, std::nullopt, 1, {1, 128, 128},
                                        std::nullopt, DType::kFloat16, "trtllm"),
                  g, "out_dtype");
  EXPECT_FI_ERROR(
      gemm_fp8_nt_groupwise(a256, b256, ta2, tb2, std::nullopt, 1, {1, 128, 128},
                            Tensor::zeros({4, 8}, DType::kFloat16), std::nullopt, "trtllm"),
      g, "out");
  EXPECT_FI_ERROR(gemm_fp8_nt_groupwise(a256, fp8({8, 256}, kE5, 2), ta2, tb2, std::nullopt, 1,
                                        {1, 128, 128}, std::nullopt, std::nullopt, "trtllm"),
                  g, "b");
  EXPECT_FI_ERROR(
      gemm_fp8_nt_groupwise(fp8({4, 256}, kE5, 1), fp8({8, 256}, kE5, 2), ta2, tb2, std::nullopt, 1,
                            {1, 128, 128}, std::nullopt, std::nullopt, "trtllm"),
      g, "a");
  // blockscaled: its scale shapes are 128x128 blocks.
  const char* bs = "gemm_fp8_nt_blockscaled";
  EXPECT_FI_ERROR(gemm_fp8_nt_blockscaled(a, b, sa, sb, "K"), bs, "a_scale");
  EXPECT_FI_ERROR(gemm_fp8_nt_blockscaled(a, b, scales({2, 1}, 1), sb, "MN"), bs, "b_scale");
  EXPECT_FI_ERROR(gemm_fp8_nt_blockscaled(a, b, scales({2, 1}, 1), scales({2, 1}, 2), std::nullopt),
                  bs, "scale_major_mode");

  // mm_fp8.
  const char* mf = "mm_fp8";
  Tensor w = fp8({64, 256}, kE4, 7);
  Tensor pw = prepare_low_latency_gemm_weights(w, Value());
  Tensor x = fp8({3, 256}, kE4, 8);
  EXPECT_FI_ERROR(mm_fp8(x.to(kE5), pw), mf, "a");
  EXPECT_FI_ERROR(mm_fp8(x, w), mf, "b");  // not the prepared 3-D layout
  EXPECT_FI_ERROR(mm_fp8(x, pw.to(kE5)), mf, "b");
  EXPECT_FI_ERROR(mm_fp8(fp8({3, 128}, kE4, 8), pw), mf, "b");
  EXPECT_FI_ERROR(mm_fp8(x, pw.slice(1, 0, 48)), mf, "b");  // n not a multiple of 32
  EXPECT_FI_ERROR(mm_fp8(x, pw.transpose(0, 1).contiguous().transpose(0, 1)), mf, "b");
  EXPECT_FI_ERROR(mm_fp8(x, pw, Tensor::zeros({2}, DType::kFloat32)), mf, "alpha");
  EXPECT_FI_ERROR(mm_fp8(x, pw, Tensor::zeros({1}, DType::kFloat64)), mf, "alpha");
  EXPECT_FI_ERROR(mm_fp8(x, pw, std::nullopt, DType::kFloat16), mf, "out_dtype");
  EXPECT_FI_ERROR(mm_fp8(x, pw, std::nullopt, kBf, Tensor::zeros({3, 64}, DType::kFloat16)), mf,
                  "out");
  EXPECT_FI_ERROR(mm_fp8(x, pw, std::nullopt, kBf, Tensor::zeros({3, 63}, kBf)), mf, "out");
  EXPECT_FI_ERROR(mm_fp8(x, pw, std::nullopt, kBf, std::nullopt, "cutlass"), mf, "backend");
  const char* pl = "prepare_low_latency_gemm_weights";
  EXPECT_FI_ERROR(prepare_low_latency_gemm_weights(fp8({48, 256}, kE4, 1), Value()), pl, "w");
  EXPECT_FI_ERROR(prepare_low_latency_gemm_weights(fp8({64, 200}, kE4, 1), Value()), pl, "w");
  EXPECT_FI_ERROR(prepare_low_latency_gemm_weights(w.to(kBf), Value()), pl, "w");
  EXPECT_FI_ERROR(prepare_low_latency_gemm_weights(w.unsqueeze(0), Value()), pl, "w");

  // mm_mxfp8 / bmm_mxfp8.
  const char* mx = "mm_mxfp8";
  Tensor xa = fp8({4, 128}, kE4, 1), xw = fp8({128, 128}, kE4, 2);
  Tensor xb = xw.transpose(0, 1);
  Tensor s4 = Tensor::zeros({512}, DType::kUInt8), s128 = Tensor::zeros({512}, DType::kUInt8);
  EXPECT_NO_THROW(mm_mxfp8(xa, xb, s4, s128));
  EXPECT_FI_ERROR(mm_mxfp8(xa.to(kE5), xb, s4, s128), mx, "a");
  EXPECT_FI_ERROR(mm_mxfp8(xa, xb.to(kE5), s4, s128), mx, "b");
  EXPECT_FI_ERROR(mm_mxfp8(xa, fp8({64, 128}, kE4, 2).transpose(0, 1), s4, s128), mx, "b");
  EXPECT_FI_ERROR(mm_mxfp8(fp8({4, 96}, kE4, 1), fp8({128, 96}, kE4, 2).transpose(0, 1), s4, s128),
                  mx, "b");
  EXPECT_FI_ERROR(mm_mxfp8(xa, fp8({128, 64}, kE4, 2), s4, s128), mx, "b");
  EXPECT_FI_ERROR(mm_mxfp8(xa, xb, Tensor::zeros({511}, DType::kUInt8), s128), mx, "a_descale");
  EXPECT_FI_ERROR(mm_mxfp8(xa, xb, s4.to(DType::kFloat32), s128), mx, "a_descale");
  EXPECT_FI_ERROR(mm_mxfp8(xa, xb, Tensor::zeros({4, 3}, DType::kUInt8), s128), mx, "a_descale");
  EXPECT_FI_ERROR(mm_mxfp8(xa, xb, s4, s128, std::nullopt, kBf, true), mx, "a_descale");
  EXPECT_FI_ERROR(mm_mxfp8(xa, xb, s4, Tensor::zeros({128, 4}, DType::kUInt8)), mx, "b_descale");
  EXPECT_FI_ERROR(mm_mxfp8(xa, xb, s4, Tensor::zeros({2, 1, 256}, DType::kUInt8)), mx, "b_descale");
  EXPECT_FI_ERROR(mm_mxfp8(xa, xb, s4, s128, std::nullopt, DType::kFloat32), mx, "out_dtype");
  EXPECT_FI_ERROR(mm_mxfp8(xa, xb, s4, s128, Tensor::zeros({4, 128}, DType::kFloat16)), mx, "out");
  EXPECT_FI_ERROR(mm_mxfp8(xa, xb, s4, s128, Tensor::zeros({4, 127}, kBf)), mx, "out");
  EXPECT_FI_ERROR(mm_mxfp8(xa, xb, s4, s128, std::nullopt, kBf, false, "cublas"), mx, "backend");
  const char* bmx = "bmm_mxfp8";
  Tensor BA = fp8({2, 4, 128}, kE4, 1), BW = fp8({2, 128, 128}, kE4, 2).transpose(1, 2);
  Tensor bsf = Tensor::zeros({1024}, DType::kUInt8);
  EXPECT_NO_THROW(bmm_mxfp8(BA, BW, bsf, bsf, kBf));
  EXPECT_FI_ERROR(bmm_mxfp8(xa, BW, bsf, bsf, kBf), bmx, "A");
  EXPECT_FI_ERROR(bmm_mxfp8(BA, fp8({3, 128, 128}, kE4, 2).transpose(1, 2), bsf, bsf, kBf), bmx,
                  "B");
  EXPECT_FI_ERROR(bmm_mxfp8(BA, fp8({2, 64, 128}, kE4, 2).transpose(1, 2), bsf, bsf, kBf), bmx,
                  "B");
  EXPECT_FI_ERROR(bmm_mxfp8(BA.to(kBf), BW, bsf, bsf, kBf), bmx, "A");
  EXPECT_FI_ERROR(bmm_mxfp8(BA, BW, bsf.slice(0, 0, 512), bsf, kBf), bmx, "A_scale");
  EXPECT_FI_ERROR(bmm_mxfp8(BA, BW, bsf, bsf.view({2, 512}), kBf), bmx, "B_scale");
  EXPECT_FI_ERROR(bmm_mxfp8(BA, BW, bsf, bsf, DType::kFloat32), bmx, "dtype");
  EXPECT_FI_ERROR(bmm_mxfp8(BA, BW, bsf, bsf, kBf, Tensor::zeros({2, 4, 128}, DType::kFloat16)),
                  bmx, "out");
  EXPECT_FI_ERROR(bmm_mxfp8(BA, BW, bsf, bsf, kBf, std::nullopt, "trtllm"), bmx, "backend");

  // routergemm.
  const char* rg = "mm_M1_16_K7168_N256";
  Tensor ra = Tensor::zeros({4, 7168}, kBf), rw = Tensor::zeros({256, 7168}, kBf);
  Tensor rb = rw.transpose(0, 1), ro = Tensor::zeros({4, 256}, DType::kFloat32);
  EXPECT_NO_THROW(mm_M1_16_K7168_N256(ra, rb, ro));
  EXPECT_FI_ERROR(mm_M1_16_K7168_N256(Tensor::zeros({17, 7168}, kBf), rb,
                                      Tensor::zeros({17, 256}, DType::kFloat32)),
                  rg, "mat_a");
  EXPECT_FI_ERROR(mm_M1_16_K7168_N256(ra, rw.contiguous().view({7168, 256}), ro), rg, "mat_b");
  EXPECT_FI_ERROR(mm_M1_16_K7168_N256(ra.to(DType::kFloat16), rb, ro), rg, "mat_a");
  EXPECT_FI_ERROR(mm_M1_16_K7168_N256(ra, rb, ro.to(kBf)), rg, "out");
  EXPECT_FI_ERROR(mm_M1_16_K7168_N256(ra, rb, Tensor::zeros({4, 255}, DType::kFloat32)), rg, "out");
  EXPECT_FI_ERROR(
      mm_M1_16_K7168_N256(ra, rb, Tensor::zeros({256, 4}, DType::kFloat32).transpose(0, 1)), rg,
      "out");
  EXPECT_FI_ERROR(mm_M1_16_K7168_N128(ra, rb, ro.to(kBf)), "mm_M1_16_K7168_N128", "mat_b");
  EXPECT_FI_ERROR(mm_M1_16_K6144_N256(ra, rb, ro), "mm_M1_16_K6144_N256", "mat_a");
  const char* tg = "tinygemm_bf16";
  Tensor tx = Tensor::zeros({2, 64}, kBf), tw = Tensor::zeros({32, 64}, kBf);
  Tensor to = Tensor::zeros({2, 32}, kBf);
  EXPECT_NO_THROW(tinygemm_bf16(tx, tw, to));
  EXPECT_FI_ERROR(tinygemm_bf16(tx, Tensor::zeros({24, 64}, kBf), Tensor::zeros({2, 24}, kBf)), tg,
                  "weight");
  EXPECT_FI_ERROR(tinygemm_bf16(tx, Tensor::zeros({32, 48}, kBf), to), tg, "weight");
  EXPECT_FI_ERROR(tinygemm_bf16(tx, tw.transpose(0, 1), to), tg, "weight");
  EXPECT_FI_ERROR(tinygemm_bf16(tx.to(DType::kFloat16), tw, to), tg, "input");
  EXPECT_FI_ERROR(tinygemm_bf16(tx, tw, Tensor::zeros({2, 32}, DType::kFloat32)), tg, "out");
  EXPECT_FI_ERROR(tinygemm_bf16(tx, tw, Tensor::zeros({3, 32}, kBf)), tg, "out");
  EXPECT_FI_ERROR(tinygemm_bf16(tx, tw, to, Tensor::zeros({16}, kBf)), tg, "bias");
  EXPECT_FI_ERROR(tinygemm_bf16(tx, tw, to, Tensor::zeros({32}, DType::kFloat32)), tg, "bias");

  // tgv_gemm_sm100.
  const char* tv = "tgv_gemm_sm100";
  Tensor va = Tensor::zeros({2, 16}, kBf), vb = Tensor::zeros({8, 16}, kBf).transpose(0, 1);
  Tensor vbias = Tensor::zeros({8}, kBf);
  EXPECT_NO_THROW(tgv_gemm_sm100(va, vb, vbias));
  EXPECT_FI_ERROR(tgv_gemm_sm100(va.to(DType::kFloat32), vb, vbias), tv, "a");
  EXPECT_FI_ERROR(tgv_gemm_sm100(va, vb.to(DType::kFloat16), vbias), tv, "b");
  EXPECT_FI_ERROR(tgv_gemm_sm100(va, Tensor::zeros({16, 8}, kBf), vbias), tv, "b");
  EXPECT_FI_ERROR(tgv_gemm_sm100(va, Tensor::zeros({8, 12}, kBf).transpose(0, 1), vbias), tv, "b");
  EXPECT_FI_ERROR(tgv_gemm_sm100(va, vb, Tensor::zeros({7}, kBf)), tv, "bias");
  EXPECT_FI_ERROR(tgv_gemm_sm100(va, vb, vbias.to(DType::kFloat16)), tv, "bias");
  EXPECT_FI_ERROR(tgv_gemm_sm100(va, vb, vbias, false, Tensor::zeros({2, 8}, DType::kFloat16)), tv,
                  "out");
  EXPECT_FI_ERROR(tgv_gemm_sm100(va, vb, vbias, false, Tensor::zeros({2, 7}, kBf)), tv, "out");

  // fp8_blockscale_gemm_sm90.
  const char* s9 = "fp8_blockscale_gemm_sm90";
  Tensor in = fp8({3, 256}, kE4, 1), wt = fp8({64, 256}, kE4, 2);
  Tensor si = scales({3, 2}, 3), sw = scales({1, 2}, 4);
  EXPECT_FI_ERROR(fp8_blockscale_gemm_sm90(in, wt, std::nullopt, sw), s9, "input_scale");
  EXPECT_FI_ERROR(fp8_blockscale_gemm_sm90(in, wt, scales({2, 3}, 3), sw), s9, "input_scale");
  EXPECT_FI_ERROR(fp8_blockscale_gemm_sm90(in, wt, si, std::nullopt), s9, "weight_scale");
  EXPECT_FI_ERROR(fp8_blockscale_gemm_sm90(in, wt, si, scales({2, 2}, 4)), s9, "weight_scale");
  EXPECT_FI_ERROR(fp8_blockscale_gemm_sm90(in, wt.to(kBf), si), s9, "weight");
  EXPECT_FI_ERROR(fp8_blockscale_gemm_sm90(in.to(kBf), wt, si, sw), s9, "input_scale");
  EXPECT_FI_ERROR(fp8_blockscale_gemm_sm90(in.to(kBf), wt.to(kBf)), s9, "weight");
  EXPECT_FI_ERROR(fp8_blockscale_gemm_sm90(fp8({3, 200}, kE4, 1), fp8({64, 200}, kE4, 2), si, sw),
                  s9, "input");
  EXPECT_FI_ERROR(fp8_blockscale_gemm_sm90(in, fp8({48, 256}, kE4, 2), si, sw), s9, "weight");
  EXPECT_FI_ERROR(fp8_blockscale_gemm_sm90(in, fp8({64, 128}, kE4, 2), si, sw), s9, "weight");
  EXPECT_FI_ERROR(fp8_blockscale_gemm_sm90(in.to(kE5), wt, si, sw), s9, "input");
  EXPECT_FI_ERROR(fp8_blockscale_gemm_sm90(in, wt, si, sw, std::nullopt, DType::kFloat32), s9,
                  "out_dtype");
  EXPECT_FI_ERROR(
      fp8_blockscale_gemm_sm90(in, wt, si, sw, Tensor::zeros({3, 64}, kBf), DType::kFloat16), s9,
      "out");
  EXPECT_FI_ERROR(fp8_blockscale_gemm_sm90(in, wt, si, sw, Tensor::zeros({3, 32}, kBf)), s9, "out");
}

// ---- declarations, backends ------------------------------------------------------------------

TEST(GemmFp8Decl, SignaturesModulesAndBackends) {
  const std::vector<std::tuple<std::string, std::string, std::string>> expected = {
      {"gemm_fp8_nt_groupwise", "flashinfer.gemm.gemm_base",
       "(a, b, a_scale, b_scale, scale_major_mode=None, mma_sm=1, scale_granularity_mnk=(1, 128, "
       "128), out=None, out_dtype=None, backend='cutlass')"},
      {"gemm_fp8_nt_blockscaled", "flashinfer.gemm.gemm_base",
       "(a, b, a_scale, b_scale, scale_major_mode='MN', mma_sm=1, out=None, out_dtype=None)"},
      {"mm_fp8", "flashinfer.gemm.gemm_base",
       "(a, b, alpha=None, out_dtype=torch.bfloat16, out=None, backend='trtllm_low_latency')"},
      {"fp8_blockscale_gemm_sm90", "flashinfer.gemm.gemm_base",
       "(input, weight, input_scale=None, weight_scale=None, out=None, out_dtype=None)"},
      {"prepare_low_latency_gemm_weights", "flashinfer.trtllm_low_latency_gemm",
       "(w, permutation_indices_cache)"},
      {"mm_mxfp8", "flashinfer.gemm.gemm_base",
       "(a, b, a_descale, b_descale, out=None, out_dtype=torch.bfloat16, use_8x4_sf_layout=False, "
       "backend='auto', *, batch_invariant=False)"},
      {"bmm_mxfp8", "flashinfer.gemm.gemm_base",
       "(A, B, A_scale, B_scale, dtype, out=None, backend='auto')"},
      {"mm_M1_16_K7168_N128", "flashinfer.gemm.routergemm",
       "(mat_a, mat_b, out, launch_with_pdl=True)"},
      {"mm_M1_16_K7168_N256", "flashinfer.gemm.routergemm",
       "(mat_a, mat_b, out, launch_with_pdl=True)"},
      {"mm_M1_16_K6144_N256", "flashinfer.gemm.routergemm",
       "(mat_a, mat_b, out, launch_with_pdl=True)"},
      {"tinygemm_bf16", "flashinfer.gemm.routergemm",
       "(input, weight, out, bias=None, use_pdl=False)"},
      {"tgv_gemm_sm100", "flashinfer.gemm.gemm_base", "(a, b, bias, pdl=False, out=None)"},
  };
  for (const auto& [name, module, sig] : expected) {
    const OpDecl* d = OpRegistry::global().find(name);
    ASSERT_NE(d, nullptr) << name;
    EXPECT_EQ(d->module, module) << name;
    EXPECT_EQ(d->signature(), sig) << name;
  }
  EXPECT_EQ(backend_requirement("gemm_fp8_nt_groupwise").default_backend, "cutlass");
  EXPECT_EQ(backend_requirement("mm_fp8").default_backend, "trtllm_low_latency");
  // Both devices (the CUDA entry reuses the block-scaled GEMM kernel).
  EXPECT_EQ(op_has_backend("fp8_blockscale_gemm_sm90", DeviceType::kCUDA), cuda_compiled());
  EXPECT_TRUE(op_has_backend("fp8_blockscale_gemm_sm90", DeviceType::kCPU));
  EXPECT_EQ(op_has_backend("gemm_fp8_nt_groupwise", DeviceType::kCUDA), cuda_compiled());
  if (cuda_compiled()) {
    // The tiled kernel (mm_fp8: cuBLASLt or the tiled kernel) serves each op's default name
    // only, on the GPUs upstream lists for it: Blackwell, not Hopper or Ampere.
    const BackendRequirement& gw = backend_requirement("gemm_fp8_nt_groupwise");
    EXPECT_TRUE(gw.is_backend_supported("cutlass", 100));
    EXPECT_TRUE(gw.is_backend_supported("cutlass", 121));
    EXPECT_FALSE(gw.is_backend_supported("cutlass", 90));
    EXPECT_FALSE(gw.is_backend_supported("cutlass", 110));
    EXPECT_FALSE(gw.is_backend_supported("trtllm", 100));  // not in this build
    const BackendRequirement& ll = backend_requirement("mm_fp8");
    for (int cc : {100, 103, 107}) EXPECT_TRUE(ll.is_backend_supported("trtllm_low_latency", cc));
    for (int cc : {80, 89, 90, 110, 120}) {
      EXPECT_FALSE(ll.is_backend_supported("trtllm_low_latency", cc)) << cc;
    }
    EXPECT_TRUE(backend_requirement("mm_mxfp8").is_backend_supported("auto", 100));
    EXPECT_FALSE(backend_requirement("mm_mxfp8").is_backend_supported("auto", 90));
    EXPECT_FALSE(backend_requirement("mm_mxfp8").is_backend_supported("cudnn", 100));
    EXPECT_TRUE(backend_requirement("bmm_mxfp8").is_backend_supported("auto", 110));
    EXPECT_FALSE(backend_requirement("bmm_mxfp8").is_backend_supported("auto", 90));
  }
  // Upstream's texts for what it refuses on Hopper (docs/CONFORMANCE.md).
  EXPECT_EQ(upstream_backend_refusal("gemm_fp8_nt_groupwise", "cutlass", 90),
            "gemm_fp8_nt_groupwise does not support backend 'cutlass' with capability 90");
  EXPECT_EQ(upstream_backend_refusal("mm_fp8", "trtllm_low_latency", 90),
            "mm_fp8 does not support backend 'trtllm_low_latency' with capability 90");
  EXPECT_EQ(upstream_backend_refusal("mm_mxfp8", "auto", 90),
            "No suitable auto backends found for mm_mxfp8");
  EXPECT_EQ(upstream_backend_refusal("bmm_mxfp8", "auto", 100), "");
  EXPECT_EQ(upstream_refusal("gemm_fp8_nt_blockscaled", 90),
            "gemm_fp8_nt_blockscaled does not support compute capability 90");
  EXPECT_EQ(upstream_refusal("gemm_fp8_nt_blockscaled", 120), "");
  EXPECT_EQ(upstream_refusal("tgv_gemm_sm100", 90), "TGV GEMM requires SM100, SM103 architecture");
  EXPECT_EQ(upstream_refusal("tgv_gemm_sm100", 103), "");
  EXPECT_EQ(upstream_refusal("mm_M1_16_K7168_N256", 90),
            "mm_M1_16_K7168_N256 does not support compute capability 90");
  EXPECT_EQ(upstream_refusal("mm_M1_16_K6144_N256", 107), "");
  EXPECT_EQ(upstream_refusal("tinygemm_bf16", 90), "");
  EXPECT_EQ(upstream_refusal("tinygemm_bf16", 89),
            "tinygemm_bf16 does not support compute capability 89");
  EXPECT_EQ(upstream_refusal("fp8_blockscale_gemm_sm90", 100),
            "fp8_blockscale_gemm_sm90 is only supported on SM90 (Hopper) architecture.");
  EXPECT_EQ(upstream_refusal("fp8_blockscale_gemm_sm90", 90), "");
  // The recorded tuple default rebuilds: a list value binds too.
  const OpDecl* d = OpRegistry::global().find("gemm_fp8_nt_groupwise");
  Tensor a = fp8({2, 128}, kE4, 1), b = fp8({4, 128}, kE4, 2);
  Tensor sa = scales({2, 1}, 3), sb = scales({1, 1}, 4);
  Value r = d->invoke(CallArgs(
      *d, bind_arguments(
              *d, {Value(a), Value(b), Value(sa), Value(sb), Value("K")},
              {{"scale_granularity_mnk",
                Value::list({Value(int64_t{1}), Value(int64_t{128}), Value(int64_t{128})})}})));
  EXPECT_TRUE(all_close(r.as_tensor(), gemm_fp8_nt_groupwise(a, b, sa, sb, "K"), {0.0, 0.0}));
  EXPECT_FI_ERROR(
      d->invoke(CallArgs(
          *d, bind_arguments(*d, {Value(a), Value(b), Value(sa), Value(sb), Value("K")},
                             {{"scale_granularity_mnk", Value::list({Value(int64_t{1})})}}))),
      "gemm_fp8_nt_groupwise", "scale_granularity_mnk");
}

// ---- the cuBLASLt routes of the block-scaled GEMMs (host logic, kernels/cublaslt_plan.h) ----

namespace lt = kernels::lt;
using kernels::BlockScaledGemmParams;

// Stand-in device addresses: 256-byte aligned unless offset.
const void* addr(std::uintptr_t a) { return reinterpret_cast<const void*>(a); }

// mm_fp8's parameter block as the API fills it (x [m, k] e4m3, the prepared [k/128, n, 128]
// weight, alpha, bf16 out).
BlockScaledGemmParams mm_fp8_params(int64_t m, int64_t n, int64_t k) {
  BlockScaledGemmParams p;
  p.a = addr(0x10000);
  p.a_stride_m = k;
  p.b = addr(0x20000);
  p.b_low_latency = true;
  p.gk = k;
  static const float alpha = 1.0f;
  p.alpha = &alpha;
  p.out = const_cast<void*>(addr(0x30000));
  p.out_stride_m = n;
  p.m = m;
  p.n = n;
  p.k = k;
  return p;
}

// fp8_blockscale_gemm_sm90's: 1x128 input scales [m, k/128], weight scales per 128x128 block
// ([n/128, k/128], gn 128) or per row ([n, k/128], gn 1).
BlockScaledGemmParams sm90_params(int64_t m, int64_t n, int64_t k, int64_t gn) {
  BlockScaledGemmParams p;
  p.a = addr(0x10000);
  p.a_stride_m = k;
  p.b = addr(0x20000);
  p.b_stride_n = k;
  static const float sx[1] = {}, sw[1] = {};
  p.a_scale = sx;
  p.sa_stride_m = k / 128;
  p.sa_stride_k = 1;
  p.b_scale = sw;
  p.sb_stride_n = k / 128;
  p.sb_stride_k = 1;
  p.gm = 1;
  p.gn = gn;
  p.gk = 128;
  p.out = const_cast<void*>(addr(0x30000));
  p.out_stride_m = n;
  p.m = m;
  p.n = n;
  p.k = k;
  return p;
}

TEST(GemmFp8CublasLtRoute, MmFp8TakesCublasLtFromSm89WhereTheShapeAllows) {
  BlockScaledGemmParams p = mm_fp8_params(5, 64, 384);
  for (int cc : {89, 90, 100, 103, 120}) {
    const lt::Fp8Route r = lt::fp8_route(p, cc);
    EXPECT_EQ(r.path, lt::Fp8Path::kLtTensor) << cc << " " << (r.why ? r.why : "");
    EXPECT_EQ(r.scale, lt::ScaleMode::kTensorScales);
  }
  EXPECT_STREQ(lt::fp8_route(p, 86).why, "no FP8 tensor cores before sm89");
  p.alpha = nullptr;
  EXPECT_EQ(lt::fp8_route(p, 100).scale, lt::ScaleMode::kNone);
  // The dense weight copy's row stride is k; it lives in scratch (256-byte aligned).
  const lt::RowMajorGemm g = lt::fp8_row_major(p);
  EXPECT_EQ(g.ldw, 384);
  EXPECT_EQ(g.w_addr, 0u);
  const auto tiled = [](const BlockScaledGemmParams& q, int cc) {
    const lt::Fp8Route r = lt::fp8_route(q, cc);
    EXPECT_NE(r.why, nullptr);
    return r.path == lt::Fp8Path::kTiled;
  };
  BlockScaledGemmParams q = mm_fp8_params(5, 64, 384);
  q.a_stride_m = 392;  // a row stride of 392 bytes: not a multiple of 16
  EXPECT_TRUE(tiled(q, 100));
  q = mm_fp8_params(5, 64, 384);
  q.a = addr(0x10008);  // x not 16-byte aligned
  EXPECT_TRUE(tiled(q, 100));
  q = mm_fp8_params(5, 64, 384);
  q.b = addr(0x20008);  // the prepared weight not 16-byte aligned: no 16-byte copy
  EXPECT_TRUE(tiled(q, 100));
  q = mm_fp8_params(5, 64, 384);
  q.out_stride_m = 68;  // out rows of 136 bytes
  EXPECT_TRUE(tiled(q, 100));
  q = mm_fp8_params(5, 64, 384);
  q.out_dtype = DType::kFloat32;
  EXPECT_TRUE(tiled(q, 100));
  q = mm_fp8_params(5, 64, 384);
  q.a_dtype = q.b_dtype = kE5;
  EXPECT_STREQ(lt::fp8_route(q, 100).why, "cuBLASLt has no e5m2 x e5m2 GEMM");
  q = mm_fp8_params(5, 64, 384);
  q.a_dtype = q.b_dtype = kBf;  // the router GEMMs share the kernel table entry
  EXPECT_STREQ(lt::fp8_route(q, 100).why, "not an FP8 x FP8 problem");
}

TEST(GemmFp8CublasLtRoute, BlockScalesTakeCublasLtOnHopperOnly) {
  // 128x128 weight scales: k / 128 must be a multiple of 4 (the scale rows' padding).
  BlockScaledGemmParams p = sm90_params(8, 192, 1024, 128);
  lt::Fp8Route r = lt::fp8_route(p, 90);
  EXPECT_EQ(r.path, lt::Fp8Path::kLtBlock) << (r.why ? r.why : "");
  EXPECT_EQ(r.scale, lt::ScaleMode::kBlockW128x128);
  for (int cc : {89, 100, 103, 120}) {
    EXPECT_STREQ(lt::fp8_route(p, cc).why,
                 "cuBLASLt's 1x128 / 128x128 FP8 block scaling is Hopper's")
        << cc;
  }
  EXPECT_STREQ(lt::fp8_route(sm90_params(8, 192, 384, 128), 90).why,
               "128x128 weight scales need k to be a multiple of 512 here");
  // m not a multiple of 4: x's scale columns would not be whole 16-byte units (cuBLASLt's
  // heuristic refuses those); either weight granularity.
  for (int64_t m : {1, 2, 3, 5, 6, 7, 9, 130}) {
    for (int64_t gn : {1, 128}) {
      EXPECT_STREQ(lt::fp8_route(sm90_params(m, 192, 1024, gn), 90).why,
                   "cuBLASLt's 1x128 activation scales need m to be a multiple of 4")
          << m << " " << gn;
    }
  }
  for (int64_t m : {4, 8, 24, 128, 132}) {
    EXPECT_EQ(lt::fp8_route(sm90_params(m, 192, 1024, 1), 90).path, lt::Fp8Path::kLtBlock) << m;
  }
  // Per-row (1x128) weight scales: any k multiple of 128.
  r = lt::fp8_route(sm90_params(4, 64, 384, 1), 90);
  EXPECT_EQ(r.path, lt::Fp8Path::kLtBlock) << (r.why ? r.why : "");
  EXPECT_EQ(r.scale, lt::ScaleMode::kBlockW1x128);
  // Other granularities, MX scales, alpha, a batch: the tiled kernel.
  BlockScaledGemmParams q = sm90_params(8, 192, 1024, 128);
  q.gm = 128;  // gemm_fp8_nt_blockscaled's activation blocks
  EXPECT_EQ(lt::fp8_route(q, 90).path, lt::Fp8Path::kTiled);
  q = sm90_params(8, 192, 1024, 128);
  q.gk = 64;
  EXPECT_EQ(lt::fp8_route(q, 90).path, lt::Fp8Path::kTiled);
  q = sm90_params(8, 192, 1024, 128);
  static const uint8_t mx[1] = {};
  q.a_mx = mx;
  EXPECT_EQ(lt::fp8_route(q, 90).path, lt::Fp8Path::kTiled);
  q = sm90_params(8, 192, 1024, 128);
  static const float alpha = 2.0f;
  q.alpha = &alpha;
  EXPECT_EQ(lt::fp8_route(q, 90).path, lt::Fp8Path::kTiled);
  q = sm90_params(8, 192, 1024, 128);
  q.batch = 2;
  EXPECT_EQ(lt::fp8_route(q, 90).path, lt::Fp8Path::kTiled);
  q = sm90_params(8, 40, 1024, 128);  // n = 40: cuBLASLt FP8 wants a multiple of 16
  EXPECT_STREQ(lt::fp8_route(q, 90).why, "outside cuBLASLt's FP8 rules");
  q = sm90_params(8, 192, 1024, 128);
  q.b_stride_k = 2;
  EXPECT_EQ(lt::fp8_route(q, 90).path, lt::Fp8Path::kTiled);
}

// cuBLASLt's answers: success with an algorithm serves; NOT_SUPPORTED (15), INVALID_VALUE (7)
// or a heuristic without an algorithm refuse (block_scaled_gemm_lt then declines and the tiled
// kernel runs); any other status fails.
TEST(GemmFp8CublasLtRoute, RefusalsAreNotSupportedInvalidValueOrNoAlgorithm) {
  EXPECT_EQ(lt::lt_answer(0), lt::LtAnswer::kServes);
  EXPECT_EQ(lt::lt_answer(0, true), lt::LtAnswer::kServes);
  EXPECT_EQ(lt::lt_answer(0, false), lt::LtAnswer::kRefuses);
  EXPECT_EQ(lt::lt_answer(7), lt::LtAnswer::kRefuses);   // CUBLAS_STATUS_INVALID_VALUE
  EXPECT_EQ(lt::lt_answer(15), lt::LtAnswer::kRefuses);  // CUBLAS_STATUS_NOT_SUPPORTED
  EXPECT_EQ(lt::lt_answer(7, false), lt::LtAnswer::kRefuses);
  for (int st : {1, 3, 8, 11, 13, 14, 16}) {  // not initialized, alloc, arch, mapping, exec, ...
    EXPECT_EQ(lt::lt_answer(st), lt::LtAnswer::kFails) << st;
    EXPECT_EQ(lt::lt_answer(st, false), lt::LtAnswer::kFails) << st;
  }
}

// The un-shuffle kernel's source offsets invert prepare_low_latency_gemm_weights: reading the
// prepared bytes at low_latency_offset(j, kk) gives back w[j, kk], and every 16-byte chunk the
// kernel copies stays inside one 128-wide block (contiguous in the prepared layout).
TEST(GemmFp8CublasLtRoute, UnshuffleOffsetsInvertThePreparedLayout) {
  const int64_t n = 96, k = 384;
  Tensor w = fp8({n, k}, kE4, 70);
  Tensor pw = prepare_low_latency_gemm_weights(w, Value());
  const auto* src = static_cast<const uint8_t*>(pw.data_ptr());
  const auto* want = static_cast<const uint8_t*>(w.data_ptr());
  int64_t wrong = 0;
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t kk = 0; kk < k; ++kk) {
      wrong += src[lt::low_latency_offset(j, kk, n)] != want[j * k + kk];
    }
    for (int64_t c = 0; c < k; c += 16) {
      EXPECT_EQ(lt::low_latency_offset(j, c + 15, n), lt::low_latency_offset(j, c, n) + 15);
    }
  }
  EXPECT_EQ(wrong, 0);
}

// cuBLASLt's scale layouts: VEC128 column-major [rows, kblocks], BLK128x128 row-major [row
// blocks, kblocks]; each a bijection onto [0, rows * kblocks).
TEST(GemmFp8CublasLtRoute, ScaleLayoutsAndScratch) {
  using L = lt::BlockScaleLayout;
  EXPECT_EQ(lt::block_scale_index(L::kVec128, 3, 2, 5, 4), 13);
  EXPECT_EQ(lt::block_scale_index(L::kVec128, 0, 1, 5, 4), 5);
  EXPECT_EQ(lt::block_scale_index(L::kBlk128x128, 1, 2, 2, 4), 6);
  EXPECT_EQ(lt::block_scale_index(L::kBlk128x128, 0, 3, 2, 4), 3);
  for (L l : {L::kVec128, L::kBlk128x128}) {
    const int64_t rows = 5, kb = 4;
    std::vector<int> hit(rows * kb, 0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t q = 0; q < kb; ++q) {
        const int64_t i = lt::block_scale_index(l, r, q, rows, kb);
        ASSERT_GE(i, 0);
        ASSERT_LT(i, rows * kb);
        ++hit[static_cast<std::size_t>(i)];
      }
    }
    EXPECT_EQ(std::count(hit.begin(), hit.end(), 1), rows * kb);
  }
  // Scratch: mm_fp8's dense weight; the block path's two scale tensors, each 256-aligned.
  EXPECT_EQ(lt::fp8_scratch_bytes(mm_fp8_params(5, 64, 384), lt::Fp8Path::kLtTensor), 24576u);
  EXPECT_EQ(lt::fp8_scratch_bytes(sm90_params(5, 192, 512, 128), lt::Fp8Path::kLtBlock),
            256u + 256u);
  EXPECT_EQ(lt::fp8_scratch_bytes(sm90_params(5, 192, 512, 1), lt::Fp8Path::kLtBlock),
            256u + 3072u);
  EXPECT_EQ(lt::fp8_scratch_bytes(sm90_params(5, 192, 512, 1), lt::Fp8Path::kTiled), 0u);
  // The two weight-scale modes are different plans.
  const lt::RowMajorGemm g = lt::fp8_row_major(sm90_params(5, 192, 512, 128));
  EXPECT_FALSE(lt::make_key(0, g, false, kBf, lt::ScaleMode::kBlockW1x128, 1 << 25) ==
               lt::make_key(0, g, false, kBf, lt::ScaleMode::kBlockW128x128, 1 << 25));
}

// ---- record and replay ------------------------------------------------------------------------

void run_every_op() {
  Tensor a = fp8({5, 256}, kE4, 1), b = fp8({64, 256}, kE4, 2);
  (void)gemm_fp8_nt_groupwise(a, b, scales({5, 2}, 3), scales({1, 2}, 4), "K");
  (void)gemm_fp8_nt_blockscaled(a, b, scales({2, 1}, 5), scales({2, 1}, 6));
  Tensor pw = prepare_low_latency_gemm_weights(b, Value());
  Tensor out = Tensor::zeros({5, 64}, kBf);
  (void)mm_fp8(a, pw, Tensor::full({1}, 0.5, DType::kFloat32), kBf, out);
  (void)fp8_blockscale_gemm_sm90(rand_tensor({5, 256}, kBf, 7), b, std::nullopt, scales({1, 2}, 8));
  Tensor w = fp8({128, 256}, kE4, 9);
  (void)mm_mxfp8(a, w.transpose(0, 1), ue8m0_bytes(128 * 8, 10), ue8m0_bytes(128 * 8, 11),
                 std::nullopt, DType::kFloat16);
  (void)bmm_mxfp8(a.unsqueeze(0), w.unsqueeze(0).transpose(1, 2), ue8m0_bytes(128 * 8, 12),
                  ue8m0_bytes(128 * 8, 13), kBf);
  Tensor ra = rand_tensor({3, 6144}, kBf, 14), rw = rand_tensor({256, 6144}, kBf, 15);
  mm_M1_16_K6144_N256(ra, rw.transpose(0, 1), Tensor::zeros({3, 256}, DType::kFloat32));
  tinygemm_bf16(rand_tensor({2, 64}, kBf, 16), rand_tensor({32, 64}, kBf, 17),
                Tensor::zeros({2, 32}, kBf), rand_tensor({32}, kBf, 18));
  (void)tgv_gemm_sm100(rand_tensor({3, 32}, DType::kFloat16, 19),
                       rand_tensor({16, 32}, DType::kFloat16, 20).transpose(0, 1),
                       rand_tensor({16}, DType::kFloat16, 21));
}

TEST(GemmFp8, RecordAndReplay) {
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    run_every_op();
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 10u);
  for (const auto& c : calls) {
    SCOPED_TRACE(c.name);
    // The live replay clones inputs contiguous, which a column-major b (the router's mat_b,
    // tgv's b) refuses;
    // the dump replay below keeps strides and covers it.
    if (c.name == "mm_M1_16_K6144_N256" || c.name == "tgv_gemm_sm100") continue;
    EXPECT_TRUE(replays_identically(c));
  }
}

// Through dump directories in upstream's format, as `flashinfer replay` reads them.
TEST(GemmFp8, DumpReplayPasses) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_fp8gemm_rec_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg, [](const std::string&) {});
  run_every_op();
  recorder::stop();
  std::vector<fs::path> calls;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory()) calls.push_back(e.path());
  }
  ASSERT_EQ(calls.size(), 10u);
  for (const auto& c : calls) {
    const replay::Result r = replay::replay_from_dump(c.string());
    EXPECT_EQ(r.status, replay::Status::kPassed) << c << ": " << r.error;
  }
  fs::remove_all(dir);
}

// ---- CUDA vs the CPU reference -----------------------------------------------------------------

// A GPU call either matches the CPU reference within `t` or, where upstream refuses the op on
// this GPU (`refusal`, upstream's text, non-empty), is refused with that text (kUnsupported,
// naming the op): the replay then falls back to the CPU.
void expect_cuda(const std::string& op, const std::string& refusal,
                 const std::function<Tensor()>& gpu, const Tensor& cpu, Tolerance t) {
  SCOPED_TRACE(op);
  if (refusal.empty()) {
    EXPECT_TRUE(all_close(gpu().to(Device::cpu()), cpu, t));
    return;
  }
  try {
    gpu();
    ADD_FAILURE() << op << " ran; upstream refuses it here: " << refusal;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_EQ(e.op(), op) << e.what();
    EXPECT_NE(std::string(e.what()).find(refusal), std::string::npos) << e.what();
  }
}

TEST(GemmFp8Cuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int cc = api::compute_capability(g);
  Tensor a = fp8({33, 384}, kE4, 1), b = fp8({150, 384}, kE5, 2);
  Tensor sa = scales({3, 33}, 3), sb = scales({3, 2}, 4);
  expect_cuda(
      "gemm_fp8_nt_groupwise", upstream_backend_refusal("gemm_fp8_nt_groupwise", "cutlass", cc),
      [&] { return gemm_fp8_nt_groupwise(a.to(g), b.to(g), sa.to(g), sb.to(g), "MN"); },
      gemm_fp8_nt_groupwise(a, b, sa, sb, "MN"), default_tolerance(kBf));
  Tensor ba = fp8({33, 512}, kE4, 21), bb = fp8({150, 512}, kE4, 22);
  Tensor bsa = scales({4, 1}, 23), bsb = scales({4, 2}, 24);
  expect_cuda(
      "gemm_fp8_nt_blockscaled", upstream_refusal("gemm_fp8_nt_blockscaled", cc),
      [&] { return gemm_fp8_nt_blockscaled(ba.to(g), bb.to(g), bsa.to(g), bsb.to(g)); },
      gemm_fp8_nt_blockscaled(ba, bb, bsa, bsb), default_tolerance(kBf));
  // mm_fp8 (cuBLASLt where it runs; GemmFp8CublasLtCuda checks the bound of that path).
  Tensor w = fp8({64, 384}, kE4, 5);
  Tensor pw = prepare_low_latency_gemm_weights(w, Value());
  Tensor alpha = Tensor::full({1}, 0.25, DType::kFloat32);
  expect_cuda(
      "mm_fp8", upstream_backend_refusal("mm_fp8", "trtllm_low_latency", cc),
      [&] {
        return mm_fp8(a.to(g), prepare_low_latency_gemm_weights(w.to(g), Value()), alpha.to(g));
      },
      mm_fp8(a, pw, alpha), default_tolerance(kBf));
  Tensor w2 = fp8({130, 384}, kE4, 6);
  Tensor mxa = ue8m0_bytes(128 * 12, 8), mxb = ue8m0_bytes(256 * 12, 9);
  expect_cuda(
      "mm_mxfp8", upstream_backend_refusal("mm_mxfp8", "auto", cc),
      [&] { return mm_mxfp8(a.to(g), w2.to(g).transpose(0, 1), mxa.to(g), mxb.to(g)); },
      mm_mxfp8(a, w2.transpose(0, 1), mxa, mxb), default_tolerance(kBf));
  expect_cuda(
      "bmm_mxfp8", upstream_backend_refusal("bmm_mxfp8", "auto", cc),
      [&] {
        return bmm_mxfp8(a.to(g).unsqueeze(0), w2.to(g).unsqueeze(0).transpose(1, 2), mxa.to(g),
                         mxb.to(g), kBf);
      },
      bmm_mxfp8(a.unsqueeze(0), w2.unsqueeze(0).transpose(1, 2), mxa, mxb, kBf),
      default_tolerance(kBf));
  Tensor ra = rand_tensor({5, 7168}, kBf, 10), rw = rand_tensor({256, 7168}, kBf, 11);
  Tensor rc = Tensor::zeros({5, 256}, DType::kFloat32);
  mm_M1_16_K7168_N256(ra, rw.transpose(0, 1), rc);
  expect_cuda("mm_M1_16_K7168_N256", upstream_refusal("mm_M1_16_K7168_N256", cc),
              [&] {
                Tensor rg = Tensor::zeros({5, 256}, DType::kFloat32).to(g);
                mm_M1_16_K7168_N256(ra.to(g), rw.to(g).transpose(0, 1), rg);
                return rg;
              },
              rc, {1e-4, 1e-4});
  Tensor tb = rand_tensor({256}, kBf, 12), tc = Tensor::zeros({5, 256}, kBf);
  tinygemm_bf16(ra, rw, tc, tb);
  expect_cuda(
      "tinygemm_bf16", upstream_refusal("tinygemm_bf16", cc),
      [&] {
        Tensor tgpu = Tensor::zeros({5, 256}, kBf).to(g);
        tinygemm_bf16(ra.to(g), rw.to(g), tgpu, tb.to(g));
        return tgpu;
      },
      tc, default_tolerance(kBf));
  // Hopper's own block-scale GEMM (cuBLASLt's block scaling on sm90 where the shape allows).
  Tensor sx = scales({33, 3}, 6), sw = scales({1, 3}, 7);
  expect_cuda(
      "fp8_blockscale_gemm_sm90", upstream_refusal("fp8_blockscale_gemm_sm90", cc),
      [&] { return fp8_blockscale_gemm_sm90(a.to(g), w.to(g), sx.to(g), sw.to(g)); },
      fp8_blockscale_gemm_sm90(a, w, sx, sw), default_tolerance(kBf));
}

// ---- the cuBLASLt paths against the tiled kernel and the CPU ------------------------------------
//
// Why the bound: every product of two fp8 values is exact in fp32, so the CPU reference, the
// tiled kernel and cuBLASLt differ only in how they add. The CPU and the tiled kernel add in
// fp32 in different orders (each within k * 2^-24 of the exact sum of magnitudes S); Hopper's
// FP8 tensor cores keep fewer bits while they add inside an MMA (about 14, DeepSeek-V3 report
// §3.3.2) before cuBLASLt promotes the block's sum to fp32, which it must do at least once per
// 128-wide K block to apply that block's scales. So |gpu - cpu| <= 2^-11 * S leaves a margin over
// 2^-13 * S, plus one unit in the last place of the output type for the final roundings (each
// side rounds once). A scale applied to the wrong row or block (a layout error) moves results by
// the order of the result itself, far outside this.

#if FLASHINFER_TEST_HAVE_CUDART

double ulp_of(double x, DType dt) {
  const int mant = dt == kBf ? 7 : 10;  // explicit mantissa bits
  const double tiny = dt == kBf ? std::ldexp(1.0, -133) : std::ldexp(1.0, -24);
  if (x == 0.0) return tiny;
  int e = 0;
  std::frexp(std::fabs(x), &e);  // |x| = f * 2^e, f in [0.5, 1)
  return std::max(tiny, std::ldexp(1.0, e - 1 - mant));
}

::testing::AssertionResult within_order_bound(const Tensor& gpu, const Tensor& cpu,
                                              const std::vector<double>& mag, DType dt) {
  const auto gv = dbl(gpu.to(Device::cpu())), cv = dbl(cpu);
  if (gv.size() != cv.size() || cv.size() != mag.size())
    return ::testing::AssertionFailure() << "size mismatch";
  int64_t bad = 0;
  std::string first;
  for (std::size_t i = 0; i < cv.size(); ++i) {
    const double bound = ulp_of(cv[i], dt) + std::ldexp(mag[i], -11);
    if (!(std::fabs(gv[i] - cv[i]) <= bound)) {
      if (bad++ == 0) {
        first = "element " + std::to_string(i) + ": gpu " + std::to_string(gv[i]) + ", cpu " +
                std::to_string(cv[i]) + ", bound " + std::to_string(bound);
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " elements outside the bound; first " << first;
}

// |x| of an fp8 tensor, exactly, as fp32.
Tensor abs32(const Tensor& t) {
  std::vector<double> v = dbl(t);
  for (double& x : v) x = std::fabs(x);
  return Tensor::from_vector(v, t.shape(), DType::kFloat32);
}

// fp8_blockscale_gemm_sm90's parameter block for device tensors (fp8 input).
BlockScaledGemmParams sm90_device_params(const Tensor& x, const Tensor& w, const Tensor& sx,
                                         const Tensor& sw, const Tensor& out) {
  BlockScaledGemmParams p;
  p.a = x.data_ptr();
  p.a_stride_m = x.stride(0);
  p.b = w.data_ptr();
  p.b_stride_n = w.stride(0);
  p.a_scale = sx.data<float>();
  p.sa_stride_m = sx.stride(0);
  p.sa_stride_k = sx.stride(1);
  p.b_scale = sw.data<float>();
  p.sb_stride_n = sw.stride(0);
  p.sb_stride_k = sw.stride(1);
  p.gm = 1;
  p.gn = sw.size(0) == w.size(0) ? 1 : 128;
  p.gk = 128;
  p.m = x.size(0);
  p.n = w.size(0);
  p.k = x.size(1);
  p.out = out.data_ptr();
  p.out_dtype = out.dtype();
  p.out_stride_m = out.stride(0);
  return p;
}

TEST(GemmFp8CublasLtCuda, BlockScalesMatchTiledKernelAndCpuOnHopper) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  if (api::compute_capability(g) != 90) GTEST_SKIP() << "cuBLASLt's FP8 block scaling is sm90's";
  const int64_t n = 192, k = 1024, kb = k / 128;
  int lt_served = 0;
  // m 24 and 132: cuBLASLt's; m 1 and 7: the tiled kernel's (fp8_route: m % 4).
  for (int64_t m : {1, 7, 24, 132}) {
    for (bool per_block : {true, false}) {
      for (DType out_dt : {kBf, DType::kFloat16}) {
        SCOPED_TRACE(::testing::Message() << "m " << m << (per_block ? " 128x128" : " 1x128") << " "
                                          << dtype_torch_name(out_dt));
        Tensor x = fp8({m, k}, kE4, 40 + m), w = fp8({n, k}, kE4, 41);
        Tensor sx = scales({m, kb}, 42), sw = per_block ? scales({2, kb}, 43) : scales({n, kb}, 43);
        const Tensor cpu = fp8_blockscale_gemm_sm90(x, w, sx, sw, std::nullopt, out_dt);
        const auto sxv = dbl(sx), swv = dbl(sw);
        const auto mag = ref_blockscaled(
            abs32(x), abs32(w), 1, per_block ? 128 : 1, 128,
            [&](int64_t r, int64_t q) { return sxv[r * kb + q]; },
            [&](int64_t r, int64_t q) { return swv[r * kb + q]; });
        // Through the API, whichever path serves ...
        Tensor xg = x.to(g), wg = w.to(g), sxg = sx.to(g), swg = sw.to(g);
        EXPECT_TRUE(within_order_bound(
            fp8_blockscale_gemm_sm90(xg, wg, sxg, swg, std::nullopt, out_dt), cpu, mag, out_dt));
        // ... and the two CUDA paths directly: where cuBLASLt takes it, its result and the tiled
        // kernel's agree with the CPU; where it refuses, it says so (declined_calls) and has
        // queued nothing into lt_out, and the API's result above came from the tiled kernel.
        Tensor lt_out = Tensor::zeros({m, n}, out_dt, g),
               tiled_out = Tensor::zeros({m, n}, out_dt, g);
        const BlockScaledGemmParams p = sm90_device_params(xg, wg, sxg, swg, lt_out);
        ASSERT_EQ(lt::fp8_route(p, 90).path,
                  m % 4 == 0 ? lt::Fp8Path::kLtBlock : lt::Fp8Path::kTiled);
        const kernels::cuda::CublasLtStats s0 = kernels::cuda::cublaslt_stats();
        const bool served = kernels::cuda::block_scaled_gemm_lt(p, current_cuda_stream(), "test");
        const kernels::cuda::CublasLtStats s1 = kernels::cuda::cublaslt_stats();
        // A problem the route keeps from cuBLASLt is not a declined call (cuBLASLt never asked).
        EXPECT_EQ(s1.declined_calls - s0.declined_calls, served || m % 4 != 0 ? 0u : 1u);
        EXPECT_EQ(served, m % 4 == 0) << "cuBLASLt refused (status in declined plan)";
        kernels::cuda::block_scaled_gemm(sm90_device_params(xg, wg, sxg, swg, tiled_out),
                                         current_cuda_stream(), "test", false);
        if (served) {
          ++lt_served;
          EXPECT_TRUE(within_order_bound(lt_out, cpu, mag, out_dt));
        } else {
          EXPECT_TRUE(
              all_close(lt_out.to(Device::cpu()), Tensor::zeros({m, n}, out_dt), {0.0, 0.0}));
        }
        EXPECT_TRUE(within_order_bound(tiled_out, cpu, mag, out_dt));
      }
    }
  }
  // The DeepSeek problems with m % 4 == 0 are cuBLASLt's (Hopper, cuBLASLt 12.9+; the plan sets
  // the scale pointers before the heuristic, which refuses block scale modes without them).
  EXPECT_EQ(lt_served, 8);
}

TEST(GemmFp8CublasLtCuda, MmFp8MatchesTiledKernelAndCpuOnBlackwell) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int cc = api::compute_capability(g);
  if (!upstream_backend_refusal("mm_fp8", "trtllm_low_latency", cc).empty())
    GTEST_SKIP() << "upstream runs mm_fp8 on sm100/103/107 only";
  const int64_t n = 96, k = 512;
  for (int64_t m : {1, 16, 33}) {
    SCOPED_TRACE(::testing::Message() << "m " << m);
    Tensor x = fp8({m, k}, kE4, 50 + m), w = fp8({n, k}, kE4, 51);
    Tensor alpha = Tensor::full({1}, 0.375, DType::kFloat32);
    const Tensor cpu = mm_fp8(x, prepare_low_latency_gemm_weights(w, Value()), alpha);
    const auto mag = ref_blockscaled(
        abs32(x), abs32(w), 1, 1, k, [](int64_t, int64_t) { return 1.0; },
        [](int64_t, int64_t) { return 1.0; }, 0.375);
    Tensor xg = x.to(g), pwg = prepare_low_latency_gemm_weights(w.to(g), Value());
    Tensor ag = alpha.to(g);
    EXPECT_TRUE(within_order_bound(mm_fp8(xg, pwg, ag), cpu, mag, kBf));
    Tensor lt_out = Tensor::zeros({m, n}, kBf, g), tiled_out = Tensor::zeros({m, n}, kBf, g);
    BlockScaledGemmParams p = mm_fp8_params(m, n, k);
    p.a = xg.data_ptr();
    p.b = pwg.data_ptr();
    p.alpha = ag.data<float>();
    p.out = lt_out.data_ptr();
    ASSERT_EQ(lt::fp8_route(p, cc).path, lt::Fp8Path::kLtTensor);
    ASSERT_TRUE(kernels::cuda::block_scaled_gemm_lt(p, current_cuda_stream(), "test"));
    p.out = tiled_out.data_ptr();
    kernels::cuda::block_scaled_gemm(p, current_cuda_stream(), "test", false);
    EXPECT_TRUE(within_order_bound(lt_out, cpu, mag, kBf));
    EXPECT_TRUE(within_order_bound(tiled_out, cpu, mag, kBf));
  }
}

// Once warm, a cuBLASLt FP8 call builds no plan and allocates nothing (100 calls), and a warm
// call captured into a CUDA graph (global mode: an allocation or a synchronization would fail
// the capture) replays to the eager result.
TEST(GemmFp8CublasLtCuda, WarmCallsAllocateNothingAndCaptureIntoAGraph) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int cc = api::compute_capability(g);
  const bool hopper = cc == 90;
  if (!hopper && !upstream_backend_refusal("mm_fp8", "trtllm_low_latency", cc).empty())
    GTEST_SKIP() << "no cuBLASLt FP8 path of gemm_fp8 on this GPU";
  const int64_t m = 24, n = 128, k = 512;
  Tensor xc = fp8({m, k}, kE4, 60), wc = fp8({n, k}, kE4, 61);
  Tensor sxc = scales({m, k / 128}, 62), swc = scales({1, k / 128}, 63);
  Tensor x = xc.to(g), w = wc.to(g), sx = sxc.to(g), sw = swc.to(g);
  Tensor pw = hopper ? Tensor() : prepare_low_latency_gemm_weights(w, Value());
  Tensor alpha = Tensor::full({1}, 0.5, DType::kFloat32).to(g);
  Tensor out = Tensor::zeros({m, n}, kBf, g);
  const auto run = [&] {
    if (hopper) {
      fp8_blockscale_gemm_sm90(x, w, sx, sw, out);
    } else {
      mm_fp8(x, pw, alpha, kBf, out);
    }
  };
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  void* const prev = current_cuda_stream();
  set_current_cuda_stream(stream);
  run();  // warm-up: plan, workspace, scratch
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const Tensor eager = out.to(Device::cpu());
  const kernels::cuda::CublasLtStats s0 = kernels::cuda::cublaslt_stats();
  const uint64_t mallocs0 = detail::cuda_device_malloc_count();
  for (int i = 0; i < 100; ++i) run();
  const kernels::cuda::CublasLtStats s1 = kernels::cuda::cublaslt_stats();
  EXPECT_EQ(s1.plan_builds, s0.plan_builds);
  EXPECT_EQ(s1.plan_hits - s0.plan_hits, 100u);  // every call found its plan cached
  EXPECT_EQ(s1.declined_calls, s0.declined_calls) << "cuBLASLt refused; the tiled kernel ran";
  EXPECT_EQ(s1.device_allocs, s0.device_allocs);
  EXPECT_EQ(detail::cuda_device_malloc_count(), mallocs0);
  ASSERT_EQ(cudaMemsetAsync(out.data_ptr(), 0, static_cast<size_t>(m * n) * 2, stream),
            cudaSuccess);
  ASSERT_NO_FATAL_FAILURE(capture_and_launch(stream, cudaStreamCaptureModeGlobal, [&] { run(); }));
  set_current_cuda_stream(prev);
  EXPECT_TRUE(all_close(out.to(Device::cpu()), eager, {0.0, 0.0}));  // same plan, same bits
  cudaStreamDestroy(stream);
  // Whichever path served, the result is the CPU's within the accumulation-order bound.
  const Tensor cpu = hopper ? fp8_blockscale_gemm_sm90(xc, wc, sxc, swc)
                            : mm_fp8(xc, prepare_low_latency_gemm_weights(wc, Value()),
                                     Tensor::full({1}, 0.5, DType::kFloat32));
  const auto sxv = dbl(sxc), swv = dbl(swc);
  const int64_t kb = k / 128;
  const auto mag = hopper ? ref_blockscaled(
                                abs32(xc), abs32(wc), 1, 128, 128,
                                [&](int64_t r, int64_t q) { return sxv[r * kb + q]; },
                                [&](int64_t r, int64_t q) { return swv[r * kb + q]; })
                          : ref_blockscaled(
                                abs32(xc), abs32(wc), 1, 1, k, [](int64_t, int64_t) { return 1.0; },
                                [](int64_t, int64_t) { return 1.0; }, 0.5);
  EXPECT_TRUE(within_order_bound(eager, cpu, mag, kBf));
}

// fp8_blockscale_gemm_sm90 with a BF16 input on Hopper quantizes it on the device (the 1x128
// rule of per_token_group_quant_8bit's kernels): the result is bit for bit the CUDA result on the
// input quantized by the CPU formula (the same GEMM on the same operands), for dense rows (16-byte
// loads), rows 16 bytes apart past k (16-byte loads) and rows 8 bytes off (element loads); and
// the call, which no longer goes through the host, captures into a CUDA graph in global mode.
TEST(GemmFp8CublasLtCuda, Bf16InputIsQuantizedOnTheDeviceAsTheCpuFormulaSays) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  if (api::compute_capability(g) != 90) GTEST_SKIP() << "fp8_blockscale_gemm_sm90 is sm90's";
  const int64_t n = 128, k = 512, kb = k / 128;
  const Tensor w = fp8({n, k}, kE4, 71).to(g), sw = scales({1, kb}, 72).to(g);
  for (int64_t m : {1, 7, 24}) {
    for (int64_t pad : {0, 8, 4}) {
      SCOPED_TRACE(::testing::Message() << "m " << m << " row padding " << pad);
      std::vector<double> xs = dbl(rand_tensor({m, k}, DType::kFloat32, 73 + m, -3.0, 3.0));
      for (int64_t kk = 128; kk < 256; ++kk) xs[kk] = 0.0;  // an all-zero block (scale 1)
      const Tensor x = Tensor::from_vector(xs, {m, k}, kBf);
      Tensor wide = Tensor::zeros({m, k + pad}, kBf, g);
      wide.slice(1, 0, k).copy_(x.to(g));
      const Tensor xg = wide.slice(1, 0, k);
      const auto [xq, sx] = quantize_1x128_reference(x);
      const Tensor want = fp8_blockscale_gemm_sm90(xq.to(g), w, sx.to(g), sw);
      EXPECT_TRUE(all_close(fp8_blockscale_gemm_sm90(xg, w, std::nullopt, sw).to(Device::cpu()),
                            want.to(Device::cpu()), {0.0, 0.0}));
    }
  }
  // Warmed up on the stream it is then captured on (cuBLASLt's plan, workspace and scratch are
  // per stream, as an engine's warm-up makes them), global mode.
  const Tensor x = rand_tensor({24, k}, kBf, 80).to(g);
  Tensor out = Tensor::zeros({24, n}, kBf, g);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::vector<double> eager;
  {
    const CurrentStreamScope on(stream);
    fp8_blockscale_gemm_sm90(x, w, std::nullopt, sw, out);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    eager = out.to_double_vector();
    ASSERT_EQ(cudaMemsetAsync(out.data_ptr(), 0, static_cast<size_t>(24 * n) * 2, stream),
              cudaSuccess);
    const CudaGraphMemoryScope hold(0);
    ASSERT_NO_FATAL_FAILURE(capture_and_launch(stream, cudaStreamCaptureModeGlobal, [&] {
      fp8_blockscale_gemm_sm90(x, w, std::nullopt, sw, out);
    }));
  }
  EXPECT_EQ(out.to_double_vector(), eager);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

#endif  // FLASHINFER_TEST_HAVE_CUDART

}  // namespace
}  // namespace flashinfer::testing
