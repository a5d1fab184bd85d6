// CPU reference of fused_qk_rmsnorm_rope: fp32 throughout, as the CUDA kernel computes; sin and
// cos are the C library's (the kernel uses the fast __sincosf), rotation with one fma per output.
#include "kernels/cpu/qk_norm_rope_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "flashinfer/float_formats.h"

namespace flashinfer::kernels::cpu {

float qk_rope_freq(const QkNormRopeParams& p, int64_t i, int* section) {
  // Pair i covers channels (2i, 2i+1); the sections are frame | height | width.
  const int64_t ch = 2 * i;
  int64_t j = i, size = p.frame_ch;
  *section = 0;
  if (ch >= p.frame_ch + p.height_ch) {
    *section = 2;
    j = i - (p.frame_ch + p.height_ch) / 2;
    size = p.width_ch;
  } else if (ch >= p.frame_ch) {
    *section = 1;
    j = i - p.frame_ch / 2;
    size = p.height_ch;
  }
  const float jf = static_cast<float>(j);
  float freq = std::pow(p.base, -2.0f * jf / static_cast<float>(size));
  if (p.factor != 1.0f) {
    // YaRN: interpolate between freq and freq / factor along a ramp over the pair index.
    float high = p.high;
    if (std::fabs(p.low - high) <= 1e-6f) high += 0.001f;
    const float ramp = std::min(std::max((jf - p.low) / (high - p.low), 0.0f), 1.0f);
    const float extrapolation = 1.0f - ramp;
    freq = freq / p.factor * (1.0f - extrapolation) + freq * extrapolation;
  }
  return freq;
}

namespace {

void store(void* out, int64_t idx, float v, bool fp8, float scale) {
  if (fp8) {
    static_cast<uint8_t*>(out)[idx] = float_to_e4m3fn_bits(v * scale, /*saturate=*/true);
  } else {
    static_cast<uint16_t*>(out)[idx] = float_to_bfloat16_bits(v);
  }
}

}  // namespace

void fused_qk_rmsnorm_rope(const QkNormRopeParams& p) {
  const int64_t d = p.d, half = d / 2, row = (p.hq + p.hk + p.hv) * d;
  std::vector<float> freq(static_cast<size_t>(half));
  std::vector<int> section(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    freq[static_cast<size_t>(i)] = qk_rope_freq(p, i, &section[static_cast<size_t>(i)]);
  }
  const bool yarn = p.factor != 1.0f;
#pragma omp parallel for schedule(static) if (p.tokens * row >= (1 << 15))
  for (int64_t t = 0; t < p.tokens; ++t) {
    const uint16_t* in = p.qkv + t * row;
    const int64_t s = t % p.seq_len, hw = p.pph * p.ppw;
    const int64_t pos[3] = {s / hw, (s % hw) / p.ppw, (s % hw) % p.ppw};
    std::vector<float> x;
    for (int part = 0; part < 2; ++part) {
      const int64_t heads = part == 0 ? p.hq : p.hk;
      const uint16_t* src = in + (part == 0 ? 0 : p.hq * d);
      const uint16_t* w = part == 0 ? p.q_weight : p.k_weight;
      void* out = part == 0 ? p.q_out : p.k_out;
      const int64_t n = heads * d;
      x.resize(static_cast<size_t>(n));
      float ss = 0.0f;
      for (int64_t c = 0; c < n; ++c) {
        x[static_cast<size_t>(c)] = bfloat16_bits_to_float(src[c]);
        ss += x[static_cast<size_t>(c)] * x[static_cast<size_t>(c)];
      }
      if (p.norm) {
        const float rcp = 1.0f / std::sqrt(ss / static_cast<float>(n) + p.eps);
        for (int64_t c = 0; c < n; ++c) {
          float v = x[static_cast<size_t>(c)] * rcp * bfloat16_bits_to_float(w[c]);
          // The kernel rounds the normalized values to bf16 unless the output is fp8.
          if (!p.fp8) v = bfloat16_bits_to_float(float_to_bfloat16_bits(v));
          x[static_cast<size_t>(c)] = v;
        }
      }
      for (int64_t h = 0; h < heads; ++h) {
        const float* hx = x.data() + h * d;
        for (int64_t i = 0; i < half; ++i) {
          const int64_t a = p.interleave ? 2 * i : i, b = p.interleave ? 2 * i + 1 : i + half;
          const float theta = static_cast<float>(pos[section[static_cast<size_t>(i)]]) *
                              freq[static_cast<size_t>(i)];
          const float sn = std::sin(theta), cs = std::cos(theta);
          float ya = std::fma(hx[a], cs, -hx[b] * sn);
          float yb = std::fma(hx[b], cs, hx[a] * sn);
          if (yarn) {
            ya *= p.attention_factor;
            yb *= p.attention_factor;
          }
          store(out, t * n + h * d + a, ya, p.fp8, p.out_scale);
          store(out, t * n + h * d + b, yb, p.fp8, p.out_scale);
        }
      }
    }
    const uint16_t* v = in + (p.hq + p.hk) * d;
    const int64_t nv = p.hv * d;
    for (int64_t c = 0; c < nv; ++c) {
      if (p.fp8) {
        store(p.v_out, t * nv + c, bfloat16_bits_to_float(v[c]), true, p.v_scale);
      } else {
        static_cast<uint16_t*>(p.v_out)[t * nv + c] = v[c];
      }
    }
  }
}

}  // namespace flashinfer::kernels::cpu
