#include "kernels/cpu/moe_cpu.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"
#include "kernels/cpu/elem_io.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/gemm_params.h"

namespace flashinfer::kernels::cpu {
namespace {

using elem_io::load_strict;
using elem_io::store_strict;

// Elements below which a loop stays serial: a parallel region costs more than the work (and
// far more on a loaded machine, where each region waits for its threads to be scheduled).
constexpr int64_t kParallelMin = int64_t{1} << 16;

int64_t expert_id(const CutlassMoeParams& p, int64_t t, int64_t k) {
  const int64_t i = t * p.experts_stride + k;
  return p.experts_dtype == DType::kInt64 ? static_cast<const int64_t*>(p.experts)[i]
                                          : static_cast<const int32_t*>(p.experts)[i];
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }
// CUTLASS's GELU_taylor (upstream's GegluTanh: GLUAdaptor<GELU_taylor>).
float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * x * (1.0f + 0.044715f * x * x)));
}
// Upstream's SituAdaptor evaluates tanh as 2 * sigmoid(2z) - 1 (docs/MOE.md).
float tanh_via_sigmoid(float z) { return 2.0f / (1.0f + std::exp(-2.0f * z)) - 1.0f; }

// out[m, n] = a[m, k] @ w[n, k]^T, all contiguous, fp32 accumulation, rounded once to out_dtype
// (no bias: upstream adds the biases after this rounding, see cutlass_moe). The half-precision
// cases go through the library's GEMM kernel (the one mm_bf16 uses); anything involving fp32
// converts to fp32 and calls OpenBLAS directly.
void rows_gemm(const void* a, const void* w, DType dt, void* out, DType out_dt, int64_t m,
               int64_t n, int64_t k) {
  if (dt != DType::kFloat32 && out_dt != DType::kFloat32) {
    GemmParams g;
    g.a = a;
    g.a_dtype = dt;
    g.a_stride_m = k;
    g.a_stride_k = 1;
    g.b = w;
    g.b_dtype = dt;
    g.b_stride_k = 1;
    g.b_stride_n = k;
    g.out = out;
    g.out_dtype = out_dt;
    g.out_stride_m = n;
    g.out_stride_n = 1;
    g.m = m;
    g.n = n;
    g.k = k;
    gemm(g);
    return;
  }
  std::vector<float> af, wf;
  const float* ap = static_cast<const float*>(a);
  const float* wp = static_cast<const float*>(w);
  if (dt != DType::kFloat32) {
    af.resize(static_cast<size_t>(m * k));
    wf.resize(static_cast<size_t>(n * k));
    for (int64_t i = 0; i < m * k; ++i) af[static_cast<size_t>(i)] = load_strict(a, dt, i);
    for (int64_t i = 0; i < n * k; ++i) wf[static_cast<size_t>(i)] = load_strict(w, dt, i);
    ap = af.data();
    wp = wf.data();
  }
  std::vector<float> c(static_cast<size_t>(m * n));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, ap, static_cast<blasint>(k),
              wp, static_cast<blasint>(k), 0.0f, c.data(), static_cast<blasint>(n));
  for (int64_t i = 0; i < m * n; ++i) store_strict(out, out_dt, i, c[static_cast<size_t>(i)]);
}

}  // namespace

void moe_trtllm_step_row(const CutlassMoeParams& p, int64_t e, const float* raw, float sc, float sg,
                         float* h) {
  const int64_t I = p.inter;
  const float L = trtllm_step_limit(p.swiglu_limit, e, sg);
  for (int64_t j = 0; j < I; ++j)
    h[j] = trtllm_swiglu_step(raw[j], silu(raw[I + j] * sg), L, sc, sg);
}

