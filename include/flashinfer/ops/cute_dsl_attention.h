// Upstream's CuTe-DSL attention wrappers (flashinfer.cute_dsl.attention.wrappers: batch_decode,
// batch_prefill, batch_mla): decode over equal-length or paged K/V with sliding windows, sinks
// and a base-2 LSE, ragged or paged prefill, and DeepSeek MLA decode over a block table. Upstream
// compiles them for Blackwell's tcgen05 (SM100 / SM103 / SM110); here they have an exact CPU
// reference and upstream's refusal elsewhere on CUDA (docs/ATTENTION.md, "CuTe-DSL attention
// wrappers").
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "flashinfer/dtype.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/ops/attention.h"
#include "flashinfer/ops/page.h"
#include "flashinfer/tensor.h"

namespace flashinfer {

/// A CuTe-DSL wrapper's plan (private).
struct CuteDslPlan;

/// BatchDecodeCuteDSLWrapper.plan()'s keywords (upstream takes them through **kwargs; the
/// deprecated `is_causal` maps to the window arguments and may not be combined with them).
struct CuteDslDecodePlanOptions {
  DType q_data_type = DType::kBFloat16;
  std::optional<DType> kv_data_type;  // must equal q_data_type
  std::optional<DType> o_data_type;   // default q_data_type
  std::optional<double> sm_scale;     // default 1/sqrt(head_dim)
  std::optional<int64_t> kv_splits;   // <= 0 or None: chosen as upstream does
  std::string reduction = "auto";     // "auto", "none", "atomic", "kernel"
  int64_t q_len_per_req = 1;
  std::optional<int64_t> window_left;       // None: unbounded
  std::optional<int64_t> window_right = 0;  // None: unbounded; 0 (default): causal
  std::optional<bool> is_causal;            // deprecated
};
FLASHINFER_OPTION_FIELDS(CuteDslDecodePlanOptions, q_data_type, kv_data_type, o_data_type, sm_scale,
                         kv_splits, reduction, q_len_per_req, window_left, window_right, is_causal);

/// BatchDecodePagedCuteDSLWrapper.plan()'s keywords: the above and the paged ones.
struct CuteDslPagedDecodePlanOptions {
  DType q_data_type = DType::kBFloat16;
  std::optional<DType> kv_data_type;
  std::optional<DType> o_data_type;
  std::optional<double> sm_scale;
  std::optional<int64_t> kv_splits;
  std::string reduction = "auto";
  int64_t q_len_per_req = 1;
  std::optional<int64_t> window_left;
  std::optional<int64_t> window_right = 0;
  std::optional<bool> is_causal;
  std::optional<int64_t> max_kv_len;  // default the largest seq_lens entry
  bool non_blocking = true;
  bool precompile_skip_softmax_kernel = false;
};
FLASHINFER_OPTION_FIELDS(CuteDslPagedDecodePlanOptions, q_data_type, kv_data_type, o_data_type,
                         sm_scale, kv_splits, reduction, q_len_per_req, window_left, window_right,
                         is_causal, max_kv_len, non_blocking, precompile_skip_softmax_kernel);

/// BatchDecodeCuteDSLWrapper.run()'s keywords. out / lse are written and returned (lse: fp32
/// [b, q_len, Hq], base 2); sinks fp32 [Hq]; o_scale multiplies the output; sm_scale overrides
/// the plan's.
struct CuteDslDecodeRunOptions {
  std::optional<Tensor> out;
  std::optional<double> sm_scale;
  std::optional<double> o_scale;
  std::optional<Tensor> sinks;
  std::optional<Tensor> lse;
  bool enable_pdl = true;
};
FLASHINFER_OPTION_FIELDS(CuteDslDecodeRunOptions, out, sm_scale, o_scale, sinks, lse, enable_pdl);

/// BatchDecodePagedCuteDSLWrapper.run()'s keywords: the above and BLASST's threshold (> 0;
/// upstream skips softmax blocks below it: the CPU reference computes every block).
struct CuteDslPagedDecodeRunOptions {
  std::optional<Tensor> out;
  std::optional<double> sm_scale;
  std::optional<double> o_scale;
  std::optional<Tensor> sinks;
  std::optional<double> skip_softmax_threshold_scale_factor;
  std::optional<Tensor> lse;
  bool enable_pdl = true;
};
FLASHINFER_OPTION_FIELDS(CuteDslPagedDecodeRunOptions, out, sm_scale, o_scale, sinks,
                         skip_softmax_threshold_scale_factor, lse, enable_pdl);

/// Decode over equal-length K/V: q [b, q_len, Hq, D], k / v [b, s_kv, Hkv, D] (D contiguous,
/// other strides free). Query i sees keys t with cur - window_left <= t <= cur + window_right,
/// cur = s_kv - q_len + i (None: no bound; the default (None, 0) is causal). Output
/// [b, q_len, Hq, D] in o_data_type.
class BatchDecodeCuteDSLWrapper : public ApiObject {
 public:
  explicit BatchDecodeCuteDSLWrapper(Tensor float_workspace_buffer, bool use_cuda_graph = false);
  ~BatchDecodeCuteDSLWrapper() override;
  BatchDecodeCuteDSLWrapper(const BatchDecodeCuteDSLWrapper&) = delete;
  BatchDecodeCuteDSLWrapper& operator=(const BatchDecodeCuteDSLWrapper&) = delete;
  void plan(int64_t batch_size, int64_t max_kv_len, int64_t num_qo_heads, int64_t num_kv_heads,
            int64_t head_dim, const CuteDslDecodePlanOptions& options = {});
  Tensor run(const Tensor& q, const Tensor& k, const Tensor& v,
             const CuteDslDecodeRunOptions& options = {});
  std::string_view class_name() const override { return "BatchDecodeCuteDSLWrapper"; }
  std::string_view module_name() const override {
    return "flashinfer.cute_dsl.attention.wrappers.batch_decode";
  }
  /// The plan's KV split and reduction ("none", "atomic" or "kernel"), as upstream resolves them.
  int64_t kv_splits() const;
  std::string reduction() const;

