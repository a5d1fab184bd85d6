#include "kernels/cpu/moe_cutlass_fp4_cpu.h"

#include <cblas.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include "flashinfer/float_formats.h"
#include "kernels/cpu/moe_cpu.h"
#include "kernels/cpu/moe_weight_prep_cpu.h"
#include "kernels/cpu/quantization_cpu.h"
#include "kernels/moe_sm90_mixed_rules.h"

namespace flashinfer::kernels::cpu {
namespace {

float load16(const void* base, DType dt, int64_t i) {
  const uint16_t b = static_cast<const uint16_t*>(base)[i];
  return dt == DType::kFloat16 ? half_bits_to_float(b) : bfloat16_bits_to_float(b);
}

uint16_t bits16(DType dt, float v) {
  return dt == DType::kFloat16 ? float_to_half_bits(v) : float_to_bfloat16_bits(v);
}

float round16(DType dt, float v) {
  const uint16_t b = bits16(dt, v);
  return load16(&b, dt, 0);
}

// c[m, n] = a[m, k] @ b[n, k]^T in fp32.
void sgemm_nt(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a, static_cast<blasint>(k), b,
              static_cast<blasint>(k), 0.0f, c, static_cast<blasint>(n));
}

// The fp32 values q * sf of block-scaled rows (the exact products the block-scaled MMA sums).
// FP4 rows take a fast path with one scale lookup per block (the same products as
// block_dequantize's q * sf * 1); FP8 rows go through block_dequantize.
void dequant(const uint8_t* data, int64_t stride, bool fp4, const uint8_t* sf, SfLayoutCode layout,
             bool ue8m0, int vec, int64_t m, int64_t k, float* out) {
  if (fp4) {
    float lut[16];
    for (int i = 0; i < 16; ++i) lut[i] = e2m1_bits_to_float(static_cast<uint8_t>(i));
    const int64_t nsf = k / vec;
#pragma omp parallel for schedule(static) if (m * k >= (int64_t{1} << 18))
    for (int64_t r = 0; r < m; ++r) {
      const uint8_t* row = data + r * stride;
      float* o = out + r * k;
      for (int64_t b = 0; b < nsf; ++b) {
        const uint8_t code = sf[sf_offset(layout, r, b, nsf)];
        const float s = ue8m0 ? ue8m0_to_float(code) : e4m3fn_bits_to_float(code);
        for (int64_t j = b * vec / 2; j < (b + 1) * vec / 2; ++j) {
          o[2 * j] = lut[row[j] & 0xF] * s;
          o[2 * j + 1] = lut[row[j] >> 4] * s;
        }
      }
    }
    return;
  }
  BlockDequantizeParams d;
  d.data = data;
  d.data_stride_m = stride;
  d.fp4 = fp4;
  d.sf = sf;
  d.sf_size = sf_buffer_size(layout, m, k / vec);
  d.sf_ue8m0 = ue8m0;
  d.sf_vec_size = vec;
  d.layout = layout;
  d.m = m;
  d.k = k;
  d.out = out;
  block_dequantize(d);
}

// Rows [m, k] of 16-bit values `bits` (dtype dt) quantized as GEMM operands and read back as
// q * sf: NVFP4 with global scale gs (fp4_quantize) or MXFP8 (mxfp8_quantize).
void quant_dequant(const uint16_t* bits, DType dt, int64_t m, int64_t k, bool nvfp4, float gs,
                   float* out) {
  const int vec = nvfp4 ? 16 : 32;
  std::vector<uint8_t> q(static_cast<size_t>(nvfp4 ? m * k / 2 : m * k));
  std::vector<uint8_t> sf(static_cast<size_t>(m * (k / vec)));
  if (nvfp4) {
    Fp4QuantizeParams fp;
    fp.input = bits;
    fp.in_dtype = dt;
    fp.m = m;
    fp.k = k;
    fp.in_stride_m = k;
    fp.out = q.data();
    fp.sf = sf.data();
    fp.sf_size = static_cast<int64_t>(sf.size());
    fp.global_scale = &gs;
    fp.sf_vec_size = 16;
    fp.layout = SfLayoutCode::kLinear;
    fp4_quantize(fp);
  } else {
    Mxfp8QuantizeParams mp;
    mp.input = bits;
    mp.in_dtype = dt;
    mp.m = m;
    mp.k = k;
    mp.in_stride_m = k;
    mp.out = q.data();
    mp.sf = sf.data();
    mp.sf_size = static_cast<int64_t>(sf.size());
    mp.layout = SfLayoutCode::kLinear;
    mxfp8_quantize(mp);
  }
  dequant(q.data(), nvfp4 ? k / 2 : k, nvfp4, sf.data(), SfLayoutCode::kLinear, !nvfp4, vec, m, k,
          out);
}

// Local pairs grouped by expert (token order within an expert): rows [count[e], count[e + 1]).
struct Grouping {
  std::vector<int64_t> count, row_pair, slot, local;
};

Grouping group_pairs(const CutlassMoeParams& p) {
  const int64_t T = p.num_tokens, K = p.top_k, E = p.num_local_experts;
  Grouping g;
  g.count.assign(static_cast<size_t>(E + 1), 0);
  g.slot.assign(static_cast<size_t>(T * K), -1);
  std::vector<int64_t>& local = g.local;
  local.assign(static_cast<size_t>(T * K), -1);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t i = t * p.experts_stride + k;
      const int64_t id = p.experts_dtype == DType::kInt64
                             ? static_cast<const int64_t*>(p.experts)[i]
                             : static_cast<const int32_t*>(p.experts)[i];
      const int64_t e = id - p.expert_offset;
      if (e >= 0 && e < E) {
        local[static_cast<size_t>(t * K + k)] = e;
        ++g.count[static_cast<size_t>(e + 1)];
      }
    }
  }
  for (int64_t e = 0; e < E; ++e)
    g.count[static_cast<size_t>(e + 1)] += g.count[static_cast<size_t>(e)];
  g.row_pair.resize(static_cast<size_t>(g.count[static_cast<size_t>(E)]));
  std::vector<int64_t> next(g.count.begin(), g.count.end() - 1);
  for (int64_t i = 0; i < T * K; ++i) {
    const int64_t e = local[static_cast<size_t>(i)];
    if (e < 0) continue;
    const int64_t r = next[static_cast<size_t>(e)]++;
    g.row_pair[static_cast<size_t>(r)] = i;
    g.slot[static_cast<size_t>(i)] = r;
  }
  return g;
}

