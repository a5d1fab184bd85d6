#include "api/trtllm_weight_shuffle.h"

#include <cstring>
#include <vector>

#include "flashinfer/error.h"
#include "flashinfer/ops/nvfp4.h"
#include "kernels/quantization_params.h"

namespace flashinfer::api {

std::pair<Tensor, Tensor> unshuffle_trtllm_weight(const Tensor& b, const Tensor& b_descale,
                                                  int64_t n, int64_t sf_cols, const char* op) {
  FLASHINFER_CHECK(n % 32 == 0, op, "b",
                   "backend \"trtllm\" takes B shuffled in blocks of 32 rows "
                   "(shuffle_matrix_a(W, 128)), so n must be a multiple of 32, got ",
                   n);
  // shuffle_matrix_a's rows, from the op itself: shuffled row i is row idx[i] of W.
  Tensor iota = Tensor::empty({n, 1}, DType::kInt32);
  for (int64_t i = 0; i < n; ++i) iota.data<int32_t>()[i] = static_cast<int32_t>(i);
  const Tensor idx = shuffle_matrix_a(iota, 128);
  std::vector<int64_t> pos(static_cast<std::size_t>(n));  // W's row j sits at shuffled row pos[j]
  for (int64_t i = 0; i < n; ++i) pos[static_cast<std::size_t>(idx.data<int32_t>()[i])] = i;
  const Tensor w_shuf = b.transpose(0, 1).contiguous();  // [n, row]
  const auto row_bytes = static_cast<std::size_t>(w_shuf.size(1)) * w_shuf.element_size();
  Tensor w = Tensor::empty(w_shuf.shape(), w_shuf.dtype());
  for (int64_t j = 0; j < n; ++j) {
    std::memcpy(static_cast<uint8_t*>(w.data_ptr()) + j * row_bytes,
                static_cast<const uint8_t*>(w_shuf.data_ptr()) + pos[j] * row_bytes, row_bytes);
  }
  using kernels::SfLayoutCode;
  Tensor sf =
      Tensor::zeros({kernels::sf_buffer_size(SfLayoutCode::k128x4, n, sf_cols)}, b_descale.dtype());
  const auto* src = static_cast<const uint8_t*>(b_descale.data_ptr());
  auto* dst = static_cast<uint8_t*>(sf.data_ptr());
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t c = 0; c < sf_cols; ++c) {
      dst[kernels::sf_offset(SfLayoutCode::k128x4, j, c, sf_cols)] =
          src[kernels::sf_offset(SfLayoutCode::k128x4, pos[j], c, sf_cols)];
    }
  }
  return {w.transpose(0, 1), sf};
}

}  // namespace flashinfer::api
