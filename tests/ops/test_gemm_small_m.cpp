// Tests of the CPU GEMM's small-m path (B read in its stored bf16 / fp8 form and widened in
// registers): every instruction set this CPU has (scalar, AVX2, AVX-512) against a naive fp64
// reference and against the OpenBLAS path, exact widening of every fp8 code and of bf16's special
// values, B as the column-major views the ops receive, batches, k chunks, strided outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "api/gemm_params.h"
#include "flashinfer/flashinfer.h"
#include "kernels/cpu/gemm_cpu.h"
#include "ops/gemm_reference.h"
#include "util/test_util.h"

namespace flashinfer {
namespace {

using kernels::cpu::CpuIsa;
using kernels::cpu::detected_cpu_isa;
using kernels::cpu::GemmPath;
using kernels::cpu::kGemmSmallMMax;
using testing::all_close;
using testing::default_tolerance;
using testing::gemm_tol;
using testing::ref_bmm;
using testing::Tolerance;

const char* isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    default:
      return "avx512";
  }
}

// Every instruction set of the small-m path this machine can run.
std::vector<CpuIsa> isas() {
  std::vector<CpuIsa> v;
  for (CpuIsa i : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (i <= detected_cpu_isa()) v.push_back(i);
  }
  return v;
}

// Runs the CPU kernel with a forced path and instruction set on (A [.., m, k] row-major,
// B [.., k, n] column-major) into a new out [.., m, n], as the ops would.
Tensor run_kernel(const Tensor& A, const Tensor& B, DType out_dtype, GemmPath path, CpuIsa isa,
                  float a_scale = 1.0f, float b_scale = 1.0f, const Tensor* bias = nullptr) {
  Shape shape = A.shape();
  shape.back() = B.size(-1);
  Tensor out = Tensor::empty(shape, out_dtype);
  kernels::GemmParams p = api::gemm_params(A, B, out);
  if (A.dtype() != DType::kBFloat16) {
    p.a_scale = &a_scale;
    p.b_scale = &b_scale;
  }
  if (bias) {
    p.bias = bias->data_ptr();
    p.bias_dtype = bias->dtype();
    p.bias_stride = bias->stride(0);
  }
  kernels::cpu::gemm_with(p, path, isa);
  return out;
}

Tensor randn(const Shape& shape, DType dt, uint64_t seed, double sd = 1.0) {
  return Tensor::empty(shape, DType::kFloat32).normal_(seed, 0, sd).to(dt);
}

// B as the ops receive it: the transpose of a contiguous [.., n, k] weight.
Tensor weight_t(const Shape& nk, DType dt, uint64_t seed, double sd = 1.0) {
  Tensor w = randn(nk, dt, seed, sd);
  return nk.size() == 3 ? w.transpose(1, 2) : w.transpose(0, 1);
}

std::string where(CpuIsa isa, int64_t m, int64_t n, int64_t k, DType out) {
  return std::string(isa_name(isa)) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
         " k=" + std::to_string(k) + " " + std::string(dtype_torch_name(out));
}

TEST(GemmSmallM, Bf16EveryMUpTo17EveryIsaMatchesFp64AndSgemmPath) {
  // n and k not multiples of 4, 8 or 16: every tile shape and k tail runs.
  for (auto [n, k] : {std::pair<int64_t, int64_t>{37, 83}, {5, 16}, {70, 1}, {9, 250}}) {
    for (int64_t m = 1; m <= 17; ++m) {
      Tensor a = randn({m, k}, DType::kBFloat16, 100 + m + k);
      Tensor b = weight_t({n, k}, DType::kBFloat16, 200 + n + k);
      const auto ref = ref_bmm(a, b, 1.0);
      for (DType out_dt : {DType::kBFloat16, DType::kFloat16}) {
        const Tensor big = run_kernel(a, b, out_dt, GemmPath::kSgemm, CpuIsa::kScalar);
        EXPECT_TRUE(all_close(big, ref, gemm_tol(out_dt, k))) << "sgemm m=" << m;
        for (CpuIsa isa : isas()) {
          const Tensor small = run_kernel(a, b, out_dt, GemmPath::kSmallM, isa);
          EXPECT_TRUE(all_close(small, ref, gemm_tol(out_dt, k))) << where(isa, m, n, k, out_dt);
          // Both paths round fp32 sums of the same products: at most an ulp or two apart.
          EXPECT_TRUE(all_close(small, big, default_tolerance(out_dt)))
              << where(isa, m, n, k, out_dt);
        }
      }
    }
  }
}

