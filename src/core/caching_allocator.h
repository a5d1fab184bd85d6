// Private: the policy of the CUDA tensor allocator, a stream-ordered cache of device blocks in
// the manner of PyTorch's caching allocator. A tensor's memory goes back to the cache when the
// tensor dies instead of to cudaFree (which synchronizes the whole device, so every op returning
// a fresh tensor stalled the host for the GPU), and a later allocation reuses it:
//   - on the stream it was allocated on (the block's stream), at once: work queued later on that
//     stream runs after every earlier use of the block there;
//   - on another stream only once an event recorded on the block's stream at release has
//     completed.
// As with PyTorch, a tensor used on a stream other than the one current at its allocation must
// outlive that use (or the caller synchronizes), else the block can be reused too early.
// CUDA-graph capture: blocks allocated while the stream captures are made in relaxed capture
// mode (a global-mode capture refuses a plain cudaMalloc: an op's temporary would end it), and
// those, like blocks released while their stream captures, never go to the cache nor back to the
// device (a cudaFree would end the capture, and the graph may write the block on every replay):
// under a capture hold they wait for the hold's end, otherwise the graph owns them for good, as
// a PyTorch graph owns its private pool. No event is recorded or queried for them.
// The policy is written against an interface (CachingAllocatorOps) so it is unit-tested on the
// CPU with a fake device (tests/core/test_caching_allocator.cpp); core/cuda_runtime.cpp gives it
// the CUDA runtime. FLASHINFER_CUDA_CACHING_ALLOCATOR=0 turns the cache off (every block straight
// to cudaMalloc / cudaFree).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace flashinfer::detail {

/// What the cache needs from a device. Streams and events are opaque handles.
class CachingAllocatorOps {
 public:
  virtual ~CachingAllocatorOps() = default;
  /// Device memory of exactly `nbytes`, or nullptr when the device is out of memory (other
  /// failures throw).
  virtual void* malloc(std::size_t nbytes) = 0;
  /// As malloc, while the stream is being captured: the CUDA side lets the allocation run in
  /// relaxed capture mode (a thread-local or global capture otherwise refuses it), as PyTorch's
  /// allocator does for its graph pools.
  virtual void* malloc_in_capture(std::size_t nbytes) { return malloc(nbytes); }
  virtual void free(void* p) noexcept = 0;
  /// Whether `stream` is being captured into a graph now.
  virtual bool capturing(void* stream) noexcept = 0;
  /// Whether the calling thread's current stream is being captured now (a free then would end
  /// that capture, whatever stream the block was made on).
  virtual bool thread_capturing() noexcept { return false; }
  /// The stream's process-unique id (cudaStreamGetId: a destroyed stream's handle may come back
  /// for a new stream, its id does not), or kNoStreamId when it cannot be had.
  virtual uint64_t stream_id(void* stream) noexcept = 0;
  static constexpr uint64_t kNoStreamId = ~uint64_t{0};
  /// An event recorded on `stream` now, or nullptr when it cannot be recorded.
  virtual void* record_event(void* stream) noexcept = 0;
  /// Whether the work before `event` has completed.
  virtual bool event_done(void* event) noexcept = 0;
  virtual void release_event(void* event) noexcept = 0;
  /// Waits for all work on the device (before cached blocks are freed for real).
  virtual void synchronize() noexcept = 0;
};

class CachingAllocator {
 public:
  explicit CachingAllocator(CachingAllocatorOps& ops) : ops_(ops) {}
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  /// The size a request is served with: a multiple of 512 bytes below 1 MiB, of 2 MiB above.
  static std::size_t round_size(std::size_t nbytes);

  /// A block of at least `nbytes` for work on `stream`. A cached block is taken when it is no
  /// more than a quarter larger than the rounded request (exact size classes below 1 MiB), the
  /// smallest such first, and usable on `stream` (above). Otherwise a new block; when the device
  /// is out of memory, every cached block is freed and the allocation tried once more. Returns
  /// nullptr only when the device is out of memory even then.
  void* allocate(std::size_t nbytes, void* stream);
  /// Gives `p` (from allocate) back: to the cache with an event on its stream, or to the device.
  void release(void* p) noexcept;
  /// Frees every cached block (after synchronizing the device, outside the lock); nothing while
  /// the calling thread's stream is captured (the synchronize would end the capture).
  void empty_cache() noexcept;

  /// A capture hold (counted; flashinfer bench's CUDA-graph timing takes one around its capture
  /// and replays): while one is on, blocks allocated during a capture are made by
  /// malloc_in_capture, and those released are kept instead of freed, because the graph
  /// addresses them on every replay; the last end_capture_hold frees them (after synchronizing
  /// the device), when the graph is gone; when it ends while the calling thread's stream is being
  /// captured (the synchronize and frees would end that capture, and the blocks may be that
  /// capture's graph's) they become the graphs' for good, as without a hold
  /// (Stats::graph_owned_*): never freed, never handed out again.
  void begin_capture_hold();
  void end_capture_hold() noexcept;

  struct Stats {
    std::size_t cached_blocks = 0, cached_bytes = 0;            // in the cache, free
    std::size_t live_blocks = 0, live_bytes = 0;                // handed out
    uint64_t device_mallocs = 0, device_frees = 0;              // calls of ops.malloc / ops.free
    std::size_t held_blocks = 0, held_bytes = 0;                // released under a capture hold
    std::size_t graph_owned_blocks = 0, graph_owned_bytes = 0;  // captured, released, no hold
  };
  Stats stats() const;

 private:
  struct Block {
    std::size_t size = 0;
    void* stream = nullptr;
    uint64_t stream_id = CachingAllocatorOps::kNoStreamId;
    void* event = nullptr;         // cached blocks: recorded at release
    bool uncached = false;         // allocated during a capture: never cached
    bool made_under_hold = false;  // ... while a capture hold was on
  };
  // The cached blocks (pointer, event), taken out of the cache under the lock; free_taken then
  // synchronizes the device and frees them without it.
  std::vector<std::pair<void*, void*>> take_cached_locked() noexcept;
  void free_taken(const std::vector<std::pair<void*, void*>>& taken) noexcept;

  CachingAllocatorOps& ops_;
  mutable std::mutex mu_;
  std::multimap<std::size_t, std::pair<void*, Block>> cached_;  // by size
  std::unordered_map<void*, Block> live_;
  std::vector<std::pair<void*, std::size_t>> held_;  // released under a capture hold
  int holds_ = 0;
  std::size_t cached_bytes_ = 0, live_bytes_ = 0, held_bytes_ = 0;
  std::size_t graph_owned_blocks_ = 0, graph_owned_bytes_ = 0;
  uint64_t device_mallocs_ = 0, device_frees_ = 0;
};

}  // namespace flashinfer::detail
