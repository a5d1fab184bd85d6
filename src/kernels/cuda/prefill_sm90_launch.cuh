// Launch of the Hopper prefill kernel (prefill_sm90_kernel.cuh) for blocks of kWG warpgroups:
// the FA2 kernel's grid and slices (prefill_grid_launch.cuh), the instance from the call's
// dtypes, head dim and soft cap. Included by prefill_sm90.cu (tall blocks, and the dispatch) and
// prefill_sm90_small.cu (one-warpgroup blocks), so that nvcc compiles the two sets in parallel.
#pragma once

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/prefill_grid_launch.cuh"
#include "kernels/cuda/prefill_sm90_kernel.cuh"

namespace flashinfer::kernels::cuda {

template <class T, class TKV, int D, bool kSoftCap, int kWG, bool kPingPong = false>
void launch_sm90(const AttentionParams& p, cudaStream_t stream, bool enable_pdl) {
  launch_prefill_grid(p, prefill::batch_prefill_sm90_kernel<T, TKV, D, kSoftCap, kWG, kPingPong>,
                      prefill::prefill_sm90_cta_q(kWG), prefill::prefill_sm90_threads(kWG),
                      prefill::prefill_sm90_smem_bytes(D, kWG), stream, enable_pdl);
}

/// The instance for p's q dtype (fp16 / bf16), K/V (q's dtype or fp8), head dim (64, 128; 256 in
/// tall blocks) and soft cap, in blocks of kWG warpgroups (prefill_sm90_block_warpgroups said so);
/// `ping_pong`: the ping-pong schedule, where prefill_sm90_ping_pong_built says it has one.
template <int kWG>
void launch_sm90_block(const AttentionParams& p, cudaStream_t s, bool enable_pdl,
                       bool ping_pong = false) {
  const bool fp8 = p.kv.dtype == DType::kFloat8E4M3FN || p.kv.dtype == DType::kFloat8E5M2;
  const bool cap = p.logits_soft_cap > 0.0f;
  auto kinds = [&]<class T, int D>() {
    if constexpr (prefill::prefill_sm90_ping_pong_built(D, kWG)) {
      if (ping_pong) {
        if (fp8) {
          cap ? launch_sm90<T, uint8_t, D, true, kWG, true>(p, s, enable_pdl)
              : launch_sm90<T, uint8_t, D, false, kWG, true>(p, s, enable_pdl);
        } else {
          cap ? launch_sm90<T, T, D, true, kWG, true>(p, s, enable_pdl)
              : launch_sm90<T, T, D, false, kWG, true>(p, s, enable_pdl);
        }
        return;
      }
    }
    if (fp8) {
      cap ? launch_sm90<T, uint8_t, D, true, kWG>(p, s, enable_pdl)
          : launch_sm90<T, uint8_t, D, false, kWG>(p, s, enable_pdl);
    } else {
      cap ? launch_sm90<T, T, D, true, kWG>(p, s, enable_pdl)
          : launch_sm90<T, T, D, false, kWG>(p, s, enable_pdl);
    }
  };
  auto dims = [&]<class T>() {
    if (p.head_dim_qk == 64) return kinds.template operator()<T, 64>();
    if (p.head_dim_qk == 128) return kinds.template operator()<T, 128>();
    if constexpr (kWG == 2) {
      if (p.head_dim_qk == 256) return kinds.template operator()<T, 256>();
    }
    FLASHINFER_FAIL(ErrorCode::kInternal, "attention", "q",
                    "no Hopper prefill instance for head dim ", p.head_dim_qk, " in blocks of ",
                    kWG, " warpgroups");
  };
  if (p.q_dtype == DType::kBFloat16) {
    dims.template operator()<__nv_bfloat16>();
  } else {
    dims.template operator()<__half>();
  }
}

}  // namespace flashinfer::kernels::cuda
