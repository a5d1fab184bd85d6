// Multi-LoRA over MoE experts (flashinfer.fused_moe.bgmv_moe and .moe_lora_delta): the BGMV
// shrink/expand pair per (token, expert) pair and the FC1/FC2 delta builders. CPU only.
// Semantics and sources: docs/MOE.md.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "flashinfer/dtype.h"
#include "flashinfer/tensor.h"

namespace flashinfer {

/// Upstream's fill_w_ptr helper (not an API op): sets w_ptr[slice_id, e] (int64 [S, >= E]) to the
/// host address of weights[0, e] for e < num_experts and returns weights.stride(0), the element
/// stride between adapters. weights: contiguous CPU [max_loras, num_experts, rows, cols]. The
/// bank is also registered with the process (as a weak reference): the pointer-table ops accept
/// only addresses inside a live registered bank of the expected dtype, so a stale or foreign
/// table (a recording from another process) is refused instead of read.
int64_t fill_w_ptr(const Tensor& w_ptr, const Tensor& weights, int64_t num_experts,
                   int64_t slice_id);

/// y[s, p, :] += x[row] @ A_s[lora, e].T for each pair p with lora = lora_indices[token] >= 0,
/// token = sorted_token_ids[p], e = expert_ids[p], row = per_pair_input ? p : token.
/// y [S, P, rank] and x [rows, feat_in] fp16/bf16 (one dtype, the banks' too); w_ptr int64
/// [S, E] from fill_w_ptr over A banks [max_loras, E, rank, feat_in].
void bgmv_moe_shrink(const Tensor& y, const Tensor& x, const Tensor& w_ptr,
                     const Tensor& sorted_token_ids, const Tensor& expert_ids,
                     const Tensor& lora_indices, int64_t lora_stride, bool per_pair_input = false);

/// finalize: y[token, start_s + j] += topk_weights[p] * (x[s, p] @ B_s[lora, e].T)[j];
/// otherwise y[p, start_s + j] = (x[s, p] @ B_s[lora, e].T)[j] (skipped pairs untouched).
/// y float32; x [S, P, rank] fp16/bf16; w_ptr over B banks [max_loras, E, feat_out, rank];
/// feat_out = output_slices[0] for every slice (upstream passes only that one).
void bgmv_moe_expand(const Tensor& y, const Tensor& x, const Tensor& w_ptr,
                     const Tensor& sorted_token_ids, const Tensor& expert_ids,
                     const Tensor& topk_weights, const Tensor& lora_indices,
                     const Tensor& slice_start_loc, std::vector<int64_t> output_slices,
                     int64_t lora_stride, bool finalize = true);

/// Shrink into x.dtype, then the weighted expand in fp32, returned in x.dtype:
/// [num_tokens, output_dim or sum(feat_out)].
Tensor bgmv_moe(const Tensor& x, std::vector<Tensor> lora_a_weights,
                std::vector<Tensor> lora_b_weights, const Tensor& sorted_token_ids,
                const Tensor& expert_ids, const Tensor& lora_indices, const Tensor& topk_weights,
                int64_t num_experts, std::optional<int64_t> output_dim = std::nullopt);

/// FC1 delta [T, top_k, 2 * intermediate_size] in out_dtype: per (token, slot), unweighted,
/// scale * concat(B_gate @ (A_gate @ x), B_up @ (A_up @ x)). w_ptr_a / w_ptr_b: [2, E].
Tensor bgmv_moe_gemm1_lora_delta(const Tensor& hidden_states, const Tensor& w_ptr_a,
                                 int64_t lora_stride_a, const Tensor& w_ptr_b,
                                 int64_t lora_stride_b, const Tensor& topk_ids,
                                 const Tensor& lora_ids, int64_t rank, int64_t intermediate_size,
                                 DType lora_dtype = DType::kBFloat16, double scale = 1.0,
                                 DType out_dtype = DType::kBFloat16);

/// FC2 delta [T, hidden_size] in out_dtype: scale * sum_j w[t, j] * B_down @ (A_down @ a[t, j]),
/// a gathered from the permuted activation through expanded_idx_to_permuted_idx (< 0: zeros).
Tensor bgmv_moe_gemm2_lora_delta(const Tensor& gemm1_activation_output,
                                 const Tensor& expanded_idx_to_permuted_idx, const Tensor& w_ptr_a,
                                 int64_t lora_stride_a, const Tensor& w_ptr_b,
                                 int64_t lora_stride_b, const Tensor& topk_ids,
                                 const Tensor& topk_weights, const Tensor& lora_ids, int64_t rank,
                                 int64_t hidden_size, DType lora_dtype = DType::kBFloat16,
                                 double scale = 1.0, DType out_dtype = DType::kBFloat16);

}  // namespace flashinfer
