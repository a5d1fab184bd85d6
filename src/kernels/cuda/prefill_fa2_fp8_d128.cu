// The FA2 prefill kernel's instances for fp8 K/V (e4m3 and e5m2) with head dims 128/128
// (prefill_fa2_launch.cuh).
#include "kernels/cuda/prefill_fa2_launch.cuh"

namespace flashinfer::kernels::cuda {
FLASHINFER_PREFILL_FA2_FP8_PAIR(128, 128)
}  // namespace flashinfer::kernels::cuda
