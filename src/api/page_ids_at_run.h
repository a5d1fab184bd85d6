// Private: the replay half shared by the recorder extensions that give a replayed run the page
// ids the recorded run read (fi_ext__kv_indices_at_run): the paged wrappers'
// (attention_ids_at_run.cpp) and the MLA wrapper's (mla.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "flashinfer/tensor.h"

namespace flashinfer::api {

inline constexpr const char* kIdsAtRunKey = "fi_ext__kv_indices_at_run";

/// Where write_recorded_ids put the ids: nowhere (another plan's ids, or a negative one), into
/// the ids the run reads when it runs, or into the plan's host copy (the caller refreshes what
/// it derived from that copy).
enum class RecordedIds { kNone, kLive, kHost };

/// Writes `ids` (a recorded fi_ext__kv_indices_at_run) where a replayed wrapper's run reads its
/// plan's `n` page ids: into `live` (those ids, where run reads them at run) when it is defined,
/// else into `kv_indices` and `max_page_id` (plan's copy, checked as plan checks it). Nothing when
/// `ids` is not n int32 ids of one dimension: the replay then compares the run over its own.
RecordedIds write_recorded_ids(const Tensor& ids, int64_t n, const Tensor& live,
                               std::vector<int32_t>& kv_indices, int64_t& max_page_id);

}  // namespace flashinfer::api