 private:
  std::unique_ptr<CuteDslPlan> s_;
};

/// Decode over a paged NHD-logical cache: indptr [>= B] (each request's first entry in
/// indices), indices (page ids), seq_lens [B] (tokens a request: not last_page_len);
/// page_size 8 / 16 / 32 / 64. run: q [B * q_len, Hq, D] or [B, q_len, Hq, D], k_cache / v_cache
/// [pages, page_size, Hkv, D] logical (an HND cache as a transposed view; D contiguous).
class BatchDecodePagedCuteDSLWrapper : public ApiObject {
 public:
  explicit BatchDecodePagedCuteDSLWrapper(Tensor float_workspace_buffer,
                                          bool use_cuda_graph = false);
  ~BatchDecodePagedCuteDSLWrapper() override;
  BatchDecodePagedCuteDSLWrapper(const BatchDecodePagedCuteDSLWrapper&) = delete;
  BatchDecodePagedCuteDSLWrapper& operator=(const BatchDecodePagedCuteDSLWrapper&) = delete;
  void plan(const Tensor& indptr, const Tensor& indices, const Tensor& seq_lens,
            int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim, int64_t page_size,
            const CuteDslPagedDecodePlanOptions& options = {});
  Tensor run(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
             const CuteDslPagedDecodeRunOptions& options = {});
  std::string_view class_name() const override { return "BatchDecodePagedCuteDSLWrapper"; }
  std::string_view module_name() const override {
    return "flashinfer.cute_dsl.attention.wrappers.batch_decode";
  }

