// Simple, correct-by-construction kernels: one thread per byte (gather), per output element
// (dequantize), per row chunk of 8 (silu-and-mul) or per block of 16 (the quantizers); every fp32
// operation is an explicitly IEEE-rounded intrinsic in the CPU reference's order (the quantizers'
// and silu's steps are the CPU's own, kernels/nvfp4_rules.h and fp32_rules.h), and the
// conversions are the constexpr bit functions the CPU uses.
#include <algorithm>

#include "flashinfer/float_formats.h"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/nvfp4_cuda.h"
#include "kernels/cuda/quantization_cuda.h"
#include "kernels/cuda/vec_cuda.cuh"
#include "kernels/fp32_rules.h"
#include "kernels/nvfp4_rules.h"
#include "kernels/quantization_params.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kNvfp4Threads = 256;

unsigned nvfp4_grid(int64_t n) {
  return static_cast<unsigned>((n + kNvfp4Threads - 1) / kNvfp4Threads);
}

__global__ void gather_rows_kernel(RowGatherParams p) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.rows * p.row_bytes) return;
  const int64_t r = idx / p.row_bytes, b = idx % p.row_bytes;
  p.out[idx] = p.input[p.src_row[r] * p.in_stride_bytes + b];
}

template <class Bits, Bits (*Encode)(float)>
__global__ void kv_dequantize_kernel(Nvfp4KvParams p) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.m * p.k) return;
  const int64_t r = idx / p.k, c = idx % p.k;
  const uint8_t byte = p.fp4[r * p.fp4_stride_m + c / 2];
  const uint8_t code = c % 2 == 0 ? e2m1x2_low(byte) : e2m1x2_high(byte);
  const float e = e2m1_code_to_float(code);
  const float s = e4m3_code_to_float(p.sf[r * p.sf_stride_m + c / 16]);
  const float gs = p.global_scale_ptr != nullptr ? *p.global_scale_ptr : p.global_scale;
  const float y = __fmul_rn(__fmul_rn(e, s), gs);
  static_cast<Bits*>(const_cast<void*>(p.values))[r * p.value_stride_m + c] = Encode(y);
}

// One element of K (kv 0) or V (kv 1) of one request's token t; the tables are on the device.
template <uint16_t (*Encode)(float)>
__global__ void paged_dequantize_kernel(Nvfp4PagedDequantParams p, int kv, int64_t max_t,
                                        const int64_t* table, const int64_t* lens) {
  const int64_t dim = p.head_dim[kv];
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.batch * max_t * p.heads * dim) return;
  const int64_t d = idx % dim;
  const int64_t h = idx / dim % p.heads;
  const int64_t t = idx / dim / p.heads % max_t;
  const int64_t b = idx / dim / p.heads / max_t;
  if (t >= lens[b]) return;
  const int64_t* cs = p.cache_stride[kv];
  const int64_t* ss = p.sf_stride[kv];
  const int64_t* os = p.out_stride[kv];
  const int64_t page = table[b * p.table_cols + t / p.page_size];
  const int64_t entry = t % p.page_size;
  const uint8_t byte = p.cache[kv][page * cs[0] + entry * cs[1] + h * cs[2] + (d / 2) * cs[3]];
  const uint8_t code = d % 2 == 0 ? e2m1x2_low(byte) : e2m1x2_high(byte);
  const float e = e2m1_code_to_float(code);
  const float s =
      e4m3_code_to_float(p.sf[kv][page * ss[0] + entry * ss[1] + h * ss[2] + (d / 16) * ss[3]]);
  static_cast<uint16_t*>(p.out[kv])[b * os[0] + t * os[1] + h * os[2] + d * os[3]] =
      Encode(__fmul_rn(__fmul_rn(e, s), p.scale[kv]));
}

// 16-bit elements as the CPU's storage types (Half, BFloat16): exact decodes, and the CPU's own
// round-to-nearest-even encoders (the same bits for NaN too).
__device__ __forceinline__ float decode(Half x) { return __half2float(__ushort_as_half(x.bits)); }
__device__ __forceinline__ float decode(BFloat16 x) {
  return __uint_as_float(uint32_t{x.bits} << 16);
}
template <class T>
__device__ __forceinline__ T encode(float x) {
  return T::from_float(x);
}

