// cutlass_fused_moe's Humming path (use_wfp4afp8_humming: MXFP4 weights prepared by
// preprocess_moe_weights_for_sm90_mixed_gemm_humming x fp8 activations quantized per routed row
// in the op): a hand-checked golden, fp64 formulas (8 experts, top-2) on weights prepared as the
// engines prepare them, bad input naming the argument, record/replay. Sources: docs/MOE.md,
// "cutlass_fused_moe: Humming MXFP4 x FP8".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "kernels/moe_sm90_mixed_rules.h"
#include "ops/moe_fp4_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"

namespace flashinfer::testing {
namespace {

using moe_fp4::bytes_tensor;
using moe_fp4::random_bytes;
using moe_fp4::Rng;
using moe_fp4::silu;
using moe_fp4::to_dt;

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data_ptr());
  return {p, p + t.numel() * static_cast<int64_t>(t.element_size())};
}

// The folded uint8 scales viewed as int32, as the engines pass them (`.view(torch.int32)`).
Tensor as_int32(const Tensor& t) {
  Shape s = t.shape();
  s.back() /= 4;
  return bytes_tensor(bytes_of(t), s, DType::kInt32);
}

// Upstream's per-row fp8 quantization, independently: fp32 quant = 448 / amax (1 for a zero
// row), codes e4m3_satfinite(v * quant); returns the fp32 1 / quant.
float row_fp8(const std::vector<double>& v, std::vector<double>* q) {
  float amax = 0.0f;
  for (double d : v) amax = std::max(amax, std::fabs(static_cast<float>(d)));
  const float quant =
      amax > 0.0f ? 448.0f / std::max(amax, 448.0f / std::numeric_limits<float>::max()) : 1.0f;
  q->resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    (*q)[i] = e4m3fn_bits_to_float(float_to_e4m3fn_bits(static_cast<float>(v[i]) * quant, true));
  }
  return 1.0f / quant;
}

// One MoE layer in the engines' form: raw MXFP4 weights and E8M0 scales prepared by
// preprocess_moe_weights_for_sm90_mixed_gemm_humming (interleaved for the call, logical for the
// formula), quant_scales = [s1 as int32, r1 * 64, 1, s2 as int32, r2 * 64].
struct Case : moe_fp4::LayerExtras {
  int64_t T = 5, E = 8, H = 128, I = 128;
  ActivationType act = ActivationType::Swiglu;
  DType dt = DType::kBFloat16;
  bool bias = false, swiglu_params = false;
  int64_t ep_rank = 0, ep_size = 1, tp_rank = 0, tp_size = 1;
  uint8_t scale_lo = 118, scale_span = 7;

  bool gated() const { return act != ActivationType::Relu2; }
  int64_t N1() const { return gated() ? 2 * I : I; }

  std::vector<double> x;  // b1, b2, alpha, beta, limit, rw: LayerExtras
  Tensor ids;
  // Prepared: the call's tensors and the formula's logical codes / offsets / residuals.
  Tensor w1i, s1i, w2i, s2i;
  std::vector<uint8_t> w1p, o1, w2p, o2;
  std::vector<double> r1, r2;

  void prepare(const std::vector<uint8_t>& w, const std::vector<uint8_t>& s, int64_t rows,
               int64_t cols, Tensor* wi, Tensor* si, std::vector<uint8_t>* wp,
               std::vector<uint8_t>* o, std::vector<double>* r) {
    const Tensor wt = bytes_tensor(w, {E, rows, cols / 2});
    const Tensor st = bytes_tensor(s, {E, rows, cols / 32});
    auto [wi_, si_, ri] = preprocess_moe_weights_for_sm90_mixed_gemm_humming(wt, st);
    auto [wp_, op, rp] = preprocess_moe_weights_for_sm90_mixed_gemm_humming(wt, st, 11, false);
    *wi = wi_;
    *si = as_int32(si_);
    *wp = bytes_of(wp_);
    *o = bytes_of(op);
    *r = ri.to_double_vector();
    EXPECT_EQ(*r, rp.to_double_vector());
  }

