// The CPU allocator's cache of large host blocks (host_cache_stats, empty_host_cache,
// set_host_cache_limit): reuse by size class, the limit, release, and that reuse never shows
// through (zeros() is still zero, a freed block is not handed out twice).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "core/sanitizers.h"
#include "flashinfer/flashinfer.h"

namespace flashinfer {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// Starts from an empty cache with the default limit and restores it afterwards.
struct CacheScope {
  CacheScope() { reset(); }
  ~CacheScope() { reset(); }
  static void reset() {
    set_host_cache_limit(std::size_t{1024} << 20);
    empty_host_cache();
  }
};

TEST(HostCache, LargeBlockIsReusedBySizeClass) {
  CacheScope scope;
  const HostCacheStats s0 = host_cache_stats();
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({4 * kMiB}, DType::kUInt8);
    first = t.data_ptr();
    EXPECT_EQ(host_cache_stats().misses, s0.misses + 1);
  }
  EXPECT_EQ(host_cache_stats().cached_bytes, std::size_t(4 * kMiB));
  {
    // 1000 bytes less: the same class (just under 4 MiB rounds up in steps of 256 KiB).
    Tensor t = Tensor::empty({4 * kMiB - 1000}, DType::kUInt8);
    EXPECT_EQ(t.data_ptr(), first);
    EXPECT_EQ(host_cache_stats().hits, s0.hits + 1);
    EXPECT_EQ(host_cache_stats().cached_bytes, 0u);
    // While it is in use a second one of the class is a new block.
    Tensor u = Tensor::empty({4 * kMiB}, DType::kUInt8);
    EXPECT_NE(u.data_ptr(), first);
  }
  EXPECT_EQ(host_cache_stats().cached_bytes, std::size_t(8 * kMiB));
  // Another class (5 MiB) does not take a 4 MiB block.
  Tensor v = Tensor::empty({5 * kMiB}, DType::kUInt8);
  EXPECT_EQ(host_cache_stats().cached_bytes, std::size_t(8 * kMiB));
  EXPECT_EQ(host_cache_stats().misses, s0.misses + 3);
}

TEST(HostCache, OversizedRequestsAreRefusedByName) {
  CacheScope scope;
  // Bytes that do not fit in size_t, or no real machine has: an Error, never a tiny block.
  for (const Shape& shape : std::vector<Shape>{{int64_t{1} << 62},
                                               {int64_t{1} << 40, int64_t{1} << 40},
                                               {(int64_t{1} << 62) - (int64_t{1} << 57)}}) {
    try {
      Tensor t = Tensor::empty(shape, DType::kFloat32);
      ADD_FAILURE() << "allocated " << t.numel() << " elements";
    } catch (const Error& e) {
      EXPECT_EQ(e.op(), "Tensor.empty");
    }
  }
  // A zero dimension makes any other dimension fine.
  EXPECT_EQ(Tensor::empty({int64_t{1} << 62, 0}, DType::kFloat32).numel(), 0);
}

TEST(HostCache, EvictsOldestBlocksToKeepNewOnes) {
  CacheScope scope;
  set_host_cache_limit(std::size_t(8 * kMiB));
  {
    Tensor a = Tensor::empty({3 * kMiB}, DType::kUInt8);
    Tensor b = Tensor::empty({4 * kMiB}, DType::kUInt8);
    Tensor c = Tensor::empty({2 * kMiB}, DType::kUInt8);
  }
  // Freed in reverse order of declaration: c (2 MiB), b (4), a (3): 9 MiB > 8, so c, the oldest,
  // made room for a.
  EXPECT_EQ(host_cache_stats().cached_bytes, std::size_t(7 * kMiB));
  const HostCacheStats s0 = host_cache_stats();
  { Tensor again = Tensor::empty({2 * kMiB}, DType::kUInt8); }  // c's class: gone
  EXPECT_EQ(host_cache_stats().misses, s0.misses + 1);
  { Tensor again = Tensor::empty({3 * kMiB}, DType::kUInt8); }  // a's block: kept
  EXPECT_EQ(host_cache_stats().hits, s0.hits + 1);
}

