// Gated delta rule ops (flashinfer.gdn_decode, flashinfer.gdn_prefill): declarations, checks,
// dispatch, bench hooks. One recurrence (kernels/gdn_params.h) under all four; the ops differ in
// the gates, the state layout and the index rules (docs/LINEAR_ATTENTION.md).
#include "flashinfer/ops/gdn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/device_props.h"
#include "api/kernel_table.h"
#include "flashinfer/device.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/ops/upstream_arch.h"
#include "kernels/cpu/gdn_cpu.h"
#include "kernels/gdn_params.h"
#include "replay/result_comparators.h"

#if FLASHINFER_WITH_CUDA
#include "flashinfer/stream.h"
#include "kernels/cuda/gdn_cuda.h"
#include "kernels/cuda/stream_scratch.h"
#endif

namespace flashinfer {

template <>
struct ReturnName<GdnPrefillOutput> {
  static constexpr const char* value = "Tensor | tuple[Tensor, Tensor]";
};

Value to_value(const GdnPrefillOutput& r) {
  if (!r.final_state.defined()) return Value(r.output);
  return Value::tuple({Value(r.output), Value(r.final_state)});
}

namespace {

using kernels::GdnGateRef;
using kernels::GdnParams;
using kernels::GdnStateRef;

constexpr const char* kGdnDecodeModule = "flashinfer.gdn_decode";
constexpr const char* kGdnPrefillModule = "flashinfer.gdn_prefill";

#if FLASHINFER_WITH_CUDA
// The CUDA kernel keeps a warp's K-slice of a state row in registers: up to 8 values a lane.
api::Refusal cuda_supports(const GdnParams& p) {
  if (p.K > kernels::cuda::kGdnMaxHeadDimK) {
    return {"k", "head dim K above 256 (the CUDA kernel keeps a state row in registers)"};
  }
  return {};
}
#endif

constexpr api::KernelEntry<GdnParams> kGdnKernels[] = {
    {DeviceType::kCPU, "CPU reference: the token recurrence in fp32, (sequence, head) in parallel",
     nullptr,
     [](const GdnParams& p, const api::LaunchContext&) { kernels::cpu::gated_delta_rule(p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernels: chunk_gated_delta_rule at head dims 64 / 128 in 64-token chunks on tensor "
     "cores (the chunked WY form, the state in registers); the rest a warp per state row "
     "(sequence, head, v), the row in registers across tokens",
     cuda_supports,
     [](const GdnParams& p, const api::LaunchContext& c) {
       kernels::cuda::gated_delta_rule(p, c.stream, c.enable_pdl);
     }},
#endif
};

constexpr api::KernelEntry<kernels::GdnPrefillPrepParams> kGdnPrepKernels[] = {
    {DeviceType::kCPU, "CPU reference: the q / k L2 norms (sums in order) and the gate transforms",
     nullptr,
     [](const kernels::GdnPrefillPrepParams& p, const api::LaunchContext&) {
       kernels::cpu::gdn_prefill_prepare(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernels: a warp per q / k head row for the L2 norms, a thread per gate", nullptr,
     [](const kernels::GdnPrefillPrepParams& p, const api::LaunchContext& c) {
       kernels::cuda::gdn_prefill_prepare(p, c.stream, c.enable_pdl);
     }},
#endif
};

constexpr api::KernelEntry<kernels::GdnFusedPrologueParams> kGdnFusedPrologueKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: the b/a GEMV (sums in order), the conv rows from the pool as it was, then "
     "each slot's last window written back",
     nullptr,
     [](const kernels::GdnFusedPrologueParams& p, const api::LaunchContext&) {
       kernels::cpu::gdn_fused_decode_prologue(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernels: the b/a GEMV (a block per request and 32 columns), the conv outputs and the "
     "window write-back (a thread per request and channel); then the gated delta rule's kernel",
     nullptr,
     [](const kernels::GdnFusedPrologueParams& p, const api::LaunchContext& c) {
       kernels::cuda::gdn_fused_decode_prologue(p, c.stream, c.enable_pdl);
     }},
#endif
};

std::string_view tname(const Tensor& t) { return dtype_torch_name(t.dtype()); }

void check_io(const Tensor& t, const Tensor& q, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  api::check_dtype_in(t, {DType::kFloat16, DType::kBFloat16}, op, arg);
  api::check_same_dtype(t, q, op, arg, "q");
  api::check_same_device(t, q, op, arg, "q");
  FLASHINFER_CHECK(t.numel() == 0 || t.stride(-1) == 1, op, arg,
                   "must have stride 1 in the last (head) dimension, got ", t.stride(-1));
}

// A 1-D int32 / int64 index tensor on q's device, contiguous, of n entries (any when nullopt).
void check_index_vector(const Tensor& t, std::optional<int64_t> n, const Tensor& q, const char* op,
                        const char* arg) {
  api::check_dim(t, {1}, op, arg);
  api::check_dtype_in(t, {DType::kInt32, DType::kInt64}, op, arg);
  api::check_same_device(t, q, op, arg, "q");
  FLASHINFER_CHECK(!n || t.size(0) == *n, op, arg, "expected shape [", n.value_or(-1), "], got ",
                   shape_to_string(t.shape()));
  FLASHINFER_CHECK(t.stride(0) == 1 || t.size(0) <= 1, op, arg, "must be contiguous");
}

// What a negative index means to an op: an error, any negative a skip, or -1 alone a skip
// (chunk_gated_delta_rule's output_state_indices / checkpoint_state_indices).
enum class SlotNegatives { kRefused, kAllowed, kMinusOneOnly };

// Every value of an index tensor below `slots`, its negatives as `neg` says (CPU tensors; a
// device tensor is read on the device only).
void check_slots(const Tensor& t, int64_t slots, SlotNegatives neg, const char* op,
                 const char* arg) {
  if (!t.device().is_cpu()) return;
  const auto v = api::host_ints(t);
  for (size_t i = 0; i < v.size(); ++i) {
    if (neg == SlotNegatives::kMinusOneOnly) {
      FLASHINFER_CHECK(v[i] == -1 || (v[i] >= 0 && v[i] < slots), op, arg, arg,
                       " must contain -1 or slots in [0, ", slots, "); entry ", i, " is ", v[i]);
      continue;
    }
    const bool negatives_allowed = neg == SlotNegatives::kAllowed;
    FLASHINFER_CHECK(v[i] < slots && (negatives_allowed || v[i] >= 0), op, arg, "entry ", i, " is ",
                     v[i], ", outside [", negatives_allowed ? "-inf" : "0", ", ", slots,
                     ") (the state pool's slots)");
  }
}

GdnStateRef state_ref(const Tensor& s, bool k_last) {
  GdnStateRef r;
  r.data = s.data_ptr();
  r.dtype = s.dtype();
  r.slots = s.size(0);
  r.stride_slot = s.stride(0);
  r.stride_head = s.stride(1);
  r.stride_k = k_last ? s.stride(3) : s.stride(2);
  r.stride_v = k_last ? s.stride(2) : s.stride(3);
  return r;
}

GdnGateRef gate_ref(const Tensor& t, bool per_seq) {
  GdnGateRef g;
  g.data = t.data_ptr();
  g.dtype = t.dtype();
  if (per_seq) {
    g.stride_seq = t.stride(0);
    g.stride_tok = t.stride(1);
    g.stride_head = t.stride(2);
  } else {
    g.stride_tok = t.stride(0);
    g.stride_head = t.stride(1);
  }
  return g;
}

// A_log and dt_bias are read as [HV] arrays of unit stride.
void check_unit_vectors(const Tensor& A_log, const Tensor& dt_bias, const char* op) {
  FLASHINFER_CHECK(A_log.numel() <= 1 || A_log.stride(0) == 1, op, "A_log",
                   "must be contiguous, got stride ", A_log.stride(0));
  FLASHINFER_CHECK(dt_bias.numel() <= 1 || dt_bias.stride(0) == 1, op, "dt_bias",
                   "must be contiguous, got stride ", dt_bias.stride(0));
}

// The decode ops' shared arguments: q, k [B, T, H, K], v [B, T, HV, V], a, b [B, T, HV], A_log
// [HV] fp32, dt_bias [HV] fp32 / bf16; the output [B, T, HV, V] (given, or zeros of q's dtype).
GdnParams decode_params(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& A_log, const Tensor& a, const Tensor& dt_bias,
                        const Tensor& b, std::optional<double> scale, bool l2norm,
                        std::optional<Tensor>& output, std::optional<DType> out_dtype = {}) {
  api::check_defined(q, op, "q");
  api::check_dim(q, {4}, op, "q");
  api::check_dtype_in(q, {DType::kFloat16, DType::kBFloat16}, op, "q");
  check_io(q, q, op, "q");
  check_io(k, q, op, "k");
  api::check_shape_eq(k, q.shape(), op, "k");
  check_io(v, q, op, "v");
  api::check_dim(v, {4}, op, "v");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3);
  const int64_t HV = v.size(2), V = v.size(3);
  FLASHINFER_CHECK(v.size(0) == B && v.size(1) == T, op, "v", "expected [", B, ", ", T,
                   ", HV, V], got ", shape_to_string(v.shape()));
  FLASHINFER_CHECK(H >= 1 && HV >= H && HV % H == 0, op, "v", "its head count (", HV,
                   ") must be a positive multiple of q's (", H, ")");
  FLASHINFER_CHECK(K >= 1 && V >= 1, op, "q", "head dims must be positive (K ", K, ", V ", V, ")");
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{a, "a"}, {b, "b"}}) {
    api::check_defined(t, op, name);
    api::check_dtype_in(t, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op, name);
    api::check_shape_eq(t, {B, T, HV}, op, name);
    api::check_same_device(t, q, op, name, "q");
  }
  api::check_defined(A_log, op, "A_log");
  api::check_dtype_in(A_log, {DType::kFloat32}, op, "A_log");
  api::check_shape_eq(A_log, {HV}, op, "A_log");
  api::check_same_device(A_log, q, op, "A_log", "q");
  api::check_defined(dt_bias, op, "dt_bias");
  api::check_dtype_in(dt_bias, {DType::kFloat32, DType::kBFloat16}, op, "dt_bias");
  api::check_shape_eq(dt_bias, {HV}, op, "dt_bias");
  api::check_same_device(dt_bias, q, op, "dt_bias", "q");
  if (output && output->defined()) {
    api::check_dtype_in(*output, {DType::kBFloat16, DType::kFloat16, DType::kFloat32}, op,
                        "output");
    api::check_shape_eq(*output, {B, T, HV, V}, op, "output");
    api::check_same_device(*output, q, op, "output", "q");
  } else {
    output = Tensor::zeros({B, T, HV, V}, out_dtype.value_or(q.dtype()), q.device());
  }

  GdnParams p;
  p.num_seqs = B;
  p.T = T;
  p.H = HV;
  p.Hq = H;
  p.Hk = H;
  p.Hv = HV;
  p.K = K;
  p.V = V;
  p.io_dtype = q.dtype();
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.q_stride_seq = q.stride(0), p.q_stride_tok = q.stride(1), p.q_stride_head = q.stride(2);
  p.k_stride_seq = k.stride(0), p.k_stride_tok = k.stride(1), p.k_stride_head = k.stride(2);
  p.v_stride_seq = v.stride(0), p.v_stride_tok = v.stride(1), p.v_stride_head = v.stride(2);
  p.decode_gates = true;
  p.a = gate_ref(a, true);
  p.b = gate_ref(b, true);
  check_unit_vectors(A_log, dt_bias, op);
  p.A_log = A_log.data<float>();
  p.dt_bias = dt_bias.data_ptr();
  p.dt_bias_dtype = dt_bias.dtype();
  p.l2norm = l2norm;
  p.scale_output = false;
  p.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(K)));
  p.out = output->data_ptr();
  p.out_dtype = output->dtype();
  p.out_via_bf16 = true;  // upstream's kernels write bf16; the API casts
  p.out_stride_seq = output->stride(0);
  p.out_stride_tok = output->stride(1);
  p.out_stride_head = output->stride(2);
  FLASHINFER_CHECK(output->stride(3) == 1, op, "output",
                   "must have stride 1 in the last dimension, got ", output->stride(3));
  return p;
}

void check_state(const Tensor& s, const Shape& want, std::initializer_list<DType> dtypes,
                 const Tensor& q, const char* op, const char* arg, const char* layout) {
  api::check_defined(s, op, arg);
  api::check_dim(s, {4}, op, arg);
  api::check_dtype_in(s, dtypes, op, arg);
  api::check_same_device(s, q, op, arg, "q");
  FLASHINFER_CHECK(s.shape() == want, op, arg, "expected shape ", layout, " = ",
                   shape_to_string(want), ", got ", shape_to_string(s.shape()));
}

// An fp32 intermediate_states_buffer [>= B, >= T, HV, V, K] into `p` (gated_delta_rule_mtp, and
// the pretranspose decode with an fp32 state, which upstream 0.7.4 routes to it).
void set_intermediate_buffer(GdnParams& p, const Tensor& ib, const Tensor& q, int64_t B, int64_t T,
                             int64_t HV, const char* op) {
  api::check_dim(ib, {5}, op, "intermediate_states_buffer");
  FLASHINFER_CHECK(ib.dtype() == DType::kFloat32, op, "intermediate_states_buffer",
                   "intermediate_states_buffer must be float32, got ", tname(ib));
  api::check_same_device(ib, q, op, "intermediate_states_buffer", "q");
  FLASHINFER_CHECK(ib.size(0) >= B, op, "intermediate_states_buffer",
                   "intermediate_states_buffer first dim (", ib.size(0),
                   ") must be at least B=", B);
  FLASHINFER_CHECK(ib.size(1) >= T, op, "intermediate_states_buffer",
                   "intermediate_states_buffer second dimension (cache_steps=", ib.size(1),
                   ") must be at least T=", T);
  FLASHINFER_CHECK(ib.size(2) == HV && ib.size(3) == p.V && ib.size(4) == p.K, op,
                   "intermediate_states_buffer", "expected [>= B, >= T, HV=", HV, ", V=", p.V,
                   ", K=", p.K, "], got ", shape_to_string(ib.shape()));
  // Upstream's rows: request n's state after token t at n * cache_steps + t, cache_steps =
  // stride(0) / (HV V K); the inner axes contiguous (a cache[:, :T] view is a buffer too).
  const int64_t step = HV * p.V * p.K;
  FLASHINFER_CHECK(ib.stride(4) == 1 && ib.stride(3) == p.K && ib.stride(2) == p.V * p.K &&
                       ib.stride(1) == step && step > 0 && ib.stride(0) % step == 0 &&
                       ib.stride(0) / step >= ib.size(1),
                   op, "intermediate_states_buffer",
                   "intermediate_states_buffer must be contiguous past its first dim, with a "
                   "whole number of steps a request, got strides ",
                   shape_to_string(ib.strides()));
  p.intermediates = kernels::GdnIntermediates::kBuffer;
  p.inter_buffer = static_cast<float*>(ib.data_ptr());
  p.inter_steps = ib.stride(0) / step;
}

// Upstream 0.7.4's GDN decode backends pick a kernel ("cake_gdn": SM100-class GPUs, "rubin":
// SM107, documented bitwise equal to the generic kernel); the CPU reference stands in for each.
void check_gdn_backend(const std::string& backend, bool rubin, const Device& device,
                       const char* op) {
  FLASHINFER_CHECK(backend == "auto" || backend == "flashinfer" || backend == "cake_gdn" ||
                       (rubin && backend == "rubin"),
                   op, "backend", "unsupported GDN backend: '", backend, "'");
  if (!device.is_cuda()) return;
  const int cc = api::compute_capability(device);
  FLASHINFER_CHECK_CODE(backend != "cake_gdn" || cc == 100 || cc == 103 || cc == 107,
                        ErrorCode::kUnsupported, op, "backend",
                        "backend='cake_gdn' needs an SM100, SM103 or SM107 GPU, got compute "
                        "capability ",
                        cc / 10, ".", cc % 10);
  FLASHINFER_CHECK_CODE(backend != "rubin" || cc == 107, ErrorCode::kUnsupported, op, "backend",
                        "backend='rubin' needs compute capability 10.7, got ", cc / 10, ".",
                        cc % 10);
}

std::tuple<Tensor, Tensor> pretranspose_impl(
    const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& state,
    const Tensor& A_log, const Tensor& a, const Tensor& dt_bias, const Tensor& b,
    std::optional<double> scale, std::optional<Tensor> output, bool l2norm,
    const std::optional<Tensor>& initial_state, const std::optional<Tensor>& read_idx,
    const std::optional<Tensor>& write_idx, const std::optional<Tensor>& buffer,
    bool disable_state_update, const std::string& backend) {
  const char* op = "gated_delta_rule_decode_pretranspose";
  check_gdn_backend(backend, /*rubin=*/true, q.device(), op);
  const bool pool = initial_state && initial_state->defined();
  // Upstream's bf16-state path returns its kernel's bf16 output as is (fp16 q included); the
  // fp32 paths cast to q's dtype.
  const std::optional<Tensor>& st_arg = pool ? initial_state : state;
  const bool bf16_path = st_arg && st_arg->defined() && st_arg->dtype() == DType::kBFloat16;
  GdnParams p = decode_params(op, q, k, v, A_log, a, dt_bias, b, scale, l2norm, output,
                              bf16_path ? std::optional(DType::kBFloat16) : std::nullopt);
  const bool has_idx = read_idx && read_idx->defined();
  FLASHINFER_CHECK(pool == has_idx, op, pool ? "initial_state_indices" : "initial_state",
                   "initial_state and initial_state_indices must be provided together");
  FLASHINFER_CHECK(pool || (state && state->defined()), op, "state",
                   "Either state or initial_state must be provided");
  const bool has_write = write_idx && write_idx->defined();
  FLASHINFER_CHECK(!has_write || pool, op, "output_state_indices",
                   "output_state_indices can only be used with initial_state (pool mode)");
  const int64_t B = p.num_seqs, T = p.T, HV = p.H;
  const Tensor& s = pool ? *initial_state : *state;
  const char* s_name = pool ? "initial_state" : "state";
  api::check_dim(s, {4}, op, s_name);
  check_state(s, {pool ? s.size(0) : B, HV, p.V, p.K}, {DType::kFloat32, DType::kBFloat16}, q, op,
              s_name, pool ? "[pool_size, HV, V, K]" : "[B, HV, V, K]");
  if (pool) {
    FLASHINFER_CHECK(s.size(0) >= 1, op, "initial_state", "the state pool has no slots");
    FLASHINFER_CHECK(s.stride(3) == 1, op, "initial_state",
                     "must be K-contiguous (stride[-1] == 1) for pretranspose decode, got stride ",
                     s.stride(3));
  }
  const bool bf16_state = s.dtype() == DType::kBFloat16;
  FLASHINFER_CHECK(bf16_state || T == 1 || pool, op, "state", "fp32 state with T=", T,
                   " > 1 requires pool mode (pass initial_state and initial_state_indices "
                   "instead of state).");
  p.state_in = p.state_out = state_ref(s, true);
  if (pool) {
    check_index_vector(*read_idx, B, q, op, "initial_state_indices");
    check_slots(*read_idx, s.size(0), SlotNegatives::kAllowed, op, "initial_state_indices");
    p.read_idx = read_idx->data_ptr();
    p.read_idx_i64 = read_idx->dtype() == DType::kInt64;
    if (has_write) {
      check_index_vector(*write_idx, B, q, op, "output_state_indices");
      check_slots(*write_idx, s.size(0), SlotNegatives::kAllowed, op, "output_state_indices");
      p.write_idx = write_idx->data_ptr();
      p.write_idx_i64 = write_idx->dtype() == DType::kInt64;
    }
  }
  // Upstream's paths: the bf16 state kernels send a negative index to slot 0 (the caller's
  // null slot); the fp32 one-token kernel skips the request (zero output) and redirects a
  // negative write to slot 0; fp32 with T > 1 runs the MTP kernel (skip; no write).
  using kernels::GdnNegativeRead;
  using kernels::GdnNegativeWrite;
  if (bf16_state) {
    p.negative_read = GdnNegativeRead::kSlotZero;
    p.negative_write = GdnNegativeWrite::kSlotZero;
  } else if (T == 1) {
    p.negative_read = GdnNegativeRead::kSkipZeroOutput;
    p.negative_write = GdnNegativeWrite::kSlotZero;
  } else {
    p.negative_read = GdnNegativeRead::kSkipKeepOutput;
    p.negative_write = GdnNegativeWrite::kSkip;
  }
  // Upstream's Python casts q, k, v to bf16 on every pretranspose path (`as_bf16`), and the
  // a / b gates too except on the fp32-state one-token kernel, which reads them as they are.
  p.qkv_via_bf16 = true;
  p.gates_via_bf16 = bf16_state || T > 1;
  // Upstream 0.7.4: the state after each token into intermediate_states_buffer, and
  // disable_state_update keeping the pool's final state, both for T > 1 only (T = 1 refuses them).
  const bool has_buf = buffer && buffer->defined();
  FLASHINFER_CHECK(!has_buf || T > 1, op, "intermediate_states_buffer",
                   "intermediate_states_buffer is supported only for T > 1");
  FLASHINFER_CHECK(!disable_state_update || T > 1, op, "disable_state_update",
                   "disable_state_update is supported only for T > 1");
  if (has_buf) {
    // The fp32 state runs upstream's MTP kernel with the buffer (fp32 rows). The bf16-state
    // kernel's buffer holds bf16 rows and, from B * HV >= 128 on, skips the final write-back:
    // not implemented here.
    FLASHINFER_CHECK_CODE(!bf16_state, ErrorCode::kUnsupported, op, "intermediate_states_buffer",
                          "an intermediate_states_buffer with a bf16 state is not supported");
    set_intermediate_buffer(p, *buffer, q, B, T, HV, op);
  }
  p.write_final = !disable_state_update;
  api::check_upstream_arch(op, "q", q.device());
  api::launch(kGdnKernels, p, q.device(), op, "q");
  return {*output, s};
}

std::tuple<Tensor, Tensor> decode_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& state, const Tensor& A_log, const Tensor& a,
                                       const Tensor& dt_bias, const Tensor& b,
                                       std::optional<double> scale, std::optional<Tensor> output,
                                       bool l2norm) {
  const char* op = "gated_delta_rule_decode";
  api::check_defined(state, op, "state");
  api::check_dim(state, {4}, op, "state");
  api::check_defined(q, op, "q");
  api::check_dim(q, {4}, op, "q");
  FLASHINFER_CHECK(q.size(1) == 1, op, "q", "Decode only supports T=1, got T=", q.size(1));
  GdnParams p = decode_params(op, q, k, v, A_log, a, dt_bias, b, scale, l2norm, output);
  check_state(state, {p.num_seqs, p.H, p.K, p.V}, {DType::kFloat32}, q, op, "state",
              "[B, HV, K, V]");
  p.state_in = p.state_out = state_ref(state, false);
  p.write_final = true;
  api::check_upstream_arch(op, "q", q.device());
  api::launch(kGdnKernels, p, q.device(), op, "q");
  return {*output, state};
}

