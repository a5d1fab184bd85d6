// The shapes and the dispatch rule of the Hopper prefill kernel (prefill_sm90_kernel.cuh): plain
// constexpr arithmetic shared by the kernel, its launcher and the CPU tests
// (tests/api/test_prefill_sm90_shape.cpp).
//
// A block is two warpgroups (256 threads) over 128 packed query rows, 64 a warpgroup, as the
// FA2 kernel's 128-row blocks are planned (same work items, same grid; head dims 64, 128, 256 and
// DeepSeek's 192 / 128), or one warpgroup over the plan's 64-row tiles (head dims 64, 128). S = Q
// K^T and O += P V are wgmma (m64nNk16, fp32 accumulation) with Q, K and V read from shared memory
// through matrix descriptors (V as the MN-major B operand) and P from registers; every thread
// copies K/V tiles of kv_tile keys with 16-byte cp.async into two stages in the 128-byte-swizzled
// layout the descriptors name. One block an SM at head dim 128 (its tiles take 160 KiB, 165 with
// the offsets and slack), two at 64; the tensor cores take the two warpgroups' products in turn, so
// one's softmax can overlap the other's product, though the block's per-tile barriers line them up
// again.
#pragma once

#include <cstdint>

#include "kernels/cuda/device/host_device.h"
#include "kernels/cuda/prefill_shape.h"

