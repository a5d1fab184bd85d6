// Private: memory for the ring recorder's small objects (recorder/ring.cpp) on transparent huge
// pages.
//
// A decode step's hooks touch a few dozen lines of the ring's own state per call (the recycled
// call, its file layouts and blob list, the kept blobs and their control blocks, the arenas'
// buffers), every one of them cold after the step's GEMMs streamed the weights through the cache.
// Allocated by malloc, those objects lie among the process's other small blocks in thousands of
// 4 KiB pages, and each cold line was a TLB miss as well (a nested page walk in a virtual machine).
// Taken from 2 MiB regions advised MADV_HUGEPAGE instead, they lie in a handful of huge pages
// (docs/PERFORMANCE.md, session 20).
//
// Blocks up to kMaxBytes come from per-size free lists over those regions (sizes rounded up to
// whole 64-byte lines up to 4 KiB, then to a power of two); larger ones from operator new. Every
// block is 64-byte aligned. The regions are never given back (the ring's small objects are
// bounded by its length, and freed blocks are reused). Under AddressSanitizer every block comes
// from operator new, so that uses after free are still reported. fork() waits for a thread inside
// the heap (pthread_atfork, as glibc's malloc does for its own lock): a child can keep recording.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>

namespace flashinfer::recorder::internal {

class RingHeap {
 public:
  static constexpr std::size_t kMaxBytes = std::size_t{256} << 10;
  static constexpr std::size_t kRegionBytes = std::size_t{2} << 20;  // one huge page

  static void* allocate(std::size_t n);
  static void deallocate(void* p, std::size_t n) noexcept;
  // Bytes of huge-page regions mapped so far (tests, docs).
  static std::size_t region_bytes();
  // Whether `p` lies in one of the regions (tests).
  static bool owns(const void* p);
};

// A standard allocator over RingHeap (std::allocate_shared, containers).
template <class T>
struct RingAlloc {
  using value_type = T;
  RingAlloc() = default;
  template <class U>
  RingAlloc(const RingAlloc<U>&) noexcept {}  // NOLINT: rebinding is implicit by design
  T* allocate(std::size_t n) {
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(RingHeap::allocate(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept { RingHeap::deallocate(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const RingAlloc<U>&) const noexcept {
    return true;
  }
};

}  // namespace flashinfer::recorder::internal
