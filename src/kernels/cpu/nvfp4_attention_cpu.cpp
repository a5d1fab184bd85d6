#include "kernels/cpu/nvfp4_attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "flashinfer/float_formats.h"
#include "kernels/cpu/elem_io.h"
#include "kernels/nvfp4_attention_rules.h"

namespace flashinfer::kernels::cpu {
namespace {

using elem_io::load_or_fp32;

// rows x cols values (value (r, c) at src[r * rs + c * cs]) quantized along cols into packed
// codes [rows, cols / 2] and swizzled scales of a [rows, cols / 16] matrix; stored row r takes
// source row row_of(r).
template <class RowOf>
void quantize_matrix(const float* src, int64_t rs, int64_t cs, int64_t rows, int64_t cols,
                     uint8_t* packed, uint8_t* scales, RowOf row_of) {
  const int64_t ncols = cols / kNvfp4AttnBlock;
  uint8_t codes[kNvfp4AttnBlock];
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = src + row_of(r) * rs;
    for (int64_t c = 0; c < ncols; ++c) {
      scales[nvfp4_attn_sf_offset(r, c, ncols)] =
          nvfp4_attn_quantize_block(row + c * kNvfp4AttnBlock * cs, cs, codes);
      uint8_t* out = packed + r * (cols / 2) + c * (kNvfp4AttnBlock / 2);
      for (int64_t t = 0; t < kNvfp4AttnBlock / 2; ++t) {
        out[t] = pack_e2m1x2(codes[2 * t], codes[2 * t + 1]);
      }
    }
  }
}

void quantize_head(const Nvfp4AttnQuantParams& p, int64_t bh) {
  const int64_t S = p.S, Sp = p.S_pad, D = p.D;
  const int64_t in = bh * S * D;
  std::vector<float> q(static_cast<size_t>(Sp * D), 0.0f), k(q.size(), 0.0f), v(q.size(), 0.0f);
  for (int64_t i = 0; i < S * D; ++i) {
    q[static_cast<size_t>(i)] = load_or_fp32(p.q, p.dtype, in + i);
    k[static_cast<size_t>(i)] = load_or_fp32(p.k, p.dtype, in + i);
    v[static_cast<size_t>(i)] = load_or_fp32(p.v, p.dtype, in + i);
  }
  // K centred over its S real tokens, in the input dtype (torch's mean: a wide sum, one
  // division, rounded to the dtype; then each difference rounded). Padded rows stay 0.
  for (int64_t d = 0; d < D && S > 0; ++d) {
    double sum = 0.0;
    for (int64_t s = 0; s < S; ++s) sum += k[static_cast<size_t>(s * D + d)];
    const float mean = nvfp4_attn_round(p.dtype, static_cast<float>(sum / static_cast<double>(S)));
    for (int64_t s = 0; s < S; ++s) {
      float& x = k[static_cast<size_t>(s * D + d)];
      x = nvfp4_attn_round(p.dtype, fp32_sub(x, mean));
    }
  }
  // Q centred after padding: per 128-token block (the last block's mean counts its zero rows)
  // or over all S_pad rows.
  const int64_t groups = nvfp4_attn_groups(Sp, p.per_block_mean);
  const int64_t per = p.per_block_mean ? kNvfp4AttnTile : Sp;
  std::vector<float> qm(static_cast<size_t>(groups * D), 0.0f);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t d = 0; d < D; ++d) {
      double sum = 0.0;
      for (int64_t s = g * per; s < (g + 1) * per; ++s) sum += q[static_cast<size_t>(s * D + d)];
      const float mean =
          nvfp4_attn_round(p.dtype, static_cast<float>(sum / static_cast<double>(per)));
      qm[static_cast<size_t>(g * D + d)] = mean;
      for (int64_t s = g * per; s < (g + 1) * per; ++s) {
        float& x = q[static_cast<size_t>(s * D + d)];
        x = nvfp4_attn_round(p.dtype, fp32_sub(x, mean));
      }
    }
  }
  // The correction, an fp32 matmul of the means and the centred K (natural key order): the
  // products exact in fp64, summed over d in order.
  float* corr = p.qk_correction + bh * groups * Sp;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t j = 0; j < Sp; ++j) {
      double acc = 0.0;
      for (int64_t d = 0; d < D; ++d) {
        acc += static_cast<double>(qm[static_cast<size_t>(g * D + d)]) *
               static_cast<double>(k[static_cast<size_t>(j * D + d)]);
      }
      corr[g * Sp + j] = nvfp4_attn_canonical_nan(static_cast<float>(acc));
    }
  }
  const int64_t codes = Sp * D / 2, sfs = Sp * D / kNvfp4AttnBlock;
  auto same = [](int64_t r) { return r; };
  quantize_matrix(q.data(), D, 1, Sp, D, p.q_fp4 + bh * codes, p.q_scale + bh * sfs, same);
  quantize_matrix(k.data(), D, 1, Sp, D, p.k_fp4 + bh * codes, p.k_scale + bh * sfs,
                  [](int64_t r) { return nvfp4_attn_k_permute(r); });
  // V^T: row d holds the tokens, blocks of 16 tokens.
  quantize_matrix(v.data(), 1, D, D, Sp, p.v_fp4_t + bh * codes, p.v_scale_t + bh * sfs, same);
}

