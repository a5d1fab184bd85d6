// The CUDA-core attention kernel: decode, and any work item the tensor-core kernel does not take
// (fp8 K/V, sinks, different qk / vo head dims). Built the way upstream FlashInfer's decode is
// (docs/ATTENTION.md, "CUDA decode kernel"):
//   - one block per (work item = request x KV chunk, KV head, row chunk), holding every head of
//     the GQA group, so K/V cross HBM once per KV head;
//   - K and V tiles copied page -> shared memory with 16-byte cp.async in kDecodeStages stages,
//     K and V as separate commit groups, so the copy of stage i + 2 overlaps the math of i;
//   - the page table read once per block for a run of tokens and the element offsets kept in
//     shared memory (no division or dependent load per copy);
//   - K/V stay in their storage dtype (fp16, bf16, fp8) until the FMA, accumulation in fp32;
//     online softmax in base 2, per-token-group states merged at the end; LSE out (base 2).
// Variants are compile-time bits (kDecodeSoftCap, kDecodeMask): the plain kernel has no
// per-token mask test and no tanh. Device code only: nvcc instantiates it for the AOT head dims
// (decode_cuda.cu) and NVRTC for the others (src/jit, attention_jit.cpp).
#pragma once

#include "kernels/cuda/attention_cuda_common.cuh"
#include "kernels/cuda/decode_shape.h"
#include "kernels/cuda/device/cp_async.cuh"
#include "kernels/cuda/device/paged_kv.cuh"
#include "kernels/cuda/device/softmax_state.cuh"
#include "kernels/cuda/device/vec.cuh"

