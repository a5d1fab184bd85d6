// CPU reference of allreduce_fusion: the ranks' inputs (already exchanged into the peer
// buffers) summed in rank order, then the pattern's epilogue. docs/COMM.md.
#pragma once

#include "kernels/comm_params.h"

namespace flashinfer::kernels::cpu {

void allreduce_fusion(const AllReduceFusionParams& p);

}  // namespace flashinfer::kernels::cpu
