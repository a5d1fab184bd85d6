// DeepSeek MLA (multi-head latent attention) over the compressed latent KV cache: the
// wrapper of flashinfer.mla._core, the trtllm/xqa block-table entry points, and the layout
// helpers flashinfer.page.append_paged_mla_kv_cache and flashinfer.concat_ops.concat_mla_k.
//
// The latent cache holds, per token, one compressed KV row ckv [head_dim_ckv] (the value, and
// the "nope" half of the key) and one rope key row kpe [head_dim_kpe], shared by every head. The
// score of query head h and token j is
//   s = sm_scale * (q_nope[h] . ckv[j] + q_pe[h] . kpe[j])
// and the output is softmax(s) over the visible tokens applied to the ckv rows. DeepSeek uses
// head_dim_ckv 512 and head_dim_kpe 64; the CPU reference takes any positive dims.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "flashinfer/dtype.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/ops/attention.h"
#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

namespace detail {
struct MlaWrapperState;
struct MlaWrapperAccess;  // the recorder's extension of run (src/api/mla.cpp)
}  // namespace detail

/// BatchMLAPagedAttentionWrapper.plan's keyword-only arguments (upstream 0.7.4), in its order.
///   metadata: an MLAPlanMetadata object: refused (upstream's recorder keeps only its repr, so a
///   plan made with it replays nowhere, upstream's replay included); pass its fields flat.
///   cum_seq_lens_q [batch + 1], block_tables [batch, width], seq_lens [batch] (int32), and
///   max_q_len (at least the longest request's queries): the flat dense form, read as the CSR
///   plan qo_indptr = cum_seq_lens_q, kv_len_arr = seq_lens, request b's pages the first
///   ceil(seq_lens[b] / page_size) ids of block_tables[b] (copied at plan, as upstream's fa2 /
///   fa3 plan copies them).
///   query_layout / kv_cache_layout: "packed" or "split" (None: "split" for the flat forms).
///   lse_mode "none", "base2" or "basee": the LSE every run must ask for (a flat CSR plan of
///   "none" takes either, as upstream's compatibility path does). output_dtype: run's out dtype
///   (None: q_data_type; another is refused, as upstream's fa2 / fa3). scale_mode "default",
///   "kv-per-tensor" (an fp8 cache: ckv_scale / kpe_scale at run; an fp8 cache planned
///   "default" becomes it, upstream's rule), "bmm-scalar" / "bmm-tensor" (run's bmm1_scale
///   replaces sm_scale and bmm2_scale multiplies the output). enable_pdl: taken, no effect.
///   Refused (kUnsupported): output_scale "per-tensor", skip_softmax, use_sinks.
struct MlaPlanOptions {
  Value metadata = Value();
  std::optional<Tensor> cum_seq_lens_q = std::nullopt, block_tables = std::nullopt,
                        seq_lens = std::nullopt;
  std::optional<int64_t> max_q_len = std::nullopt;
  std::optional<std::string> query_layout = std::nullopt, kv_cache_layout = std::nullopt;
  std::string lse_mode = "none";
  std::optional<DType> output_dtype = std::nullopt;
  std::string output_scale = "none";
  std::string scale_mode = "default";
  bool skip_softmax = false;
  std::optional<bool> enable_pdl = std::nullopt;
  bool use_sinks = false;
};
FLASHINFER_OPTION_FIELDS(MlaPlanOptions, metadata, cum_seq_lens_q, block_tables, seq_lens,
                         max_q_len, query_layout, kv_cache_layout, lse_mode, output_dtype,
                         output_scale, scale_mode, skip_softmax, enable_pdl, use_sinks);

