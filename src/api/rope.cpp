// Public RoPE ops (flashinfer.rope): declarations, argument checks, dispatch.
#include "flashinfer/ops/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/rope_cpu.h"
#include "kernels/rope_rules.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/rope_cuda.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kRopeModule = "flashinfer.rope";

// ---------------------------------------------------------------------------------------------
// Checks and dispatch.

struct Angles {
  double rope_theta = 1e4;
  double rope_rcp_scale = 1.0;
  double smooth_a = 0.0, smooth_b = 0.0;
  Tensor cache;  // defined: take cos/sin from it instead
};

Angles plain_angles(const char* op, double rope_scale, double rope_theta) {
  FLASHINFER_CHECK(std::isfinite(rope_scale) && rope_scale > 0.0, op, "rope_scale",
                   "must be finite and positive, got ", rope_scale);
  FLASHINFER_CHECK(std::isfinite(rope_theta) && rope_theta > 0.0, op, "rope_theta",
                   "must be finite and positive, got ", rope_theta);
  Angles a;
  a.rope_theta = rope_theta;
  a.rope_rcp_scale = 1.0 / rope_scale;
  return a;
}

Angles llama31_angles(const char* op, double rope_scale, double rope_theta, double low_freq_factor,
                      double high_freq_factor, int64_t old_context_len) {
  Angles a = plain_angles(op, rope_scale, rope_theta);
  FLASHINFER_CHECK(std::isfinite(low_freq_factor) && low_freq_factor > 0.0, op, "low_freq_factor",
                   "must be finite and positive, got ", low_freq_factor);
  FLASHINFER_CHECK(std::isfinite(high_freq_factor) && high_freq_factor > low_freq_factor, op,
                   "high_freq_factor", "must be finite and greater than low_freq_factor (",
                   low_freq_factor, "), got ", high_freq_factor);
  FLASHINFER_CHECK(old_context_len > 0, op, "old_context_len", "must be positive, got ",
                   old_context_len);
  const double two_pi = 2.0 * std::numbers::pi;
  a.smooth_a =
      static_cast<double>(old_context_len) / (two_pi * (high_freq_factor - low_freq_factor));
  a.smooth_b = -low_freq_factor / (high_freq_factor - low_freq_factor);
  return a;
}

void check_index_tensor(const Tensor& t, const Tensor& ref, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  api::check_dim(t, {1}, op, arg);
  api::check_dtype_in(t, {DType::kInt32, DType::kInt64}, op, arg);
  api::check_same_device(t, ref, op, arg, "q");
}

/// Element i of a 1-D int32/int64 CPU tensor.
int64_t read_index(const Tensor& t, int64_t i) {
  const int64_t off = i * t.stride(0);
  return t.dtype() == DType::kInt64 ? t.data<int64_t>()[off]
                                    : static_cast<int64_t>(t.data<int32_t>()[off]);
}

/// A contiguous copy of a 1-D index tensor when it is strided (kernels read it densely).
Tensor dense(const Tensor& t) { return t.stride(0) == 1 ? t : t.contiguous(); }

struct Positions {
  kernels::RopePosMode mode = kernels::RopePosMode::kPositions;
  Tensor pos, indptr, offsets;    // pos for kPositions; indptr + offsets for kIndptrOffsets
  std::vector<int64_t> resolved;  // CPU: positions computed from indptr/offsets
  const char* arg = "pos_ids";    // the argument the positions come from, for errors
};

// What each backend of the RoPE kernel receives: the kernel parameters less the positions, and
// the positions, which the backends read in different forms. The CPU reference takes one position
// per token (the ragged forms' are resolved on the host, see ragged_positions); CUDA resolves the
// ragged (indptr, offsets) form itself. Strided index tensors are read through dense copies.
struct RopeLaunch {
  kernels::RopeParams p;
  const Positions* pos;
};

