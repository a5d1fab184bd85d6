// Launch of the FA2 prefill kernel (prefill_kernel.cuh) for one head-dim pair and K/V storage type
// (q's, or fp8 bytes): the CTA height and variant chosen per call. Included only by the
// prefill_fa2_*.cu sources, one per built pair and K/V kind, so that nvcc compiles their instances
// in parallel (as one source they were the build's longest compile, 457 s).
#pragma once

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/prefill_cuda.h"
#include "kernels/cuda/prefill_grid_launch.cuh"
#include "kernels/cuda/prefill_kernel.cuh"
#include "kernels/occupancy.h"

namespace flashinfer::kernels::cuda {

template <class T, class TKV, int DQK, int DVO, int kCtaQ, int kVariant>
void launch_fa2(const AttentionParams& p, cudaStream_t stream, bool enable_pdl) {
  launch_prefill_grid(p, prefill::batch_prefill_kernel<T, TKV, DQK, DVO, kCtaQ, kVariant>, kCtaQ,
                      prefill::kPrefillThreads, prefill::prefill_smem_bytes(kCtaQ, DQK, DVO),
                      stream, enable_pdl);
}

// The instance of blocks of kCtaQ rows for a built variant (prefill_variant_built; ALiBi has no
// 16-row block: prefill_cta_rows never gives it one).
template <class T, class TKV, int DQK, int DVO, int kCtaQ>
void launch_fa2_variant(const AttentionParams& p, cudaStream_t s, bool pdl, int variant) {
  constexpr int kSoftCap = prefill::kPrefillSoftCap, kMask = prefill::kPrefillCustomMask;
  switch (variant) {
    case 0:
      return launch_fa2<T, TKV, DQK, DVO, kCtaQ, 0>(p, s, pdl);
    case kSoftCap:
      return launch_fa2<T, TKV, DQK, DVO, kCtaQ, kSoftCap>(p, s, pdl);
    case kMask:
      return launch_fa2<T, TKV, DQK, DVO, kCtaQ, kMask>(p, s, pdl);
    case prefill::kPrefillAlibi:
      if constexpr (kCtaQ != 16)
        return launch_fa2<T, TKV, DQK, DVO, kCtaQ, prefill::kPrefillAlibi>(p, s, pdl);
      break;
    case kSoftCap | kMask:
      return launch_fa2<T, TKV, DQK, DVO, kCtaQ, kSoftCap | kMask>(p, s, pdl);
    default:
      break;
  }
  FLASHINFER_FAIL(ErrorCode::kInternal, "attention", "q", "no FA2 instance of variant ", variant,
                  " in blocks of ", kCtaQ, " rows");
}

// The block height from the packed rows of the largest work item (prefill_cta_rows); only the
// heights a head-dim pair can take are instantiated. Every variant of prefill_variant_built, for
// 16-bit and fp8 K/V (TKV = uint8_t) alike; all but ALiBi also in 16-row blocks.
template <class T, class TKV, int DQK, int DVO>
void prefill_fa2(const AttentionParams& p, cudaStream_t s, bool pdl) {
  const int32_t group = p.num_qo_heads / p.num_kv_heads;
  const int variant = prefill_variant(p);
  // The plain blocks fold the scale into the exponent, which needs it > 0 for every row.
  FLASHINFER_CHECK_CODE(
      prefill::prefill_scale_folds(p.sm_scale, p.scale_q != nullptr, p.scale_k != nullptr),
      ErrorCode::kUnsupported, "attention", "sm_scale",
      "the FA2 kernel takes a finite scale > 0 and no per-head q / k scales");
  FLASHINFER_CHECK_CODE(prefill::prefill_variant_built(variant), ErrorCode::kUnsupported,
                        "attention", "alibi_slopes",
                        "ALiBi with a soft cap or a custom mask has no FA2 kernel");
  // fp8 K/V has no 128-row block: 64-row blocks take its tall work items, as on GPUs where two
  // 128-row blocks do not fit an SM.
  int cta = prefill::prefill_launch_cta_rows(p.max_work_rows * group, DQK, DVO, variant,
                                             sizeof(TKV) == 1);
  if (cta == 128) {  // 64-row blocks where two 128-row ones do not fit an SM (A100, sm_86/89)
    // The device's own figures (any part, listed in DeviceLimits or not).
    const int smem_per_sm = current_device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor);
    const int reserved = current_device_attribute(cudaDevAttrReservedSharedMemoryPerBlock);
    if (!prefill::prefill_tall_blocks_fit(DQK, DVO, smem_per_sm, reserved)) cta = 64;
  }
  if constexpr (prefill::prefill_cta_rows(1, DQK, DVO, 0) == 16) {
    if (cta == 16) return launch_fa2_variant<T, TKV, DQK, DVO, 16>(p, s, pdl, variant);
  }
  if constexpr (prefill::prefill_cta_rows(128, DQK, DVO, 0) == 128 && sizeof(TKV) == 2) {
    if (cta == 128) return launch_fa2<T, TKV, DQK, DVO, 128, 0>(p, s, pdl);
  }
  launch_fa2_variant<T, TKV, DQK, DVO, 64>(p, s, pdl, variant);
}

// The explicit instantiations of one pair, for fp16 and bf16 q and K/V of q's dtype (in
// prefill_fa2_d<DQK>.cu) or fp8 K/V, e4m3 and e5m2 alike (in prefill_fa2_fp8_d<DQK>.cu).
#define FLASHINFER_PREFILL_FA2_INSTANCE(TQ, TKV, DQK, DVO) \
  template void prefill_fa2<TQ, TKV, DQK, DVO>(const AttentionParams&, cudaStream_t, bool);
#define FLASHINFER_PREFILL_FA2_PAIR(DQK, DVO)               \
  FLASHINFER_PREFILL_FA2_INSTANCE(__half, __half, DQK, DVO) \
  FLASHINFER_PREFILL_FA2_INSTANCE(__nv_bfloat16, __nv_bfloat16, DQK, DVO)
#define FLASHINFER_PREFILL_FA2_FP8_PAIR(DQK, DVO)            \
  FLASHINFER_PREFILL_FA2_INSTANCE(__half, uint8_t, DQK, DVO) \
  FLASHINFER_PREFILL_FA2_INSTANCE(__nv_bfloat16, uint8_t, DQK, DVO)

}  // namespace flashinfer::kernels::cuda
