// The recorder's extension of the paged decode and prefill wrappers' run, and of the sink
// wrapper's (a paged prefill wrapper inside), as BatchMLAPagedAttentionWrapper.run's (mla.cpp;
// recorder/call_extensions.h; docs/LOGGING.md, "Extension tensors"). Where run reads its page ids
// when it runs (WrapperState::live_indices: under use_cuda_graph the constructor's buffer, or
// with FLASHINFER_PAGE_IDS_AT_RUN=1), an engine may write other ids there after plan, so the ids
// plan's record holds may not be those run read. The recorder adds those as
// fi_ext__kv_indices_at_run; a replay writes them where its wrapper reads them before run
// (without the key, as in upstream's recordings, it runs over plan's).
#include <algorithm>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "api/attention_common.h"
#include "api/page_ids_at_run.h"
#include "core/cuda_runtime.h"
#include "flashinfer/ops/attention.h"
#include "flashinfer/ops/attention_sink.h"
#include "recorder/call_extensions.h"

namespace flashinfer {
namespace detail {

struct PagedWrapperAccess {
  static WrapperState* state(std::span<const Value> args) {
    if (args.empty() || args[0].kind() != Value::Kind::kObject) return nullptr;
    ApiObject* o = args[0].as_object().get();
    if (auto* w = dynamic_cast<BatchDecodeWithPagedKVCacheWrapper*>(o)) return w->s_.get();
    if (auto* w = dynamic_cast<BatchPrefillWithPagedKVCacheWrapper*>(o)) return w->s_.get();
    if (auto* w = dynamic_cast<BatchAttentionWithAttentionSinkWrapper*>(o)) {
      return w->inner_ ? w->inner_->s_.get() : nullptr;
    }
    return nullptr;
  }
};

}  // namespace detail

namespace api {

RecordedIds write_recorded_ids(const Tensor& ids, int64_t n, const Tensor& live,
                               std::vector<int32_t>& kv_indices, int64_t& max_page_id) {
  if (ids.dim() != 1 || ids.numel() != n || ids.dtype() != DType::kInt32) return RecordedIds::kNone;
  if (live.defined()) {
    Tensor dst = live;
    dst.copy_(ids);
    return RecordedIds::kLive;
  }
  const Tensor h = ids.to(Device::cpu()).contiguous();
  const auto* v = h.data<const int32_t>();
  if (std::any_of(v, v + n, [](int32_t x) { return x < 0; })) return RecordedIds::kNone;
  kv_indices.assign(v, v + n);
  max_page_id = n > 0 ? *std::max_element(v, v + n) : -1;
  return RecordedIds::kHost;
}

namespace {

// The plan's page ids where run reads them: [live_base, live_base + count) of live_indices.
bool has_live_ids(const detail::WrapperState& s) {
  return s.planned && s.paged && !s.block_plan && s.live_indices.defined() && !s.kv_indptr.empty();
}

// Whether the recorder adds the ids for a call of this wrapper state: inside a CUDA-graph capture
// a copy would join the graph, so the recording keeps plan's ids.
bool records_ids(const detail::WrapperState* s) {
  return s != nullptr && has_live_ids(*s) && page_id_count(*s) > 0 &&
         !(s->live_indices.device().is_cuda() && detail::cuda_current_stream_capturing());
}

// The other calls (CPU wrappers, eager CUDA ones that copied their ids at plan) keep the ring
// recorder's fast path.
bool ids_at_run_apply(std::span<const Value> args) {
  return records_ids(detail::PagedWrapperAccess::state(args));
}

void record_ids_at_run(std::span<const Value> args,
                       std::vector<std::pair<std::string, Tensor>>& extra) {
  const detail::WrapperState* s = detail::PagedWrapperAccess::state(args);
  if (!records_ids(s)) return;
  const int64_t n = page_id_count(*s);
  // A copy: the buffer may change again before the recorder writes the call out.
  extra.emplace_back(kIdsAtRunKey,
                     s->live_indices.slice(0, s->live_base, s->live_base + n).clone());
}

void replay_ids_at_run(const std::map<std::string, Tensor>& tensors, std::vector<Value>& args) {
  const auto it = tensors.find(kIdsAtRunKey);
  detail::WrapperState* s = detail::PagedWrapperAccess::state(args);
  if (it == tensors.end() || s == nullptr || !s->planned || !s->paged || s->block_plan ||
      s->kv_indptr.empty()) {
    return;
  }
  const int64_t n = page_id_count(*s);
  if (n == 0) return;
  const Tensor live = s->live_indices.defined()
                          ? s->live_indices.slice(0, s->live_base, s->live_base + n)
                          : Tensor();
  // Plan's copy replaced (run checks it against the cache): on a device the uploaded copy too.
  if (write_recorded_ids(it->second, n, live, s->kv_indices, s->max_page_id) ==
          RecordedIds::kHost &&
      s->dev_ints.defined()) {
    Tensor dst = s->dev_ints.slice(0, s->dev_off[2], s->dev_off[2] + n);
    dst.copy_(it->second);
  }
}

}  // namespace

void register_paged_ids_at_run(const char* run_op) {
  detail::register_call_extension(run_op, record_ids_at_run, replay_ids_at_run, ids_at_run_apply);
}

}  // namespace api
}  // namespace flashinfer
