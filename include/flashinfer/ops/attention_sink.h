// BatchAttentionWithAttentionSinkWrapper (upstream flashinfer/attention.py, recorded under
// flashinfer.prefill): BatchPrefillWithPagedKVCacheWrapper with the "AttentionSink" JIT variant,
// a per-head sink logit in every softmax denominator.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "flashinfer/ops/attention.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// Upstream's subclass does not decorate its own methods: its __init__ calls the parent's
/// decorated __init__ by keyword with the variant's jit_args / jit_kwargs, and plan / run are the
/// parent's, so upstream records `BatchAttentionWithAttentionSinkWrapper.__init__ / .plan / .run`
/// with the parent's parameters. This class takes exactly those (create() builds the jit
/// arguments from the subclass's own constructor arguments, as upstream's __init__ does).
///
/// run(q, paged_kv_cache, sink, sm_scale): sink [Hq] fp32 natural-log logits (the variant's
/// extra tensor, passed positionally upstream), sm_scale the variant's score scale (None: plan's).
///   s_j = sm_scale * q . k_j;  o = sum_j exp(s_j) v_j / (sum_j exp(s_j) + exp(sink[h])).
/// Everything else (page table, causal, window_left, soft cap, fp8 KV scales, out/lse) is the
/// paged prefill wrapper's.
class BatchAttentionWithAttentionSinkWrapper : public ApiObject {
 public:
  /// The parent's constructor, as upstream records it. jit_args must be the AttentionSink
  /// variant's list (variant name "AttentionSink" at index 11) and jit_kwargs its dict
  /// (pos_encoding_mode 0); backend "fa2", "fa3" or "auto" (the same math here).
  explicit BatchAttentionWithAttentionSinkWrapper(
      Tensor float_workspace_buffer, std::string kv_layout = "NHD", bool use_cuda_graph = false,
      std::optional<Tensor> qo_indptr_buf = std::nullopt,
      std::optional<Tensor> paged_kv_indptr_buf = std::nullopt,
      std::optional<Tensor> paged_kv_indices_buf = std::nullopt,
      std::optional<Tensor> paged_kv_last_page_len_buf = std::nullopt,
      std::optional<Tensor> custom_mask_buf = std::nullopt,
      std::optional<Tensor> mask_indptr_buf = std::nullopt, std::string backend = "auto",
      std::optional<Value> jit_args = std::nullopt, std::optional<Value> jit_kwargs = std::nullopt);
  ~BatchAttentionWithAttentionSinkWrapper() override;
  BatchAttentionWithAttentionSinkWrapper(const BatchAttentionWithAttentionSinkWrapper&) = delete;
  BatchAttentionWithAttentionSinkWrapper& operator=(const BatchAttentionWithAttentionSinkWrapper&) =
      delete;

  /// Upstream's subclass constructor: builds jit_args / jit_kwargs as upstream does (uri, dtypes,
  /// head dims, ["sink"], ["float"], ["sm_scale"], ["double"], "AttentionSink", and, in place of
  /// upstream's CUDA source text, a short note) and constructs the wrapper with them.
  static std::shared_ptr<BatchAttentionWithAttentionSinkWrapper> create(
      Tensor float_workspace_buffer, std::string kv_layout = "NHD", bool use_cuda_graph = false,
      std::optional<Tensor> custom_mask_buf = std::nullopt,
      std::optional<Tensor> mask_indptr_buf = std::nullopt, std::string backend = "auto",
      std::string pos_encoding_mode = "NONE", bool use_fp16_qk_reduction = false,
      DType q_data_type = DType::kBFloat16, DType kv_data_type = DType::kBFloat16,
      int64_t head_dim_qk = 128, int64_t head_dim_vo = 128, int64_t window_left = -1);

  /// BatchPrefillWithPagedKVCacheWrapper.plan.
  void plan(const Tensor& qo_indptr, const Tensor& paged_kv_indptr, const Tensor& paged_kv_indices,
            const Tensor& paged_kv_last_page_len, int64_t num_qo_heads, int64_t num_kv_heads,
            int64_t head_dim_qk, int64_t page_size, const PrefillPlanOptions& options = {});

  /// BatchPrefillWithPagedKVCacheWrapper.run with the variant's (sink, sm_scale) arguments.
  AttentionOutput run(const Tensor& q, const PagedKVCache& paged_kv_cache,
                      std::optional<Tensor> sink, std::optional<double> sm_scale,
                      const AttentionRunOptions& options = {});

  std::string_view class_name() const override { return "BatchAttentionWithAttentionSinkWrapper"; }
  std::string_view module_name() const override { return "flashinfer.prefill"; }

 private:
  friend struct detail::PagedWrapperAccess;
  std::unique_ptr<BatchPrefillWithPagedKVCacheWrapper> inner_;
  double plan_sm_scale_ = 0.0;  // the planned score scale (run's sm_scale is relative to it)
  bool planned_ = false;
};

}  // namespace flashinfer
