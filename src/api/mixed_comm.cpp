// flashinfer.comm.mixed_comm: MixedCommHandler and run_mixed_comm. Upstream's checks, messages,
// valid op / mode lists and mode resolution; a handler's peer buffers (core/peer_memory.h),
// grown when a larger call comes; the dispatch: each rank publishes its x_in in its buffer and
// computes its output from every rank's (kernels/mixed_comm_params.h: the CPU reference and the
// CUDA kernels share the arithmetic). docs/COMM.md, "Mixed TP / DP collectives"; facts in
// docs/upstream-facts/mixed_comm.md.
#include "flashinfer/ops/mixed_comm.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "api/backends.h"
#include "api/checks.h"
#include "api/device_props.h"
#include "api/enum_table.h"
#include "api/kernel_table.h"
#include "core/comm_abort.h"
#include "core/cuda_runtime.h"
#include "core/peer_memory.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/stream.h"
#include "kernels/cpu/mixed_comm_cpu.h"
#include "kernels/mixed_comm_params.h"
#include "replay/collective_replay.h"

#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/mixed_comm_cuda.h"
#endif

namespace flashinfer {
namespace {

constexpr api::EnumTable<MixedCommOp, 5> kMixedCommOps{
    "MixedCommOp",
    {{{MixedCommOp::ALLREDUCE, "ALLREDUCE"},
      {MixedCommOp::ALLGATHER, "ALLGATHER"},
      {MixedCommOp::REDUCESCATTER, "REDUCESCATTER"},
      {MixedCommOp::ALLREDUCE_ALLGATHER, "ALLREDUCE_ALLGATHER"},
      {MixedCommOp::REDUCESCATTER_ALLREDUCE, "REDUCESCATTER_ALLREDUCE"}}}};

constexpr api::EnumTable<MixedCommMode, 9> kMixedCommModes{
    "MixedCommMode",
    {{{MixedCommMode::FUSED_OPT_WAITS_MC, "FUSED_OPT_WAITS_MC"},
      {MixedCommMode::FUSED_OPT_WAITS_UC, "FUSED_OPT_WAITS_UC"},
      {MixedCommMode::FUSED_OPT_BYTES1_MC, "FUSED_OPT_BYTES1_MC"},
      {MixedCommMode::FUSED_OPT_BYTES1_UC, "FUSED_OPT_BYTES1_UC"},
      {MixedCommMode::FUSED_OPT_BYTES2_MC, "FUSED_OPT_BYTES2_MC"},
      {MixedCommMode::FUSED_OPT_BYTES2_UC, "FUSED_OPT_BYTES2_UC"},
      {MixedCommMode::NCCL_ONE, "NCCL_ONE"},
      {MixedCommMode::NCCL_TP_DP, "NCCL_TP_DP"},
      {MixedCommMode::AUTOTUNE, "AUTOTUNE"}}}};

}  // namespace

std::string_view mixed_comm_op_name(MixedCommOp op) { return kMixedCommOps.name_of(op); }
std::string_view mixed_comm_mode_name(MixedCommMode mode) { return kMixedCommModes.name_of(mode); }
Value to_value(MixedCommOp op) { return kMixedCommOps.to_value(op); }
Value to_value(MixedCommMode mode) { return kMixedCommModes.to_value(mode); }

template <>
struct ArgTraits<MixedCommOp> {
  static constexpr ParamKind kind = ParamKind::kEnum;
  static constexpr const char* type_name = "MixedCommOp";
  static MixedCommOp get(const CallArgs& a, std::size_t i) {
    return kMixedCommOps.from_value(a[i], a.decl().name, a.decl().params.at(i).name);
  }
};
template <>
struct ArgTraits<MixedCommMode> {
  static constexpr ParamKind kind = ParamKind::kEnum;
  static constexpr const char* type_name = "MixedCommMode";
  static MixedCommMode get(const CallArgs& a, std::size_t i) {
    return kMixedCommModes.from_value(a[i], a.decl().name, a.decl().params.at(i).name);
  }
};

namespace {

constexpr const char* kMixedCommModule = "flashinfer.comm.mixed_comm";
constexpr const char* kMixedCommRunOp = "run_mixed_comm";
constexpr int64_t kMixedCommInitialSlot = 64 * 1024;

using kernels::MixedCommParams;

constexpr api::KernelEntry<MixedCommParams> kMixedCommKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: each rank's x_in into its buffer, its call published and every peer's "
     "awaited (atomics), every output element from the peers' buffers in upstream's order",
     nullptr,
     [](const MixedCommParams& p, const api::LaunchContext&) { kernels::cpu::mixed_comm(p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernels: put (all blocks), publish and await (one thread, system-scope release / "
     "acquire), every output element from the peers' buffers (all blocks; the CPU's arithmetic)",
     nullptr,
     [](const MixedCommParams& p, const api::LaunchContext& c) {
       kernels::cuda::mixed_comm(p, c.stream, c.enable_pdl, detail::cuda_sm_count(c.device.index));
     }},
#endif
};

// One of upstream's bare asserts, as an Error naming the argument.
void mc_require(bool ok, const char* arg, const std::string& what) {
  FLASHINFER_CHECK(ok, "MixedCommHandler", arg, what);
}

// ParallelInfo's split of `size` ranks into TP x DP (upstream's four cases).
void mc_split(int64_t size, std::optional<int64_t> tp, std::optional<int64_t> dp, int64_t& tp_out,
              int64_t& dp_out, const char* tp_name, const char* dp_name) {
  if (!tp && !dp) {
    tp_out = size;
    dp_out = 1;
  } else if (!tp) {
    mc_require(
        *dp > 0 && size % *dp == 0, dp_name,
        std::string(dp_name) + " " + std::to_string(*dp) + " must divide " + std::to_string(size));
    tp_out = size / *dp;
    dp_out = *dp;
  } else if (!dp) {
    mc_require(
        *tp > 0 && size % *tp == 0, tp_name,
        std::string(tp_name) + " " + std::to_string(*tp) + " must divide " + std::to_string(size));
    tp_out = *tp;
    dp_out = size / *tp;
  } else {
    mc_require(*tp > 0 && *dp > 0 && *tp * *dp == size, tp_name,
               std::string(tp_name) + " x " + dp_name + " (" + std::to_string(*tp) + " x " +
                   std::to_string(*dp) + ") must be " + std::to_string(size));
    tp_out = *tp;
    dp_out = *dp;
  }
}

bool mc_fused(MixedCommMode m) { return static_cast<int>(m) <= 5; }
bool mc_reduce_scatter(MixedCommOp op) {
  return op == MixedCommOp::REDUCESCATTER || op == MixedCommOp::REDUCESCATTER_ALLREDUCE;
}

}  // namespace

ParallelInfo::ParallelInfo(int64_t world_rank_, int64_t world_size_, int64_t local_rank_,
                           int64_t local_size_, int64_t inter_rank_, int64_t inter_size_,
                           std::optional<int64_t> ltp, std::optional<int64_t> ldp,
                           std::optional<int64_t> itp, std::optional<int64_t> idp)
    : world_rank(world_rank_),
      world_size(world_size_),
      local_rank(local_rank_),
      local_size(local_size_),
      inter_rank(inter_rank_),
      inter_size(inter_size_) {
  mc_require(local_size > 0 && inter_size > 0 && local_rank >= 0 && local_rank < local_size &&
                 inter_rank >= 0 && inter_rank < inter_size,
             "local_rank",
             "ranks must lie in their sizes (local " + std::to_string(local_rank) + " of " +
                 std::to_string(local_size) + ", inter " + std::to_string(inter_rank) + " of " +
                 std::to_string(inter_size) + ")");
  mc_require(world_rank == inter_rank * local_size + local_rank, "world_rank",
             "world_rank " + std::to_string(world_rank) +
                 " must be inter_rank * local_size + local_rank = " +
                 std::to_string(inter_rank * local_size + local_rank));
  mc_require(world_size == inter_size * local_size, "world_size",
             "world_size " + std::to_string(world_size) +
                 " must be inter_size * local_size = " + std::to_string(inter_size * local_size));
  mc_split(local_size, ltp, ldp, local_tp_size, local_dp_size, "local_tp_size", "local_dp_size");
  mc_split(inter_size, itp, idp, inter_tp_size, inter_dp_size, "inter_tp_size", "inter_dp_size");
}

struct MixedCommHandler::Impl {
  Impl(ParallelInfo i, DType d, Device dev) : info(i), dtype(d), device(dev) {}
  ParallelInfo info;
  DType dtype;
  Device device;
  bool use_autotune = true;
  std::shared_ptr<comm::CommBackend> comm;       // null while detached, as upstream drops it
  std::shared_ptr<comm::CommBackend> init_comm;  // the creation's group (upstream's NCCL groups)
  std::unique_ptr<detail::PeerMemory> mem;
  std::vector<std::unique_ptr<detail::PeerMemory>> retired;  // outgrown, kept until shutdown
  int64_t slot_bytes = 0;
  bool mapped = true;
  bool running = true;
  std::vector<MixedCommOp> ops;
  std::vector<MixedCommMode> modes;
};

MixedCommHandler::MixedCommHandler(
    int64_t world_rank, int64_t world_size, int64_t local_rank, int64_t local_size,
    int64_t inter_rank, int64_t inter_size, std::optional<int64_t> local_tp_size,
    std::optional<int64_t> local_dp_size, std::optional<int64_t> inter_tp_size,
    std::optional<int64_t> inter_dp_size, DType dtype, Device device,
    std::optional<int64_t> grid_size, std::optional<int64_t> max_block_size, int64_t min_block_size,
    int64_t min_num_steps, bool ib_enable_ibgda, bool should_init_nvshmem, bool use_autotune,
    std::shared_ptr<comm::CommBackend> comm_backend) {
  (void)min_num_steps;  // upstream's launch schedule only
  (void)ib_enable_ibgda;
  (void)should_init_nvshmem;
  const char* op = "MixedCommHandler";
  FLASHINFER_CHECK(comm_backend != nullptr, op, "comm_backend",
                   "a CommBackend over the world's ranks is required (upstream's is "
                   "torch.distributed's, which C++ does not have)");
  // upstream's order: local_size and dtype, then ParallelInfo's asserts.
  mc_require(local_size > 1, "local_size",
             "local_size must be > 1, got " + std::to_string(local_size));
  FLASHINFER_CHECK_CODE(
      dtype == DType::kFloat16 || dtype == DType::kBFloat16, ErrorCode::kUnsupported, op, "dtype",
      "only torch.float16 and torch.bfloat16 are supported, got ", dtype_torch_name(dtype));
  auto impl = std::make_shared<Impl>(
      ParallelInfo(world_rank, world_size, local_rank, local_size, inter_rank, inter_size,
                   local_tp_size, local_dp_size, inter_tp_size, inter_dp_size),
      dtype, device);
  const ParallelInfo& pi = impl->info;
  const int64_t sms = device.is_cuda() ? detail::cuda_sm_count(device.index) : 0;
  const int64_t grid = grid_size.value_or(sms > 0 ? sms : 1);
  mc_require(grid > 0, "grid_size", "grid_size must be positive, got " + std::to_string(grid));
  mc_require(!device.is_cuda() || grid <= sms, "grid_size",
             "grid_size " + std::to_string(grid) + " exceeds the device's " + std::to_string(sms) +
                 " SMs");
  mc_require(min_block_size % 32 == 0, "min_block_size",
             "min_block_size must be a multiple of 32, got " + std::to_string(min_block_size));
  FLASHINFER_CHECK_CODE(!pi.use_inter(), ErrorCode::kUnsupported, op, "inter_size",
                        "several nodes (inter_size ", inter_size,
                        ") need upstream's nvshmem transport, which flashinfer-cpp does not "
                        "implement: one node only");
  // upstream's valid lists, in its order.
  if (pi.use_mixed()) {
    impl->ops = {MixedCommOp::ALLREDUCE_ALLGATHER, MixedCommOp::REDUCESCATTER_ALLREDUCE};
  } else if (pi.use_tp()) {
    impl->ops = {MixedCommOp::ALLREDUCE};
  } else {
    impl->ops = {MixedCommOp::ALLGATHER, MixedCommOp::REDUCESCATTER};
  }
  impl->modes = {MixedCommMode::FUSED_OPT_WAITS_MC, MixedCommMode::FUSED_OPT_WAITS_UC};
  if (pi.use_local_tp()) {
    impl->modes.push_back(MixedCommMode::FUSED_OPT_BYTES1_MC);
    impl->modes.push_back(MixedCommMode::FUSED_OPT_BYTES1_UC);
  }
  impl->modes.push_back(MixedCommMode::NCCL_ONE);
  if (pi.use_mixed()) impl->modes.push_back(MixedCommMode::NCCL_TP_DP);
  if (use_autotune) impl->modes.push_back(MixedCommMode::AUTOTUNE);
  impl->use_autotune = use_autotune;
  // upstream compiles the local splits of 2, 4 and 8 ranks only.
  const int64_t l = pi.local_tp_size * pi.local_dp_size;
  FLASHINFER_CHECK_CODE(l == 2 || l == 4 || l == 8, ErrorCode::kUnsupported, op, "local_size",
                        "invalid combination of local_tp_size=", pi.local_tp_size,
                        " and local_dp_size=", pi.local_dp_size);
  if (max_block_size) {
    mc_require(*max_block_size % 32 == 0, "max_block_size",
               "max_block_size must be a multiple of 32, got " + std::to_string(*max_block_size));
    mc_require(*max_block_size >= min_block_size, "max_block_size",
               "max_block_size " + std::to_string(*max_block_size) + " is below min_block_size " +
                   std::to_string(min_block_size));
  }
  FLASHINFER_CHECK(comm_backend->Get_size() == world_size && comm_backend->Get_rank() == world_rank,
                   op, "comm_backend", "the comm_backend's rank/size ", comm_backend->Get_rank(),
                   "/", comm_backend->Get_size(), " is not world_rank/world_size ", world_rank, "/",
                   world_size);
  FLASHINFER_CHECK(comm_backend->device() == device, op, "device", "device ", device.str(),
                   " is not the comm_backend's ", comm_backend->device().str());
  impl->comm = comm_backend;
  impl->init_comm = comm_backend;
  impl->slot_bytes = kMixedCommInitialSlot;
  impl->mem = std::make_unique<detail::PeerMemory>(
      *comm_backend, static_cast<std::size_t>(MixedCommParams::kSlotsOffset + 2 * impl->slot_bytes),
      op);
  comm_backend->barrier();
  impl_ = std::move(impl);
}

MixedCommHandler::~MixedCommHandler() {
  // Without shutdown() no barrier says the peers are done: a peer whose get kernel is not even
  // queued yet (its host thread descheduled), or runs on another GPU, may still read this rank's
  // buffer, which a device wait cannot cover. So on CUDA the buffers are kept for the process's
  // life instead of freed (shutdown() frees them after its barrier).
  if (impl_ && impl_->running && impl_->device.is_cuda()) {
    static std::mutex m;
    static auto* kept = new std::vector<std::unique_ptr<detail::PeerMemory>>();  // never freed
    const std::lock_guard<std::mutex> lock(m);
    kept->push_back(std::move(impl_->mem));
    for (auto& r : impl_->retired) kept->push_back(std::move(r));
  }
}
const ParallelInfo& MixedCommHandler::para_info() const { return impl_->info; }
DType MixedCommHandler::dtype() const { return impl_->dtype; }
Device MixedCommHandler::device() const { return impl_->device; }
bool MixedCommHandler::use_autotune() const { return impl_->use_autotune; }
std::vector<MixedCommOp> MixedCommHandler::get_valid_op_list() const { return impl_->ops; }
std::vector<MixedCommMode> MixedCommHandler::get_valid_mode_list() const { return impl_->modes; }

MixedCommMode MixedCommHandler::select_autotune_mode(MixedCommOp, const Tensor&) const {
  return MixedCommMode::FUSED_OPT_WAITS_UC;
}

std::string MixedCommHandler::repr() const {
  const Impl& w = *impl_;
  char group[24];
  std::snprintf(group, sizeof(group), "%p",
                w.init_comm ? w.init_comm->group_id() : static_cast<const void*>(nullptr));
  return "MixedCommHandler(rank=" + std::to_string(w.info.world_rank) +
         ", size=" + std::to_string(w.info.world_size) + ", group=" + group +
         ", local_tp_size=" + std::to_string(w.info.local_tp_size) +
         ", local_dp_size=" + std::to_string(w.info.local_dp_size) +
         ", dtype=" + std::string(dtype_torch_name(w.dtype)) +
         ", use_autotune=" + (w.use_autotune ? "True" : "False") + ")";
}

void MixedCommHandler::checkpoint_prepare() {
  call_op<&MixedCommHandler::checkpoint_prepare>(
      [&] {
        Impl& w = *impl_;
        FLASHINFER_CHECK(w.running, "MixedCommHandler.checkpoint_prepare", "self",
                         "the handler was shut down");
        if (!w.mapped) return;  // no collective, as upstream's
        if (w.device.is_cuda()) {
          detail::cuda_stream_synchronize(current_cuda_stream(), w.device.index);
        }
        w.comm->barrier();
        w.mapped = false;
        w.comm->barrier();
        w.comm = nullptr;
      },
      *this);
}

void MixedCommHandler::checkpoint_restore(std::shared_ptr<comm::CommBackend> comm_backend) {
  call_op<&MixedCommHandler::checkpoint_restore>(
      [&] {
        const char* op = "MixedCommHandler.checkpoint_restore";
        Impl& w = *impl_;
        FLASHINFER_CHECK(w.running, op, "self", "the handler was shut down");
        if (w.mapped) return;  // no collective, as upstream's
        FLASHINFER_CHECK(comm_backend != nullptr, op, "comm_backend", "a CommBackend is required");
        FLASHINFER_CHECK(comm_backend->Get_rank() == w.info.local_rank, op, "comm_backend",
                         "MixedComm checkpoint backend rank does not match local rank");
        FLASHINFER_CHECK(comm_backend->Get_size() == w.info.local_size, op, "comm_backend",
                         "MixedComm checkpoint backend size does not match local size");
        // The exchange starts over as a new handler's: this rank's counter and flag zeroed
        // (every rank its own, then a barrier). The NCCL modes may have run while detached:
        // every rank's last call is done first (a peer may still be waiting to see this rank's
        // flag of it).
        if (w.device.is_cuda()) {
          detail::cuda_stream_synchronize(current_cuda_stream(), w.device.index);
        }
        comm_backend->barrier();
        w.mem->zero_local(static_cast<std::size_t>(MixedCommParams::kSlotsOffset));
        comm_backend->barrier();
        w.comm = std::move(comm_backend);
        w.mapped = true;
      },
      *this, comm_backend);
}

void MixedCommHandler::shutdown() {
  Impl& w = *impl_;
  FLASHINFER_CHECK(w.running, "MixedCommHandler.shutdown", "self",
                   "Should not call shutdown() more than once.");
  if (w.device.is_cuda()) detail::cuda_device_synchronize(w.device.index);
  // Upstream barriers only while mapped (its NCCL modes never touch the buffers); here the NCCL
  // modes run through them while detached too, so the creation's group meets then.
  (w.mapped && w.comm ? *w.comm : *w.init_comm).barrier();
  w.mem.reset();
  w.retired.clear();
  w.running = false;
}

namespace {

// The call's agreement, through the group's backend: every rank's op, mode and sizes must match,
// and no rank may have refused the call (`refusal`: this rank's): either is refused on every rank
// alike instead of hanging the exchange. The buffers grow together when the call needs more
// (the old ones kept until shutdown: a captured CUDA graph may still name them).
void mc_agree_and_fit(MixedCommHandler::Impl& w, comm::CommBackend& c, MixedCommOp op,
                      MixedCommMode mode, int64_t n_in, int64_t n_out, const std::string* refusal) {
  const std::string mine = refusal ? "!" + *refusal
                                   : std::to_string(static_cast<int>(op)) + "/" +
                                         std::to_string(static_cast<int>(mode)) + "/" +
                                         std::to_string(n_in) + "/" + std::to_string(n_out);
  const std::vector<std::string> all = c.allgather(mine);
  if (refusal) return;  // this rank throws its own
  for (std::size_t r = 0; r < all.size(); ++r) {
    FLASHINFER_CHECK(all[r].empty() || all[r][0] != '!', kMixedCommRunOp, "x_in", "rank ", r,
                     " refused the call: ", all[r].substr(1));
    FLASHINFER_CHECK(all[r] == mine, kMixedCommRunOp, "x_in",
                     "every rank must call run_mixed_comm with the same op, mode and sizes: rank ",
                     c.Get_rank(), " has op/mode/x_in elements/x_out elements ", mine, ", rank ", r,
                     " has ", all[r]);
  }
  const int64_t need = (n_in * 2 + 255) / 256 * 256;
  if (need <= w.slot_bytes) return;
  // Growing waits for the stream and allocates, which a capture refuses (as the per-stream
  // scratch does: a call of this size first runs once outside the capture).
  FLASHINFER_CHECK_CODE(!(w.device.is_cuda() && detail::cuda_current_stream_capturing()),
                        ErrorCode::kUnsupported, kMixedCommRunOp, "x_in", "the call needs ", need,
                        " bytes a slot, the buffers have ", w.slot_bytes,
                        ", and the stream is being captured into a CUDA graph: run a call of "
                        "this size once before capturing");
  // Every rank is past its previous call (the allgather above); on CUDA its kernels are done
  // too before any buffer goes (a peer's may still read this rank's).
  if (w.device.is_cuda()) detail::cuda_stream_synchronize(current_cuda_stream(), w.device.index);
  c.barrier();
  w.retired.push_back(std::move(w.mem));
  w.slot_bytes = std::max(need, 2 * w.slot_bytes);
  w.mem = std::make_unique<detail::PeerMemory>(
      c, static_cast<std::size_t>(MixedCommParams::kSlotsOffset + 2 * w.slot_bytes),
      kMixedCommRunOp);
}

Tensor mixed_comm_run(MixedCommOp op, MixedCommHandler* handler, const Tensor& x_in,
                      const std::optional<Tensor>& x_out_arg,
                      std::optional<MixedCommMode> mode_arg) {
  const char* o = kMixedCommRunOp;
  FLASHINFER_CHECK(handler != nullptr, o, "handler", "expected a MixedCommHandler, got None");
  MixedCommHandler::Impl& w = handler->impl();
  FLASHINFER_CHECK(w.running, o, "handler", "the handler was shut down");
  // The NCCL modes run on the creation's group while detached, as upstream's process groups.
  comm::CommBackend& c = w.mapped ? *w.comm : *w.init_comm;
  const ParallelInfo& pi = w.info;
  MixedCommMode mode{};
  Tensor x_out, in, out;
  Shape out_shape;
  // Every check of this rank, its refusal told to the peers in the agreement below (a refusal
  // on one rank only would leave them waiting there).
  std::exception_ptr refused;
  std::string refusal;
  try {
    api::check_defined(x_in, o, "x_in");
    if (x_in.device().is_cuda()) {
      // upstream's @backend_requirement common check: compute capability 90 or 100 exactly.
      const int cc = api::compute_capability(x_in.device());
      FLASHINFER_CHECK_CODE(cc == 90 || cc == 100, ErrorCode::kUnsupported, o, "x_in",
                            "run_mixed_comm does not support compute capability ", cc,
                            "; supported compute capabilities: [90, 100]");
    }
    // upstream's _common_check, in its order and words.
    FLASHINFER_CHECK(std::find(w.ops.begin(), w.ops.end(), op) != w.ops.end(), o, "op",
                     "Invalid op: ", mixed_comm_op_name(op));
    FLASHINFER_CHECK(
        !mode_arg || std::find(w.modes.begin(), w.modes.end(), *mode_arg) != w.modes.end(), o,
        "mode", "Invalid mode: ", mixed_comm_mode_name(*mode_arg));
    FLASHINFER_CHECK(x_in.dim() >= 2, o, "x_in", "x_in.ndim should be at least 2");
    FLASHINFER_CHECK(x_in.dtype() == w.dtype, o, "x_in", "x_in.dtype should be ",
                     dtype_torch_name(w.dtype));
    FLASHINFER_CHECK(x_in.device() == w.device, o, "x_in", "x_in.device should be ",
                     w.device.str());
    const int64_t dp = pi.dp_size();
    if (mc_reduce_scatter(op)) {
      FLASHINFER_CHECK(x_in.size(0) % dp == 0, o, "x_in",
                       "x_in.shape[0] should be divisible by dp_size");
    }
    const int64_t rows_out = mc_reduce_scatter(op)          ? x_in.size(0) / dp
                             : op == MixedCommOp::ALLREDUCE ? x_in.size(0)
                                                            : x_in.size(0) * dp;
    if (x_out_arg && x_out_arg->defined()) {
      const Tensor& x = *x_out_arg;
      FLASHINFER_CHECK(x.dim() == x_in.dim(), o, "x_out",
                       "x_out.ndim should be equal to x_in.ndim");
      FLASHINFER_CHECK(x.dtype() == x_in.dtype(), o, "x_out",
                       "x_out.dtype should be equal to x_in.dtype");
      FLASHINFER_CHECK(x.device() == x_in.device(), o, "x_out",
                       "x_out.device should be equal to x_in.device");
      bool rest = true;
      for (int64_t d = 1; d < x_in.dim(); ++d) rest = rest && x.size(d) == x_in.size(d);
      FLASHINFER_CHECK(rest, o, "x_out", "x_out.shape[1:] should be equal to x_in.shape[1:]");
      if (mc_reduce_scatter(op)) {
        FLASHINFER_CHECK(x.size(0) * dp == x_in.size(0), o, "x_out",
                         "x_out.shape[0] * dp_size should be equal to x_in.shape[0]");
      } else {
        FLASHINFER_CHECK(x.size(0) == x_in.size(0) * dp, o, "x_out",
                         "x_out.shape[0] should be equal to x_in.shape[0] * dp_size");
      }
    }
    // Mode None: AUTOTUNE with use_autotune, else NCCL_TP_DP where valid, else NCCL_ONE.
    mode = mode_arg.value_or(w.use_autotune   ? MixedCommMode::AUTOTUNE
                             : pi.use_mixed() ? MixedCommMode::NCCL_TP_DP
                                              : MixedCommMode::NCCL_ONE);
    if (mode == MixedCommMode::AUTOTUNE) mode = handler->select_autotune_mode(op, x_in);
    const bool fused = mc_fused(mode);
    out_shape = x_in.shape();
    out_shape[0] = rows_out;
    x_out = x_out_arg && x_out_arg->defined()
                ? *x_out_arg
                : Tensor::empty(out_shape, x_in.dtype(), x_in.device());
    if (fused) {
      // upstream's C++ checks of the fused kernels.
      FLASHINFER_CHECK(x_out.is_contiguous(), o, "x_out", "x_out must be contiguous");
      FLASHINFER_CHECK(x_in.is_contiguous(), o, "x_in", "x_in must be contiguous");
      const int64_t num_elems_all = mc_reduce_scatter(op) ? x_out.numel() : x_in.numel();
      FLASHINFER_CHECK(num_elems_all % 8 == 0, o, "x_in", "num_elems_all must be divisible by 8");
      // Where upstream's host code would divide by zero.
      FLASHINFER_CHECK(num_elems_all > 0, o, "x_in", "empty tensors are refused (upstream divides ",
                       "by a zero step count)");
      FLASHINFER_CHECK(w.mapped, o, "handler",
                       "the handler is detached (checkpoint_prepare): the fused modes need "
                       "checkpoint_restore first (upstream's would fault on the released memory)");
    }
    in = x_in.contiguous();
    out = x_out.is_contiguous() ? x_out : Tensor::empty(out_shape, x_in.dtype(), x_in.device());
  } catch (const std::exception& e) {
    refused = std::current_exception();
    refusal = e.what();
  }
  mc_agree_and_fit(w, c, op, mode, in.defined() ? in.numel() : 0, out.defined() ? out.numel() : 0,
                   refused ? &refusal : nullptr);
  if (refused) std::rethrow_exception(refused);
  const bool direct = out.data_ptr() == x_out.data_ptr();
  if (out.numel() == 0) return x_out;
  MixedCommParams p;
  p.op = static_cast<int>(op);
  p.mode = static_cast<int>(mode);
  p.rank = static_cast<int>(pi.local_rank);
  p.size = static_cast<int>(pi.local_size);
  p.ltp = static_cast<int>(pi.local_tp_size);
  p.ldp = static_cast<int>(pi.local_dp_size);
  p.bf16 = w.dtype == DType::kBFloat16;
  p.n_in = in.numel();
  p.n_out = out.numel();
  p.x_in = in.data_ptr();
  p.x_out = out.data_ptr();
  for (int r = 0; r < p.size; ++r) p.peer_buf[r] = static_cast<char*>(w.mem->peer(r));
  p.slot_bytes = w.slot_bytes;
  p.abort = w.device.is_cuda() ? detail::thread_group_abort_word() : nullptr;
  // Ranks that are threads sharing a context enqueue their kernels together (the reason:
  // core/comm_abort.h); every rank of `c` makes this call (mc_agree_and_fit above met them all).
  detail::gated_collective_launch(
      &c, c.Get_size(), w.device,
      [] {
#if FLASHINFER_WITH_CUDA
        kernels::cuda::preload_mixed_comm();
#endif
      },
      [&] { api::launch(kMixedCommKernels, p, x_in.device(), o, "x_in"); });
  // On the CPU no rank returns (and may free its buffer) while a peer still reads it.
  if (!w.device.is_cuda()) c.barrier();
  if (!direct) x_out.copy_(out);
  return x_out;
}

}  // namespace

Tensor run_mixed_comm(MixedCommOp op, std::shared_ptr<MixedCommHandler> handler, const Tensor& x_in,
                      std::optional<Tensor> x_out, std::optional<MixedCommMode> mode) {
  return call_op<&run_mixed_comm>(
      [&] { return mixed_comm_run(op, handler.get(), x_in, x_out, mode); }, op, handler, x_in,
      x_out, mode);
}

namespace detail {

void register_mixed_comm_ops(OpRegistry& r) {
  declare<&run_mixed_comm>(
      r,
      {.name = "run_mixed_comm",
       .module = kMixedCommModule,
       .summary = "Collective: all-reduce over TP, all-gather / reduce-scatter over DP, and "
                  "their fused pairs"},
      "op", arg("handler").required(), "x_in",
      // ALLREDUCE may write over its input: x_in is read into the buffers before any output.
      arg("x_out").mut().same_view_as("x_in"), arg("mode"));
  api::register_backends("run_mixed_comm", kMixedCommKernels);
  declare<&MixedCommHandler::checkpoint_prepare>(
      r, {.name = "MixedCommHandler.checkpoint_prepare",
          .module = kMixedCommModule,
          .summary = "Collective: the handler's buffers detached while idle"});
  declare<&MixedCommHandler::checkpoint_restore>(
      r,
      {.name = "MixedCommHandler.checkpoint_restore",
       .module = kMixedCommModule,
       .summary = "Collective: the buffers attached again, the exchange restarted"},
      arg("comm_backend").required());
  static constexpr api::BackendSummary kHandlerBackends[] = {
    {DeviceType::kCPU, "host buffers every rank of the process maps"},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "device buffers shared by CUDA IPC handles or peer access"},
#endif
  };
  api::register_backends("MixedCommHandler.checkpoint_prepare", kHandlerBackends);
  api::register_backends("MixedCommHandler.checkpoint_restore", kHandlerBackends);

