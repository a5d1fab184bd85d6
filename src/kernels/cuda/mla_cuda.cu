// CUDA kernels for DeepSeek MLA attention over the paged latent cache (CUDA cores, fp32
// accumulation). One block per (query row, group of up to 8 heads, KV split); one warp per head.
// The block stages kTile cache tokens (latent + rope, converted to fp32) in shared memory once
// for all its heads, so each latent row is read from global memory once per head group instead
// of once per head. Each warp keeps an online softmax (running max, running sum) and its head's
// 512-wide accumulator in registers (16 floats per lane). When the grid would leave the GPU idle
// (few rows and heads, long caches) the KV axis is split and a merge pass combines the partial
// states. Semantics are the CPU reference's (kernels/cpu/mla_cpu.cpp): the same score formula,
// empty rows give 0 and LSE -inf, the LSE in base 2 unless asked for base e.
#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/mla_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kMaxHeadsPerBlock = 8;               // warps per block, one head each
constexpr int kTile = 16;                          // cache tokens staged per step
constexpr int kCkvPerLane = 16;                    // dim_ckv <= 32 * 16 = 512 (registers)
constexpr int kMaxSplits = 64;                     // KV splits per row at most
constexpr int64_t kMinChunk = 256;                 // tokens per split at least
constexpr int64_t kMaxScratch = int64_t{1} << 28;  // bytes of split partials at most
constexpr float kLog2e = 1.4426950408889634f;

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

// Grid (rows, head groups, splits), blockDim 32 * G. Split z covers tokens [z * chunk, (z + 1)
// * chunk) of the row's visible range. part_o == nullptr: one split, the final output is written
// here; otherwise the unnormalized accumulator and (m, l) go to the partials for the merge.
template <class KV>
__global__ void __launch_bounds__(kWarp* kMaxHeadsPerBlock)
    mla_attention_kernel(MlaAttentionParams p, int64_t chunk, float* part_o, float* part_ml) {
  extern __shared__ float smem[];
  const int dc = p.dim_ckv, dk = p.dim_kpe, W = dc + dk;
  const int G = static_cast<int>(blockDim.x) / kWarp;
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  float* q_s = smem;           // [G][W]: this block's heads' queries
  float* kv_s = smem + G * W;  // [kTile][W]: the staged cache tokens
  const int64_t row = blockIdx.x;
  const int h = static_cast<int>(blockIdx.y) * G + warp;
  const bool head_ok = h < p.num_heads;
  pdl_wait();
  const RowSpan span = row_span(p, row);
  const int64_t begin = static_cast<int64_t>(blockIdx.z) * chunk;
  const int64_t stop = min(span.end, begin + chunk);

  if (head_ok) {
    float* q = q_s + warp * W;
    for (int d = lane; d < dc; d += kWarp) {
      q[d] = load_any(p.q_nope, row * p.qn_stride_n + h * p.qn_stride_h + d, p.q_dtype);
    }
    for (int d = lane; d < dk; d += kWarp) {
      q[dc + d] = load_any(p.q_pe, row * p.qp_stride_n + h * p.qp_stride_h + d, p.q_dtype);
    }
  }

  float acc[kCkvPerLane];
#pragma unroll
  for (int i = 0; i < kCkvPerLane; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const int32_t* pages = p.kv_indices + p.kv_indptr[span.b];
  const KV* ckv = static_cast<const KV*>(p.ckv);
  const KV* kpe = static_cast<const KV*>(p.kpe);

  // Every thread runs the same trip count (begin/stop are block-uniform): the barriers match.
  for (int64_t t0 = begin; t0 < stop; t0 += kTile) {
    const int n = static_cast<int>(stop - t0 < kTile ? stop - t0 : int64_t{kTile});
    __syncthreads();  // the previous tile is consumed (and, first time, q_s is written)
    for (int t = warp; t < n; t += G) {
      const int64_t tok = t0 + t;
      const int64_t page = pages[tok / p.page_size], slot = tok % p.page_size;
      const KV* cr = ckv + page * p.ckv_stride_page + slot * p.ckv_stride_token;
      const KV* kr = kpe + page * p.kpe_stride_page + slot * p.kpe_stride_token;
      float* dst = kv_s + t * W;
      for (int d = lane; d < dc; d += kWarp) dst[d] = to_f32(cr[d]);
      for (int d = lane; d < dk; d += kWarp) dst[dc + d] = to_f32(kr[d]);
    }
    __syncthreads();
    if (!head_ok) continue;
    const float* q = q_s + warp * W;
    float s[kTile];
    float tile_max = -INFINITY;
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
      s[t] = -INFINITY;
      if (t < n) {  // warp-uniform: the shuffles below see the full warp
        const float* k = kv_s + t * W;
        float a = 0.0f, c = 0.0f;
        for (int d = lane; d < dc; d += kWarp) a += q[d] * k[d];
        for (int d = lane; d < dk; d += kWarp) c += q[dc + d] * k[dc + d];
        s[t] = p.sm_scale * warp_reduce_sum(p.ckv_scale * a + p.kpe_scale * c);
        tile_max = fmaxf(tile_max, s[t]);
      }
    }
    const float m_new = fmaxf(m, tile_max);
    if (m_new == -INFINITY) continue;     // all scores -inf so far: weights stay 0 (CPU rule)
    const float alpha = expf(m - m_new);  // 0 on the first finite tile (m == -inf)
    l *= alpha;
#pragma unroll
    for (int i = 0; i < kCkvPerLane; ++i) acc[i] *= alpha;
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
      if (t < n) {
        const float w = expf(s[t] - m_new);
        l += w;
        const float* k = kv_s + t * W;
#pragma unroll
        for (int i = 0; i < kCkvPerLane; ++i) {
          const int d = lane + i * kWarp;
          if (d < dc) acc[i] += w * k[d];
        }
      }
    }
    m = m_new;
  }
  if (!head_ok) return;  // no barrier below

  if (part_o == nullptr) {
    // Nothing visible (end == 0) also leaves l == 0.
    const bool empty = l == 0.0f;
    const float f = empty ? 0.0f : p.out_scale * p.ckv_scale / l;
    const int64_t off = row * p.o_stride_n + h * p.o_stride_h;
#pragma unroll
    for (int i = 0; i < kCkvPerLane; ++i) {
      const int d = lane + i * kWarp;
      if (d < dc) store_any(p.o, off + d, p.o_dtype, empty ? 0.0f : acc[i] * f);
    }
    if (p.lse != nullptr && lane == 0) {
      float v = -INFINITY;
      if (!empty) {
        v = m + logf(l);
        if (!p.lse_base_e) v *= kLog2e;
      }
      p.lse[row * p.lse_stride_n + h * p.lse_stride_h] = v;
    }
    return;
  }
  const int64_t state = (static_cast<int64_t>(blockIdx.z) * p.rows + row) * p.num_heads + h;
  float* po = part_o + state * dc;
