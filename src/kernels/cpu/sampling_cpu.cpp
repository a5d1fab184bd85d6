#include "kernels/cpu/sampling_cpu.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"
#include "kernels/cpu/elem_io.h"
#include "kernels/dtype_dispatch.h"
#include "kernels/sampling_rules.h"

namespace flashinfer::kernels::cpu {
namespace {

template <class T>
float load_one(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return *p;
  } else {
    return p->to_float();
  }
}

template <class T>
void load_row_t(const void* base, int64_t first, int64_t n, int64_t stride, float* dst) {
  const T* x = static_cast<const T*>(base) + first;
  for (int64_t i = 0; i < n; ++i) dst[i] = load_one(x + i * stride);
}

// Reads n elements (input row `row`) into fp32.
void load_row(const void* base, DType dtype, int64_t row, int64_t stride_row, int64_t n,
              int64_t stride_col, float* dst) {
  const int64_t first = row * stride_row;
  dispatch_dtype<CpuElements, kFloat32, kFloat16, kBFloat16>(
      dtype, "sampling", "input",
      [&]<class T>() { load_row_t<T>(base, first, n, stride_col, dst); });
}

// Inverse CDF over the tokens with p > low: the first index whose running sum exceeds u, else
// the last such token (rounding left the sum at or below u), else -1 (no such token).
int64_t inverse_cdf(const float* p, int64_t n, float low, float u) {
  float c = 0.0f;
  int64_t last = -1;
  for (int64_t i = 0; i < n; ++i) {
    const float v = p[i];
    if (!(v > low)) continue;
    c += v;
    last = i;
    if (c > u) return i;
  }
  return last;
}

// Dual-pivot rejection sampling (no sort). Each round samples j among tokens above `low`; if
// p_j passes the filter j is the answer; otherwise the window narrows by pivot_round
// (kernels/sampling_rules.h, the CUDA kernel's rule too). Every round removes j, so the loop ends
// within vocab rounds.
int64_t rejection_sample(const float* p, int64_t n, SamplingKind kind, const SamplingRow& row,
                         PhiloxStream& rng) {
  PivotWindow w;
  for (;;) {
    const float u = rng.next_uniform() * w.q;
    const int64_t j = inverse_cdf(p, n, w.low, u);
    if (j < 0) return -1;
    const float pivot0 = p[j];
    const float pivot1 = second_pivot(pivot0, w.high);
    PivotCounts c;
    for (int64_t i = 0; i < n; ++i) {
      const float v = p[i];
      if (v > pivot0) {
        ++c.count0;
        c.mass0 += v;
      }
      if (v > pivot1) {
        ++c.count1;
        c.mass1 += v;
      }
    }
    if (pivot_round(kind, row, pivot0, pivot1, c, w)) return j;
  }
}

int64_t min_p_sample(const float* p, int64_t n, float min_p, PhiloxStream& rng) {
  float max_p = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max_p = std::fmax(max_p, p[i]);
  if (!(max_p > 0.0f)) return -1;
  const float thr = min_p * max_p;
  float q = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] >= thr && p[i] > 0.0f) q += p[i];
  }
  const float u = rng.next_uniform() * q;
  float c = 0.0f;
  int64_t last = -1;
  for (int64_t i = 0; i < n; ++i) {
    const float v = p[i];
    if (!(v >= thr && v > 0.0f)) continue;
    c += v;
    last = i;
    if (c > u) return i;
  }
  return last;
}

// Gumbel-max with upstream's noise (gumbel_vec_width, gumbel_subsequence). Returns the last
// index of the maximum score (upstream's reduction keeps the right operand on ties), or -1 when
// no score is above -inf (no finite logit).
int64_t gumbel_sample(const float* x, int64_t n, uint64_t seed, uint64_t b, uint64_t offset) {
  const int w = gumbel_vec_width(n);
  float best = -std::numeric_limits<float>::infinity();
  int64_t idx = -1;
  for (int64_t first = 0; first < n; first += w) {
    PhiloxStream rng(seed, gumbel_subsequence(b, n, first), offset);
    for (int k = 0; k < w; ++k) {
      const float s = x[first + k] + gumbel_noise(rng.next_uniform());
      if (s != s) continue;
      if (idx < 0 || s >= best) {
        best = s;
        idx = first + k;
      }
    }
  }
  return best > -std::numeric_limits<float>::infinity() ? idx : -1;
}

