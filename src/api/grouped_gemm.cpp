// Grouped GEMMs (flashinfer.grouped_mm.core: grouped_mm_bf16/fp8/mxfp8/fp4;
// flashinfer.gemm.gemm_base: SegmentGEMMWrapper; flashinfer.gemm.kernels.
// grouped_gemm_masked_wrapper: grouped_gemm_nt_masked): declarations, argument checks, the
// problem lists every variant hands to the one generic CPU driver, dispatch, bench hooks.
#include "flashinfer/ops/grouped_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "api/backends.h"
#include "api/bench_backend.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "api/tuple_arg.h"
#include "flashinfer/float_formats.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/ops/quantization.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cpu/grouped_gemm_cpu.h"
#include "kernels/quantization_params.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/grouped_gemm_cuda.h"
#endif
#if FLASHINFER_WITH_CUDNN
#include "kernels/cuda/grouped_gemm_cudnn.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kGroupedModule = "flashinfer.grouped_mm.core";
constexpr const char* kGemmModule = "flashinfer.gemm.gemm_base";
constexpr const char* kMaskedModule = "flashinfer.gemm.kernels.grouped_gemm_masked_wrapper";

using api::KernelEntry;
using api::LaunchContext;
using kernels::GroupedGemmParams;
using kernels::GroupedOperand;
using kernels::GroupedProblem;

constexpr const char* kGroupedGemmCpuImpl =
    "CPU reference: operands dequantized exactly to fp32 per group, OpenBLAS sgemm, one rounding";

// grouped_mm_bf16: the CPU driver's problem list, and the CUDA kernel's device-side view.
struct GroupedMmCall {
  GroupedGemmParams cpu;
  kernels::GroupedMmCudaParams cuda;
  bool cudnn = false;  // backend "cudnn" (grouped_mm_bf16: cuDNN's graph where the call fits)
};

// Unit k strides and a bf16/fp16 output: each group is one call of the dense bf16 GEMM's CPU kernel
// (kernels/cpu/ gemm_cpu.h: small m reads the expert's bf16 weights in place, no fp32 copy), the
// same fp32 accumulation and one rounding; other layouts take the generic driver.
void grouped_mm_bf16_cpu(const GroupedMmCall& c) {
  const kernels::GroupedMmCudaParams& d = c.cuda;
  // (fp32 output: that kernel's small-m path rounds to bf16/fp16 only)
  if (d.a_stride_k != 1 || d.b_stride_k != 1 || d.out_dtype == DType::kFloat32) {
    kernels::cpu::grouped_gemm(c.cpu);
    return;
  }
  for (const GroupedProblem& pr : c.cpu.problems) {
    kernels::GemmParams g;
    g.a = static_cast<const uint16_t*>(d.a) + pr.a_row0 * d.a_stride_m;
    g.a_stride_m = d.a_stride_m;
    g.b = static_cast<const uint16_t*>(d.b) + pr.b_group * d.b_stride_e;
    g.b_stride_n = d.b_stride_n;
    g.out = static_cast<char*>(d.out) +
            pr.out_row0 * d.out_stride_m * static_cast<int64_t>(dtype_size(d.out_dtype));
    g.out_dtype = d.out_dtype;
    g.out_stride_m = d.out_stride_m;
    g.out_stride_n = d.out_stride_n;
    g.m = pr.m;
    g.n = d.n;
    g.k = d.k;
    kernels::cpu::gemm(g);
  }
}

