#include "kernels/cpu/moe_fp4_cpu.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "flashinfer/float_formats.h"
#include "kernels/cpu/moe_cpu.h"
#include "kernels/cpu/quantization_cpu.h"
#include "kernels/quantization_params.h"

namespace flashinfer::kernels::cpu {
namespace {

float bf16_round(float v) { return bfloat16_bits_to_float(float_to_bfloat16_bits(v)); }

// Element c of a packed e2m1 row (element 2j in the low nibble).
float e2m1_at(const uint8_t* row, int64_t c) {
  const uint8_t b = row[c / 2];
  return e2m1_bits_to_float(c % 2 == 0 ? e2m1x2_low(b) : e2m1x2_high(b));
}

int64_t weight_vec(Moe4Weights w) { return w == Moe4Weights::kNvfp4 ? 16 : 32; }

// Bytes of one stored weight row of `cols` values: packed 4-bit, or one e4m3 byte (MXFP8).
int64_t weight_row_bytes(Moe4Weights w, int64_t cols) {
  return w == Moe4Weights::kMxfp8 ? cols : cols / 2;
}

// The fp32 value of one expert's [rows, cols] packed weight matrix with its linear scales: a
// 16-entry table of the nibble values times each block's scale.
std::vector<float> dequant_weights(Moe4Weights kind, const uint8_t* w, const void* scale,
                                   int64_t rows, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  const int64_t vec = weight_vec(kind), sc = cols / vec;
  if (kind == Moe4Weights::kMxfp8) {
    const auto* sf = static_cast<const uint8_t*>(scale);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        out[static_cast<size_t>(r * cols + c)] =
            e4m3fn_bits_to_float(w[r * cols + c]) * ue8m0_to_float(sf[r * sc + c / vec]);
      }
    }
    return out;
  }
  float lut[16];
  for (int i = 0; i < 16; ++i) {
    lut[i] = kind == Moe4Weights::kMxint4 ? static_cast<float>(i < 8 ? i : i - 16)
                                          : e2m1_bits_to_float(static_cast<uint8_t>(i));
  }
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* wr = w + r * (cols / 2);
    float* o = out.data() + r * cols;
    for (int64_t b = 0; b < sc; ++b) {
      const int64_t si = r * sc + b;
      float s;
      switch (kind) {
        case Moe4Weights::kNvfp4:
          s = e4m3fn_bits_to_float(static_cast<const uint8_t*>(scale)[si]);
          break;
        case Moe4Weights::kMxfp4:
          s = ue8m0_to_float(static_cast<const uint8_t*>(scale)[si]);
          break;
        default:
          s = bfloat16_bits_to_float(static_cast<const uint16_t*>(scale)[si]);
          break;
      }
      for (int64_t j = b * vec / 2; j < (b + 1) * vec / 2; ++j) {
        const uint8_t byte = wr[j];
        o[2 * j] = lut[byte & 0xF] * s;
        o[2 * j + 1] = lut[byte >> 4] * s;
      }
    }
  }
  return out;
}

// Token t's hidden state in fp32.
void dequant_hidden(const TrtllmFp4MoeParams& p, int64_t t, float* dst) {
  const CutlassMoeParams& m = p.base.moe;
  const int64_t H = m.hidden;
  switch (p.input) {
    case Moe4Input::kNvfp4: {
      const uint8_t* row = static_cast<const uint8_t*>(m.input) + t * m.in_stride;
      const uint8_t* sf = p.hs_scale + t * p.hs_scale_stride;
      for (int64_t c = 0; c < H; ++c) dst[c] = e2m1_at(row, c) * e4m3fn_bits_to_float(sf[c / 16]);
      return;
    }
    case Moe4Input::kMxfp8: {
      const uint8_t* row = static_cast<const uint8_t*>(m.input) + t * m.in_stride;
      const uint8_t* sf = p.hs_scale + t * p.hs_scale_stride;
      for (int64_t c = 0; c < H; ++c) {
        dst[c] = e4m3fn_bits_to_float(row[c]) * ue8m0_to_float(sf[c / 32]);
      }
      return;
    }
    default: {
      const uint16_t* row = static_cast<const uint16_t*>(m.input) + t * m.in_stride;
      for (int64_t c = 0; c < H; ++c) dst[c] = bfloat16_bits_to_float(row[c]);
      return;
    }
  }
}

