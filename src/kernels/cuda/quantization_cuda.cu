#include "flashinfer/float_formats.h"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/quantization_cuda.h"
#include "kernels/cuda/vec_cuda.cuh"
#include "kernels/nvfp4_rules.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kQuantThreads = 128;  // threads per block of the vector (grid-stride) kernels

// Element loads, exact to fp32. FP8 inputs decode through the same formula as the CPU table.
__device__ __forceinline__ float load_elem(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float load_elem(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float load_elem(const float* p) { return *p; }
__device__ __forceinline__ float load_elem(const __nv_fp8_e4m3* p) {
  return detail::DecodeMinifloat<4, 3, detail::Specials::kFiniteNan>(p->__x);
}

__device__ __forceinline__ float e4m3_to_float(uint8_t code) {
  return detail::DecodeMinifloat<4, 3, detail::Specials::kFiniteNan>(code);
}

// The per-block arithmetic both kernel forms share, so the vector and strided paths (and the
// CPU reference) agree bit for bit; MXFP8's is kernels/nvfp4_rules.h's (mxfp8_scale_code,
// mxfp8_value_code), the CPU reference's own. Every fp32 operation is an explicitly IEEE-rounded
// intrinsic (no contraction, no approximate division).
struct Fp4Scale {
  uint8_t code;
  float sf;
  bool zero;  // the CuTe-DSL zero rule applies: the codes are e2m1(v * 0)
  float amax;
};
__device__ __forceinline__ float fp4_global_scale(const Fp4QuantizeParams& p, int64_t row) {
  const float gs = p.global_scale ? p.global_scale[p.global_scale_per_row ? row : 0] : 1.0f;
  return p.global_scale_inversed ? __fdiv_rn(1.0f, gs) : gs;
}
// cute_zero: Fp4QuantizeParams::cute_dsl_zero (a zero decoded scale, ue8m0 code 0 included).
__device__ __forceinline__ Fp4Scale fp4_scale(float amax, float gs, bool ue8m0, bool cute_zero) {
  if (ue8m0) {
    const uint8_t code = ue8m0_round_up(__fdiv_rn(amax, 6.0f));
    return {code, ue8m0_to_float(code), code == 0, amax};  // code 0: zeros (upstream 0.7.4)
  }
  const uint8_t code = float_to_e4m3fn_bits(__fdiv_rn(__fmul_rn(gs, amax), 6.0f), true);
  const float sf = e4m3_to_float(code);
  return {code, sf, cute_zero && sf == 0.0f, amax};
}
__device__ __forceinline__ uint8_t fp4_code(float v, float gs, const Fp4Scale& s, bool ue8m0) {
  if (s.zero) return float_to_e2m1_bits(__fmul_rn(v, 0.0f));
  if (ue8m0) return float_to_e2m1_bits(__fdiv_rn(v, s.sf));
  return nvfp4_code(v, gs, s.sf);
}

// N elements of T from a 16-byte aligned, unit-stride block: every 16-byte load is issued before
// any is decoded, so a thread keeps N * sizeof(T) / 16 loads in flight.
template <class T, int N>
__device__ __forceinline__ void load_block(const T* x, float* v) {
  constexpr int V = kVecElems<T>;
  static_assert(N % V == 0);
  Vec16<T> raw[N / V];
#pragma unroll
  for (int c = 0; c < N / V; ++c) raw[c] = reinterpret_cast<const Vec16<T>*>(x)[c];
#pragma unroll
  for (int c = 0; c < N / V; ++c) {
#pragma unroll
    for (int j = 0; j < V; ++j) v[c * V + j] = load_elem(&raw[c].v[j]);
  }
}

// `bytes` (8, 16 or 32) bytes from registers to a global address aligned to min(bytes, 16).
template <int B>
__device__ __forceinline__ void store_bytes(uint8_t* q, const uint8_t (&b)[B]) {
  if constexpr (B == 8) {
    uint2 u;
    memcpy(&u, b, 8);
    *reinterpret_cast<uint2*>(q) = u;
  } else {
    static_assert(B % 16 == 0);
#pragma unroll
    for (int c = 0; c < B / 16; ++c) {
      uint4 u;
      memcpy(&u, b + 16 * c, 16);
      reinterpret_cast<uint4*>(q)[c] = u;
    }
  }
}

// One thread per (row, block), any strides: the element-load form for rows that are not 16-byte
// aligned or not unit-stride. Named apart from the vector kernel for the static SASS rule `quant`.
template <class T>
__global__ void fp4_quantize_strided_kernel(Fp4QuantizeParams p) {
  pdl_wait();
  const int vec = p.sf_vec_size;
  const int64_t sf_cols = p.k / vec;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < p.m * sf_cols) {
    const int64_t r = idx / sf_cols, b = idx % sf_cols;
    const float gs = fp4_global_scale(p, r);
    const T* x = static_cast<const T*>(p.input) + r * p.in_stride_m + b * vec * p.in_stride_k;
    // Two passes over the (cached) elements instead of a v[vec] array: a runtime-sized
    // register array would live in local memory.
    uint8_t* q = p.out + r * (p.k / 2) + b * vec / 2;
    if constexpr (std::is_same_v<T, __nv_fp8_e4m3>) {  // upstream's fp8 path (nvfp4_rules.h)
      float amax = 0.0f;
      for (int i = 0; i < vec; ++i) {
        amax = fmaxf(amax, fabsf(fp8_fp4_prescale(load_elem(x + i * p.in_stride_k), gs)));
      }
      const Fp8Fp4Scale s = fp8_fp4_scale(amax, gs, p.ue8m0);
      p.sf[sf_offset(p.layout, r, b, sf_cols)] = s.code;
      for (int i = 0; i < vec; i += 2) {
        const float a = fp8_fp4_prescale(load_elem(x + i * p.in_stride_k), gs);
        const float c = fp8_fp4_prescale(load_elem(x + (i + 1) * p.in_stride_k), gs);
        q[i / 2] = pack_e2m1x2(float_to_e2m1_bits(__fmul_rn(a, s.out)),
                               float_to_e2m1_bits(__fmul_rn(c, s.out)));
      }
      pdl_launch_dependents();
      return;
    }
    float amax = 0.0f;
    for (int i = 0; i < vec; ++i) amax = fmaxf(amax, fabsf(load_elem(x + i * p.in_stride_k)));
    const Fp4Scale s = fp4_scale(amax, gs, p.ue8m0, p.cute_dsl_zero);
    p.sf[sf_offset(p.layout, r, b, sf_cols)] = s.code;
    for (int i = 0; i < vec; i += 2) {
      q[i / 2] = pack_e2m1x2(fp4_code(load_elem(x + i * p.in_stride_k), gs, s, p.ue8m0),
                             fp4_code(load_elem(x + (i + 1) * p.in_stride_k), gs, s, p.ue8m0));
    }
  }
  pdl_launch_dependents();
}

// As fp4_quantize_strided_kernel for unit-stride rows starting on 16-byte boundaries (and a
// 16-byte aligned output): a block's VEC elements come in with 16-byte loads and its VEC / 2
// packed bytes leave in one 8- or 16-byte store. The grid holds the device's resident blocks and
// strides over the (row, block) items.
template <class T, int VEC>
__global__ void __launch_bounds__(kQuantThreads) fp4_quantize_kernel(Fp4QuantizeParams p) {
  pdl_wait();
  const int64_t sf_cols = p.k / VEC, n = p.m * sf_cols;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / sf_cols, b = idx % sf_cols;
    const float gs = fp4_global_scale(p, r);
    float v[VEC];
    load_block<T, VEC>(static_cast<const T*>(p.input) + r * p.in_stride_m + b * VEC, v);
    uint8_t q[VEC / 2];
    if constexpr (std::is_same_v<T, __nv_fp8_e4m3>) {  // upstream's fp8 path (nvfp4_rules.h)
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        v[i] = fp8_fp4_prescale(v[i], gs);
        amax = fmaxf(amax, fabsf(v[i]));
      }
      const Fp8Fp4Scale s = fp8_fp4_scale(amax, gs, p.ue8m0);
      p.sf[sf_offset(p.layout, r, b, sf_cols)] = s.code;
#pragma unroll
      for (int i = 0; i < VEC; i += 2) {
        q[i / 2] = pack_e2m1x2(float_to_e2m1_bits(__fmul_rn(v[i], s.out)),
                               float_to_e2m1_bits(__fmul_rn(v[i + 1], s.out)));
      }
      store_bytes(p.out + r * (p.k / 2) + b * (VEC / 2), q);
      continue;
    }
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < VEC; ++i) amax = fmaxf(amax, fabsf(v[i]));
    const Fp4Scale s = fp4_scale(amax, gs, p.ue8m0, p.cute_dsl_zero);
    p.sf[sf_offset(p.layout, r, b, sf_cols)] = s.code;
