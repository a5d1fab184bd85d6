// flashinfer.kda.recurrent_kda: upstream's checks and messages, its layouts (dense, packed,
// speculative, prefill), slot rules, returns, dispatch and a bench hook. The recurrence is
// kernels/kda_params.h's (docs/LINEAR_ATTENTION.md, "Kimi delta attention").
#include "flashinfer/ops/kda.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "core/cuda_runtime.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/kda_cpu.h"
#include "kernels/kda_params.h"

#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/kda_cuda.h"
#endif

namespace flashinfer {

template <>
struct ReturnName<KdaOutput> {
  static constexpr const char* value =
      "tuple[Tensor, Tensor | None] | tuple[Tensor, Tensor, Tensor]";
};

Value to_value(const KdaOutput& r) {
  const Value fs = r.final_state.defined() ? Value(r.final_state) : Value();
  if (r.state_checkpoints.defined()) {
    return Value::tuple({Value(r.output), fs, Value(r.state_checkpoints)});
  }
  return Value::tuple({Value(r.output), fs});
}

namespace {

using kernels::KdaIoRef;
using kernels::KdaParams;

constexpr const char* kKdaOp = "recurrent_kda";

constexpr api::KernelEntry<KdaParams> kKdaKernels[] = {
    {DeviceType::kCPU, "CPU reference: the token recurrence in fp32, value heads in parallel",
     nullptr,
     [](const KdaParams& p, const api::LaunchContext&) { kernels::cpu::recurrent_kda(p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernel: a warp per state row (sequence, value head, v), the row in registers", nullptr,
     [](const KdaParams& p, const api::LaunchContext& c) {
       kernels::cuda::recurrent_kda(p, c.stream, c.enable_pdl);
     }},
#endif
};

constexpr api::KernelEntry<kernels::FusedKdaParams> kFusedKdaKernels[] = {
    {DeviceType::kCPU, "CPU reference: conv, the KDA step and the gated RMSNorm in fp32", nullptr,
     [](const kernels::FusedKdaParams& p, const api::LaunchContext&) {
       kernels::cpu::fused_kda_decode(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: a block per (row, head), a warp per quarter of the rows",
     nullptr,
     [](const kernels::FusedKdaParams& p, const api::LaunchContext& c) {
       kernels::cuda::fused_kda_decode(p, c.stream, c.enable_pdl);
     }},
#endif
};

KdaIoRef kda_io(const Tensor& t) { return {t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)}; }

// A shape as python prints a tuple of ints: (2, 1, 4, 128), (5,).
std::string py_tuple(const Shape& s) {
  std::string out = "(";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

// disable_state_update=True: upstream 0.7.4's frozen verify (kda_decode's
// _run_frozen_recurrent_kda), its checks in its order. Batched [B, T, ..] rows without caches
// (GQA allowed; its output-only kernel's checks), or, with the caches, every call through the
// RecoverSSM drop-in's checks: batched rows flattened to one packed row of windows of T, or packed
// rows (cu_seqlens) with the window num_spec_tokens + 1, else the caches' token dimension.
KdaOutput kda_frozen_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                          const Tensor& beta, const std::optional<Tensor>& A_log,
                          const std::optional<Tensor>& dt_bias, std::optional<double> scale,
                          const std::optional<Tensor>& initial_state, bool l2norm,
                          bool gate_in_kernel, std::optional<double> lower_bound,
                          const std::optional<Tensor>& cu_seqlens,
                          const std::optional<Tensor>& ssm_idx, std::optional<int64_t> num_spec,
                          std::optional<Tensor> output, const std::optional<Tensor>& source,
                          const std::optional<Tensor>& source_idx, bool beta_is_logit,
                          const std::optional<Tensor>& corr, const std::optional<Tensor>& kg) {
  const char* op = kKdaOp;
  auto given = [](const std::optional<Tensor>& t) { return t && t->defined(); };
  FLASHINFER_CHECK(l2norm, op, "use_qk_l2norm_in_kernel",
                   "disable_state_update=True always applies Q/K L2 normalization "
                   "(use_qk_l2norm_in_kernel=False is not supported)");
  const bool from_source = given(source);
  FLASHINFER_CHECK(from_source || given(initial_state), op, "initial_state",
                   "disable_state_update=True requires a committed state pool via "
                   "initial_state_source (preferred) or initial_state (read-only)");
  const Tensor& pool = from_source ? *source : *initial_state;
  const char* pool_arg = from_source ? "initial_state_source" : "initial_state";
  std::optional<Tensor> slots = given(source_idx) ? source_idx : ssm_idx;
  const char* slots_arg = given(source_idx) ? "initial_state_indices" : "ssm_state_indices";
  const bool caches = given(corr) || given(kg);
  FLASHINFER_CHECK(!caches || (given(corr) && given(kg)), op,
                   given(corr) ? "kg_cache" : "correction_cache",
                   "correction_cache and kg_cache must be provided together");
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{q, "q"},
                                {k, "k"},
                                {v, "v"},
                                {g, "g"},
                                {beta, "beta"}}) {
    api::check_defined(t, op, name);
  }
  auto int_slots = [&]() -> Tensor {
    if (!given(slots)) return Tensor();
    FLASHINFER_CHECK(dtype_is_integral(slots->dtype()), op, slots_arg, slots_arg,
                     " must hold integers, got ", dtype_torch_name(slots->dtype()));
    api::check_same_device(*slots, q, op, slots_arg, "q");
    return slots->to(DType::kInt32).contiguous();  // upstream converts any integer dtype
  };
  KdaParams p;
  p.frozen = true;
  p.gate = !gate_in_kernel ? kernels::KdaGate::kPrecomputed
           : lower_bound   ? kernels::KdaGate::kLowerBound
                           : kernels::KdaGate::kSoftplus;
  // upstream passes lower_bound only with the gate in the kernel: otherwise it is ignored.
  p.lower_bound = gate_in_kernel && lower_bound ? static_cast<float>(*lower_bound) : 0.0f;
  p.beta_is_logit = beta_is_logit;
  p.l2norm = true;
  p.state_dtype = DType::kBFloat16;
  // Every tensor the kernel reads outlives the launch (the packed views and offsets below).
  Tensor out, idx32, pool_use = pool, a_log32, bias32;
  Tensor qp = q, kp = k, vp = v, gp = g, bp = beta, cu;
  int64_t H = 0, HV = 0, K = 0, N = 0;
  int64_t window = 0;
  Shape result_shape;

  if (!given(cu_seqlens) && !caches) {
    // Batched rows, no caches: the output-only kernel's checks (kda_wy_output_only).
    FLASHINFER_CHECK(q.dim() == 4, op, "q", "q must be [B, T, H, K]; got ", py_tuple(q.shape()));
    const int64_t B = q.size(0), T = q.size(1);
    H = q.size(2), K = q.size(3);
    FLASHINFER_CHECK(v.dim() == 4 && v.size(0) == B && v.size(1) == T, op, "v", "v must be [B=", B,
                     ", T=", T, ", HV, V]; got ", py_tuple(v.shape()));
    HV = v.size(2);
    const int64_t V = v.size(3);
    FLASHINFER_CHECK(k.shape() == q.shape(), op, "k", "k must match q ", py_tuple(q.shape()),
                     "; got ", py_tuple(k.shape()));
    FLASHINFER_CHECK(g.shape() == Shape({B, T, HV, K}), op, "g", "g must be [B=", B, ", T=", T,
                     ", HV=", HV, ", K=", K, "]; got ", py_tuple(g.shape()));
    FLASHINFER_CHECK(beta.shape() == Shape({B, T, HV}), op, "beta", "beta must be [B=", B,
                     ", T=", T, ", HV=", HV, "]; got ", py_tuple(beta.shape()));
    for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{q, "q"},
                                  {k, "k"},
                                  {v, "v"},
                                  {g, "g"},
                                  {beta, "beta"}}) {
      FLASHINFER_CHECK(t.dtype() == DType::kBFloat16, op, name, name, " must be bf16; got ",
                       dtype_torch_name(t.dtype()));
      FLASHINFER_CHECK(t.device() == q.device(), op, name, name, " must be on ", q.device().str(),
                       "; got ", t.device().str());
    }
    FLASHINFER_CHECK(pool.dtype() == DType::kBFloat16, op, pool_arg,
                     "initial_state_source must be bf16 (pool, HV, V, K)");
    FLASHINFER_CHECK(
        pool.dim() == 4 && pool.size(1) == HV && pool.size(2) == V && pool.size(3) == K, op,
        pool_arg, "initial_state_source must be [pool, HV=", HV, ", V=", V, ", K=", K, "]; got ",
        py_tuple(pool.shape()));
    FLASHINFER_CHECK(pool.device() == q.device(), op, pool_arg,
                     "initial_state_source must be on the inputs' device");
    FLASHINFER_CHECK(!given(slots) || (slots->dim() == 1 && slots->size(0) == B), op, slots_arg,
                     "initial_state_indices must be [B=", B, "]; got ",
                     given(slots) ? py_tuple(slots->shape()) : "");
    FLASHINFER_CHECK(K == 128 && V == 128, op, "q", "this kernel requires K==V==128; got K=", K,
                     ", V=", V);
    FLASHINFER_CHECK(T >= 1 && T <= 16, op, "q", "T must be in [1, 16]; got ", T);
    FLASHINFER_CHECK(H >= 1 && HV % H == 0, op, "v", "HV (", HV, ") must be a multiple of H (", H,
                     ")");
    if (gate_in_kernel) {
      FLASHINFER_CHECK(given(A_log), op, "A_log", "A_log required with use_gate_in_kernel");
      FLASHINFER_CHECK(!lower_bound || *lower_bound < 0.0, op, "lower_bound",
                       "lower_bound must be negative");
    }
    FLASHINFER_CHECK(!given(dt_bias) || dt_bias->numel() == H * K, op, "dt_bias",
                     "dt_bias must hold H*K = ", H * K, " values, got ", dt_bias->numel());
    if (given(output)) {
      FLASHINFER_CHECK(output->shape() == Shape({B, T, HV, V}) && output->is_contiguous(), op,
                       "output", "output must be a contiguous [B=", B, ", T=", T, ", HV=", HV,
                       ", V=", V, "] tensor, got ", py_tuple(output->shape()));
      FLASHINFER_CHECK(output->dtype() == DType::kBFloat16 && output->device() == q.device(), op,
                       "output", "output must be bf16 on ", q.device().str());
    }
    // Read only: a compact copy serves any layout (upstream reads .contiguous()); so do the
    // activations, which the kernel reads with a unit last stride.
    if (!(pool.stride(3) == 1 && pool.stride(2) == K && pool.stride(1) == V * K)) {
      pool_use = pool.contiguous();
    }
    qp = q.contiguous(), kp = k.contiguous(), vp = v.contiguous(), gp = g.contiguous();
    bp = beta.contiguous();
    N = B;
    window = T;
    p.num_seqs = B;
    p.T = T;
    p.q = kda_io(qp), p.k = kda_io(kp), p.v = kda_io(vp), p.g = kda_io(gp);
    p.beta = {bp.data_ptr(), bp.stride(0), bp.stride(1), bp.stride(2)};
    out = given(output) ? *output : Tensor::zeros({B, T, HV, V}, DType::kBFloat16, q.device());
    p.out = out.data_ptr();
    p.out_seq = out.stride(0), p.out_tok = out.stride(1), p.out_head = out.stride(2);
    idx32 = int_slots();
  } else {
    // The RecoverSSM drop-in: equal heads, slot-indexed caches, ragged packed windows.
    FLASHINFER_CHECK_CODE(
        q.size(-2) == v.size(-2), ErrorCode::kUnsupported, op, "v",
        "GQA (HV != H) is not supported by the packed frozen-verify path (correction/kg caches "
        "or cu_seqlens inputs) yet \u2014 the underlying vLLM RecoverSSM contract is equal-head "
        "(Kimi K3). Use the batched [B, T, ...] form without caches for GQA.");
    std::optional<Tensor> outp = output;
    if (!given(cu_seqlens)) {  // batched rows: one packed row of windows of T tokens
      FLASHINFER_CHECK(q.dim() == 4 && v.dim() == 4, op, "q", "q must be [B, T, H, K]; got ",
                       py_tuple(q.shape()));
      const int64_t B = q.size(0), T = q.size(1);
      const auto flat = [&](const Tensor& t, const char* name) {
        FLASHINFER_CHECK(t.dim() >= 3 && t.size(0) == B && t.size(1) == T, op, name, "shape '",
                         py_tuple(t.shape()), "' is invalid for the batched frozen verify of B=", B,
                         ", T=", T);
        Shape s = t.shape();
        s.erase(s.begin());
        s[0] = B * T;
        s.insert(s.begin(), 1);
        return t.reshape(s);
      };
      qp = flat(q, "q"), kp = flat(k, "k"), vp = flat(v, "v"), gp = flat(g, "g");
      bp = flat(beta, "beta");
      if (given(output)) outp = flat(*output, "output");
      std::vector<double> offs(static_cast<size_t>(B + 1));
      for (int64_t i = 0; i <= B; ++i) offs[i] = static_cast<double>(i * T);
      const detail::CaptureUploadScope by_value;
      cu = Tensor::from_vector(offs, {B + 1}, DType::kInt32).to(q.device());
      window = T;
      N = B;
      result_shape = {B, T, v.size(2), v.size(3)};
    } else {
      FLASHINFER_CHECK(caches, op, "cu_seqlens",
                       "packed (cu_seqlens) frozen-verify calls currently require "
                       "correction_cache/kg_cache; for a plain frozen decode pass batched [B, T, "
                       "...] tensors instead");
      const Tensor& c = *cu_seqlens;
      FLASHINFER_CHECK(c.dim() == 1 && c.size(0) >= 2, op, "cu_seqlens",
                       "cu_seqlens must be 1-D with at least 2 entries; got ", py_tuple(c.shape()));
      FLASHINFER_CHECK(dtype_is_integral(c.dtype()), op, "cu_seqlens",
                       "cu_seqlens must hold integers, got ", dtype_torch_name(c.dtype()));
      cu = c.dtype() == DType::kInt32 || c.dtype() == DType::kInt64 ? c.contiguous()
                                                                    : c.to(DType::kInt32);
      N = c.size(0) - 1;
      window = num_spec ? *num_spec + 1 : corr->size(2);
    }
    FLASHINFER_CHECK(!given(slots) || (slots->dim() == 1 && slots->size(0) == N), op, slots_arg,
                     "state slot indices must be [B=", N, "]; got ",
                     given(slots) ? py_tuple(slots->shape()) : "");
    // kda_recoverssm_verify's checks, in its order.
    FLASHINFER_CHECK(qp.dim() == 4 && qp.size(0) == 1, op, "q",
                     "KDA RecoverSSM q must have shape [1, tokens, heads, dim]");
    const int64_t total = qp.size(1);
    H = HV = qp.size(2);
    K = qp.size(3);
    const int64_t V = vp.size(-1);
    FLASHINFER_CHECK(K == 128 && V == 128, op, "q", "this kernel requires K == V == 128");
    FLASHINFER_CHECK(window >= 1 && window <= 16, op,
                     num_spec ? "num_spec_tokens" : "correction_cache",
                     "spec_query_len must be in [1, 16]");
    FLASHINFER_CHECK(kp.shape() == qp.shape() && vp.shape() == Shape({1, total, H, V}), op, "v",
                     "KDA RecoverSSM q, k, and v shapes are incompatible");
    FLASHINFER_CHECK(gp.shape() == qp.shape() && bp.shape() == Shape({1, total, H}), op, "g",
                     "KDA RecoverSSM gate or beta shape is incompatible");
    for (const auto& [t, name] :
         {std::pair<const Tensor&, const char*>{qp, "q"}, {kp, "k"}, {gp, "g"}}) {
      FLASHINFER_CHECK(t.stride(2) == K && t.stride(3) == 1, op, name,
                       "KDA RecoverSSM q, k, and gate heads must be contiguous");
    }
    FLASHINFER_CHECK(vp.stride(2) == V && vp.stride(3) == 1 && bp.stride(2) == 1, op, "v",
                     "KDA RecoverSSM v and beta heads must be contiguous");
    const int64_t blocks = pool.dim() >= 1 ? pool.size(0) : 0;
    FLASHINFER_CHECK(pool.dim() == 4 && pool.size(1) == H && pool.size(2) == V && pool.size(3) == K,
                     op, pool_arg, "KDA RecoverSSM checkpoint shape is incompatible");
    FLASHINFER_CHECK(pool.dtype() == DType::kBFloat16, op, pool_arg,
                     "this drop-in requires a bf16 checkpoint pool (fp32 pools are not supported "
                     "yet)");
    FLASHINFER_CHECK(pool.stride(1) == V * K && pool.stride(2) == K && pool.stride(3) == 1, op,
                     pool_arg, "KDA RecoverSSM checkpoint rows must be contiguous");
    FLASHINFER_CHECK(pool.stride(0) % 8 == 0, op, pool_arg,
                     "KDA RecoverSSM checkpoint block stride must be 16B-aligned");
    FLASHINFER_CHECK(corr->shape() == Shape({blocks, H, window, V}), op, "correction_cache",
                     "KDA RecoverSSM correction buffer shape is incompatible");
    FLASHINFER_CHECK(kg->shape() == Shape({blocks, H, window, 2 * K}), op, "kg_cache",
                     "KDA RecoverSSM key/gate buffer shape is incompatible");
    FLASHINFER_CHECK(corr->dtype() == DType::kFloat32, op, "correction_cache",
                     "KDA RecoverSSM correction buffer must use float32");
    FLASHINFER_CHECK(kg->dtype() == kp.dtype() && kp.dtype() == DType::kBFloat16, op, "kg_cache",
                     "KDA RecoverSSM activations and kg buffer must be bf16");
    FLASHINFER_CHECK(corr->stride(3) == 1 && kg->stride(3) == 1, op, "correction_cache",
                     "KDA RecoverSSM cache innermost dims must be contiguous");
    FLASHINFER_CHECK(
        corr->stride(0) % 4 == 0 && corr->stride(1) % 4 == 0 && corr->stride(2) % 4 == 0, op,
        "correction_cache", "KDA RecoverSSM correction strides must be 16B-aligned");
    // Missing gate parameters are zeros (upstream's placeholders), checked like given ones.
    const Tensor a_eff = given(A_log) ? *A_log : Tensor::zeros({H}, DType::kFloat32, q.device());
    const Tensor b_eff =
        given(dt_bias) ? *dt_bias : Tensor::zeros({H * K}, DType::kFloat32, q.device());
    FLASHINFER_CHECK(a_eff.shape() == Shape({H}) && b_eff.numel() == H * K, op,
                     given(A_log) && a_eff.shape() != Shape({H}) ? "A_log" : "dt_bias",
                     "KDA RecoverSSM gate parameters are incompatible");
    FLASHINFER_CHECK(a_eff.is_contiguous() && b_eff.is_contiguous(), op,
                     a_eff.is_contiguous() ? "dt_bias" : "A_log",
                     "KDA RecoverSSM gate parameters must be contiguous");
    FLASHINFER_CHECK(cu.size(0) == N + 1, op, "cu_seqlens",
                     "KDA RecoverSSM query metadata is incompatible");
    FLASHINFER_CHECK(total <= N * window, op, "q",
                     "KDA RecoverSSM speculative decode input exceeds its activation capacity");
    if (given(outp)) {
      FLASHINFER_CHECK(outp->shape() == vp.shape(), op, "output",
                       "KDA RecoverSSM output shape is incompatible");
      FLASHINFER_CHECK(outp->stride(2) == V && outp->stride(3) == 1, op, "output",
                       "KDA RecoverSSM output heads must be contiguous");
      FLASHINFER_CHECK(outp->dtype() == vp.dtype(), op, "output",
                       "KDA RecoverSSM output must match the activation dtype");
    }
    for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{qp, "q"},
                                  {kp, "k"},
                                  {vp, "v"},
                                  {gp, "g"},
                                  {bp, "beta"}}) {
      FLASHINFER_CHECK(t.dtype() == DType::kBFloat16, op, name,
                       "KDA RecoverSSM activations must be bf16");
    }
    for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&kp, "k"},
                                  {&vp, "v"},
                                  {&gp, "g"},
                                  {&bp, "beta"},
                                  {&pool, pool_arg},
                                  {&*corr, "correction_cache"},
                                  {&*kg, "kg_cache"},
                                  {&cu, "cu_seqlens"}}) {
      FLASHINFER_CHECK(t->device() == qp.device(), op, name,
                       "KDA RecoverSSM tensors must share one device");
    }
    FLASHINFER_CHECK(!given(slots) || slots->device() == qp.device(), op, slots_arg,
                     "KDA RecoverSSM tensors must share one device");
    FLASHINFER_CHECK(!given(outp) || outp->device() == qp.device(), op, "output",
                     "KDA RecoverSSM tensors must share one device");
    if (gate_in_kernel) {
      a_log32 = a_eff.to(DType::kFloat32).contiguous();
      bias32 = b_eff.to(DType::kFloat32).contiguous();
    }
    out = given(outp) ? *outp : Tensor::zeros(vp.shape(), DType::kBFloat16, q.device());
    api::check_writable(*corr, op, "correction_cache");
    api::check_writable(*kg, op, "kg_cache");
    idx32 = int_slots();
    if (cu.device().is_cpu()) {
      const auto c = api::host_ints(cu);
      for (int64_t n = 0; n < N; ++n) {
        FLASHINFER_CHECK(c[n] >= 0 && c[n] <= c[n + 1] && c[n + 1] <= total, op, "cu_seqlens",
                         "must be non-decreasing within [0, ", total, "], got entries ", n, ", ",
                         n + 1, " = ", c[n], ", ", c[n + 1]);
        // Longer than the window is undefined upstream (its kernel's tile holds the window).
        FLASHINFER_CHECK(c[n + 1] - c[n] <= window, op, "cu_seqlens", "sequence ", n, " has ",
                         c[n + 1] - c[n], " tokens, more than the verify window of ", window);
      }
    }
    p.num_seqs = N;
    p.T = window;
    p.cu_seqlens = cu.data_ptr();
    p.cu_seqlens_i64 = cu.dtype() == DType::kInt64;
    p.total_tokens = total;
    p.q = kda_io(qp), p.k = kda_io(kp), p.v = kda_io(vp), p.g = kda_io(gp);
    p.beta = {bp.data_ptr(), bp.stride(0), bp.stride(1), bp.stride(2)};
    p.out = out.data_ptr();
    p.out_seq = out.stride(0), p.out_tok = out.stride(1), p.out_head = out.stride(2);
    p.corr = corr->data<float>();
    p.corr_slot = corr->stride(0), p.corr_head = corr->stride(1), p.corr_tok = corr->stride(2);
    p.kg = static_cast<uint16_t*>(kg->data_ptr());
    p.kg_slot = kg->stride(0), p.kg_head = kg->stride(1), p.kg_tok = kg->stride(2);
    if (total == 0) return {result_shape.empty() ? out : out.reshape(result_shape), {}, {}};
  }
  const double sc = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(K));
  FLASHINFER_CHECK(std::isfinite(sc), op, "scale", "scale must be finite, got ", sc);
  if (gate_in_kernel && !a_log32.defined()) {  // the batched path: any float dtype, as fp32
    a_log32 = A_log->to(DType::kFloat32).contiguous();
    FLASHINFER_CHECK(a_log32.numel() >= H, op, "A_log", "A_log must hold one value per head (", H,
                     "), got ", a_log32.numel());
    if (given(dt_bias)) bias32 = dt_bias->to(DType::kFloat32).contiguous();
  }
  api::check_same_device(pool, q, op, pool_arg, "q");
  if (a_log32.defined()) api::check_same_device(a_log32, q, op, "A_log", "q");
  if (bias32.defined()) api::check_same_device(bias32, q, op, "dt_bias", "q");
  api::check_writable(out, op, "output");
  // Host slot checks (CPU): a slot past the pool is undefined upstream (refused here).
  if (q.device().is_cpu() && idx32.defined()) {
    for (int64_t s : api::host_ints(idx32)) {
      FLASHINFER_CHECK(s < pool.size(0), op, slots_arg, "slot ", s,
                       " is outside the state pool of ", pool.size(0), " slots");
    }
  }
  FLASHINFER_CHECK(idx32.defined() || pool.size(0) >= N, op, pool_arg, pool_arg, " has ",
                   pool.size(0), " slots for ", N,
                   " sequences (without slot indices sequence n reads slot n)");
  p.H = H, p.HV = HV, p.K = K;
  p.scale = static_cast<float>(sc);
  if (gate_in_kernel) {
    p.A_log = a_log32.data<float>();
    if (bias32.defined()) p.dt_bias = bias32.data<float>();
  }
  // The pool is read, never written (p.frozen): the kernels take it through the state pointer.
  p.state = const_cast<void*>(static_cast<const void*>(pool_use.data_ptr()));
  p.slots = pool_use.size(0);
  p.state_stride_slot = pool_use.stride(0);
  if (idx32.defined()) p.idx = idx32.data<int32_t>();
  api::launch(kKdaKernels, p, q.device(), op, "q");
  return {result_shape.empty() ? out : out.reshape(result_shape), {}, {}};
}

