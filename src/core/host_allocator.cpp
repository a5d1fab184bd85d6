#include "core/host_allocator.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "flashinfer/error.h"
#include "flashinfer/tensor.h"

#if defined(__SANITIZE_ADDRESS__)
#define FLASHINFER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FLASHINFER_ASAN 1
#endif
#endif
#ifdef FLASHINFER_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace flashinfer {
namespace {

// Blocks below this go straight to malloc: glibc's arenas already reuse them.
constexpr std::size_t kMinCachedBytes = std::size_t{1} << 20;
constexpr std::size_t kDefaultLimitMiB = 1024;

// Large requests are rounded up to one of eight classes per power of two (at most 12.5 % more
// than asked), so a block freed by one call fits the next call of a nearby size.
std::size_t size_class(std::size_t n) {
  const int top = std::bit_width(n) - 1;  // 2^top <= n
  const std::size_t step = std::size_t{1} << (top - 3);
  return (n + step - 1) / step * step;
}

std::size_t limit_from_env() {
  const char* env = std::getenv("FLASHINFER_HOST_CACHE_MB");
  if (!env || !*env) return kDefaultLimitMiB << 20;
  char* end = nullptr;
  const unsigned long long mib = std::strtoull(env, &end, 10);
  if (end == env || *end != '\0') return kDefaultLimitMiB << 20;  // unparsable: the default
  return static_cast<std::size_t>(std::min<unsigned long long>(mib, ~std::size_t{0} >> 20)) << 20;
}

void poison(void* p, std::size_t n) {
#ifdef FLASHINFER_ASAN
  ASAN_POISON_MEMORY_REGION(p, n);  // a use after free of a cached block is still reported
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

class HostCache {
 public:
  void* take(std::size_t capacity) {
    std::lock_guard lock(mu_);
    auto it = free_.find(capacity);
    if (it == free_.end() || it->second.empty()) {
      ++misses_;
      return nullptr;
    }
    void* p = it->second.back();
    it->second.pop_back();
    cached_ -= capacity;
    ++hits_;
    unpoison(p, capacity);
    return p;
  }

  // False when the block does not fit under the limit: the caller frees it.
  bool put(void* p, std::size_t capacity) {
    std::lock_guard lock(mu_);
    if (cached_ + capacity > limit_) return false;
    poison(p, capacity);
    free_[capacity].push_back(p);
    cached_ += capacity;
    return true;
  }

  std::size_t trim_to(std::size_t target) {
    std::vector<std::pair<void*, std::size_t>> release;
    std::size_t released = 0;
    {
      std::lock_guard lock(mu_);
      for (auto& [cap, blocks] : free_) {
        while (cached_ > target && !blocks.empty()) {
          release.emplace_back(blocks.back(), cap);
          blocks.pop_back();
          cached_ -= cap;
          released += cap;
        }
      }
    }
    for (auto [p, cap] : release) {
      unpoison(p, cap);
      std::free(p);
    }
    return released;
  }

  void set_limit(std::size_t bytes) {
    {
      std::lock_guard lock(mu_);
      limit_ = bytes;
    }
    trim_to(bytes);
  }

  HostCacheStats stats() {
    std::lock_guard lock(mu_);
    return {cached_, limit_, hits_, misses_};
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::size_t cached_ = 0;
  std::size_t limit_ = limit_from_env();
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
  // 64-byte alignment for vector loads; never a null pointer, even for 0 bytes.
  std::size_t cap = (std::max<std::size_t>(nbytes, 1) + 63) / 64 * 64;
  if (cap >= kMinCachedBytes) {
    cap = size_class(cap);
    if (void* p = cache().take(cap)) {
      *capacity = cap;
      return p;
    }
  }
  void* p = std::aligned_alloc(64, cap);
  if (!p) {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "Tensor.empty", "", "out of host memory (", nbytes,
                    " bytes)");
  }
  *capacity = cap;
  return p;
}

void host_free(void* p, std::size_t capacity) {
  if (capacity >= kMinCachedBytes && cache().put(p, capacity)) return;
  std::free(p);
}

}  // namespace detail

HostCacheStats host_cache_stats() { return cache().stats(); }

std::size_t empty_host_cache() { return cache().trim_to(0); }

void set_host_cache_limit(std::size_t bytes) { cache().set_limit(bytes); }

}  // namespace flashinfer
