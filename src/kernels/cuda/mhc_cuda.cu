#include <cstdint>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/device/vec.cuh"
#include "kernels/cuda/mhc_cuda.h"
#include "kernels/mhc_rules.h"

namespace flashinfer::kernels::cuda {
namespace {

using mhc::kHc;
using mhc::kMix;
using Bf16x8 = dev::Vec<__nv_bfloat16, 8>;

constexpr int kPostThreads = 128;
constexpr int kPreThreads = 256;

// Eight consecutive bf16 from element i of `base` (one 128-bit load when `vec`, else guarded
// element loads up to n).
__device__ __forceinline__ void load8(const __nv_bfloat16* base, int64_t i, int64_t n, bool vec,
                                      float (&v)[8]) {
  if (vec) {
    Bf16x8 c;
    c.load(base + i);
    FLASHINFER_UNROLL
    for (int e = 0; e < 8; ++e) v[e] = __bfloat162float(c.v[e]);
    return;
  }
  FLASHINFER_UNROLL
  for (int e = 0; e < 8; ++e) v[e] = i + e < n ? __bfloat162float(base[i + e]) : 0.0f;
}

__device__ __forceinline__ void store8(__nv_bfloat16* base, int64_t i, int64_t n, bool vec,
                                       const float (&v)[8]) {
  if (vec) {
    Bf16x8 c;
    FLASHINFER_UNROLL
    for (int e = 0; e < 8; ++e) c.v[e] = __float2bfloat16_rn(v[e]);
    c.store(base + i);
    return;
  }
  FLASHINFER_UNROLL
  for (int e = 0; e < 8; ++e) {
    if (i + e < n) base[i + e] = __float2bfloat16_rn(v[e]);
  }
}

// A thread per (token, 8 hidden elements).
__global__ void __launch_bounds__(kPostThreads) mhc_post_kernel(MhcPostParams p, bool vec) {
  pdl_wait();
  const int64_t chunks = (p.H + 7) / 8;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.T * chunks) return;
  const int64_t t = c / chunks, h0 = (c % chunks) * 8;
  const auto* x = static_cast<const __nv_bfloat16*>(p.x) + t * p.H;
  const auto* res = static_cast<const __nv_bfloat16*>(p.residual) + t * kHc * p.H;
  auto* out = static_cast<__nv_bfloat16*>(p.out) + t * kHc * p.H;
  float comb[kHc * kHc], post[kHc];
  FLASHINFER_UNROLL
  for (int i = 0; i < kHc * kHc; ++i) comb[i] = p.comb[t * kHc * kHc + i];
  FLASHINFER_UNROLL
  for (int j = 0; j < kHc; ++j) post[j] = p.post[t * kHc + j];
  float xv[8], rv[kHc][8];
  load8(x, h0, p.H, vec, xv);
  FLASHINFER_UNROLL
  for (int i = 0; i < kHc; ++i) load8(res + i * p.H, h0, p.H, vec, rv[i]);
  FLASHINFER_UNROLL
  for (int j = 0; j < kHc; ++j) {
    float o[8];
    FLASHINFER_UNROLL
    for (int e = 0; e < 8; ++e) {
      const float r[kHc] = {rv[0][e], rv[1][e], rv[2][e], rv[3][e]};
      o[e] = mhc::post_element(xv[e], post[j], r, comb, j);
    }
    store8(out + j * p.H, h0, p.H, vec, o);
  }
}

// A block per token: (prenorm) the sum of squares, thread 0's mixes, then layer_input.
__global__ void __launch_bounds__(kPreThreads) mhc_pre_kernel(MhcPreParams p, bool vec) {
  pdl_wait();
  __shared__ float s_pre[kHc];
  __shared__ float s_red[32];
  const int64_t t = blockIdx.x;
  const auto* res = static_cast<const __nv_bfloat16*>(p.residual) + t * kHc * p.H;
  const int64_t n = kHc * p.H;
  float q = 0.0f;
  if (!p.sqrsum) {
    for (int64_t i = static_cast<int64_t>(threadIdx.x) * 8; i < n; i += blockDim.x * 8) {
      float v[8];
      load8(res, i, n, vec, v);
      FLASHINFER_UNROLL
      for (int e = 0; e < 8; ++e) q = fmaf(v[e], v[e], q);
    }
    q = block_reduce_sum(q, s_red);
  }
  if (threadIdx.x == 0) {
    float y[kMix];
    FLASHINFER_UNROLL
    for (int c = 0; c < kMix; ++c) y[c] = 0.0f;
    float qs = 0.0f;
    for (int64_t s = 0; s < p.num_splits; ++s) {
      FLASHINFER_UNROLL
      for (int c = 0; c < kMix; ++c) y[c] += p.dot_mix[(s * p.T + t) * kMix + c];
      if (p.sqrsum) qs += p.sqrsum[s * p.T + t];
    }
    if (!p.sqrsum) qs = q;
    float pre[kHc], post[kHc], comb[kHc * kHc];
    mhc::pre_mixes(y, qs, p.k, p.scale, p.base, p.rms_eps, p.pre_eps, p.sinkhorn_eps, p.post_mult,
                   p.sinkhorn_repeat, pre, post, comb);
    FLASHINFER_UNROLL
    for (int c = 0; c < kHc; ++c) {
      s_pre[c] = pre[c];
      p.post_mix[t * kHc + c] = post[c];
    }
    FLASHINFER_UNROLL
    for (int c = 0; c < kHc * kHc; ++c) p.comb_mix[t * kHc * kHc + c] = comb[c];
  }
  __syncthreads();
  const float pre[kHc] = {s_pre[0], s_pre[1], s_pre[2], s_pre[3]};
  auto* li = static_cast<__nv_bfloat16*>(p.layer_input) + t * p.H;
  for (int64_t h0 = static_cast<int64_t>(threadIdx.x) * 8; h0 < p.H; h0 += blockDim.x * 8) {
    float rv[kHc][8], o[8];
    FLASHINFER_UNROLL
    for (int i = 0; i < kHc; ++i) load8(res + i * p.H, h0, p.H, vec, rv[i]);
    FLASHINFER_UNROLL
    for (int e = 0; e < 8; ++e) {
      const float r[kHc] = {rv[0][e], rv[1][e], rv[2][e], rv[3][e]};
      o[e] = mhc::layer_input_element(pre, r);
    }
    store8(li, h0, p.H, vec, o);
  }
}

bool ptr_aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

void mhc_post(const MhcPostParams& p, void* stream, bool enable_pdl) {
  if (p.T == 0 || p.H == 0) return;
  const int64_t work = p.T * ((p.H + 7) / 8);
  const int64_t blocks = (work + kPostThreads - 1) / kPostThreads;
  FLASHINFER_CHECK(blocks <= 0x7fffffff, "mhc_post", "residual", "too many tokens: ", p.T);
  const bool vec =
      p.H % 8 == 0 && ptr_aligned16(p.x) && ptr_aligned16(p.residual) && ptr_aligned16(p.out);
  launch_kernel("mhc_post", mhc_post_kernel, dim3(static_cast<unsigned>(blocks)),
                dim3(kPostThreads), 0, static_cast<cudaStream_t>(stream), enable_pdl, p, vec);
}

void mhc_pre_big_fuse(const MhcPreParams& p, void* stream, bool enable_pdl) {
  if (p.T == 0) return;
  FLASHINFER_CHECK(p.T <= 0x7fffffff, "mhc_pre_big_fuse", "residual", "too many tokens: ", p.T);
  const bool vec = p.H % 8 == 0 && ptr_aligned16(p.residual) && ptr_aligned16(p.layer_input);
  launch_kernel("mhc_pre_big_fuse", mhc_pre_kernel, dim3(static_cast<unsigned>(p.T)),
                dim3(kPreThreads), 0, static_cast<cudaStream_t>(stream), enable_pdl, p, vec);
}

}  // namespace flashinfer::kernels::cuda
