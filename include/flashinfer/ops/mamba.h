// Mamba-2 selective state update of flashinfer.mamba (the SSM layers of Nemotron-H, Granite 4,
// Falcon-H1, Zamba2 and the other hybrid models vLLM and SGLang serve): one decode token (STP),
// several draft tokens a request (MTP), or packed sequences (varlen), against a state cache. CPU
// reference everywhere; a CUDA kernel. docs/LINEAR_ATTENTION.md ("Mamba") gives the math, the
// slot rules and the rounding of stored states.
//
// Per sequence, head h and state row d (g = h / (nheads / ngroups)):
//   dt = softplus?(dt + dt_bias);  s = s * exp(A * dt) + B_g * dt * x;  y = D * x + s . C_g
//   y *= silu(z)  (when z is given)
#pragma once

#include <optional>
#include <string>

#include "flashinfer/tensor.h"

namespace flashinfer {

/// state [cache, nheads, dim, dstate] (or [cache, dim, dstate]: one head) of fp32 / fp16 / bf16,
/// or int16 with state_scale [cache, nheads, dim] fp32 (decode scales; updated in place). x, z,
/// out [batch, nheads, dim] (STP), [batch, T, nheads, dim] (MTP: a 4-D x, or cache_steps >= 1),
/// or [total_tokens, nheads, dim] with cu_seqlens (varlen); 2-D forms gain a head axis. dt like
/// x, one value per head (upstream broadcasts it along dim, stride 0); B, C [.., ngroups,
/// dstate] of x's dtype; A [nheads, dim, dstate] fp32 and D, dt_bias [nheads, dim] of dt's dtype,
/// one value per head. state_batch_indices [batch] or [batch, max_seqlen] pick the read slots
/// (pad_slot_id: padding, zero state, nothing stored); dst_state_batch_indices the write slots
/// (STP) or every step's (MTP / varlen); intermediate_states_buffer [entries, steps, nheads, dim,
/// dstate] every step's state at intermediate_state_indices[b] (default: the read slot);
/// num_accepted_tokens[b] - 1 the index column of the read slot. rand_seed (int64, one element)
/// rounds fp16 states stochastically. Returns out (allocated like the normalized x when None).
Tensor selective_state_update(
    const Tensor& state, const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B,
    const Tensor& C, const Tensor& D, std::optional<Tensor> z = std::nullopt,
    std::optional<Tensor> dt_bias = std::nullopt, bool dt_softplus = false,
    std::optional<Tensor> state_batch_indices = std::nullopt, int64_t pad_slot_id = -1,
    std::optional<Tensor> state_scale = std::nullopt, std::optional<Tensor> out = std::nullopt,
    bool disable_state_update = false,
    std::optional<Tensor> intermediate_states_buffer = std::nullopt,
    std::optional<Tensor> intermediate_state_indices = std::nullopt,
    std::optional<Tensor> intermediate_state_scales = std::nullopt,
    std::optional<Tensor> rand_seed = std::nullopt, int64_t philox_rounds = 10,
    int64_t cache_steps = 0, std::string algorithm = "auto",
    std::optional<Tensor> dst_state_batch_indices = std::nullopt,
    std::optional<Tensor> cu_seqlens = std::nullopt,
    std::optional<Tensor> num_accepted_tokens = std::nullopt, std::string backend = "auto");

/// ReplaySSM: the update from a checkpoint `state` and a ring of the raw inputs of the tokens
/// since (x_cache [cache, nheads, L, dim], B_cache [cache, ngroups, L, dstate] of x's dtype,
/// dt_cache [cache, nheads, L] fp32 holding the processed dt; live rows (ring_start[s] + i) % L
/// for i < prev_num_accepted_tokens[s], both int32 [cache] and only read). Per row (slot
/// state_batch_indices[b], or b; pad_slot_id: skipped whole): the history replayed into the
/// checkpoint, the T new tokens (x, dt, B, C, z, out [batch, T, ..], or [1, total_tokens, ..]
/// with cu_seqlens and max_seqlen) run from it for `out`, the replayed state stored when pnat +
/// n > L - T (a flush), the new tokens appended at rows (ring_start + pnat + t) % L. State f16 /
/// bf16 / f32, or int8 / float8_e4m3fn with state_scale. d_split, enable_pdl, the scratch trio,
/// precompute_heads_per_cta and algorithm tune upstream's kernels and are validated only.
/// Returns out.
Tensor checkpointing_ssu(
    const Tensor& state, const Tensor& x_cache, const Tensor& B_cache, const Tensor& dt_cache,
    const Tensor& ring_start, const Tensor& prev_num_accepted_tokens, const Tensor& x,
    const Tensor& dt, const Tensor& A, const Tensor& B, const Tensor& C, const Tensor& out,
    std::optional<Tensor> D = std::nullopt, std::optional<Tensor> z = std::nullopt,
    std::optional<Tensor> dt_bias = std::nullopt, bool dt_softplus = false,
    std::optional<Tensor> state_batch_indices = std::nullopt, int64_t pad_slot_id = -1,
    std::optional<Tensor> state_scale = std::nullopt,
    std::optional<Tensor> rand_seed = std::nullopt, int64_t philox_rounds = 10,
    std::optional<int64_t> d_split = std::nullopt, std::optional<Tensor> cu_seqlens = std::nullopt,
    std::optional<int64_t> max_seqlen = std::nullopt, bool enable_pdl = false,
    std::optional<Tensor> cb_scaled = std::nullopt, std::optional<Tensor> cumAdt_vec = std::nullopt,
    std::optional<Tensor> cb_old = std::nullopt, int64_t precompute_heads_per_cta = 0,
    std::string algorithm = "auto");

}  // namespace flashinfer
