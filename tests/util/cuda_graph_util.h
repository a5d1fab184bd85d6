// CUDA-graph capture for the tests that check an op can be captured or that a captured wrapper
// computes a later plan: needs the CUDA runtime (targets with FLASHINFER_TEST_HAVE_CUDART or the
// oracles, tests/CMakeLists.txt).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <functional>
#include <vector>

#include "flashinfer/stream.h"

namespace flashinfer::testing {

// Captures what `call` queues on `stream` (capture `mode`) into a graph, launches the graph once
// on `stream` and waits for it; the graph is destroyed after. Call it under
// ASSERT_NO_FATAL_FAILURE: a CUDA error fails the test here; a call that throws ends the capture
// (its graph discarded) before the exception leaves. `kernel_nodes`, when given, gets the number of
// kernel nodes the graph holds.
inline void capture_and_launch(cudaStream_t stream, cudaStreamCaptureMode mode,
                               const std::function<void()>& call,
                               std::size_t* kernel_nodes = nullptr) {
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, mode), cudaSuccess);
  try {
    call();
  } catch (...) {
    // End the capture before the exception leaves: a stream left capturing fails every later
    // CUDA call of the binary's other tests.
    cudaGraph_t discarded = nullptr;
    (void)cudaStreamEndCapture(stream, &discarded);
    if (discarded != nullptr) cudaGraphDestroy(discarded);
    (void)cudaGetLastError();
    throw;
  }
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  if (kernel_nodes != nullptr) {
    std::size_t n = 0;
    ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &n), cudaSuccess);
    std::vector<cudaGraphNode_t> nodes(n);
    if (n > 0) {
      ASSERT_EQ(cudaGraphGetNodes(graph, nodes.data(), &n), cudaSuccess);
    }
    *kernel_nodes = 0;
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type{};
      ASSERT_EQ(cudaGraphNodeGetType(node, &type), cudaSuccess);
      *kernel_nodes += type == cudaGraphNodeTypeKernel;
    }
  }
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// capture_and_launch in global mode (any synchronizing call inside fails the capture) on a new
// non-blocking stream made the library's current stream for the capture; the previous current
// stream comes back and the stream is destroyed however the capture ends. Call it under
// ASSERT_NO_FATAL_FAILURE.
inline void capture_on_own_stream(const std::function<void()>& call,
                                  std::size_t* kernel_nodes = nullptr) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  struct Restore {
    void* prev;
    cudaStream_t stream;
    ~Restore() {
      set_current_cuda_stream(prev);
      cudaStreamDestroy(stream);
    }
  } restore{current_cuda_stream(), stream};
  set_current_cuda_stream(stream);
  // Work queued before on other streams (a tensor's zero fill on the legacy stream) finishes
  // first: the new non-blocking stream is not ordered after it.
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  capture_and_launch(stream, cudaStreamCaptureModeGlobal, call, kernel_nodes);
}

// A graph captured once and launched again after re-plans (the wrappers' use_cuda_graph tests):
// the stream it was captured on and its executable form. The test destroys them.
struct ReplayableGraph {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};

// Makes `stream` the library's current stream until destroyed, then restores the one before
// (also when a call throws or an assertion returns early).
struct CurrentStreamScope {
  void* before;
  explicit CurrentStreamScope(cudaStream_t stream) : before(current_cuda_stream()) {
    set_current_cuda_stream(stream);
  }
  ~CurrentStreamScope() { set_current_cuda_stream(before); }
  CurrentStreamScope(const CurrentStreamScope&) = delete;
  CurrentStreamScope& operator=(const CurrentStreamScope&) = delete;
};

// Runs `call` once on `g`'s stream (created here), made the library's current stream, and waits
// for it: an engine's warm-up before it captures. The per-stream scratch an op keeps
// (kernels/cuda/stream_scratch.h) then exists when capture_for_replay captures on that stream.
// Call it under ASSERT_NO_FATAL_FAILURE.
inline void warm_up_for_replay(ReplayableGraph& g, const std::function<void()>& call) {
  ASSERT_EQ(g.stream, nullptr);
  ASSERT_EQ(cudaStreamCreate(&g.stream), cudaSuccess);
  const CurrentStreamScope scope(g.stream);
  call();
  ASSERT_EQ(cudaStreamSynchronize(g.stream), cudaSuccess);
}

// Captures what `call` queues into `g`: on its stream (a new one when it has none), made the
// library's current stream for the capture (relaxed mode), then instantiated. Call it under
// ASSERT_NO_FATAL_FAILURE: a CUDA error fails the test here; a call that throws ends the capture
// (its graph discarded) before the exception leaves.
inline void capture_for_replay(ReplayableGraph& g, const std::function<void()>& call) {
  if (g.stream == nullptr) {
    ASSERT_EQ(cudaStreamCreate(&g.stream), cudaSuccess);
  }
  const CurrentStreamScope scope(g.stream);
  ASSERT_EQ(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
  try {
    call();
  } catch (...) {
    cudaGraph_t discarded = nullptr;
    (void)cudaStreamEndCapture(g.stream, &discarded);
    if (discarded != nullptr) cudaGraphDestroy(discarded);
    (void)cudaGetLastError();
    throw;
  }
  ASSERT_EQ(cudaStreamEndCapture(g.stream, &g.graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&g.exec, g.graph, 0), cudaSuccess);
}

}  // namespace flashinfer::testing
