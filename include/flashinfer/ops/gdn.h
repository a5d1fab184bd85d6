// Gated delta rule (GDN) linear attention of flashinfer.gdn_decode and flashinfer.gdn_prefill
// (Qwen3-Next / Qwen3.5's linear-attention layers): the decode steps against a recurrent state
// pool and the chunked prefill over packed sequences. CPU reference everywhere; CUDA kernels on
// the GPUs upstream runs them on (sm90+). docs/LINEAR_ATTENTION.md gives the math, layouts and
// index rules.
//
// Per state head h and token t, with S the K x V state (stored K-last: [.., V, K] element
// [v, k] = S[k, v], except gated_delta_rule_decode's [.., K, V]):
//   S = decay_t * S;  u = beta_t * (v_t - S^T k_t);  S += k_t u^T;  o_t = S^T q_t (times scale)
#pragma once

#include <optional>
#include <string>
#include <tuple>

#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// Decode step(s) of T tokens per request. q, k [B, T, H, K] and v [B, T, HV, V] fp16 / bf16
/// (HV a multiple of H); a, b [B, T, HV]; A_log [HV] fp32; dt_bias [HV] fp32 / bf16. decay =
/// exp(-exp(A_log) * softplus(a + dt_bias)), beta = sigmoid(b); with use_qk_l2norm q and k are
/// L2-normalized (eps 1e-6 inside the rsqrt); q is scaled by `scale` (default K^-0.5). The state
/// is `state` [B, HV, V, K] (fp32 or bf16; updated in place) or, in pool mode, initial_state
/// [pool, HV, V, K] read at initial_state_indices[b] and written at output_state_indices[b] (or
/// the read slot). Output [B, T, HV, V] (bf16-rounded, in q's dtype unless `output` is given).
/// Returns (output, state or initial_state).
std::tuple<Tensor, Tensor> gated_delta_rule_decode_pretranspose(
    const Tensor& q, const Tensor& k, const Tensor& v, std::optional<Tensor> state,
    const Tensor& A_log, const Tensor& a, const Tensor& dt_bias, const Tensor& b,
    std::optional<double> scale = std::nullopt, std::optional<Tensor> output = std::nullopt,
    bool use_qk_l2norm = true, std::optional<Tensor> initial_state = std::nullopt,
    std::optional<Tensor> initial_state_indices = std::nullopt,
    std::optional<Tensor> output_state_indices = std::nullopt,
    std::optional<Tensor> intermediate_states_buffer = std::nullopt,
    bool disable_state_update = false, const std::string& backend = "auto");

/// One decode step (T = 1) with the state K-major: fp32 [B, HV, K, V], updated in place.
/// backend (upstream 0.7.4): "auto", "flashinfer" or "cake_gdn" (a kernel choice; refused on a
/// CUDA device that is not SM100-class, as upstream). The pretranspose form above also takes
/// "rubin" (SM107), intermediate_states_buffer (T > 1, fp32 state: the state after each token,
/// as gated_delta_rule_mtp writes it) and disable_state_update (T > 1: the pool's final state
/// left as it was).
std::tuple<Tensor, Tensor> gated_delta_rule_decode(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& state, const Tensor& A_log,
    const Tensor& a, const Tensor& dt_bias, const Tensor& b,
    std::optional<double> scale = std::nullopt, std::optional<Tensor> output = std::nullopt,
    bool use_qk_l2norm = true, const std::string& backend = "auto");

