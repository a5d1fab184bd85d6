// flashinfer.comm.trtllm_moe_alltoall: MoeAlltoAll (dispatch, combine, the combine payload in
// the workspace, checkpointing) and the workspace sizes. Upstream's checks and messages, the
// workspace every rank of the group views (api/comm_shared.h), upstream's workspace cache, and
// the dispatch to the CPU reference or the CUDA kernels. docs/COMM.md, "MoE all-to-all".
#include <algorithm>
#include <atomic>
#include <compare>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "api/arg_traits.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/comm_shared.h"
#include "api/device_props.h"
#include "api/kernel_table.h"
#include "core/comm_abort.h"
#include "core/cuda_runtime.h"
#include "core/view_overlap.h"
#include "flashinfer/bench.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/ops/comm.h"
#include "flashinfer/stream.h"
#include "kernels/cpu/moe_a2a_cpu.h"
#include "kernels/moe_a2a_params.h"
#include "replay/collective_replay.h"
#include "replay/result_comparators.h"

#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/moe_a2a_cuda.h"
#endif

namespace flashinfer {

using MoeA2aInit =
    Init<MoeAlltoAll, std::shared_ptr<Mapping>, int64_t, int64_t, int64_t, std::optional<int64_t>,
         std::optional<int64_t>, std::shared_ptr<MnnvlConfig>, int64_t, bool, std::string>;

namespace moe_a2a_detail {

using kernels::MoeA2aLayout;

// One rank's workspace: every rank's rows (the group views one allocation) and this rank's
// metainfo. Instances of this rank with an equal key share it (upstream's _WORKSPACE_CACHE).
struct SharedWorkspace {
  std::shared_ptr<comm::CommBackend> comm;  // keeps the key's group (its address) alive
  Tensor rows;                              // uint8 [ep_size, size_per_rank]
  Tensor metainfo;                          // CPU int64 [10]
  MoeA2aLayout layout;
  int64_t ep_rank = 0, ep_size = 0, size_per_rank = 0, max_tokens = 0, eplb_experts = 0;
  // The instance between its dispatch and its combine (the flags belong to the workspace: another
  // instance's dispatch then would wait for a combine that never comes).
  mutable std::atomic<const void*> dispatched_by{nullptr};
  // The stream of this rank's latest dispatch / combine: the destructor waits for it, so this
  // rank's kernels are done before its reference to the rows goes (the last reference returns
  // the allocation to the cache, where another tensor may get it while a peer's queued sum or
  // flag store would still reach it).
  mutable std::atomic<void*> last_stream{nullptr};
  mutable std::atomic<bool> launched{false};
  SharedWorkspace() = default;
  SharedWorkspace(const SharedWorkspace&) = delete;
  SharedWorkspace& operator=(const SharedWorkspace&) = delete;
  ~SharedWorkspace() {
    if (!launched.load() || !rows.defined() || !rows.device().is_cuda()) return;
    try {
      detail::cuda_stream_synchronize(last_stream.load(), rows.device().index);
    } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor reports nothing
    }
  }
  void note_launch() const {
    last_stream.store(current_cuda_stream());
    launched.store(true);
  }
  char* row(int64_t r) const { return static_cast<char*>(rows.data_ptr()) + r * size_per_rank; }
};

// Replay's comparator finds a dispatch's counts through its first output's address (an
// instance's receive regions start at a fixed place in its row): the storage (the outputs keep
// it alive) and where in it the counts are. Entries whose storage is gone are pruned.
struct ReceiveRegion {
  std::weak_ptr<Storage> storage;
  int64_t counts_at = 0;  // int32 elements from the storage's start
  int64_t ep = 0;
};
struct ReceiveRegions {
  std::mutex m;
  std::map<const void*, ReceiveRegion> by_address;
};
inline ReceiveRegions& receive_regions() {
  static ReceiveRegions r;
  return r;
}

struct CacheKey {
  int64_t size, rank, ep, max_tokens, eplb;
  const void* group;  // comm::CommBackend::group_id()
  auto operator<=>(const CacheKey&) const = default;
};
struct WorkspaceCache {
  std::mutex m;
  std::map<CacheKey, std::weak_ptr<SharedWorkspace>> entries;
};
WorkspaceCache& workspace_cache() {
  static WorkspaceCache c;
  return c;
}

}  // namespace moe_a2a_detail

