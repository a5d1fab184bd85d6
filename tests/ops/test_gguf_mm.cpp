// mm_gguf: GEMM on GGUF Q4_1 / Q8_0 weight rows. Hand-checked blocks, then every vector tier
// this CPU has (and the scalar reference) against the fp64 formula sum_k a * (d * q + m) over a
// grid of shapes, dtypes and strides; bad input; record and replay.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gguf_mm_cpu.h"
#include "ops/op_test_util.h"
#include "replay/result_comparators.h"
#include "util/test_util.h"

namespace flashinfer {
namespace {

using kernels::cpu::CpuIsa;

struct IsaCap {  // restores the process-wide tier cap
  explicit IsaCap(CpuIsa isa) : old(kernels::cpu::cpu_isa_cap()) {
    kernels::cpu::set_cpu_isa_cap(isa);
  }
  ~IsaCap() { kernels::cpu::set_cpu_isa_cap(old); }
  CpuIsa old;
};

std::vector<CpuIsa> tiers() {
  std::vector<CpuIsa> v{CpuIsa::kScalar};
  for (CpuIsa i : {CpuIsa::kAvx2, CpuIsa::kAvx512})
    if (i <= kernels::cpu::detected_cpu_isa()) v.push_back(i);
  return v;
}

void put_half(uint8_t* p, float v) {
  const uint16_t h = float_to_half_bits(v);
  std::memcpy(p, &h, 2);
}
double get_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_bits_to_float(h);
}

int64_t block_bytes(bool q4) { return q4 ? 20 : 34; }

// Random blocks: d of either sign across several binades, m likewise, random codes.
std::vector<uint8_t> random_rows(int64_t n, int64_t k, bool q4, uint64_t seed) {
  const int64_t bb = block_bytes(q4), blocks = k / 32;
  std::vector<uint8_t> v(static_cast<size_t>(n * blocks * bb));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> mag(-6.0f, 1.0f);
  for (int64_t i = 0; i < n * blocks; ++i) {
    uint8_t* blk = v.data() + i * bb;
    for (int64_t j = 0; j < bb; ++j) blk[j] = static_cast<uint8_t>(rng());
    const float d = std::exp2(mag(rng)) * ((rng() & 1) ? -1.0f : 1.0f);
    put_half(blk, d);
    if (q4) put_half(blk + 2, -7.5f * std::abs(d) + 0.01f * static_cast<float>(rng() % 7));
  }
  return v;
}

// The n rows of `rows` (row_bytes each) as a [n, row_bytes] view whose rows start `offset`
// bytes into rows of `stride` bytes: each row is written where the view reads it.
Tensor offset_rows(const std::vector<uint8_t>& rows, int64_t n, int64_t row_bytes, int64_t stride,
                   int64_t offset) {
  Tensor wide = Tensor::zeros({n, stride}, DType::kUInt8);
  for (int64_t j = 0; j < n; ++j)
    std::memcpy(static_cast<uint8_t*>(wide.data_ptr()) + j * stride + offset,
                rows.data() + j * row_bytes, static_cast<size_t>(row_bytes));
  return wide.slice(1, offset, offset + row_bytes);
}

Tensor bytes_tensor(const std::vector<uint8_t>& v, int64_t n) {
  Tensor t = Tensor::empty({n, static_cast<int64_t>(v.size()) / n}, DType::kUInt8);
  std::memcpy(t.data_ptr(), v.data(), v.size());
  return t;
}

// The GGUF formula in fp64: w[j, t] = d * q + m (Q4_1) or d * q (Q8_0).
std::vector<double> dequant_fp64(const std::vector<uint8_t>& rows, int64_t n, int64_t k, bool q4) {
  const int64_t bb = block_bytes(q4), blocks = k / 32;
  std::vector<double> w(static_cast<size_t>(n * k));
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = rows.data() + (j * blocks + b) * bb;
      double* o = w.data() + j * k + b * 32;
      const double d = get_half(blk);
      if (q4) {
        const double m = get_half(blk + 2);
        for (int t = 0; t < 16; ++t) {
          o[t] = d * (blk[4 + t] & 15) + m;
          o[t + 16] = d * (blk[4 + t] >> 4) + m;
        }
      } else {
        for (int t = 0; t < 32; ++t) o[t] = d * static_cast<int8_t>(blk[2 + t]);
      }
    }
  }
  return w;
}

// |m| of the Q4_1 block holding value t of row j (0 for Q8_0): the split path's bound needs it.
std::vector<double> block_mins(const std::vector<uint8_t>& rows, int64_t n, int64_t k, bool q4) {
  const int64_t bb = block_bytes(q4), blocks = k / 32;
  std::vector<double> mins(static_cast<size_t>(n * k), 0.0);
  if (q4)
    for (int64_t i = 0; i < n * blocks; ++i)
      for (int t = 0; t < 32; ++t)
        mins[static_cast<size_t>(i * 32 + t)] = std::abs(get_half(rows.data() + i * bb + 2));
  return mins;
}

struct Int8PathOff {  // reaches the bf16 split path on a CPU that has the int8 one
  Int8PathOff() { kernels::cpu::set_gguf_mm_int8_path_enabled(false); }
  ~Int8PathOff() { kernels::cpu::set_gguf_mm_int8_path_enabled(true); }
};

