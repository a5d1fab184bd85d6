// POD attention (FlashInfer module flashinfer.pod): a prefill and a decode batch computed in one
// call (upstream fuses them into one kernel launch; here they run one after the other with the
// same math). Shapes, dtypes and layouts as the batch wrappers (attention.h). As upstream:
// the decode part is planned by plan() and attends non-causally with plan's sm_scale (default
// 1/sqrt(head_dim)) times q_scale * k_scale, its output times v_scale; the prefill part uses
// run()'s causal / mask and no q/k/v scale.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "flashinfer/dtype.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/ops/attention.h"
#include "flashinfer/ops/page.h"
#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// What the POD wrappers' run() returns, recorded as upstream returns it: (out_p, out_d), or with
/// BatchPOD's return_lse ((out_p, out_d), (lse_p, lse_d)).
struct PodOutput {
  Tensor out_p, out_d;
  Tensor lse_p, lse_d;  // defined only with BatchPODWithPagedKVCacheWrapper.run(return_lse=True)
};
Value to_value(const PodOutput& r);

/// One prefill request (q_p against k_p / v_p, single_prefill_with_kv_cache's math) and a batch
/// of decode requests (one query each) over a paged cache.
class PODWithPagedKVCacheWrapper : public ApiObject {
 public:
  explicit PODWithPagedKVCacheWrapper(
      Tensor float_workspace_buffer, std::string kv_layout = "NHD", bool use_cuda_graph = false,
      std::optional<Tensor> paged_kv_indptr_buffer = std::nullopt,
      std::optional<Tensor> paged_kv_indices_buffer = std::nullopt,
      std::optional<Tensor> paged_kv_last_page_len_buffer = std::nullopt,
      std::optional<Value> jit_args = std::nullopt);
  ~PODWithPagedKVCacheWrapper() override;
  PODWithPagedKVCacheWrapper(const PODWithPagedKVCacheWrapper&) = delete;
  PODWithPagedKVCacheWrapper& operator=(const PODWithPagedKVCacheWrapper&) = delete;

  /// The decode requests' page table (int32). q_data_type (None: data_type); kv_data_type
  /// default data_type, then q_data_type. pos_encoding_mode / rope_scale / rope_theta: the
  /// decode part's (CPU only for ROPE_LLAMA and ALIBI, run inside the prefill kernel upstream).
  void plan(const Tensor& indptr, const Tensor& indices, const Tensor& last_page_len,
            int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim, int64_t page_size,
            std::string_view pos_encoding_mode = "NONE", int64_t window_left = -1,
            std::optional<DType> q_data_type = DType::kFloat16,
            std::optional<DType> kv_data_type = std::nullopt,
            std::optional<DType> data_type = std::nullopt,
            std::optional<double> sm_scale = std::nullopt,
            std::optional<double> rope_scale = std::nullopt,
            std::optional<double> rope_theta = std::nullopt, bool non_blocking = true);

  /// q_p [qo_len, Hq, D], k_p / v_p [kv_len, Hkv, D] (kv_layout_p); q_d [batch, Hq, D] against
  /// paged_kv_cache_d (the wrapper's layout). Returns (out_p, out_d). As upstream, the *_d
  /// options other than the scales are not read (the decode part follows plan()), and
  /// return_lse_p / return_lse_d change nothing in the result; use_fp16_qk_reduction has no
  /// effect (fp32 scores).
  PodOutput run(const Tensor& q_p, const Tensor& k_p, const Tensor& v_p, const Tensor& q_d,
                const PagedKVCache& paged_kv_cache_d,
                std::optional<Tensor> custom_mask_p = std::nullopt,
                std::optional<Tensor> packed_custom_mask_p = std::nullopt, bool causal_p = false,
                std::string_view kv_layout_p = "NHD", std::string_view pos_encoding_mode_p = "NONE",
                std::optional<double> sm_scale_p = std::nullopt, int64_t window_left_p = -1,
                std::optional<double> rope_scale_p = std::nullopt,
                std::optional<double> rope_theta_p = std::nullopt, bool return_lse_p = false,
                std::optional<Tensor> custom_mask_d = std::nullopt,
                std::optional<Tensor> packed_custom_mask_d = std::nullopt, bool causal_d = false,
                std::string_view kv_layout_d = "NHD", std::string_view pos_encoding_mode_d = "NONE",
                std::optional<double> sm_scale_d = std::nullopt, int64_t window_left_d = -1,
                std::optional<double> rope_scale_d = std::nullopt,
                std::optional<double> rope_theta_d = std::nullopt,
                std::optional<double> q_scale = std::nullopt,
                std::optional<double> k_scale = std::nullopt,
                std::optional<double> v_scale = std::nullopt, bool return_lse_d = false,
                bool use_fp16_qk_reduction = false, std::optional<bool> enable_pdl = std::nullopt);

