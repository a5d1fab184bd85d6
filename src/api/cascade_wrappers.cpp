// Cascade attention wrappers (flashinfer.cascade): MultiLevelCascadeAttentionWrapper and the two
// shared-prefix wrappers. Each level runs the batch-attention plan/run path of the paged wrappers
// (attention_common.h) with its LSE, and the states are merged with merge_state_in_place, as
// upstream composes them; errors name these classes' own ops and arguments.
#include "flashinfer/ops/cascade_wrappers.h"

#include <cmath>

#include "api/arg_traits.h"
#include "api/attention_common.h"
#include "api/attention_pos_encoding.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "flashinfer/ops/cascade.h"

namespace flashinfer {
namespace {

constexpr const char* kCascadeWrappersModule = "flashinfer.cascade";
constexpr const char* kMulti = "MultiLevelCascadeAttentionWrapper";
constexpr const char* kDecodeShared = "BatchDecodeWithSharedPrefixPagedKVCacheWrapper";
constexpr const char* kPrefillShared = "BatchPrefillWithSharedPrefixPagedKVCacheWrapper";

using MultiInit = Init<MultiLevelCascadeAttentionWrapper, int64_t, Tensor, std::string, bool,
                       std::optional<std::vector<Tensor>>, std::optional<std::vector<Tensor>>,
                       std::optional<std::vector<Tensor>>, std::optional<std::vector<Tensor>>>;
using DecodeSharedInit = Init<BatchDecodeWithSharedPrefixPagedKVCacheWrapper, Tensor, std::string>;
using PrefillSharedInit =
    Init<BatchPrefillWithSharedPrefixPagedKVCacheWrapper, Tensor, std::string>;

// qo_indptr → host (batch + 1 entries, from 0, non-decreasing); causal needs kv_len >= qo_len.
void cascade_wrappers_load_qo(detail::WrapperState& s, const Tensor& qo_indptr, bool causal,
                              const char* op, const char* arg) {
  s.qo_indptr = api::index_to_host(qo_indptr, op, arg, static_cast<int64_t>(s.kv_lens.size()) + 1);
  api::check_indptr(s.qo_indptr, op, arg);
  s.batch = static_cast<int32_t>(s.kv_lens.size());
  s.total_qo = s.qo_indptr.back();
  s.causal = causal;
  if (!causal) return;
  for (int32_t b = 0; b < s.batch; ++b) {
    const int32_t qo_len = s.qo_indptr[b + 1] - s.qo_indptr[b];
    FLASHINFER_CHECK(s.kv_lens[b] >= qo_len, op, "causal", "request ", b, " has qo_len ", qo_len,
                     " > kv_len ", s.kv_lens[b],
                     " (causal masks are right-aligned and need kv_len >= qo_len)");
  }
}

// A shared prefix k or v: [prefix_len, Hkv, D] (NHD) or [Hkv, prefix_len, D] (HND), the unique
// cache's dtype, on q's device. Returns prefix_len.
int64_t check_shared(const Tensor& t, const detail::WrapperState& s, const Tensor& q,
                     const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  api::check_dim(t, {3}, op, arg);
  const int64_t heads = s.hnd ? t.size(0) : t.size(1);
  const int64_t len = s.hnd ? t.size(1) : t.size(0);
  FLASHINFER_CHECK(heads == s.num_kv_heads && t.size(2) == s.head_dim_qk, op, arg, "has ", heads,
                   " heads of dim ", t.size(2), ", expected ", s.num_kv_heads, " of dim ",
                   s.head_dim_qk, s.hnd ? " (HND: [Hkv, prefix_len, D])" : "");
  FLASHINFER_CHECK(t.dtype() == s.kv_dtype, op, arg, "dtype ", dtype_torch_name(t.dtype()),
                   " must be the unique KV cache's dtype ", dtype_torch_name(s.kv_dtype));
  api::check_same_device(t, q, op, arg, "q");
  FLASHINFER_CHECK(t.stride(2) == 1, op, arg, "the head_dim axis must be contiguous");
  return len;
}

// q's dtype (and the output's) and the unique cache's dtype, taken at forward(): the shared-prefix
// plans (begin_forward) do not name q's dtype.
void take_dtypes(detail::WrapperState& s, const Tensor& q, const Tensor& k, const char* op) {
  api::check_defined(q, op, "q");
  api::check_q_dtype(q.dtype(), op, "q");
  api::check_kv_dtype(k.dtype(), q.dtype(), op, "unique_kv_cache");
  s.q_dtype = q.dtype();
  s.o_dtype = q.dtype();
  s.kv_dtype = k.dtype();
}

// The shared part (all of q against the prefix, no mask) merged with the unique part's state.
Tensor shared_then_merge(const detail::WrapperState& s, const Tensor& q, const Tensor& k_shared,
                         const Tensor& v_shared, const AttentionOutput& unique) {
  AttentionOutput shared = single_prefill_with_kv_cache(
      q, k_shared, v_shared, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
      std::nullopt, /*causal=*/false, s.hnd ? "HND" : "NHD", "NONE", false, s.sm_scale, -1,
      std::nullopt, std::nullopt, std::nullopt, "auto", /*return_lse=*/true);
  merge_state_in_place(shared.out, shared.lse, unique.out, unique.lse);
  return shared.out;
}

AttentionRunOptions with_lse() {
  AttentionRunOptions o;
  o.return_lse = true;
  return o;
}

}  // namespace

// ---- MultiLevelCascadeAttentionWrapper -------------------------------------------------------

MultiLevelCascadeAttentionWrapper::MultiLevelCascadeAttentionWrapper(
    int64_t num_levels, Tensor float_workspace_buffer, std::string kv_layout, bool use_cuda_graph,
    std::optional<std::vector<Tensor>> qo_indptr_buf_arr,
    std::optional<std::vector<Tensor>> paged_kv_indptr_buf_arr,
    std::optional<std::vector<Tensor>> paged_kv_indices_buf_arr,
    std::optional<std::vector<Tensor>> paged_kv_last_page_len_buf_arr) {
  call_init<MultiInit>(
      [&] {
        const char* op = "MultiLevelCascadeAttentionWrapper.__init__";
        FLASHINFER_CHECK(num_levels >= 1, op, "num_levels", "must be >= 1, got ", num_levels);
        for (const auto& [list, arg] :
             {std::pair{&qo_indptr_buf_arr, "qo_indptr_buf_arr"},
              std::pair{&paged_kv_indptr_buf_arr, "paged_kv_indptr_buf_arr"},
              std::pair{&paged_kv_indices_buf_arr, "paged_kv_indices_buf_arr"},
              std::pair{&paged_kv_last_page_len_buf_arr, "paged_kv_last_page_len_buf_arr"}}) {
          if (!*list) continue;
          FLASHINFER_CHECK(static_cast<int64_t>((*list)->size()) == num_levels, op, arg, "has ",
                           (*list)->size(), " entries, expected num_levels = ", num_levels);
          for (const Tensor& t : **list) api::check_defined(t, op, arg);
        }
        levels_.clear();
        for (int64_t i = 0; i < num_levels; ++i) {
          auto s = std::make_unique<detail::WrapperState>();
          api::init_wrapper(*s, float_workspace_buffer, kv_layout, use_cuda_graph, "auto",
                            std::nullopt, op);
          if (paged_kv_indices_buf_arr) {
            api::set_graph_buffers(*s, (*paged_kv_indices_buf_arr)[static_cast<std::size_t>(i)],
                                   std::nullopt);
          }
          levels_.push_back(std::move(s));
        }
      },
      *this, num_levels, float_workspace_buffer, kv_layout, use_cuda_graph, qo_indptr_buf_arr,
      paged_kv_indptr_buf_arr, paged_kv_indices_buf_arr, paged_kv_last_page_len_buf_arr);
}

MultiLevelCascadeAttentionWrapper::~MultiLevelCascadeAttentionWrapper() = default;

int64_t MultiLevelCascadeAttentionWrapper::num_levels() const {
  return static_cast<int64_t>(levels_.size());
}

void MultiLevelCascadeAttentionWrapper::plan(
    const std::vector<Tensor>& qo_indptr_arr, const std::vector<Tensor>& paged_kv_indptr_arr,
    const std::vector<Tensor>& paged_kv_indices_arr,
    const std::vector<Tensor>& paged_kv_last_page_len, int64_t num_qo_heads, int64_t num_kv_heads,
    int64_t head_dim, int64_t page_size, bool causal, std::string_view pos_encoding_mode,
    bool use_fp16_qk_reduction, std::optional<double> sm_scale, int64_t window_left,
    std::optional<double> logits_soft_cap, std::optional<double> rope_scale,
    std::optional<double> rope_theta, DType q_data_type, std::optional<DType> kv_data_type) {
  call_op<&MultiLevelCascadeAttentionWrapper::plan>(
      [&] {
        const char* op = "MultiLevelCascadeAttentionWrapper.plan";
        const auto n = levels_.size();
        for (const auto& [list, arg] :
             {std::pair{&qo_indptr_arr, "qo_indptr_arr"},
              std::pair{&paged_kv_indptr_arr, "paged_kv_indptr_arr"},
              std::pair{&paged_kv_indices_arr, "paged_kv_indices_arr"},
              std::pair{&paged_kv_last_page_len, "paged_kv_last_page_len"}}) {
          FLASHINFER_CHECK(list->size() == n, op, arg, "has ", list->size(),
                           " entries, expected num_levels = ", n);
        }
        for (auto& s : levels_) s->planned = false;
        api::check_head_dim(head_dim, op, "head_dim");
        for (std::size_t i = 0; i < n; ++i) {
          detail::WrapperState& s = *levels_[i];
          api::plan_settings(s, num_qo_heads, num_kv_heads, head_dim, head_dim, q_data_type,
                             kv_data_type, std::nullopt, sm_scale, window_left, logits_soft_cap,
                             "NONE", op);
          s.decode = false;
          // Upstream plans every level's prefill wrapper with the same pos_encoding_mode,
          // rope_scale and rope_theta: each level rotates at its own positions.
          api::plan_pos_encoding(s, pos_encoding_mode, rope_scale, rope_theta, op);
          api::load_page_table(s, paged_kv_indptr_arr[i], paged_kv_indices_arr[i],
                               paged_kv_last_page_len[i], page_size, op, "paged_kv_indptr_arr",
                               "paged_kv_indices_arr", "paged_kv_last_page_len");
          // Upstream: the causal mask applies to the last level only.
          cascade_wrappers_load_qo(s, qo_indptr_arr[i], causal && i + 1 == n, op, "qo_indptr_arr");
          FLASHINFER_CHECK(s.total_qo == levels_[0]->total_qo, op, "qo_indptr_arr", "level ", i,
                           " covers ", s.total_qo, " queries but level 0 covers ",
                           levels_[0]->total_qo, " (every level partitions the same q rows)");
          api::build_plan(s, std::nullopt, false, op);
        }
        (void)use_fp16_qk_reduction;  // scores are always fp32
      },
      *this, qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr, paged_kv_last_page_len,
      num_qo_heads, num_kv_heads, head_dim, page_size, causal, pos_encoding_mode,
      use_fp16_qk_reduction, sm_scale, window_left, logits_soft_cap, rope_scale, rope_theta,
      q_data_type, kv_data_type);
}

Tensor MultiLevelCascadeAttentionWrapper::run(const Tensor& q, const PagedKVCache& paged_kv_cache) {
  return call_op<&MultiLevelCascadeAttentionWrapper::run>(
      [&] {
        const char* op = "MultiLevelCascadeAttentionWrapper.run";
        for (const auto& s : levels_) {
          FLASHINFER_CHECK(s->planned, op, "self", "run() called before plan()");
        }
        auto [k, v] = api::paged_cache_views(paged_kv_cache, levels_[0]->hnd, op, "paged_kv_cache");
        // Upstream: the last level's state, then each other level merged into it.
        AttentionOutput acc = api::run_planned(*levels_.back(), q, k, v, with_lse(), op,
                                               "paged_kv_cache", "paged_kv_cache");
        for (std::size_t i = 0; i + 1 < levels_.size(); ++i) {
          AttentionOutput r = api::run_planned(*levels_[i], q, k, v, with_lse(), op,
                                               "paged_kv_cache", "paged_kv_cache");
          merge_state_in_place(acc.out, acc.lse, r.out, r.lse);
        }
        return acc.out;
      },
      *this, q, paged_kv_cache);
}

// ---- BatchDecodeWithSharedPrefixPagedKVCacheWrapper -------------------------------------------

BatchDecodeWithSharedPrefixPagedKVCacheWrapper::BatchDecodeWithSharedPrefixPagedKVCacheWrapper(
    Tensor float_workspace_buffer, std::string kv_layout)
    : s_(std::make_unique<detail::WrapperState>()) {
  call_init<DecodeSharedInit>(
      [&] {
        api::init_wrapper(*s_, float_workspace_buffer, kv_layout, false, "auto", std::nullopt,
                          "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.__init__");
      },
      *this, float_workspace_buffer, kv_layout);
}

BatchDecodeWithSharedPrefixPagedKVCacheWrapper::~BatchDecodeWithSharedPrefixPagedKVCacheWrapper() =
    default;

void BatchDecodeWithSharedPrefixPagedKVCacheWrapper::begin_forward(
    const Tensor& unique_kv_indptr, const Tensor& unique_kv_indices,
    const Tensor& unique_kv_last_page_len, int64_t num_qo_heads, int64_t num_kv_heads,
    int64_t head_dim, int64_t page_size, DType data_type) {
  call_op<&BatchDecodeWithSharedPrefixPagedKVCacheWrapper::begin_forward>(
      [&] {
        const char* op = "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.begin_forward";
        detail::WrapperState& s = *s_;
        s.planned = false;
        // data_type is the KV dtype; q's dtype is taken at forward().
        api::check_head_dim(head_dim, op, "head_dim");
        const DType q_placeholder = dtype_is_fp8(data_type) ? DType::kFloat16 : data_type;
        api::check_q_dtype(q_placeholder, op, "data_type");
        api::plan_settings(s, num_qo_heads, num_kv_heads, head_dim, head_dim, q_placeholder,
                           data_type, std::nullopt, std::nullopt, -1, std::nullopt, "NONE", op);
        api::load_page_table(s, unique_kv_indptr, unique_kv_indices, unique_kv_last_page_len,
                             page_size, op, "unique_kv_indptr", "unique_kv_indices",
                             "unique_kv_last_page_len");
        s.batch = static_cast<int32_t>(s.kv_lens.size());
        s.decode = true;
        s.q_len_per_req = 1;
        s.causal = false;
        s.qo_indptr.resize(static_cast<std::size_t>(s.batch) + 1);
        for (int32_t b = 0; b <= s.batch; ++b) s.qo_indptr[b] = b;
        s.total_qo = s.batch;
        api::build_plan(s, std::nullopt, false, op);
      },
      *this, unique_kv_indptr, unique_kv_indices, unique_kv_last_page_len, num_qo_heads,
      num_kv_heads, head_dim, page_size, data_type);
}

Tensor BatchDecodeWithSharedPrefixPagedKVCacheWrapper::forward(
    const Tensor& q, const Tensor& k_shared, const Tensor& v_shared,
    const PagedKVCache& unique_kv_cache) {
  return call_op<&BatchDecodeWithSharedPrefixPagedKVCacheWrapper::forward>(
      [&] {
        const char* op = "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.forward";
        detail::WrapperState& s = *s_;
        FLASHINFER_CHECK(s.planned, op, "self", "forward() called before begin_forward()");
        auto [k, v] = api::paged_cache_views(unique_kv_cache, s.hnd, op, "unique_kv_cache");
        const DType planned_kv = s.kv_dtype;
        FLASHINFER_CHECK(k.dtype() == planned_kv, op, "unique_kv_cache", "dtype ",
                         dtype_torch_name(k.dtype()), " does not match begin_forward's data_type ",
                         dtype_torch_name(planned_kv));
        take_dtypes(s, q, k, op);
        const int64_t lk = check_shared(k_shared, s, q, op, "k_shared");
        const int64_t lv = check_shared(v_shared, s, q, op, "v_shared");
        FLASHINFER_CHECK(lk == lv, op, "v_shared", "has ", lv, " tokens but k_shared has ", lk);
        AttentionOutput unique =
            api::run_planned(s, q, k, v, with_lse(), op, "unique_kv_cache", "unique_kv_cache");
        return shared_then_merge(s, q, k_shared, v_shared, unique);
      },
      *this, q, k_shared, v_shared, unique_kv_cache);
}

void BatchDecodeWithSharedPrefixPagedKVCacheWrapper::end_forward() {
  call_op<&BatchDecodeWithSharedPrefixPagedKVCacheWrapper::end_forward>([] {}, *this);
}

// ---- BatchPrefillWithSharedPrefixPagedKVCacheWrapper ------------------------------------------

BatchPrefillWithSharedPrefixPagedKVCacheWrapper::BatchPrefillWithSharedPrefixPagedKVCacheWrapper(
    Tensor float_workspace_buffer, std::string kv_layout)
    : s_(std::make_unique<detail::WrapperState>()) {
  call_init<PrefillSharedInit>(
      [&] {
        api::init_wrapper(*s_, float_workspace_buffer, kv_layout, false, "auto", std::nullopt,
                          "BatchPrefillWithSharedPrefixPagedKVCacheWrapper.__init__");
      },
      *this, float_workspace_buffer, kv_layout);
}

BatchPrefillWithSharedPrefixPagedKVCacheWrapper::
    ~BatchPrefillWithSharedPrefixPagedKVCacheWrapper() = default;

void BatchPrefillWithSharedPrefixPagedKVCacheWrapper::begin_forward(
    const Tensor& qo_indptr, const Tensor& paged_kv_indptr, const Tensor& paged_kv_indices,
    const Tensor& paged_kv_last_page_len, int64_t num_qo_heads, int64_t num_kv_heads,
    int64_t head_dim, int64_t page_size) {
  call_op<&BatchPrefillWithSharedPrefixPagedKVCacheWrapper::begin_forward>(
      [&] {
        const char* op = "BatchPrefillWithSharedPrefixPagedKVCacheWrapper.begin_forward";
        detail::WrapperState& s = *s_;
        s.planned = false;
        api::check_head_dim(head_dim, op, "head_dim");
        // The dtypes are taken at forward(); causal and sm_scale too (upstream's forward sets
        // them), so the plan here is the unmasked one (the work partition does not depend on
        // them).
        api::plan_settings(s, num_qo_heads, num_kv_heads, head_dim, head_dim, DType::kFloat16,
                           std::nullopt, std::nullopt, std::nullopt, -1, std::nullopt, "NONE", op);
        api::load_page_table(s, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                             page_size, op, "paged_kv_indptr", "paged_kv_indices",
                             "paged_kv_last_page_len");
        s.decode = false;
        cascade_wrappers_load_qo(s, qo_indptr, false, op, "qo_indptr");
        api::build_plan(s, std::nullopt, false, op);
      },
      *this, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
      num_kv_heads, head_dim, page_size);
}

Tensor BatchPrefillWithSharedPrefixPagedKVCacheWrapper::forward(
    const Tensor& q, const Tensor& k_shared, const Tensor& v_shared,
    const PagedKVCache& unique_kv_cache, bool causal, bool use_fp16_qk_reduction,
    std::optional<double> sm_scale, std::optional<double> rope_scale,
    std::optional<double> rope_theta) {
  return call_op<&BatchPrefillWithSharedPrefixPagedKVCacheWrapper::forward>(
      [&] {
        const char* op = "BatchPrefillWithSharedPrefixPagedKVCacheWrapper.forward";
        detail::WrapperState& s = *s_;
        FLASHINFER_CHECK(s.planned, op, "self", "forward() called before begin_forward()");
        auto [k, v] = api::paged_cache_views(unique_kv_cache, s.hnd, op, "unique_kv_cache");
        take_dtypes(s, q, k, op);
        const double scale = sm_scale.value_or(1.0 / std::sqrt(static_cast<double>(s.head_dim_qk)));
        FLASHINFER_CHECK(std::isfinite(scale), op, "sm_scale", "must be finite, got ", scale);
        s.sm_scale = scale;
        s.causal = false;
        if (causal) {
          for (int32_t b = 0; b < s.batch; ++b) {
            const int32_t qo_len = s.qo_indptr[b + 1] - s.qo_indptr[b];
            FLASHINFER_CHECK(s.kv_lens[b] >= qo_len, op, "causal", "request ", b, " has qo_len ",
                             qo_len, " > unique kv_len ", s.kv_lens[b],
                             " (causal masks are right-aligned and need kv_len >= qo_len)");
          }
        }
        s.causal = causal;
        const int64_t lk = check_shared(k_shared, s, q, op, "k_shared");
        const int64_t lv = check_shared(v_shared, s, q, op, "v_shared");
        FLASHINFER_CHECK(lk == lv, op, "v_shared", "has ", lv, " tokens but k_shared has ", lk);
        (void)use_fp16_qk_reduction;  // scores are always fp32
        (void)rope_scale;             // no positional encoding ("NONE", as upstream here)
        (void)rope_theta;
        AttentionOutput unique =
            api::run_planned(s, q, k, v, with_lse(), op, "unique_kv_cache", "unique_kv_cache");
        return shared_then_merge(s, q, k_shared, v_shared, unique);
      },
      *this, q, k_shared, v_shared, unique_kv_cache, causal, use_fp16_qk_reduction, sm_scale,
      rope_scale, rope_theta);
}

void BatchPrefillWithSharedPrefixPagedKVCacheWrapper::end_forward() {
  call_op<&BatchPrefillWithSharedPrefixPagedKVCacheWrapper::end_forward>([] {}, *this);
}

namespace {

// Bench hooks. Shapes as the paged wrappers' (head_dim_vo is taken equal to head_dim_qk: these
// wrappers have one head_dim). Multi-level: level 0 is request 0's pages shared by every query,
// level 1 each request's own pages (causal with s.causal). Shared prefix: an s_kv-token prefix
// plus each request's s_kv unique tokens.
BenchShape one_dim(BenchShape s) {
  s.head_dim_vo = s.head_dim_qk;
  return s;
}

Tensor cascade_wrappers_bench_indptr(int64_t n, int64_t per, Device dev) {
  std::vector<int64_t> v;
  for (int64_t b = 0; b <= n; ++b) v.push_back(b * per);
  return api::bench::int32_tensor(v, dev);
}

BenchCase bench_multi_level(const BenchShape& shape, Device dev) {
  const BenchShape s = one_dim(shape);
  api::bench::BenchPages p = api::bench::bench_pages(s, dev);
  const int64_t per = (s.s_kv + s.page_size - 1) / s.page_size;
  const int64_t rows = s.batch_size * s.s_qo;
  auto w = std::make_shared<MultiLevelCascadeAttentionWrapper>(
      2, Tensor::empty({16 << 20}, DType::kUInt8, dev));
  w->plan({cascade_wrappers_bench_indptr(1, rows, dev),
           cascade_wrappers_bench_indptr(s.batch_size, s.s_qo, dev)},
          {cascade_wrappers_bench_indptr(1, per, dev), p.indptr},
          {p.indices.slice(0, 0, per), p.indices},
          {p.last_page_len.slice(0, 0, 1), p.last_page_len}, s.num_qo_heads, s.num_kv_heads,
          s.head_dim_qk, s.page_size, s.causal, "NONE", false, std::nullopt, -1, std::nullopt,
          std::nullopt, std::nullopt, s.q_dtype, s.kv_dtype);
  BenchCase c = api::bench::invoke_case(
      std::string(kMulti) + ".run",
      {api::bench::bench_object(w),
       Value(api::bench::random_tensor({rows, s.num_qo_heads, s.head_dim_qk}, s.q_dtype, dev,
                                       s.random_seed)),
       Value::tuple({p.k, p.v})});
  c.flops = static_cast<double>(s.batch_size) *
            (api::bench::attention_flops(s.s_qo, s.s_kv, s.num_qo_heads, s.head_dim_qk,
                                         s.head_dim_vo, false) +
             api::bench::attention_flops(s.s_qo, s.s_kv, s.num_qo_heads, s.head_dim_qk,
                                         s.head_dim_vo, s.causal));
  c.bytes = api::bench::bench_attention_bytes(s, rows, (s.batch_size + 1) * s.s_kv);
  return c;
}

BenchCase bench_shared_prefix(const BenchShape& shape, Device dev, bool decode) {
  const BenchShape s = one_dim(shape);
  api::bench::BenchPages p = api::bench::bench_pages(s, dev);
  const int64_t q_per = decode ? 1 : s.s_qo, rows = s.batch_size * q_per;
  Tensor ws = Tensor::empty({16 << 20}, DType::kUInt8, dev);
  std::shared_ptr<ApiObject> w;
  if (decode) {
    auto d = std::make_shared<BatchDecodeWithSharedPrefixPagedKVCacheWrapper>(ws);
    d->begin_forward(p.indptr, p.indices, p.last_page_len, s.num_qo_heads, s.num_kv_heads,
                     s.head_dim_qk, s.page_size, s.kv_dtype);
    w = d;
  } else {
    auto f = std::make_shared<BatchPrefillWithSharedPrefixPagedKVCacheWrapper>(ws);
    f->begin_forward(cascade_wrappers_bench_indptr(s.batch_size, q_per, dev), p.indptr, p.indices,
                     p.last_page_len, s.num_qo_heads, s.num_kv_heads, s.head_dim_qk, s.page_size);
    w = f;
  }
  std::vector<std::pair<std::string, Value>> kw;
  if (!decode) kw.emplace_back("causal", Value(s.causal));
  BenchCase c = api::bench::invoke_case(
      std::string(decode ? kDecodeShared : kPrefillShared) + ".forward",
      {api::bench::bench_object(w),
       Value(api::bench::random_tensor({rows, s.num_qo_heads, s.head_dim_qk}, s.q_dtype, dev,
                                       s.random_seed)),
       Value(api::bench::random_tensor({s.s_kv, s.num_kv_heads, s.head_dim_qk}, s.kv_dtype, dev,
                                       s.random_seed + 3)),
       Value(api::bench::random_tensor({s.s_kv, s.num_kv_heads, s.head_dim_qk}, s.kv_dtype, dev,
                                       s.random_seed + 4)),
       Value::tuple({p.k, p.v})},
      std::move(kw));
  c.flops = api::bench::attention_flops(rows, s.s_kv, s.num_qo_heads, s.head_dim_qk, s.head_dim_vo,
                                        false) +
            static_cast<double>(s.batch_size) *
                api::bench::attention_flops(q_per, s.s_kv, s.num_qo_heads, s.head_dim_qk,
                                            s.head_dim_vo, !decode && s.causal);
  c.bytes = api::bench::bench_attention_bytes(s, rows, (s.batch_size + 1) * s.s_kv);
  return c;
}

}  // namespace

namespace detail {
void register_cascade_wrapper_ops(OpRegistry& r) {
  declare_init<MultiInit>(
      r,
      {.name = "MultiLevelCascadeAttentionWrapper.__init__",
       .module = kCascadeWrappersModule,
       .summary = "Multi-level cascade attention over a paged KV cache (plan once, run per layer)"},
      "num_levels", "float_workspace_buffer", arg("kv_layout", "NHD"), arg("use_cuda_graph", false),
      "qo_indptr_buf_arr", "paged_kv_indptr_buf_arr", "paged_kv_indices_buf_arr",
      "paged_kv_last_page_len_buf_arr");
  declare<&MultiLevelCascadeAttentionWrapper::plan>(
      r,
      {.name = "MultiLevelCascadeAttentionWrapper.plan",
       .module = kCascadeWrappersModule,
       .summary = "Plans every level's attention (causal on the last level only)"},
      "qo_indptr_arr", "paged_kv_indptr_arr", "paged_kv_indices_arr", "paged_kv_last_page_len",
      "num_qo_heads", "num_kv_heads", "head_dim", "page_size", arg("causal", false),
      arg("pos_encoding_mode", "NONE"), arg("use_fp16_qk_reduction", false), "sm_scale",
      arg("window_left", -1), "logits_soft_cap", "rope_scale", "rope_theta",
      arg("q_data_type", "float16"), "kv_data_type");
  declare<&MultiLevelCascadeAttentionWrapper::run>(
      r,
      {.name = "MultiLevelCascadeAttentionWrapper.run",
       .module = kCascadeWrappersModule,
       .summary = "Attention of every level, merged (merge_state)"},
      "q", "paged_kv_cache");
  declare_init<DecodeSharedInit>(r,
                                 {.name = "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.__init__",
                                  .module = kCascadeWrappersModule,
                                  .summary = "Batch decode with a shared prefix (cascade)"},
                                 "float_workspace_buffer", arg("kv_layout", "NHD"));
  declare<&BatchDecodeWithSharedPrefixPagedKVCacheWrapper::begin_forward>(
      r,
      {.name = "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.begin_forward",
       .module = kCascadeWrappersModule,
       .summary = "Plans the unique-KV decode"},
      "unique_kv_indptr", "unique_kv_indices", "unique_kv_last_page_len", "num_qo_heads",
      "num_kv_heads", "head_dim", "page_size", arg("data_type", "float16"));
  declare<&BatchDecodeWithSharedPrefixPagedKVCacheWrapper::forward>(
      r,
      {.name = "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.forward",
       .module = kCascadeWrappersModule,
       .summary = "Shared-prefix attention merged with the unique-KV decode"},
      "q", "k_shared", "v_shared", "unique_kv_cache");
  declare<&BatchDecodeWithSharedPrefixPagedKVCacheWrapper::end_forward>(
      r, {.name = "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.end_forward",
          .module = kCascadeWrappersModule,
          .summary = "No-op (upstream's API)"});
  declare_init<PrefillSharedInit>(
      r,
      {.name = "BatchPrefillWithSharedPrefixPagedKVCacheWrapper.__init__",
       .module = kCascadeWrappersModule,
       .summary = "Batch prefill with a shared prefix (cascade)"},
      "float_workspace_buffer", arg("kv_layout", "NHD"));
  declare<&BatchPrefillWithSharedPrefixPagedKVCacheWrapper::begin_forward>(
      r,
      {.name = "BatchPrefillWithSharedPrefixPagedKVCacheWrapper.begin_forward",
       .module = kCascadeWrappersModule,
       .summary = "Plans the unique-KV prefill"},
      "qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "num_qo_heads",
      "num_kv_heads", "head_dim", "page_size");
  declare<&BatchPrefillWithSharedPrefixPagedKVCacheWrapper::forward>(
      r,
      {.name = "BatchPrefillWithSharedPrefixPagedKVCacheWrapper.forward",
       .module = kCascadeWrappersModule,
       .summary = "Shared-prefix attention merged with the unique-KV prefill"},
      "q", "k_shared", "v_shared", "unique_kv_cache", arg("causal", false),
      arg("use_fp16_qk_reduction", false), "sm_scale", "rope_scale", "rope_theta");
  declare<&BatchPrefillWithSharedPrefixPagedKVCacheWrapper::end_forward>(
      r, {.name = "BatchPrefillWithSharedPrefixPagedKVCacheWrapper.end_forward",
          .module = kCascadeWrappersModule,
          .summary = "No-op (upstream's API)"});
  // Each method runs the batch-attention kernels (and the merge): their backends.
  for (const char* name :
       {"MultiLevelCascadeAttentionWrapper.__init__", "MultiLevelCascadeAttentionWrapper.plan",
        "MultiLevelCascadeAttentionWrapper.run",
        "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.__init__",
        "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.begin_forward",
        "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.forward",
        "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.end_forward",
        "BatchPrefillWithSharedPrefixPagedKVCacheWrapper.__init__",
        "BatchPrefillWithSharedPrefixPagedKVCacheWrapper.begin_forward",
        "BatchPrefillWithSharedPrefixPagedKVCacheWrapper.forward",
        "BatchPrefillWithSharedPrefixPagedKVCacheWrapper.end_forward"}) {
    api::register_attention_backends(name);
  }
  register_bench_hook("MultiLevelCascadeAttentionWrapper.run", bench_multi_level);
  register_bench_hook(
      "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.forward",
      [](const BenchShape& s, Device d) { return bench_shared_prefix(s, d, true); });
  register_bench_hook(
      "BatchPrefillWithSharedPrefixPagedKVCacheWrapper.forward",
      [](const BenchShape& s, Device d) { return bench_shared_prefix(s, d, false); });
}
}  // namespace detail

}  // namespace flashinfer
