#include "core/host_allocator.h"

#include "core/settings.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <mutex>
#include <new>
#include <string>

#include "core/sanitizers.h"
#include "flashinfer/error.h"
#include "flashinfer/tensor.h"

#ifdef FLASHINFER_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace flashinfer {
namespace {

// Blocks below this go straight to malloc: glibc's arenas already reuse them.
constexpr std::size_t kMinCachedBytes = std::size_t{1} << 20;
constexpr std::size_t kDefaultLimitMiB = 1024;
// Largest request served: anything larger is refused before any size arithmetic can wrap.
constexpr std::size_t kMaxBytes = PTRDIFF_MAX / 2;

// Large requests are rounded up to one of eight classes per power of two (at most 12.5 % more
// than asked), so a block freed by one call fits the next call of a nearby size.
std::size_t size_class(std::size_t n) {
  const int top = std::bit_width(n) - 1;  // 2^top <= n
  const std::size_t step = std::size_t{1} << (top - 3);
  return (n + step - 1) / step * step;
}

std::size_t limit_from_env() {
  const detail::Settings& settings = detail::load_settings();  // the one FLASHINFER_* parser
  if (const auto* p = settings.problem("FLASHINFER_HOST_CACHE_MB")) {
    std::fprintf(stderr, "[flashinfer] warning: %s; using %zu\n", p->message.c_str(),
                 kDefaultLimitMiB);
  }
  if (!settings.host_cache_mb) return kDefaultLimitMiB << 20;
  return static_cast<std::size_t>(*settings.host_cache_mb) << 20;
}

// Under AddressSanitizer the bytes of a block past what the tensor asked for, and whole blocks
// while cached, are poisoned: overflows into the rounding slack and uses of a freed tensor's
// block are still reported (as use-after-poison).
void poison(void* p, std::size_t n) {
#ifdef FLASHINFER_ASAN
  ASAN_POISON_MEMORY_REGION(p, n);
#else
  (void)p, (void)n;
#endif
}

void unpoison(void* p, std::size_t n) {
#ifdef FLASHINFER_ASAN
  ASAN_UNPOISON_MEMORY_REGION(p, n);
#else
  (void)p, (void)n;
#endif
}

struct Block {
  void* p;
  std::size_t capacity;
};

class HostCache {
 public:
  bool enabled() const { return limit_.load(std::memory_order_relaxed) > 0; }

  void* take(std::size_t capacity) {
    std::lock_guard lock(mu_);
    // Most recently freed first: its pages are the likeliest to be in cache and TLB.
    for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {
      if (it->capacity != capacity) continue;
      void* p = it->p;
      blocks_.erase(std::next(it).base());
      cached_ -= capacity;
      ++hits_;
      return p;
    }
    ++misses_;
    return nullptr;
  }

  // False when the block cannot be kept (larger than the limit, or no memory for the entry):
  // the caller frees it. Older blocks are evicted to make room.
  bool put(void* p, std::size_t capacity) noexcept {
    std::list<Block> evicted;
    {
      std::lock_guard lock(mu_);
      const std::size_t limit = limit_.load(std::memory_order_relaxed);
      if (capacity > limit) return false;
      while (cached_ + capacity > limit && !blocks_.empty()) {
        cached_ -= blocks_.front().capacity;
        evicted.splice(evicted.end(), blocks_, blocks_.begin());
      }
      try {
        blocks_.push_back({p, capacity});
      } catch (const std::bad_alloc&) {
        return false;
      }
      cached_ += capacity;
      poison(p, capacity);
    }
    release(evicted);
    return true;
  }

  // Frees cached blocks, oldest first, until at most min(target, limit) bytes stay cached.
  std::size_t trim_to(std::size_t target) {
    std::list<Block> evicted;
    std::size_t released = 0;
    {
      std::lock_guard lock(mu_);
      target = std::min(target, limit_.load(std::memory_order_relaxed));
      while (cached_ > target && !blocks_.empty()) {
        cached_ -= blocks_.front().capacity;
        released += blocks_.front().capacity;
        evicted.splice(evicted.end(), blocks_, blocks_.begin());
      }
    }
    release(evicted);
    return released;
  }

  void set_limit(std::size_t bytes) {
    limit_.store(bytes, std::memory_order_relaxed);
    trim_to(bytes);
  }

  HostCacheStats stats() {
    std::lock_guard lock(mu_);
    return {cached_, limit_.load(std::memory_order_relaxed), hits_, misses_};
  }

 private:
  static void release(std::list<Block>& blocks) {
    for (const Block& b : blocks) {
      unpoison(b.p, b.capacity);
      std::free(b.p);
    }
  }

  std::mutex mu_;
  std::list<Block> blocks_;  // cached blocks, least recently freed first
  std::size_t cached_ = 0;
  std::atomic<std::size_t> limit_{limit_from_env()};
  uint64_t hits_ = 0, misses_ = 0;
};

// Never destroyed: tensors held by static objects are freed after static destruction starts.
HostCache& cache() {
  static HostCache* c = new HostCache;
  return *c;
}

}  // namespace

namespace detail {

void* host_alloc(std::size_t nbytes, std::size_t* capacity) {
  if (nbytes > kMaxBytes) {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "Tensor.empty", "", "cannot allocate ", nbytes,
                    " bytes of host memory");
  }
  // 64-byte alignment for vector loads; never a null pointer, even for 0 bytes.
  std::size_t cap = (std::max<std::size_t>(nbytes, 1) + 63) / 64 * 64;
  const bool cacheable = cap >= kMinCachedBytes && cache().enabled();
  if (cacheable) {
    cap = size_class(cap);
    if (void* p = cache().take(cap)) {
      unpoison(p, nbytes);
      *capacity = cap;
      return p;
    }
  }
  void* p = std::aligned_alloc(64, cap);
  if (!p && empty_host_cache() > 0) p = std::aligned_alloc(64, cap);  // memory held for reuse
  if (!p) {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "Tensor.empty", "", "out of host memory (", nbytes,
                    " bytes)");
  }
  poison(static_cast<char*>(p) + nbytes, cap - nbytes);
  *capacity = cap;
  return p;
}

void host_free(void* p, std::size_t capacity) {
  // Blocks allocated while the cache was off are not of a size class: no request would fit.
  if (capacity >= kMinCachedBytes && capacity == size_class(capacity) && cache().put(p, capacity)) {
    return;
  }
  unpoison(p, capacity);
  std::free(p);
}

}  // namespace detail

HostCacheStats host_cache_stats() { return cache().stats(); }

std::size_t empty_host_cache() { return cache().trim_to(0); }

void set_host_cache_limit(std::size_t bytes) { cache().set_limit(bytes); }

}  // namespace flashinfer