void write_sample(const SamplingParams& p, int64_t b, int64_t tok) {
  const int64_t v = sampling_output_token(p, sampling_src_row(p.rows, b), tok);
  if (p.out_dtype == DType::kInt64) {
    static_cast<int64_t*>(p.samples)[b] = v;
  } else {
    static_cast<int32_t*>(p.samples)[b] = static_cast<int32_t>(v);
  }
  if (p.valid) p.valid[b] = tok >= 0;
}

// The smallest key t with F(t) = sum of w over keys > t below `limit`: the filter keeps exactly
// the tokens whose key is >= t. The CUDA kernel finds t by bisection over the key space; here the
// same t comes from one descending sort: walking groups of equal keys, t moves down to a group's
// key while the mass strictly above it is below `limit` (0 when every group qualifies).
uint32_t mass_threshold(const uint32_t* keys, const float* w, int64_t n, float limit,
                        std::vector<std::pair<uint32_t, float>>& tmp) {
  tmp.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (keys[i] != 0u) tmp.emplace_back(keys[i], w[i]);
  }
  std::sort(tmp.begin(), tmp.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  float above = 0.0f;
  uint32_t t = 0xFFFFFFFFu;
  for (std::size_t g = 0; g < tmp.size();) {
    if (!(above < limit)) return t;
    t = tmp[g].first;
    for (; g < tmp.size() && tmp[g].first == t; ++g) above += tmp[g].second;
  }
  return above < limit ? 0u : t;
}

// For top-k the bisection's answer is the k-th largest key (0 when fewer than k numbers). Found
// by a radix select: a histogram of the keys' top 11 bits picks the bucket holding the k-th
// largest, and nth_element runs over that bucket's keys only (a full-row nth_element costs
// several times more at a 128k vocabulary).
uint32_t count_threshold(const uint32_t* keys, int64_t n, int64_t k, std::vector<uint32_t>& tmp) {
  constexpr int kBits = 11, kShift = 32 - kBits;
  uint32_t hist[1 << kBits] = {};
  int64_t nonzero = 0;
  for (int64_t i = 0; i < n; ++i) {
    ++hist[keys[i] >> kShift];
    nonzero += keys[i] != 0u;
  }
  if (k > nonzero) return 0u;
  // Key 0 (NaN) never counts; it lives in bucket 0, which the walk reaches last.
  hist[0] -= static_cast<uint32_t>(n - nonzero);
  int64_t above = 0;
  int b = (1 << kBits) - 1;
  for (; b > 0; --b) {
    if (above + hist[b] >= k) break;
    above += hist[b];
  }
  tmp.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (keys[i] != 0u && static_cast<int>(keys[i] >> kShift) == b) tmp.push_back(keys[i]);
  }
  const int64_t need = k - above;
  std::nth_element(tmp.begin(), tmp.begin() + (need - 1), tmp.end(), std::greater<uint32_t>());
  return tmp[static_cast<std::size_t>(need - 1)];
}

}  // namespace

void sample(const SamplingParams& p) {
  const int64_t n = p.vocab;
#pragma omp parallel if (p.batch > 1 && p.batch * n >= (1 << 16))
  {
    std::vector<float> buf(static_cast<std::size_t>(n));
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < p.batch; ++b) {
      const SamplingRow row = sampling_row(p.rows, b);
      load_row(p.input, p.dtype, row.src_row, p.in_stride_row, n, p.in_stride_col, buf.data());
      PhiloxStream rng(row.seed, static_cast<uint64_t>(b), row.offset);
      int64_t tok = -1;
      switch (p.kind) {
        case SamplingKind::kProbs:
          tok = inverse_cdf(buf.data(), n, 0.0f, rng.next_uniform());
          break;
        case SamplingKind::kTopK:
        case SamplingKind::kTopP:
        case SamplingKind::kTopKTopP:
          tok = rejection_sample(buf.data(), n, p.kind, row, rng);
          break;
        case SamplingKind::kMinP:
          tok = min_p_sample(buf.data(), n, row.min_p, rng);
          break;
        case SamplingKind::kLogits:
          tok = gumbel_sample(buf.data(), n, row.seed, static_cast<uint64_t>(b), row.offset);
          break;
      }
      write_sample(p, b, tok);
    }
  }
}

