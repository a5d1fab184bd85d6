#include "kernels/cpu/activation_cpu.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <type_traits>
#include <vector>

#include "flashinfer/error.h"
#include "kernels/cpu/cpu_avx512.h"
#include "kernels/cpu/cpu_row_io.h"
#include "kernels/dtype_dispatch.h"
#include "kernels/fp32_rules.h"

namespace flashinfer::kernels::cpu {
namespace {

constexpr int64_t kParallelMinElems = int64_t{1} << 15;

// fp32 inputs (16-bit ones use the tables further down). The fp32 building blocks are written
// once as scalar code and once with AVX2 intrinsics (GCC does not if-convert the range selects
// under the default -ftrapping-math, so the scalar loops stay scalar). Both evaluate the same
// operations in the same order.
//
// exp: kernels/fp32_rules.h's exp_f32 (Cody-Waite reduction, Cephes' polynomial), shared with
// the CUDA kernels that must match a CPU reference bit for bit; the vector code below evaluates
// the same operations with its constants.
using exp_f32_consts::kExpClampHi;
using exp_f32_consts::kExpHi;
using exp_f32_consts::kExpLo;
using exp_f32_consts::kExpP;
using exp_f32_consts::kLn2Hi;
using exp_f32_consts::kLn2Lo;
using exp_f32_consts::kLog2e;
using exp_f32_consts::kRoundMagic;

// erfc(z), z >= 0, as t exp(-z^2 + P(t)) with t = 1 / (1 + z/2): the Chebyshev fit of Numerical
// Recipes' erfcc, relative error < 1.2e-7 for every z >= 0 (so tails stay accurate).
constexpr float kErfcP[10] = {0.17087277f,  -0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f,
                              -0.18628806f, 0.09678418f,  0.37409196f, 1.00002368f,  -1.26551223f};
constexpr float kSqrtHalf = 0.70710678118654752f;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluTanhC = 0.044715f;

// erfc(a / sqrt 2) for a = |x|, as t e^(-a^2/2 + q) with t = 1 / (1 + z/2), z = a / sqrt 2 and
// q = P(t). The exponent must not be rounded (an ulp of 80 is 8e-6 relative in e^(...)), nor
// formed from the rounded z (z's own rounding costs as much): a is split into a 12-bit head ah
// (ah^2 exact) and the rest, a^2 = ah^2 + al (ah + a), and the two factors e^(-ah^2/2) and
// e^(q - al (ah + a)/2) each come from an exactly known or a small argument.
inline float erfc_abs_over_sqrt2(float a) {
  const float t = 1.0f / (1.0f + 0.5f * (a * kSqrtHalf));
  float q = kErfcP[0];
  for (int j = 1; j < 10; ++j) q = q * t + kErfcP[j];
  const float ah = std::bit_cast<float>(std::bit_cast<uint32_t>(a) & 0xFFFFF000u);
  const float al = a - ah;
  return t * exp_f32(-0.5f * (ah * ah)) * exp_f32(q - 0.5f * (al * (ah + a)));
}

// silu(x) = x / (1 + e^-x).
inline float silu(float x) { return x / (1.0f + exp_f32(-x)); }

// gelu(x) = x/2 (1 + erf(x / sqrt 2)) = x/2 erfc(-x / sqrt 2): the erfc form has no
// cancellation for negative x, where 1 + erf would lose most digits.
// |x| is clamped to 15.75 as in the AVX-512 code: erfc(15.75/sqrt 2) underflows fp32 anyway, and
// the split of a^2 stays finite for infinite and near-overflow x (min keeps a NaN first operand).
inline float gelu(float x) {
  const float c = erfc_abs_over_sqrt2(std::min(std::fabs(x), 15.75f));
  return 0.5f * x * (x < 0.0f ? c : 2.0f - c);
}

// gelu_tanh(x) = x/2 (1 + tanh u) = x / (1 + e^(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3): the
// same identity avoids 1 + tanh's cancellation for negative u.
inline float gelu_tanh(float x) {
  const float u = kSqrt2OverPi * (x + kGeluTanhC * x * x * x);
  return x / (1.0f + exp_f32(-2.0f * u));
}

template <float (*Act)(float)>
void act_row_scalar(float* __restrict gate, const float* __restrict up, int64_t d) {
  for (int64_t i = 0; i < d; ++i) gate[i] = Act(gate[i]) * up[i];
}

// 16-bit inputs: a gate element has only 65536 encodings, so act(gate) is taken from a table
// of them, each evaluated in fp64 and rounded once to fp32. The op is then a lookup, an fp32
// multiply by up and the final rounding: at least as exact as the fp32 formulas above, the same
// bits on every instruction set, and cheap enough to run at memory speed (evaluating erfc or exp
// per element made fp16/bf16 compute-bound; see docs/PERFORMANCE.md).
//
// fp16: all three activations are x s(x) with s(-x) = 1 - s(x), so act(x) = act(-x) + x. The
// fp16 table therefore holds only act(-|x|), indexed by the 15 magnitude bits, and a positive
// gate adds itself: one more fp32 rounding, exact to 1 ulp in all since |act(-|x|)| <=
// act(|x|). Half the table is half the cache lines a realistic spread of fp16 gates touches
// (1024 encodings per binade), which is what the gathers wait on. bf16 has 128 encodings per
// binade, so its gates touch few lines anyway, and its table keeps all 65536 (no extra add).
// The tables (128 KiB fp16, 256 KiB bf16) are built on first use (a few ms) and kept for the
// life of the process.
double act_f64(Activation act, double x) {
  switch (act) {
    case Activation::kSilu:
      return x / (1.0 + std::exp(-x));
    case Activation::kGelu:  // erfc form: no cancellation for negative x
      return 0.5 * x * std::erfc(-x * 0.70710678118654752440);
    case Activation::kGeluTanh:  // x/2 (1 + tanh u) = x / (1 + e^(-2u))
      return x / (1.0 + std::exp(-2.0 * 0.79788456080286535588 * (x + 0.044715 * x * x * x)));
  }
  return x;
}

// Whether T's table is folded on the sign (holds act(-|x|) only).
template <class T>
constexpr bool kFoldSign = std::is_same_v<T, Half>;
constexpr uint16_t kSignBit = 0x8000, kMagnitudeBits = 0x7FFF, kHalfInfBits = 0x7C00;

template <class T>
const float* act_table(Activation act) {
  static_assert(sizeof(T) == 2);
  constexpr int kActs = 3;
  static std::once_flag once[kActs];
  // Never freed: a call made while static objects are destroyed at exit still finds its table.
  static float* tables[kActs];
  const int a = static_cast<int>(act);
  FLASHINFER_CHECK(a >= 0 && a < kActs, "act_and_mul", "act", "unknown activation ", a);
  std::call_once(once[a], [&] {
    const uint32_t size = kFoldSign<T> ? kMagnitudeBits + 1 : 65536;
    auto* t = new float[size];
    for (uint32_t b = 0; b < size; ++b) {
      const float x = T{static_cast<uint16_t>(kFoldSign<T> ? b | kSignBit : b)}.to_float();
      const double v = act_f64(act, static_cast<double>(x));
      // One NaN for every NaN gate (and -inf, whose act is -inf * 0): the scalar and F16C
      // conversions keep payloads differently.
      t[b] = std::isnan(v) ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(v);
    }
    tables[a] = t;
  });
  return tables[a];
}

// act(g) from T's table. Folded (fp16): act(-|g|) for negative gates and NaN, act(-|g|) + g
// for finite non-negative ones (+0 gives -0 + 0 = +0), and +inf for +inf (act(-inf) is NaN).
template <class T>
inline float act_from_table(const float* table, T g) {
  if constexpr (!kFoldSign<T>) return table[g.bits];
  const float t = table[g.bits & kMagnitudeBits];
  if (g.bits < kHalfInfBits) return t + g.to_float();
  return g.bits == kHalfInfBits ? g.to_float() : t;
}

// Any tier, any strides: lookups into an fp32 buffer, up converted by the row helpers (vector
// conversions for unit stride), one multiply per element, one rounding on the store.
template <class T>
void rows_lut(const ActAndMulParams& p, const float* table) {
  const auto* in = static_cast<const T*>(p.input);
  auto* out = static_cast<T*>(p.out);
  const int64_t d = p.d, s = p.in_stride_d;
  constexpr int64_t kChunk = 512;
  rowio::for_row_blocks(p.rows, 2 * d, kParallelMinElems, [&](int64_t r0, int64_t r1) {
    float a[kChunk], u[kChunk];
    for (int64_t r = r0; r < r1; ++r) {
      const T* gate = in + r * p.in_stride_row;
      const T* up = gate + d * s;
      T* y = out + r * p.out_stride_row;
      for (int64_t c = 0; c < d; c += kChunk) {
        const int64_t n = std::min(kChunk, d - c);
        for (int64_t i = 0; i < n; ++i) a[i] = act_from_table(table, gate[(c + i) * s]);
        rowio::load_row(up + c * s, s, n, u);
        for (int64_t i = 0; i < n; ++i) a[i] *= u[i];
        rowio::store_row(y + c * p.out_stride_d, p.out_stride_d, n, a);
      }
    }
  });
}

#if FLASHINFER_CPU_F16C
#define FI_AVX2 __attribute__((target("avx2")))

FI_AVX2 inline __m256 set1(float v) { return _mm256_set1_ps(v); }

FI_AVX2 inline __m256 exp_avx2(__m256 x) {
  // max/min return their second operand for NaN, so NaN passes through.
  const __m256 xc = _mm256_min_ps(set1(kExpClampHi), _mm256_max_ps(set1(kExpLo), x));
  const __m256 m = _mm256_add_ps(_mm256_mul_ps(xc, set1(kLog2e)), set1(kRoundMagic));
  const __m256 n = _mm256_sub_ps(m, set1(kRoundMagic));
  __m256 r = _mm256_sub_ps(xc, _mm256_mul_ps(n, set1(kLn2Hi)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, set1(kLn2Lo)));
  __m256 p = set1(kExpP[0]);
  for (int j = 1; j < 6; ++j) p = _mm256_add_ps(_mm256_mul_ps(p, r), set1(kExpP[j]));
  p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), set1(1.0f));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_castps_si256(m), _mm256_set1_epi32(126 - 0x4B400000)), 23);
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), set1(2.0f));
  y = _mm256_blendv_ps(y, set1(std::numeric_limits<float>::infinity()),
                       _mm256_cmp_ps(x, set1(kExpHi), _CMP_GT_OQ));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, set1(kExpLo), _CMP_LT_OQ));
  return y;
}