void moe_activation_row(const CutlassMoeParams& p, int64_t e, const float* g1, float* h) {
  const int64_t I = p.inter;
  const bool biased = p.swiglu_alpha || p.swiglu_beta || p.swiglu_limit;
  switch (p.act) {
    case MoeAct::kSwiglu:
    case MoeAct::kSwigluBias:
      if (p.act == MoeAct::kSwiglu && !biased) {
        for (int64_t j = 0; j < I; ++j) h[j] = silu(g1[I + j]) * g1[j];
      } else {
        // Upstream's defaults: alpha 1, beta 0, limit = float max.
        const float alpha = p.swiglu_alpha ? p.swiglu_alpha[e] : 1.0f;
        const float beta = p.swiglu_beta ? p.swiglu_beta[e] : 0.0f;
        const float limit = p.swiglu_limit ? p.swiglu_limit[e] : std::numeric_limits<float>::max();
        for (int64_t j = 0; j < I; ++j) {
          const float g = std::min(g1[I + j], limit);
          const float u = std::clamp(g1[j], -limit, limit) + beta;
          h[j] = g / (1.0f + std::exp(-alpha * g)) * u;
        }
      }
      return;
    case MoeAct::kSwigluStep: {
      const float limit = p.swiglu_limit ? p.swiglu_limit[e] : 7.0f;
      for (int64_t j = 0; j < I; ++j) {
        h[j] = std::min(silu(g1[I + j]), limit) * std::clamp(g1[j], -limit, limit);
      }
      return;
    }
    case MoeAct::kGeglu:
      for (int64_t j = 0; j < I; ++j) h[j] = gelu_erf(g1[I + j]) * g1[j];
      return;
    case MoeAct::kGelu:
      for (int64_t j = 0; j < I; ++j) h[j] = gelu_erf(g1[j]);
      return;
    case MoeAct::kRelu:
      for (int64_t j = 0; j < I; ++j) h[j] = std::max(g1[j], 0.0f);
      return;
    case MoeAct::kRelu2:
      for (int64_t j = 0; j < I; ++j) {
        const float r = std::max(g1[j], 0.0f);
        h[j] = r * r;
      }
      return;
    case MoeAct::kSilu:
      for (int64_t j = 0; j < I; ++j) h[j] = silu(g1[j]);
      return;
    case MoeAct::kClampedRelu2: {
      // Upstream's ClampedRelu2 epilogue order: relu, times 1 / L, tanh, times L, squared.
      const float L = p.clamped_relu2_limit[0], inv = 1.0f / L;
      for (int64_t j = 0; j < I; ++j) {
        const float c = std::tanh(std::max(g1[j], 0.0f) * inv) * L;
        h[j] = c * c;
      }
      return;
    }
    case MoeAct::kIdentity:
      for (int64_t j = 0; j < I; ++j) h[j] = g1[j];
      return;
    case MoeAct::kGegluTanh:
      for (int64_t j = 0; j < I; ++j) h[j] = gelu_tanh(g1[I + j]) * g1[j];
      return;
    case MoeAct::kSitu: {
      // Upstream's defaults 4 and 25 (DEFAULT_SITU_BETA / DEFAULT_SITU_LINEAR_BETA).
      const float beta = p.situ_beta ? p.situ_beta[e] : 4.0f;
      const float lbeta = p.situ_linear_beta ? p.situ_linear_beta[e] : 25.0f;
      for (int64_t j = 0; j < I; ++j) {
        const float g = g1[I + j], u = g1[j];
        const float gate = beta * tanh_via_sigmoid(g / beta) / (1.0f + std::exp(-g));
        h[j] = gate * (p.situ_clamp_up ? lbeta * tanh_via_sigmoid(u / lbeta) : u);
      }
      return;
    }
  }
  FLASHINFER_FAIL(ErrorCode::kUnsupported, "cutlass_fused_moe", "activation_type", "activation ",
                  static_cast<int>(p.act), " is not implemented on the CPU");
}

void moe_keep_rows(const MoeKeepRowsParams& p) {
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    if (moe_token_has_local_expert(p, t)) continue;
    std::memcpy(static_cast<char*>(p.out) + t * p.out_stride,
                static_cast<const char*>(p.before) + t * p.before_stride,
                static_cast<std::size_t>(p.row_bytes));
  }
}

