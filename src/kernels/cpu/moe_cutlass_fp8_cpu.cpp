// CPU reference of cutlass_fused_moe's FP8 paths: the routed rows of each local expert only,
// grouped as the unquantized path groups them, fp32 accumulation, and the rounding points of
// upstream's CUTLASS MoE runner (docs/MOE.md, "cutlass_fused_moe: FP8 paths").
#include "kernels/cpu/moe_cutlass_fp8_cpu.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"
#include "kernels/cpu/moe_cpu.h"

namespace flashinfer::kernels::cpu {
namespace {

constexpr int64_t kParallelMin = int64_t{1} << 16;
constexpr int64_t kBlock = 128;  // DeepSeek block size, both for weights and activations

float load_f(const void* base, DType dt, int64_t i) {
  switch (dt) {
    case DType::kFloat32:
      return static_cast<const float*>(base)[i];
    case DType::kFloat16:
      return half_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kBFloat16:
      return bfloat16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kFloat8E4M3FN:
      return e4m3fn_bits_to_float(static_cast<const uint8_t*>(base)[i]);
    default:
      FLASHINFER_FAIL(ErrorCode::kInternal, "cutlass_fused_moe", "", "unexpected dtype ",
                      dtype_name(dt));
  }
}

// The value a buffer of `dt` holds for v (RNE).
float round_to(DType dt, float v) {
  switch (dt) {
    case DType::kFloat16:
      return half_bits_to_float(float_to_half_bits(v));
    case DType::kBFloat16:
      return bfloat16_bits_to_float(float_to_bfloat16_bits(v));
    default:
      return v;
  }
}

void store_f(void* base, DType dt, int64_t i, float v) {
  switch (dt) {
    case DType::kFloat32:
      static_cast<float*>(base)[i] = v;
      return;
    case DType::kFloat16:
      static_cast<uint16_t*>(base)[i] = float_to_half_bits(v);
      return;
    case DType::kBFloat16:
      static_cast<uint16_t*>(base)[i] = float_to_bfloat16_bits(v);
      return;
    default:
      FLASHINFER_FAIL(ErrorCode::kInternal, "cutlass_fused_moe", "", "unexpected dtype ",
                      dtype_name(dt));
  }
}

// e4m3 with CUDA's __NV_SATFINITE (cvt.rn.satfinite): RNE, finite overflow clamps to +-448.
float e4m3_sat(float v) { return e4m3fn_bits_to_float(float_to_e4m3fn_bits(v, true)); }

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
        const float s = sa * ws[(j / kBlock) * kb + b];
        out[i * n + j] += s * part[static_cast<size_t>(i * n + j)];
      }
    }
  }
}

}  // namespace

void quantize_1x128(const float* x, int64_t n, float* q, float* ds) {
  for (int64_t b = 0; b * kBlock < n; ++b) {
    const int64_t j0 = b * kBlock, j1 = std::min(n, j0 + kBlock);
    float amax = 0.0f;
    for (int64_t j = j0; j < j1; ++j) amax = std::max(amax, std::fabs(x[j]));
    // Upstream's scale_1x128_kernel: quant = 448 / amax (1 for an all-zero block), the stored
    // dequantization scale is 1 / quant (not amax / 448), values cvt with saturation.
    const float quant = amax != 0.0f ? 448.0f / amax : 1.0f;
    ds[b] = 1.0f / quant;
    for (int64_t j = j0; j < j1; ++j) q[j] = e4m3_sat(x[j] * quant);
  }
}