  void make(uint64_t seed) {
    Rng r{seed};
    auto vec_d = [&](int64_t n, double lo, double hi) {
      return moe_fp4::uniform_f32(r, n, lo, hi);
    };
    x = vec_d(T * H, -2, 2);
    for (auto& d : x) d = to_dt(dt, d);
    // Each expert's scales start at a different exponent, so the residuals differ per expert.
    auto scales = [&](int64_t n) {
      std::vector<uint8_t> s(static_cast<size_t>(n));
      for (size_t i = 0; i < s.size(); ++i) {
        const int64_t e = static_cast<int64_t>(i) / (n / E);
        s[i] = static_cast<uint8_t>(scale_lo + e % 4 + r.next() % scale_span);
      }
      return s;
    };
    prepare(random_bytes(static_cast<size_t>(E * N1() * H / 2), seed + 1),
            scales(E * N1() * H / 32), N1(), H, &w1i, &s1i, &w1p, &o1, &r1);
    prepare(random_bytes(static_cast<size_t>(E * H * I / 2), seed + 2), scales(E * H * I / 32), H,
            I, &w2i, &s2i, &w2p, &o2, &r2);
    LayerExtras::make(r, E, N1(), H, T, dt, bias, swiglu_params);
    ids = moe_fp4::top2_ids(T, E * ep_size);
  }

  Tensor f32(const std::vector<double>& v, Shape s) const {
    return Tensor::from_vector(v, std::move(s), DType::kFloat32);
  }
  std::optional<Tensor> opt_f32(const std::vector<double>& v) const {
    if (v.empty()) return std::nullopt;
    return f32(v, {E});
  }
  std::optional<Tensor> bias_t(const std::vector<double>& b, int64_t n) const {
    if (b.empty()) return std::nullopt;
    return Tensor::from_vector(b, {E, n}, dt);
  }
  std::vector<double> times64(const std::vector<double>& r) const {
    std::vector<double> o(r);
    for (auto& d : o) d *= 64.0;
    return o;
  }
  std::vector<Tensor> quant_scales() const {
    return {s1i, f32(times64(r1), {E}), Tensor::from_vector({1.0}, {}, DType::kFloat32), s2i,
            f32(times64(r2), {E})};
  }
  // The call on `dev` (every tensor argument copied there).
  std::vector<Tensor> run(std::vector<Tensor> qs, DType out_dt, Device dev = Device::cpu()) const {
    auto on = [&](std::optional<Tensor> t) -> std::optional<Tensor> {
      if (!t) return t;
      return t->to(dev);
    };
    for (Tensor& t : qs) t = t.to(dev);
    return cutlass_fused_moe(Tensor::from_vector(x, {T, H}, dt).to(dev), ids.to(dev),
                             f32(rw, {T, 2}).to(dev), w1i.to(dev), w2i.to(dev), out_dt,
                             std::move(qs), on(bias_t(b1, N1())), on(bias_t(b2, H)), std::nullopt,
                             on(opt_f32(alpha)), on(opt_f32(beta)), on(opt_f32(limit)), tp_size,
                             tp_rank, ep_size, ep_rank, 1, 0, std::nullopt, false, false, true,
                             false, false, false, true, 8192, std::nullopt, act);
  }
  std::vector<Tensor> run() const { return run(quant_scales(), dt); }

  // The fp8 MMA operand of a prepared weight: e2m1 code * 2^(offset - 6).
  static double wval(const std::vector<uint8_t>& wp, const std::vector<uint8_t>& o, int64_t e,
                     int64_t rows, int64_t cols, int64_t r, int64_t c) {
    const size_t i = static_cast<size_t>((e * rows + r) * cols + c);
    const uint8_t b = wp[i / 2];
    const double q = e2m1_bits_to_float(static_cast<uint8_t>(i % 2 == 0 ? b & 0xF : b >> 4));
    const uint8_t off = o[static_cast<size_t>((e * rows + r) * (cols / 32) + c / 32)];
    return std::ldexp(q, static_cast<int>(off) - 6);
  }

  std::vector<double> expected() const {
    const auto idv = ids.to_double_vector();
    std::vector<double> out(static_cast<size_t>(T * H), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < 2; ++k) {
        const int64_t e = static_cast<int64_t>(idv[static_cast<size_t>(t * 2 + k)]) - ep_rank * E;
        if (e < 0 || e >= E) continue;
        std::vector<double> xq;
        const std::vector<double> row(x.begin() + t * H, x.begin() + (t + 1) * H);
        const double dq1 = row_fp8(row, &xq) * static_cast<float>(r1[e] * 64.0);
        std::vector<double> g(static_cast<size_t>(N1()));
        for (int64_t j = 0; j < N1(); ++j) {
          double acc = 0.0;
          for (int64_t d = 0; d < H; ++d) acc += xq[d] * wval(w1p, o1, e, N1(), H, j, d);
          g[j] = to_dt(dt, acc * dq1) + (b1.empty() ? 0.0 : b1[e * N1() + j]);
        }
        std::vector<double> h(static_cast<size_t>(I));
        for (int64_t j = 0; j < I; ++j) h[j] = act_ref(act, g, j, I, e);
        // The fp32 activation is quantized as is (no rounding to the output dtype first).
        std::vector<double> hq;
        const double dq2 = row_fp8(h, &hq) * static_cast<float>(r2[e] * 64.0);
        for (int64_t d = 0; d < H; ++d) {
          double acc = 0.0;
          for (int64_t j = 0; j < I; ++j) acc += hq[j] * wval(w2p, o2, e, H, I, d, j);
          const double y = to_dt(dt, acc * dq2);
          const double bias2 = b2.empty() || tp_rank != 0 ? 0.0 : b2[e * H + d];
          out[static_cast<size_t>(t * H + d)] += rw[static_cast<size_t>(t * 2 + k)] * (y + bias2);
        }
      }
    }
    return out;
  }
};

