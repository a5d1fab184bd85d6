// Host checks of the fused MoE's grouped route (src/kernels/cuda/moe_grouped_plan.h): the
// device permutation emulated pass by pass with the kernels' own helpers against a stable sort,
// the route choice, and the scratch layouts. Plain integer code shared with the kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cuda/moe_grouped_plan.h"

namespace {

using namespace flashinfer::kernels::cuda::moe;

struct Perm {
  std::vector<int32_t> indptr, perm;
};

// The counting, offsets and scatter kernels (moe_cuda.cu) in order, chunk by chunk, each
// "thread" calling the helper its kernel calls.
Perm permute_as_device(const std::vector<int32_t>& local, int64_t E) {
  const int64_t pairs = static_cast<int64_t>(local.size()), chunks = moe_perm_chunks(pairs);
  std::vector<int32_t> counts(static_cast<size_t>(chunks * E), -7);  // garbage: all overwritten
  auto chunk_experts = [&](int64_t c, int32_t* le) {
    const int64_t c0 = c * kMoePermChunk;
    const int n = static_cast<int>(std::min<int64_t>(kMoePermChunk, pairs - c0));
    for (int i = 0; i < kMoePermChunk; ++i) le[i] = i < n ? local[static_cast<size_t>(c0 + i)] : -1;
    return n;
  };
  for (int64_t c = 0; c < chunks; ++c) {
    int32_t le[kMoePermChunk];
    const int n = chunk_experts(c, le);
    for (int64_t e = 0; e < E; ++e) {
      counts[static_cast<size_t>(c * E + e)] = moe_chunk_count(le, n, static_cast<int32_t>(e));
    }
  }
  Perm r;
  r.indptr.assign(static_cast<size_t>(E + 1), -9);
  for (int64_t e = 0; e < E; ++e) {
    r.indptr[static_cast<size_t>(e + 1)] = moe_expert_total(counts.data(), chunks, E, e);
  }
  r.indptr[0] = 0;
  for (int64_t e = 0; e < E; ++e) {
    r.indptr[static_cast<size_t>(e + 1)] += r.indptr[static_cast<size_t>(e)];
  }
  for (int64_t e = 0; e < E; ++e) {
    moe_expert_offsets(counts.data(), chunks, E, e, r.indptr[static_cast<size_t>(e)]);
  }
  r.perm.assign(static_cast<size_t>(pairs), -5);
  for (int64_t c = 0; c < chunks; ++c) {
    int32_t le[kMoePermChunk];
    const int n = chunk_experts(c, le);
    for (int i = 0; i < n; ++i) {
      r.perm[static_cast<size_t>(c * kMoePermChunk + i)] =
          le[i] < 0 ? -1 : counts[static_cast<size_t>(c * E + le[i])] + moe_rank_in_chunk(le, i);
    }
  }
  return r;
}

// The oracle: the local pairs stably sorted by expert.
Perm permute_by_sort(const std::vector<int32_t>& local, int64_t E) {
  std::vector<int64_t> order;
  for (size_t i = 0; i < local.size(); ++i) {
    if (local[i] >= 0) order.push_back(static_cast<int64_t>(i));
  }
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return local[static_cast<size_t>(a)] < local[static_cast<size_t>(b)];
  });
  Perm r;
  r.perm.assign(local.size(), -1);
  for (size_t row = 0; row < order.size(); ++row) {
    r.perm[static_cast<size_t>(order[row])] = static_cast<int32_t>(row);
  }
  r.indptr.assign(static_cast<size_t>(E + 1), 0);
  for (int32_t e : local) {
    if (e >= 0) ++r.indptr[static_cast<size_t>(e + 1)];
  }
  std::partial_sum(r.indptr.begin(), r.indptr.end(), r.indptr.begin());
  return r;
}

TEST(MoeGroupedPlan, PermutationIsTheStableSortByExpert) {
  std::mt19937 rng(7);
  // Sizes around the chunk boundaries; skewed and uniform expert choices; non-local pairs.
  for (int64_t pairs : {1, 2, 255, 256, 257, 511, 512, 1000, 2049}) {
    for (int64_t E : {1, 3, 8, 64}) {
      for (int mode = 0; mode < 3; ++mode) {
        std::vector<int32_t> local(static_cast<size_t>(pairs));
        for (auto& v : local) {
          const int32_t r = static_cast<int32_t>(rng() % static_cast<uint32_t>(E + 1)) - 1;
          v = mode == 0 ? r : mode == 1 ? (rng() % 4 == 0 ? r : 0) : static_cast<int32_t>(E - 1);
        }
        const Perm got = permute_as_device(local, E), want = permute_by_sort(local, E);
        EXPECT_EQ(got.indptr, want.indptr) << pairs << " pairs, " << E << " experts, mode " << mode;
        EXPECT_EQ(got.perm, want.perm) << pairs << " pairs, " << E << " experts, mode " << mode;
      }
    }
  }
}

