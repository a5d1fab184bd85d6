// Private: the fields the FP4 and MXFP8 quantizers' parameter blocks share, for an input view
// x [m, k] (any strides), the packed output q and the scale buffer sf (contiguous bytes, its
// whole size). Used by the quantization ops and by the tests that drive the CPU kernels per
// instruction set; the caller sets the format's own fields.
#pragma once

#include <cstdint>

#include "flashinfer/tensor.h"
#include "kernels/quantization_params.h"

namespace flashinfer::api {

template <class Params>
Params quantize_params(const Tensor& x, const Tensor& q, const Tensor& sf,
                       kernels::SfLayoutCode layout) {
  Params p;
  p.input = x.data_ptr();
  p.in_dtype = x.dtype();
  p.m = x.size(0);
  p.k = x.size(1);
  p.in_stride_m = x.stride(0);
  p.in_stride_k = x.stride(1);
  p.out = static_cast<uint8_t*>(q.data_ptr());
  p.sf = static_cast<uint8_t*>(sf.data_ptr());
  p.sf_size = sf.numel();
  p.layout = layout;
  return p;
}

}  // namespace flashinfer::api
