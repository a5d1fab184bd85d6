// CPU reference of the SVDQuant GEMM: both NVFP4 operands read back to exact fp32 values
// (e2m1 * e4m3 block scale), fp32 sums in a fixed order, the epilogue alpha * acc + bias and one
// bf16 rounding.
#include "kernels/cpu/svdquant_cpu.h"

#include <vector>

#include "flashinfer/float_formats.h"
#include "kernels/quantization_params.h"

namespace flashinfer::kernels::cpu {
namespace {

void dequant_rows(const uint8_t* q, int64_t stride, const uint8_t* sf, int64_t rows, int64_t k,
                  float* out) {
  const int64_t ksf = k / 16;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t byte = q[r * stride + c / 2];
      out[r * k + c] = e2m1_bits_to_float(c % 2 ? e2m1x2_high(byte) : e2m1x2_low(byte)) *
                       e4m3fn_bits_to_float(sf[sf_offset(SfLayoutCode::k128x4, r, c / 16, ksf)]);
    }
  }
}

// Eight partial sums (n % 8 == 0), combined pairwise: a fixed order that vectorizes.
float dot(const float* x, const float* y, int64_t n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t c = 0; c < n; c += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] += x[c + l] * y[c + l];
  }
  return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
         ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

std::vector<float> widen(const uint16_t* x, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = bfloat16_bits_to_float(x[i]);
  return v;
}

}  // namespace

void mm_nvfp4_svdquant(const SvdquantGemmParams& p) {
  std::vector<float> a(static_cast<size_t>(p.m * p.k)), b(static_cast<size_t>(p.n * p.k));
  dequant_rows(p.a, p.a_stride, p.a_sf, p.m, p.k, a.data());
  dequant_rows(p.b, p.b_stride, p.b_sf, p.n, p.k, b.data());
  const std::vector<float> d = widen(p.d, p.m * p.r), l1 = widen(p.l1, p.n * p.r);
#pragma omp parallel for schedule(static) if (p.m * p.n * p.k >= (1 << 18))
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      // One accumulator holds the residual GEMM, then the low-rank correction (the fused
      // kernel's second MMA into the same accumulator).
      const float acc = dot(a.data() + i * p.k, b.data() + j * p.k, p.k) +
                        dot(d.data() + i * p.r, l1.data() + j * p.r, p.r);
      float v = p.alpha * acc;
      if (p.bias) v += bfloat16_bits_to_float(p.bias[j]);
      p.out[i * p.n + j] = float_to_bfloat16_bits(v);
    }
  }
}

void smooth_mul(const SmoothParams& p) {
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t c = 0; c < p.n; ++c) {
      p.y[i * p.n + c] = float_to_bfloat16_bits(bfloat16_bits_to_float(p.x[i * p.x_stride + c]) *
                                                bfloat16_bits_to_float(p.s[c]));
    }
  }
}

void bf16_mm(const Bf16MmParams& p) {
#pragma omp parallel for schedule(static) if (p.m * p.k * p.r >= (1 << 18))
  for (int64_t i = 0; i < p.m; ++i) {
    std::vector<float> acc(static_cast<size_t>(p.r), 0.0f);
    for (int64_t c = 0; c < p.k; ++c) {
      const float x = bfloat16_bits_to_float(p.x[i * p.x_stride + c]);
      for (int64_t j = 0; j < p.r; ++j) {
        acc[static_cast<size_t>(j)] += x * bfloat16_bits_to_float(p.y[c * p.y_stride + j]);
      }
    }
    for (int64_t j = 0; j < p.r; ++j) {
      p.out[i * p.r + j] = float_to_bfloat16_bits(acc[static_cast<size_t>(j)]);
    }
  }
}

}  // namespace flashinfer::kernels::cpu
