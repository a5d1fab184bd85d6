// GEMM ops (FlashInfer module flashinfer.gemm). Every op computes in fp32 from exactly
// converted inputs and rounds once to the output dtype. Backend queries: see ops/backends.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "flashinfer/tensor.h"

namespace flashinfer {

/// out = a @ b (+ bias).
///   a    [m, k] bf16, row-major (stride(1) == 1).
///   b    [k, n] bf16, column-major (stride(0) == 1): pass the transpose of an [n, k] weight.
///        backend "cudnn" (the default) takes any strides of a and b, as upstream's cuDNN graph.
///   bias optional [n] bf16, added in fp32 on every backend here.
///   pdl  programmatic dependent launch; no effect on the numbers.
///   out  optional [m, n] of out_dtype (bf16, fp16, or fp32 except on "tgv" / "tinygemm" /
///        "cute-dsl" and "cublaslt" with bias, as upstream), written and returned.
///   backend "cudnn" | "cutlass" | "tgv" | "auto"; on CUDA this build runs "cudnn" and "auto"
///   through cuBLASLt (sm80+). CPU tensors run the CPU reference (OpenBLAS sgemm).
///   batch_invariant (upstream 0.7.4; also mm_mxfp8, mm_fp4, bmm_fp8): upstream's correctly
///   rounded Blackwell class, refused as upstream refuses it (api::check_batch_invariant_gemm:
///   backend "auto" only, bf16 out, K and N multiples of 8, SM100 / SM103 / SM107 on CUDA); on
///   the CPU the usual result, within the GEMM's tolerance of upstream's.
Tensor mm_bf16(const Tensor& a, const Tensor& b, std::optional<Tensor> bias = std::nullopt,
               bool pdl = false, std::optional<Tensor> out = std::nullopt,
               DType out_dtype = DType::kBFloat16, std::string_view backend = "cudnn",
               bool batch_invariant = false);

/// Batched: A [b, m, k] bf16 row-major, B [b, k, n] bf16 column-major; out [b, m, n].
/// backend "cudnn" | "cutlass" | "auto" (as for mm_bf16).
Tensor bmm_bf16(const Tensor& A, const Tensor& B, std::optional<Tensor> out = std::nullopt,
                DType out_dtype = DType::kBFloat16, std::string_view backend = "cudnn");

/// out = A_scale * B_scale * (A @ B) with fp32 accumulation.
///   A  [b, m, k] float8_e4m3fn or float8_e5m2, row-major.
///   B  [b, k, n] fp8, column-major (a transposed [b, n, k]). e5m2 x e5m2 is rejected (cuBLASLt
///      has no such kernel). On CUDA, k must be a multiple of 16 (cuBLASLt fp8 alignment).
///   A_scale, B_scale  fp32 one-element dequantization scales (x ~= x_fp8 * scale).
///   dtype  output dtype, bf16 or fp16; out optional [b, m, n] of that dtype.
///   backend "cudnn" | "cublas" | "cutlass" | "auto"; on CUDA this build runs "cublas" and "auto"
///   (cuBLASLt, sm89+).
Tensor bmm_fp8(const Tensor& A, const Tensor& B, const Tensor& A_scale, const Tensor& B_scale,
               DType dtype, std::optional<Tensor> out = std::nullopt,
               std::string_view backend = "cublas", bool batch_invariant = false);

/// FP4 GEMM: out = alpha * sum_k (q_a * sf_a) (q_b * sf_b).
///   a          [m, k/2] packed e2m1 (uint8 or float4_e2m1fn_x2), row-major.
///   b          [k/2, n] packed e2m1, column-major: pass the transpose of b_fp4 [n, k/2].
///   a_descale  scales of a: NVFP4 (use_nvfp4) e4m3 per 16, MXFP4 ue8m0 per 32; 128x4 layout
///              (8x4 with use_8x4_sf_layout) of [m, k/block], as fp4_quantize returns them (or
///              their transpose).
///   b_descale  scales of b_fp4 in the 128x4 layout of [n, k/block] (pass sf.T as upstream does).
///   alpha      optional fp32 one-element tensor (NVFP4: 1 / (gs_a * gs_b)); None means 1.
///   block_size 16 for NVFP4, 32 for MXFP4.
///   backend "cudnn" | "trtllm" | "cutlass" | "cute-dsl" | "auto"; on CUDA this build runs "auto"
///   by dequantizing to bf16 and multiplying with cuBLASLt (sm80+; no FP4 tensor cores needed).
Tensor mm_fp4(const Tensor& a, const Tensor& b, const Tensor& a_descale, const Tensor& b_descale,
              std::optional<Tensor> alpha = std::nullopt, DType out_dtype = DType::kBFloat16,
              std::optional<Tensor> out = std::nullopt, int64_t block_size = 16,
              bool use_8x4_sf_layout = false, std::string_view backend = "auto",
              bool use_nvfp4 = true, bool enable_pdl = true, bool batch_invariant = false);

}  // namespace flashinfer
