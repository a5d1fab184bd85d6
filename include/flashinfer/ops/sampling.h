// Sampling ops (FlashInfer module flashinfer.sampling): softmax with temperature, sampling from
// probabilities or logits with top-k / top-p / min-p filters, and the filters on their own.
//
// Conventions shared by every op here:
//  * probs / logits are [batch, vocab] (fp32, fp16 or bf16, any strides); math is fp32.
//  * Thresholds are one scalar for all rows or a per-row tensor [batch] on the input's device
//    (ScalarOrTensor). Rows of a per-row tensor belong to output rows.
//  * indices (optional, int32 or int64 [batch_out]) maps output row i to input row indices[i];
//    the samples then have indices' dtype, otherwise int32.
//  * Randomness: Philox-4x32-10 in cuRAND's layout, curand_init(seed, subsequence = output row,
//    offset), uniforms in (0, 1]. The same seed and offset give the same samples on a backend
//    every time, and the CPU and CUDA backends draw the same numbers with the same algorithm, so
//    they pick the same tokens except where fp32 summation order decides.
//    seed and offset are given together, both integers or both int64 tensors of length 1 or
//    batch_out; they are 64-bit patterns (a negative int64 stands for its two's complement).
//    Upstream's `generator` (a torch.Generator) has no C++ counterpart: when seed and offset
//    are absent the library's own default stream supplies them (see sampling_manual_seed) and
//    advances its offset like upstream advances the generator's. The `generator` slot is kept
//    in the op declarations so recorded argument indices match upstream's; a recorded
//    generator is ignored on replay.
//  * deterministic / is_deterministic are accepted for compatibility; both backends are always
//    deterministic (fixed-order reductions, no floating-point atomics).
//  * Scalars, shapes, dtypes and devices are validated on the host, and so are the values of
//    per-row tensors on the CPU. The kernels read a CUDA tensor's values on the device (no host
//    copy, no synchronization but check_nan's flag), so a CUDA call returns once its kernels
//    are queued and can be captured in a CUDA graph; there an index outside the input is
//    clamped, a negative top_k means no limit and top_k = 0 keeps no token (valid = false), as
//    upstream's kernels read top_k (docs/SAMPLING.md, "Arguments and errors").
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// Upstream's Union[Tensor, int] / Union[Tensor, float]: one value for every row, or a tensor.
template <class T>
class ScalarOrTensor {
 public:
  template <class U>
  requires(std::is_arithmetic_v<U> && !std::same_as<U, bool>) ScalarOrTensor(U v)
      : scalar_(static_cast<T>(v)) {}
  ScalarOrTensor(Tensor t) : tensor_(std::move(t)) {}

  bool is_tensor() const { return tensor_.defined(); }
  T scalar() const { return scalar_; }
  const Tensor& tensor() const { return tensor_; }
  /// f(tensor, -1) when a tensor was given (the gate's written-argument check sees it as an
  /// input that a written tensor must not overlap).
  template <class F>
  void for_each_tensor(F&& f) const {
    if (tensor_.defined()) f(tensor_, -1);
  }

 private:
  T scalar_{};
  Tensor tensor_;
};

template <class T>
Value to_value(const ScalarOrTensor<T>& v) {
  return v.is_tensor() ? Value(v.tensor()) : Value(v.scalar());
}

/// What the samplers return: `samples` [batch_out] (int32, or indices' dtype), and `valid`
/// [batch_out] bool only when return_valid was set (false for a row with no token left to
/// sample: all probabilities zero or NaN; such a row samples 0). Converts to the samples tensor.
struct SamplingResult {
  Tensor samples;
  Tensor valid;
  operator Tensor() const { return samples; }  // NOLINT: mirrors upstream returning a Tensor
};

/// Recorded like upstream's return value: the samples tensor, or (samples, valid).
Value to_value(const SamplingResult& r);

/// Reseeds the library's default Philox stream (used when seed/offset are absent) and resets
/// its offset to 0. The initial seed is 67280421310721, torch's default.
void sampling_manual_seed(uint64_t seed);

