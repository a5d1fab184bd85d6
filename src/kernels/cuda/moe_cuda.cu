// CUDA kernels of the MoE ops. The fused MoE (cutlass_fused_moe) has two routes with the CPU
// reference's rounding points: the GEMV route, three passes over the (token, k) pairs, one warp
// per output element of each GEMM row (fp32 accumulation; decode, fp32 input, and the fallback);
// and, for bf16 / fp16 prefill-sized batches, the grouped route (moe_grouped_plan.h): the pairs
// permuted by expert on the device, both GEMMs on the tensor-core grouped GEMM (fp32
// accumulation, one rounding each, at the same points), the GEMV route's activation code
// between them, its finalize reading rows through the permutation. trtllm_bf16_moe takes the
// same two routes (the grouped one for MajorK weights) with its own rounding points.
#include <atomic>
#include <cfloat>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include "core/env_switch.h"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/grouped_gemm_cuda.h"
#include "kernels/cuda/moe_cuda.h"
#include "kernels/cuda/moe_grouped_plan.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/deepseek_routing_rules.h"
#include "kernels/fp32_rules.h"
#include "kernels/moe_cutlass_fp8_rules.h"
#include "kernels/moe_sm90_mixed_rules.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

template <class T>
__device__ __forceinline__ float round_as(float v) {
  return to_f32(from_f32<T>(v));
}

__device__ __forceinline__ float load_scale(const CutlassMoeParams& p, int64_t i) {
  switch (p.scales_dtype) {
    case DType::kFloat16:
      return __half2float(static_cast<const __half*>(p.scales)[i]);
    case DType::kBFloat16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p.scales)[i]);
    default:
      return static_cast<const float*>(p.scales)[i];
  }
}

__device__ __forceinline__ int64_t local_expert(const CutlassMoeParams& p, int64_t pair) {
  const int64_t t = pair / p.top_k, k = pair % p.top_k;
  const int64_t i = t * p.experts_stride + k;
  const int64_t id = p.experts_dtype == DType::kInt64 ? static_cast<const int64_t*>(p.experts)[i]
                                                      : static_cast<const int32_t*>(p.experts)[i];
  const int64_t e = id - p.expert_offset;
  return (e >= 0 && e < p.num_local_experts) ? e : -1;
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float gelu_erf(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}
__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * x * (1.0f + 0.044715f * x * x)));
}
// tanh as 2 * sigmoid(2z) - 1, as upstream's SituAdaptor.
__device__ __forceinline__ float tanh_via_sigmoid(float z) {
  return 2.0f / (1.0f + expf(-2.0f * z)) - 1.0f;
}

// The activation of one element from its biased GEMM1 values (fp32), as moe_activation_row on
// the CPU: up = element j of the row, gate = element inter + j (gated activations only; the
// others ignore it). Every route computes it here.
__device__ float activation_value(const CutlassMoeParams& p, int64_t e, float up, float gate) {
  const bool biased = p.swiglu_alpha || p.swiglu_beta || p.swiglu_limit;
  switch (p.act) {
    case MoeAct::kSwiglu:
    case MoeAct::kSwigluBias: {
      if (p.act == MoeAct::kSwiglu && !biased) return silu(gate) * up;
      const float alpha = p.swiglu_alpha ? p.swiglu_alpha[e] : 1.0f;
      const float beta = p.swiglu_beta ? p.swiglu_beta[e] : 0.0f;
      const float limit = p.swiglu_limit ? p.swiglu_limit[e] : FLT_MAX;
      const float gt = fminf(gate, limit);
      const float u = fminf(fmaxf(up, -limit), limit) + beta;
      return gt / (1.0f + expf(-alpha * gt)) * u;
    }
    case MoeAct::kSwigluStep: {
      const float limit = p.swiglu_limit ? p.swiglu_limit[e] : 7.0f;
      return fminf(silu(gate), limit) * fminf(fmaxf(up, -limit), limit);
    }
    case MoeAct::kGeglu:
      return gelu_erf(gate) * up;
    case MoeAct::kGegluTanh:
      return gelu_tanh(gate) * up;
    case MoeAct::kSitu: {
      const float beta = p.situ_beta ? p.situ_beta[e] : 4.0f;
      const float lbeta = p.situ_linear_beta ? p.situ_linear_beta[e] : 25.0f;
      const float g = beta * tanh_via_sigmoid(gate / beta) / (1.0f + expf(-gate));
      return g * (p.situ_clamp_up ? lbeta * tanh_via_sigmoid(up / lbeta) : up);
    }
    case MoeAct::kGelu:
      return gelu_erf(up);
    case MoeAct::kRelu:
      return fmaxf(up, 0.0f);
    case MoeAct::kRelu2: {
      const float r = fmaxf(up, 0.0f);
      return r * r;
    }
    case MoeAct::kSilu:
      return silu(up);
    case MoeAct::kClampedRelu2: {
      const float L = p.clamped_relu2_limit[0];
      const float c = tanhf(fmaxf(up, 0.0f) * (1.0f / L)) * L;
      return c * c;
    }
    default:
      return up;  // Identity (the API layer refuses the others)
  }
}

// The activation of element j of one GEMM1 row g (fp32, biased).
__device__ float activation(const CutlassMoeParams& p, int64_t e, const float* g, int64_t j) {
  return activation_value(p, e, g[j], moe_act_is_gated(p.act) ? g[p.inter + j] : 0.0f);
}

// A GEMM1 output already rounded to T, plus the fc1 bias in fp32 (upstream's
// doActivationKernel), as both routes add it.
template <class T>
__device__ __forceinline__ float gemm1_biased(float rounded, const T* b1, int64_t j) {
  return rounded + (b1 ? to_f32(b1[j]) : 0.0f);
}

// One block per (token, k) pair: GEMM1 row (one warp per output) rounded to T, the fc1 bias added
// to the rounded value in fp32 (upstream's doActivationKernel), then the activation rounded to T.
template <class T>
__global__ void moe_gemm1_kernel(CutlassMoeParams p) {
  pdl_wait();
  const int64_t pair = blockIdx.x;
  const int64_t e = local_expert(p, pair);
  if (e < 0) return;
  const int64_t t = pair / p.top_k, H = p.hidden;
  const int64_t N1 = moe_act_is_gated(p.act) ? 2 * p.inter : p.inter;
  const T* x = static_cast<const T*>(p.input) + t * p.in_stride;
  const T* w1 = static_cast<const T*>(p.w1) + e * N1 * H;
  const T* b1 = p.b1 ? static_cast<const T*>(p.b1) + e * N1 : nullptr;
  float* g = p.ws_g1 + pair * N1;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int64_t j = warp; j < N1; j += kWarps) {
    const T* wr = w1 + j * H;
    float acc = 0.0f;
    for (int64_t c = lane; c < H; c += 32) acc += to_f32(x[c]) * to_f32(wr[c]);
    acc = warp_reduce_sum(acc);
    if (lane == 0) g[j] = gemm1_biased(round_as<T>(acc), b1, j);
  }
  __syncthreads();
  float* h = p.ws_h + pair * p.inter;
  for (int64_t j = threadIdx.x; j < p.inter; j += blockDim.x) {
    h[j] = round_as<T>(activation(p, e, g, j));
  }
}

// One block per (token, k) pair: GEMM2 row rounded to the output type O (no bias: the finalize
// adds it).
template <class T, class O>
__global__ void moe_gemm2_kernel(CutlassMoeParams p) {
  const int64_t pair = blockIdx.x;
  const int64_t e = local_expert(p, pair);
  if (e < 0) return;
  const int64_t H = p.hidden, I = p.inter;
  const float* h = p.ws_h + pair * I;
  const T* w2 = static_cast<const T*>(p.w2) + e * H * I;
  float* y = p.ws_y + pair * H;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int64_t j = warp; j < H; j += kWarps) {
    const T* wr = w2 + j * I;
    float acc = 0.0f;
    for (int64_t c = lane; c < I; c += 32) acc += h[c] * to_f32(wr[c]);
    acc = warp_reduce_sum(acc);
    if (lane == 0) y[j] = round_as<O>(acc);
  }
}

// One block per token: the weighted sum over k in k order of scale * (y + b2), fp32 (upstream's
// finalizeMoeRoutingKernel; p.b2 is null on tensor-parallel ranks other than 0). y holds the
// GEMM2 rows already rounded to O (fp32 on the GEMV route, O on the grouped one): pair i's row
// is perm[i] (grouped route) or i (perm null).
template <class T, class O, class Y>
__global__ void moe_finalize_kernel(CutlassMoeParams p, const Y* y, const int32_t* perm) {
  const int64_t t = blockIdx.x;
  O* out = static_cast<O*>(p.out) + t * p.out_stride;
  const T* b2 = static_cast<const T*>(p.b2);
  for (int64_t j = threadIdx.x; j < p.hidden; j += blockDim.x) {
    float acc = 0.0f;
    for (int64_t k = 0; k < p.top_k; ++k) {
      const int64_t pair = t * p.top_k + k;
      const int64_t e = local_expert(p, pair);
      if (e < 0) continue;
      const float b = b2 ? to_f32(b2[e * p.hidden + j]) : 0.0f;
      const int64_t row = perm ? perm[pair] : pair;
      acc += load_scale(p, t * p.scales_stride + k) * (to_f32(y[row * p.hidden + j]) + b);
    }
    out[j] = from_f32<O>(acc);
  }
  pdl_launch_dependents();
}

// ---- the grouped route (moe_grouped_plan.h) --------------------------------------------------

static_assert(moe::kMoePermChunk == kThreads, "one pair of a chunk per thread");

// The local experts of chunk blockIdx.x's pairs into le (-1 past the pairs); returns how many
// pairs the chunk has.
__device__ int load_chunk_experts(const CutlassMoeParams& p, int32_t* le) {
  const int64_t pairs = p.num_tokens * p.top_k, c0 = int64_t{blockIdx.x} * moe::kMoePermChunk;
  const int64_t left = pairs - c0;
  const int n = static_cast<int>(left < moe::kMoePermChunk ? left : moe::kMoePermChunk);
  const int i = static_cast<int>(threadIdx.x);
  le[i] = i < n ? static_cast<int32_t>(local_expert(p, c0 + i)) : -1;
  __syncthreads();
  return n;
}

// The counting pass: counts[c * E + e] for chunk c = blockIdx.x and every local expert e.
__global__ void moe_count_kernel(CutlassMoeParams p, int32_t* counts) {
  pdl_wait();
  __shared__ int32_t le[moe::kMoePermChunk];
  const int n = load_chunk_experts(p, le);
  const int64_t E = p.num_local_experts;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    counts[int64_t{blockIdx.x} * E + e] = moe::moe_chunk_count(le, n, static_cast<int32_t>(e));
  }
}

// One block: m_indptr (the experts' totals, exclusive scan), then counts -> each chunk's first
// row per expert.
__global__ void moe_offsets_kernel(int64_t chunks, int64_t E, int32_t* counts, int32_t* indptr) {
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    indptr[e + 1] = moe::moe_expert_total(counts, chunks, E, e);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    indptr[0] = 0;
    for (int64_t e = 0; e < E; ++e) indptr[e + 1] += indptr[e];
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    moe::moe_expert_offsets(counts, chunks, E, e, indptr[e]);
  }
}

// The scatter pass: perm[pair] = the pair's row (-1: no local expert), chunk blockIdx.x.
__global__ void moe_scatter_kernel(CutlassMoeParams p, const int32_t* offsets, int32_t* perm) {
  __shared__ int32_t le[moe::kMoePermChunk];
  const int n = load_chunk_experts(p, le);
  const int i = static_cast<int>(threadIdx.x);
  if (i >= n) return;
  const int64_t pair = int64_t{blockIdx.x} * moe::kMoePermChunk + i;
  perm[pair] = le[i] < 0 ? -1
                         : offsets[int64_t{blockIdx.x} * p.num_local_experts + le[i]] +
                               moe::moe_rank_in_chunk(le, i);
}

// One block per pair: its token's input row into row perm[pair] of xs (16-byte chunks where the
// input row is 16-byte aligned; hidden * sizeof(T) bytes is a multiple of 16 on this route).
template <class T>
__global__ void moe_gather_kernel(CutlassMoeParams p, const int32_t* perm, T* xs) {
  const int64_t pair = blockIdx.x, row = perm[pair];
  if (row < 0) return;
  const int64_t H = p.hidden;
  const T* src = static_cast<const T*>(p.input) + (pair / p.top_k) * p.in_stride;
  T* dst = xs + row * H;
  if (reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    const auto* s4 = reinterpret_cast<const uint4*>(src);
    auto* d4 = reinterpret_cast<uint4*>(dst);
    const int64_t chunks = H * static_cast<int64_t>(sizeof(T)) / 16;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) d4[c] = s4[c];
  } else {
    for (int64_t c = threadIdx.x; c < H; c += blockDim.x) dst[c] = src[c];
  }
}

// The grouped routes' sort of the pairs by expert on the device: pair counts per (chunk,
// expert), the expert offsets, the stable scatter into `perm` (pair ids by expert). The first
// launch waits on the previous kernel when `enable_pdl`.
void launch_moe_sort(const char* op, const CutlassMoeParams& p, int64_t chunks, int32_t* counts,
                     int32_t* indptr, int32_t* perm, cudaStream_t s, bool enable_pdl) {
  const dim3 chunk_grid(static_cast<unsigned>(chunks));
  launch_kernel(op, moe_count_kernel, chunk_grid, dim3(kThreads), 0, s, enable_pdl, p, counts);
  launch_kernel(op, moe_offsets_kernel, dim3(1), dim3(kThreads), 0, s, false, chunks,
                p.num_local_experts, counts, indptr);
  launch_kernel(op, moe_scatter_kernel, chunk_grid, dim3(kThreads), 0, s, false, p,
                static_cast<const int32_t*>(counts), perm);
}

// The sort, then the gather of the permuted input rows into `xs`.
template <class T>
void launch_moe_permutation(const char* op, const CutlassMoeParams& p, int64_t chunks,
                            int32_t* counts, int32_t* indptr, int32_t* perm, T* xs, cudaStream_t s,
                            bool enable_pdl) {
  launch_moe_sort(op, p, chunks, counts, indptr, perm, s, enable_pdl);
  const dim3 pair_grid(static_cast<unsigned>(p.num_tokens * p.top_k));
  launch_kernel(op, moe_gather_kernel<T>, pair_grid, dim3(kThreads), 0, s, false, p,
                static_cast<const int32_t*>(perm), xs);
}

// The typed pieces of a grouped route's scratch at `base`, in moe::moe_grouped_scratch's layout:
// counts per (chunk, expert), expert offsets, pair ids by expert, the permuted input xs, GEMM1's
// output g1, the activation h and GEMM2's output y.
template <class X, class G, class A, class Y>
struct MoeGroupedPieces {
  int32_t *counts, *indptr, *perm;
  X* xs;
  G* g1;
  A* h;
  Y* y;
};
template <class X, class G, class A, class Y>
MoeGroupedPieces<X, G, A, Y> moe_grouped_pieces(char* base, const moe::MoeGroupedScratch& l) {
  return {reinterpret_cast<int32_t*>(base + l.counts),
          reinterpret_cast<int32_t*>(base + l.indptr),
          reinterpret_cast<int32_t*>(base + l.perm),
          reinterpret_cast<X*>(base + l.xs),
          reinterpret_cast<G*>(base + l.g1),
          reinterpret_cast<A*>(base + l.h),
          reinterpret_cast<Y*>(base + l.y)};
}

