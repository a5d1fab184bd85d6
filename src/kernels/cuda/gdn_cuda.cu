#include <cmath>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/gdn_cuda.h"
#include "kernels/gdn_rules.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kGdnWarps = 4;  // state rows (v) of one (sequence, head) per block

__device__ __forceinline__ int64_t load_index(const void* p, bool i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

__device__ __forceinline__ int64_t state_offset(const GdnStateRef& s, int64_t slot, int64_t h,
                                                int64_t k, int64_t v) {
  return slot * s.stride_slot + h * s.stride_head + k * s.stride_k + v * s.stride_v;
}

template <class ST, int KJ>
__device__ __forceinline__ void store_row(const GdnStateRef& s, int64_t slot, int64_t h, int64_t v,
                                          const float (&row)[KJ], int64_t K, int lane) {
  ST* base = static_cast<ST*>(s.data);
  FLASHINFER_UNROLL
  for (int j = 0; j < KJ; ++j) {
    const int64_t k = j * 32 + lane;
    if (k < K) base[state_offset(s, slot, h, k, v)] = from_f32<ST>(row[j]);
  }
}

template <int KJ>
__device__ __forceinline__ void store_fp32_row(float* dst, const float (&row)[KJ], int64_t K,
                                               int lane) {
  FLASHINFER_UNROLL
  for (int j = 0; j < KJ; ++j) {
    const int64_t k = j * 32 + lane;
    if (k < K) dst[k] = row[j];
  }
}

// A q or k row (K values, lane-strided) as fp32, normalized when `norm`.
template <class IO, int KJ>
__device__ __forceinline__ void load_qk(const IO* base, int64_t K, bool norm, bool via_bf16,
                                        float (&x)[KJ], int lane) {
  float ss = 0.0f;
  FLASHINFER_UNROLL
  for (int j = 0; j < KJ; ++j) {
    const int64_t k = j * 32 + lane;
    x[j] = k < K ? gdn::via_bf16(to_f32(base[k]), via_bf16) : 0.0f;
    ss += x[j] * x[j];
  }
  if (!norm) return;
  const float inv = gdn::l2_inv_norm(warp_reduce_sum(ss));
  FLASHINFER_UNROLL
  for (int j = 0; j < KJ; ++j) x[j] *= inv;
}

template <class IO, class ST, int KJ>
// At least 4 blocks an SM: the register target ptxas picks then keeps every instance free of
// spills (without it, the 4-values-a-lane instances spilled 4 bytes at 64 registers).
__global__ void __launch_bounds__(kGdnWarps * 32, 4) gdn_recurrent_kernel(GdnParams p) {
  pdl_wait();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t vblocks = (p.V + kGdnWarps - 1) / kGdnWarps;
  const int64_t n = blockIdx.x / vblocks;
  const int64_t v = (blockIdx.x % vblocks) * kGdnWarps + warp;
  const int64_t h = blockIdx.y;
  if (n >= p.num_seqs || v >= p.V) return;
  const int64_t K = p.K;

  int64_t begin = 0, len = p.T;
  if (p.cu_seqlens) {
    begin = load_index(p.cu_seqlens, p.cu_seqlens_i64, n);
    const int64_t end = load_index(p.cu_seqlens, p.cu_seqlens_i64, n + 1);
    if (begin < 0 || end < begin || end > p.total_tokens) return;  // the CPU path refuses these
    len = end - begin;
  }
  auto out_off = [&](int64_t t) {
    return n * p.out_stride_seq + (begin + t) * p.out_stride_tok + h * p.out_stride_head + v;
  };
  auto write_out = [&](int64_t t, float o) {
    if (lane != 0) return;
    if (p.out_via_bf16) o = __bfloat162float(__float2bfloat16_rn(o));
    store_any(p.out, out_off(t), p.out_dtype, o);
  };

  // What the CPU path refuses on the host: a read slot outside the pool (or a negative one where
  // that is invalid) writes NaN outputs and no state.
  const float nan = __int_as_float(0x7fc00000);
  int64_t r = p.read_idx ? load_index(p.read_idx, p.read_idx_i64, n) : n;
  if (r < 0) {
    if (p.negative_read == GdnNegativeRead::kSlotZero) {
      r = 0;
    } else if (p.negative_read == GdnNegativeRead::kZeroState) {
      // From the zero state: nothing read; the write slot is write_idx's.
    } else if (p.negative_read == GdnNegativeRead::kInvalid) {
      for (int64_t t = 0; t < len; ++t) write_out(t, nan);
      return;
    } else {
      if (p.negative_read == GdnNegativeRead::kSkipZeroOutput) {
        for (int64_t t = 0; t < len; ++t) write_out(t, 0.0f);
      }
      return;
    }
  }
  // A read slot outside the pool read, or (written back to the same slot) outside the pool
  // written: the CPU refuses both on the host; here NaN outputs say so. The same slot: no
  // write_idx, or write_idx the read_idx tensor itself, as chunk_gated_delta_rule's
  // state_indices pass it (without the second form, a prefill index past the output pool with no
  // initial state computed from zeros and dropped the write).
  const bool writes_read_slot = p.write_idx == nullptr || p.write_idx == p.read_idx;
  if (p.read_idx && r >= 0 &&
      ((p.state_in.data && r >= p.state_in.slots) ||
       (writes_read_slot && p.state_out.data && r >= p.state_out.slots))) {
    for (int64_t t = 0; t < len; ++t) write_out(t, nan);
    return;
  }
  if (len <= 0) return;
  int64_t w = p.write_idx ? load_index(p.write_idx, p.write_idx_i64, n) : r;
  if (w < 0) w = p.negative_write == GdnNegativeWrite::kSlotZero ? 0 : -1;
  if (w >= p.state_out.slots) w = -1;

  float s[KJ];
  FLASHINFER_UNROLL
  for (int j = 0; j < KJ; ++j) {
    const int64_t k = j * 32 + lane;
    s[j] = 0.0f;
    if (p.state_in.data && r >= 0 && k < K) {
      s[j] = to_f32(static_cast<const ST*>(p.state_in.data)[state_offset(p.state_in, r, h, k, v)]);
    }
  }
  const int64_t qh = gdn::source_head(h, p.Hq, p.H), kh = gdn::source_head(h, p.Hk, p.H);
  const int64_t vh = gdn::source_head(h, p.Hv, p.H);
  float A = 0.0f, dtb = 0.0f;
  if (p.decode_gates) {
    A = p.A_log[h];
    dtb = load_any(p.dt_bias, h, p.dt_bias_dtype);
  }
  for (int64_t t = 0; t < len; ++t) {
    const int64_t tok = begin + t;
    float q[KJ], kk[KJ];
    load_qk<IO, KJ>(static_cast<const IO*>(p.q) + n * p.q_stride_seq + tok * p.q_stride_tok +
                        qh * p.q_stride_head,
                    K, p.l2norm, p.qkv_via_bf16, q, lane);
    load_qk<IO, KJ>(static_cast<const IO*>(p.k) + n * p.k_stride_seq + tok * p.k_stride_tok +
                        kh * p.k_stride_head,
                    K, p.l2norm, p.qkv_via_bf16, kk, lane);
    if (!p.scale_output) {
      FLASHINFER_UNROLL
      for (int j = 0; j < KJ; ++j) q[j] *= p.scale;
    }
    float decay = 1.0f, beta = 1.0f;
    if (p.decode_gates) {
      const GdnGateRef& a = p.a;
      const GdnGateRef& b = p.b;
      decay = gdn::decode_decay(
          gdn::via_bf16(
              load_any(a.data, n * a.stride_seq + tok * a.stride_tok + h * a.stride_head, a.dtype),
              p.gates_via_bf16),
          dtb, A);
      beta = gdn::decode_beta(gdn::via_bf16(
          load_any(b.data, n * b.stride_seq + tok * b.stride_tok + h * b.stride_head, b.dtype),
          p.gates_via_bf16));
    } else {
      if (p.g.data) {
        decay = static_cast<const float*>(p.g.data)[tok * p.g.stride_tok + h * p.g.stride_head];
      }
      if (p.beta.data) {
        beta = static_cast<const float*>(
            p.beta.data)[tok * p.beta.stride_tok + h * p.beta.stride_head];
      }
    }
    const float vv = gdn::via_bf16(
        to_f32(static_cast<const IO*>(
            p.v)[n * p.v_stride_seq + tok * p.v_stride_tok + vh * p.v_stride_head + v]),
        p.qkv_via_bf16);
    // Lanes past K keep s = 0 (an inf u or decay times their 0 would be NaN in the sums).
    float pred = 0.0f;
    FLASHINFER_UNROLL
    for (int j = 0; j < KJ; ++j) {
      if (j * 32 + lane < K) s[j] *= decay;
      pred += s[j] * kk[j];
    }
    const float u = (vv - warp_reduce_sum(pred)) * beta;
    float o = 0.0f;
    FLASHINFER_UNROLL
    for (int j = 0; j < KJ; ++j) {
      if (j * 32 + lane < K) s[j] += kk[j] * u;
      o += s[j] * q[j];
    }
    o = warp_reduce_sum(o);
    write_out(t, p.scale_output ? o * p.scale : o);
    if (p.intermediates == GdnIntermediates::kBuffer) {
      store_fp32_row<KJ>(p.inter_buffer + (((n * p.inter_steps + t) * p.H + h) * p.V + v) * K, s, K,
                         lane);
    } else if (p.intermediates == GdnIntermediates::kPool) {
      const int64_t slot = p.step_slots[n * p.T + t];
      if (slot >= 0 && slot < p.state_out.slots) {
        store_row<ST, KJ>(p.state_out, slot, h, v, s, K, lane);
      }
    }
    if (p.checkpoint_every > 0) {
      const int64_t prefix =
          p.checkpoint_prefix ? load_index(p.checkpoint_prefix, p.checkpoint_prefix_i64, n) : 0;
      const int64_t j = gdn::checkpoint_ordinal(prefix, t, p.checkpoint_every);
      // Row start + j (or the slot there), guarded without forming the sum (a start near
      // INT64_MAX must not wrap).
      const int64_t start =
          j >= 0 ? load_index(p.checkpoint_starts, p.checkpoint_starts_i64, n) : int64_t{-1};
      int64_t row = -1;
      if (p.checkpoint_slots) {
        if (start >= 0 && start < p.checkpoint_slot_count - j) {
          row = load_index(p.checkpoint_slots, p.checkpoint_slots_i64, start + j);
        }
      } else if (start >= 0 && start < p.checkpoint_rows - j) {
        row = start + j;
      }
      if (row >= 0 && row < p.checkpoint_rows) {
        store_fp32_row<KJ>(p.checkpoints + row * p.checkpoint_row_stride + (h * p.V + v) * K, s, K,
                           lane);
      }
    }
  }
  if (p.write_final && w >= 0 && p.state_out.data && p.intermediates != GdnIntermediates::kPool) {
    store_row<ST, KJ>(p.state_out, w, h, v, s, K, lane);
  }
}

template <class IO, class ST>
void launch_typed(const GdnParams& p, cudaStream_t stream, bool enable_pdl) {
  const int64_t vblocks = (p.V + kGdnWarps - 1) / kGdnWarps;
  const dim3 grid(static_cast<unsigned>(p.num_seqs * vblocks), static_cast<unsigned>(p.H));
  const dim3 block(kGdnWarps * 32);
  const int64_t kj = (p.K + 31) / 32;
  if (kj <= 1) {
    launch_kernel("gated_delta_rule", gdn_recurrent_kernel<IO, ST, 1>, grid, block, 0, stream,
                  enable_pdl, p);
  } else if (kj <= 2) {
    launch_kernel("gated_delta_rule", gdn_recurrent_kernel<IO, ST, 2>, grid, block, 0, stream,
                  enable_pdl, p);
  } else if (kj <= 4) {
    launch_kernel("gated_delta_rule", gdn_recurrent_kernel<IO, ST, 4>, grid, block, 0, stream,
                  enable_pdl, p);
  } else {
    launch_kernel("gated_delta_rule", gdn_recurrent_kernel<IO, ST, 8>, grid, block, 0, stream,
                  enable_pdl, p);
  }
}

// ---- the fused decode step's prologue (kernels/gdn_fused_params.h) ----

constexpr int kBaCols = 32, kBaSlices = 8;  // GEMV block: 32 columns x 8 slices of the hidden dim

__device__ __forceinline__ float bf16f(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}
__device__ __forceinline__ uint16_t f2bf16(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

// ba[b, j] = bf16(sum_i hidden[b, i] * w_ba[i, j]): lane = column (consecutive columns read
// consecutive addresses when w_ba is row-major), slice y sums i = y, y + 8, ...; the eight
// partials are added in slice order.
__global__ void __launch_bounds__(kBaCols* kBaSlices)
    gdn_fused_ba_kernel(const GdnFusedPrologueParams p) {
  pdl_wait();
  __shared__ float part[kBaSlices][kBaCols];
  const int64_t b = blockIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kBaCols + threadIdx.x;
  const uint16_t* x = p.hidden_states + b * p.hs_stride_b;
  float acc = 0.0f;
  if (j < p.n_ba) {
    const uint16_t* w = p.w_ba + j * p.w_stride_j;
    for (int64_t i = threadIdx.y; i < p.hidden; i += kBaSlices) {
      acc += bf16f(x[i]) * bf16f(w[i * p.w_stride_i]);
    }
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < p.n_ba) {
    float sum = part[0][threadIdx.x];
    FLASHINFER_UNROLL
    for (int y = 1; y < kBaSlices; ++y) sum += part[y][threadIdx.x];
    p.ba[b * p.n_ba + j] = f2bf16(sum);
  }
}

__device__ __forceinline__ bool slot_ok(const GdnFusedPrologueParams& p, int64_t slot) {
  return slot >= 0 && slot < p.pool;
}

// conv_out[b, c] from the pool's row as it is before the call (this kernel only reads it).
__global__ void __launch_bounds__(256) gdn_fused_conv_kernel(const GdnFusedPrologueParams p) {
  pdl_wait();
  const int64_t b = blockIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.qkv_dim) return;
  const int64_t slot = load_index(p.state_indices, p.indices_i64, b);
  if (!slot_ok(p, slot)) {
    p.conv_out[b * p.qkv_dim + c] = 0x7fc0;  // NaN: the recurrence writes NaN outputs
    return;
  }
  const int64_t S = p.width - 1;
  const uint16_t* st = p.conv_state + slot * p.cs_stride_p + c * p.cs_stride_c;
  const uint16_t* w = p.conv_weight + c * p.cw_stride_c;
  float y = 0.0f;
  for (int64_t t = 0; t < S; ++t) y += bf16f(st[t * p.cs_stride_t]) * bf16f(w[t * p.cw_stride_j]);
  y += bf16f(p.mixed_qkv[b * p.x_stride_b + c * p.x_stride_c]) * bf16f(w[S * p.cw_stride_j]);
  y += bf16f(p.conv_bias[c * p.cb_stride]);
  p.conv_out[b * p.qkv_dim + c] = f2bf16(gdn::conv_silu(y));
}

// The window write-back, after every read (stream order): each (slot, channel) is written by
// one thread only, that of the slot's last request, from the row as it was.
__global__ void __launch_bounds__(256) gdn_fused_window_kernel(const GdnFusedPrologueParams p) {
  pdl_wait();
  const int64_t b = blockIdx.y;
  const int64_t slot = load_index(p.state_indices, p.indices_i64, b);
  int later = 0;  // a later request shares the slot
  for (int64_t r = b + 1 + threadIdx.x; r < p.B; r += blockDim.x) {
    later |= load_index(p.state_indices, p.indices_i64, r) == slot ? 1 : 0;
  }
  if (__syncthreads_or(later) != 0 || !slot_ok(p, slot)) return;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.qkv_dim) return;
  const int64_t S = p.width - 1;
  uint16_t* st = p.conv_state + slot * p.cs_stride_p + c * p.cs_stride_c;
  for (int64_t t = 0; t + 1 < S; ++t) st[t * p.cs_stride_t] = st[(t + 1) * p.cs_stride_t];
  if (S > 0) st[(S - 1) * p.cs_stride_t] = p.mixed_qkv[b * p.x_stride_b + c * p.x_stride_c];
}

}  // namespace