TEST(GemmSmallM, PathsAgreeOnDecodeLikeShapes) {
  const int64_t n = 300, k = 1000;
  for (int64_t m : {1, 4, 16, 32}) {
    Tensor a = randn({m, k}, DType::kBFloat16, m);
    Tensor b = weight_t({n, k}, DType::kBFloat16, 77);
    const auto ref = ref_bmm(a, b, 1.0);
    const Tensor big = run_kernel(a, b, DType::kBFloat16, GemmPath::kSgemm, CpuIsa::kScalar);
    for (CpuIsa isa : isas()) {
      const Tensor small = run_kernel(a, b, DType::kBFloat16, GemmPath::kSmallM, isa);
      EXPECT_TRUE(all_close(small, ref, gemm_tol(DType::kBFloat16, k)))
          << where(isa, m, n, k, DType::kBFloat16);
      EXPECT_TRUE(all_close(small, big, default_tolerance(DType::kBFloat16)))
          << where(isa, m, n, k, DType::kBFloat16);
    }
  }
}

// The small-m kernel with bf16 out on every instruction set this CPU has, against the fp64
// reference of A x B.
void expect_bf16_every_isa_matches_reference(const Tensor& A, const Tensor& B,
                                             const std::string& what = {}) {
  const int64_t m = A.size(-2), k = A.size(-1), n = B.size(-1);
  const auto ref = ref_bmm(A, B, 1.0);
  for (CpuIsa isa : isas()) {
    EXPECT_TRUE(all_close(run_kernel(A, B, DType::kBFloat16, GemmPath::kSmallM, isa), ref,
                          gemm_tol(DType::kBFloat16, k)))
        << where(isa, m, n, k, DType::kBFloat16) << what;
  }
}

TEST(GemmSmallM, LargeBRunsOnTheOpenMpTeam) {
  // Over 2^22 B elements per call, the column blocks (and batches) are shared by an OpenMP team.
  for (auto [nb, m, n, k] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 3, 1031, 4099}, {2, 2, 600, 3500}}) {
    Tensor A = randn({nb, m, k}, DType::kBFloat16, 50 + m);
    Tensor B = weight_t({nb, n, k}, DType::kBFloat16, 51);
    expect_bf16_every_isa_matches_reference(A, B, " batch " + std::to_string(nb));
  }
}

TEST(GemmSmallM, LongKRunsInChunks) {
  // k beyond one k chunk (m = 16: 2048; m = 1: 32768) so partial sums carry across chunks.
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{16, 20, 5000}, {1, 3, 70001}}) {
    Tensor a = randn({m, k}, DType::kBFloat16, 5);
    Tensor b = weight_t({n, k}, DType::kBFloat16, 6);
    expect_bf16_every_isa_matches_reference(a, b);
  }
}

