// The paged wrappers' run-time page ids (kernels/page_guard.h): a block per request copies and
// checks its ids before the attention kernels, and a block per request writes a bad request's
// NaN rows after them. Neither is launched with PDL: the copy must see the stream's writes to the
// caller's ids, and the NaN rows must land after the kernels' (and the merge's) stores.
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/page_guard_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kGuardThreads = 128;

__global__ void __launch_bounds__(kGuardThreads) page_guard_copy_kernel(PageGuardParams p) {
  const int32_t b = static_cast<int32_t>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  const bool bad = __syncthreads_or(kernels::page_guard_copy(p, b, tid, kGuardThreads) ? 1 : 0);
  if (tid == 0) p.bad[b] = bad ? 1 : 0;
}

__global__ void __launch_bounds__(kGuardThreads) page_guard_nan_kernel(PageGuardParams p) {
  kernels::page_guard_nan_rows(p, static_cast<int32_t>(blockIdx.x), static_cast<int>(threadIdx.x),
                               kGuardThreads);
}

}  // namespace

void page_guard_copy(const PageGuardParams& p, void* stream) {
  if (p.batch == 0) return;
  launch_kernel("page_guard_copy", page_guard_copy_kernel, dim3(static_cast<unsigned>(p.batch)),
                dim3(kGuardThreads), 0, static_cast<cudaStream_t>(stream), /*enable_pdl=*/false, p);
}

void page_guard_nan_rows(const PageGuardParams& p, void* stream) {
  if (p.batch == 0) return;
  launch_kernel("page_guard_nan_rows", page_guard_nan_kernel, dim3(static_cast<unsigned>(p.batch)),
                dim3(kGuardThreads), 0, static_cast<cudaStream_t>(stream), /*enable_pdl=*/false, p);
}

}  // namespace flashinfer::kernels::cuda
