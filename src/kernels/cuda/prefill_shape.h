// The tile shapes of the FA2 prefill kernel (prefill_kernel.cuh), as plain constexpr arithmetic
// shared by the kernel, its launcher and the CPU tests (tests/api/test_prefill_shape.cpp).
//
// A block is 4 warps. In 64- and 128-row blocks they are stacked along the query rows: warp w owns
// rows [16 * kMmaQ * w, 16 * kMmaQ * (w + 1)) of the block's packed rows (a packed row is one
// (query, qo head) pair of the KV head's GQA group) and sees every key of a K/V tile. In 16-row
// blocks (short packed queries, tensor-core decode) the 4 warps share the 16 rows and each takes
// a quarter of every K/V tile's keys; at the end warps 1-3 hand their softmax states (O, max, sum)
// to warp 0 through shared memory, which merges them and writes the output, as upstream's
// NUM_WARPS_KV = 4 blocks do. K/V move through shared memory in tiles of kv_tile keys, two
// stages deep. The choices follow upstream's FA2 prefill (cta_tile_q 16 / 64 / 128 from the
// packed query length); the tile sizes keep the S and O fragments of a thread within 255
// registers and two blocks on an SM.
#pragma once

#include <cstdint>

#include "kernels/cuda/device/host_device.h"
#include "kernels/cuda/device/permuted_smem.cuh"

