// CUDA launcher of per_token_group_quant_8bit (plain C++ header).
#pragma once

#include "kernels/quant8_params.h"

namespace flashinfer::kernels::cuda {

/// One warp per group; throws flashinfer::Error(kCuda) when the launch fails.
void per_token_group_quant_8bit(const GroupQuant8Params& p, void* stream);

}  // namespace flashinfer::kernels::cuda
