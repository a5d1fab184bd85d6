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

}  // namespace flashinfer::kernels::kda
