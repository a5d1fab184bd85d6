// The ring recorder's heap for its small objects (src/recorder/ring_heap.h): blocks are
// 64-byte-aligned inside 2 MiB-aligned regions, a freed block is handed out again for its size
// class, larger blocks and standard containers work, and blocks never overlap.
#include "core/sanitizers.h"
#include "recorder/ring_heap.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <thread>
#include <utility>
#include <vector>

namespace {

namespace ri = flashinfer::recorder::internal;
using ri::RingHeap;

uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(RingHeap, BlocksAreWholeLinesInHugePageRegions) {
#ifdef FLASHINFER_ASAN
  GTEST_SKIP() << "under AddressSanitizer every block comes from operator new";
#else
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (std::size_t n :
       {std::size_t{1}, std::size_t{8}, std::size_t{63}, std::size_t{64}, std::size_t{65},
        std::size_t{200}, std::size_t{1000}, std::size_t{4095}, std::size_t{4096},
        std::size_t{4097}, std::size_t{100000}, RingHeap::kMaxBytes}) {
    void* p = RingHeap::allocate(n);
    EXPECT_EQ(addr(p) % 64, 0u) << n;
    EXPECT_TRUE(RingHeap::owns(p)) << n;
    std::memset(p, 0xab, n);  // the whole block is writable
    blocks.emplace_back(p, n);
  }
  EXPECT_GE(RingHeap::region_bytes(), RingHeap::kRegionBytes);
  EXPECT_EQ(RingHeap::region_bytes() % RingHeap::kRegionBytes, 0u);
  // No two live blocks overlap.
  std::sort(blocks.begin(), blocks.end());
  for (std::size_t i = 1; i < blocks.size(); ++i) {
    EXPECT_LE(addr(blocks[i - 1].first) + blocks[i - 1].second, addr(blocks[i].first));
  }
  for (auto [p, n] : blocks) RingHeap::deallocate(p, n);
#endif
}

// Whether a block of `asked` bytes is the one just freed after `freed` bytes were asked for.
[[maybe_unused]] bool reuses(std::size_t freed, std::size_t asked) {
  void* a = RingHeap::allocate(freed);
  RingHeap::deallocate(a, freed);
  void* b = RingHeap::allocate(asked);
  RingHeap::deallocate(b, asked);
  return a == b;
}

TEST(RingHeap, AFreedBlockIsReusedForItsSize) {
#ifdef FLASHINFER_ASAN
  GTEST_SKIP() << "under AddressSanitizer every block comes from operator new";
#else
  // 257, 300 and 320 bytes are all five lines: one free list; 64 bytes is another.
  EXPECT_TRUE(reuses(300, 320));
  EXPECT_TRUE(reuses(320, 257));
  EXPECT_FALSE(reuses(320, 64));
  // Above 4 KiB the sizes are rounded up to a power of two: 5000 and 8192 bytes share a list,
  // 8193 bytes does not.
  EXPECT_TRUE(reuses(5000, 8192));
  EXPECT_FALSE(reuses(5000, 8193));
#endif
}

TEST(RingHeap, LargeBlocksComeFromOperatorNewAligned) {
  for (std::size_t n : {RingHeap::kMaxBytes + 1, std::size_t{1} << 20}) {
    void* p = RingHeap::allocate(n);
    EXPECT_EQ(addr(p) % 64, 0u);
    EXPECT_FALSE(RingHeap::owns(p));
    std::memset(p, 1, n);
    RingHeap::deallocate(p, n);
  }
}

TEST(RingHeap, ManyBlocksSpanRegionsWithoutOverlap) {
  // 3000 blocks of 1 KiB: more than one 2 MiB region.
  std::vector<uint32_t*> blocks;
  std::set<uintptr_t> seen;
  for (uint32_t i = 0; i < 3000; ++i) {
    auto* p = static_cast<uint32_t*>(RingHeap::allocate(1024));
    std::fill(p, p + 256, i);
    EXPECT_TRUE(seen.insert(addr(p)).second);
    blocks.push_back(p);
  }
  // Every block still holds what was written into it: none was handed out twice.
  for (uint32_t i = 0; i < blocks.size(); ++i) {
    ASSERT_TRUE(std::all_of(blocks[i], blocks[i] + 256, [i](uint32_t v) { return v == i; })) << i;
  }
#ifndef FLASHINFER_ASAN
  EXPECT_GE(RingHeap::region_bytes(), 2 * RingHeap::kRegionBytes);
#endif
  for (uint32_t* p : blocks) RingHeap::deallocate(p, 1024);
}

TEST(RingHeap, ContainersAndSharedObjects) {
  std::vector<int64_t, ri::RingAlloc<int64_t>> v;
  for (int64_t i = 0; i < 100000; ++i) v.push_back(i * 3);  // grows past kMaxBytes
  for (int64_t i = 0; i < 100000; ++i) ASSERT_EQ(v[static_cast<std::size_t>(i)], i * 3);
  struct Obj {
    int64_t a[20];
    explicit Obj(int64_t x) {
      for (auto& e : a) e = x;
    }
  };
  auto s = std::allocate_shared<Obj>(ri::RingAlloc<Obj>{}, 7);
  std::weak_ptr<Obj> w = s;
  EXPECT_EQ(s->a[19], 7);
  s.reset();
  EXPECT_TRUE(w.expired());
}

// A child forked while another thread is inside the heap can still use it: fork() waits for
// the heap's lock (without that, a child started with the lock held would hang here).
TEST(RingHeap, AForkedChildCanAllocateWhileAnotherThreadWas) {
#ifdef FLASHINFER_ASAN
  // There every block is operator new's, and a child forked while another thread is inside the
  // sanitizer's allocator hangs in it (clang 14's does not wait at fork): not the heap's lock.
  GTEST_SKIP() << "under AddressSanitizer the heap is operator new";
#endif
  // The heap is set up (and its fork handlers registered) by its first use, here: a fork while
  // another thread runs a function-local static's initializer would hang the child on the
  // initializer's guard, whatever the heap does.
  RingHeap::deallocate(RingHeap::allocate(64), 64);
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      void* p = RingHeap::allocate(128);
      RingHeap::deallocate(p, 128);
    }
  });
  int hung = 0, failed = 0;
  for (int i = 0; i < 40; ++i) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      void* p = RingHeap::allocate(128);
      RingHeap::deallocate(p, 128);
      _exit(p ? 0 : 1);
    }
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    pid_t done = 0;
    while ((done = waitpid(child, &status, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (done == 0) {
      ++hung;
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      break;  // one is enough
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failed;
    }
  }
  stop = true;
  churn.join();
  EXPECT_EQ(hung, 0);
  EXPECT_EQ(failed, 0);
}

}  // namespace
