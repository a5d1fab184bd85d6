// fused_topk_deepseek's first CUDA kernel, kept as a test oracle (oracle/moe_routing_oracle.h):
// one thread per token, the same selection loops as the CPU reference, every biased score
// recomputed where the loops read it. The library's kernel (kernels/cuda/moe_cuda.cu) computes
// the same floats with the same expressions, so the two agree bit for bit.
#include <cstdint>

#include "kernels/cuda/cuda_utils.cuh"
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

}  // namespace flashinfer::testing
