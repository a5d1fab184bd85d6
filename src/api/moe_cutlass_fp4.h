// Private: cutlass_fused_moe's FP4 paths (NVFP4, MXFP8 activations x MXFP4 weights, W4A16
// MXFP4, Humming MXFP4 x FP8), reached from cutlass_fused_moe when the arguments select one of
// them. CPU reference only. Semantics and sources: docs/MOE.md, "cutlass_fused_moe: FP4 paths".
#pragma once

#include <optional>
#include <vector>

#include "api/moe_cutlass_call.h"
#include "flashinfer/bench.h"
#include "flashinfer/ops/moe.h"

namespace flashinfer::api {

/// Whether the dtypes and flags select one of the FP4 paths, as upstream's runner picks them:
/// int64 weights (16 e2m1 per element) with a non-fp8 input (NVFP4) or with an fp8 input and
/// use_mxfp8_act_scaling (MXFP8 x MXFP4); uint8 weights with use_w4_group_scaling and not
/// use_packed_weights (W4A16 MXFP4, or Humming MXFP4 x FP8 with use_wfp4afp8_humming); uint8
/// weights with use_packed_weights (packed int4: W4A8 with use_w4_group_scaling, else weight-only
/// INT4). The other quantized combinations are not taken.
bool is_cutlass_moe_fp4_call(const Tensor& input, const Tensor& fc1_expert_weights,
                             bool use_deepseek_fp8_block_scale, bool use_w4_group_scaling,
                             bool use_mxfp8_act_scaling, bool use_packed_weights,
                             bool use_wfp4afp8_humming);

/// Checks what the FP4 and mixed-input paths need (errors name the argument) and runs the CPU
/// reference or, for W4A16 MXFP4, Humming, W4A8 INT4 and weight-only INT4 on a GPU, the CUDA
/// kernels. Returns upstream's four outputs (the three scratch ones zero).
std::vector<Tensor> cutlass_fused_moe_fp4(const CutlassMoeCall& c);

/// The `flashinfer bench --routine cutlass_fused_moe --input_dtype uint8` case: NVFP4 as the
/// engines call it (input quantized before the call, packed uint8 [m, hidden_size / 2] with
/// 128x4 input_sf; 8 experts, top-2, Swiglu, inter n; output bf16 or out_dtype).
BenchCase bench_cutlass_fused_moe_fp4(const BenchShape& s, Device dev);

/// The `flashinfer bench --routine cutlass_fused_moe --use_w4_group_scaling` case: W4A16 MXFP4 as
/// vLLM and SGLang call it for gpt-oss on Hopper (input_dtype bf16 / fp16 input of m tokens x
/// hidden_size, 8 experts of inter n, top-2, Swiglu with gpt-oss's SwigluBias parameters; MXFP4
/// weights and ue8m0 scales prepared by upstream's SM90 interleave functions).
BenchCase bench_cutlass_fused_moe_w4a16(const BenchShape& s, Device dev);

}  // namespace flashinfer::api
