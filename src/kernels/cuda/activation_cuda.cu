#include "kernels/cuda/activation_cuda.h"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/vec_cuda.cuh"

namespace flashinfer::kernels::cuda {
namespace {

// Accurate (non-intrinsic) libdevice functions, in the cancellation-free forms the CPU
// reference uses: gelu = x/2 erfc(-x / sqrt 2) (= x/2 (1 + erf(x / sqrt 2))) and
// gelu_tanh = x / (1 + e^(-2u)) (= x/2 (1 + tanh u)).
template <Activation A>
__device__ __forceinline__ float act(float x) {
  if constexpr (A == Activation::kSilu) {
    return x / (1.0f + expf(-x));
  } else if constexpr (A == Activation::kGelu) {
    return 0.5f * x * erfcf(-x * 0.70710678118654752f);
  } else {
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return x / (1.0f + expf(-2.0f * u));
  }
}

// One block per row; threads stride over the output width, 16 bytes at a time when aligned.
template <class T, Activation A, bool kVec>
__device__ __forceinline__ void act_and_mul_row(const ActAndMulParams& p) {
  pdl_wait();
  const T* x = static_cast<const T*>(p.input) + blockIdx.x * p.in_stride_row;
  T* y = static_cast<T*>(p.out) + blockIdx.x * p.out_stride_row;
  if constexpr (kVec) {
    constexpr int V = kVecElems<T>;
    for (int64_t c = threadIdx.x; c < p.d / V; c += blockDim.x) {
      float g[V], u[V];
      load_vec(x + c * V, g);
      load_vec(x + p.d + c * V, u);
#pragma unroll
      for (int j = 0; j < V; ++j) g[j] = act<A>(g[j]) * u[j];
      store_vec(y + c * V, g);
    }
  } else {
    for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x) {
      const float g = to_f32(x[i * p.in_stride_d]);
      const float u = to_f32(x[(p.d + i) * p.in_stride_d]);
      y[i * p.out_stride_d] = from_f32<T>(act<A>(g) * u);
    }
  }
  pdl_launch_dependents();
}

// The vector and element-load instances carry different names (`*_kernel` / `*_strided_kernel`)
// so that the static SASS rule `rowops` (scripts/check_sass.py) selects the vector ones.
template <class T, Activation A>
__global__ void act_and_mul_kernel(ActAndMulParams p) {
  act_and_mul_row<T, A, true>(p);
}

template <class T, Activation A>
__global__ void act_and_mul_strided_kernel(ActAndMulParams p) {
  act_and_mul_row<T, A, false>(p);
}

template <class T, Activation A>
void launch(const ActAndMulParams& p, cudaStream_t stream, bool enable_pdl) {
  if (p.rows == 0 || p.d == 0) return;
  FLASHINFER_CHECK_CODE(p.rows <= 0x7FFFFFFF, ErrorCode::kUnsupported, "act_and_mul", "input",
                        "more than 2^31 - 1 rows");
  constexpr int V = kVecElems<T>;
  const bool vec = p.in_stride_d == 1 && p.out_stride_d == 1 && p.d % V == 0 &&
                   aligned16(p.input, p.in_stride_row, sizeof(T)) &&
                   aligned16(p.out, p.out_stride_row, sizeof(T));
  launch_kernel("act_and_mul", vec ? act_and_mul_kernel<T, A> : act_and_mul_strided_kernel<T, A>,
                dim3(static_cast<unsigned>(p.rows)),
                dim3(static_cast<unsigned>(threads_for(vec ? p.d / V : p.d))), 0, stream,
                enable_pdl, p);
}

template <class T>
void dispatch_act(const ActAndMulParams& p, cudaStream_t stream, bool enable_pdl) {
  switch (p.act) {
    case Activation::kSilu:
      return launch<T, Activation::kSilu>(p, stream, enable_pdl);
    case Activation::kGelu:
      return launch<T, Activation::kGelu>(p, stream, enable_pdl);
    case Activation::kGeluTanh:
      return launch<T, Activation::kGeluTanh>(p, stream, enable_pdl);
  }
}

}  // namespace

void act_and_mul(const ActAndMulParams& p, void* stream, bool enable_pdl) {
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "act_and_mul", "input", [&]<class T>() { dispatch_act<T>(p, s, enable_pdl); });
}

}  // namespace flashinfer::kernels::cuda
