// flashinfer.mhc: mhc_post, mhc_pre_big_fuse, mhc_pre_big_fuse_with_prenorm. Upstream's checks
// and messages, flattening to tokens, dispatch, bench hooks. The arithmetic is
// kernels/mhc_rules.h's (docs/NORM_ACTIVATION_ROPE.md, "Hyper-connections").
#include "flashinfer/ops/mhc.h"

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/mhc_cpu.h"
#include "kernels/mhc_params.h"

#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/mhc_cuda.h"
#endif

namespace flashinfer {
namespace {

using kernels::MhcPostParams;
using kernels::MhcPreParams;

constexpr const char* kMhcModule = "flashinfer.mhc";
constexpr int64_t kHc = 4, kMix = 24;

constexpr api::KernelEntry<MhcPostParams> kMhcPostKernels[] = {
    {DeviceType::kCPU, "CPU reference: per element, the kernel's multiply-add order", nullptr,
     [](const MhcPostParams& p, const api::LaunchContext&) { kernels::cpu::mhc_post(p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: a thread per 8 hidden elements of a token, 128-bit access",
     nullptr,
     [](const MhcPostParams& p, const api::LaunchContext& c) {
       kernels::cuda::mhc_post(p, c.stream, c.enable_pdl);
     }},
#endif
};

constexpr api::KernelEntry<MhcPreParams> kMhcPreKernels[] = {
    {DeviceType::kCPU, "CPU reference: per token, Sinkhorn in fp32", nullptr,
     [](const MhcPreParams& p, const api::LaunchContext&) { kernels::cpu::mhc_pre_big_fuse(p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: a block per token, layer_input over 128-bit vectors", nullptr,
     [](const MhcPreParams& p, const api::LaunchContext& c) {
       kernels::cuda::mhc_pre_big_fuse(p, c.stream, c.enable_pdl);
     }},
#endif
};

std::string_view mhc_tname(const Tensor& t) { return dtype_torch_name(t.dtype()); }

Shape concat(const Shape& a, std::initializer_list<int64_t> b) {
  Shape r = a;
  r.insert(r.end(), b.begin(), b.end());
  return r;
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

void check_dtype_is(const Tensor& t, DType want, const char* op, const char* arg) {
  FLASHINFER_CHECK(t.dtype() == want, op, arg, arg, " must be ", dtype_torch_name(want), ", got ",
                   mhc_tname(t));
}

// The residual [..., 4, H] (bf16): its outer shape and H.
Shape check_residual(const Tensor& residual, const char* op, bool need_h8) {
  api::check_defined(residual, op, "residual");
  check_dtype_is(residual, DType::kBFloat16, op, "residual");
  FLASHINFER_CHECK(residual.dim() >= 3, op, "residual", "residual must have shape [..., 4, H]");
  FLASHINFER_CHECK(residual.size(-2) == kHc, op, "residual",
                   "residual.shape[-2] / HC must be 4, got ", residual.size(-2));
  FLASHINFER_CHECK(residual.size(-1) > 0, op, "residual", "hidden size must be positive");
  FLASHINFER_CHECK(!need_h8 || residual.size(-1) % 8 == 0, op, "residual",
                   "hidden size must be divisible by 8");
  return Shape(residual.shape().begin(), residual.shape().end() - 2);
}

Tensor mhc_post_impl(const Tensor& x, const Tensor& residual, const Tensor& post,
                     const Tensor& comb) {
  const char* op = "mhc_post";
  const Shape outer = check_residual(residual, op, false);
  const int64_t H = residual.size(-1), T = numel_of(outer);
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{x, "x"},
                                {post, "post_layer_mix"},
                                {comb, "comb_res_mix"}}) {
    api::check_defined(t, op, name);
    api::check_same_device(t, residual, op, name, "residual");
  }
  check_dtype_is(x, DType::kBFloat16, op, "x");
  check_dtype_is(post, DType::kFloat32, op, "post_layer_mix");
  check_dtype_is(comb, DType::kFloat32, op, "comb_res_mix");
  FLASHINFER_CHECK(x.shape() == concat(outer, {H}), op, "x", "x shape must be ",
                   shape_to_string(concat(outer, {H})), ", got ", shape_to_string(x.shape()));
  FLASHINFER_CHECK(post.shape() == concat(outer, {kHc}) || post.shape() == concat(outer, {kHc, 1}),
                   op, "post_layer_mix",
                   "post_layer_mix shape must be [..., 4] or [..., 4, 1], got ",
                   shape_to_string(post.shape()));
  FLASHINFER_CHECK(comb.shape() == concat(outer, {kHc, kHc}), op, "comb_res_mix",
                   "comb_res_mix shape must be ", shape_to_string(concat(outer, {kHc, kHc})),
                   ", got ", shape_to_string(comb.shape()));
  // Upstream reshapes to tokens and makes each input contiguous (a copy where it is not).
  const Tensor xc = x.reshape({T, H}).contiguous();
  const Tensor rc = residual.reshape({T, kHc, H}).contiguous();
  const Tensor pc = post.reshape({T, kHc}).contiguous();
  const Tensor cc = comb.reshape({T, kHc, kHc}).contiguous();
  Tensor out = Tensor::empty(residual.shape(), DType::kBFloat16, residual.device());
  MhcPostParams p;
  p.T = T, p.H = H;
  p.x = xc.data_ptr();
  p.residual = rc.data_ptr();
  p.post = pc.data<float>();
  p.comb = cc.data<float>();
  p.out = out.data_ptr();
  api::launch(kMhcPostKernels, p, residual.device(), op, "residual");
  return out;
}

void check_mhc_scalars(const char* op, double rms_eps, double pre_eps, double sk_eps,
                       int64_t repeat) {
  FLASHINFER_CHECK(repeat >= 1, op, "sinkhorn_repeat", "sinkhorn_repeat must be >= 1");
  for (const auto& [v, name] : {std::pair<double, const char*>{rms_eps, "rms_eps"},
                                {pre_eps, "mhc_pre_eps"},
                                {sk_eps, "mhc_sinkhorn_eps"}}) {
    FLASHINFER_CHECK(v > 0.0, op, name, name, " must be strictly positive, got ", v);
  }
}

// Shared by both pre ops: scale / base checks, outputs, parameters. dot_mix / sqrsum are the
// already-checked [S, T, 24] / [S, T] views (sqrsum undefined for prenorm).
std::tuple<Tensor, Tensor, Tensor> mhc_pre_run(const char* op, const Tensor& dot_mix,
                                               const Tensor* sqrsum, const Tensor& residual,
                                               const Shape& outer, const Tensor& scale,
                                               const Tensor& base, double k, double rms_eps,
                                               double pre_eps, double sk_eps, double post_mult,
                                               int64_t repeat, int64_t splits) {
  const int64_t H = residual.size(-1), T = numel_of(outer);
  for (const auto& [t, name] :
       {std::pair<const Tensor&, const char*>{scale, "mhc_scale"}, {base, "mhc_base"}}) {
    api::check_defined(t, op, name);
    api::check_same_device(t, residual, op, name, "residual");
    check_dtype_is(t, DType::kFloat32, op, name);
  }
  FLASHINFER_CHECK(scale.shape() == Shape{3}, op, "mhc_scale", "mhc_scale shape must be (3,), got ",
                   shape_to_string(scale.shape()));
  FLASHINFER_CHECK(base.shape() == Shape{kMix}, op, "mhc_base",
                   "mhc_base shape must be (24,), got ", shape_to_string(base.shape()));
  const Tensor dm = dot_mix.reshape({splits, T, kMix}).contiguous();
  Tensor sq;
  if (sqrsum) sq = sqrsum->reshape({splits, T}).contiguous();
  const Tensor rc = residual.reshape({T, kHc, H}).contiguous();
  const Tensor sc = scale.contiguous(), bc = base.contiguous();
  Tensor post = Tensor::empty(concat(outer, {kHc, 1}), DType::kFloat32, residual.device());
  Tensor comb = Tensor::empty(concat(outer, {kHc, kHc}), DType::kFloat32, residual.device());
  Tensor layer_input = Tensor::empty(concat(outer, {H}), DType::kBFloat16, residual.device());
  MhcPreParams p;
  p.T = T, p.H = H, p.num_splits = splits;
  p.dot_mix = dm.data<float>();
  p.sqrsum = sqrsum ? sq.data<float>() : nullptr;
  p.residual = rc.data_ptr();
  p.scale = sc.data<float>();
  p.base = bc.data<float>();
  p.k = static_cast<float>(k);
  p.rms_eps = static_cast<float>(rms_eps);
  p.pre_eps = static_cast<float>(pre_eps);
  p.sinkhorn_eps = static_cast<float>(sk_eps);
  p.post_mult = static_cast<float>(post_mult);
  p.sinkhorn_repeat = static_cast<int>(std::min<int64_t>(repeat, 1 << 20));
  p.post_mix = post.data<float>();
  p.comb_mix = comb.data<float>();
  p.layer_input = layer_input.data_ptr();
  api::launch(kMhcPreKernels, p, residual.device(), op, "residual");
  return {post, comb, layer_input};
}

void check_mix_input(const Tensor& t, const Tensor& residual, const char* op, const char* name) {
  api::check_defined(t, op, name);
  api::check_same_device(t, residual, op, name, "residual");
  check_dtype_is(t, DType::kFloat32, op, name);
}

std::tuple<Tensor, Tensor, Tensor> mhc_pre_impl(const Tensor& dot_mix, const Tensor& sqrsum,
                                                const Tensor& residual, const Tensor& scale,
                                                const Tensor& base, int64_t k, double rms_eps,
                                                double pre_eps, double sk_eps, double post_mult,
                                                int64_t repeat, int64_t splits) {
  const char* op = "mhc_pre_big_fuse";
  FLASHINFER_CHECK(splits == 1 || splits == 2 || splits == 4 || splits == 8 || splits == 16, op,
                   "num_splits", "num_splits must be one of {1, 2, 4, 8, 16}");
  FLASHINFER_CHECK(k > 0, op, "k", "k must be positive");
  check_mhc_scalars(op, rms_eps, pre_eps, sk_eps, repeat);
  const Shape outer = check_residual(residual, op, true);
  check_mix_input(dot_mix, residual, op, "dot_mix");
  check_mix_input(sqrsum, residual, op, "sqrsum");
  const Shape lead = splits > 1 ? Shape{splits} : Shape{};  // num_splits 1: no split dimension
  Shape want_dm = lead, want_sq = lead;
  want_dm.insert(want_dm.end(), outer.begin(), outer.end());
  want_dm.push_back(kMix);
  want_sq.insert(want_sq.end(), outer.begin(), outer.end());
  FLASHINFER_CHECK(dot_mix.shape() == want_dm, op, "dot_mix", "dot_mix shape must be ",
                   shape_to_string(want_dm), ", got ", shape_to_string(dot_mix.shape()));
  FLASHINFER_CHECK(sqrsum.shape() == want_sq, op, "sqrsum", "sqrsum shape must be ",
                   shape_to_string(want_sq), ", got ", shape_to_string(sqrsum.shape()));
  return mhc_pre_run(op, dot_mix, &sqrsum, residual, outer, scale, base, static_cast<double>(k),
                     rms_eps, pre_eps, sk_eps, post_mult, repeat, splits);
}

std::tuple<Tensor, Tensor, Tensor> mhc_prenorm_impl(const Tensor& dot_mix, const Tensor& residual,
                                                    const Tensor& scale, const Tensor& base,
                                                    double rms_eps, double pre_eps, double sk_eps,
                                                    double post_mult, int64_t repeat) {
  const char* op = "mhc_pre_big_fuse_with_prenorm";
  check_mhc_scalars(op, rms_eps, pre_eps, sk_eps, repeat);
  const Shape outer = check_residual(residual, op, true);
  check_mix_input(dot_mix, residual, op, "dot_mix");
  const Shape want = concat(outer, {kMix});
  Shape want1{1};  // a leading split dimension of 1 is taken here
  want1.insert(want1.end(), want.begin(), want.end());
  FLASHINFER_CHECK(dot_mix.shape() == want || dot_mix.shape() == want1, op, "dot_mix",
                   "dot_mix shape must be ", shape_to_string(want), " or ", shape_to_string(want1),
                   ", got ", shape_to_string(dot_mix.shape()));
  const double k = static_cast<double>(kHc * residual.size(-1));
  return mhc_pre_run(op, dot_mix, nullptr, residual, outer, scale, base, k, rms_eps, pre_eps,
                     sk_eps, post_mult, repeat, 1);
}

}  // namespace

Tensor mhc_post(const Tensor& x, const Tensor& residual, const Tensor& post_layer_mix,
                const Tensor& comb_res_mix) {
  return call_op<&mhc_post>(
      [&] { return mhc_post_impl(x, residual, post_layer_mix, comb_res_mix); }, x, residual,
      post_layer_mix, comb_res_mix);
}

std::tuple<Tensor, Tensor, Tensor> mhc_pre_big_fuse(
    const Tensor& dot_mix, const Tensor& sqrsum, const Tensor& residual, const Tensor& mhc_scale,
    const Tensor& mhc_base, int64_t k, double rms_eps, double mhc_pre_eps, double mhc_sinkhorn_eps,
    double mhc_post_mult_value, int64_t sinkhorn_repeat, int64_t num_splits, int64_t block_size) {
  return call_op<&mhc_pre_big_fuse>(
      [&] {
        return mhc_pre_impl(dot_mix, sqrsum, residual, mhc_scale, mhc_base, k, rms_eps, mhc_pre_eps,
                            mhc_sinkhorn_eps, mhc_post_mult_value, sinkhorn_repeat, num_splits);
      },
      dot_mix, sqrsum, residual, mhc_scale, mhc_base, k, rms_eps, mhc_pre_eps, mhc_sinkhorn_eps,
      mhc_post_mult_value, sinkhorn_repeat, num_splits, block_size);
}

std::tuple<Tensor, Tensor, Tensor> mhc_pre_big_fuse_with_prenorm(
    const Tensor& dot_mix, const Tensor& residual, const Tensor& mhc_scale, const Tensor& mhc_base,
    double rms_eps, double mhc_pre_eps, double mhc_sinkhorn_eps, double mhc_post_mult_value,
    int64_t sinkhorn_repeat, int64_t block_size) {
  return call_op<&mhc_pre_big_fuse_with_prenorm>(
      [&] {
        return mhc_prenorm_impl(dot_mix, residual, mhc_scale, mhc_base, rms_eps, mhc_pre_eps,
                                mhc_sinkhorn_eps, mhc_post_mult_value, sinkhorn_repeat);
      },
      dot_mix, residual, mhc_scale, mhc_base, rms_eps, mhc_pre_eps, mhc_sinkhorn_eps,
      mhc_post_mult_value, sinkhorn_repeat, block_size);
}

namespace {

// Bench hooks: batch_size * s_qo tokens of hidden size hidden_size, upstream's test inputs
// (residual ~ 0.01 scale, mixes ~ randn).
int64_t bench_tokens(const BenchShape& s) {
  return std::max<int64_t>(1, s.batch_size * std::max<int64_t>(1, s.s_qo));
}

BenchCase bench_mhc_post(const BenchShape& s, Device dev) {
  const int64_t T = bench_tokens(s), H = s.hidden_size;
  using api::bench::random_tensor;
  BenchCase c = api::bench::invoke_case(
      "mhc_post", {Value(random_tensor({T, H}, DType::kBFloat16, dev, s.random_seed)),
                   Value(random_tensor({T, kHc, H}, DType::kBFloat16, dev, s.random_seed + 1)),
                   Value(random_tensor({T, kHc}, DType::kFloat32, dev, s.random_seed + 2)),
                   Value(random_tensor({T, kHc, kHc}, DType::kFloat32, dev, s.random_seed + 3))});
  c.bytes = static_cast<double>(T * H) * 2.0 * (1 + 2 * kHc) +
            static_cast<double>(T * (kHc + kHc * kHc)) * 4.0;
  c.flops = static_cast<double>(T * H * kHc) * 2.0 * (1 + kHc);
  return c;
}

BenchCase bench_mhc_pre(const BenchShape& s, Device dev) {
  const int64_t T = bench_tokens(s), H = (s.hidden_size + 7) / 8 * 8;
  using api::bench::random_tensor;
  BenchCase c = api::bench::invoke_case(
      "mhc_pre_big_fuse",
      {Value(random_tensor({T, kMix}, DType::kFloat32, dev, s.random_seed, -0.02, 0.02)),
       Value(random_tensor({T}, DType::kFloat32, dev, s.random_seed + 1, 0.0,
                           static_cast<double>(kHc * H))),
       Value(random_tensor({T, kHc, H}, DType::kBFloat16, dev, s.random_seed + 2, -0.02, 0.02)),
       Value(random_tensor({3}, DType::kFloat32, dev, s.random_seed + 3, -0.1, 0.1)),
       Value(random_tensor({kMix}, DType::kFloat32, dev, s.random_seed + 4, -0.1, 0.1)),
       Value(kHc * H)});
  c.bytes = static_cast<double>(T * H) * 2.0 * (kHc + 1) + static_cast<double>(T * 45) * 4.0;
  c.flops = static_cast<double>(T * H * kHc) * 2.0;
  return c;
}

BenchCase bench_mhc_prenorm(const BenchShape& s, Device dev) {
  const int64_t T = bench_tokens(s), H = (s.hidden_size + 7) / 8 * 8;
  using api::bench::random_tensor;
  BenchCase c = api::bench::invoke_case(
      "mhc_pre_big_fuse_with_prenorm",
      {Value(random_tensor({T, kMix}, DType::kFloat32, dev, s.random_seed, -0.02, 0.02)),
       Value(random_tensor({T, kHc, H}, DType::kBFloat16, dev, s.random_seed + 2, -0.02, 0.02)),
       Value(random_tensor({3}, DType::kFloat32, dev, s.random_seed + 3, -0.1, 0.1)),
       Value(random_tensor({kMix}, DType::kFloat32, dev, s.random_seed + 4, -0.1, 0.1))});
  c.bytes = static_cast<double>(T * H) * 2.0 * (kHc + 1) + static_cast<double>(T * 44) * 4.0;
  c.flops = static_cast<double>(T * H * kHc) * 4.0;
  return c;
}

}  // namespace

namespace detail {

void register_mhc_ops(OpRegistry& r) {
  declare<&mhc_post>(r,
                     {.name = "mhc_post",
                      .module = kMhcModule,
                      .summary = "Hyper-connection residual update after a layer (HC = 4 streams)"},
                     "x", "residual", "post_layer_mix", "comb_res_mix");
  declare<&mhc_pre_big_fuse>(
      r,
      {.name = "mhc_pre_big_fuse",
       .module = kMhcModule,
       .summary = "Hyper-connection mixes (pre, post, Sinkhorn comb) and the layer input"},
      "dot_mix", "sqrsum", "residual", "mhc_scale", "mhc_base", "k", arg("rms_eps", 1e-6),
      arg("mhc_pre_eps", 1e-6), arg("mhc_sinkhorn_eps", 1e-6), arg("mhc_post_mult_value", 1.0),
      arg("sinkhorn_repeat", int64_t{20}), arg("num_splits", int64_t{1}),
      arg("block_size", int64_t{0}));
  declare<&mhc_pre_big_fuse_with_prenorm>(
      r,
      {.name = "mhc_pre_big_fuse_with_prenorm",
       .module = kMhcModule,
       .summary = "mhc_pre_big_fuse with the residual's sum of squares taken in the kernel"},
      "dot_mix", "residual", "mhc_scale", "mhc_base", arg("rms_eps", 1e-6),
      arg("mhc_pre_eps", 1e-6), arg("mhc_sinkhorn_eps", 1e-6), arg("mhc_post_mult_value", 1.0),
      arg("sinkhorn_repeat", int64_t{20}), arg("block_size", int64_t{0}));
  api::register_backends("mhc_post", kMhcPostKernels);
  api::register_backends("mhc_pre_big_fuse", kMhcPreKernels);
  api::register_backends("mhc_pre_big_fuse_with_prenorm", kMhcPreKernels);
  register_bench_hook("mhc_post", bench_mhc_post);
  register_bench_hook("mhc_pre_big_fuse", bench_mhc_pre);
  register_bench_hook("mhc_pre_big_fuse_with_prenorm", bench_mhc_prenorm);
}

}  // namespace detail

}  // namespace flashinfer
