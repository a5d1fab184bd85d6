// CPU reference of CuteDslMoEWrapper's quant_mode "w4a16" (docs/MOE.md, "CuteDslMoEWrapper:
// w4a16"). The SM100 kernel decodes each e2m1 weight times its e4m3 scale to bf16 (exact: at most
// 6 significant bits) and runs bf16 MMAs with fp32 accumulation; we sum the exact products in
// double and round the sum to fp32 once.
#include "kernels/cpu/moe_cute_w4a16_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "flashinfer/float_formats.h"

namespace flashinfer::kernels::cpu {
namespace {

float bf16_round(float v) { return bfloat16_bits_to_float(float_to_bfloat16_bits(v)); }

// Row r of a packed NVFP4 matrix [rows, cols] with linear block-16 scales, decoded; scales below
// `flush` count as zero (b12x; 0 elsewhere).
void decode_row(const uint8_t* w, const uint8_t* s, int64_t r, int64_t cols, float* dst,
                float flush) {
  const uint8_t* row = w + r * (cols / 2);
  const uint8_t* sr = s + r * (cols / 16);
  for (int64_t c = 0; c < cols; ++c) {
    const uint8_t b = row[c / 2];
    const float sc = e4m3fn_bits_to_float(sr[c / 16]);
    dst[c] = e2m1_bits_to_float(c % 2 == 0 ? (b & 0xF) : (b >> 4)) * (sc < flush ? 0.0f : sc);
  }
}

// b12x's weight prepare (_nvfp4_compute_scale_factor, _process_nvfp4_packed_scales): all scales
// of a matrix (every expert) are multiplied by f = 2^floor(log2(448 / max)) (1 when the max is 0
// or 448), then a scale whose product is an e4m3 subnormal (< 2^-6) becomes 0: the threshold on
// the unscaled scale is 2^-6 / f.
float b12x_flush_threshold(const uint8_t* s, int64_t n) {
  float mx = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = e4m3fn_bits_to_float(s[i]);
    if (v > mx) mx = v;  // NaN codes never win
  }
  float f = 1.0f;
  if (mx > 0.0f && mx < 448.0f) f = std::exp2(std::floor(std::log2(448.0f / mx)));
  return 0.015625f / f;
}

// The kernel's fmin(..., nan=True): a NaN operand gives NaN (std::fmin would drop it).
float fmin_nan(float a, float b) { return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b); }

float dot(const float* a, const float* b, int64_t n) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return static_cast<float>(acc);
}

}  // namespace

