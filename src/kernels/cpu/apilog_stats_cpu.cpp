#include "kernels/cpu/apilog_stats_cpu.h"

#include <cstring>
#include <vector>

#include "core/strided.h"
#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"

namespace flashinfer::kernels::cpu {
namespace {

template <class T>
T load(const void* base, int64_t off) {
  T v;
  std::memcpy(&v, static_cast<const uint8_t*>(base) + off * static_cast<int64_t>(sizeof(T)),
              sizeof(T));
  return v;
}

// fp32 value of one element, as torch's .float() gives it.
template <DType D>
float to_f32(const void* base, int64_t off) {
  if constexpr (D == DType::kFloat32) return load<float>(base, off);
  if constexpr (D == DType::kFloat64) return static_cast<float>(load<double>(base, off));
  if constexpr (D == DType::kFloat16) return half_bits_to_float(load<uint16_t>(base, off));
  if constexpr (D == DType::kBFloat16) return bfloat16_bits_to_float(load<uint16_t>(base, off));
  if constexpr (D == DType::kFloat8E4M3FN) return e4m3fn_bits_to_float(load<uint8_t>(base, off));
  if constexpr (D == DType::kFloat8E5M2) return e5m2_bits_to_float(load<uint8_t>(base, off));
  return 0.0f;
}

template <class I>
int64_t to_i64(const void* base, int64_t off) {
  return static_cast<int64_t>(load<I>(base, off));
}

template <class Add>
TensorStats reduce(const TensorStatsParams& p, Add add) {
  TensorStats s;
  std::vector<int64_t> shape(p.shape, p.shape + p.ndim), strides(p.strides, p.strides + p.ndim);
  // Offsets relative to element [0..0]; negative strides are fine.
  detail::for_each_offset(shape, strides, 0, [&](int64_t off) { add(s, off); });
  return s;
}

template <DType D>
TensorStats float_stats(const TensorStatsParams& p) {
  return reduce(p, [&](TensorStats& s, int64_t off) { add_float(s, to_f32<D>(p.data, off)); });
}

template <class I>
TensorStats int_stats(const TensorStatsParams& p) {
  return reduce(p, [&](TensorStats& s, int64_t off) { add_int(s, to_i64<I>(p.data, off)); });
}

}  // namespace

TensorStats tensor_stats(const TensorStatsParams& p) {
  switch (p.dtype) {
    case DType::kFloat32:
      return float_stats<DType::kFloat32>(p);
    case DType::kFloat64:
      return float_stats<DType::kFloat64>(p);
    case DType::kFloat16:
      return float_stats<DType::kFloat16>(p);
    case DType::kBFloat16:
      return float_stats<DType::kBFloat16>(p);
    case DType::kFloat8E4M3FN:
      return float_stats<DType::kFloat8E4M3FN>(p);
    case DType::kFloat8E5M2:
      return float_stats<DType::kFloat8E5M2>(p);
    case DType::kInt8:
      return int_stats<int8_t>(p);
    case DType::kUInt8:
      return int_stats<uint8_t>(p);
    case DType::kInt16:
      return int_stats<int16_t>(p);
    case DType::kInt32:
      return int_stats<int32_t>(p);
    case DType::kInt64:
      return int_stats<int64_t>(p);
    default:
      FLASHINFER_FAIL(ErrorCode::kInternal, "api_log", "", "no statistics for ",
                      dtype_torch_name(p.dtype));
  }
}

}  // namespace flashinfer::kernels::cpu
