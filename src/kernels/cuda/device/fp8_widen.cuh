// Device library: fp8 (e4m3 / e5m2) values widened to the 16-bit type of a tensor-core operand
// (fp16 or bf16), four at a time. The FA2 prefill kernel copies fp8 K/V tiles into shared memory
// and widens them with this before its fp16 / bf16 ldmatrix + mma.sync path.
//
// Exact, for every code: each fp8 value is a value of both 16-bit types.
//   - e4m3 (bias 7, 3 mantissa bits): normals 2^-6 .. 448, subnormals m * 2^-9 (m = 1..7), NaN
//     at S.1111.111, no infinity. fp16 (bias 15, 10 mantissa bits) holds 2^-14 .. 65504 as
//     normals, so every e4m3 value, subnormals included, is an fp16 normal with its low 7
//     mantissa bits zero; bf16 (fp32's 8-bit exponent, 7 mantissa bits) likewise.
//   - e5m2 (bias 15, 2 mantissa bits, infinities and NaNs): bit for bit the top byte of an fp16,
//     subnormals (m * 2^-16) included; in bf16 every one of them is a normal (down to 2^-133) with
//     the low 5 mantissa bits zero, and 57344 is far below bf16's range.
// So the conversion to fp16 never rounds, nor does fp16 -> fp32 (exact for any fp16), and the
// fp32 of an fp8 value has its low 16 bits zero: its top half is the bf16, no rounding needed.
// NaN stays NaN, infinities stay infinite.
//
// Two ways to fp16: sm_89+ has cvt.rn.f16x2.e4m3x2 / e5m2x2 (one instruction a pair). Below it
// (and on the host) cuda_fp8.h's conversion is integer code with a loop over subnormals, ~10-15
// instructions an element, which would cost an A100 about as much as the tile's MMAs; there
// fp8_pair_to_half2_bits places the bits instead: e5m2 is an fp16's top byte (a shift), and e4m3's
// magnitude bits put at fp16 bits 13..7 read as the value times 2^-8 (exponent bias 7 against 15;
// a subnormal lands on an fp16 subnormal with the same mantissa), so one exact fp16 multiply by
// 2^8 finishes it, normalizing subnormals; only NaN (S.1111.111, which would read as 480) is
// patched.
//
// tests/core/test_cuda_device_lib.cpp checks every code against the CPU's fp8 decode on the
// host, which runs fp8_pair_to_half2_bits (the path sm_80..sm_89 builds run).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <vector_types.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/device/host_device.h"
#include "kernels/cuda/device/permuted_smem.cuh"

