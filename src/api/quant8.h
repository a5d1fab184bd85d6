// Private: per_token_group_quant_8bit's kernels, for the ops that quantize with them
// (fp8_blockscale_gemm_sm90's BF16 input under TRT-LLM's 1x128 rule).
#pragma once

#include "flashinfer/device.h"
#include "kernels/quant8_params.h"

namespace flashinfer::api {

/// Runs `p` on `device`'s backend of per_token_group_quant_8bit (the CPU reference or the CUDA
/// kernels); errors name `op` and `arg`.
void launch_group_quant_8bit(const kernels::GroupQuant8Params& p, Device device, const char* op,
                             const char* arg);

}  // namespace flashinfer::api
