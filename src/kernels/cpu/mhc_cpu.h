// CPU reference of the mHC ops (flashinfer.mhc).
#pragma once

#include "kernels/mhc_params.h"

namespace flashinfer::kernels::cpu {

/// mhc_post per element in kernels/mhc_rules.h's order (bit-exact with upstream's kernel but
/// for its flushed subnormals). Tokens in parallel.
void mhc_post(const MhcPostParams& p);

/// mhc_pre_big_fuse per token (the sum of squares, in the prenorm form, sequential in fp32).
/// Tokens in parallel.
void mhc_pre_big_fuse(const MhcPreParams& p);

}  // namespace flashinfer::kernels::cpu
