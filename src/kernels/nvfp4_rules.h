// Private: the per-block NVFP4 arithmetic the CPU references (src/kernels/cpu/nvfp4_cpu.cpp) and
// the CUDA kernels (src/kernels/cuda/nvfp4_cuda.cu) share, so both write the same bytes: a block
// of 16 fp32 values to one e4m3 scale code and 16 packed e2m1 codes, by fp4_quantize's rule
// (nvfp4_quantize_paged_kv_cache) or the append kernels' rule (nvfp4_quantize_append_*), and the
// 4-token V-scale interleave of nvfp4_quantize_paged_kv_cache; and MXFP8's block of 32
// (mxfp8_quantize, mxfp8_grouped_quantize). Every fp32 step is rounded once (kernels/fp32_rules.h).
// Unit-tested on the CPU: tests/ops/test_nvfp4_rules.cpp.
#pragma once

#include <cstdint>

#include "flashinfer/float_formats.h"
#include "kernels/cuda/device/host_device.h"  // FLASHINFER_UNROLL (plain C++)
#include "kernels/fp32_rules.h"
#include "kernels/nvfp4_params.h"
#include "kernels/quantization_params.h"

namespace flashinfer::kernels {

inline constexpr int kNvfp4Block = 16;

/// One quantized block: its e4m3 scale code and its 16 e2m1 codes packed two per byte (element
/// 2t in the low nibble of byte t, byte t at bits [8t, 8t + 8): little-endian memory order).
struct Nvfp4Block {
  uint64_t packed = 0;
  uint8_t sf = 0;
};

// Decoded arithmetically: device code cannot read float_formats.h's decode tables (host arrays;
// nvcc compiles such a read to nothing useful, silently).
FLASHINFER_HD float e4m3_code_to_float(uint8_t code) {
  return detail::DecodeMinifloat<4, 3, detail::Specials::kFiniteNan>(code);
}
/// An e2m1 code's value (the low 4 bits).
FLASHINFER_HD float e2m1_code_to_float(uint8_t code) {
  return detail::DecodeMinifloat<2, 1, detail::Specials::kNone>(code & 0xFu);
}

/// max |v[i]| over the block, NaN ignored (fmax's rule; the maximum is order-independent).
FLASHINFER_HD float nvfp4_block_amax(const float* v) {
  float amax = 0.0f;
  FLASHINFER_UNROLL
  for (int i = 0; i < kNvfp4Block; ++i) amax = fp32_abs_max(amax, v[i]);
  return amax;
}

/// fp4_quantize's NVFP4 code of v under the block's decoded scale sf, as upstream 0.7.4's
/// cvt_warp_fp16_to_fp4 (outputScale = sf != 0 ? 1 / (sf / gs) : 0): e2m1((v * gs) / sf), or
/// e2m1(v * 0) when the scale decodes to 0 (an all-zero block, or one whose scale rounds to 0:
/// signed zeros; 0.6.18 tested amax != 0 and saturated such a block to +-6).
FLASHINFER_HD uint8_t nvfp4_code(float v, float gs, float sf) {
  return float_to_e2m1_bits(sf != 0.0f ? fp32_div(fp32_mul(v, gs), sf) : fp32_mul(v, 0.0f));
}

/// fp4_quantize's NVFP4 block (kernels::cpu::fp4_quantize, e4m3 scales): sf = e4m3_satfinite(
/// (gs * amax) / 6), codes nvfp4_code.
FLASHINFER_HD Nvfp4Block nvfp4_quantize_block(const float* v, float gs) {
  Nvfp4Block b;
  const float amax = nvfp4_block_amax(v);
  b.sf = float_to_e4m3fn_bits(fp32_div(fp32_mul(gs, amax), 6.0f), true);
  const float sf = e4m3_code_to_float(b.sf);
  FLASHINFER_UNROLL
  for (int t = 0; t < kNvfp4Block / 2; ++t) {
    const uint8_t lo = nvfp4_code(v[2 * t], gs, sf);
    const uint8_t hi = nvfp4_code(v[2 * t + 1], gs, sf);
    b.packed |= static_cast<uint64_t>(pack_e2m1x2(lo, hi)) << (8 * t);
  }
  return b;
}

/// Upstream 0.7.4's NVFP4 "4 over 6" block (cvt_warp_fp16_to_fp4's 4over6 branch, sm100+ there):
/// two candidate scales, the block's amax mapped to 6 (sf6) and to 4 (sf4 = 1.5 sf6), each
/// rounded to e4m3; the block is quantized under both and the candidate with the smaller summed
/// error is written (ties and NaN: the 6 one). Every fp32 step rounded once; S is the encode
/// (global) scale. Upstream's default ("fast") association takes its reciprocals with
/// rcp.approx.ftz: exact here (equal for powers of two, else within an ulp), and no FTZ.
///   amax: the max of |even elements| and of |odd elements| (NaN ignored in each), then
///     (x > y ? x : y) (upstream's half2 max then cuda_max: NaN only if every odd one is).
///   amax == 0: scale 0, every code +0.
///   sf6 = RN(S RN(amax (1/6))) (exact_math: RN(RN(amax / 6) S)); sf4 = RN(sf6 * 1.5).
///   out = 1 / RN(s * (1 / S)) with no zero guard (a scale of 0: +Inf, so nonzero values give
///     +-6 and zeros NaN, code 7: upstream's quirk); exact_math: fminf(that, FLT_MAX).
///   codes e2m1(RN(x out)); error per element: fast_err RN(q s - RN(x S)), else RN(RN(q s (1 /
///     S)) - x) (q the code's value, -0 for code 8); |d| or RN(d d), summed in order.
FLASHINFER_HD Nvfp4Block nvfp4_4over6_block(const float* x, float S, Nvfp4FourOverSix c) {
  Nvfp4Block out;
  float even = f32_from_bits(0x7fc00000u), odd = even;  // NaN until a non-NaN value is seen
  FLASHINFER_UNROLL
  for (int i = 0; i < kNvfp4Block; ++i) {
    const float a = x[i] < 0.0f ? -x[i] : (x[i] == 0.0f ? 0.0f : x[i]);  // |x|, -0 as +0
    float& m = (i % 2 == 0) ? even : odd;
    if (!(a != a) && (m != m || a > m)) m = a;
  }
  const float amax = even > odd ? even : odd;
  if (amax == 0.0f) return out;  // scale 0, codes +0
  const float sf6 = c.exact_math ? fp32_mul(fp32_div(amax, 6.0f), S)
                                 : fp32_mul(S, fp32_mul(amax, fp32_div(1.0f, 6.0f)));
  const float sf4 = fp32_mul(sf6, 1.5f);
  const float gds = fp32_div(1.0f, S);
  uint8_t sf_code[2];
  uint64_t packed[2] = {0, 0};
  float err[2] = {0.0f, 0.0f};
  for (int k = 0; k < 2; ++k) {
    sf_code[k] = float_to_e4m3fn_bits(k == 0 ? sf6 : sf4, true);
    const float s = e4m3_code_to_float(sf_code[k]);
    float os = fp32_div(1.0f, fp32_mul(s, gds));
    if (c.exact_math && (os != os || os > 3.402823466e38f)) os = 3.402823466e38f;  // fminf
    for (int i = 0; i < kNvfp4Block; ++i) {
      const uint8_t code = float_to_e2m1_bits(fp32_mul(x[i], os));
      packed[k] |= static_cast<uint64_t>(code) << (4 * i);
      const float mag = e2m1_code_to_float(code & 0x7);
      const float q = (code & 0x8) ? -mag : mag;
      const float qs = q * s;  // exact: at most 2 + 4 significant bits
      const float d =
          c.fast_err ? fp32_sub(qs, fp32_mul(x[i], S)) : fp32_sub(fp32_mul(qs, gds), x[i]);
      err[k] = fp32_add(err[k], c.mse ? fp32_mul(d, d) : (d < 0.0f ? -d : d));
    }
  }
  const int pick = err[1] < err[0] ? 1 : 0;
  out.sf = sf_code[pick];
  out.packed = packed[pick];
  return out;
}

/// fp8 (e4m3) input of fp4_quantize / nvfp4_quantize / mxfp4_quantize / nvfp4_batched_quantize,
/// as upstream's cvt_warp_fp8_to_fp4 (compiled for sm100+ only): each value is first brought to
/// fp16, h = fp16_rn(x * (6 * (1 / gs))); the block's scale is s = gs * (amax(h) * (1 / 6)),
/// stored as e4m3 (or as ue8m0 rounded up); each code is e2m1(h * out) with out = gs * (1 /
/// decoded scale) when s != 0 (infinite, so the codes saturate, when the scale decodes to 0),
/// else 0. Upstream takes the reciprocals with rcp.approx.ftz; exact here (equal for powers of
/// two).
FLASHINFER_HD float fp8_fp4_prescale(float x, float gs) {
  return half_bits_to_float(float_to_half_bits(fp32_mul(x, fp32_mul(6.0f, fp32_div(1.0f, gs)))));
}
struct Fp8Fp4Scale {
  uint8_t code = 0;
  float out = 0.0f;
};
FLASHINFER_HD Fp8Fp4Scale fp8_fp4_scale(float amax, float gs, bool ue8m0) {
  const float s = fp32_mul(gs, fp32_mul(amax, fp32_div(1.0f, 6.0f)));
  Fp8Fp4Scale r;
  float narrow;
  if (ue8m0) {
    r.code = ue8m0_round_up(s);
    narrow = ue8m0_to_float(r.code);
  } else {
    r.code = float_to_e4m3fn_bits(s, true);
    narrow = e4m3_code_to_float(r.code);
  }
  r.out = s != 0.0f ? fp32_mul(gs, fp32_div(1.0f, narrow)) : 0.0f;
  return r;
}

inline constexpr int kMxfp8Block = 32;

/// mxfp8_quantize's block scale (kernels::cpu::mxfp8_quantize and every CUDA MXFP8 kernel): the
/// ue8m0 code of the smallest power of two >= amax / 448 (e4m3's largest finite value).
FLASHINFER_HD uint8_t mxfp8_scale_code(float amax) {
  return ue8m0_round_up(fp32_div(amax, 448.0f));
}

/// mxfp8_quantize's value code: e4m3_satfinite(v / sf), sf = ue8m0_to_float(scale code), with
/// upstream 0.7.4's inverse of the code (ue8m0_inverse_scale: 2^(127 - code), but 0 for code 0
/// and for 254 / 255, whose inverse is below fp32's normal range): those blocks quantize to
/// signed zeros (0.6.18 divided by 2^-127). Otherwise v times the exact power of two is v / sf.
FLASHINFER_HD uint8_t mxfp8_value_code(float v, float sf) {
  const bool zero = !(sf > 0x1p-127f) || sf >= 0x1p127f;  // codes 0, 254 and 255 (NaN)
  return float_to_e4m3fn_bits(zero ? fp32_mul(v, 0.0f) : fp32_div(v, sf), true);
}

/// The append kernels' E2M1 rounding: nearest, ties to even, saturating at 6; the sign bit is
/// the input's (so -0 and tiny negatives give code 8) and NaN gives magnitude 0.
FLASHINFER_HD uint8_t nvfp4_append_e2m1(float v) {
  const uint8_t sign = (f32_to_bits(v) >> 31) != 0 ? 0x8 : 0x0;
  const float a = fp32_abs(v);
  uint8_t c;
  if (!(a > 0.25f)) {
    c = 0;
  } else if (a < 0.75f) {
    c = 1;
  } else if (a <= 1.25f) {
    c = 2;
  } else if (a < 1.75f) {
    c = 3;
  } else if (a <= 2.5f) {
    c = 4;
  } else if (a < 3.5f) {
    c = 5;
  } else if (a <= 5.0f) {
    c = 6;
  } else {
    c = 7;
  }
  return static_cast<uint8_t>(sign | c);
}

/// The append kernels' block (gs the global decode scale, k_scale / v_scale):
/// sf = e4m3_satfinite(amax / (6 * gs)), q_i = e2m1(v_i * (1 / (sf * gs))), the reciprocal 0
/// for an all-zero block or a zero scale.
FLASHINFER_HD Nvfp4Block nvfp4_append_block(const float* v, float gs) {
  Nvfp4Block b;
  const float amax = nvfp4_block_amax(v);
  const float s = amax > 0.0f && gs > 0.0f ? fp32_div(amax, fp32_mul(6.0f, gs)) : 0.0f;
  b.sf = float_to_e4m3fn_bits(s, true);
  const float sr = e4m3_code_to_float(b.sf);
  const float os = amax > 0.0f && sr > 0.0f && gs > 0.0f ? fp32_div(1.0f, fp32_mul(sr, gs)) : 0.0f;
  FLASHINFER_UNROLL
  for (int t = 0; t < kNvfp4Block / 2; ++t) {
    const uint8_t lo = nvfp4_append_e2m1(fp32_mul(v[2 * t], os));
    const uint8_t hi = nvfp4_append_e2m1(fp32_mul(v[2 * t + 1], os));
    b.packed |= static_cast<uint64_t>(pack_e2m1x2(lo, hi)) << (8 * t);
  }
  return b;
}

/// nvfp4_quantize_paged_kv_cache's V scales: within each (page, head) tile of [page_size, sd]
/// scales (sd = head_dim / 16, a multiple of 4; page_size a multiple of 4), the scale of token t,
/// column s moves to token 4 (t / 4) + s / (sd / 4), column 4 (s % (sd / 4)) + t % 4 (upstream's
/// view [.., page_size / 4, 4, .., 4, sd / 4] permuted to [.., page_size / 4, 4, .., sd / 4, 4]).
struct Nvfp4TileSlot {
  int64_t token, col;
};
FLASHINFER_HD Nvfp4TileSlot nvfp4_v_scale_slot(int64_t t, int64_t s, int64_t sd) {
  const int64_t q = sd / 4;
  return {4 * (t / 4) + s / q, 4 * (s % q) + t % 4};
}

/// Where nvfp4_quantize_paged_kv_cache writes the scale of block b of input row (pg, a, c) (the
/// params' logical [pages, A, B] order): the same position in [pages, A, B, head_dim / 16], or
/// for V its interleaved slot within the (page, head) tile.
FLASHINFER_HD int64_t nvfp4_paged_sf_offset(const Nvfp4PagedQuantParams& p, int64_t pg, int64_t a,
                                            int64_t c, int64_t b) {
  const int64_t sd = p.shape[3] / kNvfp4Block;
  if (p.swizzle_sf) {
    const Nvfp4TileSlot slot = nvfp4_v_scale_slot(p.hnd ? c : a, b, sd);
    (p.hnd ? c : a) = slot.token;
    b = slot.col;
  }
  return ((pg * p.shape[1] + a) * p.shape[2] + c) * sd + b;
}

}  // namespace flashinfer::kernels
