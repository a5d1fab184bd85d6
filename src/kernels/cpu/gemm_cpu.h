// CPU GEMM backend. Four paths, both fp32 accumulation over exactly widened inputs, rounded once
// to the output dtype:
//  * small m (decode: m <= kGemmSmallMMax): B is read in its stored bf16 / fp8 form and widened
//    in registers (AVX-512 or AVX2+FMA, chosen at run time; portable scalar otherwise), OpenMP
//    over blocks of n. No fp32 copy of B is ever made, so B costs its own bytes once.
//  * otherwise, bf16 by bf16 with dense rows on AVX-512 BF16 CPUs without AMX: our fp32-FMA
//    kernel with oneDNN's sums bit for bit (gemm_bf16_dpbf16_cpu.h);
//  * otherwise, when both inputs are exact in bf16 (bf16, e4m3, e5m2) and oneDNN is available:
//    oneDNN's bf16 matmul (gemm_bf16_cpu.h), fp32 accumulation;
//  * otherwise: inputs converted to fp32 tiles, multiplied by OpenBLAS sgemm.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/gemm_params.h"

namespace flashinfer::kernels::cpu {

void gemm(const GemmParams& p);
void mm_fp4(const Fp4GemmParams& p);

/// Largest m that gemm() sends to the small-m path (chosen by measurement: bench_gemm, see
/// docs/PERFORMANCE.md "GEMM and quantization").
inline constexpr int64_t kGemmSmallMMax = 128;

// Below: for tests and benchmarks, which must reach each path and instruction set.

enum class GemmPath { kAuto, kSmallM, kSgemm, kBf16, kDpbf16 };
/// gemm() with the path forced (kSmallM works for any m, but only for bf16 / fp8 B; kBf16 (oneDNN)
/// for any m, but only for inputs exact in bf16 and with oneDNN; kDpbf16 (gemm_bf16_dpbf16_cpu.h)
/// for any m, bf16 inputs with dense rows on AVX-512 BF16 CPUs; all fall back to sgemm
/// otherwise) and
/// the small-m path's instruction set capped at `isa` (clamped to detected_cpu_isa(), cpu_isa.h).
void gemm_with(const GemmParams& p, GemmPath path, CpuIsa isa);

}  // namespace flashinfer::kernels::cpu
