// Device library: N contiguous elements moved with the widest accesses their size allows (128-bit
// when N elements fill whole 16-byte units), and widened to fp32 at the point of use. The
// attention kernels keep K/V in their storage dtype in shared memory and convert here, right
// before the FMA, so a bf16 tile costs half the shared memory and bandwidth of an fp32 one.
// Device code only; NVRTC compiles it too (src/kernels/cuda/jit_sources.cmake).
#pragma once

#include "kernels/cuda/device_utils.cuh"

namespace flashinfer::kernels::cuda::dev {

/// Largest power-of-two access (bytes, at most 16) that divides `bytes`.
constexpr int access_bytes(int bytes) {
  return bytes % 16 == 0 ? 16 : bytes % 8 == 0 ? 8 : bytes % 4 == 0 ? 4 : bytes % 2 == 0 ? 2 : 1;
}

template <int kBytes>
struct AccessType;
template <>
struct AccessType<16> {
  using type = uint4;
};
template <>
struct AccessType<8> {
  using type = uint2;
};
template <>
struct AccessType<4> {
  using type = uint32_t;
};
template <>
struct AccessType<2> {
  using type = uint16_t;
};
template <>
struct AccessType<1> {
  using type = uint8_t;
};

/// N elements of T in registers, aligned for the widest access of their size.
template <class T, int N>
struct alignas(access_bytes(N * sizeof(T))) Vec {
  static constexpr int kBytes = N * static_cast<int>(sizeof(T));
  static constexpr int kAccess = access_bytes(kBytes);
  using Access = typename AccessType<kAccess>::type;
  static constexpr int kAccesses = kBytes / kAccess;
  T v[N];

  /// Loads from `src`, which must be aligned to kAccess bytes (global or shared memory).
  __device__ __forceinline__ void load(const T* src) {
    const Access* s = reinterpret_cast<const Access*>(src);
    Access* d = reinterpret_cast<Access*>(v);
#pragma unroll
    for (int i = 0; i < kAccesses; ++i) d[i] = s[i];
  }
  __device__ __forceinline__ void store(T* dst) const {
    Access* d = reinterpret_cast<Access*>(dst);
    const Access* s = reinterpret_cast<const Access*>(v);
#pragma unroll
    for (int i = 0; i < kAccesses; ++i) d[i] = s[i];
  }
};

// Widening of N stored elements to fp32. fp8 goes through paired half conversions
// (cvt.rn.f16x2.e4m3x2 / e5m2x2 on sm_89+), two elements an instruction; every fp8 value is a
// half, so the result is exact.
template <int N>
__device__ __forceinline__ void widen(const __half* x, float* out) {
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = __half2float(x[i]);
}
// bf16 is the top half of an fp32: a pair in one 32-bit word widens with a shift and a mask
// (one instruction an element). x must be 4-byte aligned when N is even.
template <int N>
__device__ __forceinline__ void widen(const __nv_bfloat16* x, float* out) {
  if constexpr (N % 2 == 0) {
    const auto* w = reinterpret_cast<const uint32_t*>(x);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = __bfloat162float(x[i]);
  }
}
template <int N>
__device__ __forceinline__ void widen(const float* x, float* out) {
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = x[i];
}
template <int N, __nv_fp8_interpretation_t kKind, class T>
__device__ __forceinline__ void widen_fp8(const T* x, float* out) {
  if constexpr (N % 4 == 0) {
    // x 4-byte aligned (as a Vec of N fp8 is): each pair is one half of a 32-bit word, element
    // 2k in its low byte; one shift a word, where pairs assembled from bytes cost four.
    const auto* w = reinterpret_cast<const uint32_t*>(x);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const auto pair =
          static_cast<__nv_fp8x2_storage_t>(i % 2 == 0 ? w[i / 2] & 0xffffu : w[i / 2] >> 16);
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, kKind);
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
    return;
  }
  const auto* raw = reinterpret_cast<const __nv_fp8_storage_t*>(x);
#pragma unroll
  for (int i = 0; i + 1 < N; i += 2) {
    const __nv_fp8x2_storage_t pair =
        static_cast<__nv_fp8x2_storage_t>(raw[i] | (static_cast<unsigned>(raw[i + 1]) << 8));
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, kKind);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    out[i] = f.x;
    out[i + 1] = f.y;
  }
  if constexpr (N % 2 == 1) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(raw[N - 1], kKind);
    out[N - 1] = __half2float(__half(h));
  }
}
template <int N>
__device__ __forceinline__ void widen(const __nv_fp8_e4m3* x, float* out) {
  widen_fp8<N, __NV_E4M3>(x, out);
}
template <int N>
__device__ __forceinline__ void widen(const __nv_fp8_e5m2* x, float* out) {
  widen_fp8<N, __NV_E5M2>(x, out);
}

/// Loads N elements of T at `src` (aligned as Vec<T, N> requires) as fp32.
template <class T, int N>
__device__ __forceinline__ void load_f32(const T* src, float* out) {
  Vec<T, N> x;
  x.load(src);
  widen<N>(x.v, out);
}

/// Rounds N fp32 values to T (nearest-even) and stores them at `dst` (aligned as Vec<T, N>).
template <class T, int N>
__device__ __forceinline__ void store_from_f32(T* dst, const float* in) {
  Vec<T, N> x;
#pragma unroll
  for (int i = 0; i < N; ++i) x.v[i] = from_f32<T>(in[i]);
  x.store(dst);
}

}  // namespace flashinfer::kernels::cuda::dev
