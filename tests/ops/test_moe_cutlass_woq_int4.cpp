// cutlass_fused_moe's weight-only INT4 path (use_packed_weights without use_w4_group_scaling:
// fp16/bf16 activations, optionally AWQ-smoothed, x int4 weights in the byte order TensorRT-LLM's
// preprocess_weights_for_mixed_gemm(W4_A16) gives the SM80 fpA_intB grouped GEMM, [E, K / 128, N]
// group scales and optional zero points). A forward preprocessor written here from the four
// steps (docs/MOE.md), a hand-checked golden of the un-permutation, fp64 formulas with the
// kernel's rounding points, bad input naming the argument, record/replay.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "kernels/cpu/moe_cutlass_fp4_cpu.h"
#include "kernels/moe_sm90_mixed_rules.h"
#include "ops/moe_fp4_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

using moe_fp4::bytes_tensor;
using moe_fp4::Rng;
using moe_fp4::to_dt;

// ---- the forward preprocessor, step by step ---------------------------------------------------

uint32_t load_word(const std::vector<uint8_t>& b, size_t w) {
  uint32_t v = 0;
  std::memcpy(&v, &b[4 * w], 4);  // little endian, as the host preprocessor reads registers
  return v;
}
void store_word(std::vector<uint8_t>& b, size_t w, uint32_t v) { std::memcpy(&b[4 * w], &v, 4); }

// One expert's logical [K, N] signed int4 values (row-major, q[k * N + n]) as
// preprocess_weights_for_mixed_gemm(W4_A16) writes them for arch 80.
std::vector<uint8_t> preprocess_w4a16(const std::vector<int>& q, int64_t K, int64_t N) {
  const size_t nb = static_cast<size_t>(K * N / 2);
  // Row-major packing: element n of a row in nibble n % 2 of byte n / 2 (low first).
  std::vector<uint8_t> src(nb, 0), dst(nb, 0);
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) {
      const auto nib = static_cast<uint8_t>(q[static_cast<size_t>(k * N + n)] & 0xF);
      src[static_cast<size_t>((k * N + n) / 2)] |= static_cast<uint8_t>(nib << (4 * (n % 2)));
    }
  }
  // 1. LDSM row permutation in groups of 32 rows: output row j takes input row map[j].
  const int map[32] = {0, 1, 8,  9,  16, 17, 24, 25, 2, 3, 10, 11, 18, 19, 26, 27,
                       4, 5, 12, 13, 20, 21, 28, 29, 6, 7, 14, 15, 22, 23, 30, 31};
  const int64_t row_bytes = N / 2;
  for (int64_t k = 0; k < K; ++k) {
    const int64_t from = k / 32 * 32 + map[k % 32];
    std::memcpy(&dst[static_cast<size_t>(k * row_bytes)],
                &src[static_cast<size_t>(from * row_bytes)], static_cast<size_t>(row_bytes));
  }
  src.swap(dst);
  // 2. Sub-byte transpose [K, N] -> [N, K].
  std::fill(dst.begin(), dst.end(), 0);
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) {
      const int nib = (src[static_cast<size_t>(k * row_bytes + n / 2)] >> (4 * (n % 2))) & 0xF;
      dst[static_cast<size_t>(n * (K / 2) + k / 2)] |= static_cast<uint8_t>(nib << (4 * (k % 2)));
    }
  }
  src.swap(dst);
  // 3. Column interleave (ColumnMajorTileInterleave<64, 4>): 32-bit words, 8 per 64-row tile.
  const int64_t vec_rows = K / 8, tile = 64 / 8, inter = 4;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t base = 0; base < vec_rows; base += tile) {
      for (int64_t v = base; v < base + tile; ++v) {
        const int64_t wrow = inter * base + tile * (n % inter) + v % tile;
        store_word(dst, static_cast<size_t>(n / inter * vec_rows * inter + wrow),
                   load_word(src, static_cast<size_t>(n * vec_rows + v)));
      }
    }
  }
  src.swap(dst);
  // 4. +8 on every element, then in each word element 2d to nibble d and 2d + 1 to nibble d + 4.
  for (size_t w = 0; w < nb / 4; ++w) {
    const uint32_t in = load_word(src, w);
    uint32_t out = 0;
    for (int d = 0; d < 8; ++d) {
      const int from = d < 4 ? 2 * d : 2 * (d - 4) + 1;
      const uint32_t code = (((in >> (4 * from)) & 0xF) + 8) & 0xF;
      out |= code << (4 * d);
    }
    store_word(src, w, out);
  }
  return src;
}

