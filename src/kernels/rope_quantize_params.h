// Private: what the rope_quantize_fp8 kernels of every backend receive. Strides in elements; the
// feature axis of every tensor is contiguous (checked by the API).
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"

namespace flashinfer::kernels {

/// One of the four parts (q_rope, k_rope, q_nope, k_nope): in [nnz, heads, dim] -> out (fp8).
struct RopeQuantPart {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t in_stride_n = 0, in_stride_h = 0, out_stride_n = 0, out_stride_h = 0;
  int32_t heads = 0, dim = 0;
  float scale = 1.0f;  // quant_scale_q or quant_scale_kv
  bool rope = false;   // rotate (the rope parts) before quantizing
};

/// out = fp8_satfinite(rotate(x) * scale) for the rope parts, fp8_satfinite(x * scale) for the
/// nope parts. Rotation of token t at position p = pos[t] with c_i = cos_sin[p][i], s_i =
/// cos_sin[p][rope_dim / 2 + i], computed in fp32 as separate products and a difference/sum:
///   NeoX:        y_i = x_i c_i - x_{i+h} s_i,  y_{i+h} = x_{i+h} c_i + x_i s_i  (h = rope_dim / 2)
///   interleaved: y_2i = x_2i c_i - x_2i+1 s_i, y_2i+1 = x_2i+1 c_i + x_2i s_i.
struct RopeQuantizeParams {
  RopeQuantPart part[4];
  DType in_dtype = DType::kBFloat16, out_dtype = DType::kFloat8E4M3FN;
  int64_t nnz = 0;
  const float* cos_sin = nullptr;  // [max_pos, rope_dim]
  int64_t cos_sin_stride = 0;
  // [nnz] int32 or int64: host positions are validated on the host; on a device the kernel
  // writes NaN for the rope parts of a token outside [0, max_pos).
  const void* pos = nullptr;
  bool pos_int64 = false;
  int64_t max_pos = 0;  // rows of cos_sin
  bool interleave = false;
};

}  // namespace flashinfer::kernels
