// Private: what the Mamba selective state update kernels of every backend receive
// (flashinfer.mamba.selective_state_update; docs/LINEAR_ATTENTION.md, "Mamba"). Per sequence s,
// head h, state row d and token t, with the fp32 row s[n] of the [dim, dstate] state:
//
//   dt = dt[s,t,h] (+ dt_bias[h]), softplus'd when dt_softplus;  dA = exp(A[h] * dt)
//   s[n] = s[n] * dA + (B[s,t,g,n] * dt) * x[s,t,h,d]             (g = h / (nheads / ngroups))
//   y    = D[h] * x + sum_n s[n] * C[s,t,g,n];  y *= silu(z[s,t,h,d]) when z is given
//
// The output comes from the fp32 row; only the stored copies are rounded (to the state dtype:
// nearest-even, fp16 stochastic when seeded, int16 with a per-row decode scale). Strides in
// elements.
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"

namespace flashinfer::kernels {

/// An io tensor (x, B, C, z, out, dt): element (s, t, head, i) at s * seq + t * tok + head *
/// head_stride + i (varlen: s is 0 and t the packed token row).
struct SsuIoRef {
  const void* data = nullptr;
  int64_t seq = 0, tok = 0, head = 0;
};

struct SsuParams {
  // Sequences: num_seqs rows of T tokens (STP: T = 1), or (varlen, cu_seqlens set) the token
  // ranges [cu_seqlens[s], cu_seqlens[s + 1]) of which at most T (cache_steps) run.
  int64_t num_seqs = 0, T = 1;
  const void* cu_seqlens = nullptr;
  bool cu_seqlens_i64 = false;
  int64_t total_tokens = 0;
  bool multi_token = false;  // MTP / varlen rules for dst indices and intermediate states

  int64_t nheads = 0, dim = 0, dstate = 0, ngroups = 1;

  // x, B, C, z, out of io_dtype (fp16 / bf16 / fp32); dt of dt_dtype; D, dt_bias of w_dtype;
  // A fp32. dt is read at index 0 of its (broadcast) dim axis; A, D, dt_bias at [h * stride].
  // dt's dtype is its own: checkpointing_ssu takes a bf16 dt beside fp32 D / dt_bias (each read
  // as fp32, as upstream's kernel widens them).
  DType io_dtype = DType::kBFloat16, dt_dtype = DType::kFloat32, w_dtype = DType::kFloat32;
  SsuIoRef x, B, C, z, dt;
  void* out = nullptr;
  int64_t out_seq = 0, out_tok = 0, out_head = 0;
  const float* A = nullptr;
  int64_t A_stride = 1;
  const void* D = nullptr;
  int64_t D_stride = 1;
  const void* dt_bias = nullptr;
  int64_t dt_bias_stride = 1;
  bool dt_softplus = false;

  // State [slots, nheads, dim, dstate] (row-contiguous; the slot stride is free) of state_dtype
  // (fp32 / fp16 / bf16 / int16); int16 rows carry a decode scale in state_scale [slots, nheads,
  // dim] (fp32, slot stride scale_stride_slot).
  void* state = nullptr;
  DType state_dtype = DType::kFloat32;
  int64_t slots = 0, state_stride_slot = 0;
  float* state_scale = nullptr;
  int64_t scale_stride_slot = 0;

  // Slots. src_idx [s * stride0 + j * stride1] (j: num_accepted_tokens[s] - 1, clamped at 0;
  // STP: 0) is the read slot, s without indices; pad_slot_id marks padding (zero state, outputs
  // written, nothing stored). dst_idx: STP's write slot; MTP / varlen: every step's write slot
  // [s * stride0 + t * stride1]. All index tensors share idx_i64.
  const void* src_idx = nullptr;
  int64_t src_stride0 = 1, src_stride1 = 0, src_cols = 1;  // src_cols bounds j
  const void* dst_idx = nullptr;
  int64_t dst_stride0 = 1, dst_stride1 = 0;
  bool idx_i64 = false;
  int64_t pad_slot_id = -1;
  const void* num_accepted = nullptr;
  bool num_accepted_i64 = false;
  bool update_state = true;

  // Intermediate states (MTP / varlen, without dst_idx): after step t, the rounded row to
  // inter [e, t, h, d, :] (e = inter_idx[s], else the read slot; inter_steps = buffer.size(1)),
  // its int16 decode scale to inter_scales [e, t, h, d].
  void* inter = nullptr;
  int64_t inter_entries = 0, inter_steps = 0;
  float* inter_scales = nullptr;
  const void* inter_idx = nullptr;

  // Stochastic rounding of fp16 stores: seed (one int64 on the op's device), Philox rounds.
  const int64_t* rand_seed = nullptr;
  int philox_rounds = 0;
};

/// checkpointing_ssu (flashinfer.mamba.checkpointing_ssu, "ReplaySSM"): `state` is a checkpoint
/// and a ring of L rows per slot holds the raw inputs of the tokens since (x per head, B per
/// group, the processed dt per head), rows (ring_start + i) % L for i < pnat. Per row and head:
/// the history is replayed into the checkpoint (H), the new tokens run from H for the outputs
/// (the SSU recurrence, D, the z gate), H is stored only when pnat + n > W (a flush), and the
/// new tokens are appended at rows (ring_start + pnat + t) % L. The fields of `ssu` serve as in
/// selective_state_update (src_idx one slot a row, no dst / intermediates, pad rows skipped
/// whole); D and dt_bias may be null (0).
struct CkptSsuParams {
  SsuParams ssu;
  int64_t L = 0, W = 0;     // ring rows, window (L - T)
  void* x_cache = nullptr;  // [cache, nheads, L, dim] of the io dtype
  int64_t xc_slot = 0, xc_head = 0, xc_row = 0;
  void* B_cache = nullptr;  // [cache, ngroups, L, dstate] of the io dtype
  int64_t bc_slot = 0, bc_group = 0, bc_row = 0;
  float* dt_cache = nullptr;  // [cache, nheads, L]
  int64_t dc_slot = 0, dc_head = 0;
  const int32_t* ring_start = nullptr;  // [cache]
  const int32_t* pnat = nullptr;        // [cache]
};

}  // namespace flashinfer::kernels
