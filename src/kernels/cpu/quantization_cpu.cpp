#include "kernels/cpu/quantization_cpu.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"

namespace flashinfer::kernels::cpu {
namespace {

inline float load(const Half* p) { return p->to_float(); }
inline float load(const BFloat16* p) { return p->to_float(); }
inline float load(const Float8E4M3FN* p) { return p->to_float(); }

template <class T>
void fp4_rows(const Fp4QuantizeParams& p, float gs) {
  const auto* in = static_cast<const T*>(p.input);
  const int64_t vec = p.sf_vec_size;
  const int64_t num_sf_cols = p.k / vec;
#pragma omp parallel for schedule(static) if (p.m * p.k >= (1 << 15))
  for (int64_t r = 0; r < p.m; ++r) {
    const T* x = in + r * p.in_stride_m;
    uint8_t* q = p.out + r * (p.k / 2);
    float v[32];
    for (int64_t b = 0; b < num_sf_cols; ++b) {
      float amax = 0.0f;
      for (int64_t i = 0; i < vec; ++i) {
        v[i] = load(x + (b * vec + i) * p.in_stride_k);
        const float a = std::fabs(v[i]);
        amax = a > amax ? a : amax;  // fmax semantics (NaN ignored), but vectorizable
      }
      uint8_t sf_code;
      float sf_val;
      if (p.ue8m0) {
        sf_code = ue8m0_round_up(amax / 6.0f);
        sf_val = ue8m0_to_float(sf_code);
      } else {
        sf_code = float_to_e4m3fn_bits(gs * amax / 6.0f, /*saturate=*/true);
        sf_val = e4m3fn_bits_to_float(sf_code);
      }
      p.sf[sf_offset(p.layout, r, b, num_sf_cols)] = sf_code;
      // Codes first (a straight loop the compiler vectorizes), then the nibble packing.
      uint8_t c[32];
      if (p.ue8m0) {
        for (int64_t i = 0; i < vec; ++i) c[i] = float_to_e2m1_bits(v[i] / sf_val);
      } else if (sf_val != 0.0f) {
        for (int64_t i = 0; i < vec; ++i) c[i] = float_to_e2m1_bits((v[i] * gs) / sf_val);
      } else {
        for (int64_t i = 0; i < vec; ++i) c[i] = 0;
      }
      for (int64_t i = 0; i < vec; i += 2) q[(b * vec + i) / 2] = pack_e2m1x2(c[i], c[i + 1]);
    }
  }
}

template <class T>
void mxfp8_rows(const Mxfp8QuantizeParams& p) {
  const auto* in = static_cast<const T*>(p.input);
  const int64_t num_sf_cols = p.k / 32;
#pragma omp parallel for schedule(static) if (p.m * p.k >= (1 << 15))
  for (int64_t r = 0; r < p.m; ++r) {
    const T* x = in + r * p.in_stride_m;
    uint8_t* q = p.out + r * p.k;
    float v[32];
    for (int64_t b = 0; b < num_sf_cols; ++b) {
      float amax = 0.0f;
      for (int64_t i = 0; i < 32; ++i) {
        v[i] = load(x + (b * 32 + i) * p.in_stride_k);
        const float a = std::fabs(v[i]);
        amax = a > amax ? a : amax;  // fmax semantics (NaN ignored), but vectorizable
      }
      const uint8_t sf_code = ue8m0_round_up(amax / 448.0f);
      const float sf_val = ue8m0_to_float(sf_code);
      p.sf[sf_offset(p.layout, r, b, num_sf_cols)] = sf_code;
      for (int64_t i = 0; i < 32; ++i) {
        q[b * 32 + i] = float_to_e4m3fn_bits(v[i] / sf_val, /*saturate=*/true);
      }
    }
  }
}

}  // namespace

void fp4_quantize(const Fp4QuantizeParams& p) {
  std::memset(p.sf, 0, static_cast<size_t>(p.sf_size));
  float gs = p.global_scale ? *p.global_scale : 1.0f;
  if (p.global_scale_inversed) gs = 1.0f / gs;
  switch (p.in_dtype) {
    case DType::kFloat16:
      return fp4_rows<Half>(p, gs);
    case DType::kBFloat16:
      return fp4_rows<BFloat16>(p, gs);
    case DType::kFloat8E4M3FN:
      return fp4_rows<Float8E4M3FN>(p, gs);
    default:
      FLASHINFER_FAIL(ErrorCode::kUnsupported, "fp4_quantize", "input", "dtype ",
                      dtype_torch_name(p.in_dtype), " is not supported on the CPU");
  }
}

void mxfp8_quantize(const Mxfp8QuantizeParams& p) {
  std::memset(p.sf, 0, static_cast<size_t>(p.sf_size));
  switch (p.in_dtype) {
    case DType::kFloat16:
      return mxfp8_rows<Half>(p);
    case DType::kBFloat16:
      return mxfp8_rows<BFloat16>(p);
    default:
      FLASHINFER_FAIL(ErrorCode::kUnsupported, "mxfp8_quantize", "input", "dtype ",
                      dtype_torch_name(p.in_dtype), " is not supported on the CPU");
  }
}

void block_dequantize(const BlockDequantizeParams& p) {
  const int64_t num_sf_cols = p.k / p.sf_vec_size;
#pragma omp parallel for schedule(static) if (p.m * p.k >= (1 << 15))
  for (int64_t r = 0; r < p.m; ++r) {
    const uint8_t* d = p.data + r * p.data_stride_m;
    float* y = p.out + r * p.k;
    for (int64_t c = 0; c < p.k; ++c) {
      const uint8_t s = p.sf[sf_offset(p.layout, r, c / p.sf_vec_size, num_sf_cols)];
      const float sf = p.sf_ue8m0 ? ue8m0_to_float(s) : e4m3fn_bits_to_float(s);
      float q;
      if (p.fp4) {
        const uint8_t byte = d[c / 2];
        q = e2m1_bits_to_float((c % 2) == 0 ? e2m1x2_low(byte) : e2m1x2_high(byte));
      } else {
        q = e4m3fn_bits_to_float(d[c]);
      }
      y[c] = q * sf * p.global_scale;
    }
  }
}

void block_scale_interleave(const BlockScaleInterleaveParams& p) {
  const int64_t per_batch = sf_buffer_size(SfLayoutCode::k128x4, p.rows, p.cols);
  const int64_t es = p.elem_size;
  auto* out = static_cast<uint8_t*>(p.out);
  const auto* in = static_cast<const uint8_t*>(p.input);
  std::memset(out, 0, static_cast<size_t>(p.batch * per_batch * es));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t r = 0; r < p.rows; ++r) {
      for (int64_t c = 0; c < p.cols; ++c) {
        const int64_t src = b * p.in_stride_b + r * p.in_stride_r + c * p.in_stride_c;
        const int64_t dst = b * per_batch + sf_offset(SfLayoutCode::k128x4, r, c, p.cols);
        std::memcpy(out + dst * es, in + src * es, static_cast<size_t>(es));
      }
    }
  }
}

}  // namespace flashinfer::kernels::cpu
