#include "kernels/cpu/norm_cpu.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"
#include "kernels/cpu/cpu_avx512.h"
#include "kernels/cpu/cpu_row_io.h"
#include "kernels/dtype_dispatch.h"

namespace flashinfer::kernels::cpu {
namespace {

// Rows below this many elements in total run on the calling thread: waking the team costs more.
constexpr int64_t kParallelMinElems = int64_t{1} << 15;

// The weight as fp32 with the Gemma bias folded in, computed once and shared by every row.
template <class T>
std::vector<float> weight_f32(const T* w, int64_t stride, int64_t n, float bias) {
  std::vector<float> wf(static_cast<std::size_t>(n));
  rowio::load_row(w, stride, n, wf.data());
  for (auto& v : wf) v += bias;
  return wf;
}

// Outputs at least this large are written with non-temporal stores (when the op is not in
// place and rows are aligned): they exceed what the caches would keep for the next op anyway,
// and streaming stores skip the read-for-ownership a normal store to an uncached line costs.
constexpr int64_t kStreamMinBytes = int64_t{16} << 20;

#if FLASHINFER_CPU_AVX512
// AVX-512 paths for unit-stride rows: each row is read from memory once (the later passes hit
// L1/L2), converted in registers, and written once; tails use masked loads and stores. The
// arithmetic is the scalar path's, with FMA and a different summation order, so results agree
// with it to fp32 rounding (tests compare both tiers with the fp64 formula).
namespace v5 = simd512;

template <class T>
FI_AVX512 float sum_squares_avx512(const T* x, int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512 v0 = v5::load(x + i), v1 = v5::load(x + i + 16);
    const __m512 v2 = v5::load(x + i + 32), v3 = v5::load(x + i + 48);
    a0 = _mm512_fmadd_ps(v0, v0, a0);
    a1 = _mm512_fmadd_ps(v1, v1, a1);
    a2 = _mm512_fmadd_ps(v2, v2, a2);
    a3 = _mm512_fmadd_ps(v3, v3, a3);
  }
  for (; i + 16 <= n; i += 16) {
    const __m512 v = v5::load(x + i);
    a0 = _mm512_fmadd_ps(v, v, a0);
  }
  if (i < n) {
    const __m512 v = v5::load(x + i, v5::tail_mask(n - i));  // zeros past the end
    a1 = _mm512_fmadd_ps(v, v, a1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

// y = x * r * w.
template <class T, bool kStream>
FI_AVX512 void scale_row_avx512(const T* x, const float* w, float r, T* y, int64_t n,
                                const T* next) {
  const __m512 rv = _mm512_set1_ps(r);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    v5::prefetch(next, i);
    const __m512 v = _mm512_mul_ps(_mm512_mul_ps(v5::load(x + i), rv), _mm512_loadu_ps(w + i));
    if constexpr (kStream) {
      v5::stream(y + i, v);
    } else {
      v5::store(y + i, v);
    }
  }
  if (i < n) {
    const __mmask16 m = v5::tail_mask(n - i);
    const __m512 v =
        _mm512_mul_ps(_mm512_mul_ps(v5::load(x + i, m), rv), _mm512_maskz_loadu_ps(m, w + i));
    v5::store(y + i, v, m);
  }
}

template <class T>
void rmsnorm_avx512(const RmsNormParams& p, const float* wf) {
  const auto* in = static_cast<const T*>(p.input);
  auto* out = static_cast<T*>(p.out);
  const int64_t rows = p.batch * p.heads, n = p.hidden;
  const bool stream =
      p.out != p.input && rows * n * static_cast<int64_t>(sizeof(T)) >= kStreamMinBytes;
  rowio::for_row_blocks(rows, n, kParallelMinElems, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / p.heads, h = r % p.heads;
      const T* x = in + b * p.in_stride_b + h * p.in_stride_h;
      T* y = out + b * p.out_stride_b + h * p.out_stride_h;
      const T* next =
          r + 1 < rows ? in + (r + 1) / p.heads * p.in_stride_b + (r + 1) % p.heads * p.in_stride_h
                       : nullptr;
      // eps goes inside the square root, as upstream does.
      const float r_rms =
          1.0f / std::sqrt(sum_squares_avx512(x, n) / static_cast<float>(n) + p.eps);
      if (stream && reinterpret_cast<std::uintptr_t>(y) % 64 == 0) {
        scale_row_avx512<T, true>(x, wf, r_rms, y, n, next);
      } else {
        scale_row_avx512<T, false>(x, wf, r_rms, y, n, next);
      }
    }
    if (stream) v5::sfence();
  });
}

// Pass 1 of fused_add_rmsnorm: the sum of squares of x + res (fp32, unrounded).
template <class T>
FI_AVX512 float add_sum_squares_avx512(const T* x, const T* res, int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 s0 = _mm512_add_ps(v5::load(x + i), v5::load(res + i));
    const __m512 s1 = _mm512_add_ps(v5::load(x + i + 16), v5::load(res + i + 16));
    a0 = _mm512_fmadd_ps(s0, s0, a0);
    a1 = _mm512_fmadd_ps(s1, s1, a1);
  }
  for (; i + 16 <= n; i += 16) {
    const __m512 s = _mm512_add_ps(v5::load(x + i), v5::load(res + i));
    a0 = _mm512_fmadd_ps(s, s, a0);
  }
  if (i < n) {
    const __mmask16 m = v5::tail_mask(n - i);
    const __m512 s = _mm512_add_ps(v5::load(x + i, m), v5::load(res + i, m));
    a1 = _mm512_fmadd_ps(s, s, a1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

// Pass 2: recomputes the sum from the (cached) rows rather than keeping an fp32 copy, stores
// it rounded into res, and the normalized unrounded sum into x.
template <class T>
FI_AVX512 void add_store_scale_avx512(T* x, T* res, const float* w, float r, int64_t n,
                                      const T* next_x, const T* next_res) {
  const __m512 rv = _mm512_set1_ps(r);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    v5::prefetch(next_x, i);
    v5::prefetch(next_res, i);
    const __m512 s = _mm512_add_ps(v5::load(x + i), v5::load(res + i));
    v5::store(res + i, s);
    v5::store(x + i, _mm512_mul_ps(_mm512_mul_ps(s, rv), _mm512_loadu_ps(w + i)));
  }
  if (i < n) {
    const __mmask16 m = v5::tail_mask(n - i);
    const __m512 s = _mm512_add_ps(v5::load(x + i, m), v5::load(res + i, m));
    v5::store(res + i, s, m);
    v5::store(x + i, _mm512_mul_ps(_mm512_mul_ps(s, rv), _mm512_maskz_loadu_ps(m, w + i)), m);
  }
}

template <class T>
void fused_add_rmsnorm_avx512(const FusedAddRmsNormParams& p, const float* wf) {
  auto* in = static_cast<T*>(p.input);
  auto* res = static_cast<T*>(p.residual);
  const int64_t rows = p.batch * p.heads, n = p.hidden;
  // In place: every line is read before it is written, so normal stores cost no extra reads.
  rowio::for_row_blocks(rows, n, kParallelMinElems, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / p.heads, h = r % p.heads;
      T* x = in + b * p.in_stride_b + h * p.in_stride_h;
      T* y = res + b * p.res_stride_b + h * p.res_stride_h;
      const bool last = r + 1 == rows;
      const int64_t nb = (r + 1) / p.heads, nh = (r + 1) % p.heads;
      const T* next_x = last ? nullptr : in + nb * p.in_stride_b + nh * p.in_stride_h;
      const T* next_y = last ? nullptr : res + nb * p.res_stride_b + nh * p.res_stride_h;
      const float r_rms =
          1.0f / std::sqrt(add_sum_squares_avx512(x, y, n) / static_cast<float>(n) + p.eps);
      add_store_scale_avx512(x, y, wf, r_rms, n, next_x, next_y);
    }
  });
}

