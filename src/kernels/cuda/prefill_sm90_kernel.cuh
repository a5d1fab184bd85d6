// The Hopper prefill attention kernel (docs/ATTENTION.md, "Hopper prefill"): the FA2 kernel's
// work items, grid, page-offset cache, visibility rules and epilogue (prefill_kernel.cuh), with
// the two matrix products on wgmma through CuTe (CUTLASS's headers, sm_90a only):
//   - a block is kWG warpgroups (two over the plan's 128-row tiles, one over its 64-row tiles),
//     64 packed (query, qo head) rows each;
//   - Q (once) and each K/V tile of kv_tile keys are copied global -> shared memory with 16-byte
//     cp.async into the 128-byte-swizzled layouts of CuTe's GMMA atoms, K/V in two stages, so a
//     tile's copy overlaps the math of the tile before it (fp8 K/V: copied as stored, widened
//     each tile into one 16-bit K and V^T tile, two tiles ahead);
//   - S = Q K^T is an SS wgmma (Q and K read through matrix descriptors), O += P V an RS wgmma
//     (P from registers, V as the MN-major B operand: its tile is stored token by token, as the
//     cache holds it), both m64nNk16 with fp32 accumulation; the accumulator of S is, value for
//     value, the A operand of P V (the m64nNk16 accumulator's layout per 16 columns is the
//     m64k16 A fragment's), so P is S rounded to 16 bits in place;
//   - the online softmax in base 2 on the S accumulators (the scale folded into the exponent;
//     soft-capped blocks, kSoftCap, take the logits first, as the FA2 kernel's do), rescaling
//     skipped when no row of a warp has a new maximum; causal tiles above the diagonal
//     never loaded and only edge tiles tested per element;
//   - multi-item scoring (kMultiItem: SGLang's scoring API, which upstream runs on its FA3 kernel
//     on Hopper): each row's two runs of keys (AttentionParams::multi_item_rows) tested key by
//     key in every tile, and the tiles no row of the block sees never loaded: the loop's steps
//     map past them (tile_key0; prefill_multi_item_tiles, the FA2 kernel's rule).
// Writes by cp.async are generic-proxy writes and wgmma reads shared memory through the async
// proxy: every copying thread fences the proxies (fence.proxy.async.shared::cta) after its copies
// land (fp8: after it widened its units) and before the barrier the MMAs follow. 16-bit K/V: one
// barrier a tile; past tile i's, every warpgroup has waited for its MMAs of tile i - 1, whose
// stage then takes tile i + 1's copy, issued beside tile i's S product (the page offsets in two
// buffers by tile parity, so that one tile's are written while the other's copy reads them).
// fp8 K/V: an fp8 stage is refilled once every thread widened it (the tile's second barrier), and
// the 16-bit tiles are rewritten only after the next tile's first barrier, which each warpgroup
// reaches after waiting for its MMAs. The block's barriers are the FA2 kernel's.
// The warp-specialized form (kWs; opt-in, FLASHINFER_PREFILL_SM90_WS=1; tall blocks at head dims
// 128 and 192 / 128 with 16-bit K/V: prefill_sm90_ws_built) adds a producer warpgroup after the
// math ones: it copies Q and each K/V tile (the same copies, by its 128 threads) and hands the
// stages over through mbarriers (device/mbarrier.cuh): a stage's "full" barrier completes when
// the producer's copies into it have landed (cp.async.mbarrier.arrive.noinc), its "empty" barrier
// when both math warpgroups are done with it; each math thread fences the proxies after its wait
// on "full". There is no block-wide barrier in the loop, and the math warpgroups issue no copies;
// setmaxnreg gives the producer 72 registers and the math threads 216 (the launch bounds allow
// 168 at 384 threads). Same arithmetic in the same order: the plain form's bits.
// The overlapped form (kOverlap, on the warp-specialized one; opt-in,
// FLASHINFER_PREFILL_SM90_OVERLAP=1; prefill_sm90_overlap_built) is FA3's intra-warpgroup overlap:
// each math warpgroup issues tile t + 1's S and tile t - 1's P V as one wgmma group and runs tile
// t's softmax while they run, so its exponentials no longer leave the tensor cores idle. Two S
// arrays (tiles of 64 keys, so that S twice, O and P fit the 216 registers); four stages of K and
// four of V, each with its own barriers, the producer copying a tile's K a tile ahead of its V
// (a warpgroup is done with a tile's K two stages before its V). What ptxas needs for it, and the
// SASS check that it got it: docs/ATTENTION.md, "The overlapped form".
#pragma once

#include "kernels/cuda/attention_cuda_common.cuh"
#include "kernels/cuda/device/cp_async.cuh"
#include "kernels/cuda/device/fastdiv.cuh"
#include "kernels/cuda/device/fp8_widen.cuh"
#include "kernels/cuda/device/mbarrier.cuh"
#include "kernels/cuda/device/mma.cuh"
#include "kernels/cuda/device/paged_kv.cuh"
#include "kernels/cuda/device/softmax_state.cuh"
#include "kernels/cuda/prefill_epilogue.cuh"
#include "kernels/cuda/prefill_shape.h"
#include "kernels/cuda/prefill_sm90_shape.h"
#include "kernels/cuda/prefill_sm90_traits.h"

