#include "kernels/cpu/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"
#include "kernels/cpu/cpu_avx512.h"
#include "kernels/dtype_dispatch.h"
#include "kernels/merge_rules.h"

namespace flashinfer::kernels::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kKvTile = 64;  // keys converted to fp32 at a time

// Element offset of key/value token t of request b (head and dim not included).
inline int64_t kv_token_offset(const KvAddressing& a, int32_t b, int64_t t, bool is_v) {
  const int64_t sp = is_v ? a.v_stride_page : a.k_stride_page;
  const int64_t st = is_v ? a.v_stride_token : a.k_stride_token;
  if (a.kv_indices == nullptr) return (static_cast<int64_t>(a.kv_indptr[b]) + t) * st;
  const int64_t page = a.kv_indices[a.kv_indptr[b] + t / a.page_size];
  return page * sp + (t % a.page_size) * st;
}

// Folds state (s_b, v_b) into (s_a, v_a) with base-2 LSEs; -inf states carry no weight, so the
// result is never NaN.
inline void merge_into(float& s_a, float* v_a, float s_b, const float* v_b, int64_t d) {
  if (s_b == kNegInf) return;
  if (s_a == kNegInf) {
    s_a = s_b;
    std::copy(v_b, v_b + d, v_a);
    return;
  }
  const float m = std::max(s_a, s_b);
  const float wa = std::exp2(s_a - m), wb = std::exp2(s_b - m);
  const float inv = 1.0f / (wa + wb);
  for (int64_t i = 0; i < d; ++i) v_a[i] = (wa * v_a[i] + wb * v_b[i]) * inv;
  s_a = m + std::log2(wa + wb);
}

// fp16 -> fp32 through a 256 KiB table (L2-resident): one load per element instead of the
// bit manipulation, which the baseline x86-64 target cannot vectorize well.
const float* half_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t b = 0; b < 65536; ++b) t[b] = half_bits_to_float(static_cast<uint16_t>(b));
    return t;
  }();
  return table.data();
}

#if FLASHINFER_CPU_AVX512
// The decode hot loops on AVX-512 (16 lanes, masked tails): fp16/bf16 rows to fp32 (exact, the
// same values as the table), q.k dot products and the p * v accumulation. A decode step of a
// small model spends more time here than in its attention FLOPs on the baseline x86-64 build.
template <class T>
FI_AVX512 void load_row512(float* dst, const T* src, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, simd512::load(src + i));
  if (i < n) {
    const __mmask16 m = simd512::tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, m, simd512::load(src + i, m));
  }
}
FI_AVX512 float dot512(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  if (i < n) {
    const __mmask16 m = simd512::tail_mask(n - i);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
  }
  return _mm512_reduce_add_ps(acc);
}
// a = a * f + p * v over n values.
FI_AVX512 void scale_axpy512(float* a, float f, float p, const float* v, int64_t n) {
  const __m512 fv = _mm512_set1_ps(f), pv = _mm512_set1_ps(p);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(a + i, _mm512_fmadd_ps(pv, _mm512_loadu_ps(v + i),
                                            _mm512_mul_ps(fv, _mm512_loadu_ps(a + i))));
  if (i < n) {
    const __mmask16 m = simd512::tail_mask(n - i);
    _mm512_mask_storeu_ps(a + i, m,
                          _mm512_fmadd_ps(pv, _mm512_maskz_loadu_ps(m, v + i),
                                          _mm512_mul_ps(fv, _mm512_maskz_loadu_ps(m, a + i))));
  }
}
#endif

// q.k over n values.
inline float dot_row(const float* a, const float* b, int64_t n, [[maybe_unused]] bool avx512) {
#if FLASHINFER_CPU_AVX512
  if (avx512) return dot512(a, b, n);
#endif
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int64_t i = 0; i < n; ++i) dot += a[i] * b[i];
  return dot;
}

// a = a * f + p * v over n values.
inline void scale_axpy_row(float* a, float f, float p, const float* v, int64_t n,
                           [[maybe_unused]] bool avx512) {
#if FLASHINFER_CPU_AVX512
  if (avx512) {
    scale_axpy512(a, f, p, v, n);
    return;
  }
#endif
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) a[i] = a[i] * f + p * v[i];
}

