// CUDA kernels for DeepSeek MLA attention over the paged latent cache (CUDA cores, fp32
// accumulation). Semantics are the CPU reference's (kernels/cpu/mla_cpu.cpp): the same score
// formula, empty rows give 0 and LSE -inf, the LSE in base 2 unless asked for base e.
//
// Two attention kernels; the launcher picks one per call:
//   - mla_decode_kernel: DeepSeek's shape (head_dim_ckv 512, head_dim_kpe 64), an fp16 / bf16 /
//     fp8 cache, every q / ckv / kpe / o row 16-byte aligned. Built on the device library
//     (kernels/cuda/device) the way the GQA decode kernel is (attention_decode_kernel.cuh). Block
//     per (query row, group of up to 16 heads, KV split), one warp per two heads. The latent row
//     is the key and the value at once, so the block copies each stage of kDecTokens cache tokens
//     (ckv and kpe) page -> shared memory once for all of its heads, with 16-byte cp.async in
//     kDecStages stages (one commit group per stage), and keeps it in the cache's dtype until the
//     FMA. The page table is read once per kDecCache tokens into shared memory as element
//     offsets. Lane l owns the 16-byte units l, l + 32, ... of the ckv row (16 dims) and 2 dims
//     of kpe; it holds those dims of its heads' queries (pre-scaled) and of their 512-wide
//     accumulators in registers. A score is a warp sum; the online softmax is base 2.
//   - mla_attention_kernel: everything else (other dims, fp32 caches, unaligned rows). Block per
//     (query row, group of up to 8 heads, KV split), one warp per head, tokens staged in shared
//     memory as fp32, element-wise loads.
// When the grid would leave the GPU idle (few rows and heads, long caches) the KV axis is split
// and mla_merge_kernel combines the partial states (m in log2 units, l, the unnormalized o).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "core/env_switch.h"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/device/cp_async.cuh"
#include "kernels/cuda/device/fastdiv.cuh"
#include "kernels/cuda/device/fp8_widen.cuh"
#include "kernels/cuda/device/mma.cuh"
#include "kernels/cuda/device/permuted_smem.cuh"
#include "kernels/cuda/device/softmax_state.cuh"
#include "kernels/cuda/device/vec.cuh"
#include "kernels/cuda/mla_cuda.h"
#include "kernels/cuda/mla_kernel_common.cuh"
#include "kernels/cuda/mla_shape.h"
#include "kernels/cuda/mla_sm90.h"
#include "kernels/cuda/prefill_shape.h"
#include "kernels/cuda/vec_cuda.cuh"
#include "kernels/mla_page_guard.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kMaxHeadsPerBlock = 8;            // fallback: warps per block, one head each
constexpr int kTile = 16;                       // fallback: cache tokens staged per step
constexpr int kCkvPerLane = 16;                 // dim_ckv <= 32 * 16 = 512 (registers)
constexpr int kMaxSplits = mla::kMlaMaxSplits;  // KV splits per row at most (mla_kv_split)

// The decode kernel's shape (see the top of the file).
constexpr int kDecCkv = 512, kDecKpe = 64, kDecRow = kDecCkv + kDecKpe;  // dims
constexpr int kDecHeadsPerWarp = 2;
constexpr int kDecMaxWarps = 8;
constexpr int kDecTokens = 16;  // cache tokens per pipeline stage
constexpr int kDecStages = 2;   // stages in flight (one cp.async group each)
constexpr int kDecSub = 8;      // tokens per online-softmax update
constexpr int kDecFill = 4;     // stages per page-offset refill: a power of two >= kDecStages
constexpr int kDecCache = kDecTokens * kDecFill;  // tokens whose offsets are cached
constexpr int kDecCkvLane = kDecCkv / kWarp;      // ckv dims a lane owns: 16
constexpr int kDecKpeLane = kDecKpe / kWarp;      // kpe dims a lane owns: 2
static_assert(kDecTokens % kDecSub == 0 && kTile == kDecTokens, "split chunks fit both kernels");
static_assert((kDecFill & (kDecFill - 1)) == 0 && kDecFill >= kDecStages, "offset refill period");
static_assert(kDecCkvLane == kCkvPerLane && kDecKpeLane == 2, "lane ownership");

__device__ __forceinline__ float warp_reduce_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// ---- fallback kernel -------------------------------------------------------------------------

// Grid (rows, head groups, splits), blockDim 32 * G. Split z covers tokens [z * chunk, (z + 1)
// * chunk) of the row's visible range. part_o == nullptr: one split, the final output is written
// here; otherwise the unnormalized accumulator and (m * log2 e, l) go to the partials for the
// merge (the decode kernel's base-2 state).
template <class KV>
__global__ void __launch_bounds__(kWarp* kMaxHeadsPerBlock)
    mla_attention_kernel(MlaAttentionParams p, int64_t chunk, float* part_o, float* part_ml) {
  extern __shared__ float smem[];
  const int dc = p.dim_ckv, dk = p.dim_kpe, W = dc + dk;
  const int G = static_cast<int>(blockDim.x) / kWarp;
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  float* q_s = smem;           // [G][W]: this block's heads' queries
  float* kv_s = smem + G * W;  // [kTile][W]: the staged cache tokens
  const int64_t row = blockIdx.x;
  const int h = static_cast<int>(blockIdx.y) * G + warp;
  const bool head_ok = h < p.num_heads;
  pdl_wait();
  if (p.row_req[row] < 0) return;  // a request the device-side plan refused (block-uniform)
  if (p.max_kv_dev != nullptr) {
    chunk = mla::mla_device_chunk(*p.max_kv_dev, gridDim.z, kTile, chunk);
  }
  const float sm_scale = mla_sm_scale(p), out_scale = mla_out_scale(p);
  const RowSpan span = row_span(p, row);
  const int64_t begin = static_cast<int64_t>(blockIdx.z) * chunk;
  const int64_t stop = min(span.end, begin + chunk);
  if (part_o != nullptr && stop <= begin) {  // a split past the row's keys: its empty state only
    for (int hh = static_cast<int>(threadIdx.x); hh < G; hh += static_cast<int>(blockDim.x)) {
      const int hb = static_cast<int>(blockIdx.y) * G + hh;
      if (hb < p.num_heads) write_empty_state(p, row, hb, part_ml);
    }
    return;  // block-uniform, before any barrier
  }

  if (head_ok) {
    float* q = q_s + warp * W;
    for (int d = lane; d < dc; d += kWarp) {
      q[d] = load_any(p.q_nope, row * p.qn_stride_n + h * p.qn_stride_h + d, p.q_dtype);
    }
    for (int d = lane; d < dk; d += kWarp) {
      q[dc + d] = load_any(p.q_pe, row * p.qp_stride_n + h * p.qp_stride_h + d, p.q_dtype);
    }
  }

  float acc[kCkvPerLane];
#pragma unroll
  for (int i = 0; i < kCkvPerLane; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const int32_t* pages = p.kv_indices + p.kv_indptr[span.b];
  const KV* ckv = static_cast<const KV*>(p.ckv);
  const KV* kpe = static_cast<const KV*>(p.kpe);

  // Every thread runs the same trip count (begin/stop are block-uniform): the barriers match.
  for (int64_t t0 = begin; t0 < stop; t0 += kTile) {
    const int n = static_cast<int>(stop - t0 < kTile ? stop - t0 : int64_t{kTile});
    __syncthreads();  // the previous tile is consumed (and, first time, q_s is written)
    for (int t = warp; t < n; t += G) {
      const int64_t tok = t0 + t;
      const int64_t page = pages[tok / p.page_size], slot = tok % p.page_size;
      const KV* cr = ckv + page * p.ckv_stride_page + slot * p.ckv_stride_token;
      const KV* kr = kpe + page * p.kpe_stride_page + slot * p.kpe_stride_token;
      float* dst = kv_s + t * W;
      if (p.ckv_scale_arr != nullptr) {
        // Each value times its 128 channels' scale, rounded to q's dtype (the CPU reference's
        // dequantization); ckv_scale is 1.
        const float* sc = p.ckv_scale_arr + (page * p.page_size + slot) * (dc / 128);
        for (int d = lane; d < dc; d += kWarp) {
          dst[d] = round_to_dtype(to_f32(cr[d]) * sc[d / 128], p.q_dtype);
        }
      } else {
        for (int d = lane; d < dc; d += kWarp) dst[d] = to_f32(cr[d]);
      }
      for (int d = lane; d < dk; d += kWarp) dst[dc + d] = to_f32(kr[d]);
    }
    __syncthreads();
    if (!head_ok) continue;
    const float* q = q_s + warp * W;
    float s[kTile];
    float tile_max = -INFINITY;
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
      s[t] = -INFINITY;
      if (t < n) {  // warp-uniform: the shuffles below see the full warp
        const float* k = kv_s + t * W;
        float a = 0.0f, c = 0.0f;
        for (int d = lane; d < dc; d += kWarp) a += q[d] * k[d];
        for (int d = lane; d < dk; d += kWarp) c += q[dc + d] * k[dc + d];
        s[t] = sm_scale * warp_reduce_sum(p.ckv_scale * a + p.kpe_scale * c);
        tile_max = fmaxf(tile_max, s[t]);
      }
    }
    const float m_new = fmaxf(m, tile_max);
    if (m_new == -INFINITY) continue;     // all scores -inf so far: weights stay 0 (CPU rule)
    const float alpha = expf(m - m_new);  // 0 on the first finite tile (m == -inf)
    l *= alpha;
#pragma unroll
    for (int i = 0; i < kCkvPerLane; ++i) acc[i] *= alpha;
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
      if (t < n) {
        const float w = expf(s[t] - m_new);
        l += w;
        const float* k = kv_s + t * W;
#pragma unroll
        for (int i = 0; i < kCkvPerLane; ++i) {
          const int d = lane + i * kWarp;
          if (d < dc) acc[i] += w * k[d];
        }
      }
    }
    m = m_new;
  }
  if (!head_ok) return;  // no barrier below

  if (part_o == nullptr) {
    // Nothing visible (end == 0) also leaves l == 0.
    const bool empty = l == 0.0f;
    const float f = empty ? 0.0f : out_scale * p.ckv_scale / l;
    const int64_t off = row * p.o_stride_n + h * p.o_stride_h;
#pragma unroll
    for (int i = 0; i < kCkvPerLane; ++i) {
      const int d = lane + i * kWarp;
      if (d < dc) store_any(p.o, off + d, p.o_dtype, empty ? 0.0f : acc[i] * f);
    }
    if (p.lse != nullptr && lane == 0) {
      float v = -INFINITY;
      if (!empty) {
        v = m + logf(l);
        if (!p.lse_base_e) v *= kMlaLog2e;
      }
      p.lse[row * p.lse_stride_n + h * p.lse_stride_h] = v;
    }
    return;
  }
  const int64_t state = (static_cast<int64_t>(blockIdx.z) * p.rows + row) * p.num_heads + h;
  float* po = part_o + state * dc;
