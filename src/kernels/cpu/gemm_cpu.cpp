#include "kernels/cpu/gemm_cpu.h"

#include <cblas.h>

#include <algorithm>
#include <memory>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"

// Threading: OpenBLAS parallelizes the O(m n k) sgemm with its own thread pool. The O(m k + n k)
// conversions stay serial on purpose: an OpenMP team here keeps spinning after its region and
// competes with OpenBLAS's threads (measured: 0.12x of plain sgemm at 512^3 with OpenMP loops,
// ~1x without).
namespace flashinfer::kernels::cpu {
namespace {

// Exact conversion of one element of a supported input dtype to fp32.
inline float load(const void* base, DType dt, int64_t i) {
  switch (dt) {
    case DType::kBFloat16:
      return bfloat16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kFloat16:
      return half_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kFloat8E4M3FN:
      return e4m3fn_bits_to_float(static_cast<const uint8_t*>(base)[i]);
    case DType::kFloat8E5M2:
      return e5m2_bits_to_float(static_cast<const uint8_t*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

// Element converters, exact to fp32; one instantiation per dtype so the row loops vectorize.
struct Bf16In {
  using T = uint16_t;
  static float cvt(T v) { return bfloat16_bits_to_float(v); }
};
struct F16In {
  using T = uint16_t;
  static float cvt(T v) { return half_bits_to_float(v); }
};
struct E4m3In {
  using T = uint8_t;
  static float cvt(T v) { return e4m3fn_bits_to_float(v); }
};
struct E5m2In {
  using T = uint8_t;
  static float cvt(T v) { return e5m2_bits_to_float(v); }
};

template <class In>
void to_fp32_rows(const void* src, int64_t rows, int64_t cols, int64_t stride_r, int64_t stride_c,
                  float* dst) {
  const auto* s = static_cast<const typename In::T*>(src);
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dst + r * cols;
    const auto* row = s + r * stride_r;
    if (stride_c == 1) {
      for (int64_t c = 0; c < cols; ++c) d[c] = In::cvt(row[c]);
    } else {
      for (int64_t c = 0; c < cols; ++c) d[c] = In::cvt(row[c * stride_c]);
    }
  }
}

// Copies a strided [rows, cols] matrix into a dense fp32 [rows, cols] tile.
void to_fp32(const void* src, DType dt, int64_t rows, int64_t cols, int64_t stride_r,
             int64_t stride_c, float* dst) {
  switch (dt) {
    case DType::kBFloat16:
      return to_fp32_rows<Bf16In>(src, rows, cols, stride_r, stride_c, dst);
    case DType::kFloat16:
      return to_fp32_rows<F16In>(src, rows, cols, stride_r, stride_c, dst);
    case DType::kFloat8E4M3FN:
      return to_fp32_rows<E4m3In>(src, rows, cols, stride_r, stride_c, dst);
    case DType::kFloat8E5M2:
      return to_fp32_rows<E5m2In>(src, rows, cols, stride_r, stride_c, dst);
    default:
      FLASHINFER_FAIL(ErrorCode::kInternal, "gemm", "", "unexpected input dtype ",
                      dtype_torch_name(dt));
  }
}

// C (dense fp32 [m, n]) -> out with optional bias, rounding once.
template <uint16_t (*kRound)(float)>
void store_rows(const float* c, const GemmParams& p, void* out) {
  auto* o = static_cast<uint16_t*>(out);
  for (int64_t i = 0; i < p.m; ++i) {
    const float* ci = c + i * p.n;
    uint16_t* oi = o + i * p.out_stride_m;
    if (p.bias) {
      for (int64_t j = 0; j < p.n; ++j) {
        oi[j * p.out_stride_n] = kRound(ci[j] + load(p.bias, p.bias_dtype, j * p.bias_stride));
      }
    } else if (p.out_stride_n == 1) {
      for (int64_t j = 0; j < p.n; ++j) oi[j] = kRound(ci[j]);
    } else {
      for (int64_t j = 0; j < p.n; ++j) oi[j * p.out_stride_n] = kRound(ci[j]);
    }
  }
}

uint16_t round_bf16(float v) { return float_to_bfloat16_bits(v); }
uint16_t round_f16(float v) { return float_to_half_bits(v); }

void store_out(const float* c, const GemmParams& p, void* out) {
  if (p.out_dtype == DType::kBFloat16) {
    store_rows<round_bf16>(c, p, out);
  } else {
    store_rows<round_f16>(c, p, out);
  }
}

void sgemm_nt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
              float* c) {
  // Row-major C[m, n] = alpha * A[m, k] * B[n, k]^T.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(k),
              b, static_cast<blasint>(k), 0.0f, c, static_cast<blasint>(n));
}

}  // namespace

void gemm(const GemmParams& p) {
  const float alpha = (p.a_scale ? *p.a_scale : 1.0f) * (p.b_scale ? *p.b_scale : 1.0f);
  // Uninitialized scratch: every element is written before it is read.
  std::unique_ptr<float[]> a(new float[static_cast<size_t>(p.m * p.k)]);
  std::unique_ptr<float[]> b(new float[static_cast<size_t>(p.n * p.k)]);
  std::unique_ptr<float[]> c(new float[static_cast<size_t>(p.m * p.n)]);
  const size_t a_es = dtype_size(p.a_dtype), b_es = dtype_size(p.b_dtype),
               o_es = dtype_size(p.out_dtype);
  for (int64_t bi = 0; bi < p.batch; ++bi) {
    const auto* ab = static_cast<const uint8_t*>(p.a) + bi * p.a_stride_b * a_es;
    const auto* bb = static_cast<const uint8_t*>(p.b) + bi * p.b_stride_b * b_es;
    auto* ob = static_cast<uint8_t*>(p.out) + bi * p.out_stride_b * o_es;
    to_fp32(ab, p.a_dtype, p.m, p.k, p.a_stride_m, p.a_stride_k, a.get());
    // B[k, j] lives at j * stride_n + k * stride_k: row j of the [n, k] tile.
    to_fp32(bb, p.b_dtype, p.n, p.k, p.b_stride_n, p.b_stride_k, b.get());
    if (p.k == 0) {
      std::fill(c.get(), c.get() + p.m * p.n, 0.0f);
    } else {
      sgemm_nt(p.m, p.n, p.k, alpha, a.get(), b.get(), c.get());
    }
    store_out(c.get(), p, ob);
  }
}

namespace {

// Dequantizes packed e2m1 rows [rows, k/2] with block scales into dense fp32 [rows, k]. Every
// product q * sf is exact in fp32 (at most 2 + 4 significant bits).
void dequant_fp4(const uint8_t* data, int64_t stride, const uint8_t* sf, SfLayoutCode layout,
                 bool ue8m0, int block, int64_t rows, int64_t k, float* dst) {
  const int64_t sf_cols = k / block;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = data + r * stride;
    float* d = dst + r * k;
    for (int64_t b = 0; b < sf_cols; ++b) {
      const uint8_t s = sf[sf_offset(layout, r, b, sf_cols)];
      const float scale = ue8m0 ? ue8m0_to_float(s) : e4m3fn_bits_to_float(s);
      for (int64_t c = b * block; c < (b + 1) * block; c += 2) {
        const uint8_t byte = row[c / 2];
        d[c] = e2m1_bits_to_float(e2m1x2_low(byte)) * scale;
        d[c + 1] = e2m1_bits_to_float(e2m1x2_high(byte)) * scale;
      }
    }
  }
}

}  // namespace

void mm_fp4(const Fp4GemmParams& p) {
  // Uninitialized scratch: every element is written before it is read.
  std::unique_ptr<float[]> a(new float[static_cast<size_t>(p.m * p.k)]);
  std::unique_ptr<float[]> b(new float[static_cast<size_t>(p.n * p.k)]);
  std::unique_ptr<float[]> c(new float[static_cast<size_t>(p.m * p.n)]);
  dequant_fp4(p.a, p.a_stride_m, p.a_sf, p.a_layout, p.ue8m0, p.block, p.m, p.k, a.get());
  dequant_fp4(p.b, p.b_stride_n, p.b_sf, p.b_layout, p.ue8m0, p.block, p.n, p.k, b.get());
  sgemm_nt(p.m, p.n, p.k, p.alpha ? *p.alpha : 1.0f, a.get(), b.get(), c.get());
  GemmParams g;
  g.m = p.m;
  g.n = p.n;
  g.out_dtype = p.out_dtype;
  g.out_stride_m = p.out_stride_m;
  g.out_stride_n = p.out_stride_n;
  store_out(c.get(), g, p.out);
}

}  // namespace flashinfer::kernels::cpu
