// Private: how a failed rank reaches its peers' CUDA kernels. A comm::ThreadGroup with CUDA ranks
// keeps one word of mapped host memory, set when the group aborts; the collectives' kernels poll
// it while they wait for a peer and leave the wait (their results unused: the group's run()
// rethrows the failure) instead of spinning to their 100 s trap, which would end the CUDA context
// every rank shares.
#pragma once

#include <cstdint>

namespace flashinfer::detail {

/// The device address of the abort word of the group whose rank this thread runs (nonzero once
/// the group aborted), or null outside a group with CUDA ranks.
const uint32_t* thread_group_abort_word();

}  // namespace flashinfer::detail