namespace {

using kernels::MoeA2aCombineParams;
using kernels::MoeA2aDispatchParams;
using kernels::MoeA2aLayout;
using kernels::MoeA2aSanitizeParams;
using moe_a2a_detail::CacheKey;
using moe_a2a_detail::SharedWorkspace;
using moe_a2a_detail::workspace_cache;

constexpr const char* kMoeA2aModule = "flashinfer.comm.trtllm_moe_alltoall";

constexpr api::KernelEntry<MoeA2aDispatchParams> kDispatchKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: rows copied into the targets' regions in token order, counts and flags "
     "published (release), every peer's awaited (acquire)",
     nullptr,
     [](const MoeA2aDispatchParams& p, const api::LaunchContext&) {
       kernels::cpu::moe_a2a_dispatch(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernels: routing and slots in token order (one block, warp ballots), rows copied "
     "(a block a token, 16-byte stores where aligned), counts and flags published and awaited "
     "(one block, system-scope release / acquire)",
     nullptr,
     [](const MoeA2aDispatchParams& p, const api::LaunchContext& c) {
       kernels::cuda::moe_a2a_dispatch(p, c.stream);
     }},
#endif
};

constexpr api::KernelEntry<MoeA2aCombineParams> kCombineKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: valid rows into this rank's combine region, flags published and awaited, "
     "each token's slots summed in fp32 in upstream's fixed order",
     nullptr,
     [](const MoeA2aCombineParams& p, const api::LaunchContext&) {
       kernels::cpu::moe_a2a_combine(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernels: valid rows into the combine region (all blocks), flags published and "
     "awaited (one block), a block a token summing the peers' rows (loads around the L1)",
     nullptr,
     [](const MoeA2aCombineParams& p, const api::LaunchContext& c) {
       kernels::cuda::moe_a2a_combine(p, c.stream);
     }},
#endif
};

constexpr api::KernelEntry<MoeA2aSanitizeParams> kSanitizeKernels[] = {
    {DeviceType::kCPU, "CPU reference", nullptr,
     [](const MoeA2aSanitizeParams& p, const api::LaunchContext&) {
       kernels::cpu::moe_a2a_sanitize_expert_ids(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: a thread a slot", nullptr,
     [](const MoeA2aSanitizeParams& p, const api::LaunchContext& c) {
       kernels::cuda::moe_a2a_sanitize_expert_ids(p, c.stream);
     }},
#endif
};

// The most tokens (max_num_tokens, runtime_max_tokens_per_rank) a workspace is laid out for:
// the layout's and the regions' byte offsets then stay far from 64-bit overflow.
constexpr int64_t kA2aMaxTokens = int64_t{1} << 40;

void a2a_check_non_negative(int64_t v, const char* op, const char* arg) {
  FLASHINFER_CHECK(v >= 0, op, arg, arg, " must be non-negative, got ", v);
}

int64_t a2a_workspace_size(int64_t ep, int64_t max_tokens, int64_t dispatch_bytes,
                           int64_t combine_bytes, int64_t eplb_experts) {
  // A size past 2^62 bytes is no workspace anyone allocates; refused before it overflows.
  int64_t rows = 0, bytes = 0, sum = 0, eplb = 0;
  const bool overflow = __builtin_mul_overflow(ep, max_tokens, &rows) ||
                        __builtin_add_overflow(dispatch_bytes, combine_bytes, &sum) ||
                        __builtin_add_overflow(sum, int64_t{2 * 22 * 4 + 1024}, &sum) ||
                        __builtin_mul_overflow(rows, sum, &bytes) ||
                        __builtin_mul_overflow(ep, eplb_experts, &eplb) ||
                        __builtin_mul_overflow(eplb, int64_t{4}, &eplb) ||
                        __builtin_add_overflow(bytes, eplb, &bytes) || bytes > (int64_t{1} << 62);
  FLASHINFER_CHECK(!overflow, "moe_a2a_get_workspace_size_per_rank", "max_num_tokens",
                   "a workspace this large overflows 64-bit byte counts");
  return MoeA2aLayout::make(ep, max_tokens, eplb_experts).payload_data +
         MoeA2aLayout::align128(ep * max_tokens * dispatch_bytes) +
         MoeA2aLayout::align128(ep * max_tokens * combine_bytes);
}

// 16-bit hidden states, int32 expert ids and fp32 scales a token (MoeAlltoAll's sizing).
int64_t moe_workspace_size(int64_t ep, int64_t top_k, int64_t max_tokens, int64_t hidden,
                           int64_t extra, int64_t eplb_experts) {
  return a2a_workspace_size(ep, max_tokens, hidden * 2 + top_k * 8 + extra, hidden * 2,
                            eplb_experts);
}

// Row `rank` of `rows` zeroed (the stream synchronized, as upstream's op does) and the metainfo
// of layout `l` (CPU int64 [10]): what MoeAlltoAll and moe_a2a_initialize both do.
Tensor zero_row_and_metainfo(const Tensor& rows, int64_t rank, const MoeA2aLayout& l) {
  rows.select(0, rank).fill_(0.0);
  const Device dev = rows.device();
  if (dev.is_cuda()) detail::cuda_stream_synchronize(current_cuda_stream(), dev.index);
  std::vector<double> f(MoeA2aLayout::kFields);
  for (int i = 0; i < MoeA2aLayout::kFields; ++i) f[i] = static_cast<double>(l.field(i));
  return Tensor::from_vector(f, {MoeA2aLayout::kFields}, DType::kInt64);
}

// MoeAlltoAll's initialization: this rank's row zeroed, its metainfo built.
Tensor a2a_initialize_row(const SharedWorkspace& w, const char* op) {
  FLASHINFER_CHECK(w.layout.payload_data <= w.size_per_rank, op, "workspace_size_per_rank",
                   "workspace size per rank insufficient, need at least ", w.layout.payload_data,
                   " bytes but has ", w.size_per_rank);
  return zero_row_and_metainfo(w.rows, w.ep_rank, w.layout);
}

// An active_rank_mask: a CPU int64 [1] bit mask (upstream's torch.uint64) marking this rank.
uint64_t a2a_read_mask(const std::optional<Tensor>& mask, bool enabled, int64_t ep_rank,
                       const char* op) {
  if (!mask) {
    FLASHINFER_CHECK(!enabled, op, "active_rank_mask",
                     "active_rank_mask must be defined when enable_rank_mask=True");
    return ~uint64_t{0};
  }
  FLASHINFER_CHECK(enabled, op, "active_rank_mask",
                   "active_rank_mask requires enable_rank_mask=True");
  FLASHINFER_CHECK(mask->device().is_cpu() && mask->nbytes() == 8 &&
                       (mask->dtype() == DType::kInt64 || mask->dtype() == DType::kUInt8),
                   op, "active_rank_mask",
                   "active_rank_mask must be a CPU 64-bit mask (int64 [1], or uint8 [8])");
  uint64_t bits = 0;
  std::memcpy(&bits, mask->contiguous().data_ptr(),
              std::min<std::size_t>(8, static_cast<std::size_t>(mask->nbytes())));
  FLASHINFER_CHECK(((bits >> ep_rank) & 1u) != 0, op, "active_rank_mask",
                   "active_rank_mask must mark the local ep_rank (", ep_rank, ") as active");
  return bits;
}

// A workspace as the dispatch, combine and sanitize kernels see it: every rank's row and this
// rank's place among them (MoeAlltoAll's shared workspace, or a module function's workspace and
// metainfo).
struct A2aRows {
  Tensor rows;  // uint8 [ep_size, size_per_rank]
  int64_t ep_rank = 0, ep_size = 0, size_per_rank = 0;
  MoeA2aLayout layout;
  int64_t token_capacity = 0;  // local tokens the top_k tables hold
  // MoeAlltoAll's workspace, told of each launch (its destructor waits for the latest), or null.
  const moe_a2a_detail::SharedWorkspace* owner = nullptr;
  char* row(int64_t r) const { return static_cast<char*>(rows.data_ptr()) + r * size_per_rank; }
  Device device() const { return rows.device(); }
  // The first element of row r's byte `at` in the storage's units of `es` bytes.
  int64_t storage_index(int64_t r, int64_t at, int64_t es) const {
    return (rows.storage_offset() + r * size_per_rank + at) / es;
  }
};

// MoeAlltoAll's workspace as the kernels see it (its tables hold max_num_tokens tokens).
A2aRows rows_of(const SharedWorkspace& w) {
  A2aRows r;
  r.rows = w.rows;
  r.ep_rank = w.ep_rank;
  r.ep_size = w.ep_size;
  r.size_per_rank = w.size_per_rank;
  r.layout = w.layout;
  r.token_capacity = w.max_tokens;
  r.owner = &w;
  return r;
}

// Replay's comparator finds a dispatch's counts through its first view's address: this rank's
// receive regions start at the payload area (MoeAlltoAll registers its workspace once, a module
// dispatch its workspace on each call).
void note_receive_region(const A2aRows& w) {
  const std::lock_guard<std::mutex> lock(moe_a2a_detail::receive_regions().m);
  auto& m = moe_a2a_detail::receive_regions().by_address;
  if (m.size() > 64) std::erase_if(m, [](const auto& e) { return e.second.storage.expired(); });
  m[w.row(w.ep_rank) + w.layout.payload_data] = {
      w.rows.storage(), w.storage_index(w.ep_rank, w.layout.recv_counters, 4), w.ep_size};
}

struct A2aDispatched {
  std::vector<Tensor> recv;  // per payload, [ep_size, runtime_max, cols] views of this rank's row
  int64_t combine_offset = 0;
  std::optional<Tensor> eplb_gathered;  // int32 [ep_size, eplb count]
};

// moe_a2a_dispatch's checks and launch (MoeAlltoAll.dispatch runs it after its own).
// Whether `active` (bit r: rank r takes part) holds every rank of a group of `n`.
bool all_active(uint64_t active, int64_t n) {
  for (int64_t r = 0; r < n && r < 64; ++r) {
    if (((active >> r) & 1u) == 0) return false;
  }
  return true;
}

A2aDispatched a2a_dispatch(const A2aRows& w, const Tensor& ex, const std::vector<Tensor>& payloads,
                           int64_t rmax, int64_t top_k, int64_t num_experts,
                           const std::optional<Tensor>& eplb_local_stats, uint64_t active,
                           std::optional<bool> enable_pdl, const char* op, bool method) {
  // MoeAlltoAll's sizes are its own (its __init__'s): its errors name self.
  auto own = [method](const char* arg) { return method ? "self" : arg; };
  const Device dev = w.device();
  api::check_defined(ex, op, "token_selected_experts");
  FLASHINFER_CHECK(ex.device() == dev, op, "token_selected_experts",
                   "token_selected_experts must be on the workspace's device ", dev.str(), ", got ",
                   ex.device().str());
  FLASHINFER_CHECK(ex.is_contiguous(), op, "token_selected_experts",
                   "token_selected_experts must be contiguous");
  FLASHINFER_CHECK(ex.dtype() == DType::kInt32, op, "token_selected_experts",
                   "token_selected_experts must be int32");
  FLASHINFER_CHECK(ex.dim() == 2 && ex.size(1) == top_k, op, "token_selected_experts",
                   "token_selected_experts shape mismatch");
  const int64_t T = ex.size(0);
  const auto np = static_cast<int64_t>(payloads.size());
  FLASHINFER_CHECK(np >= 1, op, "input_payloads", "At least one payload is required");
  FLASHINFER_CHECK(np <= MoeA2aLayout::kMaxPayloads, op, "input_payloads",
                   "Too many payloads: ", np, " > ", MoeA2aLayout::kMaxPayloads);
  const int64_t ep = w.ep_size;
  FLASHINFER_CHECK(ep > 0 && ep <= MoeA2aLayout::kMaxRanks, op, own("ep_size"),
                   "ep_size must be in (0, ", MoeA2aLayout::kMaxRanks, "]");
  FLASHINFER_CHECK(rmax > 0, op, "runtime_max_tokens_per_rank",
                   "runtime_max_tokens_per_rank must be positive");
  // Bounds that keep every row offset (ep * rmax * row bytes) and the kernels' int expert ids
  // exact; far past any workspace.
  FLASHINFER_CHECK(rmax <= kA2aMaxTokens, op, "runtime_max_tokens_per_rank",
                   "runtime_max_tokens_per_rank ", rmax, " is too large (at most ", kA2aMaxTokens,
                   ")");
  FLASHINFER_CHECK(num_experts >= ep, op, own("num_experts"), "num_experts must be >= ep_size");
  FLASHINFER_CHECK(num_experts <= INT32_MAX, op, own("num_experts"),
                   "num_experts must fit in int32");
  FLASHINFER_CHECK(top_k > 0 && top_k <= MoeA2aLayout::kMaxTopK, op, own("top_k"),
                   "top_k must be in (0, ", MoeA2aLayout::kMaxTopK, "]");
  FLASHINFER_CHECK(kernels::moe_a2a_top_k_supported(static_cast<int>(top_k)), op, own("top_k"),
                   "Unsupported top_k: ", top_k);
  // Upstream leaves these to the caller (SGLang asserts the first); more tokens than rows would
  // write past a source's rows, more than the tables hold past this rank's tables.
  FLASHINFER_CHECK(T <= rmax, op, "token_selected_experts", "local_num_tokens ", T,
                   " exceeds runtime_max_tokens_per_rank ", rmax);
  FLASHINFER_CHECK(T <= w.token_capacity, op, "token_selected_experts", "local_num_tokens ", T,
                   " exceeds the max_num_tokens the workspace was initialized for (",
                   w.token_capacity, ")");
  MoeA2aDispatchParams p;
  p.ep_rank = static_cast<int>(w.ep_rank);
  p.ep_size = static_cast<int>(ep);
  p.top_k = static_cast<int>(top_k);
  p.num_experts = static_cast<int>(num_experts);
  p.tokens = T;
  p.runtime_max = rmax;
  p.experts = static_cast<const int32_t*>(ex.data_ptr());
  p.num_payloads = static_cast<int>(np);
  p.layout = w.layout;
  int64_t off = w.layout.payload_data;
  for (int64_t i = 0; i < np; ++i) {
    const Tensor& x = payloads[static_cast<std::size_t>(i)];
    const std::string name = "input_payloads[" + std::to_string(i) + "]";
    api::check_defined(x, op, name.c_str());
    FLASHINFER_CHECK(x.device() == dev, op, name, "payload ", i,
                     " must be on the workspace's device ", dev.str());
    FLASHINFER_CHECK(x.is_contiguous(), op, name, "payload ", i, " must be contiguous");
    FLASHINFER_CHECK(x.dim() == 2, op, name, "payload ", i, " must be 2D");
    FLASHINFER_CHECK(x.size(0) == T, op, name, "payload ", i,
                     " first dim must equal local_num_tokens");
    const auto es = static_cast<int64_t>(dtype_size(x.dtype()));
    FLASHINFER_CHECK(off % es == 0, op, name, "Misaligned payload buffer ", i, ": offset ", off,
                     " is not a multiple of its element size ", es,
                     ". Consider reordering payloads by largest to smallest element size");
    p.payload[i] = x.data_ptr();
    p.row_bytes[i] = x.size(1) * es;
    p.region[i] = off;
    int64_t bytes = 0;
    FLASHINFER_CHECK(!__builtin_mul_overflow(ep * rmax, p.row_bytes[i], &bytes) &&
                         !__builtin_add_overflow(off, bytes, &off),
                     op, "runtime_max_tokens_per_rank", "the receive regions overflow 64 bits");
  }
  FLASHINFER_CHECK(off <= w.size_per_rank, op, "input_payloads",
                   "workspace size per rank insufficient, need ", off, " bytes but has ",
                   w.size_per_rank);
  int64_t eplb_count = 0;
  if (eplb_local_stats) {
    const Tensor& s = *eplb_local_stats;
    api::check_defined(s, op, "eplb_local_stats");
    FLASHINFER_CHECK(s.dtype() == DType::kInt32, op, "eplb_local_stats",
                     "eplb_local_stats must be int32");
    FLASHINFER_CHECK(s.dim() == 1, op, "eplb_local_stats", "eplb_local_stats must be 1D");
    FLASHINFER_CHECK(s.numel() > 0, op, "eplb_local_stats", "eplb_local_stats must not be empty");
    FLASHINFER_CHECK(s.numel() <= num_experts, op, "eplb_local_stats",
                     "eplb_local_stats size must be <= num_experts");
    FLASHINFER_CHECK(ep * s.numel() * 4 <= w.layout.payload_data - w.layout.eplb_stats, op,
                     "eplb_local_stats", "eplb_local_stats size (", s.numel(),
                     ") exceeds the eplb_stats_num_experts reserved at initialize time");
    FLASHINFER_CHECK(s.device() == dev && s.is_contiguous(), op, "eplb_local_stats",
                     "eplb_local_stats must be contiguous on ", dev.str());
    eplb_count = s.numel();
    p.eplb_local = static_cast<const int32_t*>(s.data_ptr());
    p.eplb_count = eplb_count;
    p.eplb_experts = eplb_count;
  }
  p.active = active;
  p.workspace = static_cast<char*>(w.rows.data_ptr());
  p.rank_stride = w.size_per_rank;
  p.abort = detail::thread_group_abort_word();
  p.op = op;
  if (w.owner) w.owner->note_launch();
  // Ranks that are threads sharing a context enqueue their kernels together (the reason:
  // core/comm_abort.h); a rank without tokens skips the copy kernel: all loaded first. Only when
  // every rank takes part (a rank off active_rank_mask may make no call to meet the barriers).
  detail::gated_collective_launch(
      nullptr, all_active(p.active, w.ep_size) ? w.ep_size : 0, dev,
      [] {
#if FLASHINFER_WITH_CUDA
        kernels::cuda::preload_moe_a2a_dispatch();
#endif
      },
      [&] { api::launch(kDispatchKernels, p, dev, op, "token_selected_experts", enable_pdl); });
  A2aDispatched d;
  const auto& st = w.rows.storage();
  for (int64_t i = 0; i < np; ++i) {
    const Tensor& x = payloads[static_cast<std::size_t>(i)];
    const auto es = static_cast<int64_t>(dtype_size(x.dtype()));
    const int64_t cols = x.size(1);
    FLASHINFER_CHECK_CODE((w.rows.storage_offset() + w.ep_rank * w.size_per_rank) % es == 0,
                          ErrorCode::kInternal, op, "input_payloads",
                          "a workspace row is not aligned to ", es, " bytes");
    d.recv.push_back(Tensor::from_storage(st, {ep, rmax, cols}, {rmax * cols, cols, 1},
                                          w.storage_index(w.ep_rank, p.region[i], es), x.dtype()));
  }
  d.combine_offset = MoeA2aLayout::align128(off);
  if (eplb_local_stats) {
    d.eplb_gathered =
        Tensor::from_storage(st, {ep, eplb_count}, {eplb_count, 1},
                             w.storage_index(w.ep_rank, w.layout.eplb_stats, 4), DType::kInt32);
  }
  return d;
}

// moe_a2a_sanitize_expert_ids's launch: ids is this rank's received copy [ep_size, rmax, top_k].
void a2a_sanitize(const A2aRows& w, const Tensor& ids, int64_t invalid_id,
                  std::optional<bool> enable_pdl, const char* op, const char* arg) {
  MoeA2aSanitizeParams s;
  s.ep_rank = static_cast<int>(w.ep_rank);
  s.ep_size = static_cast<int>(w.ep_size);
  s.runtime_max = ids.size(1);
  s.top_k = ids.size(2);
  s.ids = static_cast<int32_t*>(ids.data_ptr());
  s.invalid_id = static_cast<int32_t>(invalid_id);
  s.row = w.row(w.ep_rank);
  s.layout = w.layout;
  s.op = op;
  api::launch(kSanitizeKernels, s, w.device(), op, arg, enable_pdl);
}

// What a combine takes besides the payload (MoeAlltoAll.combine fills T and the offset from its
// dispatch; moe_a2a_combine from its caller).
struct A2aCombineArgs {
  int64_t tokens = 0, rmax = 0, top_k = 0, combine_offset = 0;
  bool payload_in_workspace = false, use_low_precision = false;
  std::optional<DType> output_dtype;
  const std::optional<Tensor>* output_scales = nullptr;
  const std::optional<Tensor>* output = nullptr;
  uint64_t active = ~uint64_t{0};
  std::optional<bool> enable_pdl;
  bool method = false;  // MoeAlltoAll.combine (its top_k is self's)
};

// moe_a2a_combine's checks and launch.
Tensor a2a_combine(const A2aRows& w, const Tensor& payload, const A2aCombineArgs& a,
                   const char* op) {
  const Device dev = w.device();
  const int64_t rmax = a.rmax;
  FLASHINFER_CHECK(rmax > 0 && rmax <= kA2aMaxTokens, op, "runtime_max_tokens_per_rank",
                   "runtime_max_tokens_per_rank must be in [1, ", kA2aMaxTokens, "], got ", rmax);
  api::check_defined(payload, op, "payload");
  FLASHINFER_CHECK(payload.device() == dev, op, "payload",
                   "payload must be on the workspace's device ", dev.str(), ", got ",
                   payload.device().str());
  FLASHINFER_CHECK(payload.is_contiguous(), op, "payload", "payload must be contiguous");
  FLASHINFER_CHECK(payload.dim() == 3 && payload.size(0) == w.ep_size && payload.size(1) == rmax,
                   op, "payload", "payload must be [ep_size, runtime_max_tokens_per_rank, hidden]");
  const DType pd = payload.dtype();
  FLASHINFER_CHECK(pd == DType::kFloat16 || pd == DType::kBFloat16 || pd == DType::kFloat32 ||
                       pd == DType::kFloat8E4M3FN,
                   op, "payload", "Unsupported dtype for MoE combine: ", dtype_torch_name(pd));
  FLASHINFER_CHECK(a.top_k > 0 && kernels::moe_a2a_top_k_supported(static_cast<int>(a.top_k)), op,
                   a.method ? "self" : "top_k", "Unsupported top_k: ", a.top_k);
  const int64_t H = payload.size(2), T = a.tokens;
  const auto pe = static_cast<int64_t>(dtype_size(pd));
  // Upstream's fp8 combine kernel writes bf16 while its host side sizes an fp8 output
  // (docs/upstream-facts/moe_alltoall_kernels.md, 3): refused rather than repeated.
  FLASHINFER_CHECK_CODE(pd != DType::kFloat8E4M3FN || a.use_low_precision, ErrorCode::kUnsupported,
                        op, "payload",
                        "an fp8 payload without use_low_precision (upstream writes bf16 values "
                        "into an fp8-sized output) is refused");
  const DType region = a.use_low_precision ? DType::kFloat8E4M3FN : pd;
  const auto re = static_cast<int64_t>(dtype_size(region));
  int64_t need = 0;
  FLASHINFER_CHECK(!__builtin_mul_overflow(w.ep_size * rmax, H * std::max(pe, re), &need) &&
                       a.combine_offset + need <= w.size_per_rank,
                   op, "payload", "workspace insufficient for combine payload region");
  if (a.payload_in_workspace) {
    const char* expect = w.row(w.ep_rank) + a.combine_offset;
    FLASHINFER_CHECK(static_cast<const char*>(payload.data_ptr()) == expect, op, "payload",
                     "payload_in_workspace is True but tensor pointer mismatch");
    FLASHINFER_CHECK_CODE(!a.use_low_precision, ErrorCode::kUnsupported, op, "use_low_precision",
                          "use_low_precision with payload_in_workspace is not implemented in "
                          "flashinfer-cpp");
  } else if (a.use_low_precision) {
    // The fp8 rows are packed into this rank's combine region while the payload's wider rows are
    // read: a payload lying in that region (the workspace tensor, payload_in_workspace False) would
    // be overwritten before it is read, by other blocks and within a row on CUDA.
    const Tensor mine =
        w.rows.select(0, w.ep_rank).slice(0, a.combine_offset, a.combine_offset + need);
    FLASHINFER_CHECK_CODE(!detail::views_overlap(payload, mine), ErrorCode::kUnsupported, op,
                          "payload",
                          "lies in this rank's combine region of the workspace, which the "
                          "low-precision combine overwrites with its fp8 rows: pass a payload "
                          "tensor outside the workspace");
  }
  if (a.output_scales && a.output_scales->has_value()) {
    if (dev.is_cuda() && api::compute_capability(dev) < 100) {
      const int cc = api::compute_capability(dev);
      FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "output_scales",
                      "Quantized moe_a2a_combine requires SM>=100 (Blackwell), but got SM", cc);
    }
    FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "output_scales",
                    "quantized combine outputs (MXFP8, MXFP4, NVFP4) are not implemented in "
                    "flashinfer-cpp");
  }
  const DType od = a.output_dtype.value_or(a.use_low_precision ? DType::kBFloat16 : pd);
  if (a.use_low_precision) {
    FLASHINFER_CHECK(od == DType::kBFloat16, op, "output_dtype",
                     "low-precision combine must produce a bf16 output");
  } else {
    FLASHINFER_CHECK(od == pd, op, "output_dtype",
                     "output_dtype without output_scales must match payload dtype");
  }
  Tensor out;
  if (a.output && a.output->has_value()) {
    out = **a.output;
    api::check_defined(out, op, "output");
    FLASHINFER_CHECK(out.device() == dev, op, "output",
                     "output must be a CUDA tensor, got device=", out.device().str());
    FLASHINFER_CHECK(out.is_contiguous(), op, "output",
                     "output must be contiguous, got stride=", shape_to_string(out.strides()));
    FLASHINFER_CHECK(out.dtype() == od && out.dim() == 2 && out.size(0) == T && out.size(1) == H,
                     op, "output", "output must be [", T, ", ", H, "] of ", dtype_torch_name(od),
                     ", got ", shape_to_string(out.shape()), " of ", dtype_torch_name(out.dtype()));
  } else {
    out = Tensor::empty({T, H}, od, dev);
  }
  MoeA2aCombineParams p;
  p.ep_rank = static_cast<int>(w.ep_rank);
  p.ep_size = static_cast<int>(w.ep_size);
  p.top_k = static_cast<int>(a.top_k);
  p.tokens = T;
  p.runtime_max = rmax;
  p.hidden = H;
  p.payload_dtype = pd;
  p.region_dtype = region;
  p.region_elem_bytes = re;
  p.out_dtype = od;
  p.payload = a.payload_in_workspace ? nullptr : payload.data_ptr();
  p.out = out.data_ptr();
  p.workspace = static_cast<char*>(w.rows.data_ptr());
  p.rank_stride = w.size_per_rank;
  p.layout = w.layout;
  p.combine_offset = a.combine_offset;
  p.active = a.active;
  FLASHINFER_CHECK_CODE(
      (w.rows.storage_offset() + w.ep_rank * w.size_per_rank + a.combine_offset) % re == 0,
      ErrorCode::kInternal, op, "payload", "the combine region is misaligned");
  p.abort = detail::thread_group_abort_word();
  p.op = op;
  if (w.owner) w.owner->note_launch();
  // As dispatch's (core/comm_abort.h).
  detail::gated_collective_launch(
      nullptr, all_active(p.active, w.ep_size) ? w.ep_size : 0, dev,
      [&] {
#if FLASHINFER_WITH_CUDA
        kernels::cuda::preload_moe_a2a_combine(p);
#endif
      },
      [&] { api::launch(kCombineKernels, p, dev, op, "payload", a.enable_pdl); });
  return out;
}

}  // namespace