// Rows are read 32 elements at a time (v5::load32: bf16 as even/odd pairs, the order in which
// layernorm_row_avx512 also writes them).
template <class T>
FI_AVX512 float sum_avx512(const T* x, int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 v0, v1;
    v5::load32(x + i, v0, v1);
    a0 = _mm512_add_ps(a0, v0);
    a1 = _mm512_add_ps(a1, v1);
  }
  for (; i + 16 <= n; i += 16) a0 = _mm512_add_ps(a0, v5::load(x + i));
  if (i < n) a1 = _mm512_add_ps(a1, v5::load(x + i, v5::tail_mask(n - i)));
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

// Sum of (x - mean)^2; the tail subtracts under the mask so lanes past the end stay 0.
template <class T>
FI_AVX512 float sum_sq_dev_avx512(const T* x, float mean, int64_t n) {
  const __m512 mv = _mm512_set1_ps(mean);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 d0, d1;
    v5::load32(x + i, d0, d1);
    d0 = _mm512_sub_ps(d0, mv);
    d1 = _mm512_sub_ps(d1, mv);
    a0 = _mm512_fmadd_ps(d0, d0, a0);
    a1 = _mm512_fmadd_ps(d1, d1, a1);
  }
  for (; i + 16 <= n; i += 16) {
    const __m512 d = _mm512_sub_ps(v5::load(x + i), mv);
    a0 = _mm512_fmadd_ps(d, d, a0);
  }
  if (i < n) {
    const __mmask16 m = v5::tail_mask(n - i);
    const __m512 d = _mm512_maskz_sub_ps(m, v5::load(x + i, m), mv);
    a1 = _mm512_fmadd_ps(d, d, a1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

// y = (x - mean) * r * gamma + beta.
template <class T, bool kStream>
FI_AVX512 void layernorm_row_avx512(const T* x, float mean, float r, const float* g,
                                    const float* bt, T* y, int64_t n, const T* next) {
  const __m512 mv = _mm512_set1_ps(mean), rv = _mm512_set1_ps(r);
  int64_t i = 0;
  if constexpr (std::is_same_v<T, BFloat16>) {
    // g and bt hold each block of 32 as its 16 even then its 16 odd elements (pair_blocks).
    for (; i + 32 <= n; i += 32) {
      v5::prefetch(next, i);
      __m512 de, dd;
      v5::load32(x + i, de, dd);
      de = _mm512_mul_ps(_mm512_sub_ps(de, mv), rv);
      dd = _mm512_mul_ps(_mm512_sub_ps(dd, mv), rv);
      v5::store_pairs<kStream>(
          y + i, _mm512_fmadd_ps(de, _mm512_loadu_ps(g + i), _mm512_loadu_ps(bt + i)),
          _mm512_fmadd_ps(dd, _mm512_loadu_ps(g + i + 16), _mm512_loadu_ps(bt + i + 16)));
    }
  }
  for (; i + 16 <= n; i += 16) {
    v5::prefetch(next, i);
    const __m512 d = _mm512_mul_ps(_mm512_sub_ps(v5::load(x + i), mv), rv);
    const __m512 v = _mm512_fmadd_ps(d, _mm512_loadu_ps(g + i), _mm512_loadu_ps(bt + i));
    if constexpr (kStream) {
      v5::stream(y + i, v);
    } else {
      v5::store(y + i, v);
    }
  }
  if (i < n) {
    const __mmask16 m = v5::tail_mask(n - i);
    const __m512 d = _mm512_mul_ps(_mm512_sub_ps(v5::load(x + i, m), mv), rv);
    const __m512 v =
        _mm512_fmadd_ps(d, _mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, bt + i));
    v5::store(y + i, v, m);
  }
}

// Reorders each full block of 32 elements of v into its 16 even then its 16 odd elements (the
// bf16 pairs order of layernorm_row_avx512); a tail shorter than 32 stays as it is.
void pair_blocks(std::vector<float>& v) {
  float tmp[32];
  for (std::size_t b = 0; b + 32 <= v.size(); b += 32) {
    for (int j = 0; j < 16; ++j) {
      tmp[j] = v[b + 2 * j];
      tmp[16 + j] = v[b + 2 * j + 1];
    }
    std::copy(tmp, tmp + 32, v.begin() + static_cast<std::ptrdiff_t>(b));
  }
}

template <class T>
void layernorm_avx512(const LayerNormParams& p, const float* gamma, const float* beta) {
  const auto* in = static_cast<const T*>(p.input);
  auto* out = static_cast<T*>(p.out);
  const int64_t n = p.hidden;
  const bool stream = static_cast<const void*>(out) != p.input &&
                      p.batch * n * static_cast<int64_t>(sizeof(T)) >= kStreamMinBytes;
  rowio::for_row_blocks(p.batch, n, kParallelMinElems, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* x = in + r * p.in_stride_b;
      T* y = out + r * p.out_stride_b;
      const T* next = r + 1 < p.batch ? x + p.in_stride_b : nullptr;
      // Two passes (mean, then squared deviations): no cancellation for rows with a large mean.
      const float mean = sum_avx512(x, n) / static_cast<float>(n);
      const float var = sum_sq_dev_avx512(x, mean, n) / static_cast<float>(n);
      const float r_std = 1.0f / std::sqrt(var + p.eps);
      if (stream && reinterpret_cast<std::uintptr_t>(y) % 64 == 0) {
        layernorm_row_avx512<T, true>(x, mean, r_std, gamma, beta, y, n, next);
      } else {
        layernorm_row_avx512<T, false>(x, mean, r_std, gamma, beta, y, n, next);
      }
    }
    if (stream) v5::sfence();
  });
}
#endif

