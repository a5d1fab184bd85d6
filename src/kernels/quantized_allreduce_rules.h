// Private: quantized_all_reduce's arithmetic, which the CPU reference
// (src/kernels/cpu/quantized_allreduce_cpu.cpp) and the CUDA kernel
// (src/kernels/cuda/quantized_allreduce_cuda.cu) share, so both write the same bits. Upstream's
// Triton kernel, step by step: a group's amax floored at 1e-12, the stored dequant scale
// amax / 448 and the quant scale 448 / amax (two IEEE divisions), x * quant scale clamped to
// [-448, 448] and rounded to e4m3; the owner's sum over the ranks in rank order as
// acc = fma(fp8, scale, acc) (Triton contracts `acc += vals * inv`); the owner's sum rounded to
// bf16 for itself and requantized by the same rule for the others, who read fp8 * scale rounded
// to fp32 and then to bf16. Unit-tested on the CPU (tests/ops/test_quantized_allreduce.cpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "flashinfer/float_formats.h"
#include "kernels/fp32_rules.h"
#include "kernels/nvfp4_rules.h"  // e4m3_code_to_float (device code cannot read decode tables)

namespace flashinfer::kernels {

inline constexpr float kQarFp8Max = 448.0f;
inline constexpr float kQarAmaxFloor = 1e-12f;

/// The group's scales from max |x| over its elements (NaN elements are skipped by the max, as
/// fmax does; a group of only NaN or zeros takes the floor).
struct QarScales {
  float inv;    // amax / 448: what the readers multiply by
  float quant;  // 448 / amax: what the writer multiplies by
};
FLASHINFER_HD QarScales qar_scales(float abs_max) {
  const float amax = abs_max > kQarAmaxFloor ? abs_max : kQarAmaxFloor;
  return {fp32_div(amax, kQarFp8Max), fp32_div(kQarFp8Max, amax)};
}

/// x * quant clamped to [-448, 448], to e4m3 by RNE. The clamp is Triton's without NaN
/// propagation (maxnum with -448, then minnum with 448): a NaN product becomes -448.
FLASHINFER_HD uint8_t qar_quantize(float x, float quant) {
  float v = fp32_mul(x, quant);
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

/// A reader's value of a requantized element: fp8 * scale in fp32, then bf16 (RNE).
FLASHINFER_HD uint16_t qar_dequantize(uint8_t code, float inv) {
  return float_to_bfloat16_bits(fp32_mul(e4m3_code_to_float(code), inv));
}

/// The rank that owns (reduces) element i: stripes of block_size elements dealt to the ranks
/// in turn.
FLASHINFER_HD int64_t qar_owner(int64_t i, int64_t block_size, int64_t world_size) {
  return i / block_size % world_size;
}

}  // namespace flashinfer::kernels
