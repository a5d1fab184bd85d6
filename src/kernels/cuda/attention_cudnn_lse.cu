// The cuDNN attention backend's one kernel of its own (kernels/cuda/attention_cudnn.h): cuDNN
// writes the log-sum-exp in natural-log units (the frontend's base-2 statistics need cuDNN 9.27),
// and this library returns it base 2, as the CPU reference and upstream's kernels do (upstream's
// cuDNN paths multiply by log2(e) after the graph too).
#include "kernels/cuda/attention_cudnn.h"

#include <algorithm>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/fp32_rules.h"

namespace flashinfer::kernels::cuda {
namespace {

__global__ void lse_to_log2_kernel(float* lse, int64_t rows, int64_t heads, int64_t stride_n,
                                   int64_t stride_h) {
  const int64_t total = rows * heads;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    float* x = lse + (i / heads) * stride_n + (i % heads) * stride_h;
    *x = __fmul_rn(*x, exp_f32_consts::kLog2e);
  }
}

}  // namespace

void lse_natural_to_log2(float* lse, int64_t rows, int64_t heads, int64_t stride_n,
                         int64_t stride_h, void* stream, const char* op) {
  const int64_t total = rows * heads;
  if (total <= 0) return;
  constexpr int kThreads = 256;
  const auto blocks =
      static_cast<unsigned>(std::min<int64_t>((total + kThreads - 1) / kThreads, 1024));
  launch_kernel(op, lse_to_log2_kernel, dim3(blocks), dim3(kThreads), 0,
                static_cast<cudaStream_t>(stream), false, lse, rows, heads, stride_n, stride_h);
}

}  // namespace flashinfer::kernels::cuda
