#include <cstdint>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/kda_cuda.h"
#include "kernels/gdn_rules.h"
#include "kernels/kda_rules.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kKdaWarps = 4;  // state rows (v) of one (sequence, value head) per block

__device__ __forceinline__ float bf(const KdaIoRef& r, int64_t n, int64_t t, int64_t h, int64_t i) {
  return __bfloat162float(
      static_cast<const __nv_bfloat16*>(r.data)[n * r.seq + t * r.tok + h * r.head + i]);
}

template <class ST, int KJ>
__device__ __forceinline__ void load_row(const void* pool, int64_t stride_slot, int64_t slot,
                                         int64_t hv, int64_t v, int64_t K, int lane,
                                         float (&s)[KJ]) {
  const ST* row = static_cast<const ST*>(pool) + slot * stride_slot + (hv * K + v) * K;
  FLASHINFER_UNROLL
  for (int j = 0; j < KJ; ++j) s[j] = to_f32(row[j * 32 + lane]);
}

template <class ST, int KJ>
__device__ __forceinline__ void store_row(void* pool, int64_t stride_slot, int64_t slot, int64_t hv,
                                          int64_t v, int64_t K, int lane, const float (&s)[KJ]) {
  ST* row = static_cast<ST*>(pool) + slot * stride_slot + (hv * K + v) * K;
  FLASHINFER_UNROLL
  for (int j = 0; j < KJ; ++j) row[j * 32 + lane] = from_f32<ST>(s[j]);
}

