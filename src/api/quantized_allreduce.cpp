// flashinfer.comm.quantized_allreduce: quantized_all_reduce. Upstream's checks, messages and
// defaults; the peer buffers (core/peer_memory.h) kept per group as upstream keeps its symmetric
// memory; the dispatch: on the CPU the ranks exchange their bf16 inputs through the buffers
// between two barriers and each computes its output from all of them (the reference,
// kernels/cpu/quantized_allreduce_cpu.cpp); on CUDA one kernel does upstream's three phases
// (kernels/cuda/quantized_allreduce_cuda.cu). docs/COMM.md, "Quantized all-reduce".
#include "flashinfer/ops/quantized_allreduce.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "core/comm_abort.h"
#include "core/comm_lifetime.h"
#include "core/cuda_runtime.h"
#include "core/device_location.h"
#include "core/peer_memory.h"
#include "flashinfer/bench.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/quantized_allreduce_cpu.h"
#include "kernels/quantized_allreduce_params.h"
#include "replay/collective_replay.h"

#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/quantized_allreduce_cuda.h"
#endif

namespace flashinfer {
namespace {

using kernels::QarBufferLayout;
using kernels::QuantizedAllReduceParams;

constexpr const char* kQarModule = "flashinfer.comm.quantized_allreduce";
constexpr const char* kQarOp = "quantized_all_reduce";

constexpr api::KernelEntry<QuantizedAllReduceParams> kQarKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: the bf16 inputs exchanged through shared buffers between two barriers; "
     "each rank quantizes every rank's groups, sums its own stripes and requantizes the others "
     "as their owners do",
     nullptr,
     [](const QuantizedAllReduceParams& p, const api::LaunchContext&) {
       std::vector<const uint16_t*> in;
       for (int r = 0; r < p.world_size; ++r) {
         in.push_back(reinterpret_cast<const uint16_t*>(static_cast<const char*>(p.peer_buf[r]) +
                                                        QarBufferLayout::kSlotOffset));
       }
       kernels::cpu::quantized_all_reduce(in, p.numel, p.rank, p.scale_group, p.block_size,
                                          p.output);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernel: upstream's two-shot design (FP8 and group scales into this rank's buffer, the "
     "own stripe reduced from every peer's and requantized, the others read from their owners; "
     "per-block flags at system scope between the phases)",
     nullptr,
     [](const QuantizedAllReduceParams& p, const api::LaunchContext& c) {
       kernels::cuda::quantized_all_reduce(p, c.stream);
     }},
#endif
};

// upstream's _select_params: by numel only.
struct QarDefaults {
  int64_t block_size, max_num_blocks;
  bool p2p_phase3;
};
QarDefaults qar_defaults(int64_t n) {
  const int64_t blocks = n <= 32768 ? 24 : (n <= 524288 ? 48 : 132);
  return {n <= 33554432 ? 4096 : 16384, blocks, n >= 16 * 1024 * 1024};
}

bool qar_power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// The peer buffers, one per (group, rank, device), kept between calls like upstream's symmetric
// buffer (one per scale group, device and group name, made anew when a larger call comes). They
// live as long as the group: a ThreadGroup's state, or the caller's backend object.
struct QarKey {
  const void* group;
  int64_t rank;
  int device_type, device_index;
  auto operator<=>(const QarKey&) const = default;
};
struct QarEntry {
  std::shared_ptr<detail::PeerMemory> mem;
  // Outgrown buffers, kept until the group is gone: freeing CUDA memory waits for the whole
  // device, where another group's kernel may be waiting for this very thread.
  std::vector<std::shared_ptr<detail::PeerMemory>> retired;
  int64_t world = 0;
  int grid_cap = 0;  // the group's agreed grid limit (CUDA)
  std::weak_ptr<const void> lifetime;
};
struct QarCache {
  std::mutex m;
  std::map<QarKey, QarEntry> entries;
};
QarCache& qar_cache() {
  static auto* c = new QarCache;  // never destroyed: device memory outlives no CUDA context
  return *c;
}

struct QarBuffer {
  std::shared_ptr<detail::PeerMemory> mem;
  int grid_cap = 0;
};

QarBuffer qar_buffer(const std::shared_ptr<comm::CommBackend>& group, int64_t bytes) {
  comm::CommBackend& c = *group;
  const Device dev = c.device();
  const QarKey key{c.group_id(), c.Get_rank(), static_cast<int>(dev.type), dev.index};
  const int64_t W = c.Get_size();
  QarCache& cache = qar_cache();
  QarBuffer found;
  std::vector<std::shared_ptr<detail::PeerMemory>> retired;
  {
    const std::lock_guard<std::mutex> lock(cache.m);
    auto it = cache.entries.find(key);
    if (it != cache.entries.end() && !it->second.lifetime.expired() && it->second.world == W) {
      if (it->second.mem->bytes() >= static_cast<std::size_t>(bytes)) {
        found = {it->second.mem, it->second.grid_cap};
      }
    }
  }
  // Hit or miss is the group's decision (a buffer is allocated by every rank together), made
  // with where each rank's device is (host and PCI bus), from which every rank computes the same
  // grid limit: every rank's blocks resident at once where ranks share a GPU.
  const std::string mine = std::string(found.mem ? "1" : "0") + " " + detail::grid_record(dev);
  const std::vector<std::string> all = c.allgather(mine);
  bool hit = true;
  std::vector<std::string> records;
  for (const std::string& v : all) {
    hit = hit && v.rfind("1 ", 0) == 0;
    records.push_back(v.substr(2));
  }
  const int cap = detail::group_grid_cap(records, QarBufferLayout::kMaxBlocks);
  if (hit) return found;
  // The buffers of groups that are gone are freed here, on this rank's thread, before this call's
  // launch gate (core/comm_abort.h): a CUDA free waits for the device, and every kernel in
  // flight is a fully launched call's, so it ends. (A free on a thread of its own, as before,
  // could land between two ranks' gated launches, waiting for the first one's spinning kernel
  // while the driver lock it holds kept the second from being enqueued: UlyssesCommunicator's
  // close had that hazard, session 64.) This group's outgrown one is kept with the group.
  std::vector<std::shared_ptr<detail::PeerMemory>> dead;
  {
    const std::lock_guard<std::mutex> lock(cache.m);
    for (auto it = cache.entries.begin(); it != cache.entries.end();) {
      if (it->second.lifetime.expired()) {
        dead.push_back(std::move(it->second.mem));
        for (auto& r : it->second.retired) dead.push_back(std::move(r));
        it = cache.entries.erase(it);
      } else {
        if (it->first == key) {
          retired = std::move(it->second.retired);
          retired.push_back(std::move(it->second.mem));
        }
        ++it;
      }
    }
  }
  found.mem.reset();
  dead.clear();
  QarEntry e;
  e.mem = std::make_shared<detail::PeerMemory>(c, static_cast<std::size_t>(bytes), kQarOp);
  e.retired = std::move(retired);
  e.world = W;
  e.grid_cap = dev.is_cuda() ? cap : 0;
  // A ThreadGroup's state; for another backend, the backend object the caller passes (one
  // made anew for every call gets buffers anew).
  e.lifetime = detail::group_lifetime(c);
  if (e.lifetime.expired()) e.lifetime = std::weak_ptr<const void>(group);
  {
    const std::lock_guard<std::mutex> lock(cache.m);
    cache.entries[key] = e;
  }
  return {e.mem, e.grid_cap};
}

Tensor qar_impl(const Tensor& inp, const std::shared_ptr<comm::CommBackend>& group,
                int64_t scale_group, std::optional<int64_t> block_size,
                std::optional<int64_t> num_warps, std::optional<int64_t> max_num_blocks,
                const std::optional<Tensor>& output) {
  const char* op = kQarOp;
  api::check_defined(inp, op, "inp");
  FLASHINFER_CHECK(inp.dtype() == DType::kBFloat16, op, "inp", "Expected bfloat16, got ",
                   dtype_torch_name(inp.dtype()));
  FLASHINFER_CHECK(inp.is_contiguous(), op, "inp", "Input tensor must be contiguous");
  const int64_t n = inp.numel();
  const bool has_out = output && output->defined();
  if (n == 0) return has_out ? *output : Tensor::empty(inp.shape(), inp.dtype(), inp.device());
  FLASHINFER_CHECK(group != nullptr, op, "group",
                   "a CommBackend is required (upstream's group is a torch ProcessGroup)");
  const int64_t W = group->Get_size();
  FLASHINFER_CHECK(n % 8 == 0, op, "inp", "numel must be divisible by 8, got ", n);
  const Device dev = inp.device();
  api::check_upstream_arch(op, "inp", dev);
  const QarDefaults d = qar_defaults(n);
  int64_t bs = block_size.value_or(d.block_size);
  const int64_t blocks = max_num_blocks.value_or(d.max_num_blocks);
  const int64_t warps = num_warps.value_or(16);
  FLASHINFER_CHECK(scale_group > 0, op, "scale_group", "scale_group must be positive, got ",
                   scale_group);
  const int64_t sg = std::min(scale_group, n);
  bs = std::max(std::min(bs, n), sg);
  FLASHINFER_CHECK(bs % sg == 0, op, "block_size", "block_size (", bs,
                   ") must be divisible by scale_group (", sg, ")");
  FLASHINFER_CHECK(bs % W == 0, op, "block_size", "block_size (", bs,
                   ") must be divisible by world_size (", W, ")");
  Tensor out;
  if (has_out) {
    out = *output;
    FLASHINFER_CHECK(out.shape() == inp.shape(), op, "output", "output shape ",
                     api::torch_size_string(out.shape()), " must match input shape ",
                     api::torch_size_string(inp.shape()));
    FLASHINFER_CHECK(out.dtype() == inp.dtype(), op, "output", "output dtype ",
                     dtype_torch_name(out.dtype()), " must match input dtype ",
                     dtype_torch_name(inp.dtype()));
    FLASHINFER_CHECK(out.is_contiguous(), op, "output", "Output tensor must be contiguous");
    api::check_same_device(out, inp, op, "output", "inp");
  } else {
    out = Tensor::empty(inp.shape(), inp.dtype(), dev);
  }
  // Past upstream's own checks: its Triton kernel takes tl.arange over scale_group and
  // block_size and launches num_warps warps (other values fail to compile there), and an empty
  // grid would leave the output unwritten.
  FLASHINFER_CHECK_CODE(qar_power_of_two(sg) && qar_power_of_two(bs), ErrorCode::kUnsupported, op,
                        "scale_group", "scale_group (", sg, ") and block_size (", bs,
                        ") must be powers of two (upstream's Triton kernel cannot compile "
                        "others)");
  FLASHINFER_CHECK(qar_power_of_two(warps) && warps <= 32, op, "num_warps",
                   "num_warps must be a power of two up to 32, got ", warps);
  FLASHINFER_CHECK(blocks > 0, op, "max_num_blocks", "max_num_blocks must be positive, got ",
                   blocks);
  FLASHINFER_CHECK_CODE(W <= QarBufferLayout::kMaxRanks, ErrorCode::kUnsupported, op, "group",
                        "at most ", QarBufferLayout::kMaxRanks, " ranks, got ", W);
  // Upstream allocates on inp's device; the buffers here are on the group's.
  FLASHINFER_CHECK(dev == group->device(), op, "inp", "inp is on ", dev.str(),
                   " but the group's buffers are on ", group->device().str(),
                   " (its CommBackend's device())");
  const QarBuffer buf = qar_buffer(group, QarBufferLayout::bytes(n, sg));
  const std::shared_ptr<detail::PeerMemory>& mem = buf.mem;
  QuantizedAllReduceParams p;
  p.world_size = static_cast<int>(W);
  p.rank = static_cast<int>(group->Get_rank());
  p.numel = n;
  p.scale_group = sg;
  p.block_size = bs;
  p.max_blocks = static_cast<int>(std::min<int64_t>(blocks, std::max(1, buf.grid_cap)));
  for (int64_t r = 0; r < W; ++r) p.peer_buf[r] = mem->peer(r);
  p.input = static_cast<const uint16_t*>(inp.data_ptr());
  p.output = static_cast<uint16_t*>(out.data_ptr());
  if (dev.is_cpu()) {
    std::memcpy(static_cast<char*>(mem->local()) + QarBufferLayout::kSlotOffset, inp.data_ptr(),
                static_cast<std::size_t>(n) * 2);
    group->barrier();
    api::launch(kQarKernels, p, dev, op, "inp");
    group->barrier();  // no rank overwrites its input while another still reads it
  } else {
    p.abort = detail::thread_group_abort_word();
    // Ranks that are threads sharing a context enqueue their kernels together (the reason:
    // core/comm_abort.h); the ranks' alignments may pick different instances, all loaded first.
    detail::gated_collective_launch(
        group.get(), W, dev,
        [] {
#if FLASHINFER_WITH_CUDA
          kernels::cuda::preload_quantized_all_reduce();
#endif
        },
        [&] { api::launch(kQarKernels, p, dev, op, "inp"); });
  }
  return out;
}

// `flashinfer bench` and the backend cases: one rank (a group of one, on the case's device), so
// the call runs alone; m x hidden_size bf16. Bytes: the input read, the output written.
BenchCase bench_quantized_all_reduce(const BenchShape& s, Device dev) {
  const comm::ThreadGroup group(1, dev);
  Tensor x = Tensor::empty({s.m, s.hidden_size}, DType::kBFloat16);
  x.uniform_(s.random_seed, -2.0, 2.0);
  BenchCase c = api::bench::invoke_case(kQarOp, {Value(x.to(dev)), to_value(group.backend(0))});
  c.description = std::to_string(s.m) + " x " + std::to_string(s.hidden_size) + " bf16, 1 rank";
  c.bytes = 2.0 * api::bench::nbytes(x.shape(), DType::kBFloat16);
  return c;
}

}  // namespace