TEST(MoeGroupedPlan, PermutationGolden) {
  // Pairs 0..5 with experts 2, 0, 2, -1, 0, 1: expert 0 holds pairs 1, 4 (rows 0, 1), expert 1
  // pair 5 (row 2), expert 2 pairs 0, 2 (rows 3, 4); pair 3 has no local expert.
  const Perm p = permute_as_device({2, 0, 2, -1, 0, 1}, 3);
  EXPECT_EQ(p.indptr, (std::vector<int32_t>{0, 2, 3, 5}));
  EXPECT_EQ(p.perm, (std::vector<int32_t>{3, 0, 4, -1, 1, 2}));
}

MoeRouteQuery query(int64_t pairs, int64_t E) {
  MoeRouteQuery q;
  q.pairs = pairs;
  q.local_experts = E;
  q.hidden = 4096;
  q.inter = 1024;
  q.gemm1_n = 2048;
  q.elem_bytes = 2;
  q.w1 = 0x10000;
  q.w2 = 0x20000;
  q.sm_major = 9;
  return q;
}

TEST(MoeGroupedPlan, RouteChoice) {
  // Worthwhile from two pairs per local expert on.
  EXPECT_FALSE(moe_grouped_worthwhile(0, 1));
  EXPECT_FALSE(moe_grouped_worthwhile(1, 1));
  EXPECT_TRUE(moe_grouped_worthwhile(2, 1));
  EXPECT_FALSE(moe_grouped_worthwhile(127, 64));
  EXPECT_TRUE(moe_grouped_worthwhile(128, 64));
  // Expert parallelism: 8 ranks of 32 experts, about pairs / 8 local.
  EXPECT_FALSE(moe_grouped_worthwhile(511, 32, 8));
  EXPECT_TRUE(moe_grouped_worthwhile(512, 32, 8));
  EXPECT_TRUE(moe_grouped_worthwhile(64, 32, 1));
  {
    MoeRouteQuery q = query(256, 32);
    q.ep_size = 8;
    EXPECT_FALSE(moe_use_grouped(q, 0));
    q.ep_size = 4;
    EXPECT_TRUE(moe_use_grouped(q, 0));
  }
  EXPECT_FALSE(moe_use_grouped(query(127, 64), 0));
  EXPECT_TRUE(moe_use_grouped(query(128, 64), 0));
  // Forced: the GEMV kernels always; the grouped route where eligible, however few pairs.
  EXPECT_FALSE(moe_use_grouped(query(4096, 64), 1));
  EXPECT_TRUE(moe_use_grouped(query(1, 64), 2));
  // Not eligible: fp32 input, pre-sm80, misaligned weights or rows, empty.
  MoeRouteQuery q = query(4096, 8);
  EXPECT_TRUE(moe_grouped_eligible(q));
  q.elem_bytes = 4;
  EXPECT_FALSE(moe_use_grouped(q, 2));
  q = query(4096, 8);
  q.sm_major = 7;
  EXPECT_FALSE(moe_use_grouped(q, 2));
  q = query(4096, 8);
  q.w1 += 8;
  EXPECT_FALSE(moe_grouped_eligible(q));
  q = query(4096, 8);
  q.w2 += 2;
  EXPECT_FALSE(moe_grouped_eligible(q));
  q = query(4096, 8);
  q.hidden = 4100;  // rows of 8200 bytes
  EXPECT_FALSE(moe_grouped_eligible(q));
  q = query(4096, 8);
  q.inter = 12;  // w2 rows of 24 bytes
  q.gemm1_n = 24;
  EXPECT_FALSE(moe_grouped_eligible(q));
  q.inter = 16;
  q.gemm1_n = 32;
  EXPECT_TRUE(moe_grouped_eligible(q));
  EXPECT_FALSE(moe_grouped_eligible(query(0, 8)));
  EXPECT_FALSE(moe_grouped_eligible(query(int64_t{1} << 31, 8)));
  // e4m3 (cutlass_fused_moe's FP8 per tensor, one byte): rows of 16 bytes need hidden and inter
  // multiples of 16, not 8.
  q = query(4096, 8);
  q.elem_bytes = 1;
  EXPECT_TRUE(moe_use_grouped(q, 0));
  q.inter = 24;  // w2 rows of 24 bytes (48 in bf16: eligible there)
  q.gemm1_n = 48;
  EXPECT_FALSE(moe_grouped_eligible(q));
  q.elem_bytes = 2;
  EXPECT_TRUE(moe_grouped_eligible(q));
  q = query(4096, 8);
  q.elem_bytes = 1;
  q.hidden = 4104;  // w1 rows of 4104 bytes
  EXPECT_FALSE(moe_grouped_eligible(q));
  q.w1 = 0x10008;  // misaligned base
  q.hidden = 4096;
  EXPECT_FALSE(moe_grouped_eligible(q));
}

