// Public decode attention (flashinfer.decode): single_decode_with_kv_cache and
// BatchDecodeWithPagedKVCacheWrapper — declarations, checks, plan and dispatch.
#include <cmath>

#include "api/attention_common.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "flashinfer/api_call.h"
#include "flashinfer/ops/attention.h"

namespace flashinfer {

Value to_value(const AttentionOutput& r) {
  if (!r.lse.defined()) return Value(r.out);
  return Value::tuple({Value(r.out), Value(r.lse)});
}

namespace {

constexpr const char* kModule = "flashinfer.decode";
constexpr const char* kClass = "BatchDecodeWithPagedKVCacheWrapper";

OpDecl make_single_decode_decl() {
  OpDecl d;
  d.name = "single_decode_with_kv_cache";
  d.module = kModule;
  d.params = {
      ParamDecl("q", ParamKind::kTensor),
      ParamDecl("k", ParamKind::kTensor),
      ParamDecl("v", ParamKind::kTensor),
      ParamDecl("kv_layout", ParamKind::kString).def("NHD"),
      ParamDecl("pos_encoding_mode", ParamKind::kString).def("NONE"),
      ParamDecl("use_tensor_cores", ParamKind::kBool).def(false),
      ParamDecl("q_scale", ParamKind::kFloat).opt(),
      ParamDecl("k_scale", ParamKind::kFloat).opt(),
      ParamDecl("v_scale", ParamKind::kFloat).opt(),
      ParamDecl("window_left", ParamKind::kInt).def(-1),
      ParamDecl("logits_soft_cap", ParamKind::kFloat).opt(),
      ParamDecl("sm_scale", ParamKind::kFloat).opt(),
      ParamDecl("rope_scale", ParamKind::kFloat).opt(),
      ParamDecl("rope_theta", ParamKind::kFloat).opt(),
      ParamDecl("return_lse", ParamKind::kBool).def(false),
  };
  d.returns = "Tensor | tuple[Tensor, Tensor]";
  d.summary = "Decode attention of one query token against one request's KV";
  d.invoke = [](const CallArgs& a) -> Value {
    return to_value(single_decode_with_kv_cache(
        a.tensor(0), a.tensor(1), a.tensor(2), a.str(3), a.str(4), a.boolean(5), a.optional_f64(6),
        a.optional_f64(7), a.optional_f64(8), a.i64(9), a.optional_f64(10), a.optional_f64(11),
        a.optional_f64(12), a.optional_f64(13), a.boolean(14)));
  };
  return d;
}
const OpDecl& single_decode_decl() {
  static const OpDecl& d = *OpRegistry::global().find("single_decode_with_kv_cache");
  return d;
}

OpDecl make_init_decl() {
  OpDecl d;
  d.name = std::string(kClass) + ".__init__";
  d.module = kModule;
  d.class_name = kClass;
  d.params = {
      ParamDecl("self", ParamKind::kObject).type(kClass),
      ParamDecl("float_workspace_buffer", ParamKind::kTensor),
      ParamDecl("kv_layout", ParamKind::kString).def("NHD"),
      ParamDecl("use_cuda_graph", ParamKind::kBool).def(false),
      ParamDecl("use_tensor_cores", ParamKind::kBool).def(false),
      ParamDecl("paged_kv_indptr_buffer", ParamKind::kTensor).opt(),
      ParamDecl("paged_kv_indices_buffer", ParamKind::kTensor).opt(),
      ParamDecl("paged_kv_last_page_len_buffer", ParamKind::kTensor).opt(),
      ParamDecl("backend", ParamKind::kString).def("auto"),
      ParamDecl("jit_args", ParamKind::kList).opt(),
  };
  d.returns = "None";
  d.summary = "Batch decode attention over a paged KV cache (plan once, run per layer)";
  d.invoke = [](const CallArgs& a) -> Value {
    std::optional<Value> jit;
    if (!a[9].is_none()) jit = a[9];
    auto obj = std::make_shared<BatchDecodeWithPagedKVCacheWrapper>(
        a.tensor(1), a.str(2), a.boolean(3), a.boolean(4), a.optional_tensor(5),
        a.optional_tensor(6), a.optional_tensor(7), a.str(8), jit);
    ObjectRef ref;
    ref.type = std::string(obj->class_name());
    ref.repr = obj->repr();
    ref.id = obj->object_id();
    ref.object = obj;
    return Value(std::move(ref));
  };
  return d;
}
const OpDecl& init_decl() {
  static const OpDecl& d = *OpRegistry::global().find(std::string(kClass) + ".__init__");
  return d;
}

OpDecl make_plan_decl() {
  OpDecl d;
  d.name = std::string(kClass) + ".plan";
  d.module = kModule;
  d.class_name = kClass;
  d.params = {
      ParamDecl("self", ParamKind::kObject).type(kClass),
      ParamDecl("indptr", ParamKind::kTensor),
      ParamDecl("indices", ParamKind::kTensor),
      ParamDecl("last_page_len", ParamKind::kTensor),
      ParamDecl("num_qo_heads", ParamKind::kInt),
      ParamDecl("num_kv_heads", ParamKind::kInt),
      ParamDecl("head_dim", ParamKind::kInt),
      ParamDecl("page_size", ParamKind::kInt),
      ParamDecl("pos_encoding_mode", ParamKind::kString).def("NONE").kw(),
      ParamDecl("window_left", ParamKind::kInt).def(-1).kw(),
      ParamDecl("window_right", ParamKind::kInt).def(0).kw(),
      ParamDecl("logits_soft_cap", ParamKind::kFloat).opt().kw(),
      ParamDecl("q_data_type", ParamKind::kDType).def("float16").kw(),
      ParamDecl("kv_data_type", ParamKind::kDType).opt().kw(),
      ParamDecl("o_data_type", ParamKind::kDType).opt().kw(),
      ParamDecl("data_type", ParamKind::kDType).opt().kw(),
      ParamDecl("sm_scale", ParamKind::kFloat).opt().kw(),
      ParamDecl("rope_scale", ParamKind::kFloat).opt().kw(),
      ParamDecl("rope_theta", ParamKind::kFloat).opt().kw(),
      ParamDecl("non_blocking", ParamKind::kBool).def(true).kw(),
      ParamDecl("block_tables", ParamKind::kTensor).opt().kw(),
      ParamDecl("seq_lens", ParamKind::kTensor).opt().kw(),
      ParamDecl("fixed_split_size", ParamKind::kInt).opt().kw(),
      ParamDecl("disable_split_kv", ParamKind::kBool).def(false).kw(),
      ParamDecl("q_len_per_req", ParamKind::kInt).def(1).kw(),
  };
  d.returns = "None";
  d.summary = "Validates the page table and builds the split-KV work partition";
  d.invoke = [](const CallArgs& a) -> Value {
    BatchDecodeWithPagedKVCacheWrapper::PlanOptions o;
    o.pos_encoding_mode = a.str(8);
    o.window_left = a.i64(9);
    o.window_right = a.i64(10);
    o.logits_soft_cap = a.optional_f64(11);
    o.q_data_type = a.dtype(12);
    o.kv_data_type = a.optional_dtype(13);
    o.o_data_type = a.optional_dtype(14);
    o.data_type = a.optional_dtype(15);
    o.sm_scale = a.optional_f64(16);
    o.rope_scale = a.optional_f64(17);
    o.rope_theta = a.optional_f64(18);
    o.non_blocking = a.boolean(19);
    o.block_tables = a.optional_tensor(20);
    o.seq_lens = a.optional_tensor(21);
    o.fixed_split_size = a.optional_i64(22);
    o.disable_split_kv = a.boolean(23);
    o.q_len_per_req = a.i64(24);
    a.object_as<BatchDecodeWithPagedKVCacheWrapper>(0).plan(
        a.tensor(1), a.tensor(2), a.tensor(3), a.i64(4), a.i64(5), a.i64(6), a.i64(7), o);
    return Value();
  };
  return d;
}
const OpDecl& plan_decl() {
  static const OpDecl& d = *OpRegistry::global().find(std::string(kClass) + ".plan");
  return d;
}

OpDecl make_run_decl() {
  OpDecl d;
  d.name = std::string(kClass) + ".run";
  d.module = kModule;
  d.class_name = kClass;
  d.params = {ParamDecl("self", ParamKind::kObject).type(kClass),
              ParamDecl("q", ParamKind::kTensor), ParamDecl("paged_kv_cache", ParamKind::kAny)};
  for (const char* n :
       {"q_scale", "k_scale", "v_scale", "out", "lse", "return_lse", "enable_pdl", "window_left",
        "sinks", "q_len_per_req", "skip_softmax_threshold_scale_factor", "kv_cache_sf"}) {
    d.params.push_back(api::run_option_param(n));
  }
  d.returns = "Tensor | tuple[Tensor, Tensor]";
  d.summary = "Batch decode attention with the current plan";
  d.invoke = [](const CallArgs& a) -> Value {
    return to_value(a.object_as<BatchDecodeWithPagedKVCacheWrapper>(0).run(
        a.tensor(1), PagedKVCache::from_value(a[2]), api::read_run_options(a)));
  };
  return d;
}
const OpDecl& run_decl() {
  static const OpDecl& d = *OpRegistry::global().find(std::string(kClass) + ".run");
  return d;
}

AttentionOutput single_decode_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                   std::string_view kv_layout, std::string_view pos_encoding_mode,
                                   std::optional<double> q_scale, std::optional<double> k_scale,
                                   std::optional<double> v_scale, int64_t window_left,
                                   std::optional<double> logits_soft_cap,
                                   std::optional<double> sm_scale, bool return_lse) {
  const char* op = "single_decode_with_kv_cache";
  api::check_defined(q, op, "q");
  api::check_defined(k, op, "k");
  api::check_defined(v, op, "v");
  api::check_dim(q, {2}, op, "q");
  api::check_dim(k, {3}, op, "k");
  api::check_dim(v, {3}, op, "v");
  const bool hnd = api::parse_kv_layout(kv_layout, op, "kv_layout");
  const Tensor kn = hnd ? k.transpose(0, 1) : k;  // [kv_len, Hkv, D] views
  const Tensor vn = hnd ? v.transpose(0, 1) : v;
  FLASHINFER_CHECK(vn.size(0) == kn.size(0), op, "v", "has ", vn.size(0), " tokens, k has ",
                   kn.size(0));
  FLASHINFER_CHECK(kn.size(0) <= std::numeric_limits<int32_t>::max(), op, "k",
                   "more than 2^31 - 1 tokens");
  api::check_q_dtype(q.dtype(), op, "q");
  api::check_kv_dtype(k.dtype(), q.dtype(), op, "k");
  api::check_same_dtype(v, k, op, "v", "k");
  api::check_same_device(k, q, op, "k", "q");
  api::check_same_device(v, q, op, "v", "q");
  FLASHINFER_CHECK(kn.size(2) == q.size(1), op, "k", "head_dim ", kn.size(2),
                   " does not match q's ", q.size(1));
  FLASHINFER_CHECK(vn.size(1) == kn.size(1), op, "v", "has ", vn.size(1), " heads, k has ",
                   kn.size(1));
  // Name this op's own arguments before the shared checks do.
  api::check_heads(q.size(0), kn.size(1), op, "q", "k");
  api::check_head_dim(q.size(1), op, "q");
  api::check_head_dim(vn.size(2), op, "v");
  detail::WrapperState s;
  s.device = q.device();
  api::plan_settings(s, q.size(0), kn.size(1), q.size(1), vn.size(2), q.dtype(), k.dtype(),
                     std::nullopt, sm_scale, window_left, logits_soft_cap, pos_encoding_mode, op);
  s.paged = false;
  s.decode = true;
  s.batch = 1;
  const auto kv_len = static_cast<int32_t>(kn.size(0));
  s.qo_indptr = {0, 1};
  s.kv_indptr = {0, kv_len};
  s.kv_lens = {kv_len};
  s.total_qo = 1;
  s.total_kv = kv_len;
  api::build_plan(s, std::nullopt, /*disable_split_kv=*/true, op);
  AttentionRunOptions o;
  o.q_scale = q_scale;
  o.k_scale = k_scale;
  o.v_scale = v_scale;
  o.return_lse = return_lse;
  AttentionOutput r = api::run_planned(s, q.unsqueeze(0), kn, vn, o, op, "k", "v");
  r.out = r.out.squeeze(0);
  if (r.lse.defined()) r.lse = r.lse.squeeze(0);
  return r;
}

}  // namespace

