// Host checks of the tensor-core grouped GEMM's tiling (src/kernels/cuda/grouped_gemm_shape.h):
// the launch's slot bound, how a CTA finds its (group, m tile) from m_indptr (the device's warp
// walk emulated here step by step with the same helpers), the rows each tile covers, the shared
// memory and occupancy it implies, and the alignment rule that picks the kernel. Plain integer
// code shared with the kernel, verified without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "kernels/cuda/grouped_gemm_shape.h"
#include "kernels/grouped_gemm_cutlass_rules.h"
#include "kernels/occupancy.h"

namespace {

using namespace flashinfer::kernels::cuda::grouped;
using flashinfer::kernels::device_limits;
using flashinfer::kernels::occupancy_blocks_per_sm;

struct Found {
  int64_t group = -1, tile = -1;
};

// find_tile (grouped_gemm_cuda.cu) on the host: groups 32 at a time, lane l counting group
// c + l's m tiles, an inclusive prefix sum over the 32 lanes (the kernel's __shfl_up_sync
// steps), the first lane whose group holds the slot (the kernel's ballot) wins.
Found find_tile_host(const std::vector<int32_t>& indptr, int64_t slot) {
  const int64_t groups = static_cast<int64_t>(indptr.size()) - 1;
  int64_t before = 0;
  for (int64_t c = 0; c < groups; c += 32) {
    int64_t tiles[32] = {}, incl[32] = {};
    for (int lane = 0; lane < 32; ++lane) {
      const int64_t g = c + lane;
      if (g < groups) {
        tiles[lane] = gmm_m_tiles(indptr[static_cast<std::size_t>(g) + 1] -
                                  indptr[static_cast<std::size_t>(g)]);
      }
      incl[lane] = tiles[lane];
    }
    for (int off = 1; off < 32; off <<= 1) {
      int64_t next[32];
      for (int lane = 0; lane < 32; ++lane) {
        next[lane] = incl[lane] + (lane >= off ? incl[lane - off] : 0);
      }
      for (int lane = 0; lane < 32; ++lane) incl[lane] = next[lane];
    }
    for (int lane = 0; lane < 32; ++lane) {
      const int64_t mt = gmm_slot_in_group(slot, before + incl[lane] - tiles[lane], tiles[lane]);
      if (mt >= 0) return {c + lane, mt};
    }
    before += incl[31];
  }
  return {};
}

// Every slot below gmm_slot_bound: the (group, m tile) pairs found are exactly every group's
// tiles, each once, in the first total slots (later slots find nothing); the tiles' rows
// partition each group's rows, at most 128 per tile.
void check_schedule(const std::vector<int32_t>& indptr, int64_t cum_m) {
  const int64_t groups = static_cast<int64_t>(indptr.size()) - 1;
  const int64_t bound = gmm_slot_bound(cum_m, groups);
  int64_t total = 0;
  for (int64_t g = 0; g < groups; ++g) {
    total +=
        gmm_m_tiles(indptr[static_cast<std::size_t>(g) + 1] - indptr[static_cast<std::size_t>(g)]);
  }
  ASSERT_LE(total, bound);
  std::map<std::pair<int64_t, int64_t>, int> seen;
  std::vector<int> covered(static_cast<std::size_t>(cum_m), 0);
  for (int64_t slot = 0; slot < bound + 3; ++slot) {
    const Found f = find_tile_host(indptr, slot);
    if (slot >= total) {
      EXPECT_EQ(f.group, -1) << "slot " << slot << " of " << total;
      continue;
    }
    ASSERT_GE(f.group, 0) << "slot " << slot;
    ++seen[{f.group, f.tile}];
    const int64_t begin = indptr[static_cast<std::size_t>(f.group)];
    const int64_t end = indptr[static_cast<std::size_t>(f.group) + 1];
    const GmmRows r = gmm_tile_rows(begin, end, f.tile);
    EXPECT_GE(r.rows, 1);
    EXPECT_LE(r.rows, kGmmTileM);
    EXPECT_GE(r.row0, begin);
    EXPECT_LE(r.row0 + r.rows, end);
    for (int64_t i = r.row0; i < r.row0 + r.rows; ++i) ++covered[static_cast<std::size_t>(i)];
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), total);
  for (const auto& [key, count] : seen) EXPECT_EQ(count, 1) << key.first << "/" << key.second;
  // Rows inside a group: one tile each; outside every group: none.
  for (int64_t i = 0; i < cum_m; ++i) {
    bool inside = false;
    for (int64_t g = 0; g < groups; ++g) {
      inside = inside || (i >= indptr[static_cast<std::size_t>(g)] &&
                          i < indptr[static_cast<std::size_t>(g) + 1]);
    }
    EXPECT_EQ(covered[static_cast<std::size_t>(i)], inside ? 1 : 0) << "row " << i;
  }
}