#pragma unroll
    for (int i = 0; i < VEC; i += 2) {
      q[i / 2] = pack_e2m1x2(fp4_code(v[i], gs, s, p.ue8m0), fp4_code(v[i + 1], gs, s, p.ue8m0));
    }
    store_bytes(p.out + r * (p.k / 2) + b * (VEC / 2), q);
  }
  pdl_launch_dependents();
}

// Per-token NVFP4 (Fp4QuantizeParams::per_token_scale): one block a row, as upstream's. The row's
// amax (NaN ignored, like the blocks') by a block reduction, its scales
// (nvfp4_per_token_scales), then the row's 16-element blocks by the threads in turn (the second
// pass reads the row again, from L1 / L2). VEC: unit-stride rows on 16-byte boundaries, loaded
// 16 bytes at a time (the strided form, named apart for the SASS rule, loads elements).
constexpr int kPerTokenThreads = 128;
template <class T, bool VEC>
__device__ __forceinline__ void per_token_block(const Fp4QuantizeParams& p, const T* x, int64_t b,
                                                float* v) {
  if constexpr (VEC) {
    load_block<T, 16>(x + b * 16, v);
  } else {
    FLASHINFER_UNROLL
    for (int i = 0; i < 16; ++i) v[i] = load_elem(x + (b * 16 + i) * p.in_stride_k);
  }
}
template <class T, bool VEC>
__device__ __forceinline__ void nvfp4_per_token_row(const Fp4QuantizeParams& p) {
  pdl_wait();
  __shared__ float part[kPerTokenThreads / 32];
  const int64_t r = blockIdx.x;
  const T* x = static_cast<const T*>(p.input) + r * p.in_stride_m;
  const int64_t sf_cols = p.k / 16;
  float v[16];
  float amax = 0.0f;
  for (int64_t b = threadIdx.x; b < sf_cols; b += blockDim.x) {
    per_token_block<T, VEC>(p, x, b, v);
    FLASHINFER_UNROLL
    for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(v[i]));
  }
  FLASHINFER_UNROLL
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = part[0];
  FLASHINFER_UNROLL
  for (int w = 1; w < kPerTokenThreads / 32; ++w) amax = fmaxf(amax, part[w]);
  const float gsi = p.per_token_gsi ? *p.per_token_gsi : p.per_token_gsi_value;
  const PerTokenScales sc = nvfp4_per_token_scales(amax, gsi);
  if (threadIdx.x == 0) p.per_token_scale[r] = sc.scale;
  for (int64_t b = threadIdx.x; b < sf_cols; b += blockDim.x) {
    per_token_block<T, VEC>(p, x, b, v);
    float bmax = 0.0f;
    FLASHINFER_UNROLL
    for (int i = 0; i < 16; ++i) bmax = fmaxf(bmax, fabsf(v[i]));
    const Fp4Scale s = fp4_scale(bmax, sc.encode, false, p.cute_dsl_zero);
    p.sf[sf_offset(p.layout, r, b, sf_cols)] = s.code;
    uint8_t q[8];
    FLASHINFER_UNROLL
    for (int i = 0; i < 16; i += 2) {
      q[i / 2] =
          pack_e2m1x2(fp4_code(v[i], sc.encode, s, false), fp4_code(v[i + 1], sc.encode, s, false));
    }
    store_bytes(p.out + r * (p.k / 2) + b * 8, q);
  }
  pdl_launch_dependents();
}
template <class T>
__global__ void __launch_bounds__(kPerTokenThreads) nvfp4_per_token_kernel(Fp4QuantizeParams p) {
  nvfp4_per_token_row<T, true>(p);
}
template <class T>
__global__ void __launch_bounds__(kPerTokenThreads)
    nvfp4_per_token_strided_kernel(Fp4QuantizeParams p) {
  nvfp4_per_token_row<T, false>(p);
}