TEST(MoeGroupedPlan, ScratchLayout) {
  // 300 pairs (2 chunks), 8 experts, hidden 64, inter 32, gated (gemm1_n 64), bf16 in, fp32 out.
  const MoeGroupedScratch s = moe_grouped_scratch(300, 8, 64, 32, 64, 2, 4);
  EXPECT_EQ(s.counts, 0u);
  EXPECT_EQ(s.indptr, 256u);         // 2 * 8 int32 = 64 bytes
  EXPECT_EQ(s.perm, 512u);           // 9 int32
  EXPECT_EQ(s.xs, 512u + 1280u);     // 300 int32 = 1200 bytes
  EXPECT_EQ(s.g1, s.xs + 38400u);    // 300 * 64 * 2
  EXPECT_EQ(s.h, s.g1 + 38400u);     // 300 * 64 * 2
  EXPECT_EQ(s.y, s.h + 19200u);      // 300 * 32 * 2
  EXPECT_EQ(s.bytes, s.y + 76800u);  // 300 * 64 * 4
  for (uint64_t off : {s.indptr, s.perm, s.xs, s.g1, s.h, s.y, s.bytes}) EXPECT_EQ(off % 256, 0u);
  const MoeGemvScratch g = moe_gemv_scratch(3, 24, 8, 16);
  EXPECT_EQ(g.g1, 0u);
  EXPECT_EQ(g.h, 256u);             // 3 * 16 floats = 192 bytes
  EXPECT_EQ(g.y, 512u);             // 3 * 8 floats = 96 bytes
  EXPECT_EQ(g.bytes, 512u + 512u);  // 3 * 24 floats = 288 bytes
}

// The DeepSeek block-scale grouped route's scratch: the grouped pieces with e4m3 xs / h and bf16
// g1 / y, then the 1x128 scales of xs and h, every piece 256-byte aligned and disjoint.
TEST(MoeGroupedPlan, BlockScaleScratchLayout) {
  // 48 pairs, 8 experts, hidden 7168 (56 blocks), inter 2048 (16 blocks), gated (gemm1_n 4096).
  const auto s = moe_block_scale_scratch(48, 8, 7168, 2048, 4096);
  const auto b = moe_grouped_scratch(48, 8, 7168, 2048, 4096, 1, 2, 2);
  EXPECT_EQ(s.base.xs, b.xs);
  EXPECT_EQ(s.base.g1 - s.base.xs, moe_align256(48 * 7168));        // e4m3 rows
  EXPECT_EQ(s.base.h - s.base.g1, moe_align256(48 * 4096 * 2));     // bf16 GEMM1 rows
  EXPECT_EQ(s.base.y - s.base.h, moe_align256(48 * 2048));          // e4m3 activations
  EXPECT_EQ(s.base.bytes - s.base.y, moe_align256(48 * 7168 * 2));  // bf16 GEMM2 rows
  EXPECT_EQ(s.x_scales, s.base.bytes);
  EXPECT_EQ(s.h_scales - s.x_scales, moe_align256(48 * 56 * 4));
  EXPECT_EQ(s.bytes - s.h_scales, moe_align256(48 * 16 * 4));
  for (uint64_t at : {s.x_scales, s.h_scales, s.bytes}) EXPECT_EQ(at % 256, 0u);
  // A hidden size not a multiple of 128: its last block counts (ceil).
  const auto t = moe_block_scale_scratch(3, 2, 200, 160, 160);
  EXPECT_EQ(t.h_scales - t.x_scales, moe_align256(3 * 2 * 4));
  EXPECT_EQ(t.bytes - t.h_scales, moe_align256(3 * 2 * 4));
}