template <class F>
void expect_fi_error(F f, const char* arg) {
  EXPECT_FI_ERROR(f(), "cutlass_fused_moe", arg);
}

void expect_matches(const Case& c, const Tensor& out) {
  moe_fp4::expect_close_to_formula(out.to_double_vector(), c.expected());
}

// ---- golden ---------------------------------------------------------------------------------

// H = I = 128, Relu2, two local experts of four (ep rank 0 of 2), every weight code 1.0 (byte
// 0x22); expert 0's raw E8M0 scales 127 (2^0), expert 1's 126 (2^-1). The preparation gives
// offset 1 everywhere (a single scale per expert: range 0) and residuals 0.5 and 0.25, passed
// times 64: 32 and 16. The MMA operand of a weight: 1 * 2^(1 - 6) = 1/32.
// Token 0: x = 0.875 (amax 0.875, quant 448 / 0.875 = 512, codes 448), experts 0 (0.75) and 1
// (0.25). Token 1: x = 0.4375 (quant 1024, codes 448), experts 0 (1.0) and 3 (not local).
// GEMM1 sums 128 * 448 / 32 = 1792 per output; its per-row scale (1 / quant) * residual:
//   t0 e0: 1792 * 32 / 512 = 112; t0 e1: 1792 * 16 / 512 = 56; t1 e0: 1792 * 32 / 1024 = 56.
// Relu2: 12544 and 3136. GEMM2's input quantized per row: quant 448 / 12544 = 1/28 (codes 448),
// 448 / 3136 = 1/7 (codes 448); GEMM2 sums 1792 again, times (1 / quant) * residual:
//   t0 e0: 1792 * 28 * 32 = 1605632; t0 e1: 1792 * 7 * 16 = 200704; t1 e0: 1792 * 7 * 32 = 401408
// (bf16: exact, and the fp32 quotients' last-bit errors stay far from a bf16 tie).
// Token 0: 0.75 * 1605632 + 0.25 * 200704 = 1254400 -> bf16 1253376; token 1: 401408.
// GoldenRelu2's call on `dev`; returns the output on the CPU.
Tensor golden_relu2(Device dev) {
  const int64_t E = 2, H = 128, I = 128;
  std::vector<uint8_t> raw_s1(static_cast<size_t>(E * I * H / 32), 127);
  std::vector<uint8_t> raw_s2(static_cast<size_t>(E * H * I / 32), 127);
  std::fill(raw_s1.begin() + I * H / 32, raw_s1.end(), 126);
  std::fill(raw_s2.begin() + H * I / 32, raw_s2.end(), 126);
  const Tensor w = bytes_tensor(std::vector<uint8_t>(E * I * H / 2, 0x22), {E, I, H / 2});
  auto [w1, s1, r1] =
      preprocess_moe_weights_for_sm90_mixed_gemm_humming(w, bytes_tensor(raw_s1, {E, I, H / 32}));
  auto [w2, s2, r2] =
      preprocess_moe_weights_for_sm90_mixed_gemm_humming(w, bytes_tensor(raw_s2, {E, H, I / 32}));
  EXPECT_EQ(r1.to_double_vector(), (std::vector<double>{0.5, 0.25}));
  const Tensor r64 = Tensor::from_vector({32.0, 16.0}, {E}, DType::kFloat32).to(dev);
  std::vector<double> x(static_cast<size_t>(2 * H), 0.875);
  std::fill(x.begin() + H, x.end(), 0.4375);
  const auto out = cutlass_fused_moe(
      Tensor::from_vector(x, {2, H}, DType::kBFloat16).to(dev),
      Tensor::from_vector({0, 1, 0, 3}, {2, 2}, DType::kInt32).to(dev),
      Tensor::from_vector({0.75, 0.25, 1.0, 0.5}, {2, 2}, DType::kFloat32).to(dev), w1.to(dev),
      w2.to(dev), DType::kBFloat16,
      std::vector<Tensor>{as_int32(s1).to(dev), r64,
                          Tensor::from_vector({1.0}, {}, DType::kFloat32).to(dev),
                          as_int32(s2).to(dev), r64},
      std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, 1, 0, 2,
      0, 1, 0, std::nullopt, false, false, true, false, false, false, true, 8192, std::nullopt,
      ActivationType::Relu2);
  EXPECT_EQ(out.size(), 4u);
  return out[0].to(Device::cpu());
}

