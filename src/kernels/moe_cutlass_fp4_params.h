// Private: what the CPU reference of cutlass_fused_moe's FP4 paths receives (NVFP4, MXFP8
// activations x MXFP4 weights, W4A16 MXFP4). Semantics and sources: docs/MOE.md.
#pragma once

#include <cstdint>

#include "kernels/moe_params.h"
#include "kernels/quantization_params.h"

namespace flashinfer::kernels {

enum class CutlassFp4Mode : int {
  kNvfp4 = 0,       // NVFP4 x NVFP4 (e4m3 scales of 16, fp32 global scales)
  kMxfp8Mxfp4 = 1,  // MXFP8 activations x MXFP4 weights (ue8m0 scales of 32)
  kW4A16Mxfp4 = 2,  // fp16/bf16 activations x MXFP4 weights in the SM90 mixed-GEMM layouts
  // "Humming" (use_wfp4afp8_humming): fp16/bf16 activations quantized to fp8 per routed row in
  // the op x MXFP4 weights prepared by preprocess_moe_weights_for_sm90_mixed_gemm_humming.
  kHummingFp8Mxfp4 = 3,
  // MXFP8 activations x MXFP8 weights (e4m3 weights, ue8m0 scales of 32 in the 128x4 layout).
  kMxfp8Mxfp8 = 4,
  // W4A8 INT4 (use_packed_weights with use_w4_group_scaling): fp16/bf16 activations times
  // per-column pre-quant scales, cast to fp8 in the op, x signed int4 weights in the SM90
  // interleaved layout with 16-bit group scales (128 columns) in the SM90 fold.
  kW4A8Int4 = 5,
  // Weight-only INT4 (use_packed_weights without use_w4_group_scaling): fp16/bf16 activations
  // (optionally AWQ-smoothed) x int4 weights in TensorRT-LLM's SM80 fpA_intB byte order,
  // dequantized in the 16-bit type with [k / 128, n] group scales and optional zero points.
  kWoqInt4 = 6,
};

/// moe: routing, sizes, activation parameters and output as for the unquantized op, except
///   moe.input   the input rows of `in_dtype` (row stride moe.in_stride in bytes for packed
///               NVFP4, elements otherwise);
///   moe.w1/w2   packed 4-bit weights, [E_l, gemm1_n, hidden / 2] and [E_l, hidden, inter / 2]
///               bytes (W4A16 / Humming: in the SM90 interleaved byte layout; MXFP8 x MXFP8:
///               e4m3 codes, [E_l, gemm1_n, hidden] and [E_l, hidden, inter]);
///   moe.b1/b2   biases of moe.dtype or null;
///   moe.dtype   the type GEMM outputs and the activation are stored in (the output dtype for
///               NVFP4 / MXFP8, the input dtype for W4A16).
struct CutlassMoeFp4Params {
  CutlassMoeParams moe;
  CutlassFp4Mode mode = CutlassFp4Mode::kNvfp4;
  DType in_dtype = DType::kBFloat16;  // fp16/bf16, uint8 (packed NVFP4) or float8_e4m3fn (MXFP8)
  // Pre-quantized input's scales: [num_tokens, hidden / vec] in input_sf_layout.
  const uint8_t* input_sf = nullptr;
  SfLayoutCode input_sf_layout = SfLayoutCode::k128x4;
  // Weight scales. NVFP4 / MXFP4: each expert's [rows, cols / vec] scales in the 128x4 layout,
  // w*_sf_stride bytes apart. W4A16: upstream's SM90 fold of [E_l, rows, cols / 32] ue8m0.
  // Humming: the same fold of the per-block exponent offsets (one byte per 32 values).
  const uint8_t* w1_sf = nullptr;
  const uint8_t* w2_sf = nullptr;
  int64_t w1_sf_stride = 0, w2_sf_stride = 0;
  // fp32 global scales (NVFP4 / MXFP8 only): act globals are one value or [E_l]; the GEMM
  // alphas fc1_global / fc2_global are [E_l]. Humming: fc1_global / fc2_global are the
  // per-expert residual scales (times 64), the act globals unused.
  const float* fc1_act_global = nullptr;
  bool fc1_act_per_expert = false;
  const float* fc1_global = nullptr;
  const float* fc2_act_global = nullptr;
  bool fc2_act_per_expert = false;
  const float* fc2_global = nullptr;
  // W4A8: the per-column pre-quant scales ([hidden] and [inter], of the input dtype) and the
  // group scales (w1_sf / w2_sf: the fold of [E_l, rows, cols / 128] 16-bit values, w*_sf_stride
  // bytes per expert); fc1_global / fc2_global are the GEMM alphas.
  const uint16_t* fc1_prequant = nullptr;
  const uint16_t* fc2_prequant = nullptr;
  // Weight-only INT4: w1_sf / w2_sf hold each expert's [k / 128, n] group scales of the input
  // dtype (w*_sf_stride bytes apart), w1_zeros / w2_zeros the zero points in the same layout or
  // null; fc1_prequant / fc2_prequant are both set (AWQ smoothing) or both null.
  const uint16_t* w1_zeros = nullptr;
  const uint16_t* w2_zeros = nullptr;
};

}  // namespace flashinfer::kernels
