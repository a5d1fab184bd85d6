// CUDA launchers for the MoE ops. Plain C++ header: callable from the API layer, which never
// sees CUDA headers. Launchers throw flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include <cstdint>

#include "kernels/moe_bf16_params.h"
#include "kernels/moe_cutlass_fp4_params.h"
#include "kernels/moe_cutlass_fp8_params.h"
#include "kernels/moe_params.h"
#include "kernels/moe_quant_params.h"

namespace flashinfer::kernels::cuda {

/// bf16 / fp16 input where moe::moe_use_grouped holds (moe_grouped_plan.h: sm80+, 16-byte aligned
/// weight rows, pairs >= 2 * local experts): the pairs permuted by expert on the device and both
/// GEMMs on the tensor-core grouped GEMM (grouped_mm_bf16), the rounding points of the GEMV
/// route. Otherwise the GEMV kernels, with p.ws_g1 / ws_h / ws_y when given (device fp32
/// scratch, see CutlassMoeParams). Scratch comes from a buffer per (device, stream) that only
/// grows: nothing is allocated once it is large enough.
void cutlass_moe(const CutlassMoeParams& p, void* stream, bool enable_pdl);

/// cutlass_fused_moe's mixed-input paths, as upstream on sm90+: W4A16 MXFP4
/// (use_w4_group_scaling with uint8 weights), Humming MXFP4 x FP8 (use_wfp4afp8_humming), W4A8
/// INT4 (use_packed_weights with use_w4_group_scaling); and weight-only INT4 (use_packed_weights
/// alone) on sm80+. A block per (token, k) pair, or for batches of 2+ pairs a local expert a
/// block per tile of up to 8 pairs of one expert (sorted on the device); a warp per 16 output
/// rows of the SM90 layouts (per 4 rows of weight-only INT4's SM80 one) reading the weights and
/// their scales in place (kernels/moe_sm90_mixed_rules.h), fp32 sums, the CPU reference's
/// rounding points (each mode's alphas, pre-quantization and fp8 inputs, the GEMM outputs
/// rounded to the input dtype, biases in fp32); the intermediates in the stream's scratch
/// (p.moe.ws_* are ignored). 16-byte aligned weights, hidden and inter in 128s (the API's
/// checks); NVFP4, MXFP8 x MXFP4 and MXFP8 x MXFP8 are refused (kUnsupported).
void cutlass_moe_sm90_mixed(const CutlassMoeFp4Params& p, void* stream, bool enable_pdl);

/// cutlass_fused_moe(enable_alltoall=True)'s rows of tokens with no local expert restored from
/// `before` (MoeKeepRowsParams), on the device: a block per token reads its ids and copies its
/// row (16-byte words where the rows allow), so the call reads nothing back and captures.
void moe_keep_rows(const MoeKeepRowsParams& p, void* stream);

/// cutlass_fused_moe's FP8 paths (FP8 per tensor, DeepSeek FP8 block scale; p.base.ws_* are
/// ignored): the GEMV route, one block per (token, k) pair, the CPU reference's rounding points
/// and its per-element arithmetic (kernels/moe_cutlass_fp8_rules.h), the intermediates in the
/// stream's scratch (moe::moe_fp8_gemv_scratch; nothing allocated once it is large enough). Both
/// take the grouped route instead where moe::moe_use_grouped says (prefill-sized batches, e4m3
/// rows of 16-byte multiples): per tensor on the grouped GEMM with one alpha per expert, block
/// scale on its block-scaled form (grouped_mm_fp8_block_scaled: each 128-wide K block's sum
/// promoted with the two scales, the GEMV route's rounding points; moe::moe_block_scale_scratch).
/// The block-scale path runs on sm90 only, as upstream (kUnsupported naming
/// use_deepseek_fp8_block_scale elsewhere). Counted in cutlass_moe_cuda_stats by the route taken.
void cutlass_moe_fp8(const CutlassMoeFp8Params& p, void* stream, bool enable_pdl);

/// Tests: 0 lets cutlass_moe, cutlass_moe_fp8 and trtllm_bf16_moe pick their route, 1 forces the
/// GEMV kernels, 2
/// the grouped route where eligible (moe::moe_use_grouped's `force`). Process-wide. The stats
/// count both ops' routes and the scratch they share.
void set_cutlass_moe_route(int force);
struct CutlassMoeCudaStats {
  uint64_t grouped_runs = 0, gemv_runs = 0, scratch_allocs = 0;
};
CutlassMoeCudaStats cutlass_moe_cuda_stats();
void deepseek_routing(const DeepSeekRoutingParams& p, void* stream, bool enable_pdl);
/// The trtllm MoE ops' routing (from logits, or the _routed_ ops' precomputed ids and weights)
/// into ids / w [num_tokens, top_k] on the device, the weights rounded to bf16 (and their bits
/// to b.expert_weights_out, the ids to b.replay_out, when set): a warp a token. Needs
/// num_experts <= kFp8MoeCudaMaxExperts and, for grouped DeepSeekV3, n_group <= 32 (the
/// launchers check). Asynchronous on `stream`.
void trtllm_route(const TrtllmMoeParams& b, int32_t* ids, float* w, void* stream, bool enable_pdl);
/// trtllm_fp8_block_scale_moe / _routed_ (block_scale set) and trtllm_fp8_per_tensor_scale_moe
/// / _routed_ (block_scale clear): weights read in their stored layout (p.w1_index /
/// w2_index), the ws_* intermediates in the stream's scratch (p.ws_* are ignored);
/// num_experts <= kFp8MoeCudaMaxExperts and grouped DeepSeekV3 n_group <= 32 (kUnsupported
/// otherwise).
void trtllm_fp8_moe(const TrtllmFp8MoeParams& p, void* stream, bool enable_pdl);
/// trtllm_bf16_moe / _routed_: where moe::moe_trtllm_use_grouped holds (MajorK weights, shuffled
/// or not, sm80+, 16-byte aligned rows, pairs >= 2 * local experts * moe_trtllm_ep_size) the
/// grouped route of cutlass_moe with the trtllm rounding points (GEMM1 fp32, activation and
/// GEMM2 rounded to bf16); otherwise the GEMV kernels reading the weights in their stored layout
/// (p.w1_index / w2_index). The intermediates live in the stream's scratch (p.ws_* are ignored).
/// From logits num_experts <= kFp8MoeCudaMaxExperts and grouped DeepSeekV3 n_group <= 32
/// (kUnsupported otherwise).
void trtllm_bf16_moe(const TrtllmBf16MoeParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
