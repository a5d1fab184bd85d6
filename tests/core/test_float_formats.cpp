// Exhaustive tests for include/flashinfer/float_formats.h.
//
// Everything is checked against references written here from the format definitions only:
// decoding is sign * mantissa * 2^exp via std::ldexp in double, and encoding is a search for the
// nearest entry of the decoded code table (ties to the even mantissa) plus the documented
// overflow / NaN rules. When CUDA headers are available the host-side CUDA conversions are also
// compared.

#include "flashinfer/float_formats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#ifdef FLASHINFER_TEST_HAVE_CUDA_HEADERS
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wunused-function"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#if __has_include(<cuda_fp4.h>)
#include <cuda_fp4.h>
#define FLASHINFER_TEST_HAVE_CUDA_FP4 1
#endif
#pragma GCC diagnostic pop
#endif

namespace flashinfer {
namespace {

// ---------------------------------------------------------------------------------------------
// Format descriptions and the independent reference.

enum class Kind {
  kIeee,       // all-ones exponent encodes inf (mantissa 0) and NaN
  kFiniteNan,  // only S.1..1.1..1 is NaN, no inf
  kAllFinite,  // no special codes
};

struct Format {
  int exp_bits;
  int man_bits;
  Kind kind;

  int width() const { return 1 + exp_bits + man_bits; }
  uint32_t num_codes() const { return 1u << width(); }
  uint32_t sign_bit() const { return 1u << (width() - 1); }
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
};

constexpr Format kHalfFormat{5, 10, Kind::kIeee};
constexpr Format kBf16Format{8, 7, Kind::kIeee};
constexpr Format kE4M3Format{4, 3, Kind::kFiniteNan};
constexpr Format kE5M2Format{5, 2, Kind::kIeee};
constexpr Format kE2M1Format{2, 1, Kind::kAllFinite};

double RefDecode(const Format& f, uint32_t code) {
  const uint32_t sign = (code >> (f.width() - 1)) & 1u;
  const uint32_t exp = (code >> f.man_bits) & ((1u << f.exp_bits) - 1u);
  const uint32_t man = code & ((1u << f.man_bits) - 1u);
  const uint32_t exp_all = (1u << f.exp_bits) - 1u;
  const uint32_t man_all = (1u << f.man_bits) - 1u;
  const double s = sign ? -1.0 : 1.0;
  if (f.kind == Kind::kIeee && exp == exp_all) {
    return man == 0 ? s * std::numeric_limits<double>::infinity()
                    : std::numeric_limits<double>::quiet_NaN();
  }
  if (f.kind == Kind::kFiniteNan && exp == exp_all && man == man_all) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  if (exp == 0) return s * std::ldexp(static_cast<double>(man), 1 - f.bias() - f.man_bits);
  return s * std::ldexp(static_cast<double>((1u << f.man_bits) + man),
                        static_cast<int>(exp) - f.bias() - f.man_bits);
}

bool RefIsNanCode(const Format& f, uint32_t code) { return std::isnan(RefDecode(f, code)); }

// One conversion direction pair under test, with the semantics the reference must apply.
struct Converter {
  const char* name;
  Format format;
  bool saturate;
  uint32_t (*encode)(float);
  float (*decode)(uint32_t);
};

const Converter kConverters[] = {
    {"Half", kHalfFormat, false, [](float x) -> uint32_t { return float_to_half_bits(x); },
     [](uint32_t c) { return half_bits_to_float(static_cast<uint16_t>(c)); }},
    {"BFloat16", kBf16Format, false, [](float x) -> uint32_t { return float_to_bfloat16_bits(x); },
     [](uint32_t c) { return bfloat16_bits_to_float(static_cast<uint16_t>(c)); }},
    {"E4M3FN", kE4M3Format, false, [](float x) -> uint32_t { return float_to_e4m3fn_bits(x); },
     [](uint32_t c) { return e4m3fn_bits_to_float(static_cast<uint8_t>(c)); }},
    {"E4M3FNSat", kE4M3Format, true,
     [](float x) -> uint32_t { return float_to_e4m3fn_bits(x, true); },
     [](uint32_t c) { return e4m3fn_bits_to_float(static_cast<uint8_t>(c)); }},
    {"E5M2", kE5M2Format, false, [](float x) -> uint32_t { return float_to_e5m2_bits(x); },
     [](uint32_t c) { return e5m2_bits_to_float(static_cast<uint8_t>(c)); }},
    {"E5M2Sat", kE5M2Format, true, [](float x) -> uint32_t { return float_to_e5m2_bits(x, true); },
     [](uint32_t c) { return e5m2_bits_to_float(static_cast<uint8_t>(c)); }},
    {"E2M1", kE2M1Format, true, [](float x) -> uint32_t { return float_to_e2m1_bits(x); },
     [](uint32_t c) { return e2m1_bits_to_float(static_cast<uint8_t>(c)); }},
};

void PrintTo(const Converter& conv, std::ostream* os) { *os << conv.name; }

// The sorted non-negative finite values of a format plus the first grid point past the largest
// one (the value RNE with an unbounded exponent would produce on overflow).
struct RefTable {
  std::vector<double> values;
  std::vector<uint32_t> codes;
  double overflow_value;
  bool overflow_is_even;
  uint32_t max_code;
};

RefTable BuildTable(const Format& f) {
  RefTable t;
  for (uint32_t c = 0; c < f.sign_bit(); ++c) {
    const double v = RefDecode(f, c);
    if (!std::isfinite(v)) continue;
    t.values.push_back(v);
    t.codes.push_back(c);
  }
  const size_t n = t.values.size();
  // Adjacent top-binade codes share a step, so max + step is the next grid point. Its mantissa
  // lsb is that of code max + 1 (0x7C00 for half: even; 0x7F for e4m3fn: odd; 8.0 for e2m1).
  t.overflow_value = 2 * t.values[n - 1] - t.values[n - 2];
  t.max_code = t.codes[n - 1];
  t.overflow_is_even = ((t.max_code + 1) & 1u) == 0;
  return t;
}

const RefTable& TableFor(const Format& f) {
  static const RefTable half = BuildTable(kHalfFormat);
  static const RefTable bf16 = BuildTable(kBf16Format);
  static const RefTable e4m3 = BuildTable(kE4M3Format);
  static const RefTable e5m2 = BuildTable(kE5M2Format);
  static const RefTable e2m1 = BuildTable(kE2M1Format);
  if (f.width() == 16) return f.exp_bits == 5 ? half : bf16;
  if (f.width() == 8) return f.exp_bits == 4 ? e4m3 : e5m2;
  return e2m1;
}

// The NaN encodings this library documents (canonical quiet NaN with the input's sign; FP4 has
// no NaN and maps every NaN to +6).
uint32_t ExpectedNanCode(const Format& f, bool negative) {
  const uint32_t sign = negative ? f.sign_bit() : 0u;
  if (f.kind == Kind::kAllFinite) return 0x7u;
  if (f.width() == 8) return 0x7Fu | sign;
  if (f.exp_bits == 5) return 0x7E00u | sign;
  return 0x7FC0u | sign;
}

uint32_t RefEncode(const Converter& conv, float x) {
  const Format& f = conv.format;
  if (std::isnan(x)) return ExpectedNanCode(f, std::signbit(x));
  const RefTable& t = TableFor(f);
  const uint32_t sign = std::signbit(x) ? f.sign_bit() : 0u;
  const double a = std::fabs(static_cast<double>(x));
  // Overflowed magnitudes: saturate, or inf (IEEE formats) / NaN (e4m3fn) like torch.
  uint32_t overflow_code = t.max_code;
  if (!conv.saturate) {
    if (f.kind == Kind::kIeee) overflow_code = ((1u << f.exp_bits) - 1u) << f.man_bits;
    if (f.kind == Kind::kFiniteNan) overflow_code = f.sign_bit() - 1u;
  }
  if (std::isinf(a)) return overflow_code | sign;
  const size_t idx = static_cast<size_t>(std::upper_bound(t.values.begin(), t.values.end(), a) -
                                         t.values.begin() - 1);
  const double lo = t.values[idx];
  if (lo == a) return t.codes[idx] | sign;
  const bool hi_is_overflow = idx + 1 == t.values.size();
  const double hi = hi_is_overflow ? t.overflow_value : t.values[idx + 1];
  const bool hi_is_even = hi_is_overflow ? t.overflow_is_even : (t.codes[idx + 1] & 1u) == 0;
  const double mid = (lo + hi) / 2;  // exact: both have few significant bits
  bool take_hi = a > mid || (a == mid && hi_is_even);
  if (!take_hi) return t.codes[idx] | sign;
  return (hi_is_overflow ? overflow_code : t.codes[idx + 1]) | sign;
}

// Every 4099th float32 bit pattern (4099 is prime, so the low bits vary too): ~1.05M values.
const std::vector<float>& StridedSamples() {
  static const std::vector<float> samples = [] {
    std::vector<float> s;
    for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += 4099) {
      s.push_back(std::bit_cast<float>(static_cast<uint32_t>(b)));
    }
    return s;
  }();
  return samples;
}

// A denser sweep over [2^-12, 2^17), the interesting range of the 8- and 4-bit formats.
const std::vector<float>& DenseSmallRangeSamples() {
  static const std::vector<float> samples = [] {
    std::vector<float> s;
    const uint32_t begin = std::bit_cast<uint32_t>(0x1p-12f);
    const uint32_t end = std::bit_cast<uint32_t>(0x1p17f);
    for (uint32_t b = begin; b < end; b += 1021) {
      s.push_back(std::bit_cast<float>(b));
      s.push_back(-std::bit_cast<float>(b));
    }
    return s;
  }();
  return samples;
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%X", v);
  return buf;
}

// Compares encode against the reference on `inputs`; reports the first few mismatches only.
void CheckEncodeAgainstRef(const Converter& conv, const std::vector<float>& inputs) {
  int mismatches = 0;
  for (float x : inputs) {
    const uint32_t got = conv.encode(x);
    const uint32_t want = RefEncode(conv, x);
    if (got != want && ++mismatches <= 8) {
      ADD_FAILURE() << conv.name << "(" << x << " = " << Hex(std::bit_cast<uint32_t>(x))
                    << "): got " << Hex(got) << ", want " << Hex(want);
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << inputs.size() << " inputs";
}

// ---------------------------------------------------------------------------------------------
// Per-converter exhaustive tests.

class ConverterTest : public ::testing::TestWithParam<Converter> {};

TEST_P(ConverterTest, DecodeEveryCode) {
  const Converter& conv = GetParam();
  const Format& f = conv.format;
  for (uint32_t c = 0; c < f.num_codes(); ++c) {
    const double want = RefDecode(f, c);
    const float got = conv.decode(c);
    const bool negative = (c & f.sign_bit()) != 0;
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << Hex(c);
      ASSERT_EQ(std::signbit(got), negative) << Hex(c);
      // Decoding quiets NaN, except bfloat16 which is an exact bit extension (like torch/CUDA).
      if (f.exp_bits != 8) {
        ASSERT_NE(std::bit_cast<uint32_t>(got) & 0x00400000u, 0u) << "quiet NaN " << Hex(c);
      }
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << Hex(c);
      ASSERT_EQ(std::signbit(got), negative) << Hex(c);  // also distinguishes -0
    }
  }
}

TEST_P(ConverterTest, RoundTripEveryCode) {
  const Converter& conv = GetParam();
  const Format& f = conv.format;
  const uint32_t max_code = TableFor(f).max_code;
  for (uint32_t c = 0; c < f.num_codes(); ++c) {
    if (RefIsNanCode(f, c)) continue;
    uint32_t want = c;
    // Saturating conversions clamp the inf codes to the largest finite value.
    if (conv.saturate && std::isinf(RefDecode(f, c))) want = (c & f.sign_bit()) | max_code;
    ASSERT_EQ(conv.encode(conv.decode(c)), want) << Hex(c);
  }
}

TEST_P(ConverterTest, MidpointsTieToEvenAndNeighboursRoundToNearest) {
  const Converter& conv = GetParam();
  const Format& f = conv.format;
  const RefTable& t = TableFor(f);
  const float inf = std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < t.values.size(); ++i) {
    const bool last = i + 1 == t.values.size();
    const double lo = t.values[i];
    const double hi = last ? t.overflow_value : t.values[i + 1];
    const uint32_t lo_code = t.codes[i];
    const double mid_d = (lo + hi) / 2;
    const float mid = static_cast<float>(mid_d);
    ASSERT_EQ(static_cast<double>(mid), mid_d) << "midpoint not representable";
    const float below = std::nextafter(mid, 0.0f);
    const float above = std::nextafter(mid, inf);
    // Codes the three probes must produce (beyond the top they depend on the overflow rule,
    // which the reference applies).
    uint32_t want_mid, want_below, want_above;
    if (!last) {
      const uint32_t hi_code = t.codes[i + 1];
      want_mid = (lo_code & 1u) == 0 ? lo_code : hi_code;
      want_below = lo_code;
      want_above = hi_code;
      ASSERT_EQ(RefEncode(conv, mid), want_mid);  // keeps the reference honest
    } else {
      want_mid = RefEncode(conv, mid);
      want_below = lo_code;
      want_above = RefEncode(conv, above);
    }
    for (int s = 0; s < 2; ++s) {
      const float sg = s ? -1.0f : 1.0f;
      const uint32_t sb = s ? f.sign_bit() : 0u;
      EXPECT_EQ(conv.encode(sg * mid), want_mid | sb) << conv.name << " mid " << mid_d;
      EXPECT_EQ(conv.encode(sg * below), want_below | sb) << conv.name << " below " << mid_d;
      EXPECT_EQ(conv.encode(sg * above), want_above | sb) << conv.name << " above " << mid_d;
    }
  }
}

TEST_P(ConverterTest, StridedFloat32SweepMatchesReference) {
  CheckEncodeAgainstRef(GetParam(), StridedSamples());
}

TEST_P(ConverterTest, DenseSmallRangeSweepMatchesReference) {
  CheckEncodeAgainstRef(GetParam(), DenseSmallRangeSamples());
}

TEST_P(ConverterTest, SpecialInputsMatchReference) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> specials = {0.0f,
                                       -0.0f,
                                       inf,
                                       -inf,
                                       nan,
                                       -nan,
                                       std::bit_cast<float>(0x7F800001u),  // signalling NaN
                                       std::bit_cast<float>(0xFFFFFFFFu),
                                       std::numeric_limits<float>::max(),
                                       -std::numeric_limits<float>::max(),
                                       std::numeric_limits<float>::denorm_min(),
                                       std::numeric_limits<float>::min(),
                                       1e-30f,
                                       1e30f};
  CheckEncodeAgainstRef(GetParam(), specials);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, ConverterTest, ::testing::ValuesIn(kConverters),
                         [](const ::testing::TestParamInfo<Converter>& info) {
                           return std::string(info.param.name);
                         });

