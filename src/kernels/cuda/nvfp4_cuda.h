// CUDA launchers for the NVFP4 weight shuffles and the NVFP4 KV-cache dequantizer (ops upstream
// runs on Hopper; docs/CONFORMANCE.md, "Ops upstream runs only on some GPUs"). Plain C++ header:
// callable from the API layer. Launchers throw flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/nvfp4_params.h"

namespace flashinfer::kernels::cuda {

/// out row i = input row src_row[i]; `src_row` must be a device array here. Byte copies, so
/// bit-exact with kernels::cpu::gather_rows.
void gather_rows(const RowGatherParams& p, void* stream);

/// Bit-exact with kernels::cpu::nvfp4_kv_dequantize: y = e2m1 * e4m3(scale) * global_scale in
/// fp32, in that order, rounded once (RNE) to the output type.
void nvfp4_kv_dequantize(const Nvfp4KvParams& p, void* stream);

/// kernels::cpu::nvfp4_paged_dequantize, one thread per output element: the same fp32 product
/// per element. `block_table` and `seq_lens` are host arrays here (copied to the device for
/// the kernel, stream-ordered).
void nvfp4_paged_dequantize(const Nvfp4PagedDequantParams& p, void* stream);

/// nvfp4_batched_quantize: every group through the CUDA fp4_quantize launcher (bit-exact with
/// the CPU's fp4_quantize), as kernels::cpu::grouped_quantize does for fp4 without a mask or
/// silu-and-mul (the only case it accepts; anything else is an Error naming the op).
void batched_fp4_quantize(const GroupedQuantizeParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