KdaOutput kda_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                   const Tensor& beta, const std::optional<Tensor>& A_log,
                   const std::optional<Tensor>& dt_bias, std::optional<double> scale,
                   std::optional<Tensor> initial_state, bool output_final_state, bool l2norm,
                   bool gate_in_kernel, std::optional<double> lower_bound,
                   const std::optional<Tensor>& cu_seqlens, std::optional<Tensor> ssm_idx,
                   std::optional<int64_t> num_spec, const std::optional<Tensor>& num_accepted,
                   std::optional<Tensor> output, const std::optional<Tensor>& source,
                   const std::optional<Tensor>& source_idx, bool beta_is_logit,
                   const std::optional<Tensor>& seq_order, bool has_workspace,
                   const std::optional<Tensor>& checkpoints, const std::optional<Tensor>& cp_starts,
                   int64_t cp_every, const std::optional<Tensor>& cp_idx, bool frozen,
                   const std::optional<Tensor>& corr, const std::optional<Tensor>& kg,
                   const std::string& backend) {
  const char* op = kKdaOp;
  auto given = [](const std::optional<Tensor>& t) { return t && t->defined(); };
  // 0.7.4's backends ("vibecuda": the pinned release's, still taken). The explicit prefill
  // kernels' other limits (their shapes and architectures) are not checked: the recurrence is
  // the same whichever kernel upstream picks.
  FLASHINFER_CHECK(backend == "auto" || backend == "cute-dsl" || backend == "cute-dsl-persistent" ||
                       backend == "tirx" || backend == "ptx" || backend == "cake" ||
                       backend == "small-bh" || backend == "cudnn" || backend == "vibecuda",
                   op, "backend",
                   "backend must be 'auto', 'cute-dsl', 'cute-dsl-persistent', 'tirx', 'ptx', "
                   "'cake', 'small-bh', or 'cudnn', got '",
                   backend, "'");
  {
    // The explicit prefill backends refuse these arguments by name, in upstream's order.
    const bool cudnn = backend == "cudnn";
    if (cudnn || backend == "cute-dsl-persistent" || backend == "tirx" || backend == "ptx") {
      std::vector<std::pair<const char*, bool>> asked;
      if (!cudnn) asked.push_back({"ssm_state_indices", given(ssm_idx)});
      asked.insert(asked.end(), {{"num_spec_tokens", num_spec.has_value()},
                                 {"num_accepted_tokens", given(num_accepted)},
                                 {"initial_state_source", given(source)},
                                 {"initial_state_indices", given(source_idx)},
                                 {"seq_order", given(seq_order)}});
      if (cudnn) asked.push_back({"prefill_workspace", has_workspace});
      asked.insert(asked.end(), {{"state_checkpoints", given(checkpoints)},
                                 {"checkpoint_cu_starts", given(cp_starts)}});
      if (cudnn) {
        asked.push_back({"checkpoint_every_n_tokens", cp_every != 0});
        asked.push_back({"checkpoint_state_indices", given(cp_idx)});
      } else {
        asked.push_back({"checkpoint_state_indices", given(cp_idx)});
        asked.push_back({"checkpoint_every_n_tokens", cp_every != 0});
      }
      asked.insert(asked.end(), {{"disable_state_update", frozen},
                                 {"correction_cache", given(corr)},
                                 {"kg_cache", given(kg)}});
      std::string names;
      for (const auto& [name, on] : asked) {
        if (on) names += (names.empty() ? "" : ", ") + std::string(name);
      }
      FLASHINFER_CHECK_CODE(names.empty(), ErrorCode::kUnsupported, op, "backend",
                            cudnn
                                ? std::string("recurrent_kda(backend=\"cudnn\") does not support ")
                                : "backend='" + backend + "' does not support ",
                            names);
      // cuDNN's engine reads a state pool only in an ordinary multi-token prefill.
      const bool plain_prefill =
          !num_spec.has_value() && q.defined() && q.dim() == 4 &&
          (given(cu_seqlens) ? cu_seqlens->dim() == 1 && cu_seqlens->numel() > 1 &&
                                   q.size(1) > cu_seqlens->numel() - 1
                             : q.size(1) > 1);
      FLASHINFER_CHECK_CODE(!cudnn || !given(ssm_idx) || plain_prefill, ErrorCode::kUnsupported, op,
                            "ssm_state_indices",
                            "recurrent_kda(backend=\"cudnn\") state pools require ordinary "
                            "multi-token prefill");
    }
  }
  FLASHINFER_CHECK(!(given(cp_idx) && backend == "cake"), op, "checkpoint_state_indices",
                   "checkpoint_state_indices is supported only by CuTe DSL");
  FLASHINFER_CHECK(frozen || !(given(corr) || given(kg)), op,
                   given(corr) ? "correction_cache" : "kg_cache",
                   "correction_cache/kg_cache are speculative-verify caches and require "
                   "disable_state_update=True");
  if (frozen) {
    FLASHINFER_CHECK(backend != "small-bh", op, "backend",
                     "backend='small-bh' has no frozen-state kernels; disable_state_update=True "
                     "requires the CuTe-DSL backends");
    FLASHINFER_CHECK(!(given(seq_order) || has_workspace || given(checkpoints) ||
                       given(cp_starts) || given(cp_idx) || cp_every != 0),
                     op, "disable_state_update",
                     "prefill-only arguments are incompatible with disable_state_update=True");
    FLASHINFER_CHECK(backend != "cake", op, "backend",
                     "backend='cake' has no frozen-state kernels; disable_state_update=True "
                     "requires the CuTe-DSL backends");
    FLASHINFER_CHECK(!output_final_state, op, "output_final_state",
                     "output_final_state=True is incompatible with disable_state_update=True (no "
                     "state is produced)");
    FLASHINFER_CHECK(!given(num_accepted), op, "num_accepted_tokens",
                     "num_accepted_tokens applies to the state-updating fused spec path, not the "
                     "frozen-verify mode");
    return kda_frozen_impl(q, k, v, g, beta, A_log, dt_bias, scale, initial_state, l2norm,
                           gate_in_kernel, lower_bound, cu_seqlens, ssm_idx, num_spec, output,
                           source, source_idx, beta_is_logit, corr, kg);
  }
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{q, "q"},
                                {k, "k"},
                                {v, "v"},
                                {g, "g"},
                                {beta, "beta"}}) {
    api::check_defined(t, op, name);
    FLASHINFER_CHECK(t.dtype() == DType::kBFloat16, op, name, name, " must be bfloat16, got ",
                     dtype_torch_name(t.dtype()));
    api::check_same_device(t, q, op, name, "q");
    FLASHINFER_CHECK(t.numel() == 0 || t.stride(-1) == 1, op, name, name,
                     " must be contiguous in its last dimension");
  }
  api::check_dim(q, {4}, op, "q");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3);
  api::check_dim(v, {4}, op, "v");
  const int64_t HV = v.size(2), V = v.size(3);
  FLASHINFER_CHECK(K == V, op, "v", "K must equal V, got K=", K, ", V=", V);
  FLASHINFER_CHECK(K == 64 || K == 128, op, "q", "HEAD_DIM must be 64 or 128, got K=", K);
  FLASHINFER_CHECK(H >= 1 && HV >= H && HV % H == 0, op, "v",
                   "HV must be a positive multiple of H, got H=", H, ", HV=", HV);
  api::check_shape_eq(k, q.shape(), op, "k");
  api::check_shape_eq(v, {B, T, HV, V}, op, "v");
  api::check_shape_eq(g, {B, T, HV, K}, op, "g");
  api::check_shape_eq(beta, {B, T, HV}, op, "beta");
  if (gate_in_kernel) {
    FLASHINFER_CHECK(given(A_log), op, "A_log", "A_log is required when use_gate_in_kernel=True");
  }
  // A_log and dt_bias are read only with the gate in the kernel (upstream checks their dtypes
  // either way).
  if (given(A_log)) {
    FLASHINFER_CHECK(A_log->dtype() == DType::kFloat32, op, "A_log", "A_log must be float32, got ",
                     dtype_torch_name(A_log->dtype()));
    FLASHINFER_CHECK(!gate_in_kernel || (A_log->numel() == H && A_log->is_contiguous()), op,
                     "A_log", "A_log must hold one value per query head (", H, "), got ",
                     shape_to_string(A_log->shape()));
    api::check_same_device(*A_log, q, op, "A_log", "q");
  }
  if (given(dt_bias)) {
    FLASHINFER_CHECK(dt_bias->dtype() == DType::kFloat32, op, "dt_bias",
                     "dt_bias must be float32, got ", dtype_torch_name(dt_bias->dtype()));
    FLASHINFER_CHECK(!gate_in_kernel || (dt_bias->numel() == H * K && dt_bias->is_contiguous()), op,
                     "dt_bias", "dt_bias must be [H*K] or [H, K] (", H * K, " values), got ",
                     shape_to_string(dt_bias->shape()));
    api::check_same_device(*dt_bias, q, op, "dt_bias", "q");
  }
  if (lower_bound) {
    FLASHINFER_CHECK(gate_in_kernel, op, "lower_bound",
                     "lower_bound requires use_gate_in_kernel=True");
    FLASHINFER_CHECK(*lower_bound < 0.0, op, "lower_bound", "lower_bound must be negative");
  }
  const double sc = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(K));
  FLASHINFER_CHECK(std::isfinite(sc), op, "scale", "scale must be finite, got ", sc);
  FLASHINFER_CHECK(given(source) == given(source_idx), op, "initial_state_indices",
                   "initial_state_source and initial_state_indices must be provided together");

  // Layout: packed (cu_seqlens), speculative (num_spec_tokens), dense.
  const bool packed = given(cu_seqlens);
  const bool spec = num_spec.has_value();
  int64_t N = B, Tseq = T;
  std::vector<int64_t> cu_host;
  if (packed) {
    FLASHINFER_CHECK(B == 1, op, "q", "Batch size must be 1 with cu_seqlens, got B=", B);
    const Tensor& cu = *cu_seqlens;
    api::check_dim(cu, {1}, op, "cu_seqlens");
    api::check_dtype_in(cu, {DType::kInt32, DType::kInt64}, op, "cu_seqlens");
    api::check_same_device(cu, q, op, "cu_seqlens", "q");
    FLASHINFER_CHECK(cu.size(0) >= 1 && cu.is_contiguous(), op, "cu_seqlens",
                     "cu_seqlens must be a contiguous [N + 1] vector");
    N = cu.size(0) - 1;
    if (cu.device().is_cpu()) {
      cu_host = api::host_ints(cu);
      for (int64_t n = 0; n < N; ++n) {
        FLASHINFER_CHECK(cu_host[n] >= 0 && cu_host[n] <= cu_host[n + 1] && cu_host[n + 1] <= T, op,
                         "cu_seqlens", "must be non-decreasing within [0, ", T, "], got entries ",
                         n, ", ", n + 1, " = ", cu_host[n], ", ", cu_host[n + 1]);
      }
    }
  }
  Tensor q4 = q, k4 = k, v4 = v, g4 = g, b4 = beta;
  if (spec) {
    const int64_t S = *num_spec;
    FLASHINFER_CHECK(S >= 1, op, "num_spec_tokens", "num_spec_tokens must be >= 1, got ", S,
                     ". Use num_spec_tokens=None for standard decode.");
    Tseq = 1 + S;
    if (!packed) {  // the batched form: rows of 1 + S tokens
      FLASHINFER_CHECK(T == Tseq, op, "q", "q.shape[1]=", T, " must equal 1+num_spec_tokens=", Tseq,
                       " when cu_seqlens is not provided");
      if (!given(ssm_idx)) {
        std::vector<double> ids(static_cast<size_t>(B * Tseq));
        for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<double>(i);
        // Shapes only (upstream's torch.arange on the device): under a CUDA-graph capture the
        // upload goes by value.
        const detail::CaptureUploadScope by_value;
        ssm_idx = Tensor::from_vector(ids, {B, Tseq}, DType::kInt32).to(q.device());
        FLASHINFER_CHECK(given(initial_state) && initial_state->size(0) >= B * Tseq, op,
                         "initial_state",
                         "initial_state must have at least B*(1+num_spec_tokens) slots when "
                         "batched spec decode auto-generates ssm_state_indices");
      }
    } else {
      FLASHINFER_CHECK(given(ssm_idx), op, "ssm_state_indices",
                       "ssm_state_indices is required when num_spec_tokens is set with cu_seqlens");
    }
    const Tensor& si = *ssm_idx;
    FLASHINFER_CHECK(si.dim() == 2 && si.size(1) == Tseq, op, "ssm_state_indices",
                     "ssm_state_indices must be 2D [N, ", Tseq, "] in spec mode, got shape ",
                     shape_to_string(si.shape()));
    FLASHINFER_CHECK(si.size(0) == N, op, "ssm_state_indices",
                     "ssm_state_indices.shape[0]=", si.size(0), " must equal N=", N);
  } else if (!packed) {
    FLASHINFER_CHECK(T >= 1, op, "q", "q needs at least one token");
  }
  // The state pool.
  if (given(initial_state)) {
    const Tensor& st = *initial_state;
    api::check_dim(st, {4}, op, "initial_state");
    FLASHINFER_CHECK(st.dtype() == DType::kBFloat16, op, "initial_state",
                     "initial_state must be bfloat16, got ", dtype_torch_name(st.dtype()));
    FLASHINFER_CHECK(st.size(1) == HV && st.size(2) == V && st.size(3) == K, op, "initial_state",
                     "initial_state must be [slots, HV=", HV, ", V=", V, ", K=", K, "], got ",
                     shape_to_string(st.shape()));
    FLASHINFER_CHECK(st.stride(3) == 1 && st.stride(2) == K && st.stride(1) == V * K, op,
                     "initial_state", "initial_state must have compact [HV, V, K] slots");
    // Dense rows without indices read and write row b of the state itself (upstream copies a
    // non-contiguous one); with indices upstream gathers and scatters, any slot stride.
    FLASHINFER_CHECK(packed || spec || given(ssm_idx) || st.is_contiguous(), op, "initial_state",
                     "non-contiguous initial_state requires cu_seqlens: without cu_seqlens the "
                     "wrapper calls .contiguous() which copies the state, so in-place updates "
                     "would be silently lost on the original tensor");
    api::check_same_device(st, q, op, "initial_state", "q");
    api::check_writable(st, op, "initial_state");
  }
  if (given(ssm_idx) && !spec) {
    FLASHINFER_CHECK(ssm_idx->dim() == 1 && ssm_idx->size(0) >= N, op, "ssm_state_indices",
                     "ssm_state_indices must be [N] (", N, ") outside spec mode, got shape ",
                     shape_to_string(ssm_idx->shape()));
  }
  Tensor idx32;
  if (given(ssm_idx)) {
    api::check_dtype_in(*ssm_idx, {DType::kInt32, DType::kInt64}, op, "ssm_state_indices");
    api::check_same_device(*ssm_idx, q, op, "ssm_state_indices", "q");
    idx32 = ssm_idx->to(DType::kInt32).contiguous();  // upstream converts to int32
  }
  // Without a pool: zeros (dense: one slot a row; packed: max(index) + 1 slots).
  if (!given(initial_state)) {
    int64_t slots = N;
    if (idx32.defined()) {
      int64_t mx = -1;
      for (int64_t s : api::host_ints(idx32)) mx = std::max(mx, s);
      slots = std::max<int64_t>(mx + 1, spec ? 1 : 0);
    }
    initial_state =
        Tensor::zeros({std::max<int64_t>(slots, 1), HV, V, K}, DType::kBFloat16, q.device());
  }
  const Tensor& pool = *initial_state;
  const int64_t slots = pool.size(0);
  FLASHINFER_CHECK(!spec || slots >= 1, op, "initial_state",
                   "initial_state must have at least 1 slot when cu_seqlens is used");
  // Without indices sequence n is slot n.
  FLASHINFER_CHECK(spec || given(ssm_idx) || slots >= N, op, "initial_state", "initial_state has ",
                   slots, " slots for ", N,
                   " sequences (without ssm_state_indices sequence n is "
                   "slot n)");
  Tensor src_idx32;
  if (given(source)) {
    const Tensor& s = *source;
    FLASHINFER_CHECK(s.dtype() == DType::kBFloat16, op, "initial_state_source",
                     "initial_state_source must be bfloat16, got ", dtype_torch_name(s.dtype()));
    FLASHINFER_CHECK(s.dim() == 4 && s.size(1) == HV && s.size(2) == V && s.size(3) == K, op,
                     "initial_state_source",
                     "initial_state_source must have trailing shape [HV, V, K], got ",
                     shape_to_string(s.shape()));
    FLASHINFER_CHECK(s.stride(3) == 1 && s.stride(2) == K && s.stride(1) == V * K, op,
                     "initial_state_source", "initial_state_source must have compact slots");
    api::check_same_device(s, q, op, "initial_state_source", "q");
    FLASHINFER_CHECK(s.size(0) >= 1, op, "initial_state_source",
                     "initial_state_source has no slots");
    FLASHINFER_CHECK(source_idx->dim() == 1, op, "initial_state_indices",
                     "initial_state_indices must be 1D, got shape ",
                     shape_to_string(source_idx->shape()));
    FLASHINFER_CHECK(source_idx->size(0) >= N, op, "initial_state_indices",
                     "initial_state_indices must contain one entry per sequence, got ",
                     source_idx->size(0), " entries for N=", N);
    api::check_same_device(*source_idx, q, op, "initial_state_indices", "q");
    src_idx32 = source_idx->to(DType::kInt32).contiguous();
  }
  Tensor acc32;
  if (given(num_accepted)) {
    FLASHINFER_CHECK(num_accepted->dim() == 1 && num_accepted->size(0) >= N, op,
                     "num_accepted_tokens", "num_accepted_tokens must be [N] (", N, ")");
    api::check_same_device(*num_accepted, q, op, "num_accepted_tokens", "q");
    acc32 = num_accepted->to(DType::kInt32).contiguous();
  }
  if (given(seq_order)) {
    FLASHINFER_CHECK(seq_order->dim() == 1 && seq_order->size(0) == N, op, "seq_order",
                     "seq_order must be a permutation of the N=", N, " sequences");
  }
  // Checkpoints: prefill only (upstream: its frozen SM100 prefill).
  const bool prefill = !spec && (packed ? T > N : T > 1);
  // An ineligible checkpointing call: the text upstream's backend gives, then what is missing.
  const auto ineligible = [&](bool ok, const char* arg, const char* why) {
    FLASHINFER_CHECK(
        ok, op, arg,
        backend == "cute-dsl" || backend == "small-bh"
            ? "backend='" + backend + "' does not support this recurrent_kda prefill contract"
            : std::string("state checkpoints are supported only by eligible frozen "
                          "SM100/SM103 recurrent_kda prefill"),
        " (", why, ")");
  };
  if (given(cp_idx)) {
    // Only the CuTe-DSL BT16 prefill writes indexed checkpoints: its eligibility.
    ineligible(given(checkpoints), "state_checkpoints",
               "checkpoint_state_indices needs a caller-owned state_checkpoints pool");
    ineligible(cp_every > 0 && cp_every % 32 == 0, "checkpoint_every_n_tokens",
               "with checkpoint_state_indices, checkpoint_every_n_tokens a positive multiple of "
               "32");
    ineligible(!given(num_accepted) && !given(source) && HV == H && K == 128, "v",
               "with checkpoint_state_indices: equal heads of 128, no num_accepted_tokens or "
               "initial_state_source");
    ineligible(
        l2norm && gate_in_kernel && beta_is_logit && lower_bound && std::isfinite(*lower_bound),
        "lower_bound",
        "with checkpoint_state_indices: the L2 norms, the in-kernel lower-bound gate and "
        "logit betas");
    const Tensor& ci = *cp_idx;
    ineligible(ci.dtype() == DType::kInt32 && ci.dim() == 1 && ci.is_contiguous(),
               "checkpoint_state_indices", "checkpoint_state_indices a contiguous int32 vector");
    ineligible(ci.device() == q.device(), "checkpoint_state_indices",
               "checkpoint_state_indices on the inputs' device");
  }
  if (given(checkpoints) || cp_every != 0) {
    ineligible(
        prefill && given(checkpoints) && given(cp_starts) && cp_every > 0 && cp_every % 16 == 0,
        "state_checkpoints",
        "a multi-token prefill, checkpoint_cu_starts, and checkpoint_every_n_tokens a positive "
        "multiple of 16");
    const Tensor& c = *checkpoints;
    FLASHINFER_CHECK(c.dtype() == DType::kBFloat16 && c.dim() == 4 && c.size(1) == HV &&
                         c.size(2) == V && c.size(3) == K && c.is_contiguous(),
                     op, "state_checkpoints",
                     "state_checkpoints must be a contiguous bf16 [C, HV=", HV,
                     ", V, K] tensor, got ", shape_to_string(c.shape()));
    const Tensor& cs = *cp_starts;
    FLASHINFER_CHECK(
        cs.dtype() == DType::kInt64 && cs.dim() == 1 && cs.size(0) == N + 1 && cs.is_contiguous(),
        op, "checkpoint_cu_starts", "checkpoint_cu_starts must be int64 [N + 1]");
    api::check_same_device(c, q, op, "state_checkpoints", "q");
    api::check_same_device(cs, q, op, "checkpoint_cu_starts", "q");
    if (cs.device().is_cpu()) {
      const auto st = api::host_ints(cs);
      for (int64_t n = 0; n < N; ++n) {
        const int64_t len = packed ? (cu_host.empty() ? 0 : cu_host[n + 1] - cu_host[n]) : T;
        if (given(cp_idx)) {
          // floor(len / N) completed boundaries, each an entry of the index table.
          const int64_t count = len / cp_every;
          FLASHINFER_CHECK(count == 0 || (st[n] >= 0 && st[n] + count <= cp_idx->numel()), op,
                           "checkpoint_cu_starts", "sequence ", n, "'s ", count,
                           " checkpoint entries from ", st[n],
                           " fall outside checkpoint_state_indices' ", cp_idx->numel(), " entries");
          continue;
        }
        const int64_t count = (len + cp_every - 1) / cp_every;
        FLASHINFER_CHECK(count == 0 || (st[n] >= 0 && st[n] + count <= c.size(0)), op,
                         "checkpoint_cu_starts", "sequence ", n, "'s ", count,
                         " checkpoints from row ", st[n], " fall outside state_checkpoints' ",
                         c.size(0), " rows");
      }
    }
  }
  // Host slot checks (CPU): every non-negative slot inside the pool.
  if (q.device().is_cpu()) {
    if (idx32.defined()) {
      for (int64_t s : api::host_ints(idx32)) {
        // Negative: padding (packed, speculative), or python's wrap (dense).
        FLASHINFER_CHECK(s < slots && (packed || spec || backend == "cake" || s >= -slots), op,
                         "ssm_state_indices", "slot ", s, " is outside the state pool of ", slots,
                         " slots");
      }
    }
    if (src_idx32.defined()) {
      for (int64_t s : api::host_ints(src_idx32)) {
        FLASHINFER_CHECK(s < source->size(0), op, "initial_state_indices", "slot ", s,
                         " is outside initial_state_source's ", source->size(0), " slots");
      }
    }
  }
  // The output: the caller's when its shape, dtype and device fit, else a new one (upstream).
  const Shape out_shape = {B, T, HV, V};
  if (!(given(output) && output->shape() == out_shape && output->dtype() == DType::kBFloat16 &&
        output->device() == q.device() && output->stride(-1) == 1)) {
    output = Tensor::zeros(out_shape, DType::kBFloat16, q.device());
  } else {
    api::check_writable(*output, op, "output");
    output->fill_(0.0);  // padded and inactive positions are zeros
  }

  KdaParams p;
  p.num_seqs = packed ? N : B;
  p.T = packed ? (spec ? Tseq : T) : T;
  if (packed) {
    p.cu_seqlens = cu_seqlens->data_ptr();
    p.cu_seqlens_i64 = cu_seqlens->dtype() == DType::kInt64;
    p.total_tokens = T;
  }
  p.H = H, p.HV = HV, p.K = K;
  p.q = kda_io(q4), p.k = kda_io(k4), p.v = kda_io(v4), p.g = kda_io(g4);
  p.beta = {b4.data_ptr(), b4.stride(0), b4.stride(1), b4.stride(2)};
  p.gate = !gate_in_kernel ? kernels::KdaGate::kPrecomputed
           : lower_bound   ? kernels::KdaGate::kLowerBound
                           : kernels::KdaGate::kSoftplus;
  p.lower_bound = lower_bound ? static_cast<float>(*lower_bound) : 0.0f;
  if (gate_in_kernel) {
    p.A_log = A_log->data<float>();
    if (given(dt_bias)) p.dt_bias = dt_bias->data<float>();
  }
  p.beta_is_logit = beta_is_logit;
  p.l2norm = l2norm;
  p.scale = static_cast<float>(sc);
  p.out = output->data_ptr();
  p.out_seq = output->stride(0), p.out_tok = output->stride(1), p.out_head = output->stride(2);
  p.state = pool.data_ptr();
  p.state_dtype = DType::kBFloat16;
  p.slots = slots;
  p.state_stride_slot = pool.stride(0);
  if (given(source)) {
    p.source = source->data_ptr();
    p.source_slots = source->size(0);
    p.source_stride_slot = source->stride(0);
    p.src_idx = src_idx32.data<int32_t>();
  }
  if (idx32.defined()) {
    p.idx = idx32.data<int32_t>();
    p.idx_cols = idx32.dim() == 2 ? idx32.size(1) : 1;
    p.idx_stride0 = p.idx_cols;
  }
  // Dense rows index like python (-1: the last slot), except for backend "cake", whose frozen
  // kernel SGLang calls with -1 as CUDA-graph padding.
  p.wrap_negative = !packed && !spec && backend != "cake";
  p.spec = spec;
  if (acc32.defined()) p.num_accepted = acc32.data<int32_t>();
  if (given(checkpoints)) {
    p.checkpoint_every = cp_every;
    p.checkpoints = checkpoints->data_ptr();
    p.checkpoint_rows = checkpoints->size(0);
    p.checkpoint_starts = cp_starts->data<int64_t>();
    if (given(cp_idx)) p.checkpoint_idx = cp_idx->data<int32_t>();
  }
  api::launch(kKdaKernels, p, q.device(), op, "q");

  KdaOutput r;
  r.output = *output;
  if (output_final_state) {
    if (!packed && !spec && idx32.defined()) {
      // Upstream gathers the rows' slots into a compact copy and scatters it back: the copy.
      Tensor fs = Tensor::zeros({B, HV, V, K}, DType::kBFloat16, q.device());
      const auto ids = api::host_ints(idx32);
      for (int64_t b = 0; b < B; ++b) {
        const int64_t s = ids[b] < 0 && backend != "cake" ? ids[b] + slots : ids[b];
        FLASHINFER_CHECK(s >= -1 && s < slots, op, "ssm_state_indices", "row ", b, "'s slot ",
                         ids[b], " is outside the state pool of ", slots, " slots");
        if (s < 0) continue;  // a padded row (cake): its final_state row stays unset
        Tensor row = fs.select(0, b);
        row.copy_(pool.select(0, s));
      }
      r.final_state = fs;
    } else {
      r.final_state = pool;
    }
  }
  if (given(checkpoints)) r.state_checkpoints = *checkpoints;
  return r;
}

