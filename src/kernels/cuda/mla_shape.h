// The shape of the tensor-core MLA decode kernel (mla_decode_mma_kernel in mla_cuda.cu), as plain
// constexpr arithmetic shared by the kernel, its launcher and the CPU tests
// (tests/api/test_mla_shape.cpp).
//
// DeepSeek's latent attention has one KV "head" shared by every query head: a block takes one
// query row and 64 of its heads as the 64 rows of an m16n8k16 tile stack, and each 32-token tile
// of the latent cache (ckv 512 + kpe 64 dims, one 576-dim row a token) is the K operand of q.k and,
// its first 512 dims, the V operand of P.V, copied to shared memory once for all 64 heads. The
// output accumulator of 64 rows x 512 dims is too large for one warp's 16 rows (256 floats a
// thread), so 8 warps split it as 4 row groups x 2 halves of the dims (128 floats a thread), as
// upstream's Hopper MLA kernel splits it between two warpgroups. The two warps of a row group
// need the same scores: each computes q.k over half of the 576 dims for all 32 tokens (18 of the
// 36 k-steps, so each Q element is read from shared memory once a tile), and they add their
// halves through shared memory. IEEE addition is commutative, so both warps hold the same
// logits bit for bit, and from them the same maxima, probabilities and sums: each then needs only
// its own half of the dims of P.V.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashinfer/dtype.h"
#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels::cuda::mla {

constexpr int kMmaCkv = 512, kMmaKpe = 64, kMmaDim = kMmaCkv + kMmaKpe;  // dims
constexpr int kMmaUnits = kMmaDim / 8;     // 16-byte units of a 16-bit row: 72
constexpr int kMmaCkvUnits = kMmaCkv / 8;  // 64: a row's ckv part, then 8 units of kpe
constexpr int kMmaRows = 64;               // query heads of a block
constexpr int kMmaWarpsQ = 4, kMmaWarpsD = 2;
constexpr int kMmaWarps = kMmaWarpsQ * kMmaWarpsD;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kMmaKvTile = 32;                           // cache tokens per tile
constexpr int kMmaKSteps = kMmaDim / 16;                 // 16-dim steps of q.k: 36
constexpr int kMmaKStepsNope = kMmaCkv / 16;             // of which the ckv part: 32
constexpr int kMmaKStepsWarp = kMmaKSteps / kMmaWarpsD;  // a warp's share: 18
constexpr int kMmaVoDims = kMmaCkv / kMmaWarpsD;         // output dims of a warp: 256
constexpr int kMmaScoreFloats = kMmaKvTile / 8 * 4;      // a thread's S fragment floats: 16
static_assert(kMmaKSteps % kMmaWarpsD == 0, "the warps of a row group split q.k evenly");
static_assert(kMmaWarpsD == 2,
              "a row group's two warps (2 wq, 2 wq + 1) exchange halves (warp ^ 1)");

/// The first of the k-steps (16 dims each) of q.k that warp half `wd` (0 or 1) takes: 0 and 18.
/// Half 1's share holds the whole kpe part (steps 32-35), which it accumulates apart: the ckv and
/// kpe sums take different scales (ckv_scale, kpe_scale). A NoPE call (`rope` false: head_dim_kpe
/// 0, a NoPE model's MLA) has the 32 ckv steps only, 16 a half: 0 and 16.
FLASHINFER_HD constexpr int mla_mma_qk_step_begin(int wd, bool rope = true) {
  return wd * (rope ? kMmaKStepsWarp : kMmaKStepsNope / kMmaWarpsD);
}
/// The k-steps after the last one of half 0 (the ckv part's end for half 1); the kpe steps
/// (kMmaKStepsNope .. kMmaKSteps) are half 1's where the call has them.
FLASHINFER_HD constexpr int mla_mma_qk_ckv_step_end(int wd, bool rope = true) {
  return wd == 0 ? mla_mma_qk_step_begin(1, rope) : kMmaKStepsNope;
}

/// Query rows a block takes at once: calls of at most 32 heads fill the 64 MMA rows with the
/// heads of 64 / num_heads consecutive query rows of one request (MTP's draft tokens, a causal
/// chunk's queries), which then share every cache tile; larger head counts take one query row and
/// 64 of its heads a block.
FLASHINFER_HD constexpr int mla_mma_pack(int num_heads) {
  return num_heads >= 1 && num_heads <= kMmaRows / 2 ? kMmaRows / num_heads : 1;
}

