#include <cstdint>

#include "kernels/cuda/comm_sync.cuh"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/ulysses_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kUlyssesThreads = 512;

// Upstream's barrier for block blockIdx.x: thread t < W bumps its counter for peer t, publishes
// the value in peer t's signal (release, system scope) and waits for peer t's in its own
// (acquire). The fence first makes this block's pushes visible to the peers before the flag.
__device__ __forceinline__ void ulysses_barrier(const UlyssesA2aParams& p) {
  __threadfence_system();
  __syncthreads();
  const int b = blockIdx.x, t = threadIdx.x;
  if (t < p.world_size) {
    auto* own = static_cast<uint32_t*>(p.peer_signal[p.rank]);
    const uint32_t val = own[UlyssesSignal::self_word(b, t)] + 1;
    own[UlyssesSignal::self_word(b, t)] = val;
    store_release_sys(
        static_cast<uint32_t*>(p.peer_signal[t]) + UlyssesSignal::peer_word(val, b, p.rank), val);
    wait_for_call(own + UlyssesSignal::peer_word(val, b, t), val, p.abort);
  }
  __syncthreads();
}

// Copies one row of `bytes` bytes in units of U (16-byte vectors, or the element).
template <class U>
__device__ __forceinline__ void copy_row(char* dst, const char* src, int64_t bytes) {
  const int64_t n = bytes / static_cast<int64_t>(sizeof(U));
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    reinterpret_cast<U*>(dst)[i] = reinterpret_cast<const U*>(src)[i];
  }
}

template <class U>
__global__ void __launch_bounds__(kUlyssesThreads) ulysses_a2a_kernel(UlyssesA2aParams p) {
  ulysses_barrier(p);  // every peer's previous call is out of its staging buffer
  const int64_t eb = p.elem_bytes, row_bytes = p.row_elems() * eb;
  const auto* in = static_cast<const char*>(p.inp);
  for (int64_t row = blockIdx.x; row < p.rows(); row += gridDim.x) {
    auto* dst = static_cast<char*>(p.peer_out[p.row_peer(row)]) + p.dst_offset(row) * eb;
    copy_row<U>(dst, in + p.src_offset(row) * eb, row_bytes);
  }
  ulysses_barrier(p);  // this block's rows are in the peers' buffers, theirs in this rank's
}

}  // namespace

void preload_ulysses_a2a() {
  preload_kernels("ulysses_a2a", {reinterpret_cast<const void*>(ulysses_a2a_kernel<uint4>),
                                  reinterpret_cast<const void*>(ulysses_a2a_kernel<uint32_t>),
                                  reinterpret_cast<const void*>(ulysses_a2a_kernel<uint16_t>)});
}

void ulysses_a2a(const UlyssesA2aParams& p, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(p.blocks()), block(kUlyssesThreads);
  const int64_t row_bytes = p.row_elems() * p.elem_bytes;
  bool aligned = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p.inp) % 16 == 0;
  for (int r = 0; r < p.world_size; ++r) {
    aligned = aligned && reinterpret_cast<uintptr_t>(p.peer_out[r]) % 16 == 0;
  }
  if (aligned) {
    launch_kernel("ulysses_a2a", ulysses_a2a_kernel<uint4>, grid, block, 0, s, false, p);
  } else if (p.elem_bytes == 4) {
    launch_kernel("ulysses_a2a", ulysses_a2a_kernel<uint32_t>, grid, block, 0, s, false, p);
  } else {
    launch_kernel("ulysses_a2a", ulysses_a2a_kernel<uint16_t>, grid, block, 0, s, false, p);
  }
}

}  // namespace flashinfer::kernels::cuda