// ---- a layer ----------------------------------------------------------------------------------

struct Case : moe_fp4::LayerExtras {
  int64_t T = 4, E = 4, H = 256, I = 128;
  ActivationType act = ActivationType::Swiglu;
  DType dt = DType::kBFloat16;
  bool bias = false, swiglu_params = false, zeros = true, awq = true;
  int64_t ep_rank = 0, ep_size = 1, tp_rank = 0, tp_size = 1;

  bool gated() const { return act != ActivationType::Relu2 && act != ActivationType::Gelu; }
  int64_t N1() const { return gated() ? 2 * I : I; }

  std::vector<double> x, s1, s2, z1, z2, a1, a2;
  std::vector<int> q1, q2;  // logical codes: q1[e][k][n] of [E, H, N1], q2 of [E, I, H]
  Tensor ids;

  void make(uint64_t seed) {
    Rng r{seed};
    auto vec_dt = [&](int64_t n, double lo, double hi) {
      auto v = moe_fp4::uniform_f32(r, n, lo, hi);
      for (auto& d : v) d = to_dt(dt, d);
      return v;
    };
    // Zero points: multiples of 2^-12 below 2^-4 (exact in both types), so that the formula's
    // products plus zeros are exact in fp32 and to_dt rounds them once.
    auto zeros_of = [&](int64_t n) {
      std::vector<double> v(static_cast<size_t>(n));
      for (auto& d : v)
        d = std::ldexp(static_cast<double>(static_cast<int>(r.next() % 511) - 255), -12);
      return v;
    };
    auto codes = [&](int64_t n) {
      std::vector<int> v(static_cast<size_t>(n));
      for (auto& c : v) c = static_cast<int>(r.next() % 16) - 8;
      return v;
    };
    x = vec_dt(T * H, -2, 2);
    q1 = codes(E * H * N1());
    q2 = codes(E * I * H);
    s1 = vec_dt(E * (H / 128) * N1(), 0.002, 0.02);
    s2 = vec_dt(E * (I / 128) * H, 0.002, 0.02);
    z1 = zeros ? zeros_of(E * (H / 128) * N1()) : std::vector<double>{};
    z2 = zeros ? zeros_of(E * (I / 128) * H) : std::vector<double>{};
    a1 = awq ? vec_dt(H, 0.5, 2.0) : std::vector<double>{};
    a2 = awq ? vec_dt(I, 0.5, 2.0) : std::vector<double>{};
    LayerExtras::make(r, E, N1(), H, T, dt, bias, swiglu_params);
    ids = moe_fp4::top2_ids(T, E * ep_size);
  }

  Tensor t16(const std::vector<double>& v, Shape s) const {
    if (v.empty()) return Tensor::empty({0}, dt);
    return Tensor::from_vector(v, std::move(s), dt);
  }
  // Every expert's codes [K, N] preprocessed, as [E, N, K / 2] bytes.
  Tensor weights(const std::vector<int>& q, int64_t K, int64_t N) const {
    std::vector<uint8_t> all;
    for (int64_t e = 0; e < E; ++e) {
      const std::vector<int> one(q.begin() + e * K * N, q.begin() + (e + 1) * K * N);
      const auto b = preprocess_w4a16(one, K, N);
      all.insert(all.end(), b.begin(), b.end());
    }
    return bytes_tensor(all, {E, N, K / 2});
  }
  std::vector<Tensor> quant_scales() const {
    return {t16(s1, {E, H / 128, N1()}),
            t16(s2, {E, I / 128, H}),
            t16(a1, {H}),
            t16(a2, {I}),
            t16(z1, {E, H / 128, N1()}),
            t16(z2, {E, I / 128, H}),
            Tensor::empty({0}, DType::kFloat32),
            Tensor::empty({0}, DType::kFloat32)};
  }
  // The call with every other tensor argument copied to input's device.
  std::vector<Tensor> run(std::vector<Tensor> qs, DType out_dt, const Tensor& input,
                          ActivationType a) const {
    const Device dev = input.device();
    auto on = [&](std::optional<Tensor> t) -> std::optional<Tensor> {
      if (!t) return t;
      return t->to(dev);
    };
    for (Tensor& t : qs) t = t.to(dev);
    return cutlass_fused_moe(
        input, ids.to(dev), Tensor::from_vector(rw, {T, 2}, DType::kFloat32).to(dev),
        weights(q1, H, N1()).to(dev), weights(q2, I, H).to(dev), out_dt, std::move(qs),
        on(moe_fp4::opt_bias(b1, E, N1(), dt)), on(moe_fp4::opt_bias(b2, E, H, dt)), std::nullopt,
        on(moe_fp4::opt_expert_f32(alpha, E)), on(moe_fp4::opt_expert_f32(beta, E)),
        on(moe_fp4::opt_expert_f32(limit, E)), tp_size, tp_rank, ep_size, ep_rank, 1, 0,
        std::nullopt, false, false, false, false, false, true, false, 8192, std::nullopt, a);
  }
  std::vector<Tensor> run(std::vector<Tensor> qs) const {
    return run(std::move(qs), dt, t16(x, {T, H}), act);
  }
  std::vector<Tensor> run() const { return run(quant_scales()); }

