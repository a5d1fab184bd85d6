// Private: whether two tensor views share memory, and whether one view repeats an element.
// The call gate's written-argument check (src/calls/written_args.cpp) and the ops' own checks
// (src/api/checks.h) both use these, so there is one definition of "overlap".
#pragma once

#include <cstdint>

#include "flashinfer/tensor.h"

namespace flashinfer::detail {

/// True when some byte is an element of both views. Addresses are compared (not storages), so
/// two from_blob views of one buffer count too; views on different devices never overlap.
///
/// Exact for the layouts views are made of: each view is reduced to its distinct-address
/// structure (size-1 and stride-0 dimensions dropped, contiguous dimensions merged into runs),
/// and the two are compared dimension by dimension from the largest stride down, so q and k
/// sliced from one packed qkv row, or the K and V halves of one paged cache, are found disjoint
/// even though their spans interleave. The walk has a fixed budget of steps; a pair of exotic
/// layouts that exceeds it (rows of one view interleaving rows of another many times over) is
/// reported as overlapping when their spans intersect, which is conservative.
bool views_overlap(const Tensor& a, const Tensor& b);

/// The first dimension of size > 1 with stride 0 (a broadcast view: several elements are one
/// memory location), or -1.
int64_t broadcast_dim(const Tensor& t);

}  // namespace flashinfer::detail
