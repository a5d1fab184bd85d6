// Private: nvfp4_attention_sm120_quantize_qkv / nvfp4_attention_sm120_fwd, their parameters and
// the layout rules (upstream's SageAttention3 port: docs/ATTENTION.md, "NVFP4 attention on
// SM120"; facts in docs/upstream-facts/nvfp4_attention_sm120.md). The shared arithmetic is in
// kernels/nvfp4_attention_rules.h; both unit-tested on the CPU
// (tests/ops/test_nvfp4_attention_sm120.cpp).
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"
#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels {

inline constexpr int64_t kNvfp4AttnTile = 128;  // tokens a block (padding, Q means, key tiles)
inline constexpr int64_t kNvfp4AttnBlock = 16;  // values an e4m3 scale covers

/// q, k, v [B, H, S, D] contiguous (fp16 / bf16) into the seven outputs, S padded to S_pad.
struct Nvfp4AttnQuantParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  DType dtype = DType::kBFloat16;
  int64_t B = 0, H = 0, S = 0, S_pad = 0, D = 0;
  bool per_block_mean = true;
  uint8_t* q_fp4 = nullptr;        // [B, H, S_pad, D/2]
  uint8_t* k_fp4 = nullptr;        // [B, H, S_pad, D/2], rows permuted per 32 tokens
  uint8_t* v_fp4_t = nullptr;      // [B, H, D, S_pad/2]
  uint8_t* q_scale = nullptr;      // [B, H, S_pad, D/16] swizzled e4m3
  uint8_t* k_scale = nullptr;      // [B, H, S_pad, D/16]
  uint8_t* v_scale_t = nullptr;    // [B, H, D, S_pad/16]
  float* qk_correction = nullptr;  // [B, H, S_pad/128 or 1, S_pad]
  // The CUDA kernels' scratch, set by their launcher (the stream's): K's means [B, H, D] and
  // Q's [B, H, S_pad/128 or 1, D].
  float* k_mean = nullptr;
  float* q_mean = nullptr;
};

/// The forward over the quantized tensors (contiguous, S a multiple of 128).
struct Nvfp4AttnFwdParams {
  const uint8_t* q_fp4 = nullptr;
  const uint8_t* k_fp4 = nullptr;
  const uint8_t* v_fp4_t = nullptr;
  const uint8_t* q_scale = nullptr;
  const uint8_t* k_scale = nullptr;
  const uint8_t* v_scale_t = nullptr;
  const float* qk_correction = nullptr;
  int64_t B = 0, H = 0, S = 0, D = 0;
  bool causal = false, per_block_mean = true;
  float sm_scale = 0.0f;
  void* out = nullptr;  // [B, H, S, D] contiguous, out_dtype
  DType out_dtype = DType::kBFloat16;
  float* lse = nullptr;  // [B, H, S] contiguous
};

/// Rows of qk_correction (and Q's means): one per 128-token block, or one.
FLASHINFER_HD int64_t nvfp4_attn_groups(int64_t s_pad, bool per_block_mean) {
  return per_block_mean ? s_pad / kNvfp4AttnTile : 1;
}
/// The correction row (and Q mean) of query row i.
FLASHINFER_HD int64_t nvfp4_attn_group_of(int64_t i, bool per_block_mean) {
  return per_block_mean ? i / kNvfp4AttnTile : 0;
}

/// Byte offset of scale (row, col) in one head's [rows, ncols] scale matrix (ncols a multiple of
/// 4, rows of 64): each 64-row chunk is cut into 256-byte atoms of 4 columns, the row's low 4 bits
/// picking 16 bytes, its next 2 bits 4 of them.
FLASHINFER_HD int64_t nvfp4_attn_sf_offset(int64_t row, int64_t col, int64_t ncols) {
  return (row / 64) * 64 * ncols + (col / 4) * 256 + (row % 16) * 16 + ((row % 64) / 16) * 4 +
         col % 4;
}

/// The token stored at row r of k_fp4 within its group of 32: (r / 8) 2 + ((r % 8) / 2) 8 + r % 2.
/// The map is its own inverse, so it also gives the row a token is stored at.
FLASHINFER_HD int64_t nvfp4_attn_k_permute(int64_t r) {
  const int64_t base = r - r % 32, i = r % 32;
  return base + (i / 8) * 2 + ((i % 8) / 2) * 8 + i % 2;
}

}  // namespace flashinfer::kernels
