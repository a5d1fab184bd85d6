// CUDA launcher of prepare_bf16_fp4_weights's cudnn layout (upstream's _prepare_cudnn: torch
// indexing, any GPU). Plain C++ header: callable from the API layer. Throws flashinfer::Error
// (kCuda) when a launch fails.
#pragma once

#include "kernels/gemm_bf16_fp4_params.h"

namespace flashinfer::kernels::cuda {

/// kernels::cpu::bf16_fp4_prepare for Bf16Fp4Layout::kCudnn with one thread per scale byte of
/// the [n, k / 16] result, through the CPU's index (bf16_fp4_cudnn_sf_source): bit-exact. The
/// cute-dsl layout raises kUnsupported (the API layer refuses it before, as upstream does on
/// this GPU or for this build).
void bf16_fp4_prepare(const Bf16Fp4PrepareParams& p, void* stream);

}  // namespace flashinfer::kernels::cuda
