// The cuDNN backend of grouped_mm_bf16: upstream's MoE grouped matmul graph
// (kernels/cudnn_grouped_plan.h) built once per problem and cached with its execution plan (a
// problem cuDNN declines is remembered too), cuDNN's workspace in the stream's persistent
// scratch, nothing allocated per call once warm. Compiled with g++ (it includes the cuDNN
// frontend); it launches no kernel of its own.
#include "core/capture_hold.h"
#include "kernels/cuda/cudnn_runtime.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "flashinfer/error.h"
#include "kernels/cuda/grouped_gemm_cudnn.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/cudnn_grouped_plan.h"

namespace flashinfer::kernels::cuda {
namespace {

namespace fe = cudnn_frontend;
using dnn_rt::cuda_check;
using dnn_rt::frontend_call;

std::atomic<uint64_t> g_runs{0}, g_graph_builds{0}, g_graph_hits{0};

// The streams' workspaces, each leased while its stream's handle is held.
StreamScratchPool& grouped_workspace() {
  static StreamScratchPool pool("cuDNN grouped GEMM workspace", "backend");
  return pool;
}

std::vector<int64_t> vec(const std::array<int64_t, 3>& a) { return {a[0], a[1], a[2]}; }

// A built graph, or why cuDNN has none for the problem.
struct CachedGraph {
  std::shared_ptr<fe::graph::Graph> graph;  // null: unsupported
  uint64_t workspace_bytes = 0;
  std::string unsupported;
};

// The graph of `key`, described (not yet validated or lowered to cuDNN); for the GPU of
// `sm_version` when positive (validation without a GPU), else the current device's.
std::shared_ptr<fe::graph::Graph> describe_graph(const dnn::MoeGraphKey& key, int sm_version = 0) {
  using fe::graph::Tensor_attributes;
  auto g = std::make_shared<fe::graph::Graph>();
  if (sm_version > 0) g->set_sm_version(sm_version);
  // Upstream's: bf16 io and intermediates, fp32 compute.
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::BFLOAT16)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const auto tensor = [&](const char* name, int64_t uid, const dnn::Operand3d& o,
                          fe::DataType_t dt) {
    return g->tensor(Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim(vec(o.dims))
                         .set_stride(vec(o.strides))
                         .set_data_type(dt)
                         .set_alignment(o.align));
  };
  const dnn::MoeTensors& t = key.t;
  auto token = tensor("token", dnn::kMoeToken, t.token, fe::DataType_t::BFLOAT16);
  auto weight = tensor("weight", dnn::kMoeWeight, t.weight, fe::DataType_t::BFLOAT16);
  auto offsets = tensor("first_token_offset", dnn::kMoeOffsets, t.offsets, fe::DataType_t::INT32);
  auto out = g->moe_grouped_matmul(token, weight, offsets, nullptr, nullptr,
                                   fe::graph::Moe_grouped_matmul_attributes()
                                       .set_name("moe")
                                       .set_mode(fe::MoeGroupedMatmulMode_t::NONE)
                                       .set_compute_data_type(fe::DataType_t::FLOAT));
  out->set_output(true)
      .set_name("out")
      .set_uid(dnn::kMoeOut)
      .set_dim(vec(t.out.dims))
      .set_stride(vec(t.out.strides))
      .set_data_type(fe::DataType_t::BFLOAT16)
      .set_alignment(t.out.align);
  return g;
}

// Builds the graph of `key` and its execution plan (the heuristics' first choice that builds,
// modes A then FALLBACK, as upstream asks); an entry saying why when there is none.
std::unique_ptr<CachedGraph> build_graph(const char* op, cudnnHandle_t handle,
                                         const dnn::MoeGraphKey& key) {
  auto built = std::make_unique<CachedGraph>();
  g_graph_builds.fetch_add(1, std::memory_order_relaxed);
  const dnn::MoeTensors& t = key.t;
  const auto unsupported = [&](const std::string& why) {
    built->unsupported = "cuDNN has no MoE grouped matmul plan for this problem (groups=" +
                         std::to_string(t.weight.dims[0]) +
                         ", cum_m=" + std::to_string(t.token.dims[1]) +
                         ", n=" + std::to_string(t.out.dims[2]) +
                         ", k=" + std::to_string(t.token.dims[2]) + "): " + why;
  };
  std::shared_ptr<fe::graph::Graph> g = describe_graph(key);
  fe::error_t st = g->build(handle, {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
  if (st.is_bad()) {
    unsupported(st.get_message());
    return built;
  }
  int64_t ws = 0;
  st = g->get_workspace_size(ws);
  FLASHINFER_CHECK_CODE(st.is_good(), ErrorCode::kCuda, op, "backend",
                        "cuDNN get_workspace_size failed: ", st.get_message());
  built->graph = std::move(g);
  built->workspace_bytes = static_cast<uint64_t>(ws);
  return built;
}

// The cached graph of `key`, built on first use with `handle` (the caller's stream's, held).
// Graphs are never evicted: one per problem a process runs.
const CachedGraph& find_graph(const char* op, cudnnHandle_t handle, const dnn::MoeGraphKey& key) {
  static auto& cache = *new dnn_rt::GraphCache<dnn::MoeGraphKey, dnn::MoeGraphKeyHash, CachedGraph>;
  return cache.find_or_build(key, g_graph_hits, [&] { return build_graph(op, handle, key); });
}

}  // namespace

std::string cudnn_grouped_unavailable() {
  const dnn_rt::CudnnLib& lib = dnn_rt::cudnn_open();
  if (!lib.error.empty()) return lib.error;
  if (lib.number < kCudnnMoeMinVersion) {
    return "cuDNN's MoE grouped matmul needs libcudnn 9.15.0 or newer; this process loaded " +
           lib.version;
  }
  return "";
}

bool cudnn_grouped_mm(const GroupedMmCudaParams& p, void* stream, const char* op) {
  if (!dnn::moe_misfit(p).empty()) return false;
  // Checked before any graph is built: the frontend would refuse the node on every new shape.
  static const bool available = cudnn_grouped_unavailable().empty();
  if (!available) return false;
  const auto s = static_cast<cudaStream_t>(stream);
  // A first call on a stream creates its handle and may build a graph, neither of which a
  // capture allows; a captured call runs the grouped kernel (simplest to keep consistent).
  if (dnn_rt::capturing(op, s)) {
    ::flashinfer::detail::note_capture_decline();
    return false;
  }
  int device = 0;
  cuda_check(op, cudaGetDevice(&device), "cudaGetDevice");
  const dnn::MoeGraphKey key = dnn::make_moe_key(device, p);
  bool ran = false;
  frontend_call(op, [&] {
    dnn_rt::StreamState& ss =
        dnn_rt::stream_state(op, device, s, dnn_rt::Backend::kGroupedGemm,
                             {dnn::kMoeToken, dnn::kMoeWeight, dnn::kMoeOffsets, dnn::kMoeOut});
    std::lock_guard<std::mutex> lock(ss.mu);
    const CachedGraph& g = find_graph(op, ss.handle, key);
    if (!g.graph) return;
    const StreamScratch ws = grouped_workspace().acquire(op, device, s, g.workspace_bytes);
    ss.pack[dnn::kMoeToken] = const_cast<void*>(p.a);
    ss.pack[dnn::kMoeWeight] = const_cast<void*>(p.b);
    ss.pack[dnn::kMoeOffsets] = const_cast<int32_t*>(p.m_indptr);
    ss.pack[dnn::kMoeOut] = p.out;
    fe::error_t st = g.graph->execute(ss.handle, ss.pack, ws.data());
    FLASHINFER_CHECK_CODE(st.is_good(), ErrorCode::kCuda, op, "backend",
                          "cuDNN MoE grouped matmul execution failed: ", st.get_message());
    g_runs.fetch_add(1, std::memory_order_relaxed);
    ran = true;
  });
  return ran;
}

std::string cudnn_validate_grouped_mm(const GroupedMmCudaParams& p, int sm_version) {
  const dnn_rt::CudnnLib& lib = dnn_rt::cudnn_open();
  if (!lib.error.empty()) return lib.error;
  std::string message;
  try {
    fe::error_t st = describe_graph(dnn::make_moe_key(0, p), sm_version)->validate();
    if (st.is_bad()) message = st.get_message();
  } catch (const std::exception& e) {
    message = e.what();
  }
  return message;
}

CudnnGroupedStats cudnn_grouped_stats() {
  return {g_runs.load(std::memory_order_relaxed), g_graph_builds.load(std::memory_order_relaxed),
          g_graph_hits.load(std::memory_order_relaxed), grouped_workspace().allocations(),
          grouped_workspace().allocated_bytes()};
}

}  // namespace flashinfer::kernels::cuda
