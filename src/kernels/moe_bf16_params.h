// Private: trtllm_bf16_moe / trtllm_bf16_routed_moe as the backends receive them. The CPU
// reference gets plain [E, Mn, K] weights (api/moe_layout.h turns the stored layout back on the
// host); the CUDA kernel reads the stored weights in place through moe_weight_offset
// (kernels/moe_layout_rules.h, the index the host transform uses too), so no weight copy is made
// on the device.
#pragma once

#include <cstdint>

#include "kernels/moe_layout_rules.h"
#include "kernels/moe_params.h"

namespace flashinfer::kernels {

/// The trtllm BF16 MoE call. base.moe.w1 / w2 are plain weights on the CPU, the stored ones
/// (described by w1_index / w2_index) on CUDA.
struct TrtllmBf16MoeParams {
  TrtllmMoeParams base;
  MoeWeightIndex w1_index, w2_index;
  // CUDA only, set by the launcher in the stream's scratch (the caller's are ignored): ws_ids
  // [num_tokens * top_k] int32, ws_w (the bf16-rounded routing weights) [num_tokens * top_k],
  // and on the GEMV route ws_g1 [.., gemm1_n], ws_h [.., inter], ws_y [.., hidden] fp32 (ws_y
  // null when not finalizing).
  int32_t* ws_ids = nullptr;
  float* ws_w = nullptr;
  float* ws_g1 = nullptr;
  float* ws_h = nullptr;
  float* ws_y = nullptr;
};

}  // namespace flashinfer::kernels
