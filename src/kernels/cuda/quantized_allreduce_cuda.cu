#include <algorithm>
#include <cstdint>

#include "kernels/cuda/comm_sync.cuh"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/quantized_allreduce_cuda.h"
#include "kernels/quantized_allreduce_rules.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kQuantArThreads = 512;  // upstream's 16 warps
constexpr int kQuantArWarps = kQuantArThreads / 32;
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

// A lane's V consecutive elements (V = 8: 16 bytes of bf16 and 8 of FP8 a lane; V = 1 where a
// group is shorter than 8 or a tensor not 16-byte aligned).
template <int V>
__device__ __forceinline__ void load_input(const uint16_t* src, float (&x)[V]) {
  if constexpr (V == 8) {
    const uint4 u = *reinterpret_cast<const uint4*>(src);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      x[2 * e] = f32_from_bits(w[e] << 16);
      x[2 * e + 1] = f32_from_bits(w[e] & 0xFFFF0000u);
    }
  } else {
    x[0] = f32_from_bits(static_cast<uint32_t>(src[0]) << 16);
  }
}
template <int V>
__device__ __forceinline__ void store_bf16(uint16_t* dst, const uint16_t (&v)[V]) {
  if constexpr (V == 8) {
    uint4 u;
    u.x = v[0] | static_cast<uint32_t>(v[1]) << 16;
    u.y = v[2] | static_cast<uint32_t>(v[3]) << 16;
    u.z = v[4] | static_cast<uint32_t>(v[5]) << 16;
    u.w = v[6] | static_cast<uint32_t>(v[7]) << 16;
    __stcg(reinterpret_cast<uint4*>(dst), u);  // one 16-byte store (a plain one was split)
  } else {
    dst[0] = v[0];
  }
}
// A peer's codes, read around the L1 (another rank wrote them this call).
template <int V>
__device__ __forceinline__ void load_codes(const uint8_t* src, uint8_t (&c)[V]) {
  if constexpr (V == 8) {
    const uint2 u = __ldcg(reinterpret_cast<const uint2*>(src));
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      c[e] = static_cast<uint8_t>(u.x >> (8 * e));
      c[e + 4] = static_cast<uint8_t>(u.y >> (8 * e));
    }
  } else {
    c[0] = __ldcg(reinterpret_cast<const unsigned char*>(src));
  }
}
template <int V>
__device__ __forceinline__ void store_codes(uint8_t* dst, const uint8_t (&c)[V]) {
  if constexpr (V == 8) {
    uint2 u = {0u, 0u};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      u.x |= static_cast<uint32_t>(c[e]) << (8 * e);
      u.y |= static_cast<uint32_t>(c[e + 4]) << (8 * e);
    }
    *reinterpret_cast<uint2*>(dst) = u;
  } else {
    dst[0] = c[0];
  }
}

// The owner's sums of elements i .. i + V (group g) over every rank's quantized input, in rank
// order.
template <int V>
__device__ __forceinline__ void qar_sum(const QuantizedAllReduceParams& p, int64_t i, int64_t g,
                                        int64_t scales_in, int64_t data_in, float (&acc)[V]) {
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = 0.0f;
  for (int k = 0; k < p.world_size; ++k) {
    const char* s = slot_of(p, k);
    const float inv = __ldcg(reinterpret_cast<const float*>(s + scales_in) + g);
    uint8_t c[V];
    load_codes<V>(reinterpret_cast<const uint8_t*>(s + data_in) + i, c);
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] = qar_accumulate(acc[e], c[e], inv);
  }
}

// One group's quantization by a warp: fill(j, v) gives a lane's V values at j, twice (for the
// group's amax, then for emit(j, v, scales)); a lane's first step stays in registers between
// the two, so groups of up to 32 V elements are filled once. Returns the group's scales.
template <int V, class Fill, class Emit>
__device__ __forceinline__ QarScales qar_group(int64_t first, int64_t len, const Fill& fill,
                                               const Emit& emit) {
  constexpr int64_t kStep = 32 * V;
  float v0[V];
  float m = 0.0f;
  for (int64_t j = first; j < len; j += kStep) {
    float v[V];
    fill(j, v);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      m = fp32_abs_max(m, v[e]);
      if (j == first) v0[e] = v[e];
    }
  }
  const QarScales sc = qar_scales(warp_abs_max(m));
  for (int64_t j = first; j < len; j += kStep) {
    float v[V];
    if (j == first) {
#pragma unroll
      for (int e = 0; e < V; ++e) v[e] = v0[e];
    } else {
      fill(j, v);
    }
    emit(j, v, sc);
  }
  return sc;
}

