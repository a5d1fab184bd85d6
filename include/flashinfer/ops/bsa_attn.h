// Block-sparse attention forwards of flashinfer.cute_dsl.sparse (SGLang's and vLLM-omni's
// sub-block sparse attention for video models): each query block of each query head attends to a
// listed multiset of key blocks. bsa_attn_sm120_blk64_fwd (SM120, 64-token blocks),
// bsa_attn_sm100_blk128_fwd (SM100 / SM110, 128-token blocks, packed GQA metadata) and
// bsa_attn_sm100_blk64_fwd (SM100 / SM103, bf16 MHA). CPU reference everywhere; a CUDA kernel on
// the GPUs upstream runs each on. docs/ATTENTION.md ("Block-sparse attention on SM120", "on
// SM100") gives the math.
#pragma once

#include <optional>

#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// (out, lse) when return_lse, else (out, None).
struct BsaOutput {
  Tensor out, lse;
  bool return_lse = false;
};
Value to_value(const BsaOutput& r);

/// q [B, Sq, Hq, 128], k and v [B, Sk, Hkv, 128] (fp16 / bf16; Hq a multiple of Hkv). Row r of
/// query head h attends to the keys of the blocks q2k_block_index[b, h, r / 64, j] for j < n
/// (n = q2k_block_nums[b, h, r / 64], else block_sparse_num; a block listed twice counts twice),
/// the first block_sizes[..][block] keys of each (without block_sizes: 64, the last block its
/// remainder), non-causal: out = softmax(scale q k^T) v ([B, Sq, Hq, 128], q's dtype), lse = ln sum
/// exp(scale q k^T) ([B, Hq, Sq] fp32); a row with no keys: zeros and -inf. scale defaults to
/// 128^-0.5.
BsaOutput bsa_attn_sm120_blk64_fwd(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& q2k_block_index, int64_t block_sparse_num,
                                   std::optional<Tensor> block_sizes = std::nullopt,
                                   std::optional<Tensor> q2k_block_nums = std::nullopt,
                                   std::optional<double> softmax_scale = std::nullopt,
                                   bool return_lse = false,
                                   std::optional<Tensor> out = std::nullopt,
                                   std::optional<Tensor> lse = std::nullopt);

/// 128-token query and key blocks; q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D] (fp16 / bf16, D 64,
/// 96 or 128). Without block_sizes every listed block holds 128 keys, those past Sk zero keys
/// (score 0, value 0: they count in the softmax's sum). The metadata is per query head ([B, Hq,
/// NQ, W], row r / 128) unless packed GQA holds (pack_gqa, default g = Hq / Hkv > 1, and 128 % g
/// == 0): then per KV head over the packed rows r g + h % g ([B, Hkv, ceil(g Sq / 128), W]).
/// Uniform block_sparse_num even and >= 2; a count <= 0 in q2k_block_nums gives zeros and -inf
/// where allow_empty_block_nums (refused otherwise). block_sizes [NK] only. scale defaults to
/// D^-0.5. Returns (out, lse), lse None unless passed (then written) or return_lse.
BsaOutput bsa_attn_sm100_blk128_fwd(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q2k_block_index,
    int64_t block_sparse_num, std::optional<Tensor> block_sizes = std::nullopt,
    std::optional<Tensor> q2k_block_nums = std::nullopt, bool allow_empty_block_nums = true,
    std::optional<double> softmax_scale = std::nullopt, std::optional<bool> pack_gqa = std::nullopt,
    bool return_lse = false, std::optional<Tensor> out = std::nullopt,
    std::optional<Tensor> lse = std::nullopt);

/// 64-token blocks, bf16, head dim 128, no KV-head mapping: k and v [B or 1, Sk, H or 1, 128]
/// (one head or batch broadcast). The metadata per query head [B, H, NQ, W], W ==
/// block_sparse_num in uniform mode; counts >= 1. Without block_sizes every listed block holds 64
/// keys (past Sk zero keys, as blk128). out (bf16) receives a copy of the result; lse (fp32) is
/// written and returned only with return_lse.
BsaOutput bsa_attn_sm100_blk64_fwd(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& q2k_block_index, int64_t block_sparse_num,
                                   std::optional<Tensor> block_sizes = std::nullopt,
                                   std::optional<Tensor> q2k_block_nums = std::nullopt,
                                   std::optional<double> softmax_scale = std::nullopt,
                                   bool return_lse = false,
                                   std::optional<Tensor> out = std::nullopt,
                                   std::optional<Tensor> lse = std::nullopt);

}  // namespace flashinfer
