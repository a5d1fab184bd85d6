#include "kernels/cpu/spec_sampling_cpu.h"

#include <algorithm>
#include <type_traits>

#include "flashinfer/float_formats.h"
#include "kernels/dtype_dispatch.h"
#include "kernels/philox.h"

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
    PhiloxStream rng(p.seed, static_cast<uint64_t>(b), p.offset);
    auto accept = [&](int64_t i) {
      const int64_t d = ids[b * n + i];
      const float q = f32(tp[(b * (n + 1) + i) * V + d]);
      const float pr = f32(dp[(b * n + i) * V + d]);
      return rng.next_uniform() * pr < q;
    };
    int64_t pos = n;
    for (int64_t i = 0; i < n; ++i) {
      if (accept(i)) {
        out[b * (n + 1) + i] = ids[b * n + i];
      } else {
        pos = i;
        break;
      }
    }
    int64_t accepted = pos;
    for (int64_t i = pos; i < n; ++i) accepted += accept(i);
    Id* acc = static_cast<Id*>(p.accepted);
    Id* emi = static_cast<Id*>(p.emitted);
    acc[b] = static_cast<Id>(acc[b] + accepted);
    emi[b] = static_cast<Id>(emi[b] + pos);
    // Residual distribution relu(target - draft) at pos (target alone for the bonus token).
    const T* q = tp + (b * (n + 1) + pos) * V;
    const T* pd = pos < n ? dp + (b * n + pos) * V : nullptr;
    auto mass = [&](int64_t j) { return std::max(f32(q[j]) - (pd ? f32(pd[j]) : 0.0f), 0.0f); };
    float sum = 0.0f;
    for (int64_t j = 0; j < V; ++j) sum += mass(j);
    const float u = rng.next_uniform() * sum;
    int64_t tok = -1, last = -1;
    float c = 0.0f;
    for (int64_t j = 0; j < V; ++j) {
      const float m = mass(j);
      if (!(m > 0.0f)) continue;
      c += m;
      last = j;
      if (c > u) {
        tok = j;
        break;
      }
    }
    if (tok < 0) tok = last >= 0 ? last : 0;
    out[b * (n + 1) + pos] = static_cast<Id>(tok);
    for (int64_t i = pos + 1; i <= n; ++i) out[b * (n + 1) + i] = static_cast<Id>(-1);
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
