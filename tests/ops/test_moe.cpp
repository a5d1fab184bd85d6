// MoE ops: cutlass_fused_moe, fused_topk_deepseek, is_gated_activation. Hand-checked golden
// values (the gate/up order of w1 among them), an fp64 formula over dtypes, activations and
// expert-parallel ranks, every bad input, record/replay (in memory and through a dump directory,
// where the scratch outputs are reported as skipped), and CUDA vs the CPU reference (skipped
// without a GPU).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <random>
#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "kernels/deepseek_routing_rules.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_writer.h"
#if FLASHINFER_TEST_HAVE_ORACLES
#include "oracle/moe_routing_oracle.h"
#endif

#if FLASHINFER_TEST_HAVE_CUDART
#include <random>

#include "kernels/cuda/moe_cuda.h"
#include "util/cuda_graph_util.h"
#endif

namespace flashinfer::testing {
namespace {

const std::vector<DType> kDTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

// The value a buffer of `dt` holds for v.
double round_as(DType dt, double v) {
  const float f = static_cast<float>(v);
  switch (dt) {
    case DType::kFloat16:
      return half_bits_to_float(float_to_half_bits(f));
    case DType::kBFloat16:
      return bfloat16_bits_to_float(float_to_bfloat16_bits(f));
    default:
      return f;
  }
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }
double gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

struct MoeCase {
  int64_t T = 5, H = 24, I = 8, E = 4, K = 2;
  DType dt = DType::kFloat32, out_dt = DType::kFloat32;
  ActivationType act = ActivationType::Swiglu;
  int64_t ep_size = 1, ep_rank = 0;
  int64_t tp_size = 1, tp_rank = 0;
  bool biases = false;
  bool swiglu_params = false;  // per-expert alpha / beta / limit
  uint64_t seed = 1;
};

struct MoeInputs {
  Tensor x, ids, scales, w1, w2;
  std::optional<Tensor> b1, b2, alpha, beta, limit;
};

bool gated(ActivationType a) {
  return a == ActivationType::Swiglu || a == ActivationType::Geglu ||
         a == ActivationType::SwigluBias || a == ActivationType::SwigluStep;
}

MoeInputs make_inputs(const MoeCase& c) {
  MoeInputs in;
  const int64_t N1 = gated(c.act) ? 2 * c.I : c.I;
  const int64_t global = c.E * c.ep_size;
  in.x = rand_tensor({c.T, c.H}, c.dt, c.seed, -1.0, 1.0);
  std::vector<double> ids;
  for (int64_t t = 0; t < c.T; ++t) {
    const int64_t e0 = (t * 3 + static_cast<int64_t>(c.seed)) % global;
    for (int64_t k = 0; k < c.K; ++k) ids.push_back(static_cast<double>((e0 + k * 5) % global));
  }
  in.ids = Tensor::from_vector(ids, {c.T, c.K}, DType::kInt32);
  in.scales = rand_tensor({c.T, c.K}, DType::kFloat32, c.seed + 1, 0.0, 1.0);
  in.w1 = rand_tensor({c.E, N1, c.H}, c.dt, c.seed + 2, -0.4, 0.4);
  in.w2 = rand_tensor({c.E, c.H, c.I}, c.dt, c.seed + 3, -0.4, 0.4);
  if (c.biases) {
    in.b1 = rand_tensor({c.E, N1}, c.dt, c.seed + 4, -0.5, 0.5);
    in.b2 = rand_tensor({c.E, c.H}, c.dt, c.seed + 5, -0.5, 0.5);
  }
  if (c.swiglu_params) {
    in.alpha = rand_tensor({c.E}, DType::kFloat32, c.seed + 6, 0.5, 2.0);
    in.beta = rand_tensor({c.E}, DType::kFloat32, c.seed + 7, 0.0, 1.0);
    in.limit = rand_tensor({c.E}, DType::kFloat32, c.seed + 8, 0.2, 0.6);
  }
  return in;
}

// The inputs as doubles, as the formula and the rounding interval read them: an absent optional
// is empty, and b2 joins on tensor-parallel rank 0 only.
struct MoeValues {
  std::vector<double> x, w1, w2, sc, ids, b1, b2, al, be, li;
};

MoeValues moe_values(const MoeCase& c, const MoeInputs& in) {
  auto opt = [](const std::optional<Tensor>& t) {
    return t ? t->to_double_vector() : std::vector<double>();
  };
  return {in.x.to_double_vector(),
          in.w1.to_double_vector(),
          in.w2.to_double_vector(),
          in.scales.to_double_vector(),
          in.ids.to_double_vector(),
          opt(in.b1),
          c.tp_rank == 0 ? opt(in.b2) : std::vector<double>(),
          opt(in.alpha),
          opt(in.beta),
          opt(in.limit)};
}

// fp64 formula with the documented rounding points (docs/MOE.md): GEMM1 output and activation
// stored in the input dtype, GEMM2 output in the output dtype, weighted fp64 sum over k. The
// biases join the rounded GEMM outputs, b2 on tensor-parallel rank 0 only (upstream's
// doActivationKernel / finalizeMoeRoutingKernel; before session 12 this formula added both
// before the rounding and b2 on every rank, as the kernel then did).
// round_activation = false keeps the activation unrounded: a kernel that skipped that rounding
// point, which MoeRoundingInterval must tell apart.
std::vector<double> moe_formula(const MoeCase& c, const MoeInputs& in,
                                bool round_activation = true) {
  const auto [x, w1, w2, sc, ids, b1, b2, al, be, li] = moe_values(c, in);
  const int64_t I = c.I, H = c.H, N1 = gated(c.act) ? 2 * I : I;
  std::vector<double> out(static_cast<size_t>(c.T * H), 0.0);
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t k = 0; k < c.K; ++k) {
      const int64_t e =
          static_cast<int64_t>(ids[static_cast<size_t>(t * c.K + k)]) - c.ep_rank * c.E;
      if (e < 0 || e >= c.E) continue;
      std::vector<double> g(static_cast<size_t>(N1)), h(static_cast<size_t>(I));
      for (int64_t n = 0; n < N1; ++n) {
        double s = 0.0;
        for (int64_t j = 0; j < H; ++j) {
          s += x[static_cast<size_t>(t * H + j)] * w1[static_cast<size_t>((e * N1 + n) * H + j)];
        }
        g[static_cast<size_t>(n)] =
            round_as(c.dt, s) + (b1.empty() ? 0.0 : b1[static_cast<size_t>(e * N1 + n)]);
      }
      for (int64_t j = 0; j < I; ++j) {
        const double u = g[static_cast<size_t>(j)];                          // up: first half
        const double gt = gated(c.act) ? g[static_cast<size_t>(I + j)] : u;  // gate: second
        double v = 0.0;
        switch (c.act) {
          case ActivationType::Swiglu:
          case ActivationType::SwigluBias:
            if (al.empty()) {
              v = silu(gt) * u;
            } else {
              const double a = al[static_cast<size_t>(e)], b = be[static_cast<size_t>(e)],
                           l = li[static_cast<size_t>(e)];
              const double gc = std::min(gt, l);
              v = gc / (1.0 + std::exp(-a * gc)) * (std::clamp(u, -l, l) + b);
            }
            break;
          case ActivationType::SwigluStep:
            v = std::min(silu(gt), 7.0) * std::clamp(u, -7.0, 7.0);
            break;
          case ActivationType::Geglu:
            v = gelu(gt) * u;
            break;
          case ActivationType::Gelu:
            v = gelu(u);
            break;
          case ActivationType::Relu:
            v = std::max(u, 0.0);
            break;
          case ActivationType::Relu2:
            v = std::max(u, 0.0) * std::max(u, 0.0);
            break;
          case ActivationType::Silu:
            v = silu(u);
            break;
          default:
            v = u;
        }
        h[static_cast<size_t>(j)] = round_activation ? round_as(c.dt, v) : v;
      }
      for (int64_t j = 0; j < H; ++j) {
        double s = 0.0;
        for (int64_t i = 0; i < I; ++i) {
          s += h[static_cast<size_t>(i)] * w2[static_cast<size_t>((e * H + j) * I + i)];
        }
        out[static_cast<size_t>(t * H + j)] +=
            sc[static_cast<size_t>(t * c.K + k)] *
            (round_as(c.out_dt, s) + (b2.empty() ? 0.0 : b2[static_cast<size_t>(e * H + j)]));
      }
    }
  }
  return out;
}

// The values every evaluation with moe_formula's rounding points can store, per output element:
// GEMM sums in fp32 in any order (with or without FMA, round-to-nearest or truncating tensor-core
// adds), the bias, activation and finalize in fp32, each GEMM output and the activation rounded
// as moe_formula rounds them. Each point carries an fp64 value V and a radius r bounding how far
// an evaluation's value can be from V; rounding V +- r to the stored dtype gives the values an
// evaluation can store: V's own when no rounding boundary lies within V +- r (then r = 0), else
// a span of ulps, which the later points carry on. Gated SwiGLU (with or without per-expert
// parameters) and GeGLU only.
struct RoundingInterval {
  std::vector<double> lo, hi;
};

// rd(v) and the radius around it that rd(v - r) .. rd(v + r) span (rd is monotone).
std::pair<double, double> round_interval(DType dt, double v, double r) {
  const double m = round_as(dt, v);
  return {m, std::max(round_as(dt, v + r) - m, m - round_as(dt, v - r))};
}

// How far an fp32 sum of `products` (each exact in fp64), in any order, can be from the exact
// sum: 0 when every product is a multiple of some 2^q and the magnitudes add up to under 2^(q+24)
// (then every partial sum is exact in fp32), else gamma(n) * sum |p| with the unit 2^-23, which
// covers truncating adds too.
double fp32_sum_radius(const std::vector<double>& products) {
  int q = std::numeric_limits<int>::max();
  double abs_sum = 0.0;
  for (double p : products) {
    abs_sum += std::abs(p);
    if (p == 0.0) continue;
    int e = 0;
    const auto m = static_cast<uint64_t>(std::ldexp(std::frexp(std::abs(p), &e), 53));
    q = std::min(q, e - 53 + std::countr_zero(m));  // the product's lowest set bit
  }
  if (abs_sum == 0.0 || abs_sum < std::ldexp(1.0, q + 24)) return 0.0;
  const double nu = std::ldexp(1.0, -23) * static_cast<double>(products.size());
  return nu / (1.0 - nu) * abs_sum;
}

RoundingInterval moe_rounding_interval(const MoeCase& c, const MoeInputs& in) {
  EXPECT_TRUE(c.act == ActivationType::Swiglu || c.act == ActivationType::Geglu);
  const auto [x, w1, w2, sc, ids, b1, b2, al, be, li] = moe_values(c, in);
  const int64_t I = c.I, H = c.H, N1 = 2 * I;
  const double u32 = std::ldexp(1.0, -24);  // an fp32 operation rounded to nearest
  std::vector<double> pre(static_cast<size_t>(c.T * H), 0.0), rad(pre.size(), 0.0),
      mag(pre.size(), 0.0);
  std::vector<double> g(static_cast<size_t>(N1)), rg(g.size()), h(static_cast<size_t>(I)),
      rh(h.size()), prod;
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t k = 0; k < c.K; ++k) {
      const int64_t e =
          static_cast<int64_t>(ids[static_cast<size_t>(t * c.K + k)]) - c.ep_rank * c.E;
      if (e < 0 || e >= c.E) continue;
      for (int64_t n = 0; n < N1; ++n) {  // GEMM1, rounded to dt; the bias added in fp32
        prod.clear();
        double sum = 0.0;
        for (int64_t j = 0; j < H; ++j) {
          prod.push_back(x[static_cast<size_t>(t * H + j)] *
                         w1[static_cast<size_t>((e * N1 + n) * H + j)]);
          sum += prod.back();
        }
        const auto [v, r] = round_interval(c.dt, sum, fp32_sum_radius(prod));
        // fp32's sum of the stored value and the bias; the same in every evaluation when r = 0.
        const double b = b1.empty() ? 0.0 : b1[static_cast<size_t>(e * N1 + n)];
        g[static_cast<size_t>(n)] = static_cast<float>(v + b);
        rg[static_cast<size_t>(n)] = r == 0.0 ? 0.0 : r + u32 * (std::abs(v + b) + r);
      }
      for (int64_t j = 0; j < I; ++j) {  // the activation, rounded to dt
        const double up = g[static_cast<size_t>(j)], gt = g[static_cast<size_t>(I + j)];
        const double ru = rg[static_cast<size_t>(j)], rgt = rg[static_cast<size_t>(I + j)];
        // v, and the magnitudes of the gate and up factors around it (after the clamps).
        double v = 0.0, slope_gate = 0.0, up_mag = std::abs(up) + ru, gate_mag = std::abs(gt) + rgt;
        if (c.act == ActivationType::Geglu) {
          v = gelu(gt) * up;
          slope_gate = 1.13;  // max |gelu'|
        } else if (al.empty()) {
          v = silu(gt) * up;
          slope_gate = 1.1;  // max |d/dz z sigmoid(a z)| = 1.0998.. for any a > 0
        } else {
          const double a = al[static_cast<size_t>(e)], l = li[static_cast<size_t>(e)],
                       beta = be[static_cast<size_t>(e)];
          const double gc = std::min(gt, l);
          v = gc / (1.0 + std::exp(-a * gc)) * (std::clamp(up, -l, l) + beta);
          slope_gate = 1.1;
          up_mag = std::min(std::abs(up), l) + ru + std::abs(beta);
          gate_mag = std::abs(gc) + rgt;
        }
        // |silu|, |gelu| <= |gate| bounds the slope in up; the clamps are 1-Lipschitz. One fp32
        // evaluation (exp or erf within 2 units, the argument's product, a sum of positives, a
        // division, the products: about 4 units of v; the cancellations in up + beta and in
        // GeGLU's 1 + erf: under 2 units of |up * gate|) is taken to err by under 8 units of |v|
        // plus 4 units of |up * gate|.
        const double r = gate_mag * ru + slope_gate * up_mag * rgt + 8.0 * u32 * std::abs(v) +
                         4.0 * u32 * up_mag * gate_mag;
        const auto [hv, hr] = round_interval(c.dt, v, r);
        h[static_cast<size_t>(j)] = hv;
        rh[static_cast<size_t>(j)] = hr;
      }
      const double s = sc[static_cast<size_t>(t * c.K + k)];
      for (int64_t j = 0; j < H; ++j) {  // GEMM2, rounded to out_dt; the weighted sum in fp32
        prod.clear();
        double sum = 0.0, carried = 0.0;
        for (int64_t i = 0; i < I; ++i) {
          const double w = w2[static_cast<size_t>((e * H + j) * I + i)];
          prod.push_back(h[static_cast<size_t>(i)] * w);
          sum += prod.back();
          carried += rh[static_cast<size_t>(i)] * std::abs(w);
        }
        // With every h pinned the evaluations sum these products; else other ones, within
        // `carried` of them, whose fp32 sum errs by at most gamma(I) * their magnitudes.
        double r = fp32_sum_radius(prod);
        if (carried > 0.0) {
          const double nu = std::ldexp(1.0, -23) * static_cast<double>(I);
          double abs_sum = carried;
          for (double p : prod) abs_sum += std::abs(p);
          r = carried + nu / (1.0 - nu) * abs_sum;
        }
        const auto [y, ry] = round_interval(c.out_dt, sum, r);
        const double b = b2.empty() ? 0.0 : b2[static_cast<size_t>(e * H + j)];
        const auto o = static_cast<size_t>(t * H + j);
        pre[o] += s * (y + b);
        rad[o] += s * ry;
        mag[o] += s * (std::abs(y) + ry + std::abs(b));
      }
    }
  }
  RoundingInterval iv;
  const double nu = u32 * static_cast<double>(3 * c.K);  // per k: +, *, + (rounded to nearest)
  for (size_t o = 0; o < pre.size(); ++o) {
    const double r = rad[o] + nu / (1.0 - nu) * mag[o];
    iv.lo.push_back(round_as(c.out_dt, pre[o] - r));
    iv.hi.push_back(round_as(c.out_dt, pre[o] + r));
  }
  return iv;
}

::testing::AssertionResult within(const Tensor& t, const RoundingInterval& iv) {
  const std::vector<double> v = t.to_double_vector();
  if (v.size() != iv.lo.size()) return ::testing::AssertionFailure() << "size " << v.size();
  size_t bad = 0;
  std::ostringstream first;
  first.precision(9);
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] >= iv.lo[i] && v[i] <= iv.hi[i]) continue;
    if (bad++ == 0) {
      first << "[" << i << "] " << v[i] << " outside [" << iv.lo[i] << ", " << iv.hi[i] << "]";
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << v.size() << " elements outside the rounding interval, first "
         << first.str();
}

// `t` with each value moved to the nearest multiple of `step` (a grid the dtype holds exactly).
Tensor on_grid(const Tensor& t, double step) {
  std::vector<double> v = t.to_double_vector();
  for (double& a : v) a = std::nearbyint(a / step) * step;
  return Tensor::from_vector(v, t.shape(), t.dtype());
}

// The grouped route's random case (MoeCudaGrouped.RandomOperandsWithinAccumulationBound).
MoeCase grouped_random_case(DType dt, ActivationType act) {
  MoeCase c;
  c.T = 200;
  c.H = 136;  // two n tiles of GEMM2, the second partial
  c.I = 72;
  c.E = 6;
  c.K = 3;
  c.dt = c.out_dt = dt;
  c.act = act;
  c.biases = true;
  c.swiglu_params = act == ActivationType::Swiglu;
  return c;
}