void expect_golden_relu2(const Tensor& out) {
  const int64_t H = 128;
  const auto got = out.to_double_vector();
  for (int64_t d = 0; d < H; ++d) {
    EXPECT_EQ(got[static_cast<size_t>(d)], 1253376.0) << d;
    EXPECT_EQ(got[static_cast<size_t>(H + d)], 401408.0) << d;
  }
}

TEST(CutlassFusedMoeHumming, GoldenRelu2) { expect_golden_relu2(golden_relu2(Device::cpu())); }

// The input's per-row quantization rounds: a row holding 1.0 and bf16(0.3) = 0.30078125 shares
// the scale of its amax 1 (quant 448): 0.30078125 * 448 = 134.75 -> e4m3 128 (step 16 in
// [128, 256)). One local expert of two (ep rank 0), Relu2, weights 1/32 with residual 32 (as in
// GoldenRelu2): GEMM1 = (448 + 127 * 128) / 32 * 32 / 448 = 16704 / 448 = 37.2857 -> bf16
// 37.25 (unrounded codes would give 39.198 -> 39.25); Relu2 1387.5625; GEMM2's row is constant
// (quant 448 / 1387.5625, codes 448): 128 * 448 / 32 * (1387.5625 / 448) * 32 = 177608 -> bf16
// 177152.
TEST(CutlassFusedMoeHumming, GoldenInputRounding) {
  const int64_t H = 128, I = 128;
  const Tensor w = bytes_tensor(std::vector<uint8_t>(I * H / 2, 0x22), {1, I, H / 2});
  const Tensor s = bytes_tensor(std::vector<uint8_t>(I * H / 32, 127), {1, I, H / 32});
  auto [w1, s1, r1] = preprocess_moe_weights_for_sm90_mixed_gemm_humming(w, s);
  auto [w2, s2, r2] = preprocess_moe_weights_for_sm90_mixed_gemm_humming(w, s);
  const Tensor r64 = Tensor::from_vector({32.0}, {1}, DType::kFloat32);
  std::vector<double> x(static_cast<size_t>(H), 0.30078125);
  x[0] = 1.0;
  const auto out = cutlass_fused_moe(
      Tensor::from_vector(x, {1, H}, DType::kBFloat16),
      Tensor::from_vector({0, 1}, {1, 2}, DType::kInt32),
      Tensor::from_vector({1.0, 0.5}, {1, 2}, DType::kFloat32), w1, w2, DType::kBFloat16,
      std::vector<Tensor>{as_int32(s1), r64, Tensor::from_vector({1.0}, {}, DType::kFloat32),
                          as_int32(s2), r64},
      std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, 1, 0, 2,
      0, 1, 0, std::nullopt, false, false, true, false, false, false, true, 8192, std::nullopt,
      ActivationType::Relu2);
  const auto got = out[0].to_double_vector();
  for (int64_t d = 0; d < H; ++d) EXPECT_EQ(got[static_cast<size_t>(d)], 177152.0) << d;
}

