// CPU reference of cutlass_fused_moe's FP8 paths: the routed rows of each local expert only,
// grouped as the unquantized path groups them, fp32 accumulation, and the rounding points of
// upstream's CUTLASS MoE runner (docs/MOE.md, "cutlass_fused_moe: FP8 paths"). The quantizer,
// the block-scale promotion and the finalize step are kernels/moe_cutlass_fp8_rules.h's, shared
// with the CUDA kernels.
#include "kernels/cpu/moe_cutlass_fp8_cpu.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"
#include "kernels/cpu/elem_io.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cpu/moe_cpu.h"
#include "kernels/gemm_params.h"
#include "kernels/moe_cutlass_fp8_rules.h"

namespace flashinfer::kernels::cpu {
namespace {

constexpr int64_t kParallelMin = int64_t{1} << 16;
constexpr int64_t kBlock = kMoeFp8Block;  // both for weights and activations

float load_f(const void* base, DType dt, int64_t i) {
  return elem_io::load_strict(base, dt, i, "cutlass_fused_moe");
}
void store_f(void* base, DType dt, int64_t i, float v) {
  elem_io::store_strict(base, dt, i, v, "cutlass_fused_moe");
}

int64_t expert_id(const CutlassMoeParams& p, int64_t t, int64_t k) {
  const int64_t i = t * p.experts_stride + k;
  return p.experts_dtype == DType::kInt64 ? static_cast<const int64_t*>(p.experts)[i]
                                          : static_cast<const int32_t*>(p.experts)[i];
}

// c[m, n] = a[m, k] @ w[n, k]^T in fp32 (row strides lda / ldw, c dense).
void sgemm_nt(const float* a, int64_t lda, const float* w, int64_t ldw, float* c, int64_t m,
              int64_t n, int64_t k) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a, static_cast<blasint>(lda),
              w, static_cast<blasint>(ldw), 0.0f, c, static_cast<blasint>(n));
}

// out[m, n] = round_out(alpha * (a[m, k] @ w[n, k]^T)) with e4m3 a and w in their stored form,
// fp32 accumulation: the library's GEMM kernel (the one mm_fp8 uses), whose alpha multiplies
// the fp32 sum before the single rounding, as the CUTLASS epilogue does.
void fp8_gemm(const uint8_t* a, const uint8_t* w, const float* alpha, DType out_dt, void* out,
              int64_t m, int64_t n, int64_t k) {
  GemmParams g;
  g.a = a;
  g.a_dtype = DType::kFloat8E4M3FN;
  g.a_stride_m = k;
  g.a_stride_k = 1;
  g.b = w;
  g.b_dtype = DType::kFloat8E4M3FN;
  g.b_stride_k = 1;
  g.b_stride_n = k;
  g.out = out;
  g.out_dtype = out_dt;
  g.out_stride_m = n;
  g.out_stride_n = 1;
  g.b_scale = alpha;
  g.m = m;
  g.n = n;
  g.k = k;
  gemm(g);
}

// One expert's e4m3 weight [n, k] decoded to fp32 (exact).
std::vector<float> decode_weight(const void* w, int64_t e, int64_t n, int64_t k) {
  std::vector<float> out(static_cast<size_t>(n * k));
  const auto* codes = static_cast<const uint8_t*>(w) + static_cast<size_t>(e * n * k);
  for (int64_t i = 0; i < n * k; ++i) out[static_cast<size_t>(i)] = e4m3fn_bits_to_float(codes[i]);
  return out;
}

