// The Hopper prefill kernel's host-checkable decisions (src/kernels/cuda/prefill_sm90_shape.h)
// and, where the build has CUTLASS's headers, the CuTe layouts it is built on
// (prefill_sm90_kernel.cuh's Sm90Prefill), evaluated on the CPU: the accumulator coordinates the
// kernel assumes for each thread's values (its masks, softmax rows and epilogue addresses), that P
// written in place of S is the A operand of O += P V value for value, and that the kernel's
// 16-byte copies into the swizzled tiles land where the descriptors read (each unit contiguous,
// the layouts bijections, the stages disjoint).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/cuda/device/mbarrier.cuh"

#include "kernels/cuda/prefill_shape.h"
#include "kernels/cuda/prefill_sm90.h"
#include "kernels/cuda/prefill_sm90_shape.h"

#if FLASHINFER_TEST_HAVE_CUTE
#include "kernels/cuda/prefill_sm90_traits.h"
#include "util/wgmma_accumulator.h"
#endif

namespace flashinfer::kernels::cuda::prefill {
namespace {

TEST(PrefillSm90Shape, DispatchRule) {
  constexpr long long kH100Optin = 232448;  // cudaDevAttrMaxSharedMemoryPerBlockOptin, sm_90
  const unsigned smem = prefill_sm90_smem_bytes(128, 128);
  // Q 32 KiB + 2 stages x (K 32 KiB + V 32 KiB) + two buffers of offsets (2 x 2 KiB) + range +
  // alignment slack.
  EXPECT_EQ(smem, 32768u + 131072u + 4096u + 16u + 1024u);
  EXPECT_LE(smem, static_cast<unsigned>(kH100Optin));
  EXPECT_TRUE(prefill_sm90_fits(9, 0, 128, 128, 128, true, 0, true, kH100Optin));
  // sm_90a code runs on sm_90 only: not on an A100, an sm_89 part or Blackwell.
  EXPECT_FALSE(prefill_sm90_fits(8, 0, 128, 128, 128, true, 0, true, kH100Optin));
  EXPECT_FALSE(prefill_sm90_fits(10, 0, 128, 128, 128, true, 0, true, kH100Optin));
  EXPECT_FALSE(prefill_sm90_fits(9, 1, 128, 128, 128, true, 0, true, kH100Optin));
  // Work items of 17-64 packed rows (the plan's 64-row tiles) run in one-warpgroup blocks (not at
  // head dim 256), more in tall ones; 16 and fewer (tensor-core decode) stay on the FA2 kernel.
  EXPECT_EQ(prefill_sm90_warpgroups(9, 0, 64, 128, 128, true, 0, true, kH100Optin), 1);
  EXPECT_EQ(prefill_sm90_warpgroups(9, 0, 17, 128, 128, true, 0, true, kH100Optin), 1);
  EXPECT_EQ(prefill_sm90_warpgroups(9, 0, 17, 64, 64, true, 0, true, kH100Optin), 1);
  EXPECT_EQ(prefill_sm90_warpgroups(9, 0, 65, 128, 128, true, 0, true, kH100Optin), 2);
  EXPECT_EQ(prefill_sm90_warpgroups(9, 0, 64, 256, 256, true, 0, true, kH100Optin), 0);
  EXPECT_FALSE(prefill_sm90_fits(9, 0, 16, 128, 128, true, 0, true, kH100Optin));
  EXPECT_TRUE(prefill_sm90_fits(9, 0, 65, 128, 128, true, 0, true, kH100Optin));
  EXPECT_EQ(prefill_plan_cta_tile_q(64.5, 128), kSm90CtaQ);
  EXPECT_EQ(prefill_plan_cta_tile_q(64.0, 128), 64);
  // Head dims: 64, 128 and 256.
  EXPECT_TRUE(prefill_sm90_fits(9, 0, 128, 64, 64, true, 0, true, kH100Optin));
  EXPECT_TRUE(prefill_sm90_fits(9, 0, 128, 256, 256, true, 0, true, kH100Optin));
  EXPECT_FALSE(prefill_sm90_fits(9, 0, 128, 64, 128, true, 0, true, kH100Optin));
  EXPECT_FALSE(prefill_sm90_fits(9, 0, 128, 96, 96, true, 0, true, kH100Optin));
  // DeepSeek's qk 192 / vo 128 in tall blocks (16-bit K/V: the callers' kv_ok holds
  // prefill_sm90_kv_built), not in one-warpgroup blocks.
  EXPECT_TRUE(prefill_sm90_fits(9, 0, 128, 192, 128, true, 0, true, kH100Optin));
  EXPECT_TRUE(prefill_sm90_fits(9, 0, 128, 192, 128, true, kPrefillSoftCap, true, kH100Optin));
  EXPECT_EQ(prefill_sm90_warpgroups(9, 0, 64, 192, 128, true, 0, true, kH100Optin), 0);
  EXPECT_FALSE(prefill_sm90_fits(9, 0, 128, 128, 192, true, 0, true, kH100Optin));
  EXPECT_TRUE(prefill_sm90_kv_built(192, 128, false));
  EXPECT_FALSE(prefill_sm90_kv_built(192, 128, true));
  EXPECT_TRUE(prefill_sm90_kv_built(128, 128, true));
  // 192 / 128: 128-key tiles (S and O 64 accumulators a thread each, as at 128), Q 48 KiB +
  // 2 x (K 48 + V 32) KiB + offsets 4 KiB: 213 KiB, one block an SM.
  EXPECT_EQ(prefill_sm90_kv_tile(192, 128), 128);
  EXPECT_EQ(prefill_sm90_k_bytes(192, 128), 49152u);
  EXPECT_EQ(prefill_sm90_v_bytes(192, 128), 32768u);
  EXPECT_EQ(prefill_sm90_smem_bytes(192, 128), 49152u + 163840u + 4096u + 16u + 1024u);
  EXPECT_LE(prefill_sm90_smem_bytes(192, 128), static_cast<unsigned>(kH100Optin));
  EXPECT_EQ(prefill_sm90_min_blocks(192), 1);
  EXPECT_TRUE(prefill_sm90_ping_pong_built(192, 128, 2));
  EXPECT_FALSE(prefill_sm90_ping_pong_built(192, 128, 1));
  // Copies: a thread keeps whole unit columns of a row (one at 64 / 128 / 256; three of a
  // 192-wide row, 8 threads a row), in blocks of 256 and 128 threads.
  EXPECT_EQ(prefill_sm90_units_per_thread(8, 256), 1);
  EXPECT_EQ(prefill_sm90_units_per_thread(16, 256), 1);
  EXPECT_EQ(prefill_sm90_units_per_thread(32, 256), 1);
  EXPECT_EQ(prefill_sm90_units_per_thread(24, 256), 3);
  EXPECT_EQ(prefill_sm90_units_per_thread(16, 128), 1);
  EXPECT_EQ(prefill_sm90_units_per_thread(12, 256), 3);  // fp8 192: 12 units, 4 threads a row
  EXPECT_EQ(prefill_sm90_units_per_thread(5, 256), 5);
  // The soft cap and fp8 K/V (kv_ok: of q's dtype or fp8) are built; other K/V dtypes, a custom
  // mask, ALiBi, scales that do not fold and too little shared memory are not.
  EXPECT_TRUE(prefill_sm90_fits(9, 0, 128, 128, 128, true, kPrefillSoftCap, true, kH100Optin));
  EXPECT_FALSE(prefill_sm90_fits(9, 0, 128, 128, 128, true, kPrefillSoftCap | kPrefillCustomMask,
                                 true, kH100Optin));
  EXPECT_FALSE(prefill_sm90_fits(9, 0, 128, 128, 128, false, 0, true, kH100Optin));
  EXPECT_FALSE(prefill_sm90_fits(9, 0, 128, 128, 128, true, kPrefillCustomMask, true, kH100Optin));
  EXPECT_FALSE(prefill_sm90_fits(9, 0, 128, 128, 128, true, kPrefillAlibi, true, kH100Optin));
  EXPECT_FALSE(prefill_sm90_fits(9, 0, 128, 128, 128, true, 0, false, kH100Optin));
  EXPECT_FALSE(prefill_sm90_fits(9, 0, 128, 128, 128, true, 0, true, smem - 1));
  EXPECT_TRUE(prefill_sm90_fits(9, 0, 128, 128, 128, true, 0, true, smem));
  // Head dim 256: 64-key tiles, Q 64 KiB + 2 x (32 + 32) KiB, one block an SM.
  EXPECT_EQ(prefill_sm90_kv_tile(256, 256), 64);
  EXPECT_EQ(prefill_sm90_smem_bytes(256, 256), 65536u + 131072u + 2048u + 16u + 1024u);
  EXPECT_LE(prefill_sm90_smem_bytes(256, 256), static_cast<unsigned>(kH100Optin));
  EXPECT_EQ(prefill_sm90_min_blocks(256), 1);
  EXPECT_EQ(kSm90Threads, 256);
  EXPECT_EQ(prefill_sm90_kv_tile(128, 128), 128);
  // Head dim 64: 64-key tiles and two blocks an SM (their tiles and the launch bounds' 128
  // registers a thread), within the SM's 228 KiB and 64 K registers.
  EXPECT_EQ(prefill_sm90_kv_tile(64, 64), 64);
  EXPECT_EQ(prefill_sm90_smem_bytes(64, 64), 16384u + 32768u + 2048u + 16u + 1024u);
  EXPECT_EQ(prefill_sm90_min_blocks(64), 2);
  EXPECT_EQ(prefill_sm90_min_blocks(128), 1);
  for (int d : {64, 128}) {
    EXPECT_LE(static_cast<long long>(prefill_sm90_min_blocks(d)) *
                  (prefill_sm90_smem_bytes(d, d) + 1024u),
              228 * 1024)
        << d;
    EXPECT_LE(prefill_sm90_min_blocks(d) * kSm90Threads * (d == 64 ? 128 : 255), 65536) << d;
  }
  // One-warpgroup blocks: 64-key tiles, two an SM at head dims 64 and 128.
  EXPECT_EQ(prefill_sm90_kv_tile(128, 128, 1), 64);
  EXPECT_EQ(prefill_sm90_smem_bytes(128, 128, 1), 16384u + 65536u + 2048u + 16u + 1024u);
  EXPECT_EQ(prefill_sm90_min_blocks(128, 1), 2);
  EXPECT_EQ(prefill_sm90_min_blocks(64, 1), 2);
  EXPECT_FALSE(prefill_sm90_dim_built(256, 256, 1));
  for (int d : {64, 128}) {
    EXPECT_LE(2 * (prefill_sm90_smem_bytes(d, d, 1) + 1024u), 228u * 1024u) << d;
  }
  // The ping-pong schedule: where a tall block is alone on its SM (head dims 128 and 256); its
  // named barriers take the block's 16 (ptxas reserves all for barrier ids in registers), which
  // one block an SM can hold.
  EXPECT_TRUE(prefill_sm90_ping_pong_built(128, 128, 2));
  EXPECT_TRUE(prefill_sm90_ping_pong_built(256, 256, 2));
  EXPECT_FALSE(prefill_sm90_ping_pong_built(64, 64, 2));    // two blocks an SM
  EXPECT_FALSE(prefill_sm90_ping_pong_built(128, 128, 1));  // one warpgroup
  for (int d : {128, 256}) EXPECT_EQ(prefill_sm90_min_blocks(d, 2), 1) << d;
}

// The launcher's and the planner's one dtype rule: 16-bit q and an output of q's dtype; K/V of
// q's dtype, or fp8 at equal head dims outside multi-item scoring.
TEST(PrefillSm90Shape, DtypeRuleSharedByLauncherAndPlanner) {
  using flashinfer::kernels::cuda::prefill_sm90_dtypes_fit;
  constexpr DType bf = DType::kBFloat16, h = DType::kFloat16, f = DType::kFloat32;
  constexpr DType e4 = DType::kFloat8E4M3FN, e5 = DType::kFloat8E5M2;
  EXPECT_TRUE(prefill_sm90_dtypes_fit(bf, bf, bf, 128, 128, false));
  EXPECT_TRUE(prefill_sm90_dtypes_fit(h, h, h, 192, 128, false));
  EXPECT_TRUE(prefill_sm90_dtypes_fit(bf, e4, bf, 128, 128, false));
  EXPECT_TRUE(prefill_sm90_dtypes_fit(h, e5, h, 64, 64, false));
  EXPECT_TRUE(prefill_sm90_dtypes_fit(bf, bf, bf, 128, 128, true));
  EXPECT_FALSE(prefill_sm90_dtypes_fit(bf, h, bf, 128, 128, false));   // K/V of another 16-bit type
  EXPECT_FALSE(prefill_sm90_dtypes_fit(bf, bf, f, 128, 128, false));   // fp32 output
  EXPECT_FALSE(prefill_sm90_dtypes_fit(f, f, f, 128, 128, false));     // fp32 q
  EXPECT_FALSE(prefill_sm90_dtypes_fit(e4, e4, bf, 128, 128, false));  // fp8 q
  EXPECT_FALSE(prefill_sm90_dtypes_fit(bf, e4, bf, 192, 128, false));  // fp8 at 192 / 128
  EXPECT_FALSE(prefill_sm90_dtypes_fit(bf, e4, bf, 128, 128, true));   // fp8 multi-item
}

// A call the tall blocks' forms take: bf16, 32:8 heads, head dim 128. (This file includes no test
// utilities: their Tensor and Shape would meet CuTe's.)
AttentionParams tall_block_call() {
  AttentionParams p;
  p.q_dtype = p.o_dtype = p.kv.dtype = DType::kBFloat16;
  p.num_qo_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim_qk = p.head_dim_vo = 128;
  return p;
}

// The warp-specialized form's shape: 384 threads (a producer warpgroup after the two math ones),
// its instances (tall blocks, head dim 128, 16-bit K/V), its shared memory (the tall block's and
// five mbarriers) within the opt-in limit, and the switch, read at each call.
TEST(PrefillSm90Shape, WarpSpecializedInstancesAndSwitch) {
  EXPECT_EQ(prefill_sm90_block_threads(2, false), 256);
  EXPECT_EQ(prefill_sm90_block_threads(2, true), 384);
  EXPECT_EQ(prefill_sm90_block_threads(1, false), 128);
  EXPECT_TRUE(prefill_sm90_ws_built(128, 128, false, 2));
  EXPECT_FALSE(prefill_sm90_ws_built(128, 128, true, 2));   // fp8 K/V: widened by the math threads
  EXPECT_FALSE(prefill_sm90_ws_built(128, 128, false, 1));  // one-warpgroup blocks
  EXPECT_FALSE(prefill_sm90_ws_built(256, 256, false, 2));  // 4 keys a producer pass
  EXPECT_FALSE(prefill_sm90_ws_built(64, 64, false, 2));
  EXPECT_TRUE(prefill_sm90_ws_built(192, 128, false, 2));  // DeepSeek's, three unit columns
  EXPECT_FALSE(prefill_sm90_ws_built(192, 128, true, 2));
  EXPECT_EQ(prefill_sm90_ws_smem_bytes(128, 128), prefill_sm90_smem_bytes(128, 128) + 40u);
  constexpr long long kOptin = 232448;
  AttentionParams p = tall_block_call();
  unsetenv("FLASHINFER_PREFILL_SM90_WS");
  EXPECT_FALSE(prefill_sm90_ws_takes(p, kOptin));  // opt-in
  setenv("FLASHINFER_PREFILL_SM90_WS", "1", 1);
  EXPECT_TRUE(prefill_sm90_ws_takes(p, kOptin));
  EXPECT_FALSE(prefill_sm90_ws_takes(p, prefill_sm90_ws_smem_bytes(128, 128) - 1));
  p.kv.dtype = DType::kFloat8E4M3FN;
  EXPECT_FALSE(prefill_sm90_ws_takes(p, kOptin));
  p.kv.dtype = DType::kBFloat16;
  p.head_dim_qk = p.head_dim_vo = 256;
  EXPECT_FALSE(prefill_sm90_ws_takes(p, kOptin));
  unsetenv("FLASHINFER_PREFILL_SM90_WS");
}

// The overlapped form's shape: the warp-specialized form's instances less the soft-capped ones,
// 64-key tiles in four stages (Q, the stages, three offset buffers, the tile range, the slack and
// 17 mbarriers: 160 KiB and 4 KiB more at head dim 128, 212 KiB at 192 / 128, within the opt-in
// limit), its own switch (not the warp-specialized one's), read at each call.
TEST(PrefillSm90Shape, OverlappedInstancesAndSwitch) {
  EXPECT_EQ(prefill_sm90_stages(false), 2);
  EXPECT_EQ(prefill_sm90_stages(true), 4);
  EXPECT_TRUE(prefill_sm90_overlap_built(128, 128, false, 2));
  EXPECT_TRUE(prefill_sm90_overlap_built(192, 128, false, 2));
  EXPECT_FALSE(prefill_sm90_overlap_built(128, 128, true, 2));
  EXPECT_FALSE(prefill_sm90_overlap_built(256, 256, false, 2));
  EXPECT_FALSE(prefill_sm90_overlap_built(128, 128, false, 1));
  // (three offset buffers, K's and V's barriers apart: 17)
  EXPECT_EQ(prefill_sm90_offset_buffers(true), 3);
  EXPECT_EQ(prefill_sm90_barriers_per_stage(true), 4);
  EXPECT_EQ(prefill_sm90_ws_smem_bytes(128, 128, true),
            32768u + 4u * 64u * 256u * 2u + 48u * 64u + 16u + 1024u + 8u * 17u);
  EXPECT_EQ(prefill_sm90_ws_smem_bytes(192, 128, true),
            49152u + 4u * 64u * 320u * 2u + 48u * 64u + 16u + 1024u + 8u * 17u);
  EXPECT_EQ(prefill_sm90_ws_smem_bytes(128, 128, false), prefill_sm90_ws_smem_bytes(128, 128));
  constexpr long long kOptin = 232448;
  EXPECT_LE(prefill_sm90_ws_smem_bytes(192, 128, true), static_cast<unsigned>(kOptin));
  AttentionParams p = tall_block_call();
  unsetenv("FLASHINFER_PREFILL_SM90_OVERLAP");
  setenv("FLASHINFER_PREFILL_SM90_WS", "1", 1);
  EXPECT_FALSE(prefill_sm90_overlap_takes(p, kOptin));  // opt-in, on its own switch
  unsetenv("FLASHINFER_PREFILL_SM90_WS");
  setenv("FLASHINFER_PREFILL_SM90_OVERLAP", "1", 1);
  EXPECT_TRUE(prefill_sm90_overlap_takes(p, kOptin));
  EXPECT_FALSE(prefill_sm90_ws_takes(p, kOptin));  // (the switches are separate)
  EXPECT_FALSE(prefill_sm90_overlap_takes(p, prefill_sm90_ws_smem_bytes(128, 128, true) - 1));
  p.logits_soft_cap = 30.0f;  // no soft-capped instance
  EXPECT_FALSE(prefill_sm90_overlap_takes(p, kOptin));
  p.logits_soft_cap = 0.0f;
  p.kv.dtype = DType::kFloat8E4M3FN;
  EXPECT_FALSE(prefill_sm90_overlap_takes(p, kOptin));
  p.kv.dtype = DType::kBFloat16;
  p.head_dim_qk = 192;
  EXPECT_TRUE(prefill_sm90_overlap_takes(p, kOptin));
  p.head_dim_qk = p.head_dim_vo = 256;
  EXPECT_FALSE(prefill_sm90_overlap_takes(p, kOptin));
  unsetenv("FLASHINFER_PREFILL_SM90_OVERLAP");
}

// The warp-specialized pipeline's protocol (prefill_sm90_kernel.cuh, kWs), run on a model of
// mbarriers: a barrier counts arrivals to its initial count, the last completes its phase, and a
// wait for parity P passes when the phase before the current one has parity P (the phase before
// the first counts as complete: PTX's mbarrier.try_wait.parity). The producer (one agent for its
// 128 threads) waits on a stage's "empty" barrier, writes the tile and issues its copies, which
// land later in four warps' parts, each arriving on the stage's "full" barrier (Q likewise, on its
// own barrier); each math warpgroup runs its program of acquisitions (a wait on "full", and on Q
// before its first tile), turns and releases (an arrival on "empty" for its 128 threads). Random
// interleavings of the three agents and the landings, for 0 to 9 tiles, with and without the
// ping-pong turns, in both forms, must end with every tile read from its own, landed data, no
// stage overwritten while a warpgroup still holds it or before both released it, and every turn
// taken; the kernel's parity rules (dev::pipeline_full_parity / pipeline_empty_parity) do, and
// each of three wrong rules is caught (a hang or a wrong read).
struct PipelineRules {
  uint32_t (*full)(int tile, int stages);
  uint32_t (*empty)(int tile, int stages);
};

// The programs of the two forms. A pipeline's slots hold tiles of one kind: a tile's K and V
// together (kKv, the warp-specialized form: one "full" and one "empty" barrier a stage), or K and
// V apart (the overlapped form: K's slots and barriers, and V's).
enum class Part { kKv, kK, kV };

// A math warpgroup's program: the plain warp-specialized form acquires tile t, takes and passes a
// turn for its S and for its P V product, and releases it. The overlapped form (kOverlap) acquires
// tile 0's K for its S and releases it; then each stage t acquires tile t + 1's K (where there is
// one) and tile t - 1's V (from stage 1), takes and passes one turn (the two products issued
// together), and releases both once the products completed; the last tile's P V takes a turn of
// its own between its V's acquisition and release.
// A turn names the tiles its products read: k_tile's K (K and V together in the plain form) and
// v_tile's V (-1: none); the warpgroup must hold them, landed, when it issues them.
struct MathOp {
  enum Kind { kAcquire, kTurn, kRelease } kind;
  int tile;
  Part part = Part::kKv;
  int k_tile = -1, v_tile = -1;
};
std::vector<MathOp> math_program(int num_tiles, bool overlap) {
  std::vector<MathOp> ops;
  if (!overlap) {
    for (int t = 0; t < num_tiles; ++t) {
      ops.insert(ops.end(), {{MathOp::kAcquire, t},
                             {MathOp::kTurn, t, Part::kKv, t},
                             {MathOp::kTurn, t, Part::kKv, t},
                             {MathOp::kRelease, t}});
    }
    return ops;
  }
  if (num_tiles == 0) return ops;
  ops.insert(ops.end(), {{MathOp::kAcquire, 0, Part::kK},
                         {MathOp::kTurn, 0, Part::kK, 0},
                         {MathOp::kRelease, 0, Part::kK}});
  for (int t = 0; t < num_tiles; ++t) {
    if (t + 1 < num_tiles) ops.push_back({MathOp::kAcquire, t + 1, Part::kK});
    if (t > 0) ops.push_back({MathOp::kAcquire, t - 1, Part::kV});
    ops.push_back({MathOp::kTurn, t, Part::kK, t + 1 < num_tiles ? t + 1 : -1, t - 1});
    if (t + 1 < num_tiles) ops.push_back({MathOp::kRelease, t + 1, Part::kK});
    if (t > 0) ops.push_back({MathOp::kRelease, t - 1, Part::kV});
  }
  ops.insert(ops.end(), {{MathOp::kAcquire, num_tiles - 1, Part::kV},
                         {MathOp::kTurn, num_tiles - 1, Part::kK, -1, num_tiles - 1},
                         {MathOp::kRelease, num_tiles - 1, Part::kV}});
  return ops;
}

// The producer's copies in order: every tile's K and V together, or (the overlapped form) tile 0's
// K, then for each tile t tile t + 1's K before tile t's V.
std::vector<std::pair<Part, int>> producer_program(int num_tiles, bool overlap) {
  std::vector<std::pair<Part, int>> ops;
  if (!overlap) {
    for (int t = 0; t < num_tiles; ++t) ops.push_back({Part::kKv, t});
    return ops;
  }
  if (num_tiles > 0) ops.push_back({Part::kK, 0});
  for (int t = 0; t < num_tiles; ++t) {
    if (t + 1 < num_tiles) ops.push_back({Part::kK, t + 1});
    ops.push_back({Part::kV, t});
  }
  return ops;
}

// turns: the ping-pong schedule too. Each math warpgroup takes its turn at the tensor cores
// (bar.sync on its own named barrier, 1 or 2) before each group of products and passes it
// (bar.arrive on the other's) after it; warpgroup 1 passes once before its first tile and
// warpgroup 0 takes once after its last. A named barrier is modelled by its arrivals and completed
// syncs: a sync waits for an arrival it has not used, and more than one arrival ahead would let
// the arriving warpgroup's 128 threads alone complete a phase of the 256-thread barrier.
// stages: the slots of each kind (0: the form's own, prefill_sm90_stages); program: the math
// warpgroups' (null: math_program's).
std::string simulate_ws_pipeline(int num_tiles, unsigned seed, PipelineRules rules,
                                 bool turns = false, bool overlap = false, int stages = 0,
                                 const std::vector<MathOp>* program_in = nullptr) {
  const int kStages = stages > 0 ? stages : prefill_sm90_stages(overlap);
  constexpr int kWarps = kSm90WsProducerThreads / 32;
  struct Bar {
    int count, pending, done = 0;
    void arrive(int n) {
      pending -= n;
      if (pending == 0) {
        ++done;
        pending = count;
      }
    }
    bool passes(uint32_t parity) const { return parity != (static_cast<uint32_t>(done) & 1u); }
  };
  struct Stage {
    int tile = -1, landed = 0, readers = 0, released = 0;
  };
  // One kind's slots and their barriers (kKv, kK, kV).
  struct Slots {
    std::vector<Bar> full, empty;
    std::vector<Stage> stage;
  };
  std::vector<Slots> slots(3);
  for (Slots& sl : slots) {
    sl.full.assign(kStages, Bar{kSm90WsProducerThreads, kSm90WsProducerThreads});
    sl.empty.assign(kStages, Bar{kSm90Threads, kSm90Threads});
    sl.stage.assign(kStages, Stage{});
  }
  auto slots_of = [&](Part part) -> Slots& { return slots[static_cast<int>(part)]; };
  Bar q{kSm90WsProducerThreads, kSm90WsProducerThreads};
  struct Landing {
    Part part;
    int stage;  // -1: Q
    int tile;
  };
  std::vector<Landing> in_flight;  // one entry a warp's part
  int q_landed = 0;
  bool q_issued = false;
  const std::vector<MathOp> program =
      program_in != nullptr ? *program_in : math_program(num_tiles, overlap);
  const std::vector<std::pair<Part, int>> copies = producer_program(num_tiles, overlap);
  std::size_t producer_op = 0;
  struct Math {
    std::size_t op = 0;
    bool passing = false;                    // in a turn: taken, not yet passed
    bool started = false, finished = false;  // warpgroup 1's first pass, warpgroup 0's last take
  };
  Math math[2];
  math[0].started = math[1].finished = true;
  if (!turns) math[1].started = math[0].finished = true;
  auto name = [](Part part, int tile) {
    return std::string(part == Part::kK   ? "K of "
                       : part == Part::kV ? "V of "
                                          : "") +
           "tile " + std::to_string(tile);
  };
  std::set<std::pair<int, int>> held[2];  // (part, tile) each warpgroup acquired, not yet released
  // The tiles a turn's products read: held by the warpgroup, in their slots, landed.
  auto check_reads = [&](int w, const MathOp& o) -> std::string {
    const std::pair<Part, int> reads[] = {{overlap ? Part::kK : Part::kKv, o.k_tile},
                                          {Part::kV, o.v_tile}};
    for (const auto& [part, t] : reads) {
      if (t < 0) continue;
      const Stage& st = slots_of(part).stage[dev::pipeline_stage(t, kStages)];
      if (held[w].count({static_cast<int>(part), t}) == 0 || st.tile != t || st.landed != kWarps) {
        return "a turn read " + name(part, t) + " without holding it, landed";
      }
    }
    return "";
  };
  int arrivals[2] = {0, 0}, syncs[2] = {0, 0};  // named barriers 1 and 2
  auto pass_to = [&](int b) {
    ++arrivals[b];
    return arrivals[b] - syncs[b] <= 1;
  };
  std::mt19937 rng(seed);
  for (int step = 0; step < 100000; ++step) {
    std::vector<int> runnable;         // 0: producer, 1 / 2: math warpgroups, 3: a landing
    if (!q_issued && num_tiles > 0) {  // (a block with no tile copies no Q)
      runnable.push_back(0);
    } else if (q_issued && producer_op < copies.size()) {
      const auto [part, t] = copies[producer_op];
      const int s = dev::pipeline_stage(t, kStages);
      if (slots_of(part).empty[s].passes(rules.empty(t, kStages))) runnable.push_back(0);
    }
    for (int w = 0; w < 2; ++w) {
      const Math& m = math[w];
      bool ready = false;
      if (!m.started) {
        ready = true;
      } else if (m.op < program.size()) {
        const MathOp& o = program[m.op];
        const int s = dev::pipeline_stage(o.tile, kStages);
        if (o.kind == MathOp::kAcquire) {
          // (Q before the first tile's K: the kernel's wait_k(0) or its first "full" wait)
          ready = (o.tile > 0 || o.part == Part::kV || q.passes(0)) &&
                  slots_of(o.part).full[s].passes(rules.full(o.tile, kStages));
        } else if (o.kind == MathOp::kTurn && turns && !m.passing) {
          ready = arrivals[w] > syncs[w];
        } else {
          ready = true;
        }
      } else if (!m.finished) {
        ready = arrivals[w] > syncs[w];
      }
      if (ready) runnable.push_back(1 + w);
    }
    if (!in_flight.empty()) runnable.push_back(3);
    if (runnable.empty()) {
      if (producer_op == copies.size() && math[0].op == program.size() &&
          math[1].op == program.size() && math[0].finished && math[1].started) {
        if (arrivals[0] != syncs[0] || arrivals[1] != syncs[1]) return "a turn left unused";
        return "";
      }
      return "hang: producer at copy " + std::to_string(producer_op) + ", math at op " +
             std::to_string(math[0].op) + " / " + std::to_string(math[1].op);
    }
    const int who = runnable[rng() % runnable.size()];
    if (who == 0 && !q_issued) {
      q_issued = true;
      for (int w = 0; w < kWarps; ++w) in_flight.push_back({Part::kKv, -1, -1});
    } else if (who == 0) {
      const auto [part, t] = copies[producer_op++];
      const int s = dev::pipeline_stage(t, kStages);
      Stage& st = slots_of(part).stage[s];
      if (st.readers > 0) return name(part, t) + " overwrote a stage being read";
      if (st.tile >= 0 && st.released < 2) {
        return name(part, t) + " overwrote " + name(part, st.tile) +
               " before both warpgroups read it";
      }
      st = Stage{t, 0, 0, 0};
      for (int w = 0; w < kWarps; ++w) in_flight.push_back({part, s, t});
    } else if (who == 3) {
      const std::size_t i = rng() % in_flight.size();
      const Landing l = in_flight[i];
      in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(i));
      if (l.stage < 0) {
        ++q_landed;
        q.arrive(32);
      } else {
        ++slots_of(l.part).stage[l.stage].landed;
        slots_of(l.part).full[l.stage].arrive(32);
      }
    } else if (const int w = who - 1; !math[w].started) {
      math[w].started = true;
      if (!pass_to(1 - w)) return "two turns passed ahead";
    } else if (math[w].op >= program.size()) {
      ++syncs[w];
      math[w].finished = true;
    } else {
      Math& m = math[w];
      const MathOp& o = program[m.op];
      const int s = dev::pipeline_stage(o.tile, kStages);
      Stage& st = slots_of(o.part).stage[s];
      if (o.kind == MathOp::kAcquire) {
        if (q_landed != kWarps) return "a math warpgroup read Q before it landed";
        if (st.tile != o.tile || st.landed != kWarps) {
          return name(o.part, o.tile) + " read stage " + std::to_string(s) + " holding " +
                 name(o.part, st.tile) + ", " + std::to_string(st.landed) + " of " +
                 std::to_string(kWarps) + " parts landed";
        }
        ++st.readers;
        held[w].insert({static_cast<int>(o.part), o.tile});
        ++m.op;
      } else if (o.kind == MathOp::kTurn) {
        if (turns && !m.passing) {
          ++syncs[w];
          m.passing = true;
        } else {
          const std::string err = check_reads(w, o);
          if (!err.empty()) return err;
          if (turns && !pass_to(1 - w)) return "two turns passed ahead";
          m.passing = false;
          ++m.op;
        }
      } else {
        if (held[w].erase({static_cast<int>(o.part), o.tile}) == 0) {
          return name(o.part, o.tile) + " released without being held";
        }
        if (st.tile != o.tile) return name(o.part, o.tile) + " was overwritten while held";
        --st.readers;
        ++st.released;
        slots_of(o.part).empty[s].arrive(kSm90Threads / 2);
        ++m.op;
      }
    }
  }
  return "no end";
}

// The copies' lead: the fewest turns (groups of wgmma products) a math warpgroup runs between the
// issue of a copy into a slot that held a tile before and its first wait for that copy, from the
// programs alone. The producer can issue a copy once it issued the copy before and the slot's
// last tile was released. A turn of the plain warp-specialized form is one 128-key product; of
// the overlapped form, two 64-key products: about the same tensor time.
int least_lead_in_turns(int num_tiles, bool overlap) {
  const int stages = prefill_sm90_stages(overlap);
  const std::vector<MathOp> program = math_program(num_tiles, overlap);
  // stage_of[i]: the turns before op i.
  std::vector<int> stage_of(program.size());
  int turns = 0;
  for (std::size_t i = 0; i < program.size(); ++i) {
    stage_of[i] = turns;
    if (program[i].kind == MathOp::kTurn) ++turns;
  }
  auto op_of = [&](MathOp::Kind kind, Part part, int tile) {
    for (std::size_t i = 0; i < program.size(); ++i) {
      if (program[i].kind == kind && program[i].part == part && program[i].tile == tile) {
        return static_cast<int>(i);
      }
    }
    return -1;
  };
  // The producer issues copy k after copy k - 1 and after the release of the slot's last tile.
  const std::vector<std::pair<Part, int>> copies = producer_program(num_tiles, overlap);
  int issued_after = -1, least = 1 << 30;  // the turns before copy k can be issued
  for (const auto& [part, t] : copies) {
    if (t >= stages) {
      issued_after = std::max(issued_after, stage_of[op_of(MathOp::kRelease, part, t - stages)]);
    }
    const int first_wait = stage_of[op_of(MathOp::kAcquire, part, t)];
    if (t >= stages) least = std::min(least, first_wait - issued_after);
  }
  return least;
}

TEST(PrefillSm90Shape, WarpSpecializedPipelineHandsEachStageOverInTurn) {
  const PipelineRules kernel{dev::pipeline_full_parity, dev::pipeline_empty_parity};
  for (bool overlap : {false, true}) {
    for (bool turns : {false, true}) {
      for (int tiles = 0; tiles <= 9; ++tiles) {
        for (unsigned seed = 0; seed < 300; ++seed) {
          const std::string err = simulate_ws_pipeline(tiles, seed, kernel, turns, overlap);
          ASSERT_EQ(err, "") << tiles << " tiles, seed " << seed << ", turns " << turns
                             << ", overlap " << overlap;
        }
      }
    }
  }
  // Wrong rules fail: the producer waiting for the full parity on "empty" (it would wait for the
  // first release before the first copy), ignoring the releases (parity always 1), and the math
  // warpgroups always waiting for parity 0 (past round 0 they would read stale stages).
  const PipelineRules wrong[] = {
      {dev::pipeline_full_parity, dev::pipeline_full_parity},
      {dev::pipeline_full_parity, [](int, int) { return 1u; }},
      {[](int, int) { return 0u; }, dev::pipeline_empty_parity},
  };
  for (const PipelineRules& r : wrong) {
    for (bool overlap : {false, true}) {
      int failed = 0;
      for (unsigned seed = 0; seed < 300; ++seed) {
        failed += !simulate_ws_pipeline(9, seed, r, false, overlap).empty();
        failed += !simulate_ws_pipeline(9, seed, r, true, overlap).empty();
      }
      EXPECT_GT(failed, 0) << "a wrong rule passed every interleaving; overlap " << overlap;
    }
  }
  // The overlapped form's K and V slots apart, fewer of them than its four: still no hang and no
  // slot overwritten while held, only less lead.
  for (int stages : {1, 2, 3}) {
    for (unsigned seed = 0; seed < 50; ++seed) {
      EXPECT_EQ(simulate_ws_pipeline(9, seed, kernel, seed % 2 == 1, true, stages), "")
          << stages << " stages, seed " << seed;
    }
  }
  // The copies' lead: with K and V apart and K copied a tile ahead, three turns of a warpgroup
  // run between a copy's issue and the first wait for it (where the slot had a tile before); two
  // in the warp-specialized form (one 128-key tile).
  EXPECT_EQ(least_lead_in_turns(12, true), 3);
  EXPECT_EQ(least_lead_in_turns(12, false), 2);
  // A release before the turn whose products read the slot (the slot freed while a wgmma still
  // reads it) is caught, in either part.
  for (Part part : {Part::kK, Part::kV}) {
    std::vector<MathOp> early = math_program(9, true);
    for (std::size_t i = 1; i < early.size(); ++i) {
      if (early[i].kind == MathOp::kRelease && early[i].part == part) {
        std::size_t j = i;
        while (j > 0 && early[j - 1].kind != MathOp::kTurn) --j;
        if (j > 0)
          std::rotate(early.begin() + static_cast<std::ptrdiff_t>(j - 1),
                      early.begin() + static_cast<std::ptrdiff_t>(i),
                      early.begin() + static_cast<std::ptrdiff_t>(i + 1));
      }
    }
    int failed = 0;
    for (unsigned seed = 0; seed < 50; ++seed) {
      failed += !simulate_ws_pipeline(9, seed, kernel, false, true, 0, &early).empty();
    }
    EXPECT_EQ(failed, 50) << "an early release of " << (part == Part::kK ? "K" : "V");
  }
  EXPECT_EQ(dev::pipeline_full_parity(0, 2), 0u);
  EXPECT_EQ(dev::pipeline_full_parity(2, 2), 1u);
  EXPECT_EQ(dev::pipeline_full_parity(5, 2), 0u);
  EXPECT_EQ(dev::pipeline_empty_parity(1, 2), 1u);  // the first round waits for nothing
  EXPECT_EQ(dev::pipeline_empty_parity(3, 2), 0u);
}

// The launcher's own rule (prefill_sm90_block_warpgroups) on calls' fields: every instance built is
// reachable (head dims 64 / 128 / 256, 16-bit and fp8 K/V, plain and soft-capped: the soft-capped
// calls, whose FA2 blocks are 64 rows, and head dim 256 included), and what it cannot run is not.
TEST(PrefillSm90Shape, LauncherRuleReachesEveryInstance) {
  constexpr long long kOptin = 232448;
  auto call = [](DType q, DType kv, int d) {
    AttentionParams p;
    p.q_dtype = q;
    p.o_dtype = q;
    p.kv.dtype = kv;
    p.num_qo_heads = 32;
    p.num_kv_heads = 8;
    p.head_dim_qk = p.head_dim_vo = d;
    p.max_work_rows = 32;  // 128 packed rows: the plan's tall tiles
    p.sm_scale = 0.088f;
    return p;
  };
  for (DType q : {DType::kBFloat16, DType::kFloat16}) {
    for (DType kv : {q, DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
      for (int d : {64, 128, 256}) {
        for (bool cap : {false, true}) {
          AttentionParams p = call(q, kv, d);
          if (cap) p.logits_soft_cap = 30.0f;
          EXPECT_TRUE(prefill_sm90_block_warpgroups(p, 9, 0, kOptin) == 2)
              << dtype_torch_name(q) << " " << dtype_torch_name(kv) << " d=" << d << " cap=" << cap;
          EXPECT_EQ(prefill_sm90_block_warpgroups(p, 8, 0, kOptin), 0);
          EXPECT_EQ(prefill_sm90_block_warpgroups(p, 10, 0, kOptin), 0);
          if (d != 256) {  // a plan of 64-row tiles: one-warpgroup blocks
            AttentionParams small = p;
            small.max_work_rows = 16;
            EXPECT_EQ(prefill_sm90_block_warpgroups(small, 9, 0, kOptin), 1) << d;
          }
          p.prefill_fa2_only = true;  // backend="fa2"
          EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 0);
        }
      }
    }
  }
  AttentionParams p = call(DType::kBFloat16, DType::kBFloat16, 128);
  p.max_work_rows = 16;  // 64 packed rows: the plan's 64-row tiles, one-warpgroup blocks
  EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 1);
  p.max_work_rows = 17;
  EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 2);
  p.max_work_rows = 4;  // 16 packed rows: the FA2 kernel's 16-row blocks
  EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 0);
  p.max_work_rows = 17;
  p.num_kv_heads = 32;  // MHA: 17 packed rows
  EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 1);
  p.head_dim_qk = p.head_dim_vo = 256;  // one-warpgroup blocks are not built at 256
  EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 0);
  p = call(DType::kBFloat16, DType::kBFloat16, 128);
  const uint8_t mask_byte = 0;
  const float slope = 0.5f, head_scale = 1.0f;
  p.custom_mask = &mask_byte;
  EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 0);
  p = call(DType::kBFloat16, DType::kBFloat16, 128);
  p.alibi_slopes = &slope;
  EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 0);
  p = call(DType::kBFloat16, DType::kBFloat16, 128);
  p.scale_q = &head_scale;  // per-head scales: the scale does not fold
  EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 0);
  p = call(DType::kBFloat16, DType::kBFloat16, 128);
  p.o_dtype = DType::kFloat16;
  EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 0);
  p = call(DType::kBFloat16, DType::kFloat16, 128);
  EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 0);
  p = call(DType::kBFloat16, DType::kBFloat16, 192);  // 192 / 192: not built
  EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 0);
  // DeepSeek's 192 / 128: tall blocks, 16-bit K/V (either 16-bit dtype), plain or soft-capped;
  // not fp8 K/V, not one-warpgroup blocks, not without its 213 KiB.
  for (DType q : {DType::kBFloat16, DType::kFloat16}) {
    for (bool cap : {false, true}) {
      p = call(q, q, 192);
      p.head_dim_vo = 128;
      if (cap) p.logits_soft_cap = 30.0f;
      EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 2) << cap;
    }
  }
  p = call(DType::kBFloat16, DType::kFloat8E4M3FN, 192);
  p.head_dim_vo = 128;
  EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 0);
  p = call(DType::kBFloat16, DType::kBFloat16, 192);
  p.head_dim_vo = 128;
  EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, prefill_sm90_smem_bytes(192, 128)), 2);
  EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, prefill_sm90_smem_bytes(192, 128) - 1), 0);
  p.max_work_rows = 16;  // 64 packed rows
  EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 0);
  p = call(DType::kBFloat16, DType::kBFloat16, 256);
  EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, prefill_sm90_smem_bytes(256, 256) - 1), 0);
  p = call(DType::kBFloat16, DType::kBFloat16, 128);
  p.max_work_rows = 16;  // a one-warpgroup block's shared memory
  EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, prefill_sm90_smem_bytes(128, 128, 1)), 1);
  EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, prefill_sm90_smem_bytes(128, 128, 1) - 1), 0);
}

