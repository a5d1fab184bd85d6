#include "kernels/cpu/gdn_cpu.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

#include "flashinfer/float_formats.h"
#include "kernels/cpu/elem_io.h"
#include "kernels/gdn_rules.h"

namespace flashinfer::kernels::cpu {
namespace {

using elem_io::load_or_fp32;
using elem_io::store_or_fp32;

int64_t read_index(const void* p, bool i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

float gate(const GdnGateRef& g, int64_t n, int64_t tok, int64_t h) {
  return load_or_fp32(g.data, g.dtype, n * g.stride_seq + tok * g.stride_tok + h * g.stride_head);
}

// Element (k, v) of state head h in slot `slot`.
int64_t state_offset(const GdnStateRef& s, int64_t slot, int64_t h, int64_t k, int64_t v) {
  return slot * s.stride_slot + h * s.stride_head + k * s.stride_k + v * s.stride_v;
}

// fp32 state rows [V][K] stored to a state tensor (RNE for bf16).
void store_state(const GdnStateRef& s, int64_t slot, int64_t h, const std::vector<float>& S,
                 int64_t K, int64_t V) {
  for (int64_t v = 0; v < V; ++v) {
    for (int64_t k = 0; k < K; ++k) {
      store_or_fp32(s.data, s.dtype, state_offset(s, slot, h, k, v), S[v * K + k]);
    }
  }
}

// A row of K io values as fp32; with `norm`, times rsqrt(sum of squares + 1e-6).
void load_row(const GdnParams& p, const void* base, int64_t off, bool norm,
              std::vector<float>& out) {
  float ss = 0.0f;
  for (int64_t i = 0; i < p.K; ++i) {
    out[i] = gdn::via_bf16(load_or_fp32(base, p.io_dtype, off + i), p.qkv_via_bf16);
    ss += out[i] * out[i];
  }
  if (!norm) return;
  const float inv = gdn::l2_inv_norm(ss);
  for (int64_t i = 0; i < p.K; ++i) out[i] *= inv;
}

void store_out(const GdnParams& p, int64_t off, float o) {
  if (p.out_via_bf16) o = bfloat16_bits_to_float(float_to_bfloat16_bits(o));
  store_or_fp32(p.out, p.out_dtype, off, o);
}

void run_head(const GdnParams& p, int64_t n, int64_t h) {
  const int64_t K = p.K, V = p.V;
  int64_t begin = 0, len = p.T;
  if (p.cu_seqlens) {
    begin = read_index(p.cu_seqlens, p.cu_seqlens_i64, n);
    len = read_index(p.cu_seqlens, p.cu_seqlens_i64, n + 1) - begin;
  }
  const int64_t qh = gdn::source_head(h, p.Hq, p.H), kh = gdn::source_head(h, p.Hk, p.H);
  const int64_t vh = gdn::source_head(h, p.Hv, p.H);
  auto out_off = [&](int64_t t, int64_t v) {
    return n * p.out_stride_seq + (begin + t) * p.out_stride_tok + h * p.out_stride_head + v;
  };

  // Slots: the read slot r (-1: no state read), the final write slot w (-1: none).
  int64_t r = p.read_idx ? read_index(p.read_idx, p.read_idx_i64, n) : n;
  bool skip = false;
  if (r < 0) {
    switch (p.negative_read) {
      case GdnNegativeRead::kSkipZeroOutput:
        for (int64_t t = 0; t < len; ++t) {
          for (int64_t v = 0; v < V; ++v) store_out(p, out_off(t, v), 0.0f);
        }
        skip = true;
        break;
      case GdnNegativeRead::kSkipKeepOutput:
      case GdnNegativeRead::kInvalid:  // refused by the API layer before it gets here
        skip = true;
        break;
      case GdnNegativeRead::kSlotZero:
        r = 0;
        break;
      case GdnNegativeRead::kZeroState:
        break;
    }
  }
  if (skip || len <= 0) return;
  int64_t w = p.write_idx ? read_index(p.write_idx, p.write_idx_i64, n) : r;
  if (w < 0) w = p.negative_write == GdnNegativeWrite::kSlotZero ? 0 : -1;

  std::vector<float> S(static_cast<size_t>(V * K), 0.0f);  // [v][k]
  if (p.state_in.data && r >= 0) {
    for (int64_t v = 0; v < V; ++v) {
      for (int64_t k = 0; k < K; ++k) {
        S[v * K + k] =
            load_or_fp32(p.state_in.data, p.state_in.dtype, state_offset(p.state_in, r, h, k, v));
      }
    }
  }
  std::vector<float> q(static_cast<size_t>(K)), kk(static_cast<size_t>(K));
  for (int64_t t = 0; t < len; ++t) {
    const int64_t tok = begin + t;
    load_row(p, p.q, n * p.q_stride_seq + tok * p.q_stride_tok + qh * p.q_stride_head, p.l2norm, q);
    load_row(p, p.k, n * p.k_stride_seq + tok * p.k_stride_tok + kh * p.k_stride_head, p.l2norm,
             kk);
    if (!p.scale_output) {
      for (int64_t i = 0; i < K; ++i) q[i] *= p.scale;
    }
    float decay = 1.0f, beta = 1.0f;
    if (p.decode_gates) {
      const float dtb = load_or_fp32(p.dt_bias, p.dt_bias_dtype, h);
      decay =
          gdn::decode_decay(gdn::via_bf16(gate(p.a, n, tok, h), p.gates_via_bf16), dtb, p.A_log[h]);
      beta = gdn::decode_beta(gdn::via_bf16(gate(p.b, n, tok, h), p.gates_via_bf16));
    } else {
      if (p.g.data) decay = gate(p.g, n, tok, h);
      if (p.beta.data) beta = gate(p.beta, n, tok, h);
    }
    const int64_t v_off = n * p.v_stride_seq + tok * p.v_stride_tok + vh * p.v_stride_head;
    for (int64_t v = 0; v < V; ++v) {
      float* row = &S[v * K];
      float pred = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        row[k] *= decay;
        pred += row[k] * kk[k];
      }
      const float u =
          (gdn::via_bf16(load_or_fp32(p.v, p.io_dtype, v_off + v), p.qkv_via_bf16) - pred) * beta;
      float o = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        row[k] += kk[k] * u;
        o += row[k] * q[k];
      }
      store_out(p, out_off(t, v), p.scale_output ? o * p.scale : o);
    }
    if (p.intermediates == GdnIntermediates::kBuffer) {
      float* dst = p.inter_buffer + ((n * p.inter_steps + t) * p.H + h) * V * K;
      for (int64_t i = 0; i < V * K; ++i) dst[i] = S[i];
    } else if (p.intermediates == GdnIntermediates::kPool) {
      const int64_t slot = p.step_slots[n * p.T + t];
      if (slot >= 0) store_state(p.state_out, slot, h, S, K, V);
    }
    if (p.checkpoint_every > 0) {
      const int64_t prefix =
          p.checkpoint_prefix ? read_index(p.checkpoint_prefix, p.checkpoint_prefix_i64, n) : 0;
      const int64_t j = gdn::checkpoint_ordinal(prefix, t, p.checkpoint_every);
      if (j >= 0) {
        int64_t row = read_index(p.checkpoint_starts, p.checkpoint_starts_i64, n) + j;
        if (p.checkpoint_slots) row = read_index(p.checkpoint_slots, p.checkpoint_slots_i64, row);
        if (row >= 0) {
          float* dst = p.checkpoints + row * p.checkpoint_row_stride + h * V * K;
          for (int64_t i = 0; i < V * K; ++i) dst[i] = S[i];
        }
      }
    }
  }
  if (p.write_final && w >= 0 && p.state_out.data && p.intermediates != GdnIntermediates::kPool) {
    store_state(p.state_out, w, h, S, K, V);
  }
}

}  // namespace

