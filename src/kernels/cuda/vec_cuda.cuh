// Private: 16-byte vector loads and stores for the row-wise CUDA kernels (norms, activations).
// A row takes the vector path only when its base address and length allow whole, aligned
// 16-byte accesses; the launchers check that on the host.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_utils.cuh"

namespace flashinfer::kernels::cuda {

/// Elements of T per 16-byte access.
template <class T>
inline constexpr int kVecElems = 16 / static_cast<int>(sizeof(T));

template <class T>
struct alignas(16) Vec16 {
  T v[kVecElems<T>];
};

template <class T>
__device__ __forceinline__ void load_vec(const T* p, float* out) {
  const Vec16<T> x = *reinterpret_cast<const Vec16<T>*>(p);
#pragma unroll
  for (int j = 0; j < kVecElems<T>; ++j) out[j] = to_f32(x.v[j]);
}

template <class T>
__device__ __forceinline__ void store_vec(T* p, const float* in) {
  Vec16<T> x;
#pragma unroll
  for (int j = 0; j < kVecElems<T>; ++j) x.v[j] = from_f32<T>(in[j]);
  *reinterpret_cast<Vec16<T>*>(p) = x;
}

/// store_vec to global memory as one st.global.v4 (a plain weak store, its width pinned): for
/// rmsnorm's output row nvcc 13 split the 16-byte store into four 32-bit ones (STG.E), though
/// the address carries 16-byte alignment. `p` must point to global memory.
template <class T>
__device__ __forceinline__ void store_vec_global(T* p, const float* in) {
  Vec16<T> x;
#pragma unroll
  for (int j = 0; j < kVecElems<T>; ++j) x.v[j] = from_f32<T>(in[j]);
  uint4 u;
  memcpy(&u, &x, sizeof(u));
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(u.x), "r"(u.y), "r"(u.z),
               "r"(u.w)
               : "memory");
}

/// True when `ptr` and every row start `ptr + r * row_stride` (elements of `elem` bytes) are
/// 16-byte aligned.
inline bool aligned16(const void* ptr, int64_t row_stride, std::size_t elem) {
  return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0 &&
         (static_cast<std::size_t>(row_stride) * elem) % 16 == 0;
}

/// Threads per block for a row of `n` work items: a power of two in [32, 1024].
inline int threads_for(int64_t n) {
  int t = 32;
  while (t < 1024 && t < n) t *= 2;
  return t;
}

/// Blocks for a grid-stride kernel over `blocks_needed` blocks' worth of work: at most as many as
/// the current device keeps resident at once (SM count x resident blocks of `kernel` per SM), so
/// every thread walks several items and each SM holds enough 16-byte loads in flight.
template <class... KArgs>
unsigned resident_grid(const char* op, void (*kernel)(KArgs...), int threads,
                       int64_t blocks_needed) {
  int dev = 0, sms = 0, per_sm = 0;
  FLASHINFER_CUDA_CALL(op, cudaGetDevice(&dev));
  FLASHINFER_CUDA_CALL(op, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  FLASHINFER_CUDA_CALL(op,
                       cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  const int64_t cap = static_cast<int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
  return static_cast<unsigned>(blocks_needed < cap ? blocks_needed : cap);
}

}  // namespace flashinfer::kernels::cuda
