// The grouped CUDA GEMMs of grouped_mm_bf16, grouped_mm_fp8 and SegmentGEMMWrapper.run.
//
// grouped_mma_kernel (aligned operands): tensor cores. A CTA owns a 128 x 128 tile of one
// group's output (grouped_gemm_shape.h: the tiling, and how a CTA finds its group from
// m_indptr); A and B tiles move global -> shared with 16-byte cp.async (zero-filled past the
// group's rows, n and k) in kGmmStages stages, into the permuted layout; operands reach
// mma.sync m16n8k16 through ldmatrix; fp32 accumulation, alpha and one rounding at the end.
// FP8 operands are copied as bytes, then each thread converts the chunks it copied to fp16
// (exact: every e4m3 and e5m2 value is an fp16 value) into one 16-bit tile, so the same MMA
// serves them. A 16-bit b with unit n stride (row-major segment weights) is kept [k][n] and read
// through the transposing ldmatrix.
//
// grouped_mm_simple_kernel (any strides, the fallback and the tests' second opinion): one output
// per thread, fp32 sum over k in order, one rounding.
#include <atomic>
#include <type_traits>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/device/mma.cuh"
#include "kernels/cuda/device/permuted_smem.cuh"
#include "kernels/cuda/grouped_gemm_cuda.h"
#include "kernels/cuda/grouped_gemm_cutlass.h"
#include "kernels/cuda/grouped_gemm_shape.h"
#include "kernels/moe_cutlass_fp8_rules.h"

