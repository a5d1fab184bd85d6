// CPU layout transforms of the SM90 mixed-input MoE weight preparation. The index maps and bit
// moves are upstream's (csrc moe_gemm_mixed_utils.cu, flashinfer/fused_moe/prepare.py), written
// out here as tables and loops over destination positions; docs/MOE.md lists them.
#include "kernels/cpu/moe_weight_prep_cpu.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "kernels/moe_weight_prep_rules.h"

namespace flashinfer::kernels::cpu {

namespace {

float float_from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t bits_from_float(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

}  // namespace

void sm90_interleave_weights(const Sm90WeightInterleaveParams& p) {
  const int64_t per_expert = p.n * (p.k / 2);
#pragma omp parallel for schedule(static) if (p.experts * per_expert > (1 << 16))
  for (int64_t e = 0; e < p.experts; ++e) {
    for (int64_t b = 0; b < p.n / 2; ++b) {
      for (int64_t q = 0; q < p.k / 64; ++q) {
        for (int64_t lane = 0; lane < 16; ++lane) sm90_interleave_weight_unit(p, e, b, q, lane);
      }
    }
  }
}

void sm90_interleave_scales(const Sm90ScaleInterleaveParams& p) {
  const std::size_t es = p.element_size;
  const int64_t total = sm90_interleave_scale_count(p);
  for (int64_t o = 0; o < total; ++o) {
    const int64_t i = sm90_interleave_scale_source(p, o);
    std::memcpy(p.out + static_cast<std::size_t>(o) * es, p.in + static_cast<std::size_t>(i) * es,
                es);
  }
}

uint8_t humming_rewrite_code(int delta, int code) {
  const int normalized = code == 8 ? 0 : code;
  if (delta == 0) return static_cast<uint8_t>(normalized);
  // Python float (double) arithmetic on fp32 bit patterns, as upstream's table builder does:
  // the FP4 code as the fp32 pattern sign << 31 | (e, m) << 22, times 2^-delta as the fp32
  // pattern 0x3F800000 - (delta << 23) (wrapping), then rounded to the nearest 3-bit (e, m),
  // ties up.
  const double scale = float_from_bits(0x3F800000u - (static_cast<uint32_t>(delta) << 23));
  const double deq = float_from_bits(((static_cast<uint32_t>(normalized) & 8u) << 28) |
                                     ((static_cast<uint32_t>(normalized) & 7u) << 22));
  const double value = deq * scale;
  // Delta 128 makes the scale -inf, and code 0 times it NaN: written as the x86 default NaN
  // (sign set), the NaN upstream's Python builder gets on x86, on every host.
  const uint32_t vb = value != value ? 0xFFC00000u : bits_from_float(static_cast<float>(value));
  const uint32_t mask = 0x81C00000u;
  const uint32_t rz = vb & mask, ru = (vb + 0x00200000u) & mask;
  const double rz_v = float_from_bits(rz), ru_v = float_from_bits(ru);
  const uint32_t rounded = std::fabs(value - rz_v) >= std::fabs(value - ru_v) ? ru : rz;
  return static_cast<uint8_t>(((rounded & 0x80000000u) >> 28) | ((rounded & 0x01C00000u) >> 22));
}

const uint8_t* humming_rewrite_table() {
  static const auto table = [] {
    std::array<uint8_t, kHummingTableBytes> t{};
    for (int d = 0; d < kHummingTableRows; ++d) {
      for (int c = 0; c < 16; ++c) {
        t[static_cast<size_t>(d * 16 + c)] = humming_rewrite_code(d, c);
      }
    }
    return t;
  }();
  return table.data();
}

void humming_prepare(const HummingPrepParams& p) {
  const uint8_t* table = humming_rewrite_table();
  const int64_t kg = p.k / 32, scales_per_expert = p.rows * kg, row_bytes = p.k / 2;
  for (int64_t e = 0; e < p.experts; ++e) {
    const uint8_t* s = p.raw_scale + e * scales_per_expert;
    const uint8_t hi = *std::max_element(s, s + scales_per_expert);
    const uint8_t lo = *std::min_element(s, s + scales_per_expert);
    const int lo_new = humming_low(hi, lo, static_cast<int>(p.max_range));
    for (int64_t i = 0; i < scales_per_expert; ++i) {
      p.offset_out[e * scales_per_expert + i] = humming_offset(s[i], lo_new);
    }
    p.residual[e] = humming_residual(lo_new);
    for (int64_t r = 0; r < p.rows; ++r) {
      for (int64_t byte = 0; byte < row_bytes; ++byte) {
        const int64_t i = (e * p.rows + r) * row_bytes + byte;
        // Both nibbles of a byte lie in one 32-element scale block.
        const int delta = humming_delta(s[r * kg + byte * 2 / 32], lo_new);
        p.weight_out[i] = humming_rewrite_byte(table + delta * 16, p.weight[i]);
      }
    }
  }
}

}  // namespace flashinfer::kernels::cpu
