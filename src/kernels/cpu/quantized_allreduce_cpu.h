// CPU reference of quantized_all_reduce (flashinfer.comm.quantized_allreduce): this rank's
// output from every rank's bf16 input. docs/COMM.md, "Quantized all-reduce".
#pragma once

#include <cstdint>
#include <vector>

namespace flashinfer::kernels::cpu {

/// `inputs[k]` is rank k's input (bf16 bits, n elements). Writes what rank `rank` of
/// inputs.size() ranks receives (kernels/quantized_allreduce_rules.h): the exact sum of its own
/// stripes' quantized inputs rounded to bf16, the other stripes requantized by their owners.
void quantized_all_reduce(const std::vector<const uint16_t*>& inputs, int64_t n, int64_t rank,
                          int64_t scale_group, int64_t block_size, uint16_t* out);

}  // namespace flashinfer::kernels::cpu