// 16 elements from x (unit stride); two 16-byte loads when kVec (x then 16-byte aligned).
template <class T, bool kVec>
__device__ __forceinline__ void load16(const T* x, int64_t stride, float* v) {
  if constexpr (kVec) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const Vec16<T> w = reinterpret_cast<const Vec16<T>*>(x)[h];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[8 * h + j] = decode(w.v[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j) v[j] = decode(x[j * stride]);
  }
}

// 8 packed bytes (little-endian, byte t first); one 8-byte store when kVec (q 8-byte aligned).
template <bool kVec>
__device__ __forceinline__ void store_packed(uint8_t* q, uint64_t packed) {
  if constexpr (kVec) {
    *reinterpret_cast<uint2*>(q) =
        make_uint2(static_cast<uint32_t>(packed), static_cast<uint32_t>(packed >> 32));
  } else {
#pragma unroll
    for (int t = 0; t < 8; ++t) q[t] = static_cast<uint8_t>(packed >> (8 * t));
  }
}

int64_t grid_stride_blocks(int64_t n) {
  return std::min<int64_t>((n + kNvfp4Threads - 1) / kNvfp4Threads, int64_t{1} << 20);
}

// silu(gate) * up, rounded to T: one thread per chunk of 8 outputs of a row (one 16-byte load of
// gate and of up, one 16-byte store) when kVec, else per element.
template <class T, bool kVec>
__device__ __forceinline__ void silu_mul_rows_body(const SiluMulParams& p) {
  pdl_wait();
  constexpr int64_t V = kVec ? 8 : 1;
  const int64_t per_row = p.k / V, n = p.m * per_row;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / per_row, j = idx % per_row * V;
    const T* x = static_cast<const T*>(p.input) + r * p.in_stride_m + j;
    T* y = static_cast<T*>(p.out) + r * p.k + j;
    if constexpr (kVec) {
      const Vec16<T> g = *reinterpret_cast<const Vec16<T>*>(x);
      const Vec16<T> u = *reinterpret_cast<const Vec16<T>*>(x + p.k);
      Vec16<T> o;
#pragma unroll
      for (int e = 0; e < 8; ++e) o.v[e] = encode<T>(silu_mul_f32(decode(g.v[e]), decode(u.v[e])));
      *reinterpret_cast<Vec16<T>*>(y) = o;
    } else {
      *y = encode<T>(silu_mul_f32(decode(x[0]), decode(x[p.k])));
    }
  }
  pdl_launch_dependents();
}

// One thread per (K/V, token, head, block of 16); K/V slowest, so neighbours read neighbouring
// blocks of a row. The index arrays and device scales are read here (nvfp4_append_target);
// tokens without a target, or whose scale is not positive and finite, write nothing.
template <class T, bool kVec>
__device__ __forceinline__ void paged_append_body(const Nvfp4PagedAppendParams& p) {
  pdl_wait();
  const float k_scale = p.k_scale_ptr ? *p.k_scale_ptr : p.k_scale;
  const float v_scale = p.v_scale_ptr ? *p.v_scale_ptr : p.v_scale;
  const int64_t nb = p.head_dim / kNvfp4Block, n = 2 * p.nnz * p.heads * nb;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = idx % nb, h = idx / nb % p.heads, i = idx / nb / p.heads % p.nnz;
    const bool is_v = idx / nb / p.heads >= p.nnz;
    if (!nvfp4_append_scale_ok(is_v ? v_scale : k_scale)) continue;
    const AppendSlot t = nvfp4_append_target(p, i);
    if (t.page < 0) continue;
    const int64_t page = t.page, entry = t.entry;
    const T* x = static_cast<const T*>(is_v ? p.value : p.key) +
                 i * (is_v ? p.v_stride_n : p.k_stride_n) +
                 h * (is_v ? p.v_stride_h : p.k_stride_h) + b * kNvfp4Block;
    float v[kNvfp4Block];
    load16<T, kVec>(x, 1, v);
    const Nvfp4Block blk = nvfp4_append_block(v, is_v ? v_scale : k_scale);
    const int64_t* cs = is_v ? p.vc_stride : p.kc_stride;
    const int64_t* ss = is_v ? p.vs_stride : p.ks_stride;
    store_packed<kVec>(
        (is_v ? p.v_cache : p.k_cache) + page * cs[0] + entry * cs[1] + h * cs[2] + b * 8,
        blk.packed);
    (is_v ? p.v_sf : p.k_sf)[page * ss[0] + entry * ss[1] + h * ss[2] + b] = blk.sf;
  }
  pdl_launch_dependents();
}

