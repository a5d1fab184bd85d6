// CUDA launchers for the MoE ops. Plain C++ header: callable from the API layer, which never
// sees CUDA headers. Launchers throw flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/moe_bf16_params.h"
#include "kernels/moe_params.h"
#include "kernels/moe_quant_params.h"

namespace flashinfer::kernels::cuda {

/// Needs p.ws_g1 / ws_h / ws_y (device fp32 scratch, see CutlassMoeParams).
void cutlass_moe(const CutlassMoeParams& p, void* stream, bool enable_pdl);
void deepseek_routing(const DeepSeekRoutingParams& p, void* stream, bool enable_pdl);
/// trtllm_fp8_block_scale_moe / _routed_ (block_scale must be set; plain MajorK weights).
/// Needs the ws_* scratch of TrtllmFp8MoeParams; num_experts <= kFp8MoeCudaMaxExperts.
void trtllm_fp8_moe(const TrtllmFp8MoeParams& p, void* stream, bool enable_pdl);
/// trtllm_bf16_moe / _routed_: weights read in their stored layout (p.w1_index / w2_index).
/// Needs the ws_* scratch of TrtllmBf16MoeParams; from logits num_experts <=
/// kFp8MoeCudaMaxExperts and grouped DeepSeekV3 n_group <= 32 (kUnsupported otherwise).
/// Synchronizes the stream before returning (the scratch is freed by the caller).
void trtllm_bf16_moe(const TrtllmBf16MoeParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