// One block per pair: the bias and activation of its GEMM1 row (T, rounded by the GEMM) as the
// GEMV route's moe_gemm1_kernel, rounded to T into its row of h.
template <class T>
__global__ void moe_activation_kernel(CutlassMoeParams p, const int32_t* perm, const T* g1, T* h) {
  const int64_t pair = blockIdx.x;
  const int64_t e = local_expert(p, pair);
  if (e < 0) return;
  const int64_t row = perm[pair], I = p.inter;
  const bool gated = moe_act_is_gated(p.act);
  const int64_t N1 = gated ? 2 * I : I;
  const T* g = g1 + row * N1;
  const T* b1 = p.b1 ? static_cast<const T*>(p.b1) + e * N1 : nullptr;
  T* hr = h + row * I;
  for (int64_t j = threadIdx.x; j < I; j += blockDim.x) {
    const float up = gemm1_biased(to_f32(g[j]), b1, j);
    const float gate = gated ? gemm1_biased(to_f32(g[I + j]), b1, I + j) : 0.0f;
    hr[j] = from_f32<T>(activation_value(p, e, up, gate));
  }
}

// ---- scratch, route ---------------------------------------------------------------------------

std::atomic<int> g_force_route{0};

// The route a call may take: the tests' forced one (set_cutlass_moe_route), else
// FLASHINFER_MOE_GROUPED=0 (read at each call) keeps every batch on the GEMV route, to time or
// check one route against the other on one GPU; else the batch's own choice (0).
int route_force() {
  const int forced = g_force_route.load();
  if (forced != 0) return forced;
  return detail::env_switch_is("FLASHINFER_MOE_GROUPED", "0") ? 1 : 0;
}
std::atomic<uint64_t> g_grouped_runs{0}, g_gemv_runs{0};

// The stream's scratch (kernels/cuda/stream_scratch.h): the lease is held until the caller's
// last kernel using it is queued.
StreamScratchPool& moe_scratch() {
  static StreamScratchPool pool("scratch");
  return pool;
}

moe::MoeRouteQuery route_query(const CutlassMoeParams& p, const char* op) {
  int device = 0;
  FLASHINFER_CUDA_CALL(op, cudaGetDevice(&device));
  const int major = detail::cuda_compute_capability(device) / 10;
  moe::MoeRouteQuery q;
  q.pairs = p.num_tokens * p.top_k;
  q.local_experts = p.num_local_experts;
  q.ep_size = p.ep_size;
  q.hidden = p.hidden;
  q.inter = p.inter;
  q.gemm1_n = moe_act_is_gated(p.act) ? 2 * p.inter : p.inter;
  q.elem_bytes = static_cast<int64_t>(dtype_size(p.dtype));
  q.w1 = reinterpret_cast<uintptr_t>(p.w1);
  q.w2 = reinterpret_cast<uintptr_t>(p.w2);
  q.sm_major = major;
  return q;
}

// One GEMM of the grouped route on the tensor-core grouped GEMM: out [pairs, n] of out_dtype =
// a [pairs, k] @ w[e]^T (times alpha[e] when given: device fp32 [E]) for the rows [indptr[e],
// indptr[e + 1]) of each local expert e, w [E, n, k] contiguous. Rows past indptr[E] (pairs of no
// local expert) are not written.
GroupedMmCudaParams moe_grouped_params(DType in_dtype, const int32_t* indptr, int64_t E,
                                       int64_t pairs, const void* a, const void* w, int64_t n,
                                       int64_t k, void* out, DType out_dtype) {
  GroupedMmCudaParams g;
  g.in_dtype = g.b_dtype = in_dtype;
  g.m_indptr = indptr;
  g.num_groups = E;
  g.cum_m = pairs;
  g.a = a;
  g.a_stride_m = k;
  g.b = w;
  g.b_stride_e = n * k;
  g.b_stride_n = k;
  g.n = n;
  g.k = k;
  g.out = out;
  g.out_dtype = out_dtype;
  g.out_stride_m = n;
  return g;
}
void moe_grouped_gemm(DType in_dtype, const int32_t* indptr, int64_t E, int64_t pairs,
                      const void* a, const void* w, int64_t n, int64_t k, void* out,
                      DType out_dtype, cudaStream_t stream, const float* alpha = nullptr) {
  GroupedMmCudaParams g =
      moe_grouped_params(in_dtype, indptr, E, pairs, a, w, n, k, out, out_dtype);
  g.alpha = alpha;
  g.alpha_per_weight = alpha != nullptr;
  grouped_mm_bf16(g, stream);
}

// The grouped route: permutation, GEMM1 (rounded to T by the GEMM), bias + activation, GEMM2
// (rounded to O), the finalize through the permutation.
template <class T, class O>
void launch_moe_grouped(const CutlassMoeParams& p, cudaStream_t stream, bool enable_pdl) {
  const char* op = "cutlass_fused_moe";
  const int64_t pairs = p.num_tokens * p.top_k, E = p.num_local_experts;
  const int64_t H = p.hidden, I = p.inter, N1 = moe_act_is_gated(p.act) ? 2 * I : I;
  const int64_t chunks = moe::moe_perm_chunks(pairs);
  const moe::MoeGroupedScratch l =
      moe::moe_grouped_scratch(pairs, E, H, I, N1, sizeof(T), sizeof(O));
  const StreamScratch scratch = moe_scratch().acquire(op, stream, l.bytes);  // to the last launch
  const auto [counts, indptr, perm, xs, g1, h, y] =
      moe_grouped_pieces<T, T, T, O>(static_cast<char*>(scratch.data()), l);
  const dim3 pair_grid(static_cast<unsigned>(pairs));
  launch_moe_permutation(op, p, chunks, counts, indptr, perm, xs, stream, enable_pdl);
  moe_grouped_gemm(p.dtype, indptr, E, pairs, xs, p.w1, N1, H, g1, p.dtype, stream);
  launch_kernel(op, moe_activation_kernel<T>, pair_grid, dim3(kThreads), 0, stream, false, p,
                static_cast<const int32_t*>(perm), static_cast<const T*>(g1), h);
  moe_grouped_gemm(p.dtype, indptr, E, pairs, h, p.w2, H, I, y, p.out_dtype, stream);
  launch_kernel(op, moe_finalize_kernel<T, O, O>, dim3(static_cast<unsigned>(p.num_tokens)),
                dim3(kThreads), 0, stream, false, p, static_cast<const O*>(y),
                static_cast<const int32_t*>(perm));
}

template <class T, class O>
void launch_moe(const CutlassMoeParams& p, cudaStream_t stream, bool enable_pdl) {
  const char* op = "cutlass_fused_moe";
  const int64_t pairs = p.num_tokens * p.top_k;
  if (p.num_tokens == 0) return;
  FLASHINFER_CHECK_CODE(pairs <= 0x7FFFFFFF, ErrorCode::kUnsupported, op, "input",
                        "more than 2^31 - 1 (token, expert) pairs");
  if constexpr (sizeof(T) == 2) {
    if (moe::moe_use_grouped(route_query(p, op), route_force())) {
      g_grouped_runs.fetch_add(1, std::memory_order_relaxed);
      launch_moe_grouped<T, O>(p, stream, enable_pdl);
      return;
    }
  }
  g_gemv_runs.fetch_add(1, std::memory_order_relaxed);
  CutlassMoeParams q = p;
  StreamScratch scratch;                 // when taken, held to the last launch
  if (!q.ws_g1 || !q.ws_h || !q.ws_y) {  // the caller passed no scratch: the stream's
    const int64_t N1 = moe_act_is_gated(p.act) ? 2 * p.inter : p.inter;
    const moe::MoeGemvScratch l = moe::moe_gemv_scratch(pairs, p.hidden, p.inter, N1);
    scratch = moe_scratch().acquire(op, stream, l.bytes);
    auto* base = static_cast<char*>(scratch.data());
    q.ws_g1 = reinterpret_cast<float*>(base + l.g1);
    q.ws_h = reinterpret_cast<float*>(base + l.h);
    q.ws_y = reinterpret_cast<float*>(base + l.y);
  }
  launch_kernel(op, moe_gemm1_kernel<T>, dim3(static_cast<unsigned>(pairs)), dim3(kThreads), 0,
                stream, enable_pdl, q);
  launch_kernel(op, moe_gemm2_kernel<T, O>, dim3(static_cast<unsigned>(pairs)), dim3(kThreads), 0,
                stream, false, q);
  launch_kernel(op, moe_finalize_kernel<T, O, float>, dim3(static_cast<unsigned>(p.num_tokens)),
                dim3(kThreads), 0, stream, false, q, static_cast<const float*>(q.ws_y),
                static_cast<const int32_t*>(nullptr));
}

// fused_topk_deepseek: a warp a token, kDsrWarps tokens a block. Lane l holds experts l, l + 32,
// ... (at most kDsrPerLane: num_experts <= 1024, which the op's limits keep) in registers, their
// sigmoids and biased scores computed once (the reference recomputes nothing either: the same
// expressions, so the same floats). Each group's two largest biased scores are merged across the
// warp, lane g keeps group g's score, and the kept groups and then the experts are picked by
// warp argmaxes that pick what the reference's sequential loops pick (kernels/
// deepseek_routing_rules.h: NaN, infinities and ties too). The earlier form, a thread a token
// rereading the scores and recomputing every sigmoid in each of its topk passes, is the test
// oracle (tests/oracle/moe_routing_oracle.cu).
constexpr int kDsrWarps = 4;
constexpr int kDsrPerLane = 32;

// The reference's argmax over the warp's candidates: lane-local best (v, idx, payload s) and the
// lane's first candidate (lowest index; INT32_MAX for none) with its value and payload. Returns
// the winner's index (-1: no candidate) and its payload, the same on every lane.
__device__ __forceinline__ int32_t dsr_warp_pick(float v, int32_t idx, float s, int32_t first,
                                                 float first_v, float first_s, float& s_out) {
  namespace dr = deepseek_routing;
  // The first candidate wins outright when its value is NaN.
  if (__any_sync(0xffffffffu, first != INT32_MAX && first_v != first_v)) {
    int32_t f = first;
    for (int o = 16; o > 0; o >>= 1) f = min(f, __shfl_xor_sync(0xffffffffu, f, o));
    const int owner = f & 31;
    const float fv = __shfl_sync(0xffffffffu, first_v, owner);
    const float fs = __shfl_sync(0xffffffffu, first_s, owner);
    if (fv != fv) {
      s_out = fs;
      return f;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
    const float os = __shfl_xor_sync(0xffffffffu, s, o);
    if (oi >= 0 && (idx < 0 || dr::pick_better(ov, oi, v, idx))) {
      v = ov;
      idx = oi;
      s = os;
    }
  }
  s_out = s;
  return idx;
}

// One pick of the reference's argmax over the warp's open candidates: bit j of `open` is expert
// j * 32 + lane, with value v[j] and payload s[j]. Returns the winner (-1: no candidate) and its
// payload, the same on every lane, and clears the winner's bit on its lane.
template <int N>
__device__ __forceinline__ int32_t dsr_pick_open(uint32_t& open, const float (&v)[N],
                                                 const float (&s)[N], int lane, float& s_out) {
  namespace dr = deepseek_routing;
  float bv = 0.0f, bs = 0.0f, first_v = 0.0f, first_s = 0.0f;
  int32_t idx = -1, first = INT32_MAX;
  FLASHINFER_UNROLL
  for (int j = 0; j < N; ++j) {
    if (!((open >> j) & 1u)) continue;
    const int32_t e = j * 32 + lane;
    if (first == INT32_MAX) {  // ascending e: the lane's first candidate
      first = e;
      first_v = v[j];
      first_s = s[j];
    }
    if (idx < 0 || dr::pick_better(v[j], e, bv, idx)) {
      bv = v[j];
      idx = e;
      bs = s[j];
    }
  }
  const int32_t best = dsr_warp_pick(bv, idx, bs, first, first_v, first_s, s_out);
  if (best >= 0 && (best & 31) == lane) open &= ~(1u << (best >> 5));
  return best;
}

// Grouped selection: each group's score (its two largest values, v[j] of expert j * 32 + lane;
// group g is experts [g * per_group, (g + 1) * per_group)), then `topk_group` picks of the
// reference's argmax over the scores (lane g holds group g's). The kept groups as a mask (bit g,
// G <= 32), the same on every lane.
template <int N>
__device__ __forceinline__ uint32_t dsr_pick_groups(const float (&v)[N], int lane, int G,
                                                    int per_group, int64_t topk_group) {
  namespace dr = deepseek_routing;
  float gscore = 0.0f;
  for (int g = 0; g < G; ++g) {
    dr::Top2 top{-INFINITY, -INFINITY};
    const int lo = g * per_group, hi = lo + per_group;
    FLASHINFER_UNROLL
    for (int j = 0; j < N; ++j) {
      const int e = j * 32 + lane;
      if (e >= lo && e < hi) dr::top2_push(top, v[j]);
    }
    for (int o = 16; o > 0; o >>= 1) {
      const dr::Top2 other{__shfl_xor_sync(0xffffffffu, top.m1, o),
                           __shfl_xor_sync(0xffffffffu, top.m2, o)};
      top = dr::top2_merge(top, other);
    }
    if (lane == g) gscore = per_group >= 2 ? top.m1 + top.m2 : top.m1;
  }
  uint32_t kept = 0;
  for (int64_t i = 0; i < topk_group; ++i) {
    const bool cand = lane < G && !((kept >> lane) & 1u);
    float unused;
    const int32_t best = dsr_warp_pick(gscore, cand ? lane : -1, 0.0f, cand ? lane : INT32_MAX,
                                       gscore, 0.0f, unused);
    if (best >= 0) kept |= 1u << best;  // always: topk_group <= n_group leaves a candidate
  }
  return kept;
}

template <class S, class B, class V>
__global__ void __launch_bounds__(kDsrWarps * 32) deepseek_routing_kernel(DeepSeekRoutingParams p) {
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kDsrWarps + threadIdx.x / 32;
  if (t >= p.num_tokens) return;  // the whole warp
  const int E = static_cast<int>(p.num_experts), G = static_cast<int>(p.n_group);
  const int per_group = E / G;
  const S* sc = static_cast<const S*>(p.scores) + t * p.scores_stride;
  const B* bias = static_cast<const B*>(p.bias);
  float sg[kDsrPerLane], bv[kDsrPerLane];
  uint32_t present = 0;  // bit j: expert lane + 32 j exists
  FLASHINFER_UNROLL
  for (int j = 0; j < kDsrPerLane; ++j) {
    const int e = j * 32 + lane;
    sg[j] = 0.0f;
    bv[j] = 0.0f;
    if (e < E) {
      sg[j] = 1.0f / (1.0f + expf(-to_f32(sc[e])));
      bv[j] = sg[j] + to_f32(bias[static_cast<int64_t>(e) * p.bias_stride]);
      present |= 1u << j;
    }
  }
  // Groups: the kept ones as a mask (bit g).
  const uint32_t kept = G == 1 ? 1u : dsr_pick_groups(bv, lane, G, per_group, p.topk_group);
  // This lane's experts in kept groups (bit j).
  uint32_t open = 0;
  FLASHINFER_UNROLL
  for (int j = 0; j < kDsrPerLane; ++j) {
    const int e = j * 32 + lane;
    if (((present >> j) & 1u) && ((kept >> (e / per_group)) & 1u)) open |= 1u << j;
  }
  // Experts: topk argmaxes over the open ones (the op refuses calls whose kept groups hold fewer
  // than topk experts). Lane i keeps the i-th pick.
  int32_t my_sel = 0;
  float my_s = 0.0f, sum = 0.0f;
  for (int64_t i = 0; i < p.topk; ++i) {
    float best_s;
    const int32_t best = dsr_pick_open(open, bv, sg, lane, best_s);
    sum += best_s;
    if (lane == i) {
      my_sel = best;
      my_s = best_s;
    }
  }
  if (lane < p.topk) {
    const float denom = sum + 1e-20f;
    V* vals = static_cast<V*>(p.topk_values) + t * p.values_stride;
    vals[lane] = from_f32<V>(my_s / denom * p.routed_scaling_factor);
    p.topk_indices[t * p.indices_stride + lane] = my_sel;
    if (p.replay_out) p.replay_out[t * p.replay_stride + lane] = static_cast<int16_t>(my_sel);
  }
  pdl_launch_dependents();
}

// ---- trtllm FP8 (DeepSeek block-scale) MoE -------------------------------------------------

__device__ __forceinline__ float fp8_at(const void* base, int64_t i) {
  return static_cast<float>(static_cast<const __nv_fp8_e4m3*>(base)[i]);
}
__device__ __forceinline__ float bf16_round(float v) {
  return __bfloat162float(__float2bfloat16(v));
}
__device__ __forceinline__ float load_routing(const void* base, DType dt, int64_t i) {
  return dt == DType::kBFloat16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i])
                                : static_cast<const float*>(base)[i];
}

