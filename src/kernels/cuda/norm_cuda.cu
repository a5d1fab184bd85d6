#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/norm_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

// One block per row: pass 1 sums squares in fp32, pass 2 scales and writes. Rows are short
// (hidden <= a few 10k), so the second read hits L1/L2.
template <class T>
__global__ void rmsnorm_kernel(RmsNormParams p) {
  __shared__ float scratch[32];
  pdl_wait();
  const int64_t r = blockIdx.x;
  const int64_t b = r / p.heads, h = r % p.heads;
  const T* x = static_cast<const T*>(p.input) + b * p.in_stride_b + h * p.in_stride_h;
  const T* w = static_cast<const T*>(p.weight);
  T* y = static_cast<T*>(p.out) + b * p.out_stride_b + h * p.out_stride_h;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < p.hidden; i += blockDim.x) {
    const float v = to_f32(x[i * p.in_stride_d]);
    sum += v * v;
  }
  sum = block_reduce_sum(sum, scratch);
  const float r_rms = rsqrtf(sum / static_cast<float>(p.hidden) + p.eps);
  for (int64_t i = threadIdx.x; i < p.hidden; i += blockDim.x) {
    const float v = to_f32(x[i * p.in_stride_d]);
    const float g = to_f32(w[i * p.weight_stride]) + p.weight_bias;
    y[i * p.out_stride_d] = from_f32<T>(v * r_rms * g);
  }
  pdl_launch_dependents();
}

template <class T>
void launch(const RmsNormParams& p, cudaStream_t stream, bool enable_pdl) {
  const int64_t rows = p.batch * p.heads;
  if (rows == 0) return;
  int threads = 32;
  while (threads < 1024 && threads < p.hidden) threads *= 2;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(rows));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = enable_pdl ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  FLASHINFER_CUDA_CALL("rmsnorm", cudaLaunchKernelEx(&cfg, rmsnorm_kernel<T>, p));
}

}  // namespace

void rmsnorm(const RmsNormParams& p, void* stream, bool enable_pdl) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case DType::kFloat32:
      return launch<float>(p, s, enable_pdl);
    case DType::kFloat16:
      return launch<__half>(p, s, enable_pdl);
    case DType::kBFloat16:
      return launch<__nv_bfloat16>(p, s, enable_pdl);
    default:
      FLASHINFER_FAIL(ErrorCode::kUnsupported, "rmsnorm", "input", "dtype ",
                      dtype_torch_name(p.dtype), " is not supported on CUDA");
  }
}

}  // namespace flashinfer::kernels::cuda
