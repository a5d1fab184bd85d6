// Private: memory every rank of a communication group can address (the collective ops' peer
// buffers). Each rank allocates `bytes` on its device, zero-filled; one allgather through the
// group's CommBackend tells every rank where the others' allocations are. Ranks of one process
// use each other's addresses directly (CUDA: with peer access between different devices);
// ranks of other processes map them: CUDA IPC handles for device memory, POSIX shared memory
// for host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "flashinfer/comm.h"
#include "flashinfer/device.h"

namespace flashinfer::detail {

class PeerMemory {
 public:
  /// Collective: every rank of `comm` calls it with the same `bytes`. `op` names the caller in
  /// errors.
  PeerMemory(comm::CommBackend& comm, std::size_t bytes, const char* op);
  ~PeerMemory();
  PeerMemory(const PeerMemory&) = delete;
  PeerMemory& operator=(const PeerMemory&) = delete;

  Device device() const { return device_; }
  std::size_t bytes() const { return bytes_; }
  int64_t rank() const { return rank_; }
  int64_t world_size() const { return static_cast<int64_t>(peers_.size()); }
  /// This rank's allocation.
  void* local() const { return local_; }
  /// Rank r's allocation, as this rank addresses it (local() for r == rank()).
  void* peer(int64_t r) const { return peers_.at(static_cast<std::size_t>(r)); }
  const std::vector<void*>& peers() const { return peers_; }
  /// Zeroes the first `bytes` of this rank's allocation and waits for it (CUDA: on the current
  /// stream only; a device-wide wait could wait for a peer's kernel spinning on this rank).
  void zero_local(std::size_t bytes) const;

 private:
  Device device_;
  std::size_t bytes_ = 0;
  int64_t rank_ = 0;
  void* local_ = nullptr;
  std::vector<void*> peers_;
  std::vector<bool> mapped_;  // peers_[r] was mapped here (another process's memory)
  bool heap_ = false;         // host memory from calloc (every rank in this process)
  void release() noexcept;    // unmaps the peers' allocations, frees this rank's
};

}  // namespace flashinfer::detail