// Its inputs: x and w1 random on grids of 2^-6 and 2^-7 (7 and 6 significant bits, exact in
// bf16), so that every GEMM1 partial sum is a multiple of 2^-13 under 2^6 and exact in fp32: the
// routes store the same GEMM1 outputs, and only the activation's fp32 evaluation and GEMM2's
// summation order (random w2) can move a stored value. With continuous x and w1 the worst-case
// fp32 error of the GEMM1 sums (gamma(136) * sum |x w1|, about a tenth of an fp16 ulp) reaches a
// rounding boundary for most elements, and the interval grows to most of the output's size.
MoeInputs grouped_random_inputs(const MoeCase& c) {
  MoeInputs in = make_inputs(c);
  in.x = on_grid(in.x, std::ldexp(1.0, -6));
  in.w1 = on_grid(in.w1, std::ldexp(1.0, -7));
  return in;
}

std::vector<Tensor> run_moe(const MoeCase& c, const MoeInputs& in,
                            std::optional<Tensor> output = std::nullopt) {
  return cutlass_fused_moe(in.x, in.ids, in.scales, in.w1, in.w2, c.out_dt, {}, in.b1, in.b2,
                           std::nullopt, in.alpha, in.beta, in.limit, c.tp_size, c.tp_rank,
                           c.ep_size, c.ep_rank, 1, 0, output, false, false, false, false, false,
                           false, false, 8192, std::nullopt, c.act);
}

// ---- golden values --------------------------------------------------------------------------

// One token, two experts. w1[e] rows: [up; gate]. Expert 0: up = x0 = 1, gate = x1 = 2,
// h = silu(2) * 1; expert 1: up = x1 = 2, gate = x0 = 1, h = silu(1) * 2. A kernel that swapped
// gate and up would give silu(1) * 2 for expert 0 and silu(2) * 1 for expert 1.
TEST(CutlassFusedMoe, GoldenGateUpOrder) {
  Tensor x = Tensor::from_vector({1, 2}, {1, 2}, DType::kFloat32);
  Tensor ids = Tensor::from_vector({0, 1}, {1, 2}, DType::kInt32);
  Tensor sc = Tensor::from_vector({0.25, 0.75}, {1, 2}, DType::kFloat32);
  Tensor w1 = Tensor::from_vector({1, 0, 0, 1, /*e1*/ 0, 1, 1, 0}, {2, 2, 2}, DType::kFloat32);
  Tensor w2 = Tensor::from_vector({1, 2, /*e1*/ -1, 1}, {2, 2, 1}, DType::kFloat32);
  const auto r = cutlass_fused_moe(x, ids, sc, w1, w2, DType::kFloat32, {});
  ASSERT_EQ(r.size(), 4u);
  const double h0 = 2.0 / (1.0 + std::exp(-2.0));          // silu(2) * 1 = 1.7615941559557649
  const double h1 = 2.0 * (1.0 / (1.0 + std::exp(-1.0)));  // silu(1) * 2 = 1.4621171572600098
  EXPECT_TRUE(all_close(r[0], {0.25 * h0 - 0.75 * h1, 0.25 * 2 * h0 + 0.75 * h1}, {1e-6, 1e-6}));
  EXPECT_NEAR(r[0].to_double_vector()[0], -0.6561893287, 1e-6);
  EXPECT_NEAR(r[0].to_double_vector()[1], 1.9773849464, 1e-6);
}

// Where the biases join (upstream's TMA warp-specialized path, the default tactic on sm90+:
// doActivationKernel adds b1 in fp32 to the GEMM1 output already stored in the input dtype, and
// finalizeMoeRoutingKernel adds b2 in fp32 to the stored GEMM2 output, on tp rank 0 only).
// fp16, one token, one expert, Identity (not gated), H = I = 2, x = [1024, 0.5]:
//   w1 = [[1, 1], [0, 1]]: GEMM1 = [1024.5, 0.5]; stored fp16 (spacing 1 above 1024, ties to
//     even): g1 = [1024, 0.5].
//   w2 = [[1, 1], [0, 2]].
// (a) b1 = [0.5, 0], b2 = 0: h = fp16(g1 + b1) = [fp16(1024.5) = 1024, 0.5]; GEMM2 = [1024.5, 1]
//     -> y = [1024, 1]; out = [1024, 1]. Adding b1 before the rounding (the pre-session-12
//     kernel) gives g1 = fp16(1025) = 1025, GEMM2 1025.5 -> 1026.
// (b) b1 = 0, b2 = [0.5, 0.25]: h = [1024, 0.5]; y = [1024, 1]; out = fp16(y + b2) =
//     [fp16(1024.5) = 1024, 1.25]. Adding b2 before storing y gives fp16(1025) = 1025.
// (c) (b) on tp rank 1 of 2: no b2 at all: out = [1024, 1]; on rank 0 as (b).
TEST(CutlassFusedMoe, GoldenBiasPoints) {
  const DType f16 = DType::kFloat16;
  Tensor x = Tensor::from_vector({1024, 0.5}, {1, 2}, f16);
  Tensor ids = Tensor::from_vector({0}, {1, 1}, DType::kInt32);
  Tensor sc = Tensor::from_vector({1}, {1, 1}, DType::kFloat32);
  Tensor w1 = Tensor::from_vector({1, 1, 0, 1}, {1, 2, 2}, f16);
  Tensor w2 = Tensor::from_vector({1, 1, 0, 2}, {1, 2, 2}, f16);
  auto call = [&](const std::vector<double>& b1, const std::vector<double>& b2, int64_t tp_size,
                  int64_t tp_rank) {
    return cutlass_fused_moe(x, ids, sc, w1, w2, f16, {}, Tensor::from_vector(b1, {1, 2}, f16),
                             Tensor::from_vector(b2, {1, 2}, f16), std::nullopt, std::nullopt,
                             std::nullopt, std::nullopt, tp_size, tp_rank, 1, 0, 1, 0, std::nullopt,
                             false, false, false, false, false, false, false, 8192, std::nullopt,
                             ActivationType::Identity)[0]
        .to_double_vector();
  };
  EXPECT_EQ(call({0.5, 0}, {0, 0}, 1, 0), (std::vector<double>{1024, 1}));
  EXPECT_EQ(call({0, 0}, {0.5, 0.25}, 1, 0), (std::vector<double>{1024, 1.25}));
  EXPECT_EQ(call({0, 0}, {0.5, 0.25}, 2, 0), (std::vector<double>{1024, 1.25}));
  EXPECT_EQ(call({0, 0}, {0.5, 0.25}, 2, 1), (std::vector<double>{1024, 1}));
  // b1 is added on every rank (each rank holds its own slice of it).
  EXPECT_EQ(call({0.5, 0}, {0, 0}, 2, 1), (std::vector<double>{1024, 1}));
}

// bf16, Swiglu, b2 scaled by the routing weight: out = bf16(s * (y + b2)). One token, one
// expert, H = 1, I = 1, x = [1]: w1 = [up 3, gate 0] -> g1 = [3, 0], b1 = [0, 0] -> h =
// silu(0) * 3 = 0; y = 0; b2 = 4, s = 0.25: out = 0.25 * (0 + 4) = 1 (a b2 outside the
// weighted sum would give 4).
TEST(CutlassFusedMoe, GoldenBiasScaledByRoutingWeight) {
  const DType bf = DType::kBFloat16;
  const auto r = cutlass_fused_moe(
      Tensor::from_vector({1}, {1, 1}, bf), Tensor::from_vector({0}, {1, 1}, DType::kInt32),
      Tensor::from_vector({0.25}, {1, 1}, DType::kFloat32),
      Tensor::from_vector({3, 0}, {1, 2, 1}, bf), Tensor::from_vector({1}, {1, 1, 1}, bf), bf, {},
      Tensor::from_vector({0, 0}, {1, 2}, bf), Tensor::from_vector({4}, {1, 1}, bf));
  EXPECT_EQ(r[0].to_double_vector(), (std::vector<double>{1}));
}

// Tensor parallelism: each rank holds a slice of the intermediate dimension (w1's up and gate
// rows, b1, w2's columns) and the whole b2, which only rank 0 adds; the ranks' outputs sum to
// the single-rank layer (fp32, up to the rounding of the split sums), and rank 1's output does
// not depend on b2.
TEST(CutlassFusedMoe, TensorParallelRanksSumToTheLayer) {
  MoeCase full;
  full.T = 6;
  full.I = 16;
  full.biases = true;
  full.seed = 77;
  const MoeInputs in = make_inputs(full);
  const Tensor whole = run_moe(full, in)[0];
  const int64_t E = full.E, H = full.H, I = full.I, half = I / 2;
  const auto w1 = in.w1.to_double_vector(), w2 = in.w2.to_double_vector(),
             b1 = in.b1->to_double_vector();
  std::vector<double> sum(static_cast<size_t>(full.T * H), 0.0);
  for (int64_t rank = 0; rank < 2; ++rank) {
    std::vector<double> w1r, w2r, b1r;
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t part = 0; part < 2; ++part) {  // up rows, then gate rows
        for (int64_t i = rank * half; i < (rank + 1) * half; ++i) {
          const int64_t row = e * 2 * I + part * I + i;
          b1r.push_back(b1[static_cast<size_t>(row)]);
          for (int64_t j = 0; j < H; ++j) w1r.push_back(w1[static_cast<size_t>(row * H + j)]);
        }
      }
      for (int64_t j = 0; j < H; ++j) {
        for (int64_t i = rank * half; i < (rank + 1) * half; ++i) {
          w2r.push_back(w2[static_cast<size_t>((e * H + j) * I + i)]);
        }
      }
    }
    MoeCase c = full;
    c.I = half;
    c.tp_size = 2;
    c.tp_rank = rank;
    MoeInputs r = in;
    r.w1 = Tensor::from_vector(w1r, {E, 2 * half, H}, full.dt);
    r.w2 = Tensor::from_vector(w2r, {E, H, half}, full.dt);
    r.b1 = Tensor::from_vector(b1r, {E, 2 * half}, full.dt);
    const Tensor out = run_moe(c, r)[0];
    EXPECT_TRUE(all_close(out, moe_formula(c, r), default_tolerance(full.dt))) << rank;
    const auto ov = out.to_double_vector();
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += ov[i];
    if (rank == 1) {
      MoeInputs nob2 = r;
      nob2.b2 = Tensor::zeros({E, H}, full.dt);
      EXPECT_EQ(run_moe(c, nob2)[0].to_double_vector(), ov);  // b2 ignored on rank 1
    }
  }
  EXPECT_TRUE(all_close(whole, sum, {1e-5, 1e-5}));
}

// Relu2 is not gated: w1 is [E, I, H] and h = relu(x @ w1.T)^2.
TEST(CutlassFusedMoe, GoldenRelu2NotGated) {
  Tensor x = Tensor::from_vector({1, -3}, {1, 2}, DType::kFloat32);
  Tensor ids = Tensor::from_vector({0}, {1, 1}, DType::kInt32);
  Tensor sc = Tensor::from_vector({2}, {1, 1}, DType::kFloat32);
  Tensor w1 = Tensor::from_vector({1, 0, 0, 1}, {1, 2, 2}, DType::kFloat32);  // h = [1, 0]
  Tensor w2 = Tensor::from_vector({3, 5, 7, 11}, {1, 2, 2}, DType::kFloat32);
  const auto r = cutlass_fused_moe(
      x, ids, sc, w1, w2, DType::kFloat32, {}, std::nullopt, std::nullopt, std::nullopt,
      std::nullopt, std::nullopt, std::nullopt, 1, 0, 1, 0, 1, 0, std::nullopt, false, false, false,
      false, false, false, false, 8192, std::nullopt, ActivationType::Relu2);
  EXPECT_TRUE(all_close(r[0], {2 * 3, 2 * 7}, {0, 0}));
}

// Expert parallelism: rank 1 of 2 owns global experts [2, 4); a token routed only to rank 0's
// experts gets an exact zero row, a (token, k) on another rank contributes nothing.
TEST(CutlassFusedMoe, TokensWithNoLocalExpertGetZeros) {
  MoeCase c;
  c.T = 3;
  c.E = 2;
  c.ep_size = 2;
  c.ep_rank = 1;
  MoeInputs in = make_inputs(c);
  in.ids = Tensor::from_vector({0, 1, /*t1*/ 2, 0, /*t2*/ 3, 2}, {3, 2}, DType::kInt32);
  const auto r = run_moe(c, in);
  const auto out = r[0].to_double_vector();
  for (int64_t j = 0; j < c.H; ++j) EXPECT_EQ(out[static_cast<size_t>(j)], 0.0) << j;
  EXPECT_TRUE(all_close(r[0], moe_formula(c, in), default_tolerance(DType::kFloat32)));
  // The same call on rank 0 (experts 0, 1) plus rank 1 is the whole layer.
  MoeCase c0 = c;
  c0.ep_rank = 0;
  MoeInputs in0 = in;
  const auto r0 = run_moe(c0, in0);
  EXPECT_TRUE(all_close(r0[0], moe_formula(c0, in0), default_tolerance(DType::kFloat32)));
  // enable_alltoall (SGLang's all-to-all path): upstream's finalize leaves the row of a token with
  // no local expert as the output held it; the others as before.
  Tensor held = Tensor::full(r[0].shape(), 7.0, r[0].dtype());
  const auto ra = cutlass_fused_moe(in.x, in.ids, in.scales, in.w1, in.w2, c.out_dt, {}, in.b1,
                                    in.b2, std::nullopt, in.alpha, in.beta, in.limit, c.tp_size,
                                    c.tp_rank, c.ep_size, c.ep_rank, 1, 0, held, true);
  EXPECT_EQ(ra[0].data_ptr(), held.data_ptr());
  const auto got = held.to_double_vector();
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t j = 0; j < c.H; ++j) {
      const auto i = static_cast<size_t>(t * c.H + j);
      EXPECT_EQ(got[i], t == 0 ? 7.0 : out[i]) << t << " " << j;
    }
  }
}

// enable_alltoall with int64 ids and an output whose rows are apart (a view of a wider buffer):
// the rows of tokens with no local expert keep what they held, and nothing between the rows is
// touched.
TEST(CutlassFusedMoe, AlltoallKeepsRowsOfAStridedOutputWithInt64Ids) {
  MoeCase c;
  c.T = 4;
  c.E = 2;
  c.ep_size = 2;
  c.ep_rank = 1;
  MoeInputs in = make_inputs(c);
  // Rank 1 owns experts 2 and 3: tokens 0 and 3 have none of them.
  in.ids = Tensor::from_vector({0, 1, 2, 0, 3, 2, 1, 1}, {4, 2}, DType::kInt64);
  const std::vector<double> w = moe_formula(c, in);
  Tensor wide = Tensor::full({c.T, c.H + 5}, -3.0, c.out_dt);
  Tensor held = wide.slice(1, 0, c.H);
  held.copy_(Tensor::full({c.T, c.H}, 7.0, c.out_dt));
  const auto r = cutlass_fused_moe(in.x, in.ids, in.scales, in.w1, in.w2, c.out_dt, {}, in.b1,
                                   in.b2, std::nullopt, in.alpha, in.beta, in.limit, c.tp_size,
                                   c.tp_rank, c.ep_size, c.ep_rank, 1, 0, held, true);
  EXPECT_EQ(r[0].data_ptr(), held.data_ptr());
  const auto got = wide.to_double_vector();
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t j = 0; j < c.H + 5; ++j) {
      const double v = got[static_cast<size_t>(t * (c.H + 5) + j)];
      if (j >= c.H) {
        EXPECT_EQ(v, -3.0) << t << " " << j;
      } else if (t == 0 || t == 3) {
        EXPECT_EQ(v, 7.0) << t << " " << j;
      } else {
        EXPECT_NEAR(v, w[static_cast<size_t>(t * c.H + j)], 1e-5) << t << " " << j;
      }
    }
  }
}

TEST(CutlassFusedMoe, ScratchOutputsAndOutputArgument) {
  MoeCase c;
  const MoeInputs in = make_inputs(c);
  Tensor out = Tensor::full({c.T, c.H}, 7.0, c.out_dt);
  const auto r = run_moe(c, in, out);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].data_ptr(), out.data_ptr());  // written in place and returned
  EXPECT_TRUE(all_close(out, moe_formula(c, in), default_tolerance(DType::kFloat32)));
  EXPECT_EQ(r[1].shape(), Shape({1}));
  EXPECT_EQ(r[1].dtype(), DType::kInt32);
  EXPECT_EQ(r[2].shape(), Shape({c.E, c.T}));
  EXPECT_EQ(r[2].dtype(), DType::kFloat32);
  EXPECT_EQ(r[3].shape(), Shape({c.E}));
  EXPECT_EQ(r[3].dtype(), DType::kInt32);
}

TEST(IsGatedActivation, Members) {
  EXPECT_TRUE(is_gated_activation(ActivationType::Swiglu));
  EXPECT_TRUE(is_gated_activation(ActivationType::Geglu));
  EXPECT_TRUE(is_gated_activation(ActivationType::SwigluBias));
  EXPECT_TRUE(is_gated_activation(ActivationType::SwigluStep));
  // Upstream's _GATED_ACTIVATION_TYPES at the pinned era also lists GegluTanh and Situ.
  EXPECT_TRUE(is_gated_activation(ActivationType::GegluTanh));
  EXPECT_TRUE(is_gated_activation(ActivationType::Situ));
  for (ActivationType a : {ActivationType::Gelu, ActivationType::Relu, ActivationType::Silu,
                           ActivationType::Relu2, ActivationType::Identity}) {
    EXPECT_FALSE(is_gated_activation(a)) << activation_type_name(a);
  }
  // Rebuilt from upstream's record forms: the enum dict's "ActivationType.Swiglu", or an int.
  EXPECT_EQ(activation_type_from_value(Value(EnumValue{"enum", "ActivationType.Relu2", "6"})),
            ActivationType::Relu2);
  EXPECT_EQ(activation_type_from_value(Value(int64_t{4})), ActivationType::Geglu);
  EXPECT_FI_ERROR(activation_type_from_value(Value(int64_t{42}), "op", "a"), "op", "a");
  EXPECT_EQ(activation_type_from_value(Value(EnumValue{"enum", "ActivationType.Situ", "10"})),
            ActivationType::Situ);
  EXPECT_FI_ERROR(activation_type_from_value(
                      Value(EnumValue{"enum", "ActivationType.InvalidType", "11"}), "op", "a"),
                  "op", "a");
}

