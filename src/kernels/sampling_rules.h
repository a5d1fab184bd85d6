// Private: the plain arithmetic of the sampling kernels, one copy for host and device code, so
// the CPU reference (src/kernels/cpu/sampling_cpu.cpp) and the CUDA kernels
// (src/kernels/cuda/sampling_cuda.cu) take the same decisions; unit-tested on the CPU
// (tests/ops/test_sampling_rules.cpp).
//   * the value of each per-row argument for output row b (sampling_row), read where it is;
//   * chunk partitioning: a row is scanned in chunks of threads x vec elements; thread t of
//     chunk c owns the vec consecutive elements from c * threads * vec + t * vec, read with one
//     128-bit load when the row allows it;
//   * the dual-pivot rejection rule (upstream's "sorting-free" top-k / top-p sampling);
//   * the k-ary threshold search of the renorm / mask filters.
#pragma once

#include <cstdint>

#include "kernels/fp32_rules.h"  // fp32_mul
#include "kernels/sampling_params.h"

namespace flashinfer::kernels {

// ---- per-row values ----------------------------------------------------------------------------

FLASHINFER_HD float sampling_f32_from_bits(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  __builtin_memcpy(&x, &b, sizeof(x));
  return x;
#endif
}

/// The float of IEEE binary16 bits, exactly (every fp16 value is a float).
FLASHINFER_HD float sampling_half_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in fp32
    const float mag = static_cast<float>(man) * 0x1p-24f;
    return sign ? -mag : mag;
  }
  if (exp == 0x1F) return sampling_f32_from_bits(sign | 0x7F800000u | (man << 13));  // inf, NaN
  return sampling_f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

/// Integer argument of row b (int32 or int64 array, or the scalar).
FLASHINFER_HD int64_t row_arg_int(const RowArg& a, int64_t b) {
  if (a.data == nullptr) return a.int_value;
  const int64_t i = b * a.stride;
  if (a.dtype == DType::kInt32) return static_cast<const int32_t*>(a.data)[i];
  return static_cast<const int64_t*>(a.data)[i];
}

/// Float argument of row b, rounded to fp32 (float64 to nearest; the others exactly).
FLASHINFER_HD float row_arg_float(const RowArg& a, int64_t b) {
  if (a.data == nullptr) return a.float_value;
  const int64_t i = b * a.stride;
  switch (a.dtype) {
    case DType::kFloat64:
      return static_cast<float>(static_cast<const double*>(a.data)[i]);
    case DType::kFloat16:
      return sampling_half_to_f32(static_cast<const uint16_t*>(a.data)[i]);
    case DType::kBFloat16:
      return sampling_f32_from_bits(static_cast<uint32_t>(static_cast<const uint16_t*>(a.data)[i])
                                    << 16);
    default:
      return static_cast<const float*>(a.data)[i];
  }
}

/// The top_k the kernels use for a given k. The host refuses k < 1 where it can see the value
/// (scalars; tensors on the CPU); a device tensor's k is only seen by the kernel, which reads it
/// as upstream's kernels do (an unsigned 32-bit k): a negative k is above every vocabulary (no
/// top-k limit) and k = 0 keeps no token (the samplers give valid = false, the renorm zeros,
/// the mask -inf). Above 2^31 - 1: 2^31 - 1 (no limit either).
FLASHINFER_HD int32_t sampling_top_k(int64_t k) {
  constexpr int64_t kMax = 0x7FFFFFFF;
  return static_cast<int32_t>(k < 0 || k > kMax ? kMax : k);
}

/// Source row for output row b: b without indices, else indices[b] clamped to [0, src_rows)
/// (the host refuses an index out of range where it can see it; a device tensor's is clamped so
/// no kernel reads outside the input).
FLASHINFER_HD int64_t sampling_src_row(const SamplingRowArgs& a, int64_t b) {
  if (a.indices.data == nullptr) return b;
  const int64_t i = row_arg_int(a.indices, b);
  return i < 0 ? 0 : i >= a.src_rows ? a.src_rows - 1 : i;
}

/// A logit over the temperature as upstream 0.7.4's softmax computes it: times 1 / T (0 when T
/// is 0, a uniform row), the product rounded on its own (its __fmul_rn: never fused into a
/// following subtraction).
FLASHINFER_HD float sampling_inv_temperature(float t) { return t == 0.0f ? 0.0f : 1.0f / t; }
FLASHINFER_HD float sampling_scaled_logit(float x, float inv_t) { return fp32_mul(x, inv_t); }

