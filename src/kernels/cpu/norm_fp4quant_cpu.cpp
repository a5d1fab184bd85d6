#include "kernels/cpu/norm_fp4quant_cpu.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/elem_io.h"

namespace flashinfer::kernels::cpu {

void rmsnorm_fp4quant(const NormFp4Params& p) {
  using elem_io::load_or_fp32;
  using elem_io::store_or_fp32;
  const int64_t H = p.H, bs = p.block_size, nb = H / bs;
  const float gs = p.global_scale ? *p.global_scale : 1.0f;
#pragma omp parallel for schedule(static) if (p.M * H >= 65536)
  for (int64_t m = 0; m < p.M; ++m) {
    std::vector<float> h(static_cast<size_t>(H)), y(static_cast<size_t>(H));
    float ss = 0.0f;
    for (int64_t j = 0; j < H; ++j) {
      float v = load_or_fp32(p.input, p.dtype, m * p.in_stride + j);
      if (p.residual) {
        v += load_or_fp32(p.residual, p.dtype, m * p.res_stride + j);
        store_or_fp32(p.residual, p.dtype, m * p.res_stride + j, v);
      }
      ss = std::fma(v, v, ss);  // the unrounded sum
      // The normalized value takes h as stored (rounded to the dtype).
      h[j] = p.residual ? load_or_fp32(p.residual, p.dtype, m * p.res_stride + j) : v;
    }
    const float rstd = 1.0f / std::sqrt(ss / static_cast<float>(H) + p.eps);
    for (int64_t j = 0; j < H; ++j) {
      y[j] = (h[j] * rstd) * load_or_fp32(p.weight, p.dtype, j);
      if (p.y_out) store_or_fp32(p.y_out, p.dtype, m * H + j, y[j]);
    }
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t code = norm_fp4_block(&y[b * bs], static_cast<int>(bs), gs, p.ue8m0,
                                          p.y_fp4 + m * (H / 2) + b * bs / 2);
      p.sf[sf_offset(p.sf_layout, m, b, nb)] = code;
      if (p.sf_linear) p.sf_linear[m * nb + b] = code;
    }
  }
}

}  // namespace flashinfer::kernels::cpu