struct MoeAlltoAll::Impl {
  int64_t max_num_tokens = 0, top_k = 0, num_experts = 0, eplb_experts = 0;
  bool enable_rank_mask = false;
  std::shared_ptr<SharedWorkspace> ws;
  bool unmapped = false;
  bool dispatched = false;  // upstream's phase "dispatched" (else "idle")
  int64_t local_num_tokens = 0, combine_offset = 0;
  int64_t dispatch_rmax = 0;  // the dispatch's runtime_max_tokens_per_rank (rows a source has)
  std::optional<Tensor> eplb_gathered;

  // Combine reads rows [s, slot] of the dispatch's row count: another count would read other
  // sources' rows (upstream does not check it; SGLang passes the same value to both).
  void check_rmax(int64_t rmax, const char* op) const {
    FLASHINFER_CHECK(rmax == dispatch_rmax, op, "runtime_max_tokens_per_rank",
                     "runtime_max_tokens_per_rank ", rmax, " differs from the dispatch's ",
                     dispatch_rmax);
  }

  void check_mapped(const char* op) const {
    FLASHINFER_CHECK(!unmapped, op, "self",
                     "MNNVL handles are unmapped; call checkpoint_restore() first");
  }
  Device device() const { return ws->rows.device(); }
};

MoeAlltoAll::MoeAlltoAll(std::shared_ptr<Mapping> mapping, int64_t max_num_tokens, int64_t top_k,
                         int64_t num_experts, std::optional<int64_t> workspace_size_per_rank,
                         std::optional<int64_t> hidden_size,
                         std::shared_ptr<MnnvlConfig> mnnvl_config, int64_t eplb_stats_num_experts,
                         bool enable_rank_mask, std::string backend)
    : impl_(std::make_shared<Impl>()) {
  call_init<MoeA2aInit>(
      [&] {
        const char* op = "MoeAlltoAll.__init__";
        FLASHINFER_CHECK(mapping != nullptr, op, "mapping", "a Mapping is required");
        if (backend == "cake") {
          FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "backend",
                          "backend=\"cake\" requires compute capability 10.0 or 10.3 and is not "
                          "implemented in flashinfer-cpp");
        }
        FLASHINFER_CHECK(backend == "trtllm", op, "backend", "Unknown MoE all-to-all backend '",
                         backend, "'");
        FLASHINFER_CHECK(top_k > 0, op, "top_k", "top_k must be a positive int");
        FLASHINFER_CHECK(num_experts > 0, op, "num_experts", "num_experts must be a positive int");
        a2a_check_non_negative(max_num_tokens, op, "max_num_tokens");
        a2a_check_non_negative(eplb_stats_num_experts, op, "eplb_stats_num_experts");
        // The layout's offsets exact (a given workspace_size_per_rank bounds nothing else).
        FLASHINFER_CHECK(max_num_tokens <= kA2aMaxTokens, op, "max_num_tokens", "max_num_tokens ",
                         max_num_tokens, " is too large (at most ", kA2aMaxTokens, ")");
        FLASHINFER_CHECK(eplb_stats_num_experts <= INT32_MAX, op, "eplb_stats_num_experts",
                         "eplb_stats_num_experts must fit in int32");
        FLASHINFER_CHECK(mnnvl_config && mnnvl_config->comm_backend, op, "mnnvl_config",
                         "an MnnvlConfig with a comm_backend is required (upstream's default is "
                         "MPI's world, which C++ does not have)");
        const std::shared_ptr<comm::CommBackend>& c = mnnvl_config->comm_backend;
        const int64_t ep = mapping->moe_ep_size, r = mapping->moe_ep_rank();
        FLASHINFER_CHECK(c->Get_size() == ep && c->Get_rank() == r, op, "mnnvl_config",
                         "the comm_backend is rank ", c->Get_rank(), " of ", c->Get_size(),
                         ", the mapping's MoE EP rank ", r, " of ", ep,
                         ": pass the EP group's backend");
        FLASHINFER_CHECK(ep <= MoeA2aLayout::kMaxRanks, op, "mapping", "ep_size ", ep,
                         " exceeds the supported maximum of ", MoeA2aLayout::kMaxRanks);
        int64_t size = 0;
        if (workspace_size_per_rank) {
          size = *workspace_size_per_rank;
        } else {
          FLASHINFER_CHECK(hidden_size.has_value(), op, "hidden_size",
                           "hidden_size must be provided if workspace_size_per_rank is not "
                           "provided");
          a2a_check_non_negative(*hidden_size, op, "hidden_size");
          size = moe_workspace_size(ep, top_k, max_num_tokens, *hidden_size, 0,
                                    eplb_stats_num_experts);
        }
        FLASHINFER_CHECK(size > 0 && size % 8 == 0, op, "workspace_size_per_rank",
                         "workspace_size_per_rank must be a positive multiple of 8, got ", size);
        Impl& im = *impl_;
        im.max_num_tokens = max_num_tokens;
        im.top_k = top_k;
        im.num_experts = num_experts;
        im.eplb_experts = eplb_stats_num_experts;
        im.enable_rank_mask = enable_rank_mask;
        const CacheKey key{size, r, ep, max_num_tokens, eplb_stats_num_experts, c->group_id()};
        std::shared_ptr<SharedWorkspace> found;
        {
          const std::lock_guard<std::mutex> lock(workspace_cache().m);
          auto it = workspace_cache().entries.find(key);
          if (it != workspace_cache().entries.end()) found = it->second.lock();
        }
        // Hit or miss is the group's decision: a rank whose instances all died lost its entry
        // while a peer kept one, and a workspace is allocated by every rank together.
        for (const std::string& v : c->allgather(found ? "1" : "0")) {
          if (v != "1") found.reset();
        }
        if (!found) {
          auto w = std::make_shared<SharedWorkspace>();
          w->comm = c;
          w->ep_rank = r;
          w->ep_size = ep;
          w->size_per_rank = size;
          w->max_tokens = max_num_tokens;
          w->eplb_experts = eplb_stats_num_experts;
          w->layout = MoeA2aLayout::make(ep, max_num_tokens, eplb_stats_num_experts);
          w->rows = detail::group_shared_rows(*c, ep, size, DType::kUInt8, 1, op, "mnnvl_config");
          w->metainfo = a2a_initialize_row(*w, op);
          note_receive_region(rows_of(*w));
          c->barrier();
          const std::lock_guard<std::mutex> lock(workspace_cache().m);
          workspace_cache().entries[key] = w;
          found = std::move(w);
        }
        im.ws = std::move(found);
      },
      *this, mapping, max_num_tokens, top_k, num_experts, workspace_size_per_rank, hidden_size,
      mnnvl_config, eplb_stats_num_experts, enable_rank_mask, backend);
}

