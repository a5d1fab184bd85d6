// Private: the CPU references of nvfp4_attention_sm120_quantize_qkv and nvfp4_attention_sm120_fwd
// (docs/ATTENTION.md, "NVFP4 attention on SM120"). (batch, head) pairs in parallel.
#pragma once

#include "kernels/nvfp4_attention_params.h"

namespace flashinfer::kernels::cpu {

/// Centre K, pad, centre Q (per 128-token block or over all rows), the correction, and the three
/// NVFP4 quantizations with their swizzled scales; every step rounded where upstream's is.
void nvfp4_attention_quantize_qkv(const Nvfp4AttnQuantParams& p);

/// The kernel's arithmetic: block-scaled FP4 scores plus the correction, online softmax over
/// 128-key tiles from the last to the first, P quantized to e2m1 per 16 keys (scale the block's
/// max / 6 in e4m3), the row sum over the unquantized P, out = O / sum, lse in natural log.
void nvfp4_attention_fwd(const Nvfp4AttnFwdParams& p);

}  // namespace flashinfer::kernels::cpu