template <class ST, int KJ>
__global__ void __launch_bounds__(kKdaWarps * 32) kda_recurrent_kernel(KdaParams p) {
  pdl_wait();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t K = p.K, vblocks = (K + kKdaWarps - 1) / kKdaWarps;
  const int64_t n = blockIdx.x / vblocks;
  const int64_t v = (blockIdx.x % vblocks) * kKdaWarps + warp;
  const int64_t hv = blockIdx.y;
  if (n >= p.num_seqs || v >= K) return;
  const int64_t h = gdn::source_head(hv, p.H, p.HV);
  int64_t begin = 0, len = p.T, seq = n;
  if (p.cu_seqlens) {
    auto cu = [&](int64_t i) {
      return p.cu_seqlens_i64 ? static_cast<const int64_t*>(p.cu_seqlens)[i]
                              : static_cast<int64_t>(static_cast<const int32_t*>(p.cu_seqlens)[i]);
    };
    begin = cu(n);
    const int64_t end = cu(n + 1);
    if (begin < 0 || end < begin || end > p.total_tokens) return;  // refused on the CPU path
    len = end - begin;
    if (p.spec || p.frozen) len = min(len, p.T);
    seq = 0;
  }
  if (len <= 0) return;
  auto out_at = [&](int64_t t) {
    return seq * p.out_seq + (begin + t) * p.out_tok + hv * p.out_head + v;
  };
  auto put = [&](int64_t t, float o) {
    if (lane == 0) static_cast<__nv_bfloat16*>(p.out)[out_at(t)] = __float2bfloat16_rn(o);
  };
  auto slot_at = [&](int64_t col) -> int64_t {
    if (!p.idx) return n;
    int64_t s = p.idx[n * p.idx_stride0 + col];
    if (s < 0 && p.wrap_negative) s += p.slots;
    return s;
  };
  float S[KJ];
  FLASHINFER_UNROLL
  for (int j = 0; j < KJ; ++j) S[j] = 0.0f;
  int64_t final_slot = -1;
  auto read_from = [&](bool from_source, int64_t slot) {
    slot = max(slot, int64_t{0});
    const int64_t bound = from_source ? p.source_slots : p.slots;
    if (slot >= bound) return;  // outside the pool: zeros (the CPU path refuses it)
    if (from_source) {
      load_row<ST, KJ>(p.source, p.source_stride_slot, slot, hv, v, K, lane, S);
    } else {
      load_row<ST, KJ>(p.state, p.state_stride_slot, slot, hv, v, K, lane, S);
    }
  };
  if (p.spec) {
    if (p.source) {
      read_from(true, p.src_idx[n]);
    } else {
      int64_t c = p.num_accepted ? p.num_accepted[n] - 1 : 0;
      c = min(max(c, int64_t{0}), p.T - 1);
      read_from(false, slot_at(c));
    }
  } else {
    final_slot = slot_at(0);
    if (final_slot < 0) {  // padding: zero outputs, nothing stored
      for (int64_t t = 0; t < len; ++t) put(t, 0.0f);
      return;
    }
    if (p.frozen) {                       // the committed state, read only
      if (final_slot >= p.slots) return;  // refused on the CPU path
      read_from(false, final_slot);
    } else if (p.source) {
      read_from(true, p.src_idx[n]);
    } else if (p.state) {
      read_from(false, final_slot);
    }
  }
  const float a_log = p.A_log ? p.A_log[h] : 0.0f;
  for (int64_t t = 0; t < len; ++t) {
    const int64_t tok = begin + t;
    if (p.checkpoint_every > 0 && !p.checkpoint_idx && t % p.checkpoint_every == 0) {
      const int64_t row = p.checkpoint_starts[n] + t / p.checkpoint_every;
      if (row >= 0 && row < p.checkpoint_rows) {
        store_row<ST, KJ>(p.checkpoints, p.HV * K * K, row, hv, v, K, lane, S);
      }
    }
    int64_t w = -1;
    if (p.spec) {
      w = slot_at(t);
      if (w < 0) {  // an inactive token: zero output, S unchanged
        put(t, 0.0f);
        continue;
      }
    }
    if (p.kg && v == 0) {  // the raw key and gate bits (frozen verify), by the row-0 warp
      const auto* kr =
          static_cast<const uint16_t*>(p.k.data) + seq * p.k.seq + tok * p.k.tok + h * p.k.head;
      const auto* gr =
          static_cast<const uint16_t*>(p.g.data) + seq * p.g.seq + tok * p.g.tok + hv * p.g.head;
      uint16_t* row = p.kg + final_slot * p.kg_slot + hv * p.kg_head + t * p.kg_tok;
      for (int64_t i = lane; i < K; i += 32) {
        row[i] = kr[i];
        row[K + i] = gr[i];
      }
    }
    float q[KJ], kk[KJ], dk[KJ], sq = 0.0f, sk = 0.0f;
    FLASHINFER_UNROLL
    for (int j = 0; j < KJ; ++j) {
      const int64_t i = j * 32 + lane;
      q[j] = bf(p.q, seq, tok, h, i);
      kk[j] = bf(p.k, seq, tok, h, i);
      sq += q[j] * q[j];
      sk += kk[j] * kk[j];
      const float bias = p.dt_bias ? p.dt_bias[h * K + i] : 0.0f;
      dk[j] = kda::decay(p.gate, bf(p.g, seq, tok, hv, i), a_log, bias, p.lower_bound);
    }
    const float qn = p.l2norm ? gdn::l2_inv_norm(warp_reduce_sum(sq)) : 1.0f;
    const float kn = p.l2norm ? gdn::l2_inv_norm(warp_reduce_sum(sk)) : 1.0f;
    float pred = 0.0f;
    FLASHINFER_UNROLL
    for (int j = 0; j < KJ; ++j) {
      q[j] = q[j] * p.scale * qn;
      kk[j] *= kn;
      S[j] *= dk[j];
      pred += S[j] * kk[j];
    }
    float beta = bf(p.beta, seq, tok, hv, 0);
    if (p.beta_is_logit) beta = kda::sigmoid(beta);
    const float u = beta * (bf(p.v, seq, tok, hv, v) - warp_reduce_sum(pred));
    if (p.corr && lane == 0) {
      p.corr[final_slot * p.corr_slot + hv * p.corr_head + t * p.corr_tok + v] = u;
    }
    float o = 0.0f;
    FLASHINFER_UNROLL
    for (int j = 0; j < KJ; ++j) {
      S[j] += kk[j] * u;
      o += S[j] * q[j];
    }
    put(t, warp_reduce_sum(o));
    if (p.checkpoint_idx && (t + 1) % p.checkpoint_every == 0) {  // a completed boundary
      const int64_t r = p.checkpoint_idx[p.checkpoint_starts[n] + (t + 1) / p.checkpoint_every - 1];
      if (r >= 0 && r < p.checkpoint_rows) {
        store_row<ST, KJ>(p.checkpoints, p.HV * K * K, r, hv, v, K, lane, S);
      }
    }
    if (p.spec && p.state && w < p.slots) {
      store_row<ST, KJ>(p.state, p.state_stride_slot, w, hv, v, K, lane, S);
    }
  }
  if (!p.spec && !p.frozen && p.state && final_slot < p.slots) {
    store_row<ST, KJ>(p.state, p.state_stride_slot, final_slot, hv, v, K, lane, S);
  }
}

