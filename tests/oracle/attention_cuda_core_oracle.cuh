// Test oracle: the first-draft CUDA-core attention kernel, as it ran correctly on an H100
// (shared/gpu, 2026-11-24/25) before the library's decode kernel was rebuilt on the device
// library. It loads element by element and keeps fp32 tiles: slow, simple, and a second
// independent GPU implementation to compare the library's kernels with
// (tests/ops/test_decode_oracle.cpp). Not part of the library.
#pragma once

#include "kernels/cuda/attention_cuda_common.cuh"

namespace flashinfer::kernels::cuda::oracle {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;  // packed (query, group head) rows
constexpr int kTile = 32;                             // keys per tile: one per lane

// Block (work item, kv head, row chunk). Rows are packed: row r is query qo_begin + r / group of
// qo head g * group + r % group, so the K/V tile staged in shared memory serves every head of
// the group. Each warp owns kRowsPerWarp rows; lane t scores key t of the tile, then every lane
// accumulates head_dim / 32 output dims.
template <class TQ, class TKV, class TO, int DQK, int DVO>
__global__ void __launch_bounds__(kWarps * 32) attention_cuda_core_kernel(AttentionParams p) {
  extern __shared__ float smem[];
  float* q_s = smem;                       // [kRowsPerBlock][DQK]
  float* k_s = q_s + kRowsPerBlock * DQK;  // [kTile][DQK + 1] (padded: no bank conflicts)
  float* v_s = k_s + kTile * (DQK + 1);    // [kTile][DVO]
  pdl_wait();
  const WorkItem w = p.work[blockIdx.x];
  if (w.request < 0) return;  // padding block of a CUDA-graph grid
  const int32_t g = blockIdx.y;
  const int32_t group = p.num_qo_heads / p.num_kv_heads;
  const int32_t rows = (w.qo_end - w.qo_begin) * group;
  const int32_t row0 = blockIdx.z * kRowsPerBlock;
  if (row0 >= rows) return;
  const int32_t b = w.request;
  const int64_t q_base = p.qo_indptr[b];
  const int64_t qo_len = p.qo_indptr[b + 1] - q_base;
  const int64_t kv_len = p.kv_lens[b];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  for (int idx = threadIdx.x; idx < kRowsPerBlock * DQK; idx += blockDim.x) {
    const int r = idx / DQK, d = idx % DQK;
    const int32_t pr = row0 + r;
    float x = 0.0f;
    if (pr < rows) {
      const int64_t qi = w.qo_begin + pr / group;
      const int32_t h = g * group + pr % group;
      x = to_f32(static_cast<const TQ*>(p.q)[(q_base + qi) * p.q_stride_n + h * p.q_stride_h + d]);
    }
    q_s[idx] = x;
  }

  constexpr int kDv = (DVO + 31) / 32;  // DVO a multiple of 16: the last slice may be half
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kDv], scale[kRowsPerWarp];
  int64_t qi_of[kRowsPerWarp];
  bool nan_row[kRowsPerWarp];  // a visible score was NaN: the row is NaN (as upstream)
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k) {
    nan_row[k] = false;
    m[k] = -INFINITY;
    l[k] = 0.0f;
#pragma unroll
    for (int c = 0; c < kDv; ++c) acc[k][c] = 0.0f;
    const int32_t pr = row0 + warp + kWarps * k;
    const int32_t h = g * group + pr % group;
    qi_of[k] = w.qo_begin + pr / group;
    float sc = p.sm_scale;
    if (p.scale_q) sc *= p.scale_q[h];
    if (p.scale_k) sc *= p.scale_k[g];
    scale[k] = sc;
  }
  const TKV* kbase = static_cast<const TKV*>(p.kv.k) + g * p.kv.k_stride_head;
  const TKV* vbase = static_cast<const TKV*>(p.kv.v) + g * p.kv.v_stride_head;

  // Keys this block can see at all: causal caps the end, a sliding window the start.
  int64_t kv_lo = w.kv_begin, kv_hi = w.kv_end;
  if (!p.custom_mask) {
    const int32_t last_row = min(rows, row0 + kRowsPerBlock) - 1;
    const int64_t pos_min = kv_len - qo_len + w.qo_begin + row0 / group;
    const int64_t pos_max = kv_len - qo_len + w.qo_begin + last_row / group;
    if (p.causal) kv_hi = min(kv_hi, pos_max + 1);
    if (p.window_left >= 0) kv_lo = max(kv_lo, pos_min - p.window_left);
  }

  for (int64_t t0 = kv_lo; t0 < kv_hi; t0 += kTile) {
    __syncthreads();  // previous tile fully consumed (and q_s written on the first pass)
    for (int idx = threadIdx.x; idx < kTile * DQK; idx += blockDim.x) {
      const int t = idx / DQK, d = idx % DQK;
      const int64_t tok = t0 + t;
      k_s[t * (DQK + 1) + d] =
          tok < kv_hi ? to_f32(kbase[kv_offset(p.kv, b, tok, false) + d]) : 0.0f;
    }
    for (int idx = threadIdx.x; idx < kTile * DVO; idx += blockDim.x) {
      const int t = idx / DVO, d = idx % DVO;
      const int64_t tok = t0 + t;
      v_s[idx] = tok < kv_hi ? to_f32(vbase[kv_offset(p.kv, b, tok, true) + d]) : 0.0f;
    }
    __syncthreads();
    const int64_t kj = t0 + lane;
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) {
      const int32_t lr = warp + kWarps * k;
      if (row0 + lr >= rows) continue;  // warp-uniform
      const float* qr = q_s + lr * DQK;
      const float* kr = k_s + lane * (DQK + 1);
      float dot = 0.0f;
#pragma unroll 8
      for (int d = 0; d < DQK; ++d) dot += qr[d] * kr[d];
      const bool vis = kj < kv_hi && key_visible(p, b, qo_len, kv_len, qi_of[k], kj);
      float s = vis ? logit_log2(p, dot, scale[k]) : -INFINITY;
      if (__any_sync(0xffffffffu, isnan(s))) nan_row[k] = true;  // warp-uniform
      if (isnan(s)) s = -INFINITY;
      float tmax = s;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
      if (tmax == -INFINITY) continue;  // nothing visible in this tile (warp-uniform)
      const float m_new = fmaxf(m[k], tmax);
      const float factor = exp2f(m[k] - m_new);
      const float pj = vis ? exp2f(s - m_new) : 0.0f;
      l[k] = l[k] * factor + warp_reduce_sum(pj);
      m[k] = m_new;
#pragma unroll
      for (int c = 0; c < kDv; ++c) acc[k][c] *= factor;
      for (int t = 0; t < kTile; ++t) {
        const float pt = __shfl_sync(0xffffffffu, pj, t);
        if (pt == 0.0f) continue;  // warp-uniform
#pragma unroll
        for (int c = 0; c < kDv; ++c) {
          if (DVO % 32 == 0 || lane + 32 * c < DVO) acc[k][c] += pt * v_s[t * DVO + lane + 32 * c];
        }
      }
    }
  }

