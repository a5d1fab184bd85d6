// Private: the CPU kernels of mm_gguf (GGUF Q4_1 / Q8_0 weights, dequantized on the fly).
#pragma once

#include "kernels/cpu/cpu_isa.h"
#include "kernels/gguf_mm_params.h"

namespace flashinfer::kernels::cpu {

/// out = a @ dequant(b)^T with fp32 accumulation, on the vector tier cpu_isa() allows.
void gguf_mm(const GgufMmParams& p);
/// The same on a given tier (lowered to what this CPU has); for tests and benchmarks.
void gguf_mm_with(const GgufMmParams& p, CpuIsa isa);

/// Whether Q4_1 runs on split activations here (AVX-512 with BF16 and VBMI): bf16 activations
/// exactly at any m, other dtypes for m = 1 as two bf16 parts, |x - x_1 - x_2| <= 2^-16 |x|
/// (gguf_mm_cpu.cpp says why and how).
bool gguf_mm_has_split_path();

/// Whether m = 1 with fp32/fp16 activations runs on two int8 parts of each activation (AVX-512
/// VNNI, and not turned off): |x - s2 (256 hi + lo)| <= max|x| / 32512 per block of 32
/// activations (gguf_mm_cpu.cpp says why and how). Takes precedence over the split path.
bool gguf_mm_has_int8_path();
/// Turns the int8 path off (or back on) for the whole process; for tests and benchmarks only.
void set_gguf_mm_int8_path_enabled(bool enabled);

/// Dequantizes one row of `blocks` blocks to fp32, as the GGUF formula writes it (d * q + m in
/// fp32, each operation rounded). The scalar reference and the tests use it.
void gguf_dequantize_row(GgmlQuantType type, const uint8_t* row, int64_t blocks, float* out);

}  // namespace flashinfer::kernels::cpu
