// The FA2 prefill attention kernel on the device library (docs/ATTENTION.md, "CUDA prefill
// kernel"), built the way upstream FlashInfer's FA2 prefill is:
//   - one block per (work item = request x query tile x KV chunk, KV head, row chunk); rows are
//     packed (query, qo head) pairs of the KV head's GQA group, 4 warps along them, or, in 16-row
//     blocks, 4 warps along the keys of each tile whose softmax states merge at the end
//     (prefill_shape.h);
//   - Q, K and V tiles copied global -> shared memory with 16-byte cp.async into a swizzled
//     layout (permuted_smem.cuh), K/V in kPrefillStages stages, so the copy of tile i + 1 overlaps
//     the math of tile i; a tile's K/V element offsets are looked up once, one token a thread,
//     into shared memory, which the copy loop reads (the fp8 128-row head-dim-128 block, short of
//     registers, looks them up per row);
//   - S = Q K^T and O += P V on tensor cores (mma.sync m16n8k16, fp32 accumulation), every
//     operand through ldmatrix (V through its transposing form);
//   - online softmax in base 2 on the S fragments; causal tiles above the diagonal never loaded,
//     and only tiles that cross the diagonal, a window edge or the end of the keys (or every tile
//     with a custom mask) get the per-element visibility test;
//   - LSE out (base 2); a split-KV chunk writes fp32 partials for the merge pass.
// The variants are compile-time bits (prefill_shape.h); attention sinks join each row's sum in
// the epilogue. fp16 / bf16 q and output of one dtype T; K/V of T, or fp8 (TKV = uint8_t, e4m3
// or e5m2 as p.kv.dtype says): fp8 tiles are copied as they are stored (half the bytes) and
// widened to T exactly (device/fp8_widen.cuh) where each value is converted once: in 16-row blocks
// (their warps split the keys) in registers after ldmatrix reads the tiles as stored, from twice
// the stages in the same shared memory, with Q's dims and the output's in the order that needs
// (prefill_shape.h, "fp8 K/V"); in 64-row blocks (every warp reads every key) by the whole block
// into one 16-bit tile in shared memory, which the 16-bit ldmatrix path then reads. K/V scales
// need nothing of their own: k_scale is in sm_scale / scale_k, v_scale in the output factor, as
// the CPU reference applies them. Device code only (prefill_fa2_d*.cu instantiate it).
#pragma once

#include "kernels/cuda/attention_cuda_common.cuh"
#include "kernels/cuda/device/cp_async.cuh"
#include "kernels/cuda/device/fastdiv.cuh"
#include "kernels/cuda/device/fp8_widen.cuh"
#include "kernels/cuda/device/mma.cuh"
#include "kernels/cuda/device/paged_kv.cuh"
#include "kernels/cuda/device/permuted_smem.cuh"
#include "kernels/cuda/device/softmax_state.cuh"
#include "kernels/cuda/prefill_epilogue.cuh"
#include "kernels/cuda/prefill_shape.h"