// Offsets outside the preparation's 1..12 (a caller's own folded scales): the kPreMmaE8M0
// mainloop builds each e4m3 operand byte as a table entry (code 1: 0x00, 2: 0x08, 3: 0x0c, 4:
// 0x10, 5: 0x14, 6: 0x18, 7: 0x1c) plus 8 * offset in one uint32 lane (code 0's entry gets no
// offset) and ORs the code's sign in [wheel 0.7.2.post1 mixed_input_utils.hpp:603]. Code 1 at
// offset 0 is therefore 0 (not 2^-7), and code 7 at offset 13 is 0x84 = -2^-7 (not 768).
// GEMM1 as in GoldenRelu2 (token 0 only, expert 0 weight 1): 112, Relu2 12544, GEMM2's row quant
// 1/28 (codes 448), then 128 * 448 * w2 * 28 * 32 with the GEMM2 operand w2 below.
TEST(CutlassFusedMoeHumming, GoldenOffsetsOutsidePreparedRange) {
  const int64_t H = 128, I = 128;
  const Tensor s = bytes_tensor(std::vector<uint8_t>(I * H / 32, 127), {1, I, H / 32});
  auto [w1, s1, r1] = preprocess_moe_weights_for_sm90_mixed_gemm_humming(
      bytes_tensor(std::vector<uint8_t>(I * H / 2, 0x22), {1, I, H / 2}), s);
  const Tensor r64 = Tensor::from_vector({32.0}, {1}, DType::kFloat32);
  struct W2 {
    uint8_t byte, offset;
    double expected;
  };
  // (code 1, offset 0) -> 0; (code 7, offset 13) -> -2^-7: -401408; (code 2, offset 0) -> 2^-6:
  // 802816 (as the plain formula); (code 4 negative, offset 33: 0x10 + 264 keeps its low byte
  // 0x18, the carry going to the next code's byte) -> -2^-4: -3211264.
  for (const W2& c : {W2{0x11, 0, 0.0}, W2{0x77, 13, -401408.0}, W2{0x22, 0, 802816.0},
                      W2{0xCC, 33, -3211264.0}}) {
    auto [w2, s2, r2] = preprocess_moe_weights_for_sm90_mixed_gemm_humming(
        bytes_tensor(std::vector<uint8_t>(I * H / 2, c.byte), {1, H, I / 2}), s);
    std::vector<uint8_t> off(static_cast<size_t>(s2.numel()), c.offset);
    const auto out = cutlass_fused_moe(
        Tensor::from_vector(std::vector<double>(static_cast<size_t>(H), 0.875), {1, H},
                            DType::kBFloat16),
        Tensor::from_vector({0, 1}, {1, 2}, DType::kInt32),
        Tensor::from_vector({1.0, 0.5}, {1, 2}, DType::kFloat32), w1, w2, DType::kBFloat16,
        std::vector<Tensor>{as_int32(s1), r64, Tensor::from_vector({1.0}, {}, DType::kFloat32),
                            as_int32(bytes_tensor(off, s2.shape())), r64},
        std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, 1, 0, 2,
        0, 1, 0, std::nullopt, false, false, true, false, false, false, true, 8192, std::nullopt,
        ActivationType::Relu2);
    const auto got = out[0].to_double_vector();
    for (int64_t d = 0; d < H; ++d) {
      EXPECT_EQ(got[static_cast<size_t>(d)], c.expected) << int{c.byte} << " " << d;
    }
  }
}

// The CUDA kernels read Humming weights and offsets in place (kernels/moe_sm90_mixed_rules.h): the
// "fp4_fp8" layout's words where sm90_fp4_fp8_word_code says (16-bit units of 4 codes, signs
// moved), then the lane loop as a warp runs it (sm90_mixed_lane_rows on each of 32 lanes, two
// input rows at once, the four lanes of a row added) against plain dot products over the codes
// before upstream's interleave, each weight code * 2^(offset - 6) (the operand's value for the
// preparation's offsets 1..12; here 1..8), with offsets folded by upstream's scale interleave.
// Integer x keeps every fp32 sum exact (terms multiples of 2^-6, |sum| <= 256 * 3 * 24 < 2^15),
// so sums are equal.
TEST(CutlassFusedMoeHumming, Sm90LanesReadWhatTheInterleaveWrote) {
  const int64_t rows = 128, k = 256, row_bytes = k / 2;
  const std::vector<uint8_t> plain = random_bytes(static_cast<size_t>(rows * row_bytes), 91);
  Rng r{92};
  std::vector<uint8_t> off(static_cast<size_t>(rows * k / 32));
  for (auto& b : off) b = static_cast<uint8_t>(1 + r.next() % 8);
  const Tensor inter = interleave_moe_weights_for_sm90_mixed_gemm(
      bytes_tensor(plain, {1, rows, row_bytes}), "fp4_fp8");
  const Tensor folded =
      interleave_moe_scales_for_sm90_mixed_gemm(bytes_tensor(off, {1, rows, k / 32}));
  const auto* w = static_cast<const uint8_t*>(inter.data_ptr());
  const auto* sf = static_cast<const uint8_t*>(folded.data_ptr());
  auto code_at = [&](int64_t row, int64_t col) {
    return moe_fp4::plain_code(plain, row_bytes, row, col);
  };
  moe_fp4::expect_sm90_unit_words_hold(
      w, plain, rows, k, [](uint32_t v, int n) { return kernels::sm90_fp4_fp8_word_code(v, n); });
  std::vector<float> x(static_cast<size_t>(2 * k));
  for (auto& v : x) v = static_cast<float>(static_cast<int>(r.next() % 7) - 3);
  auto x_at = [&](int p, int64_t i) { return x[static_cast<size_t>(p * k + i)]; };
  auto x_cols = [&](int p, int64_t c, float(&xs)[16]) {
    for (int i = 0; i < 16; ++i) xs[i] = x_at(p, c + i);
  };
  for (int64_t blk = 0; blk < rows / 16; ++blk) {
    float lo[32][2], hi[32][2];
    for (int lane = 0; lane < 32; ++lane) {
      kernels::sm90_mixed_lane_rows<kernels::Sm90Mixed::kHumming, 2>(w, sf, k, blk, lane, 2, x_cols,
                                                                     lo[lane], hi[lane]);
    }
    for (int lane = 0; lane < 16; lane += 2) {
      const int64_t row = blk * 16 + lane / 2;
      for (int p = 0; p < 2; ++p) {
        for (const auto& [got, rr] : {std::pair{lo, row}, std::pair{hi, row + 8}}) {
          const float sum = got[lane][p] + got[lane ^ 1][p] + got[lane ^ 16][p] + got[lane ^ 17][p];
          double want = 0.0;
          for (int64_t c = 0; c < k; ++c) {
            const int o = off[static_cast<size_t>(rr * (k / 32) + c / 32)];
            want += x_at(p, c) *
                    std::ldexp(e2m1_bits_to_float(static_cast<uint8_t>(code_at(rr, c))), o - 6);
          }
          EXPECT_EQ(static_cast<double>(sum), want) << "row " << rr << " input " << p;
        }
      }
    }
  }
}

