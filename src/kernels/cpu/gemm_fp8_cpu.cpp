#include "kernels/cpu/gemm_fp8_cpu.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"
#include "kernels/cpu/elem_io.h"
#include "kernels/cpu/gemm_bf16_cpu.h"
#include "kernels/cpu/gemm_fp8_dpbf16_cpu.h"

namespace flashinfer::kernels::cpu {
namespace {

float decode(const void* base, DType dt, int64_t idx) {
  if (const auto v = elem_io::decode(base, dt, idx)) return *v;
  FLASHINFER_FAIL(ErrorCode::kUnsupported, "block_scaled_gemm", "", "dtype ", dtype_torch_name(dt),
                  " is not supported on CPU");
}

void store(void* base, DType dt, int64_t idx, float v) {
  if (dt == DType::kBFloat16) {
    static_cast<uint16_t*>(base)[idx] = float_to_bfloat16_bits(v);
  } else if (dt == DType::kFloat16) {
    static_cast<uint16_t*>(base)[idx] = float_to_half_bits(v);
  } else {
    static_cast<float*>(base)[idx] = v;
  }
}

}  // namespace

namespace {

// Both operands decoded once to fp32 (exact for every input format, MX scales included), b as
// logical [n, k]; sums by OpenBLAS into part (unscaled) or acc (scaled).
void fp32_products(const BlockScaledGemmParams& p, const void* pa, const void* pb,
                   const uint8_t* a_mx, const uint8_t* b_mx, float* part, std::vector<float>& acc) {
  const int64_t m = p.m, n = p.n, k = p.k;
  std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(n * k));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t kk = 0; kk < k; ++kk) {
      float v = decode(pa, p.a_dtype, i * p.a_stride_m + kk * p.a_stride_k);
      if (a_mx) v *= mx_scale(a_mx, p.a_mx_layout, p.a_mx_stride_row, p.a_mx_stride_k, i, kk, k);
      a[i * k + kk] = v;
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    const int64_t row = p.b_low_latency ? low_latency_row(j) : j;
    for (int64_t kk = 0; kk < k; ++kk) {
      const int64_t idx = p.b_low_latency ? (kk / 128) * n * 128 + row * 128 + kk % 128
                                          : j * p.b_stride_n + kk * p.b_stride_k;
      float v = decode(pb, p.b_dtype, idx);
      if (b_mx) v *= mx_scale(b_mx, p.b_mx_layout, p.b_mx_stride_row, p.b_mx_stride_k, j, kk, k);
      b[j * k + kk] = v;
    }
  }
  // fp32 products of the decoded operands by OpenBLAS sgemm, one call per K block when there are
  // per-block scales: each block's partial sums are then multiplied by (a_scale * b_scale) and
  // added to the fp32 accumulator, the promotion of the blockwise kernels (see the header).
  const bool scaled = p.a_scale || p.b_scale;
  const int64_t gk = scaled ? p.gk : k;
  const int64_t kblocks = (k + gk - 1) / gk;
  acc.assign(scaled ? static_cast<std::size_t>(m * n) : 0, 0.0f);
  for (int64_t kb = 0; kb < kblocks; ++kb) {
    const int64_t k0 = kb * gk, kl = std::min(k, k0 + gk) - k0;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m),
                static_cast<blasint>(n), static_cast<blasint>(kl), 1.0f, a.data() + k0,
                static_cast<blasint>(k), b.data() + k0, static_cast<blasint>(k), 0.0f, part,
                static_cast<blasint>(n));
    if (!scaled) break;
    for (int64_t i = 0; i < m; ++i) {
      const float sa =
          p.a_scale ? p.a_scale[(i / p.gm) * p.sa_stride_m + kb * p.sa_stride_k] : 1.0f;
      for (int64_t j = 0; j < n; ++j) {
        const float sb =
            p.b_scale ? p.b_scale[(j / p.gn) * p.sb_stride_n + kb * p.sb_stride_k] : 1.0f;
        acc[i * n + j] += (sa * sb) * part[i * n + j];
      }
    }
  }
}