// gated_delta_rule_mtp's ReplaySSM caches (upstream 0.7.4).
struct ReplaySsm {
  bool on = false;
  std::optional<Tensor> rawv, rawk, g, beta;
};

// Python's tuple text of a shape: "(2, 3)", "(4,)".
std::string py_shape_text(const Shape& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// Upstream's ReplaySSM checks (gdn_decode.py), in order, after the generic ones.
void check_replayssm(const ReplaySsm& r, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias,
                     const Tensor& pool, const Tensor& read_idx, bool frozen, bool has_buf,
                     bool has_steps, const char* op) {
  const bool any = r.rawv || r.rawk || r.g || r.beta;
  if (!r.on) {
    FLASHINFER_CHECK(!any, op, "cache_replayssm",
                     "replayssm_* buffers require cache_replayssm=True");
    return;
  }
  if (q.device().is_cuda()) {
    const int cc = api::compute_capability(q.device());
    FLASHINFER_CHECK_CODE(cc / 10 == 10 || cc == 120, ErrorCode::kUnsupported, op,
                          "cache_replayssm", "ReplaySSM caching requires SM100/SM103 or SM120");
  }
  FLASHINFER_CHECK(frozen, op, "disable_state_update",
                   "ReplaySSM verify must leave the checkpoint frozen (disable_state_update=True)");
  FLASHINFER_CHECK(!has_buf, op, "intermediate_states_buffer",
                   "ReplaySSM replaces full intermediate-state snapshots");
  FLASHINFER_CHECK(!has_steps, op, "ssm_state_indices",
                   "ReplaySSM and per-token state scatter are mutually exclusive");
  FLASHINFER_CHECK(pool.size(0) >= 1, op, "initial_state",
                   "ReplaySSM requires at least one checkpoint slot");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3);
  const int64_t HV = v.size(2), V = v.size(3);
  FLASHINFER_CHECK(k.shape() == q.shape() && v.dim() == 4 && v.size(0) == B && v.size(1) == T, op,
                   "k", "ReplaySSM Q/K/V shapes must agree");
  FLASHINFER_CHECK(a.shape() == Shape({B, T, HV}) && b.shape() == Shape({B, T, HV}), op, "a",
                   "ReplaySSM a/b must be [B,T,HV]");
  FLASHINFER_CHECK(A_log.numel() == HV && dt_bias.numel() == HV, op, "A_log",
                   "ReplaySSM gate parameters must be [HV]");
  FLASHINFER_CHECK(K == 128 && V == 128, op, "q", "ReplaySSM requires K=V=128");
  FLASHINFER_CHECK(HV % H == 0, op, "v", "ReplaySSM requires HV divisible by H");
  FLASHINFER_CHECK(read_idx.dim() == 1 && read_idx.size(0) == B, op, "initial_state_indices",
                   "initial_state_indices must be [B]");
  FLASHINFER_CHECK(T >= 3, op, "q", "ReplaySSM caching requires T >= 3, got T=", T);
  const int64_t P = pool.size(0);
  for (const auto& [t, name, shape, dt] :
       {std::tuple{&r.rawv, "replayssm_rawv", Shape({P, HV, T, V}), DType::kBFloat16},
        std::tuple{&r.rawk, "replayssm_rawk", Shape({P, H, T, K}), DType::kBFloat16},
        std::tuple{&r.g, "replayssm_g", Shape({P, HV, T}), DType::kFloat32},
        std::tuple{&r.beta, "replayssm_beta", Shape({P, HV, T}), DType::kFloat32}}) {
    FLASHINFER_CHECK(t->has_value() && (*t)->defined(), op, name,
                     "cache_replayssm=True requires replayssm_rawv/rawk/g/beta");
    const Tensor& x = **t;
    std::string want = "[";  // Python's list(shape)
    for (std::size_t i = 0; i < shape.size(); ++i)
      want += (i ? ", " : "") + std::to_string(shape[i]);
    FLASHINFER_CHECK(x.shape() == shape, op, name, name, " must have shape ", want + "]", ", got ",
                     py_shape_text(x.shape()));
    FLASHINFER_CHECK(x.dtype() == dt, op, name, name, " must have dtype ", dtype_torch_name(dt),
                     ", got ", dtype_torch_name(x.dtype()));
    FLASHINFER_CHECK(x.device() == q.device(), op, name, name, " device ", x.device().str(),
                     " != q device ", q.device().str());
    FLASHINFER_CHECK(x.is_contiguous(), op, name, name,
                     " must be a contiguous per-layer ReplaySSM view");
    api::check_writable(x, op, name);
  }
}