  // The MMA operand: (code) * scale (+ zero) rounded as the dequantizer does.
  double deq(const std::vector<int>& q, const std::vector<double>& s, const std::vector<double>& z,
             int64_t K, int64_t N, int64_t e, int64_t k, int64_t n) const {
    const double c = q[static_cast<size_t>((e * K + k) * N + n)];
    const size_t si = static_cast<size_t>((e * (K / 128) + k / 128) * N + n);
    if (z.empty()) return to_dt(dt, c * s[si]);
    if (dt == DType::kBFloat16) return to_dt(dt, c * s[si] + z[si]);  // one fma
    return to_dt(dt, to_dt(dt, c * s[si]) + z[si]);
  }

  std::vector<double> expected() const {
    std::vector<double> out(static_cast<size_t>(T * H), 0.0);
    moe_fp4::for_each_local_pair(ids, T, E, ep_rank, [&](int64_t t, int64_t k, int64_t e) {
      std::vector<double> g(static_cast<size_t>(N1()));
      for (int64_t j = 0; j < N1(); ++j) {
        double acc = 0.0;
        for (int64_t d = 0; d < H; ++d) {
          double xv = x[static_cast<size_t>(t * H + d)];
          if (!a1.empty()) xv = to_dt(dt, xv * a1[static_cast<size_t>(d)]);
          acc += xv * deq(q1, s1, z1, H, N1(), e, d, j);
        }
        acc += b1.empty() ? 0.0 : b1[static_cast<size_t>(e * N1() + j)];
        g[static_cast<size_t>(j)] = gated() ? to_dt(dt, acc) : acc;
      }
      std::vector<double> h(static_cast<size_t>(I));
      for (int64_t j = 0; j < I; ++j) {
        h[static_cast<size_t>(j)] = to_dt(dt, act_ref(act, g, j, I, e));
        if (!a2.empty()) {
          h[static_cast<size_t>(j)] =
              to_dt(dt, h[static_cast<size_t>(j)] * a2[static_cast<size_t>(j)]);
        }
      }
      for (int64_t d = 0; d < H; ++d) {
        double acc = 0.0;
        for (int64_t j = 0; j < I; ++j) {
          acc += h[static_cast<size_t>(j)] * deq(q2, s2, z2, I, H, e, j, d);
        }
        const double bias2 = b2.empty() || tp_rank != 0 ? 0.0 : b2[static_cast<size_t>(e * H + d)];
        out[static_cast<size_t>(t * H + d)] +=
            rw[static_cast<size_t>(t * 2 + k)] * (to_dt(dt, acc) + bias2);
      }
    });
    return out;
  }
};

// ---- the byte order -----------------------------------------------------------------------

