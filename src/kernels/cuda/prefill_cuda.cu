// Host side of the tensor-core prefill attention kernels: which requests they serve, the Hopper
// kernel (prefill_sm90.h: wgmma, sm_90, the calls it fits), the FA2 kernel (prefill_kernel.cuh; its
// instances in prefill_fa2_d*.cu, one source per head-dim pair) for the built pairs, and the
// first-draft kernel (attention_prefill_kernel.cuh) through NVRTC for the other head dims.
#include <type_traits>

#include "jit/attention_jit.h"
#include "kernels/cuda/attention_jit_launch.h"
#include "kernels/cuda/attention_prefill_kernel.cuh"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/prefill_cuda.h"
#include "kernels/cuda/prefill_shape.h"
#if FLASHINFER_WITH_CUTLASS
#include "kernels/cuda/prefill_sm90.h"
#endif

namespace flashinfer::kernels::cuda {

// The FA2 kernel for one built head-dim pair (prefill_fa2_launch.cuh; explicitly instantiated,
// fp16 and bf16, in prefill_fa2_d<DQK>.cu, and with fp8 K/V, TKV = uint8_t, in
// prefill_fa2_fp8_d<DQK>.cu).
template <class T, class TKV, int DQK, int DVO>
void prefill_fa2(const AttentionParams& p, cudaStream_t s, bool pdl);

namespace {

// Head dims outside the built pairs: the first-draft tensor-core kernel, compiled by NVRTC for D.
void launch_jit(const AttentionParams& p, cudaStream_t stream, bool enable_pdl) {
  const int32_t group = p.num_qo_heads / p.num_kv_heads;
  const int64_t max_rows = static_cast<int64_t>(p.max_work_rows) * group;
  auto make = [&] { return jit::attention_mma_spec(p.q_dtype, p.head_dim_qk); };
  const std::string key =
      "mma:" + std::to_string(static_cast<int>(p.q_dtype)) + ":" + std::to_string(p.head_dim_qk);
  launch_attention_jit(key, make, p, static_cast<unsigned>(p.num_work),
                       static_cast<unsigned>(p.num_kv_heads),
                       static_cast<unsigned>((max_rows + mma::kRows - 1) / mma::kRows),
                       mma::kWarps * 32, mma::smem_bytes(p.head_dim_qk), stream, enable_pdl);
}

template <class T>
void dispatch_dims(const AttentionParams& p, cudaStream_t stream, bool enable_pdl) {
  const int qk = p.head_dim_qk, vo = p.head_dim_vo;
  if (dtype_is_fp8(p.kv.dtype)) {  // fp8 K/V: the FA2 kernel only (prefill_fp8_kv_built)
    if (qk == 64 && vo == 64) return prefill_fa2<T, uint8_t, 64, 64>(p, stream, enable_pdl);
    if (qk == 128 && vo == 128) return prefill_fa2<T, uint8_t, 128, 128>(p, stream, enable_pdl);
    if (qk == 256 && vo == 256) return prefill_fa2<T, uint8_t, 256, 256>(p, stream, enable_pdl);
    FLASHINFER_FAIL(ErrorCode::kUnsupported, "attention", "k", "fp8 K/V with head dims ", qk, "/",
                    vo, " has no FA2 kernel");
  }
  if (qk == 64 && vo == 64) return prefill_fa2<T, T, 64, 64>(p, stream, enable_pdl);
  if (qk == 128 && vo == 128) return prefill_fa2<T, T, 128, 128>(p, stream, enable_pdl);
  if (qk == 256 && vo == 256) return prefill_fa2<T, T, 256, 256>(p, stream, enable_pdl);
  if (qk == 192 && vo == 128) return prefill_fa2<T, T, 192, 128>(p, stream, enable_pdl);
  launch_jit(p, stream, enable_pdl);
}

}  // namespace

int prefill_variant(const AttentionParams& p) {
  // Multi-item scoring's rows run on the custom-mask instances.
  return prefill::prefill_variant_bits(p.logits_soft_cap > 0.0f,
                                       p.custom_mask != nullptr || p.multi_item_rows != nullptr,
                                       p.alibi_slopes != nullptr);
}

namespace {

// Which tensor-core kernel takes p on `device`: fa2 when the FA2 kernel does (its built head-dim
// pairs, blocks that fit the device), ok when one of them does (the FA2 kernel or the first-draft
// kernel through NVRTC).
struct PrefillRoute {
  bool ok = false, fa2 = false;
};

PrefillRoute prefill_route(const AttentionParams& p, int device) {
  // fp8 K/V (e4m3 / e5m2): the FA2 kernel's fp8 instances only (below).
  const bool fp8_kv = p.kv.dtype == DType::kFloat8E4M3FN || p.kv.dtype == DType::kFloat8E5M2;
  const bool dtype_ok = (p.q_dtype == DType::kFloat16 || p.q_dtype == DType::kBFloat16) &&
                        (p.kv.dtype == p.q_dtype || fp8_kv) && p.o_dtype == p.q_dtype;
  // The FA2 kernel for its built pairs (64/64, 128/128, 256/256, 192/128), the first-draft
  // kernel through NVRTC for any other equal multiple of 16 up to 256; the CUDA-core kernel
  // takes the rest.
  int major = 0, optin = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    return {};
  }
  // The FA2 kernel where its blocks fit the device's shared memory (sm_86 / sm_89 take 99 KiB a
  // block: not 192 / 128); the first-draft kernel otherwise.
  const bool fa2 =
      prefill::prefill_dims_built(p.head_dim_qk, p.head_dim_vo) &&
      static_cast<unsigned>(optin) >= prefill::prefill_max_smem_bytes(p.head_dim_qk, p.head_dim_vo);
  const bool dim_ok =
      fa2 || (p.head_dim_qk == p.head_dim_vo && jit::attention_head_dim_ok(p.head_dim_qk));
  // Sinks: the FA2 kernel folds them in at the end of a row; the first-draft kernel cannot, so
  // without the FA2 kernel they (and ALiBi) run on the CUDA-core kernel.
  const bool sinks_ok = p.sinks == nullptr || fa2;
  // ALiBi: the FA2 kernel's ALiBi instance, built alone (no soft cap, no custom mask).
  const bool alibi_ok =
      p.alibi_slopes == nullptr || (fa2 && prefill_variant(p) == prefill::kPrefillAlibi);
  // fp8 K/V: no first-draft kernel; the FA2 kernel where an fp8 instance is built (equal head
  // dims 64 / 128 / 256, the 16-bit blocks' variants: prefill_fp8_kv_built), on a device whose
  // blocks fit (the same bytes as the 16-bit blocks').
  const bool fp8_ok = !fp8_kv || (fa2 && prefill::prefill_fp8_kv_built(p.head_dim_qk, p.head_dim_vo,
                                                                       prefill_variant(p)));
  // The FA2 kernel scales inside the exponent (prefill_scale_folds): other scales run on the
  // CUDA-core kernel (the first-draft kernel too, one rule for the tensor-core path).
  const bool scale_ok =
      prefill::prefill_scale_folds(p.sm_scale, p.scale_q != nullptr, p.scale_k != nullptr);
  PrefillRoute r;
  r.ok = dtype_ok && dim_ok && sinks_ok && alibi_ok && fp8_ok && scale_ok && major >= 8;
  r.fa2 = r.ok && fa2;
  return r;
}

}  // namespace

