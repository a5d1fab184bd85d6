// CUDA sampling kernels, upstream's design (docs/SAMPLING.md, "CUDA kernels"): one block per
// output row; the row is read in chunks of threads x vec elements, each thread one 128-bit load
// per chunk (vec = 16 bytes / element size) when the row allows it, the loads of several chunks
// issued together (for_each_chunk); CUB block scans and reductions; inverse-transform sampling (the
// first token whose inclusive prefix sum exceeds u, no sort); top-k / top-p / joint by dual-pivot
// rejection; min-p in one max pass, one mass pass and one inverse-CDF pass; Gumbel-max over logits.
// The draws and every decision rule are the CPU reference's (src/kernels/cpu/sampling_cpu.cpp):
// Philox keyed by (seed, output row) from `offset` (kernels/philox.h), the rejection rule and the
// chunk partitioning from kernels/sampling_rules.h. CUB's block primitives have a fixed order for a
// fixed block size, so results are deterministic for fixed inputs, seed and offset; only the fp32
// summation order differs from the CPU's sequential sums.
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <type_traits>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/sampling_cuda.h"
#include "kernels/sampling_rules.h"

namespace flashinfer::kernels::cuda {
namespace {

// The samplers: 512 threads (upstream has 1024) leave each thread 128 registers, room for 8
// chunks' loads in flight (kSampleGroup) besides the rejection loop's state; at 1024 threads and
// 64 registers even 4 spilled. The block's loads in flight are the same (512 x 8 x 16 bytes),
// and its scans and reductions span 16 warps instead of 32.
constexpr int kSampleThreads = 512;
// The threshold search keeps 15 pivots and 15 partial counts or masses per thread: 512 threads
// leave it 128 registers.
constexpr int kFilterThreads = 512;
constexpr int kSoftmaxThreads = 1024;
constexpr long long kNoIndex = 0x7fffffffffffffffLL;

constexpr cub::BlockScanAlgorithm kScanAlgo = cub::BLOCK_SCAN_WARP_SCANS;
constexpr cub::BlockReduceAlgorithm kReduceAlgo = cub::BLOCK_REDUCE_WARP_REDUCTIONS;

// ---- loads and stores ----------------------------------------------------------------------

// fp32 of the 16-bit element in the low (hi = false) or high half of a 32-bit word.
template <class T>
__device__ __forceinline__ float half_word_to_f32(uint32_t w, bool hi) {
  const unsigned short bits = static_cast<unsigned short>(hi ? w >> 16 : w & 0xffffu);
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(__ushort_as_half(bits));
  } else {
    return __uint_as_float(static_cast<uint32_t>(bits) << 16);  // bf16 -> fp32 is a shift
  }
}

/// One input row: n elements at column stride `stride` (1 when VEC > 1).
template <class T, int VEC>
struct RowIn {
  const T* x;
  int64_t n;
  int64_t stride;

  __device__ __forceinline__ float at(int64_t i) const { return to_f32(x[i * stride]); }

  /// What one load of a whole vector holds: its 16 bytes, or for a scalar row (VEC 1) its one
  /// element in fp32.
  using Raw = std::conditional_t<VEC == 1, float, uint4>;

  /// The vector from `first` (a multiple of VEC, a whole vector inside the row): one 128-bit load,
  /// or one element at the column stride.
  __device__ __forceinline__ Raw load_raw(int64_t first) const {
    if constexpr (VEC == 1) {
      return at(first);
    } else {
      return *reinterpret_cast<const uint4*>(x + first);
    }
  }

  /// The VEC elements of a load_raw, in fp32.
  __device__ __forceinline__ static void widen(const Raw& raw, float (&v)[VEC]) {
    if constexpr (VEC == 1) {
      v[0] = raw;
    } else if constexpr (std::is_same_v<T, float>) {
      v[0] = __uint_as_float(raw.x);
      v[1] = __uint_as_float(raw.y);
      v[2] = __uint_as_float(raw.z);
      v[3] = __uint_as_float(raw.w);
    } else {
      const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        v[2 * k] = half_word_to_f32<T>(w[k], false);
        v[2 * k + 1] = half_word_to_f32<T>(w[k], true);
      }
    }
  }