// K = N = 64 (the preprocessor's smallest tile), all codes 8 (value 0) but eight, whose bytes
// were worked out by hand from the four steps (LDSM map, transpose, <64, 4> interleave, nibble
// order): (k, n) = (0, 0) -> byte 0 low; (8, 0): row 8 moves to row 2, element 2 of word 0 ->
// nibble 1, byte 0 high; (1, 0): element 1 -> nibble 4, byte 2 low; (2, 0): row 2 moves to row
// 8, word 1 -> byte 4 low; (0, 1): column 1 is the second 8-word run -> byte 32 low; (0, 4):
// column 4 starts the next interleaved group (K / 2 words on) -> byte 128 low; (16, 2): row 16
// moves to row 4, element 4 -> nibble 2 of word 16, byte 65 low; (63, 5): row 63 stays, word 7
// of column 5 -> word 32 + 8 + 7 = 47, element 7 -> nibble 7, byte 191 high.
TEST(CutlassFusedMoeWoqInt4, UnpermuteGolden) {
  std::vector<uint8_t> b(64 * 64 / 2, 0x88);
  b[0] = 0x0F;    // (0, 0) = 7, (8, 0) = -8
  b[2] = 0x89;    // (1, 0) = 1
  b[4] = 0x85;    // (2, 0) = -3
  b[32] = 0x8C;   // (0, 1) = 4
  b[128] = 0x82;  // (0, 4) = -6
  b[65] = 0x8A;   // (16, 2) = 2
  b[191] = 0xE8;  // (63, 5) = 6
  std::vector<int8_t> out(64 * 64, 99);
  kernels::cpu::woq_int4_unpermute(b.data(), out.data(), 64, 64);
  // out is [n, k].
  const std::array<std::array<int, 3>, 8> want = {{{0, 0, 7},
                                                   {8, 0, -8},
                                                   {1, 0, 1},
                                                   {2, 0, -3},
                                                   {0, 1, 4},
                                                   {0, 4, -6},
                                                   {16, 2, 2},
                                                   {63, 5, 6}}};
  int nonzero = 0;
  for (int64_t i = 0; i < 64 * 64; ++i) nonzero += out[static_cast<size_t>(i)] != 0;
  EXPECT_EQ(nonzero, 8);
  for (const auto& [k, n, v] : want) {
    EXPECT_EQ(out[static_cast<size_t>(n * 64 + k)], v) << "k " << k << " n " << n;
  }
}

// The library's un-permutation inverts the step-by-step preprocessor on random codes (two
// 64-row tiles, two interleaved column groups beyond the first tile in each direction).
TEST(CutlassFusedMoeWoqInt4, UnpermuteInvertsPreprocessor) {
  const int64_t K = 128, N = 192;
  Rng r{901};
  std::vector<int> q(static_cast<size_t>(K * N));
  for (auto& c : q) c = static_cast<int>(r.next() % 16) - 8;
  const auto bytes = preprocess_w4a16(q, K, N);
  std::vector<int8_t> out(static_cast<size_t>(K * N));
  kernels::cpu::woq_int4_unpermute(bytes.data(), out.data(), N, K);
  int64_t bad = 0;
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) {
      bad += out[static_cast<size_t>(n * K + k)] != q[static_cast<size_t>(k * N + n)];
    }
  }
  EXPECT_EQ(bad, 0);
}

// ---- the dequantization's rounding --------------------------------------------------------

