// Private: the arithmetic of nvfp4_attention_sm120_quantize_qkv / _fwd that the CPU reference
// (src/kernels/cpu/nvfp4_attention_cpu.cpp) and the CUDA kernels
// (src/kernels/cuda/nvfp4_attention_cuda.cu) share, so both give the same bits: each fp32 step
// rounded once (kernels/fp32_rules.h), e^x by exp_f32, sums of FP4 products in fp64 (exact: see
// below). Unit-tested on the CPU (tests/ops/test_nvfp4_attention_sm120.cpp).
#pragma once

#include <cstdint>

#include "flashinfer/float_formats.h"
#include "kernels/fp32_rules.h"
#include "kernels/nvfp4_attention_params.h"
#include "kernels/nvfp4_rules.h"  // e4m3_code_to_float, e2m1_code_to_float

namespace flashinfer::kernels {

/// ln(448 * 6): P is kept in [0, 2688] so that a block's largest value has the e4m3 scale 448
/// and the e2m1 code 6.
inline constexpr float kNvfp4AttnLnPRange = 7.896552562713623f;

/// quantize_qkv's block of 16 values x[i * stride] (SageAttention's quantizer): sf =
/// e4m3_satfinite(amax / 6), codes e2m1(x * (1 / sf)) (all 0 where sf is 0; saturating, so a
/// value whose rounded scale came out low gives 6). Returns sf's code.
FLASHINFER_HD uint8_t nvfp4_attn_quantize_block(const float* x, int64_t stride, uint8_t* codes) {
  float amax = 0.0f;
  for (int64_t i = 0; i < kNvfp4AttnBlock; ++i) amax = fp32_abs_max(amax, x[i * stride]);
  const uint8_t sf = float_to_e4m3fn_bits(fp32_div(amax, 6.0f), /*saturate=*/true);
  const float sfd = e4m3_code_to_float(sf);
  const float inv = sfd == 0.0f ? 0.0f : fp32_div(1.0f, sfd);
  for (int64_t i = 0; i < kNvfp4AttnBlock; ++i) {
    codes[i] = float_to_e2m1_bits(fp32_mul(x[i * stride], inv));
  }
  return sf;
}

/// Element c of a packed FP4 row times its scale (e2m1 x e4m3: exact in fp32).
FLASHINFER_HD float nvfp4_attn_decode(const uint8_t* row, uint8_t scale, int64_t c) {
  const uint8_t byte = row[c / 2];
  return fp32_mul(e2m1_code_to_float(c % 2 ? e2m1x2_high(byte) : e2m1x2_low(byte)),
                  e4m3_code_to_float(scale));
}

/// A score's P before quantization: 2688 e^(sm_scale (s - m)), m the row's running max (finite).
FLASHINFER_HD float nvfp4_attn_p(float s, float m, float sm_scale) {
  return exp_f32(fp32_add(fp32_mul(fp32_sub(s, m), sm_scale), kNvfp4AttnLnPRange));
}

/// What O and the row sum are multiplied by when the running max goes from m_old (finite) to
/// m_new.
FLASHINFER_HD float nvfp4_attn_rescale(float m_old, float m_new, float sm_scale) {
  return exp_f32(fp32_mul(fp32_sub(m_old, m_new), sm_scale));
}

/// One block of 16 keys' P to the values the P V product multiplies: the block's fp32 scale
/// max(P) / 6 divides P (at least 1e-8) before the e2m1 rounding, its e4m3 rounding multiplies
/// the codes.
FLASHINFER_HD void nvfp4_attn_quantize_p(const float* p, float* pq) {
  float bmax = 0.0f;
  for (int i = 0; i < kNvfp4AttnBlock; ++i) bmax = p[i] > bmax ? p[i] : bmax;
  const float sfp = fp32_div(bmax, 6.0f);
  const float sfd = e4m3_code_to_float(float_to_e4m3fn_bits(sfp, /*saturate=*/true));
  const float div = sfp > 1e-8f ? sfp : 1e-8f;
  for (int i = 0; i < kNvfp4AttnBlock; ++i) {
    pq[i] = fp32_mul(e2m1_code_to_float(float_to_e2m1_bits(fp32_div(p[i], div))), sfd);
  }
}

// Sums of FP4 products are exact in fp64 in any order: a decoded value (e2m1 x e4m3) is a
// multiple of 2^-10 below 2^12, so a product is a multiple of 2^-20 below 2^23 and a sum of
// 128 of them spans less than 2^50. The CPU and the GPU therefore agree on every score and
// every tile's P V sum whatever order each adds them in.

/// A score: the correction (the accumulator's start) plus the exact dot product, rounded once.
FLASHINFER_HD float nvfp4_attn_score(float correction, double dot) {
  return static_cast<float>(static_cast<double>(correction) + dot);
}

/// O after a tile: its value plus the tile's exact P V sum, rounded once.
FLASHINFER_HD float nvfp4_attn_accumulate(float o, double tile_sum) {
  return static_cast<float>(static_cast<double>(o) + tile_sum);
}

/// A NaN as the device's fp32 arithmetic makes it (0x7FFFFFFF): x86's operations make the
/// negative default NaN and keep its bits through later ones, and the encoders keep a NaN's
/// sign, so the CPU's NaN outputs and corrections would differ from the GPU's in their bits.
FLASHINFER_HD float nvfp4_attn_canonical_nan(float x) {
  return x != x ? f32_from_bits(0x7FFFFFFFu) : x;
}

/// The input dtype's rounding (quantize_qkv's centring runs in fp16 / bf16).
FLASHINFER_HD float nvfp4_attn_round(DType dt, float v) {
  return dt == DType::kFloat16 ? half_bits_to_float(float_to_half_bits(v))
                               : bfloat16_bits_to_float(float_to_bfloat16_bits(v));
}

}  // namespace flashinfer::kernels
