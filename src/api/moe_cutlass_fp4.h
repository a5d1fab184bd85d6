// Private: cutlass_fused_moe's FP4 paths (NVFP4, MXFP8 activations x MXFP4 weights, W4A16
// MXFP4), reached from cutlass_fused_moe when the arguments select one of them. CPU reference
// only. Semantics and sources: docs/MOE.md, "cutlass_fused_moe: FP4 paths".
#pragma once

#include <optional>
#include <vector>

#include "flashinfer/bench.h"
#include "flashinfer/ops/moe.h"

namespace flashinfer::api {

/// Every argument of cutlass_fused_moe the FP4 paths read.
struct CutlassFp4Call {
  const Tensor& input;
  const Tensor& ids;
  const Tensor& scales;
  const Tensor& w1;
  const Tensor& w2;
  DType output_dtype;
  const std::vector<Tensor>& quant_scales;
  const std::optional<Tensor>& b1;
  const std::optional<Tensor>& b2;
  const std::optional<Tensor>& input_sf;
  const std::optional<Tensor>& swiglu_alpha;
  const std::optional<Tensor>& swiglu_beta;
  const std::optional<Tensor>& swiglu_limit;
  int64_t tp_size, tp_rank, ep_size, ep_rank, cluster_size, cluster_rank;
  const std::optional<Tensor>& output;
  bool enable_alltoall, min_latency_mode, swizzled_input_sf;
  ActivationType activation_type;
  const CutlassFusedMoeOptions& options;
};

/// Whether the dtypes and flags select one of the FP4 paths, as upstream's runner picks them:
/// int64 weights (16 e2m1 per element) with a non-fp8 input (NVFP4) or with an fp8 input and
/// use_mxfp8_act_scaling (MXFP8 x MXFP4); uint8 weights with use_w4_group_scaling and not
/// use_packed_weights (W4A16 MXFP4). The other quantized combinations are not taken.
bool is_cutlass_moe_fp4_call(const Tensor& input, const Tensor& fc1_expert_weights,
                             bool use_deepseek_fp8_block_scale, bool use_w4_group_scaling,
                             bool use_mxfp8_act_scaling, bool use_packed_weights,
                             bool use_wfp4afp8_humming);

/// Checks the call (errors name the argument) and runs the CPU reference. Returns upstream's
/// four outputs (the three scratch ones zero).
std::vector<Tensor> cutlass_fused_moe_fp4(const CutlassFp4Call& c);
/// The same, with cutlass_fused_moe's arguments in its order.
std::vector<Tensor> cutlass_fused_moe_fp4(
    const Tensor& input, const Tensor& ids, const Tensor& scales, const Tensor& w1,
    const Tensor& w2, DType output_dtype, const std::vector<Tensor>& quant_scales,
    const std::optional<Tensor>& b1, const std::optional<Tensor>& b2,
    const std::optional<Tensor>& input_sf, const std::optional<Tensor>& swiglu_alpha,
    const std::optional<Tensor>& swiglu_beta, const std::optional<Tensor>& swiglu_limit,
    int64_t tp_size, int64_t tp_rank, int64_t ep_size, int64_t ep_rank, int64_t cluster_size,
    int64_t cluster_rank, const std::optional<Tensor>& output, bool enable_alltoall,
    bool min_latency_mode, bool swizzled_input_sf, ActivationType activation_type,
    const CutlassFusedMoeOptions& options);

/// The `flashinfer bench --routine cutlass_fused_moe --input_dtype uint8` case: NVFP4 as the
/// engines call it (input quantized before the call, packed uint8 [m, hidden_size / 2] with
/// 128x4 input_sf; 8 experts, top-2, Swiglu, inter n; output bf16 or out_dtype).
BenchCase bench_cutlass_fused_moe_fp4(const BenchShape& s, Device dev);

}  // namespace flashinfer::api
