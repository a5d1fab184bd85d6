#include "kernels/cpu/norm_quant_cpu.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "flashinfer/float_formats.h"
#include "kernels/dtype_dispatch.h"

namespace flashinfer::kernels::cpu {
namespace {

template <class T>
float f32(const T& v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return v.to_float();
  }
}

// fp8 of y * inv_scale, saturating at the format's max. A NaN: with nan_to_nan the format's
// canonical NaN 0x7F (rmsnorm_quant / fused_add_rmsnorm_quant / layernorm_quant: upstream's CuTe
// kernels convert with cvt.rn.satfinite and no clamp); else -max, as fmax/fmin (the CUDA
// max.f32/min.f32) clamp it.
uint8_t quantize(float y, float inv_scale, DType out_dtype, bool nan_to_nan = false) {
  const float mx = out_dtype == DType::kFloat8E4M3FN ? 448.0f : 57344.0f;
  const float yi = y * inv_scale;
  if (nan_to_nan && std::isnan(yi)) return 0x7F;
  const float v = std::fmin(std::fmax(yi, -mx), mx);
  return out_dtype == DType::kFloat8E4M3FN ? float_to_e4m3fn_bits(v, true)
                                           : float_to_e5m2_bits(v, true);
}

// fused_rmsnorm_silu's NVFP4 output, as upstream's kernel (cuDNN's BlockScaleRowHelper) does it
// per 16 values of y = silu(...) in fp32 (not rounded to bf16 first): s = max(amax / 6, FLT_MIN)
// with amax by fmaxf (a NaN is skipped), the scale byte is e4m3_satfinite(s), and each code is
// e2m1(y / s) with the unrounded fp32 s (not the stored e4m3 scale), RNE, saturating at 6.
template <class T>
void rms_silu_nvfp4(const NormQuantParams& p, int64_t b, float rstd, const T* w,
                    std::vector<float>& x) {
  const int64_t n = p.hidden;
  for (int64_t i = 0; i < n; ++i) {
    const float y = x[i] * rstd * f32(w[i * p.weight_stride]);
    x[i] = y / (1.0f + std::exp(-y));
  }
  uint8_t* o = static_cast<uint8_t*>(p.out) + b * p.out_stride_b;
  uint8_t* sf = p.block_scale + b * p.bs_stride_b;
  for (int64_t blk = 0; blk < n / 16; ++blk) {
    const float* v = x.data() + blk * 16;
    float amax = 0.0f;
    for (int i = 0; i < 16; ++i) amax = std::fmax(amax, std::fabs(v[i]));
    const float s = std::fmax(amax / 6.0f, std::numeric_limits<float>::min());
    sf[blk * p.bs_stride_d] = float_to_e4m3fn_bits(s, true);
    for (int i = 0; i < 16; i += 2) {
      o[(blk * 8 + i / 2) * p.out_stride_d] =
          pack_e2m1x2(float_to_e2m1_bits(v[i] / s), float_to_e2m1_bits(v[i + 1] / s));
    }
  }
}

template <class T>
void row(const NormQuantParams& p, int64_t b, float inv_scale, std::vector<float>& x) {
  const int64_t n = p.hidden;
  const T* in = static_cast<const T*>(p.input) + b * p.in_stride_b;
  for (int64_t i = 0; i < n; ++i) x[i] = f32(in[i * p.in_stride_d]);
  if (p.kind == NormQuantKind::kFusedAddRms) {
    T* res = static_cast<T*>(p.residual) + b * p.res_stride_b;
    for (int64_t i = 0; i < n; ++i) {
      x[i] += f32(res[i * p.res_stride_d]);
      res[i * p.res_stride_d] = from_float<T>(x[i]);
    }
  }
  if (p.kind == NormQuantKind::kLayer) {
    uint8_t* out = static_cast<uint8_t*>(p.out) + b * p.out_stride_b;
    const float* g = static_cast<const float*>(p.weight);
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum += x[i];
    const float mean = sum / static_cast<float>(n);
    float var = 0.0f;
    for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
    const float rstd = 1.0f / std::sqrt(var / static_cast<float>(n) + p.eps);
    for (int64_t i = 0; i < n; ++i) {
      // Upstream 0.7.4's CuTe kernel (its default): y stays fp32 (its CUDA fallback, which
      // session 83 followed, rounded to bf16 first), then times 1 / scale with no clamp: NaN is
      // 0x7F.
      const float y = (x[i] - mean) * rstd * g[i * p.weight_stride] + p.beta[i * p.beta_stride];
      out[i * p.out_stride_d] = quantize(y, inv_scale, p.out_dtype, /*nan_to_nan=*/true);
    }
    return;
  }
  const T* w = static_cast<const T*>(p.weight);
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float rstd = 1.0f / std::sqrt(ss / static_cast<float>(n) + p.eps);
  if (p.kind == NormQuantKind::kRmsSilu && p.out_dtype == DType::kFloat4E2M1FNx2) {
    rms_silu_nvfp4(p, b, rstd, w, x);
    return;
  }
  if (p.kind == NormQuantKind::kRmsSilu && p.out_dtype == DType::kFloat8E4M3FN) {
    // fused_rmsnorm_silu's fp8 output: e4m3 (saturating) of silu(y), scale 1.
    uint8_t* o = static_cast<uint8_t*>(p.out) + b * p.out_stride_b;
    for (int64_t i = 0; i < n; ++i) {
      const float y = x[i] * rstd * f32(w[i * p.weight_stride]);
      o[i * p.out_stride_d] = quantize(y / (1.0f + std::exp(-y)), 1.0f, p.out_dtype);
    }
    return;
  }
  if (p.kind == NormQuantKind::kRmsSilu) {
    BFloat16* o = static_cast<BFloat16*>(p.out) + b * p.out_stride_b;
    for (int64_t i = 0; i < n; ++i) {
      const float y = x[i] * rstd * f32(w[i * p.weight_stride]);
      o[i * p.out_stride_d] = BFloat16::from_float(y / (1.0f + std::exp(-y)));
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float y = x[i] * rstd * f32(w[i * p.weight_stride]);
    static_cast<uint8_t*>(p.out)[b * p.out_stride_b + i * p.out_stride_d] =
        quantize(y, inv_scale, p.out_dtype, /*nan_to_nan=*/true);
  }
}

}  // namespace

void norm_quant(const NormQuantParams& p) {
  const float inv_scale = 1.0f / (p.scale ? *p.scale : p.scale_value);
  dispatch_dtype<CpuElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "norm_quant", "input", [&]<class T>() {
#pragma omp parallel if (p.batch * p.hidden >= (1 << 16))
        {
          std::vector<float> x(static_cast<std::size_t>(p.hidden));
#pragma omp for schedule(static)
          for (int64_t b = 0; b < p.batch; ++b) row<T>(p, b, inv_scale, x);
        }
      });
}

}  // namespace flashinfer::kernels::cpu