/// Every value of output row b, read from where each argument is. The one definition of "the
/// value of row b" for the CPU reference and the CUDA kernels.
FLASHINFER_HD SamplingRow sampling_row(const SamplingRowArgs& a, int64_t b) {
  SamplingRow r;
  r.src_row = sampling_src_row(a, b);
  // Upstream 0.7.4 reads a seed or offset tensor at the output row (one entry: every row).
  r.seed = static_cast<uint64_t>(row_arg_int(a.seed, b));
  r.offset = static_cast<uint64_t>(row_arg_int(a.offset, b));
  r.top_k = sampling_top_k(row_arg_int(a.top_k, a.top_k_by_src_row ? r.src_row : b));
  r.top_p = row_arg_float(a.top_p, a.top_p_by_src_row ? r.src_row : b);
  r.min_p = row_arg_float(a.min_p, a.min_p_by_src_row ? r.src_row : b);
  r.temperature = row_arg_float(a.temperature, b);
  return r;
}

// ---- chunk partitioning ------------------------------------------------------------------------

/// Elements per thread and chunk: one 16-byte load (16 / element size elements) when columns are
/// contiguous and every row starts 16-byte aligned (base address and row stride); else 1 (scalar
/// loads at the column stride). A row whose length is not a multiple of the width still takes the
/// wide path: its last, partial vector is read element by element.
FLASHINFER_HD int sampling_vec_width(int64_t elem_bytes, uint64_t base_addr, int64_t stride_row,
                                     int64_t stride_col) {
  if (elem_bytes <= 0 || 16 % elem_bytes != 0 || stride_col != 1) return 1;
  const int64_t vec = 16 / elem_bytes;
  if (base_addr % 16 != 0 || stride_row % vec != 0) return 1;
  return static_cast<int>(vec);
}

/// Chunks covering a row of n elements.
FLASHINFER_HD int64_t sampling_num_chunks(int64_t n, int threads, int vec) {
  const int64_t per = static_cast<int64_t>(threads) * vec;
  return (n + per - 1) / per;
}

/// Index of the first element thread `tid` owns in chunk `chunk`.
FLASHINFER_HD int64_t sampling_thread_first(int64_t chunk, int tid, int threads, int vec) {
  return (chunk * threads + tid) * static_cast<int64_t>(vec);
}

/// Whether the vec elements from `first` all lie in a row of n (one wide load), else they are
/// read one by one (the row's last vector) or not at all (first >= n).
FLASHINFER_HD bool sampling_full_vector(int64_t first, int64_t n, int vec) {
  return first + vec <= n;
}

/// Chunks in which every thread's vector lies whole inside the row: the first
/// `sampling_whole_chunks` chunks. The CUDA passes issue their 16-byte loads several of these
/// chunks at a time, unguarded but for the group's end; the chunk after them, if any, is the
/// row's last and partial one, read with each thread's own bounds check.
FLASHINFER_HD int64_t sampling_whole_chunks(int64_t n, int threads, int vec) {
  return n / (static_cast<int64_t>(threads) * vec);
}

// ---- random words ------------------------------------------------------------------------------

/// Word `lane` (0..3) of a Philox block, by selects: a runtime index into the array would put
/// the block in local memory on the device.
FLASHINFER_HD uint32_t philox_lane(const Philox4x32& w, uint64_t lane) {
  return lane == 0 ? w.v[0] : lane == 1 ? w.v[1] : lane == 2 ? w.v[2] : w.v[3];
}

/// The uniform at `position` of the (seed, subsequence) stream: what PhiloxStream's
/// next_uniform() returns after position - offset earlier draws from `offset`.
FLASHINFER_HD float philox_uniform_at(uint64_t seed, uint64_t subsequence, uint64_t position) {
  return philox_word_to_uniform(
      philox_lane(philox_block(seed, subsequence, position >> 2), position & 3u));
}

// ---- dual-pivot rejection ----------------------------------------------------------------------

/// The candidate window of the rejection samplers: candidates are the tokens with p > low; `high`
/// is the smallest value known to pass the filter; `q` is the candidates' mass (the draw is
/// u * q). Starts at (0, 1, 1).
struct PivotWindow {
  float low = 0.0f;
  float high = 1.0f;
  float q = 1.0f;
};

/// Count and mass strictly above the round's two pivots.
struct PivotCounts {
  int64_t count0 = 0, count1 = 0;
  float mass0 = 0.0f, mass1 = 0.0f;
};

/// The second pivot: halfway between the sampled value and `high`.
FLASHINFER_HD float second_pivot(float pivot0, float high) { return (pivot0 + high) * 0.5f; }