MoeAlltoAll::~MoeAlltoAll() {
  // An instance that dies between its dispatch and its combine leaves the workspace to others.
  if (impl_ && impl_->ws) {
    const void* mine = impl_.get();
    impl_->ws->dispatched_by.compare_exchange_strong(mine, nullptr);
  }
}

int64_t MoeAlltoAll::ep_rank() const { return impl_->ws->ep_rank; }
int64_t MoeAlltoAll::ep_size() const { return impl_->ws->ep_size; }
Tensor MoeAlltoAll::workspace() const { return impl_->ws->rows; }
Tensor MoeAlltoAll::metainfo() const { return impl_->ws->metainfo; }
std::optional<Tensor> MoeAlltoAll::eplb_gathered_stats() const { return impl_->eplb_gathered; }

std::vector<Tensor> MoeAlltoAll::dispatch(const Tensor& token_selected_experts,
                                          const std::vector<Tensor>& input_payloads,
                                          int64_t runtime_max_tokens_per_rank,
                                          std::optional<int64_t> invalid_token_expert_id,
                                          std::optional<int64_t> expert_id_payload_index,
                                          std::optional<Tensor> eplb_local_stats,
                                          std::optional<Tensor> active_rank_mask) {
  return call_op<&MoeAlltoAll::dispatch>(
      [&]() -> std::vector<Tensor> {
        const char* op = "MoeAlltoAll.dispatch";
        Impl& im = *impl_;
        const SharedWorkspace& w = *im.ws;
        im.check_mapped(op);
        FLASHINFER_CHECK(!im.dispatched, op, "self", "dispatch called twice without combine");
        FLASHINFER_CHECK(w.dispatched_by.load() == nullptr, op, "self",
                         "another MoeAlltoAll on this workspace (instances of equal sizes share "
                         "one) is between its dispatch and its combine");
        const int64_t rmax = runtime_max_tokens_per_rank;
        FLASHINFER_CHECK(rmax <= im.max_num_tokens, op, "runtime_max_tokens_per_rank",
                         "runtime_max_tokens_per_rank exceeds max_num_tokens");
        if (eplb_local_stats) {
          FLASHINFER_CHECK(im.eplb_experts > 0, op, "eplb_local_stats",
                           "eplb_local_stats provided but instance was constructed with "
                           "eplb_stats_num_experts=0");
          FLASHINFER_CHECK(eplb_local_stats->dim() == 1, op, "eplb_local_stats",
                           "eplb_local_stats must be a 1D tensor");
          FLASHINFER_CHECK(eplb_local_stats->size(0) == im.eplb_experts, op, "eplb_local_stats",
                           "eplb_local_stats size must match eplb_stats_num_experts");
        }
        FLASHINFER_CHECK(!active_rank_mask || im.enable_rank_mask, op, "active_rank_mask",
                         "active_rank_mask requires the instance to have been constructed with "
                         "enable_rank_mask=True");
        std::optional<int64_t> ids_index;
        if (invalid_token_expert_id) {
          FLASHINFER_CHECK(expert_id_payload_index.has_value(), op, "expert_id_payload_index",
                           "expert_id_payload_index required when invalid_token_expert_id is "
                           "set");
          ids_index = *expert_id_payload_index;
          const auto np = static_cast<int64_t>(input_payloads.size());
          FLASHINFER_CHECK(*ids_index >= 0 && *ids_index < np, op, "expert_id_payload_index",
                           "expert_id_payload_index ", *ids_index, " out of range [0, ", np, ")");
          const Tensor& ids = input_payloads[static_cast<std::size_t>(*ids_index)];
          const std::string ids_arg = "input_payloads[" + std::to_string(*ids_index) + "]";
          api::check_defined(ids, op, ids_arg.c_str());
          FLASHINFER_CHECK(ids.dtype() == DType::kInt32, op, "expert_id_payload_index",
                           "expert_ids must be int32");
        }
        const uint64_t active = a2a_read_mask(active_rank_mask, im.enable_rank_mask, w.ep_rank, op);
        const A2aRows rows = rows_of(w);
        A2aDispatched d = a2a_dispatch(rows, token_selected_experts, input_payloads, rmax, im.top_k,
                                       im.num_experts, eplb_local_stats, active, std::nullopt, op,
                                       /*method=*/true);
        if (ids_index) {
          a2a_sanitize(rows, d.recv[static_cast<std::size_t>(*ids_index)], *invalid_token_expert_id,
                       std::nullopt, op, "invalid_token_expert_id");
        }
        const int64_t T = token_selected_experts.size(0);
        im.local_num_tokens = T;
        im.dispatch_rmax = rmax;
        im.combine_offset = d.combine_offset;
        im.eplb_gathered = d.eplb_gathered;
        im.dispatched = true;
        w.dispatched_by.store(&im);
        return std::move(d.recv);
      },
      *this, token_selected_experts, input_payloads, runtime_max_tokens_per_rank,
      invalid_token_expert_id, expert_id_payload_index, eplb_local_stats, active_rank_mask);
}

Tensor MoeAlltoAll::get_combine_payload_tensor_in_workspace(int64_t runtime_max_tokens_per_rank,
                                                            int64_t hidden_size, DType dtype) {
  return call_op<&MoeAlltoAll::get_combine_payload_tensor_in_workspace>(
      [&] {
        const char* op = "MoeAlltoAll.get_combine_payload_tensor_in_workspace";
        const Impl& im = *impl_;
        const SharedWorkspace& w = *im.ws;
        im.check_mapped(op);
        FLASHINFER_CHECK(im.dispatched, op, "self",
                         "get_combine_payload_tensor_in_workspace called before successful "
                         "dispatch");
        const int64_t rmax = runtime_max_tokens_per_rank;
        im.check_rmax(rmax, op);
        a2a_check_non_negative(hidden_size, op, "hidden_size");
        const auto es = static_cast<int64_t>(dtype_size(dtype));
        const int64_t bytes = w.ep_size * rmax * hidden_size * es;
        FLASHINFER_CHECK(im.combine_offset + bytes <= w.size_per_rank, op, "hidden_size",
                         "workspace insufficient for combine payload region: need ",
                         im.combine_offset + bytes, " bytes, have ", w.size_per_rank);
        const int64_t at =
            w.rows.storage_offset() + w.ep_rank * w.size_per_rank + im.combine_offset;
        FLASHINFER_CHECK_CODE(at % es == 0, ErrorCode::kInternal, op, "dtype",
                              "the combine region is not aligned to ", es, " bytes");
        return Tensor::from_storage(w.rows.storage(), {w.ep_size, rmax, hidden_size},
                                    {rmax * hidden_size, hidden_size, 1}, at / es, dtype);
      },
      *this, runtime_max_tokens_per_rank, hidden_size, dtype);
}

Tensor MoeAlltoAll::combine(const Tensor& payload, int64_t runtime_max_tokens_per_rank,
                            bool payload_in_workspace, std::optional<DType> output_dtype,
                            std::optional<Tensor> output_scales, double output_scalar_scale,
                            SfLayout sf_layout, std::optional<Tensor> output,
                            bool use_low_precision, std::optional<Tensor> active_rank_mask) {
  return call_op<&MoeAlltoAll::combine>(
      [&]() -> Tensor {
        const char* op = "MoeAlltoAll.combine";
        Impl& im = *impl_;
        const SharedWorkspace& w = *im.ws;
        im.check_mapped(op);
        FLASHINFER_CHECK(im.dispatched, op, "self", "combine called before successful dispatch");
        const int64_t rmax = runtime_max_tokens_per_rank;
        FLASHINFER_CHECK(rmax <= im.max_num_tokens, op, "runtime_max_tokens_per_rank",
                         "runtime_max_tokens_per_rank exceeds max_num_tokens");
        FLASHINFER_CHECK(!active_rank_mask || im.enable_rank_mask, op, "active_rank_mask",
                         "active_rank_mask requires the instance to have been constructed with "
                         "enable_rank_mask=True");
        im.check_rmax(rmax, op);
        A2aCombineArgs a;
        a.tokens = im.local_num_tokens;
        a.rmax = rmax;
        a.top_k = im.top_k;
        a.combine_offset = im.combine_offset;
        a.payload_in_workspace = payload_in_workspace;
        a.use_low_precision = use_low_precision;
        a.output_dtype = output_dtype;
        a.output_scales = &output_scales;
        a.output = &output;
        a.active = a2a_read_mask(active_rank_mask, im.enable_rank_mask, w.ep_rank, op);
        a.method = true;
        // Upstream's scalar scale and layout apply to the quantized outputs only (refused).
        (void)output_scalar_scale;
        (void)sf_layout;
        Tensor out = a2a_combine(rows_of(w), payload, a, op);
        im.dispatched = false;
        w.dispatched_by.store(nullptr);
        im.eplb_gathered.reset();
        return out;
      },
      *this, payload, runtime_max_tokens_per_rank, payload_in_workspace, output_dtype,
      output_scales, output_scalar_scale, sf_layout, output, use_low_precision, active_rank_mask);
}

