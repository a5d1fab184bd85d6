// Grouped GEMMs of Mixture-of-Experts layers: flashinfer.grouped_mm.core (grouped_mm_bf16,
// grouped_mm_fp8, grouped_mm_mxfp8, grouped_mm_fp4), flashinfer.gemm.gemm_base
// (SegmentGEMMWrapper) and flashinfer.gemm.kernels.grouped_gemm_masked_wrapper
// (grouped_gemm_nt_masked). Every op dequantizes its operands exactly to fp32 (element times its
// block scales), sums the products in fp32 and rounds once to the output dtype. The semantics,
// with their sources, are in docs/MOE.md ("Grouped GEMMs").
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include "flashinfer/op_decl.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// out[m_indptr[e] : m_indptr[e+1]] = a[m_indptr[e] : m_indptr[e+1]] @ b[e]^T for each expert e.
///   a  [cum_m, k] bf16;  b  [E, n, k] bf16;  m_indptr  [E + 1] int32, non-decreasing, from
///   >= 0 up to <= cum_m (rows outside every group are left as they are; a new out is zeroed).
///   out  optional [cum_m, n] (its dtype wins); out_dtype bf16, fp16 or fp32.
///   backend "cudnn" (upstream's only one); tactic: upstream's autotuner choice (no effect).
///   CUDA: a grouped kernel of this build (fp32 accumulation), m_indptr read on the device.
Tensor grouped_mm_bf16(const Tensor& a, const Tensor& b, const Tensor& m_indptr,
                       std::optional<Tensor> out = std::nullopt, DType out_dtype = DType::kBFloat16,
                       std::string_view backend = "cudnn", int64_t tactic = -1);

/// grouped_mm_bf16 with fp8 (e4m3/e5m2) operands and an optional fp32 alpha of shape (1,)
/// multiplying the fp32 sums. CPU reference only in this build.
Tensor grouped_mm_fp8(const Tensor& a, const Tensor& b, const Tensor& m_indptr,
                      std::optional<Tensor> alpha = std::nullopt,
                      std::optional<Tensor> out = std::nullopt, DType out_dtype = DType::kBFloat16,
                      std::string_view backend = "cudnn", int64_t tactic = -1);

/// MXFP8 grouped GEMM: fp8 a [cum_m, k], b [E, n, k]; ue8m0 (uint8) block scales, one per 32 k:
/// a_descale [cum_m, k/32] in the 128x4 swizzled layout of the whole [cum_m, k/32] matrix,
/// b_descale [E, n, k/32], each expert's [n, k/32] swizzled 128x4 (as mxfp8_quantize with
/// is_sf_swizzled_layout=True returns them). This build requires cum_m and n multiples of 128 and
/// k/32 a multiple of 4 (the swizzled layouts then fill the documented shapes exactly).
/// CPU reference only in this build.
Tensor grouped_mm_mxfp8(const Tensor& a, const Tensor& b, const Tensor& a_descale,
                        const Tensor& b_descale, const Tensor& m_indptr,
                        std::optional<Tensor> out = std::nullopt,
                        DType out_dtype = DType::kBFloat16, std::string_view backend = "cudnn",
                        int64_t tactic = -1);

/// FP4 grouped GEMM: packed e2m1 a [cum_m, k/2], b [E, n, k/2] (uint8 or float4_e2m1fn_x2);
/// block_size 16 (NVFP4: e4m3 scales) or 32 (MXFP4: ue8m0 uint8 scales), laid out as
/// grouped_mm_mxfp8's; alpha optional fp32 (1,). CPU reference only in this build.
Tensor grouped_mm_fp4(const Tensor& a, const Tensor& b, const Tensor& a_descale,
                      const Tensor& b_descale, const Tensor& m_indptr,
                      std::optional<Tensor> alpha = std::nullopt,
                      std::optional<Tensor> out = std::nullopt, DType out_dtype = DType::kBFloat16,
                      int64_t block_size = 16, std::string_view backend = "cudnn",
                      int64_t tactic = -1);

