// nvfp4_attention_sm120_quantize_qkv / _fwd on the GPU, the CPU reference's arithmetic
// (kernels/nvfp4_attention_rules.h) step for step: sums in the same order where their rounding
// depends on it, fp64 where they are exact. A reference-grade kernel for SM120, not upstream's
// block-scaled tensor-core design (docs/ATTENTION.md, "NVFP4 attention on SM120").
#include <cstdint>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/nvfp4_attention_cuda.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/nvfp4_attention_rules.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kNvfp4AttnThreads = 128;
constexpr int kFwdWarps = 4;
constexpr int kMaxDim = 128;
constexpr const char* kQuantOp = "nvfp4_attention_sm120_quantize_qkv";
constexpr const char* kFwdOp = "nvfp4_attention_sm120_fwd";

// The (batch, head) of a block whose grid is (work, H, B).
__device__ __forceinline__ int64_t head_index() {
  return static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y;
}

__device__ __forceinline__ int64_t groups_of(const Nvfp4AttnQuantParams& p) {
  return nvfp4_attn_groups(p.S_pad, p.per_block_mean);
}

// K's mean over its S tokens and Q's per group (the padded rows' zeros added too, as the CPU
// adds them), fp64 in token order, rounded to the input dtype.
__global__ void __launch_bounds__(kNvfp4AttnThreads)
    nvfp4_attn_means_kernel(Nvfp4AttnQuantParams p) {
  pdl_wait();
  const int64_t bh = blockIdx.x, S = p.S, D = p.D, groups = groups_of(p);
  const int64_t per = p.per_block_mean ? kNvfp4AttnTile : p.S_pad;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    const int64_t base = bh * S * D + d;
    double ks = 0.0;
    for (int64_t s = 0; s < S; ++s) ks += load_any(p.k, base + s * D, p.dtype);
    p.k_mean[bh * D + d] =
        nvfp4_attn_round(p.dtype, static_cast<float>(ks / static_cast<double>(S)));
    for (int64_t g = 0; g < groups; ++g) {
      double qs = 0.0;
      for (int64_t s = g * per; s < (g + 1) * per; ++s) {
        qs += s < S ? load_any(p.q, base + s * D, p.dtype) : 0.0f;
      }
      p.q_mean[(bh * groups + g) * D + d] =
          nvfp4_attn_round(p.dtype, static_cast<float>(qs / static_cast<double>(per)));
    }
  }
}

// The centred K value of token j (0 past S).
__device__ __forceinline__ float centred_k(const Nvfp4AttnQuantParams& p, int64_t bh, int64_t j,
                                           int64_t d) {
  if (j >= p.S) return 0.0f;
  const float k = load_any(p.k, (bh * p.S + j) * p.D + d, p.dtype);
  return nvfp4_attn_round(p.dtype, fp32_sub(k, p.k_mean[bh * p.D + d]));
}

// qk_correction[g, j]: a thread per key j, the products exact in fp64, summed over d in order.
__global__ void __launch_bounds__(kNvfp4AttnThreads)
    nvfp4_attn_correction_kernel(Nvfp4AttnQuantParams p) {
  pdl_wait();
  const int64_t bh = head_index(), Sp = p.S_pad, D = p.D, groups = groups_of(p);
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= Sp) return;
  for (int64_t g = 0; g < groups; ++g) {
    const float* qm = p.q_mean + (bh * groups + g) * D;
    double acc = 0.0;
    for (int64_t d = 0; d < D; ++d) {
      acc += static_cast<double>(qm[d]) * static_cast<double>(centred_k(p, bh, j, d));
    }
    p.qk_correction[(bh * groups + g) * Sp + j] = nvfp4_attn_canonical_nan(static_cast<float>(acc));
  }
}

