// Public GEMM ops (flashinfer.gemm.gemm_base): declarations, argument checks, dispatch.
#include "flashinfer/ops/gemm.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "api/backends.h"
#include "api/bench_backend.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/gemm_params.h"
#include "api/kernel_table.h"
#include "api/trtllm_weight_shuffle.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/ops/nvfp4.h"
#include "flashinfer/ops/quantization.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cublaslt_plan.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/gemm_cuda.h"
#endif
#if FLASHINFER_WITH_CUDNN
#include "kernels/cuda/gemm_cudnn.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kGemmBaseModule = "flashinfer.gemm.gemm_base";

// ---- backends (src/api/kernel_table.h) -------------------------------------------------------

using api::KernelEntry;
using api::LaunchContext;

// A GEMM launch: the kernel parameters, the op the CUDA launcher names in its errors, and
// whether the caller asked for backend "cudnn".
struct GemmCall {
  kernels::GemmParams p;
  const char* op;
  bool cudnn = false;
};

#if FLASHINFER_WITH_CUDA
// The CUDA GEMM of `g`: cuDNN's graph for backend "cudnn" where the build has cuDNN, else
// cuBLASLt. `lt_serves_cudnn`: the bf16 GEMMs, whose default backend is "cudnn", fall back to
// cuBLASLt where libcudnn cannot be opened or cuDNN has no execution plan for the problem
// (api/backends.cpp describes it so), so that default calls run wherever cuBLASLt's do; bmm_fp8
// then fails naming its backend argument.
void cuda_gemm(const GemmCall& g, const LaunchContext& c, bool lt_serves_cudnn) {
#if FLASHINFER_WITH_CUDNN
  if (g.cudnn && !(lt_serves_cudnn && !kernels::cuda::cudnn_load_error().empty()) &&
      kernels::cuda::cudnn_gemm(g.p, c.stream, g.op, lt_serves_cudnn)) {
    return;
  }
#else
  (void)lt_serves_cudnn;
#endif
  kernels::cuda::gemm(g.p, c.stream, g.op, c.enable_pdl);
}

#if FLASHINFER_WITH_CUDNN
constexpr const char* kBf16CudaImpl =
    "cuBLASLt bf16 GEMM (fp16 output through an fp32 buffer); cuDNN graph for backend 'cudnn'";
constexpr const char* kFp8CudaImpl =
    "cuBLASLt fp8 GEMM (sm89+; k and n multiples of 16, 16-byte aligned rows and matrices); "
    "cuDNN graph for backend 'cudnn'";
#else
constexpr const char* kBf16CudaImpl = "cuBLASLt bf16 GEMM (fp16 output through an fp32 buffer)";
constexpr const char* kFp8CudaImpl =
    "cuBLASLt fp8 GEMM (sm89+; k and n multiples of 16, 16-byte aligned rows and matrices)";
#endif
#endif  // FLASHINFER_WITH_CUDA

constexpr const char* kCpuGemm =
    "CPU reference: fp32 accumulation; small m reads B in place (AVX-512/AVX2, OpenMP), "
    "otherwise OpenBLAS sgemm";

