#include "kernels/cpu/quant8_cpu.h"

#include <cmath>
#include <cstring>
#include <type_traits>

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

template <class T>
void quant_rows(const GroupQuant8Params& p) {
  const int64_t groups = p.k / p.group_size;
  const int64_t xs = p.x_row_stride();
#pragma omp parallel for schedule(static) if (p.rows * p.k >= (1 << 16))
  for (int64_t r = 0; r < p.rows; ++r) {
    const T* x = static_cast<const T*>(p.x) + r * xs;
    for (int64_t g = 0; g < groups; ++g) {
      const T* xg = x + g * p.group_size;
      float amax = 0.0f;
      for (int64_t i = 0; i < p.group_size; ++i) amax = std::fmax(amax, std::fabs(f32(xg[i])));
      const int64_t base = r * p.k + g * p.group_size;
      auto* q = static_cast<uint8_t*>(p.q) + base;
      if (p.trtllm_1x128) {
        const float quant = amax != 0.0f ? 448.0f / amax : 1.0f;
        p.scales[r * p.s_stride_row + g * p.s_stride_group] = 1.0f / quant;
        for (int64_t i = 0; i < p.group_size; ++i) {
          // A NaN product (0 * inf when the block's maximum is below ~1.3e-36 or inf * 0 when
          // it holds an inf) is the GPU's canonical positive NaN, code 0x7F; x86 would make it
          // negative (0xFF).
          const float v = f32(xg[i]) * quant;
          q[i] = std::isnan(v) ? uint8_t{0x7F} : float_to_e4m3fn_bits(v, /*saturate=*/true);
        }
        continue;
      }
      float s = std::fmax(amax, p.eps) / p.qmax;
      // Rounded up to a power of two: 2^ceil(log2(s)), exactly (frexp gives s = m * 2^e with
      // m in [0.5, 1): a power of two is m == 0.5).
      if (p.ue8m0) {
        int e = 0;
        const float m = std::frexp(std::fmax(s, 1e-10f), &e);
        s = std::ldexp(1.0f, m == 0.5f ? e - 1 : e);
      }
      p.scales[r * p.s_stride_row + g * p.s_stride_group] = s;
      for (int64_t i = 0; i < p.group_size; ++i) {
        const float v = std::fmin(std::fmax(f32(xg[i]) / s, p.qmin), p.qmax);
        if (p.out_dtype == DType::kInt8) {
          q[i] = static_cast<uint8_t>(static_cast<int8_t>(v));
        } else if (p.out_dtype == DType::kFloat8E4M3FN) {
          q[i] = float_to_e4m3fn_bits(v, true);
        } else {
          q[i] = float_to_e5m2_bits(v, true);
        }
      }
    }
  }
}

}  // namespace

void per_token_group_quant_8bit(const GroupQuant8Params& p) {
  if (p.scales_padded_total > 0) {
    std::memset(p.scales, 0, static_cast<std::size_t>(p.scales_padded_total) * sizeof(float));
  }
  dispatch_dtype<CpuElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "per_token_group_quant_8bit", "x", [&]<class T>() { quant_rows<T>(p); });
}

void packbits(const uint8_t* x, int64_t n, int64_t stride, bool little, uint8_t* out) {
  for (int64_t b = 0; b < (n + 7) / 8; ++b) {
    uint8_t byte = 0;
    for (int64_t j = 0; j < 8 && b * 8 + j < n; ++j) {
      if (x[(b * 8 + j) * stride] != 0) byte |= static_cast<uint8_t>(little ? 1u << j : 0x80u >> j);
    }
    out[b] = byte;
  }
}

}  // namespace flashinfer::kernels::cpu
