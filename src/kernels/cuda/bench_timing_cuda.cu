// CUDA-event timing with an L2 flush between iterations (see bench_timing_cuda.h).
#include "kernels/cuda/bench_timing_cuda.h"

#include <memory>

#include "kernels/cuda/cuda_utils.cuh"

namespace flashinfer::kernels::cuda {

namespace {

constexpr const char* kOp = "bench";

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

}  // namespace

std::vector<double> event_times_ms(const std::function<void()>& fn, int dry_run_iters,
                                   int num_iters, bool flush_l2, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  TimingResources r;
  int device = 0, l2_bytes = 0;
  FLASHINFER_CUDA_CALL(kOp, cudaGetDevice(&device));
  FLASHINFER_CUDA_CALL(kOp, cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  // Twice the L2 size, so no line of the previous iteration's working set survives the memset.
  const size_t flush_bytes = flush_l2 ? 2 * static_cast<size_t>(l2_bytes) : 0;
  if (flush_bytes > 0) FLASHINFER_CUDA_CALL(kOp, cudaMalloc(&r.flush, flush_bytes));
  FLASHINFER_CUDA_CALL(kOp, cudaEventCreate(&r.start));
  FLASHINFER_CUDA_CALL(kOp, cudaEventCreate(&r.stop));

  for (int i = 0; i < dry_run_iters; ++i) fn();
  FLASHINFER_CUDA_CALL(kOp, cudaStreamSynchronize(s));

  std::vector<double> times;
  times.reserve(static_cast<size_t>(num_iters > 0 ? num_iters : 0));
  for (int i = 0; i < num_iters; ++i) {
    if (r.flush) FLASHINFER_CUDA_CALL(kOp, cudaMemsetAsync(r.flush, i & 0xff, flush_bytes, s));
    bench_host_lead_kernel<<<1, 1, 0, s>>>(kBenchHostLeadCycles);
    FLASHINFER_CUDA_CALL(kOp, cudaGetLastError());
    FLASHINFER_CUDA_CALL(kOp, cudaEventRecord(r.start, s));
    fn();
    FLASHINFER_CUDA_CALL(kOp, cudaEventRecord(r.stop, s));
    FLASHINFER_CUDA_CALL(kOp, cudaEventSynchronize(r.stop));
    float ms = 0.0f;
    FLASHINFER_CUDA_CALL(kOp, cudaEventElapsedTime(&ms, r.start, r.stop));
    times.push_back(static_cast<double>(ms));
  }
  return times;
}

}  // namespace flashinfer::kernels::cuda
