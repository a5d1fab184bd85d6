#include "core/caching_allocator.h"

namespace flashinfer::detail {

std::size_t CachingAllocator::round_size(std::size_t nbytes) {
  constexpr std::size_t kSmall = 512, kLarge = std::size_t{2} << 20, kSplit = std::size_t{1} << 20;
  if (nbytes == 0) return kSmall;
  const std::size_t unit = nbytes < kSplit ? kSmall : kLarge;
  return (nbytes + unit - 1) / unit * unit;
}

void* CachingAllocator::allocate(std::size_t nbytes, void* stream) {
  const std::size_t size = round_size(nbytes);
  std::unique_lock<std::mutex> lock(mu_);
  // During a capture the graph may address the block on every replay: a fresh one, never cached,
  // and no event queries (a capture in global mode forbids them).
  const bool capture = ops_.capturing(stream);
  const uint64_t id = capture ? CachingAllocatorOps::kNoStreamId : ops_.stream_id(stream);
  if (!capture) {
    const std::size_t limit = size < (std::size_t{1} << 20) ? size : size + size / 4;
    for (auto it = cached_.lower_bound(size); it != cached_.end() && it->first <= limit; ++it) {
      Block& b = it->second.second;
      const bool same = id != CachingAllocatorOps::kNoStreamId && b.stream_id == id;
      if (!same && !(b.event != nullptr && ops_.event_done(b.event))) continue;
      void* p = it->second.first;
      if (b.event != nullptr) ops_.release_event(b.event);
      Block taken = b;
      taken.event = nullptr;
      taken.stream = stream;
      taken.stream_id = id;
      cached_bytes_ -= taken.size;
      cached_.erase(it);
      live_bytes_ += taken.size;
      live_.emplace(p, taken);
      return p;
    }
  }
  void* p = capture ? ops_.malloc_in_capture(size) : ops_.malloc(size);
  // Out of memory: the cached blocks go back to the device and the allocation is tried again.
  // Not while this thread's stream captures (the synchronize would end that capture), and the
  // synchronize and frees run unlocked: other threads' allocations need not wait for the device
  // (one of them may be what a running kernel waits for: a collective's peer).
  if (p == nullptr && !cached_.empty() && !capture && !ops_.thread_capturing()) {
    std::vector<std::pair<void*, void*>> taken = take_cached_locked();
    lock.unlock();
    free_taken(taken);
    lock.lock();
    p = ops_.malloc(size);
  }
  if (p == nullptr) return nullptr;
  ++device_mallocs_;
  Block b;
  b.size = size;
  b.stream = stream;
  b.stream_id = id;
  b.uncached = capture;
  b.made_under_hold = capture && holds_ > 0;
  live_bytes_ += size;
  live_.emplace(p, b);
  return p;
}

void CachingAllocator::release(void* p) noexcept {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  Block b;
  const bool ours = it != live_.end();
  if (ours) {
    b = it->second;
    live_.erase(it);
    live_bytes_ -= b.size;
  }
  // A block a capture made, or one released while a capture is on (its stream's, or this
  // thread's), may be read or written by that graph on every replay; a cudaFree then would also
  // end the capture. Made under a capture hold, or released while one is on: kept until the
  // hold ends (its graph is gone then: released after that, it goes back to the device).
  // Otherwise the graph owns it for good, never freed nor handed out again: nothing says when the
  // graph is gone (a PyTorch graph's private pool lives as long as its graph).
  const auto keep = [&](std::size_t size, bool made_under_hold, bool uncached) {
    if (holds_ > 0 && (made_under_hold || !uncached)) {
      held_.emplace_back(p, size);
      held_bytes_ += size;
    } else {
      ++graph_owned_blocks_;
      graph_owned_bytes_ += size;
    }
  };
  // Asked only where a block would go back to the device, or a cached one's stream may capture.
  const bool thread_capture = (!ours || b.uncached) && ops_.thread_capturing();
  if (!ours) {  // not ours (cudaMalloc'd outside the cache): straight back, unless a capture is on
    if (thread_capture) {
      keep(0, /*made_under_hold=*/true, /*uncached=*/true);
    } else {
      ops_.free(p);
      ++device_frees_;
    }
    return;
  }
  if (b.uncached ? !b.made_under_hold || holds_ > 0 || thread_capture : ops_.capturing(b.stream)) {
    return keep(b.size, b.made_under_hold, b.uncached);
  }
  if (!b.uncached) b.event = ops_.record_event(b.stream);
  if (b.event == nullptr) {  // made under a hold now ended, or no event could be recorded
    ops_.free(p);
    ++device_frees_;
    return;
  }
  cached_bytes_ += b.size;
  cached_.emplace(b.size, std::make_pair(p, b));
}

std::vector<std::pair<void*, void*>> CachingAllocator::take_cached_locked() noexcept {
  std::vector<std::pair<void*, void*>> taken;
  taken.reserve(cached_.size());
  for (auto& [size, entry] : cached_) taken.emplace_back(entry.first, entry.second.event);
  cached_.clear();
  cached_bytes_ = 0;
  return taken;
}

void CachingAllocator::free_taken(const std::vector<std::pair<void*, void*>>& taken) noexcept {
  if (taken.empty()) return;
  ops_.synchronize();
  for (const auto& [p, event] : taken) {
    if (event != nullptr) ops_.release_event(event);
    ops_.free(p);
  }
  std::lock_guard<std::mutex> lock(mu_);
  device_frees_ += taken.size();
}

void CachingAllocator::begin_capture_hold() {
  std::lock_guard<std::mutex> lock(mu_);
  ++holds_;
}

void CachingAllocator::end_capture_hold() noexcept {
  // A hold may end while this thread captures another graph (the scope of an earlier graph
  // closing): the synchronize and the frees would end that capture, and the blocks kept may be
  // that graph's (made or released under the hold during its capture), which outlives this
  // scope. They become the graphs' for good then, as blocks a capture leaves without a hold.
  const bool capturing = ops_.thread_capturing();
  std::vector<std::pair<void*, std::size_t>> kept;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (holds_ > 0) --holds_;
    if (holds_ > 0 || held_.empty()) return;
    kept.swap(held_);
    held_bytes_ = 0;
    if (capturing) {
      for (const auto& [p, size] : kept) {
        ++graph_owned_blocks_;
        graph_owned_bytes_ += size;
      }
      return;
    }
  }
  // Synchronized and freed outside the lock: other threads' allocations need not wait for the
  // device (one of them may be what a running kernel waits for: a collective's peer).
  ops_.synchronize();
  for (const auto& [p, size] : kept) ops_.free(p);
  std::lock_guard<std::mutex> lock(mu_);
  device_frees_ += kept.size();
}

void CachingAllocator::empty_cache() noexcept {
  // During this thread's capture the synchronize would end it: nothing is freed then.
  if (ops_.thread_capturing()) return;
  std::vector<std::pair<void*, void*>> taken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    taken = take_cached_locked();
  }
  free_taken(taken);
}

CachingAllocator::Stats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.cached_blocks = cached_.size();
  s.cached_bytes = cached_bytes_;
  s.live_blocks = live_.size();
  s.live_bytes = live_bytes_;
  s.device_mallocs = device_mallocs_;
  s.device_frees = device_frees_;
  s.held_blocks = held_.size();
  s.held_bytes = held_bytes_;
  s.graph_owned_blocks = graph_owned_blocks_;
  s.graph_owned_bytes = graph_owned_bytes_;
  return s;
}

}  // namespace flashinfer::detail
