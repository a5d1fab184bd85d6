// Private: how the CPU collectives wait for a peer (ranks as threads of one process): a flag the
// peer publishes in this rank's memory, polled with acquire loads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "flashinfer/comm.h"
#include "flashinfer/error.h"

namespace flashinfer::kernels::cpu {

/// How long a CPU collective waits for its peers before calling them gone.
inline std::chrono::steady_clock::time_point peer_wait_deadline() {
  return std::chrono::steady_clock::now() + std::chrono::minutes(2);
}

/// Spins until `flag` has reached call `seq` (a peer may be ahead of it). Throws
/// flashinfer::Error naming `op` and `arg` at once when this thread's comm::ThreadGroup has
/// aborted (another rank failed), or once `deadline` passed: "rank <rank> waited two minutes for
/// rank <peer>" followed by `what`.
inline void wait_for_peer_flag(uint32_t& flag, uint32_t seq,
                               std::chrono::steady_clock::time_point deadline, const char* op,
                               const char* arg, int rank, int peer, const char* what) {
  const std::atomic_ref<uint32_t> f(flag);
  while (static_cast<int32_t>(f.load(std::memory_order_acquire) - seq) < 0) {
    if (comm::this_thread_group_aborted()) {
      FLASHINFER_FAIL(ErrorCode::kInternal, op, arg, "the thread group was aborted: rank ", rank,
                      " left its wait because another rank failed");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      FLASHINFER_FAIL(ErrorCode::kInternal, op, arg, "rank ", rank, " waited two minutes for rank ",
                      peer, what);
    }
    std::this_thread::yield();
  }
}

}  // namespace flashinfer::kernels::cpu