// m_indptr entries clamped to [0, cum_m], end >= begin (the device reads them unchecked).
TEST(GroupedGemmShape, GroupRowsClamped) {
  const auto check = [](int64_t first, int64_t last, int64_t b, int64_t e) {
    const GmmGroup g = gmm_group_rows(first, last, 100);
    EXPECT_EQ(g.begin, b) << first << " " << last;
    EXPECT_EQ(g.end, e) << first << " " << last;
  };
  check(3, 40, 3, 40);    // in range: unchanged
  check(-5, 40, 0, 40);   // negative start
  check(3, 400, 3, 100);  // past cum_m
  check(50, 20, 50, 50);  // decreasing: empty
  check(150, 20, 100, 100);
  check(-9, -3, 0, 0);
}

TEST(GroupedGemmShape, TilesAndSlotBound) {
  EXPECT_EQ(gmm_m_tiles(0), 0);
  EXPECT_EQ(gmm_m_tiles(-3), 0);
  EXPECT_EQ(gmm_m_tiles(1), 1);
  EXPECT_EQ(gmm_m_tiles(128), 1);
  EXPECT_EQ(gmm_m_tiles(129), 2);
  EXPECT_EQ(gmm_slot_bound(0, 8), 0);
  EXPECT_EQ(gmm_slot_bound(100, 0), 0);
  EXPECT_EQ(gmm_slot_bound(1, 8), 1);         // one non-empty group at most
  EXPECT_EQ(gmm_slot_bound(256, 1), 2);       // one group: exactly its tiles
  EXPECT_EQ(gmm_slot_bound(8 * 129, 8), 16);  // reached: 8 groups of 129 rows, 2 tiles each
  EXPECT_EQ(gmm_slot_bound(3, 64), 3);        // three groups of one row
  // The bound is the maximum over splits: brute force over every split of cum_m rows in 3
  // groups.
  for (int64_t cum = 0; cum <= 300; cum += 7) {
    int64_t best = 0;
    for (int64_t x = 0; x <= cum; ++x) {
      for (int64_t y = 0; x + y <= cum; ++y) {
        const int64_t t = gmm_m_tiles(x) + gmm_m_tiles(y) + gmm_m_tiles(cum - x - y);
        best = t > best ? t : best;
      }
    }
    EXPECT_EQ(gmm_slot_bound(cum, 3), best) << cum;
  }
  EXPECT_EQ(gmm_slot_in_group(5, 5, 2), 0);
  EXPECT_EQ(gmm_slot_in_group(6, 5, 2), 1);
  EXPECT_EQ(gmm_slot_in_group(7, 5, 2), -1);
  EXPECT_EQ(gmm_slot_in_group(4, 5, 2), -1);
  EXPECT_EQ(gmm_slot_in_group(5, 5, 0), -1);  // an empty group owns no slot
  const GmmRows last = gmm_tile_rows(10, 10 + 300, 2);
  EXPECT_EQ(last.row0, 10 + 256);
  EXPECT_EQ(last.rows, 44);
  const GmmRows full = gmm_tile_rows(10, 10 + 300, 1);
  EXPECT_EQ(full.row0, 10 + 128);
  EXPECT_EQ(full.rows, 128);
}

