// cutlass_fused_moe's FP4 paths (NVFP4, MXFP8 activations x MXFP4 weights, W4A16 MXFP4 in the
// SM90 layouts) and MXFP8 x MXFP8 (the same code with e4m3 weights): a hand-checked golden, fp64
// formulas (8 experts, top-2) in upstream's argument forms (int64-packed weights, int32-viewed
// 128x4 scales, quant_scales in upstream's order), bad input naming the argument, record/replay in
// memory and through a dump directory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "kernels/cpu/moe_cutlass_fp4_cpu.h"
#include "kernels/moe_sm90_mixed_rules.h"
#include "ops/moe_fp4_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"

#if FLASHINFER_TEST_HAVE_CUDART
#include <cuda_runtime.h>

#include "api/device_props.h"
#include "kernels/cuda/moe_cuda.h"
#include "util/cuda_graph_util.h"
#endif

namespace flashinfer::testing {
namespace {

using moe_fp4::bytes_tensor;
using moe_fp4::e4m3_codes;
using moe_fp4::random_bytes;
using moe_fp4::Rng;
using moe_fp4::silu;
using moe_fp4::to_dt;

enum class Path { kNvfp4, kNvfp4Packed, kMxfp8Mxfp4, kW4A16, kMxfp8Mxfp8 };

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

double e2m1_at(const std::vector<uint8_t>& packed, size_t i) {
  const uint8_t b = packed[i / 2];
  return e2m1_bits_to_float(static_cast<uint8_t>(i % 2 == 0 ? b & 0xF : b >> 4));
}

// Independent transcription of the 128x4 scale swizzle (docs/QUANTIZATION.md): linear per-expert
// [rows, cols] codes into round_up(rows, 128) x round_up(cols, 4) bytes each, padding zero.
std::vector<uint8_t> swizzle_128x4(const std::vector<uint8_t>& lin, int64_t E, int64_t rows,
                                   int64_t cols) {
  const int64_t pr = round_up(rows, 128), pc = round_up(cols, 4), per = pr * pc;
  std::vector<uint8_t> out(static_cast<size_t>(E * per), 0);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t off = (r / 128) * (pc / 4) * 512 + (c / 4) * 512 + (r % 32) * 16 +
                            ((r % 128) / 32) * 4 + c % 4;
        out[static_cast<size_t>(e * per + off)] =
            lin[static_cast<size_t>((e * rows + r) * cols + c)];
      }
    }
  }
  return out;
}

double ue8m0(uint8_t code) { return std::ldexp(1.0, static_cast<int>(code) - 127); }

// The ids of T tokens over E experts, top-2, distinct per token; token 0 takes experts 0 and 7.
Tensor pair_ids(int64_t T, int64_t E) {
  std::vector<double> v;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t a = (t * 3) % E, b = (a + 1 + (t * 5) % (E - 1)) % E;
    v.push_back(static_cast<double>(t == 0 ? 0 : a));
    v.push_back(static_cast<double>(t == 0 ? 7 : b));
  }
  return Tensor::from_vector(v, {T, 2}, DType::kInt32);
}

struct Case : moe_fp4::LayerExtras {
  Path path = Path::kNvfp4;
  int64_t T = 5, E = 8, H = 64, I = 32;
  ActivationType act = ActivationType::Swiglu;
  DType in_dt = DType::kBFloat16, out_dt = DType::kBFloat16;
  bool bias = false, swiglu_params = false, per_expert_act = false, swizzled_sf = true;
  int64_t ep_rank = 0, ep_size = 1;

  bool gated() const { return act != ActivationType::Relu2 && act != ActivationType::Relu; }
  int64_t N1() const { return gated() ? 2 * I : I; }
  int vec() const { return path == Path::kNvfp4 || path == Path::kNvfp4Packed ? 16 : 32; }
  bool nv() const { return vec() == 16; }
  bool mx8() const { return path == Path::kMxfp8Mxfp4 || path == Path::kMxfp8Mxfp8; }
  bool w8() const { return path == Path::kMxfp8Mxfp8; }

  // plain data
  std::vector<uint8_t> xq, xs, w1, s1, w2, s2;  // packed input / its linear scales; weights
  std::vector<double> xf;                       // fp16/bf16 input values
  std::vector<double> a1, a2, g1, g2;           // b1, b2, alpha, beta, limit, rw: LayerExtras
  Tensor ids;

  void make(uint64_t seed) {
    Rng r{seed};
    auto vec_d = [&](int64_t n, double lo, double hi) {
      return moe_fp4::uniform_f32(r, n, lo, hi);
    };
    const int64_t v = vec();
    if (path == Path::kNvfp4Packed) {
      xq = random_bytes(static_cast<size_t>(T * H / 2), seed + 1);
      xs = e4m3_codes(static_cast<size_t>(T * H / 16), seed + 2, 0.5, 1.0);
    } else if (mx8()) {
      xq.resize(static_cast<size_t>(T * H));
      for (auto& b : xq) b = float_to_e4m3fn_bits(static_cast<float>(r.uniform(-3, 3)), true);
      xs.resize(static_cast<size_t>(T * H / 32));
      for (auto& b : xs) b = static_cast<uint8_t>(125 + r.next() % 3);
    } else {
      xf = vec_d(T * H, -2, 2);
      for (auto& d : xf) d = to_dt(in_dt, d);
    }
    w1 = random_bytes(static_cast<size_t>(E * N1() * H / 2), seed + 3);
    w2 = random_bytes(static_cast<size_t>(E * H * I / 2), seed + 4);
    if (w8()) {  // e4m3 weight codes of magnitude below 4
      w1 = e4m3_codes(static_cast<size_t>(E * N1() * H), seed + 3, -4.0, 4.0);
      w2 = e4m3_codes(static_cast<size_t>(E * H * I), seed + 4, -4.0, 4.0);
    }
    if (nv()) {
      s1 = e4m3_codes(static_cast<size_t>(E * N1() * H / v), seed + 5, 0.02, 0.06);
      s2 = e4m3_codes(static_cast<size_t>(E * H * I / v), seed + 6, 0.02, 0.06);
    } else {
      s1.resize(static_cast<size_t>(E * N1() * H / v));
      s2.resize(static_cast<size_t>(E * H * I / v));
      for (auto& b : s1) b = static_cast<uint8_t>(120 + r.next() % 3);
      for (auto& b : s2) b = static_cast<uint8_t>(120 + r.next() % 3);
    }
    a1 = vec_d(per_expert_act ? E : 1, 0.5, 2.0);
    a2 = vec_d(per_expert_act ? E : 1, 0.5, 2.0);
    g1 = vec_d(E, 0.5, 1.5);
    g2 = vec_d(E, 0.5, 1.5);
    LayerExtras::make(r, E, N1(), H, T, out_dt, bias, swiglu_params);
    ids = pair_ids(T, E * ep_size);
  }

  Tensor f32(const std::vector<double>& v, Shape s) const {
    return Tensor::from_vector(v, std::move(s), DType::kFloat32);
  }
  std::optional<Tensor> opt_f32(const std::vector<double>& v) const {
    if (v.empty()) return std::nullopt;
    return f32(v, {E});
  }
  Tensor act_global(const std::vector<double>& v) const {
    return per_expert_act ? f32(v, {E}) : Tensor::from_vector(v, {}, DType::kFloat32);
  }

