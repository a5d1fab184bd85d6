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
          bool kWs = false, bool kOverlap = false, bool kMultiItem = false>
void launch_sm90(const AttentionParams& p, cudaStream_t stream, bool enable_pdl) {
  launch_prefill_grid(p,
                      prefill::batch_prefill_sm90_kernel<T, TKV, DQK, DVO, kSoftCap, kWG, kPingPong,
                                                         kWs, kOverlap, kMultiItem>,
                      prefill::prefill_sm90_cta_q(kWG),
                      prefill::prefill_sm90_block_threads(kWG, kWs),
                      kWs ? prefill::prefill_sm90_ws_smem_bytes(DQK, DVO, kOverlap)
                          : prefill::prefill_sm90_smem_bytes(DQK, DVO, kWG),
                      stream, enable_pdl);
}

/// Whether the warp-specialized (or overlapped) instance `kernel` starts with the registers its
/// setmaxnreg split assumes (kSm90WsEntryRegs a thread: what the launch bounds allow, which ptxas
/// gave it; fewer would leave the math warpgroups' setmaxnreg.inc waiting forever for registers the
/// block does not have). Asked once an instance; the plain form runs where it says no.
inline bool prefill_sm90_ws_registers_ok(const void* kernel) {
  cudaFuncAttributes a{};
  return cudaFuncGetAttributes(&a, kernel) == cudaSuccess && a.numRegs == prefill::kSm90WsEntryRegs;
}

/// The instance of head dims DQK / DVO for p's q dtype (fp16 / bf16), K/V (q's dtype, or fp8
/// where prefill_sm90_kv_built says so) and soft cap, in blocks of kWG warpgroups; `ping_pong`:
/// the ping-pong schedule, where prefill_sm90_ping_pong_built says it has one; `ws`: the
/// warp-specialized form, where prefill_sm90_ws_built says it has one (the caller asked
/// prefill_sm90_ws_takes) and its registers are as built (prefill_sm90_ws_registers_ok). Returns
/// whether the warp-specialized form ran.
template <int kWG, int DQK, int DVO>
bool launch_sm90_dims(const AttentionParams& p, cudaStream_t s, bool enable_pdl, bool ping_pong,
                      bool ws = false) {
  const bool fp8 = p.kv.dtype == DType::kFloat8E4M3FN || p.kv.dtype == DType::kFloat8E5M2;
  const bool cap = p.logits_soft_cap > 0.0f;
  auto kinds = [&]<class T>() -> bool {
    if constexpr (prefill::prefill_sm90_ws_built(DQK, DVO, false, kWG) &&
                  prefill::prefill_sm90_ping_pong_built(DQK, DVO, kWG)) {
      auto try_ws = [&]<bool kCap, bool kPingPong>() {
        static const bool ok = prefill_sm90_ws_registers_ok(reinterpret_cast<const void*>(
            prefill::batch_prefill_sm90_kernel<T, T, DQK, DVO, kCap, kWG, kPingPong, true>));
        if (ok) launch_sm90<T, T, DQK, DVO, kCap, kWG, kPingPong, true>(p, s, enable_pdl);
        return ok;
      };
      if (ws && !fp8) {
        const bool ran = ping_pong ? (cap ? try_ws.template operator()<true, true>()
                                          : try_ws.template operator()<false, true>())
                                   : (cap ? try_ws.template operator()<true, false>()
                                          : try_ws.template operator()<false, false>());
        if (ran) return true;
      }
    }
    constexpr bool kFp8Built = prefill::prefill_sm90_kv_built(DQK, DVO, true);
    if constexpr (prefill::prefill_sm90_ping_pong_built(DQK, DVO, kWG)) {
      if (ping_pong && (kFp8Built || !fp8)) {  // fp8 without an instance: refused below
        if constexpr (kFp8Built) {
          if (fp8) {
            cap ? launch_sm90<T, uint8_t, DQK, DVO, true, kWG, true>(p, s, enable_pdl)
                : launch_sm90<T, uint8_t, DQK, DVO, false, kWG, true>(p, s, enable_pdl);
            return false;
          }
        }
        cap ? launch_sm90<T, T, DQK, DVO, true, kWG, true>(p, s, enable_pdl)
            : launch_sm90<T, T, DQK, DVO, false, kWG, true>(p, s, enable_pdl);
        return false;
      }
    }
    if constexpr (kFp8Built) {
      if (fp8) {
        cap ? launch_sm90<T, uint8_t, DQK, DVO, true, kWG>(p, s, enable_pdl)
            : launch_sm90<T, uint8_t, DQK, DVO, false, kWG>(p, s, enable_pdl);
        return false;
      }
    } else {
      if (fp8) {
        FLASHINFER_FAIL(ErrorCode::kInternal, "attention", "k",
                        "no Hopper prefill instance for fp8 K/V at head dims ", DQK, "/", DVO);
      }
    }
    cap ? launch_sm90<T, T, DQK, DVO, true, kWG>(p, s, enable_pdl)
        : launch_sm90<T, T, DQK, DVO, false, kWG>(p, s, enable_pdl);
    return false;
  };
  return p.q_dtype == DType::kBFloat16 ? kinds.template operator()<__nv_bfloat16>()
                                       : kinds.template operator()<__half>();
}

/// The tall blocks' instances at head dims 192 / 128 (prefill_sm90_d192.cu); returns whether the
/// warp-specialized form ran.
bool launch_sm90_d192(const AttentionParams& p, cudaStream_t s, bool enable_pdl, bool ping_pong,
                      bool ws);

/// The overlapped form's instance for p's head dims (128, or 192 / 128) and q dtype, with the
/// ping-pong turns where `ping_pong` (prefill_sm90_overlap.cu; the caller asked
/// prefill_sm90_overlap_takes). False, having run nothing, where its registers are not as built
/// (prefill_sm90_ws_registers_ok); the caller then runs another form.
bool launch_sm90_overlap(const AttentionParams& p, cudaStream_t s, bool enable_pdl, bool ping_pong);

/// Multi-item scoring's instance (prefill_sm90_multi_item.cu; kSm90MultiItem: head dims 128, K/V
/// of q's dtype, no soft cap, the plain schedule) for p's q dtype, in blocks of `wg` warpgroups.
void launch_sm90_multi_item(const AttentionParams& p, cudaStream_t s, bool enable_pdl, int wg);

/// The instance for p's head dims (64, 128; 256 and 192 / 128 in tall blocks), dtypes and soft cap,
/// in blocks of kWG warpgroups (prefill_sm90_block_warpgroups said so); returns whether the
/// warp-specialized form ran.
template <int kWG>
bool launch_sm90_block(const AttentionParams& p, cudaStream_t s, bool enable_pdl,
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
