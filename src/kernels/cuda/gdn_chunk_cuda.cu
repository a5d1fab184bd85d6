// chunk_gated_delta_rule's prefill in upstream's chunked (WY) form on tensor cores
// (docs/upstream-facts/gdn_chunked_prefill.md; docs/LINEAR_ATTENTION.md, "The chunked prefill
// kernel"). A block walks the 64-token chunks of one (sequence, state head, 64 state rows) with
// the state in fp32 registers; per chunk, every product on mma.sync m16n8k16 with fp32
// accumulation:
//   KK = K K^T, QK = Q K^T                 -> L (strictly lower, beta and decays), M' (causal)
//   X = (I + L)^-1 in fp32 (16 x 16 diagonal blocks by substitution, then the block merges)
//   T = X diag(beta);  R = V^T - (S K^T) diag(gamma);  U^T = R T^T
//   O^T = scale (S Q^T) diag(gamma) + U^T M'^T
//   S = gamma_C S + (U^T diag(Gamma_{C, .})) K
// Operands are rounded to the io dtype where they enter an MMA (S, R, U, T, M', as upstream's
// kernels do); L, X and the state's accumulator stay fp32. The arithmetic shared with the CPU
// checks is in kernels/gdn_chunk_rules.h, the fragment addressing in gdn_chunk_shape.h.
#include <atomic>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/device/cp_async.cuh"
#include "kernels/cuda/device/mma.cuh"
#include "kernels/cuda/gdn_chunk_shape.h"
#include "kernels/cuda/gdn_cuda.h"
#include "kernels/gdn_chunk_rules.h"
#include "kernels/gdn_rules.h"

namespace flashinfer::kernels::cuda {
namespace {

namespace gc = kernels::gdn_chunk;
namespace gs = gdn_chunk;
namespace mma = dev::mma;
namespace cpa = dev::cp_async;

std::atomic<uint64_t> g_chunked_launches{0};

__device__ __forceinline__ int64_t chunk_index(const void* p, bool i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

template <class IO>
__device__ __forceinline__ float lo_f32(uint32_t r) {
  if constexpr (::cuda::std::is_same_v<IO, __half>) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(r & 0xffffu)));
  } else {
    return __uint_as_float(r << 16);
  }
}
template <class IO>
__device__ __forceinline__ float hi_f32(uint32_t r) {
  if constexpr (::cuda::std::is_same_v<IO, __half>) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(r >> 16)));
  } else {
    return __uint_as_float(r & 0xffff0000u);
  }
}

/// The A operand of k-step ks from a warp's fp32 accumulator tiles (the state, U^T): rounded to
/// the io dtype, pairs as gdn_chunk_shape.h's a_from_acc_* say.
template <class IO, int N>
__device__ __forceinline__ void acc_to_a(const float (&c)[N][4], int ks, uint32_t (&a)[4]) {
  FLASHINFER_UNROLL
  for (int i = 0; i < 4; ++i) {
    const int nt = gs::a_from_acc_tile(ks, i), e0 = gs::a_from_acc_elem(i);
    a[i] = mma::pack2<IO>(c[nt][e0], c[nt][e0 + 1]);
  }
}

/// c[2p], c[2p + 1] += a * B for the 16 columns n0.. of B stored [n][k] (row stride ld
/// elements) at k-step ks.
template <class IO, int N>
__device__ __forceinline__ void mma_b_rows(float (&c)[N][4], const uint32_t (&a)[4], uint32_t base,
                                           int ld, int n0, int ks, int p, int lane) {
  uint32_t b[4];
  mma::ldmatrix_x4(b, base + 2u * ((n0 + gs::b_row(lane)) * ld + 16 * ks + gs::b_col(lane)));
  mma::mma_m16n8k16<IO>(c[2 * p], a, b);
  mma::mma_m16n8k16<IO>(c[2 * p + 1], a, b + 2);
}