// Each row is converted once into an fp32 buffer (vectorized conversions for unit strides),
// reduced, scaled and converted back; `out` may be `input` itself.
template <class T>
void rmsnorm_rows(const RmsNormParams& p) {
  const auto* in = static_cast<const T*>(p.input);
  auto* out = static_cast<T*>(p.out);
  const int64_t rows = p.batch * p.heads;
  const int64_t n = p.hidden;
  const std::vector<float> wf =
      weight_f32(static_cast<const T*>(p.weight), p.weight_stride, n, p.weight_bias);
#if FLASHINFER_CPU_AVX512
  if (p.in_stride_d == 1 && p.out_stride_d == 1 && use_avx512()) {
    return rmsnorm_avx512<T>(p, wf.data());
  }
#endif
  const int64_t chunk = rowio::rows_per_chunk(n);
#pragma omp parallel if (rows * n >= kParallelMinElems)
  {
    std::vector<float> v(static_cast<std::size_t>(n));
#pragma omp for schedule(dynamic, chunk)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = r / p.heads, h = r % p.heads;
      rowio::load_row(in + b * p.in_stride_b + h * p.in_stride_h, p.in_stride_d, n, v.data());
      // eps goes inside the square root, as upstream does.
      const float r_rms =
          1.0f / std::sqrt(rowio::sum_squares(v.data(), n) / static_cast<float>(n) + p.eps);
      for (int64_t i = 0; i < n; ++i) v[i] = v[i] * r_rms * wf[i];
      rowio::store_row(out + b * p.out_stride_b + h * p.out_stride_h, p.out_stride_d, n, v.data());
    }
  }
}

}  // namespace