// Heads in parallel, the sequences of a head in order: requests that share a slot (padding sent
// to slot 0, a write slot another request reads) then meet in one order, call after call, so the
// reference stays deterministic where upstream's kernels leave the result undefined.
void gated_delta_rule(const GdnParams& p) {
#pragma omp parallel for schedule(dynamic, 1) if (p.H > 1 && p.num_seqs * p.K * p.V >= 1024)
  for (int64_t h = 0; h < p.H; ++h) {
    for (int64_t n = 0; n < p.num_seqs; ++n) run_head(p, n, h);
  }
}

void gdn_prefill_prepare(const GdnPrefillPrepParams& p) {
  if (p.l2norm) {
    const int64_t D = p.D;
    auto norm_rows = [&](const void* in, int64_t heads, int64_t st, int64_t sh, void* out) {
#pragma omp parallel for if (p.T * heads * D >= (1 << 16))
      for (int64_t r = 0; r < p.T * heads; ++r) {
        const int64_t off = (r / heads) * st + (r % heads) * sh;
        float ss = 0.0f;
        for (int64_t i = 0; i < D; ++i) {
          const float x = load_or_fp32(in, p.io_dtype, off + i);
          ss += x * x;
        }
        const float inv = gdn::l2_inv_norm(ss);
        for (int64_t i = 0; i < D; ++i) {
          store_or_fp32(out, p.io_dtype, r * D + i, load_or_fp32(in, p.io_dtype, off + i) * inv);
        }
      }
    };
    norm_rows(p.q, p.Hq, p.q_stride_tok, p.q_stride_head, p.q_out);
    norm_rows(p.k, p.Hk, p.k_stride_tok, p.k_stride_head, p.k_out);
  }
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t h = 0; h < p.H; ++h) {
      if (p.g_mode != GdnGateMode::kNone) {
        const float g = gate(p.g, 0, t, h);
        float a = g;
        if (p.g_mode == GdnGateMode::kLog) {
          a = std::exp(g);
        } else if (p.g_mode == GdnGateMode::kRaw) {
          a = gdn::prefill_raw_decay(g, load_or_fp32(p.dt_bias, p.dt_bias_dtype, h),
                                     load_or_fp32(p.A_log, p.A_log_dtype, h));
        }
        p.g_out[t * p.H + h] = a;
      }
      if (p.beta_mode != GdnBetaMode::kNone) {
        float b = gate(p.beta, 0, t, h);
        if (p.beta_mode == GdnBetaMode::kLogit) {
          // Rounded to beta's own dtype: a store and a load through it (fp32: as is).
          uint32_t bits = 0;
          store_or_fp32(&bits, p.beta.dtype, 0, gdn::decode_beta(b));
          b = load_or_fp32(&bits, p.beta.dtype, 0);
        }
        p.beta_out[t * p.H + h] = b;
      }
    }
  }
}

