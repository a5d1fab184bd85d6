// CUDA launchers for the sampling ops. Plain C++ header: callable from the API layer, which never
// sees CUDA headers. Launchers throw flashinfer::Error(kCuda) when a launch fails. `rows` in the
// parameter structs must point to device memory.
#pragma once

#include <cstdint>

#include "kernels/sampling_params.h"

namespace flashinfer::kernels::cuda {

void sample(const SamplingParams& p, void* stream);
void filter(const FilterParams& p, void* stream);
void softmax(const SoftmaxParams& p, void* stream, bool enable_pdl);
/// Sets *flag (device int32) to 1 when any element is NaN, else 0. Asynchronous on `stream`.
void nan_flag(const void* data, DType dtype, int64_t rows, int64_t cols, int64_t stride_row,
              int64_t stride_col, int32_t* flag, void* stream);

/// Blocks until `stream` has finished its work.
void stream_synchronize(void* stream);

}  // namespace flashinfer::kernels::cuda