float scale_at(const void* base, DType dt, int64_t i) {
  switch (dt) {
    case DType::kFloat32:
      return static_cast<const float*>(base)[i];
    default:
      return load16(base, dt, i);
  }
}

void store_out(const CutlassMoeParams& m, int64_t i, float v) {
  if (m.out_dtype == DType::kFloat32) {
    static_cast<float*>(m.out)[i] = v;
  } else {
    static_cast<uint16_t*>(m.out)[i] = bits16(m.out_dtype, v);
  }
}

// Where each bit of a 16 x 64 fp4 tile (512 bytes) lands under the SM90 interleave of quant
// type `qt` ("int4", "fp4" or "fp4_fp8"): found by running the forward transform on 12 tiles, tile
// b holding bit b of each bit's own position (both transforms only move bits, so every destination
// bit receives its source's position).
const std::array<uint16_t, 4096>& fp4_tile_permutation(Sm90QuantType qt) {
  static std::array<std::array<uint16_t, 4096>, 3> perms{};
  static std::once_flag once[3];
  const auto which = static_cast<size_t>(qt);  // kInt4, kFp4, kFp4Fp8
  std::call_once(once[which], [&] {
    auto& perm = perms[which];
    perm.fill(0);
    std::array<uint8_t, 512> src{}, dst{};
    for (int b = 0; b < 12; ++b) {
      for (int i = 0; i < 4096; ++i) {
        if ((i >> b) & 1) {
          src[static_cast<size_t>(i / 8)] |= static_cast<uint8_t>(1u << (i % 8));
        } else {
          src[static_cast<size_t>(i / 8)] &= static_cast<uint8_t>(~(1u << (i % 8)));
        }
      }
      Sm90WeightInterleaveParams ip;
      ip.in = src.data();
      ip.out = dst.data();
      ip.experts = 1;
      ip.n = 16;
      ip.k = 64;
      ip.quant_type = qt;
      sm90_interleave_weights(ip);
      // dst bit d holds bit b of the source position that moved there.
      for (int d = 0; d < 4096; ++d) {
        if ((dst[static_cast<size_t>(d / 8)] >> (d % 8)) & 1) {
          perm[static_cast<size_t>(d)] =
              static_cast<uint16_t>(perm[static_cast<size_t>(d)] | (1u << b));
        }
      }
    }
  });
  return perms[which];  // perm[destination bit] = source bit
}

