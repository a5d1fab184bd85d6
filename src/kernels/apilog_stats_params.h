// Private: the level-5 tensor statistics (min, max, mean, NaN and Inf counts) as both backends
// compute them. Values are taken as torch's `tensor.float()` would give them (fp64 rounded to
// fp32, integers converted to fp32 for the sum), because upstream computes its statistics on
// `.float()`.
#pragma once

#include <cstdint>
#include <limits>

#include "flashinfer/dtype.h"

#if defined(__CUDACC__)
#define FLASHINFER_STATS_HD __host__ __device__
#else
#define FLASHINFER_STATS_HD
#endif

namespace flashinfer::kernels {

inline constexpr int kStatsMaxDims = 12;

struct TensorStatsParams {
  const void* data = nullptr;  // address of element [0, ..., 0]
  DType dtype = DType::kFloat32;
  int ndim = 0;
  int64_t numel = 0;
  int64_t shape[kStatsMaxDims] = {};
  int64_t strides[kStatsMaxDims] = {};  // in elements
};

/// Partial or final reduction. Floating dtypes fill min/max (over non-NaN values, infinities
/// included) and the counts; integer dtypes fill imin/imax. `sum` is over non-NaN values, in
/// double, of the fp32-converted values.
struct TensorStats {
  int64_t count = 0;
  int64_t nan_count = 0;
  int64_t inf_count = 0;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  int64_t imin = std::numeric_limits<int64_t>::max();
  int64_t imax = std::numeric_limits<int64_t>::min();
  double sum = 0.0;
};

// docs/LOGGING.md states the size of the one copy back from the device.
static_assert(sizeof(TensorStats) == 64);

/// Merges `b` into `a` (the order of merges is fixed by each backend, so sums are reproducible).
FLASHINFER_STATS_HD inline void merge_stats(TensorStats& a, const TensorStats& b) {
  a.count += b.count;
  a.nan_count += b.nan_count;
  a.inf_count += b.inf_count;
  if (b.min < a.min) a.min = b.min;
  if (b.max > a.max) a.max = b.max;
  if (b.imin < a.imin) a.imin = b.imin;
  if (b.imax > a.imax) a.imax = b.imax;
  a.sum += b.sum;
}

/// Adds one fp32 value (floating dtypes).
FLASHINFER_STATS_HD inline void add_float(TensorStats& s, float v) {
  ++s.count;
  if (v != v) {
    ++s.nan_count;
    return;
  }
  const double d = v;
  if (d == std::numeric_limits<double>::infinity() ||
      d == -std::numeric_limits<double>::infinity()) {
    ++s.inf_count;
  }
  if (d < s.min) s.min = d;
  if (d > s.max) s.max = d;
  s.sum += d;
}

/// Adds one integer value (integer dtypes): exact min/max, fp32-converted sum.
FLASHINFER_STATS_HD inline void add_int(TensorStats& s, int64_t v) {
  ++s.count;
  if (v < s.imin) s.imin = v;
  if (v > s.imax) s.imax = v;
  s.sum += static_cast<double>(static_cast<float>(v));
}

}  // namespace flashinfer::kernels