/// Grouped FP8 GEMM with fp32 groupwise scales: out[rows of e] = A_deq[rows of e] @ B_deq[e]^T,
/// x_deq = x * scale of its (row / g, k / gk) block; (gm, gn, gk) = scale_granularity_mnk.
///   a [cum_m, k], b [B, n, k] float8_e4m3fn/e5m2; m_indptr [B + 1] int32, entries multiples of
///   4 (upstream's kernel rule); n % 8 == 0, k % 16 == 0 and k % gk == 0.
///   scale_major_mode "K": a_scale [ceil(cum_m/gm), k/gk], b_scale [B, ceil(n/gn), k/gk];
///                    "MN": a_scale [k/gk, ceil(cum_m/gm)], b_scale [B, k/gk, ceil(n/gn)].
///   out [cum_m, n] bf16/fp16 (out_dtype must match a given out); mma_sm 1 or 2 (tiling only).
///   backend "trtllm" (default) or "cutlass": the same math here. CPU reference only.
///   segment_alignment (upstream 0.7.4): >= 1, a kernel-choice promise of its cutile backend;
///   no effect here.
Tensor group_gemm_fp8_nt_groupwise(
    const Tensor& a, const Tensor& b, const Tensor& a_scale, const Tensor& b_scale,
    const Tensor& m_indptr,
    std::tuple<int64_t, int64_t, int64_t> scale_granularity_mnk = {1, 128, 128},
    std::string_view scale_major_mode = "MN", int64_t mma_sm = 1,
    std::optional<Tensor> out = std::nullopt, std::optional<DType> out_dtype = std::nullopt,
    std::string_view backend = "trtllm", int64_t segment_alignment = 1);

/// Grouped MXFP8 x MXFP4 GEMM: a [cum_m, k] fp8 (e4m3/e5m2), b [B, n, k/2] packed e2m1 (uint8),
/// ue8m0 scales per 32 k: a_scale [cum_m_padded, k/32] uint8 holding each group's rows padded to
/// 128 and swizzled 128x4 on their own, the groups' blocks concatenated (cum_m_padded = sum of
/// round_up(m_e, 128)); b_scale [B, round_up(n, 128), k/32] uint8, each expert swizzled.
/// m_indptr entries multiples of 4; n % 8 == 0; k % 128 == 0; tile_m 128, tile_n 64/128/192/256,
/// tile_k 128/256, mma_sm 1/2, swap_ab (tiling only). out [cum_m, n] bf16/fp16. CPU reference.
Tensor group_gemm_mxfp8_mxfp4_nt_groupwise(const Tensor& a, const Tensor& b, const Tensor& a_scale,
                                           const Tensor& b_scale, const Tensor& m_indptr,
                                           int64_t mma_sm = 1, int64_t tile_m = 128,
                                           int64_t tile_n = 128, int64_t tile_k = 128,
                                           bool swap_ab = true,
                                           std::optional<Tensor> out = std::nullopt,
                                           std::optional<DType> out_dtype = std::nullopt);

/// Grouped NVFP4 GEMM: a [cum_m, k/2], b [B, n, k/2] packed e2m1 (uint8); e4m3 scales per 16 k
/// laid out as group_gemm_mxfp8_mxfp4_nt_groupwise's (a_scale [cum_m_padded, k/16], b_scale
/// [B, round_up(n, 128), k/16], float8_e4m3fn or uint8 codes); alpha optional [B] fp32, one per
/// group, multiplying the fp32 sums. Tiles and swap_ab: no numeric effect. CPU reference only.
Tensor group_gemm_nvfp4_nt_groupwise(const Tensor& a, const Tensor& b, const Tensor& a_scale,
                                     const Tensor& b_scale, const Tensor& m_indptr,
                                     std::optional<Tensor> alpha = std::nullopt,
                                     int64_t tile_m = 128, int64_t tile_n = 128,
                                     int64_t tile_k = 128, bool swap_ab = true,
                                     std::optional<Tensor> out = std::nullopt,
                                     std::optional<DType> out_dtype = std::nullopt);

/// SM120 zero-padding MoE GEMM, FP8 with fp32 scales (flashinfer.grouped_mm.
/// cute_sm120_fp8_groupwise.core): out[rows of e] = A_deq @ B_deq[e]^T, a [cum_m, k] and b
/// [E, n, k] float8_e4m3fn; m_indptr [E + 1] int32 from 0 to cum_m. a_scale fp32 [ceil(k/128),
/// m_padded], m_padded = (cum_m + 3E) / 4 * 4, expert e's rows at columns from
/// (m_indptr[e] + 3e) / 4 * 4 (per-token, padding columns ignored); b_scale fp32 [E, ceil(k/128),
/// ceil(n/128)]. scale_granularity_mnk (1, 128, 128), scale_major_mode "MN", backend "cute" only;
/// out [cum_m, n (n/2 with is_gated)] bf16. is_gated: b's rows [0, n/2) are up, [n/2, n) gate,
/// out = SiLU(gate) * up (fp32, one rounding). CPU reference only.
Tensor moe_gemm_fp8_nt_groupwise(
    const Tensor& a, const Tensor& b, const Tensor& a_scale, const Tensor& b_scale,
    const Tensor& m_indptr,
    std::tuple<int64_t, int64_t, int64_t> scale_granularity_mnk = {1, 128, 128},
    std::string_view scale_major_mode = "MN", std::string_view backend = "cute",
    std::optional<Tensor> out = std::nullopt, std::optional<DType> out_dtype = std::nullopt,
    bool is_gated = false);

