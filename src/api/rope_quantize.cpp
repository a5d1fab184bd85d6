// rope_quantize_fp8 and mla_rope_quantize_fp8 (flashinfer.rope): checks and dispatch to the CPU
// reference (kernels/cpu/rope_quantize_cpu.cpp) or the CUDA kernel.
#include "flashinfer/ops/rope_quantize.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/rope_quantize_cpu.h"
#include "kernels/rope_quantize_params.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/rope_quantize_cuda.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kRopeQuantizeOp = "rope_quantize_fp8";
constexpr const char* kMlaOp = "mla_rope_quantize_fp8";

constexpr api::KernelEntry<kernels::RopeQuantizeParams> kRopeQuantizeKernels[] = {
    {DeviceType::kCPU, "CPU reference: fp32 rotation, saturating RNE fp8, OpenMP over tokens",
     nullptr,
     [](const kernels::RopeQuantizeParams& p, const api::LaunchContext&) {
       kernels::cpu::rope_quantize(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: thread per output element", nullptr,
     [](const kernels::RopeQuantizeParams& p, const api::LaunchContext& c) {
       kernels::cuda::rope_quantize(p, c.stream, c.enable_pdl);
     }},
#endif
};

using Outs = std::tuple<Tensor, Tensor, Tensor, Tensor>;

Outs rope_quantize_impl(const char* op, const Tensor& q_rope, const Tensor& k_rope,
                        const std::optional<Tensor>& q_nope_arg,
                        const std::optional<Tensor>& k_nope_arg, const Tensor& cos_sin_cache,
                        const Tensor& pos_ids, bool is_neox, std::optional<DType> quantize_dtype,
                        double scale_q, double scale_kv, const std::optional<Tensor> (&outs)[4],
                        bool enable_pdl) {
  api::check_defined(q_rope, op, "q_rope");
  api::check_defined(k_rope, op, "k_rope");
  api::check_defined(cos_sin_cache, op, "cos_sin_cache");
  api::check_defined(pos_ids, op, "pos_ids");
  api::check_dim(q_rope, {3}, op, "q_rope");
  api::check_dim(k_rope, {2, 3}, op, "k_rope");
  const bool mla = k_rope.dim() == 2;
  const int64_t nnz = q_rope.size(0), hq = q_rope.size(1), rd = q_rope.size(2);
  const int64_t hk = mla ? 1 : k_rope.size(1);
  const DType in = q_rope.dtype();
  FLASHINFER_CHECK(in == DType::kFloat16 || in == DType::kBFloat16, op, "q_rope", "dtype ",
                   dtype_torch_name(in), " is not supported (float16, bfloat16)");
  FLASHINFER_CHECK(cos_sin_cache.dtype() == DType::kFloat32, op, "cos_sin_cache",
                   "should be float32, got ", dtype_torch_name(cos_sin_cache.dtype()));
  api::check_dim(cos_sin_cache, {2}, op, "cos_sin_cache");
  FLASHINFER_CHECK(rd % 2 == 0 && cos_sin_cache.size(1) == rd, op, "cos_sin_cache",
                   "must be [max_pos, rope_dim] with rope_dim = q_rope's even last dim ", rd,
                   ", got ", shape_to_string(cos_sin_cache.shape()));
  FLASHINFER_CHECK(cos_sin_cache.stride(1) == 1 || rd <= 1, op, "cos_sin_cache",
                   "the last axis must be contiguous");
  FLASHINFER_CHECK(k_rope.size(0) == nnz && k_rope.size(k_rope.dim() - 1) == rd, op, "k_rope",
                   "must be [", nnz, mla ? "" : ", Hk", ", ", rd, "], got ",
                   shape_to_string(k_rope.shape()));
  api::check_same_dtype(k_rope, q_rope, op, "k_rope", "q_rope");
  // Absent nope parts are zero-width, as upstream makes them: empty views of the rope parts (no
  // allocation, which a CUDA graph capturing the call would refuse).
  const Tensor q_nope = q_nope_arg ? *q_nope_arg : q_rope.slice(2, 0, 0);
  const Tensor k_nope = k_nope_arg ? *k_nope_arg : k_rope.slice(k_rope.dim() - 1, 0, 0);
  api::check_defined(q_nope, op, "q_nope");
  api::check_defined(k_nope, op, "k_nope");
  FLASHINFER_CHECK(q_nope.dim() == 3 && q_nope.size(0) == nnz && q_nope.size(1) == hq, op, "q_nope",
                   "must be [", nnz, ", ", hq, ", no_rope_dim], got ",
                   shape_to_string(q_nope.shape()));
  FLASHINFER_CHECK(
      k_nope.dim() == k_rope.dim() && k_nope.size(0) == nnz && (mla || k_nope.size(1) == hk), op,
      "k_nope", "must be shaped like k_rope but for the last dim, got ",
      shape_to_string(k_nope.shape()));
  api::check_same_dtype(q_nope, q_rope, op, "q_nope", "q_rope");
  api::check_same_dtype(k_nope, q_rope, op, "k_nope", "q_rope");
  const Tensor* ins[4] = {&q_rope, &k_rope, &q_nope, &k_nope};
  const char* in_names[4] = {"q_rope", "k_rope", "q_nope", "k_nope"};
  const char* out_names[4] = {"q_rope_out", "k_rope_out", "q_nope_out", "k_nope_out"};
  for (int i = 0; i < 4; ++i) {
    api::check_same_device(*ins[i], q_rope, op, in_names[i], "q_rope");
    FLASHINFER_CHECK(ins[i]->stride(ins[i]->dim() - 1) == 1 || ins[i]->size(ins[i]->dim() - 1) <= 1,
                     op, in_names[i], "the last axis must be contiguous");
  }
  api::check_same_device(cos_sin_cache, q_rope, op, "cos_sin_cache", "q_rope");
  api::check_same_device(pos_ids, q_rope, op, "pos_ids", "q_rope");
  api::check_dim(pos_ids, {1}, op, "pos_ids");
  FLASHINFER_CHECK(pos_ids.dtype() == DType::kInt32 || pos_ids.dtype() == DType::kInt64, op,
                   "pos_ids", "must be int32 or int64, got ", dtype_torch_name(pos_ids.dtype()));
  FLASHINFER_CHECK(pos_ids.size(0) == nnz, op, "pos_ids", "has ", pos_ids.size(0),
                   " elements, expected nnz=", nnz);
  // Host positions are checked here; device ones are read by the kernel only (no copy to the
  // host, no synchronization), which writes NaN for the rope parts of a token outside the cache.
  if (nnz > 0 && pos_ids.device().is_cpu()) {
    const std::vector<double> pos = pos_ids.to_double_vector();
    for (std::size_t t = 0; t < pos.size(); ++t) {
      FLASHINFER_CHECK(pos[t] >= 0 && pos[t] < static_cast<double>(cos_sin_cache.size(0)), op,
                       "pos_ids", "element ", t, " (", static_cast<int64_t>(pos[t]),
                       ") is outside [0, ", cos_sin_cache.size(0), ")");
    }
  }
  if (!quantize_dtype) {
    quantize_dtype = DType::kFloat8E4M3FN;
    for (const auto& o : outs) {
      if (o) {
        quantize_dtype = o->dtype();
        break;
      }
    }
  }
  const DType qd = *quantize_dtype;
  FLASHINFER_CHECK(qd == DType::kFloat8E4M3FN || qd == DType::kFloat8E5M2, op, "quantize_dtype",
                   "must be float8_e4m3fn or float8_e5m2, got ", dtype_torch_name(qd));
  FLASHINFER_CHECK(std::isfinite(scale_q), op, "quant_scale_q", "must be finite, got ", scale_q);
  FLASHINFER_CHECK(std::isfinite(scale_kv), op, "quant_scale_kv", "must be finite, got ", scale_kv);
  Tensor res[4];
  for (int i = 0; i < 4; ++i) {
    if (outs[i]) {
      const Tensor& o = *outs[i];
      api::check_defined(o, op, out_names[i]);
      api::check_shape_eq(o, ins[i]->shape(), op, out_names[i]);
      FLASHINFER_CHECK(o.dtype() == qd, op, out_names[i], "dtype ", dtype_torch_name(o.dtype()),
                       " is not quantize_dtype ", dtype_torch_name(qd));
      api::check_same_device(o, q_rope, op, out_names[i], "q_rope");
      FLASHINFER_CHECK(o.stride(o.dim() - 1) == 1 || o.size(o.dim() - 1) <= 1, op, out_names[i],
                       "the last axis must be contiguous");
      api::check_writable(o, op, out_names[i]);
      for (int j = 0; j < 4; ++j) api::check_no_overlap(o, *ins[j], op, out_names[i], in_names[j]);
      api::check_no_overlap(o, cos_sin_cache, op, out_names[i], "cos_sin_cache");
      api::check_no_overlap(o, pos_ids, op, out_names[i], "pos_ids");
      for (int j = 0; j < i; ++j) {
        if (outs[j]) api::check_no_overlap(o, *outs[j], op, out_names[i], out_names[j]);
      }
      res[i] = o;
    } else if (ins[i]->numel() == 0 && i >= 2 && res[i - 2].defined()) {
      // A zero-width nope output: an empty view of its rope part's (no allocation).
      res[i] = res[i - 2].slice(res[i - 2].dim() - 1, 0, 0).view(ins[i]->shape());
    } else {
      res[i] = Tensor::empty(ins[i]->shape(), qd, q_rope.device());
    }
  }
  kernels::RopeQuantizeParams p;
  for (int i = 0; i < 4; ++i) {
    kernels::RopeQuantPart& part = p.part[i];
    const Tensor& x = *ins[i];
    const bool two_d = x.dim() == 2;
    part.in = x.data_ptr();
    part.out = res[i].data_ptr();
    part.in_stride_n = x.stride(0);
    part.in_stride_h = two_d ? 0 : x.stride(1);
    part.out_stride_n = res[i].stride(0);
    part.out_stride_h = two_d ? 0 : res[i].stride(1);
    part.heads = static_cast<int32_t>(two_d ? 1 : x.size(1));
    part.dim = static_cast<int32_t>(x.size(x.dim() - 1));
    part.scale = static_cast<float>(i % 2 == 0 ? scale_q : scale_kv);
    part.rope = i < 2;
  }
  p.in_dtype = in;
  p.out_dtype = qd;
  p.nnz = nnz;
  p.cos_sin = cos_sin_cache.data<const float>();
  p.cos_sin_stride = cos_sin_cache.stride(0);
  p.pos = pos_ids.data_ptr();
  p.pos_int64 = pos_ids.dtype() == DType::kInt64;
  p.max_pos = cos_sin_cache.size(0);
  p.interleave = !is_neox;
  if (nnz > 0) api::launch(kRopeQuantizeKernels, p, q_rope.device(), op, "q_rope", enable_pdl);
  return {res[0], res[1], res[2], res[3]};
}

// flashinfer bench: batch_size * s_qo tokens at positions 0.., num_qo_heads query heads, rope 64.
// rope_quantize_fp8: GQA keys (num_kv_heads), nope width head_dim_qk - 64; the MLA name: one
// latent key head, DeepSeek widths (q_nope 512 absorbed, k_nope 512).
BenchCase bench_rope_quantize(const BenchShape& s, Device dev, bool mla) {
  const DType d = s.input_dtype == DType::kFloat32 ? DType::kBFloat16 : s.input_dtype;
  const int64_t nnz = s.batch_size * s.s_qo, hq = s.num_qo_heads, rd = 64;
  const int64_t nope = mla ? 512 : std::max<int64_t>(s.head_dim_qk - rd, 0);
  const Shape kr = mla ? Shape{nnz, rd} : Shape{nnz, s.num_kv_heads, rd};
  const Shape kn = mla ? Shape{nnz, nope} : Shape{nnz, s.num_kv_heads, nope};
  std::vector<int64_t> pos;
  for (int64_t t = 0; t < nnz; ++t) pos.push_back(t % 4096);
  const Tensor cs = api::bench::random_tensor({4096, rd}, DType::kFloat32, dev, s.random_seed + 4);
  BenchCase c = api::bench::invoke_case(
      mla ? kMlaOp : kRopeQuantizeOp,
      {Value(api::bench::random_tensor({nnz, hq, rd}, d, dev, s.random_seed)),
       Value(api::bench::random_tensor(kr, d, dev, s.random_seed + 1)),
       Value(api::bench::random_tensor({nnz, hq, nope}, d, dev, s.random_seed + 2)),
       Value(api::bench::random_tensor(kn, d, dev, s.random_seed + 3)), Value(cs),
       Value(api::bench::int32_tensor(pos, dev))},
      {{"quant_scale_q", Value(2.0)},
       {"quant_scale_kv", Value(0.5)},
       // The outputs given (the engines pass preallocated ones), so the written-argument checks
       // see them.
       {"q_rope_out", Value(Tensor::zeros({nnz, hq, rd}, DType::kFloat8E4M3FN, dev))},
       {"k_rope_out", Value(Tensor::zeros(kr, DType::kFloat8E4M3FN, dev))},
       {"q_nope_out", Value(Tensor::zeros({nnz, hq, nope}, DType::kFloat8E4M3FN, dev))},
       {"k_nope_out", Value(Tensor::zeros(kn, DType::kFloat8E4M3FN, dev))}});
  const double elems =
      static_cast<double>(nnz) * (hq * (rd + nope) + (mla ? 1 : s.num_kv_heads) * (rd + nope));
  c.bytes = elems * (dtype_size(d) + 1.0);
  return c;
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor> rope_quantize_fp8(
    const Tensor& q_rope, const Tensor& k_rope, std::optional<Tensor> q_nope,
    std::optional<Tensor> k_nope, const Tensor& cos_sin_cache, const Tensor& pos_ids, bool is_neox,
    std::optional<DType> quantize_dtype, double quant_scale_q, double quant_scale_kv,
    std::optional<Tensor> q_rope_out, std::optional<Tensor> k_rope_out,
    std::optional<Tensor> q_nope_out, std::optional<Tensor> k_nope_out, bool enable_pdl,
    std::string_view backend) {
  return call_op<&rope_quantize_fp8>(
      [&] {
        FLASHINFER_CHECK(backend == "cuda" || backend == "cutile", kRopeQuantizeOp, "backend",
                         "must be \"cuda\" or \"cutile\", got \"", backend, "\"");
        if (backend == "cutile") {
          FLASHINFER_CHECK_CODE(!is_neox, ErrorCode::kUnsupported, kRopeQuantizeOp, "is_neox",
                                "backend='cutile' supports is_neox=False only");
          FLASHINFER_CHECK_CODE(k_rope.dim() == 2, ErrorCode::kUnsupported, kRopeQuantizeOp,
                                "k_rope", "backend='cutile' supports 2-D (MLA) keys only");
        }
        const std::optional<Tensor> outs[4] = {q_rope_out, k_rope_out, q_nope_out, k_nope_out};
        return rope_quantize_impl(kRopeQuantizeOp, q_rope, k_rope, q_nope, k_nope, cos_sin_cache,
                                  pos_ids, is_neox, quantize_dtype, quant_scale_q, quant_scale_kv,
                                  outs, enable_pdl);
      },
      q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quantize_dtype,
      quant_scale_q, quant_scale_kv, q_rope_out, k_rope_out, q_nope_out, k_nope_out, enable_pdl,
      backend);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> mla_rope_quantize_fp8(
    const Tensor& q_rope, const Tensor& k_rope, std::optional<Tensor> q_nope,
    std::optional<Tensor> k_nope, const Tensor& cos_sin_cache, const Tensor& pos_ids, bool is_neox,
    std::optional<DType> quantize_dtype, double quant_scale_q, double quant_scale_kv,
    std::optional<Tensor> q_rope_out, std::optional<Tensor> k_rope_out,
    std::optional<Tensor> q_nope_out, std::optional<Tensor> k_nope_out, bool enable_pdl) {
  return call_op<&mla_rope_quantize_fp8>(
      [&] {
        const std::optional<Tensor> outs[4] = {q_rope_out, k_rope_out, q_nope_out, k_nope_out};
        return rope_quantize_impl(kMlaOp, q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids,
                                  is_neox, quantize_dtype, quant_scale_q, quant_scale_kv, outs,
                                  enable_pdl);
      },
      q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quantize_dtype,
      quant_scale_q, quant_scale_kv, q_rope_out, k_rope_out, q_nope_out, k_nope_out, enable_pdl);
}

namespace detail {
void register_rope_quantize_ops(OpRegistry& r) {
  declare<&mla_rope_quantize_fp8>(
      r,
      {.name = kMlaOp,
       .module = "flashinfer.rope",
       .summary = "RoPE + FP8 quantization, MLA layout (2-D latent keys)"},
      "q_rope", "k_rope", arg("q_nope").required(), arg("k_nope").required(), "cos_sin_cache",
      "pos_ids", arg("is_neox", true), "quantize_dtype", arg("quant_scale_q", 1.0),
      arg("quant_scale_kv", 1.0), arg("q_rope_out").mut(), arg("k_rope_out").mut(),
      arg("q_nope_out").mut(), arg("k_nope_out").mut(), arg("enable_pdl", false));
  declare<&rope_quantize_fp8>(
      r,
      {.name = kRopeQuantizeOp,
       .module = "flashinfer.rope",
       .summary = "RoPE on the rotary parts, then FP8 quantization of every part"},
      "q_rope", "k_rope", arg("q_nope").required(), arg("k_nope").required(), "cos_sin_cache",
      "pos_ids", arg("is_neox", true), "quantize_dtype", arg("quant_scale_q", 1.0),
      arg("quant_scale_kv", 1.0), arg("q_rope_out").mut(), arg("k_rope_out").mut(),
      arg("q_nope_out").mut(), arg("k_nope_out").mut(), arg("enable_pdl", false),
      arg("backend", "cuda"));
  api::register_backends(kRopeQuantizeOp, kRopeQuantizeKernels);
  api::register_backends(kMlaOp, kRopeQuantizeKernels);
  register_bench_hook(kRopeQuantizeOp, [](const BenchShape& s, Device dev) {
    return bench_rope_quantize(s, dev, false);
  });
  register_bench_hook(
      kMlaOp, [](const BenchShape& s, Device dev) { return bench_rope_quantize(s, dev, true); });
}
}  // namespace detail

}  // namespace flashinfer