// Which activation path mm_gguf takes (gguf_mm_cpu.h): fp32 (exact activations), two bf16
// parts (Q4_1, AVX-512 BF16 + VBMI) or two int8 parts (AVX-512 VNNI); both split paths only
// for m = 1 and fp32/fp16 activations, the int8 one first.
enum class ActPath { kFp32, kBf16x2, kInt8x2 };
ActPath act_path(bool q4, int64_t m, DType a_dtype, CpuIsa isa) {
  if (m != 1 || a_dtype == DType::kBFloat16 || isa != CpuIsa::kAvx512) return ActPath::kFp32;
  if (kernels::cpu::gguf_mm_has_int8_path()) return ActPath::kInt8x2;
  if (q4 && kernels::cpu::gguf_mm_has_split_path()) return ActPath::kBf16x2;
  return ActPath::kFp32;
}

// Per activation, how far the path's representation may be from it: 2^-16 |x| for two bf16
// parts; max |x| over its block of 32 / 32512 for two int8 parts (s2 = max / (127 * 256), half
// of it unless lo saturates; 32000 leaves room for the fp32 rounding of the scales).
std::vector<double> act_errors(const Tensor& a, ActPath path) {
  std::vector<double> v = a.to_double_vector();
  const int64_t k = a.size(1);
  if (path == ActPath::kBf16x2) {
    for (double& x : v) x = std::exp2(-16) * std::abs(x);
  } else if (path == ActPath::kInt8x2) {
    for (size_t b0 = 0; b0 < v.size(); b0 += 32) {
      double amax = 0;
      for (size_t t = b0; t < b0 + 32; ++t) amax = std::max(amax, std::abs(v[t]));
      for (size_t t = b0; t < b0 + 32; ++t) v[t] = amax / 32000.0;
    }
  } else {
    std::fill(v.begin(), v.end(), 0.0);
  }
  (void)k;
  return v;
}

