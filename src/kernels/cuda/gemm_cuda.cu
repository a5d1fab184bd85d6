#include <cublasLt.h>

#include <cstdint>
#include <utility>

#include "flashinfer/float_formats.h"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/gemm_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

#define FLASHINFER_CUBLASLT_CALL(op, expr)                           \
  do {                                                               \
    cublasStatus_t st_ = (expr);                                     \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                              \
      FLASHINFER_FAIL(::flashinfer::ErrorCode::kCuda, op, "", #expr, \
                      " failed: ", cublasLtGetStatusName(st_), ": ", \
                      cublasLtGetStatusString(st_));                 \
    }                                                                \
  } while (0)

constexpr size_t kWorkspaceBytes = 32u << 20;

// One handle per thread, created on first use. It is deliberately never destroyed: destroying it
// from a thread-exit or static destructor can run after the CUDA context is gone.
cublasLtHandle_t handle(const char* op) {
  thread_local cublasLtHandle_t h = nullptr;
  if (!h) FLASHINFER_CUBLASLT_CALL(op, cublasLtCreate(&h));
  return h;
}

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

// RAII for the cuBLASLt descriptors of one call.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (this->op) cublasLtMatmulDescDestroy(this->op);
  }
};

struct DeviceBuffer {
  void* ptr = nullptr;
  cudaStream_t stream = nullptr;
  ~DeviceBuffer() {
    if (ptr) cudaFreeAsync(ptr, stream);
  }
};