// ---- fp64 formula -----------------------------------------------------------------------------

TEST(CutlassFusedMoe, MatchesFormula) {
  const ActivationType acts[] = {ActivationType::Swiglu,     ActivationType::Geglu,
                                 ActivationType::SwigluStep, ActivationType::Relu2,
                                 ActivationType::Gelu,       ActivationType::Relu,
                                 ActivationType::Silu,       ActivationType::Identity};
  uint64_t seed = 10;
  for (DType dt : kDTypes) {
    for (ActivationType act : acts) {
      MoeCase c;
      c.dt = c.out_dt = dt;
      c.act = act;
      c.seed = ++seed;
      c.biases = seed % 2 == 0;
      SCOPED_TRACE(std::string(dtype_label(dt)) + " " + std::string(activation_type_name(act)));
      const MoeInputs in = make_inputs(c);
      EXPECT_TRUE(all_close(run_moe(c, in)[0], moe_formula(c, in), default_tolerance(dt)));
    }
  }
  // SwigluBias with per-expert alpha / beta / limit (clamps engaged), output dtypes that differ
  // from the input's, 8 experts top-2 over two EP ranks, more tokens than one GEMM tile.
  for (DType dt : kDTypes) {
    for (DType out_dt : kDTypes) {
      MoeCase c;
      c.T = 150;
      c.E = 4;
      c.ep_size = 2;
      c.ep_rank = 1;
      c.dt = dt;
      c.out_dt = out_dt;
      c.act = ActivationType::SwigluBias;
      c.swiglu_params = true;
      c.biases = true;
      c.seed = ++seed;
      SCOPED_TRACE(std::string(dtype_label(dt)) + " -> " + dtype_label(out_dt));
      const MoeInputs in = make_inputs(c);
      EXPECT_TRUE(all_close(run_moe(c, in)[0], moe_formula(c, in), default_tolerance(out_dt)));
    }
  }
}

// The grouped-route cases' rounding intervals on the CPU: the reference and the fp64 formula
// (exact sums, rounded at the same points) lie inside them; the formula with the activation left
// unrounded does not (a fifth to two fifths of its elements fall outside); more than two fifths
// of the elements are pinned to one value, no rounding boundary being within reach of the fp32
// errors (fp16 SwiGLU, whose small clamped activations round finest, pins the fewest: about
// half, the other cases 66 to 95 %).
TEST(MoeRoundingInterval, HoldsTheReferenceAndPinsMostElements) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (ActivationType act : {ActivationType::Swiglu, ActivationType::Geglu}) {
      const MoeCase c = grouped_random_case(dt, act);
      SCOPED_TRACE(std::string(dtype_label(dt)) + " " + std::string(activation_type_name(act)));
      const MoeInputs in = grouped_random_inputs(c);
      const RoundingInterval iv = moe_rounding_interval(c, in);
      EXPECT_TRUE(within(run_moe(c, in)[0], iv));
      std::vector<double> formula = moe_formula(c, in);
      for (double& v : formula) v = round_as(c.out_dt, v);
      EXPECT_TRUE(within(Tensor::from_vector(formula, {c.T, c.H}, DType::kFloat64), iv));
      // The activation left unrounded (one rounding point missed) leaves the interval.
      std::vector<double> unrounded = moe_formula(c, in, false);
      for (double& v : unrounded) v = round_as(c.out_dt, v);
      EXPECT_FALSE(within(Tensor::from_vector(unrounded, {c.T, c.H}, DType::kFloat64), iv));
      size_t pinned = 0;
      for (size_t i = 0; i < iv.lo.size(); ++i) pinned += iv.lo[i] == iv.hi[i] ? 1 : 0;
      EXPECT_GT(pinned * 5, iv.lo.size() * 2) << pinned << " of " << iv.lo.size() << " pinned";
    }
  }
}

// ---- bad input ----------------------------------------------------------------------------

TEST(CutlassFusedMoe, BadInput) {
  const char* op = "cutlass_fused_moe";
  MoeCase c;
  const MoeInputs in = make_inputs(c);
  auto call = [&](const Tensor& x, const Tensor& ids, const Tensor& sc, const Tensor& w1,
                  const Tensor& w2) { (void)cutlass_fused_moe(x, ids, sc, w1, w2, c.out_dt, {}); };
  EXPECT_FI_ERROR(call(Tensor(), in.ids, in.scales, in.w1, in.w2), op, "input");
  EXPECT_FI_ERROR(call(in.x.view({c.T * c.H}), in.ids, in.scales, in.w1, in.w2), op, "input");
  EXPECT_FI_ERROR(call(in.x.to(DType::kFloat64), in.ids, in.scales, in.w1, in.w2), op, "input");
  EXPECT_FI_ERROR(call(in.x, in.ids.to(DType::kFloat32), in.scales, in.w1, in.w2), op,
                  "token_selected_experts");
  EXPECT_FI_ERROR(call(in.x, in.ids.slice(0, 0, 2), in.scales, in.w1, in.w2), op,
                  "token_selected_experts");
  EXPECT_FI_ERROR(call(in.x, in.ids, in.scales.slice(1, 0, 1), in.w1, in.w2), op,
                  "token_final_scales");
  EXPECT_FI_ERROR(call(in.x, in.ids, in.scales, in.w1.slice(1, 0, c.I), in.w2), op,
                  "fc1_expert_weights");
  EXPECT_FI_ERROR(call(in.x, in.ids, in.scales, in.w1.to(DType::kFloat16), in.w2), op,
                  "fc1_expert_weights");
  EXPECT_FI_ERROR(call(in.x, in.ids, in.scales, in.w1, in.w2.slice(1, 0, 3)), op,
                  "fc2_expert_weights");
  EXPECT_FI_ERROR(call(in.x, in.ids, in.scales, in.w1, in.w2.view({c.E, c.H * c.I})), op,
                  "fc2_expert_weights");
  // Flags of the quantized / distributed paths, by name.
  auto flags = [&](int which) {
    (void)cutlass_fused_moe(in.x, in.ids, in.scales, in.w1, in.w2, c.out_dt, {}, std::nullopt,
                            std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, 1,
                            0, 1, 0, 1, 0, std::nullopt, which == 0, which == 1, which == 2,
                            which == 3, which == 4, which == 5, which == 6);
  };
  const char* names[] = {"enable_alltoall",      "use_deepseek_fp8_block_scale",
                         "use_w4_group_scaling", "use_mxfp8_act_scaling",
                         "min_latency_mode",     "use_packed_weights",
                         "use_wfp4afp8_humming"};
  for (int i = 1; i < 7; ++i) {  // enable_alltoall runs (TokensWithNoLocalExpertGetZeros)
    try {
      flags(i);
      ADD_FAILURE() << names[i];
    } catch (const Error& e) {
      EXPECT_EQ(e.arg(), names[i]);
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    }
  }
  EXPECT_FI_ERROR((void)cutlass_fused_moe(in.x, in.ids, in.scales, in.w1, in.w2, c.out_dt,
                                          std::vector<Tensor>{Tensor::zeros({1}, DType::kFloat32)}),
                  op, "quant_scales");
  EXPECT_FI_ERROR((void)cutlass_fused_moe(in.x, in.ids, in.scales, in.w1, in.w2, DType::kInt32, {}),
                  op, "output_dtype");
  EXPECT_FI_ERROR((void)cutlass_fused_moe(in.x, in.ids, in.scales, in.w1, in.w2, c.out_dt, {},
                                          std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                          std::nullopt, std::nullopt, 1, 0, 2, 2),
                  op, "ep_rank");
  EXPECT_FI_ERROR((void)cutlass_fused_moe(in.x, in.ids, in.scales, in.w1, in.w2, c.out_dt, {},
                                          std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                          std::nullopt, std::nullopt, 2, 3),
                  op, "tp_rank");
  EXPECT_FI_ERROR((void)cutlass_fused_moe(in.x, in.ids, in.scales, in.w1, in.w2, c.out_dt, {},
                                          Tensor::zeros({c.E, 3}, c.dt)),
                  op, "fc1_expert_biases");
  EXPECT_FI_ERROR((void)cutlass_fused_moe(in.x, in.ids, in.scales, in.w1, in.w2, c.out_dt, {},
                                          std::nullopt, std::nullopt, std::nullopt,
                                          Tensor::zeros({c.E + 1}, DType::kFloat32)),
                  op, "swiglu_alpha");
  EXPECT_FI_ERROR((void)run_moe(c, in, Tensor::zeros({c.T, c.H}, DType::kFloat16)), op, "output");
  EXPECT_FI_ERROR((void)run_moe(c, in, Tensor::zeros({c.T, c.H + 1}, c.out_dt)), op, "output");
  MoeCase relu = c;
  relu.act = ActivationType::Relu2;  // non-gated: w1 must be [E, I, H]
  EXPECT_FI_ERROR((void)run_moe(relu, in), op, "fc1_expert_weights");
  MoeCase tanh = c;
  tanh.act = ActivationType::GegluTanh;  // gated: w1 [E, I, H] is the wrong shape
  const MoeInputs in_relu = make_inputs(relu);
  EXPECT_FI_ERROR((void)run_moe(tanh, in_relu), op, "fc1_expert_weights");
  CutlassFusedMoeOptions situ;
  situ.situ_beta = Tensor::zeros({c.E}, DType::kFloat32);
  EXPECT_FI_ERROR(
      (void)cutlass_fused_moe(in.x, in.ids, in.scales, in.w1, in.w2, c.out_dt, {}, std::nullopt,
                              std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                              1, 0, 1, 0, 1, 0, std::nullopt, false, false, false, false, false,
                              false, false, 8192, std::nullopt, ActivationType::Swiglu, true, true,
                              std::nullopt, std::nullopt, situ),
      op, "situ_beta");
}

// ---- fused_topk_deepseek ------------------------------------------------------------------------

struct Routed {
  std::vector<int64_t> ids;
  std::vector<double> weights;
};

// fp64 formula: sigmoid, bias, groups by the sum of their two largest biased scores, top
// groups, top-k (descending, lower index first on ties), normalized unbiased weights.
Routed deepseek_formula(const std::vector<double>& logits, const std::vector<double>& bias,
                        int64_t E, int64_t G, int64_t TG, int64_t K, double factor) {
  std::vector<double> s(static_cast<size_t>(E)), b(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    s[static_cast<size_t>(e)] = 1.0 / (1.0 + std::exp(-logits[static_cast<size_t>(e)]));
    b[static_cast<size_t>(e)] = s[static_cast<size_t>(e)] + bias[static_cast<size_t>(e)];
  }
  const int64_t per = E / G;
  std::vector<double> gs(static_cast<size_t>(G));
  for (int64_t g = 0; g < G; ++g) {
    std::vector<double> v(b.begin() + g * per, b.begin() + (g + 1) * per);
    std::sort(v.rbegin(), v.rend());
    gs[static_cast<size_t>(g)] = per >= 2 ? v[0] + v[1] : v[0];
  }
  std::vector<int64_t> order(static_cast<size_t>(G));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
    return gs[static_cast<size_t>(x)] > gs[static_cast<size_t>(y)];
  });
  std::vector<int64_t> cand;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t g = e / per;
    if (G == 1 || std::find(order.begin(), order.begin() + TG, g) != order.begin() + TG) {
      cand.push_back(e);
    }
  }
  std::stable_sort(cand.begin(), cand.end(), [&](int64_t x, int64_t y) {
    return b[static_cast<size_t>(x)] > b[static_cast<size_t>(y)];
  });
  Routed r;
  double sum = 0.0;
  for (int64_t i = 0; i < K; ++i) sum += s[static_cast<size_t>(cand[static_cast<size_t>(i)])];
  for (int64_t i = 0; i < K; ++i) {
    const int64_t e = cand[static_cast<size_t>(i)];
    r.ids.push_back(e);
    r.weights.push_back(s[static_cast<size_t>(e)] / sum * factor);
  }
  return r;
}

// 8 experts in 4 groups of 2, 2 groups kept, top-3. Biased scores (sigmoid(0) = 0.5 + bias):
// groups {0,1}: 0.5+0.4, 0.5+0.0 -> 1.4; {2,3}: 0.5+0.3, 0.5+0.3 -> 1.6; {4,5}: 0.5+0.45,
// 0.5-0.5 -> 0.95; {6,7}: 0.5+0.1, 0.5+0.1 -> 1.2. Kept groups {2,3} and {0,1}; expert 4 has
// the largest single biased score (0.95) but its group is dropped. Top-3 by biased score:
// 0 (0.9), then 2 and 3 (0.8, tie: lower index first). Weights: 0.5 / 1.5 * 2.5 each.
TEST(FusedTopkDeepseek, Golden) {
  Tensor scores = Tensor::zeros({1, 8}, DType::kFloat32);
  Tensor bias =
      Tensor::from_vector({0.4, 0.0, 0.3, 0.3, 0.45, -0.5, 0.1, 0.1}, {8}, DType::kFloat32);
  Tensor vals = Tensor::zeros({1, 3}, DType::kFloat32);
  Tensor idx = Tensor::zeros({1, 3}, DType::kInt32);
  Tensor replay_out = Tensor::full({2, 3}, -1, DType::kInt16);
  fused_topk_deepseek(scores, bias, 4, 2, 3, 2.5, vals, idx, true, replay_out);
  EXPECT_TRUE(all_close(idx, {0, 2, 3}, {0, 0}));
  const double w = 0.5 / 1.5 * 2.5;
  EXPECT_TRUE(all_close(vals, {w, w, w}, {1e-7, 1e-6}));
  EXPECT_TRUE(all_close(replay_out, {0, 2, 3, -1, -1, -1}, {0, 0}));  // only row 0 written
}

TEST(FusedTopkDeepseek, MatchesFormula) {
  struct Cfg {
    int64_t E, G, TG, K;
  };
  uint64_t seed = 100;
  for (const Cfg& cfg :
       {Cfg{64, 8, 4, 8}, Cfg{16, 1, 1, 1}, Cfg{16, 2, 2, 4}, Cfg{32, 4, 2, 6}, Cfg{8, 8, 3, 2}}) {
    for (DType dt : kDTypes) {
      const int64_t T = 33;
      SCOPED_TRACE(std::string(dtype_label(dt)) + " E=" + std::to_string(cfg.E));
      Tensor scores = rand_tensor({T, cfg.E}, dt, ++seed, -4.0, 4.0);
      Tensor bias = rand_tensor({cfg.E}, dt, ++seed, -0.3, 0.3);
      Tensor vals = Tensor::zeros({T, cfg.K}, DType::kFloat32);
      Tensor idx = Tensor::zeros({T, cfg.K}, DType::kInt32);
      fused_topk_deepseek(scores, bias, cfg.G, cfg.TG, cfg.K, 1.5, vals, idx);
      const auto sv = scores.to_double_vector(), bv = bias.to_double_vector();
      const auto iv = idx.to_double_vector(), vv = vals.to_double_vector();
      for (int64_t t = 0; t < T; ++t) {
        const std::vector<double> row(sv.begin() + t * cfg.E, sv.begin() + (t + 1) * cfg.E);
        const Routed r = deepseek_formula(row, bv, cfg.E, cfg.G, cfg.TG, cfg.K, 1.5);
        for (int64_t k = 0; k < cfg.K; ++k) {
          EXPECT_EQ(iv[static_cast<size_t>(t * cfg.K + k)], r.ids[static_cast<size_t>(k)])
              << "token " << t << " k " << k;
          EXPECT_NEAR(vv[static_cast<size_t>(t * cfg.K + k)], r.weights[static_cast<size_t>(k)],
                      1e-6);
        }
      }
      // topk_values in the scores' dtype: the same weights, rounded.
      Tensor vals_dt = Tensor::zeros({T, cfg.K}, dt);
      fused_topk_deepseek(scores, bias, cfg.G, cfg.TG, cfg.K, 1.5, vals_dt, idx);
      EXPECT_TRUE(all_close(vals_dt, vals.to_double_vector(), default_tolerance(dt)));
    }
  }
}