FI_AVX2 inline __m256 silu_avx2(__m256 x) {
  const __m256 nx = _mm256_sub_ps(_mm256_setzero_ps(), x);
  return _mm256_div_ps(x, _mm256_add_ps(set1(1.0f), exp_avx2(nx)));
}

FI_AVX2 inline __m256 gelu_avx2(__m256 x) {
  // min returns its second operand (|x|) when that is NaN, so NaN propagates.
  const __m256 a = _mm256_min_ps(set1(15.75f), _mm256_andnot_ps(set1(-0.0f), x));
  const __m256 t = _mm256_div_ps(
      set1(1.0f),
      _mm256_add_ps(set1(1.0f), _mm256_mul_ps(set1(0.5f), _mm256_mul_ps(a, set1(kSqrtHalf)))));
  __m256 q = set1(kErfcP[0]);
  for (int j = 1; j < 10; ++j) q = _mm256_add_ps(_mm256_mul_ps(q, t), set1(kErfcP[j]));
  const __m256 ah = _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0xFFFFF000u)));
  const __m256 al = _mm256_sub_ps(a, ah);
  const __m256 e_hi = exp_avx2(_mm256_mul_ps(set1(-0.5f), _mm256_mul_ps(ah, ah)));
  const __m256 e_lo = exp_avx2(
      _mm256_sub_ps(q, _mm256_mul_ps(set1(0.5f), _mm256_mul_ps(al, _mm256_add_ps(ah, a)))));
  const __m256 c = _mm256_mul_ps(_mm256_mul_ps(t, e_hi), e_lo);
  const __m256 w = _mm256_blendv_ps(_mm256_sub_ps(set1(2.0f), c), c,
                                    _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
  return _mm256_mul_ps(_mm256_mul_ps(set1(0.5f), x), w);
}

