// Attention over a KV cache (FlashInfer modules flashinfer.decode and flashinfer.prefill):
// single-request decode/prefill and the batch wrappers over a paged or ragged KV cache.
//
// Shapes: q [tokens, num_qo_heads, head_dim_qk]; KV "NHD" = (tokens, heads, dim), "HND" =
// (heads, tokens, dim). GQA/MQA: num_qo_heads % num_kv_heads == 0, qo head h reads kv head
// h / (num_qo_heads / num_kv_heads). head_dim 64, 128 or 256. q/o fp16 or bf16 (fp32 too on the
// CPU); KV the q dtype, or fp8 e4m3/e5m2 with k_scale/v_scale. Math (fp32 accumulation):
//   s = sm_scale * q.k (sm_scale default 1/sqrt(head_dim_qk), times q_scale * k_scale),
//   s = cap * tanh(s / cap) when logits_soft_cap = cap > 0, o = softmax(s) . v * v_scale.
// Query i of a request with qo_len queries and kv_len keys sits at position kv_len - qo_len + i
// (right-aligned): causal keeps keys j <= that position, window_left = w >= 0 keeps j >= it - w.
// The LSE is base 2: log2(sum_j 2^(s_j * log2 e)). A row with no visible key gives zeros and
// LSE -inf. Only pos_encoding_mode "NONE" is implemented (RoPE is a separate op).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "flashinfer/dtype.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/ops/page.h"
#include "flashinfer/ops/sampling.h"  // ScalarOrTensor
#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// An attention result: `out`, plus `lse` [tokens, num_qo_heads] fp32 when return_lse was set
/// (undefined otherwise). Converts to the output tensor, so `Tensor o = run(...)` works; it is
/// recorded as upstream returns it (the tensor, or the (out, lse) tuple).
struct AttentionOutput {
  Tensor out;
  Tensor lse;
  operator Tensor() const { return out; }  // NOLINT: implicit like upstream's return value
};
Value to_value(const AttentionOutput& r);

/// Decode attention of one request: q [num_qo_heads, D]; k, v [kv_len, Hkv, D] (NHD) or
/// [Hkv, kv_len, D] (HND). Returns o [num_qo_heads, D] in q's dtype (and lse [num_qo_heads]).
AttentionOutput single_decode_with_kv_cache(
    const Tensor& q, const Tensor& k, const Tensor& v, std::string_view kv_layout = "NHD",
    std::string_view pos_encoding_mode = "NONE", bool use_tensor_cores = false,
    std::optional<double> q_scale = std::nullopt, std::optional<double> k_scale = std::nullopt,
    std::optional<double> v_scale = std::nullopt, int64_t window_left = -1,
    std::optional<double> logits_soft_cap = std::nullopt,
    std::optional<double> sm_scale = std::nullopt, std::optional<double> rope_scale = std::nullopt,
    std::optional<double> rope_theta = std::nullopt, bool return_lse = false);

/// Prefill attention of one request: q [qo_len, Hq, Dqk]; k [kv_len, Hkv, Dqk], v [kv_len, Hkv,
/// Dvo] (NHD, or HND). Returns o [qo_len, Hq, Dvo] (and lse [qo_len, Hq]). causal needs
/// kv_len >= qo_len. custom_mask bool [qo_len, kv_len] (true = keep) or packed_custom_mask uint8
/// (little-endian bits of the flattened mask) overrides causal. scale_q [Hq], scale_k [Hkv],
/// scale_v [Hkv] fp32 are optional per-head factors (fp8 inputs); k_scale, v_scale scalars.
/// o_dtype defaults to q's dtype. use_fp16_qk_reduction is accepted and has no effect (scores are
/// always accumulated in fp32). backend "auto" or "fa2". NVFP4 (CPU only): k, v packed uint8
/// [.., head_dim / 2] and kv_cache_sf = (k_sf, v_sf) e4m3 [.., head_dim / 16] laid out like k/v,
/// both linear; k_scale multiplies the score scale, v_scale the output (docs/ATTENTION.md).
AttentionOutput single_prefill_with_kv_cache(
    const Tensor& q, const Tensor& k, const Tensor& v, std::optional<Tensor> scale_q = std::nullopt,
    std::optional<Tensor> scale_k = std::nullopt, std::optional<Tensor> scale_v = std::nullopt,
    std::optional<DType> o_dtype = std::nullopt, std::optional<Tensor> custom_mask = std::nullopt,
    std::optional<Tensor> packed_custom_mask = std::nullopt, bool causal = false,
    std::string_view kv_layout = "NHD", std::string_view pos_encoding_mode = "NONE",
    bool use_fp16_qk_reduction = false, std::optional<double> sm_scale = std::nullopt,
    int64_t window_left = -1, std::optional<double> logits_soft_cap = std::nullopt,
    std::optional<double> rope_scale = std::nullopt,
    std::optional<double> rope_theta = std::nullopt, std::string_view backend = "auto",
    bool return_lse = false, std::optional<PagedKVCache> kv_cache_sf = std::nullopt,
    std::optional<double> k_scale = std::nullopt, std::optional<double> v_scale = std::nullopt);