TEST(FusedTopkDeepseek, BadInput) {
  const char* op = "fused_topk_deepseek";
  Tensor s = rand_tensor({4, 64}, DType::kFloat32, 1);
  Tensor b = rand_tensor({64}, DType::kFloat32, 2);
  Tensor v = Tensor::zeros({4, 8}, DType::kFloat32);
  Tensor i = Tensor::zeros({4, 8}, DType::kInt32);
  EXPECT_FI_ERROR(fused_topk_deepseek(s.view({256}), b, 8, 4, 8, 1.0, v, i), op, "scores");
  EXPECT_FI_ERROR(fused_topk_deepseek(s.to(DType::kFloat64), b, 8, 4, 8, 1.0, v, i), op, "scores");
  EXPECT_FI_ERROR(fused_topk_deepseek(s, b.slice(0, 0, 32), 8, 4, 8, 1.0, v, i), op, "bias");
  EXPECT_FI_ERROR(fused_topk_deepseek(s, b, 7, 4, 8, 1.0, v, i), op, "n_group");
  EXPECT_FI_ERROR(fused_topk_deepseek(s, b, 0, 1, 8, 1.0, v, i), op, "n_group");
  EXPECT_FI_ERROR(fused_topk_deepseek(s, b, 8, 9, 8, 1.0, v, i), op, "topk_group");
  EXPECT_FI_ERROR(fused_topk_deepseek(s, b, 4, 1, 8, 1.0, v, i), op, "topk_group");  // 4 < 8
  // Upstream's check passes (1 * 8 >= 8) but the one kept group holds a single expert: refused
  // (the selection would run out of candidates and index expert -1).
  EXPECT_FI_ERROR(fused_topk_deepseek(rand_tensor({4, 8}, DType::kFloat32, 3),
                                      rand_tensor({8}, DType::kFloat32, 4), 8, 1, 8, 1.0, v, i),
                  op, "topk_group");
  EXPECT_FI_ERROR(fused_topk_deepseek(s, b, 8, 4, 9, 1.0, Tensor::zeros({4, 9}, DType::kFloat32),
                                      Tensor::zeros({4, 9}, DType::kInt32)),
                  op, "topk");
  EXPECT_FI_ERROR(fused_topk_deepseek(s, b, 8, 4, 8, std::nan(""), v, i), op,
                  "routed_scaling_factor");
  EXPECT_FI_ERROR(
      fused_topk_deepseek(s, b, 8, 4, 8, 1.0, Tensor::zeros({4, 8}, DType::kFloat16), i), op,
      "topk_values");
  EXPECT_FI_ERROR(fused_topk_deepseek(s, b, 8, 4, 8, 1.0, v, Tensor::zeros({4, 8}, DType::kInt64)),
                  op, "topk_indices");
  EXPECT_FI_ERROR(fused_topk_deepseek(s, b, 8, 4, 8, 1.0, v, Tensor::zeros({3, 8}, DType::kInt32)),
                  op, "topk_indices");
  EXPECT_FI_ERROR(
      fused_topk_deepseek(s, b, 8, 4, 8, 1.0, v, i, true, Tensor::zeros({3, 8}, DType::kInt16)), op,
      "routing_replay_out");
  EXPECT_FI_ERROR(
      fused_topk_deepseek(s, b, 8, 4, 8, 1.0, v, i, true, Tensor::zeros({4, 8}, DType::kInt32)), op,
      "routing_replay_out");
  EXPECT_FI_ERROR(fused_topk_deepseek(s, b, 8, 4, 8, 1.0, v, i, true, std::nullopt, "cake"), op,
                  "backend");
  EXPECT_FI_ERROR(fused_topk_deepseek(s, b, 8, 4, 8, 1.0, v, i, true, std::nullopt, "x"), op,
                  "backend");
}

// ---- fused_topk_deepseek's warp-per-token CUDA kernel, checked on the CPU ----------------------

namespace dr = kernels::deepseek_routing;

// A multiset of floats with NaN, infinities and many ties.
std::vector<float> tricky_values(std::mt19937& rng, int n, bool with_nan) {
  const float levels[] = {-INFINITY, -1.0f, -0.5f, 0.0f, 0.25f, 0.5f, 1.0f, INFINITY};
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    const unsigned r = rng() % 20;
    x = r < 8 ? levels[r] : std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
    if (with_nan && rng() % 9 == 0) x = NAN;
  }
  return v;
}

// The reference's loop for a group score (kernels/cpu/moe_cpu.cpp), bit for bit.
dr::Top2 sequential_top2(const std::vector<float>& v) {
  dr::Top2 t{-INFINITY, -INFINITY};
  for (float x : v) dr::top2_push(t, x);
  return t;
}

bool same_bits(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

// Pairs kept by 32 lanes (values dealt round-robin, as experts are) and merged by the kernel's
// butterfly give the reference's pair, in any order of the values.
TEST(DeepSeekRoutingRules, LanePairsMergeToTheSequentialTopTwo) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 70);
    const std::vector<float> v = tricky_values(rng, n, trial % 2 == 0);
    std::vector<dr::Top2> lane(32, dr::Top2{-INFINITY, -INFINITY});
    for (int i = 0; i < n; ++i) dr::top2_push(lane[static_cast<size_t>(i % 32)], v[i]);
    for (int o = 16; o > 0; o >>= 1) {
      std::vector<dr::Top2> next(32);
      for (int l = 0; l < 32; ++l) next[l] = dr::top2_merge(lane[l], lane[l ^ o]);
      lane = next;
    }
    const dr::Top2 want = sequential_top2(v);
    for (int l = 0; l < 32; ++l) {
      ASSERT_TRUE(same_bits(lane[l].m1, want.m1) && same_bits(lane[l].m2, want.m2))
          << "trial " << trial << " lane " << l;
    }
  }
}

// The kernel's argmax (kernels/cuda/moe_cuda.cu, dsr_warp_pick) emulated lane by lane: each
// lane's best by pick_better and its first candidate, the first candidate taken outright when
// its value is NaN, else the butterfly. Returns the winner (-1: none) and its payload.
int32_t emulate_warp_pick(const std::vector<float>& v, const std::vector<int32_t>& idx,
                          const std::vector<float>& s, const std::vector<int32_t>& first,
                          const std::vector<float>& first_v, const std::vector<float>& first_s,
                          float& s_out) {
  bool any_nan_first = false;
  for (int l = 0; l < 32; ++l) {
    any_nan_first |= first[l] != INT32_MAX && std::isnan(first_v[l]);
  }
  if (any_nan_first) {
    int32_t f = INT32_MAX;
    for (int l = 0; l < 32; ++l) f = std::min(f, first[l]);
    const int owner = f & 31;
    if (std::isnan(first_v[owner])) {
      s_out = first_s[owner];
      return f;
    }
  }
  std::vector<float> cv = v, cs = s;
  std::vector<int32_t> ci = idx;
  for (int o = 16; o > 0; o >>= 1) {
    std::vector<float> nv = cv, ns = cs;
    std::vector<int32_t> ni = ci;
    for (int l = 0; l < 32; ++l) {
      const int m = l ^ o;
      if (ci[m] >= 0 && (ci[l] < 0 || dr::pick_better(cv[m], ci[m], cv[l], ci[l]))) {
        nv[l] = cv[m];
        ni[l] = ci[m];
        ns[l] = cs[m];
      }
    }
    cv = nv, ci = ni, cs = ns;
  }
  s_out = cs[0];
  return ci[0];
}

// The reference's argmax over candidates in ascending index (values v[i] where cand[i]).
int32_t sequential_argmax(const std::vector<float>& v, const std::vector<char>& cand) {
  int32_t best = -1;
  for (int32_t i = 0; i < static_cast<int32_t>(v.size()); ++i) {
    if (cand[i] && (best < 0 || v[i] > v[best])) best = i;
  }
  return best;
}

// The warp's argmax picks the reference loop's candidate: candidates dealt to lanes as experts
// are (index i on lane i % 32), values with NaN (first candidate or not), infinities and ties.
TEST(DeepSeekRoutingRules, WarpArgmaxPicksTheSequentialLoopsCandidate) {
  std::mt19937 rng(6);
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 300);
    const std::vector<float> v = tricky_values(rng, n, trial % 3 != 0);
    std::vector<char> cand(static_cast<size_t>(n));
    for (auto& c : cand) c = rng() % 4 != 0;
    cand[rng() % n] = 1;
    std::vector<float> lv(32, 0.0f), ls(32, 0.0f), fv(32, 0.0f), fs(32, 0.0f);
    std::vector<int32_t> li(32, -1), lf(32, INT32_MAX);
    for (int i = 0; i < n; ++i) {  // each lane in ascending index, as the kernel's j loop
      if (!cand[i]) continue;
      const int l = i % 32;
      if (lf[l] == INT32_MAX) lf[l] = i, fv[l] = v[i], fs[l] = static_cast<float>(i);
      if (li[l] < 0 || dr::pick_better(v[i], i, lv[l], li[l])) {
        lv[l] = v[i], li[l] = i, ls[l] = static_cast<float>(i);
      }
    }
    float s_out = -1.0f;
    const int32_t got = emulate_warp_pick(lv, li, ls, lf, fv, fs, s_out);
    const int32_t want = sequential_argmax(v, cand);
    ASSERT_EQ(got, want) << "trial " << trial;
    ASSERT_EQ(s_out, static_cast<float>(want)) << "the payload travels with the winner";
  }
}

// The whole kernel emulated on the CPU (its steps in order, with the helpers it uses) picks the
// CPU reference's experts and weights bit for bit, on DeepSeek-V3's shape, 384 experts in one
// group (upstream's check then allows topk 1), 1024 experts in 32 groups (the largest the limits
// allow) and small shapes; scores with ties, NaN and infinities.
TEST(DeepSeekRoutingRules, EmulatedKernelMatchesTheReferenceBitForBit) {
  struct Cfg {
    int E, G, TG, K;
  };
  std::mt19937 rng(7);
  for (const Cfg& c : {Cfg{256, 8, 4, 8}, Cfg{384, 1, 1, 1}, Cfg{1024, 32, 4, 8}, Cfg{64, 4, 2, 6},
                       Cfg{8, 8, 3, 2}, Cfg{40, 2, 2, 3}}) {
    SCOPED_TRACE(::testing::Message() << "E " << c.E << " G " << c.G);
    const int T = 24, per = c.E / c.G;
    std::vector<double> sc, bi;
    for (int t = 0; t < T; ++t) {
      for (float x : tricky_values(rng, c.E, t % 4 == 3)) sc.push_back(x);
    }
    // Bias multiples of 1/8 with an infinity now and then (infinite biased scores, and an
    // inf + -inf group score: NaN).
    for (int e = 0; e < c.E; ++e) {
      const unsigned r = rng() % 40;
      bi.push_back(r == 0 ? INFINITY : r == 1 ? -INFINITY : static_cast<double>((r % 5) * 0.125f));
    }
    Tensor scores = Tensor::from_vector(sc, {T, c.E}, DType::kFloat32);
    Tensor bias = Tensor::from_vector(bi, {c.E}, DType::kFloat32);
    Tensor vals = Tensor::zeros({T, c.K}, DType::kFloat32);
    Tensor idx = Tensor::zeros({T, c.K}, DType::kInt32);
    fused_topk_deepseek(scores, bias, c.G, c.TG, c.K, 1.5, vals, idx);
    const auto want_i = idx.to_double_vector();
    const std::vector<float> want_v = [&] {
      std::vector<float> out(static_cast<size_t>(T * c.K));
      std::memcpy(out.data(), vals.data_ptr(), out.size() * sizeof(float));
      return out;
    }();
    for (int t = 0; t < T; ++t) {
      // Lane l's registers: experts l + 32 j (the kernel's sg / bv, the reference's expressions).
      std::vector<float> sg(static_cast<size_t>(c.E)), bv(sg.size());
      for (int e = 0; e < c.E; ++e) {
        const float x = static_cast<float>(sc[static_cast<size_t>(t * c.E + e)]);
        sg[e] = 1.0f / (1.0f + std::exp(-x));
        bv[e] = sg[e] + static_cast<float>(bi[e]);
      }
      uint32_t kept = c.G == 1 ? 1u : 0u;
      if (c.G > 1) {
        std::vector<float> gscore(32, 0.0f);
        for (int g = 0; g < c.G; ++g) {
          std::vector<dr::Top2> lane(32, dr::Top2{-INFINITY, -INFINITY});
          for (int e = g * per; e < (g + 1) * per; ++e) dr::top2_push(lane[e % 32], bv[e]);
          for (int o = 16; o > 0; o >>= 1) {
            std::vector<dr::Top2> next(32);
            for (int l = 0; l < 32; ++l) next[l] = dr::top2_merge(lane[l], lane[l ^ o]);
            lane = next;
          }
          gscore[g] = per >= 2 ? lane[g].m1 + lane[g].m2 : lane[g].m1;
        }
        for (int i = 0; i < c.TG; ++i) {
          std::vector<float> zero(32, 0.0f);
          std::vector<int32_t> li(32), lf(32);
          for (int l = 0; l < 32; ++l) {
            const bool cand = l < c.G && !((kept >> l) & 1u);
            li[l] = cand ? l : -1;
            lf[l] = cand ? l : INT32_MAX;
          }
          float unused;
          const int32_t best = emulate_warp_pick(gscore, li, zero, lf, gscore, zero, unused);
          ASSERT_GE(best, 0);
          kept |= 1u << best;
        }
      }
      std::vector<char> open(static_cast<size_t>(c.E));
      for (int e = 0; e < c.E; ++e) open[e] = (kept >> (e / per)) & 1u;
      float sum = 0.0f;
      std::vector<int32_t> sel;
      std::vector<float> sel_s;
      for (int i = 0; i < c.K; ++i) {
        std::vector<float> lv(32, 0.0f), ls(32, 0.0f), fv(32, 0.0f), fs(32, 0.0f);
        std::vector<int32_t> li(32, -1), lf(32, INT32_MAX);
        for (int e = 0; e < c.E; ++e) {
          if (!open[e]) continue;
          const int l = e % 32;
          if (lf[l] == INT32_MAX) lf[l] = e, fv[l] = bv[e], fs[l] = sg[e];
          if (li[l] < 0 || dr::pick_better(bv[e], e, lv[l], li[l])) {
            lv[l] = bv[e], li[l] = e, ls[l] = sg[e];
          }
        }
        float s = 0.0f;
        const int32_t best = emulate_warp_pick(lv, li, ls, lf, fv, fs, s);
        ASSERT_GE(best, 0);
        open[best] = 0;
        sum += s;
        sel.push_back(best);
        sel_s.push_back(s);
      }
      const float denom = sum + 1e-20f;
      for (int i = 0; i < c.K; ++i) {
        const size_t k = static_cast<size_t>(t * c.K + i);
        ASSERT_EQ(sel[i], static_cast<int32_t>(want_i[k])) << "token " << t << " pick " << i;
        const float w = sel_s[i] / denom * 1.5f;
        ASSERT_TRUE(same_bits(w, want_v[k]) || (std::isnan(w) && std::isnan(want_v[k])))
            << "token " << t << " pick " << i << ": " << w << " vs " << want_v[k];
      }
    }
  }
}

#if FLASHINFER_TEST_HAVE_ORACLES
// On the GPU: the warp-per-token kernel against the thread-per-token kernel it replaced (the
// oracle; the same expressions, so the same floats) bit for bit, indices, weights and the replay
// ids, on the shapes above, every dtype of the scores / bias / weights, rows with ties, NaN and
// infinities, and more tokens than one block's 4 warps. (Against the CPU, test_backend_ops'
// case: the host's exp may differ from the device's in the last bit.)
TEST(FusedTopkDeepseekCuda, WarpKernelMatchesTheThreadKernelOracleBitForBit) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda(0);
  struct Cfg {
    int E, G, TG, K;
  };
  std::mt19937 rng(8);
  for (const Cfg& c : {Cfg{256, 8, 4, 8}, Cfg{384, 1, 1, 1}, Cfg{1024, 32, 4, 8}, Cfg{64, 4, 2, 6},
                       Cfg{8, 8, 3, 2}}) {
    for (DType dt : kDTypes) {
      SCOPED_TRACE(::testing::Message() << "E " << c.E << " " << dtype_torch_name(dt));
      const int T = 37;
      std::vector<double> sc;
      for (int t = 0; t < T; ++t) {
        for (float x : tricky_values(rng, c.E, t % 5 == 4)) sc.push_back(x);
      }
      const Tensor scores = Tensor::from_vector(sc, {T, c.E}, DType::kFloat32).to(dt).to(g);
      const Tensor bias = rand_tensor({c.E}, dt, 9, -0.25, 0.25).to(g);
      auto run = [&](bool oracle) {
        Tensor vals = Tensor::full({T, c.K}, -7.0, dt, g);
        Tensor idx = Tensor::full({T, c.K}, -7.0, DType::kInt32, g);
        Tensor rep = Tensor::full({T, c.K}, -7.0, DType::kInt16, g);
        if (!oracle) {
          fused_topk_deepseek(scores, bias, c.G, c.TG, c.K, 2.5, vals, idx, false, rep);
        } else {
          kernels::DeepSeekRoutingParams p;
          p.scores = scores.data_ptr();
          p.scores_dtype = dt;
          p.scores_stride = c.E;
          p.bias = bias.data_ptr();
          p.bias_dtype = dt;
          p.topk_values = vals.data_ptr();
          p.values_dtype = dt;
          p.values_stride = c.K;
          p.topk_indices = idx.data<int32_t>();
          p.indices_stride = c.K;
          p.replay_out = rep.data<int16_t>();
          p.replay_stride = c.K;
          p.num_tokens = T;
          p.num_experts = c.E;
          p.n_group = c.G;
          p.topk_group = c.TG;
          p.topk = c.K;
          p.routed_scaling_factor = 2.5f;
          oracle_deepseek_routing(p, current_cuda_stream());
        }
        return std::vector<Tensor>{vals.to(Device::cpu()), idx.to(Device::cpu()),
                                   rep.to(Device::cpu())};
      };
      const auto got = run(false), want = run(true);
      for (size_t j = 0; j < got.size(); ++j) {
        ASSERT_EQ(got[j].numel(), want[j].numel());
        EXPECT_EQ(std::memcmp(got[j].data_ptr(), want[j].data_ptr(),
                              static_cast<size_t>(got[j].numel()) * got[j].element_size()),
                  0)
            << "output " << j;
      }
    }
  }
}
#endif

