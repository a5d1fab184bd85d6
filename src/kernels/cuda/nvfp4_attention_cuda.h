// CUDA launchers of nvfp4_attention_sm120_quantize_qkv and nvfp4_attention_sm120_fwd (upstream
// runs them on compute capability 12.0 only; the API layer refuses other GPUs by its rule). The
// arithmetic is kernels/nvfp4_attention_rules.h's, so the result is the CPU reference's, bit for
// bit. Plain C++ header.
#pragma once

#include "kernels/nvfp4_attention_params.h"

namespace flashinfer::kernels::cuda {

/// Three launches: the means (a thread per (head, d), fp64 sums in token order), the correction
/// (a thread per key) and the quantization (a thread per block of 16 values). The means ([B H D]
/// and [B H groups D] floats) are the stream's scratch (stream_scratch.h); p.k_mean and p.q_mean
/// are set here.
void nvfp4_attention_quantize_qkv(const Nvfp4AttnQuantParams& p, void* stream, bool enable_pdl);

/// A warp per query row: each tile's scores a lane per key (exact fp64 dot products), the row
/// max by a butterfly, P and its quantization per 16 keys, the P V sums a lane per head dim.
void nvfp4_attention_fwd(const Nvfp4AttnFwdParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
