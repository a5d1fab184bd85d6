// Private: the ring mode's index of kept spans (recorder/ring.cpp, docs/LOGGING.md "Ring mode").
// An open-addressed table with its entries inline (about a cache line each), keyed by device, first
// byte and length. It replaces a std::map per size class: a decode step's GEMMs evict every
// structure the hooks touch between two calls, and a tree walk was one cold line per level
// (sessions 14-15), where a probe here is one line.
//
// Every span in one index is shorter than 2^shift bytes (the ring keeps one index per size
// class, with regions of at least 4 KiB so that a write of a few pages probes a few regions of
// every class), so a write [a, b) can only overlap spans starting in (a - 2^shift, b). Entries are
// placed by their region (first byte >> shift) and device: a range query probes the clusters
// of the regions that range covers, or, when those are more than the table's slots, scans the
// table once.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace flashinfer::recorder::internal {

// `Alloc`: the table's memory (the ring's: its huge-page heap, recorder/ring_heap.h).
template <typename Payload, typename Alloc = std::allocator<Payload>>
class SpanIndex {
 public:
  struct Entry {
    uintptr_t lo = 0;
    uint64_t bytes = 0;  // 0: an empty slot (kept spans are never empty)
    int64_t device = 0;
    Payload value{};
  };
  using Slots =
      std::vector<Entry, typename std::allocator_traits<Alloc>::template rebind_alloc<Entry>>;

  explicit SpanIndex(unsigned shift = 63) : shift_(shift) {}

  std::size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  std::size_t capacity() const { return slots_.size(); }

  /// The entry of exactly this span, or null.
  Payload* find(int64_t device, uintptr_t lo, uint64_t bytes) {
    if (count_ == 0) return nullptr;
    for (std::size_t i = home(device, lo);; i = (i + 1) & mask_) {
      Entry& e = slots_[i];
      if (e.bytes == 0) return nullptr;
      if (e.lo == lo && e.bytes == bytes && e.device == device) return &e.value;
    }
  }

  /// An entry of `device` whose span holds all of [lo, lo + bytes) and for which
  /// `ok(const Entry&)` holds, or null: the same probes as a write of those bytes.
  template <typename Ok>
  Entry* find_enclosing(int64_t device, uintptr_t lo, uint64_t bytes, Ok&& ok) {
    if (count_ == 0 || bytes == 0) return nullptr;
    const uintptr_t b = lo + bytes;
    const uint64_t r0 = region(lowest_start_reaching(b)), r1 = region(lo);
    if (r1 < r0 || r1 - r0 >= slots_.size() / 2) return nullptr;
    for (uint64_t r = r0;; ++r) {
      for (std::size_t i = home_of_region(device, r); slots_[i].bytes != 0; i = (i + 1) & mask_) {
        Entry& e = slots_[i];
        if (region(e.lo) == r && e.device == device && e.lo <= lo && e.lo + e.bytes >= b && ok(e)) {
          return &e;
        }
      }
      if (r == r1) break;
    }
    return nullptr;
  }

  /// Sets the entry of this span (replacing one that is there). `alive(const Payload&)` tells
  /// which entries a growth of the table may drop (their blob is gone).
  template <typename Alive>
  Payload& put(int64_t device, uintptr_t lo, uint64_t bytes, Payload value, Alive&& alive) {
    if (Payload* p = find(device, lo, bytes)) {
      *p = std::move(value);
      return *p;
    }
    // At most half full: the clusters a probe walks stay short. Dead entries go on growth,
    // so the table is sized by the live spans.
    if ((count_ + 1) * 2 > slots_.size()) {
      std::size_t live = 0;
      for (const Entry& e : slots_) live += e.bytes != 0 && alive(e.value) ? 1 : 0;
      rebuild(std::max<std::size_t>(16, std::bit_ceil((live + 1) * 4)),
              [&](const Entry& e) { return alive(e.value); });
    }
    std::size_t i = home(device, lo);
    while (slots_[i].bytes != 0) i = (i + 1) & mask_;
    slots_[i] = Entry{lo, bytes, device, std::move(value)};
    ++count_;
    return slots_[i].value;
  }

