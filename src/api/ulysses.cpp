// flashinfer.comm.ulysses: UlyssesCommunicator (scatter_heads, gather_heads). Upstream's checks
// and messages in its order, the peer buffers (core/peer_memory.h) and the exchange: on the CPU
// the reference pushes each rank's rows into its peers' staging buffers between two barriers; on
// CUDA one kernel does it with upstream's signal protocol (docs/COMM.md, "Ulysses all-to-all").
#include "flashinfer/ops/ulysses.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "api/backends.h"
#include "api/checks.h"
#include "api/device_props.h"
#include "api/kernel_table.h"
#include "core/comm_abort.h"
#include "core/cuda_runtime.h"
#include "core/device_location.h"
#include "core/peer_memory.h"
#include "core/process_identity.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/stream.h"
#include "kernels/cpu/ulysses_cpu.h"
#include "kernels/ulysses_params.h"
#include "replay/collective_replay.h"

#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/ulysses_cuda.h"
#endif

namespace flashinfer {

struct UlyssesCommunicator::Impl {
  int64_t world_size = 1, rank = 0, max_elems = 0;
  DType dtype = DType::kBFloat16;
  Device device = Device::cpu();
  std::string backend;
  std::optional<std::string> fallback_reason;
  std::shared_ptr<comm::CommBackend> comm;
  std::unique_ptr<detail::PeerMemory> mem;  // [staging | signal] per rank; null for one rank
  int64_t staging_bytes = 0;                // the signal block's offset in a rank's buffer
  int max_blocks = kernels::UlyssesSignal::kMaxBlocks;  // the group's agreed grid cap (CUDA)
  bool closed = false;
};

using UlyssesInit = Init<UlyssesCommunicator, std::shared_ptr<comm::CommBackend>, int64_t, DType,
                         std::string, std::optional<Value>>;

namespace {

using kernels::UlyssesA2aParams;
using kernels::UlyssesSignal;

constexpr const char* kUlyssesModule = "flashinfer.comm.ulysses";
constexpr int64_t kUlyssesInt32Max = 2147483647;

constexpr api::KernelEntry<UlyssesA2aParams> kUlyssesKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: a barrier through the signal blocks, this rank's rows pushed into the peers' "
     "staging buffers, a second barrier, the staging buffer copied out",
     nullptr,
     [](const UlyssesA2aParams& p, const api::LaunchContext&) {
       kernels::cpu::ulysses_a2a(p, p.op);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernel (upstream's push design): per block a barrier with the same block of every "
     "peer, rows pushed with 16-byte stores into the peers' staging buffers, a second barrier; "
     "then the staging buffer copied out on the stream",
     nullptr,
     [](const UlyssesA2aParams& p, const api::LaunchContext& c) {
       kernels::cuda::ulysses_a2a(p, c.stream);
     }},
#endif
};

// Python's repr of a shape: "(2, 8, 4, 64)".
std::string shape_tuple(const Shape& s) {
  std::ostringstream o;
  o << '(';
  for (std::size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << (s.size() == 1 ? ",)" : ")");
  return o.str();
}

std::string py_dtype(DType d) { return std::string(dtype_torch_name(d)); }

// What one rank's config says is wrong ("" when nothing), upstream's per-rank messages.
std::string config_problems(int64_t max_elems, DType dtype) {
  std::string out;
  auto add = [&](const std::string& m) { out += (out.empty() ? "" : "; ") + m; };
  if (max_elems <= 0) {
    add("max_elems must be a positive int, got " + std::to_string(max_elems));
  } else if (max_elems > kUlyssesInt32Max) {
    add("max_elems must be at most 2147483647 (int32 kernel index range), got " +
        std::to_string(max_elems));
  }
  if (dtype != DType::kFloat16 && dtype != DType::kBFloat16 && dtype != DType::kFloat32) {
    add("dtype must be one of ('torch.float16', 'torch.bfloat16', 'torch.float32'), got " +
        py_dtype(dtype));
  }
  return out;
}

// "{0: 'a', 1: 'b'}" over the ranks whose entry is not empty.
std::string by_rank(const std::vector<std::string>& v) {
  std::string s = "{";
  bool first = true;
  for (std::size_t r = 0; r < v.size(); ++r) {
    if (v[r].empty()) continue;
    s += (first ? "" : ", ") + std::to_string(r) + ": '" + v[r] + "'";
    first = false;
  }
  return s + "}";
}

// The communicator's device: None is the group's; otherwise it must be the group's (the peer
// buffers live there). What is wrong goes to `problem`, checked jointly with the config: a
// rank's bad device fails every rank instead of leaving its peers in the allgather.
Device resolve_device(const std::optional<Value>& device, const comm::CommBackend& group,
                      const char* op, std::string& problem) {
  if (!device || device->is_none()) return group.device();
  try {
    const Device d = api::device_arg(device, op);
    if (d == group.device()) return d;
    problem = "device " + d.str() + " is not the group's device " + group.device().str() +
              " (the ranks' buffers are allocated there)";
  } catch (const Error& e) {
    problem = "invalid device " + device->repr() + ": " + e.detail();
  }
  return group.device();
}

// Upstream's backend decision for this build: the fused push design takes 2, 4, 6 or 8 ranks.
// Its NVML topology probe (one host, distinct GPUs, all-pairs NVLink) is not made: both
// backends move the data through the same peer buffers here.
void decide_backend(UlyssesCommunicator::Impl& w, const std::string& requested, const char* op) {
  const int64_t W = w.world_size;
  const bool fused = W == 2 || W == 4 || W == 6 || W == 8;
  const std::string reason =
      "world size " + std::to_string(W) + " not in fused-kernel supported sizes (2, 4, 6, 8)";
  if (requested == "nccl") {
    w.backend = "nccl";
    return;
  }
  if (requested == "nvlink") {
    FLASHINFER_CHECK_CODE(fused, ErrorCode::kUnsupported, op, "backend",
                          "backend='nvlink' requested but ", reason);
    w.backend = "nvlink";
    return;
  }
  w.backend = fused ? "nvlink" : "nccl";
  if (!fused) w.fallback_reason = reason;
}

// The checks upstream's scatter_heads / gather_heads make, in its order.
void check_operand(const UlyssesCommunicator::Impl& w, const Tensor& x, const char* name,
                   const char* op) {
  FLASHINFER_CHECK(!w.closed, op, "self", name, " called on a closed UlyssesCommunicator ",
                   "(use-after-close)");
  api::check_defined(x, op, "x");
  FLASHINFER_CHECK(x.dim() == 4, op, "x", name, " expects a 4-D [B, S, H, D] tensor, got ", x.dim(),
                   "-D shape ", shape_tuple(x.shape()));
  FLASHINFER_CHECK(x.device() == w.device, op, "x", name, " tensor is on ", x.device().str(),
                   ", but this communicator is bound to ", w.device.str());
  FLASHINFER_CHECK(x.dtype() == w.dtype, op, "x", name, " tensor dtype ", py_dtype(x.dtype()),
                   " does not match the communicator dtype ", py_dtype(w.dtype));
  FLASHINFER_CHECK(x.is_contiguous(), op, "x", name, " tensor must be contiguous");
  const Shape& s = x.shape();
  FLASHINFER_CHECK(std::all_of(s.begin(), s.end(), [](int64_t v) { return v > 0; }), op, "x", name,
                   " tensor dims must all be positive, got shape ", shape_tuple(s));
  FLASHINFER_CHECK(x.numel() <= w.max_elems, op, "x", name, " tensor has ", x.numel(),
                   " elements, exceeding the communicator capacity max_elems=", w.max_elems,
                   " (which is capped at the int32 index range 2147483647)");
}

// Both APIs' last step: the operands into `p` (its geometry and every rank's buffers already
// set), then the kernel table.
void launch_ulysses_exchange(UlyssesA2aParams& p, const Tensor& inp, const Tensor& out,
                             const char* op, const char* arg) {
  p.elem_bytes = static_cast<int>(dtype_size(inp.dtype()));
  p.inp = inp.data_ptr();
  p.out = out.data_ptr();
  p.op = op;
  const Device dev = inp.device();
  if (dev.is_cuda()) p.abort = detail::thread_group_abort_word();
  // Ranks that are threads sharing a context enqueue their kernels together (the reason:
  // core/comm_abort.h); the ranks' inputs' alignments may pick different instances, all loaded
  // first. Only the waiting kernel is inside the gate, as its contract says: the CUDA copy-out
  // follows it on the same stream, enqueued after the second barrier.
  detail::gated_collective_launch(
      nullptr, p.world_size, dev,
      [] {
#if FLASHINFER_WITH_CUDA
        kernels::cuda::preload_ulysses_a2a();
#endif
      },
      [&] { api::launch(kUlyssesKernels, p, dev, op, arg); });
  if (dev.is_cuda()) {
    detail::cuda_memcpy_device_async(p.out, p.peer_out[p.rank],
                                     static_cast<std::size_t>(p.numel() * p.elem_bytes), dev.index);
  }
}

Tensor exchange(UlyssesCommunicator::Impl& w, const Tensor& x, int mode, const char* op) {
  const int64_t W = w.world_size;
  UlyssesA2aParams p;
  p.world_size = static_cast<int>(W);
  p.rank = static_cast<int>(w.rank);
  p.mode = mode;
  p.B = x.size(0);
  p.D = x.size(3);
  Tensor out;
  if (mode == 0) {
    p.S_local = x.size(1);
    p.H = x.size(2);
    out = Tensor::empty({p.B, p.S_local * W, p.H / W, p.D}, x.dtype(), x.device());
  } else {
    p.S_local = x.size(1) / W;
    p.H = x.size(2) * W;
    out = Tensor::empty({p.B, p.S_local, p.H, p.D}, x.dtype(), x.device());
  }
  for (int64_t r = 0; r < W; ++r) {
    auto* base = static_cast<char*>(w.mem->peer(r));
    p.peer_out[r] = base;
    p.peer_signal[r] = base + w.staging_bytes;
  }
  p.max_blocks = w.max_blocks;
  launch_ulysses_exchange(p, x, out, op, "x");
  return out;
}

}  // namespace

UlyssesCommunicator::UlyssesCommunicator(std::shared_ptr<comm::CommBackend> group,
                                         int64_t max_elems, DType dtype, std::string backend,
                                         std::optional<Value> device) {
  call_init<UlyssesInit>(
      [&] {
        const char* op = "UlyssesCommunicator.__init__";
        FLASHINFER_CHECK(group != nullptr, op, "group",
                         "a CommBackend is required (upstream's None means torch.distributed's "
                         "WORLD group, which C++ does not have)");
        auto impl = std::make_shared<Impl>();
        impl->world_size = group->Get_size();
        impl->rank = group->Get_rank();
        impl->comm = group;
        const int64_t W = impl->world_size;
        // One signal block has 8 ranks' slots (upstream's, whose fused kernel takes at most 8;
        // its NCCL path, which takes more, is not here). W is the same on every rank: all raise
        // here, before any collective.
        FLASHINFER_CHECK_CODE(W <= UlyssesSignal::kMaxRanks, ErrorCode::kUnsupported, op, "group",
                              "world size ", W,
                              ": flashinfer-cpp's Ulysses exchange takes at most 8 ranks "
                              "(upstream's NCCL path, which takes more, is not here)");
        // The config is checked jointly, as upstream does: every rank learns every rank's
        // problems, and all raise alike.
        std::string mine = config_problems(max_elems, dtype), device_problem;
        const Device dev = resolve_device(device, *group, op, device_problem);
        if (!device_problem.empty()) mine += (mine.empty() ? "" : "; ") + device_problem;
        auto one_line = [](std::string t) {  // the gathered record is one field a line
          std::replace(t.begin(), t.end(), '\n', ' ');
          return t;
        };
        std::ostringstream cfg;
        cfg << (mine.empty() ? "ok" : "bad") << '\n'
            << one_line(mine) << '\n'
            << max_elems << '\n'
            << py_dtype(dtype) << '\n'
            << one_line(backend);
        const std::vector<std::string> all =
            W > 1 ? group->allgather(cfg.str()) : std::vector<std::string>{cfg.str()};
        std::vector<std::string> problems, configs, backends;
        for (const std::string& s : all) {
          std::istringstream in(s);
          std::string ok, prob, n, dt, be;
          std::getline(in, ok);
          std::getline(in, prob);
          std::getline(in, n);
          std::getline(in, dt);
          std::getline(in, be);
          problems.push_back(ok == "ok" ? std::string() : prob);
          configs.push_back("(" + n + ", " + dt + ")");
          backends.push_back(be);
        }
        FLASHINFER_CHECK(std::all_of(problems.begin(), problems.end(),
                                     [](const std::string& s) { return s.empty(); }),
                         op, "config",
                         "invalid UlyssesCommunicator config by rank: ", by_rank(problems));
        if (std::adjacent_find(configs.begin(), configs.end(), std::not_equal_to<>()) !=
            configs.end()) {
          std::string list;
          for (const auto& c : configs) list += (list.empty() ? "" : ", ") + c;
          FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, "max_elems",
                          "inconsistent UlyssesCommunicator configs across ranks: (max_elems, "
                          "dtype) = [",
                          list, "]; all ranks must agree");
        }
        std::vector<std::string> bad_backends(backends.size());
        for (std::size_t r = 0; r < backends.size(); ++r) {
          const std::string& b = backends[r];
          if (b != "auto" && b != "nvlink" && b != "nccl") bad_backends[r] = b;
        }
        FLASHINFER_CHECK(std::all_of(bad_backends.begin(), bad_backends.end(),
                                     [](const std::string& s) { return s.empty(); }),
                         op, "backend",
                         "backend must be one of ('auto', 'nvlink', 'nccl'); invalid request(s) "
                         "by rank: ",
                         by_rank(bad_backends));
        if (std::adjacent_find(backends.begin(), backends.end(), std::not_equal_to<>()) !=
            backends.end()) {
          std::string list;
          for (const auto& b : backends) list += (list.empty() ? "'" : ", '") + b + "'";
          FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, "backend",
                          "inconsistent backend requests across ranks: [", list,
                          "]; all ranks must pass the same backend");
        }
        impl->max_elems = max_elems;
        impl->dtype = dtype;
        impl->device = dev;
        decide_backend(*impl, backend, op);
        if (W > 1) {
          // Each rank's buffer: its staging area (max_elems elements, 256-byte aligned), then
          // its signal block. Zero-filled by PeerMemory, whose closing barrier orders every
          // rank's zeroing before any peer's first signal.
          impl->staging_bytes =
              (max_elems * static_cast<int64_t>(dtype_size(dtype)) + 255) / 256 * 256;
          impl->mem = std::make_unique<detail::PeerMemory>(
              *group, static_cast<std::size_t>(impl->staging_bytes + UlyssesSignal::kBytes), op);
          if (dev.is_cuda()) {
            impl->max_blocks = detail::agreed_grid_cap(*group, UlyssesSignal::kMaxBlocks);
          }
        }
        impl_ = std::move(impl);
      },
      *this, group, max_elems, dtype, backend, device);
}

