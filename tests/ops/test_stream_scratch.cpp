// The per-(device, stream) scratch of the CUDA backend (kernels/cuda/stream_scratch.h): its growth
// policy and stream key on the CPU; on a GPU, the keying by stream id (the per-thread default
// stream), the lease's lock, the allocation counter and the refusal to grow under capture.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <unordered_map>

#include "kernels/cuda/stream_scratch.h"
#include "kernels/cudnn_gemm_plan.h"
#include "util/test_util.h"

#if FLASHINFER_TEST_HAVE_CUDART
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "flashinfer/error.h"
#endif

namespace flashinfer {
namespace {

using kernels::cuda::scratch_grow_to;
using kernels::cuda::StreamKey;
using kernels::cuda::StreamKeyHash;

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(StreamScratch, GrowsToPowersOfTwoThenToMultiplesOf2MiB) {
  EXPECT_EQ(scratch_grow_to(0), 0u);
  EXPECT_EQ(scratch_grow_to(1), kMiB);
  EXPECT_EQ(scratch_grow_to(kMiB), kMiB);
  EXPECT_EQ(scratch_grow_to(kMiB + 1), 2 * kMiB);
  EXPECT_EQ(scratch_grow_to(3 * kMiB), 4 * kMiB);
  EXPECT_EQ(scratch_grow_to(40 * kMiB), 64 * kMiB);
  EXPECT_EQ(scratch_grow_to(64 * kMiB), 64 * kMiB);
  EXPECT_EQ(scratch_grow_to(64 * kMiB + 1), 66 * kMiB);
  EXPECT_EQ(scratch_grow_to(65 * kMiB), 66 * kMiB);
  EXPECT_EQ(scratch_grow_to(66 * kMiB), 66 * kMiB);
  EXPECT_EQ(scratch_grow_to(100 * kMiB - 1), 100 * kMiB);
  // 10 GB (not GiB) needs 4768.37... blocks of 2 MiB: 4769 of them, not 16 GiB.
  EXPECT_EQ(scratch_grow_to(10'000'000'000), uint64_t{4769} * 2 * kMiB);
  EXPECT_EQ(scratch_grow_to(uint64_t{10} << 30), uint64_t{10} << 30);
  // No wrap-around near the top (cudaMalloc then refuses the size).
  EXPECT_EQ(scratch_grow_to(UINT64_MAX), UINT64_MAX);
  // The cuDNN workspace follows the same policy.
  EXPECT_EQ(kernels::dnn::workspace_grow_to(65 * kMiB), 66 * kMiB);
}

TEST(StreamScratch, GrowthCoversTheNeedWithBoundedWaste) {
  uint64_t prev = 0;
  for (uint64_t need = 1; need < 300 * kMiB; need += need / 7 + 12345) {
    const uint64_t g = scratch_grow_to(need);
    ASSERT_GE(g, need) << need;
    ASSERT_GE(g, prev) << need;  // monotone: a larger need never gets a smaller buffer
    if (need > 64 * kMiB) {
      ASSERT_EQ(g % (2 * kMiB), 0u) << need;
      ASSERT_LT(g - need, 2 * kMiB) << need;
    } else {
      ASSERT_EQ(g & (g - 1), 0u) << need;  // a power of two
      ASSERT_TRUE(g == kMiB || g < 2 * need) << need;
    }
    prev = g;
  }
}

TEST(StreamScratch, KeyTellsDevicesAndStreamIdsApart) {
  std::unordered_map<StreamKey, int, StreamKeyHash> m;
  m[StreamKey{0, 5}] = 1;
  m[StreamKey{1, 5}] = 2;
  m[StreamKey{0, 6}] = 3;
  m[StreamKey{0, 5}] += 10;
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m.at(StreamKey{0, 5}), 11);
  EXPECT_EQ(m.at(StreamKey{1, 5}), 2);
  EXPECT_EQ(m.at(StreamKey{0, 6}), 3);
  EXPECT_FALSE((StreamKey{0, 5} == StreamKey{1, 5}));
  EXPECT_FALSE((StreamKey{0, 5} == StreamKey{0, 6}));
}

#if FLASHINFER_TEST_HAVE_CUDART
using kernels::cuda::StreamScratch;
using kernels::cuda::StreamScratchPool;

// cudaStreamPerThread is one handle but each host thread's own stream: the threads get different
// buffers (one handle-keyed buffer would be written by both streams at once), a thread the same
// one each time.
TEST(StreamScratchCuda, PerThreadDefaultStreamsGetTheirOwnBuffers) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  static StreamScratchPool pool("scratch");
  void* const per_thread = cudaStreamPerThread;
  void* mine = pool.acquire("test", per_thread, 1000).data();
  EXPECT_EQ(pool.acquire("test", per_thread, 1000).data(), mine);
  void* theirs = nullptr;
  std::thread([&] { theirs = pool.acquire("test", per_thread, 1000).data(); }).join();
  ASSERT_NE(mine, nullptr);
  ASSERT_NE(theirs, nullptr);
  EXPECT_NE(mine, theirs);
}

// Growth allocates once (to scratch_grow_to), a smaller or equal need nothing; the lease keeps a
// second thread on the same stream waiting until it is released.
TEST(StreamScratchCuda, CountsAllocationsAndHoldsTheStream) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  static StreamScratchPool pool("scratch");
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const uint64_t a0 = pool.allocations(), b0 = pool.allocated_bytes();
  StreamScratch lease = pool.acquire("test", stream, 3 * kMiB);
  EXPECT_EQ(lease.bytes(), 4 * kMiB);
  EXPECT_EQ(pool.allocations(), a0 + 1);
  EXPECT_EQ(pool.allocated_bytes(), b0 + 4 * kMiB);
  std::atomic<bool> got{false};
  std::thread other([&] {
    const StreamScratch l = pool.acquire("test", stream, 2 * kMiB);
    got = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(got.load());  // waits for `lease`
  lease.reset();
  other.join();
  EXPECT_TRUE(got.load());
  EXPECT_EQ(pool.allocations(), a0 + 1);
  const StreamScratch big = pool.acquire("test", stream, 70 * kMiB);
  EXPECT_EQ(big.bytes(), 70 * kMiB);
  EXPECT_EQ(pool.allocations(), a0 + 2);
  EXPECT_EQ(pool.allocated_bytes(), b0 + 74 * kMiB);
  cudaStreamDestroy(stream);
}

// Growing while the stream is being captured is refused by name; a need the buffer covers is
// served during the capture.
TEST(StreamScratchCuda, RefusesToGrowWhileCapturing) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  static StreamScratchPool pool("split-KV scratch");
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  void* warm = pool.acquire("my_op", stream, kMiB).data();
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(pool.acquire("my_op", stream, 1000).data(), warm);
  bool refused = false;
  try {
    (void)pool.acquire("my_op", stream, 2 * kMiB);
  } catch (const Error& e) {
    refused = true;
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_EQ(e.op(), "my_op");
    EXPECT_NE(e.detail().find("2097152 bytes of split-KV scratch"), std::string::npos) << e.what();
    EXPECT_NE(e.detail().find("run the call once on the stream before capturing it"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(refused);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// try_acquire(): acquire's lease outside a capture and within the buffer's size during one; a
// need the buffer does not cover during a capture, or a stream first seen while it is being
// captured, gives nullopt and allocates nothing (acquire refuses those by name), so a caller
// with a path that needs no scratch can take it instead.
TEST(StreamScratchCuda, TryAcquireDeclinesWhatACaptureCannotGrow) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  static StreamScratchPool pool("scratch");
  int device = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  cudaStream_t stream = nullptr, cold = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&cold, cudaStreamNonBlocking), cudaSuccess);
  const uint64_t a0 = pool.allocations();
  void* warm = nullptr;
  {
    const std::optional<StreamScratch> l = pool.try_acquire("my_op", device, stream, 3 * kMiB);
    ASSERT_TRUE(l.has_value());  // outside a capture: grows as acquire does
    EXPECT_EQ(l->bytes(), 4 * kMiB);
    warm = l->data();
  }
  EXPECT_EQ(pool.allocations(), a0 + 1);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  {
    const std::optional<StreamScratch> l = pool.try_acquire("my_op", device, stream, 4 * kMiB);
    ASSERT_TRUE(l.has_value());
    EXPECT_EQ(l->data(), warm);
  }
  EXPECT_FALSE(pool.try_acquire("my_op", device, stream, 4 * kMiB + 1).has_value());
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  if (graph != nullptr) cudaGraphDestroy(graph);
  ASSERT_EQ(cudaStreamBeginCapture(cold, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_FALSE(pool.try_acquire("my_op", device, cold, 1).has_value());
  ASSERT_EQ(cudaStreamEndCapture(cold, &graph), cudaSuccess);
  if (graph != nullptr) cudaGraphDestroy(graph);
  EXPECT_EQ(pool.allocations(), a0 + 1);  // the declines allocated nothing
  cudaStreamDestroy(stream);
  cudaStreamDestroy(cold);
}
#endif  // FLASHINFER_TEST_HAVE_CUDART

}  // namespace
}  // namespace flashinfer