// Checks out [m, n] against the fp64 product: |out - ref| <= fp32 accumulation error (bounded
// by 2^-20 * k * sum |a w|, generous) plus half an ulp of the output dtype. With `mins` (a split
// activation path), the activations' representation adds err(x) per value times
// |d q| <= |w| + |m| (err from act_errors; 2^-16 |x| when not given), and the fp32 sums
// d * sum q a and m * sum a (which cancel when m ~ -8 d) are bounded by |a| (|w| + 2 |m|) per
// value instead of |a w|.
::testing::AssertionResult matches_fp64(const Tensor& out, const Tensor& a,
                                        const std::vector<double>& w, int64_t n,
                                        const std::vector<double>* mins = nullptr,
                                        const std::vector<double>* errs = nullptr) {
  const int64_t m = a.size(0), k = a.size(1);
  const std::vector<double> av = a.to_double_vector(), ov = out.to_double_vector();
  const double out_rel = out.dtype() == DType::kBFloat16  ? std::exp2(-8)
                         : out.dtype() == DType::kFloat16 ? std::exp2(-11)
                                                          : std::exp2(-24);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0, mag = 0, split = 0;
      for (int64_t t = 0; t < k; ++t) {
        const double x = av[static_cast<size_t>(i * k + t)];
        const double wv = w[static_cast<size_t>(j * k + t)];
        ref += x * wv;
        if (mins == nullptr) {
          mag += std::abs(x * wv);
        } else {
          const double mn = (*mins)[static_cast<size_t>(j * k + t)];
          const double e =
              errs ? (*errs)[static_cast<size_t>(i * k + t)] : std::exp2(-16) * std::abs(x);
          mag += std::abs(x) * (std::abs(wv) + 2 * mn);
          split += e * (std::abs(wv) + mn);
        }
      }
      const double got = ov[static_cast<size_t>(i * n + j)];
      const double tol = std::exp2(-20) * static_cast<double>(k) / 32.0 * mag + split +
                         out_rel * std::abs(ref) + 1e-30;
      if (!(std::abs(got - ref) <= tol)) {
        return ::testing::AssertionFailure() << "out[" << i << ", " << j << "] = " << got
                                             << ", fp64 " << ref << " (tolerance " << tol << ")";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(MmGguf, HandCheckedBlocks) {
  // Q4_1, k = 32: d = 0.5, m = -1, codes 0..15 in the low nibbles, 15 - j in the high ones:
  // w = 0.5 q - 1. With a = 1 everywhere the sum is 0.5 * (sum of codes) - 32 =
  // 0.5 * (120 + 120) - 32 = 88; with a = (1, 0, 0, ...) it is w[0] = -1.
  std::vector<uint8_t> q4(20);
  put_half(q4.data(), 0.5f);
  put_half(q4.data() + 2, -1.0f);
  for (int j = 0; j < 16; ++j)
    q4[4 + static_cast<size_t>(j)] = static_cast<uint8_t>(j | (15 - j) << 4);
  // Q8_0, k = 32: d = 0.25, q[j] = j - 16: w = 0.25 (j - 16); sum = 0.25 * (496 - 512) = -4.
  std::vector<uint8_t> q8(34);
  put_half(q8.data(), 0.25f);
  for (int j = 0; j < 32; ++j) q8[2 + static_cast<size_t>(j)] = static_cast<uint8_t>(j - 16);
  Tensor ones = Tensor::full({1, 32}, 1.0, DType::kFloat32);
  std::vector<double> e0(32, 0.0), e16(32, 0.0);
  e0[0] = 1.0;
  e16[16] = 1.0;  // picks the high nibble of byte 0: code 15 -> 6.5
  Tensor a = Tensor::from_vector(
      [&] {
        std::vector<double> v(ones.to_double_vector());
        v.insert(v.end(), e0.begin(), e0.end());
        v.insert(v.end(), e16.begin(), e16.end());
        return v;
      }(),
      {3, 32}, DType::kFloat32);
  for (CpuIsa isa : tiers()) {
    IsaCap cap(isa);
    EXPECT_EQ(
        mm_gguf(a, bytes_tensor(q4, 1), "Q4_1", std::nullopt, DType::kFloat32).to_double_vector(),
        (std::vector<double>{88.0, -1.0, 6.5}))
        << "tier " << static_cast<int>(isa);
    EXPECT_EQ(
        mm_gguf(a, bytes_tensor(q8, 1), "Q8_0", std::nullopt, DType::kFloat32).to_double_vector(),
        (std::vector<double>{-4.0, -4.0, 0.0}))
        << "tier " << static_cast<int>(isa);
  }
}

TEST(MmGguf, EveryTierMatchesTheFp64Formula) {
  struct Shape3 {
    int64_t m, n, k;
  };
  // Decode (m = 1) and prefill shapes, rows not multiples of any tile, k from one block up.
  // From 16 rows on AVX-512 runs the packed panel GEMM: {16, 33, 64} and {29, 40, 96} cover a
  // partial last panel of 32 weight rows and a last row tile short of 12.
  const Shape3 shapes[] = {{1, 1, 32}, {1, 7, 64},   {1, 13, 576}, {2, 5, 96},   {3, 9, 128},
                           {5, 3, 32}, {7, 11, 160}, {13, 6, 64},  {16, 33, 64}, {29, 40, 96}};
  uint64_t seed = 1;
  for (bool q4 : {true, false}) {
    for (const Shape3& s : shapes) {
      const std::vector<uint8_t> rows = random_rows(s.n, s.k, q4, seed++);
      const std::vector<double> w = dequant_fp64(rows, s.n, s.k, q4);
      const std::vector<double> mins = block_mins(rows, s.n, s.k, q4);
      const Tensor b = bytes_tensor(rows, s.n);
      for (DType adt : {DType::kBFloat16, DType::kFloat32, DType::kFloat16}) {
        const Tensor a = testing::rand_tensor({s.m, s.k}, adt, seed++, -2.0, 2.0);
        for (DType odt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
          for (CpuIsa isa : tiers()) {
            IsaCap cap(isa);
            const Tensor out = mm_gguf(a, b, q4 ? "Q4_1" : "Q8_0", std::nullopt, odt);
            ASSERT_EQ(out.shape(), (Shape{s.m, s.n}));
            ASSERT_EQ(out.dtype(), odt);
            const ActPath path = act_path(q4, s.m, adt, isa);
            const std::vector<double> errs = act_errors(a, path);
            EXPECT_TRUE(
                matches_fp64(out, a, w, s.n, path != ActPath::kFp32 ? &mins : nullptr, &errs))
                << (q4 ? "Q4_1" : "Q8_0") << " m=" << s.m << " n=" << s.n << " k=" << s.k
                << " a=" << dtype_name(adt) << " out=" << dtype_name(odt)
                << " tier=" << static_cast<int>(isa);
          }
        }
      }
    }
  }
}

// The packed prefill path splits the activation rows into chunks of about 1 MiB (170 rows at
// k = 1536): 180 rows run as two chunks, each repacking the panels (one partial).
TEST(MmGguf, PackedPathAcrossActivationChunks) {
  const int64_t m = 180, n = 40, k = 1536;
  uint64_t seed = 900;
  for (bool q4 : {true, false}) {
    const std::vector<uint8_t> rows = random_rows(n, k, q4, seed++);
    const std::vector<double> w = dequant_fp64(rows, n, k, q4);
    const Tensor a = testing::rand_tensor({m, k}, DType::kFloat32, seed++, -2.0, 2.0);
    const Tensor out =
        mm_gguf(a, bytes_tensor(rows, n), q4 ? "Q4_1" : "Q8_0", std::nullopt, DType::kFloat32);
    EXPECT_TRUE(matches_fp64(out, a, w, n)) << (q4 ? "Q4_1" : "Q8_0");
  }
}

// The split path (fp32 activations as two bf16 parts, m = 1) at the model's shapes: within its
// derived bound of the fp64 formula (2^-16 |a| |d q| per value plus the fp32 sums), and at
// least 32 times closer to it than the same activations rounded to bf16 (one part: 2^-8 |a|
// per value, the error that changed the chat's greedy answer; two parts are 2^8 finer). The
// scalar fp32 reference's error is printed for comparison.
TEST(MmGguf, SplitActivationPathIsFp32Accurate) {
  if (!kernels::cpu::gguf_mm_has_split_path()) GTEST_SKIP() << "no AVX-512 BF16 + VBMI here";
  const Int8PathOff int8_off;
  uint64_t seed = 500;
  for (int64_t k : {int64_t{32}, int64_t{576}, int64_t{1536}}) {
    const int64_t n = 67;
    const std::vector<uint8_t> rows = random_rows(n, k, true, seed++);
    const std::vector<double> w = dequant_fp64(rows, n, k, true);
    const std::vector<double> mins = block_mins(rows, n, k, true);
    const Tensor b = bytes_tensor(rows, n);
    const Tensor a = testing::rand_tensor({1, k}, DType::kFloat32, seed++, -3.0, 3.0);
    const Tensor a_bf16 = a.to(DType::kBFloat16);
    Tensor split, one_part, scalar;
    {
      IsaCap cap(CpuIsa::kAvx512);
      split = mm_gguf(a, b, "Q4_1", std::nullopt, DType::kFloat32);
      one_part = mm_gguf(a_bf16, b, "Q4_1", std::nullopt, DType::kFloat32);
    }
    {
      IsaCap cap(CpuIsa::kScalar);
      scalar = mm_gguf(a, b, "Q4_1", std::nullopt, DType::kFloat32);
    }
    EXPECT_TRUE(matches_fp64(split, a, w, n, &mins)) << "k=" << k;
    const std::vector<double> av = a.to_double_vector(), sv = split.to_double_vector(),
                              ov = one_part.to_double_vector(), rv = scalar.to_double_vector();
    double err_split = 0, err_one = 0, err_scalar = 0;
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0;
      for (int64_t t = 0; t < k; ++t)
        ref += av[static_cast<size_t>(t)] * w[static_cast<size_t>(j * k + t)];
      err_split += std::abs(sv[static_cast<size_t>(j)] - ref);
      err_one += std::abs(ov[static_cast<size_t>(j)] - ref);
      err_scalar += std::abs(rv[static_cast<size_t>(j)] - ref);
    }
    EXPECT_LE(32.0 * err_split, err_one) << "k=" << k;
    std::printf("k=%lld: sum |err| vs fp64: two bf16 parts %.3g, one part %.3g, scalar fp32 %.3g\n",
                static_cast<long long>(k), err_split, err_one, err_scalar);
  }
}

// The int8 path (fp32 activations as two int8 parts per block, m = 1) at the model's shapes,
// Q4_1 and Q8_0: within its derived bound of the fp64 formula (max |x| of the block / 32512
// per value times |d q|, plus the fp32 sums), and at least 32 times closer to it than the same
// activations rounded to bf16 (one part, the error that changed the chat's greedy answer).
TEST(MmGguf, Int8ActivationPathIsFp32Accurate) {
  if (!kernels::cpu::gguf_mm_has_int8_path()) GTEST_SKIP() << "no AVX-512 VNNI here";
  uint64_t seed = 900;
  for (bool q4 : {true, false}) {
    for (int64_t k : {int64_t{32}, int64_t{576}, int64_t{1536}}) {
      const int64_t n = 67;
      const std::vector<uint8_t> rows = random_rows(n, k, q4, seed++);
      const std::vector<double> w = dequant_fp64(rows, n, k, q4);
      const std::vector<double> mins = block_mins(rows, n, k, q4);
      const Tensor b = bytes_tensor(rows, n);
      const char* type = q4 ? "Q4_1" : "Q8_0";
      const Tensor a = testing::rand_tensor({1, k}, DType::kFloat32, seed++, -3.0, 3.0);
      Tensor two, one_bf16, scalar;
      {
        IsaCap cap(CpuIsa::kAvx512);
        two = mm_gguf(a, b, type, std::nullopt, DType::kFloat32);
      }
      {
        IsaCap cap(CpuIsa::kScalar);
        one_bf16 = mm_gguf(a.to(DType::kBFloat16), b, type, std::nullopt, DType::kFloat32);
        scalar = mm_gguf(a, b, type, std::nullopt, DType::kFloat32);
      }
      const std::vector<double> errs = act_errors(a, ActPath::kInt8x2);
      EXPECT_TRUE(matches_fp64(two, a, w, n, &mins, &errs)) << type << " k=" << k;
      const std::vector<double> av = a.to_double_vector(), tv = two.to_double_vector(),
                                ov = one_bf16.to_double_vector(), rv = scalar.to_double_vector();
      double err_two = 0, err_one = 0, err_scalar = 0;
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0;
        for (int64_t t = 0; t < k; ++t)
          ref += av[static_cast<size_t>(t)] * w[static_cast<size_t>(j * k + t)];
        err_two += std::abs(tv[static_cast<size_t>(j)] - ref);
        err_one += std::abs(ov[static_cast<size_t>(j)] - ref);
        err_scalar += std::abs(rv[static_cast<size_t>(j)] - ref);
      }
      EXPECT_LE(32.0 * err_two, err_one) << type << " k=" << k;
      std::printf(
          "%s k=%lld: sum |err| vs fp64: two int8 parts %.3g, bf16 activations %.3g, scalar "
          "fp32 %.3g\n",
          type, static_cast<long long>(k), err_two, err_one, err_scalar);
    }
  }
}

