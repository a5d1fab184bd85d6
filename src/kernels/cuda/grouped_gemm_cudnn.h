// The cuDNN backend of grouped_mm_bf16 (kernels/cuda/grouped_gemm_cudnn.cpp, compiled only when
// the build found the cuDNN frontend headers and cudnn.h: FLASHINFER_WITH_CUDNN=1): upstream's
// MoE grouped matmul graph (kernels/cudnn_grouped_plan.h). Plain C++ header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/grouped_gemm_params.h"

namespace flashinfer::kernels::cuda {

/// Runs `p` through cuDNN's MoE grouped matmul graph on `stream` (a cudaStream_t) on the current
/// device: bf16 x bf16 -> bf16, fp32 accumulation, one rounding; m_indptr read on the device.
/// False, having run nothing, when it does not fit: the call's layout or dtypes
/// (dnn::moe_misfit), libcudnn cannot be opened or is older than the node
/// (cudnn_grouped_unavailable), the stream is being captured before its cuDNN
/// handle exists, or cuDNN has no execution plan (remembered per graph). The caller then runs
/// the grouped kernel. kCuda Error naming `op` when a CUDA or cuDNN call fails.
bool cudnn_grouped_mm(const GroupedMmCudaParams& p, void* stream, const char* op);

/// libcudnn 9.15.0 is the first with the MoE grouped matmul operation (the frontend refuses the
/// node below it at build time).
inline constexpr std::size_t kCudnnMoeMinVersion = 91500;

/// Why this process cannot run the MoE grouped matmul graph (libcudnn cannot be opened, or it
/// is older than kCudnnMoeMinVersion); empty when it can. `flashinfer info` prints it.
std::string cudnn_grouped_unavailable();

/// Describes the graph of `p` for a GPU of `sm_version` (90: sm_90) and validates it in the
/// cuDNN frontend against the opened library (no device needed, nothing lowered to cuDNN): the
/// frontend's message, empty when valid, or why libcudnn cannot be opened. For the tests.
std::string cudnn_validate_grouped_mm(const GroupedMmCudaParams& p, int sm_version);

/// The grouped graphs' counters since the process started: calls run on cuDNN, graphs built (or
/// found to have no plan), calls that found their graph cached, and device allocations of the
/// per-stream workspaces.
struct CudnnGroupedStats {
  uint64_t runs = 0, graph_builds = 0, graph_hits = 0, device_allocs = 0, device_bytes = 0;
};
CudnnGroupedStats cudnn_grouped_stats();

}  // namespace flashinfer::kernels::cuda
