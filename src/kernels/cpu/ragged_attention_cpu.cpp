#include "kernels/cpu/ragged_attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"
#include "kernels/cpu/cpu_row_io.h"

namespace flashinfer::kernels::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void load_row(const void* base, DType dtype, int64_t off, int64_t n, float* dst) {
  rowio::load_row_dtype(base, dtype, off, n, dst, "trtllm_ragged_attention_deepseek", "query");
}

void store_row(void* base, DType dtype, int64_t off, int64_t n, const float* src) {
  rowio::store_row_dtype(base, dtype, off, n, src, "trtllm_ragged_attention_deepseek", "out");
}

}  // namespace

void ragged_attention(const RaggedAttentionParams& p) {
  // Dtypes checked outside the parallel region, where an exception may leave.
  float probe = 0.0f;
  for (DType d : {p.q_dtype, p.k_dtype, p.v_dtype}) load_row(&probe, d, 0, 0, &probe);
  store_row(&probe, p.o_dtype, 0, 0, &probe);
  const int64_t rows = p.rows, Hq = p.num_qo_heads, Hkv = p.num_kv_heads;
  const int64_t group = Hq / Hkv, dqk = p.head_dim_qk, dvo = p.head_dim_vo;
  std::vector<int32_t> row_req(static_cast<std::size_t>(rows));
  for (int32_t b = 0; b < p.batch; ++b) {
    for (int32_t r = p.cu_q[b]; r < p.cu_q[b + 1]; ++r) row_req[r] = b;
  }
  int64_t work = 0;
  for (int32_t b = 0; b < p.batch; ++b) {
    work += int64_t{p.cu_q[b + 1] - p.cu_q[b]} * p.kv_lens[b];
  }
  work *= Hq * (dqk + dvo);
  // One task per (query row, KV head): each key/value row is converted once for its group.
#pragma omp parallel if (work > (int64_t{1} << 20))
  {
    std::vector<float> q(static_cast<std::size_t>(group * dqk)), k(static_cast<std::size_t>(dqk));
    std::vector<float> v(static_cast<std::size_t>(dvo)), acc(static_cast<std::size_t>(group * dvo));
    std::vector<float> s, m(static_cast<std::size_t>(group)), l(static_cast<std::size_t>(group));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < rows * Hkv; ++task) {
      const int64_t row = task / Hkv, hk = task % Hkv;
      const int32_t b = row_req[row];
      const int64_t qo_len = p.cu_q[b + 1] - p.cu_q[b];
      const int64_t kv_len = p.kv_lens[b];
      const int64_t pos = kv_len - qo_len + (row - p.cu_q[b]);
      const int64_t hi = p.causal ? std::clamp<int64_t>(pos + 1, 0, kv_len) : kv_len;
      const int64_t lo =
          p.window_left >= 0 ? std::clamp<int64_t>(pos - p.window_left, 0, kv_len) : 0;
      const int64_t n = std::max<int64_t>(hi - lo, 0);
      const int64_t kv0 = p.cu_kv[b];
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = hk * group + g;
        load_row(p.q, p.q_dtype, row * p.q_stride_n + h * p.q_stride_h, dqk, &q[g * dqk]);
      }
      s.assign(static_cast<std::size_t>(group * std::max<int64_t>(n, 1)), 0.0f);
      std::fill(m.begin(), m.end(), kNegInf);
      for (int64_t j = 0; j < n; ++j) {
        load_row(p.k, p.k_dtype, (kv0 + lo + j) * p.k_stride_n + hk * p.k_stride_h, dqk, k.data());
        for (int64_t g = 0; g < group; ++g) {
          float dot = 0.0f;
          for (int64_t d = 0; d < dqk; ++d) dot += q[g * dqk + d] * k[d];
          const float x = p.bmm1_scale * dot;
          s[g * n + j] = x;
          m[g] = std::max(m[g], x);
        }
      }
      // Softmax weights; a head whose scores are all -inf keeps zero weights (empty row).
      for (int64_t g = 0; g < group; ++g) {
        float sum = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          float& x = s[g * n + j];
          x = m[g] == kNegInf ? 0.0f : std::exp(x - m[g]);
          sum += x;
        }
        l[g] = sum;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        load_row(p.v, p.v_dtype, (kv0 + lo + j) * p.v_stride_n + hk * p.v_stride_h, dvo, v.data());
        for (int64_t g = 0; g < group; ++g) {
          const float w = s[g * n + j];
          float* a = &acc[g * dvo];
          for (int64_t d = 0; d < dvo; ++d) a[d] += w * v[d];
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = hk * group + g;
        const bool empty = n == 0 || l[g] == 0.0f;
        const float f = empty ? 0.0f : p.bmm2_scale / l[g];
        float* a = &acc[g * dvo];
        for (int64_t d = 0; d < dvo; ++d) a[d] = empty ? 0.0f : a[d] * f;
        store_row(p.o, p.o_dtype, row * p.o_stride_n + h * p.o_stride_h, dvo, a);
        if (p.lse != nullptr) {
          p.lse[row * p.lse_stride_n + h * p.lse_stride_h] =
              empty ? kNegInf : (m[g] + std::log(l[g])) * 1.4426950408889634f;
        }
        if (p.stats != nullptr) {
          float* st = p.stats + row * p.stats_stride_n + h * p.stats_stride_h;
          st[0] = empty ? kNegInf : m[g];
          st[1] = empty ? 0.0f : l[g] * p.stats_sum_scale;
        }
      }
    }
  }
}

}  // namespace flashinfer::kernels::cpu
