// prepare_bf16_fp4_weights's cudnn layout on CUDA: the weight bytes are that layout already, the
// scales are gathered out of the 128x4 swizzle one byte per thread through the index the CPU
// reference uses (kernels/gemm_bf16_fp4_params.h), so every byte is the CPU's.
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/gemm_bf16_fp4_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kFp4GemmThreads = 256;

__global__ void bf16_fp4_cudnn_sf_kernel(const uint8_t* __restrict__ sf, uint8_t* __restrict__ out,
                                         int64_t n, int64_t ksf) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * ksf) return;
  out[i] = sf[bf16_fp4_cudnn_sf_source(i / ksf, i % ksf, ksf)];
}

}  // namespace

void bf16_fp4_prepare(const Bf16Fp4PrepareParams& p, void* stream) {
  const char* op = "prepare_bf16_fp4_weights";
  FLASHINFER_CHECK_CODE(p.layout == Bf16Fp4Layout::kCudnn, ErrorCode::kUnsupported, op, "backend",
                        "the CUDA kernel prepares the cudnn layout only");
  const int64_t ksf = p.k / 16, total = p.n * ksf;
  if (total == 0) return;
  const int64_t blocks = (total + kFp4GemmThreads - 1) / kFp4GemmThreads;
  FLASHINFER_CHECK_CODE(blocks <= 0x7FFFFFFF, ErrorCode::kUnsupported, op, "b",
                        "more than 2^31 - 1 blocks of scales");
  launch_kernel(op, bf16_fp4_cudnn_sf_kernel, dim3(static_cast<unsigned>(blocks)),
                dim3(kFp4GemmThreads), 0, static_cast<cudaStream_t>(stream), false, p.sf, p.out_sf,
                p.n, ksf);
}

}  // namespace flashinfer::kernels::cuda
