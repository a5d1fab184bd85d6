// Host side of the tensor-core prefill attention kernel (attention_prefill_kernel.cuh): which
// requests it serves, and its launch for the AOT head dims.
#include <type_traits>

#include "jit/attention_jit.h"
#include "kernels/cuda/attention_jit_launch.h"
#include "kernels/cuda/attention_prefill_kernel.cuh"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/prefill_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

using namespace mma;

template <class T, int D>
void launch(const AttentionParams& p, cudaStream_t stream, bool enable_pdl) {
  constexpr int kKvTile = kv_tile(D);
  const int32_t group = p.num_qo_heads / p.num_kv_heads;
  const int64_t max_rows = static_cast<int64_t>(p.max_work_rows) * group;
  const dim3 grid(static_cast<unsigned>(p.num_work), static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>((max_rows + kRows - 1) / kRows));
  const std::size_t smem = smem_bytes(D);
  launch_kernel("attention", prefill_mma_kernel<T, D, kKvTile>, grid, dim3(kWarps * 32), smem,
                stream, enable_pdl, p);
}

// Head dims outside the AOT set: the same kernel, compiled by NVRTC for D.
void launch_jit(const AttentionParams& p, cudaStream_t stream, bool enable_pdl) {
  const int32_t group = p.num_qo_heads / p.num_kv_heads;
  const int64_t max_rows = static_cast<int64_t>(p.max_work_rows) * group;
  auto make = [&] { return jit::attention_mma_spec(p.q_dtype, p.head_dim_qk); };
  const std::string key =
      "mma:" + std::to_string(static_cast<int>(p.q_dtype)) + ":" + std::to_string(p.head_dim_qk);
  launch_attention_jit(key, make, p, static_cast<unsigned>(p.num_work),
                       static_cast<unsigned>(p.num_kv_heads),
                       static_cast<unsigned>((max_rows + kRows - 1) / kRows), kWarps * 32,
                       smem_bytes(p.head_dim_qk), stream, enable_pdl);
}

template <class T>
void dispatch_dim(const AttentionParams& p, cudaStream_t stream, bool enable_pdl) {
  switch (p.head_dim_qk) {
    case 64:
      return launch<T, 64>(p, stream, enable_pdl);
    case 128:
      return launch<T, 128>(p, stream, enable_pdl);
    case 256:
      return launch<T, 256>(p, stream, enable_pdl);
    default:
      return launch_jit(p, stream, enable_pdl);
  }
}

}  // namespace

bool prefill_supported(const AttentionParams& p) {
  const bool dtype_ok = (p.q_dtype == DType::kFloat16 || p.q_dtype == DType::kBFloat16) &&
                        p.kv.dtype == p.q_dtype && p.o_dtype == p.q_dtype;
  // AOT for 64/128/256, JIT for any other multiple of 16 up to 256 (qk and vo equal here; the
  // CUDA-core kernel takes different ones).
  const bool dim_ok = p.head_dim_qk == p.head_dim_vo && jit::attention_head_dim_ok(p.head_dim_qk);
  // Sinks run on the CUDA-core kernel, which folds them in at the end of a row.
  if (!dtype_ok || !dim_ok || p.sinks != nullptr) return false;
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    return false;
  }
  return major >= 8;
}

void batch_prefill(const AttentionParams& p, void* stream, bool enable_pdl) {
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kFloat16, kBFloat16>(
      p.q_dtype, "attention", "q", [&]<class T>() { dispatch_dim<T>(p, s, enable_pdl); });
}

}  // namespace flashinfer::kernels::cuda