// Multi-item scoring's rows (AttentionParams::multi_item_rows) on the Hopper kernel: their own
// variant bit (not the custom mask's, which stays off the kernel), the instances built
// (head dims 128, 16-bit K/V of q's dtype, no soft cap; tall and one-warpgroup blocks) reached by
// the launcher's rule, everything else left to the FA2 kernel, and never the warp-specialized or
// overlapped forms (their instances are not multi-item), whatever the switches ask.
TEST(PrefillSm90Shape, MultiItemScoringRunsWhereItsInstancesAreBuilt) {
  constexpr long long kOptin = 232448;
  EXPECT_EQ(prefill_sm90_variant(false, false, true, false), kSm90MultiItem);
  EXPECT_EQ(prefill_sm90_variant(true, false, true, false), kSm90MultiItem | kPrefillSoftCap);
  EXPECT_EQ(prefill_sm90_variant(false, true, false, false), kPrefillCustomMask);
  EXPECT_EQ(prefill_sm90_variant(true, false, false, true), kPrefillSoftCap | kPrefillAlibi);
  EXPECT_TRUE(prefill_sm90_kv_built(128, 128, true));
  EXPECT_FALSE(prefill_sm90_kv_built(128, 128, true, true));
  EXPECT_TRUE(prefill_sm90_kv_built(128, 128, false, true));
  const int32_t item_rows[2] = {0, 0}, item_bounds[2] = {0, 0};
  const uint8_t mask_byte = 0;
  auto call = [&](DType q, DType kv, int dqk, int dvo) {
    AttentionParams p;
    p.q_dtype = p.o_dtype = q;
    p.kv.dtype = kv;
    p.num_qo_heads = 32;
    p.num_kv_heads = 8;
    p.head_dim_qk = dqk;
    p.head_dim_vo = dvo;
    p.max_work_rows = 32;  // 128 packed rows: tall blocks
    p.sm_scale = 0.088f;
    p.multi_item_rows = item_rows;
    p.multi_item_bounds = item_bounds;
    return p;
  };
  for (DType q : {DType::kBFloat16, DType::kFloat16}) {
    AttentionParams p = call(q, q, 128, 128);
    EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 2) << dtype_torch_name(q);
    EXPECT_EQ(prefill_sm90_block_warpgroups(p, 8, 0, kOptin), 0);
    EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, prefill_sm90_smem_bytes(128, 128) - 1), 0);
    p.max_work_rows = 16;  // 64 packed rows: one-warpgroup blocks
    EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 1) << dtype_torch_name(q);
    p.max_work_rows = 4;  // 16 packed rows: the FA2 kernel's 16-row blocks
    EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 0);
    p = call(q, q, 128, 128);
    p.prefill_fa2_only = true;  // backend="fa2"
    EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 0);
    // Not built: fp8 K/V, the soft cap, other head dims.
    for (DType kv : {DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
      EXPECT_EQ(prefill_sm90_block_warpgroups(call(q, kv, 128, 128), 9, 0, kOptin), 0);
    }
    p = call(q, q, 128, 128);
    p.logits_soft_cap = 30.0f;
    EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 0);
    EXPECT_EQ(prefill_sm90_block_warpgroups(call(q, q, 64, 64), 9, 0, kOptin), 0);
    EXPECT_EQ(prefill_sm90_block_warpgroups(call(q, q, 256, 256), 9, 0, kOptin), 0);
    EXPECT_EQ(prefill_sm90_block_warpgroups(call(q, q, 192, 128), 9, 0, kOptin), 0);
    // The same call without the rows, and with a custom mask instead.
    p = call(q, q, 64, 64);
    p.multi_item_rows = nullptr;
    p.multi_item_bounds = nullptr;
    EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 2);
    p.custom_mask = &mask_byte;
    EXPECT_EQ(prefill_sm90_block_warpgroups(p, 9, 0, kOptin), 0);
  }
  // The warp-specialized and overlapped forms take the plain call, not the multi-item one.
  setenv("FLASHINFER_PREFILL_SM90_WS", "1", 1);
  setenv("FLASHINFER_PREFILL_SM90_OVERLAP", "1", 1);
  AttentionParams p = call(DType::kBFloat16, DType::kBFloat16, 128, 128);
  EXPECT_FALSE(prefill_sm90_ws_takes(p, kOptin));
  EXPECT_FALSE(prefill_sm90_overlap_takes(p, kOptin));
  p.multi_item_rows = nullptr;
  EXPECT_TRUE(prefill_sm90_ws_takes(p, kOptin));
  EXPECT_TRUE(prefill_sm90_overlap_takes(p, kOptin));
  unsetenv("FLASHINFER_PREFILL_SM90_WS");
  unsetenv("FLASHINFER_PREFILL_SM90_OVERLAP");
}