// The routing of the trtllm MoE ops (routing from logits, or the _routed_ ops' precomputed ids
// and weights) as the CPU reference's (moe_routing / trtllm_route): a warp a token, kTrWarps
// tokens a block, into ids / w [num_tokens, top_k], the weights rounded to bf16 as the trtllm
// launchers keep them (the bf16 bits also to expert_weights_out when set); routing_replay_out
// when set. Lane l holds experts l, l + 32, ... (num_experts <= kFp8MoeCudaMaxExperts; grouped
// selection needs n_group <= 32: the launchers refuse more) in registers, each score computed
// once; the groups and the experts are picked by the warp argmaxes of fused_topk_deepseek's
// kernel (kernels/deepseek_routing_rules.h: what the reference's sequential loops pick, NaN,
// infinities and ties too). The sums the reference makes in order (a softmax's denominator, the
// picks' weights) are made in that order by lane 0 over the warp's shared memory, so the floats
// are those of the thread-a-token kernel this replaces (4 KB of local arrays a thread; now the
// test oracle, tests/oracle/moe_routing_oracle.cu).
constexpr int kTrWarps = 4;
constexpr int kTrPerLane = static_cast<int>(kFp8MoeCudaMaxExperts / 32);

/// Dynamic shared memory of trtllm_route_kernel: per warp the E scores, then K weights and K ids.
constexpr std::size_t trtllm_route_smem(int64_t E, int64_t K) {
  return static_cast<std::size_t>(kTrWarps * (E + 2 * K)) * 4u;
}

__global__ void __launch_bounds__(kTrWarps * 32)
    trtllm_route_kernel(TrtllmMoeParams b, int32_t* ids, float* ws) {
  extern __shared__ float tr_smem[];
  pdl_wait();
  const MoeRoutingParams& r = b.routing;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kTrWarps + warp;
  if (t >= r.num_tokens) return;  // the whole warp; no block barrier follows
  const int E = b.precomputed ? 0 : static_cast<int>(r.num_experts);
  const int K = static_cast<int>(r.top_k);
  float* xs = tr_smem + static_cast<int64_t>(warp) * (E + 2 * K);  // [E]
  float* pw = xs + E;                                              // [K] the picks' weights
  int32_t* pid = reinterpret_cast<int32_t*>(pw + K);               // [K] their ids
  if (b.precomputed) {
    for (int k = lane; k < K; k += 32) {
      const int64_t i = t * b.routed_stride + k;
      if (b.packed) {
        const uint32_t v = static_cast<uint32_t>(b.packed[i]);
        pid[k] = static_cast<int32_t>(v >> 16);
        pw[k] = __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(v & 0xFFFFu)));
      } else {
        pid[k] = b.ids[i];
        pw[k] = load_routing(b.weights, b.weights_dtype, i);
      }
    }
  } else {
    const int G = r.n_group > 1 ? static_cast<int>(r.n_group) : 1, per_group = E / G;
    const int TG =
        r.method == MoeRouting::kDeepSeekV3 && G > 1 ? static_cast<int>(r.topk_group) : G;
    float x[kTrPerLane], sel[kTrPerLane];
    uint32_t present = 0;  // bit j: expert lane + 32 j exists
    FLASHINFER_UNROLL
    for (int j = 0; j < kTrPerLane; ++j) {
      const int e = j * 32 + lane;
      x[j] = 0.0f;
      if (e < E) {
        x[j] = load_routing(r.logits, r.logits_dtype, t * r.logits_stride + e);
        present |= 1u << j;
      }
    }
    switch (r.method) {
      case MoeRouting::kDefault:
      case MoeRouting::kRenormalizeNaive: {
        float mx = -INFINITY;  // fmaxf ignores NaN in any order, as the reference's loop
        FLASHINFER_UNROLL
        for (int j = 0; j < kTrPerLane; ++j) {
          if ((present >> j) & 1u) mx = fmaxf(mx, x[j]);
        }
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        FLASHINFER_UNROLL
        for (int j = 0; j < kTrPerLane; ++j) {
          if ((present >> j) & 1u) {
            x[j] = expf(x[j] - mx);
            xs[j * 32 + lane] = x[j];
          }
        }
        __syncwarp();
        float denom = 0.0f;  // in expert order, as the reference adds
        if (lane == 0) {
          for (int e = 0; e < E; ++e) denom += xs[e];
        }
        denom = __shfl_sync(0xffffffffu, denom, 0);
        FLASHINFER_UNROLL
        for (int j = 0; j < kTrPerLane; ++j) x[j] /= denom;
        break;
      }
      case MoeRouting::kDeepSeekV3:
      case MoeRouting::kSigmoidRenorm:
      case MoeRouting::kMiniMax2:
      case MoeRouting::kSigmoid:
        FLASHINFER_UNROLL
        for (int j = 0; j < kTrPerLane; ++j) x[j] = 1.0f / (1.0f + expf(-x[j]));
        break;
      default:
        break;
    }
    const bool biased =
        r.bias && (r.method == MoeRouting::kDeepSeekV3 || r.method == MoeRouting::kMiniMax2);
    FLASHINFER_UNROLL
    for (int j = 0; j < kTrPerLane; ++j) {
      const int e = j * 32 + lane;
      sel[j] = x[j] + (biased && e < E ? moe_routing_bias(r.method, r.n_group,
                                                          load_routing(r.bias, r.bias_dtype, e))
                                       : 0.0f);
    }
    // Grouped selection (DeepSeekV3, TG < G): the kept groups as a mask (bit g).
    const uint32_t kept = TG < G ? dsr_pick_groups(sel, lane, G, per_group, TG) : 0xffffffffu;
    uint32_t open = 0;  // this lane's candidates (bit j), each cleared once picked
    FLASHINFER_UNROLL
    for (int j = 0; j < kTrPerLane; ++j) {
      const int e = j * 32 + lane;
      if (((present >> j) & 1u) && (TG >= G || ((kept >> (e / per_group)) & 1u))) {
        open |= 1u << j;
      }
    }
    for (int i = 0; i < K; ++i) {
      float best_x;
      int32_t best = dsr_pick_open(open, sel, x, lane, best_x);
      if (best < 0) {  // unreachable (the kept groups hold >= top_k experts): expert 0, as the CPU
        best = 0;
        best_x = __shfl_sync(0xffffffffu, x[0], 0);
      }
      if (lane == 0) {
        pid[i] = best;
        pw[i] = best_x;
      }
    }
    __syncwarp();
    if (lane == 0) {  // the weights as the reference's loops make them, in pick order
      float sum = 0.0f;
      for (int i = 0; i < K; ++i) sum += pw[i];
      switch (r.method) {
        case MoeRouting::kRenormalize: {
          float m = -INFINITY, d = 0.0f;
          for (int i = 0; i < K; ++i) m = fmaxf(m, pw[i]);
          for (int i = 0; i < K; ++i) {
            pw[i] = expf(pw[i] - m);
            d += pw[i];
          }
          for (int i = 0; i < K; ++i) pw[i] /= d;
          break;
        }
        case MoeRouting::kLlama4:
        case MoeRouting::kTopKSigmoid:  // selected on the raw logits, then squashed
          for (int i = 0; i < K; ++i) pw[i] = 1.0f / (1.0f + expf(-pw[i]));
          break;
        case MoeRouting::kRenormalizeNaive:
          for (int i = 0; i < K; ++i) pw[i] /= sum;
          break;
        case MoeRouting::kSigmoidRenorm:
          if (r.norm_topk_prob) {
            for (int i = 0; i < K; ++i) pw[i] /= fmaxf(sum, 1e-20f);
          }
          break;
        case MoeRouting::kDeepSeekV3:
        case MoeRouting::kMiniMax2:  // both scale by routed_scaling_factor (as the CPU reference)
          for (int i = 0; i < K; ++i) pw[i] = pw[i] * r.routed_scaling_factor / (sum + 1e-20f);
          break;
        default:
          break;
      }
    }
  }
  __syncwarp();
  for (int k = lane; k < K; k += 32) {
    const __nv_bfloat16 wb = __float2bfloat16(pw[k]);
    ids[t * K + k] = pid[k];
    ws[t * K + k] = trtllm_weights_in_bf16(b) ? __bfloat162float(wb) : pw[k];
    if (b.expert_weights_out) b.expert_weights_out[t * K + k] = __bfloat16_as_ushort(wb);
    if (b.replay_out) b.replay_out[t * b.replay_stride + k] = static_cast<int16_t>(pid[k]);
  }
  pdl_launch_dependents();
}

}  // namespace

void trtllm_route(const TrtllmMoeParams& b, int32_t* ids, float* w, void* stream, bool enable_pdl) {
  const MoeRoutingParams& r = b.routing;
  if (r.num_tokens <= 0) return;
  launch_kernel("trtllm_route", trtllm_route_kernel,
                dim3(static_cast<unsigned>((r.num_tokens + kTrWarps - 1) / kTrWarps)),
                dim3(kTrWarps * 32), trtllm_route_smem(b.precomputed ? 0 : r.num_experts, r.top_k),
                static_cast<cudaStream_t>(stream), enable_pdl, b, ids, w);
}

namespace {

// The local expert of a pair routed to global id ids[pair], or -1.
__device__ __forceinline__ int64_t trtllm_local_expert(const CutlassMoeParams& m,
                                                       const int32_t* ids, int64_t pair) {
  const int64_t e = ids[pair] - m.expert_offset;
  return (e >= 0 && e < m.num_local_experts) ? e : -1;
}

__device__ __forceinline__ int64_t fp8_local_expert(const TrtllmFp8MoeParams& p, int64_t pair) {
  return trtllm_local_expert(p.base.moe, p.ws_ids, pair);
}

// The GEMM rows of one pair: warp w computes rows w, w + kWarps, ... of n, each the fp32 sum
// over c < len of term(row(j), c) (lane-strided partials, then the warp's xor tree; row(j) once
// per row: the stored row, or what else term needs of plain row j), and lane 0 hands it to
// store(j, acc).
template <class Row, class Term, class Store>
__device__ __forceinline__ void warp_gemm_rows(int64_t n, int64_t len, Row row, Term term,
                                               Store store) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int64_t j = warp; j < n; j += kWarps) {
    const auto r = row(j);
    float acc = 0.0f;
    for (int64_t c = lane; c < len; c += 32) acc += term(r, c);
    acc = warp_reduce_sum(acc);
    if (lane == 0) store(j, acc);
  }
}

// After the block's GEMM1 row g is complete: h = bf16(activation(g)) (the trtllm kernels' one
// rounding between the GEMMs).
__device__ __forceinline__ void trtllm_activation_rows(const CutlassMoeParams& m, int64_t e,
                                                       const float* g, float* h) {
  __syncthreads();
  for (int64_t j = threadIdx.x; j < m.inter; j += blockDim.x) {
    h[j] = bf16_round(activation(m, e, g, j));
  }
}

// DeepSeek FP8: the activation handed to GEMM2 is e4m3 with one fp32 scale per 128 columns,
// scale = max(amax / 448, FLT_MIN), as upstream's unfused activation kernel (docs/MOE.md "FP8
// block scale"); h keeps the dequantized q * scale. One warp per 128-column block.
__device__ __forceinline__ void trtllm_fp8_activation_rows(const CutlassMoeParams& m, int64_t e,
                                                           const float* g, float* h) {
  __syncthreads();
  for (int64_t j = threadIdx.x; j < m.inter; j += blockDim.x) h[j] = activation(m, e, g, j);
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int64_t b = warp * 128; b < m.inter; b += kWarps * 128) {
    float amax = 0.0f;
    for (int64_t j = b + lane; j < b + 128 && j < m.inter; j += 32) amax = fmaxf(amax, fabsf(h[j]));
    for (int off = 16; off > 0; off >>= 1) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    }
    const float scale = fmaxf(__fdiv_rn(amax, 448.0f), FLT_MIN);
    for (int64_t j = b + lane; j < b + 128 && j < m.inter; j += 32) {
      const __nv_fp8_e4m3 q(__fdiv_rn(h[j], scale));  // RNE, satfinite
      h[j] = __fmul_rn(static_cast<float>(q), scale);
    }
  }
}

// Token blockIdx.x of the trtllm finalize: out = bf16(sum over k in k order of w * y) over the
// local pairs, product and sum rounded separately (no FMA) as the CPU references' scalar loops;
// weight 1 for every pair when `unit_weights` (the routing weight went to GEMM1's output).
// y(pair, j): the pair's GEMM2 output j (already rounded to bf16), wherever the route keeps it.
template <class Y>
__device__ __forceinline__ void trtllm_finalize_rows(const CutlassMoeParams& m, const int32_t* ids,
                                                     const float* w, bool unit_weights, Y y) {
  const int64_t t = blockIdx.x;
  auto* out = static_cast<__nv_bfloat16*>(m.out) + t * m.out_stride;
  for (int64_t j = threadIdx.x; j < m.hidden; j += blockDim.x) {
    float acc = 0.0f;
    for (int64_t k = 0; k < m.top_k; ++k) {
      const int64_t pair = t * m.top_k + k;
      if (trtllm_local_expert(m, ids, pair) < 0) continue;
      const float wk = unit_weights ? 1.0f : w[pair];
      acc = __fadd_rn(acc, __fmul_rn(wk, y(pair, j)));
    }
    out[j] = __float2bfloat16(acc);
  }
  pdl_launch_dependents();
}

// The GEMV routes' finalize: y fp32 [pairs, hidden] in pair order.
__device__ __forceinline__ void trtllm_finalize_token(const CutlassMoeParams& m, const int32_t* ids,
                                                      const float* w, const float* y,
                                                      bool unit_weights = false) {
  trtllm_finalize_rows(m, ids, w, unit_weights,
                       [&](int64_t pair, int64_t j) { return y[pair * m.hidden + j]; });
}

// Per-tensor FP8, after the block's GEMM1 row g (already scaled as the CPU reference scales it)
// is complete: the activation, times output1_scales_scalar for a non-gated one (a gated one
// carries it in its up half), quantized to e4m3 (RNE, satfinite) without a scale: h keeps the
// e4m3 values GEMM2 reads (docs/MOE.md, "FP8 per tensor").
// SwigluStep reads the raw accumulators (times Llama4's input scale) and applies sc / sg in the
// step itself (kernels/moe_params.h, trtllm_swiglu_step); the others read the scaled rows.
__device__ __forceinline__ void trtllm_fp8_per_tensor_activation_rows(const CutlassMoeParams& m,
                                                                      int64_t e, float sc, float sg,
                                                                      const float* g, float* h) {
  __syncthreads();
  const bool gated = moe_act_is_gated(m.act);
  const bool step = m.act == MoeAct::kSwigluStep;
  const float L = trtllm_step_limit(m.swiglu_limit, e, sg);
  for (int64_t j = threadIdx.x; j < m.inter; j += blockDim.x) {
    float v;
    if (step) {
      v = trtllm_swiglu_step(g[j], silu(__fmul_rn(g[m.inter + j], sg)), L, sc, sg);
    } else {
      v = activation(m, e, g, j);
      if (!gated) v = __fmul_rn(v, sc);
    }
    h[j] = static_cast<float>(__nv_fp8_e4m3(v));
  }
}

// A plain row j of an expert's weight as the GEMM terms read it: its stored row, and the row of
// its 128 x 128 block scales (DeepSeek FP8; null for per-tensor scales).
struct Fp8WeightRow {
  int64_t row;
  const float* scale;
};

