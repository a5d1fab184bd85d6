// Device library: asynchronous global -> shared copies (cp.async, sm_80+), 16 bytes at a time,
// bypassing L1 (.cg): K/V tiles are read once per block, so caching them in L1 only evicts
// what is reused. Copies are grouped with commit() and waited for with wait<N>() (at most N
// groups still in flight), which is what lets a kernel compute on one stage while the next
// lands. Below sm_80 the copy is a plain load and store, so the same kernel still compiles.
// Device code only; NVRTC compiles it too.
#pragma once

#include "kernels/cuda/device_utils.cuh"

namespace flashinfer::kernels::cuda::dev::cp_async {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// Copies 16 bytes from global `src` to shared `dst` (both 16-byte aligned) when `valid`;
/// otherwise fills `dst` with zeros and reads nothing (src-size 0), so a tile's tail past the
/// last key holds zeros rather than stale data. `dst` as a 32-bit shared-state-space address
/// (smem_addr): for a copy loop that derives each row's address from one base by constant
/// offsets. sm_80+ only.
__device__ __forceinline__ void copy16_zfill(uint32_t dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size)
               : "memory");
#else
  (void)dst;
  (void)src;
  (void)valid;
  __trap();
#endif
}

/// The same with `dst` a generic pointer; below sm_80 a plain load and store.
__device__ __forceinline__ void copy16_zfill(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  copy16_zfill(smem_addr(dst), src, valid);
#else
  *static_cast<uint4*>(dst) = valid ? *static_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
#endif
}

/// As copy16_zfill for 4 bytes (both 4-byte aligned): cp.async.ca (.cg takes 16 bytes only), for
/// per-token scalars that travel with a tile (the chunked GDN prefill's gates). sm_80+ only.
__device__ __forceinline__ void copy4_zfill(uint32_t dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
#else
  (void)dst;
  (void)src;
  (void)valid;
  __trap();
#endif
}

/// Closes the group of copies issued since the last commit.
__device__ __forceinline__ void commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/// Waits until at most `kPending` committed groups of this thread are still in flight. The
/// copies are visible to other threads only after a barrier (__syncthreads) that follows.
template <int kPending>
__device__ __forceinline__ void wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

}  // namespace flashinfer::kernels::cuda::dev::cp_async
