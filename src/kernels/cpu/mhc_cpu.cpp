#include "kernels/cpu/mhc_cpu.h"

#include <cstdint>

#include "flashinfer/float_formats.h"
#include "kernels/mhc_rules.h"

namespace flashinfer::kernels::cpu {
namespace {

float bf16_at(const void* p, int64_t i) {
  return bfloat16_bits_to_float(static_cast<const uint16_t*>(p)[i]);
}
void put_bf16(void* p, int64_t i, float v) {
  static_cast<uint16_t*>(p)[i] = float_to_bfloat16_bits(v);
}

}  // namespace

void mhc_post(const MhcPostParams& p) {
  using mhc::kHc;
  const int64_t H = p.H;
#pragma omp parallel for schedule(static) if (p.T * H >= 16384)
  for (int64_t t = 0; t < p.T; ++t) {
    const float* comb = p.comb + t * kHc * kHc;
    for (int64_t h = 0; h < H; ++h) {
      const float x = bf16_at(p.x, t * H + h);
      float r[kHc];
      for (int i = 0; i < kHc; ++i) r[i] = bf16_at(p.residual, (t * kHc + i) * H + h);
      for (int j = 0; j < kHc; ++j) {
        put_bf16(p.out, (t * kHc + j) * H + h,
                 mhc::post_element(x, p.post[t * kHc + j], r, comb, j));
      }
    }
  }
}

void mhc_pre_big_fuse(const MhcPreParams& p) {
  using mhc::kHc;
  using mhc::kMix;
  const int64_t H = p.H, T = p.T;
#pragma omp parallel for schedule(static) if (T * H >= 16384)
  for (int64_t t = 0; t < T; ++t) {
    float y[kMix] = {};
    float q = 0.0f;
    for (int64_t s = 0; s < p.num_splits; ++s) {  // split partials in order from 0
      for (int c = 0; c < kMix; ++c) y[c] += p.dot_mix[(s * T + t) * kMix + c];
      if (p.sqrsum) q += p.sqrsum[s * T + t];
    }
    if (!p.sqrsum) {
      for (int64_t i = 0; i < kHc * H; ++i) {
        const float v = bf16_at(p.residual, t * kHc * H + i);
        q = fmaf(v, v, q);
      }
    }
    float pre[kHc], post[kHc], comb[kHc * kHc];
    mhc::pre_mixes(y, q, p.k, p.scale, p.base, p.rms_eps, p.pre_eps, p.sinkhorn_eps, p.post_mult,
                   p.sinkhorn_repeat, pre, post, comb);
    for (int c = 0; c < kHc; ++c) p.post_mix[t * kHc + c] = post[c];
    for (int c = 0; c < kHc * kHc; ++c) p.comb_mix[t * kHc * kHc + c] = comb[c];
    for (int64_t h = 0; h < H; ++h) {
      float r[kHc];
      for (int i = 0; i < kHc; ++i) r[i] = bf16_at(p.residual, (t * kHc + i) * H + h);
      put_bf16(p.layer_input, t * H + h, mhc::layer_input_element(pre, r));
    }
  }
}

}  // namespace flashinfer::kernels::cpu
