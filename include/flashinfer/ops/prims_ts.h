// Upstream's task-scheduled attention (flashinfer.attention.prims_ts: decode, mla_decode,
// context, block_sparse): paged decode with bmm1 / bmm2 scales over HND caches, DeepSeek MLA
// decode over a block table, prefill over fixed, packed or paged K/V, and block-sparse attention
// with per-token validity bits. Upstream runs them on SM100 / SM103 only (CuTe DSL, tcgen05); here
// they have an exact CPU reference and upstream's refusal elsewhere on CUDA
// (docs/ATTENTION.md, "Task-scheduled attention").
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "flashinfer/dtype.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/ops/page.h"
#include "flashinfer/tensor.h"

namespace flashinfer::prims_ts {

/// A plan of the wrappers below (private).
struct TsPlan;

// ---- decode (flashinfer.attention.prims_ts.decode) ----------------------------------------------

/// logits = q.k * bmm1_scale (default 1/sqrt(D)), out = softmax(logits) @ V * bmm2_scale, over
/// an HND paged cache (a 5-D [pages, 2, Hkv, page_size, D] tensor or a (K, V) pair of
/// [pages, Hkv, page_size, D]) through an int32 CSR page table; seq_lens [B] the K/V lengths,
/// max_seq_len their bound. q: [B, Hq, D] (seq_len_q 1), [B, seq_len_q, Hq, D], or packed
/// [total_q, Hq, D] by qo_indptr [B + 1]. mask_type "dense" or "causal" (bottom-right);
/// window_left >= 0 (causal only) keeps window_left + 1 keys. fp16 -> fp16, bf16 -> bf16,
/// e4m3 -> fp16 or e4m3 (out_dtype). workspace_buffer: int8 / uint8 (upstream's scratch; the
/// CPU reference does not use it).
Tensor prims_ts_batch_decode_with_kv_cache(
    const Tensor& query, const PagedKVCache& kv_cache, const Tensor& workspace_buffer,
    const Tensor& paged_kv_indptr, const Tensor& paged_kv_indices, const Tensor& seq_lens,
    int64_t max_seq_len, int64_t seq_len_q = 1, std::optional<Tensor> qo_indptr = std::nullopt,
    std::optional<int64_t> max_seq_len_q = std::nullopt,
    std::optional<double> bmm1_scale = std::nullopt, double bmm2_scale = 1.0,
    std::optional<Tensor> out = std::nullopt, std::optional<DType> out_dtype = std::nullopt,
    std::string mask_type = "dense", int64_t window_left = -1, std::string kv_layout = "HND");

class BatchDecodePagedTSWrapper : public ApiObject {
 public:
  explicit BatchDecodePagedTSWrapper(std::string kv_layout = "HND");
  ~BatchDecodePagedTSWrapper() override;
  BatchDecodePagedTSWrapper(const BatchDecodePagedTSWrapper&) = delete;
  BatchDecodePagedTSWrapper& operator=(const BatchDecodePagedTSWrapper&) = delete;
  /// The page table (int32 CSR with last_page_len [B]) read once and checked.
  void plan(const Tensor& paged_kv_indptr, const Tensor& paged_kv_indices,
            const Tensor& paged_kv_last_page_len, int64_t num_qo_heads, int64_t num_kv_heads,
            int64_t head_dim, int64_t page_size, int64_t seq_len_q = 1,
            std::optional<Tensor> qo_indptr = std::nullopt,
            std::optional<int64_t> max_seq_len_q = std::nullopt,
            DType q_data_type = DType::kFloat16, std::optional<DType> kv_data_type = std::nullopt,
            std::optional<DType> o_data_type = std::nullopt, std::string mask_type = "dense",
            int64_t window_left = -1, std::optional<int64_t> max_kv_len = std::nullopt);
  Tensor run(const Tensor& q, const PagedKVCache& paged_kv_cache,
             std::optional<double> bmm1_scale = std::nullopt, double bmm2_scale = 1.0,
             std::optional<Tensor> out = std::nullopt);
  std::string_view class_name() const override { return "BatchDecodePagedTSWrapper"; }
  std::string_view module_name() const override { return "flashinfer.attention.prims_ts.decode"; }