// The backends of the RoPE kernel, shared by every rope op (src/api/kernel_table.h).
constexpr api::KernelEntry<RopeLaunch> kRopeKernels[] = {
    {DeviceType::kCPU, "CPU reference: fp64 angles, fp32 rotation, OpenMP over tokens", nullptr,
     [](const RopeLaunch& l, const api::LaunchContext&) {
       kernels::RopeParams p = l.p;
       p.pos_mode = kernels::RopePosMode::kPositions;
       Tensor dense_pos;
       if (l.pos->mode == kernels::RopePosMode::kIndptrOffsets) {
         p.pos = l.pos->resolved.data();
         p.pos_dtype = DType::kInt64;
       } else {
         dense_pos = dense(l.pos->pos);
         p.pos = dense_pos.data_ptr();
         p.pos_dtype = dense_pos.dtype();
       }
       kernels::cpu::apply_rope(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one block per token, cos/sin table in shared memory",
     // Computed angles take the host's frequencies through the kernel's parameters (256 pairs:
     // upstream's kernels dispatch head dims up to 512), so its bits are the CPU's.
     [](const RopeLaunch& l) {
       return l.p.cos_sin_cache == nullptr && l.p.rotary_dim > 2 * kernels::cuda::kRopeMaxPairs
                  ? api::Refusal{"rotary_dim",
                                 "the CUDA kernel computes angles for rotary_dim <= 512 only (a "
                                 "cos_sin_cache has no limit there)"}
                  : api::Refusal{};
     },
     [](const RopeLaunch& l, const api::LaunchContext& c) {
       kernels::RopeParams p = l.p;
       Tensor dpos, dindptr, doffsets;
       p.pos_mode = l.pos->mode;
       if (l.pos->mode == kernels::RopePosMode::kPositions) {
         dpos = dense(l.pos->pos);
         p.pos = dpos.data_ptr();
         p.pos_dtype = dpos.dtype();
       } else {
         dindptr = dense(l.pos->indptr);
         doffsets = dense(l.pos->offsets);
         p.indptr = dindptr.data_ptr();
         p.indptr_dtype = dindptr.dtype();
         p.offsets = doffsets.data_ptr();
         p.offsets_dtype = doffsets.dtype();
         p.batch = doffsets.size(0);
       }
       kernels::cuda::apply_rope(p, c.stream);
     }},
#endif
};

Positions pos_ids_positions(const char* op, const char* arg, const Tensor& pos_ids,
                            const Tensor& q) {
  check_index_tensor(pos_ids, q, op, arg);
  FLASHINFER_CHECK(pos_ids.size(0) == q.size(0), op, arg, "expected ", q.size(0),
                   " positions (one per token), got ", pos_ids.size(0));
  Positions p;
  p.pos = pos_ids;
  p.arg = arg;
  return p;
}

Positions ragged_positions(const char* op, const Tensor& indptr, const Tensor& offsets,
                           const Tensor& q) {
  check_index_tensor(indptr, q, op, "indptr");
  check_index_tensor(offsets, q, op, "offsets");
  const int64_t batch = offsets.size(0);
  FLASHINFER_CHECK(indptr.size(0) == batch + 1, op, "indptr", "expected batch + 1 = ", batch + 1,
                   " entries (offsets has ", batch, "), got ", indptr.size(0));
  Positions p;
  p.arg = "offsets";
  p.mode = kernels::RopePosMode::kIndptrOffsets;
  p.indptr = indptr;
  p.offsets = offsets;
  if (!q.device().is_cpu()) return p;
  const int64_t nnz = q.size(0);
  FLASHINFER_CHECK(read_index(indptr, 0) == 0, op, "indptr", "indptr[0] must be 0, got ",
                   read_index(indptr, 0));
  FLASHINFER_CHECK(read_index(indptr, batch) == nnz, op, "indptr", "indptr[", batch,
                   "] must equal nnz = ", nnz, ", got ", read_index(indptr, batch));
  p.resolved.resize(static_cast<std::size_t>(nnz));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t lo = read_index(indptr, b), hi = read_index(indptr, b + 1);
    FLASHINFER_CHECK(lo <= hi, op, "indptr", "must be non-decreasing, but indptr[", b, "] = ", lo,
                     " > indptr[", b + 1, "] = ", hi);
    const int64_t off = read_index(offsets, b);
    for (int64_t t = lo; t < hi; ++t) p.resolved[static_cast<std::size_t>(t)] = off + (t - lo);
  }
  return p;
}

void check_qk(const char* op, const char* q_name, const char* k_name, const Tensor& q,
              const Tensor& k) {
  api::check_defined(q, op, q_name);
  api::check_defined(k, op, k_name);
  api::check_dim(q, {3}, op, q_name);
  api::check_dim(k, {3}, op, k_name);
  api::check_dtype_in(q, {DType::kFloat16, DType::kBFloat16, DType::kFloat32}, op, q_name);
  api::check_same_dtype(k, q, op, k_name, q_name);
  api::check_same_device(k, q, op, k_name, q_name);
  FLASHINFER_CHECK(k.size(0) == q.size(0), op, k_name, "has ", k.size(0), " tokens but ", q_name,
                   " has ", q.size(0));
  FLASHINFER_CHECK(k.size(2) == q.size(2), op, k_name, "head dim ", k.size(2), " differs from ",
                   q_name, "'s ", q.size(2));
}

int64_t resolve_rotary_dim(const char* op, std::optional<int64_t> rotary_dim, int64_t head_dim) {
  const int64_t r = rotary_dim.value_or(head_dim);
  FLASHINFER_CHECK(r > 0 && r % 2 == 0 && r <= head_dim, op, "rotary_dim",
                   "must be even, positive and <= head_dim (", head_dim, "), got ", r,
                   rotary_dim ? "" : " (the default, head_dim)");
  return r;
}

// Computed angles must stay inside rope_sincos's range (kernels/rope_rules.h), which both
// backends share; CPU positions are checked here, device ones cannot be without a synchronize
// (the CUDA kernel writes NaN there, as for a position outside a cos/sin cache). The largest
// |pos * f| is max |pos| times max f (rounding is monotone).
void check_angles(const char* op, const kernels::RopeParams& p, const Positions& pos) {
  double max_f = 0.0, max_pos = 0.0;
  for (int64_t i = 0; i < p.rotary_dim / 2; ++i) {
    max_f = std::max(max_f, std::fabs(kernels::rope_pair_frequency(p, i)));
  }
  if (pos.mode == kernels::RopePosMode::kIndptrOffsets) {
    for (int64_t v : pos.resolved) max_pos = std::max(max_pos, std::fabs(static_cast<double>(v)));
  } else {
    for (int64_t t = 0; t < pos.pos.size(0); ++t) {
      max_pos = std::max(max_pos, std::fabs(static_cast<double>(read_index(pos.pos, t))));
    }
  }
  const double angle = max_pos * max_f;
  FLASHINFER_CHECK_CODE(angle < kernels::kRopeMaxAngle, ErrorCode::kUnsupported, op, pos.arg,
                        "position ", max_pos, " times frequency ", max_f, " is ", angle,
                        " rad, past the range of computed angles (", kernels::kRopeMaxAngle,
                        " rad); use a cos_sin_cache");
}

// Fills the kernel parameters for 3-D views q/k -> q_out/k_out and runs the kernel.
void run_rope(const char* op, const Tensor& q, const Tensor& k, const Tensor& q_out,
              const Tensor& k_out, bool inplace, const Positions& pos, int64_t rotary_dim,
              bool interleave, const Angles& ang) {
  kernels::RopeParams p;  // positions: filled by each backend from `pos`
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.q_out = q_out.data_ptr();
  p.k_out = k_out.data_ptr();
  p.nnz = q.size(0);
  p.num_q_heads = q.size(1);
  p.num_k_heads = k.size(1);
  p.head_dim = q.size(2);
  p.rotary_dim = rotary_dim;
  p.q_stride_n = q.stride(0), p.q_stride_h = q.stride(1), p.q_stride_d = q.stride(2);
  p.k_stride_n = k.stride(0), p.k_stride_h = k.stride(1), p.k_stride_d = k.stride(2);
  p.q_out_stride_n = q_out.stride(0), p.q_out_stride_h = q_out.stride(1);
  p.q_out_stride_d = q_out.stride(2);
  p.k_out_stride_n = k_out.stride(0), p.k_out_stride_h = k_out.stride(1);
  p.k_out_stride_d = k_out.stride(2);
  p.interleave = interleave;
  p.inplace = inplace;
  p.dtype = q.dtype();
  p.rope_theta = ang.rope_theta;
  p.rope_rcp_scale = ang.rope_rcp_scale;
  p.smooth_a = ang.smooth_a;
  p.smooth_b = ang.smooth_b;
  if (ang.cache.defined()) {
    p.cos_sin_cache = ang.cache.data<float>();
    p.cache_rows = ang.cache.size(0);
    p.cache_stride_row = ang.cache.stride(0);
    p.cache_stride_col = ang.cache.stride(1);
  }
  if (p.nnz == 0 || p.num_q_heads + p.num_k_heads == 0) return;
  if (q.device().is_cpu() && !ang.cache.defined()) check_angles(op, p, pos);
  // Errors name "q" as the argument that decides the device, whatever the op calls it.
  api::launch(kRopeKernels, RopeLaunch{.p = p, .pos = &pos}, q.device(), op, "q");
}

std::pair<Tensor, Tensor> rope_common(const char* op, const Tensor& q, const Tensor& k,
                                      bool inplace, Positions pos, int64_t rotary_dim,
                                      bool interleave, const Angles& ang) {
  if (inplace) {
    run_rope(op, q, k, q, k, true, pos, rotary_dim, interleave, ang);
    return {q, k};
  }
  Tensor q_rope = Tensor::empty(q.shape(), q.dtype(), q.device());
  Tensor k_rope = Tensor::empty(k.shape(), k.dtype(), k.device());
  run_rope(op, q, k, q_rope, k_rope, false, pos, rotary_dim, interleave, ang);
  return {q_rope, k_rope};
}

std::pair<Tensor, Tensor> rope_ragged_impl(const char* op, bool inplace, const Tensor& q,
                                           const Tensor& k, const Tensor& indptr,
                                           const Tensor& offsets, std::optional<int64_t> rotary_dim,
                                           bool interleave, const Angles& ang) {
  const int64_t r = resolve_rotary_dim(op, rotary_dim, q.size(2));
  return rope_common(op, q, k, inplace, ragged_positions(op, indptr, offsets, q), r, interleave,
                     ang);
}

std::pair<Tensor, Tensor> pos_ids_impl(const char* op, bool inplace, const Tensor& q,
                                       const Tensor& k, const Tensor& pos_ids,
                                       std::optional<int64_t> rotary_dim, bool interleave,
                                       const Angles& ang) {
  const int64_t r = resolve_rotary_dim(op, rotary_dim, q.size(2));
  return rope_common(op, q, k, inplace, pos_ids_positions(op, "pos_ids", pos_ids, q), r, interleave,
                     ang);
}

// query/key [nnz, H * head_size] (or [nnz, H, head_size]) as [nnz, H, head_size] views.
Tensor heads_view(const char* op, const char* arg, const Tensor& t, int64_t nnz,
                  int64_t head_size) {
  api::check_defined(t, op, arg);
  api::check_dim(t, {2, 3}, op, arg);
  FLASHINFER_CHECK(t.size(0) == nnz, op, arg, "has ", t.size(0), " tokens but positions has ", nnz);
  const int64_t width = t.dim() == 2 ? t.size(1) : t.size(1) * t.size(2);
  FLASHINFER_CHECK(width % head_size == 0, op, arg, "row width ", width,
                   " is not a multiple of head_size ", head_size);
  try {
    return t.view({nnz, width / head_size, head_size});
  } catch (const Error&) {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, arg, "strides ", shape_to_string(t.strides()),
                    " do not allow a [nnz, heads, ", head_size, "] view");
  }
}