// One thread per (row, block of 16) of a whole cache: fp4_quantize's block, the packed bytes at
// the row's place (8-byte stores: rows are head_dim / 2 bytes, a multiple of 8), the scale at
// nvfp4_paged_sf_offset's.
template <class T, bool kVec>
__device__ __forceinline__ void paged_quantize_body(const Nvfp4PagedQuantParams& p) {
  const int64_t A = p.shape[1], B = p.shape[2], sd = p.shape[3] / kNvfp4Block;
  const int64_t n = p.shape[0] * A * B * sd;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = idx % sd, r = idx / sd;
    const int64_t c = r % B, a = r / B % A, pg = r / B / A;
    const T* x = static_cast<const T*>(p.input) + pg * p.stride[0] + a * p.stride[1] +
                 c * p.stride[2] + b * kNvfp4Block * p.stride[3];
    float v[kNvfp4Block];
    load16<T, kVec>(x, p.stride[3], v);
    const Nvfp4Block blk = nvfp4_quantize_block(v, p.global_scale);
    store_packed<true>(p.out + idx * 8, blk.packed);
    p.sf[nvfp4_paged_sf_offset(p, pg, a, c, b)] = blk.sf;
  }
}

// N (a multiple of 8) elements from x, unit stride: N / 8 16-byte loads, all issued before any
// is decoded, when kVec (x then 16-byte aligned); else element loads.
template <class T, int N, bool kVec>
__device__ __forceinline__ void load_unit(const T* x, float* v) {
  static_assert(sizeof(T) == 2 && N % 8 == 0);
  if constexpr (kVec) {
    Vec16<T> w[N / 8];
#pragma unroll
    for (int h = 0; h < N / 8; ++h) w[h] = reinterpret_cast<const Vec16<T>*>(x)[h];
#pragma unroll
    for (int h = 0; h < N / 8; ++h) {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[8 * h + j] = decode(w[h].v[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = decode(x[j]);
  }
}

// 32 bytes, byte 4w + i at bits [8i, 8i + 8) of word w: two 16-byte stores when kVec (q 16-byte
// aligned), else byte stores.
template <bool kVec>
__device__ __forceinline__ void store_words(uint8_t* q, const uint32_t (&w)[8]) {
  if constexpr (kVec) {
    reinterpret_cast<uint4*>(q)[0] = make_uint4(w[0], w[1], w[2], w[3]);
    reinterpret_cast<uint4*>(q)[1] = make_uint4(w[4], w[5], w[6], w[7]);
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) q[i] = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
  }
}

// The rows of group g the grouped quantizers write: mask[g] read on the device, clamped to
// [0, m] as kernels::cpu::grouped_quantize clamps it (no mask: every row).
__device__ __forceinline__ int64_t group_rows(const GroupedQuantizeParams& p, int64_t g) {
  if (p.rows == nullptr) return p.m;
  const int64_t r = p.rows[g];
  return r < 0 ? 0 : (r > p.m ? p.m : r);
}

// scaled_fp4_grouped_quantize / silu_and_mul_scaled_nvfp4_experts_quantize: one thread per
// (group, row, block of 16), grid-stride, rows in group-major order as the CPU's. A row past the
// group's mask gets zero codes (its scales stay the memset's zero); a valid one is fp4_quantize's
// block (kernels/nvfp4_rules.h) of the row itself or, with kSilu, of silu(gate) * up rounded to T
// first (kernels::cpu::grouped_quantize's copy), under the group's global scale.
template <class T, bool kSilu, bool kVec>
__device__ __forceinline__ void grouped_fp4_body(const GroupedQuantizeParams& p) {
  pdl_wait();
  const int64_t nb = p.k / kNvfp4Block, n = p.groups * p.m * nb;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = idx % nb, r = idx / nb % p.m, g = idx / nb / p.m;
    uint64_t packed = 0;
    if (r < group_rows(p, g)) {
      const T* x =
          static_cast<const T*>(p.input) + g * p.in_stride_g + r * p.in_stride_m + b * kNvfp4Block;
      float v[kNvfp4Block];
      load_unit<T, kNvfp4Block, kVec>(x, v);
      if constexpr (kSilu) {
        float u[kNvfp4Block];
        load_unit<T, kNvfp4Block, kVec>(x + p.k, u);
#pragma unroll
        for (int i = 0; i < kNvfp4Block; ++i) v[i] = decode(encode<T>(silu_mul_f32(v[i], u[i])));
      }
      const float gs = p.global_scale ? p.global_scale[p.per_group_scale ? g : 0] : 1.0f;
      const Nvfp4Block blk = nvfp4_quantize_block(v, gs);
      packed = blk.packed;
      p.sf[g * p.sf_per_group + sf_offset(SfLayoutCode::k128x4, r, b, nb)] = blk.sf;
    }
    store_packed<kVec>(p.out + idx * (kNvfp4Block / 2), packed);
  }
  pdl_launch_dependents();
}

// mxfp8_grouped_quantize: one thread per (group, row, block of 32 of the padded K), as
// grouped_fp4_body. Blocks past K are the zero padding the CPU quantizes (through the same block
// rule: scale code 0, zero codes); rows past the mask are zero.
template <class T, bool kVec>
__device__ __forceinline__ void grouped_mxfp8_body(const GroupedQuantizeParams& p) {
  pdl_wait();
  const int64_t nb = p.padded_k / kMxfp8Block, n = p.groups * p.m * nb;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = idx % nb, r = idx / nb % p.m, g = idx / nb / p.m;
    uint32_t w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (r < group_rows(p, g)) {
      float v[kMxfp8Block];
      if (b * kMxfp8Block < p.k) {  // K is a multiple of 32: a block is all in or all out
        load_unit<T, kMxfp8Block, kVec>(static_cast<const T*>(p.input) + g * p.in_stride_g +
                                            r * p.in_stride_m + b * kMxfp8Block,
                                        v);
      } else {
#pragma unroll
        for (int i = 0; i < kMxfp8Block; ++i) v[i] = 0.0f;
      }
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < kMxfp8Block; ++i) amax = fp32_abs_max(amax, v[i]);
      const uint8_t code = mxfp8_scale_code(amax);
      const float sf = ue8m0_to_float(code);
#pragma unroll
      for (int i = 0; i < kMxfp8Block; ++i) {
        w[i / 4] |= static_cast<uint32_t>(mxfp8_value_code(v[i], sf)) << (8 * (i % 4));
      }
      p.sf[g * p.sf_per_group + sf_offset(SfLayoutCode::k128x4, r, b, nb)] = code;
    }
    store_words<kVec>(p.out + idx * kMxfp8Block, w);
  }
  pdl_launch_dependents();
}

