// ldmatrix.x4 and mma.sync.m16n8k16 emulated on the CPU, with the fragment layouts the PTX ISA
// gives them, for the tests of the tensor-core kernels' fragment addressing
// (tests/api/test_prefill_shape.cpp, test_mla_shape.cpp): shared memory holds small integers,
// exact in fp16, bf16 and fp64, so an emulated product equals the plain sum exactly.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "kernels/cuda/device/permuted_smem.cuh"

namespace flashinfer::testing::mma_emu {

// Shared memory as 16-bit slots holding small integers (exact in fp16, bf16 and double).
struct Smem {
  std::vector<double> slot = std::vector<double>(1 << 16, 0.0);
  double at(uint32_t byte_addr) const { return slot.at(byte_addr / 2); }
  // Element (row, col) of a permuted tile at `base` with rows of `units` 16-byte units.
  void put(uint32_t base, uint32_t row, uint32_t col, uint32_t units, double x) {
    slot.at((base + 16 * kernels::cuda::dev::permuted_offset(row, col / 8, units)) / 2 + col % 8) =
        x;
  }
};

using Pair = std::array<double, 2>;
using Frag4 = std::array<std::array<Pair, 4>, 32>;  // [lane][register]

// ldmatrix.x4: lanes 8j..8j+7 name the rows of matrix j. Lane l gets, of matrix j, row l / 4,
// columns 2 (l % 4) and + 1; with .trans, rows 2 (l % 4) and + 1 of column l / 4.
inline Frag4 ldmatrix_x4(const Smem& s, const std::array<uint32_t, 32>& addr, bool trans) {
  Frag4 r{};
  for (int l = 0; l < 32; ++l) {
    for (int j = 0; j < 4; ++j) {
      for (int e = 0; e < 2; ++e) {
        r[l][j][e] = trans ? s.at(addr[8 * j + 2 * (l % 4) + e] + 2 * (l / 4))
                           : s.at(addr[8 * j + l / 4] + 2 * (2 * (l % 4) + e));
      }
    }
  }
  return r;
}

// mma.m16n8k16 (row.col), fp32 accumulators: A 16x16 from a[0..3], B 16x8 from b[0..1] of each
// lane, d[lane][0..3] += (A B) at (gid, 2t), (gid, 2t+1), (gid+8, 2t), (gid+8, 2t+1).
inline void mma(std::array<std::array<double, 4>, 32>& d,
                const std::array<std::array<Pair, 4>, 32>& a,
                const std::array<std::array<Pair, 2>, 32>& b) {
  double A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int e = 0; e < 2; ++e) {
      A[g][2 * t + e] = a[l][0][e];
      A[g + 8][2 * t + e] = a[l][1][e];
      A[g][8 + 2 * t + e] = a[l][2][e];
      A[g + 8][8 + 2 * t + e] = a[l][3][e];
      B[2 * t + e][g] = b[l][0][e];
      B[8 + 2 * t + e][g] = b[l][1][e];
    }
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
      for (int k = 0; k < 16; ++k) d[l][e] += A[row][k] * B[k][col];
    }
  }
}

inline std::array<std::array<Pair, 2>, 32> half_of(const Frag4& f, int first) {
  std::array<std::array<Pair, 2>, 32> r{};
  for (int l = 0; l < 32; ++l) r[l] = {f[l][first], f[l][first + 1]};
  return r;
}

}  // namespace flashinfer::testing::mma_emu