AttentionOutput single_decode_with_kv_cache(
    const Tensor& q, const Tensor& k, const Tensor& v, std::string_view kv_layout,
    std::string_view pos_encoding_mode, bool use_tensor_cores, std::optional<double> q_scale,
    std::optional<double> k_scale, std::optional<double> v_scale, int64_t window_left,
    std::optional<double> logits_soft_cap, std::optional<double> sm_scale,
    std::optional<double> rope_scale, std::optional<double> rope_theta, bool return_lse) {
  return call_api(
      &single_decode_decl,
      [&] {
        return single_decode_impl(q, k, v, kv_layout, pos_encoding_mode, q_scale, k_scale, v_scale,
                                  window_left, logits_soft_cap, sm_scale, return_lse);
      },
      q, k, v, kv_layout, pos_encoding_mode, use_tensor_cores, q_scale, k_scale, v_scale,
      window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta, return_lse);
}

// ---- BatchDecodeWithPagedKVCacheWrapper ------------------------------------------------------

BatchDecodeWithPagedKVCacheWrapper::BatchDecodeWithPagedKVCacheWrapper(
    Tensor float_workspace_buffer, std::string kv_layout, bool use_cuda_graph,
    bool use_tensor_cores, std::optional<Tensor> paged_kv_indptr_buffer,
    std::optional<Tensor> paged_kv_indices_buffer,
    std::optional<Tensor> paged_kv_last_page_len_buffer, std::string backend,
    std::optional<Value> jit_args)
    : s_(std::make_unique<detail::WrapperState>()) {
  call_api(
      &init_decl,
      [&] {
        api::init_wrapper(*s_, float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args,
                          "BatchDecodeWithPagedKVCacheWrapper.__init__");
        s_->use_tensor_cores = use_tensor_cores;
      },
      *this, float_workspace_buffer, kv_layout, use_cuda_graph, use_tensor_cores,
      paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer, backend,
      jit_args);
}

