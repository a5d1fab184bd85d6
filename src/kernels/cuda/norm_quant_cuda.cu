// Fused norm + fp8 quantization on CUDA: one block per row, its input read with 16-byte loads
// where the rows allow (norm_quant_kernel), else element by element (norm_quant_strided_kernel).
// The row is reduced in fp32 (the fused-add variant first forms x = input + residual, writes the
// rounded sum back to residual and keeps the unrounded fp32 sums in shared memory for the output
// pass), then written as fp8(clamp(y / scale)) with round-to-nearest-even saturating conversions.
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/norm_quant_cuda.h"
#include "kernels/cuda/vec_cuda.cuh"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kNormQuantThreads = 256;

// A NaN: 0x7F with nan_to_nan (rmsnorm_quant / fused_add_rmsnorm_quant / layernorm_quant, as
// upstream's CuTe kernels), else -max; the CPU reference's quantize says why.
__device__ __forceinline__ uint8_t quantize(float y, float inv_scale, bool e4m3,
                                            bool nan_to_nan = false) {
  const float mx = e4m3 ? 448.0f : 57344.0f;
  const float yi = y * inv_scale;
  if (nan_to_nan && isnan(yi)) return 0x7F;
  const float v = fminf(fmaxf(yi, -mx), mx);
  return e4m3 ? static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3))
              : static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2));
}

// The fused variant keeps the unrounded sums of the thread's elements in shared memory: the
// residual is overwritten with the rounded sum in pass 1, and pass 2 needs the fp32 one.
// kVec: the row (and the residual) come in with 16-byte loads, chunk by chunk, into that fp32
// row in shared memory (the fused sums and the residual's 16-byte stores formed per element as
// before) for every kind; the passes then read it with the element kernel's thread-to-element
// map, so each thread's partial sums, and the block reductions, add the same values in the same
// order: the output is the element kernel's bit for bit.
template <class T, bool kVec>
__device__ __forceinline__ void norm_quant_row(const NormQuantParams& p, float* xs,
                                               float* scratch) {
  const int64_t b = blockIdx.x;
  const int64_t n = p.hidden;
  const T* in = static_cast<const T*>(p.input) + b * p.in_stride_b;
  const float inv_scale = 1.0f / (p.scale ? *p.scale : p.scale_value);
  const bool e4m3 = p.out_dtype == DType::kFloat8E4M3FN;
  uint8_t* out = static_cast<uint8_t*>(p.out) + b * p.out_stride_b;
  const bool fused = p.kind == NormQuantKind::kFusedAddRms;
  T* res = fused ? static_cast<T*>(p.residual) + b * p.res_stride_b : nullptr;
  const bool staged = kVec || fused;
  auto load = [&](int64_t i) -> float {
    if (staged) return xs[i];
    return to_f32(in[i * p.in_stride_d]);
  };
  if constexpr (kVec) {
    constexpr int V = kVecElems<T>;
    for (int64_t c = threadIdx.x; c < n / V; c += blockDim.x) {
      float a[V];
      load_vec(in + c * V, a);
      if (fused) {
        float r[V];
        load_vec(res + c * V, r);
#pragma unroll
        for (int j = 0; j < V; ++j) a[j] = a[j] + r[j];
        store_vec_global(res + c * V, a);
      }
#pragma unroll
      for (int j = 0; j < V; ++j) xs[c * V + j] = a[j];
    }
    __syncthreads();  // the passes below read other threads' chunks
  } else if (fused) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = to_f32(in[i * p.in_stride_d]) + to_f32(res[i * p.res_stride_d]);
      res[i * p.res_stride_d] = from_f32<T>(v);
      xs[i] = v;
    }
  }
  if (p.kind == NormQuantKind::kLayer) {
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += load(i);
    const float mean = block_reduce_sum(s, scratch) / static_cast<float>(n);
    float v2 = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float d = load(i) - mean;
      v2 += d * d;
    }
    const float rstd = rsqrtf(block_reduce_sum(v2, scratch) / static_cast<float>(n) + p.eps);
    const float* g = static_cast<const float*>(p.weight);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      // Upstream 0.7.4's CuTe kernel (its default): y stays fp32 (its CUDA fallback rounded to
      // bf16 first), then times 1 / scale with no clamp, so NaN is 0x7F.
      const float y = (load(i) - mean) * rstd * g[i * p.weight_stride] + p.beta[i * p.beta_stride];
      out[i * p.out_stride_d] = quantize(y, inv_scale, e4m3, /*nan_to_nan=*/true);
    }
  } else {
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = load(i);
      ss += v * v;
    }
    const float rstd = rsqrtf(block_reduce_sum(ss, scratch) / static_cast<float>(n) + p.eps);
    const T* w = static_cast<const T*>(p.weight);
    if (p.kind == NormQuantKind::kRmsSilu && e4m3) {
      // fused_rmsnorm_silu's fp8 output: e4m3 (saturating) of silu(y), scale 1.
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float y = load(i) * rstd * to_f32(w[i * p.weight_stride]);
        out[i * p.out_stride_d] = quantize(y / (1.0f + expf(-y)), 1.0f, true);
      }
    } else if (p.kind == NormQuantKind::kRmsSilu) {
      __nv_bfloat16* o = static_cast<__nv_bfloat16*>(p.out) + b * p.out_stride_b;
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float y = load(i) * rstd * to_f32(w[i * p.weight_stride]);
        o[i * p.out_stride_d] = __float2bfloat16_rn(y / (1.0f + expf(-y)));
      }
    } else {
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float y = load(i) * rstd * to_f32(w[i * p.weight_stride]);
        out[i * p.out_stride_d] = quantize(y, inv_scale, e4m3, /*nan_to_nan=*/true);
      }
    }
  }
}