namespace flashinfer::kernels::cuda {
namespace {

using namespace grouped;

// ---- the CUDA-core kernel --------------------------------------------------------------------

constexpr int kTile = 16;

// The group whose [m_indptr[e], m_indptr[e+1]) holds row r, or -1. With empty groups (equal
// neighbours) the search ends on the last group starting at or before r, the non-empty one.
// Whatever m_indptr holds (the host does not check it on CUDA), the result is -1 or a group in
// [0, groups), and the kernel touches only row r < cum_m.
__device__ int64_t group_of(const int32_t* indptr, int64_t groups, int64_t r) {
  if (groups <= 0 || r < indptr[0] || r >= indptr[groups]) return -1;
  int64_t lo = 0, hi = groups;  // indptr[lo] <= r < indptr[hi]
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (indptr[mid] <= r) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

template <class TA, class TB, class TO>
__global__ void __launch_bounds__(kTile* kTile) grouped_mm_simple_kernel(GroupedMmCudaParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.y) * kTile + threadIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  if (i >= p.cum_m || j >= p.n) return;
  const int64_t g = group_of(p.m_indptr, p.num_groups, i);
  if (g < 0) return;
  const int64_t e = p.b_index != nullptr ? p.b_index[g] : g;
  const auto* a = static_cast<const TA*>(p.a) + i * p.a_stride_m;
  const auto* b = static_cast<const TB*>(p.b) + e * p.b_stride_e + j * p.b_stride_n;
  float acc = 0.0f;
  for (int64_t kk = 0; kk < p.k; ++kk) {
    acc += to_f32(a[kk * p.a_stride_k]) * to_f32(b[kk * p.b_stride_k]);
  }
  if (p.alpha != nullptr) acc *= p.alpha[p.alpha_per_weight ? e : 0];
  static_cast<TO*>(p.out)[i * p.out_stride_m + j * p.out_stride_n] = from_f32<TO>(acc);
}

// ---- the tensor-core kernel ------------------------------------------------------------------

// Which tile a CTA computes (found by warp 0, read by all).
struct TileInfo {
  int32_t found, row0, rows, weight;
};

// Warp 0: the (group, m tile) of slot `slot` (grouped_gemm_shape.h). Lane l counts the m tiles
// of group c + l; a prefix sum over the warp gives each group's first slot.
__device__ void find_tile(const GroupedMmCudaParams& p, int64_t slot, int lane, TileInfo* t) {
  constexpr unsigned kAll = 0xffffffffu;
  int64_t before = 0;
  for (int64_t c = 0; c < p.num_groups; c += 32) {
    const int64_t g = c + lane;
    int64_t tiles = 0, begin = 0, end = 0;
    if (g < p.num_groups) {
      const GmmGroup rows = gmm_group_rows(p.m_indptr[g], p.m_indptr[g + 1], p.cum_m);
      begin = rows.begin;
      end = rows.end;
      tiles = gmm_m_tiles(end - begin);
    }
    int64_t incl = tiles;
    FLASHINFER_UNROLL
    for (int off = 1; off < 32; off <<= 1) {
      const int64_t v = __shfl_up_sync(kAll, incl, off);
      if (lane >= off) incl += v;
    }
    const int64_t mt = gmm_slot_in_group(slot, before + incl - tiles, tiles);
    const unsigned hit = __ballot_sync(kAll, mt >= 0);
    if (hit != 0) {
      if (lane == __ffs(static_cast<int>(hit)) - 1) {
        const GmmRows r = gmm_tile_rows(begin, end, mt);
        t->found = 1;
        t->row0 = static_cast<int32_t>(r.row0);
        t->rows = static_cast<int32_t>(r.rows);
        t->weight = static_cast<int32_t>(p.b_index != nullptr ? p.b_index[g] : g);
      }
      return;
    }
    before += __shfl_sync(kAll, incl, 31);
  }
  if (lane == 0) t->found = 0;
}

// Sixteen fp8 values (one 16-byte chunk) as sixteen fp16 values (two chunks).
__device__ __forceinline__ void fp8x16_to_f16(const uint4& in, bool e5m2, uint4& lo, uint4& hi) {
  const __nv_fp8_interpretation_t kind = e5m2 ? __NV_E5M2 : __NV_E4M3;
  const uint32_t w[4] = {in.x, in.y, in.z, in.w};
  uint32_t h[8];
  FLASHINFER_UNROLL
  for (int i = 0; i < 4; ++i) {
    FLASHINFER_UNROLL
    for (int j = 0; j < 2; ++j) {
      const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>((w[i] >> (16 * j)) & 0xffffu), kind);
      h[2 * i + j] = static_cast<uint32_t>(r.x) | (static_cast<uint32_t>(r.y) << 16);
    }
  }
  lo = make_uint4(h[0], h[1], h[2], h[3]);
  hi = make_uint4(h[4], h[5], h[6], h[7]);
}

template <class TO>
__device__ __forceinline__ void store_pair(TO* dst, float v0, float v1) {
  if constexpr (::cuda::std::is_same_v<TO, float>) {
    *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
  } else if constexpr (::cuda::std::is_same_v<TO, __half>) {
    *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(v0, v1);
  } else {
    *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v0, v1);
  }
}

