// Private: the GEMM kernels' parameter block for views A [batch?, m, k], B [batch?, k, n] and
// out [batch?, m, n] (any strides; batch 1 for 2-D operands). Used by the gemm ops and by the
// tests that drive the CPU kernel's paths directly.
#pragma once

#include "flashinfer/tensor.h"
#include "kernels/gemm_params.h"

namespace flashinfer::api {

inline kernels::GemmParams gemm_params(const Tensor& A, const Tensor& B, const Tensor& out) {
  kernels::GemmParams p;
  const bool batched = A.dim() == 3;
  p.a = A.data_ptr();
  p.a_dtype = A.dtype();
  p.a_stride_b = batched ? A.stride(0) : 0;
  p.a_stride_m = A.stride(-2);
  p.a_stride_k = A.stride(-1);
  p.b = B.data_ptr();
  p.b_dtype = B.dtype();
  p.b_stride_b = batched ? B.stride(0) : 0;
  p.b_stride_k = B.stride(-2);
  p.b_stride_n = B.stride(-1);
  p.out = out.data_ptr();
  p.out_dtype = out.dtype();
  p.out_stride_b = batched ? out.stride(0) : 0;
  p.out_stride_m = out.stride(-2);
  p.out_stride_n = out.stride(-1);
  p.batch = batched ? A.size(0) : 1;
  p.m = A.size(-2);
  p.n = B.size(-1);
  p.k = A.size(-1);
  return p;
}

}  // namespace flashinfer::api