// ---- fp64 formulas ----------------------------------------------------------------------------

TEST(CutlassFusedMoeHumming, MatchesFormula) {
  moe_fp4::expect_dtypes_and_acts_match_formula<Case>(300);
}

// Swiglu with swiglu_alpha / beta / limit (SwigluBias, gpt-oss style) on expert-parallel rank 1
// of 2 and tensor-parallel rank 1 of 2 (no fc2 bias there); raw scales over a range wider than
// Humming's 11 (clamped, payload rewritten by the preparation).
TEST(CutlassFusedMoeHumming, SwigluBiasParallelAndClampedScales) {
  Case c;
  c.swiglu_params = true;
  c.bias = true;
  c.ep_size = 2;
  c.ep_rank = 1;
  c.tp_size = 2;
  c.tp_rank = 1;
  c.scale_lo = 110;
  c.scale_span = 19;
  c.make(411);
  expect_matches(c, c.run()[0]);
}

// ---- bad input --------------------------------------------------------------------------------

TEST(CutlassFusedMoeHumming, BadInput) {
  Case c;
  c.T = 2;
  c.E = 2;
  c.make(5);
  const auto qs = c.quant_scales();
  auto with = [&](size_t i, Tensor t) {
    auto q = qs;
    q[i] = std::move(t);
    return q;
  };
  expect_fi_error([&] { (void)c.run({qs[0], qs[1], qs[2], qs[3]}, c.dt); }, "quant_scales");
  expect_fi_error([&] { (void)c.run(with(1, qs[1].to(DType::kBFloat16)), c.dt); }, "quant_scales");
  expect_fi_error(
      [&] {
        (void)c.run(with(0, qs[0].view({2, 4, 1, 32, 2})), c.dt);
      },
      "quant_scales");
  expect_fi_error([&] { (void)c.run(with(2, Tensor::full({3}, 1.0, DType::kFloat32)), c.dt); },
                  "quant_scales");
  expect_fi_error([&] { (void)c.run(with(4, Tensor::full({3}, 1.0, DType::kFloat32)), c.dt); },
                  "quant_scales");
  // The output dtype must be the input's.
  expect_fi_error([&] { (void)c.run(qs, DType::kFloat16); }, "output_dtype");
  // An fp8 input: upstream quantizes fp16 / bf16 inputs itself.
  expect_fi_error(
      [&] {
        (void)cutlass_fused_moe(Tensor::zeros({c.T, c.H}, DType::kFloat8E4M3FN), c.ids,
                                c.f32(c.rw, {c.T, 2}), c.w1i, c.w2i, DType::kBFloat16, qs,
                                std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                std::nullopt, std::nullopt, 1, 0, 1, 0, 1, 0, std::nullopt, false,
                                false, true, false, false, false, true);
      },
      "input");
  // hidden size not a multiple of 128.
  expect_fi_error(
      [&] {
        (void)cutlass_fused_moe(Tensor::zeros({c.T, 64}, DType::kBFloat16), c.ids,
                                c.f32(c.rw, {c.T, 2}), Tensor::zeros({2, 256, 32}, DType::kUInt8),
                                Tensor::zeros({2, 64, 64}, DType::kUInt8), DType::kBFloat16, qs,
                                std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                std::nullopt, std::nullopt, 1, 0, 1, 0, 1, 0, std::nullopt, false,
                                false, true, false, false, false, true);
      },
      "fc2_expert_weights");
  // Combinations upstream's runner does not build as Humming stay refused by name.
  auto flags = [&](bool packed, bool mxfp8) {
    return [&, packed, mxfp8] {
      (void)cutlass_fused_moe(Tensor::from_vector(c.x, {c.T, c.H}, c.dt), c.ids,
                              c.f32(c.rw, {c.T, 2}), c.w1i, c.w2i, c.dt, qs, std::nullopt,
                              std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                              1, 0, 1, 0, 1, 0, std::nullopt, false, false, true, mxfp8, false,
                              packed, true);
    };
  };
  expect_fi_error(flags(true, false), "use_packed_weights");
  expect_fi_error(flags(false, true), "use_mxfp8_act_scaling");
}

