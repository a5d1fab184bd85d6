// Zero-copy exchange with any framework through DLPack (DLManagedTensor, dlpack >= 0.6).
#pragma once

#include "flashinfer/tensor.h"

struct DLManagedTensor;

namespace flashinfer {

/// Exports `tensor` without copying. The returned DLManagedTensor keeps the storage alive until
/// the consumer calls its deleter. fp8 and fp4 dtypes use DLPack 1.1's type codes.
DLManagedTensor* to_dlpack(const Tensor& tensor);

/// Imports without copying and takes ownership of `managed`: its deleter runs when the last
/// Tensor sharing the memory goes (also when this function throws). Throws flashinfer::Error for
/// a dtype or device this library does not know, or lanes != 1.
Tensor from_dlpack(DLManagedTensor* managed);

}  // namespace flashinfer
