// Private: what the Kimi delta attention (KDA) kernels of every backend receive
// (flashinfer.kda.recurrent_kda; docs/LINEAR_ATTENTION.md, "Kimi delta attention"). The gated
// delta rule of kernels/gdn_params.h with one decay per key channel: per sequence n, value head
// hv (query / key head h = hv / (HV / H)) and token t, with S the K x V state in fp32,
//
//   S[k, :] *= exp(a[k]);  u = beta * (v - S^T k^);  S += k^ u^T;  o = S^T q^   (o rounded to bf16)
//
// a[k] from g[t, hv, k]: as given, -exp(A_log[h]) * softplus(g + dt_bias[h K + k]), or
// lower_bound * sigmoid(exp(A_log[h]) * (g + dt_bias)); beta as given or sigmoid'ed; q^ = q *
// scale * rsqrt(sum q^2 + 1e-6), k^ = k * rsqrt(sum k^2 + 1e-6) with the L2 norm (else q * scale,
// k). States are [slots, HV, V, K] (K contiguous). Strides in elements.
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"

namespace flashinfer::kernels {

enum class KdaGate : uint8_t { kPrecomputed, kSoftplus, kLowerBound };

/// A [seq, token, head, i] io tensor (unit stride along i).
struct KdaIoRef {
  const void* data = nullptr;
  int64_t seq = 0, tok = 0, head = 0;
};

struct KdaParams {
  // Sequences: num_seqs rows of T tokens, or (cu_seqlens, int32 / int64) the ranges
  // [cu[n], cu[n + 1]) of one packed row (total_tokens its length).
  int64_t num_seqs = 0, T = 1;
  const void* cu_seqlens = nullptr;
  bool cu_seqlens_i64 = false;
  int64_t total_tokens = 0;
  int64_t H = 0, HV = 0, K = 0;  // V == K

  KdaIoRef q, k, v, g, beta;  // bf16; beta [.., HV] (i unused)
  KdaGate gate = KdaGate::kPrecomputed;
  float lower_bound = 0.0f;
  const float* A_log = nullptr;    // [H]
  const float* dt_bias = nullptr;  // [H * K] or null
  bool beta_is_logit = false, l2norm = true;
  float scale = 1.0f;

  void* out = nullptr;  // bf16 [.., HV, V]
  int64_t out_seq = 0, out_tok = 0, out_head = 0;

  // The state pool (bf16 or fp32) [slots, HV, V, K]; null: zeros, nothing stored.
  void* state = nullptr;
  DType state_dtype = DType::kBFloat16;
  int64_t slots = 0, state_stride_slot = 0;
  // A read-only pool the first token reads instead (initial_state_source), at src_idx[n].
  const void* source = nullptr;
  int64_t source_slots = 0, source_stride_slot = 0;
  const int32_t* src_idx = nullptr;

  // Slots: idx [N, idx_cols] int32 (row stride idx_stride0). Not spec: slot idx[n, 0] (or n
  // without idx) is read and written at the end; negative: padding (zero outputs, nothing
  // stored), or with wrap_negative (dense layouts: python indexing) slots + idx. Spec: the read
  // slot is idx[n, clamp(num_accepted[n] - 1, 0, T - 1)] (negative: slot 0), token t writes its
  // state to idx[n, t], and a token whose slot is negative outputs zero and leaves S as it is.
  const int32_t* idx = nullptr;
  int64_t idx_stride0 = 1, idx_cols = 1;
  bool wrap_negative = false;
  bool spec = false;
  const int32_t* num_accepted = nullptr;

  // Checkpoints (prefill): the state before token j * every of sequence n (j = 0: the initial
  // state) to row cp_starts[n] + j of checkpoints [rows, HV, V, K] (the state dtype). With
  // checkpoint_idx (upstream 0.7.4's checkpoint_state_indices): the state after token j * every
  // (j >= 1, the sequence's completed boundaries) to row checkpoint_idx[cp_starts[n] + j - 1];
  // a row outside [0, rows) is skipped, as upstream's kernel skips it.
  int64_t checkpoint_every = 0;
  void* checkpoints = nullptr;
  int64_t checkpoint_rows = 0;
  const int64_t* checkpoint_starts = nullptr;
  const int32_t* checkpoint_idx = nullptr;

  // Frozen verify (disable_state_update): `state` is only read, at slot idx[n] (or n; negative:
  // zero outputs and no cache rows); nothing is stored. The caches, when given, take row
  // (slot, hv, t): corr (fp32 [.., V]) the token's u, kg (bf16 [.., 2 K]) its raw key (head hv:
  // the caller makes H == HV) then its raw gate. Element strides.
  bool frozen = false;
  float* corr = nullptr;
  int64_t corr_slot = 0, corr_head = 0, corr_tok = 0;
  uint16_t* kg = nullptr;
  int64_t kg_slot = 0, kg_head = 0, kg_tok = 0;
};

/// fused_kda_decode (flashinfer.kda_decode): one token a row r, equal heads H, head dim 128.
/// Per row (slot s = idx[r]; s <= 0: a null row, zero output, no cache written) and head h: the
/// width-4 causal depthwise conv of the q / k / v channels (history conv_state[s, c, 0..2],
/// oldest first, then x; fp32 fused multiply-adds) and SiLU, rounded to bf16; the history
/// shifted to [h1, h2, x]; the KDA step (L2 norms, scale 128^-0.5, the lower-bound or softplus
/// gate, beta = sigmoid(raw_beta)) on the fp32 / bf16 state; o rounded to bf16; then the gated
/// RMSNorm y = o * rsqrt(mean(o^2) + norm_eps) * norm_weight * sigmoid(output_gate), bf16.
struct FusedKdaParams {
  int64_t R = 0, H = 0;
  static constexpr int64_t kDim = 128;
  const void* x = nullptr;  // bf16 [R, 3 H 128], unit channel stride
  int64_t x_row = 0;
  const float* weight = nullptr;  // [3, 4, H 128]
  void* conv_state = nullptr;  // bf16; element (s, c, j) at s * cs_slot + c * cs_chan + j * cs_hist
  int64_t cs_slot = 0, cs_chan = 1, cs_hist = 0;
  const void* raw_gate = nullptr;  // bf16 [R, H, 128] contiguous
  const void* raw_beta = nullptr;  // bf16 [R, H]: (r, h) at r * b_row + h * b_head
  int64_t b_row = 0, b_head = 1;
  const float* A_log = nullptr;    // [H]
  const float* dt_bias = nullptr;  // [H 128]
  const int32_t* idx = nullptr;    // [R]
  void* state = nullptr;           // [slots, H, 128, 128] fp32 / bf16, K contiguous
  DType state_dtype = DType::kFloat32;
  int64_t slots = 0, state_slot = 0;
  const void* out_gate = nullptr;  // bf16; (r, h, k) at r * og_row + h * 128 + k
  int64_t og_row = 0;
  const float* norm_weight = nullptr;  // [128]
  bool has_lower_bound = true;
  float lower_bound = -5.0f, norm_eps = 1e-5f;
  void* out = nullptr;  // bf16 [R, H, 128] contiguous
};

}  // namespace flashinfer::kernels
