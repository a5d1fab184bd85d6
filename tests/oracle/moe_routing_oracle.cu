// fused_topk_deepseek's first CUDA kernel and the trtllm MoE ops' first routing kernel, kept as
// test oracles (oracle/moe_routing_oracle.h): one thread per token, the same selection loops as
// the CPU reference (fused_topk_deepseek's recomputing every biased score where the loops read
// it). The library's warp-per-token kernels (kernels/cuda/moe_cuda.cu) compute the same floats
// with the same expressions, so each pair agrees bit for bit.
#include <cstdint>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/moe_quant_params.h"
#include "oracle/moe_routing_oracle.h"

namespace flashinfer::kernels::cuda::moe_routing_oracle {
namespace {

template <class S, class B, class V>
__global__ void deepseek_routing_oracle_kernel(DeepSeekRoutingParams p) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= p.num_tokens) return;
  const int64_t E = p.num_experts, G = p.n_group, per_group = E / G;
  const S* sc = static_cast<const S*>(p.scores) + t * p.scores_stride;
  const B* bias = static_cast<const B*>(p.bias);
  auto sig = [&](int64_t e) { return 1.0f / (1.0f + expf(-to_f32(sc[e]))); };
  auto biased = [&](int64_t e) { return sig(e) + to_f32(bias[e * p.bias_stride]); };
  bool kept[32];
  float gscore[32];
  for (int64_t g = 0; g < G; ++g) {
    kept[g] = G == 1;
    float m1 = -INFINITY, m2 = -INFINITY;
    for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
      const float v = biased(e);
      if (v > m1) {
        m2 = m1;
        m1 = v;
      } else if (v > m2) {
        m2 = v;
      }
    }
    gscore[g] = per_group >= 2 ? m1 + m2 : m1;
  }
  if (G > 1) {
    for (int64_t i = 0; i < p.topk_group; ++i) {
      int64_t best = -1;
      for (int64_t g = 0; g < G; ++g) {
        if (!kept[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
      }
      kept[best] = true;
    }
  }
  int64_t sel[8];
  float sum = 0.0f;
  for (int64_t i = 0; i < p.topk; ++i) {
    int64_t best = -1;
    float best_v = 0.0f;
    for (int64_t e = 0; e < E; ++e) {
      if (!kept[e / per_group]) continue;
      bool taken = false;
      for (int64_t q = 0; q < i; ++q) taken |= sel[q] == e;
      if (taken) continue;
      const float v = biased(e);
      if (best < 0 || v > best_v) {
        best = e;
        best_v = v;
      }
    }
    sel[i] = best;
    sum += sig(best);
  }
  const float denom = sum + 1e-20f;
  V* vals = static_cast<V*>(p.topk_values) + t * p.values_stride;
  for (int64_t i = 0; i < p.topk; ++i) {
    vals[i] = from_f32<V>(sig(sel[i]) / denom * p.routed_scaling_factor);
    p.topk_indices[t * p.indices_stride + i] = static_cast<int32_t>(sel[i]);
    if (p.replay_out) p.replay_out[t * p.replay_stride + i] = static_cast<int16_t>(sel[i]);
  }
}

__device__ __forceinline__ float load_routing(const void* base, DType dt, int64_t i) {
  return dt == DType::kBFloat16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i])
                                : static_cast<const float*>(base)[i];
}

