// CPU reduction for the level-5 log statistics: reads the tensor in place (any strides).
#pragma once

#include "kernels/apilog_stats_params.h"

namespace flashinfer::kernels::cpu {

/// Floating and integer dtypes only (the caller skips bool and fp4).
TensorStats tensor_stats(const TensorStatsParams& p);

}  // namespace flashinfer::kernels::cpu
