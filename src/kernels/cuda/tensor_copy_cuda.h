// CUDA launcher of Tensor's device-side copies, casts and fills (kernels/tensor_copy.h; plain C++
// header). Throws flashinfer::Error(kCuda) when the launch fails.
#pragma once

#include "kernels/tensor_copy.h"

namespace flashinfer::kernels::cuda {

/// Writes every element of a.dst on `stream` (the device's current one): stream-ordered, no
/// allocation, no synchronization, so a CUDA graph captures it.
void tensor_copy(const TensorCopyArgs& a, void* stream);

}  // namespace flashinfer::kernels::cuda