constexpr KernelEntry<GroupedMmCall> kGroupedMmBf16Kernels[] = {
    {DeviceType::kCPU,
     "CPU reference: per group the dense bf16 GEMM kernel (small m reads B in place, AVX-512/"
     "AVX2; else OpenBLAS sgemm), fp32 accumulation, one rounding",
     nullptr, [](const GroupedMmCall& c, const LaunchContext&) { grouped_mm_bf16_cpu(c); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
#if FLASHINFER_WITH_CUDNN
     "cuDNN MoE grouped matmul graph where the call fits (bf16 out, unit k strides, 16-byte "
     "aligned rows); else "
#endif
     "grouped CUDA kernel of this build (tensor cores: mma.sync bf16, fp32 accumulation, every "
     "group's tiles in one launch, groups found from m_indptr on the device; strided operands on "
     "a CUDA-core kernel)",
     nullptr,
     [](const GroupedMmCall& c, const LaunchContext& ctx) {
#if FLASHINFER_WITH_CUDNN
       // Declined (layout, no libcudnn, a capture, no plan): the grouped kernel, as without cuDNN.
       if (c.cudnn && kernels::cuda::cudnn_grouped_mm(c.cuda, ctx.stream, "grouped_mm_bf16")) {
         return;
       }
#endif
       kernels::cuda::grouped_mm_bf16(c.cuda, ctx.stream);
     }},
#endif
};

// grouped_mm_fp8: the generic CPU driver; on CUDA the grouped kernel with the fp8 operands
// converted exactly to fp16 in shared memory (an fp16 MMA, fp32 accumulation, alpha at the end).
constexpr KernelEntry<GroupedMmCall> kGroupedMmFp8Kernels[] = {
    {DeviceType::kCPU, kGroupedGemmCpuImpl, nullptr,
     [](const GroupedMmCall& c, const LaunchContext&) { kernels::cpu::grouped_gemm(c.cpu); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "grouped CUDA kernel of this build (fp8 converted exactly to fp16 in shared memory, "
     "mma.sync fp16, fp32 accumulation, alpha, one rounding; strided operands on a CUDA-core "
     "kernel; no cuDNN)",
     nullptr,
     [](const GroupedMmCall& c, const LaunchContext& ctx) {
       kernels::cuda::grouped_mm_fp8(c.cuda, ctx.stream);
     }},
#endif
};

// SegmentGEMMWrapper.run: the generic CPU driver; on CUDA the grouped kernel of grouped_mm_bf16
// with the segments as its groups and weight_indices as its weight map. One launch for every
// segment (not one cuBLASLt GEMM per segment): a batch of many short segments, the serving case,
// costs one launch, and the kernel takes any operand strides as the CPU driver does.
constexpr KernelEntry<GroupedMmCall> kSegmentKernels[] = {
    {DeviceType::kCPU, kGroupedGemmCpuImpl, nullptr,
     [](const GroupedMmCall& c, const LaunchContext&) { kernels::cpu::grouped_gemm(c.cpu); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "grouped CUDA kernel of this build (one launch, segments found from seg_indptr on the "
     "device; tensor cores where x is k-contiguous and the weights k- or (fp16/bf16) "
     "n-contiguous with 16-byte aligned rows, else a CUDA-core kernel; fp32 accumulation, one "
     "rounding)",
     nullptr,
     [](const GroupedMmCall& c, const LaunchContext& ctx) {
       kernels::cuda::segment_gemm(c.cuda, ctx.stream);
     }},
#endif
};

// Every other variant: the CPU reference only.
constexpr KernelEntry<GroupedGemmParams> kCpuOnly[] = {
    {DeviceType::kCPU, kGroupedGemmCpuImpl, nullptr,
     [](const GroupedGemmParams& p, const LaunchContext&) { kernels::cpu::grouped_gemm(p); }},
};

// ---- shared checks -----------------------------------------------------------------------

// An int32/int64 1-D index tensor of `len` entries, copied to the host.
std::vector<int64_t> index_to_host(const Tensor& t, const char* op, const char* arg, int64_t len,
                                   bool int32_only) {
  api::check_defined(t, op, arg);
  api::check_dim(t, {1}, op, arg);
  if (int32_only) {
    api::check_dtype_in(t, {DType::kInt32}, op, arg);
  } else {
    api::check_dtype_in(t, {DType::kInt32, DType::kInt64}, op, arg);
  }
  FLASHINFER_CHECK(t.size(0) == len, op, arg, "expected ", len, " entries, got ", t.size(0));
  const Tensor h = t.to(Device::cpu()).contiguous();
  std::vector<int64_t> v(static_cast<std::size_t>(len));
  for (int64_t i = 0; i < len; ++i) {
    v[static_cast<std::size_t>(i)] =
        t.dtype() == DType::kInt32 ? h.data<int32_t>()[i] : h.data<int64_t>()[i];
  }
  return v;
}

// An indptr: starts >= 0, non-decreasing, ends <= rows.
void check_indptr(const std::vector<int64_t>& p, int64_t rows, const char* op, const char* arg) {
  FLASHINFER_CHECK(p.front() >= 0, op, arg, "must start at >= 0, got ", p.front());
  for (std::size_t i = 1; i < p.size(); ++i) {
    FLASHINFER_CHECK(p[i] >= p[i - 1], op, arg, "must be non-decreasing, but entry ", i, " (", p[i],
                     ") < entry ", i - 1, " (", p[i - 1], ")");
  }
  FLASHINFER_CHECK(p.back() <= rows, op, arg, "last entry ", p.back(), " exceeds the ", rows,
                   " rows of the input");
}

void grouped_gemm_check_alpha(const std::optional<Tensor>& alpha, const Tensor& a, const char* op) {
  if (!alpha || !alpha->defined()) return;
  api::check_dtype_in(*alpha, {DType::kFloat32}, op, "alpha");
  FLASHINFER_CHECK(alpha->shape() == Shape{1}, op, "alpha", "must be a scalar of shape (1,), got ",
                   shape_to_string(alpha->shape()));
  api::check_same_device(*alpha, a, op, "alpha", "a");
}

// out given: its dtype wins (upstream: out_dtype = out.dtype); else out_dtype, zero-filled so
// rows outside every group are defined.
Tensor grouped_out(const std::optional<Tensor>& out, DType out_dtype, const Shape& shape,
                   const Tensor& a, const char* op) {
  if (out && out->defined()) {
    api::check_dtype_in(*out, {DType::kFloat16, DType::kBFloat16, DType::kFloat32}, op, "out");
    FLASHINFER_CHECK(out->shape() == shape, op, "out", "out shape ", shape_to_string(out->shape()),
                     " != expected ", shape_to_string(shape));
    api::check_same_device(*out, a, op, "out", "a");
    api::check_writable(*out, op, "out");
    return *out;
  }
  FLASHINFER_CHECK(
      out_dtype == DType::kFloat16 || out_dtype == DType::kBFloat16 || out_dtype == DType::kFloat32,
      op, "out_dtype", "out_dtype must be float16, bfloat16, or float32, got ",
      dtype_torch_name(out_dtype));
  return Tensor::zeros(shape, out_dtype, a.device());
}

GroupedOperand plain_operand(const Tensor& t, bool grouped) {
  GroupedOperand o;
  o.data = t.data_ptr();
  o.dtype = t.dtype();
  o.fp4 = t.dtype() == DType::kUInt8 || t.dtype() == DType::kFloat4E2M1FNx2;
  const int64_t d = t.dim();
  o.stride_row = t.stride(d - 2);
  o.stride_k = t.stride(d - 1);
  o.stride_group = grouped ? t.stride(0) : 0;
  return o;
}

// A 128x4 swizzled scale tensor covering [rows, cols] per group (group count `groups`, the
// tensor's leading dimension when 3-D). The layout fills the documented shape exactly when rows
// is a multiple of 128 and cols of 4, which this build requires (upstream's tests use such
// shapes; cuDNN's F8_128x4 reordering is defined on those tiles).
void attach_swizzled_scales(GroupedOperand& o, const Tensor& sf, int64_t groups, int64_t rows,
                            int64_t cols, int64_t vec, bool e4m3, const char* op, const char* arg,
                            const char* rows_name) {
  FLASHINFER_CHECK(rows % 128 == 0, op, arg, "the 128x4 swizzled scale layout needs ", rows_name,
                   " to be a multiple of 128 in this build, got ", rows);
  FLASHINFER_CHECK(cols % 4 == 0, op, arg, "the 128x4 swizzled scale layout needs k / ", vec,
                   " to be a multiple of 4 in this build, got ", cols);
  FLASHINFER_CHECK(sf.is_contiguous(), op, arg, "must be contiguous (the swizzled layout)");
  const Shape want = groups > 0 ? Shape{groups, rows, cols} : Shape{rows, cols};
  FLASHINFER_CHECK(sf.shape() == want, op, arg, "expected shape ", shape_to_string(want),
                   " (swizzled 128x4), got ", shape_to_string(sf.shape()));
  o.sf = static_cast<const uint8_t*>(sf.data_ptr());
  o.sf_e4m3 = e4m3;
  o.sf_mode = 1;
  o.sf_vec = vec;
  o.sf_cols = cols;
  o.sf_stride_group = rows * cols;
}

enum class Variant { kBf16, kFp8, kMxfp8, kFp4 };

Tensor grouped_mm_impl(const char* op, Variant v, const Tensor& a, const Tensor& b,
                       const Tensor* a_descale, const Tensor* b_descale, const Tensor& m_indptr,
                       const std::optional<Tensor>& alpha, const std::optional<Tensor>& out,
                       DType out_dtype, int64_t block_size, std::string_view backend) {
  api::check_defined(a, op, "a");
  api::check_defined(b, op, "b");
  // Upstream's decorator checks the device first (the mxfp8 and fp4 variants are Blackwell-only).
  api::check_upstream_arch(op, "a", a.device());
  api::check_backend(op, backend, a.device());
  const bool fp8 = v == Variant::kFp8 || v == Variant::kMxfp8;
  if (v == Variant::kBf16) {
    api::check_dtype_in(a, {DType::kBFloat16}, op, "a");
    api::check_dtype_in(b, {DType::kBFloat16}, op, "b");
  } else if (fp8) {
    api::check_dtype_in(a, {DType::kFloat8E4M3FN, DType::kFloat8E5M2}, op, "a");
    api::check_dtype_in(b, {DType::kFloat8E4M3FN, DType::kFloat8E5M2}, op, "b");
  } else {
    api::check_dtype_in(a, {DType::kFloat4E2M1FNx2, DType::kUInt8}, op, "a");
    api::check_dtype_in(b, {DType::kFloat4E2M1FNx2, DType::kUInt8}, op, "b");
  }
  api::check_dim(a, {2}, op, "a");
  api::check_dim(b, {3}, op, "b");
  api::check_same_device(b, a, op, "b", "a");
  const int64_t E = b.size(0), cum_m = a.size(0), n = b.size(1);
  FLASHINFER_CHECK(a.size(1) == b.size(2), op, "b", "K mismatch: a has ", a.size(1), ", b has ",
                   b.size(2));
  const int64_t k = v == Variant::kFp4 ? 2 * a.size(1) : a.size(1);
  api::check_same_device(m_indptr, a, op, "m_indptr", "a");
  // On CUDA the bf16/fp8 kernels read m_indptr on the device only (as cuDNN does upstream, whose
  // checks look at its dtype and length, not its values): no device sync per call (which would
  // also stop a CUDA graph capturing it). Both kernels keep every access inside the tensors
  // whatever the entries (the tensor-core kernel clamps them to [0, cum_m], the CUDA-core one
  // searches them as given), but bad values give unspecified rows, different per kernel. Elsewhere
  // the values are checked here.
  const bool device_indptr = a.device().is_cuda() && (v == Variant::kBf16 || v == Variant::kFp8);
  std::vector<int64_t> indptr;
  if (device_indptr) {
    api::check_defined(m_indptr, op, "m_indptr");
    api::check_dim(m_indptr, {1}, op, "m_indptr");
    api::check_dtype_in(m_indptr, {DType::kInt32}, op, "m_indptr");
    FLASHINFER_CHECK(m_indptr.size(0) == E + 1, op, "m_indptr", "expected ", E + 1,
                     " entries, got ", m_indptr.size(0));
  } else {
    indptr = index_to_host(m_indptr, op, "m_indptr", E + 1, true);
    check_indptr(indptr, cum_m, op, "m_indptr");
  }
  grouped_gemm_check_alpha(alpha, a, op);

  GroupedMmCall call;
  GroupedGemmParams& p = call.cpu;
  p.a = plain_operand(a, false);
  p.b = plain_operand(b, true);
  p.n = n;
  p.k = k;
  if (v == Variant::kMxfp8 || v == Variant::kFp4) {
    const int64_t vec = v == Variant::kMxfp8 ? 32 : block_size;
    FLASHINFER_CHECK(v == Variant::kMxfp8 || block_size == 16 || block_size == 32, op, "block_size",
                     "block_size must be 16 or 32, got ", block_size);
    FLASHINFER_CHECK(k % vec == 0, op, "a", "k = ", k, " must be a multiple of the block size ",
                     vec);
    const bool e4m3 = vec == 16;
    const DType sf_dt = e4m3 ? DType::kFloat8E4M3FN : DType::kUInt8;
    api::check_defined(*a_descale, op, "a_descale");
    api::check_defined(*b_descale, op, "b_descale");
    api::check_dtype_in(*a_descale, {sf_dt}, op, "a_descale");
    api::check_dtype_in(*b_descale, {sf_dt}, op, "b_descale");
    api::check_dim(*a_descale, {2}, op, "a_descale");
    api::check_dim(*b_descale, {3}, op, "b_descale");
    api::check_same_device(*a_descale, a, op, "a_descale", "a");
    api::check_same_device(*b_descale, a, op, "b_descale", "a");
    attach_swizzled_scales(p.a, *a_descale, 0, cum_m, k / vec, vec, e4m3, op, "a_descale", "cum_m");
    attach_swizzled_scales(p.b, *b_descale, E, n, k / vec, vec, e4m3, op, "b_descale", "n");
  }
  const Tensor result = grouped_out(out, out_dtype, {cum_m, n}, a, op);
  p.alpha = alpha && alpha->defined() ? alpha->data<float>() : nullptr;
  p.out = result.data_ptr();
  p.out_dtype = result.dtype();
  p.out_stride_row = result.stride(0);
  p.out_stride_n = result.stride(1);
  for (std::size_t e = 0; e + 1 < indptr.size(); ++e) {  // (none with device_indptr)
    const int64_t r0 = indptr[e];
    const int64_t m = indptr[e + 1] - r0;
    if (m > 0) p.problems.push_back({0, r0, m, static_cast<int64_t>(e), 0, r0});
  }
  if (v == Variant::kBf16 || v == Variant::kFp8) {
    kernels::GroupedMmCudaParams& c = call.cuda;
    c.a = a.data_ptr();
    c.in_dtype = a.dtype();
    c.b_dtype = b.dtype();
    c.alpha = p.alpha;
    c.a_stride_m = a.stride(0);
    c.a_stride_k = a.stride(1);
    c.b = b.data_ptr();
    c.b_stride_e = b.stride(0);
    c.b_stride_n = b.stride(1);
    c.b_stride_k = b.stride(2);
    c.m_indptr = m_indptr.data<int32_t>() + 0;
    FLASHINFER_CHECK(m_indptr.stride(0) == 1, op, "m_indptr", "must be contiguous");
    c.num_groups = E;
    c.cum_m = cum_m;
    c.n = n;
    c.k = k;
    c.out = result.data_ptr();
    c.out_dtype = result.dtype();
    c.out_stride_m = result.stride(0);
    c.out_stride_n = result.stride(1);
    call.cudnn = backend == "cudnn";
    if (v == Variant::kBf16) {
      api::launch(kGroupedMmBf16Kernels, call, a.device(), op, "a");
    } else {
      api::launch(kGroupedMmFp8Kernels, call, a.device(), op, "a");
    }
  } else {
    api::launch(kCpuOnly, p, a.device(), op, "a");
  }
  return result;
}

}  // namespace

Tensor grouped_mm_bf16(const Tensor& a, const Tensor& b, const Tensor& m_indptr,
                       std::optional<Tensor> out, DType out_dtype, std::string_view backend,
                       int64_t tactic) {
  return call_op<&grouped_mm_bf16>(
      [&] {
        return grouped_mm_impl("grouped_mm_bf16", Variant::kBf16, a, b, nullptr, nullptr, m_indptr,
                               std::nullopt, out, out_dtype, 0, backend);
      },
      a, b, m_indptr, out, out_dtype, backend, tactic);
}

Tensor grouped_mm_fp8(const Tensor& a, const Tensor& b, const Tensor& m_indptr,
                      std::optional<Tensor> alpha, std::optional<Tensor> out, DType out_dtype,
                      std::string_view backend, int64_t tactic) {
  return call_op<&grouped_mm_fp8>(
      [&] {
        return grouped_mm_impl("grouped_mm_fp8", Variant::kFp8, a, b, nullptr, nullptr, m_indptr,
                               alpha, out, out_dtype, 0, backend);
      },
      a, b, m_indptr, alpha, out, out_dtype, backend, tactic);
}

Tensor grouped_mm_mxfp8(const Tensor& a, const Tensor& b, const Tensor& a_descale,
                        const Tensor& b_descale, const Tensor& m_indptr, std::optional<Tensor> out,
                        DType out_dtype, std::string_view backend, int64_t tactic) {
  return call_op<&grouped_mm_mxfp8>(
      [&] {
        return grouped_mm_impl("grouped_mm_mxfp8", Variant::kMxfp8, a, b, &a_descale, &b_descale,
                               m_indptr, std::nullopt, out, out_dtype, 32, backend);
      },
      a, b, a_descale, b_descale, m_indptr, out, out_dtype, backend, tactic);
}

Tensor grouped_mm_fp4(const Tensor& a, const Tensor& b, const Tensor& a_descale,
                      const Tensor& b_descale, const Tensor& m_indptr, std::optional<Tensor> alpha,
                      std::optional<Tensor> out, DType out_dtype, int64_t block_size,
                      std::string_view backend, int64_t tactic) {
  return call_op<&grouped_mm_fp4>(
      [&] {
        return grouped_mm_impl("grouped_mm_fp4", Variant::kFp4, a, b, &a_descale, &b_descale,
                               m_indptr, alpha, out, out_dtype, block_size, backend);
      },
      a, b, a_descale, b_descale, m_indptr, alpha, out, out_dtype, block_size, backend, tactic);
}

// ---- fp32 groupwise-scaled FP8 (group_gemm_fp8_nt_groupwise, DeepGEMM) -----------------------

namespace {

void check_fp8_operand(const Tensor& t, int64_t rank, const char* op, const char* arg,
                       bool e4m3_only) {
  api::check_defined(t, op, arg);
  api::check_dim(t, {rank}, op, arg);
  if (e4m3_only) {
    api::check_dtype_in(t, {DType::kFloat8E4M3FN}, op, arg);
  } else {
    api::check_dtype_in(t, {DType::kFloat8E4M3FN, DType::kFloat8E5M2}, op, arg);
  }
}

// An fp32 scale tensor of exactly `shape`, attached to `o`: (row, kk) of group g reads
// s[g * stride(group_dim) + (row / gran_row) * stride(row_dim) + (kk / gran_k) * stride(k_dim)].
void attach_fp32_scales(GroupedOperand& o, const Tensor& s, const Shape& shape, int64_t row_dim,
                        int64_t k_dim, int64_t group_dim, int64_t gran_row, int64_t gran_k,
                        const Tensor& a, const char* op, const char* arg, const char* layout) {
  api::check_defined(s, op, arg);
  api::check_dtype_in(s, {DType::kFloat32}, op, arg);
  api::check_same_device(s, a, op, arg, "a");
  FLASHINFER_CHECK(s.shape() == shape, op, arg, "expected shape ", shape_to_string(shape), " (",
                   layout, "), got ", shape_to_string(s.shape()));
  o.fs = s.data<float>();
  o.fs_gran_row = gran_row;
  o.fs_gran_k = gran_k;
  o.fs_stride_row = s.stride(row_dim);
  o.fs_stride_k = s.stride(k_dim);
  o.fs_stride_group = group_dim >= 0 ? s.stride(group_dim) : 0;
}

// out given: shape and dtype (out_dtype, when given, must match); else out_dtype or bf16,
// zero-filled. bf16/fp16 only (upstream's _validate_fp8_output_dtype).
Tensor fp8_group_out(const std::optional<Tensor>& out, std::optional<DType> out_dtype,
                     const Shape& shape, const Tensor& a, const char* op) {
  if (out && out->defined()) {
    api::check_dtype_in(*out, {DType::kBFloat16, DType::kFloat16}, op, "out");
    FLASHINFER_CHECK(out->shape() == shape, op, "out",
                     "Shape mismatch. out.shape = ", shape_to_string(out->shape()), ", expected ",
                     shape_to_string(shape));
    FLASHINFER_CHECK(!out_dtype || *out_dtype == out->dtype(), op, "out", "dtype mismatch. ",
                     "out.dtype = ", dtype_torch_name(out->dtype()),
                     ", out_dtype = ", dtype_torch_name(*out_dtype));
    api::check_same_device(*out, a, op, "out", "a");
    api::check_writable(*out, op, "out");
    return *out;
  }
  const DType dt = out_dtype.value_or(DType::kBFloat16);
  FLASHINFER_CHECK(dt == DType::kBFloat16 || dt == DType::kFloat16, op, "out_dtype",
                   "output dtype ", dtype_torch_name(dt),
                   " is not supported (expected torch.bfloat16 or torch.float16)");
  return Tensor::zeros(shape, dt, a.device());
}

// DeepGEMM takes fp32 scales as UE8M0 on SM100, upstream's only architecture for the
// *_deepgemm_* wrappers (on SM90 its scale transform raises NotImplementedError):
// `(s.view(int) >> 23).to(uint8)` keeps each scale's exponent byte, which the kernel reads as
// 2^(code - 127) (255: NaN). So a scale counts as its power of two rounded down, the sign
// dropped, 0 and subnormals as 2^-127. Returns such a copy of s (host tensors; another device's
// is returned as is, for the launch to refuse).
Tensor deepgemm_ue8m0_scales(const Tensor& s, const char* op, const char* arg) {
  api::check_defined(s, op, arg);
  api::check_dtype_in(s, {DType::kFloat32}, op, arg);
  if (!s.device().is_cpu()) return s;
  Tensor c = s.clone();
  float* v = c.data<float>();
  for (int64_t i = 0; i < c.numel(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &v[i], sizeof bits);
    const int code = static_cast<int>((bits >> 23) & 0xFFu);
    v[i] = code == 255 ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.0f, code - 127);
  }
  return c;
}

// DeepGEMM writes bf16 only (upstream: "d must be bfloat16").
Tensor deepgemm_out(const std::optional<Tensor>& out, std::optional<DType> out_dtype,
                    const Shape& shape, const Tensor& a, const char* op) {
  if (out && out->defined()) {
    api::check_dtype_in(*out, {DType::kBFloat16}, op, "out");
  } else {
    FLASHINFER_CHECK(out_dtype.value_or(DType::kBFloat16) == DType::kBFloat16, op, "out_dtype",
                     "d must be bfloat16, got ", dtype_torch_name(*out_dtype));
  }
  return fp8_group_out(out, out_dtype, shape, a, op);
}

void grouped_gemm_fill_out(GroupedGemmParams& p, const Tensor& out, bool batched) {
  p.out = out.data_ptr();
  p.out_dtype = out.dtype();
  const int64_t d = out.dim();
  p.out_stride_row = out.stride(d - 2);
  p.out_stride_n = out.stride(d - 1);
  p.out_stride_group = batched ? out.stride(0) : 0;
}

void check_deepgemm_granularity(std::tuple<int64_t, int64_t, int64_t> g, int64_t k,
                                const char* op) {
  const auto [gm, gn, gk] = g;
  FLASHINFER_CHECK(gm == 1 && gn == 128 && gk == 128, op, "scale_granularity_mnk",
                   "DeepGEMM's FP8 recipe is (1, 128, 128), got (", gm, ", ", gn, ", ", gk, ")");
  FLASHINFER_CHECK(k % 128 == 0 && k > 0, op, "a", "k = ", k,
                   " must be a positive multiple of 128 (the scale block)");
}

}  // namespace

Tensor group_gemm_fp8_nt_groupwise(const Tensor& a, const Tensor& b, const Tensor& a_scale,
                                   const Tensor& b_scale, const Tensor& m_indptr,
                                   std::tuple<int64_t, int64_t, int64_t> scale_granularity_mnk,
                                   std::string_view scale_major_mode, int64_t mma_sm,
                                   std::optional<Tensor> out, std::optional<DType> out_dtype,
                                   std::string_view backend, int64_t segment_alignment) {
  return call_op<&group_gemm_fp8_nt_groupwise>(
      [&] {
        const char* op = "group_gemm_fp8_nt_groupwise";
        // Upstream 0.7.4: the caller's promise that every group's rows are a multiple of it,
        // which only its cutile backend uses to pick a kernel (the same numbers).
        FLASHINFER_CHECK(segment_alignment >= 1, op, "segment_alignment",
                         "segment_alignment must be >= 1, but got ", segment_alignment);
        check_fp8_operand(a, 2, op, "a", false);
        check_fp8_operand(b, 3, op, "b", false);
        api::check_same_device(b, a, op, "b", "a");
        FLASHINFER_CHECK(backend == "trtllm" || backend == "cutlass", op, "backend",
                         "unknown backend '", backend, "' ('trtllm' or 'cutlass')");
        FLASHINFER_CHECK(scale_major_mode == "MN" || scale_major_mode == "K", op,
                         "scale_major_mode", "scale_major_mode must be either 'MN' or 'K', but ",
                         "got ", scale_major_mode);
        FLASHINFER_CHECK(mma_sm == 1 || mma_sm == 2, op, "mma_sm",
                         "mma_sm must be either 1 or 2, but got ", mma_sm);
        const int64_t B = b.size(0), n = b.size(1), k = b.size(2), cum = a.size(0);
        FLASHINFER_CHECK(a.size(1) == k, op, "a", "Shape mismatch. a.shape[1] = ", a.size(1),
                         ", k = ", k);
        FLASHINFER_CHECK(n % 8 == 0, op, "b", "n must be a multiple of 8, but got ", n);
        FLASHINFER_CHECK(k % 16 == 0, op, "b", "k must be a multiple of 16, but got ", k);
        const auto [gm, gn, gk] = scale_granularity_mnk;
        FLASHINFER_CHECK(gm > 0 && gn > 0 && gk > 0 && k % gk == 0, op, "scale_granularity_mnk",
                         "granularities must be positive with k (", k, ") a multiple of gk, got (",
                         gm, ", ", gn, ", ", gk, ")");
        api::check_same_device(m_indptr, a, op, "m_indptr", "a");
        const std::vector<int64_t> indptr = index_to_host(m_indptr, op, "m_indptr", B + 1, true);
        check_indptr(indptr, cum, op, "m_indptr");
        for (int64_t v : indptr) {
          FLASHINFER_CHECK(v % 4 == 0, op, "m_indptr",
                           "every entry must be a multiple of 4 (pad the groups: "
                           "pad_indptr_to_multiple_of_4), got ",
                           v);
        }
        const int64_t mb = (cum + gm - 1) / gm, nb = (n + gn - 1) / gn, kb = k / gk;
        GroupedGemmParams p;
        p.a = plain_operand(a, false);
        p.b = plain_operand(b, true);
        if (scale_major_mode == "K") {
          attach_fp32_scales(p.a, a_scale, {mb, kb}, 0, 1, -1, gm, gk, a, op, "a_scale",
                             "'K': [cum_m/gm, k/gk]");
          attach_fp32_scales(p.b, b_scale, {B, nb, kb}, 1, 2, 0, gn, gk, a, op, "b_scale",
                             "'K': [batch, n/gn, k/gk]");
        } else {
          attach_fp32_scales(p.a, a_scale, {kb, mb}, 1, 0, -1, gm, gk, a, op, "a_scale",
                             "'MN': [k/gk, cum_m/gm]");
          attach_fp32_scales(p.b, b_scale, {B, kb, nb}, 2, 1, 0, gn, gk, a, op, "b_scale",
                             "'MN': [batch, k/gk, n/gn]");
        }
        const Tensor result = fp8_group_out(out, out_dtype, {cum, n}, a, op);
        p.n = n;
        p.k = k;
        grouped_gemm_fill_out(p, result, false);
        for (int64_t e = 0; e < B; ++e) {
          const int64_t r0 = indptr[static_cast<std::size_t>(e)];
          const int64_t m = indptr[static_cast<std::size_t>(e) + 1] - r0;
          if (m > 0) p.problems.push_back({0, r0, m, e, 0, r0});
        }
        api::launch(kCpuOnly, p, a.device(), op, "a");
        return result;
      },
      a, b, a_scale, b_scale, m_indptr, scale_granularity_mnk, scale_major_mode, mma_sm, out,
      out_dtype, backend, segment_alignment);
}

namespace {

// The block-scaled grouped GEMMs with per-group padded activation scales
// (group_gemm_mxfp8_mxfp4_nt_groupwise, group_gemm_nvfp4_nt_groupwise).
Tensor padded_fp4_group_impl(const char* op, bool nvfp4, const Tensor& a, const Tensor& b,
                             const Tensor& a_scale, const Tensor& b_scale, const Tensor& m_indptr,
                             const std::optional<Tensor>& alpha, const std::optional<Tensor>& out,
                             std::optional<DType> out_dtype) {
  api::check_defined(a, op, "a");
  api::check_defined(b, op, "b");
  api::check_dim(a, {2}, op, "a");
  api::check_dim(b, {3}, op, "b");
  if (nvfp4) {
    api::check_dtype_in(a, {DType::kUInt8, DType::kFloat4E2M1FNx2}, op, "a");
  } else {
    api::check_dtype_in(a, {DType::kFloat8E4M3FN, DType::kFloat8E5M2}, op, "a");
  }
  api::check_dtype_in(b, {DType::kUInt8, DType::kFloat4E2M1FNx2}, op, "b");
  api::check_same_device(b, a, op, "b", "a");
  const int64_t B = b.size(0), n = b.size(1), k = 2 * b.size(2), cum = a.size(0);
  const int64_t vec = nvfp4 ? 16 : 32;
  FLASHINFER_CHECK(a.size(1) == (nvfp4 ? k / 2 : k), op, "a", "a.shape[1] must equal ",
                   nvfp4 ? "k / 2" : "k", " (k = ", k, "), but got ", a.size(1));
  FLASHINFER_CHECK(n % 8 == 0, op, "b", "n must be a multiple of 8, but got n=", n);
  FLASHINFER_CHECK(k % 128 == 0, op, "b", "k must be a multiple of 128, but got k=", k);
  api::check_same_device(m_indptr, a, op, "m_indptr", "a");
  const std::vector<int64_t> indptr = index_to_host(m_indptr, op, "m_indptr", B + 1, true);
  check_indptr(indptr, cum, op, "m_indptr");
  for (int64_t v : indptr) {
    FLASHINFER_CHECK(v % 4 == 0, op, "m_indptr", "every entry must be a multiple of 4, got ", v);
  }
  const int64_t cols = k / vec, n_pad = (n + 127) / 128 * 128;
  std::vector<int64_t> base, row0;
  int64_t padded = 0;
  for (int64_t e = 0; e < B; ++e) {
    const int64_t r0 = indptr[static_cast<std::size_t>(e)];
    base.push_back(padded * cols);
    row0.push_back(r0);
    padded += (indptr[static_cast<std::size_t>(e) + 1] - r0 + 127) / 128 * 128;
  }
  for (const auto& [t, arg, shape] :
       {std::tuple<const Tensor*, const char*, Shape>{&a_scale, "a_scale", {padded, cols}},
        {&b_scale, "b_scale", {B, n_pad, cols}}}) {
    api::check_defined(*t, op, arg);
    if (nvfp4) {
      api::check_dtype_in(*t, {DType::kFloat8E4M3FN, DType::kUInt8}, op, arg);
    } else {
      api::check_dtype_in(*t, {DType::kUInt8}, op, arg);
    }
    api::check_same_device(*t, a, op, arg, "a");
    FLASHINFER_CHECK(t->shape() == shape, op, arg, "expected shape ", shape_to_string(shape),
                     " (each group's rows padded to 128, swizzled 128x4), got ",
                     shape_to_string(t->shape()));
    FLASHINFER_CHECK(t->is_contiguous(), op, arg, "must be contiguous (the swizzled layout)");
  }
  const Tensor result = fp8_group_out(out, out_dtype, {cum, n}, a, op);
  GroupedGemmParams p;
  p.a = plain_operand(a, false);
  p.a.fp4 = nvfp4;
  p.b = plain_operand(b, true);
  p.b.fp4 = true;
  p.a.sf = static_cast<const uint8_t*>(a_scale.data_ptr());
  p.a.sf_e4m3 = nvfp4;
  p.a.sf_mode = 3;
  p.a.sf_vec = vec;
  p.a.sf_cols = cols;
  p.a.sf_group_base = std::move(base);
  p.a.sf_group_row0 = std::move(row0);
  p.b.sf = static_cast<const uint8_t*>(b_scale.data_ptr());
  p.b.sf_e4m3 = nvfp4;
  p.b.sf_mode = 1;
  p.b.sf_vec = vec;
  p.b.sf_cols = cols;
  p.b.sf_stride_group = n_pad * cols;
  Tensor alpha_flat;
  if (alpha && alpha->defined()) {
    api::check_dtype_in(*alpha, {DType::kFloat32}, op, "alpha");
    api::check_same_device(*alpha, a, op, "alpha", "a");
    FLASHINFER_CHECK(alpha->numel() == B, op, "alpha", "expected one value per group (", B,
                     "), got shape ", shape_to_string(alpha->shape()));
    alpha_flat = alpha->reshape({B});
    p.alpha_group = alpha_flat.data<float>();
    p.alpha_group_stride = alpha_flat.stride(0);
  }
  p.n = n;
  p.k = k;
  grouped_gemm_fill_out(p, result, false);
  for (int64_t e = 0; e < B; ++e) {
    const int64_t r0 = indptr[static_cast<std::size_t>(e)];
    const int64_t m = indptr[static_cast<std::size_t>(e) + 1] - r0;
    if (m > 0) p.problems.push_back({e, r0, m, e, 0, r0});
  }
  api::launch(kCpuOnly, p, a.device(), op, "a");
  return result;
}

void check_tiles(const char* op, int64_t mma_sm, int64_t tile_m, int64_t tile_n, int64_t tile_k,
                 bool strict) {
  if (mma_sm != 0) {
    FLASHINFER_CHECK(mma_sm == 1 || mma_sm == 2, op, "mma_sm",
                     "mma_sm must be either 1 or 2, but got ", mma_sm);
  }
  if (strict) {
    FLASHINFER_CHECK(tile_m == 128, op, "tile_m", "tile_m must be 128, but got ", tile_m);
    FLASHINFER_CHECK(tile_n == 64 || tile_n == 128 || tile_n == 192 || tile_n == 256, op, "tile_n",
                     "tile_n must be one of [64, 128, 192, 256], but got ", tile_n);
    FLASHINFER_CHECK(tile_k == 128 || tile_k == 256, op, "tile_k",
                     "tile_k must be either 128 or 256, but got ", tile_k);
  } else {
    FLASHINFER_CHECK(tile_m > 0 && tile_n > 0 && tile_k > 0, op, "tile_m",
                     "tiles must be positive, got (", tile_m, ", ", tile_n, ", ", tile_k, ")");
  }
}

}  // namespace

Tensor group_gemm_mxfp8_mxfp4_nt_groupwise(const Tensor& a, const Tensor& b, const Tensor& a_scale,
                                           const Tensor& b_scale, const Tensor& m_indptr,
                                           int64_t mma_sm, int64_t tile_m, int64_t tile_n,
                                           int64_t tile_k, bool swap_ab, std::optional<Tensor> out,
                                           std::optional<DType> out_dtype) {
  return call_op<&group_gemm_mxfp8_mxfp4_nt_groupwise>(
      [&] {
        const char* op = "group_gemm_mxfp8_mxfp4_nt_groupwise";
        check_tiles(op, mma_sm, tile_m, tile_n, tile_k, true);
        return padded_fp4_group_impl(op, false, a, b, a_scale, b_scale, m_indptr, std::nullopt, out,
                                     out_dtype);
      },
      a, b, a_scale, b_scale, m_indptr, mma_sm, tile_m, tile_n, tile_k, swap_ab, out, out_dtype);
}

Tensor group_gemm_nvfp4_nt_groupwise(const Tensor& a, const Tensor& b, const Tensor& a_scale,
                                     const Tensor& b_scale, const Tensor& m_indptr,
                                     std::optional<Tensor> alpha, int64_t tile_m, int64_t tile_n,
                                     int64_t tile_k, bool swap_ab, std::optional<Tensor> out,
                                     std::optional<DType> out_dtype) {
  return call_op<&group_gemm_nvfp4_nt_groupwise>(
      [&] {
        const char* op = "group_gemm_nvfp4_nt_groupwise";
        check_tiles(op, 0, tile_m, tile_n, tile_k, false);
        return padded_fp4_group_impl(op, true, a, b, a_scale, b_scale, m_indptr, alpha, out,
                                     out_dtype);
      },
      a, b, a_scale, b_scale, m_indptr, alpha, tile_m, tile_n, tile_k, swap_ab, out, out_dtype);
}

namespace {

// moe_gemm_fp8/mxfp8_nt_groupwise: the zero-padding row layout of the activation scales.
Tensor sm120_moe_impl(const char* op, bool mx, const Tensor& a, const Tensor& b,
                      const Tensor& a_scale, const Tensor& b_scale, const Tensor& m_indptr,
                      std::tuple<int64_t, int64_t, int64_t> gran, std::string_view mode,
                      std::string_view backend, const std::optional<Tensor>& out,
                      std::optional<DType> out_dtype, bool is_gated) {
  const auto [gm, gn, gk] = gran;
  if (mx) {
    FLASHINFER_CHECK(gm == 1 && gn == 1 && (gk == 32 || gk == 128), op, "scale_granularity_mnk",
                     "must be (1, 1, 32) or (1, 1, 128), got (", gm, ", ", gn, ", ", gk, ")");
  } else {
    FLASHINFER_CHECK(gm == 1 && gn == 128 && gk == 128, op, "scale_granularity_mnk",
                     "must be (1, 128, 128) for the FP8 float-scale kernel; got (", gm, ", ", gn,
                     ", ", gk, ")");
  }
  FLASHINFER_CHECK(mode == "MN", op, "scale_major_mode", "scale_major_mode must be \"MN\"; got \"",
                   mode, "\"");
  FLASHINFER_CHECK_CODE(backend == "cute", ErrorCode::kUnsupported, op, "backend",
                        "Only backend=\"cute\" is currently implemented; got backend=\"", backend,
                        "\"");
  check_fp8_operand(a, 2, op, "a", true);
  check_fp8_operand(b, 3, op, "b", true);
  api::check_same_device(b, a, op, "b", "a");
  const int64_t E = b.size(0), n = b.size(1), k = b.size(2), cum = a.size(0);
  FLASHINFER_CHECK(a.size(1) == k, op, "a", "k mismatch: a is ", shape_to_string(a.shape()),
                   ", b is ", shape_to_string(b.shape()));
  FLASHINFER_CHECK(!is_gated || n % 2 == 0, op, "is_gated",
                   "a gated GEMM needs an even b.shape[1] (up then gate), got ", n);
  api::check_same_device(m_indptr, a, op, "m_indptr", "a");
  const std::vector<int64_t> indptr = index_to_host(m_indptr, op, "m_indptr", E + 1, true);
  check_indptr(indptr, cum, op, "m_indptr");
  FLASHINFER_CHECK(indptr.front() == 0 && indptr.back() == cum, op, "m_indptr",
                   "must run from 0 to cum_m = ", cum, ", got ", indptr.front(), " .. ",
                   indptr.back());
  const int64_t m_pad = (cum + 3 * E) / 4 * 4;
  std::vector<int64_t> start, row0;
  for (int64_t e = 0; e < E; ++e) {
    start.push_back((indptr[static_cast<std::size_t>(e)] + 3 * e) / 4 * 4);
    row0.push_back(indptr[static_cast<std::size_t>(e)]);
  }
  const int64_t out_n = is_gated ? n / 2 : n;
  Tensor result;
  if (out && out->defined()) {
    FLASHINFER_CHECK(!out_dtype || *out_dtype == DType::kBFloat16, op, "out_dtype",
                     "Only out_dtype=torch.bfloat16 is supported; got ",
                     dtype_torch_name(*out_dtype));
    api::check_dtype_in(*out, {DType::kBFloat16}, op, "out");
    api::check_shape_eq(*out, {cum, out_n}, op, "out");
    api::check_same_device(*out, a, op, "out", "a");
    api::check_writable(*out, op, "out");
    result = *out;
  } else {
    FLASHINFER_CHECK_CODE(out_dtype.value_or(DType::kBFloat16) == DType::kBFloat16,
                          ErrorCode::kUnsupported, op, "out_dtype",
                          "Only out_dtype=torch.bfloat16 is supported; got ",
                          dtype_torch_name(*out_dtype));
    result = Tensor::zeros({cum, out_n}, DType::kBFloat16, a.device());
  }
  GroupedGemmParams p;
  p.a = plain_operand(a, false);
  p.b = plain_operand(b, true);
  if (mx) {
    const int64_t k_align = (k + 4 * gk - 1) / (4 * gk);
    for (const auto& [t, arg, shape] :
         {std::tuple<const Tensor*, const char*, Shape>{&a_scale, "a_scale", {m_pad, k_align}},
          {&b_scale, "b_scale", {E, n, k_align}}}) {
      api::check_defined(*t, op, arg);
      api::check_dtype_in(*t, {DType::kInt32}, op, arg);
      api::check_same_device(*t, a, op, arg, "a");
      FLASHINFER_CHECK(t->shape() == shape, op, arg, "expected shape ", shape_to_string(shape),
                       " (int32-packed UE8M0, per token), got ", shape_to_string(t->shape()));
      FLASHINFER_CHECK(t->is_contiguous(), op, arg, "must be contiguous");
    }
    for (GroupedOperand* o : {&p.a, &p.b}) {
      o->sf_mode = 4;
      o->sf_vec = gk;
      o->sf_row_bytes = 4 * k_align;
    }
    p.a.sf = static_cast<const uint8_t*>(a_scale.data_ptr());
    p.b.sf = static_cast<const uint8_t*>(b_scale.data_ptr());
    for (int64_t e = 0; e < E; ++e) {
      p.a.sf_group_base.push_back(start[static_cast<std::size_t>(e)] * 4 * k_align);
      p.b.sf_group_base.push_back(e * n * 4 * k_align);
      p.b.sf_group_row0.push_back(0);
    }
    p.a.sf_group_row0 = row0;
  } else {
    const int64_t kb = (k + 127) / 128, nb = (n + 127) / 128;
    attach_fp32_scales(p.a, a_scale, {kb, m_pad}, 1, 0, -1, 1, 128, a, op, "a_scale",
                       "zero-padding MN-major: [ceil(k/128), m_padded]");
    attach_fp32_scales(p.b, b_scale, {E, kb, nb}, 2, 1, 0, 128, 128, a, op, "b_scale",
                       "[num_experts, ceil(k/128), ceil(n/128)]");
    for (int64_t e = 0; e < E; ++e) {
      p.a.fs_group_base.push_back(start[static_cast<std::size_t>(e)] * a_scale.stride(1));
    }
    p.a.fs_group_row0 = row0;
  }
  p.n = n;
  p.k = k;
  p.swiglu = is_gated;
  grouped_gemm_fill_out(p, result, false);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = indptr[static_cast<std::size_t>(e)];
    const int64_t m = indptr[static_cast<std::size_t>(e) + 1] - r0;
    if (m > 0) p.problems.push_back({e, r0, m, e, 0, r0});
  }
  api::launch(kCpuOnly, p, a.device(), op, "a");
  return result;
}

}  // namespace

