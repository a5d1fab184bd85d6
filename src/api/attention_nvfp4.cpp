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

// Ragged / single K and V (upstream's fa2 NVFP4 path): kv_cache_sf a (k_sf, v_sf) pair or one
// tensor split on dim 1 (upstream's unbind(dim=1)); each [tokens, Hkv, D / 16] (NHD) or [Hkv,
// tokens, D / 16] (HND), returned as [tokens, Hkv, D / 16] views like the ragged k / v.
std::pair<Tensor, Tensor> ragged_scale_views(const PagedKVCache& sf, bool hnd, const char* op) {
  Tensor ks, vs;
  if (sf.is_pair()) {
    ks = sf.first();
    vs = sf.second();
    check_defined(ks, op, "kv_cache_sf");
    check_defined(vs, op, "kv_cache_sf");
    FLASHINFER_CHECK(ks.dim() == 3 && vs.dim() == 3, op, "kv_cache_sf",
                     "(k_scales, v_scales) must be 3-D like k and v, got ",
                     shape_to_string(ks.shape()), " and ", shape_to_string(vs.shape()));
  } else {
    const Tensor& t = sf.first();
    check_defined(t, op, "kv_cache_sf");
    FLASHINFER_CHECK(t.dim() == 4 && t.size(1) == 2, op, "kv_cache_sf",
                     "expected a (k_scales, v_scales) pair or one 4-D tensor with K and V on dim "
                     "1, got shape ",
                     shape_to_string(t.shape()));
    ks = t.select(1, 0);
    vs = t.select(1, 1);
  }
  if (hnd) return {ks.transpose(0, 1), vs.transpose(0, 1)};
  return {ks, vs};
}

// Checks one packed ragged K or V [tokens, Hkv, D / 2] (token-major view) and its linear scales.
void check_nvfp4_rows(const detail::WrapperState& s, const Tensor& t, const Tensor& sf, int64_t dim,
                      const char* op, const char* arg) {
  FLASHINFER_CHECK(t.device() == s.device, op, arg, "is on ", t.device().str(),
                   " but the call runs on ", s.device.str());
  FLASHINFER_CHECK(t.dtype() == DType::kUInt8, op, arg, "dtype ", dtype_torch_name(t.dtype()),
                   " is not NVFP4 (torch.uint8, two e2m1 codes per byte)");
  FLASHINFER_CHECK(t.dim() == 3, op, arg, "expected [tokens, heads, head_dim / 2]");
  FLASHINFER_CHECK(t.size(1) == s.num_kv_heads && t.size(2) * 2 == dim, op, arg, "has ", t.size(1),
                   " heads of ", t.size(2), " packed bytes, expected ", s.num_kv_heads,
                   " heads of dim ", dim, " (", dim / 2, " bytes)");
  FLASHINFER_CHECK(t.size(0) >= s.total_kv, op, arg, "has ", t.size(0),
                   " rows but kv_indptr ends at ", s.total_kv);
  FLASHINFER_CHECK(t.stride(2) == 1, op, arg, "the head_dim axis must be contiguous");
  FLASHINFER_CHECK(sf.dtype() == DType::kFloat8E4M3FN || sf.dtype() == DType::kUInt8, op,
                   "kv_cache_sf", "dtype ", dtype_torch_name(sf.dtype()),
                   " is not an e4m3 block-scale tensor (torch.float8_e4m3fn or torch.uint8)");
  FLASHINFER_CHECK(sf.device() == s.device, op, "kv_cache_sf", "is on ", sf.device().str(),
                   " but the call runs on ", s.device.str());
  FLASHINFER_CHECK(sf.size(0) == t.size(0) && sf.size(1) == t.size(1) && sf.size(2) * 16 == dim, op,
                   "kv_cache_sf", "scales ", shape_to_string(sf.shape()),
                   " (as [tokens, heads, head_dim / 16]) do not match ", arg, "'s ",
                   shape_to_string(t.shape()), " (head_dim ", dim, ")");
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
  FLASHINFER_CHECK_CODE(s.device.is_cpu(), ErrorCode::kUnsupported, op, "kv_cache_sf",
                        "NVFP4 KV caches run on the CPU reference only (no CUDA kernel reads them "
                        "here); pass CPU tensors");
  check_defined(k, op, k_arg);
  check_defined(v, op, v_arg);
  AttentionRunOptions o2 = o;
  o2.kv_cache_sf.reset();
  if (!s.paged) {
    // Ragged / single K, V: both scale tensors linear (upstream's fa2 kernel). The rows are one
    // "page" of total_kv tokens to the shared dequantizer.
    auto [ks, vs] = ragged_scale_views(*o.kv_cache_sf, s.hnd, op);
    check_nvfp4_rows(s, k, ks, s.head_dim_qk, op, k_arg);
    check_nvfp4_rows(s, v, vs, s.head_dim_vo, op, v_arg);
    detail::WrapperState t = s;
    t.kv_dtype = DType::kFloat32;
    t.sink_variant = false;  // run_planned applied the variant's arguments to `o` already
    auto rows = [&](const Tensor& x, const Tensor& sf, int64_t dim) {
      const Tensor page = dequantize_pages(x.slice(0, 0, s.total_kv).unsqueeze(0),
                                           sf.slice(0, 0, s.total_kv).unsqueeze(0), {0}, dim,
                                           /*v_interleaved=*/false);
      return page.select(0, 0);
    };
    return run_planned(t, q, rows(k, ks, s.head_dim_qk), rows(v, vs, s.head_dim_vo), o2, op, k_arg,
                       v_arg);
  }
  auto [ks, vs] = paged_cache_views(*o.kv_cache_sf, s.hnd, op, "kv_cache_sf");
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
  return run_planned(t, q, kf, vf, o2, op, k_arg, v_arg);
}

}  // namespace flashinfer::api
