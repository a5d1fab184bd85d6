#include <cstdint>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/norm_fp4quant_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kNormFp4Threads = 256;

// BS (16 or 32) at compile time keeps a block's values in registers.
template <class T, int BS>
__global__ void __launch_bounds__(kNormFp4Threads) norm_fp4quant_kernel(NormFp4Params p) {
  pdl_wait();
  __shared__ float s_red[32];
  const int64_t m = blockIdx.x, H = p.H;
  const T* x = static_cast<const T*>(p.input) + m * p.in_stride;
  T* res = p.residual ? static_cast<T*>(p.residual) + m * p.res_stride : nullptr;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
    float v = to_f32(x[j]);
    if (res) {
      v += to_f32(res[j]);
      res[j] = from_f32<T>(v);
    }
    ss = fmaf(v, v, ss);
  }
  ss = block_reduce_sum(ss, s_red);  // its barriers also order the residual writes before reads
  const float rstd = 1.0f / sqrtf(ss / static_cast<float>(H) + p.eps);
  const float gs = p.global_scale ? *p.global_scale : 1.0f;
  const T* h = res ? res : x;  // the normalized value takes h as stored
  const T* w = static_cast<const T*>(p.weight);
  const int64_t nb = H / BS;
  for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) {
    float y[BS];
    FLASHINFER_UNROLL
    for (int i = 0; i < BS; ++i) {
      const int64_t j = b * BS + i;
      y[i] = (to_f32(h[j]) * rstd) * to_f32(w[j]);
      if (p.y_out) static_cast<T*>(p.y_out)[m * H + j] = from_f32<T>(y[i]);
    }
    const uint8_t code = norm_fp4_block(y, BS, gs, p.ue8m0, p.y_fp4 + m * (H / 2) + b * BS / 2);
    p.sf[sf_offset(p.sf_layout, m, b, nb)] = code;
    if (p.sf_linear) p.sf_linear[m * nb + b] = code;
  }
}

}  // namespace

void rmsnorm_fp4quant(const NormFp4Params& p, void* stream, bool enable_pdl) {
  if (p.M == 0) return;
  const char* op = p.residual ? "add_rmsnorm_fp4quant" : "rmsnorm_fp4quant";
  FLASHINFER_CHECK(p.M <= 0x7fffffff, op, "input", "too many rows: ", p.M);
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(p.M));
  const auto launch = [&](auto kernel) {
    launch_kernel(op, kernel, grid, dim3(kNormFp4Threads), 0, s, enable_pdl, p);
  };
  const bool half = p.dtype == DType::kFloat16;
  if (p.block_size == 16) {
    half ? launch(norm_fp4quant_kernel<__half, 16>)
         : launch(norm_fp4quant_kernel<__nv_bfloat16, 16>);
  } else {
    half ? launch(norm_fp4quant_kernel<__half, 32>)
         : launch(norm_fp4quant_kernel<__nv_bfloat16, 32>);
  }
}

}  // namespace flashinfer::kernels::cuda