// One block of 16 values a thread: Q's rows, K's stored rows (token permuted), V^T's rows.
__global__ void __launch_bounds__(kNvfp4AttnThreads)
    nvfp4_attn_quantize_kernel(Nvfp4AttnQuantParams p) {
  pdl_wait();
  const int64_t bh = head_index(), S = p.S, Sp = p.S_pad, D = p.D, groups = groups_of(p);
  const int64_t per_tensor = Sp * D / kNvfp4AttnBlock;
  const int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (u >= 3 * per_tensor) return;
  const int64_t which = u / per_tensor, rem = u % per_tensor;
  float x[kNvfp4AttnBlock];
  int64_t row = 0, col = 0, cols = D;
  uint8_t *packed = nullptr, *scales = nullptr;
  if (which < 2) {  // Q or K: row a token (K: a stored row), blocks along d
    row = rem / (D / kNvfp4AttnBlock), col = rem % (D / kNvfp4AttnBlock);
    packed = (which == 0 ? p.q_fp4 : p.k_fp4) + bh * Sp * D / 2;
    scales = (which == 0 ? p.q_scale : p.k_scale) + bh * per_tensor;
    if (which == 0) {
      const int64_t g = nvfp4_attn_group_of(row, p.per_block_mean);
      const float* qm = p.q_mean + (bh * groups + g) * D;
      for (int i = 0; i < kNvfp4AttnBlock; ++i) {
        const int64_t d = col * kNvfp4AttnBlock + i;
        const float q = row < S ? load_any(p.q, (bh * S + row) * D + d, p.dtype) : 0.0f;
        x[i] = nvfp4_attn_round(p.dtype, fp32_sub(q, qm[d]));
      }
    } else {
      const int64_t token = nvfp4_attn_k_permute(row);
      for (int i = 0; i < kNvfp4AttnBlock; ++i) {
        x[i] = centred_k(p, bh, token, col * kNvfp4AttnBlock + i);
      }
    }
  } else {  // V^T: row a head dim, blocks along the tokens
    cols = Sp;
    row = rem / (Sp / kNvfp4AttnBlock), col = rem % (Sp / kNvfp4AttnBlock);
    packed = p.v_fp4_t + bh * Sp * D / 2;
    scales = p.v_scale_t + bh * per_tensor;
    for (int i = 0; i < kNvfp4AttnBlock; ++i) {
      const int64_t token = col * kNvfp4AttnBlock + i;
      x[i] = token < S ? load_any(p.v, (bh * S + token) * D + row, p.dtype) : 0.0f;
    }
  }
  uint8_t codes[kNvfp4AttnBlock];
  scales[nvfp4_attn_sf_offset(row, col, cols / kNvfp4AttnBlock)] =
      nvfp4_attn_quantize_block(x, 1, codes);
  uint8_t* out = packed + row * (cols / 2) + col * (kNvfp4AttnBlock / 2);
  for (int t = 0; t < kNvfp4AttnBlock / 2; ++t)
    out[t] = pack_e2m1x2(codes[2 * t], codes[2 * t + 1]);
}