void cutlass_moe(const CutlassMoeParams& p) {
  const int64_t T = p.num_tokens, K = p.top_k, H = p.hidden, I = p.inter;
  FLASHINFER_CHECK(!(p.act_out || p.permuted_out) || p.expanded_to_permuted != nullptr,
                   "cutlass_moe", "expanded_to_permuted",
                   "host-side bug: permuted outputs without their map");
  const int64_t N1 = moe_act_is_gated(p.act) ? 2 * I : I;
  const int64_t E = p.num_local_experts;
  const size_t es = dtype_size(p.dtype), oes = dtype_size(p.out_dtype);

  // Group the (token, k) pairs by local expert (counting sort: pairs of one expert keep token
  // order). slot[t * K + k] is the pair's row in the grouped order, or -1 when not local.
  std::vector<int64_t> count(static_cast<size_t>(E + 1), 0);
  std::vector<int64_t> local(static_cast<size_t>(T * K), -1);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = expert_id(p, t, k) - p.expert_offset;
      if (e >= 0 && e < E) {
        local[static_cast<size_t>(t * K + k)] = e;
        ++count[static_cast<size_t>(e + 1)];
      }
    }
  }
  for (int64_t e = 0; e < E; ++e)
    count[static_cast<size_t>(e + 1)] += count[static_cast<size_t>(e)];
  const int64_t rows = count[static_cast<size_t>(E)];
  std::vector<int64_t> row_pair(static_cast<size_t>(rows));
  std::vector<int64_t> slot(static_cast<size_t>(T * K), -1);
  {
    std::vector<int64_t> next(count.begin(), count.end() - 1);
    for (int64_t i = 0; i < T * K; ++i) {
      const int64_t e = local[static_cast<size_t>(i)];
      if (e < 0) continue;
      const int64_t r = next[static_cast<size_t>(e)]++;
      row_pair[static_cast<size_t>(r)] = i;
      slot[static_cast<size_t>(i)] = r;
    }
  }

  // Per-row buffers for all local pairs, in grouped order: gathered input, GEMM1 output,
  // activation, GEMM2 output (out_dtype). Sized by routed rows, never by T * num_experts.
  std::unique_ptr<uint8_t[]> xg(new uint8_t[static_cast<size_t>(rows * H) * es]);
  const DType g1_dt = p.round_gemm1 ? p.dtype : DType::kFloat32;
  const size_t g1es = dtype_size(g1_dt);
  std::unique_ptr<uint8_t[]> g1(new uint8_t[static_cast<size_t>(rows * N1) * g1es]);
  std::unique_ptr<uint8_t[]> hb(new uint8_t[static_cast<size_t>(rows * I) * es]);
  std::unique_ptr<uint8_t[]> y(new uint8_t[static_cast<size_t>(rows * H) * oes]);
  const auto* in = static_cast<const uint8_t*>(p.input);
#pragma omp parallel for schedule(static) if (rows * H >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = row_pair[static_cast<size_t>(r)] / K;
    std::memcpy(xg.get() + static_cast<size_t>(r * H) * es,
                in + static_cast<size_t>(t * p.in_stride) * es, static_cast<size_t>(H) * es);
  }

  // GEMM1 of every expert, then one activation pass over all routed rows, then GEMM2 of every
  // expert: three parallel passes besides the GEMMs, whatever the number of experts.
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = count[static_cast<size_t>(e)], n = count[static_cast<size_t>(e + 1)] - r0;
    if (n == 0) continue;
    const auto* w1 = static_cast<const uint8_t*>(p.w1) + static_cast<size_t>(e * N1 * H) * es;
    rows_gemm(xg.get() + static_cast<size_t>(r0 * H) * es, w1, p.dtype,
              g1.get() + static_cast<size_t>(r0 * N1) * g1es, g1_dt, n, N1, H);
  }