// out = epilogue(a b^T) through oneDNN's bf16 matmul (fp32 accumulation) for inputs exact in
// bf16, without a bf16 copy of the whole b: each column chunk of b is widened (and mm_fp8's
// shuffle undone) into a per-thread buffer right before oneDNN reads it, and its fp32 products
// go through `epilogue` (alpha, bias, one rounding) while still in cache; all in one OpenMP team
// (bf16_gemm_nt_chunked). False when oneDNN is absent or refuses.
bool bf16_chunked(const BlockScaledGemmParams& p, const void* pa, const void* pb,
                  const std::function<void(int64_t, int64_t, const float*)>& epilogue) {
  const int64_t m = p.m, n = p.n, k = p.k;
  if (!onednn_gemm_available() || k == 0 || !exact_in_bf16(p.a_dtype) ||
      !exact_in_bf16(p.b_dtype) || (p.b_low_latency && dtype_size(p.b_dtype) != 1)) {
    return false;
  }
  HostBuffer<uint16_t> a(static_cast<std::size_t>(m * k));
  // A is small next to B here (m rows against n): widened on this thread, outside any team.
  to_bf16_rows(pa, p.a_dtype, m, k, p.a_stride_m, p.a_stride_k, a.get(), /*parallel=*/false);
  const auto fill_b = [&](int64_t j0, int64_t w, uint16_t* dst) {
    if (!p.b_low_latency) {
      const auto* base =
          static_cast<const uint8_t*>(pb) + j0 * p.b_stride_n * dtype_size(p.b_dtype);
      to_bf16_rows(base, p.b_dtype, w, k, p.b_stride_n, p.b_stride_k, dst, /*parallel=*/false);
      return;
    }
    const auto* b8 = static_cast<const uint8_t*>(pb);
    const uint16_t* t = fp8_bf16_table(p.b_dtype);  // mm_fp8's weight is e4m3
    if (k % 128 == 0 && j0 % 32 == 0 && w % 32 == 0) {
      // Whole 32-row groups: the chunk's stored rows are [j0, j0 + w) in another order. Each
      // 128-wide K block is then one contiguous run of w * 128 bytes (read in order, which the
      // prefetchers follow), each stored row written to the logical row it holds.
      int32_t perm[32];
      for (int q = 0; q < 32; ++q) perm[q] = static_cast<int32_t>((q % 8) * 4 + q / 8);
      for (int64_t k0 = 0; k0 < k; k0 += 128) {
        for (int64_t g = 0; g < w; g += 32) {
          int32_t rows[32];
          for (int q = 0; q < 32; ++q) rows[q] = static_cast<int32_t>(g + perm[q]);
          fp8_to_bf16_rows(b8 + ((k0 / 128) * n + j0 + g) * 128, 128, 32, 128, p.b_dtype, dst + k0,
                           k, rows);
        }
      }
      return;
    }
    for (int64_t jj = 0; jj < w; ++jj) {
      const uint8_t* src = b8 + low_latency_row(j0 + jj) * 128;
      uint16_t* d = dst + jj * k;
      if (k % 128 == 0) {
        // Whole 128-wide K blocks (mm_fp8 requires them): one vectorized copy per block.
        for (int64_t k0 = 0; k0 < k; k0 += 128) {
          fp8_to_bf16(src + (k0 / 128) * n * 128, 128, p.b_dtype, d + k0);
        }
      } else {
        for (int64_t kk = 0; kk < k; ++kk) d[kk] = t[src[(kk / 128) * n * 128 + kk % 128]];
      }
    }
  };
  return bf16_gemm_nt_chunked(m, n, k, a.get(), k, fill_b, epilogue);
}

