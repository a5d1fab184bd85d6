// CPU reference of rope_quantize_fp8: fp32 rotation, bit-exact saturating fp8 rounding
// (flashinfer/float_formats.h), OpenMP over tokens.
#pragma once

#include "kernels/rope_quantize_params.h"

namespace flashinfer::kernels::cpu {

void rope_quantize(const RopeQuantizeParams& p);

}  // namespace flashinfer::kernels::cpu