/// c (this warp's 16 state rows x the chunk's 64 tokens) = S X^T for X the 64 rows of the tile at
/// `base` (stored [token][k], row stride ld): the state as A operands (rounded to the io dtype),
/// KS k-steps of 16. P = S K^T and S Q^T.
template <class IO, int KS, int NT>
__device__ __forceinline__ void state_times_rows(float (&c)[8][4], const float (&s)[NT][4],
                                                 uint32_t base, int ld, int lane) {
  FLASHINFER_UNROLL
  for (int ks = 0; ks < KS; ++ks) {
    uint32_t a[4];
    acc_to_a<IO>(s, ks, a);
    FLASHINFER_UNROLL
    for (int pp = 0; pp < 4; ++pp) mma_b_rows<IO>(c, a, base, ld, 16 * pp, ks, pp, lane);
  }
}

template <class IO, int KD, int kStages>
__global__ void __launch_bounds__(gs::kThreads, 1) gdn_chunked_prefill_kernel(const GdnParams p) {
  pdl_wait();
  constexpr gs::Layout kL = gs::layout(KD, kStages);
  constexpr int kQld = gs::io_ld(KD), kSld = gs::io_ld(gc::kChunk), kFld = gs::kFloatLd;
  constexpr int kSlices = KD / gs::kSlice, kKs = KD / 16, kNt = KD / 8;
  // The 16-byte shared-memory accesses: every region and fp32 row a multiple of 16 bytes.
  static_assert(kL.w % 16 == 0 && kL.x % 16 == 0 && kL.l % 16 == 0 && kL.v % 16 == 0 &&
                kL.stage % 16 == 0 && kL.alpha_raw % 16 == 0 && kL.beta_raw % 16 == 0 &&
                gs::kFloatLd % 4 == 0 && (kQld * 2) % 16 == 0 && (kSld * 2) % 16 == 0);
  extern __shared__ __align__(16) unsigned char smem[];
  IO* const Qs = reinterpret_cast<IO*>(smem + kL.q);
  IO* const Ks = reinterpret_cast<IO*>(smem + kL.k);
  IO* const Vs = reinterpret_cast<IO*>(smem + kL.v);
  IO* const Ms = reinterpret_cast<IO*>(smem + kL.m);
  IO* const Ts = reinterpret_cast<IO*>(smem + kL.t);
  float* const Lf = reinterpret_cast<float*>(smem + kL.l);
  float* const Xf = reinterpret_cast<float*>(smem + kL.x);
  float* const Wf = reinterpret_cast<float*>(smem + kL.w);
  float* const Gs = reinterpret_cast<float*>(smem + kL.g);
  int* const Cs = reinterpret_cast<int*>(smem + kL.counts);
  float* const Bs = reinterpret_cast<float*>(smem + kL.beta);
  float* const Gm = reinterpret_cast<float*>(smem + kL.gamma);
  float* const Tail = reinterpret_cast<float*>(smem + kL.tail);
  const uint32_t q_base = cpa::smem_addr(Qs), k_base = cpa::smem_addr(Ks);
  const uint32_t v_base = cpa::smem_addr(Vs), m_base = cpa::smem_addr(Ms);
  const uint32_t t_base = cpa::smem_addr(Ts);
  const uint32_t raw_base = cpa::smem_addr(smem + kL.alpha_raw);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t slice = blockIdx.x % kSlices;
  const int64_t h = (blockIdx.x / kSlices) % p.H;
  const int64_t n = blockIdx.x / kSlices / p.H;
  if (n >= p.num_seqs) return;
  const int64_t begin = chunk_index(p.cu_seqlens, p.cu_seqlens_i64, n);
  const int64_t end = chunk_index(p.cu_seqlens, p.cu_seqlens_i64, n + 1);
  if (begin < 0 || end < begin || end > p.total_tokens) return;  // the CPU path refuses these
  const int64_t len = end - begin;
  IO* const out = static_cast<IO*>(p.out) + h * p.out_stride_head + slice * gs::kSlice;

  // Slots as the recurrent kernel's prefill path: a negative read slot, or one outside the pool
  // read or (written back to the same slot: write_idx null or the read_idx tensor itself, as
  // state_indices pass it) outside the pool written, writes NaN outputs and no state (the CPU
  // refuses both on the host).
  // A negative read slot with kZeroState (upstream 0.7.4's output_state_indices) starts from
  // zeros instead.
  int64_t r = p.read_idx ? chunk_index(p.read_idx, p.read_idx_i64, n) : n;
  const bool writes_read_slot = p.write_idx == nullptr || p.write_idx == p.read_idx;
  const bool zero_start = r < 0 && p.negative_read == GdnNegativeRead::kZeroState;
  if ((r < 0 && !zero_start) ||
      (p.read_idx && r >= 0 &&
       ((p.state_in.data && r >= p.state_in.slots) ||
        (writes_read_slot && p.state_out.data && r >= p.state_out.slots)))) {
    const IO nan = from_f32<IO>(__int_as_float(0x7fc00000));
    for (int64_t i = tid; i < len * gs::kSlice; i += gs::kThreads) {
      out[(begin + i / gs::kSlice) * p.out_stride_tok + i % gs::kSlice] = nan;
    }
    return;
  }
  if (len <= 0) return;

  const int64_t v_row0 = slice * gs::kSlice + 16 * warp;  // this warp's first state row
  // The state rows v_row0 + acc_row, columns acc_col of n-tile nt, in fp32.
  float s[kNt][4];
  FLASHINFER_UNROLL
  for (int nt = 0; nt < kNt; ++nt) {
    FLASHINFER_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int64_t v = v_row0 + gs::acc_row(lane, e), k = 8 * nt + gs::acc_col(lane, e);
      s[nt][e] = 0.0f;
      if (p.state_in.data && !zero_start) {
        s[nt][e] = static_cast<const float*>(
            p.state_in.data)[r * p.state_in.stride_slot + h * p.state_in.stride_head +
                             k * p.state_in.stride_k + v * p.state_in.stride_v];
      }
    }
  }
  const int64_t qh = gdn::source_head(h, p.Hq, p.H), kh = gdn::source_head(h, p.Hk, p.H);
  const int64_t vh = gdn::source_head(h, p.Hv, p.H);
  const IO* const qg = static_cast<const IO*>(p.q) + qh * p.q_stride_head;
  const IO* const kg = static_cast<const IO*>(p.k) + kh * p.k_stride_head;
  const IO* const vg = static_cast<const IO*>(p.v) + vh * p.v_stride_head + slice * gs::kSlice;
  const float* const gate_g = static_cast<const float*>(p.g.data);
  const float* const gate_b = static_cast<const float*>(p.beta.data);

  // The copies of the chunk from token c0 of the sequence into copy stage `st`: its Q, K rows and
  // V slice (rows past the sequence zero-filled) and its raw gates. A thread copies one 16-byte
  // unit column, stepping a source pointer a tensor down the rows (per-row addresses
  // precomputed for every step cost the state's registers: ptxas spilled); a row past the
  // sequence reads nothing, the head's base standing in as its source. (In a sequence's last
  // chunk the pointers step past the tensor's end without being read there.)
  auto issue = [&](int64_t c0, int st) {
    const int C = static_cast<int>(len - c0 < gc::kChunk ? len - c0 : gc::kChunk);
    const int64_t tok0 = begin + c0;
    const uint32_t so = static_cast<uint32_t>(st) * kL.stage;
    constexpr int kUnits = KD / 8, kStep = gs::kThreads / kUnits;
    static_assert(gs::kThreads % kUnits == 0 && gc::kChunk % kStep == 0);
    const int u = tid % kUnits, t0 = tid / kUnits;
    const IO* qs = qg + (tok0 + t0) * p.q_stride_tok + 8 * u;
    const IO* ks = kg + (tok0 + t0) * p.k_stride_tok + 8 * u;
    FLASHINFER_UNROLL
    for (int t = t0; t < gc::kChunk; t += kStep) {
      const bool ok = t < C;
      const uint32_t off = so + 2u * (t * kQld + 8 * u);
      cpa::copy16_zfill(q_base + off, ok ? qs : qg, ok);
      cpa::copy16_zfill(k_base + off, ok ? ks : kg, ok);
      qs += kStep * p.q_stride_tok;
      ks += kStep * p.k_stride_tok;
    }
    constexpr int kVUnits = gs::kSlice / 8, kVStep = gs::kThreads / kVUnits;
    static_assert(gs::kThreads % kVUnits == 0 && gc::kChunk % kVStep == 0);
    const int vu = tid % kVUnits, vt0 = tid / kVUnits;
    const IO* vs = vg + (tok0 + vt0) * p.v_stride_tok + 8 * vu;
    FLASHINFER_UNROLL
    for (int t = vt0; t < gc::kChunk; t += kVStep) {
      const bool ok = t < C;
      cpa::copy16_zfill(v_base + so + 2u * (t * kSld + 8 * vu), ok ? vs : vg, ok);
      vs += kVStep * p.v_stride_tok;
    }
    // Raw gates: threads 0..63 alpha, 64..127 beta of token tid % 64 (absent tensors and tokens
    // past the sequence read nothing; the scan below substitutes for them).
    static_assert(gs::kThreads == 2 * gc::kChunk);
    const int gt = tid % gc::kChunk;
    const bool is_alpha = tid < gc::kChunk;
    const float* gp = is_alpha ? gate_g : gate_b;
    const bool gok = gp != nullptr && gt < C;
    const int64_t goff = is_alpha ? (tok0 + gt) * p.g.stride_tok + h * p.g.stride_head
                                  : (tok0 + gt) * p.beta.stride_tok + h * p.beta.stride_head;
    cpa::copy4_zfill(raw_base + so + (is_alpha ? 0u : kL.beta_raw - kL.alpha_raw) + 4u * gt,
                     gok ? static_cast<const void*>(gp + goff) : static_cast<const void*>(qg), gok);
  };

  int st = 0;  // the copy stage of the chunk at c0
  if constexpr (kStages == 2) {
    issue(0, 0);
    cpa::commit();
  }
  for (int64_t c0 = 0; c0 < len; c0 += gc::kChunk, st ^= kStages - 1) {
    const int C = static_cast<int>(len - c0 < gc::kChunk ? len - c0 : gc::kChunk);
    const int64_t tok0 = begin + c0;
    if constexpr (kStages == 2) {
      // The next chunk's copies into the other stage (its last reader, the chunk before this
      // one, passed the barrier that ends its iteration), then this chunk's: at most the next
      // chunk's group left in flight. The last chunk commits an empty group.
      if (c0 + gc::kChunk < len) issue(c0 + gc::kChunk, st ^ 1);
      cpa::commit();
      cpa::wait<1>();
    } else {
      issue(c0, 0);
      cpa::commit();
      cpa::wait<0>();
    }
    __syncthreads();
    const uint32_t so = static_cast<uint32_t>(st) * kL.stage;
    const uint32_t qb = q_base + so, kb = k_base + so, vb = v_base + so;
    IO* const Vst = Vs + so / 2;
    // Gates (warp 0): the inclusive sums of log|alpha| and the zero / negative counts, by two
    // warp scans of 32 tokens; past C, alpha 1 and beta 0 (those tokens change nothing).
    if (warp == 0) {
      const float* const ar = reinterpret_cast<const float*>(smem + kL.alpha_raw + so);
      const float* const br = reinterpret_cast<const float*>(smem + kL.beta_raw + so);
      float lg[2], be[2];
      int cn[2];
      FLASHINFER_UNROLL
      for (int half = 0; half < 2; ++half) {
        const int t = lane + 32 * half;
        float alpha = 1.0f, beta = 0.0f;
        if (t < C) {
          alpha = gate_g ? ar[t] : 1.0f;
          beta = gate_b ? br[t] : 1.0f;
        }
        const gc::GateTerm<float> term = gc::gate_term(alpha);
        lg[half] = term.log_abs;
        cn[half] = term.counts;
        be[half] = beta;
        FLASHINFER_UNROLL
        for (int off = 1; off < 32; off <<= 1) {
          const float x = __shfl_up_sync(0xffffffffu, lg[half], off);
          const int y = __shfl_up_sync(0xffffffffu, cn[half], off);
          if (lane >= off) lg[half] += x, cn[half] += y;
        }
      }
      lg[1] += __shfl_sync(0xffffffffu, lg[0], 31);
      cn[1] += __shfl_sync(0xffffffffu, cn[0], 31);
      // Token C - 1's sums, from the lane and half that hold them (token 63's add the same
      // values in another order: its last bit may differ).
      const int last = C - 1;
      const float g_last = __shfl_sync(0xffffffffu, last < 32 ? lg[0] : lg[1], last & 31);
      const int c_last = __shfl_sync(0xffffffffu, last < 32 ? cn[0] : cn[1], last & 31);
      FLASHINFER_UNROLL
      for (int half = 0; half < 2; ++half) {
        const int t = lane + 32 * half;
        Gs[t] = lg[half];
        Cs[t] = cn[half];
        Bs[t] = be[half];
        Gm[t] = gc::decay_ratio(lg[half], cn[half], 0.0f, 0);
        Tail[t] = t < C ? gc::decay_ratio(g_last, c_last, lg[half], cn[half]) : 0.0f;
      }
    }
    __syncthreads();

    // KK = K K^T, then QK = Q K^T (one at a time: 32 accumulators, not 64, next to the state),
    // rows 16 warp.. of each; L in fp32, M' in the io dtype.
    FLASHINFER_UNROLL
    for (int which = 0; which < 2; ++which) {
      float acc[8][4] = {};
      FLASHINFER_UNROLL
      for (int ks = 0; ks < kKs; ++ks) {
        uint32_t a[4];
        mma::ldmatrix_x4(a, (which == 0 ? kb : qb) + 2u * ((16 * warp + gs::a_row(lane)) * kQld +
                                                           16 * ks + gs::a_col(lane)));
        FLASHINFER_UNROLL
        for (int pp = 0; pp < 4; ++pp) mma_b_rows<IO>(acc, a, kb, kQld, 16 * pp, ks, pp, lane);
      }
      FLASHINFER_UNROLL
      for (int nt = 0; nt < 8; ++nt) {
        FLASHINFER_UNROLL
        for (int hv = 0; hv < 2; ++hv) {
          const int sr = 16 * warp + gs::acc_row(lane, 2 * hv);
          const int t0 = 8 * nt + gs::acc_col(lane, 0);
          float ratio[2];
          FLASHINFER_UNROLL
          for (int e = 0; e < 2; ++e) {
            const int t = t0 + e;
            ratio[e] = sr >= t ? gc::decay_ratio(Gs[sr], Cs[sr], Gs[t], Cs[t]) : 0.0f;
          }
          float x[2];
          FLASHINFER_UNROLL
          for (int e = 0; e < 2; ++e) {
            const int t = t0 + e;
            x[e] = which == 0 ? gc::kkt_entry(sr, t, C, Bs[sr], ratio[e], acc[nt][2 * hv + e])
                              : gc::qkt_entry(sr, t, C, p.scale, ratio[e], acc[nt][2 * hv + e]);
          }
          if (which == 0) {
            *reinterpret_cast<float2*>(Lf + sr * kFld + t0) = make_float2(x[0], x[1]);
          } else {
            *reinterpret_cast<uint32_t*>(Ms + sr * kSld + t0) = mma::pack2<IO>(x[0], x[1]);
          }
        }
      }
    }
    __syncthreads();

    // X = (I + L)^-1: the diagonal blocks (a thread a column), then the merges by distance.
    if (tid < gc::kChunk) {
      const int b = tid / gc::kSub, cc = tid % gc::kSub;
      float x[gc::kSub];
      gc::inverse_block_column(Lf, kFld, b, cc, x);
      FLASHINFER_UNROLL
      for (int i = 0; i < gc::kSub; ++i) Xf[(gc::kSub * b + i) * kFld + gc::kSub * b + cc] = x[i];
    }
    __syncthreads();
    for (int d = 1; d < gc::kSubs; ++d) {
      // A thread a quad (row rr, columns c0..c0 + 3): its lanes read 8 rows of L and one
      // 16-byte piece of X a step, broadcast to the rows.
      const int quads = gc::merge_blocks(d) * 64;
      for (int e = tid; e < quads; e += gs::kThreads) {
        const int j = e / 64, rr = (e / 4) % 16, c0 = 4 * (e % 4);
        float w4[4];
        gc::merge_sum4(Lf, Xf, kFld, j + d, j, rr, c0, w4);
        *reinterpret_cast<float4*>(Wf + j * 256 + rr * 16 + c0) =
            make_float4(w4[0], w4[1], w4[2], w4[3]);
      }
      __syncthreads();
      for (int e = tid; e < quads; e += gs::kThreads) {
        const int j = e / 64, rr = (e / 4) % 16, c0 = 4 * (e % 4), i = j + d;
        float x4[4];
        gc::merge_block4(Xf, kFld, Wf + j * 256, i, rr, c0, x4);
        *reinterpret_cast<float4*>(Xf + (gc::kSub * i + rr) * kFld + gc::kSub * j + c0) =
            make_float4(x4[0], x4[1], x4[2], x4[3]);
      }
      __syncthreads();
    }
    // T = X diag(beta), lower triangle (the blocks above the diagonal are never written).
    for (int e = tid; e < gc::kChunk * gc::kChunk / 2; e += gs::kThreads) {
      const int sr = e / (gc::kChunk / 2), t = 2 * (e % (gc::kChunk / 2));
      const float x0 = sr >= t ? Xf[sr * kFld + t] * Bs[t] : 0.0f;
      const float x1 = sr >= t + 1 ? Xf[sr * kFld + t + 1] * Bs[t + 1] : 0.0f;
      *reinterpret_cast<uint32_t*>(Ts + sr * kSld + t) = mma::pack2<IO>(x0, x1);
    }
    __syncthreads();

    // This warp's state rows. P = S K^T, then R = V^T - P diag(gamma) as A operands (k = t).
    uint32_t ra[4][4];
    {
      float pa[8][4] = {};
      state_times_rows<IO, kKs>(pa, s, kb, kQld, lane);
      FLASHINFER_UNROLL
      for (int kt = 0; kt < 4; ++kt) {
        uint32_t vf[4];
        mma::ldmatrix_x4_trans(
            vf, vb + 2u * ((16 * kt + gs::at_row(lane)) * kSld + 16 * warp + gs::at_col(lane)));
        FLASHINFER_UNROLL
        for (int i = 0; i < 4; ++i) {
          const int nt = gs::a_from_acc_tile(kt, i), e0 = gs::a_from_acc_elem(i);
          const int t = 8 * nt + gs::acc_col(lane, 0);
          ra[kt][i] = mma::pack2<IO>(lo_f32<IO>(vf[i]) - Gm[t] * pa[nt][e0],
                                     hi_f32<IO>(vf[i]) - Gm[t + 1] * pa[nt][e0 + 1]);
        }
      }
    }
    // U^T = R T^T (n = the token of U), as A operands: plain (the output) and decayed to the
    // chunk's end (the state update; tokens past C selected to 0).
    uint32_t uo[4][4], us[4][4];
    {
      float ua[8][4] = {};
      FLASHINFER_UNROLL
      for (int kt = 0; kt < 4; ++kt) {
        FLASHINFER_UNROLL
        for (int pp = 0; pp < 4; ++pp)
          mma_b_rows<IO>(ua, ra[kt], t_base, kSld, 16 * pp, kt, pp, lane);
      }
      FLASHINFER_UNROLL
      for (int ks = 0; ks < 4; ++ks) {
        acc_to_a<IO>(ua, ks, uo[ks]);
        FLASHINFER_UNROLL
        for (int i = 0; i < 4; ++i) {
          const int nt = gs::a_from_acc_tile(ks, i), e0 = gs::a_from_acc_elem(i);
          const int t = 8 * nt + gs::acc_col(lane, 0);
          us[ks][i] = mma::pack2<IO>(t < C ? ua[nt][e0] * Tail[t] : 0.0f,
                                     t + 1 < C ? ua[nt][e0 + 1] * Tail[t + 1] : 0.0f);
        }
      }
    }
    // O^T = scale (S Q^T) diag(gamma) + U^T M'^T (M' holds the scale), from the chunk's entry
    // state; then staged as [token][v] in this warp's columns of the V slice (read above by this
    // warp only).
    {
      float oa[8][4] = {};
      state_times_rows<IO, kKs>(oa, s, qb, kQld, lane);
      FLASHINFER_UNROLL
      for (int nt = 0; nt < 8; ++nt) {
        FLASHINFER_UNROLL
        for (int e = 0; e < 4; ++e) oa[nt][e] *= p.scale * Gm[8 * nt + gs::acc_col(lane, e)];
      }
      FLASHINFER_UNROLL
      for (int kt = 0; kt < 4; ++kt) {
        FLASHINFER_UNROLL
        for (int pp = 0; pp < 4; ++pp)
          mma_b_rows<IO>(oa, uo[kt], m_base, kSld, 16 * pp, kt, pp, lane);
      }
      __syncwarp();
      FLASHINFER_UNROLL
      for (int nt = 0; nt < 8; ++nt) {
        FLASHINFER_UNROLL
        for (int e = 0; e < 4; ++e) {
          Vst[(8 * nt + gs::acc_col(lane, e)) * kSld + 16 * warp + gs::acc_row(lane, e)] =
              from_f32<IO>(oa[nt][e]);
        }
      }
    }
    // S = gamma_C S + (U^T diag(Gamma_{C, .})) K: K as the B operand stored [t][k] (.trans).
    {
      const float decay = Gm[C - 1];
      FLASHINFER_UNROLL
      for (int nt = 0; nt < kNt; ++nt) {
        FLASHINFER_UNROLL
        for (int e = 0; e < 4; ++e) s[nt][e] *= decay;
      }
      FLASHINFER_UNROLL
      for (int kt = 0; kt < 4; ++kt) {
        FLASHINFER_UNROLL
        for (int pp = 0; pp < kKs; ++pp) {
          uint32_t b[4];
          mma::ldmatrix_x4_trans(
              b, kb + 2u * ((16 * kt + gs::bt_row(lane)) * kQld + 16 * pp + gs::bt_col(lane)));
          mma::mma_m16n8k16<IO>(s[2 * pp], us[kt], b);
          mma::mma_m16n8k16<IO>(s[2 * pp + 1], us[kt], b + 2);
        }
      }
    }
    __syncthreads();
    // The chunk's outputs, 16 bytes a thread per step, down one unit column as the copies.
    {
      constexpr int kVUnits = gs::kSlice / 8, kVStep = gs::kThreads / kVUnits;
      const int vu = tid % kVUnits, vt0 = tid / kVUnits;
      IO* dst = out + (tok0 + vt0) * p.out_stride_tok + 8 * vu;
      for (int t = vt0; t < gc::kChunk; t += kVStep) {
        if (t < C) {
          *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(Vst + t * kSld + 8 * vu);
        }
        dst += kVStep * p.out_stride_tok;
      }
    }
    // A checkpoint after every checkpoint_every tokens (a multiple of 64: a chunk's end).
    if (p.checkpoint_every > 0 && (c0 + C) % p.checkpoint_every == 0) {
      const int64_t start = chunk_index(p.checkpoint_starts, p.checkpoint_starts_i64, n);
      const int64_t j = (c0 + C) / p.checkpoint_every - 1;
      if (start >= 0 && start < p.checkpoint_rows - j) {  // row start + j, without forming it
        float* const dst = p.checkpoints + ((start + j) * p.H + h) * p.V * p.K;
        FLASHINFER_UNROLL
        for (int nt = 0; nt < kNt; ++nt) {
          FLASHINFER_UNROLL
          for (int hv = 0; hv < 2; ++hv) {
            const int64_t v = v_row0 + gs::acc_row(lane, 2 * hv);
            *reinterpret_cast<float2*>(dst + v * p.K + 8 * nt + gs::acc_col(lane, 0)) =
                make_float2(s[nt][2 * hv], s[nt][2 * hv + 1]);
          }
        }
      }
    }
    // The next copies into this stage (one stage: at the next iteration's top; two: the one after)
    // overwrite what this chunk read, the store loop's reads of the staging included.
    __syncthreads();
  }
  // The write slot is read here, not kept in registers across the chunks.
  int64_t w = p.write_idx  ? chunk_index(p.write_idx, p.write_idx_i64, n)
              : p.read_idx ? chunk_index(p.read_idx, p.read_idx_i64, n)
                           : n;
  if (w >= p.state_out.slots) w = -1;
  if (p.write_final && w >= 0 && p.state_out.data) {
    float* const so = static_cast<float*>(p.state_out.data);
    FLASHINFER_UNROLL
    for (int nt = 0; nt < kNt; ++nt) {
      FLASHINFER_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int64_t v = v_row0 + gs::acc_row(lane, e), k = 8 * nt + gs::acc_col(lane, e);
        so[w * p.state_out.stride_slot + h * p.state_out.stride_head + k * p.state_out.stride_k +
           v * p.state_out.stride_v] = s[nt][e];
      }
    }
  }
}