void gdn_fused_decode_prologue(const GdnFusedPrologueParams& p, void* stream, bool enable_pdl) {
  if (p.B == 0) return;
  FLASHINFER_CHECK(p.B <= 65535, "gdn_fused_decode_step", "hidden_states",
                   "batch above 65535 (the kernels' grid rows)");
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.n_ba > 0) {
    const dim3 grid(static_cast<unsigned>((p.n_ba + kBaCols - 1) / kBaCols),
                    static_cast<unsigned>(p.B));
    launch_kernel("gdn_fused_decode_step", gdn_fused_ba_kernel, grid, dim3(kBaCols, kBaSlices), 0,
                  s, enable_pdl, p);
  }
  if (p.qkv_dim > 0) {
    const dim3 grid(static_cast<unsigned>((p.qkv_dim + 255) / 256), static_cast<unsigned>(p.B));
    launch_kernel("gdn_fused_decode_step", gdn_fused_conv_kernel, grid, dim3(256), 0, s, enable_pdl,
                  p);
    launch_kernel("gdn_fused_decode_step", gdn_fused_window_kernel, grid, dim3(256), 0, s,
                  enable_pdl, p);
  }
}

// chunk_gated_delta_rule's operand preparation (GdnPrefillPrepParams). The L2 norm: a warp per
// head row (rows of q, then of k), lane-strided sums reduced by shuffles (another order than the
// CPU's: agreement to fp32 rounding before the io rounding).
__global__ void gdn_prep_l2norm_kernel(const GdnPrefillPrepParams p) {
  pdl_wait();
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int64_t q_rows = p.T * p.Hq;
  if (row >= q_rows + p.T * p.Hk) return;
  const bool is_q = row < q_rows;
  const int64_t r = is_q ? row : row - q_rows;
  const int64_t heads = is_q ? p.Hq : p.Hk;
  const int64_t off = (r / heads) * (is_q ? p.q_stride_tok : p.k_stride_tok) +
                      (r % heads) * (is_q ? p.q_stride_head : p.k_stride_head);
  const void* in = is_q ? p.q : p.k;
  void* out = is_q ? p.q_out : p.k_out;
  float ss = 0.0f;
  for (int64_t i = lane; i < p.D; i += 32) {
    const float x = load_any(in, off + i, p.io_dtype);
    ss += x * x;
  }
  const float inv = gdn::l2_inv_norm(warp_reduce_sum(ss));
  for (int64_t i = lane; i < p.D; i += 32) {
    store_any(out, r * p.D + i, p.io_dtype, load_any(in, off + i, p.io_dtype) * inv);
  }
}