// Converts n elements to fp32.
template <class T>
inline void load_row(float* dst, const T* src, int64_t n) {
#if FLASHINFER_CPU_AVX512
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16> ||
                std::is_same_v<T, float>) {
    if (use_avx512()) {
      load_row512(dst, src, n);
      return;
    }
  }
#endif
  if constexpr (std::is_same_v<T, Half>) {
    const float* table = half_table();
    for (int64_t i = 0; i < n; ++i) dst[i] = table[src[i].bits];
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
  }
}

template <class T>
inline void store_row(T* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = from_float<T>(src[i]);
}

// Output row `elem` (an element offset into p.o) in the call's out dtype, chosen per row at run
// time rather than by a template parameter of the kernel: one Runner per (q, K/V) dtype pair
// instead of one per out dtype too (15 instances instead of 45, two thirds of this source's
// compile time). batch_attention has checked the dtype before any work.
inline void store_out_row(const AttentionParams& p, int64_t elem, const float* src, int64_t n) {
  switch (p.o_dtype) {
    case DType::kFloat32:
      store_row(static_cast<float*>(p.o) + elem, src, n);
      break;
    case DType::kFloat16:
      store_row(static_cast<Half*>(p.o) + elem, src, n);
      break;
    case DType::kBFloat16:
      store_row(static_cast<BFloat16*>(p.o) + elem, src, n);
      break;
    default:
      break;
  }
}

// Folds the sink logit sink2 (log2 units; a virtual key whose value is zero) into a finished
// state: lse grows to log2(2^lse + 2^sink2) and v shrinks by the same factor. A NaN state stays
// NaN.
/// The LSE as written: base 2, or times fp32 ln 2 for lse_base "ln" (one rounding: the host
/// builds with ISO C++'s -ffp-contract=off; the CUDA kernels' lse_out uses __fmul_rn).
inline float lse_out(const AttentionParams& p, float lse2) {
  return p.lse_base_e ? lse2 * 0.693147182464599609375f : lse2;
}

inline void apply_sink(float& lse, float* v, int64_t d, float sink2) {
  if (std::isnan(lse)) return;
  if (lse == kNegInf) {
    std::fill(v, v + d, 0.0f);
    lse = sink2;
    return;
  }
  const float m = std::max(lse, sink2);
  const float total = m + std::log2(std::exp2(lse - m) + std::exp2(sink2 - m));
  const float f = std::exp2(lse - total);
  for (int64_t i = 0; i < d; ++i) v[i] *= f;
  lse = total;
}

// RoPE (llama style, non-interleaved halves) of one fp32 row of d values at `pos`, in fp32 as
// upstream's kernels compute it; `round` stores the result in T and reads it back (upstream's
// prefill kernel rotates q and k in shared memory in their own 16-bit dtypes).
template <class T>
inline void rope_row(float* x, int64_t d, int64_t pos, const float* freq,
                     [[maybe_unused]] bool round) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * freq[i];
    const float c = std::cos(angle), s = std::sin(angle);
    const float a = x[i], b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = b * c + a * s;
  }
  if constexpr (!std::is_same_v<T, float> && !std::is_same_v<T, Float8E4M3FN> &&
                !std::is_same_v<T, Float8E5M2>) {
    if (round) {
      for (int64_t i = 0; i < d; ++i) x[i] = to_float(from_float<T>(x[i]));
    }
  }
}

template <class TQ, class TKV>
class Runner {
 public:
  Runner(const AttentionParams& p, const PosEncoding& pe) : p_(p), pe_(pe) {}

