// CPU reference of the grouped / fused NVFP4 and MXFP8 quantizers, the row shuffles and the NVFP4
// KV-cache quantizers (bit-exact on the float_formats.h conversions).
#pragma once

#include "kernels/nvfp4_params.h"

namespace flashinfer::kernels::cpu {

void grouped_quantize(const GroupedQuantizeParams& p);
void silu_and_mul_rows(const SiluMulParams& p);
void gather_rows(const RowGatherParams& p);
void nvfp4_kv_quantize(const Nvfp4KvParams& p);
void nvfp4_kv_dequantize(const Nvfp4KvParams& p);
void nvfp4_paged_append(const Nvfp4PagedAppendParams& p);
void nvfp4_paged_dequantize(const Nvfp4PagedDequantParams& p);
void nvfp4_paged_quantize(const Nvfp4PagedQuantParams& p);
void abs_max(const AbsMaxParams& p);

}  // namespace flashinfer::kernels::cpu