namespace flashinfer::kernels::cuda::prefill {

namespace detail {

/// Issues the 16-byte copies of `rows` rows of `dim` elements into a permuted tile whose rows
/// hold dim / 8 units; thread `tid` takes unit column tid % (dim / 8) of rows tid / (dim / 8),
/// + kPrefillThreads / (dim / 8), ... `src(r)` is row r's global address, or nullptr for a
/// row to zero-fill (the copy then reads nothing; `any` is a valid address to name instead).
template <int kDim, int kRows, class T, class Src>
__device__ __forceinline__ void copy_tile(uint4* tile, int tid, const T* any, Src src) {
  constexpr int kUnits = kDim / 8;
  if constexpr (kPrefillThreads % kUnits == 0) {
    // Each thread keeps one unit column: one address computation per row it copies.
    constexpr int kRowsPerPass = kPrefillThreads / kUnits;
    static_assert(kRows % kRowsPerPass == 0, "tile shape");
    const int col = tid % kUnits;
#pragma unroll
    for (int r = tid / kUnits; r < kRows; r += kRowsPerPass) {
      const T* row = src(r);
      dev::cp_async::copy16_zfill(tile + dev::permuted_offset(r, col, kUnits),
                                  row != nullptr ? row + col * 8 : any, row != nullptr);
    }
  } else {  // rows of 24 units (head dim 192): walk the tile's units in order
    static_assert((kRows * kUnits) % kPrefillThreads == 0, "tile shape");
#pragma unroll
    for (int i = tid; i < kRows * kUnits; i += kPrefillThreads) {
      const int r = i / kUnits, col = i % kUnits;
      const T* row = src(r);
      dev::cp_async::copy16_zfill(tile + dev::permuted_offset(r, col, kUnits),
                                  row != nullptr ? row + col * 8 : any, row != nullptr);
    }
  }
}

/// fp8 K/V in 64-row blocks: widens kRows rows of kDim fp8 values at `src` (rows of kDim / 16
/// 16-byte units in order, as load_kv copies them) to T in the permuted 16-bit tile `dst` (rows
/// of kDim / 8 units) that the ldmatrix path reads. Thread tid takes units tid, tid +
/// kPrefillThreads, ...: one 16-byte shared load and two 16-byte stores each.
template <class T, __nv_fp8_interpretation_t kKind, int kDim, int kRows>
__device__ __forceinline__ void widen_tile(uint4* dst, const uint4* src, int tid) {
  constexpr int kUnits8 = kDim / 16, kUnits16 = kDim / 8;
  static_assert((kRows * kUnits8) % kPrefillThreads == 0, "tile shape");
#pragma unroll
  for (int i = tid; i < kRows * kUnits8; i += kPrefillThreads) {
    const int r = i / kUnits8, c = i % kUnits8;
    dev::fp8_unit_widen_store<T, kKind>(dst, src[i], r, c, kUnits16);
  }
}

}  // namespace detail

template <class T, class TKV, int DQK, int DVO, int kCtaQ, int kVariant>
__global__ void __launch_bounds__(kPrefillThreads,
                                  prefill_min_blocks_per_sm(DQK, DVO, sizeof(TKV) == 1))
    batch_prefill_kernel(AttentionParams p) {
  constexpr int kMmaQ = prefill_mma_q(kCtaQ);
  constexpr int kWarpsKv = prefill_warps_kv(kCtaQ);
  constexpr int kWarpsQ = kPrefillWarps / kWarpsKv;
  static_assert(kCtaQ == kWarpsQ * 16 * kMmaQ, "block rows");
  constexpr int kKvTile = prefill_kv_tile(kCtaQ, DQK, DVO);
  constexpr int kKvWarp = kKvTile / kWarpsKv;  // keys of a tile one warp takes
  constexpr int kMmaKv = kKvWarp / 16;         // 16-key steps per warp (2 n-blocks of 8 each)
  static_assert(kMmaKv >= 1 && kKvWarp % 16 == 0, "tile shape");
  constexpr int kUnitsQk = DQK / 8, kUnitsVo = DVO / 8;
  constexpr bool kSoftCap = (kVariant & kPrefillSoftCap) != 0;
  constexpr bool kCustomMask = (kVariant & kPrefillCustomMask) != 0;
  constexpr bool kAlibi = (kVariant & kPrefillAlibi) != 0;
  // Plain and custom-mask blocks keep raw scores: the maximum is taken over q.k and the scale
  // enters each exponent through one FFMA, 2^(s c - m), where the others multiply every score
  // first (one FMUL a score, 64 a thread per tile). With c = sm_scale log2(e) > 0 and finite for
  // every row (prefill_scale_folds) c max(s) rounds to the maximum of the rounded c s, so m and the
  // rescale factors are the same numbers; each exponent's argument is rounded once instead of
  // twice, so P, the sums and the LSE move in their last bits. Where c s overflows (|q.k| >
  // FLT_MAX / c) m is +inf and every P of the row 0; the epilogue writes NaN there, as scaling
  // first gave.
  constexpr bool kFoldScale = !kSoftCap && !kAlibi;
  static_assert(!kAlibi || kVariant == kPrefillAlibi, "ALiBi is built alone");
  static_assert(DQK % 64 == 0 && DVO % 64 == 0, "rows must be whole 128-byte swizzle groups");
  constexpr bool kFp8 = sizeof(TKV) == 1;
  static_assert(kFp8 || std::is_same_v<TKV, T>, "K/V of q's dtype or fp8");
  static_assert(!kFp8 || prefill_fp8_kv_built(DQK, DVO, kVariant), "fp8 K/V instance");
  // Units of 16 bytes in a stored K / V row (fp8: 16 elements each).
  constexpr int kUnitsK = DQK * static_cast<int>(sizeof(TKV)) / 16;
  constexpr int kUnitsV = DVO * static_cast<int>(sizeof(TKV)) / 16;
  // fp8 widened in registers (16-row blocks, whose warps split the keys: each value converted
  // once, as a shared-memory pass would) or in shared memory (64-row blocks: every warp reads
  // every key, so registers would convert each value four times).
  constexpr bool kFp8Reg = kFp8 && kWarpsKv > 1, kFp8Smem = kFp8 && !kFp8Reg;
  // K/V stages: fp8 tiles widened in registers take half the bytes, so twice as many fit the
  // 16-bit kernel's shared memory (prefill_smem_bytes) and three are in flight while one is
  // read. The 16-bit tiles the warps read: one per stage, one in all for fp8 widened in shared
  // memory (its stages hold the copies as stored), none for fp8 widened in registers.
  constexpr int kStagesKv = kFp8Reg ? kPrefillFp8Stages : kPrefillStages;
  constexpr int kStages16 = kFp8Reg ? 0 : (kFp8Smem ? 1 : kPrefillStages);
  constexpr int64_t kKvBytes = static_cast<int64_t>(sizeof(TKV));
  // fp8 tiles' permuted lines (prefill_fp8_line_units: two keys a line at head dim 64).
  constexpr unsigned kLineUnits = prefill_fp8_line_units(kUnitsK);
  constexpr int kKeysPerLine = static_cast<int>(prefill_fp8_keys_per_line(kUnitsK));
  static_assert(!kFp8 || kUnitsK == 4 || kUnitsK % 8 == 0, "fp8 rows of 4 or 8k units");

  extern __shared__ __align__(128) unsigned char smem_raw[];  // 128: permuted_lane_base
  uint4* q_s = reinterpret_cast<uint4*>(smem_raw);            // [kCtaQ][kUnitsQk]
  uint4* k_s = q_s + kCtaQ * kUnitsQk;                        // [kStages16][kKvTile][kUnitsQk]
  uint4* v_s = k_s + kStages16 * kKvTile * kUnitsQk;          // [kStages16][kKvTile][kUnitsVo]
  // fp8 only: [kStagesKv][kKvTile][kUnitsK], then V's: rows in order (kFp8Smem: only widen_tile
  // reads them) or permuted lines (kFp8Reg: prefill_fp8_tile_offset).
  uint4* k8_s = v_s + kStages16 * kKvTile * kUnitsVo;
  uint4* v8_s = k8_s + (kFp8 ? kStagesKv * kKvTile * kUnitsK : 0);
  static_assert(16u * (kCtaQ * kUnitsQk + kStages16 * kKvTile * (kUnitsQk + kUnitsVo) +
                       (kFp8 ? kStagesKv * kKvTile * (kUnitsK + kUnitsV) : 0)) ==
                    prefill_tile_bytes(kCtaQ, DQK, DVO),
                "fp8 K/V blocks use the 16-bit blocks' shared memory");

  // The K and V offsets, in bytes, of the tokens of the next tile to be copied.
  constexpr int kCache = prefill_offset_cache_tokens(kCtaQ, DQK, DVO);
  static_assert(kCache == kKvTile, "one tile's offsets");
  // fp8 K/V in 128-row blocks: with the widening beside 64 S and 128 O floats a thread, every
  // arrangement of the offset cache spilled (it looked the page table up per row until session
  // 65); such work runs in 64-row blocks (prefill_fp8_kv_built).
  static_assert(!kFp8 || kCtaQ != 128, "no 128-row fp8 block");
  int64_t* k_off = reinterpret_cast<int64_t*>(smem_raw + prefill_tile_bytes(kCtaQ, DQK, DVO));
  int64_t* v_off = k_off + kCache;
  // 128-row blocks: the unmasked tile range, written once, read each tile.
  constexpr bool kRangeInSmem = prefill_block_const_bytes(kCtaQ) >= 8;
  int2* tile_range_s = reinterpret_cast<int2*>(v_off + kCache);

  pdl_wait();
  // The plan's last work item first, its KV heads along x (prefill_grid_slice: heaviest first).
  const WorkItem w = p.work[p.num_work - 1 - static_cast<int32_t>(blockIdx.y)];
  if (w.request < 0) return;  // padding block of a CUDA-graph grid
  const int32_t g = blockIdx.x;
  const int32_t group = p.num_qo_heads / p.num_kv_heads;
  const int32_t rows = (w.qo_end - w.qo_begin) * group;
  const int32_t row0 = blockIdx.z * kCtaQ;
  if (row0 >= rows) return;
  const int32_t b = w.request;
  const int64_t q_base = p.qo_indptr[b];
  const int64_t qo_len = p.qo_indptr[b + 1] - q_base;
  const int64_t kv_len = p.kv_lens[b];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // The warps are either all along Q or all along the keys (kWarpsQ is 4 or 1): spelled so that
  // the unused index is the constant 0 (warp / 4 is not, to the compiler).
  static_assert(kWarpsQ == 1 || kWarpsKv == 1, "warps along one axis");
  const int warp_q = kWarpsKv == 1 ? warp : 0, warp_kv = kWarpsKv == 1 ? 0 : warp;
  const int gid = lane >> 2, tid4 = lane & 3;
  const dev::FastDivmod group_div(static_cast<uint32_t>(group));

  // Keys this block can see at all: causal caps the end, a sliding window the start.
  const int32_t last_row = min(rows, row0 + kCtaQ) - 1;
  const int64_t pos_min = kv_len - qo_len + w.qo_begin + group_div.div(row0);
  const int64_t pos_max = kv_len - qo_len + w.qo_begin + group_div.div(last_row);
  int64_t kv_lo = w.kv_begin, kv_hi = w.kv_end;
  if (!kCustomMask) {
    if (p.causal) kv_hi = min(kv_hi, pos_max + 1);
    if (p.window_left >= 0) kv_lo = max(kv_lo, pos_min - p.window_left);
  }
  int num_tiles = kv_hi > kv_lo ? static_cast<int>((kv_hi - kv_lo + kKvTile - 1) / kKvTile) : 0;
  // Multi-item scoring's mask: loop step i takes tile i + (i >= gap.x ? gap.y : 0) of the keys
  // from kv_lo, skipping the tiles no row sees (prefill_multi_item_tiles); no gap otherwise.
  int2 gap = make_int2(INT32_MAX, 0);
  if constexpr (kCustomMask) {
    if (p.multi_item_rows != nullptr) {  // the bounds come with the rows
      const MultiItemTiles mt =
          prefill_multi_item_tiles(kv_lo, kv_hi, kKvTile, pos_min, pos_max,
                                   p.multi_item_bounds[2 * b], p.multi_item_bounds[2 * b + 1]);
      kv_hi = mt.kv_hi;
      num_tiles = mt.num_tiles;
      gap = make_int2(mt.split, mt.skip);
    }
  }
  // The first key of loop step `tile`, in the integer type I (a constant gap outside custom-mask
  // blocks, where this is kv_lo + tile * kKvTile).
  auto tile_key0 = [&]<class I>(I, int tile) -> I {
    const int grid_tile = kCustomMask && tile >= gap.x ? tile + gap.y : tile;
    return static_cast<I>(kv_lo) + static_cast<I>(grid_tile) * kKvTile;
  };
  // The tiles that need no per-element visibility test, as two integers kept across the loop
  // (in shared memory in 128-row blocks: kRangeInSmem) in blocks with the offset cache; the
  // others test each tile.
  const TileRange unmasked_tiles = prefill_unmasked_tiles(kv_lo, kv_hi, kKvTile, p.causal, pos_min,
                                                          pos_max, p.window_left, kCustomMask);

  // Q tile: packed row r is query qo_begin + (row0 + r) / group, head g * group + its remainder.
  const T* q = static_cast<const T*>(p.q);
  detail::copy_tile<DQK, kCtaQ, T>(q_s, tid, q, [&](int r) -> const T* {
    const int32_t pr = row0 + r;
    if (pr >= rows) return nullptr;
    uint32_t qi = 0, hh = 0;
    group_div.divmod(static_cast<uint32_t>(pr), qi, hh);
    return q + (q_base + w.qo_begin + qi) * p.q_stride_n + (g * group + hh) * p.q_stride_h;
  });
  // fp8 widened in registers: Q in a group of its own, so that its reordering waits for Q alone.
  if constexpr (kFp8Reg) dev::cp_async::commit();

  // K/V tile i into stage i % kStagesKv; keys past kv_hi are zero-filled (0 in fp8 too). The
  // cached offsets include the KV head's (so the copies add them to the storage's base, a kernel
  // parameter, where a head base held two 64-bit registers across the loop).
  // The token -> (page, slot) split as the launcher built it (kv_page_div_*): its constructor's
  // division and loop would otherwise run in every offset fill.
  const auto page_split = [&] {
    return dev::FastDivmod::from_parts(
        prefill_page_divisor(p.kv.kv_indices != nullptr, p.kv.page_size), p.kv_page_div_mul,
        p.kv_page_div_shift);
  };
  // Token indices in 32 bits, as the visibility test below has them (kv_len < 2^31).
  const int32_t kv_hi32 = static_cast<int32_t>(kv_hi);
  // Fills the offset cache with tile `tile`'s tokens: one token a thread (the page-table loads of
  // a fill in flight together), 0 for keys at or past kv_hi (their copies are predicated off and
  // read nothing). A barrier must separate it from the copies that read the cache before and
  // after.
  // page_of: this thread's token's page id (0 past kv_hi or beyond the cache), the fill's one
  // global load; fill_from writes the offsets from it. The loop loads each id an iteration ahead
  // (`next_page`), so the page table's latency (an L2 trip per tile at page size 1) hides behind
  // a tile's math instead of holding the filling warps and the block's next barrier.
  auto page_of = [&](int tile) -> int32_t {
    if (tile >= num_tiles || tid >= kCache) return 0;
    const int32_t t = tile_key0(int32_t{}, tile) + tid;
    if (t >= kv_hi32) return 0;
    const dev::KvRequestMap kv_map(p.kv, b, page_split());
    return kv_map.page_id(static_cast<uint32_t>(t));
  };
  auto fill_from = [&](int tile, int32_t page) {
    if (tile >= num_tiles) return;
    // The request's map built again each fill (its page-table base reloaded, an L1 hit) rather
    // than held across the loop.
    const dev::KvRequestMap kv_map(p.kv, b, page_split());
    static_assert(kCache <= kPrefillThreads, "one token a thread at most");
    if (tid < kCache) {
      const int32_t t = tile_key0(int32_t{}, tile) + tid;
      int64_t ko = 0, vo = 0;
      if (t < kv_hi32) {
        const int32_t id = page;
        const uint32_t slot = kv_map.slot(static_cast<uint32_t>(t));
        ko = (kv_map.k_offset(id, slot) + g * p.kv.k_stride_head) * kKvBytes;
        vo = (kv_map.v_offset(id, slot) + g * p.kv.v_stride_head) * kKvBytes;
      }
      k_off[tid] = ko;
      v_off[tid] = vo;
    }
  };
  auto fill_offsets = [&](int tile) { fill_from(tile, page_of(tile)); };
  auto load_kv = [&](int tile) {
    if (tile < num_tiles) {
      const int32_t t0 = tile_key0(int32_t{}, tile);
      const int stage = tile % kStagesKv;
      uint4* kst = kFp8 ? k8_s + stage * kKvTile * kUnitsK : k_s + stage * kKvTile * kUnitsQk;
      uint4* vst = kFp8 ? v8_s + stage * kKvTile * kUnitsV : v_s + stage * kKvTile * kUnitsVo;
      static_assert(!kFp8 || (DQK == DVO && kPrefillThreads % kUnitsK == 0), "fp8 copy loop");
      if constexpr (DQK == DVO && kPrefillThreads % kUnitsK == 0) {
        // Thread tid copies unit column tid % kUnitsK of rows tid / kUnitsK + kRowsPerPass * i,
        // each from its token's cached offset.
        constexpr int kRowsPerPass = kPrefillThreads / kUnitsK;
        constexpr int kRowsPerThread = kKvTile / kRowsPerPass;
        static_assert(kKvTile % kRowsPerPass == 0, "tile shape");
        const int col = tid % kUnitsK, r0 = tid / kUnitsK;
        // The cached offsets all read before any copy is issued: ptxas puts three idle
        // shared-memory loads ahead of a cp.async that follows a shared-memory read (24 a tile
        // when each copy pair read its own).
        int64_t kos[kRowsPerThread], vos[kRowsPerThread];
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) {
          kos[i] = k_off[r0 + i * kRowsPerPass];
          vos[i] = v_off[r0 + i * kRowsPerPass];
        }
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) {
          const int r = r0 + i * kRowsPerPass;
          const bool ok = t0 + r < kv_hi32;
          const uint32_t off = kFp8Reg    ? prefill_fp8_tile_offset(r, col, kUnitsK)
                               : kFp8Smem ? static_cast<uint32_t>(r * kUnitsK + col)
                                          : dev::permuted_offset(r, col, kUnitsK);
          // The column's offset as 32 unsigned bits (held as a 64-bit value across the loop it
          // was what ptxas spilled in the 128 x 64 block at head dim 128). The cache's offsets
          // are in bytes: a copy's address is one 64-bit add of three terms (base, row,
          // column), two instructions where element offsets took four.
          const auto* kb = static_cast<const unsigned char*>(p.kv.k);
          const auto* vb = static_cast<const unsigned char*>(p.kv.v);
          const uint32_t col_bytes = static_cast<uint32_t>(col) * 16u;
          dev::cp_async::copy16_zfill(kst + off, kb + (kos[i] + col_bytes), ok);
          dev::cp_async::copy16_zfill(vst + off, vb + (vos[i] + col_bytes), ok);
        }
      } else {
        const auto* kb = static_cast<const unsigned char*>(p.kv.k);
        const auto* vb = static_cast<const unsigned char*>(p.kv.v);
        detail::copy_tile<DQK, kKvTile, T>(
            kst, tid, reinterpret_cast<const T*>(kb), [&](int r) -> const T* {
              return t0 + r < kv_hi32 ? reinterpret_cast<const T*>(kb + k_off[r]) : nullptr;
            });
        detail::copy_tile<DVO, kKvTile, T>(
            vst, tid, reinterpret_cast<const T*>(vb), [&](int r) -> const T* {
              return t0 + r < kv_hi32 ? reinterpret_cast<const T*>(vb + v_off[r]) : nullptr;
            });
      }
    }
    dev::cp_async::commit();  // an empty group past the end keeps the wait counts uniform
  };
  if (kRangeInSmem && tid == 0) *tile_range_s = make_int2(unmasked_tiles.lo, unmasked_tiles.hi);
  // Tiles 0 .. kStagesKv - 1 in, a barrier between each copy and the next fill of the cache it
  // read. Spelled out: written as a loop, ptxas spilled 8 bytes in the 16-bit 128-row blocks.
  static_assert(kStagesKv == 2 || kStagesKv == 4, "the prologue's stages");
  fill_offsets(0);
  __syncthreads();
  load_kv(0);  // the first group also carries Q (16-bit K/V)
  __syncthreads();
  fill_offsets(1);
  __syncthreads();
  load_kv(1);
  if constexpr (kStagesKv == 4) {
    __syncthreads();
    fill_offsets(2);
    __syncthreads();
    load_kv(2);
    __syncthreads();
    fill_offsets(3);
    __syncthreads();
    load_kv(3);
  }
  if constexpr (kFp8Reg) {
    // Q's dims in the order of the fp8 K fragments (prefill_fp8_q_words), in place, once: its group
    // landed (the kStagesKv K/V groups may not have), for every thread after the barrier; the
    // loop's first barrier orders the stores before the first ldmatrix.
    dev::cp_async::wait<kStagesKv>();
    __syncthreads();
#pragma unroll 1
    for (int i = tid; i < kCtaQ * (DQK / 16); i += kPrefillThreads) {
      const uint32_t r = static_cast<uint32_t>(i / (DQK / 16)),
                     k = static_cast<uint32_t>(i % (DQK / 16));
      uint4* lo = q_s + dev::permuted_offset(r, 2 * k, kUnitsQk);
      uint4* hi = q_s + dev::permuted_offset(r, 2 * k + 1, kUnitsQk);
      const uint4 a = *lo, c = *hi;
      const uint32_t wv[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
      uint32_t o8[8];
      prefill_fp8_q_words(wv, o8);
      *lo = make_uint4(o8[0], o8[1], o8[2], o8[3]);
      *hi = make_uint4(o8[4], o8[5], o8[6], o8[7]);
    }
  }

  // This thread's rows: gid and gid + 8 of each of its warp's kMmaQ m16 fragments; its keys:
  // kKvWarp of each tile from key_off on (all of them unless the warps split the tile).
  const int32_t warp_row0 = row0 + warp_q * 16 * kMmaQ;
  const bool warp_active = warp_row0 < rows;  // an idle warp still copies and syncs
  const int key_off = warp_kv * kKvWarp;
  // Visibility inputs in 32 bits (positions and key indices fit: kv_len < 2^31): a padding row
  // past `rows` gets position -1, which hides every key under causal, and reads no mask.
  float slope[kMmaQ][2];    // ALiBi: the row's head's slope
  int32_t q_idx[kMmaQ][2];  // ALiBi: the row's query index within its request
  int32_t pos_of[kMmaQ][2];
  // Custom mask: bit index of (row, key 0); multi-item scoring (its rows' bounds instead of mask
  // bits: AttentionParams::multi_item_rows): lo << 32 | a; -1: padding row.
  int64_t mask_row[kMmaQ][2];
  const int32_t pos_shift = static_cast<int32_t>(kv_len - qo_len) + w.qo_begin;
#pragma unroll
  for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int32_t pr = warp_row0 + mq * 16 + gid + 8 * e;
      uint32_t qi = 0, hh = 0;
      group_div.divmod(static_cast<uint32_t>(pr), qi, hh);
      const bool ok = pr < rows;
      pos_of[mq][e] = ok ? pos_shift + static_cast<int32_t>(qi) : -1;
      mask_row[mq][e] = -1;
      if constexpr (kCustomMask) {
        if (ok)
          mask_row[mq][e] =
              p.multi_item_rows == nullptr
                  ? p.mask_indptr[b] + (w.qo_begin + static_cast<int64_t>(qi)) * kv_len
                  : prefill_item_row(p.multi_item_rows, q_base + w.qo_begin + qi);
      }
      const int32_t h = g * group + static_cast<int32_t>(hh);
      slope[mq][e] = 0.0f;
      if constexpr (kAlibi) {
        if (ok) slope[mq][e] = p.alibi_slopes[h];
      }
      q_idx[mq][e] = w.qo_begin + static_cast<int32_t>(qi);
    }
  }

  float o[kMmaQ][DVO / 8][4];