/// BatchMLAPagedAttentionWrapper.run's keyword-only arguments, in upstream 0.7.4's order.
///   query: q as one tensor [rows, H, head_dim_ckv + head_dim_kpe] (q_nope | q_pe), a tuple
///   (q_nope, q_pe), or upstream's dual value (packed, (q_nope, q_pe)) / ((q_nope, q_pe),
///   packed), whose split member is used; kv_cache: the same for [pages, page_size, head_dim_ckv
///   + head_dim_kpe] (ckv | kpe) or (ckv_cache, kpe_cache). Either replaces the legacy pair.
///   ckv_scale / ckv_scale_arr / kpe_scale: an fp8 cache's scales (see run). bmm1_scale /
///   bmm2_scale (a number, or an fp32 one-element tensor; together, of one kind, a plan of
///   scale_mode "bmm-scalar" / "bmm-tensor"). sinks and skip_softmax_threshold_scale_factor:
///   refused unless planned (and planning them is refused).
struct MlaRunOptions {
  Value query = Value(), kv_cache = Value();
  std::optional<double> ckv_scale = std::nullopt;
  std::optional<Tensor> ckv_scale_arr = std::nullopt;
  std::optional<double> kpe_scale = std::nullopt;
  std::optional<Tensor> sinks = std::nullopt;
  std::optional<double> skip_softmax_threshold_scale_factor = std::nullopt;
  std::optional<ScalarOrTensor<double>> bmm1_scale = std::nullopt, bmm2_scale = std::nullopt;
};
FLASHINFER_OPTION_FIELDS(MlaRunOptions, query, kv_cache, ckv_scale, ckv_scale_arr, kpe_scale, sinks,
                         skip_softmax_threshold_scale_factor, bmm1_scale, bmm2_scale);

/// flashinfer.page.append_paged_mla_kv_cache: writes append_ckv[i] ([nnz, ckv_dim]) and
/// append_kpe[i] ([nnz, kpe_dim]) into ckv_cache [pages, page_size, ckv_dim] and kpe_cache
/// [pages, page_size, kpe_dim] (same dtype) at request batch_indices[i], position positions[i]
/// (int32 [nnz]). The page table (kv_indices, kv_indptr [batch + 1], kv_last_page_len [batch])
/// must already include the new tokens; every index is checked on the host first. Both caches
/// are required (upstream's annotation allows None, its kernel does not), so they are plain
/// tensors here.
void append_paged_mla_kv_cache(const Tensor& append_ckv, const Tensor& append_kpe,
                               const Tensor& batch_indices, const Tensor& positions,
                               const Tensor& ckv_cache, const Tensor& kpe_cache,
                               const Tensor& kv_indices, const Tensor& kv_indptr,
                               const Tensor& kv_last_page_len);

/// flashinfer.concat_ops.concat_mla_k: k[t, h, :nope_dim] = k_nope[t, h] and
/// k[t, h, nope_dim:] = k_rope[t, 0] for every head h (the rope part is shared by the heads).
///   k [tokens, H, nope_dim + rope_dim] (written), k_nope [tokens, H, nope_dim], k_rope
///   [tokens, 1, rope_dim]; one dtype among fp16, bf16, fp8 e4m3fn/e5m2 (bit-exact copies).
///   backend (upstream 0.7.4): "default" or "cake", the same copy.
void concat_mla_k(const Tensor& k, const Tensor& k_nope, const Tensor& k_rope,
                  const std::string& backend = "default");

/// flashinfer.mla._core.BatchMLAPagedAttentionWrapper: decode and chunked prefill over the
/// paged latent cache (plan once per batch, run per layer).
class BatchMLAPagedAttentionWrapper : public ApiObject {
 public:
  /// float_workspace_buffer: scratch on the device the wrapper runs on (the CPU reference needs
  /// none). Under use_cuda_graph, plan copies its four index tensors into the buffers given here
  /// (on the wrapper's device, int32, contiguous), as upstream's plan does, and run reads the
  /// page ids from the kv_indices buffer when it runs (ids written there after plan count).
  /// backend "auto", "fa2" or "fa3".
  explicit BatchMLAPagedAttentionWrapper(Tensor float_workspace_buffer, bool use_cuda_graph = false,
                                         std::optional<Tensor> qo_indptr = std::nullopt,
                                         std::optional<Tensor> kv_indptr = std::nullopt,
                                         std::optional<Tensor> kv_indices = std::nullopt,
                                         std::optional<Tensor> kv_len_arr = std::nullopt,
                                         std::string backend = "auto");
  ~BatchMLAPagedAttentionWrapper() override;
  BatchMLAPagedAttentionWrapper(const BatchMLAPagedAttentionWrapper&) = delete;
  BatchMLAPagedAttentionWrapper& operator=(const BatchMLAPagedAttentionWrapper&) = delete;

