// The tensor-core prefill attention kernel (FlashAttention-2 style, mma.sync m16n8k16, fp32
// accumulation). Block (work item, kv head, 64-row chunk): rows are packed (query, group head)
// pairs, each of the 4 warps owns 16 of them. Per K/V tile staged in shared memory: S = Q K^T on
// tensor cores, mask + soft cap + online softmax in base 2 on the S fragments, P cast to the input
// dtype, then O += P V on tensor cores. Split-KV partials go to tmp_v/tmp_s for the merge pass.
// Device code only: nvcc instantiates it for the AOT head dims (prefill_cuda.cu), NVRTC for any
// other multiple of 16 up to 256 (src/jit, attention_jit.cpp).
#pragma once

#include "kernels/cuda/attention_cuda_common.cuh"

namespace flashinfer::kernels::cuda::mma {

constexpr int kWarps = 4;
constexpr int kRows = kWarps * 16;

__device__ __forceinline__ uint16_t bits_of(__half x) { return __half_as_ushort(x); }
__device__ __forceinline__ uint16_t bits_of(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }

template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return static_cast<uint32_t>(bits_of(from_f32<T>(lo))) |
         (static_cast<uint32_t>(bits_of(from_f32<T>(hi))) << 16);
}
template <class T>
__device__ __forceinline__ uint32_t pack2(T lo, T hi) {
  return static_cast<uint32_t>(bits_of(lo)) | (static_cast<uint32_t>(bits_of(hi)) << 16);
}