// T: the MMA's element type (bf16 or fp16). kFp8: a and b hold fp8 (p.in_dtype, p.b_dtype:
// e4m3 or e5m2), converted to fp16 (T = __half) in shared memory. kBNMajor (16-bit only): b's
// n stride is 1 (SegmentGEMMWrapper's row-major [d_in, d_out] weights), so its tile is stored
// [k][n] and read through the transposing ldmatrix, as the prefill kernel reads V.
// kBlockScale (fp8, k-major b): DeepSeek's 128 x 128 block scales (p.a_block_scale,
// p.b_block_scale): the MMAs of each 128-wide k block (two k tiles) go to a second set of
// accumulators, promoted into the sum at the block's end (moe_fp8_block_accumulate: the CPU
// reference's and the GEMV route's arithmetic); the two sets take the registers of the second
// block an SM, hence one.
template <class T, bool kFp8, bool kBNMajor, class TO, bool kBlockScale = false>
__global__ void __launch_bounds__(kGmmThreads, kBlockScale ? 1 : 2)
    grouped_mma_kernel(GroupedMmCudaParams p) {
  static_assert(!(kFp8 && kBNMajor), "n-major B is for 16-bit operands");
  static_assert(!kBlockScale || (kFp8 && !kBNMajor), "block scales: fp8, k-major B");
  static_assert(!kBlockScale || (kGmmTileN == 128 && 2 * kGmmTileK == 128),
                "a tile's columns are one 128-row n block of the weight; two k tiles a k block");
  extern __shared__ __align__(128) unsigned char smem[];  // 128: permuted_lane_base
  __shared__ TileInfo tile;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const unsigned slot = p.slots_along_y ? blockIdx.y : blockIdx.x;
  const unsigned n_tile = p.slots_along_y ? blockIdx.x : blockIdx.y;
  if (warp == 0) find_tile(p, slot, lane, &tile);
  __syncthreads();
  if (!tile.found) return;
  const int64_t row0 = tile.row0, n0 = static_cast<int64_t>(n_tile) * kGmmTileN;
  const int rows = tile.rows;
  const int cols = static_cast<int>(p.n - n0 < kGmmTileN ? p.n - n0 : kGmmTileN);
  const int64_t k = p.k;
  const int ktiles = static_cast<int>((k + kGmmTileK - 1) / kGmmTileK);

  constexpr int kElem = kFp8 ? 1 : 2;
  const auto* a_base = static_cast<const unsigned char*>(p.a) + row0 * p.a_stride_m * kElem;
  const auto* b_base = static_cast<const unsigned char*>(p.b) +
                       (tile.weight * p.b_stride_e + n0 * p.b_stride_n) * kElem;
  // b's shared-memory rows: n (k-major b) or k (n-major b).
  const int64_t a_row_bytes = p.a_stride_m * kElem,
                b_row_bytes = (kBNMajor ? p.b_stride_k : p.b_stride_n) * kElem;
  constexpr uint32_t kBTileByte = kGmmTileM * kGmmTileK * kElem;  // B's tile within a stage

  // Copies of k tile kt into stage st: 16-bit operands straight into the permuted tiles (8
  // chunks a row, thread t takes column t % 8 of rows t / 8 + 32 i); fp8 into the stage's plain
  // byte rows (4 chunks a row, column t % 4 of rows t / 4 + 64 i).
  constexpr int kChunkCols = kFp8 ? 4 : 8, kRowStep = kGmmThreads / kChunkCols;
  constexpr int kPerThread = kGmmTileM / kRowStep;
  const int ccol = tid % kChunkCols, crow = tid / kChunkCols;
  constexpr int kStageBytes = kGmmTileRows * kGmmTileK * kElem;
  auto load_tile = [&](int st, int kt) {
    const int64_t kbyte = (static_cast<int64_t>(kt) * kGmmTileK + ccol * (16 / kElem)) * kElem;
    const bool kin = kbyte < k * kElem;
    unsigned char* stage = smem + st * kStageBytes;
    FLASHINFER_UNROLL
    for (int i = 0; i < kPerThread; ++i) {
      const int r = crow + i * kRowStep;
      const uint32_t dst = kFp8 ? static_cast<uint32_t>(r * kGmmTileK + ccol * 16)
                                : 16u * dev::permuted_offset(r, ccol, kGmmUnits);
      const bool a_ok = kin && r < rows;
      dev::cp_async::copy16_zfill(stage + dst, a_ok ? a_base + r * a_row_bytes + kbyte : a_base,
                                  a_ok);
      if constexpr (!kBNMajor) {
        const bool b_ok = kin && r < cols;
        dev::cp_async::copy16_zfill(stage + kBTileByte + dst,
                                    b_ok ? b_base + r * b_row_bytes + kbyte : b_base, b_ok);
      }
    }
    if constexpr (kBNMajor) {
      // [k][n]: 64 rows of 16 chunks (n % 8 == 0, so a chunk is inside n or past it); thread t
      // takes column t % 16 of rows t / 16 + 16 i.
      constexpr int kBRowStep = kGmmThreads / kGmmUnitsN;
      const int bcol = tid % kGmmUnitsN, brow = tid / kGmmUnitsN;
      const int krow = kt * kGmmTileK + brow;  // k < 2^31 (mma_layout)
      const unsigned char* src = b_base + krow * b_row_bytes + bcol * 16;
      FLASHINFER_UNROLL
      for (int i = 0; i < kGmmTileK / kBRowStep; ++i) {
        const bool b_ok = krow + i * kBRowStep < k && bcol * 8 < cols;
        dev::cp_async::copy16_zfill(
            stage + kBTileByte + 16u * dev::permuted_offset(brow + i * kBRowStep, bcol, kGmmUnitsN),
            b_ok ? src + i * kBRowStep * b_row_bytes : b_base, b_ok);
      }
    }
  };

  // FP8: the chunks this thread copied into stage st, as fp16 into the 16-bit tile.
  unsigned char* const conv = smem + kGmmStages * kStageBytes;
  auto convert_tile = [&](int st) {
    const unsigned char* stage = smem + st * kStageBytes;
    const bool a5 = p.in_dtype == DType::kFloat8E5M2, b5 = p.b_dtype == DType::kFloat8E5M2;
    FLASHINFER_UNROLL
    for (int i = 0; i < kPerThread; ++i) {
      const int r = crow + i * kRowStep;
      FLASHINFER_UNROLL
      for (int op = 0; op < 2; ++op) {
        const int src_row = op * kGmmTileM + r;
        const uint4 in = *reinterpret_cast<const uint4*>(stage + src_row * kGmmTileK + ccol * 16);
        uint4 lo, hi;
        fp8x16_to_f16(in, op == 0 ? a5 : b5, lo, hi);
        auto* dst = reinterpret_cast<uint4*>(conv);
        dst[dev::permuted_offset(src_row, 2 * ccol, kGmmUnits)] = lo;
        dst[dev::permuted_offset(src_row, 2 * ccol + 1, kGmmUnits)] = hi;
      }
    }
  };

  // Fragment bases (grouped_gemm_shape.h): A rows of the warp's 64-row block, B rows (k-major)
  // or columns (n-major) of its 32-column block.
  const int wm = warp / kGmmWarpsN, wn = warp % kGmmWarpsN;
  const uint32_t a_lane = gmm_a_lane_base(dev::cp_async::smem_addr(kFp8 ? conv : smem), wm, lane);
  // (the 16-bit tiles: B after A's 128 rows of 8 units; for fp8, in the converted tile)
  const uint32_t b_tile =
      dev::cp_async::smem_addr((kFp8 ? conv : smem) + kGmmTileM * kGmmUnits * 16);
  const uint32_t b_lane =
      kBNMajor ? gmm_bn_lane_base(b_tile, wn, lane) : gmm_bk_lane_base(b_tile, wn, lane);
  constexpr int kMmaM = kGmmWarpTileM / 16, kMmaN = kGmmWarpTileN / 8;
  // m16 fragments of the warp holding rows of the tile (warp-uniform; 0 to kMmaM): a small
  // group's tile (MoE decode: a few rows an expert) skips the MMAs and A loads of its zero rows.
  const int m_frags = gmm_warp_m_frags(rows, wm);
  float acc[kMmaM][kMmaN][4];
  // Block scales: the current k block's dot products (the MMAs' accumulators), promoted into acc
  // at the block's end. Without them the MMAs accumulate into acc itself.
  float part[kBlockScale ? kMmaM : 1][kBlockScale ? kMmaN : 1][4];
  // ... and the k block's scales: the weight block's and this thread's rows' (loaded with the
  // block's first k tile, so that their latency hides under its MMAs, not after them).
  [[maybe_unused]] float blk_ws = 0.0f;
  [[maybe_unused]] float blk_as[kBlockScale ? kMmaM : 1][2];
  FLASHINFER_UNROLL
  for (int mi = 0; mi < kMmaM; ++mi) {
    FLASHINFER_UNROLL
    for (int ni = 0; ni < kMmaN; ++ni) {
      FLASHINFER_UNROLL
      for (int c = 0; c < 4; ++c) {
        acc[mi][ni][c] = 0.0f;
        if constexpr (kBlockScale) part[mi][ni][c] = 0.0f;
      }
    }
  }
  auto mma_acc = [&](int mi, int ni) -> float(&)[4] {
    if constexpr (kBlockScale) {
      return part[mi][ni];
    } else {
      return acc[mi][ni];
    }
  };

  FLASHINFER_UNROLL
  for (int s = 0; s < kGmmStages - 1; ++s) {
    if (s < ktiles) load_tile(s, s);
    dev::cp_async::commit();
  }
#pragma unroll 1
  for (int kt = 0; kt < ktiles; ++kt) {
    dev::cp_async::wait<kGmmStages - 2>();  // tile kt landed (this thread's copies)
    __syncthreads();  // everyone's copies visible; everyone done with tile kt - 1
    const int st = kt % kGmmStages;
    if (kt + kGmmStages - 1 < ktiles) {
      load_tile((kt + kGmmStages - 1) % kGmmStages, kt + kGmmStages - 1);  // into tile kt-1's
    }
    dev::cp_async::commit();
    if constexpr (kBlockScale) {
      if ((kt & 1) == 0) {  // a k block's first tile (128 columns: two k tiles)
        const int64_t kb = kt / 2, k_blocks = (k + 127) / 128;
        blk_ws =
            p.b_block_scale[tile.weight * p.b_block_scale_stride_e + (n0 / 128) * k_blocks + kb];
        FLASHINFER_UNROLL
        for (int mi = 0; mi < kMmaM; ++mi) {
          FLASHINFER_UNROLL
          for (int h = 0; h < 2; ++h) {
            const int r = wm * kGmmWarpTileM + mi * 16 + lane / 4 + 8 * h;
            blk_as[mi][h] = mi < m_frags && r < rows
                                ? p.a_block_scale[(row0 + r) * p.a_block_scale_stride + kb]
                                : 0.0f;
          }
        }
      }
    }
    uint32_t stage_off = 0;
    if constexpr (kFp8) {
      convert_tile(st);
      __syncthreads();
    } else {
      stage_off = static_cast<uint32_t>(st * kStageBytes);
    }
    FLASHINFER_UNROLL
    for (int kk = 0; kk < kGmmTileK / 16; ++kk) {
      uint32_t af[kMmaM][4];
      FLASHINFER_UNROLL
      for (int mi = 0; mi < kMmaM; ++mi) {
        if (mi < m_frags) {
          dev::mma::ldmatrix_x4(
              af[mi], dev::permuted_frag_addr(a_lane + stage_off, mi * 16, kk * 2, kGmmUnits));
        }
      }
      FLASHINFER_UNROLL
      for (int nj = 0; nj < kMmaN / 2; ++nj) {
        uint32_t bf[4];  // k 0-7 / 8-15 of output columns nj * 16 + 0-7, then of + 8-15
        if constexpr (kBNMajor) {
          dev::mma::ldmatrix_x4_trans(
              bf, dev::permuted_frag_addr(b_lane + stage_off, kk * 16, nj * 2, kGmmUnitsN));
        } else {
          dev::mma::ldmatrix_x4(
              bf, dev::permuted_frag_addr(b_lane + stage_off, nj * 16, kk * 2, kGmmUnits));
        }
        FLASHINFER_UNROLL
        for (int mi = 0; mi < kMmaM; ++mi) {
          if (mi < m_frags) {
            dev::mma::mma_m16n8k16<T>(mma_acc(mi, 2 * nj), af[mi], bf);
            dev::mma::mma_m16n8k16<T>(mma_acc(mi, 2 * nj + 1), af[mi], bf + 2);
          }
        }
      }
    }
    if constexpr (kBlockScale) {
      // The k block ends with its second k tile, or with k: promote its dot products with the
      // row's a scale and the tile's weight block scale (a tile's 128 columns are one n block).
      if ((kt & 1) == 1 || kt == ktiles - 1) {
        FLASHINFER_UNROLL
        for (int mi = 0; mi < kMmaM; ++mi) {
          if (mi >= m_frags) continue;
          FLASHINFER_UNROLL
          for (int h = 0; h < 2; ++h) {
            const float as = blk_as[mi][h], ws = blk_ws;
            FLASHINFER_UNROLL
            for (int ni = 0; ni < kMmaN; ++ni) {
              FLASHINFER_UNROLL
              for (int c = 0; c < 2; ++c) {
                float& pv = part[mi][ni][2 * h + c];
                acc[mi][ni][2 * h + c] =
                    moe_fp8_block_accumulate(acc[mi][ni][2 * h + c], as, ws, pv);
                pv = 0.0f;
              }
            }
          }
        }
      }
    }
  }
  dev::cp_async::wait<0>();

  // Epilogue: the m16n8 accumulator layout (c0, c1: row lane / 4, columns 2 (lane % 4) + {0, 1};
  // c2, c3: 8 rows further), alpha, one rounding; column pairs stored together where out's rows
  // are contiguous and pair-aligned.
  const float alpha = p.alpha != nullptr ? p.alpha[p.alpha_per_weight ? tile.weight : 0] : 1.0f;
  auto* out = static_cast<TO*>(p.out);
  const bool pairs = p.out_stride_n == 1 && p.out_stride_m % 2 == 0 &&
                     reinterpret_cast<uintptr_t>(out) % (2 * sizeof(TO)) == 0;
  FLASHINFER_UNROLL
  for (int mi = 0; mi < kMmaM; ++mi) {
    FLASHINFER_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int r = wm * kGmmWarpTileM + mi * 16 + lane / 4 + 8 * h;
      if (r >= rows) continue;
      TO* orow = out + (row0 + r) * p.out_stride_m;
      FLASHINFER_UNROLL
      for (int ni = 0; ni < kMmaN; ++ni) {
        const int c = wn * kGmmWarpTileN + ni * 8 + 2 * (lane % 4);
        const float v0 = acc[mi][ni][2 * h] * alpha, v1 = acc[mi][ni][2 * h + 1] * alpha;
        const int64_t col = n0 + c;
        if (pairs && c + 1 < cols) {
          store_pair(orow + col, v0, v1);
        } else {
          if (c < cols) orow[col * p.out_stride_n] = from_f32<TO>(v0);
          if (c + 1 < cols) orow[(col + 1) * p.out_stride_n] = from_f32<TO>(v1);
        }
      }
    }
  }
}