void MoeAlltoAll::checkpoint_prepare() {
  call_op<&MoeAlltoAll::checkpoint_prepare>(
      [&] {
        const char* op = "MoeAlltoAll.checkpoint_prepare";
        Impl& im = *impl_;
        if (im.unmapped) return;
        FLASHINFER_CHECK(!im.dispatched, op, "self",
                         "Cannot unmap MNNVL handles during an active all-to-all phase");
        const Device dev = im.device();
        if (dev.is_cuda()) detail::cuda_device_synchronize(dev.index);
        im.ws->comm->barrier();
        im.unmapped = true;
        im.ws->comm->barrier();
      },
      *this);
}

void MoeAlltoAll::checkpoint_restore(std::shared_ptr<comm::CommBackend> comm_backend) {
  call_op<&MoeAlltoAll::checkpoint_restore>(
      [&] {
        const char* op = "MoeAlltoAll.checkpoint_restore";
        Impl& im = *impl_;
        if (!im.unmapped) return;
        FLASHINFER_CHECK(comm_backend != nullptr, op, "comm_backend", "a CommBackend is required");
        SharedWorkspace& w = *im.ws;
        FLASHINFER_CHECK(
            comm_backend->Get_rank() == w.ep_rank && comm_backend->Get_size() == w.ep_size, op,
            "comm_backend",
            "Cannot remap MNNVL handles because the communicator does not match the "
            "graph-visible allocation layout: rank/size ",
            comm_backend->Get_rank(), "/", comm_backend->Get_size(), " != ", w.ep_rank, "/",
            w.ep_size);
        const Device dev = im.device();
        if (dev.is_cuda()) detail::cuda_device_synchronize(dev.index);
        w.comm = comm_backend;
        const Tensor meta = a2a_initialize_row(w, op);
        FLASHINFER_CHECK_CODE(
            std::memcmp(meta.data_ptr(), w.metainfo.data_ptr(), 8 * MoeA2aLayout::kFields) == 0,
            ErrorCode::kInternal, op, "self",
            "MoeAlltoAll metainfo changed during MNNVL handle remap; existing CUDA graphs are not "
            "safe to replay");
        if (dev.is_cuda()) detail::cuda_device_synchronize(dev.index);
        comm_backend->barrier();
        im.unmapped = false;
        im.dispatched = false;
        im.eplb_gathered.reset();
      },
      *this, comm_backend);
}

int64_t moe_a2a_get_workspace_size_per_rank(int64_t ep_size, int64_t max_num_tokens,
                                            int64_t total_dispatch_payload_size_per_token,
                                            int64_t combine_payload_size_per_token,
                                            int64_t eplb_stats_num_experts) {
  return call_op<&moe_a2a_get_workspace_size_per_rank>(
      [&] {
        const char* op = "moe_a2a_get_workspace_size_per_rank";
        FLASHINFER_CHECK(ep_size > 0, op, "ep_size", "ep_size must be positive, got ", ep_size);
        a2a_check_non_negative(max_num_tokens, op, "max_num_tokens");
        a2a_check_non_negative(total_dispatch_payload_size_per_token, op,
                               "total_dispatch_payload_size_per_token");
        a2a_check_non_negative(combine_payload_size_per_token, op,
                               "combine_payload_size_per_token");
        a2a_check_non_negative(eplb_stats_num_experts, op, "eplb_stats_num_experts");
        return a2a_workspace_size(ep_size, max_num_tokens, total_dispatch_payload_size_per_token,
                                  combine_payload_size_per_token, eplb_stats_num_experts);
      },
      ep_size, max_num_tokens, total_dispatch_payload_size_per_token,
      combine_payload_size_per_token, eplb_stats_num_experts);
}

int64_t moe_alltoall_get_moe_workspace_size_per_rank(int64_t ep_size, int64_t top_k,
                                                     int64_t max_num_tokens, int64_t hidden_size,
                                                     int64_t extra_payload_bytes_per_token,
                                                     int64_t eplb_stats_num_experts) {
  return call_op<&moe_alltoall_get_moe_workspace_size_per_rank>(
      [&] {
        const char* op = "MoeAlltoAll.get_moe_workspace_size_per_rank";
        FLASHINFER_CHECK(ep_size > 0, op, "ep_size", "ep_size must be positive, got ", ep_size);
        a2a_check_non_negative(top_k, op, "top_k");
        a2a_check_non_negative(max_num_tokens, op, "max_num_tokens");
        a2a_check_non_negative(hidden_size, op, "hidden_size");
        a2a_check_non_negative(extra_payload_bytes_per_token, op, "extra_payload_bytes_per_token");
        a2a_check_non_negative(eplb_stats_num_experts, op, "eplb_stats_num_experts");
        return moe_workspace_size(ep_size, top_k, max_num_tokens, hidden_size,
                                  extra_payload_bytes_per_token, eplb_stats_num_experts);
      },
      ep_size, top_k, max_num_tokens, hidden_size, extra_payload_bytes_per_token,
      eplb_stats_num_experts);
}

namespace {

// A module function's workspace: uint8 [ep_size, size_per_rank], contiguous, rows 8-byte
// aligned (every payload's and region's alignment then follows from the offsets).
void check_a2a_workspace(const Tensor& ws, int64_t ep_size, const char* op) {
  api::check_defined(ws, op, "workspace");
  FLASHINFER_CHECK(ws.dtype() == DType::kUInt8, op, "workspace",
                   "Inconsistency of Tensor type: workspace (uint8 expected, got ",
                   dtype_torch_name(ws.dtype()), ")");
  FLASHINFER_CHECK(ws.dim() == 2, op, "workspace", "workspace must be a 2D tensor");
  FLASHINFER_CHECK(ep_size > 0 && ep_size <= MoeA2aLayout::kMaxRanks, op, "ep_size",
                   "epSize must be in the range (0, ", MoeA2aLayout::kMaxRanks, "]");
  FLASHINFER_CHECK(ws.size(0) == ep_size, op, "workspace",
                   "workspace first dim must equal ep_size");
  FLASHINFER_CHECK(ws.is_contiguous(), op, "workspace",
                   "workspace must be contiguous (row r being rank r's bytes)");
  FLASHINFER_CHECK(ws.size(1) % 8 == 0 && ws.storage_offset() % 8 == 0, op, "workspace",
                   "workspace rows must start 8-byte aligned (size_per_rank ", ws.size(1),
                   " and the view's offset multiples of 8)");
}

void check_a2a_rank(int64_t ep_rank, int64_t ep_size, const char* op) {
  FLASHINFER_CHECK(ep_rank >= 0 && ep_rank < ep_size, op, "ep_rank",
                   "epRank out of range: ", ep_rank, " not in [0, ", ep_size, ")");
}

// The workspace and metainfo a module function takes, as the kernels see them. The metainfo
// must be initialize's for ep_size ranks (upstream trusts it; a wrong offset here would send
// the kernels outside the row): its top_k tables' size gives the tokens they hold.
A2aRows a2a_rows_from(const Tensor& ws, const Tensor& metainfo, int64_t ep_rank, int64_t ep_size,
                      const char* op) {
  check_a2a_workspace(ws, ep_size, op);
  check_a2a_rank(ep_rank, ep_size, op);
  api::check_defined(metainfo, op, "metainfo");
  FLASHINFER_CHECK(metainfo.device().is_cpu(), op, "metainfo", "metainfo must be a host tensor");
  FLASHINFER_CHECK(metainfo.dtype() == DType::kInt64 && metainfo.dim() == 1 &&
                       metainfo.size(0) == MoeA2aLayout::kFields,
                   op, "metainfo", "metainfo must be int64 [", MoeA2aLayout::kFields,
                   "] (moe_a2a_initialize's)");
  const Tensor m = metainfo.contiguous();
  const auto* f = static_cast<const int64_t*>(m.data_ptr());
  // Offsets in order inside the row first: what is derived from them below cannot overflow.
  bool ordered = f[0] >= 0;
  for (int i = 1; i < MoeA2aLayout::kFields; ++i) ordered = ordered && f[i - 1] <= f[i];
  FLASHINFER_CHECK(f[MoeA2aLayout::kFields - 1] <= ws.size(1), op, "workspace",
                   "workspace size per rank insufficient, need at least ",
                   f[MoeA2aLayout::kFields - 1], " bytes but has ", ws.size(1));
  FLASHINFER_CHECK(ordered, op, "metainfo", "metainfo is not moe_a2a_initialize's for ep_size ",
                   ep_size, " (its offsets are not in order)");
  const MoeA2aLayout l0 = MoeA2aLayout::make(ep_size, 0, 0);
  const int64_t table = f[7] - f[6], eplb = f[9] - f[8];
  const int64_t tokens =
      table >= 0 && f[6] == l0.topk_target_ranks ? table / (4 * MoeA2aLayout::kMaxTopK) : -1;
  const int64_t experts = eplb >= 0 ? eplb / (4 * ep_size) : -1;
  bool same = tokens >= 0 && experts >= 0;
  const MoeA2aLayout l = same ? MoeA2aLayout::make(ep_size, tokens, experts) : MoeA2aLayout();
  for (int i = 0; same && i < MoeA2aLayout::kFields; ++i) same = l.field(i) == f[i];
  FLASHINFER_CHECK(same, op, "metainfo", "metainfo is not moe_a2a_initialize's for ep_size ",
                   ep_size, " (its offsets are not upstream's layout)");
  A2aRows r;
  r.rows = ws;
  r.ep_rank = ep_rank;
  r.ep_size = ep_size;
  r.size_per_rank = ws.size(1);
  r.layout = l;
  r.token_capacity = tokens;
  return r;
}

}  // namespace

Tensor moe_a2a_initialize(const Tensor& workspace, int64_t ep_rank, int64_t ep_size,
                          int64_t max_num_tokens, int64_t eplb_stats_num_experts) {
  return call_op<&moe_a2a_initialize>(
      [&] {
        const char* op = "moe_a2a_initialize";
        check_a2a_workspace(workspace, ep_size, op);
        check_a2a_rank(ep_rank, ep_size, op);
        a2a_check_non_negative(max_num_tokens, op, "max_num_tokens");
        FLASHINFER_CHECK(eplb_stats_num_experts >= 0, op, "eplb_stats_num_experts",
                         "eplb_stats_num_experts must be non-negative");
        // The layout's offsets stay far below 2^62 for any workspace that exists.
        FLASHINFER_CHECK(max_num_tokens <= kA2aMaxTokens, op, "max_num_tokens", "max_num_tokens ",
                         max_num_tokens, " is too large (at most ", kA2aMaxTokens, ")");
        FLASHINFER_CHECK(eplb_stats_num_experts <= INT32_MAX, op, "eplb_stats_num_experts",
                         "eplb_stats_num_experts must fit in int32");
        return zero_row_and_metainfo(
            workspace, ep_rank,
            MoeA2aLayout::make(ep_size, max_num_tokens, eplb_stats_num_experts));
      },
      workspace, ep_rank, ep_size, max_num_tokens, eplb_stats_num_experts);
}