 private:
  std::unique_ptr<CuteDslPlan> s_;
};

/// Prefill over ragged q / k / v ([total, H, D] by qo_indptr / kv_indptr) or a paged cache
/// (paged_kv_indptr / indices / last_page_len with page_size; run_paged). Causal by default
/// (bottom-right); window_left / window_right -1: unbounded. fp16, bf16 or e4m3 (fp16 output);
/// run returns out, or (out, lse) with return_lse (fp32 [total_q, Hq], base 2).
class BatchPrefillCuteDSLWrapper : public ApiObject {
 public:
  explicit BatchPrefillCuteDSLWrapper(Tensor float_workspace_buffer, bool use_cuda_graph = false);
  ~BatchPrefillCuteDSLWrapper() override;
  BatchPrefillCuteDSLWrapper(const BatchPrefillCuteDSLWrapper&) = delete;
  BatchPrefillCuteDSLWrapper& operator=(const BatchPrefillCuteDSLWrapper&) = delete;
  /// variant: upstream's AttentionVariant object (ALiBi, sigmoid, ...): only None here.
  void plan(const Tensor& qo_indptr, std::optional<Tensor> kv_indptr = std::nullopt,
            std::optional<int64_t> num_qo_heads = std::nullopt,
            std::optional<int64_t> num_kv_heads = std::nullopt,
            std::optional<int64_t> head_dim_qk = std::nullopt,
            std::optional<int64_t> head_dim_vo = std::nullopt, bool causal = true,
            std::optional<double> sm_scale = std::nullopt, DType q_data_type = DType::kFloat16,
            DType kv_data_type = DType::kFloat16, int64_t window_left = -1,
            std::optional<Value> variant = std::nullopt, int64_t window_right = -1,
            std::optional<int64_t> page_size = std::nullopt,
            std::optional<Tensor> paged_kv_indptr = std::nullopt,
            std::optional<Tensor> paged_kv_indices = std::nullopt,
            std::optional<Tensor> paged_kv_last_page_len = std::nullopt,
            std::string kv_layout = "NHD");
  AttentionOutput run(const Tensor& q, const Tensor& k, const Tensor& v,
                      std::optional<Tensor> out = std::nullopt, bool return_lse = false,
                      std::optional<Tensor> lse = std::nullopt);
  AttentionOutput run_paged(const Tensor& q, const PagedKVCache& paged_kv_cache,
                            std::optional<Tensor> out = std::nullopt, bool return_lse = false,
                            std::optional<Tensor> lse = std::nullopt);
  std::string_view class_name() const override { return "BatchPrefillCuteDSLWrapper"; }
  std::string_view module_name() const override {
    return "flashinfer.cute_dsl.attention.wrappers.batch_prefill";
  }

 private:
  std::unique_ptr<CuteDslPlan> s_;
};

/// DeepSeek MLA decode: q [B, q_len, H, 576] (latent 512 then rope 64), kv_cache
/// [pages, page_size, 576] (or [pages, 1, page_size, 576]) whose latent part is also V,
/// block_tables [B, max_pages] int32, seq_lens [B]; out = softmax(q.c * softmax_scale) @
/// c[:, :512] * output_scale, [B, q_len, H, 512] (no mask among a request's queries).
class BatchMLADecodeCuteDSLWrapper : public ApiObject {
 public:
  explicit BatchMLADecodeCuteDSLWrapper(Tensor workspace_buffer);
  ~BatchMLADecodeCuteDSLWrapper() override;
  BatchMLADecodeCuteDSLWrapper(const BatchMLADecodeCuteDSLWrapper&) = delete;
  BatchMLADecodeCuteDSLWrapper& operator=(const BatchMLADecodeCuteDSLWrapper&) = delete;
  void plan(int64_t kv_lora_rank = 512, int64_t qk_rope_head_dim = 64, int64_t num_heads = 128,
            int64_t page_size = 1, DType q_dtype = DType::kBFloat16,
            std::optional<DType> out_dtype = std::nullopt, bool is_var_seq = true,
            std::optional<bool> enable_pdl = std::nullopt,
            std::optional<Value> variant = std::nullopt);
  Tensor run(const Tensor& q, const Tensor& kv_cache, const Tensor& block_tables,
             const Tensor& seq_lens, int64_t max_seq_len, double softmax_scale,
             double output_scale = 1.0, std::optional<Tensor> out = std::nullopt);
  std::string_view class_name() const override { return "BatchMLADecodeCuteDSLWrapper"; }
  std::string_view module_name() const override {
    return "flashinfer.cute_dsl.attention.wrappers.batch_mla";
  }

 private:
  std::unique_ptr<CuteDslPlan> s_;
};

}  // namespace flashinfer
