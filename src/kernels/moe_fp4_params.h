// Private: what the FP4 / MxInt4 trtllm MoE kernel receives (trtllm_fp4_block_scale_moe,
// trtllm_mxint4_block_scale_moe and their _routed_ forms). Semantics: docs/MOE.md.
#pragma once

#include <cstdint>

#include "kernels/moe_params.h"

namespace flashinfer::kernels {

/// How the weights are quantized: packed 4-bit values with one scale per block along K.
enum class Moe4Weights : int {
  kNvfp4 = 0,   // e2m1, e4m3 scales of 16
  kMxfp4 = 1,   // e2m1, ue8m0 scales of 32
  kMxint4 = 2,  // signed int4 (two's complement), bf16 scales of 32
  kMxfp8 = 3,   // e4m3, one byte per value, ue8m0 scales of 32 (trtllm_fp8_block_scale_moe MxFp8)
};

/// How the hidden states arrive.
enum class Moe4Input : int {
  kNvfp4 = 0,  // packed e2m1 [T, H/2] with e4m3 scales [T, H/16]
  kMxfp8 = 1,  // e4m3 [T, H] with ue8m0 scales [T, H/32]
  kBf16 = 2,   // bf16 [T, H]
};

/// What GEMM2 reads: the activation quantized like upstream's reference does per mode.
enum class Moe4ActQuant : int {
  kNvfp4 = 0,  // fp4_quantize of the bf16-rounded activation (global scale 1)
  kMxfp8 = 1,  // mxfp8_quantize of the bf16-rounded activation
  kBf16 = 2,   // rounded to bf16
  kNone = 3,   // fp32 as computed
  // The fp32 activation quantized to NVFP4 with the global scale and dequantized as e2m1 * sf,
  // the global scale left in the values (see nvfp4_qdq_keep_scale): the CuTe-DSL GEMM1 epilogue.
  kNvfp4KeepScale = 4,
  // kNvfp4KeepScale of the bf16-rounded activation: the b12x kernels' FC1 epilogue.
  kNvfp4KeepScaleBf16 = 5,
  // The fp32 activation quantized to MXFP8 (no bf16 rounding), the CuTe-DSL w4a8 GEMM1 epilogue:
  // per 32 values the ue8m0 code of amax / 448 rounded up (mxfp8_quantize's codes), values times
  // 2^(127 - code) rounded to e4m3 with saturation, read back as e4m3 * 2^(code - 127).
  kMxfp8Fp32 = 6,
  // The CuTe-DSL per-token path (w4a4 with per_token_scale): the activation rounded to bf16 /
  // fp16, then nvfp4_quantize_per_token_cute_dsl per row: row scale pts = amax_row *
  // act_global_scale[0] (fc2_input_scale, the inverse global scale), encode scale 1 / pts, e4m3
  // block scales of 16 from it; GEMM2 reads e2m1 * sf and multiplies its row by pts.
  kNvfp4PerTokenBf16 = 7,
  kNvfp4PerTokenFp16 = 8,
};

/// base.moe.input: the hidden states (row stride in_stride, in elements of the stored dtype:
/// bytes for NVFP4 and MXFP8, bf16 elements otherwise). base.moe.w1 / w2: the packed weights in
/// plain row order, [num_local_experts, gemm1_n, hidden / 2] and [.., hidden, inter / 2] bytes
/// (kMxfp8: one byte per value, [.., gemm1_n, hidden] and [.., hidden, inter]);
/// base.moe.b1 / b2 fp32 plain biases or null; base.moe.out bf16 [num_tokens, hidden].
struct TrtllmFp4MoeParams {
  TrtllmMoeParams base;
  Moe4Weights weights = Moe4Weights::kNvfp4;
  Moe4Input input = Moe4Input::kBf16;
  Moe4ActQuant act_quant = Moe4ActQuant::kBf16;
  const uint8_t* hs_scale = nullptr;  // [num_tokens, hidden / vec] linear codes, row stride
  int64_t hs_scale_stride = 0;
  // Linear plain-row scales: [E_l, gemm1_n, hidden / vec] and [E_l, hidden, inter / vec], uint8
  // codes (e4m3 / ue8m0) or bf16 bits (MxInt4), contiguous.
  const void* w1_scale = nullptr;
  const void* w2_scale = nullptr;
  // fp32 [E_l] each, or null for 1.
  const float* out1_scale = nullptr;       // output1_scale_scalar
  const float* out1_gate_scale = nullptr;  // output1_scale_gate_scalar
  const float* out2_scale = nullptr;       // output2_scale_scalar
  // kNvfp4 activation: the global scale of fp4_quantize, [E_l] or one value (act_gs_count 1);
  // null means 1. Dequantized as (e2m1 * sf) * (1 / gs).
  const float* act_global_scale = nullptr;
  int64_t act_gs_count = 0;
  // trtllm-gen keeps the routing weights and each expert's GEMM2 output in bf16; the CuTe-DSL
  // reference keeps both in fp32.
  bool round_routing_weights = true;
  bool round_expert_out = true;
  // b12x: bf16 hidden states (input kBf16) quantized per (token, expert) like the activation of
  // kNvfp4KeepScale, with this global scale ([E_l] or one value, in_gs_count 1; null: 1).
  bool quantize_input = false;
  // CuTe-DSL per_token_scale: fp32 [num_tokens]; multiplies GEMM1's alpha on the token's rows.
  const float* in_row_scale = nullptr;
  const float* in_global_scale = nullptr;
  int64_t in_gs_count = 0;
};

/// NVFP4 quantize-dequantize of `n` values (a multiple of 16) in place, as b12x's reference does
/// (moe_reference_f32): per block of 16, sf = e4m3(min(amax * gs / 6, 448)), v = e2m1(v / max(sf
/// / gs, 1e-30)) * sf (the result keeps the factor gs).
void nvfp4_qdq_keep_scale(float* v, int64_t n, float gs);

}  // namespace flashinfer::kernels