  /// Removes the entry of exactly this span when `pred(payload)` holds.
  template <typename Pred>
  void erase_if_at(int64_t device, uintptr_t lo, uint64_t bytes, Pred&& pred) {
    if (count_ == 0) return;
    for (std::size_t i = home(device, lo);; i = (i + 1) & mask_) {
      Entry& e = slots_[i];
      if (e.bytes == 0) return;
      if (e.lo == lo && e.bytes == bytes && e.device == device) {
        if (pred(e.value)) erase_at(i);
        return;
      }
    }
  }

  /// Removes every span of `device` overlapping [a, b).
  void erase_overlapping(int64_t device, uintptr_t a, uintptr_t b) {
    if (count_ == 0 || a >= b) return;
    const uint64_t r0 = region(lowest_start_reaching(a)), r1 = region(b - 1);
    const auto hit = [&](const Entry& e) {
      return e.device == device && e.lo < b && e.lo + e.bytes > a;
    };
    if (r1 - r0 >= slots_.size() / 2) {
      // More regions than a pass over the table costs: one pass, in place (an erase shifts
      // only entries of its own cluster back, so none skips the pass: the table is never full).
      for (std::size_t i = 0; i < slots_.size();) {
        if (slots_[i].bytes != 0 && hit(slots_[i])) {
          erase_at(i);
          if (count_ == 0) return;
        } else {
          ++i;
        }
      }
      return;
    }
    for (uint64_t r = r0;; ++r) {
      // The cluster holding region r's entries; an erase shifts a later entry into slot i,
      // which is then looked at again.
      for (std::size_t i = home_of_region(device, r); slots_[i].bytes != 0;) {
        const Entry& e = slots_[i];
        if (region(e.lo) == r && hit(e)) {
          erase_at(i);
          if (count_ == 0) return;
        } else {
          i = (i + 1) & mask_;
        }
      }
      if (r == r1) break;
    }
  }

  /// Keeps only the entries `keep(entry)` holds.
  template <typename Keep>
  void retain(Keep&& keep) {
    if (count_ != 0) rebuild(slots_.size(), [&](const Entry& e) { return keep(e); });
  }

  void clear() {
    slots_.clear();
    mask_ = 0;
    count_ = 0;
  }

 private:
  uint64_t region(uintptr_t lo) const { return shift_ >= 63 ? 0 : lo >> shift_; }
  // The lowest first byte a span in this index can have and still end at or past x: spans are
  // shorter than 2^shift, so such a span starts after x - 2^shift.
  uintptr_t lowest_start_reaching(uintptr_t x) const {
    const uintptr_t longest = shift_ >= 63 ? UINTPTR_MAX : uintptr_t{1} << shift_;
    return x >= longest ? x - longest + 1 : 0;
  }
  std::size_t home_of_region(int64_t device, uint64_t r) const {
    const uint64_t h =
        (r ^ (static_cast<uint64_t>(device) * 0xff51afd7ed558ccdull)) * 0x9e3779b97f4a7c15ull;
    return static_cast<std::size_t>(h >> 32) & mask_;
  }
  std::size_t home(int64_t device, uintptr_t lo) const {
    return home_of_region(device, region(lo));
  }

  // Backward-shift deletion (linear probing): later entries of the cluster that may sit in
  // slot i move into it, so no tombstones are left.
  void erase_at(std::size_t i) {
    for (std::size_t j = (i + 1) & mask_; slots_[j].bytes != 0; j = (j + 1) & mask_) {
      const std::size_t h = home(slots_[j].device, slots_[j].lo);
      // Entry j may move to i when its home is not cyclically within (i, j].
      const bool movable = i <= j ? (h <= i || h > j) : (h <= i && h > j);
      if (movable) {
        slots_[i] = std::move(slots_[j]);
        i = j;
      }
    }
    slots_[i] = Entry{};
    --count_;
  }

  template <typename Keep>
  void rebuild(std::size_t capacity, Keep&& keep) {
    Slots old(capacity);
    old.swap(slots_);
    mask_ = capacity - 1;
    count_ = 0;
    for (Entry& e : old) {
      if (e.bytes == 0 || !keep(e)) continue;
      std::size_t i = home(e.device, e.lo);
      while (slots_[i].bytes != 0) i = (i + 1) & mask_;
      slots_[i] = std::move(e);
      ++count_;
    }
  }

  Slots slots_;
  std::size_t mask_ = 0, count_ = 0;
  unsigned shift_;
};

}  // namespace flashinfer::recorder::internal