// cutlass_fused_moe's FP8 GEMV route: the GEMV pieces first; the block-scale path adds the
// tokens' 1x128-quantized rows and scales (partial last blocks: ceil division) and the
// activation's scales, each 256-byte aligned; the per-tensor path adds nothing.
TEST(MoeGroupedPlan, Fp8GemvScratchLayout) {
  // 5 tokens, 7 pairs, hidden 200 (2 blocks), inter 160 (2 blocks), gated (gemm1_n 320).
  const MoeFp8GemvScratch b = moe_fp8_gemv_scratch(5, 7, 200, 160, 320, true);
  const MoeGemvScratch g = moe_gemv_scratch(7, 200, 160, 320);
  EXPECT_EQ(b.gemv.g1, g.g1);
  EXPECT_EQ(b.gemv.h, g.h);
  EXPECT_EQ(b.gemv.y, g.y);
  EXPECT_EQ(g.h, 8960u);            // 7 * 320 floats = 8960 bytes
  EXPECT_EQ(g.y, 8960u + 4608u);    // 7 * 160 floats = 4480 bytes
  EXPECT_EQ(g.bytes, g.y + 5632u);  // 7 * 200 floats = 5600 bytes
  EXPECT_EQ(b.xq, g.bytes);
  EXPECT_EQ(b.xs, b.xq + 4096u);    // 5 * 200 floats = 4000 bytes
  EXPECT_EQ(b.hs, b.xs + 256u);     // 5 * 2 floats
  EXPECT_EQ(b.bytes, b.hs + 256u);  // 7 * 2 floats
  for (uint64_t off : {b.xq, b.xs, b.hs, b.bytes}) EXPECT_EQ(off % 256, 0u);
  const MoeFp8GemvScratch t = moe_fp8_gemv_scratch(5, 7, 200, 160, 320, false);
  EXPECT_EQ(t.bytes, g.bytes);
  EXPECT_EQ(t.xq, g.bytes);
  EXPECT_EQ(t.hs, g.bytes);
  // One more inter column starts a third block: hs grows by one float per pair.
  EXPECT_EQ(moe_fp8_gemv_scratch(1, 100, 128, 257, 257, true).bytes -
                moe_fp8_gemv_scratch(1, 100, 128, 257, 257, true).hs,
            1280u);  // 100 * 3 floats = 1200 bytes
}

// cutlass_fused_moe's W4A16 tiled route: every local pair lands in exactly one tile, the tile of
// its expert, in row order, no tile holds more than kMoeW4a16Tile pairs or none, and the grid
// bound covers every tile. Block by block as the kernels do (moe_tile_offsets once, then
// moe_tile_expert per block), over the permutation the device builds.
TEST(MoeGroupedPlan, W4a16TilesCoverEveryPairOnce) {
  std::mt19937 rng(11);
  constexpr int kT = kMoeW4a16Tile;
  for (int64_t pairs : {1, 7, 8, 9, 64, 300, 2049}) {
    for (int64_t E : {1, 2, 5, 64}) {
      for (int mode = 0; mode < 3; ++mode) {
        std::vector<int32_t> local(static_cast<size_t>(pairs));
        for (auto& v : local) {
          const int32_t r = static_cast<int32_t>(rng() % static_cast<uint32_t>(E + 1)) - 1;
          v = mode == 0 ? r : mode == 1 ? (rng() % 4 == 0 ? r : 0) : static_cast<int32_t>(E - 1);
        }
        const Perm p = permute_as_device(local, E);
        std::vector<int32_t> row_pair(static_cast<size_t>(pairs), -1),
            tile_off(static_cast<size_t>(E + 1), -3);
        for (int64_t i = 0; i < pairs; ++i) {
          const int32_t row = p.perm[static_cast<size_t>(i)];
          if (row >= 0) row_pair[static_cast<size_t>(row)] = static_cast<int32_t>(i);
        }
        moe_tile_offsets(p.indptr.data(), E, kT, tile_off.data());
        const int64_t grid = moe_tile_grid(pairs, E, kT);
        ASSERT_LE(tile_off[static_cast<size_t>(E)], grid) << pairs << " pairs, " << E << " experts";
        std::vector<int> seen(static_cast<size_t>(pairs), 0);
        for (int64_t b = 0; b < tile_off[static_cast<size_t>(E)]; ++b) {
          const int64_t e = moe_tile_expert(tile_off.data(), E, b);
          ASSERT_TRUE(e >= 0 && e < E);
          ASSERT_LE(tile_off[static_cast<size_t>(e)], b);
          ASSERT_LT(b, tile_off[static_cast<size_t>(e + 1)]);
          const int64_t r0 =
              p.indptr[static_cast<size_t>(e)] + (b - tile_off[static_cast<size_t>(e)]) * kT;
          const int64_t n = std::min<int64_t>(kT, p.indptr[static_cast<size_t>(e + 1)] - r0);
          ASSERT_GT(n, 0);
          for (int64_t i = 0; i < n; ++i) {
            const int32_t pair = row_pair[static_cast<size_t>(r0 + i)];
            ASSERT_GE(pair, 0);
            EXPECT_EQ(local[static_cast<size_t>(pair)], e);
            ++seen[static_cast<size_t>(pair)];
          }
        }
        for (int64_t i = 0; i < pairs; ++i) {
          EXPECT_EQ(seen[static_cast<size_t>(i)], local[static_cast<size_t>(i)] >= 0 ? 1 : 0)
              << "pair " << i << ", " << pairs << " pairs, " << E << " experts, mode " << mode;
        }
      }
    }
  }
  // Golden: experts with 0, 9, 0, 8, 1 pairs: tiles 0 | 2 | 0 | 1 | 1; block 2 is expert 3's
  // (expert 2 has none), block 3 expert 4's.
  const std::vector<int32_t> indptr = {0, 0, 9, 9, 17, 18};
  std::vector<int32_t> off(6);
  moe_tile_offsets(indptr.data(), 5, kT, off.data());
  EXPECT_EQ(off, (std::vector<int32_t>{0, 0, 2, 2, 3, 4}));
  EXPECT_EQ(moe_tile_expert(off.data(), 5, 0), 1);
  EXPECT_EQ(moe_tile_expert(off.data(), 5, 1), 1);
  EXPECT_EQ(moe_tile_expert(off.data(), 5, 2), 3);
  EXPECT_EQ(moe_tile_expert(off.data(), 5, 3), 4);
}