  Tensor input() const {
    if (path == Path::kNvfp4Packed) return bytes_tensor(xq, {T, H / 2});
    if (mx8()) return bytes_tensor(xq, {T, H}, DType::kFloat8E4M3FN);
    return Tensor::from_vector(xf, {T, H}, in_dt);
  }
  std::optional<Tensor> input_sf() const {
    if (xs.empty()) return std::nullopt;
    if (!swizzled_sf) return bytes_tensor(xs, {T, H / vec()});
    const auto sw = swizzle_128x4(xs, 1, T, H / vec());
    return bytes_tensor(sw, {static_cast<int64_t>(sw.size())});
  }
  Tensor weights(const std::vector<uint8_t>& w, int64_t rows, int64_t cols) const {
    if (path == Path::kW4A16) {
      return interleave_moe_weights_for_sm90_mixed_gemm(bytes_tensor(w, {E, rows, cols / 2}),
                                                        "fp4");
    }
    if (w8()) return bytes_tensor(w, {E, rows, cols}, DType::kFloat8E4M3FN);
    return bytes_tensor(w, {E, rows, cols / 16}, DType::kInt64);
  }
  Tensor weight_scales(const std::vector<uint8_t>& s, int64_t rows, int64_t cols) const {
    if (path == Path::kW4A16) {
      return interleave_moe_scales_for_sm90_mixed_gemm(bytes_tensor(s, {E, rows, cols / 32}));
    }
    const auto sw = swizzle_128x4(s, E, rows, cols / vec());
    return bytes_tensor(sw, {E, round_up(rows, 128), round_up(cols / vec(), 4) / 4}, DType::kInt32);
  }
  std::vector<Tensor> quant_scales() const {
    const Tensor ws1 = weight_scales(s1, N1(), H), ws2 = weight_scales(s2, H, I);
    if (path == Path::kW4A16) return {ws1, ws2};
    if (mx8()) return {ws1, f32(g1, {E}), ws2, f32(g2, {E})};
    return {act_global(a1), ws1, f32(g1, {E}), act_global(a2), ws2, f32(g2, {E})};
  }
  std::optional<Tensor> bias_t(const std::vector<double>& b, int64_t n) const {
    if (b.empty()) return std::nullopt;
    return Tensor::from_vector(b, {E, n}, out_dt);
  }

  // Every tensor argument of the call, on one device (the weights prepared on the CPU).
  struct Args {
    Tensor input, ids, rw, w1, w2;
    std::vector<Tensor> qs;
    std::optional<Tensor> b1, b2, input_sf, alpha, beta, limit;
  };
  Args args(Device dev = Device::cpu()) const {
    auto on = [&](std::optional<Tensor> t) -> std::optional<Tensor> {
      if (!t) return t;
      return t->to(dev);
    };
    Args a{input().to(dev),
           ids.to(dev),
           f32(rw, {T, 2}).to(dev),
           weights(w1, N1(), H).to(dev),
           weights(w2, H, I).to(dev),
           quant_scales(),
           on(bias_t(b1, N1())),
           on(bias_t(b2, H)),
           on(input_sf()),
           on(opt_f32(alpha)),
           on(opt_f32(beta)),
           on(opt_f32(limit))};
    for (Tensor& t : a.qs) t = t.to(dev);
    return a;
  }
  std::vector<Tensor> run(const Args& a, std::optional<Tensor> output = std::nullopt) const {
    return cutlass_fused_moe(a.input, a.ids, a.rw, a.w1, a.w2, out_dt, a.qs, a.b1, a.b2, a.input_sf,
                             a.alpha, a.beta, a.limit, 1, 0, ep_size, ep_rank, 1, 0, output, false,
                             false, path == Path::kW4A16, mx8(), false, false, false, 8192,
                             std::nullopt, act, swizzled_sf);
  }
  std::vector<Tensor> run(std::optional<Tensor> output = std::nullopt) const {
    return run(args(), std::move(output));
  }

  // The value the GEMM reads for a weight element.
  double wval(const std::vector<uint8_t>& w, const std::vector<uint8_t>& s, int64_t e, int64_t rows,
              int64_t cols, int64_t r, int64_t c) const {
    const uint8_t sc = s[static_cast<size_t>((e * rows + r) * (cols / vec()) + c / vec())];
    const size_t i = static_cast<size_t>((e * rows + r) * cols + c);
    const double q = w8() ? e4m3fn_bits_to_float(w[i]) : e2m1_at(w, i);
    return q * (nv() ? e4m3fn_bits_to_float(sc) : ue8m0(sc));
  }
  // Row x of token t as GEMM1 reads it for expert e.
  std::vector<double> xrow(int64_t t, int64_t e) const {
    std::vector<double> x(static_cast<size_t>(H));
    if (path == Path::kNvfp4Packed || mx8()) {
      for (int64_t d = 0; d < H; ++d) {
        const size_t i = static_cast<size_t>(t * H + d);
        const uint8_t sc = xs[static_cast<size_t>(t * (H / vec()) + d / vec())];
        x[static_cast<size_t>(d)] = nv() ? e2m1_at(xq, i) * e4m3fn_bits_to_float(sc)
                                         : e4m3fn_bits_to_float(xq[i]) * ue8m0(sc);
      }
      return x;
    }
    std::vector<double> row(xf.begin() + t * H, xf.begin() + (t + 1) * H);
    if (path == Path::kW4A16) return row;
    // NVFP4 quantization in the op with the fc1 input global scale, read back as e2m1 * sf.
    const Tensor gs = Tensor::from_vector({a1[per_expert_act ? e : 0]}, {1}, DType::kFloat32);
    auto [q, sf] = fp4_quantize(Tensor::from_vector(row, {1, H}, in_dt), gs, 16, false, false);
    return e2m1_and_ufp8sf_scale_to_float(q, sf, Tensor::full({1}, 1.0, DType::kFloat32), 16, 1,
                                          false)
        .to_double_vector();
  }
  // The activation row as GEMM2 reads it.
  std::vector<double> requant(const std::vector<double>& h, int64_t e) const {
    if (path == Path::kW4A16) return h;
    const Tensor ht = Tensor::from_vector(h, {1, I}, out_dt);
    if (nv()) {
      const Tensor gs = Tensor::from_vector({a2[per_expert_act ? e : 0]}, {1}, DType::kFloat32);
      auto [q, sf] = fp4_quantize(ht, gs, 16, false, false);
      return e2m1_and_ufp8sf_scale_to_float(q, sf, Tensor::full({1}, 1.0, DType::kFloat32), 16, 1,
                                            false)
          .to_double_vector();
    }
    auto [q, sf] = mxfp8_quantize(ht, false);
    return mxfp8_dequantize_host(q, sf, false).to_double_vector();
  }

  std::vector<double> expected() const {
    const auto idv = ids.to_double_vector();
    const DType gdt = out_dt;
    const bool quant = path != Path::kW4A16;
    std::vector<double> out(static_cast<size_t>(T * H), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < 2; ++k) {
        const int64_t e = static_cast<int64_t>(idv[static_cast<size_t>(t * 2 + k)]) - ep_rank * E;
        if (e < 0 || e >= E) continue;
        const auto x = xrow(t, e);
        std::vector<double> g(static_cast<size_t>(N1()));
        for (int64_t j = 0; j < N1(); ++j) {
          double acc = 0.0;
          for (int64_t d = 0; d < H; ++d) acc += x[d] * wval(w1, s1, e, N1(), H, j, d);
          // The bias is added in fp32 to the GEMM output stored in G (doActivationKernel).
          g[j] = to_dt(gdt, (quant ? g1[e] : 1.0) * acc) + (b1.empty() ? 0.0 : b1[e * N1() + j]);
        }
        std::vector<double> h(static_cast<size_t>(I));
        for (int64_t j = 0; j < I; ++j) h[j] = to_dt(gdt, act_ref(act, g, j, I, e));
        const auto hq = requant(h, e);
        for (int64_t d = 0; d < H; ++d) {
          double acc = 0.0;
          for (int64_t j = 0; j < I; ++j) acc += hq[j] * wval(w2, s2, e, H, I, d, j);
          // GEMM2's output stored in G; the finalize adds the bias in fp32.
          const double y = to_dt(gdt, (quant ? g2[e] : 1.0) * acc);
          out[static_cast<size_t>(t * H + d)] +=
              rw[static_cast<size_t>(t * 2 + k)] * (y + (b2.empty() ? 0.0 : b2[e * H + d]));
        }
      }
    }
    return out;
  }
};

