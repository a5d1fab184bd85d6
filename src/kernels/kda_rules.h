// Private: the per-element steps of Kimi delta attention shared by the CPU reference and the CUDA
// kernel (plain C++ with FLASHINFER_HD, so both compile the same expressions).
#pragma once

#include <cmath>

#include "kernels/cuda/device/host_device.h"
#include "kernels/kda_params.h"

namespace flashinfer::kernels::kda {

FLASHINFER_HD float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/// exp(a) for one key channel: a = g (precomputed), -exp(A_log) * softplus(g + bias) (softplus
/// x above 20), or lower_bound * sigmoid(exp(A_log) * (g + bias)).
FLASHINFER_HD float decay(KdaGate mode, float g, float a_log, float bias, float lower_bound) {
  if (mode == KdaGate::kPrecomputed) return expf(g);
  const float x = g + bias;
  if (mode == KdaGate::kSoftplus) {
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    return expf(-expf(a_log) * sp);
  }
  return expf(lower_bound * sigmoid(expf(a_log) * x));
}

/// fused_kda_decode's conv + SiLU of one channel: acc = h0 w0 + h1 w1 + h2 w2 + x w3 (fused
/// multiply-adds from h0 w0), then acc * sigmoid(acc) (the caller rounds it to bf16).
FLASHINFER_HD float conv_silu(float h0, float h1, float h2, float x, float w0, float w1, float w2,
                              float w3) {
  float acc = h0 * w0;
  acc = fmaf(h1, w1, acc);
  acc = fmaf(h2, w2, acc);
  acc = fmaf(x, w3, acc);
  return acc * sigmoid(acc);
}

}  // namespace flashinfer::kernels::kda
