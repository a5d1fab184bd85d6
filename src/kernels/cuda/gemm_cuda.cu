#include <cublasLt.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "flashinfer/float_formats.h"
#include "kernels/cublaslt_plan.h"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/gemm_cuda.h"
#include "kernels/cuda/stream_scratch.h"

namespace flashinfer::kernels::cuda {
namespace {

// cuBLASLt is opened on first use (dlopen), not linked: its static initializers cost every process
// that loads this library about 55 ms of CPU and ~100 MB of touched pages at start-up, GEMM or
// not (docs/PERFORMANCE.md, "Start-up"). The functions used here, resolved once by name.
struct CublasLt {
  std::string error;  // empty: every function below resolved
  decltype(&::cublasLtCreate) Create = nullptr;
  decltype(&::cublasLtGetStatusName) GetStatusName = nullptr;
  decltype(&::cublasLtGetStatusString) GetStatusString = nullptr;
  decltype(&::cublasLtMatmul) Matmul = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic = nullptr;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) MatmulDescDestroy = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy = nullptr;
  decltype(&::cublasLtMatrixLayoutSetAttribute) MatrixLayoutSetAttribute = nullptr;
};

// The toolkit's soname first (found through the library's run path, LD_LIBRARY_PATH or the
// loader's cache, as a linked library would be), then the file the build found. Never closed.
CublasLt open_cublaslt() {
  CublasLt api;
  const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
#ifdef FLASHINFER_CUBLASLT_LIBRARY
  if (h == nullptr) h = dlopen(FLASHINFER_CUBLASLT_LIBRARY, RTLD_NOW | RTLD_LOCAL);
#endif
  if (h == nullptr) {
    const char* why = dlerror();
    api.error = "cannot open " + soname + (why ? std::string(": ") + why : std::string());
    return api;
  }
  auto get = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
    if (fn == nullptr && api.error.empty()) api.error = soname + " has no " + name;
  };
  get(api.Create, "cublasLtCreate");
  get(api.GetStatusName, "cublasLtGetStatusName");
  get(api.GetStatusString, "cublasLtGetStatusString");
  get(api.Matmul, "cublasLtMatmul");
  get(api.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  get(api.MatmulDescCreate, "cublasLtMatmulDescCreate");
  get(api.MatmulDescDestroy, "cublasLtMatmulDescDestroy");
  get(api.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  get(api.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  get(api.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  get(api.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  get(api.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  get(api.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
  get(api.MatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute");
  return api;
}

const CublasLt& cublaslt_api() {
  static const CublasLt api = open_cublaslt();  // thread-safe, once
  return api;
}

// The loaded API; an Error (kCuda) naming cuBLASLt when it cannot be opened.
const CublasLt& lt() {
  const CublasLt& api = cublaslt_api();
  if (!api.error.empty()) {
    FLASHINFER_FAIL(::flashinfer::ErrorCode::kCuda, "cublasLt", "", api.error);
  }
  return api;
}

#define FLASHINFER_CUBLASLT_CALL(op, expr)                                                    \
  do {                                                                                        \
    cublasStatus_t st_ = (expr);                                                              \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                       \
      FLASHINFER_FAIL(::flashinfer::ErrorCode::kCuda, op, "", #expr,                          \
                      " failed: ", lt().GetStatusName(st_), ": ", lt().GetStatusString(st_)); \
    }                                                                                         \
  } while (0)

// ---- per-device state: handle, workspace per stream, the plan cache; the scratch -------------
//
// Nothing here is freed: destroying a handle or freeing device memory from a static destructor
// can run after the CUDA context is gone (and cublasLtDestroy synchronizes the device).

std::atomic<uint64_t> g_plan_builds{0}, g_plan_hits{0}, g_device_allocs{0}, g_device_bytes{0};
std::atomic<uint64_t> g_lt_refusals{0}, g_declined_calls{0};

void* device_alloc(const char* op, std::size_t bytes) {
  void* p = nullptr;
  FLASHINFER_CUDA_CALL(op, cudaMalloc(&p, bytes));
  g_device_allocs.fetch_add(1, std::memory_order_relaxed);
  g_device_bytes.fetch_add(bytes, std::memory_order_relaxed);
  return p;
}

struct DeviceState {
  cublasLtHandle_t handle = nullptr;  // bound to this device (created with it current)
  uint64_t workspace_bytes = 0;
  float* zero = nullptr;  // a device 0.0f: beta when alpha is read from device memory
  std::mutex mu;          // guards workspaces
  // One cuBLASLt workspace per stream, by stream id (stream_scratch.h: the per-thread default
  // stream is one handle for many streams): a workspace shared by two streams would be written
  // by two GEMMs at once. Fixed size, used within one cublasLtMatmul, so stream order alone keeps
  // calls apart and no lock is held past the lookup.
  std::unordered_map<uint64_t, void*> workspaces;
};

DeviceState& device_state(const char* op, int device) {
  static std::mutex mu;
  static std::unordered_map<int, std::unique_ptr<DeviceState>>& states =
      *new std::unordered_map<int, std::unique_ptr<DeviceState>>;
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<DeviceState>& st = states[device];
  if (!st) {
    auto fresh = std::make_unique<DeviceState>();
    FLASHINFER_CUBLASLT_CALL(op, lt().Create(&fresh->handle));
    fresh->workspace_bytes = lt::workspace_bytes_for(detail::cuda_compute_capability(device) / 10);
    fresh->zero = static_cast<float*>(device_alloc(op, sizeof(float)));
    FLASHINFER_CUDA_CALL(op, cudaMemset(fresh->zero, 0, sizeof(float)));
    st = std::move(fresh);
  }
  return *st;
}

bool capturing(const char* op, cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  FLASHINFER_CUDA_CALL(op, cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// The stream's workspace, allocated by its first call. A first call that is being captured into
// a CUDA graph cannot allocate: it runs without a workspace (a plan of its own).
std::pair<void*, uint64_t> stream_workspace(const char* op, int device, DeviceState& ds,
                                            cudaStream_t stream) {
  const std::optional<StreamKey> key = find_stream_key(op, device, stream);
  if (!key) return {nullptr, 0};  // first seen while capturing: nothing allocated for it yet
  const uint64_t id = key->stream_id;
  std::lock_guard<std::mutex> lock(ds.mu);
  void*& ws = ds.workspaces[id];
  if (!ws) {
    if (capturing(op, stream)) return {nullptr, 0};
    ws = device_alloc(op, ds.workspace_bytes);
  }
  return {ws, ds.workspace_bytes};
}

// The stream's scratch (dequantized operands, fp32 staging, the un-shuffled weight, packed
// scales; kernels/cuda/stream_scratch.h): a caller keeps the lease until its last kernel reading
// the scratch is queued.
StreamScratchPool& gemm_scratch() {
  static StreamScratchPool pool("scratch");
  return pool;
}

std::size_t align256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

cudaDataType_t cuda_type(DType dt) {
  switch (dt) {
    case DType::kBFloat16:
      return CUDA_R_16BF;
    case DType::kFloat16:
      return CUDA_R_16F;
    case DType::kFloat8E4M3FN:
      return CUDA_R_8F_E4M3;
    case DType::kFloat8E5M2:
      return CUDA_R_8F_E5M2;
    default:
      return CUDA_R_32F;
  }
}

// One cached problem: descriptors and the heuristic's algorithm. The layouts are immutable once
// built; the matmul descriptor's pointer attributes (scales, bias) change per call, so setting
// them and the cublasLtMatmul that reads them happen under `mu`. A problem cuBLASLt refuses is
// cached too (found false, with the refusing status), so asking again costs a lookup: the
// heuristic has no algorithm, or a setup call or the first cublasLtMatmul of a declinable
// problem answered lt_refuses() (found then turns false under `mu`, hence atomic).
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo = {};
  std::atomic<bool> found{false};
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;  // written before found turns false
  std::mutex mu;
  ~Plan() {
    if (d) lt().MatrixLayoutDestroy(d);
    if (b) lt().MatrixLayoutDestroy(b);
    if (a) lt().MatrixLayoutDestroy(a);
    if (op) lt().MatmulDescDestroy(op);
  }
};

void set_batch(const char* op, cublasLtMatrixLayout_t l, int64_t batch, int64_t stride) {
  if (batch <= 1) return;
  const auto count = static_cast<int32_t>(batch);
  FLASHINFER_CUBLASLT_CALL(op, lt().MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                             &count, sizeof(count)));
  FLASHINFER_CUBLASLT_CALL(
      op, lt().MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                        sizeof(stride)));
}

// The statuses with which cuBLASLt says no to a problem rather than fails (lt::lt_answer): a
// declinable call (block_scaled_gemm_lt) runs the tiled kernel then.
static_assert(CUBLAS_STATUS_SUCCESS == 0 && CUBLAS_STATUS_INVALID_VALUE == 7 &&
              CUBLAS_STATUS_NOT_SUPPORTED == 15);
bool lt_refuses(cublasStatus_t st) {
  return lt::lt_answer(static_cast<int>(st)) == lt::LtAnswer::kRefuses;
}

// Builds the descriptors of `key` and asks the heuristic once. `scale_placeholder`: a device
// address set as the A and B scale pointers of the block-scaled modes before the heuristic, which
// refuses such a mode whose scale pointer is still unset (CUBLAS_STATUS_INVALID_VALUE; its log:
// "The scaling mode for A scale ... requires a custom pointer for A scale"). Never read: each call
// sets its own pointers before cublasLtMatmul.
std::unique_ptr<Plan> build_plan(const char* op, cublasLtHandle_t h, const lt::LtKey& key,
                                 const void* scale_placeholder) {
  auto plan = std::make_unique<Plan>();
  const lt::ColMajorGemm& c = key.shape;
  FLASHINFER_CUBLASLT_CALL(op, lt().MatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = c.transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = c.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  FLASHINFER_CUBLASLT_CALL(
      op, lt().MatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  FLASHINFER_CUBLASLT_CALL(
      op, lt().MatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (key.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bt = cuda_type(key.bias_type);
    FLASHINFER_CUBLASLT_CALL(op, lt().MatmulDescSetAttribute(
                                     plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    FLASHINFER_CUBLASLT_CALL(
        op, lt().MatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                        sizeof(bt)));
  }
  if (key.scale == lt::ScaleMode::kDeviceAlpha) {
    const cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
    FLASHINFER_CUBLASLT_CALL(op, lt().MatmulDescSetAttribute(
                                     plan->op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof(pm)));
  }
  if (key.scale == lt::ScaleMode::kBlockW1x128 || key.scale == lt::ScaleMode::kBlockW128x128) {
    // A is w, B is x (the TN mapping): x always 1x128, w 1x128 or 128x128.
    const int32_t a_mode = key.scale == lt::ScaleMode::kBlockW1x128
                               ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                               : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    // A cuBLASLt without these modes (before 12.9) refuses the attribute: no plan, tiled kernel.
    for (const auto& [attr, value, size] :
         {std::tuple{CUBLASLT_MATMUL_DESC_A_SCALE_MODE, static_cast<const void*>(&a_mode),
                     sizeof(a_mode)},
          std::tuple{CUBLASLT_MATMUL_DESC_B_SCALE_MODE, static_cast<const void*>(&b_mode),
                     sizeof(b_mode)},
          std::tuple{CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                     static_cast<const void*>(&scale_placeholder), sizeof(scale_placeholder)},
          std::tuple{CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                     static_cast<const void*>(&scale_placeholder), sizeof(scale_placeholder)}}) {
      const cublasStatus_t st = lt().MatmulDescSetAttribute(plan->op, attr, value, size);
      if (lt_refuses(st)) {
        plan->status = st;
        g_plan_builds.fetch_add(1, std::memory_order_relaxed);
        g_lt_refusals.fetch_add(1, std::memory_order_relaxed);
        return plan;
      }
      FLASHINFER_CUBLASLT_CALL(op, st);
    }
  }
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  FLASHINFER_CUBLASLT_CALL(
      op, lt().MatrixLayoutCreate(&plan->a, cuda_type(key.a_type), u(c.k), u(c.m), c.lda));
  FLASHINFER_CUBLASLT_CALL(
      op, lt().MatrixLayoutCreate(&plan->b, cuda_type(key.b_type), u(c.k), u(c.n), c.ldb));
  FLASHINFER_CUBLASLT_CALL(
      op, lt().MatrixLayoutCreate(&plan->d, cuda_type(key.d_type), u(c.m), u(c.n), c.ldd));
  set_batch(op, plan->a, c.batch, c.stride_a);
  set_batch(op, plan->b, c.batch, c.stride_b);
  set_batch(op, plan->d, c.batch, c.stride_d);

  cublasLtMatmulPreference_t pref = nullptr;
  FLASHINFER_CUBLASLT_CALL(op, lt().MatmulPreferenceCreate(&pref));
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { lt().MatmulPreferenceDestroy(p); }
  } guard{pref};
  const uint64_t ws = key.workspace_bytes;
  FLASHINFER_CUBLASLT_CALL(
      op, lt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                            sizeof(ws)));
  // The heuristic assumes 256-byte aligned operands unless told otherwise (the default of
  // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES), and a view with an offset (a sliced `out`, a
  // row range of A) is not. State the real alignment so no algorithm needing more is chosen.
  for (const auto& [attr, value] :
       {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, c.align_a},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, c.align_b},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, c.align_d},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, c.align_d}}) {
    FLASHINFER_CUBLASLT_CALL(op,
                             lt().MatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
  }
  cublasLtMatmulHeuristicResult_t heur = {};
  int found = 0;
  const cublasStatus_t st = lt().MatmulAlgoGetHeuristic(h, plan->op, plan->a, plan->b, plan->d,
                                                        plan->d, pref, 1, &heur, &found);
  if (!lt_refuses(st)) {
    FLASHINFER_CUBLASLT_CALL(op, st);
  }
  plan->status = st;
  plan->algo = heur.algo;
  plan->found = lt::lt_answer(static_cast<int>(st), found > 0) == lt::LtAnswer::kServes;
  g_plan_builds.fetch_add(1, std::memory_order_relaxed);
  if (!plan->found) g_lt_refusals.fetch_add(1, std::memory_order_relaxed);
  return plan;
}

// kUnsupported for a plan the heuristic found no algorithm for.
void require_algorithm(const char* op, const Plan& plan, const lt::LtKey& key) {
  const lt::ColMajorGemm& c = key.shape;
  FLASHINFER_CHECK_CODE(plan.found, ErrorCode::kUnsupported, op, "",
                        "cuBLASLt has no algorithm for this problem (m=", c.n, ", n=", c.m,
                        ", k=", c.k, ", batch=", c.batch, "; status ",
                        lt().GetStatusName(plan.status), ")");
}

// The cached plan of `key`, built on first use (possibly one without an algorithm: Plan::found).
// Plans are never evicted (one per shape a process runs; each holds a few small host
// descriptors).
Plan& find_plan(const char* op, cublasLtHandle_t h, const lt::LtKey& key,
                const void* scale_placeholder) {
  static std::mutex mu;
  static auto& cache = *new std::unordered_map<lt::LtKey, std::unique_ptr<Plan>, lt::LtKeyHash>;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) {
      g_plan_hits.fetch_add(1, std::memory_order_relaxed);
      return *it->second;
    }
  }
  // Built outside the lock (the heuristic takes a while); a racing builder's plan is dropped.
  std::unique_ptr<Plan> plan = build_plan(op, h, key, scale_placeholder);
  std::lock_guard<std::mutex> lock(mu);
  return *cache.emplace(key, std::move(plan)).first->second;
}

// Row-major out[m, n] = x[m, k] @ w^T, where w is [n, k] with row stride ldw (i.e. the logical
// column-major [k, n] B), through the TN mapping of kernels/cublaslt_plan.h.
struct LtProblem {
  lt::RowMajorGemm g;
  const void* w;
  const void* x;
  void* d;
  const float* w_scale = nullptr;  // fp8 dequantization scales (device)
  const float* x_scale = nullptr;
  const float* alpha_device = nullptr;  // device alpha (and then a device beta of 0)
  const void* bias = nullptr;           // [n] of bias_type, contiguous
  DType bias_type = DType::kBFloat16;
  // Block scales (kBlockW1x128 / kBlockW128x128; w_scale and x_scale then point at them in
  // cuBLASLt's layouts); kNone: the mode follows from the pointers above.
  lt::ScaleMode block = lt::ScaleMode::kNone;
};

// Runs `pr`, calling `before(pr)` first once the plan is known to have an algorithm: it leases
// the scratch, points pr's scratch operands (w, scales) at it and launches the kernels that fill
// it, so a refused problem touches no scratch (no growth, none under graph capture either).
// Where cuBLASLt refuses the problem (no algorithm, or lt_refuses() at setup or from the first
// cublasLtMatmul, remembered in the plan): false when `may_decline` (nothing but scratch writes
// was queued), else kUnsupported.
template <class Before>
bool lt_matmul(const char* op, LtProblem pr, cudaStream_t stream, bool may_decline,
               Before&& before) {
  pr.g.x_addr = reinterpret_cast<std::uintptr_t>(pr.x);
  pr.g.w_addr = reinterpret_cast<std::uintptr_t>(pr.w);
  pr.g.d_addr = reinterpret_cast<std::uintptr_t>(pr.d);
  int device = 0;
  FLASHINFER_CUDA_CALL(op, cudaGetDevice(&device));
  DeviceState& ds = device_state(op, device);
  const auto [workspace, ws_bytes] = stream_workspace(op, device, ds, stream);
  const lt::ScaleMode scale = pr.block != lt::ScaleMode::kNone ? pr.block
                              : pr.alpha_device                ? lt::ScaleMode::kDeviceAlpha
                              : (pr.w_scale || pr.x_scale)     ? lt::ScaleMode::kTensorScales
                                                               : lt::ScaleMode::kNone;
  const lt::LtKey key =
      lt::make_key(device, pr.g, pr.bias != nullptr, pr.bias_type, scale, ws_bytes);
  Plan& plan = find_plan(op, ds.handle, key, ds.zero);
  if (!plan.found && may_decline) {
    g_declined_calls.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  require_algorithm(op, plan, key);
  before(pr);
  const float host_alpha = 1.0f, host_beta = 0.0f;
  const void* alpha = pr.alpha_device ? static_cast<const void*>(pr.alpha_device) : &host_alpha;
  const void* beta = pr.alpha_device ? static_cast<const void*>(ds.zero) : &host_beta;
  std::lock_guard<std::mutex> lock(plan.mu);
  if (scale != lt::ScaleMode::kNone && scale != lt::ScaleMode::kDeviceAlpha) {
    FLASHINFER_CUBLASLT_CALL(
        op, lt().MatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pr.w_scale,
                                        sizeof(pr.w_scale)));
    FLASHINFER_CUBLASLT_CALL(
        op, lt().MatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pr.x_scale,
                                        sizeof(pr.x_scale)));
  }
  if (pr.bias) {
    FLASHINFER_CUBLASLT_CALL(
        op, lt().MatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &pr.bias,
                                        sizeof(pr.bias)));
  }
  const cublasStatus_t st =
      lt().Matmul(ds.handle, plan.op, alpha, pr.w, plan.a, pr.x, plan.b, beta, pr.d, plan.d, pr.d,
                  plan.d, &plan.algo, workspace, ws_bytes, stream);
  if (may_decline && lt_refuses(st)) {
    // Checked before anything is launched: nothing of cuBLASLt's was queued.
    plan.status = st;
    plan.found = false;
    g_lt_refusals.fetch_add(1, std::memory_order_relaxed);
    g_declined_calls.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  FLASHINFER_CUBLASLT_CALL(op, st);
  return true;
}

void lt_matmul(const char* op, const LtProblem& pr, cudaStream_t stream) {
  lt_matmul(op, pr, stream, false, [](LtProblem&) {});
}

// One thread per element: packed e2m1 [rows, k/2] with block scales -> bf16 [rows, k]. The
// product of an e2m1 value and an e4m3/ue8m0 scale has at most 6 significant bits, so the bf16
// result is exact and equals the CPU's fp32 tile.
__global__ void dequant_fp4_kernel(const uint8_t* data, int64_t stride, const uint8_t* sf,
                                   SfLayoutCode layout, bool ue8m0, int block, int64_t rows,
                                   int64_t k, __nv_bfloat16* out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * k) return;
  const int64_t r = idx / k, c = idx % k;
  const uint8_t s = sf[sf_offset(layout, r, c / block, k / block)];
  const float scale =
      ue8m0 ? ue8m0_to_float(s) : detail::DecodeMinifloat<4, 3, detail::Specials::kFiniteNan>(s);
  const uint8_t byte = data[r * stride + c / 2];
  const float q = detail::DecodeMinifloat<2, 1, detail::Specials::kNone>(
      (c & 1) == 0 ? e2m1x2_low(byte) : e2m1x2_high(byte));
  out[idx] = __float2bfloat16_rn(__fmul_rn(q, scale));
}

void dequant(const char* op, const uint8_t* data, int64_t stride, const uint8_t* sf,
             SfLayoutCode layout, bool ue8m0, int block, int64_t rows, int64_t k,
             __nv_bfloat16* out, cudaStream_t stream) {
  const int64_t total = rows * k;
  constexpr int kThreads = 256;
  dequant_fp4_kernel<<<static_cast<unsigned>((total + kThreads - 1) / kThreads), kThreads, 0,
                       stream>>>(data, stride, sf, layout, ue8m0, block, rows, k, out);
  FLASHINFER_CUDA_CALL(op, cudaGetLastError());
}

// cuBLASLt has no bf16 x bf16 -> fp16 GEMM. For that combination the product goes to an fp32
// buffer, and this kernel adds the bias and rounds once to fp16 (the same single rounding as the
// CPU backend).
__global__ void fp32_to_half_kernel(const float* src, int64_t batch, int64_t m, int64_t n,
                                    const __nv_bfloat16* bias, __half* out, int64_t stride_b,
                                    int64_t stride_m) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= batch * m * n) return;
  const int64_t j = idx % n, i = (idx / n) % m, b = idx / (m * n);
  float v = src[idx];
  if (bias) v = __fadd_rn(v, __bfloat162float(bias[j]));
  out[b * stride_b + i * stride_m + j] = __float2half_rn(v);
}

