// Private: MonoMoE (flashinfer.fused_moe.monomoe.mono_moe), the decode-size block-FP8 top-k MoE
// hard-specialized to E 256 experts, N 512 (the intermediate's half), K 2048 (hidden), 1-8
// tokens. What the CPU reference (src/kernels/cpu/monomoe_cpu.cpp) and the CUDA kernels
// (src/kernels/cuda/monomoe_cuda.cu) share, so that both round every step alike: each fp32
// operation rounded once (kernels/fp32_rules.h), every fp8 x fp8 block dot product exact (an
// integer sum, rounded to fp32 once), and one fixed summation order where upstream's kernel adds
// with atomics. docs/MOE.md ("MonoMoE") gives the math; docs/upstream-facts/monomoe.md the facts.
#pragma once

#include <cstdint>

#include "kernels/fp32_rules.h"

namespace flashinfer::kernels {

struct MonoMoeParams {
  static constexpr int64_t kE = 256, kN = 512, kK = 2048;
  static constexpr int64_t kMaxTokens = 8, kMaxTopK = 8;
  static constexpr int64_t kBlock = 128;    // weight scale blocks, the input's 1 x 128 groups
  static constexpr int64_t kActGroup = 64;  // the intermediate's re-quantization groups
  static constexpr int64_t kKBlocks = kK / kBlock;     // 16: scales_up [E, 2N / 128, 16]
  static constexpr int64_t kNBlocks = kN / kBlock;     // 4: scales_down [E, K / 128, 4]
  static constexpr int64_t kNGroups = kN / kActGroup;  // 8 intermediate scales a routed pair
  static constexpr int64_t kCombineGroups = 16;        // the experts' sum: groups by index % 16

