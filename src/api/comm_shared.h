// Private: what the collectives of src/api share (comm.cpp, moe_alltoall.cpp).
#pragma once

#include <cstdint>

#include "flashinfer/comm.h"
#include "flashinfer/dtype.h"
#include "flashinfer/tensor.h"

namespace flashinfer::detail {

/// Collective over c's ranks: one zeroed tensor [rows, row_elems] of dtype on c.device() that
/// every rank views (rank 0 allocates storage_factor times its elements; the rest of the storage
/// is the caller's, past the tensor's elements). Ranks in several processes are refused
/// (kUnsupported naming op and arg: one address space over processes needs MNNVL fabric memory).
/// No barrier: the caller's initialization comes first.
Tensor group_shared_rows(comm::CommBackend& c, int64_t rows, int64_t row_elems, DType dtype,
                         int64_t storage_factor, const char* op, const char* arg);

}  // namespace flashinfer::detail