void rmsnorm(const RmsNormParams& p) {
  dispatch_dtype<CpuElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "rmsnorm", "input", [&]<class T>() { rmsnorm_rows<T>(p); });
}

namespace {

template <class T>
void fused_add_rmsnorm_rows(const FusedAddRmsNormParams& p) {
  auto* in = static_cast<T*>(p.input);
  auto* res = static_cast<T*>(p.residual);
  const int64_t rows = p.batch * p.heads;
  const int64_t n = p.hidden;
  const std::vector<float> wf =
      weight_f32(static_cast<const T*>(p.weight), p.weight_stride, n, p.weight_bias);
#if FLASHINFER_CPU_AVX512
  if (p.in_stride_d == 1 && p.res_stride_d == 1 && use_avx512()) {
    return fused_add_rmsnorm_avx512<T>(p, wf.data());
  }
#endif
  const int64_t chunk = rowio::rows_per_chunk(n);
#pragma omp parallel if (rows * n >= kParallelMinElems)
  {
    std::vector<float> sum(static_cast<std::size_t>(n)), tmp(static_cast<std::size_t>(n));
#pragma omp for schedule(dynamic, chunk)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = r / p.heads, h = r % p.heads;
      T* x = in + b * p.in_stride_b + h * p.in_stride_h;
      T* y = res + b * p.res_stride_b + h * p.res_stride_h;
      rowio::load_row(x, p.in_stride_d, n, sum.data());
      rowio::load_row(y, p.res_stride_d, n, tmp.data());
      for (int64_t i = 0; i < n; ++i) sum[i] += tmp[i];
      // The residual keeps the rounded sum; the normalization uses the fp32 one.
      rowio::store_row(y, p.res_stride_d, n, sum.data());
      const float r_rms =
          1.0f / std::sqrt(rowio::sum_squares(sum.data(), n) / static_cast<float>(n) + p.eps);
      for (int64_t i = 0; i < n; ++i) tmp[i] = sum[i] * r_rms * wf[i];
      rowio::store_row(x, p.in_stride_d, n, tmp.data());
    }
  }
}