void expect_matches(const Case& c, const Tensor& out) {
  moe_fp4::expect_close_to_formula(out.to_double_vector(), c.expected());
}

// ---- golden ---------------------------------------------------------------------------------

// The golden layer: H = I = 16, E_l = 4 local experts (rank 1 of 2: global ids 4..7), Relu2, a
// pre-quantized NVFP4 input of ones (code 1.0, linear scale 1.0), weights of ones (code 1.0,
// scale 1.0 in the 128x4 layout), fc1_global 0.5, fc2_act_global 0.75.
struct Golden {
  static constexpr int64_t E = 4, H = 16, I = 16, T = 2;
  static Tensor scalar(double v) { return Tensor::from_vector({v}, {}, DType::kFloat32); }
  std::vector<Tensor> run(DType out_dt, double fc2_global, std::optional<Tensor> b2,
                          int64_t tp_size, int64_t tp_rank) const {
    const Tensor x = bytes_tensor(std::vector<uint8_t>(T * H / 2, 0x22), {T, H / 2});
    const Tensor sf = bytes_tensor(std::vector<uint8_t>(T, 0x38), {T, 1});  // e4m3 1.0
    const Tensor w1 =
        bytes_tensor(std::vector<uint8_t>(E * I * H / 2, 0x22), {E, I, H / 16}, DType::kInt64);
    const Tensor w2 =
        bytes_tensor(std::vector<uint8_t>(E * H * I / 2, 0x22), {E, H, I / 16}, DType::kInt64);
    // One scale column (16 / 16) padded to 4, 128 rows: code 1.0 where a real row's column 0
    // lands in the 128x4 swizzle (byte 16 r), zero padding elsewhere.
    std::vector<uint8_t> ws(static_cast<size_t>(E * 128 * 4), 0);
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t r = 0; r < 16; ++r) ws[static_cast<size_t>(e * 512 + r * 16)] = 0x38;
    }
    const Tensor wsf = bytes_tensor(ws, {E, 128, 1}, DType::kInt32);
    const Tensor ids = Tensor::from_vector({5, 2, 4, 7}, {T, 2}, DType::kInt32);
    const Tensor rw = Tensor::from_vector({1.0, 0.75, 0.5, 0.5}, {T, 2}, DType::kFloat32);
    const Tensor g1 = Tensor::full({E}, 0.5, DType::kFloat32);
    const Tensor g2 = Tensor::full({E}, fc2_global, DType::kFloat32);
    std::optional<Tensor> b1;
    if (b2) b1 = Tensor::zeros({E, I}, out_dt);
    return cutlass_fused_moe(x, ids, rw, w1, w2, out_dt,
                             std::vector<Tensor>{scalar(1.0), wsf, g1, scalar(0.75), wsf, g2}, b1,
                             b2, sf, std::nullopt, std::nullopt, std::nullopt, tp_size, tp_rank, 2,
                             1, 1, 0, std::nullopt, false, false, false, false, false, false, false,
                             8192, std::nullopt, ActivationType::Relu2, false);
  }
};

// Hand-checked. GEMM1: 16 * 0.5 = 8; Relu2: 64; re-quantized with fc2_act_global 0.75:
// sf = e4m3(0.75 * 64 / 6) = 8, q = e2m1(64 * 0.75 / 8) = 6, read as 6 * 8 = 48; GEMM2:
// 16 * 48 = 768, times fc2_global 1 / 0.75: 1024. Token 0 goes to experts 5 (local, scale 1) and
// 2 (not local): 1024. Token 1 goes to 4 and 7 (0.5 + 0.5): 1024.
TEST(CutlassFusedMoeFp4, GoldenNvfp4) {
  const auto out = Golden{}.run(DType::kBFloat16, 1.0 / 0.75, std::nullopt, 1, 0);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].to_double_vector(), std::vector<double>(2 * Golden::H, 1024.0));
}

// Where fc2's bias enters (finalizeMoeRoutingKernel: GEMM2's output is stored in the output
// dtype first, the bias added in fp32 during the reduction, on tensor-parallel rank 0 only).
// fp16 output, fc2_global = 1024.4 / 768 so GEMM2 gives 1024.4 (stored: 1024), b2 = fp16(0.4)
// = 0.39990234375: 1024 + 0.3999 rounds to 1024 (adding the bias before storing would give
// 1025). On tp rank 1 with b2 = 2 the bias is skipped: 1024, not 1026.
TEST(CutlassFusedMoeFp4, GoldenBiasPoints) {
  const double g2 = static_cast<float>(1024.4 / 768.0);
  const auto b = [](double v) { return Tensor::full({Golden::E, Golden::H}, v, DType::kFloat16); };
  const auto rank0 = Golden{}.run(DType::kFloat16, g2, b(0.4), 2, 0)[0].to_double_vector();
  const auto rank1 = Golden{}.run(DType::kFloat16, g2, b(2.0), 2, 1)[0].to_double_vector();
  for (int64_t d = 0; d < Golden::H; ++d) {
    EXPECT_EQ(rank0[static_cast<size_t>(d)], 1024.0) << d;
    EXPECT_EQ(rank1[static_cast<size_t>(d)], 1024.0) << d;
  }
  // Token 1: 0.5 * (1024 + 0.3999) * 2 = 1024.3999 -> 1024 as well; with b2 = 2 on rank 0: 1026.
  const auto plus2 = Golden{}.run(DType::kFloat16, g2, b(2.0), 2, 0)[0].to_double_vector();
  EXPECT_EQ(plus2[0], 1026.0);
  EXPECT_EQ(plus2[static_cast<size_t>(Golden::H)], 1026.0);
}

// ---- fp64 formulas ----------------------------------------------------------------------------

TEST(CutlassFusedMoeFp4, Nvfp4MatchesFormula) {
  uint64_t seed = 100;
  for (DType in_dt : {DType::kBFloat16, DType::kFloat16}) {
    for (ActivationType act :
         {ActivationType::Swiglu, ActivationType::Relu2, ActivationType::SwigluStep}) {
      Case c;
      c.in_dt = c.out_dt = in_dt;
      c.act = act;
      c.per_expert_act = act == ActivationType::Relu2;
      c.bias = act == ActivationType::Swiglu;
      c.make(++seed);
      SCOPED_TRACE(std::string(dtype_label(in_dt)) + " act " +
                   std::to_string(static_cast<int>(act)));
      expect_matches(c, c.run()[0]);
    }
  }
  // Swiglu with swiglu_alpha / beta / limit runs as SwigluBias; expert parallel rank 1 of 2.
  Case c;
  c.swiglu_params = true;
  c.ep_size = 2;
  c.ep_rank = 1;
  c.out_dt = DType::kFloat16;
  c.make(7);
  expect_matches(c, c.run()[0]);
}