// Blocks of zeros and of tiny values, a strided fp16 row, and non-finite values: the int8 path
// (or the fp32 path it falls back to) stays within the bound, and inf/NaN come out where the
// scalar reference puts them.
TEST(MmGguf, Int8PathEdgeCases) {
  if (!kernels::cpu::gguf_mm_has_int8_path()) GTEST_SKIP() << "no AVX-512 VNNI here";
  const int64_t n = 9, k = 128;
  for (bool q4 : {true, false}) {
    const char* type = q4 ? "Q4_1" : "Q8_0";
    const std::vector<uint8_t> rows = random_rows(n, k, q4, q4 ? 31 : 32);
    const std::vector<double> w = dequant_fp64(rows, n, k, q4);
    const std::vector<double> mins = block_mins(rows, n, k, q4);
    const Tensor b = bytes_tensor(rows, n);
    std::vector<double> x =
        testing::rand_tensor({1, k}, DType::kFloat32, 7, -2.0, 2.0).to_double_vector();
    for (int t = 0; t < 32; ++t) x[static_cast<size_t>(t)] = 0.0;  // block 0: zeros
    x[40] = 1e5;                                                   // one large value
    const IsaCap cap(CpuIsa::kAvx512);
    for (bool tiny : {false, true}) {
      if (tiny)  // block 3 below the smallest scale the path takes: the fp32 path runs
        for (int t = 96; t < 128; ++t) x[static_cast<size_t>(t)] = 1e-30 * (t - 100);
      const Tensor a = Tensor::from_vector(x, {1, k}, DType::kFloat32);
      const Tensor out = mm_gguf(a, b, type, std::nullopt, DType::kFloat32);
      const std::vector<double> errs = act_errors(a, ActPath::kInt8x2);
      EXPECT_TRUE(matches_fp64(out, a, w, n, &mins, &errs)) << type << " tiny=" << tiny;
    }
    // fp16 activations with a column stride of 2.
    Tensor wide = testing::rand_tensor({1, 2 * k}, DType::kFloat16, 8, -2.0, 2.0);
    const Tensor a16 = wide.slice(1, 0, 2 * k, 2);
    const Tensor out16 = mm_gguf(a16, b, type, std::nullopt, DType::kFloat32);
    const std::vector<double> errs16 = act_errors(a16.contiguous(), ActPath::kInt8x2);
    EXPECT_TRUE(matches_fp64(out16, a16.contiguous(), w, n, &mins, &errs16)) << type;
    // inf and NaN: the same non-finite pattern as the scalar reference.
    for (double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
      std::vector<double> xb = x;
      xb[70] = bad;
      const Tensor a = Tensor::from_vector(xb, {1, k}, DType::kFloat32);
      const std::vector<double> got =
          mm_gguf(a, b, type, std::nullopt, DType::kFloat32).to_double_vector();
      std::vector<double> ref;
      {
        IsaCap scalar(CpuIsa::kScalar);
        ref = mm_gguf(a, b, type, std::nullopt, DType::kFloat32).to_double_vector();
      }
      for (int64_t j = 0; j < n; ++j) {
        const double g = got[static_cast<size_t>(j)], r = ref[static_cast<size_t>(j)];
        EXPECT_EQ(std::isnan(g), std::isnan(r)) << type << " j=" << j;
        EXPECT_EQ(std::isinf(g), std::isinf(r)) << type << " j=" << j;
      }
    }
  }
}

