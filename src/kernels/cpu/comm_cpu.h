// CPU reference of allreduce_fusion: the ranks' inputs (already exchanged into the peer
// buffers) summed in rank order, then the pattern's epilogue. docs/COMM.md.
#pragma once

#include "kernels/comm_params.h"

namespace flashinfer::kernels::cpu {

void allreduce_fusion(const AllReduceFusionParams& p);

/// allreduce_fusion's MoE patterns 6 / 7: this rank's local value (kernels/comm_rules.h).
void moe_local_value(const MoeLocalParams& p);

/// decode_cp_a2a_alltoall on the CPU: this rank's inputs into its slot, its call published
/// (release), every peer's awaited (acquire; an Error after two minutes: a rank that never
/// came), then slot [.., p, :] of the outputs from rank p's row.
void decode_cp_a2a_alltoall(const DcpA2aParams& p);

}  // namespace flashinfer::kernels::cpu
