// Top-k on CUDA: one block per row. The k-th largest key is found exactly by a radix select
// over the order-preserving keys (kernels/topk_params.h), 8 bits per pass from the top, with a
// shared-memory histogram; a final pass writes the selected elements in ascending index order
// (one block-wide prefix sum per tile gives each its output slot), taking equal-to-boundary
// elements from the small or the large index end exactly as the CPU reference does. Sorted
// output: the selected (key, index) pairs go to a scratch buffer and a second kernel ranks them
// (descending key, ascending index), so both backends give bit-identical results.
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/topk_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kTopkThreads = 512;

template <class T>
struct Key;
template <>
struct Key<float> {
  static constexpr int kBits = 32;
  __device__ static uint32_t of(float x) { return topk_key32(__float_as_uint(x)); }
};
template <>
struct Key<__half> {
  static constexpr int kBits = 16;
  __device__ static uint32_t of(__half x) { return topk_key16(__half_as_ushort(x)); }
};
template <>
struct Key<__nv_bfloat16> {
  static constexpr int kBits = 16;
  __device__ static uint32_t of(__nv_bfloat16 x) { return topk_key16(__bfloat16_as_ushort(x)); }
};

struct SelectShared {
  unsigned int hist[256];
  uint32_t prefix;
  long long remaining;
  long long eq_total;
};

