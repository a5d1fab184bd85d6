// CUDA kernels of trtllm_ragged_attention_deepseek (and the fmha_v2 names that share its
// parameters). Where the FA2 prefill kernel fits (16-bit q, K, V and output of one dtype, its
// built head dims, DeepSeek's 192/128 included, no softmax statistics), the call runs there as a
// ragged batch prefill, its keys split across blocks (partials merged after) when the work items
// would not fill the device (api::one_shot_plan). Otherwise: one warp per (query row, head), fp32
// online softmax over the row's visible keys, four keys per step (their dot products reduced
// together for instruction-level parallelism), the query and the output accumulator in registers
// (head_dim_qk, head_dim_vo <= 256: 8 per lane). Semantics are the CPU reference's
// (kernels/cpu/ragged_attention_cpu.cpp).
#include <algorithm>
#include <initializer_list>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/decode_cuda.h"
#include "kernels/cuda/prefill_cuda.h"
#include "kernels/cuda/prefill_shape.h"
#include "kernels/cuda/ragged_attention_cuda.h"
#include "kernels/cuda/stream_scratch.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRaggedWarpsPerBlock = 4;
constexpr int kPerLane = 8;  // head dims <= 256
constexpr int kKeys = 4;     // keys per step
constexpr float kLog2e = 1.4426950408889634f;

// Warp w of block x handles item x * kRaggedWarpsPerBlock + w = row * Hq + head. No block barrier:
// warps are independent, and a warp past the last item returns at once.
template <class KT, class VT>
__global__ void __launch_bounds__(kWarp* kRaggedWarpsPerBlock)
    ragged_attention_kernel(RaggedAttentionParams p) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kRaggedWarpsPerBlock +
                       static_cast<int64_t>(threadIdx.x) / kWarp;
  pdl_wait();
  if (item >= int64_t{p.rows} * p.num_qo_heads) return;
  const int64_t row = item / p.num_qo_heads;
  const int h = static_cast<int>(item % p.num_qo_heads);
  const int hk = h / (p.num_qo_heads / p.num_kv_heads);
  const int dqk = p.head_dim_qk, dvo = p.head_dim_vo;
  const int32_t b = p.row_req[row];
  if (b < 0) return;  // a device plan's refused request (NaN rows written) or a row of none
  const int64_t qo_len = p.cu_q[b + 1] - p.cu_q[b];
  const int64_t kv_len = p.kv_lens[b];
  const int64_t pos = kv_len - qo_len + (row - p.cu_q[b]);
  int64_t hi = kv_len, lo = 0;
  if (p.causal) hi = pos + 1 < 0 ? 0 : (pos + 1 > kv_len ? kv_len : pos + 1);
  if (p.window_left >= 0) {
    lo = pos - p.window_left;
    lo = lo < 0 ? 0 : (lo > kv_len ? kv_len : lo);
  }
  float q[kPerLane], acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + i * kWarp;
    q[i] = d < dqk ? load_any(p.q, row * p.q_stride_n + h * p.q_stride_h + d, p.q_dtype) : 0.0f;
    acc[i] = 0.0f;
  }
  const KT* kbase =
      static_cast<const KT*>(p.k) + int64_t{p.cu_kv[b]} * p.k_stride_n + int64_t{hk} * p.k_stride_h;
  const VT* vbase =
      static_cast<const VT*>(p.v) + int64_t{p.cu_kv[b]} * p.v_stride_n + int64_t{hk} * p.v_stride_h;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j0 = lo; j0 < hi; j0 += kKeys) {
    // Warp-uniform count: the shuffles below always see the full warp.
    const int n = static_cast<int>(hi - j0 < kKeys ? hi - j0 : int64_t{kKeys});
    float s[kKeys];
#pragma unroll
    for (int t = 0; t < kKeys; ++t) {
      float dot = 0.0f;
      if (t < n) {
        const KT* kr = kbase + (j0 + t) * p.k_stride_n;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
          const int d = lane + i * kWarp;
          if (d < dqk) dot += q[i] * to_f32(kr[d]);
        }
      }
      s[t] = dot;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
      for (int t = 0; t < kKeys; ++t) s[t] += __shfl_xor_sync(0xffffffffu, s[t], o);
    }
    float m_new = m;