// float_to_ue8m0_fast (flashinfer/quantization/quantization_cute_dsl_utils.py): the biased
// exponent of v, plus one when the mantissa is not zero (round up; not for a subnormal whose
// mantissa is <= 0x400000), at most 254; 0 for v <= 0.
uint8_t ue8m0_round_up(float v) {
  if (!(v > 0.0f)) return 0;
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  const uint32_t exp = (bits >> 23) & 0xFF, mant = bits & 0x7FFFFF;
  uint32_t code = exp + (mant != 0 && !(exp == 0 && mant <= 0x400000) ? 1 : 0);
  return static_cast<uint8_t>(std::min<uint32_t>(code, 254));
}

// MXFP8 quantize-dequantize of n fp32 values (blocks of 32) in place, as the CuTe-DSL GEMM1
// epilogue writes them (kMxfp8Fp32). ue8m0_to_inv_scale_fast builds 2^(127 - code) from the
// exponent field max(254 - code, 0), so code 0 and code 254 both give a factor 0.
void mxfp8_qdq_fp32(float* v, int64_t n) {
  for (int64_t b = 0; b < n; b += 32) {
    float amax = 0.0f;
    for (int64_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(v[i]));
    const uint8_t code = ue8m0_round_up(amax * (1.0f / 448.0f));
    const float inv = code == 0 || code >= 254 ? 0.0f : std::ldexp(1.0f, 127 - code);
    const float scale = ue8m0_to_float(code);
    for (int64_t i = b; i < b + 32; ++i) {
      v[i] = e4m3fn_bits_to_float(float_to_e4m3fn_bits(v[i] * inv, true)) * scale;
    }
  }
}

// nvfp4_quantize_per_token_cute_dsl of one row of n values (already rounded to its 16-bit type),
// in place, with exact fp32 arithmetic where the kernel uses rcp.approx: pts = amax * gs_inv
// (0 for a zero row, whose encode scale is FLT_MAX), per block of 16 sf = e4m3(enc * (bmax /
// 6)), values e2m1(v * (1 / (sf / enc))) * sf. Returns pts, the factor GEMM2 applies to the row.
float nvfp4_per_token_qdq(float* v, int64_t n, float gs_inv) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(v[i]));
  const float pts = amax == 0.0f ? 0.0f : amax * gs_inv;
  const float enc = amax == 0.0f ? std::numeric_limits<float>::max() : 1.0f / pts;
  for (int64_t b = 0; b < n; b += 16) {
    float bmax = 0.0f;
    for (int64_t i = b; i < b + 16; ++i) bmax = std::max(bmax, std::fabs(v[i]));
    const float sf = e4m3fn_bits_to_float(float_to_e4m3fn_bits(enc * (bmax * (1.0f / 6.0f)), true));
    const float out_scale = sf == 0.0f ? 0.0f : 1.0f / (sf * (1.0f / enc));
    for (int64_t i = b; i < b + 16; ++i)
      v[i] = e2m1_bits_to_float(float_to_e2m1_bits(v[i] * out_scale)) * sf;
  }
  return pts;
}