// Bytes of fp32 staging matmul_to_out needs for `g` (0 when cuBLASLt writes out directly).
std::size_t staging_bytes(const lt::RowMajorGemm& g) {
  if (!(g.x_type == DType::kBFloat16 && g.d_type == DType::kFloat16)) return 0;
  return align256(static_cast<std::size_t>(g.batch * g.m * g.n) * sizeof(float));
}

// Runs `pr`, going through fp32 when cuBLASLt cannot write the requested output type directly;
// `staging` is at least staging_bytes(pr.g) of scratch then.
void matmul_to_out(const char* op, LtProblem pr, void* staging, cudaStream_t stream) {
  if (staging_bytes(pr.g) == 0) {
    lt_matmul(op, pr, stream);
    return;
  }
  const int64_t total = pr.g.batch * pr.g.m * pr.g.n;
  auto* out = static_cast<__half*>(pr.d);
  const int64_t stride_b = pr.g.stride_d, stride_m = pr.g.ldd;
  const auto* bias = static_cast<const __nv_bfloat16*>(pr.bias);
  pr.d = staging;
  pr.g.d_type = DType::kFloat32;
  pr.g.ldd = pr.g.n;
  pr.g.stride_d = pr.g.m * pr.g.n;
  pr.bias = nullptr;
  lt_matmul(op, pr, stream);
  constexpr int kThreads = 256;
  fp32_to_half_kernel<<<static_cast<unsigned>((total + kThreads - 1) / kThreads), kThreads, 0,
                        stream>>>(static_cast<const float*>(staging), pr.g.batch, pr.g.m, pr.g.n,
                                  bias, out, stride_b, stride_m);
  FLASHINFER_CUDA_CALL(op, cudaGetLastError());
}

