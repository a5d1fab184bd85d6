// The device-side plan of the block-table decode calls (kernels/block_table_plan.h): a block per
// request reads its length and checks the page ids its keys need, then writes that request's part
// of the plan (block_plan_write_request, which the CPU tests run thread by thread), so no block
// waits on another. In the compact layout each block also sums the tiles of the requests before
// its own (a block-wide reduction of block_plan_compact_offset_part) to place its items.
#include "kernels/cuda/block_table_plan_cuda.h"
#include "kernels/cuda/cuda_utils.cuh"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kPlanThreads = 128;

__global__ void __launch_bounds__(kPlanThreads) block_table_plan_kernel(BlockTablePlan p) {
  const int32_t b = static_cast<int32_t>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t len = p.seq_lens[b * p.seq_lens_stride];
  // Variable query counts: every block checks the whole cum_seq_lens_q (batch + 1 ints).
  const bool cu_bad = __syncthreads_or(block_plan_cu_bad(p, tid, kPlanThreads) ? 1 : 0) != 0;
  bool ok = !cu_bad && block_plan_request_ok(p, b, len);
  if (ok) {  // the same for the whole block
    ok = __syncthreads_or(block_plan_pages_bad(p, b, len, tid, kPlanThreads) ? 1 : 0) == 0;
  }
  block_plan_write_request(p, b, len, ok, tid, kPlanThreads);
  if (p.compact) {  // the same for the whole block: its first tile, summed over the block
    __shared__ long long part[kPlanThreads];
    part[tid] = cu_bad ? 0 : block_plan_compact_offset_part(p, b, tid, kPlanThreads);
    __syncthreads();
    for (int w = kPlanThreads / 2; w > 0; w >>= 1) {
      if (tid < w) part[tid] += part[tid + w];
      __syncthreads();
    }
    block_plan_write_compact(p, b, len, ok, !cu_bad, part[0], tid, kPlanThreads);
  }
  if (cu_bad) block_plan_refuse_all_rows(p, b, tid, kPlanThreads);
  if (p.max_kv != nullptr && ok && tid == 0) atomicMax(p.max_kv, static_cast<int32_t>(len));
}

}  // namespace

void block_table_plan(const BlockTablePlan& p, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.max_kv != nullptr) {
    FLASHINFER_CUDA_CALL("block_table_plan", cudaMemsetAsync(p.max_kv, 0, sizeof(int32_t), s));
  }
  if (p.row_req != nullptr && p.cu_q != nullptr && p.total_rows > 0) {  // rows of no request: -1
    FLASHINFER_CUDA_CALL(
        "block_table_plan",
        cudaMemsetAsync(p.row_req, 0xFF, static_cast<std::size_t>(p.total_rows) * sizeof(int32_t),
                        s));
  }
  if (p.batch == 0) return;
  launch_kernel("block_table_plan", block_table_plan_kernel, dim3(static_cast<unsigned>(p.batch)),
                dim3(kPlanThreads), 0, s, /*enable_pdl=*/false, p);
}

}  // namespace flashinfer::kernels::cuda
