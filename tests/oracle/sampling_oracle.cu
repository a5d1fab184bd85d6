// Test oracle: the first-draft CUDA sampling kernels (one 512-thread block per row, scalar loads,
// a block scan per 512-element tile, 32-step bisection filters). They ran correctly on an H100
// (2026-11-25: SamplingCuda.* passed) and are kept to check the library's kernels
// (src/kernels/cuda/sampling_cuda.cu) against: same algorithms, same Philox draws as the CPU
// reference. Not part of the library; built only when CUDA is compiled (tests/CMakeLists.txt).
#include <cstdint>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/sampling_rules.h"
#include "oracle/sampling_oracle.h"

namespace flashinfer::kernels::cuda::sampling_oracle {
namespace {

constexpr int kThreads = 512;  // a multiple of 32; every helper below assumes full warps
constexpr unsigned kFull = 0xffffffffu;
constexpr int64_t kNoIndex = INT64_MAX;

template <class T>
__device__ __forceinline__ float load(const T* x, int64_t i, int64_t stride) {
  return to_f32(x[i * stride]);
}

// ---- block-wide reductions: every thread gets the result; `scratch` holds 32 values --------

template <class T, class Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// Each warp reduces the per-warp partials itself (same values, same tree), so all threads agree
// without a second round trip through shared memory.
template <class T, class Op>
__device__ __forceinline__ T block_reduce(T v, T identity, T* scratch, Op op) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_reduce(v, op);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T t = lane < nwarps ? scratch[lane] : identity;
  t = warp_reduce(t, op);
  __syncthreads();  // scratch is reused right after
  return t;
}

struct SumOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxF {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct MinI {
  __device__ __forceinline__ long long operator()(long long a, long long b) const {
    return a < b ? a : b;
  }
};
struct MaxI {
  __device__ __forceinline__ long long operator()(long long a, long long b) const {
    return a > b ? a : b;
  }
};

struct Scratch {
  float f[32];
  long long i[32];
  uint32_t u[32];
};

/// Inclusive prefix sum over the block (thread order); `total` gets the block's sum.
__device__ __forceinline__ float block_inclusive_scan(float v, float* scratch, float& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float n = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += n;
  }
  if (lane == 31) scratch[warp] = v;
  __syncthreads();
  float w = lane < nwarps ? scratch[lane] : 0.0f;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float n = __shfl_up_sync(kFull, w, o);
    if (lane >= o) w += n;
  }
  const float before = __shfl_sync(kFull, w, warp > 0 ? warp - 1 : 0);
  total = __shfl_sync(kFull, w, nwarps - 1);
  __syncthreads();
  return warp > 0 ? v + before : v;
}

// ---- sampling --------------------------------------------------------------------------

// Inverse CDF over the tokens `keep` accepts: the first index whose running sum exceeds u, else
// the last kept token, else -1. Tiles of blockDim elements in index order, stopping at the tile
// that crosses u.
template <class T, class Keep>
__device__ int64_t inverse_cdf(const T* x, int64_t n, int64_t stride, Keep keep, float u,
                               Scratch& s) {
  float running = 0.0f;
  long long last = -1;
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    float v = i < n ? load(x, i, stride) : 0.0f;
    v = keep(v) ? v : 0.0f;
    float total;
    const float incl = block_inclusive_scan(v, s.f, total);
    const bool hit = v > 0.0f && running + incl > u;
    if (v > 0.0f) last = i;
    const long long first = block_reduce<long long>(hit ? i : kNoIndex, kNoIndex, s.i, MinI());
    if (first != kNoIndex) return first;
    running += total;
  }
  return block_reduce<long long>(last, -1, s.i, MaxI());
}

template <class T>
__device__ int64_t rejection_sample(const T* x, int64_t n, int64_t stride, SamplingKind kind,
                                    const SamplingRow& row, PhiloxStream& rng, Scratch& s) {
  float low = 0.0f, high = 1.0f, q = 1.0f;
  for (;;) {
    const float u = rng.next_uniform() * q;
    const int64_t j = inverse_cdf(
        x, n, stride, [low](float v) { return v > low; }, u, s);
    if (j < 0) return -1;
    const float pivot0 = load(x, j, stride);
    const float pivot1 = (pivot0 + high) * 0.5f;
    long long count0 = 0, count1 = 0;
    float mass0 = 0.0f, mass1 = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = load(x, i, stride);
      if (v > pivot0) {
        ++count0;
        mass0 += v;
      }
      if (v > pivot1) {
        ++count1;
        mass1 += v;
      }
    }
    count0 = block_reduce<long long>(count0, 0, s.i, SumOp());
    count1 = block_reduce<long long>(count1, 0, s.i, SumOp());
    mass0 = block_reduce(mass0, 0.0f, s.f, SumOp());
    mass1 = block_reduce(mass1, 0.0f, s.f, SumOp());
    if (filter_accepts(kind, row, count0, mass0)) return j;
    if (filter_accepts(kind, row, count1, mass1)) {
      low = pivot0;
      high = pivot1;
      q = mass0;
    } else if (pivot1 > pivot0) {
      low = pivot1;
      q = mass1;
    } else {
      low = pivot0;
      q = mass0;
    }
  }
}

