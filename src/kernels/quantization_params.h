// Private: what the quantization kernels of every backend receive, and the scale-factor
// arithmetic both backends share (host and device).
#pragma once

#include <cstdint>
#include <cstring>

#include "flashinfer/dtype.h"

#if defined(__CUDACC__)
#define FLASHINFER_HD __host__ __device__ __forceinline__
#else
#define FLASHINFER_HD inline
#endif

namespace flashinfer::kernels {

enum class SfLayoutCode : int { k128x4 = 0, k8x4 = 1, kLinear = 2 };

/// Offset of scale (row, col) for an unpadded scale matrix with `num_sf_cols` columns.
FLASHINFER_HD int64_t sf_offset(SfLayoutCode layout, int64_t row, int64_t col,
                                int64_t num_sf_cols) {
  const int64_t k_tiles = (num_sf_cols + 3) / 4;
  switch (layout) {
    case SfLayoutCode::k128x4:
      return (row / 128) * k_tiles * 512 + (col / 4) * 512 + (row % 32) * 16 +
             ((row % 128) / 32) * 4 + col % 4;
    case SfLayoutCode::k8x4:
      return (row / 8) * k_tiles * 32 + (col / 4) * 32 + (row % 8) * 4 + col % 4;
    default:
      return row * num_sf_cols + col;
  }
}

/// Bytes of a scale buffer for an [rows, num_sf_cols] scale matrix (padding included).
FLASHINFER_HD int64_t sf_buffer_size(SfLayoutCode layout, int64_t rows, int64_t num_sf_cols) {
  const int64_t cols4 = (num_sf_cols + 3) / 4 * 4;
  switch (layout) {
    case SfLayoutCode::k128x4:
      return (rows + 127) / 128 * 128 * cols4;
    case SfLayoutCode::k8x4:
      return (rows + 7) / 8 * 8 * cols4;
    default:
      return rows * num_sf_cols;
  }
}

FLASHINFER_HD uint32_t f32_to_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
#endif
}

FLASHINFER_HD float f32_from_bits(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, 4);
  return x;
#endif
}