#pragma unroll
  for (int i = 0; i < kCkvPerLane; ++i) {
    const int d = lane + i * kWarp;
    if (d < dc) po[d] = acc[i];
  }
  if (lane == 0) {
    part_ml[2 * state] = m;
    part_ml[2 * state + 1] = l;
  }
}

// Grid (rows, heads), 128 threads: combines the splits' (m, l, acc) of one (row, head). A split
// that saw no finite score (m == -inf) weighs 0, as an all -inf row does in the CPU reference.
__global__ void mla_merge_kernel(MlaAttentionParams p, int splits, const float* part_o,
                                 const float* part_ml) {
  const int64_t row = blockIdx.x;
  const int h = static_cast<int>(blockIdx.y);
  const int dc = p.dim_ckv;
  pdl_wait();
  auto state = [&](int z) { return (static_cast<int64_t>(z) * p.rows + row) * p.num_heads + h; };
  float M = -INFINITY;
  for (int z = 0; z < splits; ++z) M = fmaxf(M, part_ml[2 * state(z)]);
  float L = 0.0f;
  if (M != -INFINITY) {
    for (int z = 0; z < splits; ++z) {
      const float mz = part_ml[2 * state(z)];
      if (mz != -INFINITY) L += part_ml[2 * state(z) + 1] * expf(mz - M);
    }
  }
  const bool empty = L == 0.0f;
  const float f = empty ? 0.0f : p.out_scale * p.ckv_scale / L;
  const int64_t off = row * p.o_stride_n + h * p.o_stride_h;
  for (int d = static_cast<int>(threadIdx.x); d < dc; d += static_cast<int>(blockDim.x)) {
    float a = 0.0f;
    if (!empty) {
      for (int z = 0; z < splits; ++z) {
        const float mz = part_ml[2 * state(z)];
        if (mz != -INFINITY) a += expf(mz - M) * part_o[state(z) * dc + d];
      }
    }
    store_any(p.o, off + d, p.o_dtype, empty ? 0.0f : a * f);
  }
  if (p.lse != nullptr && threadIdx.x == 0) {
    float v = -INFINITY;
    if (!empty) {
      v = M + logf(L);
      if (!p.lse_base_e) v *= kLog2e;
    }
    p.lse[row * p.lse_stride_n + h * p.lse_stride_h] = v;
  }
}

