// The ring's tensor copies (src/recorder/ring_copy.h): streaming copies equal their source at
// every length and alignment, and the NaN trigger's fused check finds a NaN or an Inf wherever
// it sits (the scalar head, the vector body, the tail), in each of the four dtypes, on the AVX2
// and the scalar tier alike; the largest finite values are not flagged.
#include "recorder/ring_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_isa.h"

namespace {

namespace ri = flashinfer::recorder::internal;
namespace kcpu = flashinfer::kernels::cpu;
using flashinfer::DType;

struct CapGuard {
  kcpu::CpuIsa old = kcpu::cpu_isa_cap();
  ~CapGuard() { kcpu::set_cpu_isa_cap(old); }
};

// Bytes that are finite in every dtype: 0x3c repeated is 1.0-ish in fp16, 0.0115 in bf16 and
// finite in fp32 / fp64.
std::vector<uint8_t> finite_bytes(std::size_t n) {
  std::vector<uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(0x30 + i % 13);
  return v;
}

// An element of `dtype` with all exponent bits set (an Inf), or the largest finite one.
void put_element(uint8_t* p, DType dtype, bool nonfinite) {
  switch (dtype) {
    case DType::kFloat16: {
      const uint16_t w = nonfinite ? 0x7c00 : 0x7bff;  // inf / 65504
      std::memcpy(p, &w, 2);
      break;
    }
    case DType::kBFloat16: {
      const uint16_t w = nonfinite ? 0xff81 : 0xff7f;  // -nan / -3.39e38
      std::memcpy(p, &w, 2);
      break;
    }
    case DType::kFloat32: {
      const uint32_t w = nonfinite ? 0x7fc00000u : 0x7f7fffffu;  // nan / FLT_MAX
      std::memcpy(p, &w, 4);
      break;
    }
    default: {
      const uint64_t w = nonfinite ? 0xfff0000000000000ull : 0x7fefffffffffffffull;  // -inf / max
      std::memcpy(p, &w, 8);
      break;
    }
  }
}

std::size_t width(DType d) { return d == DType::kFloat64 ? 8 : d == DType::kFloat32 ? 4 : 2; }

TEST(RingCopy, CopiesEveryLengthAndAlignment) {
  CapGuard g;
  for (kcpu::CpuIsa cap : {kcpu::CpuIsa::kAvx512, kcpu::CpuIsa::kScalar}) {
    kcpu::set_cpu_isa_cap(cap);
    const std::vector<uint8_t> src = finite_bytes(9010);
    for (std::size_t n : {0, 1, 31, 64, 513, 4096, 4097, 4099, 5000, 9000}) {
      for (std::size_t dst_off : {0, 1, 8, 16, 31}) {
        std::vector<uint8_t> dst(n + 64, 0xee);
        ri::ring_copy(dst.data() + dst_off, src.data() + 3, n);
        ASSERT_EQ(std::memcmp(dst.data() + dst_off, src.data() + 3, n), 0) << n << " " << dst_off;
        // Nothing written outside [dst_off, dst_off + n).
        for (std::size_t i = 0; i < dst_off; ++i) ASSERT_EQ(dst[i], 0xee);
        for (std::size_t i = dst_off + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xee);
      }
    }
  }
}

TEST(RingCopy, FindsANonfiniteElementAnywhere) {
  CapGuard g;
  for (kcpu::CpuIsa cap : {kcpu::CpuIsa::kAvx512, kcpu::CpuIsa::kScalar}) {
    kcpu::set_cpu_isa_cap(cap);
    for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
      const std::size_t w = width(d);
      for (std::size_t elems : {3, 257, 2053, 4099}) {
        const std::size_t n = elems * w;
        for (std::size_t dst_off : {0, 8, 16}) {
          std::vector<uint8_t> src = finite_bytes(n);
          std::vector<uint8_t> dst(n + 32);
          // Every position in the first and last 40 elements and a few in between.
          for (std::size_t e = 0; e < elems; ++e) {
            if (e >= 40 && e + 40 < elems && e % 37 != 0) continue;
            for (bool bad : {false, true}) {
              put_element(src.data() + e * w, d, bad);
              EXPECT_EQ(ri::ring_copy_check(dst.data() + dst_off, src.data(), n, d), bad)
                  << static_cast<int>(d) << " elems " << elems << " at " << e;
              ASSERT_EQ(std::memcmp(dst.data() + dst_off, src.data(), n), 0);
              EXPECT_EQ(ri::ring_any_nonfinite(src.data(), n, d), bad);
            }
            // Restore the finite pattern.
            const std::vector<uint8_t> fresh = finite_bytes(n);
            std::memcpy(src.data() + e * w, fresh.data() + e * w, w);
          }
        }
      }
    }
  }
}

// The arena's copies (ring_copy_streamed, fenced once after them): streamed at every size, equal
// to their source at the arena's alignments (64, 16) and others, nothing written around them,
// and the fused check finds an Inf or NaN at the first, a middle and the last element.
TEST(RingCopy, StreamedCopiesOfSmallSpansAreExactAndChecked) {
  CapGuard g;
  for (kcpu::CpuIsa cap : {kcpu::CpuIsa::kAvx512, kcpu::CpuIsa::kScalar}) {
    kcpu::set_cpu_isa_cap(cap);
    for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
      const std::size_t w = width(d);
      for (std::size_t elems : {std::size_t{1}, std::size_t{5}, std::size_t{16}, std::size_t{33},
                                std::size_t{100}, std::size_t{512}, 4096 / w}) {
        const std::size_t n = elems * w;
        for (std::size_t dst_off : {0, 16, 48, 8}) {
          std::vector<uint8_t> src = finite_bytes(n);
          alignas(64) static uint8_t dst[4096 + 192];
          std::memset(dst, 0xee, sizeof(dst));
          uint8_t* at = dst + 64 + dst_off;
          for (std::size_t e : {std::size_t{0}, elems / 2, elems - 1}) {
            for (bool bad : {false, true}) {
              put_element(src.data() + e * w, d, bad);
              EXPECT_EQ(ri::ring_copy_streamed(at, src.data(), n, true, d), bad)
                  << static_cast<int>(d) << " elems " << elems << " at " << e;
              ri::ring_copy_fence();
              ASSERT_EQ(std::memcmp(at, src.data(), n), 0) << n << " " << dst_off;
              const std::vector<uint8_t> fresh = finite_bytes(n);
              std::memcpy(src.data() + e * w, fresh.data() + e * w, w);
            }
          }
          // Unchecked: never reports a nonfinite element (the caller checks another way).
          put_element(src.data(), d, true);
          EXPECT_FALSE(ri::ring_copy_streamed(at, src.data(), n, false, d));
          ri::ring_copy_fence();
          ASSERT_EQ(std::memcmp(at, src.data(), n), 0);
          for (std::size_t i = 0; i < 64 + dst_off; ++i) ASSERT_EQ(dst[i], 0xee);
          for (std::size_t i = 64 + dst_off + n; i < sizeof(dst); ++i) ASSERT_EQ(dst[i], 0xee);
        }
      }
    }
  }
}

TEST(RingCopy, CheckableDtypes) {
  EXPECT_TRUE(ri::ring_checkable(DType::kFloat16));
  EXPECT_TRUE(ri::ring_checkable(DType::kBFloat16));
  EXPECT_TRUE(ri::ring_checkable(DType::kFloat32));
  EXPECT_TRUE(ri::ring_checkable(DType::kFloat64));
  EXPECT_FALSE(ri::ring_checkable(DType::kInt32));
  EXPECT_FALSE(ri::ring_checkable(DType::kUInt8));
}

}  // namespace
