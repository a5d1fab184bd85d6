// Public decode attention (flashinfer.decode): single_decode_with_kv_cache and
// BatchDecodeWithPagedKVCacheWrapper — declarations, checks, plan and dispatch.
#include <algorithm>
#include <cmath>

#include "api/arg_traits.h"
#include "api/attention_common.h"
#include "api/attention_jit_module.h"
#include "api/attention_pos_encoding.h"
#include "api/bench_backend.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "core/cuda_runtime.h"
#include "flashinfer/ops/attention.h"

namespace flashinfer {

Value to_value(const WorkspaceSizes& w) {
  return Value::tuple({Value(w.float_workspace_size), Value(w.int_workspace_size)});
}

Value to_value(const AttentionOutput& r) {
  if (!r.lse.defined()) return Value(r.out);
  return Value::tuple({Value(r.out), Value(r.lse)});
}

namespace {

constexpr const char* kDecodeModule = "flashinfer.decode";
constexpr const char* kDecodeWrapperClass = "BatchDecodeWithPagedKVCacheWrapper";

// The constructor's argument types, as declared (and checked against the constructor).
using DecodeInit = Init<BatchDecodeWithPagedKVCacheWrapper, Tensor, std::string, bool, bool,
                        std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>,
                        std::string, std::optional<Value>, std::optional<Value>>;

AttentionOutput single_decode_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                   std::string_view kv_layout, std::string_view pos_encoding_mode,
                                   std::optional<double> q_scale, std::optional<double> k_scale,
                                   std::optional<double> v_scale, int64_t window_left,
                                   std::optional<double> logits_soft_cap,
                                   std::optional<double> sm_scale, bool use_tensor_cores,
                                   std::optional<double> rope_scale,
                                   std::optional<double> rope_theta, bool return_lse,
                                   const api::JitModuleCall* jit = nullptr) {
  const char* op = jit ? jit->op : "single_decode_with_kv_cache";
  api::check_single_qkv(q, k, v, 2, op);
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
                     std::nullopt, sm_scale, window_left, logits_soft_cap, "NONE", op);
  s.paged = false;
  s.decode = true;
  s.use_tensor_cores = use_tensor_cores;
  api::plan_pos_encoding(s, pos_encoding_mode, rope_scale, rope_theta, op);
  if (jit) api::apply_jit_module_call(s, *jit);
  s.batch = 1;
  const auto kv_len = static_cast<int32_t>(kn.size(0));
  s.qo_indptr = {0, 1};
  s.kv_indptr = {0, kv_len};
  s.kv_lens = {kv_len};
  s.total_qo = 1;
  s.total_kv = kv_len;
  {
    // A one-request plan made from shapes on every call: under a CUDA-graph capture its upload
    // goes by value.
    const detail::CaptureUploadScope by_value;
    api::build_plan(s, std::nullopt, /*disable_split_kv=*/true, op);
  }
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
  return call_op<&single_decode_with_kv_cache>(
      [&] {
        return single_decode_impl(q, k, v, kv_layout, pos_encoding_mode, q_scale, k_scale, v_scale,
                                  window_left, logits_soft_cap, sm_scale, use_tensor_cores,
                                  rope_scale, rope_theta, return_lse);
      },
      q, k, v, kv_layout, pos_encoding_mode, use_tensor_cores, q_scale, k_scale, v_scale,
      window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta, return_lse);
}

Tensor single_decode_with_kv_cache_with_jit_module(
    const std::shared_ptr<AttentionJitModule>& jit_module, const Tensor& q, const Tensor& k,
    const Tensor& v, Value args, std::string_view kv_layout, int64_t window_left, bool return_lse) {
  return call_op<&single_decode_with_kv_cache_with_jit_module>(
      [&] {
        const char* op = "single_decode_with_kv_cache_with_jit_module";
        const api::ModuleArgs m = api::read_module_args(
            jit_module, AttentionJitModule::Kind::kSingleDecode, args, q, k, v, window_left, 0, op);
        // Upstream computes the LSE into a buffer of its own and returns o alone.
        return api::with_module_arg_names([&] {
          return single_decode_impl(q, k, v, kv_layout, m.pos_encoding_mode, std::nullopt,
                                    std::nullopt, std::nullopt, m.window_left, m.logits_soft_cap,
                                    m.sm_scale, false, std::nullopt, std::nullopt, return_lse,
                                    &m.call)
              .out;
        });
      },
      jit_module, q, k, v, args, kv_layout, window_left, return_lse);
}

