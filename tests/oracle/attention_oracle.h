// Test oracle (plain C++ header): runs a plan's work items with the first-draft CUDA-core
// attention kernel (attention_cuda_core_oracle.cuh), in place of the library's kernels, through
// kernels::cuda::set_attention_kernel_override. Built only when CUDA is compiled.
#pragma once

#include "kernels/attention_params.h"

namespace flashinfer::testing {

/// An AttentionKernelOverride: the oracle kernel for every dtype and head-dim pair it takes (fp16
/// / bf16 q and o; K/V of q's dtype or fp8; head dims multiples of 16 up to 256).
void oracle_batch_attention(const kernels::AttentionParams& p, void* stream, bool enable_pdl);

/// Installs the oracle for its lifetime (restores the library's kernels when destroyed).
struct ScopedAttentionOracle {
  ScopedAttentionOracle();
  ~ScopedAttentionOracle();
  ScopedAttentionOracle(const ScopedAttentionOracle&) = delete;
  ScopedAttentionOracle& operator=(const ScopedAttentionOracle&) = delete;
};

/// An AttentionKernelOverride: the first-draft tensor-core prefill kernel (prefill_mma_kernel of
/// src/kernels/cuda/attention_prefill_kernel.cuh, which ran correctly on an H100) for fp16 / bf16
/// q, K/V and o of one dtype with equal head dims 64, 128 or 256; anything else goes to
/// oracle_batch_attention.
void oracle_prefill_mma(const kernels::AttentionParams& p, void* stream, bool enable_pdl);

/// Installs oracle_prefill_mma for its lifetime.
struct ScopedPrefillMmaOracle {
  ScopedPrefillMmaOracle();
  ~ScopedPrefillMmaOracle();
  ScopedPrefillMmaOracle(const ScopedPrefillMmaOracle&) = delete;
  ScopedPrefillMmaOracle& operator=(const ScopedPrefillMmaOracle&) = delete;
};

}  // namespace flashinfer::testing