namespace flashinfer::kernels::cuda::prefill {

template <class T, class TKV, int DQK, int DVO, bool kSoftCap, int kWG, bool kPingPong = false,
          bool kWs = false, bool kOverlap = false, bool kMultiItem = false>
__global__ void __launch_bounds__(prefill_sm90_block_threads(kWG, kWs),
                                  prefill_sm90_min_blocks(DQK, kWG))
    batch_prefill_sm90_kernel(AttentionParams p) {
  using namespace cute;
  // K/V stages and keys a tile: the overlapped form's (kOverlap, prefill_sm90_overlap_built), or
  // two stages of prefill_sm90_kv_tile keys.
  static_assert(!kOverlap || kWs, "the overlapped form is warp-specialized");
  constexpr int kStages = prefill_sm90_stages(kOverlap);
  using Tr =
      Sm90Prefill<T, DQK, DVO, kWG,
                  kOverlap ? kSm90OverlapKvTile : prefill_sm90_kv_tile(DQK, DVO, kWG), kStages>;
  constexpr int kThreads = prefill_sm90_threads(kWG);  // kWG warpgroups doing the math
  constexpr int kCtaQ = prefill_sm90_cta_q(kWG);       // 64 packed rows each
  using E = typename Tr::E;
  constexpr int kN = Tr::kN;
  // The threads that copy Q and K/V: every thread, or (kWs, warp-specialized) the producer
  // warpgroup after the kThreads math threads (prefill_sm90_ws_built).
  static_assert(!kWs || prefill_sm90_ws_built(DQK, DVO, sizeof(TKV) == 1, kWG),
                "warp-specialized instance");
  constexpr int kLoadThreads = kWs ? kSm90WsProducerThreads : kThreads;
  // A Q row's 16-byte units: each thread keeps kQu unit columns (col, col + kQCols, ...) of every
  // row it copies (one at head dims 64 / 128 / 256; three of a 192-wide row, 8 threads a row).
  constexpr int kUnits = DQK / 8;
  constexpr int kQu = prefill_sm90_units_per_thread(kUnits, kLoadThreads);
  static_assert(kQu > 0, "a thread keeps whole unit columns");
  constexpr int kQCols = kUnits / kQu;  // threads a Q row
  constexpr int kRowsPerPass = kLoadThreads / kQCols;
  static_assert(kCtaQ % kRowsPerPass == 0, "tile shapes");
  constexpr int kCache = kN;  // the offsets of one tile's keys
  static_assert(kCache <= kLoadThreads, "one key a thread fills the offsets");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  // The tiles at the swizzle's 1024-byte period (prefill_sm90_smem_bytes has the slack).
  const uint32_t raw_addr = dev::cp_async::smem_addr(smem_raw);
  unsigned char* smem =
      smem_raw + ((kSm90SmemAlign - (raw_addr % kSm90SmemAlign)) % kSm90SmemAlign);
  // fp8 K/V (TKV = uint8_t, e4m3 or e5m2 as p.kv.dtype says): the stages hold the tiles as
  // stored (half the bytes), widened each tile into one 16-bit K and V^T tile, stage 0 of the
  // layouts, which the MMAs read; the same bytes in all as the 16-bit blocks' two stages.
  constexpr bool kFp8 = sizeof(TKV) == 1;
  static_assert(kFp8 || std::is_same_v<TKV, T>, "K/V of q's dtype or fp8");
  static_assert(prefill_sm90_kv_built(DQK, DVO, kFp8, kMultiItem),
                "fp8 K/V at equal head dims only");
  static_assert(
      !kMultiItem || (!kWs && prefill_sm90_multi_item_built(DQK, DVO)),
      "multi-item scoring: the plain schedule's instances (prefill_sm90_multi_item_built)");
  constexpr int D = DQK;  // fp8 (equal dims): the head dim of every widened row
  static_assert(!kPingPong || kWG == 2, "ping-pong: two warpgroups");
  constexpr int kStages16 = kFp8 ? 1 : kStages;
  // One stage's 16-bit K and V tiles (equal at equal dims; fp8: half of it a stored tile).
  constexpr unsigned kKBytes16 = static_cast<unsigned>(kN * DQK * 2);
  constexpr unsigned kVBytes16 = static_cast<unsigned>(kN * DVO * 2);
  static_assert(kOverlap || (kKBytes16 == prefill_sm90_k_bytes(DQK, DVO, kWG) &&
                             kVBytes16 == prefill_sm90_v_bytes(DQK, DVO, kWG)),
                "the tiles prefill_sm90_smem_bytes counts");
  constexpr unsigned kKvBytes16 = kKBytes16, kKvBytes8 = kKvBytes16 / 2;
  constexpr unsigned kQBytes = prefill_sm90_q_bytes(DQK, kWG);
  E* q_s = reinterpret_cast<E*>(smem);
  E* k_s = reinterpret_cast<E*>(smem + kQBytes);
  E* v_s = reinterpret_cast<E*>(smem + kQBytes + kStages16 * kKBytes16);
  unsigned char* k8_s = smem + kQBytes + kStages16 * (kKBytes16 + kVBytes16);
  unsigned char* v8_s = k8_s + (kFp8 ? kStages * kKvBytes8 : 0);
  static_assert(kStages16 * (kKBytes16 + kVBytes16) + (kFp8 ? 2 * kStages * kKvBytes8 : 0) ==
                    kStages * (kKBytes16 + kVBytes16),
                "fp8 blocks use the 16-bit blocks' shared memory");
  int64_t* k_off = reinterpret_cast<int64_t*>(smem + kQBytes + kStages * (kKBytes16 + kVBytes16));
  // Buffers of offsets, by tile (prefill_sm90_offset_buffers): two by parity (the 16-bit loop fills
  // a tile's while the copy of the tile before reads the other; fp8 uses buffer 0), three in the
  // overlapped form, whose producer copies K a tile ahead of V.
  constexpr int kOffBufs = prefill_sm90_offset_buffers(kOverlap);
  int64_t* v_off = k_off + kOffBufs * kCache;
  int2* tile_range_s = reinterpret_cast<int2*>(v_off + kOffBufs * kCache);
  // kWs: the pipeline's barriers after the tile range (prefill_sm90_ws_smem_bytes): a "full" and
  // an "empty" one a stage, and Q's; the overlapped form has them for K (full_bar / empty_bar) and
  // for V (full_v_bar / empty_v_bar) apart, then Q's.
  const uint32_t bar0 = dev::cp_async::smem_addr(tile_range_s + 2);
  auto full_bar = [&](int stage) { return bar0 + 8u * static_cast<uint32_t>(stage); };
  auto empty_bar = [&](int stage) { return bar0 + 8u * static_cast<uint32_t>(kStages + stage); };
  [[maybe_unused]] auto full_v_bar = [&](int stage) {
    return bar0 + 8u * static_cast<uint32_t>(2 * kStages + stage);
  };
  [[maybe_unused]] auto empty_v_bar = [&](int stage) {
    return bar0 + 8u * static_cast<uint32_t>(3 * kStages + stage);
  };
  const uint32_t q_bar =
      bar0 + 8u * static_cast<uint32_t>(prefill_sm90_barriers_per_stage(kOverlap) * kStages);

  const typename Tr::LayoutQ layout_q{};
  const typename Tr::LayoutK layout_k{};
  const typename Tr::LayoutVt layout_vt{};
  Tensor sQ = make_tensor(make_smem_ptr(q_s), layout_q);
  Tensor sK = make_tensor(make_smem_ptr(k_s), layout_k);
  Tensor sVt = make_tensor(make_smem_ptr(v_s), layout_vt);

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
  // This thread's index among the copying threads (kWs: the producer's, from kThreads on; only
  // those copy: the math threads' 0 keeps the addresses they never use inside the tiles).
  const int ltid = kWs ? max(tid - kThreads, 0) : tid;
  const int gid = lane >> 2, tid4 = lane & 3;
  const dev::FastDivmod group_div(static_cast<uint32_t>(group));

  // Keys this block can see at all: causal caps the end, a sliding window the start.
  const int32_t last_row = min(rows, row0 + kCtaQ) - 1;
  const int64_t pos_min = kv_len - qo_len + w.qo_begin + group_div.div(row0);
  const int64_t pos_max = kv_len - qo_len + w.qo_begin + group_div.div(last_row);
  // (Multi-item scoring, kMultiItem: the window tested key by key with kv_lo kept, as the other
  // kernels and the CPU reference run these rows.)
  int64_t kv_lo = w.kv_begin, kv_hi = w.kv_end;
  if (p.causal) kv_hi = min(kv_hi, pos_max + 1);
  if (p.window_left >= 0 && !kMultiItem) kv_lo = max(kv_lo, pos_min - p.window_left);
  int num_tiles = kv_hi > kv_lo ? static_cast<int>((kv_hi - kv_lo + kN - 1) / kN) : 0;
  // Multi-item scoring: loop step i takes key tile i + (i >= gap.x ? gap.y : 0) from kv_lo,
  // skipping the tiles no row of the block sees (prefill_multi_item_tiles, the FA2 kernel's rule:
  // past its last query, and between the prefix and its first query less max_item_len); every
  // tile it takes is tested key by key. No gap otherwise.
  int2 gap = make_int2(INT32_MAX, 0);
  if constexpr (kMultiItem) {
    const MultiItemTiles mt =
        prefill_multi_item_tiles(kv_lo, kv_hi, kN, pos_min, pos_max, p.multi_item_bounds[2 * b],
                                 p.multi_item_bounds[2 * b + 1]);
    kv_hi = mt.kv_hi;
    num_tiles = mt.num_tiles;
    gap = make_int2(mt.split, mt.skip);
  }
  const TileRange unmasked_tiles = prefill_unmasked_tiles(kv_lo, kv_hi, kN, p.causal, pos_min,
                                                          pos_max, p.window_left, kMultiItem);

  // This thread's first unit column of every copied Q row, and its first row.
  const int col = ltid % kQCols, r0 = ltid / kQCols;

  // Q tile: packed row r is query qo_begin + (row0 + r) / group, head g * group + its remainder.
  auto copy_q = [&] {
    const T* q = static_cast<const T*>(p.q);
#pragma unroll
    for (int r = r0; r < kCtaQ; r += kRowsPerPass) {
      const int32_t pr = row0 + r;
      const bool ok = pr < rows;
      uint32_t qi = 0, hh = 0;
      group_div.divmod(static_cast<uint32_t>(ok ? pr : 0), qi, hh);
      const T* src =
          q + (q_base + w.qo_begin + qi) * p.q_stride_n + (g * group + hh) * p.q_stride_h;
#pragma unroll
      for (int u = 0; u < kQu; ++u) {
        const int c = (col + u * kQCols) * 8;
        dev::cp_async::copy16_zfill(dev::cp_async::smem_addr(&sQ(r, c)), ok ? src + c : q, ok);
      }
    }
  };
  if constexpr (!kWs) copy_q();

  // The token -> (page, slot) split as the launcher built it (kv_page_div_*).
  const auto page_split = [&] {
    return dev::FastDivmod::from_parts(
        prefill_page_divisor(p.kv.kv_indices != nullptr, p.kv.page_size), p.kv_page_div_mul,
        p.kv_page_div_shift);
  };
  const int32_t kv_lo32 = static_cast<int32_t>(kv_lo), kv_hi32 = static_cast<int32_t>(kv_hi);
  // The first key of loop step `tile`: kv_lo + tile * kN, past the skipped tiles (kMultiItem).
  auto tile_key0 = [&](int tile) -> int32_t {
    const int grid_tile = kMultiItem && tile >= gap.x ? tile + gap.y : tile;
    return kv_lo32 + grid_tile * kN;
  };
  constexpr int64_t kKvBytes = static_cast<int64_t>(sizeof(TKV));
  // The offset cache, the FA2 kernel's way: page_of loads this thread's key's page id (an
  // iteration ahead), fill_from writes the key's K and V byte offsets (the KV head's included).
  auto page_of = [&](int tile) -> int32_t {
    if (tile >= num_tiles || ltid >= kCache) return 0;
    const int32_t t = tile_key0(tile) + ltid;
    if (t >= kv_hi32) return 0;
    const dev::KvRequestMap kv_map(p.kv, b, page_split());
    return kv_map.page_id(static_cast<uint32_t>(t));
  };
  auto fill_from = [&](int tile, int32_t page, int buf) {
    if (tile >= num_tiles || ltid >= kCache) return;
    const dev::KvRequestMap kv_map(p.kv, b, page_split());
    const int32_t t = tile_key0(tile) + ltid;
    int64_t ko = 0, vo = 0;
    if (t < kv_hi32) {
      const uint32_t slot = kv_map.slot(static_cast<uint32_t>(t));
      ko = (kv_map.k_offset(page, slot) + g * p.kv.k_stride_head) * kKvBytes;
      vo = (kv_map.v_offset(page, slot) + g * p.kv.v_stride_head) * kKvBytes;
    }
    k_off[buf * kCache + ltid] = ko;
    v_off[buf * kCache + ltid] = vo;
  };
  // K/V tile `tile` into stage tile % kStages: key r's unit `c` to (r, 8 c) of K and
  // (8 c, r) of V^T (fp8: rows as stored, D / 16 units a key, into the fp8 stages); keys at or
  // past kv_hi zero-filled (a stale S column would be masked, but a stale V row times P = 0 could
  // still be NaN). A group is committed even past the end, which keeps the wait counts uniform.
  // A thread keeps its unit columns of K (kKu of them: one, or three of a 192-wide row) and of V
  // (one) for every key it copies. Its first K and V^T units in stage 0 are computed once; its
  // others are constant steps away (Sm90Prefill::k_step_bytes / v_step_bytes along the keys,
  // k_col_step_bytes along a K row, and a stage is prefill_sm90_k_bytes / v_bytes further), so a
  // copy's shared address is one add, not the layout's swizzle arithmetic again.
  constexpr int kUnitsK = DQK * static_cast<int>(sizeof(TKV)) / 16;  // 16-byte units a stored key
  constexpr int kUnitsV = DVO * static_cast<int>(sizeof(TKV)) / 16;
  constexpr int kKu = prefill_sm90_units_per_thread(kUnitsK, kLoadThreads);
  static_assert(kKu > 0 && prefill_sm90_units_per_thread(kUnitsV, kLoadThreads) == 1,
                "K: whole unit columns a thread; V: one");
  static_assert(!kFp8 || kKu == 1, "fp8 rows: one unit column a thread");
  constexpr int kKCols = kUnitsK / kKu;  // threads a K row
  constexpr int kKRowsPerPass = kLoadThreads / kKCols, kVRowsPerPass = kLoadThreads / kUnitsV;
  static_assert(kN % kKRowsPerPass == 0 && kN % kVRowsPerPass == 0, "copy shape");
  const int k_col = ltid % kKCols, k_r0 = ltid / kKCols;
  const int v_col = ltid % kUnitsV, v_r0 = ltid / kUnitsV;
  const uint32_t k_dst0 = kFp8 ? dev::cp_async::smem_addr(k8_s + k_r0 * D + k_col * 16)
                               : dev::cp_async::smem_addr(&sK(k_r0, k_col * 8, 0));
  const uint32_t v_dst0 = kFp8 ? dev::cp_async::smem_addr(v8_s + v_r0 * D + v_col * 16)
                               : dev::cp_async::smem_addr(&sVt(v_col * 8, v_r0, 0));
  constexpr uint32_t kKStep =
      kFp8 ? kKRowsPerPass * D : static_cast<uint32_t>(Tr::template k_step_bytes<kKRowsPerPass>());
  constexpr uint32_t kVStep =
      kFp8 ? kVRowsPerPass * D : static_cast<uint32_t>(Tr::template v_step_bytes<kVRowsPerPass>());
  constexpr uint32_t kKColStep = [] {
    if constexpr (kKu > 1) {
      return static_cast<uint32_t>(Tr::template k_col_step_bytes<kKCols * 8>());
    } else {
      return 0u;
    }
  }();
  constexpr uint32_t kKStageBytes = kFp8 ? kKvBytes8 : kKBytes16;
  constexpr uint32_t kVStageBytes = kFp8 ? kKvBytes8 : kVBytes16;
  // One of K or V of tile `tile` (offsets `off`) into its stage tile % kStages: kRowsPass
  // keys a pass, kU units a key from unit `c0` (kCols apart in the row, col_step bytes apart in
  // shared memory). K's copies all issued before V's (not interleaved): half the offsets live at
  // a time, which left the head dim 256 instances 10-27 registers more room (232-236 -> 209-222).
  auto copy_rows = [&]<int kRowsPass, int kU, int kCols>(
                       int tile, const int64_t* off, const void* cache, uint32_t dst0, int r0,
                       int c0, uint32_t step, uint32_t col_step, uint32_t stage_bytes) {
    const int32_t t0 = tile_key0(tile);
    const auto* base = static_cast<const unsigned char*>(cache);
    const uint32_t dst = dst0 + static_cast<uint32_t>(tile % kStages) * stage_bytes;
    constexpr int kRowsPerThread = kN / kRowsPass;
    int64_t os[kRowsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) os[i] = off[r0 + i * kRowsPass];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const bool ok = t0 + r0 + i * kRowsPass < kv_hi32;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const uint32_t col_bytes = static_cast<uint32_t>(c0 + u * kCols) * 16u;
        dev::cp_async::copy16_zfill(dst + i * step + u * col_step, base + (os[i] + col_bytes), ok);
      }
    }
  };
  auto copy_k = [&](int tile, int buf) {
    copy_rows.template operator()<kKRowsPerPass, kKu, kKCols>(
        tile, k_off + buf * kCache, p.kv.k, k_dst0, k_r0, k_col, kKStep, kKColStep, kKStageBytes);
  };
  auto copy_v = [&](int tile, int buf) {
    copy_rows.template operator()<kVRowsPerPass, 1, kUnitsV>(
        tile, v_off + buf * kCache, p.kv.v, v_dst0, v_r0, v_col, kVStep, 0u, kVStageBytes);
  };
  auto load_kv = [&](int tile, int buf) {
    if (tile < num_tiles) {
      copy_k(tile, buf);
      copy_v(tile, buf);
    }
    dev::cp_async::commit();
  };
  // fp8: stage `stage`'s K and V units widened into the 16-bit K and V^T tiles (stage 0 of the
  // layouts): unit c of key r (16 values) to (r, 16 c) and (r, 16 c + 8) of K, and to (16 c, r)
  // and (16 c + 8, r) of V^T, exactly (device/fp8_widen.cuh).
  auto widen = [&]<__nv_fp8_interpretation_t kKind>(int stage) {
    if constexpr (kFp8) {
      const auto* k8 = reinterpret_cast<const uint4*>(k8_s + stage * kKvBytes8);
      const auto* v8 = reinterpret_cast<const uint4*>(v8_s + stage * kKvBytes8);
      constexpr int kUnits8 = D / 16;
      auto halves = [](uint4 x, uint4& lo, uint4& hi) {
        const uint2 e0 = dev::fp8x4_widen<T, kKind>(x.x), e1 = dev::fp8x4_widen<T, kKind>(x.y);
        const uint2 e2 = dev::fp8x4_widen<T, kKind>(x.z), e3 = dev::fp8x4_widen<T, kKind>(x.w);
        lo = make_uint4(e0.x, e0.y, e1.x, e1.y);
        hi = make_uint4(e2.x, e2.y, e3.x, e3.y);
      };
#pragma unroll 4
      for (int i = tid; i < kN * kUnits8; i += kThreads) {
        const int r = i / kUnits8, c = i % kUnits8;
        // The two halves of a unit go to neighbouring 16-byte chunks of one swizzled row; threads
        // with bit 2 of c set store theirs in the other order, so each store instruction's
        // 8-thread phases cover all 8 bank groups once (in unit order they met 2 ways at head
        // dims 128 and 256: the FA2 kernel's fp8_unit_widen_store does the same).
        // The stores offset k_s / v_s by the element offsets the hardware swizzle gives
        // (Tr::k_offset / vt_offset): the address of a CuTe tensor element is a generic pointer
        // (stores through it were ST.E.128, not STS.128), and layout_k(...) / layout_vt(...)
        // evaluated without the pointer swizzle element offsets, not bytes (that misplaced 3 of
        // every 4 units: every fp8 case wrong on the H200 in session 64).
        const bool swap = ((c >> 2) & 1) != 0;
        auto st_k = [&](int col, uint4 x) {
          *reinterpret_cast<uint4*>(k_s + Tr::k_offset(r, col)) = x;
        };
        auto st_vt = [&](int row, uint4 x) {
          *reinterpret_cast<uint4*>(v_s + Tr::vt_offset(row, r)) = x;
        };
        uint4 lo, hi;
        halves(k8[i], lo, hi);
        st_k(16 * c + (swap ? 8 : 0), swap ? hi : lo);
        st_k(16 * c + (swap ? 0 : 8), swap ? lo : hi);
        halves(v8[i], lo, hi);
        st_vt(16 * c + (swap ? 8 : 0), swap ? hi : lo);
        st_vt(16 * c + (swap ? 0 : 8), swap ? lo : hi);
      }
    } else {
      (void)stage;
    }
  };
  if (tid == 0) {
    *tile_range_s = make_int2(unmasked_tiles.lo, unmasked_tiles.hi);
    if constexpr (kWs) {
      for (int s = 0; s < kStages; ++s) {
        dev::mbarrier::init(full_bar(s), kLoadThreads);  // each producer thread's landed copies
        dev::mbarrier::init(empty_bar(s), kThreads);     // each math thread done with the stage
        if constexpr (kOverlap) {
          dev::mbarrier::init(full_v_bar(s), kLoadThreads);
          dev::mbarrier::init(empty_v_bar(s), kThreads);
        }
      }
      dev::mbarrier::init(q_bar, kLoadThreads);
    }
  }
  if constexpr (kWs) {
    // Warp-specialized (prefill_sm90_ws_built): the producer warpgroup copies Q, then every K/V
    // tile into stage tile % kStages once the math warpgroups released the stage's tile before (its
    // "empty" barrier), and its copies arrive on the stage's "full" barrier as they land; the
    // math warpgroups wait on "full", run the tile, and arrive on "empty" (the overlapped form:
    // the same for K and V apart, K a tile ahead). No block-wide barrier
    // after this one, so the two math warpgroups drift apart by what their softmax costs (the
    // ping-pong schedule's turns then overlap one's softmax with the other's products).
    __syncthreads();  // the barriers initialized and the tile range written, for every thread
    if (tid >= kThreads) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kSm90WsProducerRegs));
      if (num_tiles > 0) {  // (a block with no tile writes its empty rows without Q)
        copy_q();
        dev::mbarrier::arrive_on_copies(q_bar);
      }
      int32_t page = page_of(0);
      if constexpr (kOverlap) {
        // K a tile ahead of V: a math warpgroup frees tile t's K slot once t's S completed, two
        // stages before its V slot (P V of t runs in stage t + 1), and needs K a stage before V;
        // in tile order the producer's copies would wait behind the V slot. Offsets in three
        // buffers by tile: buffer j % 3's last readers copied tile j - 3's K and V before the
        // producer's barrier of tile j - 1, which this thread passed before writing tile j's.
        auto next_k = [&](int j) {
          fill_from(j, page, j % kOffBufs);
          page = page_of(j + 1);
          asm volatile("bar.sync %0, %1;\n" ::"n"(kSm90WsProducerBarrier), "n"(kLoadThreads)
                       : "memory");
          const int stage = dev::pipeline_stage(j, kStages);
          dev::mbarrier::wait(empty_bar(stage), dev::pipeline_empty_parity(j, kStages));
          copy_k(j, j % kOffBufs);
          dev::cp_async::commit();
          dev::mbarrier::arrive_on_copies(full_bar(stage));
        };
        if (num_tiles > 0) next_k(0);
#pragma unroll 1
        for (int tile = 0; tile < num_tiles; ++tile) {
          if (tile + 1 < num_tiles) next_k(tile + 1);
          const int stage = dev::pipeline_stage(tile, kStages);
          dev::mbarrier::wait(empty_v_bar(stage), dev::pipeline_empty_parity(tile, kStages));
          copy_v(tile, tile % kOffBufs);
          dev::cp_async::commit();
          dev::mbarrier::arrive_on_copies(full_v_bar(stage));
        }
      } else {
#pragma unroll 1
        for (int tile = 0; tile < num_tiles; ++tile) {
          const int stage = dev::pipeline_stage(tile, kStages);
          dev::mbarrier::wait(empty_bar(stage), dev::pipeline_empty_parity(tile, kStages));
          // Offsets buffer tile % 2: its last reader copied tile - 2, before the producer's
          // barrier of tile - 1, which this thread passed.
          fill_from(tile, page, tile % 2);
          page = page_of(tile + 1);
          // Every key's offsets written before any producer thread's copies read them.
          asm volatile("bar.sync %0, %1;\n" ::"n"(kSm90WsProducerBarrier), "n"(kLoadThreads)
                       : "memory");
          load_kv(tile, tile % 2);
          dev::mbarrier::arrive_on_copies(full_bar(stage));
        }
      }
      dev::cp_async::wait<0>();  // nothing in flight when the producer's warps exit
      return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kSm90WsMathRegs));
  } else if constexpr (kFp8) {
    // fp8: tiles 0 and 1 in flight before the loop (which widens a tile, then refills its stage).
    fill_from(0, page_of(0), 0);
    __syncthreads();
    load_kv(0, 0);  // the first group also carries Q
    __syncthreads();
    fill_from(1, page_of(1), 0);
    __syncthreads();
    load_kv(1, 0);
  } else {
    // 16-bit: tile 0 in flight; each iteration issues the next tile's copy beside its S product.
    fill_from(0, page_of(0), 0);
    fill_from(1, page_of(1), 1);
    __syncthreads();
    load_kv(0, 0);  // the first group also carries Q
  }

  typename Tr::MmaS mma_s;
  typename Tr::MmaO mma_o;
  auto thr_s = mma_s.get_thread_slice(tid);
  auto thr_o = mma_o.get_thread_slice(tid);
  Tensor tSrQ = thr_s.partition_fragment_A(sQ);    // (MMA, 1, DQK / 16) descriptors
  Tensor tSrK = thr_s.partition_fragment_B(sK);    // (MMA, 1, DQK / 16, stages)
  Tensor tOrVt = thr_o.partition_fragment_B(sVt);  // (MMA, 1, kN / 16, stages)
  Tensor tSrS = partition_fragment_C(mma_s, Shape<Int<kCtaQ>, Int<kN>>{});   // ((2,2,kN/8),1,1)
  Tensor tOrO = partition_fragment_C(mma_o, Shape<Int<kCtaQ>, Int<DVO>>{});  // ((2,2,DVO/8),1,1)
  Tensor tOrP = make_tensor<E>(typename Tr::LayoutP{});
  static_assert(decltype(size(tSrS))::value == kN / 2 && decltype(size(tOrO))::value == DVO / 2,
                "a thread's accumulators: 2 rows x (columns / 4)");
  static_assert(decltype(size(tOrP))::value == decltype(size(tSrS))::value, "P is S");
  // Accumulator value v of a thread: row gid + 8 ((v >> 1) & 1) of its warp's 16, column
  // 8 (v >> 2) + 2 tid4 + (v & 1) (the m64nNk16 D fragment; tests/api/test_prefill_sm90_shape.cpp
  // checks it against CuTe's partition of the block's coordinates).
  const int32_t warp_row0 = row0 + warp * 16;  // warpgroup w's warps: rows 64 w .. 64 w + 63