TEST(CutlassFusedMoeFp4, Nvfp4PackedInputBothScaleLayouts) {
  for (bool swizzled : {true, false}) {
    Case c;
    c.path = Path::kNvfp4Packed;
    c.swizzled_sf = swizzled;
    c.make(swizzled ? 21 : 22);
    SCOPED_TRACE(swizzled ? "swizzled input_sf" : "linear input_sf");
    expect_matches(c, c.run()[0]);
  }
}

// MXFP8 x MXFP8, hand-checked: H = I = 128, Relu2, one local expert of two (ep rank 0), input
// e4m3 1.0 with ue8m0 scales 127 (2^0), weights e4m3 0.5 with scales 127, fc1_global 0.25,
// fc2_global 0.125. GEMM1: 128 * 0.5 * 0.25 = 16; Relu2 256; MXFP8 re-quantization of a row of
// 256: ue8m0 ceil(log2(256 / 448)) = 0 (scale 1), code 256 exactly; GEMM2: 128 * 256 * 0.5 *
// 0.125 = 2048; token weights 0.75 (expert 0) and 0.25 (expert 1, not local): 1536.
TEST(CutlassFusedMoeFp4, GoldenMxfp8Mxfp8) {
  const int64_t H = 128, I = 128;
  const Tensor x = bytes_tensor(std::vector<uint8_t>(H, 0x38), {1, H}, DType::kFloat8E4M3FN);
  const Tensor sf = bytes_tensor(std::vector<uint8_t>(128 * 4, 127), {128 * 4});
  const Tensor w = bytes_tensor(std::vector<uint8_t>(I * H, 0x30), {1, I, H}, DType::kFloat8E4M3FN);
  const Tensor ws =
      bytes_tensor(std::vector<uint8_t>(I * H / 32, 127), {1, I, H / 128}, DType::kInt32);
  const auto out = cutlass_fused_moe(
      x, Tensor::from_vector({0, 1}, {1, 2}, DType::kInt32),
      Tensor::from_vector({0.75, 0.25}, {1, 2}, DType::kFloat32), w, w, DType::kBFloat16,
      std::vector<Tensor>{ws, Tensor::full({1}, 0.25, DType::kFloat32), ws,
                          Tensor::full({1}, 0.125, DType::kFloat32)},
      std::nullopt, std::nullopt, sf, std::nullopt, std::nullopt, std::nullopt, 1, 0, 2, 0, 1, 0,
      std::nullopt, false, false, false, true, false, false, false, 8192, std::nullopt,
      ActivationType::Relu2);
  EXPECT_EQ(out[0].to_double_vector(), std::vector<double>(H, 1536.0));
}

// MXFP8 activations x MXFP4 weights, and x MXFP8 weights (upstream's test_moe_mxfp8_mxfp8:
// mxfp8_quantize(w[e], swizzled) stacked, the scales viewed int32 [E, rows, cols / 128]; the same
// math with e4m3 weight codes): plain and with SwigluBias parameters; MXFP8 x MXFP8 also Relu2,
// biases, expert-parallel rank 1 of 2.
TEST(CutlassFusedMoeFp4, Mxfp8ActivationsMatchFormula) {
  uint64_t seed = 30;
  for (Path path : {Path::kMxfp8Mxfp4, Path::kMxfp8Mxfp8}) {
    for (bool params : {false, true}) {
      Case c;
      c.path = path;
      c.H = c.I = 128;
      c.T = 3;
      c.swiglu_params = params;
      c.out_dt = params ? DType::kFloat16 : DType::kBFloat16;
      if (path == Path::kMxfp8Mxfp8) {
        c.bias = params;
        c.act = params ? ActivationType::Swiglu : ActivationType::Relu2;
        c.ep_size = params ? 2 : 1;
        c.ep_rank = params ? 1 : 0;
      }
      c.make(++seed);
      SCOPED_TRACE(std::string(path == Path::kMxfp8Mxfp8 ? "MXFP8 weights" : "MXFP4 weights") +
                   (params ? ", SwigluBias" : ""));
      expect_matches(c, c.run()[0]);
    }
  }
}

TEST(CutlassFusedMoeFp4, W4A16Mxfp4MatchesFormula) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    Case c;
    c.path = Path::kW4A16;
    c.H = c.I = 128;
    c.T = 3;
    c.in_dt = c.out_dt = dt;
    c.bias = dt == DType::kBFloat16;
    c.make(dt == DType::kBFloat16 ? 41 : 42);
    expect_matches(c, c.run()[0]);
  }
}

// The CUDA kernels read W4A16 weights and scales in place through kernels/moe_sm90_mixed_rules.h.
// Here those rules run lane by lane as a warp runs them (sm90_mixed_lane_rows on each of 32 lanes,
// then the four lanes of a row added) over weights that upstream's preparation functions laid out,
// against plain dot products over the codes before the interleave and the scales before the fold.
// The CPU reference undoes the interleave its own way (a bit permutation found by running the
// forward transform): its de-interleaved bytes must be the plain ones too. Integer x and
// power-of-two scales keep every fp32 sum exact, so the sums must be equal, not close.
TEST(CutlassFusedMoeFp4, Sm90Fp4LanesReadWhatTheInterleaveWrote) {
  for (uint32_t code = 0; code < 16; ++code) {
    EXPECT_EQ(std::bit_cast<uint32_t>(kernels::e2m1_code_to_float(static_cast<uint8_t>(code))),
              std::bit_cast<uint32_t>(e2m1_bits_to_float(static_cast<uint8_t>(code))))
        << code;
  }
  const int64_t rows = 128, k = 256, row_bytes = k / 2;  // 8 blocks of 16 rows, 4 partitions
  const std::vector<uint8_t> plain = random_bytes(static_cast<size_t>(rows * row_bytes), 77);
  std::vector<uint8_t> sc(static_cast<size_t>(rows * k / 32));
  Rng r{78};
  for (auto& b : sc) b = static_cast<uint8_t>(125 + r.next() % 5);  // 2^-2 .. 2^2
  const Tensor inter =
      interleave_moe_weights_for_sm90_mixed_gemm(bytes_tensor(plain, {1, rows, row_bytes}), "fp4");
  const Tensor folded =
      interleave_moe_scales_for_sm90_mixed_gemm(bytes_tensor(sc, {1, rows, k / 32}));
  const auto* w = static_cast<const uint8_t*>(inter.data_ptr());
  const auto* sf = static_cast<const uint8_t*>(folded.data_ptr());
  std::vector<uint8_t> undone(plain.size());
  kernels::cpu::sm90_deinterleave_fp4_weights(w, undone.data(), rows, k);
  EXPECT_EQ(undone, plain);
  auto code_at = [&](int64_t row, int64_t col) {
    return moe_fp4::plain_code(plain, row_bytes, row, col);
  };
  // Every nibble of every word where sm90_fp4_word_col0 / sm90_fp4_word_code say it is.
  int64_t nibbles = 0;
  moe_fp4::for_each_sm90_word(w, rows, k, [&](uint32_t v, int64_t blk, int pr, int64_t q, int wd) {
    for (int n = 0; n < 8; ++n) {
      const int64_t row = blk * 16 + pr % 8 + 8 * ((n >> 1) & 1);
      const int64_t col = 64 * q + kernels::sm90_fp4_word_col0(pr, wd) + (n & 1) + 8 * (n >> 2);
      ASSERT_EQ(kernels::sm90_fp4_word_code(v, n), code_at(row, col))
          << "block " << blk << " row " << pr << " partition " << q << " word " << wd;
      ++nibbles;
    }
  });
  EXPECT_EQ(nibbles, rows * k);
  // Three input rows at once (the tiled route's form; n = 2 leaves row 2's sums at zero).
  std::vector<float> x(static_cast<size_t>(3 * k));
  for (auto& v : x) v = static_cast<float>(static_cast<int>(r.next() % 7) - 3);
  auto x_at = [&](int p, int64_t i) { return x[static_cast<size_t>(p * k + i)]; };
  auto x_cols = [&](int p, int64_t c, float(&xs)[16]) {
    for (int i = 0; i < 16; ++i) xs[i] = x_at(p, c + i);
  };
  for (int n : {3, 2}) {
    for (int64_t blk = 0; blk < rows / 16; ++blk) {
      float lo[32][3], hi[32][3];
      for (int lane = 0; lane < 32; ++lane) {
        kernels::sm90_mixed_lane_rows<kernels::Sm90Mixed::kW4A16, 3>(w, sf, k, blk, lane, n, x_cols,
                                                                     lo[lane], hi[lane]);
      }
      for (int lane = 0; lane < 16; lane += 2) {
        const int64_t row = blk * 16 + lane / 2;
        for (int p = 0; p < 3; ++p) {
          for (const auto& [got, rr] : {std::pair{lo, row}, std::pair{hi, row + 8}}) {
            const float sum =
                got[lane][p] + got[lane ^ 1][p] + got[lane ^ 16][p] + got[lane ^ 17][p];
            double want = 0.0;
            for (int64_t c = 0; c < k && p < n; ++c) {
              want += x_at(p, c) * e2m1_bits_to_float(static_cast<uint8_t>(code_at(rr, c))) *
                      ue8m0(sc[static_cast<size_t>(rr * (k / 32) + c / 32)]);
            }
            EXPECT_EQ(static_cast<double>(sum), want)
                << "row " << rr << " input " << p << " n " << n;
          }
        }
      }
    }
  }
}

