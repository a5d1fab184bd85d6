// Public prefill attention (flashinfer.prefill): single_prefill_with_kv_cache and the paged and
// ragged batch prefill wrappers — declarations, checks, plan and dispatch.
#include <algorithm>
#include <cmath>
#include <vector>

#include "api/arg_traits.h"
#include "api/attention_common.h"
#include "api/attention_jit_module.h"
#include "api/attention_pos_encoding.h"
#include "api/attention_sink.h"
#include "api/bench_backend.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "core/cuda_runtime.h"
#include "flashinfer/ops/attention.h"

namespace flashinfer {
namespace {

constexpr const char* kPrefillModule = "flashinfer.prefill";
constexpr const char* kPaged = "BatchPrefillWithPagedKVCacheWrapper";
constexpr const char* kRagged = "BatchPrefillWithRaggedKVCacheWrapper";

// The constructors' argument types, as declared (and checked against the constructors).
using PagedInit =
    Init<BatchPrefillWithPagedKVCacheWrapper, Tensor, std::string, bool, std::optional<Tensor>,
         std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>,
         std::optional<Tensor>, std::string, std::optional<Value>, std::optional<Value>, bool,
         std::optional<int64_t>>;
using RaggedInit =
    Init<BatchPrefillWithRaggedKVCacheWrapper, Tensor, std::string, bool, std::optional<Tensor>,
         std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>, std::string,
         std::optional<Value>, std::optional<Value>, bool>;

// Upstream 0.7.4's variant_owns_mask: a JIT variant's LogitsMask replaces the kernel's masks
// (fa2 with a custom module only); this library's one variant, AttentionSink, is run through its
// own masks.
void check_variant_owns_mask(bool variant_owns_mask, const char* op) {
  FLASHINFER_CHECK_CODE(!variant_owns_mask, ErrorCode::kUnsupported, op, "variant_owns_mask",
                        "a JIT variant's own LogitsMask in place of the kernel's masks is not "
                        "supported");
}

// Per-head fp8 scale vector: fp32 [n] on q's device.
Tensor head_scales(const std::optional<Tensor>& t, int64_t n, const Tensor& q, const char* op,
                   const char* arg) {
  if (!t) return Tensor();
  api::check_defined(*t, op, arg);
  FLASHINFER_CHECK(t->dtype() == DType::kFloat32, op, arg, "must be torch.float32");
  api::check_shape_eq(*t, {n}, op, arg);
  api::check_same_device(*t, q, op, arg, "q");
  return t->contiguous();
}

// The prefill options this library does not implement must stay unset.
void check_prefill_options(const PrefillPlanOptions& o, bool paged, const char* op) {
  auto unsupported = [&](bool set, const char* arg) {
    FLASHINFER_CHECK_CODE(!set, ErrorCode::kUnsupported, op, arg, "is not supported");
  };
  unsupported(!paged && o.seq_lens.has_value(), "seq_lens");  // paged: checked against the table
  unsupported(o.seq_lens_q.has_value(), "seq_lens_q");
  unsupported(o.block_tables.has_value(), "block_tables");
  unsupported(o.v_indptr.has_value(), "v_indptr");
  unsupported(o.o_indptr.has_value(), "o_indptr");
  unsupported(paged && o.qo_indptr_cpu.has_value(), "qo_indptr_cpu");
  unsupported(paged && o.kv_indptr_cpu.has_value(), "kv_indptr_cpu");
  // Upstream 0.7.4's per-token, per-head fp8 K/V scales (its fa2 kernel scales each score by
  // k_sf[t, h] and each value row by v_sf[t, h]): not implemented here.
  FLASHINFER_CHECK_CODE(!o.use_token_head_sf, ErrorCode::kUnsupported, op, "use_token_head_sf",
                        "per-token, per-head fp8 K/V scales are not supported");
}

// The ragged plan's host mirror of an indptr (upstream 0.7.4's qo_indptr_cpu / kv_indptr_cpu):
// planned from instead of the indptr itself, after upstream's checks.
const Tensor& indptr_or_mirror(const Tensor& indptr, const std::optional<Tensor>& mirror,
                               const char* op, const char* arg) {
  if (!mirror) return indptr;
  api::check_defined(*mirror, op, arg);
  FLASHINFER_CHECK(mirror->device().is_cpu(), op, arg, "must be a CPU tensor");
  FLASHINFER_CHECK(mirror->dim() == 1 && indptr.dim() == 1 && mirror->size(0) == indptr.size(0), op,
                   arg, "must have the same 1-D shape as its indptr");
  FLASHINFER_CHECK(mirror->dtype() == indptr.dtype() &&
                       (mirror->dtype() == DType::kInt32 || mirror->dtype() == DType::kInt64),
                   op, arg, "must have the same integer dtype as its indptr");
  return *mirror;
}

// qo_indptr → host; the causal rule kv_len >= qo_len per request.
void prefill_load_qo(detail::WrapperState& s, const Tensor& qo_indptr, const char* op) {
  s.qo_indptr =
      api::index_to_host(qo_indptr, op, "qo_indptr", static_cast<int64_t>(s.kv_lens.size()) + 1);
  api::check_indptr(s.qo_indptr, op, "qo_indptr");
  s.batch = static_cast<int32_t>(s.kv_lens.size());
  s.total_qo = s.qo_indptr.back();
  if (s.max_total_num_rows >= 0) {
    FLASHINFER_CHECK(s.total_qo <= s.max_total_num_rows, op, "qo_indptr",
                     "The total number of rows in qo_indptr ", s.total_qo,
                     " in cuda graph mode cannot exceed the number of rows set during "
                     "initialization ",
                     s.max_total_num_rows);
  }
  if (s.causal) {
    for (int32_t b = 0; b < s.batch; ++b) {
      const int32_t qo_len = s.qo_indptr[b + 1] - s.qo_indptr[b];
      FLASHINFER_CHECK(s.kv_lens[b] >= qo_len, op, "causal", "request ", b, " has qo_len ", qo_len,
                       " > kv_len ", s.kv_lens[b],
                       " (causal masks are right-aligned and need kv_len >= qo_len)");
    }
  }
}

AttentionOutput single_prefill_impl(
    const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& scale_q,
    const std::optional<Tensor>& scale_k, const std::optional<Tensor>& scale_v,
    std::optional<DType> o_dtype, const std::optional<Tensor>& custom_mask,
    const std::optional<Tensor>& packed_custom_mask, bool causal, std::string_view kv_layout,
    std::string_view pos_encoding_mode, std::optional<double> sm_scale, int64_t window_left,
    std::optional<double> logits_soft_cap, std::optional<double> rope_scale,
    std::optional<double> rope_theta, std::string_view backend, bool return_lse,
    const std::optional<PagedKVCache>& kv_cache_sf, std::optional<double> k_scale,
    std::optional<double> v_scale, const api::JitModuleCall* jit = nullptr) {
  const char* op = jit ? jit->op : "single_prefill_with_kv_cache";
  api::check_single_qkv(q, k, v, 3, op);
  api::check_prefill_backend(backend, q.device(), /*fa3=*/true, op);
  // NVFP4 (upstream: "a tuple of (k_scales, v_scales)"): k, v packed uint8 [.., head_dim / 2].
  const bool nvfp4 = kv_cache_sf.has_value();
  if (nvfp4) {
    FLASHINFER_CHECK(kv_cache_sf->is_pair(), op, "kv_cache_sf",
                     "expected a (k_scales, v_scales) pair, got one tensor");
    api::check_defined(kv_cache_sf->first(), op, "kv_cache_sf");
    api::check_defined(kv_cache_sf->second(), op, "kv_cache_sf");
    FLASHINFER_CHECK(k.dtype() == DType::kUInt8 && v.dtype() == DType::kUInt8, op, "k",
                     "with kv_cache_sf, k and v must be packed NVFP4 (torch.uint8), got ",
                     dtype_torch_name(k.dtype()), " and ", dtype_torch_name(v.dtype()));
  }
  FLASHINFER_CHECK(nvfp4 || k.dtype() != DType::kUInt8, op, "kv_cache_sf",
                   "must be given for packed NVFP4 (torch.uint8) k and v");
  const int64_t pack = nvfp4 ? 2 : 1;  // elements per stored k/v element
  const bool hnd = api::parse_kv_layout(kv_layout, op, "kv_layout");
  const Tensor kn = hnd ? k.transpose(0, 1) : k;
  const Tensor vn = hnd ? v.transpose(0, 1) : v;
  FLASHINFER_CHECK(vn.size(0) == kn.size(0), op, "v", "has ", vn.size(0), " tokens, k has ",
                   kn.size(0));
  FLASHINFER_CHECK(vn.size(1) == kn.size(1), op, "v", "has ", vn.size(1), " heads, k has ",
                   kn.size(1));
  FLASHINFER_CHECK(kn.size(2) * pack == q.size(2), op, "k", "head_dim ", kn.size(2) * pack,
                   nvfp4 ? " (packed: 2 per byte)" : "", " does not match q's ", q.size(2));
  FLASHINFER_CHECK(kn.size(0) <= std::numeric_limits<int32_t>::max() &&
                       q.size(0) <= std::numeric_limits<int32_t>::max(),
                   op, "k", "more than 2^31 - 1 tokens");
  api::check_q_dtype(q.dtype(), op, "q");
  if (!nvfp4) api::check_kv_dtype(k.dtype(), q.dtype(), op, "k");
  api::check_same_dtype(v, k, op, "v", "k");
  api::check_same_device(k, q, op, "k", "q");
  api::check_same_device(v, q, op, "v", "q");
  // Name this op's own arguments before the shared checks do.
  api::check_heads(q.size(1), kn.size(1), op, "q", "k");
  api::check_head_dim(q.size(2), op, "q");
  api::check_head_dim(vn.size(2) * pack, op, "v");
  if (o_dtype) api::check_q_dtype(*o_dtype, op, "o_dtype");
  detail::WrapperState s;
  s.device = q.device();
  s.backend = std::string(backend);
  api::plan_settings(s, q.size(1), kn.size(1), q.size(2), vn.size(2) * pack, q.dtype(), k.dtype(),
                     o_dtype, sm_scale, window_left, logits_soft_cap, "NONE", op);
  api::plan_pos_encoding(s, pos_encoding_mode, rope_scale, rope_theta, op);
  if (jit) api::apply_jit_module_call(s, *jit);
  s.paged = false;
  s.batch = 1;
  const auto qo_len = static_cast<int32_t>(q.size(0));
  const auto kv_len = static_cast<int32_t>(kn.size(0));
  s.qo_indptr = {0, qo_len};
  s.kv_indptr = {0, kv_len};
  s.kv_lens = {kv_len};
  s.total_qo = qo_len;
  s.total_kv = kv_len;
  s.causal = causal;
  FLASHINFER_CHECK(!causal || kv_len >= qo_len || custom_mask || packed_custom_mask, op, "causal",
                   "qo_len ", qo_len, " > kv_len ", kv_len,
                   " (causal masks are right-aligned and need kv_len >= qo_len)");
  api::load_custom_mask(s, custom_mask, packed_custom_mask, op);
  s.scale_q = head_scales(scale_q, q.size(1), q, op, "scale_q");
  s.scale_k = head_scales(scale_k, kn.size(1), q, op, "scale_k");
  s.scale_v = head_scales(scale_v, kn.size(1), q, op, "scale_v");
  {
    // A one-request plan made from shapes on every call: under a CUDA-graph capture its upload
    // goes by value (the graph keeps it, as upstream's kernels keep their shape arguments).
    const detail::CaptureUploadScope by_value;
    api::build_plan(s, std::nullopt, /*disable_split_kv=*/true, op);
  }
  AttentionRunOptions o;
  o.k_scale = k_scale;
  o.v_scale = v_scale;
  o.return_lse = return_lse;
  // NVFP4: dequantized by run_planned (api/attention_nvfp4.cpp); scales laid out like k / v.
  if (nvfp4) {
    const Tensor& ks = kv_cache_sf->first();
    const Tensor& vs = kv_cache_sf->second();
    o.kv_cache_sf = hnd && ks.dim() == 3 && vs.dim() == 3
                        ? PagedKVCache(ks.transpose(0, 1), vs.transpose(0, 1))
                        : *kv_cache_sf;
  }
  return api::run_planned(s, q, kn, vn, o, op, "k", "v");
}

}  // namespace

AttentionOutput single_prefill_with_kv_cache(
    const Tensor& q, const Tensor& k, const Tensor& v, std::optional<Tensor> scale_q,
    std::optional<Tensor> scale_k, std::optional<Tensor> scale_v, std::optional<DType> o_dtype,
    std::optional<Tensor> custom_mask, std::optional<Tensor> packed_custom_mask, bool causal,
    std::string_view kv_layout, std::string_view pos_encoding_mode, bool use_fp16_qk_reduction,
    std::optional<double> sm_scale, int64_t window_left, std::optional<double> logits_soft_cap,
    std::optional<double> rope_scale, std::optional<double> rope_theta, std::string_view backend,
    bool return_lse, std::optional<PagedKVCache> kv_cache_sf, std::optional<double> k_scale,
    std::optional<double> v_scale) {
  return call_op<&single_prefill_with_kv_cache>(
      [&] {
        return single_prefill_impl(q, k, v, scale_q, scale_k, scale_v, o_dtype, custom_mask,
                                   packed_custom_mask, causal, kv_layout, pos_encoding_mode,
                                   sm_scale, window_left, logits_soft_cap, rope_scale, rope_theta,
                                   backend, return_lse, kv_cache_sf, k_scale, v_scale);
      },
      q, k, v, scale_q, scale_k, scale_v, o_dtype, custom_mask, packed_custom_mask, causal,
      kv_layout, pos_encoding_mode, use_fp16_qk_reduction, sm_scale, window_left, logits_soft_cap,
      rope_scale, rope_theta, backend, return_lse, kv_cache_sf, k_scale, v_scale);
}

AttentionOutput single_prefill_with_kv_cache_with_jit_module(
    const std::shared_ptr<AttentionJitModule>& jit_module, const Tensor& q, const Tensor& k,
    const Tensor& v, Value args, std::string_view kv_layout, int64_t mask_mode, int64_t window_left,
    bool return_lse) {
  return call_op<&single_prefill_with_kv_cache_with_jit_module>(
      [&] {
        const char* op = "single_prefill_with_kv_cache_with_jit_module";
        const api::ModuleArgs m =
            api::read_module_args(jit_module, AttentionJitModule::Kind::kSinglePrefill, args, q, k,
                                  v, window_left, mask_mode, op);
        return api::with_module_arg_names([&] {
          return single_prefill_impl(
              q, k, v, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
              m.packed_custom_mask, /*causal=*/mask_mode == 1, kv_layout, m.pos_encoding_mode,
              m.sm_scale, m.window_left, m.logits_soft_cap, std::nullopt, std::nullopt, "fa2",
              return_lse, std::nullopt, std::nullopt, std::nullopt, &m.call);
        });
      },
      jit_module, q, k, v, args, kv_layout, mask_mode, window_left, return_lse);
}

std::pair<Tensor, Tensor> single_prefill_with_kv_cache_return_lse(
    const Tensor& q, const Tensor& k, const Tensor& v, bool causal, std::string_view kv_layout,
    std::optional<double> sm_scale, int64_t window_left, std::optional<double> logits_soft_cap) {
  AttentionOutput r = single_prefill_with_kv_cache(
      q, k, v, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
      causal, kv_layout, "NONE", false, sm_scale, window_left, logits_soft_cap, std::nullopt,
      std::nullopt, "auto", /*return_lse=*/true);
  return {r.out, r.lse};
}

// ---- BatchPrefillWithPagedKVCacheWrapper -----------------------------------------------------

BatchPrefillWithPagedKVCacheWrapper::BatchPrefillWithPagedKVCacheWrapper(
    Tensor float_workspace_buffer, std::string kv_layout, bool use_cuda_graph,
    std::optional<Tensor> qo_indptr_buf, std::optional<Tensor> paged_kv_indptr_buf,
    std::optional<Tensor> paged_kv_indices_buf, std::optional<Tensor> paged_kv_last_page_len_buf,
    std::optional<Tensor> custom_mask_buf, std::optional<Tensor> mask_indptr_buf,
    std::string backend, std::optional<Value> jit_args, std::optional<Value> jit_kwargs,
    bool variant_owns_mask, std::optional<int64_t> max_total_num_rows)
    : s_(std::make_unique<detail::WrapperState>()) {
  call_init<PagedInit>(
      [&] {
        const char* op = "BatchPrefillWithPagedKVCacheWrapper.__init__";
        check_variant_owns_mask(variant_owns_mask, op);
        // CUDA-graph capacity: every later plan may have up to this many query rows.
        if (max_total_num_rows) {
          FLASHINFER_CHECK(use_cuda_graph, op, "max_total_num_rows",
                           "requires use_cuda_graph=True");
          FLASHINFER_CHECK(*max_total_num_rows >= 0, op, "max_total_num_rows",
                           "must be a nonnegative integer, got ", *max_total_num_rows);
          s_->max_total_num_rows = *max_total_num_rows;
        }
        // Upstream's AttentionSink variant (its sink tests): run takes (sink, sm_scale) through
        // *args. Upstream resolves backend "auto" before the JIT build.
        const bool sink = api::attention_sink_variant(jit_args, jit_kwargs, op);
        FLASHINFER_CHECK_CODE(sink || !jit_kwargs || jit_kwargs->is_none(), ErrorCode::kUnsupported,
                              op, "jit_kwargs",
                              "JIT variants other than AttentionSink are not "
                              "supported");
        api::init_wrapper(*s_, float_workspace_buffer, kv_layout, use_cuda_graph, backend,
                          std::nullopt, op, /*fa3=*/true);
        s_->sink_variant = sink;
        api::set_graph_buffers(*s_, paged_kv_indices_buf, custom_mask_buf);
      },
      *this, float_workspace_buffer, kv_layout, use_cuda_graph, qo_indptr_buf, paged_kv_indptr_buf,
      paged_kv_indices_buf, paged_kv_last_page_len_buf, custom_mask_buf, mask_indptr_buf, backend,
      jit_args, jit_kwargs, variant_owns_mask, max_total_num_rows);
}

BatchPrefillWithPagedKVCacheWrapper::~BatchPrefillWithPagedKVCacheWrapper() = default;

bool BatchPrefillWithPagedKVCacheWrapper::split_kv() const { return s_->plan.split_kv; }

namespace {

// plan()'s work, into `s` (the wrapper's state, or workspace_size()'s scratch copy).
void plan_paged_prefill(detail::WrapperState& s, const Tensor& qo_indptr,
                        const Tensor& paged_kv_indptr, const Tensor& paged_kv_indices,
                        const Tensor& paged_kv_last_page_len, int64_t num_qo_heads,
                        int64_t num_kv_heads, int64_t head_dim_qk, int64_t page_size,
                        const PrefillPlanOptions& o, const char* op) {
  s.planned = false;
  check_prefill_options(o, /*paged=*/true, op);
  api::plan_settings(s, num_qo_heads, num_kv_heads, head_dim_qk,
                     o.head_dim_vo.value_or(head_dim_qk), o.q_data_type, o.kv_data_type,
                     o.o_data_type, o.sm_scale, o.window_left, o.logits_soft_cap, "NONE", op);
  s.decode = false;
  api::plan_pos_encoding(s, o.pos_encoding_mode, o.rope_scale, o.rope_theta, op);
  // The ids stay on the device, read when the call runs (kernels/page_guard.h).
  api::load_page_table(s, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, page_size, op,
                       "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len",
                       /*live_ids=*/true);
  api::check_seq_lens(s, o.seq_lens, op);
  s.decode = false;
  s.causal = o.causal && !o.custom_mask && !o.packed_custom_mask;
  prefill_load_qo(s, qo_indptr, op);
  api::load_custom_mask(s, o.custom_mask, o.packed_custom_mask, op);
  api::load_multi_item_mask(s, o.prefix_len_ptr, o.token_pos_in_items_ptr, o.token_pos_in_items_len,
                            o.max_item_len_ptr, op);
  api::build_plan(s, o.fixed_split_size, o.disable_split_kv, op);
}

}  // namespace

void BatchPrefillWithPagedKVCacheWrapper::plan(
    const Tensor& qo_indptr, const Tensor& paged_kv_indptr, const Tensor& paged_kv_indices,
    const Tensor& paged_kv_last_page_len, int64_t num_qo_heads, int64_t num_kv_heads,
    int64_t head_dim_qk, int64_t page_size, const PrefillPlanOptions& o) {
  call_op<&BatchPrefillWithPagedKVCacheWrapper::plan>(
      [&] {
        plan_paged_prefill(*s_, qo_indptr, paged_kv_indptr, paged_kv_indices,
                           paged_kv_last_page_len, num_qo_heads, num_kv_heads, head_dim_qk,
                           page_size, o, "BatchPrefillWithPagedKVCacheWrapper.plan");
      },
      *this, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
      num_kv_heads, head_dim_qk, page_size, o);
}

WorkspaceSizes BatchPrefillWithPagedKVCacheWrapper::workspace_size(
    const Tensor& qo_indptr, const Tensor& paged_kv_indptr, const Tensor& paged_kv_indices,
    const Tensor& paged_kv_last_page_len, int64_t num_qo_heads, int64_t num_kv_heads,
    int64_t head_dim_qk, int64_t page_size, const PrefillPlanOptions& o) {
  return call_op<&BatchPrefillWithPagedKVCacheWrapper::workspace_size>(
      [&] {
        detail::WrapperState t = api::sizing_state(*s_);
        plan_paged_prefill(t, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                           num_qo_heads, num_kv_heads, head_dim_qk, page_size, o,
                           "BatchPrefillWithPagedKVCacheWrapper.workspace_size");
        return api::plan_workspace_sizes(t);
      },
      *this, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
      num_kv_heads, head_dim_qk, page_size, o);
}

AttentionOutput BatchPrefillWithPagedKVCacheWrapper::run(const Tensor& q,
                                                         const PagedKVCache& paged_kv_cache,
                                                         const AttentionRunOptions& o) {
  return call_op<&BatchPrefillWithPagedKVCacheWrapper::run>(
      [&] {
        const char* op = "BatchPrefillWithPagedKVCacheWrapper.run";
        FLASHINFER_CHECK(s_->planned, op, "self", "run() called before plan()");
        auto [k, v] = api::paged_cache_views(paged_kv_cache, s_->hnd, op, "paged_kv_cache");
        return api::run_planned(*s_, q, k, v, o, op, "paged_kv_cache", "paged_kv_cache");
      },
      *this, q, paged_kv_cache, o);
}

// ---- BatchPrefillWithRaggedKVCacheWrapper ----------------------------------------------------

BatchPrefillWithRaggedKVCacheWrapper::BatchPrefillWithRaggedKVCacheWrapper(
    Tensor float_workspace_buffer, std::string kv_layout, bool use_cuda_graph,
    std::optional<Tensor> qo_indptr_buf, std::optional<Tensor> kv_indptr_buf,
    std::optional<Tensor> custom_mask_buf, std::optional<Tensor> mask_indptr_buf,
    std::string backend, std::optional<Value> jit_args, std::optional<Value> jit_kwargs,
    bool variant_owns_mask)
    : s_(std::make_unique<detail::WrapperState>()) {
  call_init<RaggedInit>(
      [&] {
        const char* op = "BatchPrefillWithRaggedKVCacheWrapper.__init__";
        check_variant_owns_mask(variant_owns_mask, op);
        // Upstream's AttentionSink variant (its sink tests): run takes (sink, sm_scale) through
        // *args. Upstream resolves backend "auto" before the JIT build.
        const bool sink = api::attention_sink_variant(jit_args, jit_kwargs, op);
        FLASHINFER_CHECK_CODE(sink || !jit_kwargs || jit_kwargs->is_none(), ErrorCode::kUnsupported,
                              op, "jit_kwargs",
                              "JIT variants other than AttentionSink are not "
                              "supported");
        api::init_wrapper(*s_, float_workspace_buffer, kv_layout, use_cuda_graph, backend,
                          std::nullopt, op, /*fa3=*/true);
        s_->sink_variant = sink;
        api::set_graph_buffers(*s_, std::nullopt, custom_mask_buf);
      },
      *this, float_workspace_buffer, kv_layout, use_cuda_graph, qo_indptr_buf, kv_indptr_buf,
      custom_mask_buf, mask_indptr_buf, backend, jit_args, jit_kwargs, variant_owns_mask);
}

BatchPrefillWithRaggedKVCacheWrapper::~BatchPrefillWithRaggedKVCacheWrapper() = default;

bool BatchPrefillWithRaggedKVCacheWrapper::split_kv() const { return s_->plan.split_kv; }

void BatchPrefillWithRaggedKVCacheWrapper::plan(const Tensor& qo_indptr, const Tensor& kv_indptr,
                                                int64_t num_qo_heads, int64_t num_kv_heads,
                                                int64_t head_dim_qk, const PrefillPlanOptions& o) {
  call_op<&BatchPrefillWithRaggedKVCacheWrapper::plan>(
      [&] {
        const char* op = "BatchPrefillWithRaggedKVCacheWrapper.plan";
        detail::WrapperState& s = *s_;
        s.planned = false;
        check_prefill_options(o, /*paged=*/false, op);
        api::plan_settings(s, num_qo_heads, num_kv_heads, head_dim_qk,
                           o.head_dim_vo.value_or(head_dim_qk), o.q_data_type, o.kv_data_type,
                           o.o_data_type, o.sm_scale, o.window_left, o.logits_soft_cap, "NONE", op);
        s.decode = false;
        api::plan_pos_encoding(s, o.pos_encoding_mode, o.rope_scale, o.rope_theta, op);
        s.kv_indptr = api::index_to_host(
            indptr_or_mirror(kv_indptr, o.kv_indptr_cpu, op, "kv_indptr_cpu"), op, "kv_indptr");
        api::check_indptr(s.kv_indptr, op, "kv_indptr");
        s.kv_indices.clear();
        s.max_page_id = -1;
        s.kv_lens.resize(s.kv_indptr.size() - 1);
        for (std::size_t b = 0; b + 1 < s.kv_indptr.size(); ++b) {
          s.kv_lens[b] = s.kv_indptr[b + 1] - s.kv_indptr[b];
        }
        s.total_kv = s.kv_indptr.back();
        s.paged = false;
        s.page_size = 1;
        s.decode = false;
        s.causal = o.causal && !o.custom_mask && !o.packed_custom_mask;
        prefill_load_qo(s, indptr_or_mirror(qo_indptr, o.qo_indptr_cpu, op, "qo_indptr_cpu"), op);
        api::load_custom_mask(s, o.custom_mask, o.packed_custom_mask, op);
        api::load_multi_item_mask(s, o.prefix_len_ptr, o.token_pos_in_items_ptr,
                                  o.token_pos_in_items_len, o.max_item_len_ptr, op);
        api::build_plan(s, o.fixed_split_size, o.disable_split_kv, op);
      },
      *this, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, o);
}

AttentionOutput BatchPrefillWithRaggedKVCacheWrapper::run(const Tensor& q, const Tensor& k,
                                                          const Tensor& v,
                                                          const AttentionRunOptions& o) {
  return call_op<&BatchPrefillWithRaggedKVCacheWrapper::run>(
      [&] {
        const char* op = "BatchPrefillWithRaggedKVCacheWrapper.run";
        FLASHINFER_CHECK(s_->planned, op, "self", "run() called before plan()");
        api::check_defined(k, op, "k");
        api::check_defined(v, op, "v");
        api::check_dim(k, {3}, op, "k");
        api::check_dim(v, {3}, op, "v");
        const Tensor kn = s_->hnd ? k.transpose(0, 1) : k;
        const Tensor vn = s_->hnd ? v.transpose(0, 1) : v;
        // Upstream 0.7.4's ragged run applies k_scale / v_scale only where its fa2 / fa3 kernels
        // read unscaled fp8 K/V under a 16-bit q (or with kv_cache_sf), and q_scale only with
        // kv_cache_sf: with 16-bit K/V all three have no effect.
        AttentionRunOptions ro = o;
        const bool sf = o.kv_cache_sf.has_value();
        if (!sf) ro.q_scale.reset();
        if (!sf && !(dtype_is_fp8(k.dtype()) && !dtype_is_fp8(q.dtype()))) {
          ro.k_scale.reset();
          ro.v_scale.reset();
        }
        return api::run_planned(*s_, q, kn, vn, ro, op, "k", "v");
      },
      *this, q, k, v, o);
}

namespace {

// Bench hooks: batch_size requests of s_qo queries against s_kv keys each (causal: the queries
// are the last s_qo positions). FLOPs and bytes are upstream's (bench_support.h); multi-item
// scoring (BenchShape::prefix_len >= 0) counts the pairs its mask leaves visible.
constexpr const char* kBenchOp = "bench";

// Multi-item scoring's token_pos_in_items for one request of the bench's prompts: a prefix of
// prefix_len tokens, then items of item_len tokens each after a delimiter (0, 1 .. item_len, 0,
// ...), cut where the s_kv tokens end.
std::vector<int64_t> bench_item_positions(const BenchShape& s) {
  FLASHINFER_CHECK(s.causal && s.s_qo == s.s_kv, kBenchOp, "prefix_len",
                   "multi-item scoring prompts are causal with s_qo == s_kv, got s_qo ", s.s_qo,
                   ", s_kv ", s.s_kv, s.causal ? "" : " and no --causal");
  FLASHINFER_CHECK(s.prefix_len < s.s_kv, kBenchOp, "prefix_len", "must be below s_kv (", s.s_kv,
                   "), got ", s.prefix_len);
  FLASHINFER_CHECK(s.item_len >= 1 && s.item_len < 32768, kBenchOp, "item_len",
                   "must be in [1, 32767] with --prefix_len, got ", s.item_len);
  std::vector<int64_t> pos(static_cast<std::size_t>(s.s_kv - s.prefix_len));
  for (std::size_t t = 0; t < pos.size(); ++t) {
    pos[t] = static_cast<int64_t>(t) % (s.item_len + 1);
  }
  return pos;
}

double bench_prefill_flops(const BenchShape& s) {
  if (s.prefix_len >= 0) {
    // A query in the prefix sees itself and the keys before it; one past it the prefix and the
    // keys of its own item up to itself (a delimiter: the prefix only).
    const auto pos = bench_item_positions(s);
    const double p = static_cast<double>(s.prefix_len);
    double pairs = p * (p + 1.0) / 2.0;
    for (int64_t t : pos) pairs += p + static_cast<double>(t);
    return 2.0 * pairs * static_cast<double>(s.batch_size) *
           static_cast<double>(s.num_qo_heads * (s.head_dim_qk + s.head_dim_vo));
  }
  return static_cast<double>(s.batch_size) *
         api::bench::attention_flops(s.s_qo, s.s_kv, s.num_qo_heads, s.head_dim_qk, s.head_dim_vo,
                                     s.causal);
}

PrefillPlanOptions bench_plan_options(const BenchShape& s) {
  PrefillPlanOptions o;
  o.head_dim_vo = s.head_dim_vo;
  o.causal = s.causal;
  o.q_data_type = s.q_dtype;
  o.kv_data_type = s.kv_dtype;
  if (s.prefix_len >= 0) {
    // Upstream's dtypes: uint32 prefix lengths and uint16 positions / maxima arrive here as
    // int32 / int16 bits (values below 2^15 here).
    const auto pos = bench_item_positions(s);
    std::vector<double> flat, prefix, longest;
    for (int64_t b = 0; b < s.batch_size; ++b) {
      flat.insert(flat.end(), pos.begin(), pos.end());
      prefix.push_back(static_cast<double>(s.prefix_len));
      longest.push_back(static_cast<double>(*std::max_element(pos.begin(), pos.end())));
    }
    o.prefix_len_ptr = Tensor::from_vector(prefix, {s.batch_size}, DType::kInt32);
    o.token_pos_in_items_ptr =
        Tensor::from_vector(flat, {static_cast<int64_t>(flat.size())}, DType::kInt16);
    o.token_pos_in_items_len = static_cast<int64_t>(pos.size());
    o.max_item_len_ptr = Tensor::from_vector(longest, {s.batch_size}, DType::kInt16);
  }
  return o;
}

Tensor bench_q(const BenchShape& s, Device dev, int64_t rows) {
  return api::bench::random_tensor({rows, s.num_qo_heads, s.head_dim_qk}, s.q_dtype, dev,
                                   s.random_seed);
}

Tensor bench_qo_indptr(const BenchShape& s, Device dev, int64_t per) {
  std::vector<int64_t> v;
  for (int64_t b = 0; b <= s.batch_size; ++b) v.push_back(b * per);
  return api::bench::int32_tensor(v, dev);
}

// `--backends cuda:fa2` / `cuda:fa3` / `cuda:auto` (upstream's benchmark names): the wrappers'
// `backend`; "auto" when none is named.
BenchCase bench_paged_prefill(const BenchShape& s, Device dev) {
  api::bench::BenchPages p = api::bench::bench_pages(s, dev);
  auto w = std::make_shared<BatchPrefillWithPagedKVCacheWrapper>(
      Tensor::empty({16 << 20}, DType::kUInt8, dev), "NHD", false, std::nullopt, std::nullopt,
      std::nullopt, std::nullopt, std::nullopt, std::nullopt, api::bench::op_backend("auto"));
  w->plan(bench_qo_indptr(s, dev, s.s_qo), p.indptr, p.indices, p.last_page_len, s.num_qo_heads,
          s.num_kv_heads, s.head_dim_qk, s.page_size, bench_plan_options(s));
  BenchCase c = api::bench::invoke_case(
      std::string(kPaged) + ".run",
      {api::bench::bench_object(w), Value(bench_q(s, dev, s.batch_size * s.s_qo)),
       Value::tuple({p.k, p.v})});
  c.flops = bench_prefill_flops(s);
  c.bytes = api::bench::bench_attention_bytes(s, s.batch_size * s.s_qo, s.batch_size * s.s_kv);
  return c;
}

BenchCase bench_ragged_prefill(const BenchShape& s, Device dev) {
  auto w = std::make_shared<BatchPrefillWithRaggedKVCacheWrapper>(
      Tensor::empty({16 << 20}, DType::kUInt8, dev), "NHD", false, std::nullopt, std::nullopt,
      std::nullopt, std::nullopt, api::bench::op_backend("auto"));
  w->plan(bench_qo_indptr(s, dev, s.s_qo), bench_qo_indptr(s, dev, s.s_kv), s.num_qo_heads,
          s.num_kv_heads, s.head_dim_qk, bench_plan_options(s));
  const int64_t kv_rows = s.batch_size * s.s_kv;
  BenchCase c = api::bench::invoke_case(
      std::string(kRagged) + ".run",
      {api::bench::bench_object(w), Value(bench_q(s, dev, s.batch_size * s.s_qo)),
       Value(api::bench::random_tensor({kv_rows, s.num_kv_heads, s.head_dim_qk}, s.kv_dtype, dev,
                                       s.random_seed + 1)),
       Value(api::bench::random_tensor({kv_rows, s.num_kv_heads, s.head_dim_vo}, s.kv_dtype, dev,
                                       s.random_seed + 2))});
  c.flops = bench_prefill_flops(s);
  c.bytes = api::bench::bench_attention_bytes(s, s.batch_size * s.s_qo, kv_rows);
  return c;
}

// single_prefill_with_kv_cache: one request (batch_size is ignored).
BenchCase bench_single_prefill(const BenchShape& s, Device dev) {
  BenchCase c = api::bench::invoke_case(
      "single_prefill_with_kv_cache",
      {Value(bench_q(s, dev, s.s_qo)),
       Value(api::bench::random_tensor({s.s_kv, s.num_kv_heads, s.head_dim_qk}, s.kv_dtype, dev,
                                       s.random_seed + 1)),
       Value(api::bench::random_tensor({s.s_kv, s.num_kv_heads, s.head_dim_vo}, s.kv_dtype, dev,
                                       s.random_seed + 2))},
      {{"causal", Value(s.causal)}});
  c.flops = api::bench::attention_flops(s.s_qo, s.s_kv, s.num_qo_heads, s.head_dim_qk,
                                        s.head_dim_vo, s.causal);
  c.bytes = api::bench::bench_attention_bytes(s, s.s_qo, s.s_kv);
  return c;
}

// The standard fa2 module single_prefill_with_kv_cache runs for the shape, causal by mask_mode.
BenchCase bench_single_prefill_jit(const BenchShape& s, Device dev) {
  const auto module =
      gen_single_prefill_module("fa2", s.q_dtype, s.kv_dtype, s.q_dtype, s.head_dim_qk,
                                s.head_dim_vo, 0, false, false, false)
          .build_and_load();
  BenchCase c = api::bench::invoke_case(
      "single_prefill_with_kv_cache_with_jit_module",
      {to_value(module), Value(bench_q(s, dev, s.s_qo)),
       Value(api::bench::random_tensor({s.s_kv, s.num_kv_heads, s.head_dim_qk}, s.kv_dtype, dev,
                                       s.random_seed + 1)),
       Value(api::bench::random_tensor({s.s_kv, s.num_kv_heads, s.head_dim_vo}, s.kv_dtype, dev,
                                       s.random_seed + 2)),
       Value(), Value(), Value(), Value(), Value(0.0),
       Value(1.0 / std::sqrt(static_cast<double>(s.head_dim_qk))), Value(1.0), Value(1e-4)},
      {{"mask_mode", Value(int64_t{s.causal ? 1 : 0})}});
  c.flops = api::bench::attention_flops(s.s_qo, s.s_kv, s.num_qo_heads, s.head_dim_qk,
                                        s.head_dim_vo, s.causal);
  c.bytes = api::bench::bench_attention_bytes(s, s.s_qo, s.s_kv);
  return c;
}

}  // namespace

namespace detail {
void register_prefill_ops(OpRegistry& r) {
  api::register_paged_ids_at_run("BatchPrefillWithPagedKVCacheWrapper.run");
  declare<&single_prefill_with_kv_cache>(
      r,
      {.name = "single_prefill_with_kv_cache",
       .module = kPrefillModule,
       .summary = "Prefill attention of one request's queries against its KV"},
      "q", "k", "v", "scale_q", "scale_k", "scale_v", "o_dtype", "custom_mask",
      "packed_custom_mask", arg("causal", false), arg("kv_layout", "NHD"),
      arg("pos_encoding_mode", "NONE"), arg("use_fp16_qk_reduction", false), "sm_scale",
      arg("window_left", -1), "logits_soft_cap", "rope_scale", "rope_theta", arg("backend", "auto"),
      arg("return_lse", false), "kv_cache_sf", "k_scale", "v_scale");
  declare_init<PagedInit>(
      r,
      {.name = "BatchPrefillWithPagedKVCacheWrapper.__init__",
       .module = kPrefillModule,
       .summary = "Batch prefill attention over a paged KV cache (plan once, run per layer)"},
      "float_workspace_buffer", arg("kv_layout", "NHD"), arg("use_cuda_graph", false),
      "qo_indptr_buf", "paged_kv_indptr_buf", "paged_kv_indices_buf", "paged_kv_last_page_len_buf",
      "custom_mask_buf", "mask_indptr_buf", arg("backend", "auto"),
      arg("jit_args").as(ParamKind::kList), "jit_kwargs", arg("variant_owns_mask", false),
      "max_total_num_rows");
  declare_init<RaggedInit>(
      r,
      {.name = "BatchPrefillWithRaggedKVCacheWrapper.__init__",
       .module = kPrefillModule,
       .summary = "Batch prefill attention over ragged K/V (plan once, run per layer)"},
      "float_workspace_buffer", arg("kv_layout", "NHD"), arg("use_cuda_graph", false),
      "qo_indptr_buf", "kv_indptr_buf", "custom_mask_buf", "mask_indptr_buf",
      arg("backend", "auto"), arg("jit_args").as(ParamKind::kList), "jit_kwargs",
      arg("variant_owns_mask", false));
  // Upstream's prefill plans take these as positional-or-keyword parameters with defaults, in
  // this order (the two wrappers differ).
  declare<&BatchPrefillWithPagedKVCacheWrapper::plan>(
      r,
      {.name = "BatchPrefillWithPagedKVCacheWrapper.plan",
       .module = kPrefillModule,
       .summary = "Validates the batch layout and builds the prefill work partition",
       .options_keyword_only = false},
      "qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "num_qo_heads",
      "num_kv_heads", "head_dim_qk", "page_size",
      // clang-format off
      OnlyFields{"head_dim_vo", "custom_mask", "packed_custom_mask", "causal", "pos_encoding_mode",
                 "use_fp16_qk_reduction", "sm_scale", "window_left", "logits_soft_cap",
                 "rope_scale", "rope_theta", "q_data_type", "kv_data_type", "o_data_type",
                 "non_blocking", "prefix_len_ptr", "token_pos_in_items_ptr",
                 "token_pos_in_items_len", "max_item_len_ptr", "seq_lens", "seq_lens_q",
                 "block_tables", "max_token_per_sequence", "max_sequence_kv", "fixed_split_size",
                 "disable_split_kv", "uniform_q_len", "use_token_head_sf"},
      // clang-format on
      field("q_data_type", "float16"));
  declare<&BatchPrefillWithPagedKVCacheWrapper::workspace_size>(
      r,
      {.name = "BatchPrefillWithPagedKVCacheWrapper.workspace_size",
       .module = kPrefillModule,
       .summary = "The (float, int) workspace bytes plan() would need",
       .options_keyword_only = false},
      "qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "num_qo_heads",
      "num_kv_heads", "head_dim_qk", "page_size",
      // clang-format off
      OnlyFields{"head_dim_vo", "custom_mask", "packed_custom_mask", "causal", "pos_encoding_mode",
                 "use_fp16_qk_reduction", "sm_scale", "window_left", "logits_soft_cap",
                 "rope_scale", "rope_theta", "q_data_type", "kv_data_type", "o_data_type",
                 "prefix_len_ptr", "token_pos_in_items_ptr", "token_pos_in_items_len",
                 "max_item_len_ptr", "seq_lens", "seq_lens_q", "block_tables",
                 "max_token_per_sequence", "max_sequence_kv", "fixed_split_size",
                 "disable_split_kv", "uniform_q_len"},
      // clang-format on
      field("q_data_type", "float16"));
  api::register_attention_backends("BatchPrefillWithPagedKVCacheWrapper.workspace_size");
  declare<&BatchPrefillWithRaggedKVCacheWrapper::plan>(
      r,
      {.name = "BatchPrefillWithRaggedKVCacheWrapper.plan",
       .module = kPrefillModule,
       .summary = "Validates the batch layout and builds the prefill work partition",
       .options_keyword_only = false},
      "qo_indptr", "kv_indptr", "num_qo_heads", "num_kv_heads", "head_dim_qk",
      // clang-format off
      OnlyFields{"head_dim_vo", "custom_mask", "packed_custom_mask", "causal", "pos_encoding_mode",
                 "use_fp16_qk_reduction", "window_left", "logits_soft_cap", "sm_scale",
                 "rope_scale", "rope_theta", "q_data_type", "kv_data_type", "o_data_type",
                 "non_blocking", "prefix_len_ptr", "token_pos_in_items_ptr",
                 "token_pos_in_items_len", "max_item_len_ptr", "fixed_split_size",
                 "disable_split_kv", "seq_lens", "seq_lens_q", "max_token_per_sequence",
                 "max_sequence_kv", "v_indptr", "o_indptr", "qo_indptr_cpu", "kv_indptr_cpu",
                 "uniform_q_len", "use_token_head_sf"},
      // clang-format on
      field("q_data_type", "float16"));
  declare<&BatchPrefillWithPagedKVCacheWrapper::run>(
      r,
      {.name = "BatchPrefillWithPagedKVCacheWrapper.run",
       .module = kPrefillModule,
       .summary = "Batch prefill attention over the paged cache with the current plan",
       .var_positional = "args"},
      "q", "paged_kv_cache",
      // clang-format off
      OnlyFields{"q_scale", "k_scale", "v_scale", "out", "lse", "return_lse", "lse_base",
                 "lse_layout", "enable_pdl", "window_left", "sinks", "kv_cache_sf",
                 "skip_softmax_threshold_scale_factor",
                 "use_fp16_softmax", "uses_spcompress", "args"},
      // clang-format on
      field("out").mut(), field("lse").mut());
  declare<&BatchPrefillWithRaggedKVCacheWrapper::run>(
      r,
      {.name = "BatchPrefillWithRaggedKVCacheWrapper.run",
       .module = kPrefillModule,
       .summary = "Batch prefill attention over ragged K/V with the current plan",
       .var_positional = "args"},
      "q", "k", "v",
      // clang-format off
      OnlyFields{"q_scale", "k_scale", "v_scale", "o_scale", "out", "lse", "return_lse",
                 "lse_base", "lse_layout", "enable_pdl", "kv_cache_sf", "args"},
      // clang-format on
      field("out").mut(), field("lse").mut());
  // A wrapper's __init__ and plan belong to the kernel its run launches.
  api::register_attention_backends("BatchPrefillWithPagedKVCacheWrapper.__init__");
  api::register_attention_backends("BatchPrefillWithPagedKVCacheWrapper.plan");
  api::register_attention_backends("BatchPrefillWithRaggedKVCacheWrapper.__init__");
  api::register_attention_backends("BatchPrefillWithRaggedKVCacheWrapper.plan");
  api::register_attention_backends("single_prefill_with_kv_cache");
  declare<&single_prefill_with_kv_cache_with_jit_module>(
      r,
      {.name = "single_prefill_with_kv_cache_with_jit_module",
       .module = kPrefillModule,
       .summary = "Prefill attention of one request through a compiled module's raw run",
       .var_positional = "args"},
      "jit_module", "q", "k", "v", arg("args", Value::tuple({})).kw(), arg("kv_layout", "NHD").kw(),
      arg("mask_mode", int64_t{0}).kw(), arg("window_left", -1).kw(),
      arg("return_lse", false).kw());
  api::register_attention_backends("single_prefill_with_kv_cache_with_jit_module");
  api::register_attention_backends("BatchPrefillWithPagedKVCacheWrapper.run");
  api::register_attention_backends("BatchPrefillWithRaggedKVCacheWrapper.run");
  register_bench_hook("single_prefill_with_kv_cache", bench_single_prefill);
  register_bench_hook("single_prefill_with_kv_cache_with_jit_module", bench_single_prefill_jit);
  register_bench_hook("BatchPrefillWithPagedKVCacheWrapper.run", bench_paged_prefill);
  register_bench_hook("BatchPrefillWithRaggedKVCacheWrapper.run", bench_ragged_prefill);
}
}  // namespace detail

}  // namespace flashinfer
