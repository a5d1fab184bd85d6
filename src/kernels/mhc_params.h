// Private: what the manifold-constrained hyper-connection (mHC) kernels of every backend receive
// (flashinfer.mhc: DeepSeek-V4's hyper-connections over HC = 4 residual streams;
// docs/NORM_ACTIVATION_ROPE.md, "Hyper-connections"). Every tensor is contiguous, flattened to
// T tokens.
#pragma once

#include <cstdint>

namespace flashinfer::kernels {

/// mhc_post: out[t, j, h] = x[t, h] * post[t, j] + sum_i comb[t, i, j] * residual[t, i, h]
/// (bf16 x / residual / out, fp32 post [T, 4] and comb [T, 4, 4]).
struct MhcPostParams {
  int64_t T = 0, H = 0;
  const void* x = nullptr;         // bf16 [T, H]
  const void* residual = nullptr;  // bf16 [T, 4, H]
  const float* post = nullptr;     // [T, 4]
  const float* comb = nullptr;     // [T, 4, 4], [old stream, new stream]
  void* out = nullptr;             // bf16 [T, 4, H]
};

/// mhc_pre_big_fuse (and its prenorm form, where sqrsum is null and the sum of squares of each
/// token's 4H residual values is taken here, with k = 4H): the pre / post / comb mixes from the
/// token's 24 projection logits, and layer_input = sum_i pre_i * residual_i.
struct MhcPreParams {
  int64_t T = 0, H = 0, num_splits = 1;
  const float* dot_mix = nullptr;  // [S, T, 24]
  const float* sqrsum = nullptr;   // [S, T], or null (prenorm)
  const void* residual = nullptr;  // bf16 [T, 4, H]
  const float* scale = nullptr;    // [3]: pre, post, comb
  const float* base = nullptr;     // [24]
  float k = 1.0f, rms_eps = 1e-6f, pre_eps = 1e-6f, sinkhorn_eps = 1e-6f, post_mult = 1.0f;
  int sinkhorn_repeat = 20;
  float* post_mix = nullptr;    // [T, 4]
  float* comb_mix = nullptr;    // [T, 4, 4]
  void* layer_input = nullptr;  // bf16 [T, H]
};

}  // namespace flashinfer::kernels
