// Private: which process a rank is in, as the collectives tell "a peer in this process" (its
// addresses are valid here) from "a peer in another process" (its memory must be mapped). A pid
// alone cannot: processes in different PID namespaces (containers sharing a host's GPUs or
// /dev/shm) may have the same pid. The pid with 64 random bits drawn once a process (again in a
// forked child) can.
#pragma once

#include <cstdint>
#include <string>

namespace flashinfer::detail {

struct ProcessIdentity {
  int64_t pid = 0;
  uint64_t nonce = 0;
  friend bool operator==(const ProcessIdentity&, const ProcessIdentity&) = default;
};

ProcessIdentity this_process();

/// "<pid>_<nonce in hex>": a name part no other process on the machine has (shared-memory names).
std::string process_tag();

}  // namespace flashinfer::detail