#if FLASHINFER_TEST_HAVE_ORACLES
// The trtllm MoE ops' routing on the GPU: the warp-per-token kernel against the thread-per-token
// kernel it replaced (the oracle; the same expressions, the sums in the same order), bit for bit:
// ids, weights, expert_weights_out and the replay ids, for every routing method, fp32 and bf16
// logits and bias, expert counts from 8 to 512 (the limit), top_k past the warp's 32 lanes,
// DeepSeekV3's grouped selection, rows with ties, infinities and NaN, more tokens than one
// block's 4 warps, and the _routed_ ops' precomputed ids (packed, and with fp32 / bf16 weights).
TEST(TrtllmRoutingCuda, WarpKernelMatchesTheThreadKernelOracleBitForBit) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda(0);
  using kernels::MoeRouting;
  struct Cfg {
    MoeRouting method;
    int E, K, G, TG;
    bool bias;
  };
  const Cfg cfgs[] = {
      {MoeRouting::kDefault, 128, 8, 1, 1, false},
      {MoeRouting::kDefault, 512, 40, 1, 1, false},
      {MoeRouting::kRenormalize, 64, 6, 1, 1, false},
      {MoeRouting::kRenormalize, 8, 8, 1, 1, false},
      {MoeRouting::kDeepSeekV3, 256, 8, 8, 4, true},
      {MoeRouting::kDeepSeekV3, 384, 8, 1, 1, true},
      {MoeRouting::kDeepSeekV3, 512, 12, 32, 5, false},
      {MoeRouting::kLlama4, 16, 1, 1, 1, false},
      {MoeRouting::kRenormalizeNaive, 160, 6, 1, 1, false},
      {MoeRouting::kTopK, 60, 33, 1, 1, false},
      {MoeRouting::kSigmoidRenorm, 128, 8, 1, 1, false},
      {MoeRouting::kMiniMax2, 256, 8, 1, 1, true},
      {MoeRouting::kSigmoid, 96, 4, 1, 1, false},
  };
  std::mt19937 rng(17);
  for (const Cfg& c : cfgs) {
    for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(::testing::Message() << "method " << static_cast<int>(c.method) << " E " << c.E
                                        << " K " << c.K << " " << dtype_torch_name(dt));
      const int T = 37;
      std::vector<double> lg;
      for (int t = 0; t < T; ++t) {
        // Every fifth row with NaN (the sums and picks see it as the reference's loops do).
        for (float x : tricky_values(rng, c.E, t % 5 == 4)) lg.push_back(x);
      }
      const Tensor logits = Tensor::from_vector(lg, {T, c.E}, DType::kFloat32).to(dt).to(g);
      const Tensor bias = rand_tensor({c.E}, dt, 19, -0.25, 0.25).to(g);
      kernels::TrtllmMoeParams b;
      b.routing.logits = logits.data_ptr();
      b.routing.logits_dtype = dt;
      b.routing.logits_stride = c.E;
      b.routing.bias = c.bias ? bias.data_ptr() : nullptr;
      b.routing.bias_dtype = dt;
      b.routing.num_tokens = T;
      b.routing.num_experts = c.E;
      b.routing.top_k = c.K;
      b.routing.n_group = c.G;
      b.routing.topk_group = c.TG;
      b.routing.routed_scaling_factor = 2.5f;
      b.routing.method = c.method;
      b.replay_stride = c.K;
      auto run = [&](const kernels::TrtllmMoeParams& base, bool oracle) {
        Tensor ids = Tensor::full({T, c.K}, -7.0, DType::kInt32, g);
        Tensor w = Tensor::full({T, c.K}, -7.0, DType::kFloat32, g);
        Tensor ew = Tensor::full({T, c.K}, 7.0, DType::kInt16, g);  // bf16 bits
        Tensor rep = Tensor::full({T, c.K}, -7.0, DType::kInt16, g);
        kernels::TrtllmMoeParams q = base;
        q.expert_weights_out = reinterpret_cast<uint16_t*>(ew.data_ptr());
        q.replay_out = rep.data<int16_t>();
        if (oracle) {
          oracle_trtllm_route(q, ids.data<int32_t>(), w.data<float>(), current_cuda_stream());
        } else {
          kernels::cuda::trtllm_route(q, ids.data<int32_t>(), w.data<float>(),
                                      current_cuda_stream(), false);
        }
        return std::vector<Tensor>{ids.to(Device::cpu()), w.to(Device::cpu()), ew.to(Device::cpu()),
                                   rep.to(Device::cpu())};
      };
      auto same = [&](const kernels::TrtllmMoeParams& base, const char* what) {
        const auto got = run(base, false), want = run(base, true);
        for (size_t j = 0; j < got.size(); ++j) {
          EXPECT_EQ(std::memcmp(got[j].data_ptr(), want[j].data_ptr(),
                                static_cast<size_t>(got[j].numel()) * got[j].element_size()),
                    0)
              << what << ": output " << j;
        }
      };
      same(b, "from logits");
      // The _routed_ forms on this routing's result: ids with weights, and packed pairs.
      const auto routed = run(b, true);
      const Tensor ids_g = routed[0].to(g), w_g = routed[1].to(dt).to(g);
      kernels::TrtllmMoeParams pre = b;
      pre.precomputed = true;
      pre.routed_stride = c.K;
      pre.ids = ids_g.data<int32_t>();
      pre.weights = w_g.data_ptr();
      pre.weights_dtype = dt;
      same(pre, "precomputed ids and weights");
      std::vector<double> packed;
      const std::vector<double> iv = routed[0].to_double_vector();
      const std::vector<double> wv = routed[2].to_double_vector();  // bf16 bits as int16
      for (size_t i = 0; i < iv.size(); ++i) {
        const auto bits = static_cast<uint32_t>(static_cast<uint16_t>(static_cast<int16_t>(wv[i])));
        packed.push_back(
            static_cast<double>(static_cast<int32_t>((static_cast<uint32_t>(iv[i]) << 16) | bits)));
      }
      const Tensor packed_g = Tensor::from_vector(packed, {T, c.K}, DType::kInt32).to(g);
      pre.ids = nullptr;
      pre.weights = nullptr;
      pre.packed = packed_g.data<int32_t>();
      same(pre, "precomputed packed");
    }
  }
}
#endif

// ---- hash_topk ---------------------------------------------------------------------------------

double sqrt_softplus(double x) { return std::sqrt(std::log1p(std::exp(x))); }

// Token 0 (vocab id 2) -> experts {3, 0}; token 1 (vocab id 0) -> {1, 2}. Logit 0 gives
// sqrt(ln 2); the shared slot is expert 4 with weight 1 / 2.5.
TEST(HashTopk, Golden) {
  Tensor logits = Tensor::from_vector({0, 9, 9, std::log(std::exp(4.0) - 1.0),   // sp = 4
                                       9, 0, std::log(std::exp(9.0) - 1.0), 9},  // sp = 0.69, 9
                                      {2, 4}, DType::kFloat32);
  Tensor toks = Tensor::from_vector({2, 0}, {2}, DType::kInt64);
  Tensor table = Tensor::from_vector({1, 2, /*1*/ 0, 0, /*2*/ 3, 0}, {3, 2}, DType::kInt32);
  auto [w, ids] = hash_topk(logits, toks, table, 1, 2.5);
  EXPECT_TRUE(all_close(ids, {3, 0, 4, 1, 2, 4}, {0, 0}));
  const double a = 2.0, b = std::sqrt(std::log(2.0));  // token 0: sqrt(4), sqrt(softplus(0))
  const double c = std::sqrt(std::log(2.0)), d = 3.0;  // token 1: sqrt(ln 2), sqrt(9)
  EXPECT_TRUE(
      all_close(w, {a / (a + b), b / (a + b), 0.4, c / (c + d), d / (c + d), 0.4}, {1e-6, 1e-6}));
}

TEST(HashTopk, MatchesFormula) {
  const int64_t T = 40, E = 32, V = 50, K = 6;
  Tensor logits = rand_tensor({T, E}, DType::kFloat32, 3, -30.0, 30.0);  // both softplus branches
  std::vector<double> tab, tok;
  for (int64_t v = 0; v < V; ++v) {
    for (int64_t k = 0; k < K; ++k) tab.push_back(static_cast<double>((v * 5 + k * 3) % E));
  }
  for (int64_t t = 0; t < T; ++t) tok.push_back(static_cast<double>((t * 13) % V));
  Tensor table = Tensor::from_vector(tab, {V, K}, DType::kInt32);
  Tensor toks = Tensor::from_vector(tok, {T}, DType::kInt64);
  for (int64_t shared : {0, 1}) {
    auto [w, ids] = hash_topk(logits, toks, table, shared, 0.5);
    const auto lv = logits.to_double_vector();
    std::vector<double> ew, ei;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t v = static_cast<int64_t>(tok[static_cast<size_t>(t)]);
      double sum = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        sum += sqrt_softplus(lv[static_cast<size_t>(t * E + tab[static_cast<size_t>(v * K + k)])]);
      }
      for (int64_t k = 0; k < K; ++k) {
        const double e = tab[static_cast<size_t>(v * K + k)];
        ei.push_back(e);
        ew.push_back(sqrt_softplus(lv[static_cast<size_t>(t * E + static_cast<int64_t>(e))]) / sum);
      }
      if (shared) {
        ei.push_back(E);
        ew.push_back(2.0);
      }
    }
    EXPECT_TRUE(all_close(ids, ei, {0, 0}));
    EXPECT_TRUE(all_close(w, ew, {1e-6, 1e-5}));
  }
}

TEST(HashTopk, BadInput) {
  const char* op = "hash_topk";
  Tensor logits = rand_tensor({3, 8}, DType::kFloat32, 1);
  Tensor toks = Tensor::from_vector({0, 1, 2}, {3}, DType::kInt64);
  Tensor table = Tensor::from_vector({0, 1, 2, 3, 4, 5}, {3, 2}, DType::kInt32);
  EXPECT_FI_ERROR(hash_topk(logits.to(DType::kBFloat16), toks, table), op, "router_logits");
  EXPECT_FI_ERROR(hash_topk(logits.view({24}), toks, table), op, "router_logits");
  EXPECT_FI_ERROR(hash_topk(logits, toks.to(DType::kInt32), table), op, "input_ids");
  EXPECT_FI_ERROR(hash_topk(logits, toks.slice(0, 0, 2), table), op, "input_ids");
  EXPECT_FI_ERROR(hash_topk(logits, toks, table.to(DType::kInt64)), op, "tid2eid");
  EXPECT_FI_ERROR(hash_topk(logits, toks, table, 2), op, "num_fused_shared_experts");
  EXPECT_FI_ERROR(hash_topk(logits, toks, table, 1, 0.0), op, "routed_scaling_factor");
  // Ids outside their tables: errors, never out-of-bounds reads.
  EXPECT_FI_ERROR(hash_topk(logits, Tensor::from_vector({0, 3, 1}, {3}, DType::kInt64), table), op,
                  "input_ids");
  EXPECT_FI_ERROR(
      hash_topk(logits, toks, Tensor::from_vector({0, 1, 2, 8, 4, 5}, {3, 2}, DType::kInt32)), op,
      "tid2eid");
}

// On CUDA the ids are checked by the kernel, on the device: valid tokens match the CPU (ids
// exactly, weights within a few ulps: the device's expf / log1pf); a token whose id is outside the
// table (3, -1) or whose row names an expert outside [0, 8) (row 2) gets routed ids -1 and NaN
// weights, its shared slot as usual, and nothing is read out of bounds (compute-sanitizer memcheck
// would say).
TEST(HashTopkCuda, BadIdsGiveNanRowsOnTheDevice) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  Tensor logits = rand_tensor({5, 8}, DType::kFloat32, 31);
  Tensor table = Tensor::from_vector({0, 1, 7, 4, 2, 9}, {3, 2}, DType::kInt32);
  Tensor toks = Tensor::from_vector({0, 3, 1, -1, 2}, {5}, DType::kInt64);
  auto [w, ids] = hash_topk(logits.to(g), toks.to(g), table.to(g), 1, 2.0);
  const auto wv = w.to(Device::cpu()).to_double_vector();
  const auto iv = ids.to(Device::cpu()).to_double_vector();
  for (int64_t t : {0, 2}) {  // valid: the CPU's
    auto [cw, cids] = hash_topk(logits.slice(0, t, t + 1), toks.slice(0, t, t + 1), table, 1, 2.0);
    const auto cwv = cw.to_double_vector(), civ = cids.to_double_vector();
    for (int64_t k = 0; k < 3; ++k) {
      EXPECT_NEAR(wv[t * 3 + k], cwv[k], 1e-6 * std::fabs(cwv[k])) << t << " " << k;
      EXPECT_EQ(iv[t * 3 + k], civ[k]) << t << " " << k;
    }
  }
  for (int64_t t : {1, 3, 4}) {  // id outside the table (3, -1); row 2 names expert 9
    for (int64_t k = 0; k < 2; ++k) {
      EXPECT_TRUE(std::isnan(wv[t * 3 + k])) << t << " " << k;
      EXPECT_EQ(iv[t * 3 + k], -1) << t << " " << k;
    }
    EXPECT_EQ(wv[t * 3 + 2], 0.5) << t;  // the shared slot: 1 / routed_scaling_factor
    EXPECT_EQ(iv[t * 3 + 2], 8) << t;
  }
}

// ---- trtllm_bf16_moe
// ------------------------------------------------------------------------------

// fp64 routing formula of each RoutingMethodType (docs/MOE.md): (ids, weights) of one token.
Routed routing_formula(int method, const std::vector<double>& logits,
                       const std::vector<double>& bias, int64_t K, int64_t G, int64_t TG,
                       double scale) {
  const int64_t E = static_cast<int64_t>(logits.size());
  if (method == 2) return deepseek_formula(logits, bias, E, G, TG, K, scale);
  std::vector<double> x = logits;
  auto sigmoid = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  if (method == 0 || method == 4) {
    const double m = *std::max_element(x.begin(), x.end());
    double d = 0.0;
    for (double& v : x) d += (v = std::exp(v - m));
    for (double& v : x) v /= d;
  } else if (method == 6 || method == 7 || method == 8) {
    for (double& v : x) v = sigmoid(v);
  }
  std::vector<double> sel = x;
  if (method == 7) {
    for (int64_t e = 0; e < E; ++e) sel[static_cast<size_t>(e)] += bias[static_cast<size_t>(e)];
  }
  std::vector<int64_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return sel[static_cast<size_t>(a)] > sel[static_cast<size_t>(b)];
  });
  Routed r;
  double sum = 0.0;
  for (int64_t i = 0; i < K; ++i) {
    r.ids.push_back(order[static_cast<size_t>(i)]);
    r.weights.push_back(x[static_cast<size_t>(order[static_cast<size_t>(i)])]);
    sum += r.weights.back();
  }
  if (method == 1) {
    const double m = *std::max_element(r.weights.begin(), r.weights.end());
    double d = 0.0;
    for (double& w : r.weights) d += (w = std::exp(w - m));
    for (double& w : r.weights) w /= d;
  } else if (method == 3 || method == 9) {  // Llama4 (top-1), TopKSigmoid (top-k)
    for (double& w : r.weights) w = sigmoid(w);
  } else if (method == 4 || method == 6) {
    for (double& w : r.weights) w /= sum;
  } else if (method == 7) {
    // MiniMax2: routeScale = routed_scaling_factor (upstream's Routing::Runner).
    for (double& w : r.weights) w = w * scale / (sum + 1e-20);
  }
  return r;
}

TEST(TrtllmBf16Moe, MatchesFormulaForEveryRoutingMethod) {
  const int64_t T = 20, E = 8, H = 32, I = 16, K = 2, G = 4, TG = 2;
  const double scale = 2.5;
  for (int method = 0; method <= 9; ++method) {
    for (int64_t offset : {int64_t{0}, int64_t{4}}) {
      const int64_t k = method == 3 ? 1 : K;
      const int64_t local = offset == 0 ? E : 4;
      SCOPED_TRACE("method " + std::to_string(method) + " offset " + std::to_string(offset));
      Tensor logits = rand_tensor({T, E}, DType::kFloat32, 50 + method, -3.0, 3.0);
      Tensor bias = rand_tensor({E}, DType::kFloat32, 60 + method, -0.3, 0.3);
      Tensor x = rand_tensor({T, H}, DType::kBFloat16, 70 + method, -1.0, 1.0);
      Tensor w1 = rand_tensor({local, 2 * I, H}, DType::kBFloat16, 80 + method, -0.3, 0.3);
      Tensor w2 = rand_tensor({local, H, I}, DType::kBFloat16, 90 + method, -0.3, 0.3);
      Tensor replay_out = Tensor::zeros({T, k}, DType::kInt16);
      const Tensor out =
          trtllm_bf16_moe(logits, bias, x, w1, w2, E, k, G, TG, I, offset, local, scale, method,
                          false, WeightLayout::MajorK, true, true, 8192, 3, true, replay_out);
      // Expected: the routing formula, then the expert FFNs in fp64 with the trtllm rounding
      // points (activation and GEMM2 output in bf16; GEMM1 unrounded).
      const auto lv = logits.to_double_vector(), bv = bias.to_double_vector(),
                 xv = x.to_double_vector(), w1v = w1.to_double_vector(),
                 w2v = w2.to_double_vector(), rv = replay_out.to_double_vector();
      std::vector<double> expect(static_cast<size_t>(T * H), 0.0);
      for (int64_t t = 0; t < T; ++t) {
        const std::vector<double> row(lv.begin() + t * E, lv.begin() + (t + 1) * E);
        const Routed r = routing_formula(method, row, bv, k, G, TG, scale);
        for (int64_t j = 0; j < k; ++j) {
          const int64_t e = r.ids[static_cast<size_t>(j)];
          EXPECT_EQ(rv[static_cast<size_t>(t * k + j)], e) << "token " << t;
          if (e < offset || e >= offset + local) continue;
          const int64_t le = e - offset;
          std::vector<double> h(static_cast<size_t>(I));
          for (int64_t i = 0; i < I; ++i) {
            double up = 0.0, gate = 0.0;
            for (int64_t c = 0; c < H; ++c) {
              const double xc = xv[static_cast<size_t>(t * H + c)];
              up += xc * w1v[static_cast<size_t>((le * 2 * I + i) * H + c)];
              gate += xc * w1v[static_cast<size_t>((le * 2 * I + I + i) * H + c)];
            }
            h[static_cast<size_t>(i)] = round_as(DType::kBFloat16, silu(gate) * up);
          }
          for (int64_t c = 0; c < H; ++c) {
            double y = 0.0;
            for (int64_t i = 0; i < I; ++i) {
              y += h[static_cast<size_t>(i)] * w2v[static_cast<size_t>((le * H + c) * I + i)];
            }
            expect[static_cast<size_t>(t * H + c)] +=
                r.weights[static_cast<size_t>(j)] * round_as(DType::kBFloat16, y);
          }
        }
      }
      EXPECT_TRUE(all_close(out, expect, default_tolerance(DType::kBFloat16)));
    }
  }
}