#pragma unroll
  for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
    for (int n = 0; n < DVO / 8; ++n) o[mq][n][0] = o[mq][n][1] = o[mq][n][2] = o[mq][n][3] = 0.0f;
  }
  // A NaN score needs no test of its own: fmaxf skips it, 2^(NaN - m) puts NaN into l and,
  // through P, into every output column, so the row ends NaN (LSE too), as upstream's.
  float m[kMmaQ][2], l[kMmaQ][2];
#pragma unroll
  for (int mq = 0; mq < kMmaQ; ++mq) {
    m[mq][0] = m[mq][1] = -INFINITY;
    l[mq][0] = l[mq][1] = 0.0f;
  }

  // The page ids of tile kStagesKv, for the loop's first fill.
  int32_t next_page = page_of(kStagesKv);
  const bool e5m2 = kFp8Reg && p.kv.dtype == DType::kFloat8E5M2;
#pragma unroll 1
  for (int tile = 0; tile < num_tiles; ++tile) {
    dev::cp_async::wait<kStagesKv - 1>();  // tile `tile` (and Q) landed; the next may be in flight
    // ... for every thread; and (kFp8Smem) every warp is done with the 16-bit tile.
    __syncthreads();
    const int stage = tile % kStagesKv;
    // The offsets of tile + kStagesKv, whose copy this iteration issues after its next barrier;
    // the last copy that read the cache (tile + kStagesKv - 1's) came before the barrier above.
    // Their page ids were loaded an iteration ago; the next tile's load now.
    if constexpr (!kFp8Smem) {
      fill_from(tile + kStagesKv, next_page);
      next_page = page_of(tile + kStagesKv + 1);
    } else {
      // The fp8 stage widened into the 16-bit tile; the stage is then free for tile +
      // kStagesKv, whose copy overlaps this tile's math.
      const uint4* k8 = k8_s + stage * kKvTile * kUnitsK;
      const uint4* v8 = v8_s + stage * kKvTile * kUnitsV;
      if (p.kv.dtype == DType::kFloat8E5M2) {
        detail::widen_tile<T, __NV_E5M2, DQK, kKvTile>(k_s, k8, tid);
        detail::widen_tile<T, __NV_E5M2, DVO, kKvTile>(v_s, v8, tid);
      } else {
        detail::widen_tile<T, __NV_E4M3, DQK, kKvTile>(k_s, k8, tid);
        detail::widen_tile<T, __NV_E4M3, DVO, kKvTile>(v_s, v8, tid);
      }
      fill_from(tile + kStagesKv, next_page);  // after widening
      next_page = page_of(tile + kStagesKv + 1);
      __syncthreads();
      load_kv(tile + kStagesKv);
    }
    const int stage16 = kFp8Smem ? 0 : stage;  // the 16-bit tile the warps read
    // The tile's position: 32 bits in 128-row blocks, 64 in the others (32 spilled in the
    // 256-dim 64-row ones). Whether the tile needs the per-element visibility test: the index
    // range computed before the loop (prefill_unmasked_tiles), decided before the MMAs so that one
    // predicate is live across them.
    using TilePos = std::conditional_t<kCtaQ == 128, int32_t, int64_t>;
    const TilePos t0 = tile_key0(TilePos{}, tile);
    const int2 range =
        kRangeInSmem ? *tile_range_s : make_int2(unmasked_tiles.lo, unmasked_tiles.hi);
    const bool unmasked = range.x <= tile && tile <= range.y;
    if (warp_active) {
      // Each lane's fragment bases in the tiles (permuted_lane_base; rows and columns from
      // prefill_shape.h's *_frag_lane).
      const FragLane ql = prefill_q_frag_lane(lane), kl = prefill_k_frag_lane(lane),
                     vl = prefill_v_frag_lane(lane);
      const uint32_t qa = dev::permuted_lane_base(dev::cp_async::smem_addr(q_s),
                                                  warp_q * 16 * kMmaQ + ql.row, ql.c, kUnitsQk);
      // kFp8Reg: K and V lanes alike (prefill_fp8_frag_lane), on the fp8 stage's lines.
      const FragLane f8 = prefill_fp8_frag_lane(lane, kUnitsK);
      const uint32_t ka =
          kFp8Reg
              ? dev::permuted_lane_base(dev::cp_async::smem_addr(k8_s + stage * kKvTile * kUnitsK),
                                        key_off / kKeysPerLine + f8.row, f8.c, kLineUnits)
              : dev::permuted_lane_base(
                    dev::cp_async::smem_addr(k_s + stage16 * kKvTile * kUnitsQk), key_off + kl.row,
                    kl.c, kUnitsQk);
      const uint32_t va =
          kFp8Reg
              ? dev::permuted_lane_base(dev::cp_async::smem_addr(v8_s + stage * kKvTile * kUnitsV),
                                        key_off / kKeysPerLine + f8.row, f8.c, kLineUnits)
              : dev::permuted_lane_base(
                    dev::cp_async::smem_addr(v_s + stage16 * kKvTile * kUnitsVo), key_off + vl.row,
                    vl.c, kUnitsVo);
      const int32_t tw0 = static_cast<int32_t>(t0) + key_off;  // this warp's first key

      // S = Q K^T: A from the warp's Q rows, B pairs of 8-key blocks from K rows.
      float s[kMmaQ][2 * kMmaKv][4];
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
        for (int n = 0; n < 2 * kMmaKv; ++n)
          s[mq][n][0] = s[mq][n][1] = s[mq][n][2] = s[mq][n][3] = 0.0f;
      }
      // fp8 K: one two-tile ldmatrix a 16-key step of one dim step (lanes 0..15 name unit kk of
      // keys lane % 16: prefill_fp8_frag_lane), word blk widened to the B operand of key block
      // 2 nk + blk. (Two dim steps a four-tile load held 8 more A registers: the 128-row block
      // spilled.) `kind` is the fp8 format (unused for 16-bit K).
      auto s_loop = [&](auto kind) {
#pragma unroll
        for (int kk = 0; kk < DQK / 16; ++kk) {
          uint32_t a[kMmaQ][4];
#pragma unroll
          for (int mq = 0; mq < kMmaQ; ++mq) {
            dev::mma::ldmatrix_x4(a[mq], dev::permuted_frag_addr(qa, mq * 16, kk * 2, kUnitsQk));
          }
#pragma unroll
          for (int nk = 0; nk < kMmaKv; ++nk) {
            if constexpr (kFp8Reg) {
              // Unit kk may be odd: permuted_frag_addr's add-is-XOR holds for lanes 0..15,
              // whose unit bits are 0 (or 4, paired keys at head dim 64, kk < 4); the x2 form
              // reads no other lane's address.
              uint32_t r8[2];
              dev::mma::ldmatrix_x2(
                  r8, dev::permuted_frag_addr(ka, nk * 16 / kKeysPerLine, kk, kLineUnits));
#pragma unroll
              for (int blk = 0; blk < 2; ++blk) {
                const uint2 w8 = dev::fp8x4_widen<T, decltype(kind)::value>(r8[blk]);
                const uint32_t bk[2] = {w8.x, w8.y};
#pragma unroll
                for (int mq = 0; mq < kMmaQ; ++mq) {
                  dev::mma::mma_m16n8k16<T>(s[mq][2 * nk + blk], a[mq], bk);
                }
              }
            } else {
              uint32_t bk[4];
              dev::mma::ldmatrix_x4(bk, dev::permuted_frag_addr(ka, nk * 16, kk * 2, kUnitsQk));
#pragma unroll
              for (int mq = 0; mq < kMmaQ; ++mq) {
                dev::mma::mma_m16n8k16<T>(s[mq][2 * nk], a[mq], bk);
                dev::mma::mma_m16n8k16<T>(s[mq][2 * nk + 1], a[mq], bk + 2);
              }
            }
          }
        }
      };
      using E4m3 = std::integral_constant<__nv_fp8_interpretation_t, __NV_E4M3>;
      using E5m2 = std::integral_constant<__nv_fp8_interpretation_t, __NV_E5M2>;
      if (e5m2) {
        s_loop(E5m2{});
      } else {
        s_loop(E4m3{});
      }

      // Logits in base 2; the per-element test only where the tile needs it.
      // Custom mask: each row's bits for this warp's keys of the tile, 32 keys to a register,
      // read once per tile.
      constexpr int kMaskWords = (kKvWarp + 31) / 32;
      uint32_t mwin[kMmaQ][2][kCustomMask ? kMaskWords : 1];
      if constexpr (kCustomMask) {
        const auto* words = reinterpret_cast<const uint32_t*>(p.custom_mask);
#pragma unroll
        for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int c = 0; c < kMaskWords; ++c) {
              const int32_t key0 = tw0 + 32 * c;
              const int32_t nbits = min(min(32, kKvWarp - 32 * c), kv_hi32 - key0);
              const int64_t mr = mask_row[mq][r];
              mwin[mq][r][c] = mr < 0 ? 0u
                               : p.multi_item_rows == nullptr
                                   ? prefill_mask_window(words, mr + key0, nbits)
                                   : prefill_item_window(static_cast<int32_t>(mr),
                                                         static_cast<int32_t>(mr >> 32),
                                                         pos_of[mq][r], key0, nbits);
            }
          }
        }
      }
      // Soft cap and ALiBi: the logits now; the other blocks keep q.k (kFoldScale).
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
        for (int n = 0; n < 2 * kMmaKv; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if constexpr (kSoftCap) {
              s[mq][n][e] = logit_log2(p, s[mq][n][e], p.sm_scale);
            } else if constexpr (kAlibi) {
              // Upstream's DefaultAttention: sm_scale * q.k + slope * (j - i), as the CPU
              // reference computes it, then log2 units.
              const int32_t kj = tw0 + n * 8 + tid4 * 2 + (e & 1);
              const int r = e >> 1;
              s[mq][n][e] = (s[mq][n][e] * p.sm_scale +
                             slope[mq][r] * static_cast<float>(kj - q_idx[mq][r])) *
                            kLog2e;
            }
          }
        }
      }
      // The visibility test as one pass behind one branch: a test inside the loop above became
      // a branch per element, taken on every tile.
      if (!unmasked) {
        // Keys as offsets d from the row's position, within [d_min, d_max]: two bounds for all
        // rows (per-row limits would be loop-invariant, hoisted, and held in registers).
        const int32_t d_max = p.causal ? 0 : INT32_MAX;
        const int32_t d_min = p.window_left >= 0 ? -p.window_left : INT32_MIN;
#pragma unroll
        for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int32_t pos = pos_of[mq][r];
#pragma unroll
            for (int n = 0; n < 2 * kMmaKv; ++n) {
#pragma unroll
              for (int i = 0; i < 2; ++i) {
                const int32_t kj = tw0 + n * 8 + tid4 * 2 + i;
                const int32_t d = kj - pos;  // kj <= pos (causal), kj >= pos - window_left
                bool vis = (kj < kv_hi32) & (d <= d_max) & (d >= d_min);
                if constexpr (kCustomMask) {
                  // Key kj - tw0 = 8 n + 2 tid4 + i of the warp's keys: window n / 4, bit
                  // below 32.
                  vis = vis && ((mwin[mq][r][n >> 2] >> ((n & 3) * 8 + tid4 * 2 + i)) & 1u);
                }
                if (!vis) s[mq][n][2 * r + i] = -INFINITY;
              }
            }
          }
        }
      }
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq) {
        float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < 2 * kMmaKv; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) tmax[e >> 1] = fmaxf(tmax[e >> 1], s[mq][n][e]);
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
          tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
          if constexpr (kFoldScale) tmax[r] *= p.sm_scale_log2;  // -inf stays -inf (c > 0)
        }
        // The state rescaled only when a row of the warp has a new maximum
        // (dev::rescale_on_new_max).
        dev::rescale_on_new_max(m[mq], l[mq], tmax, [&](int r, float factor) {
#pragma unroll
          for (int n = 0; n < DVO / 8; ++n) {
            o[mq][n][2 * r] *= factor;
            o[mq][n][2 * r + 1] *= factor;
          }
        });
        // P = 2^(s - m), 0 for a hidden key. The test is per row, not per element: with m finite,
        // 2^(-inf - m) is already 0; only m = -inf (every key of the row hidden so far, or
        // -inf / NaN logits) needs another subtrahend, and 0 gives the same values there: 0 for
        // -inf, NaN for NaN.
        const float m_sub[2] = {m[mq][0] == -INFINITY ? 0.0f : m[mq][0],
                                m[mq][1] == -INFINITY ? 0.0f : m[mq][1]};
