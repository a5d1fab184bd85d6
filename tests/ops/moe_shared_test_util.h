// The routing of fused shared experts (docs/MOE.md, "Fused shared experts") as the tests feed
// it to the _routed_ ops: every token's routed slots, then S slots of experts E .. E + S - 1 at
// weight 1.0.
#pragma once

#include <cstdint>
#include <vector>

#include "flashinfer/flashinfer.h"

namespace flashinfer::testing {

/// ids int32 [T, K] and weights [T, K] (e.g. fused_topk_deepseek's) -> (ids, fp32 weights)
/// [T, K + S] with the shared slots appended.
inline MoeTopkIds append_shared_slots(const Tensor& ids, const Tensor& weights, int64_t E,
                                      int64_t S) {
  const int64_t T = ids.size(0), K = ids.size(1);
  const std::vector<double> iv = ids.to_double_vector(), wv = weights.to_double_vector();
  std::vector<double> out_ids, out_w;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K + S; ++k) {
      const size_t r = static_cast<size_t>(t * K + k);
      out_ids.push_back(k < K ? iv[r] : static_cast<double>(E + k - K));
      out_w.push_back(k < K ? wv[r] : 1.0);
    }
  }
  return MoeTopkIds(Tensor::from_vector(out_ids, {T, K + S}, DType::kInt32),
                    Tensor::from_vector(out_w, {T, K + S}, DType::kFloat32));
}

}  // namespace flashinfer::testing