namespace {

// Scratch of one thread of sample_top_k_first_from_logits.
struct TopKFirstScratch {
  std::vector<float> x;         // the row in fp32 (when it is not a unit-stride fp32 row)
  std::vector<uint32_t> keys;   // ordered_key of every element
  std::vector<uint32_t> hist;   // kWays interleaved histograms of the keys' top bits
  std::vector<int64_t> cand;    // indices in buckets >= the boundary bucket, ascending
  std::vector<uint32_t> bound;  // keys in the boundary bucket
  std::vector<int64_t> kept;    // kept indices, ascending
  std::vector<float> prob;      // their probabilities (or the full row in the fallback)
};

constexpr int kSelBits = 11, kSelShift = 32 - kSelBits, kSelBuckets = 1 << kSelBits;
constexpr int kWays = 4;  // interleaved histogram copies: increments of one counter don't chain

// count_threshold's answer (the k-th largest nonzero key, or 0 when fewer than k nonzero keys)
// from a histogram pass and a scan that skips blocks without a candidate; fills s.cand with
// every index whose key is in the boundary bucket or above.
uint32_t kth_key(const uint32_t* keys, int64_t n, int64_t k, TopKFirstScratch& s) {
  s.hist.assign(static_cast<std::size_t>(kSelBuckets * kWays), 0u);
  uint32_t* h = s.hist.data();
  int64_t i = 0;
  for (; i + kWays <= n; i += kWays) {
    for (int w = 0; w < kWays; ++w) ++h[w * kSelBuckets + (keys[i + w] >> kSelShift)];
  }
  for (; i < n; ++i) ++h[keys[i] >> kSelShift];
  for (int b = 0; b < kSelBuckets; ++b) {
    for (int w = 1; w < kWays; ++w) h[b] += h[w * kSelBuckets + b];
  }
  // Key 0 (NaN) never counts; bucket 0 also holds the smallest numbers' keys.
  int64_t zeros = 0;
  for (int64_t j = 0; j < n; ++j) zeros += keys[j] == 0u;
  s.cand.clear();
  if (k > n - zeros) {
    for (int64_t j = 0; j < n; ++j) {
      if (keys[j] != 0u) s.cand.push_back(j);
    }
    return 0u;
  }
  h[0] -= static_cast<uint32_t>(zeros);
  int64_t above = 0;
  int b = kSelBuckets - 1;
  for (; b > 0; --b) {
    if (above + h[b] >= k) break;
    above += h[b];
  }
  const uint32_t lo = std::max<uint32_t>(static_cast<uint32_t>(b) << kSelShift, 1u);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    uint32_t any = 0;
    for (int w = 0; w < 16; ++w) any |= static_cast<uint32_t>(keys[j + w] >= lo);
    if (!any) continue;
    for (int w = 0; w < 16; ++w) {
      if (keys[j + w] >= lo) s.cand.push_back(j + w);
    }
  }
  for (; j < n; ++j) {
    if (keys[j] >= lo) s.cand.push_back(j);
  }
  s.bound.clear();
  for (int64_t c : s.cand) {
    if (static_cast<int>(keys[c] >> kSelShift) == b) s.bound.push_back(keys[c]);
  }
  const int64_t need = k - above;
  std::nth_element(s.bound.begin(), s.bound.begin() + (need - 1), s.bound.end(),
                   std::greater<uint32_t>());
  return s.bound[static_cast<std::size_t>(need - 1)];
}