#pragma unroll
        for (int n = 0; n < 2 * kMmaKv; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float arg = kFoldScale ? fmaf(s[mq][n][e], p.sm_scale_log2, -m_sub[e >> 1])
                                         : s[mq][n][e] - m_sub[e >> 1];
            s[mq][n][e] = dev::exp2_ftz(arg);
          }
          // Per-thread partial row sums: the quad shares m, so they are summed once at the end.
          l[mq][0] += s[mq][n][0] + s[mq][n][1];
          l[mq][1] += s[mq][n][2] + s[mq][n][3];
        }
      }

      // O += P V: the S accumulators of key blocks 2j, 2j + 1 are the A operand of key step j;
      // V rows through the transposing ldmatrix give the B operands of two 8-wide d blocks.
#pragma unroll
      for (int j = 0; j < kMmaKv; ++j) {
        uint32_t a[kMmaQ][4];
#pragma unroll
        for (int mq = 0; mq < kMmaQ; ++mq) {
          a[mq][0] = dev::mma::pack2<T>(s[mq][2 * j][0], s[mq][2 * j][1]);
          a[mq][1] = dev::mma::pack2<T>(s[mq][2 * j][2], s[mq][2 * j][3]);
          a[mq][2] = dev::mma::pack2<T>(s[mq][2 * j + 1][0], s[mq][2 * j + 1][1]);
          a[mq][3] = dev::mma::pack2<T>(s[mq][2 * j + 1][2], s[mq][2 * j + 1][3]);
        }
        if constexpr (kFp8Reg) {
          // One transposing ldmatrix of fp8 V: 16 keys x units u, u + 1 (u = 2 nd2); words
          // 2h, 2h + 1 (keys 0-7, 8-15) of unit u + h give b0, b1 of accumulator blocks
          // 2 (u + h) (even dims) and + 1 (odd dims).
          auto pv_fp8 = [&](auto kind) {
            constexpr __nv_fp8_interpretation_t kKind = decltype(kind)::value;
#pragma unroll
            for (int nd2 = 0; nd2 < DVO / 32; ++nd2) {
              uint32_t r8[4];
              dev::mma::ldmatrix_x4_trans(
                  r8, dev::permuted_frag_addr(va, j * 16 / kKeysPerLine, nd2 * 2, kLineUnits));
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const uint2 w0 = dev::fp8x4_widen<T, kKind>(dev::fp8_trans_pairs(r8[2 * h]));
                const uint2 w1 = dev::fp8x4_widen<T, kKind>(dev::fp8_trans_pairs(r8[2 * h + 1]));
                const uint32_t be[2] = {w0.x, w1.x}, bo[2] = {w0.y, w1.y};
                const int u = 2 * nd2 + h;
#pragma unroll
                for (int mq = 0; mq < kMmaQ; ++mq) {
                  dev::mma::mma_m16n8k16<T>(o[mq][2 * u], a[mq], be);
                  dev::mma::mma_m16n8k16<T>(o[mq][2 * u + 1], a[mq], bo);
                }
              }
            }
          };
          if (e5m2) {
            pv_fp8(E5m2{});
          } else {
            pv_fp8(E4m3{});
          }
        } else {
#pragma unroll
          for (int nd = 0; nd < DVO / 16; ++nd) {
            uint32_t bv[4];
            dev::mma::ldmatrix_x4_trans(bv, dev::permuted_frag_addr(va, j * 16, nd * 2, kUnitsVo));
#pragma unroll
            for (int mq = 0; mq < kMmaQ; ++mq) {
              dev::mma::mma_m16n8k16<T>(o[mq][2 * nd], a[mq], bv);
              dev::mma::mma_m16n8k16<T>(o[mq][2 * nd + 1], a[mq], bv + 2);
            }
          }
        }
      }
    }
    if constexpr (!kFp8Smem) {
      __syncthreads();  // every warp is done with this stage before it is refilled
      load_kv(tile + kStagesKv);
    }
  }
  dev::cp_async::wait<0>();  // no copy may still target shared memory when the block exits

  if constexpr (kWarpsKv > 1) {
    // Warps 1..3 saw other keys of the same rows: warp 0 merges their states into its own. Lane
    // l of every warp holds the same (row, column) elements, so the merge is lane by lane. The
    // K/V stages are free: every copy has landed (wait<0> above) and every warp passed the
    // loop's last barrier after its last read of them.
    constexpr int kSlots = prefill_merge_slots(DVO);
    static_assert(kMmaQ == 1, "16-row blocks hold one m16 fragment a warp");
    static_assert(prefill_merge_bytes(kCtaQ, DVO) <= prefill_kv_stage_bytes(kCtaQ, DQK, DVO),
                  "the merge buffer lives in the K/V stages");
    float* mbuf = reinterpret_cast<float*>(k_s);  // [kWarpsKv - 1][kSlots][32]
    if (warp_kv > 0) {
      float* dst = mbuf + (warp_kv - 1) * kSlots * 32 + lane;
#pragma unroll
      for (int n = 0; n < DVO / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) dst[(n * 4 + e) * 32] = o[0][n][e];
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        dst[(DVO / 2 + r) * 32] = m[0][r];
        dst[(DVO / 2 + 2 + r) * 32] = l[0][r];
      }
    }
    __syncthreads();
    if (warp_kv > 0) {
      pdl_launch_dependents();
      return;
    }
