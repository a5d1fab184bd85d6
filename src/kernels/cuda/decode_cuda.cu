// CUDA-core attention kernel (decode, and any work item shape), the split-KV merge pass, and
// the dispatch between it and the tensor-core prefill kernel.
#include <type_traits>

#include "jit/attention_jit.h"
#include "kernels/cuda/attention_decode_kernel.cuh"
#include "kernels/cuda/attention_jit_launch.h"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/decode_cuda.h"
#include "kernels/cuda/prefill_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

using namespace cuda_core;

template <class TQ, class TKV, class TO, int DQK, int DVO>
void launch_cuda_core(const AttentionParams& p, cudaStream_t stream, bool enable_pdl) {
  const int32_t group = p.num_qo_heads / p.num_kv_heads;
  const int64_t max_rows = static_cast<int64_t>(p.max_work_rows) * group;
  const dim3 grid(static_cast<unsigned>(p.num_work), static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>((max_rows + kRowsPerBlock - 1) / kRowsPerBlock));
  const std::size_t smem = smem_bytes(DQK, DVO);
  launch_kernel("attention", attention_cuda_core_kernel<TQ, TKV, TO, DQK, DVO>, grid,
                dim3(kWarps * 32), smem, stream, enable_pdl, p);
}

// Head dims outside the AOT set: the same kernel, compiled by NVRTC for (DQK, DVO); the spec is
// built on the first launch only (the key spells the same parameters).
void launch_cuda_core_jit(const AttentionParams& p, cudaStream_t stream, bool enable_pdl) {
  const int32_t group = p.num_qo_heads / p.num_kv_heads;
  const int64_t max_rows = static_cast<int64_t>(p.max_work_rows) * group;
  auto make = [&] {
    return jit::attention_cuda_core_spec(p.q_dtype, p.kv.dtype, p.o_dtype, p.head_dim_qk,
                                         p.head_dim_vo);
  };
  const std::string key = "cuda_core:" + std::to_string(static_cast<int>(p.q_dtype)) + ":" +
                          std::to_string(static_cast<int>(p.kv.dtype)) + ":" +
                          std::to_string(static_cast<int>(p.o_dtype)) + ":" +
                          std::to_string(p.head_dim_qk) + ":" + std::to_string(p.head_dim_vo);
  launch_attention_jit(key, make, p, static_cast<unsigned>(p.num_work),
                       static_cast<unsigned>(p.num_kv_heads),
                       static_cast<unsigned>((max_rows + kRowsPerBlock - 1) / kRowsPerBlock),
                       kWarps * 32, smem_bytes(p.head_dim_qk, p.head_dim_vo), stream, enable_pdl);
}

template <class TQ, class TKV, class TO>
void dispatch_dims(const AttentionParams& p, cudaStream_t stream, bool enable_pdl) {
  if (p.head_dim_qk == p.head_dim_vo) {
    switch (p.head_dim_qk) {
      case 64:
        return launch_cuda_core<TQ, TKV, TO, 64, 64>(p, stream, enable_pdl);
      case 128:
        return launch_cuda_core<TQ, TKV, TO, 128, 128>(p, stream, enable_pdl);
      case 256:
        return launch_cuda_core<TQ, TKV, TO, 256, 256>(p, stream, enable_pdl);
      default:
        break;
    }
  }
  if (!jit::attention_head_dim_ok(p.head_dim_qk) || !jit::attention_head_dim_ok(p.head_dim_vo)) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, "attention", "head_dim", "head dims (", p.head_dim_qk,
                    ", ", p.head_dim_vo, ") are not supported on CUDA (multiples of 16 up to 256)");
  }
  launch_cuda_core_jit(p, stream, enable_pdl);
}

template <class T>
void dispatch_kv(const AttentionParams& p, cudaStream_t stream, bool enable_pdl) {
  if (p.o_dtype != p.q_dtype) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, "attention", "o_data_type",
                    "on CUDA the output dtype must be q's dtype");
  }
  const auto unsupported = [&] {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, "attention", "kv_data_type", "dtype ",
                    dtype_torch_name(p.kv.dtype), " is not supported on CUDA with q ",
                    dtype_torch_name(p.q_dtype));
  };
  // fp16/bf16 K/V only with q's dtype; fp8 K/V with either.
  visit_dtype<CudaElements, kFloat16, kBFloat16, kFloat8E4M3FN, kFloat8E5M2>(
      p.kv.dtype,
      [&]<class TKV>() {
        if constexpr (std::is_same_v<TKV, __half> || std::is_same_v<TKV, __nv_bfloat16>) {
          if (p.kv.dtype != p.q_dtype) unsupported();
          dispatch_dims<T, T, T>(p, stream, enable_pdl);
        } else {
          dispatch_dims<T, TKV, T>(p, stream, enable_pdl);
        }
      },
      unsupported);
}

template <class TO>
void launch_merge(const AttentionParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.num_merge), static_cast<unsigned>(p.num_qo_heads));
  merge_partials_kernel<TO><<<grid, 128, 0, stream>>>(p);
  FLASHINFER_CUDA_CALL("attention", cudaGetLastError());
}

}  // namespace

int sm_count(int device) {
  int n = 0;
  FLASHINFER_CUDA_CALL("attention",
                       cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  return n;
}

void batch_attention(const AttentionParams& p, void* stream, bool enable_pdl) {
  auto s = static_cast<cudaStream_t>(stream);
  if (p.num_work == 0) return;
  if (p.use_tensor_cores && prefill_supported(p)) {
    batch_prefill(p, stream, enable_pdl);
  } else {
    dispatch_dtype<CudaElements, kFloat16, kBFloat16>(
        p.q_dtype, "attention", "q", [&]<class T>() { dispatch_kv<T>(p, s, enable_pdl); });
  }
  if (p.num_merge == 0) return;
  dispatch_dtype<CudaElements, kFloat16, kBFloat16>(p.q_dtype, "attention", "q",
                                                    [&]<class TO>() { launch_merge<TO>(p, s); });
}

}  // namespace flashinfer::kernels::cuda
