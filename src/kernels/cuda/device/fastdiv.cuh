// Division by a divisor fixed at launch (page size, heads per group, ...) as a multiply-high and a
// shift: the kernels split token indices into (page, slot) in their inner loops, where a 32-bit
// integer division would cost tens of instructions.
#pragma once

#include "kernels/cuda/device/host_device.h"

#ifdef __CUDACC_RTC__
#include <cuda/std/cstdint>
#else
#include <cstdint>
#endif

namespace flashinfer::kernels::cuda::dev {

/// Exact n / d and n % d for a divisor d in [1, 2^31) and any n in [0, 2^31).
///
/// With l = ceil(log2 d) and m = ceil(2^(32+l) / d), floor(n / d) = floor(n * m / 2^(32+l)):
/// writing m = (2^(32+l) + e) / d with 0 <= e < d <= 2^l, the excess n * e / (d * 2^(32+l)) is
/// below 1 / d, too small to reach the next multiple of d. m lies in [2^32, 2^33), so `mul` keeps m
/// - 2^32 and the quotient is (mulhi(n, mul) + n) >> l; the sum stays below 2^32 as n < 2^31.
/// Divisor 1 needs no special case (mul = 0, shift = 0).
struct FastDivmod {
  uint32_t d;      // the divisor
  uint32_t mul;    // ceil(2^(32 + shift) / d) - 2^32
  uint32_t shift;  // ceil(log2(d))

  FLASHINFER_HD FastDivmod() : d(1), mul(0), shift(0) {}

  FLASHINFER_HD explicit FastDivmod(uint32_t divisor) : d(divisor), mul(0), shift(0) {
    while ((uint64_t(1) << shift) < divisor) ++shift;
    const uint64_t two_p = uint64_t(1) << (32 + shift);  // shift <= 31: no overflow
    mul = static_cast<uint32_t>((two_p + divisor - 1) / divisor - (uint64_t(1) << 32));
  }

  /// From a divisor's precomputed parts (another FastDivmod(divisor)'s mul and shift), without
  /// the constructor's loop and 64-bit division.
  FLASHINFER_HD static FastDivmod from_parts(uint32_t divisor, uint32_t mul, uint32_t shift) {
    FastDivmod f;
    f.d = divisor;
    f.mul = mul;
    f.shift = shift;
    return f;
  }

  FLASHINFER_HD uint32_t div(uint32_t n) const {
#ifdef __CUDA_ARCH__
    return (__umulhi(n, mul) + n) >> shift;
#else
    return static_cast<uint32_t>((((uint64_t(n) * mul) >> 32) + n) >> shift);
#endif
  }

  FLASHINFER_HD uint32_t mod(uint32_t n) const { return n - div(n) * d; }

  FLASHINFER_HD void divmod(uint32_t n, uint32_t& q, uint32_t& r) const {
    q = div(n);
    r = n - q * d;
  }
};

}  // namespace flashinfer::kernels::cuda::dev