BatchDecodeWithPagedKVCacheWrapper::~BatchDecodeWithPagedKVCacheWrapper() = default;

bool BatchDecodeWithPagedKVCacheWrapper::split_kv() const { return s_->plan.split_kv; }

void BatchDecodeWithPagedKVCacheWrapper::plan(const Tensor& indptr, const Tensor& indices,
                                              const Tensor& last_page_len, int64_t num_qo_heads,
                                              int64_t num_kv_heads, int64_t head_dim,
                                              int64_t page_size, const PlanOptions& o) {
  call_api(
      &plan_decl,
      [&] {
        const char* op = "BatchDecodeWithPagedKVCacheWrapper.plan";
        detail::WrapperState& s = *s_;
        s.planned = false;
        FLASHINFER_CHECK_CODE(!o.block_tables, ErrorCode::kUnsupported, op, "block_tables",
                              "only the trtllm-gen backend takes block tables");
        FLASHINFER_CHECK_CODE(!o.seq_lens, ErrorCode::kUnsupported, op, "seq_lens",
                              "only the trtllm-gen backend takes seq_lens");
        FLASHINFER_CHECK(o.q_len_per_req >= 1, op, "q_len_per_req", "must be >= 1, got ",
                         o.q_len_per_req);
        FLASHINFER_CHECK(o.window_right == 0 || o.window_right == -1, op, "window_right",
                         "no key lies right of a decode query; expected 0 or -1, got ",
                         o.window_right);
        const std::optional<DType> kv = o.kv_data_type ? o.kv_data_type : o.data_type;
        api::plan_settings(s, num_qo_heads, num_kv_heads, head_dim, head_dim, o.q_data_type, kv,
                           o.o_data_type, o.sm_scale, o.window_left, o.logits_soft_cap,
                           o.pos_encoding_mode, op);
        api::load_page_table(s, indptr, indices, last_page_len, page_size, op, "indptr", "indices",
                             "last_page_len");
        s.batch = static_cast<int32_t>(s.kv_lens.size());
        s.decode = true;
        s.q_len_per_req = o.q_len_per_req;
        // Several queries per request are the last tokens of the request, causal among
        // themselves (speculative verification).
        s.causal = o.q_len_per_req > 1;
        s.qo_indptr.assign(static_cast<std::size_t>(s.batch) + 1, 0);
        for (int32_t b = 0; b < s.batch; ++b) {
          FLASHINFER_CHECK(o.q_len_per_req == 1 || s.kv_lens[b] >= o.q_len_per_req, op,
                           "last_page_len", "request ", b, " has ", s.kv_lens[b],
                           " keys, fewer than q_len_per_req");
          s.qo_indptr[b + 1] = static_cast<int32_t>(s.qo_indptr[b] + o.q_len_per_req);
        }
        s.total_qo = static_cast<int64_t>(s.batch) * o.q_len_per_req;
        api::build_plan(s, o.fixed_split_size, o.disable_split_kv, op);
      },
      *this, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
      o.pos_encoding_mode, o.window_left, o.window_right, o.logits_soft_cap, o.q_data_type,
      o.kv_data_type, o.o_data_type, o.data_type, o.sm_scale, o.rope_scale, o.rope_theta,
      o.non_blocking, o.block_tables, o.seq_lens, o.fixed_split_size, o.disable_split_kv,
      o.q_len_per_req);
}