// mm_fp8's prepared weight [k/128, n, 128] (rows shuffled in blocks of 32, low_latency_row)
// back to the dense row-major [n, k] cuBLASLt reads: one thread per 16 bytes, a plain copy.
__global__ void unshuffle_low_latency_kernel(const uint4* src, int64_t n, int64_t k, uint4* dst) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t chunks = k / 16;  // 16-byte chunks per row
  if (idx >= n * chunks) return;
  const int64_t j = idx / chunks, c = idx % chunks;
  dst[idx] = src[lt::low_latency_offset(j, c * 16, n) / 16];  // 16 bytes within one 128-block
}

// One operand's fp32 block scales ([rows, kblocks] through the strides; rows are row blocks for
// 128x128) into cuBLASLt's layout (lt::block_scale_index): one thread per scale.
__global__ void pack_block_scales_kernel(const float* src, int64_t stride_row, int64_t stride_k,
                                         int64_t rows, int64_t kblocks, lt::BlockScaleLayout layout,
                                         float* dst) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * kblocks) return;
  const int64_t r = idx / kblocks, kb = idx % kblocks;
  dst[lt::block_scale_index(layout, r, kb, rows, kblocks)] = src[r * stride_row + kb * stride_k];
}

unsigned blocks_for(int64_t total, int threads) {
  return static_cast<unsigned>((total + threads - 1) / threads);
}