#pragma unroll
  for (int i = 0; i < kCkvPerLane; ++i) {
    const int d = lane + i * kWarp;
    if (d < dc) po[d] = acc[i];
  }
  if (lane == 0) {
    part_ml[2 * state] = m * kMlaLog2e;  // -inf stays -inf
    part_ml[2 * state + 1] = l;
  }
}

// ---- decode kernel (dim_ckv 512, dim_kpe 64) -------------------------------------------------
//
// Lane ownership, for a cache of E-byte elements (kChunk = 16 / E elements per 16-byte unit):
// lane l owns the ckv dims of the units u * 32 + l, u < 16 / kChunk (register i = u * kChunk + e
// holds dim (u * 32 + l) * kChunk + e), and the kpe dims 2 l and 2 l + 1. The query, the
// accumulator and the output use the same map, so a lane never needs another lane's dims.

// This lane's ckv dims of one cache row (shared memory) as fp32: 128-bit loads.
template <class T, int kChunk>
__device__ __forceinline__ void dec_load_ckv(const T* row, int lane, float* out) {
#pragma unroll
  for (int u = 0; u < kDecCkvLane / kChunk; ++u) {
    dev::load_f32<T, kChunk>(row + (u * kWarp + lane) * kChunk, out + u * kChunk);
  }
}

// dec_load_ckv for the second read of a row in dec_attend: ld.volatile, which the compiler may
// not merge with the first read of the same address. Merged, the kDecSub widened rows of the
// score loop (16 * kDecSub floats a lane) would stay live across the softmax update and spill;
// reading shared memory again is cheaper.
template <class T, int kChunk>
__device__ __forceinline__ void dec_reload_ckv(const T* row, int lane, float* out) {
#pragma unroll
  for (int u = 0; u < kDecCkvLane / kChunk; ++u) {
    dev::Vec<T, kChunk> x;
    static_assert(sizeof(x) == sizeof(uint4), "one 16-byte unit");
    uint4 w;
    asm volatile("ld.volatile.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w)
                 : "r"(dev::cp_async::smem_addr(row + (u * kWarp + lane) * kChunk))
                 : "memory");
    *reinterpret_cast<uint4*>(x.v) = w;
    dev::widen<kChunk>(x.v, out + u * kChunk);
  }
}

// This lane's query dims of head h (global memory), widened: kChunk or 4 elements an access, at
// least 4 bytes each (no 8- or 16-bit global loads), aligned as the launcher checked. For q_pe,
// lanes 2i and 2i + 1 both load dims 4i .. 4i + 3 and keep their own pair.
template <class TQ, int kChunk>
__device__ __forceinline__ void dec_load_q_as(const MlaAttentionParams& p, int64_t row, int h,
                                              int lane, float* qn, float* qp) {
  const TQ* n = static_cast<const TQ*>(p.q_nope) + row * p.qn_stride_n + h * p.qn_stride_h;
  const TQ* e = static_cast<const TQ*>(p.q_pe) + row * p.qp_stride_n + h * p.qp_stride_h;
  dec_load_ckv<TQ, kChunk>(n, lane, qn);
  float four[2 * kDecKpeLane];
  dev::load_f32<TQ, 2 * kDecKpeLane>(e + (lane / 2) * (2 * kDecKpeLane), four);
#pragma unroll
  for (int i = 0; i < kDecKpeLane; ++i) qp[i] = lane % 2 == 0 ? four[i] : four[kDecKpeLane + i];
}

template <int kChunk>
__device__ __forceinline__ void dec_load_q(const MlaAttentionParams& p, int64_t row, int h,
                                           int lane, float* qn, float* qp) {
  switch (p.q_dtype) {
    case DType::kFloat16:
      dec_load_q_as<__half, kChunk>(p, row, h, lane, qn, qp);
      return;
    case DType::kBFloat16:
      dec_load_q_as<__nv_bfloat16, kChunk>(p, row, h, lane, qn, qp);
      return;
    case DType::kFloat8E4M3FN:
      dec_load_q_as<__nv_fp8_e4m3, kChunk>(p, row, h, lane, qn, qp);
      return;
    case DType::kFloat8E5M2:
      dec_load_q_as<__nv_fp8_e5m2, kChunk>(p, row, h, lane, qn, qp);
      return;
    default:
      dec_load_q_as<float, kChunk>(p, row, h, lane, qn, qp);
      return;
  }
}

// Stores this lane's 16 output dims of one row (rounded to nearest-even), kChunk a store.
template <class TO, int kChunk>
__device__ __forceinline__ void dec_store_row(TO* row, int lane, const float* v) {
#pragma unroll
  for (int u = 0; u < kDecCkvLane / kChunk; ++u) {
    dev::store_from_f32<TO, kChunk>(row + (u * kWarp + lane) * kChunk, v + u * kChunk);
  }
}

template <int kChunk>
__device__ __forceinline__ void dec_store_o(const MlaAttentionParams& p, int64_t off, int lane,
                                            const float* v) {
  switch (p.o_dtype) {
    case DType::kFloat16:
      dec_store_row<__half, kChunk>(static_cast<__half*>(p.o) + off, lane, v);
      return;
    case DType::kBFloat16:
      dec_store_row<__nv_bfloat16, kChunk>(static_cast<__nv_bfloat16*>(p.o) + off, lane, v);
      return;
    default:
      dec_store_row<float, kChunk>(static_cast<float*>(p.o) + off, lane, v);
      return;
  }
}

using DecState = dev::SoftmaxState<kDecCkvLane>;

// One warp, kDecSub consecutive tokens of a staged tile (`sub`: their rows in shared memory), of
// which the first n >= 1 are visible; the others are zero-filled rows. Folds them into the
// states of the warp's heads. q is pre-scaled, so a score comes out in log2 units. Every lane
// ends with the same scores (xor butterfly: each step adds the same two values on both lanes),
// hence the same m and d: the branches below are warp-uniform.
template <class KV, int kChunk>
__device__ __forceinline__ void dec_attend(const KV* sub, int n, int lane,
                                           const float (&qn)[kDecHeadsPerWarp][kDecCkvLane],
                                           const float (&qp)[kDecHeadsPerWarp][kDecKpeLane],
                                           DecState (&st)[kDecHeadsPerWarp]) {
  float s[kDecHeadsPerWarp][kDecSub];
#pragma unroll
  for (int j = 0; j < kDecSub; ++j) {
    const KV* r = sub + j * kDecRow;
    float c[kDecCkvLane], k[kDecKpeLane];
    dec_load_ckv<KV, kChunk>(r, lane, c);
    dev::load_f32<KV, kDecKpeLane>(r + kDecCkv + lane * kDecKpeLane, k);
#pragma unroll
    for (int hh = 0; hh < kDecHeadsPerWarp; ++hh) {
      float a = 0.0f;
#pragma unroll
      for (int i = 0; i < kDecCkvLane; ++i) a = fmaf(qn[hh][i], c[i], a);
#pragma unroll
      for (int i = 0; i < kDecKpeLane; ++i) a = fmaf(qp[hh][i], k[i], a);
      s[hh][j] = a;
    }
  }
#pragma unroll
  for (int hh = 0; hh < kDecHeadsPerWarp; ++hh) {
#pragma unroll
    for (int j = 0; j < kDecSub; ++j) {
      const float x = warp_reduce_sum(s[hh][j]);
      s[hh][j] = j < n ? x : -INFINITY;  // a token past the end weighs exactly 0
    }
  }
#pragma unroll
  for (int hh = 0; hh < kDecHeadsPerWarp; ++hh) {
    float m_tile = s[hh][0];
#pragma unroll
    for (int j = 1; j < kDecSub; ++j) m_tile = fmaxf(m_tile, s[hh][j]);
    const float m_new = fmaxf(st[hh].m, m_tile);
    if (m_new == -INFINITY) {  // no finite score yet: weights stay 0 (the CPU rule)
#pragma unroll
      for (int j = 0; j < kDecSub; ++j) s[hh][j] = 0.0f;
      continue;
    }
    // Rescaled only when the maximum moves: otherwise r would be exactly exp2f(0) = 1 and the
    // multiplies change no bit (m_new is the same on every lane: the scores come from butterfly
    // sums, which give each lane the same value). A head's maximum seldom moves after its first
    // tiles; the rescale is 17 of a lane's ~290 multiplies per head and sub-tile.
    if (m_new != st[hh].m) {
      const float r = exp2f(st[hh].m - m_new);  // 0 while the state is empty
      st[hh].d *= r;
#pragma unroll
      for (int i = 0; i < kDecCkvLane; ++i) st[hh].o[i] *= r;
    }
#pragma unroll
    for (int j = 0; j < kDecSub; ++j) {
      s[hh][j] = exp2f(s[hh][j] - m_new);  // 2^-inf = 0 past the end
      st[hh].d += s[hh][j];
    }
    st[hh].m = m_new;
  }
  // The latent rows again, as values: a row past the end is zeros with weight 0, adding 0.
#pragma unroll
  for (int j = 0; j < kDecSub; ++j) {
    float c[kDecCkvLane];
    dec_reload_ckv<KV, kChunk>(sub + j * kDecRow, lane, c);
#pragma unroll
    for (int hh = 0; hh < kDecHeadsPerWarp; ++hh) {
#pragma unroll
      for (int i = 0; i < kDecCkvLane; ++i) st[hh].o[i] = fmaf(s[hh][j], c[i], st[hh].o[i]);
    }
  }
}

// Dynamic shared memory of the decode kernel for a cache of `kv_bytes`-byte elements: the page
// offsets (ckv and kpe, int64) of kDecCache tokens, then kDecStages tiles of kDecTokens rows.
constexpr std::size_t dec_smem_bytes(std::size_t kv_bytes) {
  return 2 * kDecCache * sizeof(int64_t) + kDecStages * kDecTokens * kDecRow * kv_bytes;
}