  int64_t M = 0, top_k = 0;
  bool softmax = true;  // else sigmoid scoring
  bool renormalize = true;
  bool up_interleaved = false;  // expert_weights_up rows in the pair layout (interleave_up=False)
  const uint16_t* x = nullptr;  // activations_in [M, K] bf16
  const uint16_t* logits = nullptr;  // router_logits [M, E] bf16
  const uint8_t* w_up = nullptr;     // [E, 2N, K] e4m3: rows [0, N) gate, [N, 2N) up
  const float* s_up = nullptr;       // [E, 2N / 128, K / 128], the original row order
  const uint8_t* w_down = nullptr;   // [E, K, N] e4m3
  const float* s_down = nullptr;     // [E, K / 128, N / 128]
  uint16_t* out = nullptr;           // [M, K] bf16
  uint8_t* scratch = nullptr;        // CUDA: the scratchpad, at least kScratchBytes
};

// The CUDA kernels' use of the caller's scratchpad (upstream's alloc_scratchpad size, 123968
// bytes, is larger; every byte read is written first in the same call).
struct MonoMoeScratch {
  static constexpr int64_t kQx = 0;  // u8 [8][K]: the quantized input
  static constexpr int64_t kXs =
      kQx + MonoMoeParams::kMaxTokens * MonoMoeParams::kK;  // f32 [8][16]
  static constexpr int64_t kIds = kXs + MonoMoeParams::kMaxTokens * MonoMoeParams::kKBlocks * 4;
  static constexpr int64_t kRw = kIds + MonoMoeParams::kMaxTokens * MonoMoeParams::kMaxTopK * 4;
  static constexpr int64_t kActive = kRw + MonoMoeParams::kMaxTokens * MonoMoeParams::kMaxTopK * 4;
  static constexpr int64_t kCount = kActive + MonoMoeParams::kE * 4;  // i32, 16 bytes kept
  static constexpr int64_t kIq = kCount + 16;  // u8 [M * top_k][N]: the re-quantized intermediate
  static constexpr int64_t kIs =
      kIq + MonoMoeParams::kMaxTokens * MonoMoeParams::kMaxTopK * MonoMoeParams::kN;
  static constexpr int64_t kBytes =
      kIs + MonoMoeParams::kMaxTokens * MonoMoeParams::kMaxTopK * MonoMoeParams::kNGroups * 4;
};

/// upstream's get_scratchpad_size_bytes(): sizeof its kernel's MoEGemmSpec for this shape.
constexpr int64_t kMonoMoeUpstreamScratchBytes = 123968;
static_assert(MonoMoeScratch::kBytes <= kMonoMoeUpstreamScratchBytes);

inline constexpr float kMonoMoeInv448 = 1.0f / 448.0f;  // a constant rounded once, then multiplied
inline constexpr float kMonoMoeEps = 1e-10f;            // the amax floor of both quantizers
inline constexpr float kMonoMoeFltMin = 1.17549435e-38f;
inline constexpr float kMonoMoeDotUnit = 3.814697265625e-06f;  // 2^-18: one unit of a dot product

/// Row of expert_weights_up holding gate (h 0) or up (h 1) index j: the original order, or
/// interleave_for_tma_wgmma_up's pair layout (8-row chunks: gate[0:8], up[0:8], gate[8:16], ...).
FLASHINFER_HD int64_t monomoe_up_row(int64_t h, int64_t j, int64_t n_half, bool interleaved) {
  return interleaved ? 16 * (j / 8) + 8 * h + j % 8 : h * n_half + j;
}

/// An e4m3 code as an integer count of 2^-9 (exact: every e4m3 value is one; 448 is 229376).
/// NaN codes (S.1111.111) are the caller's to test (monomoe_e4m3_is_nan).
FLASHINFER_HD int32_t monomoe_e4m3_fixed(uint8_t c) {
  const int32_t e = (c >> 3) & 15, m = c & 7;
  const int32_t mag = e == 0 ? m : (8 + m) << (e - 1);
  return (c & 0x80) != 0 ? -mag : mag;
}
FLASHINFER_HD bool monomoe_e4m3_is_nan(uint8_t c) { return (c & 0x7F) == 0x7F; }

/// A block's dot product from its exact sum of fixed-point products (units of 2^-18; at most
/// 128 x 229376^2 < 2^43, so an int64 holds it), rounded to fp32 once; NaN if an operand was.
FLASHINFER_HD float monomoe_dot_to_f32(int64_t sum, bool nan) {
  if (nan) return f32_from_bits(0x7FC00000u);
#if defined(__CUDA_ARCH__)
  return fp32_mul(__ll2float_rn(sum), kMonoMoeDotUnit);
#else
  return fp32_mul(static_cast<float>(sum), kMonoMoeDotUnit);  // exact: a power of two
#endif
}

/// The quantizers' amax floor: max(amax, 1e-10).
FLASHINFER_HD float monomoe_amax_floor(float amax) {
  return amax < kMonoMoeEps ? kMonoMoeEps : amax;
}

/// A bf16 activation as the input quantizer reads it: NaN masked to 0 (inf is kept).
FLASHINFER_HD float monomoe_input_value(uint16_t bits) {
  const float v = f32_from_bits(static_cast<uint32_t>(bits) << 16);
  return v != v ? 0.0f : v;
}

/// A router logit as the routing reads it: NaN and +-inf become -FLT_MAX.
FLASHINFER_HD float monomoe_logit(uint16_t bits) {
  const uint32_t b = static_cast<uint32_t>(bits) << 16;
  return (b & 0x7F800000u) == 0x7F800000u ? -3.40282347e+38f : f32_from_bits(b);
}

/// up / gate accumulation over one 128-K block: acc + (chunk * w_scale) * a_scale.
FLASHINFER_HD float monomoe_up_step(float acc, float chunk, float ws, float as) {
  return fp32_add(acc, fp32_mul(fp32_mul(chunk, ws), as));
}

/// The intermediate of a routed pair: rw * up * gate / (1 + e^-gate), 0 where rw is 0.
FLASHINFER_HD float monomoe_silu_weighted(float rw, float gate, float up) {
  if (rw == 0.0f) return 0.0f;
  return fp32_div(fp32_mul(fp32_mul(rw, up), gate), fp32_add(1.0f, exp_f32(fp32_sub(0.0f, gate))));
}

/// The down projection's step over one 128-wide N block of output column c: the block's two
/// 64-wide halves, each with its intermediate scale: acc + ((lo * as_lo) * ws + (hi * as_hi) * ws).
FLASHINFER_HD float monomoe_down_step(float acc, float lo, float hi, float as_lo, float as_hi,
                                      float ws) {
  return fp32_add(acc,
                  fp32_add(fp32_mul(fp32_mul(lo, as_lo), ws), fp32_mul(fp32_mul(hi, as_hi), ws)));
}

/// A group's quantizer from its |max| m (after the floor): the stored scale m / 448 (as m times
/// the rounded 1/448) and the multiplier 448 / m.
FLASHINFER_HD float monomoe_group_scale(float m) { return fp32_mul(m, kMonoMoeInv448); }
FLASHINFER_HD float monomoe_group_mult(float m) { return fp32_div(448.0f, m); }
/// The intermediate's stored scale: at least FLT_MIN (0 marks "not written" upstream).
FLASHINFER_HD float monomoe_interm_scale(float m) {
  const float s = monomoe_group_scale(m);
  return s < kMonoMoeFltMin ? kMonoMoeFltMin : s;
}

/// fp32 -> bf16 bits, round to nearest even; every NaN 0x7FC0 (a NaN's sign differs between
/// the host, whose invalid operations give -NaN, and the device's canonical +NaN).
FLASHINFER_HD uint16_t monomoe_bf16_bits(float x) {
  const uint32_t b = f32_to_bits(x);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

/// One token's routing (upstream's moe_routing, one warp a token), from its E logits: top_k
/// distinct experts (greedy arg-max, ties to the lower index) and their weights. Softmax with
/// renormalize, or sigmoid: chosen on the raw logits; weights e^(x - x_max) or 1 / (1 + e^-x),
/// summed in choice order, times 1 / sum (sigmoid: only with renormalize; a sum of 0 keeps the
/// weights). Softmax without renormalize: the full softmax (the sum as 32 lanes add it: lane l
/// over l, l + 32, ..., then a butterfly), chosen on the probabilities. logit(i) reads one.
template <typename LogitFn>
FLASHINFER_HD void monomoe_route(LogitFn logit, int64_t top_k, bool softmax, bool renormalize,
                                 int32_t* ids, float* weights) {
  constexpr int kE = static_cast<int>(MonoMoeParams::kE);
  uint32_t taken[kE / 32] = {};
  const bool slow = softmax && !renormalize;
  float lane_sum[32];
  float vmax = -3.40282347e+38f, inv_all = 1.0f;
  if (slow) {
    for (int i = 0; i < kE; ++i) vmax = logit(i) > vmax ? logit(i) : vmax;
    for (int l = 0; l < 32; ++l) {
      float s = 0.0f;
      for (int i = l; i < kE; i += 32) s = fp32_add(s, exp_f32(fp32_sub(logit(i), vmax)));
      lane_sum[l] = s;
    }
    for (int off = 16; off >= 1; off /= 2) {
      float next[32];
      for (int l = 0; l < 32; ++l) next[l] = fp32_add(lane_sum[l], lane_sum[l ^ off]);
      for (int l = 0; l < 32; ++l) lane_sum[l] = next[l];
    }
    inv_all = fp32_div(1.0f, lane_sum[0]);
  }
  // The selection metric: the logit, or (slow path) the probability.
  auto metric = [&](int i) {
    return slow ? fp32_mul(exp_f32(fp32_sub(logit(i), vmax)), inv_all) : logit(i);
  };
  float x_max = 0.0f, sum = 0.0f;
  for (int64_t k = 0; k < top_k; ++k) {
    int best = -1;
    float bv = 0.0f;
    for (int i = 0; i < kE; ++i) {
      if ((taken[i / 32] >> (i % 32)) & 1u) continue;
      const float v = metric(i);
      if (best < 0 || v > bv) best = i, bv = v;
    }
    taken[best / 32] |= 1u << (best % 32);
    ids[k] = best;
    const float x = logit(best);
    float w;
    if (slow) {
      w = bv;
    } else if (softmax) {
      if (k == 0) x_max = x;
      w = exp_f32(fp32_sub(x, x_max));
    } else {
      w = fp32_div(1.0f, fp32_add(1.0f, exp_f32(fp32_sub(0.0f, x))));
    }
    weights[k] = w;
    sum = fp32_add(sum, w);
  }
  if (slow || (!softmax && !renormalize)) return;
  const float inv = sum > 0.0f ? fp32_div(1.0f, sum) : 1.0f;
  for (int64_t k = 0; k < top_k; ++k) weights[k] = fp32_mul(weights[k], inv);
}

}  // namespace flashinfer::kernels
