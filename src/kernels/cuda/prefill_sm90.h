// The Hopper prefill kernel (prefill_sm90_kernel.cuh, wgmma through CuTe) as a path of
// batch_prefill: built only when CMake finds CUTLASS's headers (FLASHINFER_WITH_CUTLASS=1), for
// sm_90a. Plain C++ header.
#pragma once

#include <cstdint>

#include "core/env_switch.h"
#include "kernels/attention_params.h"
#include "kernels/cuda/prefill_sm90_shape.h"

namespace flashinfer::kernels::cuda {

/// Whether the Hopper kernel takes these dtypes at these head dims: fp16 / bf16 q and an output
/// of q's dtype, K/V of q's dtype or fp8 with an instance (prefill::prefill_sm90_kv_built). One
/// rule for the launcher (below) and the planner (attention_common.cpp), which must agree.
constexpr bool prefill_sm90_dtypes_fit(DType q, DType kv, DType o, int dqk, int dvo,
                                       bool multi_item) {
  const bool q16 = q == DType::kFloat16 || q == DType::kBFloat16;
  const bool fp8 = kv == DType::kFloat8E4M3FN || kv == DType::kFloat8E5M2;
  return q16 && (kv == q || fp8) && o == q &&
         prefill::prefill_sm90_kv_built(dqk, dvo, fp8, multi_item);
}

/// The warpgroups of the Hopper block that runs `p` on a device of compute capability
/// cc_major.cc_minor with `smem_optin` bytes of shared memory a block, 0 where none does: none for
/// backend "fa2" (p.prefill_fa2_only), else prefill::prefill_sm90_warpgroups on the call's fields
/// (an sm_90 device; a largest work item of more than 64 packed rows for two warpgroups, 17 to 64
/// for one; head dims 64 / 128, and 256 and 192 / 128 for two; fp16 / bf16 q and output with K/V
/// of q's dtype or fp8 (equal dims); plain or soft-capped, or multi-item scoring's rows at head dim
/// 128 with 16-bit K/V (kSm90MultiItem); a scale that folds into the exponent).
/// Plain C++, so that the CPU tests check the launcher's own rule
/// (tests/api/test_prefill_sm90_shape.cpp).
inline int prefill_sm90_block_warpgroups(const AttentionParams& p, int cc_major, int cc_minor,
                                         long long smem_optin) {
  namespace pf = prefill;
  if (p.prefill_fa2_only || p.num_kv_heads <= 0) return 0;
  const bool multi_item = p.multi_item_rows != nullptr;
  const bool kv_ok = prefill_sm90_dtypes_fit(p.q_dtype, p.kv.dtype, p.o_dtype, p.head_dim_qk,
                                             p.head_dim_vo, multi_item);
  const int variant = pf::prefill_sm90_variant(p.logits_soft_cap > 0.0f, p.custom_mask != nullptr,
                                               multi_item, p.alibi_slopes != nullptr);
  const long long packed_rows =
      static_cast<long long>(p.max_work_rows) * (p.num_qo_heads / p.num_kv_heads);
  return pf::prefill_sm90_warpgroups(
      cc_major, cc_minor, packed_rows, p.head_dim_qk, p.head_dim_vo, kv_ok, variant,
      pf::prefill_scale_folds(p.sm_scale, p.scale_q != nullptr, p.scale_k != nullptr), smem_optin);
}

/// FLASHINFER_PREFILL_SM90=0: every call on the FA2 kernel. Read at each call, by the launcher and
/// by the planner (attention_common.cpp: the FA2 kernel's plans too), so that one GPU times or
/// checks one kernel against the other like with like.
inline bool prefill_sm90_off_by_env() {
  return detail::env_switch_is("FLASHINFER_PREFILL_SM90", "0");
}

/// FLASHINFER_PREFILL_SM90_PINGPONG=1: the ping-pong schedule where it has an instance (opt-in
/// until a GPU has run and timed it against the plain one; read at each call).
inline bool prefill_sm90_ping_pong_by_env() {
  return detail::env_switch_is("FLASHINFER_PREFILL_SM90_PINGPONG", "1");
}

/// FLASHINFER_PREFILL_SM90_WS=1: the warp-specialized form (a producer warpgroup and mbarriers:
/// prefill_sm90_shape.h) where it has an instance (opt-in until a GPU has run and timed it against
/// the plain one; read at each call).
inline bool prefill_sm90_ws_by_env() {
  return detail::env_switch_is("FLASHINFER_PREFILL_SM90_WS", "1");
}

/// Whether a call that runs in tall Hopper blocks (prefill_sm90_block_warpgroups == 2) runs the
/// warp-specialized form: asked for (prefill_sm90_ws_by_env), not multi-item scoring (whose
/// instances are the plain schedule's), an instance for its head dims and K/V, and its shared
/// memory within the device's opt-in limit. The same bits as the other forms.
inline bool prefill_sm90_ws_takes(const AttentionParams& p, long long smem_optin) {
  return prefill_sm90_ws_by_env() && p.multi_item_rows == nullptr &&
         prefill::prefill_sm90_ws_built(p.head_dim_qk, p.head_dim_vo, dtype_is_fp8(p.kv.dtype),
                                        2) &&
         smem_optin >= static_cast<long long>(
                           prefill::prefill_sm90_ws_smem_bytes(p.head_dim_qk, p.head_dim_vo));
}

/// FLASHINFER_PREFILL_SM90_OVERLAP=1: the overlapped form (the warp-specialized form whose math
/// warpgroups run a tile's softmax under the tensor cores' next S and previous P V products:
/// prefill_sm90_shape.h) where it has an instance (opt-in until a GPU has run and timed it; read at
/// each call). With FLASHINFER_PREFILL_SM90_PINGPONG=1 also, its ping-pong instance.
inline bool prefill_sm90_overlap_by_env() {
  return detail::env_switch_is("FLASHINFER_PREFILL_SM90_OVERLAP", "1");
}

/// Whether a call that runs in tall Hopper blocks runs the overlapped form: asked for
/// (prefill_sm90_overlap_by_env), not multi-item scoring, an instance for its head dims and K/V,
/// not soft-capped (the soft-capped calls keep the other forms: no instance, to spare the build),
/// and its shared memory within the device's opt-in limit. Its tiles are 64 keys, so its bits are
/// those of the online softmax at that width, not the other forms' (128 keys at these head dims).
inline bool prefill_sm90_overlap_takes(const AttentionParams& p, long long smem_optin) {
  return prefill_sm90_overlap_by_env() && p.multi_item_rows == nullptr &&
         prefill::prefill_sm90_overlap_built(p.head_dim_qk, p.head_dim_vo, dtype_is_fp8(p.kv.dtype),
                                             2) &&
         !(p.logits_soft_cap > 0.0f) &&
         smem_optin >= static_cast<long long>(prefill::prefill_sm90_ws_smem_bytes(
                           p.head_dim_qk, p.head_dim_vo, /*overlap=*/true));
}

/// Runs `p` on `stream` (a cudaStream_t) on the Hopper kernel and returns true, or returns false,
/// having run nothing, when prefill_sm90_block_warpgroups says none or FLASHINFER_PREFILL_SM90=0 is
/// set (read at each call, to time or check it against the FA2 kernel on one GPU; the planner reads
/// it too). The caller then runs the FA2 kernel. kCuda Error when the launch fails.
bool prefill_sm90(const AttentionParams& p, void* stream, bool enable_pdl);

/// Calls prefill_sm90 has launched in this process (so that the tests can tell which kernel ran).
uint64_t prefill_sm90_launches();
/// Of those, the calls that ran in one-warpgroup blocks.
uint64_t prefill_sm90_small_launches();
/// Of those, the calls that ran the ping-pong schedule (FLASHINFER_PREFILL_SM90_PINGPONG=1: the
/// two warpgroups take turns at the tensor cores; the same bits as the plain schedule).
uint64_t prefill_sm90_ping_pong_launches();
/// Of the tall blocks' calls, those that ran the warp-specialized form
/// (FLASHINFER_PREFILL_SM90_WS=1).
uint64_t prefill_sm90_ws_launches();
/// Of those, the calls that ran the overlapped form (FLASHINFER_PREFILL_SM90_OVERLAP=1).
uint64_t prefill_sm90_overlap_launches();
/// Of all, the calls of multi-item scoring (AttentionParams::multi_item_rows: the kMultiItem
/// instances, plain schedule, whatever the switches above ask).
uint64_t prefill_sm90_multi_item_launches();

}  // namespace flashinfer::kernels::cuda
