// The tensor-core MLA decode kernel's host-checkable decisions (src/kernels/cuda/mla_shape.h), on
// the CPU: its shared memory and the stages each device gets, and its fragment addressing run
// through the emulated ldmatrix / mma.sync (tests/util/mma_emulation.h): the two warps of a row
// group split q.k over the 576 dims (ckv and kpe sums apart) and P.V over the 512 output dims,
// reading V as the first 512 dims of the same permuted 72-unit rows that K is read from.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cuda/device/permuted_smem.cuh"
#include "kernels/cuda/mla_shape.h"
#include "kernels/cuda/prefill_shape.h"
#include "util/mma_emulation.h"

namespace flashinfer::kernels::cuda::mla {
namespace {

using testing::mma_emu::Frag4;
using testing::mma_emu::half_of;
using testing::mma_emu::ldmatrix_x4;
using testing::mma_emu::mma;
using testing::mma_emu::Pair;
using testing::mma_emu::Smem;
using Acc = std::array<std::array<double, 4>, 32>;  // one 16x8 accumulator fragment, [lane][e]

TEST(MlaShape, SharedMemoryAndStagesPerDevice) {
  // Q 64 rows + stages of 32 rows, 1152 bytes each; the score exchange (8 warps x 16 floats x 32
  // lanes); one tile's ckv and kpe byte offsets.
  EXPECT_EQ(mla_mma_smem_bytes(2), 1152u * (64 + 64) + 16384 + 512);  // 164352
  EXPECT_EQ(mla_mma_smem_bytes(3), 1152u * (64 + 96) + 16384 + 512);  // 201216
  // fp8 caches: the stages as stored (half the bytes) and one 16-bit tile to widen them into.
  // fp8 stages also hold ckv_scale_arr's rows (16 bytes a token) and their addresses (8).
  EXPECT_EQ(mla_mma_smem_bytes(2, true),
            1152u * (64 + 32) + 576u * 64 + 16384 + 512 + 256 + 16u * 64);  // 165632
  EXPECT_EQ(mla_mma_smem_bytes(3, true),
            1152u * (64 + 32) + 576u * 96 + 16384 + 512 + 256 + 16u * 96);  // 184576
  EXPECT_EQ(mla_mma_stages(232448, true), 3);
  EXPECT_EQ(mla_mma_stages(166912, true), 2);
  EXPECT_EQ(mla_mma_stages(101376, true), 0);
  EXPECT_EQ(mla_mma_stages(232448), 3);  // sm_90: 227 KiB a block
  EXPECT_EQ(mla_mma_stages(166912), 2);  // sm_80: 163 KiB
  EXPECT_EQ(mla_mma_stages(101376), 0);  // sm_86 / sm_89: 99 KiB, the CUDA-core kernel
  EXPECT_EQ(mla_mma_stages(164352), 2);
  EXPECT_EQ(mla_mma_stages(164351), 0);
  EXPECT_EQ(kMmaThreads, 256);
  EXPECT_EQ(kMmaUnits, 72);
  EXPECT_TRUE(dev::permuted_layout_ok(kMmaUnits));  // 72 units: 9 whole swizzle groups
}

TEST(MlaShape, TensorCoresForSixteenBitOrFp8QueriesAndCaches) {
  constexpr DType f16 = DType::kFloat16, bf16 = DType::kBFloat16, f32 = DType::kFloat32,
                  e4m3 = DType::kFloat8E4M3FN, e5m2 = DType::kFloat8E5M2;
  EXPECT_TRUE(mla_mma_dtypes(bf16, bf16, bf16));
  EXPECT_TRUE(mla_mma_dtypes(f16, f16, f16));
  EXPECT_TRUE(mla_mma_dtypes(bf16, e4m3, bf16));  // fp8 caches: widened in shared memory
  EXPECT_TRUE(mla_mma_dtypes(f16, e5m2, f16));
  EXPECT_TRUE(mla_mma_dtypes(e4m3, e4m3, bf16));  // trtllm's fp8 calls: the query widened
  EXPECT_TRUE(mla_mma_dtypes(e4m3, e5m2, bf16));
  EXPECT_FALSE(mla_mma_dtypes(e4m3, bf16, bf16));  // an fp8 query comes with an fp8 cache
  EXPECT_FALSE(mla_mma_dtypes(e4m3, e4m3, f16));
  EXPECT_FALSE(mla_mma_dtypes(f16, bf16, f16));
  EXPECT_FALSE(mla_mma_dtypes(bf16, bf16, f32));
  EXPECT_FALSE(mla_mma_dtypes(bf16, e4m3, f16));
  EXPECT_FALSE(mla_mma_dtypes(f32, f32, f32));
}

// Hand-worked plans on 132 SMs (an H100): the CUDA-core kernels aim at two waves, the tensor-core
// kernel at one and never past it.
TEST(MlaShape, KvSplitsFillTheGpuOnce) {
  auto split = [](int64_t blocks, int64_t kv, bool mma, int64_t bytes = 1 << 20) {
    const MlaSplit s = mla_kv_split(blocks, 132, kv, mma, mma ? 32 : 16, bytes);
    return std::array<int64_t, 2>{s.splits, s.chunk};
  };
  using P = std::array<int64_t, 2>;
  EXPECT_EQ(split(2, 5000, false), (P{20, 256}));   // by length: 20 chunks of >= 256 tokens
  EXPECT_EQ(split(128, 2048, false), (P{3, 688}));  // ceil(264 / 128) = 3, chunk 683 -> 688
  EXPECT_EQ(split(128, 2048, true), (P{1, 2048}));  // batch 64 x 128 heads: one wave, no split
  EXPECT_EQ(split(32, 2048, true), (P{4, 512}));    // batch 16 x 128 heads: 128 blocks
  EXPECT_EQ(split(2, 32768, true), (P{64, 512}));   // batch 1: 66 wanted, 64 at most
  EXPECT_EQ(split(200, 8192, true), (P{1, 8192}));  // more than a wave already
  EXPECT_EQ(split(2, 256, true), (P{1, 256}));      // too short to split
  EXPECT_EQ(split(2, 0, true), (P{1, 1}));          // nothing visible anywhere
  EXPECT_EQ(split(2, 32768, true, int64_t{1} << 27), (P{2, 16384}));  // the scratch's cap
  EXPECT_EQ(split(1, 1000, true), (P{4, 256}));  // 1000 tokens: 4 chunks, the last short
  // Any plan: the splits cover every token once, whole tiles, within the limits; the tensor-core
  // kernel's grid stays within one wave when it splits.
  std::mt19937 rng(3);
  for (int i = 0; i < 20000; ++i) {
    const int64_t blocks = 1 + static_cast<int64_t>(rng() % 400);
    const int64_t kv = static_cast<int64_t>(rng() % 200000);
    const bool mma = (rng() & 1) != 0;
    const int64_t tile = mma ? 32 : 16;
    const MlaSplit s = mla_kv_split(blocks, 132, kv, mma, tile, 1 + rng() % (1 << 24));
    const int64_t len = kv < 1 ? 1 : kv;
    ASSERT_GE(s.splits, 1);
    ASSERT_LE(s.splits, kMlaMaxSplits);
    ASSERT_GE(s.splits * s.chunk, len);
    ASSERT_LT((s.splits - 1) * s.chunk, len);
    if (s.splits > 1) {
      ASSERT_EQ(s.chunk % tile, 0);
      ASSERT_GE(s.chunk, kMlaMinChunk / 2);
      if (mma) {
        ASSERT_LE(blocks * s.splits, 132);
      }
    }
  }
}

// Under a CUDA graph the grid's splits are fixed at capture (mla_kv_split for the longest
// request the page room allows) and each kernel takes its chunk from the latest plan's longest
// request (mla_split_chunk on the device): every later plan's tokens are covered by the captured
// splits, in whole tiles, and a plan with nothing visible gets chunks that cover nothing.
TEST(MlaShape, CapturedSplitsCoverEveryLaterPlan) {
  std::mt19937 rng(4);
  for (int i = 0; i < 20000; ++i) {
    const int64_t blocks = 1 + static_cast<int64_t>(rng() % 300);
    const bool mma = (rng() & 1) != 0;
    const int64_t tile = mma ? 32 : 16;
    const int64_t bound = 1 + static_cast<int64_t>(rng() % 2000000);
    const MlaSplit captured = mla_kv_split(blocks, 132, bound, mma, tile, 1 << 16);
    const int64_t later = static_cast<int64_t>(rng() % (bound + 1));
    const int64_t chunk = mla_split_chunk(later, captured.splits, tile);
    ASSERT_GE(chunk, 1);
    ASSERT_GE(captured.splits * chunk, later) << "bound " << bound << " later " << later;
    if (captured.splits > 1) {
      ASSERT_EQ(chunk % tile, 0);
    }
  }
  // The host's own chunk is the same function.
  EXPECT_EQ(mla_kv_split(2, 132, 5000, false, 16, 1 << 20).chunk, mla_split_chunk(5000, 20, 16));
  EXPECT_EQ(mla_split_chunk(0, 8, 32), 32);  // at least one token's range
  EXPECT_EQ(mla_split_chunk(700, 1, 32), 700);
}

// With the longest length on the device, the kernels' chunk (mla_device_chunk) is
// mla_split_chunk's or, when that is smaller, the launcher's chunk capped at kMlaMinChunk (whole
// tiles): never smaller than both, so the grid still covers every length up to the bound, and a
// short request in a grid sized for a long bound runs a few chunks of 256, not many small ones.
TEST(MlaShape, DeviceChunkKeepsTheEagerFloorAndCoversTheLongest) {
  std::mt19937 rng(9);
  for (int i = 0; i < 20000; ++i) {
    const int64_t blocks = 1 + static_cast<int64_t>(rng() % 300);
    const bool mma = (rng() & 1) != 0;
    const int64_t tile = mma ? 32 : 16;
    const int64_t bound = 1 + static_cast<int64_t>(rng() % 2000000);
    const MlaSplit grid = mla_kv_split(blocks, 132, bound, mma, tile, 1 << 16);
    const int64_t len = static_cast<int64_t>(rng() % (bound + 1));
    const int64_t chunk = mla_device_chunk(len, grid.splits, tile, grid.chunk);
    const int64_t plain = mla_split_chunk(len, grid.splits, tile);
    ASSERT_GE(chunk, plain);
    ASSERT_GE(grid.splits * chunk, len) << "bound " << bound << " len " << len;
    ASSERT_LE(chunk, std::max<int64_t>(plain, 256));
    ASSERT_GE(chunk, std::min<int64_t>(grid.chunk, 256));
    if (grid.splits > 1) {
      ASSERT_EQ(chunk % tile, 0);
    }
  }
  // Batch 1 x 128 heads on 132 SMs, a grid for max_seq_len 163840 (tensor cores: 1 block, 64
  // splits of 2560), a request of 1000 tokens: 4 chunks of 256 hold it (not 32 of 32).
  const MlaSplit grid = mla_kv_split(2, 132, 163840, true, 32, 1 << 16);
  EXPECT_EQ(grid.splits, 64);
  EXPECT_EQ(grid.chunk, 2560);
  EXPECT_EQ(mla_split_chunk(1000, 64, 32), 32);
  EXPECT_EQ(mla_device_chunk(1000, 64, 32, grid.chunk), 256);
  EXPECT_EQ(mla_device_chunk(100000, 64, 32, grid.chunk), mla_split_chunk(100000, 64, 32));
  EXPECT_EQ(mla_device_chunk(100, 1, 16, 100), 100);  // one split: the whole range
  EXPECT_EQ(mla_device_chunk(0, 4, 16, 64), 64);      // a launcher chunk under the floor stays
}

TEST(MlaShape, RowsPackedForThirtyTwoHeadsOrFewer) {
  EXPECT_EQ(mla_mma_pack(128), 1);
  EXPECT_EQ(mla_mma_pack(64), 1);
  EXPECT_EQ(mla_mma_pack(33), 1);
  EXPECT_EQ(mla_mma_pack(32), 2);
  EXPECT_EQ(mla_mma_pack(16), 4);  // DeepSeek at TP 8: MTP's 4 rows share a block
  EXPECT_EQ(mla_mma_pack(12), 5);  // 60 of the 64 rows
  EXPECT_EQ(mla_mma_pack(1), 64);
  EXPECT_EQ(mla_mma_pack(0), 1);
  for (int h = 1; h <= 200; ++h) EXPECT_LE(mla_mma_pack(h) * (h < kMmaRows ? h : kMmaRows), 64);
}

// Which calls the tensor-core kernel has an instance for (the launcher's rule; the rest take the
// CUDA-core kernels): rope calls at 2 or 3 stages with any query dtype it takes, NoPE calls at
// 3 stages (sm_90) with a 16-bit query only.
TEST(MlaShape, TensorCoreInstancesForRopeAndNoPeCalls) {
  for (bool fp8_query : {false, true}) {
    EXPECT_TRUE(mla_mma_instance(64, 3, fp8_query));
    EXPECT_TRUE(mla_mma_instance(64, 2, fp8_query));
    EXPECT_FALSE(mla_mma_instance(64, 0, fp8_query));  // sm_86 / sm_89: no room
  }
  EXPECT_TRUE(mla_mma_instance(0, 3, false));
  EXPECT_FALSE(mla_mma_instance(0, 2, false)) << "no 2-stage NoPE instance (sm_80)";
  EXPECT_FALSE(mla_mma_instance(0, 3, true)) << "fp8 queries are trtllm's, with kpe";
  EXPECT_FALSE(mla_mma_instance(32, 3, false));
  EXPECT_FALSE(mla_mma_instance(64, 4, false));
  // The NoPE instances' stages: what an H100 / H200 gives (232448 bytes of opt-in shared memory).
  for (bool fp8 : {false, true}) EXPECT_EQ(mla_mma_stages(232448, fp8), 3);
}

TEST(MlaShape, WarpHalvesSplitTheStepsAndDims) {
  EXPECT_EQ(mla_mma_qk_step_begin(0), 0);
  EXPECT_EQ(mla_mma_qk_step_begin(1), 18);
  EXPECT_EQ(mla_mma_qk_step_begin(1) + kMmaKStepsWarp, kMmaKSteps);
  // Half 1 holds every kpe step (its own accumulator); half 0 none.
  EXPECT_LT(mla_mma_qk_step_begin(1), kMmaKStepsNope);
  EXPECT_EQ(mla_mma_qk_ckv_step_end(0), 18);
  EXPECT_EQ(mla_mma_qk_ckv_step_end(1), kMmaKStepsNope);
  // NoPE (head_dim_kpe 0): the 32 ckv steps, 16 a half.
  EXPECT_EQ(mla_mma_qk_step_begin(0, false), 0);
  EXPECT_EQ(mla_mma_qk_step_begin(1, false), 16);
  EXPECT_EQ(mla_mma_qk_ckv_step_end(0, false), 16);
  EXPECT_EQ(mla_mma_qk_ckv_step_end(1, false), kMmaKStepsNope);
  EXPECT_EQ(mla_mma_vo_dim_begin(0), 0);
  EXPECT_EQ(mla_mma_vo_dim_begin(1), 256);
  // Whole 8-unit swizzle groups: a plain byte offset of the lane base.
  EXPECT_EQ(mla_mma_vo_dim_begin(1) / 8 % 8, 0);
}

// Small integers (exact in every type here): Q (head, dim), the cache row (token, dim), P (head,
// token).
double qv(int r, int c) { return static_cast<double>((r * 3 + c * 5) % 7 - 3); }
double cv(int t, int c) { return static_cast<double>((t * 5 + c * 3) % 9 - 4); }
double pv(int r, int t) { return static_cast<double>((r + 2 * t) % 4 - 1); }

// The kernel's addressing for warp (wq, wd) of a block: q.k over its k-steps into sn (ckv) and sp
// (kpe), then P.V over its output dims, against plain sums. A NoPE call (`rope_call` false) never
// copies the kpe units of Q or of the tiles: they hold NaN here, and no step may read them.
void check_fragment_addressing(bool rope_call) {
  const uint32_t q_base = 0, kv_base = 128 * 576;  // 128-byte aligned, disjoint (Q: 73728 bytes)
  const uint32_t U = kMmaUnits;
  const double kNever = std::nan("");
  Smem s;
  for (int r = 0; r < kMmaRows; ++r)
    for (int c = 0; c < kMmaDim; ++c)
      s.put(q_base, r, c, U, rope_call || c < kMmaCkv ? qv(r, c) : kNever);
  for (int t = 0; t < kMmaKvTile; ++t)
    for (int c = 0; c < kMmaDim; ++c)
      s.put(kv_base, t, c, U, rope_call || c < kMmaCkv ? cv(t, c) : kNever);
  auto at = [](const std::array<uint32_t, 32>& base, uint32_t row_add, uint32_t col_even) {
    std::array<uint32_t, 32> r{};
    for (int l = 0; l < 32; ++l)
      r[l] = dev::permuted_frag_addr(base[l], row_add, col_even, kMmaUnits);
    return r;
  };
  for (int wq = 0; wq < kMmaWarpsQ; ++wq) {
    // Scores summed over both halves, and each half's O.
    std::vector<Acc> nope(kMmaKvTile / 8, Acc{}), rope(kMmaKvTile / 8, Acc{});
    int bad_o = 0, rope_in_half0 = 0;
    for (int wd = 0; wd < kMmaWarpsD; ++wd) {
      SCOPED_TRACE(::testing::Message() << "warp " << wd * kMmaWarpsQ + wq);
      std::array<uint32_t, 32> qa{}, ka{}, va{};
      for (int l = 0; l < 32; ++l) {
        const auto ql = prefill::prefill_q_frag_lane(l), kl = prefill::prefill_k_frag_lane(l),
                   vl = prefill::prefill_v_frag_lane(l);
        qa[l] = dev::permuted_lane_base(q_base, wq * 16 + ql.row, ql.c, U);
        ka[l] = dev::permuted_lane_base(kv_base, kl.row, kl.c, U);
        va[l] = dev::permuted_lane_base(kv_base, vl.row, vl.c, U) +
                static_cast<uint32_t>(mla_mma_vo_dim_begin(wd)) * 2u;
      }
      std::vector<Acc> sn(kMmaKvTile / 8, Acc{}), sp(kMmaKvTile / 8, Acc{});
      // The kernel's steps: the half's ckv steps, then (half 1, a call with kpe) the kpe ones.
      std::vector<int> steps;
      for (int kk = mla_mma_qk_step_begin(wd, rope_call);
           kk < mla_mma_qk_ckv_step_end(wd, rope_call); ++kk)
        steps.push_back(kk);
      if (wd == 1 && rope_call)
        for (int kk = kMmaKStepsNope; kk < kMmaKSteps; ++kk) steps.push_back(kk);
      EXPECT_EQ(static_cast<int>(steps.size()), rope_call ? kMmaKStepsWarp : kMmaKStepsNope / 2);
      for (int kk : steps) {
        std::vector<Acc>& acc = kk < kMmaKStepsNope ? sn : sp;
        const Frag4 a = ldmatrix_x4(s, at(qa, 0, kk * 2), false);
        for (int nk = 0; nk < kMmaKvTile / 16; ++nk) {
          const Frag4 b = ldmatrix_x4(s, at(ka, nk * 16, kk * 2), false);
          mma(acc[2 * nk], a, half_of(b, 0));
          mma(acc[2 * nk + 1], a, half_of(b, 2));
        }
      }
      for (int n = 0; n < kMmaKvTile / 8; ++n) {
        for (int l = 0; l < 32; ++l) {
          for (int e = 0; e < 4; ++e) {
            nope[n][l][e] += sn[n][l][e];
            rope[n][l][e] += sp[n][l][e];
            if (wd == 0) rope_in_half0 += sp[n][l][e] != 0.0;
          }
        }
      }
      // O over this half's dims, P packed as the kernel packs its A operand.
      std::vector<Acc> of(kMmaVoDims / 8, Acc{});
      for (int j = 0; j < kMmaKvTile / 16; ++j) {
        std::array<std::array<Pair, 4>, 32> a{};
        for (int l = 0; l < 32; ++l) {
          const int g = l / 4, t = l % 4;
          auto p = [&](int blk, int e) {
            return pv(wq * 16 + g + 8 * (e >> 1), blk * 8 + 2 * t + (e & 1));
          };
          a[l][0] = {p(2 * j, 0), p(2 * j, 1)};
          a[l][1] = {p(2 * j, 2), p(2 * j, 3)};
          a[l][2] = {p(2 * j + 1, 0), p(2 * j + 1, 1)};
          a[l][3] = {p(2 * j + 1, 2), p(2 * j + 1, 3)};
        }
        for (int nd = 0; nd < kMmaVoDims / 16; ++nd) {
          const Frag4 b = ldmatrix_x4(s, at(va, j * 16, nd * 2), true);
          mma(of[2 * nd], a, half_of(b, 0));
          mma(of[2 * nd + 1], a, half_of(b, 2));
        }
      }
      for (int n = 0; n < kMmaVoDims / 8; ++n) {
        for (int l = 0; l < 32; ++l) {
          for (int e = 0; e < 4; ++e) {
            const int row = wq * 16 + l / 4 + 8 * (e >> 1);
            const int dim = mla_mma_vo_dim_begin(wd) + n * 8 + 2 * (l % 4) + (e & 1);
            double want = 0;
            for (int t = 0; t < kMmaKvTile; ++t) want += pv(row, t) * cv(t, dim);
            bad_o += of[n][l][e] != want;
          }
        }
      }
    }
    SCOPED_TRACE(::testing::Message() << "row group " << wq);
    EXPECT_EQ(bad_o, 0) << "O elements wrong";
    EXPECT_EQ(rope_in_half0, 0) << "half 0 took kpe steps";
    int bad_s = 0;
    for (int n = 0; n < kMmaKvTile / 8; ++n) {
      for (int l = 0; l < 32; ++l) {
        for (int e = 0; e < 4; ++e) {
          const int row = wq * 16 + l / 4 + 8 * (e >> 1), tok = n * 8 + 2 * (l % 4) + (e & 1);
          double want_n = 0, want_p = 0;
          for (int c = 0; c < kMmaCkv; ++c) want_n += qv(row, c) * cv(tok, c);
          if (rope_call)
            for (int c = kMmaCkv; c < kMmaDim; ++c) want_p += qv(row, c) * cv(tok, c);
          bad_s += nope[n][l][e] != want_n || rope[n][l][e] != want_p;
        }
      }
    }
    EXPECT_EQ(bad_s, 0) << "S elements wrong";
  }
}

TEST(MlaShape, FragmentAddressingSplitsQKAndPVBetweenTheHalves) { check_fragment_addressing(true); }

// head_dim_kpe 0 (a NoPE model's MLA: vLLM's SM90 sparse backend): the same tiles without their
// kpe units, 16 ckv steps a half.
TEST(MlaShape, NoPeFragmentAddressingNeverReadsTheKpeUnits) { check_fragment_addressing(false); }

}  // namespace
}  // namespace flashinfer::kernels::cuda::mla
