// flashinfer.prefill.trtllm_fmha_v2_prefill: TRT-LLM FMHAv2 prefill over ragged (packed, (Q, KV),
// (Q, K, V)) or paged (Q, paged KV + block table) inputs. CPU reference only in this library.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flashinfer/ops/attention.h"
#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// Upstream's qkv argument: one tensor (PACKED_QKV) or a tuple of two ((Q, KV), (Q, paged KV))
/// or three ((Q, K, V)) tensors, recorded as upstream records a tuple.
class FmhaV2Qkv {
 public:
  FmhaV2Qkv() = default;
  FmhaV2Qkv(Tensor packed) : t_{std::move(packed)}, single_(true) {}  // NOLINT: like Python
  FmhaV2Qkv(Tensor a, Tensor b) : t_{std::move(a), std::move(b)} {}
  FmhaV2Qkv(Tensor a, Tensor b, Tensor c) : t_{std::move(a), std::move(b), std::move(c)} {}

  /// From a recorded value: a tensor, or a tuple/list of two or three tensors.
  static FmhaV2Qkv from_value(const Value& v);

  bool is_single() const { return single_; }
  const std::vector<Tensor>& tensors() const { return t_; }
  template <class F>
  void for_each_tensor(F&& f) const {
    if (single_) {
      f(t_[0], -1);
    } else {
      for (std::size_t i = 0; i < t_.size(); ++i) f(t_[i], static_cast<int>(i));
    }
  }

 private:
  std::vector<Tensor> t_;
  bool single_ = false;
};

/// A tensor, or a tuple of the tensors, as upstream records the argument.
Value to_value(const FmhaV2Qkv& qkv);

/// input_layout (case as upstream: exact upper-case names):
///   "PACKED_QKV"       qkv = [tokens, 3, H, D] (MHA: K and V have H heads);
///   "CONTIGUOUS_Q_KV"  qkv = (Q [tokens, H, D], KV [kv tokens, 2, Hkv, D]);
///   "SEPARATE_Q_K_V"   qkv = (Q [tokens, H, D], K [kv tokens, Hkv, D], V [kv tokens, Hkv, Dv]);
///   "Q_PAGED_KV_NHD"   qkv = (Q, paged KV [pages, 2, page_size, Hkv, D]) with block_tables;
///   "Q_PAGED_KV_HND"   qkv = (Q, paged KV [pages, 2, Hkv, page_size, D]) with block_tables.
/// Request b owns query rows cum_seq_lens_q[b]..[b+1] and seq_lens[b] keys (ragged layouts: rows
/// cum_seq_lens_kv[b].., whose segment must equal seq_lens[b]; paged: block_tables[b]'s first
/// ceil(seq_lens[b] / page_size) pages). Query i of qo_len sits at kv_len - qo_len + i.
///   s_j = bmm1_scale * q . k_j, then c * tanh(s_j / c) with c = logits_soft_cap_scale > 0;
///   out = bmm2_scale * sum_j softmax(s)_j v_j, with exp(sinks[h]) added to head h's denominator.
/// mask_mode (any case): "causal" (keys j <= pos), "sliding_window" / "chunked" (causal, with
/// window_left >= 0 keeping j >= pos - window_left and chunked_attention_size C > 0 keeping
/// j >= floor(pos / C) * C), "padding" (every key; no window or chunk allowed).
/// out: given, or new of out_dtype (default query's) [tokens, H, Dv]; q/k/v fp16, bf16 or fp8
/// e4m3 (one dtype); out q's dtype, or fp16/bf16/e4m3 for fp8 inputs (e4m3: saturating at
/// +-448). pos_encoding_mode "alibi" (any case) adds FMHAv2's ALiBi slope_h * (j - pos) after the
/// soft cap. save_softmax_stats returns (out, stats) with stats [tokens, H, 2] fp32 = (max_j s_j,
/// sum_j exp(s_j - max)). Not supported (kUnsupported): skip_softmax_threshold_scale_factor > 0
/// (a tile-dependent approximation), statistics with fp8 inputs, sinks or ALiBi, ALiBi with
/// sinks. workspace_buffer is never written.
AttentionOutput trtllm_fmha_v2_prefill(
    const FmhaV2Qkv& qkv, std::string_view input_layout, const Tensor& workspace_buffer,
    const Tensor& seq_lens, int64_t max_q_len, int64_t max_kv_len, double bmm1_scale,
    double bmm2_scale, int64_t batch_size, const Tensor& cum_seq_lens_q,
    const Tensor& cum_seq_lens_kv, std::optional<Tensor> block_tables = std::nullopt,
    std::optional<Tensor> out = std::nullopt, std::optional<DType> out_dtype = std::nullopt,
    std::optional<Tensor> sinks = std::nullopt,
    std::optional<std::string> pos_encoding_mode = std::nullopt,
    std::optional<double> logits_soft_cap_scale = std::nullopt,
    std::string_view mask_mode = "causal", int64_t window_left = -1,
    int64_t chunked_attention_size = 0, bool save_softmax_stats = false,
    double skip_softmax_threshold_scale_factor = 0.0);

}  // namespace flashinfer
