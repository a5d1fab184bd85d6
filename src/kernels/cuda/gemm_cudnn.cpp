// The cuDNN backend of mm_bf16, bmm_bf16 and bmm_fp8: upstream's cuDNN graphs (matmul in fp32,
// then bias or the FP8 scales as pointwise nodes; kernels/cudnn_gemm_plan.h) built once per
// problem and cached with their execution plan, a persistent workspace per stream, and nothing
// allocated per call once warm. Compiled with g++, not nvcc: it launches no kernel of its own.
// It also defines what the cuDNN backends share (kernels/cuda/cudnn_runtime.h): the library,
// opened on the first cuDNN graph, and the per-stream handles.
#include "kernels/cuda/cudnn_runtime.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "flashinfer/error.h"
#include "kernels/cuda/gemm_cudnn.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/cudnn_gemm_plan.h"

// The frontend declares it; the program defines it (one definition, here).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace flashinfer::kernels::cuda {
namespace dnn_rt {
namespace {

namespace fe = cudnn_frontend;

// The toolkit's soname first (found through the library's run path, LD_LIBRARY_PATH or the
// loader's cache), then the file the build found. libcudnn.so.9 is a small dispatcher that
// opens its sub-libraries from its own directory. Never closed.
CudnnLib open_cudnn() {
  CudnnLib lib;
  const std::string soname = "libcudnn.so." + std::to_string(CUDNN_MAJOR);
  void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
#ifdef FLASHINFER_CUDNN_LIBRARY
  if (h == nullptr) h = dlopen(FLASHINFER_CUDNN_LIBRARY, RTLD_NOW | RTLD_LOCAL);
#endif
  if (h == nullptr) {
    const char* why = dlerror();
    lib.error = "cannot open " + soname + (why ? std::string(": ") + why : std::string());
    return lib;
  }
  using GetVersion = std::size_t (*)();
  auto get_version = reinterpret_cast<GetVersion>(dlsym(h, "cudnnGetVersion"));
  if (get_version == nullptr) {
    lib.error = soname + " has no cudnnGetVersion";
    return lib;
  }
  const std::size_t v = get_version();  // major * 10000 + minor * 100 + patch (cuDNN 9)
  lib.number = v;
  lib.version = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
                std::to_string(v % 100);
  if (v / 10000 != CUDNN_MAJOR) {
    lib.error = soname + " is version " + lib.version + ", but this build's cuDNN headers are " +
                std::to_string(CUDNN_MAJOR) + ".x";
    return lib;
  }
  fe::cudnn_dlhandle = h;
  // The frontend opens the CUDA runtime by soname too, the first of libcudart.so.12 and .13 it
  // finds; pin it to the one this library links (already loaded, so that is what dlopen returns),
  // unless the user chose one.
  setenv("CUDNN_FRONTEND_CUDART_LIB_NAME",
         ("libcudart.so." + std::to_string(CUDART_VERSION / 1000)).c_str(), 0);
  return lib;
}

// A stream of one backend.
struct BackendStreamKey {
  StreamKey stream;
  Backend backend = Backend::kGemm;
  bool operator==(const BackendStreamKey&) const = default;
};

struct BackendStreamKeyHash {
  std::size_t operator()(const BackendStreamKey& k) const {
    KeyHasher h;
    h.mix(StreamKeyHash()(k.stream));
    h.mix(static_cast<uint64_t>(k.backend));
    return h.value();
  }
};

}  // namespace

const CudnnLib& cudnn_open() {
  static const CudnnLib lib = open_cudnn();  // thread-safe, once
  return lib;
}

// Nothing here is freed: destroying a handle or freeing device memory from a static destructor
// can run after the CUDA context is gone.

void cuda_check(const char* op, cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    FLASHINFER_FAIL(ErrorCode::kCuda, op, "", what, " failed: ", cudaGetErrorName(err), ": ",
                    cudaGetErrorString(err));
  }
}

