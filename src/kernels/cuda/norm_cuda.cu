#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/norm_cuda.h"
#include "kernels/cuda/vec_cuda.cuh"

namespace flashinfer::kernels::cuda {
namespace {

// One block per row: pass 1 sums squares in fp32, pass 2 scales and writes. Rows are short
// (hidden <= a few 10k), so the second read hits L1/L2. kVec (unit strides, 16-byte aligned
// rows and weight, hidden a multiple of the vector): each thread reads 16 bytes per access, so
// its partial sum covers other elements than the element path's (the per-element arithmetic is
// the same; the fp32 sum may differ in its last bits, as fused_add_rmsnorm's two paths do).
template <class T, bool kVec>
__device__ __forceinline__ void rmsnorm_row(const RmsNormParams& p) {
  __shared__ float scratch[32];
  pdl_wait();
  const int64_t r = blockIdx.x;
  const int64_t b = r / p.heads, h = r % p.heads;
  const T* x = static_cast<const T*>(p.input) + b * p.in_stride_b + h * p.in_stride_h;
  const T* w = static_cast<const T*>(p.weight);
  T* y = static_cast<T*>(p.out) + b * p.out_stride_b + h * p.out_stride_h;
  float sum = 0.0f;
  if constexpr (kVec) {
    constexpr int V = kVecElems<T>;
    for (int64_t c = threadIdx.x; c < p.hidden / V; c += blockDim.x) {
      float a[V];
      load_vec(x + c * V, a);
#pragma unroll
      for (int j = 0; j < V; ++j) sum += a[j] * a[j];
    }
  } else {
    for (int64_t i = threadIdx.x; i < p.hidden; i += blockDim.x) {
      const float v = to_f32(x[i * p.in_stride_d]);
      sum += v * v;
    }
  }
  sum = block_reduce_sum(sum, scratch);
  const float r_rms = rsqrtf(sum / static_cast<float>(p.hidden) + p.eps);
  if constexpr (kVec) {
    constexpr int V = kVecElems<T>;
    for (int64_t c = threadIdx.x; c < p.hidden / V; c += blockDim.x) {
      float a[V], g[V];
      load_vec(x + c * V, a);
      load_vec(w + c * V, g);
#pragma unroll
      for (int j = 0; j < V; ++j) a[j] = a[j] * r_rms * (g[j] + p.weight_bias);
      store_vec_global(y + c * V, a);
    }
  } else {
    for (int64_t i = threadIdx.x; i < p.hidden; i += blockDim.x) {
      const float v = to_f32(x[i * p.in_stride_d]);
      const float g = to_f32(w[i * p.weight_stride]) + p.weight_bias;
      y[i * p.out_stride_d] = from_f32<T>(v * r_rms * g);
    }
  }
  pdl_launch_dependents();
}

// The vector and element-load instances carry different names (`*_kernel` / `*_strided_kernel`)
// so that the static SASS rule `rowops` (scripts/check_sass.py) selects the vector ones.
template <class T>
__global__ void rmsnorm_kernel(RmsNormParams p) {
  rmsnorm_row<T, true>(p);
}

template <class T>
__global__ void rmsnorm_strided_kernel(RmsNormParams p) {
  rmsnorm_row<T, false>(p);
}

template <class T>
void launch(const RmsNormParams& p, cudaStream_t stream, bool enable_pdl) {
  const int64_t rows = p.batch * p.heads;
  if (rows == 0) return;
  // One block per row: gridDim.x holds at most 2^31 - 1.
  FLASHINFER_CHECK_CODE(rows <= 0x7FFFFFFF, ErrorCode::kUnsupported, "rmsnorm", "input",
                        "more than 2^31 - 1 rows");
  constexpr int V = kVecElems<T>;
  const bool vec = p.in_stride_d == 1 && p.out_stride_d == 1 && p.weight_stride == 1 &&
                   p.hidden % V == 0 && aligned16(p.input, p.in_stride_b, sizeof(T)) &&
                   aligned16(p.input, p.in_stride_h, sizeof(T)) &&
                   aligned16(p.out, p.out_stride_b, sizeof(T)) &&
                   aligned16(p.out, p.out_stride_h, sizeof(T)) && aligned16(p.weight, 0, sizeof(T));
  const int threads = threads_for(vec ? p.hidden / V : p.hidden);
  launch_kernel("rmsnorm", vec ? rmsnorm_kernel<T> : rmsnorm_strided_kernel<T>,
                dim3(static_cast<unsigned>(rows)), dim3(static_cast<unsigned>(threads)), 0, stream,
                enable_pdl, p);
}

}  // namespace

void rmsnorm(const RmsNormParams& p, void* stream, bool enable_pdl) {
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "rmsnorm", "input", [&]<class T>() { launch<T>(p, s, enable_pdl); });
}