TEST(MmGguf, StridedOperandsAndOut) {
  const int64_t m = 4, n = 6, k = 64;
  const std::vector<uint8_t> rows = random_rows(n, k, true, 77);
  const std::vector<double> w = dequant_fp64(rows, n, k, true);
  // b rows with padding between them (row stride 50 > 40 bytes).
  Tensor wide_b = Tensor::zeros({n, 50}, DType::kUInt8);
  for (int64_t j = 0; j < n; ++j)
    std::memcpy(static_cast<uint8_t*>(wide_b.data_ptr()) + j * 50, rows.data() + j * 40, 40);
  Tensor b = wide_b.slice(1, 0, 40);
  Tensor a = testing::strided_rand({m, k}, DType::kBFloat16, 5);
  Tensor out_base = Tensor::full({m, 2 * n}, 3.0, DType::kFloat32);
  Tensor out = out_base.slice(1, 0, n);
  for (CpuIsa isa : tiers()) {
    IsaCap cap(isa);
    Tensor r = mm_gguf(a, b, "Q4_1", out, DType::kFloat32);
    EXPECT_EQ(r.data_ptr(), out.data_ptr());
    EXPECT_TRUE(matches_fp64(out.contiguous(), a, w, n)) << "tier " << static_cast<int>(isa);
    for (double v : out_base.slice(1, n, 2 * n).to_double_vector()) ASSERT_EQ(v, 3.0);
  }
}

// The layout of MmGgufCuda.StridedOperandsAndOut on the CPU: weight rows at byte offset 3 with
// an odd stride (43), activations with column stride 2, out with column stride 2, for m below and
// above the CUDA kernels' switch (16), so the layout itself is checked where CI runs.
TEST(MmGguf, StridedOperandsAndOutOffsetRows) {
  for (int64_t m : {int64_t{5}, int64_t{40}}) {
    const int64_t n = 35, k = 64;
    const std::vector<uint8_t> rows = random_rows(n, k, true, 40 + static_cast<uint64_t>(m));
    const std::vector<double> w = dequant_fp64(rows, n, k, true);
    const Tensor b = offset_rows(rows, n, 40, 43, 3);
    ASSERT_EQ(b.storage_offset(), 3);
    ASSERT_EQ(b.stride(0), 43);
    for (int64_t j = 0; j < n; ++j)
      ASSERT_EQ(
          std::memcmp(static_cast<const uint8_t*>(b.data_ptr()) + j * 43, rows.data() + j * 40, 40),
          0);
    const Tensor wide_a = testing::rand_tensor({m, 2 * k}, DType::kFloat16, 6, -2.0, 2.0);
    const Tensor a = wide_a.slice(1, 0, 2 * k, 2);
    const Tensor out_base = Tensor::full({m, 2 * n}, 3.0, DType::kFloat32);
    const Tensor out = out_base.slice(1, 0, 2 * n, 2);
    const Tensor r = mm_gguf(a, b, "Q4_1", out, DType::kFloat32);
    EXPECT_EQ(r.data_ptr(), out.data_ptr());
    EXPECT_TRUE(matches_fp64(out.contiguous(), a.contiguous(), w, n)) << "m=" << m;
    for (double v : out_base.slice(1, 1, 2 * n, 2).to_double_vector()) ASSERT_EQ(v, 3.0);
  }
}

