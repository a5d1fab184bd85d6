// flashinfer.fused_moe.monomoe: has_monomoe, get_scratchpad_size_bytes, alloc_scratchpad,
// interleave_for_tma_wgmma_up and mono_moe, with upstream's checks and messages in its order
// (docs/upstream-facts/monomoe.md), dispatch and the bench hook (docs/MOE.md, "MonoMoE").
#include "flashinfer/ops/monomoe.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/device_props.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/monomoe_cpu.h"
#include "kernels/monomoe_params.h"

#if FLASHINFER_WITH_CUDA
#include "core/cuda_runtime.h"
#include "flashinfer/stream.h"
#include "kernels/cuda/monomoe_cuda.h"
#include "kernels/cuda/stream_scratch.h"
#endif

namespace flashinfer {
namespace {

using kernels::MonoMoeParams;
using P = MonoMoeParams;
constexpr const char* kOp = "mono_moe";
constexpr const char* kModule = "flashinfer.fused_moe.monomoe";

constexpr api::KernelEntry<MonoMoeParams> kMonoMoeKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: routing, 1x128 input quantization, exact fp8 block dot products, fixed "
     "combine order",
     nullptr, [](const MonoMoeParams& p, const api::LaunchContext&) { kernels::cpu::mono_moe(p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernels: routing + quantization, up projection per (expert, group), down projection "
     "and combine per column stripe",
     nullptr,
     [](const MonoMoeParams& p, const api::LaunchContext& c) {
       kernels::cuda::mono_moe(p, c.stream);
     }},
#endif
};

std::string dims(const Tensor& t) { return shape_to_string(t.shape()); }

// upstream's _check_shapes, its checks and texts in its order.
void check_shapes(const Tensor& x, const Tensor& logits, const Tensor& wu, const Tensor& su,
                  const Tensor& wd, const Tensor& sd) {
  FLASHINFER_CHECK(x.dim() == 2, kOp, "activations_in", "activations_in must be [M, K], got ",
                   x.dim(), "D");
  FLASHINFER_CHECK(wd.dim() == 3, kOp, "expert_weights_down",
                   "expert_weights_down must be [E, K, N], got ", wd.dim(), "D");
  FLASHINFER_CHECK(wu.dim() == 3, kOp, "expert_weights_up",
                   "expert_weights_up must be [E, 2*N, K], got ", wu.dim(), "D");
  const int64_t E = wd.size(0), K = wd.size(1), N = wd.size(2);
  FLASHINFER_CHECK(E == P::kE && N == P::kN && K == P::kK, kOp, "expert_weights_down",
                   "monomoe: unsupported shape (E=", E, ", N=", N, ", K=", K,
                   "). This kernel is hard-specialized to E=256, N=512, K=2048 only.");
  const int64_t M = x.size(0);
  FLASHINFER_CHECK(M <= P::kMaxTokens, kOp, "activations_in",
                   "this kernel caps tokens at 8; got M=", M);
  FLASHINFER_CHECK(x.size(1) == P::kK, kOp, "activations_in", "activations K must be 2048, got ",
                   x.size(1));
  FLASHINFER_CHECK(logits.shape() == Shape({M, P::kE}), kOp, "router_logits",
                   "router_logits must be [", M, ", 256], got ", dims(logits));
  FLASHINFER_CHECK(wu.shape() == Shape({P::kE, 2 * P::kN, P::kK}), kOp, "expert_weights_up",
                   "expert_weights_up must be [256, 1024, 2048], got ", dims(wu));
  FLASHINFER_CHECK(su.shape() == Shape({P::kE, 2 * P::kN / P::kBlock, P::kKBlocks}), kOp,
                   "expert_scales_up", "expert_scales_up must be [256, 8, 16], got ", dims(su));
  FLASHINFER_CHECK(sd.shape() == Shape({P::kE, P::kK / P::kBlock, P::kNBlocks}), kOp,
                   "expert_scales_down", "expert_scales_down must be [256, 16, 4], got ", dims(sd));
}

// The launcher's checks (upstream's monomoe_wrapper): every tensor on activations_in's device
// and contiguous first, then each one's dtype.
void check_layout(const Tensor& t, const Tensor& x, const char* arg) {
  api::check_same_device(t, x, kOp, arg, "activations_in");
  FLASHINFER_CHECK(t.is_contiguous(), kOp, arg, arg, " must be contiguous");
}
void check_dtype(const Tensor& t, const char* arg, DType want) {
  FLASHINFER_CHECK(t.dtype() == want, kOp, arg, "Inconsistency of Tensor type: ", arg, " (",
                   dtype_torch_name(t.dtype()), ", expected ", dtype_torch_name(want), ")");
}

// Our CUDA kernels read 4 to 16 bytes at a time: a tensor whose data is not 16-byte aligned (a
// view at an odd offset) is copied.
Tensor aligned(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 ? t : t.clone();
}

Tensor mono_moe_impl(const Tensor& x, const Tensor& logits, const Tensor& wu, const Tensor& su,
                     const Tensor& wd, const Tensor& sd, int64_t top_k,
                     const std::string& scoring_func, bool renormalize, std::optional<Tensor> out,
                     std::optional<Tensor> scratchpad, bool interleave_up) {
  api::check_upstream_arch(kOp, "activations_in", x.device());
  check_shapes(x, logits, wu, su, wd, sd);
  FLASHINFER_CHECK(top_k >= 1 && top_k <= P::kMaxTopK, kOp, "top_k",
                   "top_k must be in [1, 8], got ", top_k);
  FLASHINFER_CHECK(scoring_func == "sigmoid" || scoring_func == "softmax", kOp, "scoring_func",
                   "scoring_func must be 'sigmoid' or 'softmax', got '", scoring_func, "'");
  const int64_t M = x.size(0);
  FLASHINFER_CHECK(M >= 1, kOp, "activations_in", "monomoe_topk: token count M=", M,
                   " out of range for E=256, N=512, K=2048 (supported 1 <= M <= 8).");
  const bool has_out = out && out->defined(), has_scratch = scratchpad && scratchpad->defined();
  const std::pair<const Tensor*, const char*> all[] = {
      {&x, "activations_in"},
      {&logits, "router_logits"},
      {&wu, "expert_weights_up"},
      {&su, "expert_scales_up"},
      {&wd, "expert_weights_down"},
      {&sd, "expert_scales_down"},
      {has_out ? &*out : nullptr, "out"},
      {has_scratch ? &*scratchpad : nullptr, "scratchpad"}};
  for (const auto& [t, arg] : all) {
    if (t) check_layout(*t, x, arg);
  }
  check_dtype(x, "activations_in", DType::kBFloat16);
  check_dtype(logits, "router_logits", DType::kBFloat16);
  check_dtype(wu, "expert_weights_up", DType::kFloat8E4M3FN);
  check_dtype(su, "expert_scales_up", DType::kFloat32);
  check_dtype(wd, "expert_weights_down", DType::kFloat8E4M3FN);
  check_dtype(sd, "expert_scales_down", DType::kFloat32);
  Tensor o;
  if (has_out) {
    check_dtype(*out, "out", DType::kBFloat16);
    // Upstream does not check out's shape (its kernel writes M rows of 2048): ours must fit.
    FLASHINFER_CHECK(out->shape() == Shape({M, P::kK}), kOp, "out", "out must be [", M,
                     ", 2048], got ", dims(*out));
    o = *out;
  } else {
    o = Tensor::empty({M, P::kK}, DType::kBFloat16, x.device());
  }
  Tensor scratch;
#if FLASHINFER_WITH_CUDA
  std::optional<kernels::cuda::StreamScratch> lease;  // held until the kernels are queued
#endif
  if (x.device().is_cuda()) {  // the CPU reference needs no scratchpad
    if (has_scratch) {
      FLASHINFER_CHECK(
          static_cast<int64_t>(scratchpad->nbytes()) >= kernels::MonoMoeScratch::kBytes, kOp,
          "scratchpad", "scratchpad holds ", scratchpad->nbytes(), " bytes; the kernels need ",
          kernels::MonoMoeScratch::kBytes, " (alloc_scratchpad gives ",
          kernels::kMonoMoeUpstreamScratchBytes, ")");
      scratch = aligned(*scratchpad);
    } else {
#if FLASHINFER_WITH_CUDA
      // The stream's scratch, zeroed on the stream (upstream allocates a zeroed scratchpad): a
      // temporary tensor would be freed at return, which a CUDA graph capturing the call refuses.
      static kernels::cuda::StreamScratchPool pool("MonoMoE scratchpad", "scratchpad");
      const auto bytes = static_cast<std::size_t>(kernels::kMonoMoeUpstreamScratchBytes);
      lease = pool.acquire(kOp, x.device().index, current_cuda_stream(), bytes);
      detail::cuda_memset_async(lease->data(), 0, bytes, x.device().index);
      scratch = Tensor::from_blob(lease->data(), {kernels::kMonoMoeUpstreamScratchBytes}, {1},
                                  DType::kUInt8, x.device());
#endif
    }
  }
  const bool cuda = x.device().is_cuda();
  const Tensor xa = cuda ? aligned(x) : x, la = cuda ? aligned(logits) : logits;
  const Tensor wua = cuda ? aligned(wu) : wu, wda = cuda ? aligned(wd) : wd;
  const Tensor oa = cuda ? aligned(o) : o;
  MonoMoeParams p;
  p.M = M;
  p.top_k = top_k;
  p.softmax = scoring_func == "softmax";
  p.renormalize = renormalize;
  // interleave_up=True: upstream permutes the rows for its TMA loads; ours read the original
  // rows directly, which is the same product. interleave_up=False: the rows are in the pair
  // layout already.
  p.up_interleaved = !interleave_up;
  p.x = xa.data<uint16_t>();
  p.logits = la.data<uint16_t>();
  p.w_up = static_cast<const uint8_t*>(wua.data_ptr());
  p.s_up = su.data<float>();
  p.w_down = static_cast<const uint8_t*>(wda.data_ptr());
  p.s_down = sd.data<float>();
  p.out = static_cast<uint16_t*>(oa.data_ptr());
  if (cuda) p.scratch = static_cast<uint8_t*>(scratch.data_ptr());
  api::launch(kMonoMoeKernels, p, x.device(), kOp, "activations_in");
  if (oa.data_ptr() != o.data_ptr()) o.copy_(oa);
  if (scratch.defined() && scratchpad && scratchpad->defined() &&
      scratch.data_ptr() != scratchpad->data_ptr()) {
    scratchpad->copy_(scratch);
  }
  return o;
}

}  // namespace

bool has_monomoe() {
  return call_op<&has_monomoe>([] { return true; });
}

int64_t get_scratchpad_size_bytes() {
  return call_op<&get_scratchpad_size_bytes>([] { return kernels::kMonoMoeUpstreamScratchBytes; });
}

Tensor alloc_scratchpad(const std::optional<Value>& device) {
  return call_op<&alloc_scratchpad>(
      [&] {
        return Tensor::zeros({kernels::kMonoMoeUpstreamScratchBytes}, DType::kUInt8,
                             api::device_arg(device, "alloc_scratchpad"));
      },
      device);
}

Tensor interleave_for_tma_wgmma_up(const Tensor& w_fp8) {
  return call_op<&interleave_for_tma_wgmma_up>(
      [&] {
        constexpr const char* op = "interleave_for_tma_wgmma_up";
        FLASHINFER_CHECK(w_fp8.dim() == 3, op, "w_fp8", "expected [E, 2*N, K], got ", dims(w_fp8));
        const int64_t rows = w_fp8.size(1);
        FLASHINFER_CHECK(rows % 2 == 0, op, "w_fp8", "expected rows = 2*N, got rows=", rows);
        const int64_t n = rows / 2;
        FLASHINFER_CHECK(n % 64 == 0, op, "w_fp8",
                         "N (half of rows) must be a multiple of 64; got N=", n);
        // Rows move in 8-row chunks: view [E, 2, N / 8, 8, K] (h, chunk, row), transpose h and
        // chunk, and lay the result out contiguously.
        const int64_t E = w_fp8.size(0), K = w_fp8.size(2);
        return w_fp8.contiguous()
            .view({E, 2, n / 8, 8, K})
            .transpose(1, 2)
            .contiguous()
            .view({E, rows, K});
      },
      w_fp8);
}

Tensor mono_moe(const Tensor& activations_in, const Tensor& router_logits,
                const Tensor& expert_weights_up, const Tensor& expert_scales_up,
                const Tensor& expert_weights_down, const Tensor& expert_scales_down, int64_t top_k,
                std::string scoring_func, bool renormalize, std::optional<Tensor> out,
                std::optional<Tensor> scratchpad, bool interleave_up) {
  return call_op<&mono_moe>(
      [&] {
        return mono_moe_impl(activations_in, router_logits, expert_weights_up, expert_scales_up,
                             expert_weights_down, expert_scales_down, top_k, scoring_func,
                             renormalize, out, scratchpad, interleave_up);
      },
      activations_in, router_logits, expert_weights_up, expert_scales_up, expert_weights_down,
      expert_scales_down, top_k, scoring_func, renormalize, out, scratchpad, interleave_up);
}

namespace {

// Bench: M = batch_size (1-8) tokens, top_k (1-8), softmax; the logits favour a known set of
// experts (token t: (37 (t top_k + k) + 11) mod 256, distinct), whose weights are random e4m3
// codes of magnitude <= 1.875 and scales near 0.01; the other experts' weights stay zero (they
// are never read: a decode step reads only its chosen experts).
BenchCase bench_mono_moe(const BenchShape& s, Device dev) {
  const int64_t M = std::clamp<int64_t>(s.batch_size, 1, P::kMaxTokens);
  const int64_t top_k = std::clamp<int64_t>(s.top_k, 1, P::kMaxTopK);
  std::vector<float> lg(M * P::kE);
  uint64_t r = s.random_seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&r] {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    return r;
  };
  for (auto& v : lg) v = static_cast<float>(next() % 1000) / 1000.0f - 0.5f;
  std::vector<bool> chosen(P::kE, false);
  for (int64_t t = 0; t < M; ++t) {
    for (int64_t k = 0; k < top_k; ++k) {
      const int64_t e = (37 * (t * top_k + k) + 11) % P::kE;
      lg[t * P::kE + e] = 4.0f + static_cast<float>(k) * 0.25f;
      chosen[e] = true;
    }
  }
  Tensor wu = Tensor::zeros({P::kE, 2 * P::kN, P::kK}, DType::kFloat8E4M3FN);
  Tensor wd = Tensor::zeros({P::kE, P::kK, P::kN}, DType::kFloat8E4M3FN);
  Tensor su = Tensor::empty({P::kE, 2 * P::kN / P::kBlock, P::kKBlocks}, DType::kFloat32);
  Tensor sd = Tensor::empty({P::kE, P::kK / P::kBlock, P::kNBlocks}, DType::kFloat32);
  const int64_t per_up = 2 * P::kN * P::kK, per_down = P::kK * P::kN;
  auto* wup = static_cast<uint8_t*>(wu.data_ptr());
  auto* wdp = static_cast<uint8_t*>(wd.data_ptr());
  auto code = [&next] {
    const uint64_t v = next();
    return static_cast<uint8_t>((v & 0x3F) | ((v >> 8) & 0x80));
  };
  for (int64_t e = 0; e < P::kE; ++e) {
    if (!chosen[e]) continue;
    for (int64_t i = 0; i < per_up; ++i) wup[e * per_up + i] = code();
    for (int64_t i = 0; i < per_down; ++i) wdp[e * per_down + i] = code();
  }
  for (int64_t i = 0; i < su.numel(); ++i) su.data<float>()[i] = 0.005f + 0.0001f * (next() % 100);
  for (int64_t i = 0; i < sd.numel(); ++i) sd.data<float>()[i] = 0.005f + 0.0001f * (next() % 100);
  Tensor logits = Tensor::empty({M, P::kE}, DType::kFloat32);
  std::copy(lg.begin(), lg.end(), logits.data<float>());
  BenchCase c = api::bench::invoke_case(
      kOp, {Value(api::bench::random_tensor({M, P::kK}, DType::kBFloat16, dev, s.random_seed, -2.0,
                                            2.0)),
            Value(logits.to(DType::kBFloat16).to(dev)), Value(wu.to(dev)), Value(su.to(dev)),
            Value(wd.to(dev)), Value(sd.to(dev)), Value(top_k)});
  int64_t experts = 0;
  for (bool b : chosen) experts += b ? 1 : 0;
  c.flops = 2.0 * static_cast<double>(M * top_k) * (2 * P::kN * P::kK + P::kK * P::kN);
  c.bytes = static_cast<double>(experts) * static_cast<double>(per_up + per_down) +
            static_cast<double>(M * P::kK) * 4.0 + static_cast<double>(M * P::kE) * 2.0;
  return c;
}

BenchCase bench_interleave(const BenchShape& s, Device dev) {
  // A smaller expert count than mono_moe's: the permutation is the same for any E and K.
  const Shape shape{4, 2 * P::kN, 256};
  BenchCase c = api::bench::invoke_case(
      "interleave_for_tma_wgmma_up",
      {Value(api::bench::random_tensor(shape, DType::kFloat8E4M3FN, dev, s.random_seed))});
  c.bytes = 2.0 * api::bench::nbytes(shape, DType::kFloat8E4M3FN);  // read once, written once
  return c;
}

}  // namespace

