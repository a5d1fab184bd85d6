// Private: Philox-4x32-10 counter-based generator (Salmon et al., "Parallel Random Numbers: As
// Easy as 1, 2, 3", SC11), usable from host C++ and from CUDA device code, so the CPU and CUDA
// sampling kernels draw exactly the same numbers.
//
// The stream layout is cuRAND's for curandStatePhilox4_32_10_t: curand_init(seed, subsequence,
// offset) starts at 128-bit counter (subsequence << 64) + offset / 4 with key (seed_lo, seed_hi),
// and the n-th curand() after it returns word (offset + n) % 4 of block (offset + n) / 4.
// curand_uniform maps a word x to x * 2^-32 + 2^-33, a float in (0, 1]; nvcc contracts that to
// one fused multiply-add, which we write out explicitly so the host rounds the same way.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FLASHINFER_HD __host__ __device__ __forceinline__
#else
#define FLASHINFER_HD inline
#endif

namespace flashinfer::kernels {

struct Philox4x32 {
  uint32_t v[4];
};

inline constexpr uint32_t kPhiloxMul0 = 0xD2511F53u;
inline constexpr uint32_t kPhiloxMul1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxWeyl0 = 0x9E3779B9u;  // golden ratio
inline constexpr uint32_t kPhiloxWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

FLASHINFER_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
#if defined(__CUDA_ARCH__)
  hi = __umulhi(a, b);
  lo = a * b;
#else
  const uint64_t prod = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(prod >> 32);
  lo = static_cast<uint32_t>(prod);
#endif
}

/// The Philox-4x32 bijection with `Rounds` rounds (10 for Philox-4x32-10) of counter `ctr`
/// under key (k0, k1).
template <int Rounds = 10>
FLASHINFER_HD Philox4x32 philox4x32(Philox4x32 ctr, uint32_t k0, uint32_t k1) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < Rounds; ++r) {
    if (r > 0) {
      k0 += kPhiloxWeyl0;
      k1 += kPhiloxWeyl1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kPhiloxMul0, ctr.v[0], hi0, lo0);
    philox_mulhilo(kPhiloxMul1, ctr.v[2], hi1, lo1);
    const Philox4x32 next = {{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    ctr = next;
  }
  return ctr;
}

/// philox4x32 with a round count known only at run time (Triton's tl.randint takes n_rounds).
FLASHINFER_HD Philox4x32 philox4x32_rounds(Philox4x32 ctr, uint32_t k0, uint32_t k1, int rounds) {
  for (int r = 0; r < rounds; ++r) {
    if (r > 0) {
      k0 += kPhiloxWeyl0;
      k1 += kPhiloxWeyl1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kPhiloxMul0, ctr.v[0], hi0, lo0);
    philox_mulhilo(kPhiloxMul1, ctr.v[2], hi1, lo1);
    const Philox4x32 next = {{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    ctr = next;
  }
  return ctr;
}

/// Block `block` (four 32-bit words) of subsequence `subsequence` of the stream keyed by `seed`.
FLASHINFER_HD Philox4x32 philox_block(uint64_t seed, uint64_t subsequence, uint64_t block) {
  const Philox4x32 ctr = {{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                           static_cast<uint32_t>(subsequence),
                           static_cast<uint32_t>(subsequence >> 32)}};
  return philox4x32<10>(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

/// curand_uniform's map from a 32-bit word to (0, 1].
FLASHINFER_HD float philox_word_to_uniform(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(static_cast<float>(x), 0x1p-32f, 0x1p-33f);
#else
  return std::fma(static_cast<float>(x), 0x1p-32f, 0x1p-33f);
#endif
}

/// Sequential draws from one (seed, subsequence) stream starting at `offset`, as successive
/// curand()/curand_uniform() calls after curand_init(seed, subsequence, offset) return them.
/// (Positions past 2^64 - 1, which cuRAND carries into the subsequence word, are not modelled.)
class PhiloxStream {
 public:
  FLASHINFER_HD PhiloxStream(uint64_t seed, uint64_t subsequence, uint64_t offset)
      : seed_(seed), subsequence_(subsequence), pos_(offset) {}

  FLASHINFER_HD uint32_t next_u32() {
    const uint64_t block = pos_ >> 2;
    if (!have_ || block != block_) {
      out_ = philox_block(seed_, subsequence_, block);
      block_ = block;
      have_ = true;
    }
    const uint32_t word = out_.v[pos_ & 3];
    ++pos_;
    return word;
  }

  FLASHINFER_HD float next_uniform() { return philox_word_to_uniform(next_u32()); }

 private:
  uint64_t seed_;
  uint64_t subsequence_;
  uint64_t pos_;
  uint64_t block_ = 0;
  bool have_ = false;
  Philox4x32 out_ = {{0, 0, 0, 0}};
};

}  // namespace flashinfer::kernels