TEST(GemmSmallM, BatchedBf16AndFp8EveryIsa) {
  const int64_t nb = 3, n = 45, k = 77;
  for (int64_t m : {1, 5, 17}) {
    Tensor A = randn({nb, m, k}, DType::kBFloat16, 10 + m);
    Tensor B = weight_t({nb, n, k}, DType::kBFloat16, 11);
    expect_bf16_every_isa_matches_reference(A, B);
    const std::vector<std::pair<DType, DType>> fp8 = {{DType::kFloat8E4M3FN, DType::kFloat8E4M3FN},
                                                      {DType::kFloat8E4M3FN, DType::kFloat8E5M2},
                                                      {DType::kFloat8E5M2, DType::kFloat8E4M3FN}};
    for (const auto& [adt, bdt] : fp8) {
      Tensor A8 = randn({nb, m, k}, adt, 20 + m, 40);
      Tensor B8 = weight_t({nb, n, k}, bdt, 21, 40);
      const float sa = 0.0125f, sb = 0.03125f;
      const auto ref8 = ref_bmm(A8, B8, static_cast<double>(sa * sb));
      for (DType out_dt : {DType::kBFloat16, DType::kFloat16}) {
        const Tensor big = run_kernel(A8, B8, out_dt, GemmPath::kSgemm, CpuIsa::kScalar, sa, sb);
        for (CpuIsa isa : isas()) {
          const Tensor small = run_kernel(A8, B8, out_dt, GemmPath::kSmallM, isa, sa, sb);
          EXPECT_TRUE(all_close(small, ref8, gemm_tol(out_dt, k)))
              << where(isa, m, n, k, out_dt) << " " << dtype_torch_name(bdt);
          EXPECT_TRUE(all_close(small, big, default_tolerance(out_dt)))
              << where(isa, m, n, k, out_dt) << " " << dtype_torch_name(bdt);
        }
      }
    }
  }
}