  /// The VEC elements from `first` (a multiple of VEC); `fill` past the row's end. A full
  /// vector is one 128-bit load (rows are 16-byte aligned when VEC > 1).
  __device__ __forceinline__ void load(int64_t first, float (&v)[VEC], float fill) const {
    if constexpr (VEC > 1) {
      if (sampling_full_vector(first, n, VEC)) {
        widen(load_raw(first), v);
        return;
      }
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = first + j < n ? at(first + j) : fill;
  }
};

/// Whole chunks whose loads a thread issues together (for_each_chunk): with one 16-byte load in
/// flight a thread, every chunk of a pass waited a full L2 round trip (63 in a row for a 128256-
/// token fp32 row at 512 threads), which set the time of a pass. 8 for the reading passes (32
/// registers of loads); 4 for the passes that also convert and store (the filters' fp16 write
/// pass spilled at 8). ptxas: 0 spills for every instance, sm_80 and sm_90.
constexpr int kFilterGroup = 8;
constexpr int kSampleGroup = 8;
constexpr int kWriteGroup = 4;

/// This thread's loads of chunks [c, c + G) that are below `whole` (sampling_whole_chunks: every
/// thread's vector there is whole), issued together before any is used: 16-byte loads, or for a
/// scalar row one element each.
template <int G, int THREADS, class T, int VEC>
__device__ __forceinline__ void load_whole(const RowIn<T, VEC>& r, int64_t c, int64_t whole,
                                           typename RowIn<T, VEC>::Raw (&raw)[G]) {
#pragma unroll
  for (int u = 0; u < G; ++u) {
    raw[u] = c + u < whole ? r.load_raw(sampling_thread_first(c + u, threadIdx.x, THREADS, VEC))
                           : typename RowIn<T, VEC>::Raw{};
  }
}

/// Visits the row's chunks as `for (c = 0; c < chunks; ++c)` would, calling f(first, v) with
/// this thread's VEC elements of chunk c (`fill` past the row's end). Only the loads move: the
/// whole chunks' are issued U at a time before the first of them is visited (load_whole), so each
/// thread sees the same values in the same order as one chunk at a time and every per-thread
/// sum, count and maximum is the same. Scalar rows (VEC 1) alike, U elements in flight a thread.
/// The row's partial last chunk loads at its visit.
template <int U, int THREADS, class T, int VEC, class F>
__device__ __forceinline__ void for_each_chunk(const RowIn<T, VEC>& r, float fill, F&& f) {
  const int64_t chunks = sampling_num_chunks(r.n, THREADS, VEC);
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t whole = sampling_whole_chunks(r.n, THREADS, VEC);
  int64_t c = 0;
#pragma unroll 1
  for (; c < whole; c += U) {
    typename RowIn<T, VEC>::Raw raw[U];
    load_whole<U, THREADS>(r, c, whole, raw);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (c + u >= whole) break;  // the same in every thread
      float v[VEC];
      RowIn<T, VEC>::widen(raw[u], v);
      f(sampling_thread_first(c + u, tid, THREADS, VEC), v);
    }
  }
  c = whole;
#pragma unroll 1
  for (; c < chunks; ++c) {
    const int64_t first = sampling_thread_first(c, tid, THREADS, VEC);
    float v[VEC];
    r.load(first, v, fill);
    f(first, v);
  }
}

template <class T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (std::is_same_v<T, __half>) {
    return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(a))) |
           (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(b))) << 16);
  } else {
    return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(a))) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(b))) << 16);
  }
}

