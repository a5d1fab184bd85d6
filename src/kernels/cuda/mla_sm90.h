// The Hopper MLA decode kernel (mla_sm90_kernel.cuh: wgmma through CuTe, sm_90a) as a path of
// mla_attention, beside mla_decode_mma_kernel (mma.sync): built only when CMake finds CUTLASS's
// headers (FLASHINFER_WITH_CUTLASS=1). Plain C++ header: the launcher's rule, the shared memory
// and the switch, checked on the CPU (tests/api/test_mla_sm90_shape.cpp).
//
// The same blocks as mla_decode_mma_kernel (one query row and 64 of its heads, or the packed rows
// of calls of 32 heads or fewer; 32-token tiles; its split plan, partial states and merge), with
// the two warpgroups in place of its 8 warps: each takes all 64 rows with one m64 wgmma, half of
// q.k's 36 k-steps (warpgroup wg: the ckv steps 16 wg .. 16 wg + 15 and the kpe steps 32 + 2 wg,
// 33 + 2 wg) and half of the 512 output dims. The mma.sync kernel's warps each read their 16 rows'
// operands from shared memory, so a tile's K and V were read four times; an m64 wgmma reads them
// once a warpgroup.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <string_view>

#include "core/env_switch.h"
#include "kernels/cuda/mla_shape.h"
#include "kernels/mla_params.h"

namespace flashinfer::kernels::cuda::mla {

constexpr int kSm90MlaWarpgroups = 2;  // the two halves of the dims, over the same 64 rows
constexpr int kSm90MlaThreads = 128 * kSm90MlaWarpgroups;
constexpr int kSm90MlaStages = 3;
constexpr int kSm90MlaHalf = kMmaCkv / kSm90MlaWarpgroups;  // output dims of a warpgroup: 256
constexpr int kSm90MlaSmemAlign = 1024;  // the 128-byte swizzle's period, from its base
static_assert(kSm90MlaThreads == kMmaThreads, "mla_decode_mma_kernel's tile copies");

/// Bytes of a block's dynamic shared memory: Q (64 x 576, 16-bit), the stages (32 x 576 each:
/// the 16-bit tiles the MMAs read, or for an fp8 cache the tiles as stored and one 16-bit tile
/// each is widened into), the score exchange (16 floats a thread), the tile's ckv / kpe row
/// addresses, and the slack that aligns the tiles to the swizzle's period.
constexpr std::size_t mla_sm90_smem_bytes(bool fp8 = false) {
  const std::size_t tile16 = std::size_t{2} * kMmaKvTile * kMmaDim;
  const std::size_t kv = fp8 ? tile16 + kSm90MlaStages * tile16 / 2 : kSm90MlaStages * tile16;
  return std::size_t{2} * kMmaRows * kMmaDim + kv +
         std::size_t{4} * kSm90MlaThreads * kMmaScoreFloats + std::size_t{2} * 8 * kMmaKvTile +
         kSm90MlaSmemAlign;
}

/// FLASHINFER_MLA_SM90=1: the Hopper kernel where it has an instance (opt-in until a GPU has run
/// it against mla_decode_mma_kernel; read at each call).
inline bool mla_sm90_by_env() { return detail::env_switch_is("FLASHINFER_MLA_SM90", "1"); }

/// Whether the Hopper kernel takes a call that mla_decode_mma_kernel takes (the caller checked
/// that: DeepSeek's dims, 16-byte rows): `enabled` (mla_sm90_by_env), a device of compute
/// capability 9.0 (sm_90a code), a kpe part and one ckv scale (NoPE calls, head_dim_kpe 0, and
/// calls with ckv_scale_arr stay on the mma.sync kernel), and that kernel's dtypes (mla_mma_dtypes:
/// a 16-bit query and output of one dtype with a cache of it or fp8, or trtllm's e4m3 query and
/// cache with a bf16 output).
inline bool mla_sm90_takes(const MlaAttentionParams& p, int cc_major, int cc_minor, bool enabled) {
  return enabled && cc_major == 9 && cc_minor == 0 && p.dim_kpe == kMmaKpe &&
         p.ckv_scale_arr == nullptr && mla_mma_dtypes(p.q_dtype, p.kv_dtype, p.o_dtype);
}

/// Whether this build has the kernel (CUTLASS's headers found).
bool mla_sm90_built();

/// Launches mla_sm90_kernel on `grid` (mla_decode_mma_kernel's) with mla_sm90_smem_bytes() for
/// the call's cache; returns the launch's error. Only where mla_sm90_built().
int launch_mla_sm90(const MlaAttentionParams& p, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                    uint32_t page_size, int32_t chunk, float* part_o, float* part_ml, void* stream,
                    bool enable_pdl);

/// How many times launch_mla_sm90 launched in this process (tests assert which kernel ran).
long long mla_sm90_launches();

}  // namespace flashinfer::kernels::cuda::mla