// The current device's compute capability (major * 10 + minor), asked once per device.
int current_cc(const char* op) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};
  int device = 0;
  FLASHINFER_CUDA_CALL(op, cudaGetDevice(&device));
  if (device >= 0 && device < kMaxDevices) {
    if (const int cc = cached[device].load(std::memory_order_relaxed)) return cc;
  }
  const int cc = detail::cuda_compute_capability(device);
  if (device >= 0 && device < kMaxDevices) cached[device].store(cc, std::memory_order_relaxed);
  return cc;
}

}  // namespace

void gemm(const GemmParams& p, void* stream, const char* op, bool pdl) {
  (void)pdl;  // cuBLASLt launches its own kernels; PDL does not change the numbers
  FLASHINFER_CHECK_CODE(p.out_stride_n == 1 || p.n == 1, ErrorCode::kUnsupported, op, "out",
                        "the CUDA backend needs out with unit stride in its last dimension");
  FLASHINFER_CHECK_CODE(p.bias == nullptr || p.bias_stride == 1, ErrorCode::kUnsupported, op,
                        "bias", "the CUDA backend needs a contiguous bias");
  const auto s = static_cast<cudaStream_t>(stream);
  LtProblem pr{};
  pr.g = lt::row_major_gemm(p);
  pr.w = p.b;
  pr.x = p.a;
  pr.d = p.out;
  pr.w_scale = p.b_scale;
  pr.x_scale = p.a_scale;
  pr.bias = p.bias;
  pr.bias_type = p.bias_dtype;
  if (dtype_is_fp8(p.a_dtype) || dtype_is_fp8(p.b_dtype)) {
    // The API refuses these by argument first; this keeps a bare CUBLAS_STATUS_NOT_SUPPORTED
    // from ever surfacing should a caller skip it.
    const lt::LtRefusal r = lt::fp8_refusal(pr.g);
    FLASHINFER_CHECK_CODE(!r.refused(), ErrorCode::kUnsupported, op,
                          r.operand == lt::Operand::kD   ? "out"
                          : r.operand == lt::Operand::kW ? "B"
                                                         : "A",
                          r.reason);
  }
  const std::size_t staging = staging_bytes(pr.g);
  StreamScratch buf;  // held until the fp32 -> fp16 pass is queued
  if (staging) buf = gemm_scratch().acquire(op, s, staging);
  matmul_to_out(op, pr, buf.data(), s);
}