// Scale (r, group) of one expert's [rows, k / 32] ue8m0 scales folded by
// interleave_moe_scales_for_sm90_mixed_gemm(group_size=32) (kernels/moe_sm90_mixed_rules.h).
uint8_t folded_scale(const uint8_t* s, int64_t k, int64_t r, int64_t grp) {
  return s[sm90_fold32_scale_index(k, r, grp)];
}

// One expert's MXFP4 weights from the SM90 layouts in fp32 (e2m1 times a power of two: exact).
void w4a16_expert(const uint8_t* w, const uint8_t* s, int64_t rows, int64_t k, float* out) {
  std::vector<uint8_t> plain(static_cast<size_t>(rows * k / 2));
  sm90_deinterleave_fp4_weights(w, plain.data(), rows, k);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t byte = plain[static_cast<size_t>(r * (k / 2) + c / 2)];
      const float q = e2m1_bits_to_float(c % 2 == 0 ? e2m1x2_low(byte) : e2m1x2_high(byte));
      out[r * k + c] = q * ue8m0_to_float(folded_scale(s, k, r, c / 32));
    }
  }
}

// humming_operand (kernels/moe_sm90_mixed_rules.h): the fp8 MMA operand of one Humming weight
// code at its block's exponent offset, shared with the CUDA kernels.

// One expert's Humming weights as the fp8 MMA operand (humming_operand per nibble, offset the
// block's folded exponent offset). The 2^6 comes back through the residual scale (upstream
// passes residual * 64).
void humming_expert(const uint8_t* w, const uint8_t* s, int64_t rows, int64_t k, float* out) {
  std::vector<uint8_t> plain(static_cast<size_t>(rows * k / 2));
  sm90_deinterleave_fp4_weights(w, plain.data(), rows, k, Sm90QuantType::kFp4Fp8);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t byte = plain[static_cast<size_t>(r * (k / 2) + c / 2)];
      out[r * k + c] = humming_operand(c % 2 == 0 ? e2m1x2_low(byte) : e2m1x2_high(byte),
                                       folded_scale(s, k, r, c / 32));
    }
  }
}

// W4A8: one expert's signed int4 weights (two's complement, the mainloop's int4 -> e4m3 table
// maps codes 8..15 to -8..-1) times their 16-bit group scale (128 columns), exact in fp32. The
// scales are upstream's SM90 fold of [rows, k / 128] 16-bit values: 64 x 128 logical blocks,
// out[rb, kb, f, m] = in[64 rb + 8 m + f, kb] (interleave_moe_scales_for_sm90_mixed_gemm with
// group_size 128). The kernel scales each 128-column partial sum after the MMA (fp32); the
// products here sum the same values in another order.
void int4_expert(const uint8_t* w, const uint16_t* s, DType sdt, int64_t rows, int64_t k,
                 float* out) {
  std::vector<uint8_t> plain(static_cast<size_t>(rows * k / 2));
  sm90_deinterleave_fp4_weights(w, plain.data(), rows, k, Sm90QuantType::kInt4);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t byte = plain[static_cast<size_t>(r * (k / 2) + c / 2)];
      const int nib = c % 2 == 0 ? byte & 0xF : byte >> 4;
      const int64_t si = sm90_fold128_scale_index(k, r, c / 128);  // moe_sm90_mixed_rules.h
      out[r * k + c] = static_cast<float>(nib < 8 ? nib : nib - 16) * load16(s, sdt, si);
    }
  }
}

