// Private helpers shared by the CUDA kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "core/cuda_runtime.h"
#include "flashinfer/error.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/smem_limits.h"
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

/// Attribute `attr` of the current device, read at the call (launchers' block and route
/// choices); a kCuda Error naming `op` when a query fails.
inline int current_device_attribute(cudaDeviceAttr attr, const char* op) {
  int device = 0, value = 0;
  FLASHINFER_CUDA_CALL(op, cudaGetDevice(&device));
  FLASHINFER_CUDA_CALL(op, cudaDeviceGetAttribute(&value, attr, device));
  return value;
}

/// cudaMallocAsync on `s`; out of memory, the tensor allocator's cached blocks (dead tensors'
/// memory, invisible to the stream-ordered pool: core/caching_allocator.h) are given back to the
/// device and the allocation tried once more.
inline cudaError_t malloc_async(void** p, std::size_t bytes, cudaStream_t s) {
  cudaError_t err = cudaMallocAsync(p, bytes, s);
  if (err != cudaErrorMemoryAllocation) return err;
  (void)cudaGetLastError();
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return err;
  ::flashinfer::detail::cuda_empty_cache(device);
  return cudaMallocAsync(p, bytes, s);
}

/// Launches `kernel` through cudaLaunchKernelEx with programmatic stream serialization set to
/// `enable_pdl` (the kernel then overlaps the previous one's tail until its pdl_wait()). Raises
/// the kernel's dynamic shared memory limit first when `smem` is over the default 48 KiB and
/// above what earlier launches on this device raised it to (SmemLimits).
/// Returns the launch's own error, never an earlier one pending in the last-error slot.
template <class... KArgs, class... Args>
cudaError_t try_launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, std::size_t smem,
                              cudaStream_t stream, bool enable_pdl, Args&&... args) {
  if (smem > 48 * 1024) {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    err = SmemLimits::instance().ensure(
        reinterpret_cast<const void*>(kernel), device, smem, [&](std::size_t bytes) {
          return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(bytes));
        });
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

// One element of a runtime-typed tensor, for data touched once per block (queries, outputs):
// a dtype switch keeps one kernel per cache dtype instead of one per (q, kv, o) combination.
__device__ __forceinline__ float load_any(const void* base, int64_t off, DType d) {
  switch (d) {
    case DType::kFloat16:
      return to_f32(static_cast<const __half*>(base)[off]);
    case DType::kBFloat16:
      return to_f32(static_cast<const __nv_bfloat16*>(base)[off]);
    case DType::kFloat8E4M3FN:
      return to_f32(static_cast<const __nv_fp8_e4m3*>(base)[off]);
    case DType::kFloat8E5M2:
      return to_f32(static_cast<const __nv_fp8_e5m2*>(base)[off]);
    default:
      return static_cast<const float*>(base)[off];
  }
}

// fp32 `v` rounded to nearest-even in `d`'s precision (fp16 or bf16; any other dtype keeps it).
__device__ __forceinline__ float round_to_dtype(float v, DType d) {
  switch (d) {
    case DType::kFloat16:
      return __half2float(__float2half_rn(v));
    case DType::kBFloat16:
      return __bfloat162float(__float2bfloat16_rn(v));
    default:
      return v;
  }
}

// Stores fp32 `v` rounded to nearest-even in a half, bfloat16 or float tensor.
__device__ __forceinline__ void store_any(void* base, int64_t off, DType d, float v) {
  switch (d) {
    case DType::kFloat16:
      static_cast<__half*>(base)[off] = __float2half_rn(v);
      return;
    case DType::kBFloat16:
      static_cast<__nv_bfloat16*>(base)[off] = __float2bfloat16_rn(v);
      return;
    default:
      static_cast<float*>(base)[off] = v;
      return;
  }
}

}  // namespace flashinfer::kernels::cuda
