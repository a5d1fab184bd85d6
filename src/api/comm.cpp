// flashinfer.comm.allreduce: create_allreduce_fusion_workspace and allreduce_fusion. Upstream's
// checks and messages, the workspace's peer buffers (core/peer_memory.h), and the dispatch: on
// the CPU the API exchanges the inputs through the peer buffers between two barriers and the
// reference sums them; on CUDA one kernel copies, signals, waits and sums (docs/COMM.md).
#include "flashinfer/ops/comm.h"

#include <unistd.h>
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "api/backends.h"
#include "api/checks.h"
#include "api/comm_shared.h"
#include "api/device_props.h"
#include "api/kernel_table.h"
#include "core/comm_abort.h"
#include "core/cuda_runtime.h"
#include "core/device_location.h"
#include "core/peer_memory.h"
#include "core/process_identity.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/stream.h"
#include "kernels/comm_params.h"
#include "kernels/comm_rules.h"
#include "kernels/cpu/comm_cpu.h"
#include "kernels/quantization_params.h"
#include "replay/collective_replay.h"

#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/comm_cuda.h"
#include "kernels/cuda/stream_scratch.h"
#endif

namespace flashinfer {

struct TRTLLMAllReduceFusionWorkspace::Impl {
  int64_t world_size = 0, rank = 0, max_token_num = 0, hidden_dim = 0;
  bool fp32 = false;  // buffers of fp32 elements (upstream's use_fp32_lamport)
  std::shared_ptr<comm::CommBackend> comm;
  std::unique_ptr<detail::PeerMemory> mem;
  bool destroyed = false;
  bool unmapped = false;  // between checkpoint_prepare and checkpoint_restore
  int blocks = 0;         // the CUDA grid the group agreed on (0 on the CPU)
};

struct MNNVLAllReduceFusionWorkspace::Impl {
  int64_t world_size = 0;         // the mapping's (upstream's world_size attribute)
  int64_t tp_size = 0, rank = 0;  // the group the calls sum over; rank is the TP rank
  int64_t buffer_size_bytes = 0;  // each of upstream's three buffers
  std::shared_ptr<comm::CommBackend> comm;
  std::unique_ptr<detail::PeerMemory> mem;
  bool destroyed = false;
  bool unmapped = false;  // between checkpoint_prepare and checkpoint_restore
  int blocks = 0;         // the CUDA grid the group agreed on (0 on the CPU)
};

using PcieInit = Init<PcieIpcAllReduceWorkspace, std::shared_ptr<comm::CommBackend>, int64_t, DType,
                      int64_t, std::optional<Value>, std::optional<Value>, std::optional<Value>>;

namespace {

using kernels::AllReduceFusionParams;
using kernels::ArBufferLayout;

constexpr const char* kAllreduceModule = "flashinfer.comm.allreduce";
constexpr const char* kMnnvlModule = "flashinfer.comm.trtllm_mnnvl_ar";

constexpr api::KernelEntry<AllReduceFusionParams> kAllreduceKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: the inputs exchanged through shared buffers between two barriers, summed "
     "in rank order",
     nullptr,
     [](const AllReduceFusionParams& p, const api::LaunchContext&) {
       kernels::cpu::allreduce_fusion(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernel: each block copies its rows to its buffer, signals every peer's flag and sums "
     "the peers' rows in rank order (peer memory by CUDA IPC or peer access)",
     nullptr,
     [](const AllReduceFusionParams& p, const api::LaunchContext& c) {
       kernels::cuda::allreduce_fusion(p, c.stream, c.enable_pdl,
                                       detail::cuda_sm_count(c.device.index));
     }},
#endif
};

constexpr api::KernelEntry<kernels::MoeLocalParams> kMoeLocalKernels[] = {
    {DeviceType::kCPU, "CPU reference: each rank's MoE local value, every step rounded", nullptr,
     [](const kernels::MoeLocalParams& p, const api::LaunchContext&) {
       kernels::cpu::moe_local_value(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: each rank's MoE local value, one element a thread", nullptr,
     [](const kernels::MoeLocalParams& p, const api::LaunchContext& c) {
       kernels::cuda::moe_local_value(p, c.stream, detail::cuda_sm_count(c.device.index));
     }},
#endif
};

// The kernels' lazy loading forced before a gated launch (core/comm_abort.h).
void preload_allreduce() {
#if FLASHINFER_WITH_CUDA
  kernels::cuda::preload_allreduce_fusion();
#endif
}
void preload_dcp() {
#if FLASHINFER_WITH_CUDA
  kernels::cuda::preload_decode_cp_a2a_alltoall();
#endif
}

int64_t elem_bytes_of(bool fp32) { return fp32 ? 4 : 2; }

std::string pattern_name(int64_t p) {
  static const char* names[] = {"kAllReduce",
                                "kARResidualRMSNorm",
                                "kARResidualRMSNormFP8Quant",
                                "kARResidualRMSNormFP4Quant",
                                "kARResidualRMSNormOutFP8Quant",
                                "kARResidualRMSNormOutFP4Quant",
                                "kMoEReductionARResidualRMSNorm",
                                "kMoEFinalizeARResidualRMSNorm",
                                "kARResidualRMSNormPerTokenGroupFP8PackedQuant",
                                "kARResidualRMSNormOutPerTokenGroupFP8PackedQuant",
                                "kARResidualRMSNormDynamicFP8Quant",
                                "kARResidualRMSNormOutDynamicFP8Quant"};
  return p >= 0 && p < 12 ? names[p] : std::to_string(p);
}

// Upstream's MNNVL sizes: the one-shot threshold (bytes of T * H * tp * itemsize), the signal
// pad after the three buffers, and the allocation granularity (cuMemCreate's 2 MiB here; a
// multicast granularity upstream may round larger).
constexpr int64_t kMnnvlOneShotBytes = 64 * 1024 * 8 * 2;
constexpr int64_t kMnnvlSignalPad = 2048;
constexpr int64_t kMnnvlGranularity = int64_t{2} << 20;

int64_t round_up_to(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Sizes past this are all refused (UINT32_MAX) the same way: products saturate at it instead of
// overflowing.
constexpr int64_t kMnnvlSizeCap = int64_t{1} << 40;

int64_t mnnvl_product(std::initializer_list<int64_t> factors) {
  int64_t v = 1;
  for (int64_t f : factors) {
    f = std::max<int64_t>(f, 0);
    v = f != 0 && v > kMnnvlSizeCap / f ? kMnnvlSizeCap : std::min(v * f, kMnnvlSizeCap);
  }
  return v;
}

int64_t mnnvl_required(int64_t tp, int64_t T, int64_t H, int64_t e, int64_t strategy) {
  if (strategy == MNNVLAllreduceFusionStrategy::AUTO) {
    strategy = mnnvl_product({T, H, tp, e}) <= kMnnvlOneShotBytes
                   ? MNNVLAllreduceFusionStrategy::ONESHOT
                   : MNNVLAllreduceFusionStrategy::TWOSHOT;
  }
  // Anything but ONESHOT sizes for two-shot, as upstream's.
  return strategy == MNNVLAllreduceFusionStrategy::ONESHOT
             ? mnnvl_product({T, H, tp, e})
             : mnnvl_product({2, tp > 0 ? (T + tp - 1) / tp : 0, tp, H, e});
}

// upstream's all_ranks_support_mnnvl: every rank's GPU has NVLink multicast (a collective; CPU
// ranks have none).
bool every_rank_has_multicast(comm::CommBackend& comm) {
  const Device dev = comm.device();
  const bool local = dev.is_cuda() && detail::cuda_multicast_supported(dev.index);
  if (comm.Get_size() <= 1) return local;
  const std::vector<std::string> votes = comm.allgather(local ? "1" : "0");
  return std::all_of(votes.begin(), votes.end(), [](const std::string& v) { return v == "1"; });
}

std::shared_ptr<AllReduceFusionWorkspace> create_impl(
    const std::string& backend, std::optional<int64_t> world_size, std::optional<int64_t> rank,
    std::optional<int64_t> max_token_num, std::optional<int64_t> hidden_dim,
    std::optional<DType> dtype, const std::shared_ptr<comm::CommBackend>& comm,
    bool force_oneshot_support, std::optional<int64_t> gpus_per_node) {
  const char* op = "create_allreduce_fusion_workspace";
  if (backend != "auto" && backend != "trtllm" && backend != "mnnvl") {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, "backend", "Unknown backend: ", backend);
  }
  FLASHINFER_CHECK(comm != nullptr, op, "comm_backend",
                   "a CommBackend is required (upstream's None means torch.distributed's group, "
                   "which C++ does not have)");
  const int64_t w = world_size.value_or(comm->Get_size());
  const int64_t r = rank.value_or(comm->Get_rank());
  FLASHINFER_CHECK(w == comm->Get_size(), op, "world_size", "world_size ", w,
                   " does not match the comm_backend's size ", comm->Get_size());
  FLASHINFER_CHECK(r == comm->Get_rank(), op, "rank", "rank ", r,
                   " does not match the comm_backend's rank ", comm->Get_rank());
  // "auto": mnnvl wins where every rank has multicast (even on one node), else trtllm up to 16
  // ranks.
  bool mnnvl = backend == "mnnvl";
  if (backend == "auto") {
    mnnvl = every_rank_has_multicast(*comm);
    FLASHINFER_CHECK(mnnvl || w <= 16, op, "backend", "No suitable backend found. ");
  }
  if (mnnvl) {
    // Upstream's gpus_per_node None: min(visible GPUs, world_size); it places nothing here.
    const int64_t gpn = gpus_per_node.value_or(
        std::max<int64_t>(1, std::min<int64_t>(detail::cuda_runtime_device_count(), w)));
    auto mapping = std::make_shared<Mapping>(w, r, gpn, 1, w);
    std::optional<int64_t> bytes;
    if (force_oneshot_support) {
      FLASHINFER_CHECK(max_token_num && hidden_dim, op,
                       max_token_num ? "hidden_dim" : "max_token_num",
                       "force_oneshot_support needs max_token_num and hidden_dim");
      // Upstream's element size of dtype None is torch's default dtype's (float32).
      bytes = MNNVLAllReduceFusionWorkspace::get_required_buffer_size_bytes(
          w, *max_token_num, *hidden_dim, dtype.value_or(DType::kFloat32),
          MNNVLAllreduceFusionStrategy::ONESHOT);
    }
    return std::make_shared<MNNVLAllReduceFusionWorkspace>(mapping, max_token_num, hidden_dim,
                                                           dtype, bytes, comm);
  }
  FLASHINFER_CHECK(max_token_num.has_value() && *max_token_num > 0, op, "max_token_num",
                   "must be a positive token count, got ",
                   max_token_num ? std::to_string(*max_token_num) : std::string("None"));
  FLASHINFER_CHECK(hidden_dim.has_value() && *hidden_dim > 0, op, "hidden_dim",
                   "must be a positive size, got ",
                   hidden_dim ? std::to_string(*hidden_dim) : std::string("None"));
  auto impl = std::make_shared<TRTLLMAllReduceFusionWorkspace::Impl>();
  impl->world_size = w;
  impl->rank = r;
  impl->max_token_num = *max_token_num;
  impl->hidden_dim = *hidden_dim;
  impl->fp32 = dtype && *dtype == DType::kFloat32;
  impl->comm = comm;
  const int64_t elems = *max_token_num * *hidden_dim;
  FLASHINFER_CHECK(elems <= (int64_t{1} << 34), op, "max_token_num", "max_token_num ",
                   *max_token_num, " x hidden_dim ", *hidden_dim, " is too large");
  impl->mem = std::make_unique<detail::PeerMemory>(
      *comm, static_cast<std::size_t>(ArBufferLayout::bytes(elems, elem_bytes_of(impl->fp32))), op);
  // Every call launches this grid on every rank (each block pairs with the peers' same block):
  // the group's whole GPUs where ranks have GPUs of their own, a share where they share one.
  impl->blocks = detail::agreed_grid_cap(*comm, ArBufferLayout::kMaxBlocks);
  return std::make_shared<TRTLLMAllReduceFusionWorkspace>(std::move(impl));
}

// MNNVLAllReduceFusionWorkspace's constructor: upstream's sizes and checks, then the peer
// buffers (three of upstream's buffer size fit in ArBufferLayout's two slots of one).
std::shared_ptr<MNNVLAllReduceFusionWorkspace::Impl> make_mnnvl_impl(
    const std::shared_ptr<Mapping>& mapping, std::optional<int64_t> max_num_tokens,
    std::optional<int64_t> hidden_dim, std::optional<DType> dtype,
    std::optional<int64_t> buffer_size_in_bytes, const std::shared_ptr<comm::CommBackend>& comm) {
  const char* op = "MNNVLAllReduceFusionWorkspace";
  FLASHINFER_CHECK(mapping != nullptr, op, "mapping", "a Mapping is required");
  const int64_t tp = mapping->tp_size;
  int64_t req = 0;
  if (buffer_size_in_bytes) {
    FLASHINFER_CHECK(*buffer_size_in_bytes >= 0, op, "buffer_size_in_bytes",
                     "must not be negative, got ", *buffer_size_in_bytes);
    req = std::min(*buffer_size_in_bytes, kMnnvlSizeCap);
  } else {
    FLASHINFER_CHECK(max_num_tokens && hidden_dim && dtype, op,
                     !max_num_tokens ? "max_num_tokens"
                     : !hidden_dim   ? "hidden_dim"
                                     : "dtype",
                     "max_num_tokens, hidden_dim, and dtype must be provided if "
                     "buffer_size_in_bytes is not provided.");
    // Upstream divides by hidden_dim (0: ZeroDivisionError); 0 tokens size nothing.
    FLASHINFER_CHECK(*max_num_tokens >= 0, op, "max_num_tokens", "must not be negative, got ",
                     *max_num_tokens);
    FLASHINFER_CHECK(*hidden_dim > 0, op, "hidden_dim", "must be positive, got ", *hidden_dim);
    const int64_t e = dtype_size(*dtype), T = *max_num_tokens, H = *hidden_dim;
    const int64_t t1 = std::min(kMnnvlOneShotBytes / (tp * e * H), T);
    req = std::max(mnnvl_required(tp, t1, H, e, MNNVLAllreduceFusionStrategy::ONESHOT),
                   mnnvl_required(tp, T, H, e, MNNVLAllreduceFusionStrategy::TWOSHOT));
  }
  req = round_up_to(req, 32);
  FLASHINFER_CHECK(comm != nullptr, op, "comm_backend",
                   "a CommBackend is required (upstream's None means MPI's COMM_WORLD, which "
                   "flashinfer-cpp does not have)");
  FLASHINFER_CHECK(req <= int64_t{0xFFFFFFFF}, op, "buffer_size_in_bytes",
                   "The buffer size in bytes ", req,
                   " is greater than the maximum supported size (UINT32_MAX).");
  FLASHINFER_CHECK(comm->Get_size() == tp && comm->Get_rank() == mapping->tp_rank(), op,
                   "comm_backend", "the comm_backend's rank/size ", comm->Get_rank(), "/",
                   comm->Get_size(), " is not the mapping's TP rank/size ", mapping->tp_rank(), "/",
                   tp);
  auto impl = std::make_shared<MNNVLAllReduceFusionWorkspace::Impl>();
  impl->world_size = mapping->world_size;
  impl->tp_size = tp;
  impl->rank = mapping->tp_rank();
  const int64_t alloc = round_up_to(3 * req + kMnnvlSignalPad, kMnnvlGranularity);
  impl->buffer_size_bytes = (alloc - kMnnvlSignalPad) / 3 / 32 * 32;
  impl->comm = comm;
  impl->mem = std::make_unique<detail::PeerMemory>(
      *comm, static_cast<std::size_t>(ArBufferLayout::bytes(impl->buffer_size_bytes, 1)), op);
  impl->blocks = detail::agreed_grid_cap(*comm, ArBufferLayout::kMaxBlocks);
  return impl;
}

// destroy(): collective, as upstream's: this rank's work done, then every rank's (a barrier),
// then the buffers go (a peer may still have been reading this rank's).
void release_collectively(comm::CommBackend& comm, std::unique_ptr<detail::PeerMemory>& mem) {
  if (mem && mem->device().is_cuda()) detail::cuda_device_synchronize(mem->device().index);
  comm.barrier();
  mem.reset();
}

// checkpoint_prepare of either workspace: this rank's work synchronized and every rank's (a
// barrier) before the handles go, then a barrier; nothing (no collective) while detached.
void detach_collectively(const char* op, bool destroyed, bool& unmapped, comm::CommBackend& comm) {
  FLASHINFER_CHECK(!destroyed, op, "self", "the workspace was destroyed");
  if (unmapped) return;
  const Device dev = comm.device();
  if (dev.is_cuda()) detail::cuda_stream_synchronize(current_cuda_stream(), dev.index);
  comm.barrier();
  unmapped = true;
  comm.barrier();
}

// checkpoint_restore of either workspace: the new backend keeps the rank and size; the exchange
// starts over, as upstream re-initializes its protocol: this rank's flag table and call
// counters zeroed (every rank does its own, then a barrier); the data slots keep whatever they
// hold (upstream's are undefined after a restore). Nothing (no collective) while attached.
void reattach_collectively(const char* op, bool destroyed, bool& unmapped, int64_t rank,
                           int64_t size, const detail::PeerMemory& mem,
                           std::shared_ptr<comm::CommBackend>& comm,
                           std::shared_ptr<comm::CommBackend> next) {
  FLASHINFER_CHECK(!destroyed, op, "self", "the workspace was destroyed");
  if (!unmapped) return;
  FLASHINFER_CHECK(next != nullptr, op, "comm_backend", "a CommBackend is required");
  FLASHINFER_CHECK(next->Get_rank() == rank && next->Get_size() == size, op, "comm_backend",
                   "the communicator must keep the workspace's rank and world size: rank/size ",
                   next->Get_rank(), "/", next->Get_size(), " != ", rank, "/", size);
  mem.zero_local(static_cast<std::size_t>(ArBufferLayout::kSlotsOffset));
  comm = std::move(next);
  comm->barrier();
  unmapped = false;
}

// One rank's part of a call: the peer buffers into `p`, then on the CPU this rank's rows into its
// slot, a barrier, the sums, a barrier (so no rank overwrites its slot while another still reads
// it); on CUDA the kernel does all of it (flags in the buffers).
void run_exchange(const detail::PeerMemory& mem, comm::CommBackend& comm, int64_t slot_elems,
                  int64_t elem_bytes, AllReduceFusionParams& p, Device dev, const char* op,
                  const char* arg, bool enable_pdl) {
  for (int64_t r = 0; r < p.world_size; ++r) {
    auto* base = static_cast<char*>(mem.peer(r));
    p.peer_buf[r] = base;
    p.peer_in[r] = base + ArBufferLayout::kSlotsOffset;
  }
  p.slot_stride = ArBufferLayout::slot_stride(slot_elems, elem_bytes);
  if (dev.is_cpu()) {
    const int64_t bytes = p.tokens * p.hidden * dtype_size(p.dtype);
    if (bytes > 0) {
      std::memcpy(static_cast<char*>(mem.local()) + ArBufferLayout::kSlotsOffset, p.input,
                  static_cast<std::size_t>(bytes));
    }
    comm.barrier();
    api::launch(kAllreduceKernels, p, dev, op, arg);
    comm.barrier();
  } else {
    p.abort = detail::thread_group_abort_word();
    // Ranks that are threads sharing a context enqueue their kernels together (the reason:
    // core/comm_abort.h).
    detail::gated_collective_launch(&comm, p.world_size, dev, preload_allreduce, [&] {
      api::launch(kAllreduceKernels, p, dev, op, arg, enable_pdl);
    });
  }
}

// The tensor arguments allreduce_fusion takes, by name.
struct ArArgs {
  const Tensor& input;
  const std::optional<Tensor>&output, &residual_out, &norm_out, &quant_out, &scale_out,
      &residual_in, &rms_gamma;
  const std::optional<Value>& scale_factor;
};

// allreduce_fusion's MoE arguments (patterns 6 and 7).
struct MoeArgs {
  const std::optional<Value>& device_num_experts;
  const std::optional<Tensor>&scale_input, &active_experts_token_input, &token_input,
      &expanded_idx_to_permuted_idx, &expert_scale_factor, &shared_expert_output;
};

const Tensor& need(const std::optional<Tensor>& t, const char* name, int64_t pattern,
                   const char* op) {
  FLASHINFER_CHECK(t.has_value() && t->defined(), op, name, name, " is required for pattern ",
                   pattern_name(pattern), " (", pattern, ")");
  return *t;
}

// The NVFP4 outputs' scale layout: layout_code (None: SWIZZLED_128x4), SWIZZLED_8x4 refused
// (upstream's kernels write no scales for it).
int64_t nvfp4_layout(std::optional<int64_t> layout_code, const char* op) {
  const int64_t layout = layout_code.value_or(QuantizationSFLayout::SWIZZLED_128x4);
  FLASHINFER_CHECK(layout >= 0 && layout <= 2, op, "layout_code", "unknown layout_code ", layout,
                   " (QuantizationSFLayout: 0, 1 or 2)");
  FLASHINFER_CHECK_CODE(layout != QuantizationSFLayout::SWIZZLED_8x4, ErrorCode::kUnsupported, op,
                        "layout_code",
                        "SWIZZLED_8x4 scale layout: upstream's kernel writes no scales for it; "
                        "use SWIZZLED_128x4 or LINEAR");
  return layout;
}

// scale_out holds the layout's bytes for T tokens x H / 16 block scales, contiguous.
void check_nvfp4_scale_out(const Tensor& s, int64_t layout, int64_t T, int64_t H, const char* op) {
  const int64_t need_bytes =
      kernels::sf_buffer_size(static_cast<kernels::SfLayoutCode>(layout), T, H / 16);
  const auto have_bytes = static_cast<int64_t>(s.numel() * dtype_size(s.dtype()));
  FLASHINFER_CHECK(s.is_contiguous() && have_bytes >= need_bytes, op, "scale_out",
                   "scale_out must be a contiguous buffer of at least ", need_bytes, " bytes for ",
                   T, " tokens x ", H / 16, " scales in this layout, got ", have_bytes);
}

// NVFP4 on CUDA needs SM100+: "the NVFP4 <what> SM100+ (<below>; compute capability N here)",
// `below` saying what upstream does on older GPUs.
void check_nvfp4_arch(Device dev, const char* op, const char* arg, const char* what,
                      const char* below) {
  if (!dev.is_cuda()) return;
  const int cc = api::compute_capability(dev);
  FLASHINFER_CHECK_CODE(cc >= 100, ErrorCode::kUnsupported, op, arg, "the NVFP4 ", what,
                        " SM100+ (", below, "; compute capability ", cc, " here)");
}

// The kernels' scale: a tensor's first element as fp32 [1] on `dev` (kept alive in `holder`; no
// copy for vLLM's fp32 device scale), or a number (None: 1.0) by value in the parameters.
void set_scale(kernels::AllReduceFusionParams& p, const Value& sf, Device dev, const char* op,
               Tensor& holder) {
  if (sf.is_tensor()) {
    const Tensor& st = sf.as_tensor();
    FLASHINFER_CHECK(st.numel() >= 1, op, "scale_factor", "scale_factor is empty");
    // A scale of another dtype or device is converted through a copy, which waits for the
    // stream: a CUDA graph capture refuses that (vLLM's fp32 device scale needs none).
    FLASHINFER_CHECK_CODE(
        !(dev.is_cuda() && (st.dtype() != DType::kFloat32 || st.device() != dev) &&
          detail::cuda_current_stream_capturing()),
        ErrorCode::kUnsupported, op, "scale_factor", "scale_factor is ",
        dtype_torch_name(st.dtype()), " on ", st.device().str(), ": converting it to float32 on ",
        dev.str(), " is a copy that a CUDA graph capture refuses; pass a float32 tensor on ",
        dev.str(), " or a number");
    holder = st.reshape({-1}).slice(0, 0, 1).to(DType::kFloat32).to(dev).contiguous();
    p.scale_factor = static_cast<const float*>(holder.data_ptr());
    return;
  }
  p.scale_factor = nullptr;
  p.scale_value = static_cast<float>(sf.is_none() ? 1.0 : sf.as_float());
}

bool use_oneshot_rule(std::optional<bool> use_oneshot, int64_t T, int64_t H, int64_t W,
                      int64_t itemsize, const char* op) {
  if (use_oneshot) return *use_oneshot;
  // Upstream's table (B200 measurements): one-shot up to this many MiB of T * H * 2 * W * itemsize.
  const double mb = static_cast<double>(T) * static_cast<double>(H) * 2.0 * static_cast<double>(W) *
                    static_cast<double>(itemsize) / 1048576.0;
  const double limit = W == 2 ? 512.0 : W == 4 ? 64.0 : W == 8 ? 42.0 : -1.0;
  FLASHINFER_CHECK(limit > 0, op, "use_oneshot",
                   "use_oneshot=None has no size rule for world_size ", W,
                   " (upstream's table covers 2, 4 and 8 ranks): pass use_oneshot");
  return mb <= limit;
}

// allreduce_fusion on an MNNVL workspace: upstream's checks in its order (the unified API's,
// then its helpers', then its C++ ones), outputs allocated where upstream allocates them, and
// the MNNVL arithmetic (AllReduceFusionParams::mnnvl) on the same exchange.
Tensor mnnvl_allreduce_impl(const ArArgs& a, MNNVLAllReduceFusionWorkspace& ws, int64_t pattern,
                            bool launch_with_pdl, double rms_eps,
                            std::optional<int64_t> layout_code, std::optional<bool> use_oneshot,
                            double weight_bias) {
  const char* op = "allreduce_fusion";
  auto& w = ws.impl();
  FLASHINFER_CHECK(!w.destroyed, op, "workspace", "the workspace was destroyed");
  const bool known = pattern == 0 || pattern == 1 || pattern == 2 || pattern == 3 || pattern == 4 ||
                     pattern == 5 || pattern == 10 || pattern == 11;
  FLASHINFER_CHECK(known, op, "pattern", "MNNVL AllReduce+RMS fusion does not support pattern ",
                   pattern, ". Please try the TRTLLM backend instead.");
  const kernels::ArPattern pat = kernels::ar_pattern(static_cast<int>(pattern));
  const int64_t layout = layout_code.value_or(QuantizationSFLayout::SWIZZLED_128x4);
  FLASHINFER_CHECK(pat.quant == 0 || layout != QuantizationSFLayout::SWIZZLED_8x4, op,
                   "layout_code",
                   "MNNVL quantization fusion supports SWIZZLED_128x4 or LINEAR scale layouts, "
                   "not SWIZZLED_8x4");
  const Tensor& x = a.input;
  api::check_defined(x, op, "input");
  auto given = [](const std::optional<Tensor>& t) { return t && t->defined(); };
  if (pat.quant == 0 && !pat.allreduce_out) {
    FLASHINFER_CHECK(given(a.residual_in), op, "residual_in",
                     "MNNVL AllReduce+RMS fusion requires residual_in");
    FLASHINFER_CHECK(given(a.rms_gamma), op, "rms_gamma",
                     "MNNVL AllReduce+RMS fusion requires rms_gamma");
  } else if (pat.quant != 0) {
    FLASHINFER_CHECK(given(a.residual_in), op, "residual_in",
                     "MNNVL quantized AllReduce+RMS fusion requires residual_in");
    FLASHINFER_CHECK(given(a.rms_gamma), op, "rms_gamma",
                     "MNNVL quantized AllReduce+RMS fusion requires rms_gamma");
    if (pat.quant == 4) {  // upstream allocates none of the dynamic FP8 outputs
      for (const auto& [t, name] : {std::pair{&a.residual_out, "residual_out"},
                                    {&a.quant_out, "quant_out"},
                                    {&a.scale_out, "scale_out"},
                                    {&a.norm_out, "norm_out"}}) {
        if (std::string_view(name) == "norm_out" && !pat.norm_out) continue;
        FLASHINFER_CHECK(given(*t), op, name, "MNNVL dynamic FP8 AllReduce+RMS fusion requires ",
                         name);
      }
    }
  }
  const DType dt = x.dtype();
  const Device dev = x.device();
  // The outputs the pattern writes, allocated where the caller passed None.
  auto or_new = [&](const std::optional<Tensor>& t, const Shape& shape, DType d) {
    return given(t) ? *t : Tensor::empty(shape, d, dev);
  };
  const bool two_d = x.dim() == 2;
  const int64_t T = two_d ? x.size(0) : 0, H = two_d ? x.size(1) : 0;
  Tensor output, residual_out, norm_out, quant_out, scale_out;
  if (pat.allreduce_out) {
    output = or_new(a.output, x.shape(), dt);
  } else {
    residual_out = or_new(a.residual_out, x.shape(), dt);
    if (pat.norm_out) norm_out = or_new(a.norm_out, x.shape(), dt);
  }
  if (pat.quant == 1 || pat.quant == 4) {
    quant_out = or_new(a.quant_out, x.shape(), DType::kFloat8E4M3FN);
  } else if (pat.quant == 2) {
    quant_out = or_new(a.quant_out, {T, H / 2}, DType::kUInt8);
    scale_out = given(a.scale_out)
                    ? *a.scale_out
                    : Tensor::empty({kernels::sf_buffer_size(static_cast<kernels::SfLayoutCode>(
                                                                 std::clamp<int64_t>(layout, 0, 2)),
                                                             T, H / 16)},
                                    DType::kUInt8, dev);
  }
  if (pat.quant == 4) scale_out = *a.scale_out;
  // The helpers' checks.
  auto two_d_check = [&](const Tensor& t, const char* what, const char* name) {
    FLASHINFER_CHECK(t.dim() == 2, op, name, "The ", what, " tensor must be 2D, got ", t.dim(),
                     "D. The shape is ", api::torch_size_string(t.shape()), ".");
  };
  two_d_check(x, "input", "input");
  if (output.defined()) two_d_check(output, "output", "output");
  if (!pat.allreduce_out) {
    two_d_check(*a.residual_in, "residual input", "residual_in");
    two_d_check(residual_out, "residual output", "residual_out");
    FLASHINFER_CHECK(a.rms_gamma->numel() == H, op, "rms_gamma",
                     "The gamma tensor must have the same number of elements as the hidden "
                     "dimension, got ",
                     a.rms_gamma->numel(), " elements but expected ", H, " elements.");
  }
  FLASHINFER_CHECK(!w.unmapped, op, "workspace", "MNNVL handles are not attached");
  const int64_t W = w.tp_size, e = dtype_size(dt);
  const bool oneshot = use_oneshot ? *use_oneshot : T * H * W * e <= kMnnvlOneShotBytes;
  const int64_t required = mnnvl_required(
      W, T, H, e,
      oneshot ? MNNVLAllreduceFusionStrategy::ONESHOT : MNNVLAllreduceFusionStrategy::TWOSHOT);
  FLASHINFER_CHECK(required <= w.buffer_size_bytes, op, "workspace",
                   "The buffer size in the given workspace is insufficient for the given problem "
                   "size. Buffer: ",
                   w.buffer_size_bytes, " bytes, Required: ", required, " bytes.");
  // The C++ side's checks.
  FLASHINFER_CHECK_CODE(dt == DType::kFloat16 || dt == DType::kBFloat16 || dt == DType::kFloat32,
                        ErrorCode::kUnsupported, op, "input",
                        "Unsupported dtype in DISPATCH_FLOATING_TYPES_FOR_MNNVL_ALLREDUCE.");
  FLASHINFER_CHECK(H % (16 / e) == 0, op, "input", "token_dim must be divisible by ", 16 / e);
  FLASHINFER_CHECK(W >= 2 && W <= 64, op, "workspace", "nranks must be between 2 and 64, got ", W);
  const bool pow2 = W == 2 || W == 4 || W == 8 || W == 16 || W == 32 || W == 64;
  if (oneshot) {
    FLASHINFER_CHECK(pow2, op, "workspace", "MNNVL AllReduce: unsupported world_size ", W,
                     ". Supported sizes: {2, 4, 8, 16, 32, 64}");
  } else {
    FLASHINFER_CHECK(pow2, op, "workspace", "[MNNVL AllReduceTwoShot] Unsupported world_size", W,
                     ". Supported sizes: {2, 4, 8, 16, 32, 64}");
  }
  const int64_t max_hidden = 1024 * 8 * (16 / e);  // 1024 threads x 8 CTAs of 16-byte packets
  if (oneshot) {
    FLASHINFER_CHECK(H <= max_hidden, op, "input", "Hidden Dimension ", H,
                     " exceeds the maximum supported hidden dimension (", max_hidden, ")");
  } else if (!pat.allreduce_out) {
    FLASHINFER_CHECK(H <= max_hidden, op, "input",
                     "[MNNVL AllReduceTwoShotRMSNorm] Unsupported hidden dimension ", H);
  }
  auto same_shape = [&](const Tensor& t, const char* name) {
    FLASHINFER_CHECK(t.dim() == 2 && t.size(0) == T && t.size(1) == H, op, name, name,
                     " shape mismatch: expected (", T, ", ", H, ") but got (", t.size(0), ", ",
                     t.size(1), ")");
  };
  if (output.defined()) same_shape(output, "output");
  if (!pat.allreduce_out) {
    same_shape(*a.residual_in, "residual_in");
    same_shape(residual_out, "residual_out");
    const int64_t g0 = a.rms_gamma->dim() > 0 ? a.rms_gamma->size(0) : 1;
    FLASHINFER_CHECK(g0 == H, op, "rms_gamma",
                     "gamma must have the same shape as token dimension (", H, ") but got (", g0,
                     ")");
  }
  if (pat.quant == 2) {
    FLASHINFER_CHECK_CODE(dt != DType::kFloat32, ErrorCode::kUnsupported, op, "input",
                          "MNNVL NVFP4 quantization requires fp16 or bf16 input.");
    FLASHINFER_CHECK(H % 16 == 0, op, "input", "NVFP4 quantization needs hidden_dim % 16 == 0, ",
                     "got ", H);
  }
  // flashinfer-cpp's own: what upstream leaves unchecked and its kernels would misread.
  FLASHINFER_CHECK_CODE(W <= ArBufferLayout::kMaxRanks, ErrorCode::kUnsupported, op, "workspace",
                        "MNNVL groups of more than ", ArBufferLayout::kMaxRanks,
                        " ranks are not implemented in flashinfer-cpp (", W, " ranks)");
  FLASHINFER_CHECK(dev == ws.device(), op, "input", "input is on ", dev.str(),
                   " but the workspace's buffers are on ", ws.device().str());
  auto like_input = [&](const Tensor& t, const char* name, bool same_dtype) {
    api::check_same_device(t, x, op, name, "input");
    FLASHINFER_CHECK(t.is_contiguous(), op, name, name, " must be contiguous");
    if (same_dtype) api::check_same_dtype(t, x, op, name, "input");
  };
  like_input(x, "input", true);
  if (output.defined()) like_input(output, "output", true);
  if (!pat.allreduce_out) {
    like_input(*a.residual_in, "residual_in", true);
    like_input(residual_out, "residual_out", true);
    like_input(*a.rms_gamma, "rms_gamma", true);
    if (norm_out.defined()) {
      like_input(norm_out, "norm_out", true);
      same_shape(norm_out, "norm_out");
    }
  }
  if (pat.quant != 0) {
    like_input(quant_out, "quant_out", false);
    if (pat.quant == 2) {
      api::check_shape_eq(quant_out, {T, H / 2}, op, "quant_out");
      FLASHINFER_CHECK(dtype_size(quant_out.dtype()) == 1, op, "quant_out",
                       "quant_out must hold one byte an element pair (uint8), got ",
                       dtype_torch_name(quant_out.dtype()));
    } else {
      api::check_shape_eq(quant_out, {T, H}, op, "quant_out");
      FLASHINFER_CHECK(quant_out.dtype() == DType::kFloat8E4M3FN, op, "quant_out",
                       "quant_out dtype must be torch.float8_e4m3fn, got ",
                       dtype_torch_name(quant_out.dtype()));
    }
  }
  if (pat.quant == 2) {
    like_input(scale_out, "scale_out", false);
    nvfp4_layout(layout_code, op);  // the range (SWIZZLED_8x4 was refused above)
    check_nvfp4_scale_out(scale_out, layout, T, H, op);
  } else if (pat.quant == 4) {
    like_input(scale_out, "scale_out", false);
    FLASHINFER_CHECK(scale_out.dtype() == DType::kFloat32 && scale_out.numel() == T, op,
                     "scale_out", "scale_out must be a float32 tensor of ", T,
                     " per-token scales, got ", dtype_torch_name(scale_out.dtype()), " ",
                     shape_to_string(scale_out.shape()));
  }
  if (dev.is_cuda()) {
    const int cc = api::compute_capability(dev);
    // Upstream's JIT module targets SM 9.x and 10.x only.
    FLASHINFER_CHECK_CODE(cc / 10 == 9 || cc / 10 == 10, ErrorCode::kUnsupported, op, "workspace",
                          "the MNNVL all-reduce kernels are built for SM 9.x and 10.x only "
                          "(upstream's JIT module); compute capability ",
                          cc, " here");
  }
  if (pat.quant == 2) {
    check_nvfp4_arch(dev, op, "pattern", "patterns need",
                     "upstream's FP4 conversion is Blackwell-only");
  }
  AllReduceFusionParams p;
  p.world_size = static_cast<int>(W);
  p.rank = static_cast<int>(w.rank);
  p.tokens = T;
  p.hidden = H;
  p.dtype = dt;
  p.pattern = static_cast<int>(pattern);
  p.mnnvl = true;
  p.oneshot = oneshot;
  p.input = x.data_ptr();
  p.eps = static_cast<float>(rms_eps);
  p.weight_bias = static_cast<float>(weight_bias);
  p.output = output.defined() ? output.data_ptr() : nullptr;
  Tensor scale_holder;
  if (!pat.allreduce_out) {
    p.residual_in = a.residual_in->data_ptr();
    p.residual_out = residual_out.data_ptr();
    p.gamma = a.rms_gamma->data_ptr();
    p.norm_out = pat.norm_out ? norm_out.data_ptr() : nullptr;
  }
  if (pat.quant != 0) {
    p.quant_out = quant_out.data_ptr();
    if (scale_out.defined()) p.scale_out = scale_out.data_ptr();
    if (pat.quant == 1 || pat.quant == 2) {
      // None is 1.0 (upstream's static scale default).
      set_scale(p, a.scale_factor ? *a.scale_factor : Value(), dev, op, scale_holder);
    }
    p.layout_code = static_cast<int>(layout);
  }
  p.blocks = w.blocks;
  run_exchange(*w.mem, *w.comm, w.buffer_size_bytes, 1, p, dev, op, "input", launch_with_pdl);
  if (pat.allreduce_out) return output;
  if (pat.quant == 0) return norm_out;
  return quant_out;
}

// allreduce_fusion's MoE patterns on the TRT-LLM workspace (docs/COMM.md, "The MoE patterns"):
// upstream's helpers' checks in their order and words, each rank's local value (the expert
// reduction or the finalize gather, kernels/comm_rules.h) as the exchanged input, then the
// one-shot rank sum with every partial sum rounded and pattern 1's (5's with NVFP4) epilogue.
Tensor moe_allreduce_impl(const ArArgs& a, const MoeArgs& m, TRTLLMAllReduceFusionWorkspace& ws,
                          int64_t pattern, bool launch_with_pdl, double rms_eps,
                          std::optional<int64_t> layout_code, double weight_bias) {
  const char* op = "allreduce_fusion";
  auto& w = ws.impl();
  auto given = [](const std::optional<Tensor>& t) { return t && t->defined(); };
  const bool six = pattern == 6;
  const std::string suffix = six ? " is required for kMoEReductionARResidualRMSNorm pattern"
                                 : " is required for kMoEFinalizeARResidualRMSNorm pattern";
  auto required = [&](bool ok, const char* name) { FLASHINFER_CHECK(ok, op, name, name, suffix); };
  if (six) {
    required(m.device_num_experts && !m.device_num_experts->is_none(),
             "moe_reduction_device_num_experts");
    required(given(m.scale_input), "moe_reduction_scale_input");
    required(given(m.active_experts_token_input), "moe_reduction_active_experts_token_input");
    required(given(m.token_input), "moe_reduction_token_input");
    required(given(a.residual_in), "residual_in");
    required(given(a.rms_gamma), "rms_gamma");
  } else {
    required(given(m.expanded_idx_to_permuted_idx), "expanded_idx_to_permuted_idx");
    required(given(a.residual_in), "residual_in");
    required(given(a.rms_gamma), "rms_gamma");
  }
  const Tensor& res_in = *a.residual_in;
  const Tensor& gamma = *a.rms_gamma;
  const Device dev = res_in.device();
  FLASHINFER_CHECK(res_in.dim() >= 1, op, "residual_in", "residual_in must have a hidden dim");
  const int64_t H = res_in.size(res_in.dim() - 1);
  const int64_t Tk = H > 0 ? res_in.numel() / H : 0;
  const int64_t W = w.world_size;
  // The helpers' size check (2 bytes an element in pattern 6, the residual's in pattern 7).
  const int64_t comm_bytes =
      six ? m.token_input->numel() * 2 * W : res_in.numel() * dtype_size(res_in.dtype()) * W;
  constexpr int64_t kMaxCommSize = 2145386496;  // 2^31 - 2^21
  FLASHINFER_CHECK(comm_bytes <= kMaxCommSize, op, "input", "required_lamport_comm_size ",
                   comm_bytes, " is greater than MAX_COMM_SIZE ", kMaxCommSize,
                   ". Cannot use oneshot in this case.");
  if (!six) {
    // The binding's checks, before its dtype dispatch.
    FLASHINFER_CHECK(a.input.defined(), op, "input",
                     "allreduce_in, expanded_idx_to_permuted_idx and top_k must be set");
    FLASHINFER_CHECK(m.expanded_idx_to_permuted_idx->dtype() == DType::kInt32, op,
                     "expanded_idx_to_permuted_idx", "expanded_idx_to_permuted_idx must be int32");
  }
  const DType dt = six ? m.active_experts_token_input->dtype() : res_in.dtype();
  FLASHINFER_CHECK_CODE(dt == DType::kFloat16 || dt == DType::kBFloat16, ErrorCode::kUnsupported,
                        op, "input", "Unsupported dtype in DISPATCH_FLOATING_TYPES_FOR_ALLREDUCE.");
  FLASHINFER_CHECK_CODE(W == 2 || W == 4 || W == 8 || W == 16, ErrorCode::kUnsupported, op,
                        "workspace", "Unsupported n_ranks");
  // The kernels' checks.
  FLASHINFER_CHECK(H > 0 && res_in.numel() % H == 0, op, "residual_in",
                   "size must be a multiple of hidden_dim");
  FLASHINFER_CHECK(H % 8 == 0, op, "residual_in",
                   six ? "hidden_dim * sizeof(T) must be a multiple of kBytesPerAccess"
                       : "hidden_dim must be a multiple of VEC_SIZE");
  if (six) {
    FLASHINFER_CHECK(
        given(a.output) || given(a.residual_out) || given(a.norm_out) || given(a.quant_out), op,
        "norm_out",
        "at least one of moe_allreduce_out, residual_out, norm_out, quant_out must be "
        "set");
  }
  {
    // The launch: a cluster of up to 8 blocks a token, warps = ceil(H / 256) of 16-byte lanes.
    const int64_t warps = (H + 255) / 256;
    int64_t cluster = 1;
    for (int64_t c : {8, 4, 2}) {
      if (warps % c == 0) {
        cluster = c;
        break;
      }
    }
    FLASHINFER_CHECK(warps / cluster * 32 <= 1024, op, "residual_in",
                     "block_size <= 1024 && cluster_size > 0");
  }
  // flashinfer-cpp's own: what upstream leaves to the caller and its kernels would misread.
  FLASHINFER_CHECK(dev == ws.device(), op, "residual_in", "residual_in is on ", dev.str(),
                   " but the workspace's buffers are on ", ws.device().str());
  FLASHINFER_CHECK(!w.fp32, op, "workspace",
                   "the MoE patterns run 16-bit data: the workspace was made for float32");
  FLASHINFER_CHECK(Tk * H <= w.max_token_num * w.hidden_dim, op, "workspace", "token_num (", Tk,
                   ") * hidden_dim (", H, ") exceeds the workspace's max_token_num (",
                   w.max_token_num, ") * hidden_dim (", w.hidden_dim, ")");
  auto like = [&](const Tensor& t, const char* name, const Shape& shape, DType d) {
    api::check_same_device(t, res_in, op, name, "residual_in");
    FLASHINFER_CHECK(t.is_contiguous(), op, name, name, " must be contiguous");
    api::check_shape_eq(t, shape, op, name);
    FLASHINFER_CHECK(t.dtype() == d, op, name, name, " must be ", dtype_torch_name(d), ", got ",
                     dtype_torch_name(t.dtype()));
  };
  like(res_in, "residual_in", {Tk, H}, dt);
  like(gamma, "rms_gamma", {H}, dt);
  // upstream's kernel writes norm_out whatever the caller gave (a null write in pattern 6).
  FLASHINFER_CHECK(!six || given(a.norm_out), op, "norm_out",
                   "norm_out is required: upstream's kernel always writes it (a None norm_out "
                   "would be written through a null pointer)");
  Tensor norm_out = given(a.norm_out) ? *a.norm_out : Tensor::empty({Tk, H}, dt, dev);
  like(norm_out, "norm_out", {Tk, H}, dt);
  if (given(a.residual_out)) like(*a.residual_out, "residual_out", {Tk, H}, dt);
  // The call's temporaries: this rank's local value (the exchanged input) and, without
  // residual_out, the epilogue's (upstream's kernel skips that store). On CUDA they are the
  // stream's scratch, never freed: a CUDA graph capturing the call addresses them on every
  // replay, and a tensor freed at return would be a cudaFree during the capture, which ends it.
  // The lease is held until the kernels are queued.
  Tensor local, residual_out;
#if FLASHINFER_WITH_CUDA
  std::optional<kernels::cuda::StreamScratch> lease;
  const int64_t temp_bytes = Tk * H * static_cast<int64_t>(dtype_size(dt));
  const int64_t temp_at = (temp_bytes + 255) / 256 * 256;
  if (dev.is_cuda() && temp_bytes > 0) {
    static kernels::cuda::StreamScratchPool pool("allreduce_fusion MoE scratch");
    lease = pool.acquire(op, dev.index, current_cuda_stream(),
                         static_cast<std::size_t>(temp_at * (given(a.residual_out) ? 1 : 2)));
    char* base = static_cast<char*>(lease->data());
    local = Tensor::from_blob(base, {Tk, H}, {H, 1}, dt, dev);
    if (!given(a.residual_out)) {
      residual_out = Tensor::from_blob(base + temp_at, {Tk, H}, {H, 1}, dt, dev);
    }
  }
#endif
  if (!local.defined()) local = Tensor::empty({Tk, H}, dt, dev);
  if (given(a.residual_out)) {
    residual_out = *a.residual_out;
  } else if (!residual_out.defined()) {
    residual_out = Tensor::empty({Tk, H}, dt, dev);
  }
  kernels::MoeLocalParams lp;
  lp.pattern = static_cast<int>(pattern);
  lp.dtype = dt;
  lp.tokens = Tk;
  lp.hidden = H;
  lp.out = local.data_ptr();
  if (six) {
    const Value& ne = *m.device_num_experts;
    FLASHINFER_CHECK(
        ne.kind() == Value::Kind::kInt && ne.as_int() >= 0, op, "moe_reduction_device_num_experts",
        "moe_reduction_device_num_experts must be a non-negative int, got ", ne.repr());
    const int64_t E = ne.as_int();
    like(*m.active_experts_token_input, "moe_reduction_active_experts_token_input", {E, Tk, H}, dt);
    like(*m.token_input, "moe_reduction_token_input", {Tk, H}, dt);
    const Tensor& sc = *m.scale_input;
    api::check_same_device(sc, res_in, op, "moe_reduction_scale_input", "residual_in");
    FLASHINFER_CHECK(sc.dtype() == DType::kFloat32 && sc.is_contiguous() && sc.numel() >= E * Tk,
                     op, "moe_reduction_scale_input",
                     "moe_reduction_scale_input must be a contiguous float32 tensor of at least ",
                     E * Tk, " values (read expert-major, [num_experts, token_num]), got ",
                     dtype_torch_name(sc.dtype()), " ", shape_to_string(sc.shape()));
    lp.experts = E;
    lp.active = m.active_experts_token_input->data_ptr();
    lp.scale = static_cast<const float*>(sc.data_ptr());
    lp.token = m.token_input->data_ptr();
  } else {
    const Tensor& idx = *m.expanded_idx_to_permuted_idx;
    const Tensor& in = a.input;
    FLASHINFER_CHECK(in.dim() == 2 && in.size(1) == H, op, "input",
                     "input must be the permuted expert output [rows, ", H, "], got ",
                     shape_to_string(in.shape()));
    like(in, "input", in.shape(), dt);
    FLASHINFER_CHECK(idx.dim() == 2 && idx.size(0) == Tk, op, "expanded_idx_to_permuted_idx",
                     "expanded_idx_to_permuted_idx must be [", Tk, ", top_k], got ",
                     shape_to_string(idx.shape()));
    like(idx, "expanded_idx_to_permuted_idx", idx.shape(), DType::kInt32);
    const int64_t K = idx.size(1);
    // upstream reads the rows unchecked; here every index is -1 or a row of input. While the
    // stream is being captured into a CUDA graph the indices cannot be read back (a copy to the
    // host waits for the stream, which a capture refuses): then the kernel reads no row outside
    // input and gives NaN for a token with such an index (kernels/comm_rules.h).
    if (!(dev.is_cuda() && detail::cuda_current_stream_capturing())) {
      const std::vector<double> iv = idx.to(Device::cpu()).to_double_vector();
      for (double v : iv) {
        FLASHINFER_CHECK(v == -1 || (v >= 0 && v < static_cast<double>(in.size(0))), op,
                         "expanded_idx_to_permuted_idx", "index ", static_cast<int64_t>(v),
                         " is neither -1 nor a row of input (", in.size(0), " rows)");
      }
    }
    lp.top_k = K;
    lp.rows = in.size(0);
    lp.input = in.data_ptr();
    lp.index = static_cast<const int32_t*>(idx.data_ptr());
    if (given(m.expert_scale_factor)) {
      // upstream reads the scales in the data's dtype.
      like(*m.expert_scale_factor, "expert_scale_factor", {Tk, K}, dt);
      lp.expert_scale = m.expert_scale_factor->data_ptr();
    }
    if (given(m.shared_expert_output)) {
      like(*m.shared_expert_output, "shared_expert_output", {Tk, H}, dt);
      lp.shared = m.shared_expert_output->data_ptr();
    }
  }
  // NVFP4: pattern 6 only (upstream's pattern 7 leaves its global scale uninitialized).
  const bool quant = given(a.quant_out);
  Tensor scale_holder;
  AllReduceFusionParams p;
  if (quant) {
    FLASHINFER_CHECK_CODE(six, ErrorCode::kUnsupported, op, "quant_out",
                          "NVFP4 output of kMoEFinalizeARResidualRMSNorm: upstream's binding "
                          "leaves its global scale uninitialized; not implemented");
    const Tensor& q = *a.quant_out;
    const int64_t layout = nvfp4_layout(layout_code, op);
    FLASHINFER_CHECK(H % 16 == 0, op, "input", "NVFP4 quantization needs hidden_dim % 16 == 0, ",
                     "got ", H);
    api::check_same_device(q, res_in, op, "quant_out", "residual_in");
    api::check_shape_eq(q, {Tk, H / 2}, op, "quant_out");
    FLASHINFER_CHECK(q.is_contiguous() && dtype_size(q.dtype()) == 1, op, "quant_out",
                     "quant_out must be a contiguous byte tensor [", Tk, ", ", H / 2, "]");
    FLASHINFER_CHECK(given(a.scale_out), op, "scale_out", "scale_out is required with quant_out");
    const Tensor& s = *a.scale_out;
    api::check_same_device(s, res_in, op, "scale_out", "residual_in");
    check_nvfp4_scale_out(s, layout, Tk, H, op);
    check_nvfp4_arch(dev, op, "quant_out", "output needs",
                     "upstream's kernel writes zeros below it");
    // A Python int or float is the global scale; anything else is 1.0, as upstream's.
    const double gs = a.scale_factor && !a.scale_factor->is_none() &&
                              (a.scale_factor->kind() == Value::Kind::kFloat ||
                               a.scale_factor->kind() == Value::Kind::kInt)
                          ? a.scale_factor->as_float()
                          : 1.0;
    set_scale(p, Value(gs), dev, op, scale_holder);
    p.quant_out = q.data_ptr();
    p.scale_out = s.data_ptr();
    p.layout_code = static_cast<int>(layout);
  }
  if (six && given(a.output)) {
    like(*a.output, "output", {Tk, H}, dt);
    p.sum_out = a.output->data_ptr();
  }
  api::launch(kMoeLocalKernels, lp, dev, op, "input");
  p.world_size = static_cast<int>(W);
  p.rank = static_cast<int>(w.rank);
  p.tokens = Tk;
  p.hidden = H;
  p.dtype = dt;
  p.pattern = quant ? 5 : 1;  // residual, norm (and NVFP4): pattern 1's / 5's epilogue
  p.fp32_acc = false;         // every partial sum rounded: upstream's MoE kernels have no option
  p.oneshot = true;           // -0 sent as +0
  p.input = local.data_ptr();
  p.residual_in = res_in.data_ptr();
  p.residual_out = residual_out.data_ptr();
  p.norm_out = norm_out.data_ptr();
  p.gamma = gamma.data_ptr();
  p.eps = static_cast<float>(rms_eps);
  p.weight_bias = static_cast<float>(weight_bias);
  p.blocks = w.blocks;
  run_exchange(*w.mem, *w.comm, w.max_token_num * w.hidden_dim, elem_bytes_of(w.fp32), p, dev, op,
               "input", launch_with_pdl);
  return norm_out;
}

Tensor allreduce_impl(const ArArgs& a, const MoeArgs& moe, AllReduceFusionWorkspace* base,
                      int64_t pattern, bool launch_with_pdl, double rms_eps,
                      std::optional<int64_t> layout_code, std::optional<bool> use_oneshot,
                      bool fp32_acc, std::optional<int64_t> group_size, double weight_bias,
                      std::string_view moe_finalize_backend) {
  const char* op = "allreduce_fusion";
  FLASHINFER_CHECK(base != nullptr, op, "workspace",
                   "expected an AllReduceFusionWorkspace, got None");
  // Upstream 0.7.4: moe_finalize_backend picks the implementation of pattern 7 only (any other
  // pattern ignores it); "cake" needs a TRT-LLM workspace whatever the pattern.
  FLASHINFER_CHECK(moe_finalize_backend != "cake" ||
                       dynamic_cast<TRTLLMAllReduceFusionWorkspace*>(base) != nullptr,
                   op, "moe_finalize_backend",
                   "moe_finalize_backend='cake' requires a TRTLLMAllReduceFusionWorkspace");
  if (pattern == 7) {
    FLASHINFER_CHECK(moe_finalize_backend == "trtllm" || moe_finalize_backend == "cake", op,
                     "moe_finalize_backend", "backend must be 'trtllm' or 'cake', got '",
                     moe_finalize_backend, "'");
    // Cake is upstream's source-built SM100 / SM103 kernel set (two-shot for 4 and 8 ranks): its
    // summation order is not reproduced here, so its bits are not promised.
    FLASHINFER_CHECK_CODE(moe_finalize_backend != "cake", ErrorCode::kUnsupported, op,
                          "moe_finalize_backend",
                          "the 'cake' MoE finalize kernels (SM100 / SM103, their own summation "
                          "order) are not implemented; 'trtllm' computes the same pattern");
  }
  if (auto* m = dynamic_cast<MNNVLAllReduceFusionWorkspace*>(base)) {
    return mnnvl_allreduce_impl(a, *m, pattern, launch_with_pdl, rms_eps, layout_code, use_oneshot,
                                weight_bias);
  }
  auto* ws = dynamic_cast<TRTLLMAllReduceFusionWorkspace*>(base);
  FLASHINFER_CHECK(ws != nullptr, op, "workspace",
                   "Unsupported workspace type: ", base->class_name());
  auto& w = ws->impl();
  FLASHINFER_CHECK(!w.destroyed, op, "workspace", "the workspace was destroyed");
  FLASHINFER_CHECK(!w.unmapped, op, "workspace",
                   "TRT-LLM symmetric-memory handles are not attached");
  FLASHINFER_CHECK(pattern >= 0 && pattern <= 11, op, "pattern", "unknown fusion pattern ", pattern,
                   " (AllReduceFusionPattern has 0 to 11)");
  // The MoE patterns go their own way before the standard path's checks, as upstream's; their
  // arguments are ignored by the other patterns.
  if (pattern == 6 || pattern == 7) {
    return moe_allreduce_impl(a, moe, *ws, pattern, launch_with_pdl, rms_eps, layout_code,
                              weight_bias);
  }
  const Tensor& x = a.input;
  api::check_defined(x, op, "input");
  FLASHINFER_CHECK(x.dim() == 2, op, "input", "input must be 2-D [token_num, hidden_dim], got ",
                   shape_to_string(x.shape()));
  const DType dt = x.dtype();
  FLASHINFER_CHECK_CODE(dt == DType::kFloat16 || dt == DType::kBFloat16 || dt == DType::kFloat32,
                        ErrorCode::kUnsupported, op, "input",
                        "Unsupported dtype in DISPATCH_FLOATING_TYPES_FOR_ALLREDUCE. (got ",
                        dtype_torch_name(dt), ")");
  const int64_t T = x.size(0), H = x.size(1), W = w.world_size;
  const Device dev = x.device();
  FLASHINFER_CHECK(dev == ws->device(), op, "input", "input is on ", dev.str(),
                   " but the workspace's buffers are on ", ws->device().str());
  // Every tensor but scale_out and rms_gamma must be contiguous (upstream's words).
  auto contiguous = [&](const Tensor& t, const char* name) {
    FLASHINFER_CHECK(t.is_contiguous(), op, name, name, " must be contiguous");
  };
  contiguous(x, "input");
  for (const auto& [t, name] : {std::pair{&a.output, "output"},
                                {&a.residual_out, "residual_out"},
                                {&a.norm_out, "norm_out"},
                                {&a.quant_out, "quant_out"},
                                {&a.residual_in, "residual_in"}}) {
    if (*t && (*t)->defined()) {
      contiguous(**t, name);
      api::check_same_device(**t, x, op, name, "input");
    }
  }
  // The workspace's metadata check.
  std::string why;
  if (T * H > w.max_token_num * w.hidden_dim) {
    why += "\n  - token_num (" + std::to_string(T) + ") * hidden_dim (" + std::to_string(H) +
           ") exceeds workspace max_token_num (" + std::to_string(w.max_token_num) +
           ") * hidden_dim (" + std::to_string(w.hidden_dim) +
           "). This may cause Illegal Memory Access.";
  }
  if ((dt == DType::kFloat32) != w.fp32) {
    why += std::string("\n  - use_fp32_lamport (") + (w.fp32 ? "True" : "False") +
           ") does not match allreduce_in.dtype (" + std::string(dtype_torch_name(dt)) + ")";
  }
  FLASHINFER_CHECK(why.empty(), op, "workspace", "Workspace validation failed:", why);
  FLASHINFER_CHECK_CODE(W == 2 || W == 4 || W == 8 || W == 16, ErrorCode::kUnsupported, op,
                        "workspace",
                        "allreduce_fusion_kernel: unsupported ranks number! Supported ranks: 2, "
                        "4, 8, 16.");
  const int64_t itemsize = dtype_size(dt);
  FLASHINFER_CHECK(H % (16 / itemsize) == 0, op, "input", "params.hidden_dim % VEC_SIZE != 0 ",
                   "(hidden_dim ", H, ", VEC_SIZE ", 16 / itemsize, ")");
  const bool oneshot = use_oneshot_rule(use_oneshot, T, H, W, itemsize, op);
  FLASHINFER_CHECK(oneshot || T > W, op, "input", "sequence length should be larger than tp_size",
                   " (token_num ", T, ", tp_size ", W, ")");

  const kernels::ArPattern pat = kernels::ar_pattern(static_cast<int>(pattern));
  AllReduceFusionParams p;
  p.world_size = static_cast<int>(W);
  p.rank = static_cast<int>(w.rank);
  p.tokens = T;
  p.hidden = H;
  p.dtype = dt;
  p.pattern = static_cast<int>(pattern);
  p.fp32_acc = fp32_acc && dt != DType::kFloat32;
  p.oneshot = oneshot;
  p.input = x.data_ptr();
  p.eps = static_cast<float>(rms_eps);
  p.weight_bias = static_cast<float>(weight_bias);
  auto check_like_input = [&](const Tensor& t, const char* name) {
    api::check_shape_eq(t, x.shape(), op, name);
    api::check_same_dtype(t, x, op, name, "input");
  };
  Tensor output;
  if (pat.allreduce_out) {
    if (a.output && a.output->defined()) {
      output = *a.output;
      check_like_input(output, "output");
    } else {
      output = Tensor::empty(x.shape(), dt, dev);
    }
    p.output = output.data_ptr();
  } else {
    const Tensor& res_in = need(a.residual_in, "residual_in", pattern, op);
    const Tensor& res_out = need(a.residual_out, "residual_out", pattern, op);
    const Tensor& gamma = need(a.rms_gamma, "rms_gamma", pattern, op);
    check_like_input(res_in, "residual_in");
    check_like_input(res_out, "residual_out");
    api::check_same_device(gamma, x, op, "rms_gamma", "input");
    api::check_shape_eq(gamma, {H}, op, "rms_gamma");
    api::check_same_dtype(gamma, x, op, "rms_gamma", "input");
    FLASHINFER_CHECK(gamma.is_contiguous(), op, "rms_gamma", "rms_gamma must be contiguous");
    p.residual_in = res_in.data_ptr();
    p.residual_out = res_out.data_ptr();
    p.gamma = gamma.data_ptr();
    if (pat.norm_out) {
      const Tensor& n = need(a.norm_out, "norm_out", pattern, op);
      check_like_input(n, "norm_out");
      p.norm_out = n.data_ptr();
    }
  }
  Tensor scale_holder;
  if (pat.quant != 0) {
    const Tensor& q = need(a.quant_out, "quant_out", pattern, op);
    const bool fp4 = pat.quant == 2;
    if (fp4) {
      FLASHINFER_CHECK_CODE(dt != DType::kFloat32, ErrorCode::kUnsupported, op, "input",
                            pattern == 3 ? "FP4Quant" : "OutFP4Quant",
                            " pattern cannot work with DType=float");
      FLASHINFER_CHECK(H % 16 == 0, op, "input", "NVFP4 quantization needs hidden_dim % 16 == 0, ",
                       "got ", H);
      api::check_shape_eq(q, {T, H / 2}, op, "quant_out");
      FLASHINFER_CHECK(dtype_size(q.dtype()) == 1, op, "quant_out",
                       "quant_out must hold one byte an element pair (uint8), got ",
                       dtype_torch_name(q.dtype()));
    } else {
      api::check_shape_eq(q, {T, H}, op, "quant_out");
      FLASHINFER_CHECK(q.dtype() == DType::kFloat8E4M3FN, op, "quant_out",
                       "quant_out dtype must be torch.float8_e4m3fn, got ",
                       dtype_torch_name(q.dtype()));
    }
    p.quant_out = q.data_ptr();
    if (pat.quant == 1 || pat.quant == 2) {
      FLASHINFER_CHECK(a.scale_factor && !a.scale_factor->is_none(), op, "scale_factor",
                       "scale_factor is required for pattern ", pattern_name(pattern), " (",
                       pattern, ")");
      set_scale(p, *a.scale_factor, dev, op, scale_holder);
    }
    if (pat.quant >= 2) {
      const Tensor& s = need(a.scale_out, "scale_out", pattern, op);
      api::check_same_device(s, x, op, "scale_out", "input");
      if (pat.quant == 2) {
        const int64_t layout = nvfp4_layout(layout_code, op);
        check_nvfp4_scale_out(s, layout, T, H, op);
        p.layout_code = static_cast<int>(layout);
      } else if (pat.quant == 3) {
        FLASHINFER_CHECK(group_size.has_value(), op, "block_quant_group_size",
                         "block_quant_group_size is required for pattern: ", pattern);
        FLASHINFER_CHECK(*group_size > 0, op, "block_quant_group_size",
                         "block_quant_group_size must be > 0, got ", *group_size);
        FLASHINFER_CHECK(H % *group_size == 0, op, "block_quant_group_size",
                         "hidden_dim must be divisible by block_quant_group_size, got ", H, " and ",
                         *group_size);
        const int64_t words = (H / *group_size + 3) / 4, t_stride = (T + 3) / 4 * 4;
        FLASHINFER_CHECK(s.shape() == Shape({T, words}), op, "scale_out",
                         "scale_out shape must be ", shape_to_string({T, words}), ", got ",
                         shape_to_string(s.shape()));
        FLASHINFER_CHECK(T <= 1 || s.stride(0) == 1, op, "scale_out",
                         "scale_out stride must be (1, ", t_stride, "), got ",
                         shape_to_string(s.strides()));
        FLASHINFER_CHECK(words == 1 || s.stride(1) == t_stride, op, "scale_out",
                         "scale_out stride must be (1, ", t_stride, "), got ",
                         shape_to_string(s.strides()));
        FLASHINFER_CHECK(s.dtype() == DType::kInt32, op, "scale_out",
                         "scale_out dtype must be torch.int32, got ", dtype_torch_name(s.dtype()));
        p.group_size = *group_size;
        p.scale_t_stride = words == 1 ? T : s.stride(1);
      } else {
        FLASHINFER_CHECK(
            s.dtype() == DType::kFloat32 && s.is_contiguous() && s.shape() == Shape({T, 1}), op,
            "scale_out", "scale_out must be a contiguous float32 [", T, ", 1] tensor, got ",
            dtype_torch_name(s.dtype()), " ", shape_to_string(s.shape()));
      }
      p.scale_out = s.data_ptr();
    }
  }
  if (pat.quant == 2) {
    check_nvfp4_arch(dev, op, "pattern", "patterns need",
                     "upstream's FP4 conversion is Blackwell-only");
  }
  p.blocks = w.blocks;
  run_exchange(*w.mem, *w.comm, w.max_token_num * w.hidden_dim, elem_bytes_of(w.fp32), p, dev, op,
               "input", launch_with_pdl);
  if (a.norm_out && a.norm_out->defined()) return *a.norm_out;
  if (a.quant_out && a.quant_out->defined()) return *a.quant_out;
  if (output.defined()) return output;
  return a.output ? *a.output : Tensor();
}

}  // namespace

TRTLLMAllReduceFusionWorkspace::TRTLLMAllReduceFusionWorkspace(std::shared_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
TRTLLMAllReduceFusionWorkspace::~TRTLLMAllReduceFusionWorkspace() = default;
int64_t TRTLLMAllReduceFusionWorkspace::world_size() const { return impl_->world_size; }
int64_t TRTLLMAllReduceFusionWorkspace::rank() const { return impl_->rank; }
int64_t TRTLLMAllReduceFusionWorkspace::max_token_num() const { return impl_->max_token_num; }
int64_t TRTLLMAllReduceFusionWorkspace::hidden_dim() const { return impl_->hidden_dim; }
Device TRTLLMAllReduceFusionWorkspace::device() const { return impl_->comm->device(); }

bool TRTLLMAllReduceFusionWorkspace::is_buffer_size_sufficient(int64_t tp_size, int64_t num_tokens,
                                                               int64_t hidden_dim, DType dtype,
                                                               std::optional<bool>) const {
  return !impl_->destroyed && tp_size == impl_->world_size &&
         num_tokens * hidden_dim <= impl_->max_token_num * impl_->hidden_dim &&
         (dtype == DType::kFloat32) == impl_->fp32;
}

void TRTLLMAllReduceFusionWorkspace::checkpoint_prepare() {
  call_op<&TRTLLMAllReduceFusionWorkspace::checkpoint_prepare>(
      [&] {
        Impl& w = *impl_;
        detach_collectively("TRTLLMAllReduceFusionWorkspace.checkpoint_prepare", w.destroyed,
                            w.unmapped, *w.comm);
      },
      *this);
}

void TRTLLMAllReduceFusionWorkspace::checkpoint_restore(
    std::shared_ptr<comm::CommBackend> comm_backend) {
  call_op<&TRTLLMAllReduceFusionWorkspace::checkpoint_restore>(
      [&] {
        Impl& w = *impl_;
        reattach_collectively("TRTLLMAllReduceFusionWorkspace.checkpoint_restore", w.destroyed,
                              w.unmapped, w.rank, w.world_size, *w.mem, w.comm, comm_backend);
      },
      *this, comm_backend);
}

void TRTLLMAllReduceFusionWorkspace::destroy() {
  if (impl_->destroyed) return;
  release_collectively(*impl_->comm, impl_->mem);
  impl_->destroyed = true;
}

MNNVLAllReduceFusionWorkspace::MNNVLAllReduceFusionWorkspace(
    std::shared_ptr<Mapping> mapping, std::optional<int64_t> max_num_tokens,
    std::optional<int64_t> hidden_dim, std::optional<DType> dtype,
    std::optional<int64_t> buffer_size_in_bytes, std::shared_ptr<comm::CommBackend> comm_backend)
    : impl_(make_mnnvl_impl(mapping, max_num_tokens, hidden_dim, dtype, buffer_size_in_bytes,
                            comm_backend)) {}
MNNVLAllReduceFusionWorkspace::~MNNVLAllReduceFusionWorkspace() = default;
int64_t MNNVLAllReduceFusionWorkspace::world_size() const { return impl_->world_size; }
int64_t MNNVLAllReduceFusionWorkspace::rank() const { return impl_->rank; }
int64_t MNNVLAllReduceFusionWorkspace::buffer_size_bytes() const {
  return impl_->buffer_size_bytes;
}
int64_t MNNVLAllReduceFusionWorkspace::workspace_size_bytes() const {
  return 3 * impl_->buffer_size_bytes;
}
Device MNNVLAllReduceFusionWorkspace::device() const { return impl_->comm->device(); }

int64_t MNNVLAllReduceFusionWorkspace::get_required_buffer_size_bytes(
    int64_t tp_size, int64_t num_tokens, int64_t hidden_dim, DType dtype, int64_t strategy) {
  return mnnvl_required(tp_size, num_tokens, hidden_dim, dtype_size(dtype), strategy);
}

bool MNNVLAllReduceFusionWorkspace::is_buffer_size_sufficient(
    int64_t tp_size, int64_t num_tokens, int64_t hidden_dim, DType dtype,
    std::optional<bool> use_oneshot) const {
  return is_buffer_size_sufficient(tp_size, num_tokens, hidden_dim, dtype,
                                   !use_oneshot   ? MNNVLAllreduceFusionStrategy::AUTO
                                   : *use_oneshot ? MNNVLAllreduceFusionStrategy::ONESHOT
                                                  : MNNVLAllreduceFusionStrategy::TWOSHOT);
}

bool MNNVLAllReduceFusionWorkspace::is_buffer_size_sufficient(int64_t tp_size, int64_t num_tokens,
                                                              int64_t hidden_dim, DType dtype,
                                                              int64_t strategy) const {
  return get_required_buffer_size_bytes(tp_size, num_tokens, hidden_dim, dtype, strategy) <=
         impl_->buffer_size_bytes;
}

void MNNVLAllReduceFusionWorkspace::destroy() {
  if (impl_->destroyed) return;
  release_collectively(*impl_->comm, impl_->mem);
  impl_->destroyed = true;
}

void MNNVLAllReduceFusionWorkspace::checkpoint_prepare() {
  call_op<&MNNVLAllReduceFusionWorkspace::checkpoint_prepare>(
      [&] {
        Impl& w = *impl_;
        detach_collectively("MNNVLAllReduceFusionWorkspace.checkpoint_prepare", w.destroyed,
                            w.unmapped, *w.comm);
      },
      *this);
}

void MNNVLAllReduceFusionWorkspace::checkpoint_restore(
    std::shared_ptr<comm::CommBackend> comm_backend) {
  call_op<&MNNVLAllReduceFusionWorkspace::checkpoint_restore>(
      [&] {
        Impl& w = *impl_;
        reattach_collectively("MNNVLAllReduceFusionWorkspace.checkpoint_restore", w.destroyed,
                              w.unmapped, w.rank, w.tp_size, *w.mem, w.comm, comm_backend);
      },
      *this, comm_backend);
}

std::shared_ptr<AllReduceFusionWorkspace> create_allreduce_fusion_workspace(
    std::string backend, std::optional<int64_t> world_size, std::optional<int64_t> rank,
    std::optional<int64_t> max_token_num, std::optional<int64_t> hidden_dim,
    std::optional<DType> dtype, std::optional<int64_t> gpus_per_node,
    std::shared_ptr<comm::CommBackend> comm_backend, bool force_oneshot_support,
    std::optional<Value> group, AllReduceCuteDslOptions options) {
  return call_op<&create_allreduce_fusion_workspace>(
      [&] {
        // Upstream 0.7.4's "mnnvl-cutedsl" keywords, checked as it checks them (allreduce.py).
        const char* op = "create_allreduce_fusion_workspace";
        std::string given;
        const auto& o = options;
        for (const auto& [v, name] : {std::pair{&o.top_k, "top_k"},
                                      {&o.rms_eps, "rms_eps"},
                                      {&o.weight_bias, "weight_bias"},
                                      {&o.routed_scaling_factor, "routed_scaling_factor"},
                                      {&o.include_shared_expert, "include_shared_expert"},
                                      {&o.add_residual, "add_residual"},
                                      {&o.write_residual_output, "write_residual_output"},
                                      {&o.apply_rms_norm, "apply_rms_norm"},
                                      {&o.output_dtype, "output_dtype"},
                                      {&o.dynamic_fp8, "dynamic_fp8"},
                                      {&o.write_norm_output, "write_norm_output"},
                                      {&o.config, "config"}}) {
          if (*v && !(*v)->is_none()) given += (given.empty() ? "" : ", ") + std::string(name);
        }
        if (backend == "mnnvl-cutedsl") {
          std::string ignored;
          if (gpus_per_node) ignored += "gpus_per_node";
          if (comm_backend) ignored += (ignored.empty() ? "" : ", ") + std::string("comm_backend");
          if (force_oneshot_support) {
            ignored += (ignored.empty() ? "" : ", ") + std::string("force_oneshot_support");
          }
          FLASHINFER_CHECK(ignored.empty(), op, "backend",
                           "backend='mnnvl-cutedsl' does not use: ", ignored);
          FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "backend",
                          "the 'mnnvl-cutedsl' all-reduce fusion (upstream's CuTe-DSL MNNVL "
                          "kernels) is not implemented here");
        }
        FLASHINFER_CHECK(given.empty(), op, "backend",
                         "Only backend='mnnvl-cutedsl' accepts: ", given);
        return create_impl(backend, world_size, rank, max_token_num, hidden_dim, dtype,
                           comm_backend, force_oneshot_support, gpus_per_node);
      },
      backend, world_size, rank, max_token_num, hidden_dim, dtype, gpus_per_node, comm_backend,
      force_oneshot_support, group, options);
}

Tensor allreduce_fusion(const Tensor& input, std::shared_ptr<AllReduceFusionWorkspace> workspace,
                        int64_t pattern, bool launch_with_pdl, bool trigger_completion_at_end,
                        std::optional<Tensor> output, std::optional<Tensor> residual_out,
                        std::optional<Tensor> norm_out, std::optional<Tensor> quant_out,
                        std::optional<Tensor> scale_out, std::optional<Tensor> residual_in,
                        std::optional<Tensor> rms_gamma, double rms_eps,
                        std::optional<Value> scale_factor, std::optional<int64_t> layout_code,
                        std::optional<bool> use_oneshot, bool fp32_acc,
                        std::optional<Value> moe_reduction_device_num_experts,
                        std::optional<Tensor> moe_reduction_scale_input,
                        std::optional<Tensor> moe_reduction_active_experts_token_input,
                        std::optional<Tensor> moe_reduction_token_input,
                        std::optional<Tensor> expanded_idx_to_permuted_idx,
                        std::optional<Tensor> expert_scale_factor,
                        std::optional<Tensor> shared_expert_output,
                        std::optional<int64_t> block_quant_group_size, double weight_bias,
                        std::string_view moe_finalize_backend) {
  return call_op<&allreduce_fusion>(
      [&] {
        const ArArgs a{input,     output,      residual_out, norm_out,    quant_out,
                       scale_out, residual_in, rms_gamma,    scale_factor};
        const MoeArgs moe{moe_reduction_device_num_experts,
                          moe_reduction_scale_input,
                          moe_reduction_active_experts_token_input,
                          moe_reduction_token_input,
                          expanded_idx_to_permuted_idx,
                          expert_scale_factor,
                          shared_expert_output};
        return allreduce_impl(a, moe, workspace.get(), pattern, launch_with_pdl, rms_eps,
                              layout_code, use_oneshot, fp32_acc, block_quant_group_size,
                              weight_bias, moe_finalize_backend);
      },
      input, workspace, pattern, launch_with_pdl, trigger_completion_at_end, output, residual_out,
      norm_out, quant_out, scale_out, residual_in, rms_gamma, rms_eps, scale_factor, layout_code,
      use_oneshot, fp32_acc, moe_reduction_device_num_experts, moe_reduction_scale_input,
      moe_reduction_active_experts_token_input, moe_reduction_token_input,
      expanded_idx_to_permuted_idx, expert_scale_factor, shared_expert_output,
      block_quant_group_size, weight_bias, moe_finalize_backend);
}

// ---- PcieIpcAllReduceWorkspace ------------------------------------------------------------------

struct PcieIpcAllReduceWorkspace::Impl {
  int64_t world_size = 0, rank = 0, max_numel = 0, max_blocks = 0;
  DType dtype = DType::kBFloat16;
  std::shared_ptr<comm::CommBackend> comm;
  std::unique_ptr<detail::PeerMemory> mem;
  bool destroyed = false;
  int blocks = 0;  // the CUDA grid the group agreed on (0 on the CPU)
};

namespace {

constexpr const char* kPcieModule = "flashinfer.comm.pcie_ipc_ar";

// upstream's IpcVariant.
enum class IpcVariant : int64_t { kUnstaged = 0, kStaged, kStagedRing, kFlatStaged };

struct IpcConfig {
  int64_t blocks = 0, threads = 0, variant = 0;
};

// The integer after `key=` in upstream's dataclass repr ("variant=<IpcVariant.STAGED: 1>"
// gives 1).
std::optional<int64_t> repr_field(const std::string& repr, const std::string& key) {
  auto at = repr.find(key + "=");
  if (at == std::string::npos) return std::nullopt;
  at += key.size() + 1;
  const auto end = repr.find_first_of(",)", at);
  std::string v = repr.substr(at, end == std::string::npos ? std::string::npos : end - at);
  if (const auto colon = v.rfind(':'); colon != std::string::npos) v = v.substr(colon + 1);
  v.erase(std::remove_if(v.begin(), v.end(), [](char c) { return c == ' ' || c == '>'; }), v.end());
  if (v.empty() || v.size() > 12 || v.find_first_not_of("-0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoll(v);
}

int64_t config_int(const Value& x, const char* name, const char* op) {
  if (x.kind() == Value::Kind::kEnum) {
    const std::string& v = x.as_enum().value;
    FLASHINFER_CHECK(
        !v.empty() && v.size() < 12 && v.find_first_not_of("-0123456789") == std::string::npos, op,
        "config", "config.", name, " must be an int, got ", x.repr());
    return std::stoll(v);
  }
  FLASHINFER_CHECK(x.kind() == Value::Kind::kInt, op, "config", "config.", name,
                   " must be an int, got ", x.repr());
  return x.as_int();
}

IpcConfig parse_config(const Value& v, const char* op) {
  IpcConfig c;
  if (v.is_sequence()) {
    FLASHINFER_CHECK(v.items().size() == 3, op, "config",
                     "config must be (blocks, threads, variant), got ", v.repr());
    c.blocks = config_int(v.items()[0], "blocks", op);
    c.threads = config_int(v.items()[1], "threads", op);
    c.variant = config_int(v.items()[2], "variant", op);
    return c;
  }
  if (v.kind() == Value::Kind::kDict) {
    int found = 0;
    for (const auto& [k, x] : v.dict_items()) {
      const std::string key = k.kind() == Value::Kind::kString ? k.as_string() : "";
      if (key == "blocks") c.blocks = config_int(x, "blocks", op), ++found;
      if (key == "threads") c.threads = config_int(x, "threads", op), ++found;
      if (key == "variant") c.variant = config_int(x, "variant", op), ++found;
    }
    FLASHINFER_CHECK(found == 3, op, "config", "config needs blocks, threads and variant, got ",
                     v.repr());
    return c;
  }
  if (v.kind() == Value::Kind::kObject) {  // a recorded IpcLaunchConfig: its repr
    const std::string& repr = v.as_object().repr;
    const auto b = repr_field(repr, "blocks"), t = repr_field(repr, "threads"),
               r = repr_field(repr, "variant");
    FLASHINFER_CHECK(b && t && r, op, "config", "cannot read blocks, threads and variant from ",
                     repr);
    return {*b, *t, *r};
  }
  FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, "config",
                  "config must be None, (blocks, threads, variant) or an IpcLaunchConfig, got ",
                  v.repr());
}

bool pcie_supports(const PcieIpcAllReduceWorkspace::Impl& w, const Tensor& inp) {
  return !w.destroyed && inp.defined() &&
         (inp.dtype() == DType::kBFloat16 || inp.dtype() == DType::kFloat16) &&
         inp.is_contiguous() && inp.dim() >= 1 && inp.numel() <= w.max_numel &&
         inp.numel() % 8 == 0 && inp.numel() >= 8 * w.world_size;
}

// The longest row of at most 4096 elements that divides n (n % 8 == 0): the kernels' rows.
int64_t pcie_row(int64_t n) {
  for (int64_t h = 4096; h > 8; h /= 2) {
    if (n % h == 0) return h;
  }
  return 8;
}

IpcConfig resolve_config(const PcieIpcAllReduceWorkspace::Impl& w, const Tensor& inp,
                         const std::optional<Value>& config, const char* op) {
  const int64_t W = w.world_size;
  IpcConfig c;
  if (!config || config->is_none()) {
    FLASHINFER_CHECK(pcie_supports(w, inp), op, "inp", "unsupported shape ",
                     shape_to_string(inp.shape()), " dtype ", dtype_torch_name(inp.dtype()), " at ",
                     W, " ranks; check supports() first");
    // Upstream's untuned seed policy (only the variant changes the arithmetic).
    const int64_t payload = inp.numel() * 2;
    c.variant = W == 2                 ? int64_t(IpcVariant::kUnstaged)
                : payload >= 32 * 1024 ? int64_t(IpcVariant::kStagedRing)
                : W == 4               ? int64_t(IpcVariant::kStaged)
                                       : int64_t(IpcVariant::kUnstaged);
    c.threads = W == 2 ? 128 : 256;
    c.blocks = 1;
    return c;
  }
  c = parse_config(*config, op);
  FLASHINFER_CHECK(c.blocks > 0 && c.blocks <= w.max_blocks, op, "config", "blocks must be in (0, ",
                   w.max_blocks, "], got ", c.blocks);
  FLASHINFER_CHECK(c.threads > 0 && c.threads <= 1024 && c.threads >= W, op, "config",
                   "threads must be in (0, 1024] and >= the world size, got ", c.threads);
  FLASHINFER_CHECK(c.variant >= 0 && c.variant < 6, op, "config", "unknown variant ", c.variant);
  FLASHINFER_CHECK_CODE(c.variant <= 3, ErrorCode::kUnsupported, op, "config",
                        "the copy-engine variants (4, 5) are not implemented in flashinfer-cpp");
  FLASHINFER_CHECK(W != 2 || c.variant <= 1, op, "config",
                   "2 ranks take only the UNSTAGED and STAGED variants");
  FLASHINFER_CHECK(c.variant != int64_t(IpcVariant::kFlatStaged) || W == 8, op, "config",
                   "FLAT_STAGED needs 8 ranks");
  FLASHINFER_CHECK(W != 8 || c.variant != int64_t(IpcVariant::kStaged) || c.blocks % 4 == 0, op,
                   "config", "8 ranks STAGED need blocks % 4 == 0, got ", c.blocks);
  return c;
}

}  // namespace

PcieIpcAllReduceWorkspace::PcieIpcAllReduceWorkspace(std::shared_ptr<comm::CommBackend> group,
                                                     int64_t max_numel, DType dtype,
                                                     int64_t max_blocks,
                                                     std::optional<Value> profile,
                                                     std::optional<Value> tune_batches,
                                                     std::optional<Value> tune_cache) {
  call_init<PcieInit>(
      [&] {
        const char* op = "PcieIpcAllReduceWorkspace.__init__";
        FLASHINFER_CHECK(group != nullptr, op, "group",
                         "a CommBackend is required (upstream's group is a torch ProcessGroup)");
        const int64_t w = group->Get_size();
        FLASHINFER_CHECK(w == 2 || w == 4 || w == 8, op, "group", "world size ", w,
                         " unsupported; expected one of (2, 4, 8)");
        FLASHINFER_CHECK(dtype == DType::kBFloat16 || dtype == DType::kFloat16, op, "dtype",
                         "dtype ", dtype_torch_name(dtype),
                         " unsupported; expected one of (torch.bfloat16, torch.float16)");
        FLASHINFER_CHECK(max_numel > 0 && max_numel % 8 == 0, op, "max_numel",
                         "max_numel must be a positive multiple of 8 for ", dtype_torch_name(dtype),
                         ", got ", max_numel);
        FLASHINFER_CHECK(max_blocks > 0, op, "max_blocks", "max_blocks must be positive");
        auto impl = std::make_shared<Impl>();
        impl->world_size = w;
        impl->rank = group->Get_rank();
        impl->max_numel = max_numel;
        impl->max_blocks = max_blocks;
        impl->dtype = dtype;
        impl->comm = group;
        impl->mem = std::make_unique<detail::PeerMemory>(
            *group, static_cast<std::size_t>(ArBufferLayout::bytes(max_numel, 2)), op);
        impl->blocks = detail::agreed_grid_cap(*group, ArBufferLayout::kMaxBlocks);
        impl_ = std::move(impl);
      },
      *this, group, max_numel, dtype, max_blocks, profile, tune_batches, tune_cache);
}

PcieIpcAllReduceWorkspace::~PcieIpcAllReduceWorkspace() = default;
int64_t PcieIpcAllReduceWorkspace::world_size() const { return impl_->world_size; }
int64_t PcieIpcAllReduceWorkspace::rank() const { return impl_->rank; }
bool PcieIpcAllReduceWorkspace::supports(const Tensor& inp) const {
  return pcie_supports(*impl_, inp);
}
void PcieIpcAllReduceWorkspace::destroy() {
  if (impl_->destroyed) return;
  release_collectively(*impl_->comm, impl_->mem);
  impl_->destroyed = true;
}

Tensor PcieIpcAllReduceWorkspace::all_reduce(const Tensor& inp, std::optional<Tensor> out,
                                             std::optional<Value> config, bool enable_pdl) {
  return call_op<&PcieIpcAllReduceWorkspace::all_reduce>(
      [&] {
        const char* op = "PcieIpcAllReduceWorkspace.all_reduce";
        Impl& w = *impl_;
        FLASHINFER_CHECK(!w.destroyed, op, "self", "the workspace was destroyed");
        FLASHINFER_CHECK_CODE(!enable_pdl, ErrorCode::kUnsupported, op, "enable_pdl",
                              "enable_pdl is not supported yet: in the TP8 block kernel the "
                              "launch-completion trigger precedes the island ack and barrier "
                              "flag stores");
        api::check_defined(inp, op, "inp");
        const Device dev = inp.device();
        FLASHINFER_CHECK(dev == w.comm->device(), op, "inp", "inp is on ", dev.str(),
                         " but the workspace's buffers are on ", w.comm->device().str());
        const IpcConfig c = resolve_config(w, inp, config, op);
        const int64_t n = inp.numel();
        FLASHINFER_CHECK(inp.is_contiguous(), op, "inp", "inp must be contiguous");
        FLASHINFER_CHECK(inp.dtype() == DType::kBFloat16 || inp.dtype() == DType::kFloat16, op,
                         "inp", "inp must be bfloat16 or float16, got ",
                         dtype_torch_name(inp.dtype()));
        FLASHINFER_CHECK(n <= w.max_numel, op, "inp", "payload exceeds the workspace capacity (", n,
                         " > ", w.max_numel, " elements)");
        FLASHINFER_CHECK(n % 8 == 0, op, "inp", "numel must be a multiple of 8, got ", n);
        Tensor o;
        if (out && out->defined()) {
          o = *out;
          api::check_same_device(o, inp, op, "out", "inp");
          FLASHINFER_CHECK(o.is_contiguous(), op, "out", "out must be contiguous");
          api::check_same_dtype(o, inp, op, "out", "inp");
          FLASHINFER_CHECK(o.numel() == n, op, "out", "out has ", o.numel(), " elements, inp ", n);
        } else {
          o = Tensor::empty(inp.shape(), inp.dtype(), dev);
        }
        AllReduceFusionParams p;
        p.world_size = static_cast<int>(w.world_size);
        p.rank = static_cast<int>(w.rank);
        p.hidden = pcie_row(n);
        p.tokens = n / p.hidden;
        p.dtype = inp.dtype();
        p.pattern = 0;
        p.fp32_acc = false;
        p.oneshot = false;
        // At 8 ranks every variant but FLAT_STAGED is upstream's 4 + 4 island kernel.
        p.island8 = w.world_size == 8 && c.variant != int64_t(IpcVariant::kFlatStaged);
        p.input = inp.data_ptr();
        p.output = o.data_ptr();
        p.blocks = w.blocks;
        run_exchange(*w.mem, *w.comm, w.max_numel, 2, p, dev, op, "inp", false);
        return o;
      },
      *this, inp, out, config, enable_pdl);
}

// ---- Decode context-parallel all-to-all ---------------------------------------------------------

namespace {

constexpr const char* kDcpModule = "flashinfer.comm.dcp_alltoall";
constexpr int64_t kDcpFifoBytes = 4 * 128 * 1024;  // upstream's FIFO: 4 entries of 128 KiB
constexpr int64_t kDcpInfoBytes = 256;             // its head / tail records

constexpr api::KernelEntry<kernels::DcpA2aParams> kDcpKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: each rank's inputs into its row, its call published and every peer's "
     "awaited (atomics), the outputs gathered from the peers' rows",
     nullptr,
     [](const kernels::DcpA2aParams& p, const api::LaunchContext&) {
       kernels::cpu::decode_cp_a2a_alltoall(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernels: put (all blocks), publish and await (one thread, system-scope release / "
     "acquire), gather (all blocks)",
     nullptr,
     [](const kernels::DcpA2aParams& p, const api::LaunchContext& c) {
       kernels::cuda::decode_cp_a2a_alltoall(p, c.stream, c.enable_pdl,
                                             detail::cuda_sm_count(c.device.index));
     }},
#endif
};

// Workspaces made by decode_cp_a2a_allocate_mnnvl_workspace, by address, until every rank of
// the group has taken its view (then the views keep the memory).
struct SharedWorkspaces {
  std::mutex m;
  std::map<uint64_t, std::pair<Tensor, int64_t>> pending;  // address -> (tensor, views left)
};
SharedWorkspaces& shared_workspaces() {
  static SharedWorkspaces s;
  return s;
}

int64_t dcp_row_bytes(int64_t cp_size, int sm_count) {
  const int64_t groups = (cp_size + 7) / 8;
  const int64_t channels = std::max<int64_t>(1, sm_count / (2 * groups));
  return channels * cp_size * (kDcpFifoBytes + 2 * kDcpInfoBytes);
}

int visible_sm_count() {
  return detail::cuda_runtime_device_count() > 0 ? detail::cuda_sm_count(0) : 0;
}

// Where the exchange of `ws` lives: past its elements in its storage when the allocation above
// made it (rows of the same size after the tensor's), else in the tensor's own rows.
struct DcpExchange {
  char* base;
  int64_t row_stride, row_bytes;
};
DcpExchange dcp_exchange_of(const Tensor& ws) {
  const int64_t rows = ws.size(0), row_bytes = ws.size(1) * 8;
  const auto& st = ws.storage();
  if (ws.is_contiguous() && ws.storage_offset() == 0 && st &&
      st->nbytes() >= static_cast<std::size_t>(2 * rows * row_bytes)) {
    return {static_cast<char*>(ws.data_ptr()) + rows * row_bytes, row_bytes, row_bytes};
  }
  return {static_cast<char*>(ws.data_ptr()), (rows == 1 ? ws.size(1) : ws.stride(0)) * 8,
          row_bytes};
}

void check_dcp_workspace(const Tensor& ws, int64_t cp_size, const char* op) {
  api::check_defined(ws, op, "workspace");
  FLASHINFER_CHECK(ws.dtype() == DType::kInt64, op, "workspace", "workspace must be int64, got ",
                   dtype_torch_name(ws.dtype()));
  FLASHINFER_CHECK(ws.dim() == 2, op, "workspace", "workspace must be 2D");
  FLASHINFER_CHECK(ws.size(0) == cp_size, op, "workspace",
                   "workspace first dim must equal cp_size");
  FLASHINFER_CHECK(ws.stride(1) == 1 && (ws.size(0) == 1 || ws.stride(0) >= ws.size(1)), op,
                   "workspace", "workspace rows must be dense, got strides ",
                   shape_to_string(ws.strides()));
}

}  // namespace

namespace detail {

Tensor group_shared_rows(comm::CommBackend& c, int64_t rows, int64_t row_elems, DType dtype,
                         int64_t storage_factor, const char* op, const char* arg) {
  const Device dev = c.device();
  const int64_t r = c.Get_rank();
  // One address space over the ranks: rank 0 makes it, every rank views it (upstream maps
  // MNNVL fabric memory; here the ranks must share a process).
  Tensor ws;
  // Fields: the process (pid and nonce: containers' processes may share pids), rank 0's
  // address, the device.
  std::string mine(sizeof(uint64_t) * 4, '\0');
  const detail::ProcessIdentity me = detail::this_process();
  uint64_t fields[4] = {static_cast<uint64_t>(me.pid), 0, 0, me.nonce};
  if (r == 0) {
    ws = Tensor::zeros({storage_factor * rows * row_elems}, dtype, dev)
             .slice(0, 0, rows * row_elems)
             .view({rows, row_elems});
    // The zeros (made on this thread's stream) are in place before any rank (each on its own
    // stream) writes its row. A wait for this stream alone: a device-wide one would also wait
    // for another group's kernel spinning on a rank that waits here.
    if (dev.is_cuda()) cuda_stream_synchronize(current_cuda_stream(), dev.index);
    fields[1] = reinterpret_cast<uintptr_t>(ws.data_ptr());
    const std::lock_guard<std::mutex> lock(shared_workspaces().m);
    shared_workspaces().pending[fields[1]] = {ws, c.Get_size() - 1};
  }
  fields[2] = static_cast<uint64_t>(dev.index);
  std::memcpy(mine.data(), fields, sizeof(fields));
  const std::vector<std::string> all = c.allgather(mine);
  uint64_t root[4];
  std::memcpy(root, all.at(0).data(), sizeof(root));
  bool one_process = true;
  for (const std::string& b : all) {
    uint64_t f[4];
    std::memcpy(f, b.data(), sizeof(f));
    one_process = one_process && f[0] == root[0] && f[3] == root[3];
  }
  if (!one_process && r == 0) {
    const std::lock_guard<std::mutex> lock(shared_workspaces().m);
    shared_workspaces().pending.erase(fields[1]);
  }
  FLASHINFER_CHECK_CODE(one_process, ErrorCode::kUnsupported, op, arg,
                        "the ranks are in several processes: one address space over them needs "
                        "MNNVL fabric memory, which flashinfer-cpp does not implement (run the "
                        "ranks as threads of one process)");
  if (r != 0) {
    if (dev.is_cuda()) cuda_enable_peer_access(dev.index, static_cast<int>(root[2]));
    const std::lock_guard<std::mutex> lock(shared_workspaces().m);
    auto& pending = shared_workspaces().pending;
    auto it = pending.find(root[1]);
    FLASHINFER_CHECK_CODE(it != pending.end(), ErrorCode::kInternal, op, arg,
                          "rank 0's workspace is gone");
    ws = it->second.first;
    if (--it->second.second == 0) pending.erase(it);
  } else if (c.Get_size() == 1) {
    const std::lock_guard<std::mutex> lock(shared_workspaces().m);
    shared_workspaces().pending.erase(fields[1]);
  }
  return ws;
}

}  // namespace detail

Mapping::Mapping(int64_t world_size_, int64_t rank_, int64_t gpus_per_node_, int64_t cp_size_,
                 int64_t tp_size_, int64_t pp_size_, int64_t moe_cluster_size_,
                 int64_t moe_tp_size_, int64_t moe_ep_size_)
    : world_size(world_size_),
      rank(rank_),
      gpus_per_node(gpus_per_node_),
      cp_size(cp_size_),
      tp_size(tp_size_),
      pp_size(pp_size_),
      moe_cluster_size(moe_cluster_size_ == -1 ? 1 : moe_cluster_size_),
      moe_tp_size(moe_tp_size_),
      moe_ep_size(moe_ep_size_) {
  const char* op = "Mapping";
  FLASHINFER_CHECK(tp_size > 0 && cp_size > 0 && pp_size > 0, op, "tp_size",
                   "tp_size, cp_size and pp_size must be positive");
  FLASHINFER_CHECK(world_size == tp_size * cp_size * pp_size, op, "world_size", "world_size ",
                   world_size, " != tp_size * cp_size * pp_size (", tp_size * cp_size * pp_size,
                   ")");
  FLASHINFER_CHECK(rank >= 0 && rank < world_size, op, "rank",
                   "Rank should be an integer between 0 and ", world_size - 1, ", but got ", rank,
                   ".");
  FLASHINFER_CHECK(moe_cluster_size > 0 && (moe_tp_size == -1 || moe_tp_size > 0) &&
                       (moe_ep_size == -1 || moe_ep_size > 0),
                   op, "moe_ep_size",
                   "moe_cluster_size, moe_tp_size and moe_ep_size must be "
                   "positive or -1");
  // The unset MoE sizes take what the TP group leaves (upstream's derivation).
  if (moe_tp_size == -1 && moe_ep_size == -1) {
    moe_tp_size = tp_size / moe_cluster_size;
    moe_ep_size = 1;
  } else if (moe_tp_size == -1) {
    moe_tp_size = tp_size / (moe_ep_size * moe_cluster_size);
  } else if (moe_ep_size == -1) {
    moe_ep_size = tp_size / (moe_tp_size * moe_cluster_size);
  }
  FLASHINFER_CHECK(
      moe_tp_size > 0 && moe_ep_size > 0 && moe_tp_size * moe_ep_size * moe_cluster_size == tp_size,
      op, "moe_ep_size",
      "tp_size must equal to moe_tp_size * moe_ep_size * moe_cluster_size, but got ", tp_size,
      " != ", moe_tp_size, " * ", moe_ep_size, " * ", moe_cluster_size);
}

std::string Mapping::repr() const {
  return "Mapping(world_size=" + std::to_string(world_size) + ", rank=" + std::to_string(rank) +
         ", gpus_per_node=" + std::to_string(gpus_per_node) +
         ", cp_size=" + std::to_string(cp_size) + ", tp_size=" + std::to_string(tp_size) +
         ", pp_size=" + std::to_string(pp_size) +
         ", moe_cluster_size=" + std::to_string(moe_cluster_size) +
         ", moe_tp_size=" + std::to_string(moe_tp_size) +
         ", moe_ep_size=" + std::to_string(moe_ep_size) + ")";
}

int64_t decode_cp_a2a_workspace_size(int64_t cp_size) {
  return call_op<&decode_cp_a2a_workspace_size>(
      [&] {
        FLASHINFER_CHECK(cp_size >= 1, "decode_cp_a2a_workspace_size", "cp_size",
                         "cp_size must be positive, got ", cp_size);
        return dcp_row_bytes(cp_size, visible_sm_count());
      },
      cp_size);
}

Tensor decode_cp_a2a_allocate_mnnvl_workspace(std::shared_ptr<Mapping> mapping,
                                              std::shared_ptr<MnnvlConfig> mnnvl_config) {
  return call_op<&decode_cp_a2a_allocate_mnnvl_workspace>(
      [&] {
        const char* op = "decode_cp_a2a_allocate_mnnvl_workspace";
        FLASHINFER_CHECK(mapping != nullptr, op, "mapping", "a Mapping is required");
        FLASHINFER_CHECK(mnnvl_config && mnnvl_config->comm_backend, op, "mnnvl_config",
                         "an MnnvlConfig with a comm_backend is required (upstream's default is "
                         "MPI's world, which C++ does not have)");
        comm::CommBackend& c = *mnnvl_config->comm_backend;
        const int64_t cp = mapping->cp_size, r = mapping->cp_rank();
        FLASHINFER_CHECK(c.Get_size() == cp && c.Get_rank() == r, op, "mnnvl_config",
                         "the comm_backend is rank ", c.Get_rank(), " of ", c.Get_size(),
                         ", the mapping's CP rank ", r, " of ", cp,
                         ": pass the CP group's backend");
        const Device dev = c.device();
        const int64_t row_bytes =
            dcp_row_bytes(cp, dev.is_cuda() ? detail::cuda_sm_count(dev.index) : 0);
        // The exchange's flags and slots live past the tensor's elements, in the same storage:
        // the tensor's bytes never change after this, so a recorder writing them while peers
        // exchange (threads of this process) writes consistent data.
        Tensor ws =
            detail::group_shared_rows(c, cp, (row_bytes + 7) / 8, DType::kInt64, 2, op, "mapping");
        c.barrier();
        return ws;
      },
      mapping, mnnvl_config);
}

void decode_cp_a2a_init_workspace(const Tensor& workspace, int64_t cp_rank, int64_t cp_size) {
  call_op<&decode_cp_a2a_init_workspace>(
      [&] {
        const char* op = "decode_cp_a2a_init_workspace";
        check_dcp_workspace(workspace, cp_size, op);
        FLASHINFER_CHECK(cp_rank >= 0 && cp_rank < cp_size, op, "cp_rank",
                         "cp_rank must be in [0, cp_size)");
        // This rank's row only (of the exchange area where the allocation made one).
        const DcpExchange ex = dcp_exchange_of(workspace);
        if (ex.base == static_cast<char*>(workspace.data_ptr())) {
          Tensor row = workspace.select(0, cp_rank);
          row.fill_(0.0);
        } else {
          Tensor::from_storage(workspace.storage(), {ex.row_bytes / 8}, {1},
                               workspace.size(0) * workspace.size(1) + cp_rank * (ex.row_bytes / 8),
                               DType::kInt64)
              .fill_(0.0);
        }
        if (workspace.device().is_cuda()) {
          detail::cuda_stream_synchronize(current_cuda_stream(), workspace.device().index);
        }
      },
      workspace, cp_rank, cp_size);
}

namespace {

// upstream's checkDcpOutput: a preallocated output must match its input exactly.
void check_dcp_output(const Tensor& in, const Tensor& o, const char* op, const char* name) {
  api::check_defined(o, op, name);
  FLASHINFER_CHECK(o.is_contiguous(), op, name, "output must be contiguous");
  FLASHINFER_CHECK(o.dtype() == in.dtype(), op, name, name, " dtype must match its input");
  FLASHINFER_CHECK(o.dim() == in.dim(), op, name, name, " rank must match its input");
  FLASHINFER_CHECK(o.shape() == in.shape(), op, name, name, " shape must match its input");
  FLASHINFER_CHECK(o.device() == in.device(), op, name, name, " must live on the input device");
}

}  // namespace

std::tuple<Tensor, Tensor> decode_cp_a2a_alltoall(const Tensor& partial_o,
                                                  const Tensor& softmax_stats,
                                                  const Tensor& workspace, int64_t cp_rank,
                                                  int64_t cp_size, std::optional<bool> enable_pdl,
                                                  const std::optional<std::vector<Tensor>>& out) {
  return call_op<&decode_cp_a2a_alltoall>(
      [&]() -> std::tuple<Tensor, Tensor> {
        const char* op = "decode_cp_a2a_alltoall";
        api::check_defined(partial_o, op, "partial_o");
        api::check_defined(softmax_stats, op, "softmax_stats");
        FLASHINFER_CHECK(
            partial_o.dtype() == DType::kFloat16 || partial_o.dtype() == DType::kBFloat16, op,
            "partial_o", "partial_o must be half or bfloat16");
        FLASHINFER_CHECK(softmax_stats.dtype() == DType::kFloat32, op, "softmax_stats",
                         "softmax_stats must be float32, got ",
                         dtype_torch_name(softmax_stats.dtype()));
        FLASHINFER_CHECK(partial_o.dim() >= 2, op, "partial_o",
                         "partial_o must have at least 2 dimensions");
        FLASHINFER_CHECK(softmax_stats.dim() >= 2, op, "softmax_stats",
                         "softmax_stats must have at least 2 dimensions");
        FLASHINFER_CHECK(partial_o.dim() == softmax_stats.dim(), op, "softmax_stats",
                         "partial_o and softmax_stats must have same number of dimensions");
        FLASHINFER_CHECK(partial_o.size(-2) == cp_size, op, "partial_o",
                         "partial_o second-to-last dim must equal cp_size");
        FLASHINFER_CHECK(softmax_stats.size(-2) == cp_size, op, "softmax_stats",
                         "softmax_stats second-to-last dim must equal cp_size");
        const int64_t S = softmax_stats.size(-1), D = partial_o.size(-1);
        FLASHINFER_CHECK(S >= 2 && S % 2 == 0, op, "softmax_stats",
                         "softmax_stats last dim must be even and >= 2");
        for (int64_t d = 0; d + 2 < partial_o.dim(); ++d) {
          FLASHINFER_CHECK(partial_o.size(d) == softmax_stats.size(d), op, "softmax_stats",
                           "batch dimensions must match");
        }
        FLASHINFER_CHECK(D * 2 % 16 == 0, op, "partial_o",
                         "partial_o last dim must be 16-byte aligned");
        FLASHINFER_CHECK(partial_o.is_contiguous(), op, "partial_o",
                         "partial_o must be contiguous");
        // The CUDA kernel copies 4-byte words: a 16-bit view starting at an odd element would
        // be a misaligned access (a fault that ends the CUDA context).
        FLASHINFER_CHECK_CODE(
            !partial_o.device().is_cuda() ||
                reinterpret_cast<std::uintptr_t>(partial_o.data_ptr()) % 4 == 0,
            ErrorCode::kUnsupported, op, "partial_o",
            "starts at an address that is not 4-byte aligned (a view from an odd element); the "
            "CUDA kernel copies 4-byte words");
        FLASHINFER_CHECK(softmax_stats.is_contiguous(), op, "softmax_stats",
                         "softmax_stats must be contiguous");
        check_dcp_workspace(workspace, cp_size, op);
        FLASHINFER_CHECK(cp_rank >= 0 && cp_rank < cp_size, op, "cp_rank",
                         "cp_rank must be in [0, cp_size)");
        const Device dev = partial_o.device();
        api::check_same_device(softmax_stats, partial_o, op, "softmax_stats", "partial_o");
        FLASHINFER_CHECK(
            workspace.device() == dev || (workspace.device().is_cuda() && dev.is_cuda()), op,
            "workspace", "workspace is on ", workspace.device().str(), ", partial_o on ",
            dev.str());
        Tensor o_out, s_out;
        if (out) {
          // Python unpacks the tuple first: two items or a ValueError.
          FLASHINFER_CHECK(out->size() == 2, op, "out",
                           "expected (partial_o_out, softmax_stats_out), got ", out->size(),
                           " tensors");
          check_dcp_output(partial_o, (*out)[0], op, "partial_o_out");
          check_dcp_output(softmax_stats, (*out)[1], op, "softmax_stats_out");
          // The CUDA kernel writes 4-byte words, as it reads them (partial_o's check above).
          FLASHINFER_CHECK_CODE(
              !dev.is_cuda() || reinterpret_cast<std::uintptr_t>((*out)[0].data_ptr()) % 4 == 0,
              ErrorCode::kUnsupported, op, "partial_o_out",
              "starts at an address that is not 4-byte aligned (a view from an odd element); the "
              "CUDA kernel writes 4-byte words");
          o_out = (*out)[0];
          s_out = (*out)[1];
        } else {
          o_out = Tensor::empty(partial_o.shape(), partial_o.dtype(), dev);
          s_out = Tensor::empty(softmax_stats.shape(), DType::kFloat32, dev);
        }
        kernels::DcpA2aParams p;
        p.cp_rank = static_cast<int>(cp_rank);
        p.cp_size = static_cast<int>(cp_size);
        p.entries = partial_o.numel() / std::max<int64_t>(1, cp_size * D);
        p.D = D;
        p.S = S;
        p.dtype = partial_o.dtype();
        if (p.entries == 0 || cp_size == 0) return {o_out, s_out};
        p.o_in = partial_o.data_ptr();
        p.stats_in = static_cast<const float*>(softmax_stats.data_ptr());
        p.o_out = o_out.data_ptr();
        p.stats_out = static_cast<float*>(s_out.data_ptr());
        const DcpExchange ex = dcp_exchange_of(workspace);
        p.workspace = ex.base;
        p.row_stride = ex.row_stride;
        const int64_t row_bytes = ex.row_bytes;
        p.slot_bytes = (row_bytes - kernels::DcpA2aParams::kSlotsOffset) / 2 / 16 * 16;
        FLASHINFER_CHECK_CODE(p.bytes_needed() <= p.slot_bytes, ErrorCode::kUnsupported, op,
                              "partial_o", "this exchange needs ", p.bytes_needed(),
                              " bytes of a workspace row's slot, which holds ", p.slot_bytes,
                              " (flashinfer-cpp exchanges whole inputs, upstream streams them "
                              "through FIFOs): split the call");
        p.abort = detail::thread_group_abort_word();
        // No backend here: the group is the one whose rank this thread runs, if its size is
        // cp_size (core/comm_abort.h).
        detail::gated_collective_launch(nullptr, cp_size, dev, preload_dcp, [&] {
          api::launch(kDcpKernels, p, dev, op, "partial_o", enable_pdl);
        });
        return {o_out, s_out};
      },
      partial_o, softmax_stats, workspace, cp_rank, cp_size, enable_pdl, out);
}

namespace detail {

void register_comm_ops(OpRegistry& r) {
  declare<&create_allreduce_fusion_workspace>(
      r,
      {.name = "create_allreduce_fusion_workspace",
       .module = kAllreduceModule,
       .summary =
           "Collective: a rank's all-reduce fusion workspace (peer buffers every rank maps)"},
      arg("backend", std::string("auto")), arg("world_size"), arg("rank"), arg("max_token_num"),
      arg("hidden_dim"), arg("dtype"), arg("gpus_per_node"), arg("comm_backend"),
      arg("force_oneshot_support", false), arg("group"));
  declare<&allreduce_fusion>(
      r,
      {.name = "allreduce_fusion",
       .module = kAllreduceModule,
       .summary =
           "Collective: sum over the group fused with residual add, RMSNorm and quantization"},
      "input", arg("workspace").required(), "pattern", arg("launch_with_pdl", false),
      arg("trigger_completion_at_end", true), arg("output").mut(),
      // vLLM writes the new residual over residual_in (or over input when it passes zeros as
      // residual_in) and the norm over input: each element is read before it is written.
      arg("residual_out").mut().same_view_as("residual_in").same_view_as("input"),
      arg("norm_out").mut().same_view_as("input"), arg("quant_out").mut(), arg("scale_out").mut(),
      arg("residual_in"), arg("rms_gamma"), arg("rms_eps", 1e-6), arg("scale_factor"),
      arg("layout_code"), arg("use_oneshot"), arg("fp32_acc", false),
      arg("moe_reduction_device_num_experts"), arg("moe_reduction_scale_input"),
      arg("moe_reduction_active_experts_token_input"), arg("moe_reduction_token_input"),
      arg("expanded_idx_to_permuted_idx"), arg("expert_scale_factor"), arg("shared_expert_output"),
      arg("block_quant_group_size"), arg("weight_bias", 0.0),
      arg("moe_finalize_backend", "trtllm").kw());
  api::register_backends("allreduce_fusion", kAllreduceKernels);
  declare<&TRTLLMAllReduceFusionWorkspace::checkpoint_prepare>(
      r, {.name = "TRTLLMAllReduceFusionWorkspace.checkpoint_prepare",
          .module = kAllreduceModule,
          .summary = "Collective: the workspace's buffers detached while idle"});
  declare<&TRTLLMAllReduceFusionWorkspace::checkpoint_restore>(
      r,
      {.name = "TRTLLMAllReduceFusionWorkspace.checkpoint_restore",
       .module = kAllreduceModule,
       .summary = "Collective: the buffers attached again, the flag protocol restarted"},
      arg("comm_backend").required());
  declare<&MNNVLAllReduceFusionWorkspace::checkpoint_prepare>(
      r, {.name = "MNNVLAllReduceFusionWorkspace.checkpoint_prepare",
          .module = kMnnvlModule,
          .summary = "Collective: the MNNVL workspace's handles detached while idle"});
  declare<&MNNVLAllReduceFusionWorkspace::checkpoint_restore>(
      r,
      {.name = "MNNVLAllReduceFusionWorkspace.checkpoint_restore",
       .module = kMnnvlModule,
       .summary = "Collective: the MNNVL handles attached again, the exchange restarted"},
      arg("comm_backend").required());
  static constexpr api::BackendSummary kWorkspaceBackends[] = {
    {DeviceType::kCPU, "host buffers in POSIX shared memory, addresses exchanged once"},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "device buffers shared by CUDA IPC handles or peer access"},
#endif
  };
  api::register_backends("create_allreduce_fusion_workspace", kWorkspaceBackends);
  // Replay runs every rank's recorded call together, each with a workspace made for it here.
  CollectiveSpec spec;
  spec.op = "allreduce_fusion";
  spec.workspace_param = 1;
  spec.creator = "create_allreduce_fusion_workspace";
  spec.creator_world_param = 1;
  spec.creator_rank_param = 2;
  spec.creator_comm_param = 7;
  // The checkpoint methods join the workspace's stream (restore after its prepare).
  for (const char* cls : {"TRTLLMAllReduceFusionWorkspace", "MNNVLAllReduceFusionWorkspace"}) {
    const std::string prepare = std::string(cls) + ".checkpoint_prepare";
    spec.also.push_back(prepare);
    spec.also.push_back(std::string(cls) + ".checkpoint_restore");
    spec.workspace_params[prepare] = 0;
    spec.workspace_params[std::string(cls) + ".checkpoint_restore"] = 0;
  }
  spec.prelude = [](std::string_view fn) -> std::string {
    constexpr std::string_view restore = ".checkpoint_restore";
    if (fn.size() <= restore.size() || !fn.ends_with(restore)) return std::string();
    return std::string(fn.substr(0, fn.size() - restore.size())) + ".checkpoint_prepare";
  };
  spec.adjust_args = [](std::string_view fn, std::vector<Value>& a,
                        const std::shared_ptr<comm::CommBackend>& c) {
    if (fn.ends_with(".checkpoint_restore")) a.at(1) = to_value(c);
  };
  spec.make_workspace = [](const std::shared_ptr<comm::CommBackend>& c,
                           const std::vector<Value>& args, const std::vector<Value>* made) {
    // The recorded backend: an MNNVL workspace among the call's arguments (an "auto" creation
    // picks it where every GPU has multicast) or an explicit "mnnvl" creation.
    bool mnnvl = made && !made->empty() && made->at(0).kind() == Value::Kind::kString &&
                 made->at(0).as_string() == "mnnvl";
    for (const Value& v : args) {
      if (v.kind() == Value::Kind::kObject &&
          (v.as_object().type == "MNNVLAllReduceFusionWorkspace" ||
           v.as_object().repr.find("MNNVLAllReduceFusionWorkspace object") != std::string::npos)) {
        mnnvl = true;
      }
    }
    // The recorded sizes where the creation was recorded, else the call's input's.
    std::optional<int64_t> tokens, hidden;
    std::optional<DType> dtype;
    if (made && made->size() > 5 && !made->at(3).is_none() && !made->at(4).is_none()) {
      const std::vector<Value>& m = *made;
      tokens = m.at(3).as_int();
      hidden = m.at(4).as_int();
      if (!m.at(5).is_none()) dtype = m.at(5).as_dtype();
    } else {
      FLASHINFER_CHECK_CODE(args.at(0).is_tensor() && args.at(0).as_tensor().dim() == 2,
                            ErrorCode::kUnsupported, "replay", "",
                            "an all-reduce workspace replays with its recorded creation or a 2-D "
                            "input's sizes, and the recording has neither");
      const Tensor& x = args.at(0).as_tensor();
      tokens = std::max<int64_t>(1, x.size(0));
      hidden = std::max<int64_t>(1, x.size(1));
      dtype = x.dtype();
    }
    if (!mnnvl) {
      return to_value(create_allreduce_fusion_workspace("trtllm", c->Get_size(), c->Get_rank(),
                                                        tokens, hidden, dtype, std::nullopt, c));
    }
    // Upstream's buffers are rounded to its allocation granularity, which may exceed this
    // library's: the replay's fits the recorded call in either strategy as well.
    const int64_t W = c->Get_size();
    const DType dt = dtype.value_or(DType::kFloat32);
    int64_t bytes =
        mnnvl_required(W, *tokens, *hidden, dtype_size(dt), MNNVLAllreduceFusionStrategy::TWOSHOT);
    bytes = std::max(bytes, mnnvl_required(W, *tokens, *hidden, dtype_size(dt),
                                           MNNVLAllreduceFusionStrategy::ONESHOT));
    if (args.at(0).is_tensor() && args.at(0).as_tensor().dim() == 2) {
      const Tensor& x = args.at(0).as_tensor();
      for (int64_t st :
           {MNNVLAllreduceFusionStrategy::ONESHOT, MNNVLAllreduceFusionStrategy::TWOSHOT}) {
        bytes = std::max(bytes, mnnvl_required(W, x.size(0), x.size(1), dtype_size(x.dtype()), st));
      }
    }
    auto mapping = std::make_shared<Mapping>(W, c->Get_rank(), 8, 1, W);
    return to_value(std::make_shared<MNNVLAllReduceFusionWorkspace>(
        mapping, std::nullopt, std::nullopt, std::nullopt, bytes, c));
  };
  register_collective(std::move(spec));
  api::register_backends("TRTLLMAllReduceFusionWorkspace.checkpoint_prepare", kWorkspaceBackends);
  api::register_backends("TRTLLMAllReduceFusionWorkspace.checkpoint_restore", kWorkspaceBackends);
  api::register_backends("MNNVLAllReduceFusionWorkspace.checkpoint_prepare", kWorkspaceBackends);
  api::register_backends("MNNVLAllReduceFusionWorkspace.checkpoint_restore", kWorkspaceBackends);

  static constexpr api::BackendSummary kHostSizing[] = {{DeviceType::kCPU, "host-side sizing"}};
  declare<&decode_cp_a2a_workspace_size>(
      r,
      {.name = "decode_cp_a2a_workspace_size",
       .module = kDcpModule,
       .summary = "Bytes of one rank's decode-CP all-to-all workspace row (host-side sizing)"},
      "cp_size");
  declare<&decode_cp_a2a_allocate_mnnvl_workspace>(
      r,
      {.name = "decode_cp_a2a_allocate_mnnvl_workspace",
       .module = kDcpModule,
       .summary = "Collective: the decode-CP workspace, one address space over the CP ranks",
       .unwritten_results = {"result"},
       .unwritten_reason = "the workspace's bytes are the exchange's scratch"},
      arg("mapping").required(), arg("mnnvl_config").kw());
  declare<&decode_cp_a2a_init_workspace>(
      r,
      {.name = "decode_cp_a2a_init_workspace",
       .module = kDcpModule,
       .summary = "Resets this rank's row of the decode-CP workspace"},
      "workspace", "cp_rank", "cp_size");
  declare<&decode_cp_a2a_alltoall>(
      r,
      {.name = "decode_cp_a2a_alltoall",
       .module = kDcpModule,
       .summary = "Collective: partial outputs and softmax stats transposed over the CP ranks"},
      "partial_o", "softmax_stats", "workspace", "cp_rank", "cp_size", arg("enable_pdl"),
      arg("out").mut());
  static constexpr api::BackendSummary kDcpAlloc[] = {
    {DeviceType::kCPU, "one host tensor every rank of the process views"},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "one device tensor every rank of the process views (peer access)"},
#endif
  };
  api::register_backends("decode_cp_a2a_workspace_size", kHostSizing);
  api::register_backends("decode_cp_a2a_allocate_mnnvl_workspace", kDcpAlloc);
  api::register_backends("decode_cp_a2a_init_workspace", kDcpAlloc);
  api::register_backends("decode_cp_a2a_alltoall", kDcpKernels);
  CollectiveSpec dcp;
  dcp.op = "decode_cp_a2a_alltoall";
  dcp.workspace_param = 2;
  dcp.rank_param = 3;
  dcp.world_param = 4;
  dcp.make_workspace = [](const std::shared_ptr<comm::CommBackend>& c, const std::vector<Value>&,
                          const std::vector<Value>*) {
    auto m = std::make_shared<Mapping>(c->Get_size(), c->Get_rank(), 8, c->Get_size());
    Tensor ws = decode_cp_a2a_allocate_mnnvl_workspace(m, std::make_shared<MnnvlConfig>(c));
    decode_cp_a2a_init_workspace(ws, c->Get_rank(), c->Get_size());
    c->barrier();
    return Value(ws);
  };
  register_collective(std::move(dcp));

  declare_init<PcieInit>(
      r,
      {.name = "PcieIpcAllReduceWorkspace.__init__",
       .module = kPcieModule,
       .summary = "Collective: a rank's PCIe all-reduce workspace (peer buffers every rank maps)"},
      arg("group").required(), "max_numel", arg("dtype", DType::kBFloat16),
      arg("max_blocks", int64_t{128}), arg("profile"), arg("tune_batches"), arg("tune_cache"));
  declare<&PcieIpcAllReduceWorkspace::all_reduce>(
      r,
      {.name = "PcieIpcAllReduceWorkspace.all_reduce",
       .module = kPcieModule,
       .summary = "Collective: the sum of every rank's tensor, in the 16-bit dtype"},
      // out may be inp (the copy-engine variants, which refuse it upstream, are not here).
      "inp", arg("out").mut().same_view_as("inp").kw(), arg("config").kw(),
      arg("enable_pdl", false).kw());
  api::register_backends("PcieIpcAllReduceWorkspace.all_reduce", kAllreduceKernels);
  // The same peer buffers as the fusion workspace's.
  api::register_backends("PcieIpcAllReduceWorkspace.__init__", kWorkspaceBackends);
  CollectiveSpec pcie;
  pcie.op = "PcieIpcAllReduceWorkspace.all_reduce";
  pcie.workspace_param = 0;  // self
  pcie.creator = "PcieIpcAllReduceWorkspace.__init__";
  pcie.creator_comm_param = 1;  // group (self is 0)
  pcie.make_workspace = [](const std::shared_ptr<comm::CommBackend>& c,
                           const std::vector<Value>& args, const std::vector<Value>*) {
    const Tensor& x = args.at(1).as_tensor();
    const int64_t n = std::max<int64_t>(x.numel(), 8 * c->Get_size());
    const DType dt = x.dtype() == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
    return to_value(std::make_shared<PcieIpcAllReduceWorkspace>(c, (n + 7) / 8 * 8, dt));
  };
  register_collective(std::move(pcie));
}

}  // namespace detail

}  // namespace flashinfer