std::pair<Tensor, Tensor> cos_sin_impl(const char* op, bool inplace, const Tensor& positions,
                                       const Tensor& query, const Tensor& key, int64_t head_size,
                                       const Tensor& cos_sin_cache, bool is_neox) {
  api::check_defined(positions, op, "positions");
  FLASHINFER_CHECK(head_size > 0, op, "head_size", "must be positive, got ", head_size);
  api::check_dim(positions, {1}, op, "positions");
  const int64_t nnz = positions.size(0);
  Tensor q3 = heads_view(op, "query", query, nnz, head_size);
  Tensor k3 = heads_view(op, "key", key, nnz, head_size);
  check_qk(op, "query", "key", q3, k3);
  api::check_dtype_in(positions, {DType::kInt32, DType::kInt64}, op, "positions");
  api::check_same_device(positions, query, op, "positions", "query");
  api::check_defined(cos_sin_cache, op, "cos_sin_cache");
  api::check_dim(cos_sin_cache, {2}, op, "cos_sin_cache");
  api::check_dtype_in(cos_sin_cache, {DType::kFloat32}, op, "cos_sin_cache");
  api::check_same_device(cos_sin_cache, query, op, "cos_sin_cache", "query");
  const int64_t rotary_dim = cos_sin_cache.size(1);
  FLASHINFER_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_size, op,
                   "cos_sin_cache",
                   "width (the rotary dim) must be even, positive and <= ", "head_size (",
                   head_size, "), got ", rotary_dim);
  if (positions.device().is_cpu()) {
    const int64_t rows = cos_sin_cache.size(0);
    for (int64_t t = 0; t < nnz; ++t) {
      const int64_t pos = read_index(positions, t);
      FLASHINFER_CHECK(pos >= 0 && pos < rows, op, "positions", "positions[", t, "] = ", pos,
                       " is outside the cos/sin cache (", rows, " rows)");
    }
  }
  Angles ang;
  ang.cache = cos_sin_cache;
  Positions pos;
  pos.pos = positions;
  if (inplace) {
    run_rope(op, q3, k3, q3, k3, true, pos, rotary_dim, !is_neox, ang);
    return {query, key};
  }
  Tensor query_out = Tensor::empty(query.shape(), query.dtype(), query.device());
  Tensor key_out = Tensor::empty(key.shape(), key.dtype(), key.device());
  run_rope(op, q3, k3, query_out.view(q3.shape()), key_out.view(k3.shape()), false, pos, rotary_dim,
           !is_neox, ang);
  return {query_out, key_out};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public functions.