  // One (work item, kv head): query rows [qo_begin, qo_end) of every qo head of kv head g's
  // group (so each K/V tile is converted once per group) against keys [kv_begin, kv_end).
  void run(const WorkItem& w, int32_t g) {
    const AttentionParams& p = p_;
    const int32_t group = p.num_qo_heads / p.num_kv_heads;
    const int64_t dqk = p.head_dim_qk, dvo = p.head_dim_vo;
    const int32_t b = w.request;
    const int64_t qo_len = p.qo_indptr[b + 1] - p.qo_indptr[b];
    const int64_t kv_len = p.kv_lens[b];
    const int64_t qrows = w.qo_end - w.qo_begin;
    const int64_t rows = qrows * group;  // row rr = r * group + hh is query r of head g*group+hh
    q_.resize(static_cast<std::size_t>(rows * dqk));
    acc_.assign(static_cast<std::size_t>(rows * dvo), 0.0f);
    m_.assign(static_cast<std::size_t>(rows), kNegInf);
    d_.assign(static_cast<std::size_t>(rows), 0.0f);
    nan_.assign(static_cast<std::size_t>(rows), 0);
    kt_.resize(static_cast<std::size_t>(kKvTile * dqk));
    vt_.resize(static_cast<std::size_t>(kKvTile * dvo));
    s_.resize(kKvTile);
    scale_.resize(static_cast<std::size_t>(group));

    for (int32_t hh = 0; hh < group; ++hh) {
      float scale = p.sm_scale;
      if (p.scale_q) scale *= p.scale_q[g * group + hh];
      if (p.scale_k) scale *= p.scale_k[g];
      scale_[hh] = scale;
    }
    const float cap = p.logits_soft_cap;
    const bool soft_cap = cap > 0.0f;
    const PosEncoding& pe = pe_;
    const bool rope = pe.mode == 1, alibi = pe.mode == 2;
    if (rope && freq_.empty()) {
      // Upstream: rope_rcp_scale * rope_rcp_theta^(2 i / D) in fp32.
      freq_.resize(static_cast<std::size_t>(dqk / 2));
      for (int64_t i = 0; i < dqk / 2; ++i) {
        freq_[i] = pe.rope_rcp_scale *
                   std::pow(pe.rope_rcp_theta, static_cast<float>(2 * i) / static_cast<float>(dqk));
      }
    }
    for (int64_t rr = 0; rr < rows; ++rr) {
      const int64_t h = g * group + rr % group;
      const TQ* src = static_cast<const TQ*>(p.q) +
                      (p.qo_indptr[b] + w.qo_begin + rr / group) * p.q_stride_n + h * p.q_stride_h;
      load_row(&q_[rr * dqk], src, dqk);
      if (rope) {
        rope_row<TQ>(&q_[rr * dqk], dqk, kv_len - qo_len + w.qo_begin + rr / group, freq_.data(),
                     p.use_tensor_cores);
      }
    }
    const TKV* kbase = static_cast<const TKV*>(p.kv.k) + g * p.kv.k_stride_head;
    const TKV* vbase = static_cast<const TKV*>(p.kv.v) + g * p.kv.v_stride_head;
    const int64_t bit0 = p.custom_mask ? p.mask_indptr[b] : 0;

    // Keys any of these rows can see: causal (multi-item scoring's rows hold it too) caps the
    // end, a sliding window the start (not multi-item's: like a custom mask's, its tiles stay
    // those of the mask spelled out, whose bits the tests compare).
    int64_t kv_lo = w.kv_begin, kv_hi = w.kv_end;
    if (!p.custom_mask && rows > 0) {
      const int64_t pos_min = kv_len - qo_len + w.qo_begin;
      const int64_t pos_max = kv_len - qo_len + w.qo_end - 1;
      if (p.causal || p.multi_item_rows) kv_hi = std::min(kv_hi, pos_max + 1);
      if (p.window_left >= 0 && !p.multi_item_rows)
        kv_lo = std::max(kv_lo, pos_min - p.window_left);
    }
    for (int64_t t0 = kv_lo; t0 < kv_hi; t0 += kKvTile) {
      const int64_t n = std::min<int64_t>(kKvTile, kv_hi - t0);
      for (int64_t j = 0; j < n; ++j) {
        const TKV* kr = kbase + kv_token_offset(p.kv, b, t0 + j, false);
        const TKV* vr = vbase + kv_token_offset(p.kv, b, t0 + j, true);
        load_row(&kt_[j * dqk], kr, dqk);
        load_row(&vt_[j * dvo], vr, dvo);
        if (rope) rope_row<TKV>(&kt_[j * dqk], dqk, t0 + j, freq_.data(), p.use_tensor_cores);
      }
      for (int64_t rr = 0; rr < rows; ++rr) {
        const int64_t qi = w.qo_begin + rr / group;
        const int64_t pos = kv_len - qo_len + qi;  // right-aligned absolute position
        const float scale = scale_[rr % group];
        const float* qr = &q_[rr * dqk];
        float tile_max = kNegInf;
        for (int64_t j = 0; j < n; ++j) {
          const int64_t kj = t0 + j;
          bool keep = true;
          if (p.causal && kj > pos) keep = false;
          if (p.window_left >= 0 && kj < pos - p.window_left) keep = false;
          if (p.custom_mask) {
            const int64_t bit = bit0 + qi * kv_len + kj;
            keep = keep && ((p.custom_mask[bit >> 3] >> (bit & 7)) & 1);
          }
          if (p.multi_item_rows) {  // keys [0, a) and [lo, pos] of the row
            const int32_t* r = p.multi_item_rows + 2 * (p.qo_indptr[b] + qi);
            keep = keep && kj <= pos && (kj < r[0] || kj >= r[1]);
          }
          if (!keep) {
            s_[j] = kNegInf;
            continue;
          }
          const float* kr = &kt_[j * dqk];
          const float dot = dot_row(qr, kr, dqk, avx512_);
          float sc;
          if (alibi) {
            // Upstream's DefaultAttention (variants.cuh): sm_scale * q.k + slope * (j - i); with
            // a soft cap, cap * tanh of that times sm_scale / cap (sm_scale applied twice).
            sc =
                dot * scale + pe.alibi_slopes[g * group + rr % group] * static_cast<float>(kj - qi);
            if (soft_cap) sc = cap * std::tanh(sc * (scale / cap));
          } else {
            sc = soft_cap ? cap * std::tanh(dot * scale / cap) : dot * scale;
          }
          sc *= kLog2e;
          if (std::isnan(sc)) {
            // A NaN score makes the row NaN, as in upstream's kernels (it would otherwise be
            // dropped by max() and read as "no visible key").
            nan_[rr] = 1;
            sc = kNegInf;
          }
          s_[j] = sc;
          tile_max = std::max(tile_max, sc);
        }
        if (tile_max == kNegInf) continue;  // nothing visible in this tile
        const float m_new = std::max(m_[rr], tile_max);
        const float factor = std::exp2(m_[rr] - m_new);  // 0 when m was -inf
        float* a = &acc_[rr * dvo];
        float sum = 0.0f;
        bool first = true;  // the rescale folds into the first visible key's update
        for (int64_t j = 0; j < n; ++j) {
          if (s_[j] == kNegInf) continue;
          const float pj = std::exp2(s_[j] - m_new);
          sum += pj;
          scale_axpy_row(a, first ? factor : 1.0f, pj, &vt_[j * dvo], dvo, avx512_);
          first = false;
        }
        d_[rr] = d_[rr] * factor + sum;
        m_[rr] = m_new;
      }
    }

    float out_scale = p.v_scale;
    if (p.scale_v) out_scale *= p.scale_v[g];
    for (int64_t rr = 0; rr < rows; ++rr) {
      const int64_t h = g * group + rr % group;
      float* a = &acc_[rr * dvo];
      float lse = kNegInf;
      if (nan_[rr]) {
        std::fill(a, a + dvo, std::numeric_limits<float>::quiet_NaN());
        lse = std::numeric_limits<float>::quiet_NaN();
      } else if (d_[rr] > 0.0f) {
        const float inv = out_scale / d_[rr];
        for (int64_t i = 0; i < dvo; ++i) a[i] *= inv;
        lse = m_[rr] + std::log2(d_[rr]);
      } else {
        std::fill(a, a + dvo, 0.0f);  // no visible key: zeros, LSE -inf
      }
      // The sink joins once: here when the row is final, in merge() when it is split.
      if (p.sinks && w.partial_base < 0) apply_sink(lse, a, dvo, p.sinks[h] * kLog2e);
      const int64_t r = rr / group;
      if (w.partial_base >= 0) {
        const int64_t prow = w.partial_base + r;
        std::copy(a, a + dvo, p.tmp_v + (prow * p.num_qo_heads + h) * dvo);
        p.tmp_s[prow * p.num_qo_heads + h] = lse;
      } else {
        const int64_t row = p.qo_indptr[b] + w.qo_begin + r;
        store_out_row(p, row * p.o_stride_n + h * p.o_stride_h, a, dvo);
        if (p.lse) p.lse[row * p.lse_stride_n + h * p.lse_stride_h] = lse_out(p, lse);
      }
    }
  }

