// Private: cutlass_fused_moe's FP8 paths (FP8 per tensor, DeepSeek FP8 block scale), checked and
// dispatched here; src/api/moe.cpp hands such calls over (docs/MOE.md).
#pragma once

#include <optional>
#include <vector>

#include "api/moe_cutlass_call.h"
#include "flashinfer/bench.h"
#include "flashinfer/ops/moe.h"

namespace flashinfer::api {

/// Whether a cutlass_fused_moe call selects an FP8 path this file implements: the DeepSeek block
/// scale flag, or e4m3 input and e4m3 weights without MXFP8 activation scaling (upstream's
/// isFp8Quant()).
bool cutlass_fused_moe_is_fp8(const Tensor& input, const Tensor& fc1_expert_weights,
                              bool use_deepseek_fp8_block_scale, bool use_mxfp8_act_scaling);

/// The FP8 call: checks what the FP8 paths need (errors name the argument) and runs it.
std::vector<Tensor> cutlass_fused_moe_fp8(const CutlassMoeCall& c);

/// `flashinfer bench cutlass_fused_moe` with an e4m3 input_dtype: the FP8 per-tensor path, m
/// tokens, hidden_size, inter n, 8 experts, top-2, Swiglu, output out_dtype (default bf16).
BenchCase bench_cutlass_fused_moe_fp8(const BenchShape& s, Device dev);
/// The bench hook's DeepSeek FP8 block-scale case (--use_deepseek_fp8_block_scale): bf16 input
/// [m, hidden_size], 8 experts of inter n (SwiGLU: fc1 [8, 2n, hidden]), top-2, e4m3 weights with
/// 128 x 128 block scales, bf16 output.
BenchCase bench_cutlass_fused_moe_fp8_block(const BenchShape& s, Device dev);

}  // namespace flashinfer::api