// A W4A16 case whose every fp32 sum and product is exact in any order, so the CUDA kernels must
// give the CPU reference's bytes: inputs in {-1, 0, 1}, codes at most 6, GEMM1 scales 2^-4 and
// 2^-3 (each term a multiple of 2^-5, |GEMM1| <= 128 * 6 / 8 = 96), biases in 16ths, Relu
// (|h| <= 97, multiples of 2^-5), GEMM2 scales 2^-5 and 2^-4 (terms multiples of 2^-11, sums of
// magnitudes below 128 * 97 * 6 / 16 = 4656 < 2^24 * 2^-11), routing weights 1/2 and 1/4.
// Expert-parallel rank 1 of 2; T tokens (64: several tiles of 8 pairs for some experts).
Case exact_w4a16_case(DType dt, uint64_t seed, int64_t T = 9) {
  Case c;
  c.path = Path::kW4A16;
  c.H = 128;
  c.I = 128;
  c.T = T;
  c.in_dt = c.out_dt = dt;
  c.act = ActivationType::Relu;
  c.bias = true;
  c.ep_size = 2;
  c.ep_rank = 1;
  c.make(seed);
  Rng r{seed + 100};
  for (auto& v : c.xf) v = static_cast<double>(static_cast<int>(r.next() % 3) - 1);
  for (auto& b : c.s1) b = static_cast<uint8_t>(123 + r.next() % 2);
  for (auto& b : c.s2) b = static_cast<uint8_t>(122 + r.next() % 2);
  for (size_t i = 0; i < c.rw.size(); ++i) c.rw[i] = i % 2 == 0 ? 0.5 : 0.25;
  for (auto& v : c.b1) v = static_cast<double>(static_cast<int>(r.next() % 33) - 16) / 16.0;
  for (auto& v : c.b2) v = static_cast<double>(static_cast<int>(r.next() % 33) - 16) / 16.0;
  return c;
}

// The CUDA test's exact cases are exact on the CPU: the reference equals the fp64 formula bit for
// bit (every sum exact, only the formula's own roundings), with enough nonzero outputs to see.
TEST(CutlassFusedMoeFp4, CudaTestW4A16CasesAreExactOnCpu) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t T : {9, 64}) {
      const Case c = exact_w4a16_case(dt, dt == DType::kBFloat16 ? 61 : 62, T);
      const auto got = c.run()[0].to_double_vector();
      std::vector<double> want = c.expected();
      for (double& v : want) v = to_dt(dt, v);
      EXPECT_EQ(got, want) << dtype_label(dt) << " T " << T;
      EXPECT_GT(std::count_if(got.begin(), got.end(), [](double v) { return v != 0.0; }),
                c.T * c.H / 4)
          << dtype_label(dt) << " T " << T;
    }
  }
}

// ---- bad input ------------------------------------------------------------------------------

