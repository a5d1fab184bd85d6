// CPU reference of CuteDslMoEWrapper's quant_mode "w4a16": bf16 x against NVFP4 weights decoded
// exactly, fp32 results rounded where the SM100 kernel rounds (docs/MOE.md); with `p.b12x`,
// b12x_fused_moe's "w4a16" (the SM120 kernel's scale flush and rounding points).
#pragma once

#include "kernels/moe_cute_w4a16_params.h"

namespace flashinfer::kernels::cpu {

void cute_w4a16_moe(const CuteW4a16MoeParams& p);

}  // namespace flashinfer::kernels::cpu
