// mm_bf16's large GEMM (bf16 a [m, k] by the transpose of a bf16 b [n, k], m > 128) on AVX-512
// BF16 CPUs without AMX: the fp32 sums of oneDNN's avx512_core_bf16 matmul (the primitive torch's
// bf16 matmul runs, and this library's path before) bit for bit, computed with fp32 FMAs on
// operands widened while they are packed: vdpbf16ps's per-pair order (element 2p + 1, then 2p)
// and oneDNN's k chunks. The FMAs run at twice vdpbf16ps's multiply-add rate on this CPU family.
// vdpbf16ps treats subnormal inputs and results as zero, which FMAs do not: an operand panel with
// a value outside [2^-56, 2^48) in magnitude (other than +-0: subnormals, tiny or huge values,
// Inf, NaN) is multiplied with vdpbf16ps itself. docs/GEMM_AND_QUANTIZATION.md, "Session 11".
#pragma once

#include <cstdint>
#include <functional>

namespace flashinfer::kernels::cpu {

/// True when the CPU has AVX-512 F and AVX512_BF16 but no AMX-BF16 (where oneDNN's AMX kernels
/// are faster and sum in another order), the AVX-512 tier is allowed (use_avx512) and
/// FLASHINFER_CPU_BF16_DPBF16 is not "0".
bool bf16_dpbf16_gemm_available();

/// c = a[m, k] * b^T with a bf16 (row stride lda) and b bf16 [n, k] (row stride ldb), both with
/// unit k stride; any m, n, k > 0. One OpenMP team shares the column chunks of n; each chunk's
/// fp32 sums [m, w] (row stride ldc) go to epilogue(j0, w, c, ldc) while in cache. The sums are
/// oneDNN's: k summed in chunks of min(k, 512), or 1024 for k > 1024, each from +0, the chunks
/// added in order, each chunk pair by pair as vdpbf16ps does. False (nothing called) when not
/// available.
bool bf16_gemm_dpbf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                      const uint16_t* b, int64_t ldb,
                      const std::function<void(int64_t, int64_t, const float*, int64_t)>& epilogue);

/// out[i, j] = bf16(alpha * c[i, j]) for i < rows, j < w (row strides ldc, ldo) with
/// vcvtneps2bf16, the conversion oneDNN's bf16 store uses (round to nearest even, fp32 values
/// below 2^-126 flushed to +-0, NaN quieted). Only when bf16_dpbf16_gemm_available().
void bf16_store_rows_hw(const float* c, int64_t ldc, int64_t rows, int64_t w, float alpha,
                        uint16_t* out, int64_t ldo);

}  // namespace flashinfer::kernels::cpu
