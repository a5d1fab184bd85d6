#include "kernels/cpu/bsa_cpu.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/elem_io.h"

namespace flashinfer::kernels::cpu {
namespace {

using elem_io::load_or_fp32;
using elem_io::store_or_fp32;

void run_row(const BsaParams& p, int64_t b, int64_t h, int64_t r) {
  const int64_t D = p.dim, BLK = p.block;
  const int64_t hk = h / (p.Hq / p.Hkv), row_meta = bsa_meta_row(p, b, h, r);
  const int64_t n = p.nums ? p.nums[row_meta] : p.block_sparse_num;
  float q[BsaParams::kMaxDim];
  for (int64_t d = 0; d < D; ++d) {
    q[d] = load_or_fp32(p.q, p.dtype, b * p.q_s[0] + r * p.q_s[1] + h * p.q_s[2] + d);
  }
  // The keys this row sees, in the kernel's slot order (n - 1 down to 0): scores, then values.
  std::vector<int64_t> keys;
  for (int64_t slot = n - 1; slot >= 0; --slot) {
    const int64_t j = p.index[row_meta * p.W + slot];
    const int64_t vb = bsa_valid_keys(p, b, h, j);
    for (int64_t t = 0; t < vb; ++t) keys.push_back(j * BLK + t);
  }
  std::vector<float> s(keys.size());
  float m = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < keys.size(); ++i) {
    float acc = 0.0f;
    if (keys[i] < p.Sk) {  // past Sk: the zero row of an out-of-bounds load
      const int64_t base = b * p.k_s[0] + keys[i] * p.k_s[1] + hk * p.k_s[2];
      for (int64_t d = 0; d < D; ++d) acc += q[d] * load_or_fp32(p.k, p.dtype, base + d);
    }
    s[i] = acc * p.scale;
    m = std::fmax(m, s[i]);
  }
  float o[BsaParams::kMaxDim] = {};
  float l = 0.0f;
  if (!keys.empty() && std::isfinite(m)) {
    for (size_t i = 0; i < keys.size(); ++i) {
      const float e = std::exp(s[i] - m);
      l += e;
      if (keys[i] >= p.Sk) continue;
      const int64_t base = b * p.v_s[0] + keys[i] * p.v_s[1] + hk * p.v_s[2];
      for (int64_t d = 0; d < D; ++d) o[d] += e * load_or_fp32(p.v, p.dtype, base + d);
    }
  }
  const bool empty = !(l > 0.0f);
  for (int64_t d = 0; d < D; ++d) {
    store_or_fp32(p.out, p.dtype, b * p.out_s[0] + r * p.out_s[1] + h * p.out_s[2] + d,
                  empty ? 0.0f : o[d] / l);
  }
  if (p.lse) {
    p.lse[b * p.lse_s[0] + h * p.lse_s[1] + r * p.lse_s[2]] =
        empty ? -std::numeric_limits<float>::infinity() : m + std::log(l);
  }
}

}  // namespace

void bsa_attn_fwd(const BsaParams& p) {
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (p.B * p.Hq > 1)
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.Hq; ++h) {
      for (int64_t r = 0; r < p.Sq; ++r) run_row(p, b, h, r);
    }
  }
}

}  // namespace flashinfer::kernels::cpu