  // Replay runs every rank's recorded call together, each on a handler made for it here with
  // the recorded split (this library's repr names it; upstream's default repr does not, and
  // then the op and shapes say it).
  CollectiveSpec spec;
  spec.op = "run_mixed_comm";
  spec.workspace_param = 1;
  spec.place_by_workspace_repr = true;
  spec.also = {"MixedCommHandler.checkpoint_prepare", "MixedCommHandler.checkpoint_restore"};
  spec.workspace_params = {{"MixedCommHandler.checkpoint_prepare", 0},
                           {"MixedCommHandler.checkpoint_restore", 0}};
  spec.prelude = [](std::string_view fn) -> std::string {
    return fn == "MixedCommHandler.checkpoint_restore" ? "MixedCommHandler.checkpoint_prepare"
                                                       : std::string();
  };
  spec.adjust_args = [](std::string_view fn, std::vector<Value>& a,
                        const std::shared_ptr<comm::CommBackend>& c) {
    if (fn == "MixedCommHandler.checkpoint_restore") a.at(1) = to_value(c);
  };
  spec.make_workspace = [](const std::shared_ptr<comm::CommBackend>& c,
                           const std::vector<Value>& args, const std::vector<Value>*) {
    const int64_t L = c->Get_size();
    std::string repr;
    std::optional<DType> dtype;
    std::optional<int64_t> ltp;
    bool use_autotune = true;
    for (const Value& v : args) {
      if (v.kind() == Value::Kind::kObject && v.as_object().type == "MixedCommHandler") {
        repr = v.as_object().repr;
      }
    }
    auto field = [&](const std::string& key) -> std::optional<std::string> {
      const auto at = repr.find(key + "=");
      if (at == std::string::npos) return std::nullopt;
      const auto from = at + key.size() + 1;
      return repr.substr(from, repr.find_first_of(",)", from) - from);
    };
    if (const auto t = field("local_tp_size")) {
      try {
        ltp = std::stoll(*t);
      } catch (const std::exception&) {
        FLASHINFER_FAIL(ErrorCode::kFormat, "replay", "",
                        "a MixedCommHandler repr with a malformed local_tp_size: ", repr);
      }
    }
    if (const auto d = field("dtype"))
      dtype = *d == "torch.float16" ? DType::kFloat16 : DType::kBFloat16;
    if (const auto u = field("use_autotune")) use_autotune = *u == "True";
    if (args.size() >= 3 && args.at(2).is_tensor()) {
      const Tensor& x = args.at(2).as_tensor();
      if (!dtype) dtype = x.dtype();
      if (!ltp && args.at(0).kind() != Value::Kind::kNone) {
        // An upstream handler: the op says TP only or DP only; the fused pairs need x_out.
        const int64_t op = args.at(0).kind() == Value::Kind::kInt
                               ? args.at(0).as_int()
                               : std::stoll(args.at(0).as_enum().value);
        if (op == 0) ltp = L;
        if (op == 1 || op == 2) ltp = 1;
        if ((op == 3 || op == 4) && args.at(3).is_tensor() && x.dim() >= 1 &&
            args.at(3).as_tensor().dim() >= 1) {
          const int64_t a = x.size(0), b = args.at(3).as_tensor().size(0);
          const int64_t dp = op == 3 ? (a > 0 ? b / a : 0) : (b > 0 ? a / b : 0);
          if (dp > 0 && L % dp == 0) ltp = L / dp;
        }
      }
    }
    // A checkpoint call moves no data: any split and dtype replay it.
    if (args.size() <= 2 && !ltp) {
      ltp = L;
      if (!dtype) dtype = DType::kBFloat16;
    }
    FLASHINFER_CHECK_CODE(ltp.has_value() && dtype.has_value(), ErrorCode::kUnsupported, "replay",
                          "",
                          "a MixedCommHandler's split (local_tp_size) is neither in its "
                          "recorded repr nor in the call's op and shapes");
    return to_value(std::make_shared<MixedCommHandler>(
        c->Get_rank(), L, c->Get_rank(), L, 0, 1, *ltp, std::nullopt, std::nullopt, std::nullopt,
        *dtype, c->device(), std::nullopt, std::nullopt, 256, 4, true, true, use_autotune, c));
  };
  register_collective(std::move(spec));
}

}  // namespace detail

}  // namespace flashinfer
