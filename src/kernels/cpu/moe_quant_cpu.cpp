#include "kernels/cpu/moe_quant_cpu.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "flashinfer/float_formats.h"
#include "kernels/cpu/moe_cpu.h"

namespace flashinfer::kernels::cpu {
namespace {

float bf16_round(float v) { return bfloat16_bits_to_float(float_to_bfloat16_bits(v)); }

// DeepSeek FP8's activation kernel hands GEMM2 an e4m3 activation with one fp32 scale per
// (row, 128 columns): scale = max(amax / 448, FLT_MIN), q = e4m3(h / scale), RNE and satfinite
// (docs/MOE.md "FP8 block scale"). h becomes the dequantized q * scale that GEMM2 reads.
// `codes`, when given, receives the e4m3 codes (the activation a LoRA delta's caller gets back).
void fp8_quantize_per_128(float* h, int64_t n, uint8_t* codes = nullptr) {
  for (int64_t b = 0; b < n; b += 128) {
    const int64_t end = std::min(n, b + 128);
    float amax = 0.0f;
    for (int64_t j = b; j < end; ++j) amax = std::max(amax, std::fabs(h[j]));
    const float scale = std::max(amax / 448.0f, std::numeric_limits<float>::min());
    for (int64_t j = b; j < end; ++j) {
      const uint8_t q = float_to_e4m3fn_bits(h[j] / scale, /*saturate=*/true);
      if (codes) codes[j] = q;
      h[j] = e4m3fn_bits_to_float(q) * scale;
    }
  }
}

float fp8(const uint8_t* base, int64_t i) { return e4m3fn_bits_to_float(base[i]); }

// Dequantized fp32 copy of one expert's [rows, cols] fp8 matrix: DeepSeek block scales
// ([rows / 128, cols / 128]) or none (per-tensor: the scales apply to the GEMM outputs).
std::vector<float> dequant_weights(const uint8_t* w, const float* scale, int64_t rows,
                                   int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  const int64_t sc = cols / 128;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float s = scale ? scale[(r / 128) * sc + c / 128] : 1.0f;
      out[static_cast<size_t>(r * cols + c)] = fp8(w, r * cols + c) * s;
    }
  }
  return out;
}

// c[m, n] = a[m, k] @ b[n, k]^T in fp32.
void sgemm_nt(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, a, static_cast<int>(k), b, static_cast<int>(k), 0.0f, c,
              static_cast<int>(n));
}

}  // namespace