#if FLASHINFER_TEST_HAVE_CUTE

template <class T, int DQK, int DVO = DQK, int kWG = 2>
void check_accumulators_and_p() {
  using namespace cute;
  using Tr = Sm90Prefill<T, DQK, DVO, kWG>;
  constexpr int kSm90CtaQ = Tr::kCtaQ;  // this block's rows and threads
  constexpr int kSm90Threads = prefill_sm90_threads(kWG);
  constexpr int kN = Tr::kN;
  typename Tr::MmaS mma_s;
  typename Tr::MmaO mma_o;
  for (int t = 0; t < kSm90Threads; ++t) {
    auto thr_s = mma_s.get_thread_slice(t);
    auto thr_o = mma_o.get_thread_slice(t);
    Tensor cs = thr_s.partition_C(make_identity_tensor(Shape<Int<kSm90CtaQ>, Int<kN>>{}));
    Tensor co = thr_o.partition_C(make_identity_tensor(Shape<Int<kSm90CtaQ>, Int<DVO>>{}));
    ASSERT_EQ(int(size(cs)), kN / 2);
    ASSERT_EQ(int(size(co)), DVO / 2);
    // (the kernel's fragment formula, tests/util/wgmma_accumulator.h)
    ASSERT_NO_FATAL_FAILURE(flashinfer::testing::expect_wgmma_acc_coords(cs, t, "S"));
    ASSERT_NO_FATAL_FAILURE(flashinfer::testing::expect_wgmma_acc_coords(co, t, "O"));
    // S = Q K^T: each warpgroup's A operand (Q through descriptors) is its own 64 rows, every
    // dim of them; its B operand every key of the tile.
    Tensor qa = thr_s.partition_A(make_identity_tensor(Shape<Int<kSm90CtaQ>, Int<DQK>>{}));
    std::set<std::pair<int, int>> q_seen;
    for (int i = 0; i < int(size(qa)); ++i) {
      const int row = get<0>(qa(i));
      ASSERT_EQ(row / 64, t / 128) << "thread " << t << " reads another warpgroup's Q row";
      q_seen.insert({row, int(get<1>(qa(i)))});
    }
    EXPECT_EQ(q_seen.size(), 64u * DQK) << "thread " << t;
    Tensor kb = thr_s.partition_B(make_identity_tensor(Shape<Int<kN>, Int<DQK>>{}));
    EXPECT_EQ(int(size(kb)), kN * DQK) << "thread " << t;
    // O += P V reads A element (a, 0, k) of this thread from register LayoutP(a, 0, k), which the
    // kernel filled with P of S value LayoutP(a, 0, k): both must name the same (row, key).
    Tensor ca = thr_o.partition_A(make_identity_tensor(Shape<Int<kSm90CtaQ>, Int<kN>>{}));
    const typename Tr::LayoutP lp{};
    ASSERT_EQ(int(size(ca)), int(size(lp)));
    ASSERT_EQ(int(size<2>(ca)), kN / 16);
    for (int a = 0; a < int(size<0>(ca)); ++a) {
      for (int k = 0; k < int(size<2>(ca)); ++k) {
        const int reg = lp(a, 0, k);
        ASSERT_EQ(ca(a, 0, k), cs(reg)) << "thread " << t << " A value " << a << " step " << k;
      }
    }
    // 16-bit pairs: the kernel packs values (2i, 2i + 1) into one register; the A operand's pairs
    // are consecutive registers too.
    for (int a = 0; a < int(size<0>(ca)); a += 2) {
      for (int k = 0; k < int(size<2>(ca)); ++k) {
        ASSERT_EQ(lp(a + 1, 0, k), lp(a, 0, k) + 1);
        ASSERT_EQ(lp(a, 0, k) % 2, 0);
      }
    }
  }
}

