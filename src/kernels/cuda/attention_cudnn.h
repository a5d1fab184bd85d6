// The cuDNN backend of cudnn_batch_prefill_with_kv_cache and cudnn_batch_decode_with_kv_cache
// (kernels/cuda/attention_cudnn.cpp, compiled only when the build found the cuDNN frontend
// headers and cudnn.h: FLASHINFER_WITH_CUDNN=1), and the one kernel it needs of its own
// (attention_cudnn_lse.cu, compiled with every CUDA build). Plain C++ header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cudnn_attention_plan.h"

namespace flashinfer::kernels::cuda {

/// One call of the cuDNN SDPA graph: the problem (kernels/cudnn_attention_plan.h), the device
/// tensors, and the host index data the graph reads (copied to the device ahead of cuDNN's
/// workspace).
struct CudnnSdpaCall {
  dnn::SdpaProblem problem;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;                             // problem.stats only
  const std::vector<int32_t>* lens_q = nullptr;     // [batch]
  const std::vector<int32_t>* lens_kv = nullptr;    // [batch]
  const std::vector<int32_t>* qo_indptr = nullptr;  // [batch + 1] (ragged only)
  const int32_t* table = nullptr;  // host copy of the block table, row-major [batch, table_cols]
  int64_t table_cols = 0;
  // The caller's workspace_buffer on the device (upstream hands it to cuDNN as its workspace);
  // too small, or null: the stream's own attention workspace.
  void* workspace = nullptr;
  uint64_t workspace_bytes = 0;
};

/// Runs `c` on `stream` (a cudaStream_t) on the current device: the index arrays copied ahead of
/// cuDNN's workspace, the cached graph executed, the statistics converted to base 2. False,
/// having run nothing, when it does not fit: libcudnn cannot be opened, the stream is being
/// captured, an offset overflows int32, or cuDNN has no execution plan (remembered per graph).
/// The caller then runs another backend. kCuda Error when a CUDA or cuDNN call fails.
bool cudnn_sdpa(const CudnnSdpaCall& c, void* stream, const char* op);

/// Describes the graph of `p` for a GPU of `sm_version` (90: sm_90) with `impl` (the frontend's
/// choice, or the composite implementation the backend retries with) and validates it in the
/// cuDNN frontend against the opened library (shapes, strides, dtypes, the SDPA support surface;
/// no device needed, nothing lowered to cuDNN): the frontend's message, empty when valid, or why
/// libcudnn cannot be opened. For the tests.
std::string cudnn_validate_sdpa(const dnn::SdpaProblem& p, int sm_version,
                                dnn::SdpaImplementation impl = dnn::SdpaImplementation::kAuto);

/// The attention graphs' counters since the process started: calls run on cuDNN, graphs built
/// (or found to have no plan), calls that found their graph cached, and device allocations of
/// the per-stream workspaces. A steady state of one shape on one stream adds only runs and
/// graph_hits. composite_graphs: the graphs built with the composite implementation after the
/// frontend's choice failed to build.
struct CudnnAttentionStats {
  uint64_t runs = 0, graph_builds = 0, graph_hits = 0, device_allocs = 0, device_bytes = 0;
  uint64_t composite_graphs = 0;
};
CudnnAttentionStats cudnn_attention_stats();

/// lse[n * stride_n + h * stride_h] *= log2(e) for n < rows, h < heads, on `stream`: cuDNN's
/// natural-log statistics to this library's base-2 log-sum-exp. kCuda Error naming `op` when
/// the launch fails.
void lse_natural_to_log2(float* lse, int64_t rows, int64_t heads, int64_t stride_n,
                         int64_t stride_h, void* stream, const char* op);

}  // namespace flashinfer::kernels::cuda
