// Private: the GEMM weights prepared for trtllm-gen, turned back into plain ones for the CPU
// reference (mm_fp4 and mm_mxfp8 with backend="trtllm").
#pragma once

#include <cstdint>
#include <utility>

#include "flashinfer/tensor.h"

namespace flashinfer::api {

// backend="trtllm" takes B and its scales prepared for trtllm-gen, which swaps A and B: the weight
// W [n, row] as shuffle_matrix_a(W, 128) and its linear [n, sf_cols] scales as
// shuffle_matrix_sf_a(W_sf, 128) (the same row shuffle, then the 128x4 layout), b passed as the
// [row, n] transposed view as for the other backends (upstream's tests, vLLM's and SGLang's
// trtllm linear kernels prepare them so). Returns the un-shuffled operands: b as a [row, n] view
// of W, and W's scales as a 128x4 buffer. `b_descale` is read as the 128x4 buffer of n rows it is
// in memory, whatever view of it is passed (the caller checks its size). Host loops: the CPU
// reference only (on a GPU the backend is refused by name). n must be a multiple of 32 (the
// shuffle's block), else an Error naming `op` and "b".
std::pair<Tensor, Tensor> unshuffle_trtllm_weight(const Tensor& b, const Tensor& b_descale,
                                                  int64_t n, int64_t sf_cols, const char* op);

}  // namespace flashinfer::api