// Quantizes and dequantizes the activation rows [n, I] in place, as GEMM2 reads them; `gs` is
// the NVFP4 global scale.
// `codes`, when given for an MXFP8 activation, receives its e4m3 codes ([n, I]: the activation a
// LoRA delta's caller gets back).
void quantize_activation(Moe4ActQuant q, std::vector<float>& h, int64_t n, int64_t I, float gs,
                         uint8_t* codes = nullptr) {
  if (q == Moe4ActQuant::kNone) return;
  if (q == Moe4ActQuant::kNvfp4KeepScale || q == Moe4ActQuant::kNvfp4KeepScaleBf16) {
    if (q == Moe4ActQuant::kNvfp4KeepScaleBf16) {
      for (float& v : h) v = bf16_round(v);
    }
    nvfp4_qdq_keep_scale(h.data(), n * I, gs);
    return;
  }
  if (q == Moe4ActQuant::kMxfp8Fp32) {
    mxfp8_qdq_fp32(h.data(), n * I);
    return;
  }
  for (float& v : h) v = bf16_round(v);
  if (q == Moe4ActQuant::kBf16 || n == 0) return;
  std::vector<uint16_t> bits(h.size());
  for (size_t i = 0; i < h.size(); ++i) bits[i] = float_to_bfloat16_bits(h[i]);
  if (q == Moe4ActQuant::kNvfp4) {
    std::vector<uint8_t> packed(static_cast<size_t>(n * I / 2)),
        sf(static_cast<size_t>(n * I / 16));
    Fp4QuantizeParams fp;
    fp.input = bits.data();
    fp.in_dtype = DType::kBFloat16;
    fp.m = n;
    fp.k = I;
    fp.in_stride_m = I;
    fp.out = packed.data();
    fp.sf = sf.data();
    fp.sf_size = static_cast<int64_t>(sf.size());
    fp.global_scale = &gs;
    fp.sf_vec_size = 16;
    fp.layout = SfLayoutCode::kLinear;
    fp4_quantize(fp);
    const float inv = 1.0f / gs;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < I; ++c) {
        h[static_cast<size_t>(r * I + c)] =
            e2m1_at(packed.data() + r * (I / 2), c) *
            e4m3fn_bits_to_float(sf[static_cast<size_t>(r * (I / 16) + c / 16)]) * inv;
      }
    }
    return;
  }
  std::vector<uint8_t> q8(static_cast<size_t>(n * I)), sf(static_cast<size_t>(n * I / 32));
  Mxfp8QuantizeParams mp;
  mp.input = bits.data();
  mp.in_dtype = DType::kBFloat16;
  mp.m = n;
  mp.k = I;
  mp.in_stride_m = I;
  mp.out = q8.data();
  mp.sf = sf.data();
  mp.sf_size = static_cast<int64_t>(sf.size());
  mp.layout = SfLayoutCode::kLinear;
  mxfp8_quantize(mp);
  if (codes) std::copy(q8.begin(), q8.end(), codes);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < I; ++c) {
      h[static_cast<size_t>(r * I + c)] =
          e4m3fn_bits_to_float(q8[static_cast<size_t>(r * I + c)]) *
          ue8m0_to_float(sf[static_cast<size_t>(r * (I / 32) + c / 32)]);
    }
  }
}

// c[m, n] = a[m, k] @ b[n, k]^T in fp32.
void sgemm_nt(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, a, static_cast<int>(k), b, static_cast<int>(k), 0.0f, c,
              static_cast<int>(n));
}

}  // namespace

}  // namespace flashinfer::kernels::cpu

