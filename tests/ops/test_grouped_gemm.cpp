// Grouped GEMMs (grouped_mm_bf16/fp8/mxfp8/fp4, SegmentGEMMWrapper, grouped_gemm_nt_masked):
// hand-checked values, fp64 formulas over the dequantized operands (the block-scale layouts
// written out independently here), empty groups and uncovered rows, bad input naming the
// argument, record/replay, and upstream-format dumps written by Python.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "api/device_props.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/float_formats.h"
#include "flashinfer/ops/backends.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"

#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
#include "kernels/cuda/grouped_gemm_cuda.h"
#endif
#if FLASHINFER_TEST_HAVE_CUDART
#include <cuda_runtime.h>

#include "flashinfer/stream.h"
#include "util/cuda_graph_util.h"
#endif

namespace flashinfer::testing {
namespace {

constexpr Tolerance kF32Tol{1e-4, 1e-4};

Tensor i32(const std::vector<int64_t>& v) {
  std::vector<double> d(v.begin(), v.end());
  return Tensor::from_vector(d, {static_cast<int64_t>(v.size())}, DType::kInt32);
}
Tensor i64(const std::vector<int64_t>& v) {
  std::vector<double> d(v.begin(), v.end());
  return Tensor::from_vector(d, {static_cast<int64_t>(v.size())}, DType::kInt64);
}

// Random bytes (every e2m1 pair is finite).
Tensor rand_bytes(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::kUInt8);
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = static_cast<uint8_t>(s >> 56);
  }
  return t;
}

// e2m1 code -> value, from the format's definition (1 sign, 2 exponent, 1 mantissa bits).
double e2m1(uint8_t c) {
  static const double mag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  return (c & 8 ? -1.0 : 1.0) * mag[c & 7];
}

// The 128x4 swizzled offset of scale (r, c) in an [rows, cols] scale matrix (cols multiple of 4):
// 128-row by 4-column tiles in row-major tile order, each tile 32 x (4 x 4): row r lands at
// (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4.
int64_t swz(int64_t r, int64_t c, int64_t cols) {
  return (r / 128) * (cols / 4) * 512 + (c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 +
         c % 4;
}

// A scale matrix [groups][rows, cols] of byte codes, and its swizzled copy (shape `shape`).
struct Scales {
  std::vector<uint8_t> logical;  // [groups, rows, cols]
  Tensor swizzled;
};
Scales make_scales(int64_t groups, int64_t rows, int64_t cols, bool e4m3, const Shape& shape,
                   uint64_t seed) {
  Scales s;
  Tensor r = rand_bytes({groups * rows * cols}, seed);
  s.logical.resize(static_cast<std::size_t>(groups * rows * cols));
  s.swizzled = Tensor::zeros(shape, e4m3 ? DType::kFloat8E4M3FN : DType::kUInt8);
  auto* dst = static_cast<uint8_t*>(s.swizzled.data_ptr());
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t c = 0; c < cols; ++c) {
        const uint8_t v = static_cast<const uint8_t*>(r.data_ptr())[(g * rows + i) * cols + c];
        // ue8m0 2^-2..2^2; e4m3 codes 0x30..0x40 (0.5 .. 2)
        const uint8_t code =
            e4m3 ? static_cast<uint8_t>(0x30 + v % 17) : static_cast<uint8_t>(125 + v % 5);
        s.logical[static_cast<std::size_t>((g * rows + i) * cols + c)] = code;
        // (a 1-D shape: only the logical codes are wanted)
        if (shape.size() > 1) dst[g * rows * cols + swz(i, c, cols)] = code;
      }
    }
  }
  return s;
}
double scale_value(uint8_t code, bool e4m3) {
  return e4m3 ? static_cast<double>(e4m3fn_bits_to_float(code)) : std::ldexp(1.0, code - 127);
}

// fp64 grouped reference: out[r] = alpha * sum_k A[r, k] * B[e, j, k] for rows r of group e;
// rows outside every group keep `fill`.
std::vector<double> grouped_ref(const std::vector<double>& A, const std::vector<double>& B,
                                const std::vector<int64_t>& indptr, int64_t cum, int64_t n,
                                int64_t k, double alpha, double fill = 0.0) {
  std::vector<double> out(static_cast<std::size_t>(cum * n), fill);
  for (std::size_t e = 0; e + 1 < indptr.size(); ++e) {
    for (int64_t r = indptr[e]; r < indptr[e + 1]; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (int64_t kk = 0; kk < k; ++kk) {
          acc += A[static_cast<std::size_t>(r * k + kk)] *
                 B[static_cast<std::size_t>((static_cast<int64_t>(e) * n + j) * k + kk)];
        }
        out[static_cast<std::size_t>(r * n + j)] = alpha * acc;
      }
    }
  }
  return out;
}

// grouped_ref (no fill) and, from the same pass, alpha times the sums of |a b| that
// within_accumulation_bound needs: each sum in grouped_ref's order, but four rows of a group
// against each weight row at a time, so that the weight is read a quarter as often and eight
// independent sums share each step. grouped_ref's k-deep sum is one chain of dependent additions,
// and the random cases' weights (296 x 4096 doubles a group) do not stay in cache between rows: two
// passes of it over 6000 rows took most of a GPU binary's 180 s.
struct ExactAndAbsSum {
  std::vector<double> exact, abs_sum;
};
ExactAndAbsSum grouped_ref_with_abs_sum(const std::vector<double>& A, const std::vector<double>& B,
                                        const std::vector<int64_t>& indptr, int64_t cum, int64_t n,
                                        int64_t k, double alpha) {
  constexpr int64_t kRows = 4;
  ExactAndAbsSum ref;
  ref.exact.assign(static_cast<std::size_t>(cum * n), 0.0);
  ref.abs_sum.assign(static_cast<std::size_t>(cum * n), 0.0);
  for (std::size_t e = 0; e + 1 < indptr.size(); ++e) {
    const int64_t end = indptr[e + 1];
    for (int64_t r0 = indptr[e]; r0 < end; r0 += kRows) {
      // A block past the group's end repeats its last row, whose sums are then not stored.
      const double* a[kRows];
      for (int64_t q = 0; q < kRows; ++q) {
        a[q] = A.data() + std::min(r0 + q, end - 1) * k;
      }
      for (int64_t j = 0; j < n; ++j) {
        const double* b = B.data() + (static_cast<int64_t>(e) * n + j) * k;
        double acc[kRows] = {}, mag[kRows] = {};
        for (int64_t kk = 0; kk < k; ++kk) {
          const double bv = b[kk];
          for (int64_t q = 0; q < kRows; ++q) {
            const double prod = a[q][kk] * bv;
            acc[q] += prod;
            mag[q] += std::fabs(prod);
          }
        }
        for (int64_t q = 0; q < kRows && r0 + q < end; ++q) {
          ref.exact[static_cast<std::size_t>((r0 + q) * n + j)] = alpha * acc[q];
          ref.abs_sum[static_cast<std::size_t>((r0 + q) * n + j)] = alpha * mag[q];
        }
      }
    }
  }
  return ref;
}

// ---- grouped_mm_bf16 ----------------------------------------------------------------------

TEST(GroupedMmBf16, HandChecked) {
  // a = [[1, 2], [3, 4]]; expert 0 = identity, expert 1 = [[1, 1], [2, -1]]; one row each.
  Tensor a = Tensor::from_vector({1, 2, 3, 4}, {2, 2}, DType::kBFloat16);
  Tensor b = Tensor::from_vector({1, 0, 0, 1, 1, 1, 2, -1}, {2, 2, 2}, DType::kBFloat16);
  Tensor out = grouped_mm_bf16(a, b, i32({0, 1, 2}));
  EXPECT_EQ(out.dtype(), DType::kBFloat16);
  EXPECT_EQ(out.to_double_vector(), (std::vector<double>{1, 2, 3 + 4, 6 - 4}));
}

TEST(GroupedMmBf16, MatchesFp64WithEmptyGroupsAndUncoveredRows) {
  const int64_t cum = 11, k = 40, n = 24;
  // row 0 and rows 9..10 in no group; group 1 and 3 empty
  const std::vector<int64_t> indptr = {1, 4, 4, 9, 9};
  const int64_t E = 4;
  Tensor a = rand_tensor({cum, k}, DType::kBFloat16, 1);
  Tensor b = rand_tensor({E, n, k}, DType::kBFloat16, 2);
  for (DType od : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    SCOPED_TRACE(dtype_torch_name(od));
    Tensor out = grouped_mm_bf16(a, b, i32(indptr), std::nullopt, od);
    EXPECT_EQ(out.dtype(), od);
    const auto ref =
        grouped_ref(a.to_double_vector(), b.to_double_vector(), indptr, cum, n, k, 1.0);
    EXPECT_TRUE(all_close(out, ref, od == DType::kFloat32 ? kF32Tol : default_tolerance(od)));
  }
  // Given out: its dtype wins over out_dtype, uncovered rows keep their values.
  Tensor given = Tensor::full({cum, n}, 5.0, DType::kFloat32);
  Tensor r = grouped_mm_bf16(a, b.transpose(1, 2).contiguous().transpose(1, 2), i32(indptr), given,
                             DType::kBFloat16);
  EXPECT_EQ(r.data_ptr(), given.data_ptr());
  EXPECT_TRUE(all_close(
      given, grouped_ref(a.to_double_vector(), b.to_double_vector(), indptr, cum, n, k, 1.0, 5.0),
      kF32Tol));
}

TEST(GroupedMmBf16, BadInput) {
  const char* op = "grouped_mm_bf16";
  Tensor a = rand_tensor({6, 32}, DType::kBFloat16, 3),
         b = rand_tensor({2, 8, 32}, DType::kBFloat16, 4);
  EXPECT_FI_ERROR(grouped_mm_bf16(a.to(DType::kFloat16), b, i32({0, 3, 6})), op, "a");
  EXPECT_FI_ERROR(grouped_mm_bf16(a, b.to(DType::kFloat32), i32({0, 3, 6})), op, "b");
  EXPECT_FI_ERROR(grouped_mm_bf16(a, b.slice(2, 0, 16), i32({0, 3, 6})), op, "b");
  EXPECT_FI_ERROR(grouped_mm_bf16(a, b, i64({0, 3, 6})), op, "m_indptr");
  EXPECT_FI_ERROR(grouped_mm_bf16(a, b, i32({0, 6})), op, "m_indptr");
  EXPECT_FI_ERROR(grouped_mm_bf16(a, b, i32({0, 4, 3})), op, "m_indptr");   // not monotone
  EXPECT_FI_ERROR(grouped_mm_bf16(a, b, i32({0, 3, 7})), op, "m_indptr");   // past cum_m
  EXPECT_FI_ERROR(grouped_mm_bf16(a, b, i32({-1, 3, 6})), op, "m_indptr");  // negative
  EXPECT_FI_ERROR(grouped_mm_bf16(a, b, i32({0, 3, 6}), Tensor::zeros({6, 9}, DType::kBFloat16)),
                  op, "out");
  EXPECT_FI_ERROR(grouped_mm_bf16(a, b, i32({0, 3, 6}), std::nullopt, DType::kInt32), op,
                  "out_dtype");
  EXPECT_FI_ERROR(grouped_mm_bf16(a, b, i32({0, 3, 6}), std::nullopt, DType::kBFloat16, "cutlass"),
                  op, "backend");
}

// ---- grouped_mm_fp8 -----------------------------------------------------------------------

TEST(GroupedMmFp8, MatchesFp64WithAlpha) {
  const int64_t cum = 9, k = 48, n = 16;
  const std::vector<int64_t> indptr = {0, 2, 2, 9};
  Tensor a = rand_tensor({cum, k}, DType::kFloat32, 5).to(DType::kFloat8E4M3FN);
  Tensor b = rand_tensor({3, n, k}, DType::kFloat32, 6).to(DType::kFloat8E5M2);
  Tensor alpha = Tensor::full({1}, 0.375, DType::kFloat32);
  Tensor out = grouped_mm_fp8(a, b, i32(indptr), alpha, std::nullopt, DType::kFloat32);
  EXPECT_TRUE(all_close(
      out, grouped_ref(a.to_double_vector(), b.to_double_vector(), indptr, cum, n, k, 0.375),
      kF32Tol));
  Tensor o2 = grouped_mm_fp8(a, b, i32(indptr));  // no alpha, bf16
  EXPECT_TRUE(
      all_close(o2, grouped_ref(a.to_double_vector(), b.to_double_vector(), indptr, cum, n, k, 1.0),
                default_tolerance(DType::kBFloat16)));
  const char* op = "grouped_mm_fp8";
  EXPECT_FI_ERROR(grouped_mm_fp8(a.to(DType::kBFloat16), b, i32(indptr)), op, "a");
  EXPECT_FI_ERROR(grouped_mm_fp8(a, b, i32(indptr), Tensor::full({2}, 1.0, DType::kFloat32)), op,
                  "alpha");
  EXPECT_FI_ERROR(grouped_mm_fp8(a, b, i32(indptr), Tensor::full({1}, 1.0, DType::kFloat16)), op,
                  "alpha");
}

// ---- grouped_mm_mxfp8 / grouped_mm_fp4 ------------------------------------------------------

TEST(GroupedMmMxfp8, MatchesFp64) {
  const int64_t cum = 128, k = 128, n = 128, E = 3, kb = k / 32;
  const std::vector<int64_t> indptr = {0, 50, 50, 128};
  Tensor a = rand_tensor({cum, k}, DType::kFloat32, 7).to(DType::kFloat8E4M3FN);
  Tensor b = rand_tensor({E, n, k}, DType::kFloat32, 8).to(DType::kFloat8E4M3FN);
  Scales sa = make_scales(1, cum, kb, false, {cum, kb}, 9);
  Scales sb = make_scales(E, n, kb, false, {E, n, kb}, 10);
  std::vector<double> A = a.to_double_vector(), B = b.to_double_vector();
  for (int64_t r = 0; r < cum; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      A[static_cast<std::size_t>(r * k + c)] *=
          scale_value(sa.logical[static_cast<std::size_t>(r * kb + c / 32)], false);
    }
  }
  for (int64_t r = 0; r < E * n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      B[static_cast<std::size_t>(r * k + c)] *=
          scale_value(sb.logical[static_cast<std::size_t>(r * kb + c / 32)], false);
    }
  }
  Tensor out =
      grouped_mm_mxfp8(a, b, sa.swizzled, sb.swizzled, i32(indptr), std::nullopt, DType::kFloat32);
  EXPECT_TRUE(all_close(out, grouped_ref(A, B, indptr, cum, n, k, 1.0), kF32Tol));
  const char* op = "grouped_mm_mxfp8";
  EXPECT_FI_ERROR(
      grouped_mm_mxfp8(a, b, sa.swizzled.to(DType::kFloat8E4M3FN), sb.swizzled, i32(indptr)), op,
      "a_descale");
  EXPECT_FI_ERROR(
      grouped_mm_mxfp8(a, b, sa.swizzled, sb.swizzled.reshape({E * n, kb}), i32(indptr)), op,
      "b_descale");
  // cum_m not a multiple of 128: the swizzled layout does not fill [cum_m, k/32]
  EXPECT_FI_ERROR(grouped_mm_mxfp8(a.slice(0, 0, 100), b, sa.swizzled.slice(0, 0, 100), sb.swizzled,
                                   i32({0, 50, 50, 100})),
                  op, "a_descale");
}

void check_fp4(int64_t block) {
  SCOPED_TRACE("block " + std::to_string(block));
  const bool e4m3 = block == 16;
  const int64_t cum = 256, k = 128, n = 128, E = 2, kb = k / block;
  const std::vector<int64_t> indptr = {0, 200, 256};
  Tensor a = rand_bytes({cum, k / 2}, 11), b = rand_bytes({E, n, k / 2}, 12);
  Scales sa = make_scales(1, cum, kb, e4m3, {cum, kb}, 13);
  Scales sb = make_scales(E, n, kb, e4m3, {E, n, kb}, 14);
  auto deq = [&](const Tensor& t, const Scales& s, int64_t rows) {
    std::vector<double> v(static_cast<std::size_t>(rows * k));
    const auto* p = static_cast<const uint8_t*>(t.data_ptr());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < k; ++c) {
        const uint8_t byte = p[r * (k / 2) + c / 2];
        v[static_cast<std::size_t>(r * k + c)] =
            e2m1(c % 2 == 0 ? (byte & 15) : (byte >> 4)) *
            scale_value(s.logical[static_cast<std::size_t>(r * kb + c / block)], e4m3);
      }
    }
    return v;
  };
  Tensor alpha = Tensor::full({1}, 0.125, DType::kFloat32);
  Tensor out = grouped_mm_fp4(a, b, sa.swizzled, sb.swizzled, i32(indptr), alpha, std::nullopt,
                              DType::kFloat32, block);
  EXPECT_TRUE(all_close(
      out, grouped_ref(deq(a, sa, cum), deq(b, sb, E * n), indptr, cum, n, k, 0.125), kF32Tol));
}