// The m16 fragments each warp row block computes: every fragment holding a row of the tile, and
// none past them (those multiply zero-filled rows).
TEST(GroupedGemmShape, WarpFragmentsCoverTheTileRows) {
  for (int rows = 1; rows <= kGmmTileM; ++rows) {
    for (int wm = 0; wm < kGmmWarpsM; ++wm) {
      const int frags = gmm_warp_m_frags(rows, wm);
      for (int mi = 0; mi < kGmmWarpTileM / 16; ++mi) {
        const int first_row = wm * kGmmWarpTileM + mi * 16;
        EXPECT_EQ(mi < frags, first_row < rows) << rows << " " << wm << " " << mi;
      }
    }
  }
  EXPECT_EQ(gmm_warp_m_frags(1, 0), 1);
  EXPECT_EQ(gmm_warp_m_frags(64, 1), 0);
  EXPECT_EQ(gmm_warp_m_frags(65, 1), 1);
  EXPECT_EQ(gmm_warp_m_frags(128, 1), 4);
}

TEST(GroupedGemmShape, ScheduleCoversEveryTileOnce) {
  // Rows before the first group and after the last, empty groups, exact multiples of 128.
  check_schedule({3, 3, 4, 131, 259, 388, 688, 688}, 700);
  check_schedule({0, 128, 256, 384}, 384);
  check_schedule({0, 0, 0}, 5);
  // More than 32 groups (several chunks of the warp walk), random sizes 0..300, some gaps.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const int groups = 1 + static_cast<int>(rng() % 100);
    std::vector<int32_t> indptr(1, static_cast<int32_t>(rng() % 5));
    for (int g = 0; g < groups; ++g) {
      const uint32_t kind = rng() % 4;
      const int32_t m = kind == 0 ? 0 : static_cast<int32_t>(rng() % (kind == 3 ? 300 : 40));
      indptr.push_back(indptr.back() + m);
    }
    SCOPED_TRACE(trial);
    check_schedule(indptr, indptr.back() + static_cast<int32_t>(rng() % 3));
  }
}

// The tiles fit one CTA's shared memory on every architecture the kernel is built for (sm_80,
// sm_86, sm_89 and sm_90 opt-in limits), and at 128 registers a thread (the kernel's
// __launch_bounds__(256, 2)) two CTAs share an H100 SM.
TEST(GroupedGemmShape, SharedMemoryAndOccupancy) {
  EXPECT_EQ(gmm_smem_bytes(false), 3 * 256 * 64 * 2);         // 96 KiB
  EXPECT_EQ(gmm_smem_bytes(true), 3 * 256 * 64 + 256 * 128);  // 80 KiB
  for (const auto& cc : {std::pair{8, 0}, std::pair{8, 6}, std::pair{8, 9}, std::pair{9, 0}}) {
    const auto l = device_limits(cc.first, cc.second);
    for (bool fp8 : {false, true}) {
      EXPECT_LE(gmm_smem_bytes(fp8), l.max_smem_per_block) << cc.first << cc.second << fp8;
      EXPECT_GE(occupancy_blocks_per_sm(l, kGmmThreads, 128, gmm_smem_bytes(fp8), 128), 1);
    }
  }
  EXPECT_EQ(
      occupancy_blocks_per_sm(device_limits(9, 0), kGmmThreads, 128, gmm_smem_bytes(false), 128),
      2);
  EXPECT_EQ(kGmmThreads, 256);
  EXPECT_EQ(kGmmWarpTileM * kGmmWarpsM, kGmmTileM);
  EXPECT_EQ(kGmmWarpTileN * kGmmWarpsN, kGmmTileN);
  EXPECT_EQ(kGmmUnits, 8);  // the permuted layout's row of 8 units
}

