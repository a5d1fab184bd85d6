// Block-sparse attention (FlashInfer module flashinfer.sparse): one request's queries q [M, Hq,
// D] against keys k / v [N, Hkv, D] (NHD), the attention mask a block-sparse matrix in BSR form
// (SciPy's bsr_matrix): block rows of R queries, block columns of C keys; indptr [MB + 1] (MB =
// ceil(M / R)) and indices [nnz] (block column ids < NB = N / C) list the blocks each block row
// sees. As upstream's fa2 path, each block row is a request whose keys are its blocks' columns in
// `indices` order; `mask` [nnz, R, C] (bool) or `packed_mask` further keeps entries within the
// blocks, and `causal` (without a mask) is right-aligned within a block row's gathered keys.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "flashinfer/dtype.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/ops/attention.h"
#include "flashinfer/tensor.h"

namespace flashinfer {

class BlockSparseAttentionWrapper : public ApiObject {
 public:
  /// float_workspace_buffer: split-KV scratch on the device the wrapper runs on. backend "auto"
  /// or "fa2".
  explicit BlockSparseAttentionWrapper(Tensor float_workspace_buffer, std::string backend = "auto");
  ~BlockSparseAttentionWrapper() override;
  BlockSparseAttentionWrapper(const BlockSparseAttentionWrapper&) = delete;
  BlockSparseAttentionWrapper& operator=(const BlockSparseAttentionWrapper&) = delete;

  /// N must be a multiple of C. packed_mask: the per-block-row masks ([rows of the block row,
  /// nnz_row * C] row-major, the blocks in `indices` order) packed little-endian, each block
  /// row's bits starting on a byte. o_data_type: the output dtype. pos_encoding_mode "NONE" only;
  /// block_mask (the VSA backends' per-head mask) is not supported.
  void plan(const Tensor& indptr, const Tensor& indices, int64_t M, int64_t N, int64_t R, int64_t C,
            int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim,
            std::optional<Tensor> mask = std::nullopt,
            std::optional<Tensor> packed_mask = std::nullopt, bool causal = false,
            std::string_view pos_encoding_mode = "NONE", bool use_fp16_qk_reduction = false,
            std::optional<double> logits_soft_cap = std::nullopt,
            std::optional<double> sm_scale = std::nullopt,
            std::optional<double> rope_scale = std::nullopt,
            std::optional<double> rope_theta = std::nullopt, DType q_data_type = DType::kFloat16,
            std::optional<DType> kv_data_type = std::nullopt, DType o_data_type = DType::kFloat16,
            bool non_blocking = true, std::optional<Tensor> block_mask = std::nullopt);

  /// q [M, Hq, D], k / v [N, Hkv, D] → o [M, Hq, D] in o_data_type (and lse [M, Hq] base 2 with
  /// return_lse). scale_q / scale_k / v_scale (fp8 per-head scales) are not supported.
  AttentionOutput run(const Tensor& q, const Tensor& k, const Tensor& v,
                      std::optional<Tensor> scale_q = std::nullopt,
                      std::optional<Tensor> scale_k = std::nullopt,
                      std::optional<Tensor> scale_v = std::nullopt,
                      std::optional<Tensor> out = std::nullopt,
                      std::optional<Tensor> lse = std::nullopt, bool return_lse = false,
                      std::optional<bool> enable_pdl = std::nullopt);

  std::string_view class_name() const override { return "BlockSparseAttentionWrapper"; }
  std::string_view module_name() const override { return "flashinfer.sparse"; }

 private:
  std::unique_ptr<detail::WrapperState> s_;
  int64_t m_ = 0, n_ = 0, c_ = 1;
};

/// Block-sparse attention with variable block sizes per kv head (flashinfer.sparse): q [Hq,
/// qo_len, D], k / v [Hkv, kv_len, D] (head-major). For kv head h (and the Hq / Hkv query heads of
/// its group), block row r holds block_row_sz[h][r] consecutive queries, block column c
/// block_col_sz[h][c] consecutive keys (each head's sizes summing to qo_len and kv_len), and
/// block_mask_map[h][r][c] says whether row r sees column c. As upstream, each (h, r) is a request
/// whose keys are its kept columns' tokens in column order; `causal` is right-aligned within them.
class VariableBlockSparseAttentionWrapper : public ApiObject {
 public:
  explicit VariableBlockSparseAttentionWrapper(Tensor float_workspace_buffer,
                                               std::string backend = "auto");
  ~VariableBlockSparseAttentionWrapper() override;
  VariableBlockSparseAttentionWrapper(const VariableBlockSparseAttentionWrapper&) = delete;
  VariableBlockSparseAttentionWrapper& operator=(const VariableBlockSparseAttentionWrapper&) =
      delete;

  /// block_mask_map bool [Hkv, MB, NB]; block_row_sz [Hkv, MB], block_col_sz [Hkv, NB] integer
  /// (any device; copied to the host). Output dtype: q_data_type. pos_encoding_mode "NONE" only.
  void plan(const Tensor& block_mask_map, const Tensor& block_row_sz, const Tensor& block_col_sz,
            int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim, bool causal = false,
            std::string_view pos_encoding_mode = "NONE", bool use_fp16_qk_reduction = false,
            std::optional<double> logits_soft_cap = std::nullopt,
            std::optional<double> sm_scale = std::nullopt,
            std::optional<double> rope_scale = std::nullopt,
            std::optional<double> rope_theta = std::nullopt, bool non_blocking = true,
            DType q_data_type = DType::kFloat16, std::optional<DType> kv_data_type = std::nullopt);

  /// q [Hq, qo_len, D], k / v [Hkv, kv_len, D] → o [Hq, qo_len, D] (and lse [Hq, qo_len] fp32,
  /// base 2, with return_lse; this library's layout, the output's).
  AttentionOutput run(const Tensor& q, const Tensor& k, const Tensor& v,
                      std::optional<Tensor> out = std::nullopt,
                      std::optional<Tensor> lse = std::nullopt, bool return_lse = false,
                      std::optional<bool> enable_pdl = std::nullopt);

  std::string_view class_name() const override { return "VariableBlockSparseAttentionWrapper"; }
  std::string_view module_name() const override { return "flashinfer.sparse"; }

 private:
  std::unique_ptr<detail::WrapperState> s_;
  int64_t hq_ = 0, hkv_ = 0, qo_len_ = 0, kv_len_ = 0;
};

}  // namespace flashinfer