TEST(MoeGroupedPlan, W4a16ScratchLayout) {
  // 5 tokens, 7 pairs, 3 experts, hidden 256, inter 128, gated: the per-pair W4A16 route is the
  // GEMV scratch.
  const MoeGemvScratch g = moe_gemv_scratch(7, 256, 128, 256);
  const MoeW4a16Scratch a = moe_w4a16_scratch(5, 7, 3, 256, 128, 256, false, false);
  EXPECT_EQ(a.bytes, g.bytes);
  const MoeW4a16Scratch t = moe_w4a16_scratch(5, 7, 3, 256, 128, 256, true, false);
  EXPECT_EQ(t.gemv.y, g.y);
  EXPECT_EQ(t.counts, g.bytes);
  EXPECT_EQ(t.indptr, t.counts + 256u);  // 1 chunk x 3 experts
  EXPECT_EQ(t.perm, t.indptr + 256u);    // 4 entries
  EXPECT_EQ(t.row_pair, t.perm + 256u);  // 7 entries
  EXPECT_EQ(t.tile_off, t.row_pair + 256u);
  EXPECT_EQ(t.bytes, t.tile_off + 256u);
  EXPECT_EQ(moe_w4a16_scratch(1, 600, 3, 256, 128, 256, true, false).indptr -
                moe_w4a16_scratch(1, 600, 3, 256, 128, 256, true, false).counts,
            256u);  // 3 chunks x 3 experts
  // Humming adds xq (5 x 256 floats = 5120 bytes), x_dq (5 floats) and h_dq (7 floats).
  for (bool tiled : {false, true}) {
    const MoeW4a16Scratch h = moe_w4a16_scratch(5, 7, 3, 256, 128, 256, tiled, true);
    const uint64_t end = tiled ? t.bytes : g.bytes;
    EXPECT_EQ(h.xq, end);
    EXPECT_EQ(h.x_dq, h.xq + 5120u);
    EXPECT_EQ(h.h_dq, h.x_dq + 256u);
    EXPECT_EQ(h.bytes, h.h_dq + 256u);
    for (uint64_t off : {h.xq, h.x_dq, h.h_dq, h.bytes}) EXPECT_EQ(off % 256, 0u);
  }
}

