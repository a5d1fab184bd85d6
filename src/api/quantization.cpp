// Public quantization ops (flashinfer.quantization.fp4_quantization,
// flashinfer.quantization.fp8_quantization): declarations, argument checks, dispatch.
#include "flashinfer/ops/quantization.h"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "flashinfer/ops/nvfp4.h"  // shuffle_matrix_a / shuffle_matrix_sf_a (do_shuffle)

#include "api/arg_traits.h"
#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/device_props.h"
#include "api/enum_table.h"
#include "api/kernel_table.h"
#include "api/nvfp4_4over6.h"
#include "api/quantize_params.h"
#include "kernels/cpu/quantization_cpu.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/quantization_cuda.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kQuantizationFp4Module = "flashinfer.quantization.fp4_quantization";
constexpr const char* kQuantizationFp8Module = "flashinfer.quantization.fp8_quantization";

using kernels::SfLayoutCode;

// An SfLayout made from an out-of-range int (a cast, a hostile record) would size the scale
// buffer as no layout does: an error naming the argument instead.
SfLayoutCode code_of(SfLayout l, const char* op, const char* arg) {
  const int v = static_cast<int>(l);
  FLASHINFER_CHECK(v >= static_cast<int>(SfLayout::layout_128x4) &&
                       v <= static_cast<int>(SfLayout::layout_linear),
                   op, arg, "is not an SfLayout value: ", v);
  return static_cast<SfLayoutCode>(v);
}

int64_t quantization_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// K padded to a multiple of `alignment` (checked positive). Upstream's MXFP8 kernels take the
// padded K as a 32-bit int (invokeMxFP8Quantization's padded_n): a larger one is no call upstream
// can make, refused here instead of tried as an allocation of that many columns.
int64_t mxfp8_padded_k(int64_t k, int64_t alignment, const char* op) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  FLASHINFER_CHECK(alignment <= kMax && quantization_round_up(k, alignment) <= kMax, op,
                   "alignment", "K = ", k, " padded to a multiple of ", alignment,
                   " must fit a 32-bit int (upstream's kernels take it as one)");
  return quantization_round_up(k, alignment);
}

// x [M, K] with zero columns appended up to padded_k (x itself when there is nothing to pad): the
// MXFP8 quantizers' K alignment, whose padding blocks quantize to 0 with scale code 0.
Tensor zero_pad_columns(const Tensor& x, int64_t padded_k) {
  if (padded_k == x.size(1)) return x;
  Tensor xp = Tensor::zeros({x.size(0), padded_k}, x.dtype(), x.device());
  if (x.size(0) > 0) xp.slice(1, 0, x.size(1)).copy_(x);
  return xp;
}

// ---- backends (src/api/kernel_table.h) -------------------------------------------------------
// The CUDA kernels take the same input dtypes, block sizes and layouts as the CPU reference.

using api::KernelEntry;
using api::LaunchContext;

// fp4_quantize, nvfp4_quantize and mxfp4_quantize.
constexpr KernelEntry<kernels::Fp4QuantizeParams> kFp4QuantizeKernels[] = {
    {DeviceType::kCPU, "CPU reference: OpenMP row tasks, AVX2/AVX-512 tiers", nullptr,
     [](const kernels::Fp4QuantizeParams& p, const LaunchContext&) {
       kernels::cpu::fp4_quantize(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one thread per scale block", nullptr,
     [](const kernels::Fp4QuantizeParams& p, const LaunchContext& c) {
       kernels::cuda::fp4_quantize(p, c.stream, c.enable_pdl);
     }},
#endif
};
// Upstream runs the batch-invariant quantizers on SM100-class GPUs only; no CUDA kernel here yet.
constexpr KernelEntry<kernels::BatchInvariantQuantizeParams> kBatchInvariantQuantizeKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: upstream 0.7.4's batch-invariant recipe, correctly rounded, row tasks",
     nullptr,
     [](const kernels::BatchInvariantQuantizeParams& p, const LaunchContext&) {
       kernels::cpu::batch_invariant_quantize(p);
     }},
};

