// Level-5 log statistics on the device: a grid-stride pass writes one partial TensorStats per
// block, a one-block pass merges them in a fixed order, and only that one struct is copied back
// (never the tensor itself).
#include <cuda_fp8.h>

#include <type_traits>

#include "kernels/cuda/apilog_stats_cuda.h"
#include "kernels/cuda/cuda_utils.cuh"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kStatsThreads = 256;
constexpr int kMaxBlocks = 512;

__device__ __forceinline__ int64_t element_offset(const TensorStatsParams& p, int64_t idx) {
  int64_t off = 0;
  for (int d = p.ndim - 1; d >= 0; --d) {
    const int64_t n = p.shape[d];
    off += (idx % n) * p.strides[d];
    idx /= n;
  }
  return off;
}

// fp32 value of one element, as torch's .float() gives it (fp64 is rounded to fp32).
template <DType D>
__device__ __forceinline__ float load_f32(const void* base, int64_t off) {
  if constexpr (D == DType::kFloat32) {
    return static_cast<const float*>(base)[off];
  } else if constexpr (D == DType::kFloat64) {
    return static_cast<float>(static_cast<const double*>(base)[off]);
  } else if constexpr (D == DType::kFloat16) {
    return to_f32(static_cast<const __half*>(base)[off]);
  } else if constexpr (D == DType::kBFloat16) {
    return to_f32(static_cast<const __nv_bfloat16*>(base)[off]);
  } else if constexpr (D == DType::kFloat8E4M3FN) {
    const __half h(
        __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(base)[off], __NV_E4M3));
    return __half2float(h);
  } else {
    static_assert(D == DType::kFloat8E5M2);
    const __half h(
        __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(base)[off], __NV_E5M2));
    return __half2float(h);
  }
}

// Shared memory cannot hold a type with default member initializers directly.
__device__ __forceinline__ TensorStats* shared_stats() {
  __shared__ alignas(TensorStats) unsigned char raw[kStatsThreads * sizeof(TensorStats)];
  return reinterpret_cast<TensorStats*>(raw);
}

// Tree reduction over the block in a fixed order; thread 0 returns the block's total.
__device__ __forceinline__ TensorStats block_merge(const TensorStats& mine) {
  TensorStats* sh = shared_stats();
  sh[threadIdx.x] = mine;
  __syncthreads();
  for (int s = kStatsThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) merge_stats(sh[threadIdx.x], sh[threadIdx.x + s]);
    __syncthreads();
  }
  return sh[0];
}

template <DType D>
__global__ void float_partial_kernel(TensorStatsParams p, TensorStats* partials) {
  TensorStats s;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kStatsThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kStatsThreads + threadIdx.x; i < p.numel;
       i += step) {
    add_float(s, load_f32<D>(p.data, element_offset(p, i)));
  }
  const TensorStats total = block_merge(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

template <class I>
__global__ void int_partial_kernel(TensorStatsParams p, TensorStats* partials) {
  TensorStats s;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kStatsThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kStatsThreads + threadIdx.x; i < p.numel;
       i += step) {
    add_int(s, static_cast<int64_t>(static_cast<const I*>(p.data)[element_offset(p, i)]));
  }
  const TensorStats total = block_merge(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void merge_kernel(const TensorStats* partials, int n, TensorStats* out) {
  TensorStats s;
  for (int i = threadIdx.x; i < n; i += kStatsThreads) merge_stats(s, partials[i]);
  const TensorStats total = block_merge(s);
  if (threadIdx.x == 0) *out = total;
}

struct DeviceGuard {
  int prev = -1;
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    if (prev != device) FLASHINFER_CUDA_CALL("api_log statistics", cudaSetDevice(device));
  }
  ~DeviceGuard() {
    if (prev >= 0) (void)cudaSetDevice(prev);
  }
};

// try_launch_kernel reports this launch's own error, never an earlier one still pending in the
// runtime's last-error slot (which belongs to the caller's code).
cudaError_t launch_partial(const TensorStatsParams& p, int blocks, TensorStats* partials,
                           cudaStream_t s) {
  return visit_dtype<DTypeConstants, kFloat32, kFloat64, kFloat16, kBFloat16, kFloat8E4M3FN,
                     kFloat8E5M2, kInt8, kUInt8, kInt16, kInt32, kInt64>(
      p.dtype,
      [&]<class D>() {
        using T = CudaElements::type<D::value>;
        if constexpr (std::is_integral_v<T>) {
          return try_launch_kernel(int_partial_kernel<T>, dim3(static_cast<unsigned>(blocks)),
                                   dim3(kStatsThreads), 0, s, false, p, partials);
        } else {
          return try_launch_kernel(float_partial_kernel<D::value>,
                                   dim3(static_cast<unsigned>(blocks)), dim3(kStatsThreads), 0, s,
                                   false, p, partials);
        }
      },
      [] { return cudaErrorInvalidValue; });  // the caller passes floating and integer dtypes
}

}  // namespace

TensorStats tensor_stats(const TensorStatsParams& p, int device, void* stream) {
  TensorStats host;
  if (p.numel == 0) return host;
  DeviceGuard guard(device);
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t want = (p.numel + kStatsThreads - 1) / kStatsThreads;
  const int blocks = static_cast<int>(want < kMaxBlocks ? want : kMaxBlocks);
  TensorStats* buf = nullptr;
  FLASHINFER_CUDA_CALL("api_log statistics",
                       malloc_async(reinterpret_cast<void**>(&buf),
                                    sizeof(TensorStats) * static_cast<size_t>(blocks + 1), s));
  cudaError_t err = launch_partial(p, blocks, buf, s);
  if (err == cudaSuccess)
    err = try_launch_kernel(merge_kernel, dim3(1), dim3(kStatsThreads), 0, s, false,
                            static_cast<const TensorStats*>(buf), blocks, buf + blocks);
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(&host, buf + blocks, sizeof(TensorStats), cudaMemcpyDeviceToHost, s);
  }
  const cudaError_t free_err = cudaFreeAsync(buf, s);
  if (err == cudaSuccess) err = free_err;
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  FLASHINFER_CUDA_CALL("api_log statistics", err);
  return host;
}

}  // namespace flashinfer::kernels::cuda