/// Stores o[0, VEC) at y[first ...]: 128-bit stores when `wide` (contiguous, 16-byte aligned
/// rows) and the vector is whole, else element by element at column stride `stride`.
template <class T, int VEC>
__device__ __forceinline__ void store(T* y, int64_t first, int64_t n, int64_t stride, bool wide,
                                      const float (&o)[VEC]) {
  if constexpr (VEC > 1) {
    if (wide && sampling_full_vector(first, n, VEC)) {
      if constexpr (std::is_same_v<T, float>) {
#pragma unroll
        for (int k = 0; k < VEC; k += 4) {
          *reinterpret_cast<float4*>(y + first + k) =
              make_float4(o[k], o[k + 1], o[k + 2], o[k + 3]);
        }
        return;
      } else if constexpr (VEC == 8) {
        *reinterpret_cast<uint4*>(y + first) = make_uint4(
            pack2<T>(o[0], o[1]), pack2<T>(o[2], o[3]), pack2<T>(o[4], o[5]), pack2<T>(o[6], o[7]));
        return;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    if (first + j < n) y[(first + j) * stride] = from_f32<T>(o[j]);
  }
}

// ---- block-wide results for every thread -----------------------------------------------------

struct SumOp {
  template <class V>
  __device__ __forceinline__ V operator()(const V& a, const V& b) const {
    return a + b;
  }
};
struct MaxF {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct MinI {
  __device__ __forceinline__ long long operator()(long long a, long long b) const {
    return a < b ? a : b;
  }
};
struct MaxI {
  __device__ __forceinline__ long long operator()(long long a, long long b) const {
    return a > b ? a : b;
  }
};

/// Count and mass above the two pivots of a rejection round.
struct PivotSums {
  float m0, m1;
  long long c0, c1;
  __device__ __forceinline__ PivotSums operator+(const PivotSums& o) const {
    return {m0 + o.m0, m1 + o.m1, c0 + o.c0, c1 + o.c1};
  }
};

/// A Gumbel score and its index (-1: none yet).
struct ScoreIndex {
  float v;
  long long i;
};
/// The larger score; the larger index among equal scores (upstream's); a real entry over none.
struct ArgMax {
  __device__ __forceinline__ ScoreIndex operator()(const ScoreIndex& a, const ScoreIndex& b) const {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    if (a.v > b.v || (a.v == b.v && a.i > b.i)) return a;  // ties: the last index, as upstream
    return b;
  }
};

/// N fp32 sums reduced together: the top-p threshold search's per-pivot masses, the inverse
/// CDF's per-chunk masses of a load group.
template <int N>
struct FloatArray {
  float v[N];
  __device__ __forceinline__ FloatArray operator+(const FloatArray& o) const {
    FloatArray r;
#pragma unroll
    for (int j = 0; j < N; ++j) r.v[j] = v[j] + o.v[j];
    return r;
  }
};
using PivotMasses = FloatArray<kThresholdPivots>;
using GroupMasses = FloatArray<kSampleGroup>;

/// Every thread's shared state: CUB's temporary storage (one primitive at a time) and a slot to
/// hand thread 0's reduction result to the block.
template <int THREADS>
struct Shared {
  union {
    typename cub::BlockScan<float, THREADS, kScanAlgo>::TempStorage scan;
    typename cub::BlockScan<long long, THREADS, kScanAlgo>::TempStorage count_scan;
    typename cub::BlockReduce<float, THREADS, kReduceAlgo>::TempStorage f;
    typename cub::BlockReduce<long long, THREADS, kReduceAlgo>::TempStorage i;
    typename cub::BlockReduce<PivotSums, THREADS, kReduceAlgo>::TempStorage pivots;
    typename cub::BlockReduce<ScoreIndex, THREADS, kReduceAlgo>::TempStorage score;
    typename cub::BlockReduce<PivotMasses, THREADS, kReduceAlgo>::TempStorage mass;
    typename cub::BlockReduce<GroupMasses, THREADS, kReduceAlgo>::TempStorage group;
  } tmp;
  union {
    float f;
    long long i;
    PivotSums pivots;
    ScoreIndex score;
    PivotMasses mass;
    GroupMasses group;
  } out;
};

template <class V>
__device__ __forceinline__ V& out_slot(auto& out) {
  if constexpr (std::is_same_v<V, float>) {
    return out.f;
  } else if constexpr (std::is_same_v<V, long long>) {
    return out.i;
  } else if constexpr (std::is_same_v<V, PivotSums>) {
    return out.pivots;
  } else if constexpr (std::is_same_v<V, ScoreIndex>) {
    return out.score;
  } else if constexpr (std::is_same_v<V, PivotMasses>) {
    return out.mass;
  } else {
    static_assert(std::is_same_v<V, GroupMasses>);
    return out.group;
  }
}

template <class V>
__device__ __forceinline__ auto& reduce_storage(auto& tmp) {
  if constexpr (std::is_same_v<V, float>) {
    return tmp.f;
  } else if constexpr (std::is_same_v<V, long long>) {
    return tmp.i;
  } else if constexpr (std::is_same_v<V, PivotSums>) {
    return tmp.pivots;
  } else if constexpr (std::is_same_v<V, ScoreIndex>) {
    return tmp.score;
  } else if constexpr (std::is_same_v<V, PivotMasses>) {
    return tmp.mass;
  } else {
    static_assert(std::is_same_v<V, GroupMasses>);
    return tmp.group;
  }
}

/// The block's reduction of v under op, in every thread. Must be reached by the whole block.
template <int THREADS, class V, class Op>
__device__ __forceinline__ V block_all(V v, Op op, Shared<THREADS>& s) {
  const V r = cub::BlockReduce<V, THREADS, kReduceAlgo>(reduce_storage<V>(s.tmp)).Reduce(v, op);
  if (threadIdx.x == 0) out_slot<V>(s.out) = r;
  __syncthreads();
  const V all = out_slot<V>(s.out);
  __syncthreads();  // the slot and the temporary storage are free again
  return all;
}

// ---- sampling --------------------------------------------------------------------------------

/// Inverse CDF over the tokens `keep` accepts: the first index whose running sum exceeds u,
/// else the last kept token, else -1. Chunks go in index order, a load group (kSampleGroup whole
/// chunks, then the row's partial last chunk alone) at a time: one block reduction gives each
/// chunk's kept mass, and only the chunk where the running sum passes u is scanned (CUB block
/// scan) for the crossing. The scan's per-token sums need not be monotone in fp32, nor agree to
/// the last bit with the reduction's total, so the first crossing is the minimum index over all
/// crossings, and a chunk where rounding leaves none adds its mass and the search goes on; when
/// no token ends above u, the last kept token is the sample (upstream's guard).
template <int THREADS, class T, int VEC, class Keep>
__device__ int64_t inverse_cdf(const RowIn<T, VEC>& r, Keep keep, float u, Shared<THREADS>& s) {
  constexpr int G = kSampleGroup;
  using Scan = cub::BlockScan<float, THREADS, kScanAlgo>;
  const int64_t chunks = sampling_num_chunks(r.n, THREADS, VEC);
  const int tid = static_cast<int>(threadIdx.x);
  float running = 0.0f;
  long long last = -1;
  // This thread's kept values of a chunk, 0 where not kept or past the row's end. Every caller's
  // `keep` accepts positive values only, so a token is kept iff its w is > 0.
  auto keep_values = [&](int64_t first, float(&w)[VEC]) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) w[j] = first + j < r.n && keep(w[j]) ? w[j] : 0.0f;
  };
  // Chunks [c, c + count), count <= G, their values from get(k, first, v): the index of the
  // crossing, or kNoIndex (the same in every thread).
  auto group = [&](int64_t c, int count, auto&& get) -> long long {
    GroupMasses part;
#pragma unroll
    for (int k = 0; k < G; ++k) {
      part.v[k] = 0.0f;
      if (k >= count) continue;
      const int64_t first = sampling_thread_first(c + k, tid, THREADS, VEC);
      float w[VEC];
      get(k, first, w);
      keep_values(first, w);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (w[j] > 0.0f) {
          part.v[k] += w[j];
          last = first + j;
        }
      }
    }
    const GroupMasses total = block_all(part, SumOp(), s);
#pragma unroll
    for (int k = 0; k < G; ++k) {
      if (k >= count) break;
      if (running + total.v[k] > u) {
        // The chunk is read again (from L2) rather than kept in registers over the reduction.
        const int64_t first = sampling_thread_first(c + k, tid, THREADS, VEC);
        float w[VEC], incl[VEC];
        r.load(first, w, 0.0f);
        keep_values(first, w);
        Scan(s.tmp.scan).InclusiveSum(w, incl);
        __syncthreads();  // the scan's storage is free again
        long long hit = kNoIndex;
#pragma unroll
        for (int j = VEC - 1; j >= 0; --j) {
          if (w[j] > 0.0f && running + incl[j] > u) hit = first + j;
        }
        hit = block_all(hit, MinI(), s);
        if (hit != kNoIndex) return hit;
      }
      running += total.v[k];
    }
    return kNoIndex;
  };
  const int64_t whole = sampling_whole_chunks(r.n, THREADS, VEC);
  int64_t c = 0;
#pragma unroll 1
  for (; c < whole; c += G) {
    typename RowIn<T, VEC>::Raw raw[G];
    load_whole<G, THREADS>(r, c, whole, raw);
    const long long hit =
        group(c, static_cast<int>(whole - c < G ? whole - c : G),
              [&](int k, int64_t, float(&v)[VEC]) { RowIn<T, VEC>::widen(raw[k], v); });
    if (hit != kNoIndex) return hit;
  }
  c = whole;
  // The row's partial last chunk.
#pragma unroll 1
  for (; c < chunks; ++c) {
    const long long hit =
        group(c, 1, [&](int, int64_t first, float(&v)[VEC]) { r.load(first, v, 0.0f); });
    if (hit != kNoIndex) return hit;
  }
  return block_all(last, MaxI(), s);
}