  /// qo_indptr [batch + 1] (query rows of each request), kv_indptr [batch + 1] (pages of each
  /// request in kv_indices), kv_indices (page ids), kv_len_arr [batch] (tokens of each
  /// request, at most its pages * page_size): int32. Query i of a request of qo_len queries
  /// and kv_len tokens sits at position kv_len - qo_len + i; with causal it sees tokens up to
  /// that position, else all of them. sm_scale multiplies q . k (DeepSeek: 1/sqrt(192)).
  /// Upstream 0.7.4 makes every argument optional: the flat CSR form (these four tensors) or the
  /// flat dense one (options), never both, and the eight geometry arguments all required.
  void plan(std::optional<Tensor> qo_indptr = std::nullopt,
            std::optional<Tensor> kv_indptr = std::nullopt,
            std::optional<Tensor> kv_indices = std::nullopt,
            std::optional<Tensor> kv_len_arr = std::nullopt,
            std::optional<int64_t> num_heads = std::nullopt,
            std::optional<int64_t> head_dim_ckv = std::nullopt,
            std::optional<int64_t> head_dim_kpe = std::nullopt,
            std::optional<int64_t> page_size = std::nullopt,
            std::optional<bool> causal = std::nullopt,
            std::optional<double> sm_scale = std::nullopt,
            std::optional<DType> q_data_type = std::nullopt,
            std::optional<DType> kv_data_type = std::nullopt, bool use_profiler = false,
            const MlaPlanOptions& options = {});

  /// q_nope [rows, H, head_dim_ckv], q_pe [rows, H, head_dim_kpe] (q_data_type); ckv_cache
  /// [pages, page_size, head_dim_ckv], kpe_cache [pages, page_size, head_dim_kpe]
  /// (kv_data_type: fp16, bf16 or fp8, dequantized by ckv_scale / kpe_scale, or for an e4m3
  /// cache ckv_scale_arr: fp32 [pages, page_size, head_dim_ckv / 128], one scale per token and
  /// 128 channels, each value rounded to q's dtype). Returns out [rows, H, head_dim_ckv] in q's
  /// dtype, and with return_lse the fp32 lse [rows, H] (base 2, natural log with
  /// return_lse_base_on_e). A row that sees no token gives 0 and -inf.
  /// Unsupported (kUnsupported when given): profiler_buffer, kv_len, page_table (the cutlass
  /// backend's arguments). o_scale is refused as upstream 0.7.4 refuses what was not planned.
  /// q_nope / q_pe and ckv_cache / kpe_cache may instead come as options.query / kv_cache.
  AttentionOutput run(
      std::optional<Tensor> q_nope = std::nullopt, std::optional<Tensor> q_pe = std::nullopt,
      std::optional<Tensor> ckv_cache = std::nullopt,
      std::optional<Tensor> kpe_cache = std::nullopt, std::optional<Tensor> out = std::nullopt,
      std::optional<Tensor> lse = std::nullopt, bool return_lse = false,
      std::optional<Tensor> profiler_buffer = std::nullopt,
      std::optional<Tensor> kv_len = std::nullopt, std::optional<Tensor> page_table = std::nullopt,
      bool return_lse_base_on_e = false, std::optional<double> o_scale = std::nullopt,
      const MlaRunOptions& options = {});

  std::string_view class_name() const override { return "BatchMLAPagedAttentionWrapper"; }
  std::string_view module_name() const override { return "flashinfer.mla._core"; }

 private:
  friend struct detail::MlaWrapperAccess;
  std::unique_ptr<detail::MlaWrapperState> s_;
};