/// single_prefill_with_kv_cache with return_lse=True (upstream's functools.partial; it is logged
/// and recorded as single_prefill_with_kv_cache). Returns (o, lse).
std::pair<Tensor, Tensor> single_prefill_with_kv_cache_return_lse(
    const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
    std::string_view kv_layout = "NHD", std::optional<double> sm_scale = std::nullopt,
    int64_t window_left = -1, std::optional<double> logits_soft_cap = std::nullopt);

namespace detail {
struct WrapperState;
struct PagedWrapperAccess;  // the recorder's extension of run (src/api/attention_ids_at_run.cpp)
}  // namespace detail

/// What the wrappers' workspace_size() returns, upstream's (float_workspace_size,
/// int_workspace_size) in bytes, recorded as that tuple of ints. The figures are this library's:
/// the fp32 split-KV partials the plan would write (float) and the int32 plan arrays it would copy
/// to the device (int), not upstream's kernels' needs.
struct WorkspaceSizes {
  int64_t float_workspace_size = 0;
  int64_t int_workspace_size = 0;
};
Value to_value(const WorkspaceSizes& w);

/// Keyword arguments of the wrappers' run() (upstream's names; each wrapper declares the ones
/// it takes upstream, and rejects the others when set).
struct AttentionRunOptions {
  std::optional<double> q_scale, k_scale, v_scale;
  std::optional<double> o_scale;  // ragged prefill only (upstream's fa2 backend ignores it)
  std::optional<Tensor> out, lse;
  bool return_lse = false;
  // Prefill wrappers (upstream 0.7.4): the LSE's base, "log2" (the kernels') or "ln" (times
  // fp32 ln 2), and its layout, "NH" [rows, Hq] or "HN" (a contiguous [Hq, rows]; a caller's
  // lse must be that already).
  std::string lse_base = "log2";
  std::string lse_layout = "NH";
  std::optional<bool> enable_pdl;
  std::optional<int64_t> window_left;                         // overrides plan's window_left
  std::optional<Tensor> sinks;                                // not supported
  std::optional<int64_t> q_len_per_req;                       // decode, deprecated: must match plan
  std::optional<double> skip_softmax_threshold_scale_factor;  // not supported
  // NVFP4 caches (CPU): (k_sf, v_sf) or one [pages, 2, ...] tensor of e4m3 block scales; for
  // the ragged wrapper (k_sf, v_sf) laid out like k / v, or one tensor split on dim 1.
  std::optional<PagedKVCache> kv_cache_sf;
  std::optional<bool> use_fp16_softmax;  // not supported when true
  std::optional<bool> uses_spcompress;   // not supported when true
  // Upstream's run(q, kv, *args): a JIT variant's extra arguments, as a tuple. The prefill
  // wrappers built with the AttentionSink variant (jit_args) take (sink [Hq] fp32, sm_scale).
  std::optional<Value> args;
};
FLASHINFER_OPTION_FIELDS(AttentionRunOptions, q_scale, k_scale, v_scale, o_scale, out, lse,
                         return_lse, lse_base, lse_layout, enable_pdl, window_left, sinks,
                         q_len_per_req, skip_softmax_threshold_scale_factor, kv_cache_sf,
                         use_fp16_softmax, uses_spcompress, args);

