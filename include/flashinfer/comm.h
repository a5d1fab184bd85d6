// Ranks of a communication group, as upstream's flashinfer.comm takes them: a CommBackend
// (upstream's flashinfer.comm.mnnvl.CommBackend: Get_rank, Get_size, allgather, barrier) through
// which the collective ops' workspaces exchange their buffers' addresses once, at creation.
// The data of a collective call then moves through those buffers, not through the backend.
//
// A serving engine brings its own backend (over MPI, NCCL's bootstrap or torch.distributed);
// ThreadGroup is one for ranks that are threads of one process (tests, replay, one process
// driving several GPUs). docs/COMM.md describes the ops built on it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "flashinfer/device.h"
#include "flashinfer/op_decl.h"

namespace flashinfer::comm {

/// One rank's view of its group. allgather and barrier are collective: every rank calls them in
/// the same order. An implementation that gives up (a peer died, a timeout) throws
/// flashinfer::Error.
class CommBackend : public ApiObject {
 public:
  virtual int64_t Get_rank() const = 0;
  virtual int64_t Get_size() const = 0;
  /// Every rank's `bytes`, indexed by rank.
  virtual std::vector<std::string> allgather(std::string_view bytes) = 0;
  virtual void barrier() = 0;
  /// The device this rank's collectives run on: upstream takes torch's current CUDA device; a
  /// C++ caller says it here (the workspaces allocate their buffers on it).
  virtual Device device() const { return Device::cpu(); }
  /// What every backend of one group shares (MoeAlltoAll's workspace cache shares workspaces
  /// within a group only); by default the backend itself.
  virtual const void* group_id() const { return this; }

  std::string_view module_name() const override { return "flashinfer.comm.mnnvl"; }
};

/// Whether the comm::ThreadGroup whose rank this thread runs has been aborted (a rank failed);
/// false on any other thread. The CPU collectives' waits poll it, so a failed rank ends its
/// peers' waits at once instead of after their timeouts.
bool this_thread_group_aborted();

/// Ranks that are threads of this process, rank r on devices[r] (one device for all: several
/// ranks may share a GPU, each on its own stream). backend(r) is rank r's CommBackend; a
/// collective that waits longer than `timeout` for the other ranks throws flashinfer::Error
/// (a rank that never comes is a bug in the caller, and a test should fail, not hang).
class ThreadGroup {
 public:
  explicit ThreadGroup(int64_t size, Device device = Device::cpu(),
                       std::chrono::milliseconds timeout = std::chrono::milliseconds(120000));
  explicit ThreadGroup(std::vector<Device> devices,
                       std::chrono::milliseconds timeout = std::chrono::milliseconds(120000));
  ~ThreadGroup();
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  int64_t size() const;
  std::shared_ptr<CommBackend> backend(int64_t rank) const;

  /// Runs body(rank) on `size` threads, one per rank, and waits for all of them. A rank on a
  /// CUDA device runs with a stream of its own current (one per device and rank, kept for the
  /// process: ranks sharing a GPU must not serialize on one stream), synchronized at the end. The
  /// first exception a rank throws is rethrown here (after every thread has finished; a rank
  /// blocked in a collective its failed peer will never join gives up after the timeout).
  void run(const std::function<void(int64_t rank)>& body) const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace flashinfer::comm