void set_batch(const char* op, cublasLtMatrixLayout_t l, int32_t batch, int64_t stride) {
  if (batch <= 1) return;
  FLASHINFER_CUBLASLT_CALL(op, cublasLtMatrixLayoutSetAttribute(
                                   l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
  FLASHINFER_CUBLASLT_CALL(
      op, cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                           sizeof(stride)));
}

// Largest power of two (at most 256) dividing the address of every batch's matrix.
uint32_t alignment_bytes(const void* ptr, DType dt, int64_t batch, int64_t batch_stride) {
  uint64_t bits = reinterpret_cast<std::uintptr_t>(ptr) | 256u;
  if (batch > 1) bits |= static_cast<uint64_t>(batch_stride) * dtype_size(dt);
  return static_cast<uint32_t>(bits & (~bits + 1));  // lowest set bit
}

// Row-major out[m, n] = x[m, k] @ w^T, where w is [n, k] with row stride ldw (i.e. the logical
// column-major [k, n] B). In cuBLASLt's column-major terms this is D(n x m) = W^T(n x k) X(k x m):
// matrix A = w (k x n, ld ldw, transposed), matrix B = x (k x m, ld ldx), which is the "TN" form
// fp8 kernels require.
struct LtProblem {
  const void* w;
  DType w_type;
  int64_t ldw, stride_w;
  const void* x;
  DType x_type;
  int64_t ldx, stride_x;
  void* d;
  DType d_type;
  int64_t ldd, stride_d;
  int64_t batch, m, n, k;
  const float* w_scale = nullptr;  // fp8 dequantization scales (device)
  const float* x_scale = nullptr;
  const float* alpha_device = nullptr;  // device alpha (and then a device beta of 0)
  const void* bias = nullptr;           // [n] of bias_type, contiguous
  DType bias_type = DType::kBFloat16;
};

void lt_matmul(const char* op, const LtProblem& pr, cudaStream_t stream) {
  cublasLtHandle_t h = handle(op);
  Descs ds;
  FLASHINFER_CUBLASLT_CALL(op, cublasLtMatmulDescCreate(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  FLASHINFER_CUBLASLT_CALL(
      op, cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  FLASHINFER_CUBLASLT_CALL(
      op, cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (pr.w_scale) {
    FLASHINFER_CUBLASLT_CALL(
        op, cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pr.w_scale,
                                           sizeof(pr.w_scale)));
  }
  if (pr.x_scale) {
    FLASHINFER_CUBLASLT_CALL(
        op, cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pr.x_scale,
                                           sizeof(pr.x_scale)));
  }
  if (pr.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bt = cuda_type(pr.bias_type);
    FLASHINFER_CUBLASLT_CALL(op, cublasLtMatmulDescSetAttribute(
                                     ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    FLASHINFER_CUBLASLT_CALL(
        op, cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &pr.bias,
                                           sizeof(pr.bias)));
    FLASHINFER_CUBLASLT_CALL(op, cublasLtMatmulDescSetAttribute(
                                     ds.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
  }
  if (pr.alpha_device) {
    const cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
    FLASHINFER_CUBLASLT_CALL(op, cublasLtMatmulDescSetAttribute(
                                     ds.op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof(pm)));
  }
  // A single row/column may come with any stride; cuBLASLt wants ld >= rows.
  const uint64_t k = static_cast<uint64_t>(pr.k), n = static_cast<uint64_t>(pr.n),
                 m = static_cast<uint64_t>(pr.m);
  const int64_t ldw = pr.n == 1 ? pr.k : pr.ldw;
  const int64_t ldx = pr.m == 1 ? pr.k : pr.ldx;
  const int64_t ldd = pr.m == 1 ? pr.n : pr.ldd;
  FLASHINFER_CUBLASLT_CALL(op, cublasLtMatrixLayoutCreate(&ds.a, cuda_type(pr.w_type), k, n, ldw));
  FLASHINFER_CUBLASLT_CALL(op, cublasLtMatrixLayoutCreate(&ds.b, cuda_type(pr.x_type), k, m, ldx));
  FLASHINFER_CUBLASLT_CALL(op, cublasLtMatrixLayoutCreate(&ds.d, cuda_type(pr.d_type), n, m, ldd));
  const auto batch = static_cast<int32_t>(pr.batch);
  set_batch(op, ds.a, batch, pr.stride_w);
  set_batch(op, ds.b, batch, pr.stride_x);
  set_batch(op, ds.d, batch, pr.stride_d);

  FLASHINFER_CUBLASLT_CALL(op, cublasLtMatmulPreferenceCreate(&ds.pref));
  const uint64_t ws = kWorkspaceBytes;
  FLASHINFER_CUBLASLT_CALL(
      op, cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &ws, sizeof(ws)));
  // The heuristic assumes 256-byte aligned operands unless told otherwise (the default of
  // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES), and a view with an offset (a sliced `out`, a
  // row range of A) is not. State the real alignment so no algorithm needing more is chosen.
  const uint32_t align_w = alignment_bytes(pr.w, pr.w_type, pr.batch, pr.stride_w);
  const uint32_t align_x = alignment_bytes(pr.x, pr.x_type, pr.batch, pr.stride_x);
  const uint32_t align_d = alignment_bytes(pr.d, pr.d_type, pr.batch, pr.stride_d);
  for (const auto& [attr, value] :
       {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_w},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_x},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}}) {
    FLASHINFER_CUBLASLT_CALL(
        op, cublasLtMatmulPreferenceSetAttribute(ds.pref, attr, &value, sizeof(value)));
  }
  cublasLtMatmulHeuristicResult_t heur = {};
  int found = 0;
  FLASHINFER_CUBLASLT_CALL(op, cublasLtMatmulAlgoGetHeuristic(h, ds.op, ds.a, ds.b, ds.d, ds.d,
                                                              ds.pref, 1, &heur, &found));
  FLASHINFER_CHECK_CODE(found > 0, ErrorCode::kUnsupported, op, "",
                        "cuBLASLt has no algorithm for this problem (m=", pr.m, ", n=", pr.n,
                        ", k=", pr.k, ", batch=", pr.batch, ")");

  DeviceBuffer workspace{nullptr, stream};
  FLASHINFER_CUDA_CALL(op, cudaMallocAsync(&workspace.ptr, kWorkspaceBytes, stream));
  DeviceBuffer consts{nullptr, stream};
  const float host_alpha = 1.0f, host_beta = 0.0f;
  const void* alpha = &host_alpha;
  const void* beta = &host_beta;
  if (pr.alpha_device) {
    FLASHINFER_CUDA_CALL(op, cudaMallocAsync(&consts.ptr, sizeof(float), stream));
    FLASHINFER_CUDA_CALL(op, cudaMemsetAsync(consts.ptr, 0, sizeof(float), stream));
    alpha = pr.alpha_device;
    beta = consts.ptr;
  }
  FLASHINFER_CUBLASLT_CALL(
      op, cublasLtMatmul(h, ds.op, alpha, pr.w, ds.a, pr.x, ds.b, beta, pr.d, ds.d, pr.d, ds.d,
                         &heur.algo, workspace.ptr, kWorkspaceBytes, stream));
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

// Runs `pr`, going through fp32 when cuBLASLt cannot write the requested output type directly.
void matmul_to_out(const char* op, LtProblem pr, cudaStream_t stream) {
  if (!(pr.x_type == DType::kBFloat16 && pr.d_type == DType::kFloat16)) {
    lt_matmul(op, pr, stream);
    return;
  }
  DeviceBuffer tmp{nullptr, stream};
  const int64_t total = pr.batch * pr.m * pr.n;
  FLASHINFER_CUDA_CALL(op, cudaMallocAsync(&tmp.ptr, total * sizeof(float), stream));
  auto* out = static_cast<__half*>(pr.d);
  const int64_t stride_b = pr.stride_d, stride_m = pr.ldd;
  const auto* bias = static_cast<const __nv_bfloat16*>(pr.bias);
  pr.d = tmp.ptr;
  pr.d_type = DType::kFloat32;
  pr.ldd = pr.n;
  pr.stride_d = pr.m * pr.n;
  pr.bias = nullptr;
  lt_matmul(op, pr, stream);
  constexpr int kThreads = 256;
  fp32_to_half_kernel<<<static_cast<unsigned>((total + kThreads - 1) / kThreads), kThreads, 0,
                        stream>>>(static_cast<const float*>(tmp.ptr), pr.batch, pr.m, pr.n, bias,
                                  out, stride_b, stride_m);
  FLASHINFER_CUDA_CALL(op, cudaGetLastError());
}

}  // namespace

void gemm(const GemmParams& p, void* stream, const char* op, bool pdl) {
  (void)pdl;  // cuBLASLt launches its own kernels; PDL does not change the numbers
  FLASHINFER_CHECK_CODE(p.out_stride_n == 1 || p.n == 1, ErrorCode::kUnsupported, op, "out",
                        "the CUDA backend needs out with unit stride in its last dimension");
  FLASHINFER_CHECK_CODE(p.bias == nullptr || p.bias_stride == 1, ErrorCode::kUnsupported, op,
                        "bias", "the CUDA backend needs a contiguous bias");
  LtProblem pr{};
  pr.w = p.b;
  pr.w_type = p.b_dtype;
  pr.ldw = p.b_stride_n;
  pr.stride_w = p.b_stride_b;
  pr.x = p.a;
  pr.x_type = p.a_dtype;
  pr.ldx = p.a_stride_m;
  pr.stride_x = p.a_stride_b;
  pr.d = p.out;
  pr.d_type = p.out_dtype;
  pr.ldd = p.out_stride_m;
  pr.stride_d = p.out_stride_b;
  pr.batch = p.batch;
  pr.m = p.m;
  pr.n = p.n;
  pr.k = p.k;
  pr.w_scale = p.b_scale;
  pr.x_scale = p.a_scale;
  pr.bias = p.bias;
  pr.bias_type = p.bias_dtype;
  matmul_to_out(op, pr, static_cast<cudaStream_t>(stream));
}

void mm_fp4(const Fp4GemmParams& p, void* stream, bool enable_pdl) {
  (void)enable_pdl;
  const char* op = "mm_fp4";
  auto s = static_cast<cudaStream_t>(stream);
  FLASHINFER_CHECK_CODE(p.out_stride_n == 1 || p.n == 1, ErrorCode::kUnsupported, op, "out",
                        "the CUDA backend needs out with unit stride in its last dimension");
  DeviceBuffer a{nullptr, s}, b{nullptr, s};
  FLASHINFER_CUDA_CALL(op, cudaMallocAsync(&a.ptr, p.m * p.k * sizeof(__nv_bfloat16), s));
  FLASHINFER_CUDA_CALL(op, cudaMallocAsync(&b.ptr, p.n * p.k * sizeof(__nv_bfloat16), s));
  auto* da = static_cast<__nv_bfloat16*>(a.ptr);
  auto* db = static_cast<__nv_bfloat16*>(b.ptr);
  dequant(op, p.a, p.a_stride_m, p.a_sf, p.a_layout, p.ue8m0, p.block, p.m, p.k, da, s);
  dequant(op, p.b, p.b_stride_n, p.b_sf, p.b_layout, p.ue8m0, p.block, p.n, p.k, db, s);
  LtProblem pr{};
  pr.w = db;
  pr.w_type = DType::kBFloat16;
  pr.ldw = p.k;
  pr.x = da;
  pr.x_type = DType::kBFloat16;
  pr.ldx = p.k;
  pr.d = p.out;
  pr.d_type = p.out_dtype;
  pr.ldd = p.out_stride_m;
  pr.batch = 1;
  pr.m = p.m;
  pr.n = p.n;
  pr.k = p.k;
  pr.alpha_device = p.alpha;
  matmul_to_out(op, pr, s);
}

}  // namespace flashinfer::kernels::cuda
