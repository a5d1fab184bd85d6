// Block-sparse attention forward of flashinfer.cute_dsl.sparse.bsa_attn_sm120 (SGLang's sub-block
// sparse attention for video models on SM120): each 64-query block of each query head attends to
// a listed multiset of 64-key blocks. CPU reference everywhere; a CUDA kernel on the GPUs
// upstream runs it on (compute capability 12.x). docs/ATTENTION.md ("Block-sparse attention on
// SM120") gives the math.
#pragma once

#include <optional>

#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// (out, lse) when return_lse, else (out, None); lse is written either way.
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

}  // namespace flashinfer