// The combine uses the routing weights rounded to bf16, as upstream's routing kernels write them
// (Routing::Runner: mDtypeOutput = Bfloat16). Hand-checked: TopK routing makes the weight the
// raw logit w = 1 + 2^-8 - 2^-20, which bf16 rounds to 1.0; with Identity activation and
// one-hot weights the expert output is y = 255/128 exactly, so out = bf16(1.0 * y) = 1.9921875,
// where an fp32 weight would give bf16(1.99997) = 2.0.
TEST(TrtllmBf16Moe, RoutingWeightsRoundedToBf16) {
  const int64_t T = 1, E = 2, H = 32, I = 16;
  const double w = 1.0 + std::ldexp(1.0, -8) - std::ldexp(1.0, -20);
  Tensor logits = Tensor::from_vector({w, -10.0}, {T, E}, DType::kFloat32);
  std::vector<double> xv(static_cast<size_t>(T * H), 0.0), w1v(static_cast<size_t>(E * I * H), 0.0),
      w2v(static_cast<size_t>(E * H * I), 0.0);
  xv[0] = 1.0;
  w1v[0] = 1.0;            // expert 0, row 0, column 0: h[0] = x[0]
  w2v[0] = 255.0 / 128.0;  // expert 0, output 0 reads h[0]
  const Tensor out = trtllm_bf16_moe(
      logits, std::nullopt, Tensor::from_vector(xv, {T, H}, DType::kBFloat16),
      Tensor::from_vector(w1v, {E, I, H}, DType::kBFloat16),
      Tensor::from_vector(w2v, {E, H, I}, DType::kBFloat16), E, 1, std::nullopt, std::nullopt, I, 0,
      E, std::nullopt, /*TopK*/ 5, false, WeightLayout::MajorK, true, true, 8192,
      /*Identity*/ 9);
  const std::vector<double> o = out.to_double_vector();
  EXPECT_EQ(o[0], 255.0 / 128.0);
  for (int64_t c = 1; c < H; ++c) EXPECT_EQ(o[static_cast<size_t>(c)], 0.0) << c;
}

// Upstream 0.7.4's workspace_buffer: scratch, so the result is the same with one; refused with
// do_finalize=False and when it is not a contiguous 1-D byte tensor.
TEST(TrtllmBf16Moe, WorkspaceBufferIsScratch) {
  const int64_t T = 6, E = 8, H = 32, I = 16, K = 2;
  Tensor logits = rand_tensor({T, E}, DType::kFloat32, 15, -3.0, 3.0);
  Tensor x = rand_tensor({T, H}, DType::kBFloat16, 16);
  Tensor w1 = rand_tensor({4, 2 * I, H}, DType::kBFloat16, 17, -0.3, 0.3);
  Tensor w2 = rand_tensor({4, H, I}, DType::kBFloat16, 18, -0.3, 0.3);
  auto run = [&](std::optional<Tensor> ws, bool finalize) {
    return trtllm_bf16_moe(logits, std::nullopt, x, w1, w2, E, K, std::nullopt, std::nullopt, I, 4,
                           4, std::nullopt, 4, false, WeightLayout::MajorK, finalize, true, 8192, 3,
                           true, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                           std::nullopt, ws);
  };
  const Tensor ref = run(std::nullopt, true);
  const Tensor ws = Tensor::zeros({1 << 16}, DType::kUInt8);
  EXPECT_EQ(static_cast<Tensor>(run(ws, true)).to_double_vector(), ref.to_double_vector());
  EXPECT_FI_ERROR(run(ws, false), "trtllm_bf16_moe", "workspace_buffer");
  EXPECT_FI_ERROR(run(Tensor::zeros({16, 16}, DType::kUInt8), true), "trtllm_bf16_moe",
                  "workspace_buffer");
  EXPECT_FI_ERROR(run(Tensor::zeros({256}, DType::kFloat32), true), "trtllm_bf16_moe",
                  "workspace_buffer");
}

// Precomputed routing: the (ids, weights) pair form gives trtllm_bf16_moe's result for the
// routing that op computed; the packed form equals the pair form with bf16 weights.
TEST(TrtllmBf16RoutedMoe, MatchesRoutingFromLogits) {
  const int64_t T = 12, E = 8, H = 32, I = 16, K = 2;
  Tensor logits = rand_tensor({T, E}, DType::kFloat32, 5, -3.0, 3.0);
  Tensor x = rand_tensor({T, H}, DType::kBFloat16, 6);
  Tensor w1 = rand_tensor({4, 2 * I, H}, DType::kBFloat16, 7, -0.3, 0.3);
  Tensor w2 = rand_tensor({4, H, I}, DType::kBFloat16, 8, -0.3, 0.3);
  const Tensor ref =
      trtllm_bf16_moe(logits, std::nullopt, x, w1, w2, E, K, std::nullopt, std::nullopt, I, 4, 4,
                      std::nullopt, 4, false, WeightLayout::MajorK);
  const auto lv = logits.to_double_vector();
  std::vector<double> ids, wts;
  std::vector<double> packed;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<double> row(lv.begin() + t * E, lv.begin() + (t + 1) * E);
    const Routed r = routing_formula(4, row, {}, K, 1, 1, 1.0);
    for (int64_t k = 0; k < K; ++k) {
      ids.push_back(static_cast<double>(r.ids[static_cast<size_t>(k)]));
      wts.push_back(r.weights[static_cast<size_t>(k)]);
      const uint32_t bits =
          float_to_bfloat16_bits(static_cast<float>(r.weights[static_cast<size_t>(k)]));
      packed.push_back(static_cast<double>(static_cast<int32_t>(
          (static_cast<uint32_t>(r.ids[static_cast<size_t>(k)]) << 16) | bits)));
    }
  }
  Tensor id_t = Tensor::from_vector(ids, {T, K}, DType::kInt32);
  auto routed = [&](const MoeTopkIds& topk) {
    return trtllm_bf16_routed_moe(topk, x, w1, w2, E, K, std::nullopt, std::nullopt, I, 4, 4,
                                  std::nullopt, 4, false, WeightLayout::MajorK);
  };
  EXPECT_TRUE(all_close(routed(MoeTopkIds(id_t, Tensor::from_vector(wts, {T, K}, DType::kFloat32))),
                        ref, default_tolerance(DType::kBFloat16)));
  const Tensor from_packed = routed(MoeTopkIds(Tensor::from_vector(packed, {T, K}, DType::kInt32)));
  const Tensor from_pair =
      routed(MoeTopkIds(id_t, Tensor::from_vector(wts, {T, K}, DType::kBFloat16)));
  EXPECT_TRUE(all_close(from_packed, from_pair, {0, 0}));
  // fp32 weights in the pair form are combined as given (upstream's launchers take their dtype),
  // not rounded to bf16 as the routing kernels' weights are: some output rounds differently.
  const Tensor from_fp32 =
      routed(MoeTopkIds(id_t, Tensor::from_vector(wts, {T, K}, DType::kFloat32)));
  EXPECT_NE(testing::bytes_of(from_fp32), testing::bytes_of(from_pair));
  EXPECT_TRUE(all_close(from_fp32, from_pair, default_tolerance(DType::kBFloat16)));
  const char* op = "trtllm_bf16_routed_moe";
  EXPECT_FI_ERROR(
      (void)trtllm_bf16_routed_moe(MoeTopkIds(id_t), x, w1, w2, E, K, std::nullopt, std::nullopt, I,
                                   4, 4, std::nullopt, 4, false, WeightLayout::MajorK, true, true,
                                   Tensor::zeros({T, I}, DType::kBFloat16)),
      op, "gemm1_lora_delta");
  EXPECT_FI_ERROR((void)routed(MoeTopkIds(id_t.slice(0, 0, 3))), op, "topk_ids");
  EXPECT_FI_ERROR((void)routed(MoeTopkIds(id_t.to(DType::kInt64))), op, "topk_ids");
  EXPECT_FI_ERROR((void)routed(MoeTopkIds(id_t, Tensor::zeros({T, K}, DType::kFloat16))), op,
                  "topk_ids");
  EXPECT_FI_ERROR((void)trtllm_bf16_routed_moe(MoeTopkIds(id_t), x, w1, w2, E, K, std::nullopt,
                                               std::nullopt, I, 4, 4),
                  op, "gemm1_weights");  // the defaults ask for 4-D BlockMajorK weights
}

TEST(TrtllmBf16Moe, BadInput) {
  const char* op = "trtllm_bf16_moe";
  const int64_t T = 4, E = 8, H = 16, I = 8;
  Tensor logits = rand_tensor({T, E}, DType::kFloat32, 1);
  Tensor x = rand_tensor({T, H}, DType::kBFloat16, 2);
  Tensor w1 = rand_tensor({E, 2 * I, H}, DType::kBFloat16, 3);
  Tensor w2 = rand_tensor({E, H, I}, DType::kBFloat16, 4);
  // Upstream's defaults ask for shuffled BlockMajorK weights ([E, K / bk, Mn, bk]): 3-D
  // weights are refused by name (test_moe_quant.cpp runs the shuffled layouts).
  EXPECT_FI_ERROR(
      trtllm_bf16_moe(logits, std::nullopt, x, w1, w2, E, 2, std::nullopt, std::nullopt, I, 0, E),
      op, "gemm1_weights");
  auto call = [&](const Tensor& l, const Tensor& h, const Tensor& a, const Tensor& b, int64_t k,
                  int64_t method, WeightLayout layout = WeightLayout::MajorK, bool fin = true,
                  int64_t offset = 0, int64_t local = 8) {
    (void)trtllm_bf16_moe(l, std::nullopt, h, a, b, E, k, std::nullopt, std::nullopt, I, offset,
                          local, std::nullopt, method, false, layout, fin);
  };
  EXPECT_FI_ERROR(call(logits, x, w1, w2, 2, 0, WeightLayout::BlockMajorK), op, "gemm1_weights");
  EXPECT_FI_ERROR(call(logits, x, w1, w2, 2, 0, WeightLayout::MajorMn), op, "weight_layout");
  // do_finalize=False runs (test_moe_unfinalized.cpp) and checks the other arguments the same.
  EXPECT_FI_ERROR(call(logits, x, w1, w2, 2, 0, WeightLayout::MajorMn, false), op, "weight_layout");
  EXPECT_FI_ERROR(call(logits.to(DType::kFloat16), x, w1, w2, 2, 0), op, "routing_logits");
  EXPECT_FI_ERROR(call(logits.slice(1, 0, 4), x, w1, w2, 2, 0), op, "routing_logits");
  EXPECT_FI_ERROR(call(logits, x, w1, w2, 9, 0), op, "top_k");
  EXPECT_FI_ERROR(call(logits, x, w1, w2, 2, 3), op, "top_k");  // Llama4 is top-1
  EXPECT_FI_ERROR(call(logits, x, w1, w2, 2, 10), op, "routing_method_type");
  EXPECT_FI_ERROR(call(logits, x.to(DType::kFloat16), w1, w2, 2, 0), op, "hidden_states");
  EXPECT_FI_ERROR(call(logits, x.slice(0, 0, 3), w1, w2, 2, 0), op,
                  "routing_logits");  // token counts differ
  EXPECT_FI_ERROR(call(logits, x, w1.slice(1, 0, I), w2, 2, 0), op, "gemm1_weights");
  EXPECT_FI_ERROR(call(logits, x, w1, w2.slice(2, 0, 4), 2, 0), op, "gemm2_weights");
  EXPECT_FI_ERROR(call(logits, x, w1, w2, 2, 0, WeightLayout::MajorK, true, 4, E), op,
                  "local_num_experts");
  EXPECT_FI_ERROR((void)trtllm_bf16_moe(logits, Tensor::zeros({E + 1}, DType::kFloat32), x, w1, w2,
                                        E, 2, std::nullopt, std::nullopt, I, 0, E, std::nullopt, 0,
                                        false, WeightLayout::MajorK),
                  op, "routing_bias");
  EXPECT_FI_ERROR((void)trtllm_bf16_moe(logits, std::nullopt, x, w1, w2, E, 2, 3, 1, I, 0, E,
                                        std::nullopt, 2, false, WeightLayout::MajorK),
                  op, "n_group");
  EXPECT_FI_ERROR(
      (void)trtllm_bf16_moe(logits, std::nullopt, x, w1, w2, E, 2, std::nullopt, std::nullopt, I, 0,
                            E, std::nullopt, 0, false, WeightLayout::MajorK, true, true, 8192, 42),
      op, "activation_type");
}

// ---- declarations, record and replay --------------------------------------------------------

TEST(MoeDecls, SignaturesMatchUpstream) {
  auto decl = [](const char* name) { return OpRegistry::global().find(name); };
  ASSERT_NE(decl("cutlass_fused_moe"), nullptr);
  EXPECT_EQ(decl("cutlass_fused_moe")->module, "flashinfer.fused_moe.core");
  EXPECT_EQ(decl("fused_topk_deepseek")->module, "flashinfer.fused_moe.fused_routing_dsv3");
  EXPECT_EQ(decl("fused_topk_deepseek")->signature(),
            "(scores, bias, n_group, topk_group, topk, routed_scaling_factor, topk_values, "
            "topk_indices, launch_with_pdl=True, routing_replay_out=None, *, backend='default')");
  EXPECT_EQ(decl("is_gated_activation")->module, "flashinfer.tllm_enums");
  EXPECT_EQ(decl("is_gated_activation")->signature(), "(activation_type)");
  EXPECT_EQ(decl("hash_topk")->module, "flashinfer.fused_moe.hash_topk");
  EXPECT_EQ(decl("hash_topk")->signature(),
            "(router_logits, input_ids, tid2eid, num_fused_shared_experts=0, "
            "routed_scaling_factor=1.0, launch_with_pdl=True)");
}

TEST(MoeDecls, RecordAndReplay) {
  MoeCase c;
  c.dt = c.out_dt = DType::kBFloat16;
  const MoeInputs in = make_inputs(c);
  Tensor s = rand_tensor({4, 16}, DType::kBFloat16, 3);
  Tensor b = rand_tensor({16}, DType::kBFloat16, 4);
  Tensor v = Tensor::zeros({4, 4}, DType::kBFloat16);
  Tensor i = Tensor::zeros({4, 4}, DType::kInt32);
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    (void)run_moe(c, in);
    fused_topk_deepseek(s, b, 4, 2, 4, 2.5, v, i);
    (void)is_gated_activation(ActivationType::Geglu);
    (void)hash_topk(s.to(DType::kFloat32), Tensor::from_vector({1, 0, 1, 1}, {4}, DType::kInt64),
                    Tensor::from_vector({0, 5, 15, 3}, {2, 2}, DType::kInt32), 1, 2.0);
    (void)trtllm_bf16_moe(
        s.to(DType::kFloat32), b.to(DType::kFloat32), rand_tensor({4, 8}, DType::kBFloat16, 5),
        rand_tensor({16, 8, 8}, DType::kBFloat16, 6), rand_tensor({16, 8, 4}, DType::kBFloat16, 7),
        16, 2, 4, 2, 4, 0, 16, 2.5, 2, false, WeightLayout::MajorK);
    (void)trtllm_bf16_routed_moe(
        MoeTopkIds(Tensor::from_vector({0, 3, 2, 1}, {2, 2}, DType::kInt32),
                   Tensor::from_vector({0.5, 0.5, 0.25, 0.75}, {2, 2}, DType::kFloat32)),
        rand_tensor({2, 8}, DType::kBFloat16, 8), rand_tensor({4, 8, 8}, DType::kBFloat16, 9),
        rand_tensor({4, 8, 4}, DType::kBFloat16, 10), 4, 2, std::nullopt, std::nullopt, 4, 0, 4,
        std::nullopt, 0, false, WeightLayout::MajorK);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 6u);
  for (const auto& call : calls) {
    SCOPED_TRACE(call.name);
    ASSERT_TRUE(call.error.empty()) << call.error;
    // The gate hands over every parameter's value in declaration order (keyword-only ones
    // included), so the recorded values bind as they are.
    const OpDecl* d = OpRegistry::global().find(call.name);
    ASSERT_NE(d, nullptr);
    std::vector<Value> args;
    for (const auto& a : call.inputs) args.push_back(snapshot(a));
    CallArgs bound(*d, std::move(args));
    EXPECT_TRUE(same_values(d->invoke(bound), call.result));
    ASSERT_EQ(bound.values().size(), call.after.size());
    for (std::size_t a = 0; a < call.after.size(); ++a) {
      EXPECT_TRUE(same_values(bound.values()[a], call.after[a])) << "argument " << a;
    }
  }
  EXPECT_EQ(calls[2].result, Value(true));
}

// Through a dump directory, as `flashinfer replay` does: the scratch outputs result__1..3 are
// recorded but not compared, and the result says so; a tampered result__0 is a mismatch.
TEST(MoeDecls, DumpReplaySkipsUnwrittenOutputs) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_moe_rec_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg);
  MoeCase c;
  const MoeInputs in = make_inputs(c);
  (void)run_moe(c, in);
  recorder::stop();
  std::vector<fs::path> calls;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory()) calls.push_back(e.path());
  }
  ASSERT_EQ(calls.size(), 1u);
  const replay::Result r = replay::replay_from_dump(calls[0].string());
  EXPECT_EQ(r.status, replay::Status::kPassed) << r.error;
  ASSERT_EQ(r.comparisons.size(), 1u);
  EXPECT_EQ(r.comparisons[0].key, "result__0");
  EXPECT_EQ(r.skipped_outputs, (std::vector<std::string>{"result__1", "result__2", "result__3"}));
  EXPECT_NE(r.note.find("not compared: result__1, result__2, result__3"), std::string::npos)
      << r.note;
  EXPECT_NE(r.note.find("without writing"), std::string::npos) << r.note;
  fs::remove_all(dir);
}

// ---- None where upstream takes None (issue 50) -------------------------------------------------