TEST(CutlassFusedMoeFp4, BadInput) {
  const char* op = "cutlass_fused_moe";
  Case c;
  c.make(5);
  const Tensor x = c.input(), ids = c.ids, rw = c.f32(c.rw, {c.T, 2});
  const Tensor w1 = c.weights(c.w1, c.N1(), c.H), w2 = c.weights(c.w2, c.H, c.I);
  const auto qs = c.quant_scales();
  auto call = [&](const Tensor& in, const Tensor& a, const Tensor& b, std::vector<Tensor> q,
                  DType out_dt = DType::kBFloat16, std::optional<Tensor> isf = std::nullopt,
                  std::optional<Tensor> b1 = std::nullopt) {
    (void)cutlass_fused_moe(in, ids, rw, a, b, out_dt, std::move(q), b1, std::nullopt, isf);
  };
  // quant_scales: count, dtype, shape.
  EXPECT_FI_ERROR(call(x, w1, w2, {qs[0], qs[1]}), op, "quant_scales");
  auto q = qs;
  q[1] = Tensor::zeros(qs[1].shape(), DType::kUInt8);
  EXPECT_FI_ERROR(call(x, w1, w2, q), op, "quant_scales");
  q = qs;
  q[4] = qs[4].slice(1, 0, 64);
  EXPECT_FI_ERROR(call(x, w1, w2, q), op, "quant_scales");
  q = qs;
  q[2] = Tensor::zeros({c.E + 1}, DType::kFloat32);
  EXPECT_FI_ERROR(call(x, w1, w2, q), op, "quant_scales");
  q = qs;
  q[0] = Tensor::zeros({2, 2}, DType::kFloat32);
  EXPECT_FI_ERROR(call(x, w1, w2, q), op, "quant_scales");
  // Weights and input.
  EXPECT_FI_ERROR(call(x, w1, w2.to(DType::kInt32), qs), op, "fc2_expert_weights");
  EXPECT_FI_ERROR(call(x, w1.slice(1, 0, 32), w2, qs), op, "fc1_expert_weights");
  EXPECT_FI_ERROR(call(x.to(DType::kFloat32), w1, w2, qs), op, "input");
  EXPECT_FI_ERROR(call(x.slice(1, 0, 32), w1, w2, qs), op, "input");
  EXPECT_FI_ERROR(call(x, w1, w2, qs, DType::kFloat32), op, "output_dtype");
  // Biases: both or neither, in the output dtype.
  EXPECT_FI_ERROR(call(x, w1, w2, qs, DType::kBFloat16, std::nullopt,
                       Tensor::zeros({c.E, c.N1()}, DType::kBFloat16)),
                  op, "fc2_expert_biases");
  // A packed input needs input_sf of the right size; its fc1 act global is not read (vLLM passes
  // a per-expert one, [num_experts]): any fp32 scalar or 1-D tensor, the same result; a 2-D one
  // is refused.
  Case p;
  p.path = Path::kNvfp4Packed;
  p.make(6);
  const Tensor px = p.input();
  EXPECT_FI_ERROR(call(px, w1, w2, qs), op, "input_sf");
  EXPECT_FI_ERROR(call(px, w1, w2, qs, DType::kBFloat16, p.input_sf()->slice(0, 0, 100)), op,
                  "input_sf");
  const Tensor pw1 = p.weights(p.w1, p.N1(), p.H), pw2 = p.weights(p.w2, p.H, p.I);
  auto run_packed = [&](std::vector<Tensor> pq) {
    return cutlass_fused_moe(px, p.ids, p.f32(p.rw, {p.T, 2}), pw1, pw2, DType::kBFloat16,
                             std::move(pq), std::nullopt, std::nullopt, p.input_sf())[0];
  };
  auto pq = p.quant_scales();
  const Tensor want = run_packed(pq);
  pq[0] = Tensor::full({p.E + 3}, 7.0, DType::kFloat32);
  EXPECT_TRUE(testing::all_close(run_packed(pq), want.to_double_vector(), {0.0, 0.0}));
  pq[0] = Tensor::full({2, 2}, 1.0, DType::kFloat32);
  EXPECT_FI_ERROR(run_packed(pq), op, "quant_scales");
  // MXFP8 x MXFP4 needs 128-aligned sizes; W4A16 writes the input dtype.
  Case m;
  m.path = Path::kMxfp8Mxfp4;
  m.make(7);  // H = 64: not 128-aligned
  EXPECT_FI_ERROR(m.run(), op, "fc2_expert_weights");
  // MXFP8 x MXFP8: the same alignment here, and the input's block scales are required.
  Case m8;
  m8.path = Path::kMxfp8Mxfp8;
  m8.make(17);
  EXPECT_FI_ERROR(m8.run(), op, "fc2_expert_weights");
  m8.H = m8.I = 128;
  m8.make(18);
  EXPECT_FI_ERROR(
      (void)cutlass_fused_moe(m8.input(), m8.ids, m8.f32(m8.rw, {m8.T, 2}),
                              m8.weights(m8.w1, m8.N1(), m8.H), m8.weights(m8.w2, m8.H, m8.I),
                              DType::kBFloat16, m8.quant_scales(), std::nullopt, std::nullopt,
                              std::nullopt, std::nullopt, std::nullopt, std::nullopt, 1, 0, 1, 0, 1,
                              0, std::nullopt, false, false, false, true),
      op, "input_sf");
  Case w;
  w.path = Path::kW4A16;
  w.H = w.I = 128;
  w.T = 2;
  w.make(8);
  w.out_dt = DType::kFloat16;
  EXPECT_FI_ERROR(w.run(), op, "output_dtype");
  // The quantized combinations this build does not take stay refused by name.
  EXPECT_FI_ERROR(
      (void)cutlass_fused_moe(x, ids, rw, w1, w2, DType::kBFloat16, qs, std::nullopt, std::nullopt,
                              std::nullopt, std::nullopt, std::nullopt, std::nullopt, 1, 0, 1, 0, 1,
                              0, std::nullopt, false, true),
      op, "use_deepseek_fp8_block_scale");
}

// ---- the bench case and the CUDA refusal ----------------------------------------------------

// `flashinfer bench --routine cutlass_fused_moe --input_dtype uint8`: the NVFP4 case builds and
// runs (packed input with 128x4 input_sf, 8 experts, top-2).
// The bench routine's NVFP4 case (--input_dtype uint8) and W4A16 case (--use_w4_group_scaling,
// fp16 input: the output is the input's dtype) build and run, with finite nonzero outputs.
TEST(CutlassFusedMoeFp4, BenchCase) {
  const BenchHook* hook = find_bench_hook("cutlass_fused_moe");
  ASSERT_NE(hook, nullptr);
  for (bool w4a16 : {false, true}) {
    BenchShape s;
    s.input_dtype = w4a16 ? DType::kFloat16 : DType::kUInt8;
    s.use_w4_group_scaling = w4a16;
    s.m = 6;
    s.n = w4a16 ? 128 : 32;
    s.hidden_size = w4a16 ? 256 : 64;
    BenchCase c = (*hook)(s, Device::cpu());
    c.run();
    const NamedTensors outs = c.outputs();
    ASSERT_FALSE(outs.empty());
    const Tensor& o = outs[0].second;
    EXPECT_EQ(o.shape(), Shape({6, s.hidden_size}));
    EXPECT_EQ(o.dtype(), w4a16 ? DType::kFloat16 : DType::kBFloat16);
    double sum = 0.0;
    for (double v : o.to_double_vector()) {
      EXPECT_TRUE(std::isfinite(v));
      sum += std::fabs(v);
    }
    EXPECT_GT(sum, 0.0) << w4a16;
  }
}

// NVFP4 has no CUDA kernel here (upstream runs it on Blackwell only): a call on the GPU is
// refused (kUnsupported naming input) before any data is read, which is what makes
// `flashinfer replay --device cuda` rerun it on the CPU.
TEST(CutlassFusedMoeFp4, CudaCallIsRefused) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  Case c;
  c.make(9);
  const Device d = Device::cuda(0);
  moe_fp4::expect_refused_on_cuda([&] {
    (void)cutlass_fused_moe(c.input().to(d), c.ids.to(d), c.f32(c.rw, {c.T, 2}).to(d),
                            c.weights(c.w1, c.N1(), c.H).to(d), c.weights(c.w2, c.H, c.I).to(d),
                            c.out_dt, c.quant_scales());
  });
}

