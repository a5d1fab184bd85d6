// The chunked gated-delta-rule prefill kernel's host-checkable decisions (gdn_chunk_cuda.cu):
// its shared-memory layout, the lanes' ldmatrix addresses and accumulator coordinates of its
// m16n8k16 tiles, and which calls it takes. Plain C++ (FLASHINFER_HD): the kernel uses these on
// the device, tests/api/test_gdn_chunk_shape.cpp runs them through the emulated ldmatrix /
// mma.sync (tests/util/mma_emulation.h) on the CPU.
//
// A block owns one (sequence, state head, slice of 64 state rows v): 4 warps, warp w the rows
// 16w..16w+15 of the slice and all K columns, as fp32 accumulator tiles carried across the
// sequence's chunks. 16-bit tiles are row-major with rows padded by 8 elements (16 bytes), so the
// 8 row addresses of an ldmatrix fall in 8 different 16-byte bank groups.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/env_switch.h"
#include "kernels/cuda/device/host_device.h"
#include "kernels/gdn_chunk_rules.h"
#include "kernels/gdn_params.h"

namespace flashinfer::kernels::cuda::gdn_chunk {

using kernels::gdn_chunk::kChunk;

inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kSlice = kWarps * 16;   // state rows (v) a block
inline constexpr int kPad = 8;               // 16-bit elements of padding a row
inline constexpr int kFloatLd = kChunk + 4;  // fp32 64 x 64 tiles (L, X): rows 4 banks apart

/// Leading dimension (elements) of a 16-bit tile with `cols` columns.
FLASHINFER_HD constexpr int io_ld(int cols) { return cols + kPad; }

/// Byte offsets of the kernel's shared memory for head dim kd (K = V = kd) and `stages` copy
/// stages (1 or 2): per stage, the Q and K chunk tiles [64][kd], the V slice [64 tokens][64]
/// (then the output's staging) and the chunk's raw gates (alpha, beta: 64 fp32 each), the stages
/// `stage` bytes apart from q on; then the masked scaled Q K^T (M') and T = (I + L)^-1 diag(beta)
/// [64][64] in the io dtype; L and X = (I + L)^-1 in fp32; the merges' W (3 blocks of 16 x 16
/// fp32) in T's place (T is written after the last merge); per token: G (fp32 log sums), the
/// packed gate counts, beta, gamma_t (the decay from the chunk's entry) and Gamma_{C-1,t} (to
/// its end; 0 past C).
struct Layout {
  uint32_t q, k, v, alpha_raw, beta_raw, stage, m, t, l, x, w, g, counts, beta, gamma, tail, bytes;
};
FLASHINFER_HD constexpr Layout layout(int kd, int stages = 1) {
  const uint32_t qk = kChunk * io_ld(kd) * 2, sq = kChunk * io_ld(kChunk) * 2;
  const uint32_t f = kChunk * kFloatLd * 4, vec = kChunk * 4;
  Layout s{};
  s.q = 0;
  s.k = s.q + qk;
  s.v = s.k + qk;
  s.alpha_raw = s.v + sq;
  s.beta_raw = s.alpha_raw + vec;
  s.stage = s.beta_raw + vec;
  s.m = s.stage * static_cast<uint32_t>(stages);
  s.t = s.m + sq;
  s.l = s.t + sq;
  s.x = s.l + f;
  s.w = s.t;
  s.g = s.x + f;
  s.counts = s.g + vec;
  s.beta = s.counts + vec;
  s.gamma = s.beta + vec;
  s.tail = s.gamma + vec;
  s.bytes = s.tail + vec;
  return s;
}

/// Copy stages for a launch of `blocks` blocks on `sms` SMs: 2 (the next chunk's copies under
/// this chunk's products) where every block has an SM of its own (two stages leave room for one
/// block an SM) and the device gives a block that much shared memory, else 1 (two blocks an SM
/// on sm_90 overlap one's copies with the other's products).
FLASHINFER_HD constexpr int stages_for(int kd, long long blocks, int sms, long long smem_optin) {
  return blocks <= sms && smem_optin >= static_cast<long long>(layout(kd, 2).bytes) ? 2 : 1;
}

/// FLASHINFER_GDN_CHUNK_STAGES=1 or 2: that many copy stages whatever the grid (2 only where the
/// shared memory allows), so that one GPU can compare the two forms bit for bit (the same
/// arithmetic) and time them; 0 otherwise.
inline int stages_by_env() {
  const char* e = std::getenv("FLASHINFER_GDN_CHUNK_STAGES");
  if (e == nullptr) return 0;
  const std::string_view v(e);
  return v == "1" ? 1 : v == "2" ? 2 : 0;
}

// ---- fragments (PTX ISA layouts of mma.m16n8k16 and ldmatrix.x4) -----------------------------

/// (row, col) within a 16 x 16 tile whose address lane `lane` gives to ldmatrix_x4 for an A
/// operand stored row-major [m][k]: matrices 0..3 = (m 0-7, k 0-7), (m 8-15, k 0-7),
/// (m 0-7, k 8-15), (m 8-15, k 8-15), i.e. a0..a3.
FLASHINFER_HD constexpr int a_row(int lane) { return (lane & 7) + 8 * ((lane >> 3) & 1); }
FLASHINFER_HD constexpr int a_col(int lane) { return 8 * (lane >> 4); }

/// The B operands of two n-tiles (16 n) stored [n][k] (Q K^T's K): matrices = b0, b1 of n-tile
/// 0, then b0, b1 of n-tile 1. Row = n, col = k.
FLASHINFER_HD constexpr int b_row(int lane) { return (lane & 7) + 8 * (lane >> 4); }
FLASHINFER_HD constexpr int b_col(int lane) { return 8 * ((lane >> 3) & 1); }

/// The same B operands stored [k][n], loaded with ldmatrix .trans (the state update's K). Row =
/// k, col = n.
FLASHINFER_HD constexpr int bt_row(int lane) { return (lane & 7) + 8 * ((lane >> 3) & 1); }
FLASHINFER_HD constexpr int bt_col(int lane) { return 8 * (lane >> 4); }

/// An A operand stored [k][m], loaded with ldmatrix .trans (V^T from the V slice [t][v]). Row =
/// k, col = m.
FLASHINFER_HD constexpr int at_row(int lane) { return (lane & 7) + 8 * (lane >> 4); }
FLASHINFER_HD constexpr int at_col(int lane) { return 8 * ((lane >> 3) & 1); }

/// Accumulator element e (0..3) of a 16 x 8 tile: row g or g + 8, column 2 (lane % 4) + e % 2.
FLASHINFER_HD constexpr int acc_row(int lane, int e) { return (lane >> 2) + 8 * (e >> 1); }
FLASHINFER_HD constexpr int acc_col(int lane, int e) { return 2 * (lane & 3) + (e & 1); }

/// Register i (0..3) of the A operand of k-step ks built from accumulator tiles along the same
/// dimension (the next product's k): the pair of elements (e0, e0 + 1) of n-tile `acc_tile`.
FLASHINFER_HD constexpr int a_from_acc_tile(int ks, int i) { return 2 * ks + (i >> 1); }
FLASHINFER_HD constexpr int a_from_acc_elem(int i) { return 2 * (i & 1); }

// ---- which calls ---------------------------------------------------------------------------

/// FLASHINFER_GDN_CHUNKED=0: every chunk_gated_delta_rule call on the recurrent kernel. Read at
/// each call, so that one GPU can time or check one kernel against the other.
inline bool chunked_off_by_env() { return detail::env_switch_is("FLASHINFER_GDN_CHUNKED", "0"); }

inline bool aligned16(const void* ptr, int64_t a, int64_t b, std::size_t elem) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && (a * static_cast<int64_t>(elem)) % 16 == 0 &&
         (b * static_cast<int64_t>(elem)) % 16 == 0;
}