// Grid (rows, head groups of 2 * warps, splits), blockDim 32 * warps (warps <= kDecMaxWarps).
// Split z covers tokens [z * chunk, (z + 1) * chunk) of the row's visible range [0, end);
// part_o == nullptr: one split, the output (and LSE) is written here, else the unnormalized o
// and the base-2 (m, d) of each head go to the partials for mla_merge_kernel.
template <class KV>
__global__ void __launch_bounds__(kWarp* kDecMaxWarps, 2)
    mla_decode_kernel(MlaAttentionParams p, dev::FastDivmod page_size, int32_t chunk, float* part_o,
                      float* part_ml) {
  constexpr int kChunk = 16 / static_cast<int>(sizeof(KV));  // elements per 16-byte unit
  constexpr int kLaneUnits = kDecCkvLane / kChunk;           // ckv units a lane copies per row
  constexpr int kKpeUnits = kDecKpe / kChunk;                // kpe units per row
  static_assert(
      kLaneUnits * kChunk == kDecCkvLane && kKpeUnits * kChunk == kDecKpe && kKpeUnits <= kWarp,
      "a cache row is whole 16-byte units");

  extern __shared__ __align__(16) uint8_t dec_smem[];
  int64_t* ckv_off = reinterpret_cast<int64_t*>(dec_smem);  // [kDecCache] element offsets
  int64_t* kpe_off = ckv_off + kDecCache;                   // [kDecCache]
  KV* tiles = reinterpret_cast<KV*>(kpe_off + kDecCache);   // [kDecStages][kDecTokens][kDecRow]

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kWarp, warp = tid / kWarp;
  const int nthreads = static_cast<int>(blockDim.x), warps = nthreads / kWarp;
  const int64_t row = blockIdx.x;
  const int h0 = (static_cast<int>(blockIdx.y) * warps + warp) * kDecHeadsPerWarp;
  // A warp past the last head still copies and meets every barrier; it computes nothing.
  const bool warp_on = h0 < p.num_heads;

  pdl_wait();
  if (p.row_req[row] < 0) return;  // a request the device-side plan refused (block-uniform)
  if (p.max_kv_dev != nullptr) {
    chunk =
        static_cast<int32_t>(mla::mla_device_chunk(*p.max_kv_dev, gridDim.z, kDecTokens, chunk));
  }
  const SplitSpan span = split_span(p, row, chunk);
  const int32_t begin = span.begin, stop = span.stop;
  if (part_o != nullptr && stop <= begin) {  // a split past the row's keys: its empty state only
    const int block_heads = warps * kDecHeadsPerWarp;
    for (int hh = tid; hh < block_heads; hh += nthreads) {
      const int hb = static_cast<int>(blockIdx.y) * block_heads + hh;
      if (hb < p.num_heads) write_empty_state(p, row, hb, part_ml);
    }
    return;  // block-uniform, before any barrier
  }
  const int n_iter = stop > begin ? (stop - begin + kDecTokens - 1) / kDecTokens : 0;

  // The warp's queries in fp32, scaled so that q . row is the score in log2 units. A head past
  // the last (odd head counts) repeats the last one and is never written.
  float qn[kDecHeadsPerWarp][kDecCkvLane], qp[kDecHeadsPerWarp][kDecKpeLane];
  {
    const float sm_scale = mla_sm_scale(p);
    const float sn = sm_scale * p.ckv_scale * kMlaLog2e, sp = sm_scale * p.kpe_scale * kMlaLog2e;
#pragma unroll
    for (int hh = 0; hh < kDecHeadsPerWarp; ++hh) {
      dec_load_q<kChunk>(p, row, min(h0 + hh, p.num_heads - 1), lane, qn[hh], qp[hh]);
#pragma unroll
      for (int i = 0; i < kDecCkvLane; ++i) qn[hh][i] *= sn;
#pragma unroll
      for (int i = 0; i < kDecKpeLane; ++i) qp[hh][i] *= sp;
    }
  }

  const int32_t* pages = p.kv_indices + p.kv_indptr[span.b];
  const KV* ckv = static_cast<const KV*>(p.ckv);
  const KV* kpe = static_cast<const KV*>(p.kpe);

  // Element offsets of the kDecCache tokens from t0 on (every thread of the block takes part);
  // a token at or past `stop` gets 0: its copies are zero-fills that read nothing.
  auto fill = [&](int32_t t0) {
#pragma unroll 1
    for (int i = tid; i < kDecCache; i += nthreads) {
      const int64_t t = int64_t{t0} + i;
      int64_t co = 0, ko = 0;
      if (t < stop) {
        uint32_t pg = 0, sl = 0;
        page_size.divmod(static_cast<uint32_t>(t), pg, sl);
        const int64_t id = pages[pg];
        co = id * p.ckv_stride_page + static_cast<int64_t>(sl) * p.ckv_stride_token;
        ko = id * p.kpe_stride_page + static_cast<int64_t>(sl) * p.kpe_stride_token;
      }
      ckv_off[i] = co;
      kpe_off[i] = ko;
    }
  };

  // Issues this thread's copies of stage `it` and commits them as one group; past the last stage
  // the group is empty, so the wait count below holds to the end. Warp w copies rows w, w +
  // warps, ... of the stage: lane l the ckv units l, l + 32, ... and (l < kKpeUnits) kpe unit l.
  // A row past `stop` is zero-filled, so the tile never holds stale (possibly non-finite) data.
  auto issue = [&](int it) {
    if (it < n_iter) {
      const int slot0 = (it & (kDecFill - 1)) * kDecTokens;  // the stage's first cached offset
      const int32_t t0 = begin + it * kDecTokens;
      KV* stage = tiles + (it % kDecStages) * (kDecTokens * kDecRow);
#pragma unroll 1
      for (int tok = warp; tok < kDecTokens; tok += warps) {
        const bool valid = t0 + tok < stop;
        const KV* c = ckv + ckv_off[slot0 + tok];
        const KV* k = kpe + kpe_off[slot0 + tok];
        KV* d = stage + tok * kDecRow;
#pragma unroll
        for (int u = 0; u < kLaneUnits; ++u) {
          const int e = (u * kWarp + lane) * kChunk;
          dev::cp_async::copy16_zfill(d + e, c + e, valid);
        }
        if (lane < kKpeUnits) {
          dev::cp_async::copy16_zfill(d + kDecCkv + lane * kChunk, k + lane * kChunk, valid);
        }
      }
    }
    dev::cp_async::commit();
  };

  DecState st[kDecHeadsPerWarp];
#pragma unroll
  for (int hh = 0; hh < kDecHeadsPerWarp; ++hh) st[hh].init();

  if (n_iter > 0) fill(begin);  // stages 0 .. kDecFill - 1 (kDecFill >= kDecStages)
  __syncthreads();              // the offsets are visible to every warp's copies
#pragma unroll
  for (int s = 0; s < kDecStages; ++s) {
    issue(s);
  }

  // Pipeline invariants (one commit group per stage; the GQA kernel has two, K and V, hence its
  // wait<2 * stages - 1>):
  //   - at the top of iteration `it` this thread has committed kDecStages + it groups, group g
  //     holding its copies of stage g (empty for g >= n_iter); wait<kDecStages - 1> leaves at
  //     most the newest kDecStages - 1 in flight, so groups 0 .. it have landed, and the barrier
  //     after it makes every thread's copies of stage `it` visible to every warp;
  //   - stage it + kDecStages reuses stage it's buffer: it is issued only after the barrier that
  //     follows the last read of stage it;
  //   - rows past `stop` are zero-filled; the scores of those rows are masked to -inf, so their
  //     weight is exactly 0 and 0 * 0 adds nothing to the accumulators;
  //   - n_iter, the sub-tile counts and the refill condition are block-uniform, so every thread
  //     meets the same barriers (warps without a head skip the math only).
#pragma unroll 1
  for (int it = 0; it < n_iter; ++it) {
    dev::cp_async::wait<kDecStages - 1>();
    __syncthreads();
    if (warp_on) {
      const KV* stage = tiles + (it % kDecStages) * (kDecTokens * kDecRow);
      const int32_t t0 = begin + it * kDecTokens;
#pragma unroll 1
      for (int sub = 0; sub < kDecTokens; sub += kDecSub) {
        const int32_t n = stop - (t0 + sub);  // visible tokens from this sub-tile on
        if (n <= 0) break;
        dec_attend<KV, kChunk>(stage + sub * kDecRow, n, lane, qn, qp, st);
      }
    }
    __syncthreads();  // every warp is done with this buffer: it takes stage it + kDecStages
    if (((it + kDecStages) & (kDecFill - 1)) == 0 && it + kDecStages < n_iter) {
      // Stages up to it + kDecStages - 1 were issued before the barrier above (their addresses
      // are in flight), so the next kDecFill stages' offsets may replace theirs.
      fill(begin + (it + kDecStages) * kDecTokens);
      __syncthreads();
    }
    issue(it + kDecStages);
  }
  dev::cp_async::wait<0>();  // the groups still open are empty; nothing lands after exit

  if (!warp_on) return;  // no barrier below
#pragma unroll
  for (int hh = 0; hh < kDecHeadsPerWarp; ++hh) {
    const int h = h0 + hh;
    if (h >= p.num_heads) break;
    const DecState& x = st[hh];
    if (part_o == nullptr) {
      // Nothing visible, or no finite score: d == 0, out 0 and LSE -inf (the CPU rule).
      const bool empty = x.d == 0.0f;
      const float f = empty ? 0.0f : mla_out_scale(p) * p.ckv_scale / x.d;
      float out[kDecCkvLane];
#pragma unroll
      for (int i = 0; i < kDecCkvLane; ++i) out[i] = empty ? 0.0f : x.o[i] * f;
      dec_store_o<kChunk>(p, row * p.o_stride_n + h * p.o_stride_h, lane, out);
      if (p.lse != nullptr && lane == 0) {
        float v = empty ? -INFINITY : x.m + log2f(x.d);
        if (p.lse_base_e) v *= kMlaLn2;
        p.lse[row * p.lse_stride_n + h * p.lse_stride_h] = v;
      }
    } else {
      const int64_t state = (static_cast<int64_t>(blockIdx.z) * p.rows + row) * p.num_heads + h;
      dec_store_row<float, kChunk>(part_o + state * kDecCkv, lane, x.o);
      if (lane == 0) {
        part_ml[2 * state] = x.m;
        part_ml[2 * state + 1] = x.d;
      }
    }
  }
}