TEST(PrefillSm90Shape, AccumulatorCoordinatesAndPInPlaceBf16) {
  check_accumulators_and_p<__nv_bfloat16, 128>();
  check_accumulators_and_p<__nv_bfloat16, 64>();
  check_accumulators_and_p<__nv_bfloat16, 256>();
  check_accumulators_and_p<__nv_bfloat16, 192, 128>();
  check_accumulators_and_p<__nv_bfloat16, 128, 128, 1>();
  check_accumulators_and_p<__nv_bfloat16, 64, 64, 1>();
}
TEST(PrefillSm90Shape, AccumulatorCoordinatesAndPInPlaceFp16) {
  check_accumulators_and_p<__half, 128>();
  check_accumulators_and_p<__half, 64>();
  check_accumulators_and_p<__half, 256>();
  check_accumulators_and_p<__half, 192, 128>();
  check_accumulators_and_p<__half, 128, 128, 1>();
  check_accumulators_and_p<__half, 64, 64, 1>();
}

// A layout's 16-byte units: every (row, 8 c) names 8 contiguous elements at a 16-byte boundary,
// and the layout maps its coordinates one to one onto [0, size).
template <class Layout, class Offset>
void check_units(const Layout& layout, int rows, int cols, int stages, Offset offset) {
  std::set<int> seen;
  for (int s = 0; s < stages; ++s) {
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; c += 8) {
        const int base = offset(layout, r, c, s);
        ASSERT_EQ(base % 8, 0) << r << "," << c << "," << s;
        for (int j = 0; j < 8; ++j) {
          ASSERT_EQ(offset(layout, r, c + j, s), base + j) << r << "," << c + j << "," << s;
          ASSERT_TRUE(seen.insert(base + j).second) << "element written twice";
        }
      }
    }
  }
  EXPECT_EQ(static_cast<int>(seen.size()), rows * cols * stages);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), rows * cols * stages - 1);
}