// out[m, n] (fp32) = GEMM of 1x128-quantized rows a (values aq, scales as [m, kb]) with a
// 128x128 block-scaled weight w [n, k] (values, scales ws [ceil(n/128), kb]): per K block the
// fp32 partial product, scaled by as * ws, accumulated in fp32 (DeepGEMM's promotion order).
void block_gemm(const float* aq, const float* as, const float* w, const float* ws, float* out,
                int64_t m, int64_t n, int64_t k) {
  const int64_t kb = (k + kBlock - 1) / kBlock;
  std::fill(out, out + m * n, 0.0f);
  std::vector<float> part(static_cast<size_t>(m * n));
  for (int64_t b = 0; b < kb; ++b) {
    const int64_t k0 = b * kBlock, kl = std::min(kBlock, k - k0);
    sgemm_nt(aq + k0, k, w + k0, k, part.data(), m, n, kl);
    for (int64_t i = 0; i < m; ++i) {
      const float sa = as[i * kb + b];
      for (int64_t j = 0; j < n; ++j) {
        out[i * n + j] = moe_fp8_block_accumulate(out[i * n + j], sa, ws[(j / kBlock) * kb + b],
                                                  part[static_cast<size_t>(i * n + j)]);
      }
    }
  }
}

}  // namespace

void quantize_1x128(const float* x, int64_t n, float* q, float* ds) {
  for (int64_t b = 0; b * kBlock < n; ++b) {
    const int64_t j0 = b * kBlock, j1 = std::min(n, j0 + kBlock);
    float amax = 0.0f;
    for (int64_t j = j0; j < j1; ++j) amax = fp32_abs_max(amax, x[j]);
    // Upstream's scale_1x128_kernel: quant = 448 / amax (1 for an all-zero block), the stored
    // dequantization scale is 1 / quant (not amax / 448), values cvt with saturation.
    const float quant = moe_fp8_block_quant(amax);
    ds[b] = moe_fp8_block_dequant(quant);
    for (int64_t j = j0; j < j1; ++j) q[j] = moe_e4m3_sat(fp32_mul(x[j], quant));
  }
}

namespace {

// The routed (token, k) pairs grouped by local expert, token order within an expert (counting
// sort): rows [count[e], count[e + 1]) are expert e's, row_pair[r] = t * K + k, slot[t * K + k]
// the pair's row (-1: not local), local[t * K + k] its local expert.
struct Grouping {
  std::vector<int64_t> count, local, row_pair, slot;
  int64_t rows = 0;
};

Grouping group_rows(const CutlassMoeParams& p) {
  const int64_t T = p.num_tokens, K = p.top_k, E = p.num_local_experts;
  Grouping g;
  g.count.assign(static_cast<size_t>(E + 1), 0);
  g.local.assign(static_cast<size_t>(T * K), -1);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = expert_id(p, t, k) - p.expert_offset;
      if (e >= 0 && e < E) {
        g.local[static_cast<size_t>(t * K + k)] = e;
        ++g.count[static_cast<size_t>(e + 1)];
      }
    }
  }
  for (int64_t e = 0; e < E; ++e)
    g.count[static_cast<size_t>(e + 1)] += g.count[static_cast<size_t>(e)];
  g.rows = g.count[static_cast<size_t>(E)];
  g.row_pair.assign(static_cast<size_t>(g.rows), 0);
  g.slot.assign(static_cast<size_t>(T * K), -1);
  std::vector<int64_t> next(g.count.begin(), g.count.end() - 1);
  for (int64_t i = 0; i < T * K; ++i) {
    const int64_t e = g.local[static_cast<size_t>(i)];
    if (e < 0) continue;
    const int64_t r = next[static_cast<size_t>(e)]++;
    g.row_pair[static_cast<size_t>(r)] = i;
    g.slot[static_cast<size_t>(i)] = r;
  }
  return g;
}

// GEMM1's rounded output row r (n values) plus the fc1 bias of expert e, in fp32.
void gemm1_row_with_bias(const CutlassMoeFp8Params& fp, const void* g1, DType g1_dt, int64_t r,
                         int64_t e, int64_t n, float* out) {
  for (int64_t j = 0; j < n; ++j) {
    float v = load_f(g1, g1_dt, r * n + j);
    if (fp.base.b1) v += load_f(fp.base.b1, fp.bias_dtype, e * n + j);
    out[j] = v;
  }
}

