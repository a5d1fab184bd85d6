// Private: the MXFP8 x MXFP8 form of trtllm_fp8_block_scale_moe / _routed_
// (fp8_quantization_type = Fp8QuantizationType.MxFp8). CPU reference only. Semantics and
// sources: docs/MOE.md, "Refused variants: engine use and what settles them".
#pragma once

#include <cstdint>
#include <optional>

#include "api/moe_routing_checks.h"
#include "flashinfer/ops/moe.h"
#include "flashinfer/tensor.h"

namespace flashinfer::api {

struct MoeMxFp8Args {
  const Tensor* hidden;    // float8_e4m3fn [T, H]
  const Tensor* hs_scale;  // uint8 (ue8m0) [T, H / 32], linear
  const Tensor *w1, *w1s, *w2, *w2s;
  int64_t inter, activation_type;
  bool use_shuffled_weight;
  WeightLayout layout;
  const std::optional<Tensor>*alpha, *beta, *limit;
  const std::optional<Tensor>* output;
  bool do_finalize;
  const std::optional<Tensor>* lora_delta;  // the routed op's gemm1_lora_delta (else None)
  // Upstream 0.7.4: the padded dimensions (checked by the caller), the op's biases (fp32, rows
  // stored as the weights') and workspace_buffer.
  MoeValidDims valid;
  const std::optional<Tensor>*gemm1_bias, *gemm2_bias, *workspace;
};

// Checks the arguments (naming the one at fault), undoes upstream's weight preparation on the
// host and runs the CPU reference. A call on CUDA tensors raises kUnsupported naming
// `hidden_states` (no CUDA kernel), so a replay on a GPU falls back to the CPU. `num_shared`:
// fused shared experts, already checked by the caller (api::check_moe_fused_shared): their
// weight rows follow the local_num routed ones (docs/MOE.md, "Fused shared experts").
TrtllmMoeResult trtllm_mxfp8_block_moe(const MoeRoutingArgs& rc, const MoeMxFp8Args& a,
                                       int64_t num_shared = 0);

}  // namespace flashinfer::api
