// flashinfer.nvfp4_attention_sm120: nvfp4_attention_sm120_quantize_qkv and
// nvfp4_attention_sm120_fwd. Upstream's Python checks (its order and words; the CUDA-device
// check aside, since the CPU reference runs here too), outputs and defaults, the SM120 refusal
// elsewhere, dispatch and bench hooks. docs/ATTENTION.md ("NVFP4 attention on SM120");
// docs/upstream-facts/nvfp4_attention_sm120.md.
#include "flashinfer/ops/nvfp4_attention_sm120.h"

#include <cmath>
#include <string>
#include <utility>

#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/nvfp4_attention_cpu.h"
#include "kernels/nvfp4_attention_params.h"

#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/nvfp4_attention_cuda.h"
#endif

namespace flashinfer {

template <>
struct ReturnName<Nvfp4AttentionQkv> {
  static constexpr const char* value =
      "tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]";
};
template <>
struct ReturnName<Nvfp4AttentionOutput> {
  static constexpr const char* value = "tuple[Tensor, Tensor]";
};

Value to_value(const Nvfp4AttentionQkv& r) {
  return Value::tuple({Value(r.q_fp4), Value(r.k_fp4), Value(r.v_fp4_t), Value(r.q_scale),
                       Value(r.k_scale), Value(r.v_scale_t), Value(r.qk_correction)});
}

Value to_value(const Nvfp4AttentionOutput& r) { return Value::tuple({Value(r.out), Value(r.lse)}); }

namespace {

using kernels::kNvfp4AttnBlock;
using kernels::kNvfp4AttnTile;
using kernels::Nvfp4AttnFwdParams;
using kernels::Nvfp4AttnQuantParams;

constexpr const char* kNvfp4AttnModule = "flashinfer.nvfp4_attention_sm120";
constexpr const char* kQuantOp = "nvfp4_attention_sm120_quantize_qkv";
constexpr const char* kFwdOp = "nvfp4_attention_sm120_fwd";

constexpr api::KernelEntry<Nvfp4AttnQuantParams> kQuantKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: K and Q centred in the input dtype, NVFP4 blocks of 16 (e4m3 scales, "
     "swizzled), K rows permuted per 32",
     nullptr,
     [](const Nvfp4AttnQuantParams& p, const api::LaunchContext&) {
       kernels::cpu::nvfp4_attention_quantize_qkv(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernels: the means, the correction a thread per key, a thread per block of 16 (the "
     "CPU's bits)",
     nullptr,
     [](const Nvfp4AttnQuantParams& p, const api::LaunchContext& c) {
       kernels::cuda::nvfp4_attention_quantize_qkv(p, c.stream, c.enable_pdl);
     }},
#endif
};

constexpr api::KernelEntry<Nvfp4AttnFwdParams> kFwdKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: decoded FP4 scores plus the correction, online softmax over 128-key tiles "
     "(last first), P quantized to e2m1 per 16 keys",
     nullptr,
     [](const Nvfp4AttnFwdParams& p, const api::LaunchContext&) {
       kernels::cpu::nvfp4_attention_fwd(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernel: a warp per query row, the CPU reference's arithmetic (its bits), reference "
     "grade (no block-scaled tensor cores)",
     nullptr,
     [](const Nvfp4AttnFwdParams& p, const api::LaunchContext& c) {
       kernels::cuda::nvfp4_attention_fwd(p, c.stream, c.enable_pdl);
     }},
#endif
};

// _check_cuda_contiguous without its device half: contiguous, as the kernels read it.
void check_nvfp4_contiguous(const char* op, const Tensor& t, const char* name) {
  api::check_defined(t, op, name);
  FLASHINFER_CHECK(t.is_contiguous(), op, name, name,
                   " must be contiguous, got stride=", shape_to_string(t.strides()));
}

void check_nvfp4_same_device(const char* op, const Tensor& t, const char* name, const Tensor& ref,
                             const char* ref_name) {
  FLASHINFER_CHECK(t.device() == ref.device(), op, name, name, " must be on the same device as ",
                   ref_name, ", got ", t.device().str(), " and ", ref.device().str());
}

Nvfp4AttentionQkv nvfp4_quantize_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                      bool per_block_mean) {
  const char* op = kQuantOp;
  for (const auto& [t, name] :
       {std::pair<const Tensor&, const char*>{q, "q"}, {k, "k"}, {v, "v"}}) {
    check_nvfp4_contiguous(op, t, name);
    FLASHINFER_CHECK(t.dtype() == DType::kFloat16 || t.dtype() == DType::kBFloat16, op, name, name,
                     " must have dtype torch.float16 or torch.bfloat16, got ",
                     dtype_torch_name(t.dtype()));
    FLASHINFER_CHECK(t.dim() == 4, op, name, name,
                     " must have shape [batch, num_heads, seq_len, head_dim], got shape=",
                     shape_to_string(t.shape()));
  }
  FLASHINFER_CHECK(k.shape() == q.shape() && v.shape() == q.shape(), op,
                   k.shape() != q.shape() ? "k" : "v",
                   "q, k, and v must have the same shape, got q=", shape_to_string(q.shape()),
                   ", k=", shape_to_string(k.shape()), ", v=", shape_to_string(v.shape()));
  FLASHINFER_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), op,
                   k.dtype() != q.dtype() ? "k" : "v",
                   "q, k, and v must have the same dtype, got q=", dtype_torch_name(q.dtype()),
                   ", k=", dtype_torch_name(k.dtype()), ", v=", dtype_torch_name(v.dtype()));
  check_nvfp4_same_device(op, k, "k", q, "q");
  check_nvfp4_same_device(op, v, "v", q, "q");
  const int64_t B = q.size(0), H = q.size(1), S = q.size(2), D = q.size(3);
  FLASHINFER_CHECK(D == 64 || D == 128, op, "q", "head_dim must be 64 or 128, got ", D);
  // Upstream's module is built for sm_120a alone.
  api::check_upstream_arch(op, "q", q.device());
  const int64_t Sp = (S + kNvfp4AttnTile - 1) / kNvfp4AttnTile * kNvfp4AttnTile;
  const int64_t groups = kernels::nvfp4_attn_groups(Sp, per_block_mean);
  const Device dev = q.device();
  Nvfp4AttentionQkv r;
  r.q_fp4 = Tensor::empty({B, H, Sp, D / 2}, DType::kUInt8, dev);
  r.k_fp4 = Tensor::empty({B, H, Sp, D / 2}, DType::kUInt8, dev);
  r.v_fp4_t = Tensor::empty({B, H, D, Sp / 2}, DType::kUInt8, dev);
  r.q_scale = Tensor::empty({B, H, Sp, D / kNvfp4AttnBlock}, DType::kFloat8E4M3FN, dev);
  r.k_scale = Tensor::empty({B, H, Sp, D / kNvfp4AttnBlock}, DType::kFloat8E4M3FN, dev);
  r.v_scale_t = Tensor::empty({B, H, D, Sp / kNvfp4AttnBlock}, DType::kFloat8E4M3FN, dev);
  r.qk_correction = Tensor::empty({B, H, groups, Sp}, DType::kFloat32, dev);
  Nvfp4AttnQuantParams p;
  p.q = q.data_ptr(), p.k = k.data_ptr(), p.v = v.data_ptr(), p.dtype = q.dtype();
  p.B = B, p.H = H, p.S = S, p.S_pad = Sp, p.D = D, p.per_block_mean = per_block_mean;
  p.q_fp4 = static_cast<uint8_t*>(r.q_fp4.data_ptr());
  p.k_fp4 = static_cast<uint8_t*>(r.k_fp4.data_ptr());
  p.v_fp4_t = static_cast<uint8_t*>(r.v_fp4_t.data_ptr());
  p.q_scale = static_cast<uint8_t*>(r.q_scale.data_ptr());
  p.k_scale = static_cast<uint8_t*>(r.k_scale.data_ptr());
  p.v_scale_t = static_cast<uint8_t*>(r.v_scale_t.data_ptr());
  p.qk_correction = r.qk_correction.data<float>();
  if (B * H > 0 && Sp > 0) api::launch(kQuantKernels, p, dev, op, "q");
  return r;
}

void check_nvfp4_shape(const char* op, const Tensor& t, const char* name, const Shape& want) {
  FLASHINFER_CHECK(t.shape() == want, op, name, name, " shape ", shape_to_string(t.shape()),
                   " must be ", shape_to_string(want));
}

Nvfp4AttentionOutput nvfp4_fwd_impl(const Tensor& qf, const Tensor& kf, const Tensor& vf,
                                    const Tensor& qs, const Tensor& ks, const Tensor& vs,
                                    const Tensor& corr, std::optional<double> sm_scale, bool causal,
                                    bool per_block_mean, std::optional<Tensor> out,
                                    std::optional<Tensor> lse, DType out_dtype,
                                    std::optional<double> softmax_scale) {
  const char* op = kFwdOp;
  const std::pair<const Tensor&, const char*> inputs[] = {
      {qf, "q_fp4"},   {kf, "k_fp4"},     {vf, "v_fp4_t"},        {qs, "q_scale"},
      {ks, "k_scale"}, {vs, "v_scale_t"}, {corr, "qk_correction"}};
  for (const auto& [t, name] : inputs) check_nvfp4_contiguous(op, t, name);
  for (const auto& [t, name] : inputs) {
    if (&t != &qf) check_nvfp4_same_device(op, t, name, qf, "q_fp4");
  }
  for (const auto& [t, name] :
       {std::pair<const Tensor&, const char*>{qf, "q_fp4"}, {kf, "k_fp4"}, {vf, "v_fp4_t"}}) {
    FLASHINFER_CHECK(t.dtype() == DType::kUInt8, op, name,
                     "q_fp4, k_fp4, and v_fp4_t must be uint8 packed FP4 tensors");
  }
  FLASHINFER_CHECK(qs.dtype() == DType::kFloat8E4M3FN && ks.dtype() == DType::kFloat8E4M3FN, op,
                   qs.dtype() != DType::kFloat8E4M3FN ? "q_scale" : "k_scale",
                   "q_scale and k_scale must be torch.float8_e4m3fn tensors");
  FLASHINFER_CHECK(vs.dtype() == DType::kFloat8E4M3FN, op, "v_scale_t",
                   "v_scale_t must be a torch.float8_e4m3fn tensor");
  FLASHINFER_CHECK(corr.dtype() == DType::kFloat32, op, "qk_correction",
                   "qk_correction must be a torch.float32 tensor");
  FLASHINFER_CHECK(qf.dim() == 4, op, "q_fp4",
                   "q_fp4 must have shape [batch, num_heads, seq_len, head_dim / 2]");
  FLASHINFER_CHECK(kf.shape() == qf.shape(), op, "k_fp4", "k_fp4 shape ",
                   shape_to_string(kf.shape()), " must match q_fp4 ", shape_to_string(qf.shape()));
  const int64_t B = qf.size(0), H = qf.size(1), S = qf.size(2), D = 2 * qf.size(3);
  FLASHINFER_CHECK(D == 64 || D == 128, op, "q_fp4", "head_dim must be 64 or 128, got ", D);
  FLASHINFER_CHECK(S % kNvfp4AttnTile == 0, op, "q_fp4",
                   "seq_len must be padded to a multiple of 128, got ", S);
  check_nvfp4_shape(op, vf, "v_fp4_t", {B, H, D, S / 2});
  check_nvfp4_shape(op, qs, "q_scale", {B, H, S, D / kNvfp4AttnBlock});
  check_nvfp4_shape(op, ks, "k_scale", {B, H, S, D / kNvfp4AttnBlock});
  check_nvfp4_shape(op, vs, "v_scale_t", {B, H, D, S / kNvfp4AttnBlock});
  FLASHINFER_CHECK(corr.dim() == 4 && corr.size(0) == B && corr.size(1) == H, op, "qk_correction",
                   "qk_correction must have shape [batch, num_heads, seq_len_s, seq_len]");
  const int64_t rows = kernels::nvfp4_attn_groups(S, per_block_mean);
  FLASHINFER_CHECK(corr.size(2) == rows, op, "qk_correction",
                   "qk_correction must have one row per 128-token block (", rows, "), got ",
                   corr.size(2));
  FLASHINFER_CHECK(corr.size(3) == S, op, "qk_correction", "qk_correction last dimension must be ",
                   S, ", got ", corr.size(3));
  FLASHINFER_CHECK(!(sm_scale && softmax_scale), op, "softmax_scale",
                   "Specify only one of sm_scale or softmax_scale");
  const double scale = sm_scale        ? *sm_scale
                       : softmax_scale ? *softmax_scale
                                       : std::pow(static_cast<double>(D), -0.5);
  // The kernels take the scale in fp32.
  FLASHINFER_CHECK(std::isfinite(scale) && std::fabs(scale) <= 3.4028234663852886e38, op,
                   sm_scale ? "sm_scale" : "softmax_scale",
                   "the softmax scale must be finite in fp32, got ", scale);
  const Device dev = qf.device();
  if (out && out->defined()) {
    check_nvfp4_contiguous(op, *out, "out");
    check_nvfp4_same_device(op, *out, "out", qf, "q_fp4");
    check_nvfp4_shape(op, *out, "out", {B, H, S, D});
    FLASHINFER_CHECK(out->dtype() == DType::kFloat16 || out->dtype() == DType::kBFloat16, op, "out",
                     "out must have dtype torch.float16 or torch.bfloat16, got ",
                     dtype_torch_name(out->dtype()));
    api::check_writable(*out, op, "out");
  } else {
    FLASHINFER_CHECK(out_dtype == DType::kFloat16 || out_dtype == DType::kBFloat16, op, "out_dtype",
                     "out_dtype must be torch.float16 or torch.bfloat16, got ",
                     dtype_torch_name(out_dtype));
    out = Tensor::empty({B, H, S, D}, out_dtype, dev);
  }
  if (lse && lse->defined()) {
    check_nvfp4_contiguous(op, *lse, "lse");
    check_nvfp4_same_device(op, *lse, "lse", qf, "q_fp4");
    check_nvfp4_shape(op, *lse, "lse", {B, H, S});
    FLASHINFER_CHECK(lse->dtype() == DType::kFloat32, op, "lse",
                     "lse must have dtype torch.float32, got ", dtype_torch_name(lse->dtype()));
    api::check_writable(*lse, op, "lse");
  } else {
    lse = Tensor::empty({B, H, S}, DType::kFloat32, dev);
  }
  // The binding's gate: compute capability 12.0 exactly.
  api::check_upstream_arch(op, "q_fp4", dev);
  Nvfp4AttnFwdParams p;
  p.q_fp4 = static_cast<const uint8_t*>(qf.data_ptr());
  p.k_fp4 = static_cast<const uint8_t*>(kf.data_ptr());
  p.v_fp4_t = static_cast<const uint8_t*>(vf.data_ptr());
  p.q_scale = static_cast<const uint8_t*>(qs.data_ptr());
  p.k_scale = static_cast<const uint8_t*>(ks.data_ptr());
  p.v_scale_t = static_cast<const uint8_t*>(vs.data_ptr());
  p.qk_correction = corr.data<float>();
  p.B = B, p.H = H, p.S = S, p.D = D, p.causal = causal, p.per_block_mean = per_block_mean;
  p.sm_scale = static_cast<float>(scale);
  p.out = out->data_ptr(), p.out_dtype = out->dtype(), p.lse = lse->data<float>();
  if (B * H > 0 && S > 0) api::launch(kFwdKernels, p, dev, op, "q_fp4");
  return {*out, *lse};
}

}  // namespace

