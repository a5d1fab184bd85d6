#include "kernels/cpu/ulysses_cpu.h"

#include <atomic>
#include <cstring>

#include "kernels/cpu/comm_wait.h"

namespace flashinfer::kernels::cpu {
namespace {

uint32_t* signal_words(void* signal) { return static_cast<uint32_t*>(signal); }

// Upstream's barrier for one block (here block 0 only: one thread does a rank's whole call).
void barrier(const UlyssesA2aParams& p, const char* op) {
  uint32_t* own = signal_words(p.peer_signal[p.rank]);
  // Every peer's counter is bumped alike; the first's value is the barrier's number.
  uint32_t val = 0;
  for (int t = 0; t < p.world_size; ++t) val = ++own[UlyssesSignal::self_word(0, t)];
  for (int t = 0; t < p.world_size; ++t) {
    std::atomic_ref<uint32_t>(
        signal_words(p.peer_signal[t])[UlyssesSignal::peer_word(val, 0, p.rank)])
        .store(val, std::memory_order_release);
  }
  const auto deadline = peer_wait_deadline();
  for (int t = 0; t < p.world_size; ++t) {
    wait_for_peer_flag(own[UlyssesSignal::peer_word(val, 0, t)], val, deadline, op, "fa", p.rank, t,
                       " at the barrier (did every rank make the same call?)");
  }
}

}  // namespace

void ulysses_a2a(const UlyssesA2aParams& p, const char* op) {
  const auto eb = static_cast<std::size_t>(p.elem_bytes);
  const auto row_bytes = static_cast<std::size_t>(p.row_elems()) * eb;
  barrier(p, op);  // every peer's previous call is out of its staging buffer
  const auto* in = static_cast<const char*>(p.inp);
  for (int64_t row = 0; row < p.rows(); ++row) {
    auto* dst = static_cast<char*>(p.peer_out[p.row_peer(row)]);
    std::memcpy(dst + static_cast<std::size_t>(p.dst_offset(row)) * eb,
                in + static_cast<std::size_t>(p.src_offset(row)) * eb, row_bytes);
  }
  barrier(p, op);  // every peer's rows are in this rank's staging buffer
  std::memcpy(p.out, p.peer_out[p.rank], static_cast<std::size_t>(p.numel()) * eb);
}

}  // namespace flashinfer::kernels::cpu
