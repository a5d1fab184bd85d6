// CPU reference of per_token_group_quant_8bit and the bit packers.
#pragma once

#include <cstdint>

#include "kernels/quant8_params.h"

namespace flashinfer::kernels::cpu {

void per_token_group_quant_8bit(const GroupQuant8Params& p);
/// Packs n truth values (nonzero bytes of `x`, element stride `stride`) into ceil(n / 8) bytes.
void packbits(const uint8_t* x, int64_t n, int64_t stride, bool little, uint8_t* out);

}  // namespace flashinfer::kernels::cpu
