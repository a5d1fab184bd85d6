// BatchAttentionWithAttentionSinkWrapper: the paged prefill wrapper with upstream's
// "AttentionSink" JIT variant. Runs on the paged prefill wrapper it owns (its calls are nested,
// so only this wrapper's methods are recorded, as upstream's).
#include "flashinfer/ops/attention_sink.h"

#include <cmath>
#include <string>

#include "api/arg_traits.h"
#include "api/attention_common.h"
#include "api/attention_jit_module.h"
#include "api/attention_sink.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "flashinfer/op_typed.h"

namespace flashinfer {
namespace {

constexpr const char* kInitOp = "BatchAttentionWithAttentionSinkWrapper.__init__";
constexpr const char* kPlanOp = "BatchAttentionWithAttentionSinkWrapper.plan";
constexpr const char* kRunOp = "BatchAttentionWithAttentionSinkWrapper.run";

using SinkInit =
    Init<BatchAttentionWithAttentionSinkWrapper, Tensor, std::string, bool, std::optional<Tensor>,
         std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>,
         std::optional<Tensor>, std::string, std::optional<Value>, std::optional<Value>>;

// The inner paged prefill wrapper's checks are this wrapper's call's (its arguments keep their
// names): an Error names this wrapper's method, not the inner one the caller never called.
[[noreturn]] void sink_rethrow(const Error& e, const char* inner_op, const char* op) {
  if (e.op() != inner_op) throw;
  throw Error(e.code(), op, e.arg(), e.detail(), e.file(), e.line());
}

void check_variant(const std::optional<Value>& jit_args, const std::optional<Value>& jit_kwargs) {
  FLASHINFER_CHECK(api::attention_sink_variant(jit_args, jit_kwargs, kInitOp), kInitOp, "jit_args",
                   "must be the AttentionSink variant's argument list, got None");
}

BenchCase bench_sink_run(const BenchShape& s, Device dev) {
  api::bench::BenchPages p = api::bench::bench_pages(s, dev);
  auto w = BatchAttentionWithAttentionSinkWrapper::create(
      Tensor::empty({16 << 20}, DType::kUInt8, dev), "NHD", false, std::nullopt, std::nullopt,
      "fa2", "NONE", false, s.q_dtype, s.kv_dtype, s.head_dim_qk, s.head_dim_qk, -1);
  std::vector<int64_t> qo;
  for (int64_t b = 0; b <= s.batch_size; ++b) qo.push_back(b * s.s_qo);
  PrefillPlanOptions o;
  o.causal = s.causal;
  o.q_data_type = s.q_dtype;
  o.kv_data_type = s.kv_dtype;
  w->plan(api::bench::int32_tensor(qo, dev), p.indptr, p.indices, p.last_page_len, s.num_qo_heads,
          s.num_kv_heads, s.head_dim_qk, s.page_size, o);
  const Tensor q = api::bench::random_tensor({s.batch_size * s.s_qo, s.num_qo_heads, s.head_dim_qk},
                                             s.q_dtype, dev, s.random_seed);
  const Tensor sink = api::bench::random_tensor({s.num_qo_heads}, DType::kFloat32, dev,
                                                s.random_seed + 3, 0.0, 2.0);
  BenchCase c = api::bench::invoke_case(
      kRunOp, {api::bench::bench_object(w), Value(q), Value::tuple({p.k, p.v}), Value(sink),
               Value(1.0 / std::sqrt(static_cast<double>(s.head_dim_qk)))});
  c.flops = static_cast<double>(s.batch_size) *
            api::bench::attention_flops(s.s_qo, s.s_kv, s.num_qo_heads, s.head_dim_qk,
                                        s.head_dim_qk, s.causal);
  c.bytes = api::bench::bench_attention_bytes(s, s.batch_size * s.s_qo, s.batch_size * s.s_kv);
  return c;
}

}  // namespace

BatchAttentionWithAttentionSinkWrapper::BatchAttentionWithAttentionSinkWrapper(
    Tensor float_workspace_buffer, std::string kv_layout, bool use_cuda_graph,
    std::optional<Tensor> qo_indptr_buf, std::optional<Tensor> paged_kv_indptr_buf,
    std::optional<Tensor> paged_kv_indices_buf, std::optional<Tensor> paged_kv_last_page_len_buf,
    std::optional<Tensor> custom_mask_buf, std::optional<Tensor> mask_indptr_buf,
    std::string backend, std::optional<Value> jit_args, std::optional<Value> jit_kwargs) {
  call_init<SinkInit>(
      [&] {
        check_variant(jit_args, jit_kwargs);
        // Upstream resolves "auto" to fa2 or fa3 before recording; both are this library's
        // paged prefill kernels.
        FLASHINFER_CHECK_CODE(backend == "auto" || backend == "fa2" || backend == "fa3",
                              ErrorCode::kUnsupported, kInitOp, "backend", "\"", backend,
                              "\" is not available (\"auto\", \"fa2\" or \"fa3\")");
        try {
          inner_ = std::make_unique<BatchPrefillWithPagedKVCacheWrapper>(
              float_workspace_buffer, kv_layout, use_cuda_graph, qo_indptr_buf, paged_kv_indptr_buf,
              paged_kv_indices_buf, paged_kv_last_page_len_buf, custom_mask_buf, mask_indptr_buf,
              backend == "fa3" ? "auto" : backend);
        } catch (const Error& e) {
          sink_rethrow(e, "BatchPrefillWithPagedKVCacheWrapper.__init__", kInitOp);
        }
      },
      *this, float_workspace_buffer, kv_layout, use_cuda_graph, qo_indptr_buf, paged_kv_indptr_buf,
      paged_kv_indices_buf, paged_kv_last_page_len_buf, custom_mask_buf, mask_indptr_buf, backend,
      jit_args, jit_kwargs);
}

BatchAttentionWithAttentionSinkWrapper::~BatchAttentionWithAttentionSinkWrapper() = default;

std::shared_ptr<BatchAttentionWithAttentionSinkWrapper>
BatchAttentionWithAttentionSinkWrapper::create(Tensor float_workspace_buffer, std::string kv_layout,
                                               bool use_cuda_graph,
                                               std::optional<Tensor> custom_mask_buf,
                                               std::optional<Tensor> mask_indptr_buf,
                                               std::string backend, std::string pos_encoding_mode,
                                               bool use_fp16_qk_reduction, DType q_data_type,
                                               DType kv_data_type, int64_t head_dim_qk,
                                               int64_t head_dim_vo, int64_t window_left) {
  FLASHINFER_CHECK(pos_encoding_mode == "NONE" || pos_encoding_mode == "ROPE_LLAMA" ||
                       pos_encoding_mode == "ALIBI",
                   kInitOp, "pos_encoding_mode", "unknown mode '", pos_encoding_mode, "'");
  const int64_t pe = pos_encoding_mode == "NONE" ? 0 : pos_encoding_mode == "ROPE_LLAMA" ? 1 : 2;
  const std::string resolved = backend == "auto" ? "fa2" : backend;
  // float32 (the CPU reference's) has no name in upstream's map; "f32" keeps such a uri legible.
  const char* q_name = api::filename_safe_dtype(q_data_type);
  const std::string uri = std::string("batch_prefill_attention_sink_") + (q_name ? q_name : "f32") +
                          "_swa_" + (window_left >= 0 ? "True" : "False") + "_" + resolved;
  Value args = Value::list(
      {Value(uri), Value(q_data_type), Value(kv_data_type), Value(q_data_type),
       Value(DType::kInt32), Value(head_dim_qk), Value(head_dim_vo), Value::list({Value("sink")}),
       Value::list({Value("float")}), Value::list({Value("sm_scale")}),
       Value::list({Value("double")}), Value("AttentionSink"),
       // Upstream passes its variant's CUDA source here; this library has no JIT source.
       Value("flashinfer-cpp AttentionSink variant (no JIT source)")});
  Value kwargs = Value::dict({{Value("use_sliding_window"), Value(window_left >= 0)},
                              {Value("use_fp16_qk_reduction"), Value(use_fp16_qk_reduction)},
                              {Value("pos_encoding_mode"), Value(pe)}});
  return std::make_shared<BatchAttentionWithAttentionSinkWrapper>(
      std::move(float_workspace_buffer), std::move(kv_layout), use_cuda_graph, std::nullopt,
      std::nullopt, std::nullopt, std::nullopt, std::move(custom_mask_buf),
      std::move(mask_indptr_buf), resolved, args, kwargs);
}

void BatchAttentionWithAttentionSinkWrapper::plan(
    const Tensor& qo_indptr, const Tensor& paged_kv_indptr, const Tensor& paged_kv_indices,
    const Tensor& paged_kv_last_page_len, int64_t num_qo_heads, int64_t num_kv_heads,
    int64_t head_dim_qk, int64_t page_size, const PrefillPlanOptions& o) {
  call_op<&BatchAttentionWithAttentionSinkWrapper::plan>(
      [&] {
        planned_ = false;
        try {
          inner_->plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                       num_qo_heads, num_kv_heads, head_dim_qk, page_size, o);
        } catch (const Error& e) {
          sink_rethrow(e, "BatchPrefillWithPagedKVCacheWrapper.plan", kPlanOp);
        }
        plan_sm_scale_ = o.sm_scale.value_or(1.0 / std::sqrt(static_cast<double>(head_dim_qk)));
        planned_ = true;
      },
      *this, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
      num_kv_heads, head_dim_qk, page_size, o);
}

