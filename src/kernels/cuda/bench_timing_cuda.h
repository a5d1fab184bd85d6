// CUDA-event timing for `flashinfer bench`. Plain C++ header: the API layer calls it without
// seeing CUDA headers.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace flashinfer::kernels::cuda {

/// Device clock cycles of the spin before each timed iteration (about 0.25 ms at 2 GHz: more
/// than a host needs to queue an op's launches, up to a Python wrapper's).
inline constexpr long long kBenchHostLeadCycles = 500000;

/// Runs `fn` dry_run_iters times, then num_iters times between two CUDA events recorded on
/// `stream` (a cudaStream_t); returns the elapsed milliseconds of each timed iteration. With
/// flush_l2, a buffer the size of the device's L2 is overwritten before every iteration (outside
/// the events) so each iteration starts with a cold L2, as upstream's bench_gpu_time does. Then,
/// still before the start event, the device spins for kBenchHostLeadCycles, so the host has
/// queued `fn`'s launches before the timed range begins: the time is the device's, not the
/// host's launch overhead (upstream's benchmarks get the same from CUDA graphs).
std::vector<double> event_times_ms(const std::function<void()>& fn, int dry_run_iters,
                                   int num_iters, bool flush_l2, void* stream);

/// The device's L2 size in bytes (the current device).
int64_t l2_cache_bytes();

/// upstream's bench_gpu_time_with_cudagraph: on a stream of its own (the library's current
/// stream meanwhile) each of `fns` runs once untimed (first calls build plans and grow the
/// stream's scratch), then iters_within_graph calls, fns[i % fns.size()], are captured into one
/// CUDA graph (thread-local capture mode: a call that synchronizes or copies through the host
/// fails the capture instead of running; the tensors the calls make are kept by the allocator's
/// capture hold until the graph is destroyed); the graph is replayed
/// dry_run_iters times untimed, then num_iters times between two events each. Returns each
/// replay's milliseconds over iters_within_graph, or nullopt with `why` when the calls could not
/// be captured (the capture is ended and nothing of it runs).
std::optional<std::vector<double>> graph_times_ms(const std::vector<std::function<void()>>& fns,
                                                  int dry_run_iters, int num_iters,
                                                  int iters_within_graph, std::string* why);

}  // namespace flashinfer::kernels::cuda
