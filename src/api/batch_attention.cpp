// BatchAttention (flashinfer.attention._core): upstream's persistent batch attention, computed on
// the batch-attention plan/run path of the paged wrappers (attention_common.h). plan() checks and
// keeps the page table on the host; the device copy is made where run()'s q lives.
#include "flashinfer/ops/batch_attention.h"

#include <cmath>

#include "api/arg_traits.h"
#include "api/attention_common.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "core/cuda_runtime.h"

namespace flashinfer {
namespace {

constexpr const char* kBatchAttentionModule = "flashinfer.attention._core";

using BatchAttentionInit = Init<BatchAttention, std::string, std::string>;

double batch_attention_scale_of(const std::optional<ScalarOrTensor<double>>& x, const char* op,
                                const char* arg) {
  if (!x) return 1.0;
  return api::fused_scale_value(*x, op, arg);
}

}  // namespace

BatchAttention::BatchAttention(std::string kv_layout, std::string device)
    : s_(std::make_unique<detail::WrapperState>()) {
  call_init<BatchAttentionInit>(
      [&] {
        const char* op = "BatchAttention.__init__";
        s_->hnd = api::parse_kv_layout(kv_layout, op, "kv_layout");
        try {
          (void)Device::parse(device);
        } catch (const Error&) {
          FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, "device",
                          "expected \"cpu\", \"cuda\" or \"cuda:N\", got \"", device, "\"");
        }
        // plan() builds on upstream's workspace device (home_device) where this process has it,
        // so that a run captured into a CUDA graph finds its plan there (its first run on a
        // device copies the plan there, which a capture refuses); a run on another device copies
        // the plan there.
        const Device d = Device::parse(device);
        s_->home_device = !d.is_cuda() ? -1 : device == "cuda" ? -2 : d.index;
        s_->device = Device::cpu();
      },
      *this, kv_layout, device);
}

BatchAttention::~BatchAttention() = default;