// One block per (token, k) pair: the GEMM1 row (one warp per output; weights read in their
// stored layout), then the activation: DeepSeek FP8 block-dequantizes and quantizes the
// activation to e4m3 per 128 columns; per-tensor FP8 scales GEMM1's outputs (up by
// output1_scales_scalar, gate by output1_scales_gate_scalar, both by the routing weight for
// Llama4's use_routing_scales_on_input), in the CPU reference's order.
__global__ void fp8_moe_gemm1_kernel(TrtllmFp8MoeParams p) {
  const CutlassMoeParams& m = p.base.moe;
  const int64_t pair = blockIdx.x;
  const int64_t e = fp8_local_expert(p, pair);
  if (e < 0) return;
  const int64_t t = pair / m.top_k, H = m.hidden, I = m.inter;
  const bool gated = moe_act_is_gated(m.act);
  const int64_t N1 = gated ? 2 * I : I;
  float* g = p.ws_g1 + pair * N1;
  if (p.block_scale) {
    const int64_t HB = H / 128;
    const float* w1s = p.w1_scale + e * (N1 / 128) * HB;
    warp_gemm_rows(
        N1, H,
        [&](int64_t j) {
          return Fp8WeightRow{moe_stored_row(p.w1_index, N1, j), w1s + (j / 128) * HB};
        },
        [&](const Fp8WeightRow& r, int64_t c) {
          const float xv =
              fp8_at(m.input, t * m.in_stride + c) * p.hs_scale[(c / 128) * p.hs_scale_stride + t];
          return xv * fp8_at(m.w1, moe_weight_offset(p.w1_index, N1, H, e, r.row, c)) *
                 r.scale[c / 128];
        },
        [&](int64_t j, float acc) {
          // gemm1_bias: fp32, rows stored as the weights' (the CPU reference's plain order).
          const auto* b1 = static_cast<const float*>(m.b1);
          g[j] = b1 ? acc + b1[e * N1 + moe_stored_row(p.w1_index, N1, j)] : acc;
        });
    trtllm_fp8_activation_rows(m, e, g, p.ws_h + pair * I);
    return;
  }
  const float rw = p.routing_scales_on_input ? bf16_round(p.ws_w[pair]) : 1.0f;  // bf16 always
  const float sc = p.out1_scale[e], sg = p.out1_gate_scale[e];
  warp_gemm_rows(
      N1, H, [&](int64_t j) { return moe_stored_row(p.w1_index, N1, j); },
      [&](int64_t row, int64_t c) {
        return fp8_at(m.input, t * m.in_stride + c) *
               fp8_at(m.w1, moe_weight_offset(p.w1_index, N1, H, e, row, c));
      },
      [&](int64_t j, float acc) {
        g[j] = m.act == MoeAct::kSwigluStep
                   ? __fmul_rn(acc, rw)
                   : __fmul_rn(__fmul_rn(acc, gated && j < I ? sc : sg), rw);
      });
  trtllm_fp8_per_tensor_activation_rows(m, e, sc, sg, g, p.ws_h + pair * I);
}

// One block per pair: the GEMM2 row (block-dequantized weights, or times output2_scales_scalar
// for per-tensor FP8), rounded to bf16.
__global__ void fp8_moe_gemm2_kernel(TrtllmFp8MoeParams p) {
  const CutlassMoeParams& m = p.base.moe;
  const int64_t pair = blockIdx.x;
  const int64_t e = fp8_local_expert(p, pair);
  if (e < 0) return;
  const int64_t H = m.hidden, I = m.inter, IB = I / 128;
  const float* h = p.ws_h + pair * I;
  float* y = p.ws_y + pair * H;
  if (p.block_scale) {
    const float* w2s = p.w2_scale + e * (H / 128) * IB;
    warp_gemm_rows(
        H, I,
        [&](int64_t j) {
          return Fp8WeightRow{moe_stored_row(p.w2_index, H, j), w2s + (j / 128) * IB};
        },
        [&](const Fp8WeightRow& r, int64_t c) {
          return h[c] * fp8_at(m.w2, moe_weight_offset(p.w2_index, H, I, e, r.row, c)) *
                 r.scale[c / 128];
        },
        [&](int64_t j, float acc) {
          const auto* b2 = static_cast<const float*>(m.b2);
          y[j] = bf16_round(b2 ? acc + b2[e * H + moe_stored_row(p.w2_index, H, j)] : acc);
        });
    return;
  }
  const float s2 = p.out2_scale[e];
  warp_gemm_rows(
      H, I, [&](int64_t j) { return moe_stored_row(p.w2_index, H, j); },
      [&](int64_t row, int64_t c) {
        return h[c] * fp8_at(m.w2, moe_weight_offset(p.w2_index, H, I, e, row, c));
      },
      [&](int64_t j, float acc) { y[j] = bf16_round(__fmul_rn(acc, s2)); });
}

// One block per token.
__global__ void fp8_moe_finalize_kernel(TrtllmFp8MoeParams p) {
  trtllm_finalize_token(p.base.moe, p.ws_ids, p.ws_w, p.ws_y, p.routing_scales_on_input);
}

// ---- cutlass_fused_moe FP8 (per tensor, DeepSeek block scale): the GEMV route -------------------
// The CPU reference's rounding points (kernels/cpu/moe_cutlass_fp8_cpu.cpp, docs/MOE.md
// "cutlass_fused_moe: FP8 paths") with its per-element arithmetic
// (kernels/moe_cutlass_fp8_rules.h): one block per (token, k) pair and one warp per GEMM output
// as the unquantized GEMV route, fp32 intermediates in the stream's scratch
// (moe::moe_fp8_gemv_scratch). e4m3 x e4m3 products are exact in fp32, so the order of a GEMM's
// (or a 128-wide K block's) fp32 sum differs from the CPU, and the gated activations (the
// device's expf / erff / tanhf against the CPU's, within an ulp), whose result is then cast to
// e4m3 (or sets a block's amax), so a code can move by one step there.

// The bias element i of type O (upstream: biases of the output dtype), 0 without one.
template <class O>
__device__ __forceinline__ float fp8_bias(const void* b, int64_t i) {
  return b ? to_f32(static_cast<const O*>(b)[i]) : 0.0f;
}

// The 1x128 quantizer (upstream's scale_1x128_kernel, the CPU's quantize_1x128) of a row of n
// values load(j): one warp per 128-column block, amax by the warp's max tree (max is exact in
// any order), values moe_e4m3_sat(v * quant) to store(j, value) (which may write the row load
// reads: each lane rewrites only what it read, after the block's amax), the stored scales
// 1 / quant to store_scale(b, scale) (fp8_quantize_1x128_to: to ds[b]). fp8_quantize_1x128:
// into a float row q. store(j, v) receives the e4m3 value v of element j (an fp32 holding an e4m3
// code's value).
template <class Load, class Store, class ScaleStore>
__device__ __forceinline__ void fp8_quantize_1x128_each(int64_t n, Load load, Store store,
                                                        ScaleStore store_scale) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int64_t b = warp; b * kMoeFp8Block < n; b += kWarps) {
    const int64_t j0 = b * kMoeFp8Block;
    const int64_t j1 = j0 + kMoeFp8Block < n ? j0 + kMoeFp8Block : n;
    // A lane's values of the block (at most 4), loaded once: load may be an activation.
    constexpr int kPerLane = kMoeFp8Block / 32;
    float v[kPerLane];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t j = j0 + lane + 32 * i;
      v[i] = j < j1 ? load(j) : 0.0f;
      if (j < j1) amax = fp32_abs_max(amax, v[i]);
    }
    for (int off = 16; off > 0; off >>= 1) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    }
    const float quant = moe_fp8_block_quant(amax);
    if (lane == 0) store_scale(b, moe_fp8_block_dequant(quant));
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t j = j0 + lane + 32 * i;
      if (j < j1) store(j, moe_e4m3_sat(fp32_mul(v[i], quant)));
    }
  }
}
template <class Load, class Store>
__device__ __forceinline__ void fp8_quantize_1x128_to(int64_t n, Load load, Store store,
                                                      float* ds) {
  fp8_quantize_1x128_each(n, load, store, [&](int64_t b, float d) { ds[b] = d; });
}
template <class Load>
__device__ __forceinline__ void fp8_quantize_1x128(int64_t n, Load load, float* q, float* ds) {
  fp8_quantize_1x128_to(
      n, load, [&](int64_t j, float v) { q[j] = v; }, ds);
}

// Block scale: one block per token, its bf16 input row quantized 1x128 into xq / xs (the CPU
// quantizes each routed row of the token: the same values).
__global__ void cutlass_fp8_quantize_kernel(CutlassMoeFp8Params p, float* xq, float* xs) {
  pdl_wait();
  const CutlassMoeParams& m = p.base;
  const int64_t t = blockIdx.x, H = m.hidden;
  const auto* x = static_cast<const __nv_bfloat16*>(m.input) + t * m.in_stride;
  fp8_quantize_1x128(
      H, [&](int64_t j) { return __bfloat162float(x[j]); }, xq + t * H,
      xs + t * ((H + kMoeFp8Block - 1) / kMoeFp8Block));
}

// The block-scale GEMM's rows: warp w computes outputs w, w + kWarps, ... of n, each over the K
// blocks of 128: the block's fp32 dot product of a (e4m3 values as fp32) with the weight row's
// e4m3 codes (lane-strided partials, the warp's xor tree: every lane holds the same sum), then
// moe_fp8_block_accumulate with the row's activation scale as[b] and the weight block's scale
// ws[(j / 128) * kb + b]; lane 0 hands the fp32 result to store(j, acc).
template <class Store>
__device__ __forceinline__ void fp8_block_gemm_rows(int64_t n, int64_t k, const float* a,
                                                    const float* as, const uint8_t* w,
                                                    const float* ws, Store store) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t kb = (k + kMoeFp8Block - 1) / kMoeFp8Block;
  for (int64_t j = warp; j < n; j += kWarps) {
    const uint8_t* wr = w + j * k;
    const float* wsr = ws + (j / kMoeFp8Block) * kb;
    float acc = 0.0f;
    for (int64_t b = 0; b < kb; ++b) {
      const int64_t c1 = (b + 1) * kMoeFp8Block < k ? (b + 1) * kMoeFp8Block : k;
      float part = 0.0f;
      for (int64_t c = b * kMoeFp8Block + lane; c < c1; c += 32) part += a[c] * fp8_at(wr, c);
      part = warp_reduce_sum(part);
      acc = moe_fp8_block_accumulate(acc, as[b], wsr[b], part);
    }
    if (lane == 0) store(j, acc);
  }
}

// One block per pair: GEMM1's row, its fc1 bias added to the rounded value in fp32, the
// activation; per tensor g1 = round_O(acc * fc1_dequant[e]) and h = e4m3_sat(act * fc2_quant),
// block scale g1 = bf16(block GEMM of xq) and h = bf16(act), then h quantized 1x128 in place
// (scales to hs). h holds the e4m3 values GEMM2 reads.
template <class O>
__global__ void cutlass_fp8_gemm1_kernel(CutlassMoeFp8Params p, const float* xq, const float* xs,
                                         float* hs) {
  pdl_wait();
  const CutlassMoeParams& m = p.base;
  const int64_t pair = blockIdx.x;
  const int64_t e = local_expert(m, pair);
  if (e < 0) return;
  const int64_t t = pair / m.top_k, H = m.hidden, I = m.inter;
  const int64_t N1 = moe_act_is_gated(m.act) ? 2 * I : I;
  const uint8_t* w1 = static_cast<const uint8_t*>(m.w1) + e * N1 * H;
  const void* b1 = m.b1 ? static_cast<const O*>(m.b1) + e * N1 : nullptr;
  float* g = m.ws_g1 + pair * N1;
  float* h = m.ws_h + pair * I;
  if (p.block_scale) {
    const int64_t HB = (H + kMoeFp8Block - 1) / kMoeFp8Block;
    const int64_t IB = (I + kMoeFp8Block - 1) / kMoeFp8Block;
    fp8_block_gemm_rows(
        N1, H, xq + t * H, xs + t * HB, w1,
        p.w1_block_scale + e * ((N1 + kMoeFp8Block - 1) / kMoeFp8Block) * HB,
        [&](int64_t j, float acc) { g[j] = fp32_add(bf16_round(acc), fp8_bias<O>(b1, j)); });
    __syncthreads();
    for (int64_t j = threadIdx.x; j < I; j += blockDim.x) {
      h[j] = bf16_round(activation(m, e, g, j));
    }
    __syncthreads();
    fp8_quantize_1x128(
        I, [&](int64_t j) { return h[j]; }, h, hs + pair * IB);
    return;
  }
  const uint8_t* x = static_cast<const uint8_t*>(m.input) + t * m.in_stride;
  const float alpha = p.fc1_dequant[e];
  warp_gemm_rows(
      N1, H, [&](int64_t j) { return w1 + j * H; },
      [&](const uint8_t* wr, int64_t c) { return fp8_at(x, c) * fp8_at(wr, c); },
      [&](int64_t j, float acc) {
        g[j] = fp32_add(round_as<O>(fp32_mul(acc, alpha)), fp8_bias<O>(b1, j));
      });
  __syncthreads();
  const float q = p.fc2_quant[p.fc2_quant_per_expert ? e : 0];
  for (int64_t j = threadIdx.x; j < I; j += blockDim.x) {
    h[j] = moe_e4m3_sat(fp32_mul(activation(m, e, g, j), q));
  }
}

// One block per pair: GEMM2's row, round_O(acc * fc2_dequant[e]) per tensor, bf16(block GEMM of
// the quantized activation) for block scale, into the pair's fp32 row of ws_y.
template <class O>
__global__ void cutlass_fp8_gemm2_kernel(CutlassMoeFp8Params p, const float* hs) {
  const CutlassMoeParams& m = p.base;
  const int64_t pair = blockIdx.x;
  const int64_t e = local_expert(m, pair);
  if (e < 0) return;
  const int64_t H = m.hidden, I = m.inter;
  const uint8_t* w2 = static_cast<const uint8_t*>(m.w2) + e * H * I;
  const float* h = m.ws_h + pair * I;
  float* y = m.ws_y + pair * H;
  if (p.block_scale) {
    const int64_t HB = (H + kMoeFp8Block - 1) / kMoeFp8Block;
    const int64_t IB = (I + kMoeFp8Block - 1) / kMoeFp8Block;
    fp8_block_gemm_rows(H, I, h, hs + pair * IB, w2, p.w2_block_scale + e * HB * IB,
                        [&](int64_t j, float acc) { y[j] = bf16_round(acc); });
    return;
  }
  const float alpha = p.fc2_dequant[e];
  warp_gemm_rows(
      H, I, [&](int64_t j) { return w2 + j * I; },
      [&](const uint8_t* wr, int64_t c) { return h[c] * fp8_at(wr, c); },
      [&](int64_t j, float acc) { y[j] = round_as<O>(fp32_mul(acc, alpha)); });
}

// DeepSeek block scale, grouped route: one block per token, its bf16 input row quantized 1x128
// once (cutlass_fp8_quantize_kernel's values) into the expert-sorted e4m3 rows xs of each of its
// pairs routed to a local expert (row perm[pair]), the scales into those rows of xss. rows (dynamic
// shared memory, top_k ints): the token's rows, -1 for a pair routed elsewhere.
__global__ void cutlass_fp8_block_gather_kernel(CutlassMoeFp8Params p, const int32_t* perm,
                                                __nv_fp8_e4m3* xs, float* xss) {
  extern __shared__ int32_t rows[];
  pdl_wait();
  const CutlassMoeParams& m = p.base;
  const int64_t t = blockIdx.x, K = m.top_k, H = m.hidden;
  const int64_t HB = (H + kMoeFp8Block - 1) / kMoeFp8Block;
  bool any = false;
  for (int64_t k = 0; k < K; ++k) any |= local_expert(m, t * K + k) >= 0;  // uniform in the block
  if (!any) return;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    rows[k] = local_expert(m, t * K + k) >= 0 ? perm[t * K + k] : -1;
  }
  __syncthreads();
  const auto* x = static_cast<const __nv_bfloat16*>(m.input) + t * m.in_stride;
  fp8_quantize_1x128_each(
      H, [&](int64_t j) { return __bfloat162float(x[j]); },
      [&](int64_t j, float v) {
        const __nv_fp8_e4m3 c(v);  // v is an e4m3 value: exact
        for (int64_t k = 0; k < K; ++k) {
          if (rows[k] >= 0) xs[rows[k] * H + j] = c;
        }
      },
      [&](int64_t b, float d) {
        for (int64_t k = 0; k < K; ++k) {
          if (rows[k] >= 0) xss[rows[k] * HB + b] = d;
        }
      });
}