TEST(GroupedMmFp4, Nvfp4AndMxfp4MatchFp64) {
  check_fp4(16);
  check_fp4(32);
  const char* op = "grouped_mm_fp4";
  Tensor a = rand_bytes({128, 64}, 1), b = rand_bytes({1, 128, 64}, 2);
  Scales sa = make_scales(1, 128, 8, true, {128, 8}, 3),
         sb = make_scales(1, 128, 8, true, {1, 128, 8}, 4);
  EXPECT_FI_ERROR(grouped_mm_fp4(a, b, sa.swizzled, sb.swizzled, i32({0, 128}), std::nullopt,
                                 std::nullopt, DType::kBFloat16, 64),
                  op, "block_size");
  // MXFP4 takes uint8 (ue8m0) scales
  EXPECT_FI_ERROR(grouped_mm_fp4(a, b, sa.swizzled, sb.swizzled, i32({0, 128}), std::nullopt,
                                 std::nullopt, DType::kBFloat16, 32),
                  op, "a_descale");
  EXPECT_FI_ERROR(
      grouped_mm_fp4(a.to(DType::kBFloat16), b, sa.swizzled, sb.swizzled, i32({0, 128})), op, "a");
}

// ---- SegmentGEMMWrapper ---------------------------------------------------------------------

TEST(SegmentGemm, MatchesFp64BothLayouts) {
  const int64_t cum = 10, d_in = 24, d_out = 16, W = 3;
  Tensor x = rand_tensor({cum, d_in}, DType::kFloat16, 21);
  Tensor w_rm = rand_tensor({W, d_in, d_out}, DType::kFloat16, 22);  // [W, d_in, d_out]
  SegmentGEMMWrapper seg(Tensor::empty({1024}, DType::kUInt8));
  // segments 3, 0, 5 (rows 8..9 in none), weights 2, 0, 2
  const std::vector<int64_t> lens = {3, 0, 5}, widx = {2, 0, 2};
  const std::vector<int64_t> indptr = {0, 3, 3, 8};
  // fp64 reference on the row-major weights
  auto ref = [&](const std::vector<double>& W_rm) {
    const std::vector<double> X = x.to_double_vector();
    std::vector<double> y(static_cast<std::size_t>(cum * d_out), 0.0);
    for (std::size_t s = 0; s < 3; ++s) {
      for (int64_t r = indptr[s]; r < indptr[s + 1]; ++r) {
        for (int64_t j = 0; j < d_out; ++j) {
          double acc = 0.0;
          for (int64_t c = 0; c < d_in; ++c) {
            acc += X[static_cast<std::size_t>(r * d_in + c)] *
                   W_rm[static_cast<std::size_t>((widx[s] * d_in + c) * d_out + j)];
          }
          y[static_cast<std::size_t>(r * d_out + j)] = acc;
        }
      }
    }
    return y;
  };
  const auto expected = ref(w_rm.to_double_vector());
  Tensor y1 = seg.run(x, w_rm, 3, false, std::nullopt, i64(lens), std::nullopt, i64(widx));
  EXPECT_EQ(y1.dtype(), DType::kFloat16);
  EXPECT_TRUE(all_close(y1, expected, default_tolerance(DType::kFloat16)));
  // column-major weights [W, d_out, d_in], seg_indptr instead of seg_lens (which it overrides)
  Tensor w_cm = w_rm.transpose(1, 2).contiguous();
  Tensor y2 = seg.run(x, w_cm, 3, true, std::nullopt, i64({9, 9, 9}), i64(indptr), i64(widx));
  EXPECT_TRUE(all_close(y2, expected, default_tolerance(DType::kFloat16)));
  // without weight_indices, segment i uses weights[i]
  Tensor y3 = seg.run(x, w_rm, 3, false, std::nullopt, std::nullopt, i64(indptr));
  const std::vector<double> X = x.to_double_vector(), Wd = w_rm.to_double_vector();
  double worst = 0.0;
  for (int64_t r = 3; r < 8; ++r) {  // segment 2 uses weights[2]
    for (int64_t j = 0; j < d_out; ++j) {
      double acc = 0.0;
      for (int64_t c = 0; c < d_in; ++c) {
        acc += X[static_cast<std::size_t>(r * d_in + c)] *
               Wd[static_cast<std::size_t>((2 * d_in + c) * d_out + j)];
      }
      worst = std::max(
          worst, std::fabs(acc - y3.to_double_vector()[static_cast<std::size_t>(r * d_out + j)]));
    }
  }
  EXPECT_LT(worst, 2e-2);
}

// Upstream's indptr comes from seg_lens.to(x): each length rounded through x's dtype. bf16 x,
// seg_lens [257, 3]: 257 rounds to 256 (a tie, to even), so segment 0 is rows 0..255, segment 1
// rows 256..258, and row 259 is in none (zero). The same call with seg_indptr [0, 256, 259, ...]
// gives the same output; an fp16 length past 65504 (inf there) is refused.
TEST(SegmentGemm, SegLensGoThroughTheDtypeOfX) {
  const int64_t cum = 260, d_in = 8, d_out = 4;
  Tensor x = rand_tensor({cum, d_in}, DType::kBFloat16, 31);
  Tensor w = rand_tensor({2, d_in, d_out}, DType::kBFloat16, 32);
  SegmentGEMMWrapper seg(Tensor::empty({1024}, DType::kUInt8));
  Tensor by_lens = seg.run(x, w, 2, false, std::nullopt, i64({257, 3}));
  Tensor by_indptr = seg.run(x, w, 2, false, std::nullopt, std::nullopt, i64({0, 256, 259}));
  EXPECT_TRUE(same_values(by_lens, by_indptr));
  for (double v : by_lens.select(0, cum - 1).to_double_vector()) EXPECT_EQ(v, 0.0);
  // Row 256 took weights[1] (segment 1), as the rounded indptr says.
  Tensor row256 =
      seg.run(x.slice(0, 256, 257), w, 2, false, std::nullopt, std::nullopt, i64({0, 0, 1}));
  EXPECT_TRUE(same_values(by_lens.slice(0, 256, 257), row256));
  Tensor xh = rand_tensor({4, d_in}, DType::kFloat16, 33);
  EXPECT_FI_ERROR(seg.run(xh, w.to(DType::kFloat16), 2, false, std::nullopt, i64({65520, 0})),
                  "SegmentGEMMWrapper.run", "seg_lens");
}

TEST(SegmentGemm, BadInput) {
  const char* op = "SegmentGEMMWrapper.run";
  SegmentGEMMWrapper seg(Tensor::empty({16}, DType::kUInt8));
  Tensor x = rand_tensor({6, 8}, DType::kBFloat16, 1),
         w = rand_tensor({2, 8, 4}, DType::kBFloat16, 2);
  EXPECT_FI_ERROR(seg.run(x, w, 2, false), op, "seg_lens");
  EXPECT_FI_ERROR(seg.run(x, w, 2, true, std::nullopt, i64({3, 3})), op, "weights");
  EXPECT_FI_ERROR(seg.run(x, w.to(DType::kFloat16), 2, false, std::nullopt, i64({3, 3})), op,
                  "weights");
  EXPECT_FI_ERROR(seg.run(x, w, 2, false, std::nullopt, i64({4, 3})), op, "seg_lens");
  EXPECT_FI_ERROR(seg.run(x, w, 2, false, std::nullopt, std::nullopt, i64({0, 4, 2})), op,
                  "seg_indptr");
  EXPECT_FI_ERROR(seg.run(x, w, 2, false, std::nullopt, i64({3, 3}), std::nullopt, i64({0, 2})), op,
                  "weight_indices");
  EXPECT_FI_ERROR(seg.run(x, w, 3, false, std::nullopt, i64({2, 2, 2})), op, "batch_size");
  EXPECT_FI_ERROR(seg.run(x, w, 2, false, Tensor::zeros({6, 5}, DType::kBFloat16), i64({3, 3})), op,
                  "out");
  EXPECT_FI_ERROR(SegmentGEMMWrapper(Tensor::empty({16}, DType::kUInt8), "sm100"),
                  "SegmentGEMMWrapper.__init__", "backend");
}

// ---- grouped_gemm_nt_masked -------------------------------------------------------------------

struct MaskedCase {
  int64_t l = 3, m = 5, n = 8, k = 64;
  bool fp4 = true, e4m3 = true;
  int64_t vec = 16;
  Tensor A, B, SFA, SFB, out;
  std::vector<double> Ad, Bd;  // dequantized [l, m, k], [l, n, k]
};

// Operands built physically as [l, rows, k(/2)] and [l, r, rk, 32, 4, 4] and passed as the
// (rows, k, l) and (32, 4, r, 4, rk, l) views, as engines pass them.
MaskedCase make_masked(bool fp4) {
  MaskedCase c;
  c.fp4 = fp4;
  c.e4m3 = fp4;
  c.vec = fp4 ? 16 : 32;
  const int64_t kb = c.k / c.vec, rk = (kb + 3) / 4;
  auto operand = [&](int64_t rows, uint64_t seed, Tensor& data, Tensor& sf,
                     std::vector<double>& deq) {
    const int64_t rr = (rows + 127) / 128;
    Tensor phys =
        fp4 ? rand_bytes({c.l, rows, c.k / 2}, seed)
            : rand_tensor({c.l, rows, c.k}, DType::kFloat32, seed).to(DType::kFloat8E4M3FN);
    Scales s = make_scales(1, c.l * rows, kb, c.e4m3, {c.l * rows * kb}, seed + 1);
    Tensor sfp =
        Tensor::zeros({c.l, rr, rk, 32, 4, 4}, c.e4m3 ? DType::kFloat8E4M3FN : DType::kUInt8);
    auto* sp = static_cast<uint8_t*>(sfp.data_ptr());
    deq.assign(static_cast<std::size_t>(c.l * rows * c.k), 0.0);
    const std::vector<double> pv = fp4 ? std::vector<double>{} : phys.to_double_vector();
    for (int64_t g = 0; g < c.l; ++g) {
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < kb; ++b) {
          const uint8_t code = s.logical[static_cast<std::size_t>((g * rows + r) * kb + b)];
          sp[((((g * rr + r / 128) * rk + b / 4) * 32 + r % 32) * 4 + (r % 128) / 32) * 4 + b % 4] =
              code;
        }
        for (int64_t kk = 0; kk < c.k; ++kk) {
          double v;
          if (fp4) {
            const uint8_t byte =
                static_cast<const uint8_t*>(phys.data_ptr())[(g * rows + r) * (c.k / 2) + kk / 2];
            v = e2m1(kk % 2 == 0 ? (byte & 15) : (byte >> 4));
          } else {
            v = pv[static_cast<std::size_t>((g * rows + r) * c.k + kk)];
          }
          const uint8_t code =
              s.logical[static_cast<std::size_t>((g * rows + r) * kb + kk / c.vec)];
          deq[static_cast<std::size_t>((g * rows + r) * c.k + kk)] = v * scale_value(code, c.e4m3);
        }
      }
    }
    data = phys.permute({1, 2, 0});
    sf = sfp.permute({3, 4, 1, 5, 2, 0});
  };
  operand(c.m, 31, c.A, c.SFA, c.Ad);
  operand(c.n, 41, c.B, c.SFB, c.Bd);
  return c;
}

void check_masked(bool fp4, DType c_dtype, const char* c_name) {
  SCOPED_TRACE(std::string(fp4 ? "nvfp4 " : "mxfp8 ") + c_name);
  MaskedCase c = make_masked(fp4);
  const std::vector<int64_t> mm = {5, 2, 0};
  Tensor out_phys = Tensor::full({c.l, c.m, c.n}, 7.0, c_dtype);
  Tensor out = out_phys.permute({1, 2, 0});
  Tensor alpha = Tensor::from_vector({0.5, 2.0, 3.0}, {1, 1, 3}, DType::kFloat32);
  GroupedGemmNtMaskedKwargs kw;
  kw.alpha = alpha;
  kw.alpha_dtype = "float32";
  Tensor r = grouped_gemm_nt_masked(
      {c.A, c.SFA}, {c.B, c.SFB}, out, i32(mm), fp4 ? "float4_e2m1fn" : "float8_e4m3fn",
      fp4 ? "float8_e4m3fn" : "float8_e8m0fnu", c_name, c.vec, std::nullopt, std::nullopt,
      std::nullopt, std::nullopt, 0, std::nullopt, std::nullopt, std::nullopt, std::nullopt, false,
      false, kw);
  EXPECT_EQ(r.data_ptr(), out.data_ptr());
  std::vector<double> expected(static_cast<std::size_t>(c.l * c.m * c.n), 7.0);
  const double al[3] = {0.5, 2.0, 3.0};
  for (int64_t g = 0; g < c.l; ++g) {
    for (int64_t i = 0; i < mm[static_cast<std::size_t>(g)]; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double acc = 0.0;
        for (int64_t kk = 0; kk < c.k; ++kk) {
          acc += c.Ad[static_cast<std::size_t>((g * c.m + i) * c.k + kk)] *
                 c.Bd[static_cast<std::size_t>((g * c.n + j) * c.k + kk)];
        }
        expected[static_cast<std::size_t>((g * c.m + i) * c.n + j)] = al[g] * acc;
      }
    }
  }
  EXPECT_TRUE(all_close(out_phys, expected,
                        c_dtype == DType::kFloat32 ? kF32Tol : default_tolerance(c_dtype)));
}

TEST(GroupedGemmNtMasked, MatchesFp64RowsPastMaskUntouched) {
  check_masked(true, DType::kBFloat16, "bfloat16");
  check_masked(true, DType::kFloat32, "float32");
  check_masked(false, DType::kFloat32, "float32");
  check_masked(false, DType::kFloat16, "float16");
}

// The scales as the engines pass them, the 128x4-swizzled buffer [l, rows padded to 128, 4 rk]
// (SGLang's swizzle_blockscale; vLLM's CuteDSL batched MoE): the same bytes as the 6-D view, the
// same result.
TEST(GroupedGemmNtMasked, ThreeDimensionalScalesAreTheSixDimensionalView) {
  for (bool fp4 : {true, false}) {
    SCOPED_TRACE(fp4 ? "nvfp4" : "mxfp8");
    MaskedCase c = make_masked(fp4);
    const int64_t rk = (c.k / c.vec + 3) / 4;
    // The 6-D views permute a contiguous [l, r, rk, 32, 4, 4] buffer: back to it, as 3-D.
    auto three_d = [&](const Tensor& sf6, int64_t rows) {
      const Tensor phys = sf6.permute({5, 2, 4, 0, 1, 3});
      EXPECT_TRUE(phys.is_contiguous());
      return phys.reshape({c.l, (rows + 127) / 128 * 128, rk * 4});
    };
    const std::vector<int64_t> mm = {5, 2, 0};
    auto run = [&](const Tensor& sfa, const Tensor& sfb) {
      Tensor out = Tensor::zeros({c.l, c.m, c.n}, DType::kFloat32).permute({1, 2, 0});
      grouped_gemm_nt_masked({c.A, sfa}, {c.B, sfb}, out, i32(mm),
                             fp4 ? "float4_e2m1fn" : "float8_e4m3fn",
                             fp4 ? "float8_e4m3fn" : "float8_e8m0fnu", "float32", c.vec);
      return out.contiguous().to_double_vector();
    };
    EXPECT_EQ(run(three_d(c.SFA, c.m), three_d(c.SFB, c.n)), run(c.SFA, c.SFB));
  }
}