// The four windows of every request with a read slot s >= 0, from k/v/a/b as bf16 (upstream's
// as_bf16): v and the un-normalized k, g = -exp(A_log) softplus(a + dt_bias) (softplus(x) = x
// above 20) and sigmoid(b), fp32. Written on the host (device buffers are copied back).
void fill_replayssm(const ReplaySsm& r, const Tensor& k, const Tensor& v, const Tensor& a,
                    const Tensor& b, const Tensor& A_log, const Tensor& dt_bias,
                    const Tensor& read_idx) {
  const int64_t B = k.size(0), T = k.size(1), H = k.size(2), K = k.size(3);
  const int64_t HV = v.size(2), V = v.size(3);
  const Tensor kb = k.to(Device::cpu()).to(DType::kBFloat16).contiguous();
  const Tensor vb = v.to(Device::cpu()).to(DType::kBFloat16).contiguous();
  const std::vector<double> av = a.to(Device::cpu()).to(DType::kBFloat16).to_double_vector(),
                            bv = b.to(Device::cpu()).to(DType::kBFloat16).to_double_vector(),
                            Av = A_log.to_double_vector(), dv = dt_bias.to_double_vector();
  const std::vector<int64_t> slots = api::host_ints(read_idx);
  Tensor rv = r.rawv->to(Device::cpu()).contiguous(), rk = r.rawk->to(Device::cpu()).contiguous();
  Tensor rg = r.g->to(Device::cpu()).contiguous(), rb = r.beta->to(Device::cpu()).contiguous();
  const auto* ks = static_cast<const uint16_t*>(kb.data_ptr());
  const auto* vs = static_cast<const uint16_t*>(vb.data_ptr());
  auto* vo = static_cast<uint16_t*>(rv.data_ptr());
  auto* ko = static_cast<uint16_t*>(rk.data_ptr());
  float* go = rg.data<float>();
  float* bo = rb.data<float>();
  for (int64_t i = 0; i < B; ++i) {
    const int64_t s = slots[static_cast<std::size_t>(i)];
    if (s < 0) continue;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t hv = 0; hv < HV; ++hv) {
        std::memcpy(vo + ((s * HV + hv) * T + t) * V, vs + ((i * T + t) * HV + hv) * V,
                    static_cast<std::size_t>(V) * 2);
        const auto ai = static_cast<std::size_t>((i * T + t) * HV + hv);
        const float x = static_cast<float>(av[ai]) + static_cast<float>(dv[hv]);
        const float sp = x > 20.0f ? x : std::log1p(std::exp(x));
        go[(s * HV + hv) * T + t] = -std::exp(static_cast<float>(Av[hv])) * sp;
        bo[(s * HV + hv) * T + t] = 1.0f / (1.0f + std::exp(-static_cast<float>(bv[ai])));
      }
      for (int64_t h = 0; h < H; ++h) {
        std::memcpy(ko + ((s * H + h) * T + t) * K, ks + ((i * T + t) * H + h) * K,
                    static_cast<std::size_t>(K) * 2);
      }
    }
  }
  for (const auto& [dst, src] :
       {std::pair{&*r.rawv, &rv}, {&*r.rawk, &rk}, {&*r.g, &rg}, {&*r.beta, &rb}}) {
    if (dst->data_ptr() != src->data_ptr()) {
      Tensor d = *dst;
      d.copy_(*src);
    }
  }
}

std::tuple<Tensor, Tensor> mtp_impl(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& initial_state,
    const Tensor& read_idx, const Tensor& A_log, const Tensor& a, const Tensor& dt_bias,
    const Tensor& b, std::optional<double> scale, std::optional<Tensor> output,
    const std::optional<Tensor>& buffer, const std::optional<Tensor>& step_idx,
    std::optional<bool> disable_state_update, bool l2norm, const std::optional<Tensor>& write_idx,
    const ReplaySsm& replay = {}) {
  const char* op = "gated_delta_rule_mtp";
  GdnParams p = decode_params(op, q, k, v, A_log, a, dt_bias, b, scale, l2norm, output);
  const int64_t B = p.num_seqs, T = p.T, HV = p.H;
  const Tensor& s = initial_state;
  api::check_defined(s, op, "initial_state");
  api::check_dim(s, {4}, op, "initial_state");
  FLASHINFER_CHECK(s.dtype() == DType::kFloat32, op, "initial_state",
                   "initial_state must be float32, got ", tname(s));
  check_state(s, {s.size(0), HV, p.V, p.K}, {DType::kFloat32}, q, op, "initial_state",
              "[pool_size, HV, V, K]");
  FLASHINFER_CHECK(s.size(0) >= 1, op, "initial_state", "the state pool has no slots");
  p.state_in = p.state_out = state_ref(s, true);
  check_index_vector(read_idx, B, q, op, "initial_state_indices");
  check_slots(read_idx, s.size(0), SlotNegatives::kAllowed, op, "initial_state_indices");
  p.read_idx = read_idx.data_ptr();
  p.read_idx_i64 = read_idx.dtype() == DType::kInt64;
  if (write_idx && write_idx->defined()) {
    check_index_vector(*write_idx, B, q, op, "output_state_indices");
    check_slots(*write_idx, s.size(0), SlotNegatives::kAllowed, op, "output_state_indices");
    p.write_idx = write_idx->data_ptr();
    p.write_idx_i64 = write_idx->dtype() == DType::kInt64;
  }
  // Upstream's default is True (with a deprecation warning): the pool is not advanced.
  const bool disable = disable_state_update.value_or(true);
  const bool has_buf = buffer && buffer->defined();
  const bool has_steps = step_idx && step_idx->defined();
  check_replayssm(replay, q, k, v, a, b, A_log, dt_bias, s, read_idx, disable, has_buf, has_steps,
                  op);
  FLASHINFER_CHECK(!(has_buf && has_steps), op, "ssm_state_indices",
                   "ssm_state_indices and intermediate_states_buffer are mutually exclusive");
  if (has_buf) set_intermediate_buffer(p, *buffer, q, B, T, HV, op);
  if (has_steps) {
    const Tensor& si = *step_idx;
    FLASHINFER_CHECK(!disable, op, "disable_state_update",
                     "ssm_state_indices requires state writes; disable_state_update must be False");
    FLASHINFER_CHECK(T >= 2, op, "ssm_state_indices",
                     "ssm_state_indices requires T >= 2 (got T=", T, ")");
    api::check_dim(si, {2}, op, "ssm_state_indices");
    FLASHINFER_CHECK(si.dtype() == DType::kInt32, op, "ssm_state_indices",
                     "ssm_state_indices must be int32, got ", tname(si));
    api::check_same_device(si, q, op, "ssm_state_indices", "q");
    api::check_shape_eq(si, {B, T}, op, "ssm_state_indices");
    FLASHINFER_CHECK(si.is_contiguous(), op, "ssm_state_indices", "must be contiguous");
    check_slots(si, s.size(0), SlotNegatives::kAllowed, op, "ssm_state_indices");
    p.intermediates = kernels::GdnIntermediates::kPool;
    p.step_slots = si.data<int32_t>();
  }
  p.negative_read = kernels::GdnNegativeRead::kSkipKeepOutput;
  p.negative_write = kernels::GdnNegativeWrite::kSkip;
  p.qkv_via_bf16 = p.gates_via_bf16 = true;  // upstream's MTP kernel: as_bf16(q, k, v, a, b)
  p.write_final = !disable;
  api::check_upstream_arch(op, "q", q.device());
  api::launch(kGdnKernels, p, q.device(), op, "q");
  if (replay.on) fill_replayssm(replay, k, v, a, b, A_log, dt_bias, read_idx);
  return {*output, s};
}

// ---- chunk_gated_delta_rule ---------------------------------------------------------------------

void check_prefill_gate(const std::optional<Tensor>& t, int64_t T, int64_t H, const Tensor& q,
                        const char* op, const char* arg) {
  if (!t || !t->defined()) return;
  api::check_dim(*t, {2}, op, arg);
  FLASHINFER_CHECK(t->dtype() == DType::kFloat32, op, arg, arg,
                   " must have dtype torch.float32, got ", tname(*t));
  api::check_shape_eq(*t, {T, H}, op, arg);
  api::check_same_device(*t, q, op, arg, "q");
}

// Upstream 0.7.4's additions to chunk_gated_delta_rule (docs/LINEAR_ATTENTION.md).
struct PrefillExtras {
  std::string backend = "auto";
  std::optional<int64_t> max_seqlen;
  std::string gate_domain = "linear";
  bool use_gate_in_kernel = false;
  std::optional<Tensor> A_log, dt_bias;
  bool beta_is_logit = false;
  Value cu_seqlens_cpu;
  std::optional<Tensor> output_state_indices, checkpoint_state_indices, prefix_lens;
};

// backend: "auto", "flashinfer" and "sm120_cute" (which falls back to "flashinfer" off its
// RTX 6000D) run the native kernels; "cake_gdn" and "cudnn" compute the same recurrence on the
// CPU and need an SM100-class GPU on CUDA.
void check_prefill_backend(const PrefillExtras& x, const Value& use_cp,
                           std::optional<int64_t> cp_chunk_len, int64_t every, const Device& dev,
                           const char* op) {
  const std::string& b = x.backend;
  FLASHINFER_CHECK(
      b == "auto" || b == "flashinfer" || b == "cake_gdn" || b == "cudnn" || b == "sm120_cute", op,
      "backend", "unsupported GDN backend: '", b, "'");
  if (b == "cudnn") {
    const bool cp = (use_cp.kind() == Value::Kind::kBool && use_cp.as_bool()) || cp_chunk_len;
    FLASHINFER_CHECK_CODE(!cp && every == 0, ErrorCode::kUnsupported, op,
                          cp ? "use_cp" : "checkpoint_every_n_tokens",
                          "chunk_gated_delta_rule(backend=\"cudnn\") does not support ",
                          cp && every > 0 ? "use_cp, checkpoint_every_n_tokens"
                          : cp            ? "use_cp"
                                          : "checkpoint_every_n_tokens");
  }
  if (!dev.is_cuda() || (b != "cake_gdn" && b != "cudnn")) return;
  const int cc = api::compute_capability(dev);
  FLASHINFER_CHECK_CODE(
      cc == 100 || cc == 103 || cc == 107, ErrorCode::kUnsupported, op, "backend", "backend='", b,
      "' needs an SM100, SM103 or SM107 GPU, got compute capability ", cc / 10, ".", cc % 10);
}

// gdn_kernels/gates.py's validate_gate_inputs, with its texts.
void check_prefill_gate_inputs(const PrefillExtras& x, const std::optional<Tensor>& g,
                               const std::optional<Tensor>& beta, int64_t T, int64_t H,
                               const Tensor& q, const char* op) {
  FLASHINFER_CHECK(x.gate_domain == "linear" || x.gate_domain == "log", op, "gate_domain",
                   "gate_domain must be 'linear' or 'log'");
  FLASHINFER_CHECK(!x.use_gate_in_kernel || (g && x.A_log && x.dt_bias), op,
                   !g ? "g" : (!x.A_log ? "A_log" : "dt_bias"),
                   "use_gate_in_kernel requires g, A_log and dt_bias");
  FLASHINFER_CHECK(x.use_gate_in_kernel || (!x.A_log && !x.dt_bias), op,
                   x.A_log ? "A_log" : "dt_bias",
                   "A_log and dt_bias require use_gate_in_kernel=True");
  FLASHINFER_CHECK(!x.beta_is_logit || beta, op, "beta", "beta_is_logit requires beta");
  struct Item {
    const char* name;
    const std::optional<Tensor>* t;
    Shape shape;
  };
  for (const Item& it : {Item{"g", &g, {T, H}}, Item{"beta", &beta, {T, H}},
                         Item{"A_log", &x.A_log, {H}}, Item{"dt_bias", &x.dt_bias, {H}}}) {
    if (!*it.t || !(*it.t)->defined()) continue;
    const Tensor& t = **it.t;
    FLASHINFER_CHECK(t.shape() == it.shape && t.device() == q.device(), op, it.name, it.name,
                     " must have shape ", shape_to_string(it.shape), " on q's device");
    const bool ok = std::string(it.name) == "beta"
                        ? (t.dtype() == DType::kFloat32 || t.dtype() == q.dtype())
                        : (t.dtype() == DType::kFloat32 || t.dtype() == DType::kFloat16 ||
                           t.dtype() == DType::kBFloat16);
    FLASHINFER_CHECK(ok, op, it.name, "unsupported ", it.name, " dtype: ", tname(t));
  }
  if (x.A_log && x.dt_bias) check_unit_vectors(*x.A_log, *x.dt_bias, op);  // read as [H] arrays
}

