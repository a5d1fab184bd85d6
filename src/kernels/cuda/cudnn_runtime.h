// What the cuDNN backends (gemm_cudnn.cpp, attention_cudnn.cpp, grouped_gemm_cudnn.cpp) share: the
// cuDNN frontend in its dynamic-loading mode, the library opened once on first use, and one cuDNN
// handle per (device, stream, backend). Defined in gemm_cudnn.cpp. Only the sources compiled with
// the frontend's include path (FLASHINFER_WITH_CUDNN builds) include this header.
//
// Every cuDNN call goes through a symbol looked up in `cudnn_frontend::cudnn_dlhandle`, which is
// the library opened by cudnn_open() (as gemm_cuda.cu opens cuBLASLt), so a process that runs no
// cuDNN graph never maps libcudnn. Both macros must be the same in every source that includes
// the frontend: they change its classes.
#pragma once

#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING 1
#define CUDNN_FRONTEND_SKIP_JSON_LIB 1  // serialization unused; keeps its nlohmann copy out

#include <cuda_runtime_api.h>
#include <cudnn_frontend.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "flashinfer/error.h"

namespace flashinfer::kernels::cuda::dnn_rt {

/// The library: `error` empty when it opened and is of the headers' major version.
struct CudnnLib {
  std::string error;
  std::string version;     // "9.19.0"
  std::size_t number = 0;  // cudnnGetVersion(): major * 10000 + minor * 100 + patch
};
/// Opens libcudnn on the first call (thread-safe, once; never closed).
const CudnnLib& cudnn_open();

/// Throws Error (kCuda) naming `op` when `err` is not cudaSuccess.
void cuda_check(const char* op, cudaError_t err, const char* what);

/// Whether `stream` is being captured into a CUDA graph.
bool capturing(const char* op, cudaStream_t stream);

/// The backends that keep a handle per stream (each its own: a handle's variant pack and lock
/// are the backend's).
enum class Backend : int { kGemm = 0, kAttention = 1, kGroupedGemm = 2 };

/// One stream's cuDNN state for one backend, keyed by (device, stream id, backend) as
/// kernels/cuda/stream_scratch.h keys streams. A handle carries its stream, and cuDNN forbids
/// using one handle from two threads at once: `mu` is held from the graph lookup to the launch.
/// The variant pack holds every uid the backend's graphs may use, so filling it never allocates.
struct StreamState {
  std::mutex mu;
  cudnnHandle_t handle = nullptr;  // bound to the device and stream it was created for
  std::unordered_map<int64_t, void*> pack;
};

/// The state of `stream` on `device` for `backend`, created on first use with `uids` in its
/// pack (an Error naming `op` when that first use is during a stream capture).
StreamState& stream_state(const char* op, int device, cudaStream_t stream, Backend backend,
                          std::initializer_list<int64_t> uids);

/// Runs `f`, turning the frontend's std::runtime_error (a missing symbol or CUDA runtime) into
/// Error naming the op and its backend argument.
template <class F>
void frontend_call(const char* op, F&& f) {
  try {
    f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    FLASHINFER_FAIL(ErrorCode::kCuda, op, "backend", "cuDNN frontend: ", e.what());
  }
}

/// Built graphs by key, never evicted (one per problem a process runs): find_or_build returns
/// the entry of `key`, counting a hit in `hits`, or builds it with `build()` outside the lock (a
/// build takes a while; a racing builder's graph is dropped).
template <class Key, class Hash, class Graph>
class GraphCache {
 public:
  template <class Build>
  const Graph& find_or_build(const Key& key, std::atomic<uint64_t>& hits, Build&& build) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = map_.find(key); it != map_.end()) {
        hits.fetch_add(1, std::memory_order_relaxed);
        return *it->second;
      }
    }
    std::unique_ptr<Graph> graph = build();
    std::lock_guard<std::mutex> lock(mu_);
    return *map_.emplace(key, std::move(graph)).first->second;
  }

 private:
  std::mutex mu_;
  std::unordered_map<Key, std::unique_ptr<Graph>, Hash> map_;
};

}  // namespace flashinfer::kernels::cuda::dnn_rt
