// Bit-exact conversions between float32 and the reduced-precision formats used by
// flashinfer-cpp: IEEE binary16 (half), bfloat16, OCP FP8 E4M3FN / E5M2 and FP4 E2M1.
//
// Plain C++20, header-only, no CUDA dependency. Every conversion is constexpr and written with
// selects instead of data-dependent branches so that CPU kernel loops stay branch-free and can be
// auto-vectorised.
//
// Rounding is always round-to-nearest-even (RNE), evaluated as if the target exponent range were
// unbounded; the result is then mapped to the format's overflow rule. Default (non-saturating)
// semantics follow PyTorch's `tensor.to(dtype)`:
//
//   format     | finite overflow (non-sat)      | +-inf in         | NaN in         | saturating
//   -----------+--------------------------------+------------------+----------------+------------
//   half       | |x| >= 65520 -> +-inf           | +-inf            | 0x7E00 | sign  | n/a
//   bfloat16   | RNE carries into +-inf          | +-inf            | 0x7FC0 | sign  | n/a
//   e4m3fn     | |x| >  464   -> NaN (0x7F|sign) | NaN (0x7F|sign)  | 0x7F | sign    | +-448
//   e5m2       | |x| >= 61440 -> +-inf           | +-inf            | 0x7F | sign    | +-57344
//   e2m1 (fp4) | always saturates to +-6        | +-6              | +6 (0x7)       | always
//
// Notes on the choices (verified against PyTorch's c10 conversion logic and against the host
// implementations in CUDA 13.0's cuda_fp16/bf16/fp8/fp4 headers):
//  * E4M3FN threshold: 448 = 1.75 * 2^8 is the largest finite value; the next grid point, 480, is
//    the NaN code S.1111.111. c10 sends every |x| >= 480 to NaN and otherwise rounds RNE, where
//    (464, 480) rounds up onto the NaN code and exactly 464 ties to the even mantissa (448). So
//    464 -> 448 and anything above 464 -> NaN. CUDA's __NV_NOSAT gives the same finite results.
//  * NaN sign: c10 keeps the input sign for half/fp8 NaN but returns 0x7FC0 for every bfloat16
//    NaN; CUDA returns an unsigned canonical NaN (0x7FFF for half/bf16, 0x7F for fp8). We always
//    return a canonical quiet NaN carrying the input sign. All of these are NaN either way.
//  * Saturation (CUDA __NV_SATFINITE): finite overflow and +-inf clamp to +-max finite for both
//    fp8 formats (CUDA does saturate inf for E5M2 too); NaN stays NaN.
//  * FP4 has no inf/NaN encodings. CUDA's cvt (cudaRoundNearest) saturates to +-6 and maps any NaN
//    (either sign) to +6 (code 0x7); we do the same.
//  * Decoding NaN codes yields a quiet float NaN with the code's sign; bfloat16 decoding is the
//    exact 16-bit shift (as in torch and CUDA), so a signalling bfloat16 NaN stays signalling.
#ifndef FLASHINFER_FLOAT_FORMATS_H_
#define FLASHINFER_FLOAT_FORMATS_H_

#include <array>
#include <bit>
#include <cstdint>
#include <type_traits>

