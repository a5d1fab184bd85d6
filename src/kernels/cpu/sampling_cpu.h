// CPU reference kernels for the sampling ops: fp32 math, multithreaded over rows. They run the
// same algorithms with the same Philox draws as the CUDA kernels (see sampling_cuda.cu).
#pragma once

#include "kernels/sampling_params.h"

namespace flashinfer::kernels::cpu {

void sample(const SamplingParams& p);
void filter(const FilterParams& p);
void softmax(const SoftmaxParams& p);
/// True when any of the rows x cols elements is NaN.
bool has_nan(const void* data, DType dtype, int64_t rows, int64_t cols, int64_t stride_row,
             int64_t stride_col);

}  // namespace flashinfer::kernels::cpu