/// Top-k / top-p / joint sampling by dual-pivot rejection (sampling_rules.h: pivot_round).
template <int THREADS, class T, int VEC>
__device__ int64_t rejection_sample(const RowIn<T, VEC>& r, SamplingKind kind,
                                    const SamplingRow& row, uint64_t b, Shared<THREADS>& s) {
  PivotWindow w;
  for (uint64_t pos = row.offset;; ++pos) {  // one draw per round
    const float u = philox_uniform_at(row.seed, b, pos) * w.q;
    const float low = w.low;
    const int64_t j = inverse_cdf(
        r, [low](float v) { return v > low; }, u, s);
    if (j < 0) return -1;
    const float pivot0 = r.at(j);
    const float pivot1 = second_pivot(pivot0, w.high);
    // pivot0 > low >= 0, so the zero fill past the row's end never counts.
    PivotSums acc = {0.0f, 0.0f, 0, 0};
    for_each_chunk<kSampleGroup, THREADS>(r, 0.0f, [&](int64_t, const float(&v)[VEC]) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        if (v[k] > pivot0) {
          acc.m0 += v[k];
          ++acc.c0;
        }
        if (v[k] > pivot1) {
          acc.m1 += v[k];
          ++acc.c1;
        }
      }
    });
    acc = block_all(acc, SumOp(), s);
    PivotCounts counts;
    counts.count0 = acc.c0;
    counts.count1 = acc.c1;
    counts.mass0 = acc.m0;
    counts.mass1 = acc.m1;
    if (pivot_round(kind, row, pivot0, pivot1, counts, w)) return j;
  }
}