constexpr KernelEntry<kernels::Mxfp8QuantizeParams> kMxfp8QuantizeKernels[] = {
    {DeviceType::kCPU, "CPU reference: OpenMP row tasks, AVX2/AVX-512 tiers", nullptr,
     [](const kernels::Mxfp8QuantizeParams& p, const LaunchContext&) {
       kernels::cpu::mxfp8_quantize(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one thread per scale block", nullptr,
     [](const kernels::Mxfp8QuantizeParams& p, const LaunchContext& c) {
       kernels::cuda::mxfp8_quantize(p, c.stream, c.enable_pdl);
     }},
#endif
};
constexpr KernelEntry<kernels::BlockScaleInterleaveParams> kBlockScaleInterleaveKernels[] = {
    {DeviceType::kCPU, "CPU reference", nullptr,
     [](const kernels::BlockScaleInterleaveParams& p, const LaunchContext&) {
       kernels::cpu::block_scale_interleave(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one thread per scale factor", nullptr,
     [](const kernels::BlockScaleInterleaveParams& p, const LaunchContext& c) {
       kernels::cuda::block_scale_interleave(p, c.stream);
     }},
#endif
};
// The dequantizers run on the host, as upstream's do: any input is copied there first.
constexpr KernelEntry<kernels::BlockDequantizeParams> kBlockDequantizeKernels[] = {
    {DeviceType::kCPU, "CPU reference (host only, as upstream; device inputs are copied)", nullptr,
     [](const kernels::BlockDequantizeParams& p, const LaunchContext&) {
       kernels::cpu::block_dequantize(p);
     }},
};

// ---- shared pieces -----------------------------------------------------------------------------

// A one-element floating global scale as fp32 on `device`. Upstream converts bf16/fp16 scales
// to fp32 and moves the scale to the input's GPU (`a_global_sf.cuda()`); so do we.
Tensor fp32_scalar(const Tensor& t, Device device, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  FLASHINFER_CHECK(t.numel() == 1, op, arg, "expected a one-element tensor, got shape ",
                   shape_to_string(t.shape()));
  api::check_dtype_in(t, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op, arg);
  const Tensor f = t.dtype() == DType::kFloat32 ? t : t.to(DType::kFloat32);
  return f.to(device).contiguous();
}

// Views `input` ([..., K], or a column-major [M, K]) as rows of K elements.
struct QuantizationRows {
  Tensor x;  // 2-D [m, k]
  bool column_major = false;
  Shape shape;  // the quantized view's shape ([..., k]: the input's, or its transpose's)
};

QuantizationRows as_rows(const Tensor& input, const char* op, const char* arg) {
  QuantizationRows r;
  api::check_defined(input, op, arg);
  FLASHINFER_CHECK(input.dim() >= 2, op, arg, "expected a tensor of rank >= 2 ([M, K]), got ",
                   input.dim(), "-D with shape ", shape_to_string(input.shape()));
  // No rows is a call upstream answers with empty outputs (SGLang's idle data-parallel ranks
  // quantize [0, H]); K must be there (upstream divides by it).
  FLASHINFER_CHECK(input.size(-1) > 0, op, arg,
                   "K (the last dimension) must be positive, got shape ",
                   shape_to_string(input.shape()));
  const int64_t d = input.dim();
  Tensor v = input;
  if (input.stride(-2) == 1 && input.stride(-1) != 1 && input.size(-2) > 1) {
    // Upstream quantizes a column-major input (stride(-2) == 1, any rank) along its transpose's
    // rows and transposes the outputs back.
    r.column_major = true;
    v = input.transpose(d - 2, d - 1);
  }
  r.shape = v.shape();
  r.x = d == 2 ? v : v.reshape({-1, v.size(-1)});
  return r;
}

std::tuple<Tensor, Tensor> fp4_quantize_impl(const char* op, const Tensor& input,
                                             const std::optional<Tensor>& global_scale,
                                             int64_t sf_vec_size, bool sf_use_ue8m0,
                                             SfLayout layout, bool gs_inversed,
                                             std::optional<bool> enable_pdl,
                                             kernels::Nvfp4FourOverSix four_over_six = {}) {
  const char* in_arg = std::string_view(op) == "fp4_quantize" ? "input" : "a";
  const QuantizationRows rows = as_rows(input, op, in_arg);
  const Tensor& x = rows.x;
  api::check_dtype_in(x, {DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3FN}, op, in_arg);
  FLASHINFER_CHECK(sf_vec_size == 16 || sf_vec_size == 32, op, "sf_vec_size",
                   "can only be 16 or 32, got ", sf_vec_size);
  const int64_t m = x.size(0), k = x.size(1);
  FLASHINFER_CHECK(k % sf_vec_size == 0, op, in_arg, "K = ", k,
                   " is not a multiple of the block size sf_vec_size = ", sf_vec_size);
  Tensor gs;
  bool gs_per_row = false;
  // ue8m0 scales ignore the global scale, except on the e4m3 input path (nvfp4_rules.h:
  // fp8_fp4_scale), as upstream's kernels.
  const bool gs_used = !sf_use_ue8m0 || x.dtype() == DType::kFloat8E4M3FN;
  if (global_scale && global_scale->defined() && gs_used) {
    const char* gs_arg = std::string_view(op) == "fp4_quantize" ? "global_scale" : "a_global_sf";
    const Tensor& g = *global_scale;
    if (g.numel() == m && m > 1) {
      // Upstream's row-wise global scale (one per row of the [M, K] view): fp32 on the device.
      FLASHINFER_CHECK_CODE(!rows.column_major, ErrorCode::kUnsupported, op, gs_arg,
                            "a per-row global scale with a column-major input is not implemented");
      api::check_dtype_in(g, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op, gs_arg);
      gs = g.reshape({m}).to(DType::kFloat32).to(x.device()).contiguous();
      gs_per_row = true;
    } else {
      FLASHINFER_CHECK(g.numel() == 1, op, gs_arg, "expected one element or one per row (", m,
                       "), got shape ", shape_to_string(g.shape()));
      gs = fp32_scalar(g, x.device(), op, gs_arg);
    }
  }
  const SfLayoutCode code = code_of(layout, op, "sfLayout");
  const int64_t sf_cols = k / sf_vec_size;
  Shape q_shape = rows.shape;
  q_shape.back() = k / 2;
  Tensor q = Tensor::empty(q_shape, DType::kUInt8, x.device());
  const int64_t sf_size = kernels::sf_buffer_size(code, m, sf_cols);
  const Shape sf_shape =
      layout == SfLayout::layout_linear
          ? Shape{m, sf_cols}
          : Shape{sf_size / quantization_round_up(sf_cols, 4), quantization_round_up(sf_cols, 4)};
  Tensor sf = Tensor::empty(sf_shape, DType::kUInt8, x.device());
  const int64_t qd = q.dim();
  auto result = [&]() -> std::tuple<Tensor, Tensor> {
    if (rows.column_major) return {q.transpose(qd - 2, qd - 1), sf.transpose(0, 1)};
    return {q, sf};
  };
  if (m == 0) return result();  // nothing to quantize (and no grid to launch)

  auto p = api::quantize_params<kernels::Fp4QuantizeParams>(x, q, sf, code);
  p.global_scale = gs.defined() ? gs.data<float>() : nullptr;
  p.global_scale_per_row = gs_per_row;
  p.global_scale_inversed = gs_inversed;
  p.sf_vec_size = static_cast<int>(sf_vec_size);
  p.ue8m0 = sf_use_ue8m0;
  // The recipe is NVFP4's (16, e4m3) of 16-bit input: the callers resolve it so.
  FLASHINFER_CHECK_CODE(!four_over_six.on || (sf_vec_size == 16 && !sf_use_ue8m0 &&
                                              x.dtype() != DType::kFloat8E4M3FN),
                        ErrorCode::kInternal, op, "nvfp4_4over6",
                        "a 4over6 recipe reached a call it does not apply to");
  p.four_over_six = four_over_six;
  api::launch(kFp4QuantizeKernels, p, x.device(), op, in_arg, enable_pdl);
  return result();
}

// ---- Upstream 0.7.4's nvfp4_4over6 and batch_invariant ------------------------------------------

// nvfp4_4over6 as upstream's _resolve_fp4_quantize_recipe: MXFP4 never reads the environment
// (an explicit config is an error); NVFP4 as api::nvfp4_4over6_on (api/nvfp4_4over6.h).
bool resolve_4over6(const Value& v, bool mxfp4, int64_t sf_vec_size, bool ue8m0, DType in_dtype,
                    const char* op) {
  if (mxfp4) {
    FLASHINFER_CHECK(is_nvfp4_4over6_unset(v) || v.is_none(), op, "nvfp4_4over6",
                     "nvfp4_4over6 applies to NVFP4 only (sf_vec_size=16, sf_use_ue8m0=False); got "
                     "sf_vec_size=",
                     sf_vec_size, ", sf_use_ue8m0=", ue8m0 ? "True" : "False", ".");
    return false;
  }
  return api::nvfp4_4over6_on(v, in_dtype, op);
}

// batch_invariant=True's refusals, upstream's BatchInvariantUnsupportedError template.
[[noreturn]] void bi_refuse(const char* op, const char* cls, const std::string& what,
                            const std::string& limit, ErrorCode code = ErrorCode::kInvalidArgument,
                            const char* arg = "batch_invariant") {
  FLASHINFER_FAIL(code, op, arg, "batch_invariant=True: the class `", cls, "` does not support ",
                  what, "; the limit is ", limit,
                  ". The batch-invariant mode never falls back to another kernel; call without "
                  "batch_invariant=True to use the regular backends.");
}

[[noreturn]] void bi_refuse_4over6(const char* op, const char* cls) {
  bi_refuse(op, cls, "an NVFP4 4over6 scale-candidate search",
            "the plain NVFP4 recipe (nvfp4_4over6=None): a candidate search is another "
            "specification",
            ErrorCode::kInvalidArgument, "nvfp4_4over6");
}

void bi_check_backend(const char* op, std::string_view backend) {
  FLASHINFER_CHECK(backend == "auto", op, "backend", op,
                   ": batch_invariant=True requires backend='auto' (got backend='", backend, "')");
}

// Upstream's support checks common to every class, in its order: the device (CUDA: SM100 /
// SM103 / SM107; the CPU reference runs the recipe here), the dtype, the rank, K, the row size.
void bi_check_input(const char* op, const char* cls, const char* in_arg, const Tensor& x,
                    int64_t block) {
  if (x.device().is_cuda()) {
    const int cc = api::compute_capability(x.device());
    if (cc != 100 && cc != 103 && cc != 107) {
      bi_refuse(op, cls,
                "compute capability " + std::to_string(cc / 10) + "." + std::to_string(cc % 10),
                "the architectures SM100 / SM103 / SM107", ErrorCode::kUnsupported);
    }
  }
  const DType dt = x.dtype();
  if (dt != DType::kBFloat16 && dt != DType::kFloat16 && dt != DType::kFloat32) {
    bi_refuse(op, cls, std::string("input dtype ") + std::string(dtype_torch_name(dt)),
              "bf16, f16 or fp32 inputs", ErrorCode::kInvalidArgument, in_arg);
  }
  if (x.dim() < 1) {
    bi_refuse(op, cls, "a 0-D input", "inputs of shape (..., K)", ErrorCode::kInvalidArgument,
              in_arg);
  }
  const int64_t k = x.size(-1);
  if (k <= 0 || k % block != 0) {
    bi_refuse(op, cls, "K = " + std::to_string(k),
              "K a positive multiple of " + std::to_string(block), ErrorCode::kInvalidArgument,
              in_arg);
  }
}

void bi_check_row_bytes(const char* op, const char* cls, const char* in_arg, int64_t k, DType dt) {
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  if (k * es > 131072) {
    bi_refuse(op, cls, "K = " + std::to_string(k) + " for " + std::string(dtype_torch_name(dt)),
              "rows of at most 131072 bytes (K <= " + std::to_string(131072 / es) + ")",
              ErrorCode::kInvalidArgument, in_arg);
  }
}

struct BiOutputs {
  Tensor q, sf, pts;
};

// Runs the recipe over the logical rows [M, K] of x (a view; any strides) into q ([..., K/2]
// packed, or [..., K] e4m3 for MXFP8, of `q_shape`) and a scale buffer of `layout`.
BiOutputs bi_run(const char* op, const char* in_arg, const Tensor& x2, const Shape& q_shape,
                 kernels::BatchInvariantFormat format, SfLayoutCode layout, float gs,
                 std::optional<float> per_token_gsi, std::optional<bool> enable_pdl) {
  const bool fp8 = format == kernels::BatchInvariantFormat::kMxfp8;
  const int64_t vec = format == kernels::BatchInvariantFormat::kNvfp4 ? 16 : 32;
  const int64_t m = x2.size(0), k = x2.size(1), sf_cols = k / vec;
  BiOutputs o;
  o.q = Tensor::empty(q_shape, fp8 ? DType::kFloat8E4M3FN : DType::kUInt8, x2.device());
  o.sf = Tensor::empty({kernels::sf_buffer_size(layout, m, sf_cols)}, DType::kUInt8, x2.device());
  if (per_token_gsi) o.pts = Tensor::empty({m}, DType::kFloat32, x2.device());
  if (m == 0) return o;
  kernels::BatchInvariantQuantizeParams p;
  p.format = format;
  p.input = x2.data_ptr();
  p.in_dtype = x2.dtype();
  p.m = m, p.k = k;
  p.in_stride_m = x2.stride(0), p.in_stride_k = x2.stride(1);
  p.out = static_cast<uint8_t*>(o.q.data_ptr());
  p.sf = o.sf.data<uint8_t>();
  p.sf_size = o.sf.numel();
  p.layout = layout;
  p.global_scale = gs;
  if (per_token_gsi) {
    p.per_token_scale = o.pts.data<float>();
    p.per_token_gsi = *per_token_gsi;
  }
  api::launch(kBatchInvariantQuantizeKernels, p, x2.device(), op, in_arg, enable_pdl);
  return o;
}

// The 2-D shape upstream's fp4 quantizers return their scales in: [rows, round_up(K/vec, 4)]
// swizzled, [M, K/vec] linear.
Tensor fp4_sf_view(const Tensor& sf, SfLayoutCode layout, int64_t m, int64_t sf_cols) {
  if (layout == SfLayoutCode::kLinear) return sf.view({m, sf_cols});
  const int64_t cols = quantization_round_up(sf_cols, 4);
  return sf.view({sf.numel() / cols, cols});
}

// A float or a one-element tensor as the fp32 the recipe reads (torch.full's RN from double).
float bi_scalar(const Value& v, const char* op, const char* cls, const char* arg) {
  if (v.is_tensor()) {
    const Tensor& t = v.as_tensor();
    if (t.numel() != 1) {
      bi_refuse(op, cls, "a global scale of " + std::to_string(t.numel()) + " elements",
                "one scalar global scale", ErrorCode::kInvalidArgument, arg);
    }
    return static_cast<float>(t.to(DType::kFloat32).item());
  }
  if (v.kind() == Value::Kind::kFloat) return static_cast<float>(v.as_float());
  if (v.kind() == Value::Kind::kInt) return static_cast<float>(v.as_int());
  bi_refuse(op, cls, "a global scale of type " + v.repr(), "a float or a 1-element tensor",
            ErrorCode::kInvalidArgument, arg);
}

// A packed-fp4 matrix [M, K/2] (uint8 or float4_e2m1fn_x2) as a contiguous host tensor.
Tensor host_bytes(const Tensor& t) { return t.to(Device::cpu()).contiguous(); }

Tensor check_fp4_data(const Tensor& t, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  api::check_dim(t, {2}, op, arg);
  api::check_dtype_in(t, {DType::kUInt8, DType::kFloat4E2M1FNx2}, op, arg);
  api::check_non_empty(t, op, arg);
  return host_bytes(t);
}

Tensor check_scales(const Tensor& t, int64_t expected, const char* op, const char* arg,
                    const char* what) {
  api::check_defined(t, op, arg);
  api::check_dtype_in(t, {DType::kUInt8, DType::kFloat8E4M3FN}, op, arg);
  FLASHINFER_CHECK(t.numel() == expected, op, arg, "expected ", expected, " scale factors (", what,
                   "), got ", t.numel(), " (shape ", shape_to_string(t.shape()), ")");
  return host_bytes(t);
}

Tensor dequantize_impl(const char* op, const char* data_arg, const Tensor& data, int64_t k,
                       bool fp4, const Tensor& sf, bool ue8m0, int64_t vec, SfLayoutCode layout,
                       float gs, bool ue8m0_shift = false) {
  Tensor out = Tensor::empty({data.size(0), k}, DType::kFloat32, Device::cpu());
  kernels::BlockDequantizeParams p;
  p.data = data.data<uint8_t>();
  p.data_stride_m = data.stride(0);
  p.fp4 = fp4;
  p.sf = sf.data<uint8_t>();
  p.sf_size = sf.numel();
  p.sf_ue8m0 = ue8m0;
  p.ue8m0_shift = ue8m0_shift;
  p.sf_vec_size = static_cast<int>(vec);
  p.layout = layout;
  p.global_scale = gs;
  p.m = data.size(0);
  p.k = k;
  p.out = out.data<float>();
  api::launch(kBlockDequantizeKernels, p, out.device(), op, data_arg);
  return out;
}

const char* layout_desc(SfLayoutCode c) {
  return c == SfLayoutCode::k128x4 ? "128x4 layout"
         : c == SfLayoutCode::k8x4 ? "8x4 layout"
                                   : "linear layout";
}

}  // namespace

// ---- nvfp4_4over6's _UNSET
// ------------------------------------------------------------------------

// One process-wide object: Python's `_UNSET` sentinel, shown (and recorded) by its name.
Value nvfp4_4over6_unset() {
  static const ObjectRef kUnset{"_Unset", "_UNSET", 0x5f554e534554ULL, nullptr, nullptr};
  return Value(kUnset);
}

Value nvfp4_4over6_config(int64_t e4m3_max, std::string_view err_mode, bool err_use_fast_math) {
  const char* op = "NVFP44Over6Config";
  FLASHINFER_CHECK(e4m3_max == 448 || e4m3_max == 256, op, "e4m3_max",
                   "NVFP4 4over6 E4M3 max must be either 256 or 448.");
  std::string mode(err_mode);
  for (char& c : mode) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  FLASHINFER_CHECK(mode == "MAE" || mode == "MSE", op, "err_mode",
                   "NVFP4 4over6 error mode must be MAE or MSE.");
  // Upstream's __repr__: the fields that differ from the defaults.
  std::string fields;
  const auto add = [&](const std::string& f) { fields += (fields.empty() ? "" : ", ") + f; };
  if (e4m3_max != 448) add("e4m3_max=" + std::to_string(e4m3_max));
  if (mode != "MAE") add("err_mode=NVFP44Over6ErrMode." + mode);
  if (err_use_fast_math) add("err_use_fast_math=True");
  ObjectRef ref;
  ref.type = "NVFP44Over6Config";
  ref.repr = "NVFP44Over6Config(" + fields + ")";
  return Value(std::move(ref));
}

// Ours, or upstream's as its recorder writes it (its repr "<nvfp4_4over6 unset: read
// FLASHINFER_NVFP4_4OVER6*>", as an object or a string).
bool is_nvfp4_4over6_unset(const Value& v) {
  std::string_view text;
  if (v.kind() == Value::Kind::kObject) {
    text = v.as_object().repr;
  } else if (v.kind() == Value::Kind::kString) {
    text = v.as_string();
  } else {
    return false;
  }
  return text == "_UNSET" || text.starts_with("<nvfp4_4over6 unset");
}

// ---- SfLayout ----------------------------------------------------------------------------------

namespace {
constexpr api::EnumTable<SfLayout, 3> kSfLayouts{"SfLayout",
                                                 {{{SfLayout::layout_128x4, "layout_128x4"},
                                                   {SfLayout::layout_8x4, "layout_8x4"},
                                                   {SfLayout::layout_linear, "layout_linear"}}}};
}  // namespace

std::string_view sf_layout_name(SfLayout layout) { return kSfLayouts.name_of(layout); }

Value to_value(SfLayout layout) { return kSfLayouts.to_value(layout); }

SfLayout sf_layout_from_value(const Value& v) {
  return kSfLayouts.from_value(v, "SfLayout", "value", ErrorCode::kInvalidArgument, true);
}

int64_t sf_layout_offset(SfLayout layout, int64_t row, int64_t col, int64_t num_sf_cols) {
  return kernels::sf_offset(code_of(layout, "sf_layout_offset", "layout"), row, col, num_sf_cols);
}

int64_t sf_layout_size(SfLayout layout, int64_t rows, int64_t num_sf_cols) {
  return kernels::sf_buffer_size(code_of(layout, "sf_layout_size", "layout"), rows, num_sf_cols);
}

// ---- public ops --------------------------------------------------------------------------------

// ---- the CuTe-DSL entry points ------------------------------------------------------------------

namespace {

constexpr const char* kMxfp4CuteModule = "flashinfer.quantization.kernels.mxfp4_quantize";
constexpr const char* kMxfp8CuteModule = "flashinfer.quantization.kernels.mxfp8_quantize";
constexpr const char* kNvfp4CuteModule = "flashinfer.quantization.kernels.nvfp4_quantize";

SfLayoutCode cute_layout(int64_t sf_layout, const char* op) {
  FLASHINFER_CHECK(sf_layout >= 0 && sf_layout <= 2, op, "sf_layout",
                   "sf_layout must be one of (0, 1, 2), got ", sf_layout);
  return static_cast<SfLayoutCode>(sf_layout);
}

// [..., K] as [M, K] (upstream flattens the leading dims and returns 2-D outputs). `arg`: the
// input's name in the caller ("input", or "a" for the public quantizers routed here).
Tensor cute_rows(const Tensor& input, const char* op, const char* arg = "input") {
  api::check_defined(input, op, arg);
  FLASHINFER_CHECK(input.dim() >= 1, op, arg, "expected a tensor of rank >= 1, got a scalar");
  return input.dim() == 2 ? input : input.reshape({-1, input.size(-1)});
}

// A float or a one-element tensor as fp32 on `device` (a scalar becomes a one-element tensor).
Tensor cute_scale(const Value& v, Device device, const char* op, const char* arg) {
  if (v.is_tensor()) return fp32_scalar(v.as_tensor(), device, op, arg);
  FLASHINFER_CHECK(v.kind() == Value::Kind::kFloat || v.kind() == Value::Kind::kInt, op, arg,
                   "expected a float or a one-element tensor, got ", v.repr());
  return Tensor::full(
      {1}, v.kind() == Value::Kind::kFloat ? v.as_float() : static_cast<double>(v.as_int()),
      DType::kFloat32, device);
}

// The FP4 entry points: rows x [M, K], blocks of `vec`, the scale buffer shaped as upstream
// reshapes it ([M, K/vec] linear, else [padded rows, round_up(K/vec, 4)]; an empty input, M or
// K zero, gives empty outputs of the unpadded shape, as upstream's).
struct CuteFp4 {
  Tensor q, sf;
  kernels::Fp4QuantizeParams p;
};
CuteFp4 cute_fp4_outputs(const Tensor& x, int64_t vec, SfLayoutCode code) {
  const int64_t m = x.size(0), k = x.size(1), cols = k / vec;
  CuteFp4 r;
  r.q = Tensor::empty({m, k / 2}, DType::kUInt8, x.device());
  const bool empty = m == 0 || cols == 0;
  const int64_t size = empty ? 0 : kernels::sf_buffer_size(code, m, cols);
  const int64_t cols4 = quantization_round_up(cols, 4);
  r.sf = Tensor::empty(
      code == SfLayoutCode::kLinear || empty ? Shape{m, cols} : Shape{size / cols4, cols4},
      DType::kUInt8, x.device());
  r.p = api::quantize_params<kernels::Fp4QuantizeParams>(x, r.q, r.sf, code);
  r.p.sf_vec_size = static_cast<int>(vec);
  r.p.cute_dsl_zero = true;
  return r;
}

}  // namespace

namespace {

std::tuple<Tensor, Tensor> mxfp4_cute_impl(const char* op, const char* in_arg, const Tensor& input,
                                           int64_t sf_layout, std::optional<bool> enable_pdl) {
  const SfLayoutCode code = cute_layout(sf_layout, op);
  const Tensor x = cute_rows(input, op, in_arg);
  FLASHINFER_CHECK(x.dtype() == DType::kFloat16 || x.dtype() == DType::kBFloat16, op, in_arg,
                   "Input dtype must be float16 or bfloat16, got ", dtype_torch_name(x.dtype()));
  FLASHINFER_CHECK(x.size(1) % 32 == 0, op, in_arg, "K (", x.size(1),
                   ") must be divisible by MXFP4_SF_VEC_SIZE=32");
  CuteFp4 r = cute_fp4_outputs(x, 32, code);
  r.p.ue8m0 = true;
  if (x.numel() > 0) api::launch(kFp4QuantizeKernels, r.p, x.device(), op, in_arg, enable_pdl);
  return {r.q, r.sf};
}

// gs_arg: the global scale's name in the caller.
std::tuple<Tensor, Tensor> nvfp4_cute_impl(const char* op, const char* in_arg, const char* gs_arg,
                                           const Tensor& input, const Value& global_scale,
                                           int64_t sf_layout, std::optional<bool> enable_pdl) {
  const SfLayoutCode code = cute_layout(sf_layout, op);
  const Tensor x = cute_rows(input, op, in_arg);
  FLASHINFER_CHECK(x.dtype() == DType::kFloat16 || x.dtype() == DType::kBFloat16 ||
                       x.dtype() == DType::kFloat8E4M3FN,
                   op, in_arg,
                   "Input dtype must be one of (torch.float16, torch.bfloat16, "
                   "torch.float8_e4m3fn), got ",
                   dtype_torch_name(x.dtype()));
  FLASHINFER_CHECK_CODE(x.dtype() != DType::kFloat8E4M3FN, ErrorCode::kUnsupported, op, in_arg,
                        "float8_e4m3fn input (upstream first rescales it into half by 6 / "
                        "global_scale) is not implemented in flashinfer-cpp");
  FLASHINFER_CHECK(x.size(1) % 16 == 0, op, in_arg, "K (", x.size(1),
                   ") must be divisible by NVFP4_SF_VEC_SIZE=16");
  const Tensor gs = cute_scale(global_scale, x.device(), op, gs_arg);
  CuteFp4 r = cute_fp4_outputs(x, 16, code);
  r.p.global_scale = gs.data<float>();
  if (x.numel() > 0) api::launch(kFp4QuantizeKernels, r.p, x.device(), op, in_arg, enable_pdl);
  return {r.q, r.sf};
}

std::tuple<Tensor, Tensor> mxfp8_cute_impl(const char* op, const Tensor& input,
                                           bool is_sf_swizzled_layout, int64_t alignment,
                                           std::optional<bool> enable_pdl, bool is_sf_8x4_layout) {
  const Tensor x = cute_rows(input, op);
  FLASHINFER_CHECK(
      x.dtype() == DType::kFloat16 || x.dtype() == DType::kBFloat16 || x.dtype() == DType::kFloat32,
      op, "input", "Input dtype must be float16, bfloat16, or float32, got ",
      dtype_torch_name(x.dtype()));
  FLASHINFER_CHECK(alignment > 0 && alignment % 32 == 0, op, "alignment",
                   "alignment must be divisible by SF_VEC_SIZE=32");
  const int64_t m = x.size(0), k = x.size(1);
  FLASHINFER_CHECK(k % 32 == 0, op, "input", "K (", k, ") must be divisible by SF_VEC_SIZE=32");
  const int64_t padded_k = mxfp8_padded_k(k, alignment, op);
  const Tensor xp = zero_pad_columns(x, padded_k);
  const SfLayoutCode code = !is_sf_swizzled_layout ? SfLayoutCode::kLinear
                            : is_sf_8x4_layout     ? SfLayoutCode::k8x4
                                                   : SfLayoutCode::k128x4;
  Tensor q = Tensor::empty({m, padded_k}, DType::kFloat8E4M3FN, x.device());
  Tensor sf = Tensor::empty({m == 0 ? 0 : kernels::sf_buffer_size(code, m, padded_k / 32)},
                            DType::kUInt8, x.device());
  const auto p = api::quantize_params<kernels::Mxfp8QuantizeParams>(xp, q, sf, code);
  if (m > 0 && k > 0) {
    api::launch(kMxfp8QuantizeKernels, p, x.device(), op, "input", enable_pdl);
  }
  return {q, sf};
}

}  // namespace

std::tuple<Tensor, Tensor> fp4_quantize(const Tensor& input, std::optional<Tensor> global_scale,
                                        int64_t sf_vec_size, bool sf_use_ue8m0,
                                        bool is_sf_swizzled_layout, bool is_sf_8x4_layout,
                                        bool is_global_scale_inversed,
                                        std::optional<bool> enable_pdl, std::string_view backend,
                                        const Value& nvfp4_4over6, bool batch_invariant) {
  return call_op<&fp4_quantize>(
      [&]() -> std::tuple<Tensor, Tensor> {
        const char* op = "fp4_quantize";
        api::check_defined(input, op, "input");
        FLASHINFER_CHECK(sf_vec_size == 16 || sf_vec_size == 32, op, "sf_vec_size",
                         "sf_vec_size can only be 16 or 32, got ", sf_vec_size);
        const bool mxfp4 = sf_vec_size != 16 || sf_use_ue8m0;
        const bool four_over_six =
            resolve_4over6(nvfp4_4over6, mxfp4, sf_vec_size, sf_use_ue8m0, input.dtype(), op);
        const SfLayout layout = !is_sf_swizzled_layout ? SfLayout::layout_linear
                                : is_sf_8x4_layout     ? SfLayout::layout_8x4
                                                       : SfLayout::layout_128x4;
        if (batch_invariant) {
          bi_check_backend(op, backend);
          const bool nv = sf_vec_size == 16 && !sf_use_ue8m0;
          if (!nv && !(sf_vec_size == 32 && sf_use_ue8m0)) {
            bi_refuse(op, "nvfp4.quant / mxfp4.quant",
                      "sf_vec_size = " + std::to_string(sf_vec_size) +
                          " with sf_use_ue8m0 = " + (sf_use_ue8m0 ? "True" : "False"),
                      "sf_vec_size = 16 with e4m3 scales (the NVFP4 class) or sf_vec_size = 32 "
                      "with UE8M0 scales (the MXFP4 class)",
                      ErrorCode::kInvalidArgument, "sf_vec_size");
          }
          const char* cls = nv ? "nvfp4.quant" : "mxfp4.quant";
          if (nv && four_over_six) bi_refuse_4over6(op, cls);
          // A column-major input is quantized as its transpose, both outputs transposed back.
          const int64_t d = input.dim();
          const bool col_major = d >= 2 && input.stride(-2) == 1 && input.stride(-1) != 1;
          const Tensor v = col_major ? input.transpose(d - 2, d - 1) : input;
          bi_check_input(op, cls, "input", v, sf_vec_size);
          bi_check_row_bytes(op, cls, "input", v.size(-1), v.dtype());
          float gs = 1.0f;  // None: 1; inversed: one correctly rounded division
          if (nv && global_scale && global_scale->defined()) {
            gs = bi_scalar(Value(*global_scale), op, cls, "global_scale");
            if (is_global_scale_inversed) gs = 1.0f / gs;
          }
          const int64_t k = v.size(-1);
          const Tensor x2 = v.reshape({-1, k});
          Shape q_shape = v.shape();
          q_shape.back() = k / 2;
          const SfLayoutCode code = code_of(layout, op, "is_sf_swizzled_layout");
          BiOutputs o = bi_run(
              op, "input", x2, q_shape,
              nv ? kernels::BatchInvariantFormat::kNvfp4 : kernels::BatchInvariantFormat::kMxfp4,
              code, gs, std::nullopt, enable_pdl);
          Tensor sf = fp4_sf_view(o.sf, code, x2.size(0), k / sf_vec_size);
          if (col_major) return {o.q.transpose(d - 2, d - 1), sf.transpose(0, 1)};
          return {o.q, sf};
        }
        api::check_backend(op, backend, input.device());
        const kernels::Nvfp4FourOverSix fos = api::nvfp4_4over6_recipe(
            four_over_six, nvfp4_4over6, input.dtype(), input.device(), op);
        if (backend == "cute-dsl") {
          // Upstream's CuTe-DSL twin runs the same recipe; its entry points' other rules are
          // this path's, so the recipe is not taken here.
          api::refuse_nvfp4_4over6(fos.on, nvfp4_4over6, input.dtype(), op);
          // Upstream's routing: NVFP4 (16, e4m3) or MXFP4 (32, ue8m0) to the CuTe-DSL entry
          // points (2-D outputs, their zero rule); is_global_scale_inversed is not passed on.
          if (sf_vec_size == 16 && !sf_use_ue8m0) {
            FLASHINFER_CHECK(global_scale && global_scale->defined(), op, "global_scale",
                             "the CuTe-DSL NVFP4 path needs a global_scale");
            return nvfp4_cute_impl(op, "input", "global_scale", input, Value(*global_scale),
                                   static_cast<int64_t>(layout), enable_pdl);
          }
          FLASHINFER_CHECK(sf_vec_size == 32 && sf_use_ue8m0, op, "sf_vec_size",
                           "CuTe-DSL backend does not support sf_vec_size=", sf_vec_size,
                           " with sf_use_ue8m0=", sf_use_ue8m0 ? "True" : "False",
                           ". Supported: (16, False) for NVFP4, (32, True) for MXFP4");
          return mxfp4_cute_impl(op, "input", input, static_cast<int64_t>(layout), enable_pdl);
        }
        return fp4_quantize_impl(op, input, global_scale, sf_vec_size, sf_use_ue8m0, layout,
                                 is_global_scale_inversed, enable_pdl, fos);
      },
      input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout, is_sf_8x4_layout,
      is_global_scale_inversed, enable_pdl, backend, nvfp4_4over6, batch_invariant);
}

namespace {

// Per-token NVFP4 (nvfp4_quantize_per_token_cute_dsl; nvfp4_quantize with per_token_activation):
// `in_arg` / `gs_arg` name the input and the inverse base scale in the caller's errors.
std::tuple<Tensor, Tensor, Tensor> nvfp4_per_token_impl(const char* op, const char* in_arg,
                                                        const char* gs_arg, const Tensor& input,
                                                        const Value& global_scale_inv,
                                                        int64_t sf_layout,
                                                        std::optional<bool> enable_pdl) {
  const SfLayoutCode code = cute_layout(sf_layout, op);
  api::check_defined(input, op, in_arg);
  FLASHINFER_CHECK(input.dim() == 2, op, in_arg, "Per-token NVFP4 quantization expects a 2D input");
  FLASHINFER_CHECK(input.dtype() == DType::kFloat16 || input.dtype() == DType::kBFloat16, op,
                   in_arg,
                   "Per-token NVFP4 input dtype must be one of (torch.float16, torch.bfloat16), "
                   "got ",
                   dtype_torch_name(input.dtype()));
  FLASHINFER_CHECK(input.size(1) % 16 == 0, op, in_arg, "K (", input.size(1),
                   ") must be divisible by NVFP4_SF_VEC_SIZE=16");
  CuteFp4 r = cute_fp4_outputs(input, 16, code);
  Tensor scale = Tensor::empty({input.size(0)}, DType::kFloat32, input.device());
  Tensor gsi;
  if (global_scale_inv.is_tensor()) {
    gsi = fp32_scalar(global_scale_inv.as_tensor(), input.device(), op, gs_arg);
    r.p.per_token_gsi = gsi.data<float>();
  } else {
    FLASHINFER_CHECK(global_scale_inv.kind() == Value::Kind::kFloat ||
                         global_scale_inv.kind() == Value::Kind::kInt,
                     op, gs_arg, "expected a float or a one-element tensor, got ",
                     global_scale_inv.repr());
    r.p.per_token_gsi_value =
        static_cast<float>(global_scale_inv.kind() == Value::Kind::kFloat
                               ? global_scale_inv.as_float()
                               : static_cast<double>(global_scale_inv.as_int()));
  }
  r.p.per_token_scale = scale.data<float>();
  if (input.size(0) > 0) {
    api::launch(kFp4QuantizeKernels, r.p, input.device(), op, in_arg, enable_pdl);
  }
  return {r.q, r.sf, scale};
}

}  // namespace

namespace {

// do_shuffle's last step on a result quantized with linear scales over m rows of K: upstream's
// shuffle_matrix_a(a_fp4, 128) and shuffle_matrix_sf_a(a_sf, 128) reshaped to a_sf's shape (the
// trtllm-gen weight layout); the per-token scales move with their rows.
void shuffle_nvfp4_rows(Nvfp4QuantizeResult& r, int64_t m, int64_t k) {
  auto& [q, sf] = r;
  sf = shuffle_matrix_sf_a(sf, 128).reshape(sf.shape());
  const Shape q_shape = q.shape();
  q = shuffle_matrix_a(q.reshape({m, k / 2}), 128).reshape(q_shape);
  if (r.per_token_scale.defined()) {
    r.per_token_scale = shuffle_matrix_a(r.per_token_scale.view({m, 1}), 128).view({m});
  }
}

}  // namespace

Value to_value(const Nvfp4QuantizeResult& r) {
  const auto& [q, sf] = r;
  if (r.per_token_scale.defined()) {
    return Value::tuple({Value(q), Value(sf), Value(r.per_token_scale)});
  }
  return Value::tuple({Value(q), Value(sf)});
}

Nvfp4QuantizeResult nvfp4_quantize(const Tensor& a, const Value& a_global_sf, SfLayout sfLayout,
                                   bool do_shuffle, int64_t sf_vec_size,
                                   std::optional<bool> enable_pdl, std::string_view backend,
                                   bool per_token_activation,
                                   std::optional<Tensor> expanded_idx_to_permuted_idx,
                                   std::optional<Tensor> out_scale, const Value& nvfp4_4over6,
                                   bool batch_invariant) {
  return call_op<&nvfp4_quantize>(
      [&]() -> Nvfp4QuantizeResult {
        const char* op = "nvfp4_quantize";
        api::check_defined(a, op, "a");
        const bool four_over_six =
            resolve_4over6(nvfp4_4over6, sf_vec_size != 16, sf_vec_size, false, a.dtype(), op);
        const bool remap = expanded_idx_to_permuted_idx && expanded_idx_to_permuted_idx->defined();
        const bool has_out_scale = out_scale && out_scale->defined();
        if (batch_invariant) {
          // Upstream 0.7.4's nvfp4_quantize_batch_invariant, its checks in its order.
          bi_check_backend(op, backend);
          const char* cls = per_token_activation ? "nvfp4.quant.pertoken" : "nvfp4.quant";
          bi_check_input(op, cls, "a", a, 16);
          const int64_t k = a.size(-1);
          bi_check_row_bytes(op, cls, "a", k, a.dtype());
          if (sf_vec_size != 16) {
            bi_refuse(op, cls, "sf_vec_size = " + std::to_string(sf_vec_size),
                      "sf_vec_size = 16 (one e4m3 scale per 16 elements)",
                      ErrorCode::kInvalidArgument, "sf_vec_size");
          }
          if (four_over_six) bi_refuse_4over6(op, cls);
          if (remap) {
            bi_refuse(op, cls, "expanded_idx_to_permuted_idx",
                      "no row map (the scales are stored at the input's rows)",
                      ErrorCode::kInvalidArgument, "expanded_idx_to_permuted_idx");
          }
          if (has_out_scale) {
            bi_refuse(op, cls, "out_scale",
                      "the per-token scale as the class returns it (fold out_scale in the caller)",
                      ErrorCode::kInvalidArgument, "out_scale");
          }
          FLASHINFER_CHECK(!a_global_sf.is_none(), op, "a_global_sf", "is required");
          const float gs = bi_scalar(a_global_sf, op, cls, "a_global_sf");
          const SfLayoutCode code = code_of(sfLayout, op, "sfLayout");
          const int64_t m = a.numel() / k;
          if (do_shuffle && code != SfLayoutCode::k128x4) {
            bi_refuse(op, cls,
                      std::string("do_shuffle with the ") +
                          (code == SfLayoutCode::k8x4 ? "8x4" : "linear") + " layout",
                      "do_shuffle with SfLayout.layout_128x4 (as FlashInfer's backends)",
                      ErrorCode::kInvalidArgument, "do_shuffle");
          }
          if (do_shuffle && m % 32 != 0) {
            bi_refuse(op, cls, "do_shuffle with " + std::to_string(m) + " rows",
                      "do_shuffle with a multiple of 32 rows (FlashInfer's shuffled layout "
                      "permutes rows in blocks of 32; its backends assert the same)",
                      ErrorCode::kInvalidArgument, "do_shuffle");
          }
          // The logical rows of any input (upstream reshapes a non-viewable one).
          const Tensor x2 = a.reshape({-1, k});
          Shape q_shape = a.shape();
          q_shape.back() = k / 2;
          const SfLayoutCode run_code = do_shuffle ? SfLayoutCode::kLinear : code;
          BiOutputs o =
              bi_run(op, "a", x2, q_shape, kernels::BatchInvariantFormat::kNvfp4, run_code, gs,
                     per_token_activation ? std::optional<float>(gs) : std::nullopt, enable_pdl);
          Nvfp4QuantizeResult r{o.q, fp4_sf_view(o.sf, run_code, m, k / 16), o.pts};
          if (!do_shuffle || m == 0) return r;
          FLASHINFER_CHECK(m % 128 == 0 && k % 64 == 0, op, "a",
                           "do_shuffle needs M % 128 == 0 and K a multiple of 64 "
                           "(shuffle_matrix_sf_a's 128-row blocks of 4 scale columns), got shape ",
                           shape_to_string(a.shape()));
          shuffle_nvfp4_rows(r, m, k);
          return r;
        }
        api::check_backend(op, backend, a.device());
        const kernels::Nvfp4FourOverSix fos =
            api::nvfp4_4over6_recipe(four_over_six, nvfp4_4over6, a.dtype(), a.device(), op);
        // The recipe runs on the per-tensor form's CPU path; the per-token and CuTe-DSL forms
        // (their own row scales and zero rules) refuse it.
        if (per_token_activation || backend == "cute-dsl") {
          api::refuse_nvfp4_4over6(fos.on, nvfp4_4over6, a.dtype(), op);
        }
        // out_scale (upstream 0.7.4): the CuTe-DSL per-token form's returned scales times
        // out_scale[0]; "auto" is the "cuda" backend there.
        if (has_out_scale) {
          FLASHINFER_CHECK(per_token_activation, op, "out_scale",
                           "out_scale is only supported with per_token_activation=True");
          FLASHINFER_CHECK(backend == "cute-dsl", op, "out_scale",
                           "out_scale is only supported with backend='cute-dsl' or 'cake'");
          FLASHINFER_CHECK(out_scale->numel() == 1, op, "out_scale",
                           "expected a one-element tensor, got shape ",
                           shape_to_string(out_scale->shape()));
        }
        FLASHINFER_CHECK(!a_global_sf.is_none(), op, "a_global_sf", "is required");
        // Upstream's _check_per_token_global_scale: with nvfp4_4over6 given (None included), a
        // float per-token inverse scale must be the recipe's 1 / (448 * 6) within 1e-3.
        if (per_token_activation && !is_nvfp4_4over6_unset(nvfp4_4over6) &&
            (a_global_sf.kind() == Value::Kind::kFloat ||
             a_global_sf.kind() == Value::Kind::kInt)) {
          const double s = a_global_sf.kind() == Value::Kind::kFloat
                               ? a_global_sf.as_float()
                               : static_cast<double>(a_global_sf.as_int());
          const double expected = 1.0 / (448.0 * 6.0);
          FLASHINFER_CHECK(std::abs(s - expected) <= 1e-3 * expected, op, "a_global_sf",
                           "a_global_sf=", s,
                           " does not match the requested NVFP4 4over6 recipe None, which implies "
                           "a_global_sf=",
                           expected,
                           ".  Build the scale from the same recipe: "
                           "flashinfer.make_nvfp4_global_scale(a, per_token_activation=True, "
                           "nvfp4_4over6_config=<the same value>).");
        }
        FLASHINFER_CHECK(!remap || per_token_activation, op, "expanded_idx_to_permuted_idx",
                         "is only supported with per_token_activation=True");
        FLASHINFER_CHECK_CODE(!remap, ErrorCode::kUnsupported, op, "expanded_idx_to_permuted_idx",
                              "the per-token form's row remapping is not implemented here");
        const bool cute = backend == "cute-dsl";
        FLASHINFER_CHECK(!cute || sf_vec_size == 16, op, "sf_vec_size",
                         "CuTe-DSL backend only supports sf_vec_size=16, got ", sf_vec_size);
        FLASHINFER_CHECK(!per_token_activation || sf_vec_size == 16, op, "sf_vec_size",
                         "Per-token NVFP4 quantization only supports sf_vec_size=16");
        // Upstream's per-token form takes a float or a tensor (its .item()); the per-tensor forms
        // hand a_global_sf to the kernels as a tensor.
        FLASHINFER_CHECK(per_token_activation || a_global_sf.is_tensor(), op, "a_global_sf",
                         "must be a one-element tensor (a float only with "
                         "per_token_activation=True), got ",
                         a_global_sf.repr());
        const auto quantize = [&](SfLayout layout) -> Nvfp4QuantizeResult {
          if (per_token_activation) {
            auto [q, sf, scale] = nvfp4_per_token_impl(op, "a", "a_global_sf", a, a_global_sf,
                                                       static_cast<int64_t>(layout), enable_pdl);
            return {q, sf, scale};
          }
          if (cute) {
            auto [q, sf] = nvfp4_cute_impl(op, "a", "a_global_sf", a, a_global_sf,
                                           static_cast<int64_t>(layout), enable_pdl);
            return {q, sf, Tensor()};
          }
          auto [q, sf] = fp4_quantize_impl(op, a, a_global_sf.as_tensor(), sf_vec_size, false,
                                           layout, false, enable_pdl, fos);
          return {q, sf, Tensor()};
        };
        // The per-token scales times out_scale[0], one fp32 product (the codes unchanged).
        const auto fold_out_scale = [&](Nvfp4QuantizeResult r) {
          if (!has_out_scale || !r.per_token_scale.defined()) return r;
          const float f = static_cast<float>(out_scale->to(DType::kFloat32).item());
          Tensor pts = r.per_token_scale.to(Device::cpu()).contiguous();
          float* v = pts.data<float>();
          for (int64_t i = 0; i < pts.numel(); ++i) v[i] = v[i] * f;
          r.per_token_scale = pts.to(r.per_token_scale.device());
          return r;
        };
        if (!do_shuffle) return fold_out_scale(quantize(sfLayout));
        // Upstream (fp4_quantization.py): assert sfLayout == layout_128x4, quantize with linear
        // scales, then shuffle_matrix_a(a_fp4, 128) and shuffle_matrix_sf_a(a_sf, 128) reshaped
        // to a_sf's shape (the trtllm-gen weight layout); the per-token form's scales move with
        // their rows. On a GPU every step has its kernel (the shuffles' row gather and 128x4
        // interleave).
        FLASHINFER_CHECK(sfLayout == SfLayout::layout_128x4, op, "sfLayout",
                         "do_shuffle requires SfLayout.layout_128x4");
        FLASHINFER_CHECK(a.dim() == 2 && a.size(0) % 128 == 0 && sf_vec_size > 0 &&
                             a.size(1) % (4 * sf_vec_size) == 0,
                         op, "a",
                         "do_shuffle needs a 2-D [M, K] input with M % 128 == 0 and K a multiple "
                         "of 4 * sf_vec_size (shuffle_matrix_sf_a's 128-row blocks of 4 scale "
                         "columns), got shape ",
                         shape_to_string(a.shape()));
        Nvfp4QuantizeResult r = quantize(SfLayout::layout_linear);
        if (a.size(0) == 0) return r;  // no rows to shuffle (the shuffles refuse empty inputs)
        shuffle_nvfp4_rows(r, a.size(0), a.size(1));
        return fold_out_scale(r);
      },
      a, a_global_sf, sfLayout, do_shuffle, sf_vec_size, enable_pdl, backend, per_token_activation,
      expanded_idx_to_permuted_idx, out_scale, nvfp4_4over6, batch_invariant);
}

std::tuple<Tensor, Tensor> mxfp4_quantize(const Tensor& a, std::string_view backend,
                                          std::optional<bool> enable_pdl, SfLayout sfLayout,
                                          bool batch_invariant) {
  return call_op<&mxfp4_quantize>(
      [&]() -> std::tuple<Tensor, Tensor> {
        const char* op = "mxfp4_quantize";
        api::check_defined(a, op, "a");
        if (batch_invariant) {
          bi_check_backend(op, backend);
          bi_check_input(op, "mxfp4.quant", "a", a, 32);
          const int64_t k = a.size(-1);
          bi_check_row_bytes(op, "mxfp4.quant", "a", k, a.dtype());
          const SfLayoutCode code = code_of(sfLayout, op, "sfLayout");
          const Tensor x2 = a.reshape({-1, k});
          Shape q_shape = a.shape();
          q_shape.back() = k / 2;
          BiOutputs o = bi_run(op, "a", x2, q_shape, kernels::BatchInvariantFormat::kMxfp4, code,
                               1.0f, std::nullopt, enable_pdl);
          return {o.q, fp4_sf_view(o.sf, code, x2.size(0), k / 32)};
        }
        api::check_backend(op, backend, a.device());
        if (backend == "cute-dsl") {
          return mxfp4_cute_impl(op, "a", a, static_cast<int64_t>(sfLayout), enable_pdl);
        }
        // e4m3 input as upstream's fp4_quantize takes it (nvfp4_rules.h: fp8_fp4_scale).
        api::check_dtype_in(a, {DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3FN}, op, "a");
        return fp4_quantize_impl(op, a, std::nullopt, 32, true, sfLayout, false, enable_pdl);
      },
      a, backend, enable_pdl, sfLayout, batch_invariant);
}

Tensor mxfp4_dequantize(const Tensor& a_fp4, const Tensor& a_sf, SfLayout sfLayout) {
  return call_op<&mxfp4_dequantize>(
      [&] {
        const char* op = "mxfp4_dequantize";
        const Tensor data = check_fp4_data(a_fp4, op, "a_fp4");
        const int64_t m = data.size(0), k = data.size(1) * 2;
        FLASHINFER_CHECK(k % 32 == 0, op, "a_fp4", "K = ", k,
                         " is not a multiple of the MXFP4 block size 32");
        const SfLayoutCode layout = code_of(sfLayout, op, "sfLayout");
        const Tensor sf = check_scales(a_sf, kernels::sf_buffer_size(layout, m, k / 32), op, "a_sf",
                                       layout_desc(layout));
        // Upstream: e2m1_and_ufp8sf_scale_to_float(..., ufp8_type=0), the code << 23 decode.
        return dequantize_impl(op, "a_fp4", data, k, true, sf, true, 32, layout, 1.0f,
                               /*ue8m0_shift=*/true);
      },
      a_fp4, a_sf, sfLayout);
}

Tensor e2m1_and_ufp8sf_scale_to_float(const Tensor& e2m1_tensor, const Tensor& ufp8_scale_tensor,
                                      std::optional<Tensor> global_scale_tensor,
                                      int64_t sf_vec_size, int64_t ufp8_type,
                                      bool is_sf_swizzled_layout, bool is_sf_8x4_layout) {
  return call_op<&e2m1_and_ufp8sf_scale_to_float>(
      [&] {
        const char* op = "e2m1_and_ufp8sf_scale_to_float";
        const Tensor data = check_fp4_data(e2m1_tensor, op, "e2m1_tensor");
        // Upstream's host function (E2M1AndUFP8SFScaleToFloatV2) takes any positive vector size
        // dividing K.
        FLASHINFER_CHECK(sf_vec_size > 0 && sf_vec_size <= (int64_t{1} << 30), op, "sf_vec_size",
                         "should be positive, got ", sf_vec_size);
        FLASHINFER_CHECK(ufp8_type == 0 || ufp8_type == 1, op, "ufp8_type",
                         "must be 1 (e4m3 scales) or 0 (ue8m0 scales), got ", ufp8_type);
        const int64_t m = data.size(0), k = data.size(1) * 2;
        FLASHINFER_CHECK(k % sf_vec_size == 0, op, "e2m1_tensor", "K = ", k,
                         " is not a multiple of sf_vec_size = ", sf_vec_size);
        FLASHINFER_CHECK(!is_sf_8x4_layout || is_sf_swizzled_layout, op, "is_sf_8x4_layout",
                         "requires is_sf_swizzled_layout to be True");
        const SfLayoutCode layout = !is_sf_swizzled_layout ? SfLayoutCode::kLinear
                                    : is_sf_8x4_layout     ? SfLayoutCode::k8x4
                                                           : SfLayoutCode::k128x4;
        const Tensor sf =
            check_scales(ufp8_scale_tensor, kernels::sf_buffer_size(layout, m, k / sf_vec_size), op,
                         "ufp8_scale_tensor", layout_desc(layout));
        // The global scale multiplies e4m3 scales only, and is required with them (upstream:
        // "globalScale is required when sfType is 1"); ue8m0 scales ignore it.
        const bool have_gs = global_scale_tensor && global_scale_tensor->defined();
        FLASHINFER_CHECK(ufp8_type == 0 || have_gs, op, "global_scale_tensor",
                         "is required when ufp8_type is 1 (e4m3 scales)");
        float gs = 1.0f;
        if (have_gs && ufp8_type == 1) {  // ue8m0 scales never read it (upstream's neither)
          const Tensor g = *global_scale_tensor;
          FLASHINFER_CHECK(g.numel() == 1, op, "global_scale_tensor",
                           "expected a one-element tensor, got shape ", shape_to_string(g.shape()));
          api::check_dtype_in(g, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op,
                              "global_scale_tensor");
          gs = static_cast<float>(g.item());
        }
        return dequantize_impl(op, "e2m1_tensor", data, k, true, sf, ufp8_type == 0, sf_vec_size,
                               layout, gs, /*ue8m0_shift=*/true);
      },
      e2m1_tensor, ufp8_scale_tensor, global_scale_tensor, sf_vec_size, ufp8_type,
      is_sf_swizzled_layout, is_sf_8x4_layout);
}

Tensor block_scale_interleave(const Tensor& unswizzled_sf, std::optional<Tensor> out_arg) {
  return call_op<&block_scale_interleave>(
      [&] {
        const char* op = "block_scale_interleave";
        const Tensor& t = unswizzled_sf;
        api::check_defined(t, op, "unswizzled_sf");
        api::check_dim(t, {2, 3}, op, "unswizzled_sf");
        api::check_dtype_in(t, {DType::kUInt8, DType::kBFloat16}, op, "unswizzled_sf");
        api::check_non_empty(t, op, "unswizzled_sf");
        kernels::BlockScaleInterleaveParams p;
        p.input = t.data_ptr();
        p.elem_size = static_cast<int>(t.element_size());
        p.batch = t.dim() == 3 ? t.size(0) : 1;
        p.rows = t.size(-2);
        p.cols = t.size(-1);
        p.in_stride_b = t.dim() == 3 ? t.stride(0) : 0;
        p.in_stride_r = t.stride(-2);
        p.in_stride_c = t.stride(-1);
        const int64_t n = p.batch * kernels::sf_buffer_size(SfLayoutCode::k128x4, p.rows, p.cols);
        Tensor out;
        if (out_arg) {
          out = *out_arg;
          api::check_defined(out, op, "out");
          FLASHINFER_CHECK(out.dim() == 1 && out.size(0) == n && out.is_contiguous() &&
                               out.dtype() == t.dtype() && out.device() == t.device(),
                           op, "out",
                           "block_scale_interleave out must be a contiguous flat tensor "
                           "of shape (",
                           n, ",), dtype ", dtype_torch_name(t.dtype()), ", on ", t.device().str());
        } else {
          out = Tensor::empty({n}, t.dtype(), t.device());
        }
        p.out = out.data_ptr();
        api::launch(kBlockScaleInterleaveKernels, p, t.device(), op, "unswizzled_sf");
        return out;
      },
      unswizzled_sf, out_arg);
}

std::tuple<Tensor, Tensor> mxfp8_quantize(const Tensor& input, bool is_sf_swizzled_layout,
                                          int64_t alignment, std::optional<bool> enable_pdl,
                                          std::string_view backend,
                                          std::optional<SfLayout> sf_swizzle_layout,
                                          bool batch_invariant) {
  return call_op<&mxfp8_quantize>(
      [&]() -> std::tuple<Tensor, Tensor> {
        const char* op = "mxfp8_quantize";
        api::check_defined(input, op, "input");
        const SfLayout layout = sf_swizzle_layout       ? *sf_swizzle_layout
                                : is_sf_swizzled_layout ? SfLayout::layout_128x4
                                                        : SfLayout::layout_linear;
        if (batch_invariant) {
          // Upstream 0.7.4's mxfp8_quantize_batch_invariant: K zero-padded to `alignment` (the
          // padding blocks: scale byte 0, codes 0), fp32 input taken, every layout.
          const char* cls = "mxfp8.quant";
          bi_check_backend(op, backend);
          bi_check_input(op, cls, "input", input, 32);
          if (alignment <= 0 || alignment % 32 != 0) {
            bi_refuse(op, cls, "alignment = " + std::to_string(alignment),
                      "a positive multiple of 32", ErrorCode::kInvalidArgument, "alignment");
          }
          const int64_t k = input.size(-1);
          const int64_t padded_k = quantization_round_up(k, alignment);
          bi_check_row_bytes(op, cls, "input", padded_k, input.dtype());
          const SfLayoutCode code = code_of(layout, op, "sf_swizzle_layout");
          const Tensor x2 = zero_pad_columns(input.reshape({-1, k}), padded_k);
          Shape q_shape = input.shape();
          q_shape.back() = padded_k;
          BiOutputs o = bi_run(op, "input", x2, q_shape, kernels::BatchInvariantFormat::kMxfp8,
                               code, 1.0f, std::nullopt, enable_pdl);
          return {o.q, o.sf};
        }
        api::check_backend(op, backend, input.device());
        if (backend == "cute-dsl") {  // upstream: sf_swizzle_layout overrides the boolean
          return mxfp8_cute_impl(op, input, layout != SfLayout::layout_linear, alignment,
                                 enable_pdl, layout == SfLayout::layout_8x4);
        }
        // Upstream pads K to a multiple of `alignment` (vLLM's gpt-oss MXFP8 path asks 256): the
        // padding columns are zeros, their blocks quantize to 0.
        FLASHINFER_CHECK(alignment > 0 && alignment % 32 == 0, op, "alignment",
                         "must be a positive multiple of the MXFP8 block size 32, got ", alignment);
        FLASHINFER_CHECK(!(input.device().is_cpu() && layout == SfLayout::layout_8x4), op,
                         "sf_swizzle_layout",
                         "SfLayout.layout_8x4 is not supported for mxfp8 quantization on CPU");
        FLASHINFER_CHECK(input.dim() >= 2, op, "input",
                         "expected a tensor of rank >= 2 ([M, K]), got ", input.dim(), "-D");
        // No rows: empty outputs, as upstream (fp4_quantize's rule); K must be there.
        FLASHINFER_CHECK(input.size(-1) > 0, op, "input",
                         "K (the last dimension) must be positive, got shape ",
                         shape_to_string(input.shape()));
        api::check_dtype_in(input, {DType::kFloat16, DType::kBFloat16}, op, "input");
        Tensor x = input.dim() == 2 ? input : input.reshape({-1, input.size(-1)});
        const int64_t m = x.size(0), k = x.size(1);
        FLASHINFER_CHECK(k % 32 == 0, op, "input", "K = ", k,
                         " is not a multiple of the MXFP8 block size 32");
        const int64_t padded_k = mxfp8_padded_k(k, alignment, op);
        if (m > 0) x = zero_pad_columns(x, padded_k);
        // float8_e4m3fn on every device: upstream's documented result dtype and its CUDA
        // kernel's. (Upstream's host path allocates uint8 for the same bits; one dtype per op
        // keeps the backends interchangeable, and mxfp8_dequantize_host takes either.)
        Shape q_shape = input.shape();
        q_shape.back() = padded_k;
        Tensor q = Tensor::empty(q_shape, DType::kFloat8E4M3FN, input.device());
        const SfLayoutCode code = code_of(layout, op, "sf_swizzle_layout");
        const int64_t sf_size = kernels::sf_buffer_size(code, m, padded_k / 32);
        Tensor sf = Tensor::empty({sf_size}, DType::kUInt8, input.device());
        if (m == 0) return {q, sf};  // nothing to quantize (and no grid to launch)
        const auto p = api::quantize_params<kernels::Mxfp8QuantizeParams>(x, q, sf, code);
        api::launch(kMxfp8QuantizeKernels, p, input.device(), op, "input", enable_pdl);
        return {q, sf};
      },
      input, is_sf_swizzled_layout, alignment, enable_pdl, backend, sf_swizzle_layout,
      batch_invariant);
}

Tensor mxfp8_dequantize_host(const Tensor& input, const Tensor& scale_tensor,
                             bool is_sf_swizzled_layout,
                             std::optional<SfLayout> sf_swizzle_layout) {
  return call_op<&mxfp8_dequantize_host>(
      [&] {
        const char* op = "mxfp8_dequantize_host";
        api::check_defined(input, op, "input");
        api::check_dim(input, {2}, op, "input");
        api::check_dtype_in(input, {DType::kFloat8E4M3FN, DType::kUInt8}, op, "input");
        api::check_non_empty(input, op, "input");
        const SfLayout layout = sf_swizzle_layout       ? *sf_swizzle_layout
                                : is_sf_swizzled_layout ? SfLayout::layout_128x4
                                                        : SfLayout::layout_linear;
        FLASHINFER_CHECK(layout != SfLayout::layout_8x4, op, "sf_swizzle_layout",
                         "only layout_128x4 and layout_linear are supported");
        const int64_t m = input.size(0), k = input.size(1);
        FLASHINFER_CHECK(k % 32 == 0, op, "input", "K = ", k,
                         " is not a multiple of the MXFP8 block size 32");
        const SfLayoutCode code = code_of(layout, op, "sf_swizzle_layout");
        const Tensor data = host_bytes(input);
        const Tensor sf = check_scales(scale_tensor, kernels::sf_buffer_size(code, m, k / 32), op,
                                       "scale_tensor", layout_desc(code));
        return dequantize_impl(op, "input", data, k, false, sf, true, 32, code, 1.0f,
                               /*ue8m0_shift=*/true);
      },
      input, scale_tensor, is_sf_swizzled_layout, sf_swizzle_layout);
}

std::tuple<Tensor, Tensor, Tensor> nvfp4_quantize_per_token_cute_dsl(
    const Tensor& input, const Value& global_scale_inv, int64_t sf_layout,
    std::optional<bool> enable_pdl) {
  return call_op<&nvfp4_quantize_per_token_cute_dsl>(
      [&] {
        return nvfp4_per_token_impl("nvfp4_quantize_per_token_cute_dsl", "input",
                                    "global_scale_inv", input, global_scale_inv, sf_layout,
                                    enable_pdl);
      },
      input, global_scale_inv, sf_layout, enable_pdl);
}

std::tuple<Tensor, Tensor> mxfp4_quantize_cute_dsl(const Tensor& input, int64_t sf_layout,
                                                   std::optional<bool> enable_pdl) {
  return call_op<&mxfp4_quantize_cute_dsl>(
      [&] {
        return mxfp4_cute_impl("mxfp4_quantize_cute_dsl", "input", input, sf_layout, enable_pdl);
      },
      input, sf_layout, enable_pdl);
}

std::tuple<Tensor, Tensor> nvfp4_quantize_cute_dsl(const Tensor& input, const Value& global_scale,
                                                   int64_t sf_layout,
                                                   std::optional<bool> enable_pdl) {
  return call_op<&nvfp4_quantize_cute_dsl>(
      [&] {
        return nvfp4_cute_impl("nvfp4_quantize_cute_dsl", "input", "global_scale", input,
                               global_scale, sf_layout, enable_pdl);
      },
      input, global_scale, sf_layout, enable_pdl);
}

std::tuple<Tensor, Tensor> mxfp8_quantize_cute_dsl(const Tensor& input, bool is_sf_swizzled_layout,
                                                   int64_t alignment,
                                                   std::optional<bool> enable_pdl,
                                                   bool is_sf_8x4_layout) {
  return call_op<&mxfp8_quantize_cute_dsl>(
      [&] {
        return mxfp8_cute_impl("mxfp8_quantize_cute_dsl", input, is_sf_swizzled_layout, alignment,
                               enable_pdl, is_sf_8x4_layout);
      },
      input, is_sf_swizzled_layout, alignment, enable_pdl, is_sf_8x4_layout);
}

namespace {

// Bench hooks: input [m, k] in input_dtype (bf16 by default). Bytes: the input read once, the
// packed values and the block scales written once. FLOPs: 0 (scaling and rounding only).
BenchCase bench_quantize(const BenchShape& s, Device dev, const char* name, double out_bits,
                         int64_t block) {
  const Shape x{s.m, s.k};
  BenchCase c = api::bench::invoke_case(
      name, {Value(api::bench::random_tensor(x, s.input_dtype, dev, s.random_seed, -4.0, 4.0))});
  const double n = static_cast<double>(s.m * s.k);
  c.bytes =
      api::bench::nbytes(x, s.input_dtype) + n * out_bits / 8.0 + n / static_cast<double>(block);
  return c;
}

Tensor bench_input(const BenchShape& s, Device dev) {
  return api::bench::random_tensor({s.m, s.k}, s.input_dtype, dev, s.random_seed, -4.0, 4.0);
}

// NVFP4 with a global scale of 448 * 6 / 4 (the inputs lie in [-4, 4)).
BenchCase bench_nvfp4(const BenchShape& s, Device dev) {
  BenchCase c = api::bench::invoke_case(
      "nvfp4_quantize", {Value(bench_input(s, dev)),
                         Value(Tensor::full({1}, 448.0 * 6.0 / 4.0, DType::kFloat32).to(dev))});
  const double n = static_cast<double>(s.m * s.k);
  c.bytes = api::bench::nbytes({s.m, s.k}, s.input_dtype) + n / 2.0 + n / 16.0;
  return c;
}

// The dequantizers read what the matching quantizer wrote (made once, outside the timing) and
// write fp32 [m, k]; they run on the host, as upstream's do.
double dequant_bytes(const BenchShape& s, double in_bits, int64_t block) {
  const double n = static_cast<double>(s.m * s.k);
  return n * in_bits / 8.0 + n / static_cast<double>(block) + 4.0 * n;
}

BenchCase bench_mxfp4_dequantize(const BenchShape& s, Device dev) {
  const auto [q, sf] = mxfp4_quantize(bench_input(s, dev));
  BenchCase c = api::bench::invoke_case("mxfp4_dequantize", {Value(q), Value(sf)});
  c.bytes = dequant_bytes(s, 4.0, 32);
  return c;
}

BenchCase bench_mxfp8_dequantize(const BenchShape& s, Device dev) {
  const auto [q, sf] = mxfp8_quantize(bench_input(s, dev));
  BenchCase c = api::bench::invoke_case("mxfp8_dequantize_host", {Value(q), Value(sf)});
  c.bytes = dequant_bytes(s, 8.0, 32);
  return c;
}

BenchCase bench_e2m1_to_float(const BenchShape& s, Device dev) {
  const Tensor gs = Tensor::full({1}, 448.0 * 6.0 / 4.0, DType::kFloat32).to(dev);
  const auto [q, sf] = fp4_quantize(bench_input(s, dev), gs);
  BenchCase c = api::bench::invoke_case(
      "e2m1_and_ufp8sf_scale_to_float",
      {Value(q), Value(sf), Value(Tensor::full({1}, 4.0 / (448.0 * 6.0), DType::kFloat32))});
  c.bytes = dequant_bytes(s, 4.0, 16);
  return c;
}

// Linear [m, k / 16] e4m3 scales (random bytes) into the 128x4 layout.
BenchCase bench_interleave(const BenchShape& s, Device dev) {
  const Shape sf{s.m, s.k / 16};
  const Tensor bytes =
      api::bench::random_tensor(sf, DType::kFloat32, Device::cpu(), s.random_seed, 0.0, 255.0)
          .to(DType::kUInt8)
          .to(dev);
  BenchCase c = api::bench::invoke_case("block_scale_interleave", {Value(bytes)});
  c.bytes = 2.0 * static_cast<double>(s.m * (s.k / 16));
  return c;
}

}  // namespace

namespace detail {
void register_quantization_ops(OpRegistry& r) {
  declare<&fp4_quantize>(
      r,
      {.name = "fp4_quantize",
       .module = kQuantizationFp4Module,
       .summary = "Quantize to FP4 (E2M1) with per-block e4m3 or ue8m0 scale factors"},
      "input", "global_scale", arg("sf_vec_size", 16), arg("sf_use_ue8m0", false),
      arg("is_sf_swizzled_layout", true), arg("is_sf_8x4_layout", false),
      arg("is_global_scale_inversed", false), "enable_pdl", arg("backend", "auto"),
      arg("nvfp4_4over6", nvfp4_4over6_unset()).type("NVFP44Over6Config"),
      arg("batch_invariant", false).kw());
  declare<&nvfp4_quantize>(
      r,
      {.name = "nvfp4_quantize",
       .module = kQuantizationFp4Module,
       .summary = "Quantize to NVFP4: E2M1 values, e4m3 scales of 16-element blocks, global scale"},
      "a", "a_global_sf", arg("sfLayout", SfLayout::layout_128x4), arg("do_shuffle", false),
      arg("sf_vec_size", 16), "enable_pdl", arg("backend", "auto"),
      arg("per_token_activation", false), "expanded_idx_to_permuted_idx", "out_scale",
      arg("nvfp4_4over6", nvfp4_4over6_unset()).type("NVFP44Over6Config"),
      arg("batch_invariant", false).kw());
  declare<&mxfp4_quantize>(
      r,
      {.name = "mxfp4_quantize",
       .module = kQuantizationFp4Module,
       .summary = "Quantize to MXFP4: E2M1 values, ue8m0 scales of 32-element blocks"},
      "a", arg("backend", "auto"), "enable_pdl", arg("sfLayout", SfLayout::layout_128x4),
      arg("batch_invariant", false).kw());
  declare<&mxfp4_dequantize>(
      r,
      {.name = "mxfp4_dequantize",
       .module = kQuantizationFp4Module,
       .summary = "Dequantize MXFP4 (ue8m0 block scales) to fp32 on the host"},
      "a_fp4", "a_sf", arg("sfLayout", SfLayout::layout_128x4));
  declare<&e2m1_and_ufp8sf_scale_to_float>(
      r,
      {.name = "e2m1_and_ufp8sf_scale_to_float",
       .module = kQuantizationFp4Module,
       .summary = "Dequantize packed E2M1 with e4m3/ue8m0 block scales to fp32 on the host"},
      "e2m1_tensor", "ufp8_scale_tensor", "global_scale_tensor", arg("sf_vec_size", 16),
      arg("ufp8_type", 1), arg("is_sf_swizzled_layout", true), arg("is_sf_8x4_layout", false));
  declare<&block_scale_interleave>(
      r,
      {.name = "block_scale_interleave",
       .module = kQuantizationFp4Module,
       .summary = "Swizzle a linear block-scale matrix into the 128x4 layout"},
      "unswizzled_sf", arg("out").kw().mut());
  declare<&mxfp8_quantize>(
      r,
      {.name = "mxfp8_quantize",
       .module = kQuantizationFp8Module,
       .summary = "Quantize to MXFP8: e4m3 values, ue8m0 scales of 32-element blocks"},
      "input", arg("is_sf_swizzled_layout", true), arg("alignment", 32), "enable_pdl",
      arg("backend", "auto"), arg("sf_swizzle_layout").type("SfLayout"),
      arg("batch_invariant", false).kw());
  declare<&mxfp8_dequantize_host>(
      r,
      {.name = "mxfp8_dequantize_host",
       .module = kQuantizationFp8Module,
       .summary = "Dequantize MXFP8 (e4m3 values, ue8m0 scales) to fp32 on the host"},
      "input", "scale_tensor", arg("is_sf_swizzled_layout", true),
      arg("sf_swizzle_layout").type("SfLayout"));

  for (const char* op : {"fp4_quantize", "nvfp4_quantize", "mxfp4_quantize"}) {
    api::register_backends(op, kFp4QuantizeKernels);
  }
  api::register_backends("mxfp8_quantize", kMxfp8QuantizeKernels);
  declare<&mxfp4_quantize_cute_dsl>(
      r,
      {.name = "mxfp4_quantize_cute_dsl",
       .module = kMxfp4CuteModule,
       .summary = "MXFP4 quantization, upstream's CuTe-DSL entry point (2-D outputs, zero rule)"},
      "input", arg("sf_layout", int64_t{0}), "enable_pdl");
  declare<&mxfp8_quantize_cute_dsl>(
      r,
      {.name = "mxfp8_quantize_cute_dsl",
       .module = kMxfp8CuteModule,
       .summary = "MXFP8 quantization, upstream's CuTe-DSL entry point (fp32 input, K padding)"},
      "input", arg("is_sf_swizzled_layout", true), arg("alignment", int64_t{32}), "enable_pdl",
      arg("is_sf_8x4_layout", false));
  declare<&nvfp4_quantize_cute_dsl>(
      r,
      {.name = "nvfp4_quantize_cute_dsl",
       .module = kNvfp4CuteModule,
       .summary = "NVFP4 quantization, upstream's CuTe-DSL entry point (2-D outputs, zero rule)"},
      "input", "global_scale", arg("sf_layout", int64_t{0}), "enable_pdl");
  declare<&nvfp4_quantize_per_token_cute_dsl>(
      r,
      {.name = "nvfp4_quantize_per_token_cute_dsl",
       .module = kNvfp4CuteModule,
       .summary = "Per-token NVFP4 quantization: a scale per row, upstream's CuTe-DSL entry point"},
      "input", "global_scale_inv", arg("sf_layout", int64_t{0}), "enable_pdl");
  for (const char* op : {"mxfp4_quantize_cute_dsl", "nvfp4_quantize_cute_dsl",
                         "nvfp4_quantize_per_token_cute_dsl"}) {
    api::register_backends(op, kFp4QuantizeKernels);
  }
  api::register_backends("mxfp8_quantize_cute_dsl", kMxfp8QuantizeKernels);
  api::register_backends("block_scale_interleave", kBlockScaleInterleaveKernels);
  for (const char* op :
       {"mxfp4_dequantize", "e2m1_and_ufp8sf_scale_to_float", "mxfp8_dequantize_host"}) {
    api::register_backends(op, kBlockDequantizeKernels);
  }

  register_bench_hook("fp4_quantize", [](const BenchShape& s, Device d) {
    return bench_quantize(s, d, "fp4_quantize", 4.0, 16);
  });
  register_bench_hook("nvfp4_quantize", bench_nvfp4);
  register_bench_hook("mxfp4_quantize", [](const BenchShape& s, Device d) {
    return bench_quantize(s, d, "mxfp4_quantize", 4.0, 32);
  });
  register_bench_hook("mxfp4_dequantize", bench_mxfp4_dequantize);
  register_bench_hook("e2m1_and_ufp8sf_scale_to_float", bench_e2m1_to_float);
  register_bench_hook("block_scale_interleave", bench_interleave);
  register_bench_hook("mxfp8_quantize", [](const BenchShape& s, Device d) {
    return bench_quantize(s, d, "mxfp8_quantize", 8.0, 32);
  });
  register_bench_hook("mxfp8_dequantize_host", bench_mxfp8_dequantize);
  register_bench_hook("mxfp4_quantize_cute_dsl", [](const BenchShape& s, Device d) {
    return bench_quantize(s, d, "mxfp4_quantize_cute_dsl", 4.0, 32);
  });
  register_bench_hook("mxfp8_quantize_cute_dsl", [](const BenchShape& s, Device d) {
    return bench_quantize(s, d, "mxfp8_quantize_cute_dsl", 8.0, 32);
  });
  register_bench_hook("nvfp4_quantize_cute_dsl", [](const BenchShape& s, Device d) {
    BenchCase c = api::bench::invoke_case("nvfp4_quantize_cute_dsl",
                                          {Value(bench_input(s, d)), Value(448.0 * 6.0 / 4.0)});
    const double n = static_cast<double>(s.m * s.k);
    c.bytes = api::bench::nbytes({s.m, s.k}, s.input_dtype) + n / 2.0 + n / 16.0;
    return c;
  });
  register_bench_hook("nvfp4_quantize_per_token_cute_dsl", [](const BenchShape& s, Device d) {
    BenchCase c = api::bench::invoke_case("nvfp4_quantize_per_token_cute_dsl",
                                          {Value(bench_input(s, d)), Value(1.0 / (448.0 * 6.0))});
    const double n = static_cast<double>(s.m * s.k);
    c.bytes = api::bench::nbytes({s.m, s.k}, s.input_dtype) + n / 2.0 + n / 16.0 +
              4.0 * static_cast<double>(s.m);
    return c;
  });
}
}  // namespace detail

}  // namespace flashinfer
