// CPU reference kernels for RoPE: angles in fp64, rotation in fp32, multithreaded over tokens.
#pragma once

#include "kernels/rope_params.h"

namespace flashinfer::kernels::cpu {

/// `p.pos_mode` must be kPositions here: the API layer resolves indptr/offsets into a position
/// array after validating them.
void apply_rope(const RopeParams& p);

}  // namespace flashinfer::kernels::cpu