/// Softmax of logits / temperature along the last dimension, returned as fp32 [batch, vocab].
/// temperature: absent (1), a positive scalar, or a per-row tensor [batch] of positive values.
Tensor softmax(const Tensor& logits,
               std::optional<ScalarOrTensor<double>> temperature = std::nullopt,
               std::optional<bool> enable_pdl = std::nullopt);

/// Inverse-CDF sampling: one uniform u per row, the first token whose inclusive prefix sum of
/// probs exceeds u (probs are expected to sum to 1 and are not renormalized).
SamplingResult sampling_from_probs(const Tensor& probs,
                                   std::optional<Tensor> indices = std::nullopt,
                                   bool deterministic = true, bool check_nan = false,
                                   std::optional<ScalarOrTensor<int64_t>> seed = std::nullopt,
                                   std::optional<ScalarOrTensor<int64_t>> offset = std::nullopt,
                                   bool return_valid = false);

/// Sampling from softmax(logits) by Gumbel-max: argmax(logit + g), g = -log(-log(u)), one
/// uniform per element (element j uses position offset + j of the row's stream).
Tensor sampling_from_logits(const Tensor& logits, std::optional<Tensor> indices = std::nullopt,
                            bool deterministic = true, bool check_nan = false,
                            std::optional<ScalarOrTensor<int64_t>> seed = std::nullopt,
                            std::optional<ScalarOrTensor<int64_t>> offset = std::nullopt);

/// Top-p (nucleus) sampling by dual-pivot rejection: token j is kept iff the mass of tokens with
/// a strictly larger prob is below top_p. top_p in (0, 1].
SamplingResult top_p_sampling_from_probs(
    const Tensor& probs, ScalarOrTensor<double> top_p, std::optional<Tensor> indices = std::nullopt,
    bool deterministic = true, bool check_nan = false,
    std::optional<ScalarOrTensor<int64_t>> seed = std::nullopt,
    std::optional<ScalarOrTensor<int64_t>> offset = std::nullopt, bool return_valid = false);

/// Top-k sampling by dual-pivot rejection: token j is kept iff fewer than top_k tokens have a
/// strictly larger prob (ties at the boundary are all kept). top_k >= 1.
SamplingResult top_k_sampling_from_probs(
    const Tensor& probs, ScalarOrTensor<int64_t> top_k,
    std::optional<Tensor> indices = std::nullopt, bool deterministic = true, bool check_nan = false,
    std::optional<ScalarOrTensor<int64_t>> seed = std::nullopt,
    std::optional<ScalarOrTensor<int64_t>> offset = std::nullopt, bool return_valid = false);

/// Min-p sampling: keeps p >= min_p * max(p), then inverse-CDF sampling scaled by the kept mass.
/// min_p in [0, 1].
SamplingResult min_p_sampling_from_probs(
    const Tensor& probs, ScalarOrTensor<double> min_p, std::optional<Tensor> indices = std::nullopt,
    bool deterministic = true, bool check_nan = false,
    std::optional<ScalarOrTensor<int64_t>> seed = std::nullopt,
    std::optional<ScalarOrTensor<int64_t>> offset = std::nullopt, bool return_valid = false);

/// Top-k and top-p together. filter_apply_order "top_k_first": top_k_renorm_probs, then top-p
/// sampling of the renormalized rows; "joint": one rejection loop testing both filters against
/// the original probs. With a vocabulary of at least 65536 and a k in (0, 256] ("top_k_first"
/// only; for a top_k tensor, `top_k_max` is that k and bounds every row's), upstream 0.7.4's fast
/// path instead: a sorted top-k, then top-p sampling over those columns (other draws, the same
/// distribution; a row's k of 0 is greedy there, a k above top_k_max is cut to it).
SamplingResult top_k_top_p_sampling_from_probs(
    const Tensor& probs, ScalarOrTensor<int64_t> top_k, ScalarOrTensor<double> top_p,
    std::optional<Tensor> indices = std::nullopt,
    const std::string& filter_apply_order = "top_k_first", bool deterministic = true,
    bool check_nan = false, std::optional<ScalarOrTensor<int64_t>> seed = std::nullopt,
    std::optional<ScalarOrTensor<int64_t>> offset = std::nullopt, bool return_valid = false,
    std::optional<int64_t> top_k_max = std::nullopt);

