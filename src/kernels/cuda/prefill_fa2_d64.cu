// The FA2 prefill kernel's instances for head dims 64/64 (prefill_fa2_launch.cuh).
#include "kernels/cuda/prefill_fa2_launch.cuh"

namespace flashinfer::kernels::cuda {
FLASHINFER_PREFILL_FA2_PAIR(64, 64)
}  // namespace flashinfer::kernels::cuda
