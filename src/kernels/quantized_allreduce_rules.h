// Private: quantized_all_reduce's arithmetic, which the CPU reference
// (src/kernels/cpu/quantized_allreduce_cpu.cpp) and the CUDA kernel
// (src/kernels/cuda/quantized_allreduce_cuda.cu) share, so both write the same bits. Upstream's
// Triton kernel, step by step as it compiles for sm_90: a group's amax floored at 1e-12; the
// stored dequant scale amax / 448 and the quant scale 448 / amax, Triton's fp32 `/` being PTX
// div.full.f32 (ptxas makes the first amax * RN(1/448), the second 448 * MUFU.RCP(amax) with a
// range scaling); x * quant scale clamped to [-448, 448] and rounded to e4m3; the owner's sum
// over the ranks in rank order as acc = fma(fp8, scale, acc) (Triton contracts
// `acc += vals * inv`); the owner's sum rounded to bf16 for itself and requantized by the same
// rule for the others, who read fp8 * scale rounded to fp32 and then to bf16. Not modelled:
// MUFU.RCP's last place (a correctly rounded 1 / amax stands in, on the CPU and the GPU alike).
// Unit-tested on the CPU (tests/ops/test_quantized_allreduce.cpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "flashinfer/float_formats.h"
#include "kernels/fp32_rules.h"
#include "kernels/nvfp4_rules.h"  // e4m3_code_to_float (device code cannot read decode tables)

namespace flashinfer::kernels {

inline constexpr float kQarFp8Max = 448.0f;
inline constexpr float kQarAmaxFloor = 1e-12f;
inline constexpr uint32_t kQarRcp448Bits = 0x3B124925u;  // RN(1 / 448)

/// The group's scales from max |x| over its elements (NaN elements are skipped by the max, as
/// Triton's max does; a group of only NaN or zeros takes the floor).
struct QarScales {
  float inv;    // amax / 448: what the readers multiply by
  float quant;  // 448 / amax: what the writer multiplies by
};
FLASHINFER_HD QarScales qar_scales(float abs_max) {
  const float amax = abs_max > kQarAmaxFloor ? abs_max : kQarAmaxFloor;
  // div.full.f32 448, amax: above 2^126 both sides are scaled by 1/4 first (an infinite amax
  // gives 448 * RN(1 / inf) = 0).
  const bool big = amax > 8.50705917302346158658e+37f;
  const float num = big ? 112.0f : kQarFp8Max, den = big ? fp32_mul(amax, 0.25f) : amax;
  return {fp32_mul(amax, f32_from_bits(kQarRcp448Bits)), fp32_mul(fp32_div(1.0f, den), num)};
}

/// x * quant clamped to [-448, 448], to e4m3 by RNE. On sm_90 Triton's clamp to a symmetric
/// range is min.xorsign.abs: a NaN product (a GPU's NaN is the positive canonical one) is +448.
FLASHINFER_HD uint8_t qar_quantize(float x, float quant) {
  float v = fp32_mul(x, quant);
  if (v != v) return 0x7E;  // +448
  v = v > -kQarFp8Max ? v : -kQarFp8Max;
  v = v < kQarFp8Max ? v : kQarFp8Max;
  return float_to_e4m3fn_bits(v, /*saturate=*/true);
}

/// acc + fp8 * scale with one rounding (the owner's accumulation).
FLASHINFER_HD float qar_accumulate(float acc, uint8_t code, float inv) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(e4m3_code_to_float(code), inv, acc);
#else
  return std::fma(e4m3_code_to_float(code), inv, acc);
#endif
}

/// fp32 to bf16 as cvt.rn.bf16.f32 does: RNE, a NaN the canonical 0x7FFF.
FLASHINFER_HD uint16_t qar_to_bf16(float v) {
  return v != v ? uint16_t{0x7FFF} : float_to_bfloat16_bits(v);
}

/// A reader's value of a requantized element: fp8 * scale in fp32, then bf16 (RNE).
FLASHINFER_HD uint16_t qar_dequantize(uint8_t code, float inv) {
  return qar_to_bf16(fp32_mul(e4m3_code_to_float(code), inv));
}

/// The rank that owns (reduces) element i: stripes of block_size elements dealt to the ranks
/// in turn.
FLASHINFER_HD int64_t qar_owner(int64_t i, int64_t block_size, int64_t world_size) {
  return i / block_size % world_size;
}

}  // namespace flashinfer::kernels
