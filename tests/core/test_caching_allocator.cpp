// The CUDA tensor allocator's cache policy (src/core/caching_allocator.h) against a fake device:
// reuse on the block's stream at once, on another stream only after its release event, size
// classes, capture bypass, out-of-memory recovery, and what reaches the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <unordered_map>
#include <vector>

#include "core/caching_allocator.h"

#if FLASHINFER_TEST_HAVE_CUDART
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string_view>
#include <thread>

#include "flashinfer/flashinfer.h"
#include "util/test_util.h"
#endif

namespace flashinfer::testing {
namespace {

using detail::CachingAllocator;

// Addresses from a counter; events are records whose completion the test decides.
class FakeDevice final : public detail::CachingAllocatorOps {
 public:
  std::size_t capacity = SIZE_MAX, used = 0;
  std::set<void*> captured_streams;
  std::vector<std::size_t> mallocs;
  std::vector<void*> frees;
  struct Event {
    void* stream;
    bool done = false;
  };
  std::vector<Event*> events;
  int live_events = 0, syncs = 0;
  std::uintptr_t next = 0x1000;
  std::unordered_map<void*, std::size_t> sizes;

  void* malloc(std::size_t n) override {
    if (used + n > capacity) return nullptr;
    used += n;
    mallocs.push_back(n);
    void* p = reinterpret_cast<void*>(next);
    next += n + 0x100;
    sizes[p] = n;
    return p;
  }
  int mallocs_in_capture = 0;
  void* malloc_in_capture(std::size_t n) override {
    ++mallocs_in_capture;
    return malloc(n);
  }
  void free(void* p) noexcept override {
    frees_in_capture += thread_capturing();
    used -= sizes[p];
    frees.push_back(p);
  }
  bool capturing(void* stream) noexcept override { return captured_streams.count(stream) > 0; }
  void* thread_stream = nullptr;  // the calling thread's current stream
  bool thread_capturing() noexcept override { return capturing(thread_stream); }
  // A free while the thread's stream captures would end the capture: counted as a failure.
  int frees_in_capture = 0;
  std::unordered_map<void*, uint64_t> ids;  // a handle's id, unless the test gives it another
  uint64_t stream_id(void* stream) noexcept override {
    auto it = ids.find(stream);
    return it != ids.end() ? it->second : reinterpret_cast<uintptr_t>(stream);
  }
  void* record_event(void* stream) noexcept override {
    events.push_back(new Event{stream});
    ++live_events;
    return events.back();
  }
  bool event_done(void* e) noexcept override { return static_cast<Event*>(e)->done; }
  void release_event(void*) noexcept override { --live_events; }
  void synchronize() noexcept override {
    ++syncs;
    for (Event* e : events) e->done = true;
  }
  ~FakeDevice() override {
    for (Event* e : events) delete e;
  }
};

void* const kS1 = reinterpret_cast<void*>(0x11);
void* const kS2 = reinterpret_cast<void*>(0x22);

TEST(CachingAllocator, RoundsToSizeClasses) {
  EXPECT_EQ(CachingAllocator::round_size(0), 512u);
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size((1u << 20) - 1), 1u << 20);
  EXPECT_EQ(CachingAllocator::round_size(1u << 20), 2u << 20);
  EXPECT_EQ(CachingAllocator::round_size((2u << 20) + 1), 4u << 20);
}

// Same stream: the block comes back at once, without waiting for its event, and the device sees
// one malloc and no free.
TEST(CachingAllocator, ReusesOnTheSameStreamAtOnce) {
  FakeDevice dev;
  CachingAllocator a(dev);
  void* p = a.allocate(1000, kS1);
  a.release(p);
  EXPECT_EQ(a.stats().cached_blocks, 1u);
  EXPECT_EQ(a.allocate(900, kS1), p);  // same 1024-byte class
  EXPECT_EQ(dev.mallocs.size(), 1u);
  EXPECT_TRUE(dev.frees.empty());
  EXPECT_EQ(dev.live_events, 0);  // the release event went back when the block was taken
  EXPECT_EQ(a.stats().live_bytes, 1024u);
}

// Another stream: only once the event recorded at release has completed.
TEST(CachingAllocator, OtherStreamsWaitForTheReleaseEvent) {
  FakeDevice dev;
  CachingAllocator a(dev);
  void* p = a.allocate(4096, kS1);
  a.release(p);
  ASSERT_EQ(dev.events.size(), 1u);
  EXPECT_EQ(dev.events[0]->stream, kS1);
  void* q = a.allocate(4096, kS2);
  EXPECT_NE(q, p);  // S1's work may still use p
  dev.events[0]->done = true;
  void* r = a.allocate(4096, kS2);
  EXPECT_EQ(r, p);  // its event is done: reusable on S2, now S2's block
  a.release(r);
  EXPECT_EQ(dev.events.back()->stream, kS2);
}

// A destroyed stream's handle given to a new stream: another id, so the block waits for its event
// instead of being reused at once.
TEST(CachingAllocator, ReusedHandlesAreOtherStreams) {
  FakeDevice dev;
  CachingAllocator a(dev);
  void* p = a.allocate(4096, kS1);
  a.release(p);
  dev.ids[kS1] = 777;  // kS1 destroyed, its handle now names a new stream
  EXPECT_NE(a.allocate(4096, kS1), p);
  dev.events[0]->done = true;
  EXPECT_EQ(a.allocate(4096, kS1), p);
}

// Below 1 MiB only the exact class; above, a cached block at most a quarter larger (smallest
// first), never a smaller one.
TEST(CachingAllocator, TakesOnlyCloseSizes) {
  FakeDevice dev;
  CachingAllocator a(dev);
  void* small = a.allocate(2048, kS1);
  void* big = a.allocate(10u << 20, kS1);
  void* bigger = a.allocate(12u << 20, kS1);
  a.release(small);
  a.release(big);
  a.release(bigger);
  EXPECT_NE(a.allocate(1024, kS1), small);        // 1 KiB does not take a 2 KiB block
  EXPECT_EQ(a.allocate(9u << 20, kS1), big);      // 10 MiB for 10 MiB (rounded): smallest fit
  EXPECT_EQ(a.allocate(10u << 20, kS1), bigger);  // 12 MiB <= 10 * 1.25 MiB
  EXPECT_NE(a.allocate(4u << 20, kS1), nullptr);  // nothing cached fits: a new block
  EXPECT_EQ(dev.mallocs.size(), 5u);
}

// While the stream captures: fresh blocks, given back to the device, never cached; a cached
// block released during a capture goes to the device too; no event is recorded or queried.
TEST(CachingAllocator, CaptureBypassesTheCache) {
  FakeDevice dev;
  CachingAllocator a(dev);
  void* before = a.allocate(4096, kS1);
  void* cached = a.allocate(8192, kS1);
  a.release(cached);
  dev.captured_streams.insert(kS1);
  void* during = a.allocate(8192, kS1);
  EXPECT_NE(during, cached);             // not handed out from the cache during a capture
  EXPECT_EQ(dev.mallocs_in_capture, 1);  // relaxed mode: a global capture refuses cudaMalloc
  a.release(during);
  a.release(before);  // allocated before the capture, released during it
  // Neither freed (a cudaFree would end the capture) nor cached: the graph owns them for good.
  EXPECT_TRUE(dev.frees.empty());
  EXPECT_EQ(a.stats().graph_owned_blocks, 2u);
  EXPECT_EQ(a.stats().graph_owned_bytes,
            CachingAllocator::round_size(8192) + CachingAllocator::round_size(4096));
  EXPECT_EQ(dev.events.size(), 1u);  // only `cached`'s, before the capture
  dev.captured_streams.clear();
  EXPECT_EQ(a.allocate(8192, kS1), cached);
  void* made_in_capture = nullptr;
  dev.captured_streams.insert(kS2);
  made_in_capture = a.allocate(512, kS2);
  dev.captured_streams.clear();
  a.release(made_in_capture);  // the capture is over, but the graph may still address it
  EXPECT_TRUE(dev.frees.empty());
  EXPECT_EQ(a.stats().graph_owned_blocks, 3u);
  EXPECT_NE(a.allocate(512, kS2), made_in_capture);  // never handed out again
  a.empty_cache();  // frees the cache only: the graph may be replayed still
  EXPECT_EQ(std::count(dev.frees.begin(), dev.frees.end(), made_in_capture), 0);
  EXPECT_EQ(std::count(dev.frees.begin(), dev.frees.end(), during), 0);
}

// Under a capture hold (flashinfer bench's CUDA-graph timing), blocks a capture makes come from
// malloc_in_capture, and those released, like blocks released while their stream is captured (a
// cudaFree then would end the capture), are kept, not freed, until the last hold ends (after a
// synchronize): the graph writes them on every replay. Another stream's blocks are cached as
// ever, and a capture after the hold behaves as without one (its blocks the graph's for good).
TEST(CachingAllocator, CaptureHoldKeepsTheCapturesBlocksUntilItEnds) {
  FakeDevice dev;
  CachingAllocator a(dev);
  void* before = a.allocate(4096, kS1);
  void* other = a.allocate(4096, kS2);
  a.begin_capture_hold();
  a.begin_capture_hold();  // counted
  dev.captured_streams.insert(kS1);
  void* first = a.allocate(8192, kS1);
  a.release(first);
  void* second = a.allocate(8192, kS1);
  EXPECT_NE(second, first);  // a kept block is not handed out again
  a.release(second);
  void* still_live = a.allocate(512, kS1);
  EXPECT_EQ(dev.mallocs_in_capture, 3);
  a.release(before);  // made before the capture, released while its stream is captured
  a.release(other);   // another stream, not captured: to the cache with its event
  EXPECT_TRUE(dev.frees.empty());
  EXPECT_EQ(a.stats().cached_blocks, 1u);
  dev.captured_streams.clear();
  EXPECT_EQ(a.stats().held_blocks, 3u);
  EXPECT_EQ(a.stats().held_bytes,
            2 * CachingAllocator::round_size(8192) + CachingAllocator::round_size(4096));
  a.end_capture_hold();  // one hold is still on
  EXPECT_TRUE(dev.frees.empty());
  const int syncs = dev.syncs;
  a.end_capture_hold();
  EXPECT_EQ(dev.syncs, syncs + 1);  // the graph's work done before its blocks go
  EXPECT_EQ(dev.frees, (std::vector<void*>{first, second, before}));
  EXPECT_EQ(a.stats().held_blocks, 0u);
  EXPECT_EQ(a.stats().device_frees, 3u);
  a.release(still_live);  // live through the hold, released after it: to the device
  EXPECT_EQ(dev.frees.back(), still_live);
  dev.captured_streams.insert(kS1);
  void* later = a.allocate(512, kS1);  // no hold: the graph's for good
  a.release(later);
  EXPECT_EQ(dev.mallocs_in_capture, 4);
  EXPECT_EQ(dev.frees.back(), still_live);  // not `later`
  EXPECT_EQ(a.stats().graph_owned_blocks, 1u);
  a.end_capture_hold();  // an extra end does nothing
  EXPECT_EQ(a.stats().held_blocks, 0u);
}

// A block a capture made without a hold stays its graph's even when released under a later
// hold (that hold's end says nothing of the earlier graph); one made under a hold and released
// after it goes back to the device.
TEST(CachingAllocator, ABlockKeepsTheHoldItWasMadeUnder) {
  FakeDevice dev;
  CachingAllocator a(dev);
  dev.captured_streams.insert(kS1);
  void* unheld = a.allocate(4096, kS1);
  a.begin_capture_hold();
  void* held = a.allocate(4096, kS1);
  dev.captured_streams.clear();
  a.release(unheld);
  EXPECT_EQ(a.stats().held_blocks, 0u);
  EXPECT_EQ(a.stats().graph_owned_blocks, 1u);
  a.end_capture_hold();
  EXPECT_TRUE(dev.frees.empty());
  a.release(held);
  EXPECT_EQ(dev.frees, std::vector<void*>{held});
  EXPECT_EQ(a.stats().graph_owned_blocks, 1u);
  EXPECT_EQ(a.stats().cached_blocks, 0u);
  EXPECT_EQ(dev.frees_in_capture, 0);
}

// A block made under a hold that has ended, released while the thread's stream captures again
// (a graph output outliving flashinfer bench's hold, dropped during a later capture), and a
// foreign pointer released then: the later graph may read them on every replay, and a cudaFree
// would end its capture. Under a hold they are kept until it ends; without one the graph owns
// them for good (before session 71 they were freed once the capture ended, under a graph that
// could still be replayed).
TEST(CachingAllocator, BlocksReleasedDuringACaptureAreTheGraphs) {
  for (const bool hold : {false, true}) {
    SCOPED_TRACE(hold ? "under a hold" : "no hold");
    FakeDevice dev;
    CachingAllocator a(dev);
    dev.thread_stream = kS1;
    a.begin_capture_hold();
    dev.captured_streams.insert(kS1);
    void* out = a.allocate(4096, kS1);
    dev.captured_streams.clear();
    a.end_capture_hold();
    void* foreign = dev.malloc(512);
    if (hold) a.begin_capture_hold();
    dev.captured_streams.insert(kS1);  // a later capture on the thread's stream
    a.release(out);
    a.release(foreign);
    EXPECT_TRUE(dev.frees.empty());
    EXPECT_EQ(a.stats().held_blocks, hold ? 2u : 0u);
    EXPECT_EQ(a.stats().graph_owned_blocks, hold ? 0u : 2u);
    dev.captured_streams.clear();
    void* next = a.allocate(512, kS2);  // the capture is over: still not freed
    a.release(next);
    EXPECT_EQ(dev.frees, std::vector<void*>{});
    if (hold) {
      a.end_capture_hold();  // the later graph is gone: both go back to the device
      EXPECT_EQ(dev.frees, (std::vector<void*>{out, foreign}));
    }
    EXPECT_EQ(dev.frees_in_capture, 0);
  }
}

// A hold that ends while the thread's stream captures another graph (an earlier graph's scope
// closing inside the next capture) frees nothing: the synchronize and the frees would end that
// capture, and its blocks may be that capture's graph's (made and released under the hold during
// it), which outlives the scope. They become the graphs' for good, as without a hold. (Before
// session 79 the end synchronized and freed inside the capture; a first fix deferred the frees
// to after it, under a graph that could still be replayed: a review found both.)
TEST(CachingAllocator, AHoldEndingDuringACaptureLeavesItsBlocksToTheGraphs) {
  FakeDevice dev;
  CachingAllocator a(dev);
  dev.thread_stream = kS1;
  a.begin_capture_hold();
  dev.captured_streams.insert(kS1);
  void* kept = a.allocate(4096, kS1);
  a.release(kept);
  EXPECT_EQ(a.stats().held_blocks, 1u);
  a.end_capture_hold();  // while the stream is still captured
  EXPECT_EQ(dev.syncs, 0);
  EXPECT_TRUE(dev.frees.empty());
  EXPECT_EQ(a.stats().held_blocks, 0u);
  EXPECT_EQ(a.stats().graph_owned_blocks, 1u);
  dev.captured_streams.clear();
  a.empty_cache();
  a.begin_capture_hold();
  a.end_capture_hold();
  EXPECT_TRUE(dev.frees.empty()) << "freed under a graph that may still be replayed";
  EXPECT_EQ(dev.frees_in_capture, 0);
}

// While the calling thread's stream is captured, neither empty_cache nor an out-of-memory retry
// synchronizes the device or frees a cached block (either would end the capture): the cache is
// emptied once the capture is over.
TEST(CachingAllocator, NoSynchronizeDuringTheThreadsCapture) {
  FakeDevice dev;
  dev.capacity = 8u << 20;
  CachingAllocator a(dev);
  dev.thread_stream = kS1;
  void* p = a.allocate(4u << 20, kS2);
  a.release(p);
  dev.captured_streams.insert(kS1);
  a.empty_cache();
  EXPECT_EQ(a.allocate(6u << 20, kS2), nullptr);  // out of memory, and no retry now
  EXPECT_EQ(dev.syncs, 0);
  EXPECT_TRUE(dev.frees.empty());
  EXPECT_EQ(a.stats().cached_blocks, 1u);
  dev.captured_streams.clear();
  a.empty_cache();
  EXPECT_EQ(dev.syncs, 1);
  EXPECT_EQ(dev.frees, std::vector<void*>{p});
  EXPECT_EQ(a.stats().device_frees, 1u);
  EXPECT_EQ(dev.frees_in_capture, 0);
  EXPECT_EQ(dev.live_events, 0);
}

// Out of memory: every cached block is freed (after a device synchronize) and the allocation
// tried again; nullptr only when even that fails.
TEST(CachingAllocator, OutOfMemoryFreesTheCacheAndRetries) {
  FakeDevice dev;
  dev.capacity = 8u << 20;
  CachingAllocator a(dev);
  void* p = a.allocate(4u << 20, kS1);
  a.release(p);
  void* q = a.allocate(6u << 20, kS2);  // 4 MiB cached + 6 MiB > 8 MiB
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(dev.syncs, 1);
  EXPECT_EQ(dev.frees, std::vector<void*>{p});
  EXPECT_EQ(a.stats().cached_blocks, 0u);
  EXPECT_EQ(dev.live_events, 0);
  EXPECT_EQ(a.allocate(4u << 20, kS1), nullptr);  // 6 MiB live: no room, nothing to free
  a.release(q);
  a.empty_cache();
  EXPECT_EQ(dev.used, 0u);
  const auto st = a.stats();
  EXPECT_EQ(st.device_mallocs, 2u);
  EXPECT_EQ(st.device_frees, 2u);
  EXPECT_EQ(st.live_blocks, 0u);
}

// A pointer the cache did not hand out goes straight to the device.
TEST(CachingAllocator, ForeignPointersGoToTheDevice) {
  FakeDevice dev;
  CachingAllocator a(dev);
  void* foreign = dev.malloc(512);
  a.release(foreign);
  EXPECT_EQ(dev.frees, std::vector<void*>{foreign});
  a.release(nullptr);
  EXPECT_EQ(dev.frees.size(), 1u);
}

#if FLASHINFER_TEST_HAVE_CUDART
// On a GPU, through Tensor: a dead tensor's block comes back at once on its stream; on another
// stream not while the work queued before its death is pending (held here by a host function
// that waits for the test), and then once it has run; the allocator's event query leaves no error
// behind for the caller's next launch check; values written into reused blocks are right.
void CUDART_CB wait_for(void* flag) {
  auto* f = static_cast<std::atomic<bool>*>(flag);
  while (!f->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST(CachingAllocatorCuda, TensorsReuseBlocksInStreamOrder) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const char* env = std::getenv("FLASHINFER_CUDA_CACHING_ALLOCATOR");
  if (env != nullptr && std::string_view(env) == "0") GTEST_SKIP() << "cache turned off";
  const Device g = Device::cuda(0);
  void* const prev = current_cuda_stream();
  cudaStream_t s1 = nullptr, s2 = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  {
    set_current_cuda_stream(s1);
    void* p = nullptr;
    {
      Tensor a = Tensor::empty({3 << 18}, DType::kFloat32, g);  // 3 MiB
      p = a.data_ptr();
    }
    Tensor b = Tensor::empty({3 << 18}, DType::kFloat32, g);
    EXPECT_EQ(b.data_ptr(), p) << "same stream, same size: the block comes back at once";

    // b dies behind a host function that holds s1 until the flag is set.
    std::atomic<bool> go{false};
    ASSERT_EQ(cudaLaunchHostFunc(s1, wait_for, &go), cudaSuccess);
    void* held = b.data_ptr();
    b = Tensor();
    set_current_cuda_stream(s2);
    Tensor c = Tensor::empty({3 << 18}, DType::kFloat32, g);
    EXPECT_NE(c.data_ptr(), held) << "s1's work before the block's death is still pending";
    EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess) << "the allocator left its event query's error";
    go = true;
    ASSERT_EQ(cudaStreamSynchronize(s1), cudaSuccess);
    Tensor d =
        Tensor::from_vector(std::vector<double>(3 << 18, 2.5), {3 << 18}, DType::kFloat32).to(g);
    EXPECT_EQ(d.data_ptr(), held) << "s1's work done: the block serves s2";
    const auto v = d.to(Device::cpu()).to_double_vector();
    EXPECT_EQ(v.front(), 2.5);
    EXPECT_EQ(v.back(), 2.5);
    ASSERT_EQ(cudaStreamSynchronize(s2), cudaSuccess);
  }
  set_current_cuda_stream(prev);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}
#endif

}  // namespace
}  // namespace flashinfer::testing