template <class T>
__global__ void mxfp8_quantize_strided_kernel(Mxfp8QuantizeParams p) {
  pdl_wait();
  const int64_t sf_cols = p.k / 32;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < p.m * sf_cols) {
    const int64_t r = idx / sf_cols, b = idx % sf_cols;
    const T* x = static_cast<const T*>(p.input) + r * p.in_stride_m + b * 32 * p.in_stride_k;
    float v[32];
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) {
      v[i] = load_elem(x + i * p.in_stride_k);
      amax = fmaxf(amax, fabsf(v[i]));
    }
    const uint8_t code = mxfp8_scale_code(amax);
    const float sf = ue8m0_to_float(code);
    p.sf[sf_offset(p.layout, r, b, sf_cols)] = code;
    uint8_t* q = p.out + r * p.k + b * 32;
    for (int i = 0; i < 32; ++i) q[i] = mxfp8_value_code(v[i], sf);
  }
  pdl_launch_dependents();
}

// As mxfp8_quantize_strided_kernel with 16-byte loads (64 input bytes per block of 32) and two
// 16-byte stores, grid-stride over the (row, block) items as fp4_quantize_kernel.
template <class T>
__global__ void __launch_bounds__(kQuantThreads) mxfp8_quantize_kernel(Mxfp8QuantizeParams p) {
  pdl_wait();
  const int64_t sf_cols = p.k / 32, n = p.m * sf_cols;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / sf_cols, b = idx % sf_cols;
    float v[32];
    load_block<T, 32>(static_cast<const T*>(p.input) + r * p.in_stride_m + b * 32, v);
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(v[i]));
    const uint8_t code = mxfp8_scale_code(amax);
    const float sf = ue8m0_to_float(code);
    p.sf[sf_offset(p.layout, r, b, sf_cols)] = code;
    uint8_t q[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) q[i] = mxfp8_value_code(v[i], sf);
    store_bytes(p.out + r * p.k + b * 32, q);
  }
  pdl_launch_dependents();
}

