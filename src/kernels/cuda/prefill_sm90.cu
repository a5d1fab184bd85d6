// Host side of the Hopper prefill kernel (prefill_sm90_kernel.cuh): the dispatch rule and the
// launch, grid and slices as the FA2 kernel's (prefill_fa2_launch.cuh). Compiled for sm_90a only,
// with CUTLASS's headers (src/CMakeLists.txt, the flashinfer_cutlass target).
#include <atomic>
#include <cstdlib>
#include <string_view>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/prefill_cuda.h"
#include "kernels/cuda/prefill_sm90.h"
#include "kernels/cuda/prefill_sm90_kernel.cuh"

namespace flashinfer::kernels::cuda {
namespace {

std::atomic<uint64_t> g_launches{0};

template <class T, class TKV, int D, bool kSoftCap>
void launch_sm90(const AttentionParams& p, cudaStream_t stream, bool enable_pdl) {
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
    const dim3 grid(
        static_cast<unsigned>(p.num_kv_heads), static_cast<unsigned>(slice.count),
        static_cast<unsigned>((max_rows + prefill::kSm90CtaQ - 1) / prefill::kSm90CtaQ));
    launch_kernel("attention", prefill::batch_prefill_sm90_kernel<T, TKV, D, kSoftCap>, grid,
                  dim3(prefill::kSm90Threads), prefill::prefill_sm90_smem_bytes(D), stream,
                  enable_pdl, kp);
  }
}

}  // namespace

bool prefill_sm90(const AttentionParams& p, void* stream, bool enable_pdl) {
  if (p.prefill_fa2_only) return false;
  if (const char* e = std::getenv("FLASHINFER_PREFILL_SM90"); e && std::string_view(e) == "0") {
    return false;
  }
  int device = 0, major = 0, minor = 0, optin = 0;
  FLASHINFER_CUDA_CALL("attention", cudaGetDevice(&device));
  FLASHINFER_CUDA_CALL("attention",
                       cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FLASHINFER_CUDA_CALL("attention",
                       cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  FLASHINFER_CUDA_CALL(
      "attention", cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (!prefill_sm90_takes(p, major, minor, optin)) return false;
  const bool fp8 = p.kv.dtype == DType::kFloat8E4M3FN || p.kv.dtype == DType::kFloat8E5M2;
  const bool cap = p.logits_soft_cap > 0.0f;
  auto s = static_cast<cudaStream_t>(stream);
  const bool bf16 = p.q_dtype == DType::kBFloat16;
  auto launch = [&]<int D>() {
    auto kinds = [&]<class T>() {
      if (fp8) {
        cap ? launch_sm90<T, uint8_t, D, true>(p, s, enable_pdl)
            : launch_sm90<T, uint8_t, D, false>(p, s, enable_pdl);
      } else {
        cap ? launch_sm90<T, T, D, true>(p, s, enable_pdl)
            : launch_sm90<T, T, D, false>(p, s, enable_pdl);
      }
    };
    if (bf16) {
      kinds.template operator()<__nv_bfloat16>();
    } else {
      kinds.template operator()<__half>();
    }
  };
  if (p.head_dim_qk == 64) {
    launch.template operator()<64>();
  } else if (p.head_dim_qk == 128) {
    launch.template operator()<128>();
  } else {
    launch.template operator()<256>();
  }
  g_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

uint64_t prefill_sm90_launches() { return g_launches.load(std::memory_order_relaxed); }

}  // namespace flashinfer::kernels::cuda