FI_AVX2 inline __m256 gelu_tanh_avx2(__m256 x) {
  const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(set1(kGeluTanhC), x), x), x);
  const __m256 u = _mm256_mul_ps(set1(kSqrt2OverPi), _mm256_add_ps(x, x3));
  const __m256 e = exp_avx2(_mm256_mul_ps(set1(-2.0f), u));
  return _mm256_div_ps(x, _mm256_add_ps(set1(1.0f), e));
}

template <__m256 (*ActV)(__m256), float (*Act)(float)>
FI_AVX2 void act_row_avx2(float* __restrict gate, const float* __restrict up, int64_t d) {
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    const __m256 g = ActV(_mm256_loadu_ps(gate + i));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(g, _mm256_loadu_ps(up + i)));
  }
  for (; i < d; ++i) gate[i] = Act(gate[i]) * up[i];
}
#undef FI_AVX2
#endif

#if FLASHINFER_CPU_AVX512
// AVX-512, fp32: the gate and up halves of a unit-stride row are loaded 16 lanes at a time,
// combined and stored in registers, with no row buffers; tails are masked.
// silu and gelu_tanh use the scalar formulas (with FMA and the scalef-based exp of
// cpu_avx512.h); gelu has its own formulation (GeluV below).
namespace v5 = simd512;

