// Private helpers shared by the CUDA kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "flashinfer/error.h"
#include "kernels/dtype_dispatch.h"

namespace flashinfer::kernels::cuda {

#define FLASHINFER_CUDA_CALL(op, expr)                                                      \
  do {                                                                                      \
    cudaError_t err_ = (expr);                                                              \
    if (err_ != cudaSuccess) {                                                              \
      FLASHINFER_FAIL(::flashinfer::ErrorCode::kCuda, op, "", #expr,                        \
                      " failed: ", cudaGetErrorName(err_), ": ", cudaGetErrorString(err_)); \
    }                                                                                       \
  } while (0)

/// Launches `kernel` through cudaLaunchKernelEx with programmatic stream serialization set to
/// `enable_pdl` (the kernel then overlaps the previous one's tail until its pdl_wait()). Raises
/// the kernel's dynamic shared memory limit first when `smem` is over the default 48 KiB.
/// Returns the launch's own error, never an earlier one pending in the last-error slot.
template <class... KArgs, class... Args>
cudaError_t try_launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, std::size_t smem,
                              cudaStream_t stream, bool enable_pdl, Args&&... args) {
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = enable_pdl ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

/// try_launch_kernel that throws Error(kCuda, op) when the launch fails.
template <class... KArgs, class... Args>
void launch_kernel(const char* op, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                   std::size_t smem, cudaStream_t stream, bool enable_pdl, Args&&... args) {
  const cudaError_t err =
      try_launch_kernel(kernel, grid, block, smem, stream, enable_pdl, std::forward<Args>(args)...);
  if (err != cudaSuccess) {
    FLASHINFER_FAIL(ErrorCode::kCuda, op, "", "kernel launch failed: ", cudaGetErrorName(err), ": ",
                    cudaGetErrorString(err));
  }
}

template <DType D>
struct CudaElement {
  using type = void;
};
#define FLASHINFER_CUDA_ELEMENT(D, T) \
  template <>                         \
  struct CudaElement<DType::D> {      \
    using type = T;                   \
  }
FLASHINFER_CUDA_ELEMENT(kFloat32, float);
FLASHINFER_CUDA_ELEMENT(kFloat64, double);
FLASHINFER_CUDA_ELEMENT(kFloat16, __half);
FLASHINFER_CUDA_ELEMENT(kBFloat16, __nv_bfloat16);
FLASHINFER_CUDA_ELEMENT(kFloat8E4M3FN, __nv_fp8_e4m3);
FLASHINFER_CUDA_ELEMENT(kFloat8E5M2, __nv_fp8_e5m2);
FLASHINFER_CUDA_ELEMENT(kInt8, int8_t);
FLASHINFER_CUDA_ELEMENT(kUInt8, uint8_t);
FLASHINFER_CUDA_ELEMENT(kInt16, int16_t);
FLASHINFER_CUDA_ELEMENT(kInt32, int32_t);
FLASHINFER_CUDA_ELEMENT(kInt64, int64_t);
#undef FLASHINFER_CUDA_ELEMENT

/// The CUDA kernels' element types for dispatch_dtype (kernels/dtype_dispatch.h): float, double,
/// __half, __nv_bfloat16, __nv_fp8_e4m3/e5m2, ints.
struct CudaElements {
  template <DType D>
  using type = typename CudaElement<D>::type;
  static constexpr const char* kBackend = "CUDA";
};

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float warp_reduce_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Sum over the block; every thread gets the result. `scratch` holds 32 floats.
__device__ __forceinline__ float block_reduce_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_reduce_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) >> 5;
  v = (threadIdx.x < nwarps) ? scratch[threadIdx.x] : 0.0f;
  if (warp == 0) v = warp_reduce_sum(v);
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  v = scratch[0];
  __syncthreads();  // scratch may be reused right after
  return v;
}

/// Programmatic dependent launch: wait for the previous kernel's results / let the next start.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace flashinfer::kernels::cuda
