// CPU BGMV over MoE pairs: fp32 dot products of fp16/bf16 operands, the shrink result rounded
// into y's dtype after adding to it (y +=), the expand accumulated in fp32 in pair order.
#include "kernels/cpu/moe_lora_cpu.h"

#include <cstddef>

#include "flashinfer/float_formats.h"

namespace flashinfer::kernels::cpu {

namespace {

float load16(DType dt, const void* base, int64_t i) {
  const uint16_t b = static_cast<const uint16_t*>(base)[i];
  return dt == DType::kBFloat16 ? bfloat16_bits_to_float(b) : half_bits_to_float(b);
}
void store16(DType dt, void* base, int64_t i, float v) {
  static_cast<uint16_t*>(base)[i] =
      dt == DType::kBFloat16 ? float_to_bfloat16_bits(v) : float_to_half_bits(v);
}

}  // namespace

void bgmv_moe_shrink(const BgmvMoeParams& p) {
  const int64_t P = p.num_pairs, R = p.rank, F = p.feat;
  // Each (slice, pair) owns its output row, so pairs run in parallel.
#pragma omp parallel for collapse(2) schedule(static) if (p.num_slices * P * R * F > (1 << 16))
  for (int64_t s = 0; s < p.num_slices; ++s) {
    for (int64_t q = 0; q < P; ++q) {
      const void* w = p.weight[static_cast<std::size_t>(s * P + q)];
      if (p.lora[static_cast<std::size_t>(q)] < 0 || w == nullptr) continue;
      const int64_t row = p.per_pair_input ? q : p.token[static_cast<std::size_t>(q)];
      for (int64_t r = 0; r < R; ++r) {
        float acc = 0.0f;
        for (int64_t c = 0; c < F; ++c) {
          acc += load16(p.dtype, p.x, row * F + c) * load16(p.dtype, w, r * F + c);
        }
        const int64_t o = (s * P + q) * R + r;
        store16(p.dtype, p.y, o, load16(p.dtype, p.y, o) + acc);
      }
    }
  }
}

void bgmv_moe_expand(const BgmvMoeParams& p) {
  const int64_t P = p.num_pairs, R = p.rank, F = p.feat;
  auto* y = static_cast<float*>(p.y);
  // finalize: several pairs add into one token row, so pairs stay in order (slices and output
  // columns are independent).
#pragma omp parallel for collapse(2) schedule(static) if (p.num_slices * P * R * F > (1 << 16))
  for (int64_t s = 0; s < p.num_slices; ++s) {
    for (int64_t j = 0; j < F; ++j) {
      const int64_t col = p.slice_start[static_cast<std::size_t>(s)] + j;
      for (int64_t q = 0; q < P; ++q) {
        const void* w = p.weight[static_cast<std::size_t>(s * P + q)];
        if (p.lora[static_cast<std::size_t>(q)] < 0 || w == nullptr) continue;
        float acc = 0.0f;
        for (int64_t r = 0; r < R; ++r) {
          acc += load16(p.dtype, p.x, (s * P + q) * R + r) * load16(p.dtype, w, j * R + r);
        }
        if (p.finalize) {
          y[p.token[static_cast<std::size_t>(q)] * p.y_cols + col] += p.topk_weights[q] * acc;
        } else {
          y[q * p.y_cols + col] = acc;
        }
      }
    }
  }
}

}  // namespace flashinfer::kernels::cpu