#pragma omp parallel if (rows * N1 >= kParallelMin)
  {
    std::vector<float> gf(static_cast<size_t>(N1)), hf(static_cast<size_t>(I));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t e = local[static_cast<size_t>(row_pair[static_cast<size_t>(r)])];
      const void* src = g1.get() + static_cast<size_t>(r * N1) * g1es;
      for (int64_t j = 0; j < N1; ++j) {
        // The fc1 bias joins the stored (rounded) GEMM1 value in fp32, as doActivationKernel.
        gf[static_cast<size_t>(j)] =
            load_strict(src, g1_dt, j) + (p.b1 ? load_strict(p.b1, p.dtype, e * N1 + j) : 0.0f);
      }
      if (p.fc1_delta) {
        // The LoRA delta of the pair, after the bias (upstream's reference order).
        const int64_t pair = row_pair[static_cast<size_t>(r)];
        const uint16_t* d =
            p.fc1_delta + (pair / K) * p.delta_stride_t + (pair % K) * p.delta_stride_k;
        for (int64_t j = 0; j < N1; ++j) gf[static_cast<size_t>(j)] += bfloat16_bits_to_float(d[j]);
      }
      moe_activation_row(p, e, gf.data(), hf.data());
      void* dst = hb.get() + static_cast<size_t>(r * I) * es;
      for (int64_t j = 0; j < I; ++j) store_strict(dst, p.dtype, j, hf[static_cast<size_t>(j)]);
    }
  }
  // The grouped order above is the permuted order (experts ascending, pairs ascending within an
  // expert): `rows` rows of `bytes` bytes from `src`, the rest of the T * K rows zeroed, and the
  // map of each pair to its row.
  auto store_permuted = [&](void* out, const uint8_t* src, size_t bytes) {
    auto* dst = static_cast<uint8_t*>(out);
    std::memcpy(dst, src, static_cast<size_t>(rows) * bytes);
    std::memset(dst + static_cast<size_t>(rows) * bytes, 0,
                static_cast<size_t>(T * K - rows) * bytes);
    for (int64_t i = 0; i < T * K; ++i) {
      p.expanded_to_permuted[i] = static_cast<int32_t>(slot[static_cast<size_t>(i)]);
    }
  };
  // The activation (the trtllm ops' gemm1_output with a LoRA delta).
  if (p.act_out) store_permuted(p.act_out, hb.get(), static_cast<size_t>(I) * es);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = count[static_cast<size_t>(e)], n = count[static_cast<size_t>(e + 1)] - r0;
    if (n == 0) continue;
    const auto* w2 = static_cast<const uint8_t*>(p.w2) + static_cast<size_t>(e * H * I) * es;
    rows_gemm(hb.get() + static_cast<size_t>(r0 * I) * es, w2, p.dtype,
              y.get() + static_cast<size_t>(r0 * H) * oes, p.out_dtype, n, H, I);
  }

  if (p.permuted_out) {
    // do_finalize=False: `y` is already bf16 (the trtllm ops' out_dtype).
    store_permuted(p.permuted_out, y.get(), static_cast<size_t>(H) * oes);
    return;
  }

  // Finalize (finalizeMoeRoutingKernel): sum over k in k order of scale * (y + b2), fp32, rounded
  // once. p.b2 is null on tensor-parallel ranks other than 0 (the API layer drops it there).
#pragma omp parallel if (T * K * H >= kParallelMin)
  {
    std::vector<float> acc(static_cast<size_t>(H));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k = 0; k < K; ++k) {
        const int64_t r = slot[static_cast<size_t>(t * K + k)];
        if (r < 0) continue;
        const float s = load_strict(p.scales, p.scales_dtype, t * p.scales_stride + k);
        const void* yr = y.get() + static_cast<size_t>(r * H) * oes;
        const int64_t e = local[static_cast<size_t>(t * K + k)];
        for (int64_t j = 0; j < H; ++j) {
          const float b = p.b2 ? load_strict(p.b2, p.dtype, e * H + j) : 0.0f;
          acc[static_cast<size_t>(j)] += s * (load_strict(yr, p.out_dtype, j) + b);
        }
      }
      for (int64_t j = 0; j < H; ++j) {
        store_strict(p.out, p.out_dtype, t * p.out_stride + j, acc[static_cast<size_t>(j)]);
      }
    }
  }
}