Tensor moe_a2a_wrap_payload_tensor_in_workspace(const Tensor& workspace,
                                                const std::vector<int64_t>& leading_shape,
                                                int64_t slice_start, int64_t slice_end,
                                                DType dtype) {
  return call_op<&moe_a2a_wrap_payload_tensor_in_workspace>(
      [&] {
        const char* op = "moe_a2a_wrap_payload_tensor_in_workspace";
        api::check_defined(workspace, op, "workspace");
        FLASHINFER_CHECK(workspace.dim() == 1 || workspace.dim() == 2, op, "workspace",
                         "workspace must be shape [ep_size, size_per_rank]");
        FLASHINFER_CHECK(workspace.dtype() == DType::kUInt8 && workspace.is_contiguous(), op,
                         "workspace", "workspace must be contiguous uint8 bytes");
        const int64_t ranks = workspace.dim() == 1 ? 1 : workspace.size(0);
        const int64_t stride = workspace.dim() == 1 ? workspace.size(0) : workspace.size(1);
        FLASHINFER_CHECK(stride > 0, op, "workspace", "workspace has no bytes");
        FLASHINFER_CHECK(slice_start >= 0 && slice_start < ranks * stride, op, "slice_start",
                         "slice_start ", slice_start, " is outside the workspace's ",
                         ranks * stride, " bytes");
        const int64_t rank = slice_start / stride, local = slice_start % stride;
        FLASHINFER_CHECK(slice_end >= slice_start && slice_end - slice_start <= stride, op,
                         "slice_end", "slice_end - slice_start must belong to a single rank");
        const int64_t bytes = slice_end - slice_start;
        FLASHINFER_CHECK(local + bytes <= stride, op, "slice_end",
                         "slice must fall within the workspace size per rank");
        const auto es = static_cast<int64_t>(dtype_size(dtype));
        FLASHINFER_CHECK(bytes % es == 0, op, "dtype", "the slice's ", bytes,
                         " bytes are not a whole number of ", dtype_torch_name(dtype), " elements");
        const int64_t at = workspace.storage_offset() + rank * stride + local;
        FLASHINFER_CHECK(at % es == 0, op, "slice_start", "the slice starts at byte ", at,
                         " of its storage, not a multiple of ", dtype_torch_name(dtype), "'s size ",
                         es);
        int64_t lead = 1;
        for (int64_t d : leading_shape) {
          FLASHINFER_CHECK(d >= 0 && !__builtin_mul_overflow(lead, d, &lead), op, "leading_shape",
                           "leading_shape must hold non-negative sizes, got ",
                           shape_to_string(Shape(leading_shape.begin(), leading_shape.end())));
        }
        const int64_t n = bytes / es;
        FLASHINFER_CHECK(lead > 0 && n % lead == 0, op, "leading_shape", "shape '",
                         shape_to_string(Shape(leading_shape.begin(), leading_shape.end())),
                         " + [-1]' is invalid for input of size ", n);
        std::vector<int64_t> shape = leading_shape;
        shape.push_back(n / lead);
        std::vector<int64_t> strides(shape.size());
        int64_t st = 1;
        for (std::size_t i = shape.size(); i-- > 0;) {
          strides[i] = st;
          st *= std::max<int64_t>(shape[i], 1);
        }
        return Tensor::from_storage(workspace.storage(), Shape(shape.begin(), shape.end()),
                                    Shape(strides.begin(), strides.end()), at / es, dtype);
      },
      workspace, leading_shape, slice_start, slice_end, dtype);
}

std::tuple<std::vector<Tensor>, int64_t, std::optional<Tensor>> moe_a2a_dispatch(
    const Tensor& token_selected_experts, const std::vector<Tensor>& input_payloads,
    const Tensor& workspace, const Tensor& metainfo, int64_t runtime_max_tokens_per_rank,
    int64_t ep_rank, int64_t ep_size, int64_t top_k, int64_t num_experts,
    std::optional<bool> enable_pdl, std::optional<Tensor> eplb_local_stats, bool enable_rank_mask,
    std::optional<Tensor> active_rank_mask) {
  return call_op<&moe_a2a_dispatch>(
      [&]() -> std::tuple<std::vector<Tensor>, int64_t, std::optional<Tensor>> {
        const char* op = "moe_a2a_dispatch";
        const A2aRows w = a2a_rows_from(workspace, metainfo, ep_rank, ep_size, op);
        const uint64_t active = a2a_read_mask(active_rank_mask, enable_rank_mask, ep_rank, op);
        A2aDispatched d =
            a2a_dispatch(w, token_selected_experts, input_payloads, runtime_max_tokens_per_rank,
                         top_k, num_experts, eplb_local_stats, active, enable_pdl, op, false);
        note_receive_region(w);
        return {std::move(d.recv), d.combine_offset, std::move(d.eplb_gathered)};
      },
      token_selected_experts, input_payloads, workspace, metainfo, runtime_max_tokens_per_rank,
      ep_rank, ep_size, top_k, num_experts, enable_pdl, eplb_local_stats, enable_rank_mask,
      active_rank_mask);
}

Tensor moe_a2a_combine(const Tensor& payload, int64_t local_num_tokens, const Tensor& workspace,
                       const Tensor& metainfo, int64_t runtime_max_tokens_per_rank, int64_t ep_rank,
                       int64_t ep_size, int64_t top_k, int64_t combine_payload_offset,
                       bool payload_in_workspace, std::optional<DType> output_dtype,
                       std::optional<Tensor> output_scales, double output_scalar_scale,
                       SfLayout sf_layout, std::optional<Tensor> output, bool use_low_precision,
                       std::optional<bool> enable_pdl, bool enable_rank_mask,
                       std::optional<Tensor> active_rank_mask) {
  return call_op<&moe_a2a_combine>(
      [&]() -> Tensor {
        const char* op = "moe_a2a_combine";
        const A2aRows w = a2a_rows_from(workspace, metainfo, ep_rank, ep_size, op);
        // The tables hold the dispatch's tokens; a count past them would read other fields.
        FLASHINFER_CHECK(local_num_tokens >= 0 && local_num_tokens <= w.token_capacity, op,
                         "local_num_tokens", "local_num_tokens ", local_num_tokens,
                         " must be in [0, ", w.token_capacity,
                         "] (the dispatch's tokens; initialize's max_num_tokens bounds them)");
        FLASHINFER_CHECK(runtime_max_tokens_per_rank > 0, op, "runtime_max_tokens_per_rank",
                         "runtime_max_tokens_per_rank must be positive");
        // The dispatch's offset lies past its receive regions; one below the rows' fields would
        // overwrite the counters and flags the exchange runs on.
        FLASHINFER_CHECK(combine_payload_offset >= w.layout.payload_data &&
                             combine_payload_offset <= w.size_per_rank,
                         op, "combine_payload_offset", "combine_payload_offset ",
                         combine_payload_offset, " must be in [", w.layout.payload_data, ", ",
                         w.size_per_rank, "] (moe_a2a_dispatch's)");
        A2aCombineArgs a;
        a.tokens = local_num_tokens;
        a.rmax = runtime_max_tokens_per_rank;
        a.top_k = top_k;
        a.combine_offset = combine_payload_offset;
        a.payload_in_workspace = payload_in_workspace;
        a.use_low_precision = use_low_precision;
        a.output_dtype = output_dtype;
        a.output_scales = &output_scales;
        a.output = &output;
        a.active = a2a_read_mask(active_rank_mask, enable_rank_mask, ep_rank, op);
        a.enable_pdl = enable_pdl;
        // Rows start 8-byte aligned: the region's elements are aligned where the offset is.
        const int64_t es = payload.defined() && !use_low_precision
                               ? static_cast<int64_t>(dtype_size(payload.dtype()))
                               : 1;
        FLASHINFER_CHECK(combine_payload_offset % es == 0, op, "combine_payload_offset",
                         "combine_payload_offset ", combine_payload_offset,
                         " is not a multiple of the payload's element size ", es);
        (void)output_scalar_scale;
        (void)sf_layout;
        return a2a_combine(w, payload, a, op);
      },
      payload, local_num_tokens, workspace, metainfo, runtime_max_tokens_per_rank, ep_rank, ep_size,
      top_k, combine_payload_offset, payload_in_workspace, output_dtype, output_scales,
      output_scalar_scale, sf_layout, output, use_low_precision, enable_pdl, enable_rank_mask,
      active_rank_mask);
}

void moe_a2a_sanitize_expert_ids(const Tensor& expert_ids, const Tensor& workspace,
                                 const Tensor& metainfo, int64_t ep_rank, int64_t invalid_expert_id,
                                 std::optional<bool> enable_pdl) {
  call_op<&moe_a2a_sanitize_expert_ids>(
      [&] {
        const char* op = "moe_a2a_sanitize_expert_ids";
        api::check_defined(workspace, op, "workspace");
        FLASHINFER_CHECK(workspace.dim() == 2, op, "workspace", "workspace must be a 2D tensor");
        const int64_t ep = workspace.size(0);
        const A2aRows w = a2a_rows_from(workspace, metainfo, ep_rank, ep, op);
        api::check_defined(expert_ids, op, "expert_ids");
        FLASHINFER_CHECK(expert_ids.device() == w.device(), op, "expert_ids",
                         "expert_ids must be on the workspace's device ", w.device().str());
        FLASHINFER_CHECK(expert_ids.is_contiguous(), op, "expert_ids",
                         "expert_ids must be contiguous");
        FLASHINFER_CHECK(expert_ids.dtype() == DType::kInt32, op, "expert_ids",
                         "expert_ids must be int32");
        FLASHINFER_CHECK(expert_ids.dim() == 3 && expert_ids.size(0) == ep, op, "expert_ids",
                         "expert_ids must be [ep_size, runtime_max_tokens_per_rank, top_k] (the "
                         "received ids), ep_size ",
                         ep, ", got ", shape_to_string(expert_ids.shape()));
        FLASHINFER_CHECK(invalid_expert_id >= INT32_MIN && invalid_expert_id <= INT32_MAX, op,
                         "invalid_expert_id", "invalid_expert_id must fit in int32");
        // Ids inside the workspace (its received copy) lie in this rank's payload area: over
        // the counters the kernel reads, the write would race its own reads.
        if (detail::views_overlap(expert_ids, workspace)) {
          const char* lo = w.row(ep_rank) + w.layout.payload_data;
          const char* hi = w.row(ep_rank) + w.size_per_rank;
          const auto* at = static_cast<const char*>(expert_ids.data_ptr());
          FLASHINFER_CHECK(at >= lo && at + expert_ids.nbytes() <= hi, op, "expert_ids",
                           "expert_ids inside the workspace must lie in this rank's payload "
                           "area (its received ids), not over its counters and flags");
        }
        a2a_sanitize(w, expert_ids, invalid_expert_id, enable_pdl, op, "expert_ids");
      },
      expert_ids, workspace, metainfo, ep_rank, invalid_expert_id, enable_pdl);
}

