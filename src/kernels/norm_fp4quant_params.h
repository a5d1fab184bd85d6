// Private: what the fused RMSNorm + FP4 quantization kernels of every backend receive
// (flashinfer.cute_dsl.rmsnorm_fp4quant / add_rmsnorm_fp4quant), and the per-block arithmetic
// both backends share (FLASHINFER_HD), so they write the same codes for the same fp32 values.
#pragma once

#include <cmath>
#include <cstdint>

#include "flashinfer/dtype.h"
#include "flashinfer/float_formats.h"
#include "kernels/cuda/device/host_device.h"
#include "kernels/nvfp4_rules.h"
#include "kernels/quantization_params.h"

namespace flashinfer::kernels {

struct NormFp4Params {
  int64_t M = 0, H = 0;
  int block_size = 16;
  DType dtype = DType::kBFloat16;  // input, residual, weight, y_out
  const void* input = nullptr;
  int64_t in_stride = 0;     // row stride (elements); unit stride along H
  void* residual = nullptr;  // add_: h = input + residual written back here; null otherwise
  int64_t res_stride = 0;
  const void* weight = nullptr;         // [H]
  const float* global_scale = nullptr;  // one value (null: 1)
  float eps = 1e-6f;
  bool ue8m0 = false;        // scale codes: ue8m0 (MXFP4) or e4m3
  uint8_t* y_fp4 = nullptr;  // [M, H / 2] packed e2m1, contiguous rows
  uint8_t* sf = nullptr;     // scale codes in sf_layout (k128x4 or kLinear, [M, H / bs])
  SfLayoutCode sf_layout = SfLayoutCode::kLinear;
  uint8_t* sf_linear = nullptr;  // output_both_sf_layouts: the row-major copy
  void* y_out = nullptr;         // y before quantization (dtype), [M, H] contiguous rows
};

/// One block of bs normalized values y (times gs for e4m3) to its scale code and e2m1 codes
/// packed two a byte into out[0 .. bs / 2): e4m3: sf = min((gs * amax) * (1 / 6), 448), code =
/// e4m3 nearest-even, q = e2m1(y * (gs / decode(code))) (0 for a zero code); ue8m0: code = the
/// smallest power of two >= amax * (1 / 6), q = e2m1(y * 2^(127 - code)) (0 for code 0).
FLASHINFER_HD uint8_t norm_fp4_block(const float* y, int bs, float gs, bool ue8m0, uint8_t* out) {
  float amax = 0.0f;
  FLASHINFER_UNROLL
  for (int i = 0; i < bs; ++i) amax = fmaxf(amax, fabsf(y[i]));
  constexpr float kRcp6 = 1.0f / 6.0f;
  uint8_t code;
  float inv;
  if (ue8m0) {
    code = ue8m0_round_up(amax * kRcp6);
    inv = code == 0 ? 0.0f : 1.0f / ue8m0_to_float(code);
  } else {
    code = float_to_e4m3fn_bits(fminf((gs * amax) * kRcp6, 448.0f), true);
    const float dec = e4m3_code_to_float(code);
    inv = dec == 0.0f ? 0.0f : (1.0f / dec) * gs;
  }
  FLASHINFER_UNROLL
  for (int i = 0; i < bs; i += 2) {
    out[i / 2] = pack_e2m1x2(float_to_e2m1_bits(y[i] * inv), float_to_e2m1_bits(y[i + 1] * inv));
  }
  return code;
}

}  // namespace flashinfer::kernels
