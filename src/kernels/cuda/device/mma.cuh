// Device library: tensor-core operand loads (ldmatrix) and the m16n8k16 MMA with fp32
// accumulation, for the FA2-style prefill kernel. Fragments follow the PTX ISA's layouts for
// mma.m16n8k16 (A: 4 x .b32 per thread, B: 2, C/D: 4 floats). ldmatrix reads 8x8 tiles of 16-bit
// elements whose rows are 16-byte units of shared memory; with the permuted layout
// (permuted_smem.cuh) the 8 rows of a tile fall in 8 different bank groups. sm_80+; device code
// only; NVRTC compiles it too.
#pragma once

#include "kernels/cuda/device/cp_async.cuh"

namespace flashinfer::kernels::cuda::dev::mma {

/// Four 8x8 tiles: lanes 8i..8i+7 give the row addresses of tile i; r[i] is this lane's part.
/// `row` is a 32-bit shared-state-space address (cp_async::smem_addr): kernels keep a tile's
/// base as one and add offsets, rather than one 64-bit generic pointer per fragment.
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, uint32_t row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row));
#else
  (void)r;
  (void)row;
  __trap();
#endif
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* smem_row) {
  ldmatrix_x4(r, cp_async::smem_addr(smem_row));
}

/// Two 8x8 tiles: lanes 0..15 give the row addresses (8i..8i+7 those of tile i; the other lanes'
/// are not read). The fp8 K fragments (prefill_kernel.cuh): half ldmatrix_x4's registers.
__device__ __forceinline__ void ldmatrix_x2(uint32_t* r, uint32_t row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(row));
#else
  (void)r;
  (void)row;
  __trap();
#endif
}

/// ldmatrix_x4 with each 8x8 tile transposed (V as the B operand of P.V).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, uint32_t row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row));
#else
  (void)r;
  (void)row;
  __trap();
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* smem_row) {
  ldmatrix_x4_trans(r, cp_async::smem_addr(smem_row));
}

/// Two floats rounded to T (__half or __nv_bfloat16) and packed low-first: an A-operand register
/// built from fp32 accumulators (P of P.V), or a pair of outputs.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const T a = from_f32<T>(lo), b = from_f32<T>(hi);
  uint16_t ua, ub;
  if constexpr (::cuda::std::is_same_v<T, __half>) {
    ua = __half_as_ushort(a);
    ub = __half_as_ushort(b);
  } else {
    ua = __bfloat16_as_ushort(a);
    ub = __bfloat16_as_ushort(b);
  }
  return static_cast<uint32_t>(ua) | (static_cast<uint32_t>(ub) << 16);
}

/// d += a * b for a 16x16 (row) by 16x8 (col) tile of T (__half or __nv_bfloat16), fp32 d.
template <class T>
__device__ __forceinline__ void mma_m16n8k16(float* d, const uint32_t* a, const uint32_t* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (::cuda::std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  (void)d;
  (void)a;
  (void)b;
  __trap();
#endif
}

}  // namespace flashinfer::kernels::cuda::dev::mma
