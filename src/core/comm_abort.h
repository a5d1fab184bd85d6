// Private: how a failed rank reaches its peers' CUDA kernels. A comm::ThreadGroup with CUDA ranks
// keeps one word of mapped host memory, set when the group aborts; the collectives' kernels poll
// it while they wait for a peer and leave the wait (their results unused: the group's run()
// rethrows the failure) instead of spinning to their 100 s trap, which would end the CUDA context
// every rank shares.
#pragma once

#include <cstdint>
#include <functional>

#include "flashinfer/comm.h"
#include "flashinfer/device.h"

namespace flashinfer::detail {

/// The device address of the abort word of the group whose rank this thread runs (nonzero once
/// the group aborted), or null outside a group with CUDA ranks.
const uint32_t* thread_group_abort_word();

/// Runs `launch`, the launches of one collective call's kernels that wait for the peers' kernels
/// (and nothing else), so that every rank of a comm::ThreadGroup enqueues them together: when
/// this thread runs a rank of a ThreadGroup of `world_size` CUDA ranks (and `comm`, where given,
/// is that group's backend), `preload` (where given: forces the lazy loading of every kernel
/// `launch` may launch), a barrier, `launch`, a barrier; else `launch` alone.
///
/// Why: such ranks share a CUDA context (one GPU, or one process driving several), and a rank's
/// kernel that spins until a peer's kernel runs must never wait on a host call of that peer.
/// Between two collective calls a rank allocates (cudaMalloc, cudaHostAlloc), frees (cudaFree),
/// copies from pageable memory, synchronizes the device or loads a kernel lazily; the runtime may
/// make any of these wait for the work already running in the context (the programming guide's
/// "implicit synchronization"; lazy loading may synchronize the context), i.e. for the first
/// rank's spinning kernel, while the peer kernel that kernel waits for is not launched yet: a
/// deadlock, ended only by the kernels' 100 s trap. With the two barriers no rank's waiting
/// kernel is enqueued until every rank has finished its host work, and no rank goes on to new
/// host work until every rank's kernel is enqueued (they then finish whatever the ranks do).
/// Processes of their own (any other backend) need none of this: each has its own context.
void gated_collective_launch(const comm::CommBackend* comm, int64_t world_size, Device device,
                             const std::function<void()>& preload,
                             const std::function<void()>& launch);

}  // namespace flashinfer::detail