// Each phase takes a group a warp, a lane V consecutive elements a step of 32 V (qar_group).
template <int V>
__device__ __forceinline__ void qar_body(const QuantizedAllReduceParams& p) {
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
  const int64_t first = static_cast<int64_t>(lane) * V;
  constexpr int64_t kStep = 32 * V;
  char* mine = slot_of(p, p.rank);
  auto* din = reinterpret_cast<uint8_t*>(mine + o_din);
  auto* dout = reinterpret_cast<uint8_t*>(mine + o_dout);
  // 1. Every group of this block's strides quantized into this rank's buffer.
  for (int64_t s0 = b * stride; s0 < n; s0 += step) {
    const int64_t end = s0 + stride < n ? s0 + stride : n;
    for (int64_t g0 = s0 + warp * sg; g0 < end; g0 += kQuantArWarps * sg) {
      const int64_t len = sg < n - g0 ? sg : n - g0;
      const QarScales sc = qar_group<V>(
          first, len, [&](int64_t j, float(&x)[V]) { load_input<V>(p.input + g0 + j, x); },
          [&](int64_t j, const float(&x)[V], const QarScales& q) {
            uint8_t c[V];
#pragma unroll
            for (int e = 0; e < V; ++e) c[e] = qar_quantize(x[e], q.quant);
            store_codes<V>(din + g0 + j, c);
          });
      if (lane == 0) reinterpret_cast<float*>(mine + o_sin)[g0 / sg] = sc.inv;
    }
  }
  qar_barrier(p, b, base + 1u);
  // 2. This rank's stripe of each stride: the sum over the ranks, bf16 for this rank,
  // requantized for the others.
  for (int64_t s0 = b * stride; s0 < n; s0 += step) {
    const int64_t st = s0 + p.rank * B, end = st + B < n ? st + B : n;
    for (int64_t g0 = st + warp * sg; g0 < end; g0 += kQuantArWarps * sg) {
      const int64_t len = sg < n - g0 ? sg : n - g0, g = g0 / sg;
      const QarScales sc = qar_group<V>(
          first, len, [&](int64_t j, float(&a)[V]) { qar_sum<V>(p, g0 + j, g, o_sin, o_din, a); },
          [&](int64_t j, const float(&a)[V], const QarScales& q) {
            uint16_t o[V];
            uint8_t c[V];
#pragma unroll
            for (int e = 0; e < V; ++e) {
              o[e] = qar_to_bf16(a[e]);
              c[e] = qar_quantize(a[e], q.quant);
            }
            store_bf16<V>(p.output + g0 + j, o);
            store_codes<V>(dout + g0 + j, c);
          });
      if (lane == 0) reinterpret_cast<float*>(mine + o_sout)[g] = sc.inv;
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
      for (int64_t g0 = st + warp * sg; g0 < end; g0 += kQuantArWarps * sg) {
        const int64_t len = sg < n - g0 ? sg : n - g0;
        const float inv = __ldcg(reinterpret_cast<const float*>(owner + o_sout) + g0 / sg);
        for (int64_t j = first; j < len; j += kStep) {
          uint8_t c[V];
          load_codes<V>(reinterpret_cast<const uint8_t*>(owner + o_dout) + g0 + j, c);
          uint16_t o[V];
#pragma unroll
          for (int e = 0; e < V; ++e) o[e] = qar_dequantize(c[e], inv);
          store_bf16<V>(p.output + g0 + j, o);
        }
      }
    }
  }
  // 4. No peer reads this rank's buffer any more once every peer's block b is here.
  qar_barrier(p, b, base + 3u);
}

// The two instances under names of their own (the static SASS rules select kernels by name).
__global__ void __launch_bounds__(kQuantArThreads, 1)
    quantized_all_reduce_kernel(QuantizedAllReduceParams p) {
  qar_body<1>(p);
}
__global__ void __launch_bounds__(kQuantArThreads, 1)
    quantized_all_reduce_x8_kernel(QuantizedAllReduceParams p) {
  qar_body<8>(p);
}

}  // namespace

int quantized_all_reduce_blocks(int64_t numel, int64_t block_size, int world_size, int max_blocks) {
  const int64_t strides = (numel + block_size * world_size - 1) / (block_size * world_size);
  int64_t g = std::min<int64_t>(strides, max_blocks);
  g = std::min<int64_t>(g, L::kMaxBlocks);
  return static_cast<int>(g < 1 ? 1 : g);
}

void preload_quantized_all_reduce() {
  preload_kernels("quantized_all_reduce",
                  {reinterpret_cast<const void*>(quantized_all_reduce_kernel),
                   reinterpret_cast<const void*>(quantized_all_reduce_x8_kernel)});
}

void quantized_all_reduce(const QuantizedAllReduceParams& p, void* stream) {
  const dim3 grid(quantized_all_reduce_blocks(p.numel, p.block_size, p.world_size, p.max_blocks));
  // 16-byte lanes where every group is a whole number of them (numel is a multiple of 8, so
  // the last group is too) and the tensors are 16-byte aligned; the buffers' regions are.
  const bool vec = p.scale_group % 8 == 0 && reinterpret_cast<uintptr_t>(p.input) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(p.output) % 16 == 0;
  const auto s = static_cast<cudaStream_t>(stream);
  if (vec) {
    launch_kernel("quantized_all_reduce", quantized_all_reduce_x8_kernel, grid,
                  dim3(kQuantArThreads), 0, s, false, p);
  } else {
    launch_kernel("quantized_all_reduce", quantized_all_reduce_kernel, grid, dim3(kQuantArThreads),
                  0, s, false, p);
  }
}

}  // namespace flashinfer::kernels::cuda