// Every (row, 16-byte unit) of a tile of `rows` x `units`, exactly once, over the threads of a
// block that each keep `u` unit columns (col, col + units / u, ...) of rows r0, r0 + pass, ...
// with col = tid % (units / u), r0 = tid / (units / u), pass = threads / (units / u): the
// kernel's copy mapping (Q, K and V).
void check_copy_cover(int rows, int units, int threads) {
  const int u = prefill_sm90_units_per_thread(units, threads);
  ASSERT_GT(u, 0);
  const int cols = units / u, pass = threads / cols;
  ASSERT_EQ(threads % cols, 0);
  ASSERT_EQ(rows % pass, 0);
  std::set<std::pair<int, int>> seen;
  for (int tid = 0; tid < threads; ++tid) {
    for (int r = tid / cols; r < rows; r += pass) {
      for (int j = 0; j < u; ++j) {
        ASSERT_TRUE(seen.insert({r, tid % cols + j * cols}).second) << "unit copied twice";
      }
    }
  }
  EXPECT_EQ(static_cast<int>(seen.size()), rows * units);
}

// kCopyThreads: the threads that copy (every thread of the block, or the warp-specialized form's
// producer warpgroup).
// kTileN / kStages: the keys of a tile and the stages (the overlapped form's: 64 keys, 4 stages).
template <int DQK, int DVO = DQK, int kWG = 2, int kCopyThreads = prefill_sm90_threads(kWG),
          int kTileN = prefill_sm90_kv_tile(DQK, DVO, kWG), int kStages = kSm90Stages>
