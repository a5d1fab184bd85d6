#include "kernels/cpu/topk_cpu.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

#include "flashinfer/float_formats.h"
#include "kernels/cpu/cpu_avx512.h"
#include "kernels/dtype_dispatch.h"

namespace flashinfer::kernels::cpu {
namespace {

// First-level histogram: the key's top kBits bits. 2^11 buckets of uint32 fit in L1 and leave,
// for a 128k-entry vocabulary of random logits, a boundary bucket of tens of keys.
constexpr int kBits = 11;
constexpr int kBuckets = 1 << kBits;

template <class T>
struct KeyOf;
template <>
struct KeyOf<float> {
  static constexpr int kKeyBits = 32;
  static uint32_t key(const float& x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return topk_key32(u);
  }
};
template <>
struct KeyOf<Half> {
  static constexpr int kKeyBits = 16;
  static uint32_t key(const Half& x) { return topk_key16(x.bits); }
};
template <>
struct KeyOf<BFloat16> {
  static constexpr int kKeyBits = 16;
  static uint32_t key(const BFloat16& x) { return topk_key16(x.bits); }
};

struct Scratch {
  std::vector<uint32_t> keys;      // the window's keys
  std::vector<uint32_t> hist;      // kWays interleaved histograms
  std::vector<int64_t> sel;        // indices of keys in buckets >= the boundary bucket
  std::vector<uint32_t> boundary;  // keys in the boundary bucket
  std::vector<std::pair<uint32_t, int64_t>> order;
};

// Increments are spread over kWays copies of the histogram: logits crowd into a few buckets,
// and consecutive increments of one counter would wait on each other through memory.
constexpr int kWays = 4;

template <class T>
void load_keys(const T* x, int64_t len, int64_t sc, uint32_t* keys) {
  if (sc == 1) {
    for (int64_t i = 0; i < len; ++i) keys[i] = KeyOf<T>::key(x[i]);
  } else {
    for (int64_t i = 0; i < len; ++i) keys[i] = KeyOf<T>::key(x[i * sc]);
  }
}

// One-pass candidate filter for k well below the row length. The keys of kSample evenly spaced
// elements give a guess g: their r-th largest with r about 4 k kSample / len + 8, so about
// 4 k + 8 len / kSample keys of the row are >= g, and fewer than k with negligible
// probability. One scan then keeps every index whose key is >= g (computing keys on the fly,
// blocks of 16 without a candidate skipped), writing its key into keys[]. When at least k keys
// are >= g, the k-th largest key and every key equal to it are among them, so selecting from the
// candidates alone is exact; otherwise (or when k is too large for a guess to pay) returns false
// and the caller runs the histogram select.
constexpr int64_t kSample = 2048;

#if FLASHINFER_CPU_AVX512
// prefilter's scan for a unit-stride fp32 row, 16 keys per step (topk_key32 in vector form).
FI_AVX512 int64_t scan_f32_avx512(const float* x, int64_t len, uint32_t g, uint32_t* keys,
                                  std::vector<int64_t>& sel) {
  const __m512i g16 = _mm512_set1_epi32(static_cast<int>(g));
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  alignas(64) uint32_t kb[16];
  int64_t j = 0;
  for (; j < len; j += 16) {
    const __mmask16 lanes =
        len - j >= 16 ? static_cast<__mmask16>(0xFFFF) : simd512::tail_mask(len - j);
    const __m512i u = _mm512_maskz_loadu_epi32(lanes, x + j);
    const __m512i neg = _mm512_srai_epi32(u, 31);
    const __m512i key = _mm512_xor_si512(u, _mm512_or_si512(neg, sign));
    __mmask16 hit = _mm512_mask_cmpge_epu32_mask(lanes, key, g16);
    if (!hit) continue;
    _mm512_store_si512(kb, key);
    for (; hit; hit = static_cast<__mmask16>(hit & (hit - 1))) {
      const int w = __builtin_ctz(hit);
      keys[j + w] = kb[w];
      sel.push_back(j + w);
    }
  }
  return static_cast<int64_t>(sel.size());
}
#endif

template <class T>
bool prefilter(const T* x, int64_t len, int64_t sc, int64_t k, uint32_t* keys, Scratch& s) {
  if (len < 4 * kSample) return false;
  const int64_t rank = (4 * k * kSample + len - 1) / len + 8;
  if (rank > kSample / 4) return false;
  s.boundary.resize(static_cast<std::size_t>(kSample));
  const int64_t step = len / kSample;
  for (int64_t i = 0; i < kSample; ++i) {
    s.boundary[static_cast<std::size_t>(i)] = KeyOf<T>::key(x[i * step * sc]);
  }
  std::nth_element(s.boundary.begin(), s.boundary.begin() + (rank - 1), s.boundary.end(),
                   std::greater<uint32_t>());
  const uint32_t g = s.boundary[static_cast<std::size_t>(rank - 1)];
  s.sel.clear();
  int64_t j = 0;
#if FLASHINFER_CPU_AVX512
  if constexpr (std::is_same_v<T, float>) {
    if (sc == 1 && use_avx512()) {
      scan_f32_avx512(x, len, g, keys, s.sel);
      j = len;
    }
  }
#endif
  if (sc == 1) {
    for (; j + 16 <= len; j += 16) {
      uint32_t kb[16];
      uint32_t any = 0;
      for (int w = 0; w < 16; ++w) {
        kb[w] = KeyOf<T>::key(x[j + w]);
        any |= static_cast<uint32_t>(kb[w] >= g);
      }
      if (!any) continue;
      for (int w = 0; w < 16; ++w) {
        if (kb[w] >= g) {
          keys[j + w] = kb[w];
          s.sel.push_back(j + w);
        }
      }
    }
  }
  for (; j < len; ++j) {
    const uint32_t key = KeyOf<T>::key(x[j * sc]);
    if (key >= g) {
      keys[j] = key;
      s.sel.push_back(j);
    }
  }
  if (static_cast<int64_t>(s.sel.size()) < k) return false;
  s.boundary.clear();
  for (int64_t c : s.sel) s.boundary.push_back(keys[c]);
  return true;
}

template <class T>
int64_t row_top_k(const TopKParams& p, int64_t r, Scratch& s) {
  using K = KeyOf<T>;
  constexpr int kShift = K::kKeyBits - kBits;
  const int64_t start = p.row_starts ? p.row_starts[r] : 0;
  const int64_t len = topk_row_length(p, r, start);
  const T* x = static_cast<const T*>(p.input) + r * p.in_stride_row + start * p.in_stride_col;
  const int64_t sc = p.in_stride_col;
  const int64_t k = p.k;
  s.sel.clear();
  s.keys.resize(static_cast<std::size_t>(len));
  uint32_t* keys = s.keys.data();

  int64_t n = 0;  // selected, in ascending index order in s.sel
  // need: rank of the k-th largest key among s.boundary (keys above every boundary key that are
  // not in it: k - need of them).
  int64_t need = k;
  if (len <= k) {
    load_keys(x, len, sc, keys);
    for (int64_t i = 0; i < len; ++i) s.sel.push_back(i);
    n = len;
  } else if (!prefilter(x, len, sc, k, keys, s)) {
    load_keys(x, len, sc, keys);
    s.sel.clear();
    s.hist.assign(static_cast<std::size_t>(kBuckets * kWays), 0);
    uint32_t* h = s.hist.data();
    int64_t i = 0;
    for (; i + kWays <= len; i += kWays) {
      for (int w = 0; w < kWays; ++w) ++h[w * kBuckets + (keys[i + w] >> kShift)];
    }
    for (; i < len; ++i) ++h[keys[i] >> kShift];
    for (int bkt = 0; bkt < kBuckets; ++bkt) {
      for (int w = 1; w < kWays; ++w) h[bkt] += h[w * kBuckets + bkt];
    }
    int64_t above = 0;  // keys in buckets above the boundary bucket
    int b = kBuckets - 1;
    for (; b > 0; --b) {
      if (above + h[b] >= k) break;
      above += h[b];
    }
    // Keys in buckets >= b are the candidates (about k plus one bucket's worth).
    const uint32_t lo = static_cast<uint32_t>(b) << kShift;
    s.boundary.clear();
    // Most blocks of 16 hold no candidate: test each block with one vectorizable reduction.
    int64_t j = 0;
    for (; j + 16 <= len; j += 16) {
      uint32_t any = 0;
      for (int w = 0; w < 16; ++w) any |= static_cast<uint32_t>(keys[j + w] >= lo);
      if (!any) continue;
      for (int w = 0; w < 16; ++w) {
        if (keys[j + w] >= lo) s.sel.push_back(j + w);
      }
    }
    for (; j < len; ++j) {
      if (keys[j] >= lo) s.sel.push_back(j);
    }
    for (int64_t j : s.sel) {
      if ((keys[j] >> kShift) == static_cast<uint32_t>(b)) s.boundary.push_back(keys[j]);
    }
    need = k - above;  // 1 <= need <= boundary.size()
  }
  if (len > k) {
    std::nth_element(s.boundary.begin(), s.boundary.begin() + (need - 1), s.boundary.end(),
                     std::greater<uint32_t>());
    const uint32_t thr = s.boundary[static_cast<std::size_t>(need - 1)];  // the k-th largest
    int64_t gt = 0, eq = 0;
    for (uint32_t key : s.boundary) {
      gt += key > thr;
      eq += key == thr;
    }
    // Of the keys equal to thr, the ones of equal-rank [skip, skip + take) are kept.
    const int64_t take = need - gt;
    const int64_t skip = p.prefer_large ? eq - take : 0;
    int64_t eq_seen = 0;
    for (int64_t j : s.sel) {
      const uint32_t key = keys[j];
      if (key > thr) {
        s.sel[static_cast<std::size_t>(n++)] = j;
      } else if (key == thr) {
        if (eq_seen >= skip && eq_seen < skip + take) s.sel[static_cast<std::size_t>(n++)] = j;
        ++eq_seen;
      }
    }
  }
  s.sel.resize(static_cast<std::size_t>(n));
  if (p.sorted && (n > 1 || k > n)) {
    // The padding of k above the row (index -1, value +0.0) is ranked as +0.0, after the row's
    // elements of that key: upstream sorts its filtered kernel's (-1, 0) padding with the row.
    s.order.clear();
    for (int64_t i : s.sel) s.order.emplace_back(keys[i], i);
    const uint32_t zero_key = K::key(T{});
    for (int64_t j = n; j < k; ++j) s.order.emplace_back(zero_key, len + j);
    std::sort(s.order.begin(), s.order.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    s.sel.resize(s.order.size());
    for (std::size_t j = 0; j < s.order.size(); ++j) {
      s.sel[j] = s.order[j].second < len ? s.order[j].second : -1;
    }
    n = k;
  }

  int64_t bad = 0;
  T* vals = static_cast<T*>(p.values);
  for (int64_t j = 0; j < k; ++j) {
    const int64_t idx = j < n ? s.sel[static_cast<std::size_t>(j)] : -1;  // -1: padding
    bad += !topk_write_index(p, r, j, idx);
    if (vals) {
      T* v = vals + r * p.val_stride_row + j * p.val_stride_col;
      if (idx >= 0) {
        *v = x[idx * sc];
      } else if (p.zero_padded_values) {
        *v = T{};
      }
    }
  }
  return bad;
}

}  // namespace

int64_t top_k(const TopKParams& p) {
  int64_t bad = 0;
  dispatch_dtype<CpuElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "top_k", "input", [&]<class T>() {
  // Rows are independent, but a team only pays off for several ms of work: a fp32 row of a
  // 128k vocabulary takes ~0.1 ms (sampled threshold), and on a loaded machine the join waits
  // for a descheduled thread far longer (measured: 16 x 128256 took 3 ms on one thread and
  // ~50 ms on two at load 13). Hence 2^22 elements (~4 ms on one thread).
#pragma omp parallel reduction(+ : bad) if (p.rows > 1 && p.rows * p.cols >= (1 << 22))
        {
          Scratch s;
#pragma omp for schedule(dynamic, 1)
          for (int64_t r = 0; r < p.rows; ++r) bad += row_top_k<T>(p, r, s);
        }
      });
  return bad;
}

}  // namespace flashinfer::kernels::cpu