struct SiluV {
  FI_AVX512 static __m512 f(__m512 x) {
    const __m512 e = v5::exp(_mm512_sub_ps(_mm512_setzero_ps(), x));
    return _mm512_div_ps(x, _mm512_add_ps(v5::set1(1.0f), e));
  }
};

// gelu(x) = x Phi(x) with Phi(x) = 1 - G(|x|) e^(-x^2/2) for x >= 0 and G(|x|) e^(-x^2/2) for
// x < 0, where G(a) = erfcx(a / sqrt 2) / 2: the erfc form, so no cancellation for negative x.
// G is smooth and needs no division: a degree-5 polynomial on each of 32 intervals of width 1/2
// in |x| (relative error 1.7e-7), its coefficients picked per lane with two-register permutes
// (port 5) while the FMAs run elsewhere; that is ~25 % fewer FMA-port operations than the
// t = 1 / (1 + z/2) form of the scalar code, which made fp32 gelu compute-bound.
// Coefficients: scripts/gen/gelu_erfcx_coeffs.py (mpmath fits, rounded to fp32).
// e^(-x^2/2): x^2 = hi + lo exactly (FMA), and the reduction (a - n ln2_hi) + (b - n ln2_lo) with
// a = -hi/2, b = -lo/2 meets the large part a before any rounding, so the far negative tail keeps
// ~1e-7 relative accuracy (rounding -x^2/2 alone would cost 8e-6). |x| is clamped to 15.75:
// G(15.75) e^(-124) underflows fp32, so results are unchanged, and x^2 stays finite.
alignas(64) constexpr float kGeluHalfErfcx[6][32] = {
    {0.49999994f,   0.349618822f,  0.261578292f,  0.20578067f,   0.168101996f,  0.14133133f,
     0.121513948f,  0.106345154f,  0.094410643f,  0.084803395f,  0.0769193023f, 0.0703426972f,
     0.0647793114f, 0.0600156747f, 0.0558934808f, 0.0522930957f, 0.0491225459f, 0.0463100448f,
     0.0437987894f, 0.04154329f,   0.0395066924f, 0.037658859f,  0.03597489f,   0.0344340578f,
     0.0330189727f, 0.0317149274f, 0.0305094142f, 0.0293917321f, 0.0283526611f, 0.0273842253f,
     0.0264794882f, 0.0256323908f},
    {-0.199467421f,    -0.1120653f,     -0.0686816126f,  -0.045135498f,   -0.0313690826f,
     -0.0228069499f,   -0.0172002055f,  -0.0133671155f,  -0.0106498543f,  -0.00866350625f,
     -0.00717287697f,  -0.00602873089f, -0.00513319671f, -0.00442019524f, -0.0038439515f,
     -0.00337202591f,  -0.00298095518f, -0.00265345699f, -0.00237659016f, -0.00214051991f,
     -0.0019376697f,   -0.00176213193f, -0.00160924729f, -0.00147530332f, -0.00135731371f,
     -0.00125285541f,  -0.00115994597f, -0.00107695174f, -0.00100251648f, -0.000935507589f,
     -0.000874972728f, -0.00082010706f},
    {0.0624573007f,   0.0296810232f,   0.0155223627f,   0.00879506487f,  0.00532750878f,
     0.00341176218f,  0.00228894269f,  0.00159684487f,  0.00115143694f,  0.000853958132f,
     0.000648804882f, 0.000503324263f, 0.000397614494f, 0.000319139508f, 0.000259768305f,
     0.000214087326f, 0.000178406859f, 0.00015015855f,  0.000127520136f, 0.000109176253f,
     9.41623512e-05f, 8.17609034e-05f, 7.14310736e-05f, 6.27602494e-05f, 5.54301187e-05f,
     4.91925639e-05f, 4.38523421e-05f, 3.92544353e-05f, 3.52747629e-05f, 3.18132188e-05f,
     2.87884632e-05f, 2.61339628e-05f},
    {-0.0164393671f,   -0.00680834055f,  -0.00311664795f,  -0.00155500066f,  -0.000835138781f,
     -0.000477623165f, -0.000288218522f, -0.000182100513f, -0.000119686614f, -8.13922525e-05f,
     -5.70123848e-05f, -4.09797867e-05f, -3.01309556e-05f, -2.26017783e-05f, -1.72575583e-05f,
     -1.33871799e-05f, -1.0533141e-05f,  -8.39404402e-06f, -6.76702211e-06f, -5.51283256e-06f,
     -4.53418306e-06f, -3.76197477e-06f, -3.14639237e-06f, -2.65102176e-06f, -2.24890528e-06f,
     -1.91984873e-06f, -1.64855805e-06f, -1.42333181e-06f, -1.23513234e-06f, -1.07691676e-06f,
     -9.43151349e-07f, -8.29454109e-07f},
    {0.00353978411f,  0.00131495169f,  0.000540471228f, 0.000242721944f, 0.00011775137f,
     6.10867501e-05f, 3.35904406e-05f, 1.94295808e-05f, 1.17451564e-05f, 7.37885966e-06f,
     4.79515484e-06f, 3.2103535e-06f,  2.2067436e-06f,  1.55284511e-06f, 1.11581312e-06f,
     8.16964928e-07f, 6.08349524e-07f, 4.5997794e-07f,  3.52648158e-07f, 2.73797923e-07f,
     2.15045802e-07f, 1.7069776e-07f,  1.36820717e-07f, 1.10656103e-07f, 9.02413788e-08f,
     7.41619104e-08f, 6.1385478e-08f,  5.11502485e-08f, 4.28879652e-08f, 3.61705403e-08f,
     3.06724388e-08f, 2.61439563e-08f},
    {-0.000471445848f, -0.000162870812f, -6.21975996e-05f, -2.59541121e-05f, -1.17096488e-05f,
     -5.6579579e-06f,  -2.90339744e-06f, -1.57071543e-06f, -8.90163335e-07f, -5.25579367e-07f,
     -3.21773371e-07f, -2.03440706e-07f, -1.32366878e-07f, -8.83610554e-08f, -6.03595325e-08f,
     -4.20966693e-08f, -2.99162686e-08f, -2.16258993e-08f, -1.58777738e-08f, -1.18242527e-08f,
     -8.92101593e-09f, -6.81172985e-09f, -5.25893995e-09f, -4.10182022e-09f, -3.22974714e-09f,
     -2.56556709e-09f, -2.05475392e-09f, -1.65829073e-09f, -1.34794109e-09f, -1.10305298e-09f,
     -9.08361775e-10f, -7.52479301e-10f},
};