int heads_per_block(const MlaAttentionParams& p) {
  return std::min(kMaxHeadsPerBlock, p.num_heads);
}

std::size_t smem_bytes(const MlaAttentionParams& p) {
  return static_cast<std::size_t>(heads_per_block(p) + kTile) *
         static_cast<std::size_t>(p.dim_ckv + p.dim_kpe) * sizeof(float);
}

void check(const char* what, cudaError_t err) {
  if (err != cudaSuccess) {
    FLASHINFER_FAIL(ErrorCode::kCuda, "mla_attention", "", what, " failed: ", cudaGetErrorName(err),
                    ": ", cudaGetErrorString(err));
  }
}

// Block per appended row; threads copy the row's latent then rope elements (E: an unsigned
// integer of the element's width, so the copy is bit-exact for every dtype).
template <class E>
__global__ void append_mla_kernel(MlaAppendParams p) {
  const int64_t i = blockIdx.x;
  const int32_t b = p.batch_indices[i];
  const int64_t t = p.positions[i];
  const int64_t page = p.kv_indices[p.kv_indptr[b] + t / p.page_size];
  const int64_t slot = t % p.page_size;
  const E* ac = static_cast<const E*>(p.append_ckv) + i * p.ackv_stride_n;
  const E* ak = static_cast<const E*>(p.append_kpe) + i * p.akpe_stride_n;
  E* c = static_cast<E*>(p.ckv) + page * p.ckv_stride_page + slot * p.ckv_stride_token;
  E* k = static_cast<E*>(p.kpe) + page * p.kpe_stride_page + slot * p.kpe_stride_token;
  for (int64_t d = threadIdx.x; d < p.dim_ckv; d += blockDim.x) c[d] = ac[d];
  for (int64_t d = threadIdx.x; d < p.dim_kpe; d += blockDim.x) k[d] = ak[d];
}

// Block per (token, head): k[t, h] = (k_nope[t, h], k_rope[t, 0]).
template <class E>
__global__ void concat_mla_k_kernel(ConcatMlaKParams p) {
  const int64_t t = blockIdx.x, h = blockIdx.y;
  E* k = static_cast<E*>(p.k) + t * p.k_stride_t + h * p.k_stride_h;
  const E* kn = static_cast<const E*>(p.k_nope) + t * p.kn_stride_t + h * p.kn_stride_h;
  const E* kr = static_cast<const E*>(p.k_rope) + t * p.kr_stride_t;
  for (int64_t d = threadIdx.x; d < p.nope_dim; d += blockDim.x) k[d] = kn[d];
  for (int64_t d = threadIdx.x; d < p.rope_dim; d += blockDim.x) k[p.nope_dim + d] = kr[d];
}

template <class F>
void by_width(int64_t elem_size, const char* op, F&& f) {
  switch (elem_size) {
    case 1:
      f(uint8_t{});
      return;
    case 2:
      f(uint16_t{});
      return;
    case 4:
      f(uint32_t{});
      return;
    default:
      FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "", "element size ", elem_size,
                      " is not supported on CUDA");
  }
}

}  // namespace

void append_paged_mla_kv_cache(const MlaAppendParams& p, void* stream) {
  if (p.nnz == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  by_width(p.elem_size, "append_paged_mla_kv_cache", [&](auto e) {
    append_mla_kernel<decltype(e)><<<static_cast<unsigned>(p.nnz), 128, 0, s>>>(p);
  });
  FLASHINFER_CUDA_CALL("append_paged_mla_kv_cache", cudaGetLastError());
}

void concat_mla_k(const ConcatMlaKParams& p, void* stream) {
  if (p.tokens == 0 || p.num_heads == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.num_heads));
  by_width(p.elem_size, "concat_mla_k",
           [&](auto e) { concat_mla_k_kernel<decltype(e)><<<grid, 128, 0, s>>>(p); });
  FLASHINFER_CUDA_CALL("concat_mla_k", cudaGetLastError());
}

