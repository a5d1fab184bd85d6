// Per-token-group 8-bit quantization (flashinfer.quantization.fp8_quantization) and bit packing
// (flashinfer.quantization.packbits).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>

#include "flashinfer/dtype.h"
#include "flashinfer/tensor.h"

namespace flashinfer {

/// Splits the last dimension of x into groups of group_size and quantizes each group with its
/// own fp32 scale: s = max(absmax(group), eps) / qmax (qmax = 448 for float8_e4m3fn, 57344 for
/// float8_e5m2, 127 for int8), rounded up to a power of two when scale_ue8m0
/// (2^ceil(log2(max(s, 1e-10)))); q = clamp(x / s, qmin, qmax) converted to dst_dtype (fp8:
/// round to nearest even; int8: truncation toward zero, a C cast, as upstream's kernels).
///   x  [..., K] fp32/fp16/bf16, contiguous, K % group_size == 0.
///   dst_dtype  float8_e4m3fn (default), float8_e5m2 or int8.
///   column_major_scales  scales of a 2-D x [T, K] as a [T, K / group_size] view with strides
///     (1, T) (each group's scales contiguous over tokens); with scale_tma_aligned the column
///     stride is T rounded up to 4. scale_ue8m0 and scale_tma_aligned need column_major_scales.
///   backend  upstream's kernel choice ("cutile", "cuda", "triton"); the answer does not change.
/// Returns (q [..., K] dst_dtype, scales fp32).
std::tuple<Tensor, Tensor> per_token_group_quant_8bit(
    const Tensor& x, int64_t group_size, double eps = 1e-10,
    std::optional<DType> dst_dtype = std::nullopt, bool column_major_scales = false,
    bool scale_tma_aligned = false, bool scale_ue8m0 = false, std::string_view backend = "cutile");

/// numpy.packbits of a flattened bool/uint8 tensor (nonzero = 1): uint8 [ceil(n / 8)], the first
/// element in the most significant bit ('big') or the least ('little'); the last byte is padded
/// with zeros.
Tensor packbits(const Tensor& x, std::string_view bitorder = "big");

/// packbits of each segment x[indptr[i] : indptr[i + 1]] on its own: returns (packed bytes,
/// new_indptr int32 [segments + 1], new_indptr[i + 1] - new_indptr[i] = ceil(len_i / 8)).
std::tuple<Tensor, Tensor> segment_packbits(const Tensor& x, const Tensor& indptr,
                                            std::string_view bitorder = "big");

}  // namespace flashinfer
