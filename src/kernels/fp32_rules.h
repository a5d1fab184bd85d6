// Private: fp32 arithmetic that a CPU reference and a CUDA kernel must round identically. Each
// operation is rounded once (nvcc would otherwise fuse a multiply and a following add into one
// FMA, which the host, built without -mfma and with ISO C++'s -ffp-contract=off, never does), and
// e^x is one fixed polynomial instead of the platform's expf (glibc's and CUDA's differ in the
// last place). Used by the activation CPU reference (src/kernels/cpu/activation_cpu.cpp) and the
// NVFP4 quantizers (kernels/nvfp4_rules.h); unit-tested on the CPU
// (tests/ops/test_nvfp4_rules.cpp).
#pragma once

#include <cstdint>

#include "kernels/quantization_params.h"  // FLASHINFER_HD, f32_to_bits, f32_from_bits

namespace flashinfer::kernels {

FLASHINFER_HD float fp32_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

FLASHINFER_HD float fp32_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

FLASHINFER_HD float fp32_sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

FLASHINFER_HD float fp32_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/// |x| by clearing the sign bit (NaN stays NaN).
FLASHINFER_HD float fp32_abs(float x) { return f32_from_bits(f32_to_bits(x) & 0x7FFFFFFFu); }

/// max(m, |x|) with fmax's rule for a NaN x: m is kept.
FLASHINFER_HD float fp32_abs_max(float m, float x) {
  const float a = fp32_abs(x);
  return a > m ? a : m;
}

namespace exp_f32_consts {
// exp: Cody-Waite reduction x = n ln2 + r (ln2 split in a short high part and a correction),
// then Cephes' degree-7 polynomial for e^r on |r| <= ln2 / 2 (about 1 ulp). n is read from the
// mantissa of the round-to-nearest magic sum; 2^n is built as 2^(n-1) * 2 so that n = 128 still
// reaches the top binade. Below -86 the result flushes to 0 (true value < 3e-38), above 88.72
// it is +inf, as expf's; NaN stays NaN. The argument is clamped to 88.6 first, so x in
// (88.6, 88.72] gives e^88.6 (finite); within [-86, 88.6] the result is within 1 ulp.
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
// The polynomial's coefficients, highest degree first (scalars: device code cannot read a
// namespace-scope array; kExpP is the vector code's copy).
inline constexpr float kExpP0 = 1.9875691500e-4f, kExpP1 = 1.3981999507e-3f,
                       kExpP2 = 8.3334519073e-3f, kExpP3 = 4.1665795894e-2f,
                       kExpP4 = 1.6666665459e-1f, kExpP5 = 5.0000001201e-1f;
inline constexpr float kExpP[6] = {kExpP0, kExpP1, kExpP2, kExpP3, kExpP4, kExpP5};
inline constexpr float kExpHi = 88.72283905f, kExpLo = -86.0f;
inline constexpr float kExpClampHi = 88.6f;
}  // namespace exp_f32_consts

/// e^x in fp32 (the constants above), the same bits on the host and the device.
FLASHINFER_HD float exp_f32(float x) {
  using namespace exp_f32_consts;  // NOLINT(build/namespaces): the constants above
  // std::min(std::max(x, lo), hi): a NaN x passes through.
  const float xl = x < kExpLo ? kExpLo : x;
  const float xc = kExpClampHi < xl ? kExpClampHi : xl;
  const float m = fp32_add(fp32_mul(xc, kLog2e), kRoundMagic);
  const float n = fp32_sub(m, kRoundMagic);
  float r = fp32_sub(xc, fp32_mul(n, kLn2Hi));
  r = fp32_sub(r, fp32_mul(n, kLn2Lo));
  float p = kExpP0;
  p = fp32_add(fp32_mul(p, r), kExpP1);
  p = fp32_add(fp32_mul(p, r), kExpP2);
  p = fp32_add(fp32_mul(p, r), kExpP3);
  p = fp32_add(fp32_mul(p, r), kExpP4);
  p = fp32_add(fp32_mul(p, r), kExpP5);
  p = fp32_add(fp32_add(fp32_mul(fp32_mul(p, r), r), r), 1.0f);
  const uint32_t e = (f32_to_bits(m) + (126u - 0x4B400000u)) << 23;
  float y = fp32_mul(fp32_mul(p, f32_from_bits(e)), 2.0f);
  y = x > kExpHi ? f32_from_bits(0x7F800000u) : y;
  y = x < kExpLo ? 0.0f : y;
  return y;
}

/// silu(g) * u = g / (1 + e^-g) * u, each step rounded once.
FLASHINFER_HD float silu_mul_f32(float g, float u) {
  return fp32_mul(fp32_div(g, fp32_add(1.0f, exp_f32(-g))), u);
}

}  // namespace flashinfer::kernels
