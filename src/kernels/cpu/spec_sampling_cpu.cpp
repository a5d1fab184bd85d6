#include "kernels/cpu/spec_sampling_cpu.h"

#include <algorithm>
#include <type_traits>

#include "flashinfer/float_formats.h"
#include "kernels/dtype_dispatch.h"
#include "kernels/philox.h"
#include "kernels/sampling_rules.h"
#include "kernels/spec_sampling_rules.h"

namespace flashinfer::kernels::cpu {
namespace {

template <class T>
float f32(const T& v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return v.to_float();
  }
}

template <class T, class Id>
void run_rows(const ChainSpecParams& p) {
  const T* dp = static_cast<const T*>(p.draft_probs);
  const T* tp = static_cast<const T*>(p.target_probs);
  const Id* ids = static_cast<const Id*>(p.draft_ids);
  Id* out = static_cast<Id*>(p.out_ids);
  const int64_t n = p.n, V = p.vocab;
#pragma omp parallel for schedule(dynamic, 1) if (p.batch * (n + 1) * V >= (1 << 16))
  for (int64_t b = 0; b < p.batch; ++b) {
    PhiloxStream rng(static_cast<uint64_t>(row_arg_int(p.seed, b)), static_cast<uint64_t>(b),
                     static_cast<uint64_t>(row_arg_int(p.offset, b)));
    const int64_t pos = spec_accept_chain(
        n, ids + b * n,
        [&](int64_t i) {
          const int64_t d = spec_draft_column(ids[b * n + i], V);
          return SpecProbs{f32(dp[(b * n + i) * V + d]), f32(tp[(b * (n + 1) + i) * V + d])};
        },
        [&] { return rng.next_uniform(); }, out + b * (n + 1), static_cast<Id*>(p.accepted) + b,
        static_cast<Id*>(p.emitted) + b);
    // Residual distribution relu(target - draft) at pos (target alone for the bonus token),
    // summed and searched chunk by chunk in the CUDA kernel's order (spec_sampling_rules.h).
    const T* q = tp + (b * (n + 1) + pos) * V;
    const T* pd = pos < n ? dp + (b * n + pos) * V : nullptr;
    float m[kSpecThreads], pre[kSpecThreads];
    auto chunk = [&](int64_t c0) {  // masses and their prefixes; returns the chunk's total
      for (int t = 0; t < kSpecThreads; ++t) {
        const int64_t j = c0 + t;
        m[t] = j < V ? spec_residual_mass(f32(q[j]), pd ? f32(pd[j]) : 0.0f) : 0.0f;
        pre[t] = m[t];
      }
      return spec_chunk_scan(pre);
    };
    float sum = 0.0f;
    for (int64_t c0 = 0; c0 < V; c0 += kSpecThreads) sum += chunk(c0);
    const float u = rng.next_uniform() * sum;
    int64_t tok = -1, last = -1;
    float running = 0.0f;
    for (int64_t c0 = 0; c0 < V && tok < 0; c0 += kSpecThreads) {
      const float total = chunk(c0);
      for (int t = 0; t < kSpecThreads && tok < 0; ++t) {
        if (!(m[t] > 0.0f)) continue;
        last = c0 + t;
        if (running + pre[t] > u) tok = c0 + t;
      }
      running += total;
    }
    if (tok < 0) tok = last >= 0 ? last : 0;
    out[b * (n + 1) + pos] = static_cast<Id>(tok);
  }
}

}  // namespace

void chain_speculative_sampling(const ChainSpecParams& p) {
  dispatch_dtype<CpuElements, kFloat32, kFloat16, kBFloat16>(p.dtype, "chain_speculative_sampling",
                                                             "draft_probs", [&]<class T>() {
                                                               if (p.id_dtype == DType::kInt64) {
                                                                 run_rows<T, int64_t>(p);
                                                               } else {
                                                                 run_rows<T, int32_t>(p);
                                                               }
                                                             });
}

}  // namespace flashinfer::kernels::cpu