/// Why the chunked kernel does not take a gated-delta-rule call (nullptr: it does). It takes the
/// prefill (chunk_gated_delta_rule: gates g / beta, scale on the output, no per-step states) at
/// K = V = 64 or 128, fp16 / bf16 in and out, fp32 states, 16-byte aligned q / k / v / output
/// rows (cp.async and 16-byte stores) and 8-byte aligned checkpoints, on sm_80+ with room for
/// its shared memory.
inline const char* chunked_refusal(const GdnParams& p, int cc_major, long long smem_optin) {
  if (p.decode_gates || p.l2norm || !p.scale_output || p.out_via_bf16 || p.cu_seqlens == nullptr) {
    return "not a prefill call";
  }
  if (p.intermediates != GdnIntermediates::kNone) return "per-step states";
  if (p.negative_read != GdnNegativeRead::kInvalid &&
      p.negative_read != GdnNegativeRead::kZeroState) {
    return "not a prefill call";
  }
  // Checkpoints land at chunk ends in dense rows start + j; absolute positions (a prefix not a
  // multiple of 64 moves them inside a chunk) and pool rows take the recurrent kernel.
  if (p.checkpoint_every > 0 && (p.checkpoint_prefix != nullptr || p.checkpoint_slots != nullptr ||
                                 p.checkpoint_row_stride != p.H * p.V * p.K)) {
    return "checkpoints at absolute positions or in pool rows";
  }
  if (p.K != p.V || (p.K != 64 && p.K != 128)) return "head dim other than 64 or 128";
  if ((p.io_dtype != DType::kFloat16 && p.io_dtype != DType::kBFloat16) ||
      p.out_dtype != p.io_dtype) {
    return "dtype";
  }
  if ((p.state_in.data && p.state_in.dtype != DType::kFloat32) ||
      (p.state_out.data && p.state_out.dtype != DType::kFloat32)) {
    return "state dtype";
  }
  if ((p.g.data && p.g.dtype != DType::kFloat32) ||
      (p.beta.data && p.beta.dtype != DType::kFloat32)) {
    return "gate dtype";
  }
  if (!aligned16(p.q, p.q_stride_tok, p.q_stride_head, 2) ||
      !aligned16(p.k, p.k_stride_tok, p.k_stride_head, 2) ||
      !aligned16(p.v, p.v_stride_tok, p.v_stride_head, 2) ||
      !aligned16(p.out, p.out_stride_tok, p.out_stride_head, 2)) {
    return "rows not 16-byte aligned";
  }
  if (p.checkpoint_every > 0 && reinterpret_cast<uintptr_t>(p.checkpoints) % 8 != 0) {
    return "checkpoints not 8-byte aligned";  // stored as float2
  }
  if (cc_major < 8) return "below sm_80 (mma.sync, ldmatrix, cp.async)";
  if (smem_optin < static_cast<long long>(layout(static_cast<int>(p.K)).bytes)) {
    return "shared memory";
  }
  if (chunked_off_by_env()) return "FLASHINFER_GDN_CHUNKED=0";
  return nullptr;
}

}  // namespace flashinfer::kernels::cuda::gdn_chunk
