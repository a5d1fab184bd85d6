#include <algorithm>
#include <cstdint>

#include "flashinfer/float_formats.h"
#include "kernels/cuda/comm_sync.cuh"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/mixed_comm_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

// Step 1: this rank's x_in (16-byte words; n_in is a multiple of 8 elements in the fused modes,
// any count in the NCCL ones) into its slot of the call about to be made (the counter still
// holds the last one).
__global__ void mixed_comm_put_kernel(MixedCommParams p) {
  pdl_wait();
  char* mine = p.peer_buf[p.rank];
  const uint32_t seq = *reinterpret_cast<const uint32_t*>(mine + MixedCommParams::kSeqOffset) + 1;
  char* slot = mine + MixedCommParams::kSlotsOffset + static_cast<int64_t>(seq & 1) * p.slot_bytes;
  const auto* src = static_cast<const uint16_t*>(p.x_in);
  auto* dst = reinterpret_cast<uint16_t*>(slot);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool vec = (p.n_in % 8) == 0 && (reinterpret_cast<uintptr_t>(src) % 16) == 0;
  if (vec) {
    const auto* s4 = reinterpret_cast<const uint4*>(src);
    auto* d4 = reinterpret_cast<uint4*>(dst);
    for (int64_t i = first; i < p.n_in / 8; i += stride) d4[i] = s4[i];
  } else {
    for (int64_t i = first; i < p.n_in; i += stride) dst[i] = src[i];
  }
  __threadfence_system();  // the peers read these from other devices
}

// Step 2 (one thread): the call made and published, every peer's awaited.
__global__ void mixed_comm_sync_kernel(MixedCommParams p) {
  char* mine = p.peer_buf[p.rank];
  auto* counter = reinterpret_cast<uint32_t*>(mine + MixedCommParams::kSeqOffset);
  const uint32_t seq = *counter + 1;
  *counter = seq;
  __threadfence_system();
  store_release_sys(reinterpret_cast<uint32_t*>(mine + MixedCommParams::kFlagOffset), seq);
  for (int r = 0; r < p.size; ++r) {
    wait_for_call(reinterpret_cast<const uint32_t*>(p.peer_buf[r] + MixedCommParams::kFlagOffset),
                  seq, p.abort);
  }
}

// Step 3: every output element, each by one thread in the CPU reference's order.
__global__ void mixed_comm_get_kernel(MixedCommParams p) {
  const uint32_t seq =
      *reinterpret_cast<const uint32_t*>(p.peer_buf[p.rank] + MixedCommParams::kSeqOffset);
  const int64_t slot = MixedCommParams::kSlotsOffset + static_cast<int64_t>(seq & 1) * p.slot_bytes;
  auto bits = [&](int r, int64_t e) {
    return static_cast<uint16_t>(
        __ldcg(reinterpret_cast<const unsigned short*>(p.peer_buf[r] + slot) + e));
  };
  auto to_f = [&](uint16_t b) {
    return p.bf16 ? bfloat16_bits_to_float(b) : half_bits_to_float(b);
  };
  auto round = [&](float v) { return p.bf16 ? float_to_bfloat16_bits(v) : float_to_half_bits(v); };
  auto* out = static_cast<uint16_t*>(p.x_out);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n_out;
       i += stride) {
    out[i] = mixed_comm_output(p, i, bits, to_f, round);
  }
}

}  // namespace

void preload_mixed_comm() {
  preload_kernels("run_mixed_comm", {reinterpret_cast<const void*>(mixed_comm_put_kernel),
                                     reinterpret_cast<const void*>(mixed_comm_sync_kernel),
                                     reinterpret_cast<const void*>(mixed_comm_get_kernel)});
}

void mixed_comm(const MixedCommParams& p, void* stream, bool enable_pdl, int sm_count) {
  const auto s = static_cast<cudaStream_t>(stream);
  auto blocks_for = [&](int64_t work) {
    return static_cast<int>(std::max<int64_t>(
        1, std::min<int64_t>((work + 255) / 256, static_cast<int64_t>(sm_count) * 4)));
  };
  launch_kernel("run_mixed_comm", mixed_comm_put_kernel, dim3(blocks_for(p.n_in / 8 + 1)),
                dim3(256), 0, s, enable_pdl, p);
  launch_kernel("run_mixed_comm", mixed_comm_sync_kernel, dim3(1), dim3(1), 0, s, false, p);
  launch_kernel("run_mixed_comm", mixed_comm_get_kernel, dim3(blocks_for(p.n_out)), dim3(256), 0, s,
                false, p);
}

}  // namespace flashinfer::kernels::cuda