template <class T>
void layernorm_rows(const LayerNormParams& p) {
  const auto* in = static_cast<const T*>(p.input);
  auto* out = static_cast<T*>(p.out);
  const int64_t n = p.hidden;
  std::vector<float> gamma(static_cast<std::size_t>(n)), beta(static_cast<std::size_t>(n));
  auto load_param = [&](const void* src, int64_t stride, float* dst) {
    switch (p.param_dtype) {
      case DType::kFloat16:
        return rowio::load_row(static_cast<const Half*>(src), stride, n, dst);
      case DType::kBFloat16:
        return rowio::load_row(static_cast<const BFloat16*>(src), stride, n, dst);
      default:
        return rowio::load_row(static_cast<const float*>(src), stride, n, dst);
    }
  };
  load_param(p.gamma, p.gamma_stride, gamma.data());
  load_param(p.beta, p.beta_stride, beta.data());
#if FLASHINFER_CPU_AVX512
  if (p.in_stride_d == 1 && p.out_stride_d == 1 && use_avx512()) {
    if constexpr (std::is_same_v<T, BFloat16>) {
      pair_blocks(gamma);
      pair_blocks(beta);
    }
    return layernorm_avx512<T>(p, gamma.data(), beta.data());
  }
#endif
  const int64_t chunk = rowio::rows_per_chunk(n);
#pragma omp parallel if (p.batch * n >= kParallelMinElems)
  {
    std::vector<float> v(static_cast<std::size_t>(n));
#pragma omp for schedule(dynamic, chunk)
    for (int64_t r = 0; r < p.batch; ++r) {
      rowio::load_row(in + r * p.in_stride_b, p.in_stride_d, n, v.data());
      // Two passes (mean, then squared deviations): no cancellation for rows with a large mean.
      const float mean = rowio::sum(v.data(), n) / static_cast<float>(n);
      for (int64_t i = 0; i < n; ++i) v[i] -= mean;
      const float var = rowio::sum_squares(v.data(), n) / static_cast<float>(n);
      const float r_std = 1.0f / std::sqrt(var + p.eps);
      for (int64_t i = 0; i < n; ++i) v[i] = v[i] * r_std * gamma[i] + beta[i];
      rowio::store_row(out + r * p.out_stride_b, p.out_stride_d, n, v.data());
    }
  }
}

}  // namespace

void fused_add_rmsnorm(const FusedAddRmsNormParams& p) {
  dispatch_dtype<CpuElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "fused_add_rmsnorm", "input", [&]<class T>() { fused_add_rmsnorm_rows<T>(p); });
}

void layernorm(const LayerNormParams& p) {
  dispatch_dtype<CpuElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "layernorm", "input", [&]<class T>() { layernorm_rows<T>(p); });
}

}  // namespace flashinfer::kernels::cpu