  // Merged row m, head h: folds its partial rows into o/lse.
  void merge(int32_t m, int32_t h) {
    const AttentionParams& p = p_;
    const int64_t dvo = p.head_dim_vo;
    acc_.assign(static_cast<std::size_t>(dvo), 0.0f);
    float s = kNegInf;
    for (int32_t k = p.merge_indptr[m]; k < p.merge_indptr[m + 1]; ++k) {
      const int64_t prow = p.merge_rows[k];
      merge_into(s, acc_.data(), p.tmp_s[prow * p.num_qo_heads + h],
                 p.tmp_v + (prow * p.num_qo_heads + h) * dvo, dvo);
    }
    if (s == kNegInf) std::fill(acc_.begin(), acc_.end(), 0.0f);
    if (p.sinks) apply_sink(s, acc_.data(), dvo, p.sinks[h] * kLog2e);
    const int64_t row = p.merge_out_row[m];
    store_out_row(p, row * p.o_stride_n + h * p.o_stride_h, acc_.data(), dvo);
    if (p.lse) p.lse[row * p.lse_stride_n + h * p.lse_stride_h] = lse_out(p, s);
  }

 private:
  const AttentionParams& p_;
  const PosEncoding& pe_;
  const bool avx512_ = use_avx512();
  std::vector<float> q_, acc_, m_, d_, kt_, vt_, s_, scale_, freq_;
  std::vector<char> nan_;  // per row: a visible score was NaN
};

