// Block-scaled and low-latency FP8 GEMMs (FlashInfer module flashinfer.gemm.gemm_base, and
// flashinfer.trtllm_low_latency_gemm for the weight preparation). Every op computes in fp32 from
// exactly decoded inputs and rounds once to the output dtype. The scale semantics (where each
// scale multiplies) are spelled out in docs/GEMM_AND_QUANTIZATION.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>

#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// FP8 GEMM with scale factors per block, DeepSeek style:
///   out[i, j] = sum over K blocks kb of
///               a_scale[i / gm, kb] * b_scale[j / gn, kb] * sum_{k in kb} a[i, k] * b[j, k]
/// with (gm, gn, gk) = scale_granularity_mnk; each K block's partial sum is accumulated in fp32
/// and then multiplied by the product of its two scales (fp32).
///   a  [m, k] float8_e4m3fn or float8_e5m2, row-major.
///   b  [n, k] fp8, row-major (the "nt" GEMM: b is the weight as stored).
///   a_scale, b_scale  fp32 dequantization scales (x ~= x_fp8 * scale), any strides:
///       scale_major_mode "K":  a_scale [m/gm, k/gk], b_scale [n/gn, k/gk];
///       scale_major_mode "MN": a_scale [k/gk, m/gm], b_scale [k/gk, n/gn];
///       (m/gm and n/gn rounded up; k must be a multiple of gk.)
///     backend "cutlass" requires scale_major_mode; backend "trtllm" takes gm = 1 and
///     (gn, gk) = (128, 128) with a_scale [k/128, m] and b_scale [n/128, k/128] (upstream's test
///     passes the "MN" b_scale transposed), scale_major_mode None or "MN".
///   mma_sm  1 or 2 (a CUTLASS tiling choice: no effect on the numbers).
///   out  optional [m, n] bf16/fp16; out_dtype (default bf16) when out is None.
///   backend "cutlass" | "trtllm"; CUDA (sm80+) runs a tiled kernel of this build for either.
Tensor gemm_fp8_nt_groupwise(
    const Tensor& a, const Tensor& b, const Tensor& a_scale, const Tensor& b_scale,
    std::optional<std::string_view> scale_major_mode = std::nullopt, int64_t mma_sm = 1,
    std::tuple<int64_t, int64_t, int64_t> scale_granularity_mnk = {1, 128, 128},
    std::optional<Tensor> out = std::nullopt, std::optional<DType> out_dtype = std::nullopt,
    std::string_view backend = "cutlass");

/// gemm_fp8_nt_groupwise with scale_granularity_mnk = (128, 128, 128) (128x128 blocks of both
/// operands), backend "cutlass". scale_major_mode defaults to "MN".
Tensor gemm_fp8_nt_blockscaled(const Tensor& a, const Tensor& b, const Tensor& a_scale,
                               const Tensor& b_scale,
                               std::optional<std::string_view> scale_major_mode = "MN",
                               int64_t mma_sm = 1, std::optional<Tensor> out = std::nullopt,
                               std::optional<DType> out_dtype = std::nullopt);

/// out = alpha * a @ w^T for a pre-processed weight (TRT-LLM's low-latency GEMM).
///   a      [m, k] float8_e4m3fn, row-major.
///   b      [k/128, n, 128] float8_e4m3fn, contiguous: prepare_low_latency_gemm_weights(w) of a
///          weight w [n, k] (rows shuffled in blocks of 32, then cut into 128-wide K blocks).
///          Output column j is w's row j: the shuffle is undone.
///   alpha  optional one-element fp32 (a_scale * b_scale); None means 1.
///   out_dtype / out  bf16 only (upstream's supported output dtype), [m, n].
///   backend "trtllm_low_latency".
Tensor mm_fp8(const Tensor& a, const Tensor& b, std::optional<Tensor> alpha = std::nullopt,
              DType out_dtype = DType::kBFloat16, std::optional<Tensor> out = std::nullopt,
              std::string_view backend = "trtllm_low_latency");

/// The weight layout mm_fp8 reads: w [n, k] float8_e4m3fn (n a multiple of 32, k of 128) ->
/// [k/128, n, 128], where row r of each 32-row block of w goes to row (r % 4) * 8 + r / 4 of that
/// block (TRT-LLM's shuffle for a 128-row epilogue tile), then row i, K block kb is stored at
/// [kb, i, :]. permutation_indices_cache is upstream's Python dict of cached indices; the
/// permutation is closed-form here, so the value is taken as given and not used.
Tensor prepare_low_latency_gemm_weights(const Tensor& w, Value permutation_indices_cache);

/// DeepSeek-style FP8 block-scale GEMM of TRT-LLM (SM90 upstream): out = input @ weight^T.
///   input  [m, k] float8_e4m3fn with input_scale [m, k/128] fp32 (1x128 blocks), or bf16
///          (quantized here per 1x128 block as upstream's kernel does: amax over the block,
///          quant scale 448/amax (1 when amax == 0), e4m3 with saturation, dequant scale
///          1/quant scale).
///   weight [n, k] float8_e4m3fn with weight_scale [n, k/128] (1x128) or [ceil(n/128), k/128]
///          (128x128). A bf16 weight (upstream: quantized internally) is kUnsupported here.
///   k a multiple of 128, n of 64. out / out_dtype bf16 or fp16 (default bf16).
Tensor fp8_blockscale_gemm_sm90(const Tensor& input, const Tensor& weight,
                                std::optional<Tensor> input_scale = std::nullopt,
                                std::optional<Tensor> weight_scale = std::nullopt,
                                std::optional<Tensor> out = std::nullopt,
                                std::optional<DType> out_dtype = std::nullopt);