/// Min-p: keep p >= min_p * max(p), then inverse CDF over the kept mass.
template <int THREADS, class T, int VEC>
__device__ int64_t min_p_sample(const RowIn<T, VEC>& r, const SamplingRow& row, uint64_t b,
                                Shared<THREADS>& s) {
  const float min_p = row.min_p;
  float mx = -INFINITY;
  for_each_chunk<kSampleGroup, THREADS>(r, -INFINITY, [&](int64_t, const float(&v)[VEC]) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) mx = fmaxf(mx, v[k]);
  });
  mx = block_all(mx, MaxF(), s);
  if (!(mx > 0.0f)) return -1;
  const float thr = min_p * mx;
  auto keep = [thr](float v) { return v >= thr && v > 0.0f; };
  float q = 0.0f;
  for_each_chunk<kSampleGroup, THREADS>(r, 0.0f, [&](int64_t, const float(&v)[VEC]) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) q += keep(v[k]) ? v[k] : 0.0f;
  });
  q = block_all(q, SumOp(), s);
  const float u = philox_uniform_at(row.seed, b, row.offset) * q;
  return inverse_cdf(r, keep, u, s);
}

/// Gumbel-max with upstream's noise: element t adds the noise of its vector's stream
/// (gumbel_vec_width, gumbel_subsequence); the last index of the largest score, as upstream's
/// reduction gives, or -1 when no score is above -inf.
template <int THREADS, class T, int VEC>
__device__ int64_t gumbel_sample(const RowIn<T, VEC>& r, const SamplingRow& row, uint64_t b,
                                 Shared<THREADS>& s) {
  ScoreIndex best = {-INFINITY, -1};
  const int w = gumbel_vec_width(r.n);
  for_each_chunk<kSampleGroup, THREADS>(r, 0.0f, [&](int64_t first, const float(&v)[VEC]) {
    if (first >= r.n) return;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const int64_t t = first + j;
      if (t >= r.n) continue;
      const int64_t g = t - t % w;  // the noise vector's first element
      // One Philox block per element (the blocks of one vector repeat; fewer live registers than
      // keeping them: the kernel has 128 at 512 threads).
      const float u = philox_uniform_at(row.seed, gumbel_subsequence(b, r.n, g),
                                        row.offset + static_cast<uint64_t>(t - g));
      const float sc = v[j] + gumbel_noise(u);
      if (sc != sc) continue;
      if (best.i < 0 || sc >= best.v) best = {sc, t};  // ascending: keeps the last
    }
  });
  best = block_all(best, ArgMax(), s);
  return best.i >= 0 && best.v > -INFINITY ? best.i : -1;
}

template <int THREADS, class T, int VEC>
__device__ __forceinline__ void sample_row(const SamplingParams& p, Shared<THREADS>& s) {
  const uint64_t b = blockIdx.x;
  // Every thread reads the row's values (the same addresses: one broadcast load each).
  const SamplingRow row = sampling_row(p.rows, static_cast<int64_t>(b));
  const RowIn<T, VEC> r = {static_cast<const T*>(p.input) + row.src_row * p.in_stride_row, p.vocab,
                           p.in_stride_col};
  // Every thread computes the same draws (Philox keyed by seed, subsequence b, from offset).
  int64_t tok = -1;
  switch (p.kind) {
    case SamplingKind::kProbs:
      tok = inverse_cdf(
          r, [](float v) { return v > 0.0f; }, philox_uniform_at(row.seed, b, row.offset), s);
      break;
    case SamplingKind::kTopK:
    case SamplingKind::kTopP:
    case SamplingKind::kTopKTopP:
      tok = rejection_sample(r, p.kind, row, b, s);
      break;
    case SamplingKind::kMinP:
      tok = min_p_sample(r, row, b, s);
      break;
    case SamplingKind::kLogits:
      tok = gumbel_sample(r, row, b, s);
      break;
  }
  if (threadIdx.x == 0) {
    const int64_t v = sampling_output_token(p, row.src_row, tok);
    if (p.out_dtype == DType::kInt64) {
      static_cast<int64_t*>(p.samples)[b] = v;
    } else {
      static_cast<int32_t*>(p.samples)[b] = static_cast<int32_t>(v);
    }
    if (p.valid) p.valid[b] = tok >= 0;
  }
}

// Rows read with 128-bit loads (sampling_vec_width > 1).
template <class T>
__global__ void __launch_bounds__(kSampleThreads) sampling_sample_kernel(SamplingParams p) {
  __shared__ Shared<kSampleThreads> s;
  sample_row<kSampleThreads, T, 16 / sizeof(T)>(p, s);
}

// Strided or unaligned rows: scalar loads (the SASS check leaves "strided" kernels out).
template <class T>
__global__ void __launch_bounds__(kSampleThreads) sampling_strided_sample_kernel(SamplingParams p) {
  __shared__ Shared<kSampleThreads> s;
  sample_row<kSampleThreads, T, 1>(p, s);
}

// ---- filters -----------------------------------------------------------------------------------