// The ldmatrix addresses every lane gives, for every warp and fragment of the loop, against the
// tiles the m16n8k16 fragments need (PTX ISA: ldmatrix.x4 lane group q = lane / 8 addresses the
// rows of 8x8 tile q, which fills register q; A's registers a0..a3 are rows 0-7 / 8-15 x k 0-7,
// then k 8-15; B's b0, b1 are k 0-7 / 8-15 of eight output columns) in the permuted layout. The
// tile sits at a 128-byte-aligned address plus a stage offset, as in the kernel.
TEST(GroupedGemmShape, FragmentAddressesMatchTheMmaOperands) {
  using flashinfer::kernels::cuda::dev::permuted_frag_addr;
  using flashinfer::kernels::cuda::dev::permuted_offset;
  const uint32_t tile = 0x4000, stage = 2 * 32768;
  for (int lane = 0; lane < 32; ++lane) {
    const int q = lane / 8, r8 = lane % 8;
    for (int w = 0; w < kGmmWarpsN; ++w) {
      for (int kk = 0; kk < kGmmTileK / 16; ++kk) {
        // A: warp row block w % 2, fragment mi: rows wm * 64 + mi * 16 + (q % 2) * 8 + r8, k unit
        // kk * 2 + q / 2.
        const int wm = w % kGmmWarpsM;
        const uint32_t a = gmm_a_lane_base(tile, wm, lane);
        for (int mi = 0; mi < kGmmWarpTileM / 16; ++mi) {
          const uint32_t row = static_cast<uint32_t>(wm * 64 + mi * 16 + (q % 2) * 8 + r8);
          const uint32_t unit = static_cast<uint32_t>(kk * 2 + q / 2);
          EXPECT_EQ(permuted_frag_addr(a + stage, static_cast<uint32_t>(mi * 16),
                                       static_cast<uint32_t>(kk * 2), kGmmUnits),
                    tile + stage + 16 * permuted_offset(row, unit, kGmmUnits))
              << lane << " " << wm << " " << kk << " " << mi;
        }
        for (int nj = 0; nj < kGmmWarpTileN / 16; ++nj) {
          // The 8 output columns of register q: w * 32 + nj * 16 + (q / 2) * 8 + 0..7; its k
          // half q % 2.
          const int col8 = w * 32 + nj * 16 + (q / 2) * 8;
          // k-major: row = output column col8 + r8, k unit kk * 2 + q % 2.
          const uint32_t bk = gmm_bk_lane_base(tile, w, lane);
          EXPECT_EQ(permuted_frag_addr(bk + stage, static_cast<uint32_t>(nj * 16),
                                       static_cast<uint32_t>(kk * 2), kGmmUnits),
                    tile + stage +
                        16 * permuted_offset(static_cast<uint32_t>(col8 + r8),
                                             static_cast<uint32_t>(kk * 2 + q % 2), kGmmUnits))
              << lane << " " << w << " " << kk << " " << nj;
          // n-major (transposed tiles): row = k kk * 16 + (q % 2) * 8 + r8, n unit col8 / 8.
          const uint32_t bn = gmm_bn_lane_base(tile, w, lane);
          EXPECT_EQ(permuted_frag_addr(bn + stage, static_cast<uint32_t>(kk * 16),
                                       static_cast<uint32_t>(nj * 2), kGmmUnitsN),
                    tile + stage +
                        16 * permuted_offset(static_cast<uint32_t>(kk * 16 + (q % 2) * 8 + r8),
                                             static_cast<uint32_t>(col8 / 8), kGmmUnitsN))
              << lane << " " << w << " " << kk << " " << nj;
        }
      }
    }
  }
}

TEST(GroupedGemmShape, OperandAlignment) {
  // bf16, contiguous rows of k = 64: aligned.
  EXPECT_TRUE(gmm_operand_aligned(0x1000, 64, 1, 64 * 100, 64, 2));
  // k stride not 1 (a transposed view, a row-major segment weight): no.
  EXPECT_FALSE(gmm_operand_aligned(0x1000, 1, 64, 0, 64, 2));
  // k = 60 bf16 (120 bytes): the last chunk would straddle k.
  EXPECT_FALSE(gmm_operand_aligned(0x1000, 64, 1, 0, 60, 2));
  // row stride 36 elements (72 bytes): row starts not 16-byte aligned.
  EXPECT_FALSE(gmm_operand_aligned(0x1000, 36, 1, 0, 32, 2));
  // base address off by 8 bytes.
  EXPECT_FALSE(gmm_operand_aligned(0x1008, 64, 1, 0, 64, 2));
  // group stride 8 elements short of a 16-byte multiple.
  EXPECT_FALSE(gmm_operand_aligned(0x1000, 64, 1, 64 * 3 + 4, 64, 2));
  // n-major bf16 b (SegmentGEMMWrapper's [d_in, d_out] weights): the same rule with n and k
  // swapped, rows along k of n = 144 elements.
  EXPECT_TRUE(gmm_operand_aligned(0x1000, 144, 1, 144 * 136, 144, 2));
  EXPECT_FALSE(gmm_operand_aligned(0x1000, 140, 1, 140 * 136, 140, 2));  // n = 140: 280 bytes
  // fp8: k = 16 bytes is enough; k = 8 is not.
  EXPECT_TRUE(gmm_operand_aligned(0x1000, 16, 1, 16 * 5, 16, 1));
  EXPECT_FALSE(gmm_operand_aligned(0x1000, 8, 1, 0, 8, 1));
}

}  // namespace