UlyssesCommunicator::~UlyssesCommunicator() = default;

Tensor UlyssesCommunicator::scatter_heads(const Tensor& x) {
  return call_op<&UlyssesCommunicator::scatter_heads>(
      [&] {
        const char* op = "UlyssesCommunicator.scatter_heads";
        Impl& w = *impl_;
        check_operand(w, x, "scatter_heads", op);
        FLASHINFER_CHECK(x.size(2) % w.world_size == 0, op, "x",
                         "scatter_heads requires the global head count (dim 2) to be divisible "
                         "by world size ",
                         w.world_size, ", got shape ", shape_tuple(x.shape()));
        if (w.world_size == 1) return x;
        return exchange(w, x, 0, op);
      },
      *this, x);
}

Tensor UlyssesCommunicator::gather_heads(const Tensor& x) {
  return call_op<&UlyssesCommunicator::gather_heads>(
      [&] {
        const char* op = "UlyssesCommunicator.gather_heads";
        Impl& w = *impl_;
        check_operand(w, x, "gather_heads", op);
        FLASHINFER_CHECK(x.size(1) % w.world_size == 0, op, "x",
                         "gather_heads requires the global sequence length (dim 1) to be "
                         "divisible by world size ",
                         w.world_size, ", got shape ", shape_tuple(x.shape()));
        if (w.world_size == 1) return x;
        return exchange(w, x, 1, op);
      },
      *this, x);
}