constexpr int kFusedThreads = 128;  // one thread a channel of the head (head dim 128)

// fused_kda_decode: a block per (row, head). The conv of the head's 3 x 128 channels (a thread
// per channel of each of q, k, v) into shared memory, then each warp runs a quarter of the
// state rows with the row's 128 values in registers (4 a lane), then the gated RMSNorm over the
// 128 outputs.
template <class ST>
__global__ void __launch_bounds__(kFusedThreads) fused_kda_kernel(FusedKdaParams p) {
  pdl_wait();
  constexpr int D = 128, KJ = 4;
  __shared__ float sm[3 * D];
  __shared__ float so[D];
  __shared__ float red[32];
  const int64_t r = blockIdx.x, h = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  auto* out = static_cast<__nv_bfloat16*>(p.out) + (r * p.H + h) * D;
  const int64_t s = p.idx[r];
  if (s <= 0 || s >= p.slots) {  // a null row (a slot past the pool: refused on the CPU path)
    out[tid] = __float2bfloat16_rn(0.0f);
    return;
  }
  const auto* x = static_cast<const __nv_bfloat16*>(p.x) + r * p.x_row;
  auto* cs = static_cast<__nv_bfloat16*>(p.conv_state) + s * p.cs_slot;
  for (int which = 0; which < 3; ++which) {
    const int64_t c = which * p.H * D + h * D + tid;
    const float* w = p.weight + which * 4 * p.H * D + h * D + tid;
    __nv_bfloat16* hist = cs + c * p.cs_chan;
    const __nv_bfloat16 h1 = hist[p.cs_hist], h2 = hist[2 * p.cs_hist], xv = x[c];
    const float m =
        kda::conv_silu(__bfloat162float(hist[0]), __bfloat162float(h1), __bfloat162float(h2),
                       __bfloat162float(xv), w[0], w[p.H * D], w[2 * p.H * D], w[3 * p.H * D]);
    sm[which * D + tid] = __bfloat162float(__float2bfloat16_rn(m));
    hist[0] = h1;
    hist[p.cs_hist] = h2;
    hist[2 * p.cs_hist] = xv;
  }
  __syncthreads();
  float q[KJ], k[KJ], dk[KJ], sq = 0.0f, sk = 0.0f;
  const auto* gate = static_cast<const __nv_bfloat16*>(p.raw_gate) + (r * p.H + h) * D;
  const float a_log = p.A_log[h];
  FLASHINFER_UNROLL
  for (int j = 0; j < KJ; ++j) {
    const int i = j * 32 + lane;
    q[j] = sm[i];
    k[j] = sm[D + i];
    sq += q[j] * q[j];
    sk += k[j] * k[j];
    dk[j] = kda::decay(p.has_lower_bound ? KdaGate::kLowerBound : KdaGate::kSoftplus,
                       __bfloat162float(gate[i]), a_log, p.dt_bias[h * D + i], p.lower_bound);
  }
  const float qn = gdn::l2_inv_norm(warp_reduce_sum(sq)) * (1.0f / sqrtf(static_cast<float>(D)));
  const float kn = gdn::l2_inv_norm(warp_reduce_sum(sk));
  FLASHINFER_UNROLL
  for (int j = 0; j < KJ; ++j) q[j] *= qn, k[j] *= kn;
  const float beta = kda::sigmoid(
      __bfloat162float(static_cast<const __nv_bfloat16*>(p.raw_beta)[r * p.b_row + h * p.b_head]));
  for (int v = warp; v < D; v += kFusedThreads / 32) {
    ST* row = static_cast<ST*>(p.state) + s * p.state_slot + (h * D + v) * D;
    float S[KJ], pred = 0.0f;
    FLASHINFER_UNROLL
    for (int j = 0; j < KJ; ++j) {
      S[j] = to_f32(row[j * 32 + lane]) * dk[j];
      pred += S[j] * k[j];
    }
    const float u = beta * (sm[2 * D + v] - warp_reduce_sum(pred));
    float o = 0.0f;
    FLASHINFER_UNROLL
    for (int j = 0; j < KJ; ++j) {
      S[j] += k[j] * u;
      o += S[j] * q[j];
      row[j * 32 + lane] = from_f32<ST>(S[j]);
    }
    o = warp_reduce_sum(o);
    if (lane == 0) so[v] = __bfloat162float(__float2bfloat16_rn(o));
  }
  __syncthreads();
  const float ov = so[tid];
  const float ss = block_reduce_sum(ov * ov, red);
  const float rstd = 1.0f / sqrtf(ss / static_cast<float>(D) + p.norm_eps);
  const float og =
      __bfloat162float(static_cast<const __nv_bfloat16*>(p.out_gate)[r * p.og_row + h * D + tid]);
  out[tid] = __float2bfloat16_rn(ov * rstd * p.norm_weight[tid] * kda::sigmoid(og));
}

}  // namespace

