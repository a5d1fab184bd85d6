#include "api/attention_nvfp4.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "api/checks.h"
#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"

namespace flashinfer::api {

float nvfp4_element(const uint8_t* packed, int64_t packed_stride, const uint8_t* block_scales,
                    int64_t scale_stride, int64_t d) {
  const uint8_t byte = packed[(d / 2) * packed_stride];
  const float e = e2m1_bits_to_float(d % 2 == 0 ? e2m1x2_low(byte) : e2m1x2_high(byte));
  return e * e4m3fn_bits_to_float(block_scales[(d / 16) * scale_stride]);
}

std::pair<int64_t, int64_t> nvfp4_v_scale_index(int64_t t, int64_t j, int64_t sf_cols) {
  const int64_t flat = (t / 4) * 4 * sf_cols + 4 * j + t % 4;
  return {flat / sf_cols, flat % sf_cols};
}

namespace {

// Checks one packed cache view [pages, page_size, Hkv, D / 2] and its scales [.., D / 16].
void check_nvfp4_view(const detail::WrapperState& s, const Tensor& t, const Tensor& sf, int64_t dim,
                      const char* op, const char* arg) {
  FLASHINFER_CHECK(t.device() == s.device, op, arg, "is on ", t.device().str(),
                   " but the wrapper runs on ", s.device.str());
  FLASHINFER_CHECK(t.dtype() == DType::kUInt8, op, arg, "dtype ", dtype_torch_name(t.dtype()),
                   " is not an NVFP4 cache (torch.uint8, two e2m1 codes per byte)");
  FLASHINFER_CHECK(t.dim() == 4, op, arg, "expected a paged cache");
  FLASHINFER_CHECK(t.size(2) == s.num_kv_heads && t.size(3) * 2 == dim, op, arg, "has ", t.size(2),
                   " heads of ", t.size(3), " packed bytes, plan() said ", s.num_kv_heads,
                   " heads of dim ", dim, " (", dim / 2, " bytes)");
  FLASHINFER_CHECK(t.size(1) == s.page_size, op, arg, "page size ", t.size(1),
                   " does not match plan's page_size ", s.page_size);
  FLASHINFER_CHECK(s.max_page_id < t.size(0), op, arg, "the page table refers to page ",
                   s.max_page_id, " but the cache has ", t.size(0), " pages");
  FLASHINFER_CHECK(sf.dtype() == DType::kFloat8E4M3FN || sf.dtype() == DType::kUInt8, op,
                   "kv_cache_sf", "dtype ", dtype_torch_name(sf.dtype()),
                   " is not an e4m3 block-scale tensor (torch.float8_e4m3fn or torch.uint8)");
  FLASHINFER_CHECK(sf.device() == s.device, op, "kv_cache_sf", "is on ", sf.device().str(),
                   " but the wrapper runs on ", s.device.str());
  FLASHINFER_CHECK(sf.size(0) == t.size(0) && sf.size(1) == t.size(1) && sf.size(2) == t.size(2) &&
                       sf.size(3) * 16 == dim,
                   op, "kv_cache_sf", "scales ", shape_to_string(sf.shape()),
                   " (as [pages, page_size, heads, head_dim / 16]) do not match the cache's ",
                   shape_to_string(t.shape()), " (head_dim ", dim, ")");
}

// Dequantizes the `used` pages of one cache into fp32 [used, page_size, Hkv, dim].
Tensor dequantize_pages(const Tensor& t, const Tensor& sf, const std::vector<int32_t>& used,
                        int64_t dim, bool v_interleaved) {
  const int64_t ps = t.size(1), heads = t.size(2), sf_cols = dim / 16;
  Tensor out = Tensor::empty(
      {std::max<int64_t>(static_cast<int64_t>(used.size()), 1), ps, heads, dim}, DType::kFloat32);
  auto* y = out.data<float>();
  const auto* base = static_cast<const uint8_t*>(t.data_ptr());
  const auto* sbase = static_cast<const uint8_t*>(sf.data_ptr());
  for (std::size_t i = 0; i < used.size(); ++i) {
    const int64_t p = used[i];
    for (int64_t tok = 0; tok < ps; ++tok) {
      for (int64_t h = 0; h < heads; ++h) {
        const uint8_t* row = base + p * t.stride(0) + tok * t.stride(1) + h * t.stride(2);
        float* dst = y + ((static_cast<int64_t>(i) * ps + tok) * heads + h) * dim;
        for (int64_t d = 0; d < dim; ++d) {
          int64_t st = tok, sc = d / 16;
          if (v_interleaved) std::tie(st, sc) = nvfp4_v_scale_index(tok, d / 16, sf_cols);
          const uint8_t* scale =
              sbase + p * sf.stride(0) + st * sf.stride(1) + h * sf.stride(2) + sc * sf.stride(3);
          // `scale` already points at element d's block scale (stride 0 reads it for any d).
          dst[d] = nvfp4_element(row, t.stride(3), scale, 0, d);
        }
      }
    }
  }
  return out;
}

}  // namespace

AttentionOutput run_planned_nvfp4(const detail::WrapperState& s, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionRunOptions& o, const char* op,
                                  const char* k_arg, const char* v_arg) {
  FLASHINFER_CHECK(s.kv_dtype == DType::kUInt8, op, "kv_cache_sf", "is given but the KV dtype is ",
                   dtype_torch_name(s.kv_dtype),
                   "; an NVFP4 cache is torch.uint8 (plan's kv_data_type=torch.uint8)");
  FLASHINFER_CHECK(o.kv_cache_sf.has_value(), op, "kv_cache_sf",
                   "must be provided for an NVFP4 KV cache (the KV dtype is torch.uint8)");
  FLASHINFER_CHECK_CODE(s.paged, ErrorCode::kUnsupported, op, "kv_cache_sf",
                        "NVFP4 is supported for paged caches only, not ragged K/V");
  FLASHINFER_CHECK_CODE(s.device.is_cpu(), ErrorCode::kUnsupported, op, "kv_cache_sf",
                        "NVFP4 KV caches run on the CPU reference only (no CUDA kernel reads them "
                        "here); pass CPU tensors");
  auto [ks, vs] = paged_cache_views(*o.kv_cache_sf, s.hnd, op, "kv_cache_sf");
  check_defined(k, op, k_arg);
  check_defined(v, op, v_arg);
  check_nvfp4_view(s, k, ks, s.head_dim_qk, op, k_arg);
  check_nvfp4_view(s, v, vs, s.head_dim_vo, op, v_arg);
  FLASHINFER_CHECK(s.nvfp4_v_linear || s.page_size % 4 == 0, op, "kv_cache_sf",
                   "V scales are 4-token interleaved within a page: page_size must be a multiple "
                   "of 4, got ",
                   s.page_size);

  // Only the pages the table names are dequantized; the table is renumbered onto them.
  detail::WrapperState t = s;
  std::vector<int32_t> slot(static_cast<std::size_t>(s.max_page_id + 1), -1), used;
  for (int32_t& page : t.kv_indices) {
    int32_t& m = slot[static_cast<std::size_t>(page)];
    if (m < 0) {
      m = static_cast<int32_t>(used.size());
      used.push_back(page);
    }
    page = m;
  }
  t.max_page_id = static_cast<int64_t>(used.size()) - 1;
  t.kv_dtype = DType::kFloat32;
  t.sink_variant = false;  // run_planned applied the variant's arguments to `o` already
  const Tensor kf = dequantize_pages(k, ks, used, s.head_dim_qk, /*v_interleaved=*/false);
  const Tensor vf = dequantize_pages(v, vs, used, s.head_dim_vo, !s.nvfp4_v_linear);
  AttentionRunOptions o2 = o;
  o2.kv_cache_sf.reset();
  return run_planned(t, q, kf, vf, o2, op, k_arg, v_arg);
}

}  // namespace flashinfer::api