AttentionOutput BatchAttentionWithAttentionSinkWrapper::run(const Tensor& q,
                                                            const PagedKVCache& paged_kv_cache,
                                                            std::optional<Tensor> sink,
                                                            std::optional<double> sm_scale,
                                                            const AttentionRunOptions& o) {
  return call_op<&BatchAttentionWithAttentionSinkWrapper::run>(
      [&] {
        FLASHINFER_CHECK(planned_, kRunOp, "self", "run() called before plan()");
        FLASHINFER_CHECK(!(sink && o.sinks), kRunOp, "sinks",
                         "give the sink once (positionally, as the variant's argument)");
        AttentionRunOptions r = o;
        if (sink) r.sinks = sink;
        if (sm_scale) {
          FLASHINFER_CHECK(std::isfinite(*sm_scale), kRunOp, "sm_scale", "must be finite, got ",
                           *sm_scale);
          // The variant's sm_scale replaces the planned one: scores scale by q_scale too.
          r.q_scale = o.q_scale.value_or(1.0) * (*sm_scale / plan_sm_scale_);
        }
        try {
          return inner_->run(q, paged_kv_cache, r);
        } catch (const Error& e) {
          sink_rethrow(e, "BatchPrefillWithPagedKVCacheWrapper.run", kRunOp);
        }
      },
      *this, q, paged_kv_cache, sink, sm_scale, o);
}

