// NVFP4 paged KV caches: whole-cache quantization (fp4_quantization), paged dequantization and
// the quantize-and-append ops (flashinfer.page): declarations, checks, dispatch. Each has a CPU
// reference and a CUDA kernel that writes the same bytes (kernels/nvfp4_rules.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "api/arg_traits.h"
#include "api/attention_common.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "api/nvfp4_4over6.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/ops/nvfp4.h"
#include "flashinfer/ops/quantization.h"
#include "kernels/cpu/nvfp4_cpu.h"

#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/nvfp4_cuda.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kNvfp4PagedFp4Module = "flashinfer.quantization.fp4_quantization";
constexpr const char* kPageModule = "flashinfer.page";

using api::KernelEntry;
using api::LaunchContext;

constexpr KernelEntry<kernels::Nvfp4PagedAppendParams> kNvfp4PagedAppendKernels[] = {
    {DeviceType::kCPU, "CPU reference", nullptr,
     [](const kernels::Nvfp4PagedAppendParams& p, const LaunchContext&) {
       kernels::cpu::nvfp4_paged_append(p);
     }},
#if FLASHINFER_WITH_CUDA
    // The index arrays and tensor scales are read on the device (kernels/nvfp4_params.h).
    {DeviceType::kCUDA,
     "CUDA kernel: one thread per (token, head, K/V, block of 16), index arrays read on the device "
     "(tokens whose target is outside the cache are not written)",
     nullptr,
     [](const kernels::Nvfp4PagedAppendParams& p, const LaunchContext& c) {
       kernels::cuda::nvfp4_paged_append(p, c.stream, c.enable_pdl);
     }},
#endif
};
constexpr KernelEntry<kernels::Nvfp4PagedDequantParams> kPagedDequantKernels[] = {
    {DeviceType::kCPU, "CPU reference", nullptr,
     [](const kernels::Nvfp4PagedDequantParams& p, const LaunchContext&) {
       kernels::cpu::nvfp4_paged_dequantize(p);
     }},
#if FLASHINFER_WITH_CUDA
    // block_table and seq_lens stay host arrays (checked there); the launcher copies them.
    {DeviceType::kCUDA, "CUDA kernel: one thread per output element", nullptr,
     [](const kernels::Nvfp4PagedDequantParams& p, const LaunchContext& c) {
       kernels::cuda::nvfp4_paged_dequantize(p, c.stream);
     }},
#endif
};
constexpr KernelEntry<kernels::Nvfp4PagedQuantParams> kPagedQuantKernels[] = {
    {DeviceType::kCPU, "CPU reference", nullptr,
     [](const kernels::Nvfp4PagedQuantParams& p, const LaunchContext&) {
       kernels::cpu::nvfp4_paged_quantize(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one thread per block of 16 (128-bit loads)", nullptr,
     [](const kernels::Nvfp4PagedQuantParams& p, const LaunchContext& c) {
       kernels::cuda::nvfp4_paged_quantize(p, c.stream);
     }},
#endif
};
// The automatic global scale's max |x| (the result is read on the host).
constexpr KernelEntry<kernels::AbsMaxParams> kAbsMaxKernels[] = {
    {DeviceType::kCPU, "CPU reference", nullptr,
     [](const kernels::AbsMaxParams& p, const LaunchContext&) { kernels::cpu::abs_max(p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: grid-stride max, one atomic per block", nullptr,
     [](const kernels::AbsMaxParams& p, const LaunchContext& c) {
       kernels::cuda::abs_max(p, c.stream);
     }},
#endif
};

// An int32/int64 index tensor as host int64 values.
std::vector<int64_t> host_indices(const Tensor& t, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  api::check_dtype_in(t, {DType::kInt32, DType::kInt64}, op, arg);
  const Tensor c = t.to(Device::cpu()).to(DType::kInt64).contiguous();
  return std::vector<int64_t>(c.data<int64_t>(), c.data<int64_t>() + c.numel());
}

// A global decode scale: a positive finite number or a one-element fp32 tensor holding one.
float decode_scale(const ScalarOrTensor<double>& s, const char* op, const char* arg) {
  double v = s.scalar();
  if (s.is_tensor()) {
    const Tensor& t = s.tensor();
    FLASHINFER_CHECK(t.numel() == 1, op, arg, "must have exactly one element, got ", t.numel());
    api::check_dtype_in(t, {DType::kFloat32}, op, arg);
    v = t.to(Device::cpu()).item();
  }
  FLASHINFER_CHECK(std::isfinite(v) && v > 0.0, op, arg,
                   "must be a positive finite global decode scale, got ", v);
  return static_cast<float>(v);
}

// K/V views [pages, page_size, H, D'] of a packed cache or its scale cache (any last stride).
// `page_size_one_forms`: also upstream's _unpack_paged_kv_cache forms of page size 1 without the
// page axis (a 3-D pair, a 4-D [tokens, 2, ...] tensor), as api::paged_cache_views takes them.
std::pair<Tensor, Tensor> cache_views(const PagedKVCache& c, bool hnd, const char* op,
                                      const char* arg, bool page_size_one_forms = false) {
  auto [k, v] = api::split_paged_cache(c, hnd, op, arg, page_size_one_forms);
  FLASHINFER_CHECK(k.device() == v.device(), op, arg, "k and v are on different devices");
  if (hnd) {
    k = k.permute({0, 2, 1, 3});
    v = v.permute({0, 2, 1, 3});
  }
  return {k, v};
}

// The packed caches (uint8) and scale caches (e4m3) of the append ops, checked against
// [*, H, head_dim] rows.
struct AppendCaches {
  Tensor k, v, ks, vs;
};
AppendCaches append_caches(const PagedKVCache& cache, const PagedKVCache& sf,
                           const Tensor& append_key, const Tensor& append_value, bool hnd,
                           const char* op) {
  AppendCaches c;
  std::tie(c.k, c.v) = api::paged_cache_views(cache, hnd, op, "paged_kv_cache");
  std::tie(c.ks, c.vs) = cache_views(sf, hnd, op, "kv_cache_sf", /*page_size_one_forms=*/true);
  for (const auto& [t, arg] :
       {std::pair{&append_key, "append_key"}, std::pair{&append_value, "append_value"}}) {
    api::check_defined(*t, op, arg);
    api::check_dim(*t, {3}, op, arg);
    api::check_dtype_in(*t, {DType::kFloat16, DType::kBFloat16}, op, arg);
    FLASHINFER_CHECK(t->stride(2) == 1, op, arg, "the head_dim axis must be contiguous");
    api::check_same_device(*t, c.k, op, arg, "paged_kv_cache");
  }
  api::check_same_dtype(append_value, append_key, op, "append_value", "append_key");
  const int64_t h = append_key.size(1), d = append_key.size(2);
  FLASHINFER_CHECK(d % 16 == 0, op, "append_key", "head_dim ", d, " must be a multiple of 16");
  FLASHINFER_CHECK(append_value.size(1) == h && append_value.size(2) == d, op, "append_value",
                   "shape ", shape_to_string(append_value.shape()), " does not match append_key's ",
                   shape_to_string(append_key.shape()));
  for (const auto& [t, arg] :
       {std::pair{&c.k, "paged_kv_cache"}, std::pair{&c.v, "paged_kv_cache"}}) {
    FLASHINFER_CHECK(t->dtype() == DType::kUInt8, op, arg,
                     "NVFP4 paged K/V cache tensors must have dtype torch.uint8");
    FLASHINFER_CHECK(t->size(2) == h && t->size(3) == d / 2, op, arg, "holds [", t->size(2), ", ",
                     t->size(3), "] per token, expected [", h, ", ", d / 2, "]");
  }
  for (const Tensor* t : {&c.ks, &c.vs}) {
    FLASHINFER_CHECK(t->dtype() == DType::kFloat8E4M3FN, op, "kv_cache_sf",
                     "NVFP4 scale cache tensors must have dtype torch.float8_e4m3fn");
    FLASHINFER_CHECK(t->size(0) == c.k.size(0) && t->size(1) == c.k.size(1) && t->size(2) == h &&
                         t->size(3) == d / 16,
                     op, "kv_cache_sf", "shape ", shape_to_string(t->shape()),
                     " does not match the packed cache (last dimension head_dim / 16 = ", d / 16,
                     ")");
    api::check_same_device(*t, c.k, op, "kv_cache_sf", "paged_kv_cache");
  }
  return c;
}

// Sets a global decode scale of the append: a number, a one-element fp32 host tensor (read
// here) or a one-element fp32 tensor on the cache's device, which the kernel reads (no copy to
// the host; the kernel writes nothing for a value that is not positive and finite).
void append_scale(const ScalarOrTensor<double>& s, const Device& dev, float& value,
                  const float*& on_device, const char* op, const char* arg) {
  if (s.is_tensor() && !s.tensor().device().is_cpu()) {
    const Tensor& t = s.tensor();
    FLASHINFER_CHECK(t.numel() == 1, op, arg, "must have exactly one element, got ", t.numel());
    api::check_dtype_in(t, {DType::kFloat32}, op, arg);
    FLASHINFER_CHECK(t.device() == dev, op, arg, "is on ", t.device().str(),
                     " but the cache is on ", dev.str());
    on_device = t.data<const float>();
    return;
  }
  value = decode_scale(s, op, arg);
}

// Launches the append of key / value (rows [0, p.nnz)) with p's targets and scales set.
void run_append(kernels::Nvfp4PagedAppendParams p, const AppendCaches& c, const Tensor& key,
                const Tensor& value, const char* op) {
  p.key = key.data_ptr();
  p.value = value.data_ptr();
  p.dtype = key.dtype();
  p.heads = key.size(1);
  p.head_dim = key.size(2);
  p.k_stride_n = key.stride(0);
  p.k_stride_h = key.stride(1);
  p.v_stride_n = value.stride(0);
  p.v_stride_h = value.stride(1);
  p.k_cache = static_cast<uint8_t*>(c.k.data_ptr());
  p.v_cache = static_cast<uint8_t*>(c.v.data_ptr());
  p.k_sf = static_cast<uint8_t*>(c.ks.data_ptr());
  p.v_sf = static_cast<uint8_t*>(c.vs.data_ptr());
  for (int i = 0; i < 3; ++i) {
    p.kc_stride[i] = c.k.stride(i);
    p.vc_stride[i] = c.v.stride(i);
    p.ks_stride[i] = c.ks.stride(i);
    p.vs_stride[i] = c.vs.stride(i);
  }
  FLASHINFER_CHECK(c.ks.stride(3) == 1 && c.vs.stride(3) == 1, op, "kv_cache_sf",
                   "the scale axis must be contiguous");
  api::launch(kNvfp4PagedAppendKernels, p, c.k.device(), op, "paged_kv_cache");
}

}  // namespace

std::tuple<std::tuple<Tensor, Tensor>, std::tuple<Tensor, Tensor>, double, double>
nvfp4_quantize_paged_kv_cache(const Tensor& k_cache, const Tensor& v_cache,
                              std::string_view kv_layout, std::optional<Tensor> k_global_sf,
                              std::optional<Tensor> v_global_sf) {
  return call_op<&nvfp4_quantize_paged_kv_cache>(
      [&]() -> std::tuple<std::tuple<Tensor, Tensor>, std::tuple<Tensor, Tensor>, double, double> {
        const char* op = "nvfp4_quantize_paged_kv_cache";
        const bool hnd = api::parse_kv_layout(kv_layout, op, "kv_layout");
        for (const auto& [t, arg] :
             {std::pair{&k_cache, "k_cache"}, std::pair{&v_cache, "v_cache"}}) {
          api::check_defined(*t, op, arg);
          api::check_dim(*t, {4}, op, arg);
          api::check_dtype_in(*t, {DType::kFloat16, DType::kBFloat16}, op, arg);
          api::check_non_empty(*t, op, arg);
        }
        api::check_shape_eq(v_cache, k_cache.shape(), op, "v_cache");
        api::check_same_device(v_cache, k_cache, op, "v_cache", "k_cache");
        const int64_t pages = k_cache.size(0), heads = hnd ? k_cache.size(1) : k_cache.size(2);
        const int64_t page_size = hnd ? k_cache.size(2) : k_cache.size(1), d = k_cache.size(3);
        FLASHINFER_CHECK(d % 16 == 0, op, "k_cache", "head_dim ", d, " must be a multiple of 16");
        FLASHINFER_CHECK(page_size % 4 == 0 && d % 64 == 0, op, "k_cache",
                         "V-scale swizzling requires page_size % 4 == 0 and head_dim % 64 == 0, "
                         "got page_size=",
                         page_size, ", head_dim=", d);
        const Device dev = k_cache.device();
        auto describe = [](auto& p, const Tensor& cache) {
          p.input = cache.data_ptr();
          p.dtype = cache.dtype();
          for (int i = 0; i < 4; ++i) {
            p.shape[i] = cache.size(i);
            p.stride[i] = cache.stride(i);
          }
        };
        // Upstream: float32 tensor [448 / max(amax, 1e-12)], amax = cache.float().abs().amax().
        auto global_sf = [&](const std::optional<Tensor>& given, const Tensor& cache,
                             const char* arg, const char* cache_arg) -> float {
          if (given && given->defined()) {
            FLASHINFER_CHECK(given->numel() == 1, op, arg, "expected a one-element tensor, got ",
                             shape_to_string(given->shape()));
            api::check_dtype_in(*given, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op,
                                arg);
            return static_cast<float>(given->to(Device::cpu()).to(DType::kFloat32).item());
          }
          float amax = 0.0f;
          kernels::AbsMaxParams p;
          describe(p, cache);
          p.result = &amax;
          api::launch(kAbsMaxKernels, p, dev, op, cache_arg);
          return static_cast<float>(448.0 / std::max(static_cast<double>(amax), 1e-12));
        };
        const float kgs = global_sf(k_global_sf, k_cache, "k_global_sf", "k_cache");
        const float vgs = global_sf(v_global_sf, v_cache, "v_global_sf", "v_cache");
        const int64_t sd = d / 16;
        const Shape fp4_shape =
            hnd ? Shape{pages, heads, page_size, d / 2} : Shape{pages, page_size, heads, d / 2};
        // The scale bytes as float8_e4m3fn (upstream's .view(torch.float8_e4m3fn)).
        const Shape sf_shape =
            hnd ? Shape{pages, heads, page_size, sd} : Shape{pages, page_size, heads, sd};
        // K scales linear, V scales interleaved by groups of 4 tokens within each
        // [page_size, D/16] tile (kernels/nvfp4_rules.h).
        auto quantize = [&](const Tensor& cache, float gs, bool swizzle, const char* arg) {
          Tensor q = Tensor::empty(fp4_shape, DType::kUInt8, dev);
          Tensor sf = Tensor::empty(sf_shape, DType::kFloat8E4M3FN, dev);
          kernels::Nvfp4PagedQuantParams p;
          describe(p, cache);
          p.hnd = hnd;
          p.global_scale = gs;
          p.swizzle_sf = swizzle;
          p.out = q.data<uint8_t>();
          p.sf = static_cast<uint8_t*>(sf.data_ptr());
          api::launch(kPagedQuantKernels, p, dev, op, arg);
          return std::tuple{q, sf};
        };
        auto [kq, k_sf] = quantize(k_cache, kgs, false, "k_cache");
        auto [vq, v_sf] = quantize(v_cache, vgs, true, "v_cache");
        // 1 / global_sf as a float32 quotient (upstream: (1.0 / k_global_sf).item()).
        const double k_ret = static_cast<double>(1.0f / kgs);
        const double v_ret = static_cast<double>(1.0f / vgs);
        return {std::tuple{kq, vq}, std::tuple{k_sf, v_sf}, k_ret, v_ret};
      },
      k_cache, v_cache, kv_layout, k_global_sf, v_global_sf);
}

void nvfp4_kv_dequantize_paged(const PagedKVCache& paged_kv_cache, const PagedKVCache& kv_cache_sf,
                               const Tensor& block_tables, const Tensor& seq_lens,
                               ScalarOrTensor<double> k_scale, ScalarOrTensor<double> v_scale,
                               const Tensor& output_k, const Tensor& output_v,
                               std::string_view kv_layout) {
  call_op<&nvfp4_kv_dequantize_paged>(
      [&] {
        const char* op = "nvfp4_kv_dequantize_paged";
        const bool hnd = api::parse_kv_layout(kv_layout, op, "kv_layout");
        auto [k, v] = cache_views(paged_kv_cache, hnd, op, "paged_kv_cache");
        auto [ks, vs] = cache_views(kv_cache_sf, hnd, op, "kv_cache_sf");
        const float kscale = decode_scale(k_scale, op, "k_scale");
        const float vscale = decode_scale(v_scale, op, "v_scale");
        for (const auto& [t, arg] :
             {std::pair{&output_k, "output_k"}, std::pair{&output_v, "output_v"}}) {
          api::check_defined(*t, op, arg);
          api::check_dim(*t, {4}, op, arg);
          api::check_dtype_in(*t, {DType::kBFloat16, DType::kFloat16}, op, arg);
          api::check_same_device(*t, k, op, arg, "paged_kv_cache");
        }
        api::check_same_dtype(output_v, output_k, op, "output_v", "output_k");
        const int64_t batch = output_k.size(0), max_len = output_k.size(1),
                      heads = output_k.size(2);
        FLASHINFER_CHECK(
            output_v.size(0) == batch && output_v.size(1) == max_len && output_v.size(2) == heads,
            op, "output_v", "shape ", shape_to_string(output_v.shape()),
            " does not match output_k's ", shape_to_string(output_k.shape()));
        const Tensor* caches[2] = {&k, &v};
        const Tensor* scales[2] = {&ks, &vs};
        const Tensor* outs[2] = {&output_k, &output_v};
        for (int i = 0; i < 2; ++i) {
          const Tensor& c = *caches[i];
          const Tensor& s = *scales[i];
          const int64_t d = outs[i]->size(3);
          FLASHINFER_CHECK(c.dtype() == DType::kUInt8, op, "paged_kv_cache",
                           "must be torch.uint8 (packed e2m1)");
          FLASHINFER_CHECK(c.size(2) == heads && c.size(3) * 2 == d && d % 16 == 0, op,
                           "paged_kv_cache", "holds [", c.size(2), ", ", c.size(3),
                           "] per token; the output expects [", heads, ", ", d / 2, "]");
          api::check_dtype_in(s, {DType::kFloat8E4M3FN, DType::kUInt8}, op, "kv_cache_sf");
          FLASHINFER_CHECK(s.size(0) == c.size(0) && s.size(1) == c.size(1) && s.size(2) == heads &&
                               s.size(3) * 16 == d,
                           op, "kv_cache_sf", "shape ", shape_to_string(s.shape()),
                           " does not match the packed cache");
          api::check_same_device(s, c, op, "kv_cache_sf", "paged_kv_cache");
        }
        const int64_t pages = k.size(0), page_size = k.size(1);
        api::check_dim(block_tables, {2}, op, "block_tables");
        FLASHINFER_CHECK(block_tables.size(0) == batch, op, "block_tables", "has ",
                         block_tables.size(0), " rows, the output batch is ", batch);
        const int64_t cols = block_tables.size(1);
        const std::vector<int64_t> table = host_indices(block_tables, op, "block_tables");
        api::check_dtype_in(seq_lens, {DType::kInt32}, op, "seq_lens");
        const std::vector<int64_t> lens = host_indices(seq_lens, op, "seq_lens");
        FLASHINFER_CHECK(static_cast<int64_t>(lens.size()) == batch, op, "seq_lens", "has ",
                         lens.size(), " elements, the output batch is ", batch);
        if (batch == 0 || max_len == 0 || heads == 0) return;
        FLASHINFER_CHECK(cols * page_size >= max_len, op, "block_tables",
                         "block_tables column count insufficient: ", cols, " pages of ", page_size,
                         " tokens cannot cover max_seq_len ", max_len);
        for (int64_t b = 0; b < batch; ++b) {
          FLASHINFER_CHECK(lens[b] >= 0 && lens[b] <= max_len, op, "seq_lens", "element ", b, " (",
                           lens[b], ") is outside [0, max_seq_len=", max_len, "]");
          for (int64_t j = 0; j < (lens[b] + page_size - 1) / page_size; ++j) {
            const int64_t pg = table[b * cols + j];
            FLASHINFER_CHECK(pg >= 0 && pg < pages, op, "block_tables", "page ", pg, " (request ",
                             b, ", column ", j, ") is outside the cache's ", pages, " pages");
          }
        }
        kernels::Nvfp4PagedDequantParams p;
        for (int i = 0; i < 2; ++i) {
          p.cache[i] = static_cast<const uint8_t*>(caches[i]->data_ptr());
          p.sf[i] = static_cast<const uint8_t*>(scales[i]->data_ptr());
          for (int j = 0; j < 4; ++j) {
            p.cache_stride[i][j] = caches[i]->stride(j);
            p.sf_stride[i][j] = scales[i]->stride(j);
            p.out_stride[i][j] = outs[i]->stride(j);
          }
          p.head_dim[i] = outs[i]->size(3);
          p.out[i] = outs[i]->data_ptr();
        }
        p.scale[0] = kscale;
        p.scale[1] = vscale;
        p.out_dtype = output_k.dtype();
        p.batch = batch;
        p.heads = heads;
        p.page_size = page_size;
        p.table_cols = cols;
        p.block_table = table.data();
        p.seq_lens = lens.data();
        api::launch(kPagedDequantKernels, p, k.device(), op, "paged_kv_cache");
      },
      paged_kv_cache, kv_cache_sf, block_tables, seq_lens, k_scale, v_scale, output_k, output_v,
      kv_layout);
}

void nvfp4_quantize_append_paged_kv_cache(const Tensor& append_key, const Tensor& append_value,
                                          const Tensor& batch_indices, const Tensor& positions,
                                          const PagedKVCache& paged_kv_cache,
                                          const PagedKVCache& kv_cache_sf, const Tensor& kv_indices,
                                          const Tensor& kv_indptr, const Tensor& kv_last_page_len,
                                          double k_scale, double v_scale,
                                          std::string_view kv_layout) {
  call_op<&nvfp4_quantize_append_paged_kv_cache>(
      [&] {
        const char* op = "nvfp4_quantize_append_paged_kv_cache";
        const bool hnd = api::parse_kv_layout(kv_layout, op, "kv_layout");
        const AppendCaches c =
            append_caches(paged_kv_cache, kv_cache_sf, append_key, append_value, hnd, op);
        kernels::Nvfp4PagedAppendParams p;
        p.k_scale = decode_scale(k_scale, op, "k_scale");
        p.v_scale = decode_scale(v_scale, op, "v_scale");
        const int64_t nnz = append_key.size(0);
        FLASHINFER_CHECK(append_value.size(0) == nnz, op, "append_value", "has ",
                         append_value.size(0), " rows, append_key has ", nnz);
        api::check_same_device(kv_indptr, c.k, op, "kv_indptr", "paged_kv_cache");
        // Checked on the host for the CPU, read on the device for CUDA (api/attention_common.h).
        api::AppendIndexArrays idx;
        api::load_append_index_arrays(idx, batch_indices, positions, kv_indices, kv_indptr,
                                      kv_last_page_len, c.k.size(0), c.k.size(1), nnz, op);
        if (nnz == 0) return;
        p.nnz = nnz;
        p.table = idx.table;
        run_append(p, c, append_key, append_value, op);
      },
      append_key, append_value, batch_indices, positions, paged_kv_cache, kv_cache_sf, kv_indices,
      kv_indptr, kv_last_page_len, k_scale, v_scale, kv_layout);
}

void nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
    const Tensor& append_key, const Tensor& append_value, const Tensor& slot_mapping,
    const PagedKVCache& paged_kv_cache, const PagedKVCache& kv_cache_sf,
    ScalarOrTensor<double> k_scale, ScalarOrTensor<double> v_scale, std::string_view kv_layout,
    const Value& nvfp4_4over6) {
  call_op<&nvfp4_quantize_append_paged_kv_cache_with_slot_mapping>(
      [&] {
        const char* op = "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping";
        // Upstream 0.7.4: default None (off); a config is refused here (not implemented).
        api::check_defined(append_key, op, "append_key");
        api::refuse_nvfp4_4over6(nvfp4_4over6, append_key.dtype(), op);
        const bool hnd = api::parse_kv_layout(kv_layout, op, "kv_layout");
        const AppendCaches c =
            append_caches(paged_kv_cache, kv_cache_sf, append_key, append_value, hnd, op);
        api::check_defined(slot_mapping, op, "slot_mapping");
        api::check_dim(slot_mapping, {1}, op, "slot_mapping");
        api::check_dtype_in(slot_mapping, {DType::kInt32, DType::kInt64}, op, "slot_mapping");
        api::check_same_device(slot_mapping, c.k, op, "slot_mapping", "paged_kv_cache");
        const int64_t nnz = slot_mapping.size(0);
        FLASHINFER_CHECK(append_key.size(0) >= nnz && append_value.size(0) >= nnz, op,
                         append_key.size(0) < nnz ? "append_key" : "append_value",
                         "append_key and append_value must have at least slot_mapping.shape[0] (",
                         nnz, ") rows");
        kernels::Nvfp4PagedAppendParams p;
        append_scale(k_scale, c.k.device(), p.k_scale, p.k_scale_ptr, op, "k_scale");
        append_scale(v_scale, c.k.device(), p.v_scale, p.v_scale_ptr, op, "v_scale");
        if (nnz == 0) return;
        // Read where they are (on the device for CUDA: no copy to the host); a strided tensor
        // is copied dense first. Negative slots are padding and slots past the cache are
        // skipped, as upstream's kernel does (kernels::nvfp4_append_target).
        const Tensor slots = slot_mapping.contiguous();
        p.slot_mapping = slots.data_ptr();
        p.slot_i64 = slots.dtype() == DType::kInt64;
        p.page_size = c.k.size(1);
        p.slots_total = c.k.size(0) * c.k.size(1);
        p.nnz = nnz;
        run_append(p, c, append_key, append_value, op);
      },
      append_key, append_value, slot_mapping, paged_kv_cache, kv_cache_sf, k_scale, v_scale,
      kv_layout, nvfp4_4over6);
}

namespace {

// Bench hooks: batch_size requests of s_kv tokens in an NHD cache of page_size pages,
// num_kv_heads heads of head_dim_qk (rounded up to 64) dims; bf16 inputs.
struct PagedShape {
  int64_t batch, len, ps, pages_per_req, heads, d;
};
PagedShape paged_shape(const BenchShape& s) {
  PagedShape g;
  g.batch = s.batch_size;
  g.len = s.s_kv;
  g.ps = (s.page_size + 3) / 4 * 4;
  g.pages_per_req = (g.len + g.ps - 1) / g.ps;
  g.heads = s.num_kv_heads;
  g.d = (s.head_dim_qk + 63) / 64 * 64;
  return g;
}
DType bench_dtype(const BenchShape& s) {
  return s.kv_dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
}
Tensor bench_bytes(const Shape& shape, Device dev, uint64_t seed, double lo, double hi,
                   DType dt = DType::kUInt8) {
  Tensor b = api::bench::random_tensor(shape, DType::kFloat32, Device::cpu(), seed, lo, hi)
                 .to(DType::kUInt8);
  if (dt != DType::kUInt8) {
    Tensor t = Tensor::empty(shape, dt);
    std::memcpy(t.data_ptr(), b.data_ptr(), static_cast<size_t>(b.numel()));
    b = t;
  }
  return b.to(dev);
}

BenchCase bench_quantize_paged(const BenchShape& s, Device dev) {
  const PagedShape g = paged_shape(s);
  const Shape shape{g.batch * g.pages_per_req, g.ps, g.heads, g.d};
  const DType dt = bench_dtype(s);
  BenchCase c = api::bench::invoke_case(
      "nvfp4_quantize_paged_kv_cache",
      {Value(api::bench::random_tensor(shape, dt, dev, s.random_seed, -4, 4)),
       Value(api::bench::random_tensor(shape, dt, dev, s.random_seed + 1, -4, 4)), Value("NHD")});
  const double n = 2.0 * static_cast<double>(g.batch * g.pages_per_req * g.ps * g.heads * g.d);
  c.bytes = n * 2.0 + n / 2.0 + n / 16.0;
  return c;
}

BenchCase bench_dequantize_paged(const BenchShape& s, Device dev) {
  const PagedShape g = paged_shape(s);
  const int64_t pages = g.batch * g.pages_per_req;
  const DType dt = bench_dtype(s);
  std::vector<int64_t> table, lens;
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t j = 0; j < g.pages_per_req; ++j) table.push_back(b * g.pages_per_req + j);
    lens.push_back(g.len - b % 2);
  }
  const Tensor bt =
      api::bench::int32_tensor(table, Device::cpu()).reshape({g.batch, g.pages_per_req}).to(dev);
  const Shape out{g.batch, g.len, g.heads, g.d};
  BenchCase c = api::bench::invoke_case(
      "nvfp4_kv_dequantize_paged",
      {Value::tuple(
           {Value(bench_bytes({pages, g.ps, g.heads, g.d / 2}, dev, s.random_seed, 0, 256)),
            Value(bench_bytes({pages, g.ps, g.heads, g.d / 2}, dev, s.random_seed + 1, 0, 256))}),
       Value::tuple({Value(bench_bytes({pages, g.ps, g.heads, g.d / 16}, dev, s.random_seed + 2, 40,
                                       60, DType::kFloat8E4M3FN)),
                     Value(bench_bytes({pages, g.ps, g.heads, g.d / 16}, dev, s.random_seed + 3, 40,
                                       60, DType::kFloat8E4M3FN))}),
       Value(bt), Value(api::bench::int32_tensor(lens, dev)), Value(0.5), Value(0.25),
       Value(Tensor::zeros(out, dt, dev)), Value(Tensor::zeros(out, dt, dev))});
  const double n = 2.0 * static_cast<double>(g.batch * g.len * g.heads * g.d);
  c.bytes = n / 2.0 + n / 16.0 + 2.0 * n;
  return c;
}

// The last s_qo tokens of each request appended (again), as append_paged_kv_cache's bench.
BenchCase nvfp4_paged_bench_append(const BenchShape& s, Device dev, bool slots) {
  const PagedShape g = paged_shape(s);
  const int64_t pages = g.batch * g.pages_per_req;
  const int64_t q = std::min(s.s_qo, g.len);
  const int64_t nnz = g.batch * q;
  const DType dt = bench_dtype(s);
  std::vector<int64_t> bi, pos, indptr{0}, indices, last, slot;
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t j = 0; j < g.pages_per_req; ++j) indices.push_back(b * g.pages_per_req + j);
    indptr.push_back((b + 1) * g.pages_per_req);
    last.push_back(g.len - (g.pages_per_req - 1) * g.ps);
    for (int64_t i = 0; i < q; ++i) {
      bi.push_back(b);
      pos.push_back(g.len - q + i);
      slot.push_back(b * g.pages_per_req * g.ps + g.len - q + i);
    }
  }
  const Shape kv{nnz, g.heads, g.d};
  const Value cache =
      Value::tuple({Value(Tensor::zeros({pages, g.ps, g.heads, g.d / 2}, DType::kUInt8, dev)),
                    Value(Tensor::zeros({pages, g.ps, g.heads, g.d / 2}, DType::kUInt8, dev))});
  const Value sf = Value::tuple(
      {Value(Tensor::zeros({pages, g.ps, g.heads, g.d / 16}, DType::kFloat8E4M3FN, dev)),
       Value(Tensor::zeros({pages, g.ps, g.heads, g.d / 16}, DType::kFloat8E4M3FN, dev))});
  const Value key(api::bench::random_tensor(kv, dt, dev, s.random_seed, -4, 4));
  const Value value(api::bench::random_tensor(kv, dt, dev, s.random_seed + 1, -4, 4));
  BenchCase c =
      slots ? api::bench::invoke_case("nvfp4_quantize_append_paged_kv_cache_with_slot_mapping",
                                      {key, value, Value(api::bench::int32_tensor(slot, dev)),
                                       cache, sf, Value(0.01), Value(0.02)})
            : api::bench::invoke_case(
                  "nvfp4_quantize_append_paged_kv_cache",
                  {key, value, Value(api::bench::int32_tensor(bi, dev)),
                   Value(api::bench::int32_tensor(pos, dev)), cache, sf,
                   Value(api::bench::int32_tensor(indices, dev)),
                   Value(api::bench::int32_tensor(indptr, dev)),
                   Value(api::bench::int32_tensor(last, dev)), Value(0.01), Value(0.02)});
  const double n = 2.0 * static_cast<double>(nnz * g.heads * g.d);
  c.bytes = n * 2.0 + n / 2.0 + n / 16.0;
  return c;
}

}  // namespace