/// The first output dim of warp half `wd`: a whole number of 8-unit swizzle groups (32 units), so
/// the lane's V fragment base moves by a plain offset (permuted_advance_col_groups).
FLASHINFER_HD constexpr int mla_mma_vo_dim_begin(int wd) { return wd * kMmaVoDims; }

/// Dynamic shared memory of a block with `stages` K/V stages: Q (64 rows), the stages (32 rows
/// each, 576 16-bit dims, permuted), the score exchange (16 floats a lane of each warp) and the
/// addresses of one tile's ckv and kpe rows. An fp8 cache (`fp8`) has its stages as stored
/// (576 bytes a row, in order) and one 16-bit tile that each stage is widened into, and room
/// for ckv_scale_arr: the addresses of one tile's rows of scales and, a stage, each token's 4
/// scales (kMmaScaleRowBytes).
constexpr std::size_t kMmaScaleRowBytes = 16;  // dim_ckv / 128 = 4 fp32 scales a token
FLASHINFER_HD constexpr std::size_t mla_mma_smem_bytes(int stages, bool fp8 = false) {
  const std::size_t tile16 = std::size_t{16} * kMmaUnits * kMmaKvTile;
  const std::size_t kv = fp8 ? tile16 + static_cast<std::size_t>(stages) * tile16 / 2
                             : static_cast<std::size_t>(stages) * tile16;
  const std::size_t scales = fp8 ? std::size_t{8} * kMmaKvTile + static_cast<std::size_t>(stages) *
                                                                     kMmaScaleRowBytes * kMmaKvTile
                                 : 0;
  return std::size_t{16} * kMmaUnits * kMmaRows + kv +
         std::size_t{4} * kMmaWarps * kMmaScoreFloats * 32 + std::size_t{2} * 8 * kMmaKvTile +
         scales;
}

/// K/V stages for a device whose blocks may take `max_smem_optin` bytes of shared memory: 3 where
/// they fit (sm_90: 227 KiB), else 2 (sm_80: 163 KiB), else 0: the kernel does not fit (sm_86,
/// sm_89: 99 KiB), and the CUDA-core kernel takes the call.
FLASHINFER_HD constexpr int mla_mma_stages(std::size_t max_smem_optin, bool fp8 = false) {
  return mla_mma_smem_bytes(3, fp8) <= max_smem_optin   ? 3
         : mla_mma_smem_bytes(2, fp8) <= max_smem_optin ? 2
                                                        : 0;
}

/// Whether the tensor-core kernel has an instance for a call with `dim_kpe` rope dims (64, or 0:
/// a NoPE model's MLA), `stages` K/V stages (mla_mma_stages) and an fp8 query (`fp8_query`,
/// trtllm's): every rope call with 2 or 3 stages; NoPE calls with 3 stages (sm_90's shared memory;
/// the engines' NoPE backend is SM90's) and a 16-bit query. Elsewhere the CUDA-core kernels take
/// the call. Host-side.
FLASHINFER_HD constexpr bool mla_mma_instance(int dim_kpe, int stages, bool fp8_query) {
  if (stages != 2 && stages != 3) return false;
  if (dim_kpe == kMmaKpe) return true;
  return dim_kpe == 0 && stages == 3 && !fp8_query;
}

/// The KV split of a call's grid (every MLA kernel's; the launcher's plan). The CUDA-core kernels
/// tile the cache in 16 tokens, this one in 32.
constexpr int kMlaMaxSplits = 64;                     // splits a row at most (the merge's table)
constexpr int64_t kMlaMinChunk = 256;                 // tokens a split at least
constexpr int64_t kMlaMaxScratch = int64_t{1} << 28;  // bytes of split partials at most
struct MlaSplit {
  int64_t splits, chunk;  // split z takes tokens [z chunk, (z + 1) chunk) of each row
};