struct GeluV {
  // Coefficient k of each lane's interval.
  FI_AVX512 static __m512 coef(int k, __m512i idx) {
    return _mm512_permutex2var_ps(_mm512_load_ps(kGeluHalfErfcx[k]), idx,
                                  _mm512_load_ps(kGeluHalfErfcx[k] + 16));
  }
  FI_AVX512 static __m512 f(__m512 x) {
    // min returns its second operand (|x|) when that is NaN, so NaN propagates.
    const __m512 ax = _mm512_min_ps(v5::set1(15.75f), _mm512_abs_ps(x));
    const __m512 u = _mm512_add_ps(ax, ax);  // 2|x|: interval index and offset, exact
    const __m512 fl = _mm512_roundscale_ps(u, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512i idx = _mm512_cvttps_epi32(fl);
    const __m512 s = _mm512_sub_ps(u, fl);
    __m512 g = coef(5, idx);
    for (int k = 4; k >= 0; --k) g = _mm512_fmadd_ps(g, s, coef(k, idx));
    const __m512 hi = _mm512_mul_ps(ax, ax);
    const __m512 lo = _mm512_fmsub_ps(ax, ax, hi);  // ax^2 - hi, exact
    const __m512 a = _mm512_mul_ps(v5::set1(-0.5f), hi);
    const __m512 b = _mm512_mul_ps(v5::set1(-0.5f), lo);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(a, v5::set1(v5::kLog2e)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_add_ps(_mm512_fnmadd_ps(n, v5::set1(v5::kLn2Hi), a),
                                   _mm512_fnmadd_ps(n, v5::set1(v5::kLn2Lo), b));
    const __m512 tail = _mm512_mul_ps(g, v5::exp_reduced(r, n));  // Phi(-|x|)
    const __mmask16 nonneg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_NLT_UQ);
    return _mm512_mul_ps(x, _mm512_mask_sub_ps(tail, nonneg, v5::set1(1.0f), tail));
  }
};

struct GeluTanhV {
  FI_AVX512 static __m512 f(__m512 x) {
    const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(v5::set1(kGeluTanhC), x), x), x);
    const __m512 u = _mm512_mul_ps(v5::set1(kSqrt2OverPi), _mm512_add_ps(x, x3));
    const __m512 e = v5::exp(_mm512_mul_ps(v5::set1(-2.0f), u));
    return _mm512_div_ps(x, _mm512_add_ps(v5::set1(1.0f), e));
  }
};

