// Launch of the Hopper prefill kernel (prefill_sm90_kernel.cuh) for blocks of kWG warpgroups:
// the FA2 kernel's grid and slices (prefill_grid_launch.cuh), the instance from the call's
// dtypes, head dims and soft cap. Included by prefill_sm90.cu (tall blocks, and the dispatch),
// prefill_sm90_small.cu (one-warpgroup blocks) and prefill_sm90_d192.cu (DeepSeek's 192 / 128),
// so that nvcc compiles the sets in parallel.
#pragma once

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/prefill_grid_launch.cuh"
#include "kernels/cuda/prefill_sm90_kernel.cuh"

namespace flashinfer::kernels::cuda {

template <class T, class TKV, int DQK, int DVO, bool kSoftCap, int kWG, bool kPingPong = false,
          bool kWs = false>
void launch_sm90(const AttentionParams& p, cudaStream_t stream, bool enable_pdl) {
  launch_prefill_grid(
      p, prefill::batch_prefill_sm90_kernel<T, TKV, DQK, DVO, kSoftCap, kWG, kPingPong, kWs>,
      prefill::prefill_sm90_cta_q(kWG), prefill::prefill_sm90_block_threads(kWG, kWs),
      kWs ? prefill::prefill_sm90_ws_smem_bytes(DQK, DVO)
          : prefill::prefill_sm90_smem_bytes(DQK, DVO, kWG),
      stream, enable_pdl);
}

/// The instance of head dims DQK / DVO for p's q dtype (fp16 / bf16), K/V (q's dtype, or fp8
/// where prefill_sm90_kv_built says so) and soft cap, in blocks of kWG warpgroups; `ping_pong`:
/// the ping-pong schedule, where prefill_sm90_ping_pong_built says it has one; `ws`: the
/// warp-specialized form, where prefill_sm90_ws_built says it has one (the caller asked
/// prefill_sm90_ws_takes).
template <int kWG, int DQK, int DVO>
void launch_sm90_dims(const AttentionParams& p, cudaStream_t s, bool enable_pdl, bool ping_pong,
                      bool ws = false) {
  const bool fp8 = p.kv.dtype == DType::kFloat8E4M3FN || p.kv.dtype == DType::kFloat8E5M2;
  const bool cap = p.logits_soft_cap > 0.0f;
  auto kinds = [&]<class T>() {
    if constexpr (prefill::prefill_sm90_ws_built(DQK, DVO, false, kWG) &&
                  prefill::prefill_sm90_ping_pong_built(DQK, DVO, kWG)) {
      if (ws && !fp8) {
        if (ping_pong) {
          cap ? launch_sm90<T, T, DQK, DVO, true, kWG, true, true>(p, s, enable_pdl)
              : launch_sm90<T, T, DQK, DVO, false, kWG, true, true>(p, s, enable_pdl);
        } else {
          cap ? launch_sm90<T, T, DQK, DVO, true, kWG, false, true>(p, s, enable_pdl)
              : launch_sm90<T, T, DQK, DVO, false, kWG, false, true>(p, s, enable_pdl);
        }
        return;
      }
    }
    constexpr bool kFp8Built = prefill::prefill_sm90_kv_built(DQK, DVO, true);
    if constexpr (prefill::prefill_sm90_ping_pong_built(DQK, DVO, kWG)) {
      if (ping_pong && (kFp8Built || !fp8)) {  // fp8 without an instance: refused below
        if constexpr (kFp8Built) {
          if (fp8) {
            cap ? launch_sm90<T, uint8_t, DQK, DVO, true, kWG, true>(p, s, enable_pdl)
                : launch_sm90<T, uint8_t, DQK, DVO, false, kWG, true>(p, s, enable_pdl);
            return;
          }
        }
        cap ? launch_sm90<T, T, DQK, DVO, true, kWG, true>(p, s, enable_pdl)
            : launch_sm90<T, T, DQK, DVO, false, kWG, true>(p, s, enable_pdl);
        return;
      }
    }
    if constexpr (kFp8Built) {
      if (fp8) {
        cap ? launch_sm90<T, uint8_t, DQK, DVO, true, kWG>(p, s, enable_pdl)
            : launch_sm90<T, uint8_t, DQK, DVO, false, kWG>(p, s, enable_pdl);
        return;
      }
    } else {
      if (fp8) {
        FLASHINFER_FAIL(ErrorCode::kInternal, "attention", "k",
                        "no Hopper prefill instance for fp8 K/V at head dims ", DQK, "/", DVO);
      }
    }
    cap ? launch_sm90<T, T, DQK, DVO, true, kWG>(p, s, enable_pdl)
        : launch_sm90<T, T, DQK, DVO, false, kWG>(p, s, enable_pdl);
  };
  if (p.q_dtype == DType::kBFloat16) {
    kinds.template operator()<__nv_bfloat16>();
  } else {
    kinds.template operator()<__half>();
  }
}

/// The tall blocks' instances at head dims 192 / 128 (prefill_sm90_d192.cu).
void launch_sm90_d192(const AttentionParams& p, cudaStream_t s, bool enable_pdl, bool ping_pong,
                      bool ws);

/// The instance for p's head dims (64, 128; 256 and 192 / 128 in tall blocks), dtypes and soft cap,
/// in blocks of kWG warpgroups (prefill_sm90_block_warpgroups said so).
template <int kWG>
void launch_sm90_block(const AttentionParams& p, cudaStream_t s, bool enable_pdl,
                       bool ping_pong = false, bool ws = false) {
  const int qk = p.head_dim_qk, vo = p.head_dim_vo;
  if (qk == 64 && vo == 64) return launch_sm90_dims<kWG, 64, 64>(p, s, enable_pdl, ping_pong);
  if (qk == 128 && vo == 128) {
    return launch_sm90_dims<kWG, 128, 128>(p, s, enable_pdl, ping_pong, ws);
  }
  if constexpr (kWG == 2) {
    if (qk == 256 && vo == 256) return launch_sm90_dims<2, 256, 256>(p, s, enable_pdl, ping_pong);
    if (qk == 192 && vo == 128) return launch_sm90_d192(p, s, enable_pdl, ping_pong, ws);
  }
  FLASHINFER_FAIL(ErrorCode::kInternal, "attention", "q",
                  "no Hopper prefill instance for head dims ", qk, "/", vo, " in blocks of ", kWG,
                  " warpgroups");
}

}  // namespace flashinfer::kernels::cuda
