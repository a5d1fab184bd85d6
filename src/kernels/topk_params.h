// Private: what the top-k kernels of every backend receive, and the order-preserving key both
// backends compare. One parameter struct serves top_k, the two fused transforms and
// top_k_varlen: a row's window, its length and how a selected index is written differ only in
// which of the optional per-row arrays are set. Strides are in elements; the per-row arrays are
// int32 on the input's device (nullptr: the default noted beside each).
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"

#if defined(__CUDACC__)
#define FLASHINFER_TOPK_HD __host__ __device__ __forceinline__
#else
#define FLASHINFER_TOPK_HD inline
#endif

namespace flashinfer::kernels {

enum class TopKOutput : int32_t {
  kPlain,      // indices (int64 or int32) of the window, optional values
  kRagged,     // int32 idx + offsets[row]
  kPageTable,  // int32 page_table[b, pts + idx / page_size] * page_size + idx % page_size
};

struct TopKParams {
  const void* input = nullptr;
  DType dtype = DType::kFloat32;
  int64_t rows = 0, cols = 0;
  int64_t in_stride_row = 0, in_stride_col = 1;
  int64_t k = 0;
  bool prefer_large = false;  // boundary ties keep the largest indices (TopKTieBreak::LARGE)
  bool sorted = false;        // descending values (plain output only)

  // Row lengths: L_r = clamp(floor((lengths[r / next_n] - next_n + r % next_n + 1) /
  // compress_ratio), 0, cols - start_r); lengths == nullptr: L_r = cols - start_r.
  const int32_t* lengths = nullptr;
  int64_t next_n = 1, compress_ratio = 1;
  const int32_t* row_starts = nullptr;  // window start (0)

  TopKOutput output = TopKOutput::kPlain;
  void* indices = nullptr;  // [rows, k]; int64 or int32 (index_dtype)
  DType index_dtype = DType::kInt64;
  int64_t idx_stride_row = 0, idx_stride_col = 1;
  void* values = nullptr;  // [rows, k] in dtype, or nullptr
  int64_t val_stride_row = 0, val_stride_col = 1;
  bool zero_padded_values = false;  // padded value slots get 0 (else left unwritten)
  int32_t* raw_indices = nullptr;   // [rows, k] contiguous int32 (page table only), or nullptr

  const int32_t* offsets = nullptr;     // kRagged
  const int32_t* page_table = nullptr;  // kPageTable [pt_rows, pt_cols]
  int64_t pt_rows = 0, pt_cols = 0, pt_stride_row = 0, pt_stride_col = 1;
  const int32_t* row_to_batch = nullptr;           // (row)
  const int32_t* page_table_row_starts = nullptr;  // (row_starts, else 0)
  int64_t page_size = 1;                           // power of two

  /// Device scratch for sorted output on CUDA: 2 * rows * k int64 (unused on the CPU).
  void* sort_scratch = nullptr;
};

/// Order-preserving unsigned key of an fp32 bit pattern, upstream's (topk_common.cuh): a negative
/// value has every bit flipped, a non-negative one its sign bit. Larger value, larger key; -0.0
/// ranks below +0.0, a positive NaN above +inf and a negative NaN below -inf, each NaN payload
/// apart (torch.topk instead ties the zeros and puts every NaN on top).
FLASHINFER_TOPK_HD uint32_t topk_key32(uint32_t u) {
  const uint32_t neg = static_cast<uint32_t>(static_cast<int32_t>(u) >> 31);
  return u ^ (neg | 0x80000000u);
}
/// The same for an fp16 or bf16 bit pattern: a 16-bit key.
FLASHINFER_TOPK_HD uint32_t topk_key16(uint32_t u) {
  const uint32_t neg = (u & 0x8000u) ? 0xFFFFu : 0u;
  return (u ^ (neg | 0x8000u)) & 0xFFFFu;
}

/// Row r's window length (see TopKParams::lengths), given its start.
FLASHINFER_TOPK_HD int64_t topk_row_length(const TopKParams& p, int64_t r, int64_t start) {
  const int64_t avail = p.cols - start;
  if (p.lengths == nullptr) return avail < 0 ? 0 : avail;
  const int64_t n = static_cast<int64_t>(p.lengths[r / p.next_n]) - p.next_n + r % p.next_n + 1;
  // Floor division (upstream's `//`), also for negative n.
  int64_t l = n / p.compress_ratio;
  if (n % p.compress_ratio != 0 && n < 0) --l;
  if (l < 0) l = 0;
  return l < avail ? l : (avail < 0 ? 0 : avail);
}

/// Writes the selected window-local index `idx` (or -1: padding) into slot j of row r's outputs.
/// Returns false when a page-table lookup falls outside the table (written as -1).
FLASHINFER_TOPK_HD bool topk_write_index(const TopKParams& p, int64_t r, int64_t j, int64_t idx) {
  const int64_t o = r * p.idx_stride_row + j * p.idx_stride_col;
  bool ok = true;
  if (p.output == TopKOutput::kPlain) {
    if (p.index_dtype == DType::kInt64) {
      static_cast<int64_t*>(p.indices)[o] = idx;
    } else {
      static_cast<int32_t*>(p.indices)[o] = static_cast<int32_t>(idx);
    }
    return true;
  }
  int64_t v = -1;
  if (idx >= 0) {
    if (p.output == TopKOutput::kRagged) {
      v = idx + p.offsets[r];
    } else {
      const int64_t b = p.row_to_batch ? p.row_to_batch[r] : r;
      const int64_t pts = p.page_table_row_starts ? p.page_table_row_starts[r]
                          : p.row_starts          ? p.row_starts[r]
                                                  : 0;
      const int64_t e = pts + idx / p.page_size;
      if (b >= 0 && b < p.pt_rows && e >= 0 && e < p.pt_cols) {
        const int64_t page = p.page_table[b * p.pt_stride_row + e * p.pt_stride_col];
        v = page * p.page_size + idx % p.page_size;
      } else {
        ok = false;
      }
    }
  }
  static_cast<int32_t*>(p.indices)[o] = static_cast<int32_t>(v);
  if (p.raw_indices) p.raw_indices[r * p.k + j] = static_cast<int32_t>(idx);
  return ok;
}

}  // namespace flashinfer::kernels
