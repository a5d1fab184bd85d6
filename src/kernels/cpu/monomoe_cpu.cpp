// The CPU reference of mono_moe: upstream's five phases (routing, the input's 1 x 128
// quantization, up projection with SiLU and the routing weight, the intermediate's 64-wide
// re-quantization, down projection) and the combine in the fixed order the CUDA kernels use:
// kernels/monomoe_params.h holds every rounding step both share.
#include "kernels/cpu/monomoe_cpu.h"

#include <array>
#include <cstdint>
#include <vector>

#include "flashinfer/float_formats.h"

namespace flashinfer::kernels::cpu {
namespace {

using P = MonoMoeParams;

struct Fixed8 {  // every e4m3 code as a fixed-point integer, and whether it is NaN
  std::array<int32_t, 256> v{};
  std::array<bool, 256> nan{};
  Fixed8() {
    for (int c = 0; c < 256; ++c) {
      v[c] = monomoe_e4m3_fixed(static_cast<uint8_t>(c));
      nan[c] = monomoe_e4m3_is_nan(static_cast<uint8_t>(c));
    }
  }
};
const Fixed8 kFixed;

// The exact dot product of n codes of a and b, rounded to fp32 once.
float dot(const uint8_t* a, const uint8_t* b, int64_t n) {
  int64_t s = 0;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    s += static_cast<int64_t>(kFixed.v[a[i]]) * kFixed.v[b[i]];
    nan = nan || kFixed.nan[a[i]] || kFixed.nan[b[i]];
  }
  return monomoe_dot_to_f32(s, nan);
}

uint8_t e4m3(float v) { return float_to_e4m3fn_bits(v, /*saturate=*/true); }

}  // namespace

void mono_moe(const MonoMoeParams& p) {
  const int64_t M = p.M, TK = p.top_k, K = P::kK, N = P::kN, E = P::kE;
  // 1. Routing, one token at a time.
  std::vector<int32_t> ids(M * TK);
  std::vector<float> rw(M * TK);
  for (int64_t t = 0; t < M; ++t) {
    const uint16_t* row = p.logits + t * E;
    monomoe_route([row](int i) { return monomoe_logit(row[i]); }, TK, p.softmax, p.renormalize,
                  &ids[t * TK], &rw[t * TK]);
  }
  // 2. The input, 1 x 128 groups of each token.
  std::vector<uint8_t> qx(M * K);
  std::vector<float> xs(M * P::kKBlocks);
  for (int64_t t = 0; t < M; ++t) {
    for (int64_t kb = 0; kb < P::kKBlocks; ++kb) {
      const uint16_t* xb = p.x + t * K + kb * P::kBlock;
      float amax = 0.0f;
      for (int64_t i = 0; i < P::kBlock; ++i) amax = fp32_abs_max(amax, monomoe_input_value(xb[i]));
      amax = monomoe_amax_floor(amax);
      xs[t * P::kKBlocks + kb] = monomoe_group_scale(amax);
      const float mult = monomoe_group_mult(amax);
      for (int64_t i = 0; i < P::kBlock; ++i) {
        qx[t * K + kb * P::kBlock + i] = e4m3(fp32_mul(monomoe_input_value(xb[i]), mult));
      }
    }
  }
  // The active experts: the distinct choices in ascending id order (the combine's order).
  std::vector<int32_t> active;
  {
    std::vector<bool> used(E, false);
    for (int32_t id : ids) used[id] = true;
    for (int32_t e = 0; e < E; ++e) {
      if (used[e]) active.push_back(e);
    }
  }
  // 3-5. Each routed pair (t, k): up projection and SiLU, re-quantization, down projection.
  std::vector<float> y(M * TK * K);
#pragma omp parallel for schedule(dynamic)
  for (int64_t pair = 0; pair < M * TK; ++pair) {
    const int64_t t = pair / TK, e = ids[pair];
    const uint8_t* wu = p.w_up + e * 2 * N * K;
    const float* su = p.s_up + e * (2 * N / P::kBlock) * P::kKBlocks;
    std::vector<float> v(N);
    for (int64_t j = 0; j < N; ++j) {
      float acc[2] = {0.0f, 0.0f};
      for (int64_t h = 0; h < 2; ++h) {
        const uint8_t* w = wu + monomoe_up_row(h, j, N, p.up_interleaved) * K;
        const float* ws = su + (h * P::kNBlocks + j / P::kBlock) * P::kKBlocks;
        for (int64_t kb = 0; kb < P::kKBlocks; ++kb) {
          const int64_t k0 = kb * P::kBlock;
          acc[h] = monomoe_up_step(acc[h], dot(&qx[t * K + k0], w + k0, P::kBlock), ws[kb],
                                   xs[t * P::kKBlocks + kb]);
        }
      }
      v[j] = monomoe_silu_weighted(rw[pair], acc[0], acc[1]);
    }
    std::vector<uint8_t> iq(N);
    float is[P::kNGroups];
    for (int64_t g = 0; g < P::kNGroups; ++g) {
      float m = 0.0f;
      for (int64_t j = g * P::kActGroup; j < (g + 1) * P::kActGroup; ++j) m = fp32_abs_max(m, v[j]);
      m = monomoe_amax_floor(m);
      is[g] = monomoe_interm_scale(m);
      const float mult = monomoe_group_mult(m);
      for (int64_t j = g * P::kActGroup; j < (g + 1) * P::kActGroup; ++j) {
        iq[j] = e4m3(fp32_mul(v[j], mult));
      }
    }
    const uint8_t* wd = p.w_down + e * K * N;
    const float* sd = p.s_down + e * (K / P::kBlock) * P::kNBlocks;
    for (int64_t c = 0; c < K; ++c) {
      float acc = 0.0f;
      for (int64_t nb = 0; nb < P::kNBlocks; ++nb) {
        const int64_t n0 = nb * P::kBlock, half = P::kActGroup;
        const float lo = dot(&iq[n0], wd + c * N + n0, half);
        const float hi = dot(&iq[n0 + half], wd + c * N + n0 + half, half);
        acc = monomoe_down_step(acc, lo, hi, is[2 * nb], is[2 * nb + 1],
                                sd[(c / P::kBlock) * P::kNBlocks + nb]);
      }
      y[pair * K + c] = acc;
    }
  }
  // 6. Combine: per output, the active experts in 16 groups by index % 16, each summed in
  // ascending index order from 0, the groups added in ascending order; one bf16 rounding.
  for (int64_t t = 0; t < M; ++t) {
    for (int64_t c = 0; c < K; ++c) {
      float total = 0.0f;
      for (int64_t g = 0; g < P::kCombineGroups; ++g) {
        float part = 0.0f;
        for (size_t i = g; i < active.size(); i += P::kCombineGroups) {
          for (int64_t k = 0; k < TK; ++k) {
            if (ids[t * TK + k] == active[i]) part = fp32_add(part, y[(t * TK + k) * K + c]);
          }
        }
        total = fp32_add(total, part);
      }
      p.out[t * K + c] = monomoe_bf16_bits(total);
    }
  }
}

}  // namespace flashinfer::kernels::cpu
