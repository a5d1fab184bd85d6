// Block-scaled, MX and low-latency FP8 GEMMs (flashinfer.gemm.gemm_base: gemm_fp8_nt_groupwise,
// gemm_fp8_nt_blockscaled, mm_fp8, fp8_blockscale_gemm_sm90, mm_mxfp8, bmm_mxfp8;
// flashinfer.trtllm_low_latency_gemm: prepare_low_latency_gemm_weights; flashinfer.gemm.routergemm:
// the fixed-shape router GEMMs and tinygemm_bf16): declarations, argument checks, dispatch, bench
// hooks.
#include "flashinfer/ops/gemm_fp8.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>

#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "api/quant8.h"
#include "api/trtllm_weight_shuffle.h"
#include "api/tuple_arg.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/gemm_fp8_cpu.h"
#include "kernels/quant8_params.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/gemm_cuda.h"
#include "kernels/cuda/gemm_fp8_cuda.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kGemmFp8Module = "flashinfer.gemm.gemm_base";
constexpr const char* kLowLatencyModule = "flashinfer.trtllm_low_latency_gemm";

using api::KernelEntry;
using api::LaunchContext;
using kernels::BlockScaledGemmParams;
using kernels::SfLayoutCode;

struct ScaledGemmCall {
  BlockScaledGemmParams p;
  const char* op;
};

#if FLASHINFER_WITH_CUDA
// cuBLASLt where kernels/cublaslt_plan.h's fp8_route() picks it for this GPU, else the tiled
// kernel (also the fallback when cuBLASLt has no algorithm for the shape).
void gemm_fp8_run_cuda(const ScaledGemmCall& c, const LaunchContext& ctx) {
  if (kernels::cuda::block_scaled_gemm_lt(c.p, ctx.stream, c.op)) return;
  kernels::cuda::block_scaled_gemm(c.p, ctx.stream, c.op, ctx.enable_pdl);
}
#endif

constexpr const char* kGemmFp8CpuImpl =
    "CPU reference: operands decoded exactly to fp32, OpenBLAS sgemm per K block, each block's "
    "fp32 sums times its scales";