void deepseek_routing(const DeepSeekRoutingParams& p) {
  const int64_t E = p.num_experts, G = p.n_group, per_group = E / G;
#pragma omp parallel if (p.num_tokens * E * p.topk >= kParallelMin)
  {
    std::vector<float> s(static_cast<size_t>(E)), b(static_cast<size_t>(E));
    std::vector<float> group_score(static_cast<size_t>(G));
    std::vector<char> group_kept(static_cast<size_t>(G)), taken(static_cast<size_t>(E));
    std::vector<int64_t> sel(static_cast<size_t>(p.topk));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      for (int64_t e = 0; e < E; ++e) {
        const float x = load_strict(p.scores, p.scores_dtype, t * p.scores_stride + e);
        const float sg = 1.0f / (1.0f + std::exp(-x));
        s[static_cast<size_t>(e)] = sg;
        b[static_cast<size_t>(e)] = sg + load_strict(p.bias, p.bias_dtype, e * p.bias_stride);
      }
      // Groups: the sum of each group's two largest biased scores; keep the best topk_group
      // (ties: the lower group index).
      std::fill(group_kept.begin(), group_kept.end(), G == 1 ? 1 : 0);
      if (G > 1) {
        for (int64_t g = 0; g < G; ++g) {
          float m1 = -std::numeric_limits<float>::infinity(), m2 = m1;
          for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
            const float v = b[static_cast<size_t>(e)];
            if (v > m1) {
              m2 = m1;
              m1 = v;
            } else if (v > m2) {
              m2 = v;
            }
          }
          group_score[static_cast<size_t>(g)] = per_group >= 2 ? m1 + m2 : m1;
        }
        for (int64_t i = 0; i < p.topk_group; ++i) {
          int64_t best = -1;
          for (int64_t g = 0; g < G; ++g) {
            if (group_kept[static_cast<size_t>(g)]) continue;
            if (best < 0 ||
                group_score[static_cast<size_t>(g)] > group_score[static_cast<size_t>(best)]) {
              best = g;
            }
          }
          group_kept[static_cast<size_t>(best)] = 1;
        }
      }
      // Experts: the topk largest biased scores among the kept groups, descending.
      std::fill(taken.begin(), taken.end(), 0);
      float sum = 0.0f;
      for (int64_t i = 0; i < p.topk; ++i) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; ++e) {
          if (taken[static_cast<size_t>(e)] || !group_kept[static_cast<size_t>(e / per_group)]) {
            continue;
          }
          if (best < 0 || b[static_cast<size_t>(e)] > b[static_cast<size_t>(best)]) best = e;
        }
        taken[static_cast<size_t>(best)] = 1;
        sel[static_cast<size_t>(i)] = best;
        sum += s[static_cast<size_t>(best)];
      }
      const float denom = sum + 1e-20f;
      for (int64_t i = 0; i < p.topk; ++i) {
        const int64_t e = sel[static_cast<size_t>(i)];
        store_strict(p.topk_values, p.values_dtype, t * p.values_stride + i,
                     s[static_cast<size_t>(e)] / denom * p.routed_scaling_factor);
        p.topk_indices[t * p.indices_stride + i] = static_cast<int32_t>(e);
        if (p.replay_out) p.replay_out[t * p.replay_stride + i] = static_cast<int16_t>(e);
      }
    }
  }
}

void hash_topk(const HashTopkParams& p) {
  // Validated first, serially, so a bad id is an error and never an out-of-bounds read.
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t v = p.input_ids[t * p.ids_stride];
    FLASHINFER_CHECK(v >= 0 && v < p.vocab, "hash_topk", "input_ids", "token ", t, " has id ", v,
                     " outside the table's ", p.vocab, " rows");
    for (int64_t k = 0; k < p.topk; ++k) {
      const int64_t e = p.tid2eid[v * p.table_stride + k];
      FLASHINFER_CHECK(e >= 0 && e < p.num_experts, "hash_topk", "tid2eid", "row ", v,
                       " holds expert ", e, " outside [0, ", p.num_experts, ")");
    }
  }
  const int64_t width = p.topk + p.num_shared;
#pragma omp parallel for schedule(static) if (p.num_tokens * p.topk >= kParallelMin)
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t v = p.input_ids[t * p.ids_stride];
    float* w = p.weights + t * width;
    int32_t* ids = p.topk_ids + t * width;
    float sum = 0.0f;
    for (int64_t k = 0; k < p.topk; ++k) {
      const int32_t e = p.tid2eid[v * p.table_stride + k];
      const float x = p.logits[t * p.logits_stride + e];
      // softplus with torch's threshold: x itself above 20.
      const float sp = x > 20.0f ? x : std::log1p(std::exp(x));
      w[k] = std::sqrt(sp);
      ids[k] = e;
      sum += w[k];
    }
    for (int64_t k = 0; k < p.topk; ++k) w[k] /= sum;
    if (p.num_shared > 0) {
      w[p.topk] = 1.0f / p.routed_scaling_factor;
      ids[p.topk] = static_cast<int32_t>(p.num_experts);
    }
  }
}

