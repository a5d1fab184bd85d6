// BatchAttention (FlashInfer module flashinfer.attention._core): upstream's persistent
// ("holistic") batch attention over a paged KV cache, one wrapper for prefill and decode
// requests mixed in one batch. The math is the batch wrappers' (attention.h): per request,
// s = sm_scale * k_scale * q.k (soft cap c * tanh(s / c) when c > 0), softmax in fp32, output
// times v_scale; query i of a request with qo_len queries and kv_len keys sits at position
// kv_len - qo_len + i (causal keeps keys j <= it). The LSE is base 2.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "flashinfer/dtype.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/ops/attention.h"
#include "flashinfer/ops/page.h"
#include "flashinfer/ops/sampling.h"  // ScalarOrTensor
#include "flashinfer/tensor.h"

namespace flashinfer {

class BatchAttention : public ApiObject {
 public:
  /// kv_layout "NHD" or "HND". device: "cpu", "cuda" or "cuda:N" (upstream's workspace device);
  /// checked only: the wrapper computes where run()'s q lives (its plan copied there once).
  explicit BatchAttention(std::string kv_layout = "NHD", std::string device = "cuda");
  ~BatchAttention() override;
  BatchAttention(const BatchAttention&) = delete;
  BatchAttention& operator=(const BatchAttention&) = delete;

  /// qo_indptr [batch + 1] (q rows per request), kv_indptr [batch + 1] into kv_indices (page
  /// ids), kv_len_arr [batch] tokens per request: each at most its pages * page_size; pages past
  /// ceil(kv_len / page_size) are never read. int32, any device (copied to the host). use_profiler
  /// is not supported.
  void plan(const Tensor& qo_indptr, const Tensor& kv_indptr, const Tensor& kv_indices,
            const Tensor& kv_len_arr, int64_t num_qo_heads, int64_t num_kv_heads,
            int64_t head_dim_qk, int64_t head_dim_vo, int64_t page_size, bool causal = false,
            std::optional<double> sm_scale = std::nullopt,
            std::optional<double> logits_soft_cap = std::nullopt,
            DType q_data_type = DType::kBFloat16, DType kv_data_type = DType::kBFloat16,
            bool use_profiler = false);

  /// q [qo_indptr[-1], Hq, Dqk]; kv_cache a paged cache (5-D or (k, v) pair, the layout of
  /// __init__). Returns upstream's (out [rows, Hq, Dvo] in q's dtype, lse [rows, Hq] fp32).
  /// k_scale / v_scale: a float or a one-element tensor. logits_soft_cap > 0 overrides plan's.
  /// kv_cache_sf: NVFP4 block scales of a torch.uint8 cache (plan's kv_data_type=torch.uint8),
  /// one tensor or a (k_sf, v_sf) pair like kv_cache, V's 4-token interleaved as the paged
  /// wrappers' (CPU only). profiler_buffer is not supported.
  AttentionOutput run(const Tensor& q, const PagedKVCache& kv_cache,
                      std::optional<Tensor> out = std::nullopt,
                      std::optional<Tensor> lse = std::nullopt,
                      std::optional<ScalarOrTensor<double>> k_scale = std::nullopt,
                      std::optional<ScalarOrTensor<double>> v_scale = std::nullopt,
                      std::optional<double> logits_soft_cap = 0.0,
                      std::optional<Tensor> profiler_buffer = std::nullopt,
                      std::optional<PagedKVCache> kv_cache_sf = std::nullopt);

  std::string_view class_name() const override { return "BatchAttention"; }
  std::string_view module_name() const override { return "flashinfer.attention._core"; }

 private:
  std::unique_ptr<detail::WrapperState> s_;
};

}  // namespace flashinfer