#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k) {
    const int32_t pr = row0 + warp + kWarps * k;
    if (pr >= rows) continue;
    const int32_t h = g * group + pr % group;
    const int64_t qi = qi_of[k];
    float out_scale = p.v_scale;
    if (p.scale_v) out_scale *= p.scale_v[g];
    const bool any = l[k] > 0.0f;
    float inv = any ? out_scale / l[k] : 0.0f;
    float lse = any ? m[k] + log2f(l[k]) : -INFINITY;
    if (nan_row[k]) {
      inv = NAN;
      lse = NAN;
    }
    // The sink joins once: here when the row is final, in the merge pass when it is split.
    if (p.sinks && w.partial_base < 0) {
      float f = 1.0f;
      lse = apply_sink(lse, p.sinks[h] * kLog2e, &f);
      inv *= f;
    }
    if (w.partial_base >= 0) {
      const int64_t prow = static_cast<int64_t>(w.partial_base) + (qi - w.qo_begin);
      float* dst = p.tmp_v + (prow * p.num_qo_heads + h) * DVO;
#pragma unroll
      for (int c = 0; c < kDv; ++c) {
        if (DVO % 32 == 0 || lane + 32 * c < DVO) dst[lane + 32 * c] = acc[k][c] * inv;
      }
      if (lane == 0) p.tmp_s[prow * p.num_qo_heads + h] = lse;
    } else {
      const int64_t row = q_base + qi;
      TO* dst = static_cast<TO*>(p.o) + row * p.o_stride_n + h * p.o_stride_h;
#pragma unroll
      for (int c = 0; c < kDv; ++c) {
        if (DVO % 32 == 0 || lane + 32 * c < DVO)
          dst[lane + 32 * c] = from_f32<TO>(acc[k][c] * inv);
      }
      if (lane == 0 && p.lse) p.lse[row * p.lse_stride_n + h * p.lse_stride_h] = lse;
    }
  }
  pdl_launch_dependents();
}

/// Dynamic shared memory of attention_cuda_core_kernel<..., DQK, DVO>, in bytes.
constexpr unsigned smem_bytes(int dqk, int dvo) {
  return static_cast<unsigned>(sizeof(float)) *
         static_cast<unsigned>(kRowsPerBlock * dqk + kTile * (dqk + 1) + kTile * dvo);
}

}  // namespace flashinfer::kernels::cuda::oracle