namespace detail {

void register_monomoe_ops(OpRegistry& r) {
  static constexpr api::BackendSummary kHost[] = {{DeviceType::kCPU, "host-side query"}};
  declare<&has_monomoe>(
      r, {.name = "has_monomoe",
          .module = kModule,
          .summary = "Whether mono_moe can run (always here: a CPU reference, and the CUDA kernel "
                     "on sm_90)"});
  api::register_backends("has_monomoe", kHost);
  declare<&get_scratchpad_size_bytes>(
      r, {.name = "get_scratchpad_size_bytes",
          .module = kModule,
          .summary = "Bytes of the MonoMoE scratchpad (123968, upstream's)"});
  api::register_backends("get_scratchpad_size_bytes", kHost);
  declare<&alloc_scratchpad>(r,
                             {.name = "alloc_scratchpad",
                              .module = kModule,
                              .summary = "A zero-filled uint8 MonoMoE scratchpad on a device"},
                             arg("device").required());
  static constexpr api::BackendSummary kAlloc[] = {
    {DeviceType::kCPU, "a zero-filled host buffer"},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "a zero-filled device buffer"},
#endif
  };
  api::register_backends("alloc_scratchpad", kAlloc);
  declare<&interleave_for_tma_wgmma_up>(
      r,
      {.name = "interleave_for_tma_wgmma_up",
       .module = kModule,
       .summary = "MonoMoE's up-projection weights with gate and up rows in 8-row pairs"},
      "w_fp8");
  static constexpr api::BackendSummary kCopy[] = {
    {DeviceType::kCPU, "a strided copy (rows in 8-row chunks)"},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "a strided device copy (rows in 8-row chunks)"},
#endif
  };
  api::register_backends("interleave_for_tma_wgmma_up", kCopy);
  register_bench_hook("interleave_for_tma_wgmma_up", bench_interleave);
  declare<&mono_moe>(
      r,
      {.name = kOp,
       .module = kModule,
       .summary = "Block-FP8 top-k MoE for 1-8 tokens, 256 experts, K 2048, N 512 (Hopper)"},
      "activations_in", "router_logits", "expert_weights_up", "expert_scales_up",
      "expert_weights_down", "expert_scales_down", arg("top_k").required(),
      arg("scoring_func", std::string("softmax")), arg("renormalize", true), arg("out").mut(),
      arg("scratchpad").mut(), arg("interleave_up", true));
  api::register_backends(kOp, kMonoMoeKernels);
  register_bench_hook(kOp, bench_mono_moe);
}

}  // namespace detail

}  // namespace flashinfer