namespace {

// The rows of `t` ([ep, rmax, cols] on the CPU, contiguous) that `order` lists, stacked.
Tensor stack_rows(const Tensor& t, const std::vector<int64_t>& order) {
  const int64_t cols = t.size(2);
  const auto rb = static_cast<std::size_t>(cols) * dtype_size(t.dtype());
  Tensor out = Tensor::empty({static_cast<int64_t>(order.size()), cols}, t.dtype());
  for (std::size_t i = 0; i < order.size(); ++i) {
    std::memcpy(static_cast<char*>(out.data_ptr()) + i * rb,
                static_cast<const char*>(t.data_ptr()) + static_cast<std::size_t>(order[i]) * rb,
                rb);
  }
  return out;
}

// The counts of rows each source sent, read from the workspace behind a dispatch's first output
// (nullopt: not a live MoeAlltoAll receive region).
std::optional<std::vector<int64_t>> received_counts(const Tensor& first) {
  const std::lock_guard<std::mutex> lock(moe_a2a_detail::receive_regions().m);
  const auto& m = moe_a2a_detail::receive_regions().by_address;
  auto it = m.find(first.data_ptr());
  if (it == m.end()) return std::nullopt;
  const std::shared_ptr<Storage> st = it->second.storage.lock();
  if (!st || st != first.storage()) return std::nullopt;
  const Tensor c =
      Tensor::from_storage(st, {it->second.ep}, {1}, it->second.counts_at, DType::kInt32);
  std::vector<int64_t> counts;
  for (double v : c.to(Device::cpu()).to_double_vector()) counts.push_back(static_cast<int64_t>(v));
  return counts;
}

// Row r's bytes over every payload ([ep, rmax, cols] tensors on the CPU, contiguous).
std::string row_key(const std::vector<Tensor>& payloads, int64_t r) {
  std::string b;
  for (const Tensor& t : payloads) {
    const auto rb = static_cast<std::size_t>(t.size(2)) * dtype_size(t.dtype());
    b.append(static_cast<const char*>(t.data_ptr()) + static_cast<std::size_t>(r) * rb, rb);
  }
  return b;
}

// MoeAlltoAll.dispatch's outputs: per source, the rows it sent (this side's counts), compared as
// a set (each side's rows sorted by their bytes over every payload: upstream numbers them in its
// atomics' order, this library in token order); rows past the counts keep whatever an earlier
// dispatch left (upstream does not clear them) and are skipped.
// prefix: the outputs' key before their index ("result__" for MoeAlltoAll.dispatch's list,
// "result_0__" for moe_a2a_dispatch's, the tuple's first item).
bool compare_a2a_received(const std::map<std::string, Tensor>& actual, const NamedTensors& expected,
                          const detail::CompareFn& compare, detail::ResultCheck& out,
                          const std::string& prefix, const char* op) {
  auto first = actual.find(prefix + "0");
  if (first == actual.end()) return false;
  const std::optional<std::vector<int64_t>> got_counts = received_counts(first->second);
  if (!got_counts) return false;
  const std::vector<int64_t>& counts = *got_counts;
  std::vector<std::pair<std::string, Tensor>> act, rec;
  for (std::size_t i = 0;; ++i) {
    const std::string key = prefix + std::to_string(i);
    auto a = actual.find(key);
    const Tensor* e = nullptr;
    for (const auto& [k, t] : expected) {
      if (k == key) e = &t;
    }
    if (a == actual.end() && !e) break;
    if (a == actual.end() || !e || a->second.shape() != e->shape() || a->second.dim() != 3 ||
        a->second.size(0) != static_cast<int64_t>(counts.size())) {
      // A missing or misshapen output: the plain comparison says what differs.
      if (a != actual.end() && e) {
        out.comparisons.push_back(compare(key, a->second, *e));
      } else {
        replay::TensorComparison c;
        c.key = key;
        c.problem = a == actual.end() ? "the replayed call returned no tensor '" + key + "'"
                                      : "the recording has no tensor '" + key + "'";
        out.comparisons.push_back(c);
      }
      continue;
    }
    act.emplace_back(key, a->second.to(Device::cpu()).contiguous());
    rec.emplace_back(key, e->to(Device::cpu()).contiguous());
  }
  if (act.empty()) return !out.comparisons.empty();
  const int64_t ep = act[0].second.size(0), rmax = act[0].second.size(1);
  // Each side's valid rows, source by source, in the order of their bytes.
  auto order = [&](const std::vector<std::pair<std::string, Tensor>>& side) {
    std::vector<int64_t> rows;
    for (int64_t s = 0; s < ep; ++s) {
      std::vector<int64_t> mine;
      for (int64_t i = 0; i < std::min(counts[s], rmax); ++i) mine.push_back(s * rmax + i);
      std::vector<Tensor> ts;
      for (const auto& kv : side) ts.push_back(kv.second);
      auto bytes = [&](int64_t r) { return row_key(ts, r); };
      std::stable_sort(mine.begin(), mine.end(),
                       [&](int64_t x, int64_t y) { return bytes(x) < bytes(y); });
      rows.insert(rows.end(), mine.begin(), mine.end());
    }
    return rows;
  };
  const std::vector<int64_t> ao = order(act), ro = order(rec);
  for (std::size_t i = 0; i < act.size(); ++i) {
    out.comparisons.push_back(compare(act[i].first + " (each source's rows, as a set)",
                                      stack_rows(act[i].second, ao),
                                      stack_rows(rec[i].second, ro)));
  }
  const int64_t past = ep * rmax - static_cast<int64_t>(ao.size());
  out.note = std::string(op) +
             ": each source's rows compared as a set (upstream orders them by its atomics); " +
             std::to_string(past) + " rows a payload past the counts not compared (older bytes)";
  return true;
}

bool compare_moe_a2a_dispatch(const std::map<std::string, Tensor>& actual,
                              const NamedTensors& expected, const detail::CompareFn& compare,
                              detail::ResultCheck& out) {
  return compare_a2a_received(actual, expected, compare, out, "result__", "MoeAlltoAll.dispatch");
}

// moe_a2a_dispatch's: the views as above, the gathered EPLB statistics (result_2) as they are.
bool compare_module_a2a_dispatch(const std::map<std::string, Tensor>& actual,
                                 const NamedTensors& expected, const detail::CompareFn& compare,
                                 detail::ResultCheck& out) {
  if (!compare_a2a_received(actual, expected, compare, out, "result_0__", "moe_a2a_dispatch")) {
    return false;
  }
  const Tensor* e = nullptr;
  for (const auto& [k, t] : expected) {
    if (k == "result_2") e = &t;
  }
  auto a = actual.find("result_2");
  if (e && a != actual.end()) out.comparisons.push_back(compare("result_2", a->second, *e));
  return true;
}

// A recorded combine's payload, its rows moved from the recorded dispatch's order to the order the
// replayed dispatch gave them: recorded row [s, j] holds the result for the token whose received
// rows (every payload) are the recorded dispatch's [s, j]; that token is at [s, pi(j)] here.
// Unchanged where the rows do not pair up (the dispatch diverged: its own replay says so).
// got: the replayed dispatch's views; payload_at: the payload among the combine's arguments;
// prefix: the recorded views' key before their index (compare_a2a_received).
void permute_combine_payload(std::vector<Value>& a, const Value& got, const NamedTensors& recorded,
                             std::size_t payload_at, const std::string& prefix) {
  if (!got.is_sequence() || got.items().empty() || !got.items()[0].is_tensor()) return;
  const std::optional<std::vector<int64_t>> counts = received_counts(got.items()[0].as_tensor());
  if (!counts || !a.at(payload_at).is_tensor()) return;
  std::vector<Tensor> ours, theirs;
  for (std::size_t i = 0; i < got.items().size(); ++i) {
    const std::string key = prefix + std::to_string(i);
    const Tensor* e = nullptr;
    for (const auto& [k, t] : recorded) {
      if (k == key) e = &t;
    }
    const Tensor& o = got.items()[i].as_tensor();
    if (!e || e->shape() != o.shape()) return;
    ours.push_back(o.to(Device::cpu()).contiguous());
    theirs.push_back(e->to(Device::cpu()).contiguous());
  }
  const Tensor payload = a.at(payload_at).as_tensor();
  if (payload.dim() != 3 || payload.size(0) != ours[0].size(0) ||
      payload.size(1) != ours[0].size(1)) {
    return;
  }
  const int64_t ep = ours[0].size(0), rmax = ours[0].size(1);
  const Tensor src = payload.to(Device::cpu()).contiguous();
  Tensor dst = src.clone();
  const auto rb = static_cast<std::size_t>(payload.size(2)) * dtype_size(payload.dtype());
  bool moved = false;
  for (int64_t s = 0; s < ep; ++s) {
    std::multimap<std::string, int64_t> here;
    const int64_t n = std::min((*counts)[static_cast<std::size_t>(s)], rmax);
    for (int64_t i = 0; i < n; ++i) here.emplace(row_key(ours, s * rmax + i), s * rmax + i);
    for (int64_t j = 0; j < n; ++j) {
      auto it = here.find(row_key(theirs, s * rmax + j));
      if (it == here.end()) return;
      std::memcpy(
          static_cast<char*>(dst.data_ptr()) + static_cast<std::size_t>(it->second) * rb,
          static_cast<const char*>(src.data_ptr()) + static_cast<std::size_t>(s * rmax + j) * rb,
          rb);
      moved = moved || it->second != s * rmax + j;
      here.erase(it);
    }
  }
  if (moved) a.at(payload_at) = Value(dst.to(payload.device()));
}

// moe_a2a_sanitize_expert_ids on one rank (ep_size 1), as after a dispatch that received half
// of runtime_max rows: a workspace of s.batch_size rows initialized, its receive count set, the
// received ids random (the only local op of the exchange: a bench case needs no peers).
BenchCase bench_sanitize(const BenchShape& s, Device dev) {
  const int64_t rmax = std::max<int64_t>(2, s.batch_size), K = 8;
  const int64_t size = moe_a2a_get_workspace_size_per_rank(1, rmax, K * 4, 0);
  Tensor ws = Tensor::zeros({1, size}, DType::kUInt8, dev);
  const Tensor meta = moe_a2a_initialize(ws, 0, 1, rmax);
  const MoeA2aLayout l = MoeA2aLayout::make(1, rmax, 0);
  const int32_t received = static_cast<int32_t>(rmax / 2);
  Tensor count = Tensor::from_vector({static_cast<double>(received)}, {1}, DType::kInt32);
  Tensor::from_storage(ws.storage(), {1}, {1}, (ws.storage_offset() + l.recv_counters) / 4,
                       DType::kInt32)
      .copy_(count.to(dev));
  Tensor ids = api::bench::random_tensor({1, rmax, K}, DType::kFloat32, dev, s.random_seed, 0, 64)
                   .to(DType::kInt32);
  BenchCase c = api::bench::invoke_case(
      "moe_a2a_sanitize_expert_ids",
      {Value(ids), Value(ws), Value(meta), Value(int64_t{0}), Value(int64_t{-1})});
  c.bytes = static_cast<double>(rmax * K * 4);
  return c;
}

}  // namespace

namespace detail {

void register_moe_alltoall_ops(OpRegistry& r) {
  register_result_comparator("MoeAlltoAll.dispatch", compare_moe_a2a_dispatch);
  declare<&moe_a2a_get_workspace_size_per_rank>(
      r,
      {.name = "moe_a2a_get_workspace_size_per_rank",
       .module = kMoeA2aModule,
       .summary = "Bytes of one rank's MoE all-to-all workspace (host-side sizing)"},
      "ep_size", "max_num_tokens", "total_dispatch_payload_size_per_token",
      "combine_payload_size_per_token", arg("eplb_stats_num_experts", int64_t{0}));
  declare<&moe_alltoall_get_moe_workspace_size_per_rank>(
      r,
      {.name = "MoeAlltoAll.get_moe_workspace_size_per_rank",
       .module = kMoeA2aModule,
       .summary = "Bytes of one rank's MoeAlltoAll workspace for 16-bit hidden states"},
      "ep_size", "top_k", "max_num_tokens", "hidden_size",
      arg("extra_payload_bytes_per_token", int64_t{0}), arg("eplb_stats_num_experts", int64_t{0}));
  static constexpr api::BackendSummary kHostSizing[] = {{DeviceType::kCPU, "host-side sizing"}};
  api::register_backends("moe_a2a_get_workspace_size_per_rank", kHostSizing);
  api::register_backends("MoeAlltoAll.get_moe_workspace_size_per_rank", kHostSizing);

  declare_init<MoeA2aInit>(
      r,
      {.name = "MoeAlltoAll.__init__",
       .module = kMoeA2aModule,
       .summary = "Collective: a rank's MoE all-to-all (a workspace every rank of the EP group "
                  "views)"},
      arg("mapping").required(), "max_num_tokens", "top_k", "num_experts",
      arg("workspace_size_per_rank"), arg("hidden_size"), arg("mnnvl_config"),
      arg("eplb_stats_num_experts", int64_t{0}), arg("enable_rank_mask", false),
      arg("backend", std::string("trtllm")).kw());
  declare<&MoeAlltoAll::dispatch>(
      r,
      {.name = "MoeAlltoAll.dispatch",
       .module = kMoeA2aModule,
       .summary = "Collective: each token's payloads to the ranks that own its experts"},
      "token_selected_experts", "input_payloads", "runtime_max_tokens_per_rank",
      arg("invalid_token_expert_id"), arg("expert_id_payload_index"), arg("eplb_local_stats"),
      arg("active_rank_mask"));
  declare<&MoeAlltoAll::combine>(
      r,
      {.name = "MoeAlltoAll.combine",
       .module = kMoeA2aModule,
       .summary = "Collective: the experts' results back to their tokens, summed per token"},
      "payload", "runtime_max_tokens_per_rank", arg("payload_in_workspace", false),
      arg("output_dtype"), arg("output_scales").mut(), arg("output_scalar_scale", 1.0),
      arg("sf_layout", SfLayout::layout_linear), arg("output").mut(),
      arg("use_low_precision", false).kw(), arg("active_rank_mask").kw());
  declare<&MoeAlltoAll::get_combine_payload_tensor_in_workspace>(
      r,
      {.name = "MoeAlltoAll.get_combine_payload_tensor_in_workspace",
       .module = kMoeA2aModule,
       .summary = "A view of this rank's combine region for the experts' outputs",
       .unwritten_results = {"result"},
       .unwritten_reason = "a view of the workspace, written by the experts before combine"},
      "runtime_max_tokens_per_rank", "hidden_size", "dtype");
  declare<&MoeAlltoAll::checkpoint_prepare>(
      r, {.name = "MoeAlltoAll.checkpoint_prepare",
          .module = kMoeA2aModule,
          .summary = "Collective: the workspace's handles marked unmapped while idle"});
  declare<&MoeAlltoAll::checkpoint_restore>(
      r,
      {.name = "MoeAlltoAll.checkpoint_restore",
       .module = kMoeA2aModule,
       .summary = "Collective: the workspace remapped and reinitialized on a new communicator"},
      arg("comm_backend").required());
  static constexpr api::BackendSummary kWorkspace[] = {
    {DeviceType::kCPU, "one host allocation every rank of the process views"},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "one device allocation every rank of the process views (peer access)"},
#endif
  };
  api::register_backends("MoeAlltoAll.__init__", kWorkspace);
  api::register_backends("MoeAlltoAll.dispatch", kDispatchKernels);
  api::register_backends("MoeAlltoAll.combine", kCombineKernels);
  api::register_backends("MoeAlltoAll.get_combine_payload_tensor_in_workspace", kWorkspace);
  api::register_backends("MoeAlltoAll.checkpoint_prepare", kWorkspace);
  api::register_backends("MoeAlltoAll.checkpoint_restore", kWorkspace);

