// Private: the part of gdn_fused_decode_step (flashinfer.gdn_kernels.experimental.gdn_fused_decode)
// before the gated delta rule, on every backend. Upstream's composable path, which is the op's
// specification (docs/LINEAR_ATTENTION.md, "Fused decode step"):
//
//   ba[b, j]       = bf16(sum_i hidden[b, i] * w_ba[i, j])                  (fp32 accumulation)
//   window[b, c]   = (conv_state[slot_b, c, 0 .. W-2], mixed_qkv[b, c])      (bf16 values)
//   conv_out[b, c] = bf16(silu(sum_j window[b, c, j] * conv_weight[c, j] + conv_bias[c]))
//   conv_state[slot_b, c, :] = window[b, c, 1 ..]                           (in place)
//
// The recurrence then reads q / k / v from conv_out and the gates from ba (kernels/gdn_params.h).
// Strides in elements; every tensor bf16 but the indices.
#pragma once

#include <cstdint>

namespace flashinfer::kernels {

struct GdnFusedPrologueParams {
  int64_t B = 0, hidden = 0, n_ba = 0, qkv_dim = 0, width = 0;  // width: the conv's taps
  // hidden_states [B, hidden] (unit inner stride), w_ba [hidden, n_ba] (any strides).
  const uint16_t* hidden_states = nullptr;
  int64_t hs_stride_b = 0;
  const uint16_t* w_ba = nullptr;
  int64_t w_stride_i = 0, w_stride_j = 0;
  // mixed_qkv [B, qkv_dim] (any strides), conv_weight [qkv_dim, width], conv_bias [qkv_dim].
  const uint16_t* mixed_qkv = nullptr;
  int64_t x_stride_b = 0, x_stride_c = 0;
  const uint16_t* conv_weight = nullptr;
  int64_t cw_stride_c = 0, cw_stride_j = 0;
  const uint16_t* conv_bias = nullptr;
  int64_t cb_stride = 0;
  // conv_state: the logical [P, qkv_dim, width - 1] view (an SD pool's transpose or a DS pool).
  uint16_t* conv_state = nullptr;
  int64_t pool = 0, cs_stride_p = 0, cs_stride_c = 0, cs_stride_t = 0;
  // state_indices [B]: the pool slot of each request (int32 or int64). The API layer checks them
  // on the host when they are there; a CUDA kernel skips a request whose slot is outside the pool
  // (its conv_out row is NaN, so the recurrence writes NaN outputs and no state).
  const void* state_indices = nullptr;
  bool indices_i64 = false;
  // Outputs, dense: ba [B, n_ba], conv_out [B, qkv_dim].
  uint16_t* ba = nullptr;
  uint16_t* conv_out = nullptr;
};

}  // namespace flashinfer::kernels