namespace flashinfer::kernels::cuda::decode {

/// Variant bits. kDecodeMask: a per-(row, key) visibility test (custom mask, or causal / window
/// with rows of several queries in a block); without it the block's key range alone applies the
/// causal and window limits, which is exact when all of its rows are one query.
constexpr int kDecodeSoftCap = 1;
constexpr int kDecodeMask = 2;
constexpr int kDecodeAlibi = 4;  // slopes[h] * (j - i) on the scaled logit, before the soft cap
// With kDecodeMask: multi-item scoring's rows (AttentionParams::multi_item_rows) in the test;
// JIT instances only, like ALiBi's (the AOT two-row instances spilled with the test in).
constexpr int kDecodeMultiItem = 8;

/// Blocks per SM ptxas is asked to allow: 3 caps 16-bit K/V instances at 80 registers, 2 the
/// fp8 ones (which widen twice the elements a lane) at 128. Without a target ptxas settles at 64
/// with small spills in some instances; with 1 it takes 90+ and costs a block per SM. With two
/// rows a thread (kRows 2, blocks of at most 128 threads) a thread holds two q slices and two
/// states: 5 caps 16-bit K/V at 96 and 3 fp8 at 168 (0 spills; 4 would spill fp8). Lanes of more
/// elements (lane_elems = q + V slice: JIT head dims such as 96 or 192 / 128) or rows of fewer
/// than kDecodeTileZ lanes (head dim 16, each lane scoring every token) get 4 (128) and 2 (255).
template <class TKV, int kRows = 1>
constexpr int decode_min_blocks(int lane_elems = 0, int bdx = 32) {
  if (kRows == 1) return sizeof(TKV) == 1 ? 2 : 3;
  if (sizeof(TKV) == 1) return lane_elems > 32 || bdx < kDecodeTileZ ? 2 : 3;
  return lane_elems > 16 || bdx < kDecodeTileZ ? 4 : 5;
}

namespace detail {

/// The token of a group of kN whose score lane tx of a row holds after reduce_spread: bit k of
/// the token is the lane's bit at the offset of the butterfly's step k (kBdx / 2^(k + 1)).
template <int kBdx, int kN>
__device__ __forceinline__ int spread_token(int tx) {
  int j = 0;
#pragma unroll
  for (int k = 0; (1 << k) < kN; ++k) j |= (tx & (kBdx >> (k + 1))) != 0 ? 1 << k : 0;
  return j;
}

/// The row lane (0 .. kBdx - 1) that holds token j's score after reduce_spread.
template <int kBdx>
__device__ __forceinline__ constexpr int spread_lane(int j) {
  int lane = 0;
  for (int k = 0; (j >> k) != 0; ++k) lane += ((j >> k) & 1) != 0 ? kBdx >> (k + 1) : 0;
  return lane;
}

/// Sums each of the kN lane-partial scores s over the row's kBdx lanes (kBdx >= kN, powers of
/// two) and returns the score of token spread_token(tx). The additions are those of one xor
/// butterfly per token (offsets kBdx / 2, ..., 1; each lane adds its partner's partial sum to
/// its own), but the first log2(kN) steps halve the scores a lane carries: at offset o the lane
/// with bit o clear keeps the even-numbered ones and sends its partner the odd ones, the partner
/// the reverse. Each lane adds the very partial sum the plain butterfly adds for that token, and
/// fp addition is commutative, so every score has the same bits; the row issues kN - 1 +
/// log2(kBdx / kN) shuffles and additions instead of kN log2(kBdx).
template <int kBdx, int kN>
__device__ __forceinline__ float reduce_spread(const float (&s)[kN], int tx) {
  static_assert(kN >= 1 && kBdx >= kN && (kN & (kN - 1)) == 0 && (kBdx & (kBdx - 1)) == 0);
  float v[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) v[i] = s[i];
#pragma unroll
  for (int k = 0, n = kN; n > 1; ++k, n >>= 1) {
    const int o = kBdx >> (k + 1);
    const bool upper = (tx & o) != 0;
#pragma unroll
    for (int i = 0; i < n / 2; ++i) {  // v[i] is written after v[2i], v[2i + 1] are read
      const float keep = upper ? v[2 * i + 1] : v[2 * i];
      const float send = upper ? v[2 * i] : v[2 * i + 1];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
  }
#pragma unroll
  for (int o = kBdx / (2 * kN); o > 0; o >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
  return v[0];
}

}  // namespace detail

/// kRows: packed rows a thread owns (decode_rows_per_thread, chosen on the host). With 2, one
/// K or V element read from shared memory and widened to fp32 feeds the FMAs of two rows; each
/// row's dot products, softmax updates and V sums are the very operations, in the same order, of
/// the one-row thread (rows ty * kRows + r of the block's, with the block's rows, token groups
/// and tiles unchanged), so the results have the same bits.
template <class TQ, class TKV, class TO, int DQK, int DVO, int kVariant, int kRows = 1>
__global__ void __launch_bounds__(
    kDecodeMaxThreads / kRows,
    decode_min_blocks<TKV, kRows>((DQK + DVO) / decode_bdx(DQK, DVO, sizeof(TKV)),
                                  decode_bdx(DQK, DVO, sizeof(TKV))))
    batch_decode_kernel(AttentionParams p) {
  constexpr int kKvBytes = static_cast<int>(sizeof(TKV));
  constexpr int kBdx = decode_bdx(DQK, DVO, kKvBytes);
  constexpr int kVq = DQK / kBdx, kVv = DVO / kBdx;
  constexpr int kChunk = 16 / kKvBytes;  // elements per 16-byte copy
  constexpr int kChunksK = DQK / kChunk, kChunksV = DVO / kChunk;
  constexpr int kLaneChunksQ = kVq / kChunk, kLaneChunksV = kVv / kChunk;  // 0: not whole units
  constexpr int kStages = kDecodeStages, kTileZ = kDecodeTileZ;
  constexpr bool kSoftCap = (kVariant & kDecodeSoftCap) != 0;
  constexpr bool kMask = (kVariant & kDecodeMask) != 0;
  constexpr bool kMultiItem = (kVariant & kDecodeMultiItem) != 0;
  constexpr bool kAlibi = (kVariant & kDecodeAlibi) != 0;
  static_assert(DQK % kChunk == 0 && DVO % kChunk == 0, "rows must be whole 16-byte units");
  static_assert(kRows == 1 || kRows == 2, "a thread owns one or two rows");
  // With at least kTileZ lanes a row, each lane finishes one token's score of its group's tile
  // (detail::reduce_spread): one logit, mask test and exp2 a lane instead of kTileZ.
  constexpr bool kSpreadTokens = kBdx >= kTileZ;

  pdl_wait();
  const WorkItem w = p.work[blockIdx.x];
  if (w.request < 0) return;  // padding block of a CUDA-graph grid
  const int32_t group = p.num_qo_heads / p.num_kv_heads;
  const DecodeBlockShape shape =
      decode_block_shape(DQK, DVO, kKvBytes, p.max_work_rows * group, kRows);
  const int bdy = shape.bdy, bdz = shape.bdz, T = shape.tile_tokens, C = shape.cache_tokens;
  const int block_rows = shape.block_rows();
  const int nthreads = kBdx * bdy * bdz;
  const int tid = threadIdx.x;
  const int tx = tid % kBdx, ty = (tid / kBdx) % bdy, tz = tid / (kBdx * bdy);
  const int my_tok = kSpreadTokens ? detail::spread_token<kBdx, kTileZ>(tx) : 0;

  const int32_t rows = (w.qo_end - w.qo_begin) * group;
  const int32_t row0 = blockIdx.z * block_rows;
  if (row0 >= rows) return;
  const int32_t b = w.request, g = blockIdx.y;
  const int32_t q_base = p.qo_indptr[b];
  const int32_t qo_len = p.qo_indptr[b + 1] - q_base;
  const int32_t kv_len = p.kv_lens[b];
  // Threads past the last row compute the last row again and write nothing: every thread takes
  // part in the barriers and shuffles.
  bool row_ok[kRows];
  int32_t qi[kRows], h[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int32_t row = row0 + ty * kRows + r;
    row_ok[r] = row < rows;
    const int32_t pr = row_ok[r] ? row : rows - 1;
    qi[r] = w.qo_begin + pr / group;
    h[r] = g * group + pr % group;
  }

  extern __shared__ __align__(16) uint8_t smem[];
  int64_t* k_off = reinterpret_cast<int64_t*>(smem);
  int64_t* v_off = k_off + C;
  TKV* k_s = reinterpret_cast<TKV*>(v_off + C);          // [kStages][T][DQK]
  TKV* v_s = k_s + kStages * T * DQK;                    // [kStages][T][DVO]
  float* merge_s = reinterpret_cast<float*>(v_off + C);  // after the loop: [bdz][rows][DVO + 4]

  // Keys this block can see at all: causal caps the end, a sliding window the start.
  // Multi-item scoring's rows hold the causal rule (key_visible): its end too; its window, like a
  // custom mask's, moves no start (the tiles stay those of the mask spelled out).
  int32_t kv_lo = w.kv_begin, kv_hi = w.kv_end;
  if (!p.custom_mask) {
    const int32_t last_row = min(rows, row0 + block_rows) - 1;
    const int32_t pos_min = kv_len - qo_len + w.qo_begin + row0 / group;
    const int32_t pos_max = kv_len - qo_len + w.qo_begin + last_row / group;
    if (p.causal || p.multi_item_rows) kv_hi = min(kv_hi, pos_max + 1);
    if (p.window_left >= 0 && !p.multi_item_rows) kv_lo = max(kv_lo, pos_min - p.window_left);
  }
  const int n_iter = kv_hi > kv_lo ? (kv_hi - kv_lo + T - 1) / T : 0;
  const int fill_mask = C / T - 1;  // stages per fill: a power of two

  const TKV* k_g = static_cast<const TKV*>(p.kv.k) + g * p.kv.k_stride_head;
  const TKV* v_g = static_cast<const TKV*>(p.kv.v) + g * p.kv.v_stride_head;
  const dev::FastDivmod page_size(static_cast<uint32_t>(p.kv.page_size));
  const dev::KvOffsetCache cache{k_off, v_off, C};

  // Issues the copies of stage `it` (K or V) and commits them as one group; a stage past the
  // last commits an empty group, so the wait counts below hold to the end. Where a lane's slice
  // is whole 16-byte units (every AOT instance), lane tx of row group (ty, tz) copies its own
  // slice of the tokens ty + tz * bdy, ... of the stage: one cached offset per token, no
  // division; otherwise the block walks the tile in 16-byte units.
  auto issue = [&](bool is_v, int it) {
    if (it < n_iter) {
      const int buf = it % kStages, slot0 = (it & fill_mask) * T;
      const int32_t t0 = kv_lo + it * T;
      const int dim = is_v ? DVO : DQK;
      const TKV* src = is_v ? v_g : k_g;
      const int64_t* off = is_v ? v_off : k_off;
      TKV* dst = (is_v ? v_s : k_s) + buf * T * dim;
      if constexpr (kLaneChunksQ * kChunk == kVq && kLaneChunksV * kChunk == kVv) {
        const int lane_chunks = is_v ? kLaneChunksV : kLaneChunksQ;
        const int lane_elems = is_v ? kVv : kVq;
#pragma unroll 1
        for (int tok = ty + tz * bdy; tok < T; tok += bdy * bdz) {
          const TKV* s = src + off[slot0 + tok] + tx * lane_elems;
          TKV* d = dst + tok * dim + tx * lane_elems;
          const bool valid = t0 + tok < kv_hi;
#pragma unroll
          for (int k = 0; k < (kLaneChunksQ > kLaneChunksV ? kLaneChunksQ : kLaneChunksV); ++k) {
            if (k < lane_chunks) dev::cp_async::copy16_zfill(d + k * kChunk, s + k * kChunk, valid);
          }
        }
      } else {
        const int chunks = is_v ? kChunksV : kChunksK;
#pragma unroll 1
        for (int c = tid; c < T * chunks; c += nthreads) {
          const int tok = c / chunks, ch = c - tok * chunks;
          dev::cp_async::copy16_zfill(dst + tok * dim + ch * kChunk,
                                      src + off[slot0 + tok] + ch * kChunk, t0 + tok < kv_hi);
        }
      }
    }
    dev::cp_async::commit();
  };

  if (n_iter > 0) cache.fill(p.kv, b, kv_lo, kv_hi, page_size, tid, nthreads);
  __syncthreads();
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    issue(false, s);
    issue(true, s);
  }

  // q and the scales are loaded after the first stages' copies are issued: their latency then
  // overlaps the page-table fill and the K/V copies instead of preceding them (the values are
  // the same either way).
  float q[kRows][kVq];
  float scale_log2[kRows], scale[kRows], slope[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    dev::load_f32<TQ, kVq>(static_cast<const TQ*>(p.q) +
                               static_cast<int64_t>(q_base + qi[r]) * p.q_stride_n +
                               static_cast<int64_t>(h[r]) * p.q_stride_h + tx * kVq,
                           q[r]);
    // Opaque to the compiler from here, so it keeps q in fp32 registers rather than widening it
    // again for every tile (the values are the same either way).
#pragma unroll
    for (int i = 0; i < kVq; ++i) asm volatile("" : "+f"(q[r][i]));
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    scale[r] = p.sm_scale;
    if (p.scale_q) scale[r] *= p.scale_q[h[r]];
    if (p.scale_k) scale[r] *= p.scale_k[g];
    scale_log2[r] = scale[r] * kLog2e;
    slope[r] = kAlibi ? p.alibi_slopes[h[r]] : 0.0f;
  }

  dev::SoftmaxState<kVv> st[kRows];
  bool nan_seen[kRows];  // a visible score was NaN: the row is NaN (as upstream)
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    st[r].init();
    nan_seen[r] = false;
  }
  for (int it = 0; it < n_iter; ++it) {
    const int buf = it % kStages;
    dev::cp_async::wait<2 * kStages - 1>();  // K of stage `it` has landed
    __syncthreads();
    // One K slice widened serves the dot products of every row of the thread.
    float s[kRows][kTileZ];
    const TKV* kt = k_s + (buf * T + tz * kTileZ) * DQK + tx * kVq;
#pragma unroll
    for (int j = 0; j < kTileZ; ++j) {
      float kf[kVq];
      dev::load_f32<TKV, kVq>(kt + j * DQK, kf);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kVq; ++i) dot = fmaf(q[r][i], kf[i], dot);
        s[r][j] = dot;
      }
    }
    const int32_t t_base = kv_lo + it * T + tz * kTileZ;
    // The scaled base-2 logit of key kj for row r, or -inf where it is invisible or NaN.
    auto logit = [&](int r, float dot, int32_t kj) {
      bool vis = kj < kv_hi;
      if constexpr (kMask) vis = vis && key_visible<kMultiItem>(p, b, qo_len, kv_len, qi[r], kj);
      float x;
      if constexpr (kAlibi) {
        // Upstream's DefaultAttention: with a soft cap, sm_scale applies twice (the CPU
        // reference does the same).
        float sc = dot * scale[r] + slope[r] * static_cast<float>(kj - qi[r]);
        if constexpr (kSoftCap) {
          sc = p.logits_soft_cap * tanhf(sc * (scale[r] / p.logits_soft_cap));
        }
        x = sc * kLog2e;
      } else if constexpr (kSoftCap) {
        x = logit_log2(p, dot, scale[r]);
      } else {
        x = dot * scale_log2[r];
      }
      if (vis && isnan(x)) nan_seen[r] = true;
      return (vis && !isnan(x)) ? x : -INFINITY;
    };
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float m_new;
      if constexpr (kSpreadTokens) {
        // Lane tx ends up with the whole score of token my_tok; it alone scales, masks and
        // exponentiates it, and the row's lanes then swap the probabilities.
        const float x = logit(r, detail::reduce_spread<kBdx, kTileZ>(s[r], tx), t_base + my_tok);
        float m_tile = x;
#pragma unroll
        for (int k = 0; (1 << k) < kTileZ; ++k) {
          m_tile = fmaxf(m_tile, __shfl_xor_sync(0xffffffffu, m_tile, kBdx >> (k + 1)));
        }
        m_new = fmaxf(st[r].m, m_tile);
        const float p_own = m_new != -INFINITY ? exp2f(x - m_new) : 0.0f;
#pragma unroll
        for (int j = 0; j < kTileZ; ++j) {
          s[r][j] = __shfl_sync(0xffffffffu, p_own, detail::spread_lane<kBdx>(j), kBdx);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kTileZ; ++j) {
#pragma unroll
          for (int o = kBdx / 2; o > 0; o >>= 1) {
            s[r][j] += __shfl_xor_sync(0xffffffffu, s[r][j], o);
          }
        }
        float m_tile = -INFINITY;
#pragma unroll
        for (int j = 0; j < kTileZ; ++j) {
          s[r][j] = logit(r, s[r][j], t_base + j);
          m_tile = fmaxf(m_tile, s[r][j]);
        }
        m_new = fmaxf(st[r].m, m_tile);
#pragma unroll
        for (int j = 0; j < kTileZ; ++j) {
          s[r][j] = m_new != -INFINITY ? exp2f(s[r][j] - m_new) : 0.0f;
        }
      }
      // Rescale only when the maximum moved: otherwise f = exp2f(0) = 1 exactly and o * 1,
      // d * 1 change nothing. d * f + s[0] is one fused multiply-add (as ptxas contracted it
      // before), and without the rescale d + s[0], the same rounding. An empty tile has every
      // s[j] = 0.
      if (m_new != st[r].m) {
        const float f = exp2f(st[r].m - m_new);  // 0 while the state is empty
#pragma unroll
        for (int i = 0; i < kVv; ++i) st[r].o[i] *= f;
        st[r].d = fmaf(st[r].d, f, s[r][0]);
        st[r].m = m_new;
      } else {
        st[r].d += s[r][0];
      }
#pragma unroll
      for (int j = 1; j < kTileZ; ++j) st[r].d += s[r][j];
    }
    __syncthreads();  // K of this stage consumed: its buffer takes stage it + kStages
    if (((it + kStages) & fill_mask) == 0 && it + kStages < n_iter) {
      cache.fill(p.kv, b, kv_lo + (it + kStages) * T, kv_hi, page_size, tid, nthreads);
      __syncthreads();
    }
    issue(false, it + kStages);
    dev::cp_async::wait<2 * kStages - 1>();  // V of stage `it` has landed
    __syncthreads();
    const TKV* vt = v_s + (buf * T + tz * kTileZ) * DVO + tx * kVv;
    // An invisible key adds nothing to a row, even where V is not finite; the test per key is a
    // branch only where some key of the group is skipped (the usual full tile has none). One V
    // slice widened serves every row of the thread that takes the key.
    auto add_v = [&](int j) {
      float vf[kVv];
      dev::load_f32<TKV, kVv>(vt + j * DVO, vf);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (kRows == 1 || s[r][j] != 0.0f) {  // one row: the caller tested it
#pragma unroll
          for (int i = 0; i < kVv; ++i) st[r].o[i] = fmaf(s[r][j], vf[i], st[r].o[i]);
        }
      }
    };
    bool all_add = true;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int j = 0; j < kTileZ; ++j) all_add = all_add && s[r][j] != 0.0f;
    }
    if (all_add) {
#pragma unroll
      for (int j = 0; j < kTileZ; ++j) add_v(j);
    } else {
#pragma unroll
      for (int j = 0; j < kTileZ; ++j) {
        bool any = false;
#pragma unroll
        for (int r = 0; r < kRows; ++r) any = any || s[r][j] != 0.0f;
        if (any) add_v(j);
      }
    }
    __syncthreads();  // V of this stage consumed
    issue(true, it + kStages);
  }
  dev::cp_async::wait<0>();
  __syncthreads();                // the K/V area is free for the merge below
  if constexpr (kSpreadTokens) {  // a lane tested its own tokens' logits only
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int o = kBdx / 2; o > 0; o >>= 1) {
        nan_seen[r] = (__shfl_xor_sync(0xffffffffu, nan_seen[r] ? 1 : 0, o) != 0) || nan_seen[r];
      }
    }
  }

  if (bdz > 1) {  // fold the token groups' states into group 0's
    constexpr int kStride = DVO + 4;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float* mine = merge_s + (tz * block_rows + ty * kRows + r) * kStride;
      dev::Vec<float, kVv> ov;
#pragma unroll
      for (int i = 0; i < kVv; ++i) ov.v[i] = st[r].o[i];
      ov.store(mine + tx * kVv);
      if (tx == 0) {
        mine[DVO] = st[r].m;
        mine[DVO + 1] = st[r].d;
        mine[DVO + 2] = nan_seen[r] ? 1.0f : 0.0f;
      }
    }
    __syncthreads();
    if (tz == 0) {
      for (int z = 1; z < bdz; ++z) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const float* other = merge_s + (z * block_rows + ty * kRows + r) * kStride;
          dev::Vec<float, kVv> x;
          x.load(other + tx * kVv);
          st[r].merge(x.v, other[DVO], other[DVO + 1]);
          nan_seen[r] = nan_seen[r] || other[DVO + 2] != 0.0f;
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (tz == 0 && row_ok[r]) {
      float out_scale = p.v_scale;
      if (p.scale_v) out_scale *= p.scale_v[g];
      const bool any = st[r].d > 0.0f;
      float inv = any ? out_scale / st[r].d : 0.0f;
      float lse = any ? st[r].m + log2f(st[r].d) : -INFINITY;
      if (nan_seen[r]) {
        inv = NAN;
        lse = NAN;
      }
      // The sink joins once: here when the row is final, in the merge pass when it is split.
      if (p.sinks && w.partial_base < 0) {
        float f = 1.0f;
        lse = apply_sink(lse, p.sinks[h[r]] * kLog2e, &f);
        inv *= f;
      }
      float out[kVv];
#pragma unroll
      for (int i = 0; i < kVv; ++i) out[i] = st[r].o[i] * inv;
      if (w.partial_base >= 0) {
        const int64_t prow = w.partial_base + (qi[r] - w.qo_begin);
        float* dst = p.tmp_v + (prow * p.num_qo_heads + h[r]) * DVO + tx * kVv;
        dev::Vec<float, kVv> ov;
#pragma unroll
        for (int i = 0; i < kVv; ++i) ov.v[i] = out[i];
        ov.store(dst);
        if (tx == 0) p.tmp_s[prow * p.num_qo_heads + h[r]] = lse;
      } else {
        const int64_t row = q_base + qi[r];
        dev::store_from_f32<TO, kVv>(
            static_cast<TO*>(p.o) + row * p.o_stride_n + h[r] * p.o_stride_h + tx * kVv, out);
        if (tx == 0 && p.lse) p.lse[row * p.lse_stride_n + h[r] * p.lse_stride_h] = lse_out(p, lse);
      }
    }
  }
  pdl_launch_dependents();
}

}  // namespace flashinfer::kernels::cuda::decode
