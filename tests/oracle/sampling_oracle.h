// Test oracle (plain C++ header): the first-draft CUDA sampling kernels, which ran correctly on an
// H100, for comparison with the library's kernels on the same parameters (per-row arguments and
// buffers on the device, as kernels::cuda::sample / filter / softmax take them). Built only when
// CUDA is compiled. Asynchronous on `stream`.
#pragma once

#include "kernels/sampling_params.h"

namespace flashinfer::testing {

void oracle_sample(const kernels::SamplingParams& p, void* stream);
void oracle_filter(const kernels::FilterParams& p, void* stream);
void oracle_softmax(const kernels::SoftmaxParams& p, void* stream);

}  // namespace flashinfer::testing
