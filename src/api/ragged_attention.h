// Private: the ragged-attention kernel table (CPU reference, CUDA kernel) shared by
// trtllm_ragged_attention_deepseek and the fmha_v2 prefill names.
#pragma once

#include <optional>
#include <string_view>

#include "flashinfer/device.h"
#include "flashinfer/tensor.h"
#include "kernels/ragged_attention_params.h"

namespace flashinfer::api {

/// Runs `p` on `device`. p.cu_q, p.cu_kv and p.kv_lens point to host arrays (batch + 1, batch + 1
/// and batch elements); for CUDA they (and the row -> request map) are copied to the device
/// first. Errors name `op` and `arg`. On CUDA the FA2 kernel's items split the keys when they
/// would not fill the device (api::one_shot_plan); their partials go to `workspace` (the op's
/// workspace_buffer; too small a one is refused naming it) or, with nullptr (ops without one), to
/// the CUDA backend's per-stream scratch.
void run_ragged_attention(kernels::RaggedAttentionParams p, Device device, const char* op,
                          const char* arg, std::optional<bool> enable_pdl,
                          const Tensor* workspace = nullptr);

/// Records the table's backends for `op` (is_backend_supported, list-ops).
void register_ragged_attention_backends(std::string_view op);

}  // namespace flashinfer::api
