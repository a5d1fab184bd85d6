// flashinfer.comm.quantized_allreduce: quantized_all_reduce, the two-shot all-reduce that moves
// FP8 with one fp32 scale per group of elements instead of bf16 (docs/COMM.md, "Quantized
// all-reduce"). The ranks meet through a comm::CommBackend (flashinfer/comm.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "flashinfer/comm.h"
#include "flashinfer/tensor.h"

namespace flashinfer {

/// flashinfer.comm.quantized_allreduce.SCALE_GROUP_DEFAULT.
inline constexpr int64_t kQuantizedAllReduceScaleGroupDefault = 256;

/// Collective: every rank of `group` calls it with its own bf16 input of the same shape
/// (contiguous, numel a multiple of 8) on the group's device. Upstream's arithmetic, which
/// depends on the rank: every rank quantizes its input per scale_group elements to e4m3 (scale
/// max|x| / 448, floored at 1e-12 / 448); element i belongs to rank (i / block_size) % W, which
/// sums the ranks' quantized values in rank order (fp32, one rounding a step), keeps that sum
/// (rounded to bf16) and requantizes it per group for the others, who receive the requantized
/// values. Defaults from numel: block_size 4096 (16384 above 32 Mi elements), max_num_blocks
/// 24 / 48 / 132; scale_group and block_size are clamped to numel, then block_size to at least
/// scale_group, and must divide as upstream says. Both must be powers of two (upstream's
/// Triton kernel cannot compile others), at most 16 ranks. num_warps, max_num_blocks and
/// p2p_phase3 tune upstream's launch; the values do not depend on them. numel 0 returns
/// `output` (or a new empty tensor) without meeting the group. Compute capability 9.0 and
/// newer on CUDA, as upstream; the CPU reference runs anywhere. The buffers every rank maps are
/// kept per group between calls (grown when a larger call comes), as upstream's symmetric
/// memory.
Tensor quantized_all_reduce(const Tensor& inp, std::shared_ptr<comm::CommBackend> group,
                            int64_t scale_group = kQuantizedAllReduceScaleGroupDefault,
                            std::optional<int64_t> block_size = std::nullopt,
                            std::optional<int64_t> num_warps = std::nullopt,
                            std::optional<int64_t> max_num_blocks = std::nullopt,
                            std::optional<bool> p2p_phase3 = std::nullopt,
                            std::optional<Tensor> output = std::nullopt);

}  // namespace flashinfer
