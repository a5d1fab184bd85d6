// Private: CPU reference of the BF16 x NVFP4 GEMM and its two prepared weight layouts.
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"

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

namespace cpu {
void bf16_fp4_prepare(const Bf16Fp4PrepareParams& p);
void mm_bf16_fp4(const Bf16Fp4GemmParams& p);

/// Byte j of int32 word `word` of a cute-dsl packed (16 k x 64 n) tile holds the weight byte
/// of tile row (k/2 index) *kh and tile column *nn.
void cute_dsl_tile_source(int64_t word, int64_t j, int64_t* kh, int64_t* nn);
/// e4m3 scale byte -> S0E5M3 byte (bits 7..14 of the value's fp16 encoding).
uint8_t e4m3_to_s0e5m3(uint8_t e4m3);
}  // namespace cpu

}  // namespace flashinfer::kernels
