// A capture hold on the CUDA tensor allocator (core/caching_allocator.h, begin_capture_hold):
// for code that captures its own calls into a CUDA graph and knows when the graph is gone
// (flashinfer bench's CUDA-graph timing). Apart from core/cuda_runtime.h, which every CUDA
// source includes.
#pragma once

#include <cstdint>

namespace flashinfer::detail {

/// Takes a hold on the device's block cache: blocks a capture allocates are made (in relaxed
/// capture mode) and kept, released or not, until the last hold ends, for a CUDA graph that
/// addresses them. False (nothing held) without the cache (FLASHINFER_CUDA_CACHING_ALLOCATOR=0)
/// or the CUDA backend.
bool cuda_begin_capture_hold(int device);
/// Ends a hold; the last one frees the kept blocks (after synchronizing the device).
void cuda_end_capture_hold(int device) noexcept;

/// Counts the calls that, their stream being captured, ran another kernel than their backend's
/// (the cuDNN paths decline a capture and the op takes its own kernel): a CUDA-graph timing that
/// sees the count move would time that kernel under the backend's name.
void note_capture_decline() noexcept;
uint64_t capture_declines() noexcept;

}  // namespace flashinfer::detail