/// BatchDecodeWithPagedKVCacheWrapper.plan()'s keyword arguments (upstream's names and
/// defaults; upstream takes them through **kwargs).
struct BatchDecodePlanOptions {
  std::string pos_encoding_mode = "NONE";
  int64_t window_left = -1;
  int64_t window_right = 0;  // no key lies right of a decode query: no effect
  std::optional<double> logits_soft_cap;
  DType q_data_type = DType::kFloat16;
  std::optional<DType> kv_data_type;  // default q_data_type
  std::optional<DType> o_data_type;   // default q_data_type
  std::optional<DType> data_type;     // deprecated alias of kv_data_type
  std::optional<double> sm_scale;
  std::optional<double> rope_scale, rope_theta;
  bool non_blocking = true;
  std::optional<Tensor> block_tables;  // read by backend "trtllm-gen" only (as upstream)
  /// [batch] int32 KV lengths (vLLM passes them): cross-checked against the page table.
  std::optional<Tensor> seq_lens;
  std::optional<int64_t> fixed_split_size;  // KV chunk in pages (forces split-KV); -1: none
  bool disable_split_kv = false;
  int64_t q_len_per_req = 1;  // > 1: the queries of a request are causal among themselves
};
FLASHINFER_OPTION_FIELDS(BatchDecodePlanOptions, pos_encoding_mode, window_left, window_right,
                         logits_soft_cap, q_data_type, kv_data_type, o_data_type, data_type,
                         sm_scale, rope_scale, rope_theta, non_blocking, block_tables, seq_lens,
                         fixed_split_size, disable_split_kv, q_len_per_req);

/// Batch decode over a paged KV cache (flashinfer.decode). plan() validates the page table,
/// copies it to the host and builds the split-KV work partition once; run() only computes, so one
/// plan serves every layer of a step.
class BatchDecodeWithPagedKVCacheWrapper : public ApiObject {
 public:
  /// float_workspace_buffer: scratch for split-KV partials (any dtype; 128 MB recommended) on
  /// the device the wrapper runs on. kv_layout "NHD" or "HND". backend "auto" or "fa2".
  explicit BatchDecodeWithPagedKVCacheWrapper(
      Tensor float_workspace_buffer, std::string kv_layout = "NHD", bool use_cuda_graph = false,
      bool use_tensor_cores = false, std::optional<Tensor> paged_kv_indptr_buffer = std::nullopt,
      std::optional<Tensor> paged_kv_indices_buffer = std::nullopt,
      std::optional<Tensor> paged_kv_last_page_len_buffer = std::nullopt,
      std::string backend = "auto", std::optional<Value> jit_args = std::nullopt,
      std::optional<Value> jit_kwargs = std::nullopt);
  ~BatchDecodeWithPagedKVCacheWrapper() override;
  BatchDecodeWithPagedKVCacheWrapper(const BatchDecodeWithPagedKVCacheWrapper&) = delete;
  BatchDecodeWithPagedKVCacheWrapper& operator=(const BatchDecodeWithPagedKVCacheWrapper&) = delete;

  using PlanOptions = BatchDecodePlanOptions;

  /// indptr [batch + 1] (its first entry need not be 0: only differences count), indices
  /// [indptr[-1]], last_page_len [batch]: int32 page table.
  void plan(const Tensor& indptr, const Tensor& indices, const Tensor& last_page_len,
            int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim, int64_t page_size,
            const PlanOptions& options = {});

  /// q [batch * q_len_per_req, Hq, D] → o (same shape, o_data_type), lse [rows, Hq].
  AttentionOutput run(const Tensor& q, const PagedKVCache& paged_kv_cache,
                      const AttentionRunOptions& options = {});

  /// The workspace plan() would need for these arguments (plan's, all positional upstream);
  /// the split-KV rule as plan's, but not limited by the current float_workspace_buffer. Changes
  /// no state.
  WorkspaceSizes workspace_size(const Tensor& indptr, const Tensor& indices,
                                const Tensor& last_page_len, int64_t num_qo_heads,
                                int64_t num_kv_heads, int64_t head_dim, int64_t page_size,
                                const PlanOptions& options = {});

  std::string_view class_name() const override { return "BatchDecodeWithPagedKVCacheWrapper"; }
  std::string_view module_name() const override { return "flashinfer.decode"; }
  /// Whether the current plan splits KV into chunks (merged by a second pass).
  bool split_kv() const;

 private:
  friend struct detail::PagedWrapperAccess;
  std::unique_ptr<detail::WrapperState> s_;
};