// cu_seqlens_cpu: a 1-D int32 / int64 CPU tensor or a list of ints (a host copy of cu_seqlens,
// a scheduling hint on the GPUs we serve); when given it must agree with cu_seqlens' length.
void check_cu_seqlens_cpu(const Value& h, int64_t entries, const char* op) {
  if (h.kind() == Value::Kind::kNone) return;
  int64_t n = -1;
  if (h.is_tensor()) {
    const Tensor& t = h.as_tensor();
    FLASHINFER_CHECK(t.device().is_cpu() && t.dim() == 1 &&
                         (t.dtype() == DType::kInt32 || t.dtype() == DType::kInt64),
                     op, "cu_seqlens_cpu", "cu_seqlens_cpu must be a 1D int32/int64 CPU tensor");
    n = t.size(0);
  } else if (h.kind() == Value::Kind::kList || h.kind() == Value::Kind::kTuple) {
    for (const Value& e : h.items()) {
      FLASHINFER_CHECK(e.kind() == Value::Kind::kInt, op, "cu_seqlens_cpu",
                       "cu_seqlens_cpu must hold Python ints, got ", e.repr());
    }
    n = static_cast<int64_t>(h.items().size());
  } else {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, "cu_seqlens_cpu",
                    "cu_seqlens_cpu must be a sequence of ints or a CPU tensor, got ", h.repr());
  }
  FLASHINFER_CHECK(n == entries, op, "cu_seqlens_cpu",
                   "cu_seqlens_cpu must match packed sequence offsets (", entries,
                   " entries), got ", n);
}

GdnPrefillOutput prefill_impl(const Tensor& q_in, const Tensor& k_in, const Tensor& v,
                              std::optional<Tensor> g, std::optional<Tensor> beta,
                              std::optional<double> scale,
                              const std::optional<Tensor>& initial_state, bool output_final_state,
                              const std::optional<Tensor>& cu_seqlens, bool l2norm,
                              std::optional<Tensor> output, std::optional<Tensor> output_state,
                              const std::optional<Tensor>& checkpoints,
                              const std::optional<Tensor>& checkpoint_starts, int64_t every,
                              const Value& use_cp, const std::optional<Tensor>& state_indices,
                              std::optional<int64_t> cp_chunk_len, const PrefillExtras& x) {
  const char* op = "chunk_gated_delta_rule";
  const Tensor& q = q_in;
  const Tensor& k = k_in;
  api::check_defined(q, op, "q");
  api::check_dim(q, {3}, op, "q");
  api::check_dtype_in(q, {DType::kFloat16, DType::kBFloat16}, op, "q");
  check_io(q, q, op, "q");
  check_io(k, q, op, "k");
  check_io(v, q, op, "v");
  api::check_dim(k, {3}, op, "k");
  api::check_dim(v, {3}, op, "v");
  const int64_t T = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t Hk = k.size(1), Hv = v.size(1);
  FLASHINFER_CHECK(k.size(0) == T && v.size(0) == T, op, k.size(0) != T ? "k" : "v",
                   "token count must equal q's (", T, ")");
  FLASHINFER_CHECK(k.size(2) == D && v.size(2) == D, op, k.size(2) != D ? "k" : "v",
                   "head size must equal q's (", D, "): one head size for q, k, v and the state");
  FLASHINFER_CHECK(D >= 1 && Hq >= 1 && Hk >= 1 && Hv >= 1, op, "q",
                   "head counts and head size must be positive");
  const int64_t H = std::max(Hq, Hv);
  if (Hq >= Hv) {  // GQA (or equal counts): Hk == Hv, Hq a multiple of them
    FLASHINFER_CHECK(Hk == Hv && Hq % Hv == 0, op, "k",
                     "with num_q_heads >= num_v_heads (GQA) num_k_heads must equal num_v_heads "
                     "and divide num_q_heads; got q ",
                     Hq, ", k ", Hk, ", v ", Hv);
  } else {  // GVA: Hq == Hk, Hv a multiple of them
    FLASHINFER_CHECK(Hk == Hq && Hv % Hq == 0, op, "k",
                     "with num_v_heads > num_q_heads (GVA) num_k_heads must equal num_q_heads "
                     "and divide num_v_heads; got q ",
                     Hq, ", k ", Hk, ", v ", Hv);
  }
  check_prefill_backend(x, use_cp, cp_chunk_len, every, q.device(), op);
  // The gate conventions: g / beta transformed to fp32 alpha / beta before the kernels, as
  // upstream materializes them (gdn_kernels/gates.py).
  const bool transforms =
      x.gate_domain != "linear" || x.use_gate_in_kernel || x.beta_is_logit || x.A_log || x.dt_bias;
  if (transforms) {
    check_prefill_gate_inputs(x, g, beta, T, H, q, op);
  } else {
    check_prefill_gate(g, T, H, q, op, "g");
    check_prefill_gate(beta, T, H, q, op, "beta");
  }
  FLASHINFER_CHECK(cu_seqlens && cu_seqlens->defined(), op, "cu_seqlens",
                   "cu_seqlens is required for varlen mode");
  const Tensor& cu = *cu_seqlens;
  api::check_dim(cu, {1}, op, "cu_seqlens");
  api::check_dtype_in(cu, {DType::kInt32, DType::kInt64}, op, "cu_seqlens");
  api::check_same_device(cu, q, op, "cu_seqlens", "q");
  FLASHINFER_CHECK(cu.size(0) >= 2, op, "cu_seqlens",
                   "cu_seqlens must contain at least two entries");
  FLASHINFER_CHECK(cu.is_contiguous(), op, "cu_seqlens", "must be contiguous");
  const int64_t N = cu.size(0) - 1;
  // max_seqlen: a bound on the longest sequence (CP launch grids upstream), checked as upstream.
  {
    const int64_t bound = x.max_seqlen.value_or(T);
    FLASHINFER_CHECK(bound >= 0, op, "max_seqlen", "max_seqlen must be a nonnegative integer");
    FLASHINFER_CHECK(T == 0 || bound > 0, op, "max_seqlen",
                     "max_seqlen must be positive when q is nonempty");
    FLASHINFER_CHECK(bound >= (T + N - 1) / N, op, "max_seqlen",
                     "max_seqlen cannot be smaller than ceil(total_seq_len / num_seqs)");
    FLASHINFER_CHECK(bound <= T, op, "max_seqlen", "max_seqlen cannot exceed total_seq_len");
  }
  check_cu_seqlens_cpu(x.cu_seqlens_cpu, N + 1, op);
  std::vector<int64_t> cu_host;
  if (cu.device().is_cpu()) {
    cu_host = api::host_ints(cu);
    for (int64_t n = 0; n < N; ++n) {
      FLASHINFER_CHECK(cu_host[n] >= 0 && cu_host[n] <= cu_host[n + 1] && cu_host[n + 1] <= T, op,
                       "cu_seqlens", "must be non-decreasing within [0, ", T, "], got entries ", n,
                       ", ", n + 1, " = ", cu_host[n], ", ", cu_host[n + 1]);
    }
  }
  // use_cp: upstream's context-parallel kernel computes the same recurrence (other rounding).
  FLASHINFER_CHECK(use_cp.kind() == Value::Kind::kBool ||
                       (use_cp.kind() == Value::Kind::kString && use_cp.as_string() == "auto"),
                   op, "use_cp", "use_cp must be \"auto\", True, or False, got ", use_cp.repr());
  if (use_cp.kind() == Value::Kind::kBool && use_cp.as_bool() && cp_chunk_len) {
    FLASHINFER_CHECK(*cp_chunk_len > 0 && *cp_chunk_len % 64 == 0, op, "_cp_chunk_len",
                     "cp_chunk_len must be a (positive) multiple of 64, got ", *cp_chunk_len);
  }
  // Checkpoints.
  FLASHINFER_CHECK(every >= 0, op, "checkpoint_every_n_tokens",
                   "checkpoint_every_n_tokens must be non-negative, got ", every);
  const bool has_ckpt = checkpoints && checkpoints->defined();
  const bool has_starts = checkpoint_starts && checkpoint_starts->defined();
  if (every > 0) {
    FLASHINFER_CHECK(every % 64 == 0, op, "checkpoint_every_n_tokens",
                     "checkpoint_every_n_tokens must be a multiple of the chunk size (64), got ",
                     every);
    FLASHINFER_CHECK(has_ckpt && has_starts, op,
                     has_ckpt ? "checkpoint_cu_starts" : "state_checkpoints",
                     "state_checkpoints and checkpoint_cu_starts must both be provided when "
                     "checkpoint_every_n_tokens > 0");
  } else {
    FLASHINFER_CHECK(!has_ckpt && !has_starts, op,
                     has_ckpt ? "state_checkpoints" : "checkpoint_cu_starts",
                     "state_checkpoints and checkpoint_cu_starts must be None when "
                     "checkpoint_every_n_tokens == 0");
  }
  // Upstream 0.7.4's slot arguments (_validate_slot_args): separate write rows, checkpoint pool
  // rows, absolute checkpoint positions; the native non-CP kernels serve them.
  const bool has_out_idx = x.output_state_indices && x.output_state_indices->defined();
  const bool has_ckpt_idx = x.checkpoint_state_indices && x.checkpoint_state_indices->defined();
  const bool has_prefix = x.prefix_lens && x.prefix_lens->defined();
  if (has_out_idx || has_ckpt_idx || has_prefix) {
    std::string names;
    for (const auto& [on, name] : {std::pair{has_out_idx, "output_state_indices"},
                                   std::pair{has_ckpt_idx, "checkpoint_state_indices"},
                                   std::pair{has_prefix, "prefix_lens"}}) {
      if (on) names += (names.empty() ? "" : ", ") + std::string(name);
    }
    const char* first = has_out_idx    ? "output_state_indices"
                        : has_ckpt_idx ? "checkpoint_state_indices"
                                       : "prefix_lens";
    FLASHINFER_CHECK(x.backend == "auto" || x.backend == "flashinfer", op, "backend", names,
                     " require the native non-CP kernels (backend=\"auto\" or \"flashinfer\"), "
                     "got backend='",
                     x.backend, "'");
    FLASHINFER_CHECK(!(use_cp.kind() == Value::Kind::kBool && use_cp.as_bool()) && !cp_chunk_len,
                     op, first, names, " are not supported with context parallelism");
    if (has_out_idx) {
      check_index_vector(*x.output_state_indices, N, q, op, "output_state_indices");
      FLASHINFER_CHECK(state_indices && state_indices->defined(), op, "output_state_indices",
                       "output_state_indices requires state_indices");
      FLASHINFER_CHECK(output_state && output_state->defined() && output_final_state, op,
                       "output_state_indices",
                       "output_state_indices requires an explicit output_state pool and "
                       "output_final_state=True");
    }
    if (has_ckpt_idx) {
      check_index_vector(*x.checkpoint_state_indices, std::nullopt, q, op,
                         "checkpoint_state_indices");
      FLASHINFER_CHECK(every > 0, op, "checkpoint_state_indices",
                       "checkpoint_state_indices requires checkpoint_every_n_tokens > 0");
    }
    if (has_prefix) {
      check_index_vector(*x.prefix_lens, N, q, op, "prefix_lens");
      FLASHINFER_CHECK(every > 0, op, "prefix_lens",
                       "prefix_lens requires checkpoint_every_n_tokens > 0");
    }
  }
  // States: compact [N, H, D, D] or pools indexed by state_indices.
  const bool pooled = state_indices && state_indices->defined();
  if (pooled) {
    check_index_vector(*state_indices, N, q, op, "state_indices");
    if (has_out_idx) {
      // Separate rows: -1 reads the zero state; output_state_indices' -1 skips the write.
      if (initial_state && initial_state->defined()) {
        check_slots(*state_indices, initial_state->size(0), SlotNegatives::kMinusOneOnly, op,
                    "state_indices");
      }
      check_slots(*x.output_state_indices, output_state->size(0), SlotNegatives::kMinusOneOnly, op,
                  "output_state_indices");
    } else if (state_indices->device().is_cpu()) {
      const auto idx = api::host_ints(*state_indices);
      for (size_t i = 0; i < idx.size(); ++i) {
        FLASHINFER_CHECK(idx[i] >= 0, op, "state_indices", "entry ", i, " is ", idx[i],
                         ": state indices must be non-negative");
      }
    }
    FLASHINFER_CHECK(!output_final_state || (output_state && output_state->defined()), op,
                     "output_state",
                     "state_indices requires an explicit output_state pool sized like the state "
                     "pool ([N_pool, H, V, K]); refusing to auto-allocate a compact [num_seqs, "
                     "...] tensor that would be indexed out of bounds.");
  }
  const bool has_init = initial_state && initial_state->defined();
  if (has_init) {
    const Tensor& s = *initial_state;
    api::check_dim(s, {4}, op, "initial_state");
    check_state(s, {pooled ? s.size(0) : N, H, D, D}, {DType::kFloat32}, q, op, "initial_state",
                pooled ? "[N_pool, H, V, K]" : "[N, H, V, K]");
    if (pooled && !has_out_idx)
      check_slots(*state_indices, s.size(0), SlotNegatives::kRefused, op, "state_indices");
  }
  if (output_state && output_state->defined()) {
    const Tensor& s = *output_state;
    api::check_dim(s, {4}, op, "output_state");
    check_state(s, {pooled ? s.size(0) : N, H, D, D}, {DType::kFloat32}, q, op, "output_state",
                pooled ? "[N_pool, H, V, K]" : "[N, H, V, K]");
    if (pooled && !has_out_idx)
      check_slots(*state_indices, s.size(0), SlotNegatives::kRefused, op, "state_indices");
  } else if (!pooled && output_final_state) {
    // Upstream's Hopper path allocates the final state and always writes it; a state nobody
    // receives is not made here (on CUDA it would be a temporary freed at return, which a CUDA
    // graph capturing the call refuses).
    output_state = Tensor::zeros({N, H, D, D}, DType::kFloat32, q.device());
  }
  if (output && output->defined()) {
    api::check_same_dtype(*output, q, op, "output", "q");
    api::check_shape_eq(*output, {T, H, D}, op, "output");
    api::check_same_device(*output, q, op, "output", "q");
    FLASHINFER_CHECK(output->stride(2) == 1, op, "output",
                     "must have stride 1 in the last dimension, got ", output->stride(2));
  } else {
    output = Tensor::zeros({T, H, D}, q.dtype(), q.device());
  }

  GdnParams p;
  p.num_seqs = N;
  p.cu_seqlens = cu.data_ptr();
  p.cu_seqlens_i64 = cu.dtype() == DType::kInt64;
  p.total_tokens = T;
  p.H = H, p.Hq = Hq, p.Hk = Hk, p.Hv = Hv, p.K = D, p.V = D;
  p.io_dtype = q.dtype();
  p.q = q.data_ptr(), p.k = k.data_ptr(), p.v = v.data_ptr();
  p.q_stride_tok = q.stride(0), p.q_stride_head = q.stride(1);
  p.k_stride_tok = k.stride(0), p.k_stride_head = k.stride(1);
  p.v_stride_tok = v.stride(0), p.v_stride_head = v.stride(1);
  p.decode_gates = false;
  if (g && g->defined()) p.g = gate_ref(*g, false);
  if (beta && beta->defined()) p.beta = gate_ref(*beta, false);
  // use_qk_l2norm_in_kernel: q and k normalized before the kernels, as upstream 0.7.4 does
  // (its pinned-era kernels ignored the flag); the prefill kernels read them plain.
  p.l2norm = false;
  p.scale_output = true;
  const double sc = (scale && *scale != 0.0) ? *scale : 1.0 / std::sqrt(static_cast<double>(D));
  p.scale = static_cast<float>(sc);
  p.out = output->data_ptr();
  p.out_dtype = output->dtype();
  p.out_stride_tok = output->stride(0);
  p.out_stride_head = output->stride(1);
  if (has_init) p.state_in = state_ref(*initial_state, true);
  if (output_state && output_state->defined()) p.state_out = state_ref(*output_state, true);
  p.write_final = p.state_out.data != nullptr;
  if (pooled) {
    p.read_idx = p.write_idx = state_indices->data_ptr();
    p.read_idx_i64 = p.write_idx_i64 = state_indices->dtype() == DType::kInt64;
  }
  // A negative state index is an error here (refused on the host for CPU tensors), except with
  // output_state_indices: a read of -1 starts from zeros, a write of -1 is skipped.
  p.negative_read = kernels::GdnNegativeRead::kInvalid;
  p.negative_write = kernels::GdnNegativeWrite::kSkip;
  if (has_out_idx) {
    p.write_idx = x.output_state_indices->data_ptr();
    p.write_idx_i64 = x.output_state_indices->dtype() == DType::kInt64;
    p.negative_read = kernels::GdnNegativeRead::kZeroState;
  }
  if (every > 0) {
    const Tensor& c = *checkpoints;
    api::check_dim(c, {4}, op, "state_checkpoints");
    FLASHINFER_CHECK(c.dtype() == DType::kFloat32, op, "state_checkpoints",
                     "state_checkpoints must be float32, got ", tname(c));
    FLASHINFER_CHECK(c.size(1) == H && c.size(2) == D && c.size(3) == D, op, "state_checkpoints",
                     "state_checkpoints shape mismatch: expected [*, ", H, ", ", D, ", ", D,
                     "], got ", shape_to_string(c.shape()));
    api::check_same_device(c, q, op, "state_checkpoints", "q");
    const Tensor& cs = *checkpoint_starts;
    api::check_dim(cs, {1}, op, "checkpoint_cu_starts");
    api::check_dtype_in(cs, {DType::kInt32, DType::kInt64}, op, "checkpoint_cu_starts");
    api::check_same_device(cs, q, op, "checkpoint_cu_starts", "q");
    // With checkpoint_state_indices only each sequence's first entry is read.
    FLASHINFER_CHECK(cs.size(0) == N + 1 || (has_ckpt_idx && cs.size(0) == N), op,
                     "checkpoint_cu_starts", "checkpoint_cu_starts must have ",
                     has_ckpt_idx ? std::to_string(N) + " or " : std::string(), N + 1,
                     " elements, got ", cs.size(0));
    FLASHINFER_CHECK(cs.is_contiguous(), op, "checkpoint_cu_starts",
                     "checkpoint_cu_starts must be contiguous");
    // A strided state_checkpoints would be written through a copy and lost (upstream's reason).
    const int64_t row_elems = H * D * D;
    if (has_ckpt_idx) {
      // A checkpoint pool may pad its rows, each one dense [H, V, K] block.
      const bool dense_rows = c.stride(1) == D * D && c.stride(2) == D && c.stride(3) == 1;
      FLASHINFER_CHECK(dense_rows && c.stride(0) >= row_elems, op, "state_checkpoints",
                       "state_checkpoints pool rows must be dense [H, V, K] blocks with a row "
                       "stride of at least H * V * K elements");
    } else {
      FLASHINFER_CHECK(c.is_contiguous(), op, "state_checkpoints",
                       "state_checkpoints must be contiguous");
    }
    const int64_t targets = has_ckpt_idx ? x.checkpoint_state_indices->size(0) : c.size(0);
    if (has_ckpt_idx)
      check_slots(*x.checkpoint_state_indices, c.size(0), SlotNegatives::kMinusOneOnly, op,
                  "checkpoint_state_indices");
    if (cs.device().is_cpu() && (!has_prefix || x.prefix_lens->device().is_cpu())) {
      const auto st = api::host_ints(cs);
      const auto pre = has_prefix ? api::host_ints(*x.prefix_lens) : std::vector<int64_t>();
      for (int64_t n = 0; n < N; ++n) {
        const int64_t prefix = has_prefix ? pre[n] : 0;
        FLASHINFER_CHECK(prefix >= 0 && prefix <= (int64_t{1} << 62), op, "prefix_lens", "entry ",
                         n, " is ", prefix, ": prefix lengths must be in [0, 2^62]");
        const int64_t len = cu_host[n + 1] - cu_host[n];
        const int64_t count = (prefix + len) / every - prefix / every;
        FLASHINFER_CHECK(count == 0 || (st[n] >= 0 && st[n] <= targets - count), op,
                         "checkpoint_cu_starts", "sequence ", n, "'s ", count,
                         " checkpoints from entry ", st[n], " fall outside ",
                         has_ckpt_idx ? "checkpoint_state_indices' " : "state_checkpoints' ",
                         targets, has_ckpt_idx ? " entries" : " rows");
      }
    }
    p.checkpoint_every = every;
    p.checkpoints = static_cast<float*>(c.data_ptr());
    p.checkpoint_rows = c.size(0);
    p.checkpoint_row_stride = has_ckpt_idx ? c.stride(0) : row_elems;
    p.checkpoint_starts = cs.data_ptr();
    p.checkpoint_starts_i64 = cs.dtype() == DType::kInt64;
    if (has_prefix) {
      p.checkpoint_prefix = x.prefix_lens->data_ptr();
      p.checkpoint_prefix_i64 = x.prefix_lens->dtype() == DType::kInt64;
    }
    if (has_ckpt_idx) {
      p.checkpoint_slots = x.checkpoint_state_indices->data_ptr();
      p.checkpoint_slots_i64 = x.checkpoint_state_indices->dtype() == DType::kInt64;
      p.checkpoint_slot_count = x.checkpoint_state_indices->size(0);
    }
  }
  api::check_upstream_arch(op, "q", q.device());
  // The q / k L2 norms and the gate conventions, materialized before the kernels as upstream
  // 0.7.4 does; on CUDA into the stream's scratch (never freed: a CUDA graph capturing the call
  // addresses it on every replay).
  const bool norm = l2norm && T > 0;
  if (norm || transforms) {
    kernels::GdnPrefillPrepParams pp;
    pp.T = T, pp.H = H, pp.D = D, pp.io_dtype = q.dtype();
    pp.l2norm = norm;
    pp.q = q.data_ptr(), pp.k = k.data_ptr(), pp.Hq = Hq, pp.Hk = Hk;
    pp.q_stride_tok = q.stride(0), pp.q_stride_head = q.stride(1);
    pp.k_stride_tok = k.stride(0), pp.k_stride_head = k.stride(1);
    if (transforms && g && g->defined()) {
      pp.g_mode = x.use_gate_in_kernel     ? kernels::GdnGateMode::kRaw
                  : x.gate_domain == "log" ? kernels::GdnGateMode::kLog
                                           : kernels::GdnGateMode::kLinear;
      pp.g = gate_ref(*g, false);
      if (x.use_gate_in_kernel) {
        pp.A_log = x.A_log->data_ptr(), pp.A_log_dtype = x.A_log->dtype();
        pp.dt_bias = x.dt_bias->data_ptr(), pp.dt_bias_dtype = x.dt_bias->dtype();
      }
    }
    if (transforms && beta && beta->defined()) {
      pp.beta_mode =
          x.beta_is_logit ? kernels::GdnBetaMode::kLogit : kernels::GdnBetaMode::kConvert;
      pp.beta = gate_ref(*beta, false);
    }
    const int64_t io = static_cast<int64_t>(dtype_size(q.dtype()));
    auto align = [](int64_t b) { return (b + 255) / 256 * 256; };
    const int64_t q_at = 0, k_at = align(norm ? T * Hq * D * io : 0);
    const int64_t g_at = k_at + align(norm ? T * Hk * D * io : 0);
    const int64_t b_at = g_at + align(pp.g_mode != kernels::GdnGateMode::kNone ? T * H * 4 : 0);
    const int64_t bytes = b_at + (pp.beta_mode != kernels::GdnBetaMode::kNone ? T * H * 4 : 0);
    Tensor host_scratch;
    char* base = nullptr;
#if FLASHINFER_WITH_CUDA
    std::optional<kernels::cuda::StreamScratch> lease;  // held until the kernels are queued
    if (q.device().is_cuda() && bytes > 0) {
      static kernels::cuda::StreamScratchPool pool("GDN prefill operands");
      lease = pool.acquire(op, q.device().index, current_cuda_stream(),
                           static_cast<std::size_t>(bytes));
      base = static_cast<char*>(lease->data());
    }
#endif
    if (!q.device().is_cuda()) {
      host_scratch = Tensor::empty({std::max<int64_t>(bytes, 1)}, DType::kUInt8, q.device());
      base = static_cast<char*>(host_scratch.data_ptr());
    }
    if (norm) {
      pp.q_out = base + q_at, pp.k_out = base + k_at;
      p.q = pp.q_out, p.k = pp.k_out;
      p.q_stride_tok = Hq * D, p.q_stride_head = D;
      p.k_stride_tok = Hk * D, p.k_stride_head = D;
    }
    if (pp.g_mode != kernels::GdnGateMode::kNone) {
      pp.g_out = reinterpret_cast<float*>(base + g_at);
      p.g.data = pp.g_out, p.g.dtype = DType::kFloat32, p.g.stride_tok = H, p.g.stride_head = 1;
    }
    if (pp.beta_mode != kernels::GdnBetaMode::kNone) {
      pp.beta_out = reinterpret_cast<float*>(base + b_at);
      p.beta.data = pp.beta_out, p.beta.dtype = DType::kFloat32, p.beta.stride_tok = H;
      p.beta.stride_head = 1;
    }
    api::launch(kGdnPrepKernels, pp, q.device(), op, "q");
    api::launch(kGdnKernels, p, q.device(), op, "q");
  } else {
    api::launch(kGdnKernels, p, q.device(), op, "q");
  }
  GdnPrefillOutput r;
  r.output = *output;
  if (output_final_state) r.final_state = *output_state;
  return r;
}

}  // namespace