template <class TQ, class TKV>
void run_attention(const AttentionParams& p, const PosEncoding& pe) {
  const int64_t kv_heads = p.num_kv_heads, heads = p.num_qo_heads;
  const int64_t items = static_cast<int64_t>(p.num_work) * kv_heads;
  // Small problems run on the calling thread: waking the team costs microseconds on a quiet
  // machine and a whole scheduler time slice when a core is busy elsewhere.
  int64_t macs = 0;
  for (int32_t w = 0; w < p.num_work; ++w) {
    const WorkItem& it = p.work[w];
    macs += static_cast<int64_t>(it.qo_end - it.qo_begin) * (it.kv_end - it.kv_begin);
  }
  macs *= static_cast<int64_t>(heads) * (p.head_dim_qk + p.head_dim_vo);
#pragma omp parallel if (items > 1 && macs >= (int64_t{1} << 18))
  {
    Runner<TQ, TKV> runner(p, pe);
#pragma omp for schedule(dynamic, 1)
    for (int64_t x = 0; x < items; ++x) {
      runner.run(p.work[x / kv_heads], static_cast<int32_t>(x % kv_heads));
    }
    const int64_t merges = static_cast<int64_t>(p.num_merge) * heads;
#pragma omp for schedule(static)
    for (int64_t x = 0; x < merges; ++x) {
      runner.merge(static_cast<int32_t>(x / heads), static_cast<int32_t>(x % heads));
    }
  }
}

