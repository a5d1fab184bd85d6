// CUDA kernels for the state merges (merge_state, merge_state_in_place, merge_states) and the
// paged-cache append. Both are memory-bound copies with light math.
#include "kernels/cuda/attention_cuda_common.cuh"
#include "kernels/cuda/cascade_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

// Block per (row, head); threads stride over head_dim. Two passes over the states: the max of
// the LSEs, then the weighted sum (weights 2^(s - max), -inf states weigh 0).
template <class T>
__global__ void merge_states_kernel(MergeParams p) {
  const int64_t n = blockIdx.x, h = blockIdx.y;
  if (p.mask && !p.mask[n]) return;
  auto state_s = [&](int64_t k) {
    if (k == 1 && p.s_b) return p.s_b[n * p.sb_stride_n + h * p.sb_stride_h];
    return p.s[n * p.s_stride_n + k * p.s_stride_k + h * p.s_stride_h];
  };
  auto state_v = [&](int64_t k) {
    if (k == 1 && p.v_b)
      return static_cast<const T*>(p.v_b) + n * p.vb_stride_n + h * p.vb_stride_h;
    return static_cast<const T*>(p.v) + n * p.v_stride_n + k * p.v_stride_k + h * p.v_stride_h;
  };
  float s_max = -INFINITY;
  for (int64_t k = 0; k < p.num_states; ++k) s_max = fmaxf(s_max, state_s(k));
  float wsum = 0.0f;
  if (s_max != -INFINITY) {
    for (int64_t k = 0; k < p.num_states; ++k) wsum += exp2f(state_s(k) - s_max);
  }
  // In place (v_out == v): every thread reads its own dims before writing them.
  T* out = static_cast<T*>(p.v_out) + n * p.vo_stride_n + h * p.vo_stride_h;
  for (int64_t d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
    float acc = 0.0f;
    if (wsum > 0.0f) {
      for (int64_t k = 0; k < p.num_states; ++k) {
        const float wk = exp2f(state_s(k) - s_max);
        if (wk > 0.0f) acc += wk * to_f32(state_v(k)[d]);
      }
      acc /= wsum;
    }
    out[d] = from_f32<T>(acc);
  }
  __syncthreads();  // all reads of s done before thread 0 overwrites it (in place)
  if (threadIdx.x == 0) {
    p.s_out[n * p.so_stride_n + h * p.so_stride_h] = wsum > 0.0f ? s_max + log2f(wsum) : -INFINITY;
  }
}

// Block per appended row; threads copy (head, dim) elements of K and V.
template <class T>
__global__ void append_kernel(AppendParams p) {
  const int64_t i = blockIdx.x;
  const int32_t b = p.batch_indices[i];
  const int64_t t = p.positions[i];
  const int64_t ko = kv_offset(p.cache, b, t, false), vo = kv_offset(p.cache, b, t, true);
  const T* ak = static_cast<const T*>(p.append_key) + i * p.ak_stride_n;
  const T* av = static_cast<const T*>(p.append_value) + i * p.av_stride_n;
  T* ck = static_cast<T*>(p.k_out) + ko;
  T* cv = static_cast<T*>(p.v_out) + vo;
  for (int64_t e = threadIdx.x; e < p.num_heads * p.head_dim; e += blockDim.x) {
    const int64_t h = e / p.head_dim, d = e % p.head_dim;
    ck[h * p.cache.k_stride_head + d] = ak[h * p.ak_stride_h + d];
    cv[h * p.cache.v_stride_head + d] = av[h * p.av_stride_h + d];
  }
}

}  // namespace

void merge_states(const MergeParams& p, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(p.seq), static_cast<unsigned>(p.num_heads));
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.v_dtype, "merge_states", "v",
      [&]<class T>() { merge_states_kernel<T><<<grid, 128, 0, s>>>(p); });
  FLASHINFER_CUDA_CALL("merge_states", cudaGetLastError());
}

void append_paged_kv_cache(const AppendParams& p, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(p.nnz));
  // Copies are dtype-agnostic: move elements of the right width.
  switch (p.elem_size) {
    case 1:
      append_kernel<uint8_t><<<grid, 256, 0, s>>>(p);
      break;
    case 2:
      append_kernel<uint16_t><<<grid, 256, 0, s>>>(p);
      break;
    case 4:
      append_kernel<uint32_t><<<grid, 256, 0, s>>>(p);
      break;
    default:
      FLASHINFER_FAIL(ErrorCode::kUnsupported, "append_paged_kv_cache", "paged_kv_cache",
                      "element size ", p.elem_size, " is not supported on CUDA");
  }
  FLASHINFER_CUDA_CALL("append_paged_kv_cache", cudaGetLastError());
}

}  // namespace flashinfer::kernels::cuda