/// The MXFP8 variant (flashinfer.grouped_mm.cute_sm120_mxfp8_groupwise.core): per-token UE8M0
/// scales, 4 per int32 (little-endian bytes, one per k_gran block of k): a_scale int32
/// [m_padded, k_align] with the zero-padding row layout above, b_scale int32 [E, n, k_align],
/// k_align = (k + 4 k_gran - 1) / (4 k_gran); scale_granularity_mnk (1, 1, 32) or (1, 1, 128).
/// is_gated as moe_gemm_fp8_nt_groupwise (unverified for this variant). CPU reference only.
Tensor moe_gemm_mxfp8_nt_groupwise(
    const Tensor& a, const Tensor& b, const Tensor& a_scale, const Tensor& b_scale,
    const Tensor& m_indptr,
    std::tuple<int64_t, int64_t, int64_t> scale_granularity_mnk = {1, 1, 128},
    std::string_view scale_major_mode = "MN", std::string_view backend = "cute",
    std::optional<Tensor> out = std::nullopt, std::optional<DType> out_dtype = std::nullopt,
    bool is_gated = false);

/// DeepGEMM's contiguous grouped FP8 GEMM: row i of a goes to expert m_indices[i] (-1: a padding
/// row, not computed and not written). a [m, k] e4m3, a_scale [m, k/128] fp32 (per token, 1x128),
/// b [B, n, k] e4m3, b_scale [B, n/128, k/128] fp32 (128x128); scale_granularity_mnk (1, 128,
/// 128). Each scale counts as its power of two rounded down (UE8M0, as upstream's SM100 DeepGEMM
/// reads fp32 scales). out [m, n] bf16 only (new: zero-filled). CPU reference only.
Tensor group_deepgemm_fp8_nt_groupwise(
    const Tensor& a, const Tensor& b, const Tensor& a_scale, const Tensor& b_scale,
    const Tensor& m_indices,
    std::tuple<int64_t, int64_t, int64_t> scale_granularity_mnk = {1, 128, 128},
    std::optional<Tensor> out = std::nullopt, std::optional<DType> out_dtype = std::nullopt);

/// DeepGEMM's masked batched FP8 GEMM: out[i, :masked_m[i]] = a[i, :masked_m[i]] @ b[i]^T with
/// the scales of group_deepgemm_fp8_nt_groupwise per batch (a_scale [B, m, k/128], b_scale
/// [B, n/128, k/128]); rows past masked_m[i] are not written (a new out is zero-filled).
/// expected_m: a performance hint. CPU reference only.
Tensor batch_deepgemm_fp8_nt_groupwise(
    const Tensor& a, const Tensor& b, const Tensor& a_scale, const Tensor& b_scale,
    const Tensor& masked_m, int64_t expected_m,
    std::tuple<int64_t, int64_t, int64_t> scale_granularity_mnk = {1, 128, 128},
    std::optional<Tensor> out = std::nullopt, std::optional<DType> out_dtype = std::nullopt);

/// Segment GEMM (LoRA-style): y[seg i] = x[seg i] @ W[weight_indices[i] or i], W [d_in, d_out]
/// (weight_column_major false) or [d_out, d_in] (true, y = x @ W^T). CPU reference only.
/// seg_lens go through x's dtype first, as upstream's `seg_lens.to(x)` (bf16: 257 rows -> 256).
class SegmentGEMMWrapper : public ApiObject {
 public:
  /// float_workspace_buffer: upstream's CUTLASS scratch (kept, not used by the CPU reference).
  /// backend "auto", "sm80" or "sm90".
  explicit SegmentGEMMWrapper(Tensor float_workspace_buffer, std::string backend = "auto");
  SegmentGEMMWrapper(const SegmentGEMMWrapper&) = delete;
  SegmentGEMMWrapper& operator=(const SegmentGEMMWrapper&) = delete;

