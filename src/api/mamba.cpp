// flashinfer.mamba.selective_state_update: shape normalization as upstream's wrapper does it,
// upstream's checks and messages, the slot rules of its three paths (STP, MTP, varlen), dispatch
// and a bench hook. The update itself is kernels/ssu_params.h's (docs/LINEAR_ATTENTION.md).
#include "flashinfer/ops/mamba.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/device_props.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/ssu_cpu.h"
#include "kernels/ssu_params.h"

#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/ssu_cuda.h"
#endif

namespace flashinfer {
namespace {

using kernels::SsuIoRef;
using kernels::SsuParams;

constexpr const char* kSsuOp = "selective_state_update";

#if FLASHINFER_WITH_CUDA
// The CUDA kernel keeps a warp's share of a state row in registers: up to 8 values a lane.
api::Refusal ssu_cuda_supports(const SsuParams& p) {
  if (p.dstate > kernels::cuda::kSsuMaxDstate) {
    return {"state", "dstate above 256 (the CUDA kernel keeps a state row in registers)"};
  }
  return {};
}
#endif

constexpr api::KernelEntry<SsuParams> kSsuKernels[] = {
    {DeviceType::kCPU, "CPU reference: the update in fp32, heads in parallel, sequences in order",
     nullptr,
     [](const SsuParams& p, const api::LaunchContext&) {
       kernels::cpu::selective_state_update(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernel: a warp per state row, the row in registers across the tokens, B and C rows in "
     "shared memory",
     ssu_cuda_supports,
     [](const SsuParams& p, const api::LaunchContext& c) {
       kernels::cuda::selective_state_update(p, c.stream, c.enable_pdl);
     }},
#endif
};

#if FLASHINFER_WITH_CUDA
api::Refusal ckpt_cuda_supports(const kernels::CkptSsuParams& p) {
  return ssu_cuda_supports(p.ssu);
}
#endif

constexpr api::KernelEntry<kernels::CkptSsuParams> kCkptKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: the ring history replayed, then the new tokens, in fp32, heads in parallel",
     nullptr,
     [](const kernels::CkptSsuParams& p, const api::LaunchContext&) {
       kernels::cpu::checkpointing_ssu(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernel: a warp per state row, the history and the new tokens through it in registers",
     ckpt_cuda_supports,
     [](const kernels::CkptSsuParams& p, const api::LaunchContext& c) {
       kernels::cuda::checkpointing_ssu(p, c.stream, c.enable_pdl);
     }},
#endif
};

std::string_view ssu_tname(const Tensor& t) { return dtype_torch_name(t.dtype()); }

bool given(const std::optional<Tensor>& t) { return t && t->defined(); }

// Upstream passes dt, A, D and dt_bias broadcast (stride 0) along their trailing axes: one value
// per head. Its own dumps hold them materialized, so any strides are taken and the value at index
// 0 of those axes is read; on the CPU a tensor whose values differ along them is refused.
void check_per_head(const Tensor& t, int trailing, const char* arg, const char* op = kSsuOp) {
  if (!t.device().is_cpu() || t.numel() == 0) return;
  bool broadcast = true;
  for (int i = t.dim() - trailing; i < t.dim(); ++i)
    broadcast &= t.stride(i) == 0 || t.size(i) == 1;
  if (broadcast) return;
  int64_t block = 1;
  for (int i = t.dim() - trailing; i < t.dim(); ++i) block *= t.size(i);
  const std::vector<double> v = t.contiguous().to_double_vector();
  for (size_t i = 0; i < v.size(); ++i) {
    const double ref = v[(i / block) * block];
    FLASHINFER_CHECK(v[i] == ref || (std::isnan(v[i]) && std::isnan(ref)), op, arg, arg,
                     " must hold one value per head (upstream broadcasts it with stride 0 along "
                     "its last ",
                     trailing, " dimension(s)); element ", i, " differs");
  }
}

void check_io_like(const Tensor& t, const Tensor& x, const char* arg, const char* op = kSsuOp) {
  api::check_defined(t, op, arg);
  FLASHINFER_CHECK(t.dtype() == x.dtype(), op, arg, arg, " must have the same dtype as x");
  api::check_same_device(t, x, op, arg, "x");
  FLASHINFER_CHECK(t.numel() == 0 || t.stride(-1) == 1, op, arg, arg,
                   " must be contiguous in its last dimension, got stride ", t.stride(-1));
}

// (seq, tok, head) strides of an io tensor in the mode's layout.
SsuIoRef io_ref(const Tensor& t, int mode) {
  SsuIoRef r;
  r.data = t.data_ptr();
  if (mode == 0) {  // STP [batch, heads, n]
    r.seq = t.stride(0), r.head = t.stride(1);
  } else if (mode == 1) {  // MTP [batch, T, heads, n]
    r.seq = t.stride(0), r.tok = t.stride(1), r.head = t.stride(2);
  } else {  // varlen [tokens, heads, n]
    r.tok = t.stride(0), r.head = t.stride(1);
  }
  return r;
}

void check_index_tensor(const Tensor& t, const Tensor& x, int64_t batch, int64_t max_seqlen,
                        const char* arg) {
  FLASHINFER_CHECK(t.dim() == 1 || t.dim() == 2, kSsuOp, arg, arg, " must be 1D or 2D, got ",
                   t.dim(), "D");
  api::check_dtype_in(t, {DType::kInt32, DType::kInt64}, kSsuOp, arg);
  api::check_same_device(t, x, kSsuOp, arg, "x");
  FLASHINFER_CHECK(t.size(0) >= batch, kSsuOp, arg, arg, ".size(0) must be >= batch (", batch,
                   "), got ", t.size(0));
  FLASHINFER_CHECK(t.dim() == 1 || t.size(1) >= max_seqlen, kSsuOp, arg, arg,
                   ".size(1) must be >= max_seqlen (", max_seqlen, "), got ", t.size(1));
}

Tensor ssu_impl(const Tensor& state_in, const Tensor& x_in, const Tensor& dt_in, const Tensor& A_in,
                const Tensor& B_in, const Tensor& C_in, const Tensor& D_in,
                const std::optional<Tensor>& z_in, const std::optional<Tensor>& bias_in,
                bool dt_softplus, const std::optional<Tensor>& src_idx, int64_t pad_slot_id,
                const std::optional<Tensor>& scale_in, std::optional<Tensor> out,
                bool disable_state_update, const std::optional<Tensor>& inter,
                const std::optional<Tensor>& inter_idx, const std::optional<Tensor>& inter_scales,
                const std::optional<Tensor>& rand_seed, int64_t philox_rounds, int64_t cache_steps,
                const std::string& algorithm, const std::optional<Tensor>& dst_idx,
                const std::optional<Tensor>& cu_seqlens, const std::optional<Tensor>& num_accepted,
                const std::string& backend) {
  const char* op = kSsuOp;
  // Upstream keeps pad_slot_id in an int32 kernel parameter: the slots are compared with that.
  pad_slot_id = static_cast<int32_t>(pad_slot_id);
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{state_in, "state"},
                                {x_in, "x"},
                                {dt_in, "dt"},
                                {A_in, "A"},
                                {B_in, "B"},
                                {C_in, "C"},
                                {D_in, "D"}}) {
    api::check_defined(t, op, name);
  }
  FLASHINFER_CHECK(backend == "auto" || backend == "flashinfer" || backend == "cake", op, "backend",
                   "Unknown backend: ", backend);
  FLASHINFER_CHECK(algorithm == "auto" || algorithm == "simple" || algorithm == "vertical" ||
                       algorithm == "horizontal" || algorithm == "async_horizontal",
                   op, "algorithm", "Unknown algorithm: ", algorithm);
  FLASHINFER_CHECK(cache_steps >= 0, op, "cache_steps", "cache_steps must be non-negative, got ",
                   cache_steps);

  // Upstream's wrapper: 3-D state is one head; A, D, dt_bias gain a head axis; in STP / MTP the
  // 2-D io tensors gain a head axis, and with cache_steps >= 1 the 3-D ones a token axis.
  const bool varlen = given(cu_seqlens) && x_in.dim() == 3;
  const bool mtp_norm = cache_steps >= 1 && !varlen;
  auto io_norm = [&](const Tensor& t) {
    Tensor r = t;
    if (varlen) return r;
    if (r.dim() == 2) r = r.unsqueeze(1);
    if (mtp_norm && r.dim() == 3) r = r.unsqueeze(1);
    return r;
  };
  const Tensor state = state_in.dim() == 3 ? state_in.unsqueeze(1) : state_in;
  const Tensor A = A_in.dim() == 2 ? A_in.unsqueeze(0) : A_in;
  const Tensor D = D_in.dim() == 1 ? D_in.unsqueeze(0) : D_in;
  const Tensor x = io_norm(x_in), dt = io_norm(dt_in), B = io_norm(B_in), C = io_norm(C_in);
  std::optional<Tensor> z, dt_bias, state_scale;
  if (given(z_in)) z = io_norm(*z_in);
  if (given(bias_in)) dt_bias = bias_in->dim() == 1 ? bias_in->unsqueeze(0) : *bias_in;
  if (given(scale_in)) {
    state_scale =
        scale_in->dim() == 4 && scale_in->size(3) == 1 ? scale_in->squeeze(-1) : *scale_in;
  }

  // Mode: STP (3-D x), MTP (4-D x), varlen (3-D x with cu_seqlens).
  FLASHINFER_CHECK(x.dim() == 3 || x.dim() == 4, op, "x",
                   "x must have 3 dimensions (single-token) or 4 dimensions (multi-token), got ",
                   x.dim());
  // Upstream's C++ dispatch: a 3-D x with cu_seqlens is varlen (a 2-D x too, once normalized).
  FLASHINFER_CHECK(!given(cu_seqlens) || x.dim() == 3, op, "cu_seqlens",
                   "cu_seqlens needs x as [total_tokens, nheads, dim], got a ", x.dim(), "-D x");
  const int mode = given(cu_seqlens) ? 2 : x.dim() == 4 ? 1 : 0;
  if (mode == 2) {
    api::check_dim(*cu_seqlens, {1}, op, "cu_seqlens");
    FLASHINFER_CHECK(cu_seqlens->size(0) >= 1, op, "cu_seqlens",
                     "needs n_sequences + 1 entries, got 0");
  }
  api::check_dtype_in(x, {DType::kBFloat16, DType::kFloat16, DType::kFloat32}, op, "x");
  FLASHINFER_CHECK(x.stride(-1) == 1 || x.numel() == 0, op, "x",
                   "x must be contiguous in its last dimension");

  // The state: [cache, nheads, dim, dstate], rows contiguous, the slot stride free.
  FLASHINFER_CHECK(state.dim() == 4, op, "state", "state must be 3-D or 4-D, got ", state_in.dim(),
                   "-D");
  api::check_dtype_in(state, {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt16},
                      op, "state");
  api::check_same_device(state, x, op, "state", "x");
  const int64_t slots = state.size(0), nheads = state.size(1), dim = state.size(2),
                dstate = state.size(3);
  FLASHINFER_CHECK(state.stride(3) == 1 || dstate <= 1, op, "state",
                   "state dimension 3 (dstate) must have stride 1");
  FLASHINFER_CHECK(state.stride(2) == dstate || dim <= 1, op, "state",
                   "state dimension 2 (dim) must be contiguous with dimension 3");
  FLASHINFER_CHECK(state.stride(1) == dim * dstate || nheads <= 1, op, "state",
                   "state dimension 1 (nheads) must be contiguous with dimension 2");
  FLASHINFER_CHECK(nheads >= 1 && dim >= 1 && dstate >= 1, op, "state",
                   "nheads, dim and dstate must be positive, got ", shape_to_string(state.shape()));

  // Batch, tokens, and the io shapes.
  const int64_t batch = mode == 2 ? cu_seqlens->size(0) - 1 : x.size(0);
  const int64_t T = mode == 1 ? x.size(1) : 1;
  const int64_t max_seqlen = mode == 2 ? cache_steps : T;
  FLASHINFER_CHECK(mode != 2 || cache_steps >= 1, op, "cache_steps",
                   "cache_steps must be >= 1 in varlen mode (specifies max_seqlen)");
  const int64_t hd = mode == 1 ? 2 : 1;  // x's head axis
  FLASHINFER_CHECK(x.size(hd) == nheads, op, "x", "x.size(", hd, ") must equal nheads (", nheads,
                   "), got ", x.size(hd));
  FLASHINFER_CHECK(x.size(hd + 1) == dim, op, "x", "x.size(", hd + 1, ") must equal dim (", dim,
                   "), got ", x.size(hd + 1));
  FLASHINFER_CHECK(slots >= batch, op, "state", "state.size(0) must be >= batch (", batch,
                   "), got ", slots);
  const Shape x_shape = x.shape();
  api::check_dtype_in(dt, {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, op, "dt");
  api::check_shape_eq(dt, x_shape, op, "dt");
  api::check_same_device(dt, x, op, "dt", "x");
  check_per_head(dt, 1, "dt");
  check_io_like(B, x, "B");
  check_io_like(C, x, "C");
  FLASHINFER_CHECK(B.dim() == x.dim(), op, "B", "B must have ", x.dim(), " dimensions, got ",
                   B.dim());
  const int64_t ngroups = B.size(hd);
  FLASHINFER_CHECK(ngroups >= 1 && nheads % ngroups == 0, op, "B",
                   "nheads must be divisible by ngroups (nheads ", nheads, ", ngroups ", ngroups,
                   ")");
  Shape bc_shape = x_shape;
  bc_shape[hd] = ngroups;
  bc_shape[hd + 1] = dstate;
  api::check_shape_eq(B, bc_shape, op, "B");
  api::check_shape_eq(C, bc_shape, op, "C");
  api::check_dtype_in(A, {DType::kFloat32}, op, "A");
  api::check_shape_eq(A, {nheads, dim, dstate}, op, "A");
  api::check_same_device(A, x, op, "A", "x");
  check_per_head(A, 2, "A");
  FLASHINFER_CHECK(D.dtype() == dt.dtype(), op, "D", "D must have the same dtype as dt");
  api::check_shape_eq(D, {nheads, dim}, op, "D");
  api::check_same_device(D, x, op, "D", "x");
  check_per_head(D, 1, "D");
  if (z) {
    check_io_like(*z, x, "z");
    api::check_shape_eq(*z, x_shape, op, "z");
  }
  if (dt_bias) {
    FLASHINFER_CHECK(dt_bias->dtype() == dt.dtype(), op, "dt_bias",
                     "dt_bias must have the same dtype as dt");
    api::check_shape_eq(*dt_bias, {nheads, dim}, op, "dt_bias");
    api::check_same_device(*dt_bias, x, op, "dt_bias", "x");
    check_per_head(*dt_bias, 1, "dt_bias");
  }
  if (given(out)) {
    FLASHINFER_CHECK(out->dtype() == x.dtype(), op, "out", "out must have the same dtype as x");
    api::check_shape_eq(*out, x_shape, op, "out");
    api::check_same_device(*out, x, op, "out", "x");
    FLASHINFER_CHECK(out->stride(-1) == 1 || out->numel() == 0, op, "out",
                     "out must be contiguous in its last dimension");
    api::check_writable(*out, op, "out");
  } else {
    out = Tensor::zeros(x_shape, x.dtype(), x.device());
  }

  // The quantized (int16) state and stochastic rounding.
  const bool scaled = state.dtype() == DType::kInt16;
  FLASHINFER_CHECK(!(given(rand_seed) && state_scale), op, "rand_seed",
                   "rand_seed and state_scale cannot both be provided");
  FLASHINFER_CHECK(scaled == state_scale.has_value(), op, "state_scale",
                   scaled ? "an int16 state needs state_scale (its decode scales)"
                          : "state_scale is only used with an int16 state, got state of dtype ",
                   scaled ? "" : ssu_tname(state));
  if (state_scale) {
    api::check_dtype_in(*state_scale, {DType::kFloat32}, op, "state_scale");
    api::check_same_device(*state_scale, x, op, "state_scale", "x");
    api::check_dim(*state_scale, {3}, op, "state_scale");
    FLASHINFER_CHECK(state_scale->size(0) == slots, op, "state_scale",
                     "state_scale.size(0) must equal state_cache_size (", slots, ")");
    FLASHINFER_CHECK(state_scale->size(1) == nheads, op, "state_scale",
                     "state_scale.size(1) must equal nheads (", nheads, ")");
    FLASHINFER_CHECK(state_scale->size(2) == dim, op, "state_scale",
                     "state_scale.size(2) must equal dim (", dim, ")");
    FLASHINFER_CHECK(state_scale->stride(2) == 1 || dim <= 1, op, "state_scale",
                     "state_scale.stride(2) must be 1, got ", state_scale->stride(2));
    FLASHINFER_CHECK(state_scale->stride(1) == dim || nheads <= 1, op, "state_scale",
                     "state_scale.stride(1) must equal dim, got ", state_scale->stride(1));
  }
  int64_t seed_value = 0;
  if (given(rand_seed)) {
    FLASHINFER_CHECK(rand_seed->numel() == 1, op, "rand_seed",
                     "rand_seed must be a single-element tensor, got numel=", rand_seed->numel());
    FLASHINFER_CHECK(rand_seed->dtype() == DType::kInt64, op, "rand_seed",
                     "rand_seed must have dtype int64, got ", ssu_tname(*rand_seed));
    api::check_same_device(*rand_seed, x, op, "rand_seed", "x");
    FLASHINFER_CHECK(philox_rounds > 0, op, "philox_rounds",
                     "philox_rounds must be > 0 when rand_seed is provided, got ", philox_rounds);
    FLASHINFER_CHECK(state.dtype() == DType::kFloat16, op, "rand_seed",
                     "Stochastic rounding (PHILOX_ROUNDS > 0) only supports fp16 state, got ",
                     ssu_tname(state));
    FLASHINFER_CHECK(philox_rounds <= 64, op, "philox_rounds",
                     "philox_rounds above 64 is not supported, got ", philox_rounds);
    if (rand_seed->device().is_cpu()) seed_value = api::host_ints(*rand_seed)[0];
  }

  // Algorithms: one kernel here; upstream's refusals that hold on any device are kept.
  const bool vertical = algorithm == "vertical";
  const bool horizontal = algorithm == "horizontal";
  if (mode == 0) {
    FLASHINFER_CHECK(!(horizontal && scaled), op, "algorithm",
                     "Horizontal kernel does not support scaled state (int16). Use "
                     "algorithm='auto', 'simple' or 'vertical'.");
    FLASHINFER_CHECK(!vertical || dim % 16 == 0, op, "algorithm",
                     "dim must be divisible by 16 for vertical kernel");
  } else {
    FLASHINFER_CHECK(!(vertical && scaled), op, "algorithm",
                     "vertical algorithm does not support scaled (quantized) state");
    FLASHINFER_CHECK(!(horizontal && scaled), op, "algorithm",
                     "horizontal algorithm does not support scaled (quantized) state");
  }
  if (x.device().is_cuda() && (vertical || horizontal)) {
    const int cc = api::compute_capability(x.device());
    FLASHINFER_CHECK(mode != 0 || cc >= 90, op, "algorithm",
                     "Unsupported SSU algorithm: ", algorithm,
                     ". Vertical/horizontal require FLASHINFER_MAMBA_ENABLE_SM90.");
    FLASHINFER_CHECK(mode == 0 || cc >= 100, op, "algorithm",
                     "vertical/horizontal MTP algorithm requires SM100+ (Blackwell); recompile "
                     "with FLASHINFER_MAMBA_ENABLE_SM100");
  }

  // Indices.
  const bool has_src = given(src_idx), has_dst = given(dst_idx), has_inter = given(inter);
  if (has_src) check_index_tensor(*src_idx, x, batch, max_seqlen, "state_batch_indices");
  if (has_dst) {
    check_index_tensor(*dst_idx, x, batch, max_seqlen, "dst_state_batch_indices");
    FLASHINFER_CHECK(!has_src || src_idx->dtype() == dst_idx->dtype(), op,
                     "dst_state_batch_indices",
                     "state_batch_indices and dst_state_batch_indices must have the same dtype");
    FLASHINFER_CHECK(!has_inter, op, "dst_state_batch_indices",
                     "intermediate_states_buffer and dst_state_batch_indices are mutually "
                     "exclusive");
  }
  const DType idx_dtype = has_src            ? src_idx->dtype()
                          : has_dst          ? dst_idx->dtype()
                          : given(inter_idx) ? inter_idx->dtype()
                                             : DType::kInt32;
  std::vector<int64_t> cu_host, na_host;
  if (mode == 2) {
    const Tensor& cu = *cu_seqlens;
    api::check_dtype_in(cu, {DType::kInt32, DType::kInt64}, op, "cu_seqlens");
    api::check_same_device(cu, x, op, "cu_seqlens", "x");
    FLASHINFER_CHECK(cu.is_contiguous(), op, "cu_seqlens", "cu_seqlens must be contiguous");
    if (cu.device().is_cpu()) {
      cu_host = api::host_ints(cu);
      if (cu_host.size() == 2 && x.size(0) == 1) {
        FLASHINFER_CHECK(cu_host[0] == 0 && cu_host[1] == 1, op, "cu_seqlens",
                         "single-token cu_seqlens must be the canonical [0, 1] pair; got [",
                         cu_host[0], ", ", cu_host[1], "]");
      }
      for (int64_t s = 0; s < batch; ++s) {
        FLASHINFER_CHECK(
            cu_host[s] >= 0 && cu_host[s] <= cu_host[s + 1] && cu_host[s + 1] <= x.size(0), op,
            "cu_seqlens", "must be non-decreasing within [0, ", x.size(0), "], got entries ", s,
            ", ", s + 1, " = ", cu_host[s], ", ", cu_host[s + 1]);
        FLASHINFER_CHECK(cu_host[s + 1] - cu_host[s] <= cache_steps, op, "cu_seqlens", "sequence ",
                         s, " has ", cu_host[s + 1] - cu_host[s],
                         " tokens, more than cache_steps (max_seqlen) ", cache_steps);
      }
    }
  }
  if (given(num_accepted)) {
    const Tensor& na = *num_accepted;
    api::check_dim(na, {1}, op, "num_accepted_tokens");
    api::check_dtype_in(na, {DType::kInt32, DType::kInt64}, op, "num_accepted_tokens");
    api::check_same_device(na, x, op, "num_accepted_tokens", "x");
    FLASHINFER_CHECK(na.is_contiguous(), op, "num_accepted_tokens", "must be contiguous");
    FLASHINFER_CHECK(na.size(0) >= batch, op, "num_accepted_tokens",
                     "num_accepted_tokens.size(0) must be >= n_sequences (", batch, "), got ",
                     na.size(0));
    FLASHINFER_CHECK(has_src, op, "num_accepted_tokens",
                     "state_batch_indices is required when num_accepted_tokens is provided");
    FLASHINFER_CHECK(mode != 0, op, "num_accepted_tokens",
                     "num_accepted_tokens needs the multi-token path (cache_steps >= 1, a 4-D x "
                     "or cu_seqlens)");
    if (na.device().is_cpu()) na_host = api::host_ints(na);
  }

  // Intermediate states (multi-token only).
  int64_t inter_entries = 0, inter_steps = 0;
  if (has_inter) {
    const Tensor& ib = *inter;
    FLASHINFER_CHECK(mode != 0, op, "intermediate_states_buffer",
                     "intermediate_states_buffer needs the multi-token path (cache_steps >= 1, a "
                     "4-D x or cu_seqlens)");
    api::check_dim(ib, {5}, op, "intermediate_states_buffer");
    FLASHINFER_CHECK(ib.dtype() == state.dtype(), op, "intermediate_states_buffer",
                     "intermediate_states_buffer must have the same dtype as state");
    api::check_same_device(ib, x, op, "intermediate_states_buffer", "x");
    FLASHINFER_CHECK(ib.is_contiguous(), op, "intermediate_states_buffer",
                     "intermediate_states_buffer must be contiguous");
    FLASHINFER_CHECK(ib.size(2) == nheads && ib.size(3) == dim && ib.size(4) == dstate, op,
                     "intermediate_states_buffer", "expected [entries, steps, ", nheads, ", ", dim,
                     ", ", dstate, "], got ", shape_to_string(ib.shape()));
    FLASHINFER_CHECK(ib.size(1) >= max_seqlen, op, "intermediate_states_buffer",
                     "intermediate_states_buffer.size(1) (", ib.size(1),
                     " steps) must be >= the tokens a sequence runs (", max_seqlen, ")");
    inter_entries = ib.size(0), inter_steps = ib.size(1);
    if (given(inter_idx)) {
      const Tensor& ii = *inter_idx;
      FLASHINFER_CHECK(ii.dim() == 1 && ii.size(0) == batch, op, "intermediate_state_indices",
                       "intermediate_state_indices.shape must be (batch), batch=", batch, ", got ",
                       shape_to_string(ii.shape()));
      FLASHINFER_CHECK(ii.dtype() == idx_dtype, op, "intermediate_state_indices",
                       "state_batch_indices and intermediate_state_indices must have the same "
                       "dtype");
      api::check_dtype_in(ii, {DType::kInt32, DType::kInt64}, op, "intermediate_state_indices");
      api::check_same_device(ii, x, op, "intermediate_state_indices", "x");
      FLASHINFER_CHECK(ii.is_contiguous(), op, "intermediate_state_indices",
                       "intermediate_state_indices must be contiguous");
    }
    FLASHINFER_CHECK(scaled == given(inter_scales), op, "intermediate_state_scales",
                     scaled ? "an int16 state needs intermediate_state_scales with "
                              "intermediate_states_buffer"
                            : "intermediate_state_scales is only used with an int16 state");
    if (given(inter_scales)) {
      const Tensor& is = *inter_scales;
      FLASHINFER_CHECK(is.dtype() == DType::kFloat32, op, "intermediate_state_scales",
                       "intermediate_state_scales must have dtype float32");
      api::check_shape_eq(is, {inter_entries, inter_steps, nheads, dim}, op,
                          "intermediate_state_scales");
      api::check_same_device(is, x, op, "intermediate_state_scales", "x");
      FLASHINFER_CHECK(is.is_contiguous(), op, "intermediate_state_scales",
                       "intermediate_state_scales must be contiguous");
    }
  } else {
    FLASHINFER_CHECK(!given(inter_scales), op, "intermediate_state_scales",
                     "intermediate_states_buffer is required when intermediate_state_scales is "
                     "provided");
    FLASHINFER_CHECK(!given(inter_idx), op, "intermediate_state_indices",
                     "intermediate_state_indices needs intermediate_states_buffer");
  }

  // Host-side slot checks (CPU tensors): every slot the update reads or writes is padding or
  // inside the cache; the CUDA kernel guards the same on the device.
  if (x.device().is_cpu()) {
    const std::vector<int64_t> src_v = has_src ? api::host_ints(*src_idx) : std::vector<int64_t>{};
    const std::vector<int64_t> dst_v = has_dst ? api::host_ints(*dst_idx) : std::vector<int64_t>{};
    const std::vector<int64_t> ii_v =
        given(inter_idx) ? api::host_ints(*inter_idx) : std::vector<int64_t>{};
    const int64_t src_cols = has_src && src_idx->dim() == 2 ? src_idx->size(1) : 1;
    const int64_t dst_cols = has_dst && dst_idx->dim() == 2 ? dst_idx->size(1) : 1;
    auto slot_ok = [&](int64_t v) { return v == pad_slot_id || (v >= 0 && v < slots); };
    for (int64_t s = 0; s < batch; ++s) {
      const int64_t len = mode == 2 ? cu_host[s + 1] - cu_host[s] : T;
      if (len <= 0) continue;
      int64_t init = na_host.empty() ? 0 : std::max<int64_t>(na_host[s] - 1, 0);
      if (has_src && src_idx->dim() == 2) {
        FLASHINFER_CHECK(init < src_cols, op, "num_accepted_tokens", "entry ", s, " (",
                         na_host.empty() ? 0 : na_host[s], ") points past state_batch_indices' ",
                         src_cols, " columns");
      } else {
        init = 0;
      }
      const int64_t src = has_src ? src_v[s * src_cols + init] : s;
      FLASHINFER_CHECK(slot_ok(src), op, "state_batch_indices", "sequence ", s, "'s slot ", src,
                       " is outside the state cache [0, ", slots, ") and not pad_slot_id (",
                       pad_slot_id, ")");
      if (src == pad_slot_id) continue;
      if (has_dst) {
        const int64_t steps = mode == 0 ? 1 : std::min(len, dst_cols);
        for (int64_t t = 0; t < (dst_idx->dim() == 2 ? steps : 1); ++t) {
          const int64_t d = dst_v[s * dst_cols + t];
          FLASHINFER_CHECK(slot_ok(d), op, "dst_state_batch_indices", "sequence ", s, "'s slot ", d,
                           " (step ", t, ") is outside the state cache [0, ", slots,
                           ") and not pad_slot_id (", pad_slot_id, ")");
        }
      }
      if (has_inter) {
        const int64_t e = ii_v.empty() ? src : ii_v[s];
        FLASHINFER_CHECK(e >= 0 && e < inter_entries, op,
                         ii_v.empty() ? "state_batch_indices" : "intermediate_state_indices",
                         "sequence ", s, "'s intermediate entry ", e,
                         " is outside intermediate_states_buffer's ", inter_entries, " entries");
      }
    }
  }

  SsuParams p;
  p.num_seqs = batch;
  p.T = mode == 2 ? cache_steps : T;
  p.multi_token = mode != 0;
  p.nheads = nheads, p.dim = dim, p.dstate = dstate, p.ngroups = ngroups;
  p.io_dtype = x.dtype();
  p.dt_dtype = p.w_dtype = dt.dtype();
  p.x = io_ref(x, mode);
  p.B = io_ref(B, mode);
  p.C = io_ref(C, mode);
  p.dt = io_ref(dt, mode);
  if (z) p.z = io_ref(*z, mode);
  const SsuIoRef o = io_ref(*out, mode);
  p.out = out->data_ptr();
  p.out_seq = o.seq, p.out_tok = o.tok, p.out_head = o.head;
  p.A = A.data<float>();
  p.A_stride = A.stride(0);
  p.D = D.data_ptr();
  p.D_stride = D.stride(0);
  if (dt_bias) {
    p.dt_bias = dt_bias->data_ptr();
    p.dt_bias_stride = dt_bias->stride(0);
  }
  p.dt_softplus = dt_softplus;
  p.state = state.data_ptr();
  p.state_dtype = state.dtype();
  p.slots = slots;
  p.state_stride_slot = state.stride(0);
  if (state_scale) {
    p.state_scale = static_cast<float*>(state_scale->data_ptr());
    p.scale_stride_slot = state_scale->stride(0);
  }
  p.idx_i64 = idx_dtype == DType::kInt64;
  if (has_src) {
    p.src_idx = src_idx->data_ptr();
    p.src_stride0 = src_idx->stride(0);
    p.src_stride1 = src_idx->dim() == 2 ? src_idx->stride(1) : 0;
    p.src_cols = src_idx->dim() == 2 ? src_idx->size(1) : 1;
  }
  if (has_dst) {
    p.dst_idx = dst_idx->data_ptr();
    p.dst_stride0 = dst_idx->stride(0);
    p.dst_stride1 = dst_idx->dim() == 2 ? dst_idx->stride(1) : 0;
  }
  p.pad_slot_id = pad_slot_id;
  if (given(num_accepted)) {
    p.num_accepted = num_accepted->data_ptr();
    p.num_accepted_i64 = num_accepted->dtype() == DType::kInt64;
  }
  if (mode == 2) {
    p.cu_seqlens = cu_seqlens->data_ptr();
    p.cu_seqlens_i64 = cu_seqlens->dtype() == DType::kInt64;
    p.total_tokens = x.size(0);
  }
  p.update_state = !disable_state_update;
  if (has_inter) {
    p.inter = inter->data_ptr();
    p.inter_entries = inter_entries;
    p.inter_steps = inter_steps;
    if (given(inter_scales)) p.inter_scales = static_cast<float*>(inter_scales->data_ptr());
    if (given(inter_idx)) p.inter_idx = inter_idx->data_ptr();
  }
  if (given(rand_seed)) {
    // The CPU path reads the seed here; the CUDA kernel on the device (capture-safe).
    p.rand_seed = rand_seed->device().is_cpu() ? &seed_value : rand_seed->data<int64_t>();
    p.philox_rounds = static_cast<int>(philox_rounds);
  }
  api::check_writable(state, op, "state");
  api::launch(kSsuKernels, p, x.device(), op, "x");
  return *out;
}

// ---- checkpointing_ssu
// ---------------------------------------------------------------------------

constexpr const char* kCkptOp = "checkpointing_ssu";

Tensor ckpt_impl(const Tensor& state, const Tensor& x_cache, const Tensor& B_cache,
                 const Tensor& dt_cache, const Tensor& ring_start, const Tensor& pnat,
                 const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B,
                 const Tensor& C, const Tensor& out, const std::optional<Tensor>& D,
                 const std::optional<Tensor>& z, const std::optional<Tensor>& dt_bias,
                 bool dt_softplus, const std::optional<Tensor>& sbi, int64_t pad_slot_id,
                 const std::optional<Tensor>& state_scale, const std::optional<Tensor>& rand_seed,
                 int64_t philox_rounds, std::optional<int64_t> d_split,
                 const std::optional<Tensor>& cu_seqlens, std::optional<int64_t> max_seqlen,
                 const std::optional<Tensor>& cb_scaled, const std::optional<Tensor>& cumAdt_vec,
                 const std::optional<Tensor>& cb_old, int64_t heads_per_cta,
                 const std::string& algorithm, bool enable_pdl) {
  const char* op = kCkptOp;
  pad_slot_id = static_cast<int32_t>(pad_slot_id);
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{state, "state"},
                                {x_cache, "x_cache"},
                                {B_cache, "B_cache"},
                                {dt_cache, "dt_cache"},
                                {ring_start, "ring_start"},
                                {pnat, "prev_num_accepted_tokens"},
                                {x, "x"},
                                {dt, "dt"},
                                {A, "A"},
                                {B, "B"},
                                {C, "C"},
                                {out, "out"}}) {
    api::check_defined(t, op, name);
    api::check_same_device(t, x, op, name, "x");
  }
  // The state: f16 / bf16 / f32, or int8 / float8_e4m3fn with decode scales.
  api::check_dim(state, {4}, op, "state");
  api::check_dtype_in(
      state,
      {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kInt8, DType::kFloat8E4M3FN}, op,
      "state");
  const int64_t slots = state.size(0), nheads = state.size(1), dim = state.size(2),
                dstate = state.size(3);
  FLASHINFER_CHECK(nheads >= 1 && dim >= 1 && dstate >= 1, op, "state",
                   "nheads, dim and dstate must be positive, got ", shape_to_string(state.shape()));
  FLASHINFER_CHECK(state.stride(3) == 1 || dstate <= 1, op, "state",
                   "state dim 3 (dstate) must have stride 1, got ", state.stride(3));
  FLASHINFER_CHECK(state.stride(2) == dstate || dim <= 1, op, "state",
                   "state dim 2 (dim) must be contiguous with dim 3, got stride ", state.stride(2),
                   " expected ", dstate);
  FLASHINFER_CHECK(state.stride(1) == dim * dstate || nheads <= 1, op, "state",
                   "state dim 1 (nheads) must be contiguous with dim 2, got stride ",
                   state.stride(1), " expected ", dim * dstate);
  api::check_writable(state, op, "state");
  const bool quantized = state.dtype() == DType::kInt8 || state.dtype() == DType::kFloat8E4M3FN;
  FLASHINFER_CHECK(quantized == (state_scale && state_scale->defined()), op, "state_scale",
                   quantized ? "Quantized state.dtype (int8/fp8_e4m3fn) requires a state_scale "
                               "tensor of shape (state_cache_size, nheads, dim) and dtype float32"
                             : "state_scale must be None for non-quantized state.dtype (allowed "
                               "quantized dtypes: {int8, fp8_e4m3fn})");
  if (quantized) {
    const Tensor& sc = *state_scale;
    FLASHINFER_CHECK(sc.dtype() == DType::kFloat32, op, "state_scale",
                     "state_scale must be float32 (got ", ssu_tname(sc), ")");
    FLASHINFER_CHECK(sc.shape() == Shape({slots, nheads, dim}), op, "state_scale",
                     "state_scale shape mismatch: expected ", shape_to_string({slots, nheads, dim}),
                     ", got ", shape_to_string(sc.shape()));
    FLASHINFER_CHECK((sc.stride(2) == 1 || dim <= 1) && (sc.stride(1) == dim || nheads <= 1), op,
                     "state_scale", "state_scale must have rows of dim contiguous values");
    api::check_same_device(sc, x, op, "state_scale", "x");
  }
  // x, dt, B, C, z, out: [batch, T, heads, n], or [1, total_tokens, heads, n] with cu_seqlens.
  api::check_dim(x, {4}, op, "x");
  api::check_dtype_in(x, {DType::kBFloat16, DType::kFloat16, DType::kFloat32}, op, "x");
  FLASHINFER_CHECK(x.stride(3) == 1 || dim <= 1, op, "x",
                   "x must be contiguous in its last dimension");
  const bool varlen = cu_seqlens && cu_seqlens->defined();
  FLASHINFER_CHECK(varlen || !max_seqlen, op, "max_seqlen",
                   "max_seqlen is only valid with cu_seqlens (varlen mode); for non-varlen the "
                   "JIT key is taken from x.size(1)");
  int64_t batch = x.size(0), T = x.size(1);
  std::vector<int64_t> cu_host;
  if (varlen) {
    const Tensor& cu = *cu_seqlens;
    FLASHINFER_CHECK(cu.dim() == 1 && cu.dtype() == DType::kInt32, op, "cu_seqlens",
                     "cu_seqlens must be a 1D int32 tensor, got shape ",
                     shape_to_string(cu.shape()), " dtype ", ssu_tname(cu));
    api::check_same_device(cu, x, op, "cu_seqlens", "x");
    FLASHINFER_CHECK(
        cu.size(0) >= 2 && cu.is_contiguous(), op, "cu_seqlens",
        "cu_seqlens must have shape (batch+1,) with batch >= 1, got size(0)=", cu.size(0));
    FLASHINFER_CHECK(max_seqlen.has_value(), op, "max_seqlen",
                     "varlen mode requires max_seqlen under the ring contract (RING_BUFFER_LEN = "
                     "max_window + max_seqlen is otherwise ambiguous)");
    FLASHINFER_CHECK(x.size(0) == 1, op, "x",
                     "varlen mode: x must be (1, total_tokens, nheads, dim), got shape ",
                     shape_to_string(x.shape()));
    batch = cu.size(0) - 1;
    T = *max_seqlen;
    FLASHINFER_CHECK(T >= 1, op, "max_seqlen", "max_seqlen must be >= 1, got ", T);
    if (cu.device().is_cpu()) {
      cu_host = api::host_ints(cu);
      for (int64_t b = 0; b < batch; ++b) {
        FLASHINFER_CHECK(cu_host[b] >= 0 && cu_host[b] <= cu_host[b + 1] &&
                             cu_host[b + 1] <= x.size(1) && cu_host[b + 1] - cu_host[b] <= T,
                         op, "cu_seqlens", "sequence ", b, " = [", cu_host[b], ", ", cu_host[b + 1],
                         ") must lie within [0, ", x.size(1), "] and hold at most max_seqlen (", T,
                         ") tokens");
      }
    }
  }
  FLASHINFER_CHECK(x.size(2) == nheads && x.size(3) == dim, op, "x",
                   "x must be (.., nheads=", nheads, ", dim=", dim, "), got ",
                   shape_to_string(x.shape()));
  api::check_shape_eq(dt, x.shape(), op, "dt");
  api::check_dtype_in(dt, {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, op, "dt");
  check_per_head(dt, 1, "dt", op);
  check_io_like(B, x, "B", op);
  check_io_like(C, x, "C", op);
  check_io_like(out, x, "out", op);
  api::check_shape_eq(out, x.shape(), op, "out");
  api::check_writable(out, op, "out");
  api::check_dim(B, {4}, op, "B");
  const int64_t ngroups = B.size(2);
  FLASHINFER_CHECK(ngroups >= 1 && nheads % ngroups == 0, op, "B", "nheads (", nheads,
                   ") must be divisible by ngroups (", ngroups, ")");
  const Shape bc_shape = {x.size(0), x.size(1), ngroups, dstate};
  api::check_shape_eq(B, bc_shape, op, "B");
  api::check_shape_eq(C, bc_shape, op, "C");
  api::check_dtype_in(A, {DType::kFloat32}, op, "A");
  api::check_shape_eq(A, {nheads, dim, dstate}, op, "A");
  check_per_head(A, 2, "A", op);
  if (z && z->defined()) {
    check_io_like(*z, x, "z", op);
    api::check_shape_eq(*z, x.shape(), op, "z");
  }
  for (const auto& [t, name] :
       {std::pair<const std::optional<Tensor>&, const char*>{D, "D"}, {dt_bias, "dt_bias"}}) {
    if (!t || !t->defined()) continue;
    api::check_dtype_in(*t, {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, op, name);
    api::check_shape_eq(*t, {nheads, dim}, op, name);
    api::check_same_device(*t, x, op, name, "x");
    check_per_head(*t, 1, name, op);
  }
  const bool has_D = D && D->defined(), has_bias = dt_bias && dt_bias->defined();
  FLASHINFER_CHECK(!(has_D && has_bias) || D->dtype() == dt_bias->dtype(), op, "dt_bias",
                   "D.dtype (", has_D ? ssu_tname(*D) : "", ") and dt_bias.dtype (",
                   has_bias ? ssu_tname(*dt_bias) : "", ") must match");
  // The ring: [cache, nheads, L, dim], [cache, ngroups, L, dstate], [cache, nheads, L] (fp32);
  // ring_start and prev_num_accepted_tokens [cache] int32.
  api::check_dim(x_cache, {4}, op, "x_cache");
  FLASHINFER_CHECK(x_cache.dtype() == x.dtype(), op, "x_cache", "x_cache.dtype must match x.dtype");
  const int64_t L = x_cache.size(2);
  FLASHINFER_CHECK(x_cache.size(0) == slots && x_cache.size(1) == nheads && x_cache.size(3) == dim,
                   op, "x_cache", "x_cache must be (state_cache_size=", slots, ", nheads=", nheads,
                   ", L, dim=", dim, "), got ", shape_to_string(x_cache.shape()));
  FLASHINFER_CHECK(x_cache.stride(3) == 1 || dim <= 1, op, "x_cache",
                   "x_cache must be contiguous in its last dimension");
  api::check_dim(B_cache, {4}, op, "B_cache");
  FLASHINFER_CHECK(B_cache.dtype() == x.dtype(), op, "B_cache", "B_cache.dtype must match x.dtype");
  FLASHINFER_CHECK(B_cache.shape() == Shape({slots, ngroups, L, dstate}), op, "B_cache",
                   "B_cache must be ", shape_to_string({slots, ngroups, L, dstate}), ", got ",
                   shape_to_string(B_cache.shape()));
  FLASHINFER_CHECK(B_cache.stride(3) == 1 || dstate <= 1, op, "B_cache",
                   "B_cache must be contiguous in its last dimension");
  FLASHINFER_CHECK(dt_cache.dtype() == DType::kFloat32, op, "dt_cache", "dt_cache must be float32");
  FLASHINFER_CHECK(dt_cache.shape() == Shape({slots, nheads, L}), op, "dt_cache",
                   "dt_cache must be ", shape_to_string({slots, nheads, L}), ", got ",
                   shape_to_string(dt_cache.shape()));
  FLASHINFER_CHECK(dt_cache.stride(2) == 1 || L <= 1, op, "dt_cache",
                   "dt_cache must be contiguous in its last dimension");
  for (const Tensor* t : {&x_cache, &B_cache, &dt_cache}) api::check_writable(*t, op, "x_cache");
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{ring_start, "ring_start"},
                                {pnat, "prev_num_accepted_tokens"}}) {
    FLASHINFER_CHECK(t.dtype() == DType::kInt32, op, name,
                     name == std::string("ring_start") ? "ring_start must be int32"
                                                       : "prev_num_accepted must be int32");
    FLASHINFER_CHECK(t.dim() == 1 && t.size(0) == slots && t.is_contiguous(), op, name, name,
                     ".size(0) must equal state_cache_size=", slots, " (contiguous), got ",
                     shape_to_string(t.shape()));
  }
  const int64_t W = L - T;
  FLASHINFER_CHECK(W <= 16, op, "x_cache",
                   "checkpointing_ssu supports at most 16 cache tokens (max_window), got ", W);
  FLASHINFER_CHECK(T <= W, op, "x", "npredicted (T) must be <= max_window (W): T=", T, ", W=", W,
                   " (ring_buffer_len=", L, ")");
  // Indices: one slot a row (1-D).
  if (sbi && sbi->defined()) {
    FLASHINFER_CHECK(sbi->dim() == 1 && sbi->size(0) == batch, op, "state_batch_indices",
                     "state_batch_indices.size(0)=", sbi->numel(), " must equal batch=", batch);
    FLASHINFER_CHECK(sbi->dtype() == DType::kInt32 || sbi->dtype() == DType::kInt64, op,
                     "state_batch_indices", "state_batch_indices must be int32 or int64");
    FLASHINFER_CHECK(sbi->is_contiguous(), op, "state_batch_indices", "must be contiguous");
    api::check_same_device(*sbi, x, op, "state_batch_indices", "x");
  }
  FLASHINFER_CHECK(slots >= 1, op, "state", "the state cache has no slots");
  // Knobs that change no result: validated as upstream does.
  FLASHINFER_CHECK(algorithm == "auto" || algorithm == "monolith" || algorithm == "two-kernel", op,
                   "algorithm", "algorithm must be one of 'auto', 'monolith', 'two-kernel'; got ",
                   algorithm);
  const int scratch = (cb_scaled && cb_scaled->defined()) + (cumAdt_vec && cumAdt_vec->defined()) +
                      (cb_old && cb_old->defined());
  FLASHINFER_CHECK(scratch == 0 || scratch == 3, op, "cb_scaled",
                   "cb_scaled, cumAdt_vec, and cb_old must be provided together (they make the "
                   "two-kernel path available)");
  FLASHINFER_CHECK(algorithm != "two-kernel" || scratch == 3, op, "algorithm",
                   "algorithm='two-kernel' requires the cb_scaled/cumAdt_vec/cb_old/scratch trio "
                   "(got none)");
  if (d_split) {
    FLASHINFER_CHECK(*d_split == 1 || *d_split == 2, op, "d_split",
                     "d_split must be in {1, 2}, got ", *d_split);
    FLASHINFER_CHECK(dim % *d_split == 0, op, "d_split", "dim=", dim,
                     " must be divisible by d_split=", *d_split);
  }
  const int64_t hpg = nheads / ngroups;
  FLASHINFER_CHECK(
      heads_per_cta == 0 || (heads_per_cta > 0 && hpg % heads_per_cta == 0), op,
      "precompute_heads_per_cta", "precompute_heads_per_cta=", heads_per_cta,
      " must be 0 (heuristic) or a positive divisor of HEADS_PER_GROUP (nheads/ngroups=", hpg, ")");
  int64_t seed_value = 0;
  if (rand_seed && rand_seed->defined()) {
    FLASHINFER_CHECK(rand_seed->numel() == 1, op, "rand_seed",
                     "rand_seed must be single-element, got ", rand_seed->numel());
    FLASHINFER_CHECK(rand_seed->dtype() == DType::kInt64, op, "rand_seed",
                     "rand_seed must be int64, got ", ssu_tname(*rand_seed));
    api::check_same_device(*rand_seed, x, op, "rand_seed", "x");
    FLASHINFER_CHECK(philox_rounds > 0 && philox_rounds <= 64, op, "philox_rounds",
                     "philox_rounds must be > 0 with rand_seed, got ", philox_rounds);
    // Upstream rounds int8 / fp8 states stochastically too; that is not implemented here.
    FLASHINFER_CHECK(!quantized, op, "rand_seed",
                     "stochastic rounding of int8 / float8_e4m3fn states is not implemented in "
                     "this library (fp16 states are)");
    if (rand_seed->device().is_cpu()) seed_value = api::host_ints(*rand_seed)[0];
  }
  // Host checks of what the kernel reads per slot (CPU tensors; CUDA guards on the device).
  if (x.device().is_cpu()) {
    const auto rs = api::host_ints(ring_start), pn = api::host_ints(pnat);
    const auto idx = sbi && sbi->defined() ? api::host_ints(*sbi) : std::vector<int64_t>{};
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t slot = idx.empty() ? b : idx[b];
      if (slot == pad_slot_id) continue;
      FLASHINFER_CHECK(slot >= 0 && slot < slots, op, "state_batch_indices", "row ", b, "'s slot ",
                       slot, " is outside the state cache [0, ", slots, ") and not pad_slot_id");
      FLASHINFER_CHECK(rs[slot] >= 0 && rs[slot] < L, op, "ring_start", "slot ", slot,
                       "'s ring_start ", rs[slot], " is outside the ring [0, ", L, ")");
      FLASHINFER_CHECK(pn[slot] >= 0 && pn[slot] <= W, op, "prev_num_accepted_tokens", "slot ",
                       slot, "'s ", pn[slot], " history tokens exceed max_window ", W);
    }
  }