#pragma unroll
    for (int t = 0; t < kKeys; ++t) {
      s[t] = t < n ? p.bmm1_scale * s[t] : -INFINITY;
      m_new = fmaxf(m_new, s[t]);
    }
    if (m_new == -INFINITY) continue;     // all scores -inf so far: weights stay 0 (CPU rule)
    const float alpha = expf(m - m_new);  // 0 while m is -inf
    l *= alpha;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc[i] *= alpha;
#pragma unroll
    for (int t = 0; t < kKeys; ++t) {
      if (t < n) {
        const float w = expf(s[t] - m_new);
        l += w;
        const VT* vr = vbase + (j0 + t) * p.v_stride_n;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
          const int d = lane + i * kWarp;
          if (d < dvo) acc[i] += w * to_f32(vr[d]);
        }
      }
    }
    m = m_new;
  }
  const bool empty = l == 0.0f;
  const float f = empty ? 0.0f : p.bmm2_scale / l;
  const int64_t off = row * p.o_stride_n + h * p.o_stride_h;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + i * kWarp;
    if (d < dvo) store_any(p.o, off + d, p.o_dtype, empty ? 0.0f : acc[i] * f);
  }
  if (p.lse != nullptr && lane == 0) {
    p.lse[row * p.lse_stride_n + h * p.lse_stride_h] = empty ? -INFINITY : (m + logf(l)) * kLog2e;
  }
  if (p.stats != nullptr && lane == 0) {
    float* st = p.stats + row * p.stats_stride_n + h * p.stats_stride_h;
    st[0] = empty ? -INFINITY : m;
    st[1] = empty ? 0.0f : l * p.stats_sum_scale;
  }
}

bool one_of(DType d, std::initializer_list<DType> ok) {
  return std::find(ok.begin(), ok.end(), d) != ok.end();
}

// The ragged call as a batch prefill without a page table: request b's keys are rows
// cu_kv[b] .. of k and v; bmm1_scale is the logit scale, bmm2_scale the output multiplier. Index
// arrays and work items are left to the caller.
AttentionParams as_attention(const RaggedAttentionParams& r) {
  AttentionParams a;
  a.q = r.q;
  a.q_dtype = r.q_dtype;
  a.q_stride_n = r.q_stride_n;
  a.q_stride_h = r.q_stride_h;
  a.kv.k = r.k;
  a.kv.v = r.v;
  a.kv.dtype = r.k_dtype;
  a.kv.k_stride_token = r.k_stride_n;
  a.kv.k_stride_head = r.k_stride_h;
  a.kv.v_stride_token = r.v_stride_n;
  a.kv.v_stride_head = r.v_stride_h;
  a.kv.kv_indptr = r.cu_kv;
  a.kv.page_size = 1;
  a.o = r.o;
  a.o_dtype = r.o_dtype;
  a.o_stride_n = r.o_stride_n;
  a.o_stride_h = r.o_stride_h;
  a.lse = r.lse;
  a.lse_stride_n = r.lse_stride_n;
  a.lse_stride_h = r.lse_stride_h;
  a.batch = r.batch;
  a.num_qo_heads = r.num_qo_heads;
  a.num_kv_heads = r.num_kv_heads;
  a.head_dim_qk = r.head_dim_qk;
  a.head_dim_vo = r.head_dim_vo;
  a.qo_indptr = r.cu_q;
  a.kv_lens = r.kv_lens;
  a.sm_scale = r.bmm1_scale;
  a.v_scale = r.bmm2_scale;
  a.causal = r.causal;
  a.window_left = r.window_left;
  a.use_tensor_cores = true;
  return a;
}

// Split-KV partials of the calls that pass no workspace (the fmha_v2 names): the stream's buffer
// of kernels/cuda/stream_scratch.h, so a warm stream allocates nothing; the lease is held until
// the attention and merge kernels reading it are queued.
StreamScratch stream_partials(int64_t bytes, cudaStream_t stream) {
  static StreamScratchPool pool("split-KV scratch");
  return pool.acquire("trtllm_ragged_attention_deepseek", stream, static_cast<std::size_t>(bytes));
}

}  // namespace

bool ragged_fa2_eligible(const RaggedAttentionParams& p) {
  if (p.stats != nullptr || p.num_kv_heads < 1 || p.num_qo_heads % p.num_kv_heads != 0) {
    return false;
  }
  if (p.k_dtype != p.q_dtype || p.v_dtype != p.q_dtype || p.o_dtype != p.q_dtype) return false;
  if (!prefill::prefill_dims_built(p.head_dim_qk, p.head_dim_vo)) return false;
  const AttentionParams a = as_attention(p);
  return attention_rows_aligned(a) && prefill_supported(a);  // 16-bit dtypes, sm80+
}

