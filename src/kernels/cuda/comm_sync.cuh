// Private: the flag protocol the collectives' CUDA kernels share (comm_cuda.cu,
// moe_a2a_cuda.cu): system-scope release stores and acquire loads, and a bounded wait.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/cuda_utils.cuh"

namespace flashinfer::kernels::cuda {

// Loads `kernels` into the current context now. Under lazy loading (CUDA_MODULE_LOADING=LAZY,
// the default since CUDA 12.2) a kernel is loaded at its first launch, and loading may
// synchronize the context: a rank loading a kernel while a peer's kernel spins for this rank's
// would deadlock. The collectives' preload functions run before core/comm_abort.h's
// gated_collective_launch enqueues any waiting kernel; cudaFuncGetAttributes needs the loaded
// function, so it loads it.
inline void preload_kernels(const char* op, std::initializer_list<const void*> kernels) {
  for (const void* k : kernels) {
    cudaFuncAttributes a{};
    FLASHINFER_CUDA_CALL(op, cudaFuncGetAttributes(&a, k));
  }
}

// One element a peer wrote, read around the L1 (another device or process wrote it since this SM
// last looked: the memory is reused call after call).
template <class T>
__device__ __forceinline__ float load_peer(const T* p);
template <>
__device__ __forceinline__ float load_peer<float>(const float* p) {
  return __ldcg(p);
}
template <>
__device__ __forceinline__ float load_peer<__half>(const __half* p) {
  return __half2float(__ushort_as_half(__ldcg(reinterpret_cast<const unsigned short*>(p))));
}
template <>
__device__ __forceinline__ float load_peer<__nv_bfloat16>(const __nv_bfloat16* p) {
  return __bfloat162float(__ushort_as_bfloat16(__ldcg(reinterpret_cast<const unsigned short*>(p))));
}
template <>
__device__ __forceinline__ float load_peer<__nv_fp8_e4m3>(const __nv_fp8_e4m3* p) {
  __nv_fp8_e4m3 v;
  v.__x = static_cast<__nv_fp8_storage_t>(__ldcg(reinterpret_cast<const unsigned char*>(p)));
  return static_cast<float>(v);
}

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Waits until *flag has reached call `seq` (a peer may be one call ahead). `abort` (mapped host
// memory, core/comm_abort.h; may be null) set means the ranks' group failed: the wait ends and
// the kernel finishes on whatever it holds (its results are not used), so one rank's failure
// does not trap the context the ranks share. A peer that never comes traps the kernel after
// 100 s (an error the launcher's caller sees; it ends the CUDA context), as upstream's kernels
// trap, instead of hanging the GPU.
__device__ __forceinline__ void wait_for_call(const uint32_t* flag, uint32_t seq,
                                              const uint32_t* abort) {
  const uint64_t start = global_ns();
  while (static_cast<int32_t>(load_acquire_sys(flag) - seq) < 0) {
    if (abort != nullptr && load_acquire_sys(abort) != 0) return;
    if (global_ns() - start > 100000000000ull) __trap();
  }
}

}  // namespace flashinfer::kernels::cuda
