// Private: what the block-sparse attention kernels of every backend receive: SM120's 64-token
// blocks (flashinfer.cute_dsl.sparse.bsa_attn_sm120.bsa_attn_sm120_blk64_fwd) and SM100's 128-
// and 64-token ones (bsa_attn_sm100_blk128_fwd, bsa_attn_sm100_blk64_fwd). Strides in elements.
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"
#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels {

struct BsaParams {
  static constexpr int64_t kMaxDim = 128;
  int64_t block = 64;  // tokens a query block and a KV block
  int64_t dim = 128;   // head dim of q, k and v: 64, 96 or 128
  int64_t B = 0, Sq = 0, Sk = 0, Hq = 0, Hkv = 0, NQ = 0, NK = 0, W = 0;
  DType dtype = DType::kBFloat16;
  // [b, s, h, d] with unit stride along d (a zero batch stride: k / v broadcast over batches).
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  int64_t q_s[3] = {}, k_s[3] = {}, v_s[3] = {};
  // The metadata: index [B, Hm, NM, W] and nums [B, Hm, NM] (contiguous; nums null: every row
  // block_sparse_num). Rows per query head (Hm = Hq, NM = NQ; row (b, h, r / block)), or with
  // packed GQA (pack_g = Hq / Hkv > 1, SM100 blk128) per KV head over the packed rows
  // r g + h % g (Hm = Hkv, NM = ceil(g Sq / block); row (b, h / g, (r g + h % g) / block)).
  const int32_t* index = nullptr;
  const int32_t* nums = nullptr;
  int64_t block_sparse_num = 0;
  int64_t pack_g = 1;
  // Valid keys a block: block_sizes [NK] (mode 1), [B, NK] (2), [B, Hq, NK] (3), contiguous.
  // Without: `block` keys, and with tail_mask (SM120) the last block Sk - (NK - 1) block; without
  // tail_mask (SM100) its keys past Sk are zero keys (score 0, value 0), as upstream's
  // zero-filled loads.
  const int32_t* block_sizes = nullptr;
  int block_sizes_mode = 0;
  bool tail_mask = true;
  float scale = 0.0f;
  void* out = nullptr;  // [b, s, h, d] of dtype
  int64_t out_s[3] = {};
  float* lse = nullptr;  // [b, h, s], or null: not written
  int64_t lse_s[3] = {};
  const char* op = "bsa_attn_sm120_blk64_fwd";  // for the launcher's errors
};

/// The metadata row (into nums; times W into index) of query row r of query head h, batch b.
FLASHINFER_HD int64_t bsa_meta_row(const BsaParams& p, int64_t b, int64_t h, int64_t r) {
  if (p.pack_g > 1) {
    const int64_t g = p.pack_g, nm = (g * p.Sq + p.block - 1) / p.block;
    return (b * p.Hkv + h / g) * nm + (r * g + h % g) / p.block;
  }
  return (b * p.Hq + h) * p.NQ + r / p.block;
}

/// Rows of the metadata (B Hm NM).
FLASHINFER_HD int64_t bsa_meta_rows(const BsaParams& p) {
  if (p.pack_g > 1) return p.B * p.Hkv * ((p.pack_g * p.Sq + p.block - 1) / p.block);
  return p.B * p.Hq * p.NQ;
}

/// Valid keys of listed block j for (b, h), at most `block` (<= 0: none).
FLASHINFER_HD int64_t bsa_valid_keys(const BsaParams& p, int64_t b, int64_t h, int64_t j) {
  int64_t vb = p.block;
  if (p.block_sizes) {
    const int64_t at = p.block_sizes_mode == 1   ? j
                       : p.block_sizes_mode == 2 ? b * p.NK + j
                                                 : (b * p.Hq + h) * p.NK + j;
    vb = p.block_sizes[at] < vb ? p.block_sizes[at] : vb;
  } else if (p.tail_mask && j == p.NK - 1) {
    vb = p.Sk - (p.NK - 1) * p.block;
  }
  return vb;
}

}  // namespace flashinfer::kernels