// Finalize: out[t] = round_out(sum over k in k order of scale * (y + b2)), fp32.
void finalize(const CutlassMoeFp8Params& fp, const Grouping& g, const void* y, DType y_dt) {
  const CutlassMoeParams& p = fp.base;
  const int64_t T = p.num_tokens, K = p.top_k, H = p.hidden;
#pragma omp parallel if (T * K * H >= kParallelMin)
  {
    std::vector<float> acc(static_cast<size_t>(H));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k = 0; k < K; ++k) {
        const int64_t r = g.slot[static_cast<size_t>(t * K + k)];
        if (r < 0) continue;
        const int64_t e = g.local[static_cast<size_t>(t * K + k)];
        const float s = load_f(p.scales, p.scales_dtype, t * p.scales_stride + k);
        for (int64_t j = 0; j < H; ++j) {
          const float b = p.b2 ? load_f(p.b2, fp.bias_dtype, e * H + j) : 0.0f;
          acc[static_cast<size_t>(j)] = moe_fp8_finalize_step(
              acc[static_cast<size_t>(j)], s, load_f(y, y_dt, r * H + j), p.b2 != nullptr, b);
        }
      }
      for (int64_t j = 0; j < H; ++j) {
        store_f(p.out, p.out_dtype, t * p.out_stride + j, acc[static_cast<size_t>(j)]);
      }
    }
  }
}

// FP8 per tensor: the GEMMs run on the stored e4m3 codes (inputs gathered, the activation
// re-encoded to e4m3), their outputs in the output dtype as upstream's intermediate buffers.
void per_tensor(const CutlassMoeFp8Params& fp, const Grouping& g) {
  const CutlassMoeParams& p = fp.base;
  const int64_t K = p.top_k, H = p.hidden, I = p.inter, E = p.num_local_experts;
  const int64_t N1 = moe_act_is_gated(p.act) ? 2 * I : I, rows = g.rows;
  const DType od = p.out_dtype;  // fp16 or bf16 (checked by the API)
  std::vector<uint8_t> xq(static_cast<size_t>(rows * H));
  const auto* in = static_cast<const uint8_t*>(p.input);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = g.row_pair[static_cast<size_t>(r)] / K;
    std::copy(in + t * p.in_stride, in + t * p.in_stride + H, xq.begin() + r * H);
  }
  std::vector<uint16_t> g1(static_cast<size_t>(rows * N1));
  const auto* w1 = static_cast<const uint8_t*>(p.w1);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = g.count[static_cast<size_t>(e)];
    const int64_t n = g.count[static_cast<size_t>(e + 1)] - r0;
    if (n == 0) continue;
    fp8_gemm(xq.data() + r0 * H, w1 + e * N1 * H, fp.fc1_dequant + e, od, g1.data() + r0 * N1, n,
             N1, H);
  }
  std::vector<uint8_t> hq(static_cast<size_t>(rows * I));
#pragma omp parallel if (rows * N1 >= kParallelMin)
  {
    std::vector<float> gf(static_cast<size_t>(N1)), hf(static_cast<size_t>(I));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t e = g.local[static_cast<size_t>(g.row_pair[static_cast<size_t>(r)])];
      gemm1_row_with_bias(fp, g1.data(), od, r, e, N1, gf.data());
      moe_activation_row(p, e, gf.data(), hf.data());
      const float q = fp.fc2_quant[fp.fc2_quant_per_expert ? e : 0];
      for (int64_t j = 0; j < I; ++j) {
        // CUTLASS's float -> e4m3 (cvt.rn.satfinite): RNE, saturating at +-448.
        hq[static_cast<size_t>(r * I + j)] = float_to_e4m3fn_bits(hf[static_cast<size_t>(j)] * q,
                                                                  /*saturate=*/true);
      }
    }
  }
  std::vector<uint16_t> y(static_cast<size_t>(rows * H));
  const auto* w2 = static_cast<const uint8_t*>(p.w2);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = g.count[static_cast<size_t>(e)];
    const int64_t n = g.count[static_cast<size_t>(e + 1)] - r0;
    if (n == 0) continue;
    fp8_gemm(hq.data() + r0 * I, w2 + e * H * I, fp.fc2_dequant + e, od, y.data() + r0 * H, n, H,
             I);
  }
  finalize(fp, g, y.data(), od);
}

