#include "kernels/cpu/gemm_cpu.h"

#include <cblas.h>

#include <algorithm>
#include <vector>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"

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

inline void store(void* base, DType dt, int64_t i, float v) {
  if (dt == DType::kBFloat16) {
    static_cast<uint16_t*>(base)[i] = float_to_bfloat16_bits(v);
  } else if (dt == DType::kFloat16) {
    static_cast<uint16_t*>(base)[i] = float_to_half_bits(v);
  } else {
    static_cast<float*>(base)[i] = v;
  }
}

// Copies a strided [rows, cols] matrix into a dense fp32 [rows, cols] tile.
void to_fp32(const void* src, DType dt, int64_t rows, int64_t cols, int64_t stride_r,
             int64_t stride_c, float* dst) {
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dst + r * cols;
    if (stride_c == 1) {
      for (int64_t c = 0; c < cols; ++c) d[c] = load(src, dt, r * stride_r + c);
    } else {
      for (int64_t c = 0; c < cols; ++c) d[c] = load(src, dt, r * stride_r + c * stride_c);
    }
  }
}

// C (dense fp32 [m, n]) -> out with optional bias, rounding once.
void store_out(const float* c, const GemmParams& p, void* out) {
#pragma omp parallel for schedule(static) if (p.m * p.n >= (1 << 16))
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      float v = c[i * p.n + j];
      if (p.bias) v += load(p.bias, p.bias_dtype, j * p.bias_stride);
      store(out, p.out_dtype, i * p.out_stride_m + j * p.out_stride_n, v);
    }
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
  std::vector<float> a(static_cast<size_t>(p.m * p.k));
  std::vector<float> b(static_cast<size_t>(p.n * p.k));
  std::vector<float> c(static_cast<size_t>(p.m * p.n));
  const size_t a_es = dtype_size(p.a_dtype), b_es = dtype_size(p.b_dtype),
               o_es = dtype_size(p.out_dtype);
  for (int64_t bi = 0; bi < p.batch; ++bi) {
    const auto* ab = static_cast<const uint8_t*>(p.a) + bi * p.a_stride_b * a_es;
    const auto* bb = static_cast<const uint8_t*>(p.b) + bi * p.b_stride_b * b_es;
    auto* ob = static_cast<uint8_t*>(p.out) + bi * p.out_stride_b * o_es;
    to_fp32(ab, p.a_dtype, p.m, p.k, p.a_stride_m, p.a_stride_k, a.data());
    // B[k, j] lives at j * stride_n + k * stride_k: row j of the [n, k] tile.
    to_fp32(bb, p.b_dtype, p.n, p.k, p.b_stride_n, p.b_stride_k, b.data());
    if (p.k == 0) {
      std::fill(c.begin(), c.end(), 0.0f);
    } else {
      sgemm_nt(p.m, p.n, p.k, alpha, a.data(), b.data(), c.data());
    }
    store_out(c.data(), p, ob);
  }
}

namespace {

// Dequantizes packed e2m1 rows [rows, k/2] with block scales into dense fp32 [rows, k]. Every
// product q * sf is exact in fp32 (at most 2 + 4 significant bits).
void dequant_fp4(const uint8_t* data, int64_t stride, const uint8_t* sf, SfLayoutCode layout,
                 bool ue8m0, int block, int64_t rows, int64_t k, float* dst) {
  const int64_t sf_cols = k / block;
#pragma omp parallel for schedule(static) if (rows * k >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t s = sf[sf_offset(layout, r, c / block, sf_cols)];
      const float scale = ue8m0 ? ue8m0_to_float(s) : e4m3fn_bits_to_float(s);
      const uint8_t byte = data[r * stride + c / 2];
      const float q = e2m1_bits_to_float((c & 1) == 0 ? e2m1x2_low(byte) : e2m1x2_high(byte));
      dst[r * k + c] = q * scale;
    }
  }
}

}  // namespace

void mm_fp4(const Fp4GemmParams& p) {
  std::vector<float> a(static_cast<size_t>(p.m * p.k));
  std::vector<float> b(static_cast<size_t>(p.n * p.k));
  std::vector<float> c(static_cast<size_t>(p.m * p.n));
  dequant_fp4(p.a, p.a_stride_m, p.a_sf, p.a_layout, p.ue8m0, p.block, p.m, p.k, a.data());
  dequant_fp4(p.b, p.b_stride_n, p.b_sf, p.b_layout, p.ue8m0, p.block, p.n, p.k, b.data());
  sgemm_nt(p.m, p.n, p.k, p.alpha ? *p.alpha : 1.0f, a.data(), b.data(), c.data());
  GemmParams g;
  g.m = p.m;
  g.n = p.n;
  g.out_dtype = p.out_dtype;
  g.out_stride_m = p.out_stride_m;
  g.out_stride_n = p.out_stride_n;
  store_out(c.data(), g, p.out);
}

}  // namespace flashinfer::kernels::cpu
