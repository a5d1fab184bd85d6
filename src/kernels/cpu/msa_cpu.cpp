#include "kernels/cpu/msa_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "flashinfer/float_formats.h"
#include "kernels/cpu/elem_io.h"
#include "kernels/quantization_params.h"

namespace flashinfer::kernels::cpu {
namespace {

// Upstream's ranking key: ascending key = descending score, a total order over the float bits
// (+NaN, +inf, positives descending, +0, -0, negatives towards -inf, -NaN).
uint32_t score_key(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return (b >> 31) == 0 ? (~b) & 0x7FFFFFFFu : b;
}

// Request b's rows and keys, shared by the proxy and the attention params: its first query row q0,
// seqlen_q, seqlen_k, and the position of its first query (q_offset or bottom-right).
struct MsaBatch {
  int64_t q0, sq, sk, off;
};
template <class P>
MsaBatch batch_of(const P& p, int64_t b) {
  const int64_t q0 = p.cu_q[b], sq = p.cu_q[b + 1] - q0;
  const int64_t sk = p.cu_k ? p.cu_k[b + 1] - p.cu_k[b] : p.seqused_k[b];
  return {q0, sq, sk, p.q_offset_scalar ? p.q_offset_value : p.q_offset ? p.q_offset[b] : sk - sq};
}

// The element offset of key j of request b, kv head kh: a flat row from cu_k, or row j % 128 of
// page page_table[b, j / 128] (strides of the key tensor: row, head, page).
template <class P>
int64_t key_offset(const P& p, int64_t b, int64_t j, int64_t kh, int64_t s_row, int64_t s_h,
                   int64_t s_page) {
  if (p.cu_k) return (p.cu_k[b] + j) * s_row + kh * s_h;
  const int64_t page = p.page_table[b * p.page_stride + j / kMsaTile];
  return page * s_page + kh * s_h + (j % kMsaTile) * s_row;
}

}  // namespace

void msa_topk_select(const MsaTopkParams& p) {
#pragma omp parallel for schedule(static) if (p.S * p.H * p.P >= (1 << 14))
  for (int64_t s = 0; s < p.S; ++s) {
    std::vector<std::pair<uint32_t, int64_t>> middle;
    std::vector<int32_t> picked;
    for (int64_t h = 0; h < p.H; ++h) {
      const int64_t n = p.nvp ? std::clamp<int64_t>(p.nvp[s], 0, p.P) : p.nvp_value;
      const int64_t fb = std::min(p.force_begin, n);
      const int64_t fe = std::min(p.force_end, n - fb);
      const int64_t target = kMsaTopk - fb - fe;
      picked.clear();
      for (int64_t b = 0; b < fb; ++b) picked.push_back(static_cast<int32_t>(b));
      for (int64_t b = n - fe; b < n; ++b) picked.push_back(static_cast<int32_t>(b));
      middle.clear();
      for (int64_t b = fb; b < n - fe; ++b) {
        middle.emplace_back(score_key(p.scores[(h * p.P + b) * p.S + s]), b);
      }
      // (key, tile) ascending: the better score first, ties to the lower tile.
      const auto take = std::min<int64_t>(target, static_cast<int64_t>(middle.size()));
      std::partial_sort(middle.begin(), middle.begin() + take, middle.end());
      for (int64_t i = 0; i < take; ++i) picked.push_back(static_cast<int32_t>(middle[i].second));
      std::sort(picked.begin(), picked.end());
      int32_t* o = p.out + (s * p.H + h) * kMsaTopk;
      for (int64_t i = 0; i < kMsaTopk; ++i) {
        o[i] = i < static_cast<int64_t>(picked.size()) ? picked[i] : -1;
      }
    }
  }
}

void msa_proxy_score(const MsaProxyParams& p) {
  const int64_t G = p.Hq / p.Hkv, H_out = p.reduce_heads ? 1 : p.Hq;
  const float ninf = -std::numeric_limits<float>::infinity();
  std::fill(p.out, p.out + H_out * p.tiles * p.total_q, ninf);
  for (int64_t b = 0; b < p.B; ++b) {
    const MsaBatch bt = batch_of(p, b);  // named: OpenMP regions cannot use structured bindings
    const int64_t q0 = bt.q0, sq = bt.sq, sk = bt.sk, off = bt.off;
    auto key_ptr = [&](int64_t j, int64_t kh) {
      return key_offset(p, b, j, kh, p.k_stride_row, p.k_stride_h, p.k_stride_page);
    };
    // fp4: key j's scale row, token * Hkv + head (flat) or (page * Hkv + head) * 128 + row: the
    // element offset of a [rows, Hkv, 1] (flat) or [pages, Hkv, 128, 1] (paged) tensor.
    auto key_sf_row = [&](int64_t j, int64_t kh) {
      return key_offset(p, b, j, kh, p.cu_k ? p.Hkv : 1, p.cu_k ? 1 : kMsaTile, p.Hkv * kMsaTile);
    };
    // 128 values of a row: decoded elements, or (fp4) e2m1 codes times their block's e4m3 scale.
    auto load_row = [&](const void* base, DType dt, int64_t off, const uint8_t* sf, int64_t row,
                        float* out) {
      if (!p.fp4) {
        for (int64_t d = 0; d < kMsaTile; ++d) out[d] = elem_io::load_or_fp32(base, dt, off + d);
        return;
      }
      const auto* bytes = static_cast<const uint8_t*>(base) + off;
      for (int64_t d = 0; d < kMsaTile; ++d) {
        const uint8_t byte = bytes[d / 2];
        const float e = e2m1_bits_to_float(d % 2 == 0 ? e2m1x2_low(byte) : e2m1x2_high(byte));
        out[d] = e * e4m3fn_bits_to_float(
                         sf[sf_offset(SfLayoutCode::k128x4, row, d / 16, kMsaTile / 16)]);
      }
    };
    const int64_t rows = std::min(sq, p.max_seqlen_q);
#pragma omp parallel for collapse(2) schedule(static) if (rows * p.Hq * sk >= (1 << 12))
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t h = 0; h < p.Hq; ++h) {
        float qv[kMsaTile], kv[kMsaTile];
        load_row(p.q, p.q_dtype, (q0 + i) * p.q_stride_t + h * p.q_stride_h, p.q_sf,
                 (q0 + i) * p.Hq + h, qv);
        const int64_t limit = p.causal ? std::min(i + off + 1, sk) : sk;
        for (int64_t t = 0; t < p.tiles; ++t) {
          const int64_t j1 = std::min(limit, (t + 1) * kMsaTile);
          float best = ninf;
          for (int64_t j = t * kMsaTile; j < j1; ++j) {
            load_row(p.k, p.k_dtype, key_ptr(j, h / G), p.k_sf, p.fp4 ? key_sf_row(j, h / G) : 0,
                     kv);
            float acc = 0.0f;
            for (int64_t d = 0; d < kMsaTile; ++d) acc += qv[d] * kv[d];
            best = std::max(best, acc);
          }
          if (p.fp4) best *= p.fp4_global;  // upstream scales the tile result when it stores it
          float& o = p.out[((p.reduce_heads ? 0 : h) * p.tiles + t) * p.total_q + q0 + i];
          if (p.reduce_heads) {
#pragma omp critical(msa_proxy_reduce)
            o = std::max(o, best);
          } else {
            o = best;
          }
        }
      }
    }
  }
}

