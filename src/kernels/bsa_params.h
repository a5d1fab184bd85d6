// Private: what the SM120 block-sparse attention kernels of every backend receive
// (flashinfer.cute_dsl.sparse.bsa_attn_sm120.bsa_attn_sm120_blk64_fwd). Strides in elements.
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"

namespace flashinfer::kernels {

struct BsaParams {
  static constexpr int64_t kBlock = 64, kDim = 128;
  int64_t B = 0, Sq = 0, Sk = 0, Hq = 0, Hkv = 0, NQ = 0, NK = 0, W = 0;
  DType dtype = DType::kBFloat16;
  // [b, s, h, d] with unit stride along d.
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  int64_t q_s[3] = {}, k_s[3] = {}, v_s[3] = {};
  const int32_t* index = nullptr;  // [B, Hq, NQ, W] contiguous
  const int32_t* nums = nullptr;   // [B, Hq, NQ] contiguous, or null: block_sparse_num
  int64_t block_sparse_num = 0;
  // Valid keys a block: block_sizes [NK] (mode 1), [B, NK] (2), [B, Hq, NK] (3), contiguous; null:
  // 64, the last block Sk - (NK - 1) 64.
  const int32_t* block_sizes = nullptr;
  int block_sizes_mode = 0;
  float scale = 0.0f;
  void* out = nullptr;  // [b, s, h, d] of dtype
  int64_t out_s[3] = {};
  float* lse = nullptr;  // [b, h, s]
  int64_t lse_s[3] = {};
};

}  // namespace flashinfer::kernels