Nvfp4AttentionQkv nvfp4_attention_sm120_quantize_qkv(const Tensor& q, const Tensor& k,
                                                     const Tensor& v, bool per_block_mean) {
  return call_op<&nvfp4_attention_sm120_quantize_qkv>(
      [&] { return nvfp4_quantize_impl(q, k, v, per_block_mean); }, q, k, v, per_block_mean);
}

Nvfp4AttentionOutput nvfp4_attention_sm120_fwd(
    const Tensor& q_fp4, const Tensor& k_fp4, const Tensor& v_fp4_t, const Tensor& q_scale,
    const Tensor& k_scale, const Tensor& v_scale_t, const Tensor& qk_correction,
    std::optional<double> sm_scale, bool causal, bool per_block_mean, std::optional<Tensor> out,
    std::optional<Tensor> lse, DType out_dtype, std::optional<double> softmax_scale) {
  return call_op<&nvfp4_attention_sm120_fwd>(
      [&] {
        return nvfp4_fwd_impl(q_fp4, k_fp4, v_fp4_t, q_scale, k_scale, v_scale_t, qk_correction,
                              sm_scale, causal, per_block_mean, out, lse, out_dtype, softmax_scale);
      },
      q_fp4, k_fp4, v_fp4_t, q_scale, k_scale, v_scale_t, qk_correction, sm_scale, causal,
      per_block_mean, out, lse, out_dtype, softmax_scale);
}

