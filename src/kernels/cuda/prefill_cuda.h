// CUDA launcher of the tensor-core (mma.sync, sm80+) prefill attention kernel (plain C++
// header). It serves fp16/bf16 q, KV and output of one dtype with head_dim_qk == head_dim_vo, a
// multiple of 16 up to 256 (64/128/256 built ahead of time, others JIT-compiled);
// batch_attention falls back to the CUDA-core kernel otherwise.
#pragma once

#include "kernels/attention_params.h"

namespace flashinfer::kernels::cuda {

bool prefill_supported(const AttentionParams& p);
void batch_prefill(const AttentionParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
