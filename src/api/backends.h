// Private: backend-argument check shared by the GEMM and quantization ops.
#pragma once

#include <string_view>

#include "flashinfer/device.h"

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

}  // namespace flashinfer::api