std::tuple<Tensor, Tensor> gated_delta_rule_decode_pretranspose(
    const Tensor& q, const Tensor& k, const Tensor& v, std::optional<Tensor> state,
    const Tensor& A_log, const Tensor& a, const Tensor& dt_bias, const Tensor& b,
    std::optional<double> scale, std::optional<Tensor> output, bool use_qk_l2norm,
    std::optional<Tensor> initial_state, std::optional<Tensor> initial_state_indices,
    std::optional<Tensor> output_state_indices, std::optional<Tensor> intermediate_states_buffer,
    bool disable_state_update, const std::string& backend) {
  return call_op<&gated_delta_rule_decode_pretranspose>(
      [&] {
        return pretranspose_impl(q, k, v, state, A_log, a, dt_bias, b, scale, output, use_qk_l2norm,
                                 initial_state, initial_state_indices, output_state_indices,
                                 intermediate_states_buffer, disable_state_update, backend);
      },
      q, k, v, state, A_log, a, dt_bias, b, scale, output, use_qk_l2norm, initial_state,
      initial_state_indices, output_state_indices, intermediate_states_buffer, disable_state_update,
      backend);
}

std::tuple<Tensor, Tensor> gated_delta_rule_decode(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& state, const Tensor& A_log,
    const Tensor& a, const Tensor& dt_bias, const Tensor& b, std::optional<double> scale,
    std::optional<Tensor> output, bool use_qk_l2norm, const std::string& backend) {
  return call_op<&gated_delta_rule_decode>(
      [&] {
        check_gdn_backend(backend, /*rubin=*/false, q.device(), "gated_delta_rule_decode");
        return decode_impl(q, k, v, state, A_log, a, dt_bias, b, scale, output, use_qk_l2norm);
      },
      q, k, v, state, A_log, a, dt_bias, b, scale, output, use_qk_l2norm, backend);
}