void BatchAttention::plan(const Tensor& qo_indptr, const Tensor& kv_indptr,
                          const Tensor& kv_indices, const Tensor& kv_len_arr, int64_t num_qo_heads,
                          int64_t num_kv_heads, int64_t head_dim_qk, int64_t head_dim_vo,
                          int64_t page_size, bool causal, std::optional<double> sm_scale,
                          std::optional<double> logits_soft_cap, DType q_data_type,
                          DType kv_data_type, bool use_profiler) {
  call_op<&BatchAttention::plan>(
      [&] {
        const char* op = "BatchAttention.plan";
        detail::WrapperState& s = *s_;
        s.planned = false;
        FLASHINFER_CHECK_CODE(!use_profiler, ErrorCode::kUnsupported, op, "use_profiler",
                              "the profiler is not supported");
        api::plan_settings(s, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, q_data_type,
                           kv_data_type, std::nullopt, sm_scale, -1, logits_soft_cap, "NONE", op);
        FLASHINFER_CHECK(page_size >= 1, op, "page_size", "must be >= 1, got ", page_size);
        // The page table of the tokens each request uses: upstream's kv_len_arr may leave
        // trailing pages unread, which the shared page-table form (last_page_len) cannot say.
        const std::vector<int32_t> indptr = api::index_to_host(kv_indptr, op, "kv_indptr");
        FLASHINFER_CHECK(!indptr.empty(), op, "kv_indptr", "must have batch + 1 entries");
        api::check_indptr(indptr, op, "kv_indptr");
        const int64_t batch = static_cast<int64_t>(indptr.size()) - 1;
        const std::vector<int32_t> lens = api::index_to_host(kv_len_arr, op, "kv_len_arr", batch);
        const std::vector<int32_t> pages = api::index_to_host(kv_indices, op, "kv_indices");
        FLASHINFER_CHECK(static_cast<int64_t>(pages.size()) >= indptr.back(), op, "kv_indices",
                         "has ", pages.size(), " entries but kv_indptr ends at ", indptr.back());
        std::vector<int32_t> ip{0}, ix, last;
        for (int64_t b = 0; b < batch; ++b) {
          const int64_t have = indptr[b + 1] - indptr[b];
          FLASHINFER_CHECK(lens[b] >= 0 && lens[b] <= have * page_size, op, "kv_len_arr",
                           "request ", b, " has ", lens[b], " tokens but ", have,
                           " pages of page_size ", page_size);
          const int64_t need = (lens[b] + page_size - 1) / page_size;
          for (int64_t p = 0; p < need; ++p) ix.push_back(pages[indptr[b] + p]);
          ip.push_back(static_cast<int32_t>(ix.size()));
          last.push_back(need == 0 ? 0 : static_cast<int32_t>(lens[b] - (need - 1) * page_size));
        }
        auto host = [](const std::vector<int32_t>& v) {
          Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kInt32);
          std::copy(v.begin(), v.end(), t.data<int32_t>());
          return t;
        };
        api::load_page_table(s, host(ip), host(ix), host(last), page_size, op, "kv_indptr",
                             "kv_indices", "kv_len_arr");
        s.decode = false;
        s.qo_indptr = api::index_to_host(qo_indptr, op, "qo_indptr", batch + 1);
        api::check_indptr(s.qo_indptr, op, "qo_indptr");
        s.batch = static_cast<int32_t>(batch);
        s.total_qo = s.qo_indptr.back();
        s.causal = causal;
        for (int32_t b = 0; causal && b < s.batch; ++b) {
          const int32_t qo_len = s.qo_indptr[b + 1] - s.qo_indptr[b];
          FLASHINFER_CHECK(s.kv_lens[b] >= qo_len, op, "causal", "request ", b, " has qo_len ",
                           qo_len, " > kv_len ", s.kv_lens[b],
                           " (causal masks are right-aligned and need kv_len >= qo_len)");
        }
        // No split-KV: upstream's wrapper owns its workspace, so there is no caller buffer to
        // hold partials. Built on the constructor's device where this process has it (not the
        // last run's); run() on another device copies it there.
        s.device = Device::cpu();
        if (s.home_device != -1 && cuda_device_count() > 0) {
          const int index = s.home_device == -2 ? detail::cuda_current_device() : s.home_device;
          if (index < cuda_device_count()) s.device = Device::cuda(index);
        }
        s.float_workspace = Tensor::empty({4}, DType::kUInt8, s.device);
        api::build_plan(s, std::nullopt, /*disable_split_kv=*/true, op);
      },
      *this, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_qo_heads, num_kv_heads, head_dim_qk,
      head_dim_vo, page_size, causal, sm_scale, logits_soft_cap, q_data_type, kv_data_type,
      use_profiler);
}

AttentionOutput BatchAttention::run(const Tensor& q, const PagedKVCache& kv_cache,
                                    std::optional<Tensor> out, std::optional<Tensor> lse,
                                    std::optional<ScalarOrTensor<double>> k_scale,
                                    std::optional<ScalarOrTensor<double>> v_scale,
                                    std::optional<double> logits_soft_cap,
                                    std::optional<Tensor> profiler_buffer,
                                    std::optional<PagedKVCache> kv_cache_sf) {
  return call_op<&BatchAttention::run>(
      [&] {
        const char* op = "BatchAttention.run";
        detail::WrapperState& s = *s_;
        FLASHINFER_CHECK(s.planned, op, "self", "run() called before plan()");
        FLASHINFER_CHECK_CODE(!profiler_buffer, ErrorCode::kUnsupported, op, "profiler_buffer",
                              "the profiler is not supported");
        api::check_defined(q, op, "q");
        const double cap = logits_soft_cap.value_or(0.0);
        FLASHINFER_CHECK(cap >= 0.0 && std::isfinite(cap), op, "logits_soft_cap",
                         "must be finite and >= 0, got ", cap);
        AttentionRunOptions o;
        o.k_scale = batch_attention_scale_of(k_scale, op, "k_scale");
        o.v_scale = batch_attention_scale_of(v_scale, op, "v_scale");
        o.out = out;
        o.lse = lse;
        o.return_lse = true;
        // NVFP4 (uint8 cache): the paged wrappers' path, dequantized pages on the CPU
        // (attention_nvfp4.cpp); upstream unpacks kv_cache_sf like kv_cache.
        o.kv_cache_sf = kv_cache_sf;
        if (q.device() != s.device) {  // the plan's first run on this device: copy it there
          s.device = q.device();
          s.float_workspace = Tensor::empty({4}, DType::kUInt8, s.device);
          api::build_plan(s, std::nullopt, true, op);
        }
        auto [k, v] = api::paged_cache_views(kv_cache, s.hnd, op, "kv_cache");
        const double planned_cap = s.logits_soft_cap;
        if (cap > 0.0) s.logits_soft_cap = cap;
        AttentionOutput r;
        try {
          r = api::run_planned(s, q, k, v, o, op, "kv_cache", "kv_cache");
        } catch (...) {
          s.logits_soft_cap = planned_cap;
          throw;
        }
        s.logits_soft_cap = planned_cap;
        return r;
      },
      *this, q, kv_cache, out, lse, k_scale, v_scale, logits_soft_cap, profiler_buffer,
      kv_cache_sf);
}

