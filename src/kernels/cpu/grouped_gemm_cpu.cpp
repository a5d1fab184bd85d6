#include "kernels/cpu/grouped_gemm_cpu.h"

#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"
#include "kernels/cpu/elem_io.h"
#include "kernels/quantization_params.h"

namespace flashinfer::kernels::cpu {
namespace {

float decode_elem(const GroupedOperand& o, int64_t g, int64_t row, int64_t kk) {
  if (o.fp4) {
    const auto* p = static_cast<const uint8_t*>(o.data);
    const uint8_t byte = p[g * o.stride_group + row * o.stride_row + (kk / 2) * o.stride_k];
    return e2m1_bits_to_float(kk % 2 == 0 ? e2m1x2_low(byte) : e2m1x2_high(byte));
  }
  const int64_t idx = g * o.stride_group + row * o.stride_row + kk * o.stride_k;
  if (const auto v = elem_io::decode(o.data, o.dtype, idx)) return *v;
  FLASHINFER_FAIL(ErrorCode::kUnsupported, "grouped_gemm", "", "dtype ", dtype_torch_name(o.dtype),
                  " is not an operand format");
}

// The product of the element's block scales (1 without any).
float scale_of(const GroupedOperand& o, int64_t g, int64_t row, int64_t kk) {
  float s = 1.0f;
  if (o.sf_mode != 0) {
    const int64_t blk = kk / o.sf_vec;
    int64_t off = 0;
    if (o.sf_mode == 1) {
      off = g * o.sf_stride_group + sf_offset(SfLayoutCode::k128x4, row, blk, o.sf_cols);
    } else if (o.sf_mode == 4) {
      const auto gi = static_cast<std::size_t>(g);
      off = o.sf_group_base[gi] + (row - o.sf_group_row0[gi]) * o.sf_row_bytes + blk;
    } else if (o.sf_mode == 3) {
      const auto gi = static_cast<std::size_t>(g);
      off = o.sf_group_base[gi] +
            sf_offset(SfLayoutCode::k128x4, row - o.sf_group_row0[gi], blk, o.sf_cols);
    } else {
      off = (row % 32) * o.sf6[0] + ((row % 128) / 32) * o.sf6[1] + (row / 128) * o.sf6[2] +
            (blk % 4) * o.sf6[3] + (blk / 4) * o.sf6[4] + g * o.sf6[5];
    }
    s = o.sf_e4m3 ? e4m3fn_bits_to_float(o.sf[off]) : ue8m0_to_float(o.sf[off]);
  }
  if (o.fs) {
    int64_t base = g * o.fs_stride_group, r = row;
    if (!o.fs_group_base.empty()) {
      base = o.fs_group_base[static_cast<std::size_t>(g)];
      r = row - o.fs_group_row0[static_cast<std::size_t>(g)];
    }
    s *= o.fs[base + (r / o.fs_gran_row) * o.fs_stride_row + (kk / o.fs_gran_k) * o.fs_stride_k];
  }
  return s;
}

// rows [row0, row0 + m) of group g, dequantized to a dense fp32 [m, k].
void dequantize(const GroupedOperand& o, int64_t g, int64_t row0, int64_t m, int64_t k,
                std::vector<float>& dst) {
  dst.resize(static_cast<std::size_t>(m * k));
  const bool scaled = o.sf_mode != 0 || o.fs != nullptr;
#pragma omp parallel for schedule(static) if (m * k > 65536)
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t kk = 0; kk < k; ++kk) {
      float v = decode_elem(o, g, row0 + i, kk);
      if (scaled) v *= scale_of(o, g, row0 + i, kk);
      dst[static_cast<std::size_t>(i * k + kk)] = v;
    }
  }
}

}  // namespace

void grouped_gemm(const GroupedGemmParams& p) {
  const int64_t n = p.n, k = p.k;
  std::vector<float> a, b, c;
  int64_t b_cached = -1;
  const float alpha0 = p.alpha ? *p.alpha : 1.0f;
  for (const GroupedProblem& pr : p.problems) {
    if (pr.m <= 0 || n <= 0) continue;
    dequantize(p.a, pr.a_group, pr.a_row0, pr.m, k, a);
    // Consecutive problems of one weight group (the masked GEMM, SegmentGEMM's repeated
    // weight_indices) reuse its decoded copy.
    if (pr.b_group != b_cached) {
      dequantize(p.b, pr.b_group, 0, n, k, b);
      b_cached = pr.b_group;
    }
    c.assign(static_cast<std::size_t>(pr.m * n), 0.0f);
    if (k > 0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(pr.m),
                  static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a.data(),
                  static_cast<blasint>(k), b.data(), static_cast<blasint>(k), 0.0f, c.data(),
                  static_cast<blasint>(n));
    }
    const float alpha =
        p.alpha_group ? alpha0 * p.alpha_group[pr.b_group * p.alpha_group_stride] : alpha0;
    const int64_t n_out = p.swiglu ? n / 2 : n;
    for (int64_t i = 0; i < pr.m; ++i) {
      const int64_t base = pr.out_group * p.out_stride_group + (pr.out_row0 + i) * p.out_stride_row;
      for (int64_t j = 0; j < n_out; ++j) {
        float v = alpha * c[static_cast<std::size_t>(i * n + j)];
        if (p.swiglu) {
          const float gate = alpha * c[static_cast<std::size_t>(i * n + n_out + j)];
          v *= gate / (1.0f + std::exp(-gate));
        }
        // out is fp32, fp16 or bf16 (the API layer's set).
        elem_io::store_or_fp32(p.out, p.out_dtype, base + j * p.out_stride_n, v);
      }
    }
  }
}

}  // namespace flashinfer::kernels::cpu