  kernels::CkptSsuParams c;
  SsuParams& p = c.ssu;
  constexpr int mode = 1;  // [seq, tok, head, n] (varlen: one row of packed tokens)
  p.num_seqs = batch;
  p.T = T;
  p.multi_token = true;
  p.nheads = nheads, p.dim = dim, p.dstate = dstate, p.ngroups = ngroups;
  p.io_dtype = x.dtype();
  p.dt_dtype = dt.dtype();
  p.w_dtype = has_D ? D->dtype() : has_bias ? dt_bias->dtype() : DType::kFloat32;
  p.x = io_ref(x, mode);
  p.B = io_ref(B, mode);
  p.C = io_ref(C, mode);
  p.dt = io_ref(dt, mode);
  if (z && z->defined()) p.z = io_ref(*z, mode);
  const SsuIoRef o = io_ref(out, mode);
  p.out = out.data_ptr();
  p.out_seq = o.seq, p.out_tok = o.tok, p.out_head = o.head;
  if (varlen) {  // packed tokens of one row
    p.x.seq = p.B.seq = p.C.seq = p.dt.seq = p.z.seq = p.out_seq = 0;
    p.cu_seqlens = cu_seqlens->data_ptr();
    p.cu_seqlens_i64 = false;
    p.total_tokens = x.size(1);
  }
  p.A = A.data<float>();
  p.A_stride = A.stride(0);
  if (has_D) p.D = D->data_ptr(), p.D_stride = D->stride(0);
  if (has_bias) p.dt_bias = dt_bias->data_ptr(), p.dt_bias_stride = dt_bias->stride(0);
  p.dt_softplus = dt_softplus;
  p.state = state.data_ptr();
  p.state_dtype = state.dtype();
  p.slots = slots;
  p.state_stride_slot = state.stride(0);
  if (quantized) {
    p.state_scale = static_cast<float*>(state_scale->data_ptr());
    p.scale_stride_slot = state_scale->stride(0);
  }
  if (sbi && sbi->defined()) {
    p.src_idx = sbi->data_ptr();
    p.src_stride0 = 1;
    p.idx_i64 = sbi->dtype() == DType::kInt64;
  }
  p.pad_slot_id = pad_slot_id;
  if (rand_seed && rand_seed->defined() && state.dtype() == DType::kFloat16) {
    p.rand_seed = rand_seed->device().is_cpu() ? &seed_value : rand_seed->data<int64_t>();
    p.philox_rounds = static_cast<int>(philox_rounds);
  }
  c.L = L, c.W = W;
  c.x_cache = x_cache.data_ptr();
  c.xc_slot = x_cache.stride(0), c.xc_head = x_cache.stride(1), c.xc_row = x_cache.stride(2);
  c.B_cache = B_cache.data_ptr();
  c.bc_slot = B_cache.stride(0), c.bc_group = B_cache.stride(1), c.bc_row = B_cache.stride(2);
  c.dt_cache = dt_cache.data<float>();
  c.dc_slot = dt_cache.stride(0), c.dc_head = dt_cache.stride(1);
  c.ring_start = ring_start.data<int32_t>();
  c.pnat = pnat.data<int32_t>();
  api::launch(kCkptKernels, c, x.device(), op, "x", enable_pdl);
  return out;
}
}  // namespace

