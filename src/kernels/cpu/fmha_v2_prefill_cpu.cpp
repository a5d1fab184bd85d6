#include "kernels/cpu/fmha_v2_prefill_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "flashinfer/float_formats.h"
#include "kernels/cpu/cpu_row_io.h"

namespace flashinfer::kernels::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr const char* kOp = "trtllm_fmha_v2_prefill";

// Element offset of key/value row j of request b, KV head g.
int64_t kv_offset(const FmhaV2PrefillParams& p, int32_t b, int64_t j, int64_t g, int64_t s_page,
                  int64_t s_n, int64_t s_h) {
  if (p.page_size == 0) return (p.cu_kv[b] + j) * s_n + g * s_h;
  const int64_t page = p.block_tables[b * p.bt_stride + j / p.page_size];
  return page * s_page + (j % p.page_size) * s_n + g * s_h;
}

// fp8 e4m3 outputs convert with saturation (PTX's e4m3 conversion exists only in .satfinite form);
// the other dtypes through the shared row writer.
void store_out(const FmhaV2PrefillParams& p, int64_t off, int64_t n, const float* src) {
  if (p.o_dtype != DType::kFloat8E4M3FN) {
    rowio::store_row_dtype(p.o, p.o_dtype, off, n, src, kOp, "out");
    return;
  }
  auto* dst = static_cast<uint8_t*>(p.o) + off;
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_e4m3fn_bits(src[i], /*saturate=*/true);
}

}  // namespace

void fmha_v2_prefill(const FmhaV2PrefillParams& p) {
  // Dtypes checked outside the parallel region, where an exception may leave.
  float probe = 0.0f;
  rowio::load_row_dtype(&probe, p.dtype, 0, 0, &probe, kOp, "qkv");
  if (p.o_dtype != DType::kFloat8E4M3FN) {
    rowio::store_row_dtype(&probe, p.o_dtype, 0, 0, &probe, kOp, "out");
  }
  const int64_t rows = p.rows, Hq = p.num_qo_heads, Hkv = p.num_kv_heads;
  const int64_t group = Hq / Hkv, dqk = p.head_dim_qk, dvo = p.head_dim_vo;
  std::vector<int32_t> row_req(static_cast<std::size_t>(rows), -1);
  int64_t work = 0;
  for (int32_t b = 0; b < p.batch; ++b) {
    for (int32_t r = p.cu_q[b]; r < p.cu_q[b + 1]; ++r) row_req[r] = b;
    work += int64_t{p.cu_q[b + 1] - p.cu_q[b]} * p.kv_lens[b];
  }
  work *= Hq * (dqk + dvo);
  (void)work;  // read only by the OpenMP clause below
#pragma omp parallel if (work > (int64_t{1} << 20))
  {
    std::vector<float> q(static_cast<std::size_t>(group * dqk)), k(static_cast<std::size_t>(dqk));
    std::vector<float> v(static_cast<std::size_t>(dvo)), acc(static_cast<std::size_t>(group * dvo));
    std::vector<float> s, m(static_cast<std::size_t>(group)), l(static_cast<std::size_t>(group));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < rows * Hkv; ++task) {
      const int64_t row = task / Hkv, hk = task % Hkv;
      const int32_t b = row_req[row];
      std::fill(acc.begin(), acc.end(), 0.0f);
      int64_t lo = 0, n = 0, pos = 0;
      if (b >= 0) {
        const int64_t qo_len = p.cu_q[b + 1] - p.cu_q[b], kv_len = p.kv_lens[b];
        pos = kv_len - qo_len + (row - p.cu_q[b]);
        const int64_t hi = p.causal ? std::clamp<int64_t>(pos + 1, 0, kv_len) : kv_len;
        if (p.window_left >= 0) lo = std::max(lo, pos - p.window_left);
        if (p.chunk > 0 && pos >= 0) lo = std::max(lo, pos / p.chunk * p.chunk);
        lo = std::clamp<int64_t>(lo, 0, kv_len);
        n = std::max<int64_t>(hi - lo, 0);
      }
      for (int64_t g = 0; g < group; ++g) {
        rowio::load_row_dtype(p.q, p.dtype, row * p.q_stride_n + (hk * group + g) * p.q_stride_h,
                              dqk, &q[g * dqk], kOp, "qkv");
      }
      s.assign(static_cast<std::size_t>(group * std::max<int64_t>(n, 1)), 0.0f);
      std::fill(m.begin(), m.end(), kNegInf);
      for (int64_t j = 0; j < n; ++j) {
        rowio::load_row_dtype(
            p.k, p.dtype, kv_offset(p, b, lo + j, hk, p.k_stride_page, p.k_stride_n, p.k_stride_h),
            dqk, k.data(), kOp, "qkv");
        for (int64_t g = 0; g < group; ++g) {
          float dot = 0.0f;
          for (int64_t d = 0; d < dqk; ++d) dot += q[g * dqk + d] * k[d];
          float x = p.bmm1_scale * dot;
          if (p.soft_cap > 0.0f) x = p.soft_cap * std::tanh(x / p.soft_cap);
          // FMHAv2 adds slope * key column after scaling and capping; relative to the query's
          // position (a per-row constant, which softmax drops) it stays small.
          if (p.alibi_slopes != nullptr) {
            x += p.alibi_slopes[hk * group + g] * static_cast<float>(lo + j - pos);
          }
          s[g * n + j] = x;
          m[g] = std::max(m[g], x);
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float sum = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          float& x = s[g * n + j];
          x = m[g] == kNegInf ? 0.0f : std::exp(x - m[g]);
          sum += x;
        }
        l[g] = sum;
      }
      for (int64_t j = 0; j < n; ++j) {
        rowio::load_row_dtype(
            p.v, p.dtype, kv_offset(p, b, lo + j, hk, p.v_stride_page, p.v_stride_n, p.v_stride_h),
            dvo, v.data(), kOp, "qkv");
        for (int64_t g = 0; g < group; ++g) {
          const float w = s[g * n + j];
          float* a = &acc[g * dvo];
          for (int64_t d = 0; d < dvo; ++d) a[d] += w * v[d];
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = hk * group + g;
        const bool empty = n == 0 || l[g] == 0.0f;
        // A sink joins the denominator; both sides are shifted by the larger of m and the sink
        // so that neither exponential overflows.
        float f = 0.0f;
        if (!empty) {
          const float sink = p.sinks != nullptr ? p.sinks[h] : kNegInf;
          const float mm = std::max(m[g], sink), shift = std::exp(m[g] - mm);
          f = p.bmm2_scale * shift / (l[g] * shift + std::exp(sink - mm));
        }
        float* a = &acc[g * dvo];
        for (int64_t d = 0; d < dvo; ++d) a[d] = empty ? 0.0f : a[d] * f;
        store_out(p, row * p.o_stride_n + h * p.o_stride_h, dvo, a);
        if (p.stats != nullptr) {
          float* st = p.stats + row * p.stats_stride_n + h * p.stats_stride_h;
          st[0] = empty ? kNegInf : m[g];
          st[1] = empty ? 0.0f : l[g];
        }
      }
    }
  }
}

}  // namespace flashinfer::kernels::cpu