TEST(GroupedGemmNtMasked, BadInput) {
  const char* op = "grouped_gemm_nt_masked";
  MaskedCase c = make_masked(true);
  Tensor out = Tensor::zeros({c.l, c.m, c.n}, DType::kBFloat16).permute({1, 2, 0});
  auto call = [&](Tensor mm, std::string_view ab, std::string_view sf, std::string_view cd,
                  int64_t vec, Tensor o, GroupedGemmNtMaskedKwargs kw = {},
                  std::optional<Tensor> topk = std::nullopt, bool swap = false) {
    return grouped_gemm_nt_masked({c.A, c.SFA}, {c.B, c.SFB}, o, mm, ab, sf, cd, vec, topk,
                                  std::nullopt, std::nullopt, std::nullopt, 0, std::nullopt,
                                  std::nullopt, std::nullopt, std::nullopt, false, swap, kw);
  };
  const Tensor mm = i32({5, 2, 0});
  EXPECT_FI_ERROR(call(i32({6, 2, 0}), "float4_e2m1fn", "float8_e4m3fn", "bfloat16", 16, out), op,
                  "masked_m");
  EXPECT_FI_ERROR(call(i32({5, 2}), "float4_e2m1fn", "float8_e4m3fn", "bfloat16", 16, out), op,
                  "masked_m");
  EXPECT_FI_ERROR(call(mm, "int8", "float8_e4m3fn", "bfloat16", 16, out), op, "ab_dtype");
  EXPECT_FI_ERROR(call(mm, "float4_e2m1fn", "float16", "bfloat16", 16, out), op, "sf_dtype");
  EXPECT_FI_ERROR(call(mm, "float4_e2m1fn", "float8_e4m3fn", "int8", 16, out), op, "c_dtype");
  EXPECT_FI_ERROR(call(mm, "float4_e2m1fn", "float8_e4m3fn", "float16", 16, out), op, "out");
  EXPECT_FI_ERROR(call(mm, "float4_e2m1fn", "float8_e4m3fn", "bfloat16", 32, out), op,
                  "sf_vec_size");
  EXPECT_FI_ERROR(call(mm, "float8_e4m3fn", "float8_e8m0fnu", "bfloat16", 32, out), op, "lhs");
  EXPECT_FI_ERROR(call(mm, "float4_e2m1fn", "float8_e8m0fnu", "bfloat16", 16, out), op, "lhs");
  GroupedGemmNtMaskedKwargs no_dtype;
  no_dtype.alpha = Tensor::full({3}, 1.0, DType::kFloat32);
  EXPECT_FI_ERROR(call(mm, "float4_e2m1fn", "float8_e4m3fn", "bfloat16", 16, out, no_dtype), op,
                  "alpha_dtype");
  GroupedGemmNtMaskedKwargs short_alpha = no_dtype;
  short_alpha.alpha = Tensor::full({2}, 1.0, DType::kFloat32);
  short_alpha.alpha_dtype = "float32";
  EXPECT_FI_ERROR(call(mm, "float4_e2m1fn", "float8_e4m3fn", "bfloat16", 16, out, short_alpha), op,
                  "alpha");
  EXPECT_FI_ERROR(call(mm, "float4_e2m1fn", "float8_e4m3fn", "bfloat16", 16, out, {},
                       Tensor::zeros({3, 5}, DType::kFloat32)),
                  op, "topk_weights");
  EXPECT_FI_ERROR(
      call(mm, "float4_e2m1fn", "float8_e4m3fn", "bfloat16", 16, out, {}, std::nullopt, true), op,
      "is_swap_ab");
}

// ---- fp32 groupwise-scaled FP8: group_gemm_fp8_nt_groupwise, DeepGEMM -------------------------

// x_deq[r, c] = x[r, c] * scale(r / gr, c / gk) for rows [0, rows) of one group.
std::vector<double> deq_fp32(const std::vector<double>& x, int64_t rows, int64_t k,
                             const std::function<double(int64_t, int64_t)>& scale) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      out[static_cast<std::size_t>(r * k + c)] =
          x[static_cast<std::size_t>(r * k + c)] * scale(r, c);
    }
  }
  return out;
}

TEST(GroupGemmFp8NtGroupwise, BothScaleModesMatchFp64) {
  const int64_t cum = 16, k = 256, n = 136, B = 3;    // n spans two 128-wide scale blocks
  const std::vector<int64_t> indptr = {0, 8, 8, 12};  // rows 12..15 in no group
  Tensor a = rand_tensor({cum, k}, DType::kFloat32, 51).to(DType::kFloat8E4M3FN);
  Tensor b = rand_tensor({B, n, k}, DType::kFloat32, 52).to(DType::kFloat8E5M2);
  const int64_t kb = k / 128, nb = 2;
  Tensor sa_k = rand_tensor({cum, kb}, DType::kFloat32, 53, 0.1, 1.0);  // gm = 1
  Tensor sb_k = rand_tensor({B, nb, kb}, DType::kFloat32, 54, 0.1, 1.0);
  const std::vector<double> SA = sa_k.to_double_vector(), SB = sb_k.to_double_vector();
  const std::vector<double> A = deq_fp32(a.to_double_vector(), cum, k, [&](int64_t r, int64_t c) {
    return SA[static_cast<std::size_t>(r * kb + c / 128)];
  });
  const std::vector<double> Bv = b.to_double_vector();
  std::vector<double> Bd(Bv.size());
  for (int64_t e = 0; e < B; ++e) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t c = 0; c < k; ++c) {
        const std::size_t i = static_cast<std::size_t>((e * n + j) * k + c);
        Bd[i] = Bv[i] * SB[static_cast<std::size_t>((e * nb + j / 128) * kb + c / 128)];
      }
    }
  }
  const auto ref = grouped_ref(A, Bd, indptr, cum, n, k, 1.0);
  Tensor out_k = group_gemm_fp8_nt_groupwise(a, b, sa_k, sb_k, i32(indptr), {1, 128, 128}, "K");
  EXPECT_TRUE(all_close(out_k, ref, default_tolerance(DType::kBFloat16)));
  // "MN": the same scales transposed ([k/gk, cum_m] and [B, k/gk, n/gn]), fp16 output.
  Tensor out_mn = group_gemm_fp8_nt_groupwise(
      a, b, sa_k.transpose(0, 1).contiguous(), sb_k.transpose(1, 2).contiguous(), i32(indptr),
      {1, 128, 128}, "MN", 2, std::nullopt, DType::kFloat16, "cutlass");
  EXPECT_EQ(out_mn.dtype(), DType::kFloat16);
  EXPECT_TRUE(all_close(out_mn, ref, default_tolerance(DType::kFloat16)));

  const char* op = "group_gemm_fp8_nt_groupwise";
  EXPECT_FI_ERROR(
      group_gemm_fp8_nt_groupwise(a, b, sa_k, sb_k, i32({0, 6, 6, 12}), {1, 128, 128}, "K"), op,
      "m_indptr");  // 6 is not a multiple of 4
  EXPECT_FI_ERROR(group_gemm_fp8_nt_groupwise(a, b, sa_k, sb_k, i32(indptr), {1, 128, 128}, "MN"),
                  op, "a_scale");
  EXPECT_FI_ERROR(group_gemm_fp8_nt_groupwise(a, b, sa_k, sb_k, i32(indptr), {1, 128, 128}, "X"),
                  op, "scale_major_mode");
  EXPECT_FI_ERROR(group_gemm_fp8_nt_groupwise(a, b, sa_k, sb_k, i32(indptr), {1, 128, 128}, "K", 3),
                  op, "mma_sm");
  // Upstream 0.7.4's segment_alignment: >= 1.
  EXPECT_FI_ERROR(group_gemm_fp8_nt_groupwise(a, b, sa_k, sb_k, i32(indptr), {1, 128, 128}, "K", 1,
                                              std::nullopt, std::nullopt, "trtllm", 0),
                  op, "segment_alignment");
  EXPECT_FI_ERROR(group_gemm_fp8_nt_groupwise(a, b.slice(1, 0, 132), sa_k, sb_k, i32(indptr),
                                              {1, 128, 128}, "K"),
                  op, "b");  // n % 8
  EXPECT_FI_ERROR(
      group_gemm_fp8_nt_groupwise(a, b, sa_k, sb_k, i32(indptr), {1, 128, 128}, "K", 1,
                                  Tensor::zeros({cum, n}, DType::kBFloat16), DType::kFloat16),
      op, "out");
  EXPECT_FI_ERROR(group_gemm_fp8_nt_groupwise(a, b, sa_k, sb_k, i32(indptr), {1, 128, 128}, "K", 1,
                                              std::nullopt, DType::kFloat32),
                  op, "out_dtype");
}

// Activation scales of group_gemm_mxfp8_mxfp4/nvfp4: each group's rows padded to 128 and
// swizzled on their own, blocks concatenated.
void check_padded_fp4(bool nvfp4) {
  SCOPED_TRACE(nvfp4 ? "nvfp4" : "mxfp8 x mxfp4");
  const int64_t k = 128, n = 16, B = 3, vec = nvfp4 ? 16 : 32, cols = k / vec;
  const std::vector<int64_t> indptr = {0, 8, 8, 140};
  const int64_t cum = 140, padded = 128 + 0 + 256, n_pad = 128;
  Tensor a = nvfp4 ? rand_bytes({cum, k / 2}, 71)
                   : rand_tensor({cum, k}, DType::kFloat32, 71).to(DType::kFloat8E4M3FN);
  Tensor b = rand_bytes({B, n, k / 2}, 72);
  const DType sf_dt = nvfp4 ? DType::kFloat8E4M3FN : DType::kUInt8;
  Tensor sa = Tensor::zeros({padded, cols}, sf_dt), sb = Tensor::zeros({B, n_pad, cols}, sf_dt);
  Tensor ra = rand_bytes({cum * cols}, 73), rb = rand_bytes({B * n * cols}, 74);
  auto code = [&](uint8_t v) {
    return nvfp4 ? static_cast<uint8_t>(0x30 + v % 17) : static_cast<uint8_t>(125 + v % 5);
  };
  std::vector<double> A(static_cast<std::size_t>(cum * k)), Bd(static_cast<std::size_t>(B * n * k));
  const std::vector<double> av = nvfp4 ? std::vector<double>{} : a.to_double_vector();
  int64_t base = 0;
  for (int64_t e = 0; e < B; ++e) {
    const int64_t r0 = indptr[static_cast<std::size_t>(e)],
                  r1 = indptr[static_cast<std::size_t>(e) + 1];
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const uint8_t sc = code(static_cast<const uint8_t*>(ra.data_ptr())[r * cols + c]);
        static_cast<uint8_t*>(sa.data_ptr())[base * cols + swz(r - r0, c, cols)] = sc;
        for (int64_t kk = c * vec; kk < (c + 1) * vec; ++kk) {
          double v;
          if (nvfp4) {
            const uint8_t byte = static_cast<const uint8_t*>(a.data_ptr())[r * (k / 2) + kk / 2];
            v = e2m1(kk % 2 == 0 ? (byte & 15) : (byte >> 4));
          } else {
            v = av[static_cast<std::size_t>(r * k + kk)];
          }
          A[static_cast<std::size_t>(r * k + kk)] = v * scale_value(sc, nvfp4);
        }
      }
    }
    base += (r1 - r0 + 127) / 128 * 128;
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t c = 0; c < cols; ++c) {
        const uint8_t sc = code(static_cast<const uint8_t*>(rb.data_ptr())[(e * n + j) * cols + c]);
        static_cast<uint8_t*>(sb.data_ptr())[e * n_pad * cols + swz(j, c, cols)] = sc;
        for (int64_t kk = c * vec; kk < (c + 1) * vec; ++kk) {
          const uint8_t byte =
              static_cast<const uint8_t*>(b.data_ptr())[(e * n + j) * (k / 2) + kk / 2];
          Bd[static_cast<std::size_t>((e * n + j) * k + kk)] =
              e2m1(kk % 2 == 0 ? (byte & 15) : (byte >> 4)) * scale_value(sc, nvfp4);
        }
      }
    }
  }
  std::vector<double> ref;
  Tensor out;
  if (nvfp4) {
    Tensor alpha = Tensor::from_vector({0.5, 4.0, 0.25}, {3}, DType::kFloat32);
    out = group_gemm_nvfp4_nt_groupwise(a, b, sa, sb, i32(indptr), alpha);
    ref = grouped_ref(A, Bd, indptr, cum, n, k, 1.0);
    const double al[3] = {0.5, 4.0, 0.25};
    for (int64_t e = 0; e < B; ++e) {
      for (int64_t r = indptr[static_cast<std::size_t>(e)];
           r < indptr[static_cast<std::size_t>(e) + 1]; ++r) {
        for (int64_t j = 0; j < n; ++j) ref[static_cast<std::size_t>(r * n + j)] *= al[e];
      }
    }
  } else {
    out = group_gemm_mxfp8_mxfp4_nt_groupwise(a, b, sa, sb, i32(indptr));
    ref = grouped_ref(A, Bd, indptr, cum, n, k, 1.0);
  }
  EXPECT_TRUE(all_close(out, ref, default_tolerance(DType::kBFloat16)));
}

TEST(GroupGemmFp4NtGroupwise, MxFp4AndNvfp4MatchFp64) {
  check_padded_fp4(false);
  check_padded_fp4(true);
  const char* op = "group_gemm_mxfp8_mxfp4_nt_groupwise";
  Tensor a = rand_tensor({8, 128}, DType::kFloat32, 1).to(DType::kFloat8E4M3FN);
  Tensor b = rand_bytes({1, 16, 64}, 2);
  Tensor sa = Tensor::zeros({128, 4}, DType::kUInt8),
         sb = Tensor::zeros({1, 128, 4}, DType::kUInt8);
  EXPECT_FI_ERROR(group_gemm_mxfp8_mxfp4_nt_groupwise(a, b, sa, sb, i32({0, 8}), 1, 64), op,
                  "tile_m");
  EXPECT_FI_ERROR(group_gemm_mxfp8_mxfp4_nt_groupwise(a, b, sa, sb, i32({0, 8}), 1, 128, 96), op,
                  "tile_n");
  EXPECT_FI_ERROR(group_gemm_mxfp8_mxfp4_nt_groupwise(a, b, sa.slice(0, 0, 8), sb, i32({0, 8})), op,
                  "a_scale");
  EXPECT_FI_ERROR(group_gemm_mxfp8_mxfp4_nt_groupwise(a, b, sa, sb.slice(1, 0, 16), i32({0, 8})),
                  op, "b_scale");
  EXPECT_FI_ERROR(group_gemm_mxfp8_mxfp4_nt_groupwise(a.slice(0, 0, 6), b, sa, sb, i32({0, 6})), op,
                  "m_indptr");  // not a multiple of 4
  EXPECT_FI_ERROR(group_gemm_mxfp8_mxfp4_nt_groupwise(a.slice(1, 0, 64), b, sa, sb, i32({0, 8})),
                  op, "a");
  EXPECT_FI_ERROR(group_gemm_nvfp4_nt_groupwise(
                      rand_bytes({8, 64}, 3), b, Tensor::zeros({128, 8}, DType::kFloat8E4M3FN),
                      Tensor::zeros({1, 128, 8}, DType::kFloat8E4M3FN), i32({0, 8}),
                      Tensor::full({2}, 1.0, DType::kFloat32)),
                  "group_gemm_nvfp4_nt_groupwise", "alpha");
}

