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

// "fp4": where source bit i of the 32-bit group (bytes: row r col c, row r+8 col c, row r col
// c+4, row r+8 col c+4, little-endian) lands in the interleaved 32-bit group.
constexpr std::array<int, 32> kFp4BitDst = {6,  7,  8,  15, 22, 23, 24, 31, 3,  4,  5,
                                            12, 19, 20, 21, 28, 0,  1,  2,  9,  16, 17,
                                            18, 25, 13, 10, 11, 14, 29, 26, 27, 30};

uint32_t permute_fp4_bits(uint32_t v) {
  uint32_t out = 0;
  for (int i = 0; i < 32; ++i) out |= ((v >> i) & 1u) << kFp4BitDst[static_cast<size_t>(i)];
  return out;
}

// "fp4_fp8": magnitudes stay; the sign of nibble j moves to nibble 2j + 1 (j < 4) or
// 2(j - 4) (j >= 4).
uint32_t move_fp4_signs(uint32_t v) {
  uint32_t out = v & 0x77777777u;
  for (int j = 0; j < 8; ++j) {
    const int to = j < 4 ? 2 * j + 1 : 2 * (j - 4);
    out |= ((v >> (4 * j + 3)) & 1u) << (4 * to + 3);
  }
  return out;
}

uint16_t load16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
void store16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v & 0xFF);
  p[1] = static_cast<uint8_t>(v >> 8);
}

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
  const int64_t n = p.n, k = p.k, row_bytes = k / 2;
  const int64_t per_expert = n * row_bytes;
#pragma omp parallel for schedule(static) if (p.experts * per_expert > (1 << 16))
  for (int64_t e = 0; e < p.experts; ++e) {
    const uint8_t* src = p.in + e * per_expert;
    uint8_t* dst = p.out + e * per_expert;
    // Rows go in pairs (r, r + 8) inside each 16-row block; K in 64-element partitions.
    for (int64_t b = 0; b < n / 2; ++b) {
      const int64_t r = b / 8 * 16 + b % 8;
      for (int64_t q = 0; q < k / 64; ++q) {
        for (int64_t lane = 0; lane < 16; ++lane) {
          if (p.quant_type == Sm90QuantType::kFp4) {
            const int64_t mma = lane / 4;
            const int64_t dst_r = r + (mma % 2) * 8;
            const int64_t col = q * 32 + mma * 8 + lane % 4;
            const int64_t dcol = q * 32 + (lane / 8) * 16 + (lane % 4) * 4;
            const uint32_t raw = static_cast<uint32_t>(src[r * row_bytes + col]) |
                                 static_cast<uint32_t>(src[(r + 8) * row_bytes + col]) << 8 |
                                 static_cast<uint32_t>(src[r * row_bytes + col + 4]) << 16 |
                                 static_cast<uint32_t>(src[(r + 8) * row_bytes + col + 4]) << 24;
            const uint32_t v = permute_fp4_bits(raw);
            for (int i = 0; i < 4; ++i) {
              dst[dst_r * row_bytes + dcol + i] = static_cast<uint8_t>(v >> (8 * i));
            }
          } else {
            // 16-bit units (four 4-bit values); a row holds k / 4 of them.
            const int64_t row_units = k / 4;
            const int64_t dst_r = r + ((lane % 8) / 4) * 8;
            const int64_t col = q * 16 + lane;
            const int64_t dcol = q * 16 + (lane / 8) * 8 + (lane % 4) * 2;
            uint16_t a = load16(src + 2 * (r * row_units + col));
            uint16_t c = load16(src + 2 * ((r + 8) * row_units + col));
            if (p.quant_type == Sm90QuantType::kFp4Fp8) {
              const uint32_t v =
                  move_fp4_signs(static_cast<uint32_t>(a) | (static_cast<uint32_t>(c) << 16));
              a = static_cast<uint16_t>(v & 0xFFFF);
              c = static_cast<uint16_t>(v >> 16);
            }
            store16(dst + 2 * (dst_r * row_units + dcol), a);
            store16(dst + 2 * (dst_r * row_units + dcol + 1), c);
          }
        }
      }
    }
  }
}

void sm90_interleave_scales(const Sm90ScaleInterleaveParams& p) {
  const int64_t G = p.groups_per_k128, fm_n = p.folded_m, ms_n = p.m_slices;
  const int64_t kb_n = p.k_groups / G, rb_n = p.rows / 64, cols = ms_n * G;
  const std::size_t es = p.element_size;
  int64_t o = 0;
  for (int64_t e = 0; e < p.experts; ++e) {
    for (int64_t rb = 0; rb < rb_n; ++rb) {
      for (int64_t kb = 0; kb < kb_n; ++kb) {
        for (int64_t fm = 0; fm < fm_n; ++fm) {
          for (int64_t c = 0; c < cols; ++c, ++o) {
            const int64_t ms = c / G, g = c % G;
            const int64_t row = rb * 64 + ms * fm_n + fm;
            const int64_t i = (e * p.rows + row) * p.k_groups + kb * G + g;
            std::memcpy(p.out + static_cast<std::size_t>(o) * es,
                        p.in + static_cast<std::size_t>(i) * es, es);
          }
        }
      }
    }
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