__global__ void __launch_bounds__(kFwdWarps * 32) nvfp4_attn_fwd_kernel(Nvfp4AttnFwdParams p) {
  pdl_wait();
  __shared__ float sh_q[kFwdWarps][kMaxDim];
  __shared__ float sh_s[kFwdWarps][kNvfp4AttnTile];
  __shared__ float sh_p[kFwdWarps][kNvfp4AttnTile];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kFwdWarps + warp, bh = head_index();
  if (i >= p.S) return;  // the warp's row: no block-wide barrier follows
  const int64_t S = p.S, D = p.D, codes = S * D / 2, sfs = S * D / kNvfp4AttnBlock;
  const uint8_t *qp = p.q_fp4 + bh * codes, *kp = p.k_fp4 + bh * codes,
                *vp = p.v_fp4_t + bh * codes;
  const uint8_t *qs = p.q_scale + bh * sfs, *ks = p.k_scale + bh * sfs,
                *vs = p.v_scale_t + bh * sfs;
  float* q = sh_q[warp];
  float* sc = sh_s[warp];
  float* pt = sh_p[warp];
  const int64_t dcols = D / kNvfp4AttnBlock, scols = S / kNvfp4AttnBlock;
  for (int64_t d = lane; d < D; d += 32) {
    q[d] = nvfp4_attn_decode(qp + i * (D / 2), qs[nvfp4_attn_sf_offset(i, d / 16, dcols)], d);
  }
  __syncwarp();
  const int64_t groups = nvfp4_attn_groups(S, p.per_block_mean);
  const float* ci = p.qk_correction + (bh * groups + nvfp4_attn_group_of(i, p.per_block_mean)) * S;
  const int64_t tiles = p.causal ? i / kNvfp4AttnTile + 1 : S / kNvfp4AttnTile;
  const float kInf = __int_as_float(0x7f800000);
  float o[kMaxDim / 32] = {0.0f, 0.0f, 0.0f, 0.0f};
  float m = -kInf, sum = 0.0f;
  for (int64_t t = tiles - 1; t >= 0; --t) {  // the last key tile first
    float tile_max = -kInf;
    for (int u = 0; u < kNvfp4AttnTile / 32; ++u) {
      const int c = lane + 32 * u;
      const int64_t j = t * kNvfp4AttnTile + c;
      float s = -kInf;
      if (!(p.causal && j > i)) {
        const int64_t r = nvfp4_attn_k_permute(j);
        const uint8_t* krow = kp + r * (D / 2);
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d) {
          dot +=
              static_cast<double>(q[d]) * static_cast<double>(nvfp4_attn_decode(
                                              krow, ks[nvfp4_attn_sf_offset(r, d / 16, dcols)], d));
        }
        s = nvfp4_attn_score(ci[j], dot);
        tile_max = fmaxf(tile_max, s);
      }
      sc[c] = s;
    }
    for (int off = 16; off > 0; off >>= 1) {
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
    }
    const float m_new = fmaxf(m, tile_max);
    if (m != -kInf) {
      const float r = nvfp4_attn_rescale(m, m_new, p.sm_scale);
      sum = fp32_mul(sum, r);
      for (int u = 0; u < kMaxDim / 32; ++u) o[u] = fp32_mul(o[u], r);
    }
    m = m_new;
    __syncwarp();
    for (int u = 0; u < kNvfp4AttnTile / 32; ++u) {
      const int c = lane + 32 * u;
      pt[c] = sc[c] == -kInf ? 0.0f : nvfp4_attn_p(sc[c], m, p.sm_scale);
    }
    __syncwarp();
    // Every lane adds the tile's P in key order (the CPU's order), so all hold the same sum.
    for (int c = 0; c < kNvfp4AttnTile; ++c) sum = fp32_add(sum, pt[c]);
    if (lane < kNvfp4AttnTile / kNvfp4AttnBlock) {  // the scores are spent: P's values go there
      nvfp4_attn_quantize_p(pt + lane * kNvfp4AttnBlock, sc + lane * kNvfp4AttnBlock);
    }
    __syncwarp();
    for (int u = 0; u < kMaxDim / 32; ++u) {
      const int64_t d = lane + 32 * u;
      if (d >= D) break;
      const uint8_t* vrow = vp + d * (S / 2);
      double acc = 0.0;
      for (int c = 0; c < kNvfp4AttnTile; ++c) {
        const int64_t j = t * kNvfp4AttnTile + c;
        acc +=
            static_cast<double>(sc[c]) * static_cast<double>(nvfp4_attn_decode(
                                             vrow, vs[nvfp4_attn_sf_offset(d, j / 16, scols)], j));
      }
      o[u] = nvfp4_attn_accumulate(o[u], acc);
    }
    __syncwarp();  // before the next tile's scores overwrite sc
  }
  const bool empty = !(sum > 0.0f);  // 0 or NaN
  const float inv = empty ? 0.0f : fp32_div(1.0f, sum);
  for (int u = 0; u < kMaxDim / 32; ++u) {
    const int64_t d = lane + 32 * u;
    if (d >= D) continue;
    // The host's encoders, on the device's NaN (nvfp4_attn_canonical_nan), as the CPU's.
    const float y = nvfp4_attn_canonical_nan(fp32_mul(o[u], inv));
    static_cast<uint16_t*>(p.out)[(bh * S + i) * D + d] =
        p.out_dtype == DType::kFloat16 ? float_to_half_bits(y) : float_to_bfloat16_bits(y);
  }
  if (lane == 0) {
    p.lse[bh * S + i] = empty ? kInf
                              : static_cast<float>(static_cast<double>(m) * p.sm_scale +
                                                   log(static_cast<double>(sum)) -
                                                   static_cast<double>(kNvfp4AttnLnPRange));
  }
}