void UlyssesCommunicator::close() {
  Impl& w = *impl_;
  if (w.closed) return;
  if (w.mem) {
    // This rank's calls come on one stream: waiting for it (not the whole device, where another
    // group's kernel may spin on a rank that waits here) ends this rank's pushes; the barrier
    // then ends every peer's.
    if (w.device.is_cuda()) {
      detail::cuda_stream_synchronize(current_cuda_stream(), w.device.index);
    }
    w.comm->barrier();  // a peer may still be pushing into this rank's buffer
    // The free runs here, on this rank's thread, after the barrier: no kernel of the group is in
    // flight (every rank waited for its stream) and, with ranks as threads, none is enqueued until
    // this rank reaches the next launch gate (core/comm_abort.h), so cudaFree's wait for the
    // device ends. On a detached thread (as before) the W frees ran outside every barrier and
    // could land inside a later gated launch of this or the next group, where cudaFree waits for
    // a rank's already spinning kernel while the driver lock it holds keeps a peer's launch from
    // being enqueued: the likely cause of UlyssesCuda.MatchesCpuOnOneGpu's 100 s hang (the raw
    // entry points, which free nothing between calls, passed).
    w.mem.reset();
  }
  w.closed = true;
}

const std::string& UlyssesCommunicator::backend() const { return impl_->backend; }
const std::optional<std::string>& UlyssesCommunicator::fallback_reason() const {
  return impl_->fallback_reason;
}
int64_t UlyssesCommunicator::world_size() const { return impl_->world_size; }
int64_t UlyssesCommunicator::rank() const { return impl_->rank; }
int64_t UlyssesCommunicator::max_elems() const { return impl_->max_elems; }
DType UlyssesCommunicator::dtype() const { return impl_->dtype; }
Device UlyssesCommunicator::device() const { return impl_->device; }

