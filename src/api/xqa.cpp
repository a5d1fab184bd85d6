// flashinfer.xqa: xqa and xqa_mla, checked here and run through xqa_batch_decode_with_kv_cache /
// xqa_batch_decode_with_kv_cache_mla (nested calls, not recorded), whose CPU and CUDA kernels
// they share. Upstream builds those two on these entry points:
//   kv_scale = bmm2_scale * o_scale, q_scale = bmm1_scale / kv_scale * sqrt(head_dim),
//   sliding_win_size = window_left + 1 (0: none), sinks.reshape(Hkv, -1)   (decode.py)
//   q_scale = bmm1_scale, kv_scale = bmm2_scale, kv_cache.squeeze(1).unsqueeze(2)   (mla/_core.py)
// so the inverse maps are exact.
#include "flashinfer/ops/xqa.h"

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "api/arg_traits.h"
#include "api/attention_common.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/ops/mla.h"

namespace flashinfer {
namespace {

constexpr const char* kXqa = "xqa";
constexpr const char* kXqaMla = "xqa_mla";

// seq_lens [batch, 1] (beam width 1) -> [batch] view.
Tensor beam_lens(const Tensor& seq_lens, int64_t batch, const char* op) {
  api::check_defined(seq_lens, op, "seq_lens");
  FLASHINFER_CHECK(seq_lens.dtype() == DType::kInt32, op, "seq_lens", "must be int32, got ",
                   dtype_torch_name(seq_lens.dtype()));
  FLASHINFER_CHECK((seq_lens.dim() == 2 && seq_lens.size(0) == batch && seq_lens.size(1) == 1) ||
                       (seq_lens.dim() == 1 && seq_lens.size(0) == batch),
                   op, "seq_lens", "must be [", batch, ", 1] (beam width 1), got ",
                   shape_to_string(seq_lens.shape()));
  return seq_lens.dim() == 2 ? seq_lens.select(1, 0) : seq_lens;
}

void check_page_table(const Tensor& page_table, int64_t batch, const char* op) {
  api::check_defined(page_table, op, "page_table");
  FLASHINFER_CHECK(
      page_table.dim() == 2 && page_table.size(0) == batch && page_table.dtype() == DType::kInt32,
      op, "page_table", "must be int32 [", batch, ", pages per sequence], got ",
      dtype_torch_name(page_table.dtype()), " ", shape_to_string(page_table.shape()));
}

void check_scratch(const Tensor& workspace_buffer, const Tensor& semaphores, const char* op) {
  api::check_defined(workspace_buffer, op, "workspace_buffer");
  api::check_defined(semaphores, op, "semaphores");
}

// The decode name's argument as xqa's caller named it.
std::string xqa_arg(const std::string& a) {
  static const std::pair<const char*, const char*> kMap[] = {{"query", "q"},
                                                             {"kv_cache", "k_cache"},
                                                             {"block_tables", "page_table"},
                                                             {"out", "output"},
                                                             {"window_left", "sliding_win_size"},
                                                             {"q_len_per_req", "q_seq_len"},
                                                             {"bmm1_scale", "q_scale"},
                                                             {"bmm2_scale", "kv_scale"},
                                                             {"kv_cache_sf", "k_sf_cache"},
                                                             {"max_seq_len", "page_table"}};
  for (const auto& [from, to] : kMap) {
    if (a == from) return to;
  }
  return a;
}

void xqa_xqa_impl(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                  const Tensor& page_table, const Tensor& seq_lens, const Tensor& output,
                  const Tensor& workspace_buffer, const Tensor& semaphores, int64_t num_kv_heads,
                  int64_t page_size, const std::optional<Tensor>& sinks,
                  const ScalarOrTensor<double>& q_scale, const ScalarOrTensor<double>& kv_scale,
                  int64_t sliding_win_size, std::string_view kv_layout,
                  std::optional<bool> enable_pdl, int64_t q_seq_len, double rcp_out_scale,
                  const std::optional<Tensor>& mask, const std::optional<Tensor>& q_cu_seq_lens,
                  const std::optional<Tensor>& k_sf_cache,
                  const std::optional<Tensor>& v_sf_cache) {
  const char* op = kXqa;
  // Speculative decoding (q_seq_len > 1, upstream's SPEC_DEC build): q [B, 1, q_seq_len, Hq, D],
  // or with q_cu_seq_lens the packed rows of every request ([tokens, Hq, D] or any shape ending
  // in [Hq, D]); the mask is required (upstream asserts it).
  FLASHINFER_CHECK(q_seq_len >= 1, op, "q_seq_len", "must be >= 1, got ", q_seq_len);
  const bool spec = q_seq_len > 1;
  FLASHINFER_CHECK(spec || !q_cu_seq_lens, op, "q_cu_seq_lens",
                   "variable query lengths need q_seq_len > 1 (their maximum), got q_seq_len=1");
  FLASHINFER_CHECK(!spec || mask.has_value(), op, "mask",
                   "is required for speculative decoding (q_seq_len=", q_seq_len, ")");
  FLASHINFER_CHECK_CODE(spec || !mask, ErrorCode::kUnsupported, op, "mask",
                        "a speculative-decoding mask needs q_seq_len > 1");
  // NVFP4: uint8 caches (two e2m1 codes per byte) with linear e4m3 block scales [.., D / 16].
  const bool nvfp4 = k_cache.defined() && k_cache.dtype() == DType::kUInt8;
  FLASHINFER_CHECK(nvfp4 == k_sf_cache.has_value(), op, "k_sf_cache",
                   nvfp4 ? "must be given for an NVFP4 (uint8) cache"
                         : "is given but k_cache is not an NVFP4 (uint8) cache");
  FLASHINFER_CHECK(nvfp4 == v_sf_cache.has_value(), op, "v_sf_cache",
                   nvfp4 ? "must be given for an NVFP4 (uint8) cache"
                         : "is given but v_cache is not an NVFP4 (uint8) cache");
  check_scratch(workspace_buffer, semaphores, op);
  api::check_defined(q, op, "q");
  if (!spec) {
    FLASHINFER_CHECK(q.dim() == 4 && q.size(1) == 1, op, "q",
                     "must be [batch, 1, num_q_heads, head_dim] (beam width 1), got ",
                     shape_to_string(q.shape()));
  } else if (!q_cu_seq_lens) {
    FLASHINFER_CHECK(q.dim() == 5 && q.size(1) == 1 && q.size(2) == q_seq_len, op, "q",
                     "must be [batch, 1, q_seq_len=", q_seq_len,
                     ", num_q_heads, head_dim] (beam width 1), got ", shape_to_string(q.shape()));
  } else {
    FLASHINFER_CHECK(q.dim() >= 3, op, "q",
                     "must end in [num_q_heads, head_dim] after the query tokens, got ",
                     shape_to_string(q.shape()));
  }
  const int64_t H = q.size(-2), D = q.size(-1);
  api::check_defined(page_table, op, "page_table");
  // Speculative calls take the request count from page_table (q's leading axes may be tokens).
  const int64_t batch = spec && page_table.dim() == 2 ? page_table.size(0) : q.size(0);
  const int64_t rows = H * D > 0 ? q.numel() / (H * D) : 0;
  if (spec && !q_cu_seq_lens) {
    FLASHINFER_CHECK(q.size(0) == batch, op, "q", "has ", q.size(0), " requests, page_table ",
                     batch);
  }
  if (q_cu_seq_lens) {
    api::check_defined(*q_cu_seq_lens, op, "q_cu_seq_lens");
    FLASHINFER_CHECK(q_cu_seq_lens->numel() == batch + 1, op, "q_cu_seq_lens", "must hold ",
                     batch + 1, " offsets (page_table has ", batch, " requests), got ",
                     q_cu_seq_lens->numel());
  }
  api::check_defined(output, op, "output");
  api::check_shape_eq(output, q.shape(), op, "output");
  const bool fp8_out = dtype_is_fp8(output.dtype());
  FLASHINFER_CHECK(output.dtype() == q.dtype() || fp8_out, op, "output", "must be q's dtype ",
                   dtype_torch_name(q.dtype()), " or an fp8 dtype, got ",
                   dtype_torch_name(output.dtype()));
  FLASHINFER_CHECK(std::isfinite(rcp_out_scale) && rcp_out_scale != 0.0, op, "rcp_out_scale",
                   "must be finite and non-zero, got ", rcp_out_scale);
  const bool hnd = api::parse_kv_layout(kv_layout, op, "kv_layout");
  for (const auto& [t, arg] : {std::pair{&k_cache, "k_cache"}, std::pair{&v_cache, "v_cache"}}) {
    api::check_defined(*t, op, arg);
    FLASHINFER_CHECK(t->dim() == 4, op, arg, "must be 4-D [pages, ",
                     hnd ? "num_kv_heads, page_size" : "page_size, num_kv_heads",
                     ", head_dim], got ", shape_to_string(t->shape()));
    FLASHINFER_CHECK(t->size(hnd ? 2 : 1) == page_size, op, "page_size", "page_size ", page_size,
                     " != the cache's ", t->size(hnd ? 2 : 1));
    FLASHINFER_CHECK(t->size(hnd ? 1 : 2) == num_kv_heads, op, "num_kv_heads", "num_kv_heads ",
                     num_kv_heads, " != the cache's ", t->size(hnd ? 1 : 2));
    FLASHINFER_CHECK(t->size(3) * (nvfp4 ? 2 : 1) == D, op, arg, "head_dim ",
                     t->size(3) * (nvfp4 ? 2 : 1), " != q's ", D);
  }
  api::check_same_dtype(v_cache, k_cache, op, "v_cache", "k_cache");
  FLASHINFER_CHECK(num_kv_heads >= 1 && H % num_kv_heads == 0, op, "num_kv_heads", num_kv_heads,
                   " must divide q's ", H, " heads");
  check_page_table(page_table, batch, op);
  const Tensor lens = beam_lens(seq_lens, batch, op);
  FLASHINFER_CHECK(sliding_win_size >= 0, op, "sliding_win_size", "must be >= 0, got ",
                   sliding_win_size);
  // Upstream's SPEC_DEC kernel (mha.cu) skips only whole KV tiles before the window: no per-token
  // rule to reproduce.
  FLASHINFER_CHECK_CODE(!spec || sliding_win_size == 0, ErrorCode::kUnsupported, op,
                        "sliding_win_size",
                        "a sliding window with speculative decoding (q_seq_len > 1) is not "
                        "supported");
  std::optional<Tensor> flat_sinks;
  if (sinks) {
    api::check_defined(*sinks, op, "sinks");
    FLASHINFER_CHECK(
        sinks->dtype() == DType::kFloat32 && sinks->numel() == H &&
            (sinks->dim() == 1 || (sinks->dim() == 2 && sinks->size(0) == num_kv_heads)),
        op, "sinks", "must be float32 [num_kv_heads, ", H / std::max<int64_t>(num_kv_heads, 1),
        "], got ", dtype_torch_name(sinks->dtype()), " ", shape_to_string(sinks->shape()));
    flat_sinks = sinks->contiguous().reshape({H});
  }
  const double qs = api::fused_fp32_scale_value(q_scale, op, "q_scale"),
               ks = api::fused_fp32_scale_value(kv_scale, op, "kv_scale");
  const double bmm1 = qs * ks / std::sqrt(static_cast<double>(D));
  // The decode name's map back: kv_scale = bmm2_scale * o_scale, rcp_out_scale = 1 / o_scale
  // (rcp_out_scale only scales fp8 outputs; a 16-bit output is kv_scale * attention).
  const double o_scale = fp8_out ? 1.0 / rcp_out_scale : 1.0;
  // Nested: the decode entry point's kernels, writing into output's [rows, Hq, D] view.
  FLASHINFER_CHECK(!spec || output.is_contiguous(), op, "output",
                   "must be contiguous for speculative decoding (written through a [tokens, "
                   "heads, head_dim] view)");
  const Tensor query = spec ? q.reshape({rows, H, D}) : q.select(1, 0);
  try {
    xqa_batch_decode_with_kv_cache(
        query, PagedKVCache(k_cache, v_cache), workspace_buffer, page_table, lens,
        page_table.size(1) * page_size, bmm1, ks / o_scale,
        sliding_win_size > 0 ? sliding_win_size - 1 : -1,
        spec ? output.view({rows, H, D}) : output.select(1, 0), flat_sinks, kv_layout, enable_pdl,
        q_seq_len, o_scale, mask,
        nvfp4 ? std::optional<Value>(to_value(PagedKVCache(*k_sf_cache, *v_sf_cache)))
              : std::nullopt,
        q_cu_seq_lens);
  } catch (const Error& e) {
    // What only the nested call checks (mask rows, per-request counts) is xqa's caller's error:
    // name xqa and its own argument.
    if (e.op() != "xqa_batch_decode_with_kv_cache") throw;
    throw Error(e.code(), op, xqa_arg(e.arg()), e.detail());
  }
}

void xqa_mla_impl(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                  const Tensor& page_table, const Tensor& seq_lens, const Tensor& output,
                  const Tensor& workspace_buffer, const Tensor& semaphores, int64_t page_size,
                  const ScalarOrTensor<double>& q_scale, const ScalarOrTensor<double>& kv_scale,
                  std::optional<bool> enable_pdl) {
  const char* op = kXqaMla;
  check_scratch(workspace_buffer, semaphores, op);
  api::check_defined(q, op, "q");
  FLASHINFER_CHECK(q.dim() == 4 && q.size(1) == 1, op, "q",
                   "must be [batch, 1, num_heads, kv_lora_rank + rope_dim] (beam width 1), got ",
                   shape_to_string(q.shape()));
  const int64_t batch = q.size(0), H = q.size(2), D = q.size(3);
  api::check_defined(k_cache, op, "k_cache");
  api::check_defined(v_cache, op, "v_cache");
  FLASHINFER_CHECK(k_cache.dim() == 4 && k_cache.size(2) == 1 && k_cache.size(3) == D, op,
                   "k_cache", "must be the latent cache [pages, page_size, 1, ", D, "], got ",
                   shape_to_string(k_cache.shape()));
  FLASHINFER_CHECK(k_cache.size(1) == page_size, op, "page_size", "page_size ", page_size,
                   " != the cache's ", k_cache.size(1));
  FLASHINFER_CHECK(v_cache.shape() == k_cache.shape() && v_cache.dtype() == k_cache.dtype(), op,
                   "v_cache", "must be the latent cache k_cache is, got ",
                   dtype_torch_name(v_cache.dtype()), " ", shape_to_string(v_cache.shape()));
  // Values are the latent rows' first kv_lora_rank features: upstream passes one cache twice. A
  // copy (a replayed record whose two arguments were saved apart) must hold the same bytes.
  if (v_cache.data_ptr() != k_cache.data_ptr() || v_cache.strides() != k_cache.strides()) {
    const Tensor a = k_cache.to(Device::cpu()).contiguous();
    const Tensor b = v_cache.to(Device::cpu()).contiguous();
    FLASHINFER_CHECK_CODE(
        std::memcmp(a.data_ptr(), b.data_ptr(), static_cast<std::size_t>(a.nbytes())) == 0,
        ErrorCode::kUnsupported, op, "v_cache",
        "must hold the same latent cache as k_cache (values are its first kv_lora_rank "
        "features), as upstream passes it");
  }
  api::check_defined(output, op, "output");
  FLASHINFER_CHECK(output.dim() == 4 && output.size(0) == batch && output.size(1) == 1 &&
                       output.size(2) == H && output.size(3) >= 1 && output.size(3) < D,
                   op, "output", "must be [", batch, ", 1, ", H,
                   ", kv_lora_rank] with kv_lora_rank < ", D, ", got ",
                   shape_to_string(output.shape()));
  check_page_table(page_table, batch, op);
  const Tensor lens = beam_lens(seq_lens, batch, op);
  const int64_t rank = output.size(3);
  const double qs = api::fused_fp32_scale_value(q_scale, op, "q_scale"),
               ks = api::fused_fp32_scale_value(kv_scale, op, "kv_scale");
  try {
    xqa_batch_decode_with_kv_cache_mla(q, k_cache.select(2, 0), workspace_buffer, 128, rank,
                                       D - rank, page_table, lens, page_table.size(1) * page_size,
                                       output, qs, ks, std::nullopt, enable_pdl);
  } catch (const Error& e) {
    // As xqa's above: what only the nested call checks (dtypes, layouts, the lengths against the
    // page table) names xqa_mla and its own argument.
    if (e.op() != "xqa_batch_decode_with_kv_cache_mla") throw;
    throw Error(e.code(), op, xqa_arg(e.arg()), e.detail(), e.file(), e.line());
  }
}

// flashinfer bench: batch_size requests of s_kv tokens, one query each.
BenchCase bench_xqa(const BenchShape& s, Device dev) {
  const DType qd = s.q_dtype == DType::kFloat32 ? DType::kBFloat16 : s.q_dtype;
  const DType kd = s.kv_dtype == DType::kFloat32 ? qd : s.kv_dtype;
  const int64_t B = s.batch_size, H = s.num_qo_heads, Hkv = s.num_kv_heads, D = s.head_dim_qk;
  const int64_t ps = s.page_size, per = (s.s_kv + ps - 1) / ps;
  std::vector<int64_t> table, lens;
  for (int64_t i = 0; i < B * per; ++i) table.push_back(i);
  for (int64_t b = 0; b < B; ++b) lens.push_back(s.s_kv);
  const Tensor q = api::bench::random_tensor({B, 1, H, D}, qd, dev, s.random_seed);
  const Tensor k = api::bench::random_tensor({B * per, ps, Hkv, D}, kd, dev, s.random_seed + 1);
  const Tensor v = api::bench::random_tensor({B * per, ps, Hkv, D}, kd, dev, s.random_seed + 2);
  BenchCase c = api::bench::invoke_case(
      kXqa,
      {Value(q), Value(k), Value(v), Value(api::bench::int32_tensor(table, dev).reshape({B, per})),
       Value(api::bench::int32_tensor(lens, dev).reshape({B, 1})),
       Value(Tensor::zeros({B, 1, H, D}, qd, dev)), Value(Tensor::zeros({256}, DType::kUInt8, dev)),
       Value(Tensor::zeros({64}, DType::kUInt8, dev)), Value(Hkv), Value(ps)});
  c.flops = static_cast<double>(B) * api::bench::attention_flops(1, s.s_kv, H, D, D, false);
  c.bytes =
      api::bench::nbytes({B * s.s_kv, Hkv, 2 * D}, kd) + api::bench::nbytes({B, H, 2 * D}, qd);
  return c;
}

// flashinfer bench: DeepSeek widths (512 + 64, output 512), batch_size requests of s_kv tokens.
BenchCase bench_xqa_mla(const BenchShape& s, Device dev) {
  const DType qd = s.q_dtype == DType::kFloat32 ? DType::kBFloat16 : s.q_dtype;
  const int64_t B = s.batch_size, H = s.num_qo_heads, D = 576, R = 512;
  const int64_t ps = s.page_size, per = (s.s_kv + ps - 1) / ps;
  std::vector<int64_t> table, lens;
  for (int64_t i = 0; i < B * per; ++i) table.push_back(i);
  for (int64_t b = 0; b < B; ++b) lens.push_back(s.s_kv);
  const Tensor kv = api::bench::random_tensor({B * per, ps, 1, D}, qd, dev, s.random_seed + 1);
  BenchCase c = api::bench::invoke_case(
      kXqaMla,
      {Value(api::bench::random_tensor({B, 1, H, D}, qd, dev, s.random_seed)), Value(kv), Value(kv),
       Value(api::bench::int32_tensor(table, dev).reshape({B, per})),
       Value(api::bench::int32_tensor(lens, dev).reshape({B, 1})),
       Value(Tensor::zeros({B, 1, H, R}, qd == DType::kFloat8E4M3FN ? DType::kBFloat16 : qd, dev)),
       Value(Tensor::zeros({256}, DType::kUInt8, dev)),
       Value(Tensor::zeros({64}, DType::kUInt8, dev)), Value(ps), Value(1.0 / std::sqrt(192.0))});
  c.flops = static_cast<double>(B) * api::bench::attention_flops(1, s.s_kv, H, D, R, false);
  c.bytes = api::bench::nbytes({B * s.s_kv, D}, qd);
  return c;
}

}  // namespace

void xqa(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& page_table,
         const Tensor& seq_lens, const Tensor& output, const Tensor& workspace_buffer,
         const Tensor& semaphores, int64_t num_kv_heads, int64_t page_size,
         std::optional<Tensor> sinks, ScalarOrTensor<double> q_scale,
         ScalarOrTensor<double> kv_scale, int64_t sliding_win_size, std::string_view kv_layout,
         std::optional<int64_t> sm_count, std::optional<bool> enable_pdl, double rcp_out_scale,
         int64_t q_seq_len, std::optional<Tensor> mask, std::optional<Tensor> q_cu_seq_lens,
         std::optional<Tensor> k_sf_cache, std::optional<Tensor> v_sf_cache) {
  call_op<&xqa>(
      [&] {
        (void)sm_count;  // a launch-size hint
        xqa_xqa_impl(q, k_cache, v_cache, page_table, seq_lens, output, workspace_buffer,
                     semaphores, num_kv_heads, page_size, sinks, q_scale, kv_scale,
                     sliding_win_size, kv_layout, enable_pdl, q_seq_len, rcp_out_scale, mask,
                     q_cu_seq_lens, k_sf_cache, v_sf_cache);
      },
      q, k_cache, v_cache, page_table, seq_lens, output, workspace_buffer, semaphores, num_kv_heads,
      page_size, sinks, q_scale, kv_scale, sliding_win_size, kv_layout, sm_count, enable_pdl,
      rcp_out_scale, q_seq_len, mask, q_cu_seq_lens, k_sf_cache, v_sf_cache);
}

void xqa_mla(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
             const Tensor& page_table, const Tensor& seq_lens, const Tensor& output,
             const Tensor& workspace_buffer, const Tensor& semaphores, int64_t page_size,
             ScalarOrTensor<double> q_scale, ScalarOrTensor<double> kv_scale,
             std::optional<int64_t> sm_count, std::optional<bool> enable_pdl) {
  call_op<&xqa_mla>(
      [&] {
        (void)sm_count;
        xqa_mla_impl(q, k_cache, v_cache, page_table, seq_lens, output, workspace_buffer,
                     semaphores, page_size, q_scale, kv_scale, enable_pdl);
      },
      q, k_cache, v_cache, page_table, seq_lens, output, workspace_buffer, semaphores, page_size,
      q_scale, kv_scale, sm_count, enable_pdl);
}

namespace detail {
void register_xqa_ops(OpRegistry& r) {
  declare<&xqa>(r,
                {.name = kXqa,
                 .module = "flashinfer.xqa",
                 .summary = "XQA paged decode (block table, sinks, sliding window), in place"},
                "q", "k_cache", "v_cache", "page_table", "seq_lens", arg("output").mut(),
                "workspace_buffer", "semaphores", "num_kv_heads", "page_size", "sinks",
                arg("q_scale", 1.0), arg("kv_scale", 1.0), arg("sliding_win_size", 0),
                arg("kv_layout", "NHD"), "sm_count", "enable_pdl", arg("rcp_out_scale", 1.0),
                arg("q_seq_len", 1), "mask", arg("q_cu_seq_lens").kw(), arg("k_sf_cache").kw(),
                arg("v_sf_cache").kw());
  declare<&xqa_mla>(r,
                    {.name = kXqaMla,
                     .module = "flashinfer.xqa",
                     .summary = "XQA DeepSeek MLA decode over the latent cache, in place"},
                    "q", "k_cache", "v_cache", "page_table", "seq_lens", arg("output").mut(),
                    "workspace_buffer", "semaphores", "page_size", arg("q_scale", 1.0),
                    arg("kv_scale", 1.0), "sm_count", "enable_pdl");
  // The kernels of xqa_batch_decode_with_kv_cache / _mla, which these run on.
  api::register_attention_backends(kXqa);
  static constexpr api::BackendSummary kMla[] = {
    {DeviceType::kCPU, "CPU reference of xqa_batch_decode_with_kv_cache_mla"},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel of xqa_batch_decode_with_kv_cache_mla"},
#endif
  };
  api::register_backends(kXqaMla, std::span<const api::BackendSummary>(kMla));
  register_bench_hook(kXqa, bench_xqa);
  register_bench_hook(kXqaMla, bench_xqa_mla);
}
}  // namespace detail

}  // namespace flashinfer
