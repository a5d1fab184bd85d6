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

/// ring_copy_check (ring_copy when `check` is false) in streaming stores whatever the size, and
/// not fenced: for copies nothing compares soon (the call's arena, recorder/ring.cpp), a whole
/// line of `dst` at a time when it is 64-byte aligned. ring_copy_fence() after the last of them,
/// before they are published.
bool ring_copy_streamed(uint8_t* dst, const uint8_t* src, uint64_t n, bool check,
                        DType dtype) noexcept;
void ring_copy_fence() noexcept;

/// The check alone (no copy): over `n` bytes at `p`.
bool ring_any_nonfinite(const uint8_t* p, uint64_t n, DType dtype) noexcept;

}  // namespace flashinfer::recorder::internal