namespace flashinfer::kernels::cuda::prefill {

constexpr int kPrefillWarps = 4;
constexpr int kPrefillThreads = kPrefillWarps * 32;
constexpr int kPrefillStages = 2;

/// Variant bits, compile-time: without them the kernel has no tanh and reads no mask.
constexpr int kPrefillSoftCap = 1;
constexpr int kPrefillCustomMask = 2;
/// ALiBi (pos_encoding_mode="ALIBI"): slopes[h] * (j - i) on the scaled logit. Built alone only:
/// with a soft cap or a custom mask it runs on the CUDA-core kernel (prefill_variant_built).
constexpr int kPrefillAlibi = 4;

/// A call's variant bits: its soft cap, custom mask and ALiBi (the planner's and the launchers'
/// one spelling).
FLASHINFER_HD constexpr int prefill_variant_bits(bool soft_cap, bool custom_mask, bool alibi) {
  return (soft_cap ? kPrefillSoftCap : 0) | (custom_mask ? kPrefillCustomMask : 0) |
         (alibi ? kPrefillAlibi : 0);
}

/// Whether the FA2 kernel is built for this head-dim pair (ahead of time): equal dims 64, 128
/// and 256, and DeepSeek's 192 / 128. Other multiples of 16 run on the first-draft tensor-core
/// kernel through NVRTC.
FLASHINFER_HD constexpr bool prefill_dims_built(int dqk, int dvo) {
  return (dqk == dvo && (dqk == 64 || dqk == 128 || dqk == 256)) || (dqk == 192 && dvo == 128);
}

/// Whether the FA2 kernel has an instance of this variant: each bit alone, and the soft cap with a
/// custom mask (ALiBi with a soft cap or a custom mask runs on the CUDA-core kernel).
FLASHINFER_HD constexpr bool prefill_variant_built(int variant) {
  return variant >= 0 && variant <= (kPrefillSoftCap | kPrefillCustomMask | kPrefillAlibi) &&
         ((variant & kPrefillAlibi) == 0 || variant == kPrefillAlibi);
}

/// Whether the FA2 kernel is built for fp8 K/V (e4m3 or e5m2, widened to q's 16-bit type: in
/// registers in 16-row blocks, "fp8 K/V" below; in shared memory in 64-row blocks) with this
/// head-dim pair and variant: equal dims 64, 128 and 256 (192 / 128 with fp8 K/V runs on the
/// CUDA-core kernel; each fp8 instance costs as much compile time as a 16-bit one), every variant
/// the 16-bit blocks have (prefill_variant_built: a custom mask is SGLang's speculative-decoding
/// verify, whose KV cache may be fp8), in 16- and 64-row blocks as prefill_cta_rows gives them
/// (16 rows for every variant but ALiBi; the launcher runs 64-row blocks where
/// prefill_cta_rows says 128: with the widening there every arrangement of the offset cache
/// spilled). Its blocks ask for the same shared memory as the 16-bit ones (prefill_smem_bytes):
/// kPrefillFp8Stages fp8 stages, or one 16-bit tile and kPrefillStages fp8 stages, take the bytes
/// of kPrefillStages 16-bit stages.
FLASHINFER_HD constexpr bool prefill_fp8_kv_built(int dqk, int dvo, int variant) {
  return dqk == dvo && (dqk == 64 || dqk == 128 || dqk == 256) && prefill_variant_built(variant);
}

/// Whether the FA2 kernel takes a call's scale: its plain and custom-mask blocks take the maximum
/// over raw q.k and scale inside the exponent (2^(s c - m) as one FFMA, c = sm_scale log2(e)),
/// which is the softmax of c s only when c > 0 and finite; c is one number for the block, so
/// per-head device scales (scale_q, scale_k: values the host cannot see) are refused too. Such
/// calls run on the CUDA-core kernel; the rule holds for every variant (the soft-cap and ALiBi
/// blocks have no per-row scales either). (`!(x > 0)` also refuses NaN; the bound is FLT_MAX /
/// log2(e), spelled out to stay constexpr.)
FLASHINFER_HD constexpr bool prefill_scale_folds(float sm_scale, bool has_scale_q,
                                                 bool has_scale_k) {
  return sm_scale > 0.0f && sm_scale <= 3.4028234663852886e38f / 1.4426950408889634f &&
         !has_scale_q && !has_scale_k;
}

/// The divisor of the token -> (page, slot) split the FA2 kernel's offset fill uses: the page
/// size of a paged cache, 1 for ragged K/V (a token is its own page). The launcher builds the
/// FastDivmod of it once (AttentionParams::kv_page_div_*); the kernel names the same divisor.
FLASHINFER_HD constexpr unsigned prefill_page_divisor(bool paged, int page_size) {
  return paged ? static_cast<unsigned>(page_size) : 1u;
}

/// The FA2 kernel's grid: x the KV head, y the work item counted from the plan's last, z the row
/// chunk (of a work item's packed rows). The hardware starts blocks in the order of their index,
/// x fastest, so the plan's last work item starts first, all its heads together. The plan lists
/// a request's query tiles in order, and under a causal mask the later ones see more keys: the
/// heaviest blocks start first and the lightest fill the last wave (longest-first list
/// scheduling). With the work items along x and the heads along y, the heaviest blocks of the
/// last head started last and ran alone. gridDim.y holds 65535: a plan with more work items is
/// launched in slices of at most that many, the last slice first (prefill_grid_slice).
constexpr int kPrefillMaxGridY = 65535;
struct PrefillSlice {
  int first, count;  // work items [first, first + count) of the plan
};
/// Slice i (0 first) of a plan of num_work items; count 0 past the last.
FLASHINFER_HD constexpr PrefillSlice prefill_grid_slice(int num_work, int i) {
  const int end = num_work - i * kPrefillMaxGridY;
  if (end <= 0) return {0, 0};
  const int first = end > kPrefillMaxGridY ? end - kPrefillMaxGridY : 0;
  return {first, end - first};
}

/// Packed rows per block (the CTA tile along Q) for a launch whose work items hold at most
/// max_packed_rows packed rows, as upstream picks cta_tile_q:
///   16: one m16 fragment of rows shared by the 4 warps, which split each K/V tile along the keys
///     and merge their softmax states at the end (short packed queries: tensor-core decode, a
///     GQA group of <= 16 heads; a speculative-decoding verify of a few draft tokens with its
///     custom mask); head dims up to 192, every variant but ALiBi (which takes 64);
///   128: 4 warps x 32 rows, for packed queries longer than 64, only where the fragments fit 255
///     registers without spilling (ptxas, sm_90): dqk, dvo <= 128 and the plain variant (the soft
///     cap's tanhf spilled 52 bytes, the mask test 72);
///   64: 4 warps x 16 rows, everything else.
FLASHINFER_HD constexpr int prefill_cta_rows(int max_packed_rows, int dqk, int dvo, int variant) {
  if (max_packed_rows <= 16 && dqk <= 192 && dvo <= 192 &&
      (variant & ~(kPrefillSoftCap | kPrefillCustomMask)) == 0) {
    return 16;
  }
  if (max_packed_rows > 64 && dqk <= 128 && dvo <= 128 && variant == 0) return 128;
  return 64;
}

/// The block height the launcher runs (prefill_fa2_launch.cuh) before the device check for tall
/// blocks: prefill_cta_rows, but 64 rows for fp8 K/V where it says 128 (no 128-row fp8 block:
/// with the widening, every arrangement of its offset cache spilled). The planner rounds split
/// chunks to this block's K/V tile.
FLASHINFER_HD constexpr int prefill_launch_cta_rows(int max_packed_rows, int dqk, int dvo,
                                                    int variant, bool fp8_kv) {
  const int cta = prefill_cta_rows(max_packed_rows, dqk, dvo, variant);
  return fp8_kv && cta == 128 ? 64 : cta;
}

/// The planner's cta_tile_q (upstream's rule): from the average packed query length of a batch,
/// 128 above 64 rows (head_dim_vo < 256), 64 above 16, else 16. Work items then hold
/// max(1, cta_tile_q / group) queries each.
FLASHINFER_HD constexpr int prefill_plan_cta_tile_q(double avg_packed_rows, int head_dim_vo) {
  return (avg_packed_rows > 64 && head_dim_vo < 256) ? 128 : (avg_packed_rows > 16 ? 64 : 16);
}

/// m16 fragments per warp along Q: two in 128-row blocks, else one.
FLASHINFER_HD constexpr int prefill_mma_q(int cta_q) { return cta_q == 128 ? 2 : 1; }

/// Warps that split a K/V tile along the keys: all four in 16-row blocks (they share the rows),
/// else one (the warps are stacked along the rows and each sees the whole tile).
FLASHINFER_HD constexpr int prefill_warps_kv(int cta_q) { return cta_q == 16 ? kPrefillWarps : 1; }

/// Blocks per SM the kernel's registers are budgeted for (its __launch_bounds__): 3 where both
/// head dims are <= 64 and K/V are 16-bit, whose block shapes all fit 168 registers without
/// spilling (ptxas, sm_90; the 128-row block took 198 with a budget of 2, and with fp8 K/V it
/// spills 8 bytes at 168), so 12 warps share an SM's latency; else 2 (a 128-row block at head
/// dim 128 holds 128 O floats a thread). The planner still counts 2 per SM for the tensor-core
/// kernel (kTensorCoreBlocksPerSm), so plans and results do not change.
FLASHINFER_HD constexpr int prefill_min_blocks_per_sm(int dqk, int dvo, bool fp8_kv) {
  return (dqk <= 64 && dvo <= 64 && !fp8_kv) ? 3 : 2;
}

/// Keys per K/V tile (all warps together). 16-row blocks: 16 keys a warp (32 at head dim 64),
/// so that every block fits twice per SM. 128-row blocks: 64 keys at head dim 128 (upstream's
/// and FA2's 128 x 64 tile: the S and O fragments are 64 + 128 floats a thread, 255 registers
/// without a spill on sm_90), 32 at head dim 64 (its blocks are budgeted for 3 per SM, 168
/// registers: 64 keys spilled 96 bytes there).
FLASHINFER_HD constexpr int prefill_kv_tile(int cta_q, int dqk, int dvo) {
  if (cta_q == 16) return kPrefillWarps * ((dqk <= 64 && dvo <= 64) ? 32 : 16);
  if (cta_q == 128) return (dqk <= 64 && dvo <= 64) ? 32 : 64;
  return (dqk > 128 || dvo > 128) ? (dqk == 192 ? 64 : 32) : 64;
}

/// Floats a lane of a 16-row block's warp keeps for the end-of-block merge: its O fragments
/// (dvo / 8 blocks of 4) and the max and row sum of its two rows.
FLASHINFER_HD constexpr int prefill_merge_slots(int dvo) { return dvo / 2 + 4; }

/// Bytes of the merge buffer of a block: warps 1..3 of a 16-row block leave their states there
/// for warp 0, in the K/V stages' shared memory (free once the last tile is consumed).
FLASHINFER_HD constexpr unsigned prefill_merge_bytes(int cta_q, int dvo) {
  return 4u * static_cast<unsigned>((prefill_warps_kv(cta_q) - 1) * 32 * prefill_merge_slots(dvo));
}

/// Dynamic shared memory of one block, in bytes, for 2-byte elements: the Q tile and
/// kPrefillStages stages of K and V tiles (which also hold a 16-row block's merge buffer).
FLASHINFER_HD constexpr unsigned prefill_kv_stage_bytes(int cta_q, int dqk, int dvo) {
  return 2u *
         static_cast<unsigned>(kPrefillStages * prefill_kv_tile(cta_q, dqk, dvo) * (dqk + dvo));
}
/// Tokens whose K and V element offsets a block keeps in shared memory: one tile's, filled one
/// token a thread before the tile's copy is issued, so that the copy loop reads an offset instead
/// of dividing and loading the page table per row. One tile, not a stage's worth of them: 16
/// bytes a token more would leave an A100 SM one 64-row head-dim-128 block instead of two.
FLASHINFER_HD constexpr int prefill_offset_cache_tokens(int cta_q, int dqk, int dvo) {
  return prefill_kv_tile(cta_q, dqk, dvo);
}
/// The Q tile and the K/V stages; the offset cache follows them.
FLASHINFER_HD constexpr unsigned prefill_tile_bytes(int cta_q, int dqk, int dvo) {
  return 2u * static_cast<unsigned>(cta_q * dqk) + prefill_kv_stage_bytes(cta_q, dqk, dvo);
}
/// Bytes after the offset cache for values every thread of the block reads once a tile: 16 in
/// 128-row blocks, whose range of unmasked tiles (two int32) spilled when held in registers across
/// the loop; none in the others (16 bytes more would cost an A100 SM one of its two 64-row
/// head-dim-128 blocks).
FLASHINFER_HD constexpr unsigned prefill_block_const_bytes(int cta_q) {
  return cta_q == 128 ? 16u : 0u;
}
FLASHINFER_HD constexpr unsigned prefill_smem_bytes(int cta_q, int dqk, int dvo) {
  return prefill_tile_bytes(cta_q, dqk, dvo) +
         16u * static_cast<unsigned>(prefill_offset_cache_tokens(cta_q, dqk, dvo)) +
         prefill_block_const_bytes(cta_q);
}

/// Whether an SM holds two 128-row blocks of a head-dim pair: `smem_per_sm` bytes of shared memory
/// for blocks, `reserved_per_block` of them kept by the driver for each (DeviceLimits). At head
/// dim 128 the 128 x 64 block takes 97 KiB: two fit an H100's 228 KiB, not an A100's 164 or
/// sm_86 / sm_89's 100, where the launcher takes 64-row blocks (80 KiB, two an A100 SM) instead,
/// with the same 64-key tiles, so a plan's chunks (whole tiles) hold for either height.
FLASHINFER_HD constexpr bool prefill_tall_blocks_fit(int dqk, int dvo, long smem_per_sm,
                                                     long reserved_per_block) {
  return 2 * (static_cast<long>(prefill_smem_bytes(128, dqk, dvo)) + reserved_per_block) <=
         smem_per_sm;
}

/// The most dynamic shared memory any block of a built head-dim pair asks for (over the block
/// heights prefill_cta_rows can pick for it). A device whose per-block opt-in limit is below it
/// (sm_86 / sm_89: 99 KiB, against 105 KiB for 192 / 128 in 64-row blocks) does not run the pair
/// on the FA2 kernel.
FLASHINFER_HD constexpr unsigned prefill_max_smem_bytes(int dqk, int dvo) {
  unsigned m = prefill_smem_bytes(64, dqk, dvo);
  if (dqk <= 192 && dvo <= 192 && prefill_smem_bytes(16, dqk, dvo) > m) {
    m = prefill_smem_bytes(16, dqk, dvo);
  }
  if (dqk <= 128 && dvo <= 128 && prefill_smem_bytes(128, dqk, dvo) > m) {
    m = prefill_smem_bytes(128, dqk, dvo);
  }
  return m;
}

/// Whether keys [t0, t0 + n) are visible to every row of a block in full, so the tile needs no
/// per-element test: all below the block's end `kv_hi`, causal rows whose first query sits at
/// position pos_min (every key <= pos_min), and a window of window_left keys before the last
/// query's position pos_max (window_left < 0: none). A custom mask always needs the test.
FLASHINFER_HD constexpr bool prefill_tile_unmasked(long long t0, int n, long long kv_hi,
                                                   bool causal, long long pos_min,
                                                   long long pos_max, int window_left,
                                                   bool custom_mask) {
  if (custom_mask || t0 + n > kv_hi) return false;
  if (causal && t0 + n - 1 > pos_min) return false;
  if (window_left >= 0 && t0 < pos_max - window_left) return false;
  return true;
}

/// The tiles of a block that prefill_tile_unmasked says need no per-element test, as one range of
/// tile indices [lo, hi] (empty when lo > hi): tile i holds keys [kv_lo + i n, kv_lo + (i + 1) n).
/// Each condition bounds i on one side (keys below kv_hi and, causal, below the first row's
/// position: from above; a window's start: from below), so the kernel keeps two integers across
/// its KV loop instead of the block's positions. Equal to the per-tile test for every tile (the
/// CPU tests check it over a grid of blocks).
struct TileRange {
  int lo, hi;
};
FLASHINFER_HD constexpr TileRange prefill_unmasked_tiles(long long kv_lo, long long kv_hi, int n,
                                                         bool causal, long long pos_min,
                                                         long long pos_max, int window_left,
                                                         bool custom_mask) {
  // floor(a / n) and ceil(a / n) for any sign of a (n > 0).
  auto floor_div = [](long long a, long long d) { return a >= 0 ? a / d : -((-a + d - 1) / d); };
  auto ceil_div = [](long long a, long long d) { return a >= 0 ? (a + d - 1) / d : -(-a / d); };
  if (custom_mask) return {1, 0};
  // t0 + n <= kv_hi, and causal: t0 + n - 1 <= pos_min, with t0 = kv_lo + i n.
  long long last_end = kv_hi;
  if (causal && pos_min + 1 < last_end) last_end = pos_min + 1;
  long long hi = floor_div(last_end - n - kv_lo, n);
  // Window: t0 >= pos_max - window_left.
  long long lo = window_left >= 0 ? ceil_div(pos_max - window_left - kv_lo, n) : 0;
  if (lo < 0) lo = 0;
  if (lo > 0x7fffffffLL) return {1, 0};  // no tile index reaches it
  if (hi > 0x7fffffffLL) hi = 0x7fffffffLL;
  if (hi < -1) hi = -1;
  return {static_cast<int>(lo), static_cast<int>(hi)};
}

/// The key tiles of a block under multi-item scoring's mask (AttentionParams::multi_item_bounds),
/// which upstream's kernels skip and a plain custom mask cannot: rows at positions [pos_min,
/// pos_max] see no key past pos_max (the mask holds the causal rule) and none in [prefix_len,
/// pos_min - max_item_len) (a query in the prefix sees keys below itself; one past it the prefix
/// and at most max_item_len + 1 keys of its own item, up to itself: plan() refuses a
/// token_pos_in_items entry past that). Of the tiles [kv_lo + i n, kv_lo + (i + 1) n) below the
/// capped end kv_hi, the `skip` tiles from index `split` on lie wholly in that gap: loop step i
/// takes tile i + (i >= split ? skip : 0). The other tiles keep their places, so a skipped tile
/// changes no bits of the result (each contributed exp2(-inf) = 0 to every row).
struct MultiItemTiles {
  long long kv_hi;  // the causal cap: min(kv_hi, pos_max + 1)
  int num_tiles, split, skip;
};
FLASHINFER_HD constexpr MultiItemTiles prefill_multi_item_tiles(long long kv_lo, long long kv_hi,
                                                                int n, long long pos_min,
                                                                long long pos_max,
                                                                long long prefix_len,
                                                                long long max_item_len) {
  auto floor_div = [](long long a, long long d) { return a >= 0 ? a / d : -((-a + d - 1) / d); };
  auto ceil_div = [](long long a, long long d) { return a >= 0 ? (a + d - 1) / d : -(-a / d); };
  MultiItemTiles t{kv_hi < pos_max + 1 ? kv_hi : pos_max + 1, 0, 0, 0};
  if (t.kv_hi <= kv_lo) return t;
  const long long total = ceil_div(t.kv_hi - kv_lo, n);
  // First tile wholly at or past the prefix, and the end of the tiles wholly below the gap's end.
  long long split = ceil_div(prefix_len - kv_lo, n);
  if (split < 0) split = 0;
  if (split > total) split = total;
  const long long gap_key = pos_min - max_item_len;  // the first key past the gap
  const long long gap_end = gap_key >= t.kv_hi ? total : floor_div(gap_key - kv_lo, n);
  t.num_tiles = static_cast<int>(total);
  t.split = static_cast<int>(split);
  if (gap_end > split) {
    t.skip = static_cast<int>(gap_end - split);
    t.num_tiles -= t.skip;
  }
  return t;
}

/// Multi-item scoring's mask bits for one row, as prefill_mask_window gives a custom mask's: bit i
/// for key key0 + i (i < nbits <= 32; the others 0) of a row at position q that sees keys [0, a)
/// and [lo, q] (AttentionParams::multi_item_rows). Keys, positions and bounds below 2^31, key0
/// >= 0: the differences fit in 32 bits.
FLASHINFER_HD constexpr uint32_t prefill_item_window(int a, int lo, int q, int key0, int nbits) {
  // Bits [0, n) set, for any n.
  auto below = [](int n) -> uint32_t { return n <= 0 ? 0u : n >= 32 ? ~0u : (1u << n) - 1u; };
  return (below(a - key0) | (below(q + 1 - key0) & ~below(lo - key0))) & below(nbits);
}

/// Whether a row at position q that sees keys [0, a) and [lo, q] (AttentionParams::multi_item_rows)
/// sees key kj: key_visible's rule, bit for bit prefill_item_window's for the rows the plan builds
/// (a <= q + 1). Bitwise, so that the Hopper kernel's test of a tile's 64 keys has no branch.
FLASHINFER_HD constexpr bool prefill_item_sees(int kj, int q, int a, int lo) {
  return (kj <= q) & ((kj < a) | (kj >= lo));
}

/// Row r's multi-item bounds (a, lo: both >= 0) in one register as the FA2 kernel keeps them,
/// lo << 32 | a, which is >= 0 (-1 marks a padding row there).
FLASHINFER_HD constexpr long long prefill_item_row(const int32_t* rows, long long r) {
  return (static_cast<long long>(rows[2 * r + 1]) << 32) | static_cast<uint32_t>(rows[2 * r]);
}

/// 32 custom-mask bits of one row from bit index bit0 on, low bit first: bit i of the mask is
/// bit i % 32 of 32-bit word i / 32 (upstream's little-endian packed bits). Only the first
/// `nbits` (at most 32) are keys of the row; a word holding none of them is not read, so a row's
/// last tile reads nothing past the mask. nbits <= 0: 0, nothing read.
FLASHINFER_HD constexpr uint32_t prefill_mask_window(const uint32_t* words, long long bit0,
                                                     int nbits) {
  if (nbits <= 0) return 0u;
  const long long w = bit0 >> 5;
  const unsigned sh = static_cast<unsigned>(bit0 & 31);
  const uint32_t lo = words[w];
  const uint32_t hi = ((bit0 + nbits - 1) >> 5) > w ? words[w + 1] : 0u;
  return sh == 0 ? lo : (lo >> sh) | (hi << (32 - sh));
}

/// The tile row and unit column bit (c, added to an even column) whose 16-byte unit a lane names
/// to ldmatrix_x4, for each operand of the kernel's MMAs (mma.m16n8k16 fragment layouts of the PTX
/// ISA; tests/api/test_prefill_shape.cpp emulates ldmatrix and the MMA with them):
///   Q (A operand, 16 rows x 16 columns): rows lane % 16, c = lane / 16, so the 4 matrices are
///     (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15)
///     = a0..a3;
///   K (B operands of two 8-key blocks): keys lane % 8 + 8 * (lane / 16), c = (lane / 8) % 2:
///     (keys 0-7, dims 0-7) = b0 and (keys 0-7, dims 8-15) = b1 of the first block, then the
///     same for keys 8-15;
///   V (B operands through the transposing ldmatrix, two 8-wide dim blocks): keys lane % 16,
///     c = lane / 16: (keys 0-7, dims 0-7) = b0, (keys 8-15, dims 0-7) = b1 of the first block,
///     then the same for dims 8-15.
struct FragLane {
  unsigned row, c;
};
FLASHINFER_HD constexpr FragLane prefill_q_frag_lane(int lane) {
  return {static_cast<unsigned>(lane & 15), static_cast<unsigned>(lane >> 4)};
}
FLASHINFER_HD constexpr FragLane prefill_k_frag_lane(int lane) {
  return {static_cast<unsigned>((lane & 7) + ((lane >> 4) << 3)),
          static_cast<unsigned>((lane >> 3) & 1)};
}
FLASHINFER_HD constexpr FragLane prefill_v_frag_lane(int lane) {
  return {static_cast<unsigned>(lane & 15), static_cast<unsigned>(lane >> 4)};
}

// ---- fp8 K/V: the tiles as stored, widened in registers ----------------------------------------
// The fp8 instances' 16-row blocks (whose warps split the keys, so each value is converted once)
// copy K/V tiles as they are stored (16 values a 16-byte unit) into kPrefillFp8Stages stages (the
// bytes of the 16-bit kernel's kPrefillStages) and read them with the same ldmatrix
// instructions, which then move byte pairs: a lane gets 4 fp8 values of each matrix (8 keys x 16
// dims), and each such word widens (device/fp8_widen.cuh) to the two B-operand registers of one
// m16n8k16 step, so no 16-bit tile, no widening pass through shared memory and no barrier for it
// (upstream's design for fp8 K/V). (64-row blocks, whose 4 warps each read every key, widen each
// tile once into a 16-bit tile in shared memory instead.)
// The words hold other elements than a 16-bit ldmatrix gives, so:
//   - S = Q K^T: lane (gid, t) gets dims 4t..4t+3 of a 16-dim step of key gid, where the MMA's
//     B operand wants dims 2t, 2t+1, 2t+8, 2t+9. The dot product does not care which slot of the
//     k axis holds which dim as long as A and B agree, so Q's 16-bit tile is permuted once per
//     block (prefill_fp8_q_words): slot 2t, 2t+1 <- dims 4t, 4t+1; slot 2t+8, 2t+9 <- 4t+2, 4t+3.
//   - O += P V (transposing ldmatrix): lane (gid, t) gets dims 2 gid, 2 gid + 1 of keys 2t, 2t+1
//     (and, from the next matrix, 2t+8, 2t+9): the B operands of two 8-wide blocks of output
//     dims, the even dims 16u + 2j (block 2u) and the odd ones 16u + 2j + 1 (block 2u + 1), once
//     the word's bytes are reordered (dev::fp8_trans_pairs). A lane's accumulators then hold dims
//     16u + 4t .. 16u + 4t + 3 (prefill_o_pair_col).
constexpr int kPrefillFp8Stages = 2 * kPrefillStages;

/// Units (16 bytes) of a line of the fp8 tiles' permuted layout: rows of 8 or more units are
/// lines of their own; head dim 64's 4-unit rows pair two keys on a 128-byte line (key 2i + h on
/// line i, units 4h..4h+3), which keeps the 8 rows an ldmatrix matrix reads on 8 distinct
/// 16-byte bank groups.
FLASHINFER_HD constexpr unsigned prefill_fp8_line_units(unsigned units) {
  return units < 8 ? 8u : units;
}
FLASHINFER_HD constexpr unsigned prefill_fp8_keys_per_line(unsigned units) {
  return units < 8 ? 8u / units : 1u;
}
/// Offset, in units, of unit `unit` of key `key` in an fp8 tile whose rows hold `units` units
/// (4, or a multiple of 8): key k on line k / keys_per_line, from unit (k % keys_per_line) units.
FLASHINFER_HD constexpr unsigned prefill_fp8_tile_offset(unsigned key, unsigned unit,
                                                         unsigned units) {
  const unsigned kpl = prefill_fp8_keys_per_line(units);
  return dev::permuted_offset(key / kpl, (key % kpl) * units + unit, prefill_fp8_line_units(units));
}
/// The line and unit-column bits a lane names to ldmatrix in an fp8 tile, for 16 keys from a
/// multiple of 16: key lane % 16, unit u + lane / 16. The transposing x4 load of V at an even u
/// reads (keys 0-7, u), (keys 8-15, u), (keys 0-7, u + 1), (keys 8-15, u + 1); the x2 load of K
/// at any u only lanes 0..15: (keys 0-7, u), (keys 8-15, u). `c` has bits 0 and (paired keys) 2
/// only, disjoint from u in both uses (u < 4 where keys pair), so dev::permuted_lane_base /
/// permuted_frag_addr address it with the line's units, 16 keys down being
/// 16 / prefill_fp8_keys_per_line lines.
FLASHINFER_HD constexpr FragLane prefill_fp8_frag_lane(int lane, unsigned units) {
  const unsigned key = static_cast<unsigned>(lane & 15), unit = static_cast<unsigned>(lane >> 4);
  const unsigned kpl = prefill_fp8_keys_per_line(units);
  return {key / kpl, (key % kpl) * units + unit};
}
/// Q's 16-bit words of one 16-dim step (w[i]: dims 2i, 2i + 1) in the order the fp8 K fragments
/// need (above): the even words, then the odd ones.
FLASHINFER_HD constexpr void prefill_fp8_q_words(const uint32_t (&w)[8], uint32_t (&out)[8]) {
  for (int i = 0; i < 4; ++i) {
    out[i] = w[2 * i];
    out[4 + i] = w[2 * i + 1];
  }
}
/// The output dim of pair n (n < dvo / 8) of a lane with quad index tid4 in the fp8 instances'
/// accumulator order: pair 2u + b holds dims 16u + 4 tid4 + 2b and + 1, from accumulator blocks
/// 2u (the even dim) and 2u + 1 (the odd), register 2r + b of row r. The 16-bit order: 8n + 2 tid4.
FLASHINFER_HD constexpr int prefill_o_pair_col(bool fp8_order, int n, int tid4) {
  return fp8_order ? 16 * (n / 2) + 4 * tid4 + 2 * (n % 2) : 8 * n + 2 * tid4;
}

}  // namespace flashinfer::kernels::cuda::prefill
