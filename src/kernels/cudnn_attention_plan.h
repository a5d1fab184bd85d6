// Private, plain C++ (no CUDA or cuDNN headers): how a cudnn_batch_prefill_with_kv_cache or
// cudnn_batch_decode_with_kv_cache call becomes the tensors of a cuDNN SDPA forward graph over a
// paged K/V cache, the small index arrays the graph reads on the device, and the key of the
// cuDNN attention backend's graph cache (kernels/cuda/attention_cudnn.cpp). Pure functions, so
// the CPU tests check them exactly.
//
// The graph is upstream's (flashinfer/cudnn/prefill.py, _build_prefill_graph): 4-D [b, h, s, d]
// tensors; Q and O as views of the packed [rows, H, D] tensors, whose request b starts at a
// ragged offset (qo_indptr[b] rows, in elements); K and V as the page containers
// [pages, Hkv, page_size, D] read through a page table [b, 1, blocks, 1]; a padding mask from
// the per-request lengths; causal masks aligned bottom-right (the last query sees every key),
// as this library's causal attention is; Stats (fp32 [b, Hq, s, 1]) written straight into the
// [rows, Hq] lse through its own ragged offsets. Decode is the same graph with one query per
// request and plain batch strides instead of ragged offsets.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "flashinfer/dtype.h"
#include "kernels/key_hash.h"

