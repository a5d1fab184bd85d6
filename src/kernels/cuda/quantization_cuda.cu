#include "flashinfer/float_formats.h"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/quantization_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

// Element loads, exact to fp32. FP8 inputs decode through the same formula as the CPU table.
__device__ __forceinline__ float load_elem(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float load_elem(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float load_elem(const __nv_fp8_e4m3* p) {
  return detail::DecodeMinifloat<4, 3, detail::Specials::kFiniteNan>(p->__x);
}

__device__ __forceinline__ float e4m3_to_float(uint8_t code) {
  return detail::DecodeMinifloat<4, 3, detail::Specials::kFiniteNan>(code);
}

// One thread per (row, block). Every fp32 operation is an explicitly IEEE-rounded intrinsic so
// the results equal the CPU reference bit for bit (no contraction, no approximate division).
template <class T>
__global__ void fp4_quantize_kernel(Fp4QuantizeParams p) {
  pdl_wait();
  const int vec = p.sf_vec_size;
  const int64_t sf_cols = p.k / vec;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < p.m * sf_cols) {
    const int64_t r = idx / sf_cols, b = idx % sf_cols;
    float gs = p.global_scale ? *p.global_scale : 1.0f;
    if (p.global_scale_inversed) gs = __fdiv_rn(1.0f, gs);
    const T* x = static_cast<const T*>(p.input) + r * p.in_stride_m + b * vec * p.in_stride_k;
    float v[32];
    float amax = 0.0f;
    for (int i = 0; i < vec; ++i) {
      v[i] = load_elem(x + i * p.in_stride_k);
      amax = fmaxf(amax, fabsf(v[i]));
    }
    uint8_t code;
    float sf;
    if (p.ue8m0) {
      code = ue8m0_round_up(__fdiv_rn(amax, 6.0f));
      sf = ue8m0_to_float(code);
    } else {
      code = float_to_e4m3fn_bits(__fdiv_rn(__fmul_rn(gs, amax), 6.0f), true);
      sf = e4m3_to_float(code);
    }
    p.sf[sf_offset(p.layout, r, b, sf_cols)] = code;
    uint8_t* q = p.out + r * (p.k / 2) + b * vec / 2;
    for (int i = 0; i < vec; i += 2) {
      uint8_t c[2];
      for (int j = 0; j < 2; ++j) {
        float y;
        if (p.ue8m0) {
          y = __fdiv_rn(v[i + j], sf);
        } else {
          y = sf != 0.0f ? __fdiv_rn(__fmul_rn(v[i + j], gs), sf) : 0.0f;
        }
        c[j] = float_to_e2m1_bits(y);
      }
      q[i / 2] = pack_e2m1x2(c[0], c[1]);
    }
  }
  pdl_launch_dependents();
}

template <class T>
__global__ void mxfp8_quantize_kernel(Mxfp8QuantizeParams p) {
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
    const uint8_t code = ue8m0_round_up(__fdiv_rn(amax, 448.0f));
    const float sf = ue8m0_to_float(code);
    p.sf[sf_offset(p.layout, r, b, sf_cols)] = code;
    uint8_t* q = p.out + r * p.k + b * 32;
    for (int i = 0; i < 32; ++i) q[i] = float_to_e4m3fn_bits(__fdiv_rn(v[i], sf), true);
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

}  // namespace

void fp4_quantize(const Fp4QuantizeParams& p, void* stream, bool enable_pdl) {
  auto s = static_cast<cudaStream_t>(stream);
  const char* op = "fp4_quantize";
  // Padding of the swizzled layouts must read as zero.
  FLASHINFER_CUDA_CALL(op, cudaMemsetAsync(p.sf, 0, static_cast<size_t>(p.sf_size), s));
  const int64_t n = p.m * (p.k / p.sf_vec_size);
  dispatch_dtype<CudaElements, kFloat16, kBFloat16, kFloat8E4M3FN>(
      p.in_dtype, op, "input",
      [&]<class T>() { launch(op, fp4_quantize_kernel<T>, p, n, s, enable_pdl); });
}

void mxfp8_quantize(const Mxfp8QuantizeParams& p, void* stream, bool enable_pdl) {
  auto s = static_cast<cudaStream_t>(stream);
  const char* op = "mxfp8_quantize";
  FLASHINFER_CUDA_CALL(op, cudaMemsetAsync(p.sf, 0, static_cast<size_t>(p.sf_size), s));
  const int64_t n = p.m * (p.k / 32);
  dispatch_dtype<CudaElements, kFloat16, kBFloat16>(p.in_dtype, op, "input", [&]<class T>() {
    launch(op, mxfp8_quantize_kernel<T>, p, n, s, enable_pdl);
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