// The grouped routes' bias + activation of element j of a pair's GEMM1 row g (its expert e's fc1
// bias row b1, or null; gated: the gate I further), the bias added in fp32 as
// cutlass_fp8_gemm1_kernel adds it.
template <class O, class G>
__device__ __forceinline__ float grouped_biased_activation(const CutlassMoeParams& m, int64_t e,
                                                           const G* g, const void* b1, int64_t j) {
  const int64_t I = m.inter;
  const float up = fp32_add(to_f32(g[j]), fp8_bias<O>(b1, j));
  const float gate =
      moe_act_is_gated(m.act) ? fp32_add(to_f32(g[I + j]), fp8_bias<O>(b1, I + j)) : 0.0f;
  return activation_value(m, e, up, gate);
}

// DeepSeek block scale, grouped route: one block per pair, its GEMM1 row (bf16, rounded by the
// GEMM) plus the fc1 bias in fp32, the activation rounded to bf16, then quantized 1x128 into the
// pair's e4m3 row of h and its scales: cutlass_fp8_gemm1_kernel's block-scale arithmetic.
template <class O>
__global__ void cutlass_fp8_block_activation_kernel(CutlassMoeFp8Params p, const int32_t* perm,
                                                    const __nv_bfloat16* g1, __nv_fp8_e4m3* h,
                                                    float* hss) {
  const CutlassMoeParams& m = p.base;
  const int64_t pair = blockIdx.x;
  const int64_t e = local_expert(m, pair);
  if (e < 0) return;
  const int64_t row = perm[pair], I = m.inter;
  const int64_t N1 = moe_act_is_gated(m.act) ? 2 * I : I;
  const __nv_bfloat16* g = g1 + row * N1;
  const void* b1 = m.b1 ? static_cast<const O*>(m.b1) + e * N1 : nullptr;
  auto act = [&](int64_t j) { return bf16_round(grouped_biased_activation<O>(m, e, g, b1, j)); };
  __nv_fp8_e4m3* hr = h + row * I;
  fp8_quantize_1x128_to(
      I, act, [&](int64_t j, float v) { hr[j] = __nv_fp8_e4m3(v); },
      hss + row * ((I + kMoeFp8Block - 1) / kMoeFp8Block));
}

// FP8 per tensor, grouped route: one block per pair, the bias and activation of its GEMM1 row (O,
// rounded by the GEMM with fc1_dequant[e] as alpha) as cutlass_fp8_gemm1_kernel's, the e4m3
// codes of act * fc2_quant into its row of h (GEMM2's a operand).
template <class O>
__global__ void cutlass_fp8_grouped_activation_kernel(CutlassMoeFp8Params p, const int32_t* perm,
                                                      const O* g1, __nv_fp8_e4m3* h) {
  const CutlassMoeParams& m = p.base;
  const int64_t pair = blockIdx.x;
  const int64_t e = local_expert(m, pair);
  if (e < 0) return;
  const int64_t row = perm[pair], I = m.inter;
  const int64_t N1 = moe_act_is_gated(m.act) ? 2 * I : I;
  const O* g = g1 + row * N1;
  const void* b1 = m.b1 ? static_cast<const O*>(m.b1) + e * N1 : nullptr;
  const float q = p.fc2_quant[p.fc2_quant_per_expert ? e : 0];
  __nv_fp8_e4m3* hr = h + row * I;
  for (int64_t j = threadIdx.x; j < I; j += blockDim.x) {
    // RNE, satfinite
    hr[j] = __nv_fp8_e4m3(fp32_mul(grouped_biased_activation<O>(m, e, g, b1, j), q));
  }
}

// One block per token: out = round_O(sum over k in k order of scale * (y + b2)), the CPU's
// moe_fp8_finalize_step (b2 of type O, null off tensor-parallel rank 0). y holds the GEMM2 rows
// already rounded to O (fp32 on the GEMV route, O on the grouped one): pair i's row is perm[i]
// (grouped route) or i (perm null).
template <class O, class Y>
__global__ void cutlass_fp8_finalize_kernel(CutlassMoeFp8Params p, const Y* y,
                                            const int32_t* perm) {
  const CutlassMoeParams& m = p.base;
  const int64_t t = blockIdx.x, H = m.hidden;
  O* out = static_cast<O*>(m.out) + t * m.out_stride;
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
    float acc = 0.0f;
    for (int64_t k = 0; k < m.top_k; ++k) {
      const int64_t pair = t * m.top_k + k;
      const int64_t e = local_expert(m, pair);
      if (e < 0) continue;
      const int64_t row = perm ? perm[pair] : pair;
      acc =
          moe_fp8_finalize_step(acc, load_scale(m, t * m.scales_stride + k), to_f32(y[row * H + j]),
                                m.b2 != nullptr, fp8_bias<O>(m.b2, e * H + j));
    }
    out[j] = from_f32<O>(acc);
  }
  pdl_launch_dependents();
}

// ---- trtllm BF16 MoE -----------------------------------------------------------------------
// The CPU reference's rounding points (cpu::trtllm_moe: cutlass_moe with round_gemm1 = false):
// routing weights rounded to bf16; GEMM1 accumulated in fp32 and fed unrounded to the
// activation; the activation rounded to bf16; GEMM2 accumulated in fp32, rounded to bf16; the
// finalize sums w * y over k in k order in fp32 (product and sum rounded separately, no FMA, as
// the CPU's scalar loop) and rounds once to bf16. Weights are read in their stored layout
// (moe_weight_offset), never copied.

__device__ __forceinline__ int64_t bf16_local_expert(const TrtllmBf16MoeParams& p, int64_t pair) {
  return trtllm_local_expert(p.base.moe, p.ws_ids, pair);
}

// do_finalize=False: expanded_to_permuted as the CPU's grouped order (local experts ascending,
// pairs ascending within an expert; -1 for a pair with no local expert). Block e < El numbers
// expert e's pairs: its first row is the count of pairs of lower local experts, then a
// ballot-based block scan over chunks of pairs keeps pair order. Block El writes the -1s and
// zeroes the rows past the local pairs.
__global__ void bf16_moe_permute_kernel(TrtllmBf16MoeParams p) {
  const CutlassMoeParams& m = p.base.moe;
  const int64_t TK = m.num_tokens * m.top_k, e = blockIdx.x;
  __shared__ int warp_count[kWarps];
  int64_t row = 0;
  for (int64_t c0 = 0; c0 < TK; c0 += blockDim.x) {
    const int64_t i = c0 + threadIdx.x;
    const int64_t le = i < TK ? bf16_local_expert(p, i) : -1;
    row += __syncthreads_count(le >= 0 && le < e);
  }
  if (e == m.num_local_experts) {
    for (int64_t i = threadIdx.x; i < TK; i += blockDim.x) {
      if (bf16_local_expert(p, i) < 0) m.expanded_to_permuted[i] = -1;
    }
    auto* out = static_cast<__nv_bfloat16*>(m.permuted_out);
    for (int64_t i = row * m.hidden + threadIdx.x; i < TK * m.hidden; i += blockDim.x) {
      out[i] = __float2bfloat16(0.0f);
    }
    return;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int64_t c0 = 0; c0 < TK; c0 += blockDim.x) {
    const int64_t i = c0 + threadIdx.x;
    const bool mine = i < TK && bf16_local_expert(p, i) == e;
    const unsigned mask = __ballot_sync(0xFFFFFFFFu, mine);
    if (lane == 0) warp_count[warp] = __popc(mask);
    __syncthreads();
    int64_t before = row, total = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) before += warp_count[w];
      total += warp_count[w];
    }
    if (mine) {
      m.expanded_to_permuted[i] = static_cast<int32_t>(before + __popc(mask & ((1u << lane) - 1u)));
    }
    row += total;
    __syncthreads();  // warp_count is rewritten by the next chunk
  }
}

// One block per (token, k) pair: the GEMM1 row (one warp per output, fp32, not rounded), then
// the activation rounded to bf16.
__global__ void bf16_moe_gemm1_kernel(TrtllmBf16MoeParams p) {
  const CutlassMoeParams& m = p.base.moe;
  const int64_t pair = blockIdx.x;
  const int64_t e = bf16_local_expert(p, pair);
  if (e < 0) return;
  const int64_t t = pair / m.top_k, H = m.hidden, I = m.inter;
  const int64_t N1 = moe_act_is_gated(m.act) ? 2 * I : I;
  const auto* x = static_cast<const __nv_bfloat16*>(m.input) + t * m.in_stride;
  const auto* w1 = static_cast<const __nv_bfloat16*>(m.w1);
  float* g = p.ws_g1 + pair * N1;
  warp_gemm_rows(
      N1, H, [&](int64_t j) { return moe_stored_row(p.w1_index, N1, j); },
      [&](int64_t row, int64_t c) {
        return __bfloat162float(x[c]) *
               __bfloat162float(w1[moe_weight_offset(p.w1_index, N1, H, e, row, c)]);
      },
      [&](int64_t j, float acc) { g[j] = acc; });
  trtllm_activation_rows(m, e, g, p.ws_h + pair * I);
}

// One block per pair: the GEMM2 row rounded to bf16, to ws_y (finalizing) or to the pair's row
// of permuted_out (do_finalize=False).
__global__ void bf16_moe_gemm2_kernel(TrtllmBf16MoeParams p) {
  const CutlassMoeParams& m = p.base.moe;
  const int64_t pair = blockIdx.x;
  const int64_t e = bf16_local_expert(p, pair);
  if (e < 0) return;
  const int64_t H = m.hidden, I = m.inter;
  const float* h = p.ws_h + pair * I;
  const auto* w2 = static_cast<const __nv_bfloat16*>(m.w2);
  __nv_bfloat16* prow = m.permuted_out ? static_cast<__nv_bfloat16*>(m.permuted_out) +
                                             m.expanded_to_permuted[pair] * H
                                       : nullptr;
  float* y = p.ws_y ? p.ws_y + pair * H : nullptr;
  warp_gemm_rows(
      H, I, [&](int64_t j) { return moe_stored_row(p.w2_index, H, j); },
      [&](int64_t row, int64_t c) {
        return h[c] * __bfloat162float(w2[moe_weight_offset(p.w2_index, H, I, e, row, c)]);
      },
      [&](int64_t j, float acc) {
        const __nv_bfloat16 v = __float2bfloat16(acc);
        if (prow) {
          prow[j] = v;
        } else {
          y[j] = __bfloat162float(v);
        }
      });
}

// One block per token.
__global__ void bf16_moe_finalize_kernel(TrtllmBf16MoeParams p) {
  trtllm_finalize_token(p.base.moe, p.ws_ids, p.ws_w, p.ws_y);
}

// ---- trtllm BF16 MoE, grouped route (moe_grouped_plan.h) --------------------------------------
// cutlass_fused_moe's permutation passes and gather (their CutlassMoeParams reading the routing's
// ids as token_selected_experts), GEMM1 on the tensor-core grouped GEMM into fp32 rows (not
// rounded, as the GEMV route's), the activation below rounded to bf16, GEMM2 on the same kernel
// rounded to bf16, then the finalize (or the permuted output) through the permutation. The GEMMs
// run on the weights' stored rows: plain output j of a pair's row is column moe_stored_row(j).

// One block per pair: the activation of its GEMM1 row as trtllm_activation_rows, rounded to bf16
// into its row of h.
__global__ void bf16_moe_activation_kernel(TrtllmBf16MoeParams p, const int32_t* perm,
                                           const float* g1, __nv_bfloat16* h) {
  const CutlassMoeParams& m = p.base.moe;
  const int64_t pair = blockIdx.x;
  const int64_t e = bf16_local_expert(p, pair);
  if (e < 0) return;
  const int64_t row = perm[pair], I = m.inter;
  const bool gated = moe_act_is_gated(m.act);
  const int64_t N1 = gated ? 2 * I : I;
  const float* g = g1 + row * N1;
  __nv_bfloat16* hr = h + row * I;
  for (int64_t j = threadIdx.x; j < I; j += blockDim.x) {
    const float up = g[moe_stored_row(p.w1_index, N1, j)];
    const float gate = gated ? g[moe_stored_row(p.w1_index, N1, I + j)] : 0.0f;
    hr[j] = __float2bfloat16(activation_value(m, e, up, gate));
  }
}

// One block per token: the GEMV route's finalize arithmetic (trtllm_finalize_rows), each pair's
// GEMM2 output read from its row perm[pair] of y (bf16) at the stored column.
__global__ void bf16_moe_grouped_finalize_kernel(TrtllmBf16MoeParams p, const int32_t* perm,
                                                 const __nv_bfloat16* y) {
  const CutlassMoeParams& m = p.base.moe;
  trtllm_finalize_rows(m, p.ws_ids, p.ws_w, false, [&](int64_t pair, int64_t j) {
    const int64_t c = moe_stored_row(p.w2_index, m.hidden, j);
    return __bfloat162float(y[perm[pair] * m.hidden + c]);
  });
}

// do_finalize=False, one block per local pair: its GEMM2 row (y row perm[pair], stored column
// order) into row expanded_to_permuted[pair] of permuted_out in plain order. The permute kernel
// wrote that index in the same order as perm (local experts ascending, pairs ascending within
// one) and zeroed the rows past the local pairs.
__global__ void bf16_moe_permuted_out_kernel(TrtllmBf16MoeParams p, const int32_t* perm,
                                             const __nv_bfloat16* y) {
  const CutlassMoeParams& m = p.base.moe;
  const int64_t pair = blockIdx.x;
  if (bf16_local_expert(p, pair) < 0) return;
  const int64_t H = m.hidden;
  const __nv_bfloat16* src = y + perm[pair] * H;
  __nv_bfloat16* dst =
      static_cast<__nv_bfloat16*>(m.permuted_out) + m.expanded_to_permuted[pair] * H;
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
    dst[j] = src[moe_stored_row(p.w2_index, H, j)];
  }
}

}  // namespace

void cutlass_moe(const CutlassMoeParams& p, void* stream, bool enable_pdl) {
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.dtype, "cutlass_fused_moe", "input", [&]<class T>() {
        dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
            p.out_dtype, "cutlass_fused_moe", "output_dtype",
            [&]<class O>() { launch_moe<T, O>(p, s, enable_pdl); });
      });
}