// ---- BatchDecodeWithPagedKVCacheWrapper ------------------------------------------------------

BatchDecodeWithPagedKVCacheWrapper::BatchDecodeWithPagedKVCacheWrapper(
    Tensor float_workspace_buffer, std::string kv_layout, bool use_cuda_graph,
    bool use_tensor_cores, std::optional<Tensor> paged_kv_indptr_buffer,
    std::optional<Tensor> paged_kv_indices_buffer,
    std::optional<Tensor> paged_kv_last_page_len_buffer, std::string backend,
    std::optional<Value> jit_args, std::optional<Value> jit_kwargs)
    : s_(std::make_unique<detail::WrapperState>()) {
  call_init<DecodeInit>(
      [&] {
        // jit_kwargs (upstream 0.7.4) are a JIT module's build options, used only with jit_args
        // (which init_wrapper refuses for decode): without them upstream ignores them too.
        // "trtllm-gen" runs the same kernels; it differs in reading plan's block_tables.
        const bool trtllm = backend == "trtllm-gen";
        api::init_wrapper(*s_, float_workspace_buffer, kv_layout, use_cuda_graph,
                          trtllm ? "auto" : backend, jit_args,
                          "BatchDecodeWithPagedKVCacheWrapper.__init__");
        if (trtllm) s_->backend = backend;
        s_->use_tensor_cores = use_tensor_cores;
        api::set_graph_buffers(*s_, paged_kv_indices_buffer, std::nullopt);
      },
      *this, float_workspace_buffer, kv_layout, use_cuda_graph, use_tensor_cores,
      paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer, backend,
      jit_args, jit_kwargs);
}

BatchDecodeWithPagedKVCacheWrapper::~BatchDecodeWithPagedKVCacheWrapper() = default;

bool BatchDecodeWithPagedKVCacheWrapper::split_kv() const { return s_->plan.split_kv; }

namespace {

// Replaces the page ids of the loaded table by block_tables' rows: request b's first
// (pages of b) entries, each a page id >= 0; entries past them are never read (padding).
void use_block_tables(detail::WrapperState& s, const Tensor& block_tables, const char* op) {
  api::check_defined(block_tables, op, "block_tables");
  api::check_dim(block_tables, {2}, op, "block_tables");
  FLASHINFER_CHECK(block_tables.dtype() == DType::kInt32, op, "block_tables",
                   "expected int32, got ", dtype_torch_name(block_tables.dtype()));
  const auto batch = static_cast<int64_t>(s.kv_lens.size());
  FLASHINFER_CHECK(block_tables.size(0) >= batch, op, "block_tables", "has ", block_tables.size(0),
                   " rows for a batch of ", batch);
  const Tensor h = block_tables.to(Device::cpu()).contiguous();
  const auto* table = static_cast<const int32_t*>(h.data_ptr());
  const int64_t cols = block_tables.size(1);
  s.max_page_id = -1;
  s.indices_arg = "block_tables";  // the ids the kernels read (build_plan's checks name it)
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t pages = s.kv_indptr[b + 1] - s.kv_indptr[b];
    FLASHINFER_CHECK(pages <= cols, op, "block_tables", "request ", b, " needs ", pages,
                     " pages but the table has ", cols, " columns");
    for (int64_t i = 0; i < pages; ++i) {
      const int32_t page = table[b * cols + i];
      FLASHINFER_CHECK(page >= 0, op, "block_tables", "entry [", b, ", ", i, "] = ", page,
                       " is negative");
      s.kv_indices[static_cast<std::size_t>(s.kv_indptr[b] + i)] = page;
      s.max_page_id = std::max<int64_t>(s.max_page_id, page);
    }
  }
}

