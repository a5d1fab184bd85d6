// mono_moe on CUDA: three kernels in stream order, the caller's scratchpad between them
// (kernels/monomoe_params.h, MonoMoeScratch). 1. routing and the input's quantization (one
// block); 2. up projection, SiLU and re-quantization, a block per (active expert, 64-wide group
// of the intermediate), its weight rows read once for every token routed there; 3. down
// projection and the combine, a block per 16 output columns, each warp walking the active
// experts in the combine's fixed order (no atomics: the result is the CPU reference's, bit for
// bit). fp8 x fp8 block dot products are exact integer sums (warp-reduced in any order), every
// fp32 step rounded once as the CPU rounds it.
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/device/host_device.h"
#include "kernels/cuda/monomoe_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

using P = MonoMoeParams;
using S = MonoMoeScratch;
constexpr const char* kMonoOp = "mono_moe";
constexpr unsigned kFull = 0xffffffffu;
constexpr int kMonoThreads = 256, kMonoWarps = kMonoThreads / 32;
constexpr int kDownCols = 16;  // output columns a block of the down kernel (2 a warp)

__device__ __forceinline__ uint8_t e4m3(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// The fixed-point products of four code pairs packed in a and b, summed; nan set where one is.
__device__ __forceinline__ int64_t dot4(uint32_t a, uint32_t b, bool& nan) {
  int64_t s = 0;
  FLASHINFER_UNROLL
  for (int i = 0; i < 4; ++i) {
    const auto ca = static_cast<uint8_t>(a >> (8 * i)), cb = static_cast<uint8_t>(b >> (8 * i));
    s += static_cast<int64_t>(monomoe_e4m3_fixed(ca)) * monomoe_e4m3_fixed(cb);
    nan = nan || monomoe_e4m3_is_nan(ca) || monomoe_e4m3_is_nan(cb);
  }
  return s;
}

__device__ __forceinline__ int64_t dot16(const uint4& a, const uint4& b, bool& nan) {
  return dot4(a.x, b.x, nan) + dot4(a.y, b.y, nan) + dot4(a.z, b.z, nan) + dot4(a.w, b.w, nan);
}

// 1. One block: the routing (a thread a token: upstream's per-warp selection rules, serially),
// the input's 1 x 128 quantization (a warp a block of 128), then the active expert list.
__global__ void __launch_bounds__(kMonoThreads) monomoe_route_quant_kernel(P p) {
  int32_t* ids = reinterpret_cast<int32_t*>(p.scratch + S::kIds);
  float* rw = reinterpret_cast<float*>(p.scratch + S::kRw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid < p.M) {
    const uint16_t* row = p.logits + tid * P::kE;
    monomoe_route([row](int i) { return monomoe_logit(row[i]); }, p.top_k, p.softmax, p.renormalize,
                  ids + tid * p.top_k, rw + tid * p.top_k);
  }
  uint8_t* qx = p.scratch + S::kQx;
  float* xs = reinterpret_cast<float*>(p.scratch + S::kXs);
  for (int64_t blk = warp; blk < p.M * P::kKBlocks; blk += kMonoWarps) {
    const int64_t t = blk / P::kKBlocks, kb = blk % P::kKBlocks;
    const int64_t off = t * P::kK + kb * P::kBlock + lane * 4;
    const uint2 raw = *reinterpret_cast<const uint2*>(p.x + off);
    float v[4] = {monomoe_input_value(static_cast<uint16_t>(raw.x)),
                  monomoe_input_value(static_cast<uint16_t>(raw.x >> 16)),
                  monomoe_input_value(static_cast<uint16_t>(raw.y)),
                  monomoe_input_value(static_cast<uint16_t>(raw.y >> 16))};
    float amax = 0.0f;
    FLASHINFER_UNROLL
    for (int i = 0; i < 4; ++i) amax = fp32_abs_max(amax, v[i]);
    FLASHINFER_UNROLL
    for (int o = 16; o >= 1; o /= 2) {  // a max: any order gives the same (no NaN after the mask)
      const float other = __shfl_xor_sync(kFull, amax, o);
      amax = other > amax ? other : amax;
    }
    amax = monomoe_amax_floor(amax);
    const float mult = monomoe_group_mult(amax);
    uint32_t packed = 0;
    FLASHINFER_UNROLL
    for (int i = 0; i < 4; ++i)
      packed |= static_cast<uint32_t>(e4m3(fp32_mul(v[i], mult))) << (8 * i);
    *reinterpret_cast<uint32_t*>(qx + off) = packed;
    if (lane == 0) xs[t * P::kKBlocks + kb] = monomoe_group_scale(amax);
  }
  __syncthreads();
  if (tid == 0) {  // the distinct choices, ascending (at most 64 of 256)
    uint32_t used[P::kE / 32] = {};
    for (int64_t i = 0; i < p.M * p.top_k; ++i) used[ids[i] / 32] |= 1u << (ids[i] % 32);
    int32_t* active = reinterpret_cast<int32_t*>(p.scratch + S::kActive);
    int32_t n = 0;
    for (int32_t e = 0; e < P::kE; ++e) {
      if ((used[e / 32] >> (e % 32)) & 1u) active[n++] = e;
    }
    *reinterpret_cast<int32_t*>(p.scratch + S::kCount) = n;
  }
}

// 2. Block (i, g): active expert i, intermediate columns [64 g, 64 g + 64): its 64 gate and 64
// up rows (a warp 16 of them), each row's 16 K blocks dotted with every routed token's input;
// then v = rw SiLU(gate) up and the group's fp8 re-quantization per routed token.
__global__ void __launch_bounds__(kMonoThreads) monomoe_up_kernel(P p) {
  const int32_t count = *reinterpret_cast<const int32_t*>(p.scratch + S::kCount);
  const int i = blockIdx.x, g = blockIdx.y;
  if (i >= count) return;
  const int64_t e = reinterpret_cast<const int32_t*>(p.scratch + S::kActive)[i];
  const int32_t* ids = reinterpret_cast<const int32_t*>(p.scratch + S::kIds);
  const float* rw = reinterpret_cast<const float*>(p.scratch + S::kRw);
  __shared__ __align__(16) uint8_t qx_s[P::kMaxTokens * P::kK];
  __shared__ float xs_s[P::kMaxTokens * P::kKBlocks];
  __shared__ float acc_s[2][P::kMaxTokens][P::kActGroup];
  __shared__ int32_t pair_s[P::kMaxTokens];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int M = static_cast<int>(p.M);
  for (int64_t o = tid; o < p.M * P::kK / 16; o += kMonoThreads) {
    reinterpret_cast<uint4*>(qx_s)[o] = reinterpret_cast<const uint4*>(p.scratch + S::kQx)[o];
  }
  for (int64_t o = tid; o < p.M * P::kKBlocks; o += kMonoThreads) {
    xs_s[o] = reinterpret_cast<const float*>(p.scratch + S::kXs)[o];
  }
  if (tid < P::kMaxTokens) {
    int32_t pr = -1;
    for (int64_t k = 0; tid < M && k < p.top_k; ++k) {
      if (ids[tid * p.top_k + k] == e) pr = static_cast<int32_t>(tid * p.top_k + k);
    }
    pair_s[tid] = pr;
  }
  __syncthreads();
  const uint8_t* wu = p.w_up + e * 2 * P::kN * P::kK;
  const float* su = p.s_up + e * (2 * P::kN / P::kBlock) * P::kKBlocks;
  for (int r = warp; r < 2 * P::kActGroup; r += kMonoWarps) {
    const int h = r / P::kActGroup, jj = r % P::kActGroup;
    const int64_t j = g * P::kActGroup + jj;
    const uint8_t* w = wu + monomoe_up_row(h, j, P::kN, p.up_interleaved) * P::kK;
    const float* ws = su + (h * P::kNBlocks + j / P::kBlock) * P::kKBlocks;
    float acc[P::kMaxTokens];
    FLASHINFER_UNROLL
    for (int t = 0; t < P::kMaxTokens; ++t) acc[t] = 0.0f;
    for (int kb = 0; kb < P::kKBlocks; ++kb) {
      const int64_t k0 = kb * P::kBlock + lane * 4;
      const uint32_t wv = *reinterpret_cast<const uint32_t*>(w + k0);
      FLASHINFER_UNROLL
      for (int t = 0; t < P::kMaxTokens; ++t) {
        if (t >= M || pair_s[t] < 0) continue;  // uniform across the warp
        bool nan = false;
        int64_t s = dot4(wv, *reinterpret_cast<const uint32_t*>(qx_s + t * P::kK + k0), nan);
        FLASHINFER_UNROLL
        for (int o = 16; o >= 1; o /= 2) s += __shfl_xor_sync(kFull, s, o);  // exact in any order
        nan = __any_sync(kFull, nan);
        acc[t] =
            monomoe_up_step(acc[t], monomoe_dot_to_f32(s, nan), ws[kb], xs_s[t * P::kKBlocks + kb]);
      }
    }
    if (lane == 0) {
      FLASHINFER_UNROLL
      for (int t = 0; t < P::kMaxTokens; ++t) acc_s[h][t][jj] = acc[t];
    }
  }
  __syncthreads();
  // Warp t re-quantizes token t's 64 values (2 a lane), if the token routes here.
  if (warp < M && pair_s[warp] >= 0) {
    const int t = warp, pr = pair_s[t];
    const float v0 = monomoe_silu_weighted(rw[pr], acc_s[0][t][lane], acc_s[1][t][lane]);
    const float v1 = monomoe_silu_weighted(rw[pr], acc_s[0][t][lane + 32], acc_s[1][t][lane + 32]);
    float m = fp32_abs_max(fp32_abs_max(0.0f, v0), v1);
    FLASHINFER_UNROLL
    for (int o = 16; o >= 1; o /= 2) {  // never NaN: fp32_abs_max skips NaN values
      const float other = __shfl_xor_sync(kFull, m, o);
      m = other > m ? other : m;
    }
    m = monomoe_amax_floor(m);
    const float mult = monomoe_group_mult(m);
    uint8_t* iq = p.scratch + S::kIq + static_cast<int64_t>(pr) * P::kN + g * P::kActGroup;
    iq[lane] = e4m3(fp32_mul(v0, mult));
    iq[lane + 32] = e4m3(fp32_mul(v1, mult));
    if (lane == 0) {
      reinterpret_cast<float*>(p.scratch + S::kIs)[pr * P::kNGroups + g] = monomoe_interm_scale(m);
    }
  }
}

// 3. Block b: output columns [16 b, 16 b + 16), 2 a warp. For a column, the warp walks the
// active experts group by group (index % 16, ascending within), reads the expert's weight row
// once (16 bytes a lane: lane l covers N [16 l, 16 l + 16), so 4 lanes make one 64-wide half)
// and dots it with each routed token's intermediate; the sums then follow the combine's order.
__global__ void __launch_bounds__(kMonoThreads) monomoe_down_kernel(P p) {
  const int32_t count = *reinterpret_cast<const int32_t*>(p.scratch + S::kCount);
  const int32_t* active = reinterpret_cast<const int32_t*>(p.scratch + S::kActive);
  const int32_t* ids = reinterpret_cast<const int32_t*>(p.scratch + S::kIds);
  constexpr int kPairs = P::kMaxTokens * P::kMaxTopK;
  __shared__ __align__(16) uint8_t iq_s[kPairs * P::kN];
  __shared__ float is_s[kPairs * P::kNGroups];
  __shared__ int8_t route_s[kPairs][P::kMaxTokens];  // [active index][token]: pair, or -1
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int M = static_cast<int>(p.M), TK = static_cast<int>(p.top_k);
  for (int o = tid; o < M * TK * P::kN / 16; o += kMonoThreads) {
    reinterpret_cast<uint4*>(iq_s)[o] = reinterpret_cast<const uint4*>(p.scratch + S::kIq)[o];
  }
  for (int o = tid; o < M * TK * P::kNGroups; o += kMonoThreads) {
    is_s[o] = reinterpret_cast<const float*>(p.scratch + S::kIs)[o];
  }
  for (int o = tid; o < count * P::kMaxTokens; o += kMonoThreads) {
    const int ai = o / P::kMaxTokens, t = o % P::kMaxTokens;
    int pr = -1;
    for (int k = 0; t < M && k < TK; ++k) {
      if (ids[t * TK + k] == active[ai]) pr = t * TK + k;
    }
    route_s[ai][t] = static_cast<int8_t>(pr);
  }
  __syncthreads();
  for (int cc = 0; cc < kDownCols / kMonoWarps; ++cc) {
    const int64_t c =
        static_cast<int64_t>(blockIdx.x) * kDownCols + warp * (kDownCols / kMonoWarps) + cc;
    float total[P::kMaxTokens];
    FLASHINFER_UNROLL
    for (int t = 0; t < P::kMaxTokens; ++t) total[t] = 0.0f;
    for (int g = 0; g < P::kCombineGroups; ++g) {
      float part[P::kMaxTokens];
      FLASHINFER_UNROLL
      for (int t = 0; t < P::kMaxTokens; ++t) part[t] = 0.0f;
      for (int ai = g; ai < count; ai += P::kCombineGroups) {
        const int64_t e = active[ai];
        const uint4 wv = reinterpret_cast<const uint4*>(p.w_down + (e * P::kK + c) * P::kN)[lane];
        const float* sd = p.s_down + (e * (P::kK / P::kBlock) + c / P::kBlock) * P::kNBlocks;
        FLASHINFER_UNROLL
        for (int t = 0; t < P::kMaxTokens; ++t) {
          const int pr = t < M ? route_s[ai][t] : -1;
          if (pr < 0) continue;  // uniform across the warp
          bool nan = false;
          int64_t s = dot16(wv, reinterpret_cast<const uint4*>(iq_s + pr * P::kN)[lane], nan);
          s += __shfl_xor_sync(kFull, s, 1);
          s += __shfl_xor_sync(kFull, s, 2);
          int nn = nan ? 1 : 0;
          nn |= __shfl_xor_sync(kFull, nn, 1);
          nn |= __shfl_xor_sync(kFull, nn, 2);
          const float f = monomoe_dot_to_f32(s, nn != 0);  // lane 4 q: half q of the row
          float y = 0.0f;
          FLASHINFER_UNROLL
          for (int nb = 0; nb < P::kNBlocks; ++nb) {
            const float lo = __shfl_sync(kFull, f, 8 * nb), hi = __shfl_sync(kFull, f, 8 * nb + 4);
            y = monomoe_down_step(y, lo, hi, is_s[pr * P::kNGroups + 2 * nb],
                                  is_s[pr * P::kNGroups + 2 * nb + 1], sd[nb]);
          }
          part[t] = fp32_add(part[t], y);
        }
      }
      FLASHINFER_UNROLL
      for (int t = 0; t < P::kMaxTokens; ++t) total[t] = fp32_add(total[t], part[t]);
    }
    if (lane == 0) {
      for (int t = 0; t < M; ++t) p.out[t * P::kK + c] = monomoe_bf16_bits(total[t]);
    }
  }
}

}  // namespace

void mono_moe(const MonoMoeParams& p, void* stream) {
  if (p.M == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  launch_kernel(kMonoOp, monomoe_route_quant_kernel, dim3(1), dim3(kMonoThreads), 0, s, false, p);
  launch_kernel(kMonoOp, monomoe_up_kernel,
                dim3(static_cast<unsigned>(p.M * p.top_k), static_cast<unsigned>(P::kNGroups)),
                dim3(kMonoThreads), 0, s, false, p);
  launch_kernel(kMonoOp, monomoe_down_kernel, dim3(static_cast<unsigned>(P::kK / kDownCols)),
                dim3(kMonoThreads), 0, s, false, p);
}

}  // namespace flashinfer::kernels::cuda