// ---- fused_kda_decode, packed_kda_decode (flashinfer.kda_decode) -------------------------------

void need_dtype(const Tensor& t, DType d, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  FLASHINFER_CHECK(t.dtype() == d, op, arg, arg, " must have dtype ", dtype_torch_name(d), ", got ",
                   dtype_torch_name(t.dtype()));
}

Tensor fused_impl(const Tensor& x, const Tensor& weight, const Tensor& conv_state,
                  const Tensor& raw_gate, const Tensor& raw_beta, const Tensor& A_log,
                  const Tensor& dt_bias, const Tensor& idx, const Tensor& state,
                  const Tensor& output_gate, const Tensor& norm_weight,
                  std::optional<double> lower_bound, double norm_eps, std::optional<Tensor> output,
                  std::string_view backend, const std::optional<std::string>& state_indices_mode) {
  const char* op = "fused_kda_decode";
  constexpr int64_t D = 128;
  // Upstream 0.7.4 (kda_kernels/fused_kda_decode.py) checks both keywords first. The mode is a
  // promise about state_indices that only its Cake dispatcher reads: rows run in order here,
  // which is what Cake's "repeated_positive" defines for a repeated slot.
  FLASHINFER_CHECK(backend == "cute-dsl" || backend == "cake" || backend == "auto", op, "backend",
                   "backend must be 'cute-dsl', 'cake', or 'auto', got '", backend, "'");
  if (state_indices_mode) {
    const std::string& m = *state_indices_mode;
    FLASHINFER_CHECK(m == "positive_unique" || m == "unique_or_null" || m == "repeated_positive",
                     op, "state_indices_mode",
                     "state_indices_mode must be 'positive_unique', 'unique_or_null', or "
                     "'repeated_positive', got '",
                     m, "'");
  }
  FLASHINFER_CHECK(backend != "cake" || state_indices_mode.has_value(), op, "state_indices_mode",
                   "backend='cake' requires the host-known state_indices_mode assertion");
  // Cake's routes are SM100a / SM103a kernels; upstream raises this wherever none applies.
  FLASHINFER_CHECK_CODE(backend != "cake", ErrorCode::kUnsupported, op, "backend",
                        "backend='cake' does not have a route for this architecture, layout, "
                        "dtype, scalar configuration, and state_indices_mode");
  need_dtype(x, DType::kBFloat16, op, "x");
  FLASHINFER_CHECK(x.dim() == 2 && x.size(1) % (3 * D) == 0, op, "x",
                   "x must have shape [num_rows, 3 * num_heads * 128]");
  const int64_t R = x.size(0), H = x.size(1) / (3 * D);
  FLASHINFER_CHECK(R >= 1, op, "x", "x must contain at least one decode row");
  FLASHINFER_CHECK(
      H == 8 || H == 12 || H == 16 || H == 24 || H == 32 || H == 48 || H == 64 || H == 96, op, "x",
      "num_heads must be one of (8, 12, 16, 24, 32, 48, 64, 96), got " + std::to_string(H));
  FLASHINFER_CHECK(x.stride(1) == 1, op, "x", "x must be contiguous in its channel dimension");
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{weight, "weight"},
                                {conv_state, "conv_state"},
                                {raw_gate, "raw_gate"},
                                {raw_beta, "raw_beta"},
                                {A_log, "A_log"},
                                {dt_bias, "dt_bias"},
                                {idx, "state_indices"},
                                {state, "state"},
                                {output_gate, "output_gate"},
                                {norm_weight, "norm_weight"}}) {
    api::check_defined(t, op, name);
    FLASHINFER_CHECK(t.device() == x.device(), op, name, name, " must be on the same device as x");
  }
  const int64_t C = 3 * H * D;
  need_dtype(weight, DType::kFloat32, op, "weight");
  FLASHINFER_CHECK(weight.shape() == Shape({3, 4, H * D}) && weight.is_contiguous(), op, "weight",
                   "weight must be contiguous with shape [3, 4, H * 128]");
  need_dtype(conv_state, DType::kBFloat16, op, "conv_state");
  // Upstream takes the SD layout (channels contiguous, history entries 3 H 128 apart) and, since
  // 0.7.4, DS (history contiguous); any layout is read through its strides here (a dump or a
  // snapshot may hold it compacted).
  FLASHINFER_CHECK(
      conv_state.dim() == 3 && conv_state.size(1) == C && conv_state.size(2) == 3, op, "conv_state",
      "conv_state must have shape [slots, 3 * H * 128, 3] and use the SD (strides [slot, 1, 3 * "
      "H * 128]) or DS (strides [slot, 3, 1]) cache layout");
  need_dtype(raw_gate, DType::kBFloat16, op, "raw_gate");
  FLASHINFER_CHECK(raw_gate.shape() == Shape({1, R, H, D}), op, "raw_gate",
                   "raw_gate must have shape [1, num_rows, H, 128]");
  FLASHINFER_CHECK(raw_gate.is_contiguous(), op, "raw_gate", "raw_gate must be contiguous");
  need_dtype(raw_beta, DType::kBFloat16, op, "raw_beta");
  FLASHINFER_CHECK(raw_beta.shape() == Shape({1, R, H}) && raw_beta.stride(2) == 1, op, "raw_beta",
                   "raw_beta must have shape [1, num_rows, H]");
  need_dtype(A_log, DType::kFloat32, op, "A_log");
  FLASHINFER_CHECK(A_log.shape() == Shape({H}) && A_log.is_contiguous(), op, "A_log",
                   "A_log must be contiguous with shape [H]");
  need_dtype(dt_bias, DType::kFloat32, op, "dt_bias");
  FLASHINFER_CHECK(dt_bias.shape() == Shape({H * D}) && dt_bias.is_contiguous(), op, "dt_bias",
                   "dt_bias must be contiguous with shape [H * 128]");
  need_dtype(idx, DType::kInt32, op, "state_indices");
  FLASHINFER_CHECK(idx.shape() == Shape({R}) && idx.is_contiguous(), op, "state_indices",
                   "state_indices must be contiguous with shape [num_rows]");
  api::check_defined(state, op, "state");
  FLASHINFER_CHECK(state.dtype() == DType::kFloat32 || state.dtype() == DType::kBFloat16, op,
                   "state", "state must have dtype (torch.float32, torch.bfloat16), got ",
                   dtype_torch_name(state.dtype()));
  FLASHINFER_CHECK(state.dim() == 4 && state.size(1) == H && state.size(2) == D &&
                       state.size(3) == D && state.stride(3) == 1 && state.stride(2) == D &&
                       state.stride(1) == D * D && state.stride(0) >= H * D * D,
                   op, "state",
                   "state must have shape [slots, H, 128, 128] with contiguous slot contents");
  FLASHINFER_CHECK(state.size(0) == conv_state.size(0), op, "state",
                   "conv_state and state must have the same number of cache slots");
  need_dtype(output_gate, DType::kBFloat16, op, "output_gate");
  const bool og3 = output_gate.shape() == Shape({R, H, D});
  FLASHINFER_CHECK(og3 || output_gate.shape() == Shape({1, R, H, D}), op, "output_gate",
                   "output_gate must have shape [num_rows, H, 128] or [1, num_rows, H, 128]");
  FLASHINFER_CHECK(output_gate.stride(-1) == 1 && output_gate.stride(-2) == D, op, "output_gate",
                   "output_gate must have contiguous head rows");
  need_dtype(norm_weight, DType::kFloat32, op, "norm_weight");
  FLASHINFER_CHECK(norm_weight.shape() == Shape({D}) && norm_weight.is_contiguous(), op,
                   "norm_weight", "norm_weight must be contiguous with shape [128]");
  if (lower_bound)
    FLASHINFER_CHECK(*lower_bound < 0.0, op, "lower_bound", "lower_bound must be negative");
  FLASHINFER_CHECK(norm_eps >= 0.0, op, "norm_eps", "norm_eps must be non-negative");
  if (output && output->defined()) {
    FLASHINFER_CHECK(output->device() == x.device(), op, "output",
                     "output must be on the same device as x");
    FLASHINFER_CHECK(output->dtype() == DType::kBFloat16 &&
                         output->shape() == Shape({1, R, H, D}) && output->is_contiguous(),
                     op, "output", "output must be contiguous with shape [1, num_rows, H, 128]");
    api::check_writable(*output, op, "output");
  } else {
    output = Tensor::empty({1, R, H, D}, DType::kBFloat16, x.device());
  }
  api::check_writable(conv_state, op, "conv_state");
  api::check_writable(state, op, "state");
  if (idx.device().is_cpu()) {
    for (int64_t sl : api::host_ints(idx)) {
      FLASHINFER_CHECK(sl < state.size(0), op, "state_indices", "slot ", sl,
                       " is outside the cache's ", state.size(0), " slots");
    }
  }
  kernels::FusedKdaParams p;
  p.R = R, p.H = H;
  p.x = x.data_ptr(), p.x_row = x.stride(0);
  p.weight = weight.data<float>();
  p.conv_state = conv_state.data_ptr(), p.cs_slot = conv_state.stride(0);
  p.cs_chan = conv_state.stride(1), p.cs_hist = conv_state.stride(2);
  p.raw_gate = raw_gate.data_ptr();
  p.raw_beta = raw_beta.data_ptr(), p.b_row = raw_beta.stride(1), p.b_head = raw_beta.stride(2);
  p.A_log = A_log.data<float>(), p.dt_bias = dt_bias.data<float>();
  p.idx = idx.data<int32_t>();
  p.state = state.data_ptr(), p.state_dtype = state.dtype();
  p.slots = state.size(0), p.state_slot = state.stride(0);
  p.out_gate = output_gate.data_ptr();
  p.og_row = og3 ? output_gate.stride(0) : output_gate.stride(1);
  p.norm_weight = norm_weight.data<float>();
  p.has_lower_bound = lower_bound.has_value();
  p.lower_bound = lower_bound ? static_cast<float>(*lower_bound) : 0.0f;
  p.norm_eps = static_cast<float>(norm_eps);
  p.out = output->data_ptr();
  api::launch(kFusedKdaKernels, p, x.device(), op, "x");
  return *output;
}