AttentionOutput BatchDecodeWithPagedKVCacheWrapper::run(const Tensor& q,
                                                        const PagedKVCache& paged_kv_cache,
                                                        const AttentionRunOptions& o) {
  return call_api(
      &run_decl,
      [&] {
        const char* op = "BatchDecodeWithPagedKVCacheWrapper.run";
        FLASHINFER_CHECK(s_->planned, op, "self", "run() called before plan()");
        auto [k, v] = api::paged_cache_views(paged_kv_cache, s_->hnd, op, "paged_kv_cache");
        return api::run_planned(*s_, q, k, v, o, op, "paged_kv_cache", "paged_kv_cache");
      },
      *this, q, paged_kv_cache, o.q_scale, o.k_scale, o.v_scale, o.out, o.lse, o.return_lse,
      o.enable_pdl, o.window_left, o.sinks, o.q_len_per_req, o.skip_softmax_threshold_scale_factor,
      o.kv_cache_sf);
}

namespace {

using api::bench::bench_attention_bytes;
using api::bench::bench_object;
using api::bench::bench_pages;
using api::bench::BenchPages;

// BatchDecodeWithPagedKVCacheWrapper: plan once when the case is built, time run().
BenchCase bench_batch_decode(const BenchShape& s, Device dev) {
  BenchPages p = bench_pages(s, dev);
  auto w = std::make_shared<BatchDecodeWithPagedKVCacheWrapper>(
      Tensor::empty({16 << 20}, DType::kUInt8, dev));
  BatchDecodeWithPagedKVCacheWrapper::PlanOptions o;
  o.q_data_type = s.q_dtype;
  o.kv_data_type = s.kv_dtype;
  w->plan(p.indptr, p.indices, p.last_page_len, s.num_qo_heads, s.num_kv_heads, s.head_dim_qk,
          s.page_size, o);
  Tensor q = api::bench::random_tensor({s.batch_size, s.num_qo_heads, s.head_dim_qk}, s.q_dtype,
                                       dev, s.random_seed);
  BenchCase c = api::bench::invoke_case(std::string(kClass) + ".run",
                                        {bench_object(w), Value(q), Value::tuple({p.k, p.v})});
  c.flops =
      static_cast<double>(s.batch_size) *
      api::bench::attention_flops(1, s.s_kv, s.num_qo_heads, s.head_dim_qk, s.head_dim_qk, false);
  c.bytes = bench_attention_bytes(s, s.batch_size, s.batch_size * s.s_kv);
  return c;
}

BenchCase bench_single_decode(const BenchShape& s, Device dev) {
  const Shape kv{s.s_kv, s.num_kv_heads, s.head_dim_qk};
  BenchCase c = api::bench::invoke_case(
      "single_decode_with_kv_cache",
      {Value(api::bench::random_tensor({s.num_qo_heads, s.head_dim_qk}, s.q_dtype, dev,
                                       s.random_seed)),
       Value(api::bench::random_tensor(kv, s.kv_dtype, dev, s.random_seed + 1)),
       Value(api::bench::random_tensor(kv, s.kv_dtype, dev, s.random_seed + 2))});
  c.flops =
      api::bench::attention_flops(1, s.s_kv, s.num_qo_heads, s.head_dim_qk, s.head_dim_qk, false);
  c.bytes = bench_attention_bytes(s, 1, s.s_kv);
  return c;
}

}  // namespace

namespace detail {
void register_decode_ops(OpRegistry& registry) {
  registry.add(api::bench::with_bench(make_single_decode_decl(), bench_single_decode));
  registry.add(make_init_decl());
  registry.add(make_plan_decl());
  registry.add(api::bench::with_bench(make_run_decl(), bench_batch_decode));
}
}  // namespace detail

}  // namespace flashinfer
