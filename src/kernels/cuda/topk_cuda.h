// CUDA launcher for the top-k ops. Plain C++ header: callable from the API layer, which never
// sees CUDA headers. Throws flashinfer::Error(kCuda) when a launch fails. The per-row arrays of
// TopKParams must point to device memory.
#pragma once

#include "kernels/topk_params.h"

namespace flashinfer::kernels::cuda {

/// Same selection and output order as kernels::cpu::top_k. With p.sorted, p.sort_scratch must
/// hold rows * k int64. Lookups outside the page table write -1 (not reported).
void top_k(const TopKParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