// ---- launchers -------------------------------------------------------------------------------

bool is_fp8(DType d) { return d == DType::kFloat8E4M3FN || d == DType::kFloat8E5M2; }

enum class MmaLayout { kNone, kBKMajor, kBNMajor };

// Whether the tensor-core kernel takes these operands (grouped_gemm_shape.h): 16-bit pairs of one
// dtype or fp8 pairs, a with 16-byte aligned rows and unit k stride, b likewise (k-major) or,
// 16-bit only, with unit n stride and 16-byte aligned k rows (n-major), and a grid within CUDA's
// limits, on an sm80+ device (below it ldmatrix and mma.sync m16n8k16 do not exist; the CUDA-core
// kernel serves SegmentGEMMWrapper there, which no backend table guards).
MmaLayout mma_layout(const GroupedMmCudaParams& p) {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      major < 8) {
    return MmaLayout::kNone;
  }
  const bool fp8 = is_fp8(p.in_dtype) && is_fp8(p.b_dtype);
  const bool f16 =
      (p.in_dtype == DType::kBFloat16 || p.in_dtype == DType::kFloat16) && p.b_dtype == p.in_dtype;
  if (!fp8 && !f16) return MmaLayout::kNone;
  const int64_t elem = fp8 ? 1 : 2;
  if (!gmm_operand_aligned(reinterpret_cast<uintptr_t>(p.a), p.a_stride_m, p.a_stride_k, 0, p.k,
                           elem) ||
      gmm_slot_bound(p.cum_m, p.num_groups) > 0x7fffffff ||
      (p.n + kGmmTileN - 1) / kGmmTileN > 65535) {
    return MmaLayout::kNone;
  }
  const auto b = reinterpret_cast<uintptr_t>(p.b);
  if (gmm_operand_aligned(b, p.b_stride_n, p.b_stride_k, p.b_stride_e, p.k, elem)) {
    return MmaLayout::kBKMajor;
  }
  // n-major: the same rule with the roles of n and k swapped (rows along k, chunks along n).
  if (f16 && p.k <= 0x7fffffff - kGmmTileK &&
      gmm_operand_aligned(b, p.b_stride_k, p.b_stride_n, p.b_stride_e, p.n, elem)) {
    return MmaLayout::kBNMajor;
  }
  return MmaLayout::kNone;
}

