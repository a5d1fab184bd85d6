// CUDA launchers for the NVFP4 weight shuffles, KV-cache quantizers and dequantizers (ops upstream
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

/// scaled_fp4_grouped_quantize, silu_and_mul_scaled_nvfp4_experts_quantize (p.silu_and_mul) and
/// mxfp8_grouped_quantize (!p.fp4): bit-exact with kernels::cpu::grouped_quantize (the block rules
/// of kernels/nvfp4_rules.h, silu by kernels/fp32_rules.h). `p.rows` (the mask) and
/// `p.global_scale` are device arrays, read by the kernel only: no host synchronization; each mask
/// entry is clamped to [0, m]. Every output byte is written (zero past a group's rows).
void grouped_quantize(const GroupedQuantizeParams& p, void* stream, bool enable_pdl);

/// silu_and_mul_nvfp4_quantize's first step, bit-exact with kernels::cpu::silu_and_mul_rows
/// (kernels/fp32_rules.h's silu_mul_f32, rounded once to the element type).
void silu_and_mul_rows(const SiluMulParams& p, void* stream, bool enable_pdl);

/// kernels::cpu::nvfp4_paged_append on the device: the same block rule (kernels/nvfp4_rules.h).
/// `page` and `entry` are device arrays here, checked on the host.
void nvfp4_paged_append(const Nvfp4PagedAppendParams& p, void* stream, bool enable_pdl);

/// kernels::cpu::nvfp4_paged_quantize on the device: fp4_quantize's block rule per row and the
/// same scale placement (kernels/nvfp4_rules.h).
void nvfp4_paged_quantize(const Nvfp4PagedQuantParams& p, void* stream);

/// kernels::cpu::abs_max on the device (exact: a maximum); waits for the result, which it
/// writes to host memory.
void abs_max(const AbsMaxParams& p, void* stream);

}  // namespace flashinfer::kernels::cuda
