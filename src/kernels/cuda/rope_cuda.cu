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

// Rotates V consecutive elements (kVec path): NeoX rotates lanes of `a` (dims i..) against
// lanes of `b` (dims i + half..); interleaved rotates adjacent lane pairs of `a` alone.
template <int V>
__device__ __forceinline__ void rotate_vec(float* a, float* b, const float* c, const float* s,
                                           bool interleave) {
  if (interleave) {
#pragma unroll
    for (int l = 0; l < V; l += 2) {
      const float x0 = a[l], x1 = a[l + 1];
      a[l] = x0 * c[l / 2] - x1 * s[l / 2];
      a[l + 1] = x1 * c[l / 2] + x0 * s[l / 2];
    }
  } else {
#pragma unroll
    for (int l = 0; l < V; ++l) {
      const float x0 = a[l], x1 = b[l];
      a[l] = x0 * c[l] - x1 * s[l];
      b[l] = x1 * c[l] + x0 * s[l];
    }
  }
}

// One block per token. The token's cos/sin table (rotary_dim / 2 pairs) is built once in
// shared memory, in fp64 like the CPU reference, then every (head, pair) of q and k is rotated
// by one thread: the pair is read completely before it is written, so in place is safe.
// kVec (unit strides, 16-byte aligned heads, rotary_dim and head_dim multiples of the vector):
// each thread handles 16 bytes per access instead of one element.
template <class T, bool kVec>
__device__ __forceinline__ void rope_row(const RopeParams& p) {
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
  if constexpr (kVec) {
    constexpr int V = kVecElems<T>;
    // NeoX: a chunk is V pairs (V dims in each half); interleaved: V dims = V / 2 pairs.
    const int64_t chunks = p.interleave ? p.rotary_dim / V : half / V;
    for (int64_t w = threadIdx.x; w < heads * chunks; w += blockDim.x) {
      const int64_t h = w / chunks, j = w % chunks;
      const bool is_q = h < p.num_q_heads;
      const int64_t hh = is_q ? h : h - p.num_q_heads;
      const T* x = is_q ? static_cast<const T*>(p.q) + t * p.q_stride_n + hh * p.q_stride_h
                        : static_cast<const T*>(p.k) + t * p.k_stride_n + hh * p.k_stride_h;
      T* y = is_q ? static_cast<T*>(p.q_out) + t * p.q_out_stride_n + hh * p.q_out_stride_h
                  : static_cast<T*>(p.k_out) + t * p.k_out_stride_n + hh * p.k_out_stride_h;
      float a[V], b[V];
      if (p.interleave) {
        load_vec(x + j * V, a);
        rotate_vec<V>(a, b, cos_t + j * V / 2, sin_t + j * V / 2, true);
        store_vec(y + j * V, a);
      } else {
        load_vec(x + j * V, a);
        load_vec(x + half + j * V, b);
        rotate_vec<V>(a, b, cos_t + j * V, sin_t + j * V, false);
        store_vec(y + j * V, a);
        store_vec(y + half + j * V, b);
      }
    }
  } else {
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

// The vector and element-load instances carry different names (`*_kernel` / `*_strided_kernel`)
// for the static SASS checks (scripts/check_sass.py). Both keep a 40-byte stack frame: the fp64
// sincos above brings libdevice's Payne-Hanek argument reduction for huge arguments, whose
// dynamically indexed 5 x 64-bit array lives in local memory.
template <class T>
__global__ void rope_kernel(RopeParams p) {
  rope_row<T, true>(p);
}

template <class T>
__global__ void rope_strided_kernel(RopeParams p) {
  rope_row<T, false>(p);
}

template <class T>
bool rope_vectorizable(const RopeParams& p) {
  constexpr int V = kVecElems<T>;
  const int64_t unit = p.interleave ? p.rotary_dim : p.rotary_dim / 2;
  auto ok = [](const void* ptr, int64_t sn, int64_t sh, int64_t sd) {
    return sd == 1 && aligned16(ptr, sn, sizeof(T)) && aligned16(ptr, sh, sizeof(T));
  };
  return unit % V == 0 && ok(p.q, p.q_stride_n, p.q_stride_h, p.q_stride_d) &&
         ok(p.k, p.k_stride_n, p.k_stride_h, p.k_stride_d) &&
         ok(p.q_out, p.q_out_stride_n, p.q_out_stride_h, p.q_out_stride_d) &&
         ok(p.k_out, p.k_out_stride_n, p.k_out_stride_h, p.k_out_stride_d);
}

template <class T>
void launch(const RopeParams& p, cudaStream_t stream) {
  if (p.nnz == 0) return;
  FLASHINFER_CHECK_CODE(p.nnz <= 0x7FFFFFFF, ErrorCode::kUnsupported, "apply_rope", "q",
                        "more than 2^31 - 1 tokens");
  const std::size_t smem = static_cast<std::size_t>(p.rotary_dim) * sizeof(float);
  // The 48 KiB default limit covers static shared memory too (the kernel's one long long).
  FLASHINFER_CHECK_CODE(smem + sizeof(long long) <= 48 * 1024, ErrorCode::kUnsupported,
                        "apply_rope", "rotary_dim", "rotary_dim ", p.rotary_dim,
                        " exceeds the CUDA kernel's limit (12286)");
  const bool vec = rope_vectorizable<T>(p);
  // Work items per token: (head, pair) scalar, (head, 16-byte chunk) vectorized.
  const int64_t per_head =
      vec ? (p.interleave ? p.rotary_dim : p.rotary_dim / 2) / kVecElems<T> : p.rotary_dim / 2;
  int threads = threads_for((p.num_q_heads + p.num_k_heads) * per_head);
  if (threads > 512) threads = 512;
  if (vec) {
    rope_kernel<T><<<static_cast<unsigned>(p.nnz), threads, smem, stream>>>(p);
  } else {
    rope_strided_kernel<T><<<static_cast<unsigned>(p.nnz), threads, smem, stream>>>(p);
  }
  FLASHINFER_CUDA_CALL("apply_rope", cudaGetLastError());
}

}  // namespace

void apply_rope(const RopeParams& p, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(p.dtype, "apply_rope", "q",
                                                              [&]<class T>() { launch<T>(p, s); });
}

}  // namespace flashinfer::kernels::cuda
