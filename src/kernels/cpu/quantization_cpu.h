// CPU reference kernels for the FP4 / MXFP8 quantization ops: bit-exact, OpenMP over rows,
// vectorized row kernels chosen at run time (baseline, AVX2, AVX-512; identical bits).
#pragma once

#include "kernels/cpu/cpu_isa.h"
#include "kernels/quantization_params.h"

namespace flashinfer::kernels::cpu {

void fp4_quantize(const Fp4QuantizeParams& p);
void mxfp8_quantize(const Mxfp8QuantizeParams& p);
void block_dequantize(const BlockDequantizeParams& p);
/// Upstream 0.7.4's batch-invariant recipe (kernels/quant_batch_invariant_rules.h), row by row.
void batch_invariant_quantize(const BatchInvariantQuantizeParams& p);
void block_scale_interleave(const BlockScaleInterleaveParams& p);

// For tests and benchmarks: the quantizers' row kernels are compiled for the baseline target,
// AVX2 and AVX-512 and give identical bits; these run one of them (clamped to
// detected_cpu_isa()).
void fp4_quantize_with(const Fp4QuantizeParams& p, CpuIsa isa);
void mxfp8_quantize_with(const Mxfp8QuantizeParams& p, CpuIsa isa);

}  // namespace flashinfer::kernels::cpu