std::tuple<Tensor, Tensor> gated_delta_rule_mtp(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& initial_state,
    const Tensor& initial_state_indices, const Tensor& A_log, const Tensor& a,
    const Tensor& dt_bias, const Tensor& b, std::optional<double> scale,
    std::optional<Tensor> output, std::optional<Tensor> intermediate_states_buffer,
    std::optional<Tensor> ssm_state_indices, std::optional<bool> disable_state_update,
    bool use_qk_l2norm, std::optional<Tensor> output_state_indices, bool cache_replayssm,
    std::optional<Tensor> replayssm_rawv, std::optional<Tensor> replayssm_rawk,
    std::optional<Tensor> replayssm_g, std::optional<Tensor> replayssm_beta) {
  return call_op<&gated_delta_rule_mtp>(
      [&] {
        return mtp_impl(
            q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b, scale, output,
            intermediate_states_buffer, ssm_state_indices, disable_state_update, use_qk_l2norm,
            output_state_indices,
            {cache_replayssm, replayssm_rawv, replayssm_rawk, replayssm_g, replayssm_beta});
      },
      q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b, scale, output,
      intermediate_states_buffer, ssm_state_indices, disable_state_update, use_qk_l2norm,
      output_state_indices, cache_replayssm, replayssm_rawv, replayssm_rawk, replayssm_g,
      replayssm_beta);
}

GdnPrefillOutput chunk_gated_delta_rule(
    const Tensor& q, const Tensor& k, const Tensor& v, std::optional<Tensor> g,
    std::optional<Tensor> beta, std::optional<double> scale, std::optional<Tensor> initial_state,
    bool output_final_state, std::optional<Tensor> cu_seqlens, bool use_qk_l2norm_in_kernel,
    std::optional<Tensor> output, std::optional<Tensor> output_state,
    std::optional<Tensor> state_checkpoints, std::optional<Tensor> checkpoint_cu_starts,
    int64_t checkpoint_every_n_tokens, Value use_cp, std::optional<Tensor> state_indices,
    std::optional<int64_t> _cp_chunk_len, const std::string& backend,
    std::optional<int64_t> max_seqlen, const std::string& gate_domain, bool use_gate_in_kernel,
    std::optional<Tensor> A_log, std::optional<Tensor> dt_bias, bool beta_is_logit,
    Value cu_seqlens_cpu, std::optional<Tensor> output_state_indices,
    std::optional<Tensor> checkpoint_state_indices, std::optional<Tensor> prefix_lens) {
  return call_op<&chunk_gated_delta_rule>(
      [&] {
        PrefillExtras x;
        x.backend = backend, x.max_seqlen = max_seqlen, x.gate_domain = gate_domain;
        x.use_gate_in_kernel = use_gate_in_kernel, x.A_log = A_log, x.dt_bias = dt_bias;
        x.beta_is_logit = beta_is_logit, x.cu_seqlens_cpu = cu_seqlens_cpu;
        x.output_state_indices = output_state_indices;
        x.checkpoint_state_indices = checkpoint_state_indices, x.prefix_lens = prefix_lens;
        return prefill_impl(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                            use_qk_l2norm_in_kernel, output, output_state, state_checkpoints,
                            checkpoint_cu_starts, checkpoint_every_n_tokens, use_cp, state_indices,
                            _cp_chunk_len, x);
      },
      q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
      use_qk_l2norm_in_kernel, output, output_state, state_checkpoints, checkpoint_cu_starts,
      checkpoint_every_n_tokens, use_cp, state_indices, _cp_chunk_len, backend, max_seqlen,
      gate_domain, use_gate_in_kernel, A_log, dt_bias, beta_is_logit, cu_seqlens_cpu,
      output_state_indices, checkpoint_state_indices, prefix_lens);
}

namespace {

constexpr const char* kGdnFusedModule = "flashinfer.gdn_kernels.experimental.gdn_fused_decode";

void check_bf16(const Tensor& t, const Tensor& ref, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  api::check_dtype_in(t, {DType::kBFloat16}, op, arg);
  api::check_same_device(t, ref, op, arg, "hidden_states");
}

std::tuple<Tensor, Tensor, Tensor> fused_decode_impl(
    const Tensor& hidden_states, const Tensor& w_ba, const Tensor& mixed_qkv,
    const Tensor& conv_weight, const Tensor& conv_bias, const Tensor& conv_state,
    const Tensor& A_log, const Tensor& dt_bias, std::optional<double> scale,
    const Tensor& ssm_state, const Tensor& state_indices, bool l2norm, std::optional<Tensor> out) {
  const char* op = "gdn_fused_decode_step";
  const Tensor& hs = hidden_states;
  check_bf16(hs, hs, op, "hidden_states");
  api::check_dim(hs, {2}, op, "hidden_states");
  FLASHINFER_CHECK(hs.stride(1) == 1 || hs.size(1) <= 1, op, "hidden_states",
                   "must have stride 1 in the hidden dimension, got ", hs.stride(1));
  const int64_t B = hs.size(0), hidden = hs.size(1);
  api::check_defined(A_log, op, "A_log");
  api::check_dim(A_log, {1}, op, "A_log");
  const int64_t HV = A_log.size(0);
  api::check_defined(ssm_state, op, "ssm_state");
  api::check_dim(ssm_state, {4}, op, "ssm_state");
  const int64_t D = ssm_state.size(3);
  FLASHINFER_CHECK(HV >= 1 && D >= 1, op, "A_log", "needs at least one value head (HV ", HV,
                   ") and a positive head dim (D ", D, ")");
  check_bf16(w_ba, hs, op, "w_ba");
  api::check_shape_eq(w_ba, {hidden, 2 * HV}, op, "w_ba");
  check_bf16(mixed_qkv, hs, op, "mixed_qkv");
  api::check_dim(mixed_qkv, {2}, op, "mixed_qkv");
  FLASHINFER_CHECK(mixed_qkv.size(0) == B, op, "mixed_qkv", "expected ", B, " rows, got ",
                   mixed_qkv.size(0));
  const int64_t qkv_dim = mixed_qkv.size(1);
  // qkv_dim = (2 * H_q + HV) * D: upstream's h_q = (qkv_dim - HV * D) // (2 * D).
  const int64_t rest = qkv_dim - HV * D;
  FLASHINFER_CHECK(rest > 0 && rest % (2 * D) == 0, op, "mixed_qkv", "qkv_dim ", qkv_dim,
                   " is not (2 * H_q + HV) * D with HV ", HV, ", D ", D, " and H_q >= 1");
  const int64_t Hq = rest / (2 * D);
  FLASHINFER_CHECK(HV % Hq == 0, op, "A_log", "the value heads (", HV,
                   ") must be a multiple of the q / k heads (", Hq, ")");
  check_bf16(conv_weight, hs, op, "conv_weight");
  api::check_dim(conv_weight, {2}, op, "conv_weight");
  FLASHINFER_CHECK(conv_weight.size(0) == qkv_dim && conv_weight.size(1) >= 1, op, "conv_weight",
                   "expected [", qkv_dim, ", width], got ", shape_to_string(conv_weight.shape()));
  const int64_t W = conv_weight.size(1);
  check_bf16(conv_bias, hs, op, "conv_bias");
  api::check_shape_eq(conv_bias, {qkv_dim}, op, "conv_bias");
  check_bf16(conv_state, hs, op, "conv_state");
  api::check_dim(conv_state, {3}, op, "conv_state");
  FLASHINFER_CHECK(
      conv_state.size(0) >= 1 && conv_state.size(1) == qkv_dim && conv_state.size(2) == W - 1, op,
      "conv_state", "expected the logical view [pool, ", qkv_dim, ", ", W - 1,
      "] (width - 1 = ", W - 1, " steps), got ", shape_to_string(conv_state.shape()));
  api::check_writable(conv_state, op, "conv_state");
  api::check_dtype_in(A_log, {DType::kFloat32}, op, "A_log");
  api::check_same_device(A_log, hs, op, "A_log", "hidden_states");
  api::check_defined(dt_bias, op, "dt_bias");
  api::check_dtype_in(dt_bias, {DType::kBFloat16, DType::kFloat32}, op, "dt_bias");
  api::check_shape_eq(dt_bias, {HV}, op, "dt_bias");
  api::check_same_device(dt_bias, hs, op, "dt_bias", "hidden_states");
  check_unit_vectors(A_log, dt_bias, op);
  api::check_dtype_in(ssm_state, {DType::kFloat32}, op, "ssm_state");
  api::check_same_device(ssm_state, hs, op, "ssm_state", "hidden_states");
  const int64_t P = ssm_state.size(0);
  FLASHINFER_CHECK(P >= 1 && ssm_state.size(1) == HV && ssm_state.size(2) == D, op, "ssm_state",
                   "expected [pool, HV, V, K] = [pool, ", HV, ", ", D, ", ", D, "], got ",
                   shape_to_string(ssm_state.shape()));
  FLASHINFER_CHECK(ssm_state.stride(3) == 1, op, "ssm_state",
                   "must be K-contiguous (stride[-1] == 1), got stride ", ssm_state.stride(3));
  api::check_writable(ssm_state, op, "ssm_state");
  FLASHINFER_CHECK(conv_state.size(0) == P, op, "conv_state", "its pool has ", conv_state.size(0),
                   " slots but ssm_state's has ", P, " (state_indices index both)");
  check_index_vector(state_indices, B, hs, op, "state_indices");
  check_slots(state_indices, P, SlotNegatives::kRefused, op, "state_indices");
  if (out && out->defined()) {
    check_bf16(*out, hs, op, "out");
    api::check_shape_eq(*out, {B, 1, HV, D}, op, "out");
    FLASHINFER_CHECK(out->is_contiguous(), op, "out", "must be contiguous (dense)");
  } else {
    out = Tensor::empty({B, 1, HV, D}, DType::kBFloat16, hs.device());
  }
  api::check_no_overlap(conv_state, ssm_state, op, "conv_state", "ssm_state");
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&hs, "hidden_states"},
                                {&w_ba, "w_ba"},
                                {&mixed_qkv, "mixed_qkv"},
                                {&conv_weight, "conv_weight"},
                                {&conv_bias, "conv_bias"}}) {
    api::check_no_overlap(conv_state, *t, op, "conv_state", name);
    api::check_no_overlap(*out, *t, op, "out", name);
  }
  api::check_no_overlap(*out, conv_state, op, "out", "conv_state");
  api::check_no_overlap(*out, ssm_state, op, "out", "ssm_state");

  // The prologue: ba and the conv output to scratch rows. On CUDA they are the stream's scratch
  // (kernels/cuda/stream_scratch.h), never freed: a CUDA graph capturing this call addresses
  // them on every replay, where temporary tensors would be freed at return (cudaFree, which a
  // capture refuses).
  Tensor ba, conv_out;
  uint16_t *ba_rows = nullptr, *conv_rows = nullptr;
#if FLASHINFER_WITH_CUDA
  std::optional<kernels::cuda::StreamScratch> scratch;  // held until both launches are queued
  if (hs.device().is_cuda()) {
    // Refused before the prologue shifts the conv pool in place.
    FLASHINFER_CHECK_CODE(D <= kernels::cuda::kGdnMaxHeadDimK, ErrorCode::kUnsupported, op,
                          "ssm_state", "head dim ", D, " above the CUDA kernel's ",
                          kernels::cuda::kGdnMaxHeadDimK, " (it keeps a state row in registers)");
    FLASHINFER_CHECK_CODE(B <= 65535 && HV <= 65535, ErrorCode::kUnsupported, op, "hidden_states",
                          "batch ", B, " and ", HV,
                          " value heads: the CUDA kernels take at most 65535 of each (grid rows)");
    static kernels::cuda::StreamScratchPool pool("GDN fused-step scratch");
    const std::size_t ba_bytes = static_cast<std::size_t>(B * 2 * HV) * 2;
    const std::size_t conv_bytes = static_cast<std::size_t>(B * qkv_dim) * 2;
    const std::size_t conv_at = (ba_bytes + 255) / 256 * 256;
    if (B > 0) {
      scratch = pool.acquire(op, hs.device().index, current_cuda_stream(), conv_at + conv_bytes);
      ba_rows = static_cast<uint16_t*>(scratch->data());
      conv_rows = reinterpret_cast<uint16_t*>(static_cast<char*>(scratch->data()) + conv_at);
    }
  }