std::pair<Tensor, Tensor> apply_rope(const Tensor& q, const Tensor& k, const Tensor& indptr,
                                     const Tensor& offsets, std::optional<int64_t> rotary_dim,
                                     bool interleave, double rope_scale, double rope_theta) {
  return call_op<&apply_rope>(
      [&] {
        const char* op = "apply_rope";
        check_qk(op, "q", "k", q, k);
        return rope_ragged_impl(op, false, q, k, indptr, offsets, rotary_dim, interleave,
                                plain_angles(op, rope_scale, rope_theta));
      },
      q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta);
}

void apply_rope_inplace(const Tensor& q, const Tensor& k, const Tensor& indptr,
                        const Tensor& offsets, std::optional<int64_t> rotary_dim, bool interleave,
                        double rope_scale, double rope_theta) {
  call_op<&apply_rope_inplace>(
      [&] {
        const char* op = "apply_rope_inplace";
        check_qk(op, "q", "k", q, k);
        rope_ragged_impl(op, true, q, k, indptr, offsets, rotary_dim, interleave,
                         plain_angles(op, rope_scale, rope_theta));
      },
      q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta);
}

std::pair<Tensor, Tensor> apply_rope_pos_ids(const Tensor& q, const Tensor& k,
                                             const Tensor& pos_ids,
                                             std::optional<int64_t> rotary_dim, bool interleave,
                                             double rope_scale, double rope_theta) {
  return call_op<&apply_rope_pos_ids>(
      [&] {
        const char* op = "apply_rope_pos_ids";
        check_qk(op, "q", "k", q, k);
        return pos_ids_impl(op, false, q, k, pos_ids, rotary_dim, interleave,
                            plain_angles(op, rope_scale, rope_theta));
      },
      q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta);
}