// max |x| (NaN ignored): per thread, then per warp, then one atomicMax per warp on the bits
// (non-negative floats order as their bit patterns). kVec: contiguous, 8 elements per load.
template <class T, bool kVec>
__device__ __forceinline__ void abs_max_body(const AbsMaxParams& p, unsigned int* result) {
  const int64_t d1 = p.shape[1], d2 = p.shape[2], d3 = p.shape[3];
  const int64_t numel = p.shape[0] * d1 * d2 * d3;
  float m = 0.0f;
  const int64_t n = kVec ? numel / 8 : numel;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (kVec) {
      const Vec16<T> w = reinterpret_cast<const Vec16<T>*>(p.input)[idx];
#pragma unroll
      for (int j = 0; j < 8; ++j) m = fp32_abs_max(m, decode(w.v[j]));
    } else {
      const int64_t i3 = idx % d3, i2 = idx / d3 % d2, i1 = idx / d3 / d2 % d1;
      const int64_t i0 = idx / d3 / d2 / d1;
      m = fp32_abs_max(
          m,
          decode(static_cast<const T*>(
              p.input)[i0 * p.stride[0] + i1 * p.stride[1] + i2 * p.stride[2] + i3 * p.stride[3]]));
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m = fp32_abs_max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  if (threadIdx.x % 32 == 0) atomicMax(result, __float_as_uint(m));
}

// The kernels: the 16-byte-load instance of each body and its element-load fallback
// ("strided"), named apart for the static SASS rule `nvfp4` (scripts/check_sass.py).
template <class T>
__global__ void nvfp4_silu_mul_kernel(SiluMulParams p) {
  silu_mul_rows_body<T, true>(p);
}
template <class T>
__global__ void nvfp4_silu_mul_strided_kernel(SiluMulParams p) {
  silu_mul_rows_body<T, false>(p);
}
template <class T>
__global__ void nvfp4_append_kernel(Nvfp4PagedAppendParams p) {
  paged_append_body<T, true>(p);
}
template <class T>
__global__ void nvfp4_append_strided_kernel(Nvfp4PagedAppendParams p) {
  paged_append_body<T, false>(p);
}
template <class T>
__global__ void nvfp4_paged_quantize_kernel(Nvfp4PagedQuantParams p) {
  paged_quantize_body<T, true>(p);
}
template <class T>
__global__ void nvfp4_paged_quantize_strided_kernel(Nvfp4PagedQuantParams p) {
  paged_quantize_body<T, false>(p);
}
template <class T>
__global__ void nvfp4_abs_max_kernel(AbsMaxParams p, unsigned int* result) {
  abs_max_body<T, true>(p, result);
}
template <class T>
__global__ void nvfp4_abs_max_strided_kernel(AbsMaxParams p, unsigned int* result) {
  abs_max_body<T, false>(p, result);
}

// The grouped quantizers' kernels: names under the static SASS rule `quant` (*fp4_quantize_kernel,
// *mxfp8_quantize_kernel; the element-load forms *_strided_kernel).
template <class T, bool kSilu>
__global__ void __launch_bounds__(kNvfp4Threads)
    grouped_fp4_quantize_kernel(GroupedQuantizeParams p) {
  grouped_fp4_body<T, kSilu, true>(p);
}
template <class T, bool kSilu>
__global__ void __launch_bounds__(kNvfp4Threads)
    grouped_fp4_quantize_strided_kernel(GroupedQuantizeParams p) {
  grouped_fp4_body<T, kSilu, false>(p);
}
template <class T>
__global__ void __launch_bounds__(kNvfp4Threads)
    grouped_mxfp8_quantize_kernel(GroupedQuantizeParams p) {
  grouped_mxfp8_body<T, true>(p);
}
template <class T>
__global__ void __launch_bounds__(kNvfp4Threads)
    grouped_mxfp8_quantize_strided_kernel(GroupedQuantizeParams p) {
  grouped_mxfp8_body<T, false>(p);
}

template <class F>
void dispatch_half(DType dtype, const char* op, const char* arg, F&& f) {
  if (dtype == DType::kBFloat16) {
    f.template operator()<BFloat16>();
  } else if (dtype == DType::kFloat16) {
    f.template operator()<Half>();
  } else {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, op, arg, "must be float16 or bfloat16");
  }
}

