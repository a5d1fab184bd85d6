// Private: what the BF16 x NVFP4 GEMM backends receive (prepare_bf16_fp4_weights and
// mm_bf16_fp4), and the arithmetic of the prepared layouts the CPU reference and the CUDA kernel
// share (host and device).
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"
#include "kernels/quantization_params.h"

namespace flashinfer::kernels {

enum class Bf16Fp4Layout : int { kCudnn = 0, kCuteDsl = 1 };

/// Canonical weight -> one backend's prepared layout.
struct Bf16Fp4PrepareParams {
  Bf16Fp4Layout layout = Bf16Fp4Layout::kCudnn;
  int64_t n = 0, k = 0;        // k: unpacked (two codes per byte of b)
  const uint8_t* b = nullptr;  // [n, k/2], row stride b_stride_n bytes, unit column stride
  int64_t b_stride_n = 0;
  const uint8_t* sf = nullptr;  // 128x4-swizzled e4m3 scales of [n, k/16]
  uint8_t* out_b = nullptr;     // kCuteDsl: int32 [k/16, 2n] as bytes; kCudnn: unused
  uint8_t* out_sf = nullptr;    // kCudnn: [n, k/16] e4m3; kCuteDsl: [k/16, n] S0E5M3
};

struct Bf16Fp4GemmParams {
  Bf16Fp4Layout layout = Bf16Fp4Layout::kCudnn;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;  // bf16 [m, k], unit column stride
  int64_t a_stride_m = 0;
  const uint8_t* b = nullptr;  // kCudnn: [n, k/2] (row stride b_stride_n); kCuteDsl: int32 bytes
  int64_t b_stride_n = 0;
  const uint8_t* sf = nullptr;  // kCudnn: e4m3 [n, k/16]; kCuteDsl: S0E5M3 [k/16, n]; contiguous
  float alpha = 1.0f;
  void* out = nullptr;
  DType out_dtype = DType::kBFloat16;
  int64_t out_stride_m = 0, out_stride_n = 1;
};

/// The cudnn layout's scales are the canonical 128x4-swizzled ones un-swizzled (upstream's
/// _unswizzle_sf_128x4): scale (row, col) of the [n, k_sf] result comes from this byte of
/// the swizzled buffer.
FLASHINFER_HD int64_t bf16_fp4_cudnn_sf_source(int64_t row, int64_t col, int64_t ksf) {
  return sf_offset(SfLayoutCode::k128x4, row, col, ksf);
}

}  // namespace flashinfer::kernels