// Stores alpha * total[i, j] + bias[j] (+ 0.0f without bias) for the columns [j0, j0 + w) of
// `out` from `total` [m, w] (row stride ldt).
void store_block(const BlockScaledGemmParams& p, void* out, float alpha, const float* total,
                 int64_t ldt, int64_t j0, int64_t w) {
  if (!p.bias && p.out_dtype == DType::kBFloat16 && p.out_stride_n == 1) {
    // The common case without a per-element dispatch; the same arithmetic as below (+ 0.0f
    // included: it turns a -0 product into +0, as the general loop does).
    auto* o = static_cast<uint16_t*>(out);
    for (int64_t i = 0; i < p.m; ++i) {
      scale_to_bf16_row(total + i * ldt, alpha, /*add_zero=*/true, o + i * p.out_stride_m + j0, w);
    }
    return;
  }
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < w; ++j) {
      const float bias = p.bias ? decode(p.bias, p.bias_dtype, j0 + j) : 0.0f;
      store(out, p.out_dtype, i * p.out_stride_m + (j0 + j) * p.out_stride_n,
            alpha * total[i * ldt + j] + bias);
    }
  }
}

void gemm_one(const BlockScaledGemmParams& p, int64_t bi) {
  const int64_t m = p.m, n = p.n;
  const void* pa = static_cast<const char*>(p.a) + bi * p.a_stride_b * dtype_size(p.a_dtype);
  const void* pb = static_cast<const char*>(p.b) + bi * p.b_stride_b * dtype_size(p.b_dtype);
  const uint8_t* a_mx = p.a_mx ? p.a_mx + bi * p.a_mx_stride_b : nullptr;
  const uint8_t* b_mx = p.b_mx ? p.b_mx + bi * p.b_mx_stride_b : nullptr;
  void* out = static_cast<char*>(p.out) + bi * p.out_stride_b * dtype_size(p.out_dtype);
  const float alpha = p.alpha ? *p.alpha : 1.0f;
  const bool scaled = p.a_scale || p.b_scale;
  const auto epilogue = [&](int64_t j0, int64_t w, const float* c) {
    store_block(p, out, alpha, c, w, j0, w);
  };
  // mm_fp8 (e4m3 by the prepared e4m3 weight): vdpbf16ps on codes widened while packed, the
  // same fp32 sums as oneDNN's bf16 matmul below without its bf16 copy of the weight.
  if (!scaled && !a_mx && !b_mx && p.b_low_latency && p.a_dtype == DType::kFloat8E4M3FN &&
      p.b_dtype == DType::kFloat8E4M3FN && p.a_stride_k == 1 &&
      fp8_ll_gemm_dpbf16(m, n, p.k, static_cast<const uint8_t*>(pa), p.a_stride_m,
                         static_cast<const uint8_t*>(pb), epilogue)) {
    return;
  }
  // Unscaled, no MX scales (mm_fp8, tgv_gemm_sm100 ...): oneDNN's bf16 matmul when available.
  if (!scaled && !a_mx && !b_mx && bf16_chunked(p, pa, pb, epilogue)) return;
  HostBuffer<float> part(static_cast<std::size_t>(m * n));
  std::vector<float> acc;
  fp32_products(p, pa, pb, a_mx, b_mx, part.get(), acc);
  store_block(p, out, alpha, scaled ? acc.data() : part.get(), n, 0, n);
}

}  // namespace

void block_scaled_gemm(const BlockScaledGemmParams& p) {
  for (int64_t bi = 0; bi < p.batch; ++bi) gemm_one(p, bi);
}

void low_latency_weight_layout(const uint8_t* w, int64_t w_stride_n, int64_t n, int64_t k,
                               uint8_t* out) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t row = low_latency_row(j);
    for (int64_t kb = 0; kb < k / 128; ++kb) {
      std::memcpy(out + (kb * n + row) * 128, w + j * w_stride_n + kb * 128, 128);
    }
  }
}

}  // namespace flashinfer::kernels::cpu
