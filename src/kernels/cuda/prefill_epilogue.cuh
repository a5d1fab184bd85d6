// The end of a packed row in the tensor-core prefill kernels (the FA2 kernel, prefill_kernel.cuh,
// and the Hopper kernel, prefill_sm90_kernel.cuh): the row's LSE and its normalized output, into
// the output (and lse) tensors for a final row or into the split-KV partials for the merge pass.
#pragma once

#include "kernels/cuda/attention_cuda_common.cuh"
#include "kernels/cuda/device/mma.cuh"
#include "kernels/cuda/prefill_shape.h"

namespace flashinfer::kernels::cuda::prefill {

/// Writes one packed row from the columns of an m16nN accumulator fragment this thread holds:
/// `out(n, c)`, c = 0, 1, is the unnormalized sum of column prefill_o_pair_col(kFp8Order, n, tid4)
/// + c (n < DVO / 8): 8 n + 2 tid4 + c, or in the fp8 instances' order (prefill_shape.h; the
/// lane's part and n's added apart, as the constant offsets of one base pointer). m:
/// the row's running max (log2 units); l: its whole sum (the quad's partial sums added); qrel: its
/// query within the work item; h: its qo head; out_scale: v_scale (and the KV head's scale_v).
/// NaN where l is NaN or m = +inf: a folded logit c q.k overflowed (finite q.k past FLT_MAX / c),
/// so every P of the row is 0, where scaling first made that logit +inf and its softmax NaN (the
/// CPU reference's, the other blocks'); NaN here too, so that a split's partial is not dropped as
/// empty. A row that saw no key: output 0, LSE -inf. Sinks join once per row: here when the row
/// is final, in the merge pass when it is split.
template <class T, int DVO, bool kFp8Order = false, class Out>
__device__ __forceinline__ void prefill_store_row(const AttentionParams& p, const WorkItem& w,
                                                  int64_t q_base, uint32_t qrel, int32_t h, float m,
                                                  float l, float out_scale, int tid4, Out out) {
  const bool nan_any = isnan(l) || m == INFINITY;
  const bool any = l > 0.0f;
  float inv = nan_any ? NAN : (any ? out_scale / l : 0.0f);
  float lse = nan_any ? NAN : (any ? m + log2f(l) : -INFINITY);
  if (p.sinks != nullptr && w.partial_base < 0) {
    float f = 1.0f;
    lse = apply_sink(lse, p.sinks[h] * kLog2e, &f);
    inv *= f;
  }
  if (w.partial_base >= 0) {
    const int64_t prow = static_cast<int64_t>(w.partial_base) + qrel;
    float* dst =
        p.tmp_v + (prow * p.num_qo_heads + h) * DVO + prefill_o_pair_col(kFp8Order, 0, tid4);
#pragma unroll
    for (int n = 0; n < DVO / 8; ++n) {
      *reinterpret_cast<float2*>(dst + prefill_o_pair_col(kFp8Order, n, 0)) =
          make_float2(out(n, 0) * inv, out(n, 1) * inv);
    }
    if (tid4 == 0) p.tmp_s[prow * p.num_qo_heads + h] = lse;
  } else {
    const int64_t row = q_base + w.qo_begin + qrel;
    T* dst = static_cast<T*>(p.o) + row * p.o_stride_n + h * p.o_stride_h +
             prefill_o_pair_col(kFp8Order, 0, tid4);
#pragma unroll
    for (int n = 0; n < DVO / 8; ++n) {
      *reinterpret_cast<uint32_t*>(dst + prefill_o_pair_col(kFp8Order, n, 0)) =
          dev::mma::pack2<T>(out(n, 0) * inv, out(n, 1) * inv);
    }
    if (tid4 == 0 && p.lse) p.lse[row * p.lse_stride_n + h * p.lse_stride_h] = lse_out(p, lse);
  }
}

}  // namespace flashinfer::kernels::cuda::prefill