// One local expert of two (ep rank 0 of 2), H = I = 128, Relu2, x one-hot (1 in column 0) so
// that GEMM1 returns the dequantized fc1 weight itself; every fc2 weight is 1 (code 9, scale 1,
// zero 0), so y = 128 h. Token 0 routes to experts 0 (weight 1) and 1 (not local).
// bf16: code 11 (value 3), scale 129 / 128, zero -2^-40: the exact 387 / 128 - 2^-40 lies just
// below the midpoint of 386 / 128 and 388 / 128, so the single fma rounding gives 3.015625
// (rounding the fp32 sum first would reach the midpoint and 3.03125). Relu2: 9.094482421875 ->
// 9.125 (step 1/16); y = 1168.
// fp16: code 11, scale 1 + 2^-10, zero -2^-10: 3 * scale = 3 + 1.5 * 2^-9 rounds to 3 + 2^-8,
// the add of the zero rounds back to 3 + 2^-8 = 3.00390625 (one fma would give 3 + 2^-9).
// Relu2: 9.02345275878... -> 1155 / 128 (step 1/128); y = 1155.
// DequantRoundingGolden's two calls (bf16, then fp16) on `dev`; their outputs on the CPU.
std::vector<Tensor> dequant_rounding_golden(Device dev) {
  const int64_t H = 128, I = 128;
  struct G {
    DType dt;
    double scale, zero;
  };
  std::vector<Tensor> outs;
  for (const G& g : {G{DType::kBFloat16, 129.0 / 128, -std::ldexp(1.0, -40)},
                     G{DType::kFloat16, 1.0 + std::ldexp(1.0, -10), -std::ldexp(1.0, -10)}}) {
    std::vector<double> x(static_cast<size_t>(H), 0.0);
    x[0] = 1.0;
    const auto full = [&](Shape sh, double v) {
      return Tensor::full(std::move(sh), v, g.dt).to(dev);
    };
    const std::vector<Tensor> qs = {full({1, H / 128, I}, g.scale),
                                    full({1, I / 128, H}, 1.0),
                                    Tensor::empty({0}, g.dt, dev),
                                    Tensor::empty({0}, g.dt, dev),
                                    full({1, H / 128, I}, g.zero),
                                    full({1, I / 128, H}, 0.0),
                                    Tensor::empty({0}, DType::kFloat32, dev),
                                    Tensor::empty({0}, DType::kFloat32, dev)};
    const auto out = cutlass_fused_moe(
        Tensor::from_vector(x, {1, H}, g.dt).to(dev),
        Tensor::from_vector({0, 1}, {1, 2}, DType::kInt32).to(dev),
        Tensor::from_vector({1.0, 0.5}, {1, 2}, DType::kFloat32).to(dev),
        bytes_tensor(std::vector<uint8_t>(I * H / 2, 0xBB), {1, I, H / 2}).to(dev),
        bytes_tensor(std::vector<uint8_t>(H * I / 2, 0x99), {1, H, I / 2}).to(dev), g.dt, qs,
        std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, 1, 0, 2,
        0, 1, 0, std::nullopt, false, false, false, false, false, true, false, 8192, std::nullopt,
        ActivationType::Relu2);
    outs.push_back(out[0].to(Device::cpu()));
  }
  return outs;
}

void expect_dequant_rounding_golden(const std::vector<Tensor>& outs) {
  const int64_t H = 128;
  ASSERT_EQ(outs.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const double want = i == 0 ? 1168.0 : 1155.0;  // bf16, fp16
    const auto got = outs[i].to_double_vector();
    for (int64_t d = 0; d < H; ++d) EXPECT_EQ(got[static_cast<size_t>(d)], want) << i << " " << d;
  }
}

TEST(CutlassFusedMoeWoqInt4, DequantRoundingGolden) {
  expect_dequant_rounding_golden(dequant_rounding_golden(Device::cpu()));
}