 private:
  std::unique_ptr<TsPlan> s_;
};

/// plan then run on a temporary wrapper.
Tensor batch_decode_with_paged_kv_cache(
    const Tensor& q, const PagedKVCache& paged_kv_cache, const Tensor& paged_kv_indptr,
    const Tensor& paged_kv_indices, const Tensor& paged_kv_last_page_len, int64_t seq_len_q = 1,
    std::optional<Tensor> qo_indptr = std::nullopt,
    std::optional<int64_t> max_seq_len_q = std::nullopt, std::string mask_type = "dense",
    int64_t window_left = -1, std::string kv_layout = "HND",
    std::optional<double> bmm1_scale = std::nullopt, double bmm2_scale = 1.0,
    std::optional<Tensor> out = std::nullopt, std::optional<DType> out_dtype = std::nullopt);

// ---- MLA decode (flashinfer.attention.prims_ts.mla_decode) --------------------------------------

/// DeepSeek MLA decode: query [B, SQ, H, 576] (or packed [total_q, H, 576] by qo_indptr), cache
/// [pages, page_size, 576] (or [pages, 1, page_size, 576]) with one shared latent head, block
/// table [B, max_pages] int32, seq_lens [B] int32. scores = q.c over all 576 features,
/// out = softmax(scores * bmm1_scale) @ c[:, :512] * bmm2_scale ([.., H, 512], bf16). bf16 or e4m3
/// input; kv_lora_rank 512 and qk_rope_head_dim 64 only; mask_type "causal" (default) or "dense".
Tensor prims_ts_batch_decode_with_kv_cache_mla(
    const Tensor& query, const Tensor& kv_cache, const Tensor& workspace_buffer,
    int64_t kv_lora_rank, int64_t qk_rope_head_dim, const Tensor& block_tables,
    const Tensor& seq_lens, int64_t max_seq_len, std::optional<Tensor> qo_indptr = std::nullopt,
    std::optional<int64_t> max_seq_len_q = std::nullopt, std::optional<Tensor> out = std::nullopt,
    double bmm1_scale = 1.0, double bmm2_scale = 1.0, std::string mask_type = "causal",
    DType out_dtype = DType::kBFloat16);

class BatchMLADecodePagedTSWrapper : public ApiObject {
 public:
  BatchMLADecodePagedTSWrapper();
  ~BatchMLADecodePagedTSWrapper() override;
  BatchMLADecodePagedTSWrapper(const BatchMLADecodePagedTSWrapper&) = delete;
  BatchMLADecodePagedTSWrapper& operator=(const BatchMLADecodePagedTSWrapper&) = delete;
  void plan(const Tensor& block_tables, const Tensor& seq_lens, int64_t num_heads,
            int64_t kv_lora_rank, int64_t qk_rope_head_dim, int64_t page_size,
            std::optional<int64_t> seq_len_q = std::nullopt,
            std::optional<Tensor> qo_indptr = std::nullopt,
            std::optional<int64_t> max_seq_len_q = std::nullopt,
            DType q_data_type = DType::kBFloat16, std::optional<DType> kv_data_type = std::nullopt,
            DType o_data_type = DType::kBFloat16, std::string mask_type = "causal",
            std::optional<int64_t> max_kv_len = std::nullopt);
  Tensor run(const Tensor& query, const Tensor& kv_cache, double bmm1_scale = 1.0,
             double bmm2_scale = 1.0, std::optional<Tensor> out = std::nullopt);
  std::string_view class_name() const override { return "BatchMLADecodePagedTSWrapper"; }
  std::string_view module_name() const override {
    return "flashinfer.attention.prims_ts.mla_decode";
  }