// Element loads at any strides: the form for rows that are not unit-stride or 16-byte aligned.
template <class T>
__global__ void __launch_bounds__(kNormQuantThreads) norm_quant_strided_kernel(NormQuantParams p) {
  extern __shared__ float xs[];  // [hidden] for the fused variant
  __shared__ float scratch[32];
  pdl_wait();
  norm_quant_row<T, false>(p, xs, scratch);
  pdl_launch_dependents();
}

// 16-byte loads of the row (and residual) where norm_quant_vectorizable; named apart from the
// element kernel for the static SASS rule `quant`.
template <class T>
__global__ void __launch_bounds__(kNormQuantThreads) norm_quant_kernel(NormQuantParams p) {
  extern __shared__ float xs[];  // [hidden]
  __shared__ float scratch[32];
  pdl_wait();
  norm_quant_row<T, true>(p, xs, scratch);
  pdl_launch_dependents();
}

// The dynamic shared memory a block of these kernels may have on the current device: the opt-in
// limit (227 KiB on sm_90, 99 KiB on sm_86 / sm_89) less the static scratch, at most 160 KiB.
int64_t norm_quant_smem_limit() {
  const int optin = current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, "norm_quant");
  return std::min<int64_t>(160 * 1024, int64_t{optin} - 32 * 4);
}

// Whether the input (and the fused variant's residual) rows are unit-stride, start on 16-byte
// boundaries and fill whole 16-byte chunks, and the fp32 row fits the shared memory (`limit`);
// otherwise the element kernel, which stages nothing for the plain kinds.
bool norm_quant_vectorizable(const NormQuantParams& p, std::size_t elem, int64_t limit) {
  const bool fused = p.kind == NormQuantKind::kFusedAddRms;
  return p.hidden * 4 <= limit && (p.hidden * static_cast<int64_t>(elem)) % 16 == 0 &&
         p.in_stride_d == 1 && aligned16(p.input, p.batch > 1 ? p.in_stride_b : 0, elem) &&
         (!fused ||
          (p.res_stride_d == 1 && aligned16(p.residual, p.batch > 1 ? p.res_stride_b : 0, elem)));
}

}  // namespace

void norm_quant(const NormQuantParams& p, void* stream, bool enable_pdl) {
  if (p.batch == 0) return;
  FLASHINFER_CHECK_CODE(p.batch <= 0x7FFFFFFF, ErrorCode::kUnsupported, "norm_quant", "input",
                        "more than 2^31 - 1 rows");
  const int64_t limit = norm_quant_smem_limit();
  const std::size_t smem =
      p.kind == NormQuantKind::kFusedAddRms ? static_cast<std::size_t>(p.hidden) * 4 : 0;
  FLASHINFER_CHECK_CODE(static_cast<int64_t>(smem) <= limit, ErrorCode::kUnsupported,
                        "fused_add_rmsnorm_quant", "input",
                        "hidden size above " + std::to_string(limit / 4) +
                            " is not supported on this device (its fp32 row in shared memory)");
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "norm_quant", "input", [&]<class T>() {
        const auto s = static_cast<cudaStream_t>(stream);
        const dim3 grid(static_cast<unsigned>(p.batch));
        if (norm_quant_vectorizable(p, sizeof(T), limit)) {
          launch_kernel("norm_quant", norm_quant_kernel<T>, grid, dim3(kNormQuantThreads),
                        static_cast<std::size_t>(p.hidden) * 4, s, enable_pdl, p);
        } else {
          launch_kernel("norm_quant", norm_quant_strided_kernel<T>, grid, dim3(kNormQuantThreads),
                        smem, s, enable_pdl, p);
        }
      });
}

}  // namespace flashinfer::kernels::cuda