#if FLASHINFER_TEST_HAVE_CUDART
// Humming on CUDA (SGLang's --flashinfer-mxfp4-moe-precision fp8 on Hopper; refused by name
// below sm90, as upstream): the hand-checked golden exactly on both routes (a block per pair, tiles
// of up to 8 pairs of one expert); random layers against the CPU reference within the formula
// tests' tolerance (the activation's expf can move an fp8 code of GEMM2's input by one step), bf16
// Swiglu with biases and fp16 Relu2, SwigluBias on expert-parallel rank 1 of 2, 9 and 64 tokens,
// each on both routes and the default.
TEST(CutlassFusedMoeHummingCuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  moe_fp4::expect_sm90_mixed_routes(golden_relu2, expect_golden_relu2, [](Device d) {
    for (int which = 0; which < 3; ++which) {
      for (int64_t T : {9, 64}) {
        Case c;
        c.T = T;
        c.dt = which == 1 ? DType::kFloat16 : DType::kBFloat16;
        c.act = which == 1 ? ActivationType::Relu2 : ActivationType::Swiglu;
        c.bias = which != 1;
        c.swiglu_params = which == 2;
        if (which == 2) {
          c.ep_size = 2;
          c.ep_rank = 1;
        }
        c.make(400 + static_cast<uint64_t>(which));
        const Tensor got = c.run(c.quant_scales(), c.dt, d)[0].to(Device::cpu());
        SCOPED_TRACE(::testing::Message() << "case " << which << " T " << T);
        moe_fp4::expect_close_to_formula(got.to_double_vector(), c.run()[0].to_double_vector());
      }
    }
  });
}
#endif  // FLASHINFER_TEST_HAVE_CUDART

// ---- record and replay ------------------------------------------------------------------------

TEST(CutlassFusedMoeHumming, RecordAndReplay) {
  moe_fp4::expect_default_and_fp16_relu2_replay<Case>(51);
}

// ---- dumps in upstream's format ---------------------------------------------------------------

// Written by Python (torch 1.13) in upstream's dump format (tests/util/upstream_dump_py.h), the
// keyword arguments as SGLang's W4AFp8 MXFP4 method passes them: input=, token_selected_experts=,
// token_final_scales=, fc1/fc2_expert_weights=, output_dtype=, quant_scales= (5: the folded
// offsets viewed as int32, the residuals times 64 per local expert, a scalar 1, ...), output=,
// swiglu_limit=, use_w4_group_scaling=True, use_packed_weights=False, use_wfp4afp8_humming=True,
// activation_type=Swiglu, tp/ep sizes and ranks, profile_ids=None. The weights' e2m1 codes are
// constant over each 16-row x 64-column interleave tile (one sign per tile), which the "fp4_fp8"
// interleave leaves in place, so the script needs no interleave; the offsets (1..12) vary per
// block and are folded as interleave_moe_scales_for_sm90_mixed_gemm folds them. Expected outputs
// computed by torch at upstream's rounding points; a second call without swiglu_limit, Relu2,
// fp16, on expert-parallel rank 1 of 2. Both replay and pass.
const char* const kHummingCalls = R"PY(
torch.manual_seed(3)
def fp8(v):  # e4m3 value of fp32 v: RNE, saturating at 448 (cvt.rn.satfinite)
    a = POS8[rne(v.abs().clamp(max=448.0), POS8)]
    return torch.where(v < 0, -a, a)
def row_fp8(v):  # per-row dynamic fp8: quant 448 / amax, dequant 1 / quant (fp32)
    amax = v.abs().max()
    quant = torch.tensor(448.0) / amax if amax > 0 else torch.tensor(1.0)
    return fp8(v * quant), torch.tensor(1.0) / quant