/// The top-p threshold: the smallest key t whose mass of keys above t is below top_p (the filter
/// keeps exactly the keys >= t). A 16-way search over the 32-bit key space (sampling_rules.h:
/// threshold_pivot / threshold_narrow): at most 8 passes over the row. (Top-k's count threshold
/// is filter_threshold_radix's.)
template <int THREADS, class T, int VEC>
__device__ uint32_t filter_threshold_mass(const RowIn<T, VEC>& r, const SamplingRow& row,
                                          Shared<THREADS>& s) {
  constexpr int P = kThresholdPivots;
  const float nan = __uint_as_float(0x7fffffffu);  // key 0: never above a pivot
  uint32_t lo = 0, hi = 0xFFFFFFFFu;
  while (lo < hi) {
    uint32_t piv[P];
    PivotMasses acc;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      piv[j] = threshold_pivot(lo, hi, j, P);
      acc.v[j] = 0;
    }
    for_each_chunk<kFilterGroup, THREADS>(r, nan, [&](int64_t, const float(&v)[VEC]) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const uint32_t key = ordered_key(v[k]);
        const float w = v[k] > 0.0f ? v[k] : 0.0f;
#pragma unroll
        for (int j = 0; j < P; ++j) acc.v[j] += key > piv[j] ? w : 0.0f;
      }
    });
    acc = block_all(acc, SumOp(), s);
    int first_below = P;
#pragma unroll
    for (int j = P - 1; j >= 0; --j) {
      if (acc.v[j] < row.top_p) first_below = j;
    }
    threshold_narrow(lo, hi, first_below, P);
  }
  return lo;
}

/// The filter kernels' radix-select storage: one pass's histogram and the bin found.
struct RadixShared {
  uint32_t hist[kRadixBins];
  int bin;
  long long rest;
};

/// The count threshold (top-k: the k-th largest key, 0 with fewer keys, 0xFFFFFFFF for k <= 0;
/// the k-ary search's answer for the count test, exactly) by radix select, sampling_rules.h: per
/// pass a histogram of one digit of the keys whose higher digits are the ones chosen, then the bin
/// holding the wanted rank, found from the top by an exclusive scan of each thread's bins.
template <int THREADS, class T, int VEC>
__device__ uint32_t filter_threshold_radix(const RowIn<T, VEC>& r, const SamplingRow& row,
                                           Shared<THREADS>& s, RadixShared& rs) {
  static_assert(kRadixBins % THREADS == 0, "whole bins per thread");
  constexpr int kPer = kRadixBins / THREADS;
  if (row.top_k <= 0) return 0xFFFFFFFFu;
  const float nan = __uint_as_float(0x7fffffffu);  // key 0, as filter_threshold_mass pads
  const int tid = static_cast<int>(threadIdx.x);
  uint32_t prefix = 0, mask = 0;
  long long want = row.top_k;
  for (int pass = 0; pass < kRadixPasses; ++pass) {
    for (int i = tid; i < kRadixBins; i += THREADS) rs.hist[i] = 0;
    if (tid == 0) rs.bin = -1;
    __syncthreads();
    for_each_chunk<kFilterGroup, THREADS>(r, nan, [&](int64_t, const float(&v)[VEC]) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const int b = radix_bin(ordered_key(v[k]), pass, prefix, mask);
        if (b >= 0) atomicAdd(&rs.hist[b], 1u);
      }
    });
    __syncthreads();
    const int top = kRadixBins - kPer * tid - 1;
    long long mine = 0, above = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) mine += rs.hist[top - j];
    cub::BlockScan<long long, THREADS, kScanAlgo>(s.tmp.count_scan).ExclusiveSum(mine, above);
    int64_t rest = 0;
    const int b = radix_find(rs.hist, top, kPer, above, want, &rest);
    if (b >= 0) {  // one thread at most
      rs.bin = b;
      rs.rest = rest;
    }
    __syncthreads();
    const int bin = rs.bin;
    want = rs.rest;
    __syncthreads();         // everyone has read rs before the next pass clears it
    if (bin < 0) return 0u;  // fewer keys than k (first pass only)
    radix_fix(prefix, mask, pass, bin);
  }
  return prefix;
}