namespace flashinfer::kernels {

void nvfp4_qdq_keep_scale(float* v, int64_t n, float gs) {
  for (int64_t b = 0; b < n; b += 16) {
    float amax = 0.0f;
    for (int64_t i = b; i < b + 16; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float sf =
        e4m3fn_bits_to_float(float_to_e4m3fn_bits(std::min(amax * gs / 6.0f, 448.0f), true));
    const float d = std::max(sf / gs, 1e-30f);
    for (int64_t i = b; i < b + 16; ++i)
      v[i] = e2m1_bits_to_float(float_to_e2m1_bits(v[i] / d)) * sf;
  }
}

}  // namespace flashinfer::kernels

namespace flashinfer::kernels::cpu {

void trtllm_fp4_moe(const TrtllmFp4MoeParams& p) {
  const CutlassMoeParams& m = p.base.moe;
  const int64_t T = m.num_tokens, K = m.top_k, H = m.hidden, I = m.inter;
  const int64_t E = m.num_local_experts;
  const bool gated = moe_act_is_gated(m.act);
  const int64_t N1 = gated ? 2 * I : I;
  const int64_t vec = weight_vec(p.weights);
  std::vector<int32_t> ids(static_cast<size_t>(T * K));
  std::vector<float> w(static_cast<size_t>(T * K));
  // The trtllm launchers keep the routing weights in bf16 (but fp32 pairs); b12x / CuTe-DSL don't.
  trtllm_route(p.base, ids.data(), w.data(), p.round_routing_weights);

  const auto* w1 = static_cast<const uint8_t*>(m.w1);
  const auto* w2 = static_cast<const uint8_t*>(m.w2);
  const auto* b1 = static_cast<const float*>(m.b1);
  const auto* b2 = static_cast<const float*>(m.b2);
  const size_t sf_es = p.weights == Moe4Weights::kMxint4 ? 2 : 1;
  std::vector<float> y(static_cast<size_t>(T * K * H), 0.0f);
  std::vector<char> local(static_cast<size_t>(T * K), 0);
  // The activation per pair, for the LoRA delta's returned activation (m.act_out): bf16 values,
  // or an MXFP8 activation's e4m3 codes.
  const bool act_codes = p.act_quant == Moe4ActQuant::kMxfp8;
  std::vector<float> act_pair(m.act_out && !act_codes ? static_cast<size_t>(T * K * I) : 0, 0.0f);
  std::vector<uint8_t> act_code_pair(m.act_out && act_codes ? static_cast<size_t>(T * K * I) : 0);
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t> pairs;
    for (int64_t i = 0; i < T * K; ++i) {
      if (ids[static_cast<size_t>(i)] - m.expert_offset == e) pairs.push_back(i);
    }
    if (pairs.empty()) continue;
    const int64_t n = static_cast<int64_t>(pairs.size());
    std::vector<float> a(static_cast<size_t>(n * H));
    for (int64_t r = 0; r < n; ++r)
      dequant_hidden(p, pairs[static_cast<size_t>(r)] / K, &a[static_cast<size_t>(r * H)]);
    if (p.quantize_input) {
      const float igs = p.in_global_scale ? p.in_global_scale[p.in_gs_count == 1 ? 0 : e] : 1.0f;
      for (int64_t r = 0; r < n; ++r) nvfp4_qdq_keep_scale(&a[static_cast<size_t>(r * H)], H, igs);
    }
    const auto* s1 =
        static_cast<const uint8_t*>(p.w1_scale) + static_cast<size_t>(e * N1 * (H / vec)) * sf_es;
    const std::vector<float> w1e =
        dequant_weights(p.weights, w1 + e * N1 * weight_row_bytes(p.weights, H), s1, N1, H);
    std::vector<float> g1(static_cast<size_t>(n * N1));
    sgemm_nt(a.data(), w1e.data(), g1.data(), n, N1, H);
    // GEMM1's output scales (the up half's carries the activation's global scale), the bias,
    // the activation.
    const float sg = p.out1_gate_scale ? p.out1_gate_scale[e] : 1.0f;
    const float sc = p.out1_scale ? p.out1_scale[e] : 1.0f;
    const float* be = b1 ? b1 + e * N1 : nullptr;
    std::vector<float> h(static_cast<size_t>(n * I)), gv(static_cast<size_t>(N1));
    for (int64_t r = 0; r < n; ++r) {
      const float* g = g1.data() + r * N1;
      float* hr = h.data() + r * I;
      // The CuTe-DSL per-token path scales GEMM1's alpha by the token's per_token_scale.
      const float rs = p.in_row_scale ? p.in_row_scale[pairs[static_cast<size_t>(r)] / K] : 1.0f;
      const float sgr = sg * rs, scr = sc * rs;
      // The pair's LoRA delta, after the scales and the bias (upstream's reference order).
      const auto add_delta = [&] {
        if (!m.fc1_delta) return;
        const int64_t pair = pairs[static_cast<size_t>(r)];
        const uint16_t* d =
            m.fc1_delta + (pair / K) * m.delta_stride_t + (pair % K) * m.delta_stride_k;
        for (int64_t j = 0; j < N1; ++j) gv[static_cast<size_t>(j)] += bfloat16_bits_to_float(d[j]);
      };
      if (m.act == MoeAct::kSwigluStep) {
        // On the raw accumulators: the per-token scale, the bias and the delta first, then the
        // output scales inside the step (kernels/moe_params.h; upstream 0.7.4's reference order).
        for (int64_t j = 0; j < N1; ++j) {
          gv[static_cast<size_t>(j)] = g[j] * rs + (be ? be[j] : 0.0f);
        }
        add_delta();
        moe_trtllm_step_row(m, e, gv.data(), sc, sg, hr);
      } else if (gated) {
        for (int64_t j = 0; j < I; ++j) {
          gv[static_cast<size_t>(j)] = g[j] * scr + (be ? be[j] : 0.0f);
          gv[static_cast<size_t>(I + j)] = g[I + j] * sgr + (be ? be[I + j] : 0.0f);
        }
        add_delta();
        moe_activation_row(m, e, gv.data(), hr);
      } else {
        for (int64_t j = 0; j < I; ++j)
          gv[static_cast<size_t>(j)] = g[j] * sgr + (be ? be[j] : 0.0f);
        moe_activation_row(m, e, gv.data(), hr);
        for (int64_t j = 0; j < I; ++j) hr[j] *= sc;
      }
    }
    const float gs = p.act_global_scale ? p.act_global_scale[p.act_gs_count == 1 ? 0 : e] : 1.0f;
    std::vector<float> row_pts;
    if (p.act_quant == Moe4ActQuant::kNvfp4PerTokenBf16 ||
        p.act_quant == Moe4ActQuant::kNvfp4PerTokenFp16) {
      const bool fp16 = p.act_quant == Moe4ActQuant::kNvfp4PerTokenFp16;
      row_pts.resize(static_cast<size_t>(n));
      for (int64_t r = 0; r < n; ++r) {
        float* hr = h.data() + r * I;
        for (int64_t j = 0; j < I; ++j)
          hr[j] = fp16 ? half_bits_to_float(float_to_half_bits(hr[j])) : bf16_round(hr[j]);
        row_pts[static_cast<size_t>(r)] = nvfp4_per_token_qdq(hr, I, gs);
      }
    } else {
      std::vector<uint8_t> codes(m.act_out && act_codes ? static_cast<size_t>(n * I) : 0);
      quantize_activation(p.act_quant, h, n, I, gs, codes.empty() ? nullptr : codes.data());
      for (int64_t r = 0; r < n && !codes.empty(); ++r) {
        std::copy(codes.begin() + r * I, codes.begin() + (r + 1) * I,
                  act_code_pair.begin() + pairs[static_cast<size_t>(r)] * I);
      }
    }
    for (int64_t r = 0; r < n && m.act_out && !act_codes; ++r) {
      std::copy(h.begin() + r * I, h.begin() + (r + 1) * I,
                act_pair.begin() + pairs[static_cast<size_t>(r)] * I);
    }
    const auto* s2 =
        static_cast<const uint8_t*>(p.w2_scale) + static_cast<size_t>(e * H * (I / vec)) * sf_es;
    const std::vector<float> w2e =
        dequant_weights(p.weights, w2 + e * H * weight_row_bytes(p.weights, I), s2, H, I);
    std::vector<float> g2(static_cast<size_t>(n * H));
    sgemm_nt(h.data(), w2e.data(), g2.data(), n, H, I);
    const float s2o = p.out2_scale ? p.out2_scale[e] : 1.0f;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t pair = pairs[static_cast<size_t>(r)];
      local[static_cast<size_t>(pair)] = 1;
      const float s2r = row_pts.empty() ? s2o : s2o * row_pts[static_cast<size_t>(r)];
      for (int64_t c = 0; c < H; ++c) {
        const float v = g2[static_cast<size_t>(r * H + c)] * s2r + (b2 ? b2[e * H + c] : 0.0f);
        y[static_cast<size_t>(pair * H + c)] = p.round_expert_out ? bf16_round(v) : v;
      }
    }
  }
  if (m.act_out && act_codes) {
    moe_store_permuted_bytes(m, ids.data(), act_code_pair.data(), I, m.act_out);
  } else if (m.act_out) {
    moe_store_permuted_rows(m, ids.data(), act_pair.data(), I, m.act_out);
  }
  if (m.permuted_out) {  // do_finalize=False: the unweighted rows, permuted
    moe_store_permuted(m, ids.data(), y.data());
    return;
  }
  // Finalize: the routing-weighted sum over k in k order, fp32, rounded once to out_dtype.
  std::vector<float> acc(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t pair = t * K + k;
      if (!local[static_cast<size_t>(pair)]) continue;
      const float s = w[static_cast<size_t>(pair)];
      for (int64_t c = 0; c < H; ++c) {
        acc[static_cast<size_t>(c)] += s * y[static_cast<size_t>(pair * H + c)];
      }
    }
    for (int64_t c = 0; c < H; ++c) {
      const float v = acc[static_cast<size_t>(c)];
      const int64_t i = t * m.out_stride + c;
      if (m.out_dtype == DType::kFloat32) {
        static_cast<float*>(m.out)[i] = v;
      } else if (m.out_dtype == DType::kFloat16) {
        static_cast<uint16_t*>(m.out)[i] = float_to_half_bits(v);
      } else {
        static_cast<uint16_t*>(m.out)[i] = float_to_bfloat16_bits(v);
      }
    }
  }
}

}  // namespace flashinfer::kernels::cpu