Tensor packed_impl(const Tensor& mixed, const Tensor& raw_gate, const Tensor& raw_beta,
                   const Tensor& A_log, const Tensor& dt_bias, const Tensor& state,
                   const Tensor& idx, std::optional<Tensor> output) {
  const char* op = "packed_kda_decode";
  constexpr int64_t H = 12, D = 128;
  api::check_defined(mixed, op, "mixed_qkv");
  FLASHINFER_CHECK(mixed.dim() == 2 && mixed.size(1) == 3 * H * D &&
                       mixed.dtype() == DType::kBFloat16 && mixed.stride(1) == 1,
                   op, "mixed_qkv", "mixed_qkv must have shape [B, 4608]");
  const int64_t B = mixed.size(0);
  FLASHINFER_CHECK(
      B >= 1 && B <= 65535, op, "mixed_qkv",
      "packed KDA T=1 batch must be in the CUDA grid.y range [1, 65535], got " + std::to_string(B));
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{raw_gate, "raw_gate"},
                                {raw_beta, "raw_beta"},
                                {A_log, "A_log"},
                                {dt_bias, "dt_bias"},
                                {state, "state"},
                                {idx, "state_indices"}}) {
    api::check_defined(t, op, name);
    api::check_same_device(t, mixed, op, name, "mixed_qkv");
  }
  FLASHINFER_CHECK(raw_gate.dtype() == DType::kBFloat16 && raw_gate.shape() == Shape({B, H * D}) &&
                       raw_gate.stride(1) == 1,
                   op, "raw_gate",
                   "raw_gate must be bf16 [B, 1536] with a contiguous last dimension");
  FLASHINFER_CHECK(raw_beta.dtype() == DType::kBFloat16 && raw_beta.shape() == Shape({B, H}), op,
                   "raw_beta", "raw_beta must be bf16 [B, 12]");
  FLASHINFER_CHECK(
      A_log.dtype() == DType::kFloat32 && A_log.shape() == Shape({H}) && A_log.is_contiguous(), op,
      "A_log", "A_log must be contiguous fp32 [12]");
  FLASHINFER_CHECK(dt_bias.dtype() == DType::kFloat32 && dt_bias.shape() == Shape({H * D}) &&
                       dt_bias.is_contiguous(),
                   op, "dt_bias", "dt_bias must be contiguous fp32 [1536]");
  FLASHINFER_CHECK(state.dtype() == DType::kBFloat16 && state.dim() == 4 && state.size(1) == H &&
                       state.size(2) == D && state.size(3) == D && state.stride(3) == 1 &&
                       state.stride(2) == D && state.stride(1) == D * D,
                   op, "state", "state must be bf16 [N, 12, 128, 128] with compact slots");
  FLASHINFER_CHECK(idx.dtype() == DType::kInt32 && idx.shape() == Shape({B}) && idx.is_contiguous(),
                   op, "state_indices", "state_indices must be contiguous int32 [B]");
  api::check_writable(state, op, "state");
  if (output && output->defined()) {
    FLASHINFER_CHECK(output->dtype() == DType::kBFloat16 &&
                         output->shape() == Shape({B, 1, H, D}) && output->is_contiguous(),
                     op, "output", "output must be contiguous with shape [B,1,12,128]");
    api::check_same_device(*output, mixed, op, "output", "mixed_qkv");
    api::check_writable(*output, op, "output");
    output->fill_(0.0);  // inactive rows are zeros
  } else {
    output = Tensor::zeros({B, 1, H, D}, DType::kBFloat16, mixed.device());
  }
  if (idx.device().is_cpu()) {
    for (int64_t sl : api::host_ints(idx)) {
      FLASHINFER_CHECK(sl < state.size(0), op, "state_indices", "slot ", sl,
                       " is outside the state's ", state.size(0), " slots");
    }
  }
  api::check_upstream_arch(op, "mixed_qkv", mixed.device());
  // The KDA step with packed_kda_decode's fixed parameters: q, k, v the three thirds of each
  // row, the lower-bound gate at -5, logit betas, L2 norms, scale 128^-0.5.
  KdaParams p;
  p.num_seqs = B, p.T = 1, p.H = H, p.HV = H, p.K = D;
  const auto* base = static_cast<const char*>(mixed.data_ptr());
  const int64_t row = mixed.stride(0);
  p.q = {base, row, 0, D};
  p.k = {base + H * D * 2, row, 0, D};
  p.v = {base + 2 * H * D * 2, row, 0, D};
  p.g = {raw_gate.data_ptr(), raw_gate.stride(0), 0, D};
  p.beta = {raw_beta.data_ptr(), raw_beta.stride(0), 0, raw_beta.stride(1)};
  p.gate = kernels::KdaGate::kLowerBound;
  p.lower_bound = -5.0f;
  p.A_log = A_log.data<float>(), p.dt_bias = dt_bias.data<float>();
  p.beta_is_logit = true, p.l2norm = true;
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  p.out = output->data_ptr();
  p.out_seq = output->stride(0), p.out_tok = output->stride(1), p.out_head = output->stride(2);
  p.state = state.data_ptr(), p.state_dtype = DType::kBFloat16;
  p.slots = state.size(0), p.state_stride_slot = state.stride(0);
  p.idx = idx.data<int32_t>();  // negative: an inactive row (zeros, nothing stored)
  api::launch(kKdaKernels, p, mixed.device(), op, "mixed_qkv");
  return *output;
}
}  // namespace