// ---- The raw entry points: init_ulysses_a2a, ulysses_a2a, dispose_ulysses_a2a ----

namespace {

// What init_ulysses_a2a makes: upstream's UlyssesA2A (the rank, the size and every rank's
// addresses) and where this rank's buffers are, which decides the kernels that may use them.
struct UlyssesA2aHandle {
  int rank = 0, world_size = 0;
  void* out[UlyssesSignal::kMaxRanks] = {};
  void* signal[UlyssesSignal::kMaxRanks] = {};
  Device device = Device::cpu();
  int max_blocks = UlyssesSignal::kMaxBlocks;  // CUDA: SMs / the handle's ranks on this GPU
};

// The live handles by the value init_ulysses_a2a returned: a disposed or made-up handle is
// refused by name instead of being dereferenced, and a call holds its handle while a concurrent
// dispose forgets it. Upstream's handle is the object's address, which a later init may get
// again; these values are never reused in a process, so a stale handle is always refused.
struct RawUlyssesHandles {
  std::mutex m;
  std::map<int64_t, std::shared_ptr<UlyssesA2aHandle>> live;
  int64_t next = 0;  // the next handle (drawn at the first init)
};

// Whether [p, p + n) is mapped in this process (mincore fails with ENOMEM on an unmapped page).
bool raw_host_mapped(const void* p, std::size_t n) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
  std::vector<unsigned char> v((end - a + page - 1) / page);
  return ::mincore(reinterpret_cast<void*>(a), end - a, v.data()) == 0;
}
RawUlyssesHandles& raw_handles() {
  static auto* t = new RawUlyssesHandles;  // never destroyed: a handle may outlive main's statics
  return *t;
}

std::shared_ptr<UlyssesA2aHandle> raw_find(int64_t fa) {
  RawUlyssesHandles& t = raw_handles();
  const std::lock_guard<std::mutex> lock(t.m);
  auto it = t.live.find(fa);
  return it == t.live.end() ? nullptr : it->second;
}

std::string raw_memory_name(int device) {
  return device < 0 ? std::string("host memory")
                    : "device memory (cuda:" + std::to_string(device) + ")";
}