bool prefill_supported(const AttentionParams& p) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  return prefill_route(p, device).ok;
}

bool prefill_sm90_built() { return FLASHINFER_WITH_CUTLASS != 0; }

int prefill_sm90_tall_blocks_per_sm(const AttentionParams& p, int device) {
#if FLASHINFER_WITH_CUTLASS
  if (prefill_sm90_off_by_env() || p.num_kv_heads <= 0) return 0;
  int major = 0, minor = 0, optin = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    return 0;
  }
  AttentionParams tall = p;  // items of a full tall block's rows
  const int32_t group = p.num_qo_heads / p.num_kv_heads;
  tall.max_work_rows = (prefill::kSm90CtaQ + group - 1) / group;
  return prefill_sm90_block_warpgroups(tall, major, minor, optin) == 2
             ? prefill::prefill_sm90_min_blocks(p.head_dim_qk, 2)
             : 0;
#else
  (void)p;
  (void)device;
  return 0;
#endif
}

bool prefill_fa2_takes(const AttentionParams& p, int device) {
  return prefill_route(p, device).fa2;
}

void batch_prefill(const AttentionParams& p, void* stream, bool enable_pdl) {
#if FLASHINFER_WITH_CUTLASS
  // sm_90: the Hopper kernel (wgmma) where the call fits it (prefill_sm90.h), else the FA2 kernel.
  if (prefill_sm90(p, stream, enable_pdl)) return;
#endif
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kFloat16, kBFloat16>(
      p.q_dtype, "attention", "q", [&]<class T>() { dispatch_dims<T>(p, s, enable_pdl); });
}

}  // namespace flashinfer::kernels::cuda
