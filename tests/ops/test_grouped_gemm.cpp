// Grouped GEMMs (grouped_mm_bf16/fp8/mxfp8/fp4, SegmentGEMMWrapper, grouped_gemm_nt_masked):
// hand-checked values, fp64 formulas over the dequantized operands (the block-scale layouts
// written out independently here), empty groups and uncovered rows, bad input naming the
// argument, record/replay, and upstream-format dumps written by Python.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/float_formats.h"
#include "flashinfer/ops/backends.h"
#include "flashinfer/replay.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

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

// ---- declarations, backends, record/replay --------------------------------------------------

TEST(GroupedGemmDecls, ModulesBackendsAndRecordReplay) {
  const std::pair<const char*, const char*> names[] = {
      {"grouped_mm_bf16", "flashinfer.grouped_mm.core"},
      {"grouped_mm_fp8", "flashinfer.grouped_mm.core"},
      {"grouped_mm_mxfp8", "flashinfer.grouped_mm.core"},
      {"grouped_mm_fp4", "flashinfer.grouped_mm.core"},
      {"SegmentGEMMWrapper.__init__", "flashinfer.gemm.gemm_base"},
      {"SegmentGEMMWrapper.run", "flashinfer.gemm.gemm_base"},
      {"grouped_gemm_nt_masked", "flashinfer.gemm.kernels.grouped_gemm_masked_wrapper"}};
  for (const auto& [name, module] : names) {
    const OpDecl* d = OpRegistry::global().find(name);
    ASSERT_NE(d, nullptr) << name;
    EXPECT_EQ(d->module, module) << name;
  }
  // Only grouped_mm_bf16 has a CUDA kernel; the others say so.
  EXPECT_EQ(op_has_backend("grouped_mm_bf16", DeviceType::kCUDA),
            backend_requirement("grouped_mm_bf16").is_backend_supported("cudnn", 90));
  for (const char* op : {"grouped_mm_fp8", "grouped_mm_mxfp8", "grouped_mm_fp4"}) {
    EXPECT_FALSE(backend_requirement(op).is_backend_supported("cudnn", 100)) << op;
    EXPECT_FALSE(op_has_backend(op, DeviceType::kCUDA)) << op;
  }
  EXPECT_FALSE(op_has_backend("grouped_gemm_nt_masked", DeviceType::kCUDA));
  EXPECT_FALSE(op_has_backend("SegmentGEMMWrapper.run", DeviceType::kCUDA));

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
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 7u);
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

}  // namespace
}  // namespace flashinfer::testing
