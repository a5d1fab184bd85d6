// Direct ports of the CPU loops (src/kernels/cpu/moe_weight_prep_cpu.cpp): each thread runs one
// iteration of the CPU's innermost loop body, so every destination byte gets the CPU's value.
// The Humming preparation shares its steps with the CPU through kernels/moe_weight_prep_rules.h
// and rewrites the payload through the CPU's own table.
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/moe_weight_prep_cuda.h"
#include "kernels/moe_weight_prep_rules.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// "fp4": where source bit i of the 32-bit group lands (the CPU's kFp4BitDst).
__device__ __forceinline__ uint32_t permute_fp4_bits(uint32_t v) {
  constexpr int kDst[32] = {6, 7, 8, 15, 22, 23, 24, 31, 3,  4,  5,  12, 19, 20, 21, 28,
                            0, 1, 2, 9,  16, 17, 18, 25, 13, 10, 11, 14, 29, 26, 27, 30};
  uint32_t out = 0;
#pragma unroll
  for (int i = 0; i < 32; ++i) out |= ((v >> i) & 1u) << kDst[i];
  return out;
}

// "fp4_fp8": the sign of nibble j moves to nibble 2j + 1 (j < 4) or 2(j - 4) (j >= 4).
__device__ __forceinline__ uint32_t move_fp4_signs(uint32_t v) {
  uint32_t out = v & 0x77777777u;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int to = j < 4 ? 2 * j + 1 : 2 * (j - 4);
    out |= ((v >> (4 * j + 3)) & 1u) << (4 * to + 3);
  }
  return out;
}

__device__ __forceinline__ uint16_t load16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
__device__ __forceinline__ void store16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v & 0xFF);
  p[1] = static_cast<uint8_t>(v >> 8);
}

__global__ void interleave_weights_kernel(Sm90WeightInterleaveParams p) {
  const int64_t n = p.n, k = p.k, row_bytes = k / 2;
  const int64_t per_expert = n * row_bytes;
  const int64_t pairs = n / 2, parts = k / 64;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.experts * pairs * parts * 16) return;
  const int64_t lane = idx % 16;
  const int64_t q = idx / 16 % parts;
  const int64_t b = idx / 16 / parts % pairs;
  const int64_t e = idx / 16 / parts / pairs;
  const uint8_t* src = p.in + e * per_expert;
  uint8_t* dst = p.out + e * per_expert;
  const int64_t r = b / 8 * 16 + b % 8;
  if (p.quant_type == Sm90QuantType::kFp4) {
    const int64_t mma = lane / 4;
    const int64_t dst_r = r + (mma % 2) * 8;
    const int64_t col = q * 32 + mma * 8 + lane % 4;
    const int64_t dcol = q * 32 + (lane / 8) * 16 + (lane % 4) * 4;
    const uint32_t raw = static_cast<uint32_t>(src[r * row_bytes + col]) |
                         static_cast<uint32_t>(src[(r + 8) * row_bytes + col]) << 8 |
                         static_cast<uint32_t>(src[r * row_bytes + col + 4]) << 16 |
                         static_cast<uint32_t>(src[(r + 8) * row_bytes + col + 4]) << 24;
    const uint32_t v = permute_fp4_bits(raw);
    for (int i = 0; i < 4; ++i) {
      dst[dst_r * row_bytes + dcol + i] = static_cast<uint8_t>(v >> (8 * i));
    }
  } else {
    const int64_t row_units = k / 4;
    const int64_t dst_r = r + ((lane % 8) / 4) * 8;
    const int64_t col = q * 16 + lane;
    const int64_t dcol = q * 16 + (lane / 8) * 8 + (lane % 4) * 2;
    uint16_t a = load16(src + 2 * (r * row_units + col));
    uint16_t c = load16(src + 2 * ((r + 8) * row_units + col));
    if (p.quant_type == Sm90QuantType::kFp4Fp8) {
      const uint32_t v =
          move_fp4_signs(static_cast<uint32_t>(a) | (static_cast<uint32_t>(c) << 16));
      a = static_cast<uint16_t>(v & 0xFFFF);
      c = static_cast<uint16_t>(v >> 16);
    }
    store16(dst + 2 * (dst_r * row_units + dcol), a);
    store16(dst + 2 * (dst_r * row_units + dcol + 1), c);
  }
}

__global__ void interleave_scales_kernel(Sm90ScaleInterleaveParams p) {
  const int64_t G = p.groups_per_k128, fm_n = p.folded_m, ms_n = p.m_slices;
  const int64_t kb_n = p.k_groups / G, rb_n = p.rows / 64, cols = ms_n * G;
  const int64_t total = p.experts * rb_n * kb_n * fm_n * cols;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= total) return;
  // o = (((e * rb_n + rb) * kb_n + kb) * fm_n + fm) * cols + c, the CPU's loop order.
  const int64_t c = o % cols;
  const int64_t fm = o / cols % fm_n;
  const int64_t kb = o / cols / fm_n % kb_n;
  const int64_t rb = o / cols / fm_n / kb_n % rb_n;
  const int64_t e = o / cols / fm_n / kb_n / rb_n;
  const int64_t ms = c / G, g = c % G;
  const int64_t row = rb * 64 + ms * fm_n + fm;
  const int64_t i = (e * p.rows + row) * p.k_groups + kb * G + g;
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
                dim3(grid_for(n)), dim3(kThreads), 0, static_cast<cudaStream_t>(stream), false, p);
}

void sm90_interleave_scales(const Sm90ScaleInterleaveParams& p, void* stream) {
  if (p.groups_per_k128 <= 0 || p.folded_m <= 0 || p.m_slices <= 0) return;
  const int64_t n = p.experts * (p.rows / 64) * (p.k_groups / p.groups_per_k128) * p.folded_m *
                    p.m_slices * p.groups_per_k128;
  if (n == 0) return;
  launch_kernel("interleave_moe_scales_for_sm90_mixed_gemm", interleave_scales_kernel,
                dim3(grid_for(n)), dim3(kThreads), 0, static_cast<cudaStream_t>(stream), false, p);
}

}  // namespace flashinfer::kernels::cuda