/// plan()'s arguments after the required ones, shared by the two prefill wrappers (each takes
/// upstream's subset; the ones this library does not support must stay unset).
struct PrefillPlanOptions {
  std::optional<int64_t> head_dim_vo;                     // default head_dim_qk
  std::optional<Tensor> custom_mask, packed_custom_mask;  // see mask_indptr in the docs
  bool causal = false;
  std::string pos_encoding_mode = "NONE";
  bool use_fp16_qk_reduction = false;
  std::optional<double> sm_scale;
  int64_t window_left = -1;
  std::optional<double> logits_soft_cap;
  std::optional<double> rope_scale, rope_theta;
  DType q_data_type = DType::kFloat16;
  std::optional<DType> kv_data_type, o_data_type;
  bool non_blocking = true;
  // Multi-item scoring (SGLang's scoring API): prefix_len_ptr [batch] (torch.uint32; int32 bits
  // here), token_pos_in_items_ptr [batch * token_pos_in_items_len] (torch.uint16: each token's
  // position in its item after the prefix, 0 for a delimiter; int16 bits here),
  // max_item_len_ptr [batch] (torch.uint16). Replaces causal and any custom mask.
  std::optional<Tensor> prefix_len_ptr, token_pos_in_items_ptr;
  int64_t token_pos_in_items_len = 0;
  std::optional<Tensor> max_item_len_ptr;
  std::optional<Tensor> seq_lens, seq_lens_q, block_tables;        // not supported
  std::optional<int64_t> max_token_per_sequence, max_sequence_kv;  // hints, ignored
  std::optional<int64_t> fixed_split_size;  // KV chunk (pages, or tokens for ragged)
  bool disable_split_kv = false;
  std::optional<Tensor> v_indptr, o_indptr;  // ragged only: not supported
  // Upstream 0.7.4. uniform_q_len: a scheduling hint of upstream's fa2 CUDA-graph planner (every
  // request's query count), no effect on values here. use_token_head_sf (fp8 K/V scaled per
  // token and head by kv_cache_sf): not supported. qo_indptr_cpu / kv_indptr_cpu (ragged): host
  // mirrors of the indptrs, which the plan reads instead (CPU, the same 1-D shape and dtype).
  std::optional<int64_t> uniform_q_len;
  bool use_token_head_sf = false;
  std::optional<Tensor> qo_indptr_cpu, kv_indptr_cpu;
};
FLASHINFER_OPTION_FIELDS(PrefillPlanOptions, head_dim_vo, custom_mask, packed_custom_mask, causal,
                         pos_encoding_mode, use_fp16_qk_reduction, sm_scale, window_left,
                         logits_soft_cap, rope_scale, rope_theta, q_data_type, kv_data_type,
                         o_data_type, non_blocking, prefix_len_ptr, token_pos_in_items_ptr,
                         token_pos_in_items_len, max_item_len_ptr, seq_lens, seq_lens_q,
                         block_tables, max_token_per_sequence, max_sequence_kv, fixed_split_size,
                         disable_split_kv, v_indptr, o_indptr, uniform_q_len, use_token_head_sf,
                         qo_indptr_cpu, kv_indptr_cpu);

/// Batch prefill / append attention against a paged KV cache (flashinfer.prefill).
class BatchPrefillWithPagedKVCacheWrapper : public ApiObject {
 public:
  explicit BatchPrefillWithPagedKVCacheWrapper(
      Tensor float_workspace_buffer, std::string kv_layout = "NHD", bool use_cuda_graph = false,
      std::optional<Tensor> qo_indptr_buf = std::nullopt,
      std::optional<Tensor> paged_kv_indptr_buf = std::nullopt,
      std::optional<Tensor> paged_kv_indices_buf = std::nullopt,
      std::optional<Tensor> paged_kv_last_page_len_buf = std::nullopt,
      std::optional<Tensor> custom_mask_buf = std::nullopt,
      std::optional<Tensor> mask_indptr_buf = std::nullopt, std::string backend = "auto",
      std::optional<Value> jit_args = std::nullopt, std::optional<Value> jit_kwargs = std::nullopt,
      bool variant_owns_mask = false, std::optional<int64_t> max_total_num_rows = std::nullopt);
  ~BatchPrefillWithPagedKVCacheWrapper() override;
  BatchPrefillWithPagedKVCacheWrapper(const BatchPrefillWithPagedKVCacheWrapper&) = delete;
  BatchPrefillWithPagedKVCacheWrapper& operator=(const BatchPrefillWithPagedKVCacheWrapper&) =
      delete;

  /// qo_indptr [batch + 1] int32 (rows of q per request); the page table as for decode. Custom
  /// masks are the per-request [qo_len_i, kv_len_i] row-major masks concatenated.
  void plan(const Tensor& qo_indptr, const Tensor& paged_kv_indptr, const Tensor& paged_kv_indices,
            const Tensor& paged_kv_last_page_len, int64_t num_qo_heads, int64_t num_kv_heads,
            int64_t head_dim_qk, int64_t page_size, const PrefillPlanOptions& options = {});

  /// q [qo_indptr[-1], Hq, Dqk] → o [qo_indptr[-1], Hq, Dvo], lse [qo_indptr[-1], Hq].
  AttentionOutput run(const Tensor& q, const PagedKVCache& paged_kv_cache,
                      const AttentionRunOptions& options = {});

