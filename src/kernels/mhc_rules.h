// Private: the per-token arithmetic of the mHC ops, shared by the CPU reference and the CUDA
// kernels (plain C++ with FLASHINFER_HD, so both compile the same expressions; the fused
// multiply-adds are written out where upstream's kernels contract them, so both round alike).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels::mhc {

inline constexpr int kHc = 4;    // residual streams
inline constexpr int kMix = 24;  // logits a token: 4 pre, 4 post, 16 comb ([old][new], row-major)

/// One output of mhc_post: x * post_j rounded, then the four streams folded in with fused
/// multiply-adds in stream order (upstream's kernel order).
FLASHINFER_HD float post_element(float x, float post_j, const float (&r)[kHc], const float* comb,
                                 int j) {
  float acc = x * post_j;
  for (int i = 0; i < kHc; ++i) acc = fmaf(r[i], comb[i * kHc + j], acc);
  return acc;
}

/// layer_input's element: sum_i pre_i * r_i, fused multiply-adds from 0.
FLASHINFER_HD float layer_input_element(const float (&pre)[kHc], const float (&r)[kHc]) {
  float acc = 0.0f;
  for (int i = 0; i < kHc; ++i) acc = fmaf(pre[i], r[i], acc);
  return acc;
}

FLASHINFER_HD float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// Sinkhorn's column step: every column divided by (its sum + eps), the sum taken pairwise.
FLASHINFER_HD void sinkhorn_columns(float (&c)[kHc * kHc], float eps) {
  for (int j = 0; j < kHc; ++j) {
    const float col = (c[j] + c[4 + j]) + (c[8 + j] + c[12 + j]);
    for (int i = 0; i < kHc; ++i) c[i * kHc + j] = c[i * kHc + j] / (col + eps);
  }
}

/// One token's mixes from its 24 logits y and the sum of squares q of its residual row:
/// rstd = 1 / sqrt(q / k + rms_eps); pre = sigmoid(y * rstd * scale0 + base) + pre_eps; post =
/// sigmoid(..) * post_mult; comb = Sinkhorn of the 4 x 4 logits: a row softmax (+ eps after the
/// division), a column step, then (repeat - 1) times a row step (divided by row sum + eps) and a
/// column step.
FLASHINFER_HD void pre_mixes(const float (&y)[kMix], float q, float k, const float* scale,
                             const float* base, float rms_eps, float pre_eps, float eps,
                             float post_mult, int repeat, float (&pre)[kHc], float (&post)[kHc],
                             float (&comb)[kHc * kHc]) {
  const float rstd = 1.0f / sqrtf(q / k + rms_eps);
  for (int c = 0; c < kHc; ++c) {
    pre[c] = sigmoid(fmaf(y[c] * rstd, scale[0], base[c])) + pre_eps;
    post[c] = sigmoid(fmaf(y[kHc + c] * rstd, scale[1], base[kHc + c])) * post_mult;
  }
  for (int i = 0; i < kHc; ++i) {
    float L[kHc];
    for (int j = 0; j < kHc; ++j) {
      const int m = 2 * kHc + i * kHc + j;
      L[j] = fmaf(y[m] * rstd, scale[2], base[m]);
    }
    const float mx = fmaxf(fmaxf(L[0], L[1]), fmaxf(L[2], L[3]));
    float e[kHc];
    for (int j = 0; j < kHc; ++j) e[j] = expf(L[j] - mx);
    const float s = ((e[0] + e[1]) + e[2]) + e[3];
    for (int j = 0; j < kHc; ++j) comb[i * kHc + j] = e[j] / s + eps;
  }
  sinkhorn_columns(comb, eps);
  for (int r = 1; r < repeat; ++r) {
    for (int i = 0; i < kHc; ++i) {
      float* row = comb + i * kHc;
      const float rs = (((row[0] + row[1]) + row[2]) + row[3]) + eps;
      for (int j = 0; j < kHc; ++j) row[j] = row[j] / rs;
    }
    sinkhorn_columns(comb, eps);
  }
}

}  // namespace flashinfer::kernels::mhc