// D (16x8 fp32) += A (16x16) * B (16x8), A row-major, B column-major.
template <class T>
__device__ __forceinline__ void mma16816(float* d, const uint32_t* a, const uint32_t* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (::cuda::std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  (void)d;
  (void)a;
  (void)b;
  __trap();  // never launched below sm80 (checked on the host)
#endif
}

template <class T>
__device__ __forceinline__ uint32_t ld32(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

template <class T, int D, int KV_TILE>
__global__ void __launch_bounds__(kWarps * 32) prefill_mma_kernel(AttentionParams p) {
  constexpr int kStride = D + 8;  // halves per smem row: +16 B skews rows across banks
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* q_s = reinterpret_cast<T*>(smem_raw);  // [kRows][kStride]
  T* k_s = q_s + kRows * kStride;           // [KV_TILE][kStride]
  T* v_s = k_s + KV_TILE * kStride;         // [KV_TILE][kStride]
  pdl_wait();
  const WorkItem w = p.work[blockIdx.x];
  if (w.request < 0) return;  // padding block of a CUDA-graph grid
  const int32_t g = blockIdx.y;
  const int32_t group = p.num_qo_heads / p.num_kv_heads;
  const int32_t rows = (w.qo_end - w.qo_begin) * group;
  const int32_t row0 = blockIdx.z * kRows;
  if (row0 >= rows) return;
  const int32_t b = w.request;
  const int64_t q_base = p.qo_indptr[b];
  const int64_t qo_len = p.qo_indptr[b + 1] - q_base;
  const int64_t kv_len = p.kv_lens[b];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, tid4 = lane & 3;

  for (int idx = threadIdx.x; idx < kRows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D;
    const int32_t pr = row0 + r;
    T x = from_f32<T>(0.0f);
    if (pr < rows) {
      const int64_t qi = w.qo_begin + pr / group;
      const int32_t h = g * group + pr % group;
      x = static_cast<const T*>(p.q)[(q_base + qi) * p.q_stride_n + h * p.q_stride_h + d];
    }
    q_s[r * kStride + d] = x;
  }

  // This thread's two rows (gid and gid + 8 of the warp's 16).
  int32_t pr_of[2], h_of[2];
  int64_t qi_of[2];
  bool valid[2];
  float scale[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    pr_of[e] = row0 + warp * 16 + gid + 8 * e;
    valid[e] = pr_of[e] < rows;
    h_of[e] = g * group + pr_of[e] % group;
    qi_of[e] = w.qo_begin + pr_of[e] / group;
    float sc = p.sm_scale;
    if (p.scale_q) sc *= p.scale_q[h_of[e]];
    if (p.scale_k) sc *= p.scale_k[g];
    scale[e] = sc;
  }

  // Keys this block can see at all: causal caps the end, a sliding window the start.
  // Multi-item scoring's rows hold the causal rule (key_visible): its end too; its window, like a
  // custom mask's, moves no start (the tiles stay those of the mask spelled out).
  int64_t kv_lo = w.kv_begin, kv_hi = w.kv_end;
  if (!p.custom_mask) {
    const int32_t last_row = min(rows, row0 + kRows) - 1;
    const int64_t pos_min = kv_len - qo_len + w.qo_begin + row0 / group;
    const int64_t pos_max = kv_len - qo_len + w.qo_begin + last_row / group;
    if (p.causal || p.multi_item_rows) kv_hi = min(kv_hi, pos_max + 1);
    if (p.window_left >= 0 && !p.multi_item_rows) kv_lo = max(kv_lo, pos_min - p.window_left);
  }

  float o_acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o_acc[n][0] = o_acc[n][1] = o_acc[n][2] = o_acc[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  bool nan_row[2] = {false, false};
  const T* kbase = static_cast<const T*>(p.kv.k) + g * p.kv.k_stride_head;
  const T* vbase = static_cast<const T*>(p.kv.v) + g * p.kv.v_stride_head;
  const T zero = from_f32<T>(0.0f);

  for (int64_t t0 = kv_lo; t0 < kv_hi; t0 += KV_TILE) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < KV_TILE * D; idx += blockDim.x) {
      const int t = idx / D, d = idx % D;
      const int64_t tok = t0 + t;
      // Zero-fill past the end so 0 * garbage never makes a NaN.
      k_s[t * kStride + d] = tok < kv_hi ? kbase[kv_offset(p.kv, b, tok, false) + d] : zero;
      v_s[t * kStride + d] = tok < kv_hi ? vbase[kv_offset(p.kv, b, tok, true) + d] : zero;
    }
    __syncthreads();

    float s[KV_TILE / 8][4];
#pragma unroll
    for (int n = 0; n < KV_TILE / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    const T* qw = q_s + (warp * 16) * kStride;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      a[0] = ld32(qw + gid * kStride + kk * 16 + tid4 * 2);
      a[1] = ld32(qw + (gid + 8) * kStride + kk * 16 + tid4 * 2);
      a[2] = ld32(qw + gid * kStride + kk * 16 + 8 + tid4 * 2);
      a[3] = ld32(qw + (gid + 8) * kStride + kk * 16 + 8 + tid4 * 2);
#pragma unroll
      for (int n = 0; n < KV_TILE / 8; ++n) {
        uint32_t bf[2];
        bf[0] = ld32(k_s + (n * 8 + gid) * kStride + kk * 16 + tid4 * 2);
        bf[1] = ld32(k_s + (n * 8 + gid) * kStride + kk * 16 + 8 + tid4 * 2);
        mma16816<T>(s[n], a, bf);
      }
    }

    // Mask, soft cap, base-2 logits; row maxima over the quad that shares a row.
    float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < KV_TILE / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int64_t kj = t0 + n * 8 + tid4 * 2 + (e & 1);
        const bool vis = valid[r] && kj < kv_hi && key_visible(p, b, qo_len, kv_len, qi_of[r], kj);
        s[n][e] = vis ? logit_log2(p, s[n][e], scale[r]) : -INFINITY;
        if (isnan(s[n][e])) {  // a NaN score makes the row NaN (as upstream), reported at the end
          nan_row[r] = true;
          s[n][e] = -INFINITY;
        }
        tmax[r] = fmaxf(tmax[r], s[n][e]);
      }
    }
    float factor[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
      tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
      const float m_new = fmaxf(m[r], tmax[r]);
      // m_new == -inf: nothing visible yet; keep the (zero) state, avoid -inf - -inf.
      factor[r] = m_new == -INFINITY ? 1.0f : exp2f(m[r] - m_new);
      m[r] = m_new;
    }
#pragma unroll
    for (int n = 0; n < KV_TILE / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        s[n][e] = s[n][e] == -INFINITY ? 0.0f : exp2f(s[n][e] - m[r]);
      }
    }
    // Per-thread partial row sums: the quad shares m, so they are summed once at the end.
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] *= factor[r];
#pragma unroll
    for (int n = 0; n < KV_TILE / 8; ++n) {
      l[0] += s[n][0] + s[n][1];
      l[1] += s[n][2] + s[n][3];
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o_acc[n][0] *= factor[0];
      o_acc[n][1] *= factor[0];
      o_acc[n][2] *= factor[1];
      o_acc[n][3] *= factor[1];
    }
    // O += P V: the S accumulator layout of key blocks 2j, 2j+1 is the A operand layout.