Tensor moe_gemm_fp8_nt_groupwise(const Tensor& a, const Tensor& b, const Tensor& a_scale,
                                 const Tensor& b_scale, const Tensor& m_indptr,
                                 std::tuple<int64_t, int64_t, int64_t> scale_granularity_mnk,
                                 std::string_view scale_major_mode, std::string_view backend,
                                 std::optional<Tensor> out, std::optional<DType> out_dtype,
                                 bool is_gated) {
  return call_op<&moe_gemm_fp8_nt_groupwise>(
      [&] {
        return sm120_moe_impl("moe_gemm_fp8_nt_groupwise", false, a, b, a_scale, b_scale, m_indptr,
                              scale_granularity_mnk, scale_major_mode, backend, out, out_dtype,
                              is_gated);
      },
      a, b, a_scale, b_scale, m_indptr, scale_granularity_mnk, scale_major_mode, backend, out,
      out_dtype, is_gated);
}

Tensor moe_gemm_mxfp8_nt_groupwise(const Tensor& a, const Tensor& b, const Tensor& a_scale,
                                   const Tensor& b_scale, const Tensor& m_indptr,
                                   std::tuple<int64_t, int64_t, int64_t> scale_granularity_mnk,
                                   std::string_view scale_major_mode, std::string_view backend,
                                   std::optional<Tensor> out, std::optional<DType> out_dtype,
                                   bool is_gated) {
  return call_op<&moe_gemm_mxfp8_nt_groupwise>(
      [&] {
        return sm120_moe_impl("moe_gemm_mxfp8_nt_groupwise", true, a, b, a_scale, b_scale, m_indptr,
                              scale_granularity_mnk, scale_major_mode, backend, out, out_dtype,
                              is_gated);
      },
      a, b, a_scale, b_scale, m_indptr, scale_granularity_mnk, scale_major_mode, backend, out,
      out_dtype, is_gated);
}