// init_ulysses_a2a's checks (upstream's Python ones, then its C++ ones, in order), the kind of
// memory every address names, this rank's signal block zeroed; returns the registered handle.
int64_t raw_init(const std::vector<int64_t>& out_ptrs, const std::vector<int64_t>& signal_ptrs,
                 int64_t rank, int64_t W, bool full_nvlink, const char* op) {
  FLASHINFER_CHECK(W == 2 || W == 4 || W == 6 || W == 8, op, "world_size",
                   "ulysses a2a only supports world size in (2, 4, 6, 8), got ", W);
  FLASHINFER_CHECK(full_nvlink, op, "full_nvlink",
                   "full_nvlink=False is not supported: the fused kernel pushes over all-pairs "
                   "NVLink P2P and has no non-P2P path. Use UlyssesCommunicator(backend='auto') "
                   "for topology-aware NCCL fallback instead.");
  FLASHINFER_CHECK(rank >= 0 && rank < W, op, "rank", "invalid rank passed in (rank ", rank,
                   ", world_size ", W, ")");
  FLASHINFER_CHECK(static_cast<int64_t>(out_ptrs.size()) == W, op, "out_ipc_ptrs",
                   "out_ipc_ptrs size must equal world_size (", out_ptrs.size(), " != ", W, ")");
  FLASHINFER_CHECK(static_cast<int64_t>(signal_ptrs.size()) == W, op, "signal_ipc_ptrs",
                   "signal_ipc_ptrs size must equal world_size (", signal_ptrs.size(), " != ", W,
                   ")");
  auto h = std::make_shared<UlyssesA2aHandle>();
  h->rank = static_cast<int>(rank);
  h->world_size = static_cast<int>(W);
  for (const auto& [ptrs, name] :
       {std::pair<const std::vector<int64_t>*, const char*>{&out_ptrs, "out_ipc_ptrs"},
        {&signal_ptrs, "signal_ipc_ptrs"}}) {
    for (int64_t i = 0; i < W; ++i) {
      FLASHINFER_CHECK((*ptrs)[static_cast<std::size_t>(i)] != 0, op, name, name, "[", i,
                       "] is 0 (no buffer)");
    }
  }
  // Every address in the memory this rank's staging buffer is in: a host address handed to the
  // CUDA kernel (or a device one to the CPU reference) would fault, not raise. Device memory of
  // another GPU of this process is reached by peer access, enabled here (refused by name where
  // the GPUs cannot).
  const int own = detail::cuda_pointer_device(reinterpret_cast<void*>(out_ptrs[rank]));
  // Returns how many of the buffers are on this rank's GPU.
  auto take = [&](const std::vector<int64_t>& ptrs, const char* name, void** into) {
    int on_own = 0;
    for (int64_t i = 0; i < W; ++i) {
      const int64_t a = ptrs[static_cast<std::size_t>(i)];
      void* p = reinterpret_cast<void*>(a);
      const int dev = detail::cuda_pointer_device(p);
      FLASHINFER_CHECK((dev < 0) == (own < 0), op, name, name, "[", i, "] is ",
                       raw_memory_name(dev), ", but this rank's staging buffer out_ipc_ptrs[", rank,
                       "] is ", raw_memory_name(own),
                       ": every buffer of a handle must be in one kind of memory");
      if (dev >= 0 && dev != own) detail::cuda_enable_peer_access(own, dev);
      on_own += own >= 0 && dev == own ? 1 : 0;
      into[i] = p;
    }
    return on_own;
  };
  const int on_this_gpu = take(out_ptrs, "out_ipc_ptrs", h->out);
  (void)take(signal_ptrs, "signal_ipc_ptrs", h->signal);
  // The barrier's counters are 32-bit words, read and written atomically.
  for (int64_t i = 0; i < W; ++i) {
    FLASHINFER_CHECK(signal_ptrs[static_cast<std::size_t>(i)] % 4 == 0, op, "signal_ipc_ptrs",
                     "signal_ipc_ptrs[", i, "] is not 4-byte aligned");
  }
  void* mine = h->signal[rank];
  if (own < 0) {
    // The one write init makes: refused by name where the block is not mapped memory (a freed
    // or made-up address), which upstream's cudaMemset would also refuse.
    FLASHINFER_CHECK(raw_host_mapped(mine, static_cast<std::size_t>(UlyssesSignal::kBytes)), op,
                     "signal_ipc_ptrs", "signal_ipc_ptrs[", rank,
                     "] is not mapped memory of this process (", UlyssesSignal::kBytes,
                     " bytes from it)");
    std::memset(mine, 0, static_cast<std::size_t>(UlyssesSignal::kBytes));
  } else {
    const int sig_dev = detail::cuda_pointer_device(mine);
    FLASHINFER_CHECK(sig_dev == own, op, "signal_ipc_ptrs", "signal_ipc_ptrs[", rank, "] is ",
                     raw_memory_name(sig_dev), ", not on this rank's device cuda:", own);
    h->device = Device::cuda(own);
    // The grid every rank's blocks fit in at once: the SMs over the handle's ranks whose staging
    // buffers are on this GPU (ranks as threads of one process share it; ranks on GPUs of their
    // own get the whole GPU). The same on every rank where the GPUs are alike.
    h->max_blocks = std::clamp(detail::cuda_sm_count(own) / std::max(on_this_gpu, 1), 1,
                               static_cast<int>(UlyssesSignal::kMaxBlocks));
    // Upstream's cudaMemset and the wait its Python wrapper adds: the counters are zero before
    // init returns (the caller's group barrier then orders them before any peer's first
    // signal). The wait is for this stream, not upstream's whole device: another group's kernel
    // on the GPU may be spinning on a rank that is waiting here.
    detail::cuda_memset_async(mine, 0, static_cast<std::size_t>(UlyssesSignal::kBytes), own);
    detail::cuda_stream_synchronize(current_cuda_stream(), own);
  }
  RawUlyssesHandles& t = raw_handles();
  const std::lock_guard<std::mutex> lock(t.m);
  if (t.next == 0) {
    // From this process's nonce: recordings key a rank's calls by (pid, handle), and processes in
    // containers may share a pid; positive, nonzero, 16 apart.
    t.next =
        static_cast<int64_t>((detail::this_process().nonce >> 8) & 0x3fffffffffff0000ull) | 0x10000;
  }
  const int64_t fa = t.next;
  t.next += 16;
  t.live[fa] = std::move(h);
  return fa;
}

