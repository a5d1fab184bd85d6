// Private: one element of a runtime-typed buffer as fp32 and back, for the MoE CPU kernels
// (their activations, scales and outputs come in several dtypes chosen per call).
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"
#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"

namespace flashinfer::kernels::cpu::moe_io {

/// base[i] of dtype `dt` (fp32, fp16, bf16, float8_e4m3fn) as fp32; `op` names the kernel in the
/// internal error for any other dtype (the API layer admits none).
inline float load_f(const void* base, DType dt, int64_t i, const char* op = "moe") {
  switch (dt) {
    case DType::kFloat32:
      return static_cast<const float*>(base)[i];
    case DType::kFloat16:
      return half_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kBFloat16:
      return bfloat16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kFloat8E4M3FN:
      return e4m3fn_bits_to_float(static_cast<const uint8_t*>(base)[i]);
    default:
      FLASHINFER_FAIL(ErrorCode::kInternal, op, "", "unexpected dtype ", dtype_name(dt));
  }
}

/// base[i] = v rounded to `dt` (fp32, fp16 or bf16; round to nearest even).
inline void store_f(void* base, DType dt, int64_t i, float v, const char* op = "moe") {
  switch (dt) {
    case DType::kFloat32:
      static_cast<float*>(base)[i] = v;
      return;
    case DType::kFloat16:
      static_cast<uint16_t*>(base)[i] = float_to_half_bits(v);
      return;
    case DType::kBFloat16:
      static_cast<uint16_t*>(base)[i] = float_to_bfloat16_bits(v);
      return;
    default:
      FLASHINFER_FAIL(ErrorCode::kInternal, op, "", "unexpected dtype ", dtype_name(dt));
  }
}

}  // namespace flashinfer::kernels::cpu::moe_io