Tensor group_deepgemm_fp8_nt_groupwise(const Tensor& a, const Tensor& b, const Tensor& a_scale,
                                       const Tensor& b_scale, const Tensor& m_indices,
                                       std::tuple<int64_t, int64_t, int64_t> scale_granularity_mnk,
                                       std::optional<Tensor> out, std::optional<DType> out_dtype) {
  return call_op<&group_deepgemm_fp8_nt_groupwise>(
      [&] {
        const char* op = "group_deepgemm_fp8_nt_groupwise";
        check_fp8_operand(a, 2, op, "a", true);
        check_fp8_operand(b, 3, op, "b", true);
        api::check_same_device(b, a, op, "b", "a");
        const int64_t B = b.size(0), n = b.size(1), k = b.size(2), m = a.size(0);
        FLASHINFER_CHECK(a.size(1) == k, op, "a", "k mismatch: a is ", shape_to_string(a.shape()),
                         ", b is ", shape_to_string(b.shape()));
        check_deepgemm_granularity(scale_granularity_mnk, k, op);
        api::check_same_device(m_indices, a, op, "m_indices", "a");
        const std::vector<int64_t> idx = index_to_host(m_indices, op, "m_indices", m, true);
        GroupedGemmParams p;
        p.a = plain_operand(a, false);
        p.b = plain_operand(b, true);
        const Tensor sa = deepgemm_ue8m0_scales(a_scale, op, "a_scale");
        const Tensor sb = deepgemm_ue8m0_scales(b_scale, op, "b_scale");
        attach_fp32_scales(p.a, sa, {m, k / 128}, 0, 1, -1, 1, 128, a, op, "a_scale",
                           "per token: [m, k/128]");
        attach_fp32_scales(p.b, sb, {B, (n + 127) / 128, k / 128}, 1, 2, 0, 128, 128, a, op,
                           "b_scale", "per block: [batch, n/128, k/128]");
        const Tensor result = deepgemm_out(out, out_dtype, {m, n}, a, op);
        p.n = n;
        p.k = k;
        grouped_gemm_fill_out(p, result, false);
        // Runs of equal indices are one problem each.
        for (int64_t i = 0; i < m;) {
          const int64_t e = idx[static_cast<std::size_t>(i)];
          FLASHINFER_CHECK(e >= -1 && e < B, op, "m_indices", "m_indices[", i, "] = ", e,
                           " is outside [-1, ", B, ")");
          int64_t j = i + 1;
          while (j < m && idx[static_cast<std::size_t>(j)] == e) ++j;
          if (e >= 0) p.problems.push_back({0, i, j - i, e, 0, i});
          i = j;
        }
        api::launch(kCpuOnly, p, a.device(), op, "a");
        return result;
      },
      a, b, a_scale, b_scale, m_indices, scale_granularity_mnk, out, out_dtype);
}

Tensor batch_deepgemm_fp8_nt_groupwise(const Tensor& a, const Tensor& b, const Tensor& a_scale,
                                       const Tensor& b_scale, const Tensor& masked_m,
                                       int64_t expected_m,
                                       std::tuple<int64_t, int64_t, int64_t> scale_granularity_mnk,
                                       std::optional<Tensor> out, std::optional<DType> out_dtype) {
  return call_op<&batch_deepgemm_fp8_nt_groupwise>(
      [&] {
        const char* op = "batch_deepgemm_fp8_nt_groupwise";
        check_fp8_operand(a, 3, op, "a", true);
        check_fp8_operand(b, 3, op, "b", true);
        api::check_same_device(b, a, op, "b", "a");
        const int64_t B = a.size(0), m = a.size(1), k = a.size(2), n = b.size(1);
        FLASHINFER_CHECK(b.size(0) == B && b.size(2) == k, op, "b", "expected [", B, ", n, ", k,
                         "], got ", shape_to_string(b.shape()));
        check_deepgemm_granularity(scale_granularity_mnk, k, op);
        FLASHINFER_CHECK(expected_m >= 0, op, "expected_m", "must be >= 0, got ", expected_m);
        api::check_same_device(masked_m, a, op, "masked_m", "a");
        const std::vector<int64_t> mm = index_to_host(masked_m, op, "masked_m", B, true);
        GroupedGemmParams p;
        p.a = plain_operand(a, true);
        p.b = plain_operand(b, true);
        const Tensor sa = deepgemm_ue8m0_scales(a_scale, op, "a_scale");
        const Tensor sb = deepgemm_ue8m0_scales(b_scale, op, "b_scale");
        attach_fp32_scales(p.a, sa, {B, m, k / 128}, 1, 2, 0, 1, 128, a, op, "a_scale",
                           "per token: [batch, m, k/128]");
        attach_fp32_scales(p.b, sb, {B, (n + 127) / 128, k / 128}, 1, 2, 0, 128, 128, a, op,
                           "b_scale", "per block: [batch, n/128, k/128]");
        const Tensor result = deepgemm_out(out, out_dtype, {B, m, n}, a, op);
        p.n = n;
        p.k = k;
        grouped_gemm_fill_out(p, result, true);
        for (int64_t g = 0; g < B; ++g) {
          const int64_t rows = mm[static_cast<std::size_t>(g)];
          FLASHINFER_CHECK(rows >= 0 && rows <= m, op, "masked_m", "masked_m[", g, "] = ", rows,
                           " is outside [0, ", m, "]");
          if (rows > 0) p.problems.push_back({g, 0, rows, g, g, 0});
        }
        api::launch(kCpuOnly, p, a.device(), op, "a");
        return result;
      },
      a, b, a_scale, b_scale, masked_m, expected_m, scale_granularity_mnk, out, out_dtype);
}

