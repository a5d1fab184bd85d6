// The cuDNN backend of the GEMM ops (kernels/cuda/gemm_cudnn.cpp, compiled only when the build
// found the cuDNN frontend headers and cudnn.h: FLASHINFER_WITH_CUDNN=1). Plain C++ header.
// libcudnn is opened with dlopen on the first cuDNN GEMM, not linked: a process that runs none
// pays nothing for it at start-up.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/gemm_params.h"

namespace flashinfer::kernels::cuda {

/// The cuDNN path's counters since the process started: graphs built (validated, lowered, an
/// execution plan chosen by the heuristics and built), calls that found their graph cached, and
/// device allocations made (per-stream workspaces). A steady state of one shape on one stream
/// adds only graph_hits.
struct CudnnStats {
  uint64_t graph_builds = 0, graph_hits = 0, device_allocs = 0, device_bytes = 0;
};
CudnnStats cudnn_stats();

/// Opens libcudnn if no cuDNN GEMM has yet (no GPU needed) and says why it cannot be used: empty
/// when the library opened and is of the major version the build's headers are.
std::string cudnn_load_error();

/// Describes the graph `p` would run and validates it in the cuDNN frontend (shapes, strides,
/// dtypes and the inferred intermediate tensors; no device needed, nothing lowered to cuDNN):
/// the frontend's message, empty when valid, or why libcudnn cannot be opened. For the tests.
std::string cudnn_validate_graph(const GemmParams& p);

/// The opened library's version ("9.19.0"), or "" when it cannot be opened.
std::string cudnn_library_version();

/// out = A @ B through a cached cuDNN graph: bf16 x bf16 (+ a contiguous bf16 bias) -> bf16 or
/// fp16, or fp8 x fp8 times the two device fp32 scales -> bf16 or fp16; fp32 accumulation and
/// one rounding to out's dtype. Needs a_stride_k == 1, b_stride_k == 1 and out_stride_n == 1.
/// When cuDNN has no execution plan for the problem: returns false having run nothing if
/// `decline_unsupported` (the caller runs another backend), else throws flashinfer::Error
/// (kUnsupported) naming `op` and "backend"; the same when libcudnn cannot be opened. kCuda when
/// a CUDA or cuDNN call fails. True: it ran.
bool cudnn_gemm(const GemmParams& p, void* stream, const char* op, bool decline_unsupported);

}  // namespace flashinfer::kernels::cuda
