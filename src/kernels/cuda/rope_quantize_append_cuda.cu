// rope_quantize_fp8_append_paged_kv_cache's scatter: one thread per cache byte written, a
// grid-stride loop over (token, head, element). The keys arrive quantized by rope_quantize_fp8's
// kernel; V is quantized here with that kernel's rule, so every byte equals the CPU reference's.
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/rope_quantize_append_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

template <class T, class F8>
__global__ void paged_fp8_append_kernel(PagedFp8AppendParams p) {
  pdl_wait();
  const int64_t width = p.rope + p.nope, n = p.nnz * p.heads * width;
  for (int64_t x = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < n;
       x += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = x % width, h = (x / width) % p.heads, i = x / width / p.heads;
    const int64_t page = p.slots[2 * i], s = p.slots[2 * i + 1];
    if (page < 0) continue;  // a padding token (negative batch index): nothing written
    const int64_t row = i * p.heads + h;
    if (p.mla) {
      // ckv_cache [pages, page_size, nope] takes k_nope, kpe_cache [pages, page_size, rope] k_rope.
      if (e < p.nope) {
        p.cache0[page * p.stride0[0] + s * p.stride0[1] + e] = p.k_nope[i * p.nope + e];
      } else {
        p.cache1[page * p.stride1[0] + s * p.stride1[1] + (e - p.nope)] =
            p.k_rope[i * p.rope + (e - p.nope)];
      }
      continue;
    }
    // [pages, heads, page_size, D] (HND) or [pages, page_size, heads, D] (NHD), D = rope + nope.
    const int64_t off0 = page * p.stride0[0] + (p.hnd ? h * p.stride0[1] + s * p.stride0[2]
                                                      : s * p.stride0[1] + h * p.stride0[2]);
    const int64_t off1 = page * p.stride1[0] + (p.hnd ? h * p.stride1[1] + s * p.stride1[2]
                                                      : s * p.stride1[1] + h * p.stride1[2]);
    p.cache0[off0 + e] =
        e < p.rope ? p.k_rope[row * p.rope + e] : p.k_nope[row * p.nope + e - p.rope];
    const F8 q(__fmul_rn(to_f32(static_cast<const T*>(p.v)[row * width + e]), p.v_scale));
    p.cache1[off1 + e] = *reinterpret_cast<const uint8_t*>(&q);
  }
}

}  // namespace

void paged_fp8_append(const PagedFp8AppendParams& p, void* stream, bool enable_pdl) {
  const int64_t n = p.nnz * p.heads * (p.rope + p.nope);
  if (n == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535)));
  const char* op = "rope_quantize_fp8_append_paged_kv_cache";
  dispatch_dtype<CudaElements, kFloat16, kBFloat16>(p.v_dtype, op, "v", [&]<class T>() {
    dispatch_dtype<CudaElements, kFloat8E4M3FN, kFloat8E5M2>(
        p.fp8, op, "quantize_dtype", [&]<class F8>() {
          launch_kernel(op, paged_fp8_append_kernel<T, F8>, grid, dim3(256), 0, s, enable_pdl, p);
        });
  });
}

}  // namespace flashinfer::kernels::cuda
