// CUDA-event timing with an L2 flush between iterations (see bench_timing_cuda.h).
#include "kernels/cuda/bench_timing_cuda.h"

#include <exception>
#include <map>
#include <memory>

#include "core/capture_hold.h"
#include "flashinfer/stream.h"
#include "kernels/cuda/cuda_utils.cuh"

namespace flashinfer::kernels::cuda {

namespace {

constexpr const char* kBenchOp = "bench";

// Owns the events and the flush buffer so an exception from `fn` releases them.
struct TimingResources {
  cudaEvent_t start = nullptr, stop = nullptr;
  void* flush = nullptr;
  ~TimingResources() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (flush) cudaFree(flush);
  }
};

// Spins one thread for `cycles` device clock cycles (the host's lead, see the header).
__global__ void bench_host_lead_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// The stream graph timings capture on, one a device and host thread, made once and never
// destroyed: the library keeps state per stream (scratch, a cuBLASLt workspace, a cuDNN handle)
// for the stream's life and never frees it, and tensors made on a stream name it when released.
cudaStream_t bench_stream(int device) {
  thread_local std::map<int, cudaStream_t> streams;
  cudaStream_t& s = streams[device];
  if (s == nullptr)
    FLASHINFER_CUDA_CALL(kBenchOp, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

// What a graph timing made, released on every path (the library's stream restored first).
struct GraphResources {
  cudaStream_t stream = nullptr;  // bench_stream's: not destroyed here
  void* previous = nullptr;       // the library's current stream before
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<cudaEvent_t> events;
  int held_device = -1;  // the allocator's capture hold, ended once the graph is gone
  ~GraphResources() {
    set_current_cuda_stream(previous);
    if (stream) cudaStreamSynchronize(stream);
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (held_device >= 0) ::flashinfer::detail::cuda_end_capture_hold(held_device);
  }
};

}  // namespace

int64_t l2_cache_bytes() {
  int device = 0, l2_bytes = 0;
  FLASHINFER_CUDA_CALL(kBenchOp, cudaGetDevice(&device));
  FLASHINFER_CUDA_CALL(kBenchOp, cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  return l2_bytes;
}

std::optional<std::vector<double>> graph_times_ms(const std::vector<std::function<void()>>& fns,
                                                  int dry_run_iters, int num_iters,
                                                  int iters_within_graph, std::string* why) {
  FLASHINFER_CHECK(!fns.empty() && iters_within_graph > 0, kBenchOp, "iters_within_graph",
                   "a CUDA graph needs at least one call");
  GraphResources r;
  r.previous = current_cuda_stream();
  int device = 0;
  FLASHINFER_CUDA_CALL(kBenchOp, cudaGetDevice(&device));
  // The cases were built on the previous stream, which a non-blocking stream does not wait for.
  FLASHINFER_CUDA_CALL(kBenchOp, cudaDeviceSynchronize());
  // Capture needs a stream other than the legacy default one; the ops launch on the current one.
  r.stream = bench_stream(device);
  set_current_cuda_stream(r.stream);
  for (const auto& fn : fns) fn();
  FLASHINFER_CUDA_CALL(kBenchOp, cudaStreamSynchronize(r.stream));
  // The calls' results are fresh tensors: under the hold the allocator may make them during the
  // capture and keeps them, released or not, until the graph is destroyed (as torch's graph pool).
  if (::flashinfer::detail::cuda_begin_capture_hold(device)) r.held_device = device;
  const uint64_t declines = ::flashinfer::detail::capture_declines();
  FLASHINFER_CUDA_CALL(kBenchOp,
                       cudaStreamBeginCapture(r.stream, cudaStreamCaptureModeThreadLocal));
  std::string failure;
  try {
    for (int i = 0; i < iters_within_graph; ++i) fns[static_cast<std::size_t>(i) % fns.size()]();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const cudaError_t ended = cudaStreamEndCapture(r.stream, &r.graph);
  (void)cudaGetLastError();  // a failed capture's error is not sticky: clear it
  if (failure.empty() && (ended != cudaSuccess || r.graph == nullptr)) {
    failure = std::string("the capture ended with ") + cudaGetErrorString(ended);
  }
  if (failure.empty() && ::flashinfer::detail::capture_declines() != declines) {
    failure =
        "a call ran another kernel than its backend's while captured (cuDNN declines a "
        "capture): the graph would time that kernel";
  }
  if (failure.empty() && cudaGraphInstantiate(&r.exec, r.graph, 0) != cudaSuccess) {
    failure =
        std::string("instantiating the graph failed: ") + cudaGetErrorString(cudaGetLastError());
  }
  if (!failure.empty()) {
    if (why) *why = failure;
    return std::nullopt;
  }
  // The graph's upload to the device, outside the timed replays even with no dry run.
  FLASHINFER_CUDA_CALL(kBenchOp, cudaGraphUpload(r.exec, r.stream));
  for (int i = 0; i < dry_run_iters; ++i) {
    FLASHINFER_CUDA_CALL(kBenchOp, cudaGraphLaunch(r.exec, r.stream));
  }
  FLASHINFER_CUDA_CALL(kBenchOp, cudaStreamSynchronize(r.stream));
  // Every replay between its own two events, one synchronization at the end (as upstream).
  r.events.assign(2 * static_cast<std::size_t>(num_iters), nullptr);
  for (cudaEvent_t& e : r.events) FLASHINFER_CUDA_CALL(kBenchOp, cudaEventCreate(&e));
  for (int i = 0; i < num_iters; ++i) {
    FLASHINFER_CUDA_CALL(kBenchOp, cudaEventRecord(r.events[2 * i], r.stream));
    FLASHINFER_CUDA_CALL(kBenchOp, cudaGraphLaunch(r.exec, r.stream));
    FLASHINFER_CUDA_CALL(kBenchOp, cudaEventRecord(r.events[2 * i + 1], r.stream));
  }
  FLASHINFER_CUDA_CALL(kBenchOp, cudaStreamSynchronize(r.stream));
  std::vector<double> times;
  times.reserve(static_cast<std::size_t>(num_iters));
  for (int i = 0; i < num_iters; ++i) {
    float ms = 0.0f;
    FLASHINFER_CUDA_CALL(kBenchOp, cudaEventElapsedTime(&ms, r.events[2 * i], r.events[2 * i + 1]));
    times.push_back(static_cast<double>(ms) / iters_within_graph);
  }
  return times;
}

std::vector<double> event_times_ms(const std::function<void()>& fn, int dry_run_iters,
                                   int num_iters, bool flush_l2, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  TimingResources r;
  // Twice the L2 size, so no line of the previous iteration's working set survives the memset.
  const size_t flush_bytes = flush_l2 ? 2 * static_cast<size_t>(l2_cache_bytes()) : 0;
  if (flush_bytes > 0) FLASHINFER_CUDA_CALL(kBenchOp, cudaMalloc(&r.flush, flush_bytes));
  FLASHINFER_CUDA_CALL(kBenchOp, cudaEventCreate(&r.start));
  FLASHINFER_CUDA_CALL(kBenchOp, cudaEventCreate(&r.stop));

  for (int i = 0; i < dry_run_iters; ++i) fn();
  FLASHINFER_CUDA_CALL(kBenchOp, cudaStreamSynchronize(s));

  std::vector<double> times;
  times.reserve(static_cast<size_t>(num_iters > 0 ? num_iters : 0));
  for (int i = 0; i < num_iters; ++i) {
    if (r.flush) FLASHINFER_CUDA_CALL(kBenchOp, cudaMemsetAsync(r.flush, i & 0xff, flush_bytes, s));
    bench_host_lead_kernel<<<1, 1, 0, s>>>(kBenchHostLeadCycles);
    FLASHINFER_CUDA_CALL(kBenchOp, cudaGetLastError());
    FLASHINFER_CUDA_CALL(kBenchOp, cudaEventRecord(r.start, s));
    fn();
    FLASHINFER_CUDA_CALL(kBenchOp, cudaEventRecord(r.stop, s));
    FLASHINFER_CUDA_CALL(kBenchOp, cudaEventSynchronize(r.stop));
    float ms = 0.0f;
    FLASHINFER_CUDA_CALL(kBenchOp, cudaEventElapsedTime(&ms, r.start, r.stop));
    times.push_back(static_cast<double>(ms));
  }
  return times;
}

}  // namespace flashinfer::kernels::cuda