bool capturing(const char* op, cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cuda_check(op, cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

// (The per-thread default stream is one handle for many streams: keyed by stream id.)
StreamState& stream_state(const char* op, int device, cudaStream_t stream, Backend backend,
                          std::initializer_list<int64_t> uids) {
  const BackendStreamKey key{stream_key(op, device, stream), backend};
  static std::mutex mu;
  static auto& states =
      *new std::unordered_map<BackendStreamKey, std::unique_ptr<StreamState>, BackendStreamKeyHash>;
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<StreamState>& st = states[key];
  if (!st) {
    FLASHINFER_CHECK_CODE(!capturing(op, stream), ErrorCode::kUnsupported, op, "backend",
                          "the first cuDNN call on a stream creates its cuDNN handle, which "
                          "cannot happen while the stream is being captured into a CUDA graph: "
                          "run the call once on the stream before capturing it");
    auto fresh = std::make_unique<StreamState>();
    cudnnStatus_t s = fe::detail::create_handle(&fresh->handle);
    FLASHINFER_CHECK_CODE(s == CUDNN_STATUS_SUCCESS, ErrorCode::kCuda, op, "backend",
                          "cudnnCreate failed: ", fe::detail::get_error_string(s));
    s = fe::detail::set_stream(fresh->handle, stream);
    FLASHINFER_CHECK_CODE(s == CUDNN_STATUS_SUCCESS, ErrorCode::kCuda, op, "backend",
                          "cudnnSetStream failed: ", fe::detail::get_error_string(s));
    fresh->pack.reserve(uids.size());
    for (int64_t uid : uids) fresh->pack.emplace(uid, nullptr);
    st = std::move(fresh);
  }
  return *st;
}

}  // namespace dnn_rt

namespace {

namespace fe = cudnn_frontend;
using dnn_rt::cuda_check;
using dnn_rt::frontend_call;

std::atomic<uint64_t> g_graph_builds{0}, g_graph_hits{0};

// The GEMM graphs' handle and variant pack on `stream`.
dnn_rt::StreamState& stream_state(const char* op, int device, cudaStream_t stream) {
  return dnn_rt::stream_state(
      op, device, stream, dnn_rt::Backend::kGemm,
      {dnn::kUidA, dnn::kUidB, dnn::kUidC, dnn::kUidBias, dnn::kUidAScale, dnn::kUidBScale});
}

// The streams' workspaces (kernels/cuda/stream_scratch.h; grown as dnn::workspace_grow_to says),
// each leased while its stream's state is held.
StreamScratchPool& cudnn_workspace() {
  static StreamScratchPool pool("cuDNN workspace", "backend");
  return pool;
}

// ---- graphs -----------------------------------------------------------------------------------

fe::DataType_t dnn_type(DType dt) {
  switch (dt) {
    case DType::kBFloat16:
      return fe::DataType_t::BFLOAT16;
    case DType::kFloat16:
      return fe::DataType_t::HALF;
    case DType::kFloat8E4M3FN:
      return fe::DataType_t::FP8_E4M3;
    case DType::kFloat8E5M2:
      return fe::DataType_t::FP8_E5M2;
    default:
      return fe::DataType_t::FLOAT;
  }
}

// A built graph, or why cuDNN has none for the problem (remembered too, so a declined problem
// is not rebuilt on every call).
struct CachedGraph {
  std::shared_ptr<fe::graph::Graph> graph;  // null: unsupported
  uint64_t workspace_bytes = 0;
  std::string unsupported;
};

std::vector<int64_t> vec(const std::array<int64_t, 3>& a) { return {a[0], a[1], a[2]}; }

// The graph of `key`, described (not yet validated or lowered to cuDNN).
std::shared_ptr<fe::graph::Graph> describe_graph(const dnn::GraphKey& key) {
  using fe::graph::Tensor_attributes;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(dnn_type(key.c_type))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const auto operand = [&](const char* name, int64_t uid, const dnn::Operand3d& o, DType dt) {
    return g->tensor(Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim(vec(o.dims))
                         .set_stride(vec(o.strides))
                         .set_data_type(dnn_type(dt))
                         .set_alignment(o.align));
  };
  auto a = operand("a", dnn::kUidA, key.t.a, key.a_type);
  auto b = operand("b", dnn::kUidB, key.t.b, key.b_type);
  auto c = g->matmul(a, b,
                     fe::graph::Matmul_attributes().set_name("matmul").set_compute_data_type(
                         fe::DataType_t::FLOAT));
  c->set_data_type(fe::DataType_t::FLOAT);
  const auto pointwise = [&](const char* name, fe::PointwiseMode_t mode,
                             std::shared_ptr<Tensor_attributes> x,
                             std::shared_ptr<Tensor_attributes> y) {
    auto r = g->pointwise(
        x, y,
        fe::graph::Pointwise_attributes().set_name(name).set_mode(mode).set_compute_data_type(
            fe::DataType_t::FLOAT));
    r->set_data_type(fe::DataType_t::FLOAT);
    return r;
  };
  const int64_t n = key.t.c.dims[2];
  if (key.epilogue == dnn::Epilogue::kBias) {
    auto bias = g->tensor(Tensor_attributes()
                              .set_name("bias")
                              .set_uid(dnn::kUidBias)
                              .set_dim({1, 1, n})
                              .set_stride({n, n, 1})
                              .set_data_type(dnn_type(key.bias_type))
                              .set_alignment(key.bias_align));
    c = pointwise("bias_add", fe::PointwiseMode_t::ADD, c, bias);
  } else if (key.epilogue == dnn::Epilogue::kTensorScales) {
    const auto scale = [&](const char* name, int64_t uid) {
      return g->tensor(Tensor_attributes()
                           .set_name(name)
                           .set_uid(uid)
                           .set_dim({1, 1, 1})
                           .set_stride({1, 1, 1})
                           .set_data_type(fe::DataType_t::FLOAT)
                           .set_alignment(4));
    };
    c = pointwise("scale_mul_a", fe::PointwiseMode_t::MUL, c, scale("a_scale", dnn::kUidAScale));
    c = pointwise("scale_mul_b", fe::PointwiseMode_t::MUL, c, scale("b_scale", dnn::kUidBScale));
  }
  c->set_output(true)
      .set_name("c")
      .set_uid(dnn::kUidC)
      .set_dim(vec(key.t.c.dims))
      .set_stride(vec(key.t.c.strides))
      .set_data_type(dnn_type(key.c_type))
      .set_alignment(key.t.c.align);
  return g;
}

// Builds the graph of `key` and its execution plan (the heuristics' first choice that builds,
// modes A then FALLBACK, as upstream asks); an entry saying why when there is none.
std::unique_ptr<CachedGraph> build_graph(const char* op, cudnnHandle_t handle,
                                         const dnn::GraphKey& key) {
  std::shared_ptr<fe::graph::Graph> g = describe_graph(key);
  auto built = std::make_unique<CachedGraph>();
  fe::error_t st = g->build(handle, {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
  if (st.is_bad()) {
    const dnn::GemmTensors& t = key.t;
    built->unsupported =
        "cuDNN has no execution plan for this problem (batch=" + std::to_string(t.c.dims[0]) +
        ", m=" + std::to_string(t.c.dims[1]) + ", n=" + std::to_string(t.c.dims[2]) +
        ", k=" + std::to_string(t.a.dims[2]) + "): " + st.get_message();
    g_graph_builds.fetch_add(1, std::memory_order_relaxed);
    return built;
  }
  int64_t ws = 0;
  st = g->get_workspace_size(ws);
  FLASHINFER_CHECK_CODE(st.is_good(), ErrorCode::kCuda, op, "backend",
                        "cuDNN get_workspace_size failed: ", st.get_message());
  built->graph = std::move(g);
  built->workspace_bytes = static_cast<uint64_t>(ws);
  g_graph_builds.fetch_add(1, std::memory_order_relaxed);
  return built;
}

// The cached graph of `key`, built on first use with `handle` (the caller's stream's, held).
// Graphs are never evicted: one per problem a process runs.
const CachedGraph& find_graph(const char* op, cudnnHandle_t handle, const dnn::GraphKey& key) {
  static auto& cache = *new dnn_rt::GraphCache<dnn::GraphKey, dnn::GraphKeyHash, CachedGraph>;
  return cache.find_or_build(key, g_graph_hits, [&] { return build_graph(op, handle, key); });
}

}  // namespace

bool cudnn_gemm(const GemmParams& p, void* stream, const char* op, bool decline_unsupported) {
  const dnn_rt::CudnnLib& lib = dnn_rt::cudnn_open();
  FLASHINFER_CHECK_CODE(lib.error.empty(), ErrorCode::kUnsupported, op, "backend",
                        "backend 'cudnn' needs libcudnn: ", lib.error);
  FLASHINFER_CHECK_CODE(p.out_stride_n == 1 || p.n == 1, ErrorCode::kUnsupported, op, "out",
                        "the cuDNN backend needs out with unit stride in its last dimension");
  FLASHINFER_CHECK_CODE(p.bias == nullptr || p.bias_stride == 1, ErrorCode::kUnsupported, op,
                        "bias", "the cuDNN backend needs a contiguous bias");
  const auto s = static_cast<cudaStream_t>(stream);
  int device = 0;
  cuda_check(op, cudaGetDevice(&device), "cudaGetDevice");
  const dnn::GraphKey key = dnn::make_graph_key(device, p);
  bool ran = false;
  frontend_call(op, [&] {
    dnn_rt::StreamState& ss = stream_state(op, device, s);
    std::lock_guard<std::mutex> lock(ss.mu);
    const CachedGraph& g = find_graph(op, ss.handle, key);
    if (!g.graph) {
      FLASHINFER_CHECK_CODE(decline_unsupported, ErrorCode::kUnsupported, op, "backend",
                            g.unsupported);
      return;
    }
    const StreamScratch ws = cudnn_workspace().acquire(op, device, s, g.workspace_bytes);
    ss.pack[dnn::kUidA] = const_cast<void*>(p.a);
    ss.pack[dnn::kUidB] = const_cast<void*>(p.b);
    ss.pack[dnn::kUidC] = p.out;
    ss.pack[dnn::kUidBias] = const_cast<void*>(p.bias);
    ss.pack[dnn::kUidAScale] = const_cast<float*>(p.a_scale);
    ss.pack[dnn::kUidBScale] = const_cast<float*>(p.b_scale);
    fe::error_t st = g.graph->execute(ss.handle, ss.pack, ws.data());
    FLASHINFER_CHECK_CODE(st.is_good(), ErrorCode::kCuda, op, "backend",
                          "cuDNN graph execution failed: ", st.get_message());
    ran = true;
  });
  return ran;
}

CudnnStats cudnn_stats() {
  return {g_graph_builds.load(std::memory_order_relaxed),
          g_graph_hits.load(std::memory_order_relaxed), cudnn_workspace().allocations(),
          cudnn_workspace().allocated_bytes()};
}

std::string cudnn_load_error() { return dnn_rt::cudnn_open().error; }

std::string cudnn_validate_graph(const GemmParams& p) {
  const dnn_rt::CudnnLib& lib = dnn_rt::cudnn_open();
  if (!lib.error.empty()) return lib.error;
  std::string message;
  frontend_call("cudnn_validate_graph", [&] {
    fe::error_t st = describe_graph(dnn::make_graph_key(0, p))->validate();
    if (st.is_bad()) message = st.get_message();
  });
  return message;
}

std::string cudnn_library_version() { return dnn_rt::cudnn_open().version; }

}  // namespace flashinfer::kernels::cuda
