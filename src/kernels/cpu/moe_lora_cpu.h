// CPU BGMV shrink/expand over MoE (token, expert) pairs (docs/MOE.md).
#pragma once

#include <cstdint>
#include <vector>

#include "flashinfer/dtype.h"

namespace flashinfer::kernels {

struct BgmvMoeParams {
  int64_t num_slices = 0, num_pairs = 0;
  std::vector<int64_t> token, expert, lora;  // per pair; lora < 0: skipped
  // Per slice and pair: the first element of the pair's [rows, cols] weight matrix (nullptr
  // when skipped); rows x cols = rank x feat_in (shrink) or feat_out x rank (expand).
  std::vector<const void*> weight;
  DType dtype = DType::kBFloat16;  // weights, shrink x/y, expand x
  // shrink: y [S, P, rank] (+=), x [rows, feat_in] (row = pair or token)
  // expand: y fp32 [rows, y_cols], x [S, P, rank]
  const void* x = nullptr;
  void* y = nullptr;
  int64_t rank = 0, feat = 0;  // feat_in (shrink) or feat_out (expand)
  bool per_pair_input = false;
  // expand only
  const float* topk_weights = nullptr;
  std::vector<int64_t> slice_start;
  int64_t y_cols = 0;
  bool finalize = true;
};

namespace cpu {
void bgmv_moe_shrink(const BgmvMoeParams& p);
void bgmv_moe_expand(const BgmvMoeParams& p);
}  // namespace cpu

}  // namespace flashinfer::kernels
