// Private: what the gated delta rule (GDN) kernels of every backend receive. One recurrence serves
// the decode ops of flashinfer.gdn_decode and chunk_gated_delta_rule of flashinfer.gdn_prefill
// (docs/LINEAR_ATTENTION.md): per sequence n, state head h and token t, with S the K x V state,
//
//   S  = decay_t * S;  u = beta_t * (v_t - S^T k_t);  S += k_t u^T;  o_t = S^T q_t
//
// The ops differ in where decay / beta come from, where the scale and the L2 norm apply, how the
// output is rounded and how states are read and written; the fields below say which. Strides in
// elements. Sequences are rows of fixed length T (decode) or cu_seqlens ranges (prefill).
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"

namespace flashinfer::kernels {

/// What a negative read slot (state index) means: the ops differ (docs/LINEAR_ATTENTION.md).
enum class GdnNegativeRead : uint8_t {
  kSkipZeroOutput,  // nothing read or written; the sequence's outputs are zeros
  kSkipKeepOutput,  // nothing read or written; the output rows are left as they are
  kSlotZero,        // slot 0 is read (and written back): the caller's null slot
  kZeroState,       // the sequence starts from the zero state; its write slot is write_idx's
  kInvalid,         // an error the CPU path raises on the host; on CUDA: NaN outputs, no state
};
/// What a negative write slot means.
enum class GdnNegativeWrite : uint8_t { kSlotZero, kSkip };

/// Where the state after each token goes (gated_delta_rule_mtp).
enum class GdnIntermediates : uint8_t {
  kNone,
  kBuffer,  // fp32 row (n * T + t) * H + h of [V, K] (upstream's flat index; docs)
  kPool,    // pool slot step_slots[n, t] (the final write-back is skipped)
};

/// A state tensor: element (slot, head, k, v) at slot * stride_slot + head * stride_head +
/// k * stride_k + v * stride_v (K-last layouts [.., V, K] have stride_k == 1).
struct GdnStateRef {
  void* data = nullptr;
  DType dtype = DType::kFloat32;  // fp32 or bf16
  int64_t slots = 0;              // rows along the slot dimension (bounds of the indices)
  int64_t stride_slot = 0, stride_head = 0, stride_k = 1, stride_v = 0;
};

/// A [seq, token, head] gate or [token, head] tensor.
struct GdnGateRef {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t stride_seq = 0, stride_tok = 0, stride_head = 0;
};

struct GdnParams {
  // Sequences: num_seqs rows of T tokens (cu_seqlens null), or the token ranges
  // [cu_seqlens[n], cu_seqlens[n + 1]) of one packed row (cu_seqlens int32 or int64).
  int64_t num_seqs = 0, T = 0;
  const void* cu_seqlens = nullptr;
  bool cu_seqlens_i64 = true;
  int64_t total_tokens = 0;  // packed rows: the bound of the ranges

  // Heads: the state / output heads H; q, k and v head i = h * H_x / H (repeat_interleave).
  int64_t H = 0, Hq = 0, Hk = 0, Hv = 0, K = 0, V = 0;

  // q, k, v: io dtype (fp16 / bf16), element (n, t, head, i) at n * stride_seq + t * stride_tok
  // + head * stride_head + i (unit stride along the head dim).
  DType io_dtype = DType::kBFloat16;
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  int64_t q_stride_seq = 0, q_stride_tok = 0, q_stride_head = 0;
  int64_t k_stride_seq = 0, k_stride_tok = 0, k_stride_head = 0;
  int64_t v_stride_seq = 0, v_stride_tok = 0, v_stride_head = 0;

  // Gates. Decode (decode_gates): decay = exp(-exp(A_log[h]) * softplus(a + dt_bias[h])) with
  // softplus(x) = x above 20, beta = sigmoid(b); a, b [n, t, h] of any float dtype, A_log fp32,
  // dt_bias fp32 / bf16 / fp16. Prefill: decay = g[t, h] and beta = beta[t, h] (fp32), 1 where
  // null.
  bool decode_gates = true;
  GdnGateRef a, b, g, beta;
  const float* A_log = nullptr;
  const void* dt_bias = nullptr;
  DType dt_bias_dtype = DType::kFloat32;

  // q_hat = q * rsqrt(sum q^2 + 1e-6) (and k likewise) when l2norm (decode only); decode
  // multiplies q_hat by scale, prefill the output.
  bool l2norm = false;
  bool scale_output = false;
  float scale = 1.0f;

