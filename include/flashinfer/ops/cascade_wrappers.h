// Cascade attention wrappers (FlashInfer module flashinfer.cascade): attention over a KV cache
// split into levels (a prefix shared by many requests, then each request's own suffix), each
// level attended separately with its LSE and the states merged (merge_state, base-2 LSE):
//   o = merge over levels of attention(q, level's keys) == attention(q, union of the keys).
// Shapes, dtypes and the paged-cache layouts are those of the batch wrappers (attention.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flashinfer/dtype.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/ops/attention.h"
#include "flashinfer/ops/page.h"
#include "flashinfer/tensor.h"

namespace flashinfer {

/// Multi-level cascade attention over one paged KV cache (flashinfer.cascade). Level i has its
/// own page table and query partition (qo_indptr_arr[i]); every level's queries are the same q
/// rows. Level 0 is usually one "request" holding every query against the shared prefix's
/// pages, the last level each request's unique pages. run() computes each level's attention with
/// its LSE and merges them. As upstream, `causal` applies to the last level only.
class MultiLevelCascadeAttentionWrapper : public ApiObject {
 public:
  /// float_workspace_buffer: split-KV scratch shared by the levels (they run one after another).
  /// The *_buf_arr lists (CUDA-graph buffers upstream) must have num_levels entries when given;
  /// this library keeps its own plan arrays and only checks them.
  MultiLevelCascadeAttentionWrapper(
      int64_t num_levels, Tensor float_workspace_buffer, std::string kv_layout = "NHD",
      bool use_cuda_graph = false,
      std::optional<std::vector<Tensor>> qo_indptr_buf_arr = std::nullopt,
      std::optional<std::vector<Tensor>> paged_kv_indptr_buf_arr = std::nullopt,
      std::optional<std::vector<Tensor>> paged_kv_indices_buf_arr = std::nullopt,
      std::optional<std::vector<Tensor>> paged_kv_last_page_len_buf_arr = std::nullopt);
  ~MultiLevelCascadeAttentionWrapper() override;
  MultiLevelCascadeAttentionWrapper(const MultiLevelCascadeAttentionWrapper&) = delete;
  MultiLevelCascadeAttentionWrapper& operator=(const MultiLevelCascadeAttentionWrapper&) = delete;

  /// One entry per level in each list: qo_indptr [batch_i + 1] (each ending at the same total
  /// query count), the page table of the level (paged_kv_indptr, paged_kv_indices,
  /// paged_kv_last_page_len), int32.
  void plan(const std::vector<Tensor>& qo_indptr_arr,
            const std::vector<Tensor>& paged_kv_indptr_arr,
            const std::vector<Tensor>& paged_kv_indices_arr,
            const std::vector<Tensor>& paged_kv_last_page_len, int64_t num_qo_heads,
            int64_t num_kv_heads, int64_t head_dim, int64_t page_size, bool causal = false,
            std::string_view pos_encoding_mode = "NONE", bool use_fp16_qk_reduction = false,
            std::optional<double> sm_scale = std::nullopt, int64_t window_left = -1,
            std::optional<double> logits_soft_cap = std::nullopt,
            std::optional<double> rope_scale = std::nullopt,
            std::optional<double> rope_theta = std::nullopt, DType q_data_type = DType::kFloat16,
            std::optional<DType> kv_data_type = std::nullopt);

  /// q [total_q, Hq, D] → o [total_q, Hq, D] in q's dtype.
  Tensor run(const Tensor& q, const PagedKVCache& paged_kv_cache);

  std::string_view class_name() const override { return "MultiLevelCascadeAttentionWrapper"; }
  std::string_view module_name() const override { return "flashinfer.cascade"; }
  int64_t num_levels() const;