#if FLASHINFER_TEST_HAVE_CUDART
// W4A16 MXFP4 on CUDA, the SM90 mixed-input path vLLM and SGLang run gpt-oss with on Hopper
// (use_w4_group_scaling, weights and scales from upstream's interleave functions; refused by
// name below sm90, as upstream): the exact cases bit for bit against the CPU reference, in bf16
// and fp16 on expert-parallel rank 1 of 2; SwigluBias with gpt-oss's parameters and a
// preallocated output within bf16's tolerance (expf on both sides); and the call captured into a
// CUDA graph replays to the same bytes.
TEST(CutlassFusedMoeFp4Cuda, W4A16MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  if (api::compute_capability(d) < 90) {
    const Case c = exact_w4a16_case(DType::kBFloat16, 5);
    const Case::Args a = c.args(d);
    moe_fp4::expect_refused_on_cuda([&] { (void)c.run(a); });
    return;
  }
  namespace moe_cuda = kernels::cuda;
  // Both routes (1: a block per pair; 2: tiles of up to 8 pairs of one expert; 0: the choice,
  // which takes tiles at 64 tokens), the route counters saying which ran.
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t T : {9, 64}) {
      const Case c = exact_w4a16_case(dt, dt == DType::kBFloat16 ? 61 : 62, T);
      const Tensor want = c.run()[0];
      const Case::Args a = c.args(d);
      for (int force : {1, 2, 0}) {
        moe_cuda::set_cutlass_moe_route(force);
        const moe_cuda::CutlassMoeCudaStats s0 = moe_cuda::cutlass_moe_cuda_stats();
        const Tensor got = c.run(a)[0].to(Device::cpu());
        const moe_cuda::CutlassMoeCudaStats s1 = moe_cuda::cutlass_moe_cuda_stats();
        moe_cuda::set_cutlass_moe_route(0);
        // (FLASHINFER_MOE_GROUPED=0 in the environment keeps the default on the per-pair route.)
        const char* env = std::getenv("FLASHINFER_MOE_GROUPED");
        const bool tiled =
            force == 2 || (force == 0 && T == 64 && !(env != nullptr && std::string(env) == "0"));
        EXPECT_EQ(s1.grouped_runs - s0.grouped_runs, tiled ? 1u : 0u) << force;
        EXPECT_EQ(s1.gemv_runs - s0.gemv_runs, tiled ? 0u : 1u) << force;
        EXPECT_EQ(got.to_double_vector(), want.to_double_vector())
            << dtype_label(dt) << " T " << T << " route " << force;
      }
    }
  }
  Case c;
  c.path = Path::kW4A16;
  c.H = 384;
  c.I = 256;
  c.T = 17;
  c.bias = c.swiglu_params = true;
  c.make(63);
  Tensor out = Tensor::zeros({c.T, c.H}, c.out_dt, d);
  (void)c.run(c.args(d), out);
  const auto want = c.run()[0].to_double_vector();
  moe_fp4::expect_close_to_formula(out.to(Device::cpu()).to_double_vector(), want);
  // Captured (the tiled route: its sort and tiles on the device too): the scratch is the
  // stream's, nothing read back.
  const Case e = exact_w4a16_case(DType::kBFloat16, 64, 64);
  const Tensor want_e = e.run()[0];
  const Case::Args a = e.args(d);
  Tensor out_e = Tensor::zeros({e.T, e.H}, e.out_dt, d);
  testing::ReplayableGraph graph;
  ASSERT_NO_FATAL_FAILURE(testing::warm_up_for_replay(graph, [&] { (void)e.run(a, out_e); }));
  ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, [&] { (void)e.run(a, out_e); }));
  out_e.copy_(Tensor::zeros({e.T, e.H}, e.out_dt));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
  EXPECT_EQ(out_e.to(Device::cpu()).to_double_vector(), want_e.to_double_vector());
  cudaGraphExecDestroy(graph.exec);
  cudaGraphDestroy(graph.graph);
  cudaStreamDestroy(graph.stream);
}
#endif  // FLASHINFER_TEST_HAVE_CUDART

// ---- record and replay ------------------------------------------------------------------------

TEST(CutlassFusedMoeFp4, RecordAndReplay) {
  std::vector<Case> cases(4);
  cases[0].make(51);
  cases[1].path = Path::kMxfp8Mxfp4;
  cases[1].H = cases[1].I = 128;
  cases[1].T = 2;
  cases[1].make(52);
  cases[2].path = Path::kW4A16;
  cases[2].H = cases[2].I = 128;
  cases[2].T = 2;
  cases[2].make(53);
  cases[3].path = Path::kMxfp8Mxfp8;
  cases[3].H = cases[3].I = 128;
  cases[3].T = 2;
  cases[3].make(54);
  moe_fp4::expect_cutlass_moe_calls_replay(cases);
}

TEST(CutlassFusedMoeFp4, DumpReplay) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_moe_fp4_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg);
  Case c;
  c.path = Path::kNvfp4Packed;
  c.make(61);
  (void)c.run();
  recorder::stop();
  std::vector<fs::path> dumps;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory()) dumps.push_back(e.path());
  }
  ASSERT_EQ(dumps.size(), 1u);
  const replay::Result r = replay::replay_from_dump(dumps[0].string());
  EXPECT_EQ(r.status, replay::Status::kPassed) << r.error;
  ASSERT_EQ(r.comparisons.size(), 1u);
  EXPECT_EQ(r.comparisons[0].key, "result__0");
  fs::remove_all(dir);
}

// ---- a dump in upstream's format ------------------------------------------------------------

