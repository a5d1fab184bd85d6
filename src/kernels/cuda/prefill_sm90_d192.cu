// The Hopper prefill kernel's tall-block instances at DeepSeek's head dims, qk 192 / vo 128
// (prefill_sm90_launch.cuh), apart from prefill_sm90.cu's so that nvcc compiles the two sets in
// parallel. 16-bit K/V, plain or soft-capped, the plain and ping-pong schedules, each also in the
// warp-specialized form. sm_90a only.
#include "kernels/cuda/prefill_sm90_launch.cuh"

namespace flashinfer::kernels::cuda {

bool launch_sm90_d192(const AttentionParams& p, cudaStream_t s, bool enable_pdl, bool ping_pong,
                      bool ws) {
  return launch_sm90_dims<2, 192, 128>(p, s, enable_pdl, ping_pong, ws);
}

}  // namespace flashinfer::kernels::cuda
