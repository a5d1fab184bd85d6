// Kimi delta attention (KDA) of flashinfer.kda: the gated delta rule with one decay per key
// channel (Kimi Linear's linear-attention layers, which vLLM and SGLang serve): decode, speculative
// verification and prefill against a bf16 state pool. CPU reference everywhere; a CUDA kernel.
// docs/LINEAR_ATTENTION.md ("Kimi delta attention") gives the math, layouts and index rules.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// recurrent_kda's result: (output, final_state or None), or with state checkpoints (output,
/// final_state, state_checkpoints).
struct KdaOutput {
  Tensor output, final_state, state_checkpoints;
};
Value to_value(const KdaOutput& r);

/// q, k [B, T, H, K] and v, g [B, T, HV, K] (K = V, 64 or 128), beta [B, T, HV], all bf16; [1,
/// total_tokens, ..] with cu_seqlens [N + 1]. Per value head hv (query head hv / (HV / H)) and
/// token: S[k, :] *= exp(a[k]); u = beta (v - S^T k^); S += k^ u^T; o = S^T q^ (bf16), with a = g
/// (use_gate_in_kernel False), -exp(A_log) softplus(g + dt_bias), or lower_bound *
/// sigmoid(exp(A_log) (g + dt_bias)); beta sigmoid'ed when beta_is_logit; q^ = q scale / |q|, k^ =
/// k / |k| (eps 1e-6 inside the norms) with use_qk_l2norm_in_kernel. initial_state [slots, HV, V,
/// K] bf16 (K contiguous) is read and updated in place at ssm_state_indices (negative: padding;
/// python's wrap without cu_seqlens); num_spec_tokens S verifies 1 + S tokens a sequence, each
/// writing its state to ssm_state_indices[n, t], the first read at column num_accepted_tokens[n] -
/// 1; initial_state_source / initial_state_indices supply the first read instead. Several tokens
/// a sequence without S: prefill (every token; state checkpoints every checkpoint_every_n_tokens:
/// rows checkpoint_cu_starts[n] + j hold the state before token j N, the initial state first; with
/// checkpoint_state_indices (0.7.4) the state after each completed boundary j N <= len goes to row
/// checkpoint_state_indices[checkpoint_cu_starts[n] + j - 1], rows outside the pool skipped).
/// disable_state_update (0.7.4's frozen verify): up to 16 tokens a sequence from the committed
/// state (initial_state_source, else initial_state; at initial_state_indices, else
/// ssm_state_indices, else n; negative: zero outputs), nothing stored, (output, None) returned;
/// correction_cache [pool slots, HV, window, V] fp32 gets u = beta (v - S^T k^) and kg_cache
/// [pool slots, HV, window, 2 K] bf16 the raw key | raw gate of each token, at the read slot.
KdaOutput recurrent_kda(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
    std::optional<Tensor> A_log = std::nullopt, std::optional<Tensor> dt_bias = std::nullopt,
    std::optional<double> scale = std::nullopt, std::optional<Tensor> initial_state = std::nullopt,
    bool output_final_state = false, bool use_qk_l2norm_in_kernel = true,
    bool use_gate_in_kernel = false, std::optional<double> lower_bound = std::nullopt,
    std::optional<Tensor> cu_seqlens = std::nullopt,
    std::optional<Tensor> ssm_state_indices = std::nullopt,
    std::optional<int64_t> num_spec_tokens = std::nullopt,
    std::optional<Tensor> num_accepted_tokens = std::nullopt,
    std::optional<Tensor> output = std::nullopt,
    std::optional<Tensor> initial_state_source = std::nullopt,
    std::optional<Tensor> initial_state_indices = std::nullopt, bool beta_is_logit = false,
    std::optional<Tensor> seq_order = std::nullopt,
    std::optional<Value> prefill_workspace = std::nullopt,
    std::optional<Tensor> state_checkpoints = std::nullopt,
    std::optional<Tensor> checkpoint_cu_starts = std::nullopt,
    int64_t checkpoint_every_n_tokens = 0,
    std::optional<Tensor> checkpoint_state_indices = std::nullopt,
    bool disable_state_update = false, std::optional<Tensor> correction_cache = std::nullopt,
    std::optional<Tensor> kg_cache = std::nullopt, std::string backend = "auto");

/// One decode token a row with the layer's causal conv and output norm fused
/// (flashinfer.kda_decode; equal heads H in {8, 12, 16, 24, 32, 48, 64, 96} of 128): x [R, 3 H 128]
/// bf16 (q | k | v channels) through the width-4 depthwise conv (weight [3, 4, H 128] fp32;
/// conv_state [slots, 3 H 128, 3] bf16 in the SD layout, updated) and SiLU; the KDA step on state
/// [slots, H, 128, 128] (fp32 or bf16, updated) with the lower-bound gate (lower_bound None:
/// softplus), beta = sigmoid(raw_beta) and scale 128^-0.5; the gated RMSNorm y = o rsqrt(mean(o^2)
/// + norm_eps) norm_weight sigmoid(output_gate). state_indices [R] int32: a slot <= 0 is a null row
/// (zeros; slot 0 is the null slot). Returns output [1, R, H, 128] bf16. backend (0.7.4) "cute-dsl"
/// or "auto" run this; "cake" (SM100a / SM103a routes) is refused as upstream refuses it where no
/// route applies; state_indices_mode is checked and changes nothing (rows run in order).
Tensor fused_kda_decode(const Tensor& x, const Tensor& weight, const Tensor& conv_state,
                        const Tensor& raw_gate, const Tensor& raw_beta, const Tensor& A_log,
                        const Tensor& dt_bias, const Tensor& state_indices, const Tensor& state,
                        const Tensor& output_gate, const Tensor& norm_weight,
                        std::optional<double> lower_bound = -5.0, double norm_eps = 1e-5,
                        std::optional<Tensor> output = std::nullopt,
                        std::string_view backend = "cute-dsl",
                        std::optional<std::string> state_indices_mode = std::nullopt);

/// The KDA decode step with fixed parameters (12 heads of 128, lower-bound gate -5, logit betas,
/// L2 norms, scale 128^-0.5) on post-conv rows mixed_qkv [B, 4608] (q | k | v), raw_gate [B,
/// 1536], raw_beta [B, 12], state [N, 12, 128, 128] bf16 (updated) at state_indices [B] int32
/// (-1: an inactive row, zeros). Upstream runs it on sm100 / 103 / 107 only. Returns output [B, 1,
/// 12, 128] bf16.
Tensor packed_kda_decode(const Tensor& mixed_qkv, const Tensor& raw_gate, const Tensor& raw_beta,
                         const Tensor& A_log, const Tensor& dt_bias, const Tensor& state,
                         const Tensor& state_indices, std::optional<Tensor> output = std::nullopt);

}  // namespace flashinfer