namespace flashinfer::kernels::cuda::dev {

/// Two fp8 values (element 0 in the low byte of `pair`) as an fp16 pair (element 0 in the low
/// half), exactly, without cuda_fp8.h's conversion (see above).
template <__nv_fp8_interpretation_t kKind>
FLASHINFER_HD __half2_raw fp8_pair_to_half2_bits(uint32_t pair) {
  const uint32_t b0 = pair & 0xffu, b1 = (pair >> 8) & 0xffu;
  __half2_raw r;
  if constexpr (kKind == __NV_E5M2) {
    r.x = static_cast<unsigned short>(b0 << 8);
    r.y = static_cast<unsigned short>(b1 << 8);
  } else {
    // sign to bit 15, magnitude to bits 13..7: the value times 2^-8.
    const auto place = [](uint32_t b) {
      return static_cast<unsigned short>(((b & 0x80u) << 8) | ((b & 0x7fu) << 7));
    };
    __half_raw lo, hi, scale;
    lo.x = place(b0);
    hi.x = place(b1);
    scale.x = 0x5c00;  // 2^8
#if defined(__CUDA_ARCH__)
    const __half2 v = __hmul2(__halves2half2(__half(lo), __half(hi)),
                              __halves2half2(__half(scale), __half(scale)));
    const __half2_raw vr = static_cast<__half2_raw>(v);
    r.x = vr.x;
    r.y = vr.y;
#else
    // fp16 -> fp32, the product and fp32 -> fp16 are all exact here.
    r.x = static_cast<__half_raw>(__float2half_rn(__half2float(__half(lo)) * 256.0f)).x;
    r.y = static_cast<__half_raw>(__float2half_rn(__half2float(__half(hi)) * 256.0f)).x;
#endif
    if ((b0 & 0x7fu) == 0x7fu) r.x = static_cast<unsigned short>(0x7e00u | ((b0 & 0x80u) << 8));
    if ((b1 & 0x7fu) == 0x7fu) r.y = static_cast<unsigned short>(0x7e00u | ((b1 & 0x80u) << 8));
  }
  return r;
}

/// Four fp8 values, the bytes of `x` (element 0 in the low byte), as four values of T (__half or
/// __nv_bfloat16): two 32-bit words, each a pair low element first (the layout of T[4]).
template <class T, __nv_fp8_interpretation_t kKind>
FLASHINFER_HD uint2 fp8x4_widen(uint32_t x) {
  uint32_t w[2];
  FLASHINFER_UNROLL
  for (int i = 0; i < 2; ++i) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    const auto pair = static_cast<__nv_fp8x2_storage_t>(x >> (16 * i));
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, kKind);
#else
    const __half2_raw h = fp8_pair_to_half2_bits<kKind>((x >> (16 * i)) & 0xffffu);
#endif
    if constexpr (std::is_same_v<T, __half>) {
      w[i] = static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
    } else {
      static_assert(std::is_same_v<T, __nv_bfloat16>, "fp16 or bf16");
      __half_raw lo, hi;
      lo.x = h.x;
      hi.x = h.y;
      uint32_t flo, fhi;  // fp32 bits; the low 16 of each are zero (see above)
      const float a = __half2float(__half(lo)), b = __half2float(__half(hi));
      static_assert(sizeof(float) == sizeof(uint32_t));
      __builtin_memcpy(&flo, &a, 4);
      __builtin_memcpy(&fhi, &b, 4);
      w[i] = (flo >> 16) | (fhi & 0xffff0000u);
    }
  }
  uint2 r;
  r.x = w[0];
  r.y = w[1];
  return r;
}

/// Two values of T (__half or __nv_bfloat16) in a 32-bit word, each multiplied by `scale` in
/// fp32 and rounded to T (nearest even): what `static_cast<T>(float(v) * scale)` gives, which
/// the CPU reference computes the same way (MLA's ckv_scale_arr).
template <class T>
FLASHINFER_HD uint32_t scale_pair(uint32_t w, float scale) {
  float a, b;
  if constexpr (std::is_same_v<T, __half>) {
    __half_raw lo, hi;
    lo.x = static_cast<unsigned short>(w & 0xffffu);
    hi.x = static_cast<unsigned short>(w >> 16);
    a = __half2float(__half(lo)) * scale;
    b = __half2float(__half(hi)) * scale;
    const __half_raw ra = static_cast<__half_raw>(__float2half_rn(a));
    const __half_raw rb = static_cast<__half_raw>(__float2half_rn(b));
    return static_cast<uint32_t>(ra.x) | (static_cast<uint32_t>(rb.x) << 16);
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "fp16 or bf16");
    const uint32_t fa = w << 16, fb = w & 0xffff0000u;  // bf16 -> fp32 is a shift
    __builtin_memcpy(&a, &fa, 4);
    __builtin_memcpy(&b, &fb, 4);
    a *= scale;
    b *= scale;
    const __nv_bfloat16_raw ra = static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(a));
    const __nv_bfloat16_raw rb = static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(b));
    return static_cast<uint32_t>(ra.x) | (static_cast<uint32_t>(rb.x) << 16);
  }
}

/// fp8x4_widen, each value then multiplied by `scale` and rounded to T (scale_pair).
template <class T, __nv_fp8_interpretation_t kKind>
FLASHINFER_HD uint2 fp8x4_widen_scaled(uint32_t x, float scale) {
  uint2 r = fp8x4_widen<T, kKind>(x);
  r.x = scale_pair<T>(r.x, scale);
  r.y = scale_pair<T>(r.y, scale);
  return r;
}