void mm_fp4(const Fp4GemmParams& p, void* stream, bool enable_pdl) {
  (void)enable_pdl;
  const char* op = "mm_fp4";
  auto s = static_cast<cudaStream_t>(stream);
  FLASHINFER_CHECK_CODE(p.out_stride_n == 1 || p.n == 1, ErrorCode::kUnsupported, op, "out",
                        "the CUDA backend needs out with unit stride in its last dimension");
  LtProblem pr{};
  pr.g.batch = 1;
  pr.g.m = p.m;
  pr.g.n = p.n;
  pr.g.k = p.k;
  pr.g.x_type = pr.g.w_type = DType::kBFloat16;
  pr.g.d_type = p.out_dtype;
  pr.g.ldx = pr.g.ldw = p.k;
  pr.g.ldd = p.out_stride_m;
  // One scratch block: dequantized a, dequantized b, then the fp32 staging if any.
  const std::size_t a_bytes = align256(static_cast<std::size_t>(p.m * p.k) * 2);
  const std::size_t b_bytes = align256(static_cast<std::size_t>(p.n * p.k) * 2);
  const std::size_t staging = staging_bytes(pr.g);
  // Held until the matmul (and the fp16 pass) reading the dequantized operands are queued.
  const StreamScratch buf = gemm_scratch().acquire(op, s, a_bytes + b_bytes + staging);
  auto* base = static_cast<char*>(buf.data());
  auto* da = reinterpret_cast<__nv_bfloat16*>(base);
  auto* db = reinterpret_cast<__nv_bfloat16*>(base + a_bytes);
  dequant(op, p.a, p.a_stride_m, p.a_sf, p.a_layout, p.ue8m0, p.block, p.m, p.k, da, s);
  dequant(op, p.b, p.b_stride_n, p.b_sf, p.b_layout, p.ue8m0, p.block, p.n, p.k, db, s);
  pr.w = db;
  pr.x = da;
  pr.d = p.out;
  pr.alpha_device = p.alpha;
  matmul_to_out(op, pr, staging ? base + a_bytes + b_bytes : nullptr, s);
}

