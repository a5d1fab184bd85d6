// Private: converting single elements of any dtype to and from double, for the generic
// (non-kernel) paths of Tensor: fill, random fill, dtype casts, to_double_vector. FLASHINFER_HD:
// the device-side copy kernel (kernels/cuda/tensor_copy_cuda.cu) casts with these same
// expressions, so a cast on a GPU gives the CPU's bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "flashinfer/dtype.h"
#include "flashinfer/float_formats.h"
#include "kernels/cuda/device/host_device.h"

namespace flashinfer::detail {

template <class I>
FLASHINFER_HD I saturate_int(double v) {
  if (std::isnan(v)) return 0;
  v = std::trunc(v);
  if (v <= static_cast<double>(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (v >= static_cast<double>(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return static_cast<I>(v);
}

/// Writes `v` as one element of `dtype` (round to nearest even; ints truncate and saturate).
/// For the fp4 pair both nibbles get `v`.
FLASHINFER_HD void encode_element(DType dtype, double v, void* dst) {
  switch (dtype) {
    case DType::kFloat32: {
      float f = static_cast<float>(v);
      std::memcpy(dst, &f, 4);
      return;
    }
    case DType::kFloat64:
      std::memcpy(dst, &v, 8);
      return;
    case DType::kFloat16: {
      uint16_t b = float_to_half_bits(static_cast<float>(v));
      std::memcpy(dst, &b, 2);
      return;
    }
    case DType::kBFloat16: {
      uint16_t b = float_to_bfloat16_bits(static_cast<float>(v));
      std::memcpy(dst, &b, 2);
      return;
    }
    case DType::kFloat8E4M3FN:
      *static_cast<uint8_t*>(dst) = float_to_e4m3fn_bits(static_cast<float>(v));
      return;
    case DType::kFloat8E5M2:
      *static_cast<uint8_t*>(dst) = float_to_e5m2_bits(static_cast<float>(v));
      return;
    case DType::kFloat4E2M1FNx2: {
      uint8_t c = float_to_e2m1_bits(static_cast<float>(v));
      *static_cast<uint8_t*>(dst) = pack_e2m1x2(c, c);
      return;
    }
    case DType::kInt8: {
      int8_t x = saturate_int<int8_t>(v);
      std::memcpy(dst, &x, 1);
      return;
    }
    case DType::kUInt8: {
      uint8_t x = saturate_int<uint8_t>(v);
      std::memcpy(dst, &x, 1);
      return;
    }
    case DType::kInt16: {
      int16_t x = saturate_int<int16_t>(v);
      std::memcpy(dst, &x, 2);
      return;
    }
    case DType::kInt32: {
      int32_t x = saturate_int<int32_t>(v);
      std::memcpy(dst, &x, 4);
      return;
    }
    case DType::kInt64: {
      int64_t x = saturate_int<int64_t>(v);
      std::memcpy(dst, &x, 8);
      return;
    }
    case DType::kBool:
      *static_cast<uint8_t*>(dst) = (v != 0.0) ? 1 : 0;
      return;
  }
}

/// Reads one element as double. For the fp4 pair, `nibble` picks the low (0) or high (1) value.
FLASHINFER_HD double decode_element(DType dtype, const void* src, int nibble = 0) {
  switch (dtype) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, src, 4);
      return f;
    }
    case DType::kFloat64: {
      double d;
      std::memcpy(&d, src, 8);
      return d;
    }
    case DType::kFloat16: {
      uint16_t b;
      std::memcpy(&b, src, 2);
      return half_bits_to_float(b);
    }
    case DType::kBFloat16: {
      uint16_t b;
      std::memcpy(&b, src, 2);
      return bfloat16_bits_to_float(b);
    }
#ifdef __CUDA_ARCH__  // the decode tables are host data: the device computes the same values
    case DType::kFloat8E4M3FN:
      return DecodeMinifloat<4, 3, Specials::kFiniteNan>(*static_cast<const uint8_t*>(src));
    case DType::kFloat8E5M2:
      return DecodeMinifloat<5, 2, Specials::kIeee>(*static_cast<const uint8_t*>(src));
    case DType::kFloat4E2M1FNx2: {
      uint8_t byte = *static_cast<const uint8_t*>(src);
      return DecodeMinifloat<2, 1, Specials::kNone>(nibble ? e2m1x2_high(byte) : e2m1x2_low(byte));
    }
#else
    case DType::kFloat8E4M3FN:
      return e4m3fn_bits_to_float(*static_cast<const uint8_t*>(src));
    case DType::kFloat8E5M2:
      return e5m2_bits_to_float(*static_cast<const uint8_t*>(src));
    case DType::kFloat4E2M1FNx2: {
      uint8_t byte = *static_cast<const uint8_t*>(src);
      return e2m1_bits_to_float(nibble ? e2m1x2_high(byte) : e2m1x2_low(byte));
    }
#endif
    case DType::kInt8:
      return *static_cast<const int8_t*>(src);
    case DType::kUInt8:
      return *static_cast<const uint8_t*>(src);
    case DType::kInt16: {
      int16_t x;
      std::memcpy(&x, src, 2);
      return x;
    }
    case DType::kInt32: {
      int32_t x;
      std::memcpy(&x, src, 4);
      return x;
    }
    case DType::kInt64: {
      int64_t x;
      std::memcpy(&x, src, 8);
      return static_cast<double>(x);
    }
    case DType::kBool:
      return *static_cast<const uint8_t*>(src) != 0 ? 1.0 : 0.0;
  }
  return 0.0;
}

}  // namespace flashinfer::detail