namespace flashinfer::kernels::dnn {

/// A problem as the graph sees it: everything but the data (pointers, lengths, page ids).
/// Strides are in elements.
struct SdpaProblem {
  int64_t batch = 0, hq = 0, hkv = 0, d = 0;
  int64_t max_s_q = 1, max_s_kv = 0;  // the graph's sequence extents (the API's maxima)
  int64_t num_pages = 0, page_size = 0;
  int64_t q_stride_n = 0, q_stride_h = 0;                       // q [rows, Hq, D]
  int64_t o_stride_n = 0, o_stride_h = 0;                       // out [rows, Hq, D]
  int64_t k_stride_page = 0, k_stride_h = 0, k_stride_row = 0;  // [pages, Hkv, page_size, D]
  int64_t v_stride_page = 0, v_stride_h = 0, v_stride_row = 0;
  int64_t lse_stride_n = 0, lse_stride_h = 0;  // lse [rows, Hq] (stats only)
  bool ragged = true;  // prefill: request b's rows start at qo_indptr[b]; decode: row b
  bool causal = false;
  bool stats = false;              // write the log-sum-exp
  DType dtype = DType::kBFloat16;  // q, k, v and out
  float scale = 1.0f;              // folded into the graph (attn_scale)
};

/// Page-table columns of the graph: enough blocks for max_s_kv keys.
constexpr int64_t sdpa_table_cols(const SdpaProblem& p) {
  return p.page_size > 0 ? (p.max_s_kv + p.page_size - 1) / p.page_size : 0;
}

/// One tensor of the graph: 4-D dims and strides (elements).
struct Tensor4d {
  std::array<int64_t, 4> dims{}, strides{};
  friend bool operator==(const Tensor4d&, const Tensor4d&) = default;
};

/// The graph's tensors. `lens` is the layout of seq_len_q and seq_len_kv ([b, 1, 1, 1] int32),
/// `offsets` that of every ragged offset ([b + 1, 1, 1, 1] int32, only when ragged).
struct SdpaTensors {
  Tensor4d q, k, v, o, stats, table, lens, offsets;
  friend bool operator==(const SdpaTensors&, const SdpaTensors&) = default;
};

inline SdpaTensors sdpa_tensors(const SdpaProblem& p) {
  SdpaTensors t;
  const int64_t b = p.batch, s = p.max_s_q;
  // With ragged offsets cuDNN finds each request's first row through them and never steps the
  // batch stride; it is given the dense value. Without (decode, one row per request), request
  // b is row b.
  const auto rows = [&](int64_t h, int64_t d, int64_t stride_n, int64_t stride_h) {
    Tensor4d r;
    r.dims = {b, h, s, d};
    r.strides = {p.ragged ? s * stride_n : stride_n, stride_h, stride_n, 1};
    return r;
  };
  t.q = rows(p.hq, p.d, p.q_stride_n, p.q_stride_h);
  t.o = rows(p.hq, p.d, p.o_stride_n, p.o_stride_h);
  if (p.stats) t.stats = rows(p.hq, 1, p.lse_stride_n, p.lse_stride_h);
  t.k.dims = {p.num_pages, p.hkv, p.page_size, p.d};
  t.k.strides = {p.k_stride_page, p.k_stride_h, p.k_stride_row, 1};
  t.v.dims = {p.num_pages, p.hkv, p.page_size, p.d};
  t.v.strides = {p.v_stride_page, p.v_stride_h, p.v_stride_row, 1};
  const int64_t cols = sdpa_table_cols(p);
  t.table.dims = {b, 1, cols, 1};
  t.table.strides = {cols, cols, 1, 1};
  t.lens.dims = {b, 1, 1, 1};
  t.lens.strides = {1, 1, 1, 1};
  if (p.ragged) {
    t.offsets.dims = {b + 1, 1, 1, 1};
    t.offsets.strides = {1, 1, 1, 1};
  }
  return t;
}

/// The graph cache's key: everything the graph and its execution plan depend on, and nothing
/// that varies between calls of one shape (data pointers, lengths, page ids).
struct SdpaGraphKey {
  int device = 0;
  SdpaTensors t;
  int64_t max_s_kv = 0;
  DType dtype = DType::kBFloat16;
  uint32_t scale_bits = 0;
  bool ragged = true, causal = false, stats = false;
  friend bool operator==(const SdpaGraphKey&, const SdpaGraphKey&) = default;
};

inline SdpaGraphKey make_sdpa_key(int device, const SdpaProblem& p) {
  SdpaGraphKey key;
  key.device = device;
  key.t = sdpa_tensors(p);
  key.max_s_kv = p.max_s_kv;
  key.dtype = p.dtype;
  key.scale_bits = std::bit_cast<uint32_t>(p.scale);
  key.ragged = p.ragged;
  key.causal = p.causal;
  key.stats = p.stats;
  return key;
}

struct SdpaGraphKeyHash {
  std::size_t operator()(const SdpaGraphKey& key) const {
    KeyHasher hasher;
    for (const Tensor4d* x : {&key.t.q, &key.t.k, &key.t.v, &key.t.o, &key.t.stats, &key.t.table,
                              &key.t.lens, &key.t.offsets}) {
      for (int i = 0; i < 4; ++i) {
        hasher.mix(static_cast<uint64_t>(x->dims[i]));
        hasher.mix(static_cast<uint64_t>(x->strides[i]));
      }
    }
    hasher.mix(static_cast<uint64_t>(key.max_s_kv));
    hasher.mix((uint64_t{key.scale_bits} << 32) | static_cast<uint32_t>(key.device));
    hasher.mix((static_cast<uint64_t>(key.dtype) << 8) | (uint64_t{key.ragged} << 2) |
               (uint64_t{key.causal} << 1) | uint64_t{key.stats});
    return hasher.value();
  }
};

/// Tensor ids of the graph (cuDNN's variant pack is keyed by them).
enum SdpaUid : int64_t {
  kSdpaQ = 1,
  kSdpaK,
  kSdpaV,
  kSdpaO,
  kSdpaStats,
  kSdpaSeqLenQ,
  kSdpaSeqLenKv,
  kSdpaTableK,
  kSdpaTableV,
  kSdpaOffsetQ,
  kSdpaOffsetO,
  kSdpaOffsetStats,
};

/// Where the index arrays lie in the int32 block copied to the device ahead of cuDNN's
/// workspace (int32 elements from its start; each array 16-byte aligned), and the block's bytes
/// (a multiple of 256, so cuDNN's workspace after it stays 256-byte aligned).
struct SdpaIndexLayout {
  int64_t seq_len_q = 0, seq_len_kv = 0, table = 0;
  int64_t offset_q = 0, offset_o = 0, offset_stats = 0;  // ragged only
  int64_t ints = 0;                                      // int32 elements in use
  int64_t bytes = 0;                                     // the block's size
};

inline SdpaIndexLayout sdpa_index_layout(const SdpaProblem& p) {
  SdpaIndexLayout l;
  int64_t at = 0;
  const auto take = [&at](int64_t n) {
    const int64_t start = at;
    at = (at + n + 3) / 4 * 4;  // 16 bytes
    return start;
  };
  l.seq_len_q = take(p.batch);
  l.seq_len_kv = take(p.batch);
  l.table = take(p.batch * sdpa_table_cols(p));
  if (p.ragged) {
    l.offset_q = take(p.batch + 1);
    l.offset_o = take(p.batch + 1);
    if (p.stats) l.offset_stats = take(p.batch + 1);
  }
  l.ints = at;
  l.bytes = (at * 4 + 255) / 256 * 256;
  return l;
}

/// Fills `out` (resized to layout.ints) with the index arrays of one call: the lengths, the
/// page table (request b's first ceil(lens_kv[b] / page_size) entries of `table`, a
/// row-major [batch, table_cols] host copy of the caller's, then page 0: cuDNN may fetch table
/// entries past a request's keys, which the caller's table need not hold valid) and, when
/// ragged, the element offsets of each request's first row of q, out and lse (qo_indptr[b]
/// times the row stride, b in [0, batch]). False, leaving `out` unspecified, when an offset
/// does not fit int32 (the call then does not fit the graph).
inline bool sdpa_index_values(const SdpaProblem& p, const SdpaIndexLayout& l,
                              const std::vector<int32_t>& lens_q,
                              const std::vector<int32_t>& lens_kv,
                              const std::vector<int32_t>& qo_indptr, const int32_t* table,
                              int64_t table_cols, std::vector<int32_t>& out) {
  out.assign(static_cast<std::size_t>(l.ints), 0);
  const int64_t cols = sdpa_table_cols(p);
  for (int64_t b = 0; b < p.batch; ++b) {
    out[l.seq_len_q + b] = lens_q[b];
    out[l.seq_len_kv + b] = lens_kv[b];
    const int64_t blocks = (lens_kv[b] + p.page_size - 1) / p.page_size;
    for (int64_t i = 0; i < blocks && i < cols && i < table_cols; ++i) {
      out[l.table + b * cols + i] = table[b * table_cols + i];
    }
  }
  if (!p.ragged) return true;
  const auto fill = [&](int64_t at, int64_t stride) {
    for (int64_t b = 0; b <= p.batch; ++b) {
      const int64_t v = int64_t{qo_indptr[b]} * stride;
      if (v > INT32_MAX) return false;
      out[at + b] = static_cast<int32_t>(v);
    }
    return true;
  };
  return fill(l.offset_q, p.q_stride_n) && fill(l.offset_o, p.o_stride_n) &&
         (!p.stats || fill(l.offset_stats, p.lse_stride_n));
}

/// The SDPA implementation of cuDNN's frontend a graph is described with: the frontend's own
/// choice (the unified one where its support surface allows, else the composite one), or the
/// composite one.
enum class SdpaImplementation : uint8_t { kAuto, kComposite };

/// The implementation to describe the graph with after one with `failed` did not build: the
/// composite one once after the frontend's choice, whose unified graphs some libraries fail to
/// build (cuDNN 9.15-9.20, non-causal paged graphs) where the composite ones build; none after
/// the composite one, or when the frontend found no implementation at all while describing the
/// graph (`described` false: it had checked the composite one's support surface too). None:
/// the call declines, and runs another backend.
inline std::optional<SdpaImplementation> sdpa_retry_implementation(SdpaImplementation failed,
                                                                   bool described) {
  if (!described || failed == SdpaImplementation::kComposite) return std::nullopt;
  return SdpaImplementation::kComposite;
}

}  // namespace flashinfer::kernels::dnn