KdaOutput recurrent_kda(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
    std::optional<Tensor> A_log, std::optional<Tensor> dt_bias, std::optional<double> scale,
    std::optional<Tensor> initial_state, bool output_final_state, bool use_qk_l2norm_in_kernel,
    bool use_gate_in_kernel, std::optional<double> lower_bound, std::optional<Tensor> cu_seqlens,
    std::optional<Tensor> ssm_state_indices, std::optional<int64_t> num_spec_tokens,
    std::optional<Tensor> num_accepted_tokens, std::optional<Tensor> output,
    std::optional<Tensor> initial_state_source, std::optional<Tensor> initial_state_indices,
    bool beta_is_logit, std::optional<Tensor> seq_order, std::optional<Value> prefill_workspace,
    std::optional<Tensor> state_checkpoints, std::optional<Tensor> checkpoint_cu_starts,
    int64_t checkpoint_every_n_tokens, std::optional<Tensor> checkpoint_state_indices,
    bool disable_state_update, std::optional<Tensor> correction_cache,
    std::optional<Tensor> kg_cache, std::string backend) {
  return call_op<&recurrent_kda>(
      [&] {
        return kda_impl(q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state,
                        use_qk_l2norm_in_kernel, use_gate_in_kernel, lower_bound, cu_seqlens,
                        ssm_state_indices, num_spec_tokens, num_accepted_tokens, output,
                        initial_state_source, initial_state_indices, beta_is_logit, seq_order,
                        prefill_workspace && !prefill_workspace->is_none(), state_checkpoints,
                        checkpoint_cu_starts, checkpoint_every_n_tokens, checkpoint_state_indices,
                        disable_state_update, correction_cache, kg_cache, backend);
      },
      q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state,
      use_qk_l2norm_in_kernel, use_gate_in_kernel, lower_bound, cu_seqlens, ssm_state_indices,
      num_spec_tokens, num_accepted_tokens, output, initial_state_source, initial_state_indices,
      beta_is_logit, seq_order, prefill_workspace, state_checkpoints, checkpoint_cu_starts,
      checkpoint_every_n_tokens, checkpoint_state_indices, disable_state_update, correction_cache,
      kg_cache, backend);
}