// Raster: CTAs start in x-fastest order. With n tiles along x, the CTAs resident together are all
// n tiles of a few m tiles, so each m tile's a rows come from DRAM once and its weight tiles
// once; with slots along x (the first draft) every wave re-read every group's a rows (64 groups x
// 128 rows x k 7168: a read 32 times, half the DRAM traffic on an H200). Slots go along x only
// when there are more than y's limit of them.
void launch_mma(const GroupedMmCudaParams& params, MmaLayout layout, cudaStream_t s,
                const char* op) {
  GroupedMmCudaParams p = params;
  const int64_t slots = gmm_slot_bound(p.cum_m, p.num_groups);
  const int64_t n_tiles = (p.n + kGmmTileN - 1) / kGmmTileN;
  p.slots_along_y = slots <= 65535;
  const dim3 grid = p.slots_along_y
                        ? dim3(static_cast<unsigned>(n_tiles), static_cast<unsigned>(slots))
                        : dim3(static_cast<unsigned>(slots), static_cast<unsigned>(n_tiles));
  const bool fp8 = is_fp8(p.in_dtype), n_major = layout == MmaLayout::kBNMajor;
  const std::size_t smem = static_cast<std::size_t>(gmm_smem_bytes(fp8));
  dispatch_dtype<CudaElements, kBFloat16, kFloat16, kFloat32>(
      p.out_dtype, op, "out", [&]<class TO>() {
        auto go = [&]<class T, bool kFp8, bool kBNMajor>() {
          launch_kernel(op, grouped_mma_kernel<T, kFp8, kBNMajor, TO>, grid, dim3(kGmmThreads),
                        smem, s, false, p);
        };
        if (p.a_block_scale != nullptr) {  // grouped_mm_fp8_block_scaled: e4m3, k-major b
          // bf16 out only (grouped_mm_fp8_block_scaled_takes): DeepSeek's GEMMs write bf16, and
          // each out type is another 232-register instance to compile.
          if constexpr (std::is_same_v<TO, __nv_bfloat16>) {
            launch_kernel(op, grouped_mma_kernel<__half, true, false, TO, true>, grid,
                          dim3(kGmmThreads), smem, s, false, p);
          } else {
            FLASHINFER_FAIL(ErrorCode::kInternal, op, "out",
                            "the block-scaled grouped GEMM writes bf16 only");
          }
        } else if (fp8) {
          go.template operator()<__half, true, false>();
        } else if (p.in_dtype == DType::kFloat16) {
          if (n_major) {
            go.template operator()<__half, false, true>();
          } else {
            go.template operator()<__half, false, false>();
          }
        } else if (n_major) {
          go.template operator()<__nv_bfloat16, false, true>();
        } else {
          go.template operator()<__nv_bfloat16, false, false>();
        }
      });
}

