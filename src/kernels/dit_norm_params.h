// Private: what the CPU kernel of the fused DiT LayerNorm ops receives (bf16 rows, fp32 biases,
// strides in elements).
#pragma once

#include <cstdint>

namespace flashinfer::kernels {

enum class DitNormMode : int { kResidualScaleShift = 0, kGateResidualScaleShift, kGammaBeta };

struct DitNormParams {
  DitNormMode mode = DitNormMode::kGammaBeta;
  const uint16_t* input = nullptr;     // bf16 [batch, rows, hidden] contiguous
  const uint16_t* residual = nullptr;  // same, or null (zeros)
  // gate / scale / shift: bf16 rows at b * stride_b + r * stride_r (unit stride along hidden).
  const uint16_t* gate = nullptr;
  const uint16_t* scale = nullptr;
  const uint16_t* shift = nullptr;
  int64_t gate_stride_b = 0, gate_stride_r = 0;
  int64_t scale_stride_b = 0, scale_stride_r = 0;
  int64_t shift_stride_b = 0, shift_stride_r = 0;
  const float* gate_bias = nullptr;  // [hidden] or null (zeros)
  const float* scale_bias = nullptr;
  const float* shift_bias = nullptr;
  const float* gamma = nullptr;  // [hidden] (gamma/beta mode)
  const float* beta = nullptr;
  bool has_input_scale = false;
  float input_scale = 1.0f;
  float eps = 1e-6f;
  int64_t batch = 0, rows = 0, hidden = 0;
  uint16_t* residual_out = nullptr;  // bf16 [batch, rows, hidden] contiguous
  uint16_t* norm_out = nullptr;
};

}  // namespace flashinfer::kernels