  /// The workspace plan() would need for these arguments (see the decode wrapper's).
  WorkspaceSizes workspace_size(const Tensor& qo_indptr, const Tensor& paged_kv_indptr,
                                const Tensor& paged_kv_indices,
                                const Tensor& paged_kv_last_page_len, int64_t num_qo_heads,
                                int64_t num_kv_heads, int64_t head_dim_qk, int64_t page_size,
                                const PrefillPlanOptions& options = {});

  std::string_view class_name() const override { return "BatchPrefillWithPagedKVCacheWrapper"; }
  std::string_view module_name() const override { return "flashinfer.prefill"; }
  bool split_kv() const;

 private:
  friend struct detail::PagedWrapperAccess;
  std::unique_ptr<detail::WrapperState> s_;
};

/// Batch prefill attention against ragged (contiguous per request) K/V (flashinfer.prefill).
class BatchPrefillWithRaggedKVCacheWrapper : public ApiObject {
 public:
  explicit BatchPrefillWithRaggedKVCacheWrapper(
      Tensor float_workspace_buffer, std::string kv_layout = "NHD", bool use_cuda_graph = false,
      std::optional<Tensor> qo_indptr_buf = std::nullopt,
      std::optional<Tensor> kv_indptr_buf = std::nullopt,
      std::optional<Tensor> custom_mask_buf = std::nullopt,
      std::optional<Tensor> mask_indptr_buf = std::nullopt, std::string backend = "auto",
      std::optional<Value> jit_args = std::nullopt, std::optional<Value> jit_kwargs = std::nullopt,
      bool variant_owns_mask = false);
  ~BatchPrefillWithRaggedKVCacheWrapper() override;
  BatchPrefillWithRaggedKVCacheWrapper(const BatchPrefillWithRaggedKVCacheWrapper&) = delete;
  BatchPrefillWithRaggedKVCacheWrapper& operator=(const BatchPrefillWithRaggedKVCacheWrapper&) =
      delete;

  /// qo_indptr, kv_indptr [batch + 1] int32: request i owns q rows and k/v rows in those ranges.
  void plan(const Tensor& qo_indptr, const Tensor& kv_indptr, int64_t num_qo_heads,
            int64_t num_kv_heads, int64_t head_dim_qk, const PrefillPlanOptions& options = {});

  /// q [qo_indptr[-1], Hq, Dqk], k [kv_indptr[-1], Hkv, Dqk], v [kv_indptr[-1], Hkv, Dvo]
  /// (NHD; HND swaps the first two axes). NVFP4 (plan kv_data_type uint8, CPU only): k, v packed
  /// uint8 [.., D / 2] with options.kv_cache_sf, both scale tensors linear (docs/ATTENTION.md).
  AttentionOutput run(const Tensor& q, const Tensor& k, const Tensor& v,
                      const AttentionRunOptions& options = {});

  std::string_view class_name() const override { return "BatchPrefillWithRaggedKVCacheWrapper"; }
  std::string_view module_name() const override { return "flashinfer.prefill"; }
  bool split_kv() const;

 private:
  std::unique_ptr<detail::WrapperState> s_;
};

// ---- Block-table entry points (TensorRT-LLM style; flashinfer.decode / flashinfer.prefill) ----
//
// The KV cache is addressed by a block table: request b's token t lives in page
// block_tables[b][t / page_size], slot t % page_size. kv_cache is a 5-D tensor [pages, 1 or 2,
// Hkv, page_size, D] ("HND", the default) or [pages, 1 or 2, page_size, Hkv, D] ("NHD") with K at
// [:, 0] and V at [:, 1] (a size-1 axis means K and V are the same tensor), or a (k_cache,
// v_cache) pair of 4-D tensors. Scores are s = bmm1_scale * (q . k) (bmm1_scale fuses sm_scale,
// q_scale and k_scale); o = softmax(s) . v * bmm2_scale (bmm2_scale fuses v_scale). sinks [Hq]
// (fp32 natural-log logits) add exp(sinks[h]) to head h's softmax denominator, and to the LSE.
// A NaN score makes the row NaN; masked keys never contribute. LSE is base 2.