void apply_rope_pos_ids_inplace(const Tensor& q, const Tensor& k, const Tensor& pos_ids,
                                std::optional<int64_t> rotary_dim, bool interleave,
                                double rope_scale, double rope_theta) {
  call_op<&apply_rope_pos_ids_inplace>(
      [&] {
        const char* op = "apply_rope_pos_ids_inplace";
        check_qk(op, "q", "k", q, k);
        pos_ids_impl(op, true, q, k, pos_ids, rotary_dim, interleave,
                     plain_angles(op, rope_scale, rope_theta));
      },
      q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta);
}

std::pair<Tensor, Tensor> apply_llama31_rope(const Tensor& q, const Tensor& k, const Tensor& indptr,
                                             const Tensor& offsets,
                                             std::optional<int64_t> rotary_dim, bool interleave,
                                             double rope_scale, double rope_theta,
                                             double low_freq_factor, double high_freq_factor,
                                             int64_t old_context_len) {
  return call_op<&apply_llama31_rope>(
      [&] {
        const char* op = "apply_llama31_rope";
        check_qk(op, "q", "k", q, k);
        return rope_ragged_impl(op, false, q, k, indptr, offsets, rotary_dim, interleave,
                                llama31_angles(op, rope_scale, rope_theta, low_freq_factor,
                                               high_freq_factor, old_context_len));
      },
      q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor,
      high_freq_factor, old_context_len);
}

void apply_llama31_rope_inplace(const Tensor& q, const Tensor& k, const Tensor& indptr,
                                const Tensor& offsets, std::optional<int64_t> rotary_dim,
                                bool interleave, double rope_scale, double rope_theta,
                                double low_freq_factor, double high_freq_factor,
                                int64_t old_context_len) {
  call_op<&apply_llama31_rope_inplace>(
      [&] {
        const char* op = "apply_llama31_rope_inplace";
        check_qk(op, "q", "k", q, k);
        rope_ragged_impl(op, true, q, k, indptr, offsets, rotary_dim, interleave,
                         llama31_angles(op, rope_scale, rope_theta, low_freq_factor,
                                        high_freq_factor, old_context_len));
      },
      q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor,
      high_freq_factor, old_context_len);
}