// ---- SegmentGEMMWrapper ---------------------------------------------------------------------

namespace {
using SegmentInit = Init<SegmentGEMMWrapper, Tensor, std::string>;
}  // namespace

SegmentGEMMWrapper::SegmentGEMMWrapper(Tensor float_workspace_buffer, std::string backend) {
  call_init<SegmentInit>(
      [&] {
        const char* op = "SegmentGEMMWrapper.__init__";
        api::check_defined(float_workspace_buffer, op, "float_workspace_buffer");
        FLASHINFER_CHECK(backend == "auto" || backend == "sm80" || backend == "sm90", op, "backend",
                         "must be 'auto', 'sm80' or 'sm90', got '", backend, "'");
        workspace_ = float_workspace_buffer;
        backend_ = backend;
      },
      *this, float_workspace_buffer, backend);
}

// Upstream builds the indptr from `seg_lens.to(x)`: each length goes through x's dtype (torch's
// int64 -> float -> dtype conversion, round to nearest even) and back to int64 before the cumsum,
// so a bf16 x runs a segment of 257 rows as 256 and an fp8 one of 17 as 16. A replay must cover
// the rows upstream's call did. A length that becomes inf or NaN there (past fp16's 65504, past
// 464 in e4m3) has no defined row count: refused.
static int64_t seg_len_through(DType x_dtype, int64_t len, const char* op) {
  const float f = static_cast<float>(len);
  float r = f;
  switch (x_dtype) {
    case DType::kFloat16:
      r = half_bits_to_float(float_to_half_bits(f));
      break;
    case DType::kBFloat16:
      r = bfloat16_bits_to_float(float_to_bfloat16_bits(f));
      break;
    case DType::kFloat8E4M3FN:
      r = e4m3fn_bits_to_float(float_to_e4m3fn_bits(f));
      break;
    case DType::kFloat8E5M2:
      r = e5m2_bits_to_float(float_to_e5m2_bits(f));
      break;
    default:
      break;
  }
  FLASHINFER_CHECK(std::isfinite(r), op, "seg_lens", "the segment length ", len,
                   " is not finite in x's dtype ", dtype_torch_name(x_dtype),
                   " (upstream converts seg_lens to it before the cumsum)");
  return static_cast<int64_t>(r);
}

Tensor SegmentGEMMWrapper::run(const Tensor& x, const Tensor& weights, int64_t batch_size,
                               bool weight_column_major, std::optional<Tensor> out,
                               std::optional<Tensor> seg_lens, std::optional<Tensor> seg_indptr,
                               std::optional<Tensor> weight_indices) {
  return call_op<&SegmentGEMMWrapper::run>(
      [&] {
        const char* op = "SegmentGEMMWrapper.run";
        api::check_defined(x, op, "x");
        api::check_defined(weights, op, "weights");
        api::check_dim(x, {2}, op, "x");
        api::check_dim(weights, {3}, op, "weights");
        api::check_dtype_in(
            x, {DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3FN, DType::kFloat8E5M2}, op,
            "x");
        api::check_same_dtype(weights, x, op, "weights", "x");
        api::check_same_device(weights, x, op, "weights", "x");
        FLASHINFER_CHECK(batch_size >= 0, op, "batch_size", "must be >= 0, got ", batch_size);
        const int64_t cum = x.size(0), d_in = x.size(1), W = weights.size(0);
        const int64_t d_out = weight_column_major ? weights.size(1) : weights.size(2);
        const int64_t w_in = weight_column_major ? weights.size(2) : weights.size(1);
        FLASHINFER_CHECK(w_in == d_in, op, "weights", "d_in mismatch: x has ", d_in,
                         " columns, weights ", shape_to_string(weights.shape()),
                         weight_column_major ? " (column major: [num_weights, d_out, d_in])"
                                             : " (row major: [num_weights, d_in, d_out])");
        const bool has_indptr = seg_indptr && seg_indptr->defined();
        const bool has_lens = seg_lens && seg_lens->defined();
        FLASHINFER_CHECK(has_indptr || has_lens, op, "seg_lens",
                         "Either seg_lens or seg_indptr should be provided.");
        std::vector<int64_t> indptr;
        if (has_indptr) {
          api::check_same_device(*seg_indptr, x, op, "seg_indptr", "x");
          indptr = index_to_host(*seg_indptr, op, "seg_indptr", batch_size + 1, false);
          check_indptr(indptr, cum, op, "seg_indptr");
        } else {
          api::check_same_device(*seg_lens, x, op, "seg_lens", "x");
          const std::vector<int64_t> lens =
              index_to_host(*seg_lens, op, "seg_lens", batch_size, false);
          indptr.assign(1, 0);
          for (int64_t l : lens) {
            FLASHINFER_CHECK(l >= 0, op, "seg_lens", "segment lengths must be >= 0, got ", l);
            indptr.push_back(indptr.back() + seg_len_through(x.dtype(), l, op));
          }
          FLASHINFER_CHECK(indptr.back() <= cum, op, "seg_lens", "the segments cover ",
                           indptr.back(), " rows but x has ", cum);
        }
        std::vector<int64_t> widx(static_cast<std::size_t>(batch_size));
        if (weight_indices && weight_indices->defined()) {
          api::check_same_device(*weight_indices, x, op, "weight_indices", "x");
          widx = index_to_host(*weight_indices, op, "weight_indices", batch_size, false);
        } else {
          for (int64_t i = 0; i < batch_size; ++i) widx[static_cast<std::size_t>(i)] = i;
        }
        for (int64_t i = 0; i < batch_size; ++i) {
          const int64_t w = widx[static_cast<std::size_t>(i)];
          FLASHINFER_CHECK(
              w >= 0 && w < W, op,
              weight_indices && weight_indices->defined() ? "weight_indices" : "batch_size",
              "segment ", i, " selects weight ", w, ", outside [0, ", W, ")");
        }
        const bool x_fp8 = x.dtype() == DType::kFloat8E4M3FN || x.dtype() == DType::kFloat8E5M2;
        Tensor result;
        if (out && out->defined()) {
          FLASHINFER_CHECK(out->shape() == (Shape{cum, d_out}), op, "out",
                           "Output tensor shape mismatch, expected ", shape_to_string({cum, d_out}),
                           ", got ", shape_to_string(out->shape()));
          if (x_fp8) {
            api::check_dtype_in(*out, {DType::kBFloat16, DType::kFloat16}, op, "out");
          } else {
            api::check_same_dtype(*out, x, op, "out", "x");
          }
          api::check_same_device(*out, x, op, "out", "x");
          api::check_writable(*out, op, "out");
          result = *out;
        } else {
          result = Tensor::zeros({cum, d_out}, x_fp8 ? DType::kBFloat16 : x.dtype(), x.device());
        }
        GroupedMmCall call;
        GroupedGemmParams& p = call.cpu;
        p.a = plain_operand(x, false);
        p.b.data = weights.data_ptr();
        p.b.dtype = weights.dtype();
        // Logical B is [d_out, d_in] per weight.
        p.b.stride_row = weight_column_major ? weights.stride(1) : weights.stride(2);
        p.b.stride_k = weight_column_major ? weights.stride(2) : weights.stride(1);
        p.b.stride_group = weights.stride(0);
        p.n = d_out;
        p.k = d_in;
        p.out = result.data_ptr();
        p.out_dtype = result.dtype();
        p.out_stride_row = result.stride(0);
        p.out_stride_n = result.stride(1);
        for (int64_t i = 0; i < batch_size; ++i) {
          const int64_t r0 = indptr[static_cast<std::size_t>(i)];
          const int64_t m = indptr[static_cast<std::size_t>(i) + 1] - r0;
          if (m > 0) p.problems.push_back({0, r0, m, widx[static_cast<std::size_t>(i)], 0, r0});
        }
        Tensor dev_ints;  // CUDA: the segment table (indptr, then weight indices) as int32
        if (x.device().is_cuda()) {
          // The segment table goes to the device as int32 (the CUDA-core fallback's own grid
          // limit, 65535 tiles of 16 rows, is checked where it runs).
          FLASHINFER_CHECK_CODE(cum <= int64_t{0x7fffffff}, ErrorCode::kUnsupported, op, "x",
                                "x has ", cum, " rows, over the CUDA kernels' int32 row numbers");
          std::vector<int32_t> table;
          table.reserve(static_cast<std::size_t>(2 * batch_size + 1));
          for (int64_t v : indptr) table.push_back(static_cast<int32_t>(v));
          for (int64_t v : widx) table.push_back(static_cast<int32_t>(v));
          Tensor h = Tensor::empty({static_cast<int64_t>(table.size())}, DType::kInt32);
          std::memcpy(h.data_ptr(), table.data(), table.size() * sizeof(int32_t));
          dev_ints = h.to(x.device());
          kernels::GroupedMmCudaParams& c = call.cuda;
          c.a = x.data_ptr();
          c.a_stride_m = x.stride(0);
          c.a_stride_k = x.stride(1);
          c.b = weights.data_ptr();
          c.b_stride_e = weights.stride(0);
          c.b_stride_n = p.b.stride_row;
          c.b_stride_k = p.b.stride_k;
          c.in_dtype = x.dtype();
          c.b_dtype = weights.dtype();
          c.m_indptr = dev_ints.data<int32_t>();
          c.b_index = c.m_indptr + batch_size + 1;
          c.num_groups = batch_size;
          c.cum_m = cum;
          c.n = d_out;
          c.k = d_in;
          c.out = result.data_ptr();
          c.out_dtype = result.dtype();
          c.out_stride_m = result.stride(0);
          c.out_stride_n = result.stride(1);
        }
        api::launch(kSegmentKernels, call, x.device(), op, "x");
        return result;
      },
      *this, x, weights, batch_size, weight_column_major, out, seg_lens, seg_indptr,
      weight_indices);
}

// ---- grouped_gemm_nt_masked ---------------------------------------------------------------

namespace {

DType c_dtype_of(std::string_view s, const char* op) {
  if (s == "float16") return DType::kFloat16;
  if (s == "bfloat16") return DType::kBFloat16;
  if (s == "float32") return DType::kFloat32;
  if (s == "float8_e4m3fn") return DType::kFloat8E4M3FN;
  if (s == "float8_e5m2") return DType::kFloat8E5M2;
  FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, "c_dtype", "unknown c_dtype '", s,
                  "' (float16, bfloat16, float32, float8_e4m3fn, float8_e5m2)");
}

void refuse_if(bool given, const char* op, const char* arg) {
  FLASHINFER_CHECK_CODE(!given, ErrorCode::kUnsupported, op, arg,
                        "the combine-fusion / multi-rank path is not implemented by the CPU "
                        "reference of this build");
}