/// Decode (flashinfer.decode.trtllm_batch_decode_with_kv_cache): query [batch * q_len_per_req,
/// Hq, D] (or cum_seq_lens_q [batch + 1] with q_len_per_req=None for variable lengths, each at
/// most max_q_len); block_tables int32 [>= batch, max_blocks]; seq_lens int32 [>= batch] KV
/// lengths (each <= max_seq_len and >= its query count). The queries of a request are its last
/// tokens, causal among themselves. window_left = w >= 0 keeps keys j >= position - w.
/// o_scale follows the xqa backend upstream's "auto" picks on SM80/SM90: a 16-bit output is
/// multiplied by it (backend="trtllm-gen" ignores it). out_dtype: q's dtype, float16 or
/// bfloat16. Not supported (an error naming them when set): nvfp4 output (o_sf_scale,
/// o_sf_vec_size), mask, skip_softmax_threshold_scale_factor,
/// uses_shared_paged_kv_idx=False, bmm1_scale_log2, enable_block_sparse_attention,
/// bf16q_fp8kv_transform_mode. kv_cache_sf: uint8 NVFP4 caches (CPU; docs/ATTENTION.md: V block
/// scales interleaved, linear for backend="xqa"). workspace_buffer and
/// multi_ctas_kv_counter_buffer are scratch
/// upstream; they are checked, never written. Returns out, or (out, lse) when return_lse.
/// Upstream 0.7.4 (CPU reference; docs/ATTENTION.md, "trtllm decode's 0.7.4 arguments"):
/// sparse_top_k k > 0: request b's one query attends K row block_tables[b, 0, j] and V row
/// block_tables[b, 1, j] (one-token pages of one KV head) for j < seq_lens[b], no positional
/// mask (uses_shared_paged_kv_idx=False, block_tables [batch, 2, k]). causal_seqlens_kv_global
/// (context-parallel speculative decode, cp_world W, cp_rank r): the cache holds this rank's keys,
/// global position l W + r; query row j of a request sees local keys l < max(0, floor((S + j -
/// r) / W) + 1), S = causal_seqlens_kv_global[b]; seq_lens is not a mask there; return_lse
/// required. request_order / request_order_plan / length_aware_schedule: the Cake backend's
/// scheduling (refused as upstream refuses them without backend "cake", which is refused).
AttentionOutput trtllm_batch_decode_with_kv_cache(
    const Tensor& query, const PagedKVCache& kv_cache, const Tensor& workspace_buffer,
    const Tensor& block_tables, const Tensor& seq_lens, int64_t max_seq_len,
    ScalarOrTensor<double> bmm1_scale = 1.0, ScalarOrTensor<double> bmm2_scale = 1.0,
    int64_t window_left = -1, std::optional<Tensor> out = std::nullopt,
    std::optional<DType> out_dtype = std::nullopt, std::optional<double> o_sf_scale = std::nullopt,
    std::optional<int64_t> o_sf_vec_size = std::nullopt, std::optional<Tensor> sinks = std::nullopt,
    std::string_view kv_layout = "HND", std::optional<bool> enable_pdl = std::nullopt,
    std::string_view backend = "auto", std::optional<int64_t> q_len_per_req = 1,
    std::optional<double> o_scale = 1.0, std::optional<Tensor> mask = std::nullopt,
    std::optional<int64_t> max_q_len = std::nullopt,
    std::optional<Tensor> cum_seq_lens_q = std::nullopt,
    std::optional<double> skip_softmax_threshold_scale_factor = std::nullopt,
    std::optional<Value> kv_cache_sf = std::nullopt, bool uses_shared_paged_kv_idx = true,
    std::optional<Tensor> lse = std::nullopt, bool return_lse = false,
    std::optional<Value> bmm1_scale_log2 = std::nullopt,
    std::optional<Tensor> multi_ctas_kv_counter_buffer = std::nullopt,
    bool enable_block_sparse_attention = false, int64_t cp_world = 1, int64_t cp_rank = 0,
    std::optional<Tensor> causal_seqlens_kv_global = std::nullopt,
    std::optional<Value> bf16q_fp8kv_transform_mode = std::nullopt,
    std::optional<Tensor> request_order = std::nullopt,
    std::optional<Value> request_order_plan = std::nullopt, int64_t sparse_top_k = 0,
    bool length_aware_schedule = false);