// ---------------------------------------------------------------------------------------------
// Golden values: the documented edge cases, spelled out.

TEST(FloatFormatsGolden, Half) {
  EXPECT_EQ(float_to_half_bits(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half_bits(-2.0f), 0xC000);
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7BFF);    // max finite
  EXPECT_EQ(float_to_half_bits(65519.996f), 0x7BFF);  // just below max + half ulp
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7C00);    // tie with 2^16 (even) -> inf
  EXPECT_EQ(float_to_half_bits(-1e10f), 0xFC00);
  EXPECT_EQ(float_to_half_bits(0x1p-24f), 0x0001);   // min subnormal
  EXPECT_EQ(float_to_half_bits(0x1p-25f), 0x0000);   // tie with 0 -> 0 (even)
  EXPECT_EQ(float_to_half_bits(-0x1p-25f), 0x8000);  // keeps the sign of zero
  EXPECT_EQ(float_to_half_bits(0x1.000002p-25f), 0x0001);
  EXPECT_EQ(float_to_half_bits(0x3p-25f), 0x0002);         // 1.5 * 2^-24 -> 2 (even)
  EXPECT_EQ(float_to_half_bits(0x1.ffcp-15f), 0x0400);     // 1023.5 steps ties up to min normal
  EXPECT_EQ(float_to_half_bits(1.0f + 0x1p-11f), 0x3C00);  // tie -> even
  EXPECT_EQ(float_to_half_bits(1.0f + 0x3p-11f), 0x3C02);  // tie -> even (up)
  EXPECT_EQ(float_to_half_bits(-std::numeric_limits<float>::quiet_NaN()), 0xFE00);
  EXPECT_EQ(float_to_half_bits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(half_bits_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(half_bits_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(std::bit_cast<uint32_t>(half_bits_to_float(0x8000)), 0x80000000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(half_bits_to_float(0x7C01)), 0x7FC02000u);  // quieted
}

TEST(FloatFormatsGolden, BFloat16) {
  EXPECT_EQ(float_to_bfloat16_bits(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bfloat16_bits(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie, even
  EXPECT_EQ(float_to_bfloat16_bits(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie, up
  EXPECT_EQ(float_to_bfloat16_bits(std::bit_cast<float>(0x3F808001u)), 0x3F81);
  EXPECT_EQ(float_to_bfloat16_bits(std::numeric_limits<float>::max()), 0x7F80);  // RNE -> inf
  EXPECT_EQ(float_to_bfloat16_bits(std::bit_cast<float>(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(float_to_bfloat16_bits(std::bit_cast<float>(0x00008000u)), 0x0000);  // subnormal tie
  EXPECT_EQ(float_to_bfloat16_bits(std::bit_cast<float>(0x00018000u)), 0x0002);
  EXPECT_EQ(float_to_bfloat16_bits(std::bit_cast<float>(0x7F800001u)), 0x7FC0);  // sNaN quiet
  EXPECT_EQ(float_to_bfloat16_bits(std::bit_cast<float>(0xFFFFFFFFu)), 0xFFC0);
  EXPECT_EQ(float_to_bfloat16_bits(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(bfloat16_bits_to_float(0x0001), 0x1p-133f);
}

TEST(FloatFormatsGolden, E4M3FN) {
  EXPECT_EQ(float_to_e4m3fn_bits(1.0f), 0x38);
  EXPECT_EQ(float_to_e4m3fn_bits(448.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3fn_bits(463.99997f), 0x7E);
  EXPECT_EQ(float_to_e4m3fn_bits(464.0f), 0x7E);      // tie 448 / 480 -> even (448)
  EXPECT_EQ(float_to_e4m3fn_bits(464.00003f), 0x7F);  // rounds onto the NaN code (torch)
  EXPECT_EQ(float_to_e4m3fn_bits(-479.99997f), 0xFF);
  EXPECT_EQ(float_to_e4m3fn_bits(480.0f), 0x7F);
  EXPECT_EQ(float_to_e4m3fn_bits(1e20f), 0x7F);
  EXPECT_EQ(float_to_e4m3fn_bits(std::numeric_limits<float>::infinity()), 0x7F);
  EXPECT_EQ(float_to_e4m3fn_bits(-std::numeric_limits<float>::infinity()), 0xFF);
  EXPECT_EQ(float_to_e4m3fn_bits(-std::numeric_limits<float>::quiet_NaN()), 0xFF);
  EXPECT_EQ(float_to_e4m3fn_bits(464.00003f, true), 0x7E);  // saturating
  EXPECT_EQ(float_to_e4m3fn_bits(-1e20f, true), 0xFE);
  EXPECT_EQ(float_to_e4m3fn_bits(std::numeric_limits<float>::infinity(), true), 0x7E);
  EXPECT_EQ(float_to_e4m3fn_bits(-std::numeric_limits<float>::infinity(), true), 0xFE);
  EXPECT_EQ(float_to_e4m3fn_bits(std::numeric_limits<float>::quiet_NaN(), true), 0x7F);
  EXPECT_EQ(float_to_e4m3fn_bits(0x1p-9f), 0x01);   // min subnormal
  EXPECT_EQ(float_to_e4m3fn_bits(0x1p-10f), 0x00);  // tie with 0 -> 0
  EXPECT_EQ(float_to_e4m3fn_bits(0x1.000002p-10f), 0x01);
  EXPECT_EQ(float_to_e4m3fn_bits(0x1.ep-7f), 0x08);  // 0.9375 * 2^-6 ties up to min normal
  EXPECT_EQ(e4m3fn_bits_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3fn_bits_to_float(0x01), 0x1p-9f);
  EXPECT_TRUE(std::isnan(e4m3fn_bits_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3fn_bits_to_float(0xFF)));
  EXPECT_EQ(e4m3fn_bits_to_float(0x78), 256.0f);  // exponent 1111 is finite here
}

TEST(FloatFormatsGolden, E5M2) {
  EXPECT_EQ(float_to_e5m2_bits(1.0f), 0x3C);
  EXPECT_EQ(float_to_e5m2_bits(57344.0f), 0x7B);
  EXPECT_EQ(float_to_e5m2_bits(61439.996f), 0x7B);
  EXPECT_EQ(float_to_e5m2_bits(61440.0f), 0x7C);  // tie 57344 (odd) / 65536 (even) -> inf
  EXPECT_EQ(float_to_e5m2_bits(-1e20f), 0xFC);
  EXPECT_EQ(float_to_e5m2_bits(std::numeric_limits<float>::infinity()), 0x7C);
  EXPECT_EQ(float_to_e5m2_bits(-std::numeric_limits<float>::quiet_NaN()), 0xFF);
  EXPECT_EQ(float_to_e5m2_bits(61440.0f, true), 0x7B);
  EXPECT_EQ(float_to_e5m2_bits(-std::numeric_limits<float>::infinity(), true), 0xFB);
  EXPECT_EQ(float_to_e5m2_bits(std::numeric_limits<float>::quiet_NaN(), true), 0x7F);
  EXPECT_EQ(float_to_e5m2_bits(0x1p-16f), 0x01);  // min subnormal
  EXPECT_EQ(float_to_e5m2_bits(0x1p-17f), 0x00);  // tie with 0 -> 0
  EXPECT_EQ(float_to_e5m2_bits(0x3p-17f), 0x02);  // tie 1 / 2 -> 2
  EXPECT_EQ(e5m2_bits_to_float(0x7B), 57344.0f);
  EXPECT_EQ(e5m2_bits_to_float(0xFC), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(e5m2_bits_to_float(0x7D)));
}

TEST(FloatFormatsGolden, E2M1) {
  const float kMagnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (uint8_t c = 0; c < 8; ++c) {
    EXPECT_EQ(e2m1_bits_to_float(c), kMagnitudes[c]);
    EXPECT_EQ(e2m1_bits_to_float(c | 0x8), -kMagnitudes[c]);
  }
  EXPECT_EQ(float_to_e2m1_bits(0.25f), 0x0);  // ties go to the even mantissa bit
  EXPECT_EQ(float_to_e2m1_bits(0.75f), 0x2);
  EXPECT_EQ(float_to_e2m1_bits(1.25f), 0x2);
  EXPECT_EQ(float_to_e2m1_bits(1.75f), 0x4);
  EXPECT_EQ(float_to_e2m1_bits(2.5f), 0x4);
  EXPECT_EQ(float_to_e2m1_bits(3.5f), 0x6);
  EXPECT_EQ(float_to_e2m1_bits(5.0f), 0x6);
  EXPECT_EQ(float_to_e2m1_bits(-5.0001f), 0xF);
  EXPECT_EQ(float_to_e2m1_bits(7.0f), 0x7);  // saturating
  EXPECT_EQ(float_to_e2m1_bits(-1e30f), 0xF);
  EXPECT_EQ(float_to_e2m1_bits(std::numeric_limits<float>::infinity()), 0x7);
  EXPECT_EQ(float_to_e2m1_bits(-std::numeric_limits<float>::infinity()), 0xF);
  EXPECT_EQ(float_to_e2m1_bits(std::numeric_limits<float>::quiet_NaN()), 0x7);
  EXPECT_EQ(float_to_e2m1_bits(-std::numeric_limits<float>::quiet_NaN()), 0x7);
  EXPECT_EQ(float_to_e2m1_bits(-0.0f), 0x8);
  EXPECT_EQ(float_to_e2m1_bits(-0.1f), 0x8);
  EXPECT_EQ(e2m1_bits_to_float(0xF7), 6.0f);  // only the low nibble is read
}

TEST(FloatFormats, E2M1Packing) {
  for (uint32_t b = 0; b < 256; ++b) {
    const auto byte = static_cast<uint8_t>(b);
    EXPECT_EQ(pack_e2m1x2(e2m1x2_low(byte), e2m1x2_high(byte)), byte);
  }
  for (uint8_t lo = 0; lo < 16; ++lo) {
    for (uint8_t hi = 0; hi < 16; ++hi) {
      const uint8_t p = pack_e2m1x2(lo, hi);
      EXPECT_EQ(p, lo + 16 * hi);
      EXPECT_EQ(e2m1x2_low(p), lo);
      EXPECT_EQ(e2m1x2_high(p), hi);
    }
  }
  // Element 2t is the low nibble: [1.0, -6.0] packs to 0xF2.
  EXPECT_EQ(pack_e2m1x2(float_to_e2m1_bits(1.0f), float_to_e2m1_bits(-6.0f)), 0xF2);
}

// ---------------------------------------------------------------------------------------------
// Value types and generic helpers.

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);
static_assert(sizeof(Float8E4M3FN) == 1 && sizeof(Float8E5M2) == 1);
static_assert(std::is_trivially_copyable_v<Half> && std::is_trivially_copyable_v<BFloat16> &&
              std::is_trivially_copyable_v<Float8E4M3FN> &&
              std::is_trivially_copyable_v<Float8E5M2>);
// Everything is usable in constant expressions.
static_assert(float_to_half_bits(65520.0f) == 0x7C00);
static_assert(float_to_bfloat16_bits(1.0f) == 0x3F80);
static_assert(float_to_e4m3fn_bits(464.0f) == 0x7E);
static_assert(float_to_e5m2_bits(1e9f, true) == 0x7B);
static_assert(float_to_e2m1_bits(5.0f) == 0x6);
static_assert(half_bits_to_float(0x3555) > 0.333f);
static_assert(e4m3fn_bits_to_float(0x01) == 0x1p-9f);
static_assert(Float8E5M2::from_bits(0x3C).to_float() == 1.0f);
static_assert(to_float(BFloat16::from_float(3.0f)) == 3.0f);
static_assert(from_float<Half>(0.5f).bits == 0x3800);

TEST(FloatFormats, ValueTypes) {
  EXPECT_EQ(Half::from_float(1.0f).bits, 0x3C00);
  EXPECT_EQ(Half::from_bits(0xC000).to_float(), -2.0f);
  EXPECT_EQ(BFloat16::from_float(-1.0f).bits, 0xBF80);
  EXPECT_EQ(BFloat16::from_bits(0x4000).to_float(), 2.0f);
  EXPECT_EQ(Float8E4M3FN::from_float(500.0f).bits, 0x7F);  // non-saturating
  EXPECT_EQ(Float8E4M3FN::from_bits(0x38).to_float(), 1.0f);
  EXPECT_EQ(Float8E5M2::from_float(1e6f).bits, 0x7C);  // non-saturating
  EXPECT_EQ(Float8E5M2::from_bits(0xBC).to_float(), -1.0f);
}

template <class T>
float RoundTrip(float x) {
  return to_float(from_float<T>(x));
}

TEST(FloatFormats, GenericHelpers) {
  EXPECT_EQ(RoundTrip<float>(0.1f), 0.1f);
  EXPECT_EQ(RoundTrip<double>(0.1f), 0.1f);
  EXPECT_EQ(from_float<double>(0.1f), static_cast<double>(0.1f));
  EXPECT_EQ(to_float(0.1), 0.1f);
  EXPECT_EQ(RoundTrip<Half>(0.1f), half_bits_to_float(float_to_half_bits(0.1f)));
  EXPECT_EQ(RoundTrip<BFloat16>(0.1f), bfloat16_bits_to_float(float_to_bfloat16_bits(0.1f)));
  EXPECT_EQ(RoundTrip<Float8E4M3FN>(0.1f), e4m3fn_bits_to_float(float_to_e4m3fn_bits(0.1f)));
  EXPECT_EQ(RoundTrip<Float8E5M2>(0.1f), e5m2_bits_to_float(float_to_e5m2_bits(0.1f)));
  EXPECT_EQ(RoundTrip<Float8E5M2>(3.0f), 3.0f);
}

// ---------------------------------------------------------------------------------------------
// Host-side comparison with CUDA's own conversions.
//
// Differences found (CUDA 13.0 headers), none affecting finite or infinite results:
//  * CUDA returns an unsigned canonical NaN for NaN input: 0x7FFF for half and bfloat16, 0x7F for
//    both fp8 formats, and decodes every fp8 NaN to half 0x7FFF. We return 0x7E00/0x7FC0/0x7F with
//    the input's sign (torch keeps the sign too, except c10's bfloat16 which returns 0x7FC0).
//  * E4M3 __NV_NOSAT matches torch exactly on non-NaN input (464 -> 448, above 464 -> NaN, +-inf
//    -> NaN with sign); E5M2 __NV_NOSAT matches torch (>= 61440 -> inf).
//  * __NV_SATFINITE clamps +-inf to +-max finite for both fp8 formats; NaN stays NaN.
//  * FP4 (cudaRoundNearest) saturates to +-6 and maps NaN of either sign to 0x7, as we do.
#ifdef FLASHINFER_TEST_HAVE_CUDA_HEADERS

float CudaHalfRawToFloat(uint16_t bits) {
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

uint16_t CudaFloatToHalf(float x) {
  const __half_raw raw = __half(__float2half_rn(x));
  return raw.x;
}

uint16_t CudaFloatToBf16(float x) {
  const __nv_bfloat16_raw raw = __float2bfloat16_rn(x);
  return raw.x;
}

float CudaBf16ToFloat(uint16_t bits) {
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __bfloat162float(__nv_bfloat16(raw));
}

// All inputs worth comparing on: sweeps, every code value, and every midpoint +- 1 ulp.
std::vector<float> CudaComparisonInputs() {
  std::vector<float> inputs = StridedSamples();
  const std::vector<float>& dense = DenseSmallRangeSamples();
  inputs.insert(inputs.end(), dense.begin(), dense.end());
  for (const Converter& conv : kConverters) {
    const RefTable& t = TableFor(conv.format);
    for (size_t i = 0; i < t.values.size(); ++i) {
      const double hi = i + 1 < t.values.size() ? t.values[i + 1] : t.overflow_value;
      const auto mid = static_cast<float>((t.values[i] + hi) / 2);
      for (float v : {static_cast<float>(t.values[i]), mid, std::nextafter(mid, 0.0f),
                      std::nextafter(mid, 1e38f)}) {
        inputs.push_back(v);
        inputs.push_back(-v);
      }
    }
  }
  return inputs;
}

// Results must be identical, except that two NaN codes count as equal.
void CompareWithCuda(const char* name, const Format& f, const std::vector<float>& inputs,
                     uint32_t (*ours)(float), uint32_t (*cuda)(float)) {
  int mismatches = 0;
  for (float x : inputs) {
    const uint32_t a = ours(x);
    const uint32_t b = cuda(x);
    if (a == b || (RefIsNanCode(f, a) && RefIsNanCode(f, b))) continue;
    if (++mismatches <= 8) {
      ADD_FAILURE() << name << "(" << x << " = " << Hex(std::bit_cast<uint32_t>(x)) << "): ours "
                    << Hex(a) << ", CUDA " << Hex(b);
    }
  }
  EXPECT_EQ(mismatches, 0) << name;
}

bool SameFloat(float a, float b) {
  return std::isnan(a) ? std::isnan(b) : std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

TEST(FloatFormatsCuda, DecodeEveryCode) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const auto bits = static_cast<uint16_t>(c);
    ASSERT_TRUE(SameFloat(half_bits_to_float(bits), CudaHalfRawToFloat(bits))) << Hex(c);
    ASSERT_TRUE(SameFloat(bfloat16_bits_to_float(bits), CudaBf16ToFloat(bits))) << Hex(c);
  }
  for (uint32_t c = 0; c < 256; ++c) {
    const auto code = static_cast<__nv_fp8_storage_t>(c);
    const float e4 = CudaHalfRawToFloat(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3).x);
    const float e5 = CudaHalfRawToFloat(__nv_cvt_fp8_to_halfraw(code, __NV_E5M2).x);
    ASSERT_TRUE(SameFloat(e4m3fn_bits_to_float(static_cast<uint8_t>(c)), e4)) << Hex(c);
    ASSERT_TRUE(SameFloat(e5m2_bits_to_float(static_cast<uint8_t>(c)), e5)) << Hex(c);
  }
#ifdef FLASHINFER_TEST_HAVE_CUDA_FP4
  for (uint32_t c = 0; c < 16; ++c) {
    const float v = CudaHalfRawToFloat(
        __nv_cvt_fp4_to_halfraw(static_cast<__nv_fp4_storage_t>(c), __NV_E2M1).x);
    ASSERT_TRUE(SameFloat(e2m1_bits_to_float(static_cast<uint8_t>(c)), v)) << Hex(c);
  }
#endif
}

TEST(FloatFormatsCuda, EncodeMatchesCuda) {
  const std::vector<float> inputs = CudaComparisonInputs();
  CompareWithCuda(
      "half", kHalfFormat, inputs, [](float x) -> uint32_t { return float_to_half_bits(x); },
      [](float x) -> uint32_t { return CudaFloatToHalf(x); });
  CompareWithCuda(
      "bf16", kBf16Format, inputs, [](float x) -> uint32_t { return float_to_bfloat16_bits(x); },
      [](float x) -> uint32_t { return CudaFloatToBf16(x); });
  CompareWithCuda(
      "e4m3 nosat", kE4M3Format, inputs,
      [](float x) -> uint32_t { return float_to_e4m3fn_bits(x); },
      [](float x) -> uint32_t { return __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3); });
  CompareWithCuda(
      "e4m3 satfinite", kE4M3Format, inputs,
      [](float x) -> uint32_t { return float_to_e4m3fn_bits(x, true); },
      [](float x) -> uint32_t { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); });
  CompareWithCuda(
      "e5m2 nosat", kE5M2Format, inputs, [](float x) -> uint32_t { return float_to_e5m2_bits(x); },
      [](float x) -> uint32_t { return __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2); });
  CompareWithCuda(
      "e5m2 satfinite", kE5M2Format, inputs,
      [](float x) -> uint32_t { return float_to_e5m2_bits(x, true); },
      [](float x) -> uint32_t { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2); });
#ifdef FLASHINFER_TEST_HAVE_CUDA_FP4
  CompareWithCuda(
      "e2m1", kE2M1Format, inputs, [](float x) -> uint32_t { return float_to_e2m1_bits(x); },
      [](float x) -> uint32_t { return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest); });
#endif
}

TEST(FloatFormatsCuda, SpecialsDocumentedDifferences) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // CUDA drops the NaN sign; we keep it. Both are NaN.
  EXPECT_EQ(CudaFloatToHalf(-nan), 0x7FFF);
  EXPECT_EQ(float_to_half_bits(-nan), 0xFE00);
  EXPECT_EQ(__nv_cvt_float_to_fp8(-nan, __NV_NOSAT, __NV_E4M3), 0x7F);
  EXPECT_EQ(float_to_e4m3fn_bits(-nan), 0xFF);
  // Identical overflow semantics.
  EXPECT_EQ(__nv_cvt_float_to_fp8(464.0f, __NV_NOSAT, __NV_E4M3), 0x7E);
  EXPECT_EQ(__nv_cvt_float_to_fp8(465.0f, __NV_NOSAT, __NV_E4M3), 0x7F);
  EXPECT_EQ(__nv_cvt_float_to_fp8(-inf, __NV_SATFINITE, __NV_E5M2), 0xFB);
  EXPECT_EQ(__nv_cvt_float_to_fp8(-inf, __NV_NOSAT, __NV_E4M3), 0xFF);
#ifdef FLASHINFER_TEST_HAVE_CUDA_FP4
  // Element x goes to the low nibble in CUDA's packed conversion too.
  float2 pair;
  pair.x = 1.0f;
  pair.y = -6.0f;
  EXPECT_EQ(__nv_cvt_float2_to_fp4x2(pair, __NV_E2M1, cudaRoundNearest), 0xF2);
#endif
}

#endif  // FLASHINFER_TEST_HAVE_CUDA_HEADERS

}  // namespace
}  // namespace flashinfer
