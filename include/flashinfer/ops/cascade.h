// State merges of cascade and split-KV attention (FlashInfer module flashinfer.cascade).
// A state is an attention output v with its base-2 log-sum-exp s over some set of keys; merging
// the states of disjoint key sets gives the attention over their union:
//   m = max(s_a, s_b), w_x = 2^(s_x - m), v = (w_a v_a + w_b v_b) / (w_a + w_b),
//   s = m + log2(w_a + w_b), in fp32. A state with s = -inf (no keys) has no weight; merging
// only such states gives v = 0, s = -inf. Upstream's edge rules are kept (docs/ATTENTION.md): a
// NaN s weighs 0 (the max is fmaxf's), a weightless state's v is still multiplied in (0 * NaN is
// NaN), and merge_states folds its states in order, copying a single one through as it is.
#pragma once

#include <optional>
#include <tuple>

#include "flashinfer/tensor.h"

namespace flashinfer {

/// v_a, v_b [seq, H, D] (fp16, bf16 or fp32, same dtype); s_a, s_b [seq, H] fp32.
/// Returns (v_merged [seq, H, D] in v's dtype, s_merged [seq, H] fp32), new contiguous tensors.
std::tuple<Tensor, Tensor> merge_state(const Tensor& v_a, const Tensor& s_a, const Tensor& v_b,
                                       const Tensor& s_b);

/// In place: (v, s) <- merge((v, s), (v_other, s_other)). mask: optional bool [seq]; rows
/// where it is false are left untouched.
void merge_state_in_place(const Tensor& v, const Tensor& s, const Tensor& v_other,
                          const Tensor& s_other, std::optional<Tensor> mask = std::nullopt);

/// v [seq, num_states, H, D], s [seq, num_states, H] fp32: the n-ary merge over num_states.
/// Returns (v_merged [seq, H, D], s_merged [seq, H]).
std::tuple<Tensor, Tensor> merge_states(const Tensor& v, const Tensor& s);

}  // namespace flashinfer
