// The FA2 prefill kernel's host-checkable decisions (src/kernels/cuda/prefill_shape.h), on the
// CPU: which head dims are built, the block and tile shapes and their shared memory, the tile
// masking rule against a brute-force visibility check, and the kernel's ldmatrix / mma.sync
// fragment addressing, run through an emulation of the two PTX instructions (their fragment
// layouts as the PTX ISA gives them) to compute S = Q K^T and O = P V exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/cuda_runtime.h"
#include "kernels/cuda/device/fastdiv.cuh"
#include "kernels/cuda/device/permuted_smem.cuh"
#include "kernels/cuda/prefill_shape.h"
#include "kernels/occupancy.h"
#include "util/mma_emulation.h"

#ifdef FLASHINFER_TEST_HAVE_CUDA_HEADERS
// fp8_widen.cuh's host path (cuda_fp8.h's types): the fp8 fragments' widening, as the kernel's.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wunused-function"
#include "kernels/cuda/device/fp8_widen.cuh"
#pragma GCC diagnostic pop
#include "flashinfer/float_formats.h"
#endif

namespace flashinfer::kernels::cuda::prefill {
namespace {

struct Dims {
  int qk, vo;
};
constexpr Dims kBuilt[] = {{64, 64}, {128, 128}, {256, 256}, {192, 128}};

TEST(PrefillShape, BuiltDimsAndBlockShapes) {
  for (Dims d : kBuilt) EXPECT_TRUE(prefill_dims_built(d.qk, d.vo)) << d.qk << "/" << d.vo;
  EXPECT_FALSE(prefill_dims_built(96, 96));    // the first-draft kernel through NVRTC
  EXPECT_FALSE(prefill_dims_built(128, 64));   // the CUDA-core kernel
  EXPECT_FALSE(prefill_dims_built(192, 192));  // ditto
  // Block heights as upstream picks cta_tile_q: 16 rows for packed queries up to 16 (head dims up
  // to 192, no ALiBi), 128 for long ones (plain variant, head dims up to 128), else 64.
  EXPECT_EQ(prefill_cta_rows(1, 128, 128, 0), 16);  // tensor-core decode, GQA group <= 16
  EXPECT_EQ(prefill_cta_rows(16, 128, 128, kPrefillSoftCap), 16);
  EXPECT_EQ(prefill_cta_rows(16, 192, 128, 0), 16);
  EXPECT_EQ(prefill_cta_rows(8, 64, 64, 0), 16);
  EXPECT_EQ(prefill_cta_rows(16, 128, 128, kPrefillCustomMask), 16);  // a verify's tree mask
  EXPECT_EQ(prefill_cta_rows(16, 192, 128, kPrefillCustomMask | kPrefillSoftCap), 16);
  EXPECT_EQ(prefill_cta_rows(16, 128, 128, kPrefillAlibi), 64);
  EXPECT_EQ(prefill_cta_rows(17, 128, 128, kPrefillCustomMask), 64);
  EXPECT_EQ(prefill_cta_rows(4, 256, 256, 0), 64);
  EXPECT_EQ(prefill_cta_rows(17, 128, 128, 0), 64);
  EXPECT_EQ(prefill_cta_rows(65, 128, 128, 0), 128);
  EXPECT_EQ(prefill_cta_rows(64, 128, 128, 0), 64);
  EXPECT_EQ(prefill_cta_rows(4096, 64, 64, 0), 128);
  EXPECT_EQ(prefill_cta_rows(4096, 256, 256, 0), 64);
  EXPECT_EQ(prefill_cta_rows(4096, 192, 128, 0), 64);
  EXPECT_EQ(prefill_cta_rows(4096, 128, 128, kPrefillSoftCap), 64);
  EXPECT_EQ(prefill_cta_rows(4096, 128, 128, kPrefillCustomMask), 64);
  EXPECT_EQ(prefill_mma_q(16), 1);
  EXPECT_EQ(prefill_mma_q(64), 1);
  EXPECT_EQ(prefill_mma_q(128), 2);
  EXPECT_EQ(prefill_warps_kv(16), 4);
  EXPECT_EQ(prefill_warps_kv(64), 1);
  EXPECT_EQ(prefill_warps_kv(128), 1);
  EXPECT_EQ(prefill_kv_tile(16, 128, 128), 64);  // 16 keys a warp
  EXPECT_EQ(prefill_kv_tile(16, 64, 64), 128);   // 32 keys a warp
  EXPECT_EQ(prefill_kv_tile(16, 192, 128), 64);
  EXPECT_EQ(prefill_kv_tile(64, 128, 128), 64);
  EXPECT_EQ(prefill_kv_tile(128, 128, 128), 64);  // upstream's 128 x 64
  EXPECT_EQ(prefill_kv_tile(128, 64, 64), 32);
  EXPECT_EQ(prefill_kv_tile(64, 256, 256), 32);
  EXPECT_EQ(prefill_kv_tile(64, 192, 128), 64);
  // Q tile + 2 stages of K and V tiles, 2 bytes an element (D 128 with 64 rows: 80 KiB), then the
  // K and V offsets (8 bytes each) of one tile's tokens, then (128-row blocks) 16 bytes for the
  // unmasked tile range.
  EXPECT_EQ(prefill_tile_bytes(64, 128, 128), 2u * (64 * 128 + 2 * 64 * 256));
  EXPECT_EQ(prefill_offset_cache_tokens(64, 128, 128), 64);
  EXPECT_EQ(prefill_smem_bytes(64, 128, 128), 2u * (64 * 128 + 2 * 64 * 256) + 16 * 64);
  EXPECT_EQ(prefill_smem_bytes(128, 128, 128), 2u * (128 * 128 + 2 * 64 * 256) + 16 * 64 + 16);
  EXPECT_EQ(prefill_smem_bytes(16, 128, 128), 2u * (16 * 128 + 2 * 64 * 256) + 16 * 64);
  EXPECT_EQ(prefill_smem_bytes(16, 64, 64), 2u * (16 * 64 + 2 * 128 * 128) + 16 * 128);
  // The merge buffer: 3 warps x 32 lanes x (64 O values + 2 maxima + 2 sums) floats at D 128.
  EXPECT_EQ(prefill_merge_bytes(16, 128), 4u * 3 * 32 * 68);
  EXPECT_EQ(prefill_merge_bytes(64, 128), 0u);
}

// Every block built fits one block's shared memory on an A100 and two per SM on an H100 (the
// planner's 2 blocks per SM; three at head dim 64 with 16-bit K/V, the kernel's register budget),
// the copy loops divide evenly over the 128 threads, the warps split a tile into whole 16-key
// steps, and a 16-row block's merge buffer fits in its K/V stages.
TEST(PrefillShape, SharedMemoryAndCopyShapesFit) {
  const DeviceLimits a100 = device_limits(8, 0), h100 = device_limits(9, 0);
  for (Dims d : kBuilt) {
    for (int cta : {16, 64, 128}) {
      if (cta != 64 && prefill_cta_rows(cta == 16 ? 1 : 4096, d.qk, d.vo, 0) != cta) continue;
      SCOPED_TRACE(std::to_string(d.qk) + "/" + std::to_string(d.vo) + " cta_q " +
                   std::to_string(cta));
      const unsigned smem = prefill_smem_bytes(cta, d.qk, d.vo);
      EXPECT_LE(smem, static_cast<unsigned>(a100.max_smem_per_block));
      EXPECT_GE(occupancy_blocks_per_sm(h100, kPrefillThreads, 168, smem), 2);
      // The blocks per SM the kernel's registers are budgeted for (its launch bounds: at most
      // 168 registers a thread for 3, 255 for 2) fit the shared memory as well.
      const int budget = prefill_min_blocks_per_sm(d.qk, d.vo, false);
      EXPECT_GE(occupancy_blocks_per_sm(h100, kPrefillThreads, budget == 3 ? 168 : 255, smem),
                budget);
      const int kv = prefill_kv_tile(cta, d.qk, d.vo);
      EXPECT_EQ(kv % (16 * prefill_warps_kv(cta)), 0);
      EXPECT_EQ(cta, (kPrefillWarps / prefill_warps_kv(cta)) * 16 * prefill_mma_q(cta));
      EXPECT_LE(prefill_merge_bytes(cta, d.vo), prefill_kv_stage_bytes(cta, d.qk, d.vo));
      for (int dim : {d.qk, d.vo}) {
        EXPECT_EQ(dim % 64, 0);  // whole 128-byte swizzle groups
        EXPECT_EQ((kv * dim / 8) % kPrefillThreads, 0);
        EXPECT_EQ((cta * dim / 8) % kPrefillThreads, 0);
      }
    }
  }
}

// The most shared memory a pair's blocks ask for, by hand (Q tile + 2 stages of K and V, 2 bytes
// an element), against the per-block opt-in limits: DeepSeek's 192 / 128 in 64-row blocks (64-key
// tiles) needs 105 KiB, more than sm_86 / sm_89 allow (99 KiB), so there it leaves the FA2 kernel.
TEST(PrefillShape, LargestBlockOfEachPairAndTheDevicesItFits) {
  EXPECT_EQ(prefill_max_smem_bytes(192, 128), 2u * (64 * 192 + 2 * 64 * 320) + 16 * 64);
  EXPECT_EQ(prefill_max_smem_bytes(256, 256), 2u * (64 * 256 + 2 * 32 * 512) + 16 * 32);
  EXPECT_EQ(prefill_max_smem_bytes(128, 128), 2u * (128 * 128 + 2 * 64 * 256) + 16 * 64 + 16);
  EXPECT_EQ(prefill_max_smem_bytes(64, 64), 2u * (16 * 64 + 2 * 128 * 128) + 16 * 128);
  const DeviceLimits a100 = device_limits(8, 0), ada = device_limits(8, 9),
                     h100 = device_limits(9, 0);
  for (Dims d : kBuilt) {
    SCOPED_TRACE(std::to_string(d.qk) + "/" + std::to_string(d.vo));
    EXPECT_LE(prefill_max_smem_bytes(d.qk, d.vo), static_cast<unsigned>(a100.max_smem_per_block));
    EXPECT_LE(prefill_max_smem_bytes(d.qk, d.vo), static_cast<unsigned>(h100.max_smem_per_block));
    EXPECT_EQ(prefill_max_smem_bytes(d.qk, d.vo) <= static_cast<unsigned>(ada.max_smem_per_block),
              !(d.qk == 192 && d.vo == 128));
  }
}

// The launcher's 128-row blocks only where two fit an SM (prefill_tall_blocks_fit), else 64-row
// ones: at head dim 128 the 128 x 64 block's 97 KiB (+ 1 KiB reserved) twice fit an H100, not an
// A100 or an sm_86 / sm_89 part. Wherever the launcher may swap heights, both take the same K/V
// tile, so the plan's chunk rounding (prefill_kv_tile of prefill_cta_rows' height) holds, and
// the 64-row block then fits twice an A100 SM.
TEST(PrefillShape, TallBlocksOnlyWhereTwoFitAnSm) {
  const DeviceLimits a100 = device_limits(8, 0), ga10x = device_limits(8, 6),
                     ada = device_limits(8, 9), h100 = device_limits(9, 0);
  auto fits = [](int dqk, int dvo, const DeviceLimits& l) {
    return prefill_tall_blocks_fit(dqk, dvo, l.smem_per_sm, l.reserved_smem_per_block);
  };
  EXPECT_TRUE(fits(128, 128, h100));
  EXPECT_FALSE(fits(128, 128, a100));
  EXPECT_FALSE(fits(128, 128, ga10x));
  EXPECT_FALSE(fits(128, 128, ada));
  for (const DeviceLimits& l : {a100, ga10x, ada, h100}) EXPECT_TRUE(fits(64, 64, l));
  // The rule is the occupancy calculator's at 255 registers (no more than 2 blocks of 128 threads
  // fit the registers anyway).
  for (Dims d : kBuilt) {
    if (prefill_cta_rows(4096, d.qk, d.vo, 0) != 128) continue;
    for (const DeviceLimits& l : {a100, ga10x, ada, h100}) {
      SCOPED_TRACE(std::to_string(d.qk) + " smem/SM " + std::to_string(l.smem_per_sm));
      const int tall =
          occupancy_blocks_per_sm(l, kPrefillThreads, 255, prefill_smem_bytes(128, d.qk, d.vo));
      EXPECT_EQ(fits(d.qk, d.vo, l), tall >= 2);
      if (!fits(d.qk, d.vo, l)) {
        EXPECT_EQ(prefill_kv_tile(128, d.qk, d.vo), prefill_kv_tile(64, d.qk, d.vo));
      }
    }
  }
  EXPECT_EQ(occupancy_blocks_per_sm(a100, kPrefillThreads, 255, prefill_smem_bytes(64, 128, 128)),
            2);
}

// The launcher's slices of a plan's work items (gridDim.y holds 65535): together every item once,
// the last slice launched first, each at most 65535 items; one slice for every plan below that.
TEST(PrefillShape, GridSlicesCoverThePlanLastFirst) {
  EXPECT_EQ(prefill_grid_slice(0, 0).count, 0);
  EXPECT_EQ(prefill_grid_slice(5, 0).first, 0);
  EXPECT_EQ(prefill_grid_slice(5, 0).count, 5);
  EXPECT_EQ(prefill_grid_slice(5, 1).count, 0);
  EXPECT_EQ(prefill_grid_slice(kPrefillMaxGridY, 0).count, kPrefillMaxGridY);
  EXPECT_EQ(prefill_grid_slice(kPrefillMaxGridY, 1).count, 0);
  // 65536 items: items 1..65535 first, then item 0 alone.
  EXPECT_EQ(prefill_grid_slice(65536, 0).first, 1);
  EXPECT_EQ(prefill_grid_slice(65536, 0).count, 65535);
  EXPECT_EQ(prefill_grid_slice(65536, 1).first, 0);
  EXPECT_EQ(prefill_grid_slice(65536, 1).count, 1);
  for (int n : {1, 100, 65534, 65535, 65536, 131070, 131071, 200000, 1 << 22}) {
    int covered_to = n, slices = 0;  // slices run from the end of the plan down to item 0
    for (int i = 0;; ++i) {
      const PrefillSlice sl = prefill_grid_slice(n, i);
      if (sl.count == 0) break;
      ASSERT_LE(sl.count, kPrefillMaxGridY);
      ASSERT_EQ(sl.first + sl.count, covered_to) << n;
      covered_to = sl.first;
      ++slices;
    }
    EXPECT_EQ(covered_to, 0) << n;
    EXPECT_EQ(slices, (n + kPrefillMaxGridY - 1) / kPrefillMaxGridY) << n;
  }
}

// The offset fill's token -> (page, slot) split: the page size of a paged cache, 1 for ragged K/V
// (token t is row t, slot 0), as the launcher builds it (FastDivmod of prefill_page_divisor) and
// the kernel names it.
TEST(PrefillShape, PageSplitDivisorIsThePageSizeOrOneWhenRagged) {
  EXPECT_EQ(prefill_page_divisor(true, 16), 16u);
  EXPECT_EQ(prefill_page_divisor(true, 1), 1u);
  EXPECT_EQ(prefill_page_divisor(false, 16), 1u);  // ragged: page_size is not read
  for (bool paged : {true, false}) {
    for (int page : {1, 5, 16, 64}) {
      const dev::FastDivmod built(prefill_page_divisor(paged, page));
      const dev::FastDivmod f =
          dev::FastDivmod::from_parts(prefill_page_divisor(paged, page), built.mul, built.shift);
      for (uint32_t t : {0u, 1u, 4u, 15u, 16u, 17u, 1000u, 123457u, 2147483647u}) {
        uint32_t pg = 0, slot = 0;
        f.divmod(t, pg, slot);
        const uint32_t d = paged ? static_cast<uint32_t>(page) : 1u;
        ASSERT_EQ(pg, t / d) << paged << " " << page << " " << t;
        ASSERT_EQ(slot, t % d);
      }
    }
  }
}

// The plain blocks' softmax takes the maximum over raw scores and scales inside the exponent
// (2^fma(s, c, -m)). With c > 0 the maximum of the rounded products is the rounded product of
// the maximum (rounding is monotonic), so m and the rescale factors are the numbers of the
// scale-first form, and each exponent differs from its by a product's rounding (an ulp of m at
// most: either form carries one; the sums and the LSE follow in their last bits); with c <= 0 the
// raw maximum is the wrong key (and -inf * 0 is NaN), and c = sm_scale log2(e) must stay finite,
// hence prefill_scale_folds.
TEST(PrefillShape, ScaleFoldedIntoTheExponentOnlyForPositiveScales) {
  constexpr float kLog2eF = 1.44269504088896341f;
  EXPECT_TRUE(prefill_scale_folds(0.0883883f, false, false));
  EXPECT_TRUE(prefill_scale_folds(1e-30f, false, false));
  EXPECT_FALSE(prefill_scale_folds(0.0f, false, false));
  EXPECT_FALSE(prefill_scale_folds(-0.125f, false, false));
  EXPECT_FALSE(prefill_scale_folds(std::numeric_limits<float>::quiet_NaN(), false, false));
  EXPECT_FALSE(prefill_scale_folds(std::numeric_limits<float>::infinity(), false, false));
  EXPECT_TRUE(prefill_scale_folds(2e38f, false, false));  // c = 2.9e38
  EXPECT_TRUE(std::isfinite(2e38f * kLog2eF));
  EXPECT_FALSE(prefill_scale_folds(3e38f, false, false));  // c would be +inf
  EXPECT_FALSE(std::isfinite(3e38f * kLog2eF));
  EXPECT_FALSE(prefill_scale_folds(0.125f, true, false));
  EXPECT_FALSE(prefill_scale_folds(0.125f, false, true));

  std::mt19937 rng(45);
  std::uniform_real_distribution<float> mag(-40.0f, 40.0f);
  std::uniform_real_distribution<float> scale_exp(-12.0f, 4.0f);
  for (int trial = 0; trial < 20000; ++trial) {
    const float c = std::exp2(scale_exp(rng)) * kLog2eF;  // sm_scale log2(e) > 0
    std::array<float, 64> raw{};
    for (float& x : raw) x = mag(rng) * std::exp2(static_cast<float>(trial % 7));
    if (trial % 3 == 0) raw[trial % 64] = -std::numeric_limits<float>::infinity();  // hidden key
    float m_first = -std::numeric_limits<float>::infinity();  // scale first, then the maximum
    float m_raw = -std::numeric_limits<float>::infinity();
    for (float x : raw) {
      m_first = std::max(m_first, x * c);
      m_raw = std::max(m_raw, x);
    }
    ASSERT_EQ(m_first, m_raw * c) << "trial " << trial;
    for (float x : raw) {
      const float p_first = std::exp2(x * c - m_first);
      const float p_fold = std::exp2(std::fma(x, c, -(m_raw * c)));
      // The maximum's own key: 2^(the product's rounding error), at most half an ulp of m.
      ASSERT_LE(p_fold, 1.0f + 1.2e-7f * std::max(1.0f, std::fabs(m_first)));
      ASSERT_NEAR(p_fold, p_first, 2e-6f * std::max(1.0f, std::fabs(m_first)) * p_first + 1e-37f)
          << "trial " << trial << " s " << x << " c " << c;
    }
  }
  // A negative scale makes the largest logit the smallest score's: the raw maximum is wrong.
  const float c = -1.0f;
  EXPECT_NE(std::max(2.0f * c, 3.0f * c), std::max(2.0f, 3.0f) * c);
  // A zero scale turns a hidden key's -inf into NaN inside the FFMA.
  EXPECT_TRUE(std::isnan(std::fma(-std::numeric_limits<float>::infinity(), 0.0f, -0.0f)));
}

// The launcher's block height (and the planner's tile rounding with it): prefill_cta_rows for
// 16-bit K/V; fp8 K/V the same but 64 rows where that says 128 (no 128-row fp8 block), so the
// planner's chunks end on the 64-row block's tiles (64 keys at head dim 64, not 32).
TEST(PrefillShape, LaunchedBlockHeightHasNoTallFp8Block) {
  for (int d : {64, 128, 256}) {
    for (int rows : {1, 16, 17, 64, 65, 128, 4096}) {
      for (int variant : {0, kPrefillSoftCap, kPrefillCustomMask, kPrefillAlibi}) {
        const int cta = prefill_cta_rows(rows, d, d, variant);
        EXPECT_EQ(prefill_launch_cta_rows(rows, d, d, variant, false), cta) << d << " " << rows;
        EXPECT_EQ(prefill_launch_cta_rows(rows, d, d, variant, true), cta == 128 ? 64 : cta)
            << d << " " << rows;
      }
    }
  }
  EXPECT_EQ(prefill_kv_tile(prefill_launch_cta_rows(4096, 64, 64, 0, false), 64, 64), 32);
  EXPECT_EQ(prefill_kv_tile(prefill_launch_cta_rows(4096, 64, 64, 0, true), 64, 64), 64);
}

// fp8 K/V (prefill_fp8_kv_built): instances for equal head dims 64 / 128 / 256 and every variant
// the 16-bit blocks have (prefill_variant_built: each bit alone, the soft cap with a custom mask;
// ALiBi with either goes to the CUDA-core kernel, for 16-bit K/V too), and nothing else
// (prefill_supported sends the rest to the CUDA-core kernel), in 16- and 64-row blocks (the
// launcher runs 64-row ones for 128-row work; masks and ALiBi have 64-row blocks only). 16-row
// blocks hold Q and kPrefillFp8Stages stages of fp8 K/V (widened in registers); 64-row blocks Q,
// one 16-bit K/V tile (what the warps read) and kPrefillStages fp8 stages (widened into it):
// either way the 16-bit blocks' bytes, so prefill_max_smem_bytes and the device checks hold for
// them unchanged. Their copy loop (one unit column a thread, DQK == DVO) and the 64-row blocks'
// widening (one fp8 unit a thread a pass) divide evenly over the 128 threads.
TEST(PrefillShape, Fp8KvInstancesAndTheirSharedMemory) {
  for (int v = 0; v < 8; ++v) {
    const bool alibi = (v & kPrefillAlibi) != 0;
    EXPECT_EQ(prefill_variant_built(v), !alibi || v == kPrefillAlibi) << v;
  }
  EXPECT_FALSE(prefill_variant_built(-1));
  EXPECT_FALSE(prefill_variant_built(8));
  for (int d : {64, 128, 256}) {
    EXPECT_TRUE(prefill_fp8_kv_built(d, d, 0)) << d;
    EXPECT_TRUE(prefill_fp8_kv_built(d, d, kPrefillSoftCap)) << d;
    EXPECT_TRUE(prefill_fp8_kv_built(d, d, kPrefillCustomMask)) << d;
    EXPECT_TRUE(prefill_fp8_kv_built(d, d, kPrefillSoftCap | kPrefillCustomMask)) << d;
    EXPECT_TRUE(prefill_fp8_kv_built(d, d, kPrefillAlibi)) << d;
    EXPECT_FALSE(prefill_fp8_kv_built(d, d, kPrefillAlibi | kPrefillSoftCap)) << d;
    EXPECT_FALSE(prefill_fp8_kv_built(d, d, kPrefillAlibi | kPrefillCustomMask)) << d;
    // A mask gets the 16-row block as the 16-bit one does (up to 16 packed rows, head dims up to
    // 192); ALiBi never.
    EXPECT_EQ(prefill_launch_cta_rows(1, d, d, kPrefillCustomMask, true), d <= 192 ? 16 : 64) << d;
    EXPECT_EQ(prefill_launch_cta_rows(1, d, d, kPrefillAlibi, true), 64) << d;
    EXPECT_EQ(prefill_launch_cta_rows(200, d, d, kPrefillAlibi, true), 64) << d;
  }
  EXPECT_FALSE(prefill_fp8_kv_built(192, 128, 0));  // built for 16-bit K/V only
  EXPECT_FALSE(prefill_fp8_kv_built(96, 96, 0));
  EXPECT_FALSE(prefill_fp8_kv_built(128, 64, 0));
  for (int d : {64, 128, 256}) {
    for (int cta : {16, 64}) {
      if (cta == 16 && prefill_cta_rows(1, d, d, 0) != 16) continue;
      SCOPED_TRACE(std::to_string(d) + " cta_q " + std::to_string(cta));
      const int kv = prefill_kv_tile(cta, d, d);
      const unsigned q_bytes = 2u * static_cast<unsigned>(cta * d);
      const unsigned fp8_bytes =
          cta == 16 ? q_bytes + static_cast<unsigned>(kPrefillFp8Stages * kv * 2 * d)
                    : q_bytes + 2u * static_cast<unsigned>(kv * 2 * d) +       // 16-bit tile
                          static_cast<unsigned>(kPrefillStages * kv * 2 * d);  // fp8 stages
      EXPECT_EQ(fp8_bytes, prefill_tile_bytes(cta, d, d));
      EXPECT_EQ(prefill_smem_bytes(cta, d, d),
                fp8_bytes + 16u * static_cast<unsigned>(kv));  // the offset cache
      EXPECT_LE(prefill_merge_bytes(cta, d), prefill_kv_stage_bytes(cta, d, d));
      EXPECT_EQ(kPrefillThreads % (d / 16), 0);
      EXPECT_EQ((kv * (d / 16)) % kPrefillThreads, 0);
    }
  }
}

// prefill_tile_unmasked says "no per-element test" only when every (row, key) of the tile is
// visible, and is exact for the causal / window-free case that matters (whole tiles under the
// diagonal skip the test).
TEST(PrefillShape, TileMaskingRuleAgreesWithBruteForce) {
  for (int window : {-1, 0, 5, 40}) {
    for (bool causal : {false, true}) {
      for (long long pos_min = 0; pos_min < 100; pos_min += 7) {
        for (long long rows = 1; rows <= 20; rows += 19) {
          const long long pos_max = pos_min + rows - 1;
          const long long kv_hi = causal ? pos_max + 1 : 150;
          for (long long t0 = 0; t0 < kv_hi; t0 += 16) {
            bool all = true;
            for (long long pos = pos_min; pos <= pos_max; ++pos) {
              for (long long j = t0; j < t0 + 16; ++j) {
                const bool vis =
                    j < kv_hi && (!causal || j <= pos) && (window < 0 || j >= pos - window);
                all = all && vis;
              }
            }
            const bool rule =
                prefill_tile_unmasked(t0, 16, kv_hi, causal, pos_min, pos_max, window, false);
            EXPECT_EQ(rule, all) << "t0 " << t0 << " pos " << pos_min << ".." << pos_max
                                 << " window " << window << " causal " << causal;
            EXPECT_FALSE(
                prefill_tile_unmasked(t0, 16, kv_hi, causal, pos_min, pos_max, window, true));
          }
        }
      }
    }
  }
}

// prefill_unmasked_tiles, the range of tiles the kernel tests its tiles against, picks exactly
// the tiles prefill_tile_unmasked passes, over blocks whose keys start anywhere, of every tile
// width, causal or not, with and without windows (the bounds' floor and ceiling divisions meet
// negative numerators: first rows before the block's keys, windows reaching before them).
TEST(PrefillShape, UnmaskedTileRangeMatchesTheTileTest) {
  long long checked = 0;
  for (int n : {16, 32, 64, 128}) {
    for (long long kv_lo = 0; kv_lo < 70; kv_lo += 3) {
      for (long long len = 0; len < 300; len += 7) {
        const long long kv_hi = kv_lo + len;
        const int tiles = static_cast<int>((len + n - 1) / n);
        for (bool causal : {false, true}) {
          for (long long pos_min = -5; pos_min < 400; pos_min += 13) {
            for (long long rows : {1LL, 2LL, 41LL, 131LL}) {
              const long long pos_max = pos_min + rows - 1;
              for (int window : {-1, 0, 5, 63, 64, 200}) {
                for (bool mask : {false, true}) {
                  const TileRange r = prefill_unmasked_tiles(kv_lo, kv_hi, n, causal, pos_min,
                                                             pos_max, window, mask);
                  for (int i = 0; i < tiles; ++i) {
                    const bool want =
                        prefill_tile_unmasked(kv_lo + static_cast<long long>(i) * n, n, kv_hi,
                                              causal, pos_min, pos_max, window, mask);
                    ++checked;
                    if ((r.lo <= i && i <= r.hi) != want) {
                      ADD_FAILURE() << "n " << n << " keys " << kv_lo << ".." << kv_hi << " causal "
                                    << causal << " pos " << pos_min << ".." << pos_max << " window "
                                    << window << " mask " << mask << " tile " << i << ": range "
                                    << r.lo << ".." << r.hi;
                      return;
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 60000000);  // 60825600
}

// prefill_item_window, the FA2 kernel's multi-item mask bits, against the row rule key by key
// (keys [0, a) and [lo, q]; delimiters' and prefix rows' empty second run at lo = INT32_MAX),
// over windows starting anywhere and every width; prefill_item_sees (the Hopper kernel's test of
// one key) against each bit, on the rows the plan builds; and prefill_item_row's packing.
TEST(PrefillShape, ItemWindowMatchesTheRowRule) {
  const int big = std::numeric_limits<int32_t>::max();
  long long checked = 0;
  for (int a = 0; a < 75; a += 2) {
    for (int lo : {0, 1, 5, 31, 32, 33, 40, 64, 70, big}) {
      for (int q = -1; q < 75; ++q) {
        for (int key0 = 0; key0 < 72; key0 += 3) {
          for (int nbits = 0; nbits <= 32; ++nbits) {
            uint32_t want = 0;
            for (int i = 0; i < nbits; ++i) {
              const int k = key0 + i;
              if (k < a || (k >= lo && k <= q)) want |= 1u << i;
            }
            ++checked;
            const uint32_t got = prefill_item_window(a, lo, q, key0, nbits);
            ASSERT_EQ(got, want) << "a " << a << " lo " << lo << " q " << q << " key0 " << key0
                                 << " nbits " << nbits;
            // The Hopper kernel's per-key test, on the rows the plan builds (a <= q + 1).
            if (a <= q + 1) {
              for (int i = 0; i < nbits; ++i) {
                ASSERT_EQ(prefill_item_sees(key0 + i, q, a, lo), ((got >> i) & 1u) != 0)
                    << "a " << a << " lo " << lo << " q " << q << " key " << key0 + i;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 7000000);
  // Near 2^31: positions and keys of a long request.
  // Keys big - 33 .. big - 2: those from big - 30 to big - 4 (bits 3 to 29).
  EXPECT_EQ(prefill_item_window(100, big - 30, big - 4, big - 33, 32), 0x3ffffff8u);
  const int32_t rows[] = {7, big, 12, 3};
  EXPECT_EQ(prefill_item_row(rows, 0), (static_cast<long long>(big) << 32) | 7);
  EXPECT_EQ(prefill_item_row(rows, 1), (3LL << 32) | 12);
  EXPECT_GE(prefill_item_row(rows, 0), 0);
}

// prefill_multi_item_tiles over random scoring prompts (a prefix, then items of random lengths,
// each after a delimiter at position 0), blocks of consecutive query positions, KV chunks
// starting anywhere and every tile width: no key a row of the block sees falls past the capped
// end or in a skipped tile, and the tiles taken are exactly the grid's tiles that hold a key
// below the prefix or in [pos_min - max_item_len, pos_max] (so the skip is as large as
// upstream's bound allows, and a mistaken gap cannot pass); max_item_len above the items' longest
// skips less, never wrongly.
TEST(PrefillShape, MultiItemTilesSkipOnlyKeysNoRowSees) {
  std::mt19937 rng(7);
  long long blocks = 0, skipped = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const long long prefix = std::uniform_int_distribution<int>(0, 150)(rng);
    std::vector<long long> pos;  // token_pos_in_items: 0 for each delimiter, then 1, 2, ...
    const int items = std::uniform_int_distribution<int>(1, 40)(rng);
    for (int it = 0; it < items; ++it) {
      const int len = std::uniform_int_distribution<int>(1, 30)(rng);
      for (int t = 0; t <= len; ++t) pos.push_back(t);
    }
    pos.push_back(0);  // the last delimiter
    const long long longest = *std::max_element(pos.begin(), pos.end());
    const long long kv_len = prefix + static_cast<long long>(pos.size());
    // Whether the query at position q sees key j (upstream's multi-item rule).
    auto sees = [&](long long q, long long j) {
      if (q < 0 || j > q) return false;
      if (q < prefix || j < prefix) return true;
      return j > q - pos[static_cast<std::size_t>(q - prefix)];
    };
    for (int n : {16, 32, 64, 128}) {
      for (long long extra : {0LL, 1LL, 37LL}) {
        const long long max_item = longest - 1 + extra;  // upstream allows t <= max_item_len + 1
        for (int blk = 0; blk < 6; ++blk) {
          const long long rows = std::uniform_int_distribution<int>(1, 128)(rng);
          const long long pos_min = std::uniform_int_distribution<long long>(-3, kv_len - 1)(rng);
          const long long pos_max = std::min(kv_len - 1, pos_min + rows - 1);
          const long long kv_lo = std::uniform_int_distribution<long long>(0, kv_len - 1)(rng);
          const long long kv_hi = std::uniform_int_distribution<long long>(kv_lo + 1, kv_len)(rng);
          const MultiItemTiles t =
              prefill_multi_item_tiles(kv_lo, kv_hi, n, pos_min, pos_max, prefix, max_item);
          ASSERT_EQ(t.kv_hi, std::min(kv_hi, pos_max + 1));
          const long long grid = (kv_hi - kv_lo + n - 1) / n;
          std::vector<bool> taken(static_cast<std::size_t>(grid), false);
          long long prev = -1;
          for (int i = 0; i < t.num_tiles; ++i) {
            const long long g = i + (i >= t.split ? t.skip : 0);
            ASSERT_GT(g, prev);
            ASSERT_LT(g, grid);
            taken[static_cast<std::size_t>(g)] = true;
            prev = g;
          }
          for (long long g = 0; g < grid; ++g) {
            const long long a = kv_lo + g * n, b = std::min(kv_hi, a + n);
            bool seen = false, wanted = false;
            for (long long j = a; j < b; ++j) {
              for (long long q = pos_min; q <= pos_max && !seen; ++q) seen = sees(q, j);
              wanted = wanted || (j <= pos_max && (j < prefix || j >= pos_min - max_item));
            }
            const bool took = taken[static_cast<std::size_t>(g)];
            if (seen) {
              ASSERT_TRUE(took) << "a seen tile skipped: trial " << trial << " n " << n;
            }
            ASSERT_EQ(took, wanted) << "trial " << trial << " n " << n << " tile " << g;
            skipped += took ? 0 : 1;
          }
          ++blocks;
        }
      }
    }
  }
  EXPECT_EQ(blocks, 300 * 4 * 3 * 6);
  EXPECT_GT(skipped, 10000);  // the gap and the causal cap do skip
}

// ---- ldmatrix and mma.sync, emulated ------------------------------------------------------------

using testing::mma_emu::Frag4;
using testing::mma_emu::half_of;
using testing::mma_emu::ldmatrix_x4;
using testing::mma_emu::mma;
using testing::mma_emu::Pair;
using testing::mma_emu::Smem;

// Small integers (exact in fp16, bf16 and fp64) for the emulated tiles: Q (row, col), K and V
// (key, col), and P (row, key) of the P V step.
double qv(int r, int c) { return static_cast<double>((r * 3 + c * 5) % 7 - 3); }
double kvv(int r, int c) { return static_cast<double>((r * 5 + c * 3) % 9 - 4); }
double vv(int r, int c) { return static_cast<double>((r * 7 + c) % 5 - 2); }
double pv(int r, int k) { return static_cast<double>((r + 2 * k) % 4 - 1); }

// O accumulator fragments (one per 8-wide column block; lane l, register e at row l / 4 +
// 8 (e >> 1), column 2 (l % 4) + (e & 1)) that differ from sum_k pv(row, k) vv(k, col) over
// `keys` keys.
int wrong_o_elements(const std::vector<std::array<std::array<double, 4>, 32>>& of, int keys) {
  int bad = 0;
  for (std::size_t n = 0; n < of.size(); ++n) {
    for (int l = 0; l < 32; ++l) {
      for (int e = 0; e < 4; ++e) {
        const int row = l / 4 + 8 * (e >> 1);
        const int col = static_cast<int>(n) * 8 + 2 * (l % 4) + (e & 1);
        double want = 0;
        for (int k = 0; k < keys; ++k) want += pv(row, k) * vv(k, col);
        bad += of[n][l][e] != want;
      }
    }
  }
  return bad;
}

// Every lane's ldmatrix address of one fragment: dev::permuted_frag_addr from each lane's base.
std::array<uint32_t, 32> frag_addrs(const std::array<uint32_t, 32>& base, uint32_t row_add,
                                    uint32_t col_even, uint32_t units) {
  std::array<uint32_t, 32> r{};
  for (int l = 0; l < 32; ++l) r[l] = dev::permuted_frag_addr(base[l], row_add, col_even, units);
  return r;
}

// The A operand of P V's key step j (keys 16 j .. 16 j + 15), packed from P in the S
// accumulators' layout (blocks 2 j and 2 j + 1) as the kernel packs it.
std::array<std::array<Pair, 4>, 32> p_operand(int j) {
  std::array<std::array<Pair, 4>, 32> a{};
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    auto p = [&](int blk, int e) { return pv(g + 8 * (e >> 1), blk * 8 + 2 * t + (e & 1)); };
    a[l][0] = {p(2 * j, 0), p(2 * j, 1)};
    a[l][1] = {p(2 * j, 2), p(2 * j, 3)};
    a[l][2] = {p(2 * j + 1, 0), p(2 * j + 1, 1)};
    a[l][3] = {p(2 * j + 1, 2), p(2 * j + 1, 3)};
  }
  return a;
}

// The kernel's S and PV loops for one warp's 16 rows and a 32-key tile, through its addressing
// (prefill_*_frag_lane, permuted_lane_base, permuted_frag_addr), against plain sums.
TEST(PrefillShape, FragmentAddressingComputesQKAndPV) {
  for (Dims dims : kBuilt) {
    SCOPED_TRACE(std::to_string(dims.qk) + "/" + std::to_string(dims.vo));
    const int dqk = dims.qk, dvo = dims.vo, keys = 32;
    const uint32_t uq = dqk / 8, uv = dvo / 8;
    const uint32_t q_base = 0, k_base = 16384, v_base = 49152;  // 128-byte aligned, disjoint
    Smem s;
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < dqk; ++c) s.put(q_base, r, c, uq, qv(r, c));
    for (int r = 0; r < keys; ++r) {
      for (int c = 0; c < dqk; ++c) s.put(k_base, r, c, uq, kvv(r, c));
      for (int c = 0; c < dvo; ++c) s.put(v_base, r, c, uv, vv(r, c));
    }
    std::array<uint32_t, 32> qa{}, ka{}, va{};
    for (int l = 0; l < 32; ++l) {
      qa[l] =
          dev::permuted_lane_base(q_base, prefill_q_frag_lane(l).row, prefill_q_frag_lane(l).c, uq);
      ka[l] =
          dev::permuted_lane_base(k_base, prefill_k_frag_lane(l).row, prefill_k_frag_lane(l).c, uq);
      va[l] =
          dev::permuted_lane_base(v_base, prefill_v_frag_lane(l).row, prefill_v_frag_lane(l).c, uv);
    }
    // S = Q K^T: s[n] holds keys 8n..8n+7.
    std::vector<std::array<std::array<double, 4>, 32>> sf(keys / 8);
    for (int kk = 0; kk < dqk / 16; ++kk) {
      const Frag4 a = ldmatrix_x4(s, frag_addrs(qa, 0, kk * 2, uq), false);
      for (int nk = 0; nk < keys / 16; ++nk) {
        const Frag4 b = ldmatrix_x4(s, frag_addrs(ka, nk * 16, kk * 2, uq), false);
        mma(sf[2 * nk], a, half_of(b, 0));
        mma(sf[2 * nk + 1], a, half_of(b, 2));
      }
    }
    int bad = 0;
    for (int n = 0; n < keys / 8; ++n) {
      for (int l = 0; l < 32; ++l) {
        for (int e = 0; e < 4; ++e) {
          const int row = l / 4 + 8 * (e >> 1), key = n * 8 + 2 * (l % 4) + (e & 1);
          double want = 0;
          for (int c = 0; c < dqk; ++c) want += qv(row, c) * kvv(key, c);
          bad += sf[n][l][e] != want;
        }
      }
    }
    EXPECT_EQ(bad, 0) << "S elements wrong";
    // O = P V with P in the S accumulator layout, packed as the kernel packs its A operand.
    std::vector<std::array<std::array<double, 4>, 32>> of(dvo / 8);
    for (int j = 0; j < keys / 16; ++j) {
      const std::array<std::array<Pair, 4>, 32> a = p_operand(j);
      for (int nd = 0; nd < dvo / 16; ++nd) {
        const Frag4 b = ldmatrix_x4(s, frag_addrs(va, j * 16, nd * 2, uv), true);
        mma(of[2 * nd], a, half_of(b, 0));
        mma(of[2 * nd + 1], a, half_of(b, 2));
      }
    }
    EXPECT_EQ(wrong_o_elements(of, keys), 0) << "O elements wrong";
  }
}

// A 16-row block: its 4 warps share the Q rows and take kv_tile / 4 keys each, from a lane base
// moved down by key_off rows. Every warp's S slice must be its own keys' scores, and the sum of
// the warps' P V partials (what the end-of-block merge adds up when the maxima agree) the whole
// tile's P V.
TEST(PrefillShape, WarpsAlongKeysCoverTheTile) {
  for (Dims dims : kBuilt) {
    if (prefill_cta_rows(1, dims.qk, dims.vo, 0) != 16) continue;
    SCOPED_TRACE(std::to_string(dims.qk) + "/" + std::to_string(dims.vo));
    const int dqk = dims.qk, dvo = dims.vo, keys = prefill_kv_tile(16, dqk, dvo);
    const int per_warp = keys / prefill_warps_kv(16);
    const uint32_t uq = dqk / 8, uv = dvo / 8;
    const uint32_t q_base = 0, k_base = 16384, v_base = 16384 + 2 * keys * dqk;
    Smem s;
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < dqk; ++c) s.put(q_base, r, c, uq, qv(r, c));
    for (int r = 0; r < keys; ++r) {
      for (int c = 0; c < dqk; ++c) s.put(k_base, r, c, uq, kvv(r, c));
      for (int c = 0; c < dvo; ++c) s.put(v_base, r, c, uv, vv(r, c));
    }
    std::vector<std::array<std::array<double, 4>, 32>> of(dvo / 8);  // summed over the warps
    int bad_s = 0;
    for (int w = 0; w < prefill_warps_kv(16); ++w) {
      const int key_off = w * per_warp;
      std::array<uint32_t, 32> qa{}, ka{}, va{};
      for (int l = 0; l < 32; ++l) {
        qa[l] = dev::permuted_lane_base(q_base, prefill_q_frag_lane(l).row,
                                        prefill_q_frag_lane(l).c, uq);
        ka[l] = dev::permuted_lane_base(k_base, key_off + prefill_k_frag_lane(l).row,
                                        prefill_k_frag_lane(l).c, uq);
        va[l] = dev::permuted_lane_base(v_base, key_off + prefill_v_frag_lane(l).row,
                                        prefill_v_frag_lane(l).c, uv);
      }
      std::vector<std::array<std::array<double, 4>, 32>> sf(per_warp / 8);
      for (int kk = 0; kk < dqk / 16; ++kk) {
        const Frag4 a = ldmatrix_x4(s, frag_addrs(qa, 0, kk * 2, uq), false);
        for (int nk = 0; nk < per_warp / 16; ++nk) {
          const Frag4 b = ldmatrix_x4(s, frag_addrs(ka, nk * 16, kk * 2, uq), false);
          mma(sf[2 * nk], a, half_of(b, 0));
          mma(sf[2 * nk + 1], a, half_of(b, 2));
        }
      }
      for (int n = 0; n < per_warp / 8; ++n) {
        for (int l = 0; l < 32; ++l) {
          for (int e = 0; e < 4; ++e) {
            const int row = l / 4 + 8 * (e >> 1);
            const int key = key_off + n * 8 + 2 * (l % 4) + (e & 1);
            double want = 0;
            for (int c = 0; c < dqk; ++c) want += qv(row, c) * kvv(key, c);
            bad_s += sf[n][l][e] != want;
          }
        }
      }
      for (int j = 0; j < per_warp / 16; ++j) {
        std::array<std::array<Pair, 4>, 32> a{};
        for (int l = 0; l < 32; ++l) {
          const int g = l / 4, t = l % 4;
          auto p = [&](int blk, int e) {
            return pv(g + 8 * (e >> 1), key_off + blk * 8 + 2 * t + (e & 1));
          };
          a[l][0] = {p(2 * j, 0), p(2 * j, 1)};
          a[l][1] = {p(2 * j, 2), p(2 * j, 3)};
          a[l][2] = {p(2 * j + 1, 0), p(2 * j + 1, 1)};
          a[l][3] = {p(2 * j + 1, 2), p(2 * j + 1, 3)};
        }
        for (int nd = 0; nd < dvo / 16; ++nd) {
          const Frag4 b = ldmatrix_x4(s, frag_addrs(va, j * 16, nd * 2, uv), true);
          mma(of[2 * nd], a, half_of(b, 0));
          mma(of[2 * nd + 1], a, half_of(b, 2));
        }
      }
    }
    EXPECT_EQ(bad_s, 0) << "S elements wrong";
    EXPECT_EQ(wrong_o_elements(of, keys), 0) << "O elements wrong";
  }
}

// permuted_frag_addr is permuted_offset in bytes, for every lane row, c, constant row step and
// even column the kernel uses.
TEST(PrefillShape, FragAddrIsThePermutedOffset) {
  for (uint32_t units : {8u, 16u, 24u, 32u}) {
    for (uint32_t row = 0; row < 16; ++row) {
      for (uint32_t c = 0; c < 2; ++c) {
        const uint32_t base = dev::permuted_lane_base(1024, row, c, units);
        for (uint32_t add = 0; add < 64; add += 8) {
          for (uint32_t col = 0; col + 1 < units; col += 2) {
            EXPECT_EQ(dev::permuted_frag_addr(base, add, col, units),
                      1024 + 16 * dev::permuted_offset(row + add, col + c, units))
                << units << " " << row << " " << c << " " << add << " " << col;
          }
        }
      }
    }
  }
}

// The custom-mask window equals the bit-by-bit reading of the packed mask (bit i = bit i % 32 of
// word i / 32) for every start offset and length, and reads no word past the one holding the
// last key: the words live in a heap block of exactly that many words, so the sanitized build
// (scripts/test) reports a read past it.
TEST(PrefillShape, MaskWindowIsTheRowsBits) {
  std::vector<uint32_t> all(8);
  uint32_t x = 0x9e3779b9u;
  for (uint32_t& w : all) w = (x = x * 1664525u + 1013904223u);
  auto bit = [&](long long i) { return (all[static_cast<size_t>(i >> 5)] >> (i & 31)) & 1u; };
  for (long long bit0 = 0; bit0 < 160; ++bit0) {
    for (int nbits = -1; nbits <= 32; ++nbits) {
      const size_t words = nbits > 0 ? static_cast<size_t>((bit0 + nbits - 1) >> 5) + 1 : 0;
      std::vector<uint32_t> exact(all.begin(), all.begin() + static_cast<long>(words));
      exact.shrink_to_fit();
      const uint32_t* data = exact.empty() ? nullptr : exact.data();
      const uint32_t got = prefill_mask_window(data, bit0, nbits);
      for (int k = 0; k < std::max(nbits, 0); ++k) {
        ASSERT_EQ((got >> k) & 1u, bit(bit0 + k)) << bit0 << " " << nbits << " " << k;
      }
      if (nbits <= 0) {
        EXPECT_EQ(got, 0u);
      }
    }
  }
}

#ifdef FLASHINFER_TEST_HAVE_CUDA_HEADERS
// ---- fp8 K/V widened in registers, emulated on the bytes ----------------------------------------

// Shared memory as bytes; ldmatrix moves 16-bit elements, so over fp8 data each one is a byte pair.
struct ByteSmem {
  std::vector<uint8_t> b = std::vector<uint8_t>(1 << 17, 0);
  uint32_t word(uint32_t addr) const {
    return static_cast<uint32_t>(b.at(addr)) | static_cast<uint32_t>(b.at(addr + 1)) << 8 |
           static_cast<uint32_t>(b.at(addr + 2)) << 16 |
           static_cast<uint32_t>(b.at(addr + 3)) << 24;
  }
  uint32_t half(uint32_t addr) const {
    return static_cast<uint32_t>(b.at(addr)) | static_cast<uint32_t>(b.at(addr + 1)) << 8;
  }
};
using Words4 = std::array<std::array<uint32_t, 4>, 32>;  // [lane][matrix]
// ldmatrix.x<n>: lanes 8j..8j+7 name the rows of matrix j; lane l gets row l / 4, elements
// 2 (l % 4), + 1 (a 32-bit word), or with .trans rows 2 (l % 4), + 1 of element l / 4.
Words4 ld_words(const ByteSmem& s, const std::array<uint32_t, 32>& addr, int n, bool trans) {
  Words4 r{};
  for (int l = 0; l < 32; ++l) {
    for (int j = 0; j < n; ++j) {
      r[l][j] = trans ? s.half(addr[8 * j + 2 * (l % 4)] + 2 * (l / 4)) |
                            s.half(addr[8 * j + 2 * (l % 4) + 1] + 2 * (l / 4)) << 16
                      : s.word(addr[8 * j + l / 4] + 4 * (l % 4));
    }
  }
  return r;
}

template <class T>
double t_bits_value(uint32_t bits16) {
  return std::is_same_v<T, __half>
             ? flashinfer::half_bits_to_float(static_cast<uint16_t>(bits16))
             : flashinfer::bfloat16_bits_to_float(static_cast<uint16_t>(bits16));
}
template <class T>
uint16_t t_bits_of(double x) {
  return std::is_same_v<T, __half> ? flashinfer::float_to_half_bits(static_cast<float>(x))
                                   : flashinfer::float_to_bfloat16_bits(static_cast<float>(x));
}
template <class T>
Pair pair_of(uint32_t w) {
  return {t_bits_value<T>(w & 0xffffu), t_bits_value<T>(w >> 16)};
}

// The fp8 instances' S and PV steps for one warp (prefill_kernel.cuh): Q's 16-bit tile reordered
// in place (prefill_fp8_q_words), K by the two-tile ldmatrix and V by the transposing four-tile
// one on fp8 tiles laid out by prefill_fp8_tile_offset and addressed through
// prefill_fp8_frag_lane, each word widened by fp8x4_widen (V's after fp8_trans_pairs), against
// plain sums over the decoded bytes; and the output columns the epilogue writes
// (prefill_o_pair_col). Keys from key_off on (a 16-row block's warp w from w times its keys).
template <class T, __nv_fp8_interpretation_t kKind>
void check_fp8_fragments(int d, int key_off, int keys) {
  SCOPED_TRACE("head dim " + std::to_string(d) + ", key_off " + std::to_string(key_off) +
               ", keys " + std::to_string(keys));
  const int tile_keys = key_off + keys;
  const uint32_t uq = d / 8, u8 = d / 16, line = prefill_fp8_line_units(u8);
  const uint32_t kpl = prefill_fp8_keys_per_line(u8);
  const uint32_t q_base = 0, k_base = 32768, v_base = 65536;  // 128-byte aligned, disjoint
  std::mt19937 rng(1234u + d + key_off);
  auto valid_code = [&]() {
    for (;;) {
      const auto c = static_cast<uint8_t>(rng());
      const bool bad = kKind == __NV_E4M3 ? (c & 0x7f) == 0x7f : ((c >> 2) & 0x1f) == 0x1f;
      if (!bad) return c;
    }
  };
  auto decode = [](uint8_t c) {
    return static_cast<double>(kKind == __NV_E4M3 ? flashinfer::e4m3fn_bits_to_float(c)
                                                  : flashinfer::e5m2_bits_to_float(c));
  };
  ByteSmem s;
  std::vector<uint8_t> kc(tile_keys * d), vc(tile_keys * d);
  for (int key = 0; key < tile_keys; ++key) {
    for (int c = 0; c < d; ++c) {
      kc[key * d + c] = valid_code();
      vc[key * d + c] = valid_code();
      const uint32_t at = 16 * prefill_fp8_tile_offset(key, c / 16, u8) + c % 16;
      s.b.at(k_base + at) = kc[key * d + c];
      s.b.at(v_base + at) = vc[key * d + c];
    }
  }
  // Q: 16 rows of 16-bit values, then reordered in place as the kernel does once per block.
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < d; ++c) {
      const uint16_t bits = t_bits_of<T>(qv(r, c));
      const uint32_t at = q_base + 16 * dev::permuted_offset(r, c / 8, uq) + 2 * (c % 8);
      s.b.at(at) = static_cast<uint8_t>(bits);
      s.b.at(at + 1) = static_cast<uint8_t>(bits >> 8);
    }
    for (int k = 0; k < d / 16; ++k) {
      const uint32_t lo = q_base + 16 * dev::permuted_offset(r, 2 * k, uq);
      const uint32_t hi = q_base + 16 * dev::permuted_offset(r, 2 * k + 1, uq);
      uint32_t w[8], o8[8];
      for (int i = 0; i < 4; ++i) {
        w[i] = s.word(lo + 4 * i);
        w[4 + i] = s.word(hi + 4 * i);
      }
      prefill_fp8_q_words(w, o8);
      for (int i = 0; i < 8; ++i) {
        for (int byte = 0; byte < 4; ++byte) {
          s.b.at((i < 4 ? lo + 4 * i : hi + 4 * (i - 4)) + byte) =
              static_cast<uint8_t>(o8[i] >> (8 * byte));
        }
      }
    }
  }
  std::array<uint32_t, 32> qa{}, ka{}, va{};
  for (int l = 0; l < 32; ++l) {
    const FragLane ql = prefill_q_frag_lane(l), f8 = prefill_fp8_frag_lane(l, u8);
    qa[l] = dev::permuted_lane_base(q_base, ql.row, ql.c, uq);
    ka[l] = dev::permuted_lane_base(k_base, key_off / kpl + f8.row, f8.c, line);
    va[l] = dev::permuted_lane_base(v_base, key_off / kpl + f8.row, f8.c, line);
  }
  // Every matrix's 8 rows on 8 distinct 16-byte bank groups (no conflict), each address the unit
  // it means.
  auto check_matrices = [&](const std::array<uint32_t, 32>& addr, int n, int key0, int unit0,
                            uint32_t base) {
    for (int j = 0; j < n; ++j) {
      std::array<bool, 8> seen{};
      for (int i = 0; i < 8; ++i) {
        const uint32_t a = addr[8 * j + i];
        EXPECT_FALSE(seen[(a / 16) % 8]) << "bank conflict, matrix " << j;
        seen[(a / 16) % 8] = true;
        const int key = key0 + (j % 2) * 8 + i, unit = unit0 + j / 2;
        EXPECT_EQ(a, base + 16 * prefill_fp8_tile_offset(key, unit, u8)) << "lane " << 8 * j + i;
      }
    }
  };
  // S: blocks of 8 keys from key_off.
  std::vector<std::array<std::array<double, 4>, 32>> sf(keys / 8);
  for (int kk = 0; kk < d / 16; ++kk) {
    const Words4 qw = ld_words(s, frag_addrs(qa, 0, kk * 2, uq), 4, false);
    std::array<std::array<Pair, 4>, 32> a{};
    for (int l = 0; l < 32; ++l)
      for (int j = 0; j < 4; ++j) a[l][j] = pair_of<T>(qw[l][j]);
    for (int nk = 0; nk < keys / 16; ++nk) {
      const auto addr = frag_addrs(ka, nk * 16 / kpl, kk, line);
      check_matrices(addr, 2, key_off + nk * 16, kk, k_base);
      const Words4 kw = ld_words(s, addr, 2, false);
      for (int blk = 0; blk < 2; ++blk) {
        std::array<std::array<Pair, 2>, 32> b{};
        for (int l = 0; l < 32; ++l) {
          const uint2 w = dev::fp8x4_widen<T, kKind>(kw[l][blk]);
          b[l] = {pair_of<T>(w.x), pair_of<T>(w.y)};
        }
        mma(sf[2 * nk + blk], a, b);
      }
    }
  }
  int bad = 0;
  for (int n = 0; n < keys / 8; ++n) {
    for (int l = 0; l < 32; ++l) {
      for (int e = 0; e < 4; ++e) {
        const int row = l / 4 + 8 * (e >> 1), key = key_off + n * 8 + 2 * (l % 4) + (e & 1);
        double want = 0;
        for (int c = 0; c < d; ++c) want += qv(row, c) * decode(kc[key * d + c]);
        bad += sf[n][l][e] != want;
      }
    }
  }
  EXPECT_EQ(bad, 0) << "S elements wrong";
  // O = P V, P packed from the S layout as the kernel packs it; blocks 2u (even dims), 2u + 1.
  std::vector<std::array<std::array<double, 4>, 32>> of(d / 8);
  for (int j = 0; j < keys / 16; ++j) {
    const std::array<std::array<Pair, 4>, 32> a = p_operand(j);
    for (int nd2 = 0; nd2 < d / 32; ++nd2) {
      const auto addr = frag_addrs(va, j * 16 / kpl, nd2 * 2, line);
      check_matrices(addr, 4, key_off + j * 16, 2 * nd2, v_base);
      const Words4 vw = ld_words(s, addr, 4, true);
      for (int h = 0; h < 2; ++h) {
        std::array<std::array<Pair, 2>, 32> be{}, bo{};
        for (int l = 0; l < 32; ++l) {
          const uint2 w0 = dev::fp8x4_widen<T, kKind>(dev::fp8_trans_pairs(vw[l][2 * h]));
          const uint2 w1 = dev::fp8x4_widen<T, kKind>(dev::fp8_trans_pairs(vw[l][2 * h + 1]));
          be[l] = {pair_of<T>(w0.x), pair_of<T>(w1.x)};
          bo[l] = {pair_of<T>(w0.y), pair_of<T>(w1.y)};
        }
        const int u = 2 * nd2 + h;
        mma(of[2 * u], a, be);
        mma(of[2 * u + 1], a, bo);
      }
    }
  }
  // The epilogue's view: pair n of row r, element c, at column prefill_o_pair_col(true, n, t) + c,
  // from block 2 (n / 2) + c, register 2 r + n % 2.
  bad = 0;
  std::vector<int> written(16 * d, 0);
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int r = 0; r < 2; ++r) {
      const int row = g + 8 * r;
      for (int n = 0; n < d / 8; ++n) {
        for (int c = 0; c < 2; ++c) {
          const int col = prefill_o_pair_col(true, n, t) + c;
          ++written.at(row * d + col);
          double want = 0;
          for (int k = 0; k < keys; ++k) want += pv(row, k) * decode(vc[(key_off + k) * d + col]);
          bad += of[2 * (n / 2) + c][l][2 * r + n % 2] != want;
        }
      }
    }
  }
  EXPECT_EQ(bad, 0) << "O elements wrong";
  EXPECT_TRUE(std::all_of(written.begin(), written.end(), [](int w) { return w == 1; }))
      << "every output element written once";
}

// Every warp of the 16-row blocks that widen in registers (its keys of a tile from its key
// offset), and a 64-key run at head dim 256 (no such block yet: the layout's 16-unit rows).
TEST(PrefillShape, Fp8FragmentsWidenedInRegistersComputeQKAndPV) {
  for (int d : {64, 128, 256}) {
    const bool built = prefill_cta_rows(1, d, d, 0) == 16;
    const int per_warp = built ? prefill_kv_tile(16, d, d) / prefill_warps_kv(16) : 64;
    for (int w = 0; w < (built ? prefill_warps_kv(16) : 1); ++w) {
      const int key_off = w * per_warp;
      check_fp8_fragments<__half, __NV_E4M3>(d, key_off, per_warp);
      check_fp8_fragments<__nv_bfloat16, __NV_E4M3>(d, key_off, per_warp);
      check_fp8_fragments<__half, __NV_E5M2>(d, key_off, per_warp);
      check_fp8_fragments<__nv_bfloat16, __NV_E5M2>(d, key_off, per_warp);
    }
  }
}

// The fp8 tiles' layout: a bijection of (key, unit) onto a tile's units, and the 16-bit order
// of the output pairs covers each column once.
TEST(PrefillShape, Fp8TileLayoutIsABijection) {
  for (unsigned units : {4u, 8u, 16u}) {
    const unsigned keys = 64;
    std::vector<int> hit(keys * units, 0);
    for (unsigned key = 0; key < keys; ++key)
      for (unsigned u = 0; u < units; ++u) ++hit.at(prefill_fp8_tile_offset(key, u, units));
    EXPECT_TRUE(std::all_of(hit.begin(), hit.end(), [](int h) { return h == 1; })) << units;
  }
  for (int dvo : {64, 128, 256}) {
    for (bool fp8 : {false, true}) {
      std::vector<int> col(dvo, 0);
      for (int t = 0; t < 4; ++t)
        for (int n = 0; n < dvo / 8; ++n)
          for (int c = 0; c < 2; ++c) ++col.at(prefill_o_pair_col(fp8, n, t) + c);
      EXPECT_TRUE(std::all_of(col.begin(), col.end(), [](int h) { return h == 1; })) << dvo;
    }
  }
}
#endif  // FLASHINFER_TEST_HAVE_CUDA_HEADERS

// The yardstick `flashinfer bench` prints prefill TFLOP/s against: the datasheets' dense 16-bit
// peaks come back from SMs x boost clock x the per-SM rate.
TEST(PrefillShape, DenseTensorPeakPerClock) {
  using flashinfer::detail::dense_16bit_tensor_flops_per_clock_per_sm;
  EXPECT_NEAR(132 * 1.83e9 * dense_16bit_tensor_flops_per_clock_per_sm(90), 989.4e12, 1e12);
  EXPECT_NEAR(108 * 1.41e9 * dense_16bit_tensor_flops_per_clock_per_sm(80), 312e12, 1e12);
  EXPECT_EQ(dense_16bit_tensor_flops_per_clock_per_sm(75), 0.0);  // unknown: no figure printed
}

}  // namespace
}  // namespace flashinfer::kernels::cuda::prefill