std::pair<Tensor, Tensor> apply_llama31_rope_pos_ids(
    const Tensor& q, const Tensor& k, const Tensor& pos_ids, std::optional<int64_t> rotary_dim,
    bool interleave, double rope_scale, double rope_theta, double low_freq_factor,
    double high_freq_factor, int64_t old_context_len) {
  return call_op<&apply_llama31_rope_pos_ids>(
      [&] {
        const char* op = "apply_llama31_rope_pos_ids";
        check_qk(op, "q", "k", q, k);
        return pos_ids_impl(op, false, q, k, pos_ids, rotary_dim, interleave,
                            llama31_angles(op, rope_scale, rope_theta, low_freq_factor,
                                           high_freq_factor, old_context_len));
      },
      q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor,
      high_freq_factor, old_context_len);
}

void apply_llama31_rope_pos_ids_inplace(const Tensor& q, const Tensor& k, const Tensor& pos_ids,
                                        std::optional<int64_t> rotary_dim, bool interleave,
                                        double rope_scale, double rope_theta,
                                        double low_freq_factor, double high_freq_factor,
                                        int64_t old_context_len) {
  call_op<&apply_llama31_rope_pos_ids_inplace>(
      [&] {
        const char* op = "apply_llama31_rope_pos_ids_inplace";
        check_qk(op, "q", "k", q, k);
        pos_ids_impl(op, true, q, k, pos_ids, rotary_dim, interleave,
                     llama31_angles(op, rope_scale, rope_theta, low_freq_factor, high_freq_factor,
                                    old_context_len));
      },
      q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor,
      high_freq_factor, old_context_len);
}

std::pair<Tensor, Tensor> apply_rope_with_cos_sin_cache(const Tensor& positions,
                                                        const Tensor& query, const Tensor& key,
                                                        int64_t head_size,
                                                        const Tensor& cos_sin_cache, bool is_neox) {
  return call_op<&apply_rope_with_cos_sin_cache>(
      [&] {
        return cos_sin_impl("apply_rope_with_cos_sin_cache", false, positions, query, key,
                            head_size, cos_sin_cache, is_neox);
      },
      positions, query, key, head_size, cos_sin_cache, is_neox);
}

void apply_rope_with_cos_sin_cache_inplace(const Tensor& positions, const Tensor& query,
                                           const Tensor& key, int64_t head_size,
                                           const Tensor& cos_sin_cache, bool is_neox) {
  call_op<&apply_rope_with_cos_sin_cache_inplace>(
      [&] {
        cos_sin_impl("apply_rope_with_cos_sin_cache_inplace", true, positions, query, key,
                     head_size, cos_sin_cache, is_neox);
      },
      positions, query, key, head_size, cos_sin_cache, is_neox);
}

// ---------------------------------------------------------------------------------------------
// Registration.