// trtllm_bf16_moe: the grouped route reads MajorK weights only (BlockMajorK keeps the GEMV
// route, forced or not); shuffled rows are fine. Its threshold counts the pairs routed to every
// expert: 8 experts of which 4 local need 2 * 4 * 2 = 16 pairs.
TEST(MoeGroupedPlan, TrtllmRouteChoice) {
  using flashinfer::kernels::MoeWeightIndex;
  MoeWeightIndex plain, shuffled, block;
  shuffled.shuffled = true;
  shuffled.gated_interleave = true;
  block.shuffled = true;
  block.block_k = 64;
  EXPECT_TRUE(moe_trtllm_grouped_layout(plain, plain));
  EXPECT_TRUE(moe_trtllm_grouped_layout(shuffled, plain));
  EXPECT_FALSE(moe_trtllm_grouped_layout(block, plain));
  EXPECT_FALSE(moe_trtllm_grouped_layout(plain, block));
  EXPECT_EQ(moe_trtllm_ep_size(8, 4), 2);
  EXPECT_EQ(moe_trtllm_ep_size(8, 3), 3);
  EXPECT_EQ(moe_trtllm_ep_size(8, 8), 1);
  EXPECT_EQ(moe_trtllm_ep_size(256, 32), 8);
  MoeRouteQuery q = query(16, 4);
  q.ep_size = moe_trtllm_ep_size(8, 4);
  EXPECT_TRUE(moe_trtllm_use_grouped(q, shuffled, plain, 0));
  EXPECT_FALSE(moe_trtllm_use_grouped(q, block, plain, 0));
  EXPECT_FALSE(moe_trtllm_use_grouped(q, plain, block, 2));
  EXPECT_FALSE(moe_trtllm_use_grouped(q, plain, plain, 1));
  q.pairs = 15;
  EXPECT_FALSE(moe_trtllm_use_grouped(q, plain, plain, 0));
  EXPECT_TRUE(moe_trtllm_use_grouped(q, plain, plain, 2));
  q.w1 += 4;  // misaligned: never, even forced
  EXPECT_FALSE(moe_trtllm_use_grouped(q, plain, plain, 2));
}

// The grouped GEMM runs on the stored rows of a shuffled MajorK weight: that is exact only if
// moe_stored_row is a bijection of each expert's [0, mn) rows (every stored row is one plain row,
// the GEMM's column moe_stored_row(j) its plain output j), for both shuffle blocks, with and
// without the gated interleave.
TEST(MoeGroupedPlan, TrtllmStoredRowsArePermutations) {
  using flashinfer::kernels::MoeWeightIndex;
  for (int64_t block : {int64_t{16}, int64_t{32}}) {
    for (bool interleave : {false, true}) {
      for (int64_t mn : {int64_t{32}, int64_t{64}, int64_t{256}}) {
        MoeWeightIndex w;
        w.shuffled = true;
        w.gated_interleave = interleave;
        w.shuffle_block = block;
        std::vector<int> seen(static_cast<size_t>(mn), 0);
        for (int64_t j = 0; j < mn; ++j) {
          const int64_t r = flashinfer::kernels::moe_stored_row(w, mn, j);
          ASSERT_GE(r, 0);
          ASSERT_LT(r, mn);
          ++seen[static_cast<size_t>(r)];
        }
        EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), mn)
            << "block " << block << " interleave " << interleave << " mn " << mn;
      }
    }
  }
}

// trtllm_bf16_moe's scratch: ids and weights first, then the grouped layout with fp32 GEMM1 rows.
TEST(MoeGroupedPlan, TrtllmScratchLayout) {
  const MoeTrtllmScratch t = moe_trtllm_scratch(300);
  EXPECT_EQ(t.ids, 0u);
  EXPECT_EQ(t.w, 1280u);  // 300 int32 = 1200 bytes
  EXPECT_EQ(t.rest, 2560u);
  // 300 pairs, 8 experts, hidden 64, inter 32, gated: g1 is 300 * 64 fp32.
  const MoeGroupedScratch s = moe_grouped_scratch(300, 8, 64, 32, 64, 2, 2, 4);
  const MoeGroupedScratch b = moe_grouped_scratch(300, 8, 64, 32, 64, 2, 2);
  EXPECT_EQ(s.g1, b.g1);
  EXPECT_EQ(s.h, s.g1 + 76800u);  // 300 * 64 * 4
  EXPECT_EQ(b.h, b.g1 + 38400u);  // 300 * 64 * 2
  EXPECT_EQ(s.y, s.h + 19200u);   // 300 * 32 * 2
  EXPECT_EQ(s.bytes, s.y + 38400u);
}

}  // namespace