template <int THREADS, class Tin, class Tout, int VEC>
__device__ __forceinline__ void filter_row(const FilterParams& p, Shared<THREADS>& s,
                                           RadixShared& rs) {
  const int64_t b = blockIdx.x;
  const SamplingRow row = sampling_row(p.rows, b);
  const RowIn<Tin, VEC> r = {static_cast<const Tin*>(p.input) + row.src_row * p.in_stride_row,
                             p.vocab, p.in_stride_col};
  Tout* y = static_cast<Tout*>(p.out) + b * p.out_stride_row;
  const bool wide =
      VEC > 1 && p.out_stride_col == 1 &&
      sampling_vec_width(sizeof(Tout), reinterpret_cast<uint64_t>(p.out), p.out_stride_row, 1) > 1;
  // The column kinds keep a prefix of the row (sampling_column_limit): no threshold to find.
  const bool by_column = filter_by_column(p.kind);
  const int64_t limit = sampling_column_limit(row.top_k, p.vocab);
  const uint32_t t = by_column                           ? 0u
                     : p.kind == FilterKind::kTopPRenorm ? filter_threshold_mass(r, row, s)
                                                         : filter_threshold_radix(r, row, s, rs);
  auto kept = [&](int64_t col, float v) {
    const uint32_t key = ordered_key(v);
    return by_column ? col < limit : key != 0u && key >= t;
  };
  if (filter_masks(p.kind)) {
    for_each_chunk<kWriteGroup, THREADS>(r, 0.0f, [&](int64_t first, const float(&v)[VEC]) {
      float o[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] = kept(first + k, v[k]) ? v[k] : -INFINITY;
      store(y, first, r.n, p.out_stride_col, wide, o);
    });
    return;
  }
  const float nan = __uint_as_float(0x7fffffffu);
  float sum = 0.0f;
  for_each_chunk<kFilterGroup, THREADS>(r, nan, [&](int64_t first, const float(&v)[VEC]) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      if (kept(first + k, v[k]) && v[k] > 0.0f) sum += v[k];
    }
  });
  sum = block_all(sum, SumOp(), s);
  for_each_chunk<kWriteGroup, THREADS>(r, nan, [&](int64_t first, const float(&v)[VEC]) {
    float o[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float w = v[k] > 0.0f ? v[k] : 0.0f;
      o[k] = kept(first + k, v[k]) && sum > 0.0f ? w / sum : 0.0f;
    }
    store(y, first, r.n, p.out_stride_col, wide, o);
  });
}

template <class Tin, class Tout>
__global__ void __launch_bounds__(kFilterThreads) sampling_filter_kernel(FilterParams p) {
  __shared__ Shared<kFilterThreads> s;
  __shared__ RadixShared rs;
  filter_row<kFilterThreads, Tin, Tout, 16 / sizeof(Tin)>(p, s, rs);
}

template <class Tin, class Tout>
__global__ void __launch_bounds__(kFilterThreads) sampling_strided_filter_kernel(FilterParams p) {
  __shared__ Shared<kFilterThreads> s;
  __shared__ RadixShared rs;
  filter_row<kFilterThreads, Tin, Tout, 1>(p, s, rs);
}

// ---- softmax -----------------------------------------------------------------------------------

/// Running max m and sum d of exp(x - m) (online softmax); m = -inf: nothing yet.
struct MaxSum {
  float m, d;
};
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  const float da = a.m == -INFINITY ? 0.0f : a.d * expf(a.m - m);
  const float db = b.m == -INFINITY ? 0.0f : b.d * expf(b.m - m);
  return {m, da + db};
}
struct MergeOp {
  __device__ __forceinline__ MaxSum operator()(const MaxSum& a, const MaxSum& b) const {
    return merge(a, b);
  }
};

template <int THREADS>
struct SoftmaxShared {
  typename cub::BlockReduce<MaxSum, THREADS, kReduceAlgo>::TempStorage tmp;
  MaxSum out;
};

template <int THREADS, class T, int VEC>
__device__ __forceinline__ void softmax_row(const SoftmaxParams& p, SoftmaxShared<THREADS>& s) {
  const int64_t b = blockIdx.x;
  const SamplingRow row = sampling_row(p.rows, b);
  const RowIn<T, VEC> r = {static_cast<const T*>(p.logits) + row.src_row * p.in_stride_row, p.vocab,
                           p.in_stride_col};
  float* y = p.out + b * p.vocab;
  const float inv_t = sampling_inv_temperature(row.temperature);
  // One pass for the max and the sum (each thread's running pair, merged over the block), one to
  // write: the row is read twice, not three times.
  MaxSum acc = {-INFINITY, 0.0f};
  for_each_chunk<kSampleGroup, THREADS>(r, -INFINITY, [&](int64_t, const float(&v)[VEC]) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float x = sampling_scaled_logit(v[k], inv_t);
      if (x > acc.m) {  // a new maximum: rescale the sum (exp(-inf) = 0 when nothing yet)
        acc.d = acc.d * expf(acc.m - x) + 1.0f;
        acc.m = x;
      } else if (x != -INFINITY) {  // -inf adds 0; NaN makes the sum NaN, as on the CPU
        acc.d += expf(x - acc.m);
      }
    }
  });
  acc = cub::BlockReduce<MaxSum, THREADS, kReduceAlgo>(s.tmp).Reduce(acc, MergeOp());
  if (threadIdx.x == 0) s.out = acc;
  __syncthreads();
  acc = s.out;
  // fp32 output rows of `vocab` elements: 16-byte aligned when vocab is a multiple of 4.
  const bool wide = VEC > 1 && p.vocab % 4 == 0 && reinterpret_cast<uint64_t>(p.out) % 16 == 0;
  for_each_chunk<kWriteGroup, THREADS>(r, 0.0f, [&](int64_t first, const float(&v)[VEC]) {
    float o[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) o[k] = expf(sampling_scaled_logit(v[k], inv_t) - acc.m) / acc.d;
    store(y, first, r.n, 1, wide, o);
  });
}