// Written by Python (torch 1.13) as upstream's recorder writes them (tests/util/
// upstream_dump_py.h): every argument by keyword as vLLM / SGLang pass them, quant_scales as
// kwarg_quant_scales__<i>, the returned list as result__0..3 (the scratch three garbage, as
// upstream's torch.empty leaves them). Inputs prepared as upstream's test_moe_nvfp4 does (packed
// weights viewed as int64, 128x4 block scales viewed as int32); the expected output computed by
// torch with an independent NVFP4 quantizer. Calls: (1) ModelOpt NVFP4 as vLLM calls it, the
// input quantized before the call (packed uint8 + swizzled input_sf), Swiglu; (2) a bf16 input
// quantized in the op with per-expert fc1 input scales, Relu2; (3) MXFP8 x MXFP4 (below); (4)
// MXFP8 x MXFP8 as upstream's test_moe_mxfp8_mxfp8 prepares it. All replay and pass.
TEST(CutlassFusedMoeFp4, UpstreamDumpReplays) {
  const std::string body = R"PY(
def pack(c): return (c[..., 0::2] | (c[..., 1::2] << 4)).to(torch.uint8)
def swizzle(codes):  # [n, ksf] codes -> the flat 128x4 bytes of fp4_quantize
    n, ksf = codes.shape
    npad, kpad = (n + 127) // 128 * 128, (ksf + 3) // 4 * 4
    p = torch.zeros(npad, kpad, dtype=torch.uint8)
    p[:n, :ksf] = codes
    return p.view(npad // 128, 4, 32, kpad // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)
def bf(x): return x.bfloat16().float()
def weights(E, n, k):  # int64-packed e2m1, int32-viewed 128x4 e4m3 scales, and the values
    c = torch.randint(0, 16, (E, n, k))
    sc = torch.randint(0x20, 0x28, (E, n, k // 16))
    w = torch.stack([pack(c[e]) for e in range(E)]).view(torch.int64)
    s = torch.stack([swizzle(sc[e]) for e in range(E)])
    s = s.view(E, (n + 127) // 128 * 128, -1).view(torch.int32)
    return w, s, E2M1[c] * E4M3[sc].repeat_interleave(16, 2)
base_meta = {"kwarg_tp_size": 1, "kwarg_tp_rank": 0, "kwarg_ep_size": 1, "kwarg_ep_rank": 0,
             "kwarg_tune_max_num_tokens": 8192}

torch.manual_seed(1)
T, E, H, I, K = 4, 8, 128, 64, 2
ids = torch.stack([torch.randperm(E)[:K] for _ in range(T)]).to(torch.int32)
rw = torch.softmax(torch.randn(T, K), -1)
# 1. packed input + swizzled input_sf (quantized with fc1 input scale 1.5), Swiglu.
x = bf(torch.randn(T, H))
xq, xsf, xd = nvfp4(x, 1.5)
w1, s1, w1d = weights(E, 2 * I, H)
w2, s2, w2d = weights(E, H, I)
g1, g2, a2 = torch.rand(E) + 0.5, torch.rand(E) + 0.5, 0.8
out = torch.zeros(T, H)
for t in range(T):
    for k in range(K):
        e = int(ids[t, k])
        g = bf(g1[e] * (xd[t] @ w1d[e].T))
        h = bf(F.silu(g[I:]) * g[:I])  # up half first, gate second
        hq = nvfp4(h.view(1, -1), a2)[2].view(-1)
        out[t] += rw[t, k] * bf(g2[e] * (hq @ w2d[e].T))
rec_moe({"kwarg_input": xq, "kwarg_token_selected_experts": ids, "kwarg_token_final_scales": rw,
         "kwarg_fc1_expert_weights": w1, "kwarg_fc2_expert_weights": w2, "kwarg_input_sf": xsf},
        [torch.tensor(1.5), s1, g1, torch.tensor(a2), s2, g2],
        dict(base_meta, kwarg_output_dtype=dt("torch.bfloat16")), out.bfloat16(), E, T)
# 2. bf16 input quantized in the op with per-expert fc1 input scales, Relu2.
x = bf(torch.randn(T, H))
a1 = torch.rand(E) + 0.5
w1, s1, w1d = weights(E, I, H)
w2, s2, w2d = weights(E, H, I)
out = torch.zeros(T, H)
for t in range(T):
    for k in range(K):
        e = int(ids[t, k])
        xd = nvfp4(x[t].view(1, -1), float(a1[e]))[2].view(-1)
        g = bf(g1[e] * (xd @ w1d[e].T))
        h = bf(F.relu(g) ** 2)
        hq = nvfp4(h.view(1, -1), a2)[2].view(-1)
        out[t] += rw[t, k] * bf(g2[e] * (hq @ w2d[e].T))
rec_moe({"kwarg_input": x.bfloat16(), "kwarg_token_selected_experts": ids,
         "kwarg_token_final_scales": rw, "kwarg_fc1_expert_weights": w1,
         "kwarg_fc2_expert_weights": w2},
        [a1, s1, g1, torch.tensor(a2), s2, g2],
        dict(base_meta, kwarg_output_dtype=dt("torch.bfloat16"),
             kwarg_activation_type={"type": "enum", "name": "ActivationType.Relu2", "value": 6}),
        out.bfloat16(), E, T)
# 3. MXFP8 activations x MXFP4 weights (gpt-oss on Blackwell): fp8 input with 128x4 ue8m0
# input_sf, SwigluBias parameters and bf16 biases, quant_scales [w1 block, fc1 global, w2
# block, fc2 global]; the activation re-quantized to MXFP8.
T, E, H, I, K = 3, 8, 128, 128, 2
ids = torch.stack([torch.randperm(E)[:K] for _ in range(T)]).to(torch.int32)
rw = torch.softmax(torch.randn(T, K), -1)
xc = torch.tensor([c for c in range(256) if c & 0x7F not in (0x7F,)])[torch.randint(0, 254, (T, H))]
xc = torch.where((xc & 0x78) > 0x58, xc & 0x87, xc)  # keep |x| below 16
xs = torch.randint(125, 128, (T, H // 32))
xd = E4M3[xc] * torch.pow(2.0, (xs - 127).float()).repeat_interleave(32, 1)
def mx_weights(n, k):
    c = torch.randint(0, 16, (E, n, k))
    sc = torch.randint(119, 123, (E, n, k // 32))
    w = torch.stack([pack(c[e]) for e in range(E)]).view(torch.int64)
    s = torch.stack([swizzle(sc[e]) for e in range(E)]).view(E, n, k // 32).view(torch.int32)
    return w, s, E2M1[c] * torch.pow(2.0, (sc - 127).float()).repeat_interleave(32, 2)
def mxfp8(v):  # ue8m0 = ceil(log2(amax * fp32(1/448))), e4m3 of v / 2^(code - 127)
    blk = v.view(-1, 32)
    t = blk.abs().amax(1) * torch.tensor(1 / 448.0, dtype=torch.float32)
    m, e = torch.frexp(t)
    scale = torch.pow(2.0, (e - (m == 0.5).to(e.dtype)).float())
    y = blk / scale[:, None]
    q = POS8[rne(y.abs().clamp(max=448.0), POS8)] * torch.where(y < 0, -1.0, 1.0)
    return (q * scale[:, None]).view(-1)
w1, s1, w1d = mx_weights(2 * I, H)
w2, s2, w2d = mx_weights(H, I)
g1, g2 = torch.rand(E) + 0.5, torch.rand(E) + 0.5
b1, b2 = bf(torch.randn(E, 2 * I) * 0.2), bf(torch.randn(E, H) * 0.2)
al, be, li = torch.full((E,), 1.702), torch.full((E,), 1.0), torch.full((E,), 7.0)
out = torch.zeros(T, H)
for t in range(T):
    for k in range(K):
        e = int(ids[t, k])
        g = bf(g1[e] * (xd[t] @ w1d[e].T)) + b1[e]
        gate, up = g[I:].clamp(max=li[e]), g[:I].clamp(-li[e], li[e]) + be[e]
        h = bf(gate * torch.sigmoid(al[e] * gate) * up)
        y = bf(g2[e] * (mxfp8(h) @ w2d[e].T))
        out[t] += rw[t, k] * (y + b2[e])
rec_moe({"kwarg_input": ("fp8", xc.to(torch.uint8)), "kwarg_token_selected_experts": ids,
         "kwarg_token_final_scales": rw, "kwarg_fc1_expert_weights": w1,
         "kwarg_fc2_expert_weights": w2, "kwarg_input_sf": swizzle(xs),
         "kwarg_fc1_expert_biases": b1.bfloat16(), "kwarg_fc2_expert_biases": b2.bfloat16(),
         "kwarg_swiglu_alpha": al, "kwarg_swiglu_beta": be, "kwarg_swiglu_limit": li},
        [s1, g1, s2, g2],
        dict(base_meta, kwarg_output_dtype=dt("torch.bfloat16"), kwarg_use_mxfp8_act_scaling=True),
        out.bfloat16(), E, T)
# 4. MXFP8 activations x MXFP8 weights (upstream's test_moe_mxfp8_mxfp8): e4m3 weights with
# 128x4 ue8m0 scales viewed int32 [E, rows, cols / 128], the same input, Relu2, fp16 output.
def mx8_weights(n, k):
    c = torch.tensor([v for v in range(256) if v & 0x7F != 0x7F])[torch.randint(0, 254, (E, n, k))]
    c = torch.where((c & 0x78) > 0x48, c & 0x87, c)  # keep |w| below 8
    sc = torch.randint(119, 123, (E, n, k // 32))
    s = torch.stack([swizzle(sc[e]) for e in range(E)]).view(E, n, k // 32).view(torch.int32)
    return ("fp8", c.to(torch.uint8)), s, E4M3[c] * torch.pow(2.0, (sc - 127).float()).repeat_interleave(32, 2)
w1, s1, w1d = mx8_weights(I, H)
w2, s2, w2d = mx8_weights(H, I)
hf = lambda v: v.half().float()
out = torch.zeros(T, H)
for t in range(T):
    for k in range(K):
        e = int(ids[t, k])
        g = hf(g1[e] * (xd[t] @ w1d[e].T))
        h = hf(F.relu(g) ** 2)
        out[t] += rw[t, k] * hf(g2[e] * (mxfp8(h) @ w2d[e].T))
rec_moe({"kwarg_input": ("fp8", xc.to(torch.uint8)), "kwarg_token_selected_experts": ids,
         "kwarg_token_final_scales": rw, "kwarg_fc1_expert_weights": w1,
         "kwarg_fc2_expert_weights": w2, "kwarg_input_sf": swizzle(xs)},
        [s1, g1, s2, g2],
        dict(base_meta, kwarg_output_dtype=dt("torch.float16"), kwarg_use_mxfp8_act_scaling=True,
             kwarg_activation_type={"type": "enum", "name": "ActivationType.Relu2", "value": 6}),
        out.half(), E, T)
)PY";
  if (!moe_fp4::cutlass_moe_dumps_replay("fi_moe_cutlass_fp4_dump", body, 4u)) {
    GTEST_SKIP() << "python3-torch not installed";
  }
}

}  // namespace
}  // namespace flashinfer::testing