/// Context / prefill (flashinfer.prefill.trtllm_batch_context_with_kv_cache): query
/// [cum_seq_lens_q[-1], Hq, D]; cum_seq_lens_q, cum_seq_lens_kv int32 [batch_size + 1]
/// (cum_seq_lens_kv must agree with seq_lens); seq_lens int32 [batch_size] KV lengths; every
/// query length <= max_q_len, every KV length <= max_kv_len. Query i of a request sits at
/// position kv_len - qo_len + i; causal (default) keeps keys j <= that position. Upstream 0.7.4:
/// window_right R >= 0 (causal=False, with window_left W >= 0) keeps keys in [p - W, p + R];
/// variable_window_token_starts / _ends (int32 [query rows]) keep, for packed query row t, the
/// keys [starts[t], ends[t]] of its request (inclusive, causal ignored); backend "trtllm-gen"
/// ("cake" refused). Both run on the CPU reference (as a key mask). Scales, sinks,
/// out/out_dtype, lse, kv_cache_sf as for decode. Not supported (errors when set): nvfp4 output,
/// skip_softmax_threshold_scale_factor, uses_shared_paged_kv_idx=False, use_fp16_softmax=True,
/// uses_spcompress=True.
AttentionOutput trtllm_batch_context_with_kv_cache(
    const Tensor& query, const PagedKVCache& kv_cache, const Tensor& workspace_buffer,
    const Tensor& block_tables, const Tensor& seq_lens, int64_t max_q_len, int64_t max_kv_len,
    ScalarOrTensor<double> bmm1_scale, ScalarOrTensor<double> bmm2_scale, int64_t batch_size,
    const Tensor& cum_seq_lens_q, const Tensor& cum_seq_lens_kv, int64_t window_left = -1,
    std::optional<Tensor> out = std::nullopt, std::optional<DType> out_dtype = std::nullopt,
    std::optional<double> o_sf_scale = std::nullopt,
    std::optional<int64_t> o_sf_vec_size = std::nullopt, std::string_view kv_layout = "HND",
    std::optional<bool> enable_pdl = std::nullopt, std::optional<Tensor> sinks = std::nullopt,
    std::optional<Value> kv_cache_sf = std::nullopt,
    std::optional<double> skip_softmax_threshold_scale_factor = std::nullopt,
    bool uses_shared_paged_kv_idx = true, bool causal = true,
    std::optional<Tensor> lse = std::nullopt, bool return_lse = false,
    std::optional<Tensor> multi_ctas_kv_counter_buffer = std::nullopt,
    std::optional<bool> use_fp16_softmax = std::nullopt,
    std::optional<bool> uses_spcompress = std::nullopt, std::string_view backend = "trtllm-gen",
    int64_t window_right = -1, std::optional<Tensor> variable_window_token_starts = std::nullopt,
    std::optional<Tensor> variable_window_token_ends = std::nullopt);

/// xqa_batch_decode_with_kv_cache (flashinfer.decode): the xqa backend's decode under its own
/// name: trtllm_batch_decode_with_kv_cache's math with kv_layout "NHD" by default; o_scale
/// multiplies 16-bit outputs; an fp8 out (CPU) gets fp8(bmm2_scale * o), saturating. kv_cache_sf
/// (uint8 NVFP4 cache, CPU): linear K and V block scales. q_cu_seq_lens [batch + 1] int32, when
/// given, sets each request's query rows (each at most q_len_per_req). mask (CPU): xqa's bit-packed
/// speculative-decoding mask, q_len_per_req > 1 (docs/ATTENTION.md).
Tensor xqa_batch_decode_with_kv_cache(
    const Tensor& query, const PagedKVCache& kv_cache, const Tensor& workspace_buffer,
    const Tensor& block_tables, const Tensor& seq_lens, int64_t max_seq_len,
    ScalarOrTensor<double> bmm1_scale = 1.0, ScalarOrTensor<double> bmm2_scale = 1.0,
    int64_t window_left = -1, std::optional<Tensor> out = std::nullopt,
    std::optional<Tensor> sinks = std::nullopt, std::string_view kv_layout = "NHD",
    std::optional<bool> enable_pdl = std::nullopt, std::optional<int64_t> q_len_per_req = 1,
    std::optional<double> o_scale = 1.0, std::optional<Tensor> mask = std::nullopt,
    std::optional<Value> kv_cache_sf = std::nullopt,
    std::optional<Tensor> q_cu_seq_lens = std::nullopt);

/// What cudnn_batch_prefill_with_kv_cache returns, as upstream: the tuple (out, lse), lse None
/// unless return_lse.
struct CudnnPrefillResult {
  Tensor out;
  Tensor lse;
};
Value to_value(const CudnnPrefillResult& r);