  std::string_view class_name() const override { return "PODWithPagedKVCacheWrapper"; }
  std::string_view module_name() const override { return "flashinfer.pod"; }

 private:
  std::unique_ptr<detail::WrapperState> s_;
};

/// A batch of prefill requests and a batch of decode requests, each over its own paged cache
/// (the same layout), planned together.
class BatchPODWithPagedKVCacheWrapper : public ApiObject {
 public:
  explicit BatchPODWithPagedKVCacheWrapper(Tensor float_workspace_buffer,
                                           std::string kv_layout = "NHD");
  ~BatchPODWithPagedKVCacheWrapper() override;
  BatchPODWithPagedKVCacheWrapper(const BatchPODWithPagedKVCacheWrapper&) = delete;
  BatchPODWithPagedKVCacheWrapper& operator=(const BatchPODWithPagedKVCacheWrapper&) = delete;

  /// The prefill (_p) and decode (_d) batches: qo_indptr [batch + 1] and page tables, int32.
  /// Both parts use window_left and sm_scale (default 1/sqrt(head_dim)).
  void plan(const Tensor& qo_indptr_p, const Tensor& kv_indptr_p, const Tensor& kv_indices_p,
            const Tensor& last_page_len_p, const Tensor& qo_indptr_d, const Tensor& kv_indptr_d,
            const Tensor& kv_indices_d, const Tensor& last_page_len_d, int64_t num_qo_heads,
            int64_t num_kv_heads, int64_t head_dim, int64_t page_size,
            std::string_view pos_encoding_mode = "NONE", int64_t window_left = -1,
            std::optional<DType> q_data_type = DType::kFloat16,
            std::optional<DType> kv_data_type = std::nullopt,
            std::optional<DType> data_type = std::nullopt,
            std::optional<double> sm_scale = std::nullopt,
            std::optional<double> rope_scale = std::nullopt,
            std::optional<double> rope_theta = std::nullopt, bool non_blocking = true);

  /// Prefill rows causal with causal_p (right-aligned per request); decode rows non-causal,
  /// scaled by q_scale * k_scale, outputs times v_scale. custom_mask_p / packed_custom_mask_p
  /// are not supported (upstream passes them without a per-request index).
  PodOutput run(const Tensor& q_p, const PagedKVCache& paged_kv_cache_p, const Tensor& q_d,
                const PagedKVCache& paged_kv_cache_d,
                std::optional<Tensor> custom_mask_p = std::nullopt,
                std::optional<Tensor> packed_custom_mask_p = std::nullopt, bool causal_p = false,
                std::optional<double> q_scale = std::nullopt,
                std::optional<double> k_scale = std::nullopt,
                std::optional<double> v_scale = std::nullopt, bool return_lse = false,
                bool use_fp16_qk_reduction = false, std::optional<bool> enable_pdl = std::nullopt);

  std::string_view class_name() const override { return "BatchPODWithPagedKVCacheWrapper"; }
  std::string_view module_name() const override { return "flashinfer.pod"; }

 private:
  std::unique_ptr<detail::WrapperState> p_, d_;
};

}  // namespace flashinfer