// The CUDA kernels read weight-only INT4 weights in place (kernels/moe_sm90_mixed_rules.h,
// woq_lane_rows): the lane loop as a warp runs it (each of 32 lanes, two input rows at once, the 8
// lanes of a row added) over weights this file's step-by-step preprocessor wrote, against plain
// dot products over the logical codes dequantized by woq_int4_operand (whose rounding the goldens
// pin), with scales and zero points [K / 128, N]. K = 384: the last 256-column chunk half used.
// Integer x, power-of-two scales and zero points in 16ths keep every operand exact in both 16-bit
// types and every fp32 sum exact, so the sums must be equal.
TEST(CutlassFusedMoeWoqInt4, LanesReadWhatThePreprocessorWrote) {
  const int64_t K = 384, N = 64;
  Rng r{985};
  std::vector<int> q(static_cast<size_t>(K * N));
  for (auto& c : q) c = static_cast<int>(r.next() % 16) - 8;
  const std::vector<uint8_t> w = preprocess_w4a16(q, K, N);
  std::vector<double> sc(static_cast<size_t>(K / 128 * N)), zr(sc.size());
  for (auto& v : sc) v = std::ldexp(1.0, -static_cast<int>(r.next() % 3));
  for (auto& v : zr) v = static_cast<double>(static_cast<int>(r.next() % 33) - 16) / 16.0;
  std::vector<float> x(static_cast<size_t>(2 * K));
  for (auto& v : x) v = static_cast<float>(static_cast<int>(r.next() % 7) - 3);
  auto x_cols = [&](int p, int64_t k0, float(&xs)[32]) {
    for (int i = 0; i < 32; ++i) xs[i] = x[static_cast<size_t>(p * K + k0 + i)];
  };
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    const bool half = dt == DType::kFloat16;
    const Tensor st = Tensor::from_vector(sc, {K / 128, N}, dt);
    const Tensor zt = Tensor::from_vector(zr, {K / 128, N}, dt);
    const auto* s16 = static_cast<const uint16_t*>(st.data_ptr());
    const auto* z16 = static_cast<const uint16_t*>(zt.data_ptr());
    for (bool zeros : {true, false}) {
      for (int64_t g = 0; g < N / 4; ++g) {
        float acc[32][2];
        for (int lane = 0; lane < 32; ++lane) {
          kernels::woq_lane_rows<2>(w.data(), s16, zeros ? z16 : nullptr, half, N, K, g, lane, 2,
                                    x_cols, acc[lane]);
        }
        for (int nl = 0; nl < 4; ++nl) {
          const int64_t n = 4 * g + nl;
          for (int p = 0; p < 2; ++p) {
            float sum = 0.0f;
            for (int lane = 0; lane < 32; ++lane) {
              if ((lane % 8) / 2 == nl) sum += acc[lane][p];
            }
            double want = 0.0;
            for (int64_t k = 0; k < K; ++k) {
              const size_t si = static_cast<size_t>(k / 128 * N + n);
              want += x[static_cast<size_t>(p * K + k)] *
                      kernels::woq_int4_operand(
                          static_cast<float>(q[static_cast<size_t>(k * N + n)]),
                          static_cast<float>(sc[si]), zeros, static_cast<float>(zr[si]), half);
            }
            EXPECT_EQ(static_cast<double>(sum), want)
                << dtype_label(dt) << " zeros " << zeros << " row " << n << " input " << p;
          }
        }
      }
    }
  }
}

// ---- fp64 formulas ----------------------------------------------------------------------------

// bf16 / fp16 x Swiglu (biases) / Relu2, zero points and AWQ on; fc1 has two scale groups per
// column (H = 256), fc2 one (group size = K = I = 128).
TEST(CutlassFusedMoeWoqInt4, MatchesFormula) {
  moe_fp4::expect_dtypes_and_acts_match_formula<Case>(950);
}

// Without zero points and without AWQ, SwigluBias on expert-parallel rank 1 of 2 and
// tensor-parallel rank 1 of 2 (no fc2 bias there); fp16 Relu2 with zeros but no AWQ.
TEST(CutlassFusedMoeWoqInt4, NoZerosNoAwqParallel) {
  Case c;
  c.zeros = false;
  c.awq = false;
  c.bias = true;
  c.swiglu_params = true;
  moe_fp4::set_rank1_of_2(c);
  c.make(961);
  moe_fp4::expect_close_to_formula(c.run()[0].to_double_vector(), c.expected());
  Case d;
  d.dt = DType::kFloat16;
  d.act = ActivationType::Relu2;
  d.awq = false;
  d.H = 128;
  d.I = 256;
  d.make(962);
  moe_fp4::expect_close_to_formula(d.run()[0].to_double_vector(), d.expected());
}

// Upstream smooths only when both act scales are given (use_awq): one alone changes nothing.
TEST(CutlassFusedMoeWoqInt4, OneActScaleIsIgnored) {
  Case c;
  c.T = 3;
  c.make(970);
  auto none = c.quant_scales();
  none[2] = Tensor::empty({0}, c.dt);
  none[3] = Tensor::empty({0}, c.dt);
  auto one = c.quant_scales();
  one[3] = Tensor::empty({0}, c.dt);
  const auto a = c.run(none)[0].to_double_vector(), b = c.run(one)[0].to_double_vector();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c.run()[0].to_double_vector());
}