// Upstream's bf16 / fp16 call (tests/moe/test_trtllm_cutlass_fused_moe.py) passes
// quant_scales=None: the unquantized path, as the empty list. Direct calls, and the recorded None
// bound through the declaration as replay binds an upstream record.
TEST(CutlassFusedMoe, QuantScalesNoneIsTheUnquantizedPath) {
  MoeCase c;
  c.dt = c.out_dt = DType::kBFloat16;
  const MoeInputs in = make_inputs(c);
  auto call = [&](std::optional<std::vector<Tensor>> qs) {
    return cutlass_fused_moe(in.x, in.ids, in.scales, in.w1, in.w2, c.out_dt, std::move(qs))[0];
  };
  const Tensor none = call(std::nullopt);
  const Tensor empty = call(std::vector<Tensor>{});
  EXPECT_TRUE(all_close(none, moe_formula(c, in), default_tolerance(DType::kBFloat16)));
  EXPECT_EQ(none.to_double_vector(), empty.to_double_vector());

  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    (void)call(std::nullopt);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 1u);
  const OpDecl* d = OpRegistry::global().find("cutlass_fused_moe");
  ASSERT_NE(d, nullptr);
  const int qi = d->param_index("quant_scales");
  ASSERT_GE(qi, 0);
  EXPECT_TRUE(d->params[static_cast<std::size_t>(qi)].optional);
  EXPECT_TRUE(d->params[static_cast<std::size_t>(qi)].required());       // no default, as upstream
  EXPECT_TRUE(calls[0].inputs[static_cast<std::size_t>(qi)].is_none());  // recorded as None
  for (const Value& qs : {Value(), Value::list({})}) {
    std::vector<Value> args;
    for (const auto& a : calls[0].inputs) args.push_back(snapshot(a));
    args[static_cast<std::size_t>(qi)] = qs;
    CallArgs bound(*d, std::move(args));
    const Value r = d->invoke(bound);
    ASSERT_TRUE(r.is_sequence());
    EXPECT_EQ(r.items()[0].as_tensor().to_double_vector(), none.to_double_vector());
  }
}

// Python signature text split at its top-level commas: "name" or "name=default" each.
std::vector<std::string> split_params(const std::string& sig) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  char quote = 0;
  for (std::size_t i = 1; i + 1 < sig.size(); ++i) {  // inside the outer parentheses
    const char ch = sig[i];
    if (quote) {
      if (ch == quote) quote = 0;
    } else if (ch == '\'' || ch == '"') {
      quote = ch;
    } else if (ch == '(' || ch == '[' || ch == '{') {
      ++depth;
    } else if (ch == ')' || ch == ']' || ch == '}') {
      --depth;
    } else if (ch == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
      continue;
    }
    if (cur.empty() && ch == ' ') continue;
    cur += ch;
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

// Every MoE entry point (upstream's flashinfer.fused_moe modules, the contract's TSV) accepts
// None wherever upstream's default is None, and where upstream's annotation is Optional without
// a default (a required argument that may be None).
TEST(MoeDecls, NoneWhereUpstreamTakesNone) {
  std::ifstream tsv(FLASHINFER_TEST_SOURCE_DIR + "/tests/api/data/upstream-api-signatures.tsv");
  ASSERT_TRUE(tsv.good());
  // Upstream's Optional[...] annotations of parameters with no default (flashinfer/fused_moe/
  // core.py): quant_scales=None is its bf16 test's call; the others are annotated Optional.
  const std::map<std::string, std::set<std::string>> optional_without_default = {
      {"cutlass_fused_moe", {"quant_scales"}},
      {"trtllm_fp8_per_tensor_scale_moe",
       {"routing_bias", "n_group", "topk_group", "routed_scaling_factor"}},
      {"trtllm_fp4_block_scale_moe",
       {"routing_bias", "output1_scale_scalar", "output1_scale_gate_scalar", "output2_scale_scalar",
        "n_group", "topk_group", "routed_scaling_factor"}},
  };
  std::string line;
  int ops = 0, checked = 0;
  std::set<std::string> seen;
  while (std::getline(tsv, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string x; std::getline(ss, x, '\t');) f.push_back(x);
    if (f.size() < 3 || !f[0].starts_with("flashinfer.fused_moe")) continue;
    const OpDecl* d = OpRegistry::global().find(f[1]);
    if (d == nullptr) continue;  // not provided here (the contract test lists those)
    ++ops;
    seen.insert(f[1]);
    const auto extra = optional_without_default.find(f[1]);
    for (const std::string& p : split_params(f[2])) {
      const auto eq = p.find('=');
      const std::string name = p.substr(0, eq);
      const bool none_default = eq != std::string::npos && p.substr(eq + 1) == "None";
      const bool annotated = extra != optional_without_default.end() && extra->second.count(name);
      if (!none_default && !annotated) continue;
      const int i = d->param_index(name);
      if (i < 0) continue;  // taken through **kwargs upstream and not declared: the contract test
      ++checked;
      EXPECT_TRUE(d->params[static_cast<std::size_t>(i)].optional) << f[1] << " " << name;
    }
  }
  for (const auto& [op, params] : optional_without_default) {
    EXPECT_TRUE(seen.count(op)) << op;
  }
  EXPECT_GE(ops, 15);
  EXPECT_GE(checked, 60);
}

// An upstream recording of the bf16 call, as its test makes it (positional arguments, then
// quant_scales=None and output= by keyword), written in upstream's layout with the library's
// torch-format writer: replays and passes; the expected output is the fp64 formula in bf16.
TEST(MoeDecls, UpstreamFormatDumpWithQuantScalesNoneReplays) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("fi_moe_none_" + std::to_string(::getpid()));
  fs::remove_all(root);
  MoeCase c;
  c.dt = c.out_dt = DType::kBFloat16;
  const MoeInputs in = make_inputs(c);
  const Tensor expected =
      Tensor::from_vector(moe_formula(c, in), {c.T, c.H}, DType::kFloat32).to(DType::kBFloat16);
  UpstreamCall call;
  call.function_name = "cutlass_fused_moe";
  call.module = "flashinfer.fused_moe.core";
  call.inputs = {
      {"arg_0", in.x},      {"arg_1", in.ids},
      {"arg_2", in.scales}, {"arg_3", in.w1},
      {"arg_4", in.w2},     {"kwarg_output", Tensor::zeros({c.T, c.H}, DType::kBFloat16)}};
  call.input_metadata = {{"arg_5", torch_dtype_meta(DType::kBFloat16)},
                         {"kwarg_quant_scales", nullptr}};
  // Upstream returns [output] plus scratch it leaves unwritten (garbage in a real recording).
  call.outputs = {{"result__0", expected},
                  {"result__1", Tensor::full({1}, 7.0, DType::kInt32)},
                  {"result__2", Tensor::full({c.E, c.T}, 3.0, DType::kFloat32)},
                  {"result__3", Tensor::full({c.E}, 9.0, DType::kInt32)}};
  const fs::path dir = write_upstream_call(root, 1, call);
  const replay::Result r = replay::replay_from_dump(dir.string());
  EXPECT_EQ(r.status, replay::Status::kPassed) << r.error << r.note;
  ASSERT_EQ(r.comparisons.size(), 1u);
  EXPECT_EQ(r.comparisons[0].key, "result__0");
  // A wrong expected value is a mismatch (the comparison is real).
  std::vector<double> shifted = moe_formula(c, in);
  for (double& v : shifted) v += 0.5;
  call.outputs[0].second =
      Tensor::from_vector(shifted, {c.T, c.H}, DType::kFloat32).to(DType::kBFloat16);
  const fs::path bad = write_upstream_call(root, 2, call);
  EXPECT_EQ(replay::replay_from_dump(bad.string()).status, replay::Status::kMismatch);
  fs::remove_all(root);
}

// ---- CUDA vs the CPU reference --------------------------------------------------------------

TEST(MoeCuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (DType dt : kDTypes) {
    MoeCase c;
    c.T = 37;
    c.dt = c.out_dt = dt;
    c.ep_size = 2;
    c.ep_rank = 1;
    c.biases = true;
    const MoeInputs in = make_inputs(c);
    const Tensor ref = run_moe(c, in)[0];
    MoeInputs g = in;
    const Device d = Device::cuda(0);
    g.x = in.x.to(d);
    g.ids = in.ids.to(d);
    g.scales = in.scales.to(d);
    g.w1 = in.w1.to(d);
    g.w2 = in.w2.to(d);
    g.b1 = in.b1->to(d);
    g.b2 = in.b2->to(d);
    EXPECT_TRUE(all_close(run_moe(c, g)[0].to(Device::cpu()), ref, default_tolerance(dt)))
        << dtype_label(dt);
  }
}

#if FLASHINFER_TEST_HAVE_CUDART
// ---- the CUDA grouped route (tensor-core grouped GEMM) against the GEMV route and the CPU
// --------

namespace moe_cuda = kernels::cuda;

// Integer values in [lo, hi].
Tensor int_tensor(Shape shape, DType dt, uint64_t seed, int lo, int hi) {
  std::mt19937_64 rng(seed);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) {
    x = lo + static_cast<int>(rng() % static_cast<uint64_t>(hi - lo + 1));
  }
  return Tensor::from_vector(v, shape, dt);
}

MoeInputs to_cuda(const MoeInputs& in) {
  const Device d = Device::cuda(0);
  MoeInputs g = in;
  g.x = in.x.to(d);
  g.ids = in.ids.to(d);
  g.scales = in.scales.to(d);
  g.w1 = in.w1.to(d);
  g.w2 = in.w2.to(d);
  if (in.b1) g.b1 = in.b1->to(d);
  if (in.b2) g.b2 = in.b2->to(d);
  if (in.alpha) g.alpha = in.alpha->to(d);
  if (in.beta) g.beta = in.beta->to(d);
  if (in.limit) g.limit = in.limit->to(d);
  return g;
}

// enable_alltoall (SGLang's all-to-all path) on CUDA: the rows of tokens with no expert on this
// rank keep what the output held, as on the CPU; the routing is read by the kernel, so the call
// captures into a CUDA graph (it read the ids back before) and its replay restores the rows.
TEST(MoeCuda, AlltoallKeepsRowsWithNoLocalExpertAndCaptures) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kBFloat16, DType::kFloat32}) {
    MoeCase c;
    c.T = 37;
    c.H = 64;
    c.dt = c.out_dt = dt;
    c.ep_size = 2;
    c.ep_rank = 1;
    MoeInputs in = make_inputs(c);
    // Every third token routes to rank 0's experts only (0 and 1).
    std::vector<double> ids = in.ids.to(DType::kFloat64).to_double_vector();
    for (int64_t t = 0; t < c.T; t += 3) {
      for (int64_t k = 0; k < c.K; ++k) ids[static_cast<size_t>(t * c.K + k)] = (t + k) % 2;
    }
    in.ids = Tensor::from_vector(ids, {c.T, c.K}, DType::kInt32);
    const auto alltoall = [&](const MoeInputs& g, Tensor& out) {
      cutlass_fused_moe(g.x, g.ids, g.scales, g.w1, g.w2, c.out_dt, {}, g.b1, g.b2, std::nullopt,
                        g.alpha, g.beta, g.limit, c.tp_size, c.tp_rank, c.ep_size, c.ep_rank, 1, 0,
                        out, true);
    };
    Tensor cpu_out = Tensor::full({c.T, c.H}, 7.0, dt);
    alltoall(in, cpu_out);
    const MoeInputs g = to_cuda(in);
    Tensor out = Tensor::full({c.T, c.H}, 7.0, dt).to(Device::cuda(0));
    // The engine's warm-up (eager, on the stream it then captures on), then the capture.
    testing::ReplayableGraph graph;
    ASSERT_NO_FATAL_FAILURE(testing::warm_up_for_replay(graph, [&] { alltoall(g, out); }));
    EXPECT_TRUE(all_close(out.to(Device::cpu()), cpu_out, default_tolerance(dt)))
        << dtype_label(dt);
    ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, [&] { alltoall(g, out); }));
    out.copy_(Tensor::full({c.T, c.H}, 7.0, dt));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
    const auto got = out.to(Device::cpu()).to_double_vector();
    for (int64_t t = 0; t < c.T; t += 3) {
      for (int64_t j = 0; j < c.H; ++j) {
        EXPECT_EQ(got[static_cast<size_t>(t * c.H + j)], 7.0) << dtype_label(dt) << " " << t;
      }
    }
    EXPECT_TRUE(all_close(out.to(Device::cpu()), cpu_out, default_tolerance(dt)))
        << dtype_label(dt);
    cudaGraphExecDestroy(graph.exec);
    cudaGraphDestroy(graph.graph);
    cudaStreamDestroy(graph.stream);
  }
}

// Runs the case on CUDA with the route forced (0 auto, 1 GEMV, 2 grouped); `grouped` gets
// whether the grouped route ran.
Tensor run_cuda_route(const MoeCase& c, const MoeInputs& g, int force, bool* grouped) {
  moe_cuda::set_cutlass_moe_route(force);
  const uint64_t before = moe_cuda::cutlass_moe_cuda_stats().grouped_runs;
  Tensor out = run_moe(c, g)[0].to(Device::cpu());
  moe_cuda::set_cutlass_moe_route(0);
  *grouped = moe_cuda::cutlass_moe_cuda_stats().grouped_runs == before + 1;
  return out;
}

// Integer operands small enough that every fp32 sum is exact (|x|, |w| <= 1 over hidden 32: GEMM1
// |g| <= 34 with the bias; Relu2 <= 1156, GEMM2 |sum| <= 32 * 1156 < 2^24, inside fp16's range;
// power-of-two scales): only the summation order differs between the routes, so the grouped
// route, the GEMV route and the CPU reference agree bit for bit, with experts of other ranks
// (ep_rank 1 of 2) and both biases, for the ungated activations (the gated ones are checked
// within their rounding interval below).
TEST(MoeCudaGrouped, BitExactOnIntegerOperands) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (DType out_dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (ActivationType act :
           {ActivationType::Relu, ActivationType::Relu2, ActivationType::Identity}) {
        MoeCase c;
        c.T = 150;  // 300 pairs, 8 local experts: the auto route is grouped
        c.H = 32;
        c.I = 32;
        c.E = 8;
        c.K = 2;
        c.dt = dt;
        c.out_dt = out_dt;
        c.act = act;
        c.ep_size = 2;
        c.ep_rank = 1;
        c.biases = true;
        MoeInputs in = make_inputs(c);
        const int64_t N1 = gated(act) ? 2 * c.I : c.I;
        in.x = int_tensor({c.T, c.H}, dt, 11, -1, 1);
        in.w1 = int_tensor({c.E, N1, c.H}, dt, 12, -1, 1);
        in.w2 = int_tensor({c.E, c.H, c.I}, dt, 13, -1, 1);
        in.b1 = int_tensor({c.E, N1}, dt, 14, -2, 2);
        in.b2 = int_tensor({c.E, c.H}, dt, 15, -2, 2);
        std::vector<double> sc(static_cast<size_t>(c.T * c.K));
        for (size_t i = 0; i < sc.size(); ++i) sc[i] = std::ldexp(1.0, static_cast<int>(i % 4) - 2);
        in.scales = Tensor::from_vector(sc, {c.T, c.K}, DType::kFloat32);
        const Tensor ref = run_moe(c, in)[0];
        const MoeInputs g = to_cuda(in);
        bool grouped = false;
        const Tensor auto_out = run_cuda_route(c, g, 0, &grouped);
        EXPECT_TRUE(grouped) << dtype_label(dt) << " -> " << dtype_label(out_dt);
        const Tensor gemv = run_cuda_route(c, g, 1, &grouped);
        EXPECT_FALSE(grouped);
        const std::string what = std::string(dtype_label(dt)) + " -> " +
                                 std::string(dtype_label(out_dt)) + ", act " +
                                 std::to_string(static_cast<int>(act));
        EXPECT_TRUE(all_close(auto_out, ref, {0, 0})) << what;
        EXPECT_TRUE(all_close(gemv, ref, {0, 0})) << what;
      }
    }
  }
}

// Random operands, gated activations with biases and per-expert SwiGLU parameters: the grouped
// route, the GEMV route and the CPU reference each inside the rounding interval of every output
// element (moe_rounding_interval: the routes sum the GEMMs in other orders, so a GEMM output or
// an activation near a rounding boundary can be stored an ulp apart, and GEMM2 and the finalize
// carry that on; elsewhere all three store the same value). The cases and the CPU half are in
// MoeRoundingInterval below.
TEST(MoeCudaGrouped, RandomOperandsWithinAccumulationBound) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (ActivationType act : {ActivationType::Swiglu, ActivationType::Geglu}) {
      const MoeCase c = grouped_random_case(dt, act);
      const std::string what =
          std::string(dtype_label(dt)) + " " + std::string(activation_type_name(act));
      const MoeInputs in = grouped_random_inputs(c);
      const RoundingInterval iv = moe_rounding_interval(c, in);
      const Tensor ref = run_moe(c, in)[0];
      const MoeInputs g = to_cuda(in);
      bool grouped = false;
      const Tensor got = run_cuda_route(c, g, 0, &grouped);
      EXPECT_TRUE(grouped);
      const Tensor gemv = run_cuda_route(c, g, 1, &grouped);
      EXPECT_TRUE(within(got, iv)) << what << ", grouped route";
      EXPECT_TRUE(within(gemv, iv)) << what << ", GEMV route";
      EXPECT_TRUE(within(ref, iv)) << what << ", CPU reference";
    }
  }
}