void msa_sparse_attention(const MsaAttnParams& p) {
  const int64_t G = p.Hq / p.Hkv;
  const double ninf = -std::numeric_limits<double>::infinity();
  for (int64_t b = 0; b < p.B; ++b) {
    const MsaBatch bt = batch_of(p, b);  // named: OpenMP regions cannot use structured bindings
    const int64_t q0 = bt.q0, sq = bt.sq, sk = bt.sk, off = bt.off;
    auto row_of = [&](int64_t j, int64_t kh) {  // key j's offset, and value j's
      return key_offset(p, b, j, kh, p.kv_stride_row, p.kv_stride_h, p.kv_stride_page);
    };
#pragma omp parallel for collapse(2) schedule(dynamic, 4) if (sq * p.Hq >= 4)
    for (int64_t i = 0; i < sq; ++i) {
      for (int64_t h = 0; h < p.Hq; ++h) {
        const int64_t qi = q0 + i, kh = h / G;
        float qv[kMsaTile];
        for (int64_t d = 0; d < kMsaTile; ++d) {
          qv[d] = elem_io::load_or_fp32(p.q, p.q_dtype, qi * p.q_stride_t + h * p.q_stride_h + d);
        }
        const int64_t limit = p.causal ? std::min(sk, off + i + 1) : sk;
        std::vector<int64_t> keys;
        std::vector<double> s;
        const int32_t* list = p.q2k + (kh * p.total_q + qi) * p.topk;
        for (int64_t e = 0; e < p.topk && list[e] >= 0; ++e) {
          for (int64_t j = list[e] * kMsaTile; j < std::min(limit, (list[e] + 1) * kMsaTile); ++j) {
            const int64_t ko = row_of(j, kh);
            float acc = 0.0f;
            for (int64_t d = 0; d < kMsaTile; ++d) {
              acc += qv[d] * elem_io::load_or_fp32(p.k, p.kv_dtype, ko + d);
            }
            keys.push_back(j);
            s.push_back(static_cast<double>(p.scale) * acc);
          }
        }
        double acc_o[kMsaTile] = {};
        double lse = ninf, lse_t = ninf;
        if (!keys.empty()) {
          const double m = *std::max_element(s.begin(), s.end());
          double sum = 0.0, sum_t = 0.0;
          for (size_t n = 0; n < keys.size(); ++n) {
            const double w = std::exp(s[n] - m);
            sum += w;
            sum_t += std::exp(p.temperature * (s[n] - m));
            const int64_t vo = row_of(keys[n], kh);
            for (int64_t d = 0; d < kMsaTile; ++d) {
              acc_o[d] += w * elem_io::load_or_fp32(p.v, p.kv_dtype, vo + d);
            }
          }
          for (double& x : acc_o) x = x / sum * p.v_global_scale;
          lse = m + std::log(sum);
          lse_t = p.temperature * m + std::log(sum_t);
        }
        for (int64_t d = 0; d < kMsaTile; ++d) {
          elem_io::store_or_fp32(p.out, p.out_dtype, (qi * p.Hq + h) * kMsaTile + d,
                                 static_cast<float>(acc_o[d]));
        }
        if (p.lse) p.lse[qi * p.Hq + h] = static_cast<float>(lse);
        if (p.lse_t) p.lse_t[qi * p.Hq + h] = static_cast<float>(lse_t);
      }
    }
  }
}

}  // namespace flashinfer::kernels::cpu
