// POD attention (flashinfer.pod): PODWithPagedKVCacheWrapper and BatchPODWithPagedKVCacheWrapper
// on the batch-attention plan/run path (attention_common.h) and single_prefill_with_kv_cache;
// errors name these classes' ops and arguments.
#include "flashinfer/ops/pod.h"

#include <cmath>

#include "api/arg_traits.h"
#include "api/attention_common.h"
#include "api/attention_pos_encoding.h"
#include "api/bench_support.h"
#include "api/checks.h"

namespace flashinfer {

Value to_value(const PodOutput& r) {
  Value outs = Value::tuple({Value(r.out_p), Value(r.out_d)});
  if (!r.lse_p.defined()) return outs;
  return Value::tuple({outs, Value::tuple({Value(r.lse_p), Value(r.lse_d)})});
}

namespace {

constexpr const char* kPodModule = "flashinfer.pod";

using PodInit = Init<PODWithPagedKVCacheWrapper, Tensor, std::string, bool, std::optional<Tensor>,
                     std::optional<Tensor>, std::optional<Tensor>, std::optional<Value>>;
using BatchPodInit = Init<BatchPODWithPagedKVCacheWrapper, Tensor, std::string>;

// Upstream's dtype rule: data_type fills q_data_type when it is None and kv_data_type when it
// is None; kv_data_type then defaults to q_data_type.
std::pair<DType, DType> plan_dtypes(std::optional<DType> q, std::optional<DType> kv,
                                    std::optional<DType> data_type, const char* op) {
  if (!q) q = data_type;
  if (!kv) kv = data_type;
  FLASHINFER_CHECK(q.has_value(), op, "q_data_type", "is None and so is data_type");
  return {*q, kv.value_or(*q)};
}

// One part's plan: the page table, qo_indptr (or one query per request when null), no causal
// mask (run() sets it), no split-KV limit beyond the workspace.
void plan_part(detail::WrapperState& s, const Tensor* qo_indptr, const Tensor& indptr,
               const Tensor& indices, const Tensor& last, int64_t num_qo_heads,
               int64_t num_kv_heads, int64_t head_dim, int64_t page_size,
               std::string_view pos_encoding_mode, int64_t window_left, DType q, DType kv,
               std::optional<double> sm_scale, std::optional<double> rope_scale,
               std::optional<double> rope_theta, const char* op, const char* qo_arg,
               const char* indptr_arg, const char* indices_arg, const char* last_arg) {
  s.planned = false;
  api::check_head_dim(head_dim, op, "head_dim");
  api::plan_settings(s, num_qo_heads, num_kv_heads, head_dim, head_dim, q, kv, std::nullopt,
                     sm_scale, window_left, std::nullopt, "NONE", op);
  s.decode = qo_indptr == nullptr;
  // Upstream runs POD's decode part with plan's pos_encoding_mode, rope_scale and rope_theta
  // inside its prefill kernel (pod.py run: pos_encoding_mode_d = self._pos_encoding_mode), so
  // RoPE follows the prefill kernel's rules (16-bit rotated rows, no fp8 K).
  if (pos_encoding_mode != "NONE") s.use_tensor_cores = true;
  api::plan_pos_encoding(s, pos_encoding_mode, rope_scale, rope_theta, op);
  api::load_page_table(s, indptr, indices, last, page_size, op, indptr_arg, indices_arg, last_arg);
  s.batch = static_cast<int32_t>(s.kv_lens.size());
  s.causal = false;
  if (qo_indptr != nullptr) {
    s.qo_indptr = api::index_to_host(*qo_indptr, op, qo_arg, s.batch + 1);
    api::check_indptr(s.qo_indptr, op, qo_arg);
  } else {
    s.q_len_per_req = 1;
    s.qo_indptr.resize(static_cast<std::size_t>(s.batch) + 1);
    for (int32_t b = 0; b <= s.batch; ++b) s.qo_indptr[b] = b;
  }
  s.total_qo = s.qo_indptr.back();
  api::build_plan(s, std::nullopt, false, op);
}

// Runs a part with its q argument named: run_planned names "q", "out", "lse".
AttentionOutput run_part(const detail::WrapperState& s, const Tensor& q, const PagedKVCache& cache,
                         const AttentionRunOptions& o, const char* op, const char* q_arg,
                         const char* cache_arg) {
  auto [k, v] = api::paged_cache_views(cache, s.hnd, op, cache_arg);
  try {
    return api::run_planned(s, q, k, v, o, op, cache_arg, cache_arg);
  } catch (const Error& e) {
    if (e.arg() != "q") throw;
    throw Error(e.code(), e.op(), q_arg, e.detail(), e.file(), e.line());
  }
}

}  // namespace

// ---- PODWithPagedKVCacheWrapper --------------------------------------------------------------

PODWithPagedKVCacheWrapper::PODWithPagedKVCacheWrapper(
    Tensor float_workspace_buffer, std::string kv_layout, bool use_cuda_graph,
    std::optional<Tensor> paged_kv_indptr_buffer, std::optional<Tensor> paged_kv_indices_buffer,
    std::optional<Tensor> paged_kv_last_page_len_buffer, std::optional<Value> jit_args)
    : s_(std::make_unique<detail::WrapperState>()) {
  call_init<PodInit>(
      [&] {
        api::init_wrapper(*s_, float_workspace_buffer, kv_layout, use_cuda_graph, "auto", jit_args,
                          "PODWithPagedKVCacheWrapper.__init__");
        api::set_graph_buffers(*s_, paged_kv_indices_buffer, std::nullopt);
      },
      *this, float_workspace_buffer, kv_layout, use_cuda_graph, paged_kv_indptr_buffer,
      paged_kv_indices_buffer, paged_kv_last_page_len_buffer, jit_args);
}

PODWithPagedKVCacheWrapper::~PODWithPagedKVCacheWrapper() = default;

void PODWithPagedKVCacheWrapper::plan(
    const Tensor& indptr, const Tensor& indices, const Tensor& last_page_len, int64_t num_qo_heads,
    int64_t num_kv_heads, int64_t head_dim, int64_t page_size, std::string_view pos_encoding_mode,
    int64_t window_left, std::optional<DType> q_data_type, std::optional<DType> kv_data_type,
    std::optional<DType> data_type, std::optional<double> sm_scale,
    std::optional<double> rope_scale, std::optional<double> rope_theta, bool non_blocking) {
  call_op<&PODWithPagedKVCacheWrapper::plan>(
      [&] {
        const char* op = "PODWithPagedKVCacheWrapper.plan";
        const auto [q, kv] = plan_dtypes(q_data_type, kv_data_type, data_type, op);
        plan_part(*s_, nullptr, indptr, indices, last_page_len, num_qo_heads, num_kv_heads,
                  head_dim, page_size, pos_encoding_mode, window_left, q, kv, sm_scale, rope_scale,
                  rope_theta, op, "", "indptr", "indices", "last_page_len");
      },
      *this, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
      pos_encoding_mode, window_left, q_data_type, kv_data_type, data_type, sm_scale, rope_scale,
      rope_theta, non_blocking);
}

PodOutput PODWithPagedKVCacheWrapper::run(
    const Tensor& q_p, const Tensor& k_p, const Tensor& v_p, const Tensor& q_d,
    const PagedKVCache& paged_kv_cache_d, std::optional<Tensor> custom_mask_p,
    std::optional<Tensor> packed_custom_mask_p, bool causal_p, std::string_view kv_layout_p,
    std::string_view pos_encoding_mode_p, std::optional<double> sm_scale_p, int64_t window_left_p,
    std::optional<double> rope_scale_p, std::optional<double> rope_theta_p, bool return_lse_p,
    std::optional<Tensor> custom_mask_d, std::optional<Tensor> packed_custom_mask_d, bool causal_d,
    std::string_view kv_layout_d, std::string_view pos_encoding_mode_d,
    std::optional<double> sm_scale_d, int64_t window_left_d, std::optional<double> rope_scale_d,
    std::optional<double> rope_theta_d, std::optional<double> q_scale,
    std::optional<double> k_scale, std::optional<double> v_scale, bool return_lse_d,
    bool use_fp16_qk_reduction, std::optional<bool> enable_pdl) {
  return call_op<&PODWithPagedKVCacheWrapper::run>(
      [&] {
        const char* op = "PODWithPagedKVCacheWrapper.run";
        FLASHINFER_CHECK(s_->planned, op, "self", "run() called before plan()");
        // Decode first (its checks name q_d / paged_kv_cache_d), then the prefill request.
        AttentionRunOptions o;
        o.q_scale = q_scale;
        o.k_scale = k_scale;
        o.v_scale = v_scale;
        o.enable_pdl = enable_pdl;
        PodOutput r;
        r.out_d = run_part(*s_, q_d, paged_kv_cache_d, o, op, "q_d", "paged_kv_cache_d");
        try {
          r.out_p = single_prefill_with_kv_cache(
                        q_p, k_p, v_p, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                        custom_mask_p, packed_custom_mask_p, causal_p, kv_layout_p,
                        pos_encoding_mode_p, use_fp16_qk_reduction, sm_scale_p, window_left_p,
                        std::nullopt, rope_scale_p, rope_theta_p)
                        .out;
        } catch (const Error& e) {
          // single_prefill's argument names, as this op's prefill arguments.
          std::string arg = e.arg();
          if (arg == "q" || arg == "k" || arg == "v" || arg == "custom_mask" ||
              arg == "packed_custom_mask" || arg == "causal" || arg == "kv_layout" ||
              arg == "pos_encoding_mode" || arg == "sm_scale" || arg == "window_left") {
            arg += "_p";
          }
          throw Error(e.code(), op, arg, e.detail(), e.file(), e.line());
        }
        // Upstream reads none of these (the decode part follows plan()); they are recorded.
        (void)custom_mask_d, (void)packed_custom_mask_d, (void)causal_d, (void)kv_layout_d;
        (void)pos_encoding_mode_d, (void)sm_scale_d, (void)window_left_d, (void)rope_scale_d;
        (void)rope_theta_d, (void)return_lse_p, (void)return_lse_d;
        return r;
      },
      *this, q_p, k_p, v_p, q_d, paged_kv_cache_d, custom_mask_p, packed_custom_mask_p, causal_p,
      kv_layout_p, pos_encoding_mode_p, sm_scale_p, window_left_p, rope_scale_p, rope_theta_p,
      return_lse_p, custom_mask_d, packed_custom_mask_d, causal_d, kv_layout_d, pos_encoding_mode_d,
      sm_scale_d, window_left_d, rope_scale_d, rope_theta_d, q_scale, k_scale, v_scale,
      return_lse_d, use_fp16_qk_reduction, enable_pdl);
}

// ---- BatchPODWithPagedKVCacheWrapper ---------------------------------------------------------

BatchPODWithPagedKVCacheWrapper::BatchPODWithPagedKVCacheWrapper(Tensor float_workspace_buffer,
                                                                 std::string kv_layout)
    : p_(std::make_unique<detail::WrapperState>()), d_(std::make_unique<detail::WrapperState>()) {
  call_init<BatchPodInit>(
      [&] {
        const char* op = "BatchPODWithPagedKVCacheWrapper.__init__";
        api::init_wrapper(*p_, float_workspace_buffer, kv_layout, false, "auto", std::nullopt, op);
        // Split below along dim 0 (upstream slices it too: a 0-D tensor cannot be split there).
        FLASHINFER_CHECK(float_workspace_buffer.dim() >= 1, op, "float_workspace_buffer",
                         "must have at least one dimension to split, got a 0-D tensor");
        // Upstream splits the buffer in two halves, one per part.
        // 16-byte aligned halves (split-KV partials are fp32 arrays).
        const int64_t half = float_workspace_buffer.numel() / 2 / 16 * 16;
        p_->float_workspace = float_workspace_buffer.slice(0, 0, half);
        api::init_wrapper(*d_, float_workspace_buffer, kv_layout, false, "auto", std::nullopt, op);
        d_->float_workspace = float_workspace_buffer.slice(0, half, 2 * half);
      },
      *this, float_workspace_buffer, kv_layout);
}

BatchPODWithPagedKVCacheWrapper::~BatchPODWithPagedKVCacheWrapper() = default;

void BatchPODWithPagedKVCacheWrapper::plan(
    const Tensor& qo_indptr_p, const Tensor& kv_indptr_p, const Tensor& kv_indices_p,
    const Tensor& last_page_len_p, const Tensor& qo_indptr_d, const Tensor& kv_indptr_d,
    const Tensor& kv_indices_d, const Tensor& last_page_len_d, int64_t num_qo_heads,
    int64_t num_kv_heads, int64_t head_dim, int64_t page_size, std::string_view pos_encoding_mode,
    int64_t window_left, std::optional<DType> q_data_type, std::optional<DType> kv_data_type,
    std::optional<DType> data_type, std::optional<double> sm_scale,
    std::optional<double> rope_scale, std::optional<double> rope_theta, bool non_blocking) {
  call_op<&BatchPODWithPagedKVCacheWrapper::plan>(
      [&] {
        const char* op = "BatchPODWithPagedKVCacheWrapper.plan";
        const auto [q, kv] = plan_dtypes(q_data_type, kv_data_type, data_type, op);
        d_->planned = false;
        plan_part(*p_, &qo_indptr_p, kv_indptr_p, kv_indices_p, last_page_len_p, num_qo_heads,
                  num_kv_heads, head_dim, page_size, pos_encoding_mode, window_left, q, kv,
                  sm_scale, rope_scale, rope_theta, op, "qo_indptr_p", "kv_indptr_p",
                  "kv_indices_p", "last_page_len_p");
        plan_part(*d_, &qo_indptr_d, kv_indptr_d, kv_indices_d, last_page_len_d, num_qo_heads,
                  num_kv_heads, head_dim, page_size, pos_encoding_mode, window_left, q, kv,
                  sm_scale, rope_scale, rope_theta, op, "qo_indptr_d", "kv_indptr_d",
                  "kv_indices_d", "last_page_len_d");
      },
      *this, qo_indptr_p, kv_indptr_p, kv_indices_p, last_page_len_p, qo_indptr_d, kv_indptr_d,
      kv_indices_d, last_page_len_d, num_qo_heads, num_kv_heads, head_dim, page_size,
      pos_encoding_mode, window_left, q_data_type, kv_data_type, data_type, sm_scale, rope_scale,
      rope_theta, non_blocking);
}

PodOutput BatchPODWithPagedKVCacheWrapper::run(
    const Tensor& q_p, const PagedKVCache& paged_kv_cache_p, const Tensor& q_d,
    const PagedKVCache& paged_kv_cache_d, std::optional<Tensor> custom_mask_p,
    std::optional<Tensor> packed_custom_mask_p, bool causal_p, std::optional<double> q_scale,
    std::optional<double> k_scale, std::optional<double> v_scale, bool return_lse,
    bool use_fp16_qk_reduction, std::optional<bool> enable_pdl) {
  return call_op<&BatchPODWithPagedKVCacheWrapper::run>(
      [&] {
        const char* op = "BatchPODWithPagedKVCacheWrapper.run";
        FLASHINFER_CHECK(p_->planned && d_->planned, op, "self", "run() called before plan()");
        FLASHINFER_CHECK_CODE(!custom_mask_p, ErrorCode::kUnsupported, op, "custom_mask_p",
                              "custom masks of a batch need a per-request index upstream lacks");
        FLASHINFER_CHECK_CODE(!packed_custom_mask_p, ErrorCode::kUnsupported, op,
                              "packed_custom_mask_p",
                              "custom masks of a batch need a per-request index upstream lacks");
        detail::WrapperState& p = *p_;
        p.causal = false;
        for (int32_t b = 0; causal_p && b < p.batch; ++b) {
          const int32_t qo_len = p.qo_indptr[b + 1] - p.qo_indptr[b];
          FLASHINFER_CHECK(p.kv_lens[b] >= qo_len, op, "causal_p", "prefill request ", b,
                           " has qo_len ", qo_len, " > kv_len ", p.kv_lens[b],
                           " (causal masks are right-aligned and need kv_len >= qo_len)");
        }
        p.causal = causal_p;
        AttentionRunOptions po;
        po.return_lse = return_lse;
        po.enable_pdl = enable_pdl;
        AttentionRunOptions dop = po;
        dop.q_scale = q_scale;
        dop.k_scale = k_scale;
        dop.v_scale = v_scale;
        (void)use_fp16_qk_reduction;  // scores are always fp32
        AttentionOutput a = run_part(p, q_p, paged_kv_cache_p, po, op, "q_p", "paged_kv_cache_p");
        AttentionOutput b =
            run_part(*d_, q_d, paged_kv_cache_d, dop, op, "q_d", "paged_kv_cache_d");
        return PodOutput{a.out, b.out, a.lse, b.lse};
      },
      *this, q_p, paged_kv_cache_p, q_d, paged_kv_cache_d, custom_mask_p, packed_custom_mask_p,
      causal_p, q_scale, k_scale, v_scale, return_lse, use_fp16_qk_reduction, enable_pdl);
}

namespace {

// Bench hooks: batch_size prefill requests of s_qo queries against s_kv keys (causal with
// s.causal) and, for BatchPOD, batch_size decode requests of one query against s_kv keys; the
// single POD's prefill is one such request. One head_dim (head_dim_qk).
BenchCase bench_pod(const BenchShape& shape, Device dev, bool batch) {
  BenchShape s = shape;
  s.head_dim_vo = s.head_dim_qk;
  api::bench::BenchPages p = api::bench::bench_pages(s, dev);
  std::vector<int64_t> qo_p, qo_d;
  for (int64_t b = 0; b <= s.batch_size; ++b) {
    qo_p.push_back(b * s.s_qo);
    qo_d.push_back(b);
  }
  Tensor ws = Tensor::empty({32 << 20}, DType::kUInt8, dev);
  auto rnd = [&](Shape sh, DType dt, uint64_t k) {
    return Value(api::bench::random_tensor(std::move(sh), dt, dev, s.random_seed + k));
  };
  const int64_t rows_p = batch ? s.batch_size * s.s_qo : s.s_qo;
  BenchCase c;
  if (batch) {
    auto w = std::make_shared<BatchPODWithPagedKVCacheWrapper>(ws);
    w->plan(api::bench::int32_tensor(qo_p, dev), p.indptr, p.indices, p.last_page_len,
            api::bench::int32_tensor(qo_d, dev), p.indptr, p.indices, p.last_page_len,
            s.num_qo_heads, s.num_kv_heads, s.head_dim_qk, s.page_size, "NONE", -1, s.q_dtype,
            s.kv_dtype);
    c = api::bench::invoke_case(
        "BatchPODWithPagedKVCacheWrapper.run",
        {api::bench::bench_object(w), rnd({rows_p, s.num_qo_heads, s.head_dim_qk}, s.q_dtype, 0),
         Value::tuple({p.k, p.v}), rnd({s.batch_size, s.num_qo_heads, s.head_dim_qk}, s.q_dtype, 5),
         Value::tuple({p.k, p.v})},
        {{"causal_p", Value(s.causal)}});
  } else {
    auto w = std::make_shared<PODWithPagedKVCacheWrapper>(ws);
    w->plan(p.indptr, p.indices, p.last_page_len, s.num_qo_heads, s.num_kv_heads, s.head_dim_qk,
            s.page_size, "NONE", -1, s.q_dtype, s.kv_dtype);
    c = api::bench::invoke_case(
        "PODWithPagedKVCacheWrapper.run",
        {api::bench::bench_object(w), rnd({rows_p, s.num_qo_heads, s.head_dim_qk}, s.q_dtype, 0),
         rnd({s.s_kv, s.num_kv_heads, s.head_dim_qk}, s.kv_dtype, 3),
         rnd({s.s_kv, s.num_kv_heads, s.head_dim_qk}, s.kv_dtype, 4),
         rnd({s.batch_size, s.num_qo_heads, s.head_dim_qk}, s.q_dtype, 5),
         Value::tuple({p.k, p.v})},
        {{"causal_p", Value(s.causal)}});
  }
  const int64_t n_p = batch ? s.batch_size : 1;
  c.flops = static_cast<double>(n_p) * api::bench::attention_flops(s.s_qo, s.s_kv, s.num_qo_heads,
                                                                   s.head_dim_qk, s.head_dim_vo,
                                                                   s.causal) +
            static_cast<double>(s.batch_size) *
                api::bench::attention_flops(1, s.s_kv, s.num_qo_heads, s.head_dim_qk, s.head_dim_vo,
                                            false);
  c.bytes =
      api::bench::bench_attention_bytes(s, rows_p + s.batch_size, (n_p + s.batch_size) * s.s_kv);
  return c;
}

}  // namespace

namespace detail {
void register_pod_ops(OpRegistry& r) {
  declare_init<PodInit>(
      r,
      {.name = "PODWithPagedKVCacheWrapper.__init__",
       .module = kPodModule,
       .summary = "One prefill request and a decode batch in one call (POD attention)"},
      "float_workspace_buffer", arg("kv_layout", "NHD"), arg("use_cuda_graph", false),
      "paged_kv_indptr_buffer", "paged_kv_indices_buffer", "paged_kv_last_page_len_buffer",
      arg("jit_args").as(ParamKind::kList));
  declare<&PODWithPagedKVCacheWrapper::plan>(
      r,
      {.name = "PODWithPagedKVCacheWrapper.plan",
       .module = kPodModule,
       .summary = "Plans the decode batch"},
      "indptr", "indices", "last_page_len", "num_qo_heads", "num_kv_heads", "head_dim", "page_size",
      arg("pos_encoding_mode", "NONE"), arg("window_left", -1), arg("q_data_type", "float16"),
      "kv_data_type", "data_type", "sm_scale", "rope_scale", "rope_theta",
      arg("non_blocking", true));
  declare<&PODWithPagedKVCacheWrapper::run>(
      r,
      {.name = "PODWithPagedKVCacheWrapper.run",
       .module = kPodModule,
       .summary = "Prefill and decode attention; returns (out_p, out_d)",
       .var_positional = "args"},
      "q_p", "k_p", "v_p", "q_d", "paged_kv_cache_d", "custom_mask_p", "packed_custom_mask_p",
      arg("causal_p", false), arg("kv_layout_p", "NHD"), arg("pos_encoding_mode_p", "NONE"),
      "sm_scale_p", arg("window_left_p", -1), "rope_scale_p", "rope_theta_p",
      arg("return_lse_p", false), "custom_mask_d", "packed_custom_mask_d", arg("causal_d", false),
      arg("kv_layout_d", "NHD"), arg("pos_encoding_mode_d", "NONE"), "sm_scale_d",
      arg("window_left_d", -1), "rope_scale_d", "rope_theta_d", "q_scale", "k_scale", "v_scale",
      arg("return_lse_d", false), arg("use_fp16_qk_reduction", false), "enable_pdl");
  declare_init<BatchPodInit>(
      r,
      {.name = "BatchPODWithPagedKVCacheWrapper.__init__",
       .module = kPodModule,
       .summary = "A prefill batch and a decode batch in one call (POD attention)"},
      "float_workspace_buffer", arg("kv_layout", "NHD"));
  declare<&BatchPODWithPagedKVCacheWrapper::plan>(
      r,
      {.name = "BatchPODWithPagedKVCacheWrapper.plan",
       .module = kPodModule,
       .summary = "Plans the prefill and the decode batch"},
      "qo_indptr_p", "kv_indptr_p", "kv_indices_p", "last_page_len_p", "qo_indptr_d", "kv_indptr_d",
      "kv_indices_d", "last_page_len_d", "num_qo_heads", "num_kv_heads", "head_dim", "page_size",
      arg("pos_encoding_mode", "NONE"), arg("window_left", -1), arg("q_data_type", "float16"),
      "kv_data_type", "data_type", "sm_scale", "rope_scale", "rope_theta",
      arg("non_blocking", true));
  declare<&BatchPODWithPagedKVCacheWrapper::run>(
      r,
      {.name = "BatchPODWithPagedKVCacheWrapper.run",
       .module = kPodModule,
       .summary = "Prefill and decode attention; returns (out_p, out_d)"},
      "q_p", "paged_kv_cache_p", "q_d", "paged_kv_cache_d", "custom_mask_p", "packed_custom_mask_p",
      arg("causal_p", false), "q_scale", "k_scale", "v_scale", arg("return_lse", false),
      arg("use_fp16_qk_reduction", false), "enable_pdl");
  for (const char* name :
       {"PODWithPagedKVCacheWrapper.__init__", "PODWithPagedKVCacheWrapper.plan",
        "PODWithPagedKVCacheWrapper.run", "BatchPODWithPagedKVCacheWrapper.__init__",
        "BatchPODWithPagedKVCacheWrapper.plan", "BatchPODWithPagedKVCacheWrapper.run"}) {
    api::register_attention_backends(name);
  }
  register_bench_hook("PODWithPagedKVCacheWrapper.run",
                      [](const BenchShape& s, Device d) { return bench_pod(s, d, false); });
  register_bench_hook("BatchPODWithPagedKVCacheWrapper.run",
                      [](const BenchShape& s, Device d) { return bench_pod(s, d, true); });
}
}  // namespace detail

}  // namespace flashinfer
