// Upstream's trtllm-gen MoE weight preparation (tests/moe: FP4Moe, MxInt4BlockScaleMoe,
// FP8BlockScaleMoe; helpers reorder_rows_for_gated_act_gemm, shuffle_matrix_a,
// convert_to_block_layout), written out independently of the library so that the MoE tests can
// check the library's un-preparation against it, plus the small value helpers those tests share.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "flashinfer/float_formats.h"

namespace flashinfer::testing::moe_prep {

// shuffle_matrix_a's 32-row map (epilogue_tile_m 128): row r of a block lands at kMap32[r].
inline constexpr int64_t kMap32[32] = {0, 8,  16, 24, 1, 9,  17, 25, 2, 10, 18, 26, 3, 11, 19, 27,
                                       4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31};

// The plain row held by prepared row i: reorder_rows_for_gated_act_gemm (or identity), then
// the shuffle: prepared = plain[permute0[permute1]].
inline std::vector<int64_t> prepared_rows(int64_t m, bool interleave) {
  std::vector<int64_t> p0(static_cast<size_t>(m)), p1(static_cast<size_t>(m)),
      out(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    p0[static_cast<size_t>(i)] = !interleave ? i : (i % 2 == 0 ? i / 2 : m / 2 + i / 2);
  }
  for (int64_t old_row = 0; old_row < m; ++old_row) {
    p1[static_cast<size_t>(old_row / 32 * 32 + kMap32[old_row % 32])] = old_row;
  }
  for (int64_t i = 0; i < m; ++i) {
    out[static_cast<size_t>(i)] = p0[static_cast<size_t>(p1[static_cast<size_t>(i)])];
  }
  return out;
}

// E matrices [m, row_bytes] of bytes with rows permuted as prepared_rows says; block_bytes > 0:
// convert_to_block_layout on the bytes ([E, row_bytes / block_bytes, m, block_bytes]).
inline std::vector<uint8_t> prepare_rows(const std::vector<uint8_t>& plain, int64_t E, int64_t m,
                                         int64_t row_bytes, bool interleave,
                                         int64_t block_bytes = 0) {
  const auto rows = prepared_rows(m, interleave);
  std::vector<uint8_t> out(plain.size());
  const int64_t bk = block_bytes > 0 ? block_bytes : row_bytes;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t c = 0; c < row_bytes; ++c) {
        const int64_t from = (e * m + rows[static_cast<size_t>(i)]) * row_bytes + c;
        const int64_t to = ((e * (row_bytes / bk) + c / bk) * m + i) * bk + c % bk;
        out[static_cast<size_t>(to)] = plain[static_cast<size_t>(from)];
      }
    }
  }
  return out;
}

// Per-expert byte matrices [E, rows, cols_b] put into [E, prows, pcols_b]: source row r lands at
// row_to[r], its bytes first; every other byte comes from fill() (one element of `es` bytes at a
// time), so the padding holds values the call must not read.
inline std::vector<uint8_t> embed(const std::vector<uint8_t>& src, int64_t E, int64_t rows,
                                  int64_t cols_b, int64_t prows, int64_t pcols_b,
                                  const std::vector<int64_t>& row_to, int64_t es,
                                  const std::function<void(uint8_t*)>& fill) {
  std::vector<uint8_t> out(static_cast<size_t>(E * prows * pcols_b));
  for (size_t i = 0; i < out.size(); i += static_cast<size_t>(es)) fill(&out[i]);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(&out[static_cast<size_t>((e * prows + row_to[static_cast<size_t>(r)]) * pcols_b)],
                  &src[static_cast<size_t>((e * rows + r) * cols_b)], static_cast<size_t>(cols_b));
    }
  }
  return out;
}

inline std::vector<int64_t> identity_rows(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

// The gated GEMM1 rows of intermediate size I inside a padded Ip: up rows stay, gate rows move
// to the padded gate half.
inline std::vector<int64_t> gated_rows(int64_t I, int64_t Ip) {
  std::vector<int64_t> v = identity_rows(2 * I);
  for (int64_t i = I; i < 2 * I; ++i) v[static_cast<size_t>(i)] = Ip + (i - I);
  return v;
}

// The value of a ue8m0 scale code: 2^(c - 127).
inline double ue8m0(uint8_t c) { return std::ldexp(1.0, static_cast<int>(c) - 127); }
inline double bf16(double v) {
  return bfloat16_bits_to_float(float_to_bfloat16_bits(static_cast<float>(v)));
}
inline double silu(double v) { return v / (1.0 + std::exp(-v)); }
inline double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// The fp64 reference of a gated MLP's GEMM1 for token t and expert e: column j of both halves,
// {x[t] . w1[e][j], x[t] . w1[e][I + j]}, with x [T, H] and w1 [E, 2I, H] plain (unprepared).
inline std::pair<double, double> gemm1_halves(const std::vector<double>& x,
                                              const std::vector<double>& w1, int64_t t, int64_t e,
                                              int64_t j, int64_t H, int64_t I) {
  double first = 0.0, second = 0.0;
  for (int64_t d = 0; d < H; ++d) {
    const double xd = x[static_cast<size_t>(t * H + d)];
    first += xd * w1[static_cast<size_t>((e * 2 * I + j) * H + d)];
    second += xd * w1[static_cast<size_t>((e * 2 * I + I + j) * H + d)];
  }
  return {first, second};
}

// The fp64 reference of GEMM2 for expert e, output column col: h [I] . w2[e][col], w2 [E, H, I].
inline double gemm2_col(const std::vector<double>& h, const std::vector<double>& w2, int64_t e,
                        int64_t col, int64_t H, int64_t I) {
  double y = 0.0;
  for (int64_t j = 0; j < I; ++j) {
    y += h[static_cast<size_t>(j)] * w2[static_cast<size_t>((e * H + col) * I + j)];
  }
  return y;
}

}  // namespace flashinfer::testing::moe_prep