Tensor quantized_all_reduce(const Tensor& inp, std::shared_ptr<comm::CommBackend> group,
                            int64_t scale_group, std::optional<int64_t> block_size,
                            std::optional<int64_t> num_warps, std::optional<int64_t> max_num_blocks,
                            std::optional<bool> p2p_phase3, std::optional<Tensor> output) {
  return call_op<&quantized_all_reduce>(
      [&] {
        return qar_impl(inp, group, scale_group, block_size, num_warps, max_num_blocks, output);
      },
      inp, group, scale_group, block_size, num_warps, max_num_blocks, p2p_phase3, output);
}

namespace detail {

void register_quantized_allreduce_ops(OpRegistry& r) {
  declare<&quantized_all_reduce>(
      r,
      {.name = "quantized_all_reduce",
       .module = kQarModule,
       .summary = "Collective: the sum over the group with FP8 per-group transfers (two-shot)"},
      "inp", arg("group").required(), arg("scale_group", kQuantizedAllReduceScaleGroupDefault).kw(),
      arg("block_size").kw(), arg("num_warps").kw(), arg("max_num_blocks").kw(),
      arg("p2p_phase3").kw(), arg("output").mut().same_view_as("inp").kw());
  api::register_backends("quantized_all_reduce", kQarKernels);
  register_bench_hook(kQarOp, bench_quantized_all_reduce);
  // Replay runs every rank's recorded call together; each rank's group is the replay's.
  CollectiveSpec spec;
  spec.op = "quantized_all_reduce";
  spec.workspace_param = 1;  // the group
  spec.workspace_is_backend = true;
  spec.make_workspace = [](const std::shared_ptr<comm::CommBackend>& c, const std::vector<Value>&,
                           const std::vector<Value>*) { return to_value(c); };
  register_collective(std::move(spec));
}

}  // namespace detail
}  // namespace flashinfer
