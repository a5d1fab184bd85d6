// flashinfer.xqa: the XQA decode kernels' low-level entry points, xqa and xqa_mla. Same math as
// xqa_batch_decode_with_kv_cache / xqa_batch_decode_with_kv_cache_mla, which upstream implements
// on top of these two (the scale mapping below is the inverse of theirs).
#pragma once

#include <optional>
#include <string_view>

#include "flashinfer/ops/attention.h"
#include "flashinfer/ops/sampling.h"  // ScalarOrTensor
#include "flashinfer/tensor.h"

namespace flashinfer {

/// q [batch, 1, Hq, D] (beam width 1; fp16 or bf16), k_cache / v_cache [pages, page_size, Hkv, D]
/// (NHD; HND [pages, Hkv, page_size, D]) of q's dtype or fp8 e4m3, page_table [batch, pages per
/// sequence] int32, seq_lens [batch, 1] int32, output like q (written). Request b's token t lives
/// in page page_table[b][t / page_size].
///   s_t = q_scale * kv_scale / sqrt(D) * q . k_t  (xqa dequantizes K by kv_scale);
///   output = kv_scale * sum_t softmax(s)_t v_t, with exp(sinks[g, i]) (sinks [Hkv, Hq / Hkv]
///   fp32, head g * Hq / Hkv + i) added to each head's denominator;
/// sliding_win_size > 0 keeps the last sliding_win_size tokens. rcp_out_scale only scales fp8
/// outputs (CPU: fp8(output * rcp_out_scale), saturating); no effect on 16-bit outputs.
/// k_sf_cache / v_sf_cache: linear e4m3 block scales of uint8 NVFP4 caches (CPU).
/// workspace_buffer / semaphores are checked, never written. Speculative decoding (CPU only):
/// q_seq_len > 1 with q [batch, 1, q_seq_len, Hq, D] (or, with q_cu_seq_lens [batch + 1], packed
/// rows ending in [Hq, D]) and the required bit-packed mask (int16 bits of upstream's uint16, or
/// int32 words), ceil(q_seq_len / 32) * 2 words per query row: request b's query t sees its
/// context and draft token i when bit i of row cu[b] + t is set. Not supported (kUnsupported):
/// a sliding window with speculative decoding.
void xqa(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& page_table,
         const Tensor& seq_lens, const Tensor& output, const Tensor& workspace_buffer,
         const Tensor& semaphores, int64_t num_kv_heads, int64_t page_size,
         std::optional<Tensor> sinks = std::nullopt, ScalarOrTensor<double> q_scale = 1.0,
         ScalarOrTensor<double> kv_scale = 1.0, int64_t sliding_win_size = 0,
         std::string_view kv_layout = "NHD", std::optional<int64_t> sm_count = std::nullopt,
         std::optional<bool> enable_pdl = std::nullopt, double rcp_out_scale = 1.0,
         int64_t q_seq_len = 1, std::optional<Tensor> mask = std::nullopt,
         std::optional<Tensor> q_cu_seq_lens = std::nullopt,
         std::optional<Tensor> k_sf_cache = std::nullopt,
         std::optional<Tensor> v_sf_cache = std::nullopt);

/// DeepSeek MLA through XQA: q [batch, 1, H, kv_lora_rank + rope] (upstream: fp8 e4m3, H 128),
/// k_cache = v_cache [pages, page_size, 1, kv_lora_rank + rope] (the latent cache, one head; the
/// same tensor twice, as upstream's xqa_batch_decode_with_kv_cache_mla passes it), output
/// [batch, 1, H, kv_lora_rank] (written; kv_lora_rank is read from it). As upstream's MLA wrapper
/// calls it (q_scale = bmm1_scale, kv_scale = bmm2_scale):
///   s_t = q_scale * q . kv_t;  output = kv_scale * sum_t softmax(s)_t kv_t[:kv_lora_rank].
void xqa_mla(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
             const Tensor& page_table, const Tensor& seq_lens, const Tensor& output,
             const Tensor& workspace_buffer, const Tensor& semaphores, int64_t page_size,
             ScalarOrTensor<double> q_scale = 1.0, ScalarOrTensor<double> kv_scale = 1.0,
             std::optional<int64_t> sm_count = std::nullopt,
             std::optional<bool> enable_pdl = std::nullopt);

}  // namespace flashinfer