// The trtllm MoE ops' routing as the library ran it to session 62 (a thread a token, the CPU
// reference's loops over local arrays: 4 KB of stack a thread), which passed every trtllm MoE
// CUDA case on an H200 (session 31): token t into id / w [top_k], weights rounded to bf16 (the
// bits also to expert_weights_out when set); routing_replay_out when set.
__device__ void trtllm_route_token(const TrtllmMoeParams& b, int64_t t, int32_t* id, float* w) {
  const MoeRoutingParams& r = b.routing;
  const int64_t E = r.num_experts, K = r.top_k;
  if (b.precomputed) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t i = t * b.routed_stride + k;
      if (b.packed) {
        const uint32_t v = static_cast<uint32_t>(b.packed[i]);
        id[k] = static_cast<int32_t>(v >> 16);
        w[k] = __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(v & 0xFFFFu)));
      } else {
        id[k] = b.ids[i];
        w[k] = load_routing(b.weights, b.weights_dtype, i);
      }
    }
  } else {
    const int64_t G = r.n_group > 1 ? r.n_group : 1, per_group = E / G;
    const int64_t TG = r.method == MoeRouting::kDeepSeekV3 && G > 1 ? r.topk_group : G;
    float x[kFp8MoeCudaMaxExperts], sel[kFp8MoeCudaMaxExperts];
    for (int64_t e = 0; e < E; ++e) {
      x[e] = load_routing(r.logits, r.logits_dtype, t * r.logits_stride + e);
    }
    float mx = -INFINITY, denom = 0.0f;
    switch (r.method) {
      case MoeRouting::kDefault:
      case MoeRouting::kRenormalizeNaive:
        for (int64_t e = 0; e < E; ++e) mx = fmaxf(mx, x[e]);
        for (int64_t e = 0; e < E; ++e) {
          x[e] = expf(x[e] - mx);
          denom += x[e];
        }
        for (int64_t e = 0; e < E; ++e) x[e] /= denom;
        break;
      case MoeRouting::kDeepSeekV3:
      case MoeRouting::kSigmoidRenorm:
      case MoeRouting::kMiniMax2:
      case MoeRouting::kSigmoid:
        for (int64_t e = 0; e < E; ++e) x[e] = 1.0f / (1.0f + expf(-x[e]));
        break;
      default:
        break;
    }
    const bool biased =
        r.bias && (r.method == MoeRouting::kDeepSeekV3 || r.method == MoeRouting::kMiniMax2);
    for (int64_t e = 0; e < E; ++e) {
      // Session 82: the grouped DeepSeekV3 bias as bf16, as upstream's kernel adds it.
      sel[e] = x[e] + (biased ? moe_routing_bias(r.method, r.n_group,
                                                 load_routing(r.bias, r.bias_dtype, e))
                              : 0.0f);
    }
    bool kept[32];
    if (TG < G) {
      for (int64_t g = 0; g < G; ++g) kept[g] = false;
      float gscore[32];
      for (int64_t g = 0; g < G; ++g) {
        float m1 = -INFINITY, m2 = -INFINITY;
        for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
          if (sel[e] > m1) {
            m2 = m1;
            m1 = sel[e];
          } else if (sel[e] > m2) {
            m2 = sel[e];
          }
        }
        gscore[g] = per_group >= 2 ? m1 + m2 : m1;
      }
      for (int64_t i = 0; i < TG; ++i) {
        int64_t best = -1;
        for (int64_t g = 0; g < G; ++g) {
          if (!kept[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
        }
        if (best >= 0) kept[best] = true;
      }
    }
    float sum = 0.0f;
    for (int64_t i = 0; i < K; ++i) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        // Only grouped selection (TG < G: DeepSeekV3, E % G == 0 checked) leaves groups out;
        // the CPU keeps every group otherwise.
        if (TG < G && !kept[e / per_group]) continue;
        bool taken = false;
        for (int64_t q = 0; q < i; ++q) taken |= id[q] == e;
        if (taken) continue;
        if (best < 0 || sel[e] > sel[best]) best = e;
      }
      if (best < 0) best = 0;
      id[i] = static_cast<int32_t>(best);
      w[i] = x[best];
      sum += w[i];
    }
    switch (r.method) {
      case MoeRouting::kRenormalize: {
        float m = -INFINITY, d = 0.0f;
        for (int64_t i = 0; i < K; ++i) m = fmaxf(m, w[i]);
        for (int64_t i = 0; i < K; ++i) {
          w[i] = expf(w[i] - m);
          d += w[i];
        }
        for (int64_t i = 0; i < K; ++i) w[i] /= d;
        break;
      }
      case MoeRouting::kLlama4:
      case MoeRouting::kTopKSigmoid:  // session 82
        for (int64_t i = 0; i < K; ++i) w[i] = 1.0f / (1.0f + expf(-w[i]));
        break;
      case MoeRouting::kRenormalizeNaive:
        for (int64_t i = 0; i < K; ++i) w[i] /= sum;
        break;
      case MoeRouting::kSigmoidRenorm:
        if (r.norm_topk_prob) {
          for (int64_t i = 0; i < K; ++i) w[i] /= fmaxf(sum, 1e-20f);
        }
        break;
      case MoeRouting::kDeepSeekV3:
      case MoeRouting::kMiniMax2:  // both scale by routed_scaling_factor (as the CPU reference)
        for (int64_t i = 0; i < K; ++i) w[i] = w[i] * r.routed_scaling_factor / (sum + 1e-20f);
        break;
      default:
        break;
    }
  }
  for (int64_t k = 0; k < K; ++k) {
    const __nv_bfloat16 wb = __float2bfloat16(w[k]);
    if (trtllm_weights_in_bf16(b)) w[k] = __bfloat162float(wb);  // session 82: fp32 pairs as given
    if (b.expert_weights_out) b.expert_weights_out[t * K + k] = __bfloat16_as_ushort(wb);
    if (b.replay_out) b.replay_out[t * b.replay_stride + k] = static_cast<int16_t>(id[k]);
  }
}

__global__ void trtllm_route_oracle_kernel(TrtllmMoeParams b, int32_t* ids, float* w) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= b.routing.num_tokens) return;
  const int64_t K = b.routing.top_k;
  trtllm_route_token(b, t, ids + t * K, w + t * K);
}

}  // namespace

void run(const DeepSeekRoutingParams& p, void* stream) {
  if (p.num_tokens == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = static_cast<unsigned>((p.num_tokens + 127) / 128);
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.scores_dtype, "fused_topk_deepseek", "scores", [&]<class S>() {
        dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
            p.bias_dtype, "fused_topk_deepseek", "bias", [&]<class B>() {
              dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
                  p.values_dtype, "fused_topk_deepseek", "topk_values", [&]<class V>() {
                    deepseek_routing_oracle_kernel<S, B, V><<<blocks, 128, 0, s>>>(p);
                  });
            });
      });
  FLASHINFER_CUDA_CALL("oracle_deepseek_routing", cudaGetLastError());
}

}  // namespace flashinfer::kernels::cuda::moe_routing_oracle

namespace flashinfer::testing {

void oracle_deepseek_routing(const kernels::DeepSeekRoutingParams& p, void* stream) {
  kernels::cuda::moe_routing_oracle::run(p, stream);
}

void oracle_trtllm_route(const kernels::TrtllmMoeParams& b, int32_t* ids, float* w, void* stream) {
  if (b.routing.num_tokens == 0) return;
  const unsigned blocks = static_cast<unsigned>((b.routing.num_tokens + 63) / 64);
  kernels::cuda::moe_routing_oracle::
      trtllm_route_oracle_kernel<<<blocks, 64, 0, static_cast<cudaStream_t>(stream)>>>(b, ids, w);
  FLASHINFER_CUDA_CALL("oracle_trtllm_route", cudaGetLastError());
}

}  // namespace flashinfer::testing