/// flashinfer.mla._core.trtllm_batch_decode_with_kv_cache_mla: MLA decode (and multi-token
/// prediction) over a block-table latent cache.
///   query [batch, q_len, H, kv_lora_rank + qk_rope_head_dim] (q_nope then q_pe), or
///   [total_q, H, ...] with cum_seq_lens_q (int32 [batch + 1], batch = seq_lens' length; then
///   max_q_len, if given, bounds every request's queries);
///   kv_cache [pages, page_size, kv_lora_rank + qk_rope_head_dim] or [pages, 1, page_size, ...]
///   (ckv then kpe); block_tables [batch, max_blocks] int32 page ids (entries past a request's
///   length are never read); seq_lens [batch] int32 (<= max_seq_len).
/// s = bmm1_scale * (q . k) (bmm1_scale folds sm_scale and the fp8 q/k scales), o = bmm2_scale *
/// softmax(s) . ckv. A request's several queries are its last tokens, causal among themselves.
/// Returns out [batch, q_len, H, kv_lora_rank] ([total_q, H, kv_lora_rank] ragged) in query's
/// dtype (bf16 for an fp8 query), and with return_lse also the LSE (`lse` [rows, H] or
/// [batch, q_len, H] fp32, written when passed): log2 sum_j exp(s_j) (trtllm-gen's), the natural
/// log for backend "cute-dsl", context parallelism, and ragged queries under "auto" (where
/// upstream sends them); -inf for a query that sees no key, whose output is 0. return_lse_base
/// (0.7.4) "basee" / "base2" picks the base whatever the backend; None keeps those defaults.
/// sparse_mla_top_k > 0 (DeepSeek's DSA; the CPU reference only): block_tables [batch, q_len,
/// top_k] ([total_q, top_k] ragged) of token slots page * page_size + offset, -1 for none; query t
/// of a request's L sees the first min(top_k, seq_lens[b] - (L - 1 - t)) entries of its row, or
/// sparse_mla_top_k_lens[row] of them (the qk_rope_head_dim=0 path, which requires them).
/// enable_dcp (context parallelism, cute-dsl's; the CPU reference only): the cache holds this
/// rank's keys, global position cp_world * k + cp_rank; query t of L sees those at most
/// causal_seqlens_kv_global[b] - L + t; return_lse required. qk_nope_head_dim is the model's
/// (unused by the math). Unsupported (kUnsupported): sinks, skip_softmax_threshold_scale_factor,
/// use_fp16_softmax, uses_shared_paged_kv_idx=False; upstream's refusals by backend (sparse off
/// trtllm-gen, DCP off cute-dsl, an LSE from xqa or from trtllm-gen with ragged queries).
AttentionOutput trtllm_batch_decode_with_kv_cache_mla(
    const Tensor& query, const Tensor& kv_cache, const Tensor& workspace_buffer,
    int64_t qk_nope_head_dim, int64_t kv_lora_rank, int64_t qk_rope_head_dim,
    const Tensor& block_tables, const Tensor& seq_lens, int64_t max_seq_len,
    int64_t sparse_mla_top_k = 0, std::optional<Tensor> out = std::nullopt,
    ScalarOrTensor<double> bmm1_scale = 1.0, ScalarOrTensor<double> bmm2_scale = 1.0,
    std::optional<Tensor> sinks = std::nullopt,
    std::optional<double> skip_softmax_threshold_scale_factor = std::nullopt,
    std::optional<bool> enable_pdl = std::nullopt, std::string_view backend = "auto",
    bool is_var_seq = true, bool uses_shared_paged_kv_idx = true,
    std::optional<Tensor> lse = std::nullopt, bool return_lse = false,
    std::string_view cute_dsl_impl = "auto", std::string_view kv_scale_format = "auto",
    std::optional<Tensor> cum_seq_lens_q = std::nullopt,
    std::optional<int64_t> max_q_len = std::nullopt,
    std::optional<Tensor> multi_ctas_kv_counter_buffer = std::nullopt,
    std::optional<Tensor> sparse_mla_top_k_lens = std::nullopt, bool enable_dcp = false,
    int64_t cp_world = 1, int64_t cp_rank = 0,
    std::optional<Tensor> causal_seqlens_kv_global = std::nullopt,
    std::optional<bool> use_fp16_softmax = std::nullopt,
    std::optional<std::string> return_lse_base = std::nullopt);

/// flashinfer.mla._core.xqa_batch_decode_with_kv_cache_mla: the same computation under the
/// XQA backend's name (upstream requires q_len 1; this library accepts any, causal as above).
Tensor xqa_batch_decode_with_kv_cache_mla(
    const Tensor& query, const Tensor& kv_cache, const Tensor& workspace_buffer,
    int64_t qk_nope_head_dim, int64_t kv_lora_rank, int64_t qk_rope_head_dim,
    const Tensor& block_tables, const Tensor& seq_lens, int64_t max_seq_len,
    std::optional<Tensor> out = std::nullopt, ScalarOrTensor<double> bmm1_scale = 1.0,
    ScalarOrTensor<double> bmm2_scale = 1.0, std::optional<Tensor> sinks = std::nullopt,
    std::optional<bool> enable_pdl = std::nullopt);