// kth_key in one pass for k well below n (the idea of top_k's prefilter, topk_cpu.cpp): the
// (4 k kSample / n + 8)-th largest key of kSample evenly spaced elements is a guess g (at least
// 1: NaN never counts); one scan keeps the indices with key >= g in s.cand (keys[] written for
// them only). When at least k keys pass, the k-th largest nonzero key and every key above it are
// among them, so *t is exact; otherwise returns false and kth_key runs.
bool sampled_kth_key(const float* x, int64_t n, int64_t k, uint32_t* keys, TopKFirstScratch& s,
                     uint32_t* t) {
  constexpr int64_t kSample = 2048;
  if (n < 4 * kSample) return false;
  const int64_t rank = (4 * k * kSample + n - 1) / n + 8;
  if (rank > kSample / 4) return false;
  s.bound.resize(static_cast<std::size_t>(kSample));
  const int64_t step = n / kSample;
  for (int64_t i = 0; i < kSample; ++i) s.bound[i] = ordered_key(x[i * step]);
  std::nth_element(s.bound.begin(), s.bound.begin() + (rank - 1), s.bound.end(),
                   std::greater<uint32_t>());
  const uint32_t g = std::max(s.bound[static_cast<std::size_t>(rank - 1)], 1u);
  s.cand.clear();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    uint32_t kb[16];
    uint32_t any = 0;
    for (int w = 0; w < 16; ++w) {
      kb[w] = ordered_key(x[j + w]);
      any |= static_cast<uint32_t>(kb[w] >= g);
    }
    if (!any) continue;
    for (int w = 0; w < 16; ++w) {
      if (kb[w] >= g) {
        keys[j + w] = kb[w];
        s.cand.push_back(j + w);
      }
    }
  }
  for (; j < n; ++j) {
    const uint32_t key = ordered_key(x[j]);
    if (key >= g) {
      keys[j] = key;
      s.cand.push_back(j);
    }
  }
  if (static_cast<int64_t>(s.cand.size()) < k) return false;
  s.bound.clear();
  for (int64_t c : s.cand) s.bound.push_back(keys[c]);
  std::nth_element(s.bound.begin(), s.bound.begin() + (k - 1), s.bound.end(),
                   std::greater<uint32_t>());
  *t = s.bound[static_cast<std::size_t>(k - 1)];
  return true;
}

int64_t top_k_first_row(const SamplingParams& p, int64_t b, TopKFirstScratch& s) {
  const SamplingRow row = sampling_row(p.rows, b);
  const int64_t n = p.vocab;
  const float* x;
  if (p.dtype == DType::kFloat32 && p.in_stride_col == 1) {
    x = static_cast<const float*>(p.input) + row.src_row * p.in_stride_row;
  } else {
    s.x.resize(static_cast<std::size_t>(n));
    load_row(p.input, p.dtype, row.src_row, p.in_stride_row, n, p.in_stride_col, s.x.data());
    x = s.x.data();
  }
  s.keys.resize(static_cast<std::size_t>(n));
  uint32_t* keys = s.keys.data();
  uint32_t t;
  if (!sampled_kth_key(x, n, row.top_k, keys, s, &t)) {
    for (int64_t i = 0; i < n; ++i) keys[i] = ordered_key(x[i]);
    t = kth_key(keys, n, row.top_k, s);
  }
  // Kept: key nonzero and >= t (filter's kTopKMask test); all are among the candidates.
  s.kept.clear();
  for (int64_t c : s.cand) {
    if (keys[c] >= t) s.kept.push_back(c);
  }
  // softmax over the masked row: every other logit is -inf, so its exp(-inf - m) is exactly 0
  // for a finite max m and adds nothing to the sum.
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float m = neg_inf;
  const float inv_t = sampling_inv_temperature(row.temperature);
  for (int64_t i : s.kept) m = std::fmax(m, sampling_scaled_logit(x[i], inv_t));
  PhiloxStream rng(row.seed, static_cast<uint64_t>(b), row.offset);
  if (!std::isfinite(m)) {
    // Degenerate row (an infinite logit, or only -inf kept): the three passes as written.
    s.prob.resize(static_cast<std::size_t>(n));
    float* y = s.prob.data();
    std::size_t next = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool keep = next < s.kept.size() && s.kept[next] == i;
      next += keep;
      y[i] = sampling_scaled_logit(keep ? x[i] : neg_inf, inv_t);
    }
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      y[i] = std::exp(y[i] - m);
      sum += y[i];
    }
    for (int64_t i = 0; i < n; ++i)
      y[i] = elem_io::round_to(p.dtype, y[i] / sum);  // torch.softmax's dtype
    return rejection_sample(y, n, SamplingKind::kTopP, row, rng);
  }
  const std::size_t nk = s.kept.size();
  s.prob.resize(nk);
  float sum = 0.0f;
  for (std::size_t j = 0; j < nk; ++j) {
    s.prob[j] = std::exp(sampling_scaled_logit(x[s.kept[j]], inv_t) - m);
    sum += s.prob[j];
  }
  // As upstream's torch.softmax holds them: rounded to 16-bit logits' dtype.
  for (std::size_t j = 0; j < nk; ++j) s.prob[j] = elem_io::round_to(p.dtype, s.prob[j] / sum);
  // Zero probabilities never pass rejection_sample's `> low` tests, so the kept ones in index
  // order give the same draws, sums and pivots as the full row.
  const int64_t j =
      rejection_sample(s.prob.data(), static_cast<int64_t>(nk), SamplingKind::kTopP, row, rng);
  return j < 0 ? -1 : s.kept[static_cast<std::size_t>(j)];
}

}  // namespace

