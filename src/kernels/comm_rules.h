// Private: the arithmetic of allreduce_fusion's epilogue that the CPU reference
// (src/kernels/cpu/comm_cpu.cpp) and the CUDA kernel (src/kernels/cuda/comm_cuda.cu) share,
// each fp32 step rounded once (kernels/fp32_rules.h). Unit-tested on the CPU
// (tests/ops/test_comm.cpp, CommRules.*). docs/COMM.md.
#pragma once

#include <cstdint>

#include "flashinfer/float_formats.h"
#include "kernels/fp32_rules.h"
#include "kernels/nvfp4_rules.h"

namespace flashinfer::kernels {

/// The patterns' stages (upstream's FusionPatternTraits).
struct ArPattern {
  bool allreduce_out, residual, norm_out;
  int quant;  // 0 none, 1 FP8 static, 2 NVFP4, 3 FP8 per token-group, 4 FP8 per token
};
FLASHINFER_HD ArPattern ar_pattern(int p) {
  switch (p) {
    case 0:
      return {true, false, false, 0};
    case 1:
      return {false, true, true, 0};
    case 2:
      return {false, true, false, 1};
    case 3:
      return {false, true, false, 2};
    case 4:
      return {false, true, true, 1};
    case 5:
      return {false, true, true, 2};
    case 8:
      return {false, true, false, 3};
    case 9:
      return {false, true, true, 3};
    case 10:
      return {false, true, false, 4};
    default:  // 11
      return {false, true, true, 4};
  }
}

/// A rank's input value as the sum reads it: the one-shot path turns -0 into +0 (upstream's -0
/// marks a value not yet arrived).
FLASHINFER_HD float ar_input(float v, bool oneshot) {
  return oneshot && f32_to_bits(v) == 0x80000000u ? 0.0f : v;
}

/// The sum over the ranks of one element: load(k) is rank k's value, round(v) rounds to the
/// dtype. Rank order, each partial sum rounded (fp32_acc: one fp32 sum, rounded by the caller);
/// island8 (8 ranks, PcieIpcAllReduceWorkspace's island kernels): ((v0+v1)+(v2+v3)) +
/// ((v4+v5)+(v6+v7)), each sum rounded.
template <class Load, class Round>
FLASHINFER_HD float ar_rank_sum(int world_size, bool fp32_acc, bool island8, bool oneshot,
                                const Load& load, const Round& round) {
  if (island8) {
    auto add = [&](float a, float b) { return round(fp32_add(a, b)); };
    auto in = [&](int k) { return ar_input(load(k), oneshot); };
    return add(add(add(in(0), in(1)), add(in(2), in(3))),
               add(add(in(4), in(5)), add(in(6), in(7))));
  }
  float s = ar_input(load(0), oneshot);
  for (int k = 1; k < world_size; ++k) {
    s = fp32_add(s, ar_input(load(k), oneshot));
    if (!fp32_acc) s = round(s);
  }
  return round(s);
}

// ---- allreduce_fusion's MoE patterns (TRT-LLM workspace): each rank's local value before the
// rank sum, every step rounded to the dtype as upstream's kernels (16-bit adds and products).

/// Pattern 6 (kMoEReductionARResidualRMSNorm), element (t, h): a = +0; per expert e in order,
/// a = T(a + T(active[e, t, h] * scale[e * Tk + t])) (scale fp32, expert-major); then
/// a = T(a + token_input[t, h]). active(e) and token() load fp32 values, round rounds to T.
template <class Active, class Scale, class Token, class Round>
FLASHINFER_HD float ar_moe_reduction_value(int64_t experts, const Active& active,
                                           const Scale& scale, const Token& token,
                                           const Round& round) {
  float a = 0.0f;
  for (int64_t e = 0; e < experts; ++e) {
    a = round(fp32_add(a, round(fp32_mul(active(e), scale(e)))));
  }
  return round(fp32_add(a, token()));
}

/// Pattern 7 (kMoEFinalizeARResidualRMSNorm), element (t, h): a = +0; per slot k in order whose
/// index is not -1, a = T(a + T(input[idx, h] * scale[t, k])) (a = T(a + input[idx, h]) without
/// scales); then a = T(a + shared[t, h]) when there is a shared expert output. An index that is
/// neither -1 nor one of input's `rows` is never read: the value is NaN (the API refuses such
/// indices by name except while a CUDA graph is captured, when it cannot read them back).
template <class Index, class Input, class Scale, class Shared, class Round>
FLASHINFER_HD float ar_moe_finalize_value(int64_t top_k, int64_t rows, bool has_scale,
                                          bool has_shared, const Index& index, const Input& input,
                                          const Scale& scale, const Shared& shared,
                                          const Round& round) {
  float a = 0.0f;
  for (int64_t k = 0; k < top_k; ++k) {
    const int64_t j = index(k);
    if (j == -1) continue;
    if (j < 0 || j >= rows) return f32_from_bits(0x7FC00000u);
    const float v = has_scale ? round(fp32_mul(input(j), scale(k))) : input(j);
    a = round(fp32_add(a, v));
  }
  return has_shared ? round(fp32_add(a, shared())) : a;
}

/// The CUDA kernel's threads per block (one block a row at a time): the order of the norm's sum
/// of squares below depends on it.
inline constexpr int kArThreads = 512;

/// The norm's sum of squares of one row in the CUDA kernel's order, for the CPU reference:
/// step(acc, j) adds term j to a partial sum. Thread i of the block adds terms i, i + 512, ...
/// in order from +0, then block_reduce_sum (kernels/cuda/device_utils.cuh): in each warp the
/// xor butterfly (lane i += lane i ^ o, o = 16 .. 1; lane 0's result), then warp 0 the same over
/// the 16 warps' sums padded with +0. A sequential sum differs in the last place of the fp32 sum
/// for most rows, which the fp32 per-token scale of MNNVL two-shot (patterns 10 / 11) shows.
/// Host only (a block's partial sums on the stack).
template <class Step>
float ar_square_sum(int64_t n, const Step& step) {
  constexpr int kWarps = kArThreads / 32;
  auto butterfly = [](float* a) {
    for (int o = 16; o > 0; o >>= 1) {
      for (int i = 0; i < o; ++i) a[i] = fp32_add(a[i], a[i + o]);
    }
    return a[0];
  };
  float warp_sum[32] = {};  // warps past kWarps: warp 0's +0 padding
  for (int w = 0; w < kWarps; ++w) {
    float lane[32];
    for (int l = 0; l < 32; ++l) {
      float acc = 0.0f;
      for (int64_t j = w * 32 + l; j < n; j += kArThreads) acc = step(acc, j);
      lane[l] = acc;
    }
    warp_sum[w] = butterfly(lane);
  }
  return butterfly(warp_sum);
}

// ---- MNNVL (MNNVLAllReduceFusionWorkspace): upstream's trtllm_mnnvl_allreduce kernels, built
// with -use_fast_math (fp32 subnormals flushed to sign-preserving zero in the sum).

/// An fp32 value as an FTZ instruction reads or writes it.
FLASHINFER_HD float mnnvl_ftz(float v) {
  const uint32_t b = f32_to_bits(v);
  return (b & 0x7F800000u) == 0 ? f32_from_bits(b & 0x80000000u) : v;
}

/// The sum over the ranks of one element (load(k): rank k's value as fp32, round(v): to the
/// dtype). Every -0 input is +0 (upstream's -0 marks an empty slot); one fp32 sum from 0 in rank
/// order, in chunks (one-shot: 8 ranks above 8, two-shot: 16) whose sums are added in order;
/// rounded once; the two-shot owner turns a -0 result into +0 (a one-shot -0 comes only from a
/// negative sum flushed or rounded to zero).
template <class Load, class Round>
FLASHINFER_HD float mnnvl_rank_sum(int world_size, bool oneshot, const Load& load,
                                   const Round& round) {
  const int chunk =
      oneshot ? (world_size > 8 ? 8 : world_size) : (world_size > 16 ? 16 : world_size);
  float total = 0.0f;
  for (int c = 0; c < world_size; c += chunk) {
    float s = 0.0f;
    for (int k = c; k < c + chunk && k < world_size; ++k) {
      s = mnnvl_ftz(fp32_add(s, mnnvl_ftz(ar_input(load(k), true))));
    }
    total = c == 0 ? s : mnnvl_ftz(fp32_add(total, s));
  }
  const float v = round(total);
  return !oneshot && f32_to_bits(v) == 0x80000000u ? 0.0f : v;
}

/// One term of the norm's sum of squares: one-shot rounds the square to the dtype first.
template <class Round>
FLASHINFER_HD float mnnvl_square(float r, bool oneshot, const Round& round) {
  const float sq = mnnvl_ftz(fp32_mul(r, r));
  return oneshot ? round(sq) : sq;
}

/// The norm before its rounding to the dtype: one-shot (r * inv) * (wb + g), two-shot
/// ((wb + g) * r) * inv.
FLASHINFER_HD float mnnvl_norm(float r, float inv, float g, float wb, bool oneshot) {
  const float w = fp32_add(wb, g);
  return oneshot ? fp32_mul(fp32_mul(r, inv), w) : fp32_mul(fp32_mul(w, r), inv);
}

/// FP8 e4m3 with a static dequant scale: sat(y * (1 / scale)).
FLASHINFER_HD uint8_t ar_fp8_static(float y, float scale) {
  return float_to_e4m3fn_bits(fp32_mul(y, fp32_div(1.0f, scale)), true);
}

/// sat(clamp(y / s)) for the dynamic and group scales.
FLASHINFER_HD uint8_t ar_fp8_scaled(float y, float s) {
  float q = fp32_div(y, s);
  q = q > 448.0f ? 448.0f : q < -448.0f ? -448.0f : q;
  return float_to_e4m3fn_bits(q, true);
}

/// Patterns 10 / 11: the token's scale max(amax / 448, 2^-9 / 448).
FLASHINFER_HD float ar_token_scale(float amax) {
  const float s = fp32_div(amax, 448.0f);
  const float lo = fp32_div(0.001953125f, 448.0f);
  return s > lo ? s : lo;
}

/// Patterns 8 / 9: max(amax / 448, 1e-10) rounded up to a power of two (UE8M0); the code is its
/// exponent byte.
FLASHINFER_HD float ar_group_scale(float amax, uint8_t* code) {
  float s = fp32_div(amax, 448.0f);
  s = s > 1e-10f ? s : 1e-10f;
  uint32_t b = f32_to_bits(s);
  if ((b & 0x7FFFFFu) != 0) b = (b & 0xFF800000u) + 0x800000u;
  *code = static_cast<uint8_t>(b >> 23);
  return f32_from_bits(b);
}

/// Patterns 3 / 5: one NVFP4 block of 16 values with the global scale gs (multiplied):
/// sf = e4m3_sat(gs * (amax * (1/6))), q_i = e2m1(v_i * (1 / (sf * (1 / gs)))), zero codes for
/// a zero scale.
FLASHINFER_HD Nvfp4Block ar_nvfp4_block(const float* v, float gs) {
  Nvfp4Block b;
  const float amax = nvfp4_block_amax(v);
  b.sf = float_to_e4m3fn_bits(fp32_mul(gs, fp32_mul(amax, fp32_div(1.0f, 6.0f))), true);
  const float sf = e4m3_code_to_float(b.sf);
  const float os = sf != 0.0f ? fp32_div(1.0f, fp32_mul(sf, fp32_div(1.0f, gs))) : 0.0f;
  FLASHINFER_UNROLL
  for (int t = 0; t < kNvfp4Block / 2; ++t) {
    const uint8_t lo = float_to_e2m1_bits(fp32_mul(v[2 * t], os));
    const uint8_t hi = float_to_e2m1_bits(fp32_mul(v[2 * t + 1], os));
    b.packed |= static_cast<uint64_t>(pack_e2m1x2(lo, hi)) << (8 * t);
  }
  return b;
}

/// Patterns 8 / 9: the int32 word of scale_out holding group g's exponent byte of token t
/// (strides (1, round_up(T, 4)) over [T, ceil(G / 4)]), and the byte within it.
FLASHINFER_HD int64_t ar_group_scale_word(int64_t t, int64_t g, int64_t t_stride) {
  return (g / 4) * t_stride + t;
}

}  // namespace flashinfer::kernels