Tensor fused_kda_decode(const Tensor& x, const Tensor& weight, const Tensor& conv_state,
                        const Tensor& raw_gate, const Tensor& raw_beta, const Tensor& A_log,
                        const Tensor& dt_bias, const Tensor& state_indices, const Tensor& state,
                        const Tensor& output_gate, const Tensor& norm_weight,
                        std::optional<double> lower_bound, double norm_eps,
                        std::optional<Tensor> output, std::string_view backend,
                        std::optional<std::string> state_indices_mode) {
  return call_op<&fused_kda_decode>(
      [&] {
        return fused_impl(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices,
                          state, output_gate, norm_weight, lower_bound, norm_eps, output, backend,
                          state_indices_mode);
      },
      x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state, output_gate,
      norm_weight, lower_bound, norm_eps, output, backend, state_indices_mode);
}

Tensor packed_kda_decode(const Tensor& mixed_qkv, const Tensor& raw_gate, const Tensor& raw_beta,
                         const Tensor& A_log, const Tensor& dt_bias, const Tensor& state,
                         const Tensor& state_indices, std::optional<Tensor> output) {
  return call_op<&packed_kda_decode>(
      [&] {
        return packed_impl(mixed_qkv, raw_gate, raw_beta, A_log, dt_bias, state, state_indices,
                           output);
      },
      mixed_qkv, raw_gate, raw_beta, A_log, dt_bias, state, state_indices, output);
}