// ---- tensor-core decode kernel (mla_shape.h) -----------------------------------------------
//
// Grid (rows, head groups of kMmaRows, splits), kMmaThreads threads: a block takes one query row
// and up to 64 of its heads as the rows of the MMA tiles, or, for calls of 32 heads or fewer, the
// heads of up to 64 / heads consecutive query rows of a request (mla_mma_pack; the block of the
// pack's first row runs, the others return at once). Warp w = 2 wq + wd holds MMA rows
// 16 wq .. 16 wq + 15 of the block and output dims 256 wd .. 256 wd + 255; the two warps of a
// row group (w and w ^ 1) compute q.k over their halves of the 576 dims and add them through
// shared memory (mla_shape.h says why both then hold the same logits). K/V tiles of 32 tokens
// (ckv then kpe in one permuted 72-unit row) are copied with 16-byte cp.async in kStages stages;
// the tile's row addresses are looked up once, one token a thread, into shared memory. The split,
// the partial states and the output rules are mla_decode_kernel's: m in log2 units, an empty row
// 0 and LSE -inf, partials for mla_merge_kernel. T: the output's dtype (fp16 or bf16), the MMA's
// operand type; TQ: the query's, T or (bf16 output) fp8 (uint8_t: trtllm's e4m3 queries, widened
// to T as they are read); TKV: the cache's, T or fp8 (uint8_t, e4m3 or e5m2 as p.kv_dtype says). An
// fp8 tile is copied as stored (576 bytes a row, rows in order) and widened to T in shared memory
// (exactly: device/fp8_widen.cuh) into the one 16-bit tile the warps read, as the FA2 prefill
// kernel's fp8 blocks do; ckv_scale and kpe_scale are in the logits' factors and ckv_scale in the
// output's, as the CPU reference applies them.

// The row group's two warps (64 threads) meet here; barrier 0 is __syncthreads'.
__device__ __forceinline__ void row_group_barrier(int wq) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(1 + wq), "r"(2 * kWarp) : "memory");
}

// fp8 cache: widens a stage (rows of kU8 16-byte units of fp8, in order) into the permuted 16-bit
// tile (rows of kMmaUnits units). fp8 unit c of a row becomes 16-bit units 2c and 2c + 1
// (dev::fp8_unit_widen_store), so the ckv dims land in units 0-63 and the kpe dims in 64-71, as
// a 16-bit cache's copy puts them. A NoPE call (kRope false) widens the ckv units only: its
// stage's kpe units were never copied.
// `scales` (ckv_scale_arr's, nullptr: none): each row's 4 per-128-channel scales (fp8 units
// 8 g .. 8 g + 7 of its ckv part take scale g), each widened value multiplied by its scale and
// rounded to T (dev::fp8_unit_widen_scaled_store), as the CPU reference dequantizes them.
template <class T, __nv_fp8_interpretation_t kKind, bool kRope>
__device__ __forceinline__ void mma_widen_tile(uint4* dst, const uint4* src, int tid,
                                               const float* scales) {
  constexpr int kU8 = mla::kMmaUnits / 2, kCkv8 = mla::kMmaCkvUnits / 2;
  constexpr int kWiden = kRope ? kU8 : kCkv8;
  if (scales == nullptr) {
#pragma unroll
    for (int i = tid; i < mla::kMmaKvTile * kWiden; i += mla::kMmaThreads) {
      const int r = i / kWiden, c = i % kWiden;
      dev::fp8_unit_widen_store<T, kKind>(dst, src[r * kU8 + c], r, c, mla::kMmaUnits);
    }
    return;
  }
  constexpr int kPerScale = 128 / 16;  // fp8 units of 16 values a scale covers
#pragma unroll
  for (int i = tid; i < mla::kMmaKvTile * kWiden; i += mla::kMmaThreads) {
    const int r = i / kWiden, c = i % kWiden;
    if (c < kCkv8) {
      dev::fp8_unit_widen_scaled_store<T, kKind>(dst, src[r * kU8 + c], r, c, mla::kMmaUnits,
                                                 scales[r * 4 + c / kPerScale]);
    } else {
      dev::fp8_unit_widen_store<T, kKind>(dst, src[r * kU8 + c], r, c, mla::kMmaUnits);
    }
  }
}

template <class T, class TQ, class TKV, int kStages, bool kRope>
__global__ void __launch_bounds__(mla::kMmaThreads, 1)
    mla_decode_mma_kernel(MlaAttentionParams p, dev::FastDivmod page_size, int32_t chunk,
                          float* part_o, float* part_ml) {
  using namespace mla;
  constexpr int kU = kMmaUnits;
  using Dt = MlaMmaDtypes<T, TQ, TKV>;
  constexpr bool kFp8 = Dt::kFp8, kFp8Q = Dt::kFp8Q;
  static_assert(kRope || !kFp8Q, "NoPE calls have 16-bit queries (trtllm's fp8 ones have kpe)");
  constexpr int kUS = Dt::kUS, kCkvUS = Dt::kCkvUS;
  // The 16-bit tiles the warps read: one per stage, or one in all for fp8.
  constexpr int kTiles16 = kFp8 ? 1 : kStages;
  extern __shared__ __align__(128) unsigned char mma_smem[];  // 128: permuted_lane_base
  uint4* q_s = reinterpret_cast<uint4*>(mma_smem);            // [kMmaRows][kU]
  uint4* kv_s = q_s + kMmaRows * kU;                          // [kTiles16][kMmaKvTile][kU]
  // fp8 only: [kStages][kMmaKvTile][kUS], rows in order (only mma_widen_tile reads them).
  uint4* kv8_s = kv_s + kTiles16 * kMmaKvTile * kU;
  // The score exchange: [warp][4][32] float4, a lane's 16 floats as 4 16-byte slots (each
  // quarter-warp's stores one 128-byte line: conflict-free, 4 stores where 16 scalars were).
  float* x_s = reinterpret_cast<float*>(kv8_s + (kFp8 ? kStages * kMmaKvTile * kUS : 0));
  static_assert(mla_mma_smem_bytes(kStages, kFp8) ==
                    16u * (kMmaRows * kU + kTiles16 * kMmaKvTile * kU +
                           (kFp8 ? kStages * kMmaKvTile * kUS : 0)) +
                        4u * kMmaWarps * kMmaScoreFloats * kWarp + 16u * kMmaKvTile +
                        (kFp8 ? 8u * kMmaKvTile + kStages * kMmaScaleRowBytes * kMmaKvTile : 0u),
                "the launcher's shared memory");
  int64_t* c_off = reinterpret_cast<int64_t*>(x_s + kMmaWarps * kMmaScoreFloats * kWarp);
  // The global addresses of the tile's ckv / kpe rows (a copy's address is one add of its
  // column's bytes).
  int64_t* k_off = c_off + kMmaKvTile;
  // fp8 with ckv_scale_arr: the addresses of the tile's rows of scales, then a stage's scales
  // ([kStages][kMmaKvTile] rows of 4 floats), copied with the stage's tile.
  int64_t* a_off = kFp8 ? k_off + kMmaKvTile : nullptr;
  uint4* sc_s = kFp8 ? reinterpret_cast<uint4*>(a_off + kMmaKvTile) : nullptr;
  const bool scaled = kFp8 && p.ckv_scale_arr != nullptr;  // block-uniform

  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  // A row group's warps are consecutive, hence on two of the SM's four schedulers (warp % 4): a
  // block with 16 or 32 MMA rows in use (one or two row groups busy) keeps two or four of them
  // issuing, where w % 4 = wq put both warps of a group on one.
  const int wq = warp / kMmaWarpsD, wd = warp % kMmaWarpsD;
  const int gid = lane >> 2, tid4 = lane & 3;
  // The block's MMA rows and tokens (mla_mma_block); a row group past the last MMA row in use
  // still copies and meets every block barrier.
  MlaMmaBlock blk;
  if (!mla_mma_block<kMmaThreads, kMmaKvTile>(p, chunk, part_o, part_ml, blk)) return;
  const int n_valid = blk.n_valid, n_tiles = blk.n_tiles;
  const int32_t begin = blk.begin, stop_first = blk.stop_first, stop = blk.stop;
  const auto qrow_of = [&](int m) { return blk.qrow_of(m); };
  const auto head_of = [&](int m) { return blk.head_of(m); };
  const bool group_on = wq * 16 < n_valid;
  int32_t row_stop[2];  // this thread's two rows (gid and gid + 8 of its warp's 16)
#pragma unroll
  for (int r = 0; r < 2; ++r) row_stop[r] = mla_mma_row_stop(p, blk, chunk, wq * 16 + gid + 8 * r);

  // Q: MMA row m is head head_of(m) of query row qrow_of(m), ckv dims in units 0-63, kpe in
  // 64-71; rows past the last in use are zeros (their scores are 0, never written). 16-bit: thread
  // tid copies unit tid % 64 of rows tid / 64 + 4 i, then kpe unit tid % 8 of rows tid / 8 + 32 i
  // (cp.async, in the first group). fp8 (TQ = uint8_t): 16-byte loads of 16 values, widened into
  // the tile's two units (visible after the prologue's first barrier).
  if constexpr (!kFp8Q) {
    // One part of q's rows (q_nope: units 0-63; q_pe: 64-71): kUnits units a row from `base`
    // with its row and head strides into the tile from unit `unit0` on.
    auto copy_part = [&]<int kUnits>(const T* base, int64_t stride_n, int64_t stride_h, int unit0) {
      const int col = tid % kUnits;
#pragma unroll
      for (int r = tid / kUnits; r < kMmaRows; r += kMmaThreads / kUnits) {
        const bool ok = r < n_valid;
        const T* src = ok ? base + qrow_of(r) * stride_n + head_of(r) * stride_h + col * 8 : base;
        dev::cp_async::copy16_zfill(q_s + dev::permuted_offset(r, unit0 + col, kU), src, ok);
      }
    };
    copy_part.template operator()<kMmaCkvUnits>(static_cast<const T*>(p.q_nope), p.qn_stride_n,
                                                p.qn_stride_h, 0);
    // NoPE: no q_pe; the tile's kpe units are never read (no kpe k-steps).
    if constexpr (kRope) {
      copy_part.template operator()<kU - kMmaCkvUnits>(static_cast<const T*>(p.q_pe), p.qp_stride_n,
                                                       p.qp_stride_h, kMmaCkvUnits);
    }
  } else {
    mla_fp8_query_units<kMmaThreads>(
        p, blk,
        [&](int r, int c, uint4 x, bool e5m2) {
          if (e5m2) {
            dev::fp8_unit_widen_store<T, __NV_E5M2>(q_s, x, r, c, kU);
          } else {
            dev::fp8_unit_widen_store<T, __NV_E4M3>(q_s, x, r, c, kU);
          }
        },
        [&](int r, int c) {
          q_s[dev::permuted_offset(r, 2 * c, kU)] = make_uint4(0, 0, 0, 0);
          q_s[dev::permuted_offset(r, 2 * c + 1, kU)] = make_uint4(0, 0, 0, 0);
        });
  }

  // The row addresses of tile `tile`'s tokens (mla_tile_page / mla_tile_rows). A barrier
  // separates a fill from the copies that read the cache before and after; in the loop the page id
  // is loaded an iteration ahead (`next_id`), so that its latency does not hold warp 0, and with
  // it the block's next barrier.
  auto page_id = [&](int tile) { return mla_tile_page<kMmaKvTile>(blk, page_size, tile, tid); };
  auto fill_from = [&](int tile, int32_t page) {
    mla_tile_rows<kMmaKvTile, TKV>(p, blk, page_size, tile, page, tid, c_off, k_off,
                                   scaled ? a_off : nullptr);
  };
  auto fill = [&](int tile) { fill_from(tile, page_id(tile)); };
  // Tile `tile` into stage tile % kStages: thread tid copies ckv unit tid % kCkvUS of rows
  // tid / kCkvUS + kPass i and kpe unit tid % kKpeUS of row tid / kKpeUS (16-bit: every thread;
  // fp8: the first 128); one commit group a tile (empty past the end). 16-bit stages are
  // permuted tiles; fp8 stages keep rows in order (only mma_widen_tile reads them).
  auto load = [&](int tile) {
    if (tile < n_tiles) {
      const int stage = tile % kStages;
      uint4* st = kFp8 ? kv8_s + stage * kMmaKvTile * kUS : kv_s + stage * kMmaKvTile * kU;
      const int32_t t0 = begin + tile * kMmaKvTile;
      constexpr int kPass = kMmaThreads / kCkvUS;  // rows a pass: 4 (16-bit), 8 (fp8)
      constexpr int kPer = kMmaKvTile / kPass;     // rows a thread: 8, 4
      const int col = tid % kCkvUS, r0 = tid / kCkvUS;
      int64_t co[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) co[i] = c_off[r0 + i * kPass];  // all before any copy
      constexpr int kKpeUS = kUS - kCkvUS;                           // 8, 4
      static_assert(kMmaKvTile * kKpeUS <= kMmaThreads, "one kpe unit a thread at most");
      const int kr = tid / kKpeUS, kc = tid % kKpeUS;
      // Every thread copies one kpe unit of a 16-bit tile (a constant: tid < kMmaThreads); of an
      // fp8 tile, threads 0-127.
      const bool kpe_copier = !kFp8 || kr < kMmaKvTile;
      const int64_t ko = kpe_copier ? k_off[kr] : 0;
      auto unit = [&](int r, int c) {
        return kFp8 ? st + (r * kUS + c) : st + dev::permuted_offset(r, c, kU);
      };
      if constexpr (!kFp8) {
        // Row r0 + 4 i (r0 < 4) sits (r0 + 4 i) % 8 = r0 ^ 4 (i & 1) into its swizzle group, so
        // its unit's byte address is the lane's base, bit 6 flipped for odd i, plus i whole
        // 4-row steps: one base and immediates where permuted_offset cost 3 instructions a copy
        // (the stage and the rows are 128-byte aligned, so the flip never carries).
        static_assert(kPass == 4 && kPer % 2 == 0, "rows r0 + 4 i with r0 < 4");
        const uint32_t a0 =
            dev::cp_async::smem_addr(st) + static_cast<uint32_t>(r0 * kU * 16 + ((col ^ r0) * 16));
        const uint32_t a1 = a0 ^ 64u;
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          const int r = r0 + i * kPass;
          const uint32_t sa = ((i & 1) ? a1 : a0) + static_cast<uint32_t>(i * kPass * kU * 16);
          dev::cp_async::copy16_zfill(
              sa, reinterpret_cast<const void*>(co[i] + static_cast<int64_t>(col) * 16),
              t0 + r < stop);
        }
      } else {
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          const int r = r0 + i * kPass;
          dev::cp_async::copy16_zfill(
              unit(r, col), reinterpret_cast<const void*>(co[i] + static_cast<int64_t>(col) * 16),
              t0 + r < stop);
        }
      }
      if (kRope && kpe_copier) {  // NoPE: no kpe rows (their units are never read)
        dev::cp_async::copy16_zfill(
            unit(kr, kCkvUS + kc),
            reinterpret_cast<const void*>(ko + static_cast<int64_t>(kc) * 16), t0 + kr < stop);
      }
      if (scaled && tid < kMmaKvTile * 4) {
        // One scale a thread (4-byte copies: the array need only be fp32-aligned), with the
        // tile's group.
        const int sr = tid / 4, sc = tid % 4;
        dev::cp_async::copy4_zfill(dev::cp_async::smem_addr(sc_s + stage * kMmaKvTile + sr) +
                                       static_cast<uint32_t>(4 * sc),
                                   reinterpret_cast<const void*>(a_off[sr] + 4 * sc),
                                   t0 + sr < stop);
      }
    }
    dev::cp_async::commit();
  };

  // Pipeline (prefill_kernel.cuh's): one commit group a tile, the first with Q; at the top of
  // iteration `tile` groups 0 .. tile have landed (wait<kStages - 1>), and the barrier makes them
  // visible; a stage is refilled only after the barrier that follows its last read; the offset
  // cache is refilled after the barrier that follows the last copy that read it.
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    fill(s);
    __syncthreads();
    load(s);
    __syncthreads();
  }

  float o[kMmaVoDims / 8][4];
