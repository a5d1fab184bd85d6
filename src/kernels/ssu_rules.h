// Private: the scalar steps of the Mamba selective state update shared by the CPU reference and
// the CUDA kernel (plain C++ with FLASHINFER_HD, so both compile the same expressions).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "flashinfer/dtype.h"
#include "flashinfer/float_formats.h"
#include "kernels/cuda/device/host_device.h"
#include "kernels/philox.h"

namespace flashinfer::kernels::ssu {

/// Upstream's thresholded softplus: log(1 + exp(x)) for x <= 20 (inclusive), x above.
FLASHINFER_HD float softplus(float x) { return x <= 20.0f ? logf(1.0f + expf(x)) : x; }

/// The output gate: y * silu(z) = y * z * sigmoid(z).
FLASHINFER_HD float gate(float y, float z) { return y * (z * (1.0f / (1.0f + expf(-z)))); }

/// int16 state rows: the encode factor from the row's largest magnitude (1 for an all-zero row);
/// the row stores 1 / encode as its decode scale.
FLASHINFER_HD float int16_encode(float amax) { return amax == 0.0f ? 1.0f : 32767.0f / amax; }

/// One value encoded: clamped to +-32767, rounded to nearest-even.
FLASHINFER_HD int16_t int16_quantize(float s, float encode) {
  return static_cast<int16_t>(rintf(fminf(fmaxf(s * encode, -32767.0f), 32767.0f)));
}

/// States stored with a per-row decode scale: int16 (selective_state_update), int8 and
/// float8_e4m3fn (checkpointing_ssu). encode = QMAX / max|s| (1 for an all-zero row); stored
/// values are s * encode clamped to +-QMAX and rounded to nearest-even (fp8: its nearest
/// value, saturating).
FLASHINFER_HD bool is_scaled(DType d) {
  return d == DType::kInt16 || d == DType::kInt8 || d == DType::kFloat8E4M3FN;
}
FLASHINFER_HD float scaled_qmax(DType d) {
  return d == DType::kInt16 ? 32767.0f : d == DType::kInt8 ? 127.0f : 448.0f;
}
FLASHINFER_HD float scaled_encode(DType d, float amax) {
  return amax == 0.0f ? 1.0f : scaled_qmax(d) / amax;
}
FLASHINFER_HD void scaled_store(void* base, DType d, int64_t i, float s, float encode) {
  const float q = fminf(fmaxf(s * encode, -scaled_qmax(d)), scaled_qmax(d));
  if (d == DType::kInt16) {
    static_cast<int16_t*>(base)[i] = static_cast<int16_t>(rintf(q));
  } else if (d == DType::kInt8) {
    static_cast<int8_t*>(base)[i] = static_cast<int8_t>(rintf(q));
  } else {
    static_cast<uint8_t*>(base)[i] = float_to_e4m3fn_bits(q, true);
  }
}
FLASHINFER_HD float scaled_load(const void* base, DType d, int64_t i) {
  if (d == DType::kInt16) return static_cast<float>(static_cast<const int16_t*>(base)[i]);
  if (d == DType::kInt8) return static_cast<float>(static_cast<const int8_t*>(base)[i]);
  return detail::DecodeMinifloat<4, 3, detail::Specials::kFiniteNan>(
      static_cast<const uint8_t*>(base)[i]);
}

/// The 32-bit Philox word of stochastic rounding for the element pair (n & ~1) of a state row:
/// Triton's tl.randint(seed, offset, n_rounds), word 0 of counter (offset, 0, 0, 0) under key
/// (seed low, seed high), at the pair's first element's linear offset in the read slot.
FLASHINFER_HD uint32_t sr_word(int64_t seed, int rounds, uint64_t pair_offset) {
  const Philox4x32 ctr = {{static_cast<uint32_t>(pair_offset), 0u, 0u, 0u}};
  const uint64_t s = static_cast<uint64_t>(seed);
  return philox4x32_rounds(ctr, static_cast<uint32_t>(s), static_cast<uint32_t>(s >> 32), rounds)
      .v[0];
}

/// The pair's 13 random bits for element n: bits 0..12 for the even one, 16..28 for the odd one.
FLASHINFER_HD uint32_t sr_bits(uint32_t word, int64_t n) {
  return (n & 1) ? (word >> 16) & 0x1FFFu : word & 0x1FFFu;
}

/// fp32 to fp16 bits, rounded stochastically: the 13 random bits are added below the kept
/// mantissa, which is then truncated. Results that fall below fp16's normal range flush to a
/// signed zero, overflow gives infinity, NaN the canonical 0x7E00.
FLASHINFER_HD uint16_t f16_stochastic_bits(float x, uint32_t rand13) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t m = u & 0x7FFFFFFFu;
  if ((m >> 23) == 0xFFu) return (m & 0x7FFFFFu) ? 0x7E00u : static_cast<uint16_t>(sign | 0x7C00u);
  m += rand13;
  const uint32_t e = m >> 23;
  if (e > 142u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (e < 113u) return sign;
  return static_cast<uint16_t>(sign | ((e - 112u) << 10) | ((m >> 13) & 0x3FFu));
}

/// Index tensors are int32 or int64.
FLASHINFER_HD int64_t load_index(const void* p, bool i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

}  // namespace flashinfer::kernels::ssu
