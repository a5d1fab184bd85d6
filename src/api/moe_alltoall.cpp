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
#include "api/checks.h"
#include "api/comm_shared.h"
#include "api/device_props.h"
#include "api/kernel_table.h"
#include "core/comm_abort.h"
#include "core/cuda_runtime.h"
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
  const void* receive_address() const { return row(ep_rank) + layout.payload_data; }
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

// moe_a2a_initialize: this rank's row zeroed, its metainfo built.
Tensor a2a_initialize_row(const SharedWorkspace& w, const char* op) {
  FLASHINFER_CHECK(w.layout.payload_data <= w.size_per_rank, op, "workspace_size_per_rank",
                   "workspace size per rank insufficient, need at least ", w.layout.payload_data,
                   " bytes but has ", w.size_per_rank);
  w.rows.select(0, w.ep_rank).fill_(0.0);
  const Device dev = w.rows.device();
  if (dev.is_cuda()) detail::cuda_stream_synchronize(current_cuda_stream(), dev.index);
  std::vector<double> f(MoeA2aLayout::kFields);
  for (int i = 0; i < MoeA2aLayout::kFields; ++i) f[i] = static_cast<double>(w.layout.field(i));
  return Tensor::from_vector(f, {MoeA2aLayout::kFields}, DType::kInt64);
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
          {
            const std::lock_guard<std::mutex> lock(moe_a2a_detail::receive_regions().m);
            auto& m = moe_a2a_detail::receive_regions().by_address;
            std::erase_if(m, [](const auto& e) { return e.second.storage.expired(); });
            m[w->receive_address()] = {
                w->rows.storage(),
                (w->rows.storage_offset() + r * size + w->layout.recv_counters) / 4, ep};
          }
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
        // The low-level dispatch's checks (moe_a2a_dispatch).
        const Device dev = im.device();
        const Tensor& ex = token_selected_experts;
        api::check_defined(ex, op, "token_selected_experts");
        FLASHINFER_CHECK(ex.device() == dev, op, "token_selected_experts",
                         "token_selected_experts must be on the workspace's device ", dev.str(),
                         ", got ", ex.device().str());
        FLASHINFER_CHECK(ex.is_contiguous(), op, "token_selected_experts",
                         "token_selected_experts must be contiguous");
        FLASHINFER_CHECK(ex.dtype() == DType::kInt32, op, "token_selected_experts",
                         "token_selected_experts must be int32");
        FLASHINFER_CHECK(ex.dim() == 2 && ex.size(1) == im.top_k, op, "token_selected_experts",
                         "token_selected_experts shape mismatch");
        const int64_t T = ex.size(0);
        const auto np = static_cast<int64_t>(input_payloads.size());
        FLASHINFER_CHECK(np >= 1, op, "input_payloads", "At least one payload is required");
        FLASHINFER_CHECK(np <= MoeA2aLayout::kMaxPayloads, op, "input_payloads",
                         "Too many payloads: ", np, " > ", MoeA2aLayout::kMaxPayloads);
        const int64_t ep = w.ep_size;
        FLASHINFER_CHECK(ep > 0 && ep <= MoeA2aLayout::kMaxRanks, op, "self",
                         "ep_size must be in (0, ", MoeA2aLayout::kMaxRanks, "]");
        FLASHINFER_CHECK(rmax > 0, op, "runtime_max_tokens_per_rank",
                         "runtime_max_tokens_per_rank must be positive");
        FLASHINFER_CHECK(im.num_experts >= ep, op, "self", "num_experts must be >= ep_size");
        FLASHINFER_CHECK(im.top_k > 0 && im.top_k <= MoeA2aLayout::kMaxTopK, op, "self",
                         "top_k must be in (0, ", MoeA2aLayout::kMaxTopK, "]");
        FLASHINFER_CHECK(kernels::moe_a2a_top_k_supported(static_cast<int>(im.top_k)), op, "self",
                         "Unsupported top_k: ", im.top_k);
        // Upstream leaves this to the caller (SGLang asserts it); more tokens than rows would
        // write past a source's rows.
        FLASHINFER_CHECK(T <= rmax, op, "token_selected_experts", "local_num_tokens ", T,
                         " exceeds runtime_max_tokens_per_rank ", rmax);
        MoeA2aDispatchParams p;
        p.ep_rank = static_cast<int>(w.ep_rank);
        p.ep_size = static_cast<int>(ep);
        p.top_k = static_cast<int>(im.top_k);
        p.num_experts = static_cast<int>(im.num_experts);
        p.tokens = T;
        p.runtime_max = rmax;
        p.experts = static_cast<const int32_t*>(ex.data_ptr());
        p.num_payloads = static_cast<int>(np);
        p.layout = w.layout;
        int64_t off = w.layout.payload_data;
        for (int64_t i = 0; i < np; ++i) {
          const Tensor& x = input_payloads[static_cast<std::size_t>(i)];
          const std::string name = "input_payloads[" + std::to_string(i) + "]";
          api::check_defined(x, op, name.c_str());
          FLASHINFER_CHECK(x.device() == dev, op, name, "payload ", i,
                           " must be on the workspace's device ", dev.str());
          FLASHINFER_CHECK(x.is_contiguous(), op, name, "payload ", i, " must be contiguous");
          FLASHINFER_CHECK(x.dim() == 2, op, name, "payload ", i, " must be 2D");
          FLASHINFER_CHECK(x.size(0) == T, op, name, "payload ", i,
                           " first dim must equal local_num_tokens");
          const auto es = static_cast<int64_t>(dtype_size(x.dtype()));
          FLASHINFER_CHECK(off % es == 0, op, name, "Misaligned payload buffer ", i, ": offset ",
                           off, " is not a multiple of its element size ", es,
                           ". Consider reordering payloads by largest to smallest element size");
          p.payload[i] = x.data_ptr();
          p.row_bytes[i] = x.size(1) * es;
          p.region[i] = off;
          off += ep * rmax * p.row_bytes[i];
        }
        FLASHINFER_CHECK(off <= w.size_per_rank, op, "input_payloads",
                         "workspace size per rank insufficient, need ", off, " bytes but has ",
                         w.size_per_rank);
        if (eplb_local_stats) {
          const Tensor& s = *eplb_local_stats;
          FLASHINFER_CHECK(s.dtype() == DType::kInt32, op, "eplb_local_stats",
                           "eplb_local_stats must be int32");
          FLASHINFER_CHECK(s.device() == dev && s.is_contiguous(), op, "eplb_local_stats",
                           "eplb_local_stats must be contiguous on ", dev.str());
          p.eplb_local = static_cast<const int32_t*>(s.data_ptr());
          p.eplb_count = s.numel();
          p.eplb_experts = w.eplb_experts;
        }
        p.active = a2a_read_mask(active_rank_mask, im.enable_rank_mask, w.ep_rank, op);
        std::optional<int64_t> ids_index;
        if (invalid_token_expert_id) {
          FLASHINFER_CHECK(expert_id_payload_index.has_value(), op, "expert_id_payload_index",
                           "expert_id_payload_index required when invalid_token_expert_id is "
                           "set");
          ids_index = *expert_id_payload_index;
          FLASHINFER_CHECK(*ids_index >= 0 && *ids_index < np, op, "expert_id_payload_index",
                           "expert_id_payload_index ", *ids_index, " out of range [0, ", np, ")");
          const Tensor& ids = input_payloads[static_cast<std::size_t>(*ids_index)];
          FLASHINFER_CHECK(ids.dtype() == DType::kInt32, op, "expert_id_payload_index",
                           "expert_ids must be int32");
        }
        p.workspace = static_cast<char*>(w.rows.data_ptr());
        p.rank_stride = w.size_per_rank;
        p.abort = detail::thread_group_abort_word();
        im.ws->note_launch();
        api::launch(kDispatchKernels, p, dev, op, "token_selected_experts");
        // Views of this rank's receive regions.
        std::vector<Tensor> out;
        const auto& st = w.rows.storage();
        const int64_t base = w.rows.storage_offset() + w.ep_rank * w.size_per_rank;
        for (int64_t i = 0; i < np; ++i) {
          const Tensor& x = input_payloads[static_cast<std::size_t>(i)];
          const auto es = static_cast<int64_t>(dtype_size(x.dtype()));
          const int64_t cols = x.size(1);
          FLASHINFER_CHECK_CODE(base % es == 0, ErrorCode::kInternal, op, "input_payloads",
                                "a workspace row is not aligned to ", es, " bytes");
          out.push_back(Tensor::from_storage(st, {ep, rmax, cols}, {rmax * cols, cols, 1},
                                             (base + p.region[i]) / es, x.dtype()));
        }
        if (ids_index) {
          MoeA2aSanitizeParams s;
          s.ep_rank = p.ep_rank;
          s.ep_size = p.ep_size;
          s.runtime_max = rmax;
          s.top_k = out[static_cast<std::size_t>(*ids_index)].size(2);
          s.ids = static_cast<int32_t*>(out[static_cast<std::size_t>(*ids_index)].data_ptr());
          s.invalid_id = static_cast<int32_t>(*invalid_token_expert_id);
          s.row = w.row(w.ep_rank);
          s.layout = w.layout;
          api::launch(kSanitizeKernels, s, dev, op, "invalid_token_expert_id");
        }
        im.local_num_tokens = T;
        im.dispatch_rmax = rmax;
        im.combine_offset = MoeA2aLayout::align128(off);
        im.eplb_gathered.reset();
        if (eplb_local_stats) {
          im.eplb_gathered = Tensor::from_storage(st, {ep, w.eplb_experts}, {w.eplb_experts, 1},
                                                  (base + w.layout.eplb_stats) / 4, DType::kInt32);
        }
        im.dispatched = true;
        w.dispatched_by.store(&im);
        return out;
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
        const Device dev = im.device();
        api::check_defined(payload, op, "payload");
        FLASHINFER_CHECK(payload.device() == dev, op, "payload",
                         "payload must be on the workspace's device ", dev.str(), ", got ",
                         payload.device().str());
        FLASHINFER_CHECK(payload.is_contiguous(), op, "payload", "payload must be contiguous");
        FLASHINFER_CHECK(
            payload.dim() == 3 && payload.size(0) == w.ep_size && payload.size(1) == rmax, op,
            "payload", "payload must be [ep_size, runtime_max_tokens_per_rank, hidden]");
        const DType pd = payload.dtype();
        FLASHINFER_CHECK(pd == DType::kFloat16 || pd == DType::kBFloat16 || pd == DType::kFloat32 ||
                             pd == DType::kFloat8E4M3FN,
                         op, "payload",
                         "Unsupported dtype for MoE combine: ", dtype_torch_name(pd));
        FLASHINFER_CHECK(kernels::moe_a2a_top_k_supported(static_cast<int>(im.top_k)), op, "self",
                         "Unsupported top_k: ", im.top_k);
        const int64_t H = payload.size(2), T = im.local_num_tokens;
        const auto pe = static_cast<int64_t>(dtype_size(pd));
        // Upstream's fp8 combine kernel writes bf16 while its host side sizes an fp8 output
        // (docs/upstream-facts/moe_alltoall_kernels.md, 3): refused rather than repeated.
        FLASHINFER_CHECK_CODE(pd != DType::kFloat8E4M3FN || use_low_precision,
                              ErrorCode::kUnsupported, op, "payload",
                              "an fp8 payload without use_low_precision (upstream writes bf16 "
                              "values into an fp8-sized output) is refused");
        const DType region = use_low_precision ? DType::kFloat8E4M3FN : pd;
        const auto re = static_cast<int64_t>(dtype_size(region));
        FLASHINFER_CHECK(
            im.combine_offset + w.ep_size * rmax * H * std::max(pe, re) <= w.size_per_rank, op,
            "payload", "workspace insufficient for combine payload region");
        const int64_t at = w.rows.storage_offset() + w.ep_rank * w.size_per_rank;
        if (payload_in_workspace) {
          const char* expect = static_cast<const char*>(w.rows.data_ptr()) +
                               w.ep_rank * w.size_per_rank + im.combine_offset;
          FLASHINFER_CHECK(static_cast<const char*>(payload.data_ptr()) == expect, op, "payload",
                           "payload_in_workspace is True but tensor pointer mismatch");
          FLASHINFER_CHECK_CODE(!use_low_precision, ErrorCode::kUnsupported, op,
                                "use_low_precision",
                                "use_low_precision with payload_in_workspace is not implemented "
                                "in flashinfer-cpp");
        }
        if (output_scales) {
          if (dev.is_cuda() && api::compute_capability(dev) < 100) {
            const int cc = api::compute_capability(dev);
            FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "output_scales",
                            "Quantized moe_a2a_combine requires SM>=100 (Blackwell), but got SM",
                            cc);
          }
          FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "output_scales",
                          "quantized combine outputs (MXFP8, MXFP4, NVFP4) are not implemented in "
                          "flashinfer-cpp");
        }
        (void)output_scalar_scale;
        (void)sf_layout;
        DType od = output_dtype.value_or(use_low_precision ? DType::kBFloat16 : pd);
        if (use_low_precision) {
          FLASHINFER_CHECK(od == DType::kBFloat16, op, "output_dtype",
                           "low-precision combine must produce a bf16 output");
        } else {
          FLASHINFER_CHECK(od == pd, op, "output_dtype",
                           "output_dtype without output_scales must match payload dtype");
        }
        Tensor out;
        if (output) {
          out = *output;
          api::check_defined(out, op, "output");
          FLASHINFER_CHECK(out.device() == dev, op, "output",
                           "output must be a CUDA tensor, got "
                           "device=",
                           out.device().str());
          FLASHINFER_CHECK(
              out.is_contiguous(), op, "output",
              "output must be contiguous, got stride=", shape_to_string(out.strides()));
          FLASHINFER_CHECK(
              out.dtype() == od && out.dim() == 2 && out.size(0) == T && out.size(1) == H, op,
              "output", "output must be [", T, ", ", H, "] of ", dtype_torch_name(od), ", got ",
              shape_to_string(out.shape()), " of ", dtype_torch_name(out.dtype()));
        } else {
          out = Tensor::empty({T, H}, od, dev);
        }
        MoeA2aCombineParams p;
        p.ep_rank = static_cast<int>(w.ep_rank);
        p.ep_size = static_cast<int>(w.ep_size);
        p.top_k = static_cast<int>(im.top_k);
        p.tokens = T;
        p.runtime_max = rmax;
        p.hidden = H;
        p.payload_dtype = pd;
        p.region_dtype = region;
        p.region_elem_bytes = re;
        p.out_dtype = od;
        p.payload = payload_in_workspace ? nullptr : payload.data_ptr();
        p.out = out.data_ptr();
        p.workspace = static_cast<char*>(w.rows.data_ptr());
        p.rank_stride = w.size_per_rank;
        p.layout = w.layout;
        p.combine_offset = im.combine_offset;
        p.active = a2a_read_mask(active_rank_mask, im.enable_rank_mask, w.ep_rank, op);
        FLASHINFER_CHECK_CODE((at + p.combine_offset) % re == 0, ErrorCode::kInternal, op,
                              "payload", "the combine region is misaligned");
        p.abort = detail::thread_group_abort_word();
        im.ws->note_launch();
        api::launch(kCombineKernels, p, dev, op, "payload");
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
bool compare_moe_a2a_dispatch(const std::map<std::string, Tensor>& actual,
                              const NamedTensors& expected, const detail::CompareFn& compare,
                              detail::ResultCheck& out) {
  auto first = actual.find("result__0");
  if (first == actual.end()) return false;
  const std::optional<std::vector<int64_t>> got_counts = received_counts(first->second);
  if (!got_counts) return false;
  const std::vector<int64_t>& counts = *got_counts;
  std::vector<std::pair<std::string, Tensor>> act, rec;
  for (std::size_t i = 0;; ++i) {
    const std::string key = "result__" + std::to_string(i);
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
  out.note =
      "MoeAlltoAll.dispatch: each source's rows compared as a set (upstream orders them "
      "by its atomics); " +
      std::to_string(past) + " rows a payload past the counts not compared (older bytes)";
  return true;
}

// A recorded combine's payload, its rows moved from the recorded dispatch's order to the order the
// replayed dispatch gave them: recorded row [s, j] holds the result for the token whose received
// rows (every payload) are the recorded dispatch's [s, j]; that token is at [s, pi(j)] here.
// Unchanged where the rows do not pair up (the dispatch diverged: its own replay says so).
void permute_combine_payload(std::vector<Value>& a, const Value& got,
                             const NamedTensors& recorded) {
  if (!got.is_sequence() || got.items().empty() || !got.items()[0].is_tensor()) return;
  const std::optional<std::vector<int64_t>> counts = received_counts(got.items()[0].as_tensor());
  if (!counts || !a.at(1).is_tensor()) return;
  std::vector<Tensor> ours, theirs;
  for (std::size_t i = 0; i < got.items().size(); ++i) {
    const std::string key = "result__" + std::to_string(i);
    const Tensor* e = nullptr;
    for (const auto& [k, t] : recorded) {
      if (k == key) e = &t;
    }
    const Tensor& o = got.items()[i].as_tensor();
    if (!e || e->shape() != o.shape()) return;
    ours.push_back(o.to(Device::cpu()).contiguous());
    theirs.push_back(e->to(Device::cpu()).contiguous());
  }
  const Tensor payload = a.at(1).as_tensor();
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
  if (moved) a.at(1) = Value(dst.to(payload.device()));
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
    if (fn == "MoeAlltoAll.combine") permute_combine_payload(a, got, recorded);
  };
  spec.adjust_args = [](std::string_view fn, std::vector<Value>& a,
                        const std::shared_ptr<comm::CommBackend>& c) {
    // The recorded payload was a view of the recording's workspace; here it is a tensor of its
    // own, which combine copies in (the same rows, the same sums).
    if (fn == "MoeAlltoAll.combine") a.at(3) = Value(false);
    if (fn == "MoeAlltoAll.checkpoint_restore") a.at(1) = to_value(c);
  };
  register_collective(std::move(spec));
}

}  // namespace detail

}  // namespace flashinfer
