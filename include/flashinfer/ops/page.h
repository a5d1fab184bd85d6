// Paged KV-cache utilities (FlashInfer module flashinfer.page) and the paged-cache argument type
// shared by the attention wrappers.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// A paged KV cache as upstream accepts it: one 5-D tensor [pages, 2, page_size, Hkv, D] (NHD;
/// HND is [pages, 2, Hkv, page_size, D]) with K at [:, 0] and V at [:, 1], or a (k_cache,
/// v_cache) pair of 4-D tensors [pages, page_size, Hkv, D] (HND: [pages, Hkv, page_size, D]).
/// Any strides; the head_dim axis must be contiguous.
class PagedKVCache {
 public:
  PagedKVCache() = default;
  PagedKVCache(Tensor kv_cache) : kv_(std::move(kv_cache)) {}  // NOLINT: implicit like Python
  PagedKVCache(Tensor k_cache, Tensor v_cache)
      : kv_(std::move(k_cache)), v_(std::move(v_cache)), pair_(true) {}
  PagedKVCache(std::pair<Tensor, Tensor> kv)  // NOLINT
      : PagedKVCache(std::move(kv.first), std::move(kv.second)) {}
  PagedKVCache(std::tuple<Tensor, Tensor> kv)  // NOLINT
      : PagedKVCache(std::move(std::get<0>(kv)), std::move(std::get<1>(kv))) {}

  /// From a recorded value: a tensor or a two-tensor tuple/list.
  static PagedKVCache from_value(const Value& v);

  bool is_pair() const { return pair_; }
  /// The 5-D tensor (single form) or the K cache (pair form).
  const Tensor& first() const { return kv_; }
  /// The V cache (pair form only).
  const Tensor& second() const { return v_; }
  /// f(tensor, item) for each tensor: item -1 for the single tensor, 0 and 1 for a pair (the
  /// call gate's written-argument check walks an argument's tensors this way).
  template <class F>
  void for_each_tensor(F&& f) const {
    if (pair_) {
      f(kv_, 0);
      f(v_, 1);
    } else {
      f(kv_, -1);
    }
  }

 private:
  Tensor kv_;
  Tensor v_;
  bool pair_ = false;
};

/// A tensor, or a (k_cache, v_cache) tuple, as upstream records the argument.
Value to_value(const PagedKVCache& cache);

/// Sequence lengths of a paged cache: kv_len[i] = max(pages_i - 1, 0) * page_size +
/// kv_last_page_len[i], with pages_i = kv_indptr[i + 1] - kv_indptr[i].
///   kv_indptr [batch + 1] int32, kv_last_page_len [batch] int32, same device.
/// Returns int32 [batch] on that device. A plain helper as upstream (flashinfer.page.get_seq_lens
/// is not an @flashinfer_api op): it is not declared, logged or recorded. On CUDA a kernel
/// computes it on the device (no host copy; a CUDA graph can capture it; lengths outside int32
/// wrap as upstream's int32 torch arithmetic); on the CPU the values are checked first.
Tensor get_seq_lens(const Tensor& kv_indptr, const Tensor& kv_last_page_len, int64_t page_size);

/// For each of the nnz appended rows, its request and its absolute position in that request:
/// row append_indptr[b] + j belongs to request b at position seq_lens[b] - append_len_b + j (a
/// short seq_lens gives negative positions, as upstream's).
///   append_indptr [batch + 1] int32 or int64, non-decreasing, may start above 0 and end below
///   nnz: rows of no request get batch -1 and position 0 (a given positions buffer keeps its
///   value there), as upstream's presets. seq_lens [batch] int32 or int64.
/// batch_indices / positions: optional int32 (nnz,) outputs, written and returned. On CUDA a
/// kernel reads the indices on the device (no host copy; values not checked there).
std::tuple<Tensor, Tensor> get_batch_indices_positions(
    const Tensor& append_indptr, const Tensor& seq_lens, int64_t nnz,
    std::optional<Tensor> batch_indices = std::nullopt,
    std::optional<Tensor> positions = std::nullopt);

/// Writes append_key[i] / append_value[i] ([nnz, Hkv, D], the cache's dtype) into the paged cache
/// at request batch_indices[i], position positions[i]. The page table (kv_indices, kv_indptr,
/// kv_last_page_len) must already include the new tokens: every position must be below the
/// request's length and every page id inside the cache (checked on the host, so a bad index is
/// an error, never a stray write). kv_layout is "NHD" or "HND".
void append_paged_kv_cache(const Tensor& append_key, const Tensor& append_value,
                           const Tensor& batch_indices, const Tensor& positions,
                           const PagedKVCache& paged_kv_cache, const Tensor& kv_indices,
                           const Tensor& kv_indptr, const Tensor& kv_last_page_len,
                           std::string_view kv_layout = "NHD");

}  // namespace flashinfer