namespace {

// ---- cutlass_fused_moe's mixed-input paths: W4A16 MXFP4, Humming, W4A8 INT4, weight-only INT4 -

// Where a block's pairs come from: the per-pair route (tile_off null) takes pair blockIdx.x; the
// tiled route takes tile blockIdx.x of the pairs sorted by expert (moe_grouped_plan.h,
// moe_tile_expert), up to kMoeW4a16Tile of them, in row order. The prepass modes' GEMM1 input
// (Humming, W4A8, weight-only INT4): xq, the tokens' rows as mixed_prepass_kernel wrote them;
// Humming's dequantization scales: x_dq (GEMM1's 1 / quant per token), h_dq (GEMM2's 1 / quant
// times fc2's residual per pair, from GEMM1's kernel).
struct MixedRoute {
  const int32_t* indptr = nullptr;    // m_indptr [E + 1]
  const int32_t* row_pair = nullptr;  // row -> pair [pairs]
  const int32_t* tile_off = nullptr;  // [E + 1]; null: the per-pair route
  float* xq = nullptr;                // Humming: [tokens, hidden]
  float* x_dq = nullptr;              // Humming: [tokens]
  float* h_dq = nullptr;              // Humming: [pairs]
};

// The block's expert and its n pairs (pair ids in pairs[0, n)); false when it has none.
template <int P>
__device__ __forceinline__ bool mixed_block_pairs(const CutlassMoeParams& m, const MixedRoute& t,
                                                  int64_t& e, int64_t (&pairs)[P], int& n) {
  if (t.tile_off == nullptr) {
    pairs[0] = blockIdx.x;
    e = local_expert(m, pairs[0]);
    n = 1;
    return e >= 0;
  }
  const int64_t E = m.num_local_experts, b = blockIdx.x;
  if (b >= t.tile_off[E]) return false;
  e = moe::moe_tile_expert(t.tile_off, E, b);
  const int64_t r0 = t.indptr[e] + (b - t.tile_off[e]) * P, left = t.indptr[e + 1] - r0;
  n = static_cast<int>(left < P ? left : P);
#pragma unroll
  for (int i = 0; i < P; ++i) pairs[i] = i < n ? t.row_pair[r0 + i] : pairs[0];
  return n > 0;
}

// One GEMM of the block's n pairs over expert weights `w` ([rows, k] in K's SM90 layout, folded
// scale bytes `sf`): a warp per 16-row block, each lane's share from sm90_mixed_lane_rows (the
// words loaded and decoded once for the n input rows x(p, i)), the four lanes of a row added;
// store(p, row, sum) on the lanes with (L & 17) == 0 (L = 2 row_lo).
template <Sm90Mixed K, int P, class XAt, class Store>
__device__ __forceinline__ void mixed_block_gemm(const uint8_t* w, const uint8_t* sf, int64_t rows,
                                                 int64_t k, int n, const XAt& x, const Store& store,
                                                 bool half_scales) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int64_t blk = warp; blk < rows / 16; blk += kWarps) {
    float lo[P], hi[P];
    sm90_mixed_lane_rows<K, P>(w, sf, k, blk, lane, n, x, lo, hi, half_scales);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      lo[p] += __shfl_xor_sync(0xffffffffu, lo[p], 1);
      hi[p] += __shfl_xor_sync(0xffffffffu, hi[p], 1);
      lo[p] += __shfl_xor_sync(0xffffffffu, lo[p], 16);
      hi[p] += __shfl_xor_sync(0xffffffffu, hi[p], 16);
    }
    if ((lane & 17) == 0) {
      const int64_t r = blk * 16 + lane / 2;
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (p < n) {
          store(p, r, lo[p]);
          store(p, r + 8, hi[p]);
        }
      }
    }
  }
}

// Weight-only INT4's GEMM of the block's n pairs over expert weights `w` ([rows, k] in the SM80
// fpA_intB layout, scales s and zero points z (or null) [k / 128, rows] of the 16-bit type): a
// warp per 4 output rows, each lane's share from woq_lane_rows, the 8 lanes of a row added;
// store(p, row, sum) on lanes 0, 2, 4, 6.
template <int P, class XAt, class Store>
__device__ __forceinline__ void woq_block_gemm(const uint8_t* w, const uint16_t* s,
                                               const uint16_t* z, bool half, int64_t rows,
                                               int64_t k, int n, const XAt& x, const Store& store) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int64_t g = warp; g < rows / 4; g += kWarps) {
    float acc[P];
    woq_lane_rows<P>(w, s, z, half, rows, k, g, lane, n, x, acc);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      acc[p] += __shfl_xor_sync(0xffffffffu, acc[p], 1);
      acc[p] += __shfl_xor_sync(0xffffffffu, acc[p], 8);
      acc[p] += __shfl_xor_sync(0xffffffffu, acc[p], 16);
    }
    if ((lane & ~6) == 0) {
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (p < n) store(p, 4 * g + lane / 2, acc[p]);
      }
    }
  }
}

// Columns c .. c + 15 of a row as floats: 16-byte loads where the address allows (fp32 scratch
// rows always; 16-bit input rows when the row and its stride are 16-byte aligned), else one
// element at a time.
__device__ __forceinline__ void load_cols16(const float* row, int64_t c, float (&xs)[16]) {
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    const float4 f = *reinterpret_cast<const float4*>(row + c + 4 * v);
    xs[4 * v] = f.x;
    xs[4 * v + 1] = f.y;
    xs[4 * v + 2] = f.z;
    xs[4 * v + 3] = f.w;
  }
}
template <class T>
__device__ __forceinline__ void load_cols16(const T* row, int64_t c, bool vec, float (&xs)[16]) {
  static_assert(sizeof(T) == 2);
  if (vec) {
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const uint4 u = *reinterpret_cast<const uint4*>(row + c + 8 * v);
      const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int i = 0; i < 8; ++i) xs[8 * v + i] = to_f32(h[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) xs[i] = to_f32(row[c + i]);
  }
}

// Columns c .. c + 31 of an fp32 scratch row (weight-only INT4's 32-column groups).
__device__ __forceinline__ void load_cols32(const float* row, int64_t c, float (&xs)[32]) {
  load_cols16(row, c, *reinterpret_cast<float(*)[16]>(xs));
  load_cols16(row, c + 16, *reinterpret_cast<float(*)[16]>(xs + 16));
}

// The largest of every thread's v (NaN ignored, fmax's rule), on every thread of the block.
__device__ float block_amax(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v = fp32_abs_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // red is free (an earlier call's readers are done)
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float m = 0.0f;
  for (int i = 0; i < kWarps; ++i) m = fp32_abs_max(m, red[i]);
  return m;
}

// A GEMM input value times its column's pre-quant scale rounded to T (applyPrequantScale: one
// rounding of the exact product), or v itself without scales (weight-only INT4 without AWQ): the
// CPU reference's prequant_scaled. W4A8 then casts it to e4m3 (e4m3_satfinite_value).
template <class T>
__device__ __forceinline__ float prequant_scaled(float v, const uint16_t* prequant, int64_t col) {
  if (prequant == nullptr) return v;
  return round_as<T>(fp32_mul(v, to_f32(reinterpret_cast<const T*>(prequant)[col])));
}

// The GEMM1 input of Humming, W4A8 and weight-only INT4, a block per token (the routed rows of one
// token are the same row; expandInputRowsKernel quantizes each): Humming quantizes the row by its
// amax (humming_quant; the values read back as fp32 into xq, 1 / quant into x_dq); W4A8 scales each
// value by fc1's pre-quant scale, then casts it to e4m3; weight-only INT4 applies the AWQ scale
// if any (prequant_scaled).
template <class T, Sm90Mixed K>
__global__ void mixed_prepass_kernel(CutlassMoeFp4Params p, float* xq, float* x_dq) {
  pdl_wait();
  __shared__ float red[kWarps];
  const CutlassMoeParams& m = p.moe;
  const int64_t t = blockIdx.x, H = m.hidden;
  const T* x = static_cast<const T*>(m.input) + t * m.in_stride;
  if constexpr (K == Sm90Mixed::kW4A8) {
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
      xq[t * H + j] = e4m3_satfinite_value(prequant_scaled<T>(to_f32(x[j]), p.fc1_prequant, j));
    }
  } else if constexpr (K == Sm90Mixed::kWoqInt4) {
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
      xq[t * H + j] = prequant_scaled<T>(to_f32(x[j]), p.fc1_prequant, j);
    }
  } else {
    float amax = 0.0f;
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) amax = fp32_abs_max(amax, to_f32(x[j]));
    const float quant = humming_quant(block_amax(amax, red));
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
      xq[t * H + j] = humming_fp8(to_f32(x[j]), quant);
    }
    if (threadIdx.x == 0) x_dq[t] = fp32_div(1.0f, quant);
  }
}

// GEMM1 of the block's pairs, rounded to T after its alpha (W4A16: none; Humming: the row's
// 1 / quant times fc1's residual; W4A8: fc1's alpha), the fc1 bias added in fp32; then their
// activations: W4A16 rounded to T; Humming quantized per pair to fp8 from fp32
// (doActivationKernel), with 1 / quant times fc2's residual into h_dq; W4A8 rounded to T, then
// fc2's fp8 input (prequant_scaled, then e4m3). Rows of g1 / h by pair.
template <class T, Sm90Mixed K, int P>
__global__ void mixed_gemm1_kernel(CutlassMoeFp4Params p, MixedRoute t) {
  constexpr bool kHum = K == Sm90Mixed::kHumming, kW4A8 = K == Sm90Mixed::kW4A8;
  constexpr bool kWoq = K == Sm90Mixed::kWoqInt4;
  constexpr bool kPrepass = kHum || kW4A8 || kWoq;  // GEMM1 reads the prepass's rows (xq)
  if constexpr (!kPrepass) pdl_wait();              // the prepass waited
  __shared__ float red[kWarps];
  const CutlassMoeParams& m = p.moe;
  int64_t e = 0, pairs[P];
  int n = 0;
  if (!mixed_block_pairs<P>(m, t, e, pairs, n)) return;
  const int64_t H = m.hidden, N1 = moe_act_is_gated(m.act) ? 2 * m.inter : m.inter;
  const T* x[P];
  float alpha[P];
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int64_t tok = pairs[i] / m.top_k;
    x[i] = static_cast<const T*>(m.input) + tok * m.in_stride;
    alpha[i] = kHum ? fp32_mul(t.x_dq[tok], p.fc1_global[e]) : kW4A8 ? p.fc1_global[e] : 1.0f;
  }
  const T* b1 = m.b1 ? static_cast<const T*>(m.b1) + e * N1 : nullptr;
  // 16-byte loads of the input rows when every row starts 16-byte aligned.
  const bool vec = reinterpret_cast<uintptr_t>(m.input) % 16 == 0 && m.in_stride % 8 == 0;
  if constexpr (kWoq) {
    // Weight-only INT4: the fp32 sum plus the bias, rounded to T for a gated activation only
    // (the SM80 GEMM's epilogue; a plain one acts on the fp32 sum).
    const auto* s1 = reinterpret_cast<const uint16_t*>(p.w1_sf + e * p.w1_sf_stride);
    const uint16_t* z1 = p.w1_zeros ? p.w1_zeros + e * (p.w1_sf_stride / 2) : nullptr;
    woq_block_gemm<P>(
        static_cast<const uint8_t*>(m.w1) + e * N1 * (H / 2), s1, z1, std::is_same_v<T, __half>, N1,
        H, n,
        [&](int i, int64_t c, float(&xs)[32]) {
          load_cols32(t.xq + pairs[i] / m.top_k * H, c, xs);
        },
        [&](int i, int64_t r, float v) {
          const float b = fp32_add(v, b1 ? to_f32(b1[r]) : 0.0f);
          m.ws_g1[pairs[i] * N1 + r] = N1 == 2 * m.inter ? round_as<T>(b) : b;
        });
  } else {
    mixed_block_gemm<K, P>(
        static_cast<const uint8_t*>(m.w1) + e * N1 * (H / 2), p.w1_sf + e * p.w1_sf_stride, N1, H,
        n,
        [&](int i, int64_t c, float(&xs)[16]) {
          if constexpr (kPrepass) {
            load_cols16(t.xq + pairs[i] / m.top_k * H, c, xs);
          } else {
            load_cols16(x[i], c, vec, xs);
          }
        },
        [&](int i, int64_t r, float v) {
          m.ws_g1[pairs[i] * N1 + r] = gemm1_biased(round_as<T>(fp32_mul(alpha[i], v)), b1, r);
        },
        std::is_same_v<T, __half>);
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < P; ++i) {  // unrolled: pairs[] stays in registers
    if (i >= n) break;
    const float* g = m.ws_g1 + pairs[i] * N1;
    float* h = m.ws_h + pairs[i] * m.inter;
    float amax = 0.0f;
    for (int64_t j = threadIdx.x; j < m.inter; j += blockDim.x) {
      const float a = activation(m, e, g, j);
      if constexpr (kHum) {
        h[j] = a;  // quantized below, by this thread, once the row's amax is known
        amax = fp32_abs_max(amax, a);
      } else if constexpr (kW4A8) {
        h[j] = e4m3_satfinite_value(prequant_scaled<T>(round_as<T>(a), p.fc2_prequant, j));
      } else if constexpr (kWoq) {
        h[j] = prequant_scaled<T>(round_as<T>(a), p.fc2_prequant, j);
      } else {
        h[j] = round_as<T>(a);
      }
    }
    if constexpr (kHum) {
      const float quant = humming_quant(block_amax(amax, red));
      for (int64_t j = threadIdx.x; j < m.inter; j += blockDim.x) h[j] = humming_fp8(h[j], quant);
      if (threadIdx.x == 0) t.h_dq[pairs[i]] = fp32_mul(fp32_div(1.0f, quant), p.fc2_global[e]);
    }
  }
}

// GEMM2 of the block's pairs over their activation rows (fp32: W4A16's rounded to T, Humming's and
// W4A8's fp8 values), times the alpha (Humming: h_dq; W4A8: fc2's) and rounded to T (no bias: the
// finalize adds it).
template <class T, Sm90Mixed K, int P>
__global__ void mixed_gemm2_kernel(CutlassMoeFp4Params p, MixedRoute t) {
  const CutlassMoeParams& m = p.moe;
  int64_t e = 0, pairs[P];
  int n = 0;
  if (!mixed_block_pairs<P>(m, t, e, pairs, n)) return;
  const int64_t H = m.hidden, I = m.inter;
  if constexpr (K == Sm90Mixed::kWoqInt4) {
    const auto* s2 = reinterpret_cast<const uint16_t*>(p.w2_sf + e * p.w2_sf_stride);
    const uint16_t* z2 = p.w2_zeros ? p.w2_zeros + e * (p.w2_sf_stride / 2) : nullptr;
    woq_block_gemm<P>(
        static_cast<const uint8_t*>(m.w2) + e * H * (I / 2), s2, z2, std::is_same_v<T, __half>, H,
        I, n, [&](int i, int64_t c, float(&xs)[32]) { load_cols32(m.ws_h + pairs[i] * I, c, xs); },
        [&](int i, int64_t r, float v) { m.ws_y[pairs[i] * H + r] = round_as<T>(v); });
  } else {
    mixed_block_gemm<K, P>(
        static_cast<const uint8_t*>(m.w2) + e * H * (I / 2), p.w2_sf + e * p.w2_sf_stride, H, I, n,
        [&](int i, int64_t c, float(&xs)[16]) { load_cols16(m.ws_h + pairs[i] * I, c, xs); },
        [&](int i, int64_t r, float v) {
          if constexpr (K == Sm90Mixed::kHumming) v = fp32_mul(t.h_dq[pairs[i]], v);
          if constexpr (K == Sm90Mixed::kW4A8) v = fp32_mul(p.fc2_global[e], v);
          m.ws_y[pairs[i] * H + r] = round_as<T>(v);
        },
        std::is_same_v<T, __half>);
  }
}

// The tiled route's index arrays from perm (pair -> row, -1: no local expert): row_pair, the
// inverse, a thread a pair.
__global__ void moe_invert_perm_kernel(int64_t pairs, const int32_t* perm, int32_t* row_pair) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < pairs && perm[i] >= 0) row_pair[perm[i]] = static_cast<int32_t>(i);
}
__global__ void moe_tile_offsets_kernel(int64_t E, const int32_t* indptr, int32_t* tile_off) {
  if (threadIdx.x == 0) moe::moe_tile_offsets(indptr, E, moe::kMoeW4a16Tile, tile_off);
}