TEST(MmGguf, BadInputGivesClearErrors) {
  Tensor a = Tensor::zeros({2, 64}, DType::kBFloat16);
  Tensor b4 = Tensor::zeros({3, 40}, DType::kUInt8);
  EXPECT_FI_ERROR(mm_gguf(a, b4, "Q4_0"), "mm_gguf", "quant_type");
  EXPECT_FI_ERROR(mm_gguf(a, b4, "q4_1"), "mm_gguf", "quant_type");
  EXPECT_FI_ERROR(mm_gguf(a, b4, "Q8_0"), "mm_gguf", "b");  // 40 bytes is not a Q8_0 row
  EXPECT_FI_ERROR(mm_gguf(a, Tensor::zeros({3, 41}, DType::kUInt8), "Q4_1"), "mm_gguf", "b");
  EXPECT_FI_ERROR(mm_gguf(a, Tensor::zeros({3, 40}, DType::kInt8), "Q4_1"), "mm_gguf", "b");
  EXPECT_FI_ERROR(mm_gguf(a, Tensor::zeros({120}, DType::kUInt8), "Q4_1"), "mm_gguf", "b");
  EXPECT_FI_ERROR(mm_gguf(a, Tensor::zeros({3, 80}, DType::kUInt8).slice(1, 0, 80, 2), "Q4_1"),
                  "mm_gguf", "b");
  EXPECT_FI_ERROR(mm_gguf(Tensor::zeros({2, 48}, DType::kBFloat16), b4, "Q4_1"), "mm_gguf", "a");
  EXPECT_FI_ERROR(mm_gguf(Tensor::zeros({64}, DType::kBFloat16), b4, "Q4_1"), "mm_gguf", "a");
  EXPECT_FI_ERROR(mm_gguf(Tensor::zeros({2, 64}, DType::kInt32), b4, "Q4_1"), "mm_gguf", "a");
  EXPECT_FI_ERROR(mm_gguf(Tensor::zeros({0, 64}, DType::kBFloat16), b4, "Q4_1"), "mm_gguf", "a");
  EXPECT_FI_ERROR(mm_gguf(Tensor(), b4, "Q4_1"), "mm_gguf", "a");
  EXPECT_FI_ERROR(mm_gguf(a, b4, "Q4_1", Tensor::zeros({2, 4}, DType::kBFloat16)), "mm_gguf",
                  "out");
  EXPECT_FI_ERROR(mm_gguf(a, b4, "Q4_1", Tensor::zeros({2, 3}, DType::kFloat32)), "mm_gguf", "out");
  EXPECT_FI_ERROR(mm_gguf(a, b4, "Q4_1", std::nullopt, DType::kInt32), "mm_gguf", "out_dtype");
  static uint8_t fake[120] = {};
  Tensor bd = Tensor::from_blob(fake, {3, 40}, {40, 1}, DType::kUInt8, Device::cuda(0));
  EXPECT_FI_ERROR(mm_gguf(a, bd, "Q4_1"), "mm_gguf", "b");
}

TEST(MmGguf, RecordedCallsReplayIdentically) {
  const std::vector<uint8_t> rows = random_rows(5, 64, false, 9);
  Tensor b = bytes_tensor(rows, 5);
  Tensor a = testing::rand_tensor({3, 64}, DType::kBFloat16, 4);
  std::vector<testing::RecordingObserver::Call> calls;
  {
    testing::RecordingScope scope;
    mm_gguf(a, b, "Q8_0");
    mm_gguf(a, bytes_tensor(random_rows(3, 64, true, 10), 3), "Q4_1", std::nullopt,
            DType::kFloat32);
    calls = scope.observer().calls;
  }  // the replays below are not recorded
  ASSERT_EQ(calls.size(), 2u);
  for (const auto& c : calls) {
    EXPECT_EQ(c.name, "mm_gguf");
    EXPECT_TRUE(testing::replays_identically(c));
  }
  const OpDecl* d = OpRegistry::global().find("mm_gguf");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->module, "flashinfer_cpp.gguf");
}