void moe_routing(const MoeRoutingParams& p, int32_t* ids, float* weights) {
  const int64_t E = p.num_experts, K = p.top_k;
  const int64_t G = std::max<int64_t>(p.n_group, 1), per_group = E / G;
  const int64_t TG = p.method == MoeRouting::kDeepSeekV3 && G > 1 ? p.topk_group : G;
#pragma omp parallel if (p.num_tokens * E * K >= kParallelMin)
  {
    std::vector<float> x(static_cast<size_t>(E)), sel_score(static_cast<size_t>(E));
    std::vector<float> gscore(static_cast<size_t>(G));
    std::vector<char> kept(static_cast<size_t>(G)), taken(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      for (int64_t e = 0; e < E; ++e) {
        x[static_cast<size_t>(e)] = load_strict(p.logits, p.logits_dtype, t * p.logits_stride + e);
      }
      // The score each method selects by, and the score its weights come from (`x` after the
      // pre-selection transform).
      float mx = -std::numeric_limits<float>::infinity(), denom = 0.0f;
      switch (p.method) {
        case MoeRouting::kDefault:
        case MoeRouting::kRenormalizeNaive:
          for (float v : x) mx = std::max(mx, v);
          for (float& v : x) {
            v = std::exp(v - mx);
            denom += v;
          }
          for (float& v : x) v /= denom;
          break;
        case MoeRouting::kDeepSeekV3:
        case MoeRouting::kSigmoidRenorm:
        case MoeRouting::kMiniMax2:
        case MoeRouting::kSigmoid:
          for (float& v : x) v = 1.0f / (1.0f + std::exp(-v));
          break;
        default:
          break;  // Renormalize, Llama4, TopK select by the raw logits
      }
      const bool biased =
          p.bias && (p.method == MoeRouting::kDeepSeekV3 || p.method == MoeRouting::kMiniMax2);
      for (int64_t e = 0; e < E; ++e) {
        sel_score[static_cast<size_t>(e)] =
            x[static_cast<size_t>(e)] +
            (biased ? moe_routing_bias(p.method, p.n_group, load_strict(p.bias, p.bias_dtype, e))
                    : 0.0f);
      }
      std::fill(kept.begin(), kept.end(), 1);
      if (TG < G) {
        std::fill(kept.begin(), kept.end(), 0);
        for (int64_t g = 0; g < G; ++g) {
          float m1 = -std::numeric_limits<float>::infinity(), m2 = m1;
          for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
            const float v = sel_score[static_cast<size_t>(e)];
            if (v > m1) {
              m2 = m1;
              m1 = v;
            } else if (v > m2) {
              m2 = v;
            }
          }
          gscore[static_cast<size_t>(g)] = per_group >= 2 ? m1 + m2 : m1;
        }
        for (int64_t i = 0; i < TG; ++i) {
          int64_t best = -1;
          for (int64_t g = 0; g < G; ++g) {
            if (kept[static_cast<size_t>(g)]) continue;
            if (best < 0 || gscore[static_cast<size_t>(g)] > gscore[static_cast<size_t>(best)]) {
              best = g;
            }
          }
          if (best < 0) break;  // unreachable: topk_group <= n_group (checked)
          kept[static_cast<size_t>(best)] = 1;
        }
      }
      std::fill(taken.begin(), taken.end(), 0);
      int32_t* id = ids + t * K;
      float* w = weights + t * K;
      for (int64_t i = 0; i < K; ++i) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; ++e) {
          // Groups matter only to grouped selection (TG < G: DeepSeekV3, E % G == 0 checked);
          // other methods ignore n_group (per_group may be 0 or leave a remainder there).
          if (taken[static_cast<size_t>(e)] ||
              (TG < G && !kept[static_cast<size_t>(e / per_group)])) {
            continue;
          }
          if (best < 0 ||
              sel_score[static_cast<size_t>(e)] > sel_score[static_cast<size_t>(best)]) {
            best = e;
          }
        }
        if (best < 0) best = 0;  // unreachable: the kept groups hold >= top_k experts (checked)
        taken[static_cast<size_t>(best)] = 1;
        id[i] = static_cast<int32_t>(best);
        w[i] = x[static_cast<size_t>(best)];
      }
      // Weights from the selected scores.
      float sum = 0.0f;
      for (int64_t i = 0; i < K; ++i) sum += w[i];
      switch (p.method) {
        case MoeRouting::kRenormalize: {
          float m = -std::numeric_limits<float>::infinity(), d = 0.0f;
          for (int64_t i = 0; i < K; ++i) m = std::max(m, w[i]);
          for (int64_t i = 0; i < K; ++i) {
            w[i] = std::exp(w[i] - m);
            d += w[i];
          }
          for (int64_t i = 0; i < K; ++i) w[i] /= d;
          break;
        }
        case MoeRouting::kLlama4:
        case MoeRouting::kTopKSigmoid:  // selected on the raw logits, then squashed
          for (int64_t i = 0; i < K; ++i) w[i] = 1.0f / (1.0f + std::exp(-w[i]));
          break;
        case MoeRouting::kRenormalizeNaive:
          for (int64_t i = 0; i < K; ++i) w[i] /= sum;
          break;
        case MoeRouting::kSigmoidRenorm:
          // Upstream's SumNormalize floors the denominator at 1e-20 (RoutingCustomPolicy.cuh).
          if (p.norm_topk_prob) {
            for (int64_t i = 0; i < K; ++i) w[i] /= std::max(sum, 1e-20f);
          }
          break;
        case MoeRouting::kDeepSeekV3:
          for (int64_t i = 0; i < K; ++i) w[i] = w[i] * p.routed_scaling_factor / (sum + 1e-20f);
          break;
        case MoeRouting::kMiniMax2:
          // Upstream's Routing::Runner sets routeScale = routed_scaling_factor for MiniMax2
          // (ScaledSumNormalize: sigmoid * routeScale / (sum + 1e-20)).
          for (int64_t i = 0; i < K; ++i) {
            w[i] = w[i] * p.routed_scaling_factor / (sum + 1e-20f);
          }
          break;
        default:
          break;  // Default, TopK, Sigmoid: the selected scores as they are
      }
    }
  }
}