namespace detail {
void register_attention_sink_ops(OpRegistry& r) {
  api::register_paged_ids_at_run(kRunOp);
  declare_init<SinkInit>(r,
                         {.name = kInitOp,
                          .module = "flashinfer.prefill",
                          .summary = "Paged prefill wrapper with the AttentionSink variant "
                                     "(recorded with the parent's parameters, as upstream)"},
                         "float_workspace_buffer", arg("kv_layout", "NHD"),
                         arg("use_cuda_graph", false), "qo_indptr_buf", "paged_kv_indptr_buf",
                         "paged_kv_indices_buf", "paged_kv_last_page_len_buf", "custom_mask_buf",
                         "mask_indptr_buf", arg("backend", "auto"),
                         arg("jit_args").as(ParamKind::kList), "jit_kwargs");
  declare<&BatchAttentionWithAttentionSinkWrapper::plan>(
      r,
      {.name = kPlanOp,
       .module = "flashinfer.prefill",
       .summary = "BatchPrefillWithPagedKVCacheWrapper.plan under the subclass's name",
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
                 "disable_split_kv"},
      // clang-format on
      field("q_data_type", "float16"));
  declare<&BatchAttentionWithAttentionSinkWrapper::run>(
      r,
      {.name = kRunOp,
       .module = "flashinfer.prefill",
       .summary = "Paged prefill with a per-head sink logit in the softmax denominator"},
      "q", "paged_kv_cache", "sink", "sm_scale",
      // clang-format off
      OnlyFields{"q_scale", "k_scale", "v_scale", "out", "lse", "return_lse", "lse_base",
                 "lse_layout", "enable_pdl", "window_left", "sinks", "kv_cache_sf",
                 "skip_softmax_threshold_scale_factor", "use_fp16_softmax", "uses_spcompress"},
      // clang-format on
      field("out").mut(), field("lse").mut());
  api::register_attention_backends(kInitOp);
  api::register_attention_backends(kPlanOp);
  api::register_attention_backends(kRunOp);
  register_bench_hook(kRunOp, bench_sink_run);
}
}  // namespace detail

