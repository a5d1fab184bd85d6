// Low-precision quantization ops: FP4 (NVFP4, MXFP4) from FlashInfer's module
// flashinfer.quantization.fp4_quantization and MXFP8 from flashinfer.quantization.fp8_quantization.
//
// Formats (bit-exact on every backend):
//  * E2M1 codes 0..15 (bit 3 = sign, magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}), two per byte with
//    element 2t in the low nibble and 2t+1 in the high nibble. Quantized FP4 data is returned as
//    uint8 [..., K/2], as upstream returns it.
//  * NVFP4: blocks of 16 along K, e4m3 block scales with an fp32 global scale gs:
//      sf = e4m3_satfinite(gs * amax / 6)          (fp32 ops, left to right)
//      q  = e2m1((x * gs) / float(sf))            (upstream's output scale: a block whose sf
//                                                    is 0 saturates, +-6, zeros +6; an all-zero
//                                                    block gives e2m1(x * 0))
//    so x ~= q * sf / gs.
//  * MXFP4: blocks of 32, ue8m0 scales, no global scale:
//      sf = ue8m0(amax / 6) rounded up to a power of two,  q = e2m1(x / 2^(sf - 127)).
//  * MXFP8: blocks of 32, sf = ue8m0(amax / 448) rounded up,  q = e4m3_satfinite(x / 2^(sf - 127)).
//  * Scale-factor layouts (uint8 per scale), for row r and scale column c of an [M, C] matrix:
//      linear: r * C + c
//      128x4:  (r/128)*T*512 + (c/4)*512 + (r%32)*16 + ((r%128)/32)*4 + c%4,  T = ceil(C/4);
//              rows padded to a multiple of 128, columns to a multiple of 4, padding zero.
//      8x4:    (r/8)*T*32 + (c/4)*32 + (r%8)*4 + c%4; rows padded to a multiple of 8.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// Upstream's SfLayout enum (flashinfer.tllm_enums.SfLayout), same member names and values.
enum class SfLayout : int { layout_128x4 = 0, layout_8x4 = 1, layout_linear = 2 };

/// "layout_128x4", "layout_8x4", "layout_linear".
std::string_view sf_layout_name(SfLayout layout);
/// Recorded as upstream's enum member: EnumValue{"SfLayout", "layout_128x4", "0"}.
Value to_value(SfLayout layout);
/// Accepts an EnumValue (by member name or value) or an int; throws flashinfer::Error otherwise.
SfLayout sf_layout_from_value(const Value& v);

/// Index of scale (row, col) in a scale buffer of `layout` whose unpadded matrix has
/// `num_sf_cols` columns (the formulas above).
int64_t sf_layout_offset(SfLayout layout, int64_t row, int64_t col, int64_t num_sf_cols);
/// Number of bytes a scale buffer of `layout` takes for an [rows, num_sf_cols] scale matrix.
int64_t sf_layout_size(SfLayout layout, int64_t rows, int64_t num_sf_cols);

/// Upstream 0.7.4's `_UNSET`, the default of the quantizers' nvfp4_4over6: the argument omitted
/// (the FLASHINFER_NVFP4_4OVER6 environment decides); recorded and shown as `_UNSET`.
Value nvfp4_4over6_unset();
bool is_nvfp4_4over6_unset(const Value& v);

/// Upstream 0.7.4's NVFP44Over6Config(e4m3_max, err_mode, err_use_fast_math) as a value for the
/// quantizers' nvfp4_4over6 (recorded as upstream's recorder keeps the object: its type and its
/// repr, which lists the fields that differ from the defaults). e4m3_max 448 or 256 (it only
/// sets upstream's global scale helper's 1 / (e4m3_max * 6); the quantizers take the global scale
/// given), err_mode "MAE" or "MSE" (any case), with upstream's errors otherwise.
Value nvfp4_4over6_config(int64_t e4m3_max = 448, std::string_view err_mode = "MAE",
                          bool err_use_fast_math = false);

