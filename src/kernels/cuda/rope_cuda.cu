#include <cmath>
#include <type_traits>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/rope_cuda.h"
#include "kernels/cuda/vec_cuda.cuh"
#include "kernels/rope_rules.h"

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

// The host's pair frequencies (rope_pair_frequency), passed by value in the kernel's parameters
// so the kernel runs no fp64 pow and rounds them as the CPU does.
struct RopeFreqs {
  double f[kRopeMaxPairs];
};
// Calls with precomputed angles (a cos/sin cache).
struct NoFreqs {};

// Position of token t.
__device__ __forceinline__ int64_t token_position(const RopeParams& p, int64_t t) {
  if (p.pos_mode == RopePosMode::kPositions) return load_index(p.pos, p.pos_dtype, t);
  const int64_t b = find_segment(p, t);
  return load_index(p.offsets, p.offsets_dtype, b) + (t - load_index(p.indptr, p.indptr_dtype, b));
}

// Fills the token's cos/sin table (threads i < rotary_dim / 2): from the cache row (NoFreqs), or
// rope_sincos of pos * f in fp64 as the CPU reference does (RopeFreqs). Each table thread reads
// the position itself (one broadcast load) instead of waiting on a block barrier for thread 0's.
template <class F>
__device__ __forceinline__ void fill_table(const RopeParams& p, const F& freqs, int64_t t,
                                           float* cos_t, float* sin_t) {
  const int64_t half = p.rotary_dim / 2;
  if (threadIdx.x >= half) return;
  const int64_t pos = token_position(p, t);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    if constexpr (std::is_same_v<F, NoFreqs>) {
      if (pos >= 0 && pos < p.cache_rows) {
        const float* row = p.cos_sin_cache + pos * p.cache_stride_row;
        cos_t[i] = row[i * p.cache_stride_col];
        sin_t[i] = row[(half + i) * p.cache_stride_col];
      } else {
        cos_t[i] = sin_t[i] =
            __int_as_float(0x7fc00000);  // out of the cache: poison, never read past it
      }
    } else {
      const double angle = f64_mul(static_cast<double>(pos), freqs.f[i]);
      double sv, cv;
      bool ok;  // false past kRopeMaxAngle: both NaN, as documented in rope_cuda.h
      rope_sincos(angle, &sv, &cv, &ok);
      cos_t[i] = static_cast<float>(cv);
      sin_t[i] = static_cast<float>(sv);
    }
  }
}

// Rotates V consecutive elements (kVec path): NeoX rotates lanes of `a` (dims i..) against
// lanes of `b` (dims i + half..); interleaved rotates adjacent lane pairs of `a` alone.
template <int V>
__device__ __forceinline__ void rotate_vec(float* a, float* b, const float* c, const float* s,
                                           bool interleave) {
  if (interleave) {
#pragma unroll
    for (int l = 0; l < V; l += 2)
      rope_rotate(a[l], a[l + 1], c[l / 2], s[l / 2], &a[l], &a[l + 1]);
  } else {
#pragma unroll
    for (int l = 0; l < V; ++l) rope_rotate(a[l], b[l], c[l], s[l], &a[l], &b[l]);
  }
}

// Head h's chunk j of `elems` elements in token t, input and output (the vector path's 16-byte
// chunks; j = 0 is the head's start, as the element path uses it).
template <class T>
struct RopeChunk {
  const T* x;
  T* y;
};

template <class T>
__device__ __forceinline__ RopeChunk<T> rope_chunk(const RopeParams& p, int64_t t, int64_t h,
                                                   int64_t j, int64_t elems) {
  const bool is_q = h < p.num_q_heads;
  const int64_t hh = is_q ? h : h - p.num_q_heads;
  const T* x = is_q ? static_cast<const T*>(p.q) + t * p.q_stride_n + hh * p.q_stride_h
                    : static_cast<const T*>(p.k) + t * p.k_stride_n + hh * p.k_stride_h;
  T* y = is_q ? static_cast<T*>(p.q_out) + t * p.q_out_stride_n + hh * p.q_out_stride_h
              : static_cast<T*>(p.k_out) + t * p.k_out_stride_n + hh * p.k_out_stride_h;
  return {x + j * elems, y + j * elems};
}

