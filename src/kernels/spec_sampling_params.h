// Private: chain_speculative_sampling's kernel parameters (contiguous tensors).
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"
#include "kernels/sampling_params.h"  // RowArg

namespace flashinfer::kernels {

struct ChainSpecParams {
  const void* draft_probs = nullptr;   // [batch, n, vocab]
  const void* target_probs = nullptr;  // [batch, n + 1, vocab]
  DType dtype = DType::kFloat32;
  const void* draft_ids = nullptr;  // [batch, n]
  void* out_ids = nullptr;          // [batch, n + 1]
  void* accepted = nullptr;         // [batch], added to
  void* emitted = nullptr;          // [batch], added to
  DType id_dtype = DType::kInt32;   // of the four id tensors
  int64_t batch = 0, n = 0, vocab = 0;
  // The Philox seed and offset: scalars, or element 0 of a one-entry int32/int64 tensor read by
  // the kernel (row_arg_int(seed, 0)), so a CUDA call never reads a device tensor on the host.
  RowArg seed, offset;
};

}  // namespace flashinfer::kernels