// Per-pair route (decode: about a pair per active expert): a block per pair, no sort. Tiled route
// (moe::moe_grouped_worthwhile, or forced): the pairs sorted by expert on the device (the grouped
// route's passes), then a block per tile of up to kMoeW4a16Tile pairs of one expert. Humming,
// W4A8 and weight-only INT4 first prepare the tokens' rows (mixed_prepass_kernel).
template <class T, Sm90Mixed K>
void launch_moe_mixed(const CutlassMoeFp4Params& p, bool tiled, cudaStream_t stream,
                      bool enable_pdl) {
  const char* op = "cutlass_fused_moe";
  constexpr bool kPrepass =
      K == Sm90Mixed::kHumming || K == Sm90Mixed::kW4A8 || K == Sm90Mixed::kWoqInt4;
  const CutlassMoeParams& m = p.moe;
  const int64_t pairs = m.num_tokens * m.top_k, E = m.num_local_experts;
  const int64_t N1 = moe_act_is_gated(m.act) ? 2 * m.inter : m.inter;
  const moe::MoeW4a16Scratch l =
      moe::moe_w4a16_scratch(m.num_tokens, pairs, E, m.hidden, m.inter, N1, tiled, kPrepass);
  const StreamScratch scratch = moe_scratch().acquire(op, stream, l.bytes);  // to the last launch
  CutlassMoeFp4Params q = p;
  auto* base = static_cast<char*>(scratch.data());
  q.moe.ws_g1 = reinterpret_cast<float*>(base + l.gemv.g1);
  q.moe.ws_h = reinterpret_cast<float*>(base + l.gemv.h);
  q.moe.ws_y = reinterpret_cast<float*>(base + l.gemv.y);
  MixedRoute t;
  if (kPrepass) {
    t.xq = reinterpret_cast<float*>(base + l.xq);
    t.x_dq = reinterpret_cast<float*>(base + l.x_dq);
    t.h_dq = reinterpret_cast<float*>(base + l.h_dq);
    launch_kernel(op, mixed_prepass_kernel<T, K>, dim3(static_cast<unsigned>(m.num_tokens)),
                  dim3(kThreads), 0, stream, enable_pdl, q, t.xq, t.x_dq);
  }
  const bool pdl1 = enable_pdl && !kPrepass;  // the first launch waits on the previous kernel
  if (!tiled) {
    const dim3 grid(static_cast<unsigned>(pairs));
    launch_kernel(op, mixed_gemm1_kernel<T, K, 1>, grid, dim3(kThreads), 0, stream, pdl1, q, t);
    launch_kernel(op, mixed_gemm2_kernel<T, K, 1>, grid, dim3(kThreads), 0, stream, false, q, t);
  } else {
    auto* counts = reinterpret_cast<int32_t*>(base + l.counts);
    auto* indptr = reinterpret_cast<int32_t*>(base + l.indptr);
    auto* perm = reinterpret_cast<int32_t*>(base + l.perm);
    auto* row_pair = reinterpret_cast<int32_t*>(base + l.row_pair);
    auto* tile_off = reinterpret_cast<int32_t*>(base + l.tile_off);
    launch_moe_sort(op, m, moe::moe_perm_chunks(pairs), counts, indptr, perm, stream, pdl1);
    launch_kernel(op, moe_invert_perm_kernel, dim3(static_cast<unsigned>((pairs + 255) / 256)),
                  dim3(256), 0, stream, false, pairs, static_cast<const int32_t*>(perm), row_pair);
    launch_kernel(op, moe_tile_offsets_kernel, dim3(1), dim3(32), 0, stream, false, E,
                  static_cast<const int32_t*>(indptr), tile_off);
    t.indptr = indptr;
    t.row_pair = row_pair;
    t.tile_off = tile_off;
    const dim3 grid(static_cast<unsigned>(moe::moe_tile_grid(pairs, E, moe::kMoeW4a16Tile)));
    constexpr int kP = moe::kMoeW4a16Tile;
    launch_kernel(op, mixed_gemm1_kernel<T, K, kP>, grid, dim3(kThreads), 0, stream, false, q, t);
    launch_kernel(op, mixed_gemm2_kernel<T, K, kP>, grid, dim3(kThreads), 0, stream, false, q, t);
  }
  launch_kernel(op, moe_finalize_kernel<T, T, float>, dim3(static_cast<unsigned>(m.num_tokens)),
                dim3(kThreads), 0, stream, false, q.moe, static_cast<const float*>(q.moe.ws_y),
                static_cast<const int32_t*>(nullptr));
}

}  // namespace

void cutlass_moe_sm90_mixed(const CutlassMoeFp4Params& p, void* stream, bool enable_pdl) {
  const char* op = "cutlass_fused_moe";
  const CutlassMoeParams& m = p.moe;
  const bool hum = p.mode == CutlassFp4Mode::kHummingFp8Mxfp4;
  const bool w4a8 = p.mode == CutlassFp4Mode::kW4A8Int4;
  const bool woq = p.mode == CutlassFp4Mode::kWoqInt4;
  FLASHINFER_CHECK_CODE(
      p.mode == CutlassFp4Mode::kW4A16Mxfp4 || hum || w4a8 || woq, ErrorCode::kUnsupported, op,
      "input",
      "only the W4A16 MXFP4, Humming, W4A8 INT4 and weight-only INT4 paths have a "
      "CUDA kernel");
  int device = 0;
  FLASHINFER_CUDA_CALL(op, cudaGetDevice(&device));
  const int cc = detail::cuda_compute_capability(device);
  // Upstream's MoE runner: "FP4 data type is not supported on SM < 90"; its W4A8 mainloop is
  // Hopper's; weight-only INT4 is the SM80 fpA_intB GEMM.
  const int min_cc = woq ? 80 : 90;
  FLASHINFER_CHECK_CODE(cc >= min_cc, ErrorCode::kUnsupported, op, "input", "the ",
                        hum    ? "Humming MXFP4 x FP8"
                        : w4a8 ? "W4A8 INT4"
                        : woq  ? "weight-only INT4"
                               : "W4A16 MXFP4",
                        " path runs on sm", min_cc, "+ (as upstream), got sm", cc);
  const int64_t N1 = moe_act_is_gated(m.act) ? 2 * m.inter : m.inter;
  FLASHINFER_CHECK(m.hidden % 128 == 0 && m.inter % 128 == 0 && N1 % 64 == 0, op,
                   "fc2_expert_weights", "the SM90 layouts need hidden and inter sizes in 128s");
  for (const auto& [ptr, arg] :
       {std::pair{m.w1, "fc1_expert_weights"}, std::pair{m.w2, "fc2_expert_weights"}}) {
    FLASHINFER_CHECK(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, op, arg,
                     "must be 16-byte aligned (the kernel reads 16-byte words)");
  }
  FLASHINFER_CHECK_CODE(m.num_tokens * m.top_k <= 0x7FFFFFFF, ErrorCode::kUnsupported, op, "input",
                        "more than 2^31 - 1 (token, expert) pairs");
  if (m.num_tokens == 0) return;
  const int64_t pairs = m.num_tokens * m.top_k;
  const int force = route_force();
  const bool tiled = force == 2 || (force != 1 && moe::moe_grouped_worthwhile(
                                                      pairs, m.num_local_experts, m.ep_size));
  (tiled ? g_grouped_runs : g_gemv_runs).fetch_add(1, std::memory_order_relaxed);
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kFloat16, kBFloat16>(m.dtype, op, "input", [&]<class T>() {
    if (hum) {
      launch_moe_mixed<T, Sm90Mixed::kHumming>(p, tiled, s, enable_pdl);
    } else if (w4a8) {
      launch_moe_mixed<T, Sm90Mixed::kW4A8>(p, tiled, s, enable_pdl);
    } else if (woq) {
      launch_moe_mixed<T, Sm90Mixed::kWoqInt4>(p, tiled, s, enable_pdl);
    } else {
      launch_moe_mixed<T, Sm90Mixed::kW4A16>(p, tiled, s, enable_pdl);
    }
  });
}

namespace {

// A block per token: its ids decide, then its threads copy the row, in 16-byte words where both
// rows and their strides are 16-byte aligned (every bf16 / fp16 hidden size a model has).
__global__ void moe_keep_rows_kernel(MoeKeepRowsParams p, bool words) {
  const int64_t t = blockIdx.x;
  if (moe_token_has_local_expert(p, t)) return;
  char* dst = static_cast<char*>(p.out) + t * p.out_stride;
  const char* src = static_cast<const char*>(p.before) + t * p.before_stride;
  if (words) {
    for (int64_t i = threadIdx.x; i < p.row_bytes / 16; i += blockDim.x) {
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    }
  } else {
    for (int64_t i = threadIdx.x; i < p.row_bytes; i += blockDim.x) dst[i] = src[i];
  }
}

}  // namespace

void moe_keep_rows(const MoeKeepRowsParams& p, void* stream) {
  if (p.num_tokens == 0 || p.row_bytes == 0) return;
  const auto aligned = [](const void* a, int64_t stride) {
    return reinterpret_cast<uintptr_t>(a) % 16 == 0 && stride % 16 == 0;
  };
  const bool words =
      p.row_bytes % 16 == 0 && aligned(p.out, p.out_stride) && aligned(p.before, p.before_stride);
  FLASHINFER_CHECK(p.num_tokens <= 2147483647, "cutlass_fused_moe", "output",
                   "more than 2^31 - 1 rows");
  launch_kernel("cutlass_fused_moe", moe_keep_rows_kernel,
                dim3(static_cast<unsigned>(p.num_tokens)), dim3(128), 0,
                static_cast<cudaStream_t>(stream), false, p, words);
}

void set_cutlass_moe_route(int force) { g_force_route.store(force); }

CutlassMoeCudaStats cutlass_moe_cuda_stats() {
  CutlassMoeCudaStats s;
  s.grouped_runs = g_grouped_runs.load();
  s.gemv_runs = g_gemv_runs.load();
  s.scratch_allocs = moe_scratch().allocations();
  return s;
}

void deepseek_routing(const DeepSeekRoutingParams& p, void* stream, bool enable_pdl) {
  if (p.num_tokens == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  FLASHINFER_CHECK_CODE(p.num_experts <= 32 * kDsrPerLane && p.n_group <= 32 && p.topk <= 32,
                        ErrorCode::kUnsupported, "fused_topk_deepseek", "scores",
                        "the CUDA kernel takes at most ", 32 * kDsrPerLane,
                        " experts and 32 groups");
  const unsigned blocks = static_cast<unsigned>((p.num_tokens + kDsrWarps - 1) / kDsrWarps);
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.scores_dtype, "fused_topk_deepseek", "scores", [&]<class S>() {
        dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
            p.bias_dtype, "fused_topk_deepseek", "bias", [&]<class B>() {
              dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
                  p.values_dtype, "fused_topk_deepseek", "topk_values", [&]<class V>() {
                    launch_kernel("fused_topk_deepseek", deepseek_routing_kernel<S, B, V>,
                                  dim3(blocks), dim3(kDsrWarps * 32), 0, s, enable_pdl, p);
                  });
            });
      });
}

namespace {
// The limits of trtllm_route_kernel for routing from logits, as kUnsupported naming the argument.
void check_trtllm_cuda_routing(const TrtllmMoeParams& b, const char* op) {
  const MoeRoutingParams& r = b.routing;
  FLASHINFER_CHECK_CODE(r.num_experts <= kFp8MoeCudaMaxExperts, ErrorCode::kUnsupported, op,
                        "num_experts", "the CUDA routing handles at most ", kFp8MoeCudaMaxExperts,
                        " experts");
  const bool grouped =
      r.method == MoeRouting::kDeepSeekV3 && r.n_group > 1 && r.topk_group < r.n_group;
  FLASHINFER_CHECK_CODE(!grouped || r.n_group <= 32, ErrorCode::kUnsupported, op, "n_group",
                        "the CUDA routing's grouped selection handles at most 32 groups, got ",
                        r.n_group);
}
}  // namespace

void trtllm_fp8_moe(const TrtllmFp8MoeParams& p, void* stream, bool enable_pdl) {
  const TrtllmMoeParams& b = p.base;
  const CutlassMoeParams& m = b.moe;
  const char* op = p.block_scale ? (b.precomputed ? "trtllm_fp8_block_scale_routed_moe"
                                                  : "trtllm_fp8_block_scale_moe")
                                 : (b.precomputed ? "trtllm_fp8_per_tensor_scale_routed_moe"
                                                  : "trtllm_fp8_per_tensor_scale_moe");
  if (m.num_tokens == 0) return;
  check_trtllm_cuda_routing(b, op);
  const int64_t pairs = m.num_tokens * m.top_k;
  FLASHINFER_CHECK_CODE(pairs <= 0x7FFFFFFF, ErrorCode::kUnsupported, op, "hidden_states",
                        "more than 2^31 - 1 (token, expert) pairs");
  auto s = static_cast<cudaStream_t>(stream);
  // The intermediates in the stream's scratch (nothing allocated once it is large enough),
  // each part 256-byte aligned; the lease is held to the last launch.
  const int64_t N1 = moe_act_is_gated(m.act) ? 2 * m.inter : m.inter;
  const auto part = [](int64_t elems) { return (elems * 4 + 255) / 256 * 256; };
  const int64_t o_w = part(pairs), o_g1 = o_w + part(pairs), o_h = o_g1 + part(pairs * N1);
  const int64_t o_y = o_h + part(pairs * m.inter), bytes = o_y + part(pairs * m.hidden);
  const StreamScratch scratch = moe_scratch().acquire(op, stream, static_cast<std::size_t>(bytes));
  auto* base = static_cast<char*>(scratch.data());
  TrtllmFp8MoeParams q = p;
  q.ws_ids = reinterpret_cast<int32_t*>(base);
  q.ws_w = reinterpret_cast<float*>(base + o_w);
  q.ws_g1 = reinterpret_cast<float*>(base + o_g1);
  q.ws_h = reinterpret_cast<float*>(base + o_h);
  q.ws_y = reinterpret_cast<float*>(base + o_y);
  trtllm_route(q.base, q.ws_ids, q.ws_w, s, enable_pdl);
  launch_kernel(op, fp8_moe_gemm1_kernel, dim3(static_cast<unsigned>(pairs)), dim3(kThreads), 0, s,
                false, q);
  launch_kernel(op, fp8_moe_gemm2_kernel, dim3(static_cast<unsigned>(pairs)), dim3(kThreads), 0, s,
                false, q);
  launch_kernel(op, fp8_moe_finalize_kernel, dim3(static_cast<unsigned>(m.num_tokens)),
                dim3(kThreads), 0, s, false, q);
}

