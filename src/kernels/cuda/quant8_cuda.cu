// per_token_group_quant_8bit on CUDA: one warp per (row, group). The lanes stride the group for
// the absolute maximum (a warp max-reduction), lane 0 writes the scale, then every lane writes
// its quantized elements with the same arithmetic as the CPU reference (x / s, fmax/fmin clamp,
// saturating RNE fp8 conversion or a truncating int8 cast).
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/quant8_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

template <class T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) group_quant_kernel(GroupQuant8Params p) {
  const int64_t groups = p.k / p.group_size;
  const int64_t gid = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (gid >= p.rows * groups) return;
  const int64_t r = gid / groups, g = gid % groups;
  const int64_t base = r * p.k + g * p.group_size;
  const T* x = static_cast<const T*>(p.x) + base;
  float amax = 0.0f;
  for (int64_t i = lane; i < p.group_size; i += 32) amax = fmaxf(amax, fabsf(to_f32(x[i])));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  float s = fmaxf(amax, p.eps) / p.qmax;
  if (p.ue8m0) {
    int e = 0;
    const float m = frexpf(fmaxf(s, 1e-10f), &e);
    s = ldexpf(1.0f, m == 0.5f ? e - 1 : e);
  }
  if (lane == 0) p.scales[r * p.s_stride_row + g * p.s_stride_group] = s;
  for (int64_t i = lane; i < p.group_size; i += 32) {
    const float v = fminf(fmaxf(__fdiv_rn(to_f32(x[i]), s), p.qmin), p.qmax);
    if (p.out_dtype == DType::kInt8) {
      static_cast<int8_t*>(p.q)[base + i] = static_cast<int8_t>(__float2int_rz(v));
    } else if (p.out_dtype == DType::kFloat8E4M3FN) {
      static_cast<uint8_t*>(p.q)[base + i] =
          static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
    } else {
      static_cast<uint8_t*>(p.q)[base + i] =
          static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2));
    }
  }
}

}  // namespace

void per_token_group_quant_8bit(const GroupQuant8Params& p, void* stream) {
  if (p.scales_padded_total > 0) {  // the TMA padding rows: defined bytes (zeros)
    FLASHINFER_CUDA_CALL(
        "per_token_group_quant_8bit",
        cudaMemsetAsync(p.scales, 0, static_cast<size_t>(p.scales_padded_total) * sizeof(float),
                        static_cast<cudaStream_t>(stream)));
  }
  const int64_t groups = p.rows * (p.k / p.group_size);
  if (groups == 0) return;
  const int64_t blocks = (groups + kWarpsPerBlock - 1) / kWarpsPerBlock;
  FLASHINFER_CHECK_CODE(blocks <= 0x7FFFFFFF, ErrorCode::kUnsupported, "per_token_group_quant_8bit",
                        "x", "too many groups");
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "per_token_group_quant_8bit", "x", [&]<class T>() {
        launch_kernel("per_token_group_quant_8bit", group_quant_kernel<T>,
                      dim3(static_cast<unsigned>(blocks)), dim3(kWarpsPerBlock * 32), 0,
                      static_cast<cudaStream_t>(stream), false, p);
      });
}

}  // namespace flashinfer::kernels::cuda