void trtllm_route(const TrtllmMoeParams& p, int32_t* ids, float* w, bool round_weights) {
  const int64_t T = p.routing.num_tokens, K = p.routing.top_k;
  if (p.num_shared > 0) {
    // The routed slots as without shared experts (routing_replay_out gets those only), then
    // the S shared slots appended per token.
    TrtllmMoeParams routed = p;
    routed.num_shared = 0;
    routed.expert_weights_out = nullptr;
    std::vector<int32_t> rid(static_cast<size_t>(T * K));
    std::vector<float> rw(static_cast<size_t>(T * K));
    trtllm_route(routed, rid.data(), rw.data(), round_weights);
    const int64_t S = p.num_shared, KS = K + S;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < KS; ++k) {
        const size_t o = static_cast<size_t>(t * KS + k), r = static_cast<size_t>(t * K + k);
        ids[o] = k < K ? rid[r] : static_cast<int32_t>(p.routing.num_experts + (k - K));
        w[o] = k < K ? rw[r] : 1.0f;
      }
    }
    // do_finalize=False: the launcher's expert_weights are [T, top_k + S] (shared slots 1.0).
    if (p.expert_weights_out) {
      for (int64_t i = 0; i < T * KS; ++i) p.expert_weights_out[i] = float_to_bfloat16_bits(w[i]);
    }
    return;
  }
  if (!p.precomputed) {
    moe_routing(p.routing, ids, w);
  } else {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const size_t o = static_cast<size_t>(t * K + k);
        const int64_t i = t * p.routed_stride + k;
        if (p.packed) {
          const uint32_t v = static_cast<uint32_t>(p.packed[i]);
          ids[o] = static_cast<int32_t>(v >> 16);
          w[o] = bfloat16_bits_to_float(static_cast<uint16_t>(v & 0xFFFFu));
        } else {
          ids[o] = p.ids[i];
          w[o] = load_strict(p.weights, p.weights_dtype, i);
        }
      }
    }
  }
  // The routing kernels write the expert weights as bf16 (mDtypeOutput = Bfloat16 for every
  // method in upstream's Routing::Runner), and the launchers keep them so, but for fp32 weights
  // given as the (ids, weights) pair.
  if (round_weights && trtllm_weights_in_bf16(p)) {
    for (int64_t i = 0; i < T * K; ++i) w[i] = bfloat16_bits_to_float(float_to_bfloat16_bits(w[i]));
  }
  if (p.expert_weights_out) {
    for (int64_t i = 0; i < T * K; ++i) p.expert_weights_out[i] = float_to_bfloat16_bits(w[i]);
  }
  if (p.replay_out) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        p.replay_out[t * p.replay_stride + k] = static_cast<int16_t>(ids[t * K + k]);
      }
    }
  }
}