// Weight-only INT4: where logical element (k, n) of one expert's [K, N] int4 matrix lies after
// preprocess_weights_for_mixed_gemm(W4_A16) at arch 80, as a nibble index (nibble i: byte i / 2,
// low nibble first), composing its four steps (docs/MOE.md, "weight-only INT4"):
// 1. rows permuted in groups of 32 for LDSM: output row j of a group holds input row kLdsm[j];
// 2. sub-byte transpose to [N, K] (column-major B);
// 3. ColumnMajorTileInterleave<64, 4>: 32-bit words (8 k's) of four columns n interleaved per
//    64-row tile: word (n, v) goes to (n / 4) * (K / 2) + 32 * (v / 8) + 8 * (n % 4) + v % 8;
// 4. +8 bias, and in each word element q moves to nibble (q % 2) * 4 + q / 2 (even elements in
//    the low half), the order the kernel's FastInterleavedAndBiasedNumericArrayConverter reads.
int64_t woq_int4_nibble(int64_t k, int64_t n, int64_t K) {
  static const std::array<int, 32> kInv = [] {  // woq_ldsm_k's inverse
    std::array<int, 32> inv{};
    for (int j = 0; j < 32; ++j) inv[static_cast<size_t>(woq_ldsm_k(j))] = j;
    return inv;
  }();
  const int64_t kp = k / 32 * 32 + kInv[static_cast<size_t>(k % 32)];
  const int64_t v = kp / 8, q = kp % 8;
  const int64_t word = n / 4 * (K / 2) + v / 8 * 32 + n % 4 * 8 + v % 8;
  return word * 8 + q % 2 * 4 + q / 2;
}

// One expert's weight-only INT4 weights dequantized as the kernel's MMA operand, [rows, k]
// (rows = the GEMM's n): w = code - 8, times the group scale s[c / 128, r], plus the zero point
// z[c / 128, r] when given, in the 16-bit dt: bf16 one fused multiply-add (one rounding), fp16 a
// multiply rounded, then an add rounded (mma_tensorop_dequantizer).
void woq_int4_expert(const uint8_t* w, const uint16_t* s, const uint16_t* z, DType dt, int64_t rows,
                     int64_t k, float* out) {
  std::vector<int8_t> q(static_cast<size_t>(rows * k));
  woq_int4_unpermute(w, q.data(), rows, k);
#pragma omp parallel for schedule(static) if (rows * k >= (int64_t{1} << 18))
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const int64_t si = c / 128 * rows + r;
      // kernels/moe_sm90_mixed_rules.h, shared with the CUDA kernels.
      out[r * k + c] = woq_int4_operand(
          static_cast<float>(q[static_cast<size_t>(r * k + c)]), load16(s, dt, si), z != nullptr,
          z != nullptr ? load16(z, dt, si) : 0.0f, dt == DType::kFloat16);
    }
  }
}

// A GEMM input value times its column's pre-quant scale in the 16-bit type (applyPrequantScale,
// __hmul2: one rounding of the exact product); `v` itself when there is no scale (weight-only
// INT4 without AWQ, W4A16).
float prequant_scaled(DType dt, float v, const uint16_t* prequant, int64_t col) {
  return prequant ? round16(dt, v * load16(prequant, dt, col)) : v;
}

// W4A8's fp8 GEMM input: each value scaled (prequant_scaled; W4A8 always has the scales), then
// e4m3 (RNE, satfinite).
float w4a8_act(DType dt, float v, const uint16_t* prequant, int64_t col) {
  return e4m3_satfinite_value(prequant_scaled(dt, v, prequant, col));
}

// Humming's per-row fp8 quantization (expandInputRowsKernel for GEMM1's input,
// doActivationKernel for GEMM2's): quant = 448 / amax (1 for a zero row; amax floored at
// 448 / FLT_MAX so the quotient stays finite), codes e4m3_satfinite(v * quant) written decoded to
// q; returns the row's dequantization scale 1 / quant.
float humming_row_fp8(const float* v, int64_t n, float* q) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(v[i]));
  const float quant = humming_quant(amax);  // kernels/moe_sm90_mixed_rules.h
  for (int64_t i = 0; i < n; ++i) q[i] = humming_fp8(v[i], quant);
  return 1.0f / quant;
}

