// Private: the RoPE arithmetic that the CPU reference (src/kernels/cpu/rope_cpu.cpp) and the CUDA
// kernel (src/kernels/cuda/rope_cuda.cu) must round identically, so a replay of a RoPE call on
// the other device gives the same bits:
//   - the pair frequencies, computed once per call on the host (rope_pair_frequencies);
//   - cos and sin of the fp64 angle pos * f (rope_sincos): one fixed reduction and polynomial
//     instead of the platform's (glibc's and libdevice's differ in the last place, and
//     libdevice's Payne-Hanek reduction keeps a local-memory array in the kernel);
//   - the rotation in upstream's arithmetic: one FMA over the other product, subnormals flushed
//     (rope_rotate), also in the fp8 quantizers' rotation.
// Unit-tested on the CPU (tests/ops/test_rope_rules.cpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/fp32_rules.h"
#include "kernels/rope_params.h"

namespace flashinfer::kernels {

// ---- fp64, each operation rounded once (nvcc would fuse a multiply into a following add) ----

FLASHINFER_HD double f64_mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

FLASHINFER_HD double f64_add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

FLASHINFER_HD double f64_sub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}

/// a * b + c rounded once (the host's std::fma is correctly rounded, as the device's is).
FLASHINFER_HD double f64_fma(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

/// Largest |angle| (radians, pos * f) rope_sincos takes: its reduction is exact while the
/// quadrant count n stays below 2^31 (3e9 * 2/pi ~ 1.9e9). An int32 position times a frequency
/// <= 1 (every model's first pair: 1 / rope_scale) is always inside. Past it the CPU reference
/// refuses the call and the CUDA kernel writes NaN (it cannot report without synchronizing).
inline constexpr double kRopeMaxAngle = 3.0e9;

/// The angle of pair i at position 0 scaled: frequency f' of RopeParams' formula, in fp64.
/// Host only (std::pow); the CUDA launcher passes the host's values to the kernel.
inline double rope_pair_frequency(const RopeParams& p, int64_t i) {
  const double base =
      std::pow(p.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(p.rotary_dim));
  double s = base * p.smooth_a + p.smooth_b;
  s = s < 0.0 ? 0.0 : (s > 1.0 ? 1.0 : s);
  return (1.0 - s) * base * p.rope_rcp_scale + s * base;
}

/// sin and cos of r + rr for |r| <= about pi/4 + 2^-20, |rr| <= 2^-50 |r| (a reduced angle and
/// its tail). Taylor-like minimax polynomials of degree 13 (sin) and 14 (cos) on [-pi/4, pi/4]
/// (the coefficients of fdlibm's __kernel_sin / __kernel_cos, mathematical constants), about
/// 1 ulp; the tail enters to first order (sin(r + rr) ~ sin r + rr cos r).
FLASHINFER_HD void rope_sincos_kernel(double r, double rr, double* s, double* c) {
  const double z = f64_mul(r, r);
  double ps = f64_fma(z, 1.58969099521155010221e-10, -2.50507602534068634195e-08);
  ps = f64_fma(z, ps, 2.75573137070700676789e-06);
  ps = f64_fma(z, ps, -1.98412698298579493134e-04);
  ps = f64_fma(z, ps, 8.33333333332248946124e-03);
  ps = f64_fma(z, ps, -1.66666666666666324348e-01);
  double pc = f64_fma(z, -1.13596475577881948265e-11, 2.08757232129817482790e-09);
  pc = f64_fma(z, pc, -2.75573143513906633035e-07);
  pc = f64_fma(z, pc, 2.48015872894767294178e-05);
  pc = f64_fma(z, pc, -1.38888888888741095749e-03);
  pc = f64_fma(z, pc, 4.16666666666666019037e-02);
  const double half_z = f64_mul(0.5, z);
  const double one_minus = f64_sub(1.0, half_z);
  // sin(r) = r + r^3 ps; cos(r) = 1 - z/2 + z^2 pc, with the tail's first-order terms.
  const double r3 = f64_mul(z, r);
  *s = f64_add(r, f64_fma(r3, ps, f64_mul(rr, one_minus)));
  // (1 - z/2) rounded loses the bits of z/2 below 1's ulp: lost = (1 - z/2) - one_minus, exact
  // (Sterbenz), put back before adding the rest.
  const double lost = f64_sub(f64_sub(1.0, one_minus), half_z);
  *c = f64_add(one_minus, f64_sub(f64_fma(f64_mul(z, z), pc, lost), f64_mul(r, rr)));
}

/// sin(x) and cos(x) in fp64 for |x| < kRopeMaxAngle, identical on the host and
/// on the device. x = n pi/2 + r: n = rint(x * 2/pi); r = x - n (P1 + P2 + P3 + P3t), pi/2 split
/// into three 33-bit parts and a 53-bit tail (fdlibm's PIO2_1, PIO2_2, PIO2_3, PIO2_3T). x - n P1
/// is exact (one FMA; the result is a multiple of 2^-52 below 2), the remaining terms are added
/// in double-double (two-sum), so r + rr carries about 2^-90 absolute error for n < 2^31; then
/// the quadrant n mod 4 picks and signs the pair. Other x (too large, or not finite): *ok =
/// false and both NaN.
FLASHINFER_HD void rope_sincos(double x, double* s, double* c, bool* ok) {
  if (!(x < kRopeMaxAngle && x > -kRopeMaxAngle)) {  // NaN and infinities too
    *ok = false;
    *s = *c = __builtin_nan("");
    return;
  }
  *ok = true;
  const double fn = ::rint(f64_mul(x, 6.36619772367581382433e-01));  // 2/pi
  const double r1 = f64_fma(-fn, 1.57079632673412561417e+00, x);     // exact
  // r1 - fn (P2 + P3 + P3t) as hi + lo.
  const double p2 = f64_mul(fn, 6.07710050630396597660e-11);
  const double p2_err = f64_fma(fn, 6.07710050630396597660e-11, -p2);  // exact product tail
  const double hi = f64_sub(r1, p2);
  const double bv = f64_sub(hi, r1);  // two-sum of r1 and -p2
  const double hi_err = f64_add(f64_sub(r1, f64_sub(hi, bv)), f64_sub(-p2, bv));
  const double p3 = f64_mul(fn, 8.47842766036889956997e-32);
  const double tail = f64_sub(f64_sub(hi_err, p2_err), f64_fma(fn, 2.02226624871116645580e-21, p3));
  const double r = f64_add(hi, tail);
  const double rr = f64_sub(tail, f64_sub(r, hi));
  double sr, cr;
  rope_sincos_kernel(r, rr, &sr, &cr);
  const int64_t q = static_cast<int64_t>(fn) & 3;
  if (q == 0) {
    *s = sr, *c = cr;
  } else if (q == 1) {
    *s = cr, *c = -sr;
  } else if (q == 2) {
    *s = -sr, *c = -cr;
  } else {
    *s = -cr, *c = sr;
  }
}

/// An fp32 subnormal as upstream's kernels see it: its JIT builds with -use_fast_math, whose
/// .ftz arithmetic reads and writes every subnormal as a zero of the same sign.
FLASHINFER_HD float ftz_f32(float x) { return fabsf(x) < 0x1p-126f ? copysignf(0.0f, x) : x; }

/// a * b + c rounded once (the host's fmaf is correctly rounded, as the device's is).
FLASHINFER_HD float f32_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fmaf(a, b, c);
#endif
}

