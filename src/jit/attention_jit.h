// Private: the JIT module specs of the CUDA attention kernels (docs/JIT.md). The AOT-built
// instantiations (head dims 64/128/256, qk == vo) stay the fast path; any other pair of head dims,
// each a multiple of 16 up to 256, is compiled by NVRTC from the same kernel headers.
#pragma once

#include <string>
#include <string_view>

#include "flashinfer/dtype.h"
#include "jit/jit.h"

namespace flashinfer::jit {

/// Whether the attention kernels take this head dim through the JIT (a multiple of 16 in
/// [16, 256]).
bool attention_head_dim_ok(int64_t d);

/// The CUDA-core decode kernel (batch_decode_kernel: any dtype mix the AOT dispatch accepts:
/// fp16/bf16 q and o, K/V of q's dtype or fp8) for head dims (dqk, dvo) and variant bits
/// (1: logits soft-cap, 2: per-key mask, 4: ALiBi; attention_decode_kernel.cuh). A nonzero
/// variant adds `_softcap` / `_mask` / `_alibi` to the module name. rows_per_thread (1 or 2,
/// decode_rows_per_thread) is the kernel's kRows; 2 adds `_rows2` to the name.
ModuleSpec attention_cuda_core_spec(DType q, DType kv, DType o, int dqk, int dvo, int variant = 0,
                                    int rows_per_thread = 1);
/// The tensor-core (mma.sync, sm80+) prefill kernel, fp16/bf16, head_dim_qk == head_dim_vo == d.
ModuleSpec attention_mma_spec(DType t, int d);

/// One line of a `flashinfer jit build --list` file, e.g.
///   attention_cuda_core q=float16 kv=float8_e4m3fn o=float16 head_dim_qk=192 head_dim_vo=128
///   attention_cuda_core q=bfloat16 kv=bfloat16 o=bfloat16 head_dim_qk=96 head_dim_vo=96 variant=3
///   attention_cuda_core q=bfloat16 kv=bfloat16 o=bfloat16 head_dim_qk=96 head_dim_vo=96
///       rows_per_thread=2
///   attention_mma dtype=bfloat16 head_dim=96
/// Throws Error(kInvalidArgument, "jit", "list") naming what is wrong.
ModuleSpec spec_from_line(std::string_view line);

}  // namespace flashinfer::jit