/// Quantizes to FP4 with per-block scales (NVFP4 with sf_vec_size=16 and e4m3 scales, MXFP4 with
/// sf_vec_size=32 and sf_use_ue8m0=true; with ue8m0 scales the global scale is not used).
///   input         [M, K] (or [..., K]) fp16, bf16 or float8_e4m3fn; K % sf_vec_size == 0. A
///                 column-major input of any rank (stride(-2) == 1) is quantized along its rows
///                 of the transpose and both outputs are returned transposed, as upstream does.
///                 e4m3 input takes upstream's fp8 path (kernels/nvfp4_rules.h, fp8_fp4_scale:
///                 fp16(x * 6 / gs) first).
///   global_scale  fp32 [1] or [M] (per row); None means 1. Not used with ue8m0 scales, except
///                 on the e4m3 path. With is_global_scale_inversed it holds 1/gs.
/// Returns (x_q uint8 [..., K/2], sf uint8): sf is [round_up(M, 128 or 8), round_up(K/vec, 4)]
/// for the swizzled layouts (is_sf_8x4_layout picks 8x4) and [M, K/vec] for the linear one.
/// `backend`: "cuda", or "cute-dsl" for upstream's CuTe-DSL entry points' semantics
/// (nvfp4_quantize_cute_dsl / mxfp4_quantize_cute_dsl below: 2-D outputs, their zero rule;
/// is_global_scale_inversed is not passed on, as upstream). mxfp4_quantize, nvfp4_quantize and
/// mxfp8_quantize route "cute-dsl" the same way. CPU tensors run the CPU reference. Runs on
/// input's device, on the current CUDA stream.
///
/// Upstream 0.7.4's additions (docs/GEMM_AND_QUANTIZATION.md, "Batch-invariant quantizers"):
/// backend "auto" (the default; the "cuda" kernel); nvfp4_4over6 (upstream's NVFP44Over6Config:
/// omitted, nvfp4_4over6_unset(), reads FLASHINFER_NVFP4_4OVER6*, None is off, a config is on:
/// the per-block 4-or-6 scale search (docs/GEMM_AND_QUANTIZATION.md, "NVFP4 4over6") for NVFP4
/// of fp16 / bf16 on the CPU reference; refused on CUDA and with backend "cute-dsl" and
/// nvfp4_quantize's per-token form); batch_invariant (keyword-only): upstream's
/// separately specified, correctly rounded recipe, bit for bit on the CPU; on CUDA upstream
/// runs it on SM100 / SM103 / SM107 only (refused elsewhere with its text; no CUDA kernel here).
std::tuple<Tensor, Tensor> fp4_quantize(
    const Tensor& input, std::optional<Tensor> global_scale = std::nullopt,
    int64_t sf_vec_size = 16, bool sf_use_ue8m0 = false, bool is_sf_swizzled_layout = true,
    bool is_sf_8x4_layout = false, bool is_global_scale_inversed = false,
    std::optional<bool> enable_pdl = std::nullopt, std::string_view backend = "auto",
    const Value& nvfp4_4over6 = nvfp4_4over6_unset(), bool batch_invariant = false);

/// What nvfp4_quantize returns, as upstream: the pair (x_q, sf), and with per_token_activation
/// the per-row scales as a third item (recorded as upstream's 3-tuple). A C++ caller binds the
/// pair (`auto [q, sf] = nvfp4_quantize(...)`) and reads per_token_scale by name.
struct Nvfp4QuantizeResult : std::tuple<Tensor, Tensor> {
  Nvfp4QuantizeResult(Tensor x_q, Tensor sf, Tensor scale = Tensor())
      : std::tuple<Tensor, Tensor>(std::move(x_q), std::move(sf)),
        per_token_scale(std::move(scale)) {}
  Tensor per_token_scale;  // float32 [M]; defined only with per_token_activation
};
Value to_value(const Nvfp4QuantizeResult& r);

/// NVFP4 quantization: fp4_quantize with a_global_sf (a one-element tensor) and e4m3 scales in
/// `sfLayout`; do_shuffle: the trtllm-gen weight layout (CPU only). per_token_activation: row r
/// is quantized with its own scale amax_r * a_global_sf (a_global_sf the inverse base scale,
/// typically 1 / (448 * 6); a float or a one-element tensor), as nvfp4_quantize_per_token_cute_dsl
/// does, and the per-row scales come back third; 2-D fp16 / bf16 input, sf_vec_size 16.
/// expanded_idx_to_permuted_idx (a row remapping of the per-token form) is not available here
/// (kUnsupported).
/// Upstream 0.7.4: out_scale (per_token_activation with backend "cute-dsl" only: the returned
/// per-row scales times out_scale[0], one fp32 product; the codes unchanged), nvfp4_4over6 and
/// batch_invariant as fp4_quantize's (a float a_global_sf is then taken per tensor too).
Nvfp4QuantizeResult nvfp4_quantize(
    const Tensor& a, const Value& a_global_sf, SfLayout sfLayout = SfLayout::layout_128x4,
    bool do_shuffle = false, int64_t sf_vec_size = 16,
    std::optional<bool> enable_pdl = std::nullopt, std::string_view backend = "auto",
    bool per_token_activation = false,
    std::optional<Tensor> expanded_idx_to_permuted_idx = std::nullopt,
    std::optional<Tensor> out_scale = std::nullopt,
    const Value& nvfp4_4over6 = nvfp4_4over6_unset(), bool batch_invariant = false);