#endif
  if (!hs.device().is_cuda()) {
    ba = Tensor::empty({B, 2 * HV}, DType::kBFloat16, hs.device());
    conv_out = Tensor::empty({B, qkv_dim}, DType::kBFloat16, hs.device());
    ba_rows = static_cast<uint16_t*>(ba.data_ptr());
    conv_rows = static_cast<uint16_t*>(conv_out.data_ptr());
  }
  kernels::GdnFusedPrologueParams pp;
  pp.B = B, pp.hidden = hidden, pp.n_ba = 2 * HV, pp.qkv_dim = qkv_dim, pp.width = W;
  auto bits = [](const Tensor& t) { return static_cast<const uint16_t*>(t.data_ptr()); };
  pp.hidden_states = bits(hs);
  pp.hs_stride_b = hs.stride(0);
  pp.w_ba = bits(w_ba);
  pp.w_stride_i = w_ba.stride(0), pp.w_stride_j = w_ba.stride(1);
  pp.mixed_qkv = bits(mixed_qkv);
  pp.x_stride_b = mixed_qkv.stride(0), pp.x_stride_c = mixed_qkv.stride(1);
  pp.conv_weight = bits(conv_weight);
  pp.cw_stride_c = conv_weight.stride(0), pp.cw_stride_j = conv_weight.stride(1);
  pp.conv_bias = bits(conv_bias);
  pp.cb_stride = conv_bias.stride(0);
  pp.conv_state = static_cast<uint16_t*>(conv_state.data_ptr());
  pp.pool = P;
  pp.cs_stride_p = conv_state.stride(0), pp.cs_stride_c = conv_state.stride(1);
  pp.cs_stride_t = conv_state.stride(2);
  pp.state_indices = state_indices.data_ptr();
  pp.indices_i64 = state_indices.dtype() == DType::kInt64;
  pp.ba = ba_rows;
  pp.conv_out = conv_rows;
  if (B == 0) return {*out, conv_state, ssm_state};
  api::launch(kGdnFusedPrologueKernels, pp, hs.device(), op, "hidden_states");

  // The recurrence: q, k, v heads of conv_out's rows, b and a the halves of ba's.
  GdnParams p;
  p.num_seqs = B;
  p.T = 1;
  p.H = HV, p.Hq = Hq, p.Hk = Hq, p.Hv = HV, p.K = D, p.V = D;
  p.io_dtype = DType::kBFloat16;
  const uint16_t* co = conv_rows;
  p.q = co;
  p.k = co + Hq * D;
  p.v = co + 2 * Hq * D;
  p.q_stride_seq = p.k_stride_seq = p.v_stride_seq = qkv_dim;
  p.q_stride_tok = p.k_stride_tok = p.v_stride_tok = qkv_dim;
  p.q_stride_head = p.k_stride_head = p.v_stride_head = D;
  p.decode_gates = true;
  const uint16_t* bap = ba_rows;
  p.b = {bap, DType::kBFloat16, 2 * HV, 2 * HV, 1};
  p.a = {bap + HV, DType::kBFloat16, 2 * HV, 2 * HV, 1};
  p.A_log = A_log.data<float>();
  p.dt_bias = dt_bias.data_ptr();
  p.dt_bias_dtype = dt_bias.dtype();
  p.l2norm = l2norm;
  // Upstream scales the output (scale * q . S), not q; None and 0 both mean D^-0.5.
  p.scale_output = true;
  p.scale =
      static_cast<float>(scale && *scale != 0.0 ? *scale : 1.0 / std::sqrt(static_cast<double>(D)));
  p.out = out->data_ptr();
  p.out_dtype = DType::kBFloat16;
  p.out_via_bf16 = true;
  p.out_stride_seq = p.out_stride_tok = HV * D;
  p.out_stride_head = D;
  p.state_in = p.state_out = state_ref(ssm_state, true);
  p.read_idx = state_indices.data_ptr();
  p.read_idx_i64 = state_indices.dtype() == DType::kInt64;
  // Upstream gathers every request's state before it writes any: requests sharing a slot all
  // start from the slot's state as it was, and the last one's state is written. The recurrence
  // reads and writes a slot per request in order, so on the CPU (indices on the host) such
  // calls read from a gathered copy. On CUDA sharing a slot is undefined, as upstream's kernels
  // leave it (engines never share a slot between live requests).
  Tensor gathered;
  if (hs.device().is_cpu()) {
    const std::vector<int64_t> slots = api::host_ints(state_indices);
    if (std::set<int64_t>(slots.begin(), slots.end()).size() != slots.size()) {
      gathered = Tensor::empty({B, HV, D, D}, DType::kFloat32);
      for (int64_t b = 0; b < B; ++b) {
        gathered.select(0, b).copy_(ssm_state.select(0, slots[static_cast<size_t>(b)]));
      }
      p.state_in = state_ref(gathered, true);  // request b reads row b
      p.read_idx = nullptr;
      p.write_idx = state_indices.data_ptr();
      p.write_idx_i64 = p.read_idx_i64;
      p.read_idx_i64 = false;
    }
  }
  p.negative_read = kernels::GdnNegativeRead::kInvalid;  // checked on the host when it can be
  p.negative_write = kernels::GdnNegativeWrite::kSkip;
  p.write_final = true;
  api::launch(kGdnKernels, p, hs.device(), op, "hidden_states");
  return {*out, conv_state, ssm_state};
}

// Upstream's registry of specialized kernels (gdn_fused_decode_registry.json): (compute
// capability, batch, hidden, n_ba, qkv_dim, h_q, hv, d, conv width, conv state length), each
// with an "SD" conv pool.
struct FusedGeometry {
  int64_t hidden, n_ba, qkv_dim, h_q, hv, d, width, state_len, max_batch;
};
constexpr FusedGeometry kFusedRegistry[] = {
    {5120, 96, 10240, 16, 48, 128, 4, 3, 8},  // Qwen3.6-27B: batches 1, 2, 4, 8
    {2048, 64, 8192, 16, 32, 128, 4, 3, 4},   // Qwen3.6-35B-A3B: batches 1, 2, 4
};

// The probe's device: None (CUDA device 0), an index, "cuda[:N]" or a recorded torch.device
// ("device(type='cuda', index=1)"); nullopt for anything that is not a CUDA device.
std::optional<int> probe_device(const std::optional<Value>& device) {
  if (!device || device->is_none()) return 0;
  if (device->kind() == Value::Kind::kInt) {
    const int64_t i = device->as_int();
    if (i < 0 || i > 1024) return std::nullopt;
    return static_cast<int>(i);
  }
  std::string text;
  if (device->kind() == Value::Kind::kString) text = device->as_string();
  if (device->kind() == Value::Kind::kObject) {
    const std::string& r = device->as_object().repr;
    if (r.find("type='cuda'") == std::string::npos) return std::nullopt;
    const auto at = r.find("index=");
    if (at == std::string::npos) return 0;
    text = "cuda:" + r.substr(at + 6, r.find_first_of(",)", at) - at - 6);
  }
  try {
    const Device d = Device::parse(text);
    if (d.is_cuda()) return d.index;
  } catch (const Error&) {
  }
  return std::nullopt;
}