void run_fp4(const CutlassMoeFp4Params& p) {
  const CutlassMoeParams& m = p.moe;
  const int64_t T = m.num_tokens, K = m.top_k, H = m.hidden, I = m.inter;
  const int64_t E = m.num_local_experts;
  const int64_t N1 = moe_act_is_gated(m.act) ? 2 * I : I;
  const bool nv = p.mode == CutlassFp4Mode::kNvfp4;
  const bool w4a16 = p.mode == CutlassFp4Mode::kW4A16Mxfp4;
  const bool hum = p.mode == CutlassFp4Mode::kHummingFp8Mxfp4;
  const bool w8 = p.mode == CutlassFp4Mode::kMxfp8Mxfp8;  // e4m3 weights: a byte per value
  const bool w4a8 = p.mode == CutlassFp4Mode::kW4A8Int4;
  const bool woq = p.mode == CutlassFp4Mode::kWoqInt4;
  const int64_t wdiv = w8 ? 1 : 2;
  const int vec = nv ? 16 : 32;
  const DType gdt = m.dtype;  // GEMM output / activation storage type
  const Grouping g = group_pairs(m);

  // Pre-quantized input (packed NVFP4 or MXFP8): every token's q * sf once.
  std::vector<float> xin;
  if (p.in_dtype == DType::kUInt8 || p.in_dtype == DType::kFloat8E4M3FN) {
    xin.resize(static_cast<size_t>(T * H));
    dequant(static_cast<const uint8_t*>(m.input), m.in_stride, nv, p.input_sf, p.input_sf_layout,
            !nv, vec, T, H, xin.data());
  }

  std::vector<float> y(static_cast<size_t>(g.row_pair.size() * H));
  const auto* w1 = static_cast<const uint8_t*>(m.w1);
  const auto* w2 = static_cast<const uint8_t*>(m.w2);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = g.count[static_cast<size_t>(e)];
    const int64_t n = g.count[static_cast<size_t>(e + 1)] - r0;
    if (n == 0) continue;
    // GEMM1's A operand: the routed rows as the block-scaled MMA reads them.
    std::vector<float> a(static_cast<size_t>(n * H));
    // Humming: each routed row's dequantization scale (GEMM1's, then GEMM2's), the per-row
    // alpha of the GEMM epilogue: (1 / quant) * residual[e].
    std::vector<float> dq(hum ? static_cast<size_t>(n) : 0);
    if (!xin.empty()) {
      for (int64_t r = 0; r < n; ++r) {
        const int64_t t = g.row_pair[static_cast<size_t>(r0 + r)] / K;
        std::memcpy(&a[static_cast<size_t>(r * H)], &xin[static_cast<size_t>(t * H)],
                    static_cast<size_t>(H) * sizeof(float));
      }
    } else if (w4a16 || hum || w4a8 || woq) {
      for (int64_t r = 0; r < n; ++r) {
        const int64_t t = g.row_pair[static_cast<size_t>(r0 + r)] / K;
        for (int64_t c = 0; c < H; ++c) {
          const float v = load16(m.input, p.in_dtype, t * m.in_stride + c);
          // Weight-only INT4's AWQ smoothing (use_awq: both act scales given) or W4A8's fp8 input.
          a[static_cast<size_t>(r * H + c)] =
              w4a8 ? w4a8_act(p.in_dtype, v, p.fc1_prequant, c)
                   : prequant_scaled(p.in_dtype, v, p.fc1_prequant, c);
        }
        if (hum) {
          float* row = &a[static_cast<size_t>(r * H)];
          dq[static_cast<size_t>(r)] = humming_row_fp8(row, H, row) * p.fc1_global[e];
        }
      }
    } else {
      // fp16 / bf16 input quantized per routed row with the fc1 input global scale.
      std::vector<uint16_t> rows(static_cast<size_t>(n * H));
      for (int64_t r = 0; r < n; ++r) {
        const int64_t t = g.row_pair[static_cast<size_t>(r0 + r)] / K;
        std::memcpy(&rows[static_cast<size_t>(r * H)],
                    static_cast<const uint16_t*>(m.input) + t * m.in_stride,
                    static_cast<size_t>(H) * 2);
      }
      const float gs = p.fc1_act_global ? p.fc1_act_global[p.fc1_act_per_expert ? e : 0] : 1.0f;
      quant_dequant(rows.data(), p.in_dtype, n, H, true, gs, a.data());
    }
    std::vector<float> w(static_cast<size_t>(N1 * H));
    if (w4a16) {
      w4a16_expert(w1 + e * N1 * (H / 2), p.w1_sf + e * p.w1_sf_stride, N1, H, w.data());
    } else if (hum) {
      humming_expert(w1 + e * N1 * (H / 2), p.w1_sf + e * p.w1_sf_stride, N1, H, w.data());
    } else if (w4a8) {
      int4_expert(w1 + e * N1 * (H / 2),
                  reinterpret_cast<const uint16_t*>(p.w1_sf + e * p.w1_sf_stride), p.in_dtype, N1,
                  H, w.data());
    } else if (woq) {
      woq_int4_expert(w1 + e * N1 * (H / 2),
                      reinterpret_cast<const uint16_t*>(p.w1_sf + e * p.w1_sf_stride),
                      p.w1_zeros ? p.w1_zeros + e * (p.w1_sf_stride / 2) : nullptr, p.in_dtype, N1,
                      H, w.data());
    } else {
      dequant(w1 + e * N1 * (H / wdiv), H / wdiv, !w8, p.w1_sf + e * p.w1_sf_stride,
              SfLayoutCode::k128x4, !nv, vec, N1, H, w.data());
    }
    std::vector<float> acc(static_cast<size_t>(n * N1));
    sgemm_nt(a.data(), w.data(), acc.data(), n, N1, H);
    // The alpha in GEMM1's epilogue (Humming: per row), the result stored in gdt; then the bias
    // (fp32) and the activation (doActivationKernel); the activation stored in gdt and, but for
    // W4A16, re-quantized for GEMM2 (Humming: quantized from fp32, per row).
    const float alpha1 = p.fc1_global ? p.fc1_global[e] : 1.0f;
    std::vector<float> gv(static_cast<size_t>(N1)), hv(static_cast<size_t>(I));
    std::vector<uint16_t> hb(static_cast<size_t>(n * I));
    std::vector<float> hq(static_cast<size_t>(n * I));
    for (int64_t r = 0; r < n; ++r) {
      const float a1 = hum ? dq[static_cast<size_t>(r)] : alpha1;
      for (int64_t j = 0; j < N1; ++j) {
        float v;
        if (woq) {
          // The SM80 GEMM's epilogue adds the bias to the fp32 accumulator and, for a gated
          // activation, stores the sum in gdt (doGatedActivation follows); otherwise it applies
          // the activation to the fp32 sum itself.
          v = acc[static_cast<size_t>(r * N1 + j)] + (m.b1 ? load16(m.b1, gdt, e * N1 + j) : 0.0f);
          if (N1 == 2 * I) v = round16(gdt, v);
        } else {
          v = round16(gdt, a1 * acc[static_cast<size_t>(r * N1 + j)]);
          if (m.b1) v += load16(m.b1, gdt, e * N1 + j);
        }
        gv[static_cast<size_t>(j)] = v;
      }
      moe_activation_row(m, e, gv.data(), hv.data());
      if (hum) {
        // Humming quantizes the fp32 activation itself (no rounding to gdt first).
        dq[static_cast<size_t>(r)] =
            humming_row_fp8(hv.data(), I, &hq[static_cast<size_t>(r * I)]) * p.fc2_global[e];
        continue;
      }
      for (int64_t j = 0; j < I; ++j) {
        hb[static_cast<size_t>(r * I + j)] = bits16(gdt, hv[static_cast<size_t>(j)]);
      }
    }
    const float gs2 = p.fc2_act_global ? p.fc2_act_global[p.fc2_act_per_expert ? e : 0] : 1.0f;
    // (Humming: hq and dq hold GEMM2's quantized rows and their scales already.)
    if (w4a16 || woq || w4a8) {
      // applyPrequantScale: the stored activation times fc2's pre-quant scale when there is one,
      // then e4m3 for W4A8.
      for (size_t i = 0; i < hq.size(); ++i) {
        const float v = load16(hb.data(), gdt, static_cast<int64_t>(i));
        const int64_t col = static_cast<int64_t>(i) % I;
        hq[i] = w4a8 ? w4a8_act(gdt, v, p.fc2_prequant, col)
                     : prequant_scaled(gdt, v, p.fc2_prequant, col);
      }
    } else if (!hum) {
      quant_dequant(hb.data(), gdt, n, I, nv, gs2, hq.data());
    }
    w.resize(static_cast<size_t>(H * I));
    if (w4a16) {
      w4a16_expert(w2 + e * H * (I / 2), p.w2_sf + e * p.w2_sf_stride, H, I, w.data());
    } else if (hum) {
      humming_expert(w2 + e * H * (I / 2), p.w2_sf + e * p.w2_sf_stride, H, I, w.data());
    } else if (w4a8) {
      int4_expert(w2 + e * H * (I / 2),
                  reinterpret_cast<const uint16_t*>(p.w2_sf + e * p.w2_sf_stride), p.in_dtype, H, I,
                  w.data());
    } else if (woq) {
      woq_int4_expert(
          w2 + e * H * (I / 2), reinterpret_cast<const uint16_t*>(p.w2_sf + e * p.w2_sf_stride),
          p.w2_zeros ? p.w2_zeros + e * (p.w2_sf_stride / 2) : nullptr, p.in_dtype, H, I, w.data());
    } else {
      dequant(w2 + e * H * (I / wdiv), I / wdiv, !w8, p.w2_sf + e * p.w2_sf_stride,
              SfLayoutCode::k128x4, !nv, vec, H, I, w.data());
    }
    acc.resize(static_cast<size_t>(n * H));
    sgemm_nt(hq.data(), w.data(), acc.data(), n, H, I);
    // GEMM2's output stored in gdt, without the bias (the finalize adds it).
    const float alpha2 = p.fc2_global ? p.fc2_global[e] : 1.0f;
    for (int64_t r = 0; r < n; ++r) {
      const float a2 = hum ? dq[static_cast<size_t>(r)] : alpha2;
      for (int64_t c = 0; c < H; ++c) {
        y[static_cast<size_t>((r0 + r) * H + c)] =
            round16(gdt, a2 * acc[static_cast<size_t>(r * H + c)]);
      }
    }
  }
  // Finalize (finalizeMoeRoutingKernel): sum over k in k order of scale * (y + b2[e]), fp32,
  // rounded once to the output dtype.
  std::vector<float> out(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    std::fill(out.begin(), out.end(), 0.0f);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t r = g.slot[static_cast<size_t>(t * K + k)];
      if (r < 0) continue;
      const float s = scale_at(m.scales, m.scales_dtype, t * m.scales_stride + k);
      const int64_t e = g.local[static_cast<size_t>(t * K + k)];
      for (int64_t c = 0; c < H; ++c) {
        float v = y[static_cast<size_t>(r * H + c)];
        if (m.b2) v += load16(m.b2, gdt, e * H + c);
        out[static_cast<size_t>(c)] += s * v;
      }
    }
    for (int64_t c = 0; c < H; ++c) store_out(m, t * m.out_stride + c, out[static_cast<size_t>(c)]);
  }
}

}  // namespace