/// cudnn_batch_prefill_with_kv_cache (flashinfer.cudnn.prefill): on CUDA, cuDNN's SDPA graph
/// for a paged cache where the build has cuDNN and the call fits it (docs/ATTENTION.md), else
/// this library's kernels. q [rows, Hq, D]; request b's queries are actual_seq_lens_q[b] rows
/// starting at batch_offsets_q[b] (in batch_offsets_units: "elements" or "bytes" of q's own
/// storage, a row being q.stride(0) elements, or "tokens"; default the running sum of the
/// lengths, and offsets must equal it: requests are packed). K/V: with block_tables, pages
/// [pages, Hkv, page_size, D] read through the table; without, ragged rows [rows, Hkv, D]
/// (any row stride: V may be a view into an interleaved QKV buffer) starting at
/// batch_offsets_k[b] (default the running sum of actual_seq_lens_kv; batch_offsets_v, in V's
/// own rows, must match). With "tokens" offsets of batch + 1 entries the lengths may be
/// omitted: they are the differences. Upstream 0.7.4: lse_base "log2" (default) or "ln" (the
/// returned LSE's units), window_left W (None: none) keeps keys [p - W, ...] of query position p,
/// sinks fp32 [Hq] add exp(sinks[h]) to the softmax denominator and the LSE (CPU reference when
/// a window or sinks is given). Scores scale * q_scale * k_scale * (q . k),
/// causal right-aligned, output times v_scale; out [rows, Hq, D] in o_data_type (default q's).
/// lse [rows, Hq] fp32 is base 2 like the rest of this library (cuDNN's own statistics layout
/// is not reproduced). actual_seq_lens_* may have any shape with batch elements (int32). Not
/// supported: batch_offsets_o different from batch_offsets_q, batch_offsets_stats, batch
/// offsets with block_tables. backend and is_cuda_graph_compatible select nothing here.
CudnnPrefillResult cudnn_batch_prefill_with_kv_cache(
    const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, double scale,
    const Tensor& workspace_buffer, int64_t max_token_per_sequence, int64_t max_sequence_kv,
    std::optional<Tensor> actual_seq_lens_q, std::optional<Tensor> actual_seq_lens_kv,
    std::optional<Tensor> block_tables, bool causal, bool return_lse,
    std::optional<ScalarOrTensor<double>> q_scale = std::nullopt,
    std::optional<ScalarOrTensor<double>> k_scale = std::nullopt,
    std::optional<ScalarOrTensor<double>> v_scale = std::nullopt,
    std::optional<Tensor> batch_offsets_q = std::nullopt,
    std::optional<Tensor> batch_offsets_o = std::nullopt,
    std::optional<Tensor> batch_offsets_k = std::nullopt,
    std::optional<Tensor> batch_offsets_v = std::nullopt,
    std::optional<Tensor> batch_offsets_stats = std::nullopt,
    std::string_view batch_offsets_units = "elements", std::optional<Tensor> out = std::nullopt,
    std::optional<Tensor> lse = std::nullopt, bool is_cuda_graph_compatible = false,
    std::optional<std::string> backend = std::nullopt,
    std::optional<DType> o_data_type = std::nullopt, std::string_view lse_base = "log2",
    std::optional<int64_t> window_left = std::nullopt, std::optional<Tensor> sinks = std::nullopt);

/// cudnn_batch_decode_with_kv_cache (flashinfer.cudnn.decode): on CUDA, cuDNN's SDPA graph
/// where the build has cuDNN and the call fits it, else this library's kernels. q [batch, Hq, D];
/// k_cache, v_cache HND pages [pages, Hkv, page_size, D] read through block_tables [batch, blocks]
/// (int32); without block_tables each request b owns page b whole ([batch, Hkv, max_seq, D]).
/// actual_seq_lens_kv: any shape of batch int32 KV lengths, each <= max_sequence_kv (default:
/// max_sequence_kv for every request). Scores scale * (q . k). Returns out [batch, Hq, D] in q's
/// dtype (or out's). Not supported: batch_offsets_*.
Tensor cudnn_batch_decode_with_kv_cache(const Tensor& q, const Tensor& k_cache,
                                        const Tensor& v_cache, double scale,
                                        const Tensor& workspace_buffer, int64_t max_sequence_kv,
                                        std::optional<Tensor> actual_seq_lens_kv = std::nullopt,
                                        std::optional<Tensor> block_tables = std::nullopt,
                                        bool is_cuda_graph_compatible = false,
                                        std::optional<Tensor> batch_offsets_q = std::nullopt,
                                        std::optional<Tensor> batch_offsets_o = std::nullopt,
                                        std::optional<Tensor> batch_offsets_k = std::nullopt,
                                        std::optional<Tensor> batch_offsets_v = std::nullopt,
                                        std::optional<Tensor> out = std::nullopt);

}  // namespace flashinfer