// Replay's comparator for mm_gguf (src/api/gguf_mm.cpp): a result summed in another order (the
// scalar tier against the one this machine picks, with its int8 split where it has VNNI: what a
// GPU recording replayed on the CPU meets) passes; a result off by half of one product (a term
// a wrong kernel lost or misread) fails, with the count of such elements. Also through a dump
// recorded on the scalar tier and replayed on the machine's own.
TEST(MmGguf, ReplayComparatorTakesAnotherSumOrderButNotAWrongValue) {
  const int64_t m = 1, n = 96, k = 576;
  for (bool q4 : {true, false}) {
    SCOPED_TRACE(q4 ? "Q4_1" : "Q8_0");
    const std::vector<uint8_t> rows = random_rows(n, k, q4, q4 ? 61 : 62);
    const Tensor b = bytes_tensor(rows, n);
    const Tensor a = testing::rand_tensor({m, k}, DType::kFloat32, 63, -3.0, 3.0);
    const char* type = q4 ? "Q4_1" : "Q8_0";
    Tensor exact;
    {
      const Int8PathOff off;
      kernels::cpu::set_cpu_isa_cap(kernels::cpu::CpuIsa::kScalar);
      exact = mm_gguf(a, b, type, std::nullopt, DType::kFloat32);
      kernels::cpu::set_cpu_isa_cap(kernels::cpu::CpuIsa::kAvx512);
    }
    const Tensor fast = mm_gguf(a, b, type, std::nullopt, DType::kFloat32);
    const auto* cmp = detail::result_comparator("mm_gguf");
    ASSERT_NE(cmp, nullptr);
    const std::vector<Value> args = {Value(a), Value(b), Value(std::string(type)), Value(),
                                     Value(DType::kFloat32)};
    const detail::CompareFn compare = [](const std::string& key, const Tensor& x, const Tensor& y) {
      return replay::compare_tensors(key, x, y);
    };
    auto check = [&](const Tensor& actual, const Tensor& expected) {
      detail::ResultCheck out;
      EXPECT_TRUE((*cmp)(args, {{"result", actual}}, {{"result", expected}}, compare, out));
      EXPECT_FALSE(out.note.empty());
      EXPECT_EQ(out.comparisons.size(), 1u);
      return out.comparisons.empty() ? replay::TensorComparison{} : out.comparisons[0];
    };
    EXPECT_TRUE(check(fast, exact).match);
    EXPECT_TRUE(check(exact, fast).match);
    // Two elements off by half their largest product: both found.
    std::vector<double> off = exact.to_double_vector();
    const std::vector<double> av = a.to_double_vector();
    const std::vector<double> w = dequant_fp64(rows, n, k, q4);
    for (int64_t j : {int64_t{5}, int64_t{77}}) {
      double big = 0.0;
      for (int64_t t = 0; t < k; ++t) big = std::max(big, std::fabs(av[t] * w[j * k + t]));
      off[static_cast<std::size_t>(j)] += 0.5 * big;
    }
    const replay::TensorComparison c =
        check(Tensor::from_vector(off, {m, n}, DType::kFloat32), fast);
    EXPECT_FALSE(c.match);
    EXPECT_EQ(c.mismatches, 2);
    EXPECT_EQ(c.first_mismatch, 5);
  }
  // Recorded on the scalar tier, replayed from disk on this machine's own.
  const std::vector<uint8_t> rows = random_rows(n, k, true, 64);
  const Tensor b = bytes_tensor(rows, n);
  const Tensor a = testing::rand_tensor({m, k}, DType::kFloat32, 65, -3.0, 3.0);
  namespace fs = std::filesystem;
  fs::path dir;
  {
    const Int8PathOff off;
    kernels::cpu::set_cpu_isa_cap(kernels::cpu::CpuIsa::kScalar);
    dir = testing::record_dump("gguf_order",
                               [&] { mm_gguf(a, b, "Q4_1", std::nullopt, DType::kFloat32); });
    kernels::cpu::set_cpu_isa_cap(kernels::cpu::CpuIsa::kAvx512);
  }
  int replayed = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_directory()) continue;
    ++replayed;
    const replay::Result r = replay::replay_from_dump(e.path().string());
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.error;
  }
  EXPECT_EQ(replayed, 1);
  fs::remove_all(dir);
}

// ---- CUDA (skipped without a device; compiled, never run on this project's CI machines) ----

// The hand-checked blocks of HandCheckedBlocks on the GPU: m = 3 takes the warp-per-row kernel.
TEST(MmGgufCuda, HandCheckedBlocks) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  std::vector<uint8_t> q4(20);
  put_half(q4.data(), 0.5f);
  put_half(q4.data() + 2, -1.0f);
  for (int j = 0; j < 16; ++j)
    q4[4 + static_cast<size_t>(j)] = static_cast<uint8_t>(j | (15 - j) << 4);
  std::vector<uint8_t> q8(34);
  put_half(q8.data(), 0.25f);
  for (int j = 0; j < 32; ++j) q8[2 + static_cast<size_t>(j)] = static_cast<uint8_t>(j - 16);
  std::vector<double> v(32, 1.0);
  for (int t = 0; t < 64; ++t) v.push_back(t == 0 || t == 32 + 16 ? 1.0 : 0.0);
  const Device dev = Device::cuda(0);
  const Tensor a = Tensor::from_vector(v, {3, 32}, DType::kFloat32).to(dev);
  EXPECT_EQ(mm_gguf(a, bytes_tensor(q4, 1).to(dev), "Q4_1", std::nullopt, DType::kFloat32)
                .to_double_vector(),
            (std::vector<double>{88.0, -1.0, 6.5}));
  EXPECT_EQ(mm_gguf(a, bytes_tensor(q8, 1).to(dev), "Q8_0", std::nullopt, DType::kFloat32)
                .to_double_vector(),
            (std::vector<double>{-4.0, -4.0, 0.0}));
}