const char* mla_attention_unsupported(const MlaAttentionParams& p) {
  if (p.dim_ckv < 1 || p.dim_ckv > kWarp * kCkvPerLane) {
    return "the CUDA MLA kernel takes head_dim_ckv in [1, 512]";
  }
  if (p.dim_kpe < 0 || smem_bytes(p) > 200 * 1024) {
    return "head_dim_ckv + head_dim_kpe is too large for the CUDA MLA kernel's shared memory";
  }
  if (p.num_heads < 1 || p.num_heads > 65535) return "the CUDA MLA kernel takes 1 to 65535 heads";
  const auto is = [](DType d, std::initializer_list<DType> ok) {
    return std::find(ok.begin(), ok.end(), d) != ok.end();
  };
  constexpr auto f32 = DType::kFloat32, f16 = DType::kFloat16, bf16 = DType::kBFloat16,
                 e4m3 = DType::kFloat8E4M3FN, e5m2 = DType::kFloat8E5M2;
  if (!is(p.q_dtype, {f32, f16, bf16, e4m3, e5m2}) ||
      !is(p.kv_dtype, {f32, f16, bf16, e4m3, e5m2}) || !is(p.o_dtype, {f32, f16, bf16})) {
    return "dtype combination not supported by the CUDA MLA kernel";
  }
  if (p.row_req == nullptr && p.rows > 0) return "no row-to-request map (host-side bug)";
  return nullptr;
}

void mla_attention(const MlaAttentionParams& p, void* stream, bool enable_pdl) {
  if (p.rows == 0 || p.num_heads == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const int G = heads_per_block(p);
  const int64_t groups = (p.num_heads + G - 1) / G;
  const int64_t blocks = int64_t{p.rows} * groups;
  int dev = 0, sms = 1;
  check("cudaGetDevice", cudaGetDevice(&dev));
  check("cudaDeviceGetAttribute",
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  // Split the KV axis when the (row, head group) blocks would fill fewer than two waves.
  const int64_t max_kv = std::max<int64_t>(p.max_kv_len, 1);
  int64_t splits = 1;
  if (blocks < 2 * int64_t{sms} && max_kv > kMinChunk) {
    splits = std::min<int64_t>({(2 * int64_t{sms} + blocks - 1) / blocks,
                                (max_kv + kMinChunk - 1) / kMinChunk, kMaxSplits});
    const int64_t per_split = int64_t{p.rows} * p.num_heads * (p.dim_ckv + 2) * 4;
    splits = std::max<int64_t>(1, std::min<int64_t>(splits, kMaxScratch / per_split));
  }
  int64_t chunk = max_kv;
  if (splits > 1) {
    chunk = ((max_kv + splits - 1) / splits + kTile - 1) / kTile * kTile;
    splits = (max_kv + chunk - 1) / chunk;  // no split left with nothing in any row
  }
  const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(groups),
                  static_cast<unsigned>(splits));
  const dim3 block(static_cast<unsigned>(G * kWarp));
  const std::size_t smem = smem_bytes(p);
  float* part_o = nullptr;
  float* part_ml = nullptr;
  void* scratch = nullptr;
  if (splits > 1) {
    const int64_t states = splits * p.rows * p.num_heads;
    check("cudaMallocAsync",
          cudaMallocAsync(&scratch, static_cast<std::size_t>(states * (p.dim_ckv + 2) * 4), s));
    part_o = static_cast<float*>(scratch);
    part_ml = part_o + states * p.dim_ckv;
  }
  cudaError_t err = cudaSuccess;
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16, kFloat8E4M3FN, kFloat8E5M2>(
      p.kv_dtype, "mla_attention", "ckv_cache", [&]<class KV>() {
        err = try_launch_kernel(mla_attention_kernel<KV>, grid, block, smem, s, enable_pdl, p,
                                chunk, part_o, part_ml);
      });
  if (err == cudaSuccess && splits > 1) {
    err = try_launch_kernel(mla_merge_kernel,
                            dim3(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.num_heads)),
                            dim3(128), 0, s, enable_pdl, p, static_cast<int>(splits),
                            static_cast<const float*>(part_o), static_cast<const float*>(part_ml));
  }
  if (scratch != nullptr) {
    const cudaError_t free_err = cudaFreeAsync(scratch, s);
    if (err == cudaSuccess) err = free_err;
  }
  check("the MLA kernel launch", err);
}

}  // namespace flashinfer::kernels::cuda