void sample_top_k_first_from_logits(const SamplingParams& p) {
  // A row of a 128k vocabulary takes ~0.1-0.2 ms here; as in top_k (topk_cpu.cpp), a team is
  // only worth its join on a loaded machine from ~4 ms of work.
#pragma omp parallel if (p.batch > 1 && p.batch * p.vocab >= (1 << 22))
  {
    TopKFirstScratch s;
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < p.batch; ++b) write_sample(p, b, top_k_first_row(p, b, s));
  }
}

void filter(const FilterParams& p) {
  const int64_t n = p.vocab;
#pragma omp parallel if (p.batch > 1 && p.batch * n >= (1 << 14))
  {
    std::vector<float> x(static_cast<std::size_t>(n)), w(static_cast<std::size_t>(n));
    std::vector<uint32_t> keys(static_cast<std::size_t>(n)), tmp;
    std::vector<std::pair<uint32_t, float>> pairs;
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < p.batch; ++b) {
      const SamplingRow row = sampling_row(p.rows, b);
      load_row(p.input, p.in_dtype, row.src_row, p.in_stride_row, n, p.in_stride_col, x.data());
      for (int64_t i = 0; i < n; ++i) {
        keys[i] = ordered_key(x[i]);
        w[i] = x[i] > 0.0f ? x[i] : 0.0f;
      }
      const bool by_column = filter_by_column(p.kind);
      const int64_t limit = sampling_column_limit(row.top_k, n);
      const uint32_t t = by_column ? 0u
                         : p.kind == FilterKind::kTopPRenorm
                             ? mass_threshold(keys.data(), w.data(), n, row.top_p, pairs)
                             : count_threshold(keys.data(), n, row.top_k, tmp);
      auto kept = [&](int64_t i) { return by_column ? i < limit : keys[i] != 0u && keys[i] >= t; };
      const int64_t out_base = b * p.out_stride_row;
      // One dtype dispatch per row (not per element).
      auto store_row = [&](auto&& value_of) {
        dispatch_dtype<CpuElements, kFloat32, kFloat16, kBFloat16>(
            p.out_dtype, "sampling", "out", [&]<class T>() {
              T* out = static_cast<T*>(p.out) + out_base;
              for (int64_t i = 0; i < n; ++i)
                out[i * p.out_stride_col] = from_float<T>(value_of(i));
            });
      };
      if (filter_masks(p.kind)) {
        const float neg_inf = -std::numeric_limits<float>::infinity();
        store_row([&](int64_t i) { return kept(i) ? x[i] : neg_inf; });
        continue;
      }
      float sum = 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        if (kept(i)) sum += w[i];
      }
      store_row([&](int64_t i) { return kept(i) && sum > 0.0f ? w[i] / sum : 0.0f; });
    }
  }
}

void softmax(const SoftmaxParams& p) {
  const int64_t n = p.vocab;
#pragma omp parallel if (p.batch > 1 && p.batch * n >= (1 << 15))
  {
    std::vector<float> y(static_cast<std::size_t>(n));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < p.batch; ++b) {
      const SamplingRow row = sampling_row(p.rows, b);
      load_row(p.logits, p.dtype, row.src_row, p.in_stride_row, n, p.in_stride_col, y.data());
      float m = -std::numeric_limits<float>::infinity();
      const float inv_t = sampling_inv_temperature(row.temperature);
      for (int64_t i = 0; i < n; ++i) {
        y[i] = sampling_scaled_logit(y[i], inv_t);
        m = std::fmax(m, y[i]);
      }
      float s = 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        y[i] = std::exp(y[i] - m);
        s += y[i];
      }
      float* out = p.out + b * n;
      for (int64_t i = 0; i < n; ++i) out[i] = y[i] / s;
    }
  }
}

bool has_nan(const void* data, DType dtype, int64_t rows, int64_t cols, int64_t stride_row,
             int64_t stride_col) {
  std::vector<float> buf(static_cast<std::size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    load_row(data, dtype, r, stride_row, cols, stride_col, buf.data());
    for (float v : buf) {
      if (std::isnan(v)) return true;
    }
  }
  return false;
}

}  // namespace flashinfer::kernels::cpu