/// One round's decision for the sampled token with value pivot0 (pivot1 = second_pivot): true
/// when pivot0 passes the filter (the token is the sample). Otherwise narrows `w`: to the tokens
/// above pivot0 with high = pivot1 when pivot1 passes, else to the tokens above pivot1. When
/// pivot1 is not above pivot0 (only with unnormalized input, p above `high`) the window still
/// drops the sampled token (low = pivot0), so every rejected round removes at least that token.
FLASHINFER_HD bool pivot_round(SamplingKind kind, const SamplingRow& row, float pivot0,
                               float pivot1, const PivotCounts& c, PivotWindow& w) {
  if (filter_accepts(kind, row, c.count0, c.mass0)) return true;
  if (filter_accepts(kind, row, c.count1, c.mass1)) {
    w.low = pivot0;
    w.high = pivot1;
    w.q = c.mass0;
  } else if (pivot1 > pivot0) {
    w.low = pivot1;
    w.q = c.mass1;
  } else {
    w.low = pivot0;
    w.q = c.mass0;
  }
  return false;
}

// ---- k-ary threshold search (renorm / mask filters) --------------------------------------------

/// Pivots tested per pass of the threshold search: 15 pivots split the key interval into 16
/// parts, so the 2^32 keys take at most 8 passes over the row (bisection: 32).
inline constexpr int kThresholdPivots = 15;

/// Pivot j (0 <= j < pivots) of the key interval [lo, hi], lo < hi: evenly spaced, ascending,
/// all in [lo, hi - 1] (so every pass shrinks the interval).
FLASHINFER_HD uint32_t threshold_pivot(uint32_t lo, uint32_t hi, int j, int pivots) {
  const uint64_t span = static_cast<uint64_t>(hi) - lo;
  return lo + static_cast<uint32_t>(span * static_cast<uint64_t>(j + 1) /
                                    static_cast<uint64_t>(pivots + 1));
}

/// Narrows [lo, hi] after a pass: `first_below` is the smallest j whose pivot satisfied the
/// (monotone) test, or `pivots` when none did. The answer, the smallest key passing the test,
/// stays inside; the search ends when lo == hi.
FLASHINFER_HD void threshold_narrow(uint32_t& lo, uint32_t& hi, int first_below, int pivots) {
  const uint32_t l = lo, h = hi;
  if (first_below < pivots) hi = threshold_pivot(l, h, first_below, pivots);
  if (first_below > 0) lo = threshold_pivot(l, h, first_below - 1, pivots) + 1;
}

// ---- radix select (the top-k filters' threshold) ---------------------------------------------

/// The count filters' threshold (top_k_renorm_probs, top_k_mask_logits, the top-k step of
/// top_k_top_p: the smallest key t with fewer than k keys above it, i.e. the k-th largest key;
/// 0 when the row has fewer than k; 0xFFFFFFFF when k <= 0) found digit by digit from the top,
/// 11, 11 and 10 bits, one histogram pass each: the same answer as the k-ary search, exactly,
/// in 3 passes of one shared-memory increment per key instead of 8 passes of 15 comparisons.
inline constexpr int kRadixPasses = 3;
inline constexpr int kRadixBins = 2048;  // bins of the widest digit (11 bits)

FLASHINFER_HD constexpr int radix_shift(int pass) { return pass == 0 ? 21 : pass == 1 ? 10 : 0; }
FLASHINFER_HD constexpr uint32_t radix_digit_mask(int pass) { return pass < 2 ? 0x7FFu : 0x3FFu; }

/// The key's bin in pass `pass`, or -1 when its higher digits are not the ones chosen so far
/// (`prefix` under `mask`).
FLASHINFER_HD int radix_bin(uint32_t key, int pass, uint32_t prefix, uint32_t mask) {
  return (key & mask) == prefix
             ? static_cast<int>((key >> radix_shift(pass)) & radix_digit_mask(pass))
             : -1;
}

/// Bins `top` down to `top - per + 1` of a pass's histogram, `above` keys in higher bins: the bin
/// holding the `want`-th largest key (want >= 1) and, in `rest`, its rank within the bin; -1 when
/// these bins do not hold it.
FLASHINFER_HD int radix_find(const uint32_t* hist, int top, int per, int64_t above, int64_t want,
                             int64_t* rest) {
  int64_t cum = above;
  for (int j = 0; j < per; ++j) {
    const int64_t h = hist[top - j];
    if (cum < want && want <= cum + h) {
      *rest = want - cum;
      return top - j;
    }
    cum += h;
  }
  return -1;
}

/// Fixes pass `pass`'s digit to `bin`.
FLASHINFER_HD void radix_fix(uint32_t& prefix, uint32_t& mask, int pass, int bin) {
  prefix |= static_cast<uint32_t>(bin) << radix_shift(pass);
  mask |= radix_digit_mask(pass) << radix_shift(pass);
}

}  // namespace flashinfer::kernels