bool aligned(const void* ptr, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(ptr) % bytes == 0;
}
// Every stride a multiple of `elems`.
bool strides_multiple(std::initializer_list<int64_t> strides, int64_t elems) {
  for (int64_t s : strides) {
    if (s % elems != 0) return false;
  }
  return true;
}

__device__ uint16_t encode_bf16(float x) { return float_to_bfloat16_bits(x); }
__device__ uint16_t encode_half(float x) { return float_to_half_bits(x); }

}  // namespace

void gather_rows(const RowGatherParams& p, void* stream) {
  const int64_t n = p.rows * p.row_bytes;
  if (n == 0) return;
  launch_kernel("gather_rows", gather_rows_kernel, dim3(nvfp4_grid(n)), dim3(kNvfp4Threads), 0,
                static_cast<cudaStream_t>(stream), false, p);
}

void nvfp4_kv_dequantize(const Nvfp4KvParams& p, void* stream) {
  const int64_t n = p.m * p.k;
  if (n == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kBFloat16) {
    launch_kernel("nvfp4_kv_dequantize", kv_dequantize_kernel<uint16_t, encode_bf16>,
                  dim3(nvfp4_grid(n)), dim3(kNvfp4Threads), 0, s, false, p);
  } else if (p.dtype == DType::kFloat16) {
    launch_kernel("nvfp4_kv_dequantize", kv_dequantize_kernel<uint16_t, encode_half>,
                  dim3(nvfp4_grid(n)), dim3(kNvfp4Threads), 0, s, false, p);
  } else {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, "nvfp4_kv_dequantize", "output_dtype",
                    "must be bfloat16 or float16");
  }
}