// mm_bf16 and bmm_bf16.
constexpr KernelEntry<GemmCall> kBf16GemmKernels[] = {
    {DeviceType::kCPU, kCpuGemm, nullptr,
     [](const GemmCall& g, const LaunchContext&) { kernels::cpu::gemm(g.p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, kBf16CudaImpl, nullptr,
     [](const GemmCall& g, const LaunchContext& c) { cuda_gemm(g, c, true); }},
#endif
};

// bmm_fp8. cuBLASLt's fp8 kernels take only what kernels/cublaslt_plan.h's fp8_refusal()
// accepts (k and n multiples of 16, 16-byte leading dimensions and matrix starts); anything else
// is refused naming the argument, before cuBLASLt could answer CUBLAS_STATUS_NOT_SUPPORTED. The
// CPU reference takes any; backend "cudnn" leaves the choice to cuDNN's heuristics, which refuse
// a problem without an engine naming the backend.
constexpr KernelEntry<GemmCall> kFp8GemmKernels[] = {
    {DeviceType::kCPU, kCpuGemm, nullptr,
     [](const GemmCall& g, const LaunchContext&) { kernels::cpu::gemm(g.p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, kFp8CudaImpl,
     [](const GemmCall& g) {
       if (g.cudnn) return api::Refusal{};
       const kernels::lt::LtRefusal r = kernels::lt::fp8_refusal(kernels::lt::row_major_gemm(g.p));
       if (!r.refused()) return api::Refusal{};
       using kernels::lt::Operand;
       return api::Refusal{r.operand == Operand::kD   ? "out"
                           : r.operand == Operand::kW ? "B"
                                                      : "A",
                           r.reason};
     },
     [](const GemmCall& g, const LaunchContext& c) { cuda_gemm(g, c, false); }},
#endif
};

// mm_fp4.
constexpr KernelEntry<kernels::Fp4GemmParams> kFp4GemmKernels[] = {
    {DeviceType::kCPU, "CPU reference: fp32 tiles of the dequantized operands, OpenBLAS sgemm",
     nullptr,
     [](const kernels::Fp4GemmParams& p, const LaunchContext&) { kernels::cpu::mm_fp4(p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "fp4 dequantization kernel + cuBLASLt bf16 GEMM", nullptr,
     [](const kernels::Fp4GemmParams& p, const LaunchContext& c) {
       kernels::cuda::mm_fp4(p, c.stream, c.enable_pdl);
     }},
#endif
};

void check_out_dtype(DType dt, const char* op, const char* arg) {
  FLASHINFER_CHECK(dt == DType::kBFloat16 || dt == DType::kFloat16, op, arg, "output dtype ",
                   dtype_torch_name(dt),
                   " is not supported (expected torch.bfloat16 or "
                   "torch.float16)");
}

// Checks a row-major A [.., m, k] and a column-major B [.., k, n] of rank `rank`; returns
// (batch, m, n, k).
struct Dims {
  int64_t batch, m, n, k;
};

Dims check_operands(const Tensor& A, const Tensor& B, int64_t rank, const char* op,
                    const char* a_arg, const char* b_arg) {
  api::check_defined(A, op, a_arg);
  api::check_defined(B, op, b_arg);
  api::check_dim(A, {rank}, op, a_arg);
  api::check_dim(B, {rank}, op, b_arg);
  api::check_same_device(B, A, op, b_arg, a_arg);
  const int64_t m = A.size(-2), k = A.size(-1), n = B.size(-1);
  FLASHINFER_CHECK(B.size(-2) == k, op, b_arg, "k mismatch: ", a_arg, " is ",
                   shape_to_string(A.shape()), " (k = ", k, ") but ", b_arg, " is ",
                   shape_to_string(B.shape()), " (k = ", B.size(-2), ")");
  if (rank == 3) {
    FLASHINFER_CHECK(B.size(0) == A.size(0), op, b_arg, "batch ", B.size(0), " does not match ",
                     a_arg, "'s batch ", A.size(0));
  }
  FLASHINFER_CHECK(m > 0 && n > 0 && k > 0, op, a_arg, "empty GEMM: m = ", m, ", n = ", n,
                   ", k = ", k);
  FLASHINFER_CHECK(A.stride(-1) == 1 || k == 1, op, a_arg,
                   "must be row-major (stride(-1) == 1), got strides ",
                   shape_to_string(A.strides()));
  FLASHINFER_CHECK(B.stride(-2) == 1 || k == 1, op, b_arg,
                   "must be column-major (stride(-2) == 1, a transposed [", rank == 3 ? "b, " : "",
                   "n, k] tensor), got strides ", shape_to_string(B.strides()));
  return {rank == 3 ? A.size(0) : 1, m, n, k};
}

Tensor gemm_make_out(const std::optional<Tensor>& out, const Shape& shape, DType dt, Device device,
                     const char* op) {
  if (out && out->defined()) {
    api::check_shape_eq(*out, shape, op, "out");
    FLASHINFER_CHECK(out->dtype() == dt, op, "out", "dtype ", dtype_torch_name(out->dtype()),
                     " does not match the requested output dtype ", dtype_torch_name(dt));
    FLASHINFER_CHECK(out->device() == device, op, "out", "is on ", out->device().str(),
                     " but the inputs are on ", device.str());
    return *out;
  }
  return Tensor::empty(shape, dt, device);
}

// cuBLASLt takes each operand as a column-major matrix with a leading dimension of at least its
// row count, so rows that overlap (a stride below the row length, e.g. from expand()) which the
// CPU backend accepts would fail inside cublasLtMatmul with a bare status. Refuse them here,
// naming the argument. Single rows and columns are exempt: the launcher substitutes a dense ld.
void check_cuda_leading_dims(const Tensor& A, const Tensor& B, const Tensor& out, const Dims& d,
                             const char* op, const char* a_arg, const char* b_arg) {
  if (!A.device().is_cuda()) return;
  FLASHINFER_CHECK_CODE(d.m == 1 || A.stride(-2) >= d.k, ErrorCode::kUnsupported, op, a_arg,
                        "the CUDA backend needs non-overlapping rows (stride(-2) >= k = ", d.k,
                        "), got strides ", shape_to_string(A.strides()));
  FLASHINFER_CHECK_CODE(d.n == 1 || B.stride(-1) >= d.k, ErrorCode::kUnsupported, op, b_arg,
                        "the CUDA backend needs non-overlapping columns (stride(-1) >= k = ", d.k,
                        "), got strides ", shape_to_string(B.strides()));
  FLASHINFER_CHECK_CODE(d.m == 1 || out.stride(-2) >= d.n, ErrorCode::kUnsupported, op, "out",
                        "the CUDA backend needs non-overlapping rows (stride(-2) >= n = ", d.n,
                        "), got strides ", shape_to_string(out.strides()));
}

Tensor bf16_gemm(const char* op, const Tensor& A_in, const Tensor& B_in,
                 const std::optional<Tensor>& bias, bool pdl, const std::optional<Tensor>& out,
                 DType out_dtype, std::string_view backend, int64_t rank, const char* a_arg,
                 const char* b_arg) {
  api::check_defined(A_in, op, a_arg);
  api::check_defined(B_in, op, b_arg);
  api::check_backend(op, backend, A_in.device());
  // Upstream's cuDNN graph takes the operands' own strides; the kernels here read a row-major A
  // and a column-major B, so other layouts of the default backend's operands are copied into
  // those (the same values; cutlass and cuBLASLt require them upstream too).
  const bool any_layout = backend == "cudnn" && A_in.dim() == rank && B_in.dim() == rank;
  const Tensor A = any_layout && A_in.stride(-1) != 1 ? A_in.contiguous() : A_in;
  const Tensor B = any_layout && B_in.stride(-2) != 1
                       ? B_in.transpose(-2, -1).contiguous().transpose(-2, -1)
                       : B_in;
  const Dims d = check_operands(A, B, rank, op, a_arg, b_arg);
  api::check_dtype_in(A, {DType::kBFloat16}, op, a_arg);
  api::check_dtype_in(B, {DType::kBFloat16}, op, b_arg);
  // float32 output: upstream's cudnn, cutlass, cutile and cuBLASLt (without bias) backends write
  // it (_validate_bf16_output_dtype); tgv, tinygemm and cute-dsl are bf16-only.
  const bool has_bias = bias && bias->defined();
  const bool fp32_ok = backend != "tgv" && backend != "tinygemm" && backend != "cute-dsl" &&
                       !(backend == "cublaslt" && has_bias);
  if (out_dtype != DType::kFloat32 || !fp32_ok) check_out_dtype(out_dtype, op, "out_dtype");
  Shape shape = rank == 3 ? Shape{d.batch, d.m, d.n} : Shape{d.m, d.n};
  Tensor result = gemm_make_out(out, shape, out_dtype, A.device(), op);
  check_cuda_leading_dims(A, B, result, d, op, a_arg, b_arg);
  kernels::GemmParams p = api::gemm_params(A, B, result);
  Tensor bias_dense;
  if (bias && bias->defined()) {
    api::check_dim(*bias, {1}, op, "bias");
    api::check_shape_eq(*bias, {d.n}, op, "bias");
    api::check_dtype_in(*bias, {DType::kBFloat16}, op, "bias");
    api::check_same_device(*bias, A, op, "bias", a_arg);
    // cuBLASLt's bias epilogue reads a dense vector. Its alignment is not a heuristic preference
    // (unlike A/B/C/D), and users of the epilogue report faults with a bias that is not 16-byte
    // aligned (a slice of a longer vector), so such a bias gets a fresh, aligned copy.
    bias_dense = *bias;
    if (A.device().is_cuda() &&
        (!bias->is_contiguous() || reinterpret_cast<std::uintptr_t>(bias->data_ptr()) % 16 != 0)) {
      bias_dense = bias->clone();
    }
    p.bias = bias_dense.data_ptr();
    p.bias_dtype = bias_dense.dtype();
    p.bias_stride = bias_dense.stride(0);
  }
  api::launch(kBf16GemmKernels, GemmCall{p, op, backend == "cudnn"}, A.device(), op, a_arg, pdl);
  return result;
}

// A one-element fp32 scale on `device`, as a contiguous tensor.
Tensor check_scale(const Tensor& t, Device device, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  FLASHINFER_CHECK(t.numel() == 1, op, arg, "expected a one-element fp32 tensor, got shape ",
                   shape_to_string(t.shape()));
  api::check_dtype_in(t, {DType::kFloat32}, op, arg);
  FLASHINFER_CHECK(t.device() == device, op, arg, "is on ", t.device().str(),
                   " but the operands are on ", device.str());
  return t;
}

// A scale-factor buffer passed as a (possibly transposed) view of a dense swizzled buffer.
void check_sf_buffer(const Tensor& t, int64_t expected, DType allowed_fp8, Device device,
                     const char* op, const char* arg, const char* what) {
  api::check_defined(t, op, arg);
  api::check_dtype_in(t, {DType::kUInt8, allowed_fp8}, op, arg);
  FLASHINFER_CHECK(t.device() == device, op, arg, "is on ", t.device().str(), " but a is on ",
                   device.str());
  FLASHINFER_CHECK(t.numel() == expected, op, arg, "expected ", expected, " scale factors (", what,
                   "), got ", t.numel(), " (shape ", shape_to_string(t.shape()), ")");
  const bool dense = t.is_contiguous() || (t.dim() == 2 && t.transpose(0, 1).is_contiguous());
  FLASHINFER_CHECK(dense, op, arg,
                   "must be a dense scale buffer (contiguous, or the transpose of one), got "
                   "strides ",
                   shape_to_string(t.strides()));
}

}  // namespace

Tensor mm_bf16(const Tensor& a, const Tensor& b, std::optional<Tensor> bias, bool pdl,
               std::optional<Tensor> out, DType out_dtype, std::string_view backend,
               bool batch_invariant) {
  return call_op<&mm_bf16>(
      [&] {
        if (batch_invariant) {
          api::check_defined(a, "mm_bf16", "a");
          api::check_defined(b, "mm_bf16", "b");
          api::check_batch_invariant_gemm("mm_bf16", backend, a.device(), out_dtype, false,
                                          a.size(-1), b.size(-1), 8, 8);
        }
        return bf16_gemm("mm_bf16", a, b, bias, pdl, out, out_dtype, backend, 2, "a", "b");
      },
      a, b, bias, pdl, out, out_dtype, backend, batch_invariant);
}

Tensor bmm_bf16(const Tensor& A, const Tensor& B, std::optional<Tensor> out, DType out_dtype,
                std::string_view backend) {
  return call_op<&bmm_bf16>(
      [&] {
        return bf16_gemm("bmm_bf16", A, B, std::nullopt, false, out, out_dtype, backend, 3, "A",
                         "B");
      },
      A, B, out, out_dtype, backend);
}

Tensor bmm_fp8(const Tensor& A, const Tensor& B, const Tensor& A_scale, const Tensor& B_scale,
               DType dtype, std::optional<Tensor> out, std::string_view backend,
               bool batch_invariant) {
  return call_op<&bmm_fp8>(
      [&] {
        const char* op = "bmm_fp8";
        api::check_defined(A, op, "A");
        api::check_defined(B, op, "B");
        if (batch_invariant) {
          api::check_batch_invariant_gemm(op, backend, A.device(), dtype, true, A.size(-1),
                                          B.size(-1), 16, 1);
        }
        api::check_backend(op, backend, A.device());
        const Dims d = check_operands(A, B, 3, op, "A", "B");
        api::check_dtype_in(A, {DType::kFloat8E4M3FN, DType::kFloat8E5M2}, op, "A");
        api::check_dtype_in(B, {DType::kFloat8E4M3FN, DType::kFloat8E5M2}, op, "B");
        FLASHINFER_CHECK(!(A.dtype() == DType::kFloat8E5M2 && B.dtype() == DType::kFloat8E5M2), op,
                         "B",
                         "e5m2 x e5m2 is not supported (cuBLASLt has no fp8 GEMM for two e5m2 "
                         "operands; use e4m3 for at least one)");
        check_out_dtype(dtype, op, "dtype");
        const Tensor sa = check_scale(A_scale, A.device(), op, "A_scale");
        const Tensor sb = check_scale(B_scale, A.device(), op, "B_scale");
        Tensor result = gemm_make_out(out, {d.batch, d.m, d.n}, dtype, A.device(), op);
        check_cuda_leading_dims(A, B, result, d, op, "A", "B");
        kernels::GemmParams p = api::gemm_params(A, B, result);
        p.a_scale = sa.data<float>();
        p.b_scale = sb.data<float>();
        api::launch(kFp8GemmKernels, GemmCall{p, op, backend == "cudnn"}, A.device(), op, "A",
                    false);
        return result;
      },
      A, B, A_scale, B_scale, dtype, out, backend, batch_invariant);
}

Tensor mm_fp4(const Tensor& a, const Tensor& b, const Tensor& a_descale, const Tensor& b_descale,
              std::optional<Tensor> alpha, DType out_dtype, std::optional<Tensor> out,
              int64_t block_size, bool use_8x4_sf_layout, std::string_view backend, bool use_nvfp4,
              bool enable_pdl, bool batch_invariant) {
  return call_op<&mm_fp4>(
      [&] {
        const char* op = "mm_fp4";
        api::check_defined(a, op, "a");
        api::check_backend(op, backend, a.device());
        const Dims d = check_operands(a, b, 2, op, "a", "b");
        if (batch_invariant) {
          api::check_batch_invariant_gemm(op, backend, a.device(), out_dtype, true, d.k * 2, d.n,
                                          use_nvfp4 ? 16 : 32, 1);
          FLASHINFER_CHECK(!use_8x4_sf_layout, op, "batch_invariant",
                           "batch_invariant=True does not support use_8x4_sf_layout");
          FLASHINFER_CHECK(!alpha || !alpha->defined() || alpha->numel() == 1, op,
                           "batch_invariant", "batch_invariant=True needs one alpha, got ",
                           alpha->numel());
        }
        api::check_dtype_in(a, {DType::kUInt8, DType::kFloat4E2M1FNx2}, op, "a");
        api::check_dtype_in(b, {DType::kUInt8, DType::kFloat4E2M1FNx2}, op, "b");
        const int64_t block_required = use_nvfp4 ? 16 : 32;
        FLASHINFER_CHECK(block_size == block_required, op, "block_size", "must be ", block_required,
                         " for ", use_nvfp4 ? "NVFP4" : "MXFP4", ", got ", block_size);
        const int64_t k = d.k * 2;  // packed: two values per byte
        FLASHINFER_CHECK(k % block_size == 0, op, "a", "K = ", k,
                         " is not a multiple of the block size ", block_size);
        check_out_dtype(out_dtype, op, "out_dtype");
        using kernels::SfLayoutCode;
        const SfLayoutCode a_layout = use_8x4_sf_layout ? SfLayoutCode::k8x4 : SfLayoutCode::k128x4;
        const DType fp8_sf = use_nvfp4 ? DType::kFloat8E4M3FN : DType::kUInt8;
        check_sf_buffer(
            a_descale, kernels::sf_buffer_size(a_layout, d.m, k / block_size), fp8_sf, a.device(),
            op, "a_descale",
            use_8x4_sf_layout ? "8x4 layout of a's scales" : "128x4 layout of a's scales");
        check_sf_buffer(b_descale,
                        kernels::sf_buffer_size(SfLayoutCode::k128x4, d.n, k / block_size), fp8_sf,
                        a.device(), op, "b_descale", "128x4 layout of b's scales");
        Tensor al;
        if (alpha && alpha->defined()) al = check_scale(*alpha, a.device(), op, "alpha");
        Tensor result = gemm_make_out(out, {d.m, d.n}, out_dtype, a.device(), op);
        // The operands are dequantized into dense buffers; only out goes to cuBLASLt as is.
        FLASHINFER_CHECK_CODE(!a.device().is_cuda() || d.m == 1 || result.stride(0) >= d.n,
                              ErrorCode::kUnsupported, op, "out",
                              "the CUDA backend needs non-overlapping rows (stride(0) >= n = ", d.n,
                              "), got strides ", shape_to_string(result.strides()));
        Tensor b_run = b, b_sf_run = b_descale;
        if (backend == "trtllm") {
          FLASHINFER_CHECK_CODE(a.device().is_cpu(), ErrorCode::kUnsupported, op, "backend",
                                "\"trtllm\" runs on the CPU reference only here");
          std::tie(b_run, b_sf_run) =
              api::unshuffle_trtllm_weight(b, b_descale, d.n, k / block_size, op);
        }
        kernels::Fp4GemmParams p;
        p.a = static_cast<const uint8_t*>(a.data_ptr());
        p.a_stride_m = a.stride(0);
        p.b = static_cast<const uint8_t*>(b_run.data_ptr());
        p.b_stride_n = b_run.stride(1);
        p.a_sf = static_cast<const uint8_t*>(a_descale.data_ptr());
        p.b_sf = static_cast<const uint8_t*>(b_sf_run.data_ptr());
        p.a_layout = a_layout;
        p.b_layout = SfLayoutCode::k128x4;
        p.ue8m0 = !use_nvfp4;
        p.block = static_cast<int>(block_size);
        p.alpha = al.defined() ? al.data<float>() : nullptr;
        p.out = result.data_ptr();
        p.out_dtype = out_dtype;
        p.out_stride_m = result.stride(0);
        p.out_stride_n = result.stride(1);
        p.m = d.m;
        p.n = d.n;
        p.k = k;
        api::launch(kFp4GemmKernels, p, a.device(), op, "a", enable_pdl);
        return result;
      },
      a, b, a_descale, b_descale, alpha, out_dtype, out, block_size, use_8x4_sf_layout, backend,
      use_nvfp4, enable_pdl, batch_invariant);
}

namespace {

// Bench hooks (upstream's GEMM formulas): FLOPs 2*m*n*k per matrix; bytes are A, B and the
// output once each. B is built as the transpose of an [n, k] weight, as callers pass it. The
// output is allocated once and passed as `out`, so a timed iteration is the GEMM alone (upstream's
// torch caching allocator makes its per-call output free; a cudaMalloc here would not be), and
// on CUDA every iteration after bench_time_ms's warm-up call finds its cuBLASLt plan cached.
// The op backend is `flashinfer bench --backends`' name (api/bench_backend.h), else "auto"
// (cuBLASLt) for the bf16 GEMMs and bmm_fp8's default "cublas".
BenchCase gemm_bench_mm(const BenchShape& s, Device dev, bool batched) {
  const DType bf = DType::kBFloat16, out_dt = s.out_dtype.value_or(bf);
  const std::string backend = api::bench::op_backend("auto");
  const int64_t b = batched ? s.batch_size : 1;
  Tensor a = api::bench::random_tensor({b, s.m, s.k}, bf, dev, s.random_seed);
  Tensor w = api::bench::random_tensor({b, s.n, s.k}, bf, dev, s.random_seed + 1);
  Tensor out = Tensor::empty({b, s.m, s.n}, out_dt, dev);
  BenchCase c =
      batched
          ? api::bench::invoke_case(
                "bmm_bf16", {Value(a), Value(w.transpose(1, 2))},
                {{"out", Value(out)}, {"out_dtype", Value(out_dt)}, {"backend", Value(backend)}})
          : api::bench::invoke_case("mm_bf16",
                                    {Value(a.select(0, 0)), Value(w.select(0, 0).transpose(0, 1))},
                                    {{"out", Value(out.select(0, 0))},
                                     {"out_dtype", Value(out_dt)},
                                     {"backend", Value(backend)}});
  c.flops = 2.0 * static_cast<double>(b * s.m * s.n * s.k);
  c.bytes = api::bench::nbytes({b, s.m, s.k}, bf) + api::bench::nbytes({b, s.n, s.k}, bf) +
            api::bench::nbytes({b, s.m, s.n}, out_dt);
  return c;
}

BenchCase bench_bmm_fp8(const BenchShape& s, Device dev) {
  const DType f8 = s.input_dtype == DType::kFloat8E5M2 ? DType::kFloat8E5M2 : DType::kFloat8E4M3FN;
  const DType out_dt = s.out_dtype.value_or(DType::kBFloat16);
  const int64_t b = s.batch_size;
  Tensor a = api::bench::random_tensor({b, s.m, s.k}, f8, dev, s.random_seed);
  Tensor w = api::bench::random_tensor({b, s.n, s.k}, DType::kFloat8E4M3FN, dev, s.random_seed + 1);
  Tensor one = Tensor::full({1}, 1.0, DType::kFloat32).to(dev);
  Tensor out = Tensor::empty({b, s.m, s.n}, out_dt, dev);
  BenchCase c = api::bench::invoke_case(
      "bmm_fp8", {Value(a), Value(w.transpose(1, 2)), Value(one), Value(one), Value(out_dt)},
      {{"out", Value(out)}, {"backend", Value(api::bench::op_backend("cublas"))}});
  c.flops = 2.0 * static_cast<double>(b * s.m * s.n * s.k);
  c.bytes = api::bench::nbytes({b, s.m, s.k}, f8) +
            api::bench::nbytes({b, s.n, s.k}, DType::kFloat8E4M3FN) +
            api::bench::nbytes({b, s.m, s.n}, out_dt);
  return c;
}

// MXFP4 operands (quantized on the host, so every device gets the same bits).
BenchCase bench_mm_fp4(const BenchShape& s, Device dev) {
  const DType out_dt = s.out_dtype.value_or(DType::kBFloat16);
  auto [qa, sa] = mxfp4_quantize(
      api::bench::random_tensor({s.m, s.k}, DType::kBFloat16, Device::cpu(), s.random_seed));
  auto [qb, sb] = mxfp4_quantize(
      api::bench::random_tensor({s.n, s.k}, DType::kBFloat16, Device::cpu(), s.random_seed + 1));
  BenchCase c = api::bench::invoke_case(
      "mm_fp4",
      {Value(qa.to(dev)), Value(qb.to(dev).transpose(0, 1)), Value(sa.to(dev)),
       Value(sb.to(dev).transpose(0, 1)), Value(), Value(out_dt)},
      {{"out", Value(Tensor::empty({s.m, s.n}, out_dt, dev))},
       {"block_size", Value(int64_t{32})},
       {"use_nvfp4", Value(false)}});
  c.flops = 2.0 * static_cast<double>(s.m * s.n * s.k);
  // packed e2m1 operands (half a byte per value), one ue8m0 scale per 32 values, the output
  c.bytes = 0.5 * static_cast<double>((s.m + s.n) * s.k) +
            static_cast<double>((s.m + s.n) * s.k) / 32.0 + api::bench::nbytes({s.m, s.n}, out_dt);
  return c;
}

}  // namespace

namespace detail {
void register_gemm_ops(OpRegistry& r) {
  declare<&mm_bf16>(r,
                    {.name = "mm_bf16",
                     .module = kGemmBaseModule,
                     .summary = "BF16 GEMM: a [m, k] row-major @ b [k, n] column-major (+ bias)"},
                    "a", "b", "bias", arg("pdl", false), arg("out").mut(),
                    arg("out_dtype", DType::kBFloat16), arg("backend", "cudnn"),
                    arg("batch_invariant", false).kw());
  declare<&bmm_bf16>(
      r,
      {.name = "bmm_bf16",
       .module = kGemmBaseModule,
       .summary = "Batched BF16 GEMM: A [b, m, k] row-major @ B [b, k, n] column-major"},
      "A", "B", arg("out").mut(), arg("out_dtype", DType::kBFloat16), arg("backend", "cudnn"));
  declare<&bmm_fp8>(r,
                    {.name = "bmm_fp8",
                     .module = kGemmBaseModule,
                     .summary = "Batched FP8 GEMM with per-tensor dequantization scales"},
                    "A", "B", "A_scale", "B_scale", "dtype", arg("out").mut(),
                    arg("backend", "cublas"), arg("batch_invariant", false).kw());
  declare<&mm_fp4>(r,
                   {.name = "mm_fp4",
                    .module = kGemmBaseModule,
                    .summary = "FP4 GEMM (NVFP4 or MXFP4 operands with block scales)"},
                   "a", "b", "a_descale", "b_descale", "alpha", arg("out_dtype", DType::kBFloat16),
                   arg("out").mut(), arg("block_size", 16), arg("use_8x4_sf_layout", false),
                   arg("backend", "auto"), arg("use_nvfp4", true), arg("enable_pdl", true),
                   arg("batch_invariant", false).kw());

  api::register_backends("mm_bf16", kBf16GemmKernels);
  api::register_backends("bmm_bf16", kBf16GemmKernels);
  api::register_backends("bmm_fp8", kFp8GemmKernels);
  api::register_backends("mm_fp4", kFp4GemmKernels);

  register_bench_hook("mm_bf16",
                      [](const BenchShape& s, Device d) { return gemm_bench_mm(s, d, false); });
  register_bench_hook("bmm_bf16",
                      [](const BenchShape& s, Device d) { return gemm_bench_mm(s, d, true); });
  register_bench_hook("bmm_fp8", bench_bmm_fp8);
  register_bench_hook("mm_fp4", bench_mm_fp4);
}
}  // namespace detail

}  // namespace flashinfer