// act(gate) for 16 lanes, from the formula of Act (fp32 gates).
template <class Act>
struct ComputedGate {
  template <class T>
  FI_AVX512 __m512 operator()(const T* gate) const {
    return Act::f(v5::load(gate));
  }
  template <class T>
  FI_AVX512 __m512 operator()(const T* gate, __mmask16 m) const {
    return Act::f(v5::load(gate, m));
  }
};

// act(gate) for 16 lanes, gathered from the table of act(-|g|) (see act_table and
// act_from_table: the same operations, so the same bits).
struct TableGate {
  const float* table;
  template <class T>
  FI_AVX512 __m512 operator()(const T* gate) const {
    return from_bits<T>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gate)),
                        static_cast<__mmask16>(0xFFFF));
  }
  template <class T>
  FI_AVX512 __m512 operator()(const T* gate, __mmask16 m) const {
    return from_bits<T>(_mm256_maskz_loadu_epi16(m, gate), m);
  }
  template <class T>
  FI_AVX512 __m512 from_bits(__m256i bits, __mmask16 m) const {
    if constexpr (!kFoldSign<T>) {
      return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, _mm512_cvtepu16_epi32(bits), table,
                                      4);
    }
    const __m256i mag = _mm256_and_si256(bits, _mm256_set1_epi16(kMagnitudeBits));
    const __m512 t =
        _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, _mm512_cvtepu16_epi32(mag), table, 4);
    // On the lanes that use it, g = |g|, so it is widened from the magnitude bits.
    const __m512 g = v5::widen(T{}, mag);
    const __m256i inf = _mm256_set1_epi16(static_cast<int16_t>(kHalfInfBits));
    const __m512 y = _mm512_mask_add_ps(t, _mm256_cmplt_epu16_mask(bits, inf), t, g);
    return _mm512_mask_mov_ps(y, _mm256_cmpeq_epi16_mask(bits, inf), g);
  }
};

