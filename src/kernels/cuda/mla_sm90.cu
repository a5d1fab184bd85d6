// Host side of the Hopper MLA decode kernel (mla_sm90_kernel.cuh; the rule in mla_sm90.h): its
// five instances (bf16 / fp16 with a cache of that type or fp8, trtllm's e4m3 queries) and their
// launch. Compiled for sm_90a only, with CUTLASS's headers
// (src/CMakeLists.txt, the flashinfer_cutlass target); mla_cuda.cu calls it.
#include <atomic>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/mla_sm90.h"
#include "kernels/cuda/mla_sm90_kernel.cuh"

namespace flashinfer::kernels::cuda::mla {

namespace {
std::atomic<long long> g_launches{0};
}  // namespace

long long mla_sm90_launches() { return g_launches.load(std::memory_order_relaxed); }

int launch_mla_sm90(const MlaAttentionParams& p, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                    uint32_t page_size, int32_t chunk, float* part_o, float* part_ml, void* stream,
                    bool enable_pdl) {
  const dev::FastDivmod ps(page_size);
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(grid_x, grid_y, grid_z), block(kSm90MlaThreads);
  const bool fp8_cache = dtype_is_fp8(p.kv_dtype);
  cudaError_t err = cudaErrorInvalidValue;  // dtypes mla_sm90_takes refuses
  const auto launch = [&]<class T, class TQ, class TKV>() {
    err =
        try_launch_kernel(mla_sm90_kernel<T, TQ, TKV>, grid, block, mla_sm90_smem_bytes(fp8_cache),
                          s, enable_pdl, p, ps, chunk, part_o, part_ml);
  };
  if (dtype_is_fp8(p.q_dtype)) {
    launch.template operator()<__nv_bfloat16, uint8_t, uint8_t>();  // mla_mma_dtypes
  } else if (p.q_dtype == DType::kBFloat16) {
    if (fp8_cache) {
      launch.template operator()<__nv_bfloat16, __nv_bfloat16, uint8_t>();
    } else {
      launch.template operator()<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16>();
    }
  } else if (p.q_dtype == DType::kFloat16) {
    if (fp8_cache) {
      launch.template operator()<__half, __half, uint8_t>();
    } else {
      launch.template operator()<__half, __half, __half>();
    }
  }
  if (err == cudaSuccess) g_launches.fetch_add(1, std::memory_order_relaxed);
  return static_cast<int>(err);
}

}  // namespace flashinfer::kernels::cuda::mla