void nvfp4_paged_dequantize(const Nvfp4PagedDequantParams& p, void* stream) {
  const char* op = "nvfp4_kv_dequantize_paged";
  if (p.out_dtype != DType::kBFloat16 && p.out_dtype != DType::kFloat16) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "output_k", "must be bfloat16 or float16");
  }
  int64_t max_t = 0;
  for (int64_t b = 0; b < p.batch; ++b) max_t = p.seq_lens[b] > max_t ? p.seq_lens[b] : max_t;
  if (p.batch == 0 || max_t == 0 || p.heads == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const size_t tbytes = static_cast<size_t>(p.batch * p.table_cols) * sizeof(int64_t);
  const size_t lbytes = static_cast<size_t>(p.batch) * sizeof(int64_t);
  void* buf = nullptr;
  FLASHINFER_CUDA_CALL(op, malloc_async(&buf, tbytes + lbytes, s));
  auto* table = static_cast<int64_t*>(buf);
  auto* lens = table + p.batch * p.table_cols;
  // From pageable host memory: the copies have left the caller's arrays when they return.
  cudaError_t err = cudaMemcpyAsync(table, p.block_table, tbytes, cudaMemcpyHostToDevice, s);
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(lens, p.seq_lens, lbytes, cudaMemcpyHostToDevice, s);
  }
  for (int kv = 0; kv < 2 && err == cudaSuccess; ++kv) {
    const int64_t n = p.batch * max_t * p.heads * p.head_dim[kv];
    if (n == 0) continue;
    auto* kernel = p.out_dtype == DType::kBFloat16 ? paged_dequantize_kernel<encode_bf16>
                                                   : paged_dequantize_kernel<encode_half>;
    err = try_launch_kernel(kernel, dim3(nvfp4_grid(n)), dim3(kNvfp4Threads), 0, s, false, p, kv,
                            max_t, static_cast<const int64_t*>(table),
                            static_cast<const int64_t*>(lens));
  }
  const cudaError_t free_err = cudaFreeAsync(buf, s);  // stream-ordered: after the kernels
  FLASHINFER_CUDA_CALL(op, err);
  FLASHINFER_CUDA_CALL(op, free_err);
}