void fused_kda_decode(const FusedKdaParams& p, void* stream, bool enable_pdl) {
  if (p.R == 0 || p.H == 0) return;
  FLASHINFER_CHECK(p.R <= 0x7fffffff && p.H <= 65535, "fused_kda_decode", "x",
                   "grid too large: ", p.R, " rows x ", p.H, " heads");
  const dim3 grid(static_cast<unsigned>(p.R), static_cast<unsigned>(p.H));
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.state_dtype == DType::kBFloat16) {
    launch_kernel("fused_kda_decode", fused_kda_kernel<__nv_bfloat16>, grid, dim3(kFusedThreads), 0,
                  s, enable_pdl, p);
  } else {
    launch_kernel("fused_kda_decode", fused_kda_kernel<float>, grid, dim3(kFusedThreads), 0, s,
                  enable_pdl, p);
  }
}

void recurrent_kda(const KdaParams& p, void* stream, bool enable_pdl) {
  if (p.num_seqs == 0 || p.HV == 0) return;
  FLASHINFER_CHECK(p.K == 64 || p.K == 128, "recurrent_kda", "q", "HEAD_DIM must be 64 or 128");
  // The kernel is instantiated for bf16 pools (what the API admits); another dtype would be read
  // as bf16 bits.
  FLASHINFER_CHECK(p.state_dtype == DType::kBFloat16, "recurrent_kda", "initial_state",
                   "must be bfloat16 on CUDA, got ", dtype_torch_name(p.state_dtype));
  const int64_t vblocks = (p.K + kKdaWarps - 1) / kKdaWarps;
  FLASHINFER_CHECK(p.num_seqs * vblocks <= 0x7fffffff && p.HV <= 65535, "recurrent_kda", "q",
                   "grid too large: ", p.num_seqs, " sequences x ", p.HV, " heads");
  const dim3 grid(static_cast<unsigned>(p.num_seqs * vblocks), static_cast<unsigned>(p.HV));
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.K == 64) {
    launch_kernel("recurrent_kda", kda_recurrent_kernel<__nv_bfloat16, 2>, grid,
                  dim3(kKdaWarps * 32), 0, s, enable_pdl, p);
  } else {
    launch_kernel("recurrent_kda", kda_recurrent_kernel<__nv_bfloat16, 4>, grid,
                  dim3(kKdaWarps * 32), 0, s, enable_pdl, p);
  }
}

}  // namespace flashinfer::kernels::cuda
