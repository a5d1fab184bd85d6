// CUDA kernel of rope_quantize_fp8: one thread per output element, blockIdx.y the part (q_rope,
// k_rope, q_nope, k_nope). Products and sums use the _rn intrinsics so the compiler cannot fuse
// them into FMAs: the fp32 values, and so the fp8 codes, match the CPU reference bit for bit.
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/rope_quantize_cuda.h"
#include "kernels/rope_rules.h"

namespace flashinfer::kernels::cuda {
namespace {

template <class T, class F8>
__global__ void rope_quantize_kernel(RopeQuantizeParams p) {
  pdl_wait();
  const RopeQuantPart& part = p.part[blockIdx.y];
  const int64_t n = p.nnz * part.heads * part.dim;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e % part.dim, h = (e / part.dim) % part.heads, t = e / part.dim / part.heads;
    const T* x = static_cast<const T*>(part.in) + t * part.in_stride_n + h * part.in_stride_h;
    float y = to_f32(x[i]);
    if (part.rope) {
      const int64_t pos = p.pos_int64 ? static_cast<const int64_t*>(p.pos)[t]
                                      : static_cast<const int32_t*>(p.pos)[t];
      const bool pos_ok = pos >= 0 && pos < p.max_pos;  // else NaN: the host would refuse
      const float* cs = p.cos_sin + (pos_ok ? pos : 0) * p.cos_sin_stride;
      const int64_t half = part.dim / 2;
      const int64_t j = p.interleave ? i / 2 : (i < half ? i : i - half);
      const float c = cs[j], s = cs[half + j];
      float other;
      bool minus;
      if (p.interleave) {
        minus = i % 2 == 0;
        other = to_f32(x[minus ? i + 1 : i - 1]);
      } else {
        minus = i < half;
        other = to_f32(x[minus ? i + half : i - half]);
      }
      y = rope_rotate_one(y, c, minus ? -other : other, s);  // upstream's FMA form
      if (!pos_ok) y = __int_as_float(0x7fc00000);
    }
    // __nv_fp8_* from float: round to nearest even, saturating to the finite range (NaN stays).
    const F8 q(__fmul_rn(y, part.scale));
    static_cast<F8*>(part.out)[t * part.out_stride_n + h * part.out_stride_h + i] = q;
  }
}

}  // namespace

void rope_quantize(const RopeQuantizeParams& p, void* stream, bool enable_pdl) {
  int64_t most = 0;
  for (const RopeQuantPart& part : p.part) {
    most = std::max<int64_t>(most, p.nnz * part.heads * part.dim);
  }
  if (most == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((most + 255) / 256, 65535)), 4);
  cudaError_t err = cudaSuccess;
  dispatch_dtype<CudaElements, kFloat16, kBFloat16>(
      p.in_dtype, "rope_quantize_fp8", "q_rope", [&]<class T>() {
        dispatch_dtype<CudaElements, kFloat8E4M3FN, kFloat8E5M2>(
            p.out_dtype, "rope_quantize_fp8", "quantize_dtype", [&]<class F8>() {
              err = try_launch_kernel(rope_quantize_kernel<T, F8>, grid, dim3(256), 0, s,
                                      enable_pdl, p);
            });
      });
  if (err != cudaSuccess) {
    FLASHINFER_FAIL(ErrorCode::kCuda, "rope_quantize_fp8", "",
                    "kernel launch failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  }
}

}  // namespace flashinfer::kernels::cuda