// moe_gemm_*_nt_groupwise: expert e's activation-scale rows start at (m_indptr[e] + 3e) / 4 * 4.
TEST(MoeGemmSm120, Fp8PlainGatedAndMxfp8MatchFp64) {
  const int64_t k = 256, n = 256, E = 3;
  const std::vector<int64_t> indptr = {0, 3, 3, 8};  // expert 1 empty
  const int64_t cum = 8, m_pad = (cum + 3 * E) / 4 * 4, kb = 2, nb = 2;
  Tensor a = rand_tensor({cum, k}, DType::kFloat32, 81).to(DType::kFloat8E4M3FN);
  Tensor b = rand_tensor({E, n, k}, DType::kFloat32, 82, -0.5, 0.5).to(DType::kFloat8E4M3FN);
  const std::vector<double> Av = a.to_double_vector(), Bv = b.to_double_vector();
  // fp8: a_scale [kb, m_pad] (padding columns hold junk), b_scale [E, kb, nb]
  Tensor sa = rand_tensor({kb, m_pad}, DType::kFloat32, 83, 0.1, 0.5);
  Tensor sb = rand_tensor({E, kb, nb}, DType::kFloat32, 84, 0.1, 0.5);
  const std::vector<double> SA = sa.to_double_vector(), SB = sb.to_double_vector();
  std::vector<double> A(Av.size()), Bd(Bv.size());
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = indptr[static_cast<std::size_t>(e)];
    const int64_t col0 = (r0 + 3 * e) / 4 * 4;
    for (int64_t r = r0; r < indptr[static_cast<std::size_t>(e) + 1]; ++r) {
      for (int64_t c = 0; c < k; ++c) {
        A[static_cast<std::size_t>(r * k + c)] =
            Av[static_cast<std::size_t>(r * k + c)] *
            SA[static_cast<std::size_t>((c / 128) * m_pad + col0 + r - r0)];
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t c = 0; c < k; ++c) {
        const std::size_t i = static_cast<std::size_t>((e * n + j) * k + c);
        Bd[i] = Bv[i] * SB[static_cast<std::size_t>((e * kb + c / 128) * nb + j / 128)];
      }
    }
  }
  const auto plain = grouped_ref(A, Bd, indptr, cum, n, k, 1.0);
  EXPECT_TRUE(all_close(moe_gemm_fp8_nt_groupwise(a, b, sa, sb, i32(indptr)), plain,
                        default_tolerance(DType::kBFloat16)));
  // Gated: up = rows [0, n/2), gate = [n/2, n); out = SiLU(gate) * up.
  Tensor g = moe_gemm_fp8_nt_groupwise(a, b, sa, sb, i32(indptr), {1, 128, 128}, "MN", "cute",
                                       std::nullopt, std::nullopt, true);
  ASSERT_EQ(g.shape(), (Shape{cum, n / 2}));
  std::vector<double> gated(static_cast<std::size_t>(cum * n / 2));
  for (int64_t r = 0; r < cum; ++r) {
    for (int64_t j = 0; j < n / 2; ++j) {
      const double up = plain[static_cast<std::size_t>(r * n + j)];
      const double gate = plain[static_cast<std::size_t>(r * n + n / 2 + j)];
      gated[static_cast<std::size_t>(r * n / 2 + j)] = up * gate / (1.0 + std::exp(-gate));
    }
  }
  EXPECT_TRUE(all_close(g, gated, default_tolerance(DType::kBFloat16)));

  // mxfp8, k_gran 32: int32-packed UE8M0, 4 blocks per word (little-endian bytes).
  const int64_t gk = 32, k_align = (k + 4 * gk - 1) / (4 * gk), blocks = k / gk;
  Tensor msa = Tensor::zeros({m_pad, k_align}, DType::kInt32);
  Tensor msb = Tensor::zeros({E, n, k_align}, DType::kInt32);
  Tensor ra = rand_bytes({m_pad * blocks}, 85), rb = rand_bytes({E * n * blocks}, 86);
  auto* pa = static_cast<uint8_t*>(msa.data_ptr());
  auto* pb = static_cast<uint8_t*>(msb.data_ptr());
  std::vector<double> MA(Av.size()), MB(Bv.size());
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = indptr[static_cast<std::size_t>(e)];
    const int64_t row0 = (r0 + 3 * e) / 4 * 4;
    for (int64_t r = r0; r < indptr[static_cast<std::size_t>(e) + 1]; ++r) {
      for (int64_t bl = 0; bl < blocks; ++bl) {
        const uint8_t code = static_cast<uint8_t>(
            125 + static_cast<const uint8_t*>(ra.data_ptr())[r * blocks + bl] % 5);
        pa[(row0 + r - r0) * k_align * 4 + bl] = code;  // word bl / 4, byte bl % 4
        for (int64_t c = bl * gk; c < (bl + 1) * gk; ++c) {
          MA[static_cast<std::size_t>(r * k + c)] =
              Av[static_cast<std::size_t>(r * k + c)] * std::ldexp(1.0, code - 127);
        }
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t bl = 0; bl < blocks; ++bl) {
        const uint8_t code = static_cast<uint8_t>(
            125 + static_cast<const uint8_t*>(rb.data_ptr())[(e * n + j) * blocks + bl] % 5);
        pb[(e * n + j) * k_align * 4 + bl] = code;
        for (int64_t c = bl * gk; c < (bl + 1) * gk; ++c) {
          const std::size_t i = static_cast<std::size_t>((e * n + j) * k + c);
          MB[i] = Bv[i] * std::ldexp(1.0, code - 127);
        }
      }
    }
  }
  EXPECT_TRUE(all_close(moe_gemm_mxfp8_nt_groupwise(a, b, msa, msb, i32(indptr), {1, 1, 32}),
                        grouped_ref(MA, MB, indptr, cum, n, k, 1.0),
                        default_tolerance(DType::kBFloat16)));

  const char* op = "moe_gemm_fp8_nt_groupwise";
  EXPECT_FI_ERROR(moe_gemm_fp8_nt_groupwise(a, b, sa, sb, i32(indptr), {1, 128, 64}), op,
                  "scale_granularity_mnk");
  EXPECT_FI_ERROR(moe_gemm_fp8_nt_groupwise(a, b, sa, sb, i32(indptr), {1, 128, 128}, "K"), op,
                  "scale_major_mode");
  EXPECT_FI_ERROR(moe_gemm_fp8_nt_groupwise(a, b, sa, sb, i32(indptr), {1, 128, 128}, "MN", "x"),
                  op, "backend");
  EXPECT_FI_ERROR(moe_gemm_fp8_nt_groupwise(a, b, sa, sb, i32({0, 3, 3, 7})), op, "m_indptr");
  EXPECT_FI_ERROR(moe_gemm_fp8_nt_groupwise(a, b, sa.slice(1, 0, 8), sb, i32(indptr)), op,
                  "a_scale");
  EXPECT_FI_ERROR(moe_gemm_fp8_nt_groupwise(a, b, sa, sb, i32(indptr), {1, 128, 128}, "MN", "cute",
                                            std::nullopt, DType::kFloat16),
                  op, "out_dtype");
  EXPECT_FI_ERROR(moe_gemm_mxfp8_nt_groupwise(a, b, msa, msb, i32(indptr), {1, 128, 32}),
                  "moe_gemm_mxfp8_nt_groupwise", "scale_granularity_mnk");
  EXPECT_FI_ERROR(moe_gemm_mxfp8_nt_groupwise(a, b, msa, msb, i32(indptr), {1, 1, 128}),
                  "moe_gemm_mxfp8_nt_groupwise", "a_scale");  // k_align differs for 128
}

TEST(DeepGemmFp8, ContiguousAndMaskedMatchFp64) {
  const int64_t m = 12, k = 256, n = 128, B = 3, kb = 2;
  Tensor a = rand_tensor({m, k}, DType::kFloat32, 61).to(DType::kFloat8E4M3FN);
  Tensor b = rand_tensor({B, n, k}, DType::kFloat32, 62).to(DType::kFloat8E4M3FN);
  Tensor sa = rand_tensor({m, kb}, DType::kFloat32, 63, 0.1, 1.0);
  Tensor sb = rand_tensor({B, 1, kb}, DType::kFloat32, 64, 0.1, 1.0);
  // rows: expert 2, 2, 0, -1 (padding), 0, 1, ...
  const std::vector<int64_t> idx = {2, 2, 0, -1, 0, 1, 1, 1, -1, -1, 2, 0};
  const std::vector<double> A = a.to_double_vector(), Bv = b.to_double_vector();
  // DeepGEMM reads fp32 scales as UE8M0 (upstream, SM100): each one's power of two rounded down.
  auto ue8m0 = [](std::vector<double> v) {
    for (double& x : v) x = std::exp2(std::floor(std::log2(x)));
    return v;
  };
  const std::vector<double> SA = ue8m0(sa.to_double_vector()), SB = ue8m0(sb.to_double_vector());
  std::vector<double> ref(static_cast<std::size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t e = idx[static_cast<std::size_t>(i)];
    if (e < 0) continue;
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        acc += A[static_cast<std::size_t>(i * k + c)] *
               SA[static_cast<std::size_t>(i * kb + c / 128)] *
               Bv[static_cast<std::size_t>((e * n + j) * k + c)] *
               SB[static_cast<std::size_t>(e * kb + c / 128)];
      }
      ref[static_cast<std::size_t>(i * n + j)] = acc;
    }
  }
  Tensor out = group_deepgemm_fp8_nt_groupwise(a, b, sa, sb, i32(idx));
  EXPECT_TRUE(all_close(out, ref, default_tolerance(DType::kBFloat16)));
  const char* op = "group_deepgemm_fp8_nt_groupwise";
  std::vector<int64_t> bad = idx;
  bad[3] = 3;
  EXPECT_FI_ERROR(group_deepgemm_fp8_nt_groupwise(a, b, sa, sb, i32(bad)), op, "m_indices");
  EXPECT_FI_ERROR(group_deepgemm_fp8_nt_groupwise(a, b, sa, sb, i32(idx), {1, 128, 64}), op,
                  "scale_granularity_mnk");
  EXPECT_FI_ERROR(group_deepgemm_fp8_nt_groupwise(a.to(DType::kFloat32).to(DType::kFloat8E5M2), b,
                                                  sa, sb, i32(idx)),
                  op, "a");
  EXPECT_FI_ERROR(
      group_deepgemm_fp8_nt_groupwise(a, b, sa.transpose(0, 1).contiguous(), sb, i32(idx)), op,
      "a_scale");

  // Masked batched: batch g is rows 4g..4g+3 of a, masked_m {4, 1, 0}; rows past keep 9.
  Tensor a3 = a.reshape({B, 4, k}), sa3 = sa.reshape({B, 4, kb});
  Tensor given = Tensor::full({B, 4, n}, 9.0, DType::kBFloat16);
  const std::vector<int64_t> mm = {4, 1, 0};
  Tensor r = batch_deepgemm_fp8_nt_groupwise(a3, b, sa3, sb, i32(mm), 2, {1, 128, 128}, given);
  EXPECT_EQ(r.data_ptr(), given.data_ptr());
  std::vector<double> ref3(static_cast<std::size_t>(B * 4 * n), 9.0);
  for (int64_t g = 0; g < B; ++g) {
    for (int64_t i = 0; i < mm[static_cast<std::size_t>(g)]; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        const int64_t row = g * 4 + i;
        for (int64_t c = 0; c < k; ++c) {
          acc += A[static_cast<std::size_t>(row * k + c)] *
                 SA[static_cast<std::size_t>(row * kb + c / 128)] *
                 Bv[static_cast<std::size_t>((g * n + j) * k + c)] *
                 SB[static_cast<std::size_t>(g * kb + c / 128)];
        }
        ref3[static_cast<std::size_t>((g * 4 + i) * n + j)] = acc;
      }
    }
  }
  EXPECT_TRUE(all_close(given, ref3, default_tolerance(DType::kBFloat16)));
  const char* op2 = "batch_deepgemm_fp8_nt_groupwise";
  EXPECT_FI_ERROR(batch_deepgemm_fp8_nt_groupwise(a3, b, sa3, sb, i32({5, 1, 0}), 2), op2,
                  "masked_m");
  EXPECT_FI_ERROR(batch_deepgemm_fp8_nt_groupwise(a3, b, sa3, sb, i32({4, 1}), 2), op2, "masked_m");
  EXPECT_FI_ERROR(batch_deepgemm_fp8_nt_groupwise(a3, b.slice(0, 0, 2), sa3, sb, i32(mm), 2), op2,
                  "b");
  EXPECT_FI_ERROR(batch_deepgemm_fp8_nt_groupwise(a3, b, sa3, sb.slice(0, 0, 2), i32(mm), 2), op2,
                  "b_scale");
  // bf16 output only (upstream: "d must be bfloat16").
  EXPECT_FI_ERROR(group_deepgemm_fp8_nt_groupwise(a, b, sa, sb, i32(idx), {1, 128, 128},
                                                  std::nullopt, DType::kFloat16),
                  op, "out_dtype");
  EXPECT_FI_ERROR(group_deepgemm_fp8_nt_groupwise(a, b, sa, sb, i32(idx), {1, 128, 128},
                                                  Tensor::zeros({m, n}, DType::kFloat16)),
                  op, "out");
}

// Hand-checked: ones [128, 128] x ones [1, 128, 128] with a_scale 1.5 and b_scale 1 sums 128
// ones times 1 (1.5 as UE8M0 is 2^0), not 192; a scale of 0.75 counts as 0.5 (64), the user's
// scale tensors are left as they were.
TEST(DeepGemmFp8, ScalesAreReadAsUe8m0) {
  Tensor a = Tensor::full({128, 128}, 1.0, DType::kFloat8E4M3FN);
  Tensor b = Tensor::full({1, 128, 128}, 1.0, DType::kFloat8E4M3FN);
  Tensor sa = Tensor::full({128, 1}, 1.5, DType::kFloat32);
  Tensor sb = Tensor::full({1, 1, 1}, 1.0, DType::kFloat32);
  const std::vector<int64_t> idx(128, 0);
  Tensor out = group_deepgemm_fp8_nt_groupwise(a, b, sa, sb, i32(idx));
  for (double v : out.to_double_vector()) ASSERT_EQ(v, 128.0);
  EXPECT_EQ(sa.to_double_vector()[0], 1.5);
  Tensor sb3 = Tensor::full({1, 1, 1}, 0.75, DType::kFloat32);
  Tensor out3 = batch_deepgemm_fp8_nt_groupwise(a.reshape({1, 128, 128}), b,
                                                Tensor::full({1, 128, 1}, 1.0, DType::kFloat32),
                                                sb3, i32({128}), 128);
  for (double v : out3.to_double_vector()) ASSERT_EQ(v, 64.0);
}

// ---- declarations, backends, record/replay --------------------------------------------------

TEST(GroupedGemmDecls, ModulesBackendsAndRecordReplay) {
  const std::pair<const char*, const char*> names[] = {
      {"grouped_mm_bf16", "flashinfer.grouped_mm.core"},
      {"grouped_mm_fp8", "flashinfer.grouped_mm.core"},
      {"grouped_mm_mxfp8", "flashinfer.grouped_mm.core"},
      {"grouped_mm_fp4", "flashinfer.grouped_mm.core"},
      {"SegmentGEMMWrapper.__init__", "flashinfer.gemm.gemm_base"},
      {"SegmentGEMMWrapper.run", "flashinfer.gemm.gemm_base"},
      {"grouped_gemm_nt_masked", "flashinfer.gemm.kernels.grouped_gemm_masked_wrapper"},
      {"group_gemm_fp8_nt_groupwise", "flashinfer.gemm.gemm_base"},
      {"group_deepgemm_fp8_nt_groupwise", "flashinfer.gemm.gemm_base"},
      {"batch_deepgemm_fp8_nt_groupwise", "flashinfer.gemm.gemm_base"},
      {"group_gemm_mxfp8_mxfp4_nt_groupwise", "flashinfer.gemm.gemm_base"},
      {"group_gemm_nvfp4_nt_groupwise", "flashinfer.gemm.gemm_base"},
      {"moe_gemm_fp8_nt_groupwise", "flashinfer.grouped_mm.cute_sm120_fp8_groupwise.core"},
      {"moe_gemm_mxfp8_nt_groupwise", "flashinfer.grouped_mm.cute_sm120_mxfp8_groupwise.core"}};
  for (const auto& [name, module] : names) {
    const OpDecl* d = OpRegistry::global().find(name);
    ASSERT_NE(d, nullptr) << name;
    EXPECT_EQ(d->module, module) << name;
  }
  // grouped_mm_bf16 (sm80+) and grouped_mm_fp8 (sm89+, upstream's rule) have a CUDA kernel
  // under upstream's default name; the block-scaled variants say they have none.
  EXPECT_EQ(op_has_backend("grouped_mm_bf16", DeviceType::kCUDA),
            backend_requirement("grouped_mm_bf16").is_backend_supported("cudnn", 90));
  EXPECT_EQ(op_has_backend("grouped_mm_fp8", DeviceType::kCUDA), cuda_compiled());
  for (int cc : {89, 90}) {
    EXPECT_EQ(backend_requirement("grouped_mm_fp8").is_backend_supported("cudnn", cc),
              cuda_compiled())
        << cc;
  }
  EXPECT_FALSE(backend_requirement("grouped_mm_fp8").is_backend_supported("cudnn", 86));
  EXPECT_EQ(backend_requirement("grouped_mm_fp8").default_backend, "cudnn");
  for (const char* op : {"grouped_mm_mxfp8", "grouped_mm_fp4"}) {
    EXPECT_FALSE(backend_requirement(op).is_backend_supported("cudnn", 100)) << op;
    EXPECT_FALSE(op_has_backend(op, DeviceType::kCUDA)) << op;
  }
  EXPECT_FALSE(op_has_backend("grouped_gemm_nt_masked", DeviceType::kCUDA));
  // SegmentGEMMWrapper runs on the same grouped CUDA kernel (its __init__ lists run's backends).
  for (const char* op : {"SegmentGEMMWrapper.__init__", "SegmentGEMMWrapper.run"}) {
    EXPECT_TRUE(op_has_backend(op, DeviceType::kCPU)) << op;
    EXPECT_EQ(op_has_backend(op, DeviceType::kCUDA), cuda_compiled()) << op;
  }
  for (const char* op : {"group_gemm_fp8_nt_groupwise", "group_deepgemm_fp8_nt_groupwise",
                         "batch_deepgemm_fp8_nt_groupwise", "group_gemm_mxfp8_mxfp4_nt_groupwise",
                         "group_gemm_nvfp4_nt_groupwise", "moe_gemm_fp8_nt_groupwise",
                         "moe_gemm_mxfp8_nt_groupwise"}) {
    EXPECT_FALSE(op_has_backend(op, DeviceType::kCUDA)) << op;
  }

  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    Tensor a = rand_tensor({6, 32}, DType::kBFloat16, 1),
           b = rand_tensor({2, 8, 32}, DType::kBFloat16, 2);
    (void)grouped_mm_bf16(a, b, i32({0, 2, 6}));
    (void)grouped_mm_fp8(a.to(DType::kFloat8E4M3FN), b.to(DType::kFloat8E4M3FN), i32({1, 1, 5}),
                         Tensor::full({1}, 2.0, DType::kFloat32));
    Scales sa = make_scales(1, 128, 4, false, {128, 4}, 5),
           sb = make_scales(2, 128, 4, false, {2, 128, 4}, 6);
    (void)grouped_mm_mxfp8(rand_tensor({128, 128}, DType::kFloat32, 7).to(DType::kFloat8E4M3FN),
                           rand_tensor({2, 128, 128}, DType::kFloat32, 8).to(DType::kFloat8E4M3FN),
                           sa.swizzled, sb.swizzled, i32({0, 100, 128}));
    Scales fa = make_scales(1, 128, 8, true, {128, 8}, 9),
           fb = make_scales(2, 128, 8, true, {2, 128, 8}, 10);
    (void)grouped_mm_fp4(rand_bytes({128, 64}, 11), rand_bytes({2, 128, 64}, 12), fa.swizzled,
                         fb.swizzled, i32({0, 28, 128}), Tensor::full({1}, 0.5, DType::kFloat32));
    SegmentGEMMWrapper seg(Tensor::empty({16}, DType::kUInt8));
    (void)seg.run(a, rand_tensor({2, 32, 8}, DType::kBFloat16, 13), 2, false, std::nullopt,
                  i64({2, 3}), std::nullopt, i64({1, 1}));
    MaskedCase c = make_masked(true);
    GroupedGemmNtMaskedKwargs kw;
    kw.alpha = Tensor::full({3}, 0.5, DType::kFloat32);
    kw.alpha_dtype = "float32";
    (void)grouped_gemm_nt_masked(
        {c.A, c.SFA}, {c.B, c.SFB},
        Tensor::full({c.l, c.m, c.n}, 3.0, DType::kBFloat16).permute({1, 2, 0}), i32({5, 1, 0}),
        "float4_e2m1fn", "float8_e4m3fn", "bfloat16", 16, std::nullopt, std::nullopt, std::nullopt,
        std::nullopt, 0, std::nullopt, std::nullopt, std::nullopt, std::nullopt, false, false, kw);
    Tensor f8a = rand_tensor({8, 128}, DType::kFloat32, 14).to(DType::kFloat8E4M3FN);
    Tensor f8b = rand_tensor({2, 128, 128}, DType::kFloat32, 15).to(DType::kFloat8E4M3FN);
    Tensor s8 = rand_tensor({8, 1}, DType::kFloat32, 16, 0.1, 1.0);
    Tensor sb8 = rand_tensor({2, 1, 1}, DType::kFloat32, 17, 0.1, 1.0);
    (void)group_gemm_fp8_nt_groupwise(f8a, f8b, s8, sb8, i32({0, 4, 8}), {1, 128, 128}, "K");
    (void)group_deepgemm_fp8_nt_groupwise(f8a, f8b, s8, sb8, i32({1, 1, -1, 0, 0, 0, 1, -1}));
    (void)batch_deepgemm_fp8_nt_groupwise(f8a.reshape({2, 4, 128}), f8b, s8.reshape({2, 4, 1}), sb8,
                                          i32({3, 4}), 4);
    (void)group_gemm_mxfp8_mxfp4_nt_groupwise(
        f8a, rand_bytes({2, 16, 64}, 18), Tensor::full({256, 4}, 127.0, DType::kUInt8),
        Tensor::full({2, 128, 4}, 126.0, DType::kUInt8), i32({0, 4, 8}));
    (void)group_gemm_nvfp4_nt_groupwise(rand_bytes({8, 64}, 19), rand_bytes({2, 16, 64}, 20),
                                        Tensor::full({256, 8}, 0.5, DType::kFloat8E4M3FN),
                                        Tensor::full({2, 128, 8}, 2.0, DType::kFloat8E4M3FN),
                                        i32({0, 4, 8}), Tensor::full({2}, 0.5, DType::kFloat32));
    (void)moe_gemm_fp8_nt_groupwise(f8a, f8b, rand_tensor({1, 12}, DType::kFloat32, 21, 0.1, 1.0),
                                    sb8, i32({0, 5, 8}), {1, 128, 128}, "MN", "cute", std::nullopt,
                                    std::nullopt, true);
    (void)moe_gemm_mxfp8_nt_groupwise(f8a, f8b, Tensor::full({12, 1}, 2122219134.0, DType::kInt32),
                                      Tensor::full({2, 128, 1}, 2122219134.0, DType::kInt32),
                                      i32({0, 5, 8}));
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 14u);
  for (const auto& call : calls) {
    SCOPED_TRACE(call.name);
    // A replayed __init__ builds a new object (its own id): it only has to succeed.
    if (call.name == "SegmentGEMMWrapper.__init__") {
      EXPECT_TRUE(call.error.empty()) << call.error;
      EXPECT_NO_THROW((void)replay(call));
      continue;
    }
    EXPECT_TRUE(replays_identically(call));
  }
}

