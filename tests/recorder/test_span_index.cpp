// The ring mode's flat span index (src/recorder/span_index.h): exact lookups, range erasure,
// growth, collisions and backward-shift deletion, checked against a plain list of the spans.
#include "recorder/span_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

namespace {

using flashinfer::recorder::internal::SpanIndex;

struct Span {
  int64_t device;
  uintptr_t lo;
  uint64_t bytes;
  int value;
};

const auto kAlways = [](const int&) { return true; };

// Every span of `ref` is found with its value, and nothing else is in the index.
void expect_same(SpanIndex<int>& idx, const std::vector<Span>& ref) {
  ASSERT_EQ(idx.size(), ref.size());
  for (const Span& s : ref) {
    const int* v = idx.find(s.device, s.lo, s.bytes);
    ASSERT_NE(v, nullptr) << s.lo << " " << s.bytes;
    EXPECT_EQ(*v, s.value);
  }
}

TEST(SpanIndexTest, FindsExactlyTheSpanPut) {
  SpanIndex<int> idx(9);  // spans under 512 bytes
  EXPECT_EQ(idx.find(0, 4096, 300), nullptr);
  idx.put(0, 4096, 300, 7, kAlways);
  idx.put(0, 4096, 400, 8, kAlways);  // the same first byte, another length: another span
  idx.put(1, 4096, 300, 9, kAlways);  // another device
  ASSERT_EQ(idx.size(), 3u);
  EXPECT_EQ(*idx.find(0, 4096, 300), 7);
  EXPECT_EQ(*idx.find(0, 4096, 400), 8);
  EXPECT_EQ(*idx.find(1, 4096, 300), 9);
  EXPECT_EQ(idx.find(0, 4097, 300), nullptr);
  EXPECT_EQ(idx.find(2, 4096, 300), nullptr);
  idx.put(0, 4096, 300, 70, kAlways);  // replaced, not added
  EXPECT_EQ(idx.size(), 3u);
  EXPECT_EQ(*idx.find(0, 4096, 300), 70);
}

TEST(SpanIndexTest, AWriteErasesExactlyTheSpansItOverlaps) {
  SpanIndex<int> idx(9);
  // Spans of 256..511 bytes, 1 KiB apart, on device 0, and the same addresses on device 1.
  for (int i = 0; i < 20; ++i) {
    idx.put(0, 0x10000 + 1024 * static_cast<uintptr_t>(i), 256 + 10 * i, i, kAlways);
    idx.put(1, 0x10000 + 1024 * static_cast<uintptr_t>(i), 256 + 10 * i, 100 + i, kAlways);
  }
  // [span 3's last byte, span 5's first byte]: spans 3, 4 and 5 of device 0 only.
  const uintptr_t a = 0x10000 + 3 * 1024 + (256 + 30) - 1;
  const uintptr_t b = 0x10000 + 5 * 1024 + 1;
  idx.erase_overlapping(0, a, b);
  EXPECT_EQ(idx.size(), 37u);
  for (int i = 0; i < 20; ++i) {
    const uintptr_t lo = 0x10000 + 1024 * static_cast<uintptr_t>(i);
    EXPECT_EQ(idx.find(0, lo, 256 + 10 * i) == nullptr, i >= 3 && i <= 5) << i;
    EXPECT_NE(idx.find(1, lo, 256 + 10 * i), nullptr) << i;
  }
  // A write that ends where a span starts, or starts where one ends, does not reach it.
  idx.erase_overlapping(0, 0x10000 + 6 * 1024 - 8, 0x10000 + 6 * 1024);
  idx.erase_overlapping(0, 0x10000 + 6 * 1024 + 256 + 60, 0x10000 + 6 * 1024 + 600);
  EXPECT_NE(idx.find(0, 0x10000 + 6 * 1024, 256 + 60), nullptr);
  // A write covering every region (more regions than slots): the scan path.
  idx.erase_overlapping(1, 0, UINTPTR_MAX);
  EXPECT_EQ(idx.size(), 17u);
  EXPECT_EQ(idx.find(1, 0x10000, 256), nullptr);
}

TEST(SpanIndexTest, GrowsAndDropsDeadEntriesWhenItGrows) {
  SpanIndex<int> idx(13);
  std::vector<Span> ref;
  for (int i = 0; i < 1000; ++i) {
    const Span s{0, 0x100000 + 5000 * static_cast<uintptr_t>(i), 4096 + static_cast<uint64_t>(i),
                 i};
    idx.put(s.device, s.lo, s.bytes, s.value, kAlways);
    ref.push_back(s);
  }
  EXPECT_GE(idx.capacity(), 2000u);  // at most half full
  expect_same(idx, ref);
  // Entries whose payload is dead are dropped by the next growth, not carried over.
  SpanIndex<int> small(13);
  for (int i = 0; i < 8; ++i) small.put(0, 64 * static_cast<uintptr_t>(i), 4096, i, kAlways);
  ASSERT_EQ(small.capacity(), 16u);
  small.put(0, 9999, 4096, 100, [](const int& v) { return v >= 6; });
  EXPECT_EQ(small.size(), 3u);  // 6, 7 and the new one
  EXPECT_EQ(small.find(0, 0, 4096), nullptr);
  EXPECT_EQ(*small.find(0, 64 * 7, 4096), 7);
  EXPECT_EQ(*small.find(0, 9999, 4096), 100);
}

TEST(SpanIndexTest, CollidingSpansSurviveErasuresInTheirCluster) {
  // Shift 30: every span below 1 GiB is in region 0, so all of them share one home slot and
  // form one cluster; erasing from its middle must keep the rest findable (backward shift).
  SpanIndex<int> idx(30);
  std::vector<Span> ref;
  for (int i = 0; i < 12; ++i) {
    const Span s{0, 4096 * static_cast<uintptr_t>(i + 1), 100, i};
    idx.put(s.device, s.lo, s.bytes, s.value, kAlways);
    ref.push_back(s);
  }
  for (int i : {5, 0, 11, 6}) {
    idx.erase_if_at(0, 4096 * static_cast<uintptr_t>(i + 1), 100, kAlways);
    std::erase_if(ref, [&](const Span& s) { return s.value == i; });
    expect_same(idx, ref);
  }
  // erase_if_at leaves an entry whose payload the predicate refuses.
  idx.erase_if_at(0, 4096 * 3, 100, [](const int&) { return false; });
  expect_same(idx, ref);
  // A range erase inside the cluster.
  idx.erase_overlapping(0, 4096 * 3 + 50, 4096 * 5 + 1);  // spans 2, 3 and 4
  std::erase_if(ref, [](const Span& s) { return s.value >= 2 && s.value <= 4; });
  expect_same(idx, ref);
}

TEST(SpanIndexTest, RandomOperationsMatchAPlainList) {
  std::mt19937_64 rng(15);
  SpanIndex<int> idx(12);  // spans of 2 KiB up to 4 KiB, as class 11 holds
  std::vector<Span> ref;
  for (int step = 0; step < 4000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    const int64_t dev = static_cast<int64_t>(rng() % 2);
    const uintptr_t lo = 0x200000 + (rng() % 512) * 256;
    const uint64_t bytes = 2048 + rng() % 2048;
    if (op < 6) {
      idx.put(dev, lo, bytes, step, kAlways);
      std::erase_if(
          ref, [&](const Span& s) { return s.device == dev && s.lo == lo && s.bytes == bytes; });
      ref.push_back({dev, lo, bytes, step});
    } else if (op < 9) {
      const uintptr_t a = 0x200000 + rng() % (600 * 256);
      const uintptr_t b = a + 1 + rng() % (op == 8 ? 200000 : 3000);
      idx.erase_overlapping(dev, a, b);
      std::erase_if(
          ref, [&](const Span& s) { return s.device == dev && s.lo < b && s.lo + s.bytes > a; });
    } else if (!ref.empty()) {
      const Span s = ref[rng() % ref.size()];
      idx.erase_if_at(s.device, s.lo, s.bytes, kAlways);
      std::erase_if(ref, [&](const Span& x) {
        return x.device == s.device && x.lo == s.lo && x.bytes == s.bytes;
      });
    }
    if (step % 97 == 0) expect_same(idx, ref);
  }
  expect_same(idx, ref);
  // find_enclosing: an entry holding the queried bytes whenever the list has one, never
  // another, and only among those the predicate accepts.
  for (int q = 0; q < 2000; ++q) {
    const int64_t dev = static_cast<int64_t>(rng() % 2);
    const uintptr_t lo = 0x200000 + rng() % (600 * 256);
    const uint64_t bytes = 1 + rng() % 4096;
    const bool odd_only = q % 2 == 1;
    const auto ok = [&](const SpanIndex<int>::Entry& e) { return !odd_only || e.value % 2 == 1; };
    const SpanIndex<int>::Entry* e = idx.find_enclosing(dev, lo, bytes, ok);
    const bool any = std::any_of(ref.begin(), ref.end(), [&](const Span& s) {
      return s.device == dev && s.lo <= lo && s.lo + s.bytes >= lo + bytes &&
             (!odd_only || s.value % 2 == 1);
    });
    ASSERT_EQ(e != nullptr, any) << lo << " " << bytes;
    if (e) {
      EXPECT_EQ(e->device, dev);
      EXPECT_LE(e->lo, lo);
      EXPECT_GE(e->lo + e->bytes, lo + bytes);
      EXPECT_TRUE(ok(*e));
    }
  }
  idx.retain([](const SpanIndex<int>::Entry& e) { return e.device == 1; });
  std::erase_if(ref, [](const Span& s) { return s.device != 1; });
  expect_same(idx, ref);
  idx.clear();
  EXPECT_EQ(idx.size(), 0u);
  EXPECT_EQ(idx.find(1, 0x200000, 2048), nullptr);
}

}  // namespace
