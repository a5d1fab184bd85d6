// The launch of a prefill attention kernel over a plan's work items, shared by the FA2 kernel
// (prefill_fa2_launch.cuh) and the Hopper kernel (prefill_sm90_launch.cuh): both blocks read the
// same parameters (the scale in base 2, the page split precomputed) and walk the same grid.
#pragma once

#include "kernels/cuda/attention_cuda_common.cuh"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/device/fastdiv.cuh"
#include "kernels/cuda/prefill_shape.h"

namespace flashinfer::kernels::cuda {

/// current_device_attribute for the prefill launchers' block choices (errors name "attention").
inline int current_device_attribute(cudaDeviceAttr attr) {
  return current_device_attribute(attr, "attention");
}

/// Launches `kernel(kp)` for p's work items: KV heads along x, work items from the plan's last
/// along y in slices of at most 65535 (the last first: heaviest blocks first,
/// prefill_grid_slice), chunks of `cta_rows` packed rows along z; `threads` a block, `smem`
/// bytes of dynamic shared memory. kp is p with sm_scale_log2 and the token -> (page, slot)
/// divisor's parts filled in (a division and a loop the blocks would otherwise each run).
template <class Kernel>
void launch_prefill_grid(const AttentionParams& p, Kernel kernel, int cta_rows, int threads,
                         std::size_t smem, cudaStream_t stream, bool enable_pdl) {
  const int32_t group = p.num_qo_heads / p.num_kv_heads;
  const int64_t max_rows = static_cast<int64_t>(p.max_work_rows) * group;
  AttentionParams kp = p;
  kp.sm_scale_log2 = p.sm_scale * kLog2e;
  const dev::FastDivmod split(
      prefill::prefill_page_divisor(p.kv.kv_indices != nullptr, p.kv.page_size));
  kp.kv_page_div_mul = split.mul;
  kp.kv_page_div_shift = split.shift;
  for (int i = 0;; ++i) {
    const prefill::PrefillSlice slice = prefill::prefill_grid_slice(p.num_work, i);
    if (slice.count == 0) break;
    kp.work = p.work + slice.first;
    kp.num_work = slice.count;
    const dim3 grid(static_cast<unsigned>(p.num_kv_heads), static_cast<unsigned>(slice.count),
                    static_cast<unsigned>((max_rows + cta_rows - 1) / cta_rows));
    launch_kernel("attention", kernel, grid, dim3(static_cast<unsigned>(threads)), smem, stream,
                  enable_pdl, kp);
  }
}

}  // namespace flashinfer::kernels::cuda
