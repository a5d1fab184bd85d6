// The grouped CUDA GEMM of grouped_mm_bf16 and SegmentGEMMWrapper.run: correctness first (no
// tensor cores, no shared tiles, since rows of one block may belong to different groups); each
// thread sums one output over k in fp32 and rounds once.
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/grouped_gemm_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kTile = 16;

// The group whose [m_indptr[e], m_indptr[e+1]) holds row r, or -1. With empty groups (equal
// neighbours) the search ends on the last group starting at or before r, the non-empty one.
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

template <class TI, class TO>
__global__ void __launch_bounds__(kTile* kTile) grouped_mm_kernel(GroupedMmCudaParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.y) * kTile + threadIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  if (i >= p.cum_m || j >= p.n) return;
  const int64_t g = group_of(p.m_indptr, p.num_groups, i);
  if (g < 0) return;
  const int64_t e = p.b_index != nullptr ? p.b_index[g] : g;
  const auto* a = static_cast<const TI*>(p.a) + i * p.a_stride_m;
  const auto* b = static_cast<const TI*>(p.b) + e * p.b_stride_e + j * p.b_stride_n;
  float acc = 0.0f;
  for (int64_t kk = 0; kk < p.k; ++kk) {
    acc += to_f32(a[kk * p.a_stride_k]) * to_f32(b[kk * p.b_stride_k]);
  }
  static_cast<TO*>(p.out)[i * p.out_stride_m + j * p.out_stride_n] = from_f32<TO>(acc);
}

void launch_grouped(const GroupedMmCudaParams& p, void* stream, const char* op, const char* arg) {
  if (p.cum_m == 0 || p.n == 0 || p.num_groups == 0) return;
  FLASHINFER_CHECK_CODE((p.cum_m + kTile - 1) / kTile <= 65535, ErrorCode::kUnsupported, op, arg,
                        "cum_m = ", p.cum_m,
                        " exceeds the CUDA grid's y limit (65535 tiles of 16 rows)");
  const dim3 grid(static_cast<unsigned>((p.n + kTile - 1) / kTile),
                  static_cast<unsigned>((p.cum_m + kTile - 1) / kTile));
  const dim3 block(kTile, kTile);
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kBFloat16, kFloat16, kFloat8E4M3FN, kFloat8E5M2>(
      p.in_dtype, op, arg, [&]<class TI>() {
        dispatch_dtype<CudaElements, kBFloat16, kFloat16, kFloat32>(
            p.out_dtype, op, "out", [&]<class TO>() {
              launch_kernel(op, grouped_mm_kernel<TI, TO>, grid, block, 0, s, false, p);
            });
      });
}

}  // namespace

void grouped_mm_bf16(const GroupedMmCudaParams& p, void* stream) {
  launch_grouped(p, stream, "grouped_mm_bf16", "a");
}

void segment_gemm(const GroupedMmCudaParams& p, void* stream) {
  launch_grouped(p, stream, "SegmentGEMMWrapper.run", "x");
}

}  // namespace flashinfer::kernels::cuda