namespace {

// Bench hook for the pos_ids forms: batch_size * s_qo tokens, q [nnz, Hq, Dqk], k [nnz, Hkv,
// Dqk] in q_dtype, positions 0..s_qo-1 per request. Bytes: q and k read and written once, the
// positions read once. FLOPs: a rotation is 3 per element (two multiplies, one add).
BenchCase bench_rope_pos_ids(const BenchShape& s, Device dev, const char* name) {
  const int64_t nnz = s.batch_size * s.s_qo;
  const Shape qs{nnz, s.num_qo_heads, s.head_dim_qk}, ks{nnz, s.num_kv_heads, s.head_dim_qk};
  std::vector<int64_t> pos(static_cast<std::size_t>(nnz));
  for (int64_t i = 0; i < nnz; ++i) pos[static_cast<std::size_t>(i)] = i % s.s_qo;
  BenchCase c = api::bench::invoke_case(
      name, {Value(api::bench::random_tensor(qs, s.q_dtype, dev, s.random_seed)),
             Value(api::bench::random_tensor(ks, s.q_dtype, dev, s.random_seed + 1)),
             Value(api::bench::int32_tensor(pos, dev))});
  const double elems = static_cast<double>(nnz * (s.num_qo_heads + s.num_kv_heads) * s.head_dim_qk);
  c.flops = 3.0 * elems;
  c.bytes = 2.0 * (api::bench::nbytes(qs, s.q_dtype) + api::bench::nbytes(ks, s.q_dtype)) +
            4.0 * static_cast<double>(nnz);
  return c;
}

// The ragged (indptr, offsets) forms: batch_size requests of s_qo tokens, offsets 0.
BenchCase bench_rope_ragged(const BenchShape& s, Device dev, const char* name) {
  const int64_t nnz = s.batch_size * s.s_qo;
  const Shape qs{nnz, s.num_qo_heads, s.head_dim_qk}, ks{nnz, s.num_kv_heads, s.head_dim_qk};
  std::vector<int64_t> indptr, offsets(static_cast<std::size_t>(s.batch_size), 0);
  for (int64_t b = 0; b <= s.batch_size; ++b) indptr.push_back(b * s.s_qo);
  BenchCase c = api::bench::invoke_case(
      name, {Value(api::bench::random_tensor(qs, s.q_dtype, dev, s.random_seed)),
             Value(api::bench::random_tensor(ks, s.q_dtype, dev, s.random_seed + 1)),
             Value(api::bench::int32_tensor(indptr, dev)),
             Value(api::bench::int32_tensor(offsets, dev))});
  const double elems = static_cast<double>(nnz * (s.num_qo_heads + s.num_kv_heads) * s.head_dim_qk);
  c.flops = 3.0 * elems;
  c.bytes = 2.0 * (api::bench::nbytes(qs, s.q_dtype) + api::bench::nbytes(ks, s.q_dtype)) +
            4.0 * static_cast<double>(2 * s.batch_size + 1);
  return c;
}

// The cos/sin-cache forms: query/key [nnz, heads * head_dim], a fp32 cache of s_qo positions
// with rotary_dim = head_dim (the cache's values need not be real cosines to time the op).
BenchCase bench_rope_cos_sin(const BenchShape& s, Device dev, const char* name) {
  const int64_t nnz = s.batch_size * s.s_qo;
  const Shape qs{nnz, s.num_qo_heads * s.head_dim_qk}, ks{nnz, s.num_kv_heads * s.head_dim_qk};
  std::vector<int64_t> pos(static_cast<std::size_t>(nnz));
  for (int64_t i = 0; i < nnz; ++i) pos[static_cast<std::size_t>(i)] = i % s.s_qo;
  const Shape cache{s.s_qo, s.head_dim_qk};
  BenchCase c = api::bench::invoke_case(
      name, {Value(api::bench::int32_tensor(pos, dev)),
             Value(api::bench::random_tensor(qs, s.q_dtype, dev, s.random_seed)),
             Value(api::bench::random_tensor(ks, s.q_dtype, dev, s.random_seed + 1)),
             Value(s.head_dim_qk),
             Value(api::bench::random_tensor(cache, DType::kFloat32, dev, s.random_seed + 2))});
  const double elems = static_cast<double>(nnz * (s.num_qo_heads + s.num_kv_heads) * s.head_dim_qk);
  c.flops = 3.0 * elems;
  c.bytes = 2.0 * (api::bench::nbytes(qs, s.q_dtype) + api::bench::nbytes(ks, s.q_dtype)) +
            4.0 * static_cast<double>(nnz) + api::bench::nbytes(cache, DType::kFloat32);
  return c;
}

}  // namespace