void raw_a2a(int64_t fa, const Tensor& inp, const Tensor& out, int64_t B, int64_t S_local,
             int64_t H, int64_t D, int64_t mode, const char* op) {
  // Upstream's Python checks, in order (its "must be a CUDA tensor" is the handle's memory here:
  // the CPU reference takes host buffers).
  FLASHINFER_CHECK(fa != 0, op, "fa",
                   "fa must be a nonzero handle returned by init_ulysses_a2a, got 0");
  for (const auto& [t, name] :
       {std::pair<const Tensor*, const char*>{&inp, "inp"}, {&out, "out"}}) {
    api::check_defined(*t, op, name);
    FLASHINFER_CHECK(t->is_contiguous(), op, name, name, " must be contiguous");
    FLASHINFER_CHECK(t->dim() == 4, op, name, name, " must be 4-D, got shape ",
                     shape_tuple(t->shape()));
  }
  FLASHINFER_CHECK(inp.device() == out.device(), op, "out", "inp is on ", inp.device().str(),
                   " but out is on ", out.device().str());
  FLASHINFER_CHECK(inp.dtype() == out.dtype(), op, "out", "inp dtype ", py_dtype(inp.dtype()),
                   " != out dtype ", py_dtype(out.dtype()));
  const DType dt = inp.dtype();
  FLASHINFER_CHECK(dt == DType::kFloat16 || dt == DType::kBFloat16 || dt == DType::kFloat32, op,
                   "inp", "dtype must be float16/bfloat16/float32, got ", py_dtype(dt));
  FLASHINFER_CHECK(mode == 0 || mode == 1, op, "mode", "mode must be 0 or 1, got ", mode);
  const Shape local_shape{B, S_local, H, D};
  const std::string local = shape_tuple(local_shape);
  FLASHINFER_CHECK(std::min({B, S_local, H, D}) > 0, op, "B",
                   "B/S_local/H/D must be positive, got ", local);
  const Tensor& checked = mode == 0 ? inp : out;
  const Tensor& other = mode == 0 ? out : inp;
  const char* checked_name = mode == 0 ? "inp" : "out";
  const char* other_name = mode == 0 ? "out" : "inp";
  FLASHINFER_CHECK(checked.shape() == local_shape, op, checked_name, checked_name, " shape ",
                   shape_tuple(checked.shape()), " does not match [B, S_local, H, D] = ", local,
                   " for mode ", mode);
  FLASHINFER_CHECK(other.size(0) == B && other.size(3) == D && other.numel() == checked.numel(), op,
                   other_name, other_name, " shape ", shape_tuple(other.shape()),
                   " is inconsistent with [B, S_local, H, D] = ", local,
                   " (batch/D dims and total size must match)");
  for (const auto& [t, name] :
       {std::pair<const Tensor*, const char*>{&inp, "inp"}, {&out, "out"}}) {
    FLASHINFER_CHECK(t->numel() <= kUlyssesInt32Max, op, name, name, " has ", t->numel(),
                     " elements, exceeding the int32 index range 2147483647 supported by the "
                     "ulysses_a2a kernel");
  }
  // Upstream dereferences the handle here; a handle that is not live is refused instead.
  const std::shared_ptr<UlyssesA2aHandle> h = raw_find(fa);
  FLASHINFER_CHECK(h != nullptr, op, "fa", "fa ", fa,
                   " is not a live handle of init_ulysses_a2a (disposed, or never returned by it)");
  FLASHINFER_CHECK(h->device.is_cuda() ? inp.device() == h->device : !inp.device().is_cuda(), op,
                   "inp", "inp is on ", inp.device().str(), ", but the handle's buffers are ",
                   raw_memory_name(h->device.is_cuda() ? h->device.index : -1));
  // Upstream's C++ checks (only the handle knows W).
  const int64_t W = h->world_size;
  FLASHINFER_CHECK(H % W == 0, op, "H", "global head count must be divisible by world size (H ", H,
                   ", world size ", W, ")");
  const Shape global{B, W * S_local, H / W, D};
  FLASHINFER_CHECK(other.shape() == global, op, other_name,
                   "the [B, S_global, H_local, D] operand of mode ", mode, " has shape ",
                   shape_tuple(other.shape()), ", expected ", shape_tuple(global));
  UlyssesA2aParams p;
  p.world_size = h->world_size;
  p.rank = h->rank;
  p.mode = static_cast<int>(mode);
  p.B = B;
  p.S_local = S_local;
  p.H = H;
  p.D = D;
  p.max_blocks = h->max_blocks;
  for (int r = 0; r < h->world_size; ++r) {
    p.peer_out[r] = h->out[r];
    p.peer_signal[r] = h->signal[r];
  }
  launch_ulysses_exchange(p, inp, out, op, "inp");
}