 private:
  std::vector<std::unique_ptr<detail::WrapperState>> levels_;
};

/// Batch decode with a shared prefix held as plain K/V tensors (flashinfer.cascade): every query
/// attends to the shared prefix (k_shared, v_shared: [prefix_len, Hkv, D] for NHD, [Hkv,
/// prefix_len, D] for HND) and to its request's unique pages; the two states are merged.
class BatchDecodeWithSharedPrefixPagedKVCacheWrapper : public ApiObject {
 public:
  explicit BatchDecodeWithSharedPrefixPagedKVCacheWrapper(Tensor float_workspace_buffer,
                                                          std::string kv_layout = "NHD");
  ~BatchDecodeWithSharedPrefixPagedKVCacheWrapper() override;
  BatchDecodeWithSharedPrefixPagedKVCacheWrapper(
      const BatchDecodeWithSharedPrefixPagedKVCacheWrapper&) = delete;
  BatchDecodeWithSharedPrefixPagedKVCacheWrapper& operator=(
      const BatchDecodeWithSharedPrefixPagedKVCacheWrapper&) = delete;

  /// The unique pages' table (int32). data_type: the KV cache's dtype (q may be fp16, bf16 or
  /// fp32; the output takes q's dtype).
  void begin_forward(const Tensor& unique_kv_indptr, const Tensor& unique_kv_indices,
                     const Tensor& unique_kv_last_page_len, int64_t num_qo_heads,
                     int64_t num_kv_heads, int64_t head_dim, int64_t page_size,
                     DType data_type = DType::kFloat16);
  /// q [batch, Hq, D] → o [batch, Hq, D]. Scores use 1/sqrt(D).
  Tensor forward(const Tensor& q, const Tensor& k_shared, const Tensor& v_shared,
                 const PagedKVCache& unique_kv_cache);
  /// Upstream's no-op (kept for its API).
  void end_forward();

  std::string_view class_name() const override {
    return "BatchDecodeWithSharedPrefixPagedKVCacheWrapper";
  }
  std::string_view module_name() const override { return "flashinfer.cascade"; }

 private:
  std::unique_ptr<detail::WrapperState> s_;
};

/// Batch prefill with a shared prefix held as plain K/V tensors (flashinfer.cascade): every
/// query attends to the whole shared prefix (no mask) and to its request's unique pages (causal
/// when forward()'s causal is set: query i of a request with qo_len queries and kv_len unique
/// keys sits at unique position kv_len - qo_len + i); the two states are merged.
class BatchPrefillWithSharedPrefixPagedKVCacheWrapper : public ApiObject {
 public:
  explicit BatchPrefillWithSharedPrefixPagedKVCacheWrapper(Tensor float_workspace_buffer,
                                                           std::string kv_layout = "NHD");
  ~BatchPrefillWithSharedPrefixPagedKVCacheWrapper() override;
  BatchPrefillWithSharedPrefixPagedKVCacheWrapper(
      const BatchPrefillWithSharedPrefixPagedKVCacheWrapper&) = delete;
  BatchPrefillWithSharedPrefixPagedKVCacheWrapper& operator=(
      const BatchPrefillWithSharedPrefixPagedKVCacheWrapper&) = delete;

  /// qo_indptr [batch + 1] and the unique pages' table (int32).
  void begin_forward(const Tensor& qo_indptr, const Tensor& paged_kv_indptr,
                     const Tensor& paged_kv_indices, const Tensor& paged_kv_last_page_len,
                     int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim,
                     int64_t page_size);
  /// q [qo_indptr[-1], Hq, D] → o of the same shape in q's dtype. sm_scale default 1/sqrt(D),
  /// used for both parts. use_fp16_qk_reduction has no effect (scores are fp32); rope_scale /
  /// rope_theta are unused (no positional encoding is applied, as upstream's "NONE").
  Tensor forward(const Tensor& q, const Tensor& k_shared, const Tensor& v_shared,
                 const PagedKVCache& unique_kv_cache, bool causal = false,
                 bool use_fp16_qk_reduction = false, std::optional<double> sm_scale = std::nullopt,
                 std::optional<double> rope_scale = std::nullopt,
                 std::optional<double> rope_theta = std::nullopt);
  /// Upstream's no-op (kept for its API).
  void end_forward();

  std::string_view class_name() const override {
    return "BatchPrefillWithSharedPrefixPagedKVCacheWrapper";
  }
  std::string_view module_name() const override { return "flashinfer.cascade"; }

 private:
  std::unique_ptr<detail::WrapperState> s_;
};

}  // namespace flashinfer
