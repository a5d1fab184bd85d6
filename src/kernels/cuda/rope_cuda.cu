#include <cmath>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/rope_cuda.h"
#include "kernels/cuda/vec_cuda.cuh"

namespace flashinfer::kernels::cuda {
namespace {

__device__ __forceinline__ int64_t load_index(const void* p, DType dtype, int64_t i) {
  return dtype == DType::kInt64 ? static_cast<const int64_t*>(p)[i]
                                : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
}

// Segment of token t: the last b in [0, batch) with indptr[b] <= t. Always in range, even for
// a malformed indptr (then the position is merely wrong, never an out-of-bounds read).
__device__ int64_t find_segment(const RopeParams& p, int64_t t) {
  int64_t lo = 0, hi = p.batch;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (load_index(p.indptr, p.indptr_dtype, mid) <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// One block per token. The token's cos/sin table (rotary_dim / 2 pairs) is built once in
// shared memory, in fp64 like the CPU reference, then every (head, pair) of q and k is rotated
// by one thread: the pair is read completely before it is written, so in place is safe.
template <class T>
__global__ void rope_kernel(RopeParams p) {
  extern __shared__ float table[];  // [half] cos, then [half] sin
  __shared__ long long pos_shared;
  const int64_t t = blockIdx.x;
  const int64_t half = p.rotary_dim / 2;
  if (threadIdx.x == 0) {
    int64_t pos;
    if (p.pos_mode == RopePosMode::kPositions) {
      pos = load_index(p.pos, p.pos_dtype, t);
    } else {
      const int64_t b = find_segment(p, t);
      pos =
          load_index(p.offsets, p.offsets_dtype, b) + (t - load_index(p.indptr, p.indptr_dtype, b));
    }
    pos_shared = pos;
  }
  __syncthreads();
  const int64_t pos = pos_shared;
  float* cos_t = table;
  float* sin_t = table + half;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    if (p.cos_sin_cache != nullptr) {
      if (pos >= 0 && pos < p.cache_rows) {
        const float* row = p.cos_sin_cache + pos * p.cache_stride_row;
        cos_t[i] = row[i * p.cache_stride_col];
        sin_t[i] = row[(half + i) * p.cache_stride_col];
      } else {
        cos_t[i] = sin_t[i] =
            __int_as_float(0x7fc00000);  // out of the cache: poison, never read past it
      }
    } else {
      const double base =
          pow(p.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(p.rotary_dim));
      const double s = fmin(fmax(base * p.smooth_a + p.smooth_b, 0.0), 1.0);
      const double f = (1.0 - s) * base * p.rope_rcp_scale + s * base;
      double sv, cv;
      sincos(static_cast<double>(pos) * f, &sv, &cv);
      cos_t[i] = static_cast<float>(cv);
      sin_t[i] = static_cast<float>(sv);
    }
  }
  __syncthreads();
  const int64_t heads = p.num_q_heads + p.num_k_heads;
  for (int64_t w = threadIdx.x; w < heads * half; w += blockDim.x) {
    const int64_t h = w / half, i = w % half;
    const bool is_q = h < p.num_q_heads;
    const int64_t hh = is_q ? h : h - p.num_q_heads;
    const T* x = is_q ? static_cast<const T*>(p.q) + t * p.q_stride_n + hh * p.q_stride_h
                      : static_cast<const T*>(p.k) + t * p.k_stride_n + hh * p.k_stride_h;
    T* y = is_q ? static_cast<T*>(p.q_out) + t * p.q_out_stride_n + hh * p.q_out_stride_h
                : static_cast<T*>(p.k_out) + t * p.k_out_stride_n + hh * p.k_out_stride_h;
    const int64_t isd = is_q ? p.q_stride_d : p.k_stride_d;
    const int64_t osd = is_q ? p.q_out_stride_d : p.k_out_stride_d;
    const int64_t ia = p.interleave ? 2 * i : i;
    const int64_t ib = p.interleave ? 2 * i + 1 : i + half;
    const float a = to_f32(x[ia * isd]), b = to_f32(x[ib * isd]);
    const float c = cos_t[i], s = sin_t[i];
    y[ia * osd] = from_f32<T>(a * c - b * s);
    y[ib * osd] = from_f32<T>(b * c + a * s);
  }
  if (!p.inplace) {
    const int64_t rest = p.head_dim - p.rotary_dim;
    for (int64_t w = threadIdx.x; w < heads * rest; w += blockDim.x) {
      const int64_t h = w / rest, d = p.rotary_dim + w % rest;
      if (h < p.num_q_heads) {
        static_cast<T*>(
            p.q_out)[t * p.q_out_stride_n + h * p.q_out_stride_h + d * p.q_out_stride_d] =
            static_cast<const T*>(p.q)[t * p.q_stride_n + h * p.q_stride_h + d * p.q_stride_d];
      } else {
        const int64_t hk = h - p.num_q_heads;
        static_cast<T*>(
            p.k_out)[t * p.k_out_stride_n + hk * p.k_out_stride_h + d * p.k_out_stride_d] =
            static_cast<const T*>(p.k)[t * p.k_stride_n + hk * p.k_stride_h + d * p.k_stride_d];
      }
    }
  }
}

template <class T>
void launch(const RopeParams& p, cudaStream_t stream) {
  if (p.nnz == 0) return;
  FLASHINFER_CHECK_CODE(p.nnz <= 0x7FFFFFFF, ErrorCode::kUnsupported, "apply_rope", "q",
                        "more than 2^31 - 1 tokens");
  const std::size_t smem = static_cast<std::size_t>(p.rotary_dim) * sizeof(float);
  FLASHINFER_CHECK_CODE(smem <= 48 * 1024, ErrorCode::kUnsupported, "apply_rope", "rotary_dim",
                        "rotary_dim ", p.rotary_dim, " exceeds the CUDA kernel's limit (12288)");
  const int64_t items = (p.num_q_heads + p.num_k_heads) * (p.rotary_dim / 2);
  int threads = threads_for(items);
  if (threads > 512) threads = 512;
  rope_kernel<T><<<static_cast<unsigned>(p.nnz), threads, smem, stream>>>(p);
  FLASHINFER_CUDA_CALL("apply_rope", cudaGetLastError());
}

}  // namespace

void apply_rope(const RopeParams& p, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case DType::kFloat32:
      return launch<float>(p, s);
    case DType::kFloat16:
      return launch<__half>(p, s);
    case DType::kBFloat16:
      return launch<__nv_bfloat16>(p, s);
    default:
      FLASHINFER_FAIL(ErrorCode::kUnsupported, "apply_rope", "q", "dtype ",
                      dtype_torch_name(p.dtype), " is not supported on CUDA");
  }
}

}  // namespace flashinfer::kernels::cuda