// The grouped GEMMs' CUTLASS route (kernels/grouped_gemm_cutlass_rules.h) takes exactly the calls
// its two sm_90a instances can run: an sm_90 device (9.0 only: sm_90a code runs nowhere else),
// bf16 x bf16 or e4m3 x e4m3 operands, a bf16 output, one alpha, one per weight or none, a weight
// map or none, dimensions in int32, 16-byte aligned k-major a and b and n-major out with 16-byte
// row strides (TMA's rules), k a multiple of 16 bytes and n of 8.
TEST(GroupedGemmShape, CutlassRouteTakesOnlyWhatItsInstancesFit) {
  using flashinfer::DType;
  using flashinfer::kernels::cutlass_grouped_misfit;
  using flashinfer::kernels::GroupedMmCudaParams;
  alignas(16) static uint16_t buf[64];
  GroupedMmCudaParams p;
  p.a = buf;
  p.b = buf;
  p.out = buf;
  p.num_groups = 4;
  p.cum_m = 100;
  p.n = 4096;
  p.k = 7168;
  p.a_stride_m = p.k;
  p.b_stride_n = p.k;
  p.b_stride_e = p.n * p.k;
  p.out_stride_m = p.n;
  EXPECT_EQ(cutlass_grouped_misfit(p, 90), nullptr);
  EXPECT_NE(cutlass_grouped_misfit(p, 80), nullptr);
  EXPECT_NE(cutlass_grouped_misfit(p, 100), nullptr);
  EXPECT_NE(cutlass_grouped_misfit(p, 120), nullptr);
  // misfit_from(base)(change): whether base with `change` applied misfits on sm_90.
  auto misfit_from = [](const GroupedMmCudaParams& base) {
    return [base](auto change) {
      GroupedMmCudaParams q = base;
      change(q);
      return cutlass_grouped_misfit(q, 90) != nullptr;
    };
  };
  auto misfit = misfit_from(p);
  EXPECT_TRUE(misfit([](auto& q) { q.in_dtype = q.b_dtype = DType::kFloat16; }));
  EXPECT_TRUE(misfit([](auto& q) { q.out_dtype = DType::kFloat32; }));
  EXPECT_TRUE(misfit([](auto& q) { q.out_dtype = DType::kFloat16; }));
  EXPECT_TRUE(misfit([](auto& q) { q.b_dtype = DType::kFloat8E4M3FN; }));  // mixed widths
  static const int32_t index[4] = {0, 1, 2, 3};
  static const float alpha = 2.0f;
  EXPECT_FALSE(misfit([](auto& q) { q.b_index = index; }));  // SegmentGEMMWrapper's weight map
  EXPECT_FALSE(misfit([](auto& q) { q.alpha = &alpha; }));
  EXPECT_FALSE(misfit([](auto& q) { q.alpha = &alpha, q.alpha_per_weight = true; }));
  EXPECT_TRUE(misfit([](auto& q) { q.k = 7164; }));  // rows of 14328 bytes: not 16-byte rows
  EXPECT_TRUE(misfit([](auto& q) { q.n = 4100; }));
  EXPECT_TRUE(misfit([](auto& q) { q.a_stride_m = 7172; }));  // a row stride off 16 bytes
  EXPECT_TRUE(misfit([](auto& q) { q.a_stride_k = 2; }));
  EXPECT_TRUE(misfit([](auto& q) { q.a = buf + 1; }));  // a base off 16 bytes
  EXPECT_TRUE(misfit([](auto& q) { q.b_stride_n = 1, q.b_stride_k = 4096; }));  // n-major b
  EXPECT_TRUE(misfit([](auto& q) { q.b_stride_e = 4096 * 7168 + 4; }));
  EXPECT_TRUE(misfit([](auto& q) { q.out = buf + 4; }));
  EXPECT_TRUE(misfit([](auto& q) { q.out_stride_n = 2; }));
  EXPECT_TRUE(misfit([](auto& q) { q.num_groups = 0; }));
  EXPECT_TRUE(misfit([](auto& q) { q.num_groups = (int64_t{1} << 30) + 1; }));
  EXPECT_FALSE(misfit([](auto& q) { q.num_groups = int64_t{1} << 30; }));
  EXPECT_TRUE(misfit([](auto& q) { q.cum_m = int64_t{1} << 31; }));
  // Broadcast (stride 0) or overlapping rows: the mma.sync kernel's.
  EXPECT_TRUE(misfit([](auto& q) { q.a_stride_m = 0; }));
  EXPECT_TRUE(misfit([](auto& q) { q.b_stride_n = 7160; }));
  EXPECT_TRUE(misfit([](auto& q) { q.out_stride_m = -4096; }));
  EXPECT_TRUE(misfit([](auto& q) { q.b_stride_e = -4096 * 7168; }));
  EXPECT_FALSE(misfit([](auto& q) { q.b_stride_e = 0; }));  // one weight for every group
  // Padded rows that keep 16-byte strides are fine.
  EXPECT_FALSE(misfit([](auto& q) { q.a_stride_m = 7168 + 64, q.out_stride_m = 4096 + 8; }));

  // e4m3 x e4m3 (grouped_mm_fp8): the same rules in bytes of one-byte elements, the output bf16.
  GroupedMmCudaParams f = p;
  f.in_dtype = f.b_dtype = DType::kFloat8E4M3FN;
  f.alpha = &alpha;
  EXPECT_EQ(cutlass_grouped_misfit(f, 90), nullptr);
  EXPECT_NE(cutlass_grouped_misfit(f, 89), nullptr);
  auto misfit8 = misfit_from(f);
  EXPECT_TRUE(misfit8([](auto& q) { q.b_dtype = DType::kFloat8E5M2; }));
  EXPECT_TRUE(misfit8([](auto& q) { q.in_dtype = q.b_dtype = DType::kFloat8E5M2; }));
  EXPECT_TRUE(misfit8([](auto& q) { q.out_dtype = DType::kFloat32; }));
  EXPECT_TRUE(misfit8([](auto& q) { q.k = 7160, q.a_stride_m = q.b_stride_n = 7160; }));  // 7160 B
  EXPECT_FALSE(misfit8([](auto& q) { q.k = 7152, q.a_stride_m = q.b_stride_n = 7152; }));
  EXPECT_TRUE(misfit8([](auto& q) { q.a_stride_m = 7176; }));  // 7176 bytes: off 16
  EXPECT_FALSE(misfit8([](auto& q) { q.a_stride_m = 7184; }));
  EXPECT_TRUE(misfit8([](auto& q) { q.b_stride_e = 4096 * 7168 + 8; }));
  EXPECT_FALSE(misfit8([](auto& q) { q.b_stride_e = 4096 * 7168 + 16; }));
  EXPECT_TRUE(misfit8([](auto& q) { q.a = reinterpret_cast<const uint8_t*>(buf) + 8; }));
}

