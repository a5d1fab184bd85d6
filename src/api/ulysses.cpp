// flashinfer.comm.ulysses: UlyssesCommunicator (scatter_heads, gather_heads). Upstream's checks
// and messages in its order, the peer buffers (core/peer_memory.h) and the exchange: on the CPU
// the reference pushes each rank's rows into its peers' staging buffers between two barriers; on
// CUDA one kernel does it with upstream's signal protocol (docs/COMM.md, "Ulysses all-to-all").
#include "flashinfer/ops/ulysses.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
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
#include "core/peer_memory.h"
#include "flashinfer/op_typed.h"
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
       kernels::cpu::ulysses_a2a(p, p.mode == 0 ? "UlyssesCommunicator.scatter_heads"
                                                : "UlyssesCommunicator.gather_heads");
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
  p.elem_bytes = static_cast<int>(dtype_size(x.dtype()));
  p.inp = x.data_ptr();
  p.out = out.data_ptr();
  for (int64_t r = 0; r < W; ++r) {
    auto* base = static_cast<char*>(w.mem->peer(r));
    p.peer_out[r] = base;
    p.peer_signal[r] = base + w.staging_bytes;
  }
  if (x.device().is_cuda()) p.abort = detail::thread_group_abort_word();
  api::launch(kUlyssesKernels, p, x.device(), op, "x");
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
    if (w.device.is_cuda()) detail::cuda_device_synchronize(w.device.index);
    w.comm->barrier();  // a peer may still be pushing into this rank's buffer
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
}

}  // namespace detail

}  // namespace flashinfer