namespace flashinfer {
namespace detail {

inline constexpr uint32_t kF32SignMask = 0x80000000u;
inline constexpr uint32_t kF32AbsMask = 0x7FFFFFFFu;
inline constexpr uint32_t kF32InfBits = 0x7F800000u;
inline constexpr uint32_t kF32QuietBit = 0x00400000u;

constexpr uint32_t F32Bits(float x) { return std::bit_cast<uint32_t>(x); }
constexpr float F32FromBits(uint32_t b) { return std::bit_cast<float>(b); }

// Rounds a non-negative finite float (given as its bits) to the magnitude code of a binary
// format with kExpBits exponent bits, kManBits mantissa bits and IEEE-style bias, using RNE with
// an unbounded exponent range. Values that round past the largest exponent simply produce codes
// in the all-ones exponent field (or beyond); callers clamp the input and fix up overflow.
// Requires abs_bits < 2^(emax + 2) so the result fits the code width plus one.
template <int kExpBits, int kManBits>
constexpr uint32_t RoundMagnitudeRne(uint32_t abs_bits) {
  static_assert(kExpBits >= 2 && kExpBits <= 8 && kManBits >= 1 && kManBits <= 10);
  constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  constexpr int kShift = 23 - kManBits;
  // Smallest normal of the target format, 2^(1 - bias).
  constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(128 - kBias) << 23;
  // Subnormal targets: adding 2^(24 - bias - man) makes the FPU round |x| to a multiple of the
  // target's subnormal step (the float ulp at that magnitude), i.e. the FPU performs the RNE.
  // The integer difference of the bit patterns is then exactly the subnormal code (2^man means
  // it rounded up to the smallest normal, which is also the right code).
  constexpr uint32_t kMagicBits = static_cast<uint32_t>(151 - kBias - kManBits) << 23;
  const uint32_t sub = F32Bits(F32FromBits(abs_bits) + F32FromBits(kMagicBits)) - kMagicBits;
  // Normal targets: rebias the exponent, then add half an ulp minus one plus the lsb that
  // survives the shift (ties to even), and truncate. A carry out of the mantissa correctly bumps
  // the exponent. Unsigned wrap-around in the rebias is intentional.
  const uint32_t odd = (abs_bits >> kShift) & 1u;
  const uint32_t normal =
      (abs_bits + (static_cast<uint32_t>(kBias - 127) << 23) + ((1u << (kShift - 1)) - 1u) + odd) >>
      kShift;
  return abs_bits < kMinNormalBits ? sub : normal;
}

enum class Specials {
  kIeee,       // all-ones exponent: mantissa 0 = inf, otherwise NaN (half, e5m2)
  kFiniteNan,  // only the all-ones code S.1111.111 is NaN, no inf (e4m3fn)
  kNone,       // every code is finite (e2m1)
};

// Decodes a code of a small binary format to float exactly.
template <int kExpBits, int kManBits, Specials kSpecials>
constexpr float DecodeMinifloat(uint32_t code) {
  constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  constexpr int kShift = 23 - kManBits;
  constexpr int kWidth = 1 + kExpBits + kManBits;
  constexpr uint32_t kMagMask = (1u << (kWidth - 1)) - 1u;
  constexpr uint32_t kExpMask = ((1u << kExpBits) - 1u) << kManBits;
  constexpr uint32_t kManMask = (1u << kManBits) - 1u;
  const uint32_t sign = (code << (32 - kWidth)) & kF32SignMask;
  const uint32_t mag = code & kMagMask;
  const uint32_t shifted = mag << kShift;
  const uint32_t exp = mag & kExpMask;
  const uint32_t normal = shifted + (static_cast<uint32_t>(127 - kBias) << 23);
  // Subnormal m * 2^(1 - bias - man): place m in the mantissa of 2^(1 - bias) and subtract it.
  constexpr uint32_t kMagicBits = static_cast<uint32_t>(128 - kBias) << 23;
  const uint32_t sub = F32Bits(F32FromBits(shifted + kMagicBits) - F32FromBits(kMagicBits));
  uint32_t out = exp == 0 ? sub : normal;
  if constexpr (kSpecials == Specials::kIeee) {
    const uint32_t special = kF32InfBits | shifted | ((mag & kManMask) != 0 ? kF32QuietBit : 0u);
    out = exp == kExpMask ? special : out;
  } else if constexpr (kSpecials == Specials::kFiniteNan) {
    out = mag == kMagMask ? (kF32InfBits | kF32QuietBit) : out;
  }
  return F32FromBits(out | sign);
}

template <int kExpBits, int kManBits, Specials kSpecials>
constexpr std::array<float, (1u << (1 + kExpBits + kManBits))> MakeDecodeTable() {
  std::array<float, (1u << (1 + kExpBits + kManBits))> table{};
  for (uint32_t c = 0; c < table.size(); ++c) {
    table[c] = DecodeMinifloat<kExpBits, kManBits, kSpecials>(c);
  }
  return table;
}

// 8-bit and 4-bit decodes are a single L1-resident load.
inline constexpr auto kE4M3FNToFloat = MakeDecodeTable<4, 3, Specials::kFiniteNan>();
inline constexpr auto kE5M2ToFloat = MakeDecodeTable<5, 2, Specials::kIeee>();
inline constexpr auto kE2M1ToFloat = MakeDecodeTable<2, 1, Specials::kNone>();

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// IEEE binary16.

constexpr uint16_t float_to_half_bits(float x) {
  constexpr uint32_t kOverflowBits = 0x47800000u;  // 65536.0f: everything above rounds to inf
  const uint32_t bits = detail::F32Bits(x);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & detail::kF32AbsMask;
  uint32_t code = detail::RoundMagnitudeRne<5, 10>(abs < kOverflowBits ? abs : 0u);
  code = abs >= kOverflowBits ? 0x7C00u : code;  // RNE already yields inf from 65520 up
  code = abs > detail::kF32InfBits ? 0x7E00u : code;
  return static_cast<uint16_t>(code | sign);
}

constexpr float half_bits_to_float(uint16_t h) {
  return detail::DecodeMinifloat<5, 10, detail::Specials::kIeee>(h);
}

// ---------------------------------------------------------------------------------------------
// bfloat16: the top half of a float32, so RNE is a single add on the bit pattern. A carry out of
// the mantissa bumps the exponent, and 0x7F7FFFFF-ish values carry into inf as RNE requires.

constexpr uint16_t float_to_bfloat16_bits(float x) {
  const uint32_t bits = detail::F32Bits(x);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t nan = ((bits >> 16) & 0x8000u) | 0x7FC0u;
  return static_cast<uint16_t>((bits & detail::kF32AbsMask) > detail::kF32InfBits ? nan : rounded);
}

constexpr float bfloat16_bits_to_float(uint16_t b) {
  return detail::F32FromBits(static_cast<uint32_t>(b) << 16);
}

// ---------------------------------------------------------------------------------------------
// FP8 E4M3FN: bias 7, no inf, NaN = S.1111.111, max 448, min subnormal 2^-9.

constexpr uint8_t float_to_e4m3fn_bits(float x, bool saturate = false) {
  constexpr uint32_t k480Bits = 0x43F00000u;  // the NaN code's grid position
  const uint32_t bits = detail::F32Bits(x);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs = bits & detail::kF32AbsMask;
  // Below 480, RNE lands on at most 0x7F; (464, 480) lands exactly on the NaN code, which is the
  // torch behaviour, so no extra test is needed for that interval.
  uint32_t code = detail::RoundMagnitudeRne<4, 3>(abs < k480Bits ? abs : 0u);
  code = abs >= k480Bits ? 0x7Fu : code;
  const uint32_t sat = abs > detail::kF32InfBits ? 0x7Fu : (code < 0x7Eu ? code : 0x7Eu);
  return static_cast<uint8_t>((saturate ? sat : code) | sign);
}

constexpr float e4m3fn_bits_to_float(uint8_t b) { return detail::kE4M3FNToFloat[b]; }

// ---------------------------------------------------------------------------------------------
// FP8 E5M2: IEEE-like, bias 15, max 57344, inf = S.11111.00.

constexpr uint8_t float_to_e5m2_bits(float x, bool saturate = false) {
  constexpr uint32_t kOverflowBits = 0x47800000u;  // 65536.0f
  const uint32_t bits = detail::F32Bits(x);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs = bits & detail::kF32AbsMask;
  uint32_t code = detail::RoundMagnitudeRne<5, 2>(abs < kOverflowBits ? abs : 0u);
  code = abs >= kOverflowBits ? 0x7Cu : code;  // RNE already yields inf from 61440 up
  code = saturate ? (code < 0x7Bu ? code : 0x7Bu) : code;
  code = abs > detail::kF32InfBits ? 0x7Fu : code;
  return static_cast<uint8_t>(code | sign);
}

constexpr float e5m2_bits_to_float(uint8_t b) { return detail::kE5M2ToFloat[b]; }

// ---------------------------------------------------------------------------------------------
// FP4 E2M1: codes 0..15, bit 3 = sign, magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}. Always saturating.

constexpr uint8_t float_to_e2m1_bits(float x) {
  constexpr uint32_t k6Bits = 0x40C00000u;  // 6.0f
  const uint32_t bits = detail::F32Bits(x);
  const uint32_t abs = bits & detail::kF32AbsMask;
  const bool is_nan = abs > detail::kF32InfBits;
  // Clamping the bit pattern saturates finite overflow, inf and NaN in one step.
  const uint32_t code = detail::RoundMagnitudeRne<2, 1>(abs < k6Bits ? abs : k6Bits);
  const uint32_t sign = is_nan ? 0u : (bits >> 28) & 0x8u;
  return static_cast<uint8_t>(code | sign);
}

constexpr float e2m1_bits_to_float(uint8_t code) { return detail::kE2M1ToFloat[code & 0xFu]; }

// Two FP4 values per byte: element 2t in the low nibble, element 2t+1 in the high nibble.
constexpr uint8_t pack_e2m1x2(uint8_t lo_code, uint8_t hi_code) {
  return static_cast<uint8_t>((lo_code & 0xFu) | ((hi_code & 0xFu) << 4));
}
constexpr uint8_t e2m1x2_low(uint8_t packed) { return static_cast<uint8_t>(packed & 0xFu); }
constexpr uint8_t e2m1x2_high(uint8_t packed) { return static_cast<uint8_t>(packed >> 4); }

// ---------------------------------------------------------------------------------------------
// Storage types usable as CPU element types. Trivial aggregates: no implicit conversions, so a
// mix-up of element types is a compile error rather than a silent reinterpretation.

struct Half {
  uint16_t bits;
  static constexpr Half from_bits(uint16_t b) { return Half{b}; }
  static constexpr Half from_float(float x) { return Half{float_to_half_bits(x)}; }
  constexpr float to_float() const { return half_bits_to_float(bits); }
};

struct BFloat16 {
  uint16_t bits;
  static constexpr BFloat16 from_bits(uint16_t b) { return BFloat16{b}; }
  static constexpr BFloat16 from_float(float x) { return BFloat16{float_to_bfloat16_bits(x)}; }
  constexpr float to_float() const { return bfloat16_bits_to_float(bits); }
};

struct Float8E4M3FN {
  uint8_t bits;
  static constexpr Float8E4M3FN from_bits(uint8_t b) { return Float8E4M3FN{b}; }
  static constexpr Float8E4M3FN from_float(float x) {
    return Float8E4M3FN{float_to_e4m3fn_bits(x)};
  }
  constexpr float to_float() const { return e4m3fn_bits_to_float(bits); }
};

struct Float8E5M2 {
  uint8_t bits;
  static constexpr Float8E5M2 from_bits(uint8_t b) { return Float8E5M2{b}; }
  static constexpr Float8E5M2 from_float(float x) { return Float8E5M2{float_to_e5m2_bits(x)}; }
  constexpr float to_float() const { return e5m2_bits_to_float(bits); }
};

static_assert(sizeof(Half) == 2 && alignof(Half) == 2 && std::is_trivial_v<Half>);
static_assert(sizeof(BFloat16) == 2 && alignof(BFloat16) == 2 && std::is_trivial_v<BFloat16>);
static_assert(sizeof(Float8E4M3FN) == 1 && std::is_trivial_v<Float8E4M3FN>);
static_assert(sizeof(Float8E5M2) == 1 && std::is_trivial_v<Float8E5M2>);
static_assert(std::is_standard_layout_v<Half> && std::is_standard_layout_v<BFloat16> &&
              std::is_standard_layout_v<Float8E4M3FN> && std::is_standard_layout_v<Float8E5M2>);

// Generic element access for kernels templated over the element type. Arithmetic types (float,
// double, integers) convert with a plain cast; the storage types above use their RNE conversion.
template <class T>
constexpr float to_float(T v) {
  if constexpr (std::is_arithmetic_v<T>) {
    return static_cast<float>(v);
  } else {
    return v.to_float();
  }
}

template <class T>
constexpr T from_float(float x) {
  if constexpr (std::is_arithmetic_v<T>) {
    return static_cast<T>(x);
  } else {
    return T::from_float(x);
  }
}

}  // namespace flashinfer

#endif  // FLASHINFER_FLOAT_FORMATS_H_