/// Multi-token (speculative verify) steps from an fp32 pool initial_state [pool, HV, V, K] read
/// at initial_state_indices[b] (negative: the request is skipped). Each token's state goes to
/// intermediate_states_buffer (fp32 [>= B, >= T, HV, V, K], contiguous) or to the pool at
/// ssm_state_indices[b, t]; the final state to output_state_indices[b] (or the read slot) unless
/// disable_state_update (None means True, upstream's default). Returns (output, initial_state).
/// cache_replayssm (upstream 0.7.4's ReplaySSM verify; the pool frozen): for each request with
/// read slot s >= 0, replayssm_rawv [pool, HV, T, V] / replayssm_rawk [pool, H, T, K] (bf16) get
/// its v and un-normalized k, replayssm_g [pool, HV, T] fp32 -exp(A_log) softplus(a + dt_bias),
/// replayssm_beta sigmoid(b) (docs/LINEAR_ATTENTION.md); K = V = 128, T >= 3.
std::tuple<Tensor, Tensor> gated_delta_rule_mtp(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& initial_state,
    const Tensor& initial_state_indices, const Tensor& A_log, const Tensor& a,
    const Tensor& dt_bias, const Tensor& b, std::optional<double> scale = std::nullopt,
    std::optional<Tensor> output = std::nullopt,
    std::optional<Tensor> intermediate_states_buffer = std::nullopt,
    std::optional<Tensor> ssm_state_indices = std::nullopt,
    std::optional<bool> disable_state_update = std::nullopt, bool use_qk_l2norm = true,
    std::optional<Tensor> output_state_indices = std::nullopt, bool cache_replayssm = false,
    std::optional<Tensor> replayssm_rawv = std::nullopt,
    std::optional<Tensor> replayssm_rawk = std::nullopt,
    std::optional<Tensor> replayssm_g = std::nullopt,
    std::optional<Tensor> replayssm_beta = std::nullopt);

/// chunk_gated_delta_rule's result: `output` [T, H, D], and `final_state` [N, H, D, D] fp32
/// when output_final_state was set (recorded as upstream returns it: the tensor, or the pair).
struct GdnPrefillOutput {
  Tensor output;
  Tensor final_state;
  operator Tensor() const { return output; }  // NOLINT: implicit like upstream's return value
};
Value to_value(const GdnPrefillOutput& r);

/// Prefill over packed sequences (cu_seqlens [N + 1], int32 / int64, required): q [T, Hq, D],
/// k [T, Hk, D], v [T, Hv, D] fp16 / bf16 of one head size D, H = max(Hq, Hv) state heads (GQA:
/// Hk == Hv, Hq a multiple; GVA: Hq == Hk, Hv a multiple). g (the decay itself, not its log) and
/// beta fp32 [T, H], ones when None; scale (None or 0: D^-0.5) multiplies the output.
/// initial_state / output_state fp32 [N, H, D, D] K-last, or pools indexed by state_indices [N].
/// State checkpoints every checkpoint_every_n_tokens (a multiple of 64) tokens per sequence go
/// to state_checkpoints[checkpoint_cu_starts[n] + j]. use_cp picks upstream's context-parallel
/// kernel (the same recurrence; validated, not needed here).
/// Upstream 0.7.4's signature (docs/LINEAR_ATTENTION.md): use_qk_l2norm_in_kernel normalizes q
/// and k (fp32 sums, eps 1e-6, rounded to their dtype); gate_domain "log" (g = log alpha),
/// use_gate_in_kernel (g raw: alpha = exp(-exp(A_log) * softplus(g + dt_bias))) and
/// beta_is_logit (beta = sigmoid, rounded to beta's dtype); output_state_indices (write rows,
/// -1 reads zeros / skips the write), checkpoint_state_indices (checkpoint pool rows, -1 skips),
/// prefix_lens (absolute checkpoint positions); backend, max_seqlen and cu_seqlens_cpu checked
/// as upstream, hints here.
GdnPrefillOutput chunk_gated_delta_rule(
    const Tensor& q, const Tensor& k, const Tensor& v, std::optional<Tensor> g = std::nullopt,
    std::optional<Tensor> beta = std::nullopt, std::optional<double> scale = std::nullopt,
    std::optional<Tensor> initial_state = std::nullopt, bool output_final_state = false,
    std::optional<Tensor> cu_seqlens = std::nullopt, bool use_qk_l2norm_in_kernel = false,
    std::optional<Tensor> output = std::nullopt, std::optional<Tensor> output_state = std::nullopt,
    std::optional<Tensor> state_checkpoints = std::nullopt,
    std::optional<Tensor> checkpoint_cu_starts = std::nullopt,
    int64_t checkpoint_every_n_tokens = 0, Value use_cp = Value(std::string("auto")),
    std::optional<Tensor> state_indices = std::nullopt,
    std::optional<int64_t> _cp_chunk_len = std::nullopt, const std::string& backend = "auto",
    std::optional<int64_t> max_seqlen = std::nullopt, const std::string& gate_domain = "linear",
    bool use_gate_in_kernel = false, std::optional<Tensor> A_log = std::nullopt,
    std::optional<Tensor> dt_bias = std::nullopt, bool beta_is_logit = false,
    Value cu_seqlens_cpu = Value(), std::optional<Tensor> output_state_indices = std::nullopt,
    std::optional<Tensor> checkpoint_state_indices = std::nullopt,
    std::optional<Tensor> prefix_lens = std::nullopt);

