// Private: NVFP4 (kv_cache_sf) paged KV caches in the attention run path. The packed cache is
// dequantized on the host (exactly: e2m1 * e4m3 is representable in fp32) into fp32 pages and the
// shared kernel runs on them, so the math is the CPU reference's with fp32 accumulation.
#pragma once

#include <cstdint>
#include <optional>

#include "api/attention_common.h"

namespace flashinfer::api {

/// The fp32 value of element `d` of one token's NVFP4 row: the packed e2m1 code (low nibble first)
/// times its 16-element block's e4m3 scale. The global scale is not applied here: upstream folds
/// it into k_scale / v_scale (wrappers), bmm1_scale / bmm2_scale (trtllm) or kv_scale (xqa).
float nvfp4_element(const uint8_t* packed, int64_t packed_stride, const uint8_t* block_scales,
                    int64_t scale_stride, int64_t d);

/// Where the e4m3 scale of block `j` of token `t` (of a page) lives in the scale tensor's logical
/// [page_size, head_dim / 16] tile of one head: K scales are linear (t, j); V scales use TRT-LLM's
/// 4-token interleave, flat (t / 4) * 4 * S + 4 * j + t % 4 over the tile (S = head_dim / 16).
std::pair<int64_t, int64_t> nvfp4_v_scale_index(int64_t t, int64_t j, int64_t sf_cols);

/// run_planned for a plan whose kv_data_type is torch.uint8 (or a call with kv_cache_sf). Paged:
/// k/v are the packed [pages, page_size, Hkv, D / 2] views, o.kv_cache_sf the [pages, page_size,
/// Hkv, D / 16] scales laid out like the cache (s.hnd); V's interleaved unless s.nvfp4_v_linear
/// (then page_size % 4 is not required). Ragged / single (!s.paged): k/v the packed [tokens, Hkv,
/// D / 2] views, o.kv_cache_sf (k_sf, v_sf) or one tensor split on dim 1, laid out like k/v, both
/// linear. CPU only (kUnsupported naming kv_cache_sf on CUDA). Errors name kv_cache_sf, k_arg /
/// v_arg.
AttentionOutput run_planned_nvfp4(const detail::WrapperState& s, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionRunOptions& o, const char* op,
                                  const char* k_arg, const char* v_arg);

}  // namespace flashinfer::api
