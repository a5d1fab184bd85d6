// CUDA launchers for the GEMM ops (cuBLASLt, linked dynamically from the toolkit). Plain C++
// header. Launchers throw flashinfer::Error(kCuda) when a CUDA or cuBLASLt call fails and
// kUnsupported when cuBLASLt has no algorithm for the problem.
#pragma once

#include "kernels/gemm_params.h"

namespace flashinfer::kernels::cuda {

/// bf16 x bf16 or fp8 x fp8 (with device scale pointers) -> bf16/fp16 through cuBLASLt.
/// Needs out_stride_n == 1, a_stride_k == 1, b_stride_k == 1 and a contiguous bias.
void gemm(const GemmParams& p, void* stream, const char* op, bool pdl);

/// Dequantizes both FP4 operands to bf16 (exact) on the device, then a cuBLASLt bf16 GEMM with
/// alpha read from device memory (no host synchronization).
void mm_fp4(const Fp4GemmParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
