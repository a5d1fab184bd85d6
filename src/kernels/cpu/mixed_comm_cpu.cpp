#include "kernels/cpu/mixed_comm_cpu.h"

#include <atomic>
#include <cstdint>
#include <cstring>

#include "flashinfer/float_formats.h"
#include "kernels/cpu/comm_wait.h"

namespace flashinfer::kernels::cpu {

void mixed_comm(const MixedCommParams& p) {
  char* mine = p.peer_buf[p.rank];
  std::atomic_ref<uint32_t> seq_ref(
      *reinterpret_cast<uint32_t*>(mine + MixedCommParams::kSeqOffset));
  const uint32_t seq = seq_ref.load(std::memory_order_relaxed) + 1;
  seq_ref.store(seq, std::memory_order_relaxed);
  const int64_t slot = MixedCommParams::kSlotsOffset + static_cast<int64_t>(seq & 1) * p.slot_bytes;
  if (p.n_in > 0) std::memcpy(mine + slot, p.x_in, static_cast<std::size_t>(p.n_in * 2));
  std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(mine + MixedCommParams::kFlagOffset))
      .store(seq, std::memory_order_release);
  const auto deadline = peer_wait_deadline();
  for (int r = 0; r < p.size; ++r) {
    // A peer may be a call ahead already (it waits only for this rank's call).
    wait_for_peer_flag(*reinterpret_cast<uint32_t*>(p.peer_buf[r] + MixedCommParams::kFlagOffset),
                       seq, deadline, "run_mixed_comm", "handler", p.rank, r,
                       "'s call (did every rank call run_mixed_comm with the same op?)");
  }
  auto bits = [&](int r, int64_t e) {
    uint16_t b;
    std::memcpy(&b, p.peer_buf[r] + slot + e * 2, 2);
    return b;
  };
  auto to_f = [&](uint16_t b) {
    return p.bf16 ? bfloat16_bits_to_float(b) : half_bits_to_float(b);
  };
  auto round = [&](float v) { return p.bf16 ? float_to_bfloat16_bits(v) : float_to_half_bits(v); };
  auto* out = static_cast<uint16_t*>(p.x_out);
#pragma omp parallel for schedule(static) if (p.n_out * p.size >= 65536)
  for (int64_t i = 0; i < p.n_out; ++i) out[i] = mixed_comm_output(p, i, bits, to_f, round);
}

}  // namespace flashinfer::kernels::cpu
