// Private: what the MiniMax sparse attention selection kernels receive (flashinfer.msa_ops;
// docs/upstream-facts/msa_ops.md). The API layer has checked shapes, dtypes and indices.
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"

namespace flashinfer::kernels {

inline constexpr int64_t kMsaTile = 128;  // keys a tile (and a page), the head dim
inline constexpr int64_t kMsaTopk = 16;

/// msa_topk_select: scores fp32 [H, P, S] contiguous; out int32 [S, H, 16] contiguous.
struct MsaTopkParams {
  const float* scores = nullptr;
  int64_t H = 0, P = 0, S = 0;
  const int32_t* nvp = nullptr;  // [S] per query, clamped to [0, P]; null: nvp_value
  int64_t nvp_value = 0;
  int64_t force_begin = 0, force_end = 0;
  int32_t* out = nullptr;
};

/// msa_proxy_score. Batches b < B: queries [cu_q[b], cu_q[b + 1]), seqlen_k[b] keys at offset
/// q_off[b]; key j of batch b is row k_row(b, j) of k ([rows, Hkv, 128], strides in elements).
struct MsaProxyParams {
  const void* q = nullptr;
  DType q_dtype = DType::kBFloat16;
  int64_t q_stride_t = 0, q_stride_h = 0;
  const void* k = nullptr;
  DType k_dtype = DType::kBFloat16;
  int64_t k_stride_row = 0, k_stride_h = 0;  // flat: a row is a token; paged: a page row
  int64_t k_stride_page = 0;                 // paged: a page (k_stride_row within it)
  int64_t Hq = 0, Hkv = 0, B = 0, total_q = 0, tiles = 0, max_seqlen_q = 0;
  const int32_t* cu_q = nullptr;        // [B + 1]
  const int32_t* cu_k = nullptr;        // flat: [B + 1]; null when paged
  const int32_t* page_table = nullptr;  // paged: [B, page_stride]
  int64_t page_stride = 0;
  const int32_t* seqused_k = nullptr;  // paged: [B]
  const int32_t* q_offset = nullptr;   // [B], or null: q_offset_value / bottom-right
  bool q_offset_scalar = false;
  int64_t q_offset_value = 0;
  bool causal = true;
  bool reduce_heads = false;
  float* out = nullptr;  // [H_out, tiles, total_q] contiguous
  // msa_proxy_score_fp4: q and k are packed e2m1 bytes (64 a row, strides in bytes) with e4m3
  // scales per 16 elements in the 128x4 layout of 8 columns (rows: q token * Hq + head; flat k
  // token * Hkv + kv head; paged k (page * Hkv + kv head) * 128 + row); each tile maximum is
  // multiplied by fp4_global (q_global_scale * k_global_scale).
  bool fp4 = false;
  const uint8_t* q_sf = nullptr;
  const uint8_t* k_sf = nullptr;
  float fp4_global = 1.0f;
};

}  // namespace flashinfer::kernels

namespace flashinfer::kernels {

/// msa_sparse_attention / msa_sparse_decode_attention: each query row qi of batch b (rows
/// [cu_q[b], cu_q[b + 1]), local index i) and head h attends the keys of the tiles listed in
/// q2k[h / G, qi, :] up to the first negative entry (duplicates count again, as upstream's kernel),
/// keys j < seqlen_k with, when causal, j <= off + i.
struct MsaAttnParams {
  const void* q = nullptr;
  DType q_dtype = DType::kBFloat16;
  int64_t q_stride_t = 0, q_stride_h = 0;
  const void *k = nullptr, *v = nullptr;
  DType kv_dtype = DType::kBFloat16;
  int64_t kv_stride_row = 0, kv_stride_h = 0, kv_stride_page = 0;  // as MsaProxyParams
  int64_t Hq = 0, Hkv = 0, B = 0, total_q = 0, topk = 0;
  const int32_t* q2k = nullptr;  // [Hkv, total_q, topk] contiguous
  const int32_t* cu_q = nullptr;
  const int32_t* cu_k = nullptr;  // flat, or null (paged)
  const int32_t* page_table = nullptr;
  int64_t page_stride = 0;
  const int32_t* seqused_k = nullptr;
  const int32_t* q_offset = nullptr;  // [B] or null
  bool q_offset_scalar = false;
  int64_t q_offset_value = 0;
  bool causal = false;
  float scale = 0.0f;
  float v_global_scale = 1.0f;
  void* out = nullptr;  // [total_q, Hq, 128] of out_dtype, contiguous
  DType out_dtype = DType::kBFloat16;
  float* lse = nullptr;    // [total_q, Hq] natural log, or null
  float* lse_t = nullptr;  // [total_q, Hq] of temperature * scores, or null
  float temperature = 1.0f;
};

}  // namespace flashinfer::kernels
