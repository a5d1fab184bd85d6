// The m64nNk16 wgmma accumulator's layout as the Hopper kernels index it (prefill_sm90_kernel.cuh,
// mla_sm90_kernel.cuh): value v of thread t sits at row 16 (t / 32) + (t % 32) / 4 +
// 8 ((v >> 1) & 1), column 8 (v >> 2) + 2 (t % 4) + (v & 1); t counts the warps on (warp t / 32
// owns 16 rows), so a block of two warpgroups covers 128 rows. The shape tests
// (tests/api/test_prefill_sm90_shape.cpp, test_mla_sm90_shape.cpp) check CuTe's partitions against
// it. Includes only GoogleTest and CuTe (the test utilities' Tensor and Shape would meet CuTe's).
#pragma once

#include <gtest/gtest.h>

#include <cute/tensor.hpp>

namespace flashinfer::testing {

inline int wgmma_acc_row(int t, int v) { return 16 * (t / 32) + (t % 32) / 4 + 8 * ((v >> 1) & 1); }
inline int wgmma_acc_col(int t, int v) { return 8 * (v >> 2) + 2 * (t % 4) + (v & 1); }

/// Every value of `c`, thread t's partition of an identity tensor (its (row, column)
/// coordinates), at the formula's place; `what` names the operand in a failure.
template <class Frag>
void expect_wgmma_acc_coords(const Frag& c, int t, const char* what) {
  for (int v = 0; v < int(cute::size(c)); ++v) {
    ASSERT_EQ(int(cute::get<0>(c(v))), wgmma_acc_row(t, v))
        << what << " thread " << t << " value " << v;
    ASSERT_EQ(int(cute::get<1>(c(v))), wgmma_acc_col(t, v))
        << what << " thread " << t << " value " << v;
  }
}

}  // namespace flashinfer::testing