namespace {

// Bench: packed decode as SGLang runs it: batch_size sequences of one token, num_qo_heads value
// heads over num_kv_heads query heads, K = V = head_dim_qk (64 or 128), the lower-bound gate
// (-5), a pool of 2 * batch_size slots read at odd slots.
BenchCase bench_kda(const BenchShape& s, Device dev) {
  const int64_t N = s.batch_size, HV = s.num_qo_heads, H = std::max<int64_t>(1, s.num_kv_heads);
  const int64_t K = s.head_dim_qk <= 64 ? 64 : 128;
  const DType bf = DType::kBFloat16;
  const uint64_t seed = s.random_seed;
  using api::bench::random_tensor;
  std::vector<int64_t> cu, idx;
  for (int64_t n = 0; n <= N; ++n) cu.push_back(n);
  for (int64_t n = 0; n < N; ++n) idx.push_back(2 * n + 1);
  BenchCase c = api::bench::invoke_case(
      kKdaOp,
      {Value(random_tensor({1, N, H, K}, bf, dev, seed)),
       Value(random_tensor({1, N, H, K}, bf, dev, seed + 1)),
       Value(random_tensor({1, N, HV, K}, bf, dev, seed + 2)),
       Value(random_tensor({1, N, HV, K}, bf, dev, seed + 3, -1.0, 1.0)),
       Value(random_tensor({1, N, HV}, bf, dev, seed + 4, -2.0, 2.0))},
      {{"A_log", Value(random_tensor({H}, DType::kFloat32, dev, seed + 5, -1.0, 0.5))},
       {"dt_bias", Value(random_tensor({H * K}, DType::kFloat32, dev, seed + 6, -0.5, 0.5))},
       {"initial_state", Value(random_tensor({2 * N, HV, K, K}, bf, dev, seed + 7, -0.1, 0.1))},
       {"use_gate_in_kernel", Value(true)},
       {"lower_bound", Value(-5.0)},
       {"cu_seqlens", Value(api::bench::int32_tensor(cu, dev))},
       {"ssm_state_indices", Value(api::bench::int32_tensor(idx, dev))},
       {"beta_is_logit", Value(true)}});
  c.bytes = static_cast<double>(N * HV * K * K) * 4.0 +
            static_cast<double>(N * (2 * H * K + 3 * HV * K)) * 2.0;
  c.flops = static_cast<double>(N * HV * K * K) * 8.0;
  return c;
}

// fused_kda_decode: batch_size rows, num_qo_heads heads (one of 12, 24, 32, 48, 96), an fp32
// state pool of 2 * batch_size + 1 slots (slot 0 the null slot) read at odd slots.
BenchCase bench_fused_kda(const BenchShape& s, Device dev) {
  const int64_t R = s.batch_size, D = 128;
  int64_t H = 12;
  for (int64_t c : {12, 24, 32, 48, 96}) {
    if (c <= s.num_qo_heads) H = c;
  }
  const int64_t C = 3 * H * D, slots = 2 * R + 1;
  const DType bf = DType::kBFloat16;
  const uint64_t seed = s.random_seed;
  using api::bench::random_tensor;
  std::vector<int64_t> idx;
  for (int64_t r = 0; r < R; ++r) idx.push_back(2 * r + 1);
  Tensor cs = random_tensor({slots, 3, C}, bf, dev, seed + 2, -1.0, 1.0).transpose(1, 2);
  BenchCase c = api::bench::invoke_case(
      "fused_kda_decode",
      {Value(random_tensor({R, C}, bf, dev, seed)),
       Value(random_tensor({3, 4, H * D}, DType::kFloat32, dev, seed + 1, -0.5, 0.5)), Value(cs),
       Value(random_tensor({1, R, H, D}, bf, dev, seed + 3, -1.0, 1.0)),
       Value(random_tensor({1, R, H}, bf, dev, seed + 4, -2.0, 2.0)),
       Value(random_tensor({H}, DType::kFloat32, dev, seed + 5, -1.0, 0.5)),
       Value(random_tensor({H * D}, DType::kFloat32, dev, seed + 6, -0.5, 0.5)),
       Value(api::bench::int32_tensor(idx, dev)),
       Value(random_tensor({slots, H, D, D}, DType::kFloat32, dev, seed + 7, -0.1, 0.1)),
       Value(random_tensor({R, H, D}, bf, dev, seed + 8)),
       Value(random_tensor({D}, DType::kFloat32, dev, seed + 9, 0.5, 1.5))});
  c.bytes = static_cast<double>(R * H * D * D) * 8.0 + static_cast<double>(R * C) * 2.0 * 5.0;
  c.flops = static_cast<double>(R * H * D * D) * 8.0;
  return c;
}

// packed_kda_decode: batch_size rows of its fixed shape (12 heads of 128), rows 6144 elements
// apart as upstream's tests pad them, a pool of 2 * batch_size slots read at odd slots.
BenchCase bench_packed_kda(const BenchShape& s, Device dev) {
  const int64_t B = s.batch_size, H = 12, D = 128;
  const DType bf = DType::kBFloat16;
  const uint64_t seed = s.random_seed;
  using api::bench::random_tensor;
  std::vector<int64_t> idx;
  for (int64_t b = 0; b < B; ++b) idx.push_back(2 * b + 1);
  Tensor rows = random_tensor({B, 6144}, bf, dev, seed, -1.0, 1.0);
  BenchCase c = api::bench::invoke_case(
      "packed_kda_decode",
      {Value(rows.slice(1, 0, 3 * H * D)),
       Value(random_tensor({B, H * D}, bf, dev, seed + 1, -1.0, 1.0)),
       Value(random_tensor({B, H}, bf, dev, seed + 2, -2.0, 2.0)),
       Value(random_tensor({H}, DType::kFloat32, dev, seed + 3, -1.0, 0.5)),
       Value(random_tensor({H * D}, DType::kFloat32, dev, seed + 4, -0.5, 0.5)),
       Value(random_tensor({2 * B, H, D, D}, bf, dev, seed + 5, -0.1, 0.1)),
       Value(api::bench::int32_tensor(idx, dev))});
  c.bytes = static_cast<double>(B * H * D * D) * 4.0 + static_cast<double>(B * 5 * H * D) * 2.0;
  c.flops = static_cast<double>(B * H * D * D) * 8.0;
  return c;
}
}  // namespace