void masked_impl(const std::tuple<Tensor, Tensor>& lhs, const std::tuple<Tensor, Tensor>& rhs,
                 const Tensor& out, const Tensor& masked_m, std::string_view ab_dtype,
                 std::string_view sf_dtype, std::string_view c_dtype, int64_t sf_vec_size,
                 const std::optional<Tensor>& topk_weights,
                 const std::optional<Tensor>& idx_src_info,
                 const std::optional<Tensor>& rank_src_info, const std::optional<Tensor>& out_ptrs,
                 int64_t num_ranks, const std::optional<Tensor>& dst_signals,
                 const std::optional<Tensor>& barrier_flag_local,
                 const std::optional<Tensor>& barrier_flag_multicast, bool is_combine_fusion,
                 bool is_swap_ab, const GroupedGemmNtMaskedKwargs& kw) {
  const char* op = "grouped_gemm_nt_masked";
  const Tensor& A = std::get<0>(lhs);
  Tensor SFA = std::get<1>(lhs);
  const Tensor& B = std::get<0>(rhs);
  Tensor SFB = std::get<1>(rhs);
  api::check_defined(A, op, "lhs");
  api::check_defined(SFA, op, "lhs");
  api::check_defined(B, op, "rhs");
  api::check_defined(SFB, op, "rhs");
  api::check_defined(out, op, "out");
  // The gate checks written tensors against top-level tensor arguments; the tuples' items are
  // checked here, with the gate's message form.
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&A, "lhs[0]"},
                                {&SFA, "lhs[1]"},
                                {&B, "rhs[0]"},
                                {&SFB, "rhs[1]"}}) {
    FLASHINFER_CHECK(!detail::views_overlap(out, *t), op, "out", "the written argument 'out' ",
                     "must not overlap '", name, "' in memory");
  }
  refuse_if(topk_weights && topk_weights->defined(), op, "topk_weights");
  refuse_if(idx_src_info && idx_src_info->defined(), op, "idx_src_info");
  refuse_if(rank_src_info && rank_src_info->defined(), op, "rank_src_info");
  refuse_if(out_ptrs && out_ptrs->defined(), op, "out_ptrs");
  refuse_if(num_ranks != 0, op, "num_ranks");
  refuse_if(dst_signals && dst_signals->defined(), op, "dst_signals");
  refuse_if(barrier_flag_local && barrier_flag_local->defined(), op, "barrier_flag_local");
  refuse_if(barrier_flag_multicast && barrier_flag_multicast->defined(), op,
            "barrier_flag_multicast");
  refuse_if(is_combine_fusion, op, "is_combine_fusion");
  refuse_if(is_swap_ab, op, "is_swap_ab");

  const bool fp4 = ab_dtype == "float4_e2m1fn";
  DType ab = DType::kUInt8;
  if (ab_dtype == "float8_e4m3fn") {
    ab = DType::kFloat8E4M3FN;
  } else if (ab_dtype == "float8_e5m2") {
    ab = DType::kFloat8E5M2;
  } else {
    FLASHINFER_CHECK(fp4, op, "ab_dtype", "unknown ab_dtype '", ab_dtype,
                     "' (float4_e2m1fn, float8_e4m3fn, float8_e5m2)");
  }
  FLASHINFER_CHECK(sf_dtype == "float8_e8m0fnu" || sf_dtype == "float8_e4m3fn", op, "sf_dtype",
                   "unknown sf_dtype '", sf_dtype, "' (float8_e8m0fnu, float8_e4m3fn)");
  const bool sf_e4m3 = sf_dtype == "float8_e4m3fn";
  const DType c = c_dtype_of(c_dtype, op);
  // The block-scaled kernel's combinations: fp8 operands take e8m0 scales per 32; fp4 takes
  // e8m0 per 16 or 32, or e4m3 per 16 (NVFP4).
  FLASHINFER_CHECK(sf_vec_size == 16 || sf_vec_size == 32, op, "sf_vec_size",
                   "must be 16 or 32, got ", sf_vec_size);
  if (!fp4) {
    FLASHINFER_CHECK(!sf_e4m3 && sf_vec_size == 32, op, "sf_vec_size",
                     "fp8 operands take float8_e8m0fnu scales with sf_vec_size 32, got ", sf_dtype,
                     " with ", sf_vec_size);
  } else {
    FLASHINFER_CHECK(!(sf_e4m3 && sf_vec_size == 32), op, "sf_vec_size",
                     "float8_e4m3fn scales take sf_vec_size 16 (NVFP4), got 32");
  }
  for (const auto& [t, arg] : {std::pair<const Tensor*, const char*>{&A, "lhs"}, {&B, "rhs"}}) {
    api::check_dim(*t, {3}, op, arg);
    if (fp4) {
      api::check_dtype_in(*t, {DType::kUInt8, DType::kFloat4E2M1FNx2}, op, arg);
    } else {
      FLASHINFER_CHECK(t->dtype() == ab, op, arg, "dtype ", dtype_torch_name(t->dtype()),
                       " does not match ab_dtype '", ab_dtype, "'");
    }
    api::check_same_device(*t, A, op, arg, "lhs");
  }
  const int64_t m = A.size(0), l = A.size(2), n = B.size(0);
  FLASHINFER_CHECK(B.size(1) == A.size(1), op, "rhs", "k mismatch: A is ",
                   shape_to_string(A.shape()), ", B is ", shape_to_string(B.shape()));
  FLASHINFER_CHECK(B.size(2) == l, op, "rhs", "batch mismatch: A has l = ", l, ", B has ",
                   B.size(2));
  const int64_t k = fp4 ? 2 * A.size(1) : A.size(1);
  FLASHINFER_CHECK(k % sf_vec_size == 0, op, "lhs", "k = ", k, " must be a multiple of ",
                   "sf_vec_size ", sf_vec_size);
  const int64_t rk = (k / sf_vec_size + 3) / 4;
  const DType sf_dt = sf_e4m3 ? DType::kFloat8E4M3FN : DType::kUInt8;
  // The engines pass the scales as the 128x4-swizzled buffer [l, rows padded to 128, 4 rk]
  // (SGLang's swizzle_blockscale; vLLM asserts ndim == 3): the same bytes as the 6-D view upstream
  // documents (its kernel reads only the data pointer), taken as that view.
  for (auto& [t, rows] : {std::pair<Tensor*, int64_t>{&SFA, m}, {&SFB, n}}) {
    const int64_t rm = (rows + 127) / 128;
    if (t->dim() == 3 && t->size(0) == l && t->size(1) == rm * 128 && t->size(2) == rk * 4 &&
        t->is_contiguous()) {
      *t = t->view({l, rm, rk, 32, 4, 4}).permute({3, 4, 1, 5, 2, 0});
    }
  }
  for (const auto& [t, rows, arg] :
       {std::tuple<const Tensor*, int64_t, const char*>{&SFA, m, "lhs"}, {&SFB, n, "rhs"}}) {
    api::check_dtype_in(*t, {sf_dt}, op, arg);
    api::check_same_device(*t, A, op, arg, "lhs");
    const Shape want{32, 4, (rows + 127) / 128, 4, rk, l};
    FLASHINFER_CHECK(t->shape() == want, op, arg, "scale factors: expected the (32, 4, r, 4, rk, ",
                     "l) view ", shape_to_string(want), ", got ", shape_to_string(t->shape()));
  }
  api::check_dtype_in(out, {c}, op, "out");
  api::check_same_device(out, A, op, "out", "lhs");
  FLASHINFER_CHECK(out.shape() == (Shape{m, n, l}), op, "out", "expected the (m, n, l) view ",
                   shape_to_string({m, n, l}), ", got ", shape_to_string(out.shape()));
  api::check_writable(out, op, "out");
  api::check_same_device(masked_m, A, op, "masked_m", "lhs");
  // kCpuOnly's refusal of another device first, so a refused call reads nothing back from it.
  if (!A.device().is_cpu()) api::launch_detail::no_backend(op, "lhs", A.device());
  const std::vector<int64_t> mm = index_to_host(masked_m, op, "masked_m", l, true);
  for (int64_t g = 0; g < l; ++g) {
    const int64_t v = mm[static_cast<std::size_t>(g)];
    FLASHINFER_CHECK(v >= 0 && v <= m, op, "masked_m", "masked_m[", g, "] = ", v,
                     " is outside [0, ", m, "]");
  }
  const Tensor* alpha = kw.alpha && kw.alpha->defined() ? &*kw.alpha : nullptr;
  if (alpha) {
    FLASHINFER_CHECK(kw.alpha_dtype.has_value(), op, "alpha_dtype",
                     "alpha_dtype is required when alpha is provided");
    FLASHINFER_CHECK(*kw.alpha_dtype == "float32", op, "alpha_dtype",
                     "only 'float32' is supported, got '", *kw.alpha_dtype, "'");
    api::check_dtype_in(*alpha, {DType::kFloat32}, op, "alpha");
    api::check_same_device(*alpha, A, op, "alpha", "lhs");
    FLASHINFER_CHECK(alpha->numel() == l, op, "alpha", "expected ", l,
                     " per-batch values (any shape holding l), got shape ",
                     shape_to_string(alpha->shape()));
  }
  const auto [tm, tn] = kw.mma_tiler_mn;
  FLASHINFER_CHECK((tm == 128 || tm == 256) && (tn == 64 || tn == 128 || tn == 192 || tn == 256),
                   op, "mma_tiler_mn", "unsupported MMA tiler (", tm, ", ", tn, ")");
  const auto [cm, cn] = kw.cluster_shape_mn;
  FLASHINFER_CHECK(cm > 0 && cn > 0, op, "cluster_shape_mn", "must be positive, got (", cm, ", ",
                   cn, ")");

  GroupedGemmParams p;
  auto operand = [&](const Tensor& t, const Tensor& sf) {
    GroupedOperand o;
    o.data = t.data_ptr();
    o.dtype = fp4 ? DType::kUInt8 : t.dtype();
    o.fp4 = fp4;
    o.stride_row = t.stride(0);
    o.stride_k = t.stride(1);
    o.stride_group = t.stride(2);
    o.sf = static_cast<const uint8_t*>(sf.data_ptr());
    o.sf_e4m3 = sf_e4m3;
    o.sf_mode = 2;
    o.sf_vec = sf_vec_size;
    for (int i = 0; i < 6; ++i) o.sf6[i] = sf.stride(i);
    return o;
  };
  p.a = operand(A, SFA);
  p.b = operand(B, SFB);
  p.n = n;
  p.k = k;
  p.out = out.data_ptr();
  p.out_dtype = out.dtype();
  p.out_stride_row = out.stride(0);
  p.out_stride_n = out.stride(1);
  p.out_stride_group = out.stride(2);
  Tensor alpha_flat;
  if (alpha) {
    alpha_flat = alpha->reshape({l});
    p.alpha_group = alpha_flat.data<float>();
    p.alpha_group_stride = alpha_flat.stride(0);
  }
  for (int64_t g = 0; g < l; ++g) {
    const int64_t rows = mm[static_cast<std::size_t>(g)];
    if (rows > 0) p.problems.push_back({g, 0, rows, g, g, 0});
  }
  api::launch(kCpuOnly, p, A.device(), op, "lhs");
}

}  // namespace

Tensor grouped_gemm_nt_masked(std::tuple<Tensor, Tensor> lhs, std::tuple<Tensor, Tensor> rhs,
                              const Tensor& out, const Tensor& masked_m, std::string_view ab_dtype,
                              std::string_view sf_dtype, std::string_view c_dtype,
                              int64_t sf_vec_size, std::optional<Tensor> topk_weights,
                              std::optional<Tensor> idx_src_info,
                              std::optional<Tensor> rank_src_info, std::optional<Tensor> out_ptrs,
                              int64_t num_ranks, std::optional<Tensor> dst_signals,
                              std::optional<int64_t> sm_count,
                              std::optional<Tensor> barrier_flag_local,
                              std::optional<Tensor> barrier_flag_multicast, bool is_combine_fusion,
                              bool is_swap_ab, GroupedGemmNtMaskedKwargs kwargs) {
  return call_op<&grouped_gemm_nt_masked>(
      [&] {
        masked_impl(lhs, rhs, out, masked_m, ab_dtype, sf_dtype, c_dtype, sf_vec_size, topk_weights,
                    idx_src_info, rank_src_info, out_ptrs, num_ranks, dst_signals,
                    barrier_flag_local, barrier_flag_multicast, is_combine_fusion, is_swap_ab,
                    kwargs);
        return out;
      },
      lhs, rhs, out, masked_m, ab_dtype, sf_dtype, c_dtype, sf_vec_size, topk_weights, idx_src_info,
      rank_src_info, out_ptrs, num_ranks, dst_signals, sm_count, barrier_flag_local,
      barrier_flag_multicast, is_combine_fusion, is_swap_ab, kwargs);
}

// ---- bench hooks ------------------------------------------------------------------------------

