#include "recorder/ring_heap.h"

#include <pthread.h>
#include <sys/mman.h>

#include <array>
#include <bit>
#include <mutex>
#include <vector>

#include "core/sanitizers.h"

namespace flashinfer::recorder::internal {
namespace {

constexpr std::size_t kLine = 64;  // every block starts a cache line: no object shares one
// Whole lines up to kSmallBytes (64 classes), then powers of two up to kMaxBytes.
constexpr std::size_t kSmallBytes = 4096;
constexpr std::size_t kLineClasses = kSmallBytes / kLine;
constexpr std::size_t kClasses =
    kLineClasses + std::countr_zero(RingHeap::kMaxBytes) - std::countr_zero(kSmallBytes);
static_assert(std::has_single_bit(RingHeap::kMaxBytes) && RingHeap::kMaxBytes >= kSmallBytes);

std::size_t class_of(std::size_t n) {
  if (n <= kSmallBytes) return n == 0 ? 0 : (n - 1) / kLine;
  return kLineClasses - 1 + std::bit_width(n - 1) - std::countr_zero(kSmallBytes);
}

std::size_t class_bytes(std::size_t c) {
  if (c < kLineClasses) return (c + 1) * kLine;
  return kSmallBytes << (c - kLineClasses + 1);
}

struct FreeBlock {
  FreeBlock* next;
};

class Heap {
 public:
  // fork() waits for a thread inside the heap, so no child starts with its lock held by a thread
  // it does not have (glibc's malloc does the same for its own locks).
  void lock() { mu_.lock(); }
  void unlock() { mu_.unlock(); }

  void* take(std::size_t n) {
    const std::size_t c = class_of(n);
    std::lock_guard<std::mutex> l(mu_);
    if (FreeBlock* b = free_[c]) {
      free_[c] = b->next;
      return b;
    }
    const std::size_t bytes = class_bytes(c);
    if (left_ < bytes && !grow()) return nullptr;
    void* p = next_;
    next_ += bytes;
    left_ -= bytes;
    return p;
  }
  // False when `p` is not in a region (it came from operator new).
  bool give(void* p, std::size_t n) noexcept {
    std::lock_guard<std::mutex> l(mu_);
    if (!in_regions_locked(p)) return false;
    auto* b = static_cast<FreeBlock*>(p);
    b->next = free_[class_of(n)];
    free_[class_of(n)] = b;
    return true;
  }
  std::size_t mapped() {
    std::lock_guard<std::mutex> l(mu_);
    return regions_.size() * RingHeap::kRegionBytes;
  }
  bool owns(const void* p) {
    std::lock_guard<std::mutex> l(mu_);
    return in_regions_locked(p);
  }

 private:
  bool in_regions_locked(const void* p) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    for (uintptr_t r : regions_) {
      if (a >= r && a < r + RingHeap::kRegionBytes) return true;
    }
    return false;
  }

  // Maps one more region on a huge-page boundary (twice the size, the slack unmapped), so the
  // kernel can back it with one huge page.
  bool grow() {
    constexpr std::size_t kR = RingHeap::kRegionBytes;
    void* m = ::mmap(nullptr, 2 * kR, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return false;
    const auto at = reinterpret_cast<uintptr_t>(m);
    const uintptr_t base = (at + kR - 1) & ~(uintptr_t{kR} - 1);
    if (base > at) ::munmap(m, base - at);
    if (base + kR < at + 2 * kR) {
      ::munmap(reinterpret_cast<void*>(base + kR), at + 2 * kR - (base + kR));
    }
    // Advice only: where huge pages are off ("never"), the region is ordinary pages.
    (void)::madvise(reinterpret_cast<void*>(base), kR, MADV_HUGEPAGE);
    regions_.push_back(base);
    next_ = reinterpret_cast<uint8_t*>(base);
    left_ = kR;
    return true;
  }

  std::mutex mu_;
  std::array<FreeBlock*, kClasses> free_{};
  uint8_t* next_ = nullptr;
  std::size_t left_ = 0;
  std::vector<uintptr_t> regions_;
};

// Never destroyed: blocks may be freed during static destruction.
Heap& heap() {
  static Heap* h = [] {
    auto* made = new Heap;
    ::pthread_atfork([] { heap().lock(); }, [] { heap().unlock(); }, [] { heap().unlock(); });
    return made;
  }();
  return *h;
}

}  // namespace

void* RingHeap::allocate(std::size_t n) {
#ifndef FLASHINFER_ASAN
  if (n <= kMaxBytes) {
    if (void* p = heap().take(n)) return p;
  }
#endif
  return ::operator new (n, std::align_val_t{kLine});
}

void RingHeap::deallocate(void* p, [[maybe_unused]] std::size_t n) noexcept {
  if (!p) return;
#ifndef FLASHINFER_ASAN
  // A small block outside the regions came from operator new (a region could not be mapped).
  if (n <= kMaxBytes && heap().give(p, n)) return;
#endif
  ::operator delete (p, std::align_val_t{kLine});
}

std::size_t RingHeap::region_bytes() { return heap().mapped(); }

bool RingHeap::owns(const void* p) { return heap().owns(p); }

}  // namespace flashinfer::recorder::internal