bool block_scaled_gemm_lt(const BlockScaledGemmParams& p, void* stream, const char* op) {
  const auto s = static_cast<cudaStream_t>(stream);
  // The route first: a problem for the tiled kernel (the bf16 router GEMMs share this entry)
  // must not open cuBLASLt.
  const lt::Fp8Route route = lt::fp8_route(p, current_cc(op));
  if (route.path == lt::Fp8Path::kTiled) return false;
  LtProblem pr{};
  pr.g = lt::fp8_row_major(p);
  pr.x = p.a;
  pr.d = p.out;
  constexpr int kThreads = 256;
  // Leased inside lt_matmul once the plan has an algorithm, held until the matmul reading the
  // un-shuffled weight or the packed scales is queued.
  StreamScratch buf;
  const auto lease = [&] {
    buf = gemm_scratch().acquire(op, s, lt::fp8_scratch_bytes(p, route.path));
    return static_cast<char*>(buf.data());
  };
  if (route.path == lt::Fp8Path::kLtTensor) {
    pr.w_scale = p.alpha;  // alpha as A's scale: D = scale_a * (w x)^T, B's scale 1
    // pr.w (the scratch) is null until leased: the key takes it as 256-byte aligned, as it is.
    return lt_matmul(op, pr, s, /*may_decline=*/true, [&](LtProblem& q) {
      char* scratch = lease();
      q.w = scratch;
      const int64_t chunks = p.n * (p.k / 16);
      unshuffle_low_latency_kernel<<<blocks_for(chunks, kThreads), kThreads, 0, s>>>(
          static_cast<const uint4*>(p.b), p.n, p.k, reinterpret_cast<uint4*>(scratch));
      FLASHINFER_CUDA_CALL(op, cudaGetLastError());
    });
  }
  // kLtBlock: x's 1x128 scales, then w's 1x128 or 128x128 scales, in cuBLASLt's layouts.
  const int64_t kb = p.k / 128, w_rows = p.gn == 1 ? p.n : (p.n + 127) / 128;
  pr.w = p.b;
  pr.block = route.scale;
  return lt_matmul(op, pr, s, /*may_decline=*/true, [&](LtProblem& q) {
    char* scratch = lease();
    auto* xs = reinterpret_cast<float*>(scratch);
    auto* ws = reinterpret_cast<float*>(scratch + align256(static_cast<std::size_t>(p.m * kb) * 4));
    q.x_scale = xs;
    q.w_scale = ws;
    pack_block_scales_kernel<<<blocks_for(p.m * kb, kThreads), kThreads, 0, s>>>(
        p.a_scale, p.sa_stride_m, p.sa_stride_k, p.m, kb, lt::BlockScaleLayout::kVec128, xs);
    FLASHINFER_CUDA_CALL(op, cudaGetLastError());
    pack_block_scales_kernel<<<blocks_for(w_rows * kb, kThreads), kThreads, 0, s>>>(
        p.b_scale, p.sb_stride_n, p.sb_stride_k, w_rows, kb,
        p.gn == 1 ? lt::BlockScaleLayout::kVec128 : lt::BlockScaleLayout::kBlk128x128, ws);
    FLASHINFER_CUDA_CALL(op, cudaGetLastError());
  });
}

CublasLtStats cublaslt_stats() {
  return {g_plan_builds.load(std::memory_order_relaxed),
          g_plan_hits.load(std::memory_order_relaxed),
          g_device_allocs.load(std::memory_order_relaxed) + gemm_scratch().allocations(),
          g_device_bytes.load(std::memory_order_relaxed) + gemm_scratch().allocated_bytes(),
          g_lt_refusals.load(std::memory_order_relaxed),
          g_declined_calls.load(std::memory_order_relaxed)};
}

std::string cublaslt_load_error() { return cublaslt_api().error; }

}  // namespace flashinfer::kernels::cuda