Tensor selective_state_update(
    const Tensor& state, const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B,
    const Tensor& C, const Tensor& D, std::optional<Tensor> z, std::optional<Tensor> dt_bias,
    bool dt_softplus, std::optional<Tensor> state_batch_indices, int64_t pad_slot_id,
    std::optional<Tensor> state_scale, std::optional<Tensor> out, bool disable_state_update,
    std::optional<Tensor> intermediate_states_buffer,
    std::optional<Tensor> intermediate_state_indices,
    std::optional<Tensor> intermediate_state_scales, std::optional<Tensor> rand_seed,
    int64_t philox_rounds, int64_t cache_steps, std::string algorithm,
    std::optional<Tensor> dst_state_batch_indices, std::optional<Tensor> cu_seqlens,
    std::optional<Tensor> num_accepted_tokens, std::string backend) {
  return call_op<&selective_state_update>(
      [&] {
        return ssu_impl(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices,
                        pad_slot_id, state_scale, out, disable_state_update,
                        intermediate_states_buffer, intermediate_state_indices,
                        intermediate_state_scales, rand_seed, philox_rounds, cache_steps, algorithm,
                        dst_state_batch_indices, cu_seqlens, num_accepted_tokens, backend);
      },
      state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id,
      state_scale, out, disable_state_update, intermediate_states_buffer,
      intermediate_state_indices, intermediate_state_scales, rand_seed, philox_rounds, cache_steps,
      algorithm, dst_state_batch_indices, cu_seqlens, num_accepted_tokens, backend);
}

