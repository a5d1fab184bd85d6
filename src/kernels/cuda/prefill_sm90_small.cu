// The Hopper prefill kernel's one-warpgroup (64-row) instances (prefill_sm90_launch.cuh), apart
// from prefill_sm90.cu's so that nvcc compiles the two in parallel. sm_90a only.
#include "kernels/cuda/prefill_sm90_launch.cuh"

namespace flashinfer::kernels::cuda {

void prefill_sm90_small(const AttentionParams& p, cudaStream_t s, bool enable_pdl) {
  launch_sm90_block<1>(p, s, enable_pdl);
}

}  // namespace flashinfer::kernels::cuda