namespace {

// One block per row. Pass 1 reduces the squares of the fp32 sums without writing anything;
// pass 2 recomputes the same sums (bit-identical: same operands, same thread), writes the
// rounded residual and the normalized row. Each element is read and written by one thread
// only, so the in-place update needs no synchronization and no shared row buffer.
template <class T, bool kVec>
__device__ __forceinline__ void fused_add_rmsnorm_row(const FusedAddRmsNormParams& p) {
  __shared__ float scratch[32];
  pdl_wait();
  const int64_t r = blockIdx.x;
  const int64_t b = r / p.heads, h = r % p.heads;
  T* x = static_cast<T*>(p.input) + b * p.in_stride_b + h * p.in_stride_h;
  T* res = static_cast<T*>(p.residual) + b * p.res_stride_b + h * p.res_stride_h;
  const T* w = static_cast<const T*>(p.weight);
  float ss = 0.0f;
  if constexpr (kVec) {
    constexpr int V = kVecElems<T>;
    for (int64_t c = threadIdx.x; c < p.hidden / V; c += blockDim.x) {
      float a[V], d[V];
      load_vec(x + c * V, a);
      load_vec(res + c * V, d);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float s = a[j] + d[j];
        ss += s * s;
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < p.hidden; i += blockDim.x) {
      const float s = to_f32(x[i * p.in_stride_d]) + to_f32(res[i * p.res_stride_d]);
      ss += s * s;
    }
  }
  ss = block_reduce_sum(ss, scratch);
  const float r_rms = rsqrtf(ss / static_cast<float>(p.hidden) + p.eps);
  if constexpr (kVec) {
    constexpr int V = kVecElems<T>;
    for (int64_t c = threadIdx.x; c < p.hidden / V; c += blockDim.x) {
      float a[V], d[V], g[V];
      load_vec(x + c * V, a);
      load_vec(res + c * V, d);
      load_vec(w + c * V, g);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        d[j] += a[j];
        a[j] = d[j] * r_rms * (g[j] + p.weight_bias);
      }
      store_vec(res + c * V, d);
      store_vec(x + c * V, a);
    }
  } else {
    for (int64_t i = threadIdx.x; i < p.hidden; i += blockDim.x) {
      T* xi = x + i * p.in_stride_d;
      T* ri = res + i * p.res_stride_d;
      const float s = to_f32(*xi) + to_f32(*ri);
      const float g = to_f32(w[i * p.weight_stride]) + p.weight_bias;
      *ri = from_f32<T>(s);
      *xi = from_f32<T>(s * r_rms * g);
    }
  }
  pdl_launch_dependents();
}

// One block per row, three passes over the row (mean, squared deviations, output); the
// second and third reads hit L1/L2.
template <class T, bool kVec>
__device__ __forceinline__ void layernorm_row(const LayerNormParams& p) {
  __shared__ float scratch[32];
  const T* x = static_cast<const T*>(p.input) + blockIdx.x * p.in_stride_b;
  T* y = static_cast<T*>(p.out) + blockIdx.x * p.out_stride_b;
  constexpr int V = kVecElems<T>;
  const float inv_n = 1.0f / static_cast<float>(p.hidden);
  float acc = 0.0f;
  if constexpr (kVec) {
    for (int64_t c = threadIdx.x; c < p.hidden / V; c += blockDim.x) {
      float a[V];
      load_vec(x + c * V, a);
#pragma unroll
      for (int j = 0; j < V; ++j) acc += a[j];
    }
  } else {
    for (int64_t i = threadIdx.x; i < p.hidden; i += blockDim.x)
      acc += to_f32(x[i * p.in_stride_d]);
  }
  const float mean = block_reduce_sum(acc, scratch) * inv_n;
  acc = 0.0f;
  if constexpr (kVec) {
    for (int64_t c = threadIdx.x; c < p.hidden / V; c += blockDim.x) {
      float a[V];
      load_vec(x + c * V, a);
#pragma unroll
      for (int j = 0; j < V; ++j) acc += (a[j] - mean) * (a[j] - mean);
    }
  } else {
    for (int64_t i = threadIdx.x; i < p.hidden; i += blockDim.x) {
      const float d = to_f32(x[i * p.in_stride_d]) - mean;
      acc += d * d;
    }
  }
  const float r_std = rsqrtf(block_reduce_sum(acc, scratch) * inv_n + p.eps);
  if constexpr (kVec) {
    for (int64_t c = threadIdx.x; c < p.hidden / V; c += blockDim.x) {
      float a[V];
      load_vec(x + c * V, a);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int64_t i = c * V + j;
        a[j] = (a[j] - mean) * r_std * load_any(p.gamma, i * p.gamma_stride, p.param_dtype) +
               load_any(p.beta, i * p.beta_stride, p.param_dtype);
      }
      store_vec(y + c * V, a);
    }
  } else {
    for (int64_t i = threadIdx.x; i < p.hidden; i += blockDim.x) {
      const float v = (to_f32(x[i * p.in_stride_d]) - mean) * r_std;
      y[i * p.out_stride_d] = from_f32<T>(v * load_any(p.gamma, i * p.gamma_stride, p.param_dtype) +
                                          load_any(p.beta, i * p.beta_stride, p.param_dtype));
    }
  }
}