/// Top-k and top-p from logits. "top_k_first": top_k_mask_logits, softmax, top-p sampling;
/// "joint": softmax, then the joint rejection loop. The fast path and `top_k_max` as for the
/// probs.
Tensor top_k_top_p_sampling_from_logits(
    const Tensor& logits, ScalarOrTensor<int64_t> top_k, ScalarOrTensor<double> top_p,
    std::optional<Tensor> indices = std::nullopt,
    const std::string& filter_apply_order = "top_k_first", bool deterministic = true,
    bool check_nan = false, std::optional<ScalarOrTensor<int64_t>> seed = std::nullopt,
    std::optional<ScalarOrTensor<int64_t>> offset = std::nullopt,
    std::optional<int64_t> top_k_max = std::nullopt);

/// Logits with every entry outside the top-k set to -inf (same dtype; NaN entries are masked).
Tensor top_k_mask_logits(const Tensor& logits, ScalarOrTensor<int64_t> top_k);

/// Probs with every entry outside the top-k zeroed, renormalized to sum 1 (same dtype).
/// `is_deterministic` (upstream 0.7.4) picks how upstream's multi-block kernel adds its blocks'
/// sums; the result here is deterministic either way.
Tensor top_k_renorm_probs(const Tensor& probs, ScalarOrTensor<int64_t> top_k,
                          bool is_deterministic = false);

/// Probs outside the top-p nucleus zeroed, renormalized; returned as fp32 (upstream casts the
/// input to fp32 first).
Tensor top_p_renorm_probs(const Tensor& probs, ScalarOrTensor<double> top_p,
                          bool is_deterministic = false);

}  // namespace flashinfer

namespace flashinfer {

/// Chain speculative sampling (upstream's algorithm, one Philox stream per request: key = seed,
/// subsequence = request row, positions from `offset`, one uniform u in (0, 1] per draw):
///   1. for i = 0..n-1: draw u; the draft token d_i is accepted while u * draft_probs[b, i, d_i]
///      < target_probs[b, i, d_i]; the first rejection is position pos (pos = n if none);
///   2. for i = pos..n-1 (the rejected position again, with a fresh draw): draw u and count
///      u * p < q: accepted = pos + that count ("each token considered independently");
///   3. draw u, sample token t from relu(target_probs[b, pos] - draft_probs[b, pos]) (just
///      target_probs[b, n] when pos == n) by inverse CDF at u * sum (the first index whose
///      running fp32 sum exceeds it, else the last positive entry, else 0).
/// output_token_ids[b] = d_0..d_{pos-1}, t, then -1 up to n + 1 entries;
/// output_accepted_token_num[b] += accepted; output_emitted_draft_token_num[b] += pos (the
/// given tensors are updated in place and returned; zeros are used when None).
///   draft_probs [B, n, V], target_probs [B, n + 1, V] fp32/fp16/bf16 (same dtype);
///   draft_token_ids [B, n] int32 or int64 (outputs take its dtype); ids outside [0, V) are an
///   Error on the CPU; on CUDA the kernel reads their probabilities at the id clamped into the
///   row (no host copy of the ids).
///   seed/offset: integers or one-element int32/int64 tensors (on the CPU or the probabilities'
///   device), both or neither; without them the library's default stream supplies them
///   (advanced by n + 2, rounded up to 4).
/// Returns (output_token_ids [B, n + 1], output_accepted_token_num [B],
/// output_emitted_draft_token_num [B]). CPU reference and CUDA kernel.
std::tuple<Tensor, Tensor, Tensor> chain_speculative_sampling(
    const Tensor& draft_probs, const Tensor& draft_token_ids, const Tensor& target_probs,
    std::optional<Tensor> maybe_output_accepted_token_num = std::nullopt,
    std::optional<Tensor> maybe_output_emitted_draft_token_num = std::nullopt,
    bool deterministic = true, std::optional<ScalarOrTensor<int64_t>> seed = std::nullopt,
    std::optional<ScalarOrTensor<int64_t>> offset = std::nullopt);

}  // namespace flashinfer
