#include "kernels/cpu/kda_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "flashinfer/float_formats.h"
#include "kernels/cpu/elem_io.h"
#include "kernels/gdn_rules.h"
#include "kernels/kda_rules.h"

namespace flashinfer::kernels::cpu {
namespace {

using elem_io::load_or_fp32;
using elem_io::store_or_fp32;

uint16_t raw(const KdaIoRef& r, int64_t n, int64_t t, int64_t h, int64_t i) {
  return static_cast<const uint16_t*>(r.data)[n * r.seq + t * r.tok + h * r.head + i];
}
float at(const KdaIoRef& r, int64_t n, int64_t t, int64_t h, int64_t i) {
  return bfloat16_bits_to_float(raw(r, n, t, h, i));
}

// State S[v][k] to / from a [slots, HV, V, K] pool slot.
void load_state(const void* pool, DType dt, int64_t stride_slot, int64_t slot, int64_t hv,
                int64_t K, std::vector<float>& S) {
  const int64_t base = slot * stride_slot + hv * K * K;
  for (int64_t i = 0; i < K * K; ++i) S[i] = load_or_fp32(pool, dt, base + i);
}
void store_state(void* pool, DType dt, int64_t stride_slot, int64_t slot, int64_t hv, int64_t K,
                 const std::vector<float>& S) {
  const int64_t base = slot * stride_slot + hv * K * K;
  for (int64_t i = 0; i < K * K; ++i) store_or_fp32(pool, dt, base + i, S[i]);
}

void run_head(const KdaParams& p, int64_t n, int64_t hv) {
  const int64_t K = p.K, h = gdn::source_head(hv, p.H, p.HV);
  int64_t begin = 0, len = p.T, seq = n;
  if (p.cu_seqlens) {
    const auto cu = [&](int64_t i) {
      return p.cu_seqlens_i64 ? static_cast<const int64_t*>(p.cu_seqlens)[i]
                              : static_cast<const int32_t*>(p.cu_seqlens)[i];
    };
    begin = cu(n);
    len = cu(n + 1) - begin;
    if (p.spec || p.frozen) len = std::min(len, p.T);
    seq = 0;
  }
  if (len <= 0) return;
  auto out_at = [&](int64_t t, int64_t v) {
    return seq * p.out_seq + (begin + t) * p.out_tok + hv * p.out_head + v;
  };
  auto zero_outputs = [&] {
    for (int64_t t = 0; t < len; ++t) {
      for (int64_t v = 0; v < K; ++v) store_or_fp32(p.out, DType::kBFloat16, out_at(t, v), 0.0f);
    }
  };
  auto slot_at = [&](int64_t col) -> int64_t {
    if (!p.idx) return n;
    int64_t s = p.idx[n * p.idx_stride0 + col];
    if (s < 0 && p.wrap_negative) s += p.slots;
    return s;
  };
  std::vector<float> S(static_cast<size_t>(K * K), 0.0f);  // [v][k]
  int64_t final_slot = -1;
  if (p.spec) {
    if (p.source) {
      load_state(p.source, p.state_dtype, p.source_stride_slot, std::max(p.src_idx[n], 0), hv, K,
                 S);
    } else {
      int64_t c = p.num_accepted ? p.num_accepted[n] - 1 : 0;
      c = std::clamp<int64_t>(c, 0, p.T - 1);
      load_state(p.state, p.state_dtype, p.state_stride_slot, std::max<int64_t>(slot_at(c), 0), hv,
                 K, S);
    }
  } else {
    final_slot = slot_at(0);
    if (final_slot < 0) return zero_outputs();  // padding
    if (p.frozen) {                             // the committed state, read only
      load_state(p.state, p.state_dtype, p.state_stride_slot, final_slot, hv, K, S);
    } else if (p.source) {
      load_state(p.source, p.state_dtype, p.source_stride_slot, std::max(p.src_idx[n], 0), hv, K,
                 S);
    } else if (p.state) {
      load_state(p.state, p.state_dtype, p.state_stride_slot, final_slot, hv, K, S);
    }
  }
  std::vector<float> q(static_cast<size_t>(K)), kk(static_cast<size_t>(K)),
      dk(static_cast<size_t>(K));
  for (int64_t t = 0; t < len; ++t) {
    const int64_t tok = begin + t;
    if (p.checkpoint_every > 0 && !p.checkpoint_idx && t % p.checkpoint_every == 0) {
      const int64_t row = p.checkpoint_starts[n] + t / p.checkpoint_every;
      store_state(p.checkpoints, p.state_dtype, p.HV * K * K, row, hv, K, S);
    }
    int64_t w = -1;
    if (p.spec) {
      w = slot_at(t);
      if (w < 0) {  // an inactive token: zero output, S unchanged
        for (int64_t v = 0; v < K; ++v) store_or_fp32(p.out, DType::kBFloat16, out_at(t, v), 0.0f);
        continue;
      }
    }
    if (p.kg) {  // the raw key and gate bits, before the norm and the gate (frozen verify)
      uint16_t* row = p.kg + final_slot * p.kg_slot + hv * p.kg_head + t * p.kg_tok;
      for (int64_t i = 0; i < K; ++i) {
        row[i] = raw(p.k, seq, tok, h, i);
        row[K + i] = raw(p.g, seq, tok, hv, i);
      }
    }
    float* corr =
        p.corr ? p.corr + final_slot * p.corr_slot + hv * p.corr_head + t * p.corr_tok : nullptr;
    float sq = 0.0f, sk = 0.0f;
    for (int64_t i = 0; i < K; ++i) {
      q[i] = at(p.q, seq, tok, h, i);
      kk[i] = at(p.k, seq, tok, h, i);
      sq += q[i] * q[i];
      sk += kk[i] * kk[i];
      const float bias = p.dt_bias ? p.dt_bias[h * K + i] : 0.0f;
      dk[i] = kda::decay(p.gate, at(p.g, seq, tok, hv, i), p.A_log ? p.A_log[h] : 0.0f, bias,
                         p.lower_bound);
    }
    const float qn = p.l2norm ? gdn::l2_inv_norm(sq) : 1.0f;
    const float kn = p.l2norm ? gdn::l2_inv_norm(sk) : 1.0f;
    for (int64_t i = 0; i < K; ++i) {
      q[i] = q[i] * p.scale * qn;
      kk[i] *= kn;
    }
    float beta = at(p.beta, seq, tok, hv, 0);
    if (p.beta_is_logit) beta = kda::sigmoid(beta);
    for (int64_t v = 0; v < K; ++v) {
      float* row = &S[v * K];
      float pred = 0.0f;
      for (int64_t i = 0; i < K; ++i) {
        row[i] *= dk[i];
        pred += row[i] * kk[i];
      }
      const float u = beta * (at(p.v, seq, tok, hv, v) - pred);
      if (corr) corr[v] = u;
      float o = 0.0f;
      for (int64_t i = 0; i < K; ++i) {
        row[i] += kk[i] * u;
        o += row[i] * q[i];
      }
      store_or_fp32(p.out, DType::kBFloat16, out_at(t, v), o);
    }
    if (p.checkpoint_idx && (t + 1) % p.checkpoint_every == 0) {  // a completed boundary
      const int64_t r = p.checkpoint_idx[p.checkpoint_starts[n] + (t + 1) / p.checkpoint_every - 1];
      if (r >= 0 && r < p.checkpoint_rows) {
        store_state(p.checkpoints, p.state_dtype, p.HV * K * K, r, hv, K, S);
      }
    }
    if (p.spec && p.state) store_state(p.state, p.state_dtype, p.state_stride_slot, w, hv, K, S);
  }
  if (!p.spec && !p.frozen && p.state)
    store_state(p.state, p.state_dtype, p.state_stride_slot, final_slot, hv, K, S);
}

float bf16r(float x) { return bfloat16_bits_to_float(float_to_bfloat16_bits(x)); }

void fused_row_head(const FusedKdaParams& p, int64_t r, int64_t h) {
  constexpr int64_t D = FusedKdaParams::kDim;
  auto* out = static_cast<uint16_t*>(p.out) + (r * p.H + h) * D;
  const int64_t s = p.idx[r];
  if (s <= 0) {  // a null row (slot 0 is the null slot): zeros, nothing stored
    for (int64_t i = 0; i < D; ++i) out[i] = 0;
    return;
  }
  const auto* x = static_cast<const uint16_t*>(p.x) + r * p.x_row;
  auto* cs = static_cast<uint16_t*>(p.conv_state) + s * p.cs_slot;
  std::vector<float> m(static_cast<size_t>(3 * D));  // q, k, v after conv + SiLU (bf16 values)
  for (int64_t which = 0; which < 3; ++which) {
    for (int64_t i = 0; i < D; ++i) {
      const int64_t c = which * p.H * D + h * D + i;
      const float* w = p.weight + which * 4 * p.H * D + h * D + i;
      uint16_t* hist = cs + c * p.cs_chan;
      const int64_t j1 = p.cs_hist, j2 = 2 * p.cs_hist;
      const float h0 = bfloat16_bits_to_float(hist[0]), h1 = bfloat16_bits_to_float(hist[j1]),
                  h2 = bfloat16_bits_to_float(hist[j2]);
      const float xv = bfloat16_bits_to_float(x[c]);
      m[which * D + i] =
          bf16r(kda::conv_silu(h0, h1, h2, xv, w[0], w[p.H * D], w[2 * p.H * D], w[3 * p.H * D]));
      hist[0] = hist[j1];
      hist[j1] = hist[j2];
      hist[j2] = x[c];
    }
  }
  float sq = 0.0f, sk = 0.0f;
  for (int64_t i = 0; i < D; ++i) {
    sq += m[i] * m[i];
    sk += m[D + i] * m[D + i];
  }
  const float qn = gdn::l2_inv_norm(sq) * (1.0f / std::sqrt(static_cast<float>(D)));
  const float kn = gdn::l2_inv_norm(sk);
  std::vector<float> q(static_cast<size_t>(D)), k(static_cast<size_t>(D)),
      dk(static_cast<size_t>(D));
  const auto* gate = static_cast<const uint16_t*>(p.raw_gate) + (r * p.H + h) * D;
  for (int64_t i = 0; i < D; ++i) {
    q[i] = m[i] * qn;
    k[i] = m[D + i] * kn;
    dk[i] = kda::decay(p.has_lower_bound ? KdaGate::kLowerBound : KdaGate::kSoftplus,
                       bfloat16_bits_to_float(gate[i]), p.A_log[h], p.dt_bias[h * D + i],
                       p.lower_bound);
  }
  const float beta = kda::sigmoid(
      bfloat16_bits_to_float(static_cast<const uint16_t*>(p.raw_beta)[r * p.b_row + h * p.b_head]));
  std::vector<float> S(static_cast<size_t>(D * D)), o(static_cast<size_t>(D));
  load_state(p.state, p.state_dtype, p.state_slot, s, h, D, S);
  for (int64_t v = 0; v < D; ++v) {
    float* row = &S[v * D];
    float pred = 0.0f;
    for (int64_t i = 0; i < D; ++i) {
      row[i] *= dk[i];
      pred += row[i] * k[i];
    }
    const float u = beta * (m[2 * D + v] - pred);
    float acc = 0.0f;
    for (int64_t i = 0; i < D; ++i) {
      row[i] += k[i] * u;
      acc += row[i] * q[i];
    }
    o[v] = bf16r(acc);
  }
  store_state(p.state, p.state_dtype, p.state_slot, s, h, D, S);
  float ss = 0.0f;
  for (int64_t i = 0; i < D; ++i) ss += o[i] * o[i];
  const float rstd = 1.0f / std::sqrt(ss / static_cast<float>(D) + p.norm_eps);
  const auto* og = static_cast<const uint16_t*>(p.out_gate) + r * p.og_row + h * D;
  for (int64_t i = 0; i < D; ++i) {
    const float y = o[i] * rstd * p.norm_weight[i] * kda::sigmoid(bfloat16_bits_to_float(og[i]));
    out[i] = float_to_bfloat16_bits(y);
  }
}

}  // namespace

void fused_kda_decode(const FusedKdaParams& p) {
  // Heads in parallel, rows in order (rows sharing a slot meet in one order).
#pragma omp parallel for schedule(dynamic, 1) if (p.H > 1 && p.R >= 2)
  for (int64_t h = 0; h < p.H; ++h) {
    for (int64_t r = 0; r < p.R; ++r) fused_row_head(p, r, h);
  }
}

void recurrent_kda(const KdaParams& p) {
#pragma omp parallel for schedule(dynamic, 1) if (p.HV > 1 && p.num_seqs * p.K * p.K >= 4096)
  for (int64_t hv = 0; hv < p.HV; ++hv) {
    for (int64_t n = 0; n < p.num_seqs; ++n) run_head(p, n, hv);
  }
}

}  // namespace flashinfer::kernels::cpu
