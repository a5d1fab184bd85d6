// The host-side decisions behind the CUDA decode kernel, checked exactly without a GPU: the block
// shape (src/kernels/cuda/decode_shape.h), the occupancy the planner derives from it
// (kernels/occupancy.h), and the split-KV chunk search (api::plan_kv_chunk). The expected values
// are worked out by hand in the comments.
#include <gtest/gtest.h>

#include <vector>

#include "api/attention_common.h"
#include "kernels/cuda/decode_shape.h"
#include "kernels/occupancy.h"

namespace flashinfer {
namespace {

using kernels::cuda::decode_bdx;
using kernels::cuda::decode_block_shape;
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

TEST(DecodeShape, InvariantsOverEveryConfiguration) {
  for (int kvb : {1, 2}) {
    for (int dqk = 16; dqk <= 256; dqk += 16) {
      for (int dvo : {dqk, 128}) {
        for (int rows = 1; rows <= 160; ++rows) {
          const DecodeBlockShape s = decode_block_shape(dqk, dvo, kvb, rows);
          SCOPED_TRACE(testing::Message()
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
        }
      }
    }
  }
}

TEST(DecodeShape, OccupancyOfTheHeadlineBlockOnHopper) {
  // 128 threads, 70 registers (ptxas, bf16 D128): 70 x 32 = 2240 -> 2304 a warp; 16384 / 2304
  // = 7 warps a sub-partition, 28 an SM = 7 blocks; threads allow 16, shared memory
  // 233472 / (10240 + 1024) = 20. So 7 blocks x 132 SMs = 924 is the planner's max_grid.
  const kernels::DeviceLimits h100 = kernels::device_limits(9, 0);
  const DecodeBlockShape s = decode_block_shape(128, 128, 2, 4);
  EXPECT_EQ(kernels::occupancy_blocks_per_sm(h100, s.threads(), 70, s.smem_bytes), 7);
  // fp8 (94 registers -> 3072 a warp: 5 warps a sub-partition, 20 an SM).
  const DecodeBlockShape f = decode_block_shape(128, 128, 1, 4);
  EXPECT_EQ(kernels::occupancy_blocks_per_sm(h100, f.threads(), 94, f.smem_bytes), 5);
}

std::vector<int64_t> rep(std::size_t n, int64_t v) { return std::vector<int64_t>(n, v); }

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
}

// The one-shot work items (trtllm_ragged_attention_deepseek, trtllm_fmha_v2_prefill on CUDA):
// tiles of max(1, cta_tile_q / group) queries, each against all of its request's keys.
TEST(FullKvWorkItems, TilesByHand) {
  using W = kernels::WorkItem;
  auto same = [](const std::vector<W>& got, const std::vector<W>& want) {
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
  };
  int32_t max_rows = -1;
  {  // MHA, 429 queries over 2 requests: 214.5 packed rows on average > 64 -> 128-query tiles.
    const std::vector<int32_t> qo = {0, 300, 429}, kv = {300, 500};
    same(api::full_kv_work_items(qo.data(), kv.data(), 2, 1, 128, max_rows),
         {{0, 0, 128, 0, 300, -1},
          {0, 128, 256, 0, 300, -1},
          {0, 256, 300, 0, 300, -1},
          {1, 0, 128, 0, 500, -1},
          {1, 128, 129, 0, 500, -1}});
    EXPECT_EQ(max_rows, 128);
  }
  {  // Head dim 256 caps the block at 64 rows: 64-query tiles.
    const std::vector<int32_t> qo = {0, 130}, kv = {130};
    same(api::full_kv_work_items(qo.data(), kv.data(), 1, 1, 256, max_rows),
         {{0, 0, 64, 0, 130, -1}, {0, 64, 128, 0, 130, -1}, {0, 128, 130, 0, 130, -1}});
    EXPECT_EQ(max_rows, 64);
  }
  {  // GQA 4, 9 queries over 4 requests: 9 packed rows on average -> 16-row blocks of 4 queries;
     // the empty request gets no item.
    const std::vector<int32_t> qo = {0, 1, 3, 3, 9}, kv = {50, 1, 7, 90};
    same(api::full_kv_work_items(qo.data(), kv.data(), 4, 4, 64, max_rows),
         {{0, 0, 1, 0, 50, -1}, {1, 0, 2, 0, 1, -1}, {3, 0, 4, 0, 90, -1}, {3, 4, 6, 0, 90, -1}});
    EXPECT_EQ(max_rows, 4);
  }
  {  // Group 16 (DeepSeek MLA-style heads), 4 queries over 2 requests: 32 packed rows -> 64-row
     // blocks of 4 queries.
    const std::vector<int32_t> qo = {0, 3, 4}, kv = {100, 64};
    same(api::full_kv_work_items(qo.data(), kv.data(), 2, 16, 128, max_rows),
         {{0, 0, 3, 0, 100, -1}, {1, 0, 1, 0, 64, -1}});
    EXPECT_EQ(max_rows, 3);
  }
  {  // No requests.
    const std::vector<int32_t> qo = {0};
    EXPECT_TRUE(api::full_kv_work_items(qo.data(), nullptr, 0, 1, 128, max_rows).empty());
    EXPECT_EQ(max_rows, 0);
  }
}

}  // namespace
}  // namespace flashinfer
