// Device helpers the MLA decode kernels share (mla_cuda.cu's and the Hopper kernel's,
// mla_sm90_kernel.cuh): which tokens of a query row a KV split takes, the empty state of a split
// that takes none, the scales with their device factors, and what the two tensor-core kernels
// (mla_decode_mma_kernel, mla_sm90_kernel) do alike: their block's rows and tokens, the tile's
// row addresses, trtllm's fp8 queries and the epilogue.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/device/fastdiv.cuh"
#include "kernels/cuda/device/mma.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/mla_shape.h"
#include "kernels/mla_params.h"

namespace flashinfer::kernels::cuda {

inline constexpr float kMlaLog2e = 1.4426950408889634f;
inline constexpr float kMlaLn2 = 0.6931471805599453f;

// The request's causal end (tokens [0, end) are visible to `row`), as in the CPU reference.
struct RowSpan {
  int32_t b;
  int64_t end;
};
__device__ __forceinline__ RowSpan row_span(const MlaAttentionParams& p, int64_t row) {
  const int32_t b = p.row_req[row];
  const int64_t qo_len = p.qo_indptr[b + 1] - p.qo_indptr[b];
  const int64_t kv_len = p.kv_lens[b];
  const int64_t pos = kv_len - qo_len + (row - p.qo_indptr[b]);
  int64_t end = kv_len;
  if (p.causal) end = pos + 1 < 0 ? 0 : (pos + 1 > kv_len ? kv_len : pos + 1);
  return {b, end};
}

// The tokens of `row` that KV split blockIdx.z takes: [begin, stop) of the row's visible range,
// split z covering [z * chunk, (z + 1) * chunk). In 32 bits: with the longest length on the host,
// begin < max_kv_len < 2^31 (the launcher leaves no split past the longest request); with it on
// the device (max_kv_dev: a CUDA graph, or the block-table calls' device plan) splits past the
// longest are normal, and (splits - 1) * chunk stays below 2^31 (mla_device_chunk of a length
// below 2^31, or 64 splits of at most 256). stop <= kv_len; stop <= begin: nothing to do (the
// kernels write the empty state the merge ignores, write_empty_state).
// b: the row's request.
struct SplitSpan {
  int32_t b, begin, stop;
};
__device__ __forceinline__ SplitSpan split_span(const MlaAttentionParams& p, int64_t row,
                                                int32_t chunk) {
  const RowSpan span = row_span(p, row);
  const int64_t begin = static_cast<int64_t>(blockIdx.z) * chunk;
  return {span.b, static_cast<int32_t>(begin), static_cast<int32_t>(min(span.end, begin + chunk))};
}

// Split blockIdx.z's state of (row, head h) when the split holds none of the row's keys: m -inf
// and l 0, which the merge weighs 0 without reading the split's output partial.
__device__ __forceinline__ void write_empty_state(const MlaAttentionParams& p, int64_t row, int h,
                                                  float* part_ml) {
  const int64_t state = (static_cast<int64_t>(blockIdx.z) * p.rows + row) * p.num_heads + h;
  part_ml[2 * state] = -INFINITY;
  part_ml[2 * state + 1] = 0.0f;
}

// sm_scale and out_scale with their device factors (MlaAttentionParams::*_dev), once a block,
// after pdl_wait (a kernel before this one may have written them).
__device__ __forceinline__ float mla_sm_scale(const MlaAttentionParams& p) {
  return p.sm_scale_dev != nullptr ? p.sm_scale * *p.sm_scale_dev : p.sm_scale;
}
__device__ __forceinline__ float mla_out_scale(const MlaAttentionParams& p) {
  return p.out_scale_dev != nullptr ? p.out_scale * *p.out_scale_dev : p.out_scale;
}

// ---- the tensor-core kernels' blocks ----------------------------------------------------------

/// The dtypes of a tensor-core MLA kernel instance: T the MMA's operand and output type (fp16 or
/// bf16), TQ the query's (T, or uint8_t for trtllm's e4m3 queries with a bf16 output), TKV the
/// cache's (T, or uint8_t for an e4m3 / e5m2 cache, widened to T exactly); and the 16-byte units
/// of a stored cache row (fp8: 16 dims each) and of its ckv part.
template <class T, class TQ, class TKV>
struct MlaMmaDtypes {
  static constexpr bool kFp8 = sizeof(TKV) == 1, kFp8Q = sizeof(TQ) == 1;
  static_assert(kFp8 || std::is_same_v<TKV, T>, "a cache of the MMA's type or fp8");
  static_assert(kFp8Q ? kFp8 && std::is_same_v<T, __nv_bfloat16> : std::is_same_v<TQ, T>,
                "an fp8 query (trtllm's e4m3) comes with an fp8 cache and a bf16 output");
  static constexpr int kUS = kFp8 ? mla::kMmaUnits / 2 : mla::kMmaUnits;
  static constexpr int kCkvUS = kFp8 ? mla::kMmaCkvUnits / 2 : mla::kMmaCkvUnits;
};

/// What a tensor-core MLA block works on: one query row and up to 64 of its heads as the MMA
/// rows, or for calls of 32 heads or fewer the heads of `pack` consecutive query rows of one
/// request (mla_mma_pack: MTP and causal chunks share the cache tiles), the block of a pack's
/// first row taking them; and the tokens its KV split gives those rows: [begin, stop_r) for row
/// r, stop growing with the row (a causal request's later queries see more; else all the same).
/// The tiles run to the last row's stop; tiles past the first row's stop test each score against
/// its row's (mla_mma_row_stop).
struct MlaMmaBlock {
  int64_t row;                      // the block's (first) query row
  int heads, pack, rows_here;       // heads a row; rows packed, of which this block has
  int h0, n_valid;                  // the first head; MMA rows in use (>= 1)
  int32_t begin, stop_first, stop;  // the split's tokens, of the first row and of the last
  int n_tiles;                      // tiles of tokens, to `stop`
  const int32_t* pages;             // the request's page ids
  // MMA row m: query row row + m / heads and head m % heads when packed, else row and head h0 + m.
  __device__ __forceinline__ int64_t qrow_of(int m) const {
    return pack > 1 ? row + m / heads : row;
  }
  __device__ __forceinline__ int head_of(int m) const { return pack > 1 ? m % heads : h0 + m; }
};

/// Sets up this block of a tensor-core MLA kernel (`kThreads` threads, tiles of `kTile` tokens;
/// grid rows x head groups x splits), pdl_wait included. False: the block returns at once
/// (block-uniform, before any barrier): a row of a request the device-side plan refused, a row
/// inside a pack (its first row's block takes it), or a split past every row's keys, whose empty
/// states it writes first. `chunk` becomes the device one where the longest length is on the
/// device (mla_device_chunk).
template <int kThreads, int kTile>
__device__ __forceinline__ bool mla_mma_block(const MlaAttentionParams& p, int32_t& chunk,
                                              float* part_o, float* part_ml, MlaMmaBlock& blk) {
  blk.heads = p.num_heads;
  blk.pack = mla::mla_mma_pack(blk.heads);
  blk.row = blockIdx.x;
  pdl_wait();
  if (p.row_req[blk.row] < 0) return false;
  blk.rows_here = 1;
  if (blk.pack > 1) {
    const int32_t b = p.row_req[blk.row];
    const int64_t i = blk.row - p.qo_indptr[b];
    if (i % blk.pack != 0) return false;
    blk.rows_here =
        static_cast<int>(min(static_cast<int64_t>(blk.pack), p.qo_indptr[b + 1] - blk.row));
  }
  blk.h0 = blk.pack > 1 ? 0 : static_cast<int>(blockIdx.y) * mla::kMmaRows;
  blk.n_valid = blk.pack > 1 ? blk.rows_here * blk.heads : min(mla::kMmaRows, blk.heads - blk.h0);
  if (p.max_kv_dev != nullptr) {
    chunk = static_cast<int32_t>(mla::mla_device_chunk(*p.max_kv_dev, gridDim.z, kTile, chunk));
  }
  const SplitSpan first = split_span(p, blk.row, chunk);
  blk.begin = first.begin;
  blk.stop_first = first.stop;
  blk.stop =
      blk.rows_here > 1 ? split_span(p, blk.row + blk.rows_here - 1, chunk).stop : blk.stop_first;
  if (part_o != nullptr && blk.stop <= blk.begin) {  // past every row's keys: the empty states
    for (int m = static_cast<int>(threadIdx.x); m < blk.n_valid; m += kThreads) {
      write_empty_state(p, blk.qrow_of(m), blk.head_of(m), part_ml);
    }
    return false;
  }
  blk.n_tiles = blk.stop > blk.begin ? (blk.stop - blk.begin + kTile - 1) / kTile : 0;
  blk.pages = p.kv_indices + p.kv_indptr[first.b];
  return true;
}

/// The end of MMA row m's tokens (its own split stop when packed, else the block's).
__device__ __forceinline__ int32_t mla_mma_row_stop(const MlaAttentionParams& p,
                                                    const MlaMmaBlock& blk, int32_t chunk, int m) {
  return blk.pack > 1 && m < blk.n_valid ? split_span(p, blk.qrow_of(m), chunk).stop
                                         : blk.stop_first;
}

/// The row addresses of a tile's tokens, one token a thread (tid < kTile), cached in shared
/// memory (c_off: ckv, k_off: kpe; the bases themselves at or past `stop`, whose copies read
/// nothing). mla_tile_page loads the token's page id (0 past the end), its one global load: the
/// kernels load it an iteration ahead, so that its latency (an L2 trip a tile at page size 1)
/// hides behind a tile's math; mla_tile_rows writes the addresses from it.
template <int kTile>
__device__ __forceinline__ int32_t mla_tile_page(const MlaMmaBlock& blk, dev::FastDivmod page_size,
                                                 int tile, int tid) {
  if (tile >= blk.n_tiles || tid >= kTile) return 0;
  const int32_t t = blk.begin + tile * kTile + tid;
  return t < blk.stop ? blk.pages[page_size.div(static_cast<uint32_t>(t))] : 0;
}
/// `a_off` (the tensor-core kernel's fp8 instances; nullptr elsewhere): where p.ckv_scale_arr is
/// set, the address of each token's row of scales (dim_ckv / 128 floats at cache row
/// page * page_size + slot).
template <int kTile, class TKV>
__device__ __forceinline__ void mla_tile_rows(const MlaAttentionParams& p, const MlaMmaBlock& blk,
                                              dev::FastDivmod page_size, int tile, int32_t page,
                                              int tid, int64_t* c_off, int64_t* k_off,
                                              int64_t* a_off = nullptr) {
  if (tile >= blk.n_tiles || tid >= kTile) return;
  const int32_t t = blk.begin + tile * kTile + tid;
  // A row past the end keeps the bases (its copies are zero-fills that read nothing).
  int64_t co = 0, ko = 0, ao = reinterpret_cast<int64_t>(p.ckv_scale_arr);
  if (t < blk.stop) {
    uint32_t pg = 0, sl = 0;
    page_size.divmod(static_cast<uint32_t>(t), pg, sl);
    const int64_t id = page;
    constexpr int64_t kBytes = sizeof(TKV);
    co = (id * p.ckv_stride_page + static_cast<int64_t>(sl) * p.ckv_stride_token) * kBytes;
    ko = (id * p.kpe_stride_page + static_cast<int64_t>(sl) * p.kpe_stride_token) * kBytes;
    if (p.ckv_scale_arr != nullptr) {
      const int64_t row = id * p.page_size + static_cast<int64_t>(sl);
      ao += row * (p.dim_ckv / 128) * static_cast<int64_t>(sizeof(float));
    }
  }
  c_off[tid] = co + reinterpret_cast<int64_t>(p.ckv);
  k_off[tid] = ko + reinterpret_cast<int64_t>(p.kpe);
  if (a_off != nullptr) a_off[tid] = ao;
}

/// trtllm's fp8 queries (e4m3 or e5m2 as p.q_dtype says): the block's MMA rows as 36 16-byte
/// units of 16 values (32 of q_nope, 4 of q_pe), `kThreads` threads; put(r, c, x, e5m2) widens
/// unit c of row r, zero(r, c) zeroes it for rows past the last in use.
template <int kThreads, class Put, class Zero>
__device__ __forceinline__ void mla_fp8_query_units(const MlaAttentionParams& p,
                                                    const MlaMmaBlock& blk, Put put, Zero zero) {
  const auto* qn = static_cast<const uint8_t*>(p.q_nope);
  const auto* qp = static_cast<const uint8_t*>(p.q_pe);
  constexpr int kU8 = mla::kMmaUnits / 2, kCkv8 = mla::kMmaCkvUnits / 2;
  const bool e5m2 = p.q_dtype == DType::kFloat8E5M2;
#pragma unroll 1
  for (int i = static_cast<int>(threadIdx.x); i < mla::kMmaRows * kU8; i += kThreads) {
    const int r = i / kU8, c = i % kU8;
    if (r < blk.n_valid) {
      const int64_t qr = blk.qrow_of(r);
      const int h = blk.head_of(r);
      const uint8_t* src = c < kCkv8
                               ? qn + qr * p.qn_stride_n + h * p.qn_stride_h + c * 16
                               : qp + qr * p.qp_stride_n + h * p.qp_stride_h + (c - kCkv8) * 16;
      put(r, c, *reinterpret_cast<const uint4*>(src), e5m2);
    } else {
      zero(r, c);
    }
  }
}

/// The epilogue of a thread's two MMA rows, row0 + gid and row0 + gid + 8 (row0: its warp's
/// first), over kDimBlocks blocks of 8 output dims from dim0 (the thread's first: its dims are
/// dim0 + 8 n + {0, 1}): o(n, e) is accumulator value e (row e >> 1, column e & 1) of block n;
/// m, l the rows' softmax state (l still a thread's part: summed over the row's 4 threads here).
/// One split: the output (nothing visible, or no finite score: l == 0, out 0 and LSE -inf, the
/// CPU rule) and, by the threads with `writes_state`, the LSE; split partials: the unnormalized
/// o for mla_merge_kernel and, by those threads, (m, l).
template <class T, int kDimBlocks, class O>
__device__ __forceinline__ void mla_mma_store(const MlaAttentionParams& p, const MlaMmaBlock& blk,
                                              int row0, int gid, int tid4, int dim0,
                                              bool writes_state, const float (&m)[2],
                                              const float (&l)[2], float* part_o, float* part_ml,
                                              O o) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float lr = l[r];
    lr += __shfl_xor_sync(0xffffffffu, lr, 1);
    lr += __shfl_xor_sync(0xffffffffu, lr, 2);
    const int mr = row0 + gid + 8 * r;  // the MMA row
    if (mr >= blk.n_valid) continue;
    const int64_t qr = blk.qrow_of(mr);
    const int h = blk.head_of(mr);
    if (part_o == nullptr) {
      const bool empty = lr == 0.0f;
      const float f = empty ? 0.0f : mla_out_scale(p) * p.ckv_scale / lr;
      T* dst = static_cast<T*>(p.o) + qr * p.o_stride_n + h * p.o_stride_h + dim0;
#pragma unroll
      for (int n = 0; n < kDimBlocks; ++n) {
        *reinterpret_cast<uint32_t*>(dst + n * 8) =
            dev::mma::pack2<T>(empty ? 0.0f : o(n, 2 * r) * f, empty ? 0.0f : o(n, 2 * r + 1) * f);
      }
      if (p.lse != nullptr && writes_state && tid4 == 0) {
        float v = empty ? -INFINITY : m[r] + log2f(lr);
        if (p.lse_base_e) v *= kMlaLn2;
        p.lse[qr * p.lse_stride_n + h * p.lse_stride_h] = v;
      }
    } else {
      const int64_t state = (static_cast<int64_t>(blockIdx.z) * p.rows + qr) * p.num_heads + h;
      float* dst = part_o + state * mla::kMmaCkv + dim0;
#pragma unroll
      for (int n = 0; n < kDimBlocks; ++n) {
        *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o(n, 2 * r), o(n, 2 * r + 1));
      }
      if (writes_state && tid4 == 0) {
        part_ml[2 * state] = m[r];
        part_ml[2 * state + 1] = lr;
      }
    }
  }
}

}  // namespace flashinfer::kernels::cuda
