// The routing of fused shared experts (docs/MOE.md, "Fused shared experts") as the tests feed
// it to the _routed_ ops: every token's routed slots, then S slots of experts E .. E + S - 1 at
// weight 1.0.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "util/test_util.h"

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
                    Tensor::from_vector(out_w, {T, K + S}, weights.dtype()));
}

/// The do_finalize=False list [gemm2_output, expert_weights, expanded_idx_to_permuted_idx] of a
/// call with K + S slots per token: its shapes, the weights equal to `routing`'s (bf16), the map a
/// permutation of all T (K + S) rows, and the list finalized by hand (fp32 sum in slot order,
/// rounded to bf16) equal to `finalized` bit for bit.
inline void expect_unfinalized_list(const std::vector<Tensor>& u, const MoeTopkIds& routing,
                                    const Tensor& finalized, int64_t T, int64_t KS, int64_t H) {
  ASSERT_EQ(u.size(), 3u);
  EXPECT_EQ(u[0].shape(), Shape({T * KS, H}));
  EXPECT_EQ(u[1].shape(), Shape({T, KS}));
  EXPECT_EQ(u[1].dtype(), DType::kBFloat16);
  EXPECT_EQ(u[2].shape(), Shape({T * KS}));
  EXPECT_TRUE(all_close(u[1], routing.weights->to(DType::kBFloat16), {0, 0}));
  const std::vector<double> slot = u[2].to_double_vector(), rows = u[0].to_double_vector(),
                            w = u[1].to_double_vector();
  std::vector<double> sorted = slot;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < T * KS; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
  Tensor by_hand = Tensor::empty({T, H}, DType::kBFloat16);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      float acc = 0.0f;
      for (int64_t k = 0; k < KS; ++k) {
        const auto r = static_cast<int64_t>(slot[static_cast<size_t>(t * KS + k)]);
        acc += static_cast<float>(w[static_cast<size_t>(t * KS + k)]) *
               static_cast<float>(rows[static_cast<size_t>(r * H + h)]);
      }
      by_hand.data<uint16_t>()[t * H + h] = float_to_bfloat16_bits(acc);
    }
  }
  EXPECT_TRUE(all_close(by_hand, finalized, {0, 0}));
}

}  // namespace flashinfer::testing
