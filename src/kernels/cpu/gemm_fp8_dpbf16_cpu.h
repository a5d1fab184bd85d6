// mm_fp8's large GEMM (e4m3 a [m, k] by the prepared e4m3 weight [k/128, n, 128]) on AVX-512
// BF16 + VBMI CPUs without a bf16 copy of the weight: the e4m3 codes are widened while they are
// packed (a lookup on the raw bytes), the operand packing a GEMM does anyway. The fp32 sums are
// those of oneDNN's avx512_core_bf16 matmul (the path it replaces, still used elsewhere) bit for
// bit: vdpbf16ps's per-pair order (element 2p + 1, then 2p) and oneDNN's k chunks, computed with
// fp32 FMAs (exact for e4m3 operands, twice vdpbf16ps's rate on this CPU family; chunks that
// meet a NaN code use vdpbf16ps itself). docs/GEMM_AND_QUANTIZATION.md, "Session 10".
#pragma once

#include <cstdint>
#include <functional>

namespace flashinfer::kernels::cpu {

/// True when the CPU has AVX-512 BF16 and VBMI, the AVX-512 tier is allowed (use_avx512) and
/// FLASHINFER_CPU_FP8_DPBF16 is not "0".
bool fp8_dpbf16_gemm_available();

/// c = a[m, k] * B^T with a e4m3 (row stride lda bytes, unit k stride) and B the low-latency
/// e4m3 layout [k/128, n, 128] (prepare_low_latency_gemm_weights), k % 128 == 0, n % 32 == 0.
/// One OpenMP team shares the column chunks of n; each chunk's fp32 sums [m, w] (row stride w)
/// go to epilogue(j0, w, c) while in cache. False (nothing called) when not available.
bool fp8_ll_gemm_dpbf16(int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda,
                        const uint8_t* b,
                        const std::function<void(int64_t, int64_t, const float*)>& epilogue);

}  // namespace flashinfer::kernels::cpu
