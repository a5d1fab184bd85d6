// Private: backend-argument check shared by the GEMM and quantization ops.
#pragma once

#include <cstdint>
#include <string_view>

#include "flashinfer/device.h"
#include "flashinfer/dtype.h"

namespace flashinfer::api {

/// Throws flashinfer::Error naming `op` and "backend": kInvalidArgument for a name upstream's op
/// does not know, kUnsupported when a CUDA device cannot run it here (the message lists the
/// backends that can). CPU tensors accept every known name (the CPU reference runs).
void check_backend(const char* op, std::string_view backend, Device device);

/// Throws flashinfer::Error (kUnsupported) naming `op` and `arg`, with upstream's text
/// (flashinfer::upstream_refusal), when `device` is a CUDA device upstream does not run `op` on.
/// Nothing for CPU devices and for ops upstream runs everywhere.
void check_upstream_arch(const char* op, const char* arg, Device device);
/// check_upstream_arch with the rule (architectures and text) of `rule_op`, the error naming
/// `op`: for a wrapper's plan and run whose module checks the device as its one-shot form does.
void check_upstream_arch_as(const char* rule_op, const char* op, const char* arg, Device device);

/// Upstream 0.7.4's batch_invariant=True of the dense GEMMs (mm_bf16, mm_mxfp8, mm_fp4,
/// bmm_fp8): its correctly rounded CuTe DSL class, which never falls back. Refused as upstream
/// refuses it: a backend other than "auto", an output dtype outside `out_ok` (bf16 only, or bf16
/// and fp16), K or N of 0 or not a multiple of `k_align` / `n_align`, and a CUDA device other
/// than SM100 / SM103 / SM107. Elsewhere (the CPU reference replaying a Blackwell recording) the
/// result is the op's own, within the GEMM's tolerance: upstream has no reference of its
/// tensor-core steps to round like.
void check_batch_invariant_gemm(const char* op, std::string_view backend, Device device,
                                DType out_dtype, bool fp16_out_ok, int64_t k, int64_t n,
                                int64_t k_align, int64_t n_align);

}  // namespace flashinfer::api
