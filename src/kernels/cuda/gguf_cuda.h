// CUDA launcher of mm_gguf (GEMM on GGUF Q4_1 / Q8_0 weight rows). Plain C++ header: callable
// from the API layer, which never sees CUDA headers. Throws flashinfer::Error(kCuda) when a
// launch fails.
#pragma once

#include "kernels/gguf_mm_params.h"

namespace flashinfer::kernels::cuda {

/// out = a @ dequant(b)^T with fp32 accumulation, on `stream` (a cudaStream_t). Reads the blocks
/// byte-wise, so no alignment is required of b's rows (any byte stride).
void gguf_mm(const GgufMmParams& p, void* stream);

}  // namespace flashinfer::kernels::cuda