  // Output [n, t, h, V] of out_dtype; decode rounds to bf16 first (upstream's kernels write bf16,
  // the API casts).
  void* out = nullptr;
  DType out_dtype = DType::kBFloat16;
  bool out_via_bf16 = false;
  // Upstream's pretranspose and MTP decode kernels take bf16 operands: their Python casts
  // (`as_bf16`, a rounding .to(bf16)) q, k and v, and on every path but the fp32-state
  // one-token kernel also the a / b gates, before the kernel reads them.
  bool qkv_via_bf16 = false, gates_via_bf16 = false;
  int64_t out_stride_seq = 0, out_stride_tok = 0, out_stride_head = 0;

  // States. state_in null: zeros. read_idx / write_idx (int32 or int64, one per sequence) pick
  // the slots; null: slot n. write_idx null with read_idx given: the read slot (the kernels
  // treat write_idx == read_idx, prefill's state_indices, as the same case).
  GdnStateRef state_in, state_out;
  const void* read_idx = nullptr;
  bool read_idx_i64 = false;
  const void* write_idx = nullptr;
  bool write_idx_i64 = false;
  GdnNegativeRead negative_read = GdnNegativeRead::kSkipZeroOutput;
  GdnNegativeWrite negative_write = GdnNegativeWrite::kSkip;
  bool write_final = true;

  // Intermediate states (fp32): buffer rows or pool slots step_slots[n * T + t] (int32).
  GdnIntermediates intermediates = GdnIntermediates::kNone;
  float* inter_buffer = nullptr;
  // Steps a request's rows of inter_buffer span (upstream's cache_steps = stride(0) / (HV V K)):
  // the state after token t of request n goes to row n * inter_steps + t.
  int64_t inter_steps = 0;
  const int32_t* step_slots = nullptr;

  // Prefill checkpoints: the state after every `checkpoint_every` tokens of sequence n, its j-th
  // to row checkpoint_starts[n] + j of checkpoints [*, H, V, K] (fp32, dense [H, V, K] rows
  // checkpoint_row_stride apart). With checkpoint_prefix (upstream 0.7.4's prefix_lens, one per
  // sequence) positions are absolute: after new token t when prefix + t + 1 is a multiple, j
  // counting this call's checkpoints. With checkpoint_slots (0.7.4's checkpoint_state_indices)
  // the row is checkpoint_slots[checkpoint_starts[n] + j]; -1 skips it.
  int64_t checkpoint_every = 0;
  float* checkpoints = nullptr;
  int64_t checkpoint_rows = 0;
  int64_t checkpoint_row_stride = 0;
  const void* checkpoint_starts = nullptr;
  bool checkpoint_starts_i64 = true;
  const void* checkpoint_prefix = nullptr;
  bool checkpoint_prefix_i64 = false;
  const void* checkpoint_slots = nullptr;
  bool checkpoint_slots_i64 = false;
  int64_t checkpoint_slot_count = 0;  // entries of checkpoint_slots (the bound of its index)
};

/// chunk_gated_delta_rule's operands as upstream 0.7.4 materializes them before its chunked
/// kernels (gdn_kernels/qk_l2norm.py, gdn_kernels/gates.py), into contiguous outputs:
/// - l2norm: each q / k head row x [D] of io dtype becomes io(x * rsqrt(sum x^2 + 1e-6)), fp32
///   sums (out [T, heads, D]);
/// - g_mode kRaw (use_gate_in_kernel): alpha = exp(-exp(A_log[h]) * softplus(g + dt_bias[h])),
///   torch's softplus (log1p(exp(x)), x above 20); kLog (gate_domain "log"): alpha = exp(g);
///   fp32 out [T, H];
/// - beta kLogit: beta = dtype(sigmoid(beta)) as fp32 (rounded to beta's own dtype), out [T, H].
/// g: kLinear converts to fp32 (the transforms' path materializes both gates).
enum class GdnGateMode : uint8_t { kNone, kLinear, kLog, kRaw };
/// beta: kConvert to fp32 as is, kLogit through the sigmoid.
enum class GdnBetaMode : uint8_t { kNone, kConvert, kLogit };
struct GdnPrefillPrepParams {
  int64_t T = 0, H = 0, D = 0;
  DType io_dtype = DType::kBFloat16;
  bool l2norm = false;
  const void *q = nullptr, *k = nullptr;
  int64_t Hq = 0, Hk = 0;
  int64_t q_stride_tok = 0, q_stride_head = 0, k_stride_tok = 0, k_stride_head = 0;
  void *q_out = nullptr, *k_out = nullptr;
  GdnGateMode g_mode = GdnGateMode::kNone;
  GdnGateRef g;
  const void* A_log = nullptr;
  DType A_log_dtype = DType::kFloat32;
  const void* dt_bias = nullptr;
  DType dt_bias_dtype = DType::kFloat32;
  float* g_out = nullptr;
  GdnBetaMode beta_mode = GdnBetaMode::kNone;
  GdnGateRef beta;
  float* beta_out = nullptr;
};

}  // namespace flashinfer::kernels