void launch_simple(const GroupedMmCudaParams& p, cudaStream_t s, const char* op, const char* arg) {
  FLASHINFER_CHECK_CODE((p.cum_m + kTile - 1) / kTile <= 65535, ErrorCode::kUnsupported, op, arg,
                        "cum_m = ", p.cum_m,
                        " exceeds the CUDA grid's y limit (65535 tiles of 16 rows)");
  const dim3 grid(static_cast<unsigned>((p.n + kTile - 1) / kTile),
                  static_cast<unsigned>((p.cum_m + kTile - 1) / kTile));
  const dim3 block(kTile, kTile);
  auto run = [&]<class TA, class TB>() {
    dispatch_dtype<CudaElements, kBFloat16, kFloat16, kFloat32>(
        p.out_dtype, op, "out", [&]<class TO>() {
          launch_kernel(op, grouped_mm_simple_kernel<TA, TB, TO>, grid, block, 0, s, false, p);
        });
  };
  // 16-bit a: b of the same dtype; fp8 a: e4m3 or e5m2 b.
  dispatch_dtype<CudaElements, kBFloat16, kFloat16, kFloat8E4M3FN, kFloat8E5M2>(
      p.in_dtype, op, arg, [&]<class TA>() {
        if constexpr (sizeof(TA) == 2) {
          FLASHINFER_CHECK(p.b_dtype == p.in_dtype, op, arg, "the weights' dtype must be ",
                           dtype_name(p.in_dtype), ", got ", dtype_name(p.b_dtype));
          run.template operator()<TA, TA>();
        } else {
          dispatch_dtype<CudaElements, kFloat8E4M3FN, kFloat8E5M2>(
              p.b_dtype, op, "b", [&]<class TB>() { run.template operator()<TA, TB>(); });
        }
      });
}

