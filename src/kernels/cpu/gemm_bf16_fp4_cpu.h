// Private: CPU reference of the BF16 x NVFP4 GEMM and its two prepared weight layouts.
#pragma once

#include <cstdint>

#include "kernels/gemm_bf16_fp4_params.h"

namespace flashinfer::kernels::cpu {

void bf16_fp4_prepare(const Bf16Fp4PrepareParams& p);
void mm_bf16_fp4(const Bf16Fp4GemmParams& p);

/// Byte j of int32 word `word` of a cute-dsl packed (16 k x 64 n) tile holds the weight byte
/// of tile row (k/2 index) *kh and tile column *nn.
void cute_dsl_tile_source(int64_t word, int64_t j, int64_t* kh, int64_t* nn);
/// e4m3 scale byte -> S0E5M3 byte (bits 7..14 of the value's fp16 encoding).
uint8_t e4m3_to_s0e5m3(uint8_t e4m3);

}  // namespace flashinfer::kernels::cpu