void sm90_deinterleave_fp4_weights(const uint8_t* in, uint8_t* out, int64_t n, int64_t k,
                                   Sm90QuantType qt) {
  const auto& perm = fp4_tile_permutation(qt);
  const int64_t row_bytes = k / 2;
  std::memset(out, 0, static_cast<size_t>(n * row_bytes));
  // Tile (tr, tc): rows [16 tr, 16 tr + 16), bytes [32 tc, 32 tc + 32) of each row; tile bit
  // i is bit i % 8 of byte (i / 8) % 32 of row i / 256.
  for (int64_t tr = 0; tr < n / 16; ++tr) {
    for (int64_t tc = 0; tc < k / 64; ++tc) {
      auto at = [&](int i) { return (tr * 16 + i / 256) * row_bytes + tc * 32 + (i / 8) % 32; };
      for (int d = 0; d < 4096; ++d) {
        if ((in[at(d)] >> (d % 8)) & 1) {
          const int s = perm[static_cast<size_t>(d)];
          out[at(s)] = static_cast<uint8_t>(out[at(s)] | (1u << (s % 8)));
        }
      }
    }
  }
}

void woq_int4_unpermute(const uint8_t* in, int8_t* out, int64_t n, int64_t k) {
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t r = 0; r < k; ++r) {
      const int64_t i = woq_int4_nibble(r, c, k);
      out[c * k + r] = static_cast<int8_t>(((in[i / 2] >> (4 * (i % 2))) & 0xF) - 8);
    }
  }
}

void cutlass_moe_fp4(const CutlassMoeFp4Params& p) { run_fp4(p); }

}  // namespace flashinfer::kernels::cpu
