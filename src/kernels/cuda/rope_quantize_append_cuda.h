// CUDA scatter of rope_quantize_fp8_append_paged_kv_cache: the quantized keys (and, for GQA/MHA,
// the values, quantized here) written into their page slots. Plain C++ header: callable from the
// API layer. Throws flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"

namespace flashinfer::kernels::cuda {

struct PagedFp8AppendParams {
  int64_t nnz = 0, heads = 0, rope = 0, nope = 0;  // heads = 1 for MLA
  bool mla = false, hnd = false;
  const uint8_t* k_rope = nullptr;  // fp8 codes [nnz, heads, rope], contiguous
  const uint8_t* k_nope = nullptr;  // fp8 codes [nnz, heads, nope], contiguous
  const void* v = nullptr;          // GQA/MHA: [nnz, heads, rope + nope] in v_dtype, contiguous
  DType v_dtype = DType::kBFloat16;
  DType fp8 = DType::kFloat8E4M3FN;  // the cache's dtype
  float v_scale = 1.0f;
  const int64_t* slots = nullptr;  // [nnz, 2]: (page, slot within the page), checked on the host
  uint8_t* cache0 = nullptr;       // k_cache (GQA/MHA) or ckv_cache (MLA)
  uint8_t* cache1 = nullptr;       // v_cache (GQA/MHA) or kpe_cache (MLA)
  int64_t stride0[4] = {}, stride1[4] = {};  // element strides of the two caches
};

/// Every pointer is device memory. V is quantized as the CPU reference does it: fp32 product
/// v * v_scale (not fused), then round-to-nearest-even, saturating to the finite fp8 range.
void paged_fp8_append(const PagedFp8AppendParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