namespace {

// E = batch_size experts; group e gets m + 3 * (e % 4) rows (the last group empty when E > 2),
// so groups differ and one is empty while every group stays near m tokens, as a MoE layer's
// routing spreads them (scripts/gpu_check_report.py grouped_indptr mirrors this for the torch
// loop it is compared with); the block-scaled variants round every group to 128 rows (their
// swizzled scale layouts' rule).
std::vector<int64_t> grouped_gemm_bench_indptr(const BenchShape& s, bool rows128) {
  const int64_t E = std::max<int64_t>(s.batch_size, 1);
  std::vector<int64_t> p(1, 0);
  for (int64_t e = 0; e < E; ++e) {
    int64_t m = (E > 2 && e == E - 1) ? 0 : s.m + 3 * (e % 4);
    if (rows128) m = (m + 127) / 128 * 128;
    p.push_back(p.back() + m);
  }
  return p;
}

double grouped_flops(const std::vector<int64_t>& p, int64_t n, int64_t k) {
  return 2.0 * static_cast<double>(p.back() * n * k);
}

BenchCase bench_grouped_mm_bf16(const BenchShape& s, Device dev) {
  const DType bf = DType::kBFloat16, out_dt = s.out_dtype.value_or(bf);
  const std::vector<int64_t> p = grouped_gemm_bench_indptr(s, false);
  const int64_t E = static_cast<int64_t>(p.size()) - 1, cum = p.back();
  Tensor a = api::bench::random_tensor({cum, s.k}, bf, dev, s.random_seed);
  Tensor b = api::bench::random_tensor({E, s.n, s.k}, bf, dev, s.random_seed + 1);
  BenchCase c = api::bench::invoke_case(
      "grouped_mm_bf16", {Value(a), Value(b), Value(api::bench::int32_tensor(p, dev))},
      {{"out_dtype", Value(out_dt)}, {"backend", Value(api::bench::op_backend("cudnn"))}});
  c.flops = grouped_flops(p, s.n, s.k);
  c.bytes = api::bench::nbytes({cum, s.k}, bf) + api::bench::nbytes({E, s.n, s.k}, bf) +
            api::bench::nbytes({cum, s.n}, out_dt);
  return c;
}

BenchCase bench_grouped_mm_fp8(const BenchShape& s, Device dev) {
  const DType f8 = DType::kFloat8E4M3FN, out_dt = s.out_dtype.value_or(DType::kBFloat16);
  const std::vector<int64_t> p = grouped_gemm_bench_indptr(s, false);
  const int64_t E = static_cast<int64_t>(p.size()) - 1, cum = p.back();
  Tensor a = api::bench::random_tensor({cum, s.k}, f8, dev, s.random_seed);
  Tensor b = api::bench::random_tensor({E, s.n, s.k}, f8, dev, s.random_seed + 1);
  Tensor alpha = Tensor::full({1}, 0.5, DType::kFloat32).to(dev);
  BenchCase c = api::bench::invoke_case(
      "grouped_mm_fp8", {Value(a), Value(b), Value(api::bench::int32_tensor(p, dev)), Value(alpha)},
      {{"out_dtype", Value(out_dt)}, {"backend", Value(api::bench::op_backend("cudnn"))}});
  c.flops = grouped_flops(p, s.n, s.k);
  c.bytes = api::bench::nbytes({cum, s.k}, f8) + api::bench::nbytes({E, s.n, s.k}, f8) +
            api::bench::nbytes({cum, s.n}, out_dt);
  return c;
}

// Random scale bytes in a narrow exponent range (ue8m0 127 +- 2, or e4m3 codes of 0.25..2).
Tensor random_scales(const Shape& shape, bool e4m3, Device dev, uint64_t seed) {
  Tensor u = api::bench::random_tensor(shape, DType::kFloat32, Device::cpu(), seed, 0.0, 1.0);
  Tensor out = Tensor::empty(shape, e4m3 ? DType::kFloat8E4M3FN : DType::kUInt8);
  const float* src = u.data<float>();
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  for (int64_t i = 0; i < u.numel(); ++i) {
    const int step = static_cast<int>(src[i] * 5.0f);  // 0..4
    dst[i] = e4m3 ? static_cast<uint8_t>(0x30 + 4 * step) : static_cast<uint8_t>(125 + step);
  }
  return out.to(dev);
}

BenchCase bench_grouped_mm_scaled(const BenchShape& s, Device dev, bool fp4, int64_t block) {
  const DType out_dt = s.out_dtype.value_or(DType::kBFloat16);
  const std::vector<int64_t> p = grouped_gemm_bench_indptr(s, true);
  const int64_t E = static_cast<int64_t>(p.size()) - 1, cum = p.back();
  const int64_t n = (s.n + 127) / 128 * 128, k = (s.k + 127) / 128 * 128;
  const bool e4m3 = fp4 && block == 16;
  Tensor a, b;
  if (fp4) {
    // Random bytes: every e2m1 code pair (no NaN in e2m1).
    a = api::bench::random_tensor({cum, k / 2}, DType::kFloat32, Device::cpu(), s.random_seed, 0.0,
                                  255.0)
            .to(DType::kUInt8)
            .to(dev);
    b = api::bench::random_tensor({E, n, k / 2}, DType::kFloat32, Device::cpu(), s.random_seed + 1,
                                  0.0, 255.0)
            .to(DType::kUInt8)
            .to(dev);
  } else {
    a = api::bench::random_tensor({cum, k}, DType::kFloat8E4M3FN, dev, s.random_seed);
    b = api::bench::random_tensor({E, n, k}, DType::kFloat8E4M3FN, dev, s.random_seed + 1);
  }
  Tensor sa = random_scales({cum, k / block}, e4m3, dev, s.random_seed + 2);
  Tensor sb = random_scales({E, n, k / block}, e4m3, dev, s.random_seed + 3);
  Tensor m_indptr = api::bench::int32_tensor(p, dev);
  BenchCase c =
      fp4 ? api::bench::invoke_case("grouped_mm_fp4",
                                    {Value(a), Value(b), Value(sa), Value(sb), Value(m_indptr),
                                     Value(Tensor::full({1}, 0.25, DType::kFloat32).to(dev))},
                                    {{"out_dtype", Value(out_dt)}, {"block_size", Value(block)}})
          : api::bench::invoke_case("grouped_mm_mxfp8",
                                    {Value(a), Value(b), Value(sa), Value(sb), Value(m_indptr)},
                                    {{"out_dtype", Value(out_dt)}});
  c.flops = grouped_flops(p, n, k);
  const double elem = fp4 ? 0.5 : 1.0;
  c.bytes = elem * static_cast<double>((cum + E * n) * k) +
            static_cast<double>((cum + E * n) * k / block) + api::bench::nbytes({cum, n}, out_dt);
  return c;
}

// Segments of s.m + i rows (one empty), weights chosen in reverse order, row-major [d_in, d_out]
// weights of the input dtype (fp16 when the variant asks for it, else bf16).
BenchCase bench_segment_gemm(const BenchShape& s, Device dev) {
  const DType dt = s.input_dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
  const std::vector<int64_t> p = grouped_gemm_bench_indptr(s, false);
  const int64_t B = static_cast<int64_t>(p.size()) - 1, cum = p.back();
  Tensor x = api::bench::random_tensor({cum, s.k}, dt, dev, s.random_seed);
  Tensor w = api::bench::random_tensor({B, s.k, s.n}, dt, dev, s.random_seed + 1);
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < B; ++i) idx.push_back(B - 1 - i);
  Tensor indptr = api::bench::int32_tensor(p, dev).to(DType::kInt64);
  Tensor widx = api::bench::int32_tensor(idx, dev).to(DType::kInt64);
  auto obj = std::make_shared<SegmentGEMMWrapper>(Tensor::empty({1024}, DType::kUInt8, dev));
  BenchCase c = api::bench::invoke_case(
      "SegmentGEMMWrapper.run",
      {api::bench::bench_object(obj), Value(x), Value(w), Value(B), Value(false)},
      {{"seg_indptr", Value(indptr)}, {"weight_indices", Value(widx)}});
  c.flops = grouped_flops(p, s.n, s.k);
  c.bytes = api::bench::nbytes({cum, s.k}, dt) + api::bench::nbytes({B, s.k, s.n}, dt) +
            api::bench::nbytes({cum, s.n}, dt);
  return c;
}

// Masked NVFP4 (the engines' case): l = batch_size batches of up to m rows, masked_m cycling
// through m, m/2, 0, ...; A, B and the scale factors as physically [l, ...] buffers viewed
// (m, k/2, l) and (32, 4, r, 4, rk, l); out [l, m, n] viewed (m, n, l).
BenchCase bench_masked(const BenchShape& s, Device dev) {
  const int64_t l = std::max<int64_t>(s.batch_size, 1), m = s.m;
  const int64_t n = s.n, k = (s.k + 63) / 64 * 64;
  const int64_t rk = (k / 16 + 3) / 4, rm = (m + 127) / 128, rn = (n + 127) / 128;
  auto bytes = [&](const Shape& shape, uint64_t seed) {
    return api::bench::random_tensor(shape, DType::kFloat32, Device::cpu(), seed, 0.0, 255.0)
        .to(DType::kUInt8)
        .to(dev);
  };
  Tensor A = bytes({l, m, k / 2}, s.random_seed).permute({1, 2, 0});
  Tensor B = bytes({l, n, k / 2}, s.random_seed + 1).permute({1, 2, 0});
  Tensor sfa = random_scales({l, rm, rk, 32, 4, 4}, true, dev, s.random_seed + 2)
                   .permute({3, 4, 1, 5, 2, 0});
  Tensor sfb = random_scales({l, rn, rk, 32, 4, 4}, true, dev, s.random_seed + 3)
                   .permute({3, 4, 1, 5, 2, 0});
  Tensor out = Tensor::zeros({l, m, n}, DType::kBFloat16, dev).permute({1, 2, 0});
  std::vector<int64_t> mm;
  for (int64_t g = 0; g < l; ++g) mm.push_back(g % 3 == 0 ? m : (g % 3 == 1 ? m / 2 : 0));
  Tensor alpha = api::bench::random_tensor({l}, DType::kFloat32, dev, s.random_seed + 4, 0.5, 1.5);
  BenchCase c = api::bench::invoke_case(
      "grouped_gemm_nt_masked",
      {Value::tuple({Value(A), Value(sfa)}), Value::tuple({Value(B), Value(sfb)}), Value(out),
       Value(api::bench::int32_tensor(mm, dev))},
      {{"ab_dtype", Value("float4_e2m1fn")},
       {"sf_dtype", Value("float8_e4m3fn")},
       {"c_dtype", Value("bfloat16")},
       {"sf_vec_size", Value(int64_t{16})},
       {"alpha", Value(alpha.reshape({1, 1, l}))},
       {"alpha_dtype", Value("float32")}});
  int64_t rows = 0;
  for (int64_t v : mm) rows += v;
  c.flops = 2.0 * static_cast<double>(rows * n * k);
  c.bytes = 0.5 * static_cast<double>((rows + l * n) * k) +
            static_cast<double>((rows + l * n) * k / 16) +
            api::bench::nbytes({rows, n}, DType::kBFloat16);
  return c;
}

Tensor grouped_gemm_scale_tensor(const Shape& shape, Device dev, uint64_t seed) {
  return api::bench::random_tensor(shape, DType::kFloat32, dev, seed, 0.01, 0.02);
}

// Groups of s.m + 3e rows rounded up to 4 (the kernel's rule), one empty; "MN" scales.
BenchCase bench_group_gemm_fp8(const BenchShape& s, Device dev) {
  std::vector<int64_t> p = grouped_gemm_bench_indptr(s, false);
  for (std::size_t i = 1; i < p.size(); ++i) p[i] = (p[i] + 3) / 4 * 4;
  const int64_t B = static_cast<int64_t>(p.size()) - 1, cum = p.back();
  const int64_t n = (s.n + 7) / 8 * 8, k = (s.k + 127) / 128 * 128;
  const DType f8 = DType::kFloat8E4M3FN,
              out_dt = s.out_dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
  Tensor a = api::bench::random_tensor({cum, k}, f8, dev, s.random_seed);
  Tensor b = api::bench::random_tensor({B, n, k}, f8, dev, s.random_seed + 1);
  BenchCase c = api::bench::invoke_case(
      "group_gemm_fp8_nt_groupwise",
      {Value(a), Value(b), Value(grouped_gemm_scale_tensor({k / 128, cum}, dev, s.random_seed + 2)),
       Value(grouped_gemm_scale_tensor({B, k / 128, (n + 127) / 128}, dev, s.random_seed + 3)),
       Value(api::bench::int32_tensor(p, dev))},
      {{"out_dtype", Value(out_dt)}});
  c.flops = grouped_flops(p, n, k);
  c.bytes = api::bench::nbytes({cum, k}, f8) + api::bench::nbytes({B, n, k}, f8) +
            api::bench::nbytes({cum, n}, out_dt);
  return c;
}

// Rows assigned expert by expert (uneven runs), every eighth row a -1 padding row.
BenchCase bench_group_deepgemm(const BenchShape& s, Device dev) {
  const int64_t B = std::max<int64_t>(s.batch_size, 1), m = s.m;
  const int64_t n = (s.n + 127) / 128 * 128, k = (s.k + 127) / 128 * 128;
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < m; ++i) idx.push_back(i % 8 == 7 ? -1 : (i * B) / m);
  const DType f8 = DType::kFloat8E4M3FN;
  BenchCase c = api::bench::invoke_case(
      "group_deepgemm_fp8_nt_groupwise",
      {Value(api::bench::random_tensor({m, k}, f8, dev, s.random_seed)),
       Value(api::bench::random_tensor({B, n, k}, f8, dev, s.random_seed + 1)),
       Value(grouped_gemm_scale_tensor({m, k / 128}, dev, s.random_seed + 2)),
       Value(grouped_gemm_scale_tensor({B, n / 128, k / 128}, dev, s.random_seed + 3)),
       Value(api::bench::int32_tensor(idx, dev))},
      // out given: the padding rows are not written, so they keep its (defined) zeros
      {{"out", Value(Tensor::zeros({m, n}, DType::kBFloat16, dev))}});
  c.flops = 2.0 * static_cast<double>(m * n * k);
  c.bytes = api::bench::nbytes({m, k}, f8) + api::bench::nbytes({B, n, k}, f8) +
            api::bench::nbytes({m, n}, DType::kBFloat16);
  return c;
}

BenchCase bench_batch_deepgemm(const BenchShape& s, Device dev) {
  const int64_t B = std::max<int64_t>(s.batch_size, 1), m = s.m;
  const int64_t n = (s.n + 127) / 128 * 128, k = (s.k + 127) / 128 * 128;
  std::vector<int64_t> mm;
  for (int64_t g = 0; g < B; ++g) mm.push_back(g % 3 == 0 ? m : (g % 3 == 1 ? m / 3 : 0));
  const DType f8 = DType::kFloat8E4M3FN;
  BenchCase c = api::bench::invoke_case(
      "batch_deepgemm_fp8_nt_groupwise",
      {Value(api::bench::random_tensor({B, m, k}, f8, dev, s.random_seed)),
       Value(api::bench::random_tensor({B, n, k}, f8, dev, s.random_seed + 1)),
       Value(grouped_gemm_scale_tensor({B, m, k / 128}, dev, s.random_seed + 2)),
       Value(grouped_gemm_scale_tensor({B, n / 128, k / 128}, dev, s.random_seed + 3)),
       Value(api::bench::int32_tensor(mm, dev)), Value(m)},
      // out given: rows past masked_m are not written, so they keep its (defined) zeros
      {{"out", Value(Tensor::zeros({B, m, n}, DType::kBFloat16, dev))}});
  int64_t rows = 0;
  for (int64_t v : mm) rows += v;
  c.flops = 2.0 * static_cast<double>(rows * n * k);
  c.bytes = api::bench::nbytes({B, m, k}, f8) + api::bench::nbytes({B, n, k}, f8) +
            api::bench::nbytes({B, m, n}, DType::kBFloat16);
  return c;
}

// Groups of s.m + 3e rows rounded to 4 (one empty); activation scales per group padded to 128.
BenchCase bench_padded_fp4(const BenchShape& s, Device dev, bool nvfp4) {
  std::vector<int64_t> p = grouped_gemm_bench_indptr(s, false);
  for (std::size_t i = 1; i < p.size(); ++i) p[i] = (p[i] + 3) / 4 * 4;
  const int64_t B = static_cast<int64_t>(p.size()) - 1, cum = p.back();
  const int64_t n = (s.n + 7) / 8 * 8, k = (s.k + 127) / 128 * 128, vec = nvfp4 ? 16 : 32;
  int64_t padded = 0;
  for (int64_t e = 0; e < B; ++e) {
    padded +=
        (p[static_cast<std::size_t>(e) + 1] - p[static_cast<std::size_t>(e)] + 127) / 128 * 128;
  }
  auto bytes = [&](const Shape& shape, uint64_t seed) {
    return api::bench::random_tensor(shape, DType::kFloat32, Device::cpu(), seed, 0.0, 255.0)
        .to(DType::kUInt8)
        .to(dev);
  };
  Tensor a = nvfp4 ? bytes({cum, k / 2}, s.random_seed)
                   : api::bench::random_tensor({cum, k}, DType::kFloat8E4M3FN, dev, s.random_seed);
  Tensor b = bytes({B, n, k / 2}, s.random_seed + 1);
  Tensor sa = random_scales({padded, k / vec}, nvfp4, dev, s.random_seed + 2);
  Tensor sb = random_scales({B, (n + 127) / 128 * 128, k / vec}, nvfp4, dev, s.random_seed + 3);
  Tensor ip = api::bench::int32_tensor(p, dev);
  BenchCase c =
      nvfp4
          ? api::bench::invoke_case("group_gemm_nvfp4_nt_groupwise",
                                    {Value(a), Value(b), Value(sa), Value(sb), Value(ip),
                                     Value(api::bench::random_tensor({B}, DType::kFloat32, dev,
                                                                     s.random_seed + 4, 0.5, 1.5))})
          : api::bench::invoke_case("group_gemm_mxfp8_mxfp4_nt_groupwise",
                                    {Value(a), Value(b), Value(sa), Value(sb), Value(ip)});
  c.flops = grouped_flops(p, n, k);
  c.bytes = (nvfp4 ? 0.5 : 1.0) * static_cast<double>(cum * k) +
            0.5 * static_cast<double>(B * n * k) + api::bench::nbytes({cum, n}, DType::kBFloat16);
  return c;
}

