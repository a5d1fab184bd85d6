#include "kernels/cpu/apilog_stats_cpu.h"

#include <cmath>
#include <cstring>
#include <limits>
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

// Lane accumulators: fp32 min/max, branch-free updates and kLanes independent partial sums keep
// the loop short and vectorizable (level 5 runs it on every tensor argument of every call);
// the lanes are merged in a fixed order, so the result is reproducible. NaN fails every
// comparison, so it never becomes the min or max, and it is kept out of the sum.
constexpr int kLanes = 8;
struct FloatLanes {
  float mn[kLanes], mx[kLanes];
  double sum[kLanes];
  int64_t nan[kLanes], inf[kLanes];
  FloatLanes() {
    for (int l = 0; l < kLanes; ++l) {
      mn[l] = std::numeric_limits<float>::infinity();
      mx[l] = -std::numeric_limits<float>::infinity();
      sum[l] = 0.0;
      nan[l] = inf[l] = 0;
    }
  }
  void add(int l, float v) {
    const bool is_nan = v != v;
    nan[l] += is_nan;
    inf[l] += std::fabs(v) == std::numeric_limits<float>::infinity();
    mn[l] = v < mn[l] ? v : mn[l];
    mx[l] = v > mx[l] ? v : mx[l];
    sum[l] += is_nan ? 0.0 : static_cast<double>(v);
  }
};

bool is_contiguous(const TensorStatsParams& p) {
  int64_t expected = 1;
  for (int d = p.ndim - 1; d >= 0; --d) {
    if (p.shape[d] != 1 && p.strides[d] != expected) return false;
    expected *= p.shape[d];
  }
  return true;
}

template <class Visit>
void visit_offsets(const TensorStatsParams& p, Visit visit) {
  if (is_contiguous(p)) {
    for (int64_t i = 0; i < p.numel; ++i) visit(i);
    return;
  }
  std::vector<int64_t> shape(p.shape, p.shape + p.ndim), strides(p.strides, p.strides + p.ndim);
  // Offsets relative to element [0..0]; negative strides are fine.
  detail::for_each_offset(shape, strides, 0, visit);
}

template <DType D>
TensorStats float_stats(const TensorStatsParams& p) {
  FloatLanes a;
  if (is_contiguous(p)) {
    int64_t i = 0;
    for (; i + kLanes <= p.numel; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) a.add(l, to_f32<D>(p.data, i + l));
    }
    for (; i < p.numel; ++i) a.add(0, to_f32<D>(p.data, i));
  } else {
    visit_offsets(p, [&](int64_t off) { a.add(0, to_f32<D>(p.data, off)); });
  }
  TensorStats s;
  s.count = p.numel;
  for (int l = 0; l < kLanes; ++l) {
    s.nan_count += a.nan[l];
    s.inf_count += a.inf[l];
    s.min = std::fmin(s.min, static_cast<double>(a.mn[l]));
    s.max = std::fmax(s.max, static_cast<double>(a.mx[l]));
    s.sum += a.sum[l];
  }
  return s;
}

template <class I>
TensorStats int_stats(const TensorStatsParams& p) {
  TensorStats s;
  visit_offsets(p, [&](int64_t off) { add_int(s, to_i64<I>(p.data, off)); });
  return s;
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