void check_tiles() {
  using Tr = Sm90Prefill<__nv_bfloat16, DQK, DVO, kWG, kTileN, kStages>;
  constexpr int kSm90CtaQ = Tr::kCtaQ;  // this block's rows
  constexpr int kSm90Threads = kCopyThreads;
  constexpr int kN = Tr::kN;
  // Q [128 rows x DQK dims]: the kernel writes (r, 8 col).
  check_units(typename Tr::OffsetsQ{}, kSm90CtaQ, DQK, 1,
              [](const auto& l, int r, int c, int) { return static_cast<int>(l(r, c)); });
  // K [key x dim x stage]: (r, 8 col, stage).
  check_units(typename Tr::OffsetsK{}, kN, DQK, kStages,
              [](const auto& l, int r, int c, int s) { return static_cast<int>(l(r, c, s)); });
  // V^T [dim x key x stage]: key r's unit col at (8 col, r, stage): dims contiguous in a key.
  check_units(typename Tr::OffsetsVt{}, kN, DVO, kStages,
              [](const auto& l, int r, int c, int s) { return static_cast<int>(l(c, r, s)); });
  // Each stage is one contiguous block of kN x DQK (K) or kN x DVO (V) elements (the byte sizes
  // the kernel's carve-up of shared memory assumes: prefill_sm90_k_bytes / v_bytes).
  const typename Tr::OffsetsK lk{};
  const typename Tr::OffsetsVt lv{};
  const int k_bytes = kN * DQK * 2, v_bytes = kN * DVO * 2;
  if constexpr (kTileN == prefill_sm90_kv_tile(DQK, DVO, kWG)) {
    EXPECT_EQ(k_bytes, static_cast<int>(prefill_sm90_k_bytes(DQK, DVO, kWG)));
    EXPECT_EQ(v_bytes, static_cast<int>(prefill_sm90_v_bytes(DQK, DVO, kWG)));
  }
  for (int s = 0; s < kStages; ++s) {
    int lo_k = 1 << 30, lo_v = 1 << 30;
    for (int r = 0; r < kN; ++r) {
      for (int c = 0; c < DQK; ++c) lo_k = std::min(lo_k, static_cast<int>(lk(r, c, s)));
      for (int c = 0; c < DVO; ++c) lo_v = std::min(lo_v, static_cast<int>(lv(c, r, s)));
    }
    EXPECT_EQ(lo_k * 2, s * k_bytes);
    EXPECT_EQ(lo_v * 2, s * v_bytes);
  }
  EXPECT_EQ(static_cast<int>(cute::cosize(typename Tr::OffsetsQ{})) * 2,
            static_cast<int>(prefill_sm90_q_bytes(DQK, kWG)));
  // The hardware's 128-byte swizzle spelled out (the PTX ISA's canonical layouts): within a
  // 1024-byte atom of 8 rows of 128 bytes, row i's 16-byte chunk j sits at chunk j ^ (i % 8). K
  // (and Q) are K-major: rows are keys (queries), 64 dims an atom row, the keys' atoms stacked,
  // then the next 64 dims. V^T is MN-major: an atom row is 64 dims of one key, 8 keys an atom,
  // the dims' atoms side by side, then the next 8 keys.
  auto sw = [](int row, int byte_in_row) {
    return row * 128 + (((byte_in_row / 16) ^ (row % 8)) * 16) + byte_in_row % 16;
  };
  const typename Tr::OffsetsQ lq{};
  for (int r = 0; r < kSm90CtaQ; ++r) {
    for (int c = 0; c < DQK; ++c) {
      ASSERT_EQ(2 * static_cast<int>(lq(r, c)), (c / 64) * kSm90CtaQ * 128 + sw(r, 2 * (c % 64)))
          << "Q " << r << "," << c;
    }
  }
  for (int s = 0; s < kStages; ++s) {
    for (int r = 0; r < kN; ++r) {
      for (int c = 0; c < DQK; ++c) {
        ASSERT_EQ(2 * static_cast<int>(lk(r, c, s)),
                  s * k_bytes + (c / 64) * kN * 128 + sw(r, 2 * (c % 64)))
            << "K " << r << "," << c << "," << s;
      }
      for (int c = 0; c < DVO; ++c) {
        ASSERT_EQ(2 * static_cast<int>(lv(c, r, s)), s * v_bytes + (r / 8) * (DVO / 64) * 1024 +
                                                         (c / 64) * 1024 + sw(r % 8, 2 * (c % 64)))
            << "V " << r << "," << c << "," << s;
      }
    }
  }
  // The kernel's copy mapping covers each tile once (Q, K, V), and it addresses a thread's copies
  // from its first unit (key r0 < rows_per_pass, unit column c0) by constant steps: key r0 + i
  // rows_per_pass, unit column c0 + j cols of stage s is i row steps, j column steps (K rows of
  // several unit columns a thread: 192) and s stages away, for every key and unit of the tile.
  check_copy_cover(kSm90CtaQ, DQK / 8, kSm90Threads);
  check_copy_cover(kN, DQK / 8, kSm90Threads);
  check_copy_cover(kN, DVO / 8, kSm90Threads);
  constexpr int kKu = prefill_sm90_units_per_thread(DQK / 8, kSm90Threads);
  static_assert(prefill_sm90_units_per_thread(DVO / 8, kSm90Threads) == 1, "V: one unit column");
  constexpr int kKCols = DQK / 8 / kKu;
  constexpr int kKRows = kSm90Threads / kKCols, kVRows = kSm90Threads / (DVO / 8);
  constexpr int kKStep = Tr::template k_step_bytes<kKRows>();
  constexpr int kVStep = Tr::template v_step_bytes<kVRows>();
  constexpr int kKColStep = [] {
    if constexpr (kKu > 1) {
      return Tr::template k_col_step_bytes<kKCols * 8>();
    } else {
      return 0;
    }
  }();
  for (int s = 0; s < kStages; ++s) {
    for (int r = 0; r < kN; ++r) {
      for (int unit = 0; unit < DQK / 8; ++unit) {
        const int r0 = r % kKRows, i = r / kKRows, c0 = unit % kKCols, j = unit / kKCols;
        ASSERT_EQ(
            2 * static_cast<int>(lk(r, 8 * unit, s)),
            2 * static_cast<int>(lk(r0, 8 * c0, 0)) + i * kKStep + j * kKColStep + s * k_bytes)
            << "K key " << r << " unit " << unit << " stage " << s;
      }
      for (int unit = 0; unit < DVO / 8; ++unit) {
        const int r0 = r % kVRows, i = r / kVRows;
        ASSERT_EQ(2 * static_cast<int>(lv(8 * unit, r, s)),
                  2 * static_cast<int>(lv(8 * unit, r0, 0)) + i * kVStep + s * v_bytes)
            << "V key " << r << " unit " << unit << " stage " << s;
      }
    }
  }
}