  // Replay: each rank's calls on its instance are a stream; a call replays with every rank's
  // same call on fresh instances made from the recorded constructions, after the call whose
  // state it needs (combine after its dispatch).
  CollectiveSpec spec;
  spec.op = "MoeAlltoAll.dispatch";
  spec.also = {"MoeAlltoAll.combine", "MoeAlltoAll.get_combine_payload_tensor_in_workspace",
               "MoeAlltoAll.checkpoint_prepare", "MoeAlltoAll.checkpoint_restore"};
  spec.local = {"MoeAlltoAll.get_combine_payload_tensor_in_workspace"};
  spec.workspace_param = 0;  // self
  spec.creator = "MoeAlltoAll.__init__";
  spec.creator_mapping_param = 1;
  spec.prepare_creator = [](std::vector<Value>& a, const std::shared_ptr<comm::CommBackend>& c) {
    const int64_t w = c->Get_size();
    a.at(1) = to_value(std::make_shared<Mapping>(w, c->Get_rank(), 8, 1, w, 1, -1, -1, w));
    a.at(7) = to_value(std::make_shared<MnnvlConfig>(c));
  };
  spec.make_workspace = [](const std::shared_ptr<comm::CommBackend>& c, const std::vector<Value>&,
                           const std::vector<Value>* made) -> Value {
    FLASHINFER_CHECK_CODE(made != nullptr, ErrorCode::kUnsupported, "replay", "",
                          "a MoeAlltoAll call replays with its instance's recorded construction "
                          "(MoeAlltoAll.__init__), and the recording has none: start recording "
                          "before the instances are made");
    const std::vector<Value>& a = *made;
    auto opt_int = [&](std::size_t i) {
      return a.at(i).is_none() ? std::optional<int64_t>()
                               : std::optional<int64_t>(a.at(i).as_int());
    };
    return to_value(std::make_shared<MoeAlltoAll>(
        std::make_shared<Mapping>(c->Get_size(), c->Get_rank(), 8, 1, c->Get_size(), 1, -1, -1,
                                  c->Get_size()),
        a.at(2).as_int(), a.at(3).as_int(), a.at(4).as_int(), opt_int(5), opt_int(6),
        std::make_shared<MnnvlConfig>(c), a.at(8).as_int(), a.at(9).as_bool(),
        a.at(10).is_none() ? std::string("trtllm") : a.at(10).as_string()));
  };
  spec.prelude = [](std::string_view fn) -> std::string {
    if (fn == "MoeAlltoAll.combine" ||
        fn == "MoeAlltoAll.get_combine_payload_tensor_in_workspace") {
      return "MoeAlltoAll.dispatch";
    }
    if (fn == "MoeAlltoAll.checkpoint_restore") return "MoeAlltoAll.checkpoint_prepare";
    return std::string();
  };
  spec.after_prelude = [](std::string_view fn, std::vector<Value>& a, const Value& got,
                          const NamedTensors& recorded) {
    if (fn == "MoeAlltoAll.combine") permute_combine_payload(a, got, recorded, 1, "result__");
  };
  spec.adjust_args = [](std::string_view fn, std::vector<Value>& a,
                        const std::shared_ptr<comm::CommBackend>& c) {
    // The recorded payload was a view of the recording's workspace; here it is a tensor of its
    // own, which combine copies in (the same rows, the same sums).
    if (fn == "MoeAlltoAll.combine") a.at(3) = Value(false);
    if (fn == "MoeAlltoAll.checkpoint_restore") a.at(1) = to_value(c);
  };
  register_collective(std::move(spec));

  // The functions beneath MoeAlltoAll. The workspace is no written argument: its other rows are
  // the peers', written while this rank's call runs, so a recording of it could not be compared.
  register_result_comparator("moe_a2a_dispatch", compare_module_a2a_dispatch);
  declare<&moe_a2a_initialize>(
      r,
      {.name = "moe_a2a_initialize",
       .module = kMoeA2aModule,
       .summary = "This rank's row of a MoE all-to-all workspace zeroed; the metainfo returned"},
      "workspace", "ep_rank", "ep_size", "max_num_tokens",
      arg("eplb_stats_num_experts", int64_t{0}));
  declare<&moe_a2a_wrap_payload_tensor_in_workspace>(
      r,
      {.name = "moe_a2a_wrap_payload_tensor_in_workspace",
       .module = kMoeA2aModule,
       .summary = "A typed view of a byte range of one rank's workspace row",
       .unwritten_results = {"result"},
       .unwritten_reason = "a view of the workspace, whose bytes the exchange writes"},
      "workspace", "leading_shape", "slice_start", "slice_end", "dtype");
  declare<&moe_a2a_dispatch>(
      r,
      {.name = "moe_a2a_dispatch",
       .module = kMoeA2aModule,
       .summary = "Collective: each token's payloads to the ranks that own its experts"},
      "token_selected_experts", "input_payloads", "workspace", "metainfo",
      "runtime_max_tokens_per_rank", "ep_rank", "ep_size", "top_k", "num_experts",
      arg("enable_pdl"), arg("eplb_local_stats"), arg("enable_rank_mask", false),
      arg("active_rank_mask"));
  declare<&moe_a2a_combine>(
      r,
      {.name = "moe_a2a_combine",
       .module = kMoeA2aModule,
       .summary = "Collective: the experts' results back to their tokens, summed per token"},
      "payload", "local_num_tokens", "workspace", "metainfo", "runtime_max_tokens_per_rank",
      "ep_rank", "ep_size", "top_k", "combine_payload_offset", arg("payload_in_workspace", false),
      arg("output_dtype"), arg("output_scales").mut(), arg("output_scalar_scale", 1.0),
      arg("sf_layout", SfLayout::layout_linear), arg("output").mut(),
      arg("use_low_precision", false).kw(), arg("enable_pdl").kw(),
      arg("enable_rank_mask", false).kw(), arg("active_rank_mask").kw());
  declare<&moe_a2a_sanitize_expert_ids>(
      r,
      {.name = "moe_a2a_sanitize_expert_ids",
       .module = kMoeA2aModule,
       .summary = "The received ids' rows past each source's count set to invalid_expert_id"},
      // The ids are this rank's received copy: a view of the workspace.
      arg("expert_ids").mut().within("workspace"), "workspace", "metainfo", "ep_rank",
      "invalid_expert_id", arg("enable_pdl"));
  static constexpr api::BackendSummary kRowInit[] = {
    {DeviceType::kCPU, "this rank's row zeroed on the host"},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "this rank's row zeroed on the device, then the stream synchronized"},
#endif
  };
  static constexpr api::BackendSummary kView[] = {
    {DeviceType::kCPU, "a view (no kernel)"},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "a view (no kernel)"},
#endif
  };
  api::register_backends("moe_a2a_initialize", kRowInit);
  api::register_backends("moe_a2a_wrap_payload_tensor_in_workspace", kView);
  api::register_backends("moe_a2a_dispatch", kDispatchKernels);
  api::register_backends("moe_a2a_combine", kCombineKernels);
  api::register_backends("moe_a2a_sanitize_expert_ids", kSanitizeKernels);
  register_bench_hook("moe_a2a_sanitize_expert_ids", bench_sanitize);

  // Replay: each rank's dispatches and combines (keyed by its ep_rank) meet every rank's; a
  // fresh workspace of the recorded shape is initialized with the recorded metainfo's sizes.
  CollectiveSpec mod;
  mod.op = "moe_a2a_dispatch";
  mod.also = {"moe_a2a_combine"};
  mod.workspace_param = 2;
  mod.rank_param = 5;
  mod.world_param = 6;
  mod.make_workspace = [](const std::shared_ptr<comm::CommBackend>& c, const std::vector<Value>& a,
                          const std::vector<Value>*) -> Value {
    const Tensor& recorded = a.at(2).as_tensor();
    const Tensor meta = a.at(3).as_tensor().to(Device::cpu()).contiguous();
    const auto* f = static_cast<const int64_t*>(meta.data_ptr());
    const int64_t ep = c->Get_size();
    FLASHINFER_CHECK_CODE(recorded.dim() == 2 && meta.numel() == MoeA2aLayout::kFields,
                          ErrorCode::kUnsupported, "replay", "workspace",
                          "a moe_a2a call replays with its recorded [ep_size, size_per_rank] "
                          "workspace and metainfo");
    Tensor ws = detail::group_shared_rows(*c, ep, recorded.size(1), DType::kUInt8, 1,
                                          "moe_a2a_dispatch", "workspace");
    moe_a2a_initialize(ws, c->Get_rank(), ep, (f[7] - f[6]) / (4 * MoeA2aLayout::kMaxTopK),
                       (f[9] - f[8]) / (4 * ep));
    c->barrier();
    return Value(ws);
  };
  mod.prelude = [](std::string_view fn) -> std::string {
    return fn == "moe_a2a_combine" ? "moe_a2a_dispatch" : "";
  };
  mod.after_prelude = [](std::string_view fn, std::vector<Value>& a, const Value& got,
                         const NamedTensors& recorded) {
    if (fn == "moe_a2a_combine" && got.is_sequence() && !got.items().empty()) {
      permute_combine_payload(a, got.items()[0], recorded, 0, "result_0__");
    }
  };
  mod.adjust_args = [](std::string_view fn, std::vector<Value>& a,
                       const std::shared_ptr<comm::CommBackend>&) {
    // A payload recorded as a view of the recording's workspace is a tensor of its own here.
    if (fn == "moe_a2a_combine") a.at(9) = Value(false);
  };
  register_collective(std::move(mod));
}

}  // namespace detail

}  // namespace flashinfer
