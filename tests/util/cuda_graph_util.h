// CUDA-graph capture for the tests that check an op can be captured: needs the CUDA runtime
// (targets with FLASHINFER_TEST_HAVE_CUDART, tests/CMakeLists.txt).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <functional>

namespace flashinfer::testing {

// Captures what `call` queues on `stream` (capture `mode`) into a graph, launches the graph once
// on `stream` and waits for it; the graph is destroyed after. Call it under
// ASSERT_NO_FATAL_FAILURE: a CUDA error fails the test here.
inline void capture_and_launch(cudaStream_t stream, cudaStreamCaptureMode mode,
                               const std::function<void()>& call) {
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, mode), cudaSuccess);
  call();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace flashinfer::testing