/// One decode step of a GDN layer with the serving chain around it fused
/// (flashinfer.gdn_kernels.experimental.gdn_fused_decode; upstream's composable path is the
/// specification, docs/LINEAR_ATTENTION.md "Fused decode step"): ba = bf16(hidden_states @ w_ba)
/// (fp32 sums; b = ba[:, :HV], a = ba[:, HV:]); the depthwise causal conv1d update (silu, fp32,
/// bf16 out) of mixed_qkv over the conv-state pool rows at state_indices, which shift left and
/// take the raw input; q / k / v split from the conv output ((2 * H_q + HV) * D channels); the
/// gated delta rule (qk L2 norm when use_qk_l2norm) on the fp32 K-last pool ssm_state [P, HV, V,
/// K] in place, the output times `scale` (None or 0: D^-0.5). hidden_states [B, hidden], w_ba
/// [hidden, 2 * HV], mixed_qkv [B, qkv_dim], conv_weight [qkv_dim, W], conv_bias [qkv_dim],
/// conv_state the logical [P, qkv_dim, W - 1] view (an SD pool's transpose or a DS pool), dt_bias
/// all bf16; A_log [HV] fp32; state_indices [B] int32 / int64 in [0, P). Returns (output [B, 1,
/// HV, V] bf16 (`out` when given), conv_state, ssm_state).
std::tuple<Tensor, Tensor, Tensor> gdn_fused_decode_step(
    const Tensor& hidden_states, const Tensor& w_ba, const Tensor& mixed_qkv,
    const Tensor& conv_weight, const Tensor& conv_bias, const Tensor& conv_state,
    const Tensor& A_log, const Tensor& dt_bias, std::optional<double> scale,
    const Tensor& ssm_state, const Tensor& state_indices, bool use_qk_l2norm = true,
    std::optional<Tensor> out = std::nullopt);

/// Upstream's routing probe: true when upstream serves this geometry with a specialized kernel on
/// `device` (None: CUDA device 0; an index, "cuda:N" or a torch.device): the rows of its
/// registry (compute capability 12.0 / 12.1; Qwen3.6-27B's and Qwen3.6-35B-A3B's layers at
/// decode batches 1-8 / 1-4, an "SD" conv pool). The answer is upstream's so that engines route
/// as with upstream and recorded probes replay; this library's fused step runs everywhere.
bool gdn_fused_decode_step_supported(int64_t batch_size, int64_t hidden_size = 5120,
                                     int64_t n_ba = 96, int64_t qkv_dim = 10240,
                                     int64_t num_qk_heads = 16, int64_t num_v_heads = 48,
                                     int64_t head_dim = 128, int64_t conv_width = 4,
                                     int64_t conv_state_len = 3,
                                     std::optional<Value> device = std::nullopt,
                                     std::string conv_state_layout = "SD");

}  // namespace flashinfer
