// cudnn_batch_prefill_with_kv_cache's ragged-call prepass (kernels/cudnn_ragged_plan.h): one block
// of kThreads threads, each a contiguous chunk of requests. Each thread sums its chunk's counts,
// the block scans the sums (Hillis-Steele in shared memory), and each thread writes its chunk from
// its prefix; the block then ORs the rule breaks and takes the furthest key row for the verdict.
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/cudnn_ragged_plan_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) cudnn_ragged_plan_kernel(CudnnRaggedPlan p) {
  const int t = static_cast<int>(threadIdx.x);
  __shared__ long long sq[kThreads], sk[kThreads];
  const CudnnPlanSums own = cudnn_plan_chunk_sums(p, t, kThreads);
  sq[t] = own.q;
  sk[t] = own.kv;
  __syncthreads();
  for (int w = 1; w < kThreads; w <<= 1) {  // inclusive scan
    const long long aq = t >= w ? sq[t - w] : 0, ak = t >= w ? sk[t - w] : 0;
    __syncthreads();
    sq[t] += aq;
    sk[t] += ak;
    __syncthreads();
  }
  const CudnnPlanVerdict v = cudnn_plan_write_chunk(p, t, kThreads, sq[t] - own.q, sk[t] - own.kv);
  const bool bad = __syncthreads_or(v.bad ? 1 : 0) != 0;
  __shared__ long long end[kThreads];
  end[t] = v.max_end;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (t < w && end[t + w] > end[t]) end[t] = end[t + w];
    __syncthreads();
  }
  if (t == 0) *p.refuse = cudnn_plan_refused(p, bad, end[0]) ? 1 : 0;
}

}  // namespace

void cudnn_ragged_plan(const CudnnRaggedPlan& p, void* stream) {
  launch_kernel("cudnn_ragged_plan", cudnn_ragged_plan_kernel, dim3(1), dim3(kThreads), 0,
                static_cast<cudaStream_t>(stream), /*enable_pdl=*/false, p);
}

}  // namespace flashinfer::kernels::cuda