/// MXFP4 quantization: blocks of 32, ue8m0 scales in `sfLayout`.
/// Returns (uint8 [M, K/2], uint8 sf): sf is [round_up(M, 128), round_up(K/32, 4)] for the default
/// 128x4 layout, [round_up(M, 8), round_up(K/32, 4)] for 8x4 and [M, K/32] for linear.
/// batch_invariant (upstream 0.7.4, keyword-only): as fp4_quantize's.
std::tuple<Tensor, Tensor> mxfp4_quantize(const Tensor& a, std::string_view backend = "auto",
                                          std::optional<bool> enable_pdl = std::nullopt,
                                          SfLayout sfLayout = SfLayout::layout_128x4,
                                          bool batch_invariant = false);

/// MXFP4 dequantization on the host: a_fp4 uint8 [M, K/2], a_sf ue8m0 scales in `sfLayout` (any
/// shape with exactly sf_layout_size(sfLayout, M, K/32) elements). Returns fp32 [M, K] on the CPU
/// (inputs on a GPU are copied to the host, as upstream does): e2m1_and_ufp8sf_scale_to_float with
/// ufp8_type 0, as upstream calls it.
Tensor mxfp4_dequantize(const Tensor& a_fp4, const Tensor& a_sf,
                        SfLayout sfLayout = SfLayout::layout_128x4);

/// Dequantizes packed E2M1 with uint8 block scales as upstream's host function
/// (E2M1AndUFP8SFScaleToFloatV2): out = e2m1 * (sf * global_scale_tensor) in fp32. ufp8_type 1 =
/// e4m3 scales (the global scale required), 0 = ue8m0 scales decoded as the float of exponent
/// bits sf (0 -> +0, 255 -> +inf; the global scale ignored). sf_vec_size: any divisor of K.
/// is_sf_swizzled_layout picks a swizzled layout (else linear): 8x4 with is_sf_8x4_layout, else
/// 128x4. Returns fp32 [M, K] on the CPU.
Tensor e2m1_and_ufp8sf_scale_to_float(const Tensor& e2m1_tensor, const Tensor& ufp8_scale_tensor,
                                      std::optional<Tensor> global_scale_tensor = std::nullopt,
                                      int64_t sf_vec_size = 16, int64_t ufp8_type = 1,
                                      bool is_sf_swizzled_layout = true,
                                      bool is_sf_8x4_layout = false);

/// Swizzles a linear scale matrix [M, C] (or [E, M, C]) of uint8 or bf16 into the 128x4 layout:
/// returns a 1-D tensor of E * round_up(M, 128) * round_up(C, 4) elements of the input dtype,
/// padding zero. `out` (upstream 0.7.4): that tensor, given (contiguous, 1-D of that size, the
/// input's dtype and device), filled and returned.
Tensor block_scale_interleave(const Tensor& unswizzled_sf,
                              std::optional<Tensor> out = std::nullopt);

/// MXFP8 quantization (flashinfer.quantization.fp8_quantization): blocks of 32, ue8m0 scales.
///   input [M, K] (or [..., K]) fp16 or bf16; K % 32 == 0; alignment must be 32.
///   sf_swizzle_layout overrides is_sf_swizzled_layout (128x4 when true, else linear) when set;
///   8x4 is CUDA-only (upstream's host kernel rejects it too).
/// Returns (x_fp8 [..., K] float8_e4m3fn, sf uint8 1-D of sf_layout_size elements), the same
/// dtypes on the CPU and on CUDA (upstream's documented ones; its host path gives uint8 bytes).
/// batch_invariant (upstream 0.7.4, keyword-only): as fp4_quantize's (fp32 input taken too).
std::tuple<Tensor, Tensor> mxfp8_quantize(const Tensor& input, bool is_sf_swizzled_layout = true,
                                          int64_t alignment = 32,
                                          std::optional<bool> enable_pdl = std::nullopt,
                                          std::string_view backend = "auto",
                                          std::optional<SfLayout> sf_swizzle_layout = std::nullopt,
                                          bool batch_invariant = false);