/// ue8m0 code of the smallest power of two >= x (round toward +inf), saturating at 2^127
/// (code 254); NaN gives 255, x <= 0 gives 0 (2^-127). Exact on the float bits.
FLASHINFER_HD uint8_t ue8m0_round_up(float x) {
  const uint32_t bits = f32_to_bits(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 255;
  if ((bits >> 31) != 0 || bits == 0) return 0;
  const uint32_t exp = bits >> 23;
  const uint32_t man = bits & 0x7FFFFFu;
  uint32_t code;
  if (exp == 0) {
    code = man <= (1u << 22) ? 0u : 1u;  // subnormal: 2^-127 is mantissa 2^22
  } else {
    code = exp + (man != 0 ? 1u : 0u);
  }
  return static_cast<uint8_t>(code > 254u ? 254u : code);
}

/// 2^(code - 127) as float (code 0 is the subnormal 2^-127, 255 is NaN).
FLASHINFER_HD float ue8m0_to_float(uint8_t code) {
  const uint32_t bits = code == 0     ? 0x00400000u
                        : code == 255 ? 0x7FC00000u
                                      : static_cast<uint32_t>(code) << 23;
  return f32_from_bits(bits);
}

/// Upstream 0.7.4's NVFP4 "4 over 6" recipe (its NVFP44Over6Config, kernels/nvfp4_rules.h
/// nvfp4_4over6_block): on; the error metric (squared, else absolute differences); the "fast"
/// error (candidates compared as q * s against x * S); exact_math: upstream's
/// DISABLE_FP4_QUANT_FAST_MATH association (RN(amax / 6) * S, output scales fminf(1 / (s / S),
/// FLT_MAX)).
struct Nvfp4FourOverSix {
  bool on = false, mse = false, fast_err = false, exact_math = false;
};

/// FP4 quantization of rows of an [m, k] matrix into packed e2m1 + block scales.
struct Fp4QuantizeParams {
  const void* input = nullptr;
  DType in_dtype = DType::kBFloat16;
  int64_t m = 0, k = 0;
  int64_t in_stride_m = 0, in_stride_k = 1;
  uint8_t* out = nullptr;  // [m, k/2] contiguous
  uint8_t* sf = nullptr;   // sf_buffer_size bytes, zeroed padding written by the kernel
  int64_t sf_size = 0;
  const float* global_scale = nullptr;  // one fp32 on the input's device; null means 1
  // fp4_quantize's per-row form (upstream's useRowWiseGlobalScale): global_scale holds m fp32s,
  // row r quantized with global_scale[r].
  bool global_scale_per_row = false;
  bool global_scale_inversed = false;
  int sf_vec_size = 16;
  bool ue8m0 = false;
  SfLayoutCode layout = SfLayoutCode::k128x4;
  // The CuTe-DSL entry points' zero rule (*_quantize_cute_dsl): a block whose decoded scale is 0
  // (an e4m3 scale that rounds to 0; ue8m0 code 0) gets e2m1(x * 0), signed zeros, where the
  // other paths saturate (NVFP4: nvfp4_code) or divide by 2^-127 (MXFP4).
  bool cute_dsl_zero = false;
  // Per-token NVFP4 (nvfp4_quantize_per_token_cute_dsl), when per_token_scale is set: row r's
  // scale is row_amax * gsi (0 for a zero row), written to per_token_scale[r], and its blocks
  // are quantized with the global scale 1 / that (FLT_MAX for a zero row). gsi is the fp32 at
  // per_token_gsi (on the input's device) or, when that is null, per_token_gsi_value.
  float* per_token_scale = nullptr;
  const float* per_token_gsi = nullptr;
  float per_token_gsi_value = 0.0f;
  // NVFP4 (16, e4m3) blocks of fp16 / bf16 input by the 4over6 recipe when on (the CPU
  // reference; the API refuses it on CUDA and with per-token scales).
  Nvfp4FourOverSix four_over_six;
};

/// The per-token rule above: (row scale, the rows' global scale) from the row's amax.
struct PerTokenScales {
  float scale, encode;
};
FLASHINFER_HD PerTokenScales nvfp4_per_token_scales(float row_amax, float gsi) {
  if (row_amax == 0.0f) return {0.0f, 3.402823466e38f};
  const float scale = row_amax * gsi;
  return {scale, 1.0f / scale};
}

/// MXFP8 quantization of an [m, k] matrix: e4m3 values + ue8m0 scales of blocks of 32.
struct Mxfp8QuantizeParams {
  const void* input = nullptr;
  DType in_dtype = DType::kBFloat16;
  int64_t m = 0, k = 0;
  int64_t in_stride_m = 0, in_stride_k = 1;
  uint8_t* out = nullptr;  // [m, k] contiguous e4m3 bits
  uint8_t* sf = nullptr;
  int64_t sf_size = 0;
  SfLayoutCode layout = SfLayoutCode::k128x4;
};

/// The batch-invariant quantizers (kernels/quant_batch_invariant_rules.h) over an [m, k] matrix
/// of fp16 / bf16 / fp32 (k a multiple of the block): NVFP4 (global scale, or per token with
/// per_token_scale set), MXFP4 or MXFP8.
enum class BatchInvariantFormat : int { kNvfp4 = 0, kMxfp4 = 1, kMxfp8 = 2 };
struct BatchInvariantQuantizeParams {
  BatchInvariantFormat format = BatchInvariantFormat::kNvfp4;
  const void* input = nullptr;
  DType in_dtype = DType::kBFloat16;
  int64_t m = 0, k = 0;
  int64_t in_stride_m = 0, in_stride_k = 1;
  uint8_t* out = nullptr;  // [m, k/2] packed e2m1 or [m, k] e4m3, contiguous
  uint8_t* sf = nullptr;   // sf_buffer_size bytes, padding zeroed by the kernel
  int64_t sf_size = 0;
  SfLayoutCode layout = SfLayoutCode::k128x4;
  float global_scale = 1.0f;         // NVFP4 per tensor
  float* per_token_scale = nullptr;  // NVFP4 per token: [m] pts out, with per_token_gsi
  float per_token_gsi = 0.0f;
};

/// Block dequantization to fp32 [m, k]: packed e2m1 (fp4) or e4m3 (fp8) values with e4m3 or ue8m0
/// block scales and an optional global multiplier.
struct BlockDequantizeParams {
  const uint8_t* data = nullptr;  // [m, k/2] packed e2m1, or [m, k] e4m3
  int64_t data_stride_m = 0;      // in bytes
  bool fp4 = true;
  const uint8_t* sf = nullptr;
  int64_t sf_size = 0;
  bool sf_ue8m0 = false;
  int sf_vec_size = 16;
  SfLayoutCode layout = SfLayoutCode::k128x4;
  // ue8m0 scales decoded as the float with exponent bits `code` (code << 23: 0 is +0.0, 255 is
  // +inf), as upstream's E2M1AndUFP8SFScaleToFloatV2 and mxfp8_dequantize_host do; else
  // ue8m0_to_float (CUDA's e8m0 conversion, upstream's mxfp4_dequantize_host).
  bool ue8m0_shift = false;
  float global_scale = 1.0f;  // value = q * (scale * global_scale)
  int64_t m = 0, k = 0;
  float* out = nullptr;  // [m, k] contiguous
};

/// 128x4 interleave of [batch, rows, cols] linear scales (1 or 2 bytes each) into
/// batch * sf_buffer_size(k128x4, rows, cols) elements, padding zero.
struct BlockScaleInterleaveParams {
  const void* input = nullptr;
  int elem_size = 1;
  int64_t batch = 1, rows = 0, cols = 0;
  int64_t in_stride_b = 0, in_stride_r = 0, in_stride_c = 1;
  void* out = nullptr;
};

}  // namespace flashinfer::kernels