void cutlass_moe_fp8(const CutlassMoeFp8Params& fp) {
  const CutlassMoeParams& p = fp.base;
  const int64_t T = p.num_tokens, K = p.top_k, H = p.hidden, I = p.inter;
  const int64_t N1 = moe_act_is_gated(p.act) ? 2 * I : I;
  const int64_t E = p.num_local_experts;
  const int64_t HB = (H + kBlock - 1) / kBlock, IB = (I + kBlock - 1) / kBlock;
  const int64_t N1B = (N1 + kBlock - 1) / kBlock;

  // Group the (token, k) pairs by local expert, token order within an expert (counting sort).
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

  // Gathered GEMM1 inputs (fp32 values of the fp8 codes; for the block path the 1x128-quantized
  // values and their scales), sized by routed rows only.
  std::vector<float> xa(static_cast<size_t>(rows * H));
  std::vector<float> xs(fp.block_scale ? static_cast<size_t>(rows * HB) : 0);
#pragma omp parallel if (rows * H >= kParallelMin)
  {
    std::vector<float> row(static_cast<size_t>(H));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = row_pair[static_cast<size_t>(r)] / K;
      for (int64_t j = 0; j < H; ++j) {
        row[static_cast<size_t>(j)] = load_f(p.input, p.dtype, t * p.in_stride + j);
      }
      float* dst = xa.data() + r * H;
      if (fp.block_scale) {
        quantize_1x128(row.data(), H, dst, xs.data() + r * HB);
      } else {
        std::copy(row.begin(), row.end(), dst);
      }
    }
  }

  // GEMM1 per expert, its output rounded to the GEMM output type (the output dtype; bf16 for
  // the block path) as the runner's intermediate buffer holds it.
  std::vector<float> g1(static_cast<size_t>(rows * N1));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = count[static_cast<size_t>(e)], n = count[static_cast<size_t>(e + 1)] - r0;
    if (n == 0) continue;
    const std::vector<float> w = decode_weight(p.w1, e, N1, H);
    float* c = g1.data() + r0 * N1;
    if (fp.block_scale) {
      block_gemm(xa.data() + r0 * H, xs.data() + r0 * HB, w.data(),
                 fp.w1_block_scale + e * N1B * HB, c, n, N1, H);
    } else {
      sgemm_nt(xa.data() + r0 * H, H, w.data(), H, c, n, N1, H);
      const float alpha = fp.fc1_dequant[e];
      for (int64_t i = 0; i < n * N1; ++i) c[i] *= alpha;
    }
    for (int64_t i = 0; i < n * N1; ++i) c[i] = round_to(p.out_dtype, c[i]);
  }

  // Activation: bias added in fp32, the activation in fp32, then the GEMM2 input: fp8 with the
  // fc2 quant scale (per tensor), or bf16 then 1x128-quantized (block path).
  std::vector<float> ha(static_cast<size_t>(rows * I));
  std::vector<float> hs(fp.block_scale ? static_cast<size_t>(rows * IB) : 0);
#pragma omp parallel if (rows * N1 >= kParallelMin)
  {
    std::vector<float> gf(static_cast<size_t>(N1)), hf(static_cast<size_t>(I));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t e = local[static_cast<size_t>(row_pair[static_cast<size_t>(r)])];
      for (int64_t j = 0; j < N1; ++j) {
        float v = g1[static_cast<size_t>(r * N1 + j)];
        if (p.b1) v += load_f(p.b1, fp.bias_dtype, e * N1 + j);
        gf[static_cast<size_t>(j)] = v;
      }
      moe_activation_row(p, e, gf.data(), hf.data());
      float* dst = ha.data() + r * I;
      if (fp.block_scale) {
        for (int64_t j = 0; j < I; ++j) {
          hf[static_cast<size_t>(j)] = round_to(DType::kBFloat16, hf[static_cast<size_t>(j)]);
        }
        quantize_1x128(hf.data(), I, dst, hs.data() + r * IB);
      } else {
        const float q = fp.fc2_quant[fp.fc2_quant_per_expert ? e : 0];
        for (int64_t j = 0; j < I; ++j) dst[j] = e4m3_sat(hf[static_cast<size_t>(j)] * q);
      }
    }
  }

  // GEMM2 per expert, rounded to the output dtype.
  std::vector<float> y(static_cast<size_t>(rows * H));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = count[static_cast<size_t>(e)], n = count[static_cast<size_t>(e + 1)] - r0;
    if (n == 0) continue;
    const std::vector<float> w = decode_weight(p.w2, e, H, I);
    float* c = y.data() + r0 * H;
    if (fp.block_scale) {
      block_gemm(ha.data() + r0 * I, hs.data() + r0 * IB, w.data(), fp.w2_block_scale + e * HB * IB,
                 c, n, H, I);
    } else {
      sgemm_nt(ha.data() + r0 * I, I, w.data(), I, c, n, H, I);
      const float alpha = fp.fc2_dequant[e];
      for (int64_t i = 0; i < n * H; ++i) c[i] *= alpha;
    }
    for (int64_t i = 0; i < n * H; ++i) c[i] = round_to(p.out_dtype, c[i]);
  }

  // Finalize: sum over k in k order of scale * (y + b2), fp32, rounded once.
#pragma omp parallel if (T * K * H >= kParallelMin)
  {
    std::vector<float> acc(static_cast<size_t>(H));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k = 0; k < K; ++k) {
        const int64_t r = slot[static_cast<size_t>(t * K + k)];
        if (r < 0) continue;
        const int64_t e = local[static_cast<size_t>(t * K + k)];
        const float s = load_f(p.scales, p.scales_dtype, t * p.scales_stride + k);
        for (int64_t j = 0; j < H; ++j) {
          float v = y[static_cast<size_t>(r * H + j)];
          if (p.b2) v += load_f(p.b2, fp.bias_dtype, e * H + j);
          acc[static_cast<size_t>(j)] += s * v;
        }
      }
      for (int64_t j = 0; j < H; ++j) {
        store_f(p.out, p.out_dtype, t * p.out_stride + j, acc[static_cast<size_t>(j)]);
      }
    }
  }
}

}  // namespace flashinfer::kernels::cpu