namespace {

// Bench hook: batch_size requests of s_qo queries against s_kv keys (causal with s.causal).
BenchCase bench_batch_attention(const BenchShape& s, Device dev) {
  api::bench::BenchPages p = api::bench::bench_pages(s, dev);
  std::vector<int64_t> qo, lens;
  for (int64_t b = 0; b <= s.batch_size; ++b) qo.push_back(b * s.s_qo);
  for (int64_t b = 0; b < s.batch_size; ++b) lens.push_back(s.s_kv);
  auto w = std::make_shared<BatchAttention>("NHD", dev.is_cuda() ? "cuda" : "cpu");
  w->plan(api::bench::int32_tensor(qo, dev), p.indptr, p.indices,
          api::bench::int32_tensor(lens, dev), s.num_qo_heads, s.num_kv_heads, s.head_dim_qk,
          s.head_dim_vo, s.page_size, s.causal, std::nullopt, std::nullopt, s.q_dtype, s.kv_dtype);
  const int64_t rows = s.batch_size * s.s_qo;
  BenchCase c = api::bench::invoke_case(
      "BatchAttention.run", {api::bench::bench_object(w),
                             Value(api::bench::random_tensor({rows, s.num_qo_heads, s.head_dim_qk},
                                                             s.q_dtype, dev, s.random_seed)),
                             Value::tuple({p.k, p.v})});
  c.flops = static_cast<double>(s.batch_size) *
            api::bench::attention_flops(s.s_qo, s.s_kv, s.num_qo_heads, s.head_dim_qk,
                                        s.head_dim_vo, s.causal);
  c.bytes = api::bench::bench_attention_bytes(s, rows, s.batch_size * s.s_kv);
  return c;
}

}  // namespace

namespace detail {
void register_batch_attention_ops(OpRegistry& r) {
  declare_init<BatchAttentionInit>(
      r,
      {.name = "BatchAttention.__init__",
       .module = kBatchAttentionModule,
       .summary = "Persistent batch attention over a paged KV cache (mixed prefill and decode)"},
      arg("kv_layout", "NHD"), arg("device", "cuda"));
  declare<&BatchAttention::plan>(
      r,
      {.name = "BatchAttention.plan",
       .module = kBatchAttentionModule,
       .summary = "Validates the batch layout and builds the work partition"},
      "qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr", "num_qo_heads", "num_kv_heads",
      "head_dim_qk", "head_dim_vo", "page_size", arg("causal", false), "sm_scale",
      "logits_soft_cap", arg("q_data_type", DType::kBFloat16),
      arg("kv_data_type", DType::kBFloat16), arg("use_profiler", false));
  declare<&BatchAttention::run>(
      r,
      {.name = "BatchAttention.run",
       .module = kBatchAttentionModule,
       .summary = "Batch attention with the current plan; returns (out, lse)"},
      "q", "kv_cache", arg("out").mut(), arg("lse").mut(), "k_scale", "v_scale",
      arg("logits_soft_cap", 0.0), "profiler_buffer", "kv_cache_sf");
  api::register_attention_backends("BatchAttention.__init__");
  api::register_attention_backends("BatchAttention.plan");
  api::register_attention_backends("BatchAttention.run");
  register_bench_hook("BatchAttention.run", bench_batch_attention);
}
}  // namespace detail

}  // namespace flashinfer
