// Top-k selection ops (FlashInfer modules flashinfer.topk and flashinfer.topk_varlen.topk_varlen).
//
// Every backend selects the same elements and writes them in the same order, so results are
// reproducible across devices and runs (upstream's non-deterministic mode may pick any of equal
// boundary elements and write them in any order; ours is one of those answers):
//   - order of the keys: upstream's, the value's bits with every bit of a negative value and the
//     sign bit of a non-negative one flipped: -0.0 below +0.0, a positive NaN above +inf, a
//     negative NaN below -inf;
//   - boundary ties (elements equal to the k-th largest): the smallest indices are kept, or the
//     largest with tie_break = TopKTieBreak::LARGE;
//   - unsorted output lists the selected elements in ascending index order; sorted output
//     (top_k with sorted=true) in descending value order, equal values by ascending index.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>

#include "flashinfer/op_typed.h"
#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// Upstream's TopKTieBreak (flashinfer.topk.TopKTieBreak), same member names and values.
enum class TopKTieBreak : int { NONE = 0, SMALL = 1, LARGE = 2 };
/// Recorded as upstream's enum member: EnumValue{"TopKTieBreak", "NONE", "0"}.
Value to_value(TopKTieBreak tie_break);
/// From a recorded enum member or its integer value (upstream accepts plain ints).
TopKTieBreak topk_tie_break_from_value(const Value& v);

template <>
struct ArgTraits<TopKTieBreak> {
  static constexpr ParamKind kind = ParamKind::kEnum;
  static constexpr const char* type_name = "TopKTieBreak";
  static TopKTieBreak get(const CallArgs& a, std::size_t i) {
    return topk_tie_break_from_value(a[i]);
  }
};

/// The k largest elements of each row.
///   input  [batch, d], fp32, fp16 or bf16, any strides.
///   k      >= 0 (0: empty outputs). Above d, as upstream accepts it: the row, then index -1 and
///          value 0 (sorted: that padding ranks as +0.0, after the row's elements of that key).
///   sorted descending values when true; else ascending index order (see above).
///   deterministic, dsa_graph_safe  accepted for upstream compatibility: every backend here is
///          deterministic and graph safe (no host synchronization). With tie_break or
///          dsa_graph_safe, k > 2048 is refused, as upstream's filtered kernel refuses it.
///   tie_break  which of equal boundary elements are kept (NONE behaves as SMALL).
/// Returns (values [batch, k] in input's dtype, indices [batch, k] int64).
std::tuple<Tensor, Tensor> top_k(const Tensor& input, int64_t k, bool sorted = false,
                                 bool deterministic = false,
                                 TopKTieBreak tie_break = TopKTieBreak::NONE,
                                 bool dsa_graph_safe = false);

/// Keyword-only parameters of top_k_page_table_transform.
struct TopKPageTableOptions {
  int64_t page_size = 1;                  // score positions per page-table entry (power of 2)
  std::optional<Tensor> out;              // [num_rows, k] int32, contiguous; written, returned
  std::optional<Tensor> out_raw_indices;  // [num_rows, k] int32, contiguous; written
};
FLASHINFER_OPTION_FIELDS(TopKPageTableOptions, page_size, out, out_raw_indices);

/// Fused top-k + page-table translation (sparse attention's second stage). For row i the window
/// is input[i, s : s + lengths[i]] with s = row_starts[i] (0 when None); each selected
/// window-local index idx becomes
///   src_page_table[b, pts + idx / page_size] * page_size + idx % page_size
/// where b = row_to_batch[i] (i when None) and pts = page_table_row_starts[i] (row_starts[i] when
/// None, 0 when both are None). When lengths[i] <= k the raw indices are 0..lengths[i]-1; slots
/// past the selected ones are -1 in both outputs. out_raw_indices (optional) receives idx.
///   input [num_rows, max_len] fp32/fp16/bf16 (last dimension contiguous); src_page_table
///   [batch, width] int32; lengths, row_to_batch, row_starts, page_table_row_starts [num_rows]
///   int32. CPU inputs are range-checked; on CUDA, lengths past the row end are clamped and a
///   page-table lookup outside the table writes -1.
Tensor top_k_page_table_transform(
    const Tensor& input, const Tensor& src_page_table, const Tensor& lengths, int64_t k,
    std::optional<Tensor> row_to_batch = std::nullopt, bool deterministic = false,
    TopKTieBreak tie_break = TopKTieBreak::NONE, bool dsa_graph_safe = false,
    std::optional<Tensor> row_starts = std::nullopt,
    std::optional<Tensor> page_table_row_starts = std::nullopt, TopKPageTableOptions options = {});

/// Fused top-k + offset (ragged KV layout): output[i, j] = idx_j + offsets[i] for the selected
/// window-local indices idx_j of window input[i, s : s + lengths[i]], s = row_starts[i] (0 when
/// None); -1 past the selected ones (when lengths[i] < k). Returns [num_rows, k] int32.
Tensor top_k_ragged_transform(const Tensor& input, const Tensor& offsets, const Tensor& lengths,
                              int64_t k, bool deterministic = false,
                              TopKTieBreak tie_break = TopKTieBreak::NONE,
                              bool dsa_graph_safe = false,
                              std::optional<Tensor> row_starts = std::nullopt);

/// Top-k over decode-step logits with per-request lengths. Row r belongs to request
/// r / next_n and searches its first L_r columns,
///   L_r = clamp(floor((seq_lens[r / next_n] - next_n + r % next_n + 1) / compress_ratio), 0, N),
/// giving row-relative int32 indices [num_rows, top_k] padded with -1 (when L_r < top_k) and,
/// with return_values, the selected logits (0 in the padded slots). pre_idx, backend,
/// load_balance and workspace select upstream's GPU algorithms and do not change the answer
/// here; backend must be one of upstream's names.
std::tuple<Tensor, std::optional<Tensor>> top_k_varlen(
    const Tensor& logits, const Tensor& seq_lens, int64_t top_k,
    std::optional<Tensor> pre_idx = std::nullopt, int64_t compress_ratio = 1, int64_t next_n = 1,
    bool return_values = false, std::optional<Tensor> out_indices = std::nullopt,
    std::optional<Tensor> out_values = std::nullopt, std::string_view backend = "auto",
    bool load_balance = true, std::optional<Value> workspace = std::nullopt);

}  // namespace flashinfer