// Column j of B holds fp8 code j at row j % k and zeros elsewhere; A is all ones, so out[i, j]
// is exactly the value of code j (every fp8 value is exact in bf16 and fp16): the widening is
// checked code by code, in full vectors (rows < 32) and in the k tail (rows 32..39).
TEST(GemmSmallM, Fp8EveryCodeWidensExactly) {
  const int64_t n = 256, k = 40, m = 3;
  for (DType bdt : {DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
    Tensor w = Tensor::zeros({1, n, k}, bdt);  // all bytes 0x00: +0 in both formats
    auto* wp = static_cast<uint8_t*>(w.data_ptr());
    std::vector<double> expected(static_cast<size_t>(m * n));
    for (int64_t j = 0; j < n; ++j) {
      const auto code = static_cast<uint8_t>(j);
      wp[j * k + j % k] = code;
      const double v =
          bdt == DType::kFloat8E4M3FN ? e4m3fn_bits_to_float(code) : e5m2_bits_to_float(code);
      for (int64_t i = 0; i < m; ++i) expected[i * n + j] = v;
    }
    Tensor B = w.transpose(1, 2);
    Tensor A = Tensor::full({1, m, k}, 1.0, DType::kFloat8E4M3FN);
    for (DType out_dt : {DType::kBFloat16, DType::kFloat16}) {
      for (CpuIsa isa : isas()) {
        EXPECT_TRUE(
            all_close(run_kernel(A, B, out_dt, GemmPath::kSmallM, isa), expected, Tolerance{0, 0}))
            << isa_name(isa) << " " << dtype_torch_name(bdt) << " -> " << dtype_torch_name(out_dt);
      }
    }
  }
}

TEST(GemmSmallM, Bf16SpecialValuesWidenExactly) {
  // +-0, the smallest and largest subnormals, the smallest normal, 1, the largest finite, inf,
  // NaN: one per column, at rows in the vectors and in the tail.
  const std::vector<uint16_t> codes = {0x0000, 0x8000, 0x0001, 0x807F, 0x0080, 0x3F80,
                                       0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0x3F81};
  const int64_t n = static_cast<int64_t>(codes.size()), k = 19, m = 2;
  Tensor w = Tensor::zeros({n, k}, DType::kBFloat16);
  auto* wp = static_cast<uint16_t*>(w.data_ptr());
  std::vector<double> expected(static_cast<size_t>(m * n));
  for (int64_t j = 0; j < n; ++j) {
    wp[j * k + (j * 5) % k] = codes[j];
    for (int64_t i = 0; i < m; ++i) expected[i * n + j] = bfloat16_bits_to_float(codes[j]);
  }
  Tensor a = Tensor::full({m, k}, 1.0, DType::kBFloat16);
  for (CpuIsa isa : isas()) {
    EXPECT_TRUE(
        all_close(run_kernel(a, w.transpose(0, 1), DType::kBFloat16, GemmPath::kSmallM, isa),
                  expected, Tolerance{0, 0}))
        << isa_name(isa);
  }
}

TEST(GemmSmallM, HandCheckedGoldenCase) {
  // [1 2 3] . columns [1 0 -1], [0.5 0.25 2], [-4 8 0.125]: 1 - 3 = -2; 0.5 + 0.5 + 6 = 7;
  // -4 + 16 + 0.375 = 12.375; with bias [1, -7, 0.625]: -1, 0, 13.
  Tensor a = Tensor::from_vector({1, 2, 3}, {1, 3}, DType::kBFloat16);
  Tensor w = Tensor::from_vector({1, 0, -1, 0.5, 0.25, 2, -4, 8, 0.125}, {3, 3}, DType::kBFloat16);
  Tensor bias = Tensor::from_vector({1, -7, 0.625}, {3}, DType::kBFloat16);
  for (CpuIsa isa : isas()) {
    EXPECT_TRUE(all_close(
        run_kernel(a, w.transpose(0, 1), DType::kFloat16, GemmPath::kSmallM, isa, 1, 1, &bias),
        std::vector<double>{-1, 0, 13}, Tolerance{0, 0}))
        << isa_name(isa);
  }
}

// Through the public ops (which pick the path by m): strided operands, bias, a strided out,
// and m on both sides of the threshold.
TEST(GemmSmallM, PublicOpsStridedViewsAndThreshold) {
  const int64_t n = 41, k = 67;
  for (int64_t m : {int64_t{1}, int64_t{6}, kGemmSmallMMax, kGemmSmallMMax + 1}) {
    Tensor wide = randn({m, k + 13}, DType::kBFloat16, 30 + m);
    Tensor a = wide.slice(1, 0, k);
    Tensor wb = randn({n, k + 3}, DType::kBFloat16, 31);
    Tensor b = wb.slice(1, 0, k).transpose(0, 1);  // b_stride_n = k + 3
    Tensor bias = randn({n}, DType::kBFloat16, 32);
    Tensor out_t = Tensor::zeros({n, m}, DType::kFloat16);
    Tensor out = out_t.transpose(0, 1);  // out_stride_n = m
    mm_bf16(a, b, bias, false, out, DType::kFloat16);
    const auto bv = bias.to_double_vector();
    EXPECT_TRUE(all_close(out, ref_bmm(a, b, 1.0, &bv), gemm_tol(DType::kFloat16, k))) << m;

    // bmm_fp8 with a padded batch stride on B.
    Tensor A8 = randn({2, m, k}, DType::kFloat8E4M3FN, 33, 40);
    Tensor W8 = randn({2, n + 2, k + 5}, DType::kFloat8E5M2, 34, 40);
    Tensor B8 = W8.slice(1, 0, n).slice(2, 0, k).transpose(1, 2);
    Tensor s = Tensor::full({1}, 0.015625, DType::kFloat32);
    Tensor r = bmm_fp8(A8, B8, s, s, DType::kBFloat16);
    EXPECT_TRUE(all_close(r, ref_bmm(A8, B8, 0.015625 * 0.015625), gemm_tol(DType::kBFloat16, k)))
        << m;
  }
}

TEST(GemmSmallM, IsaRequestIsClampedToTheCpu) {
  // Asking for more than the CPU has runs the best it has (and gives the same numbers).
  Tensor a = randn({3, 50}, DType::kBFloat16, 40);
  Tensor b = weight_t({20, 50}, DType::kBFloat16, 41);
  const Tensor best = run_kernel(a, b, DType::kBFloat16, GemmPath::kSmallM, detected_cpu_isa());
  const Tensor asked = run_kernel(a, b, DType::kBFloat16, GemmPath::kSmallM, CpuIsa::kAvx512);
  EXPECT_TRUE(all_close(asked, best, Tolerance{0, 0}));
}

// The large-m bf16 path (oneDNN's bf16 matmul where the build has it; the sgemm path otherwise):
// bf16 and fp8 inputs, batches, bias, padded strides and both output dtypes against the fp64
// reference, and against the sgemm path within a rounding step.
TEST(GemmLargeM, Bf16PathMatchesFp64AndSgemmPath) {
  const int64_t m = kGemmSmallMMax + 35, n = 37, k = 300;
  Tensor A = randn({2, m, k}, DType::kBFloat16, 50);
  Tensor B = weight_t({2, n, k}, DType::kBFloat16, 51);
  Tensor bias = randn({n}, DType::kBFloat16, 52);
  const auto bv = bias.to_double_vector();
  for (DType out_dt : {DType::kBFloat16, DType::kFloat16}) {
    const Tensor fast = run_kernel(A, B, out_dt, GemmPath::kBf16, CpuIsa::kScalar, 1, 1, &bias);
    const Tensor big = run_kernel(A, B, out_dt, GemmPath::kSgemm, CpuIsa::kScalar, 1, 1, &bias);
    EXPECT_TRUE(all_close(fast, ref_bmm(A, B, 1.0, &bv), gemm_tol(out_dt, k)));
    EXPECT_TRUE(all_close(fast, big, default_tolerance(out_dt)));
  }
  for (auto [adt, bdt] : {std::pair{DType::kFloat8E4M3FN, DType::kFloat8E4M3FN},
                          std::pair{DType::kFloat8E5M2, DType::kFloat8E4M3FN}}) {
    Tensor A8 = randn({2, m, k}, adt, 53, 40);
    Tensor W8 = randn({2, n + 2, k + 5}, bdt, 54, 40);  // padded rows: b_stride_n = k + 5
    Tensor B8 = W8.slice(1, 0, n).slice(2, 0, k).transpose(1, 2);
    const float sa = 0.0125f, sb = 0.03125f;
    const Tensor fast =
        run_kernel(A8, B8, DType::kBFloat16, GemmPath::kAuto, CpuIsa::kScalar, sa, sb);
    const Tensor big =
        run_kernel(A8, B8, DType::kBFloat16, GemmPath::kSgemm, CpuIsa::kScalar, sa, sb);
    EXPECT_TRUE(all_close(fast, ref_bmm(A8, B8, static_cast<double>(sa * sb)),
                          gemm_tol(DType::kBFloat16, k)))
        << dtype_torch_name(adt);
    EXPECT_TRUE(all_close(fast, big, default_tolerance(DType::kBFloat16))) << dtype_torch_name(adt);
  }
}

// Every e4m3 and e5m2 code through the large-m path: out[i, j] is exactly code j's value.
TEST(GemmLargeM, Fp8EveryCodeWidensExactly) {
  const int64_t n = 256, k = 40, m = kGemmSmallMMax + 2;
  for (DType bdt : {DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
    Tensor w = Tensor::zeros({1, n, k}, bdt);
    auto* wp = static_cast<uint8_t*>(w.data_ptr());
    std::vector<double> expected(static_cast<size_t>(m * n));
    for (int64_t j = 0; j < n; ++j) {
      const auto code = static_cast<uint8_t>(j);
      wp[j * k + j % k] = code;
      const double v =
          bdt == DType::kFloat8E4M3FN ? e4m3fn_bits_to_float(code) : e5m2_bits_to_float(code);
      for (int64_t i = 0; i < m; ++i) expected[i * n + j] = v;
    }
    Tensor A = Tensor::full({1, m, k}, 1.0, DType::kFloat8E4M3FN);
    // The fp8 -> bf16 widening has an AVX-512 and a portable version: both, via the cap.
    for (CpuIsa cap : isas()) {
      kernels::cpu::set_cpu_isa_cap(cap);
      EXPECT_TRUE(all_close(
          run_kernel(A, w.transpose(1, 2), DType::kFloat16, GemmPath::kBf16, CpuIsa::kScalar),
          expected, Tolerance{0, 0}))
          << dtype_torch_name(bdt) << " " << isa_name(cap);
    }
    kernels::cpu::set_cpu_isa_cap(CpuIsa::kAvx512);
  }
}

}  // namespace
}  // namespace flashinfer