// The CUDA kernel of grouped_mm_bf16 against the CPU reference (skipped without a GPU).
TEST(GroupedMmBf16Cuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  Tensor a = rand_tensor({37, 64}, DType::kBFloat16, 1),
         b = rand_tensor({4, 40, 64}, DType::kBFloat16, 2);
  const Tensor indptr = i32({2, 10, 10, 30, 35});
  for (DType od : {DType::kBFloat16, DType::kFloat32}) {
    const Tensor ref = grouped_mm_bf16(a, b, indptr, std::nullopt, od);
    const Tensor got = grouped_mm_bf16(a.to(d), b.to(d), indptr.to(d), std::nullopt, od);
    EXPECT_TRUE(all_close(got.to(Device::cpu()), ref, default_tolerance(od)));
  }
}

// SegmentGEMMWrapper.run's CUDA backend against the CPU reference (skipped without a GPU):
// fp16, bf16 and e4m3 x (bf16 out), row- and column-major weights, seg_lens and seg_indptr,
// weight_indices with repeats and an empty segment, rows in no segment (zeros, or out's values
// when out is given), x with a non-unit k stride.
TEST(SegmentGemmCuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  SegmentGEMMWrapper seg_cpu(Tensor::empty({1024}, DType::kUInt8));
  SegmentGEMMWrapper seg_gpu(Tensor::empty({1024}, DType::kUInt8, d));
  const int64_t cum = 45, d_in = 72, d_out = 40, W = 3;
  // Segments of 7, 0, 20, 1 and 13 rows from row 2 (seg_indptr; rows 0, 1, 43 and 44 are in
  // none) or from row 0 (seg_lens; rows 41..44 in none).
  const std::vector<int64_t> indptr = {2, 9, 9, 29, 30, 43}, widx = {2, 0, 2, 1, 0};
  const std::vector<int64_t> lens = {7, 0, 20, 1, 13};
  uint64_t seed = 40;
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3FN}) {
    const DType od = dt == DType::kFloat8E4M3FN ? DType::kBFloat16 : dt;
    for (bool col_major : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (col_major ? " column major" : " row major"));
      const Shape ws = col_major ? Shape{W, d_out, d_in} : Shape{W, d_in, d_out};
      const Tensor w = rand_tensor(ws, DType::kFloat32, ++seed).to(dt);
      const Tensor x = rand_tensor({cum, d_in}, DType::kFloat32, ++seed).to(dt);
      // seg_indptr and weight_indices, output allocated (zeros outside the segments)
      const Tensor ref =
          seg_cpu.run(x, w, 5, col_major, std::nullopt, std::nullopt, i32(indptr), i64(widx));
      const Tensor got = seg_gpu.run(x.to(d), w.to(d), 5, col_major, std::nullopt, std::nullopt,
                                     i32(indptr).to(d), i64(widx).to(d));
      EXPECT_EQ(got.dtype(), od);
      EXPECT_TRUE(all_close(got.to(Device::cpu()), ref, default_tolerance(od)));
      // seg_lens, no weight_indices (segment i uses weights[i]: 5 segments need 5 weights), out
      // given and prefilled, x strided along k
      const Tensor w5 = rand_tensor(col_major ? Shape{5, d_out, d_in} : Shape{5, d_in, d_out},
                                    DType::kFloat32, ++seed)
                            .to(dt);
      const Tensor xt = rand_tensor({d_in, cum}, DType::kFloat32, ++seed).to(dt).transpose(0, 1);
      Tensor out_cpu = Tensor::full({cum, d_out}, 3.0, od);
      Tensor out_gpu = Tensor::full({cum, d_out}, 3.0, od, d);
      (void)seg_cpu.run(xt, w5, 5, col_major, out_cpu, i64(lens));
      (void)seg_gpu.run(to_keep_layout(xt, d), w5.to(d), 5, col_major, out_gpu, i64(lens).to(d));
      EXPECT_TRUE(all_close(out_gpu.to(Device::cpu()), out_cpu, default_tolerance(od)));
      // rows 41..44 are in no segment
      EXPECT_EQ(out_gpu.to(Device::cpu()).to_double_vector()[44 * d_out], 3.0);
    }
  }
}

// ---- the tensor-core grouped kernel (CUDA; skipped without a GPU) ---------------------------
//
// Aligned operands (16-byte rows, unit k stride) run on the tensor-core kernel; the same values in
// a column-major copy of a (k stride != 1) run on the CUDA-core kernel, the tests' second
// opinion. Integer operands make every product and partial sum an integer below 2^24, exact in
// fp32 in any order, so those cases compare bit for bit whatever the accumulation order (tensor
// cores sum blocks of 16 products, the CPU and the CUDA-core kernel one product at a time).

// Integers in [-r, r] (exact in bf16, fp16, e4m3 and e5m2 for r <= 8), as `dt`.
Tensor int_tensor(const Shape& shape, int r, DType dt, uint64_t seed) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  std::vector<double> v(static_cast<std::size_t>(count));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (double& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<double>(static_cast<int>((s >> 33) % static_cast<uint64_t>(2 * r + 1)) - r);
  }
  return Tensor::from_vector(v, shape, DType::kFloat32).to(dt);
}

// The same logical [rows, k] matrix with strides (1, rows): the CUDA-core kernel's layout.
Tensor column_major(const Tensor& t) { return t.transpose(0, 1).contiguous().transpose(0, 1); }

::testing::AssertionResult bit_equal(const Tensor& got, const Tensor& ref) {
  if (got.shape() != ref.shape() || got.dtype() != ref.dtype()) {
    return ::testing::AssertionFailure() << got.describe() << " vs " << ref.describe();
  }
  const std::vector<double> g = got.to(Device::cpu()).to_double_vector(),
                            r = ref.to_double_vector();
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (g[i] != r[i] && !(std::isnan(g[i]) && std::isnan(r[i]))) {
      if (bad++ == 0) first = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << g.size() << " differ; first at " << first
                                       << ": " << g[first] << " vs " << r[first];
}

// Groups of 0, 1, 127, 128, 129 and 300 rows and an empty one, rows 0..2 and 688..699 in none:
// partial and full m tiles; n = 200 and k = 200 leave partial n and k tiles.
const std::vector<int64_t> kEdgeIndptr = {3, 3, 4, 131, 259, 388, 688, 688};
constexpr int64_t kEdgeRows = 700, kEdgeN = 200, kEdgeK = 200;

TEST(GroupedMmBf16Cuda, TensorCoresExactOnIntegerOperands) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  // The mma.sync kernel's (on sm_90 CUTLASS would take the bf16-output calls:
  // GroupedMmBf16Cuda.CutlassPathOnHopperMatchesCpuAndTheMmaKernel checks that one).
  const testing::ScopedEnv mma_only("FLASHINFER_GROUPED_MM_CUTLASS", "0");
#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
  const kernels::cuda::GroupedMmRoutes routes_before = kernels::cuda::grouped_mm_routes();
#endif
  const Device d = Device::cuda(0);
  const int64_t E = static_cast<int64_t>(kEdgeIndptr.size()) - 1;
  const Tensor a = int_tensor({kEdgeRows, kEdgeK}, 4, DType::kBFloat16, 1);
  const Tensor b = int_tensor({E, kEdgeN, kEdgeK}, 4, DType::kBFloat16, 2);
  const Tensor ip = i32(kEdgeIndptr), ipd = ip.to(d);
  const Tensor ad = a.to(d), bd = b.to(d), a_cm = to_keep_layout(column_major(a), d);
  for (DType od : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    SCOPED_TRACE(dtype_name(od));
    const Tensor ref = grouped_mm_bf16(a, b, ip, std::nullopt, od);
    const Tensor got = grouped_mm_bf16(ad, bd, ipd, std::nullopt, od);
    EXPECT_TRUE(bit_equal(got, ref));
    EXPECT_TRUE(bit_equal(grouped_mm_bf16(a_cm, bd, ipd, std::nullopt, od), ref));
  }
  // out given: prefilled, with rows of 201 elements (odd: the element-wise store path); rows in
  // no group keep their values.
  Tensor wide = Tensor::full({kEdgeRows, kEdgeN + 1}, 7.0, DType::kBFloat16, d);
  Tensor out = wide.slice(1, 0, kEdgeN);
  (void)grouped_mm_bf16(ad, bd, ipd, out);
  Tensor ref_out = Tensor::full({kEdgeRows, kEdgeN}, 7.0, DType::kBFloat16);
  (void)grouped_mm_bf16(a, b, ip, ref_out);
  EXPECT_TRUE(bit_equal(out, ref_out));
  const std::vector<double> w = wide.to(Device::cpu()).to_double_vector();
  EXPECT_EQ(w[0], 7.0);                                         // row 0: in no group
  EXPECT_EQ(w[static_cast<std::size_t>(699 * 201 + 5)], 7.0);   // row 699: in no group
  EXPECT_EQ(w[static_cast<std::size_t>(10 * 201 + 200)], 7.0);  // column 200: outside out
#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
  EXPECT_GT(kernels::cuda::grouped_mm_routes().mma, routes_before.mma) << "no mma.sync call";
  EXPECT_EQ(kernels::cuda::grouped_mm_routes().cutlass, routes_before.cutlass) << "CUTLASS ran";
#endif
}

// On CUDA m_indptr is read on the device only (no host check, as upstream): out-of-range and
// decreasing entries are clamped to [0, cum_m] (a group ends no earlier than it starts), giving
// the rows of the clamped split and nothing outside the tensors.
TEST(GroupedMmBf16Cuda, DeviceIndptrClamped) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  const Tensor a = int_tensor({10, 64}, 4, DType::kBFloat16, 21);
  const Tensor b = int_tensor({2, 24, 64}, 4, DType::kBFloat16, 22);
  const std::pair<std::vector<int64_t>, std::vector<int64_t>> cases[] = {
      {{-2, 3, 100}, {0, 3, 10}}, {{0, 5, 3}, {0, 5, 5}}, {{7, 2, 9}, {2, 2, 9}}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.first[0]);
    // The CPU still checks the values: it refuses the bad split itself.
    EXPECT_FI_ERROR((void)grouped_mm_bf16(a, b, i32(c.first)), "grouped_mm_bf16", "m_indptr");
    // fp32 out runs the mma.sync kernel; bf16 out, on sm_90 with CUTLASS, CUTLASS's kernel.
    for (DType od : {DType::kFloat32, DType::kBFloat16}) {
      const Tensor ref = grouped_mm_bf16(a, b, i32(c.second), std::nullopt, od);
      EXPECT_TRUE(
          bit_equal(grouped_mm_bf16(a.to(d), b.to(d), i32(c.first).to(d), std::nullopt, od), ref));
    }
  }
}

// |got - exact| within what fp32 accumulation in any order can reach, plus the output rounding:
// each of the k additions errs by at most 2^-24 of a partial sum, itself at most S = sum |a b|
// (2^-22 per addition here, allowing for tensor-core accumulators that truncate); rounding the
// result to the output format adds half an ulp of it (2^-9 relative for bf16, 2^-24 for fp32).
::testing::AssertionResult within_accumulation_bound(const Tensor& got,
                                                     const std::vector<double>& exact,
                                                     const std::vector<double>& abs_sum, int64_t k,
                                                     double slack = 1.0) {
  const std::vector<double> g = got.to(Device::cpu()).to_double_vector();
  const double out_rel = got.dtype() == DType::kBFloat16  ? std::ldexp(1.0, -8)
                         : got.dtype() == DType::kFloat16 ? std::ldexp(1.0, -11)
                                                          : std::ldexp(1.0, -23);
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double acc = slack * static_cast<double>(k) * std::ldexp(1.0, -22) * abs_sum[i];
    if (!(std::fabs(g[i] - exact[i]) <= out_rel * std::fabs(exact[i]) + 2.0 * acc)) {
      if (bad++ == 0) first = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << g.size() << " outside the bound; first "
                                       << first << ": " << g[first] << " vs " << exact[first];
}

// 70 groups of random sizes (a fifth empty, the rest below max_rows) after one row in no group,
// two more rows in none after them, n 296, k 1032; random bf16 operands from a_seed / b_seed,
// the exact products and the sums of |a b| that within_accumulation_bound needs.
struct RandomGroupedCase {
  std::vector<int64_t> indptr;
  int64_t cum = 0, n = 296, k = 1032;
  Tensor a, b;
  std::vector<double> exact, abs_sum;
};
// The m_indptr of RandomGroupedCase: 70 groups from `seed`, a fifth empty, the rest of fewer than
// max_rows rows, after one row in no group.
std::vector<int64_t> random_group_indptr(uint64_t seed, int64_t max_rows) {
  std::vector<int64_t> indptr = {1};
  uint64_t s = seed;
  for (int g = 0; g < 70; ++g) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const int64_t m =
        (s >> 40) % 5 == 0 ? 0 : static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(max_rows));
    indptr.push_back(indptr.back() + m);
  }
  return indptr;
}
RandomGroupedCase random_grouped_case(uint64_t seed, int64_t max_rows, uint64_t a_seed,
                                      uint64_t b_seed) {
  RandomGroupedCase c;
  c.indptr = random_group_indptr(seed, max_rows);
  c.cum = c.indptr.back() + 2;
  c.a = rand_tensor({c.cum, c.k}, DType::kBFloat16, a_seed, -1.0, 1.0);
  c.b = rand_tensor({70, c.n, c.k}, DType::kBFloat16, b_seed, -1.0, 1.0);
  ExactAndAbsSum ref = grouped_ref_with_abs_sum(c.a.to_double_vector(), c.b.to_double_vector(),
                                                c.indptr, c.cum, c.n, c.k, 1.0);
  c.exact = std::move(ref.exact);
  c.abs_sum = std::move(ref.abs_sum);
  return c;
}

