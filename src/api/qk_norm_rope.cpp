// fused_qk_rmsnorm_rope (flashinfer.norm): declaration, argument checks, dispatch to the CPU
// reference or the CUDA kernel.
#include "flashinfer/ops/qk_norm_rope.h"

#include <algorithm>
#include <string>

#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/qk_norm_rope_cpu.h"

#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/qk_norm_rope_cuda.h"
#endif

namespace flashinfer {
namespace {

using api::KernelEntry;
using api::LaunchContext;

constexpr KernelEntry<kernels::QkNormRopeParams> kQkNormRopeKernels[] = {
    {DeviceType::kCPU, "CPU reference", nullptr,
     [](const kernels::QkNormRopeParams& p, const LaunchContext&) {
       kernels::cpu::fused_qk_rmsnorm_rope(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one thread per (token, q/k/v part), the CPU's fp32 steps",
     nullptr,
     [](const kernels::QkNormRopeParams& p, const LaunchContext& c) {
       kernels::cuda::fused_qk_rmsnorm_rope(p, c.stream);
     }},
#endif
};

Tensor output(const std::optional<Tensor>& given, const Shape& shape, DType dt, const Tensor& qkv,
              const char* op, const char* arg) {
  if (!given || !given->defined()) return Tensor::empty(shape, dt, qkv.device());
  api::check_shape_eq(*given, shape, op, arg);
  FLASHINFER_CHECK(given->dtype() == dt, op, arg, "dtype ", dtype_torch_name(given->dtype()),
                   " != expected ", dtype_torch_name(dt));
  FLASHINFER_CHECK(given->is_contiguous(), op, arg, "must be contiguous");
  api::check_same_device(*given, qkv, op, arg, "qkv");
  return *given;
}

void check_weight(const Tensor& w, int64_t numel, const Tensor& qkv, const char* op,
                  const char* arg, const char* heads) {
  api::check_defined(w, op, arg);
  FLASHINFER_CHECK(w.numel() == numel, op, arg, "size ", w.numel(), " != ", heads, "*head_dim (",
                   numel, ")");
  api::check_dtype_in(w, {DType::kBFloat16}, op, arg);
  FLASHINFER_CHECK(w.is_contiguous(), op, arg, "must be contiguous");
  api::check_same_device(w, qkv, op, arg, "qkv");
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> fused_qk_rmsnorm_rope(
    const Tensor& qkv, const Tensor& q_weight, const Tensor& k_weight, int64_t ppf, int64_t pph,
    int64_t ppw, int64_t num_frame_channels, int64_t num_height_channels,
    int64_t num_width_channels, int64_t num_heads_q, int64_t num_heads_k, int64_t num_heads_v,
    int64_t head_dim, double eps, double base, bool interleave, double factor, double low,
    double high, double attention_factor, bool is_qk_norm, bool output_fp8,
    double output_quant_scale, double v_quant_scale, std::optional<Tensor> q_out,
    std::optional<Tensor> k_out, std::optional<Tensor> v_out) {
  return call_op<&fused_qk_rmsnorm_rope>(
      [&]() -> std::tuple<Tensor, Tensor, Tensor> {
        const char* op = "fused_qk_rmsnorm_rope";
        api::check_defined(qkv, op, "qkv");
        api::check_dtype_in(qkv, {DType::kBFloat16}, op, "qkv");
        FLASHINFER_CHECK(qkv.is_contiguous(), op, "qkv", "must be contiguous");
        api::check_dim(qkv, {2, 3}, op, "qkv");
        FLASHINFER_CHECK(head_dim == 64 || head_dim == 128 || head_dim == 256, op, "head_dim",
                         "must be 64, 128, or 256, got ", head_dim);
        FLASHINFER_CHECK(num_heads_q > 0, op, "num_heads_q", "must be positive, got ", num_heads_q);
        FLASHINFER_CHECK(num_heads_k > 0, op, "num_heads_k", "must be positive, got ", num_heads_k);
        FLASHINFER_CHECK(num_heads_v > 0, op, "num_heads_v", "must be positive, got ", num_heads_v);
        const int64_t max_heads = std::max({num_heads_q, num_heads_k, num_heads_v});
        FLASHINFER_CHECK(max_heads <= 32, op, "num_heads_q",
                         "max(num_heads_q, num_heads_k, num_heads_v) must be <= 32, got ",
                         max_heads);
        FLASHINFER_CHECK(
            num_frame_channels >= 0 && num_height_channels >= 0 && num_width_channels >= 0 &&
                num_frame_channels + num_height_channels + num_width_channels == head_dim,
            op, "num_frame_channels", "num_frame_channels (", num_frame_channels,
            ") + num_height_channels (", num_height_channels, ") + num_width_channels (",
            num_width_channels, ") must equal head_dim (", head_dim, ")");
        FLASHINFER_CHECK(num_frame_channels % 2 == 0 && num_height_channels % 2 == 0 &&
                             num_width_channels % 2 == 0,
                         op, "num_frame_channels",
                         "channel counts must all be even (the freq table uses count/2), got "
                         "frame=",
                         num_frame_channels, ", height=", num_height_channels,
                         ", width=", num_width_channels);
        FLASHINFER_CHECK(ppf > 0, op, "ppf", "must be positive, got ", ppf);
        FLASHINFER_CHECK(pph > 0, op, "pph", "must be positive, got ", pph);
        FLASHINFER_CHECK(ppw > 0, op, "ppw", "must be positive, got ", ppw);
        const int64_t seq_len = ppf * pph * ppw;
        int64_t tokens = 0;
        if (qkv.dim() == 3) {
          FLASHINFER_CHECK(qkv.size(1) == seq_len, op, "qkv", "seq_len (", qkv.size(1),
                           ") != ppf*pph*ppw (", seq_len, ")");
          tokens = qkv.size(0) * seq_len;
        } else {
          FLASHINFER_CHECK(qkv.size(0) % seq_len == 0, op, "qkv", "num_tokens (", qkv.size(0),
                           ") must be divisible by ppf*pph*ppw (", seq_len, ")");
          tokens = qkv.size(0);
        }
        FLASHINFER_CHECK(tokens > 0, op, "qkv", "has no tokens");
        const int64_t row = (num_heads_q + num_heads_k + num_heads_v) * head_dim;
        FLASHINFER_CHECK(qkv.size(-1) == row, op, "qkv", "last dimension ", qkv.size(-1),
                         " != (num_heads_q + num_heads_k + num_heads_v) * head_dim (", row, ")");
        check_weight(q_weight, num_heads_q * head_dim, qkv, op, "q_weight", "num_heads_q");
        check_weight(k_weight, num_heads_k * head_dim, qkv, op, "k_weight", "num_heads_k");
        // The kernel launcher aborts on this; an Error here.
        FLASHINFER_CHECK(factor != 1.0 || attention_factor == 1.0, op, "attention_factor",
                         "must be 1.0 when factor is 1.0, got ", attention_factor);
        const DType odt = output_fp8 ? DType::kFloat8E4M3FN : DType::kBFloat16;
        auto shape_of = [&](int64_t heads) {
          return qkv.dim() == 3 ? Shape{qkv.size(0), seq_len, heads, head_dim}
                                : Shape{tokens, heads, head_dim};
        };
        Tensor q = output(q_out, shape_of(num_heads_q), odt, qkv, op, "q_out");
        Tensor k = output(k_out, shape_of(num_heads_k), odt, qkv, op, "k_out");
        Tensor v = output(v_out, shape_of(num_heads_v), odt, qkv, op, "v_out");
        kernels::QkNormRopeParams p;
        p.qkv = static_cast<const uint16_t*>(qkv.data_ptr());
        p.q_weight = static_cast<const uint16_t*>(q_weight.data_ptr());
        p.k_weight = static_cast<const uint16_t*>(k_weight.data_ptr());
        p.q_out = q.data_ptr();
        p.k_out = k.data_ptr();
        p.v_out = v.data_ptr();
        p.tokens = tokens;
        p.seq_len = seq_len;
        p.pph = pph;
        p.ppw = ppw;
        p.frame_ch = num_frame_channels;
        p.height_ch = num_height_channels;
        p.width_ch = num_width_channels;
        p.hq = num_heads_q;
        p.hk = num_heads_k;
        p.hv = num_heads_v;
        p.d = head_dim;
        p.eps = static_cast<float>(eps);
        p.base = static_cast<float>(base);
        p.factor = static_cast<float>(factor);
        p.low = static_cast<float>(low);
        p.high = static_cast<float>(high);
        p.attention_factor = static_cast<float>(attention_factor);
        p.out_scale = static_cast<float>(output_quant_scale);
        p.v_scale = static_cast<float>(v_quant_scale);
        p.interleave = interleave;
        p.norm = is_qk_norm;
        p.fp8 = output_fp8;
        api::launch(kQkNormRopeKernels, p, qkv.device(), op, "qkv");
        return {q, k, v};
      },
      qkv, q_weight, k_weight, ppf, pph, ppw, num_frame_channels, num_height_channels,
      num_width_channels, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, base, interleave,
      factor, low, high, attention_factor, is_qk_norm, output_fp8, output_quant_scale,
      v_quant_scale, q_out, k_out, v_out);
}

namespace {

// Bench: WAN-like head split (D = 64 here, channels 22/20/22 as 2*(D/6) for height and width),
// 2 heads each, sequences of 2 x 4 x (m / 8) patches.
BenchCase bench_qk_norm_rope(const BenchShape& s, Device dev) {
  const int64_t d = 64, h = 2, ppf = 2, pph = 4, ppw = std::max<int64_t>(1, s.m / 8);
  const int64_t t = ppf * pph * ppw, row = 3 * h * d;
  Tensor qkv = api::bench::random_tensor({t, row}, DType::kBFloat16, dev, s.random_seed);
  Tensor qw =
      api::bench::random_tensor({h * d}, DType::kBFloat16, dev, s.random_seed + 1, 0.5, 1.5);
  Tensor kw =
      api::bench::random_tensor({h * d}, DType::kBFloat16, dev, s.random_seed + 2, 0.5, 1.5);
  BenchCase c =
      api::bench::invoke_case("fused_qk_rmsnorm_rope", {Value(qkv), Value(qw), Value(kw)},
                              {{"ppf", Value(ppf)},
                               {"pph", Value(pph)},
                               {"ppw", Value(ppw)},
                               {"num_frame_channels", Value(int64_t{24})},
                               {"num_height_channels", Value(int64_t{20})},
                               {"num_width_channels", Value(int64_t{20})},
                               {"num_heads_q", Value(h)},
                               {"num_heads_k", Value(h)},
                               {"num_heads_v", Value(h)},
                               {"head_dim", Value(d)},
                               // Written buffers given (as DiT callers preallocate them), so the
                               // written-argument checks have views to work on.
                               {"q_out", Value(Tensor::zeros({t, h, d}, DType::kBFloat16, dev))},
                               {"k_out", Value(Tensor::zeros({t, h, d}, DType::kBFloat16, dev))},
                               {"v_out", Value(Tensor::zeros({t, h, d}, DType::kBFloat16, dev))}});
  c.bytes = 2.0 * api::bench::nbytes({t, row}, DType::kBFloat16);
  return c;
}

}  // namespace

namespace detail {
void register_qk_norm_rope_ops(OpRegistry& r) {
  declare<&fused_qk_rmsnorm_rope>(
      r,
      {.name = "fused_qk_rmsnorm_rope",
       .module = "flashinfer.norm",
       .summary = "DiT QK RMSNorm across heads + 3D (frame/height/width) RoPE + V copy"},
      "qkv", "q_weight", "k_weight", arg("ppf").kw(), arg("pph").kw(), arg("ppw").kw(),
      arg("num_frame_channels").kw(), arg("num_height_channels").kw(),
      arg("num_width_channels").kw(), arg("num_heads_q").kw(), arg("num_heads_k").kw(),
      arg("num_heads_v").kw(), arg("head_dim").kw(), arg("eps", 1e-6).kw(),
      arg("base", 10000.0).kw(), arg("interleave", true).kw(), arg("factor", 1.0).kw(),
      arg("low", 0.0).kw(), arg("high", 0.0).kw(), arg("attention_factor", 1.0).kw(),
      arg("is_qk_norm", true).kw(), arg("output_fp8", false).kw(),
      arg("output_quant_scale", 1.0).kw(), arg("v_quant_scale", 1.0).kw(), arg("q_out").mut().kw(),
      arg("k_out").mut().kw(), arg("v_out").mut().kw());
  api::register_backends("fused_qk_rmsnorm_rope", kQkNormRopeKernels);
  register_bench_hook("fused_qk_rmsnorm_rope", bench_qk_norm_rope);
}
}  // namespace detail

}  // namespace flashinfer
