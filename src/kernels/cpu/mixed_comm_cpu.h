// CPU reference of run_mixed_comm (flashinfer.comm.mixed_comm): this rank's x_in into its slot,
// its call published (release), every peer's awaited (acquire; an Error after two minutes: a rank
// that never came), then every output element from the peers' slots
// (kernels/mixed_comm_params.h). docs/COMM.md, "Mixed TP / DP collectives".
#pragma once

#include "kernels/mixed_comm_params.h"

namespace flashinfer::kernels::cpu {

void mixed_comm(const MixedCommParams& p);

}  // namespace flashinfer::kernels::cpu