// One block per token. The token's cos/sin table (rotary_dim / 2 pairs) is built once in
// shared memory, then every (head, pair) of q and k is rotated by one thread: the pair is read
// completely before it is written, so in place is safe.
// kVec (unit strides, 16-byte aligned heads, rotary_dim and head_dim multiples of the vector):
// each thread handles 16 bytes per access instead of one element, and issues the loads of its
// first chunk before the table is built, so the HBM latency overlaps the table's arithmetic
// instead of following it (a block's work is one token: without that, the load waits behind the
// barrier and the SM has few bytes in flight).
template <class T, bool kVec, class F>
__device__ __forceinline__ void rope_row(const RopeParams& p, const F& freqs) {
  extern __shared__ float table[];  // [half] cos, then [half] sin
  const int64_t t = blockIdx.x;
  const int64_t half = p.rotary_dim / 2;
  float* cos_t = table;
  float* sin_t = table + half;
  const int64_t heads = p.num_q_heads + p.num_k_heads;
  if constexpr (kVec) {
    constexpr int V = kVecElems<T>;
    // NeoX: a chunk is V pairs (V dims in each half); interleaved: V dims = V / 2 pairs.
    const int64_t chunks = p.interleave ? p.rotary_dim / V : half / V;
    const int64_t items = heads * chunks;
    int64_t w = threadIdx.x;
    Vec16<T> ra, rb;
    if (w < items) {
      const RopeChunk<T> c = rope_chunk<T>(p, t, w / chunks, w % chunks, V);
      ra = *reinterpret_cast<const Vec16<T>*>(c.x);
      if (!p.interleave) rb = *reinterpret_cast<const Vec16<T>*>(c.x + half);
    }
    fill_table(p, freqs, t, cos_t, sin_t);
    __syncthreads();
    for (; w < items; w += blockDim.x) {
      const int64_t j = w % chunks;
      const RopeChunk<T> c = rope_chunk<T>(p, t, w / chunks, j, V);
      if (w != threadIdx.x) {
        ra = *reinterpret_cast<const Vec16<T>*>(c.x);
        if (!p.interleave) rb = *reinterpret_cast<const Vec16<T>*>(c.x + half);
      }
      float a[V], b[V];
#pragma unroll
      for (int l = 0; l < V; ++l) a[l] = to_f32(ra.v[l]);
      if (p.interleave) {
        rotate_vec<V>(a, b, cos_t + j * V / 2, sin_t + j * V / 2, true);
        store_vec(c.y, a);
      } else {
#pragma unroll
        for (int l = 0; l < V; ++l) b[l] = to_f32(rb.v[l]);
        rotate_vec<V>(a, b, cos_t + j * V, sin_t + j * V, false);
        store_vec(c.y, a);
        store_vec(c.y + half, b);
      }
    }
  } else {
    fill_table(p, freqs, t, cos_t, sin_t);
    __syncthreads();
    for (int64_t w = threadIdx.x; w < heads * half; w += blockDim.x) {
      const int64_t h = w / half, i = w % half;
      const bool is_q = h < p.num_q_heads;
      const RopeChunk<T> c = rope_chunk<T>(p, t, h, 0, 0);  // the head's first element
      const T* x = c.x;
      T* y = c.y;
      const int64_t isd = is_q ? p.q_stride_d : p.k_stride_d;
      const int64_t osd = is_q ? p.q_out_stride_d : p.k_out_stride_d;
      const int64_t ia = p.interleave ? 2 * i : i;
      const int64_t ib = p.interleave ? 2 * i + 1 : i + half;
      float ao, bo;
      rope_rotate(to_f32(x[ia * isd]), to_f32(x[ib * isd]), cos_t[i], sin_t[i], &ao, &bo);
      y[ia * osd] = from_f32<T>(ao);
      y[ib * osd] = from_f32<T>(bo);
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
// for the static SASS checks (scripts/check_sass.py, rule `rowops`).
template <class T, class F>
__global__ void rope_kernel(RopeParams p, F freqs) {
  rope_row<T, true>(p, freqs);
}

template <class T, class F>
__global__ void rope_strided_kernel(RopeParams p, F freqs) {
  rope_row<T, false>(p, freqs);
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
  FLASHINFER_CHECK_CODE(smem <= 48 * 1024, ErrorCode::kUnsupported, "apply_rope", "rotary_dim",
                        "rotary_dim ", p.rotary_dim, " exceeds the CUDA kernel's limit (12288)");
  const bool vec = rope_vectorizable<T>(p);
  // Work items per token: (head, pair) scalar, (head, 16-byte chunk) vectorized.
  const int64_t per_head =
      vec ? (p.interleave ? p.rotary_dim : p.rotary_dim / 2) / kVecElems<T> : p.rotary_dim / 2;
  int threads = threads_for((p.num_q_heads + p.num_k_heads) * per_head);
  if (threads > 512) threads = 512;
  const dim3 grid(static_cast<unsigned>(p.nnz));
  if (p.cos_sin_cache == nullptr) {
    FLASHINFER_CHECK_CODE(p.rotary_dim / 2 <= kRopeMaxPairs, ErrorCode::kUnsupported, "apply_rope",
                          "rotary_dim", "computed angles for rotary_dim <= ", 2 * kRopeMaxPairs,
                          " only, got ", p.rotary_dim);
    RopeFreqs freqs{};
    for (int64_t i = 0; i < p.rotary_dim / 2; ++i) freqs.f[i] = rope_pair_frequency(p, i);
    if (vec) {
      rope_kernel<T><<<grid, threads, smem, stream>>>(p, freqs);
    } else {
      rope_strided_kernel<T><<<grid, threads, smem, stream>>>(p, freqs);
    }
  } else if (vec) {
    rope_kernel<T><<<grid, threads, smem, stream>>>(p, NoFreqs{});
  } else {
    rope_strided_kernel<T><<<grid, threads, smem, stream>>>(p, NoFreqs{});
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
