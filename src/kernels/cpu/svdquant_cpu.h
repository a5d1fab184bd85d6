// Private: CPU reference of the SVDQuant residual + low-rank GEMM.
#pragma once

#include <cstdint>

namespace flashinfer::kernels {

struct SvdquantGemmParams {
  int64_t m = 0, n = 0, k = 0, r = 0;
  const uint8_t* a = nullptr;  // [m, k/2], row stride a_stride
  const uint8_t* b = nullptr;  // [n, k/2], row stride b_stride
  int64_t a_stride = 0, b_stride = 0;
  const uint8_t* a_sf = nullptr;  // 128x4-swizzled e4m3 of [m, k/16]
  const uint8_t* b_sf = nullptr;
  const uint16_t* d = nullptr;     // bf16 [m, r] contiguous
  const uint16_t* l1 = nullptr;    // bf16 [n, r] contiguous
  const uint16_t* bias = nullptr;  // bf16 [n] or null
  float alpha = 1.0f;
  uint16_t* out = nullptr;  // bf16 [m, n] contiguous
};

/// x bf16 [m, k] (row stride) times y bf16 [k, r] (row stride) -> bf16 [m, r], fp32 sums.
struct Bf16MmParams {
  int64_t m = 0, k = 0, r = 0;
  const uint16_t* x = nullptr;
  int64_t x_stride = 0;
  const uint16_t* y = nullptr;
  int64_t y_stride = 0;
  uint16_t* out = nullptr;
};

/// y = bf16(x * s[col]): the smoothing product, bf16 [m, n] contiguous.
struct SmoothParams {
  int64_t m = 0, n = 0;
  const uint16_t* x = nullptr;
  int64_t x_stride = 0;
  const uint16_t* s = nullptr;
  uint16_t* y = nullptr;
};

namespace cpu {
void smooth_mul(const SmoothParams& p);
void mm_nvfp4_svdquant(const SvdquantGemmParams& p);
void bf16_mm(const Bf16MmParams& p);
}  // namespace cpu

}  // namespace flashinfer::kernels