template <class T>
__device__ int64_t min_p_sample(const T* x, int64_t n, int64_t stride, float min_p,
                                PhiloxStream& rng, Scratch& s) {
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, load(x, i, stride));
  mx = block_reduce(mx, -INFINITY, s.f, MaxF());
  if (!(mx > 0.0f)) return -1;
  const float thr = min_p * mx;
  auto keep = [thr](float v) { return v >= thr && v > 0.0f; };
  float q = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = load(x, i, stride);
    if (keep(v)) q += v;
  }
  q = block_reduce(q, 0.0f, s.f, SumOp());
  const float u = rng.next_uniform() * q;
  return inverse_cdf(x, n, stride, keep, u, s);
}

// Gumbel-max; each thread takes whole noise vectors (gumbel_vec_width elements, one stream
// each: session 82 moved the noise to upstream's layout, and ties to the last index).
template <class T>
__device__ int64_t gumbel_sample(const T* x, int64_t n, int64_t stride, const SamplingRow& row,
                                 uint64_t b, Scratch& s) {
  const int w = gumbel_vec_width(n);
  float best = -INFINITY;
  long long idx = -1;
  for (long long first = static_cast<long long>(threadIdx.x) * w; first < n;
       first += static_cast<long long>(blockDim.x) * w) {
    PhiloxStream rng(row.seed, gumbel_subsequence(b, n, first), row.offset);
    for (int k = 0; k < w; ++k) {
      const long long i = first + k;
      const float sc = load(x, i, stride) + gumbel_noise(rng.next_uniform());
      if (sc != sc) continue;
      if (idx < 0 || sc > best || (sc == best && i > idx)) {
        best = sc;
        idx = i;
      }
    }
  }
  // Arg-max with the largest index among equal maxima: first the max, then the max index.
  const float top = block_reduce(idx >= 0 ? best : -INFINITY, -INFINITY, s.f, MaxF());
  const long long at = block_reduce<long long>(idx >= 0 && best == top ? idx : -1, -1, s.i, MaxI());
  return top > -INFINITY && at >= 0 ? at : -1;
}

template <class T>
__global__ void __launch_bounds__(kThreads) sample_kernel(SamplingParams p) {
  __shared__ Scratch s;
  const uint64_t b = blockIdx.x;
  const SamplingRow row = sampling_row(p.rows, static_cast<int64_t>(b));
  const T* x = static_cast<const T*>(p.input) + row.src_row * p.in_stride_row;
  const int64_t n = p.vocab, st = p.in_stride_col;
  PhiloxStream rng(row.seed, b, row.offset);
  int64_t tok = -1;
  switch (p.kind) {
    case SamplingKind::kProbs:
      tok = inverse_cdf(
          x, n, st, [](float v) { return v > 0.0f; }, rng.next_uniform(), s);
      break;
    case SamplingKind::kTopK:
    case SamplingKind::kTopP:
    case SamplingKind::kTopKTopP:
      tok = rejection_sample(x, n, st, p.kind, row, rng, s);
      break;
    case SamplingKind::kMinP:
      tok = min_p_sample(x, n, st, row.min_p, rng, s);
      break;
    case SamplingKind::kLogits:
      tok = gumbel_sample(x, n, st, row, b, s);
      break;
  }
  if (threadIdx.x == 0) {
    const int64_t v = tok >= 0 ? tok : 0;
    if (p.out_dtype == DType::kInt64) {
      static_cast<int64_t*>(p.samples)[b] = v;
    } else {
      static_cast<int32_t*>(p.samples)[b] = static_cast<int32_t>(v);
    }
    p.valid[b] = tok >= 0;
  }
}

// ---- filters -----------------------------------------------------------------------------

