// CUDA-event timing for `flashinfer bench`. Plain C++ header: the API layer calls it without
// seeing CUDA headers.
#pragma once

#include <functional>
#include <vector>

namespace flashinfer::kernels::cuda {

/// Runs `fn` dry_run_iters times, then num_iters times between two CUDA events recorded on
/// `stream` (a cudaStream_t); returns the elapsed milliseconds of each timed iteration. With
/// flush_l2, a buffer the size of the device's L2 is overwritten before every iteration (outside
/// the events) so each iteration starts with a cold L2, as upstream's bench_gpu_time does.
std::vector<double> event_times_ms(const std::function<void()>& fn, int dry_run_iters,
                                   int num_iters, bool flush_l2, void* stream);

}  // namespace flashinfer::kernels::cuda