TEST(HostCache, SmallBlocksBypassTheCache) {
  CacheScope scope;
  const HostCacheStats s0 = host_cache_stats();
  { Tensor t = Tensor::empty({kMiB / 2}, DType::kUInt8); }
  const HostCacheStats s1 = host_cache_stats();
  EXPECT_EQ(s1.cached_bytes, 0u);
  EXPECT_EQ(s1.hits, s0.hits);
  EXPECT_EQ(s1.misses, s0.misses);
}

TEST(HostCache, LimitIsRespectedAndZeroDisables) {
  CacheScope scope;
  set_host_cache_limit(std::size_t(8 * kMiB));
  {
    std::vector<Tensor> ts;
    for (int i = 0; i < 3; ++i) ts.push_back(Tensor::empty({4 * kMiB}, DType::kUInt8));
  }
  EXPECT_EQ(host_cache_stats().cached_bytes, std::size_t(8 * kMiB));  // the third was freed
  EXPECT_EQ(host_cache_stats().limit_bytes, std::size_t(8 * kMiB));
  set_host_cache_limit(std::size_t(4 * kMiB));  // trims to the new limit
  EXPECT_EQ(host_cache_stats().cached_bytes, std::size_t(4 * kMiB));
  set_host_cache_limit(0);
  EXPECT_EQ(host_cache_stats().cached_bytes, 0u);
  { Tensor t = Tensor::empty({4 * kMiB}, DType::kUInt8); }
  EXPECT_EQ(host_cache_stats().cached_bytes, 0u);
}

TEST(HostCache, EmptyReleasesEverything) {
  CacheScope scope;
  {
    Tensor a = Tensor::empty({2 * kMiB}, DType::kUInt8),
           b = Tensor::empty({3 * kMiB}, DType::kUInt8);
  }
  EXPECT_EQ(empty_host_cache(), std::size_t(5 * kMiB));
  EXPECT_EQ(host_cache_stats().cached_bytes, 0u);
  EXPECT_EQ(empty_host_cache(), 0u);
}

TEST(HostCache, ReusedBlockIsStillZeroedByZeros) {
  CacheScope scope;
  {
    Tensor t = Tensor::empty({2 * kMiB}, DType::kUInt8);
    std::memset(t.data_ptr(), 0xAB, 2 * kMiB);
  }
  Tensor z = Tensor::zeros({kMiB / 2}, DType::kFloat32);  // 2 MiB: the block just freed
  EXPECT_EQ(host_cache_stats().cached_bytes, 0u);
  const auto* f = z.data<float>();
  int64_t nonzero = 0;
  for (int64_t i = 0; i < kMiB / 2; ++i) nonzero += f[i] != 0.0f;
  EXPECT_EQ(nonzero, 0);
}

TEST(HostCache, ConcurrentAllocationsNeverShareABlock) {
  CacheScope scope;
  constexpr int kThreads = 4, kRounds = 50;
  std::vector<std::thread> threads;
  std::vector<int64_t> bad(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &bad] {
      for (int r = 0; r < kRounds; ++r) {
        Tensor x = Tensor::empty({kMiB + (r % 3) * kMiB / 4}, DType::kUInt8);
        auto* p = x.data<uint8_t>();
        std::memset(p, t, x.numel());
        std::this_thread::yield();
        for (int64_t i = 0; i < x.numel(); i += 4096) bad[t] += p[i] != t;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
  EXPECT_LE(host_cache_stats().cached_bytes, host_cache_stats().limit_bytes);
}

#ifdef FLASHINFER_ASAN
// A cached block is poisoned: touching it through a stale pointer is still a reported error.
TEST(HostCacheDeathTest, UseAfterFreeOfACachedBlockIsReported) {
  CacheScope scope;
  EXPECT_DEATH(
      {
        volatile uint8_t* stale = nullptr;
        {
          Tensor t = Tensor::empty({2 * kMiB}, DType::kUInt8);
          stale = t.data<uint8_t>();
        }
        stale[100] = 1;
      },
      "use-after-poison");
}

// The rounding slack past what the tensor asked for is poisoned too.
TEST(HostCacheDeathTest, OverflowIntoTheSizeClassSlackIsReported) {
  CacheScope scope;
  EXPECT_DEATH(
      {
        Tensor t = Tensor::empty({4 * kMiB + 100}, DType::kUInt8);  // class: 4.5 MiB
        static_cast<volatile uint8_t*>(t.data<uint8_t>())[4 * kMiB + 200] = 1;
      },
      "use-after-poison");
}
#endif

}  // namespace
}  // namespace flashinfer