#pragma unroll
  for (int n = 0; n < kMmaVoDims / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float sm_scale = mla_sm_scale(p);
  const float c_n = sm_scale * p.ckv_scale * kMlaLog2e, c_p = sm_scale * p.kpe_scale * kMlaLog2e;
  float4* x_mine = reinterpret_cast<float4*>(x_s) + warp * (kMmaScoreFloats / 4) * kWarp + lane;
  const float4* x_other =
      reinterpret_cast<const float4*>(x_s) + (warp ^ 1) * (kMmaScoreFloats / 4) * kWarp + lane;

  int32_t next_id = page_id(kStages);  // tile kStages's page, for the loop's first fill
#pragma unroll 1
  for (int tile = 0; tile < n_tiles; ++tile) {
    dev::cp_async::wait<kStages - 1>();
    __syncthreads();  // ... and (fp8) every warp is done with the 16-bit tile
    if constexpr (kFp8) {
      // The stage widened into the 16-bit tile; the stage is then free for tile + kStages, whose
      // copy overlaps this tile's math.
      const uint4* st8 = kv8_s + (tile % kStages) * kMmaKvTile * kUS;
      const float* scales =
          scaled ? reinterpret_cast<const float*>(sc_s + (tile % kStages) * kMmaKvTile) : nullptr;
      if (p.kv_dtype == DType::kFloat8E5M2) {
        mma_widen_tile<T, __NV_E5M2, kRope>(kv_s, st8, tid, nullptr);  // the array is e4m3's
      } else {
        mma_widen_tile<T, __NV_E4M3, kRope>(kv_s, st8, tid, scales);
      }
      fill_from(tile + kStages, next_id);
      next_id = page_id(tile + kStages + 1);
      __syncthreads();
      load(tile + kStages);
    } else {
      fill_from(tile + kStages, next_id);
      next_id = page_id(tile + kStages + 1);
    }
    if (group_on) {
      const uint32_t kv_addr =
          dev::cp_async::smem_addr(kv_s + (kFp8 ? 0 : tile % kStages) * kMmaKvTile * kU);
      const prefill::FragLane ql = prefill::prefill_q_frag_lane(lane),
                              kl = prefill::prefill_k_frag_lane(lane),
                              vl = prefill::prefill_v_frag_lane(lane);
      const uint32_t qa =
          dev::permuted_lane_base(dev::cp_async::smem_addr(q_s), wq * 16 + ql.row, ql.c, kU);
      const uint32_t ka = dev::permuted_lane_base(kv_addr, kl.row, kl.c, kU);
      // Whole swizzle groups: the base moves by a plain offset (mla_mma_vo_dim_begin).
      const uint32_t va = dev::permuted_lane_base(kv_addr, vl.row, vl.c, kU) +
                          static_cast<uint32_t>(mla_mma_vo_dim_begin(wd)) * 2u;

      auto qk_step = [&](int kk, float(&acc)[kMmaKvTile / 8][4]) {
        uint32_t a[4];
        dev::mma::ldmatrix_x4(a, dev::permuted_frag_addr(qa, 0, kk * 2, kU));
#pragma unroll
        for (int nk = 0; nk < kMmaKvTile / 16; ++nk) {
          uint32_t b[4];
          dev::mma::ldmatrix_x4(b, dev::permuted_frag_addr(ka, nk * 16, kk * 2, kU));
          dev::mma::mma_m16n8k16<T>(acc[2 * nk], a, b);
          dev::mma::mma_m16n8k16<T>(acc[2 * nk + 1], a, b + 2);
        }
      };
      auto zero = [](float(&acc)[kMmaKvTile / 8][4]) {
#pragma unroll
        for (int n = 0; n < kMmaKvTile / 8; ++n)
          acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
      };
      // This warp's half of q.k for all 32 tokens as its part of the logits (log2 units), handed
      // to the other warp and added to its part: mine + other on one side, other + mine on the
      // other, the same sum. The _rn intrinsics keep each step rounded on its own: a compiler
      // that contracted the multiply with the later add into one FMA would round the two warps'
      // sums differently. Warp-uniform branch; each side's steps are compile-time constants (the
      // fragment addresses fold to an XOR and an immediate), and only half 1 has kpe steps (their
      // own sum, sp: the ckv and kpe sums take different scales). A NoPE call has no kpe steps and
      // 16 ckv steps a half (mla_mma_qk_step_begin).
      float s[kMmaKvTile / 8][4];
      // Half wd's ckv steps into sn (constant bounds in each branch).
      auto ckv_steps = [&](float(&sn)[kMmaKvTile / 8][4]) {
        zero(sn);
        if (wd == 0) {
#pragma unroll
          for (int kk = mla_mma_qk_step_begin(0, kRope); kk < mla_mma_qk_ckv_step_end(0, kRope);
               ++kk)
            qk_step(kk, sn);
        } else {
#pragma unroll
          for (int kk = mla_mma_qk_step_begin(1, kRope); kk < mla_mma_qk_ckv_step_end(1, kRope);
               ++kk)
            qk_step(kk, sn);
        }
      };
      float sn[kMmaKvTile / 8][4];
      ckv_steps(sn);
      if (kRope && wd == 1) {
        float sp[kMmaKvTile / 8][4];
        zero(sp);
#pragma unroll
        for (int kk = kMmaKStepsNope; kk < kMmaKSteps; ++kk) qk_step(kk, sp);
#pragma unroll
        for (int n = 0; n < kMmaKvTile / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] = __fmaf_rn(c_p, sp[n][e], __fmul_rn(c_n, sn[n][e]));
        }
      } else {
#pragma unroll
        for (int n = 0; n < kMmaKvTile / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] = __fmul_rn(c_n, sn[n][e]);
        }
      }
#pragma unroll
      for (int n = 0; n < kMmaKvTile / 8; ++n)
        x_mine[n * kWarp] = make_float4(s[n][0], s[n][1], s[n][2], s[n][3]);
      row_group_barrier(wq);
      const int32_t t0 = begin + tile * kMmaKvTile;
      const bool tail = t0 + kMmaKvTile > stop_first;  // block-uniform
#pragma unroll
      for (int n = 0; n < kMmaKvTile / 8; ++n) {
        const float4 xo = x_other[n * kWarp];
        s[n][0] = __fadd_rn(s[n][0], xo.x);
        s[n][1] = __fadd_rn(s[n][1], xo.y);
        s[n][2] = __fadd_rn(s[n][2], xo.z);
        s[n][3] = __fadd_rn(s[n][3], xo.w);
      }
      // A token past its row's end weighs exactly 0 (past the block's last stop the tile's row is
      // zero-filled, so 0 * 0 adds nothing). A branch: most tiles have no such token, and the
      // test predicated on `tail` cost every tile about 40 instructions.
      if (__builtin_expect(tail, 0)) {
#pragma unroll
        for (int n = 0; n < kMmaKvTile / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (t0 + n * 8 + tid4 * 2 + (e & 1) >= row_stop[e >> 1]) s[n][e] = -INFINITY;
          }
        }
      }
      // Online softmax, base 2, as the FA2 prefill kernel's (dev::rescale_on_new_max: rescale only
      // when a row's maximum moves).
      float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < kMmaKvTile / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) tmax[e >> 1] = fmaxf(tmax[e >> 1], s[n][e]);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
        tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
      }
      dev::rescale_on_new_max(m, l, tmax, [&](int r, float factor) {
#pragma unroll
        for (int n = 0; n < kMmaVoDims / 8; ++n) {
          o[n][2 * r] *= factor;
          o[n][2 * r + 1] *= factor;
        }
      });
      const float m_sub[2] = {m[0] == -INFINITY ? 0.0f : m[0], m[1] == -INFINITY ? 0.0f : m[1]};
