#include "flashinfer/float_formats.h"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/dit_norm_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kDitThreads = 64;

__device__ __forceinline__ float bias(const float* p, int64_t c) { return p ? p[c] : 0.0f; }

// The gated residual of column c, as the CPU computes it (v is recomputed in the last pass
// instead of kept: the same operations give the same bits).
__device__ __forceinline__ float residual_value(const DitNormParams& p, bool gated,
                                                const uint16_t* g, int64_t off, int64_t c) {
  const float x = bfloat16_bits_to_float(p.input[off + c]);
  const float res = p.residual ? bfloat16_bits_to_float(p.residual[off + c]) : 0.0f;
  if (gated) {
    float gv = __fadd_rn(bfloat16_bits_to_float(g[c]), bias(p.gate_bias, c));
    if (p.has_input_scale) gv = __fmul_rn(gv, p.input_scale);
    return __fmaf_rn(x, gv, res);
  }
  return p.has_input_scale ? __fmaf_rn(x, p.input_scale, res) : __fadd_rn(x, res);
}

__global__ void dit_layernorm_kernel(DitNormParams p) {
  const int64_t br = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (br >= p.batch * p.rows) return;
  const bool gated = p.mode != DitNormMode::kResidualScaleShift;
  const bool scale_shift = p.mode != DitNormMode::kGammaBeta;
  const float inv_h = __fdiv_rn(1.0f, static_cast<float>(p.hidden));
  const int64_t b = br / p.rows, r = br % p.rows;
  const int64_t off = br * p.hidden;
  const uint16_t* g = gated ? p.gate + b * p.gate_stride_b + r * p.gate_stride_r : nullptr;
  float sum = 0.0f, sum_sq = 0.0f;
  for (int64_t c = 0; c < p.hidden; ++c) {
    const float v = residual_value(p, gated, g, off, c);
    p.residual_out[off + c] = float_to_bfloat16_bits(v);
    sum = __fadd_rn(sum, v);
    sum_sq = __fmaf_rn(v, v, sum_sq);
  }
  const float mean = __fmul_rn(sum, inv_h);
  const float mean_sq = __fmul_rn(sum_sq, inv_h);
  const float var = __fmaf_rn(-mean, mean, mean_sq);
  const float inv_std = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(fmaxf(0.0f, var), p.eps)));
  const uint16_t* sc =
      scale_shift ? p.scale + b * p.scale_stride_b + r * p.scale_stride_r : nullptr;
  const uint16_t* sh =
      scale_shift ? p.shift + b * p.shift_stride_b + r * p.shift_stride_r : nullptr;
  for (int64_t c = 0; c < p.hidden; ++c) {
    float y = __fsub_rn(residual_value(p, gated, g, off, c), mean);
    if (p.mode == DitNormMode::kGammaBeta) {
      y = __fmaf_rn(y, __fmul_rn(inv_std, p.gamma[c]), p.beta[c]);
    } else {
      y = __fmul_rn(y, inv_std);
      y = __fmaf_rn(
          y, __fadd_rn(1.0f, __fadd_rn(bfloat16_bits_to_float(sc[c]), bias(p.scale_bias, c))),
          __fadd_rn(bfloat16_bits_to_float(sh[c]), bias(p.shift_bias, c)));
    }
    p.norm_out[off + c] = float_to_bfloat16_bits(y);
  }
}

}  // namespace

void dit_layernorm(const DitNormParams& p, void* stream) {
  const int64_t rows = p.batch * p.rows;
  if (rows == 0 || p.hidden == 0) return;
  const auto blocks = static_cast<unsigned>((rows + kDitThreads - 1) / kDitThreads);
  launch_kernel("dit_layernorm", dit_layernorm_kernel, dim3(blocks), dim3(kDitThreads), 0,
                static_cast<cudaStream_t>(stream), false, p);
}

}  // namespace flashinfer::kernels::cuda