std::atomic<uint64_t> g_cutlass_runs{0}, g_mma_runs{0}, g_simple_runs{0};

// CUTLASS's sm90 grouped GEMM first where the build has it and the call fits
// (grouped_gemm_cutlass.cu), then the mma.sync kernel, then the CUDA-core one.
void launch_grouped(const GroupedMmCudaParams& p, void* stream, const char* op, const char* arg) {
  if (p.cum_m == 0 || p.n == 0 || p.num_groups == 0) return;
#if FLASHINFER_WITH_CUTLASS
  if (cutlass_grouped_mm(p, stream, op)) {
    g_cutlass_runs.fetch_add(1, std::memory_order_relaxed);
    return;
  }
#endif
  const auto s = static_cast<cudaStream_t>(stream);
  if (const MmaLayout layout = mma_layout(p); layout != MmaLayout::kNone) {
    launch_mma(p, layout, s, op);
    g_mma_runs.fetch_add(1, std::memory_order_relaxed);
  } else {
    launch_simple(p, s, op, arg);
    g_simple_runs.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace

void grouped_mm_bf16(const GroupedMmCudaParams& p, void* stream) {
  launch_grouped(p, stream, "grouped_mm_bf16", "a");
}

void grouped_mm_fp8(const GroupedMmCudaParams& p, void* stream) {
  launch_grouped(p, stream, "grouped_mm_fp8", "a");
}

void segment_gemm(const GroupedMmCudaParams& p, void* stream) {
  launch_grouped(p, stream, "SegmentGEMMWrapper.run", "x");
}

bool grouped_mm_fp8_block_scaled_takes(const GroupedMmCudaParams& p) {
  return p.in_dtype == DType::kFloat8E4M3FN && p.b_dtype == DType::kFloat8E4M3FN &&
         p.out_dtype == DType::kBFloat16 && mma_layout(p) == MmaLayout::kBKMajor;
}

void grouped_mm_fp8_block_scaled(const GroupedMmCudaParams& p, void* stream) {
  const char* op = "cutlass_fused_moe";
  FLASHINFER_CHECK_CODE(p.a_block_scale != nullptr && p.b_block_scale != nullptr &&
                            p.alpha == nullptr && grouped_mm_fp8_block_scaled_takes(p),
                        ErrorCode::kInternal, op, "input",
                        "the block-scaled grouped GEMM takes e4m3 operands in the mma.sync "
                        "kernel's layout, both block scales and no alpha");
  if (p.cum_m == 0 || p.n == 0 || p.num_groups == 0) return;
#if FLASHINFER_WITH_CUTLASS
  // CUTLASS's block-scaled grouped GEMM on Hopper, where it is switched on and takes the call.
  if (cutlass_grouped_mm_fp8_block_scaled(p, stream, op)) {
    g_cutlass_runs.fetch_add(1, std::memory_order_relaxed);
    return;
  }
#endif
  launch_mma(p, MmaLayout::kBKMajor, static_cast<cudaStream_t>(stream), op);
  g_mma_runs.fetch_add(1, std::memory_order_relaxed);
}

GroupedMmRoutes grouped_mm_routes() {
  return {g_cutlass_runs.load(std::memory_order_relaxed),
          g_mma_runs.load(std::memory_order_relaxed),
          g_simple_runs.load(std::memory_order_relaxed)};
}

}  // namespace flashinfer::kernels::cuda