#pragma unroll 1
    for (int w = 0; w < kWarpsKv - 1; ++w) {
      const float* src = mbuf + w * kSlots * 32 + lane;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // Per-thread partial sums merge like the O values: the quad shares the max, hence the
        // scales (dev::merge_state: an empty state carries no weight; NaN sums stay NaN).
        float s_mine, s_other;
        dev::merge_state(m[0][r], l[0][r], src[(DVO / 2 + r) * 32], src[(DVO / 2 + 2 + r) * 32],
                         &s_mine, &s_other, &m[0][r], &l[0][r]);
#pragma unroll
        for (int n = 0; n < DVO / 8; ++n) {
          o[0][n][2 * r] = o[0][n][2 * r] * s_mine + src[(n * 4 + 2 * r) * 32] * s_other;
          o[0][n][2 * r + 1] =
              o[0][n][2 * r + 1] * s_mine + src[(n * 4 + 2 * r + 1) * 32] * s_other;
        }
      }
    }
  }

  if (!warp_active) {
    pdl_launch_dependents();
    return;
  }
  float out_scale = p.v_scale;
  if (p.scale_v) out_scale *= p.scale_v[g];
#pragma unroll
  for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lr = l[mq][r];
      lr += __shfl_xor_sync(0xffffffffu, lr, 1);
      lr += __shfl_xor_sync(0xffffffffu, lr, 2);
      const int32_t pr = warp_row0 + mq * 16 + gid + 8 * r;
      if (pr >= rows) continue;
      // The row's query from its position (pos_of = pos_shift + query for a real row), not a
      // second divmod of pr: the compiler kept that one's quotients live across the KV loop.
      const uint32_t qrel = static_cast<uint32_t>(pos_of[mq][r] - pos_shift);
      const int32_t h = g * group + (pr - static_cast<int32_t>(qrel) * group);
      // fp8: pair n's values from blocks 2 (n / 2) + c, register 2 r + n % 2 (prefill_o_pair_col).
      prefill_store_row<T, DVO, kFp8Reg>(p, w, q_base, qrel, h, m[mq][r], lr, out_scale, tid4,
                                         [&](int n, int c) {
                                           if constexpr (kFp8Reg) {
                                             return o[mq][2 * (n / 2) + c][2 * r + n % 2];
                                           } else {
                                             return o[mq][n][2 * r + c];
                                           }
                                         });
    }
  }
  pdl_launch_dependents();
}

}  // namespace flashinfer::kernels::cuda::prefill