Tensor checkpointing_ssu(const Tensor& state, const Tensor& x_cache, const Tensor& B_cache,
                         const Tensor& dt_cache, const Tensor& ring_start,
                         const Tensor& prev_num_accepted_tokens, const Tensor& x, const Tensor& dt,
                         const Tensor& A, const Tensor& B, const Tensor& C, const Tensor& out,
                         std::optional<Tensor> D, std::optional<Tensor> z,
                         std::optional<Tensor> dt_bias, bool dt_softplus,
                         std::optional<Tensor> state_batch_indices, int64_t pad_slot_id,
                         std::optional<Tensor> state_scale, std::optional<Tensor> rand_seed,
                         int64_t philox_rounds, std::optional<int64_t> d_split,
                         std::optional<Tensor> cu_seqlens, std::optional<int64_t> max_seqlen,
                         bool enable_pdl, std::optional<Tensor> cb_scaled,
                         std::optional<Tensor> cumAdt_vec, std::optional<Tensor> cb_old,
                         int64_t precompute_heads_per_cta, std::string algorithm) {
  return call_op<&checkpointing_ssu>(
      [&] {
        return ckpt_impl(state, x_cache, B_cache, dt_cache, ring_start, prev_num_accepted_tokens, x,
                         dt, A, B, C, out, D, z, dt_bias, dt_softplus, state_batch_indices,
                         pad_slot_id, state_scale, rand_seed, philox_rounds, d_split, cu_seqlens,
                         max_seqlen, cb_scaled, cumAdt_vec, cb_old, precompute_heads_per_cta,
                         algorithm, enable_pdl);
      },
      state, x_cache, B_cache, dt_cache, ring_start, prev_num_accepted_tokens, x, dt, A, B, C, out,
      D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id, state_scale, rand_seed,
      philox_rounds, d_split, cu_seqlens, max_seqlen, enable_pdl, cb_scaled, cumAdt_vec, cb_old,
      precompute_heads_per_cta, algorithm);
}