/// MXFP8 dequantization on the host: input [M, K] float8_e4m3fn (or uint8 holding the same bits,
/// as upstream's host quantizer returns them), scale_tensor ue8m0 in 128x4 or linear layout (any
/// shape with the right element count). Returns fp32 [M, K] on the CPU:
/// out = e4m3(q) * float(sf << 23) (2^(sf - 127); code 0 is +0 and 255 +inf, as upstream's).
Tensor mxfp8_dequantize_host(const Tensor& input, const Tensor& scale_tensor,
                             bool is_sf_swizzled_layout = true,
                             std::optional<SfLayout> sf_swizzle_layout = std::nullopt);

// ---- The CuTe-DSL entry points (flashinfer.quantization.kernels.*; upstream's SM100 kernels) ----
// Each flattens the leading dims to M rows (outputs 2-D), takes sf_layout as an int (0 = 128x4,
// 1 = 8x4, 2 = linear) and has upstream's zero rule: a block whose decoded scale is 0 (e4m3
// rounding to 0; ue8m0 code 0) gets e2m1(x * 0), signed zeros. Otherwise the arithmetic is the
// one above. Run on the CPU and on CUDA (any arch here; upstream's need SM100-class ptxas).
// docs/GEMM_AND_QUANTIZATION.md, "CuTe-DSL quantizers".

/// MXFP4 of fp16 / bf16 input [..., K], K % 32 == 0. Returns (uint8 [M, K/2], uint8 sf [M, K/32]
/// linear or [round_up(M, 128 or 8), round_up(K/32, 4)] swizzled).
std::tuple<Tensor, Tensor> mxfp4_quantize_cute_dsl(const Tensor& input, int64_t sf_layout = 0,
                                                   std::optional<bool> enable_pdl = std::nullopt);

/// MXFP8 of fp16 / bf16 / fp32 input [..., K], K % 32 == 0, padded with zero columns to
/// round_up(K, alignment) (alignment a multiple of 32). Returns (float8_e4m3fn [M, padded_K],
/// uint8 sf 1-D: 128x4, or 8x4 with is_sf_8x4_layout, or linear when not swizzled).
std::tuple<Tensor, Tensor> mxfp8_quantize_cute_dsl(const Tensor& input,
                                                   bool is_sf_swizzled_layout = true,
                                                   int64_t alignment = 32,
                                                   std::optional<bool> enable_pdl = std::nullopt,
                                                   bool is_sf_8x4_layout = false);

/// NVFP4 of fp16 / bf16 input [..., K], K % 16 == 0, with the encode scale global_scale (a float
/// or a one-element tensor). Returns (uint8 [M, K/2], uint8 e4m3 sf, shaped as MXFP4's with
/// K/16 columns). float8_e4m3fn input, which upstream takes, is refused (not implemented).
std::tuple<Tensor, Tensor> nvfp4_quantize_cute_dsl(const Tensor& input, const Value& global_scale,
                                                   int64_t sf_layout = 0,
                                                   std::optional<bool> enable_pdl = std::nullopt);

/// Per-token NVFP4 of a 2-D fp16 / bf16 input [M, K]: row r's scale is amax_r * global_scale_inv
/// (a float or a one-element tensor; 0 for a zero row) and its blocks are NVFP4 with the encode
/// scale 1 / that (FLT_MAX for a zero row). Returns (uint8 [M, K/2], uint8 e4m3 sf,
/// float32 per_token_scale [M]): x ~= e2m1 * sf * per_token_scale.
std::tuple<Tensor, Tensor, Tensor> nvfp4_quantize_per_token_cute_dsl(
    const Tensor& input, const Value& global_scale_inv, int64_t sf_layout = 0,
    std::optional<bool> enable_pdl = std::nullopt);

}  // namespace flashinfer

// Nvfp4QuantizeResult binds as its pair.
template <>
struct std::tuple_size<flashinfer::Nvfp4QuantizeResult> : std::integral_constant<std::size_t, 2> {};
template <std::size_t I>
struct std::tuple_element<I, flashinfer::Nvfp4QuantizeResult> {
  using type = flashinfer::Tensor;
};