// The gate transforms: a thread per (token, head).
__global__ void gdn_prep_gates_kernel(const GdnPrefillPrepParams p) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.T * p.H) return;
  const int64_t t = i / p.H, h = i % p.H;
  if (p.g_mode != GdnGateMode::kNone) {
    const float g = load_any(p.g.data, t * p.g.stride_tok + h * p.g.stride_head, p.g.dtype);
    float a = g;
    if (p.g_mode == GdnGateMode::kLog) {
      a = expf(g);
    } else if (p.g_mode == GdnGateMode::kRaw) {
      a = gdn::prefill_raw_decay(g, load_any(p.dt_bias, h, p.dt_bias_dtype),
                                 load_any(p.A_log, h, p.A_log_dtype));
    }
    p.g_out[i] = a;
  }
  if (p.beta_mode != GdnBetaMode::kNone) {
    const float b =
        load_any(p.beta.data, t * p.beta.stride_tok + h * p.beta.stride_head, p.beta.dtype);
    p.beta_out[i] =
        p.beta_mode == GdnBetaMode::kLogit ? round_to_dtype(gdn::decode_beta(b), p.beta.dtype) : b;
  }
}

void gdn_prefill_prepare(const GdnPrefillPrepParams& p, void* stream, bool enable_pdl) {
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t rows = p.T * (p.Hq + p.Hk);
  if (p.l2norm && rows > 0 && p.D > 0) {
    constexpr int kWarps = 8;
    FLASHINFER_CHECK((rows + kWarps - 1) / kWarps <= 0x7fffffff, "chunk_gated_delta_rule", "q",
                     "too many rows to normalize: ", rows);
    launch_kernel("chunk_gated_delta_rule", gdn_prep_l2norm_kernel,
                  dim3(static_cast<unsigned>((rows + kWarps - 1) / kWarps)), dim3(32 * kWarps), 0,
                  s, enable_pdl, p);
  }
  const int64_t gates = p.T * p.H;
  if ((p.g_mode != GdnGateMode::kNone || p.beta_mode != GdnBetaMode::kNone) && gates > 0) {
    FLASHINFER_CHECK((gates + 255) / 256 <= 0x7fffffff, "chunk_gated_delta_rule", "g",
                     "too many gates: ", gates);
    launch_kernel("chunk_gated_delta_rule", gdn_prep_gates_kernel,
                  dim3(static_cast<unsigned>((gates + 255) / 256)), dim3(256), 0, s, enable_pdl, p);
  }
}

