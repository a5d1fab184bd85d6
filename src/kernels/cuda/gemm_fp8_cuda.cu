// Block-scaled FP8 GEMM on CUDA: a straightforward shared-memory tiled kernel, one output per
// thread, one batch item per grid z. MX scales are multiplied in when an element is loaded. Each K
// block's partial sum runs over k in order, then is multiplied by the product of its two fp32
// scales and added to the accumulator (the CPU reference's per-block scaling); alpha scales the
// total. Correctness
// over speed: no tensor cores (runs on sm80, which has no fp8 MMA).
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/gemm_fp8_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kFp8Tile = 16;  // outputs per block side
constexpr int kStepK = 32;

template <class TA, class TB, class TO>
__global__ void __launch_bounds__(kFp8Tile* kFp8Tile)
    block_scaled_gemm_kernel(BlockScaledGemmParams p) {
  __shared__ float as[kFp8Tile][kStepK + 1];
  __shared__ float bs[kFp8Tile][kStepK + 1];
  pdl_wait();
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kFp8Tile + tx;
  const int64_t i0 = static_cast<int64_t>(blockIdx.y) * kFp8Tile;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kFp8Tile;
  const int64_t i = i0 + ty, j = j0 + tx;
  const int64_t bi = blockIdx.z;
  const TA* a = static_cast<const TA*>(p.a) + bi * p.a_stride_b;
  const TB* b = static_cast<const TB*>(p.b) + bi * p.b_stride_b;
  const uint8_t* a_mx = p.a_mx ? p.a_mx + bi * p.a_mx_stride_b : nullptr;
  const uint8_t* b_mx = p.b_mx ? p.b_mx + bi * p.b_mx_stride_b : nullptr;
  const int64_t kblocks = (p.k + p.gk - 1) / p.gk;
  float acc = 0.0f;
  for (int64_t kb = 0; kb < kblocks; ++kb) {
    const int64_t k0 = kb * p.gk;
    const int64_t k1 = k0 + p.gk < p.k ? k0 + p.gk : p.k;
    float part = 0.0f;
    for (int64_t kt = k0; kt < k1; kt += kStepK) {
      for (int e = tid; e < kFp8Tile * kStepK; e += kFp8Tile * kFp8Tile) {
        const int r = e / kStepK, c = e % kStepK;
        const int64_t kk = kt + c;
        const int64_t ia = i0 + r, jb = j0 + r;
        float va = 0.0f, vb = 0.0f;
        if (kk < k1 && ia < p.m) {
          va = static_cast<float>(a[ia * p.a_stride_m + kk * p.a_stride_k]);
          if (a_mx) {
            va *= mx_scale(a_mx, p.a_mx_layout, p.a_mx_stride_row, p.a_mx_stride_k, ia, kk, p.k);
          }
        }
        if (kk < k1 && jb < p.n) {
          const int64_t idx = p.b_low_latency
                                  ? (kk / 128) * p.n * 128 + low_latency_row(jb) * 128 + kk % 128
                                  : jb * p.b_stride_n + kk * p.b_stride_k;
          vb = static_cast<float>(b[idx]);
          if (b_mx) {
            vb *= mx_scale(b_mx, p.b_mx_layout, p.b_mx_stride_row, p.b_mx_stride_k, jb, kk, p.k);
          }
        }
        as[r][c] = va;
        bs[r][c] = vb;
      }
      __syncthreads();
      const int64_t steps = k1 - kt < kStepK ? k1 - kt : kStepK;
      for (int c = 0; c < steps; ++c) part += as[ty][c] * bs[tx][c];
      __syncthreads();
    }
    if (i < p.m && j < p.n) {
      const float sa =
          p.a_scale ? p.a_scale[(i / p.gm) * p.sa_stride_m + kb * p.sa_stride_k] : 1.0f;
      const float sb =
          p.b_scale ? p.b_scale[(j / p.gn) * p.sb_stride_n + kb * p.sb_stride_k] : 1.0f;
      acc += (sa * sb) * part;
    }
  }
  pdl_launch_dependents();
  if (i < p.m && j < p.n) {
    const float alpha = p.alpha ? *p.alpha : 1.0f;
    float bias = 0.0f;
    if (p.bias) {
      bias = p.bias_dtype == DType::kFloat16
                 ? __half2float(static_cast<const __half*>(p.bias)[j])
                 : __bfloat162float(static_cast<const __nv_bfloat16*>(p.bias)[j]);
    }
    static_cast<TO*>(p.out)[bi * p.out_stride_b + i * p.out_stride_m + j * p.out_stride_n] =
        from_f32<TO>(alpha * acc + bias);
  }
}

template <class TA, class TB>
void launch_out(const BlockScaledGemmParams& p, cudaStream_t stream, const char* op, bool pdl) {
  const dim3 grid(static_cast<unsigned>((p.n + kFp8Tile - 1) / kFp8Tile),
                  static_cast<unsigned>((p.m + kFp8Tile - 1) / kFp8Tile),
                  static_cast<unsigned>(p.batch));
  const dim3 block(kFp8Tile, kFp8Tile);
  dispatch_dtype<CudaElements, kBFloat16, kFloat16, kFloat32>(
      p.out_dtype, op, "out", [&]<class TO>() {
        launch_kernel(op, block_scaled_gemm_kernel<TA, TB, TO>, grid, block, 0, stream, pdl, p);
      });
}

}  // namespace

void block_scaled_gemm(const BlockScaledGemmParams& p, void* stream, const char* op, bool pdl) {
  if (p.m == 0 || p.n == 0) return;
  FLASHINFER_CHECK_CODE((p.m + kFp8Tile - 1) / kFp8Tile <= 65535, ErrorCode::kUnsupported, op, "a",
                        "m = ", p.m, " exceeds the CUDA grid's y limit (65535 tiles of 16 rows)");
  FLASHINFER_CHECK_CODE(p.batch <= 65535, ErrorCode::kUnsupported, op, "a", "batch = ", p.batch,
                        " exceeds the CUDA grid's z limit (65535)");
  const auto s = static_cast<cudaStream_t>(stream);
  // The router GEMMs: bf16 x bf16 (no scales).
  if (p.a_dtype == DType::kBFloat16 && p.b_dtype == DType::kBFloat16) {
    launch_out<__nv_bfloat16, __nv_bfloat16>(p, s, op, pdl);
    return;
  }
  // tgv_gemm_sm100 in fp16.
  if (p.a_dtype == DType::kFloat16 && p.b_dtype == DType::kFloat16) {
    launch_out<__half, __half>(p, s, op, pdl);
    return;
  }
  dispatch_dtype<CudaElements, kFloat8E4M3FN, kFloat8E5M2>(p.a_dtype, op, "a", [&]<class TA>() {
    dispatch_dtype<CudaElements, kFloat8E4M3FN, kFloat8E5M2>(
        p.b_dtype, op, "b", [&]<class TB>() { launch_out<TA, TB>(p, s, op, pdl); });
  });
}

}  // namespace flashinfer::kernels::cuda
