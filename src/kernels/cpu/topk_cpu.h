// CPU reference kernels for the top-k ops: an exact radix select per row (a histogram of the
// keys' top bits, then the boundary bucket's keys), OpenMP over rows.
#pragma once

#include <cstdint>

#include "kernels/topk_params.h"

namespace flashinfer::kernels::cpu {

/// Runs top-k over every row of `p`. Returns the number of page-table lookups that fell outside
/// the table (written as -1); the caller reports them.
int64_t top_k(const TopKParams& p);

}  // namespace flashinfer::kernels::cpu
