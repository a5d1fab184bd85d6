// The fused bf16/fp16 MoE's grouped route (moe_cuda.cu) as plain arithmetic shared by the
// kernels, the launcher and the CPU tests (tests/core/test_moe_grouped_plan.cpp): which route a
// call takes, the layout of its scratch, and the pieces of the device permutation.
//
// The grouped route sorts the (token, k) pairs by local expert, stably (pair order within an
// expert), into one row each of an expanded activation buffer, with m_indptr per expert, all on
// the device: pairs go in chunks of kMoePermChunk; a counting pass writes counts[c * E + e] (the
// pairs of chunk c with local expert e); one block turns them into m_indptr (the experts'
// totals, exclusive scan) and, in place, into each chunk's first row per expert; a scatter pass
// gives pair i of chunk c with expert e the row offsets[c * E + e] + (the pairs of its chunk
// before it with expert e). Then both GEMMs run on the tensor-core grouped GEMM.
#pragma once

#include <cstdint>

#include "kernels/cuda/device/host_device.h"
#include "kernels/cuda/grouped_gemm_shape.h"
#include "kernels/moe_layout_rules.h"

namespace flashinfer::kernels::cuda::moe {

/// Pairs per block of the counting and scatter passes (one a thread).
constexpr int kMoePermChunk = 256;

FLASHINFER_HD constexpr int64_t moe_perm_chunks(int64_t pairs) {
  return (pairs + kMoePermChunk - 1) / kMoePermChunk;
}

/// The pairs among le[0, n) (local experts of one chunk, -1: none) with local expert e.
FLASHINFER_HD int32_t moe_chunk_count(const int32_t* le, int n, int32_t e) {
  int32_t c = 0;
  for (int i = 0; i < n; ++i) c += le[i] == e ? 1 : 0;
  return c;
}

/// Pair i's rank among its chunk's pairs of the same expert (those before it).
FLASHINFER_HD int32_t moe_rank_in_chunk(const int32_t* le, int i) {
  int32_t r = 0;
  for (int j = 0; j < i; ++j) r += le[j] == le[i] ? 1 : 0;
  return r;
}

/// Expert e's pairs over all chunks (counts [chunks, experts]).
FLASHINFER_HD int32_t moe_expert_total(const int32_t* counts, int64_t chunks, int64_t experts,
                                       int64_t e) {
  int32_t s = 0;
  for (int64_t c = 0; c < chunks; ++c) s += counts[c * experts + e];
  return s;
}

/// counts[c * experts + e] -> the first row of chunk c's pairs of expert e, `base` being expert
/// e's first row (m_indptr[e]): an exclusive scan over the chunks in order.
FLASHINFER_HD void moe_expert_offsets(int32_t* counts, int64_t chunks, int64_t experts, int64_t e,
                                      int32_t base) {
  for (int64_t c = 0; c < chunks; ++c) {
    const int32_t n = counts[c * experts + e];
    counts[c * experts + e] = base;
    base += n;
  }
}

/// What picks the route of one cutlass_fused_moe call on CUDA.
struct MoeRouteQuery {
  int64_t pairs = 0, local_experts = 0, hidden = 0, inter = 0, gemm1_n = 0;
  int64_t ep_size = 1;      // expert-parallel ranks: about pairs / ep_size of the pairs are local
  int64_t elem_bytes = 2;   // of the GEMMs' operands: bf16 / fp16 (2), or e4m3 (1: the FP8 paths)
  uint64_t w1 = 0, w2 = 0;  // weight addresses
  int sm_major = 0;
};

/// Whether the tensor-core grouped kernel takes both GEMMs (its own test, mma_layout in
/// grouped_gemm_cuda.cu, then picks it rather than its CUDA-core fallback): 16-bit operands, or
/// e4m3 ones (cutlass_fused_moe's FP8 paths, elem_bytes 1; the kernel widens them
/// exactly to fp16), on sm80+; the weights' rows 16-byte aligned with unit k stride
/// (grouped::gmm_operand_aligned:
/// w1 [E, gemm1_n, hidden], w2 [E, hidden, inter], contiguous), which also covers the scratch
/// activations' rows (hidden and inter elements, 256-byte aligned bases); the grid within CUDA's
/// limits.
FLASHINFER_HD constexpr bool moe_grouped_eligible(const MoeRouteQuery& q) {
  using namespace grouped;
  return (q.elem_bytes == 2 || q.elem_bytes == 1) && q.sm_major >= 8 && q.pairs > 0 &&
         q.local_experts > 0 && q.pairs <= 0x7fffffff &&
         gmm_operand_aligned(q.w1, q.hidden, 1, q.gemm1_n * q.hidden, q.hidden, q.elem_bytes) &&
         gmm_operand_aligned(q.w2, q.inter, 1, q.hidden * q.inter, q.inter, q.elem_bytes) &&
         gmm_slot_bound(q.pairs, q.local_experts) <= 0x7fffffff &&
         (q.gemm1_n + kGmmTileN - 1) / kGmmTileN <= 65535 &&
         (q.hidden + kGmmTileN - 1) / kGmmTileN <= 65535;
}

/// Whether the grouped route pays: the GEMV kernels stream an expert's weights once per pair
/// (one block per pair), the grouped GEMM once per 128 of its pairs, but adds four small
/// launches (count, offsets, scatter, gather) and copies the activations. The host does not
/// know how the pairs spread over the experts (the ids live on the device); at most
/// min(local_experts, pairs) experts are active, so pairs >= 2 * local_experts means at least
/// two pairs per active expert on average: the grouped route at least halves the weight
/// traffic, which dominates the MoE. Below it (decode: about one pair per expert) both read
/// each active expert's weights about once and the GEMV route saves the extra passes. With
/// expert parallelism about pairs / ep_size of the pairs are this rank's (routing spreads them
/// over every rank's experts), so the rule compares pairs with 2 * local_experts * ep_size.
FLASHINFER_HD constexpr bool moe_grouped_worthwhile(int64_t pairs, int64_t local_experts,
                                                    int64_t ep_size = 1) {
  return pairs > 0 && pairs >= 2 * local_experts * (ep_size > 1 ? ep_size : 1);
}

/// The route of a call: 0 auto (eligible and worthwhile), 1 force the GEMV kernels, 2 force the
/// grouped one where eligible (the tests' override).
FLASHINFER_HD constexpr bool moe_use_grouped(const MoeRouteQuery& q, int force) {
  if (force == 1 || !moe_grouped_eligible(q)) return false;
  return force == 2 || moe_grouped_worthwhile(q.pairs, q.local_experts, q.ep_size);
}

FLASHINFER_HD constexpr uint64_t moe_align256(uint64_t bytes) { return (bytes + 255) / 256 * 256; }

/// Byte offsets of the grouped route's scratch (one block, 256-byte aligned pieces): counts
/// int32 [chunks, E] (then the chunks' first rows), m_indptr int32 [E + 1], perm int32 [pairs]
/// (pair -> row, -1: no local expert), xs T [pairs, hidden], g1 [pairs, gemm1_n] of g1_bytes
/// (0: T; trtllm_bf16_moe keeps GEMM1 in fp32, unrounded), h T [pairs, inter], y O [pairs,
/// hidden]; `bytes` in all.
struct MoeGroupedScratch {
  uint64_t counts, indptr, perm, xs, g1, h, y, bytes;
};
FLASHINFER_HD constexpr MoeGroupedScratch moe_grouped_scratch(int64_t pairs, int64_t experts,
                                                              int64_t hidden, int64_t inter,
                                                              int64_t gemm1_n, int64_t t_bytes,
                                                              int64_t o_bytes,
                                                              int64_t g1_bytes = 0) {
  const uint64_t P = static_cast<uint64_t>(pairs);
  if (g1_bytes == 0) g1_bytes = t_bytes;
  MoeGroupedScratch s{};
  s.counts = 0;
  s.indptr = s.counts + moe_align256(static_cast<uint64_t>(moe_perm_chunks(pairs) * experts) * 4);
  s.perm = s.indptr + moe_align256(static_cast<uint64_t>(experts + 1) * 4);
  s.xs = s.perm + moe_align256(P * 4);
  s.g1 = s.xs + moe_align256(P * static_cast<uint64_t>(hidden * t_bytes));
  s.h = s.g1 + moe_align256(P * static_cast<uint64_t>(gemm1_n * g1_bytes));
  s.y = s.h + moe_align256(P * static_cast<uint64_t>(inter * t_bytes));
  s.bytes = s.y + moe_align256(P * static_cast<uint64_t>(hidden * o_bytes));
  return s;
}

/// cutlass_fused_moe's DeepSeek FP8 block-scale grouped route: moe_grouped_scratch's pieces with
/// e4m3 xs and h and bf16 g1 and y (`base`), then each row's 1x128 dequantization scales, fp32:
/// xs's [pairs, ceil(hidden / 128)] and h's [pairs, ceil(inter / 128)]; 256-byte aligned.
struct MoeBlockScaleScratch {
  MoeGroupedScratch base;
  uint64_t x_scales, h_scales, bytes;
};
FLASHINFER_HD constexpr MoeBlockScaleScratch moe_block_scale_scratch(int64_t pairs, int64_t experts,
                                                                     int64_t hidden, int64_t inter,
                                                                     int64_t gemm1_n) {
  const uint64_t P = static_cast<uint64_t>(pairs);
  MoeBlockScaleScratch s{};
  s.base = moe_grouped_scratch(pairs, experts, hidden, inter, gemm1_n, 1, 2, 2);
  s.x_scales = s.base.bytes;
  s.h_scales = s.x_scales + moe_align256(P * static_cast<uint64_t>((hidden + 127) / 128) * 4);
  s.bytes = s.h_scales + moe_align256(P * static_cast<uint64_t>((inter + 127) / 128) * 4);
  return s;
}

/// The GEMV route's fp32 scratch when the caller passes none: g1 [pairs, gemm1_n], h [pairs,
/// inter], y [pairs, hidden], 256-byte aligned pieces, in bytes.
struct MoeGemvScratch {
  uint64_t g1, h, y, bytes;
};
FLASHINFER_HD constexpr MoeGemvScratch moe_gemv_scratch(int64_t pairs, int64_t hidden,
                                                        int64_t inter, int64_t gemm1_n) {
  const uint64_t P = static_cast<uint64_t>(pairs);
  MoeGemvScratch s{};
  s.g1 = 0;
  s.h = moe_align256(P * static_cast<uint64_t>(gemm1_n) * 4);
  s.y = s.h + moe_align256(P * static_cast<uint64_t>(inter) * 4);
  s.bytes = s.y + moe_align256(P * static_cast<uint64_t>(hidden) * 4);
  return s;
}

// ---- cutlass_fused_moe's W4A16 MXFP4 path (moe_cuda.cu) ---------------------------------------

/// The W4A16 kernels' tiled route takes up to kMoeW4a16Tile pairs of one expert a block, so each
/// block reads its expert's weights once for all of them (the per-pair route: once a pair).
constexpr int kMoeW4a16Tile = 8;

/// Expert e's tiles (of at most `tile` of its pairs, rows m_indptr[e] ..) are blocks
/// tile_off[e] .. tile_off[e + 1] - 1: tile_off [E + 1] from m_indptr [E + 1].
FLASHINFER_HD void moe_tile_offsets(const int32_t* indptr, int64_t experts, int tile,
                                    int32_t* tile_off) {
  tile_off[0] = 0;
  for (int64_t e = 0; e < experts; ++e) {
    tile_off[e + 1] = tile_off[e] + (indptr[e + 1] - indptr[e] + tile - 1) / tile;
  }
}

/// The expert whose tiles hold block b (b < tile_off[experts]): the largest e < experts with
/// tile_off[e] <= b (tile_off is nondecreasing; an expert with no pairs has an empty range, and a
/// later expert with the same first tile is picked), by bisection.
FLASHINFER_HD int64_t moe_tile_expert(const int32_t* tile_off, int64_t experts, int64_t b) {
  int64_t lo = 0, hi = experts - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (tile_off[mid] <= b) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

/// Blocks enough for every tile: the sum over experts of ceil(count / tile) is at most
/// ceil(pairs / tile) + experts.
FLASHINFER_HD constexpr int64_t moe_tile_grid(int64_t pairs, int64_t experts, int tile) {
  return (pairs + tile - 1) / tile + experts;
}

/// The mixed-input routes' scratch (W4A16, Humming, W4A8, weight-only INT4): moe_gemv_scratch's
/// fp32 g1 / h / y (by pair) first; the tiled route adds the sort's counts [chunks, E] and
/// m_indptr [E + 1], perm [pairs] (pair -> row), row_pair [pairs] (row -> pair) and tile_off
/// [E + 1], int32; the modes with a prepass add its GEMM1 input xq [tokens, hidden] and
/// Humming's dequantization scales x_dq [tokens] and h_dq [pairs], fp32. 256-byte aligned pieces,
/// in bytes; the absent ones at the end.
struct MoeW4a16Scratch {
  MoeGemvScratch gemv;
  uint64_t counts, indptr, perm, row_pair, tile_off, xq, x_dq, h_dq, bytes;
};
FLASHINFER_HD constexpr MoeW4a16Scratch moe_w4a16_scratch(int64_t tokens, int64_t pairs,
                                                          int64_t experts, int64_t hidden,
                                                          int64_t inter, int64_t gemm1_n,
                                                          bool tiled, bool prepass) {
  const uint64_t P = static_cast<uint64_t>(pairs), E = static_cast<uint64_t>(experts);
  const uint64_t T = static_cast<uint64_t>(tokens);
  MoeW4a16Scratch s{};
  s.gemv = moe_gemv_scratch(pairs, hidden, inter, gemm1_n);
  uint64_t at = s.gemv.bytes;
  s.counts = s.indptr = s.perm = s.row_pair = s.tile_off = at;
  if (tiled) {
    s.indptr = s.counts + moe_align256(static_cast<uint64_t>(moe_perm_chunks(pairs)) * E * 4);
    s.perm = s.indptr + moe_align256((E + 1) * 4);
    s.row_pair = s.perm + moe_align256(P * 4);
    s.tile_off = s.row_pair + moe_align256(P * 4);
    at = s.tile_off + moe_align256((E + 1) * 4);
  }
  s.xq = s.x_dq = s.h_dq = at;
  if (prepass) {
    s.x_dq = s.xq + moe_align256(T * static_cast<uint64_t>(hidden) * 4);
    s.h_dq = s.x_dq + moe_align256(T * 4);
    at = s.h_dq + moe_align256(P * 4);
  }
  s.bytes = at;
  return s;
}

// ---- cutlass_fused_moe's FP8 paths (GEMV route) ----------------------------------------------

/// The FP8 GEMV route's scratch: moe_gemv_scratch's g1 / h / y first (h holds the e4m3 values
/// GEMM2 reads, decoded to fp32), then, for the DeepSeek block-scale path only, the tokens' input
/// rows quantized 1x128 (xq: e4m3 values as fp32 [tokens, hidden]; xs: their dequantization
/// scales [tokens, ceil(hidden / 128)]) and the activation's scales (hs [pairs, ceil(inter /
/// 128)]). 256-byte aligned pieces, in bytes; xq = xs = hs = bytes for the per-tensor path.
struct MoeFp8GemvScratch {
  MoeGemvScratch gemv;
  uint64_t xq, xs, hs, bytes;
};
FLASHINFER_HD constexpr MoeFp8GemvScratch moe_fp8_gemv_scratch(int64_t tokens, int64_t pairs,
                                                               int64_t hidden, int64_t inter,
                                                               int64_t gemm1_n, bool block_scale) {
  MoeFp8GemvScratch s{};
  s.gemv = moe_gemv_scratch(pairs, hidden, inter, gemm1_n);
  s.xq = s.xs = s.hs = s.bytes = s.gemv.bytes;
  if (!block_scale) return s;
  const uint64_t T = static_cast<uint64_t>(tokens), P = static_cast<uint64_t>(pairs);
  const uint64_t hb = static_cast<uint64_t>((hidden + 127) / 128);
  const uint64_t ib = static_cast<uint64_t>((inter + 127) / 128);
  s.xs = s.xq + moe_align256(T * static_cast<uint64_t>(hidden) * 4);
  s.hs = s.xs + moe_align256(T * hb * 4);
  s.bytes = s.hs + moe_align256(P * ib * 4);
  return s;
}

// ---- trtllm_bf16_moe / trtllm_bf16_routed_moe ------------------------------------------------

/// Whether the grouped route can read trtllm weights stored as w1 / w2: MajorK only (unit k
/// stride; BlockMajorK [E, k / block_k, mn, block_k] keeps the GEMV route). Upstream's row
/// shuffle and gated interleave only permute each expert's rows (moe_stored_row is a bijection
/// of [0, mn)), so the grouped GEMM runs on the stored rows as they are and plain output j is
/// its column moe_stored_row(j): the activation and the finalize read it there. Exact: a
/// column's dot product does not depend on where its row is stored.
FLASHINFER_HD constexpr bool moe_trtllm_grouped_layout(const MoeWeightIndex& w1,
                                                       const MoeWeightIndex& w2) {
  return w1.block_k == 0 && w2.block_k == 0;
}

/// The expert-parallel factor of a trtllm call: its routing spreads the pairs over num_experts
/// experts, of which `local` are this call's, so about pairs * local / num_experts are local (as
/// ep_size ranks of `local` experts each).
FLASHINFER_HD constexpr int64_t moe_trtllm_ep_size(int64_t num_experts, int64_t local) {
  return local > 0 && num_experts > local ? (num_experts + local - 1) / local : 1;
}

/// The route of a trtllm_bf16_moe call (q: bf16, q.ep_size from moe_trtllm_ep_size): the
/// grouped one where moe_use_grouped picks it and the weights are MajorK.
FLASHINFER_HD constexpr bool moe_trtllm_use_grouped(const MoeRouteQuery& q,
                                                    const MoeWeightIndex& w1,
                                                    const MoeWeightIndex& w2, int force) {
  return moe_trtllm_grouped_layout(w1, w2) && moe_use_grouped(q, force);
}

/// trtllm_bf16_moe's scratch: the routing's expert ids int32 [pairs] and bf16-rounded weights
/// fp32 [pairs], then from `rest` the route's own (moe_grouped_scratch with fp32 GEMM1 rows, or
/// moe_gemv_scratch); 256-byte aligned pieces.
struct MoeTrtllmScratch {
  uint64_t ids, w, rest;
};
FLASHINFER_HD constexpr MoeTrtllmScratch moe_trtllm_scratch(int64_t pairs) {
  const uint64_t P4 = moe_align256(static_cast<uint64_t>(pairs) * 4);
  return {0, P4, 2 * P4};
}

}  // namespace flashinfer::kernels::cuda::moe
