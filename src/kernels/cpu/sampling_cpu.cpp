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
#include "kernels/dtype_dispatch.h"

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
// p_j passes the filter j is the answer; otherwise the candidates shrink to those above p_j, or
// above the midpoint between p_j and `high` (the smallest value known to pass) when that
// midpoint also fails. Every round removes j, so the loop ends within vocab rounds.
int64_t rejection_sample(const float* p, int64_t n, SamplingKind kind, const SamplingRow& row,
                         PhiloxStream& rng) {
  float low = 0.0f, high = 1.0f, q = 1.0f;
  for (;;) {
    const float u = rng.next_uniform() * q;
    const int64_t j = inverse_cdf(p, n, low, u);
    if (j < 0) return -1;
    const float pivot0 = p[j];
    const float pivot1 = (pivot0 + high) * 0.5f;
    int64_t count0 = 0, count1 = 0;
    float mass0 = 0.0f, mass1 = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      const float v = p[i];
      if (v > pivot0) {
        ++count0;
        mass0 += v;
      }
      if (v > pivot1) {
        ++count1;
        mass1 += v;
      }
    }
    if (filter_accepts(kind, row, count0, mass0)) return j;
    if (filter_accepts(kind, row, count1, mass1)) {
      low = pivot0;
      high = pivot1;
      q = mass0;
    } else if (pivot1 > pivot0) {
      low = pivot1;
      q = mass1;
    } else {  // only with unnormalized input (p_j above 1): still drop j
      low = pivot0;
      q = mass0;
    }
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

// Gumbel-max: element i uses the (offset + i)-th word of the row's stream. Returns the first
// index of the maximum score, or -1 when no score is above -inf (no finite logit).
int64_t gumbel_sample(const float* x, int64_t n, PhiloxStream& rng) {
  float best = -std::numeric_limits<float>::infinity();
  int64_t idx = -1;
  for (int64_t i = 0; i < n; ++i) {
    const float u = rng.next_uniform();
    const float s = x[i] + gumbel_noise(u);
    if (s != s) continue;
    if (idx < 0 || s > best) {
      best = s;
      idx = i;
    }
  }
  return best > -std::numeric_limits<float>::infinity() ? idx : -1;
}

void write_sample(const SamplingParams& p, int64_t b, int64_t tok) {
  const int64_t v = tok >= 0 ? tok : 0;
  if (p.out_dtype == DType::kInt64) {
    static_cast<int64_t*>(p.samples)[b] = v;
  } else {
    static_cast<int32_t*>(p.samples)[b] = static_cast<int32_t>(v);
  }
  p.valid[b] = tok >= 0;
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
      const SamplingRow& row = p.rows[b];
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
          tok = gumbel_sample(buf.data(), n, rng);
          break;
      }
      write_sample(p, b, tok);
    }
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
      const SamplingRow& row = p.rows[b];
      load_row(p.input, p.in_dtype, row.src_row, p.in_stride_row, n, p.in_stride_col, x.data());
      for (int64_t i = 0; i < n; ++i) {
        keys[i] = ordered_key(x[i]);
        w[i] = x[i] > 0.0f ? x[i] : 0.0f;
      }
      const uint32_t t = p.kind == FilterKind::kTopPRenorm
                             ? mass_threshold(keys.data(), w.data(), n, row.top_p, pairs)
                             : count_threshold(keys.data(), n, row.top_k, tmp);
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
      if (p.kind == FilterKind::kTopKMask) {
        const float neg_inf = -std::numeric_limits<float>::infinity();
        store_row([&](int64_t i) { return keys[i] != 0u && keys[i] >= t ? x[i] : neg_inf; });
        continue;
      }
      float sum = 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        if (keys[i] != 0u && keys[i] >= t) sum += w[i];
      }
      store_row([&](int64_t i) {
        return keys[i] != 0u && keys[i] >= t && sum > 0.0f ? w[i] / sum : 0.0f;
      });
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
      const SamplingRow& row = p.rows[b];
      load_row(p.logits, p.dtype, row.src_row, p.in_stride_row, n, p.in_stride_col, y.data());
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < n; ++i) {
        y[i] = y[i] / row.temperature;
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
