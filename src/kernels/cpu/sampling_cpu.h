// CPU reference kernels for the sampling ops: fp32 math, multithreaded over rows. They run the
// same algorithms with the same Philox draws as the CUDA kernels (see sampling_cuda.cu).
#pragma once

#include "kernels/sampling_params.h"

namespace flashinfer::kernels::cpu {

void sample(const SamplingParams& p);
void filter(const FilterParams& p);
void softmax(const SoftmaxParams& p);
/// top_k_top_p_sampling_from_logits with filter_apply_order "top_k_first", fused: the samples
/// (and Philox draws) of filter(kTopKMask) -> softmax -> sample(kTopP) without materializing
/// either intermediate row. Per row: the k-th largest key by a radix select, the softmax over the
/// kept logits only (every other probability is exactly 0 and never counted by the rejection
/// sampler), then the same dual-pivot rejection over the kept probabilities in index order. p.kind
/// is ignored; rows carry top_k, top_p, temperature, seed and offset.
void sample_top_k_first_from_logits(const SamplingParams& p);
/// True when any of the rows x cols elements is NaN.
bool has_nan(const void* data, DType dtype, int64_t rows, int64_t cols, int64_t stride_row,
             int64_t stride_col);

}  // namespace flashinfer::kernels::cpu