// Token-packed groups (one empty), zero-padding scale rows; gated in the fp8 case.
BenchCase bench_sm120_moe(const BenchShape& s, Device dev, bool mx) {
  const std::vector<int64_t> p = grouped_gemm_bench_indptr(s, false);
  const int64_t E = static_cast<int64_t>(p.size()) - 1, cum = p.back();
  const int64_t n = (s.n + 255) / 256 * 256, k = (s.k + 127) / 128 * 128;
  const int64_t m_pad = (cum + 3 * E) / 4 * 4;
  const DType f8 = DType::kFloat8E4M3FN;
  Tensor a = api::bench::random_tensor({cum, k}, f8, dev, s.random_seed);
  Tensor b = api::bench::random_tensor({E, n, k}, f8, dev, s.random_seed + 1);
  Tensor ip = api::bench::int32_tensor(p, dev);
  BenchCase c;
  if (mx) {
    const int64_t k_align = (k + 511) / 512;
    Tensor sa = Tensor::empty({m_pad, k_align}, DType::kInt32);
    Tensor sb = Tensor::empty({E, n, k_align}, DType::kInt32);
    Tensor ra = random_scales({sa.numel() * 4}, false, Device::cpu(), s.random_seed + 2);
    Tensor rb = random_scales({sb.numel() * 4}, false, Device::cpu(), s.random_seed + 3);
    std::memcpy(sa.data_ptr(), ra.data_ptr(), static_cast<std::size_t>(ra.numel()));
    std::memcpy(sb.data_ptr(), rb.data_ptr(), static_cast<std::size_t>(rb.numel()));
    c = api::bench::invoke_case(
        "moe_gemm_mxfp8_nt_groupwise",
        {Value(a), Value(b), Value(sa.to(dev)), Value(sb.to(dev)), Value(ip)});
  } else {
    c = api::bench::invoke_case(
        "moe_gemm_fp8_nt_groupwise",
        {Value(a), Value(b),
         Value(grouped_gemm_scale_tensor({k / 128, m_pad}, dev, s.random_seed + 2)),
         Value(grouped_gemm_scale_tensor({E, k / 128, n / 128}, dev, s.random_seed + 3)),
         Value(ip)},
        {{"is_gated", Value(true)}});
  }
  c.flops = grouped_flops(p, n, k);
  c.bytes = api::bench::nbytes({cum, k}, f8) + api::bench::nbytes({E, n, k}, f8) +
            api::bench::nbytes({cum, mx ? n : n / 2}, DType::kBFloat16);
  return c;
}

}  // namespace

namespace detail {
void register_grouped_gemm_ops(OpRegistry& r) {
  declare<&grouped_mm_bf16>(
      r,
      {.name = "grouped_mm_bf16",
       .module = kGroupedModule,
       .summary = "Grouped BF16 GEMM per expert: out[rows of e] = a[rows of e] @ b[e]^T"},
      "a", "b", "m_indptr", arg("out").mut(), arg("out_dtype", DType::kBFloat16),
      arg("backend", "cudnn").kw(), arg("tactic", -1).kw());
  declare<&grouped_mm_fp8>(r,
                           {.name = "grouped_mm_fp8",
                            .module = kGroupedModule,
                            .summary = "Grouped FP8 GEMM per expert with an optional scalar alpha"},
                           "a", "b", "m_indptr", "alpha", arg("out").mut(),
                           arg("out_dtype", DType::kBFloat16), arg("backend", "cudnn").kw(),
                           arg("tactic", -1).kw());
  declare<&grouped_mm_mxfp8>(
      r,
      {.name = "grouped_mm_mxfp8",
       .module = kGroupedModule,
       .summary = "Grouped MXFP8 GEMM per expert (ue8m0 block scales, 128x4 swizzled)"},
      "a", "b", "a_descale", "b_descale", "m_indptr", arg("out").mut(),
      arg("out_dtype", DType::kBFloat16), arg("backend", "cudnn").kw(), arg("tactic", -1).kw());
  declare<&grouped_mm_fp4>(r,
                           {.name = "grouped_mm_fp4",
                            .module = kGroupedModule,
                            .summary = "Grouped FP4 GEMM per expert (NVFP4 or MXFP4 block scales)"},
                           "a", "b", "a_descale", "b_descale", "m_indptr", "alpha",
                           arg("out").mut(), arg("out_dtype", DType::kBFloat16),
                           arg("block_size", 16), arg("backend", "cudnn").kw(),
                           arg("tactic", -1).kw());
  declare_init<SegmentInit>(r,
                            {.name = "SegmentGEMMWrapper.__init__",
                             .module = kGemmModule,
                             .summary = "Segment GEMM (per-segment weights) wrapper"},
                            "float_workspace_buffer", arg("backend", "auto"));
  declare<&SegmentGEMMWrapper::run>(
      r,
      {.name = "SegmentGEMMWrapper.run",
       .module = kGemmModule,
       .summary = "y[segment i] = x[segment i] @ W[weight_indices[i]]"},
      "x", "weights", "batch_size", "weight_column_major", arg("out").mut(), "seg_lens",
      "seg_indptr", "weight_indices");
  declare<&grouped_gemm_nt_masked>(
      r,
      {.name = "grouped_gemm_nt_masked",
       .module = kMaskedModule,
       .summary = "Masked batched block-scaled (FP4/FP8) GEMM, rows < masked_m[g] per batch",
       .var_keyword = "kwargs"},
      "lhs", "rhs", arg("out").mut(), "masked_m", arg("ab_dtype").kw(), arg("sf_dtype").kw(),
      arg("c_dtype").kw(), arg("sf_vec_size").kw(), arg("topk_weights").kw(),
      arg("idx_src_info").kw(), arg("rank_src_info").kw(), arg("out_ptrs").kw(),
      arg("num_ranks", 0).kw(), arg("dst_signals").kw(), arg("sm_count").kw(),
      arg("barrier_flag_local").kw(), arg("barrier_flag_multicast").kw(),
      arg("is_combine_fusion", false).kw(), arg("is_swap_ab", false).kw());

  declare<&group_gemm_fp8_nt_groupwise>(
      r,
      {.name = "group_gemm_fp8_nt_groupwise",
       .module = kGemmModule,
       .summary = "Grouped FP8 GEMM with fp32 groupwise scales per expert (m_indptr)"},
      "a", "b", "a_scale", "b_scale", "m_indptr",
      arg("scale_granularity_mnk", std::tuple<int64_t, int64_t, int64_t>{1, 128, 128}),
      arg("scale_major_mode", "MN"), arg("mma_sm", 1), arg("out").mut(), "out_dtype",
      arg("backend", "trtllm"), arg("segment_alignment", 1));
  declare<&group_gemm_mxfp8_mxfp4_nt_groupwise>(
      r,
      {.name = "group_gemm_mxfp8_mxfp4_nt_groupwise",
       .module = kGemmModule,
       .summary = "Grouped MXFP8 x MXFP4 GEMM per expert (m_indptr)"},
      "a", "b", "a_scale", "b_scale", "m_indptr", arg("mma_sm", 1), arg("tile_m", 128),
      arg("tile_n", 128), arg("tile_k", 128), arg("swap_ab", true), arg("out").mut(), "out_dtype");
  declare<&group_gemm_nvfp4_nt_groupwise>(
      r,
      {.name = "group_gemm_nvfp4_nt_groupwise",
       .module = kGemmModule,
       .summary = "Grouped NVFP4 GEMM per expert with per-group alpha"},
      "a", "b", "a_scale", "b_scale", "m_indptr", "alpha", arg("tile_m", 128), arg("tile_n", 128),
      arg("tile_k", 128), arg("swap_ab", true), arg("out").mut(), "out_dtype");
  declare<&moe_gemm_fp8_nt_groupwise>(
      r,
      {.name = "moe_gemm_fp8_nt_groupwise",
       .module = "flashinfer.grouped_mm.cute_sm120_fp8_groupwise.core",
       .summary = "SM120 zero-padding MoE FP8 GEMM (fp32 scales, optional fused SwiGLU)"},
      "a", "b", "a_scale", "b_scale", "m_indptr",
      arg("scale_granularity_mnk", std::tuple<int64_t, int64_t, int64_t>{1, 128, 128}),
      arg("scale_major_mode", "MN"), arg("backend", "cute"), arg("out").mut(), "out_dtype",
      arg("is_gated", false));
  declare<&moe_gemm_mxfp8_nt_groupwise>(
      r,
      {.name = "moe_gemm_mxfp8_nt_groupwise",
       .module = "flashinfer.grouped_mm.cute_sm120_mxfp8_groupwise.core",
       .summary = "SM120 zero-padding MoE MXFP8 GEMM (int32-packed UE8M0 per-token scales)"},
      "a", "b", "a_scale", "b_scale", "m_indptr",
      arg("scale_granularity_mnk", std::tuple<int64_t, int64_t, int64_t>{1, 1, 128}),
      arg("scale_major_mode", "MN"), arg("backend", "cute"), arg("out").mut(), "out_dtype",
      arg("is_gated", false));
  declare<&group_deepgemm_fp8_nt_groupwise>(
      r,
      {.name = "group_deepgemm_fp8_nt_groupwise",
       .module = kGemmModule,
       .summary = "DeepGEMM contiguous grouped FP8 GEMM (row i to expert m_indices[i])"},
      "a", "b", "a_scale", "b_scale", "m_indices",
      arg("scale_granularity_mnk", std::tuple<int64_t, int64_t, int64_t>{1, 128, 128}),
      arg("out").mut(), "out_dtype");
  declare<&batch_deepgemm_fp8_nt_groupwise>(
      r,
      {.name = "batch_deepgemm_fp8_nt_groupwise",
       .module = kGemmModule,
       .summary = "DeepGEMM masked batched FP8 GEMM (rows < masked_m[i] per batch)"},
      "a", "b", "a_scale", "b_scale", "masked_m", "expected_m",
      arg("scale_granularity_mnk", std::tuple<int64_t, int64_t, int64_t>{1, 128, 128}),
      arg("out").mut(), "out_dtype");

  api::register_backends("grouped_mm_bf16", kGroupedMmBf16Kernels);
  api::register_backends("grouped_mm_fp8", kGroupedMmFp8Kernels);
  // The wrapper's methods: run's backends (as the attention wrappers register theirs).
  for (const char* op : {"SegmentGEMMWrapper.__init__", "SegmentGEMMWrapper.run"}) {
    api::register_backends(op, kSegmentKernels);
  }
  for (const char* op : {"grouped_mm_mxfp8", "grouped_mm_fp4", "grouped_gemm_nt_masked",
                         "group_gemm_fp8_nt_groupwise", "group_deepgemm_fp8_nt_groupwise",
                         "batch_deepgemm_fp8_nt_groupwise", "group_gemm_mxfp8_mxfp4_nt_groupwise",
                         "group_gemm_nvfp4_nt_groupwise", "moe_gemm_fp8_nt_groupwise",
                         "moe_gemm_mxfp8_nt_groupwise"}) {
    api::register_backends(op, kCpuOnly);
  }

  register_bench_hook("grouped_mm_bf16", bench_grouped_mm_bf16);
  register_bench_hook("grouped_mm_fp8", bench_grouped_mm_fp8);
  register_bench_hook("grouped_mm_mxfp8", [](const BenchShape& s, Device d) {
    return bench_grouped_mm_scaled(s, d, false, 32);
  });
  register_bench_hook("grouped_mm_fp4", [](const BenchShape& s, Device d) {
    return bench_grouped_mm_scaled(s, d, true, 16);
  });
  register_bench_hook("SegmentGEMMWrapper.run", bench_segment_gemm);
  register_bench_hook("grouped_gemm_nt_masked", bench_masked);
  register_bench_hook("group_gemm_fp8_nt_groupwise", bench_group_gemm_fp8);
  register_bench_hook("group_deepgemm_fp8_nt_groupwise", bench_group_deepgemm);
  register_bench_hook("batch_deepgemm_fp8_nt_groupwise", bench_batch_deepgemm);
  register_bench_hook("group_gemm_mxfp8_mxfp4_nt_groupwise",
                      [](const BenchShape& s, Device d) { return bench_padded_fp4(s, d, false); });
  register_bench_hook("group_gemm_nvfp4_nt_groupwise",
                      [](const BenchShape& s, Device d) { return bench_padded_fp4(s, d, true); });
  register_bench_hook("moe_gemm_fp8_nt_groupwise",
                      [](const BenchShape& s, Device d) { return bench_sm120_moe(s, d, false); });
  register_bench_hook("moe_gemm_mxfp8_nt_groupwise",
                      [](const BenchShape& s, Device d) { return bench_sm120_moe(s, d, true); });
}
}  // namespace detail

}  // namespace flashinfer
