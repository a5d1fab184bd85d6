#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/spec_sampling_cuda.h"
#include "kernels/sampling_rules.h"
#include "kernels/spec_sampling_rules.h"

namespace flashinfer::kernels::cuda {
namespace {

// Inclusive prefix of v over the block's kSpecThreads threads in spec_chunk_scan's order (warp
// Kogge-Stone scans, then the same over the warp totals); *total is the chunk's sum. Ends with a
// barrier, so wt can be reused by the next call.
__device__ __forceinline__ float block_chunk_scan(float v, float* wt, float* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const float t = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v = __fadd_rn(t, v);
  }
  if (lane == 31) wt[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float x = lane < kSpecWarps ? wt[lane] : 0.0f;
#pragma unroll
    for (int off = 1; off < kSpecWarps; off *= 2) {
      const float t = __shfl_up_sync(0xffffffffu, x, off);
      if (lane >= off) x = __fadd_rn(t, x);
    }
    if (lane < kSpecWarps) wt[lane] = x;
  }
  __syncthreads();
  if (warp > 0) v = __fadd_rn(wt[warp - 1], v);
  *total = wt[kSpecWarps - 1];
  __syncthreads();
  return v;
}

template <class T, class Id>
__global__ void __launch_bounds__(kSpecThreads) chain_spec_kernel(ChainSpecParams p) {
  pdl_wait();
  const int64_t b = blockIdx.x, n = p.n, V = p.vocab;
  const T* dp = static_cast<const T*>(p.draft_probs);
  const T* tp = static_cast<const T*>(p.target_probs);
  const Id* ids = static_cast<const Id*>(p.draft_ids);
  Id* out = static_cast<Id*>(p.out_ids);
  __shared__ float wt[kSpecWarps];
  __shared__ float s_uniform;
  __shared__ int64_t s_pos;
  __shared__ int s_first;
  __shared__ long long s_last;

  // The acceptance chain: sequential, a few draws, one thread (the CPU reference's order).
  if (threadIdx.x == 0) {
    // The k-th draw of the request's stream, as PhiloxStream's k-th next_uniform() on the CPU
    // (computed per draw: a stream object's buffered block would live in local memory).
    const uint64_t seed = static_cast<uint64_t>(row_arg_int(p.seed, b));
    uint64_t draw = static_cast<uint64_t>(row_arg_int(p.offset, b));
    auto next_uniform = [&] { return philox_uniform_at(seed, static_cast<uint64_t>(b), draw++); };
    const int64_t pos = spec_accept_chain(
        n, ids + b * n,
        [&](int64_t i) {
          const int64_t d = spec_draft_column(ids[b * n + i], V);
          return SpecProbs{to_f32(dp[(b * n + i) * V + d]), to_f32(tp[(b * (n + 1) + i) * V + d])};
        },
        next_uniform, out + b * (n + 1), static_cast<Id*>(p.accepted) + b,
        static_cast<Id*>(p.emitted) + b);
    s_uniform = next_uniform();
    s_pos = pos;
    s_first = kSpecThreads;
    s_last = -1;
  }
  __syncthreads();
  const int64_t pos = s_pos;
  const T* q = tp + (b * (n + 1) + pos) * V;
  const T* pd = pos < n ? dp + (b * n + pos) * V : nullptr;
  auto mass = [&](int64_t j) {
    return j < V ? spec_residual_mass(to_f32(q[j]), pd ? to_f32(pd[j]) : 0.0f) : 0.0f;
  };

  // Pass 1: the residual's sum, chunk by chunk.
  float sum = 0.0f, total = 0.0f;
  for (int64_t c0 = 0; c0 < V; c0 += kSpecThreads) {
    block_chunk_scan(mass(c0 + threadIdx.x), wt, &total);
    sum = __fadd_rn(sum, total);
  }
  const float u = __fmul_rn(s_uniform, sum);

  // Pass 2: the first column whose running prefix passes u.
  float running = 0.0f;
  long long last = -1;
  int64_t tok = -1;
  for (int64_t c0 = 0; c0 < V; c0 += kSpecThreads) {
    const int64_t j = c0 + threadIdx.x;
    const float m = mass(j);
    const float pre = block_chunk_scan(m, wt, &total);
    if (m > 0.0f) {
      last = j;
      if (__fadd_rn(running, pre) > u) atomicMin(&s_first, static_cast<int>(threadIdx.x));
    }
    __syncthreads();
    if (s_first < kSpecThreads) {
      tok = c0 + s_first;
      break;
    }
    running = __fadd_rn(running, total);
  }
  if (tok < 0) {
    if (last >= 0) atomicMax(&s_last, last);
    __syncthreads();
    tok = s_last >= 0 ? s_last : 0;
  }
  if (threadIdx.x == 0) out[b * (n + 1) + pos] = static_cast<Id>(tok);
}

}  // namespace

void chain_speculative_sampling(const ChainSpecParams& p, void* stream, bool enable_pdl) {
  if (p.batch == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "chain_speculative_sampling", "draft_probs", [&]<class T>() {
        if (p.id_dtype == DType::kInt64) {
          launch_kernel("chain_speculative_sampling", chain_spec_kernel<T, int64_t>,
                        dim3(static_cast<unsigned>(p.batch)), dim3(kSpecThreads), 0, s, enable_pdl,
                        p);
        } else {
          launch_kernel("chain_speculative_sampling", chain_spec_kernel<T, int32_t>,
                        dim3(static_cast<unsigned>(p.batch)), dim3(kSpecThreads), 0, s, enable_pdl,
                        p);
        }
      });
}

}  // namespace flashinfer::kernels::cuda