  /// x [cum, d_in] fp16/bf16 (fp8: bf16 output); weights 3-D as above, x's dtype; batch_size
  /// segments given by seg_indptr [batch_size + 1] or seg_lens [batch_size] (int64; seg_indptr
  /// wins); weight_indices [batch_size] int64. out optional [cum, d_out]; a new out is zeroed,
  /// and rows outside every segment stay as they are.
  Tensor run(const Tensor& x, const Tensor& weights, int64_t batch_size, bool weight_column_major,
             std::optional<Tensor> out = std::nullopt,
             std::optional<Tensor> seg_lens = std::nullopt,
             std::optional<Tensor> seg_indptr = std::nullopt,
             std::optional<Tensor> weight_indices = std::nullopt);

  std::string_view class_name() const override { return "SegmentGEMMWrapper"; }
  std::string_view module_name() const override { return "flashinfer.gemm.gemm_base"; }
  const Tensor& float_workspace_buffer() const { return workspace_; }
  const std::string& backend() const { return backend_; }

 private:
  Tensor workspace_;
  std::string backend_;
};

/// The keywords grouped_gemm_nt_masked takes through **kwargs.
struct GroupedGemmNtMaskedKwargs {
  std::tuple<int64_t, int64_t> mma_tiler_mn = {128, 128};  // tiling: no effect on numbers
  std::tuple<int64_t, int64_t> cluster_shape_mn = {1, 1};  // tiling: no effect on numbers
  std::optional<Tensor> alpha;                             // [l] (any shape of l) fp32
  std::optional<std::string> alpha_dtype;                  // "float32" when alpha is given
};
FLASHINFER_OPTION_FIELDS(GroupedGemmNtMaskedKwargs, mma_tiler_mn, cluster_shape_mn, alpha,
                         alpha_dtype);

/// Masked batched block-scaled GEMM (CuTe-DSL on Blackwell upstream): for each batch g < l and
/// row i < masked_m[g]: out[i, :, g] = alpha[g] * sum_k A_deq[i, k, g] * B_deq[:, k, g].
///   lhs = (A, SFA): A logical (m, k, l) (fp4: uint8 (m, k/2, l)), SFA logical
///     (32, 4, rm, 4, rk, l), the 128x4 swizzled scales (rm = ceil(m/128), rk = ceil(k/sf/4)).
///   rhs = (B, SFB): B (n, k, l) (fp4: (n, k/2, l)), SFB (32, 4, rn, 4, rk, l).
///   out (m, n, l) of c_dtype, written in place for rows < masked_m[g] only.
///   masked_m [l] int32 in [0, m].
///   ab_dtype "float4_e2m1fn" | "float8_e4m3fn" | "float8_e5m2"; sf_dtype "float8_e8m0fnu"
///   (uint8 tensors) | "float8_e4m3fn"; c_dtype "float16" | "bfloat16" | "float32" |
///   "float8_e4m3fn" | "float8_e5m2"; sf_vec_size 16 or 32.
/// The combine-fusion and multi-rank arguments are refused (kUnsupported) by the CPU reference;
/// sm_count only sizes upstream's grid. Returns out (as upstream). CPU reference only in this
/// build.
Tensor grouped_gemm_nt_masked(std::tuple<Tensor, Tensor> lhs, std::tuple<Tensor, Tensor> rhs,
                              const Tensor& out, const Tensor& masked_m, std::string_view ab_dtype,
                              std::string_view sf_dtype, std::string_view c_dtype,
                              int64_t sf_vec_size,
                              std::optional<Tensor> topk_weights = std::nullopt,
                              std::optional<Tensor> idx_src_info = std::nullopt,
                              std::optional<Tensor> rank_src_info = std::nullopt,
                              std::optional<Tensor> out_ptrs = std::nullopt, int64_t num_ranks = 0,
                              std::optional<Tensor> dst_signals = std::nullopt,
                              std::optional<int64_t> sm_count = std::nullopt,
                              std::optional<Tensor> barrier_flag_local = std::nullopt,
                              std::optional<Tensor> barrier_flag_multicast = std::nullopt,
                              bool is_combine_fusion = false, bool is_swap_ab = false,
                              GroupedGemmNtMaskedKwargs kwargs = {});

}  // namespace flashinfer