/// MXFP8 GEMM: out = sum_k (a[i, k] * 2^(sa[i, k/32] - 127)) * (b[k, j] * 2^(sb[j, k/32] - 127))
/// with fp32 accumulation (both operands dequantized exactly, then multiplied, as cuDNN's graph).
///   a  [m, k] float8_e4m3fn, row-major; b [k, n] float8_e4m3fn, column-major (pass w_mx.t()).
///   a_descale  uint8 UE8M0, one per 32 k: 1-D swizzled (128x4, or 8x4 with use_8x4_sf_layout)
///              as mxfp8_quantize returns it, or 2-D linear [m, k/32].
///   b_descale  uint8: 1-D 128x4-swizzled scales of w [n, k], or 2-D linear [k/32, n].
///   n >= 128, k >= 128 and k % 32 == 0 (upstream's checks). out / out_dtype bf16 or fp16.
///   backend "cutlass" | "cute-dsl" | "trtllm" | "cudnn" | "auto"; on CUDA this build runs "auto"
///   with its tiled kernel (sm80+). backend "trtllm" (the CPU reference here; Blackwell-only
///   upstream) takes trtllm-gen's weight: b = shuffle_matrix_a(w_mx, 128).t(), b_descale =
///   shuffle_matrix_sf_a(w's linear [n, k/32] scales, 128) flattened, both scales 1-D, n a
///   multiple of 32, k of 256, bf16 out (upstream's rules).
Tensor mm_mxfp8(const Tensor& a, const Tensor& b, const Tensor& a_descale, const Tensor& b_descale,
                std::optional<Tensor> out = std::nullopt, DType out_dtype = DType::kBFloat16,
                bool use_8x4_sf_layout = false, std::string_view backend = "auto",
                bool batch_invariant = false);

/// Batched MXFP8 GEMM: A [b, m, k] fp8 (e4m3 or e5m2) row-major, B [b, k, n] fp8 column-major,
/// A_scale / B_scale 1-D uint8 128x4-swizzled UE8M0 scales of each batch item's [m, k/32] /
/// [n, k/32], one padded buffer per item back to back (b * round_up(rows, 128) *
/// round_up(k/32, 4) bytes). dtype bf16 or fp16; n, k >= 128. backend "cudnn" | "cutlass" |
/// "auto"; on CUDA this build runs "auto".
Tensor bmm_mxfp8(const Tensor& A, const Tensor& B, const Tensor& A_scale, const Tensor& B_scale,
                 DType dtype, std::optional<Tensor> out = std::nullopt,
                 std::string_view backend = "auto");

/// TGV GEMM (upstream: SM100/103 only): out = a @ b + bias with fp32 accumulation, the bias
/// added in fp32 before the one rounding. a [M, K] row-major, b [K, N] column-major, bias [N] or
/// None (upstream passes None on to its optional bias), all bf16 or all fp16; out optional
/// [M, N] of a's dtype. pdl: no effect on the numbers.
Tensor tgv_gemm_sm100(const Tensor& a, const Tensor& b, std::optional<Tensor> bias,
                      bool pdl = false, std::optional<Tensor> out = std::nullopt);

// ---- flashinfer.gemm.routergemm: fixed-shape bf16 router GEMMs (out is written, None returned) --

/// out = mat_a @ mat_b, fp32 accumulation. mat_a [M, K] bf16 row-major (stride(1) == 1) with
/// 1 <= M <= 16, mat_b [K, N] bf16 column-major (stride(0) == 1), out [M, N] row-major:
///   mm_M1_16_K7168_N128: K = 7168, N = 128, out bf16 (Mistral Large 3's router);
///   mm_M1_16_K7168_N256: K = 7168, N = 256, out fp32 (DeepSeek-V3's router);
///   mm_M1_16_K6144_N256: K = 6144, N = 256, out fp32 (GLM-MoE-DSA's router).
/// launch_with_pdl: programmatic dependent launch on CUDA; no effect on the numbers.
void mm_M1_16_K7168_N128(const Tensor& mat_a, const Tensor& mat_b, const Tensor& out,
                         bool launch_with_pdl = true);
void mm_M1_16_K7168_N256(const Tensor& mat_a, const Tensor& mat_b, const Tensor& out,
                         bool launch_with_pdl = true);
void mm_M1_16_K6144_N256(const Tensor& mat_a, const Tensor& mat_b, const Tensor& out,
                         bool launch_with_pdl = true);

/// out = input @ weight^T + bias (F.linear), fp32 accumulation, the bias added in fp32 before
/// the one rounding to bf16. input [M, K], weight [N, K] (N a multiple of 16), out [M, N], bias
/// optional [N]: all bf16 and contiguous.
void tinygemm_bf16(const Tensor& input, const Tensor& weight, const Tensor& out,
                   std::optional<Tensor> bias = std::nullopt, bool use_pdl = false);

}  // namespace flashinfer