// 70 groups (three chunks of the CTA's warp walk over m_indptr), random sizes, k = 1032.
TEST(GroupedMmBf16Cuda, RandomMatchesFp64WithinAccumulationBound) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  const RandomGroupedCase c = random_grouped_case(99, 60, 3, 4);
  const Tensor& a = c.a;
  const std::vector<double>& exact = c.exact;
  const std::vector<double>& abs_sum = c.abs_sum;
  const int64_t k = c.k;
  const Tensor ad = a.to(d), bd = c.b.to(d), ipd = i32(c.indptr).to(d);
  for (DType od : {DType::kBFloat16, DType::kFloat32}) {
    SCOPED_TRACE(dtype_name(od));
    EXPECT_TRUE(within_accumulation_bound(grouped_mm_bf16(ad, bd, ipd, std::nullopt, od), exact,
                                          abs_sum, k));
  }
  // The CUDA-core kernel on the same values: both within the bound of the exact result, so
  // within twice of each other.
  const Tensor tc = grouped_mm_bf16(ad, bd, ipd, std::nullopt, DType::kFloat32).to(Device::cpu());
  const Tensor cc =
      grouped_mm_bf16(to_keep_layout(column_major(a), d), bd, ipd, std::nullopt, DType::kFloat32);
  EXPECT_TRUE(within_accumulation_bound(cc, tc.to_double_vector(), abs_sum, k, 2.0));
}

#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
// Whether the grouped GEMMs' CUTLASS path runs on `d`: a build with CUTLASS, an sm_90 device.
bool cutlass_grouped_here(Device d) {
#if FLASHINFER_TEST_HAVE_CUTLASS
  return api::compute_capability(d) == 90;
#else
  (void)d;
  return false;
#endif
}

// Whether a call since the counters read `before` ran the path expected here: CUTLASS's where it
// runs, else the mma.sync kernel.
bool ran_expected_path(const kernels::cuda::GroupedMmRoutes& before, bool cutlass) {
  const kernels::cuda::GroupedMmRoutes now = kernels::cuda::grouped_mm_routes();
  return cutlass ? now.cutlass > before.cutlass : now.mma > before.mma;
}

// grouped_mm_bf16 on an sm_90 device of a build with CUTLASS runs CUTLASS's grouped GEMM (TMA +
// wgmma) wherever its instance fits (bf16 out, 16-byte k-major rows; its counter says it ran),
// elsewhere the mma.sync kernel: bit-exact against the CPU on integer operands (groups of 0 to 300
// rows, partial n and k tiles, rows in no group left as they were; DeviceIndptrClamped above
// covers a clamped device m_indptr), and on random ones within the fp32 accumulation bound of the
// exact result and within twice it of the mma.sync kernel (FLASHINFER_GROUPED_MM_CUTLASS=0 on the
// same inputs).
TEST(GroupedMmBf16Cuda, CutlassPathOnHopperMatchesCpuAndTheMmaKernel) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  const bool cutlass = cutlass_grouped_here(d);
  auto routes = [] { return kernels::cuda::grouped_mm_routes(); };
  auto ran = [&](const kernels::cuda::GroupedMmRoutes& before) {
    return ran_expected_path(before, cutlass);
  };
  const testing::ScopedEnv default_path("FLASHINFER_GROUPED_MM_CUTLASS", nullptr);
  const int64_t E = static_cast<int64_t>(kEdgeIndptr.size()) - 1;
  const Tensor a = int_tensor({kEdgeRows, kEdgeK}, 4, DType::kBFloat16, 31);
  const Tensor b = int_tensor({E, kEdgeN, kEdgeK}, 4, DType::kBFloat16, 32);
  const Tensor ip = i32(kEdgeIndptr);
  auto before = routes();
  Tensor out = Tensor::full({kEdgeRows, kEdgeN}, 7.0, DType::kBFloat16, d);
  (void)grouped_mm_bf16(a.to(d), b.to(d), ip.to(d), out);
  EXPECT_TRUE(ran(before));
  Tensor ref = Tensor::full({kEdgeRows, kEdgeN}, 7.0, DType::kBFloat16);
  (void)grouped_mm_bf16(a, b, ip, ref);
  EXPECT_TRUE(bit_equal(out, ref));  // rows 0..2 and 688..699 keep their 7s
  // Eight groups of 128 rows, n 512, k 1024 (sums of |a b| <= 16 x 1024: exact in fp32).
  {
    std::vector<int64_t> full = {0};
    for (int g = 0; g < 8; ++g) full.push_back(full.back() + 128);
    const Tensor a8 = int_tensor({1024, 1024}, 2, DType::kBFloat16, 33);
    const Tensor b8 = int_tensor({8, 512, 1024}, 2, DType::kBFloat16, 34);
    before = routes();
    const Tensor got = grouped_mm_bf16(a8.to(d), b8.to(d), i32(full).to(d));
    EXPECT_TRUE(ran(before));
    EXPECT_TRUE(bit_equal(got, grouped_mm_bf16(a8, b8, i32(full))));
  }
  // Random values: 70 groups (some empty), n 296, k 1032.
  const RandomGroupedCase c = random_grouped_case(77, 200, 37, 38);
  const std::vector<double>& exact = c.exact;
  const std::vector<double>& abs_sum = c.abs_sum;
  const int64_t k = c.k;
  const Tensor ad = c.a.to(d), bd = c.b.to(d), ipd = i32(c.indptr).to(d);
  before = routes();
  const Tensor got = grouped_mm_bf16(ad, bd, ipd);
  EXPECT_TRUE(ran(before));
  EXPECT_TRUE(within_accumulation_bound(got, exact, abs_sum, k));
  before = routes();
  Tensor mma;
  {
    const testing::ScopedEnv mma_only("FLASHINFER_GROUPED_MM_CUTLASS", "0");
    mma = grouped_mm_bf16(ad, bd, ipd);
  }
  EXPECT_GT(routes().mma, before.mma);
  EXPECT_EQ(routes().cutlass, before.cutlass);
  EXPECT_TRUE(
      within_accumulation_bound(got, mma.to(Device::cpu()).to_double_vector(), abs_sum, k, 2.0));
}
#endif

#if FLASHINFER_TEST_HAVE_CUDART
// grouped_mm_bf16 captured into a CUDA graph: on a stream that never ran it, CUTLASS's path
// (whose scratch cannot grow during a capture) declines and the mma.sync kernel takes the call;
// after one eager call a captured call runs CUTLASS's path where it runs (sm_90 with CUTLASS).
// Either way the replayed graph gives the CPU's result (integer operands: bit-exact).
TEST(GroupedMmBf16Cuda, CapturedCallsMatchCpuOnEitherPath) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  const bool cutlass = cutlass_grouped_here(d);
  const testing::ScopedEnv default_path("FLASHINFER_GROUPED_MM_CUTLASS", nullptr);
  const std::vector<int64_t> indptr = {0, 40, 40, 200, 328};
  const Tensor a = int_tensor({328, 256}, 3, DType::kBFloat16, 41);
  const Tensor b = int_tensor({4, 136, 256}, 3, DType::kBFloat16, 42);
  const Tensor ref = grouped_mm_bf16(a, b, i32(indptr));
  const Tensor ag = a.to(d), bg = b.to(d), ig = i32(indptr).to(d);
  Tensor out = Tensor::zeros({328, 136}, DType::kBFloat16, d);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  void* const prev = current_cuda_stream();
  set_current_cuda_stream(stream);
  auto capture = [&] {
    testing::capture_and_launch(stream, cudaStreamCaptureModeGlobal,
                                [&] { (void)grouped_mm_bf16(ag, bg, ig, out); });
  };
  kernels::cuda::GroupedMmRoutes before = kernels::cuda::grouped_mm_routes();
  ASSERT_NO_FATAL_FAILURE(capture());  // a cold stream: the mma.sync kernel
  EXPECT_GT(kernels::cuda::grouped_mm_routes().mma, before.mma);
  EXPECT_EQ(kernels::cuda::grouped_mm_routes().cutlass, before.cutlass);
  EXPECT_TRUE(bit_equal(out, ref));
  (void)grouped_mm_bf16(ag, bg, ig, out);  // eager: CUTLASS's scratch grows where it runs
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(out.data_ptr(), 0, 328 * 136 * 2, stream), cudaSuccess);
  before = kernels::cuda::grouped_mm_routes();
  ASSERT_NO_FATAL_FAILURE(capture());
  EXPECT_TRUE(ran_expected_path(before, cutlass));
  EXPECT_TRUE(bit_equal(out, ref));
  set_current_cuda_stream(prev);
  cudaStreamDestroy(stream);
}
#endif

// e4m3 x e4m3 and e4m3 x e5m2 integer operands (|a b| <= 64, k = 208: sums below 2^14), alpha
// 0.5 (exact) or none: bit-exact against the CPU reference, on the mma.sync and CUDA-core
// kernels (CUTLASS's path, off here, has its own test below).
TEST(GroupedMmFp8Cuda, TensorCoresExactOnIntegerOperandsWithAlpha) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  if (api::compute_capability(Device::cuda(0)) < 89) {
    GTEST_SKIP() << "grouped_mm_fp8 on CUDA is sm89+ (upstream's rule)";
  }
  const testing::ScopedEnv mma_only("FLASHINFER_GROUPED_MM_CUTLASS", "0");
  const Device d = Device::cuda(0);
  const int64_t E = static_cast<int64_t>(kEdgeIndptr.size()) - 1, k = 208;
  const Tensor a = int_tensor({kEdgeRows, k}, 8, DType::kFloat8E4M3FN, 5);
  const Tensor ip = i32(kEdgeIndptr), ipd = ip.to(d);
  const Tensor alpha = Tensor::full({1}, 0.5, DType::kFloat32), alpha_d = alpha.to(d);
  const Tensor ad = a.to(d), a_cm = to_keep_layout(column_major(a), d);
  for (DType bt : {DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
    const Tensor b = int_tensor({E, kEdgeN, k}, 8, bt, 6), bd = b.to(d);
    for (DType od : {DType::kBFloat16, DType::kFloat32}) {
      for (bool with_alpha : {true, false}) {
        SCOPED_TRACE(std::string(dtype_name(bt)) + " " + std::string(dtype_name(od)) +
                     (with_alpha ? " alpha" : ""));
        const std::optional<Tensor> al = with_alpha ? std::optional<Tensor>(alpha) : std::nullopt;
        const std::optional<Tensor> ald =
            with_alpha ? std::optional<Tensor>(alpha_d) : std::nullopt;
        const Tensor ref = grouped_mm_fp8(a, b, ip, al, std::nullopt, od);
        EXPECT_TRUE(bit_equal(grouped_mm_fp8(ad, bd, ipd, ald, std::nullopt, od), ref));
        EXPECT_TRUE(bit_equal(grouped_mm_fp8(a_cm, bd, ipd, ald, std::nullopt, od), ref));
      }
    }
  }
}

// Random e4m3 operands, k = 4096 (64 k tiles): within the accumulation bound of the fp64 result.
TEST(GroupedMmFp8Cuda, RandomMatchesFp64WithinAccumulationBound) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  if (api::compute_capability(Device::cuda(0)) < 89) {
    GTEST_SKIP() << "grouped_mm_fp8 on CUDA is sm89+ (upstream's rule)";
  }
  const Device d = Device::cuda(0);
  const std::vector<int64_t> indptr = {0, 40, 40, 300};
  const int64_t cum = 300, n = 256, k = 4096, E = 3;
  const Tensor a = rand_tensor({cum, k}, DType::kFloat32, 7, -2.0, 2.0).to(DType::kFloat8E4M3FN);
  const Tensor b = rand_tensor({E, n, k}, DType::kFloat32, 8, -2.0, 2.0).to(DType::kFloat8E4M3FN);
  const ExactAndAbsSum ref =
      grouped_ref_with_abs_sum(a.to_double_vector(), b.to_double_vector(), indptr, cum, n, k, 0.25);
  const Tensor got =
      grouped_mm_fp8(a.to(d), b.to(d), i32(indptr).to(d),
                     Tensor::full({1}, 0.25, DType::kFloat32, d), std::nullopt, DType::kFloat32);
  EXPECT_TRUE(within_accumulation_bound(got, ref.exact, ref.abs_sum, k));
}

#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
// Waits up to `seconds` for the current stream's work (calls that take milliseconds): past that a
// kernel hangs, and since nothing stops a running kernel the test says which call did and ends
// the process, so that a log names the hang rather than ending at the binary's time limit.
void finishes_or_exit(const char* what, double seconds = 60.0) {
#if FLASHINFER_TEST_HAVE_CUDART
  const auto stream = static_cast<cudaStream_t>(current_cuda_stream());
  const auto t0 = std::chrono::steady_clock::now();
  while (cudaStreamQuery(stream) == cudaErrorNotReady) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) {
      std::fprintf(stderr, "%s has not finished after %.0f s: a GPU hang; ending the process\n",
                   what, seconds);
      std::fflush(stderr);
      std::fflush(stdout);
      std::_Exit(3);
    }
    usleep(1000);
  }
#else
  (void)what;
  (void)seconds;
#endif
}

// grouped_mm_fp8 e4m3 x e4m3 -> bf16 on an sm_90 device of a build with CUTLASS runs CUTLASS's
// FP8 grouped GEMM (its counter says so; elsewhere the mma.sync kernel). Integer operands with
// |a b| <= 16 (every 128-deep k tile's sum below 2^11, exact even in the FP8 tensor core's
// narrower accumulator, whose partial sums CUTLASS adds in fp32 after each tile), alpha 0.5 or
// none, k = 208 (a partial k tile), groups of 0 to 300 rows, rows in no group left as they were:
// bit-exact against the CPU. Each call must finish within a minute (finishes_or_exit).
TEST(GroupedMmFp8Cuda, CutlassPathOnHopperExactOnIntegerOperands) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  if (api::compute_capability(d) < 89) {
    GTEST_SKIP() << "grouped_mm_fp8 on CUDA is sm89+ (upstream's rule)";
  }
  const bool cutlass = cutlass_grouped_here(d);
  const testing::ScopedEnv default_path("FLASHINFER_GROUPED_MM_CUTLASS", nullptr);
  const int64_t E = static_cast<int64_t>(kEdgeIndptr.size()) - 1, k = 208;
  const Tensor a = int_tensor({kEdgeRows, k}, 4, DType::kFloat8E4M3FN, 51);
  const Tensor b = int_tensor({E, kEdgeN, k}, 4, DType::kFloat8E4M3FN, 52);
  const Tensor ip = i32(kEdgeIndptr);
  const Tensor alpha = Tensor::full({1}, 0.5, DType::kFloat32);
  for (bool with_alpha : {true, false}) {
    SCOPED_TRACE(with_alpha ? "alpha 0.5" : "no alpha");
    const std::optional<Tensor> al = with_alpha ? std::optional<Tensor>(alpha) : std::nullopt;
    const std::optional<Tensor> ald =
        with_alpha ? std::optional<Tensor>(alpha.to(d)) : std::nullopt;
    Tensor ref = Tensor::full({kEdgeRows, kEdgeN}, 7.0, DType::kBFloat16);
    (void)grouped_mm_fp8(a, b, ip, al, ref);
    Tensor out = Tensor::full({kEdgeRows, kEdgeN}, 7.0, DType::kBFloat16, d);
    const Tensor ad = a.to(d), bd = b.to(d), ipd = ip.to(d);
    finishes_or_exit("the copies before grouped_mm_fp8");
    const auto before = kernels::cuda::grouped_mm_routes();
    (void)grouped_mm_fp8(ad, bd, ipd, ald, out);
    finishes_or_exit(with_alpha ? "grouped_mm_fp8 (k 208, alpha)" : "grouped_mm_fp8 (k 208)");
    EXPECT_TRUE(ran_expected_path(before, cutlass));
    EXPECT_TRUE(bit_equal(out, ref));  // rows 0..2 and 688..699 keep their 7s
  }
}