/// Bytes 0, 2, 1, 3 of x: a transposing ldmatrix word of fp8 values (keys 2t, 2t + 1 of dims
/// d, d + 1, low byte first) as the pairs (d of both keys, d + 1 of both keys) that fp8x4_widen
/// makes the B operands of two output-dim blocks from (prefill_shape.h, "fp8 K/V").
FLASHINFER_HD uint32_t fp8_trans_pairs(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, 0u, 0x3120u);
#else
  return (x & 0xff0000ffu) | ((x >> 8) & 0xff00u) | ((x << 8) & 0xff0000u);
#endif
}

#if defined(__CUDACC__)
/// The two 16-bit units that fp8 unit `c` of row `r` widens into (`lo`: its values 0-7, `hi`:
/// 8-15), stored as units 2c and 2c + 1 of row r of a permuted tile (fp8_unit_widen_store).
__device__ __forceinline__ void fp8_units_store(uint4* dst, uint4 lo, uint4 hi, int r, int c,
                                                uint32_t units16) {
  const bool swap = ((c >> 2) & 1) != 0;
  const auto ur = static_cast<uint32_t>(r), uc = static_cast<uint32_t>(2 * c);
  dst[permuted_offset(ur, uc + (swap ? 1u : 0u), units16)] = swap ? hi : lo;
  dst[permuted_offset(ur, uc + (swap ? 0u : 1u), units16)] = swap ? lo : hi;
}

/// One 16-byte unit of fp8 values (16, element 0 in the low byte), unit `c` of a stored row `r`,
/// widened into units 2c and 2c + 1 of row r of a permuted 16-bit tile (permuted_smem.cuh) whose
/// rows hold `units16` units: the widening pass of the fp8 K/V tiles (FA2 prefill, MLA decode).
/// A 16-byte store is served 8 threads at a time; with consecutive c in one row, units 2c ^ (r %
/// 8) hit bank groups {0, 2, 4, 6} twice, so threads with bit 2 of c set store their pair in the
/// other order and each phase covers all 8 groups once (2-way -> conflict-free).
template <class T, __nv_fp8_interpretation_t kKind>
__device__ __forceinline__ void fp8_unit_widen_store(uint4* dst, uint4 x, int r, int c,
                                                     uint32_t units16) {
  const uint2 e0 = fp8x4_widen<T, kKind>(x.x), e1 = fp8x4_widen<T, kKind>(x.y);
  const uint2 e2 = fp8x4_widen<T, kKind>(x.z), e3 = fp8x4_widen<T, kKind>(x.w);
  fp8_units_store(dst, make_uint4(e0.x, e0.y, e1.x, e1.y), make_uint4(e2.x, e2.y, e3.x, e3.y), r, c,
                  units16);
}

/// fp8_unit_widen_store with every value multiplied by `scale` and rounded to T
/// (fp8x4_widen_scaled): MLA's per-128-channel ckv scales.
template <class T, __nv_fp8_interpretation_t kKind>
__device__ __forceinline__ void fp8_unit_widen_scaled_store(uint4* dst, uint4 x, int r, int c,
                                                            uint32_t units16, float scale) {
  const uint2 e0 = fp8x4_widen_scaled<T, kKind>(x.x, scale);
  const uint2 e1 = fp8x4_widen_scaled<T, kKind>(x.y, scale);
  const uint2 e2 = fp8x4_widen_scaled<T, kKind>(x.z, scale);
  const uint2 e3 = fp8x4_widen_scaled<T, kKind>(x.w, scale);
  fp8_units_store(dst, make_uint4(e0.x, e0.y, e1.x, e1.y), make_uint4(e2.x, e2.y, e3.x, e3.y), r, c,
                  units16);
}
#endif

}  // namespace flashinfer::kernels::cuda::dev
