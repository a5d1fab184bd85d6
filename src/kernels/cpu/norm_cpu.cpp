#include "kernels/cpu/norm_cpu.h"

#include <cmath>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"

namespace flashinfer::kernels::cpu {
namespace {

inline float load(const float* p) { return *p; }
inline float load(const Half* p) { return p->to_float(); }
inline float load(const BFloat16* p) { return p->to_float(); }
inline void store(float* p, float v) { *p = v; }
inline void store(Half* p, float v) { *p = Half::from_float(v); }
inline void store(BFloat16* p, float v) { *p = BFloat16::from_float(v); }

template <class T>
void rmsnorm_rows(const RmsNormParams& p) {
  const auto* in = static_cast<const T*>(p.input);
  const auto* w = static_cast<const T*>(p.weight);
  auto* out = static_cast<T*>(p.out);
  const int64_t rows = p.batch * p.heads;
  const int64_t hidden = p.hidden;
  // Small problems are not worth waking the thread team.
#pragma omp parallel for schedule(static) if (rows * hidden >= (1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / p.heads, h = r % p.heads;
    const T* x = in + b * p.in_stride_b + h * p.in_stride_h;
    T* y = out + b * p.out_stride_b + h * p.out_stride_h;
    float sum = 0.0f;
    for (int64_t i = 0; i < hidden; ++i) {
      const float v = load(x + i * p.in_stride_d);
      sum += v * v;
    }
    // eps goes inside the square root, as upstream does.
    const float r_rms = 1.0f / std::sqrt(sum / static_cast<float>(hidden) + p.eps);
    for (int64_t i = 0; i < hidden; ++i) {
      const float v = load(x + i * p.in_stride_d);
      const float g = load(w + i * p.weight_stride) + p.weight_bias;
      store(y + i * p.out_stride_d, v * r_rms * g);
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

}  // namespace flashinfer::kernels::cpu