void gdn_fused_decode_prologue(const GdnFusedPrologueParams& p) {
  auto f = [](uint16_t bits) { return bfloat16_bits_to_float(bits); };
  auto bf = [](float x) { return float_to_bfloat16_bits(x); };
#pragma omp parallel for if (p.B * p.hidden * p.n_ba >= (1 << 16))
  for (int64_t b = 0; b < p.B; ++b) {
    const uint16_t* x = p.hidden_states + b * p.hs_stride_b;
    for (int64_t j = 0; j < p.n_ba; ++j) {
      float acc = 0.0f;
      for (int64_t i = 0; i < p.hidden; ++i) {
        acc += f(x[i]) * f(p.w_ba[i * p.w_stride_i + j * p.w_stride_j]);
      }
      p.ba[b * p.n_ba + j] = bf(acc);
    }
  }
  const int64_t S = p.width - 1;  // the state's time steps
  // Every output from the pool as it was (upstream gathers the rows before it writes any).
#pragma omp parallel for if (p.B * p.qkv_dim >= (1 << 14))
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t slot = read_index(p.state_indices, p.indices_i64, b);
    for (int64_t c = 0; c < p.qkv_dim; ++c) {
      const uint16_t* st = p.conv_state + slot * p.cs_stride_p + c * p.cs_stride_c;
      float y = 0.0f;
      for (int64_t j = 0; j < S; ++j)
        y += f(st[j * p.cs_stride_t]) * f(p.conv_weight[c * p.cw_stride_c + j * p.cw_stride_j]);
      y += f(p.mixed_qkv[b * p.x_stride_b + c * p.x_stride_c]) *
           f(p.conv_weight[c * p.cw_stride_c + S * p.cw_stride_j]);
      y += f(p.conv_bias[c * p.cb_stride]);
      p.conv_out[b * p.qkv_dim + c] = bf(gdn::conv_silu(y));
    }
  }
  // Then the windows: a slot's row gets its last request's window, shifted from the row as it
  // was (index_copy_ of windows gathered before the call wrote anything).
  std::map<int64_t, int64_t> last;  // slot -> its last request
  for (int64_t b = 0; b < p.B; ++b) last[read_index(p.state_indices, p.indices_i64, b)] = b;
  for (const auto& [slot, b] : last) {
    for (int64_t c = 0; c < p.qkv_dim; ++c) {
      uint16_t* st = p.conv_state + slot * p.cs_stride_p + c * p.cs_stride_c;
      for (int64_t j = 0; j + 1 < S; ++j) st[j * p.cs_stride_t] = st[(j + 1) * p.cs_stride_t];
      if (S > 0) st[(S - 1) * p.cs_stride_t] = p.mixed_qkv[b * p.x_stride_b + c * p.x_stride_c];
    }
  }
}

}  // namespace flashinfer::kernels::cpu