/// flashinfer.decode.BatchDecodeMlaWithPagedKVCacheWrapper: upstream's older (deprecated, SM80)
/// MLA decode wrapper, one query per request over the paged latent cache. The math is
/// BatchMLAPagedAttentionWrapper's with one query row per request at the request's last position:
///   s = sm_scale * q_scale * k_scale * (q_nope[h] . ckv[j] + q_pe[h] . kpe[j]),
///   out = v_scale * softmax(s) . ckv.
/// Upstream's two kernels for it (attention/decode.cuh BatchDecodeWithPagedKVCacheKernelMLA and
/// decode_mla_cute_sm80.cuh) take window_left, logits_soft_cap, rope_scale and rope_theta but
/// apply none of them (no mask, no cap, no rotation: q_pe and kpe arrive rotated), so they are
/// accepted, recorded and have no effect here either.
class BatchDecodeMlaWithPagedKVCacheWrapper : public ApiObject {
 public:
  /// float_workspace_buffer: scratch on the device the wrapper runs on. The CUDA-graph buffers
  /// and use_tensor_cores (upstream's fp16-only kernel choice) are accepted and unused.
  explicit BatchDecodeMlaWithPagedKVCacheWrapper(
      Tensor float_workspace_buffer, bool use_cuda_graph = false, bool use_tensor_cores = false,
      std::optional<Tensor> paged_kv_indptr_buffer = std::nullopt,
      std::optional<Tensor> paged_kv_indices_buffer = std::nullopt,
      std::optional<Tensor> paged_kv_last_page_len_buffer = std::nullopt);
  ~BatchDecodeMlaWithPagedKVCacheWrapper() override;
  BatchDecodeMlaWithPagedKVCacheWrapper(const BatchDecodeMlaWithPagedKVCacheWrapper&) = delete;
  BatchDecodeMlaWithPagedKVCacheWrapper& operator=(const BatchDecodeMlaWithPagedKVCacheWrapper&) =
      delete;

  /// indptr [batch + 1], indices, last_page_len [batch] (int32): the usual page table; request b
  /// holds (pages - 1) * page_size + last_page_len[b] tokens. head_dim_compressed_kv is
  /// kv_lora_rank (512 for DeepSeek). data_type is the cache's dtype, q_data_type q's (default
  /// data_type). logits_soft_cap must not be negative.
  void plan(const Tensor& indptr, const Tensor& indices, const Tensor& last_page_len,
            int64_t num_qo_heads, int64_t head_dim_compressed_kv, int64_t page_size,
            double sm_scale, int64_t window_left = -1,
            std::optional<double> logits_soft_cap = std::nullopt, DType data_type = DType::kFloat16,
            std::optional<DType> q_data_type = std::nullopt,
            std::optional<double> rope_scale = std::nullopt,
            std::optional<double> rope_theta = std::nullopt);

  /// q_nope [batch, H, head_dim_ckv], q_pe [batch, H, head_dim_kpe]; paged_ckv_cache
  /// [pages, page_size, head_dim_ckv], paged_kpe_cache [pages, page_size, head_dim_kpe]
  /// (head_dim_kpe is q_pe's; upstream builds 64 only). Returns out [batch, H, head_dim_ckv] in
  /// q's dtype and, with return_lse, the fp32 base-2 lse [batch, H]. A given lse is filled even
  /// without return_lse, as upstream's kernel does. enable_pdl is accepted and unused (SM80).
  AttentionOutput run(const Tensor& q_nope, const Tensor& q_pe, const Tensor& paged_ckv_cache,
                      const Tensor& paged_kpe_cache, std::optional<double> q_scale = std::nullopt,
                      std::optional<double> k_scale = std::nullopt,
                      std::optional<double> v_scale = std::nullopt,
                      std::optional<Tensor> out = std::nullopt,
                      std::optional<Tensor> lse = std::nullopt, bool return_lse = false,
                      bool enable_pdl = false);

  std::string_view class_name() const override { return "BatchDecodeMlaWithPagedKVCacheWrapper"; }
  std::string_view module_name() const override { return "flashinfer.decode"; }

 private:
  std::unique_ptr<detail::MlaWrapperState> s_;
};

}  // namespace flashinfer
