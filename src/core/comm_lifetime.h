// Private: how long a communication group lives, for caches kept per group (quantized_all_reduce's
// peer buffers). A comm::ThreadGroup's ranks share one state that dies with the group and its
// last backend; other backends (a caller's MPI or torch.distributed channel) say nothing.
#pragma once

#include <memory>

#include "flashinfer/comm.h"

namespace flashinfer::detail {

/// A weak reference that expires when c's group is gone: its ThreadGroup state for a
/// ThreadGroup backend; empty (never expiring, never set) for any other backend.
std::weak_ptr<const void> group_lifetime(const comm::CommBackend& c);

}  // namespace flashinfer::detail