#pragma unroll
  for (int i = 0; i < size(tOrO); ++i) tOrO(i) = 0.0f;

  const int32_t pos_shift = static_cast<int32_t>(kv_len - qo_len) + w.qo_begin;
  int32_t pos_of[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int32_t pr = warp_row0 + gid + 8 * e;
    pos_of[e] = pr < rows ? pos_shift + static_cast<int32_t>(group_div.div(pr)) : -1;
  }
  // Multi-item scoring: each row's keys [0, a) and [lo, its position]
  // (AttentionParams::multi_item_rows); a padding row (position -1) sees none.
  [[maybe_unused]] int32_t item_a[2] = {0, 0}, item_lo[2] = {0, 0};
  if constexpr (kMultiItem) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int32_t pr = warp_row0 + gid + 8 * e;
      if (pr < rows) {
        const int64_t r = q_base + w.qo_begin + group_div.div(pr);
        item_a[e] = p.multi_item_rows[2 * r];
        item_lo[e] = p.multi_item_rows[2 * r + 1];
      }
    }
  }
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  // Ping-pong (kPingPong): the two warpgroups take turns at the tensor cores, so that one's softmax
  // runs while the other's product does (without it both issue S together, wait together and
  // leave the tensor cores idle through their softmax together: half the cycles on an H100).
  // Named barriers 1 and 2 (bar.sync by the warpgroup whose turn it waits for, bar.arrive by the
  // other; 256 threads each phase) order the issues: per tile warpgroup 0's S, 1's S, 0's P V,
  // 1's P V. Warpgroup 1 passes the first turn before the loop and warpgroup 0 takes its last
  // pass after it, so both barriers see as many arrivals as waits. Each warpgroup passes a turn
  // only after taking its own, which the other passed: at most one phase of either barrier is
  // ever open. The arithmetic is the plain schedule's: the same bits.
  const uint32_t wg_index = static_cast<uint32_t>(tid) / 128u;
  [[maybe_unused]] const uint32_t my_turn = 1u + wg_index, their_turn = 2u - wg_index;
  auto take_turn = [&] {
    if constexpr (kPingPong) asm volatile("bar.sync %0, 256;\n" ::"r"(my_turn) : "memory");
  };
  auto pass_turn = [&] {
    if constexpr (kPingPong) asm volatile("bar.arrive %0, 256;\n" ::"r"(their_turn) : "memory");
  };
  if constexpr (kPingPong) {
    // (barrier.arrive / barrier.sync: the non-.aligned forms, for a barrier instruction only one
    // warpgroup executes; bar.* inside the loop are executed by every thread.)
    if (wg_index == 1) asm volatile("barrier.arrive 1, 256;\n" ::: "memory");
  }

  // Tile `tile`'s scores in `tS` made logits: soft-capped (in log2 units, as the FA2 kernel's
  // soft-capped blocks compute them, logit_log2; the plain blocks keep q.k and fold the scale into
  // the exponent), keys outside a row's view -inf (edge tiles only); `tmax` their row maxima in
  // log2 units, over the 4 threads of each row.
  auto scores = [&](auto& tS, int tile, float(&tmax)[2]) {
    const int32_t t0 = tile_key0(tile);
    const int2 range = *tile_range_s;
    const bool unmasked = range.x <= tile && tile <= range.y;
    if constexpr (kSoftCap) {
#pragma unroll
      for (int v = 0; v < size(tS); ++v) tS(v) = logit_log2(p, tS(v), p.sm_scale);
    }
    if (!unmasked) {
      // Keys as offsets d from the row's position, within [d_min, d_max] (the FA2 kernel's test).
      const int32_t d_max = p.causal ? 0 : INT32_MAX;
      const int32_t d_min = p.window_left >= 0 ? -p.window_left : INT32_MIN;
#pragma unroll
      for (int v = 0; v < size(tS); ++v) {
        const int32_t kj = t0 + 8 * (v >> 2) + 2 * tid4 + (v & 1);
        const int32_t d = kj - pos_of[(v >> 1) & 1];
        bool vis = (kj < kv_hi32) & (d <= d_max) & (d >= d_min);
        if constexpr (kMultiItem) {
          const int r = (v >> 1) & 1;
          vis = vis & prefill_item_sees(kj, pos_of[r], item_a[r], item_lo[r]);
        }
        if (!vis) tS(v) = -INFINITY;
      }
    }
    tmax[0] = tmax[1] = -INFINITY;
#pragma unroll
    for (int v = 0; v < size(tS); ++v) tmax[(v >> 1) & 1] = fmaxf(tmax[(v >> 1) & 1], tS(v));
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
      tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
      // -inf stays -inf (the scale is > 0: prefill_scale_folds)
      if constexpr (!kSoftCap) tmax[r] *= p.sm_scale_log2;
    }
  };

  // The overlapped form (kOverlap): per "stage" (one wgmma group, from its issue to its
  // wait_group 0) the tensor cores compute tile t + 1's S into one S array and O += P V of tile
  // t - 1, while the math threads run tile t's softmax on the other S array, whose product the
  // stage before completed. Past the wait: O rescaled for tile t's maximum, P packed from tile t's
  // probabilities (P's registers are free once the P V product that read them completed), tile
  // t + 1's K and tile t - 1's V released. Nothing the softmax writes is a register of the stage's
  // products (S of tile t closed a stage earlier; O and P are written after the wait), so ptxas can
  // leave its exponentials under the products. O sees the plain loop's operations in its order
  // (rescale for t, then P_t V_t), so the form gives the plain loop's bits at its tile width. The
  // two S arrays alternate by tile parity (tile t's S is tSrS for even t, tSrS2 for odd t), so the
  // stages are written out for each parity: a first stage, pairs, and the last stage; the first and
  // last have no P V or no S product, so that no wgmma sits behind a branch inside a stage.
  //
  // wait_k / wait_v: tile `tile`'s K (and Q before the first), or its V, landed: the producer's
  // copies arrived on the barrier; the proxy fence makes what the barrier acquired visible to
  // wgmma.
  [[maybe_unused]] auto wait_k = [&](int tile) {
    if (tile == 0) dev::mbarrier::wait(q_bar, 0);
    dev::mbarrier::wait(full_bar(dev::pipeline_stage(tile, kStages)),
                        dev::pipeline_full_parity(tile, kStages));
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  };
  [[maybe_unused]] auto wait_v = [&](int tile) {
    dev::mbarrier::wait(full_v_bar(dev::pipeline_stage(tile, kStages)),
                        dev::pipeline_full_parity(tile, kStages));
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  };
  [[maybe_unused]] auto issue_s = [&](auto& tS, int tile) {
    const int stage = dev::pipeline_stage(tile, kStages);
    mma_s.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
    for (int k = 0; k < size<2>(tSrQ); ++k) {
      cute::gemm(mma_s, tSrQ(_, _, k), tSrK(_, _, k, stage), tS);
      mma_s.accumulate_ = GMMA::ScaleOut::One;
    }
  };
  [[maybe_unused]] auto issue_pv = [&](int tile) {
    const int stage = dev::pipeline_stage(tile, kStages);
#pragma unroll
    for (int k = 0; k < size<2>(tOrP); ++k) {
      cute::gemm(mma_o, tOrP(_, _, k), tOrVt(_, _, k, stage), tOrO);
    }
  };
  // One stage: S of tile t + 1 into tN (kS) and P V of tile t - 1 (kPV) issued, tile t's softmax
  // on tC under them, then the wait and what needs it.
  // (always_inline: a stage outlined into a function of its own serializes every wgmma.)
  [[maybe_unused]] auto overlap_stage = [&]<bool kS, bool kPV>(auto& tC, auto& tN, int t)
      __attribute__((always_inline)) {
    if constexpr (kS) wait_k(t + 1);
    if constexpr (kPV) wait_v(t - 1);
    take_turn();
    if constexpr (kS || kPV) {
      if constexpr (kS) warpgroup_fence_operand(tN);
      if constexpr (kPV) {
        warpgroup_fence_operand(tOrP);
        warpgroup_fence_operand(tOrO);
      }
      warpgroup_arrive();
      if constexpr (kS) issue_s(tN, t + 1);
      if constexpr (kPV) issue_pv(t - 1);
      warpgroup_commit_batch();
    }
    pass_turn();
    float tmax[2];
    scores(tC, t, tmax);
    // The rescale of O waits for the stage's P V product: its factors kept until then.
    bool rescale = false;
    float factor[2] = {1.0f, 1.0f};
    dev::rescale_on_new_max(m, l, tmax, [&](int r, float f) {
      rescale = true;
      factor[r] = f;
    });
    const float m_sub[2] = {m[0] == -INFINITY ? 0.0f : m[0], m[1] == -INFINITY ? 0.0f : m[1]};
#pragma unroll
    for (int v = 0; v < size(tC); ++v) {
      const int r = (v >> 1) & 1;
      tC(v) = dev::exp2_ftz(kSoftCap ? tC(v) - m_sub[r] : fmaf(tC(v), p.sm_scale_log2, -m_sub[r]));
    }
#pragma unroll
    for (int v = 0; v < size(tC); v += 2) l[(v >> 1) & 1] += tC(v) + tC(v + 1);
    // The wait in both arms of a branch on whether any row of the warpgroup has a new maximum:
    // ptxas schedules a wait within its basic block as early as it can (it does not know what the
    // wait costs), which put it above most of the exponentials; a block boundary keeps them under
    // the products. The condition is the warpgroup's (a barrier reduction over its 128 threads),
    // not the warp's: wgmma.wait_group is .aligned, so all four warps must execute the same one.
    // A warp without a new maximum then scales O by its factors of exactly 1 (exp2 of 0, as the
    // plain loop does for a warp's other rows): the same bits.
    uint32_t rescale_any;
    asm volatile(
        "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, 128, p;\n"
        " selp.u32 %0, 1, 0, q;\n}\n"
        : "=r"(rescale_any)
        : "r"(static_cast<uint32_t>(rescale)), "r"(kSm90OverlapBarrier + wg_index)
        : "memory");
    auto wait_stage = [&] {
      if constexpr (kS || kPV) {
        warpgroup_wait<0>();
        if constexpr (kS) warpgroup_fence_operand(tN);
        if constexpr (kPV) {
          warpgroup_fence_operand(tOrO);
          warpgroup_fence_operand(tOrP);
        }
      }
    };
    if (rescale_any != 0) {
      wait_stage();
#pragma unroll
      for (int v = 0; v < size(tOrO); ++v) tOrO(v) *= factor[(v >> 1) & 1];
    } else {
      wait_stage();
    }
    // Tile t + 1's K and tile t - 1's V read: their slots go back to the producer.
    if constexpr (kS) dev::mbarrier::arrive(empty_bar(dev::pipeline_stage(t + 1, kStages)));
    if constexpr (kPV) dev::mbarrier::arrive(empty_v_bar(dev::pipeline_stage(t - 1, kStages)));
    uint32_t* p_pairs = reinterpret_cast<uint32_t*>(raw_pointer_cast(tOrP.data()));
#pragma unroll
    for (int v = 0; v < size(tC); v += 2) p_pairs[v / 2] = dev::mma::pack2<T>(tC(v), tC(v + 1));
  };
  if constexpr (kOverlap) {
    if (num_tiles > 0) {
      Tensor tSrS2 = partition_fragment_C(mma_s, Shape<Int<kCtaQ>, Int<kN>>{});  // odd tiles' S
      // Tile 0's S alone.
      wait_k(0);
      take_turn();
      warpgroup_fence_operand(tSrS);
      warpgroup_arrive();
      issue_s(tSrS, 0);
      warpgroup_commit_batch();
      pass_turn();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      dev::mbarrier::arrive(empty_bar(dev::pipeline_stage(0, kStages)));
      const int last = num_tiles - 1;
      if (last == 0) {
        overlap_stage.template operator()<false, false>(tSrS, tSrS2, 0);
      } else {
        overlap_stage.template operator()<true, false>(tSrS, tSrS2, 0);
        int t = 1;
#pragma unroll 1
        for (; t + 1 < last; t += 2) {
          overlap_stage.template operator()<true, true>(tSrS2, tSrS, t);
          overlap_stage.template operator()<true, true>(tSrS, tSrS2, t + 1);
        }
        if (t < last) {
          overlap_stage.template operator()<true, true>(tSrS2, tSrS, t);
          ++t;
        }
        // t == last: its S in tSrS2 when odd.
        if (t & 1) {
          overlap_stage.template operator()<false, true>(tSrS2, tSrS, t);
        } else {
          overlap_stage.template operator()<false, true>(tSrS, tSrS2, t);
        }
      }
      // The last tile's P V.
      wait_v(last);
      take_turn();
      warpgroup_fence_operand(tOrP);
      warpgroup_fence_operand(tOrO);
      warpgroup_arrive();
      issue_pv(last);
      warpgroup_commit_batch();
      pass_turn();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      warpgroup_fence_operand(tOrP);
      dev::mbarrier::arrive(empty_v_bar(dev::pipeline_stage(last, kStages)));
    }
  } else {
    int32_t next_page = kWs ? 0 : page_of(kStages);  // (kWs: the producer's alone)
#pragma unroll 1
    for (int tile = 0; tile < num_tiles; ++tile) {
      const int stage = tile % kStages;
      if constexpr (kWs) {
        // Q (before the first tile) and this tile landed: the producer's copies arrived on their
        // barriers; the proxy fence makes what the barrier acquired visible to wgmma.
        if (tile == 0) dev::mbarrier::wait(q_bar, 0);
        dev::mbarrier::wait(full_bar(stage), dev::pipeline_full_parity(tile, kStages));
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      } else if constexpr (kFp8) {
        dev::cp_async::wait<kStages - 1>();  // tile `tile` (and Q) landed for this thread ...
        // ... for every thread, and every warpgroup is done with the 16-bit tiles (each waited for
        // its MMAs before this barrier); then widened into them, the stage freed for tile + 2.
        __syncthreads();
        if (p.kv.dtype == DType::kFloat8E5M2) {
          widen.template operator()<__NV_E5M2>(stage);
        } else {
          widen.template operator()<__NV_E4M3>(stage);
        }
        fill_from(tile + kStages, next_page, 0);
        next_page = page_of(tile + kStages + 1);
        // The widened tiles (generic-proxy stores) and Q (cp.async) visible to wgmma, for every
        // thread; the offsets of tile + 2 written before its copy below.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        load_kv(tile + kStages, 0);
      } else {
        // One barrier a tile. Only tile `tile`'s copy is in flight (issued in the iteration before,
        // or the prologue, with Q): landed for this thread, visible to wgmma (the proxy fence), for
        // every thread (the barrier). Past the barrier every warpgroup has also waited for its MMAs
        // of tile - 1, so that tile's stage is free for tile + 1 (copied below, beside this tile's
        // S product), and every thread has issued the copy of tile (which read offset buffer
        // tile % 2), so that buffer takes tile + 2's offsets; tile + 1's, in the other buffer, were
        // written before the barrier.
        dev::cp_async::wait<0>();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        fill_from(tile + kStages, next_page, tile % 2);
        next_page = page_of(tile + kStages + 1);
      }
      const int stage16 = kFp8 ? 0 : stage;  // the 16-bit tiles the MMAs read

      // S = Q K^T over DQK / 16 k-steps, into a zeroed accumulator.
      take_turn();
      warpgroup_fence_operand(tSrS);
      warpgroup_arrive();
      mma_s.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
      for (int k = 0; k < size<2>(tSrQ); ++k) {
        cute::gemm(mma_s, tSrQ(_, _, k), tSrK(_, _, k, stage16), tSrS);
        mma_s.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      pass_turn();
      // 16-bit: tile + 1's copy into the stage tile - 1 left, while the tensor cores work on S.
      if constexpr (!kFp8 && !kWs) load_kv(tile + 1, (tile + 1) % 2);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);

      float tmax[2];
      scores(tSrS, tile, tmax);
      // Rescaled only when a row of the warp has a new maximum (dev::rescale_on_new_max).
      dev::rescale_on_new_max(m, l, tmax, [&](int r, float factor) {
#pragma unroll
        for (int v = 0; v < size(tOrO); ++v) {
          if (((v >> 1) & 1) == r) tOrO(v) *= factor;
        }
      });
      const float m_sub[2] = {m[0] == -INFINITY ? 0.0f : m[0], m[1] == -INFINITY ? 0.0f : m[1]};
      uint32_t* p_pairs = reinterpret_cast<uint32_t*>(raw_pointer_cast(tOrP.data()));
#pragma unroll
      for (int v = 0; v < size(tSrS); v += 2) {
        const int r = (v >> 1) & 1;
        const float p0 = dev::exp2_ftz(kSoftCap ? tSrS(v) - m_sub[r]
                                                : fmaf(tSrS(v), p.sm_scale_log2, -m_sub[r]));
        const float p1 = dev::exp2_ftz(kSoftCap ? tSrS(v + 1) - m_sub[r]
                                                : fmaf(tSrS(v + 1), p.sm_scale_log2, -m_sub[r]));
        l[r] += p0 + p1;
        p_pairs[v / 2] = dev::mma::pack2<T>(p0, p1);
      }

      // O += P V over kN / 16 k-steps (P's registers fenced like the accumulators: the compiler
      // must not move their writes past the wgmma that reads them, nor reuse them before its wait).
      take_turn();
      warpgroup_fence_operand(tOrP);
      warpgroup_fence_operand(tOrO);
      warpgroup_arrive();
#pragma unroll
      for (int k = 0; k < size<2>(tOrP); ++k) {
        cute::gemm(mma_o, tOrP(_, _, k), tOrVt(_, _, k, stage16), tOrO);
      }
      warpgroup_commit_batch();
      pass_turn();
      warpgroup_wait<0>();  // the stage is read: refilled after the next tile's barrier
      warpgroup_fence_operand(tOrO);
      warpgroup_fence_operand(tOrP);
      if constexpr (kWs) dev::mbarrier::arrive(empty_bar(stage));  // ... or once both released it
    }
  }
  if constexpr (kPingPong) {
    if (wg_index == 0)
      asm volatile("barrier.sync 1, 256;\n" ::: "memory");  // warpgroup 1's last pass
  }
  dev::cp_async::wait<0>();  // no copy may still target shared memory when the block exits

  float out_scale = p.v_scale;
  if (p.scale_v) out_scale *= p.scale_v[g];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float lr = l[r];
    lr += __shfl_xor_sync(0xffffffffu, lr, 1);
    lr += __shfl_xor_sync(0xffffffffu, lr, 2);
    const int32_t pr = warp_row0 + gid + 8 * r;
    if (pr >= rows) continue;
    const uint32_t qrel = static_cast<uint32_t>(pos_of[r] - pos_shift);
    const int32_t h = g * group + (pr - static_cast<int32_t>(qrel) * group);
    prefill_store_row<T, DVO>(p, w, q_base, qrel, h, m[r], lr, out_scale, tid4,
                              [&](int n, int c) { return tOrO(4 * n + 2 * r + c); });
  }
  pdl_launch_dependents();
}

}  // namespace flashinfer::kernels::cuda::prefill
