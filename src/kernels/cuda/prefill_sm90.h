// The Hopper prefill kernel (prefill_sm90_kernel.cuh, wgmma through CuTe) as a path of
// batch_prefill: built only when CMake finds CUTLASS's headers (FLASHINFER_WITH_CUTLASS=1), for
// sm_90a. Plain C++ header.
#pragma once

#include <cstdint>

#include "kernels/attention_params.h"

namespace flashinfer::kernels::cuda {

/// Runs `p` on `stream` (a cudaStream_t) on the Hopper kernel and returns true, or returns false,
/// having run nothing, when the call does not fit it (prefill::prefill_sm90_fits: an sm_90
/// device, the plan's 128-row blocks, head dim 64 or 128, 16-bit K/V of q's dtype, plain or
/// soft-capped (no custom mask, no ALiBi), a scale that folds into the exponent), when the
/// wrapper's backend is "fa2" (p.prefill_fa2_only), or when FLASHINFER_PREFILL_SM90=0 is set (read
/// at each call, to time or check it against the FA2 kernel on one GPU). The caller then runs the
/// FA2 kernel. kCuda Error when the launch fails.
bool prefill_sm90(const AttentionParams& p, void* stream, bool enable_pdl);

/// Calls prefill_sm90 has launched in this process (so that the tests can tell which kernel ran).
uint64_t prefill_sm90_launches();

}  // namespace flashinfer::kernels::cuda
