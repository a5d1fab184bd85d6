// MonoMoE (flashinfer.fused_moe.monomoe): upstream's decode-size block-FP8 top-k MoE, one Hopper
// kernel hard-specialized to 256 experts, hidden size K 2048, intermediate N 512 (gate and up:
// 2N rows), 1-8 tokens. Here a CPU reference everywhere and a CUDA kernel on sm_90, both with
// one rounding order (docs/MOE.md, "MonoMoE").
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// Whether mono_moe can run here: always (the CPU reference; the CUDA kernel on sm_90 where the
/// library has CUDA). Upstream: whether its JIT module builds.
bool has_monomoe();

/// Bytes of upstream's scratchpad (its kernel's shared state for this shape): 123968. Our CUDA
/// kernels use the first bytes of it.
int64_t get_scratchpad_size_bytes();

/// A zero-filled uint8 scratchpad of get_scratchpad_size_bytes() on `device` ("cuda", "cuda:N",
/// "cpu", an index or a recorded torch.device); one buffer serves any number of calls.
Tensor alloc_scratchpad(const std::optional<Value>& device);

/// [E, 2N, K] with rows [0, N) gate and [N, 2N) up -> the same rows in 8-row pairs: gate[0:8],
/// up[0:8], gate[8:16], up[8:16], ... (new row 16 (j / 8) + 8 h + j % 8 holds old row h N + j).
/// Any dtype and E, K; N a multiple of 64. The scales are not permuted.
Tensor interleave_for_tma_wgmma_up(const Tensor& w_fp8);

/// out [M, 2048] bf16 = sum over each token's top_k experts (routed on router_logits [M, 256]
/// bf16: softmax or sigmoid, renormalized or not) of the block-FP8 expert
/// down(rw SiLU(gate) up) on activations_in [M, 2048] bf16 quantized 1 x 128 to e4m3:
/// expert_weights_up [256, 1024, 2048] e4m3 (interleaved by this call unless interleave_up is
/// false, when it must already be), expert_scales_up [256, 8, 16] fp32 (128 x 128 blocks of the
/// original row order), expert_weights_down [256, 2048, 512] e4m3, expert_scales_down
/// [256, 16, 4] fp32; the intermediate re-quantized in 64-wide groups. 1 <= M <= 8,
/// 1 <= top_k <= 8.
Tensor mono_moe(const Tensor& activations_in, const Tensor& router_logits,
                const Tensor& expert_weights_up, const Tensor& expert_scales_up,
                const Tensor& expert_weights_down, const Tensor& expert_scales_down, int64_t top_k,
                std::string scoring_func = "softmax", bool renormalize = true,
                std::optional<Tensor> out = std::nullopt,
                std::optional<Tensor> scratchpad = std::nullopt, bool interleave_up = true);

}  // namespace flashinfer
