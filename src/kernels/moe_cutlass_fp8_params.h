// Private: what the backends of cutlass_fused_moe's FP8 paths (FP8 per tensor, DeepSeek FP8
// block scale) receive. Semantics and sources: docs/MOE.md, section "cutlass_fused_moe: FP8
// paths".
#pragma once

#include "kernels/moe_params.h"

namespace flashinfer::kernels {

/// cutlass_fused_moe with FP8 weights. `base` carries the routing, the activation and its
/// per-expert parameters, the sizes and the output exactly as in the unquantized op; `base.w1` /
/// `base.w2` hold e4m3 codes, `base.dtype` is the input's dtype (e4m3 for the per-tensor path,
/// bf16 for the block-scale path) and `base.out_dtype` the output's. `base.ws_*` are unused.
///
/// Per tensor, for each routed row (token t, local expert e):
///   g1 = round_out((fp8(x[t]) @ fp8(w1[e]).T) * fc1_dequant[e])
///   h  = e4m3_satfinite(act(g1 + b1[e]) * fc2_quant[e or 0])
///   y  = round_out((h @ fp8(w2[e]).T) * fc2_dequant[e])
/// Block scale (input bf16, 128x128 weight blocks, 1x128 activation blocks quantized here):
///   g1 = bf16(blockgemm(q1x128(x[t]), w1[e], w1_scale[e]));  h = bf16(act(g1 + b1[e]))
///   y  = bf16(blockgemm(q1x128(h), w2[e], w2_scale[e]))
/// and in both: out[t] = round_out(sum_k scale[t, k] * (y_k + b2[e_k])) in fp32, k order.
/// The per-element arithmetic both backends share is in kernels/moe_cutlass_fp8_rules.h.
struct CutlassMoeFp8Params {
  CutlassMoeParams base;
  DType bias_dtype = DType::kBFloat16;  // b1 / b2 (upstream: the output dtype)
  bool block_scale = false;
  // Per tensor: fp32 [E_l], [1] or [E_l] (fc2_quant_per_expert), [E_l].
  const float* fc1_dequant = nullptr;
  const float* fc2_quant = nullptr;
  bool fc2_quant_per_expert = false;
  const float* fc2_dequant = nullptr;
  // Block scale: fp32 [E_l, ceil(gemm1_n / 128), ceil(hidden / 128)] and
  // [E_l, ceil(hidden / 128), ceil(inter / 128)], contiguous.
  const float* w1_block_scale = nullptr;
  const float* w2_block_scale = nullptr;
};

}  // namespace flashinfer::kernels