/// One output of upstream's rotation `x * c + y * s` (y already signed), as nvcc compiles it
/// (pos_enc.cuh's vec_apply_llama_rope*; checked in the PTX of that expression): the second
/// product rounded, then fused with the first, `fma.rn.ftz(x, c, mul.ftz(y, s))`, subnormals
/// flushed as fast math does. The operands here are already flushed (ftz_f32).
FLASHINFER_HD float rope_rotate_one_flushed(float x, float c, float y, float s) {
  return ftz_f32(f32_fma(x, c, ftz_f32(fp32_mul(y, s))));
}

/// NeoX / GPT-J rotation of one pair (a, b) by (c, s) in upstream's arithmetic, operands already
/// flushed: a' = a c - b s, b' = b c + a s (the CPU flushes each row and each token's c / s
/// once, so the loop over heads vectorizes without the flushes).
FLASHINFER_HD void rope_rotate_flushed(float a, float b, float c, float s, float* ao, float* bo) {
  *ao = rope_rotate_one_flushed(a, c, -b, s);
  *bo = rope_rotate_one_flushed(b, c, a, s);
}

/// rope_rotate_one of any operands.
FLASHINFER_HD float rope_rotate_one(float x, float c, float y, float s) {
  return rope_rotate_one_flushed(ftz_f32(x), ftz_f32(c), ftz_f32(y), ftz_f32(s));
}

/// rope_rotate_flushed of any operands.
FLASHINFER_HD void rope_rotate(float a, float b, float c, float s, float* ao, float* bo) {
  rope_rotate_flushed(ftz_f32(a), ftz_f32(b), ftz_f32(c), ftz_f32(s), ao, bo);
}

}  // namespace flashinfer::kernels