__global__ void interleave_kernel(BlockScaleInterleaveParams p) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.batch * p.rows * p.cols) return;
  const int64_t c = idx % p.cols, r = (idx / p.cols) % p.rows, b = idx / (p.cols * p.rows);
  const int64_t per_batch = sf_buffer_size(SfLayoutCode::k128x4, p.rows, p.cols);
  const int64_t src = b * p.in_stride_b + r * p.in_stride_r + c * p.in_stride_c;
  const int64_t dst = b * per_batch + sf_offset(SfLayoutCode::k128x4, r, c, p.cols);
  const auto* in = static_cast<const uint8_t*>(p.input);
  auto* out = static_cast<uint8_t*>(p.out);
  for (int e = 0; e < p.elem_size; ++e) out[dst * p.elem_size + e] = in[src * p.elem_size + e];
}

template <class Kernel, class Params>
void launch(const char* op, Kernel kernel, const Params& p, int64_t threads_total,
            cudaStream_t stream, bool enable_pdl) {
  if (threads_total == 0) return;
  constexpr int kThreads = 128;
  launch_kernel(op, kernel, dim3(static_cast<unsigned>((threads_total + kThreads - 1) / kThreads)),
                dim3(kThreads), 0, stream, enable_pdl, p);
}

// A grid-stride vector kernel over `items` (row, block) items, one per thread per step.
template <class Params>
void launch_resident(const char* op, void (*kernel)(Params), const Params& p, int64_t items,
                     cudaStream_t stream, bool enable_pdl) {
  if (items == 0) return;
  const unsigned grid =
      resident_grid(op, kernel, kQuantThreads, (items + kQuantThreads - 1) / kQuantThreads);
  launch_kernel(op, kernel, dim3(grid), dim3(kQuantThreads), 0, stream, enable_pdl, p);
}

