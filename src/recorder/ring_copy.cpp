#include "recorder/ring_copy.h"

#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/cpu_isa.h"

namespace flashinfer::recorder::internal {

namespace {

namespace kcpu = flashinfer::kernels::cpu;

// Up to this a plain memcpy, which leaves the copy in cache: a span this small is compared
// whole with its copy when the next call shares it (an activation passed on: ring.cpp's
// same_as_kept, kWholeCompareBytes), and a streamed copy would make that 64 misses. (Since
// session 17 the default mode keeps such spans in the call's arena, never compared:
// ring_copy_streamed.)
constexpr uint64_t kStreamMin = 4096 + 1;

bool use_avx2() { return kcpu::cpu_isa() >= kcpu::CpuIsa::kAvx2; }

// Whether any of `n_elems` elements of width W at `p` has all the bits of `mask` set.
template <typename W>
bool scalar_check(const uint8_t* p, uint64_t n_elems, W mask) {
  W bad = 0;
  for (uint64_t i = 0; i < n_elems; ++i) {
    W w;
    std::memcpy(&w, p + i * sizeof(W), sizeof(W));
    bad |= static_cast<W>((w & mask) == mask);
  }
  return bad != 0;
}

// The exponent bits of a ring_checkable dtype, in an element of its width.
uint64_t exponent_mask(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 0x7f800000u;
    case DType::kFloat16:
      return 0x7c00u;
    case DType::kBFloat16:
      return 0x7f80u;
    default:
      return 0x7ff0000000000000ull;
  }
}

}  // namespace

bool ring_any_nonfinite(const uint8_t* p, uint64_t n, DType dtype) noexcept {
  if (!ring_checkable(dtype)) return false;
  const uint64_t m = exponent_mask(dtype);
  switch (dtype_size(dtype)) {
    case 2:
      return scalar_check<uint16_t>(p, n / 2, static_cast<uint16_t>(m));
    case 4:
      return scalar_check<uint32_t>(p, n / 4, static_cast<uint32_t>(m));
    default:
      return scalar_check<uint64_t>(p, n / 8, m);
  }
}

namespace {

// Lanes of 32 bytes whose elements equal `m` under `m` (all exponent bits set): compared as
// 16-, 32- or 64-bit lanes by the dtype's width.
__attribute__((target("avx2"))) inline __m256i lanes_bad(__m256i v, __m256i m, int width) {
  const __m256i x = _mm256_and_si256(v, m);
  if (width == 2) return _mm256_cmpeq_epi16(x, m);
  if (width == 4) return _mm256_cmpeq_epi32(x, m);
  return _mm256_cmpeq_epi64(x, m);
}

__attribute__((target("avx2"))) __m256i mask_of(DType dtype) {
  const uint64_t m = exponent_mask(dtype);
  switch (dtype_size(dtype)) {
    case 2:
      return _mm256_set1_epi16(static_cast<short>(m));
    case 4:
      return _mm256_set1_epi32(static_cast<int>(m));
    default:
      return _mm256_set1_epi64x(static_cast<long long>(m));
  }
}

// The streaming copy, and with `check` the exponent test of every element on the way (over
// src, element by element: src is element-aligned). The head up to dst's 32-byte alignment and
// the tail are copied plainly and checked by the scalar loop; when that head is not whole
// elements (dst and src disagree modulo the width: not the pool's blobs) all of it is.
// `fence`: the streaming stores are fenced before it returns (else the caller fences).
__attribute__((target("avx2"))) bool stream_copy(uint8_t* dst, const uint8_t* src, uint64_t n,
                                                 bool check, DType dtype, bool fence = true) {
  const uint64_t width = check ? dtype_size(dtype) : 1;
  uint64_t head = (32 - (reinterpret_cast<uintptr_t>(dst) & 31)) & 31;
  if (head > n) head = n;
  if (head % width != 0) {
    std::memcpy(dst, src, n);
    return check && ring_any_nonfinite(src, n, dtype);
  }
  std::memcpy(dst, src, head);
  bool bad = check && ring_any_nonfinite(src, head, dtype);
  uint64_t i = head;
  const __m256i m = check ? mask_of(dtype) : _mm256_setzero_si256();
  const int w = static_cast<int>(width);
  __m256i acc = _mm256_setzero_si256();
  for (; i + 64 <= n; i += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    if (check) {
      acc = _mm256_or_si256(acc, _mm256_or_si256(lanes_bad(a, m, w), lanes_bad(b, m, w)));
    }
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
  }
  // Streaming stores are weakly ordered: fenced before the copy is published to a dump on
  // another thread (or read by the crash handler).
  if (fence) _mm_sfence();
  std::memcpy(dst + i, src + i, n - i);
  if (check)
    bad = bad || !_mm256_testz_si256(acc, acc) || ring_any_nonfinite(src + i, n - i, dtype);
  return bad;
}

}  // namespace

bool ring_checkable(DType dtype) noexcept {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16 ||
         dtype == DType::kFloat64;
}

void ring_copy(uint8_t* dst, const uint8_t* src, uint64_t n) noexcept {
  if (n < kStreamMin || !use_avx2()) {
    if (n) std::memcpy(dst, src, n);
    return;
  }
  stream_copy(dst, src, n, false, DType::kUInt8);
}

bool ring_copy_check(uint8_t* dst, const uint8_t* src, uint64_t n, DType dtype) noexcept {
  if (n < kStreamMin || !use_avx2()) {
    if (n) std::memcpy(dst, src, n);
    return ring_any_nonfinite(src, n, dtype);
  }
  return stream_copy(dst, src, n, true, dtype);
}

bool ring_copy_streamed(uint8_t* dst, const uint8_t* src, uint64_t n, bool check,
                        DType dtype) noexcept {
  if (!use_avx2()) {
    if (n) std::memcpy(dst, src, n);
    return check && ring_any_nonfinite(src, n, dtype);
  }
  return stream_copy(dst, src, n, check, dtype, false);
}

void ring_copy_fence() noexcept { _mm_sfence(); }

}  // namespace flashinfer::recorder::internal
