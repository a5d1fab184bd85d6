// The cuDNN backend of cudnn_batch_prefill_with_kv_cache and cudnn_batch_decode_with_kv_cache:
// upstream's cuDNN SDPA forward graph over a paged K/V cache (kernels/cudnn_attention_plan.h)
// built once per problem and cached with its execution plan, cuDNN's workspace in the caller's
// workspace_buffer (or the stream's own, grown once), and nothing allocated per call once warm
// beyond the outputs. Compiled with g++ (it includes the cuDNN frontend, ~20 s); its one kernel
// (the statistics to base 2) is in attention_cudnn_lse.cu.
#include "core/capture_hold.h"
#include "kernels/cuda/cudnn_runtime.h"

#include <atomic>
#include <bit>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "flashinfer/error.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/cudnn_attention_plan.h"

namespace flashinfer::kernels::cuda {
namespace {

namespace fe = cudnn_frontend;
using dnn_rt::cuda_check;
using dnn_rt::frontend_call;

std::atomic<uint64_t> g_runs{0}, g_graph_builds{0}, g_graph_hits{0}, g_composite_graphs{0};

// The streams' attention workspaces where the caller's workspace_buffer is too small (the index
// arrays, then cuDNN's workspace), each leased while its stream's handle is held.
StreamScratchPool& attention_workspace() {
  static StreamScratchPool pool("cuDNN attention workspace", "workspace_buffer");
  return pool;
}

fe::DataType_t io_type(DType dt) {
  return dt == DType::kFloat16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
}

std::vector<int64_t> vec(const std::array<int64_t, 4>& a) { return {a[0], a[1], a[2], a[3]}; }

// A built graph and the implementation it was built with, or why cuDNN has none for the problem
// (remembered too, so a declined problem is not rebuilt on every call).
struct CachedGraph {
  std::shared_ptr<fe::graph::Graph> graph;  // null: unsupported
  dnn::SdpaImplementation implementation = dnn::SdpaImplementation::kAuto;
  uint64_t workspace_bytes = 0;
  std::string unsupported;
};

// The graph of `key`, described (not yet validated or lowered to cuDNN) with `impl`. With kAuto
// the frontend picks the SDPA implementation for the GPU here: the current device's, or
// `sm_version` when positive (for validation without a GPU). Throws std::runtime_error when no
// implementation supports it.
std::shared_ptr<fe::graph::Graph> describe_graph(const dnn::SdpaGraphKey& key,
                                                 dnn::SdpaImplementation impl, int sm_version = 0) {
  using fe::graph::Tensor_attributes;
  auto g = std::make_shared<fe::graph::Graph>();
  if (sm_version > 0) g->set_sm_version(sm_version);
  const fe::DataType_t io = io_type(key.dtype);
  g->set_io_data_type(io)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const auto tensor = [&](const char* name, int64_t uid, const dnn::Tensor4d& t,
                          fe::DataType_t dt) {
    return g->tensor(Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim(vec(t.dims))
                         .set_stride(vec(t.strides))
                         .set_data_type(dt));
  };
  const fe::DataType_t i32 = fe::DataType_t::INT32;
  auto q = tensor("q", dnn::kSdpaQ, key.t.q, io);
  auto k = tensor("k_cache", dnn::kSdpaK, key.t.k, io);
  auto v = tensor("v_cache", dnn::kSdpaV, key.t.v, io);
  auto seq_q = tensor("actual_seq_lens_q", dnn::kSdpaSeqLenQ, key.t.lens, i32);
  auto seq_kv = tensor("actual_seq_lens_kv", dnn::kSdpaSeqLenKv, key.t.lens, i32);
  // K and V read through one table; the graph takes one per cache.
  auto table_k = tensor("block_tables_k", dnn::kSdpaTableK, key.t.table, i32);
  auto table_v = tensor("block_tables_v", dnn::kSdpaTableV, key.t.table, i32);
  std::shared_ptr<Tensor_attributes> offset_o, offset_stats;
  if (key.ragged) {
    q->set_ragged_offset(tensor("ragged_q", dnn::kSdpaOffsetQ, key.t.offsets, i32));
    offset_o = tensor("ragged_o", dnn::kSdpaOffsetO, key.t.offsets, i32);
    if (key.stats) offset_stats = tensor("ragged_stats", dnn::kSdpaOffsetStats, key.t.offsets, i32);
  }
  auto attrs = fe::graph::SDPA_attributes()
                   .set_name("sdpa")
                   .set_generate_stats(key.stats)
                   .set_attn_scale(std::bit_cast<float>(key.scale_bits))
                   .set_padding_mask(true)
                   .set_seq_len_q(seq_q)
                   .set_seq_len_kv(seq_kv)
                   .set_paged_attention_k_table(table_k)
                   .set_paged_attention_v_table(table_v)
                   .set_paged_attention_max_seq_len_kv(static_cast<int>(key.max_s_kv));
  attrs.set_compute_data_type(fe::DataType_t::FLOAT);
  if (impl == dnn::SdpaImplementation::kComposite) {
    attrs.set_implementation(fe::AttentionImplementation_t::COMPOSITE);
  }
  if (key.causal) {
    // This library's causal mask: the last query of a request sees all its keys (bottom-right,
    // per request through the padding lengths), as upstream's use_causal_mask_bottom_right.
    attrs.set_diagonal_alignment(fe::DiagonalAlignment_t::BOTTOM_RIGHT)
        .set_diagonal_band_right_bound(0);
  }
  auto outputs = g->sdpa(q, k, v, std::move(attrs));
  auto o = outputs[0];
  o->set_output(true)
      .set_name("o")
      .set_uid(dnn::kSdpaO)
      .set_dim(vec(key.t.o.dims))
      .set_stride(vec(key.t.o.strides))
      .set_data_type(io);
  if (offset_o) o->set_ragged_offset(offset_o);
  if (key.stats) {
    auto stats = outputs[1];
    stats->set_output(true)
        .set_name("stats")
        .set_uid(dnn::kSdpaStats)
        .set_dim(vec(key.t.stats.dims))
        .set_stride(vec(key.t.stats.strides))
        .set_data_type(fe::DataType_t::FLOAT);
    if (offset_stats) stats->set_ragged_offset(offset_stats);
  }
  return g;
}

// Builds the graph of `key` and its execution plan (the heuristics' first choice that builds,
// modes A then FALLBACK), with the frontend's choice of implementation, then once more with the
// composite one when that fails (dnn::sdpa_retry_implementation); an entry saying why when
// neither builds.
std::unique_ptr<CachedGraph> build_graph(const char* op, cudnnHandle_t handle,
                                         const dnn::SdpaGraphKey& key) {
  auto built = std::make_unique<CachedGraph>();
  g_graph_builds.fetch_add(1, std::memory_order_relaxed);
  const auto unsupported = [&](const std::string& why) {
    const dnn::Tensor4d& q = key.t.q;
    built->unsupported =
        "cuDNN has no SDPA execution plan for this problem (batch=" + std::to_string(q.dims[0]) +
        ", heads=" + std::to_string(q.dims[1]) + ", s_q=" + std::to_string(q.dims[2]) +
        ", head_dim=" + std::to_string(q.dims[3]) + "): " + why;
  };
  std::string why;  // each implementation's failure, in the order tried
  std::optional<dnn::SdpaImplementation> impl = dnn::SdpaImplementation::kAuto;
  while (impl) {
    const char* name = *impl == dnn::SdpaImplementation::kAuto ? "frontend's choice" : "composite";
    if (!why.empty()) why += "; ";
    why += name;
    why += ": ";
    std::shared_ptr<fe::graph::Graph> g;
    bool described = true;
    fe::error_t st;
    try {
      g = describe_graph(key, *impl);
    } catch (const std::runtime_error& e) {  // no SDPA implementation for this GPU and problem
      described = false;
      why += e.what();
    }
    if (described) st = g->build(handle, {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
    if (described && st.is_good()) {
      int64_t ws = 0;
      st = g->get_workspace_size(ws);
      FLASHINFER_CHECK_CODE(st.is_good(), ErrorCode::kCuda, op, "backend",
                            "cuDNN get_workspace_size failed: ", st.get_message());
      if (*impl == dnn::SdpaImplementation::kComposite) {
        g_composite_graphs.fetch_add(1, std::memory_order_relaxed);
      }
      built->graph = std::move(g);
      built->implementation = *impl;
      built->workspace_bytes = static_cast<uint64_t>(ws);
      return built;
    }
    if (described) why += st.get_message();
    impl = dnn::sdpa_retry_implementation(*impl, described);
  }
  unsupported(why);
  return built;
}

// The cached graph of `key`, built on first use with `handle` (the caller's stream's, held).
// Graphs are never evicted: one per problem a process runs.
const CachedGraph& find_graph(const char* op, cudnnHandle_t handle, const dnn::SdpaGraphKey& key) {
  static auto& cache =
      *new dnn_rt::GraphCache<dnn::SdpaGraphKey, dnn::SdpaGraphKeyHash, CachedGraph>;
  return cache.find_or_build(key, g_graph_hits, [&] { return build_graph(op, handle, key); });
}

}  // namespace

bool cudnn_sdpa(const CudnnSdpaCall& c, void* stream, const char* op) {
  if (!dnn_rt::cudnn_open().error.empty()) return false;
  const auto s = static_cast<cudaStream_t>(stream);
  // The index arrays are copied from pageable host memory, which a captured graph could not
  // replay.
  if (dnn_rt::capturing(op, s)) {
    ::flashinfer::detail::note_capture_decline();
    return false;
  }
  const dnn::SdpaProblem& p = c.problem;
  const dnn::SdpaIndexLayout layout = dnn::sdpa_index_layout(p);
  thread_local std::vector<int32_t> ints;  // reused: a warm call allocates nothing here
  static const std::vector<int32_t> kNoIndptr;
  if (!dnn::sdpa_index_values(p, layout, *c.lens_q, *c.lens_kv,
                              c.qo_indptr ? *c.qo_indptr : kNoIndptr, c.table, c.table_cols,
                              ints)) {
    return false;
  }
  int device = 0;
  cuda_check(op, cudaGetDevice(&device), "cudaGetDevice");
  const dnn::SdpaGraphKey key = dnn::make_sdpa_key(device, p);
  bool ran = false;
  frontend_call(op, [&] {
    dnn_rt::StreamState& ss = dnn_rt::stream_state(
        op, device, s, dnn_rt::Backend::kAttention,
        {dnn::kSdpaQ, dnn::kSdpaK, dnn::kSdpaV, dnn::kSdpaO, dnn::kSdpaStats, dnn::kSdpaSeqLenQ,
         dnn::kSdpaSeqLenKv, dnn::kSdpaTableK, dnn::kSdpaTableV, dnn::kSdpaOffsetQ,
         dnn::kSdpaOffsetO, dnn::kSdpaOffsetStats});
    std::lock_guard<std::mutex> lock(ss.mu);
    const CachedGraph& g = find_graph(op, ss.handle, key);
    if (!g.graph) return;
    // The index block, then cuDNN's workspace (256-byte aligned): in the caller's workspace
    // when it holds both, else in the stream's own.
    const uint64_t need = static_cast<uint64_t>(layout.bytes) + g.workspace_bytes;
    auto* base = static_cast<char*>(c.workspace);
    StreamScratch lease;
    if (base == nullptr || c.workspace_bytes < need ||
        reinterpret_cast<std::uintptr_t>(base) % 256 != 0) {
      lease = attention_workspace().acquire(op, device, s, need);
      base = static_cast<char*>(lease.data());
    }
    auto* idx = reinterpret_cast<int32_t*>(base);
    cuda_check(op,
               cudaMemcpyAsync(idx, ints.data(), static_cast<std::size_t>(layout.ints) * 4,
                               cudaMemcpyHostToDevice, s),
               "cudaMemcpyAsync");
    ss.pack[dnn::kSdpaQ] = const_cast<void*>(c.q);
    ss.pack[dnn::kSdpaK] = const_cast<void*>(c.k);
    ss.pack[dnn::kSdpaV] = const_cast<void*>(c.v);
    ss.pack[dnn::kSdpaO] = c.out;
    ss.pack[dnn::kSdpaStats] = c.lse;
    ss.pack[dnn::kSdpaSeqLenQ] = idx + layout.seq_len_q;
    ss.pack[dnn::kSdpaSeqLenKv] = idx + layout.seq_len_kv;
    ss.pack[dnn::kSdpaTableK] = idx + layout.table;
    ss.pack[dnn::kSdpaTableV] = idx + layout.table;
    ss.pack[dnn::kSdpaOffsetQ] = idx + layout.offset_q;
    ss.pack[dnn::kSdpaOffsetO] = idx + layout.offset_o;
    ss.pack[dnn::kSdpaOffsetStats] = idx + layout.offset_stats;
    fe::error_t st = g.graph->execute(ss.handle, ss.pack, base + layout.bytes);
    FLASHINFER_CHECK_CODE(st.is_good(), ErrorCode::kCuda, op, "backend",
                          "cuDNN SDPA graph execution failed: ", st.get_message());
    if (p.stats) {
      const int64_t rows = p.ragged ? (*c.qo_indptr)[p.batch] : p.batch;
      lse_natural_to_log2(c.lse, rows, p.hq, p.lse_stride_n, p.lse_stride_h, s, op);
    }
    g_runs.fetch_add(1, std::memory_order_relaxed);
    ran = true;
  });
  return ran;
}

std::string cudnn_validate_sdpa(const dnn::SdpaProblem& p, int sm_version,
                                dnn::SdpaImplementation impl) {
  const dnn_rt::CudnnLib& lib = dnn_rt::cudnn_open();
  if (!lib.error.empty()) return lib.error;
  std::string message;
  try {
    fe::error_t st = describe_graph(dnn::make_sdpa_key(0, p), impl, sm_version)->validate();
    if (st.is_bad()) message = st.get_message();
  } catch (const std::exception& e) {
    message = e.what();
  }
  return message;
}

CudnnAttentionStats cudnn_attention_stats() {
  return {g_runs.load(std::memory_order_relaxed),
          g_graph_builds.load(std::memory_order_relaxed),
          g_graph_hits.load(std::memory_order_relaxed),
          attention_workspace().allocations(),
          attention_workspace().allocated_bytes(),
          g_composite_graphs.load(std::memory_order_relaxed)};
}

}  // namespace flashinfer::kernels::cuda
