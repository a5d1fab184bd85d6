// Private: the scalar steps of the gated delta rule shared by the CPU reference and the CUDA
// kernels (plain C++ with FLASHINFER_HD, so both compile the same expressions), and the host-side
// index rules of its ops.
#pragma once

#include <cmath>
#include <cstdint>

#include "flashinfer/float_formats.h"
#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels::gdn {

/// Upstream's decode gates: softplus(x) = log(1 + exp(x)) for x <= 20, x above (torch's
/// threshold), evaluated as upstream's kernels write it (gdn_kernels/_softplus.py: the sum 1 +
/// exp(x) rounded to fp32 before the log, so x below about -17 gives 0; upstream's exp and log
/// are fast-math approximations, ours the accurate ones). decay = exp(-exp(A_log) *
/// softplus(a + dt_bias)).
FLASHINFER_HD float decode_decay(float a, float dt_bias, float A_log) {
  const float x = a + dt_bias;
  const float sp = x <= 20.0f ? logf(1.0f + expf(x)) : x;
  return expf(-expf(A_log) * sp);
}

/// x as the nearest bf16 (RNE; NaN stays NaN) when `on`: the operands upstream's decode paths
/// cast to bf16 before their kernels (GdnParams::qkv_via_bf16, gates_via_bf16).
FLASHINFER_HD float via_bf16(float x, bool on) {
  return on ? bfloat16_bits_to_float(float_to_bfloat16_bits(x)) : x;
}

/// chunk_gated_delta_rule's raw gate (upstream 0.7.4's use_gate_in_kernel, materialized in torch:
/// gdn_kernels/gates.py): alpha = exp(-exp(A_log) * softplus(g + dt_bias)) with torch's softplus,
/// log1p(exp(x)) for x <= 20 and x above.
FLASHINFER_HD float prefill_raw_decay(float g, float dt_bias, float A_log) {
  const float x = g + dt_bias;
  const float sp = x <= 20.0f ? log1pf(expf(x)) : x;
  return expf(-expf(A_log) * sp);
}

/// The j-th checkpoint (from 0) a sequence of prefix tokens takes after its new token t (from 0),
/// or -1: upstream 0.7.4 checkpoints after new token n = t + 1 when prefix + n is a multiple of
/// `every`, and counts (prefix + n) / every - prefix / every of them up to there.
FLASHINFER_HD int64_t checkpoint_ordinal(int64_t prefix, int64_t t, int64_t every) {
  const int64_t pos = prefix + t + 1;
  if (pos % every != 0) return -1;
  return pos / every - prefix / every - 1;
}

/// beta = sigmoid(b).
FLASHINFER_HD float decode_beta(float b) { return 1.0f / (1.0f + expf(-b)); }

/// The fused decode step's conv activation: silu(y) = y * sigmoid(y).
FLASHINFER_HD float conv_silu(float y) { return y * (1.0f / (1.0f + expf(-y))); }

/// The L2 normalization factor of a q or k row: rsqrt(sum of squares + 1e-6) (eps inside).
FLASHINFER_HD float l2_inv_norm(float sum_sq) { return 1.0f / sqrtf(sum_sq + 1e-6f); }

/// Head of q, k or v (H_x heads) serving state head h of H: repeat_interleave's h * H_x / H.
FLASHINFER_HD int64_t source_head(int64_t h, int64_t H_x, int64_t H) { return h * H_x / H; }

}  // namespace flashinfer::kernels::gdn
