#include "kernels/cpu/quantized_allreduce_cpu.h"

#include <algorithm>

#include "kernels/quantized_allreduce_rules.h"

namespace flashinfer::kernels::cpu {

void quantized_all_reduce(const std::vector<const uint16_t*>& inputs, int64_t n, int64_t rank,
                          int64_t scale_group, int64_t block_size, uint16_t* out) {
  const auto W = static_cast<int64_t>(inputs.size());
  // Groups never straddle stripes (block_size is a multiple of scale_group), so each group is
  // quantized, summed and handed out on its own.
  std::vector<float> acc(static_cast<std::size_t>(scale_group));
#pragma omp parallel for schedule(static) firstprivate(acc)
  for (int64_t g0 = 0; g0 < n; g0 += scale_group) {
    const int64_t len = std::min(scale_group, n - g0);  // the last group's zeros add nothing
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t k = 0; k < W; ++k) {
      const uint16_t* x = inputs[static_cast<std::size_t>(k)] + g0;
      float m = 0.0f;
      for (int64_t j = 0; j < len; ++j) m = fp32_abs_max(m, bfloat16_bits_to_float(x[j]));
      const QarScales s = qar_scales(m);
      for (int64_t j = 0; j < len; ++j) {
        const uint8_t q = qar_quantize(bfloat16_bits_to_float(x[j]), s.quant);
        acc[static_cast<std::size_t>(j)] =
            qar_accumulate(acc[static_cast<std::size_t>(j)], q, s.inv);
      }
    }
    if (qar_owner(g0, block_size, W) == rank) {
      for (int64_t j = 0; j < len; ++j) {
        out[g0 + j] = qar_to_bf16(acc[static_cast<std::size_t>(j)]);
      }
      continue;
    }
    float m = 0.0f;
    for (int64_t j = 0; j < len; ++j) m = fp32_abs_max(m, acc[static_cast<std::size_t>(j)]);
    const QarScales s = qar_scales(m);
    for (int64_t j = 0; j < len; ++j) {
      out[g0 + j] = qar_dequantize(qar_quantize(acc[static_cast<std::size_t>(j)], s.quant), s.inv);
    }
  }
}

}  // namespace flashinfer::kernels::cpu