// The same path on random e4m3 values in [-2, 2], alpha 0.25: 70 groups of up to 200 rows (some
// empty; random_group_indptr), n 296, k 1024 (8 k tiles, each tile's FP8 partial sums promoted
// to fp32): within the accumulation bound of the exact result and within twice it of the
// mma.sync kernel (FLASHINFER_GROUPED_MM_CUTLASS=0). The fp64 reference (6000 rows x 296 x 1024,
// one pass for both bounds: grouped_ref_with_abs_sum) takes about 7 s at the tests' -O0; two
// plain passes at k 4096, after an unused bf16 case's two at k 1032, took this case past the
// binary's 180 s on the H200 (the bound grows with k, so a deeper k would not test more).
TEST(GroupedMmFp8Cuda, CutlassPathOnHopperMatchesCpuAndTheMmaKernel) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  if (api::compute_capability(d) < 89) {
    GTEST_SKIP() << "grouped_mm_fp8 on CUDA is sm89+ (upstream's rule)";
  }
  const bool cutlass = cutlass_grouped_here(d);
  auto routes = [] { return kernels::cuda::grouped_mm_routes(); };
  const testing::ScopedEnv default_path("FLASHINFER_GROUPED_MM_CUTLASS", nullptr);
  const std::vector<int64_t> indptr = random_group_indptr(78, 200);
  const int64_t cum = indptr.back() + 2, n = 296, k = 1024;
  const Tensor a = rand_tensor({cum, k}, DType::kFloat32, 55, -2.0, 2.0).to(DType::kFloat8E4M3FN);
  const Tensor b = rand_tensor({70, n, k}, DType::kFloat32, 56, -2.0, 2.0).to(DType::kFloat8E4M3FN);
  const ExactAndAbsSum ref =
      grouped_ref_with_abs_sum(a.to_double_vector(), b.to_double_vector(), indptr, cum, n, k, 0.25);
  const Tensor ad = a.to(d), bd = b.to(d), ipd = i32(indptr).to(d);
  const Tensor alpha_d = Tensor::full({1}, 0.25, DType::kFloat32, d);
  finishes_or_exit("the copies before grouped_mm_fp8");
  auto before = routes();
  const Tensor got = grouped_mm_fp8(ad, bd, ipd, alpha_d);
  finishes_or_exit("grouped_mm_fp8 (70 groups, k 1024)");
  EXPECT_TRUE(ran_expected_path(before, cutlass));
  EXPECT_TRUE(within_accumulation_bound(got, ref.exact, ref.abs_sum, k));
  before = routes();
  Tensor mma;
  {
    const testing::ScopedEnv mma_only("FLASHINFER_GROUPED_MM_CUTLASS", "0");
    mma = grouped_mm_fp8(ad, bd, ipd, alpha_d);
  }
  EXPECT_GT(routes().mma, before.mma);
  EXPECT_EQ(routes().cutlass, before.cutlass);
  EXPECT_TRUE(within_accumulation_bound(got, mma.to(Device::cpu()).to_double_vector(), ref.abs_sum,
                                        k, 2.0));
}

// SegmentGEMMWrapper.run with bf16 k-major weights (weight_column_major=True) takes CUTLASS's path
// on an sm_90 device of a build with CUTLASS, its weight_indices read on the device (a weight used
// twice, one unused, an empty segment); fp16 and row-major weights keep the mma.sync kernel.
// Integer operands: bit-exact against the CPU either way.
TEST(SegmentGemmCuda, CutlassPathTakesBf16KMajorWeights) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  const bool cutlass = cutlass_grouped_here(d);
  const testing::ScopedEnv default_path("FLASHINFER_GROUPED_MM_CUTLASS", nullptr);
  SegmentGEMMWrapper seg_cpu(Tensor::empty({1024}, DType::kUInt8));
  SegmentGEMMWrapper seg_gpu(Tensor::empty({1024}, DType::kUInt8, d));
  const int64_t cum = 420, d_in = 264, d_out = 136, W = 4;
  const std::vector<int64_t> indptr = {0, 130, 130, 131, 420}, widx = {3, 0, 3, 1};
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (bool col_major : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (col_major ? " k-major" : " n-major"));
      const Tensor x = int_tensor({cum, d_in}, 4, dt, 61);
      const Tensor w_cm = int_tensor({W, d_out, d_in}, 4, dt, 62);
      const Tensor w = col_major ? w_cm : w_cm.transpose(1, 2).contiguous();
      const Tensor ref =
          seg_cpu.run(x, w_cm, 4, true, std::nullopt, std::nullopt, i32(indptr), i64(widx));
      const kernels::cuda::GroupedMmRoutes before = kernels::cuda::grouped_mm_routes();
      const Tensor got = seg_gpu.run(x.to(d), w.to(d), 4, col_major, std::nullopt, std::nullopt,
                                     i32(indptr).to(d), i64(widx).to(d));
      const kernels::cuda::GroupedMmRoutes after = kernels::cuda::grouped_mm_routes();
      const bool on_cutlass = cutlass && dt == DType::kBFloat16 && col_major;
      EXPECT_EQ(after.cutlass - before.cutlass, on_cutlass ? 1u : 0u);
      EXPECT_EQ(after.mma - before.mma, on_cutlass ? 0u : 1u);
      EXPECT_TRUE(bit_equal(got, ref));
    }
  }
}
#endif

// SegmentGEMMWrapper.run on integer operands: weights k-contiguous (weight_column_major=True)
// and n-contiguous (False; both on the tensor-core kernel, the second through the transposing
// ldmatrix), and with x column-major (the CUDA-core kernel): all bit-exact with the CPU;
// weight_indices repeat a weight and skip one, a segment is empty, d_out = 144 leaves a partial n
// tile and d_in = 136 a partial k tile.
TEST(SegmentGemmCuda, TensorCoresExactOnIntegerOperands) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  // The mma.sync kernel's (on sm_90 CUTLASS would take the bf16 k-major calls:
  // SegmentGemmCuda.CutlassPathTakesBf16KMajorWeights checks that one).
  const testing::ScopedEnv mma_only("FLASHINFER_GROUPED_MM_CUTLASS", "0");
#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
  const kernels::cuda::GroupedMmRoutes routes_before = kernels::cuda::grouped_mm_routes();
#endif
  const Device d = Device::cuda(0);
  SegmentGEMMWrapper seg_cpu(Tensor::empty({1024}, DType::kUInt8));
  SegmentGEMMWrapper seg_gpu(Tensor::empty({1024}, DType::kUInt8, d));
  const int64_t cum = 300, d_in = 136, d_out = 144, W = 3;
  const std::vector<int64_t> indptr = {0, 150, 150, 151, 290}, widx = {2, 0, 2, 2};
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    const Tensor x = int_tensor({cum, d_in}, 4, dt, 11);
    const Tensor w_cm = int_tensor({W, d_out, d_in}, 4, dt, 12);  // [W, d_out, d_in]
    const Tensor w_rm = w_cm.transpose(1, 2).contiguous();        // [W, d_in, d_out]
    const Tensor ref =
        seg_cpu.run(x, w_cm, 4, true, std::nullopt, std::nullopt, i32(indptr), i64(widx));
    for (bool x_cm : {false, true}) {
      for (bool col_major : {true, false}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + (x_cm ? " x column-major" : "") +
                     (col_major ? " weight_column_major" : " row-major weights"));
        const Tensor xd = x_cm ? to_keep_layout(column_major(x), d) : x.to(d);
        EXPECT_TRUE(
            bit_equal(seg_gpu.run(xd, (col_major ? w_cm : w_rm).to(d), 4, col_major, std::nullopt,
                                  std::nullopt, i32(indptr).to(d), i64(widx).to(d)),
                      ref));
      }
    }
  }
#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
  EXPECT_GT(kernels::cuda::grouped_mm_routes().mma, routes_before.mma) << "no mma.sync call";
  EXPECT_EQ(kernels::cuda::grouped_mm_routes().cutlass, routes_before.cutlass) << "CUTLASS ran";
#endif
}

}  // namespace
}  // namespace flashinfer::testing