// Whether the input rows are unit-stride and start on 16-byte boundaries and the output is
// 16-byte aligned (its rows, k or k / 2 bytes at a block multiple, then are too): the vector
// kernels' precondition. A single row's stride is never used.
bool quant_vectorizable(const void* in, int64_t m, int64_t in_stride_m, int64_t in_stride_k,
                        std::size_t elem, const void* out) {
  return in_stride_k == 1 && aligned16(in, m > 1 ? in_stride_m : 0, elem) && aligned16(out, 0, 1);
}

}  // namespace

void fp4_quantize(const Fp4QuantizeParams& p, void* stream, bool enable_pdl) {
  auto s = static_cast<cudaStream_t>(stream);
  const char* op = "fp4_quantize";
  // Padding of the swizzled layouts must read as zero.
  FLASHINFER_CUDA_CALL(op, cudaMemsetAsync(p.sf, 0, static_cast<size_t>(p.sf_size), s));
  const int64_t n = p.m * (p.k / p.sf_vec_size);
  if (p.per_token_scale) {
    FLASHINFER_CHECK(p.sf_vec_size == 16 && p.m <= 0x7fffffff, op, "input",
                     "per-token NVFP4 takes blocks of 16 and at most 2^31 - 1 rows");
    if (p.m == 0) return;
    dispatch_dtype<CudaElements, kFloat16, kBFloat16>(p.in_dtype, op, "input", [&]<class T>() {
      const bool vec =
          quant_vectorizable(p.input, p.m, p.in_stride_m, p.in_stride_k, sizeof(T), p.out);
      launch_kernel(op, vec ? nvfp4_per_token_kernel<T> : nvfp4_per_token_strided_kernel<T>,
                    dim3(static_cast<unsigned>(p.m)), dim3(kPerTokenThreads), 0, s, enable_pdl, p);
    });
    return;
  }
  dispatch_dtype<CudaElements, kFloat16, kBFloat16, kFloat8E4M3FN>(
      p.in_dtype, op, "input", [&]<class T>() {
        const bool vec =
            (p.sf_vec_size == 16 || p.sf_vec_size == 32) &&
            quant_vectorizable(p.input, p.m, p.in_stride_m, p.in_stride_k, sizeof(T), p.out);
        if (vec && p.sf_vec_size == 16) {
          launch_resident(op, fp4_quantize_kernel<T, 16>, p, n, s, enable_pdl);
        } else if (vec) {
          launch_resident(op, fp4_quantize_kernel<T, 32>, p, n, s, enable_pdl);
        } else {
          launch(op, fp4_quantize_strided_kernel<T>, p, n, s, enable_pdl);
        }
      });
}

void mxfp8_quantize(const Mxfp8QuantizeParams& p, void* stream, bool enable_pdl) {
  auto s = static_cast<cudaStream_t>(stream);
  const char* op = "mxfp8_quantize";
  FLASHINFER_CUDA_CALL(op, cudaMemsetAsync(p.sf, 0, static_cast<size_t>(p.sf_size), s));
  const int64_t n = p.m * (p.k / 32);
  dispatch_dtype<CudaElements, kFloat16, kBFloat16, kFloat32>(
      p.in_dtype, op, "input", [&]<class T>() {
        if (quant_vectorizable(p.input, p.m, p.in_stride_m, p.in_stride_k, sizeof(T), p.out)) {
          launch_resident(op, mxfp8_quantize_kernel<T>, p, n, s, enable_pdl);
        } else {
          launch(op, mxfp8_quantize_strided_kernel<T>, p, n, s, enable_pdl);
        }
      });
}

void block_scale_interleave(const BlockScaleInterleaveParams& p, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const char* op = "block_scale_interleave";
  const int64_t total = p.batch * sf_buffer_size(SfLayoutCode::k128x4, p.rows, p.cols);
  FLASHINFER_CUDA_CALL(op, cudaMemsetAsync(p.out, 0, static_cast<size_t>(total * p.elem_size), s));
  launch(op, interleave_kernel, p, p.batch * p.rows * p.cols, s, false);
}

}  // namespace flashinfer::kernels::cuda