namespace {

// Bench: STP decode as Mamba-2 layers run it: batch_size requests, num_qo_heads heads of
// head_dim_qk rows and head_dim_vo state columns, num_kv_heads groups; bf16 io, fp32 dt / D /
// dt_bias, bf16 state read at slot 2b + 1 of a cache of 2 * batch, softplus, a z gate.
BenchCase bench_ssu(const BenchShape& s, Device dev) {
  const int64_t Bn = s.batch_size, H = s.num_qo_heads, P = s.head_dim_qk, N = s.head_dim_vo;
  const int64_t G = std::max<int64_t>(1, std::min(s.num_kv_heads, H));
  const DType io = s.q_dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
  const DType st = s.kv_dtype == DType::kFloat32 ? DType::kFloat32 : io;
  const uint64_t seed = s.random_seed;
  using api::bench::random_tensor;
  std::vector<int64_t> idx;
  for (int64_t b = 0; b < Bn; ++b) idx.push_back(2 * b + 1);
  Tensor dt_h = random_tensor({Bn, H, 1}, DType::kFloat32, dev, seed + 2, -1.0, 1.0);
  Tensor A_h = random_tensor({H, 1, 1}, DType::kFloat32, dev, seed + 3, -2.0, -1.0);
  Tensor D_h = random_tensor({H, 1}, DType::kFloat32, dev, seed + 6);
  Tensor bias_h = random_tensor({H, 1}, DType::kFloat32, dev, seed + 7, -4.0, -3.0);
  BenchCase c =
      api::bench::invoke_case(kSsuOp,
                              {Value(random_tensor({2 * Bn, H, P, N}, st, dev, seed, -0.5, 0.5)),
                               Value(random_tensor({Bn, H, P}, io, dev, seed + 1)),
                               Value(dt_h.as_strided({Bn, H, P}, {H, 1, 0}, 0)),
                               Value(A_h.as_strided({H, P, N}, {1, 0, 0}, 0)),
                               Value(random_tensor({Bn, G, N}, io, dev, seed + 4)),
                               Value(random_tensor({Bn, G, N}, io, dev, seed + 5)),
                               Value(D_h.as_strided({H, P}, {1, 0}, 0))},
                              {{"z", Value(random_tensor({Bn, H, P}, io, dev, seed + 8))},
                               {"dt_bias", Value(bias_h.as_strided({H, P}, {1, 0}, 0))},
                               {"dt_softplus", Value(true)},
                               {"state_batch_indices", Value(api::bench::int32_tensor(idx, dev))}});
  const double state_bytes =
      static_cast<double>(Bn * H * P * N) * static_cast<double>(dtype_size(st));
  c.bytes = 2.0 * state_bytes +
            static_cast<double>(Bn * (3 * H * P + 2 * G * N)) * static_cast<double>(dtype_size(io));
  c.flops = static_cast<double>(Bn * H * P * N) * 5.0;
  return c;
}

// Bench: batch_size rows of s_qo (<= 8) new tokens, num_qo_heads heads of head_dim_qk rows and
// head_dim_vo state columns, num_kv_heads groups, a ring of s_qo + 8 rows holding 5 history
// tokens a slot (every call flushes: 5 + s_qo > 8 from s_qo = 4), bf16 io and state.
BenchCase bench_ckpt(const BenchShape& s, Device dev) {
  const int64_t Bn = s.batch_size, H = s.num_qo_heads, P = s.head_dim_qk, N = s.head_dim_vo;
  const int64_t G = std::max<int64_t>(1, std::min(s.num_kv_heads, H));
  const int64_t T = std::clamp<int64_t>(s.s_qo, 1, 8), L = T + 8;
  const DType io = DType::kBFloat16;
  const uint64_t seed = s.random_seed;
  using api::bench::random_tensor;
  Tensor dt_h = random_tensor({Bn, T, H, 1}, DType::kFloat32, dev, seed + 2, -1.0, 1.0);
  Tensor A_h = random_tensor({H, 1, 1}, DType::kFloat32, dev, seed + 3, -1.5, -0.5);
  std::vector<int64_t> starts(static_cast<size_t>(Bn)), hist(static_cast<size_t>(Bn), 5);
  for (int64_t b = 0; b < Bn; ++b) starts[b] = (3 * b) % L;
  BenchCase c = api::bench::invoke_case(
      "checkpointing_ssu",
      {Value(random_tensor({Bn, H, P, N}, io, dev, seed, -0.5, 0.5)),
       Value(random_tensor({Bn, H, L, P}, io, dev, seed + 5)),
       Value(random_tensor({Bn, G, L, N}, io, dev, seed + 6)),
       Value(random_tensor({Bn, H, L}, DType::kFloat32, dev, seed + 7, 0.0, 1.0)),
       Value(api::bench::int32_tensor(starts, dev)), Value(api::bench::int32_tensor(hist, dev)),
       Value(random_tensor({Bn, T, H, P}, io, dev, seed + 1)),
       Value(dt_h.as_strided({Bn, T, H, P}, {T * H, H, 1, 0}, 0)),
       Value(A_h.as_strided({H, P, N}, {1, 0, 0}, 0)),
       Value(random_tensor({Bn, T, G, N}, io, dev, seed + 8)),
       Value(random_tensor({Bn, T, G, N}, io, dev, seed + 9)),
       Value(Tensor::zeros({Bn, T, H, P}, io, dev))},
      {{"dt_softplus", Value(true)}});
  const double state_bytes = static_cast<double>(Bn * H * P * N) * 2.0;
  c.bytes = 2.0 * state_bytes + static_cast<double>(Bn * L * (H * P + G * N)) * 2.0 +
            static_cast<double>(Bn * T * (3 * H * P + 2 * G * N)) * 2.0;
  c.flops = static_cast<double>(Bn * (5 + T) * H * P * N) * 5.0;
  return c;
}
}  // namespace