namespace {

// The permuted order of the trtllm ops (local experts ascending, pairs ascending within one):
// writes m.expanded_to_permuted (-1 for a pair with no local expert) and calls put(pair, row)
// for each local pair. Returns the number of rows.
template <class Put>
int64_t permute_pairs(const CutlassMoeParams& m, const int32_t* ids, Put put) {
  const int64_t TK = m.num_tokens * m.top_k, E = m.num_local_experts;
  FLASHINFER_CHECK(m.expanded_to_permuted != nullptr, "trtllm_moe", "expanded_to_permuted",
                   "host-side bug: permuted rows without their map");
  int64_t row = 0;
  for (int64_t i = 0; i < TK; ++i) m.expanded_to_permuted[i] = -1;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = 0; i < TK; ++i) {
      if (ids[i] - m.expert_offset != e) continue;
      m.expanded_to_permuted[i] = static_cast<int32_t>(row);
      put(i, row++);
    }
  }
  return row;
}

}  // namespace

void moe_store_permuted_rows(const CutlassMoeParams& m, const int32_t* ids, const float* rows,
                             int64_t cols, void* out) {
  auto* dst = static_cast<uint16_t*>(out);
  const int64_t n = permute_pairs(m, ids, [&](int64_t pair, int64_t row) {
    for (int64_t c = 0; c < cols; ++c) {
      dst[row * cols + c] = float_to_bfloat16_bits(rows[pair * cols + c]);
    }
  });
  std::fill(dst + n * cols, dst + m.num_tokens * m.top_k * cols, uint16_t{0});
}

void moe_store_permuted_bytes(const CutlassMoeParams& m, const int32_t* ids, const uint8_t* rows,
                              int64_t row_bytes, void* out) {
  auto* dst = static_cast<uint8_t*>(out);
  const int64_t n = permute_pairs(m, ids, [&](int64_t pair, int64_t row) {
    std::memcpy(dst + row * row_bytes, rows + pair * row_bytes, static_cast<size_t>(row_bytes));
  });
  std::fill(dst + n * row_bytes, dst + m.num_tokens * m.top_k * row_bytes, uint8_t{0});
}

void moe_store_permuted(const CutlassMoeParams& m, const int32_t* ids, const float* y_pair) {
  moe_store_permuted_rows(m, ids, y_pair, m.hidden, m.permuted_out);
}

void trtllm_moe(const TrtllmMoeParams& p) {
  const int64_t T = p.routing.num_tokens, K = p.routing.top_k;
  std::vector<int32_t> ids(static_cast<size_t>(T * K));
  std::vector<float> w(static_cast<size_t>(T * K));
  trtllm_route(p, ids.data(), w.data());
  CutlassMoeParams m = p.moe;
  m.experts = ids.data();
  m.experts_dtype = DType::kInt32;
  m.experts_stride = K;
  m.scales = w.data();
  m.scales_dtype = DType::kFloat32;
  m.scales_stride = K;
  cutlass_moe(m);
}

}  // namespace flashinfer::kernels::cpu
