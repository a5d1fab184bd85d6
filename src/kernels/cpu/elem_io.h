// Private: one element of a runtime-typed buffer as fp32 and back, for the CPU kernels whose
// operands, scales and outputs come in a dtype chosen per call (gemm, block-scaled and grouped
// gemm, gguf, MoE). Kernels differ in which dtypes they admit and in what a dtype outside that set
// means, so decode/encode only say "not a float format" and each caller's policy stays visible:
// *_or_fp32 treats it as fp32 (the API layer has validated), *_strict raises.
#pragma once

#include <cstdint>
#include <optional>

#include "flashinfer/dtype.h"
#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"

namespace flashinfer::kernels::cpu::elem_io {

/// base[i] as fp32 (exact) for fp32, fp16, bf16, float8 e4m3fn and e5m2; nullopt for another
/// dtype. A plain switch, not visit_dtype: it sits in per-element loops, where GCC 12 inlines the
/// lambda version into much larger code.
inline std::optional<float> decode(const void* base, DType dt, int64_t i) {
  switch (dt) {
    case DType::kFloat32:
      return static_cast<const float*>(base)[i];
    case DType::kFloat16:
      return half_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kBFloat16:
      return bfloat16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kFloat8E4M3FN:
      return e4m3fn_bits_to_float(static_cast<const uint8_t*>(base)[i]);
    case DType::kFloat8E5M2:
      return e5m2_bits_to_float(static_cast<const uint8_t*>(base)[i]);
    default:
      return std::nullopt;
  }
}

/// base[i] = v rounded to nearest even in `dt` and true, for fp32, fp16, bf16, float8 e4m3fn and
/// e5m2 (the fp8 formats saturate to their largest finite value, like CUDA's __NV_SATFINITE);
/// false, writing nothing, for another dtype.
inline bool encode(void* base, DType dt, int64_t i, float v) {
  switch (dt) {
    case DType::kFloat32:
      static_cast<float*>(base)[i] = v;
      return true;
    case DType::kFloat16:
      static_cast<uint16_t*>(base)[i] = float_to_half_bits(v);
      return true;
    case DType::kBFloat16:
      static_cast<uint16_t*>(base)[i] = float_to_bfloat16_bits(v);
      return true;
    case DType::kFloat8E4M3FN:
      static_cast<uint8_t*>(base)[i] = float_to_e4m3fn_bits(v, /*saturate=*/true);
      return true;
    case DType::kFloat8E5M2:
      static_cast<uint8_t*>(base)[i] = float_to_e5m2_bits(v, /*saturate=*/true);
      return true;
    default:
      return false;
  }
}

/// The value a buffer of `dt` holds for v: fp16 and bf16 round to nearest even, anything else
/// keeps v (fp32).
inline float round_to(DType dt, float v) {
  switch (dt) {
    case DType::kFloat16:
      return half_bits_to_float(float_to_half_bits(v));
    case DType::kBFloat16:
      return bfloat16_bits_to_float(float_to_bfloat16_bits(v));
    default:
      return v;
  }
}

/// decode, reading any other dtype as fp32: for kernels whose API layer admits float formats only.
inline float load_or_fp32(const void* base, DType dt, int64_t i) {
  if (const auto v = decode(base, dt, i)) return *v;
  return static_cast<const float*>(base)[i];
}

/// encode, writing any other dtype as fp32: for kernels whose API layer admits float formats only.
inline void store_or_fp32(void* base, DType dt, int64_t i, float v) {
  if (!encode(base, dt, i, v)) static_cast<float*>(base)[i] = v;
}

/// The MoE kernels' reading: fp32, fp16, bf16 or e4m3fn. Their API layer admits nothing else
/// (e5m2 included), so another dtype is an internal error naming `op`.
inline float load_strict(const void* base, DType dt, int64_t i, const char* op = "moe") {
  if (dt != DType::kFloat8E5M2) {
    if (const auto v = decode(base, dt, i)) return *v;
  }
  FLASHINFER_FAIL(ErrorCode::kInternal, op, "", "unexpected dtype ", dtype_name(dt));
}

/// The MoE kernels' writing: fp32, fp16 or bf16 (RNE); no MoE output is fp8, so another dtype is
/// an internal error naming `op`.
inline void store_strict(void* base, DType dt, int64_t i, float v, const char* op = "moe") {
  const bool fp8 = dt == DType::kFloat8E4M3FN || dt == DType::kFloat8E5M2;
  if (!fp8 && encode(base, dt, i, v)) return;
  FLASHINFER_FAIL(ErrorCode::kInternal, op, "", "unexpected dtype ", dtype_name(dt));
}

}  // namespace flashinfer::kernels::cpu::elem_io