#pragma unroll
      for (int n = 0; n < kMmaKvTile / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = dev::exp2_ftz(s[n][e] - m_sub[e >> 1]);
        l[0] += s[n][0] + s[n][1];
        l[1] += s[n][2] + s[n][3];
      }
      // O += P V over this warp's 256 dims: the S accumulators of token blocks 2j, 2j + 1 are
      // the A operand of token step j; the ckv dims of the tile's rows through the transposing
      // ldmatrix give the B operands of two 8-wide dim blocks.
#pragma unroll
      for (int j = 0; j < kMmaKvTile / 16; ++j) {
        uint32_t a[4];
        a[0] = dev::mma::pack2<T>(s[2 * j][0], s[2 * j][1]);
        a[1] = dev::mma::pack2<T>(s[2 * j][2], s[2 * j][3]);
        a[2] = dev::mma::pack2<T>(s[2 * j + 1][0], s[2 * j + 1][1]);
        a[3] = dev::mma::pack2<T>(s[2 * j + 1][2], s[2 * j + 1][3]);
#pragma unroll
        for (int nd = 0; nd < kMmaVoDims / 16; ++nd) {
          uint32_t b[4];
          dev::mma::ldmatrix_x4_trans(b, dev::permuted_frag_addr(va, j * 16, nd * 2, kU));
          dev::mma::mma_m16n8k16<T>(o[2 * nd], a, b);
          dev::mma::mma_m16n8k16<T>(o[2 * nd + 1], a, b + 2);
        }
      }
    }
    if constexpr (!kFp8) {
      __syncthreads();  // every warp is done with this stage (fp8: the next top barrier)
      load(tile + kStages);
    }
  }
  dev::cp_async::wait<0>();  // the groups still open are empty; nothing lands after exit
  if (!group_on) return;     // no barrier below
  mla_mma_store<T, kMmaVoDims / 8>(p, blk, wq * 16, gid, tid4, mla_mma_vo_dim_begin(wd) + tid4 * 2,
                                   wd == 0, m, l, part_o, part_ml,
                                   [&](int n, int e) { return o[n][e]; });
}

// ---- split merge ----------------------------------------------------------------------------

// Grid (rows, heads), 128 threads: combines the splits' states (m in log2 units, l, the
// unnormalized o) of one (row, head), from either kernel. A split that saw no finite score
// (m == -inf) weighs 0, as an all -inf row does in the CPU reference.
__global__ void __launch_bounds__(128)
    mla_merge_kernel(MlaAttentionParams p, int splits, const float* part_o, const float* part_ml) {
  __shared__ float w_s[kMaxSplits];  // 2^(m_z - M): the weight of split z
  __shared__ float ml_s[2];          // M, L
  const int64_t row = blockIdx.x;
  const int h = static_cast<int>(blockIdx.y);
  const int dc = p.dim_ckv;
  const int tid = static_cast<int>(threadIdx.x);
  pdl_wait();
  if (p.row_req[row] < 0) return;  // a refused request's row: no split wrote it
  auto state = [&](int z) { return (static_cast<int64_t>(z) * p.rows + row) * p.num_heads + h; };
  if (tid < kWarp) {
    float M = -INFINITY;
    for (int z = tid; z < splits; z += kWarp) M = fmaxf(M, part_ml[2 * state(z)]);
    M = warp_reduce_max(M);
    float L = 0.0f;
    for (int z = tid; z < splits; z += kWarp) {
      const float mz = part_ml[2 * state(z)];
      const float w = mz == -INFINITY ? 0.0f : exp2f(mz - M);  // M finite when mz is
      w_s[z] = w;
      L += w * part_ml[2 * state(z) + 1];
    }
    L = warp_reduce_sum(L);
    if (tid == 0) {
      ml_s[0] = M;
      ml_s[1] = L;
    }
  }
  __syncthreads();
  const float M = ml_s[0], L = ml_s[1];
  const bool empty = L == 0.0f;
  const float f = empty ? 0.0f : mla_out_scale(p) * p.ckv_scale / L;
  const int64_t off = row * p.o_stride_n + h * p.o_stride_h;
  for (int d = tid; d < dc; d += static_cast<int>(blockDim.x)) {
    float a = 0.0f;
    if (!empty) {
      for (int z = 0; z < splits; ++z) {
        const float w = w_s[z];
        if (w != 0.0f) a += w * part_o[state(z) * dc + d];  // an empty split adds nothing
      }
    }
    store_any(p.o, off + d, p.o_dtype, empty ? 0.0f : a * f);
  }
  if (p.lse != nullptr && tid == 0) {
    float v = empty ? -INFINITY : M + log2f(L);
    if (p.lse_base_e) v *= kMlaLn2;
    p.lse[row * p.lse_stride_n + h * p.lse_stride_h] = v;
  }
}

// ---- host side and the layout helpers ----------------------------------------------------

int heads_per_block(const MlaAttentionParams& p) {
  return std::min(kMaxHeadsPerBlock, p.num_heads);
}

std::size_t smem_bytes(const MlaAttentionParams& p) {
  return static_cast<std::size_t>(heads_per_block(p) + kTile) *
         static_cast<std::size_t>(p.dim_ckv + p.dim_kpe) * sizeof(float);
}

bool aligned16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }

// A stride (elements of `elem` bytes) that moves by whole 16-byte units, or one never taken
// (the axis has one entry).
bool stride16(int64_t stride, std::size_t elem, bool taken) {
  return !taken || (stride * static_cast<int64_t>(elem)) % 16 == 0;
}

// Whether a call has DeepSeek's latent rows (head_dim_ckv 512 and head_dim_kpe 64, or with `rope`
// false 0: a NoPE model's MLA), a 16- or 8-bit cache, and every row the kernels read or write
// with 16-byte accesses (q_nope, q_pe, ckv, kpe, o; a NoPE call's empty q_pe and kpe none)
// starting on a 16-byte boundary.
bool latent_rows_take(const MlaAttentionParams& p, bool rope) {
  if (p.dim_ckv != kDecCkv || p.dim_kpe != (rope ? kDecKpe : 0)) return false;
  // ckv_scale_arr is an e4m3 cache's (the API's rule; the kernels apply it to e4m3 tiles only).
  if (p.ckv_scale_arr != nullptr && p.kv_dtype != DType::kFloat8E4M3FN) return false;
  switch (p.kv_dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
      break;
    default:
      return false;
  }
  const std::size_t qs = dtype_size(p.q_dtype), ks = dtype_size(p.kv_dtype),
                    os = dtype_size(p.o_dtype);
  const bool rows = p.rows > 1, heads = p.num_heads > 1, slots = p.page_size > 1;
  const bool kpe_rows =
      !rope || (aligned16(p.q_pe) && aligned16(p.kpe) && stride16(p.qp_stride_n, qs, rows) &&
                stride16(p.qp_stride_h, qs, heads) && stride16(p.kpe_stride_page, ks, true) &&
                stride16(p.kpe_stride_token, ks, slots));
  return kpe_rows && aligned16(p.q_nope) && aligned16(p.ckv) && aligned16(p.o) &&
         stride16(p.qn_stride_n, qs, rows) && stride16(p.qn_stride_h, qs, heads) &&
         stride16(p.ckv_stride_page, ks, true) && stride16(p.ckv_stride_token, ks, slots) &&
         stride16(p.o_stride_n, os, rows) && stride16(p.o_stride_h, os, heads);
}

