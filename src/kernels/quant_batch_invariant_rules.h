// Private: upstream 0.7.4's batch-invariant quantizers (fp4_quantize / nvfp4_quantize /
// mxfp4_quantize / mxfp8_quantize with batch_invariant=True; flashinfer/batch_invariant/
// quantization/, whose nvfp4_spec.py and mx_spec.py state the recipe in exact arithmetic). Every
// step is one correctly rounded fp32 operation, no reciprocal approximation, no flush to zero,
// so a block's bits depend on the block alone; the constants are fp32(1/6) and fp32(1/448).
// Scalar and plain C++ (each product and quotient its own statement: nothing an FMA could
// contract). docs/GEMM_AND_QUANTIZATION.md, "Batch-invariant quantizers".
#pragma once

#include <cmath>
#include <cstdint>

#include "flashinfer/float_formats.h"
#include "kernels/quantization_params.h"

namespace flashinfer::kernels::batch_invariant {

inline constexpr float kFltMax = 3.402823466e38f;

/// The spec's fmin(a, b) = a <= b ? a : b: a NaN `a` gives b (min.f32 returns the other operand).
inline float spec_fmin(float a, float b) { return a <= b ? a : b; }

/// max |x| over n values, NaN ignored (the spec's fmaxc tree); NaN only when every value is NaN;
/// +0 for an all-zero block.
inline float block_amax(const float* v, int n) {
  bool any = false;
  float m = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::isnan(v[i])) continue;
    const float a = std::fabs(v[i]);
    m = (!any || a > m) ? a : m;
    any = true;
  }
  return any ? m : f32_from_bits(0x7FC00000u);
}

/// One NVFP4 block of 16 (class nvfp4.quant) with global scale gs: returns the e4m3 scale byte
/// and writes the 16 e2m1 codes.
///   sf = e4m3_satfinite(RN(amax * RN(gs * fp32(1/6))))   (an all-NaN block: 0x7F)
///   inv = fmin(RN(1 / RN(sf * RN(1 / gs))), FLT_MAX)      (a zero scale: FLT_MAX, so a block
///                                                         whose scale underflows saturates)
///   q = e2m1(RN(x * inv))                                 (NaN: code 7)
inline uint8_t nvfp4_block(const float* v, float gs, uint8_t* codes) {
  const float c = f32_from_bits(0x3E2AAAABu);  // fp32(1/6)
  const float g6 = gs * c;
  const float rg = 1.0f / gs;
  const float amax = block_amax(v, 16);
  const float sf_f = amax * g6;
  const uint8_t sf = std::isnan(sf_f) ? uint8_t{0x7F} : float_to_e4m3fn_bits(sf_f, true);
  const float sf_d = e4m3fn_bits_to_float(sf);
  const float den = sf_d * rg;
  const float inv = spec_fmin(1.0f / den, kFltMax);
  for (int i = 0; i < 16; ++i) {
    const float y = v[i] * inv;
    codes[i] = std::isnan(y) ? uint8_t{0x7} : float_to_e2m1_bits(y);
  }
  return sf;
}

/// Per-token NVFP4 (class nvfp4.quant.pertoken): from the row's amax (NaN ignored) and the
/// inverse base scale gsi, the rows' global scale ges and the returned per-row scale pts:
///   gs0 = RN(1 / gsi); ges = fmin(RN(gs0 / ramax), FLT_MAX), 1 where that is 0; pts = RN(1 / ges)
/// (a zero row: ges = FLT_MAX, pts = 2^-128).
struct PerTokenScales {
  float ges, pts;
};
inline PerTokenScales nvfp4_per_token(float row_amax, float gsi) {
  const float gs0 = 1.0f / gsi;
  const float q = gs0 / row_amax;
  float ges = spec_fmin(q, kFltMax);
  if (ges == 0.0f) ges = 1.0f;
  return {ges, 1.0f / ges};
}

/// One MX block of 32 (classes mxfp8.quant / mxfp4.quant): returns the ue8m0 byte and writes the
/// 32 codes (e4m3 for MXFP8, e2m1 for MXFP4).
///   byte = ue8m0 round-up of RN(amax * fp32(1/448 or 1/6))  (0 for <= 2^-127, 254 from 2^127
///          and inf, 255 for an all-NaN block)
///   inv = 2^(127 - byte), exact for every byte 0..254 (no zero sentinel)
///   q = satfinite(RN(x * inv)); NaN gives 0x7F (e4m3) or 7 (e2m1) whatever its sign; -0 keeps
///   its sign; byte 255 makes every code NaN's
inline uint8_t mx_block(const float* v, bool fp8, uint8_t* codes) {
  const float c = f32_from_bits(fp8 ? 0x3B124925u : 0x3E2AAAABu);
  const float amax = block_amax(v, 32);
  const float norm = amax * c;
  const uint8_t byte = ue8m0_round_up(norm);
  const uint8_t nan_code = fp8 ? uint8_t{0x7F} : uint8_t{0x7};
  if (byte == 255) {
    for (int i = 0; i < 32; ++i) codes[i] = nan_code;
    return byte;
  }
  const float inv = std::ldexp(1.0f, 127 - static_cast<int>(byte));
  for (int i = 0; i < 32; ++i) {
    const float y = v[i] * inv;
    if (std::isnan(y)) {
      codes[i] = nan_code;
    } else {
      codes[i] = fp8 ? float_to_e4m3fn_bits(y, true) : float_to_e2m1_bits(y);
    }
  }
  return byte;
}

}  // namespace flashinfer::kernels::batch_invariant
