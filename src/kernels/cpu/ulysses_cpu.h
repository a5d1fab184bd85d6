// CPU reference of the Ulysses all-to-all (ranks as threads of one process, staging buffers and
// signals in host memory every rank addresses). docs/COMM.md, "Ulysses all-to-all".
#pragma once

#include "kernels/ulysses_params.h"

namespace flashinfer::kernels::cpu {

/// One rank's ulysses_a2a: a barrier over the ranks (through the signals, block 0), this rank's
/// rows pushed into the peers' staging buffers, a second barrier, then this rank's staging buffer
/// copied into p.out. A peer that never comes: flashinfer::Error naming `op` after two minutes
/// (at once when the rank's comm::ThreadGroup aborted).
void ulysses_a2a(const UlyssesA2aParams& p, const char* op);

}  // namespace flashinfer::kernels::cpu
