// CUDA launchers for the sampling ops. Plain C++ header: callable from the API layer, which never
// sees CUDA headers. Launchers throw flashinfer::Error(kCuda) when a launch fails. The per-row
// arrays of `rows` in the parameter structs must be device memory. Nothing here synchronizes or
// allocates per call (the kernels read every per-row value on the device), so a call can be
// captured in a CUDA graph.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/stream_scratch.h"
#include "kernels/sampling_params.h"

namespace flashinfer::kernels::cuda {

void sample(const SamplingParams& p, void* stream);
void filter(const FilterParams& p, void* stream);
void softmax(const SoftmaxParams& p, void* stream, bool enable_pdl);
/// Sets *flag (device int32) to 1 when any element is NaN, else 0. Asynchronous on `stream`.
void nan_flag(const void* data, DType dtype, int64_t rows, int64_t cols, int64_t stride_row,
              int64_t stride_col, int32_t* flag, void* stream);

/// Blocks until `stream` has finished its work.
void stream_synchronize(void* stream);

/// Device memory for the intermediate rows of a multi-kernel sampling call (top-k renormed
/// probs, masked logits, their softmax): the stream's buffer of kernels/cuda/stream_scratch.h
/// (kept per (device, stream), grown on demand, never freed), so a call allocates nothing once its
/// stream's buffer is large enough. The lease holds the stream's lock: keep it until the call has
/// queued the last kernel using data(), so two host threads on one stream do not interleave their
/// uses of it. Growing while the stream is being captured into a CUDA graph is refused.
using SamplingScratch = StreamScratch;
/// At least `bytes` (256-byte aligned) on `device` for work queued on `stream`.
SamplingScratch sampling_scratch(int device, void* stream, std::size_t bytes);

}  // namespace flashinfer::kernels::cuda
