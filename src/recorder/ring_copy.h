// Private: the ring's tensor copies. A kept copy is read again only if a dump is written, so it
// is written with non-temporal (streaming) stores: no read-for-ownership of the ring's cold
// destination lines and no eviction of the program's working set (a GEMM's weights) by bytes
// nobody reads soon. The NaN trigger's check runs in the same pass over the source, which the
// op has just written and is still in cache (docs/PERFORMANCE.md, session 16).
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"

namespace flashinfer::recorder::internal {

/// Copies `n` bytes from `src` to `dst` (the ring's host memory; the regions do not overlap).
void ring_copy(uint8_t* dst, const uint8_t* src, uint64_t n) noexcept;

/// Whether the exponent bits of `dtype` (fp16, bf16, fp32 or fp64) can be checked by
/// ring_copy_check.
bool ring_checkable(DType dtype) noexcept;

/// ring_copy, and whether any of the `n / dtype_size(dtype)` elements at `src` has all its
/// exponent bits set (a NaN or an Inf). `dtype` must be ring_checkable.
bool ring_copy_check(uint8_t* dst, const uint8_t* src, uint64_t n, DType dtype) noexcept;

/// The check alone (no copy): over `n` bytes at `p`.
bool ring_any_nonfinite(const uint8_t* p, uint64_t n, DType dtype) noexcept;

}  // namespace flashinfer::recorder::internal