namespace {

// batch_size x num_qo_heads heads of s_qo tokens, head dim 64 or 128 (head_dim_qk rounded),
// q_dtype inputs q, k, v; the forward runs on quantize_qkv's outputs (made once, outside the
// timing).
struct Nvfp4AttnBenchInputs {
  int64_t D = 0;
  Tensor q, k, v;
};
Nvfp4AttnBenchInputs bench_nvfp4_attn_inputs(const BenchShape& s, Device dev) {
  Nvfp4AttnBenchInputs in;
  in.D = s.head_dim_qk <= 64 ? 64 : 128;
  const DType dt = s.q_dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
  const Shape shape{s.batch_size, s.num_qo_heads, s.s_qo, in.D};
  using api::bench::random_tensor;
  in.q = random_tensor(shape, dt, dev, s.random_seed);
  in.k = random_tensor(shape, dt, dev, s.random_seed + 1);
  in.v = random_tensor(shape, dt, dev, s.random_seed + 2);
  return in;
}

BenchCase bench_nvfp4_attn_quantize(const BenchShape& s, Device dev) {
  const Nvfp4AttnBenchInputs in = bench_nvfp4_attn_inputs(s, dev);
  BenchCase c = api::bench::invoke_case(kQuantOp, {Value(in.q), Value(in.k), Value(in.v)});
  const double n = static_cast<double>(in.q.numel());
  c.bytes = n * 3.0 * 2.0 + n * 3.0 * (0.5 + 1.0 / 16.0);
  return c;
}

BenchCase bench_nvfp4_attn_fwd(const BenchShape& s, Device dev) {
  const Nvfp4AttnBenchInputs in = bench_nvfp4_attn_inputs(s, dev);
  const int64_t D = in.D;
  const Nvfp4AttentionQkv qkv = nvfp4_attention_sm120_quantize_qkv(in.q, in.k, in.v);
  BenchCase c = api::bench::invoke_case(
      kFwdOp,
      {Value(qkv.q_fp4), Value(qkv.k_fp4), Value(qkv.v_fp4_t), Value(qkv.q_scale),
       Value(qkv.k_scale), Value(qkv.v_scale_t), Value(qkv.qk_correction)},
      {{"causal", Value(s.causal)}});
  const int64_t Sp = qkv.q_fp4.size(2);
  c.flops = static_cast<double>(s.batch_size) *
            api::bench::attention_flops(Sp, Sp, s.num_qo_heads, D, D, s.causal);
  c.bytes = static_cast<double>(s.batch_size * s.num_qo_heads * Sp * D) *
            (3.0 * (0.5 + 1.0 / 16.0) + 2.0);
  return c;
}

}  // namespace

