// flashinfer.prefill.trtllm_ragged_attention_deepseek: ragged (packed, no page table) prefill
// attention for DeepSeek-style heads (qk head dim 192, vo head dim 128; also 128/128/128 and
// 256/256/256, as upstream asserts), used by vLLM and SGLang for MLA prefill and the chunked
// prefix-cache passes.
#pragma once

#include <optional>
#include <string_view>

#include "flashinfer/ops/attention.h"
#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// query [Nq, Hq, Dqk], key [Nk, Hkv, Dqk], value [Nk, Hkv, Dvo] (Hq a multiple of Hkv; the
/// feature axis contiguous). query and key fp16, bf16 or fp8 e4m3 (one dtype); value the same or
/// fp8 e4m3. Request b owns query rows [cum_seq_lens_q[b], cum_seq_lens_q[b + 1]) and key/value
/// rows [cum_seq_lens_kv[b], cum_seq_lens_kv[b + 1]) (int32 [batch_size + 1]); seq_lens int32
/// [batch_size] is its KV length and must agree with cum_seq_lens_kv; every query length <=
/// max_q_len and every KV length <= max_kv_len. Query i of a request of qo_len queries sits at
/// position kv_len - qo_len + i; is_causal keeps keys j <= that position, window_left >= 0 keeps
/// keys j >= position - window_left.
///   s = bmm1_scale * q . k  (bmm1_scale fuses q/k dequant scales and 1/sqrt(Dqk));
///   out = bmm2_scale * softmax(s) v;  lse = log2(sum exp(s)) (base 2, fp32 [Nq, Hq]).
/// out [Nq, Hq, Dvo]: query's dtype, bf16 for fp8 queries; a given out must be fp16 or bf16.
/// Returns out, or (out, lse) with return_lse (a given lse is written either way). A row that
/// sees no key gives 0 and -inf. o_sf_scale only scales nvfp4 outputs upstream (never produced
/// here): accepted and unused; workspace_buffer, enable_pdl (a scheduling hint), q_seq_lens_cpu
/// and kv_seq_lens_cpu (host copies of the lengths; checked against them when given) change no
/// value. Not supported (kUnsupported when set): attention_sinks,
/// skip_softmax_threshold_scale_factor, SageAttention scale factors, use_fp16_softmax=True,
/// uses_spcompress=True. skip_all_rows_active_check (upstream 0.7.4; its default True skips
/// upstream's scan for rows with queries and no keys, whose result is then undefined there)
/// changes nothing: such rows give 0 and -inf here either way, upstream's result with False.
AttentionOutput trtllm_ragged_attention_deepseek(
    const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& workspace_buffer,
    const Tensor& seq_lens, int64_t max_q_len, int64_t max_kv_len,
    ScalarOrTensor<double> bmm1_scale, ScalarOrTensor<double> bmm2_scale, double o_sf_scale,
    int64_t batch_size, int64_t window_left, const Tensor& cum_seq_lens_q,
    const Tensor& cum_seq_lens_kv, std::optional<bool> enable_pdl, bool is_causal, bool return_lse,
    std::optional<Tensor> attention_sinks = std::nullopt,
    std::optional<double> skip_softmax_threshold_scale_factor = std::nullopt,
    std::optional<Tensor> out = std::nullopt, std::optional<Tensor> lse = std::nullopt,
    Value sage_attn_sfs = Value::tuple({Value(), Value(), Value(), Value()}),
    Value num_elts_per_sage_attn_blk = Value::tuple({Value(0), Value(0), Value(0), Value(0)}),
    std::string_view backend = "trtllm-gen", std::optional<Tensor> q_seq_lens_cpu = std::nullopt,
    std::optional<Tensor> kv_seq_lens_cpu = std::nullopt,
    std::optional<bool> use_fp16_softmax = std::nullopt,
    std::optional<bool> uses_spcompress = std::nullopt, bool skip_all_rows_active_check = true);

}  // namespace flashinfer
