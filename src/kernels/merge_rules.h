// Private: how the public state merges (merge_state, merge_state_in_place, merge_states) weigh
// their states, shared by the CPU reference and the CUDA kernel so both keep upstream's rules
// (flashinfer 0.7.4, attention/cascade.cuh and attention/state.cuh), which decide more than the
// formula 2^(s_k - max) / sum:
//   - the max is fmaxf's: a NaN LSE loses to the other operand, and a state's weight is
//     2^max(s - m, -inf), so a NaN LSE (or -inf - -inf) weighs 0 instead of poisoning the sum;
//   - a state of weight 0 is still multiplied in (0 * v): a NaN or inf in its v gives NaN;
//   - two states merge as a_scale * v_a + b_scale * v_b with a_scale = w_a / (w_a + w_b) and the
//     LSE log2(w_a + w_b) + max (0 and -inf when both weigh 0);
//   - merge_states folds its states one at a time into a running (m, d, o) that starts at
//     (-inf, 1, 0), scales o by 1 / d at the end (0 when d is 0) and writes m + log2(d); one state
//     is copied through as it is (its v and its LSE, also -inf or NaN), none writes 0 and -inf.
// Upstream's exp2 / log2 are ex2.approx / lg2.approx: last-bit differences remain
// (docs/ATTENTION.md, "State merges"); these rules fix which states count and which values come out
// NaN.
#pragma once

#include <cmath>

#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels {

/// 2^(s - m) with NaN (a NaN s or m, or -inf - -inf) weighing 0, as upstream's
/// exp2(max(s - m, -inf)).
FLASHINFER_HD float merge_weight(float s, float m) { return exp2f(fmaxf(s - m, -INFINITY)); }

/// merge_state's coefficients: v = a_scale * v_a + b_scale * v_b, LSE `s`.
struct MergePair {
  float a_scale, b_scale, s;
};

FLASHINFER_HD MergePair merge_pair(float s_a, float s_b) {
  const float m = fmaxf(s_a, s_b);
  const float wa = merge_weight(s_a, m), wb = merge_weight(s_b, m);
  const float d = wa + wb;
  return {d > 0.0f ? wa / d : 0.0f, d > 0.0f ? wb / d : 0.0f, log2f(d) + m};
}

/// merge_states' running state: o' = o * f_prev + v * f_new after each fold.
struct MergeFold {
  float m = -INFINITY, d = 1.0f;
  float f_prev = 0.0f, f_new = 0.0f;  // the last fold's factors

  FLASHINFER_HD void fold(float s) {
    const float m_new = fmaxf(m, s);
    f_prev = merge_weight(m, m_new);
    f_new = merge_weight(s, m_new);
    d = d * f_prev + f_new;
    m = m_new;
  }
  /// The factor o is scaled by at the end.
  FLASHINFER_HD float out_scale() const { return d > 0.0f ? 1.0f / d : 0.0f; }
  FLASHINFER_HD float lse() const { return m + log2f(d); }
};

}  // namespace flashinfer::kernels
