#include <cstdint>

#include "kernels/cuda/bsa_cuda.h"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kBsaWarps = 4;  // query rows a block

template <class T, int KJ>
__global__ void __launch_bounds__(kBsaWarps * 32) bsa_fwd_kernel(BsaParams p) {
  pdl_wait();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kBsaWarps + warp;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  if (r >= p.Sq) return;
  const int64_t hk = h / (p.Hq / p.Hkv), row_meta = bsa_meta_row(p, b, h, r);
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
    const int64_t vb = bsa_valid_keys(p, b, h, blk);
    for (int64_t t = 0; t < vb; ++t) {
      const int64_t c = blk * p.block + t;
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
  if (lane == 0 && p.lse) {
    p.lse[b * p.lse_s[0] + h * p.lse_s[1] + r * p.lse_s[2]] =
        empty ? -__int_as_float(0x7f800000) : m + logf(l);
  }
}

template <class T>
void launch_dim(const BsaParams& p, dim3 grid, cudaStream_t s, bool enable_pdl) {
  const dim3 block(kBsaWarps * 32);
  switch (p.dim) {
    case 64:
      launch_kernel(p.op, bsa_fwd_kernel<T, 2>, grid, block, 0, s, enable_pdl, p);
      break;
    case 96:
      launch_kernel(p.op, bsa_fwd_kernel<T, 3>, grid, block, 0, s, enable_pdl, p);
      break;
    case 128:
      launch_kernel(p.op, bsa_fwd_kernel<T, 4>, grid, block, 0, s, enable_pdl, p);
      break;
    default:
      FLASHINFER_CHECK(false, p.op, "q", "head_dim must be 64, 96 or 128, got ", p.dim);
  }
}

}  // namespace

void bsa_attn_fwd(const BsaParams& p, void* stream, bool enable_pdl) {
  if (p.B == 0 || p.Sq == 0 || p.Hq == 0) return;
  const int64_t gx = (p.Sq + kBsaWarps - 1) / kBsaWarps;
  FLASHINFER_CHECK(gx <= 0x7fffffff && p.Hq <= 65535 && p.B <= 65535, p.op, "q", "grid too large");
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(p.Hq),
                  static_cast<unsigned>(p.B));
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kFloat16) {
    launch_dim<__half>(p, grid, s, enable_pdl);
  } else {
    launch_dim<__nv_bfloat16>(p, grid, s, enable_pdl);
  }
}

}  // namespace flashinfer::kernels::cuda
