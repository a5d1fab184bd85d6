// fp64 references for the norm and activation tests (test_norm, test_activation,
// test_norm_act_simd): rows x n matrices as flat vectors; and the activation ops as a table.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
#include <vector>

#include "flashinfer/flashinfer.h"

namespace flashinfer::testing {

/// `w` already includes the Gemma bias when one is wanted (see with_bias).
inline std::vector<double> ref_rmsnorm(const std::vector<double>& x, int64_t n,
                                       const std::vector<double>& w, double eps) {
  std::vector<double> y(x.size());
  for (std::size_t r = 0; r < x.size() / n; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[r * n + i] * x[r * n + i];
    const double rr = 1.0 / std::sqrt(ss / n + eps);
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = x[r * n + i] * rr * w[i];
  }
  return y;
}

inline std::vector<double> ref_layernorm(const std::vector<double>& x, int64_t n,
                                         const std::vector<double>& g, const std::vector<double>& b,
                                         double eps) {
  std::vector<double> y(x.size());
  for (std::size_t r = 0; r < x.size() / n; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mean += x[r * n + i];
    mean /= n;
    for (int64_t i = 0; i < n; ++i) var += (x[r * n + i] - mean) * (x[r * n + i] - mean);
    var /= n;
    const double rs = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = (x[r * n + i] - mean) * rs * g[i] + b[i];
  }
  return y;
}

/// The weight the Gemma norms apply: w + bias.
inline std::vector<double> with_bias(std::vector<double> w, double bias) {
  for (auto& v : w) v += bias;
  return w;
}

// gelu and gelu_tanh use the exact identities 1 + erf(z) = erfc(-z) and
// (1 + tanh u) / 2 = 1 / (1 + e^(-2u)): the textbook forms cancel even in fp64 for x < -8.
inline double silu_ref(double x) { return x / (1.0 + std::exp(-x)); }
inline double gelu_ref(double x) { return 0.5 * x * std::erfc(-x / std::numbers::sqrt2); }
inline double gelu_tanh_ref(double x) {
  const double u = std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x);
  return x / (1.0 + std::exp(-2.0 * u));
}

// out[r, i] = act(x[r, i]) * x[r, d + i] over the logical order of a [rows, 2d] input.
inline std::vector<double> ref_act(const std::vector<double>& v, int64_t w, double (*act)(double)) {
  const int64_t d = w / 2;
  std::vector<double> out;
  out.reserve(v.size() / 2);
  for (std::size_t r = 0; r < v.size() / w; ++r) {
    for (int64_t i = 0; i < d; ++i) out.push_back(act(v[r * w + i]) * v[r * w + d + i]);
  }
  return out;
}

/// The three `*_and_mul` ops with their fp64 activation.
using ActOp = Tensor (*)(const Tensor&, std::optional<Tensor>, std::optional<bool>);
struct ActCase {
  const char* name;
  ActOp op;
  double (*ref)(double);
};
inline Tensor call_silu(const Tensor& i, std::optional<Tensor> o, std::optional<bool> p) {
  return silu_and_mul(i, std::move(o), p);
}
inline Tensor call_gelu(const Tensor& i, std::optional<Tensor> o, std::optional<bool> p) {
  return gelu_and_mul(i, std::move(o), p);
}
inline Tensor call_gelu_tanh(const Tensor& i, std::optional<Tensor> o, std::optional<bool> p) {
  return gelu_tanh_and_mul(i, std::move(o), p);
}
inline const std::vector<ActCase> kActs = {{"silu_and_mul", call_silu, silu_ref},
                                           {"gelu_and_mul", call_gelu, gelu_ref},
                                           {"gelu_tanh_and_mul", call_gelu_tanh, gelu_tanh_ref}};

}  // namespace flashinfer::testing
