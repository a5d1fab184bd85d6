// The CUDA stream ops launch on, as an opaque handle (public headers stay free of CUDA headers).
#pragma once

namespace flashinfer {

/// The calling thread's current stream (a cudaStream_t); nullptr is the legacy default stream.
void* current_cuda_stream();
/// Sets the calling thread's current stream; ops on CUDA tensors launch on it.
///
/// CUDA tensors belong to the stream current when they were made, as in PyTorch: the memory of a
/// dead tensor is cached and reused at once by later allocations on that stream (stream order
/// keeps it safe), on other streams only after the work queued before its death has finished.
/// So a tensor used on another stream must stay alive until that work is done (or the caller
/// synchronizes), and a stream must not be destroyed while tensors made on it are alive.
/// Tensors made while a stream is captured into a CUDA graph bypass the cache: the graph may
/// address their memory on every replay, so it is never freed nor handed to another tensor while
/// the graph may live: until the end of the CudaGraphMemoryScope the capture ran in, or, without
/// one, for good (as a torch.cuda.CUDAGraph owns its private pool).
/// FLASHINFER_CUDA_CACHING_ALLOCATOR=0 turns the cache off (every tensor a cudaMalloc / cudaFree).
void set_current_cuda_stream(void* stream);

/// Frees the cached memory of dead CUDA tensors on `device_index` (torch.cuda.empty_cache).
void cuda_empty_cache(int device_index = 0);

/// Scopes the memory of the tensors the library makes on `device_index` while CUDA graphs are
/// captured: kept while any scope on the device lives, freed (after a device synchronization)
/// when the last one ends. Destroy the graphs captured under it before it ends. Without a scope,
/// that memory stays for the life of the process. Scopes nest; a scope does nothing without
/// the CUDA backend or with FLASHINFER_CUDA_CACHING_ALLOCATOR=0 (active() is then false).
class CudaGraphMemoryScope {
 public:
  explicit CudaGraphMemoryScope(int device_index = 0);
  ~CudaGraphMemoryScope();
  CudaGraphMemoryScope(const CudaGraphMemoryScope&) = delete;
  CudaGraphMemoryScope& operator=(const CudaGraphMemoryScope&) = delete;
  /// Whether the scope holds the device's allocator.
  bool active() const { return active_; }

 private:
  int device_;
  bool active_;
};

}  // namespace flashinfer