#pragma unroll
    for (int j = 0; j < KV_TILE / 16; ++j) {
      uint32_t a[4];
      a[0] = pack2<T>(s[2 * j][0], s[2 * j][1]);
      a[1] = pack2<T>(s[2 * j][2], s[2 * j][3]);
      a[2] = pack2<T>(s[2 * j + 1][0], s[2 * j + 1][1]);
      a[3] = pack2<T>(s[2 * j + 1][2], s[2 * j + 1][3]);
      const T* v0 = v_s + (j * 16 + tid4 * 2) * kStride;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const int col = n * 8 + gid;
        uint32_t bf[2];
        bf[0] = pack2<T>(v0[col], v0[kStride + col]);
        bf[1] = pack2<T>(v0[8 * kStride + col], v0[9 * kStride + col]);
        mma16816<T>(o_acc[n], a, bf);
      }
    }
  }

  float out_scale = p.v_scale;
  if (p.scale_v) out_scale *= p.scale_v[g];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    int nan_any = nan_row[r] ? 1 : 0;
    nan_any |= __shfl_xor_sync(0xffffffffu, nan_any, 1);
    nan_any |= __shfl_xor_sync(0xffffffffu, nan_any, 2);
    nan_row[r] = nan_any != 0;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!valid[r]) continue;
    const bool any = l[r] > 0.0f;
    const float inv = nan_row[r] ? NAN : (any ? out_scale / l[r] : 0.0f);
    const float lse = nan_row[r] ? NAN : (any ? m[r] + log2f(l[r]) : -INFINITY);
    const int32_t h = h_of[r];
    if (w.partial_base >= 0) {
      const int64_t prow = static_cast<int64_t>(w.partial_base) + (qi_of[r] - w.qo_begin);
      float* dst = p.tmp_v + (prow * p.num_qo_heads + h) * D;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        dst[n * 8 + tid4 * 2] = o_acc[n][2 * r] * inv;
        dst[n * 8 + tid4 * 2 + 1] = o_acc[n][2 * r + 1] * inv;
      }
      if (tid4 == 0) p.tmp_s[prow * p.num_qo_heads + h] = lse;
    } else {
      const int64_t row = q_base + qi_of[r];
      T* dst = static_cast<T*>(p.o) + row * p.o_stride_n + h * p.o_stride_h;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        dst[n * 8 + tid4 * 2] = from_f32<T>(o_acc[n][2 * r] * inv);
        dst[n * 8 + tid4 * 2 + 1] = from_f32<T>(o_acc[n][2 * r + 1] * inv);
      }
      if (tid4 == 0 && p.lse) p.lse[row * p.lse_stride_n + h * p.lse_stride_h] = lse_out(p, lse);
    }
  }
  pdl_launch_dependents();
}

/// K/V keys per tile for head dim D: bounds registers for the S and O fragments.
constexpr int kv_tile(int d) { return d <= 128 ? 64 : 32; }

/// Dynamic shared memory of prefill_mma_kernel<T, D, kv_tile(D)> for 2-byte T, in bytes.
constexpr unsigned smem_bytes(int d) {
  return 2u * static_cast<unsigned>((d + 8) * (kRows + 2 * kv_tile(d)));
}

}  // namespace flashinfer::kernels::cuda::mma