template <class Tin, class Tout>
__global__ void __launch_bounds__(kThreads) filter_kernel(FilterParams p) {
  __shared__ Scratch s;
  const int64_t b = blockIdx.x;
  const SamplingRow row = sampling_row(p.rows, b);
  const Tin* x = static_cast<const Tin*>(p.input) + row.src_row * p.in_stride_row;
  Tout* y = static_cast<Tout*>(p.out) + b * p.out_stride_row;
  const int64_t n = p.vocab, st = p.in_stride_col;
  const bool by_mass = p.kind == FilterKind::kTopPRenorm;
  // The smallest key t with F(t) < limit, F(t) = count (top-k) or mass (top-p) above t: the
  // filter keeps exactly the keys >= t. 32 bisection steps over the key space.
  uint32_t lo = 0, hi = 0xFFFFFFFFu;
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    bool below;
    if (by_mass) {
      float f = 0.0f;
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = load(x, i, st);
        if (ordered_key(v) > mid && v > 0.0f) f += v;
      }
      below = block_reduce(f, 0.0f, s.f, SumOp()) < row.top_p;
    } else {
      long long c = 0;
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) c += ordered_key(load(x, i, st)) > mid;
      below = block_reduce<long long>(c, 0, s.i, SumOp()) < row.top_k;
    }
    if (below) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  const uint32_t t = lo;
  if (p.kind == FilterKind::kTopKMask) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = load(x, i, st);
      const uint32_t k = ordered_key(v);
      y[i * p.out_stride_col] = from_f32<Tout>(k != 0u && k >= t ? v : -INFINITY);
    }
    return;
  }
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = load(x, i, st);
    const uint32_t k = ordered_key(v);
    if (k != 0u && k >= t && v > 0.0f) sum += v;
  }
  sum = block_reduce(sum, 0.0f, s.f, SumOp());
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = load(x, i, st);
    const uint32_t k = ordered_key(v);
    const float w = v > 0.0f ? v : 0.0f;
    y[i * p.out_stride_col] = from_f32<Tout>(k != 0u && k >= t && sum > 0.0f ? w / sum : 0.0f);
  }
}

// ---- softmax -------------------------------------------------------------------------------

template <class T>
__global__ void __launch_bounds__(kThreads) softmax_kernel(SoftmaxParams p) {
  __shared__ Scratch s;
  pdl_wait();
  const int64_t b = blockIdx.x;
  const SamplingRow row = sampling_row(p.rows, b);
  const T* x = static_cast<const T*>(p.logits) + row.src_row * p.in_stride_row;
  float* y = p.out + b * p.vocab;
  const int64_t n = p.vocab, st = p.in_stride_col;
  const float temp = row.temperature;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, load(x, i, st) / temp);
  m = block_reduce(m, -INFINITY, s.f, MaxF());
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += expf(load(x, i, st) / temp - m);
  sum = block_reduce(sum, 0.0f, s.f, SumOp());
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    y[i] = expf(load(x, i, st) / temp - m) / sum;
  }
  pdl_launch_dependents();
}

void check_launch(const char* op) { FLASHINFER_CUDA_CALL(op, cudaGetLastError()); }

}  // namespace

void sample(const SamplingParams& p, void* stream) {
  if (p.batch == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "sampling", "input",
      [&]<class T>() { sample_kernel<T><<<static_cast<unsigned>(p.batch), kThreads, 0, s>>>(p); });
  check_launch("sampling");
}

void filter(const FilterParams& p, void* stream) {
  if (p.batch == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.in_dtype, "sampling", "input", [&]<class Tin>() {
        if (p.out_dtype == DType::kFloat32) {
          filter_kernel<Tin, float><<<static_cast<unsigned>(p.batch), kThreads, 0, s>>>(p);
        } else if (p.out_dtype == p.in_dtype) {
          filter_kernel<Tin, Tin><<<static_cast<unsigned>(p.batch), kThreads, 0, s>>>(p);
        } else {
          FLASHINFER_FAIL(ErrorCode::kUnsupported, "sampling", "out", "output dtype ",
                          dtype_torch_name(p.out_dtype), " is not supported for this input");
        }
      });
  check_launch("sampling");
}

void softmax(const SoftmaxParams& p, void* stream, bool enable_pdl) {
  if (p.batch == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "softmax", "input", [&]<class T>() {
        launch_kernel("softmax", softmax_kernel<T>, dim3(static_cast<unsigned>(p.batch)),
                      dim3(kThreads), 0, s, enable_pdl, p);
      });
}

}  // namespace flashinfer::kernels::cuda::sampling_oracle

namespace flashinfer::testing {

void oracle_sample(const kernels::SamplingParams& p, void* stream) {
  kernels::cuda::sampling_oracle::sample(p, stream);
}
void oracle_filter(const kernels::FilterParams& p, void* stream) {
  kernels::cuda::sampling_oracle::filter(p, stream);
}
void oracle_softmax(const kernels::SoftmaxParams& p, void* stream) {
  kernels::cuda::sampling_oracle::softmax(p, stream, false);
}

}  // namespace flashinfer::testing
