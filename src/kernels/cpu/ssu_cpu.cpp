#include "kernels/cpu/ssu_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "flashinfer/float_formats.h"
#include "kernels/cpu/elem_io.h"
#include "kernels/ssu_rules.h"

namespace flashinfer::kernels::cpu {
namespace {

using elem_io::load_or_fp32;
using elem_io::store_or_fp32;

float load_io(const SsuIoRef& r, DType dt, int64_t s, int64_t t, int64_t h, int64_t i) {
  return load_or_fp32(r.data, dt, s * r.seq + t * r.tok + h * r.head + i);
}

// One fp32 row stored in the state dtype at element `off` of `base`: nearest-even; fp16 rounded
// stochastically when seeded (random bits keyed by the row's offset in the read slot, sr_base);
// int16 encoded with the row's scale, whose decode factor goes to *scale.
void store_row(const SsuParams& p, void* base, int64_t off, float* scale, const float* row,
               uint64_t sr_base) {
  const int64_t n_all = p.dstate;
  if (ssu::is_scaled(p.state_dtype)) {
    float amax = 0.0f;
    for (int64_t n = 0; n < n_all; ++n) amax = std::fmax(amax, std::fabs(row[n]));
    const float enc = ssu::scaled_encode(p.state_dtype, amax);
    for (int64_t n = 0; n < n_all; ++n)
      ssu::scaled_store(base, p.state_dtype, off + n, row[n], enc);
    *scale = 1.0f / enc;
    return;
  }
  if (p.state_dtype == DType::kFloat16 && p.rand_seed) {
    auto* dst = static_cast<uint16_t*>(base) + off;
    for (int64_t n = 0; n < n_all; n += 2) {
      const uint32_t w = ssu::sr_word(*p.rand_seed, p.philox_rounds, sr_base + n);
      dst[n] = ssu::f16_stochastic_bits(row[n], ssu::sr_bits(w, n));
      if (n + 1 < n_all) dst[n + 1] = ssu::f16_stochastic_bits(row[n + 1], ssu::sr_bits(w, n + 1));
    }
    return;
  }
  for (int64_t n = 0; n < n_all; ++n) store_or_fp32(base, p.state_dtype, off + n, row[n]);
}

bool valid_slot(const SsuParams& p, int64_t slot) { return slot >= 0 && slot < p.slots; }

// Sequence s's tokens: [begin, begin + len) of row `seq` (varlen: the packed row 0, at most T).
struct SeqRange {
  int64_t begin = 0, len = 0, seq = 0;
};
SeqRange seq_range(const SsuParams& p, int64_t s) {
  if (!p.cu_seqlens) return {0, p.T, s};
  const int64_t begin = ssu::load_index(p.cu_seqlens, p.cu_seqlens_i64, s);
  return {begin, std::min(ssu::load_index(p.cu_seqlens, p.cu_seqlens_i64, s + 1) - begin, p.T), 0};
}

// Head h's [dim, dstate] state of `slot` in fp32 (scaled states times their row scales).
void load_slot(const SsuParams& p, int64_t slot, int64_t h, std::vector<float>& S) {
  const int64_t dim = p.dim, ds = p.dstate, base = slot * p.state_stride_slot + h * dim * ds;
  for (int64_t d = 0; d < dim; ++d) {
    const float sc = p.state_scale ? p.state_scale[slot * p.scale_stride_slot + h * dim + d] : 1.0f;
    for (int64_t n = 0; n < ds; ++n) {
      const int64_t i = base + d * ds + n;
      S[d * ds + n] = ssu::is_scaled(p.state_dtype)
                          ? ssu::scaled_load(p.state, p.state_dtype, i) * sc
                          : load_or_fp32(p.state, p.state_dtype, i);
    }
  }
}

// S stored to head h of `slot` (and its row scales), stochastic bits keyed by read slot `src`.
void store_slot(const SsuParams& p, int64_t slot, int64_t src, int64_t h,
                const std::vector<float>& S) {
  const int64_t dim = p.dim, ds = p.dstate;
  for (int64_t d = 0; d < dim; ++d) {
    float* scale =
        p.state_scale ? p.state_scale + slot * p.scale_stride_slot + h * dim + d : nullptr;
    store_row(p, p.state, slot * p.state_stride_slot + (h * dim + d) * ds, scale, &S[d * ds],
              static_cast<uint64_t>(src * p.state_stride_slot + (h * dim + d) * ds));
  }
}

// One token of head h (group g) on S: the update and the gated output row. Returns the token's
// processed dt. Bv / Cv are scratch rows of dstate.
float token_step(const SsuParams& p, int64_t seq, int64_t tok, int64_t h, int64_t g, float A,
                 float Dv, float bias, std::vector<float>& S, std::vector<float>& Bv,
                 std::vector<float>& Cv) {
  const int64_t ds = p.dstate;
  float dt = load_io(p.dt, p.dt_dtype, seq, tok, h, 0) + bias;
  if (p.dt_softplus) dt = ssu::softplus(dt);
  const float dA = std::exp(A * dt);
  for (int64_t n = 0; n < ds; ++n) {
    Bv[n] = load_io(p.B, p.io_dtype, seq, tok, g, n);
    Cv[n] = load_io(p.C, p.io_dtype, seq, tok, g, n);
  }
  for (int64_t d = 0; d < p.dim; ++d) {
    const float x = load_io(p.x, p.io_dtype, seq, tok, h, d);
    float* row = &S[d * ds];
    float y = Dv * x;
    for (int64_t n = 0; n < ds; ++n) {
      row[n] = row[n] * dA + (Bv[n] * dt) * x;
      y += row[n] * Cv[n];
    }
    if (p.z.data) y = ssu::gate(y, load_io(p.z, p.io_dtype, seq, tok, h, d));
    store_or_fp32(p.out, p.io_dtype, seq * p.out_seq + tok * p.out_tok + h * p.out_head + d, y);
  }
  return dt;
}

void run_head(const SsuParams& p, int64_t s, int64_t h) {
  const int64_t dim = p.dim, ds = p.dstate;
  const auto [begin, len, seq] = seq_range(p, s);
  if (len <= 0) return;
  int64_t init = 0;
  if (p.num_accepted) {
    init = std::max<int64_t>(ssu::load_index(p.num_accepted, p.num_accepted_i64, s) - 1, 0);
  }
  const int64_t src =
      p.src_idx ? ssu::load_index(p.src_idx, p.idx_i64, s * p.src_stride0 + init * p.src_stride1)
                : s;
  const bool pad = src == p.pad_slot_id;
  const int64_t g = h / (p.nheads / p.ngroups);

  // The head's [dim, dstate] state in fp32 (zeros for padding).
  std::vector<float> S(static_cast<size_t>(dim * ds), 0.0f);
  if (!pad) load_slot(p, src, h, S);
  auto sr_base = [&](int64_t d) {
    return static_cast<uint64_t>(src * p.state_stride_slot + (h * dim + d) * ds);
  };

  const float A = p.A[h * p.A_stride];
  const float Dv = p.D ? load_or_fp32(p.D, p.w_dtype, h * p.D_stride) : 0.0f;
  const float bias = p.dt_bias ? load_or_fp32(p.dt_bias, p.w_dtype, h * p.dt_bias_stride) : 0.0f;
  std::vector<float> Bv(static_cast<size_t>(ds)), Cv(static_cast<size_t>(ds));
  for (int64_t t = 0; t < len; ++t) {
    (void)token_step(p, seq, begin + t, h, g, A, Dv, bias, S, Bv, Cv);
    if (!p.multi_token || pad) continue;
    if (p.dst_idx) {
      const int64_t dst =
          ssu::load_index(p.dst_idx, p.idx_i64, s * p.dst_stride0 + t * p.dst_stride1);
      if (dst != p.pad_slot_id && valid_slot(p, dst)) store_slot(p, dst, src, h, S);
    } else if (p.inter) {
      const int64_t e = p.inter_idx ? ssu::load_index(p.inter_idx, p.idx_i64, s) : src;
      if (e < 0 || e >= p.inter_entries || t >= p.inter_steps) continue;
      for (int64_t d = 0; d < dim; ++d) {
        const int64_t r = ((e * p.inter_steps + t) * p.nheads + h) * dim + d;
        store_row(p, p.inter, r * ds, p.inter_scales ? p.inter_scales + r : nullptr, &S[d * ds],
                  sr_base(d));
      }
    }
  }
  // The final state: STP to its dst slot (or the read slot); MTP / varlen without per-step dst
  // slots back to the read slot.
  if (pad || !p.update_state || (p.multi_token && p.dst_idx)) return;
  const int64_t dst =
      !p.multi_token && p.dst_idx ? ssu::load_index(p.dst_idx, p.idx_i64, s * p.dst_stride0) : src;
  if (dst == p.pad_slot_id || !valid_slot(p, dst)) return;
  store_slot(p, dst, src, h, S);
}

// checkpointing_ssu for one batch row and head (kernels/ssu_params.h, CkptSsuParams).
void run_ckpt_head(const CkptSsuParams& c, int64_t b, int64_t h) {
  const SsuParams& p = c.ssu;
  const int64_t dim = p.dim, ds = p.dstate;
  const int64_t slot = p.src_idx ? ssu::load_index(p.src_idx, p.idx_i64, b * p.src_stride0) : b;
  if (slot == p.pad_slot_id) return;  // padding: nothing read, computed or written
  const auto [begin, len, seq] = seq_range(p, b);
  if (len <= 0) return;
  const int64_t g = h / (p.nheads / p.ngroups);
  const int64_t r0 = c.ring_start[slot], pn = c.pnat[slot];
  std::vector<float> S(static_cast<size_t>(dim * ds));
  load_slot(p, slot, h, S);
  const float A = p.A[h * p.A_stride];
  // The history: the checkpoint advanced by the pnat ring rows (their dt already processed).
  for (int64_t i = 0; i < pn; ++i) {
    const int64_t row = (r0 + i) % c.L;
    const float dt = c.dt_cache[slot * c.dc_slot + h * c.dc_head + row];
    const float dA = std::exp(A * dt);
    const int64_t xo = slot * c.xc_slot + h * c.xc_head + row * c.xc_row;
    const int64_t bo = slot * c.bc_slot + g * c.bc_group + row * c.bc_row;
    for (int64_t d = 0; d < dim; ++d) {
      const float x = load_or_fp32(c.x_cache, p.io_dtype, xo + d);
      for (int64_t n = 0; n < ds; ++n) {
        float& v = S[d * ds + n];
        v = v * dA + (load_or_fp32(c.B_cache, p.io_dtype, bo + n) * dt) * x;
      }
    }
  }
  // A flush stores the replayed state (not this call's tokens), rounded to the state dtype.
  if (pn + len > c.W) store_slot(p, slot, slot, h, S);
  const float Dv = p.D ? load_or_fp32(p.D, p.w_dtype, h * p.D_stride) : 0.0f;
  const float bias = p.dt_bias ? load_or_fp32(p.dt_bias, p.w_dtype, h * p.dt_bias_stride) : 0.0f;
  const size_t esize = dtype_size(p.io_dtype);
  std::vector<float> Bv(static_cast<size_t>(ds)), Cv(static_cast<size_t>(ds));
  for (int64_t t = 0; t < len; ++t) {
    const int64_t tok = begin + t;
    const float dt = token_step(p, seq, tok, h, g, A, Dv, bias, S, Bv, Cv);
    // The append: x (and, once per group, B) copied bit for bit, the processed dt.
    const int64_t row = (r0 + pn + t) % c.L;
    const auto* xs = static_cast<const char*>(p.x.data) +
                     (seq * p.x.seq + tok * p.x.tok + h * p.x.head) * static_cast<int64_t>(esize);
    std::memcpy(
        static_cast<char*>(c.x_cache) +
            (slot * c.xc_slot + h * c.xc_head + row * c.xc_row) * static_cast<int64_t>(esize),
        xs, esize * static_cast<size_t>(dim));
    c.dt_cache[slot * c.dc_slot + h * c.dc_head + row] = dt;
    if (h % (p.nheads / p.ngroups) == 0) {
      const auto* bs = static_cast<const char*>(p.B.data) +
                       (seq * p.B.seq + tok * p.B.tok + g * p.B.head) * static_cast<int64_t>(esize);
      std::memcpy(
          static_cast<char*>(c.B_cache) +
              (slot * c.bc_slot + g * c.bc_group + row * c.bc_row) * static_cast<int64_t>(esize),
          bs, esize * static_cast<size_t>(ds));
    }
  }
}

}  // namespace

void checkpointing_ssu(const CkptSsuParams& c) {
  const SsuParams& p = c.ssu;
#pragma omp parallel for schedule(dynamic, \
                                  1) if (p.nheads > 1 && p.num_seqs * p.dim * p.dstate >= 4096)
  for (int64_t h = 0; h < p.nheads; ++h) {
    for (int64_t b = 0; b < p.num_seqs; ++b) run_ckpt_head(c, b, h);
  }
}

void selective_state_update(const SsuParams& p) {
#pragma omp parallel for schedule(dynamic, \
                                  1) if (p.nheads > 1 && p.num_seqs * p.dim * p.dstate >= 4096)
  for (int64_t h = 0; h < p.nheads; ++h) {
    for (int64_t s = 0; s < p.num_seqs; ++s) run_head(p, s, h);
  }
}

}  // namespace flashinfer::kernels::cpu
