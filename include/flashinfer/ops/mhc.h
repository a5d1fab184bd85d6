// Manifold-constrained hyper-connections (mHC) of flashinfer.mhc: DeepSeek-V4's residual path of
// HC = 4 streams, as SGLang's DeepSeek-V4 model calls it. CPU reference everywhere; CUDA kernels.
// docs/NORM_ACTIVATION_ROPE.md ("Hyper-connections") gives the math and layouts.
#pragma once

#include <tuple>

#include "flashinfer/tensor.h"

namespace flashinfer {

/// New residual streams after a layer: out[.., j, h] = x[.., h] * post_layer_mix[.., j] +
/// sum_i comb_res_mix[.., i, j] * residual[.., i, h]. x [..., H] and residual [..., 4, H] bf16;
/// post_layer_mix [..., 4] or [..., 4, 1] and comb_res_mix [..., 4, 4] ([old, new]) fp32.
/// Returns a bf16 tensor shaped like residual.
Tensor mhc_post(const Tensor& x, const Tensor& residual, const Tensor& post_layer_mix,
                const Tensor& comb_res_mix);

/// A layer's input mixes from its 24 projection logits per token (dot_mix [..., 24], or
/// [num_splits, ..., 24] partials summed in order) and the residual's sum of squares (sqrsum
/// [...] or [num_splits, ...]): rstd = rsqrt(sqrsum / k + rms_eps); pre = sigmoid(logit * rstd *
/// scale[0] + base) + mhc_pre_eps; post = sigmoid(..) * mhc_post_mult_value; comb = Sinkhorn
/// (sinkhorn_repeat column steps) of the 4 x 4 logits. Returns (post_mix [..., 4, 1] fp32,
/// comb_mix [..., 4, 4] fp32, layer_input = sum_i pre_i * residual_i [..., H] bf16). residual
/// [..., 4, H] bf16 (H % 8 == 0), mhc_scale [3], mhc_base [24] fp32; block_size tunes upstream's
/// launch only.
std::tuple<Tensor, Tensor, Tensor> mhc_pre_big_fuse(
    const Tensor& dot_mix, const Tensor& sqrsum, const Tensor& residual, const Tensor& mhc_scale,
    const Tensor& mhc_base, int64_t k, double rms_eps = 1e-6, double mhc_pre_eps = 1e-6,
    double mhc_sinkhorn_eps = 1e-6, double mhc_post_mult_value = 1.0, int64_t sinkhorn_repeat = 20,
    int64_t num_splits = 1, int64_t block_size = 0);

/// mhc_pre_big_fuse with the sum of squares of each token's 4H residual values taken here (k =
/// 4H); dot_mix [..., 24] or [1, ..., 24].
std::tuple<Tensor, Tensor, Tensor> mhc_pre_big_fuse_with_prenorm(
    const Tensor& dot_mix, const Tensor& residual, const Tensor& mhc_scale, const Tensor& mhc_base,
    double rms_eps = 1e-6, double mhc_pre_eps = 1e-6, double mhc_sinkhorn_eps = 1e-6,
    double mhc_post_mult_value = 1.0, int64_t sinkhorn_repeat = 20, int64_t block_size = 0);

}  // namespace flashinfer