void batched_fp4_quantize(const GroupedQuantizeParams& p, void* stream, bool enable_pdl) {
  const char* op = "nvfp4_batched_quantize";
  if (!p.fp4 || p.silu_and_mul || p.rows != nullptr || p.padded_k != p.k) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "a",
                    "the CUDA batch quantizer takes unmasked NVFP4 input only");
  }
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t out_row = p.k / 2;
  // The CPU zeroes the whole output first; every byte is then written.
  FLASHINFER_CUDA_CALL(op,
                       cudaMemsetAsync(p.out, 0, static_cast<size_t>(p.groups * p.m * out_row), s));
  const auto elem = static_cast<int64_t>(dtype_size(p.in_dtype));
  for (int64_t g = 0; g < p.groups; ++g) {
    Fp4QuantizeParams q;
    q.input = static_cast<const char*>(p.input) + g * p.in_stride_g * elem;
    q.in_dtype = p.in_dtype;
    q.m = p.m;
    q.k = p.k;
    q.in_stride_m = p.in_stride_m;
    q.in_stride_k = 1;
    q.out = p.out + g * p.m * out_row;
    q.sf = p.sf + g * p.sf_per_group;
    q.sf_size = p.sf_per_group;
    q.global_scale = p.global_scale ? p.global_scale + (p.per_group_scale ? g : 0) : nullptr;
    q.global_scale_per_row = p.per_row_scale;
    q.sf_vec_size = 16;
    q.layout = SfLayoutCode::k128x4;
    fp4_quantize(q, stream, enable_pdl);
  }
}

void grouped_quantize(const GroupedQuantizeParams& p, void* stream, bool enable_pdl) {
  const char* op = !p.fp4           ? "mxfp8_grouped_quantize"
                   : p.silu_and_mul ? "silu_and_mul_scaled_nvfp4_experts_quantize"
                                    : "scaled_fp4_grouped_quantize";
  const int64_t nb = p.fp4 ? p.k / kNvfp4Block : p.padded_k / kMxfp8Block;
  const int64_t n = p.groups * p.m * nb;
  if (n == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  // The scales' padding and the rows past each mask read zero, as after the CPU's memset; every
  // output byte is written by the kernel. Stream-ordered: nothing waits on the host.
  FLASHINFER_CUDA_CALL(op,
                       cudaMemsetAsync(p.sf, 0, static_cast<size_t>(p.groups * p.sf_per_group), s));
  // 16-byte loads when every row start (of gate and up: K is a multiple of 16) is 16-byte
  // aligned, and wide stores into the 16-byte aligned output; else element loads, byte stores.
  const auto elem = dtype_size(p.in_dtype);
  const bool vec = aligned16(p.input, p.m > 1 ? p.in_stride_m : 0, elem) &&
                   aligned16(p.input, p.groups > 1 ? p.in_stride_g : 0, elem) && aligned(p.out, 16);
  dispatch_half(p.in_dtype, op, "a", [&]<class T>() {
    void (*kernel)(GroupedQuantizeParams);
    if (!p.fp4) {
      kernel = vec ? grouped_mxfp8_quantize_kernel<T> : grouped_mxfp8_quantize_strided_kernel<T>;
    } else if (p.silu_and_mul) {
      kernel =
          vec ? grouped_fp4_quantize_kernel<T, true> : grouped_fp4_quantize_strided_kernel<T, true>;
    } else {
      kernel = vec ? grouped_fp4_quantize_kernel<T, false>
                   : grouped_fp4_quantize_strided_kernel<T, false>;
    }
    const unsigned grid =
        resident_grid(op, kernel, kNvfp4Threads, (n + kNvfp4Threads - 1) / kNvfp4Threads);
    launch_kernel(op, kernel, dim3(grid), dim3(kNvfp4Threads), 0, s, enable_pdl, p);
  });
}

void silu_and_mul_rows(const SiluMulParams& p, void* stream, bool enable_pdl) {
  const char* op = "silu_and_mul_nvfp4_quantize";
  // 16-byte chunks when every row start of gate, up and the output is 16-byte aligned (k is a
  // multiple of 16, the output contiguous).
  const bool vec =
      aligned(p.input, 16) && aligned(p.out, 16) && p.in_stride_m % 8 == 0 && p.k % 8 == 0;
  const int64_t n = vec ? p.m * (p.k / 8) : p.m * p.k;
  if (n == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(grid_stride_blocks(n)));
  dispatch_half(p.dtype, op, "input", [&]<class T>() {
    launch_kernel(op, vec ? nvfp4_silu_mul_kernel<T> : nvfp4_silu_mul_strided_kernel<T>, grid,
                  dim3(kNvfp4Threads), 0, s, enable_pdl, p);
  });
}

void nvfp4_paged_append(const Nvfp4PagedAppendParams& p, void* stream, bool enable_pdl) {
  const char* op = "nvfp4_quantize_append_paged_kv_cache";
  const int64_t n = 2 * p.nnz * p.heads * (p.head_dim / kNvfp4Block);
  if (n == 0) return;
  // 16-byte loads when every K/V row start is 16-byte aligned, 8-byte stores when every cache
  // row start is 8-byte aligned; otherwise element loads and byte stores.
  const bool vec = aligned(p.key, 16) && aligned(p.value, 16) &&
                   strides_multiple({p.k_stride_n, p.k_stride_h, p.v_stride_n, p.v_stride_h}, 8) &&
                   aligned(p.k_cache, 8) && aligned(p.v_cache, 8) &&
                   strides_multiple({p.kc_stride[0], p.kc_stride[1], p.kc_stride[2], p.vc_stride[0],
                                     p.vc_stride[1], p.vc_stride[2]},
                                    8);
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(grid_stride_blocks(n)));
  dispatch_half(p.dtype, op, "append_key", [&]<class T>() {
    launch_kernel(op, vec ? nvfp4_append_kernel<T> : nvfp4_append_strided_kernel<T>, grid,
                  dim3(kNvfp4Threads), 0, s, enable_pdl, p);
  });
}