bool fused_supported_impl(int64_t batch, int64_t hidden, int64_t n_ba, int64_t qkv_dim, int64_t h_q,
                          int64_t hv, int64_t d, int64_t width, int64_t state_len,
                          const std::optional<Value>& device, const std::string& layout) {
  if (layout != "SD" && layout != "DS") return false;
  const std::optional<int> index = probe_device(device);
  if (!index || *index < 0 || *index >= cuda_device_count()) return false;
  const int cc = api::compute_capability(Device::cuda(*index));
  if (cc != 120 && cc != 121) return false;
  if (layout != "SD" || batch < 1 || (batch & (batch - 1)) != 0) return false;  // 1, 2, 4, 8
  for (const FusedGeometry& g : kFusedRegistry) {
    if (g.hidden == hidden && g.n_ba == n_ba && g.qkv_dim == qkv_dim && g.h_q == h_q &&
        g.hv == hv && g.d == d && g.width == width && g.state_len == state_len &&
        batch <= g.max_batch) {
      return true;
    }
  }
  return false;
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> gdn_fused_decode_step(
    const Tensor& hidden_states, const Tensor& w_ba, const Tensor& mixed_qkv,
    const Tensor& conv_weight, const Tensor& conv_bias, const Tensor& conv_state,
    const Tensor& A_log, const Tensor& dt_bias, std::optional<double> scale,
    const Tensor& ssm_state, const Tensor& state_indices, bool use_qk_l2norm,
    std::optional<Tensor> out) {
  return call_op<&gdn_fused_decode_step>(
      [&] {
        return fused_decode_impl(hidden_states, w_ba, mixed_qkv, conv_weight, conv_bias, conv_state,
                                 A_log, dt_bias, scale, ssm_state, state_indices, use_qk_l2norm,
                                 out);
      },
      hidden_states, w_ba, mixed_qkv, conv_weight, conv_bias, conv_state, A_log, dt_bias, scale,
      ssm_state, state_indices, use_qk_l2norm, out);
}

bool gdn_fused_decode_step_supported(int64_t batch_size, int64_t hidden_size, int64_t n_ba,
                                     int64_t qkv_dim, int64_t num_qk_heads, int64_t num_v_heads,
                                     int64_t head_dim, int64_t conv_width, int64_t conv_state_len,
                                     std::optional<Value> device, std::string conv_state_layout) {
  return call_op<&gdn_fused_decode_step_supported>(
      [&] {
        return fused_supported_impl(batch_size, hidden_size, n_ba, qkv_dim, num_qk_heads,
                                    num_v_heads, head_dim, conv_width, conv_state_len, device,
                                    conv_state_layout);
      },
      batch_size, hidden_size, n_ba, qkv_dim, num_qk_heads, num_v_heads, head_dim, conv_width,
      conv_state_len, device, conv_state_layout);
}

namespace {

// ---- bench hooks: GVA heads (HV = num_qo_heads v heads over num_kv_heads q/k heads), K = V =
// head_dim_qk, bf16 inputs, fp32 states. ---------------------------------------------------------

struct DecodeInputs {
  std::vector<Value> args;
  double bytes = 0.0, flops = 0.0;
};

DecodeInputs decode_inputs(const BenchShape& s, Device dev, int64_t T, bool k_major) {
  const int64_t B = s.batch_size, H = s.num_kv_heads, HV = s.num_qo_heads;
  const int64_t K = s.head_dim_qk, V = s.head_dim_qk;
  const DType dt = s.q_dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
  const uint64_t seed = s.random_seed;
  using api::bench::random_tensor;
  DecodeInputs in;
  in.args = {Value(random_tensor({B, T, H, K}, dt, dev, seed)),
             Value(random_tensor({B, T, H, K}, dt, dev, seed + 1)),
             Value(random_tensor({B, T, HV, V}, dt, dev, seed + 2)),
             Value(random_tensor(k_major ? Shape{B, HV, K, V} : Shape{B, HV, V, K}, DType::kFloat32,
                                 dev, seed + 3, -0.5, 0.5)),
             Value(random_tensor({HV}, DType::kFloat32, dev, seed + 4, -1.0, 0.5)),
             Value(random_tensor({B, T, HV}, dt, dev, seed + 5)),
             Value(random_tensor({HV}, DType::kFloat32, dev, seed + 6)),
             Value(random_tensor({B, T, HV}, dt, dev, seed + 7, -2.0, 2.0))};
  const double state = static_cast<double>(B * HV * K * V) * 4.0;
  in.bytes = 2.0 * state + static_cast<double>(B * T * (2 * H * K + 2 * HV * V)) * 2.0;
  in.flops = static_cast<double>(B * T * HV * K * V) * 8.0;
  return in;
}

// One decode step on a K-last [B, HV, V, K] or a K-major [B, HV, K, V] state.
BenchCase bench_one_step(const char* op, bool k_major, const BenchShape& s, Device dev) {
  DecodeInputs in = decode_inputs(s, dev, 1, k_major);
  BenchCase c = api::bench::invoke_case(op, in.args);
  c.bytes = in.bytes;
  c.flops = in.flops;
  return c;
}

// MTP: s_qo draft tokens per request, a pool of 2B slots read at odd slots, the final state
// written back and every step's state to the buffer.
BenchCase bench_mtp(const BenchShape& s, Device dev) {
  const int64_t B = s.batch_size, T = std::max<int64_t>(1, s.s_qo), HV = s.num_qo_heads;
  const int64_t K = s.head_dim_qk;
  DecodeInputs in = decode_inputs(s, dev, T, false);
  Tensor pool = api::bench::random_tensor({2 * B, HV, K, K}, DType::kFloat32, dev,
                                          s.random_seed + 8, -0.5, 0.5);
  std::vector<int64_t> idx;
  for (int64_t b = 0; b < B; ++b) idx.push_back(2 * b + 1);
  Tensor slots = api::bench::int32_tensor(idx, dev);
  Tensor buffer = Tensor::zeros({B, T, HV, K, K}, DType::kFloat32, dev);
  std::vector<Value> args = {in.args[0], in.args[1], in.args[2], Value(pool), Value(slots),
                             in.args[4], in.args[5], in.args[6], in.args[7]};
  BenchCase c = api::bench::invoke_case(
      "gated_delta_rule_mtp", args,
      {{"intermediate_states_buffer", Value(buffer)}, {"disable_state_update", Value(false)}});
  c.bytes = in.bytes + static_cast<double>(B * T * HV * K * K) * 4.0;
  c.flops = in.flops;
  return c;
}

// Prefill: batch_size sequences of s_kv tokens (the last one shorter), num_qo_heads value heads
// over num_kv_heads query heads (GVA; GQA when there are more query heads), decay in (0.5, 1),
// beta in (0, 1), k rows L2-normalized as engines pass them (the rule is stable then), an
// initial state, the final state out.
BenchCase bench_prefill(const BenchShape& s, Device dev) {
  const int64_t N = s.batch_size, L = std::max<int64_t>(1, s.s_kv);
  const int64_t Hq = s.num_kv_heads, Hv = s.num_qo_heads, D = s.head_dim_qk;
  const int64_t H = std::max(Hq, Hv), Hk = Hq >= Hv ? Hv : Hq;
  std::vector<int64_t> cu = {0};
  for (int64_t n = 0; n < N; ++n) cu.push_back(cu.back() + (n + 1 == N ? (L + 1) / 2 : L));
  const int64_t T = cu.back();
  const DType dt = s.q_dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
  const uint64_t seed = s.random_seed;
  using api::bench::random_tensor;
  Tensor k = random_tensor({T, Hk, D}, DType::kFloat32, Device::cpu(), seed + 1);
  float* kp = k.data<float>();
  for (int64_t r = 0; r < T * Hk; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(kp[r * D + i]) * kp[r * D + i];
    const double inv = ss > 0.0 ? 1.0 / std::sqrt(ss) : 0.0;
    for (int64_t i = 0; i < D; ++i) kp[r * D + i] = static_cast<float>(kp[r * D + i] * inv);
  }
  Tensor cu_t = api::bench::int32_tensor(cu, dev).to(DType::kInt64);
  BenchCase c = api::bench::invoke_case(
      "chunk_gated_delta_rule",
      {Value(random_tensor({T, Hq, D}, dt, dev, seed)), Value(k.to(dt).to(dev)),
       Value(random_tensor({T, Hv, D}, dt, dev, seed + 2)),
       Value(random_tensor({T, H}, DType::kFloat32, dev, seed + 3, 0.5, 1.0)),
       Value(random_tensor({T, H}, DType::kFloat32, dev, seed + 4, 0.0, 1.0))},
      {{"initial_state",
        Value(random_tensor({N, H, D, D}, DType::kFloat32, dev, seed + 5, -0.5, 0.5))},
       {"output_final_state", Value(true)},
       {"cu_seqlens", Value(cu_t)}});
  c.bytes = static_cast<double>(T * (Hq + Hk + Hv + H) * D) * 2.0 +
            static_cast<double>(2 * N * H * D * D) * 4.0;
  c.flops = static_cast<double>(T * H * D * D) * 8.0;
  return c;
}

// The fused decode step at a Qwen3.6-style geometry: HV = num_qo_heads value heads over H_q =
// num_kv_heads q / k heads of head_dim_qk, hidden = 16 * HV * D / 3 rounded to 256 (5120 at 48
// x 128), conv width 4, pools of 2B slots read at odd slots, bf16 in, fp32 ssm state.
BenchCase bench_fused_step(const BenchShape& s, Device dev) {
  const int64_t B = s.batch_size, HV = s.num_qo_heads, Hq = s.num_kv_heads, D = s.head_dim_qk;
  const int64_t qkv = (2 * Hq + HV) * D, W = 4, P = 2 * B;
  const int64_t hidden = std::max<int64_t>(256, (HV * D * 16 / 3 + 255) / 256 * 256);
  const uint64_t seed = s.random_seed;
  using api::bench::random_tensor;
  const DType bf = DType::kBFloat16;
  std::vector<int64_t> idx;
  for (int64_t b = 0; b < B; ++b) idx.push_back(2 * b + 1);
  const double scale_w = 1.0 / std::sqrt(static_cast<double>(hidden));
  std::vector<Value> args = {
      Value(random_tensor({B, hidden}, bf, dev, seed)),
      Value(random_tensor({hidden, 2 * HV}, bf, dev, seed + 1, -scale_w, scale_w)),
      Value(random_tensor({B, qkv}, bf, dev, seed + 2)),
      Value(random_tensor({qkv, W}, bf, dev, seed + 3, -0.5, 0.5)),
      Value(random_tensor({qkv}, bf, dev, seed + 4, -0.1, 0.1)),
      Value(random_tensor({P, W - 1, qkv}, bf, dev, seed + 5).transpose(1, 2)),  // SD pool
      Value(random_tensor({HV}, DType::kFloat32, dev, seed + 6, -1.0, 0.5)),
      Value(random_tensor({HV}, bf, dev, seed + 7)),
      Value(),
      Value(random_tensor({P, HV, D, D}, DType::kFloat32, dev, seed + 8, -0.5, 0.5)),
      Value(api::bench::int32_tensor(idx, dev))};
  BenchCase c = api::bench::invoke_case("gdn_fused_decode_step", args);
  c.bytes = static_cast<double>(hidden * 2 * HV + B * (hidden + 2 * qkv + 2 * (W - 1) * qkv) +
                                qkv * (W + 1) + B * HV * D) *
                2.0 +
            static_cast<double>(2 * B * HV * D * D) * 4.0;
  c.flops = static_cast<double>(B) *
            (2.0 * hidden * 2 * HV + 2.0 * W * qkv + 8.0 * static_cast<double>(HV * D * D));
  return c;
}

// Replay's comparison of chunk_gated_delta_rule (replay/result_comparators.h). Two correct
// kernels differ in the fp32 states by more than replay's fp32 tolerance: the CPU runs the token
// recurrence in fp32, a GPU the chunked (WY) form with every MMA operand rounded to the io dtype
// (this library's chunked kernel, upstream's kernels alike). A state element (the returned final
// state, an output_state pool, state_checkpoints) passes within replay's tolerance or within
// upstream's own test tolerance for the io dtype (bf16: atol 5e-3, rtol 1e-3; fp16: 1e-3, 1e-4;
// docs/upstream-facts/gdn_prefill.md, section 5); the outputs (io dtype) keep replay's.
// GdnChunk.CudaTestCasesEmulatedWithinUpstreamTolerances shows the chunked form within them; a
// wrong state (a chunk lost, a decay misapplied) misses by the size of the state's entries.
std::pair<double, double> prefill_state_tolerance(DType io) {
  return io == DType::kBFloat16 ? std::pair{5e-3, 1e-3} : std::pair{1e-3, 1e-4};
}

void widen_state_comparison(replay::TensorComparison& c, const Tensor& actual,
                            const Tensor& expected, DType io) {
  if (c.match || !c.problem.empty() || expected.dtype() != DType::kFloat32) return;
  const auto [atol, rtol] = prefill_state_tolerance(io);
  const std::vector<double> a = actual.to(Device::cpu()).to_double_vector();
  const std::vector<double> e = expected.to(Device::cpu()).to_double_vector();
  if (a.size() != e.size()) return;
  int64_t bad = 0, first = -1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    bool ok;
    if (std::isnan(a[i]) || std::isnan(e[i])) {
      ok = std::isnan(a[i]) && std::isnan(e[i]);
    } else if (std::isinf(a[i]) || std::isinf(e[i])) {
      ok = a[i] == e[i];
    } else {
      const double d = std::fabs(a[i] - e[i]);
      ok = d <= c.atol + c.rtol * std::fabs(e[i]) || d <= atol + rtol * std::fabs(e[i]);
    }
    if (!ok) {
      ++bad;
      if (first < 0) first = static_cast<int64_t>(i);
    }
  }
  c.mismatches = bad;
  c.first_mismatch = first;
  c.match = bad == 0;
}

bool compare_chunk_gdn(const std::vector<Value>& args, const std::map<std::string, Tensor>& actual,
                       const NamedTensors& expected, const detail::CompareFn& compare,
                       detail::ResultCheck& out) {
  if (args.empty() || !args[0].is_tensor()) return false;
  const DType io = args[0].as_tensor().dtype();
  for (const auto& [key, e] : expected) {
    const auto it = actual.find(key);
    if (it == actual.end()) {
      replay::TensorComparison c;
      c.key = key;
      c.problem = "the replayed call returned no tensor '" + key + "'";
      out.comparisons.push_back(c);
      continue;
    }
    replay::TensorComparison c = compare(key, it->second, e);
    widen_state_comparison(c, it->second, e, io);
    out.comparisons.push_back(c);
  }
  out.recheck_mutated = [io](std::string_view param, const Tensor& a, const Tensor& e,
                             replay::TensorComparison& c) {
    if (param == "output_state" || param == "state_checkpoints") {
      widen_state_comparison(c, a, e, io);
    }
  };
  out.note =
      std::string(
          "chunk_gated_delta_rule: fp32 states within replay's tolerance or "
          "upstream's test tolerance for ") +
      (io == DType::kBFloat16 ? "bf16 (atol 5e-3, rtol 1e-3)" : "fp16 (atol 1e-3, rtol 1e-4)") +
      ", as a GPU's chunked form rounds its operands to the io dtype";
  return true;
}

}  // namespace

namespace detail {

void register_gdn_ops(OpRegistry& r) {
  declare<&gated_delta_rule_decode_pretranspose>(
      r,
      {.name = "gated_delta_rule_decode_pretranspose",
       .module = kGdnDecodeModule,
       .summary = "Gated delta rule decode against a K-last ([.., V, K]) state or state pool"},
      "q", "k", "v", arg("state").mut().required(), "A_log", "a", "dt_bias", "b", "scale",
      arg("output").mut(), arg("use_qk_l2norm", true), arg("initial_state").mut(),
      "initial_state_indices", "output_state_indices", arg("intermediate_states_buffer").mut(),
      arg("disable_state_update", false), arg("backend", "auto"));
  declare<&gated_delta_rule_decode>(
      r,
      {.name = "gated_delta_rule_decode",
       .module = kGdnDecodeModule,
       .summary = "Gated delta rule decode step against a K-major ([B, HV, K, V]) fp32 state"},
      "q", "k", "v", arg("state").mut(), "A_log", "a", "dt_bias", "b", "scale", arg("output").mut(),
      arg("use_qk_l2norm", true), arg("backend", "auto"));
  declare<&gated_delta_rule_mtp>(
      r,
      {.name = "gated_delta_rule_mtp",
       .module = kGdnDecodeModule,
       .summary = "Gated delta rule multi-token verify steps from an fp32 state pool"},
      "q", "k", "v", arg("initial_state").mut(), "initial_state_indices", "A_log", "a", "dt_bias",
      "b", "scale", arg("output").mut(), arg("intermediate_states_buffer").mut(),
      "ssm_state_indices", "disable_state_update", arg("use_qk_l2norm", true),
      "output_state_indices", arg("cache_replayssm", false), arg("replayssm_rawv").mut(),
      arg("replayssm_rawk").mut(), arg("replayssm_g").mut(), arg("replayssm_beta").mut());
  declare<&chunk_gated_delta_rule>(
      r,
      {.name = "chunk_gated_delta_rule",
       .module = kGdnPrefillModule,
       .summary = "Gated delta rule prefill over packed sequences (Qwen3-Next linear attention)"},
      "q", "k", "v", "g", "beta", "scale", "initial_state", arg("output_final_state", false),
      "cu_seqlens", arg("use_qk_l2norm_in_kernel", false), arg("output").mut(),
      // In place over the state pool (state_indices with output_state is initial_state), as
      // upstream allows.
      arg("output_state").mut().same_view_as("initial_state"),
      // A checkpoint pool may be the state pool itself (0.7.4's checkpoint_state_indices into a
      // paged recurrent-state cache).
      arg("state_checkpoints").mut().same_view_as("initial_state").same_view_as("output_state"),
      "checkpoint_cu_starts", arg("checkpoint_every_n_tokens", int64_t{0}),
      arg("use_cp", Value(std::string("auto"))), "state_indices", "_cp_chunk_len",
      arg("backend", "auto"), "max_seqlen", arg("gate_domain", "linear").kw(),
      arg("use_gate_in_kernel", false).kw(), arg("A_log").kw(), arg("dt_bias").kw(),
      arg("beta_is_logit", false).kw(), arg("cu_seqlens_cpu", Value()).kw(),
      arg("output_state_indices").kw(), arg("checkpoint_state_indices").kw(),
      arg("prefix_lens").kw());

  declare<&gdn_fused_decode_step>(
      r,
      {.name = "gdn_fused_decode_step",
       .module = kGdnFusedModule,
       .summary = "One GDN decode step fused: b/a GEMV, conv1d update, q/k/v split, gated delta "
                  "rule over paged conv / ssm state pools"},
      "hidden_states", "w_ba", "mixed_qkv", "conv_weight", "conv_bias", arg("conv_state").mut(),
      "A_log", "dt_bias", arg("scale").required(), arg("ssm_state").mut(), "state_indices",
      arg("use_qk_l2norm", true), arg("out").mut());
  declare<&gdn_fused_decode_step_supported>(
      r,
      {.name = "gdn_fused_decode_step_supported",
       .module = kGdnFusedModule,
       .summary = "Whether upstream serves a fused GDN decode geometry with a specialized kernel"},
      "batch_size", arg("hidden_size", int64_t{5120}), arg("n_ba", int64_t{96}),
      arg("qkv_dim", int64_t{10240}), arg("num_qk_heads", int64_t{16}),
      arg("num_v_heads", int64_t{48}), arg("head_dim", int64_t{128}), arg("conv_width", int64_t{4}),
      arg("conv_state_len", int64_t{3}), "device", arg("conv_state_layout", std::string("SD")));
  api::register_backends("gdn_fused_decode_step", kGdnFusedPrologueKernels);
  static constexpr api::BackendSummary kProbe[] = {
      {DeviceType::kCPU, "host-side probe: upstream's registry and the device's capability"}};
  api::register_backends("gdn_fused_decode_step_supported", kProbe);
  register_bench_hook("gdn_fused_decode_step", bench_fused_step);
  for (const char* op : {"gated_delta_rule_decode_pretranspose", "gated_delta_rule_decode",
                         "gated_delta_rule_mtp", "chunk_gated_delta_rule"}) {
    api::register_backends(op, kGdnKernels);
  }
  register_bench_hook("gated_delta_rule_decode_pretranspose", [](const BenchShape& s, Device d) {
    return bench_one_step("gated_delta_rule_decode_pretranspose", false, s, d);
  });
  register_bench_hook("gated_delta_rule_decode", [](const BenchShape& s, Device d) {
    return bench_one_step("gated_delta_rule_decode", true, s, d);
  });
  register_bench_hook("gated_delta_rule_mtp", bench_mtp);
  register_bench_hook("chunk_gated_delta_rule", bench_prefill);
  register_result_comparator_with_args("chunk_gated_delta_rule", compare_chunk_gdn);
}

}  // namespace detail

}  // namespace flashinfer
