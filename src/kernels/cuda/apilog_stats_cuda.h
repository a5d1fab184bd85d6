// CUDA side of the level-5 log statistics. Plain C++ header: the logger never sees CUDA
// headers. Functions throw flashinfer::Error(kCuda) when a CUDA call fails.
#pragma once

#include "kernels/apilog_stats_params.h"

namespace flashinfer::kernels::cuda {

/// Reduces the tensor on `device`, on `stream` (so it sees every earlier write on that stream),
/// copies back one TensorStats and waits for the stream. Floating and integer dtypes only.
TensorStats tensor_stats(const TensorStatsParams& p, int device, void* stream);

}  // namespace flashinfer::kernels::cuda