template <class T>
__global__ void fused_add_rmsnorm_kernel(FusedAddRmsNormParams p) {
  fused_add_rmsnorm_row<T, true>(p);
}

template <class T>
__global__ void fused_add_rmsnorm_strided_kernel(FusedAddRmsNormParams p) {
  fused_add_rmsnorm_row<T, false>(p);
}

template <class T>
__global__ void layernorm_kernel(LayerNormParams p) {
  layernorm_row<T, true>(p);
}

template <class T>
__global__ void layernorm_strided_kernel(LayerNormParams p) {
  layernorm_row<T, false>(p);
}

template <class T>
void launch_fused_add(const FusedAddRmsNormParams& p, cudaStream_t stream, bool enable_pdl) {
  const int64_t rows = p.batch * p.heads;
  if (rows == 0) return;
  FLASHINFER_CHECK_CODE(rows <= 0x7FFFFFFF, ErrorCode::kUnsupported, "fused_add_rmsnorm", "input",
                        "more than 2^31 - 1 rows");
  constexpr int V = kVecElems<T>;
  const bool vec = p.in_stride_d == 1 && p.res_stride_d == 1 && p.weight_stride == 1 &&
                   p.hidden % V == 0 && aligned16(p.input, p.in_stride_b, sizeof(T)) &&
                   aligned16(p.input, p.in_stride_h, sizeof(T)) &&
                   aligned16(p.residual, p.res_stride_b, sizeof(T)) &&
                   aligned16(p.residual, p.res_stride_h, sizeof(T)) &&
                   aligned16(p.weight, 0, sizeof(T));
  const int threads = threads_for(vec ? p.hidden / V : p.hidden);
  launch_kernel("fused_add_rmsnorm",
                vec ? fused_add_rmsnorm_kernel<T> : fused_add_rmsnorm_strided_kernel<T>,
                dim3(static_cast<unsigned>(rows)), dim3(static_cast<unsigned>(threads)), 0, stream,
                enable_pdl, p);
}

template <class T>
void launch_layernorm(const LayerNormParams& p, cudaStream_t stream) {
  if (p.batch == 0) return;
  FLASHINFER_CHECK_CODE(p.batch <= 0x7FFFFFFF, ErrorCode::kUnsupported, "layernorm", "input",
                        "more than 2^31 - 1 rows");
  constexpr int V = kVecElems<T>;
  const bool vec = p.in_stride_d == 1 && p.out_stride_d == 1 && p.hidden % V == 0 &&
                   aligned16(p.input, p.in_stride_b, sizeof(T)) &&
                   aligned16(p.out, p.out_stride_b, sizeof(T));
  const int threads = threads_for(vec ? p.hidden / V : p.hidden);
  const dim3 grid(static_cast<unsigned>(p.batch));
  if (vec) {
    layernorm_kernel<T><<<grid, threads, 0, stream>>>(p);
  } else {
    layernorm_strided_kernel<T><<<grid, threads, 0, stream>>>(p);
  }
  FLASHINFER_CUDA_CALL("layernorm", cudaGetLastError());
}

}  // namespace

void fused_add_rmsnorm(const FusedAddRmsNormParams& p, void* stream, bool enable_pdl) {
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "fused_add_rmsnorm", "input",
      [&]<class T>() { launch_fused_add<T>(p, s, enable_pdl); });
}

void layernorm(const LayerNormParams& p, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "layernorm", "input", [&]<class T>() { launch_layernorm<T>(p, s); });
}

}  // namespace flashinfer::kernels::cuda