template <class IO, int KD>
void launch_chunked(const GdnParams& p, cudaStream_t stream, bool enable_pdl, int stages) {
  constexpr int kSlices = KD / gs::kSlice;
  const int64_t blocks = p.num_seqs * p.H * kSlices;
  FLASHINFER_CHECK(blocks <= 0x7fffffff, "chunk_gated_delta_rule", "q",
                   "grid too large: ", p.num_seqs, " sequences x ", p.H, " heads");
  const dim3 grid(static_cast<unsigned>(blocks)), block(gs::kThreads);
  if (stages == 2) {
    launch_kernel("chunk_gated_delta_rule", gdn_chunked_prefill_kernel<IO, KD, 2>, grid, block,
                  gs::layout(KD, 2).bytes, stream, enable_pdl, p);
  } else {
    launch_kernel("chunk_gated_delta_rule", gdn_chunked_prefill_kernel<IO, KD, 1>, grid, block,
                  gs::layout(KD, 1).bytes, stream, enable_pdl, p);
  }
}

}  // namespace

bool gated_delta_rule_chunked(const GdnParams& p, void* stream, bool enable_pdl) {
  // The decode ops (every step of every layer) leave before the device queries.
  if (p.decode_gates || p.cu_seqlens == nullptr) return false;
  int dev = 0, cc_major = 0, smem_optin = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    return false;
  }
  if (gs::chunked_refusal(p, cc_major, smem_optin) != nullptr) return false;
  g_chunked_launches.fetch_add(1, std::memory_order_relaxed);
  if (p.num_seqs == 0 || p.H == 0) return true;
  const auto s = static_cast<cudaStream_t>(stream);
  const bool f16 = p.io_dtype == DType::kFloat16;
  const int kd = static_cast<int>(p.K);
  int stages = gs::stages_for(kd, p.num_seqs * p.H * (kd / gs::kSlice), sms, smem_optin);
  if (const int forced = gs::stages_by_env(); forced != 0) {
    stages = forced == 2 && smem_optin >= static_cast<int>(gs::layout(kd, 2).bytes) ? 2 : 1;
  }
  if (kd == 64) {
    f16 ? launch_chunked<__half, 64>(p, s, enable_pdl, stages)
        : launch_chunked<__nv_bfloat16, 64>(p, s, enable_pdl, stages);
  } else {
    f16 ? launch_chunked<__half, 128>(p, s, enable_pdl, stages)
        : launch_chunked<__nv_bfloat16, 128>(p, s, enable_pdl, stages);
  }
  return true;
}

uint64_t gdn_chunked_launches() { return g_chunked_launches.load(std::memory_order_relaxed); }

}  // namespace flashinfer::kernels::cuda