// bf16 from the table, a cache line (32 elements) at a time: the even and odd elements of the
// gate and up are split with shifts and masks and the result packed back with a blend
// (v5::bf16_even/odd, store_pairs). Widening and narrowing 16 lanes otherwise costs three
// port-5 shuffles, the port the gathers also need.
template <bool kStream>
FI_AVX512 void act_line_bf16(const TableGate& act, const BFloat16* gate, const BFloat16* up,
                             BFloat16* y) {
  const __m512i g = _mm512_loadu_si512(gate);
  const __m512i u = _mm512_loadu_si512(up);
  const __m512 ae =
      _mm512_i32gather_ps(_mm512_and_si512(g, _mm512_set1_epi32(0xFFFF)), act.table, 4);
  const __m512 ao = _mm512_i32gather_ps(_mm512_srli_epi32(g, 16), act.table, 4);
  v5::store_pairs<kStream>(y, _mm512_mul_ps(ae, v5::bf16_even(u)),
                           _mm512_mul_ps(ao, v5::bf16_odd(u)));
}

// 16 lanes of y = act(gate) * up.
template <class Gate, class T, bool kStream>
FI_AVX512 void act_vec(const Gate& act, const T* gate, const T* up, T* y) {
  const __m512 v = _mm512_mul_ps(act(gate), v5::load(up));
  if constexpr (kStream) {
    v5::stream(y, v);
  } else {
    v5::store(y, v);
  }
}

// How far ahead act_row_avx512 prefetches gate and up into L2. With DRAM-sized tensors the
// gathers (16-bit) or the polynomials (fp32) fill the out-of-order window, so the hardware
// prefetchers alone keep too few lines in flight: 2 KiB ahead gave 10-20 % more bandwidth for
// bf16 and fp32 and ~5 % for fp16 (docs/PERFORMANCE.md); 1-4 KiB were within noise of each other.
constexpr int64_t kPrefetchBytes = 2048;

// y = act(gate) * up over one unit-stride row, a cache line of each input per step (prefetching
// kPrefetchBytes ahead; past the row's end it touches at most the next row or nothing: a
// prefetch never faults), the rest 16 lanes at a time and the tail masked.
template <class Gate, class T, bool kStream>
FI_AVX512 void act_row_avx512(const Gate& act, const T* gate, const T* up, T* y, int64_t d) {
  constexpr int64_t kLine = 64 / sizeof(T);
  constexpr int64_t kAhead = kPrefetchBytes / static_cast<int64_t>(sizeof(T));
  int64_t i = 0;
  for (; i + kLine <= d; i += kLine) {
    v5::prefetch(gate, i + kAhead);
    v5::prefetch(up, i + kAhead);
    if constexpr (std::is_same_v<T, BFloat16> && std::is_same_v<Gate, TableGate>) {
      static_assert(!kFoldSign<BFloat16>);
      act_line_bf16<kStream>(act, gate + i, up + i, y + i);
    } else {
      for (int64_t j = 0; j < kLine; j += 16)
        act_vec<Gate, T, kStream>(act, gate + i + j, up + i + j, y + i + j);
    }
  }
  for (; i + 16 <= d; i += 16) act_vec<Gate, T, kStream>(act, gate + i, up + i, y + i);
  if (i < d) {
    const __mmask16 m = v5::tail_mask(d - i);
    v5::store(y + i, _mm512_mul_ps(act(gate + i, m), v5::load(up + i, m)), m);
  }
}

// Outputs at least this large are written with non-temporal stores (see norm_cpu.cpp).
constexpr int64_t kStreamMinBytes = int64_t{16} << 20;