def humming_weights(E, n, k):
    # e2m1 codes per (expert, 16-row tile, 64-column tile), both nibbles of a byte alike.
    c = torch.randint(0, 16, (E, n // 16, 1, k // 64, 1)).expand(E, n // 16, 16, k // 64, 64)
    c = c.reshape(E, n, k)
    w = (c[..., 0::2] | (c[..., 1::2] << 4)).to(torch.uint8)
    off = torch.randint(1, 13, (E, n, k // 32))
    fold = off.to(torch.uint8).reshape(E, n // 64, 4, 16, k // 128, 4).permute(0, 1, 4, 3, 2, 5)
    s = fold.reshape(E, n // 64, k // 128, 16, 16).contiguous().view(torch.int32)
    val = E2M1[c] * torch.pow(2.0, (off - 6).float()).repeat_interleave(32, 2)
    return w, s, val
def layer(x, ids, rw, E, H, I, gated, limit, dtype, ep_rank):
    n1 = 2 * I if gated else I
    w1, s1, w1v = humming_weights(E, n1, H)
    w2, s2, w2v = humming_weights(E, H, I)
    r1, r2 = torch.rand(E) * 0.05 + 0.01, torch.rand(E) * 0.05 + 0.01
    T, K = ids.shape
    rnd = lambda v: v.to(dtype).float()
    out = torch.zeros(T, H)
    for t in range(T):
        for k in range(K):
            e = int(ids[t, k]) - ep_rank * E
            if e < 0 or e >= E: continue
            xq, xs = row_fp8(x[t].float())
            g = rnd((xq @ w1v[e].T) * (xs * r1[e]))
            if gated and limit is not None:  # SwigluBias: alpha 1, beta 0, the limit
                gate, up = g[I:].clamp(max=limit[e]), g[:I].clamp(-limit[e], limit[e])
                h = gate * torch.sigmoid(gate) * up
            elif gated:
                h = F.silu(g[I:]) * g[:I]
            else:
                h = F.relu(g) ** 2
            hq, hs = row_fp8(h)
            out[t] += rw[t, k] * rnd((hq @ w2v[e].T) * (hs * r2[e]))
    return w1, w2, [s1, r1, torch.tensor(1.0), s2, r2], out.to(dtype)

# 1. SGLang's MXFP4 x dynamic-FP8 method: Swiglu with swiglu_limit, bf16, 8 experts, top-2.
T, E, H, I = 4, 8, 128, 128
ids = torch.stack([torch.randperm(E)[:2] for _ in range(T)]).to(torch.int32)
rw = torch.softmax(torch.randn(T, 2), -1)
x = torch.randn(T, H).bfloat16()
lim = torch.full((E,), 7.0)
w1, w2, qs, out = layer(x, ids, rw, E, H, I, True, lim, torch.bfloat16, 0)
meta = {"kwarg_output_dtype": {"type": "torch.dtype", "value": "torch.bfloat16"},
        "kwarg_use_w4_group_scaling": True, "kwarg_use_packed_weights": False,
        "kwarg_use_wfp4afp8_humming": True,
        "kwarg_activation_type": {"type": "enum", "name": "ActivationType.Swiglu", "value": 3},
        "kwarg_tp_size": 8, "kwarg_tp_rank": 3, "kwarg_ep_size": 1, "kwarg_ep_rank": 0,
        "kwarg_profile_ids": None}
rec_moe({"kwarg_input": x, "kwarg_token_selected_experts": ids, "kwarg_token_final_scales": rw,
     "kwarg_fc1_expert_weights": w1, "kwarg_fc2_expert_weights": w2,
     "kwarg_output": torch.zeros(T, H).bfloat16(), "kwarg_swiglu_limit": lim}, qs, meta, out, E, T)

# 2. Relu2, fp16, expert-parallel rank 1 of 2 (local experts 4..7 of 8), tune_max_num_tokens.
E = 4
ids = torch.stack([torch.randperm(2 * E)[:2] for _ in range(T)]).to(torch.int32)
x = torch.randn(T, H).half()
w1, w2, qs, out = layer(x, ids, rw, E, H, I, False, None, torch.float16, 1)
meta = {"kwarg_output_dtype": {"type": "torch.dtype", "value": "torch.float16"},
        "kwarg_use_w4_group_scaling": True, "kwarg_use_wfp4afp8_humming": True,
        "kwarg_activation_type": {"type": "enum", "name": "ActivationType.Relu2", "value": 6},
        "kwarg_ep_size": 2, "kwarg_ep_rank": 1, "kwarg_tune_max_num_tokens": 4,
        "kwarg_use_fused_finalize": True}
rec_moe({"kwarg_input": x, "kwarg_token_selected_experts": ids, "kwarg_token_final_scales": rw,
     "kwarg_fc1_expert_weights": w1, "kwarg_fc2_expert_weights": w2}, qs, meta, out, E, T)
)PY";

TEST(CutlassFusedMoeHumming, UpstreamDumpReplays) {
  if (!moe_fp4::cutlass_moe_dumps_replay("fi_moe_cutlass_humming_dump", kHummingCalls, 2u)) {
    GTEST_SKIP() << "python3-torch not installed";
  }
}

}  // namespace
}  // namespace flashinfer::testing
