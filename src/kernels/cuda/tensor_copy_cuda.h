// CUDA launcher of Tensor's device-side copies, casts and fills (kernels/tensor_copy.h; plain C++
// header). Throws flashinfer::Error(kCuda) when the launch fails.
#pragma once

#include <cstddef>

#include "kernels/tensor_copy.h"

namespace flashinfer::kernels::cuda {

/// Writes every element of a.dst on `stream` (the device's current one): stream-ordered, no
/// allocation, no synchronization, so a CUDA graph captures it.
void tensor_copy(const TensorCopyArgs& a, void* stream);

/// The bytes one launch of copy_bytes_by_value carries in its parameters (kernel parameters stay
/// under the 4 KiB every CUDA device takes).
inline constexpr std::size_t kBytesByValueChunk = 4000;

/// Writes `nbytes` bytes of host memory `src` to device memory `dst` on `stream` by kernel
/// launches that carry the bytes in their parameters (kBytesByValueChunk a launch). `src` is not
/// read after it returns and nothing synchronizes, so inside a CUDA-graph capture the graph keeps
/// the bytes as they are now: what a host-to-device memcpy from pageable memory, which reads the
/// host when it runs and synchronizes, cannot be in a capture.
void copy_bytes_by_value(void* dst, const void* src, std::size_t nbytes, void* stream);

}  // namespace flashinfer::kernels::cuda