// Every row of p through act_row_avx512, from the row-block team; rows whose output starts
// 64-byte aligned use non-temporal stores when the whole output is large enough.
template <class T, class Gate>
void rows_avx512(const ActAndMulParams& p, const Gate& act) {
  const auto* in = static_cast<const T*>(p.input);
  auto* out = static_cast<T*>(p.out);
  const int64_t d = p.d;
  const bool stream = p.rows * d * static_cast<int64_t>(sizeof(T)) >= kStreamMinBytes;
  rowio::for_row_blocks(p.rows, 2 * d, kParallelMinElems, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* x = in + r * p.in_stride_row;
      T* y = out + r * p.out_stride_row;
      if (stream && reinterpret_cast<std::uintptr_t>(y) % 64 == 0) {
        act_row_avx512<Gate, T, true>(act, x, x + d, y, d);
      } else {
        act_row_avx512<Gate, T, false>(act, x, x + d, y, d);
      }
    }
    if (stream) v5::sfence();
  });
}

// fp32 inputs (16-bit ones take the table path).
bool try_avx512_f32(const ActAndMulParams& p) {
  if (p.in_stride_d != 1 || p.out_stride_d != 1 || !use_avx512()) return false;
  switch (p.act) {
    case Activation::kSilu:
      rows_avx512<float>(p, ComputedGate<SiluV>{});
      return true;
    case Activation::kGelu:
      rows_avx512<float>(p, ComputedGate<GeluV>{});
      return true;
    case Activation::kGeluTanh:
      rows_avx512<float>(p, ComputedGate<GeluTanhV>{});
      return true;
  }
  return false;
}
#endif

using RowFn = void (*)(float*, const float*, int64_t);

// fp32 inputs of any strides, a row at a time through fp32 buffers.
void rows_f32(const ActAndMulParams& p, RowFn row_fn) {
  const auto* in = static_cast<const float*>(p.input);
  auto* out = static_cast<float*>(p.out);
  const int64_t d = p.d;
  const int64_t chunk = rowio::rows_per_chunk(2 * d);
#pragma omp parallel if (p.rows * d >= kParallelMinElems)
  {
    std::vector<float> gate(static_cast<std::size_t>(d)), up(static_cast<std::size_t>(d));
#pragma omp for schedule(dynamic, chunk)
    for (int64_t r = 0; r < p.rows; ++r) {
      const float* x = in + r * p.in_stride_row;
      rowio::load_row(x, p.in_stride_d, d, gate.data());
      rowio::load_row(x + d * p.in_stride_d, p.in_stride_d, d, up.data());
      row_fn(gate.data(), up.data(), d);
      rowio::store_row(out + r * p.out_stride_row, p.out_stride_d, d, gate.data());
    }
  }
}

RowFn row_function(Activation act) {
#if FLASHINFER_CPU_F16C
  if (rowio::has_avx2()) {
    switch (act) {
      case Activation::kSilu:
        return act_row_avx2<silu_avx2, silu>;
      case Activation::kGelu:
        return act_row_avx2<gelu_avx2, gelu>;
      case Activation::kGeluTanh:
        return act_row_avx2<gelu_tanh_avx2, gelu_tanh>;
    }
  }
#endif
  switch (act) {
    case Activation::kSilu:
      return act_row_scalar<silu>;
    case Activation::kGelu:
      return act_row_scalar<gelu>;
    case Activation::kGeluTanh:
      return act_row_scalar<gelu_tanh>;
  }
  return act_row_scalar<silu>;
}

template <class T>
void dispatch_act(const ActAndMulParams& p) {
  if constexpr (std::is_same_v<T, float>) {
#if FLASHINFER_CPU_AVX512
    if (try_avx512_f32(p)) return;
#endif
    rows_f32(p, row_function(p.act));
  } else {
    const float* table = act_table<T>(p.act);
#if FLASHINFER_CPU_AVX512
    if (p.in_stride_d == 1 && p.out_stride_d == 1 && use_avx512()) {
      return rows_avx512<T>(p, TableGate{table});
    }
#endif
    rows_lut<T>(p, table);
  }
}

}  // namespace

void act_and_mul(const ActAndMulParams& p) {
  dispatch_dtype<CpuElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "act_and_mul", "input", [&]<class T>() { dispatch_act<T>(p); });
}

}  // namespace flashinfer::kernels::cpu
