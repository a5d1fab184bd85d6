// grouped_mm_fp8's Hopper path: the e4m3 x e4m3 -> bf16 instance of CUTLASS's sm90 grouped GEMM
// (grouped_gemm_cutlass.cuh; the entry point is in grouped_gemm_cutlass.cu). Its own source so
// that the two instances compile in parallel.
#include "kernels/cuda/grouped_gemm_cutlass.cuh"

namespace flashinfer::kernels::cuda::cutlass_grouped {

bool run_e4m3(const GroupedMmCudaParams& p, cudaStream_t s, int device, StreamScratchPool& pool,
              const char* op) {
  return run_instance<E4m3>(p, s, device, pool, op);
}

}  // namespace flashinfer::kernels::cuda::cutlass_grouped