// DeepSeek block scale: bf16 input and activation quantized 1x128 here, 128x128 weight blocks,
// GEMM outputs and the activation in bf16.
void block_scale(const CutlassMoeFp8Params& fp, const Grouping& g) {
  const CutlassMoeParams& p = fp.base;
  const int64_t K = p.top_k, H = p.hidden, I = p.inter, E = p.num_local_experts;
  const int64_t N1 = moe_act_is_gated(p.act) ? 2 * I : I, rows = g.rows;
  const int64_t HB = (H + kBlock - 1) / kBlock, IB = (I + kBlock - 1) / kBlock;
  const int64_t N1B = (N1 + kBlock - 1) / kBlock;
  std::vector<float> xa(static_cast<size_t>(rows * H)), xs(static_cast<size_t>(rows * HB));
#pragma omp parallel if (rows * H >= kParallelMin)
  {
    std::vector<float> row(static_cast<size_t>(H));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = g.row_pair[static_cast<size_t>(r)] / K;
      for (int64_t j = 0; j < H; ++j) {
        row[static_cast<size_t>(j)] = load_f(p.input, p.dtype, t * p.in_stride + j);
      }
      quantize_1x128(row.data(), H, xa.data() + r * H, xs.data() + r * HB);
    }
  }
  std::vector<float> g1(static_cast<size_t>(rows * N1));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = g.count[static_cast<size_t>(e)];
    const int64_t n = g.count[static_cast<size_t>(e + 1)] - r0;
    if (n == 0) continue;
    const std::vector<float> w = decode_weight(p.w1, e, N1, H);
    float* c = g1.data() + r0 * N1;
    block_gemm(xa.data() + r0 * H, xs.data() + r0 * HB, w.data(), fp.w1_block_scale + e * N1B * HB,
               c, n, N1, H);
    for (int64_t i = 0; i < n * N1; ++i) c[i] = elem_io::round_to(DType::kBFloat16, c[i]);
  }
  std::vector<float> ha(static_cast<size_t>(rows * I)), hs(static_cast<size_t>(rows * IB));
#pragma omp parallel if (rows * N1 >= kParallelMin)
  {
    std::vector<float> gf(static_cast<size_t>(N1)), hf(static_cast<size_t>(I));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t e = g.local[static_cast<size_t>(g.row_pair[static_cast<size_t>(r)])];
      gemm1_row_with_bias(fp, g1.data(), DType::kFloat32, r, e, N1, gf.data());
      moe_activation_row(p, e, gf.data(), hf.data());
      for (auto& v : hf) v = elem_io::round_to(DType::kBFloat16, v);
      quantize_1x128(hf.data(), I, ha.data() + r * I, hs.data() + r * IB);
    }
  }
  std::vector<float> y(static_cast<size_t>(rows * H));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = g.count[static_cast<size_t>(e)];
    const int64_t n = g.count[static_cast<size_t>(e + 1)] - r0;
    if (n == 0) continue;
    const std::vector<float> w = decode_weight(p.w2, e, H, I);
    float* c = y.data() + r0 * H;
    block_gemm(ha.data() + r0 * I, hs.data() + r0 * IB, w.data(), fp.w2_block_scale + e * HB * IB,
               c, n, H, I);
    for (int64_t i = 0; i < n * H; ++i) c[i] = elem_io::round_to(DType::kBFloat16, c[i]);
  }
  finalize(fp, g, y.data(), DType::kFloat32);
}

}  // namespace

void cutlass_moe_fp8(const CutlassMoeFp8Params& fp) {
  const Grouping g = group_rows(fp.base);
  if (fp.block_scale) {
    block_scale(fp, g);
  } else {
    per_tensor(fp, g);
  }
}

}  // namespace flashinfer::kernels::cpu
