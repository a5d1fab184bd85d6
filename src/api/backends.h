// Private: backend-argument check shared by the GEMM and quantization ops.
#pragma once

#include <string_view>

#include "flashinfer/device.h"

namespace flashinfer::api {

/// Throws flashinfer::Error naming `op` and "backend": kInvalidArgument for a name upstream's op
/// does not know, kUnsupported when a CUDA device cannot run it here (the message lists the
/// backends that can). CPU tensors accept every known name (the CPU reference runs).
void check_backend(const char* op, std::string_view backend, Device device);

}  // namespace flashinfer::api
