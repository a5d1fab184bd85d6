// The CPU's loops (src/kernels/cpu/moe_weight_prep_cpu.cpp) a thread an iteration, each running
// the loop body the CPU runs (kernels/moe_weight_prep_rules.h), so every destination byte gets
// the CPU's value; the Humming payload is rewritten through the CPU's own table.
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/moe_weight_prep_cuda.h"
#include "kernels/moe_weight_prep_rules.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kPrepThreads = 256;

unsigned prep_grid(int64_t n) {
  return static_cast<unsigned>((n + kPrepThreads - 1) / kPrepThreads);
}

// One thread a unit of the CPU's loops (kernels/moe_weight_prep_rules.h).
__global__ void interleave_weights_kernel(Sm90WeightInterleaveParams p) {
  const int64_t pairs = p.n / 2, parts = p.k / 64;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.experts * pairs * parts * 16) return;
  const int64_t lane = idx % 16;
  const int64_t q = idx / 16 % parts;
  const int64_t b = idx / 16 / parts % pairs;
  const int64_t e = idx / 16 / parts / pairs;
  sm90_interleave_weight_unit(p, e, b, q, lane);
}

// One thread an output element.
__global__ void interleave_scales_kernel(Sm90ScaleInterleaveParams p) {
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= sm90_interleave_scale_count(p)) return;
  const int64_t i = sm90_interleave_scale_source(p, o);
  const auto es = static_cast<int64_t>(p.element_size);
  for (int64_t j = 0; j < es; ++j) p.out[o * es + j] = p.in[i * es + j];
}

// Humming, step 1: one block per expert finds its largest and smallest E8M0 scale and writes
// the new low end (for step 2) and the residual.
constexpr int kRangeThreads = 256;

__global__ void __launch_bounds__(kRangeThreads) humming_range_kernel(HummingPrepParams p) {
  const int64_t per_expert = p.rows * (p.k / 32);
  const uint8_t* s = p.raw_scale + static_cast<int64_t>(blockIdx.x) * per_expert;
  unsigned hi = 0, lo = 255;
  for (int64_t i = threadIdx.x; i < per_expert; i += kRangeThreads) {
    const unsigned v = s[i];
    hi = max(hi, v);
    lo = min(lo, v);
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    hi = max(hi, __shfl_xor_sync(0xFFFFFFFFu, hi, off));
    lo = min(lo, __shfl_xor_sync(0xFFFFFFFFu, lo, off));
  }
  __shared__ unsigned warp_hi[kRangeThreads / 32], warp_lo[kRangeThreads / 32];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  if (threadIdx.x % 32 == 0) {
    warp_hi[warp] = hi;
    warp_lo[warp] = lo;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
#pragma unroll
  for (int w = 1; w < kRangeThreads / 32; ++w) {
    hi = max(hi, warp_hi[w]);
    lo = min(lo, warp_lo[w]);
  }
  const int lo_new =
      humming_low(static_cast<int>(hi), static_cast<int>(lo), static_cast<int>(p.max_range));
  p.low[blockIdx.x] = lo_new;
  p.residual[blockIdx.x] = humming_residual(lo_new);
}

// Humming, step 2: one thread per 32-element scale block: its offset byte and its 16 payload
// bytes (row_bytes = 16 * k / 32, so block t owns payload bytes [16 t, 16 t + 16)). The table
// goes to shared memory first; 16-byte loads and stores when both payload pointers allow.
constexpr int kApplyThreads = 256;
static_assert(kApplyThreads * 16 == kHummingTableBytes, "one 16-byte table row per thread");

__global__ void __launch_bounds__(kApplyThreads)
    humming_apply_kernel(HummingPrepParams p, int64_t blocks) {
  __shared__ __align__(16) uint8_t table[kHummingTableBytes];
  reinterpret_cast<uint4*>(table)[threadIdx.x] =
      reinterpret_cast<const uint4*>(p.rewrite_table)[threadIdx.x];
  __syncthreads();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kApplyThreads + threadIdx.x;
  if (t >= blocks) return;
  const int64_t per_expert = p.rows * (p.k / 32);
  const int lo_new = p.low[t / per_expert];
  const int s = p.raw_scale[t];
  p.offset_out[t] = humming_offset(s, lo_new);
  const uint8_t* row = table + humming_delta(s, lo_new) * 16;
  const uint8_t* in = p.weight + t * 16;
  uint8_t* out = p.weight_out + t * 16;
  if (((reinterpret_cast<uintptr_t>(in) | reinterpret_cast<uintptr_t>(out)) & 15) == 0) {
    const uint4 v = *reinterpret_cast<const uint4*>(in);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t o[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      o[j] = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const auto byte = static_cast<uint8_t>(w[j] >> (8 * b));
        o[j] |= static_cast<uint32_t>(humming_rewrite_byte(row, byte)) << (8 * b);
      }
    }
    *reinterpret_cast<uint4*>(out) = make_uint4(o[0], o[1], o[2], o[3]);
  } else {
#pragma unroll
    for (int b = 0; b < 16; ++b) out[b] = humming_rewrite_byte(row, in[b]);
  }
}

}  // namespace

void humming_prepare(const HummingPrepParams& p, void* stream) {
  const char* op = "preprocess_moe_weights_for_sm90_mixed_gemm_humming";
  const int64_t blocks = p.experts * p.rows * (p.k / 32);
  if (blocks == 0) return;
  FLASHINFER_CHECK_CODE(p.experts <= 0x7FFFFFFF, ErrorCode::kUnsupported, op, "weight", p.experts,
                        " experts exceed the CUDA grid's x limit");
  const auto s = static_cast<cudaStream_t>(stream);
  launch_kernel(op, humming_range_kernel, dim3(static_cast<unsigned>(p.experts)),
                dim3(kRangeThreads), 0, s, false, p);
  launch_kernel(op, humming_apply_kernel,
                dim3(static_cast<unsigned>((blocks + kApplyThreads - 1) / kApplyThreads)),
                dim3(kApplyThreads), 0, s, false, p, blocks);
}

void sm90_interleave_weights(const Sm90WeightInterleaveParams& p, void* stream) {
  const int64_t n = p.experts * (p.n / 2) * (p.k / 64) * 16;
  if (n == 0) return;
  launch_kernel("interleave_moe_weights_for_sm90_mixed_gemm", interleave_weights_kernel,
                dim3(prep_grid(n)), dim3(kPrepThreads), 0, static_cast<cudaStream_t>(stream), false,
                p);
}

void sm90_interleave_scales(const Sm90ScaleInterleaveParams& p, void* stream) {
  const int64_t n = sm90_interleave_scale_count(p);
  if (n == 0) return;
  launch_kernel("interleave_moe_scales_for_sm90_mixed_gemm", interleave_scales_kernel,
                dim3(prep_grid(n)), dim3(kPrepThreads), 0, static_cast<cudaStream_t>(stream), false,
                p);
}

}  // namespace flashinfer::kernels::cuda