// Element (r, c) of one head's packed codes [rows, cols / 2] times its swizzled scale.
float decode(const uint8_t* packed, const uint8_t* scales, int64_t r, int64_t c, int64_t cols) {
  return nvfp4_attn_decode(
      packed + r * (cols / 2),
      scales[nvfp4_attn_sf_offset(r, c / kNvfp4AttnBlock, cols / kNvfp4AttnBlock)], c);
}

void fwd_head(const Nvfp4AttnFwdParams& p, int64_t bh) {
  const int64_t S = p.S, D = p.D, codes = S * D / 2, sfs = S * D / kNvfp4AttnBlock;
  const uint8_t *qp = p.q_fp4 + bh * codes, *kp = p.k_fp4 + bh * codes,
                *vp = p.v_fp4_t + bh * codes;
  const uint8_t *qs = p.q_scale + bh * sfs, *ks = p.k_scale + bh * sfs,
                *vs = p.v_scale_t + bh * sfs;
  // Decoded operands; K in natural token order.
  std::vector<float> q(static_cast<size_t>(S * D)), k(q.size()), vt(q.size());
  for (int64_t i = 0; i < S; ++i) {
    const int64_t stored = nvfp4_attn_k_permute(i);
    for (int64_t d = 0; d < D; ++d) {
      q[static_cast<size_t>(i * D + d)] = decode(qp, qs, i, d, D);
      k[static_cast<size_t>(i * D + d)] = decode(kp, ks, stored, d, D);
    }
  }
  for (int64_t d = 0; d < D; ++d) {
    for (int64_t s = 0; s < S; ++s) vt[static_cast<size_t>(d * S + s)] = decode(vp, vs, d, s, S);
  }
  const int64_t groups = nvfp4_attn_groups(S, p.per_block_mean);
  const float* corr = p.qk_correction + bh * groups * S;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  float sc[kNvfp4AttnTile], pt[kNvfp4AttnTile], pq[kNvfp4AttnTile];
  std::vector<float> o(static_cast<size_t>(D));
  for (int64_t i = 0; i < S; ++i) {
    const float* qi = q.data() + i * D;
    const float* ci = corr + nvfp4_attn_group_of(i, p.per_block_mean) * S;
    const int64_t tiles = p.causal ? i / kNvfp4AttnTile + 1 : S / kNvfp4AttnTile;
    std::fill(o.begin(), o.end(), 0.0f);
    float m = -kInf, sum = 0.0f;
    for (int64_t t = tiles - 1; t >= 0; --t) {  // the kernel's order: the last key tile first
      float tile_max = -kInf;
      for (int64_t c = 0; c < kNvfp4AttnTile; ++c) {
        const int64_t j = t * kNvfp4AttnTile + c;
        sc[c] = -kInf;
        if (p.causal && j > i) continue;
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d) {
          dot +=
              static_cast<double>(qi[d]) * static_cast<double>(k[static_cast<size_t>(j * D + d)]);
        }
        sc[c] = nvfp4_attn_score(ci[j], dot);
        tile_max = std::max(tile_max, sc[c]);
      }
      const float m_new = std::max(m, tile_max);
      if (m != -kInf) {
        const float r = nvfp4_attn_rescale(m, m_new, p.sm_scale);
        sum = fp32_mul(sum, r);
        for (float& x : o) x = fp32_mul(x, r);
      }
      m = m_new;
      for (int64_t c = 0; c < kNvfp4AttnTile; ++c) {
        pt[c] = sc[c] == -kInf ? 0.0f : nvfp4_attn_p(sc[c], m, p.sm_scale);
      }
      for (int64_t c = 0; c < kNvfp4AttnTile; ++c) sum = fp32_add(sum, pt[c]);  // P unquantized
      for (int64_t b0 = 0; b0 < kNvfp4AttnTile; b0 += kNvfp4AttnBlock) {
        nvfp4_attn_quantize_p(pt + b0, pq + b0);
      }
      for (int64_t d = 0; d < D; ++d) {
        const float* vrow = vt.data() + d * S + t * kNvfp4AttnTile;
        double acc = 0.0;
        for (int64_t c = 0; c < kNvfp4AttnTile; ++c) {
          acc += static_cast<double>(pq[c]) * static_cast<double>(vrow[c]);
        }
        o[static_cast<size_t>(d)] = nvfp4_attn_accumulate(o[static_cast<size_t>(d)], acc);
      }
    }
    const bool empty = !(sum > 0.0f);  // 0 or NaN
    const float inv = empty ? 0.0f : fp32_div(1.0f, sum);
    for (int64_t d = 0; d < D; ++d) {
      elem_io::store_or_fp32(p.out, p.out_dtype, (bh * S + i) * D + d,
                             nvfp4_attn_canonical_nan(fp32_mul(o[static_cast<size_t>(d)], inv)));
    }
    // ln sum_j exp(sm_scale s_j): the 2688 of P's range taken back out.
    p.lse[bh * S + i] = empty ? kInf
                              : static_cast<float>(static_cast<double>(m) * p.sm_scale +
                                                   std::log(static_cast<double>(sum)) -
                                                   static_cast<double>(kNvfp4AttnLnPRange));
  }
}

}  // namespace

void nvfp4_attention_quantize_qkv(const Nvfp4AttnQuantParams& p) {
  const int64_t heads = p.B * p.H;
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < heads; ++bh) quantize_head(p, bh);
}

void nvfp4_attention_fwd(const Nvfp4AttnFwdParams& p) {
  const int64_t heads = p.B * p.H;
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < heads; ++bh) fwd_head(p, bh);
}

}  // namespace flashinfer::kernels::cpu