// plan()'s work, into `s` (the wrapper's state, or workspace_size()'s scratch copy).
void plan_decode(detail::WrapperState& s, const Tensor& indptr, const Tensor& indices,
                 const Tensor& last_page_len, int64_t num_qo_heads, int64_t num_kv_heads,
                 int64_t head_dim, int64_t page_size, const BatchDecodePlanOptions& o,
                 const char* op) {
  s.planned = false;
  FLASHINFER_CHECK(o.q_len_per_req >= 1, op, "q_len_per_req", "must be >= 1, got ",
                   o.q_len_per_req);
  FLASHINFER_CHECK(o.window_right == 0 || o.window_right == -1, op, "window_right",
                   "no key lies right of a decode query; expected 0 or -1, got ", o.window_right);
  const std::optional<DType> kv = o.kv_data_type ? o.kv_data_type : o.data_type;
  api::plan_settings(s, num_qo_heads, num_kv_heads, head_dim, head_dim, o.q_data_type, kv,
                     o.o_data_type, o.sm_scale, o.window_left, o.logits_soft_cap, "NONE", op);
  s.decode = true;
  api::plan_pos_encoding(s, o.pos_encoding_mode, o.rope_scale, o.rope_theta, op);
  // The ids stay on the device, read when the call runs (kernels/page_guard.h), unless
  // trtllm-gen's block_tables replace them below.
  const bool table_ids = o.block_tables && s.backend == "trtllm-gen";
  api::load_page_table(s, indptr, indices, last_page_len, page_size, op, "indptr", "indices",
                       "last_page_len", /*live_ids=*/!table_ids);
  api::check_seq_lens(s, o.seq_lens, op);
  // Upstream's trtllm-gen backend reads request b's pages from block_tables[b] (its lengths still
  // come from indptr and last_page_len); fa2 stores the table and never reads it.
  if (table_ids) use_block_tables(s, *o.block_tables, op);
  s.batch = static_cast<int32_t>(s.kv_lens.size());
  s.decode = true;
  s.q_len_per_req = o.q_len_per_req;
  // Several queries per request are the last tokens of the request, causal among
  // themselves (speculative verification).
  s.causal = o.q_len_per_req > 1;
  s.qo_indptr.assign(static_cast<std::size_t>(s.batch) + 1, 0);
  for (int32_t b = 0; b < s.batch; ++b) {
    FLASHINFER_CHECK(o.q_len_per_req == 1 || s.kv_lens[b] >= o.q_len_per_req, op, "last_page_len",
                     "request ", b, " has ", s.kv_lens[b], " keys, fewer than q_len_per_req");
    s.qo_indptr[b + 1] = static_cast<int32_t>(s.qo_indptr[b] + o.q_len_per_req);
  }
  s.total_qo = static_cast<int64_t>(s.batch) * o.q_len_per_req;
  api::build_plan(s, o.fixed_split_size, o.disable_split_kv, op);
}

}  // namespace

void BatchDecodeWithPagedKVCacheWrapper::plan(const Tensor& indptr, const Tensor& indices,
                                              const Tensor& last_page_len, int64_t num_qo_heads,
                                              int64_t num_kv_heads, int64_t head_dim,
                                              int64_t page_size, const PlanOptions& o) {
  call_op<&BatchDecodeWithPagedKVCacheWrapper::plan>(
      [&] {
        plan_decode(*s_, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
                    page_size, o, "BatchDecodeWithPagedKVCacheWrapper.plan");
      },
      *this, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, o);
}

WorkspaceSizes BatchDecodeWithPagedKVCacheWrapper::workspace_size(
    const Tensor& indptr, const Tensor& indices, const Tensor& last_page_len, int64_t num_qo_heads,
    int64_t num_kv_heads, int64_t head_dim, int64_t page_size, const PlanOptions& o) {
  return call_op<&BatchDecodeWithPagedKVCacheWrapper::workspace_size>(
      [&] {
        detail::WrapperState t = api::sizing_state(*s_);
        plan_decode(t, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
                    page_size, o, "BatchDecodeWithPagedKVCacheWrapper.workspace_size");
        return api::plan_workspace_sizes(t);
      },
      *this, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, o);
}

AttentionOutput BatchDecodeWithPagedKVCacheWrapper::run(const Tensor& q,
                                                        const PagedKVCache& paged_kv_cache,
                                                        const AttentionRunOptions& o) {
  return call_op<&BatchDecodeWithPagedKVCacheWrapper::run>(
      [&] {
        const char* op = "BatchDecodeWithPagedKVCacheWrapper.run";
        FLASHINFER_CHECK(s_->planned, op, "self", "run() called before plan()");
        auto [k, v] = api::paged_cache_views(paged_kv_cache, s_->hnd, op, "paged_kv_cache");
        return api::run_planned(*s_, q, k, v, o, op, "paged_kv_cache", "paged_kv_cache");
      },
      *this, q, paged_kv_cache, o);
}