template <class T>
__global__ void __launch_bounds__(kSoftmaxThreads) sampling_softmax_kernel(SoftmaxParams p) {
  __shared__ SoftmaxShared<kSoftmaxThreads> s;
  pdl_wait();
  softmax_row<kSoftmaxThreads, T, 16 / sizeof(T)>(p, s);
  pdl_launch_dependents();
}

template <class T>
__global__ void __launch_bounds__(kSoftmaxThreads)
    sampling_strided_softmax_kernel(SoftmaxParams p) {
  __shared__ SoftmaxShared<kSoftmaxThreads> s;
  pdl_wait();
  softmax_row<kSoftmaxThreads, T, 1>(p, s);
  pdl_launch_dependents();
}

// ---- NaN check
// -----------------------------------------------------------------------------------

template <class T>
__global__ void nan_kernel(const T* x, int64_t cols, int64_t stride_row, int64_t stride_col,
                           int32_t* flag) {
  const T* r = x + static_cast<int64_t>(blockIdx.x) * stride_row;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float v = to_f32(r[i * stride_col]);
    if (v != v) *flag = 1;  // every writer stores the same value
  }
}

void check_launch(const char* op) { FLASHINFER_CUDA_CALL(op, cudaGetLastError()); }

template <class T>
bool wide_rows(const void* base, int64_t stride_row, int64_t stride_col) {
  return sampling_vec_width(sizeof(T), reinterpret_cast<uint64_t>(base), stride_row, stride_col) >
         1;
}

}  // namespace

void sample(const SamplingParams& p, void* stream) {
  if (p.batch == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(p.batch));
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "sampling", "input", [&]<class T>() {
        if (wide_rows<T>(p.input, p.in_stride_row, p.in_stride_col)) {
          sampling_sample_kernel<T><<<grid, kSampleThreads, 0, s>>>(p);
        } else {
          sampling_strided_sample_kernel<T><<<grid, kSampleThreads, 0, s>>>(p);
        }
      });
  check_launch("sampling");
}

void filter(const FilterParams& p, void* stream) {
  if (p.batch == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(p.batch));
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.in_dtype, "sampling", "input", [&]<class Tin>() {
        const bool wide = wide_rows<Tin>(p.input, p.in_stride_row, p.in_stride_col);
        auto launch = [&]<class Tout>() {
          if (wide) {
            sampling_filter_kernel<Tin, Tout><<<grid, kFilterThreads, 0, s>>>(p);
          } else {
            sampling_strided_filter_kernel<Tin, Tout><<<grid, kFilterThreads, 0, s>>>(p);
          }
        };
        if (p.out_dtype == DType::kFloat32) {
          launch.template operator()<float>();
        } else if (p.out_dtype == p.in_dtype) {
          launch.template operator()<Tin>();
        } else {
          FLASHINFER_FAIL(ErrorCode::kUnsupported, "sampling", "out", "output dtype ",
                          dtype_torch_name(p.out_dtype), " is not supported for this input");
        }
      });
  check_launch("sampling");
}

void softmax(const SoftmaxParams& p, void* stream, bool enable_pdl) {
  if (p.batch == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "softmax", "input", [&]<class T>() {
        const dim3 grid(static_cast<unsigned>(p.batch)), block(kSoftmaxThreads);
        if (wide_rows<T>(p.logits, p.in_stride_row, p.in_stride_col)) {
          launch_kernel("softmax", sampling_softmax_kernel<T>, grid, block, 0, s, enable_pdl, p);
        } else {
          launch_kernel("softmax", sampling_strided_softmax_kernel<T>, grid, block, 0, s,
                        enable_pdl, p);
        }
      });
}

void nan_flag(const void* data, DType dtype, int64_t rows, int64_t cols, int64_t stride_row,
              int64_t stride_col, int32_t* flag, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  FLASHINFER_CUDA_CALL("check_nan", cudaMemsetAsync(flag, 0, sizeof(int32_t), s));
  if (rows == 0 || cols == 0) return;
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      dtype, "check_nan", "input", [&]<class T>() {
        nan_kernel<T><<<static_cast<unsigned>(rows), 256, 0, s>>>(static_cast<const T*>(data), cols,
                                                                  stride_row, stride_col, flag);
      });
  check_launch("check_nan");
}

void stream_synchronize(void* stream) {
  FLASHINFER_CUDA_CALL("sampling", cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

SamplingScratch sampling_scratch(int device, void* stream, std::size_t bytes) {
  static StreamScratchPool pool("scratch");
  return pool.acquire("sampling", device, stream, bytes);
}

}  // namespace flashinfer::kernels::cuda