void trtllm_fp8_moe(const TrtllmFp8MoeParams& p) {
  const CutlassMoeParams& m = p.base.moe;
  const int64_t T = m.num_tokens, K = m.top_k, H = m.hidden, I = m.inter;
  const int64_t E = m.num_local_experts;
  const bool gated = moe_act_is_gated(m.act);
  const int64_t N1 = gated ? 2 * I : I;
  std::vector<int32_t> ids(static_cast<size_t>(T * K));
  std::vector<float> w(static_cast<size_t>(T * K));
  trtllm_route(p.base, ids.data(), w.data());  // the weights as the kernels keep them

  const auto* x = static_cast<const uint8_t*>(m.input);
  const auto* w1 = static_cast<const uint8_t*>(m.w1);
  const auto* w2 = static_cast<const uint8_t*>(m.w2);
  // DeepSeek FP8's gemm1_bias / gemm2_bias (fp32, plain rows) or null.
  const auto* b1 = static_cast<const float*>(m.b1);
  const auto* b2 = static_cast<const float*>(m.b2);
  // y[t * K + k]: the bf16-rounded GEMM2 output row of pair (t, k), for the pairs routed to a
  // local expert.
  std::vector<float> y(static_cast<size_t>(T * K * H), 0.0f);
  std::vector<char> local(static_cast<size_t>(T * K), 0);
  // The activation's e4m3 codes per pair, for a LoRA delta's returned activation (m.act_out).
  std::vector<uint8_t> act_codes(m.act_out ? static_cast<size_t>(T * K * I) : 0, 0);
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t> pairs;
    for (int64_t i = 0; i < T * K; ++i) {
      if (ids[static_cast<size_t>(i)] - m.expert_offset == e) pairs.push_back(i);
    }
    if (pairs.empty()) continue;
    const int64_t n = static_cast<int64_t>(pairs.size());
    // Gathered, dequantized inputs of the expert's rows.
    std::vector<float> a(static_cast<size_t>(n * H));
    for (int64_t r = 0; r < n; ++r) {
      const int64_t t = pairs[static_cast<size_t>(r)] / K;
      for (int64_t c = 0; c < H; ++c) {
        const float s = p.block_scale ? p.hs_scale[(c / 128) * p.hs_scale_stride + t] : 1.0f;
        a[static_cast<size_t>(r * H + c)] = fp8(x, t * m.in_stride + c) * s;
      }
    }
    const std::vector<float> w1e = dequant_weights(
        w1 + e * N1 * H, p.block_scale ? p.w1_scale + e * (N1 / 128) * (H / 128) : nullptr, N1, H);
    std::vector<float> g1(static_cast<size_t>(n * N1));
    sgemm_nt(a.data(), w1e.data(), g1.data(), n, N1, H);
    // Activation; per-tensor mode applies the GEMM1 output scales and quantizes the activation
    // to fp8 (the scale of the up half carries the activation's quantization scale).
    std::vector<float> h(static_cast<size_t>(n * I));
    std::vector<float> gv(static_cast<size_t>(N1));
    for (int64_t r = 0; r < n; ++r) {
      const int64_t pair = pairs[static_cast<size_t>(r)];
      // Llama4's scales on the input: cast to bf16 by upstream's launcher in every form.
      const float rw = p.routing_scales_on_input ? bf16_round(w[static_cast<size_t>(pair)]) : 1.0f;
      const float* g = g1.data() + r * N1;
      float* hr = h.data() + r * I;
      if (p.block_scale) {
        // The bias and the pair's LoRA delta join GEMM1's dequantized output before the
        // routing scale (upstream's reference order: bias, delta, routing scale, activation).
        const uint16_t* d = m.fc1_delta ? m.fc1_delta + (pair / K) * m.delta_stride_t +
                                              (pair % K) * m.delta_stride_k
                                        : nullptr;
        for (int64_t j = 0; j < N1; ++j) {
          gv[static_cast<size_t>(j)] =
              (g[j] + (b1 ? b1[e * N1 + j] : 0.0f) + (d ? bfloat16_bits_to_float(d[j]) : 0.0f)) *
              rw;
        }
        moe_activation_row(m, e, gv.data(), hr);
        fp8_quantize_per_128(hr, I, m.act_out ? act_codes.data() + pair * I : nullptr);
      } else {
        const float sg = p.out1_gate_scale[e], sc = p.out1_scale[e];
        if (m.act == MoeAct::kSwigluStep) {
          // On the raw accumulators (times Llama4's input scale), kernels/moe_params.h.
          for (int64_t j = 0; j < N1; ++j) gv[static_cast<size_t>(j)] = g[j] * rw;
          moe_trtllm_step_row(m, e, gv.data(), sc, sg, hr);
        } else if (gated) {
          for (int64_t j = 0; j < I; ++j) {
            gv[static_cast<size_t>(j)] = g[j] * sc * rw;          // up, in the fp8 domain
            gv[static_cast<size_t>(I + j)] = g[I + j] * sg * rw;  // gate, dequantized
          }
          moe_activation_row(m, e, gv.data(), hr);
        } else {
          for (int64_t j = 0; j < I; ++j) gv[static_cast<size_t>(j)] = g[j] * sg * rw;
          moe_activation_row(m, e, gv.data(), hr);
          for (int64_t j = 0; j < I; ++j) hr[j] *= sc;
        }
        for (int64_t j = 0; j < I; ++j) {
          hr[j] = e4m3fn_bits_to_float(float_to_e4m3fn_bits(hr[j], /*saturate=*/true));
        }
      }
    }
    const std::vector<float> w2e = dequant_weights(
        w2 + e * H * I, p.block_scale ? p.w2_scale + e * (H / 128) * (I / 128) : nullptr, H, I);
    std::vector<float> g2(static_cast<size_t>(n * H));
    sgemm_nt(h.data(), w2e.data(), g2.data(), n, H, I);
    const float s2 = p.block_scale ? 1.0f : p.out2_scale[e];
    for (int64_t r = 0; r < n; ++r) {
      const int64_t pair = pairs[static_cast<size_t>(r)];
      local[static_cast<size_t>(pair)] = 1;
      for (int64_t c = 0; c < H; ++c) {
        y[static_cast<size_t>(pair * H + c)] =
            bf16_round(g2[static_cast<size_t>(r * H + c)] * s2 + (b2 ? b2[e * H + c] : 0.0f));
      }
    }
  }
  if (m.act_out) moe_store_permuted_bytes(m, ids.data(), act_codes.data(), I, m.act_out);
  if (m.permuted_out) {  // do_finalize=False: the unweighted rows, permuted
    moe_store_permuted(m, ids.data(), y.data());
    return;
  }
  // Finalize: the routing-weighted sum over k in k order (weight 1 when the routing scale was
  // applied on the input), fp32, rounded once to bf16.
  auto* out = static_cast<uint16_t*>(m.out);
  std::vector<float> acc(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t pair = t * K + k;
      if (!local[static_cast<size_t>(pair)]) continue;
      const float s = p.routing_scales_on_input ? 1.0f : w[static_cast<size_t>(pair)];
      for (int64_t c = 0; c < H; ++c) {
        acc[static_cast<size_t>(c)] += s * y[static_cast<size_t>(pair * H + c)];
      }
    }
    for (int64_t c = 0; c < H; ++c) {
      out[t * m.out_stride + c] = float_to_bfloat16_bits(acc[static_cast<size_t>(c)]);
    }
  }
}

