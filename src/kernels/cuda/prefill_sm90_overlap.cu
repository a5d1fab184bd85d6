// The Hopper prefill kernel's overlapped form (prefill_sm90_kernel.cuh, kOverlap: the
// warp-specialized form with each tile's softmax under the next tile's S and the previous tile's
// P V products), apart from prefill_sm90.cu's instances so that nvcc compiles them in parallel.
// Tall blocks at head dims 128 and 192 / 128, 16-bit K/V, bf16 / fp16, not soft-capped, with and
// without the ping-pong turns: 8 instances. sm_90a only.
#include "kernels/cuda/prefill_sm90_launch.cuh"

namespace flashinfer::kernels::cuda {

bool launch_sm90_overlap(const AttentionParams& p, cudaStream_t s, bool enable_pdl,
                         bool ping_pong) {
  auto run = [&]<class T, int DQK, int DVO>() {
    auto form = [&]<bool kPingPong>() {
      static const bool ok = prefill_sm90_ws_registers_ok(reinterpret_cast<const void*>(
          prefill::batch_prefill_sm90_kernel<T, T, DQK, DVO, false, 2, kPingPong, true, true>));
      if (ok) launch_sm90<T, T, DQK, DVO, false, 2, kPingPong, true, true>(p, s, enable_pdl);
      return ok;
    };
    return ping_pong ? form.template operator()<true>() : form.template operator()<false>();
  };
  const bool bf16 = p.q_dtype == DType::kBFloat16;
  if (p.head_dim_qk == 128 && p.head_dim_vo == 128) {
    return bf16 ? run.template operator()<__nv_bfloat16, 128, 128>()
                : run.template operator()<__half, 128, 128>();
  }
  if (p.head_dim_qk == 192 && p.head_dim_vo == 128) {
    return bf16 ? run.template operator()<__nv_bfloat16, 192, 128>()
                : run.template operator()<__half, 192, 128>();
  }
  FLASHINFER_FAIL(ErrorCode::kInternal, "attention", "q",
                  "no overlapped Hopper prefill instance for head dims ", p.head_dim_qk, "/",
                  p.head_dim_vo);
}

}  // namespace flashinfer::kernels::cuda