void nvfp4_paged_quantize(const Nvfp4PagedQuantParams& p, void* stream) {
  const char* op = "nvfp4_quantize_paged_kv_cache";
  const int64_t n = p.shape[0] * p.shape[1] * p.shape[2] * (p.shape[3] / kNvfp4Block);
  if (n == 0) return;
  const bool vec = aligned(p.input, 16) && p.stride[3] == 1 &&
                   strides_multiple({p.stride[0], p.stride[1], p.stride[2]}, 8);
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(grid_stride_blocks(n)));
  dispatch_half(p.dtype, op, "k_cache", [&]<class T>() {
    launch_kernel(op, vec ? nvfp4_paged_quantize_kernel<T> : nvfp4_paged_quantize_strided_kernel<T>,
                  grid, dim3(kNvfp4Threads), 0, s, false, p);
  });
}

void abs_max(const AbsMaxParams& p, void* stream) {
  const char* op = "nvfp4_quantize_paged_kv_cache";
  const int64_t numel = p.shape[0] * p.shape[1] * p.shape[2] * p.shape[3];
  *p.result = 0.0f;
  if (numel == 0) return;
  // Contiguous (row-major strides) and 16-byte aligned: 8 elements per load.
  const bool vec = aligned(p.input, 16) && numel % 8 == 0 && p.stride[3] == 1 &&
                   p.stride[2] == p.shape[3] && p.stride[1] == p.shape[2] * p.stride[2] &&
                   p.stride[0] == p.shape[1] * p.stride[1];
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(grid_stride_blocks(vec ? numel / 8 : numel)));
  void* buf = nullptr;
  FLASHINFER_CUDA_CALL(op, malloc_async(&buf, sizeof(unsigned int), s));
  auto* bits = static_cast<unsigned int*>(buf);
  cudaError_t err = cudaMemsetAsync(bits, 0, sizeof(unsigned int), s);
  if (err == cudaSuccess) {
    dispatch_half(p.dtype, op, "k_cache", [&]<class T>() {
      err = try_launch_kernel(vec ? nvfp4_abs_max_kernel<T> : nvfp4_abs_max_strided_kernel<T>, grid,
                              dim3(kNvfp4Threads), 0, s, false, p, bits);
    });
  }
  unsigned int host_bits = 0;
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(&host_bits, bits, sizeof(unsigned int), cudaMemcpyDeviceToHost, s);
  }
  const cudaError_t free_err = cudaFreeAsync(buf, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);  // host_bits is read below
  FLASHINFER_CUDA_CALL(op, err);
  FLASHINFER_CUDA_CALL(op, free_err);
  *p.result = f32_from_bits(host_bits);
}

}  // namespace flashinfer::kernels::cuda