namespace flashinfer::testing {
namespace {

// Through the Flight Recorder (upstream's layout) and replay_sequence: every op of this file.
TEST(GroupedGemmDump, RecorderDumpReplaysWithEveryCallPassing) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("fi_grouped_dump_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg, [](const std::string&) {});
  {
    Tensor a = rand_tensor({6, 32}, DType::kBFloat16, 1);
    Tensor b = rand_tensor({2, 8, 32}, DType::kBFloat16, 2);
    (void)grouped_mm_bf16(a, b, i32({0, 2, 6}));
    (void)grouped_mm_fp8(a.to(DType::kFloat8E4M3FN), b.to(DType::kFloat8E4M3FN), i32({1, 1, 5}),
                         Tensor::full({1}, 2.0, DType::kFloat32));
    Scales sa = make_scales(1, 128, 8, true, {128, 8}, 9);
    Scales sb = make_scales(2, 128, 8, true, {2, 128, 8}, 10);
    (void)grouped_mm_fp4(rand_bytes({128, 64}, 11), rand_bytes({2, 128, 64}, 12), sa.swizzled,
                         sb.swizzled, i32({0, 28, 128}), Tensor::full({1}, 0.5, DType::kFloat32));
    SegmentGEMMWrapper seg(Tensor::empty({16}, DType::kUInt8));
    (void)seg.run(a, rand_tensor({2, 32, 8}, DType::kBFloat16, 13), 2, false, std::nullopt,
                  i64({2, 3}), std::nullopt, i64({1, 0}));
    MaskedCase c = make_masked(true);
    GroupedGemmNtMaskedKwargs kw;
    kw.alpha = Tensor::full({3}, 0.5, DType::kFloat32);
    kw.alpha_dtype = "float32";
    (void)grouped_gemm_nt_masked(
        {c.A, c.SFA}, {c.B, c.SFB},
        Tensor::full({c.l, c.m, c.n}, 3.0, DType::kBFloat16).permute({1, 2, 0}), i32({5, 1, 0}),
        "float4_e2m1fn", "float8_e4m3fn", "bfloat16", 16, std::nullopt, std::nullopt, std::nullopt,
        std::nullopt, 0, std::nullopt, std::nullopt, std::nullopt, std::nullopt, false, false, kw);
  }
  recorder::stop();
  testing::replay_expecting_every_call_to_pass(dir, 6u);
  fs::remove_all(dir);
}

// Dumps written by Python as upstream's recorder writes them (the shared writer,
// tests/util/upstream_dump_py.h: torch >= 2.1's format, fp8 pickled by hand since the machine's
// torch 1.13 has no float8, views saved over their base storage with their strides), one
// interpreter start for all of them: grouped_gemm_nt_masked as vLLM's CuteDSL MoE calls it
// (NVFP4 operands as (m, k/2, l) views of [l, m, k/2], swizzled scale views, out as the (m, n, l)
// view, alpha through **kwargs), the grouped_mm_* ops with 8 experts and top-2 routing's row
// counts, SegmentGEMMWrapper (__init__ then run with SGLang's keywords, one self_id), the
// groupwise fp8 GEMMs, and the block-scaled group_gemm_mxfp8_mxfp4 / group_gemm_nvfp4 /
// moe_gemm_mxfp8 (replayed in memory only above). Expected outputs: torch in fp32 over the
// dequantized operands, as upstream's test references compute them. All replay and pass, each
// compared on its result.
TEST(GroupedGemmDump, UpstreamWrittenDumpsReplay) {
  const std::string body = R"PY(
# E4M3 / E2M1 value tables, swz() and save()/record(): the shared script.
def tmeta(key, t, device="cuda:0"):  # a tuple item's metadata; t a tensor or ("fp8", codes)
    v = t[1] if isinstance(t, tuple) else t
    return {"type": "torch.Tensor", "shape": list(v.shape),
            "dtype": "torch.float8_e4m3fn" if isinstance(t, tuple) else str(v.dtype),
            "stride": list(v.stride()), "device": device, "requires_grad": False,
            "is_contiguous": False, "tensor_key": key}
def fp8_codes(shape):  # finite e4m3 codes of moderate magnitude (|x| in [2^-3, 2^3])
    c = torch.randint(0x20, 0x50, shape, dtype=torch.uint8)
    return c | (torch.randint(0, 2, shape, dtype=torch.uint8) << 7)
def fp4_unpack(p):  # [.., k/2] bytes -> [.., k] values, low nibble first
    lo, hi = (p & 15).long(), (p >> 4).long()
    return torch.stack([E2M1[lo], E2M1[hi]], -1).reshape(*p.shape[:-1], p.shape[-1] * 2)
def swizzle(codes):  # [rows, cols] codes -> swizzled bytes of the same shape
    rows, cols = codes.shape
    r = torch.arange(rows).view(-1, 1).expand(rows, cols)
    c = torch.arange(cols).view(1, -1).expand(rows, cols)
    out = torch.zeros(rows * cols, dtype=torch.uint8)
    out[swz(r, c, cols).reshape(-1)] = codes.reshape(-1)
    return out.view(rows, cols)

torch.manual_seed(0)
E, TOPK, NT = 8, 2, 6
# Rows per expert from a top-2 routing of T tokens (some experts get none).
ids = torch.stack([torch.randperm(E)[:TOPK] for _ in range(NT)])
counts = torch.bincount(ids.flatten(), minlength=E)
indptr = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]).to(torch.int32)
cum = int(indptr[-1])
GM = "flashinfer.grouped_mm.core"

# 1. grouped_gemm_nt_masked, vLLM's CuteDSL NVFP4 MoE (gemm1): per expert up to M rows.
M, N, K = 4, 64, 128
masked = torch.clamp(counts, max=M).to(torch.int32)
rk = (K // 16 + 3) // 4
a_p = torch.randint(0, 256, (E, M, K // 2), dtype=torch.uint8)
b_p = torch.randint(0, 256, (E, N, K // 2), dtype=torch.uint8)
def sf_phys(rows):  # e4m3 codes 0.5..2, physical (l, r, rk, 32, 4, 4)
    return torch.randint(0x30, 0x41, (E, (rows + 127) // 128, rk, 32, 4, 4), dtype=torch.uint8)
sfa, sfb = sf_phys(M), sf_phys(N)
def sf_of(sf, rows):  # -> [l, rows, K/16] scale values
    v = E4M3[sf.long()]  # (l, rr, rk, 32, 4, 4)
    v = v.permute(0, 1, 4, 3, 2, 5).reshape(E, -1, rk * 4)  # row = rr*128 + m4*32 + m32
    return v[:, :rows, : K // 16]
def view6(sf):  # the (32, 4, r, 4, rk, l) view of the physical buffer
    return ("fp8", sf.permute(3, 4, 1, 5, 2, 0))
alpha = torch.rand(E) * 0.5 + 0.25
ad = fp4_unpack(a_p) * sf_of(sfa, M).repeat_interleave(16, -1)
bd = fp4_unpack(b_p) * sf_of(sfb, N).repeat_interleave(16, -1)
junk = (torch.randn(E, M, N) * 100).to(torch.bfloat16)
res = junk.clone()
for e in range(E):
    r = int(masked[e])
    if r:
        res[e, :r] = (alpha[e] * (ad[e, :r] @ bd[e].T)).to(torch.bfloat16)
view3 = lambda t: t.permute(1, 2, 0)  # the (m, n, l) view of [l, m, n]
A, B = view3(a_p), view3(b_p)
SA, SB = view6(sfa), view6(sfb)
OUT_IN, OUT_RES = view3(junk), view3(res)
record("grouped_gemm_nt_masked", "flashinfer.gemm.kernels.grouped_gemm_masked_wrapper",
       {"arg_0__0": A, "arg_0__1": SA, "arg_1__0": B, "arg_1__1": SB, "arg_2": OUT_IN,
        "arg_3": masked, "kwarg_alpha": alpha.view(1, 1, E)},
       {"arg_0": {"type": "tuple", "length": 2, "items": [tmeta("arg_0__0", A), tmeta("arg_0__1", SA)], "truncated": False},
        "arg_1": {"type": "tuple", "length": 2, "items": [tmeta("arg_1__0", B), tmeta("arg_1__1", SB)], "truncated": False},
        "kwarg_ab_dtype": "float4_e2m1fn", "kwarg_sf_dtype": "float8_e4m3fn",
        "kwarg_c_dtype": "bfloat16", "kwarg_sf_vec_size": 16, "kwarg_alpha_dtype": "float32"},
       OUT_RES)

# 2. grouped_mm_bf16 over the top-2 rows of T tokens, 8 experts.
K, N = 64, 32
a = torch.randn(cum, K).to(torch.bfloat16)
b = (torch.randn(E, N, K) * 0.2).to(torch.bfloat16)
ref = torch.zeros(cum, N)
for e in range(E):
    s, t = int(indptr[e]), int(indptr[e + 1])
    ref[s:t] = a[s:t].float() @ b[e].float().T
record("grouped_mm_bf16", GM, {"arg_0": a, "arg_1": b, "arg_2": indptr},
       {"kwarg_out_dtype": {"type": "torch.dtype", "value": "torch.bfloat16"}},
       ref.to(torch.bfloat16))

# 3. grouped_mm_fp8 with alpha, fp16 output.
ac, bc = fp8_codes((cum, K)), fp8_codes((E, N, K))
al = torch.tensor([0.0625])
ref = torch.zeros(cum, N)
for e in range(E):
    s, t = int(indptr[e]), int(indptr[e + 1])
    ref[s:t] = al * (E4M3[ac[s:t].long()] @ E4M3[bc[e].long()].T)
record("grouped_mm_fp8", GM, {"kwarg_a": ("fp8", ac), "kwarg_b": ("fp8", bc),
                              "kwarg_m_indptr": indptr, "kwarg_alpha": al},
       {"kwarg_out_dtype": {"type": "torch.dtype", "value": "torch.float16"}},
       ref.to(torch.float16))

# 4. grouped_mm_mxfp8: 8 experts of 16 rows (cum_m 128), ue8m0 scales swizzled 128x4.
K, N, R = 128, 128, 16
ip = (torch.arange(E + 1) * R).to(torch.int32)
ac, bc = fp8_codes((E * R, K)), fp8_codes((E, N, K))
sa = torch.randint(124, 131, (E * R, K // 32), dtype=torch.uint8)
sb = torch.randint(124, 131, (E, N, K // 32), dtype=torch.uint8)
deq = lambda codes, s: E4M3[codes.long()] * torch.pow(2.0, s.float() - 127).repeat_interleave(32, -1)
ad = deq(ac, sa)
ref = torch.zeros(E * R, N)
for e in range(E):
    ref[e * R:(e + 1) * R] = ad[e * R:(e + 1) * R] @ deq(bc[e], sb[e]).T
record("grouped_mm_mxfp8", GM,
       {"arg_0": ("fp8", ac), "arg_1": ("fp8", bc), "arg_2": swizzle(sa),
        "arg_3": torch.stack([swizzle(sb[e]) for e in range(E)]), "arg_4": ip},
       {"kwarg_out_dtype": {"type": "torch.dtype", "value": "torch.bfloat16"}},
       ref.to(torch.bfloat16))

# 5. grouped_mm_fp4, NVFP4 (block 16, e4m3 scales), alpha.
K = 128
ap, bp = torch.randint(0, 256, (E * R, K // 2), dtype=torch.uint8), torch.randint(0, 256, (E, N, K // 2), dtype=torch.uint8)
sa = torch.randint(0x30, 0x41, (E * R, K // 16), dtype=torch.uint8)
sb = torch.randint(0x30, 0x41, (E, N, K // 16), dtype=torch.uint8)
deq = lambda p, s: fp4_unpack(p) * E4M3[s.long()].repeat_interleave(16, -1)
al = torch.tensor([0.5])
ad = deq(ap, sa)
ref = torch.zeros(E * R, N)
for e in range(E):
    ref[e * R:(e + 1) * R] = al * (ad[e * R:(e + 1) * R] @ deq(bp[e], sb[e]).T)
record("grouped_mm_fp4", GM,
       {"arg_0": ap, "arg_1": bp, "arg_2": ("fp8", swizzle(sa)),
        "arg_3": ("fp8", torch.stack([swizzle(sb[e]) for e in range(E)])), "arg_4": ip,
        "kwarg_alpha": al},
       {"kwarg_out_dtype": {"type": "torch.dtype", "value": "torch.bfloat16"},
        "kwarg_block_size": 16},
       ref.to(torch.bfloat16))

# 6. SegmentGEMMWrapper: SGLang's LoRA (column-major weights, seg_indptr, weight_indices).
SELF = 139637976727296
obj = {"type": "SegmentGEMMWrapper",
       "repr": "<flashinfer.gemm.gemm_base.SegmentGEMMWrapper object at 0x%x>" % SELF}
ws = torch.zeros(1024, dtype=torch.uint8)
record("SegmentGEMMWrapper.__init__", "flashinfer.gemm.gemm_base", {"arg_1": ws},
       {"arg_0": obj}, None, self_id=SELF, output_metadata={"result": None})
DI, DO = 32, 16
x = torch.randn(cum, DI).to(torch.bfloat16)
w = (torch.randn(3, DO, DI) * 0.2).to(torch.bfloat16)
sip = torch.tensor([0, 3, 3, cum], dtype=torch.int64)
wi = torch.tensor([2, 0, 1], dtype=torch.int64)
y = torch.zeros(cum, DO)
for i in range(3):
    s, t = int(sip[i]), int(sip[i + 1])
    y[s:t] = x[s:t].float() @ w[int(wi[i])].float().T
record("SegmentGEMMWrapper.run", "flashinfer.gemm.gemm_base",
       {"kwarg_x": x, "kwarg_weights": w, "kwarg_seg_indptr": sip, "kwarg_weight_indices": wi},
       {"arg_0": obj, "kwarg_batch_size": 3, "kwarg_weight_column_major": True},
       y.to(torch.bfloat16), self_id=SELF)

# 7. group_gemm_fp8_nt_groupwise, "MN" scales, the top-2 groups padded to 4 rows.
K, N = 256, 256
cnt4 = (counts + 3) // 4 * 4
ip4 = torch.cat([torch.zeros(1, dtype=torch.long), cnt4.cumsum(0)]).to(torch.int32)
cm = int(ip4[-1])
ac, bc = fp8_codes((cm, K)), fp8_codes((E, N, K))
sa = torch.rand(K // 128, cm) * 0.5 + 0.25
sb = torch.rand(E, K // 128, N // 128) * 0.5 + 0.25
ad = E4M3[ac.long()] * sa.t().repeat_interleave(128, 1)
bdq = lambda e: E4M3[bc[e].long()] * sb[e].t().repeat_interleave(128, 0).repeat_interleave(128, 1)
ref = torch.zeros(cm, N)
for e in range(E):
    s0, s1 = int(ip4[e]), int(ip4[e + 1])
    ref[s0:s1] = ad[s0:s1] @ bdq(e).T
record("group_gemm_fp8_nt_groupwise", "flashinfer.gemm.gemm_base",
       {"arg_0": ("fp8", ac), "arg_1": ("fp8", bc), "arg_2": sa, "arg_3": sb, "arg_4": ip4},
       {"kwarg_scale_major_mode": "MN",
        "kwarg_out_dtype": {"type": "torch.dtype", "value": "torch.bfloat16"}},
       ref.to(torch.bfloat16))

# 8. group_deepgemm_fp8_nt_groupwise: per-token a scales, rows by m_indices (-1: padding rows,
# left as they were in the given out). DeepGEMM (SM100) reads each fp32 scale as UE8M0, its
# exponent byte: the power of two at or below it.
ue8m0 = lambda s: torch.exp2(torch.floor(torch.log2(s)))
M = 12
mi = torch.tensor([3, 3, 0, -1, 0, 7, 7, 7, -1, 1, 1, 5], dtype=torch.int32)
ac = fp8_codes((M, K))
sa = torch.rand(M, K // 128) * 0.5 + 0.25
sbd = torch.rand(E, N // 128, K // 128) * 0.5 + 0.25
ad = E4M3[ac.long()] * ue8m0(sa).repeat_interleave(128, 1)
bdd = lambda e: E4M3[bc[e].long()] * ue8m0(sbd[e]).repeat_interleave(128, 0).repeat_interleave(128, 1)
junk = (torch.randn(M, N) * 50).to(torch.bfloat16)
res = junk.clone()
for i in range(M):
    e = int(mi[i])
    if e >= 0:
        res[i] = (ad[i] @ bdd(e).T).to(torch.bfloat16)
record("group_deepgemm_fp8_nt_groupwise", "flashinfer.gemm.gemm_base",
       {"arg_0": ("fp8", ac), "arg_1": ("fp8", bc), "arg_2": sa, "arg_3": sbd,
        "arg_4": mi, "kwarg_out": junk}, {}, res)

# 9. batch_deepgemm_fp8_nt_groupwise: 8 batches of up to 4 rows, masked by the top-2 counts.
a3 = fp8_codes((E, 4, K))
sa3 = torch.rand(E, 4, K // 128) * 0.5 + 0.25
mm3 = torch.clamp(counts, max=4).to(torch.int32)
junk = (torch.randn(E, 4, N) * 50).to(torch.bfloat16)
res = junk.clone()
for e in range(E):
    r = int(mm3[e])
    if r:
        res[e, :r] = ((E4M3[a3[e, :r].long()] * ue8m0(sa3[e, :r]).repeat_interleave(128, 1)) @ bdd(e).T).to(torch.bfloat16)
record("batch_deepgemm_fp8_nt_groupwise", "flashinfer.gemm.gemm_base",
       {"arg_0": ("fp8", a3), "arg_1": ("fp8", bc), "arg_2": sa3, "arg_3": sbd,
        "arg_4": mm3, "kwarg_out": junk}, {"arg_5": 2}, res)

# 10. moe_gemm_fp8_nt_groupwise, gated (up rows [0, N/2), gate [N/2, N)), zero-padding a scales.
ac = fp8_codes((cum, K))
mp = (cum + 3 * E) // 4 * 4
sa = torch.rand(K // 128, mp) * 0.5 + 0.25
ad = torch.zeros(cum, K)
for e in range(E):
    s0, s1 = int(indptr[e]), int(indptr[e + 1])
    c0 = (s0 + 3 * e) // 4 * 4
    ad[s0:s1] = E4M3[ac[s0:s1].long()] * sa[:, c0:c0 + s1 - s0].t().repeat_interleave(128, 1)
ref = torch.zeros(cum, N // 2)
for e in range(E):
    s0, s1 = int(indptr[e]), int(indptr[e + 1])
    h = ad[s0:s1] @ bdq(e).T
    ref[s0:s1] = torch.nn.functional.silu(h[:, N // 2:]) * h[:, :N // 2]
record("moe_gemm_fp8_nt_groupwise", "flashinfer.grouped_mm.cute_sm120_fp8_groupwise.core",
       {"kwarg_a": ("fp8", ac), "kwarg_b": ("fp8", bc), "kwarg_a_scale": sa,
        "kwarg_b_scale": sb, "kwarg_m_indptr": indptr}, {"kwarg_is_gated": True},
       ref.to(torch.bfloat16))

# The block-scaled grouped GEMMs (formerly test_grouped_gemm_fp4_dumps): fp8_codes,
# fp4_unpack and swizzle as above; packed fp4 as uint8, packed UE8M0 as the int32 words
# upstream's records hold.
def ue8m0(c): return torch.pow(2.0, c.double() - 127).float()
BF16 = {"type": "torch.dtype", "value": "torch.bfloat16"}
GB = "flashinfer.gemm.gemm_base"

torch.manual_seed(0)
E, TOPK, NT = 8, 2, 6
ids = torch.stack([torch.randperm(E)[:TOPK] for _ in range(NT)])
counts = torch.bincount(ids.flatten(), minlength=E)
cnt4 = (counts + 3) // 4 * 4  # the padded-scale ops need group starts at multiples of 4
ip4 = torch.cat([torch.zeros(1, dtype=torch.long), cnt4.cumsum(0)]).to(torch.int32)
cm = int(ip4[-1])
K, N = 256, 64
NP = (N + 127) // 128 * 128

def padded_a_scale(codes):  # [cm, cols] -> each group's rows padded to 128, swizzled alone
    blocks = []
    for e in range(E):
        s0, s1 = int(ip4[e]), int(ip4[e + 1])
        rows = (s1 - s0 + 127) // 128 * 128
        if rows:
            p = torch.zeros(rows, codes.shape[1], dtype=torch.uint8)
            p[: s1 - s0] = codes[s0:s1]
            blocks.append(swizzle(p))
    return torch.cat(blocks)
def padded_b_scale(codes):  # [E, N, cols] -> [E, NP, cols], each expert swizzled
    p = torch.zeros(E, NP, codes.shape[2], dtype=torch.uint8)
    p[:, :N] = codes
    return torch.stack([swizzle(p[e]) for e in range(E)])

# 1. group_gemm_mxfp8_mxfp4_nt_groupwise: MXFP8 a, MXFP4 b, UE8M0 scales of 32.
ac = fp8_codes((cm, K))
bp = torch.randint(0, 256, (E, N, K // 2), dtype=torch.uint8)
sa = torch.randint(122, 131, (cm, K // 32), dtype=torch.uint8)
sb = torch.randint(122, 131, (E, N, K // 32), dtype=torch.uint8)
ad = E4M3[ac.long()] * ue8m0(sa).repeat_interleave(32, 1)
bd = fp4_unpack(bp) * ue8m0(sb).repeat_interleave(32, 2)
ref = torch.zeros(cm, N)
for e in range(E):
    s0, s1 = int(ip4[e]), int(ip4[e + 1])
    ref[s0:s1] = ad[s0:s1] @ bd[e].T
record("group_gemm_mxfp8_mxfp4_nt_groupwise", GB,
       {"arg_0": ("fp8", ac), "arg_1": bp, "arg_2": padded_a_scale(sa),
        "arg_3": padded_b_scale(sb), "arg_4": ip4},
       {"kwarg_mma_sm": 1, "kwarg_tile_m": 128, "kwarg_tile_n": 128, "kwarg_tile_k": 128,
        "kwarg_swap_ab": True, "kwarg_out_dtype": BF16},
       ref.to(torch.bfloat16))

# 2. group_gemm_nvfp4_nt_groupwise: NVFP4 a and b, e4m3 scales of 16, alpha per group.
ap = torch.randint(0, 256, (cm, K // 2), dtype=torch.uint8)
sa = torch.randint(0x30, 0x41, (cm, K // 16), dtype=torch.uint8)
sb = torch.randint(0x30, 0x41, (E, N, K // 16), dtype=torch.uint8)
alpha = torch.rand(E) * 0.5 + 0.25
ad = fp4_unpack(ap) * E4M3[sa.long()].repeat_interleave(16, 1)
bd = fp4_unpack(bp) * E4M3[sb.long()].repeat_interleave(16, 2)
ref = torch.zeros(cm, N)
for e in range(E):
    s0, s1 = int(ip4[e]), int(ip4[e + 1])
    ref[s0:s1] = alpha[e] * (ad[s0:s1] @ bd[e].T)
record("group_gemm_nvfp4_nt_groupwise", GB,
       {"arg_0": ap, "arg_1": bp, "arg_2": ("fp8", padded_a_scale(sa)),
        "arg_3": ("fp8", padded_b_scale(sb)), "arg_4": ip4, "arg_5": alpha},
       {"kwarg_tile_m": 128, "kwarg_tile_n": 128, "kwarg_tile_k": 128,
        "kwarg_out_dtype": BF16},
       ref.to(torch.bfloat16))

# 3. moe_gemm_mxfp8_nt_groupwise: token-packed rows of the top-2 routing (any counts), MXFP8
# operands, UE8M0 per 128 of k packed 4 to an int32 word (little-endian); the activation scales
# zero-padded per expert to 4 rows (expert e's rows start at (m_indptr[e] + 3e) // 4 * 4).
indptr = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]).to(torch.int32)
cum = int(indptr[-1])
GK = 128
KB = K // GK
KA = (K + 4 * GK - 1) // (4 * GK)
mp = (cum + 3 * E) // 4 * 4
ac = fp8_codes((cum, K))
bc = fp8_codes((E, N, K))
sa = torch.randint(124, 130, (cum, KB), dtype=torch.uint8)
sb = torch.randint(124, 130, (E, N, KB), dtype=torch.uint8)
sa_words = torch.zeros(mp, 4 * KA, dtype=torch.uint8)
for e in range(E):
    s0, s1 = int(indptr[e]), int(indptr[e + 1])
    c0 = (s0 + 3 * e) // 4 * 4
    sa_words[c0:c0 + s1 - s0, :KB] = sa[s0:s1]
sb_words = torch.zeros(E, N, 4 * KA, dtype=torch.uint8)
sb_words[:, :, :KB] = sb
ad = E4M3[ac.long()] * ue8m0(sa).repeat_interleave(GK, 1)
bd = E4M3[bc.long()] * ue8m0(sb).repeat_interleave(GK, 2)
ref = torch.zeros(cum, N)
for e in range(E):
    s0, s1 = int(indptr[e]), int(indptr[e + 1])
    ref[s0:s1] = ad[s0:s1] @ bd[e].T
record("moe_gemm_mxfp8_nt_groupwise", "flashinfer.grouped_mm.cute_sm120_mxfp8_groupwise.core",
       {"kwarg_a": ("fp8", ac), "kwarg_b": ("fp8", bc),
        "kwarg_a_scale": sa_words.view(torch.int32), "kwarg_b_scale": sb_words.view(torch.int32),
        "kwarg_m_indptr": indptr},
       {"kwarg_scale_major_mode": "MN", "kwarg_backend": "cute", "kwarg_out_dtype": BF16},
       ref.to(torch.bfloat16))
)PY";
  std::vector<replay::Result> results;
  if (!run_upstream_dump_script("fi_grouped_upstream", body, 14, &results)) {
    GTEST_SKIP() << "python3-torch not installed";
  }
  for (const auto& r : results) {
    if (r.function_name.ends_with("__init__")) continue;  // returns None
    ASSERT_FALSE(r.comparisons.empty()) << r.function_name;
    EXPECT_EQ(r.comparisons[0].key, "result") << r.function_name;
  }
}

}  // namespace
}  // namespace flashinfer::testing
