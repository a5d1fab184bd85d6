// hash_topk on CUDA: one thread per token, the table's experts, their weights sqrt(softplus(x))
// normalized over the routed experts, the shared slot after them.
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/hash_topk_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kHashTopkThreads = 128;

__global__ void hash_topk_kernel(HashTopkParams p) {
  pdl_wait();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= p.num_tokens) return;
  const int64_t v = p.input_ids[t * p.ids_stride];
  const int64_t width = p.topk + p.num_shared;
  float* w = p.weights + t * width;
  int32_t* ids = p.topk_ids + t * width;
  // A token whose id is outside the table, or whose row names an expert outside
  // [0, num_experts), gets routed ids -1 and NaN weights (the CPU refuses such a call): checked
  // here, on the device, so nothing is read out of bounds and nothing goes through the host.
  bool ok = v >= 0 && v < p.vocab;
  for (int64_t k = 0; ok && k < p.topk; ++k) {
    const int32_t e = p.tid2eid[v * p.table_stride + k];
    ok = e >= 0 && e < p.num_experts;
  }
  float sum = 0.0f;
  for (int64_t k = 0; k < p.topk && !ok; ++k) {
    w[k] = __int_as_float(0x7fc00000);
    ids[k] = -1;
  }
  for (int64_t k = 0; k < p.topk && ok; ++k) {
    const int32_t e = p.tid2eid[v * p.table_stride + k];
    const float x = p.logits[t * p.logits_stride + e];
    // softplus with torch's threshold: x itself above 20.
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    w[k] = __fsqrt_rn(sp);
    ids[k] = e;
    sum = __fadd_rn(sum, w[k]);
  }
  for (int64_t k = 0; k < p.topk && ok; ++k) w[k] = __fdiv_rn(w[k], sum);
  if (p.num_shared > 0) {
    w[p.topk] = __fdiv_rn(1.0f, p.routed_scaling_factor);
    ids[p.topk] = static_cast<int32_t>(p.num_experts);
  }
}

}  // namespace

void hash_topk(const HashTopkParams& p, void* stream, bool enable_pdl) {
  if (p.num_tokens == 0) return;
  const auto blocks =
      static_cast<unsigned>((p.num_tokens + kHashTopkThreads - 1) / kHashTopkThreads);
  launch_kernel("hash_topk", hash_topk_kernel, dim3(blocks), dim3(kHashTopkThreads), 0,
                static_cast<cudaStream_t>(stream), enable_pdl, p);
}

}  // namespace flashinfer::kernels::cuda
