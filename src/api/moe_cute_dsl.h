// Private: the CuTe-DSL NVFP4 MoE pieces shared by cute_dsl_fused_moe_nvfp4 (src/api/moe_fp4.cpp)
// and the Blackwell wrappers (src/api/moe_b12x.cpp: CuteDslMoEWrapper, b12x). Semantics and
// sources: docs/MOE.md.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "flashinfer/device.h"
#include "flashinfer/tensor.h"

namespace flashinfer::kernels {
struct TrtllmFp4MoeParams;
}  // namespace flashinfer::kernels

namespace flashinfer::moe_cute {

/// Stored row s of a gated GEMM1 weight prepared by interleave_linear_and_gate(w1, 64) holds
/// plain row src[s] (linear half first, then gate).
std::vector<int64_t> cute_gated_row_source(int64_t rows);

/// The plain row of every stored row of a CuTe-DSL / b12x weight with `rows` rows: the identity,
/// or cute_gated_row_source(rows) for a gated GEMM1 weight stored interleaved.
std::vector<int64_t> cute_row_source(int64_t rows, bool interleaved);

/// Rows of [E, m, row_bytes] bytes moved to their plain positions (src[stored] = plain).
Tensor plain_rows(const Tensor& w, int64_t E, int64_t m, int64_t row_bytes,
                  const std::vector<int64_t>& src);

/// The e4m3 codes of E matrices [m, cols] given as 128x4-swizzled bytes per expert (contiguous)
/// or through convert_sf_to_mma_layout's 6-D view; returns linear codes [E, m, cols] (uint8)
/// with stored row r moved to src[r]. Errors name `op` and `arg`.
Tensor cute_plain_scales(const Tensor& s, int64_t E, int64_t m, int64_t cols,
                         const std::vector<int64_t>& src, const char* op, const char* arg);

/// Both weights' scale codes in plain row order (cute_plain_scales): w1_weight_sf of [E, N1, H]
/// (stored row r moved to w1_rows[r]) and w2_weight_sf of [E, H, I], one code per `block`
/// values (16 for NVFP4, 32 for MXFP4). Errors name `op` and the argument.
std::pair<Tensor, Tensor> cute_plain_weight_scales(const Tensor& w1_sf, const Tensor& w2_sf,
                                                   int64_t E, int64_t N1, int64_t H, int64_t I,
                                                   int64_t block,
                                                   const std::vector<int64_t>& w1_rows,
                                                   const char* op);

/// The routed pairs of both CuTe-DSL pipelines: token_selected_experts int32 [T, K] and
/// token_final_scales [T, K] of a dtype in `scale_dtypes`, both on x's device, unit last stride,
/// sharing a row stride (the kernels walk them with one). Errors name `op` and the argument.
void check_cute_pairs(const char* op, const Tensor& x, const Tensor& ids, const Tensor& scales,
                      int64_t T, int64_t K, std::initializer_list<DType> scale_dtypes);

/// Upstream 0.7.4's validate_cute_dsl_moe_clamped_relu2_config (its texts): ClampedRelu2 (12)
/// needs a one-element fp32 clamped_relu2_limit (on `device` when given), and no other
/// activation takes one; then its w4a16 refusal; ClampedRelu2 itself is refused here (the
/// CuTe-DSL epilogue's order, the limit after w1_alpha, is not implemented).
void check_clamped_relu2(const char* op, int64_t activation_type,
                         const std::optional<Tensor>& limit, std::optional<Device> device,
                         std::string_view quant_mode);

/// validate_cute_dsl_moe_situ_config: situ_linear_beta needs situ_beta, SiTU needs Swiglu (3),
/// both betas positive and finite in fp32. Errors name `op` and the argument.
void check_situ_config(const char* op, int64_t activation_type,
                       const std::optional<double>& situ_beta,
                       const std::optional<double>& situ_linear_beta);

/// The result tensor of a CuTe-DSL / b12x MoE call: `given` checked as [T, H] of `dtype` on x's
/// device, writable, unit last stride (errors name `op` and `arg`), or a new tensor.
Tensor cute_output(const char* op, const char* arg, const std::optional<Tensor>& given, int64_t T,
                   int64_t H, DType dtype, const Tensor& x);

/// The problem fields of the FP4 MoE kernel's params that the CuTe-DSL paths and b12x share:
/// precomputed routing (int32 ids and token_final_scales, row stride routed_stride), x and its
/// row stride, `out` ([T, H], its dtype), the sizes, local experts [offset, offset + El), the
/// plain-row weights w1 / w2.
void set_moe_problem(kernels::TrtllmFp4MoeParams& p, const Tensor& x, const Tensor& ids,
                     int64_t routed_stride, const Tensor& scales, const Tensor& out,
                     int64_t num_experts, int64_t top_k, int64_t inter, int64_t num_local_experts,
                     int64_t offset, const void* w1, const void* w2);

/// The scale fields the CuTe-DSL w4a4 and w4a8 paths share: x's block scales (`x_sf_cols` per
/// row), the plain per-expert weight block scales, the per-expert alphas (GEMM1's scales both
/// halves of a gated activation), and no bf16 rounding of the routing weights or expert rows.
void set_cute_scales(kernels::TrtllmFp4MoeParams& p, const Tensor& x_sf, int64_t x_sf_cols,
                     const Tensor& w1_sf_plain, const Tensor& w2_sf_plain, const float* w1_alpha,
                     const float* w2_alpha, bool gated);

/// cute_dsl_fused_moe's w4a4 math (errors name `op`); returns [T, H] of output_dtype.
Tensor cute_dsl_impl(const char* op, const Tensor& x, const std::optional<Tensor>& x_sf,
                     const Tensor& ids, const Tensor& scales, const Tensor& w1, const Tensor& w1_sf,
                     const Tensor& w1_alpha, const std::optional<Tensor>& fc2_input_scale,
                     const Tensor& w2, const Tensor& w2_sf, const Tensor& w2_alpha,
                     int64_t num_experts, int64_t top_k, std::optional<int64_t> num_local_experts,
                     int64_t offset, DType output_dtype, const std::optional<Tensor>& moe_output,
                     int64_t activation_type, double swiglu_alpha, double swiglu_beta,
                     double swiglu_limit, const std::optional<double>& situ_beta,
                     const std::optional<double>& situ_linear_beta, std::string_view quant_mode,
                     const std::optional<Tensor>& per_token_scale);

/// Bench inputs of the NVFP4 MoE bench hooks (moe_fp4.cpp, moe_b12x.cpp): uniform random bytes
/// of `shape` (every byte is a valid pair of e2m1 codes) and positive e4m3 scale codes of values
/// in [low, high), drawn on the CPU and moved to `dev`.
Tensor rand_bytes(const Shape& shape, Device dev, uint64_t seed);
Tensor e4m3_scales(const Shape& shape, Device dev, uint64_t seed, double low, double high);

}  // namespace flashinfer::moe_cute