void trtllm_gen_routing(const TrtllmGenRoutingParams& p) {
  const int64_t T = p.routing.num_tokens, K0 = p.routing.top_k, S = p.num_shared;
  const int64_t K = K0 + S, L = p.local_num_experts + S, tile = p.tile;
  std::vector<int32_t> ids(static_cast<size_t>(T * K));
  std::vector<float> w(static_cast<size_t>(T * K));
  {
    std::vector<int32_t> rid(static_cast<size_t>(T * K0));
    std::vector<float> rw(static_cast<size_t>(T * K0));
    moe_routing(p.routing, rid.data(), rw.data());
    // Fused shared experts: S slots appended per token, expert num_experts + s at weight 1.0.
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const size_t o = static_cast<size_t>(t * K + k), r = static_cast<size_t>(t * K0 + k);
        ids[o] = k < K0 ? rid[r] : static_cast<int32_t>(p.routing.num_experts + (k - K0));
        w[o] = k < K0 ? rw[r] : 1.0f;
      }
    }
  }
  // Pairs per local expert in token-major, k-minor order; each expert's block padded to a
  // multiple of the tile, blocks in expert order (upstream's routing_reference).
  std::vector<int64_t> count(static_cast<size_t>(L), 0), rank(static_cast<size_t>(T * K), -1);
  for (int64_t i = 0; i < T * K; ++i) {
    const int64_t e = ids[static_cast<size_t>(i)] - p.local_expert_offset;
    if (e >= 0 && e < L) rank[static_cast<size_t>(i)] = count[static_cast<size_t>(e)]++;
  }
  std::vector<int64_t> offset(static_cast<size_t>(L + 1), 0);
  for (int64_t e = 0; e < L; ++e) {
    const int64_t c = count[static_cast<size_t>(e)];
    offset[static_cast<size_t>(e + 1)] =
        offset[static_cast<size_t>(e)] + (c + tile - 1) / tile * tile;
  }
  std::fill(p.permuted_to_token, p.permuted_to_token + p.max_padded, -1);
  std::fill(p.cta_to_batch, p.cta_to_batch + p.max_ctas, -1);
  std::fill(p.cta_to_mn_limit, p.cta_to_mn_limit + p.max_ctas, -1);
  for (int64_t i = 0; i < T * K; ++i) {
    p.topk_weights[i] = float_to_bfloat16_bits(w[static_cast<size_t>(i)]);
    const int64_t r = rank[static_cast<size_t>(i)];
    if (r < 0) {
      p.expanded_to_permuted[i] = -1;
      p.topk_ids[i] = -1;
      continue;
    }
    const int64_t e = ids[static_cast<size_t>(i)] - p.local_expert_offset;
    const int64_t slot = offset[static_cast<size_t>(e)] + r;
    p.expanded_to_permuted[i] = static_cast<int32_t>(slot);
    p.permuted_to_token[slot] = static_cast<int32_t>(i / K);
    p.topk_ids[i] = ids[static_cast<size_t>(i)];
  }
  int64_t cta = 0;
  for (int64_t e = 0; e < L; ++e) {
    const int64_t c = count[static_cast<size_t>(e)], base = offset[static_cast<size_t>(e)];
    for (int64_t j = 0; j * tile < c; ++j, ++cta) {
      p.cta_to_batch[cta] = static_cast<int32_t>(e);
      p.cta_to_mn_limit[cta] = static_cast<int32_t>(base + std::min((j + 1) * tile, c));
    }
  }
  p.total_padded[0] = static_cast<int32_t>(offset[static_cast<size_t>(L)]);
  p.num_ctas[0] = static_cast<int32_t>(cta);
}

}  // namespace flashinfer::kernels::cpu
