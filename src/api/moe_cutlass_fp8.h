// Private: cutlass_fused_moe's FP8 paths (FP8 per tensor, DeepSeek FP8 block scale), checked and
// dispatched here; src/api/moe.cpp hands such calls over (docs/MOE.md).
#pragma once

#include <optional>
#include <vector>

#include "flashinfer/bench.h"
#include "flashinfer/ops/moe.h"

namespace flashinfer::api {

/// Whether a cutlass_fused_moe call selects an FP8 path this file implements: the DeepSeek block
/// scale flag, or e4m3 input and e4m3 weights without MXFP8 activation scaling (upstream's
/// isFp8Quant()).
bool cutlass_fused_moe_is_fp8(const Tensor& input, const Tensor& fc1_expert_weights,
                              bool use_deepseek_fp8_block_scale, bool use_mxfp8_act_scaling);

/// The FP8 call, with cutlass_fused_moe's arguments (less the performance-only ones).
std::vector<Tensor> cutlass_fused_moe_fp8(
    const Tensor& input, const Tensor& ids, const Tensor& scales, const Tensor& w1,
    const Tensor& w2, DType output_dtype, const std::vector<Tensor>& quant_scales,
    const std::optional<Tensor>& b1, const std::optional<Tensor>& b2,
    const std::optional<Tensor>& input_sf, const std::optional<Tensor>& swiglu_alpha,
    const std::optional<Tensor>& swiglu_beta, const std::optional<Tensor>& swiglu_limit,
    int64_t tp_size, int64_t tp_rank, int64_t ep_size, int64_t ep_rank, int64_t cluster_size,
    int64_t cluster_rank, const std::optional<Tensor>& output, bool enable_alltoall,
    bool use_deepseek_fp8_block_scale, bool use_w4_group_scaling, bool use_mxfp8_act_scaling,
    bool min_latency_mode, bool use_packed_weights, bool use_wfp4afp8_humming,
    std::optional<bool> enable_pdl, ActivationType activation_type,
    const CutlassFusedMoeOptions& options);

/// `flashinfer bench cutlass_fused_moe` with an e4m3 input_dtype: the FP8 per-tensor path, m
/// tokens, hidden_size, inter n, 8 experts, top-2, Swiglu, output out_dtype (default bf16).
BenchCase bench_cutlass_fused_moe_fp8(const BenchShape& s, Device dev);

}  // namespace flashinfer::api
