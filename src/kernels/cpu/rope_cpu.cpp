#include "kernels/cpu/rope_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <xmmintrin.h>

#include "flashinfer/error.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/cpu_row_io.h"
#include "kernels/dtype_dispatch.h"
#include "kernels/rope_rules.h"

namespace flashinfer::kernels::cpu {
namespace {

constexpr int64_t kParallelMinElems = int64_t{1} << 15;

/// Frequencies of the rotary pairs, in fp64 (see RopeParams for the formula; the CUDA launcher
/// computes the same with rope_pair_frequency).
std::vector<double> pair_frequencies(const RopeParams& p) {
  const int64_t half = p.rotary_dim / 2;
  std::vector<double> f(static_cast<std::size_t>(half));
  for (int64_t i = 0; i < half; ++i) f[static_cast<std::size_t>(i)] = rope_pair_frequency(p, i);
  return f;
}

// One head's rotation over fp32 row buffers in upstream's arithmetic (kernels/rope_rules.h):
// c and s come flushed (rope_tokens), the row is flushed here, then rope_rotate_flushed. Its
// fmaf is libm's here (exact, one call a value); rotate_row_fma is the vectorized form.
template <bool kInterleave>
void rotate_row(float* __restrict in, float* __restrict out, const float* __restrict c,
                const float* __restrict s, int64_t half) {
  for (int64_t i = 0; i < 2 * half; ++i) in[i] = ftz_f32(in[i]);
  if constexpr (kInterleave) {
    for (int64_t i = 0; i < half; ++i) {
      rope_rotate_flushed(in[2 * i], in[2 * i + 1], c[i], s[i], &out[2 * i], &out[2 * i + 1]);
    }
  } else {
    for (int64_t i = 0; i < half; ++i) {
      rope_rotate_flushed(in[i], in[i + half], c[i], s[i], &out[i], &out[i + half]);
    }
  }
}

// The same with FMA instructions, vectorized: fma(x, c, -(y * s)) and fma(y, c, x * s), with
// MXCSR's DAZ and FTZ set around the loop for fast math's flushing (subnormal operands read as
// zeros, subnormal results written as zeros, signs kept), instead of a blend per value.
__attribute__((target("avx2,fma"))) void rotate_row_fma(bool interleave, const float* __restrict in,
                                                        float* __restrict out,
                                                        const float* __restrict c,
                                                        const float* __restrict s, int64_t half) {
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040u);  // FTZ (bit 15) | DAZ (bit 6)
  if (interleave) {
    for (int64_t i = 0; i < half; ++i) {
      const float a = in[2 * i], b = in[2 * i + 1];
      out[2 * i] = std::fmaf(a, c[i], -(b * s[i]));
      out[2 * i + 1] = std::fmaf(b, c[i], a * s[i]);
    }
  } else {
    for (int64_t i = 0; i < half; ++i) {
      const float a = in[i], b = in[i + half];
      out[i] = std::fmaf(a, c[i], -(b * s[i]));
      out[i + half] = std::fmaf(b, c[i], a * s[i]);
    }
  }
  _mm_setcsr(csr);
}

void rotate_row_any(bool fma, bool interleave, float* in, float* out, const float* c,
                    const float* s, int64_t half) {
  if (fma) {
    rotate_row_fma(interleave, in, out, c, s, half);
  } else if (interleave) {
    rotate_row<true>(in, out, c, s, half);
  } else {
    rotate_row<false>(in, out, c, s, half);
  }
}

struct HeadLayout {
  int64_t heads, stride_n, stride_h, stride_d;
};

// Rotates the first rotary_dim dims of every head of one token; copies the rest unless the
// output is the input. Unit-stride heads go through fp32 row buffers (`in`, `out`, rotary_dim
// floats each) so the conversions and the rotation vectorize; other strides work in place.
template <class T>
void rotate_heads(const T* x, T* y, int64_t heads, int64_t ish, int64_t isd, int64_t osh,
                  int64_t osd, const RopeParams& p, const float* __restrict c,
                  const float* __restrict s, float* __restrict in, float* __restrict out) {
  const int64_t half = p.rotary_dim / 2;
  const bool unit = isd == 1 && osd == 1;
  const bool fma = cpu_isa() >= CpuIsa::kAvx2;  // AVX2 tier: FMA included (cpu_isa.h)
  for (int64_t h = 0; h < heads; ++h) {
    const T* xh = x + h * ish;
    T* yh = y + h * osh;
    if (unit) {
      rowio::load_row(xh, 1, p.rotary_dim, in);
      rotate_row_any(fma, p.interleave, in, out, c, s, half);
      rowio::store_row(yh, 1, p.rotary_dim, out);
      if (!p.inplace) {
        std::memcpy(yh + p.rotary_dim, xh + p.rotary_dim,
                    static_cast<std::size_t>(p.head_dim - p.rotary_dim) * sizeof(T));
      }
      continue;
    }
    for (int64_t i = 0; i < half; ++i) {
      const int64_t ia = p.interleave ? 2 * i : i, ib = p.interleave ? 2 * i + 1 : i + half;
      float ao, bo;
      rope_rotate(rowio::load(xh + ia * isd), rowio::load(xh + ib * isd), c[i], s[i], &ao, &bo);
      rowio::store(yh + ia * osd, ao);
      rowio::store(yh + ib * osd, bo);
    }
    if (!p.inplace) {
      for (int64_t d = p.rotary_dim; d < p.head_dim; ++d) yh[d * osd] = xh[d * isd];
    }
  }
}

inline int64_t position(const RopeParams& p, int64_t t) {
  return p.pos_dtype == DType::kInt64 ? static_cast<const int64_t*>(p.pos)[t]
                                      : static_cast<const int32_t*>(p.pos)[t];
}

template <class T>
void rope_tokens(const RopeParams& p) {
  const int64_t half = p.rotary_dim / 2;
  const std::vector<double> freq = p.cos_sin_cache ? std::vector<double>() : pair_frequencies(p);
  const auto* q = static_cast<const T*>(p.q);
  const auto* k = static_cast<const T*>(p.k);
  auto* qo = static_cast<T*>(p.q_out);
  auto* ko = static_cast<T*>(p.k_out);
  const int64_t work = p.nnz * (p.num_q_heads + p.num_k_heads) * p.head_dim;
  const int64_t chunk = rowio::rows_per_chunk((p.num_q_heads + p.num_k_heads) * p.head_dim);
#pragma omp parallel if (work >= kParallelMinElems)
  {
    std::vector<float> c(static_cast<std::size_t>(half)), s(static_cast<std::size_t>(half));
    std::vector<float> in(static_cast<std::size_t>(p.rotary_dim));
    std::vector<float> out(static_cast<std::size_t>(p.rotary_dim));
#pragma omp for schedule(dynamic, chunk)
    for (int64_t t = 0; t < p.nnz; ++t) {
      const int64_t pos = position(p, t);
      if (p.cos_sin_cache) {
        const float* row = p.cos_sin_cache + pos * p.cache_stride_row;
        for (int64_t i = 0; i < half; ++i) {
          c[i] = row[i * p.cache_stride_col];
          s[i] = row[(half + i) * p.cache_stride_col];
        }
      } else {
        // fp64 angles: pos * f keeps full precision at long positions, where an fp32 product
        // would be off by up to pos * 2^-24 radians. rope_sincos gives the CUDA kernel's bits.
        for (int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<double>(pos) * freq[static_cast<std::size_t>(i)];
          double sv, cv;
          bool ok;  // false past kRopeMaxAngle (both NaN); the API refuses such calls first
          rope_sincos(angle, &sv, &cv, &ok);
          c[i] = static_cast<float>(cv);
          s[i] = static_cast<float>(sv);
        }
      }
      for (int64_t i = 0; i < half; ++i) c[i] = ftz_f32(c[i]), s[i] = ftz_f32(s[i]);
      rotate_heads(q + t * p.q_stride_n, qo + t * p.q_out_stride_n, p.num_q_heads, p.q_stride_h,
                   p.q_stride_d, p.q_out_stride_h, p.q_out_stride_d, p, c.data(), s.data(),
                   in.data(), out.data());
      rotate_heads(k + t * p.k_stride_n, ko + t * p.k_out_stride_n, p.num_k_heads, p.k_stride_h,
                   p.k_stride_d, p.k_out_stride_h, p.k_out_stride_d, p, c.data(), s.data(),
                   in.data(), out.data());
    }
  }
}

}  // namespace

void apply_rope(const RopeParams& p) {
  FLASHINFER_CHECK_CODE(p.pos_mode == RopePosMode::kPositions, ErrorCode::kInternal, "apply_rope",
                        "", "the CPU kernel takes resolved positions");
  dispatch_dtype<CpuElements, kFloat32, kFloat16, kBFloat16>(p.dtype, "apply_rope", "q",
                                                             [&]<class T>() { rope_tokens<T>(p); });
}

}  // namespace flashinfer::kernels::cpu