namespace detail {

void register_nvfp4_attention_sm120_ops(OpRegistry& r) {
  declare<&nvfp4_attention_sm120_quantize_qkv>(
      r,
      {.name = kQuantOp,
       .module = kNvfp4AttnModule,
       .summary = "SM120 NVFP4 attention: centre K and Q, pad to 128 and quantize Q, K, V^T to "
                  "NVFP4 with swizzled e4m3 scales and the Q-mean correction"},
      "q", "k", "v", arg("per_block_mean", true));
  api::register_backends(kQuantOp, kQuantKernels);
  register_bench_hook(kQuantOp, bench_nvfp4_attn_quantize);
  declare<&nvfp4_attention_sm120_fwd>(
      r,
      {.name = kFwdOp,
       .module = kNvfp4AttnModule,
       .summary = "SM120 NVFP4 attention forward over quantize_qkv's outputs (out, lse)"},
      "q_fp4", "k_fp4", "v_fp4_t", "q_scale", "k_scale", "v_scale_t", "qk_correction", "sm_scale",
      arg("causal", false), arg("per_block_mean", true), arg("out").mut(), arg("lse").mut(),
      arg("out_dtype", DType::kBFloat16), "softmax_scale");
  api::register_backends(kFwdOp, kFwdKernels);
  register_bench_hook(kFwdOp, bench_nvfp4_attn_fwd);
}

}  // namespace detail

}  // namespace flashinfer
