// Input / output lists that several trace templates share (often across templates*.cpp files):
// each is written once here. Every call returns fresh values, so a template may still adjust one.
#pragma once

#include "trace/template_builders.h"

namespace flashinfer::trace::detail {

// Dense attention: q [qo_len, num_qo_heads, head_dim] against contiguous k, v [kv_len,
// num_kv_heads, head_dim] (single_prefill, the block-sparse wrappers' run()).
std::vector<Io> dense_qkv_inputs();
Io dense_output();  // [qo_len, num_qo_heads, head_dim] in q's dtype

// The TRT-LLM paged schema (trtllm_batch_decode / context, xqa_batch_decode): query [num_tokens,
// num_heads, head_dim], kv_cache [num_pages, kv_cache_dim, num_kv_heads, page_size, head_dim].
inline const std::vector<std::string> kPagedTok = {"num_tokens", "num_heads", "head_dim"};
std::vector<Axis> trtllm_paged_axes(int64_t num_tokens_init, int64_t num_pages_init,
                                    std::string max_pages_desc);
Io trtllm_kv_cache();
// Rectangular [batch_size, max_pages_per_seq] page table of distinct pages, named `key`.
Io paged_block_tables(const std::string& key);

// FMHA v2 prefill's scalars after query, key, value, out: num_heads, head_dim, seq_len (their
// axes' values), scale_softmax and the optional scale_bmm1 (default 1/sqrt(head_dim)).
std::vector<Io> fmha_v2_scalars();
// FMHA v2 prefill on kBshd tensors (fmha_v2_prefill_deepseek, fmha_v2_prefill_sm120): query, key,
// value, the in-place out (described by `out_desc`), fmha_v2_scalars(), then the optional
// scale_bmm2 last.
inline const std::vector<std::string> kBshd = {"batch_size", "seq_len", "num_heads", "head_dim"};
std::vector<Io> fmha_v2_bshd_inputs(std::string out_desc);

// Paged KV append's int32 index inputs (append_paged_kv_cache, the NVFP4 appends), marked with
// .dt or .synth as the template's file has it. The rows' placement: batch_indices [nnz_kv] (row %
// batch_size) and positions [nnz_kv] (row // batch_size), so each request gets consecutive rows.
enum class Int32As { kDtype, kSynth };
std::vector<Io> append_row_slots(Int32As mark);
// The page table: kv_indices [num_kv_indices] (every page), kv_indptr [batch_size_plus_1]
// (num_pages // batch_size pages a request), kv_last_page_len [batch_size] (full pages).
std::vector<Io> append_page_table(Int32As mark);

// RoPE with a cos/sin cache [max_seq_len, rotary_dim] (cos in the first half, theta 1e4), the
// positions (`key`) arange(nnz) % max_seq_len.
Io rope_cos_sin_cache();
Io rope_positions(const std::string& key);
// rope_quantize_fp8's q_rope, k_rope, q_nope, k_nope (num_k_heads K heads; the nope parts
// optional, made in q_rope's dtype) and its trailing scalars is_neox, quant_scale_q / _kv.
std::vector<Io> rope_fp8_parts();
std::vector<Io> rope_fp8_scalars(const std::string& neox_init);
// The quantized output of one such part: "<key>_out", its shape, fp8 e4m3.
Io rope_fp8_out(const Io& part);
// A rope + FP8 quantize op's lists from its parts: the parts, cos_sin_cache, pos_ids and the
// scalars; the parts' quantized outputs.
std::vector<Io> rope_fp8_inputs(std::vector<Io> parts, const std::string& neox_init);
std::vector<Io> rope_fp8_outputs(const std::vector<Io>& parts);

}  // namespace flashinfer::trace::detail