namespace {
template <class O>
void launch_moe_fp8(const CutlassMoeFp8Params& p, cudaStream_t s, bool enable_pdl) {
  const char* op = "cutlass_fused_moe";
  const CutlassMoeParams& m = p.base;
  const int64_t pairs = m.num_tokens * m.top_k;
  const int64_t N1 = moe_act_is_gated(m.act) ? 2 * m.inter : m.inter;
  const moe::MoeFp8GemvScratch l =
      moe::moe_fp8_gemv_scratch(m.num_tokens, pairs, m.hidden, m.inter, N1, p.block_scale);
  const StreamScratch scratch = moe_scratch().acquire(op, s, l.bytes);  // to the last launch
  auto* base = static_cast<char*>(scratch.data());
  CutlassMoeFp8Params q = p;
  q.base.ws_g1 = reinterpret_cast<float*>(base + l.gemv.g1);
  q.base.ws_h = reinterpret_cast<float*>(base + l.gemv.h);
  q.base.ws_y = reinterpret_cast<float*>(base + l.gemv.y);
  // Null for the per-tensor path (nothing there: its kernels never read them).
  float* xq = p.block_scale ? reinterpret_cast<float*>(base + l.xq) : nullptr;
  float* xs = p.block_scale ? reinterpret_cast<float*>(base + l.xs) : nullptr;
  float* hs = p.block_scale ? reinterpret_cast<float*>(base + l.hs) : nullptr;
  const dim3 pair_grid(static_cast<unsigned>(pairs)),
      token_grid(static_cast<unsigned>(m.num_tokens));
  bool pdl = enable_pdl;  // the first launch waits on the previous kernel
  if (p.block_scale) {
    launch_kernel(op, cutlass_fp8_quantize_kernel, token_grid, dim3(kThreads), 0, s, pdl, q, xq,
                  xs);
    pdl = false;
  }
  launch_kernel(op, cutlass_fp8_gemm1_kernel<O>, pair_grid, dim3(kThreads), 0, s, pdl, q,
                static_cast<const float*>(xq), static_cast<const float*>(xs), hs);
  launch_kernel(op, cutlass_fp8_gemm2_kernel<O>, pair_grid, dim3(kThreads), 0, s, false, q,
                static_cast<const float*>(hs));
  launch_kernel(op, cutlass_fp8_finalize_kernel<O, float>, token_grid, dim3(kThreads), 0, s, false,
                q, static_cast<const float*>(q.base.ws_y), static_cast<const int32_t*>(nullptr));
}

// FP8 per tensor on the grouped route (moe::moe_use_grouped with one-byte operands): the
// unquantized route's permutation passes and gather (e4m3 rows), GEMM1 on the tensor-core grouped
// GEMM (e4m3 widened exactly to fp16, fp32 accumulation, alpha fc1_dequant[e] on the fp32 sum,
// one rounding to O: the CPU's round_O(acc * alpha)), the bias + activation + e4m3 cast, GEMM2
// likewise with fc2_dequant[e], the finalize through the permutation. Each GEMM's sum differs from
// the GEMV route's in order, and on CUTLASS's FP8 wgmma also in its narrower accumulation inside a
// 128-deep k tile (docs/MOE.md): below a bf16 ulp.
template <class O>
void launch_moe_fp8_grouped(const CutlassMoeFp8Params& p, cudaStream_t s, bool enable_pdl) {
  const char* op = "cutlass_fused_moe";
  const CutlassMoeParams& m = p.base;
  const int64_t pairs = m.num_tokens * m.top_k, E = m.num_local_experts;
  const int64_t H = m.hidden, I = m.inter, N1 = moe_act_is_gated(m.act) ? 2 * I : I;
  const int64_t chunks = moe::moe_perm_chunks(pairs);
  const moe::MoeGroupedScratch l =
      moe::moe_grouped_scratch(pairs, E, H, I, N1, 1, sizeof(O), sizeof(O));
  const StreamScratch scratch = moe_scratch().acquire(op, s, l.bytes);  // to the last launch
  const auto [counts, indptr, perm, xs, g1, h, y] =
      moe_grouped_pieces<uint8_t, O, __nv_fp8_e4m3, O>(static_cast<char*>(scratch.data()), l);
  const DType od = m.out_dtype, f8 = DType::kFloat8E4M3FN;
  const dim3 pair_grid(static_cast<unsigned>(pairs));
  const auto* cperm = static_cast<const int32_t*>(perm);
  launch_moe_permutation(op, m, chunks, counts, indptr, perm, xs, s, enable_pdl);
  moe_grouped_gemm(f8, indptr, E, pairs, xs, m.w1, N1, H, g1, od, s, p.fc1_dequant);
  launch_kernel(op, cutlass_fp8_grouped_activation_kernel<O>, pair_grid, dim3(kThreads), 0, s,
                false, p, cperm, static_cast<const O*>(g1), h);
  moe_grouped_gemm(f8, indptr, E, pairs, h, m.w2, H, I, y, od, s, p.fc2_dequant);
  launch_kernel(op, cutlass_fp8_finalize_kernel<O, O>, dim3(static_cast<unsigned>(m.num_tokens)),
                dim3(kThreads), 0, s, false, p, static_cast<const O*>(y), cperm);
}

// One block-scaled GEMM of the DeepSeek grouped route: out bf16 [pairs, n] = a [pairs, k] (e4m3,
// 1x128 scales a_scales [pairs, ceil(k / 128)]) @ w[e]^T (e4m3 [E, n, k], 128 x 128 scales
// w_scales [E, ceil(n / 128), ceil(k / 128)]) for each local expert's rows
// (grouped_mm_fp8_block_scaled: moe_fp8_block_accumulate per k block, one bf16 rounding).
void moe_block_grouped_gemm(const int32_t* indptr, int64_t E, int64_t pairs, const void* a,
                            const float* a_scales, const void* w, const float* w_scales, int64_t n,
                            int64_t k, void* out, cudaStream_t stream) {
  GroupedMmCudaParams g =
      moe_grouped_params(DType::kFloat8E4M3FN, indptr, E, pairs, a, w, n, k, out, DType::kBFloat16);
  const int64_t kb = (k + kMoeFp8Block - 1) / kMoeFp8Block;
  g.a_block_scale = a_scales;
  g.a_block_scale_stride = kb;
  g.b_block_scale = w_scales;
  g.b_block_scale_stride_e = ((n + kMoeFp8Block - 1) / kMoeFp8Block) * kb;
  grouped_mm_fp8_block_scaled(g, stream);
}

// DeepSeek FP8 block scale on the grouped route (moe::moe_use_grouped: prefill-sized batches):
// the permutation (no gather), each token's input quantized 1x128 once into its pairs' rows of the
// expert-sorted e4m3 rows, GEMM1 on the block-scaled grouped GEMM (bf16 out), the bias +
// activation (bf16) quantized 1x128, GEMM2 likewise, the finalize through the permutation: the
// GEMV route's rounding points. Each k block's e4m3 x e4m3 products are exact in fp32, but
// mma.sync sums them in its own order and with its own internal rounding (not a chain of IEEE
// adds), so the route matches the GEMV route bit for bit only where those sums are exact (the
// tests' integer operands).
template <class O>
void launch_moe_fp8_block_grouped(const CutlassMoeFp8Params& p, cudaStream_t s, bool enable_pdl) {
  const char* op = "cutlass_fused_moe";
  const CutlassMoeParams& m = p.base;
  const int64_t pairs = m.num_tokens * m.top_k, E = m.num_local_experts;
  const int64_t H = m.hidden, I = m.inter, N1 = moe_act_is_gated(m.act) ? 2 * I : I;
  const int64_t chunks = moe::moe_perm_chunks(pairs);
  const moe::MoeBlockScaleScratch l = moe::moe_block_scale_scratch(pairs, E, H, I, N1);
  const StreamScratch scratch = moe_scratch().acquire(op, s, l.bytes);  // to the last launch
  char* base = static_cast<char*>(scratch.data());
  const auto [counts, indptr, perm, xs, g1, h, y] =
      moe_grouped_pieces<__nv_fp8_e4m3, __nv_bfloat16, __nv_fp8_e4m3, __nv_bfloat16>(base, l.base);
  auto* x_scales = reinterpret_cast<float*>(base + l.x_scales);
  auto* h_scales = reinterpret_cast<float*>(base + l.h_scales);
  const dim3 pair_grid(static_cast<unsigned>(pairs));
  const auto* cperm = static_cast<const int32_t*>(perm);
  launch_moe_sort(op, m, chunks, counts, indptr, perm, s, enable_pdl);
  launch_kernel(op, cutlass_fp8_block_gather_kernel, dim3(static_cast<unsigned>(m.num_tokens)),
                dim3(kThreads), static_cast<size_t>(m.top_k) * sizeof(int32_t), s, false, p, cperm,
                xs, x_scales);
  moe_block_grouped_gemm(indptr, E, pairs, xs, x_scales, m.w1, p.w1_block_scale, N1, H, g1, s);
  launch_kernel(op, cutlass_fp8_block_activation_kernel<O>, pair_grid, dim3(kThreads), 0, s, false,
                p, cperm, static_cast<const __nv_bfloat16*>(g1), h, h_scales);
  moe_block_grouped_gemm(indptr, E, pairs, h, h_scales, m.w2, p.w2_block_scale, H, I, y, s);
  launch_kernel(op, cutlass_fp8_finalize_kernel<O, __nv_bfloat16>,
                dim3(static_cast<unsigned>(m.num_tokens)), dim3(kThreads), 0, s, false, p,
                static_cast<const __nv_bfloat16*>(y), cperm);
}
}  // namespace

void cutlass_moe_fp8(const CutlassMoeFp8Params& p, void* stream, bool enable_pdl) {
  const char* op = "cutlass_fused_moe";
  const CutlassMoeParams& m = p.base;
  if (p.block_scale) {
    // Upstream's cutlass_fused_moe raises NotImplementedError for FP8 block scaling on any
    // device but sm90 (its DeepGEMM-based runner is Hopper's); the CPU reference has no limit.
    int device = 0;
    FLASHINFER_CUDA_CALL(op, cudaGetDevice(&device));
    const int cc = detail::cuda_compute_capability(device);
    FLASHINFER_CHECK_CODE(cc == 90, ErrorCode::kUnsupported, op, "use_deepseek_fp8_block_scale",
                          "FP8 block scaling runs on sm90 only (as upstream), got sm", cc);
  }
  FLASHINFER_CHECK_CODE(m.num_tokens * m.top_k <= 0x7FFFFFFF, ErrorCode::kUnsupported, op, "input",
                        "more than 2^31 - 1 (token, expert) pairs");
  if (m.num_tokens == 0) return;
  // Prefill-sized batches: the grouped route (block scale: its block-scaled GEMM, which promotes
  // each 128-wide K block's sum with the two scales as the GEMV route does).
  moe::MoeRouteQuery q = route_query(m, op);
  q.elem_bytes = 1;  // the GEMMs' operands are e4m3 (block scale: the bf16 input quantized first)
  const bool grouped = moe::moe_use_grouped(q, route_force());
  (grouped ? g_grouped_runs : g_gemv_runs).fetch_add(1, std::memory_order_relaxed);
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kFloat16, kBFloat16>(
      m.out_dtype, op, "output_dtype", [&]<class O>() {
        if (grouped && p.block_scale) {
          launch_moe_fp8_block_grouped<O>(p, s, enable_pdl);
        } else if (grouped) {
          launch_moe_fp8_grouped<O>(p, s, enable_pdl);
        } else {
          launch_moe_fp8<O>(p, s, enable_pdl);
        }
      });
}

}  // namespace flashinfer::kernels::cuda

namespace flashinfer::kernels::cuda {

namespace {
// trtllm_bf16_moe's grouped route after the routing (q.ws_ids / ws_w set), in the route's
// scratch at `base` (layout l).
void launch_bf16_moe_grouped(const TrtllmBf16MoeParams& q, char* base,
                             const moe::MoeGroupedScratch& l, cudaStream_t s, const char* op) {
  const CutlassMoeParams& m = q.base.moe;
  const int64_t pairs = m.num_tokens * m.top_k, E = m.num_local_experts;
  const int64_t H = m.hidden, I = m.inter, N1 = moe_act_is_gated(m.act) ? 2 * I : I;
  const int64_t chunks = moe::moe_perm_chunks(pairs);
  // The permutation passes and the gather read pair (t, k)'s expert from the routing's ids.
  CutlassMoeParams v = m;
  v.experts = q.ws_ids;
  v.experts_dtype = DType::kInt32;
  v.experts_stride = m.top_k;
  const auto [counts, indptr, perm, xs, g1, h, y] =
      moe_grouped_pieces<__nv_bfloat16, float, __nv_bfloat16, __nv_bfloat16>(base, l);
  const dim3 pair_grid(static_cast<unsigned>(pairs));
  const auto* cperm = static_cast<const int32_t*>(perm);
  launch_moe_permutation(op, v, chunks, counts, indptr, perm, xs, s, false);
  moe_grouped_gemm(DType::kBFloat16, indptr, E, pairs, xs, m.w1, N1, H, g1, DType::kFloat32, s);
  launch_kernel(op, bf16_moe_activation_kernel, pair_grid, dim3(kThreads), 0, s, false, q, cperm,
                static_cast<const float*>(g1), h);
  moe_grouped_gemm(DType::kBFloat16, indptr, E, pairs, h, m.w2, H, I, y, DType::kBFloat16, s);
  if (m.permuted_out) {
    launch_kernel(op, bf16_moe_permuted_out_kernel, pair_grid, dim3(kThreads), 0, s, false, q,
                  cperm, static_cast<const __nv_bfloat16*>(y));
  } else {
    launch_kernel(op, bf16_moe_grouped_finalize_kernel, dim3(static_cast<unsigned>(m.num_tokens)),
                  dim3(kThreads), 0, s, false, q, cperm, static_cast<const __nv_bfloat16*>(y));
  }
}
}  // namespace

void trtllm_bf16_moe(const TrtllmBf16MoeParams& p, void* stream, bool enable_pdl) {
  const TrtllmMoeParams& b = p.base;
  const CutlassMoeParams& m = b.moe;
  const char* op = b.precomputed ? "trtllm_bf16_routed_moe" : "trtllm_bf16_moe";
  // Every refusal before the first launch.
  if (!b.precomputed) {
    check_trtllm_cuda_routing(b, op);
  }
  const int64_t pairs = m.num_tokens * m.top_k;
  FLASHINFER_CHECK_CODE(pairs <= 0x7FFFFFFF, ErrorCode::kUnsupported, op, "hidden_states",
                        "more than 2^31 - 1 (token, expert) pairs");
  FLASHINFER_CHECK_CODE(m.num_local_experts < 0x7FFFFFFF, ErrorCode::kUnsupported, op,
                        "local_num_experts", "more than 2^31 - 2 local experts");
  if (m.num_tokens == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t E = m.num_local_experts, H = m.hidden, I = m.inter;
  const int64_t N1 = moe_act_is_gated(m.act) ? 2 * I : I;
  moe::MoeRouteQuery rq = route_query(m, op);
  rq.ep_size = moe::moe_trtllm_ep_size(b.routing.num_experts, E);
  const bool grouped = moe::moe_trtllm_use_grouped(rq, p.w1_index, p.w2_index, route_force());
  // The routing's ids and weights, then the route's intermediates, in the stream's scratch
  // (nothing allocated once it is large enough); the lease is held to the last launch.
  const moe::MoeTrtllmScratch t = moe::moe_trtllm_scratch(pairs);
  const moe::MoeGroupedScratch gl = moe::moe_grouped_scratch(pairs, E, H, I, N1, 2, 2, 4);
  const moe::MoeGemvScratch vl = moe::moe_gemv_scratch(pairs, H, I, N1);
  const StreamScratch scratch =
      moe_scratch().acquire(op, stream, t.rest + (grouped ? gl.bytes : vl.bytes));
  auto* base = static_cast<char*>(scratch.data());
  TrtllmBf16MoeParams q = p;
  q.ws_ids = reinterpret_cast<int32_t*>(base + t.ids);
  q.ws_w = reinterpret_cast<float*>(base + t.w);
  trtllm_route(q.base, q.ws_ids, q.ws_w, s, enable_pdl);
  if (m.permuted_out) {
    launch_kernel(op, bf16_moe_permute_kernel, dim3(static_cast<unsigned>(m.num_local_experts + 1)),
                  dim3(kThreads), 0, s, false, q);
  }
  if (grouped) {
    g_grouped_runs.fetch_add(1, std::memory_order_relaxed);
    launch_bf16_moe_grouped(q, base + t.rest, gl, s, op);
    return;
  }
  g_gemv_runs.fetch_add(1, std::memory_order_relaxed);
  q.ws_g1 = reinterpret_cast<float*>(base + t.rest + vl.g1);
  q.ws_h = reinterpret_cast<float*>(base + t.rest + vl.h);
  q.ws_y = m.permuted_out ? nullptr : reinterpret_cast<float*>(base + t.rest + vl.y);
  launch_kernel(op, bf16_moe_gemm1_kernel, dim3(static_cast<unsigned>(pairs)), dim3(kThreads), 0, s,
                false, q);
  launch_kernel(op, bf16_moe_gemm2_kernel, dim3(static_cast<unsigned>(pairs)), dim3(kThreads), 0, s,
                false, q);
  if (!m.permuted_out) {
    launch_kernel(op, bf16_moe_finalize_kernel, dim3(static_cast<unsigned>(m.num_tokens)),
                  dim3(kThreads), 0, s, false, q);
  }
}

}  // namespace flashinfer::kernels::cuda