unsigned grid_dim(int64_t n, const char* op, int64_t limit) {
  FLASHINFER_CHECK(n <= limit, op, "q", "grid dimension ", n, " exceeds ", limit);
  return static_cast<unsigned>(n);
}

}  // namespace

void nvfp4_attention_quantize_qkv(const Nvfp4AttnQuantParams& in, void* stream, bool enable_pdl) {
  const int64_t heads = in.B * in.H;
  if (heads == 0 || in.S_pad == 0) return;
  // The means live in the stream's scratch, leased until the three launches are queued: a
  // temporary tensor would go back to the allocator while they still run, and a CUDA graph
  // captured over the call would keep its address.
  static StreamScratchPool pool("means scratch");
  const int64_t k_means = heads * in.D,
                q_means = heads * in.D * nvfp4_attn_groups(in.S_pad, in.per_block_mean);
  const StreamScratch scratch =
      pool.acquire(kQuantOp, stream, static_cast<std::size_t>(k_means + q_means) * sizeof(float));
  Nvfp4AttnQuantParams p = in;
  p.k_mean = static_cast<float*>(scratch.data());
  p.q_mean = p.k_mean + k_means;
  const auto s = static_cast<cudaStream_t>(stream);
  const unsigned h = grid_dim(p.H, kQuantOp, 65535), b = grid_dim(p.B, kQuantOp, 65535);
  launch_kernel(kQuantOp, nvfp4_attn_means_kernel, dim3(grid_dim(heads, kQuantOp, 0x7fffffff)),
                dim3(kNvfp4AttnThreads), 0, s, enable_pdl, p);
  launch_kernel(
      kQuantOp, nvfp4_attn_correction_kernel,
      dim3(grid_dim((p.S_pad + kNvfp4AttnThreads - 1) / kNvfp4AttnThreads, kQuantOp, 0x7fffffff), h,
           b),
      dim3(kNvfp4AttnThreads), 0, s, enable_pdl, p);
  const int64_t units = 3 * p.S_pad * p.D / kNvfp4AttnBlock;
  launch_kernel(
      kQuantOp, nvfp4_attn_quantize_kernel,
      dim3(grid_dim((units + kNvfp4AttnThreads - 1) / kNvfp4AttnThreads, kQuantOp, 0x7fffffff), h,
           b),
      dim3(kNvfp4AttnThreads), 0, s, enable_pdl, p);
}

void nvfp4_attention_fwd(const Nvfp4AttnFwdParams& p, void* stream, bool enable_pdl) {
  const int64_t heads = p.B * p.H;
  if (heads == 0 || p.S == 0) return;
  FLASHINFER_CHECK(p.D <= kMaxDim, kFwdOp, "q_fp4", "head_dim ", p.D, " exceeds ", kMaxDim);
  const dim3 grid(grid_dim((p.S + kFwdWarps - 1) / kFwdWarps, kFwdOp, 0x7fffffff),
                  grid_dim(p.H, kFwdOp, 65535), grid_dim(p.B, kFwdOp, 65535));
  launch_kernel(kFwdOp, nvfp4_attn_fwd_kernel, grid, dim3(kFwdWarps * 32), 0,
                static_cast<cudaStream_t>(stream), enable_pdl, p);
}

}  // namespace flashinfer::kernels::cuda