namespace detail {

void register_kda_ops(OpRegistry& r) {
  declare<&recurrent_kda>(
      r,
      {.name = "recurrent_kda",
       .module = "flashinfer.kda",
       .summary = "Kimi delta attention: decode, speculative verify and prefill on a state pool"},
      "q", "k", "v", "g", "beta", "A_log", "dt_bias", "scale", arg("initial_state").mut(),
      arg("output_final_state", false), arg("use_qk_l2norm_in_kernel", true),
      arg("use_gate_in_kernel", false), "lower_bound", "cu_seqlens", "ssm_state_indices",
      "num_spec_tokens", "num_accepted_tokens", arg("output").mut(), "initial_state_source",
      "initial_state_indices", arg("beta_is_logit", false), "seq_order", "prefill_workspace",
      arg("state_checkpoints").mut(), "checkpoint_cu_starts",
      arg("checkpoint_every_n_tokens", int64_t{0}), "checkpoint_state_indices",
      arg("disable_state_update", false).kw(), arg("correction_cache").mut().kw(),
      arg("kg_cache").mut().kw(), arg("backend", "auto").kw());
  api::register_backends(kKdaOp, kKdaKernels);
  declare<&fused_kda_decode>(
      r,
      {.name = "fused_kda_decode",
       .module = "flashinfer.kda_decode",
       .summary = "Kimi delta attention decode fused with its conv and gated RMSNorm"},
      "x", "weight", arg("conv_state").mut(), "raw_gate", "raw_beta", "A_log", "dt_bias",
      "state_indices", arg("state").mut(), "output_gate", "norm_weight", arg("lower_bound", -5.0),
      arg("norm_eps", 1e-5), arg("output").mut(), arg("backend", "cute-dsl").kw(),
      arg("state_indices_mode").kw());
  declare<&packed_kda_decode>(
      r,
      {.name = "packed_kda_decode",
       .module = "flashinfer.kda_decode",
       .summary = "Kimi delta attention decode of packed q | k | v rows (12 heads of 128)"},
      "mixed_qkv", "raw_gate", "raw_beta", "A_log", "dt_bias", arg("state").mut(), "state_indices",
      arg("output").mut());
  api::register_backends("fused_kda_decode", kFusedKdaKernels);
  api::register_backends("packed_kda_decode", kKdaKernels);
  register_bench_hook("fused_kda_decode", bench_fused_kda);
  register_bench_hook("packed_kda_decode", bench_packed_kda);

  register_bench_hook(kKdaOp, bench_kda);
}

}  // namespace detail

}  // namespace flashinfer
