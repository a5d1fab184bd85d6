// CPU reference of the block-sparse attention forwards (SM120 blk64, SM100 blk128 and blk64).
#pragma once

#include "kernels/bsa_params.h"

namespace flashinfer::kernels::cpu {

/// Each query row's softmax over the keys of its listed blocks (with multiplicity; keys past Sk
/// that block_sizes declares valid score 0 against a zero value, as upstream's out-of-bounds
/// loads), two passes in fp32. (batch, head) pairs in parallel.
void bsa_attn_fwd(const BsaParams& p);

}  // namespace flashinfer::kernels::cpu
