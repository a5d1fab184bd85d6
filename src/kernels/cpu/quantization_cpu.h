// CPU reference kernels for the FP4 / MXFP8 quantization ops: bit-exact, OpenMP over rows.
#pragma once

#include "kernels/quantization_params.h"

namespace flashinfer::kernels::cpu {

void fp4_quantize(const Fp4QuantizeParams& p);
void mxfp8_quantize(const Mxfp8QuantizeParams& p);
void block_dequantize(const BlockDequantizeParams& p);
void block_scale_interleave(const BlockScaleInterleaveParams& p);

}  // namespace flashinfer::kernels::cpu