// Decode: fewer than two pairs per local expert stays on the GEMV route; forced onto the grouped
// one (most experts empty), it still matches bit for bit on integer operands. fp32 input never
// takes it.
TEST(MoeCudaGrouped, DecodeRouteAndForcedGrouped) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  MoeCase c;
  c.T = 3;  // 6 pairs, 8 experts
  c.H = 32;
  c.I = 16;
  c.E = 8;
  c.dt = c.out_dt = DType::kBFloat16;
  c.act = ActivationType::Relu;
  MoeInputs in = make_inputs(c);
  in.x = int_tensor({c.T, c.H}, c.dt, 21, -1, 1);
  in.w1 = int_tensor({c.E, c.I, c.H}, c.dt, 22, -1, 1);
  in.w2 = int_tensor({c.E, c.H, c.I}, c.dt, 23, -1, 1);
  in.scales = Tensor::full({c.T, c.K}, 0.5, DType::kFloat32);
  const Tensor ref = run_moe(c, in)[0];
  const MoeInputs g = to_cuda(in);
  bool grouped = true;
  EXPECT_TRUE(all_close(run_cuda_route(c, g, 0, &grouped), ref, {0, 0}));
  EXPECT_FALSE(grouped);
  EXPECT_TRUE(all_close(run_cuda_route(c, g, 2, &grouped), ref, {0, 0}));
  EXPECT_TRUE(grouped);
  c.dt = c.out_dt = DType::kFloat32;
  const MoeInputs f = to_cuda(make_inputs(c));
  run_cuda_route(c, f, 2, &grouped);
  EXPECT_FALSE(grouped);
}

// Once the stream's scratch is large enough, neither route allocates: 100 calls of one shape.
TEST(MoeCudaGrouped, NoScratchAllocationOnceWarm) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  MoeCase c;
  c.T = 64;
  c.H = 64;
  c.I = 32;
  c.E = 4;
  c.dt = c.out_dt = DType::kBFloat16;
  const MoeInputs g = to_cuda(make_inputs(c));
  for (int force : {0, 1}) {
    moe_cuda::set_cutlass_moe_route(force);
    run_moe(c, g);
    const moe_cuda::CutlassMoeCudaStats s0 = moe_cuda::cutlass_moe_cuda_stats();
    for (int i = 0; i < 100; ++i) run_moe(c, g);
    const moe_cuda::CutlassMoeCudaStats s1 = moe_cuda::cutlass_moe_cuda_stats();
    moe_cuda::set_cutlass_moe_route(0);
    EXPECT_EQ(s1.scratch_allocs, s0.scratch_allocs) << "force " << force;
    EXPECT_EQ(force == 0 ? s1.grouped_runs - s0.grouped_runs : s1.gemv_runs - s0.gemv_runs, 100u);
  }
}

// ---- trtllm_bf16_moe's grouped route against its GEMV route and the CPU

// One trtllm_bf16_routed_moe / trtllm_bf16_moe shape: local experts [offset, offset + local) of
// E; act an ActivationType value; weights shuffled (rows of GEMM1 interleaved for a gated
// activation) or not, MajorK (the grouped route's) or BlockMajorK with 64-element blocks (the
// GEMV route's, even forced).
struct TrtllmGroupedCase {
  int64_t T = 40, H = 64, I = 32, E = 8, local = 4, offset = 2, K = 2, act = 1;
  bool shuffled = false;
  WeightLayout layout = WeightLayout::MajorK;
  bool auto_grouped = true;  // whether the automatic choice is the grouped route
};

struct TrtllmGroupedInputs {
  Tensor ids, wts, logits, x, w1, w2;
  std::optional<Tensor> alpha, beta, limit;
};

// Precomputed routing with K distinct experts per token; every fifth token (where E - local >= K)
// only on experts of other ranks. Weights powers of two (exact in bf16); x, w1, w2 integers in
// [-1, 1]; logits for the routing-from-logits op.
TrtllmGroupedInputs trtllm_grouped_int_inputs(const TrtllmGroupedCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> ids, wts;
  std::vector<int64_t> all(static_cast<size_t>(c.E)), other;
  std::iota(all.begin(), all.end(), int64_t{0});
  for (int64_t e = 0; e < c.E; ++e) {
    if (e < c.offset || e >= c.offset + c.local) other.push_back(e);
  }
  for (int64_t t = 0; t < c.T; ++t) {
    std::vector<int64_t>& from =
        t % 5 == 4 && static_cast<int64_t>(other.size()) >= c.K ? other : all;
    std::shuffle(from.begin(), from.end(), rng);
    for (int64_t k = 0; k < c.K; ++k) {
      ids.push_back(static_cast<double>(from[static_cast<size_t>(k)]));
      wts.push_back(std::ldexp(1.0, static_cast<int>((t + k) % 4) - 2));
    }
  }
  const int64_t N1 = gated(static_cast<ActivationType>(c.act)) ? 2 * c.I : c.I;
  TrtllmGroupedInputs in;
  in.ids = Tensor::from_vector(ids, {c.T, c.K}, DType::kInt32);
  in.wts = Tensor::from_vector(wts, {c.T, c.K}, DType::kBFloat16);
  in.logits = rand_tensor({c.T, c.E}, DType::kFloat32, seed + 1, -3.0, 3.0);
  in.x = int_tensor({c.T, c.H}, DType::kBFloat16, seed + 2, -1, 1);
  const bool block = c.layout == WeightLayout::BlockMajorK;
  in.w1 = int_tensor(block ? Shape({c.local, c.H / 64, N1, 64}) : Shape({c.local, N1, c.H}),
                     DType::kBFloat16, seed + 3, -1, 1);
  in.w2 = int_tensor(block ? Shape({c.local, c.I / 64, c.H, 64}) : Shape({c.local, c.H, c.I}),
                     DType::kBFloat16, seed + 4, -1, 1);
  return in;
}

std::optional<Tensor> opt_to(const std::optional<Tensor>& t, Device d) {
  if (!t) return std::nullopt;
  return t->to(d);
}

// The call on device d (the CPU or CUDA with the route forced: 0 auto, 1 GEMV, 2 grouped; on
// CUDA `grouped` gets whether the grouped route ran). from_logits: trtllm_bf16_moe with
// Renormalize routing; else trtllm_bf16_routed_moe with the (ids, weights) pair. Every output
// on the host.
std::vector<Tensor> run_trtllm_grouped(const TrtllmGroupedCase& c, const TrtllmGroupedInputs& in,
                                       Device d, int force, bool from_logits, bool finalize,
                                       bool* grouped, std::optional<Tensor> output = std::nullopt) {
  const bool cuda = d.is_cuda();
  if (cuda) moe_cuda::set_cutlass_moe_route(force);
  const uint64_t before = moe_cuda::cutlass_moe_cuda_stats().grouped_runs;
  const TrtllmMoeResult r =
      from_logits
          ? trtllm_bf16_moe(in.logits.to(d), std::nullopt, in.x.to(d), in.w1.to(d), in.w2.to(d),
                            c.E, c.K, std::nullopt, std::nullopt, c.I, c.offset, c.local,
                            std::nullopt, 1, c.shuffled, c.layout, finalize, false, 8192, c.act,
                            true, std::nullopt, opt_to(in.alpha, d), opt_to(in.beta, d),
                            opt_to(in.limit, d), output)
          : trtllm_bf16_routed_moe(MoeTopkIds(in.ids.to(d), in.wts.to(d)), in.x.to(d), in.w1.to(d),
                                   in.w2.to(d), c.E, c.K, std::nullopt, std::nullopt, c.I, c.offset,
                                   c.local, std::nullopt, 1, c.shuffled, c.layout, finalize, false,
                                   std::nullopt, 8192, c.act, std::nullopt, opt_to(in.alpha, d),
                                   opt_to(in.beta, d), opt_to(in.limit, d), output);
  if (cuda) {
    moe_cuda::set_cutlass_moe_route(0);
    *grouped = moe_cuda::cutlass_moe_cuda_stats().grouped_runs == before + 1;
  }
  std::vector<Tensor> out;
  for (const Tensor& t : r.tensors) out.push_back(t.to(Device::cpu()));
  return out;
}

// Integer operands whose fp32 sums are exact (|x|, |w| <= 1: GEMM1 |g| <= hidden, Relu2 <=
// hidden^2, GEMM2 |sum| <= inter * hidden^2 < 2^24; power-of-two routing weights): the routes
// differ only in the order of those sums, so the grouped route, the GEMV route and the CPU
// reference agree bit for bit, finalized and not, over expert counts, top-k, local expert
// offsets, tokens on no local expert, shuffled rows, and the automatic route choice (case 3 is
// below its threshold: 60 pairs of 64 experts, 8 local, need 128; case 4's BlockMajorK weights
// never take the grouped route).
TEST(TrtllmBf16MoeCudaGrouped, BitExactOnIntegerOperands) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  std::vector<TrtllmGroupedCase> cases(5);
  cases[1].T = 33;
  cases[1].H = 96;
  cases[1].I = 64;
  cases[1].E = cases[1].local = 16;
  cases[1].offset = 0;
  cases[1].K = 4;
  cases[1].act = 6;  // Relu2
  cases[1].shuffled = true;
  cases[2].T = 50;
  cases[2].H = 32;
  cases[2].E = 6;
  cases[2].local = 3;
  cases[2].offset = 3;
  cases[2].K = 1;
  cases[2].act = 9;  // Identity
  cases[2].shuffled = true;
  cases[3].T = 20;
  cases[3].H = 128;
  cases[3].I = 64;
  cases[3].E = 64;
  cases[3].local = 8;
  cases[3].offset = 16;
  cases[3].K = 3;
  cases[3].auto_grouped = false;
  cases[4].H = 128;
  cases[4].I = 64;
  cases[4].shuffled = true;
  cases[4].layout = WeightLayout::BlockMajorK;
  cases[4].auto_grouped = false;
  uint64_t seed = 40;
  for (const TrtllmGroupedCase& c : cases) {
    const TrtllmGroupedInputs in = trtllm_grouped_int_inputs(c, seed += 10);
    for (bool finalize : {true, false}) {
      const std::string what = "T " + std::to_string(c.T) + " E " + std::to_string(c.E) + " K " +
                               std::to_string(c.K) + " act " + std::to_string(c.act) +
                               (finalize ? "" : " unfinalized");
      bool grouped = false;
      const std::vector<Tensor> ref =
          run_trtllm_grouped(c, in, Device::cpu(), 0, false, finalize, &grouped);
      const std::vector<Tensor> grp = run_trtllm_grouped(c, in, d, 2, false, finalize, &grouped);
      EXPECT_EQ(grouped, c.layout == WeightLayout::MajorK) << what;
      const std::vector<Tensor> gemv = run_trtllm_grouped(c, in, d, 1, false, finalize, &grouped);
      EXPECT_FALSE(grouped) << what;
      const std::vector<Tensor> aut = run_trtllm_grouped(c, in, d, 0, false, finalize, &grouped);
      EXPECT_EQ(grouped, c.auto_grouped) << what;
      ASSERT_EQ(grp.size(), ref.size()) << what;
      ASSERT_EQ(gemv.size(), ref.size()) << what;
      ASSERT_EQ(aut.size(), ref.size()) << what;
      for (size_t i = 0; i < ref.size(); ++i) {
        EXPECT_TRUE(all_close(grp[i], ref[i], {0, 0})) << what << ", output " << i;
        EXPECT_TRUE(all_close(gemv[i], ref[i], {0, 0})) << what << ", output " << i;
        EXPECT_TRUE(all_close(aut[i], ref[i], {0, 0})) << what << ", output " << i;
      }
    }
  }
}

// Routing from logits on the device (the same routing kernel ahead of both routes): the grouped
// route matches the GEMV route bit for bit on integer operands, and the CPU within bf16's
// tolerance (the routing weights' expf may round apart).
TEST(TrtllmBf16MoeCudaGrouped, FromLogitsMatchesTheGemvRoute) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  TrtllmGroupedCase c;
  c.T = 64;
  c.act = 6;
  c.shuffled = true;
  const TrtllmGroupedInputs in = trtllm_grouped_int_inputs(c, 90);
  bool grouped = false;
  const Tensor ref = run_trtllm_grouped(c, in, Device::cpu(), 0, true, true, &grouped)[0];
  const Tensor grp = run_trtllm_grouped(c, in, d, 0, true, true, &grouped)[0];
  EXPECT_TRUE(grouped);
  const Tensor gemv = run_trtllm_grouped(c, in, d, 1, true, true, &grouped)[0];
  EXPECT_FALSE(grouped);
  EXPECT_TRUE(all_close(grp, gemv, {0, 0}));
  EXPECT_TRUE(all_close(grp, ref, default_tolerance(DType::kBFloat16)));
}

// Random operands, gated activations (Swiglu; SwigluBias with per-expert alpha / beta / clamp
// limit) with shuffled, interleaved GEMM1 rows: x and w1 on grids of 2^-6 and 2^-7 (every GEMM1
// partial sum exact in fp32, so both routes feed the activation the same fp32 values and store
// the same bf16 activation); only GEMM2's fp32 summation order differs, which moves a GEMM2
// output near a rounding boundary by a bf16 ulp. Both routes and the CPU agree within bf16's
// tolerance.
TEST(TrtllmBf16MoeCudaGrouped, RandomOperandsWithinBound) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  const Tolerance tol = default_tolerance(DType::kBFloat16);
  for (int64_t act : {int64_t{3}, int64_t{5}}) {
    TrtllmGroupedCase c;
    c.T = 100;
    c.H = 128;
    c.I = 64;
    c.E = 8;
    c.local = 6;
    c.offset = 1;
    c.K = 3;
    c.act = act;
    c.shuffled = true;
    TrtllmGroupedInputs in = trtllm_grouped_int_inputs(c, 200 + static_cast<uint64_t>(act));
    in.x = on_grid(rand_tensor({c.T, c.H}, DType::kBFloat16, 3, -1.0, 1.0), std::ldexp(1.0, -6));
    in.w1 =
        on_grid(rand_tensor(in.w1.shape(), DType::kBFloat16, 4, -0.3, 0.3), std::ldexp(1.0, -7));
    in.w2 = rand_tensor(in.w2.shape(), DType::kBFloat16, 5, -0.3, 0.3);
    in.wts = rand_tensor({c.T, c.K}, DType::kBFloat16, 6, 0.1, 1.0);
    if (act == 5) {
      in.alpha = rand_tensor({c.local}, DType::kFloat32, 7, 1.0, 2.0);
      in.beta = rand_tensor({c.local}, DType::kFloat32, 8, -0.5, 0.5);
      in.limit = rand_tensor({c.local}, DType::kFloat32, 9, 0.5, 2.0);
    }
    const std::string what = "act " + std::to_string(act);
    bool grouped = false;
    const Tensor ref = run_trtllm_grouped(c, in, Device::cpu(), 0, false, true, &grouped)[0];
    const Tensor grp = run_trtllm_grouped(c, in, d, 0, false, true, &grouped)[0];
    EXPECT_TRUE(grouped) << what;
    const Tensor gemv = run_trtllm_grouped(c, in, d, 1, false, true, &grouped)[0];
    EXPECT_TRUE(all_close(grp, gemv, tol)) << what;
    EXPECT_TRUE(all_close(grp, ref, tol)) << what;
    EXPECT_TRUE(all_close(gemv, ref, tol)) << what;
  }
}

// 100 warm calls of one shape allocate no scratch on either route (the output passed in).
TEST(TrtllmBf16MoeCudaGrouped, NoScratchAllocationOnceWarm) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  TrtllmGroupedCase c;
  c.T = 64;
  const TrtllmGroupedInputs h = trtllm_grouped_int_inputs(c, 400);
  TrtllmGroupedInputs in = h;
  in.ids = h.ids.to(d);
  in.wts = h.wts.to(d);
  in.x = h.x.to(d);
  in.w1 = h.w1.to(d);
  in.w2 = h.w2.to(d);
  Tensor out = Tensor::empty({c.T, c.H}, DType::kBFloat16, d);
  for (int force : {0, 1}) {
    moe_cuda::set_cutlass_moe_route(force);
    auto call = [&] {
      (void)trtllm_bf16_routed_moe(
          MoeTopkIds(in.ids, in.wts), in.x, in.w1, in.w2, c.E, c.K, std::nullopt, std::nullopt, c.I,
          c.offset, c.local, std::nullopt, 1, false, WeightLayout::MajorK, true, false,
          std::nullopt, 8192, c.act, std::nullopt, std::nullopt, std::nullopt, std::nullopt, out);
    };
    call();
    const moe_cuda::CutlassMoeCudaStats s0 = moe_cuda::cutlass_moe_cuda_stats();
    for (int i = 0; i < 100; ++i) call();
    const moe_cuda::CutlassMoeCudaStats s1 = moe_cuda::cutlass_moe_cuda_stats();
    moe_cuda::set_cutlass_moe_route(0);
    EXPECT_EQ(s1.scratch_allocs, s0.scratch_allocs) << "force " << force;
    EXPECT_EQ(force == 0 ? s1.grouped_runs - s0.grouped_runs : s1.gemv_runs - s0.gemv_runs, 100u);
  }
}
#endif

// n_group matters only to DeepSeekV3's grouped selection: the other methods ignore it, also
// when it exceeds num_experts or does not divide it (the CPU reference divided by E / n_group =
// 0 there, a crash, and read past its group flags; fixed in session 15).
TEST(TrtllmBf16Moe, GroupsIgnoredOutsideDeepSeekV3) {
  const int64_t T = 6, E = 8, H = 32, I = 16;
  Tensor logits = rand_tensor({T, E}, DType::kFloat32, 31, -3.0, 3.0);
  Tensor x = rand_tensor({T, H}, DType::kBFloat16, 32);
  Tensor w1 = rand_tensor({E, 2 * I, H}, DType::kBFloat16, 33, -0.3, 0.3);
  Tensor w2 = rand_tensor({E, H, I}, DType::kBFloat16, 34, -0.3, 0.3);
  for (int64_t method : {int64_t{0}, int64_t{1}, int64_t{6}}) {
    auto run = [&](std::optional<int64_t> g) {
      return Tensor(trtllm_bf16_moe(logits, std::nullopt, x, w1, w2, E, 2, g, 1, I, 0, E,
                                    std::nullopt, method, false, WeightLayout::MajorK));
    };
    const Tensor ref = run(std::nullopt);
    EXPECT_TRUE(all_close(run(16), ref, {0, 0})) << "method " << method;
    EXPECT_TRUE(all_close(run(3), ref, {0, 0})) << "method " << method;
  }
}

}  // namespace
}  // namespace flashinfer::testing
