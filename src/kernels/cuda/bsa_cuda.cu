#include <cstdint>

#include "kernels/cuda/bsa_cuda.h"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kWarps = 4;  // query rows a block

template <class T>
__global__ void __launch_bounds__(kWarps * 32) bsa_blk64_kernel(BsaParams p) {
  pdl_wait();
  constexpr int D = 128, BLK = 64, KJ = D / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  if (r >= p.Sq) return;
  const int64_t hk = h / (p.Hq / p.Hkv), row_meta = (b * p.Hq + h) * p.NQ + r / BLK;
  int64_t n = p.nums ? p.nums[row_meta] : p.block_sparse_num;
  n = min(max(n, int64_t{0}), p.W);
  const T* qrow = static_cast<const T*>(p.q) + b * p.q_s[0] + r * p.q_s[1] + h * p.q_s[2];
  float q[KJ], o[KJ];
  FLASHINFER_UNROLL
  for (int j = 0; j < KJ; ++j) q[j] = to_f32(qrow[j * 32 + lane]), o[j] = 0.0f;
  float m = -__int_as_float(0x7f800000), l = 0.0f;
  for (int64_t slot = n - 1; slot >= 0; --slot) {
    const int64_t blk = p.index[row_meta * p.W + slot];
    if (blk < 0 || blk >= p.NK) continue;  // refused on the host for CPU tensors
    int64_t vb = BLK;
    if (!p.block_sizes) {
      if (blk == p.NK - 1) vb = p.Sk - (p.NK - 1) * BLK;
    } else {
      const int64_t at = p.block_sizes_mode == 1   ? blk
                         : p.block_sizes_mode == 2 ? b * p.NK + blk
                                                   : (b * p.Hq + h) * p.NK + blk;
      vb = min(static_cast<int64_t>(p.block_sizes[at]), int64_t{BLK});
    }
    for (int64_t t = 0; t < vb; ++t) {
      const int64_t c = blk * BLK + t;
      const bool inside = c < p.Sk;  // past Sk: a zero key and value (out-of-bounds loads)
      float part = 0.0f;
      const T* krow = static_cast<const T*>(p.k) + b * p.k_s[0] + c * p.k_s[1] + hk * p.k_s[2];
      if (inside) {
        FLASHINFER_UNROLL
        for (int j = 0; j < KJ; ++j) part += q[j] * to_f32(krow[j * 32 + lane]);
      }
      const float s = warp_reduce_sum(part) * p.scale;
      const float m_new = fmaxf(m, s);
      const float corr = m == m_new ? 1.0f : expf(m - m_new);
      const float e = expf(s - m_new);
      l = l * corr + e;
      const T* vrow = static_cast<const T*>(p.v) + b * p.v_s[0] + c * p.v_s[1] + hk * p.v_s[2];
      FLASHINFER_UNROLL
      for (int j = 0; j < KJ; ++j) {
        o[j] = o[j] * corr + (inside ? e * to_f32(vrow[j * 32 + lane]) : 0.0f);
      }
      m = m_new;
    }
  }
  const bool empty = !(l > 0.0f);
  T* orow = static_cast<T*>(p.out) + b * p.out_s[0] + r * p.out_s[1] + h * p.out_s[2];
  FLASHINFER_UNROLL
  for (int j = 0; j < KJ; ++j) orow[j * 32 + lane] = from_f32<T>(empty ? 0.0f : o[j] / l);
  if (lane == 0) {
    p.lse[b * p.lse_s[0] + h * p.lse_s[1] + r * p.lse_s[2]] =
        empty ? -__int_as_float(0x7f800000) : m + logf(l);
  }
}

}  // namespace

void bsa_attn_blk64_fwd(const BsaParams& p, void* stream, bool enable_pdl) {
  if (p.B == 0 || p.Sq == 0 || p.Hq == 0) return;
  const int64_t gx = (p.Sq + kWarps - 1) / kWarps;
  FLASHINFER_CHECK(gx <= 0x7fffffff && p.Hq <= 65535 && p.B <= 65535, "bsa_attn_sm120_blk64_fwd",
                   "q", "grid too large");
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(p.Hq),
                  static_cast<unsigned>(p.B));
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kFloat16) {
    launch_kernel("bsa_attn_sm120_blk64_fwd", bsa_blk64_kernel<__half>, grid, dim3(kWarps * 32), 0,
                  s, enable_pdl, p);
  } else {
    launch_kernel("bsa_attn_sm120_blk64_fwd", bsa_blk64_kernel<__nv_bfloat16>, grid,
                  dim3(kWarps * 32), 0, s, enable_pdl, p);
  }
}

}  // namespace flashinfer::kernels::cuda
