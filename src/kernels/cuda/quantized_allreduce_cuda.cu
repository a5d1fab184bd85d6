#include <algorithm>
#include <cstdint>

#include "kernels/cuda/comm_sync.cuh"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/quantized_allreduce_cuda.h"
#include "kernels/quantized_allreduce_rules.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kThreads = 512;  // upstream's 16 warps
constexpr int kWarps = kThreads / 32;
using L = QarBufferLayout;

__device__ __forceinline__ float warp_abs_max(float m) {
  for (int o = 16; o > 0; o >>= 1) m = fp32_abs_max(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

// Block b of every rank at `target`: this block's writes made visible system-wide, its arrival
// stored in every peer's flag table (row = this rank), every peer's awaited in this rank's.
__device__ __forceinline__ void qar_barrier(const QuantizedAllReduceParams& p, int b,
                                            uint32_t target) {
  __threadfence_system();
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < p.world_size) {
    auto* peer_flags =
        reinterpret_cast<uint32_t*>(static_cast<char*>(p.peer_buf[threadIdx.x]) + L::kFlagsOffset);
    store_release_sys(peer_flags + p.rank * L::kMaxBlocks + b, target);
    const auto* my_flags =
        reinterpret_cast<const uint32_t*>(static_cast<char*>(p.peer_buf[p.rank]) + L::kFlagsOffset);
    wait_for_call(my_flags + threadIdx.x * L::kMaxBlocks + b, target, p.abort);
  }
  __syncthreads();
}

__device__ __forceinline__ char* slot_of(const QuantizedAllReduceParams& p, int r) {
  return static_cast<char*>(p.peer_buf[r]) + L::kSlotOffset;
}

// The owner's sum of element i (group g) over every rank's quantized input, in rank order.
__device__ __forceinline__ float qar_sum(const QuantizedAllReduceParams& p, int64_t i, int64_t g,
                                         int64_t scales_in, int64_t data_in) {
  float acc = 0.0f;
  for (int k = 0; k < p.world_size; ++k) {
    const char* s = slot_of(p, k);
    const float inv = __ldcg(reinterpret_cast<const float*>(s + scales_in) + g);
    const unsigned char code = __ldcg(reinterpret_cast<const unsigned char*>(s + data_in) + i);
    acc = qar_accumulate(acc, code, inv);
  }
  return acc;
}

__global__ void __launch_bounds__(kThreads)
    quantized_all_reduce_kernel(QuantizedAllReduceParams p) {
  __shared__ uint32_t base_s;
  const int b = blockIdx.x;
  char* own = static_cast<char*>(p.peer_buf[p.rank]);
  if (threadIdx.x == 0) {
    // Three barriers a call; only this block of this rank touches counters[b].
    auto* counters = reinterpret_cast<uint32_t*>(own + L::kCountersOffset);
    const uint32_t calls = counters[b];
    counters[b] = calls + 1;
    base_s = calls * 3u;
  }
  __syncthreads();
  const uint32_t base = base_s;
  const int64_t n = p.numel, sg = p.scale_group, B = p.block_size;
  const int64_t stride = B * p.world_size, step = stride * gridDim.x;
  const int64_t o_sin = L::scales_in(n, sg), o_sout = L::scales_out(n, sg);
  const int64_t o_din = L::data_in(n, sg), o_dout = L::data_out(n, sg);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  char* mine = slot_of(p, p.rank);
  // 1. Every group of this block's strides quantized into this rank's buffer, a warp a group.
  for (int64_t s0 = b * stride; s0 < n; s0 += step) {
    const int64_t end = s0 + stride < n ? s0 + stride : n;
    for (int64_t g0 = s0 + warp * sg; g0 < end; g0 += kWarps * sg) {
      const int64_t len = sg < n - g0 ? sg : n - g0;
      float m = 0.0f;
      for (int64_t j = lane; j < len; j += 32) {
        m = fp32_abs_max(m, f32_from_bits(static_cast<uint32_t>(p.input[g0 + j]) << 16));
      }
      const QarScales s = qar_scales(warp_abs_max(m));
      if (lane == 0) reinterpret_cast<float*>(mine + o_sin)[g0 / sg] = s.inv;
      for (int64_t j = lane; j < len; j += 32) {
        const float x = f32_from_bits(static_cast<uint32_t>(p.input[g0 + j]) << 16);
        reinterpret_cast<uint8_t*>(mine + o_din)[g0 + j] = qar_quantize(x, s.quant);
      }
    }
  }
  qar_barrier(p, b, base + 1u);
  // 2. This rank's stripe of each stride: the sum over the ranks (computed twice: for the
  // group's amax, then for the stores), bf16 for this rank, requantized for the others.
  for (int64_t s0 = b * stride; s0 < n; s0 += step) {
    const int64_t st = s0 + p.rank * B, end = st + B < n ? st + B : n;
    for (int64_t g0 = st + warp * sg; g0 < end; g0 += kWarps * sg) {
      const int64_t len = sg < n - g0 ? sg : n - g0, g = g0 / sg;
      float m = 0.0f;
      for (int64_t j = lane; j < len; j += 32)
        m = fp32_abs_max(m, qar_sum(p, g0 + j, g, o_sin, o_din));
      const QarScales s = qar_scales(warp_abs_max(m));
      if (lane == 0) reinterpret_cast<float*>(mine + o_sout)[g] = s.inv;
      for (int64_t j = lane; j < len; j += 32) {
        const float acc = qar_sum(p, g0 + j, g, o_sin, o_din);
        p.output[g0 + j] = qar_to_bf16(acc);
        reinterpret_cast<uint8_t*>(mine + o_dout)[g0 + j] = qar_quantize(acc, s.quant);
      }
    }
  }
  qar_barrier(p, b, base + 2u);
  // 3. The other stripes from their owners' requantized FP8 (upstream's p2p_phase3 form; its
  // pushed form stores the same values).
  for (int64_t s0 = b * stride; s0 < n; s0 += step) {
    for (int r = 0; r < p.world_size; ++r) {
      if (r == p.rank) continue;
      const char* owner = slot_of(p, r);
      const int64_t st = s0 + r * B, end = st + B < n ? st + B : n;
      for (int64_t g0 = st + warp * sg; g0 < end; g0 += kWarps * sg) {
        const int64_t len = sg < n - g0 ? sg : n - g0;
        const float inv = __ldcg(reinterpret_cast<const float*>(owner + o_sout) + g0 / sg);
        for (int64_t j = lane; j < len; j += 32) {
          const unsigned char code =
              __ldcg(reinterpret_cast<const unsigned char*>(owner + o_dout) + g0 + j);
          p.output[g0 + j] = qar_dequantize(code, inv);
        }
      }
    }
  }
  // 4. No peer reads this rank's buffer any more once every peer's block b is here.
  qar_barrier(p, b, base + 3u);
}

}  // namespace

int quantized_all_reduce_blocks(int64_t numel, int64_t block_size, int world_size, int max_blocks) {
  const int64_t strides = (numel + block_size * world_size - 1) / (block_size * world_size);
  int64_t g = std::min<int64_t>(strides, max_blocks);
  g = std::min<int64_t>(g, L::kMaxBlocks);
  return static_cast<int>(g < 1 ? 1 : g);
}

void quantized_all_reduce(const QuantizedAllReduceParams& p, void* stream) {
  const dim3 grid(quantized_all_reduce_blocks(p.numel, p.block_size, p.world_size, p.max_blocks));
  launch_kernel("quantized_all_reduce", quantized_all_reduce_kernel, grid, dim3(kThreads), 0,
                static_cast<cudaStream_t>(stream), false, p);
}

}  // namespace flashinfer::kernels::cuda