// The block-scaled CUTLASS route (grouped_mm_fp8_block_scaled on Hopper, opt-in): the e4m3 rules
// above, both scales and no alpha, the scales dense as CUTLASS derives them from each group's shape
// (DeepSeek-V3's GEMM1 and GEMM2: 4096 x 7168 and 7168 x 2048; partial last blocks too).
TEST(GroupedGemmShape, CutlassBlockScaledRouteTakesDeepSeekShapes) {
  using flashinfer::DType;
  using flashinfer::kernels::cutlass_grouped_block_misfit;
  using flashinfer::kernels::GroupedMmCudaParams;
  alignas(16) static uint16_t buf[64];
  alignas(16) static float scales[64];
  GroupedMmCudaParams p;
  p.in_dtype = p.b_dtype = DType::kFloat8E4M3FN;
  p.a = p.b = p.out = buf;
  p.num_groups = 8;
  p.cum_m = 1000;
  p.n = 4096;
  p.k = 7168;
  p.a_stride_m = p.b_stride_n = p.k;
  p.b_stride_e = p.n * p.k;
  p.out_stride_m = p.n;
  p.a_block_scale = p.b_block_scale = scales;
  p.a_block_scale_stride = 7168 / 128;
  p.b_block_scale_stride_e = (4096 / 128) * (7168 / 128);
  EXPECT_EQ(cutlass_grouped_block_misfit(p, 90), nullptr);
  EXPECT_NE(cutlass_grouped_block_misfit(p, 100), nullptr);
  auto misfit = [&](auto change) {
    GroupedMmCudaParams q = p;
    change(q);
    return cutlass_grouped_block_misfit(q, 90) != nullptr;
  };
  // GEMM2's shape (n = hidden 7168, k = intermediate 2048).
  EXPECT_FALSE(misfit([](auto& q) {
    q.n = 7168, q.k = 2048, q.a_stride_m = q.b_stride_n = 2048, q.out_stride_m = 7168;
    q.b_stride_e = 7168 * 2048, q.a_block_scale_stride = 16, q.b_block_scale_stride_e = 56 * 16;
  }));
  static const float alpha = 2.0f;
  EXPECT_TRUE(misfit([](auto& q) { q.alpha = &alpha; }));
  EXPECT_TRUE(misfit([](auto& q) { q.a_block_scale = nullptr; }));
  EXPECT_TRUE(misfit([](auto& q) { q.b_block_scale = nullptr; }));
  EXPECT_TRUE(misfit([](auto& q) { q.in_dtype = q.b_dtype = DType::kBFloat16; }));
  // Partial last blocks (a TP-sharded intermediate size of 192, the tests' hidden size 144): the
  // scales' rows ceil(k / 128), the weights' ceil(n / 128).
  EXPECT_FALSE(misfit([](auto& q) {
    q.k = 7168 + 16, q.a_stride_m = q.b_stride_n = 7184, q.a_block_scale_stride = 57;
    q.b_block_scale_stride_e = 32 * 57, q.b_stride_e = 4096 * 7184;
  }));
  EXPECT_TRUE(misfit([](auto& q) {  // the scales still 56 a row
    q.k = 7168 + 16, q.a_stride_m = q.b_stride_n = 7184, q.b_stride_e = 4096 * 7184;
  }));
  EXPECT_FALSE(misfit([](auto& q) {
    q.n = 192, q.out_stride_m = 192, q.b_stride_e = 192 * 7168, q.b_block_scale_stride_e = 2 * 56;
  }));
  EXPECT_TRUE(misfit([](auto& q) {  // a weight's 2 n blocks of scales would overlap the next's
    q.n = 192, q.out_stride_m = 192, q.b_stride_e = 192 * 7168, q.b_block_scale_stride_e = 56;
  }));
  EXPECT_TRUE(misfit([](auto& q) { q.a_block_scale_stride = 57; }));     // padded scale rows
  EXPECT_TRUE(misfit([](auto& q) { q.b_block_scale_stride_e = 100; }));  // weights' scales overlap
  EXPECT_FALSE(misfit([](auto& q) { q.b_block_scale_stride_e = 32 * 56 + 4; }));
  EXPECT_TRUE(misfit([](auto& q) {
    q.a_block_scale = reinterpret_cast<const float*>(reinterpret_cast<const char*>(scales) + 2);
  }));
  // The operands' own rules still hold (a row stride off 16 bytes).
  EXPECT_TRUE(misfit([](auto& q) { q.a_stride_m = 7176; }));
}