// gemm_fp8_nt_groupwise, gemm_fp8_nt_blockscaled and mm_fp8.
constexpr KernelEntry<ScaledGemmCall> kScaledGemmKernels[] = {
    {DeviceType::kCPU, kGemmFp8CpuImpl, nullptr,
     [](const ScaledGemmCall& c, const LaunchContext&) { kernels::cpu::block_scaled_gemm(c.p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "cuBLASLt FP8 GEMM for mm_fp8 where the shape allows (sm89+; the prepared weight "
     "un-shuffled into scratch, alpha as a scale); otherwise the tiled fp32 CUDA kernel of this "
     "build (sm80+, no fp8 tensor cores; per-K-block scaling as the CPU)",
     nullptr, [](const ScaledGemmCall& c, const LaunchContext& ctx) { gemm_fp8_run_cuda(c, ctx); }},
#endif
};

// fp8_blockscale_gemm_sm90 (upstream runs TRT-LLM's SM90 DeepGEMM kernel): the same block-scaled
// GEMM kernels as the ops above; a BF16 input is quantized 1x128 first (below).
constexpr KernelEntry<ScaledGemmCall> kSm90Kernels[] = {
    {DeviceType::kCPU, kGemmFp8CpuImpl, nullptr,
     [](const ScaledGemmCall& c, const LaunchContext&) { kernels::cpu::block_scaled_gemm(c.p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "cuBLASLt's FP8 block-scaled GEMM on Hopper (1x128 input and 1x128 or 128x128 weight "
     "scales, m a multiple of 4, k a multiple of 512 for the latter); otherwise, or where "
     "cuBLASLt refuses the problem, the tiled fp32 CUDA kernel of this build (per-K-block "
     "scaling as the CPU). A BF16 input is quantized 1x128 on the device first",
     nullptr, [](const ScaledGemmCall& c, const LaunchContext& ctx) { gemm_fp8_run_cuda(c, ctx); }},
#endif
};

// prepare_low_latency_gemm_weights: a layout transform on the host (CUDA tensors are copied to
// the host and back).
struct LayoutCall {
  const uint8_t* w;
  int64_t stride_n, n, k;
  uint8_t* out;
};
constexpr KernelEntry<LayoutCall> kLayoutKernels[] = {
    {DeviceType::kCPU, "CPU reference (closed-form row shuffle, then 128-wide K blocks)", nullptr,
     [](const LayoutCall& c, const LaunchContext&) {
       kernels::cpu::low_latency_weight_layout(c.w, c.stride_n, c.n, c.k, c.out);
     }},
};

int64_t gemm_fp8_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_fp8(const Tensor& t, int64_t rank, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  api::check_dim(t, {rank}, op, arg);
  api::check_dtype_in(t, {DType::kFloat8E4M3FN, DType::kFloat8E5M2}, op, arg);
}

// A 2-D fp32 scale tensor of exactly `shape` on `device`.
void check_scale_tensor(const Tensor& t, const Shape& shape, Device device, const char* op,
                        const char* arg, const char* layout) {
  api::check_defined(t, op, arg);
  api::check_dtype_in(t, {DType::kFloat32}, op, arg);
  FLASHINFER_CHECK(t.device() == device, op, arg, "is on ", t.device().str(),
                   " but the operands are on ", device.str());
  FLASHINFER_CHECK(t.shape() == shape, op, arg, "expected shape ", shape_to_string(shape), " (",
                   layout, "), got ", shape_to_string(t.shape()));
}

// Upstream's rule (out given: its dtype is the output dtype; else out_dtype or bf16), with the
// fp8 GEMMs' bf16/fp16 output contract.
Tensor gemm_fp8_make_out(const std::optional<Tensor>& out, std::optional<DType> out_dtype,
                         const Shape& shape, Device device, const char* op) {
  if (out && out->defined()) {
    api::check_dtype_in(*out, {DType::kBFloat16, DType::kFloat16}, op, "out");
    api::check_shape_eq(*out, shape, op, "out");
    FLASHINFER_CHECK(out->device() == device, op, "out", "is on ", out->device().str(),
                     " but the operands are on ", device.str());
    return *out;
  }
  const DType dt = out_dtype.value_or(DType::kBFloat16);
  FLASHINFER_CHECK(dt == DType::kBFloat16 || dt == DType::kFloat16, op, "out_dtype",
                   "output dtype ", dtype_torch_name(dt),
                   " is not supported (expected torch.bfloat16 or torch.float16)");
  return Tensor::empty(shape, dt, device);
}

void gemm_fp8_fill_out(BlockScaledGemmParams& p, const Tensor& out) {
  p.out = out.data_ptr();
  p.out_dtype = out.dtype();
  p.out_stride_m = out.stride(0);
  p.out_stride_n = out.stride(1);
}

Tensor groupwise_impl(const char* op, const Tensor& a, const Tensor& b, const Tensor& a_scale,
                      const Tensor& b_scale, std::optional<std::string_view> mode, int64_t mma_sm,
                      std::tuple<int64_t, int64_t, int64_t> gran, const std::optional<Tensor>& out,
                      std::optional<DType> out_dtype, std::string_view backend) {
  check_fp8(a, 2, op, "a");
  api::check_backend("gemm_fp8_nt_groupwise", backend, a.device());
  check_fp8(b, 2, op, "b");
  api::check_same_device(b, a, op, "b", "a");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  FLASHINFER_CHECK(b.size(1) == k, op, "b", "k mismatch: a is ", shape_to_string(a.shape()),
                   " but b is ", shape_to_string(b.shape()), " (expected [n, ", k, "])");
  FLASHINFER_CHECK(m > 0 && n > 0 && k > 0, op, "a", "empty GEMM: m = ", m, ", n = ", n,
                   ", k = ", k);
  FLASHINFER_CHECK(mma_sm == 1 || mma_sm == 2, op, "mma_sm", "must be 1 or 2, got ", mma_sm);
  const auto [gm, gn, gk] = gran;
  FLASHINFER_CHECK(gm > 0 && gn > 0 && gk > 0, op, "scale_granularity_mnk",
                   "every granularity must be positive, got (", gm, ", ", gn, ", ", gk, ")");
  FLASHINFER_CHECK(k % gk == 0, op, "scale_granularity_mnk", "k = ", k,
                   " is not a multiple of the K granularity ", gk);
  const bool trtllm = backend == "trtllm";
  if (trtllm) {
    FLASHINFER_CHECK(gm == 1 && gn == 128 && gk == 128, op, "scale_granularity_mnk",
                     "must be (1, 128, 128) in TRTLLM, got (", gm, ", ", gn, ", ", gk, ")");
    FLASHINFER_CHECK(k >= 256, op, "a", "a.shape[1] must be >= 256 in TRTLLM, got ", k);
    // Upstream's trtllm runner: e4m3 operands of one dtype (trtllm_gemm_runner.cu's checks); its
    // scale_major_mode is not read (the scale layout is fixed); its kernel stores bf16 whatever
    // the output's dtype, so an fp16 output would hold bf16 bit patterns there: refused here.
    FLASHINFER_CHECK(a.dtype() == DType::kFloat8E4M3FN, op, "a",
                     "the trtllm backend takes float8_e4m3fn operands, got ",
                     dtype_torch_name(a.dtype()));
    FLASHINFER_CHECK(b.dtype() == a.dtype(), op, "b", "the trtllm backend needs b of a's dtype ",
                     dtype_torch_name(a.dtype()), ", got ", dtype_torch_name(b.dtype()));
    const DType want = out && out->defined() ? out->dtype() : out_dtype.value_or(DType::kBFloat16);
    FLASHINFER_CHECK(want == DType::kBFloat16, op, out && out->defined() ? "out" : "out_dtype",
                     "the trtllm backend writes bfloat16 only (upstream's kernel stores bf16 into "
                     "any output dtype), got ",
                     dtype_torch_name(want));
  } else {
    FLASHINFER_CHECK(mode.has_value(), op, "scale_major_mode", "scale_major_mode is required in ",
                     "CUTLASS ('MN' or 'K')");
    FLASHINFER_CHECK(*mode == "MN" || *mode == "K", op, "scale_major_mode",
                     "must be 'MN' or 'K', got '", *mode, "'");
  }
  const bool k_major = !trtllm && *mode == "K";
  const int64_t mb = gemm_fp8_ceil_div(m, gm), nb = gemm_fp8_ceil_div(n, gn), kb = k / gk;
  BlockScaledGemmParams p;
  if (trtllm) {
    // Upstream's trtllm kernel reads the scales' memory as [k/128][m] and [n/128][k/128]; its
    // docstring spells them as (m, k/128) and (k/128, n/128) "contiguous on the first dimension"
    // (SGLang's per_token_group_quant with column_major_scales passes that a_scale). Both those
    // transposed views and the row-major [k/128, m] / [n/128, k/128] tensors are taken, each read
    // through its strides; a square scale tensor is the documented form when its first dimension
    // is the contiguous one (reading it the other way would transpose it).
    const auto column_major = [](const Tensor& t, int64_t rows, int64_t cols) {
      return t.defined() && t.dim() == 2 && t.size(0) == rows && t.size(1) == cols &&
             (t.stride(0) == 1 || rows == 1);
    };
    if (column_major(a_scale, m, kb)) {
      check_scale_tensor(a_scale, {m, kb}, a.device(), op, "a_scale", "(m, k/128)");
      p.sa_stride_m = a_scale.stride(0);
      p.sa_stride_k = a_scale.stride(1);
    } else {
      check_scale_tensor(a_scale, {kb, m}, a.device(), op, "a_scale",
                         "[k/128, m], or (m, k/128) contiguous on its first dimension");
      p.sa_stride_k = a_scale.stride(0);
      p.sa_stride_m = a_scale.stride(1);
    }
    if (column_major(b_scale, kb, nb)) {
      check_scale_tensor(b_scale, {kb, nb}, a.device(), op, "b_scale", "(k/128, n/128)");
      p.sb_stride_k = b_scale.stride(0);
      p.sb_stride_n = b_scale.stride(1);
    } else {
      check_scale_tensor(b_scale, {nb, kb}, a.device(), op, "b_scale",
                         "[n/128, k/128], or (k/128, n/128) contiguous on its first dimension");
      p.sb_stride_n = b_scale.stride(0);
      p.sb_stride_k = b_scale.stride(1);
    }
  } else if (k_major) {
    check_scale_tensor(a_scale, {mb, kb}, a.device(), op, "a_scale", "'K': [m/gm, k/gk]");
    check_scale_tensor(b_scale, {nb, kb}, a.device(), op, "b_scale", "'K': [n/gn, k/gk]");
    p.sa_stride_m = a_scale.stride(0);
    p.sa_stride_k = a_scale.stride(1);
    p.sb_stride_n = b_scale.stride(0);
    p.sb_stride_k = b_scale.stride(1);
  } else {
    check_scale_tensor(a_scale, {kb, mb}, a.device(), op, "a_scale", "'MN': [k/gk, m/gm]");
    check_scale_tensor(b_scale, {kb, nb}, a.device(), op, "b_scale", "'MN': [k/gk, n/gn]");
    p.sa_stride_k = a_scale.stride(0);
    p.sa_stride_m = a_scale.stride(1);
    p.sb_stride_k = b_scale.stride(0);
    p.sb_stride_n = b_scale.stride(1);
  }
  Tensor result = gemm_fp8_make_out(out, out_dtype, {m, n}, a.device(), op);
  p.a = a.data_ptr();
  p.a_dtype = a.dtype();
  p.a_stride_m = a.stride(0);
  p.a_stride_k = a.stride(1);
  p.b = b.data_ptr();
  p.b_dtype = b.dtype();
  p.b_stride_n = b.stride(0);
  p.b_stride_k = b.stride(1);
  p.a_scale = a_scale.data<float>();
  p.b_scale = b_scale.data<float>();
  p.gm = gm;
  p.gn = gn;
  p.gk = gk;
  p.m = m;
  p.n = n;
  p.k = k;
  gemm_fp8_fill_out(p, result);
  api::launch(kScaledGemmKernels, ScaledGemmCall{p, op}, a.device(), op, "a", false);
  return result;
}

}  // namespace

Tensor gemm_fp8_nt_groupwise(const Tensor& a, const Tensor& b, const Tensor& a_scale,
                             const Tensor& b_scale,
                             std::optional<std::string_view> scale_major_mode, int64_t mma_sm,
                             std::tuple<int64_t, int64_t, int64_t> scale_granularity_mnk,
                             std::optional<Tensor> out, std::optional<DType> out_dtype,
                             std::string_view backend) {
  return call_op<&gemm_fp8_nt_groupwise>(
      [&] {
        return groupwise_impl("gemm_fp8_nt_groupwise", a, b, a_scale, b_scale, scale_major_mode,
                              mma_sm, scale_granularity_mnk, out, out_dtype, backend);
      },
      a, b, a_scale, b_scale, scale_major_mode, mma_sm, scale_granularity_mnk, out, out_dtype,
      backend);
}

Tensor gemm_fp8_nt_blockscaled(const Tensor& a, const Tensor& b, const Tensor& a_scale,
                               const Tensor& b_scale,
                               std::optional<std::string_view> scale_major_mode, int64_t mma_sm,
                               std::optional<Tensor> out, std::optional<DType> out_dtype) {
  return call_op<&gemm_fp8_nt_blockscaled>(
      [&] {
        // Upstream's own list (its common check), before the cutlass backend's.
        api::check_defined(a, "gemm_fp8_nt_blockscaled", "a");
        api::check_upstream_arch("gemm_fp8_nt_blockscaled", "a", a.device());
        return groupwise_impl("gemm_fp8_nt_blockscaled", a, b, a_scale, b_scale, scale_major_mode,
                              mma_sm, {128, 128, 128}, out, out_dtype, "cutlass");
      },
      a, b, a_scale, b_scale, scale_major_mode, mma_sm, out, out_dtype);
}

Tensor mm_fp8(const Tensor& a, const Tensor& b, std::optional<Tensor> alpha, DType out_dtype,
              std::optional<Tensor> out, std::string_view backend) {
  return call_op<&mm_fp8>(
      [&] {
        const char* op = "mm_fp8";
        api::check_defined(a, op, "a");
        api::check_backend(op, backend, a.device());
        api::check_dim(a, {2}, op, "a");
        api::check_dtype_in(a, {DType::kFloat8E4M3FN}, op, "a");
        api::check_defined(b, op, "b");
        api::check_dim(b, {3}, op, "b");
        api::check_dtype_in(b, {DType::kFloat8E4M3FN}, op, "b");
        api::check_same_device(b, a, op, "b", "a");
        const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
        FLASHINFER_CHECK(b.size(2) == 128 && b.size(0) * 128 == k, op, "b",
                         "expected the prepared weight [k/128, n, 128] = [", k / 128, ", n, 128] ",
                         "(prepare_low_latency_gemm_weights), got ", shape_to_string(b.shape()));
        FLASHINFER_CHECK(k % 128 == 0 && k > 0, op, "a", "k = ", k,
                         " must be a positive multiple of 128");
        FLASHINFER_CHECK(
            n % 32 == 0 && n > 0 && m > 0, op, "b", "n = ", n,
            " must be a positive multiple of 32 (the weight shuffle's block), m = ", m);
        FLASHINFER_CHECK(b.is_contiguous(), op, "b",
                         "must be contiguous (the prepared block layout), got strides ",
                         shape_to_string(b.strides()));
        Tensor al;
        if (alpha && alpha->defined()) {
          al = *alpha;
          FLASHINFER_CHECK(al.numel() == 1, op, "alpha", "expected a one-element fp32 tensor, ",
                           "got shape ", shape_to_string(al.shape()));
          api::check_dtype_in(al, {DType::kFloat32}, op, "alpha");
          api::check_same_device(al, a, op, "alpha", "a");
        }
        // Upstream supports bf16 output only, and an out whose dtype is not out_dtype is an error.
        Tensor result;
        if (out && out->defined()) {
          api::check_dtype_in(*out, {DType::kBFloat16}, op, "out");
          api::check_shape_eq(*out, {m, n}, op, "out");
          api::check_same_device(*out, a, op, "out", "a");
          FLASHINFER_CHECK(out->dtype() == out_dtype, op, "out", "dtype ",
                           dtype_torch_name(out->dtype()), " does not match out_dtype ",
                           dtype_torch_name(out_dtype));
          result = *out;
        } else {
          FLASHINFER_CHECK(out_dtype == DType::kBFloat16, op, "out_dtype", "output dtype ",
                           dtype_torch_name(out_dtype),
                           " is not supported (only torch.bfloat16, as upstream)");
          result = Tensor::empty({m, n}, out_dtype, a.device());
        }
        BlockScaledGemmParams p;
        p.a = a.data_ptr();
        p.a_dtype = a.dtype();
        p.a_stride_m = a.stride(0);
        p.a_stride_k = a.stride(1);
        p.b = b.data_ptr();
        p.b_dtype = b.dtype();
        p.b_low_latency = true;
        p.gk = k;  // one block: a per-tensor alpha
        p.alpha = al.defined() ? al.data<float>() : nullptr;
        p.m = m;
        p.n = n;
        p.k = k;
        gemm_fp8_fill_out(p, result);
        api::launch(kScaledGemmKernels, ScaledGemmCall{p, op}, a.device(), op, "a", false);
        return result;
      },
      a, b, alpha, out_dtype, out, backend);
}

Tensor prepare_low_latency_gemm_weights(const Tensor& w, Value permutation_indices_cache) {
  return call_op<&prepare_low_latency_gemm_weights>(
      [&] {
        const char* op = "prepare_low_latency_gemm_weights";
        check_fp8(w, 2, op, "w");
        const int64_t n = w.size(0), k = w.size(1);
        FLASHINFER_CHECK(n % 32 == 0 && n > 0, op, "w", "w.shape[0] = ", n,
                         " must be a positive multiple of 32 (the shuffle block)");
        FLASHINFER_CHECK(k % 128 == 0 && k > 0, op, "w", "w.shape[1] = ", k,
                         " must be a positive multiple of 128 (block_k)");
        const Tensor h = w.to(Device::cpu()).contiguous();
        Tensor out = Tensor::empty({k / 128, n, 128}, w.dtype(), Device::cpu());
        api::launch(kLayoutKernels,
                    LayoutCall{static_cast<const uint8_t*>(h.data_ptr()), k, n, k,
                               static_cast<uint8_t*>(out.data_ptr())},
                    Device::cpu(), op, "w");
        return w.device().is_cuda() ? out.to(w.device()) : out;
      },
      w, permutation_indices_cache);
}

Tensor fp8_blockscale_gemm_sm90(const Tensor& input, const Tensor& weight,
                                std::optional<Tensor> input_scale,
                                std::optional<Tensor> weight_scale, std::optional<Tensor> out,
                                std::optional<DType> out_dtype) {
  return call_op<&fp8_blockscale_gemm_sm90>(
      [&] {
        const char* op = "fp8_blockscale_gemm_sm90";
        api::check_defined(input, op, "input");
        api::check_upstream_arch(op, "input", input.device());  // Hopper only, as upstream
        api::check_defined(weight, op, "weight");
        api::check_dim(input, {2}, op, "input");
        api::check_dim(weight, {2}, op, "weight");
        api::check_same_device(weight, input, op, "weight", "input");
        const int64_t m = input.size(0), k = input.size(1), n = weight.size(0);
        FLASHINFER_CHECK(weight.size(1) == k, op, "weight", "K dimension mismatch: input has K=", k,
                         ", weight has K=", weight.size(1));
        FLASHINFER_CHECK(
            k % 128 == 0 && k > 0, op, "input",
            "K dimension must be a positive multiple of the block size (128), got K=", k);
        FLASHINFER_CHECK(n % 64 == 0 && n > 0 && m > 0, op, "weight",
                         "N dimension must be a positive multiple of 64, got N=", n, " (M=", m,
                         ")");
        api::check_dtype_in(input, {DType::kFloat8E4M3FN, DType::kBFloat16}, op, "input");
        api::check_dtype_in(weight, {DType::kFloat8E4M3FN, DType::kBFloat16}, op, "weight");
        const bool in_fp8 = input.dtype() == DType::kFloat8E4M3FN;
        FLASHINFER_CHECK(!(in_fp8 && weight.dtype() == DType::kBFloat16), op, "weight",
                         "FP8 input + BF16 weight is not supported (missing kernel "
                         "implementation)");
        const bool has_is = input_scale && input_scale->defined();
        const bool has_ws = weight_scale && weight_scale->defined();
        const int64_t kb = k / 128;
        Tensor a = input, sa;
        if (in_fp8) {
          FLASHINFER_CHECK(has_is, op, "input_scale", "input_scale is required when input is FP8");
          check_scale_tensor(*input_scale, {m, kb}, input.device(), op, "input_scale",
                             "per-token 1x128: [M, K/128]");
          sa = *input_scale;
        } else {
          FLASHINFER_CHECK(!has_is, op, "input_scale",
                           "input_scale should not be provided for BF16 inputs");
        }
        FLASHINFER_CHECK_CODE(weight.dtype() == DType::kFloat8E4M3FN, ErrorCode::kUnsupported, op,
                              "weight",
                              "a BF16 weight (quantized inside upstream's kernel) is not "
                              "implemented in this build; pass an FP8 weight with weight_scale");
        FLASHINFER_CHECK(has_ws, op, "weight_scale", "weight_scale is required when weight is FP8");
        const Tensor& ws = *weight_scale;
        api::check_defined(ws, op, "weight_scale");
        api::check_dtype_in(ws, {DType::kFloat32}, op, "weight_scale");
        api::check_same_device(ws, input, op, "weight_scale", "input");
        const bool per_token = ws.shape() == Shape{n, kb};
        const bool per_block = ws.shape() == Shape{gemm_fp8_ceil_div(n, 128), kb};
        FLASHINFER_CHECK(per_token || per_block, op, "weight_scale",
                         "shape mismatch: expected either ", shape_to_string({n, kb}),
                         " (per-token, 1x128 blocks) or ",
                         shape_to_string({gemm_fp8_ceil_div(n, 128), kb}),
                         " (per-block, 128x128 blocks), got ", shape_to_string(ws.shape()));
        if (out && out->defined()) {
          FLASHINFER_CHECK(!out_dtype || out->dtype() == *out_dtype, op, "out",
                           "Output dtype mismatch. Expected ", dtype_torch_name(*out_dtype),
                           ", got ", dtype_torch_name(out->dtype()));
        }
        Tensor result = gemm_fp8_make_out(out, out_dtype, {m, n}, input.device(), op);
        if (!in_fp8) {
          // TRT-LLM's 1x128 activation quantization, as upstream's kernel runs it first, on the
          // input's device: per_token_group_quant_8bit's kernels under the 1x128 rule, the CPU's
          // arithmetic on both; on CUDA nothing goes through the host, so a graph captures it.
          FLASHINFER_CHECK(input.stride(1) == 1, op, "input",
                           "a BF16 input must be row-major (stride(1) == 1), got strides ",
                           shape_to_string(input.strides()));
          // Rows overlapping or broadcast (stride(0) < K) are made dense first.
          const Tensor x = m == 1 || input.stride(0) >= k ? input : input.contiguous();
          a = Tensor::empty({m, k}, DType::kFloat8E4M3FN, input.device());
          sa = Tensor::empty({m, kb}, DType::kFloat32, input.device());
          kernels::GroupQuant8Params qp;
          qp.x = x.data_ptr();
          qp.x_stride_row = m == 1 ? k : x.stride(0);
          qp.dtype = DType::kBFloat16;
          qp.q = a.data_ptr();
          qp.out_dtype = DType::kFloat8E4M3FN;
          qp.scales = sa.data<float>();
          qp.s_stride_row = kb;
          qp.rows = m;
          qp.k = k;
          qp.group_size = 128;
          qp.trtllm_1x128 = true;
          api::launch_group_quant_8bit(qp, input.device(), op, "input");
        }
        BlockScaledGemmParams p;
        p.a = a.data_ptr();
        p.a_dtype = a.dtype();
        p.a_stride_m = a.stride(0);
        p.a_stride_k = a.stride(1);
        p.b = weight.data_ptr();
        p.b_dtype = weight.dtype();
        p.b_stride_n = weight.stride(0);
        p.b_stride_k = weight.stride(1);
        if (sa.defined()) {
          p.a_scale = sa.data<float>();
          p.sa_stride_m = sa.stride(0);
          p.sa_stride_k = sa.stride(1);
        }
        p.b_scale = ws.data<float>();
        p.sb_stride_n = ws.stride(0);
        p.sb_stride_k = ws.stride(1);
        p.gm = 1;
        p.gn = per_token ? 1 : 128;
        p.gk = 128;
        p.m = m;
        p.n = n;
        p.k = k;
        gemm_fp8_fill_out(p, result);
        api::launch(kSm90Kernels, ScaledGemmCall{p, op}, input.device(), op, "input", false);
        return result;
      },
      input, weight, input_scale, weight_scale, out, out_dtype);
}

namespace {

// One operand's MX scales: a 1-D swizzled buffer (`layout`) of an [rows, k/32] scale matrix, or
// the 2-D linear tensor of shape `linear` (row-major [rows, k/32] for a, [k/32, n] for b).
void set_mx(const Tensor& sf, SfLayoutCode layout, int64_t rows, int64_t k, bool transposed_2d,
            Device device, const char* op, const char* arg, const uint8_t*& ptr, SfLayoutCode& code,
            int64_t& stride_row, int64_t& stride_k) {
  api::check_defined(sf, op, arg);
  api::check_dtype_in(sf, {DType::kUInt8}, op, arg);
  FLASHINFER_CHECK(sf.device() == device, op, arg, "is on ", sf.device().str(),
                   " but the operands are on ", device.str());
  FLASHINFER_CHECK(sf.dim() == 1 || sf.dim() == 2, op, arg,
                   "must be 1-D (swizzled) or 2-D (linear), got shape ",
                   shape_to_string(sf.shape()));
  ptr = static_cast<const uint8_t*>(sf.data_ptr());
  if (sf.dim() == 1) {
    const int64_t len = kernels::sf_buffer_size(layout, rows, k / 32);
    FLASHINFER_CHECK(sf.size(0) == len, op, arg, "shape mismatch for the swizzled ",
                     layout == SfLayoutCode::k8x4 ? "8x4" : "128x4", " layout: expected (", len,
                     ",), got ", shape_to_string(sf.shape()));
    FLASHINFER_CHECK(sf.is_contiguous(), op, arg, "a swizzled scale buffer must be contiguous");
    code = layout;
    return;
  }
  const Shape want = transposed_2d ? Shape{k / 32, rows} : Shape{rows, k / 32};
  FLASHINFER_CHECK(sf.shape() == want, op, arg, "shape mismatch for the linear layout: expected ",
                   shape_to_string(want), ", got ", shape_to_string(sf.shape()));
  code = SfLayoutCode::kLinear;
  stride_row = sf.stride(transposed_2d ? 1 : 0);
  stride_k = sf.stride(transposed_2d ? 0 : 1);
}

void check_mx_out_dtype(DType dt, const char* op, const char* arg) {
  FLASHINFER_CHECK(dt == DType::kBFloat16 || dt == DType::kFloat16, op, arg, "Unsupported output ",
                   "dtype: ", dtype_torch_name(dt),
                   ". Only torch.bfloat16 and torch.float16 are supported for MXFP8 GEMM");
}

Tensor mx_out(const std::optional<Tensor>& out, DType dt, const Shape& shape, Device device,
              const char* op, const char* dtype_arg) {
  check_mx_out_dtype(dt, op, dtype_arg);
  if (out && out->defined()) {
    api::check_shape_eq(*out, shape, op, "out");
    api::check_dtype_in(*out, {dt}, op, "out");
    FLASHINFER_CHECK(out->device() == device, op, "out", "is on ", out->device().str(),
                     " but the operands are on ", device.str());
    return *out;
  }
  return Tensor::empty(shape, dt, device);
}

}  // namespace

Tensor mm_mxfp8(const Tensor& a, const Tensor& b, const Tensor& a_descale, const Tensor& b_descale,
                std::optional<Tensor> out, DType out_dtype, bool use_8x4_sf_layout,
                std::string_view backend, bool batch_invariant) {
  return call_op<&mm_mxfp8>(
      [&] {
        const char* op = "mm_mxfp8";
        api::check_defined(a, op, "a");
        api::check_backend(op, backend, a.device());
        api::check_dim(a, {2}, op, "a");
        api::check_defined(b, op, "b");
        api::check_dim(b, {2}, op, "b");
        if (batch_invariant) {
          api::check_batch_invariant_gemm(op, backend, a.device(), out_dtype, true, a.size(1),
                                          b.size(1), 32, 1);
          FLASHINFER_CHECK(!use_8x4_sf_layout, op, "batch_invariant",
                           "batch_invariant=True does not support use_8x4_sf_layout");
        }
        api::check_same_device(b, a, op, "b", "a");
        const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
        FLASHINFER_CHECK(b.size(0) == k, op, "b", "K dimension mismatch: a.shape[1] = ", k,
                         ", b.shape[0] = ", b.size(0));
        FLASHINFER_CHECK(n >= 128 && k >= 128 && m > 0, op, "b",
                         "MXFP8 requires n >= 128 and k >= 128, got m=", m, ", n=", n, ", k=", k);
        FLASHINFER_CHECK(k % 32 == 0, op, "a", "a.shape[1] must be divisible by 32, got ", k);
        api::check_dtype_in(a, {DType::kFloat8E4M3FN}, op, "a");
        api::check_dtype_in(b, {DType::kFloat8E4M3FN}, op, "b");
        BlockScaledGemmParams p;
        set_mx(a_descale, use_8x4_sf_layout ? SfLayoutCode::k8x4 : SfLayoutCode::k128x4, m, k,
               false, a.device(), op, "a_descale", p.a_mx, p.a_mx_layout, p.a_mx_stride_row,
               p.a_mx_stride_k);
        set_mx(b_descale, SfLayoutCode::k128x4, n, k, true, a.device(), op, "b_descale", p.b_mx,
               p.b_mx_layout, p.b_mx_stride_row, p.b_mx_stride_k);
        Tensor b_run = b, b_sf_run;
        if (backend == "trtllm") {
          // trtllm-gen's weight: shuffle_matrix_a(W, 128) and shuffle_matrix_sf_a of its linear
          // scales (as upstream's test, vLLM's and SGLang's trtllm MXFP8 linear kernels prepare
          // them), un-shuffled for the CPU reference. Upstream's rules for the backend first.
          FLASHINFER_CHECK_CODE(a.device().is_cpu(), ErrorCode::kUnsupported, op, "backend",
                                "\"trtllm\" runs on the CPU reference only here");
          FLASHINFER_CHECK(out_dtype == DType::kBFloat16, op, "out_dtype",
                           "backend \"trtllm\" supports torch.bfloat16 output only, got ",
                           dtype_torch_name(out_dtype));
          FLASHINFER_CHECK(k % 256 == 0, op, "a",
                           "backend \"trtllm\" needs k a multiple of 256, got ", k);
          for (auto [t, arg] :
               {std::pair{&a_descale, "a_descale"}, std::pair{&b_descale, "b_descale"}}) {
            FLASHINFER_CHECK(
                t->dim() == 1, op, arg,
                "backend \"trtllm\" reads the scales as swizzled 1-D buffers, got shape ",
                shape_to_string(t->shape()));
          }
          std::tie(b_run, b_sf_run) = api::unshuffle_trtllm_weight(b, b_descale, n, k / 32, op);
          p.b_mx = static_cast<const uint8_t*>(b_sf_run.data_ptr());
        }
        Tensor result = mx_out(out, out_dtype, {m, n}, a.device(), op, "out_dtype");
        p.a = a.data_ptr();
        p.a_dtype = a.dtype();
        p.a_stride_m = a.stride(0);
        p.a_stride_k = a.stride(1);
        p.b = b_run.data_ptr();
        p.b_dtype = b_run.dtype();
        p.b_stride_n = b_run.stride(1);
        p.b_stride_k = b_run.stride(0);
        p.gk = k;
        p.m = m;
        p.n = n;
        p.k = k;
        gemm_fp8_fill_out(p, result);
        api::launch(kScaledGemmKernels, ScaledGemmCall{p, op}, a.device(), op, "a", false);
        return result;
      },
      a, b, a_descale, b_descale, out, out_dtype, use_8x4_sf_layout, backend, batch_invariant);
}

Tensor bmm_mxfp8(const Tensor& A, const Tensor& B, const Tensor& A_scale, const Tensor& B_scale,
                 DType dtype, std::optional<Tensor> out, std::string_view backend) {
  return call_op<&bmm_mxfp8>(
      [&] {
        const char* op = "bmm_mxfp8";
        api::check_defined(A, op, "A");
        api::check_backend(op, backend, A.device());
        api::check_dim(A, {3}, op, "A");
        api::check_defined(B, op, "B");
        api::check_dim(B, {3}, op, "B");
        api::check_same_device(B, A, op, "B", "A");
        const int64_t nb = A.size(0), m = A.size(1), k = A.size(2), n = B.size(2);
        FLASHINFER_CHECK(B.size(1) == k, op, "B", "K dimension (last dim of A) mismatch: A is ",
                         shape_to_string(A.shape()), ", B is ", shape_to_string(B.shape()));
        FLASHINFER_CHECK(B.size(0) == nb, op, "B", "batch ", B.size(0), " does not match A's ", nb);
        FLASHINFER_CHECK(n >= 128 && k >= 128 && m > 0 && nb > 0, op, "B",
                         "MXFP8 requires n >= 128 and k >= 128, got b=", nb, ", m=", m, ", n=", n,
                         ", k=", k);
        FLASHINFER_CHECK(k % 32 == 0, op, "A", "k = ", k, " must be divisible by 32");
        api::check_dtype_in(A, {DType::kFloat8E4M3FN, DType::kFloat8E5M2}, op, "A");
        api::check_dtype_in(B, {DType::kFloat8E4M3FN, DType::kFloat8E5M2}, op, "B");
        BlockScaledGemmParams p;
        const int64_t a_item = kernels::sf_buffer_size(SfLayoutCode::k128x4, m, k / 32);
        const int64_t b_item = kernels::sf_buffer_size(SfLayoutCode::k128x4, n, k / 32);
        for (auto [t, arg, item] :
             {std::tuple{&A_scale, "A_scale", a_item}, std::tuple{&B_scale, "B_scale", b_item}}) {
          api::check_defined(*t, op, arg);
          api::check_dtype_in(*t, {DType::kUInt8}, op, arg);
          api::check_same_device(*t, A, op, arg, "A");
          FLASHINFER_CHECK(t->dim() == 1, op, arg,
                           "bmm_mxfp8 requires 1D swizzled scale tensors (mxfp8_quantize(..., "
                           "is_sf_swizzled_layout=True)), got shape ",
                           shape_to_string(t->shape()));
          FLASHINFER_CHECK(t->size(0) == nb * item && t->is_contiguous(), op, arg, "expected ", nb,
                           " contiguous 128x4 buffers of ", item, " bytes (", nb * item,
                           "), got shape ", shape_to_string(t->shape()));
        }
        Tensor result = mx_out(out, dtype, {nb, m, n}, A.device(), op, "dtype");
        p.a = A.data_ptr();
        p.a_dtype = A.dtype();
        p.a_stride_b = A.stride(0);
        p.a_stride_m = A.stride(1);
        p.a_stride_k = A.stride(2);
        p.b = B.data_ptr();
        p.b_dtype = B.dtype();
        p.b_stride_b = B.stride(0);
        p.b_stride_k = B.stride(1);
        p.b_stride_n = B.stride(2);
        p.a_mx = static_cast<const uint8_t*>(A_scale.data_ptr());
        p.b_mx = static_cast<const uint8_t*>(B_scale.data_ptr());
        p.a_mx_stride_b = a_item;
        p.b_mx_stride_b = b_item;
        p.batch = nb;
        p.gk = k;
        p.m = m;
        p.n = n;
        p.k = k;
        p.out = result.data_ptr();
        p.out_dtype = result.dtype();
        p.out_stride_b = result.stride(0);
        p.out_stride_m = result.stride(1);
        p.out_stride_n = result.stride(2);
        api::launch(kScaledGemmKernels, ScaledGemmCall{p, op}, A.device(), op, "A", false);
        return result;
      },
      A, B, A_scale, B_scale, dtype, out, backend);
}

namespace {

void router_impl(const char* op, const Tensor& mat_a, const Tensor& mat_b, const Tensor& out,
                 bool pdl, int64_t hidden, int64_t experts, DType out_dtype) {
  api::check_defined(mat_a, op, "mat_a");
  api::check_upstream_arch(op, "mat_a", mat_a.device());  // Blackwell only, as upstream
  api::check_defined(mat_b, op, "mat_b");
  api::check_defined(out, op, "out");
  api::check_dim(mat_a, {2}, op, "mat_a");
  api::check_dim(mat_b, {2}, op, "mat_b");
  api::check_dim(out, {2}, op, "out");
  api::check_same_device(mat_b, mat_a, op, "mat_b", "mat_a");
  api::check_same_device(out, mat_a, op, "out", "mat_a");
  FLASHINFER_CHECK(mat_a.stride(1) == 1, op, "mat_a", "mat_a must be row-major");
  FLASHINFER_CHECK(out.stride(1) == 1, op, "out", "out must be row-major");
  FLASHINFER_CHECK(mat_b.stride(0) == 1, op, "mat_b", "mat_b must be column-major");
  FLASHINFER_CHECK(mat_a.size(1) == mat_b.size(0), op, "mat_b",
                   "mat_a.shape[1] must be equal to mat_b.shape[0]");
  FLASHINFER_CHECK(out.size(0) == mat_a.size(0), op, "out",
                   "out.shape[0] must be equal to mat_a.shape[0]");
  FLASHINFER_CHECK(out.size(1) == mat_b.size(1), op, "out",
                   "out.shape[1] must be equal to mat_b.shape[1]");
  const int64_t m = mat_a.size(0);
  FLASHINFER_CHECK(m >= 1 && m <= 16, op, "mat_a",
                   "mat_a.shape[0] (num_tokens) must be between 1 and 16, got ", m);
  FLASHINFER_CHECK(mat_a.size(1) == hidden, op, "mat_a",
                   "mat_a.shape[1] (hidden_dim) must be equal to ", hidden);
  FLASHINFER_CHECK(mat_b.size(1) == experts, op, "mat_b",
                   "mat_b.shape[1] (num_experts) must be equal to ", experts);
  api::check_dtype_in(mat_a, {DType::kBFloat16}, op, "mat_a");
  api::check_dtype_in(mat_b, {DType::kBFloat16}, op, "mat_b");
  api::check_dtype_in(out, {out_dtype}, op, "out");
  BlockScaledGemmParams p;
  p.a = mat_a.data_ptr();
  p.a_dtype = DType::kBFloat16;
  p.a_stride_m = mat_a.stride(0);
  p.a_stride_k = 1;
  p.b = mat_b.data_ptr();
  p.b_dtype = DType::kBFloat16;
  p.b_stride_n = mat_b.stride(1);
  p.b_stride_k = 1;
  p.gk = hidden;
  p.m = m;
  p.n = experts;
  p.k = hidden;
  gemm_fp8_fill_out(p, out);
  api::launch(kScaledGemmKernels, ScaledGemmCall{p, op}, mat_a.device(), op, "mat_a", pdl);
}

}  // namespace

void mm_M1_16_K7168_N128(const Tensor& mat_a, const Tensor& mat_b, const Tensor& out,
                         bool launch_with_pdl) {
  call_op<&mm_M1_16_K7168_N128>(
      [&] {
        router_impl("mm_M1_16_K7168_N128", mat_a, mat_b, out, launch_with_pdl, 7168, 128,
                    DType::kBFloat16);
      },
      mat_a, mat_b, out, launch_with_pdl);
}

void mm_M1_16_K7168_N256(const Tensor& mat_a, const Tensor& mat_b, const Tensor& out,
                         bool launch_with_pdl) {
  call_op<&mm_M1_16_K7168_N256>(
      [&] {
        router_impl("mm_M1_16_K7168_N256", mat_a, mat_b, out, launch_with_pdl, 7168, 256,
                    DType::kFloat32);
      },
      mat_a, mat_b, out, launch_with_pdl);
}

void mm_M1_16_K6144_N256(const Tensor& mat_a, const Tensor& mat_b, const Tensor& out,
                         bool launch_with_pdl) {
  call_op<&mm_M1_16_K6144_N256>(
      [&] {
        router_impl("mm_M1_16_K6144_N256", mat_a, mat_b, out, launch_with_pdl, 6144, 256,
                    DType::kFloat32);
      },
      mat_a, mat_b, out, launch_with_pdl);
}

void tinygemm_bf16(const Tensor& input, const Tensor& weight, const Tensor& out,
                   std::optional<Tensor> bias, bool use_pdl) {
  call_op<&tinygemm_bf16>(
      [&] {
        const char* op = "tinygemm_bf16";
        api::check_defined(input, op, "input");
        api::check_upstream_arch(op, "input", input.device());  // sm90+, as upstream
        for (auto [t, arg] :
             {std::pair{&input, "input"}, std::pair{&weight, "weight"}, std::pair{&out, "out"}}) {
          api::check_defined(*t, op, arg);
          api::check_dim(*t, {2}, op, arg);
          FLASHINFER_CHECK(t->is_contiguous(), op, arg, "must be contiguous (row-major)");
          api::check_dtype_in(*t, {DType::kBFloat16}, op, arg);
          api::check_same_device(*t, input, op, arg, "input");
        }
        const int64_t m = input.size(0), k = input.size(1), n = weight.size(0);
        FLASHINFER_CHECK(weight.size(1) == k, op, "weight", "input.shape[1] (", k,
                         ") must equal weight.shape[1] (", weight.size(1), ")");
        FLASHINFER_CHECK(out.size(0) == m, op, "out", "out.shape[0] (", out.size(0),
                         ") must equal input.shape[0] (", m, ")");
        FLASHINFER_CHECK(out.size(1) == n, op, "out", "out.shape[1] (", out.size(1),
                         ") must equal weight.shape[0] (", n, ")");
        FLASHINFER_CHECK(n % 16 == 0 && n > 0 && m > 0 && k > 0, op, "weight", "output_features (",
                         n,
                         ") must be a positive multiple of 16 (tile "
                         "alignment); m = ",
                         m, ", k = ", k);
        BlockScaledGemmParams p;
        if (bias && bias->defined()) {
          api::check_dim(*bias, {1}, op, "bias");
          api::check_shape_eq(*bias, {n}, op, "bias");
          api::check_dtype_in(*bias, {DType::kBFloat16}, op, "bias");
          FLASHINFER_CHECK(bias->is_contiguous(), op, "bias", "bias must be contiguous");
          api::check_same_device(*bias, input, op, "bias", "input");
          p.bias = bias->data_ptr();
        }
        p.a = input.data_ptr();
        p.a_dtype = DType::kBFloat16;
        p.a_stride_m = k;
        p.b = weight.data_ptr();
        p.b_dtype = DType::kBFloat16;
        p.b_stride_n = k;
        p.gk = k;
        p.m = m;
        p.n = n;
        p.k = k;
        gemm_fp8_fill_out(p, out);
        api::launch(kScaledGemmKernels, ScaledGemmCall{p, op}, input.device(), op, "input",
                    use_pdl);
      },
      input, weight, out, bias, use_pdl);
}

Tensor tgv_gemm_sm100(const Tensor& a, const Tensor& b, std::optional<Tensor> bias, bool pdl,
                      std::optional<Tensor> out) {
  return call_op<&tgv_gemm_sm100>(
      [&] {
        const char* op = "tgv_gemm_sm100";
        api::check_defined(a, op, "a");
        api::check_upstream_arch(op, "a", a.device());  // SM100/SM103 only, as upstream
        api::check_defined(b, op, "b");
        const bool has_bias = bias && bias->defined();
        api::check_dim(a, {2}, op, "a");
        api::check_dim(b, {2}, op, "b");
        api::check_dtype_in(a, {DType::kBFloat16, DType::kFloat16}, op, "a");
        api::check_same_dtype(b, a, op, "b", "a");
        api::check_same_device(b, a, op, "b", "a");
        const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
        FLASHINFER_CHECK(b.size(0) == k, op, "b", "k mismatch: a is ", shape_to_string(a.shape()),
                         ", b is ", shape_to_string(b.shape()));
        FLASHINFER_CHECK(m > 0 && n > 0 && k > 0, op, "a", "empty GEMM: m = ", m, ", n = ", n,
                         ", k = ", k);
        FLASHINFER_CHECK(a.stride(1) == 1 || k == 1, op, "a", "must be row-major, got strides ",
                         shape_to_string(a.strides()));
        FLASHINFER_CHECK(b.stride(0) == 1 || k == 1, op, "b",
                         "must be column-major (a transposed [n, k]), got strides ",
                         shape_to_string(b.strides()));
        if (has_bias) {
          api::check_dim(*bias, {1}, op, "bias");
          api::check_shape_eq(*bias, {n}, op, "bias");
          api::check_same_dtype(*bias, a, op, "bias", "a");
          api::check_same_device(*bias, a, op, "bias", "a");
        }
        Tensor result;
        if (out && out->defined()) {
          api::check_shape_eq(*out, {m, n}, op, "out");
          api::check_same_device(*out, a, op, "out", "a");
          api::check_same_dtype(*out, a, op, "out", "a");
          result = *out;
        } else {
          result = Tensor::empty({m, n}, a.dtype(), a.device());
        }
        BlockScaledGemmParams p;
        p.a = a.data_ptr();
        p.a_dtype = a.dtype();
        p.a_stride_m = a.stride(0);
        p.a_stride_k = a.stride(1);
        p.b = b.data_ptr();
        p.b_dtype = b.dtype();
        p.b_stride_n = b.stride(1);
        p.b_stride_k = b.stride(0);
        // The CUDA kernel reads the bias densely.
        const Tensor dense_bias = has_bias ? bias->contiguous() : Tensor();
        if (has_bias) {
          p.bias = dense_bias.data_ptr();
          p.bias_dtype = bias->dtype();
        }
        p.gk = k;
        p.m = m;
        p.n = n;
        p.k = k;
        gemm_fp8_fill_out(p, result);
        api::launch(kScaledGemmKernels, ScaledGemmCall{p, op}, a.device(), op, "a", pdl);
        return result;
      },
      a, b, bias, pdl, out);
}

namespace {

// ---- bench hooks (upstream's GEMM formulas: 2*m*n*k FLOPs; each operand, scale and the output
// counted once) ---------------------------------------------------------------------------------

int64_t gemm_fp8_round_up(int64_t x, int64_t to) { return gemm_fp8_ceil_div(x, to) * to; }

BenchCase bench_groupwise(const BenchShape& s, Device dev, bool blockscaled) {
  const DType f8 = DType::kFloat8E4M3FN, out_dt = s.out_dtype.value_or(DType::kBFloat16);
  const int64_t m = s.m, n = s.n, k = gemm_fp8_round_up(s.k, 128);
  Tensor a = api::bench::random_tensor({m, k}, f8, dev, s.random_seed);
  Tensor b = api::bench::random_tensor({n, k}, f8, dev, s.random_seed + 1);
  const int64_t gm = blockscaled ? 128 : 1;
  // Scales near 1/448 as a quantizer would write them.
  const Shape sa = blockscaled ? Shape{k / 128, gemm_fp8_ceil_div(m, gm)}
                               : Shape{gemm_fp8_ceil_div(m, gm), k / 128};
  const Shape sb = blockscaled ? Shape{k / 128, gemm_fp8_ceil_div(n, 128)}
                               : Shape{gemm_fp8_ceil_div(n, 128), k / 128};
  Tensor a_scale =
      api::bench::random_tensor(sa, DType::kFloat32, dev, s.random_seed + 2, 1.0 / 896, 1.0 / 224);
  Tensor b_scale =
      api::bench::random_tensor(sb, DType::kFloat32, dev, s.random_seed + 3, 1.0 / 896, 1.0 / 224);
  BenchCase c = blockscaled
                    ? api::bench::invoke_case("gemm_fp8_nt_blockscaled",
                                              {Value(a), Value(b), Value(a_scale), Value(b_scale)},
                                              {{"out_dtype", Value(out_dt)}})
                    : api::bench::invoke_case(
                          "gemm_fp8_nt_groupwise",
                          {Value(a), Value(b), Value(a_scale), Value(b_scale), Value("K")},
                          {{"out_dtype", Value(out_dt)}});
  c.flops = 2.0 * static_cast<double>(m * n * k);
  c.bytes = api::bench::nbytes({m, k}, f8) + api::bench::nbytes({n, k}, f8) +
            api::bench::nbytes(sa, DType::kFloat32) + api::bench::nbytes(sb, DType::kFloat32) +
            api::bench::nbytes({m, n}, out_dt);
  return c;
}

BenchCase bench_mm_fp8(const BenchShape& s, Device dev) {
  const DType f8 = DType::kFloat8E4M3FN;
  const int64_t m = s.m, n = gemm_fp8_round_up(s.n, 32), k = gemm_fp8_round_up(s.k, 128);
  Tensor a = api::bench::random_tensor({m, k}, f8, dev, s.random_seed);
  Tensor w = api::bench::random_tensor({n, k}, f8, Device::cpu(), s.random_seed + 1);
  Tensor prepared = prepare_low_latency_gemm_weights(w, Value()).to(dev);
  Tensor alpha = Tensor::full({1}, 1.0 / 448.0, DType::kFloat32).to(dev);
  BenchCase c = api::bench::invoke_case("mm_fp8", {Value(a), Value(prepared), Value(alpha)});
  c.flops = 2.0 * static_cast<double>(m * n * k);
  c.bytes = api::bench::nbytes({m, k}, f8) + api::bench::nbytes({n, k}, f8) +
            api::bench::nbytes({m, n}, DType::kBFloat16);
  return c;
}

BenchCase gemm_fp8_bench_prepare(const BenchShape& s, Device dev) {
  const int64_t n = gemm_fp8_round_up(s.n, 32), k = gemm_fp8_round_up(s.k, 128);
  Tensor w = api::bench::random_tensor({n, k}, DType::kFloat8E4M3FN, dev, s.random_seed);
  BenchCase c = api::bench::invoke_case("prepare_low_latency_gemm_weights", {Value(w), Value()});
  c.bytes = 2.0 * static_cast<double>(n * k);
  return c;
}

// The DeepSeek-V3 call: a bf16 activation quantized 1x128 inside, an fp8 weight with 128x128
// block scales.
BenchCase bench_sm90(const BenchShape& s, Device dev) {
  const int64_t m = s.m, n = gemm_fp8_round_up(s.n, 64), k = gemm_fp8_round_up(s.k, 128);
  const DType out_dt = s.out_dtype.value_or(DType::kBFloat16);
  Tensor input = api::bench::random_tensor({m, k}, DType::kBFloat16, dev, s.random_seed);
  Tensor weight = api::bench::random_tensor({n, k}, DType::kFloat8E4M3FN, dev, s.random_seed + 1);
  const Shape ws{gemm_fp8_ceil_div(n, 128), k / 128};
  Tensor wscale =
      api::bench::random_tensor(ws, DType::kFloat32, dev, s.random_seed + 2, 1.0 / 896, 1.0 / 224);
  BenchCase c = api::bench::invoke_case("fp8_blockscale_gemm_sm90",
                                        {Value(input), Value(weight), Value(), Value(wscale)},
                                        {{"out_dtype", Value(out_dt)}});
  c.flops = 2.0 * static_cast<double>(m * n * k);
  c.bytes = api::bench::nbytes({m, k}, DType::kBFloat16) +
            api::bench::nbytes({n, k}, DType::kFloat8E4M3FN) +
            api::bench::nbytes(ws, DType::kFloat32) + api::bench::nbytes({m, n}, out_dt);
  return c;
}

// Random UE8M0 bytes (scales 2^-9 .. 2^-2), padding included, generated on the host.
Tensor random_ue8m0(int64_t n, Device dev, uint64_t seed) {
  Tensor f = api::bench::random_tensor({n}, DType::kFloat32, Device::cpu(), seed, 118.0, 126.0);
  Tensor u = Tensor::empty({n}, DType::kUInt8);
  for (int64_t i = 0; i < n; ++i) {
    u.data<uint8_t>()[i] = static_cast<uint8_t>(f.data<float>()[i]);
  }
  return u.to(dev);
}

BenchCase bench_mxfp8(const BenchShape& s, Device dev, bool batched) {
  const DType f8 = DType::kFloat8E4M3FN, out_dt = s.out_dtype.value_or(DType::kBFloat16);
  const int64_t b = batched ? s.batch_size : 1;
  const int64_t m = s.m, n = std::max<int64_t>(128, s.n),
                k = gemm_fp8_round_up(std::max<int64_t>(128, s.k), 32);
  Tensor a = api::bench::random_tensor({b, m, k}, f8, dev, s.random_seed);
  Tensor w = api::bench::random_tensor({b, n, k}, f8, dev, s.random_seed + 1);
  const int64_t sa = kernels::sf_buffer_size(SfLayoutCode::k128x4, m, k / 32);
  const int64_t sb = kernels::sf_buffer_size(SfLayoutCode::k128x4, n, k / 32);
  Tensor a_sf = random_ue8m0(b * sa, dev, s.random_seed + 2);
  Tensor b_sf = random_ue8m0(b * sb, dev, s.random_seed + 3);
  BenchCase c =
      batched
          ? api::bench::invoke_case("bmm_mxfp8", {Value(a), Value(w.transpose(1, 2)), Value(a_sf),
                                                  Value(b_sf), Value(out_dt)})
          : api::bench::invoke_case("mm_mxfp8",
                                    {Value(a.select(0, 0)), Value(w.select(0, 0).transpose(0, 1)),
                                     Value(a_sf), Value(b_sf)},
                                    {{"out_dtype", Value(out_dt)}});
  c.flops = 2.0 * static_cast<double>(b * m * n * k);
  c.bytes = api::bench::nbytes({b, m, k}, f8) + api::bench::nbytes({b, n, k}, f8) +
            static_cast<double>(b * (sa + sb)) + api::bench::nbytes({b, m, n}, out_dt);
  return c;
}

// The routers at their fixed K and N with m = min(s.m, 16) tokens; tinygemm at m x k -> n.
BenchCase bench_router(const BenchShape& s, Device dev, const char* op, int64_t k, int64_t n,
                       DType out_dt) {
  const int64_t m = std::clamp<int64_t>(s.m, 1, 16);
  Tensor a = api::bench::random_tensor({m, k}, DType::kBFloat16, dev, s.random_seed);
  Tensor w =
      api::bench::random_tensor({n, k}, DType::kBFloat16, dev, s.random_seed + 1, -0.05, 0.05);
  Tensor out = Tensor::zeros({m, n}, out_dt).to(dev);
  BenchCase c = api::bench::invoke_case(op, {Value(a), Value(w.transpose(0, 1)), Value(out)});
  c.flops = 2.0 * static_cast<double>(m * n * k);
  c.bytes = api::bench::nbytes({m, k}, DType::kBFloat16) +
            api::bench::nbytes({n, k}, DType::kBFloat16) + api::bench::nbytes({m, n}, out_dt);
  return c;
}

BenchCase bench_tinygemm(const BenchShape& s, Device dev) {
  const int64_t m = s.m, n = gemm_fp8_round_up(s.n, 16), k = s.k;
  Tensor x = api::bench::random_tensor({m, k}, DType::kBFloat16, dev, s.random_seed);
  Tensor w = api::bench::random_tensor({n, k}, DType::kBFloat16, dev, s.random_seed + 1);
  Tensor bias = api::bench::random_tensor({n}, DType::kBFloat16, dev, s.random_seed + 2);
  Tensor out = Tensor::zeros({m, n}, DType::kBFloat16).to(dev);
  BenchCase c =
      api::bench::invoke_case("tinygemm_bf16", {Value(x), Value(w), Value(out), Value(bias)});
  c.flops = 2.0 * static_cast<double>(m * n * k);
  c.bytes = api::bench::nbytes({m, k}, DType::kBFloat16) +
            api::bench::nbytes({n, k}, DType::kBFloat16) +
            api::bench::nbytes({m, n}, DType::kBFloat16);
  return c;
}

BenchCase bench_tgv(const BenchShape& s, Device dev) {
  const DType dt = s.input_dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
  Tensor a = api::bench::random_tensor({s.m, s.k}, dt, dev, s.random_seed);
  Tensor w = api::bench::random_tensor({s.n, s.k}, dt, dev, s.random_seed + 1);
  Tensor bias = api::bench::random_tensor({s.n}, dt, dev, s.random_seed + 2);
  BenchCase c =
      api::bench::invoke_case("tgv_gemm_sm100", {Value(a), Value(w.transpose(0, 1)), Value(bias)});
  c.flops = 2.0 * static_cast<double>(s.m * s.n * s.k);
  c.bytes = api::bench::nbytes({s.m, s.k}, dt) + api::bench::nbytes({s.n, s.k}, dt) +
            api::bench::nbytes({s.m, s.n}, dt);
  return c;
}

}  // namespace

namespace detail {
void register_gemm_fp8_ops(OpRegistry& r) {
  declare<&gemm_fp8_nt_groupwise>(
      r,
      {.name = "gemm_fp8_nt_groupwise",
       .module = kGemmFp8Module,
       .summary = "FP8 GEMM a [m, k] x b [n, k]^T with per-block scales (default 1x128 / 128x128)"},
      "a", "b", "a_scale", "b_scale", "scale_major_mode", arg("mma_sm", 1),
      arg("scale_granularity_mnk", std::tuple<int64_t, int64_t, int64_t>{1, 128, 128}),
      arg("out").mut(), "out_dtype", arg("backend", "cutlass"));
  declare<&gemm_fp8_nt_blockscaled>(
      r,
      {.name = "gemm_fp8_nt_blockscaled",
       .module = kGemmFp8Module,
       .summary = "gemm_fp8_nt_groupwise with 128x128 scale blocks of both operands"},
      "a", "b", "a_scale", "b_scale", arg("scale_major_mode", "MN"), arg("mma_sm", 1),
      arg("out").mut(), "out_dtype");
  declare<&mm_fp8>(r,
                   {.name = "mm_fp8",
                    .module = kGemmFp8Module,
                    .summary = "FP8 GEMM of TRT-LLM's low-latency kernel (prepared weight, alpha)"},
                   "a", "b", "alpha", arg("out_dtype", DType::kBFloat16), arg("out").mut(),
                   arg("backend", "trtllm_low_latency"));
  declare<&prepare_low_latency_gemm_weights>(
      r,
      {.name = "prepare_low_latency_gemm_weights",
       .module = kLowLatencyModule,
       .summary = "Shuffle an fp8 weight [n, k] into mm_fp8's [k/128, n, 128] block layout"},
      "w", "permutation_indices_cache");
  declare<&fp8_blockscale_gemm_sm90>(
      r,
      {.name = "fp8_blockscale_gemm_sm90",
       .module = kGemmFp8Module,
       .summary = "DeepSeek-style block-scale GEMM (1x128 input, 1x128 or 128x128 weight scales)"},
      "input", "weight", "input_scale", "weight_scale", arg("out").mut(), "out_dtype");

  declare<&mm_mxfp8>(r,
                     {.name = "mm_mxfp8",
                      .module = kGemmFp8Module,
                      .summary = "MXFP8 GEMM (e4m3 operands, UE8M0 scales per 32 values)"},
                     "a", "b", "a_descale", "b_descale", arg("out").mut(),
                     arg("out_dtype", DType::kBFloat16), arg("use_8x4_sf_layout", false),
                     arg("backend", "auto"), arg("batch_invariant", false).kw());
  declare<&bmm_mxfp8>(r,
                      {.name = "bmm_mxfp8",
                       .module = kGemmFp8Module,
                       .summary = "Batched MXFP8 GEMM with 128x4-swizzled UE8M0 scales"},
                      "A", "B", "A_scale", "B_scale", "dtype", arg("out").mut(),
                      arg("backend", "auto"));

  constexpr const char* kRouterModule = "flashinfer.gemm.routergemm";
  declare<&mm_M1_16_K7168_N128>(
      r,
      {.name = "mm_M1_16_K7168_N128",
       .module = kRouterModule,
       .summary = "Router GEMM (Mistral Large 3): [1-16, 7168] x [7168, 128] bf16 -> bf16"},
      "mat_a", "mat_b", arg("out").mut(), arg("launch_with_pdl", true));
  declare<&mm_M1_16_K7168_N256>(
      r,
      {.name = "mm_M1_16_K7168_N256",
       .module = kRouterModule,
       .summary = "Router GEMM (DeepSeek-V3): [1-16, 7168] x [7168, 256] bf16 -> fp32"},
      "mat_a", "mat_b", arg("out").mut(), arg("launch_with_pdl", true));
  declare<&mm_M1_16_K6144_N256>(
      r,
      {.name = "mm_M1_16_K6144_N256",
       .module = kRouterModule,
       .summary = "Router GEMM (GLM-MoE-DSA): [1-16, 6144] x [6144, 256] bf16 -> fp32"},
      "mat_a", "mat_b", arg("out").mut(), arg("launch_with_pdl", true));
  declare<&tinygemm_bf16>(r,
                          {.name = "tinygemm_bf16",
                           .module = kRouterModule,
                           .summary = "Small bf16 GEMM with bias: out = input @ weight^T + bias"},
                          "input", "weight", arg("out").mut(), "bias", arg("use_pdl", false));

  declare<&tgv_gemm_sm100>(r,
                           {.name = "tgv_gemm_sm100",
                            .module = kGemmFp8Module,
                            .summary = "TGV GEMM: a [m, k] @ b [k, n] column-major + bias"},
                           "a", "b", arg("bias").required(), arg("pdl", false), arg("out").mut());

  api::register_backends("gemm_fp8_nt_groupwise", kScaledGemmKernels);
  api::register_backends("tgv_gemm_sm100", kScaledGemmKernels);
  for (const char* op :
       {"mm_M1_16_K7168_N128", "mm_M1_16_K7168_N256", "mm_M1_16_K6144_N256", "tinygemm_bf16"}) {
    api::register_backends(op, kScaledGemmKernels);
  }
  api::register_backends("mm_mxfp8", kScaledGemmKernels);
  api::register_backends("bmm_mxfp8", kScaledGemmKernels);
  api::register_backends("gemm_fp8_nt_blockscaled", kScaledGemmKernels);
  api::register_backends("mm_fp8", kScaledGemmKernels);
  api::register_backends("prepare_low_latency_gemm_weights", kLayoutKernels);
  api::register_backends("fp8_blockscale_gemm_sm90", kSm90Kernels);

  register_bench_hook("gemm_fp8_nt_groupwise",
                      [](const BenchShape& s, Device d) { return bench_groupwise(s, d, false); });
  register_bench_hook("gemm_fp8_nt_blockscaled",
                      [](const BenchShape& s, Device d) { return bench_groupwise(s, d, true); });
  register_bench_hook("mm_fp8", bench_mm_fp8);
  register_bench_hook("prepare_low_latency_gemm_weights", gemm_fp8_bench_prepare);
  register_bench_hook("fp8_blockscale_gemm_sm90", bench_sm90);
  register_bench_hook("mm_M1_16_K7168_N128", [](const BenchShape& s, Device d) {
    return bench_router(s, d, "mm_M1_16_K7168_N128", 7168, 128, DType::kBFloat16);
  });
  register_bench_hook("mm_M1_16_K7168_N256", [](const BenchShape& s, Device d) {
    return bench_router(s, d, "mm_M1_16_K7168_N256", 7168, 256, DType::kFloat32);
  });
  register_bench_hook("mm_M1_16_K6144_N256", [](const BenchShape& s, Device d) {
    return bench_router(s, d, "mm_M1_16_K6144_N256", 6144, 256, DType::kFloat32);
  });
  register_bench_hook("tinygemm_bf16", bench_tinygemm);
  register_bench_hook("tgv_gemm_sm100", bench_tgv);
  register_bench_hook("mm_mxfp8",
                      [](const BenchShape& s, Device d) { return bench_mxfp8(s, d, false); });
  register_bench_hook("bmm_mxfp8",
                      [](const BenchShape& s, Device d) { return bench_mxfp8(s, d, true); });
}
}  // namespace detail

}  // namespace flashinfer
