// Parameters of CuteDslMoEWrapper's quant_mode "w4a16" (bf16 activations, NVFP4 weights decoded
// to bf16 in the kernel). Semantics and sources: docs/MOE.md ("CuteDslMoEWrapper: w4a16").
#pragma once

#include <cstdint>

namespace flashinfer::kernels {

struct CuteW4a16MoeParams {
  const uint16_t* x = nullptr;  // bf16 bits [T, H], row stride x_stride
  int64_t x_stride = 0;
  const int32_t* ids = nullptr;   // [T, K] global expert ids, row stride routed_stride
  const float* scales = nullptr;  // [T, K] token_final_scales (fp32), row stride routed_stride
  int64_t routed_stride = 0;
  // Weights in plain row order (GEMM1: linear rows [0, I), gate rows [I, 2I) when gated), packed
  // e2m1 pairs, with linear e4m3 block-16 scale codes.
  const uint8_t* w1 = nullptr;    // [El, N1, H/2], N1 = 2I (gated) or I
  const uint8_t* s1 = nullptr;    // [El, N1, H/16]
  const uint8_t* w2 = nullptr;    // [El, H, I/2]
  const uint8_t* s2 = nullptr;    // [El, H, I/16]
  const float* alpha1 = nullptr;  // [El]
  const float* alpha2 = nullptr;  // [El]
  int64_t num_tokens = 0, top_k = 0, hidden = 0, inter = 0;
  int64_t num_local_experts = 0, expert_offset = 0;
  bool gated = true;
  // Non-default SwiGLU parameters switch on the clamp and beta (the kernel's
  // parameterized_swiglu); the sigmoid always uses swiglu_alpha.
  bool parameterized_swiglu = false;
  float swiglu_alpha = 1.0f, swiglu_beta = 0.0f, swiglu_limit = 0.0f;
  // Other gated epilogues (gated only): GegluTanh, up * gelu_tanh(gate); SiTU (situ),
  // (situ_beta * tanh(gate / situ_beta) * sigmoid(gate)) * up', with up' = situ_linear_beta *
  // tanh(up / situ_linear_beta) when situ_linear, else up. Neither uses the SwiGLU parameters.
  bool geglu_tanh = false;
  bool situ = false;
  bool situ_linear = false;
  float situ_beta = 0.0f, situ_linear_beta = 0.0f;
  bool fused_finalize = true;
  uint16_t* out = nullptr;  // bf16 bits [T, H], row stride out_stride
  int64_t out_stride = 0;
  // b12x_fused_moe's "w4a16" (SM120 kernel, docs/MOE.md "b12x w4a16") instead of the SM100 one:
  // block scales below 2^-6 after the per-matrix power-of-two rescale are flushed to zero, GEMM1
  // is stored bf16 before the activation (silu: bf16(bf16(silu(g)) * u)), each route's GEMM2 is
  // bf16(bf16(acc) * bf16(w * alpha2)), summed in fp32 and rounded once, or with fused_finalize
  // (the TC-decode path) added into the bf16 output one bf16 rounding per add. Silu/relu2 only.
  bool b12x = false;
};

}  // namespace flashinfer::kernels