namespace detail {

void register_mamba_ops(OpRegistry& r) {
  declare<&selective_state_update>(
      r,
      {.name = "selective_state_update",
       .module = "flashinfer.mamba.selective_state_update",
       .summary = "Mamba-2 selective state update (decode, multi-token verify, varlen) on a state "
                  "cache"},
      arg("state").mut(), "x", "dt", "A", "B", "C", "D", "z", "dt_bias", arg("dt_softplus", false),
      "state_batch_indices", arg("pad_slot_id", int64_t{-1}), arg("state_scale").mut(),
      arg("out").mut(), arg("disable_state_update", false), arg("intermediate_states_buffer").mut(),
      "intermediate_state_indices", arg("intermediate_state_scales").mut(), "rand_seed",
      arg("philox_rounds", int64_t{10}), arg("cache_steps", int64_t{0}), arg("algorithm", "auto"),
      "dst_state_batch_indices", "cu_seqlens", "num_accepted_tokens", arg("backend", "auto"));
  api::register_backends("selective_state_update", kSsuKernels);
  declare<&checkpointing_ssu>(
      r,
      {.name = "checkpointing_ssu",
       .module = "flashinfer.mamba.checkpointing_ssu",
       .summary = "Mamba-2 state update from a checkpoint and a ring of the tokens since "
                  "(ReplaySSM)"},
      arg("state").mut(), arg("x_cache").mut(), arg("B_cache").mut(), arg("dt_cache").mut(),
      "ring_start", "prev_num_accepted_tokens", "x", "dt", "A", "B", "C", arg("out").mut(), "D",
      "z", "dt_bias", arg("dt_softplus", false), "state_batch_indices",
      arg("pad_slot_id", int64_t{-1}), arg("state_scale").mut(), "rand_seed",
      arg("philox_rounds", int64_t{10}), "d_split", "cu_seqlens", "max_seqlen",
      arg("enable_pdl", false),
      // Upstream's scratch for its two-kernel split: written there, read by nothing after the
      // call; not compared on replay.
      "cb_scaled", "cumAdt_vec", "cb_old", arg("precompute_heads_per_cta", int64_t{0}),
      arg("algorithm", "auto"));
  api::register_backends("checkpointing_ssu", kCkptKernels);
  register_bench_hook("checkpointing_ssu", bench_ckpt);

  register_bench_hook("selective_state_update", bench_ssu);
}

}  // namespace detail

}  // namespace flashinfer
