#include "kernels/cpu/activation_cpu.h"

#include <cmath>
#include <vector>

#include "flashinfer/error.h"
#include "kernels/cpu/cpu_row_io.h"

namespace flashinfer::kernels::cpu {
namespace {

constexpr int64_t kParallelMinElems = int64_t{1} << 15;

// fp32 formulas, as upstream evaluates them.
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float gelu(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }
inline float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}

template <float (*Act)(float)>
void apply(float* __restrict gate, const float* __restrict up, int64_t d) {
  for (int64_t i = 0; i < d; ++i) gate[i] = Act(gate[i]) * up[i];
}

template <class T, float (*Act)(float)>
void rows(const ActAndMulParams& p) {
  const auto* in = static_cast<const T*>(p.input);
  auto* out = static_cast<T*>(p.out);
  const int64_t d = p.d;
#pragma omp parallel if (p.rows * d >= kParallelMinElems)
  {
    std::vector<float> gate(static_cast<std::size_t>(d)), up(static_cast<std::size_t>(d));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < p.rows; ++r) {
      const T* x = in + r * p.in_stride_row;
      rowio::load_row(x, p.in_stride_d, d, gate.data());
      rowio::load_row(x + d * p.in_stride_d, p.in_stride_d, d, up.data());
      apply<Act>(gate.data(), up.data(), d);
      rowio::store_row(out + r * p.out_stride_row, p.out_stride_d, d, gate.data());
    }
  }
}

template <class T>
void dispatch_act(const ActAndMulParams& p) {
  switch (p.act) {
    case Activation::kSilu:
      return rows<T, silu>(p);
    case Activation::kGelu:
      return rows<T, gelu>(p);
    case Activation::kGeluTanh:
      return rows<T, gelu_tanh>(p);
  }
}

}  // namespace

void act_and_mul(const ActAndMulParams& p) {
  switch (p.dtype) {
    case DType::kFloat32:
      return dispatch_act<float>(p);
    case DType::kFloat16:
      return dispatch_act<Half>(p);
    case DType::kBFloat16:
      return dispatch_act<BFloat16>(p);
    default:
      FLASHINFER_FAIL(ErrorCode::kUnsupported, "act_and_mul", "input", "dtype ",
                      dtype_torch_name(p.dtype), " is not supported on the CPU");
  }
}

}  // namespace flashinfer::kernels::cpu
