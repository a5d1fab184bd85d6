// The CUDA stream ops launch on, as an opaque handle (public headers stay free of CUDA headers).
#pragma once

namespace flashinfer {

/// The calling thread's current stream (a cudaStream_t); nullptr is the legacy default stream.
void* current_cuda_stream();
/// Sets the calling thread's current stream; ops on CUDA tensors launch on it.
void set_current_cuda_stream(void* stream);

}  // namespace flashinfer