// Whether mla_decode_kernel takes `p` (else mla_attention_kernel does): DeepSeek's latent rows
// with their kpe part, and one ckv scale (it folds ckv_scale into its factors: calls with
// ckv_scale_arr take the fallback kernel, or the tensor-core kernel).
bool decode_kernel_takes(const MlaAttentionParams& p) {
  return p.ckv_scale_arr == nullptr && latent_rows_take(p, true);
}

// Whether mla_decode_mma_kernel takes `p` on a device of compute capability `cc_major`.x (8 or
// more: ldmatrix, mma.sync and cp.async) with `stages` (mla_mma_stages) to give it:
// decode_kernel_takes' shape and alignment, with an fp16 or bf16 query and output of one type and
// a cache of that type or fp8 (mla_mma_dtypes; fp8 queries and other output dtypes stay on the
// CUDA cores). NoPE calls (head_dim_kpe 0: vLLM's SM90 sparse MLA backend) too, with a 16-bit
// query, where the device gives 3 stages (the instances built: sm_90's; elsewhere the CUDA-core
// fallback kernel takes them). FLASHINFER_MLA_TENSOR_CORES=0 sends every call to the CUDA-core
// kernels (to time or check one against the other on a GPU; read at each call).
bool mma_kernel_takes(const MlaAttentionParams& p, int stages, int cc_major) {
  if (cc_major < 8 || !mla::mla_mma_instance(p.dim_kpe, stages, dtype_is_fp8(p.q_dtype))) {
    return false;
  }
  if (!latent_rows_take(p, p.dim_kpe != 0)) return false;
  if (!mla::mla_mma_dtypes(p.q_dtype, p.kv_dtype, p.o_dtype)) return false;
  // Per-token ckv scales with an fp8 query: the CPU reference and the fallback keep the scaled
  // values in fp32, where this kernel's fp8-query instances round them to bf16 (no entry point
  // passes both today: BatchMLAPagedAttentionWrapper.run takes 16-bit and fp32 queries).
  if (p.ckv_scale_arr != nullptr && dtype_is_fp8(p.q_dtype)) return false;
  return !detail::env_switch_is("FLASHINFER_MLA_TENSOR_CORES", "0");
}

void check(const char* what, cudaError_t err) {
  if (err != cudaSuccess) {
    FLASHINFER_FAIL(ErrorCode::kCuda, "mla_attention", "", what, " failed: ", cudaGetErrorName(err),
                    ": ", cudaGetErrorString(err));
  }
}

// The append row `i` reads and the cache row it writes (E: an unsigned integer of the element's
// width, so every copy is bit-exact for every dtype).
template <class E>
struct MlaAppendRow {
  const E* ac;
  const E* ak;
  E* c;
  E* k;
};
// Row i's source and target rows, at the slot append_slot gave it (the index arrays are read
// on the device: kernels/page_append_params.h). The kernels skip a refused row before calling
// this: pointers that may be null would be generic, and the copies LD / ST, not LDG / STG.
template <class E>
__device__ __forceinline__ MlaAppendRow<E> mla_append_row(const MlaAppendParams& p, int64_t i,
                                                          AppendSlot s) {
  const int64_t page = s.page, slot = s.entry;
  return {static_cast<const E*>(p.append_ckv) + i * p.ackv_stride_n,
          static_cast<const E*>(p.append_kpe) + i * p.akpe_stride_n,
          static_cast<E*>(p.ckv) + page * p.ckv_stride_page + slot * p.ckv_stride_token,
          static_cast<E*>(p.kpe) + page * p.kpe_stride_page + slot * p.kpe_stride_token};
}

// Block per appended row; threads copy the row's latent then rope elements one at a time: the
// form for rows that are not 16-byte aligned or not whole 16-byte chunks.
template <class E>
__global__ void append_mla_strided_kernel(MlaAppendParams p) {
  const AppendSlot s = append_slot(p.table, blockIdx.x);
  if (s.page < 0) return;
  const MlaAppendRow<E> r = mla_append_row<E>(p, blockIdx.x, s);
  for (int64_t d = threadIdx.x; d < p.dim_ckv; d += blockDim.x) r.c[d] = r.ac[d];
  for (int64_t d = threadIdx.x; d < p.dim_kpe; d += blockDim.x) r.k[d] = r.ak[d];
}

constexpr int kAppendWarps = 8;   // warps per block of append_mla_kernel
constexpr int kAppendUnroll = 4;  // 16-byte loads a lane issues before its first store

// As append_mla_strided_kernel with 16-byte copies when every row start is 16-byte aligned and
// both dims fill whole chunks (append_mla_vectorizable): a warp per row, the grid holding the
// device's resident blocks and striding over the rows. A lane's chunks of the latent and rope
// parts are one index space (DeepSeek's 512 + 64 bf16: 64 + 8 chunks, 2-3 per lane), loaded
// kAppendUnroll at a time before any is stored.
template <class E>
__global__ void __launch_bounds__(kAppendWarps * 32) append_mla_kernel(MlaAppendParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t nc = p.dim_ckv * static_cast<int64_t>(sizeof(E)) / 16;
  const int64_t n = nc + p.dim_kpe * static_cast<int64_t>(sizeof(E)) / 16;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kAppendWarps + threadIdx.x / 32; i < p.nnz;
       i += static_cast<int64_t>(gridDim.x) * kAppendWarps) {
    const AppendSlot s = append_slot(p.table, i);
    if (s.page < 0) continue;  // the whole warp: one row a warp
    const MlaAppendRow<E> r = mla_append_row<E>(p, i, s);
    const auto* ac = reinterpret_cast<const uint4*>(r.ac);
    const auto* ak = reinterpret_cast<const uint4*>(r.ak);
    auto* c = reinterpret_cast<uint4*>(r.c);
    auto* k = reinterpret_cast<uint4*>(r.k);
    for (int64_t base = lane; base < n; base += 32 * kAppendUnroll) {
      uint4 v[kAppendUnroll];
#pragma unroll
      for (int u = 0; u < kAppendUnroll; ++u) {
        const int64_t j = base + 32 * u;
        if (j < n) v[u] = j < nc ? ac[j] : ak[j - nc];
      }
#pragma unroll
      for (int u = 0; u < kAppendUnroll; ++u) {
        const int64_t j = base + 32 * u;
        if (j < nc) {
          c[j] = v[u];
        } else if (j < n) {
          k[j - nc] = v[u];
        }
      }
    }
  }
}

// Block per (token, head): k[t, h] = (k_nope[t, h], k_rope[t, 0]).
template <class E>
__global__ void concat_mla_k_kernel(ConcatMlaKParams p) {
  const int64_t t = blockIdx.x, h = blockIdx.y;
  E* k = static_cast<E*>(p.k) + t * p.k_stride_t + h * p.k_stride_h;
  const E* kn = static_cast<const E*>(p.k_nope) + t * p.kn_stride_t + h * p.kn_stride_h;
  const E* kr = static_cast<const E*>(p.k_rope) + t * p.kr_stride_t;
  for (int64_t d = threadIdx.x; d < p.nope_dim; d += blockDim.x) k[d] = kn[d];
  for (int64_t d = threadIdx.x; d < p.rope_dim; d += blockDim.x) k[p.nope_dim + d] = kr[d];
}

// Whether append_mla_kernel takes `p`: every append and cache row start 16-byte aligned and
// both dims whole 16-byte chunks. A stride that never moves (one row, one slot) is not checked.
bool append_mla_vectorizable(const MlaAppendParams& p) {
  const auto e = static_cast<std::size_t>(p.elem_size);
  return (p.dim_ckv * p.elem_size) % 16 == 0 && (p.dim_kpe * p.elem_size) % 16 == 0 &&
         aligned16(p.append_ckv) && aligned16(p.append_kpe) && aligned16(p.ckv) &&
         aligned16(p.kpe) && stride16(p.ackv_stride_n, e, p.nnz > 1) &&
         stride16(p.akpe_stride_n, e, p.nnz > 1) && stride16(p.ckv_stride_page, e, true) &&
         stride16(p.kpe_stride_page, e, true) &&
         stride16(p.ckv_stride_token, e, p.table.page_size > 1) &&
         stride16(p.kpe_stride_token, e, p.table.page_size > 1);
}

template <class F>
void by_width(int64_t elem_size, const char* op, F&& f) {
  switch (elem_size) {
    case 1:
      f(uint8_t{});
      return;
    case 2:
      f(uint16_t{});
      return;
    case 4:
      f(uint32_t{});
      return;
    default:
      FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "", "element size ", elem_size,
                      " is not supported on CUDA");
  }
}

// The run-time page ids' guard (kernels/mla_page_guard.h): a block per request, before the MLA
// kernels, launched without PDL so that it sees every write the stream made to the ids before it.
constexpr int kGuardThreads = 128;
__global__ void __launch_bounds__(kGuardThreads) mla_page_guard_kernel(MlaAttentionParams p) {
  const int32_t b = static_cast<int32_t>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  const bool bad =
      __syncthreads_or(mla_guard_pages_bad(p, p.guard_pages, b, tid, kGuardThreads) ? 1 : 0) != 0;
  mla_guard_write_request(p, p.guard_row_req, b, !bad, tid, kGuardThreads);
}

}  // namespace

void append_paged_mla_kv_cache(const MlaAppendParams& p, void* stream) {
  if (p.nnz == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const char* op = "append_paged_mla_kv_cache";
  const bool vec = append_mla_vectorizable(p);
  by_width(p.elem_size, op, [&](auto e) {
    using E = decltype(e);
    if (vec) {
      const unsigned grid = resident_grid(op, append_mla_kernel<E>, kAppendWarps * 32,
                                          (p.nnz + kAppendWarps - 1) / kAppendWarps);
      append_mla_kernel<E><<<grid, kAppendWarps * 32, 0, s>>>(p);
    } else {
      append_mla_strided_kernel<E><<<static_cast<unsigned>(p.nnz), 128, 0, s>>>(p);
    }
  });
  FLASHINFER_CUDA_CALL("append_paged_mla_kv_cache", cudaGetLastError());
}

void concat_mla_k(const ConcatMlaKParams& p, void* stream) {
  if (p.tokens == 0 || p.num_heads == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.num_heads));
  by_width(p.elem_size, "concat_mla_k",
           [&](auto e) { concat_mla_k_kernel<decltype(e)><<<grid, 128, 0, s>>>(p); });
  FLASHINFER_CUDA_CALL("concat_mla_k", cudaGetLastError());
}