namespace api {

// Upstream's variant: jit_args[11] is the variant name, jit_args[7] / [9] the extra tensor and
// scalar names; jit_kwargs["pos_encoding_mode"] an int (0: none).
bool attention_sink_variant(const std::optional<Value>& jit_args,
                            const std::optional<Value>& jit_kwargs, const char* op) {
  if (!jit_args || jit_args->is_none()) return false;
  FLASHINFER_CHECK(jit_args->is_sequence() && jit_args->items().size() >= 12, op, "jit_args",
                   "must be a JIT variant's argument list (upstream's 13 entries), got ",
                   jit_args->repr());
  const auto& a = jit_args->items();
  const bool sink_variant =
      a[11].kind() == Value::Kind::kString && a[11].as_string() == "AttentionSink";
  FLASHINFER_CHECK_CODE(sink_variant, ErrorCode::kUnsupported, op, "jit_args",
                        "only the AttentionSink variant is supported, got ", a[11].repr());
  if (jit_kwargs && !jit_kwargs->is_none()) {
    FLASHINFER_CHECK(jit_kwargs->kind() == Value::Kind::kDict, op, "jit_kwargs",
                     "must be a dict, got ", jit_kwargs->repr());
    for (const auto& [k, v] : jit_kwargs->dict_items()) {
      if (k.kind() == Value::Kind::kString && k.as_string() == "pos_encoding_mode") {
        FLASHINFER_CHECK_CODE(
            v.kind() == Value::Kind::kInt && v.as_int() == 0, ErrorCode::kUnsupported, op,
            "jit_kwargs", "pos_encoding_mode other than NONE (0) is not supported, got ", v.repr());
      }
    }
  }
  return true;
}

AttentionRunOptions apply_variant_args(const detail::WrapperState& s, const AttentionRunOptions& o,
                                       const char* op) {
  const bool given = o.args && !o.args->is_none();
  FLASHINFER_CHECK(s.sink_variant || !given, op, "args", "extra positional arguments ",
                   o.args ? o.args->repr() : std::string(),
                   " are a JIT variant's; this wrapper was built without jit_args");
  AttentionRunOptions r = o;
  r.args.reset();
  if (!s.sink_variant) return r;
  FLASHINFER_CHECK(given && o.args->is_sequence() && o.args->items().size() == 2, op, "args",
                   "the AttentionSink variant takes (sink, sm_scale) positionally after the KV "
                   "cache, got ",
                   given ? o.args->repr() : std::string("none"));
  const Value& sink = o.args->items()[0];
  const Value& scale = o.args->items()[1];
  FLASHINFER_CHECK(sink.is_tensor(), op, "args", "args[0] (sink) must be a tensor, got ",
                   sink.repr());
  FLASHINFER_CHECK(scale.kind() == Value::Kind::kFloat || scale.kind() == Value::Kind::kInt, op,
                   "args", "args[1] (sm_scale) must be a number, got ", scale.repr());
  FLASHINFER_CHECK(!o.sinks, op, "sinks",
                   "give the sink once (positionally, as the variant's argument)");
  const double sm_scale = scale.as_float();
  FLASHINFER_CHECK(std::isfinite(sm_scale), op, "args", "args[1] (sm_scale) must be finite, got ",
                   sm_scale);
  // The variant's sm_scale replaces plan's: scores scale by q_scale and k_scale too.
  FLASHINFER_CHECK(s.sm_scale != 0.0, op, "sm_scale",
                   "plan's sm_scale is 0; the variant's sm_scale cannot replace it");
  r.sinks = sink.as_tensor();
  r.q_scale = o.q_scale.value_or(1.0) * (sm_scale / s.sm_scale);
  return r;
}

}  // namespace api

}  // namespace flashinfer
