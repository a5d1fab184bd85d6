// grouped_mm_bf16 on CUDA: correctness first (no tensor cores, no shared tiles, since rows of one
// block may belong to different experts); each thread sums one output over k in fp32.
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/grouped_gemm_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kTile = 16;

// The group whose [m_indptr[e], m_indptr[e+1]) holds row r, or -1.
__device__ int64_t group_of(const int32_t* indptr, int64_t groups, int64_t r) {
  if (groups <= 0 || r < indptr[0] || r >= indptr[groups]) return -1;
  int64_t lo = 0, hi = groups;  // indptr[lo] <= r < indptr[hi]
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (indptr[mid] <= r) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

template <class TO>
__global__ void __launch_bounds__(kTile* kTile) grouped_mm_bf16_kernel(GroupedMmBf16CudaParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.y) * kTile + threadIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  if (i >= p.cum_m || j >= p.n) return;
  const int64_t e = group_of(p.m_indptr, p.num_groups, i);
  if (e < 0) return;
  const auto* a = static_cast<const __nv_bfloat16*>(p.a) + i * p.a_stride_m;
  const auto* b = static_cast<const __nv_bfloat16*>(p.b) + e * p.b_stride_e + j * p.b_stride_n;
  float acc = 0.0f;
  for (int64_t kk = 0; kk < p.k; ++kk) {
    acc += __bfloat162float(a[kk * p.a_stride_k]) * __bfloat162float(b[kk * p.b_stride_k]);
  }
  static_cast<TO*>(p.out)[i * p.out_stride_m + j * p.out_stride_n] = from_f32<TO>(acc);
}

}  // namespace

void grouped_mm_bf16(const GroupedMmBf16CudaParams& p, void* stream) {
  const char* op = "grouped_mm_bf16";
  if (p.cum_m == 0 || p.n == 0) return;
  FLASHINFER_CHECK_CODE((p.cum_m + kTile - 1) / kTile <= 65535, ErrorCode::kUnsupported, op, "a",
                        "cum_m = ", p.cum_m,
                        " exceeds the CUDA grid's y limit (65535 tiles of 16 rows)");
  const dim3 grid(static_cast<unsigned>((p.n + kTile - 1) / kTile),
                  static_cast<unsigned>((p.cum_m + kTile - 1) / kTile));
  const dim3 block(kTile, kTile);
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kBFloat16, kFloat16, kFloat32>(
      p.out_dtype, op, "out", [&]<class TO>() {
        launch_kernel(op, grouped_mm_bf16_kernel<TO>, grid, block, 0, s, false, p);
      });
}

}  // namespace flashinfer::kernels::cuda