namespace {

using api::bench::bench_attention_bytes;
using api::bench::bench_object;
using api::bench::bench_pages;
using api::bench::BenchPages;

// BatchDecodeWithPagedKVCacheWrapper: plan once when the case is built, time run().
BenchCase bench_batch_decode(const BenchShape& s, Device dev) {
  BenchPages p = bench_pages(s, dev);
  // 128 MB on CUDA, as upstream's benchmarks give the wrapper: split-KV partials that do not fit
  // would make plan() run unsplit (scripts/gpu-check compares with upstream on these shapes).
  const int64_t workspace = dev.is_cuda() ? int64_t{128} << 20 : int64_t{16} << 20;
  // `--backends cuda:fa2_tc` (upstream's benchmark name): use_tensor_cores=True; "fa2" (or none):
  // use_tensor_cores=False, as upstream's benchmark calls it (the CUDA-core kernel, or the
  // tensor-core one where api::decode_tensor_cores_auto puts the call).
  const bool tensor_cores = api::bench::op_backend("fa2") == "fa2_tc";
  auto w = std::make_shared<BatchDecodeWithPagedKVCacheWrapper>(
      Tensor::empty({workspace}, DType::kUInt8, dev), "NHD", /*use_cuda_graph=*/false,
      tensor_cores);
  BatchDecodeWithPagedKVCacheWrapper::PlanOptions o;
  o.q_data_type = s.q_dtype;
  o.kv_data_type = s.kv_dtype;
  w->plan(p.indptr, p.indices, p.last_page_len, s.num_qo_heads, s.num_kv_heads, s.head_dim_qk,
          s.page_size, o);
  Tensor q = api::bench::random_tensor({s.batch_size, s.num_qo_heads, s.head_dim_qk}, s.q_dtype,
                                       dev, s.random_seed);
  BenchCase c = api::bench::invoke_case(std::string(kDecodeWrapperClass) + ".run",
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

// The standard module single_decode_with_kv_cache runs for the shape, with its raw arguments.
BenchCase bench_single_decode_jit(const BenchShape& s, Device dev) {
  const Shape kv{s.s_kv, s.num_kv_heads, s.head_dim_qk};
  const auto module = gen_single_decode_module(s.q_dtype, s.kv_dtype, s.q_dtype, s.head_dim_qk,
                                               s.head_dim_qk, 0, false, false)
                          .build_and_load();
  BenchCase c = api::bench::invoke_case(
      "single_decode_with_kv_cache_with_jit_module",
      {to_value(module),
       Value(api::bench::random_tensor({s.num_qo_heads, s.head_dim_qk}, s.q_dtype, dev,
                                       s.random_seed)),
       Value(api::bench::random_tensor(kv, s.kv_dtype, dev, s.random_seed + 1)),
       Value(api::bench::random_tensor(kv, s.kv_dtype, dev, s.random_seed + 2)), Value(),
       Value(0.0), Value(1.0 / std::sqrt(static_cast<double>(s.head_dim_qk))), Value(1.0),
       Value(1e-4)});
  c.flops =
      api::bench::attention_flops(1, s.s_kv, s.num_qo_heads, s.head_dim_qk, s.head_dim_qk, false);
  c.bytes = bench_attention_bytes(s, 1, s.s_kv);
  return c;
}

}  // namespace

namespace detail {
void register_decode_ops(OpRegistry& r) {
  api::register_paged_ids_at_run("BatchDecodeWithPagedKVCacheWrapper.run");
  declare<&single_decode_with_kv_cache>(
      r,
      {.name = "single_decode_with_kv_cache",
       .module = kDecodeModule,
       .summary = "Decode attention of one query token against one request's KV"},
      "q", "k", "v", arg("kv_layout", "NHD"), arg("pos_encoding_mode", "NONE"),
      arg("use_tensor_cores", false), "q_scale", "k_scale", "v_scale", arg("window_left", -1),
      "logits_soft_cap", "sm_scale", "rope_scale", "rope_theta", arg("return_lse", false));
  declare_init<DecodeInit>(
      r,
      {.name = "BatchDecodeWithPagedKVCacheWrapper.__init__",
       .module = kDecodeModule,
       .summary = "Batch decode attention over a paged KV cache (plan once, run per layer)"},
      "float_workspace_buffer", arg("kv_layout", "NHD"), arg("use_cuda_graph", false),
      arg("use_tensor_cores", false), "paged_kv_indptr_buffer", "paged_kv_indices_buffer",
      "paged_kv_last_page_len_buffer", arg("backend", "auto"), arg("jit_args").as(ParamKind::kList),
      "jit_kwargs");
  // Upstream's plan takes its keywords through **kwargs (and refuses the deprecated positional
  // ones); the fields of BatchDecodePlanOptions are those keywords.
  declare<&BatchDecodeWithPagedKVCacheWrapper::plan>(
      r,
      {.name = "BatchDecodeWithPagedKVCacheWrapper.plan",
       .module = kDecodeModule,
       .summary = "Validates the page table and builds the split-KV work partition",
       .var_positional = "deprecated_positional_args",
       .var_keyword = "kwargs"},
      "indptr", "indices", "last_page_len", "num_qo_heads", "num_kv_heads", "head_dim", "page_size",
      field("q_data_type", "float16"));
  // Upstream's workspace_size takes plan's arguments positionally (no **kwargs).
  declare<&BatchDecodeWithPagedKVCacheWrapper::workspace_size>(
      r,
      {.name = "BatchDecodeWithPagedKVCacheWrapper.workspace_size",
       .module = kDecodeModule,
       .summary = "The (float, int) workspace bytes plan() would need",
       .options_keyword_only = false},
      "indptr", "indices", "last_page_len", "num_qo_heads", "num_kv_heads", "head_dim", "page_size",
      OnlyFields{"pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type",
                 "kv_data_type", "o_data_type", "data_type", "sm_scale", "rope_scale", "rope_theta",
                 "block_tables", "seq_lens", "fixed_split_size", "disable_split_kv",
                 "q_len_per_req"},
      field("q_data_type", "float16"));
  api::register_attention_backends("BatchDecodeWithPagedKVCacheWrapper.workspace_size");
  declare<&BatchDecodeWithPagedKVCacheWrapper::run>(
      r,
      {.name = "BatchDecodeWithPagedKVCacheWrapper.run",
       .module = kDecodeModule,
       .summary = "Batch decode attention with the current plan",
       .var_positional = "args"},
      "q", "paged_kv_cache",
      OnlyFields{"q_scale", "k_scale", "v_scale", "out", "lse", "return_lse", "enable_pdl",
                 "window_left", "sinks", "q_len_per_req", "skip_softmax_threshold_scale_factor",
                 "kv_cache_sf"},
      field("out").mut(), field("lse").mut());
  // A wrapper's __init__ and plan belong to the kernel its run launches.
  api::register_attention_backends("BatchDecodeWithPagedKVCacheWrapper.__init__");
  api::register_attention_backends("BatchDecodeWithPagedKVCacheWrapper.plan");
  api::register_attention_backends("single_decode_with_kv_cache");
  declare<&single_decode_with_kv_cache_with_jit_module>(
      r,
      {.name = "single_decode_with_kv_cache_with_jit_module",
       .module = kDecodeModule,
       .summary = "Decode attention of one request through a compiled module's raw run",
       .var_positional = "args"},
      "jit_module", "q", "k", "v", arg("args", Value::tuple({})).kw(), arg("kv_layout", "NHD").kw(),
      arg("window_left", -1).kw(), arg("return_lse", false).kw());
  api::register_attention_backends("single_decode_with_kv_cache_with_jit_module");
  api::register_attention_backends("BatchDecodeWithPagedKVCacheWrapper.run");
  register_bench_hook("single_decode_with_kv_cache", bench_single_decode);
  register_bench_hook("single_decode_with_kv_cache_with_jit_module", bench_single_decode_jit);
  register_bench_hook("BatchDecodeWithPagedKVCacheWrapper.run", bench_batch_decode);
}
}  // namespace detail

}  // namespace flashinfer