// Both kernels (m < 16: warp per weight row, 8 activation rows per warp; m >= 16: 32 x 32 tiles,
// more than one tile each way), Q4_1 and Q8_0, every a and out dtype, against the fp64 formula
// within the bound the CPU tiers meet (fp32 accumulation error plus half an ulp of out_dtype).
// test_backend_ops compares CUDA with the CPU directly.
TEST(MmGgufCuda, MatchesTheFp64Formula) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  struct Shape3 {
    int64_t m, n, k;
  };
  const Shape3 shapes[] = {{1, 13, 576}, {3, 5, 96},   {9, 37, 64},
                           {15, 7, 160}, {16, 33, 64}, {70, 45, 96}};
  const Device dev = Device::cuda(0);
  uint64_t seed = 3000;
  for (bool q4 : {true, false}) {
    for (const Shape3& s : shapes) {
      const std::vector<uint8_t> rows = random_rows(s.n, s.k, q4, seed++);
      const std::vector<double> w = dequant_fp64(rows, s.n, s.k, q4);
      const Tensor b = bytes_tensor(rows, s.n);
      const Tensor db = b.to(dev);
      for (DType adt : {DType::kBFloat16, DType::kFloat32, DType::kFloat16}) {
        const Tensor a = testing::rand_tensor({s.m, s.k}, adt, seed++, -2.0, 2.0);
        for (DType odt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
          const char* type = q4 ? "Q4_1" : "Q8_0";
          const Tensor got = mm_gguf(a.to(dev), db, type, std::nullopt, odt);
          ASSERT_EQ(got.device(), dev);
          ASSERT_EQ(got.shape(), (Shape{s.m, s.n}));
          ASSERT_EQ(got.dtype(), odt);
          const Tensor host = got.to(Device::cpu());
          EXPECT_TRUE(matches_fp64(host, a, w, s.n))
              << type << " m=" << s.m << " n=" << s.n << " k=" << s.k << " a=" << dtype_name(adt)
              << " out=" << dtype_name(odt);
        }
      }
    }
  }
}

// Strided activations (column stride 2), weight rows at an odd byte stride (the fp16 scales
// then sit at odd addresses: the kernel reads bytes) and a strided out= whose neighbours must
// stay untouched, for both kernels.
TEST(MmGgufCuda, StridedOperandsAndOut) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device dev = Device::cuda(0);
  for (int64_t m : {int64_t{5}, int64_t{40}}) {
    const int64_t n = 35, k = 64;
    const std::vector<uint8_t> rows = random_rows(n, k, true, 40 + static_cast<uint64_t>(m));
    const std::vector<double> w = dequant_fp64(rows, n, k, true);
    // Rows at byte offset 3 with stride 43. (This test once wrote the rows at offset 0 and
    // read them at offset 3, which failed on the H100; StridedOperandsAndOutOffsetRows checks
    // the same layout on the CPU.)
    const Tensor b = testing::to_keep_layout(offset_rows(rows, n, 40, 43, 3), dev);
    const Tensor wide_a = testing::rand_tensor({m, 2 * k}, DType::kFloat16, 6, -2.0, 2.0);
    const Tensor a = wide_a.slice(1, 0, 2 * k, 2);
    const Tensor out_base = Tensor::full({m, 2 * n}, 3.0, DType::kFloat32).to(dev);
    const Tensor out = out_base.slice(1, 0, 2 * n, 2);
    const Tensor r = mm_gguf(testing::to_keep_layout(a, dev), b, "Q4_1", out, DType::kFloat32);
    EXPECT_EQ(r.data_ptr(), out.data_ptr());
    EXPECT_TRUE(matches_fp64(out.to(Device::cpu()).contiguous(), a.contiguous(), w, n))
        << "m=" << m;
    for (double v : out_base.slice(1, 1, 2 * n, 2).to_double_vector()) ASSERT_EQ(v, 3.0);
  }
}

// The op's checks name the argument on CUDA too: a on the GPU with b on the host.
TEST(MmGgufCuda, MixedDevicesNameTheArgument) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Tensor a = Tensor::zeros({2, 64}, DType::kBFloat16, Device::cuda(0));
  EXPECT_FI_ERROR(mm_gguf(a, Tensor::zeros({3, 40}, DType::kUInt8), "Q4_1"), "mm_gguf", "b");
  EXPECT_FI_ERROR(mm_gguf(a, Tensor::zeros({3, 40}, DType::kUInt8, Device::cuda(0)), "Q4_1",
                          Tensor::zeros({2, 3}, DType::kBFloat16)),
                  "mm_gguf", "out");
}

// The backend tables say what this build runs mm_gguf on: the CPU always, CUDA when compiled
// in (list-ops, replay's fallback and chat --device cuda read the same answer).
TEST(MmGguf, BackendsListCudaWhenCompiled) {
  EXPECT_TRUE(op_has_backend("mm_gguf", DeviceType::kCPU));
  EXPECT_EQ(op_has_backend("mm_gguf", DeviceType::kCUDA), cuda_compiled());
  const std::vector<std::string> expect =
      cuda_compiled() ? std::vector<std::string>{"cpu", "cuda"} : std::vector<std::string>{"cpu"};
  EXPECT_EQ(op_backends("mm_gguf"), expect);
}

}  // namespace
}  // namespace flashinfer