void cute_w4a16_moe(const CuteW4a16MoeParams& p) {
  const int64_t T = p.num_tokens, K = p.top_k, H = p.hidden, I = p.inter;
  const int64_t El = p.num_local_experts, N1 = p.gated ? 2 * I : I;
  // Decoded weights per local expert, built on first use.
  std::vector<std::vector<float>> w1d(static_cast<size_t>(El)), w2d(static_cast<size_t>(El));
  const float flush1 = p.b12x ? b12x_flush_threshold(p.s1, El * N1 * (H / 16)) : 0.0f;
  const float flush2 = p.b12x ? b12x_flush_threshold(p.s2, El * H * (I / 16)) : 0.0f;
  auto weights = [&](int64_t e) {
    auto& a = w1d[static_cast<size_t>(e)];
    auto& b = w2d[static_cast<size_t>(e)];
    if (a.empty()) {
      a.resize(static_cast<size_t>(N1 * H));
      b.resize(static_cast<size_t>(H * I));
      for (int64_t r = 0; r < N1; ++r) {
        decode_row(p.w1 + e * N1 * (H / 2), p.s1 + e * N1 * (H / 16), r, H, &a[r * H], flush1);
      }
      for (int64_t r = 0; r < H; ++r) {
        decode_row(p.w2 + e * H * (I / 2), p.s2 + e * H * (I / 16), r, I, &b[r * I], flush2);
      }
    }
  };
  std::vector<float> x(static_cast<size_t>(H)), h(static_cast<size_t>(I)),
      acc(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t d = 0; d < H; ++d) x[d] = bfloat16_bits_to_float(p.x[t * p.x_stride + d]);
    // Fused finalize: bf16 reduce-adds into a zeroed bf16 output (their order is not defined
    // on the GPU; k order here). Two-stage finalize: fp32 FMAs in ascending k, rounded once.
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = p.ids[t * p.routed_stride + k] - p.expert_offset;
      if (e < 0 || e >= El) continue;
      weights(e);
      const float* W1 = w1d[static_cast<size_t>(e)].data();
      const float* W2 = w2d[static_cast<size_t>(e)].data();
      const float a1 = p.alpha1[e], a2 = p.alpha2[e];
      // GEMM1 epilogue: alpha times the accumulator, the activation in fp32, bf16 into the
      // intermediate buffer.
      for (int64_t j = 0; j < I; ++j) {
        if (p.b12x) {
          // b12x: GEMM1 stored as bf16(alpha1 * acc), the activation pass reads those values.
          if (p.gated) {
            const float up = bf16_round(a1 * dot(W1 + j * H, x.data(), H));
            const float gate = bf16_round(a1 * dot(W1 + (I + j) * H, x.data(), H));
            h[j] = bf16_round(bf16_round(gate / (1.0f + std::exp(-gate))) * up);
          } else {
            const float v = std::max(bf16_round(a1 * dot(W1 + j * H, x.data(), H)), 0.0f);
            h[j] = bf16_round(v * v);
          }
          continue;
        }
        if (p.gated) {
          float up = a1 * dot(W1 + j * H, x.data(), H);
          float gate = a1 * dot(W1 + (I + j) * H, x.data(), H);
          if (p.geglu_tanh) {
            const float z = 0.7978845608028654f * (gate + 0.044715f * gate * gate * gate);
            h[j] = bf16_round(up * (0.5f * gate * (1.0f + std::tanh(z))));
            continue;
          }
          if (p.situ) {
            const float g = p.situ_beta * std::tanh(gate / p.situ_beta) / (1.0f + std::exp(-gate));
            if (p.situ_linear) up = p.situ_linear_beta * std::tanh(up / p.situ_linear_beta);
            h[j] = bf16_round(up * g);
            continue;
          }
          if (p.parameterized_swiglu) {
            gate = fmin_nan(gate, p.swiglu_limit);
            up = -fmin_nan(-fmin_nan(up, p.swiglu_limit), p.swiglu_limit);
          }
          const float sig = 1.0f / (1.0f + std::exp(-p.swiglu_alpha * gate));
          if (p.parameterized_swiglu) up += p.swiglu_beta;
          h[j] = bf16_round(up * (gate * sig));
        } else {
          const float v = std::max(a1 * dot(W1 + j * H, x.data(), H), 0.0f);
          h[j] = bf16_round(v * v);
        }
      }
      const float s = p.scales[t * p.routed_stride + k];
      const float fused_scale = a2 * s;
      for (int64_t d = 0; d < H; ++d) {
        const float y = dot(W2 + d * I, h.data(), I);
        if (p.b12x) {
          const float term = bf16_round(bf16_round(y) * bf16_round(s * a2));
          acc[d] = p.fused_finalize ? bf16_round(acc[d] + term) : acc[d] + term;
        } else if (p.fused_finalize) {
          acc[d] = bf16_round(acc[d] + bf16_round(fused_scale * y));
        } else {
          acc[d] = std::fma(bf16_round(a2 * y), s, acc[d]);
        }
      }
    }
    for (int64_t d = 0; d < H; ++d) p.out[t * p.out_stride + d] = float_to_bfloat16_bits(acc[d]);
  }
}

}  // namespace flashinfer::kernels::cpu