namespace detail {
void register_rope_ops(OpRegistry& r) {
  // Defaults mirror upstream's Python literals (rope_scale=1 is an int there, and
  // inspect.signature prints it that way). The _inplace forms write q and k (the recorder saves
  // them after the call).
  declare<&apply_rope>(
      r,
      {.name = "apply_rope",
       .module = kRopeModule,
       .summary = "RoPE on a ragged batch (indptr/offsets), returns (q_rope, k_rope)"},
      "q", "k", "indptr", "offsets", "rotary_dim", arg("interleave", false), arg("rope_scale", 1),
      arg("rope_theta", 1e4));
  declare<&apply_rope_inplace>(r,
                               {.name = "apply_rope_inplace",
                                .module = kRopeModule,
                                .summary = "RoPE on a ragged batch (indptr/offsets), in place"},
                               arg("q").mut(), arg("k").mut(), "indptr", "offsets", "rotary_dim",
                               arg("interleave", false), arg("rope_scale", 1),
                               arg("rope_theta", 1e4));
  declare<&apply_rope_pos_ids>(
      r,
      {.name = "apply_rope_pos_ids",
       .module = kRopeModule,
       .summary = "RoPE with per-token positions, returns (q_rope, k_rope)"},
      "q", "k", "pos_ids", "rotary_dim", arg("interleave", false), arg("rope_scale", 1),
      arg("rope_theta", 1e4));
  declare<&apply_rope_pos_ids_inplace>(r,
                                       {.name = "apply_rope_pos_ids_inplace",
                                        .module = kRopeModule,
                                        .summary = "RoPE with per-token positions, in place"},
                                       arg("q").mut(), arg("k").mut(), "pos_ids", "rotary_dim",
                                       arg("interleave", false), arg("rope_scale", 1),
                                       arg("rope_theta", 1e4));
  declare<&apply_llama31_rope>(
      r,
      {.name = "apply_llama31_rope",
       .module = kRopeModule,
       .summary = "Llama 3.1 RoPE on a ragged batch, returns (q_rope, k_rope)"},
      "q", "k", "indptr", "offsets", "rotary_dim", arg("interleave", false), arg("rope_scale", 8),
      arg("rope_theta", 5e5), arg("low_freq_factor", 1), arg("high_freq_factor", 4),
      arg("old_context_len", 8192));
  declare<&apply_llama31_rope_inplace>(r,
                                       {.name = "apply_llama31_rope_inplace",
                                        .module = kRopeModule,
                                        .summary = "Llama 3.1 RoPE on a ragged batch, in place"},
                                       arg("q").mut(), arg("k").mut(), "indptr", "offsets",
                                       "rotary_dim", arg("interleave", false), arg("rope_scale", 8),
                                       arg("rope_theta", 5e5), arg("low_freq_factor", 1),
                                       arg("high_freq_factor", 4), arg("old_context_len", 8192));
  declare<&apply_llama31_rope_pos_ids>(
      r,
      {.name = "apply_llama31_rope_pos_ids",
       .module = kRopeModule,
       .summary = "Llama 3.1 RoPE with per-token positions, returns (q_rope, k_rope)"},
      "q", "k", "pos_ids", "rotary_dim", arg("interleave", false), arg("rope_scale", 8),
      arg("rope_theta", 5e5), arg("low_freq_factor", 1), arg("high_freq_factor", 4),
      arg("old_context_len", 8192));
  declare<&apply_llama31_rope_pos_ids_inplace>(
      r,
      {.name = "apply_llama31_rope_pos_ids_inplace",
       .module = kRopeModule,
       .summary = "Llama 3.1 RoPE with per-token positions, in place"},
      arg("q").mut(), arg("k").mut(), "pos_ids", "rotary_dim", arg("interleave", false),
      arg("rope_scale", 8), arg("rope_theta", 5e5), arg("low_freq_factor", 1),
      arg("high_freq_factor", 4), arg("old_context_len", 8192));
  declare<&apply_rope_with_cos_sin_cache>(r,
                                          {.name = "apply_rope_with_cos_sin_cache",
                                           .module = kRopeModule,
                                           .summary = "RoPE from a precomputed fp32 cos/sin cache"},
                                          "positions", "query", "key", "head_size", "cos_sin_cache",
                                          arg("is_neox", true));
  declare<&apply_rope_with_cos_sin_cache_inplace>(
      r,
      {.name = "apply_rope_with_cos_sin_cache_inplace",
       .module = kRopeModule,
       .summary = "RoPE from a precomputed fp32 cos/sin cache, in place"},
      "positions", arg("query").mut(), arg("key").mut(), "head_size", "cos_sin_cache",
      arg("is_neox", true));

  // Every rope op runs the one kernel; the three groups differ in their bench inputs.
  for (const char* name :
       {"apply_rope", "apply_rope_inplace", "apply_llama31_rope", "apply_llama31_rope_inplace"}) {
    api::register_backends(name, kRopeKernels);
    register_bench_hook(
        name, [name](const BenchShape& s, Device d) { return bench_rope_ragged(s, d, name); });
  }
  for (const char* name : {"apply_rope_pos_ids", "apply_rope_pos_ids_inplace",
                           "apply_llama31_rope_pos_ids", "apply_llama31_rope_pos_ids_inplace"}) {
    api::register_backends(name, kRopeKernels);
    register_bench_hook(
        name, [name](const BenchShape& s, Device d) { return bench_rope_pos_ids(s, d, name); });
  }
  for (const char* name :
       {"apply_rope_with_cos_sin_cache", "apply_rope_with_cos_sin_cache_inplace"}) {
    api::register_backends(name, kRopeKernels);
    register_bench_hook(
        name, [name](const BenchShape& s, Device d) { return bench_rope_cos_sin(s, d, name); });
  }
}
}  // namespace detail

}  // namespace flashinfer