void gated_delta_rule(const GdnParams& p, void* stream, bool enable_pdl) {
  if (p.num_seqs == 0 || p.H == 0 || p.V == 0) return;
  if (gated_delta_rule_chunked(p, stream, enable_pdl)) return;
  const int64_t vblocks = (p.V + kGdnWarps - 1) / kGdnWarps;
  FLASHINFER_CHECK(p.num_seqs * vblocks <= 0x7fffffff && p.H <= 65535, "gated_delta_rule", "q",
                   "grid too large: ", p.num_seqs, " sequences x ", p.H, " heads");
  FLASHINFER_CHECK(p.K <= kGdnMaxHeadDimK, "gated_delta_rule", "k", "head dim ", p.K,
                   " above the CUDA kernel's ", kGdnMaxHeadDimK);
  const auto s = static_cast<cudaStream_t>(stream);
  const DType st = p.state_in.data ? p.state_in.dtype : p.state_out.dtype;
  const bool st_bf16 = (p.state_in.data || p.state_out.data) && st == DType::kBFloat16;
  if (p.io_dtype == DType::kFloat16) {
    if (st_bf16) {
      launch_typed<__half, __nv_bfloat16>(p, s, enable_pdl);
    } else {
      launch_typed<__half, float>(p, s, enable_pdl);
    }
  } else {
    if (st_bf16) {
      launch_typed<__nv_bfloat16, __nv_bfloat16>(p, s, enable_pdl);
    } else {
      launch_typed<__nv_bfloat16, float>(p, s, enable_pdl);
    }
  }
}

}  // namespace flashinfer::kernels::cuda