TEST(PrefillSm90Shape, CopiedUnitsLandInTheSwizzledTiles) {
  check_tiles<128>();
  check_tiles<64>();
  check_tiles<256>();
  check_tiles<192, 128>();
  check_tiles<128, 128, 1>();
  check_tiles<64, 64, 1>();
  // The warp-specialized form: tall blocks copied by the producer's 128 threads.
  check_tiles<128, 128, 2, kSm90WsProducerThreads>();
  check_tiles<192, 128, 2, kSm90WsProducerThreads>();
  // The overlapped form: 64-key tiles in four stages, copied by the producer.
  check_tiles<128, 128, 2, kSm90WsProducerThreads, kSm90OverlapKvTile, kSm90OverlapStages>();
  check_tiles<192, 128, 2, kSm90WsProducerThreads, kSm90OverlapKvTile, kSm90OverlapStages>();
}

// The fp8 widening's stores (prefill_sm90_kernel.cuh, `widen`): unit c of key r (16 fp8 values)
// becomes two 16-byte units of 8 16-bit values, to K (r, 16 c + 8 h) at Tr::k_offset and to V^T
// (16 c + 8 h, r) at Tr::vt_offset in stage 0. Each must land where the hardware's 128-byte
// swizzle puts those elements (the MMAs read them through the descriptors), and the stores of a
// tile must write every element of stage 0 once. The kernel once offset its stores by
// LayoutK{}(r, col, 0) / LayoutVt{}(row, r, 0): without the shared-memory pointer those swizzle
// 16-bit element offsets as if they were bytes, and 3 of every 4 widened units went to another
// key's place (every fp8 case wrong on the H200 in session 64). That form is checked to differ.
template <class T, int D, int kWG>
void check_fp8_widen_stores() {
  using Tr = Sm90Prefill<T, D, D, kWG>;
  constexpr int kN = Tr::kN;
  auto sw = [](int row, int byte_in_row) {
    return row * 128 + (((byte_in_row / 16) ^ (row % 8)) * 16) + byte_in_row % 16;
  };
  // The hardware's byte addresses of stage 0 (as check_tiles spells them out).
  auto k_bytes = [&](int key, int dim) { return (dim / 64) * kN * 128 + sw(key, 2 * (dim % 64)); };
  auto vt_bytes = [&](int dim, int key) {
    return (key / 8) * (D / 64) * 1024 + (dim / 64) * 1024 + sw(key % 8, 2 * (dim % 64));
  };
  std::set<int> k_seen, v_seen;
  int k_wrong_unflagged = 0, v_wrong_unflagged = 0;
  constexpr int kUnits8 = D / 16;
  for (int i = 0; i < kN * kUnits8; ++i) {
    const int r = i / kUnits8, c = i % kUnits8;
    for (int h = 0; h < 2; ++h) {
      const int dim = 16 * c + 8 * h;
      const int ko = Tr::k_offset(r, dim), vo = Tr::vt_offset(dim, r);
      ASSERT_EQ(ko % 8, 0) << "K unit not 16-byte aligned: key " << r << " dim " << dim;
      ASSERT_EQ(vo % 8, 0) << "V^T unit not 16-byte aligned: key " << r << " dim " << dim;
      for (int j = 0; j < 8; ++j) {
        // Element dim + j of the unit: the hardware's address of that element is unit + j.
        ASSERT_EQ(2 * (ko + j), k_bytes(r, dim + j)) << "K key " << r << " dim " << dim + j;
        ASSERT_EQ(2 * (vo + j), vt_bytes(dim + j, r)) << "V^T key " << r << " dim " << dim + j;
        ASSERT_TRUE(k_seen.insert(ko + j).second) << "K element written twice";
        ASSERT_TRUE(v_seen.insert(vo + j).second) << "V^T element written twice";
      }
      k_wrong_unflagged += static_cast<int>(typename Tr::LayoutK{}(r, dim, 0)) != ko;
      v_wrong_unflagged += static_cast<int>(typename Tr::LayoutVt{}(dim, r, 0)) != vo;
    }
  }
  EXPECT_EQ(static_cast<int>(k_seen.size()), kN * D);
  EXPECT_EQ(*k_seen.rbegin(), kN * D - 1);
  EXPECT_EQ(static_cast<int>(v_seen.size()), kN * D);
  EXPECT_EQ(*v_seen.rbegin(), kN * D - 1);
  // The layouts evaluated without their pointer are not the hardware's offsets (the old bug).
  EXPECT_GT(k_wrong_unflagged, 0);
  EXPECT_GT(v_wrong_unflagged, 0);
}

// Every fp8 instance's shape (prefill_sm90_kv_built: equal head dims; two-warpgroup blocks at
// 64 / 128 / 256, one-warpgroup blocks at 64 / 128, which also serve decode from 17 packed rows).
TEST(PrefillSm90Shape, Fp8WidenStoresLandInTheSwizzledTiles) {
  check_fp8_widen_stores<__nv_bfloat16, 64, 2>();
  check_fp8_widen_stores<__nv_bfloat16, 128, 2>();
  check_fp8_widen_stores<__nv_bfloat16, 256, 2>();
  check_fp8_widen_stores<__nv_bfloat16, 64, 1>();
  check_fp8_widen_stores<__nv_bfloat16, 128, 1>();
  check_fp8_widen_stores<__half, 64, 2>();
  check_fp8_widen_stores<__half, 128, 1>();
}

#endif  // FLASHINFER_TEST_HAVE_CUTE

}  // namespace
}  // namespace flashinfer::kernels::cuda::prefill