int ragged_hopper_blocks_per_sm(const RaggedAttentionParams& p, int device) {
  return prefill_sm90_tall_blocks_per_sm(as_attention(p), device);
}

const char* ragged_attention_unsupported(const RaggedAttentionParams& p) {
  if (p.head_dim_qk < 1 || p.head_dim_qk > kWarp * kPerLane || p.head_dim_vo < 1 ||
      p.head_dim_vo > kWarp * kPerLane) {
    return "the CUDA kernel takes head dims in [1, 256]";
  }
  if (p.num_kv_heads < 1 || p.num_qo_heads % p.num_kv_heads != 0) return "bad head counts";
  constexpr auto f16 = DType::kFloat16, bf16 = DType::kBFloat16, e4m3 = DType::kFloat8E4M3FN;
  if (!one_of(p.q_dtype, {f16, bf16, e4m3}) || !one_of(p.k_dtype, {f16, bf16, e4m3}) ||
      !one_of(p.v_dtype, {f16, bf16, e4m3}) || !one_of(p.o_dtype, {f16, bf16, DType::kFloat32})) {
    return "dtype combination not supported by the CUDA kernel";
  }
  if ((int64_t{p.rows} * p.num_qo_heads + kRaggedWarpsPerBlock - 1) / kRaggedWarpsPerBlock >
      0x7fffffff) {
    return "too many (row, head) items for one grid";
  }
  if (p.row_req == nullptr && p.fa2_work == nullptr && p.rows > 0) {
    return "no row-to-request map (host-side bug)";
  }
  return nullptr;
}

void ragged_attention(const RaggedAttentionParams& p, void* stream, bool enable_pdl) {
  const int64_t items = int64_t{p.rows} * p.num_qo_heads;
  if (items == 0) return;
  if (p.fa2_work != nullptr) {
    if (p.fa2_num_work == 0) return;  // a device plan's grid of no queries (max_q_len 0)
    AttentionParams a = as_attention(p);
    a.work = p.fa2_work;
    a.num_work = p.fa2_num_work;
    a.max_work_rows = p.fa2_max_rows;
    StreamScratch partials;
    if (p.fa2_partial_rows > 0) {  // split-KV: partials, then the merge pass (batch_attention)
      a.merge_indptr = p.fa2_merge_indptr;
      a.merge_rows = p.fa2_merge_rows;
      a.merge_out_row = p.fa2_merge_out_row;
      a.num_merge = p.fa2_num_merge;
      a.tmp_v = p.tmp_v;
      a.tmp_s = p.tmp_s;
      if (a.tmp_v == nullptr) {
        const int64_t v_elems = p.fa2_partial_rows * p.num_qo_heads * p.head_dim_vo;
        partials = stream_partials((v_elems + p.fa2_partial_rows * p.num_qo_heads) * 4,
                                   static_cast<cudaStream_t>(stream));
        a.tmp_v = static_cast<float*>(partials.data());
        a.tmp_s = a.tmp_v + v_elems;
      }
    }
    batch_attention(a, stream, enable_pdl);  // `partials` released after its kernels are queued
    return;
  }
  auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>((items + kRaggedWarpsPerBlock - 1) / kRaggedWarpsPerBlock));
  const dim3 block(kWarp * kRaggedWarpsPerBlock);
  cudaError_t err = cudaSuccess;
  dispatch_dtype<CudaElements, kFloat16, kBFloat16, kFloat8E4M3FN>(
      p.k_dtype, "trtllm_ragged_attention_deepseek", "key", [&]<class KT>() {
        dispatch_dtype<CudaElements, kFloat16, kBFloat16, kFloat8E4M3FN>(
            p.v_dtype, "trtllm_ragged_attention_deepseek", "value", [&]<class VT>() {
              err = try_launch_kernel(ragged_attention_kernel<KT, VT>, grid, block, 0, s,
                                      enable_pdl, p);
            });
      });
  if (err != cudaSuccess) {
    FLASHINFER_FAIL(ErrorCode::kCuda, "trtllm_ragged_attention_deepseek", "",
                    "kernel launch failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  }
}

}  // namespace flashinfer::kernels::cuda