 private:
  std::unique_ptr<TsPlan> s_;
};

Tensor batch_decode_mla_with_paged_kv_cache(
    const Tensor& query, const Tensor& kv_cache, const Tensor& block_tables, const Tensor& seq_lens,
    std::optional<Tensor> qo_indptr = std::nullopt,
    std::optional<int64_t> max_seq_len_q = std::nullopt, int64_t kv_lora_rank = 512,
    int64_t qk_rope_head_dim = 64, std::string mask_type = "causal",
    std::optional<int64_t> max_kv_len = std::nullopt, double bmm1_scale = 1.0,
    double bmm2_scale = 1.0, std::optional<Tensor> out = std::nullopt,
    DType out_dtype = DType::kBFloat16);

// ---- context (flashinfer.attention.prims_ts.context) --------------------------------------------

/// Prefill over fixed [B, S, H, D] or packed [total, H, D] (qo_indptr and kv_indptr [B + 1])
/// q / k / v of one dtype (fp16, bf16, e4m3), head_dim 128 or 256: softmax(q.k * sm_scale)
/// (default 1/sqrt(D)) @ v * output_scale. mask_type "dense" or "causal" (bottom-right);
/// window_left -1 or positive (causal, an even GQA ratio above 1) keeps window_left + 1 keys.
class BatchPrefillTSWrapper : public ApiObject {
 public:
  BatchPrefillTSWrapper();
  ~BatchPrefillTSWrapper() override;
  BatchPrefillTSWrapper(const BatchPrefillTSWrapper&) = delete;
  BatchPrefillTSWrapper& operator=(const BatchPrefillTSWrapper&) = delete;
  void plan(const Tensor& q, const Tensor& k, const Tensor& v,
            std::optional<Tensor> qo_indptr = std::nullopt,
            std::optional<Tensor> kv_indptr = std::nullopt, std::string mask_type = "dense",
            int64_t window_left = -1, std::optional<double> sm_scale = std::nullopt,
            double output_scale = 1.0, std::optional<DType> out_dtype = std::nullopt);
  Tensor run(const Tensor& q, const Tensor& k, const Tensor& v,
             std::optional<Tensor> out = std::nullopt);
  std::string_view class_name() const override { return "BatchPrefillTSWrapper"; }
  std::string_view module_name() const override { return "flashinfer.attention.prims_ts.context"; }

 private:
  std::unique_ptr<TsPlan> s_;
};

/// Paged prefill: q packed [total_q, Hq, D] by qo_indptr, K and V caches [pages, Hkv, page_size,
/// D] (HND), an int32 CSR page table with last_page_len; page_size 16, 32, 64 or 128.
class BatchPrefillPagedTSWrapper : public ApiObject {
 public:
  explicit BatchPrefillPagedTSWrapper(std::string kv_layout = "HND");
  ~BatchPrefillPagedTSWrapper() override;
  BatchPrefillPagedTSWrapper(const BatchPrefillPagedTSWrapper&) = delete;
  BatchPrefillPagedTSWrapper& operator=(const BatchPrefillPagedTSWrapper&) = delete;
  void plan(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& qo_indptr,
            const Tensor& paged_kv_indptr, const Tensor& paged_kv_indices,
            const Tensor& paged_kv_last_page_len, int64_t page_size = 32,
            std::string mask_type = "dense", int64_t window_left = -1,
            std::optional<double> sm_scale = std::nullopt, double output_scale = 1.0,
            std::optional<DType> out_dtype = std::nullopt);
  Tensor run(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
             std::optional<Tensor> out = std::nullopt);
  std::string_view class_name() const override { return "BatchPrefillPagedTSWrapper"; }
  std::string_view module_name() const override { return "flashinfer.attention.prims_ts.context"; }

 private:
  std::unique_ptr<TsPlan> s_;
};

Tensor batch_prefill(const Tensor& q, const Tensor& k, const Tensor& v,
                     std::optional<Tensor> qo_indptr = std::nullopt,
                     std::optional<Tensor> kv_indptr = std::nullopt,
                     std::string mask_type = "dense", int64_t window_left = -1,
                     std::optional<double> sm_scale = std::nullopt, double output_scale = 1.0,
                     std::optional<DType> out_dtype = std::nullopt,
                     std::optional<Tensor> out = std::nullopt);

Tensor batch_prefill_with_paged_kv_cache(
    const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& qo_indptr,
    const Tensor& paged_kv_indptr, const Tensor& paged_kv_indices,
    const Tensor& paged_kv_last_page_len, int64_t page_size = 32, std::string kv_layout = "HND",
    std::string mask_type = "dense", int64_t window_left = -1,
    std::optional<double> sm_scale = std::nullopt, double output_scale = 1.0,
    std::optional<DType> out_dtype = std::nullopt, std::optional<Tensor> out = std::nullopt);

// ---- block-sparse (flashinfer.attention.prims_ts.block_sparse)
// -----------------------------------

/// Block-sparse attention, head_dim 128, fp16 / bf16, Hq / Hkv a power of two <= 32: query i of
/// kv head g in request b sees key t when block t / kv_block_size is listed in row
/// (b, g, i / q_block_size) of the BSR (block_indptr int32 [B, Hkv, num_q_blocks + 1],
/// block_indices int32, strictly increasing per row), bit t of kv_valid_bits (uint32
/// [B, ceil(Skv / 32)], optional) is set, and (causal) t < Skv - Sq + i + 1. A row that sees no key
/// is zeros. sm_scale default 1/sqrt(128).
class BlockSparseTSWrapper : public ApiObject {
 public:
  BlockSparseTSWrapper();
  ~BlockSparseTSWrapper() override;
  BlockSparseTSWrapper(const BlockSparseTSWrapper&) = delete;
  BlockSparseTSWrapper& operator=(const BlockSparseTSWrapper&) = delete;
  /// Not logged upstream (recorded here: a run replays with the plan it ran under). device: the
  /// tensors' device ("cpu", "cuda:0").
  void plan(int64_t batch_size, int64_t seq_len_q, int64_t seq_len_kv, int64_t num_qo_heads,
            int64_t num_kv_heads, int64_t head_dim, int64_t q_block_size, int64_t kv_block_size,
            std::string device, int64_t max_blocks_per_row, bool use_kv_valid_bits,
            std::string mask_type = "dense", DType q_data_type = DType::kFloat16,
            std::optional<DType> kv_data_type = std::nullopt,
            std::optional<DType> o_data_type = std::nullopt);
  /// q [B, Sq, Hq, 128], k / v [B, Skv, Hkv, 128] (compact BSHD).
  Tensor run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& block_indptr,
             const Tensor& block_indices, std::optional<Tensor> kv_valid_bits = std::nullopt,
             std::optional<double> sm_scale = std::nullopt,
             std::optional<Tensor> out = std::nullopt);
  std::string_view class_name() const override { return "BlockSparseTSWrapper"; }
  std::string_view module_name() const override {
    return "flashinfer.attention.prims_ts.block_sparse";
  }