namespace detail {
void register_nvfp4_paged_ops(OpRegistry& r) {
  declare<&nvfp4_quantize_paged_kv_cache>(
      r,
      {.name = "nvfp4_quantize_paged_kv_cache",
       .module = kNvfp4PagedFp4Module,
       .summary = "Quantize whole paged K/V caches to NVFP4 (linear K scales, 4-token V swizzle)",
       .returns = "Tuple[Tuple[Tensor, Tensor], Tuple[Tensor, Tensor], float, float]"},
      "k_cache", "v_cache", arg("kv_layout", "HND"), "k_global_sf", "v_global_sf");
  declare<&nvfp4_kv_dequantize_paged>(
      r,
      {.name = "nvfp4_kv_dequantize_paged",
       .module = kNvfp4PagedFp4Module,
       .summary = "Dequantize a paged NVFP4 KV cache into dense K/V through a block table"},
      "paged_kv_cache", "kv_cache_sf", "block_tables", "seq_lens", "k_scale", "v_scale",
      arg("output_k").mut(), arg("output_v").mut(), arg("kv_layout", "NHD"));
  declare<&nvfp4_quantize_append_paged_kv_cache>(
      r,
      {.name = "nvfp4_quantize_append_paged_kv_cache",
       .module = kPageModule,
       .summary = "Quantize K/V rows to NVFP4 and append them into a paged cache"},
      "append_key", "append_value", "batch_indices", "positions", arg("paged_kv_cache").mut(),
      arg("kv_cache_sf").mut(), "kv_indices", "kv_indptr", "kv_last_page_len", "k_scale", "v_scale",
      arg("kv_layout", "NHD"));
  declare<&nvfp4_quantize_append_paged_kv_cache_with_slot_mapping>(
      r,
      {.name = "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping",
       .module = kPageModule,
       .summary = "Quantize K/V rows to NVFP4 and write them at flat cache slots"},
      "append_key", "append_value", "slot_mapping", arg("paged_kv_cache").mut(),
      arg("kv_cache_sf").mut(), "k_scale", "v_scale", arg("kv_layout", "NHD"),
      arg("nvfp4_4over6", Value()).type("NVFP44Over6Config"));
  api::register_backends("nvfp4_quantize_paged_kv_cache", kPagedQuantKernels);
  api::register_backends("nvfp4_kv_dequantize_paged", kPagedDequantKernels);
  api::register_backends("nvfp4_quantize_append_paged_kv_cache", kNvfp4PagedAppendKernels);
  api::register_backends("nvfp4_quantize_append_paged_kv_cache_with_slot_mapping",
                         kNvfp4PagedAppendKernels);
  register_bench_hook("nvfp4_quantize_paged_kv_cache", bench_quantize_paged);
  register_bench_hook("nvfp4_kv_dequantize_paged", bench_dequantize_paged);
  register_bench_hook("nvfp4_quantize_append_paged_kv_cache", [](const BenchShape& s, Device d) {
    return nvfp4_paged_bench_append(s, d, false);
  });
  register_bench_hook(
      "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping",
      [](const BenchShape& s, Device d) { return nvfp4_paged_bench_append(s, d, true); });
}
}  // namespace detail

}  // namespace flashinfer
