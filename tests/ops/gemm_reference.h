// The fp64 GEMM reference and tolerance shared by test_gemm and test_gemm_small_m.
#pragma once

#include <cstdint>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "util/test_util.h"

namespace flashinfer::testing {

/// out[b, i, j] = scale * sum_k A[b, i, k] * B[b, k, j] in fp64 (+ bias[j]), from the stored
/// (already low-precision) values of A and B, read through their strides.
inline std::vector<double> ref_bmm(const Tensor& A, const Tensor& B, double scale,
                                   const std::vector<double>* bias = nullptr) {
  const bool batched = A.dim() == 3;
  const int64_t nb = batched ? A.size(0) : 1, m = A.size(-2), k = A.size(-1), n = B.size(-1);
  const auto a = A.to_double_vector();  // logical row-major order
  const auto b = B.to_double_vector();
  std::vector<double> out(static_cast<size_t>(nb * m * n));
  for (int64_t bi = 0; bi < nb; ++bi) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          s += a[(bi * m + i) * k + kk] * b[(bi * k + kk) * n + j];
        }
        out[(bi * m + i) * n + j] = scale * s + (bias ? (*bias)[j] : 0.0);
      }
    }
  }
  return out;
}

/// GEMM tolerance: the output rounding plus fp32 accumulation over k terms.
inline Tolerance gemm_tol(DType out, int64_t k) {
  Tolerance t = default_tolerance(out);
  t.atol += 1e-6 * static_cast<double>(k);
  return t;
}

}  // namespace flashinfer::testing