 private:
  std::unique_ptr<TsPlan> s_;
};

/// The paged form: K / V in an HND cache ([pages, 2, Hkv, page_size, 128] or a (K, V) pair of
/// [pages, Hkv, page_size, 128]) through paged_kv_indptr [B + 1] (at plan) and paged_kv_indices
/// (at run); seq_lens_kv [B] (optional) the K/V lengths, else seq_len_kv for every request.
class BlockSparsePagedTSWrapper : public ApiObject {
 public:
  BlockSparsePagedTSWrapper();
  ~BlockSparsePagedTSWrapper() override;
  BlockSparsePagedTSWrapper(const BlockSparsePagedTSWrapper&) = delete;
  BlockSparsePagedTSWrapper& operator=(const BlockSparsePagedTSWrapper&) = delete;
  /// Not logged upstream (recorded here: a run replays with the plan it ran under).
  void plan(const Tensor& paged_kv_indptr, int64_t seq_len_q, int64_t seq_len_kv,
            int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim, int64_t q_block_size,
            int64_t kv_block_size, int64_t page_size, int64_t max_blocks_per_row,
            bool use_kv_valid_bits, std::optional<Tensor> seq_lens_kv = std::nullopt,
            std::string mask_type = "dense", DType q_data_type = DType::kFloat16,
            std::optional<DType> kv_data_type = std::nullopt,
            std::optional<DType> o_data_type = std::nullopt);
  Tensor run(const Tensor& q, const PagedKVCache& paged_kv_cache, const Tensor& paged_kv_indices,
             const Tensor& block_indptr, const Tensor& block_indices,
             std::optional<Tensor> kv_valid_bits = std::nullopt,
             std::optional<double> sm_scale = std::nullopt,
             std::optional<Tensor> out = std::nullopt);
  std::string_view class_name() const override { return "BlockSparsePagedTSWrapper"; }
  std::string_view module_name() const override {
    return "flashinfer.attention.prims_ts.block_sparse";
  }

 private:
  std::unique_ptr<TsPlan> s_;
};

Tensor block_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& block_indptr, const Tensor& block_indices,
                              int64_t q_block_size, int64_t kv_block_size,
                              std::optional<Tensor> kv_valid_bits = std::nullopt,
                              std::string mask_type = "dense",
                              std::optional<double> sm_scale = std::nullopt,
                              std::optional<Tensor> out = std::nullopt);

Tensor block_sparse_attention_with_paged_kv_cache(
    const Tensor& q, const PagedKVCache& paged_kv_cache, const Tensor& paged_kv_indptr,
    const Tensor& paged_kv_indices, const Tensor& block_indptr, const Tensor& block_indices,
    int64_t q_block_size, int64_t kv_block_size, int64_t seq_len_kv,
    std::optional<Tensor> seq_lens_kv = std::nullopt,
    std::optional<Tensor> kv_valid_bits = std::nullopt, std::string mask_type = "dense",
    std::optional<double> sm_scale = std::nullopt, std::optional<Tensor> out = std::nullopt);

}  // namespace flashinfer::prims_ts
