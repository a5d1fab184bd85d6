// The Hopper prefill kernel's multi-item scoring instances (prefill_sm90_kernel.cuh, kMultiItem:
// each query row's two runs of keys tested per key, the tiles no row of a block sees skipped),
// apart from prefill_sm90.cu's so that nvcc compiles them in parallel. Head dims 128, bf16 / fp16
// q with K/V of its dtype, no soft cap, the plain schedule, in tall and one-warpgroup blocks: 4
// instances (prefill_sm90_multi_item_built). sm_90a only.
#include "kernels/cuda/prefill_sm90_launch.cuh"

namespace flashinfer::kernels::cuda {

void launch_sm90_multi_item(const AttentionParams& p, cudaStream_t s, bool enable_pdl, int wg) {
  if (p.head_dim_qk != 128 || p.head_dim_vo != 128 || dtype_is_fp8(p.kv.dtype) ||
      p.logits_soft_cap > 0.0f) {
    FLASHINFER_FAIL(ErrorCode::kInternal, "attention", "q",
                    "no Hopper multi-item scoring instance for head dims ", p.head_dim_qk, "/",
                    p.head_dim_vo);
  }
  auto run = [&]<class T>() {
    if (wg == 2) {
      launch_sm90<T, T, 128, 128, false, 2, false, false, false, true>(p, s, enable_pdl);
    } else {
      launch_sm90<T, T, 128, 128, false, 1, false, false, false, true>(p, s, enable_pdl);
    }
  };
  if (p.q_dtype == DType::kBFloat16) {
    run.template operator()<__nv_bfloat16>();
  } else {
    run.template operator()<__half>();
  }
}

}  // namespace flashinfer::kernels::cuda