template <class T>
__device__ void write_slot(const TopKParams& p, int64_t r, int64_t j, int64_t idx, const T* x) {
  topk_write_index(p, r, j, idx);
  if (p.values != nullptr) {
    T* v = static_cast<T*>(p.values) + r * p.val_stride_row + j * p.val_stride_col;
    if (idx >= 0) {
      *v = x[idx * p.in_stride_col];
    } else if (p.zero_padded_values) {
      *v = T(0.0f);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kTopkThreads) topk_kernel(TopKParams p) {
  using K = Key<T>;
  using Scan = cub::BlockScan<unsigned long long, kTopkThreads>;
  __shared__ SelectShared s;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ unsigned long long tile_total;
  const int64_t r = blockIdx.x;
  const int tid = threadIdx.x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  const int64_t start = p.row_starts ? p.row_starts[r] : 0;
  const int64_t st = start < 0 ? 0 : (start > p.cols ? p.cols : start);
  const int64_t len = topk_row_length(p, r, st);
  const T* x = static_cast<const T*>(p.input) + r * p.in_stride_row + st * p.in_stride_col;
  const int64_t sc = p.in_stride_col;
  const int64_t k = p.k;

  // Boundary: keys > thr are all taken; of the eq_total keys == thr, the ones with equal-rank
  // in [skip, skip + take) are taken.
  uint32_t thr = 0;
  long long take = len, skip = 0;
  if (len > k) {
    if (tid == 0) {
      s.prefix = 0;
      s.remaining = k;
    }
    uint32_t mask = 0;
    for (int shift = K::kBits - 8; shift >= 0; shift -= 8) {
      for (int i = tid; i < 256; i += kTopkThreads) s.hist[i] = 0;
      __syncthreads();
      const uint32_t prefix = s.prefix;
      for (int64_t i = tid; i < len; i += kTopkThreads) {
        const uint32_t key = K::of(x[i * sc]);
        if ((key & mask) == prefix) atomicAdd(&s.hist[(key >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (tid == 0) {
        long long above = 0;
        int d = 255;
        for (; d > 0; --d) {
          if (above + s.hist[d] >= s.remaining) break;
          above += s.hist[d];
        }
        s.remaining -= above;
        s.prefix = prefix | (static_cast<uint32_t>(d) << shift);
        s.eq_total = s.hist[d];
      }
      mask |= 255u << shift;
      __syncthreads();
    }
    thr = s.prefix;
    take = s.remaining;
    skip = p.prefer_large ? s.eq_total - take : 0;
  }

  // Ordered compaction: slot = (gt before) + clamp((eq before) - skip, 0, take). The scan packs
  // the two counts in one 64-bit sum (gt in the high half).
  unsigned long long running = 0;
  unsigned long long* scratch = static_cast<unsigned long long*>(p.sort_scratch);
  for (int64_t base = 0; base < len; base += kTopkThreads) {
    const int64_t i = base + tid;
    uint32_t key = 0;
    bool gt = false, eq = false;
    if (i < len) {
      key = K::of(x[i * sc]);
      if (len > k) {
        gt = key > thr;
        eq = key == thr;
      } else {
        gt = true;  // the whole window is selected
      }
    }
    const unsigned long long flag =
        (static_cast<unsigned long long>(gt) << 32) | static_cast<unsigned long long>(eq);
    unsigned long long before;
    Scan(scan_tmp).ExclusiveSum(flag, before);
    if (tid == kTopkThreads - 1) tile_total = before + flag;
    before += running;
    const long long gt_before = static_cast<long long>(before >> 32);
    const long long eq_before = static_cast<long long>(before & 0xFFFFFFFFull);
    const bool take_it = gt || (eq && eq_before >= skip && eq_before < skip + take);
    if (take_it) {
      long long e = eq_before - skip;
      e = e < 0 ? 0 : (e > take ? take : e);
      const int64_t slot = gt_before + e;
      if (p.sorted) {
        scratch[r * k + slot] = (static_cast<unsigned long long>(key) << 32) |
                                (0xFFFFFFFFull - static_cast<unsigned long long>(i));
      } else {
        write_slot(p, r, slot, i, x);
      }
    }
    __syncthreads();
    running += tile_total;
    __syncthreads();
  }
  // Padding (a window shorter than k). Sorted (top_k only), the padding's pairs rank as +0.0
  // after the row's elements of that key (low words below 2^31, every real one's above).
  for (int64_t j = len + tid; j < k; j += kTopkThreads) {
    if (p.sorted) {
      scratch[r * k + j] = (static_cast<unsigned long long>(K::of(T(0.0f))) << 32) |
                           static_cast<unsigned long long>(k - 1 - j);
    } else {
      write_slot(p, r, j, -1, x);
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Ranks row r's k scratch pairs: descending (key, -index), i.e. descending values with equal
// values by ascending index. Every pair is distinct, so the ranks are a permutation. A pair
// whose low word is below 2^31 is padding (k above the row: top_k accepts it, as upstream).
template <class T>
__global__ void __launch_bounds__(kTopkThreads) topk_sort_kernel(TopKParams p) {
  extern __shared__ unsigned long long pairs[];
  const int64_t r = blockIdx.x;
  const int64_t k = p.k;
  const unsigned long long* src = static_cast<const unsigned long long*>(p.sort_scratch) + r * k;
  const bool in_smem = k * 8 <= 48 * 1024;
  if (in_smem) {
    for (int64_t j = threadIdx.x; j < k; j += kTopkThreads) pairs[j] = src[j];
    __syncthreads();
  }
  // Clamped as topk_kernel clamps it, so the two read the same columns.
  const int64_t start0 = p.row_starts ? p.row_starts[r] : 0;
  const int64_t start = start0 < 0 ? 0 : (start0 > p.cols ? p.cols : start0);
  const T* x = static_cast<const T*>(p.input) + r * p.in_stride_row + start * p.in_stride_col;
  // One loop a memory space: through `in_smem ? pairs : src` every read of the k^2 comparisons
  // was a generic LD.E.64, not LDS.64 (or LDG.E.64 from the scratch).
  auto rank_all = [&](const unsigned long long* a) {
    for (int64_t j = threadIdx.x; j < k; j += kTopkThreads) {
      const unsigned long long me = a[j];
      int64_t rank = 0;
      for (int64_t t = 0; t < k; ++t) rank += a[t] > me;
      const unsigned long long low = me & 0xFFFFFFFFull;
      const int64_t idx = low >= 0x80000000ull ? static_cast<int64_t>(0xFFFFFFFFull - low) : -1;
      write_slot(p, r, rank, idx, x);
    }
  };
  if (in_smem) {
    rank_all(pairs);
  } else {
    rank_all(src);
  }
}

}  // namespace

void top_k(const TopKParams& p, void* stream, bool enable_pdl) {
  if (p.rows == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "top_k", "input", [&]<class T>() {
        launch_kernel("top_k", topk_kernel<T>, dim3(static_cast<unsigned>(p.rows)),
                      dim3(kTopkThreads), 0, s, enable_pdl, p);
        if (p.sorted) {
          // Only top_k sorts (whole rows; k may exceed them).
          const std::size_t smem = p.k * 8 <= 48 * 1024 ? static_cast<std::size_t>(p.k) * 8 : 0;
          launch_kernel("top_k", topk_sort_kernel<T>, dim3(static_cast<unsigned>(p.rows)),
                        dim3(kTopkThreads), smem, s, false, p);
        }
      });
}

}  // namespace flashinfer::kernels::cuda
