#include "kernels/cpu/norm_cpu.h"

#include <cmath>
#include <vector>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"
#include "kernels/cpu/cpu_row_io.h"

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
  switch (p.dtype) {
    case DType::kFloat32:
      return rmsnorm_rows<float>(p);
    case DType::kFloat16:
      return rmsnorm_rows<Half>(p);
    case DType::kBFloat16:
      return rmsnorm_rows<BFloat16>(p);
    default:
      FLASHINFER_FAIL(ErrorCode::kUnsupported, "rmsnorm", "input", "dtype ",
                      dtype_torch_name(p.dtype), " is not supported on the CPU");
  }
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
  rowio::load_row(p.gamma, p.gamma_stride, n, gamma.data());
  rowio::load_row(p.beta, p.beta_stride, n, beta.data());
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
  switch (p.dtype) {
    case DType::kFloat32:
      return fused_add_rmsnorm_rows<float>(p);
    case DType::kFloat16:
      return fused_add_rmsnorm_rows<Half>(p);
    case DType::kBFloat16:
      return fused_add_rmsnorm_rows<BFloat16>(p);
    default:
      FLASHINFER_FAIL(ErrorCode::kUnsupported, "fused_add_rmsnorm", "input", "dtype ",
                      dtype_torch_name(p.dtype), " is not supported on the CPU");
  }
}

void layernorm(const LayerNormParams& p) {
  switch (p.dtype) {
    case DType::kFloat32:
      return layernorm_rows<float>(p);
    case DType::kFloat16:
      return layernorm_rows<Half>(p);
    case DType::kBFloat16:
      return layernorm_rows<BFloat16>(p);
    default:
      FLASHINFER_FAIL(ErrorCode::kUnsupported, "layernorm", "input", "dtype ",
                      dtype_torch_name(p.dtype), " is not supported on the CPU");
  }
}

}  // namespace flashinfer::kernels::cpu