TEST(CutlassFusedMoeWoqInt4, BadInput) {
  Case c;
  c.T = 2;
  c.make(980);
  const char* op = "cutlass_fused_moe";
  auto with = [&](size_t i, Tensor t) { return moe_fp4::quant_scales_with(c, i, std::move(t)); };
  moe_fp4::expect_short_quant_scales_refused(c);
  // Scales: required, the input's dtype, [E, K / 128, N] values.
  EXPECT_FI_ERROR((void)c.run(with(0, Tensor::empty({0}, c.dt))), op, "quant_scales");
  EXPECT_FI_ERROR(
      (void)c.run(with(0, Tensor::full({c.E, c.H / 128, c.N1()}, 0.01, DType::kFloat32))), op,
      "quant_scales");
  // A group size of 64 (twice the scale rows) is not the kernel's 128 or K.
  EXPECT_FI_ERROR((void)c.run(with(1, Tensor::full({c.E, c.I / 64, c.H}, 0.01, c.dt))), op,
                  "quant_scales");
  // Zeros of the wrong size; per-expert act scales; alphas not fp32.
  EXPECT_FI_ERROR((void)c.run(with(5, Tensor::zeros({c.E, 2 * c.H}, c.dt))), op, "quant_scales");
  EXPECT_FI_ERROR((void)c.run(with(2, Tensor::full({c.E, c.H}, 1.0, c.dt))), op, "quant_scales");
  EXPECT_FI_ERROR((void)c.run(with(6, Tensor::full({c.E}, 1.0, c.dt))), op, "quant_scales");
  // Input: fp16 / bf16 only; the output has the input's dtype.
  EXPECT_FI_ERROR(
      (void)c.run(c.quant_scales(), c.dt, c.t16(c.x, {c.T, c.H}).to(DType::kFloat32), c.act), op,
      "input");
  EXPECT_FI_ERROR((void)c.run(c.quant_scales(), DType::kFloat16, c.t16(c.x, {c.T, c.H}), c.act), op,
                  "output_dtype");
  // Gelu runs in the GEMM epilogue as the tanh GELU: not implemented.
  try {
    Case g;
    g.T = 2;
    g.act = ActivationType::Gelu;
    g.make(981);
    (void)g.run();
    ADD_FAILURE() << "expected kUnsupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_EQ(e.arg(), "activation_type") << e.what();
  }
  // Hidden size not a multiple of 128 (the group size).
  Case h;
  h.T = 2;
  h.H = 64;
  h.make(982);
  EXPECT_FI_ERROR((void)h.run(), op, "fc2_expert_weights");
}

#if FLASHINFER_TEST_HAVE_CUDART
// Weight-only INT4 on CUDA (upstream's SM80 fpA_intB path, sm80+; refused by name below): the
// dequantization's rounding golden exactly (bf16 and fp16) on both routes (a block per pair,
// tiles of up to 8 pairs of one expert); random layers against the CPU reference within the
// formula tests' tolerance: bf16 Swiglu with biases, zero points and AWQ; fp16 Relu2 without
// them (the activation on the fp32 sum); SwigluBias on expert-parallel rank 1 of 2; 9 and 64
// tokens, each on both routes and the default.
TEST(CutlassFusedMoeWoqInt4Cuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  moe_fp4::expect_sm90_mixed_routes(
      dequant_rounding_golden, expect_dequant_rounding_golden,
      [](Device d) {
        for (int which = 0; which < 3; ++which) {
          for (int64_t T : {9, 64}) {
            Case c;
            c.T = T;
            c.E = 8;
            c.dt = which == 1 ? DType::kFloat16 : DType::kBFloat16;
            c.act = which == 1 ? ActivationType::Relu2 : ActivationType::Swiglu;
            c.bias = which != 1;
            c.zeros = c.awq = which == 0;
            c.swiglu_params = which == 2;
            if (which == 2) {
              c.ep_size = 2;
              c.ep_rank = 1;
            }
            c.make(996 + static_cast<uint64_t>(which));
            const Tensor got =
                c.run(c.quant_scales(), c.dt, c.t16(c.x, {c.T, c.H}).to(d), c.act)[0];
            SCOPED_TRACE(::testing::Message() << "case " << which << " T " << T);
            moe_fp4::expect_close_to_formula(got.to(Device::cpu()).to_double_vector(),
                                             c.run()[0].to_double_vector());
          }
        }
      },
      80);
}
#endif  // FLASHINFER_TEST_HAVE_CUDART

TEST(CutlassFusedMoeWoqInt4, RecordAndReplay) {
  moe_fp4::expect_default_and_fp16_relu2_replay<Case>(995);
}

}  // namespace
}  // namespace flashinfer::testing