// Replay's buffers for one rank of a raw stream: a group's peer memory laid out as the
// communicator's ([staging | signal] a rank), and the handle over it that make_workspace hands
// the call (none for a replayed init, whose own result is the handle). Going, it disposes every
// live handle over its memory first.
class UlyssesA2aReplayBuffers : public ApiObject {
 public:
  UlyssesA2aReplayBuffers(comm::CommBackend& group, int64_t staging_bytes, bool with_handle)
      : staging_((std::max<int64_t>(staging_bytes, 16) + 255) / 256 * 256),
        mem_(group, static_cast<std::size_t>(staging_ + UlyssesSignal::kBytes),
             "ulysses_a2a (replay)") {
    if (with_handle) {
      handle_ = raw_init(out_ptrs(), signal_ptrs(), mem_.rank(), mem_.world_size(), true,
                         "ulysses_a2a (replay)");
      // Upstream's rule after init: a group barrier, so no rank signals a peer whose init is
      // still zeroing its signal block. A failed barrier leaves no handle over freed memory.
      try {
        group.barrier();
      } catch (...) {
        forget_handles();
        throw;
      }
    }
  }
  ~UlyssesA2aReplayBuffers() override { forget_handles(); }
  // Disposes every live handle over this memory (the replayed init's, or this one's).
  void forget_handles() noexcept {
    RawUlyssesHandles& t = raw_handles();
    const std::lock_guard<std::mutex> lock(t.m);
    for (auto it = t.live.begin(); it != t.live.end();) {
      it = it->second->out[it->second->rank] == mem_.local() ? t.live.erase(it) : std::next(it);
    }
  }
  std::vector<int64_t> out_ptrs() const {
    std::vector<int64_t> v;
    for (void* p : mem_.peers()) v.push_back(static_cast<int64_t>(reinterpret_cast<intptr_t>(p)));
    return v;
  }
  std::vector<int64_t> signal_ptrs() const {
    std::vector<int64_t> v = out_ptrs();
    for (int64_t& a : v) a += staging_;
    return v;
  }
  int64_t handle() const { return handle_; }
  std::string_view class_name() const override { return "UlyssesA2aReplayBuffers"; }
  std::string_view module_name() const override { return "flashinfer.comm.ulysses"; }

 private:
  int64_t staging_;
  detail::PeerMemory mem_;
  int64_t handle_ = 0;
};

}  // namespace

int64_t init_ulysses_a2a(const std::vector<int64_t>& out_ipc_ptrs,
                         const std::vector<int64_t>& signal_ipc_ptrs, int64_t rank,
                         int64_t world_size, bool full_nvlink) {
  return call_op<&init_ulysses_a2a>(
      [&] {
        return raw_init(out_ipc_ptrs, signal_ipc_ptrs, rank, world_size, full_nvlink,
                        "init_ulysses_a2a");
      },
      out_ipc_ptrs, signal_ipc_ptrs, rank, world_size, full_nvlink);
}

void dispose_ulysses_a2a(int64_t fa) {
  call_op<&dispose_ulysses_a2a>(
      [&] {
        if (fa == 0) return;  // upstream deletes a null pointer: nothing
        RawUlyssesHandles& t = raw_handles();
        const std::lock_guard<std::mutex> lock(t.m);
        FLASHINFER_CHECK(t.live.erase(fa) == 1, "dispose_ulysses_a2a", "fa", "fa ", fa,
                         " is not a live handle of init_ulysses_a2a (disposed already, or never "
                         "returned by it)");
      },
      fa);
}

void ulysses_a2a(int64_t fa, const Tensor& inp, const Tensor& out, int64_t B, int64_t S_local,
                 int64_t H, int64_t D, int64_t mode) {
  call_op<&ulysses_a2a>([&] { raw_a2a(fa, inp, out, B, S_local, H, D, mode, "ulysses_a2a"); }, fa,
                        inp, out, B, S_local, H, D, mode);
}

namespace detail {

void register_ulysses_ops(OpRegistry& r) {
  declare_init<UlyssesInit>(
      r,
      {.name = "UlyssesCommunicator.__init__",
       .module = kUlyssesModule,
       .summary = "Collective: a rank's Ulysses all-to-all communicator (peer staging buffers)"},
      arg("group"), arg("max_elems").kw(), arg("dtype").kw(),
      arg("backend", std::string("auto")).kw(), arg("device").kw());
  declare<&UlyssesCommunicator::scatter_heads>(
      r,
      {.name = "UlyssesCommunicator.scatter_heads",
       .module = kUlyssesModule,
       .summary = "Collective: [B, S_local, H, D] -> [B, S_global, H_local, D] over the ranks"},
      "x");
  declare<&UlyssesCommunicator::gather_heads>(
      r,
      {.name = "UlyssesCommunicator.gather_heads",
       .module = kUlyssesModule,
       .summary = "Collective: [B, S_global, H_local, D] -> [B, S_local, H, D] over the ranks"},
      "x");
  static constexpr api::BackendSummary kUlyssesBuffers[] = {
    {DeviceType::kCPU, "host staging buffers every rank of the process addresses"},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "device staging buffers shared by CUDA IPC handles or peer access"},
#endif
  };
  api::register_backends("UlyssesCommunicator.__init__", kUlyssesBuffers);
  api::register_backends("UlyssesCommunicator.scatter_heads", kUlyssesKernels);
  api::register_backends("UlyssesCommunicator.gather_heads", kUlyssesKernels);
  // Replay runs every rank's recorded call together, each rank with a communicator made for
  // the call (its recorded construction's max_elems, dtype and backend where the recording has
  // it).
  CollectiveSpec spec;
  spec.op = "UlyssesCommunicator.scatter_heads";
  spec.also = {"UlyssesCommunicator.gather_heads"};
  spec.workspace_param = 0;  // self
  spec.creator = "UlyssesCommunicator.__init__";
  spec.creator_comm_param = 1;  // group (self is 0)
  spec.prepare_creator = [](std::vector<Value>& a, const std::shared_ptr<comm::CommBackend>& c) {
    a.at(1) = to_value(c);
    a.at(5) = Value();  // the recording's device: the replay's group says where
  };
  // The recorded dtype, backend and capacity where the construction was recorded (a dtype or
  // capacity refusal the recording saw happens again), the capacity cut to the call's size when
  // the call fits (W staging areas on one replay device, not the engine's maximum).
  spec.make_workspace = [](const std::shared_ptr<comm::CommBackend>& c,
                           const std::vector<Value>& args, const std::vector<Value>* made) {
    const Tensor& x = args.at(1).as_tensor();
    int64_t max_elems = std::max<int64_t>(1, x.numel());
    DType dt = x.dtype();
    std::string backend = "auto";
    if (made && made->size() > 4) {
      if (made->at(2).kind() == Value::Kind::kInt) {
        max_elems = std::min(max_elems, made->at(2).as_int());
      }
      if (made->at(3).kind() == Value::Kind::kDType) dt = made->at(3).as_dtype();
      if (made->at(4).kind() == Value::Kind::kString) backend = made->at(4).as_string();
    }
    return to_value(std::make_shared<UlyssesCommunicator>(c, max_elems, dt, backend));
  };
  register_collective(std::move(spec));