// The public merges, by upstream's rules (kernels/merge_rules.h): two states given apart
// (merge_state, merge_state_in_place) merge as a pair; stacked ones (merge_states) fold in order.
template <class T>
void run_merge(const MergeParams& p) {
  const int64_t d = p.head_dim;
  const int64_t items = p.seq * p.num_heads;
#pragma omp parallel if (items * p.num_states * d >= (1 << 15))
  {
    std::vector<float> acc(static_cast<std::size_t>(d));
#pragma omp for schedule(static)
    for (int64_t x = 0; x < items; ++x) {
      const int64_t n = x / p.num_heads, h = x % p.num_heads;
      if (p.mask && !p.mask[n]) continue;
      auto state_v = [&](int64_t k) -> const T* {
        if (k == 1 && p.v_b)
          return static_cast<const T*>(p.v_b) + n * p.vb_stride_n + h * p.vb_stride_h;
        return static_cast<const T*>(p.v) + n * p.v_stride_n + k * p.v_stride_k + h * p.v_stride_h;
      };
      auto state_s = [&](int64_t k) {
        if (k == 1 && p.s_b) return p.s_b[n * p.sb_stride_n + h * p.sb_stride_h];
        return p.s[n * p.s_stride_n + k * p.s_stride_k + h * p.s_stride_h];
      };
      float s_out;
      if (p.num_states == 0) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        s_out = kNegInf;
      } else if (p.num_states == 1) {
        const T* v = state_v(0);
        for (int64_t i = 0; i < d; ++i) acc[i] = to_float(v[i]);
        s_out = state_s(0);
      } else if (p.v_b) {
        const MergePair m = merge_pair(state_s(0), state_s(1));
        const T *va = state_v(0), *vb = state_v(1);
        for (int64_t i = 0; i < d; ++i)
          acc[i] = m.a_scale * to_float(va[i]) + m.b_scale * to_float(vb[i]);
        s_out = m.s;
      } else {
        std::fill(acc.begin(), acc.end(), 0.0f);
        MergeFold f;
        for (int64_t k = 0; k < p.num_states; ++k) {
          f.fold(state_s(k));
          const T* v = state_v(k);
          for (int64_t i = 0; i < d; ++i) acc[i] = acc[i] * f.f_prev + to_float(v[i]) * f.f_new;
        }
        const float scale = f.out_scale();
        for (int64_t i = 0; i < d; ++i) acc[i] *= scale;
        s_out = f.lse();
      }
      store_row(static_cast<T*>(p.v_out) + n * p.vo_stride_n + h * p.vo_stride_h, acc.data(), d);
      p.s_out[n * p.so_stride_n + h * p.so_stride_h] = s_out;
    }
  }
}

}  // namespace

void batch_attention(const AttentionParams& p) { batch_attention(p, PosEncoding{}); }

void batch_attention(const AttentionParams& p, const PosEncoding& pe) {
  dispatch_dtype<CpuElements, kFloat32, kFloat16, kBFloat16>(
      p.q_dtype, "attention", "q", [&]<class TQ>() {
        dispatch_dtype<CpuElements, kFloat32, kFloat16, kBFloat16, kFloat8E4M3FN, kFloat8E5M2>(
            p.kv.dtype, "attention", "k", [&]<class TKV>() {
              // The out dtype is checked here, before any work (store_out_row writes it).
              dispatch_dtype<CpuElements, kFloat32, kFloat16, kBFloat16>(
                  p.o_dtype, "attention", "out", [&]<class>() { run_attention<TQ, TKV>(p, pe); });
            });
      });
}

void merge_states(const MergeParams& p) {
  dispatch_dtype<CpuElements, kFloat32, kFloat16, kBFloat16>(p.v_dtype, "merge_states", "v",
                                                             [&]<class T>() { run_merge<T>(p); });
}

int num_threads() { return omp_get_max_threads(); }

void append_paged_kv_cache(const AppendParams& p) {
  const auto* ak = static_cast<const unsigned char*>(p.append_key);
  const auto* av = static_cast<const unsigned char*>(p.append_value);
  auto* ck = static_cast<unsigned char*>(p.k_out);
  auto* cv = static_cast<unsigned char*>(p.v_out);
  const int64_t es = p.elem_size;
  const std::size_t row_bytes = static_cast<std::size_t>(p.head_dim * es);
#pragma omp parallel for schedule(static) if (p.nnz * p.num_heads * p.head_dim >= (1 << 16))
  for (int64_t i = 0; i < p.nnz; ++i) {
    // The host checked the table (api::load_append_targets): every row has its slot.
    const AppendSlot s = append_slot(p.table, i);
    if (s.page < 0) continue;
    const int64_t ko = s.page * p.k_stride_page + s.entry * p.k_stride_token;
    const int64_t vo = s.page * p.v_stride_page + s.entry * p.v_stride_token;
    for (int64_t h = 0; h < p.num_heads; ++h) {
      std::memcpy(ck + (ko + h * p.k_stride_head) * es,
                  ak + (i * p.ak_stride_n + h * p.ak_stride_h) * es, row_bytes);
      std::memcpy(cv + (vo + h * p.v_stride_head) * es,
                  av + (i * p.av_stride_n + h * p.av_stride_h) * es, row_bytes);
    }
  }
}

}  // namespace flashinfer::kernels::cpu
