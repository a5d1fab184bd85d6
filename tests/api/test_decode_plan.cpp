// The host-side decisions behind the CUDA decode kernel, checked exactly without a GPU: the block
// shape (src/kernels/cuda/decode_shape.h), the occupancy the planner derives from it
// (kernels/occupancy.h), and the split-KV chunk search (api::plan_kv_chunk). The expected values
// are worked out by hand in the comments.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "api/attention_common.h"
#include "kernels/cuda/decode_shape.h"
#include "kernels/cuda/prefill_shape.h"
#include "kernels/occupancy.h"
#include "util/test_util.h"

namespace flashinfer {
namespace {

using kernels::cuda::decode_bdx;
using kernels::cuda::decode_block_shape;
using kernels::cuda::decode_rows_per_thread;
using kernels::cuda::DecodeBlockShape;

TEST(DecodeShape, LanesPerRowGiveEachLaneWhole16ByteSlices) {
  EXPECT_EQ(decode_bdx(128, 128, 2), 16);  // bf16 D128: 8 elements (16 B) a lane
  EXPECT_EQ(decode_bdx(64, 64, 2), 8);
  EXPECT_EQ(decode_bdx(256, 256, 2), 32);
  EXPECT_EQ(decode_bdx(128, 128, 1), 8);  // fp8 D128: 16 elements (16 B) a lane
  EXPECT_EQ(decode_bdx(64, 64, 1), 4);
  EXPECT_EQ(decode_bdx(256, 256, 1), 16);
  EXPECT_EQ(decode_bdx(192, 128, 2), 16);  // DeepSeek qk/vo: 12 and 8 elements a lane
  EXPECT_EQ(decode_bdx(80, 80, 2), 8);     // 160 B = 10 units: 8 lanes of 10 elements
  EXPECT_EQ(decode_bdx(16, 16, 1), 1);
}

TEST(DecodeShape, HeadlineShapesByHand) {
  // bf16 D128, GQA 4 (32:8): 16 x 4 rows x 2 token groups = 128 threads, 8 tokens a stage.
  // Offsets: 128 threads / 8 = 16 stages a fill -> 128 tokens. K/V: 2 stages x 8 x 256 x 2 B =
  // 8192; merge area 2 x 4 x 132 x 4 = 4224 fits in it. 2 x 128 x 8 + 8192 = 10240 bytes.
  DecodeBlockShape s = decode_block_shape(128, 128, 2, 4);
  EXPECT_EQ(s.bdx, 16);
  EXPECT_EQ(s.bdy, 4);
  EXPECT_EQ(s.bdz, 2);
  EXPECT_EQ(s.threads(), 128);
  EXPECT_EQ(s.tile_tokens, 8);
  EXPECT_EQ(s.cache_tokens, 128);
  EXPECT_EQ(s.smem_bytes, 10240);

  // MHA: one row, 8 token groups, 32 tokens a stage; 4 stages a fill; 2 x 32 x 512 = 32768.
  s = decode_block_shape(128, 128, 2, 1);
  EXPECT_EQ(s.bdy, 1);
  EXPECT_EQ(s.bdz, 8);
  EXPECT_EQ(s.tile_tokens, 32);
  EXPECT_EQ(s.cache_tokens, 128);
  EXPECT_EQ(s.smem_bytes, 2 * 128 * 8 + 32768);

  // GQA 8: 16 x 8 = 128 threads of rows, still two token groups (8 tokens a stage): 256
  // threads; 32 stages a fill (256 tokens). K/V 8192, merge 2 x 8 x 132 x 4 = 8448 is larger.
  s = decode_block_shape(128, 128, 2, 8);
  EXPECT_EQ(s.bdz, 2);
  EXPECT_EQ(s.threads(), 256);
  EXPECT_EQ(s.cache_tokens, 256);
  EXPECT_EQ(s.smem_bytes, 2 * 256 * 8 + 8448);

  // MQA 32: rows capped at 256 / 16 = 16 (the grid takes two row chunks), one token group.
  s = decode_block_shape(128, 128, 2, 32);
  EXPECT_EQ(s.bdy, 16);
  EXPECT_EQ(s.bdz, 1);
  EXPECT_EQ(s.tile_tokens, 4);
  EXPECT_EQ(s.cache_tokens, 256);
  EXPECT_EQ(s.smem_bytes, 2 * 256 * 8 + 2 * 4 * 256 * 2);

  // fp8 D128, GQA 4: 8 lanes x 4 rows x 4 groups = 128 threads, 16 tokens a stage; K/V
  // 2 x 16 x 256 x 1 = 8192 < merge 4 x 4 x 132 x 4 = 8448.
  s = decode_block_shape(128, 128, 1, 4);
  EXPECT_EQ(s.bdx, 8);
  EXPECT_EQ(s.bdz, 4);
  EXPECT_EQ(s.tile_tokens, 16);
  EXPECT_EQ(s.cache_tokens, 128);
  EXPECT_EQ(s.smem_bytes, 2 * 128 * 8 + 8448);
}

TEST(DecodeShape, RowsPerThreadChoiceByHand) {
  // bf16 D128: MHA and group 2 keep one row a thread (blocks of 1 and 2 rows); groups 4, 8, 16
  // take two.
  EXPECT_EQ(decode_rows_per_thread(128, 128, 2, 1), 1);
  EXPECT_EQ(decode_rows_per_thread(128, 128, 2, 2), 1);
  EXPECT_EQ(decode_rows_per_thread(128, 128, 2, 4), 2);
  EXPECT_EQ(decode_rows_per_thread(128, 128, 2, 8), 2);
  EXPECT_EQ(decode_rows_per_thread(128, 128, 2, 16), 2);
  EXPECT_EQ(decode_rows_per_thread(128, 128, 2, 64), 2);  // 16-row chunks
  // Several queries a request count as rows too: MHA with 4 queries a block.
  EXPECT_EQ(decode_rows_per_thread(128, 128, 2, 4), decode_rows_per_thread(128, 128, 2, 1 * 4));
  // Odd rows (3 = group 3, or 3 queries of MHA): one row a thread.
  EXPECT_EQ(decode_rows_per_thread(128, 128, 2, 3), 1);
  // 10 rows: 16 x 10 x 1 = 160 threads; 16 x 5 x 1 = 80 is not whole warps: one row.
  EXPECT_EQ(decode_rows_per_thread(128, 128, 2, 10), 1);
  // 6 rows: 16 x 6 x 2 = 192 threads, halved 96 (3 warps): two rows.
  EXPECT_EQ(decode_rows_per_thread(128, 128, 2, 6), 2);
  // JIT head dims past 32 bytes of q and V slice a lane keep one row: 96 (8 lanes of 12 + 12
  // elements), 192 / 128 (12 + 8), 80 (10 + 10), 48 (4 lanes of 12 + 12); 16 has 2 lanes a row
  // (fewer than the 4 tokens of a group). 32: 4 lanes of 8 + 8 = 32 bytes, 128 threads: two.
  EXPECT_EQ(decode_rows_per_thread(96, 96, 2, 8), 1);
  EXPECT_EQ(decode_rows_per_thread(192, 128, 2, 8), 1);
  EXPECT_EQ(decode_rows_per_thread(80, 80, 2, 8), 1);
  EXPECT_EQ(decode_rows_per_thread(48, 48, 2, 8), 1);
  EXPECT_EQ(decode_rows_per_thread(16, 16, 2, 8), 1);
  EXPECT_EQ(decode_rows_per_thread(32, 32, 2, 8), 2);
  // fp8 and the other head dims, group 4 and 8.
  for (int kvb : {1, 2}) {
    for (int d : {64, 128, 256}) {
      EXPECT_EQ(decode_rows_per_thread(d, d, kvb, 4), 2) << d << " " << kvb;
      EXPECT_EQ(decode_rows_per_thread(d, d, kvb, 8), 2) << d << " " << kvb;
      EXPECT_EQ(decode_rows_per_thread(d, d, kvb, 1), 1) << d << " " << kvb;
    }
  }
}

TEST(DecodeShape, TwoRowsAThreadByHand) {
  // bf16 D128, GQA 4: the one-row block's 4 rows x 2 token groups in 2 thread rows: 16 x 2 x 2
  // = 64 threads, 8 tokens a stage as before. Offsets: 64 / 8 = 8 stages a fill -> 64 tokens.
  // K/V 8192 > merge 2 x 4 x 132 x 4 = 4224: 2 x 64 x 8 + 8192 = 9216 bytes.
  DecodeBlockShape s = decode_block_shape(128, 128, 2, 4, 2);
  EXPECT_EQ(s.bdx, 16);
  EXPECT_EQ(s.bdy, 2);
  EXPECT_EQ(s.rows_per_thread, 2);
  EXPECT_EQ(s.block_rows(), 4);
  EXPECT_EQ(s.bdz, 2);
  EXPECT_EQ(s.threads(), 64);
  EXPECT_EQ(s.tile_tokens, 8);
  EXPECT_EQ(s.cache_tokens, 64);
  EXPECT_EQ(s.smem_bytes, 9216);

  // GQA 8: 16 x 4 x 2 = 128 threads (256 with one row a thread); 16 stages a fill (128
  // tokens); merge 2 x 8 x 132 x 4 = 8448 > K/V 8192: 2048 + 8448.
  s = decode_block_shape(128, 128, 2, 8, 2);
  EXPECT_EQ(s.bdy, 4);
  EXPECT_EQ(s.block_rows(), 8);
  EXPECT_EQ(s.bdz, 2);
  EXPECT_EQ(s.threads(), 128);
  EXPECT_EQ(s.cache_tokens, 128);
  EXPECT_EQ(s.smem_bytes, 2 * 128 * 8 + 8448);

  // fp8 D128, GQA 4: 8 x 2 x 4 = 64 threads, 16 tokens a stage; 4 stages a fill (64 tokens);
  // merge 4 x 4 x 132 x 4 = 8448 > K/V 8192.
  s = decode_block_shape(128, 128, 1, 4, 2);
  EXPECT_EQ(s.bdx, 8);
  EXPECT_EQ(s.bdy, 2);
  EXPECT_EQ(s.bdz, 4);
  EXPECT_EQ(s.threads(), 64);
  EXPECT_EQ(s.tile_tokens, 16);
  EXPECT_EQ(s.cache_tokens, 64);
  EXPECT_EQ(s.smem_bytes, 2 * 64 * 8 + 8448);
}

TEST(DecodeShape, InvariantsOverEveryConfiguration) {
  for (int kvb : {1, 2}) {
    for (int dqk = 16; dqk <= 256; dqk += 16) {
      for (int dvo : {dqk, 128}) {
        for (int rows = 1; rows <= 160; ++rows) {
          const DecodeBlockShape s = decode_block_shape(dqk, dvo, kvb, rows);
          SCOPED_TRACE(::testing::Message()
                       << dqk << "/" << dvo << " kv " << kvb << " rows " << rows);
          ASSERT_EQ(dqk % s.bdx, 0);
          ASSERT_EQ(dvo % s.bdx, 0);
          ASSERT_LE(s.threads(), kernels::cuda::kDecodeMaxThreads);
          // >= 128 threads or two token groups, unless that passes the thread limit; only the
          // 32 KiB caps of odd JIT pairs (a 16-wide qk) go below it.
          if (dqk >= 64 && dvo >= 64 && 2 * s.bdx * s.bdy <= kernels::cuda::kDecodeMaxThreads) {
            ASSERT_GE(s.threads(), std::min(128, s.bdx * s.bdy * 2));
          }
          ASSERT_EQ(s.threads() % 32, 0);  // whole warps: full-mask shuffles
          ASSERT_LT(s.bdy, rows + 32);     // idle rows only to fill warps
          if (s.bdx >= 8) {
            ASSERT_LE(s.bdy, std::max(rows, 32 / s.bdx) + 3);
          }
          ASSERT_EQ(s.tile_tokens, s.bdz * kernels::cuda::kDecodeTileZ);
          const int fills = s.cache_tokens / s.tile_tokens;
          ASSERT_EQ(s.cache_tokens % s.tile_tokens, 0);
          ASSERT_GE(fills, kernels::cuda::kDecodeStages);  // the prologue's stages: one fill
          ASSERT_EQ(fills & (fills - 1), 0);               // a power of two (the kernel masks)
          // The AOT dims need no opt-in; odd JIT pairs stay within every sm80+ part's limit.
          ASSERT_LE(s.smem_bytes, (dqk >= 64 && dvo >= 64 ? 48 : 96) * 1024);
          // Both stages of K and V, and the merge area, fit after the offset cache.
          const int after = s.smem_bytes - 16 * s.cache_tokens;
          ASSERT_GE(after, 2 * s.tile_tokens * (dqk + dvo) * kvb);
          if (s.bdz > 1) {
            ASSERT_GE(after, s.bdz * s.bdy * (dvo + 4) * 4);
          }
          // Two rows a thread where chosen: the same rows, token groups and tiles a block (so
          // every row's arithmetic is unchanged), half the threads, still whole warps, and room
          // for the stages and the merge area of every row.
          const int rpt = decode_rows_per_thread(dqk, dvo, kvb, rows);
          ASSERT_TRUE(rpt == 1 || rpt == 2);
          const DecodeBlockShape t = decode_block_shape(dqk, dvo, kvb, rows, rpt);
          if (rpt == 1) {
            ASSERT_TRUE(s.bdy < 4 || s.bdy % 2 != 0 || (s.threads() / 2) % 32 != 0 ||
                        s.bdx < kernels::cuda::kDecodeTileZ ||
                        (dqk / s.bdx + dvo / s.bdx) * kvb > 32);
            ASSERT_EQ(t.threads(), s.threads());
            ASSERT_EQ(t.smem_bytes, s.smem_bytes);
            continue;
          }
          ASSERT_GE(s.bdy, 4);
          ASSERT_EQ(t.bdx, s.bdx);
          ASSERT_EQ(t.bdz, s.bdz);
          ASSERT_EQ(t.block_rows(), s.bdy);
          ASSERT_EQ(t.tile_tokens, s.tile_tokens);
          ASSERT_EQ(2 * t.threads(), s.threads());
          ASSERT_EQ(t.threads() % 32, 0);
          const int t_fills = t.cache_tokens / t.tile_tokens;
          ASSERT_EQ(t.cache_tokens % t.tile_tokens, 0);
          ASSERT_GE(t_fills, kernels::cuda::kDecodeStages);
          ASSERT_EQ(t_fills & (t_fills - 1), 0);
          const int t_after = t.smem_bytes - 16 * t.cache_tokens;
          ASSERT_GE(t_after, 2 * t.tile_tokens * (dqk + dvo) * kvb);
          if (t.bdz > 1) {
            ASSERT_GE(t_after, t.bdz * t.block_rows() * (dvo + 4) * 4);
          }
          ASSERT_LE(t.smem_bytes, s.smem_bytes);
        }
      }
    }
  }
}

TEST(DecodeShape, OccupancyOfTheHeadlineBlockOnHopper) {
  // Registers are ptxas's for sm_90 (batch_decode_kernel, bf16 q; docs/ATTENTION.md): 72 for
  // bf16 D128 with one row a thread, 96 with two, 168 for fp8 K/V with two.
  const kernels::DeviceLimits h100 = kernels::device_limits(9, 0);
  // GQA 4 (the headline 32:8), two rows a thread: 64 threads, 96 registers -> 3072 a warp: 5
  // warps a sub-partition, 20 an SM = 10 blocks of 2 warps; threads allow 32, shared memory
  // 233472 / (9216 + 1024) = 22. So 10 x 132 SMs = 1320 is the planner's max_grid.
  const DecodeBlockShape s =
      decode_block_shape(128, 128, 2, 4, decode_rows_per_thread(128, 128, 2, 4));
  EXPECT_EQ(s.threads(), 64);
  EXPECT_EQ(kernels::occupancy_blocks_per_sm(h100, s.threads(), 96, s.smem_bytes), 10);
  // One row a thread (what it was): 128 threads, 72 registers -> 2304 a warp: 7 warps a
  // sub-partition, 28 an SM = 7 blocks of 4 warps (28 rows an SM against 40 above).
  const DecodeBlockShape s1 = decode_block_shape(128, 128, 2, 4);
  EXPECT_EQ(kernels::occupancy_blocks_per_sm(h100, s1.threads(), 72, s1.smem_bytes), 7);
  // GQA 8: 128 threads at 96 registers: 20 warps = 5 blocks (40 rows); one row a thread, 256
  // threads at 72: 28 warps -> 3 blocks of 8 (24 rows).
  const DecodeBlockShape g8 = decode_block_shape(128, 128, 2, 8, 2);
  EXPECT_EQ(kernels::occupancy_blocks_per_sm(h100, g8.threads(), 96, g8.smem_bytes), 5);
  const DecodeBlockShape g8_1 = decode_block_shape(128, 128, 2, 8);
  EXPECT_EQ(kernels::occupancy_blocks_per_sm(h100, g8_1.threads(), 72, g8_1.smem_bytes), 3);
  // fp8 GQA 4, two rows a thread: 64 threads, 168 registers -> 5376 a warp: 3 warps a
  // sub-partition, 12 an SM = 6 blocks of 2 warps (24 rows; one row a thread, 128 threads at
  // 101 registers -> 3328 a warp: 4 warps a sub-partition = 4 blocks, 16 rows).
  const DecodeBlockShape f = decode_block_shape(128, 128, 1, 4, 2);
  EXPECT_EQ(kernels::occupancy_blocks_per_sm(h100, f.threads(), 168, f.smem_bytes), 6);
  const DecodeBlockShape f1 = decode_block_shape(128, 128, 1, 4);
  EXPECT_EQ(kernels::occupancy_blocks_per_sm(h100, f1.threads(), 101, f1.smem_bytes), 4);
}

std::vector<int64_t> rep(std::size_t n, int64_t v) { return std::vector<int64_t>(n, v); }

// Which plain decode calls (use_tensor_cores=False) the planner sends to the tensor-core kernel on
// a GPU, apart from what the device and the FA2 kernel take (api::decode_tensor_cores_auto): the
// packed rows of a request (queries x group) from kDecodeTensorCoreMinRows = 4, backend "auto",
// no position encoding inside attention, not switched off.
// Under CUDA graphs the first plan's route holds for every later plan of the wrapper (the
// grid and kernel were captured), whatever FLASHINFER_DECODE_TENSOR_CORES says by then; eager
// wrappers, CPU wrappers and the sizing pass decide again.
TEST(DecodeTensorCores, CudaGraphWrappersKeepTheFirstPlansRoute) {
  detail::WrapperState s;
  s.decode = true;
  s.device = Device::cuda(0);
  s.use_cuda_graph = true;
  EXPECT_FALSE(api::decode_route_held(s));  // the first plan decides
  s.graph_batch = 8;                        // ... and sized the captured grid
  EXPECT_TRUE(api::decode_route_held(s));
  s.sizing_only = true;
  EXPECT_FALSE(api::decode_route_held(s));
  s.sizing_only = false;
  s.use_cuda_graph = false;
  EXPECT_FALSE(api::decode_route_held(s));
  s.use_cuda_graph = true;
  s.device = Device::cpu();
  EXPECT_FALSE(api::decode_route_held(s));
}

TEST(DecodeTensorCores, PlainDecodeFromFourPackedRows) {
  auto state = [](int32_t hq, int32_t hkv, int64_t q_len) {
    detail::WrapperState s;
    s.decode = true;
    s.num_qo_heads = hq;
    s.num_kv_heads = hkv;
    s.q_len_per_req = q_len;
    s.head_dim_qk = s.head_dim_vo = 128;
    return s;
  };
  using api::decode_tensor_cores_wanted;
  EXPECT_FALSE(decode_tensor_cores_wanted(state(32, 32, 1), false));  // MHA: CUDA cores
  EXPECT_FALSE(decode_tensor_cores_wanted(state(32, 16, 1), false));  // group 2
  EXPECT_TRUE(decode_tensor_cores_wanted(state(32, 8, 1), false));    // group 4: the headline
  EXPECT_TRUE(decode_tensor_cores_wanted(state(64, 8, 1), false));
  EXPECT_TRUE(decode_tensor_cores_wanted(state(32, 1, 1), false));
  EXPECT_TRUE(decode_tensor_cores_wanted(state(32, 16, 2), false));   // 2 queries x group 2
  EXPECT_FALSE(decode_tensor_cores_wanted(state(32, 32, 3), false));  // 3 packed rows
  EXPECT_FALSE(decode_tensor_cores_wanted(state(32, 8, 1), true));    // env off
  detail::WrapperState s = state(32, 8, 1);
  s.backend = "fa2";  // upstream's CUDA-core kernel, asked for by name
  EXPECT_FALSE(decode_tensor_cores_wanted(s, false));
  s.backend = "trtllm-gen";  // the decode wrapper runs this library's kernels for it
  EXPECT_TRUE(decode_tensor_cores_wanted(s, false));
  s = state(32, 8, 1);
  s.pos_encoding = 2;  // ALiBi inside attention: the decode kernel's variant
  EXPECT_FALSE(decode_tensor_cores_wanted(s, false));
  // The FA2 kernel's 16-row block holds up to 16 packed rows at head dims up to 192, plain or
  // soft-capped; at 256 4 to 16 rows would take a 64-row block: the CUDA-core kernel keeps them.
  for (int64_t d : {64, 128, 192, 256}) {
    s = state(32, 8, 1);
    s.head_dim_qk = s.head_dim_vo = d;
    EXPECT_EQ(decode_tensor_cores_wanted(s, false), d <= 192) << d;
    s.logits_soft_cap = 30.0;
    EXPECT_EQ(decode_tensor_cores_wanted(s, false), d <= 192) << d;
    s = state(64, 2, 1);  // 32 packed rows: a 64-row block (or the Hopper kernel's) at any dim
    s.head_dim_qk = s.head_dim_vo = d;
    EXPECT_TRUE(decode_tensor_cores_wanted(s, false)) << d;
  }
  s = state(32, 8, 1);
  s.use_tensor_cores = true;  // already there: nothing to decide
  EXPECT_FALSE(decode_tensor_cores_wanted(s, false));
  s = state(32, 8, 1);
  s.decode = false;  // prefill is on tensor cores anyway
  EXPECT_FALSE(decode_tensor_cores_wanted(s, false));
  // The planned path: decode_tensor_cores_auto is false off a GPU, so a CPU wrapper's plain
  // decode stays the CUDA-core form of the reference.
  s = state(32, 8, 1);
  s.device = Device::cpu();
  EXPECT_FALSE(api::decode_tensor_cores_auto(s));
  EXPECT_FALSE(detail::tensor_core_path(s));
  s.tensor_cores_auto = true;
  EXPECT_TRUE(detail::tensor_core_path(s));
}

// Tensor-core prefill chunks in whole K/V tiles: pages of 16 to tiles of 128 keys (8 pages),
// tokens to 64-key tiles; page sizes that do not divide the tile, and no split, stay as planned.
// A plan's device arrays (api::refill_plan_array), on the CPU device: the host array in front,
// room past it for what each run writes (`need`: the page ids read at run), in place when large
// enough (a captured graph holds the address), and under use_cuda_graph never moved: a plan that
// needs more is refused naming the argument. The copy once took `need` elements of the shorter
// host array, which refused every CUDA plan that reads its page ids at run (the arrays are built
// on CUDA only, so no CPU test reached it; a review found it in session 79).
TEST(PlanArrays, RefilledInPlaceWithRoomForWhatEachRunWrites) {
  const Tensor host = Tensor::from_vector({1, 2, 3, 4, 5}, {5}, DType::kInt32);
  Tensor dev;
  api::refill_plan_array(dev, host, Device::cpu(), false, "op", "indices", 8, 12);
  ASSERT_EQ(dev.numel(), 12);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(dev.data<int32_t>()[i], i + 1);
  dev.data<int32_t>()[10] = 77;  // a run's ids
  const void* before = dev.data_ptr();
  const Tensor host2 = Tensor::from_vector({9, 8, 7}, {3}, DType::kInt32);
  api::refill_plan_array(dev, host2, Device::cpu(), true, "op", "indices", 0, 11);
  EXPECT_EQ(dev.data_ptr(), before) << "moved: a captured graph would read the old array";
  EXPECT_EQ(dev.data<int32_t>()[0], 9);
  EXPECT_EQ(dev.data<int32_t>()[2], 7);
  EXPECT_EQ(dev.data<int32_t>()[3], 4);    // past the host array: left as it was
  EXPECT_EQ(dev.data<int32_t>()[10], 77);  // the room: the run's to fill
  EXPECT_FI_ERROR(
      api::refill_plan_array(dev, host2, Device::cpu(), true,
                             "BatchDecodeWithPagedKVCacheWrapper.plan", "paged_kv_indices", 0, 13),
      "BatchDecodeWithPagedKVCacheWrapper.plan", "paged_kv_indices");
  EXPECT_EQ(dev.data_ptr(), before);
  api::refill_plan_array(dev, host2, Device::cpu(), false, "op", "indices", 0, 13);  // eagerly
  EXPECT_EQ(dev.numel(), 13);
  EXPECT_EQ(dev.data<int32_t>()[1], 8);
  // Without room: just the host array.
  Tensor fresh;
  api::refill_plan_array(fresh, host, Device::cpu(), false, "op", "indices");
  EXPECT_EQ(fresh.numel(), 5);
}

TEST(PlanKvChunk, RoundedUpToWholeTiles) {
  using api::round_kv_chunk_to_tiles;
  EXPECT_EQ(round_kv_chunk_to_tiles(13, 16, 128), 16);  // 208 tokens -> 256
  EXPECT_EQ(round_kv_chunk_to_tiles(8, 16, 128), 8);    // already 128 tokens
  EXPECT_EQ(round_kv_chunk_to_tiles(17, 16, 128), 24);
  EXPECT_EQ(round_kv_chunk_to_tiles(200, 1, 64), 256);  // ragged: tokens
  EXPECT_EQ(round_kv_chunk_to_tiles(200, 1, 128), 256);
  EXPECT_EQ(round_kv_chunk_to_tiles(3, 64, 128), 4);   // pages of 64: two a tile
  EXPECT_EQ(round_kv_chunk_to_tiles(3, 256, 128), 3);  // a page holds whole tiles already
  EXPECT_EQ(round_kv_chunk_to_tiles(7, 5, 128), 7);    // page 5 does not divide 128
  EXPECT_EQ(round_kv_chunk_to_tiles(0, 16, 128), 0);   // no split
  EXPECT_EQ(round_kv_chunk_to_tiles(13, 16, 0), 13);   // no tile: the CUDA-core kernel
}

TEST(PlanKvChunk, TableOfShapes) {
  using api::plan_kv_chunk;
  // Headline: batch 64, kv 2048 (128 pages of 16), 8 KV heads, max_grid 924. 512 blocks do not
  // fill it, but no chunk helps: budget 924 / 8 = 115 work items < 2 x 64. No split.
  EXPECT_EQ(plan_kv_chunk(rep(64, 1), rep(64, 128), 8, 924, 8), 0);
  // batch 1 x kv 32768 (2048 pages): smallest c with ceil(2048 / c) <= 115 is 18 (114 items;
  // c = 17 gives 121).
  EXPECT_EQ(plan_kv_chunk(rep(1, 1), rep(1, 2048), 8, 924, 8), 18);
  // batch 16 x 128 pages: 16 x ceil(128 / c) <= 115 -> ceil(128 / c) <= 7 -> c = 19 (112 items).
  EXPECT_EQ(plan_kv_chunk(rep(16, 1), rep(16, 128), 8, 924, 8), 19);
  // batch 256 already fills the grid (256 x 8 = 2048 >= 924): no split.
  EXPECT_EQ(plan_kv_chunk(rep(256, 1), rep(256, 128), 8, 924, 8), 0);
  // 32 KV heads, batch 1, kv 8192 (512 pages): budget 924 / 32 = 28 -> c = ceil(512 / 28) = 19
  // (27 items; c = 18 gives 29).
  EXPECT_EQ(plan_kv_chunk(rep(1, 1), rep(1, 512), 32, 924, 8), 19);
  // The lower bound holds: 128 tokens of page 16 = 8 pages, even when a smaller chunk would
  // fit: batch 1 x 20 pages, budget 100: chunk 8 (3 items).
  EXPECT_EQ(plan_kv_chunk(rep(1, 1), rep(1, 20), 1, 100, 8), 8);
  // Too short to split at the lower bound: no split.
  EXPECT_EQ(plan_kv_chunk(rep(1, 1), rep(1, 8), 1, 100, 8), 0);
  // Uneven requests (ragged, units are tokens, lower bound 128): lengths 5000 and 100, 2 heads,
  // max_grid 40 -> budget 20: ceil(5000 / c) + 1 <= 20 -> c = ceil(5000 / 19) = 264.
  EXPECT_EQ(plan_kv_chunk(rep(2, 1), {5000, 100}, 2, 40, 128), 264);
  // The CUDA-core decode kernel on a GPU: chunks of 32 tokens at least (2 pages of 16), with the
  // two-row headline block's max_grid on an H200 (10 x 132 = 1320; budget 1320 / 8 = 165).
  ASSERT_EQ(api::kCudaCoreDecodeMinChunkTokens, 32);
  // batch 1 x kv 512 (32 pages): the bound binds: 16 chunks of 2 pages (128 blocks) where 128
  // tokens gave 4 (32 blocks on 132 SMs).
  EXPECT_EQ(plan_kv_chunk(rep(1, 1), rep(1, 32), 8, 1320, 2), 2);
  EXPECT_EQ(plan_kv_chunk(rep(1, 1), rep(1, 32), 8, 1320, 8), 8);
  // batch 1 x kv 8192 (512 pages): ceil(512 / c) <= 165 -> c = 4 (128 items; c = 3 gives 171).
  EXPECT_EQ(plan_kv_chunk(rep(1, 1), rep(1, 512), 8, 1320, 2), 4);
  // batch 1 x kv 32768 (2048 pages): the budget sets the chunk, the bound does not:
  // ceil(2048 / c) <= 165 -> c = 13 (158 items) either way.
  EXPECT_EQ(plan_kv_chunk(rep(1, 1), rep(1, 2048), 8, 1320, 2), 13);
  EXPECT_EQ(plan_kv_chunk(rep(1, 1), rep(1, 2048), 8, 1320, 8), 13);
  // batch 64 x kv 512 (32 pages): 64 x ceil(32 / c) <= 165 -> c = 16 (2 chunks) either way.
  EXPECT_EQ(plan_kv_chunk(rep(64, 1), rep(64, 32), 8, 1320, 2), 16);
}

// The one-shot work items (trtllm_ragged_attention_deepseek, trtllm_fmha_v2_prefill on CUDA)
// without a split (max_grid 0): tiles of max(1, cta_tile_q / group) queries, each against all of
// its request's keys.
std::vector<kernels::WorkItem> full_kv(const std::vector<int32_t>& qo, const int32_t* kv,
                                       int32_t batch, int32_t group, int32_t dvo,
                                       int32_t& max_rows) {
  const kernels::AttentionPlan plan =
      api::one_shot_plan(qo.data(), kv, batch, group, 1, dvo, dvo, 0, 0, max_rows);
  EXPECT_FALSE(plan.split_kv);
  EXPECT_EQ(plan.num_partial_rows, 0);
  EXPECT_TRUE(plan.merge_out_row.empty());
  return plan.work;
}

void expect_items(const std::vector<kernels::WorkItem>& got,
                  const std::vector<kernels::WorkItem>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(got[i].request, want[i].request);
    EXPECT_EQ(got[i].qo_begin, want[i].qo_begin);
    EXPECT_EQ(got[i].qo_end, want[i].qo_end);
    EXPECT_EQ(got[i].kv_begin, want[i].kv_begin);
    EXPECT_EQ(got[i].kv_end, want[i].kv_end);
    EXPECT_EQ(got[i].partial_base, want[i].partial_base);
  }
}

TEST(OneShotPlan, FullKvTilesByHand) {
  int32_t max_rows = -1;
  {  // MHA, 429 queries over 2 requests: 214.5 packed rows on average > 64 -> 128-query tiles.
    const std::vector<int32_t> qo = {0, 300, 429}, kv = {300, 500};
    expect_items(full_kv(qo, kv.data(), 2, 1, 128, max_rows), {{0, 0, 128, 0, 300, -1},
                                                               {0, 128, 256, 0, 300, -1},
                                                               {0, 256, 300, 0, 300, -1},
                                                               {1, 0, 128, 0, 500, -1},
                                                               {1, 128, 129, 0, 500, -1}});
    EXPECT_EQ(max_rows, 128);
  }
  {  // Head dim 256 caps the block at 64 rows: 64-query tiles.
    const std::vector<int32_t> qo = {0, 130}, kv = {130};
    expect_items(full_kv(qo, kv.data(), 1, 1, 256, max_rows),
                 {{0, 0, 64, 0, 130, -1}, {0, 64, 128, 0, 130, -1}, {0, 128, 130, 0, 130, -1}});
    EXPECT_EQ(max_rows, 64);
  }
  {  // GQA 4, 9 queries over 4 requests: 9 packed rows on average -> 16-row blocks of 4 queries;
     // the empty request gets no item.
    const std::vector<int32_t> qo = {0, 1, 3, 3, 9}, kv = {50, 1, 7, 90};
    expect_items(
        full_kv(qo, kv.data(), 4, 4, 64, max_rows),
        {{0, 0, 1, 0, 50, -1}, {1, 0, 2, 0, 1, -1}, {3, 0, 4, 0, 90, -1}, {3, 4, 6, 0, 90, -1}});
    EXPECT_EQ(max_rows, 4);
  }
  {  // Group 16 (DeepSeek MLA-style heads), 4 queries over 2 requests: 32 packed rows -> 64-row
     // blocks of 4 queries.
    const std::vector<int32_t> qo = {0, 3, 4}, kv = {100, 64};
    expect_items(full_kv(qo, kv.data(), 2, 16, 128, max_rows),
                 {{0, 0, 3, 0, 100, -1}, {1, 0, 1, 0, 64, -1}});
    EXPECT_EQ(max_rows, 3);
  }
  {  // No requests.
    const std::vector<int32_t> qo = {0};
    EXPECT_TRUE(full_kv(qo, nullptr, 0, 1, 128, max_rows).empty());
    EXPECT_EQ(max_rows, 0);
  }
}

// The FA2 kernel starts the plan's last work item first (prefill_grid_slice), which is the
// heaviest-first order only because a request's query tiles come in order: under a causal mask
// (keys visible to the tile's last query: kv_len - qo_len + q1) each item of a request sees at
// least as many keys as the one before it, split or not.
TEST(OneShotPlan, ARequestsItemsComeLightestFirstUnderACausalMask) {
  const std::vector<int32_t> qo = {0, 3000, 3001, 3513, 8000}, kv = {3000, 9000, 600, 4487};
  for (int64_t max_grid : {0, 264, 4096}) {
    int32_t max_rows = 0;
    const kernels::AttentionPlan plan =
        api::one_shot_plan(qo.data(), kv.data(), 4, 4, 8, 128, 128, 0, max_grid, max_rows);
    ASSERT_FALSE(plan.work.empty());
    int32_t prev_request = -1, prev_q1 = 0;
    int64_t prev_end = 0;
    for (const kernels::WorkItem& w : plan.work) {
      ASSERT_GE(w.request, prev_request);  // requests in order, each one's items together
      if (w.request != prev_request) prev_q1 = 0, prev_end = 0;
      prev_request = w.request;
      if (w.kv_begin != 0) continue;  // a later chunk of the tile before: never heavier
      const int64_t qo_len = qo[w.request + 1] - qo[w.request];
      // The tile's visible key range under a causal mask ends after its last query's position.
      const int64_t visible_end =
          std::min<int64_t>(kv[w.request], kv[w.request] - qo_len + w.qo_end);
      EXPECT_GE(w.qo_begin, prev_q1) << "max_grid " << max_grid;
      EXPECT_GE(visible_end, prev_end) << "max_grid " << max_grid;
      prev_q1 = w.qo_end;
      prev_end = visible_end;
    }
  }
}

// The split: the wrappers' chunk (plan_kv_chunk over tokens, at least 128), rounded up to whole
// K/V tiles of the block that runs the items.
TEST(OneShotPlan, SplitsLongKvOfFewQueriesByHand) {
  int32_t max_rows = -1;
  {  // Batch 1 x qo 128 x kv 32768, 16 heads (MHA), D 128, an H100's grid (132 SMs x 2 = 264):
     // one 128-query tile x 16 heads = 16 blocks. Budget 264 / 16 = 16 items -> chunk 2048 (a
     // multiple of the 128-row block's 32-key tile): 16 chunks, 2048 partial rows.
    const std::vector<int32_t> qo = {0, 128}, kv = {32768};
    EXPECT_EQ(api::plan_kv_chunk({1}, {32768}, 16, 264, 128), 2048);
    const kernels::AttentionPlan p =
        api::one_shot_plan(qo.data(), kv.data(), 1, 1, 16, 128, 128, 0, 264, max_rows);
    EXPECT_EQ(max_rows, 128);
    ASSERT_TRUE(p.split_kv);
    EXPECT_EQ(p.kv_chunk_size, 2048);
    std::vector<kernels::WorkItem> want;
    for (int32_t c = 0; c < 16; ++c) want.push_back({0, 0, 128, 2048 * c, 2048 * (c + 1), 128 * c});
    expect_items(p.work, want);
    EXPECT_EQ(p.num_partial_rows, 2048);
    EXPECT_EQ(p.partial_rows_capacity, 2048);
    ASSERT_EQ(p.merge_out_row.size(), 128u);
    ASSERT_EQ(p.merge_indptr.size(), 129u);
    for (int32_t i = 0; i < 128; ++i) {
      EXPECT_EQ(p.merge_out_row[i], i);
      EXPECT_EQ(p.merge_indptr[i], 16 * i);
      for (int32_t c = 0; c < 16; ++c) EXPECT_EQ(p.merge_rows[16 * i + c], 128 * c + i);
    }
    EXPECT_EQ(api::plan_partial_bytes(p, 16, 128), int64_t{2048} * 16 * 129 * 4);
  }
  {  // DeepSeek 192 / 128, batch 1 x qo 16 x kv 10000, 4 heads: 16-row blocks (16 packed rows),
     // whose K/V tile is 4 warps x 16 = 64 keys. Budget 264 / 4 = 66: the planner's chunk is 152
     // (ceil(10000 / 152) = 66; 151 gives 67), rounded up to 192: 53 chunks, the last
     // [9984, 10000).
    const std::vector<int32_t> qo = {0, 16}, kv = {10000};
    EXPECT_EQ(api::plan_kv_chunk({1}, {10000}, 4, 264, 128), 152);
    const kernels::AttentionPlan p =
        api::one_shot_plan(qo.data(), kv.data(), 1, 1, 4, 192, 128, 0, 264, max_rows);
    EXPECT_EQ(max_rows, 16);
    ASSERT_TRUE(p.split_kv);
    EXPECT_EQ(p.kv_chunk_size, 192);
    ASSERT_EQ(p.work.size(), 53u);
    EXPECT_EQ(p.work.back().kv_begin, 9984);
    EXPECT_EQ(p.work.back().kv_end, 10000);
    EXPECT_EQ(p.work.back().partial_base, 52 * 16);
    EXPECT_EQ(p.num_partial_rows, 53 * 16);
  }
  {  // DeepSeek 192 / 128, MHA, batch 1 x qo 200 x kv 20000, 8 heads: two 128-query tiles, which
     // the Hopper kernel's tall blocks take on sm_90 (128-key tiles) and the FA2 kernel's 64-row
     // blocks elsewhere. Budget 264 / 8 = 33 items: 2 x ceil(20000 / c) <= 33 from c = 1250
     // (16 chunks a tile), rounded up to whole 128-key tiles, 1280: still 16 chunks a tile, the
     // last [19200, 20000).
    const std::vector<int32_t> qo = {0, 200}, kv = {20000};
    EXPECT_EQ(api::plan_kv_chunk({2}, {20000}, 8, 264, 128), 1250);
    kernels::AttentionPlan p =
        api::one_shot_plan(qo.data(), kv.data(), 1, 1, 8, 192, 128, 0, 264, max_rows);
    EXPECT_EQ(max_rows, 128);
    ASSERT_TRUE(p.split_kv);
    EXPECT_EQ(p.kv_chunk_size, 1280);  // the FA2 kernel's 64-key tiles
    ASSERT_EQ(p.work.size(), 32u);
    EXPECT_EQ(p.work.back().kv_begin % 1280, 0);
    EXPECT_EQ(p.work.back().kv_end, 20000);
    // With the Hopper kernel's budget (132: one tall block an SM): 2 x ceil(20000 / c) <= 16 from
    // c = 2500, rounded up to its 128-key tiles, 2560: 8 chunks a tile.
    EXPECT_EQ(api::plan_kv_chunk({2}, {20000}, 8, 132, 128), 2500);
    p = api::one_shot_plan(qo.data(), kv.data(), 1, 1, 8, 192, 128, 0, 264, max_rows, 132);
    ASSERT_TRUE(p.split_kv);
    EXPECT_EQ(p.kv_chunk_size, 2560);
    EXPECT_EQ(p.work.size(), 16u);
    // ALiBi (a variant the Hopper kernel does not have): the FA2 kernel's budget and tiles.
    p = api::one_shot_plan(qo.data(), kv.data(), 1, 1, 8, 192, 128,
                           kernels::cuda::prefill::kPrefillAlibi, 264, max_rows, 132);
    EXPECT_EQ(p.kv_chunk_size, 1280);
    EXPECT_EQ(p.work.size(), 32u);
  }
  {  // Chunked prefill of DeepSeek (MHA, 128 heads, 192 / 128): batch 1 x qo 100 x kv 8000, one
     // 100-query tile x 128 heads = 128 blocks. The FA2 kernel's budget (264 = 2 an SM) splits
     // the keys in two; the Hopper kernel's tall blocks (one an SM: 132) are a full wave already.
    const std::vector<int32_t> qo = {0, 100}, kv = {8000};
    EXPECT_TRUE(
        api::one_shot_plan(qo.data(), kv.data(), 1, 1, 128, 192, 128, 0, 264, max_rows).split_kv);
    const kernels::AttentionPlan p =
        api::one_shot_plan(qo.data(), kv.data(), 1, 1, 128, 192, 128, 0, 264, max_rows, 132);
    EXPECT_EQ(max_rows, 100);
    EXPECT_FALSE(p.split_kv);
    EXPECT_EQ(p.work.size(), 1u);
    // Items of 64 packed rows or fewer are not the tall blocks': their budget stays max_grid.
    const std::vector<int32_t> short_qo = {0, 64};
    EXPECT_TRUE(
        api::one_shot_plan(short_qo.data(), kv.data(), 1, 1, 128, 192, 128, 0, 264, max_rows, 132)
            .split_kv);
  }
  {  // A full device: 8 requests x 3 tiles x 16 heads = 384 blocks >= 264: no split.
    const std::vector<int32_t> qo = {0, 300, 600, 900, 1200, 1500, 1800, 2100, 2400};
    const std::vector<int32_t> kv(8, 8192);
    const kernels::AttentionPlan p =
        api::one_shot_plan(qo.data(), kv.data(), 8, 1, 16, 128, 128, 0, 264, max_rows);
    EXPECT_FALSE(p.split_kv);
    EXPECT_EQ(p.work.size(), 24u);
  }
  {  // Keys too few to split at 128 a chunk: no split.
    const std::vector<int32_t> qo = {0, 4}, kv = {128};
    EXPECT_FALSE(
        api::one_shot_plan(qo.data(), kv.data(), 1, 1, 1, 128, 128, 0, 264, max_rows).split_kv);
  }
}

// Over many random batches: every query row of every request lies in exactly one tile; a tile's
// items cover its request's keys [0, kv_len) exactly once, in order, on chunk boundaries that are
// multiples of the K/V tile; split items fit the grid budget; partial rows are disjoint and
// dense; the merge pass lists each split query row once, with its chunks' partial rows in order.
TEST(OneShotPlan, SplitCoversEveryKeyOnceOverRandomBatches) {
  uint64_t state = 12345;
  auto next = [&](int64_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(n));
  };
  namespace pf = kernels::cuda::prefill;
  const int dims[][2] = {{64, 64}, {128, 128}, {256, 256}, {192, 128}};
  int splits = 0;
  for (int t = 0; t < 400; ++t) {
    SCOPED_TRACE(t);
    const auto batch = static_cast<int32_t>(1 + next(4));
    const int32_t groups[] = {1, 2, 4, 8, 16};
    const int32_t group = groups[next(5)];
    const auto hkv = static_cast<int32_t>(1 + next(8));
    const int* d = dims[next(4)];
    const int variant = next(2) == 0 ? 0 : pf::kPrefillSoftCap;
    const int64_t max_grid = 16 + next(600);
    std::vector<int32_t> qo = {0}, kv;
    for (int32_t b = 0; b < batch; ++b) {
      qo.push_back(qo.back() + static_cast<int32_t>(next(4) == 0 ? 0 : 1 + next(300)));
      kv.push_back(static_cast<int32_t>(next(8) == 0 ? next(3) : next(40000)));
    }
    int32_t max_rows = -1;
    const kernels::AttentionPlan p = api::one_shot_plan(qo.data(), kv.data(), batch, group, hkv,
                                                        d[0], d[1], variant, max_grid, max_rows);
    const int32_t kv_tile = pf::prefill_kv_tile(
        pf::prefill_cta_rows(max_rows * group, d[0], d[1], variant), d[0], d[1]);
    std::vector<int64_t> tiles(batch, 0);
    int32_t seen_max = 0;
    std::vector<int32_t> partial_owner(static_cast<std::size_t>(p.num_partial_rows), -1);
    std::size_t m = 0;  // next merge entry
    for (std::size_t i = 0; i < p.work.size();) {
      // The items of one tile are consecutive: same request and rows, keys in order.
      const kernels::WorkItem& w0 = p.work[i];
      ASSERT_GE(w0.request, 0);
      ASSERT_LT(w0.request, batch);
      const int32_t b = w0.request, kv_len = kv[b];
      std::size_t j = i;
      int32_t k = 0;
      std::vector<int32_t> bases;
      for (; j < p.work.size() && p.work[j].request == b && p.work[j].qo_begin == w0.qo_begin;
           ++j) {
        const kernels::WorkItem& w = p.work[j];
        EXPECT_EQ(w.qo_end, w0.qo_end);
        EXPECT_EQ(w.kv_begin, k);  // contiguous: no key twice, none skipped
        EXPECT_GT(w.kv_end, w.kv_begin == 0 && kv_len == 0 ? -1 : w.kv_begin);
        EXPECT_EQ(w.kv_begin % kv_tile, 0);
        k = w.kv_end;
        if (w.partial_base >= 0) {
          bases.push_back(w.partial_base);
          for (int32_t r = 0; r < w.qo_end - w.qo_begin; ++r) {
            ASSERT_LT(w.partial_base + r, p.num_partial_rows);
            EXPECT_EQ(partial_owner[w.partial_base + r], -1);  // disjoint
            partial_owner[w.partial_base + r] = static_cast<int32_t>(j);
          }
        }
      }
      EXPECT_EQ(k, kv_len);  // every key
      const std::size_t n = j - i;
      // A tile is split (all items partial, more than one) or not (one final item).
      EXPECT_EQ(bases.size(), n == 1 ? 0u : n);
      EXPECT_EQ(w0.qo_begin, tiles[b]);  // tiles in order, none skipped
      tiles[b] += w0.qo_end - w0.qo_begin;
      seen_max = std::max(seen_max, w0.qo_end - w0.qo_begin);
      if (n > 1) {
        for (int32_t r = 0; r < w0.qo_end - w0.qo_begin; ++r, ++m) {
          ASSERT_LT(m, p.merge_out_row.size());
          EXPECT_EQ(p.merge_out_row[m], qo[b] + w0.qo_begin + r);
          ASSERT_EQ(p.merge_indptr[m + 1] - p.merge_indptr[m], static_cast<int32_t>(n));
          for (std::size_t c = 0; c < n; ++c) {
            EXPECT_EQ(p.merge_rows[p.merge_indptr[m] + c], bases[c] + r);
          }
        }
      }
      i = j;
    }
    EXPECT_EQ(m, p.merge_out_row.size());
    EXPECT_EQ(p.merge_indptr.size(), p.merge_out_row.size() + 1);
    EXPECT_EQ(static_cast<int64_t>(p.merge_rows.size()), p.num_partial_rows);
    for (int32_t o : partial_owner) EXPECT_GE(o, 0);                             // dense
    for (int32_t b = 0; b < batch; ++b) EXPECT_EQ(tiles[b], qo[b + 1] - qo[b]);  // every query
    EXPECT_EQ(max_rows, seen_max);
    if (p.split_kv) {
      ++splits;
      EXPECT_EQ(p.kv_chunk_size % kv_tile, 0);
      EXPECT_LE(static_cast<int64_t>(p.work.size()), std::max<int64_t>(1, max_grid / hkv));
    }
  }
  EXPECT_GT(splits, 100);  // the property is checked on split plans, not only whole ones
}

}  // namespace
}  // namespace flashinfer