const char* mla_attention_unsupported(const MlaAttentionParams& p) {
  if (p.dim_ckv < 1 || p.dim_ckv > kWarp * kCkvPerLane) {
    return "the CUDA MLA kernel takes head_dim_ckv in [1, 512]";
  }
  // Within the device's opt-in shared memory a block too (99 KiB on sm_86 / sm_89, 163 on
  // sm_80): a named refusal where the launch would fail.
  long long smem_limit = 200 * 1024;
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
          cudaSuccess) {
    smem_limit = std::min<long long>(smem_limit, optin);
  }
  if (p.dim_kpe < 0 || static_cast<long long>(smem_bytes(p)) > smem_limit) {
    return "head_dim_ckv + head_dim_kpe is too large for the CUDA MLA kernel's shared memory";
  }
  if (p.num_heads < 1 || p.num_heads > 65535) return "the CUDA MLA kernel takes 1 to 65535 heads";
  const auto is = [](DType d, std::initializer_list<DType> ok) {
    return std::find(ok.begin(), ok.end(), d) != ok.end();
  };
  constexpr auto f32 = DType::kFloat32, f16 = DType::kFloat16, bf16 = DType::kBFloat16,
                 e4m3 = DType::kFloat8E4M3FN, e5m2 = DType::kFloat8E5M2;
  if (!is(p.q_dtype, {f32, f16, bf16, e4m3, e5m2}) ||
      !is(p.kv_dtype, {f32, f16, bf16, e4m3, e5m2}) || !is(p.o_dtype, {f32, f16, bf16})) {
    return "dtype combination not supported by the CUDA MLA kernel";
  }
  if (p.row_req == nullptr && p.rows > 0) return "no row-to-request map (host-side bug)";
  if (p.guard_row_req != nullptr && p.guard_row_req != p.row_req) {
    return "the page guard's row map is not the kernels' (host-side bug)";
  }
  return nullptr;
}

namespace mla {
bool mla_sm90_built() { return FLASHINFER_WITH_CUTLASS != 0; }
#if !FLASHINFER_WITH_CUTLASS
long long mla_sm90_launches() { return 0; }
#endif
}  // namespace mla

namespace {
std::atomic<long long> g_mma_nope_launches{0}, g_mma_scale_arr_launches{0};
}  // namespace

long long mla_mma_nope_launches() { return g_mma_nope_launches.load(std::memory_order_relaxed); }
long long mla_mma_scale_arr_launches() {
  return g_mma_scale_arr_launches.load(std::memory_order_relaxed);
}

void mla_attention(const MlaAttentionParams& p, void* stream, bool enable_pdl) {
  if (p.rows == 0 || p.num_heads == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (p.guard_row_req != nullptr && p.batch > 0) {
    launch_kernel("mla_page_guard", mla_page_guard_kernel, dim3(static_cast<unsigned>(p.batch)),
                  dim3(kGuardThreads), 0, s, /*enable_pdl=*/false, p);
  }
  int dev = 0, sms = 1, smem_optin = 0, cc_major = 0, cc_minor = 0;
  check("cudaGetDevice", cudaGetDevice(&dev));
  check("cudaDeviceGetAttribute",
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  check("cudaDeviceGetAttribute",
        cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  check("cudaDeviceGetAttribute",
        cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev));
  check("cudaDeviceGetAttribute",
        cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, dev));
  const bool fp8_cache = dtype_is_fp8(p.kv_dtype);
  const int stages = mla::mla_mma_stages(static_cast<std::size_t>(smem_optin), fp8_cache);
  const bool mma = mma_kernel_takes(p, stages, cc_major);
  const bool dec = !mma && decode_kernel_takes(p);
  // Warps per block, and heads per block (a head group).
  const int warps =
      mma   ? mla::kMmaWarps
      : dec ? std::min(kDecMaxWarps, (p.num_heads + kDecHeadsPerWarp - 1) / kDecHeadsPerWarp)
            : heads_per_block(p);
  const int block_heads = mma ? mla::kMmaRows : dec ? warps * kDecHeadsPerWarp : warps;
  // The tensor-core kernel packs query rows of calls of 32 heads or fewer (mla_mma_pack): one head
  // group, and a block of work per pack. Packs stay within a request, so the blocks that work
  // number sum_b ceil(qo_len_b / pack), at most (rows + batch (pack - 1)) / pack and at most rows
  // (plain decode: rows): the bound, which errs toward fewer splits, never past one wave.
  const int pack = mma ? mla::mla_mma_pack(p.num_heads) : 1;
  const int64_t groups = pack > 1 ? 1 : (p.num_heads + block_heads - 1) / block_heads;
  const int64_t blocks =
      pack > 1 ? std::min<int64_t>(p.rows, (int64_t{p.rows} + int64_t{p.batch} * (pack - 1)) / pack)
               : int64_t{p.rows} * groups;
  // chunk <= max_kv < 2^31, a multiple of the kernel's tile when split (kTile == kDecTokens for
  // the CUDA-core kernels).
  const mla::MlaSplit split =
      mla::mla_kv_split(blocks, sms, p.max_kv_len, mma, mma ? mla::kMmaKvTile : kTile,
                        int64_t{p.rows} * p.num_heads * (p.dim_ckv + 2) * 4);
  const int64_t splits = split.splits, chunk = split.chunk;
  const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(groups),
                  static_cast<unsigned>(splits));
  const dim3 block(static_cast<unsigned>(warps * kWarp));
  float* part_o = nullptr;
  float* part_ml = nullptr;
  void* scratch = nullptr;
  if (splits > 1) {
    const int64_t states = splits * p.rows * p.num_heads;
    check("cudaMallocAsync",
          malloc_async(&scratch, static_cast<std::size_t>(states * (p.dim_ckv + 2) * 4), s));
    part_o = static_cast<float*>(scratch);
    part_ml = part_o + states * p.dim_ckv;
  }
  cudaError_t err = cudaSuccess;
  // The Hopper kernel (opt-in, FLASHINFER_MLA_SM90=1): the tensor-core kernel's blocks and split
  // on wgmma (mla_sm90.h).
  const bool sm90 = mma && FLASHINFER_WITH_CUTLASS != 0 &&
                    mla::mla_sm90_takes(p, cc_major, cc_minor, mla::mla_sm90_by_env());
  if (sm90) {
#if FLASHINFER_WITH_CUTLASS
    err = static_cast<cudaError_t>(
        mla::launch_mla_sm90(p, grid.x, grid.y, grid.z, static_cast<uint32_t>(p.page_size),
                             static_cast<int32_t>(chunk), part_o, part_ml, s, enable_pdl));
#endif
  } else if (mma) {
    const dev::FastDivmod page_size(static_cast<uint32_t>(p.page_size));
    const std::size_t smem = mla::mla_mma_smem_bytes(stages, fp8_cache);
    // The instance mla_mma_instance promised (mma_kernel_takes checked it): rope calls at 2 or
    // 3 stages, NoPE calls (16-bit queries only) at 3.
    const bool nope = p.dim_kpe == 0;
    FLASHINFER_CHECK_CODE(mla::mla_mma_instance(p.dim_kpe, stages, dtype_is_fp8(p.q_dtype)),
                          ErrorCode::kInternal, "mla_attention", "head_dim_kpe",
                          "no tensor-core MLA instance for ", p.dim_kpe, " rope dims at ", stages,
                          " stages");
    const auto launch = [&]<class T, class TQ, class TKV>() {
      auto kernel = stages == 3 ? mla_decode_mma_kernel<T, TQ, TKV, 3, true>
                                : mla_decode_mma_kernel<T, TQ, TKV, 2, true>;
      if constexpr (std::is_same_v<T, TQ>) {
        if (nope) kernel = mla_decode_mma_kernel<T, TQ, TKV, 3, false>;
      }
      err = try_launch_kernel(kernel, grid, block, smem, s, enable_pdl, p, page_size,
                              static_cast<int32_t>(chunk), part_o, part_ml);
      if (err == cudaSuccess && nope) g_mma_nope_launches.fetch_add(1, std::memory_order_relaxed);
      if (err == cudaSuccess && p.ckv_scale_arr != nullptr) {
        g_mma_scale_arr_launches.fetch_add(1, std::memory_order_relaxed);
      }
    };
    if (dtype_is_fp8(p.q_dtype)) {
      launch.template operator()<__nv_bfloat16, uint8_t, uint8_t>();  // mla_mma_dtypes
    } else {
      dispatch_dtype<CudaElements, kFloat16, kBFloat16>(
          p.q_dtype, "mla_attention", "q_nope", [&]<class T>() {
            if (fp8_cache) {
              launch.template operator()<T, T, uint8_t>();
            } else {
              launch.template operator()<T, T, T>();
            }
          });
    }
  } else if (dec) {
    const dev::FastDivmod page_size(static_cast<uint32_t>(p.page_size));
    const std::size_t smem = dec_smem_bytes(dtype_size(p.kv_dtype));
    dispatch_dtype<CudaElements, kFloat16, kBFloat16, kFloat8E4M3FN, kFloat8E5M2>(
        p.kv_dtype, "mla_attention", "ckv_cache", [&]<class KV>() {
          err = try_launch_kernel(mla_decode_kernel<KV>, grid, block, smem, s, enable_pdl, p,
                                  page_size, static_cast<int32_t>(chunk), part_o, part_ml);
        });
  } else {
    dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16, kFloat8E4M3FN, kFloat8E5M2>(
        p.kv_dtype, "mla_attention", "ckv_cache", [&]<class KV>() {
          err = try_launch_kernel(mla_attention_kernel<KV>, grid, block, smem_bytes(p), s,
                                  enable_pdl, p, chunk, part_o, part_ml);
        });
  }
  if (err == cudaSuccess && splits > 1) {
    err = try_launch_kernel(mla_merge_kernel,
                            dim3(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.num_heads)),
                            dim3(128), 0, s, enable_pdl, p, static_cast<int>(splits),
                            static_cast<const float*>(part_o), static_cast<const float*>(part_ml));
  }
  if (scratch != nullptr) {
    const cudaError_t free_err = cudaFreeAsync(scratch, s);
    if (err == cudaSuccess) err = free_err;
  }
  check("the MLA kernel launch", err);
}

}  // namespace flashinfer::kernels::cuda