  declare<&init_ulysses_a2a>(
      r,
      {.name = "init_ulysses_a2a",
       .module = kUlyssesModule,
       .summary = "A handle over every rank's staging and signal buffers (raw Ulysses API)"},
      "out_ipc_ptrs", "signal_ipc_ptrs", "rank", "world_size", "full_nvlink");
  declare<&dispose_ulysses_a2a>(
      r,
      {.name = "dispose_ulysses_a2a",
       .module = kUlyssesModule,
       .summary = "Forgets a handle of init_ulysses_a2a (frees no buffer)"},
      "fa");
  declare<&ulysses_a2a>(r,
                        {.name = "ulysses_a2a",
                         .module = kUlyssesModule,
                         .summary = "Collective: the Ulysses all-to-all through a raw handle's "
                                    "buffers into out (mode 0 scatter, 1 gather)"},
                        "fa", "inp", arg("out").mut(), "B", "S_local", "H", "D", "mode");
  static constexpr api::BackendSummary kUlyssesRawHandle[] = {
    {DeviceType::kCPU, "host buffers every rank of the process addresses"},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "device buffers (CUDA IPC or peer access); this rank's signal zeroed"},
#endif
  };
  api::register_backends("init_ulysses_a2a", kUlyssesRawHandle);
  api::register_backends("dispose_ulysses_a2a", kUlyssesRawHandle);
  api::register_backends("ulysses_a2a", kUlyssesKernels);
  // Replay: a raw stream is a rank's calls on one handle, placed by its init's rank and
  // world_size. The recorded addresses mean nothing here, so every rank of the replay gets
  // fresh peer buffers: a replayed init gets their addresses in place of the recorded ones, a
  // call or dispose a handle made over buffers that fit its out (the recorded fa swapped for
  // it). The buffers and their handles go when every rank's call returned.
  CollectiveSpec raw;
  raw.op = "ulysses_a2a";
  raw.also = {"dispose_ulysses_a2a"};
  raw.workspace_param = 0;  // fa
  raw.creator = "init_ulysses_a2a";
  raw.creator_rank_param = 2;
  raw.creator_world_param = 3;
  raw.creator_workspace = [](std::vector<Value>& a, const std::shared_ptr<comm::CommBackend>& c) {
    auto buffers = std::make_shared<UlyssesA2aReplayBuffers>(*c, 0, false);
    a.at(0) = to_value(buffers->out_ptrs());
    a.at(1) = to_value(buffers->signal_ptrs());
    return to_value(buffers);
  };
  raw.make_workspace = [](const std::shared_ptr<comm::CommBackend>& c,
                          const std::vector<Value>& args, const std::vector<Value>*) {
    const int64_t bytes =
        args.size() > 2 && args[2].is_tensor() ? args[2].as_tensor().nbytes() : int64_t{0};
    return to_value(std::make_shared<UlyssesA2aReplayBuffers>(*c, bytes, true));
  };
  // A null handle involves no peer: dispose_ulysses_a2a(0) does nothing, ulysses_a2a(0, ...) is
  // refused before any exchange.
  raw.runs_alone = [](std::string_view, const std::vector<Value>& a) {
    return !a.empty() && a[0].kind() == Value::Kind::kInt && a[0].as_int() == 0;
  };
  raw.adjust_args = [](std::string_view, std::vector<Value>& a,
                       const std::shared_ptr<comm::CommBackend>&) {
    if (a.at(0).kind() != Value::Kind::kObject) return;
    const auto* b = dynamic_cast<const UlyssesA2aReplayBuffers*>(a.at(0).as_object().get());
    if (b) a.at(0) = Value(b->handle());
  };
  register_collective(std::move(raw));
}

}  // namespace detail

}  // namespace flashinfer