namespace flashinfer::kernels::cuda::prefill {

// Blocks of two warpgroups take work items of more than 64 packed rows (the plan's 128-row
// tiles), blocks of one warpgroup (64 rows) those of 17 to 64 (its 64-row tiles); `wg` below is
// the warpgroups of a block.
constexpr int kSm90Warpgroups = 2;  // the tall blocks
constexpr int kSm90Threads = kSm90Warpgroups * 128;
constexpr int kSm90CtaQ = kSm90Warpgroups * 64;  // packed query rows of a tall block
constexpr int kSm90Stages = 2;
// Slack for aligning the tiles to the 1024-byte period of the 128-byte swizzle (the descriptors
// address the swizzle by absolute shared-memory address bits).
constexpr unsigned kSm90SmemAlign = 1024;

FLASHINFER_HD constexpr int prefill_sm90_threads(int wg) { return 128 * wg; }
FLASHINFER_HD constexpr int prefill_sm90_cta_q(int wg) { return 64 * wg; }

/// The head-dim pairs with an instance: equal qk / vo dims 64, 128 and 256 in tall blocks, 64
/// and 128 in one-warpgroup blocks (at 256 their 128 threads would copy 4 rows a pass, not whole
/// 8-row swizzle phases, and one 160 KiB block of 4 warps an SM would idle the tensor cores), and
/// DeepSeek's qk 192 / vo 128 in tall blocks (its prefill: trtllm_ragged_attention_deepseek, the
/// fmha_v2 names, the ragged wrapper), with 16-bit K/V only (prefill_sm90_kv_built).
FLASHINFER_HD constexpr bool prefill_sm90_dim_built(int dqk, int dvo, int wg = kSm90Warpgroups) {
  return (dqk == dvo && (dqk == 64 || dqk == 128 || (dqk == 256 && wg == 2))) ||
         (dqk == 192 && dvo == 128 && wg == 2);
}

/// Whether K/V of this kind have an instance at these head dims: 16-bit K/V at every built pair,
/// fp8 at equal dims only (as the FA2 kernel, whose fp8 instances are equal dims too);
/// `multi_item` (multi-item scoring's rows: kSm90MultiItem), 16-bit K/V only.
FLASHINFER_HD constexpr bool prefill_sm90_kv_built(int dqk, int dvo, bool fp8_kv,
                                                   bool multi_item = false) {
  return !fp8_kv || (dqk == dvo && !multi_item);
}

/// Multi-item scoring's rows (AttentionParams::multi_item_rows: each query row sees keys [0, a)
/// and [lo, q]) as a variant bit of the Hopper rule below, apart from kPrefillCustomMask: the FA2
/// kernel runs them as a custom mask (prefill_variant), the Hopper kernel tests each row's two
/// runs of keys in its kMultiItem instances and skips the tiles no row of a block sees
/// (prefill_multi_item_tiles), as upstream's FA3 kernel runs these calls on Hopper. Built for head
/// dims 128 (SGLang's scoring models: Qwen3 rerankers, Llama), q of either 16-bit dtype, K/V of
/// q's dtype, no soft cap, the plain schedule, in tall and one-warpgroup blocks; the other calls
/// take the FA2 kernel.
constexpr int kSm90MultiItem = 8;
static_assert((kSm90MultiItem & (kPrefillSoftCap | kPrefillCustomMask | kPrefillAlibi)) == 0,
              "a bit of its own");

/// The Hopper rule's variant bits of a call: prefill_variant_bits, with multi-item scoring's rows
/// as kSm90MultiItem instead of a custom mask.
FLASHINFER_HD constexpr int prefill_sm90_variant(bool soft_cap, bool custom_mask, bool multi_item,
                                                 bool alibi) {
  return prefill_variant_bits(soft_cap, custom_mask, alibi) | (multi_item ? kSm90MultiItem : 0);
}

/// Whether multi-item scoring's rows have an instance at these head dims (kSm90MultiItem).
FLASHINFER_HD constexpr bool prefill_sm90_multi_item_built(int dqk, int dvo) {
  return dqk == 128 && dvo == 128;
}

/// Keys of a K/V tile: 128 in tall blocks whose O rows are 128 wide (head dims 128 and 192 / 128:
/// S and O take 64 fp32 accumulators a thread each), 64 otherwise.
FLASHINFER_HD constexpr int prefill_sm90_kv_tile(int dqk, int dvo, int wg = kSm90Warpgroups) {
  return dvo == 128 && dqk <= 192 && wg == 2 ? 128 : 64;
}

/// Blocks an SM holds: two at head dim 64 (tall: registers capped at 128 a thread by the launch
/// bounds) and in one-warpgroup blocks at 128 (80 KiB of tiles each), one for tall blocks at 128,
/// 192 / 128 and 256 (165 / 213 / 195 KiB).
FLASHINFER_HD constexpr int prefill_sm90_min_blocks(int dqk, int wg = kSm90Warpgroups) {
  return dqk <= 64 || wg == 1 ? 2 : 1;
}

/// Bytes of the 16-bit Q tile, and of one stage's K and V tiles (kv_tile keys of dqk and dvo).
FLASHINFER_HD constexpr unsigned prefill_sm90_q_bytes(int dqk, int wg = kSm90Warpgroups) {
  return static_cast<unsigned>(prefill_sm90_cta_q(wg)) * static_cast<unsigned>(dqk) * 2u;
}
FLASHINFER_HD constexpr unsigned prefill_sm90_k_bytes(int dqk, int dvo, int wg = kSm90Warpgroups) {
  return static_cast<unsigned>(prefill_sm90_kv_tile(dqk, dvo, wg)) * static_cast<unsigned>(dqk) *
         2u;
}
FLASHINFER_HD constexpr unsigned prefill_sm90_v_bytes(int dqk, int dvo, int wg = kSm90Warpgroups) {
  return static_cast<unsigned>(prefill_sm90_kv_tile(dqk, dvo, wg)) * static_cast<unsigned>(dvo) *
         2u;
}

/// Dynamic shared memory of a block: Q, the K and V stages, two buffers of the K/V byte offsets
/// of one tile's tokens (two int64 a key), the unmasked tile range (16 bytes) and the alignment
/// slack.
FLASHINFER_HD constexpr unsigned prefill_sm90_smem_bytes(int dqk, int dvo,
                                                         int wg = kSm90Warpgroups) {
  return prefill_sm90_q_bytes(dqk, wg) +
         kSm90Stages * (prefill_sm90_k_bytes(dqk, dvo, wg) + prefill_sm90_v_bytes(dqk, dvo, wg)) +
         32u * static_cast<unsigned>(prefill_sm90_kv_tile(dqk, dvo, wg)) + 16u + kSm90SmemAlign;
}

/// The 16-byte units of a row of `units` that each thread of a block of `threads` copies, so that
/// every thread keeps its unit columns for every row: 1 where `threads` is a multiple of `units`
/// (every built head dim but 192: 8, 16, 32 units), else the smallest divisor u of `units` with
/// `threads` a multiple of units / u (192: 24 units, 3 a thread, 8 threads a row). 0 if none.
FLASHINFER_HD constexpr int prefill_sm90_units_per_thread(int units, int threads) {
  for (int u = 1; u <= units; ++u) {
    if (units % u == 0 && threads % (units / u) == 0) return u;
  }
  return 0;
}

/// Whether the ping-pong schedule (the two warpgroups take turns at the tensor cores:
/// prefill_sm90_kernel.cuh) has an instance: tall blocks at head dims 128, 256 and 192 / 128, K/V
/// of q's dtype or fp8 (where prefill_sm90_kv_built), one block an SM (at 64 two blocks an SM
/// already overlap each other's softmax and products).
FLASHINFER_HD constexpr bool prefill_sm90_ping_pong_built(int dqk, int dvo, int wg) {
  return ((dqk == dvo && (dqk == 128 || dqk == 256)) || (dqk == 192 && dvo == 128)) && wg == 2;
}
/// The warp-specialized form (opt-in, FLASHINFER_PREFILL_SM90_WS=1; prefill_sm90_kernel.cuh,
/// kWs): a third warpgroup, the producer, copies Q and the K/V tiles and hands each stage over
/// through mbarriers (device/mbarrier.cuh), so the two math warpgroups never wait at a block-wide
/// barrier and issue no copies. The producer's registers go down to kSm90WsProducerRegs and the
/// math warpgroups' up to kSm90WsMathRegs (setmaxnreg; the launch bounds give 168 a thread at
/// 384 threads); named barrier kSm90WsProducerBarrier orders the producer's offset writes before
/// its copies (1 and 2 are the ping-pong turns).
constexpr int kSm90WsProducerThreads = 128;
constexpr int kSm90WsProducerRegs = 72, kSm90WsMathRegs = 216;
constexpr int kSm90WsProducerBarrier = 3;
/// The overlapped form's named barriers, kSm90OverlapBarrier + the math warpgroup's index (4, 5):
/// each warpgroup's reduction of whether any of its rows has a new maximum
/// (prefill_sm90_kernel.cuh).
constexpr int kSm90OverlapBarrier = 4;
/// Registers a thread of a warp-specialized block starts with: what the launch bounds (384
/// threads, one block an SM) allow, rounded down to the allocation's 8; the launcher checks that
/// ptxas gave each instance that many (prefill_sm90_ws_registers_ok).
constexpr int kSm90WsEntryRegs = 65536 / (kSm90Threads + kSm90WsProducerThreads) / 8 * 8;
// setmaxnreg moves registers within the block's own allocation: the math warpgroups' increase
// must be covered by the producer's decrease, or it waits forever.
static_assert(kSm90WsProducerRegs * kSm90WsProducerThreads + kSm90WsMathRegs * kSm90Threads <=
                  kSm90WsEntryRegs * (kSm90Threads + kSm90WsProducerThreads),
              "the warp-specialized block's own registers cover its setmaxnreg split");
static_assert(kSm90WsProducerRegs % 8 == 0 && kSm90WsMathRegs % 8 == 0 &&
                  kSm90WsProducerRegs >= 24 && kSm90WsMathRegs <= 256 &&
                  kSm90WsProducerRegs <= kSm90WsEntryRegs && kSm90WsEntryRegs <= kSm90WsMathRegs,
              "setmaxnreg's counts: multiples of 8 in [24, 256], down for the producer, up for the "
              "math warpgroups");

/// Threads of a block of `wg` math warpgroups, with the producer warpgroup where `ws`.
FLASHINFER_HD constexpr int prefill_sm90_block_threads(int wg, bool ws) {
  return prefill_sm90_threads(wg) + (ws ? kSm90WsProducerThreads : 0);
}

/// Whether the warp-specialized form has an instance: tall blocks (two math warpgroups) at head
/// dims 128 and DeepSeek's 192 / 128 with K/V of q's dtype (its producer's 128 threads copy whole
/// 8-key swizzle phases a pass there: 16 units a key, or 24 in three unit columns a thread; at
/// 256 they would copy 4 keys a pass). Plain or soft-capped, with or without the ping-pong turns.
FLASHINFER_HD constexpr bool prefill_sm90_ws_built(int dqk, int dvo, bool fp8_kv, int wg) {
  return wg == 2 && !fp8_kv && dvo == 128 && (dqk == 128 || dqk == 192);
}

/// The overlapped form (opt-in, FLASHINFER_PREFILL_SM90_OVERLAP=1; prefill_sm90_kernel.cuh,
/// kOverlap): the warp-specialized form whose math warpgroups run each tile's softmax while the
/// tensor cores compute the next tile's S and the previous tile's P V (FA3's intra-warpgroup
/// overlap). S of two tiles is live at once, so its tiles are kSm90OverlapKvTile keys (two S
/// tiles, O and P: 32 + 32 + 64 + 16 accumulators a thread at head dim 128, within the 216
/// registers). K and V have their own barriers: in stage t a math warpgroup reads tile t + 1's K
/// and tile t - 1's V, and releases each when that product completed, so K's slots come back two
/// stages before V's. With kSm90OverlapStages slots each and K copied a tile ahead of V, every
/// copy is issued three stages before a warpgroup waits for it (one, had a tile's K and V shared
/// one barrier: its V holds the slot). FA3 keeps K's and V's pipelines apart too.
constexpr int kSm90OverlapKvTile = 64;
constexpr int kSm90OverlapStages = 4;

/// K/V stages of a block: kSm90OverlapStages in the overlapped form, kSm90Stages otherwise.
FLASHINFER_HD constexpr int prefill_sm90_stages(bool overlap) {
  return overlap ? kSm90OverlapStages : kSm90Stages;
}

/// Buffers of one tile's K / V offsets: two by tile parity, three in the overlapped form (its
/// producer copies a tile's K a tile ahead of its V, so three tiles' offsets can be in use).
FLASHINFER_HD constexpr int prefill_sm90_offset_buffers(bool overlap) { return overlap ? 3 : 2; }

/// mbarriers a stage of a warp-specialized block: "full" and "empty", each for K and V apart in
/// the overlapped form (a math warpgroup is done with tile t's K two stages before its V).
FLASHINFER_HD constexpr int prefill_sm90_barriers_per_stage(bool overlap) {
  return overlap ? 4 : 2;
}

/// Whether the overlapped form has an instance: the warp-specialized form's (tall blocks, head
/// dims 128 and 192 / 128, K/V of q's dtype).
FLASHINFER_HD constexpr bool prefill_sm90_overlap_built(int dqk, int dvo, bool fp8_kv, int wg) {
  return prefill_sm90_ws_built(dqk, dvo, fp8_kv, wg);
}

/// Dynamic shared memory of a warp-specialized block (`overlap`: in the overlapped form): Q, the
/// stages of its K/V tiles, the buffers of one tile's key offsets (K's and V's, 8 bytes each),
/// the tile range, the alignment slack, and the pipeline's mbarriers
/// (prefill_sm90_barriers_per_stage a stage, and Q's).
FLASHINFER_HD constexpr unsigned prefill_sm90_ws_smem_bytes(int dqk, int dvo,
                                                            bool overlap = false) {
  const unsigned tile =
      static_cast<unsigned>(overlap ? kSm90OverlapKvTile : prefill_sm90_kv_tile(dqk, dvo, 2));
  const unsigned stages = static_cast<unsigned>(prefill_sm90_stages(overlap));
  const unsigned buffers = static_cast<unsigned>(prefill_sm90_offset_buffers(overlap));
  const unsigned bars = static_cast<unsigned>(prefill_sm90_barriers_per_stage(overlap));
  return prefill_sm90_q_bytes(dqk, 2) + stages * tile * static_cast<unsigned>(dqk + dvo) * 2u +
         16u * buffers * tile + 16u + kSm90SmemAlign + 8u * (bars * stages + 1u);
}

/// Packed rows (query x qo head of a GQA group) of a plan's largest work item from which the
/// Hopper kernel takes it: tall blocks above 64 (the plan's 128-row tiles,
/// prefill_plan_cta_tile_q, which the planner asks for head dim 128 also at 256 when the Hopper
/// kernel serves the call), one-warpgroup blocks from 17 (its 64-row tiles; 16 and fewer are the
/// FA2 kernel's 16-row blocks of tensor-core decode).
constexpr int kSm90MinPackedRows = 65;
constexpr int kSm90MinPackedRowsSmall = 17;

/// The warpgroups of the Hopper block that runs a call, 0 where none does: an sm_90 device (the
/// kernel is sm_90a code), a plan's largest work item of 17 or more packed rows (2 warpgroups
/// above 64), a head dim built for that block, K/V of q's 16-bit dtype or fp8 (e4m3 / e5m2) where
/// an instance takes them (`kv_ok`: the caller's test, prefill_sm90_kv_built included), the plain
/// or soft-capped variant (`variant` 0 or kPrefillSoftCap: no custom mask, no ALiBi) or multi-item
/// scoring's rows alone (kSm90MultiItem, where prefill_sm90_multi_item_built), a scale that folds
/// into the exponent (prefill_scale_folds: > 0, no per-head q / k scales) and the block's shared
/// memory within the device's opt-in limit.
FLASHINFER_HD constexpr int prefill_sm90_warpgroups(int cc_major, int cc_minor,
                                                    long long packed_rows, int dqk, int dvo,
                                                    bool kv_ok, int variant, bool scale_folds,
                                                    long long smem_optin) {
  const int wg = packed_rows >= kSm90MinPackedRows        ? 2
                 : packed_rows >= kSm90MinPackedRowsSmall ? 1
                                                          : 0;
  const bool ok =
      wg > 0 && cc_major == 9 && cc_minor == 0 && prefill_sm90_dim_built(dqk, dvo, wg) && kv_ok &&
      (variant == 0 || variant == kPrefillSoftCap ||
       (variant == kSm90MultiItem && prefill_sm90_multi_item_built(dqk, dvo))) &&
      scale_folds && smem_optin >= static_cast<long long>(prefill_sm90_smem_bytes(dqk, dvo, wg));
  return ok ? wg : 0;
}

/// Whether a call runs on a Hopper block (prefill_sm90_warpgroups > 0).
FLASHINFER_HD constexpr bool prefill_sm90_fits(int cc_major, int cc_minor, long long packed_rows,
                                               int dqk, int dvo, bool kv_ok, int variant,
                                               bool scale_folds, long long smem_optin) {
  return prefill_sm90_warpgroups(cc_major, cc_minor, packed_rows, dqk, dvo, kv_ok, variant,
                                 scale_folds, smem_optin) > 0;
}

}  // namespace flashinfer::kernels::cuda::prefill
