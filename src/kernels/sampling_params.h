// Private: what the sampling kernels of every backend receive, plus the small pieces of math
// both backends must evaluate identically (ordered float keys, filter tests). Strides are in
// elements. Per-output-row arguments (source row, thresholds, seed, offset, temperature) reach
// the kernels as they are given: a scalar, or a 1-D tensor by pointer, dtype and stride
// (SamplingRowArgs). Every kernel reads row b's values with sampling_row()
// (kernels/sampling_rules.h), on the host for the CPU and on the device for CUDA, so no backend
// copies a tensor's values anywhere first and both read identically.
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"
#include "kernels/philox.h"

namespace flashinfer::kernels {

/// One output row's values, as sampling_row() reads them for the kernels.
struct SamplingRow {
  int64_t src_row = 0;  // row of the input to read (indices[b] clamped to the input, or b)
  uint64_t seed = 0;    // Philox key
  uint64_t offset = 0;  // Philox position; the subsequence is the output row b
  int32_t top_k = 0;    // >= 0 (sampling_top_k)
  float top_p = 1.0f;   // (0, 1] where checked
  float min_p = 0.0f;   // [0, 1] where checked
  float temperature = 1.0f;
};

/// One per-row argument: `data == nullptr` gives every row the scalar (`int_value` for the
/// integer arguments, `float_value` for the others); else row b reads element b * stride of
/// `data` (host memory for the CPU, device memory for CUDA; stride 0 broadcasts element 0).
/// Integer arrays are int32 or int64; float arrays float32, float64, float16 or bfloat16.
struct RowArg {
  const void* data = nullptr;
  DType dtype = DType::kInt64;
  int64_t stride = 0;
  int64_t int_value = 0;
  float float_value = 0.0f;
};

/// Every per-row argument of a call. `indices` without data means output row b reads input
/// row b; with data, indices[b] clamped to [0, src_rows). Arguments an op has not keep their
/// defaults (top_p 1, min_p 0, temperature 1).
/// seed and offset: a tensor of one entry for every row, of one per output row at that row, as
/// upstream 0.7.4's kernels read them (the Philox subsequence is the output row).
struct SamplingRowArgs {
  RowArg indices;
  int64_t src_rows = 0;  // rows of the input (>= 1 when there are output rows)
  RowArg top_k;
  RowArg top_p = {nullptr, DType::kFloat32, 0, 0, 1.0f};
  // top_k / top_p read at the source row (indices[b]) instead of the output row b, where
  // upstream's kernels read them there (api/sampling.cpp, prepare_sampling).
  bool top_k_by_src_row = false;
  bool top_p_by_src_row = false;
  bool min_p_by_src_row = false;
  RowArg min_p = {nullptr, DType::kFloat32, 0, 0, 0.0f};
  RowArg temperature = {nullptr, DType::kFloat32, 0, 0, 1.0f};
  RowArg seed;
  RowArg offset;
};

enum class SamplingKind : int32_t {
  kProbs,     // inverse CDF over the whole row
  kTopK,      // dual-pivot rejection, top-k test
  kTopP,      // dual-pivot rejection, top-p test
  kTopKTopP,  // dual-pivot rejection, both tests ("joint")
  kMinP,      // one pass: keep p >= min_p * max(p)
  kLogits,    // Gumbel-max over logits
};

struct SamplingParams {
  const void* input = nullptr;  // probs or logits [src_rows, vocab]
  DType dtype = DType::kFloat32;
  int64_t vocab = 0;
  int64_t in_stride_row = 0, in_stride_col = 1;
  SamplingRowArgs rows;
  int64_t batch = 0;
  void* samples = nullptr;  // [batch], int32 or int64
  DType out_dtype = DType::kInt32;
  bool* valid = nullptr;  // [batch], or nullptr: not written
  SamplingKind kind = SamplingKind::kProbs;
  // Null, or each input row's tokens by sampled column: the sample reported for output row b is
  // sample_map[src_row * sample_map_stride + column], src_row being the input row b sampled (the
  // "top_k_first" fast path samples over the k columns a top-k selected from every input row;
  // api/sampling.cpp, top_k_first_fast).
  const int64_t* sample_map = nullptr;
  int64_t sample_map_stride = 0;
};

/// The token an output row reading input row `src_row` reports for the sampled column `tok` (-1:
/// none, reported as column 0): the column itself, or the token `sample_map` gives it.
FLASHINFER_HD int64_t sampling_output_token(const SamplingParams& p, int64_t src_row, int64_t tok) {
  const int64_t v = tok >= 0 ? tok : 0;
  return p.sample_map != nullptr ? p.sample_map[src_row * p.sample_map_stride + v] : v;
}

enum class FilterKind : int32_t {
  kTopKRenorm,    // zero all but the top-k probs, renormalize
  kTopPRenorm,    // zero all but the top-p nucleus, renormalize
  kTopKMask,      // set all but the top-k logits to -inf
  kColumnMask,    // set the columns from the row's limit on to -inf (sampling_column_limit)
  kColumnRenorm,  // zero the columns from the row's limit on, renormalize the rest
};

/// The columns a per-row top_k keeps of a row already sorted by a top-k selection ("top_k_first"
/// fast path with a top_k tensor, upstream 0.7.4's _top_k_first_fast_path): k < 0 keeps all n
/// (sampling_top_k made it 2^31 - 1), k = 0 keeps the first (greedy), else the first min(k, n).
FLASHINFER_HD int64_t sampling_column_limit(int32_t top_k, int64_t n) {
  return top_k < 1 ? 1 : top_k < n ? top_k : n;
}

FLASHINFER_HD bool filter_by_column(FilterKind k) {
  return k == FilterKind::kColumnMask || k == FilterKind::kColumnRenorm;
}
FLASHINFER_HD bool filter_masks(FilterKind k) {
  return k == FilterKind::kTopKMask || k == FilterKind::kColumnMask;
}

struct FilterParams {
  const void* input = nullptr;
  DType in_dtype = DType::kFloat32;
  void* out = nullptr;
  DType out_dtype = DType::kFloat32;
  int64_t vocab = 0;
  int64_t in_stride_row = 0, in_stride_col = 1;
  int64_t out_stride_row = 0, out_stride_col = 1;
  SamplingRowArgs rows;
  int64_t batch = 0;
  FilterKind kind = FilterKind::kTopKRenorm;
};

struct SoftmaxParams {
  const void* logits = nullptr;
  DType dtype = DType::kFloat32;
  float* out = nullptr;  // [batch, vocab] contiguous fp32
  int64_t vocab = 0;
  int64_t in_stride_row = 0, in_stride_col = 1;
  SamplingRowArgs rows;  // indices and temperature
  int64_t batch = 0;
};

/// A key whose unsigned order is the float order: larger float, larger key; -0 and +0 share a
/// key, and every NaN maps to 0, below all numbers (NaNs are never kept by a filter).
FLASHINFER_HD uint32_t ordered_key(float x) {
  if (x != x) return 0u;
  if (x == 0.0f) x = 0.0f;  // -0 -> +0
  uint32_t bits;
#if defined(__CUDA_ARCH__)
  bits = __float_as_uint(x);
#else
  __builtin_memcpy(&bits, &x, sizeof(bits));
#endif
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

/// The filter test of the rejection samplers for a candidate value: `count` tokens with a
/// strictly larger prob, holding `mass`. Top-k keeps a token with fewer than k strictly larger
/// ones; top-p keeps it while the strictly larger mass is below top_p.
FLASHINFER_HD bool filter_accepts(SamplingKind kind, const SamplingRow& row, int64_t count,
                                  float mass) {
  switch (kind) {
    case SamplingKind::kTopK:
      return count < row.top_k;
    case SamplingKind::kTopP:
      return mass < row.top_p;
    case SamplingKind::kTopKTopP:
      return count < row.top_k && mass < row.top_p;
    default:
      return true;
  }
}

/// Gumbel noise as upstream 0.6.18 computes it (GenerateGumbelNoise): -ln 2 * log2(-log2(u *
/// (1 - 2^-23))). The factor keeps u = 1 (words within 128 of 2^32 round to 1.0f), which would
/// give +inf noise, below 1: the noise stays within [-4.5, 15.9].
FLASHINFER_HD float gumbel_noise(float u) {
  return -0.6931471806f * log2f(-log2f(u * 0x1.fffffcp-1f));
}

/// Upstream reads sampling_from_logits' logits as fp32 (its Python casts them) in vectors of
/// gcd(4, vocab) elements, and each vector draws its noise from its own cuRAND stream.
FLASHINFER_HD int gumbel_vec_width(int64_t vocab) {
  return vocab % 4 == 0 ? 4 : vocab % 2 == 0 ? 2 : 1;
}

/// The stream of the noise vector starting at element `first` (a multiple of gumbel_vec_width)
/// of output row b: subsequence b * vocab + first, which upstream computes in 32-bit arithmetic,
/// from position `offset`; element first + k takes word offset + k.
FLASHINFER_HD uint64_t gumbel_subsequence(uint64_t b, int64_t vocab, int64_t first) {
  return static_cast<uint32_t>(static_cast<uint32_t>(b) * static_cast<uint32_t>(vocab) +
                               static_cast<uint32_t>(first));
}

/// Number of 32-bit random words upstream reserves per output row when it advances its default
/// generator (rounded up to a multiple of 4 over the call): B for probs/min-p, 32 B for the
/// rejection samplers, B * vocab for Gumbel over logits.
inline constexpr uint64_t kRejectionWordsPerRow = 32;

}  // namespace flashinfer::kernels