/// The chunk of `splits` splits covering max_kv tokens (at least 1): the whole range for one
/// split, else a multiple of the kernel's `tile` with splits * chunk >= max_kv. The kernels
/// compute it themselves from a device value (MlaAttentionParams::max_kv_dev, mla_device_chunk).
FLASHINFER_HD constexpr int64_t mla_split_chunk(int64_t max_kv, int64_t splits, int64_t tile) {
  max_kv = max_kv < 1 ? 1 : max_kv;
  return splits > 1 ? ((max_kv + splits - 1) / splits + tile - 1) / tile * tile : max_kv;
}

/// The chunk a kernel takes when the longest length is read on the device (max_kv_dev: the
/// wrappers' CUDA-graph mode and the block-table decode calls' device plan, whose grid of `splits`
/// the launcher sized for a bound, `host_chunk` being its chunk): mla_split_chunk of the device
/// value, but at least the launcher's chunk capped at kMlaMinChunk rounded up to the tile. A grid
/// sized for max_seq_len 163840 and a request of 1000 tokens then runs 4 chunks of 256 (the eager
/// plan's) rather than 32 of 32, each writing a whole partial state for the merge. Only larger than
/// mla_split_chunk, so the splits still cover max_kv_dev.
FLASHINFER_HD constexpr int64_t mla_device_chunk(int64_t max_kv_dev, int64_t splits, int64_t tile,
                                                 int64_t host_chunk) {
  const int64_t c = mla_split_chunk(max_kv_dev, splits, tile);
  const int64_t min_tiles = (kMlaMinChunk + tile - 1) / tile * tile;
  const int64_t floor = host_chunk < min_tiles ? host_chunk : min_tiles;
  return c > floor ? c : floor;
}

/// Splits the KV axis when `blocks` (row, head group) blocks would leave the `sms` SMs idle: the
/// CUDA-core kernels (several blocks an SM) aim at two waves, rounding up; the tensor-core kernel
/// (`one_per_sm`: one block an SM) splits only below one wave and never past it, rounding down
/// (a split into more blocks than SMs adds waves and the merge: at batch 64 x 128 heads, 128
/// blocks, 3 splits would write and reread 50 MB of partials). At least kMlaMinChunk tokens a
/// split, at most kMlaMaxSplits, the partials (`bytes_per_split`) within kMlaMaxScratch; the
/// chunk a multiple of the kernel's `tile`, and no split left that starts at or past max_kv.
FLASHINFER_HD constexpr MlaSplit mla_kv_split(int64_t blocks, int64_t sms, int64_t max_kv,
                                              bool one_per_sm, int64_t tile,
                                              int64_t bytes_per_split) {
  max_kv = max_kv < 1 ? 1 : max_kv;
  int64_t splits = 1;
  const bool idle = one_per_sm ? blocks < sms : blocks < 2 * sms;
  if (idle && max_kv > kMlaMinChunk) {
    splits = one_per_sm ? sms / blocks : (2 * sms + blocks - 1) / blocks;
    const int64_t by_len = (max_kv + kMlaMinChunk - 1) / kMlaMinChunk;
    splits = splits < by_len ? splits : by_len;
    splits = splits < kMlaMaxSplits ? splits : kMlaMaxSplits;
    const int64_t by_scratch = kMlaMaxScratch / bytes_per_split;
    splits = splits < by_scratch ? splits : by_scratch;
    splits = splits < 1 ? 1 : splits;
  }
  const int64_t chunk = mla_split_chunk(max_kv, splits, tile);
  if (splits > 1) splits = (max_kv + chunk - 1) / chunk;
  return {splits, chunk};
}

/// Whether the kernel serves a call with these dtypes: a query of fp16 or bf16 (the MMA's operand
/// type), the output of the same type, and a cache of that type or fp8 (e4m3 or e5m2, widened to
/// it in shared memory: exact); or an fp8 query with an fp8 cache and a bf16 output (trtllm's and
/// xqa's fp8 calls: the query widened to bf16 as it is read, exactly). fp32 queries or outputs
/// stay on the CUDA-core kernels. Host-side.
constexpr bool mla_mma_dtypes(DType q, DType kv, DType o) {
  const auto fp8 = [](DType d) { return d == DType::kFloat8E4M3FN || d == DType::kFloat8E5M2; };
  if (fp8(q)) return fp8(kv) && o == DType::kBFloat16;
  return (q == DType::kFloat16 || q == DType::kBFloat16) && o == q && (kv == q || fp8(kv));
}

}  // namespace flashinfer::kernels::cuda::mla
